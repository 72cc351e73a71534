/* test_faults.c - faults end cleanly on local ranks: each kind of DT_FAULT (dt_comm_desc.fault) ends
   dt_launch_local with an error that names the cause and the rank, in bounded time (a rank stalled for
   good is left behind, not waited for); one NaN pixel in one rank's batch under DDP ends the run with
   DT_ERR_NUMERIC naming that rank, the epoch and the step, logged once; bad fault specs are refused.
   (tests/run.sh runs tests/mpi/fault_ddp.c with the same faults as a program, on local ranks and under
   mpiexec, for the exit status.) */
#include "../dtrain.h"
#include "dt_test.h"
#include "train_checks.h"
#include "fault_ddp.h"

#define TIMEOUT 0.3   /* seconds: the communicator's, short so that every case ends in about a second */

/* Runs fault_ddp's DDP on n local ranks with fault (NULL: none); returns dt_launch_local's result, its
   message in msg and the seconds it took in *secs. */
static dt_result run(int n, const char *fault, const fd_job *j, char *msg, size_t cap, double *secs) {
    dt_launch_desc d;
    dt_result r;
    double t0 = dt_time_now();
    memset(&d, 0, sizeof d);
    d.ranks = n;
    d.threads_per_rank = 1;
    d.comm.timeout = TIMEOUT;
    d.comm.fault = fault;
    r = dt_launch_local(&d, fd_rank, (void *)(uintptr_t)j, NULL);
    *secs = dt_time_now() - t0;
    snprintf(msg, cap, "%s", dt_last_error());
    return r;
}

/* One fault on rank 2 of 3 at collective 5 (a DDP step): result want, every fragment in the message,
   done within limit seconds. */
static void expect(const char *fault, dt_result want, const char *frag1, const char *frag2, double limit) {
    fd_job j = {20, 0, 0, NULL, 0};
    char msg[512];
    double secs;
    dt_result r = run(3, fault, &j, msg, sizeof msg, &secs);
    CHECK(r == want);
    CHECK(strstr(msg, frag1) != NULL);
    CHECK(!frag2 || strstr(msg, frag2) != NULL);
    CHECK(secs < limit);
    if (r != want || !strstr(msg, frag1) || (frag2 && !strstr(msg, frag2)) || secs >= limit)
        printf("    %s: %s after %.2f s: %s\n", fault, dt_result_str(r), secs, msg);
}

static void test_kinds(void) {
    expect("rank=2,coll=5,kind=fail", DT_ERR_STATE, "rank 2: all-reduce #5", "injected failure", 2.0);
    expect("rank=2,coll=5,kind=return", DT_ERR_PEER, "2 (finished)", NULL, 2.0);   /* "ranks not in it: ..., 2 (finished)" */
    /* the stalled rank has not arrived: the others' timeouts name it */
    expect("rank=2,coll=5,kind=stall:0.8", DT_ERR_TIMEOUT, "2 (at #4)", NULL, 3.0);
    /* stalled longer than the timeout and a second after the failure: reported, left behind */
    expect("rank=2,coll=5,kind=stall:60", DT_ERR_TIMEOUT, "rank 2 has not returned", "the process must exit", TIMEOUT + 3.0);
    expect("rank=2,coll=5,kind=hang", DT_ERR_TIMEOUT, "rank 2 has not returned", NULL, TIMEOUT + 3.0);
    /* a NaN in rank 2's gradient reaches every rank's parameters: the next step's loss, on every rank */
    expect("rank=2,coll=5,kind=nan", DT_ERR_NUMERIC, "epoch 1, step ", "the loss is nan", 2.0);
}

/* Counts the error lines the launcher logs. */
typedef struct lines { int errors, nan; } lines;
static void count_lines(void *user, int level, const char *msg) {
    lines *l = (lines *)user;
    l->errors += level == DT_LOG_ERROR;
    l->nan += level == DT_LOG_ERROR && strstr(msg, "the loss is nan") != NULL;
}

static void test_nan_pixel(void) {
    fd_job j = {20, 1, 3, NULL, 0};
    char msg[512];
    double secs;
    lines l = {0, 0};
    dt_launch_desc d;
    dt_result r = run(3, NULL, &j, msg, sizeof msg, &secs);
    CHECK(r == DT_ERR_NUMERIC);
    CHECK(strstr(msg, "rank 1: epoch 1, step 3: ") != NULL && strstr(msg, "the loss is nan") != NULL);
    /* through dt_launch, which logs: the NaN once, and the others' DT_ERR_PEER not as errors */
    memset(&d, 0, sizeof d);
    d.ranks = 4;
    d.threads_per_rank = 1;
    d.comm.timeout = TIMEOUT;
    dt_log_configure(count_lines, &l, DT_LOG_ERROR);
    r = dt_launch(&d, fd_rank, &j);
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    CHECK(r == DT_ERR_NUMERIC);
    CHECK(l.nan == 1 && l.errors == 1);
    /* every rank's NaN loss (the gradient's NaN): the cause once, the others on one line */
    l.errors = l.nan = 0;
    d.comm.fault = "rank=3,coll=5,kind=nan";
    j.nan_step = 0;
    dt_log_configure(count_lines, &l, DT_LOG_ERROR);
    r = dt_launch(&d, fd_rank, &j);
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    CHECK(r == DT_ERR_NUMERIC);
    CHECK(l.nan == 1 && l.errors == 2);
}

static void test_bad_specs(void) {
    static const char *bad[] = {"rank=1", "rank=1,coll=0,kind=fail", "rank=-1,coll=3,kind=fail", "rank=1,coll=3,kind=boom",
                                "rank=1,coll=3,kind=stall:0", "rank=1,coll=3,kind=stall:x", "rank=1,coll=3,kind=failx1", "rank=1,coll=3,kind=hang,"};
    dt_comm *c[2] = {NULL, NULL};
    dt_comm_desc d;
    size_t i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        d.fault = bad[i];
        CHECK_ERR(dt_comm_create_local(c, 2, &d), DT_ERR_INVALID_ARG);
        CHECK(strstr(dt_last_error(), "rank=R,coll=N,kind=K") != NULL);
    }
    d.fault = "rank=1,coll=3,kind=stall:0.5";   /* a good one; a rank the run lacks never fires */
    CHECK_OK(dt_comm_create_local(c, 2, &d));
    dt_comm_destroy(c[0]);
    dt_comm_destroy(c[1]);
}

/* A fault that could test nothing is refused: on a rank the run does not have (at creation), at a collective
   the run never reaches (when the rank's function has returned), or kind=nan where the rank has no float in
   the collective (integers, or a broadcast's receiving side). */
static void test_no_fire(void) {
    fd_job j = {5, 0, 0, NULL, 0};
    char msg[512];
    double secs;
    CHECK_ERR(run(3, "rank=7,coll=2,kind=hang", &j, msg, sizeof msg, &secs), DT_ERR_INVALID_ARG);
    CHECK(strstr(msg, "names rank 7, but the run has 3 ranks") != NULL);
    CHECK_ERR(run(3, "rank=1,coll=500,kind=fail", &j, msg, sizeof msg, &secs), DT_ERR_INVALID_ARG);
    CHECK(strstr(msg, "rank 1: DT_FAULT 'rank=1,coll=500,kind=fail'") != NULL && strstr(msg, "never fired") != NULL &&
          strstr(msg, "#500") != NULL);
    /* dt_ddp_create: #1 the model sizes' all-reduce (int64), #2 rank 0's parameters, broadcast */
    CHECK_ERR(run(3, "rank=1,coll=1,kind=nan", &j, msg, sizeof msg, &secs), DT_ERR_INVALID_ARG);
    CHECK(strstr(msg, "no float of rank 1's to poison") != NULL && strstr(msg, "integers") != NULL);
    CHECK_ERR(run(3, "rank=1,coll=2,kind=nan", &j, msg, sizeof msg, &secs), DT_ERR_INVALID_ARG);
    CHECK(strstr(msg, "broadcast's root") != NULL);
    /* on the root, the NaN reaches every replica: the first loss */
    CHECK_ERR(run(3, "rank=0,coll=2,kind=nan", &j, msg, sizeof msg, &secs), DT_ERR_NUMERIC);
    CHECK(strstr(msg, "epoch 1, step 1: ") != NULL);
}

/* A NaN in any collective of a compressed DDP run, on any rank, is never applied silently: each run ends in
   DT_ERR_NUMERIC (the counts, a PowerSGD norm, or the loss after it), or the fault is refused for want of a
   float (top-k's integer wire). Before the counts were checked, a NaN in fp16's sample counts trained on with
   the undivided gradient sum and returned DT_OK. */
static void test_nan_compressed(void) {
    static const char *methods[] = {"fp16", "bf16", "powersgd:2", "topk:0.25"};
    size_t i;
    for (i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        fd_job j = {3, 0, 0, NULL, 0};
        int coll, numeric = 0, counts = 0, norm = 0, refused = 0, bad = 0;
        j.compress = methods[i];
        j.last_no_bias = i == 2;   /* PowerSGD: the rank's first element is then in a P, not a bias sent as it is */
        for (coll = 3; coll < 40; coll++) {
            char fault[64], msg[512];
            double secs;
            dt_result r;
            snprintf(fault, sizeof fault, "rank=%d,coll=%d,kind=nan", coll % 3, coll);
            r = run(3, fault, &j, msg, sizeof msg, &secs);
            if (r == DT_ERR_INVALID_ARG && strstr(msg, "never fired")) break;   /* past the last collective */
            numeric += r == DT_ERR_NUMERIC;
            counts += r == DT_ERR_NUMERIC && strstr(msg, "all-reduced") != NULL;
            norm += r == DT_ERR_NUMERIC && strstr(msg, "norm of a column") != NULL;
            refused += r == DT_ERR_INVALID_ARG && strstr(msg, "no float") != NULL;
            if (r != DT_ERR_NUMERIC && !(r == DT_ERR_INVALID_ARG && strstr(msg, "no float"))) {
                bad++;
                printf("    --compress %s, %s: %s: %s\n", methods[i], fault, dt_result_str(r), msg);
            }
        }
        CHECK(bad == 0);
        CHECK(coll > 5 && coll < 40);
        if (i < 2) CHECK(counts > 0 && numeric > 0 && refused == 0);   /* fp16, bf16: the counts go alone, in f32 */
        if (i == 2) CHECK(norm > 0);
        if (i == 3) CHECK(refused > 0);
    }
}

/* A trainer's create that fails on one rank only (rank 1's desc is bad, or its topology has another world) ends on
   every rank at once, with rank 1's error and message: the others do not wait in the create's first collective
   until the timeout (20 s here). */
typedef struct cf_job { int trainer; dt_result got[3]; char msg[3][512]; } cf_job;
static dt_result cf_rank(dt_comm *c, void *arg) {
    cf_job *j = (cf_job *)arg;
    int me = dt_comm_rank(c), bad = me == 1;
    dt_model *m = NULL;
    dt_result r = tc_mlp(&m, 4, 3, 1, 0, 5, 0);
    static uint8_t pix[12 * 4];
    static int32_t lab[12];
    if (r == DT_OK && j->trainer == 0) {
        dt_ddp *d = NULL;
        dt_ddp_desc dd;
        memset(&dd, 0, sizeof dd);
        dd.bucket_bytes = bad ? -1 : 0;
        r = dt_ddp_create(&d, c, m, &dd);
        dt_ddp_destroy(d);
    } else if (r == DT_OK && j->trainer == 1) {
        dt_localsgd *d = NULL;
        dt_localsgd_desc ld;
        memset(&ld, 0, sizeof ld);
        ld.period = bad ? -1 : 2;
        r = dt_localsgd_create(&d, c, m, &ld);
        dt_localsgd_destroy(d);
    } else if (r == DT_OK && j->trainer == 2) {
        dt_topology t;
        dt_topology_desc td;
        dt_dpsgd *d = NULL;
        memset(&td, 0, sizeof td);
        td.kind = DT_TOPO_RING;
        td.world = bad ? 4 : dt_comm_size(c);
        if ((r = dt_topology_create(&t, &td)) == DT_OK) {
            r = dt_dpsgd_create(&d, c, m, &t, NULL);
            dt_dpsgd_destroy(d);
            dt_topology_free(&t);
        }
    } else if (r == DT_OK) {
        dt_dataset ds;
        dt_partition part;
        dt_partition_desc pd;
        dt_fed_desc fd;
        dt_fed *f = NULL;
        memset(&ds, 0, sizeof ds);
        ds.count = 12; ds.c = 4; ds.h = 1; ds.w = 1; ds.num_classes = 3; ds.pixels = pix; ds.labels = lab;
        memset(&pd, 0, sizeof pd);
        pd.count = 12; pd.parts = 2;
        memset(&fd, 0, sizeof fd);
        fd.data = &ds; fd.part = &part; fd.clients = 2;
        fd.frac = bad ? 2.0f : 1.0f;
        if ((r = dt_partition_create(&part, &pd)) == DT_OK) {
            r = dt_fed_create(&f, c, m, &fd);
            dt_fed_destroy(f);
            dt_partition_free(&part);
        }
    }
    j->got[me] = r;
    snprintf(j->msg[me], sizeof j->msg[me], "%s", dt_last_error());
    dt_model_destroy(m);
    return r;
}
static void test_create_fails_on_one_rank(void) {
    static const char *const names[4] = {"dt_ddp_create", "dt_localsgd_create", "dt_dpsgd_create", "dt_fed_create"};
    static cf_job j;
    int t, r;
    for (t = 0; t < 4; t++) {
        double t0 = dt_time_now(), secs;
        memset(&j, 0, sizeof j);
        j.trainer = t;
        CHECK(tc_launch(cf_rank, &j, 3) == DT_ERR_INVALID_ARG);
        secs = dt_time_now() - t0;
        printf("    %s failing on rank 1: every rank returned in %.2f s: %s\n", names[t], secs, j.msg[0]);
        CHECK(secs < 5.0);
        for (r = 0; r < 3; r++) {
            CHECK(j.got[r] == DT_ERR_INVALID_ARG);
            CHECK(strstr(j.msg[r], names[t]) != NULL && strstr(j.msg[r], "rank 1") != NULL);
        }
    }
}

/* Rank 0 works on (without the communicator) for longer than the timeout after the others have returned
   DT_OK: no rank has failed, so dt_launch waits for it, however long it takes. */
static dt_result slow_rank0(dt_comm *c, void *arg) {
    (void)arg;
    if (dt_comm_rank(c) == 0) dt_sleep(TIMEOUT + 1.5);   /* past the bounded wait that follows a failure */
    return DT_OK;
}
static void test_slow_rank_waited_for(void) {
    dt_launch_desc d;
    memset(&d, 0, sizeof d);
    d.ranks = 3;
    d.comm.timeout = TIMEOUT;
    CHECK_OK(dt_launch_local(&d, slow_rank0, NULL, NULL));
}

int main(int argc, char **argv) {
    if (argc > 1) dt_t_only = argv[1];
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    RUN(test_bad_specs);
    RUN(test_no_fire);
    RUN(test_nan_compressed);
    RUN(test_slow_rank_waited_for);
    RUN(test_create_fails_on_one_rank);
    RUN(test_kinds);
    RUN(test_nan_pixel);
    return dt_t_summary();
}
