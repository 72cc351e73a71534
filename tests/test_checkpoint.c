#define _POSIX_C_SOURCE 200809L   /* mkdtemp, mkdir, rmdir, mkfifo (dt_test_os.h) */
/* Checkpoints: round trip of every piece of state, a resumed run bit-identical to an uninterrupted one,
   evaluation, and refusal of files that are missing, foreign, of another version, truncated or damaged. */
#include "dt_test_hooks.h"   /* the checksum and the file's layout */
#include "../dtrain.h"
#include "dt_test.h"
#include "dt_test_os.h"

#define NS 40                       /* samples of the synthetic dataset, 1x12x12 */
static uint8_t pix[NS * 144];
static int32_t lab[NS];
static char dir[512], path[600];

static dt_dataset synth(void) {
    dt_dataset ds;
    int i;
    memset(&ds, 0, sizeof ds);
    for (i = 0; i < NS * 144; i++) pix[i] = (uint8_t)((i * 131 + i / 144 * 7) % 256);
    for (i = 0; i < NS; i++) lab[i] = i % 4;
    ds.count = NS; ds.c = 1; ds.h = 12; ds.w = 12; ds.num_classes = 4; ds.pixels = pix; ds.labels = lab;
    snprintf(ds.source, sizeof ds.source, "synthetic");
    return ds;
}

/* conv, batchnorm, relu, pool, dropout, linear: every kind of state (params, running stats, dropout step) */
static dt_model *small_model(uint64_t seed) {
    dt_model *m = NULL;
    dt_model_desc d;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = 1; d.in_h = 12; d.in_w = 12; d.seed = seed;
    CHECK_OK(dt_model_create(&m, &d));
    x = dt_relu(m, dt_batchnorm(m, dt_conv2d(m, 0, 4, 3, 1, 1)));
    x = dt_dropout(m, dt_maxpool2d(m, x, 2, 2, 0), 0.3f);
    dt_linear(m, dt_flatten(m, x), 4, 1);
    CHECK_OK(dt_model_finalize(m));
    return m;
}

/* one epoch of batches of 8 in an order that depends on the epoch, with a padded crop */
static void train_epoch(dt_model *m, dt_optim *o, const dt_dataset *ds, int64_t epoch) {
    int64_t order[NS], i, b;
    float x[8 * 144], loss;
    int32_t y[8];
    dt_transform t;
    dt_batch_desc bd;
    dt_rng rng;
    memset(&t, 0, sizeof t);
    t.crop_pad = 2; t.flip = 1;
    for (i = 0; i < NS; i++) order[i] = i;
    dt_rng_init(&rng, 5, (uint64_t)epoch);
    for (i = NS - 1; i > 0; i--) { int64_t j = dt_rng_below(&rng, (uint32_t)i + 1), tmp = order[i]; order[i] = order[j]; order[j] = tmp; }
    for (b = 0; b < NS; b += 8) {
        bd.indices = order + b; bd.count = 8; bd.transform = &t; bd.seed = 5; bd.epoch = (uint64_t)epoch;
        CHECK_OK(dt_dataset_batch(ds, &bd, x, y));
        CHECK_OK(dt_model_forward(m, x, 8));
        CHECK_OK(dt_model_loss_cross_entropy(m, y, &loss));
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward(m, NULL));
        CHECK_OK(dt_optim_step(o));
    }
}

static dt_optim *make_optim(dt_model *m, dt_optim_kind kind) {
    dt_optim *o = NULL;
    dt_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = kind; d.lr = kind == DT_OPTIM_SGD ? 0.05f : 0.01f; d.momentum = kind == DT_OPTIM_SGD ? 0.9f : 0.0f;
    d.weight_decay = 1e-3f;
    CHECK_OK(dt_optim_create(&o, m, &d));
    return o;
}

static void test_resume_bit_identical(void) {
    dt_dataset ds = synth();
    int kind;
    for (kind = DT_OPTIM_SGD; kind <= DT_OPTIM_ADAM; kind++) {
        dt_model *a = small_model(3), *b = small_model(3);
        dt_optim *oa = make_optim(a, (dt_optim_kind)kind), *ob = make_optim(b, (dt_optim_kind)kind);
        dt_checkpoint_meta meta, got;
        int64_t e, np, nb;
        if (!oa || !ob) return;
        for (e = 0; e < 4; e++) train_epoch(a, oa, &ds, e);               /* uninterrupted */
        for (e = 0; e < 2; e++) train_epoch(b, ob, &ds, e);               /* stopped after epoch 2 ... */
        memset(&meta, 0, sizeof meta);
        meta.epoch = 2; meta.step = 10; meta.round = 7;
        dt_rng_init(&meta.rng, 99, 4);
        CHECK_OK(dt_checkpoint_save(path, b, ob, &meta));
        dt_optim_destroy(ob);
        dt_model_destroy(b);
        b = small_model(12345);                                           /* ... a new process: other init */
        ob = make_optim(b, (dt_optim_kind)kind);
        memset(&got, 0, sizeof got);
        CHECK_OK(dt_checkpoint_load(path, b, ob, &got));
        CHECK(got.epoch == 2 && got.step == 10 && got.round == 7);
        CHECK(got.rng.state == meta.rng.state && got.rng.inc == meta.rng.inc);
        for (e = got.epoch; e < 4; e++) train_epoch(b, ob, &ds, e);       /* ... resumed */
        dt_model_params(a, &np);
        dt_model_buffers(a, &nb);
        CHECK(memcmp(dt_model_params(a, NULL), dt_model_params(b, NULL), sizeof(float) * (size_t)np) == 0);
        CHECK(memcmp(dt_model_buffers(a, NULL), dt_model_buffers(b, NULL), sizeof(float) * (size_t)nb) == 0);
        dt_optim_destroy(oa); dt_optim_destroy(ob);
        dt_model_destroy(a); dt_model_destroy(b);
    }
}

static void test_round_trip_without_optimizer(void) {
    dt_model *a = small_model(1), *b = small_model(2);
    int64_t np;
    CHECK_OK(dt_checkpoint_save(path, a, NULL, NULL));
    CHECK_OK(dt_checkpoint_load(path, b, NULL, NULL));
    dt_model_params(a, &np);
    CHECK(memcmp(dt_model_params(a, NULL), dt_model_params(b, NULL), sizeof(float) * (size_t)np) == 0);
    {   /* a file without optimizer state cannot fill an optimizer */
        dt_optim *o = make_optim(b, DT_OPTIM_SGD);
        CHECK_ERR(dt_checkpoint_load(path, b, o, NULL), DT_ERR_FORMAT);
        CHECK(strstr(dt_last_error(), path) != NULL);
        dt_optim_destroy(o);
    }
    dt_model_destroy(a); dt_model_destroy(b);
}

static long file_size(const char *p) {
    FILE *f = fopen(p, "rb");
    long n;
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fclose(f);
    return n;
}
/* Writes to dst the first `keep` bytes of src with byte `at` (when inside) XOR-ed with `x`. */
static void damaged_copy(const char *src, const char *dst, long keep, long at, unsigned char x) {
    FILE *f = fopen(src, "rb");
    unsigned char *buf = (unsigned char *)malloc((size_t)(keep > 0 ? keep : 1));
    size_t got = f ? fread(buf, 1, (size_t)keep, f) : 0;
    if (f) fclose(f);
    if (at >= 0 && (size_t)at < got) buf[at] ^= x;
    f = fopen(dst, "wb");
    CHECK(f != NULL);
    if (f) { fwrite(buf, 1, got, f); fclose(f); }
    free(buf);
}

static void test_bad_files(void) {
    dt_model *m = small_model(1), *other;
    dt_optim *o = make_optim(m, DT_OPTIM_SGD), *adam = make_optim(m, DT_OPTIM_ADAM);
    float before[64];
    long n;
    char bad[700];
    memcpy(before, dt_model_params(m, NULL), sizeof before);
    CHECK_ERR(dt_checkpoint_load("/nonexistent/x.ckpt", m, o, NULL), DT_ERR_IO);
    CHECK(strstr(dt_last_error(), "/nonexistent/x.ckpt") != NULL);
    CHECK_ERR(dt_checkpoint_save("/nonexistent/x.ckpt", m, o, NULL), DT_ERR_IO);
    CHECK_OK(dt_checkpoint_save(path, m, o, NULL));
    n = file_size(path);
    CHECK(n > 100);
    CHECK_ERR(dt_checkpoint_load(path, m, adam, NULL), DT_ERR_FORMAT);     /* another optimizer */
    {   /* another model */
        dt_model_desc d;
        memset(&d, 0, sizeof d);
        CHECK_OK(dt_zoo_create(&other, DT_ZOO_LENET5, 0, &d));
        CHECK_ERR(dt_checkpoint_load(path, other, NULL, NULL), DT_ERR_FORMAT);
        CHECK(strstr(dt_last_error(), "another model") != NULL);
        dt_model_destroy(other);
    }
    snprintf(bad, sizeof bad, "%s.bad", path);
    {   /* same sizes, other names: the signature tells them apart */
        dt_model *renamed = NULL;
        dt_model_desc d;
        int x;
        memset(&d, 0, sizeof d);
        d.in_c = 1; d.in_h = 12; d.in_w = 12;
        CHECK_OK(dt_model_create(&renamed, &d));
        x = dt_relu(renamed, dt_batchnorm(renamed, dt_model_set_node_name(renamed, dt_conv2d(renamed, 0, 4, 3, 1, 1), "c")));
        x = dt_dropout(renamed, dt_maxpool2d(renamed, x, 2, 2, 0), 0.3f);
        dt_linear(renamed, dt_flatten(renamed, x), 4, 1);
        CHECK_OK(dt_model_finalize(renamed));
        CHECK_ERR(dt_checkpoint_load(path, renamed, NULL, NULL), DT_ERR_FORMAT);
        dt_model_destroy(renamed);
    }
    /* damaged copies: each refused, the model left as it was */
    {
        /* bytes kept (negative: from the end), byte flipped (-1 none; < -1 from the end) */
        static const long cuts[][2] = {{4, -1}, {60, -1}, {-20, -1}, {0, 0}, {0, 8}, {0, 200}, {0, -4}};
        int i;
        for (i = 0; i < (int)(sizeof cuts / sizeof cuts[0]); i++) {
            long keep = cuts[i][0] <= 0 ? n + cuts[i][0] : cuts[i][0];
            long flip = cuts[i][1] < -1 ? n + cuts[i][1] : cuts[i][1];
            damaged_copy(path, bad, keep, flip, 0x5a);
            CHECK_ERR(dt_checkpoint_load(bad, m, o, NULL), DT_ERR_FORMAT);
            CHECK(strstr(dt_last_error(), bad) != NULL);
        }
        CHECK(memcmp(before, dt_model_params(m, NULL), sizeof before) == 0);
    }
    /* a version from the future and one from the past: the version word (after the 8-byte magic) 2 -> 9, 2 -> 1 */
    damaged_copy(path, bad, n, 8, 0x2 ^ 0x9);
    CHECK_ERR(dt_checkpoint_load(bad, m, o, NULL), DT_ERR_FORMAT);
    CHECK(strstr(dt_last_error(), "version 9") != NULL);
    damaged_copy(path, bad, n, 8, 0x2 ^ 0x1);
    CHECK_ERR(dt_checkpoint_load(bad, m, o, NULL), DT_ERR_FORMAT);
    CHECK(strstr(dt_last_error(), "version 1") != NULL);
    {   /* saving when the temporary file cannot be created leaves the previous checkpoint intact */
        char tmpdir[700];
        snprintf(tmpdir, sizeof tmpdir, "%s.tmp", path);
        CHECK(file_size(path) == n);
        remove(tmpdir);
        CHECK(dt_t_mkdir(tmpdir) == 0);   /* a directory at <path>.tmp cannot be opened for writing */
        CHECK_ERR(dt_checkpoint_save(path, m, o, NULL), DT_ERR_IO);
        CHECK(file_size(path) == n);
        CHECK_OK(dt_checkpoint_load(path, m, o, NULL));
        CHECK(dt_t_rmdir(tmpdir) == 0);
    }
    CHECK_ERR(dt_checkpoint_save(NULL, m, o, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_checkpoint_load(NULL, m, o, NULL), DT_ERR_INVALID_ARG);
    if (DT_T_HAVE_FIFO) {   /* a FIFO where the checkpoint should be: refused at once (opening it would wait for a writer) */
        dt_t_alarm(60);
        remove(bad);
        CHECK(dt_t_mkfifo(bad) == 0);
        CHECK_ERR(dt_checkpoint_load(bad, m, o, NULL), DT_ERR_IO);
        CHECK(strstr(dt_last_error(), "not a regular file") != NULL);
        dt_t_alarm(0);
    } else printf("    (the check of a FIFO left out: this system has none)\n");
    CHECK_ERR(dt_checkpoint_save(path, NULL, o, NULL), DT_ERR_INVALID_ARG);
    remove(bad);
    dt_optim_destroy(o); dt_optim_destroy(adam);
    dt_model_destroy(m);
}

/* NaN or infinity in a model is never saved (a diverged run must not replace a good checkpoint: the file is left
   byte for byte), and a file that holds such values (with a valid checksum) is refused on load. */
static unsigned char *read_all(const char *p, long *n) {
    FILE *f = fopen(p, "rb");
    unsigned char *b;
    *n = file_size(p);
    if (!f || *n <= 0 || !(b = (unsigned char *)malloc((size_t)*n))) { if (f) fclose(f); return NULL; }
    if (fread(b, 1, (size_t)*n, f) != (size_t)*n) { free(b); b = NULL; }
    fclose(f);
    return b;
}
static void test_nonfinite_refused(void) {
    dt_model *m = small_model(1);
    dt_optim *o = make_optim(m, DT_OPTIM_SGD);
    float *w = dt_model_params(m, NULL), keep = w[3], nan = NAN, before[64];
    long n = 0, n2 = 0;
    unsigned char *good, *again;
    char tmp[700], bad[700];
    CHECK_OK(dt_checkpoint_save(path, m, o, NULL));
    good = read_all(path, &n);
    w[3] = INFINITY;
    CHECK_ERR(dt_checkpoint_save(path, m, o, NULL), DT_ERR_NUMERIC);
    CHECK(strstr(dt_last_error(), "NaN or infinite") != NULL && strstr(dt_last_error(), "the first at 3") != NULL);
    w[3] = nan;
    CHECK_ERR(dt_checkpoint_save(path, m, o, NULL), DT_ERR_NUMERIC);
    again = read_all(path, &n2);
    CHECK(good && again && n == n2 && memcmp(good, again, (size_t)n) == 0);   /* the good checkpoint, untouched */
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(file_size(tmp) < 0);
    w[3] = keep;
    memcpy(before, w, sizeof before);
    if (good) {   /* parameter 5 of the only section made NaN, the checksum made right again */
        long at = 8 + 8 * (dt__test_ckpt_words(0) + 1) + 8 * dt__test_ckpt_words(1) + 4 * 5;
        uint64_t sum;
        FILE *f;
        int i;
        snprintf(bad, sizeof bad, "%s.nan", path);
        dt__le32(&nan, 1);   /* the file's order */
        memcpy(good + at, &nan, sizeof nan);
        sum = dt__test_fnv(0xcbf29ce484222325ULL, good, (size_t)(n - 8));
        for (i = 0; i < 8; i++) good[n - 8 + i] = (unsigned char)(sum >> (8 * i));
        if ((f = fopen(bad, "wb")) != NULL) { fwrite(good, 1, (size_t)n, f); fclose(f); }
        CHECK_ERR(dt_checkpoint_load(bad, m, o, NULL), DT_ERR_FORMAT);
        CHECK(strstr(dt_last_error(), "NaN or infinite") != NULL && strstr(dt_last_error(), "the first at 5") != NULL);
        CHECK(memcmp(before, w, sizeof before) == 0);
        remove(bad);
    }
    free(good); free(again);
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

/* Counters a run cannot have reached: a file whose epoch is 2^62 (its checksum made right) is refused on load,
   naming the counter and its value, and the model and meta are left as they were; a save of such a meta is
   refused and writes nothing. 2^48 itself, the bound, is kept. */
static void test_implausible_counters(void) {
    dt_model *m = small_model(1);
    dt_optim *o = make_optim(m, DT_OPTIM_SGD);
    float *w = dt_model_params(m, NULL), before[64];
    dt_checkpoint_meta meta, got;
    unsigned char *good;
    long n = 0;
    char bad[700];
    memset(&meta, 0, sizeof meta);
    meta.epoch = DT_CHECKPOINT_MAX_COUNT; meta.step = 12;
    CHECK_OK(dt_checkpoint_save(path, m, o, &meta));
    memset(&got, 0, sizeof got);
    CHECK_OK(dt_checkpoint_load(path, m, o, &got));
    CHECK(got.epoch == DT_CHECKPOINT_MAX_COUNT && got.step == 12);
    meta.epoch = (int64_t)1 << 62;
    remove(path);
    CHECK_ERR(dt_checkpoint_save(path, m, o, &meta), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "epoch is 4611686018427387904") != NULL);
    CHECK(file_size(path) < 0);
    meta.epoch = 3;
    CHECK_OK(dt_checkpoint_save(path, m, o, &meta));
    good = read_all(path, &n);
    memcpy(before, w, sizeof before);
    if (good) {   /* rank 0's epoch (word 11 of its section) made 2^62, the checksum made right again */
        long at = 8 + 8 * (dt__test_ckpt_words(0) + 1) + 8 * 11;
        uint64_t sum;
        FILE *f;
        int i;
        snprintf(bad, sizeof bad, "%s.big", path);
        dt__put_le64(good + at, (uint64_t)1 << 62);
        sum = dt__test_fnv(0xcbf29ce484222325ULL, good, (size_t)(n - 8));
        for (i = 0; i < 8; i++) good[n - 8 + i] = (unsigned char)(sum >> (8 * i));
        if ((f = fopen(bad, "wb")) != NULL) { fwrite(good, 1, (size_t)n, f); fclose(f); }
        memset(&got, 0, sizeof got);
        CHECK_ERR(dt_checkpoint_load(bad, m, o, &got), DT_ERR_FORMAT);
        CHECK(strstr(dt_last_error(), "the epoch 4611686018427387904") != NULL && strstr(dt_last_error(), bad) != NULL);
        CHECK(got.epoch == 0 && memcmp(before, w, sizeof before) == 0);
        remove(bad);
    }
    free(good);
    remove(path);
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

/* A trainer's word out of its range is refused on load: local SGD's steps since the last average (here 9 with
   period 4, the checksum made right; it used to shift every later average), and D-PSGD's step is checked the
   same way (0 .. DT_CHECKPOINT_MAX_COUNT). */
static void test_trainer_word_range(void) {
    dt_comm *c = NULL;
    dt_model *m = small_model(3);
    dt_localsgd *l = NULL;
    dt_localsgd_desc ld;
    unsigned char *good;
    long n = 0;
    char bad[700];
    memset(&ld, 0, sizeof ld);
    ld.period = 4;
    CHECK_OK(dt_comm_create_self(&c, NULL));
    CHECK_OK(dt_localsgd_create(&l, c, m, &ld));
    if (!l) { dt_model_destroy(m); dt_comm_destroy(c); return; }
    CHECK_OK(dt_localsgd_step(l));
    CHECK_OK(dt_localsgd_step(l));   /* 2 steps since the last average */
    remove(path);
    CHECK_OK(dt_localsgd_save(l, path, NULL, NULL));
    CHECK_OK(dt_localsgd_load(l, path, NULL, NULL));
    good = read_all(path, &n);
    if (good) {   /* the word (word 17 of rank 0's section) made 9 */
        long at = 8 + 8 * (dt__test_ckpt_words(0) + 1) + 8 * 17;
        uint64_t sum;
        FILE *f;
        int i;
        snprintf(bad, sizeof bad, "%s.word", path);
        dt__put_le64(good + at, 9);
        sum = dt__test_fnv(0xcbf29ce484222325ULL, good, (size_t)(n - 8));
        for (i = 0; i < 8; i++) good[n - 8 + i] = (unsigned char)(sum >> (8 * i));
        if ((f = fopen(bad, "wb")) != NULL) { fwrite(good, 1, (size_t)n, f); fclose(f); }
        CHECK_ERR(dt_localsgd_load(l, bad, NULL, NULL), DT_ERR_FORMAT);
        CHECK(strstr(dt_last_error(), "holds 9 steps since the last average, outside 0..3") != NULL);
        remove(bad);
    }
    free(good);
    remove(path);
    dt_localsgd_destroy(l);
    dt_model_destroy(m);
    dt_comm_destroy(c);
}

/* Evaluation: loss and top-1/top-k match a hand computation from the outputs; eval mode is used and the
   previous mode restored. */
static void test_evaluate(void) {
    dt_dataset ds = synth();
    dt_model *m = small_model(4);
    dt_eval_result r;
    dt_eval_desc ed;
    dt_batch_desc bd;
    int64_t idx[NS], i, j, c1 = 0, c2 = 0;
    float x[NS * 144], out[NS * 4], loss;
    int32_t y[NS];
    for (i = 0; i < NS; i++) idx[i] = NS - 1 - i;
    memset(&ed, 0, sizeof ed);
    ed.dataset = &ds; ed.indices = idx; ed.count = NS; ed.batch = 7; ed.topk = 2;
    CHECK_OK(dt_evaluate(m, &ed, &r));
    CHECK(dt_model_mode(m) == DT_MODE_TRAIN);
    CHECK(r.count == NS && r.k == 2);
    dt_model_set_mode(m, DT_MODE_EVAL);
    memset(&bd, 0, sizeof bd);
    bd.indices = idx; bd.count = NS;
    CHECK_OK(dt_dataset_batch(&ds, &bd, x, y));
    CHECK_OK(dt_model_forward(m, x, NS));
    CHECK_OK(dt_model_loss_cross_entropy(m, y, &loss));
    CHECK_OK(dt_model_get_output(m, out, NS * 4));
    for (i = 0; i < NS; i++) {
        int above = 0;
        for (j = 0; j < 4; j++) above += out[i * 4 + j] > out[i * 4 + y[i]];
        c1 += above == 0; c2 += above < 2;
    }
    CHECK(fabs(r.loss - loss) < 1e-5 * fabs(loss));
    CHECK(fabs(r.top1 - (double)c1 / NS) < 1e-12 && fabs(r.topk - (double)c2 / NS) < 1e-12);
    CHECK(r.topk >= r.top1);
    memset(&ed, 0, sizeof ed);
    ed.dataset = &ds; ed.batch = 64; ed.topk = 9;
    CHECK_OK(dt_evaluate(m, &ed, &r));                                  /* all samples; k clamped to 4 */
    CHECK(r.count == NS && r.k == 4 && r.topk == 1.0);
    {   /* zero is the default: batch 1000 (one pass here), top-1 only */
        dt_eval_result z;
        ed.batch = 0; ed.topk = 0;
        CHECK_OK(dt_evaluate(m, &ed, &z));
        CHECK(z.count == NS && z.k == 1 && z.topk == z.top1 && z.top1 == r.top1);
    }
    ed.batch = -1;
    CHECK_ERR(dt_evaluate(m, &ed, &r), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dt_evaluate: batch is -1") != NULL);
    ed.batch = 8; ed.topk = -2;
    CHECK_ERR(dt_evaluate(m, &ed, &r), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "topk is -2") != NULL);
    ed.topk = 1; ed.count = 5;   /* a count without indices */
    CHECK_ERR(dt_evaluate(m, &ed, &r), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "count is 5 but indices is NULL") != NULL);
    ed.indices = idx; ed.count = 0;   /* indices without a count */
    CHECK_ERR(dt_evaluate(m, &ed, &r), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "count is 0") != NULL);
    ed.indices = NULL; ed.dataset = NULL;
    CHECK_ERR(dt_evaluate(m, &ed, &r), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dataset is NULL") != NULL);
    CHECK_ERR(dt_evaluate(m, NULL, &r), DT_ERR_INVALID_ARG);
    ed.dataset = &ds;
    ds.w = 11;
    CHECK_ERR(dt_evaluate(m, &ed, &r), DT_ERR_SHAPE);
    dt_model_destroy(m);
}

/* dt_evaluate_comm: on 1 to 6 local ranks (more ranks than batches too), batches of 7 of 40 samples dealt
   round-robin, every rank gets dt_evaluate's result to the last bit; a desc every rank gets wrong fails on
   every rank without a wait. */
typedef struct ev_job { dt_eval_result want; int bad; dt_eval_desc ed; } ev_job;
static dt_result ev_rank(dt_comm *c, void *arg) {
    ev_job *j = (ev_job *)arg;
    dt_dataset ds = synth();
    dt_model *m = small_model(4);
    dt_eval_desc ed = j->ed;
    dt_eval_result r;
    dt_result e;
    ed.dataset = &ds;
    if (j->bad) ds.w = 11;
    e = dt_evaluate_comm(c, m, &ed, &r);
    dt_model_destroy(m);
    if (e != DT_OK) return e;
    return r.count == j->want.count && r.k == j->want.k && memcmp(&r.loss, &j->want.loss, sizeof r.loss) == 0 &&
           r.top1 == j->want.top1 && r.topk == j->want.topk ? DT_OK : dt_set_error(DT_ERR_STATE, "rank %d: another result", dt_comm_rank(c));
}
static void test_evaluate_comm(void) {
    dt_dataset ds = synth();
    dt_model *m = small_model(4);
    ev_job j;
    dt_launch_desc ld;
    dt_result res[6];
    int p, i;
    memset(&j, 0, sizeof j);
    j.ed.batch = 7; j.ed.topk = 2;
    j.ed.dataset = &ds;
    CHECK_OK(dt_evaluate(m, &j.ed, &j.want));
    dt_model_destroy(m);
    CHECK(j.want.count == NS && j.want.top1 > 0.0 && j.want.loss > 0.0);
    memset(&ld, 0, sizeof ld);
    ld.threads_per_rank = 1;
    ld.comm.timeout = 5.0;
    for (p = 1; p <= 6; p++) {   /* 6 batches of 7 (the last of 5) */
        ld.ranks = p;
        CHECK_OK(dt_launch_local(&ld, ev_rank, &j, res));
    }
    j.bad = 1;
    ld.ranks = 3;
    CHECK_ERR(dt_launch_local(&ld, ev_rank, &j, res), DT_ERR_SHAPE);
    for (i = 0; i < 3; i++) CHECK(res[i] == DT_ERR_SHAPE);
    CHECK_ERR(dt_evaluate_comm(NULL, NULL, &j.ed, &j.want), DT_ERR_INVALID_ARG);
}

int main(int argc, char **argv) {
    int rc;
    dt_t_only = argc > 1 ? argv[1] : NULL;
    if (dt_t_mkdtemp(dir, sizeof dir, "dt_ckpt_test") != 0) { printf("cannot create a temporary directory\n0 passed, 1 failed\n"); return 1; }
    snprintf(path, sizeof path, "%s/model.ckpt", dir);
    printf("test_checkpoint\n");
    RUN(test_resume_bit_identical);
    RUN(test_round_trip_without_optimizer);
    RUN(test_bad_files);
    RUN(test_nonfinite_refused);
    RUN(test_implausible_counters);
    RUN(test_trainer_word_range);
    RUN(test_evaluate);
    RUN(test_evaluate_comm);
    rc = dt_t_summary();
    remove(path);
    dt_t_rmdir(dir);
    return rc;
}
