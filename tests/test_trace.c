/* test_trace.c - the timeline (--trace): DDP and D-PSGD on local ranks write one Chrome-trace JSON file,
   read back here by a small JSON parser: its structure, every rank's forward, loss, backward, optimizer
   and all-reduce spans, spans that nest on every lane, DDP's buckets on the helper's lane overlapping
   backward, the program's own spans and an escaped name; tracing off records nothing; an unwritable path
   fails the launch naming it; a full lane drops and counts; a failed run still leaves its trace. */
#define _POSIX_C_SOURCE 200809L   /* mkdtemp */
#include <stdlib.h>
#include <pthread.h>
#include "../dtrain.h"
#include "dt_test.h"
#include "dt_test_files.h"
#include "dt_test_trace.h"

static char tmp_dir[256] = "/tmp/dt_test_trace_XXXXXX";

static void trace_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmp_dir, name); }

/* ---- log capture ----------------------------------------------------------------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];
static void log_sink(void *user, int level, const char *msg) {
    size_t n;
    (void)user; (void)level;
    pthread_mutex_lock(&log_mu);
    n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}
static void log_begin(void) { log_text[0] = 0; dt_log_configure(log_sink, NULL, DT_LOG_INFO); }
static void log_end(void) { dt_log_configure(NULL, NULL, DT_LOG_INFO); }

/* ---- DDP and D-PSGD on 3 local ranks ------------------------------------------------------------ */

#define RANKS 3
#define STEPS 4

/* Trains on RANKS local ranks with DDP (STEPS steps) or D-PSGD (2), the trace going to the file `name` of
   the temporary directory (its path in path[512]), and reads the trace into *t: 0 when it is valid. The
   first layer is wide (2048 inputs), so its backward runs long after the last layer's bucket has left. */
static int traced_run(trace_job *j, int dpsgd, const char *name, char *path, trace *t) {
    dt_launch_desc ld;
    memset(j, 0, sizeof *j);
    j->dpsgd = dpsgd;
    j->steps = dpsgd ? 2 : STEPS;
    j->batch = 32;
    j->in = 2048;
    j->fail_rank = -1;
    memset(&ld, 0, sizeof ld);
    trace_path(path, 512, name);
    ld.ranks = RANKS;
    ld.trace_path = path;
    log_begin();
    CHECK_OK(dt_launch_local(&ld, trace_train_rank, j, NULL));
    log_end();
    return trace_load(path, t);
}

/* DDP's buckets on the helper's lane that overlap their rank's backward pass */
static int bucket_overlaps(const trace *t) {
    int i, k, overlaps = 0;
    for (i = 0; i < t->n; i++) {
        const ev *b = &t->e[i];
        if (b->tid != 1 || strcmp(b->name, "bucket") != 0) continue;
        for (k = 0; k < t->n; k++) {
            const ev *w = &t->e[k];
            overlaps += w->pid == b->pid && w->tid == 0 && !strcmp(w->name, "backward") && b->ts < w->ts + w->dur &&
                        w->ts < b->ts + b->dur;
        }
    }
    return overlaps;
}

static void test_ddp_timeline(void) {
    char path[512];
    trace_job j;
    trace t;
    int r, overlaps, attempt;
    if (traced_run(&j, 0, "ddp.json", path, &t) != 0) { CHECK(0); return; }
    CHECK(strstr(log_text, "trace: ") && strstr(log_text, path) && strstr(log_text, "ui.perfetto.dev"));
    {
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        CHECK(!file_exists(tmp));
    }
    CHECK(t.ranks == RANKS && t.dropped == 0 && t.events > 0);
    for (r = 0; r < RANKS; r++) {
        char rank_name[16];
        snprintf(rank_name, sizeof rank_name, "rank %d", r);
        CHECK(j.enabled[r] && j.overlapped[r] && j.buckets[r] >= 3);
        CHECK(has_meta(&t, "process_name", r, 0, rank_name));
        CHECK(has_meta(&t, "thread_name", r, 0, "main") && has_meta(&t, "thread_name", r, 1, "ddp buckets"));
        CHECK(count(&t, "X", r, 0, "forward") == STEPS && count(&t, "X", r, 0, "loss") == STEPS);
        CHECK(count(&t, "X", r, 0, "backward") == STEPS && count(&t, "X", r, 0, "optimizer step") == STEPS);
        CHECK(count(&t, "X", r, 0, "wait for buckets") == STEPS && count(&t, "X", r, 0, "ddp join") == 1);
        CHECK(count(&t, "X", r, 0, "all-reduce") == 2);   /* dt_ddp_create's check and the join's; the steps' are the buckets' */
        CHECK(count(&t, "X", r, 0, "broadcast") >= 1);                          /* dt_ddp_create's */
        CHECK(count(&t, "X", r, 1, "bucket") == STEPS * j.buckets[r]);
        CHECK(count(&t, "X", r, 1, "all-reduce") == STEPS * j.buckets[r]);       /* inside the buckets */
        CHECK(count(&t, "X", r, 0, "step") == STEPS && count(&t, "X", r, 0, TRACE_ODD_NAME) == 1);
        CHECK(count(&t, "i", r, 0, "marker") == 1);
    }
    /* the helper's buckets run while the rank's thread is still in backward (a busy machine may not give
       the helper a core in time on every rank: one is asked for; and where none got one, two more runs) */
    overlaps = bucket_overlaps(&t);
    for (attempt = 1; overlaps == 0 && attempt < 3; attempt++) {
        trace_job j2;
        trace t2;
        char path2[512];
        if (traced_run(&j2, 0, "ddp-again.json", path2, &t2) != 0) break;
        overlaps = bucket_overlaps(&t2);
        trace_free(&t2);
    }
    CHECK(overlaps > 0);
    for (r = 0; r < t.n; r++) {   /* categories as documented */
        const ev *e = &t.e[r];
        if (!strcmp(e->name, "forward") || !strcmp(e->name, "backward")) CHECK(!strcmp(e->cat, "compute"));
        if (!strcmp(e->name, "all-reduce") || !strcmp(e->name, "bucket")) CHECK(!strcmp(e->cat, "comm"));
        if (!strcmp(e->name, "optimizer step")) CHECK(!strcmp(e->cat, "optim"));
        CHECK(strcmp(e->ph, "X") != 0 || !e->unfinished);
    }
    CHECK(check_lanes(&t, 0) == 0);
    trace_free(&t);
}

static void test_dpsgd_timeline(void) {
    char path[512];
    trace_job j;
    trace t;
    int r;
    if (traced_run(&j, 1, "dpsgd.json", path, &t) != 0) { CHECK(0); return; }
    for (r = 0; r < RANKS; r++) {
        CHECK(count(&t, "X", r, 0, "neighbour exchange") == 2 && count(&t, "X", r, 0, "gossip mix") == 2);
        CHECK(count(&t, "X", r, 0, "backward") == 2 && count(&t, "X", r, 0, "optimizer step") == 2);
        CHECK(count(&t, "X", r, 1, "bucket") == 0 && !has_meta(&t, "thread_name", r, 1, "ddp buckets"));
    }
    CHECK(check_lanes(&t, 0) == 0);
    trace_free(&t);
}

/* ---- off, unwritable, full, deep, failed --------------------------------------------------------------- */

static dt_result plain_rank(dt_comm *c, void *arg) {
    int *enabled = (int *)arg;
    double v = 1.0;
    enabled[dt_comm_rank(c)] = dt_trace_enabled();
    dt_trace_begin("user work", "user");
    dt_trace_end();
    return dt_comm_allreduce(c, &v, 1, DT_F64, DT_SUM, DT_ALGO_AUTO);
}

static void test_off(void) {
    dt_launch_desc ld;
    int enabled[2] = {-1, -1};
    memset(&ld, 0, sizeof ld);
    ld.ranks = 2;
    CHECK(!dt_trace_enabled());
    dt_trace_begin("outside", "user");   /* outside dt_launch: nothing, no crash */
    dt_trace_instant("outside", "user");
    dt_trace_end();
    dt_trace_end();
    log_begin();
    CHECK_OK(dt_launch_local(&ld, plain_rank, enabled, NULL));
    log_end();
    CHECK(enabled[0] == 0 && enabled[1] == 0);
    CHECK(!strstr(log_text, "trace"));
    CHECK(!dt_trace_enabled());
}

static void test_unwritable(void) {
    char path[512];
    dt_launch_desc ld;
    int enabled[2] = {0, 0};
    trace_path(path, sizeof path, "no-such-dir/t.json");
    memset(&ld, 0, sizeof ld);
    ld.ranks = 2;
    ld.trace_path = path;
    CHECK_ERR(dt_launch_local(&ld, plain_rank, enabled, NULL), DT_ERR_IO);
    CHECK(strstr(dt_last_error(), path) != NULL);
    CHECK(enabled[0] == 0 && enabled[1] == 0);   /* refused before any rank ran, not after the work */
    log_begin();
    CHECK(dt_launch(&ld, plain_rank, enabled) == DT_ERR_IO);   /* the run is refused, and logs why */
    log_end();
    CHECK(strstr(log_text, path) && strstr(log_text, "No such file"));
}

#define SPANS 20
#define CAP 5
static dt_result many_rank(dt_comm *c, void *arg) {
    int i;
    (void)c; (void)arg;
    for (i = 0; i < SPANS; i++) { dt_trace_begin("user work", "user"); dt_trace_end(); }
    return DT_OK;
}

static void test_full_lane(void) {
    char path[512];
    dt_launch_desc ld;
    trace t;
    trace_path(path, sizeof path, "full.json");
    memset(&ld, 0, sizeof ld);
    ld.ranks = 2;
    ld.trace_path = path;
    ld.trace_max_events = CAP;
    log_begin();
    CHECK_OK(dt_launch_local(&ld, many_rank, NULL, NULL));
    log_end();
    CHECK(strstr(log_text, "30 events were dropped") && strstr(log_text, "--trace-max-events"));
    if (trace_load(path, &t) != 0) { CHECK(0); return; }
    CHECK(t.dropped == 2 * (SPANS - CAP) && t.events == 2 * CAP);
    CHECK(count(&t, "X", 0, 0, "user work") == CAP && count(&t, "X", 1, 0, "user work") == CAP);
    CHECK(has_meta(&t, "process_labels", 0, 0, "15 events dropped"));
    CHECK(check_lanes(&t, 0) == 0);
    trace_free(&t);
}

#define DEEP 40
static dt_result deep_rank(dt_comm *c, void *arg) {
    int i;
    (void)c; (void)arg;
    for (i = 0; i < DEEP; i++) dt_trace_begin("nested", "user");
    for (i = 0; i < DEEP; i++) dt_trace_end();
    dt_trace_begin("after", "user");
    dt_trace_end();
    return DT_OK;
}

static void test_deep_nesting(void) {   /* one rank: on the calling thread */
    char path[512];
    dt_launch_desc ld;
    trace t;
    trace_path(path, sizeof path, "deep.json");
    memset(&ld, 0, sizeof ld);
    ld.trace_path = path;
    log_begin();
    CHECK_OK(dt_launch_local(&ld, deep_rank, NULL, NULL));
    log_end();
    CHECK(!dt_trace_enabled());   /* the calling thread records no more */
    if (trace_load(path, &t) != 0) { CHECK(0); return; }
    CHECK(count(&t, "X", 0, 0, "nested") == 32 && count(&t, "X", 0, 0, "after") == 1 && t.dropped == DEEP - 32);
    CHECK(check_lanes(&t, 0) == 0);
    trace_free(&t);
}

static dt_result failing_rank(dt_comm *c, void *arg) {
    double v = 1.0;
    (void)arg;
    if (dt_comm_rank(c) == 1) {
        dt_trace_begin("doomed", "user");
        return dt_set_error(DT_ERR_STATE, "rank 1 fails on purpose");
    }
    dt_trace_begin("survivor", "user");
    dt_trace_end();
    return dt_comm_allreduce(c, &v, 1, DT_F64, DT_SUM, DT_ALGO_RING);
}

static void test_failed_run(void) {
    char path[512];
    dt_launch_desc ld;
    trace t;
    int i, unfinished = 0;
    trace_path(path, sizeof path, "failed.json");
    memset(&ld, 0, sizeof ld);
    ld.ranks = 2;
    ld.trace_path = path;
    log_begin();
    CHECK_ERR(dt_launch_local(&ld, failing_rank, NULL, NULL), DT_ERR_STATE);   /* the run's failure, not the trace's */
    log_end();
    CHECK(strstr(dt_last_error(), "fails on purpose") != NULL);
    if (trace_load(path, &t) != 0) { CHECK(0); return; }
    CHECK(count(&t, "X", 1, 0, "doomed") == 1 && count(&t, "X", 0, 0, "survivor") == 1);
    for (i = 0; i < t.n; i++) unfinished += t.e[i].unfinished && !strcmp(t.e[i].name, "doomed");
    CHECK(unfinished == 1);
    CHECK(check_lanes(&t, 1) == 0);
    trace_free(&t);
}

static void test_flags(void) {
    char a0[] = "prog", a1[] = "--trace", a2[] = "/tmp/x.json", a3[] = "--epochs", a4[] = "2", a5[] = "--trace-max-events", a6[] = "100";
    char b1[] = "--trace-max-events", b2[] = "0", c1[] = "--trace";
    char *argv[8] = {a0, a1, a2, a3, a4, a5, a6, NULL};
    char *bad1[4] = {a0, b1, b2, NULL}, *bad2[3] = {a0, c1, NULL};
    int argc = 7, n;
    dt_launch_desc d;
    memset(&d, 0, sizeof d);
    CHECK_OK(dt_launch_parse(&argc, argv, &d));
    CHECK(argc == 3 && !strcmp(argv[1], "--epochs") && !strcmp(argv[2], "2") && argv[3] == NULL);
    CHECK(d.trace_path && !strcmp(d.trace_path, "/tmp/x.json") && d.trace_max_events == 100);
    n = 3;
    CHECK_ERR(dt_launch_parse(&n, bad1, &d), DT_ERR_INVALID_ARG);
    n = 2;
    CHECK_ERR(dt_launch_parse(&n, bad2, &d), DT_ERR_INVALID_ARG);
}

int main(int argc, char **argv) {
    if (argc > 1) dt_t_only = argv[1];
    if (!mkdtemp(tmp_dir)) { printf("cannot create a temporary directory\n0 passed, 1 failed\n"); return 1; }
    RUN(test_flags);
    RUN(test_ddp_timeline);
    RUN(test_dpsgd_timeline);
    RUN(test_off);
    RUN(test_unwritable);
    RUN(test_full_lane);
    RUN(test_deep_nesting);
    RUN(test_failed_run);
    dt_t_rm_rf(tmp_dir);
    return dt_t_summary();
}
