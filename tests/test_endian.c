/* The byte order of checkpoints: every number in the file is little-endian on every host (dtrain/core/base.h:
   dt__le32), so a checkpoint written on x86-64 resumes on s390x (big-endian) and the reverse, bit for bit.
     test_endian               on this host alone: a run saved and resumed in one process, and the checkpoint
                               tests/fixtures/endian.ckpt (written on x86-64) loaded and saved back
     test_endian --save DIR    trains STEPS steps of a small model (conv, batchnorm, dropout, linear; Adam with weight
                               decay), saves DIR/endian.ckpt, and writes DIR/endian.txt (text: no byte order): the
                               saved state's digest, then the losses of MORE further steps and the digest at the end
     test_endian --resume DIR  DIR's checkpoint, written on any host: loaded into a fresh model, its state is the one
                               saved (the digest, bit for bit) and, saved again, it writes the very bytes of the file;
                               and MORE steps from it give the saver's losses and digest, and this host's own run's
   tests/run.sh section 2e runs x86-64 --save with s390x (qemu) --resume, and s390x --save with x86-64 --resume.
   The state's digest and the bytes need no arithmetic; the continued run's bits are the same on two hosts only
   where their arithmetic is: both built with the portable kernels (DT_NO_SIMD), no contraction into FMA
   (-ffp-contract=off) and float evaluated as float (s390x's gcc: -fexcess-precision=fast), and libm's exp, log
   and pow giving the same bits (glibc's do on both). */
#define _POSIX_C_SOURCE 200809L   /* mkdtemp, rmdir */
#include <stdlib.h>
#include <unistd.h>
#include "../dtrain.h"
#include "dt_test.h"

#define STEPS 6
#define MORE 4
#define B 8
static const char *save_dir, *resume_dir;
static char tmp_dir[64];

/* conv, batchnorm, relu, pool, dropout, linear: parameters, running stats and the dropout stream; the parameters
   set from integers (no libm: the same bits on every host) */
static dt_model *model(void) {
    dt_model *m = NULL;
    dt_model_desc d;
    int64_t n = 0, i;
    float *p;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = 1; d.in_h = 8; d.in_w = 8; d.seed = 7;
    CHECK_OK(dt_model_create(&m, &d));
    if (!m) return NULL;
    x = dt_relu(m, dt_batchnorm(m, dt_conv2d(m, 0, 4, 3, 1, 1)));
    x = dt_dropout(m, dt_maxpool2d(m, x, 2, 2, 0), 0.25f);
    dt_linear(m, dt_flatten(m, x), 4, 1);
    CHECK_OK(dt_model_finalize(m));
    p = dt_model_params(m, &n);
    for (i = 0; i < n; i++) p[i] = (float)((i * 37) % 101 - 50) / 256.0f;
    return m;
}
static dt_optim *adam(dt_model *m) {
    dt_optim *o = NULL;
    dt_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = DT_OPTIM_ADAM; d.lr = 0.01f; d.weight_decay = 1e-3f;
    CHECK_OK(dt_optim_create(&o, m, &d));
    return o;
}
/* step s: a batch of B from integers, forward, cross-entropy, backward, Adam; returns the loss */
static float step(dt_model *m, dt_optim *o, int64_t s) {
    float x[B * 64], loss = 0.0f;
    int32_t y[B];
    int i;
    for (i = 0; i < B * 64; i++) x[i] = (float)((i * 131 + (int)s * 17) % 256) / 256.0f;
    for (i = 0; i < B; i++) y[i] = (int32_t)((i + s) % 4);
    CHECK_OK(dt_model_forward(m, x, B));
    CHECK_OK(dt_model_loss_cross_entropy(m, y, &loss));
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_backward(m, NULL));
    CHECK_OK(dt_optim_step(o));
    return loss;
}

/* FNV-1a over n words of `size` bytes (4 or 8) at p, each as its little-endian bytes: a digest of values, the same
   on every host */
static uint64_t fnv_le(uint64_t h, const void *p, size_t size, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    unsigned char w[8];
    size_t i, j;
    for (i = 0; i < n; i++, b += size) {
        memcpy(w, b, size);
        if (size == 4) dt__le32(w, 1); else dt__le64(w, 1);
        for (j = 0; j < size; j++) { h ^= w[j]; h *= 0x100000001b3ULL; }
    }
    return h;
}
/* the digest of the state: parameters, buffers, Adam's moments and step counts, the learning rate, the meta */
static uint64_t digest(dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta) {
    uint64_t h = 0xcbf29ce484222325ULL;
    int64_t n = 0, steps;
    float lr = dt_optim_lr(o);
    const float *p = dt_model_params(m, &n);
    int i;
    h = fnv_le(h, p, 4, (size_t)n);
    p = dt_model_buffers(m, &n);
    h = fnv_le(h, p, 4, (size_t)n);
    p = dt_optim_state(o, &n);
    h = fnv_le(h, p, 4, (size_t)n);
    for (i = 0; i < dt_optim_tensors(o); i++) { steps = dt_optim_tensor_steps(o, i); h = fnv_le(h, &steps, 8, 1); }
    h = fnv_le(h, &lr, 4, 1);
    h = fnv_le(h, &meta->epoch, 8, 4);
    h = fnv_le(h, &meta->rng, 8, 2);
    return fnv_le(h, meta->values, 8, DT_CHECKPOINT_VALUES);
}
static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* what a run records: the state's digest at the save, the losses after it, the digest at the end */
typedef struct record { uint64_t saved, end; uint32_t loss[MORE]; } record;

static int read_all(const char *p, unsigned char **b, long *n) {
    FILE *f = fopen(p, "rb");
    *b = NULL; *n = 0;
    if (!f) return -1;
    fseek(f, 0, SEEK_END); *n = ftell(f); fseek(f, 0, SEEK_SET);
    if (*n > 0 && (*b = (unsigned char *)malloc((size_t)*n)) != NULL && fread(*b, 1, (size_t)*n, f) != (size_t)*n) {
        free(*b); *b = NULL;
    }
    fclose(f);
    return *b ? 0 : -1;
}
static int same_bytes(const char *a, const char *b) {
    unsigned char *x = NULL, *y = NULL;
    long nx, ny;
    int same = read_all(a, &x, &nx) == 0 && read_all(b, &y, &ny) == 0 && nx == ny && memcmp(x, y, (size_t)nx) == 0;
    if (x) free(x);
    if (y) free(y);
    return same;
}
static int write_record(const char *path, const record *r) {
    FILE *f = fopen(path, "w");
    int i, ok;
    if (!f) return -1;
    ok = fprintf(f, "saved %016llx\n", (unsigned long long)r->saved) > 0;
    for (i = 0; i < MORE; i++) ok = ok && fprintf(f, "loss %08lx\n", (unsigned long)r->loss[i]) > 0;
    ok = ok && fprintf(f, "end %016llx\n", (unsigned long long)r->end) > 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}
static int read_record(const char *path, record *r) {
    FILE *f = fopen(path, "r");
    unsigned long long a = 0, c = 0;
    unsigned long l;
    int i, ok;
    if (!f) return -1;
    ok = fscanf(f, "saved %llx\n", &a) == 1;
    for (i = 0; i < MORE && ok; i++) { ok = fscanf(f, "loss %lx\n", &l) == 1; r->loss[i] = (uint32_t)l; }
    ok = ok && fscanf(f, "end %llx\n", &c) == 1;
    fclose(f);
    r->saved = a; r->end = c;
    return ok ? 0 : -1;
}

/* STEPS steps, the checkpoint DIR/endian.ckpt, MORE steps: the record of this host's uninterrupted run */
static void run_and_save(const char *dir, record *r) {
    dt_model *m = model();
    dt_optim *o = m ? adam(m) : NULL;
    dt_checkpoint_meta meta;
    char path[256];
    int64_t s;
    memset(&meta, 0, sizeof meta);
    memset(r, 0, sizeof *r);
    if (!o) { dt_model_destroy(m); return; }
    for (s = 0; s < STEPS; s++) meta.values[0] += step(m, o, s);
    meta.step = STEPS; meta.epoch = 1; meta.batch = 3; meta.values[1] = -0.1;
    dt_rng_init(&meta.rng, 11, 3);
    snprintf(path, sizeof path, "%s/endian.ckpt", dir);
    CHECK_OK(dt_checkpoint_save(path, m, o, &meta));
    r->saved = digest(m, o, &meta);
    for (s = 0; s < MORE; s++) r->loss[s] = bits(step(m, o, STEPS + s));
    r->end = digest(m, o, &meta);
    dt_optim_destroy(o);
    dt_model_destroy(m);
}
/* DIR/endian.ckpt into a fresh model: its digest against want's, saved again to the same bytes; with `more`, MORE
   steps from it against want's losses and end */
static void load_and_check(const char *dir, const record *want, int more) {
    dt_model *m = model();
    dt_optim *o = m ? adam(m) : NULL;
    dt_checkpoint_meta meta;
    char path[256], again[128];
    uint64_t h;
    int64_t s;
    if (!o) { dt_model_destroy(m); return; }
    snprintf(path, sizeof path, "%s/endian.ckpt", dir);
    memset(&meta, 0, sizeof meta);
    CHECK_OK(dt_checkpoint_load(path, m, o, &meta));
    if ((h = digest(m, o, &meta)) != want->saved)
        printf("    %s: the loaded state's digest is %016llx, the saved one's %016llx\n", path, (unsigned long long)h,
               (unsigned long long)want->saved);
    CHECK(h == want->saved);
    snprintf(again, sizeof again, "%s/again.ckpt", tmp_dir);
    CHECK_OK(dt_checkpoint_save(again, m, o, &meta));
    if (!same_bytes(path, again)) printf("    %s saved again differs from the file it was loaded from\n", path);
    CHECK(same_bytes(path, again));
    remove(again);
    for (s = 0; more && s < MORE; s++) {
        uint32_t l = bits(step(m, o, STEPS + s));
        if (l != want->loss[s]) printf("    step %d after the checkpoint: loss %08lx, the uninterrupted run's %08lx\n", (int)s,
                                       (unsigned long)l, (unsigned long)want->loss[s]);
        CHECK(l == want->loss[s]);
    }
    if (more) CHECK(digest(m, o, &meta) == want->end);
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

/* --save DIR */
static void test_save(void) {
    record r;
    char txt[256];
    run_and_save(save_dir, &r);
    snprintf(txt, sizeof txt, "%s/endian.txt", save_dir);
    CHECK(write_record(txt, &r) == 0);
}
/* --resume DIR: the state and bytes of the saver's file, then its continued run and this host's own */
static void test_resume_state(void) {
    record want;
    char txt[256];
    snprintf(txt, sizeof txt, "%s/endian.txt", resume_dir);
    CHECK(read_record(txt, &want) == 0);
    load_and_check(resume_dir, &want, 0);
}
static void test_resume_continued(void) {
    record want, own;
    char txt[256];
    snprintf(txt, sizeof txt, "%s/endian.txt", resume_dir);
    CHECK(read_record(txt, &want) == 0);
    load_and_check(resume_dir, &want, 1);
    run_and_save(tmp_dir, &own);   /* this host's uninterrupted run */
    CHECK(own.saved == want.saved && own.end == want.end && memcmp(own.loss, want.loss, sizeof own.loss) == 0);
}
/* the helpers: the order the compiler says is the one the host has, and a word's file bytes read as its value */
static void test_helpers(void) {
    unsigned char b[8] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
    uint32_t u;
    uint64_t v;
    CHECK(DT__BIG_ENDIAN == dt__host_big_endian());
    memcpy(&u, b, 4); dt__le32(&u, 1);
    CHECK(u == 0x04030201u);
    memcpy(&v, b, 8); dt__le64(&v, 1);
    CHECK(v == 0x0807060504030201ull && dt__get_le64(b) == v && dt__get_be32(b) == 0x01020304u);
    dt__put_le64(b, 0x1122334455667788ull);
    CHECK(b[0] == 0x88 && b[7] == 0x11);
}
/* no flag: a save and a resume on this host, in one process */
static void test_same_host(void) {
    record r;
    run_and_save(tmp_dir, &r);
    load_and_check(tmp_dir, &r, 1);
}
/* the checkpoint tests/fixtures/endian.ckpt, written on x86-64 (test_endian --save tests/fixtures): loaded here, its
   digest is the one recorded with it, and saved again it is the same bytes (little-endian, whatever this host's) */
static void test_fixture(void) {
    record want;
    CHECK(read_record(DT_TEST_FIXTURES "/endian.txt", &want) == 0);
    load_and_check(DT_TEST_FIXTURES, &want, 0);
}

int main(int argc, char **argv) {
    int i;
    for (i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--save") == 0) save_dir = argv[i + 1];
        else if (strcmp(argv[i], "--resume") == 0) resume_dir = argv[i + 1];
        else { fprintf(stderr, "usage: test_endian [--save DIR | --resume DIR]\n"); return 2; }
    }
    if (i < argc) { fprintf(stderr, "usage: test_endian [--save DIR | --resume DIR]\n"); return 2; }
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/dt_endian_XXXXXX");
    if (!mkdtemp(tmp_dir)) { perror("mkdtemp"); return 1; }
    printf("test_endian (%s-endian host)\n", DT__BIG_ENDIAN ? "big" : "little");
    if (save_dir) RUN(test_save);
    else if (resume_dir) { RUN(test_resume_state); RUN(test_resume_continued); }
    else { RUN(test_helpers); RUN(test_same_host); RUN(test_fixture); }
    {
        char p[128];
        snprintf(p, sizeof p, "%s/endian.ckpt", tmp_dir); remove(p);
        snprintf(p, sizeof p, "%s/again.ckpt", tmp_dir); remove(p);
        rmdir(tmp_dir);
    }
    return dt_t_summary();
}
