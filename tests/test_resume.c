#define _POSIX_C_SOURCE 200809L   /* fork, execv, waitpid, mkdtemp */
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
/* Resume on local ranks: for each trainer (the single-process loop, DDP, local SGD, D-PSGD on a ring and on
   the one-peer exponential schedule, resumed in the middle of its period, push-sum on a directed graph, FedAvg) a run
   killed with SIGKILL at a random step and resumed from its last checkpoint ends with the bytes of an
   uninterrupted run (every rank's parameters and buffers, and loss sums); each run is this program again
   (--child, tests/resume_checks.h), so the kill is a real one; a partial "<checkpoint>.tmp", as a crash in
   the middle of a save leaves it, is put beside the checkpoint before the resume. The step is drawn from the
   clock and printed; DT_TEST_KILL_AT=K replays it. Also: a loader that seeks to a batch hands out the
   batches an uninterrupted epoch does; and collective checkpoints that are damaged, foreign, of another
   world size, writer or model are refused on every rank with a message naming the cause, and no rank's
   model changes. */
#include "../dtrain.h"
#include "dt_test.h"
#include "resume_checks.h"

#define STEPS 14
#define EVERY 3

static char dir[64], self[1024];

/* Runs this program with --child and args; returns the wait status (-1 if it could not start). */
static int child(const char *const *args) {
    char *argv[32];
    int n = 0, status = -1;
    pid_t pid;
    argv[n++] = self;
    argv[n++] = (char *)"--child";
    while (*args && n < 31) argv[n++] = (char *)*args++;
    argv[n] = NULL;
    fflush(stdout);
    if ((pid = fork()) < 0) return -1;
    if (pid == 0) { execv(self, argv); _exit(127); }
    if (waitpid(pid, &status, 0) != pid) return -1;
    return status;
}

static int same_files(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ca = 0, cb = 0, same = fa && fb;
    while (same && ca != EOF) {
        ca = fgetc(fa); cb = fgetc(fb);
        same = ca == cb;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* uninterrupted, killed at a random step, resumed: the resumed run ends with the uninterrupted run's bytes.
   period > 1: the step resumed from is not a multiple of it (a time-varying topology resumes mid-period). */
static void kill_and_resume(const char *trainer, const char *ranks, int period) {
    char ckpt[160], tmp[170], ref[160], out[160], kill[16], from[16], steps[16], every[16];
    const char *env = getenv("DT_TEST_KILL_AT");
    unsigned h = (unsigned)time(NULL) ^ (unsigned)strlen(trainer) * 40503u;   /* another step for each trainer */
    int k = env ? atoi(env) : EVERY + (int)(h * 2654435761u % (STEPS - EVERY)), st;   /* after a checkpoint */
    if (!env && period > 1 && k / EVERY * EVERY % period == 0) k += k + EVERY < STEPS ? EVERY : -EVERY;
    snprintf(ckpt, sizeof ckpt, "%s/%s.ckpt", dir, trainer);
    snprintf(tmp, sizeof tmp, "%s.tmp", ckpt);
    snprintf(ref, sizeof ref, "%s/%s.ref", dir, trainer);
    snprintf(out, sizeof out, "%s/%s.out", dir, trainer);
    snprintf(kill, sizeof kill, "%d", k);
    snprintf(from, sizeof from, "%d", k / EVERY * EVERY);   /* the kill comes after that step's checkpoint */
    snprintf(steps, sizeof steps, "%d", STEPS);
    snprintf(every, sizeof every, "%d", EVERY);
    printf("    %s on %s ranks: killed after step %d (DT_TEST_KILL_AT=%d replays it)\n", trainer, ranks, k, k);
    remove(ckpt);
    {
        const char *a[] = {"--trainer", trainer, "--ranks", ranks, "--steps", steps, "--every", every, "--ckpt", ckpt,
                           "--out", ref, NULL};
        st = child(a);
        CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    remove(ckpt);
    {
        const char *a[] = {"--trainer", trainer, "--ranks", ranks, "--steps", steps, "--every", every, "--ckpt", ckpt,
                           "--out", out, "--kill-at", kill, NULL};
        st = child(a);
        CHECK(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    }
    {   /* what a crash in the middle of a save leaves beside the last checkpoint: a partial temporary file */
        FILE *f;
        if ((f = fopen(tmp, "wb")) != NULL) { fputs("DTCKPT\r\n half", f); fclose(f); }
    }
    {
        const char *a[] = {"--trainer", trainer, "--ranks", ranks, "--steps", steps, "--every", every, "--ckpt", ckpt,
                           "--out", out, "--resume", "--expect-from", from, NULL};
        st = child(a);
        CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    CHECK(same_files(ref, out));
    remove(ckpt); remove(ref); remove(out);
    remove(tmp);
}

static void test_resume_single(void) { kill_and_resume("single", "1", 1); }
static void test_resume_ddp(void) { kill_and_resume("ddp", "3", 1); }
static void test_resume_localsgd(void) { kill_and_resume("localsgd", "3", 1); }
static void test_resume_dpsgd(void) { kill_and_resume("dpsgd", "3", 1); }
static void test_resume_dpsgd_exp(void) { kill_and_resume("dpsgd-exp", "4", 2); }   /* one-peer graphs: period 2 */
static void test_resume_sgp(void) { kill_and_resume("sgp", "3", 1); }   /* push-sum: numerators and weights */
static void test_resume_fedavg(void) { kill_and_resume("fedavg", "3", 1); }

/* the batch after a seek is the one an uninterrupted epoch hands out there, with and without prefetch */
static void test_loader_seek(void) {
    dt_dataset ds = rs_data();
    dt_transform t;
    dt_loader_desc d;
    int prefetch;
    memset(&t, 0, sizeof t);
    t.crop_pad = 2; t.flip = 1;
    memset(&d, 0, sizeof d);
    d.dataset = &ds; d.batch = 10; d.shuffle = 1; d.transform = &t; d.seed = 3; d.rank = 1;
    for (prefetch = 0; prefetch <= 1; prefetch++) {
        dt_loader *a = NULL, *b = NULL;
        const float *xa, *xb;
        const int32_t *ya, *yb;
        int64_t na, nb, k, j;
        d.prefetch = prefetch;
        CHECK_OK(dt_loader_create(&a, &d));
        CHECK_OK(dt_loader_create(&b, &d));
        if (!a || !b) return;
        for (k = 0; k <= dt_loader_batches(a); k++) {
            CHECK_OK(dt_loader_start_epoch(a, 2));
            for (j = 0; j <= k; j++) CHECK_OK(dt_loader_next(a, &xa, &ya, &na));   /* batch k, drawn in order */
            CHECK_OK(dt_loader_seek(b, 2, k));
            CHECK_OK(dt_loader_next(b, &xb, &yb, &nb));
            CHECK(na == nb);
            if (na == nb && na > 0) {
                CHECK(memcmp(xa, xb, sizeof(float) * (size_t)(na * 64)) == 0);
                CHECK(memcmp(ya, yb, sizeof(int32_t) * (size_t)na) == 0);
            }
        }
        CHECK_ERR(dt_loader_seek(b, 0, dt_loader_batches(b) + 1), DT_ERR_INVALID_ARG);
        CHECK_ERR(dt_loader_seek(b, -1, 0), DT_ERR_INVALID_ARG);
        CHECK_ERR(dt_loader_seek(NULL, 0, 0), DT_ERR_INVALID_ARG);
        dt_loader_destroy(a);
        dt_loader_destroy(b);
    }
}

/* ---- refusals on local ranks ---- */

typedef struct rf_case {
    const char *path;    /* the file to load */
    int         other;   /* 1: rank 1 builds another model */
    int         want;    /* the result every rank must return */
    const char *cause;   /* in every rank's message */
    int         failed[3]; /* per rank: 1 when it got something else, or its model changed */
} rf_case;

/* a model of the same sizes and another layer name: only the signature tells it apart */
static dt_result tc_other_model(dt_model **m) {
    dt_model_desc d;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = 1; d.in_h = 8; d.in_w = 8;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    x = dt_relu(*m, dt_batchnorm(*m, dt_model_set_node_name(*m, dt_conv2d(*m, 0, 4, 3, 1, 1), "other")));
    x = dt_dropout(*m, dt_maxpool2d(*m, x, 2, 2, 0), 0.25f);
    dt_linear(*m, dt_flatten(*m, x), 4, 1);
    return dt_model_finalize(*m);
}

/* Every rank: a DDP over its model, then loads c->path; checks the result, the message and the model. */
static dt_result rf_rank(dt_comm *c, void *arg) {
    rf_case *k = (rf_case *)arg;
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_optim *o = NULL;
    float before[1024];
    int64_t np = 0;
    dt_result r = k->other && dt_comm_rank(c) == 1 ? tc_other_model(&m) : rs_model(&m, dt_comm_rank(c));
    if (r != DT_OK || (r = dt_optim_create(&o, m, NULL)) != DT_OK || (r = dt_ddp_create(&d, c, m, NULL)) != DT_OK) goto done;
    dt_model_params(m, &np);
    memcpy(before, dt_model_params(m, NULL), sizeof(float) * (size_t)(np < 1024 ? np : 1024));
    r = dt_ddp_load(d, k->path, o, NULL);
    if ((int)r != k->want || !strstr(dt_last_error(), k->cause) ||
        memcmp(before, dt_model_params(m, NULL), sizeof(float) * (size_t)(np < 1024 ? np : 1024)) != 0) {
        printf("    rank %d: %s: %s (wanted %s, naming \"%s\")\n", dt_comm_rank(c), k->path, dt_last_error(),
               dt_result_str((dt_result)k->want), k->cause);
        k->failed[dt_comm_rank(c)] = 1;
    }
    r = DT_OK;
done:
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

/* Saves a DDP checkpoint on `ranks` local ranks. */
static dt_result sv_rank(dt_comm *c, void *arg) {
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_optim *o = NULL;
    dt_result r = rs_model(&m, dt_comm_rank(c));
    if (r == DT_OK && (r = dt_optim_create(&o, m, NULL)) == DT_OK && (r = dt_ddp_create(&d, c, m, NULL)) == DT_OK)
        r = dt_ddp_save(d, (const char *)arg, o, NULL);
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

/* Saves a dt_checkpoint_save_comm checkpoint. */
static dt_result pl_rank(dt_comm *c, void *arg) {
    dt_model *m = NULL;
    dt_result r = rs_model(&m, dt_comm_rank(c));
    if (r == DT_OK) r = dt_checkpoint_save_comm(c, (const char *)arg, m, NULL, NULL);
    dt_model_destroy(m);
    return r;
}

/* Loads a dt_checkpoint_save_comm checkpoint: refused on another world, naming it (the caller's own loop's state
   is per rank); returns DT_OK when it was refused as it should be. */
static dt_result pl_load_rank(dt_comm *c, void *arg) {
    dt_model *m = NULL;
    dt_result r = rs_model(&m, dt_comm_rank(c));
    if (r == DT_OK) r = dt_checkpoint_load_comm(c, (const char *)arg, m, NULL, NULL);
    if (r == DT_ERR_FORMAT && strstr(dt_last_error(), "holds the state of 2 ranks but this run has 3")) r = DT_OK;
    else r = dt_set_error(DT_ERR_STATE, "rank %d: %s", dt_comm_rank(c), r == DT_OK ? "loaded" : dt_last_error());
    dt_model_destroy(m);
    return r;
}

static dt_result on_ranks(dt_rank_fn fn, void *arg, int ranks) {
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.ranks = ranks;
    ld.threads_per_rank = 1;
    ld.comm.timeout = 20;
    return dt_launch_local(&ld, fn, arg, NULL);
}

static void copy_changed(const char *from, const char *to, long keep, long flip) {
    FILE *f = fopen(from, "rb"), *g = fopen(to, "wb");
    long i;
    int ch;
    for (i = 0; f && g && (ch = fgetc(f)) != EOF && i < keep; i++) fputc(i == flip ? ch ^ 0x20 : ch, g);
    if (f) fclose(f);
    if (g) fclose(g);
}

static void test_refusals(void) {
    char good[160], two[160], bad[160], dp[160];
    long n;
    FILE *f;
    rf_case k;
    snprintf(good, sizeof good, "%s/three.ckpt", dir);
    snprintf(two, sizeof two, "%s/two.ckpt", dir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
    snprintf(dp, sizeof dp, "%s/plain.ckpt", dir);
    CHECK_OK(on_ranks(sv_rank, good, 3));
    f = fopen(good, "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fclose(f);
    {
        struct { const char *file; long keep, flip; int other, want; const char *cause; } cases[] = {
            {good, 0, -1, 1, DT_ERR_FORMAT, "another model"},              /* rank 1's model differs */
            {bad, -1, n / 2, 0, DT_ERR_FORMAT, "checksum"},                /* a byte flipped in a section */
            {bad, -1, n - 3, 0, DT_ERR_FORMAT, "checksum"},                /* ... in the checksum */
            {bad, n - 100, -1, 0, DT_ERR_FORMAT, "truncated"},
            {bad, 6, -1, 0, DT_ERR_FORMAT, "not a dtrain checkpoint"},
            {bad, -1, 2, 0, DT_ERR_FORMAT, "not a dtrain checkpoint"},     /* the magic */
            {dp, 0, -1, 0, DT_ERR_FORMAT, "written by dt_checkpoint_save"},
            {"/nonexistent/x.ckpt", 0, -1, 0, DT_ERR_IO, "/nonexistent/x.ckpt"},
        };
        int i;
        for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
            if (cases[i].file == bad) copy_changed(good, bad, cases[i].keep < 0 ? n : cases[i].keep, cases[i].flip);
            if (cases[i].file == dp) CHECK_OK(on_ranks(pl_rank, dp, 3));   /* a checkpoint, but not DDP's */
            memset(&k, 0, sizeof k);
            k.path = cases[i].file; k.other = cases[i].other; k.want = cases[i].want; k.cause = cases[i].cause;
            CHECK_OK(on_ranks(rf_rank, &k, 3));
            CHECK(k.failed[0] == 0 && k.failed[1] == 0 && k.failed[2] == 0);
        }
    }
    CHECK_OK(on_ranks(pl_rank, two, 2));   /* a plain checkpoint of 2 ranks, on 3: refused (DDP's resumes: test_ddp) */
    CHECK_OK(on_ranks(pl_load_rank, two, 3));
    remove(good); remove(two); remove(bad); remove(dp);
}

/* What a trainer cannot save: DDP's gradient accumulated and not synchronised (a checkpoint holds none),
   D-PSGD's model while it holds the average instead of the replica. Every rank gets the refusal. */
static dt_result st_rank(dt_comm *c, void *arg) {
    int me = dt_comm_rank(c), *failed = (int *)arg + me;   /* each rank counts its own */
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_dpsgd *g = NULL;
    dt_topology topo;
    dt_topology_desc td;
    dt_result r = rs_model(&m, me);
    float x[2 * 64], loss;
    int32_t y[2] = {0, 1};
    int i;
    memset(&topo, 0, sizeof topo);
    memset(&td, 0, sizeof td);
    td.kind = DT_TOPO_RING; td.world = dt_comm_size(c);
    for (i = 0; i < 2 * 64; i++) x[i] = (float)(i % 7) / 7.0f;
    if (r == DT_OK && (r = dt_ddp_create(&d, c, m, NULL)) == DT_OK && (r = dt_model_forward(m, x, 2)) == DT_OK &&
        (r = dt_model_loss_labels(m, y, &loss)) == DT_OK && (r = dt_ddp_backward(d, NULL, 2, 0)) == DT_OK) {
        r = dt_ddp_save(d, dir, NULL, NULL);   /* refused before any file is touched */
        if (r != DT_ERR_STATE || !strstr(dt_last_error(), "not synchronised")) (*failed)++;
        r = DT_OK;
    }
    if (r == DT_OK && (r = dt_topology_create(&topo, &td)) == DT_OK && (r = dt_dpsgd_create(&g, c, m, &topo, NULL)) == DT_OK &&
        (r = dt_dpsgd_use_average(g, 1)) == DT_OK) {
        r = dt_dpsgd_save(g, dir, NULL, NULL);
        if (r != DT_ERR_STATE || !strstr(dt_last_error(), "dt_dpsgd_use_average(d, 0)")) (*failed)++;
        r = dt_dpsgd_load(g, dir, NULL, NULL);
        if (r != DT_ERR_STATE) (*failed)++;
        r = DT_OK;
    }
    dt_dpsgd_destroy(g);
    dt_topology_free(&topo);
    dt_ddp_destroy(d);
    dt_model_destroy(m);
    return r;
}

static void test_trainer_state_refused(void) {
    int failed[3] = {0, 0, 0};
    CHECK_OK(on_ranks(st_rank, failed, 3));
    CHECK(failed[0] == 0 && failed[1] == 0 && failed[2] == 0);
}

int main(int argc, char **argv) {
    int rc;
    if (argc > 1 && !strcmp(argv[1], "--child")) return rs_main(argc - 1, argv + 1);
    dt_t_only = argc > 1 ? argv[1] : NULL;
    rs_fill();
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(dir, sizeof dir, "/tmp/dt_resume_test_XXXXXX");
    if (!mkdtemp(dir)) { printf("cannot create a temporary directory\n0 passed, 1 failed\n"); return 1; }
    printf("test_resume\n");
    RUN(test_loader_seek);
    RUN(test_resume_single);
    RUN(test_resume_ddp);
    RUN(test_resume_localsgd);
    RUN(test_resume_dpsgd);
    RUN(test_resume_dpsgd_exp);
    RUN(test_resume_sgp);
    RUN(test_resume_fedavg);
    RUN(test_refusals);
    RUN(test_trainer_state_refused);
    rc = dt_t_summary();
    rmdir(dir);
    return rc;
}
