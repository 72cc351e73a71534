/* The communicator on the local and self backends: every primitive against a serial reference (the
   backend-independent checks of comm_checks.h) on 1 to 8 ranks and with small ring segments; the
   determinism the algorithms promise; faults (a rank that leaves, fails, never comes, exits its thread,
   or calls another collective or size) end every rank with an error naming the cause, in bounded time,
   and leave the communicator broken; the link model; the launcher (flags, results, rank-prefixed log).
   DT_TEST_QUICK=1 leaves out the million-element cases (for the sanitizer builds). */
#define _POSIX_C_SOURCE 200809L
#define DTRAIN_IMPLEMENTATION   /* here, not linked (Makefile): dt__lib_send, dt__req */
#include "../dtrain.h"
#include "dt_test.h"
#include "comm_checks.h"
#include "dt_test_os.h"

static int quick;   /* DT_TEST_QUICK: fewer large cases */

/* Runs comm_checks_run on ranks local ranks with the communicator options cd. */
static void launch_checks(int ranks, const dt_comm_desc *cd, int big) {
    dt_launch_desc d;
    comm_checks_arg a;
    dt_result res[CC_MAX_RANKS];
    int k;
    memset(&d, 0, sizeof d);
    memset(&a, 0, sizeof a);
    d.ranks = ranks;
    if (cd) d.comm = *cd;
    if (!d.comm.timeout) d.comm.timeout = 60;
    a.seed = 1000 + (uint64_t)ranks;
    a.big = big && !quick;
    CHECK_OK(dt_launch_local(&d, comm_checks_run, &a, res));
    for (k = 0; k < ranks; k++) {
        CHECK(res[k] == DT_OK);
        CHECK(a.failures[k] == 0);
    }
}

static void test_checks_1_to_8_ranks(void) {
    int p;
    for (p = 1; p <= 8; p++) {
        double t0 = dt_time_now();
        launch_checks(p, NULL, 1);
        if (getenv("DT_TEST_VERBOSE")) printf("    %d ranks: %.2f s\n", p, dt_time_now() - t0);
    }
}

static void test_checks_small_segments(void) {
    dt_comm_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.segment_bytes = 4096;
    launch_checks(5, &cd, 1);
    launch_checks(8, &cd, 0);
    cd.segment_bytes = 100;   /* not a multiple of 8: segments must still hold whole elements */
    launch_checks(3, &cd, 0);
    launch_checks(7, &cd, 0);
}

/* AUTO means the communicator's default algorithm */
static void test_checks_default_algo(void) {
    dt_comm_desc cd;
    int a;
    memset(&cd, 0, sizeof cd);
    for (a = DT_ALGO_NAIVE; a < DT_ALGO_COUNT; a++) {
        cd.algo = (dt_algo)a;
        launch_checks(a == DT_ALGO_TREE ? 6 : 4, &cd, 0);
    }
}

/* The self backend on the calling thread, and local ranks on the caller's own threads. */
static dt_result run_checks_thread_arg(dt_comm *c, comm_checks_arg *a) { return comm_checks_run(c, a); }
typedef struct own_thread { dt_comm *c; comm_checks_arg *a; dt_result r; pthread_t id; } own_thread;
static void *own_main(void *p) {
    own_thread *t = (own_thread *)p;
    t->r = run_checks_thread_arg(t->c, t->a);
    return NULL;
}
static void test_self_and_own_threads(void) {
    dt_comm *c = NULL, *cs[3];
    comm_checks_arg a;
    own_thread t[3];
    int k;
    memset(&a, 0, sizeof a);
    a.seed = 5;
    CHECK_OK(dt_comm_create_self(&c, NULL));
    if (!c) return;
    CHECK(dt_comm_rank(c) == 0 && dt_comm_size(c) == 1 && strcmp(dt_comm_backend_name(c), "self") == 0);
    CHECK_OK(comm_checks_run(c, &a));
    CHECK(a.failures[0] == 0);
    dt_comm_destroy(c);
    CHECK_OK(dt_comm_create_local(cs, 3, NULL));
    CHECK(strcmp(dt_comm_backend_name(cs[0]), "local") == 0 && dt_comm_size(cs[2]) == 3 && dt_comm_rank(cs[2]) == 2);
    for (k = 0; k < 3; k++) { t[k].c = cs[k]; t[k].a = &a; pthread_create(&t[k].id, NULL, own_main, &t[k]); }
    for (k = 0; k < 3; k++) { pthread_join(t[k].id, NULL); CHECK(t[k].r == DT_OK && a.failures[k] == 0); }
    for (k = 0; k < 3; k++) dt_comm_destroy(cs[k]);
    CHECK_ERR(dt_comm_create_local(cs, 0, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_comm_create_self(NULL, NULL), DT_ERR_INVALID_ARG);
    {
        dt_comm_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.timeout = -1;
        CHECK_ERR(dt_comm_create_local(cs, 2, &cd), DT_ERR_INVALID_ARG);
        cd.timeout = 0; cd.algo = (dt_algo)17;
        CHECK_ERR(dt_comm_create_local(cs, 2, &cd), DT_ERR_INVALID_ARG);
    }
}

/* ---- determinism ---- */

#define DET_N 1000003
typedef struct det_arg { float *out[8][3]; } det_arg;   /* [rank][naive, native, ring] */
static dt_result det_rank(dt_comm *c, void *arg) {
    det_arg *a = (det_arg *)arg;
    int me = dt_comm_rank(c), j;
    static const dt_algo algos[3] = {DT_ALGO_NAIVE, DT_ALGO_NATIVE, DT_ALGO_RING};
    dt_result r = DT_OK;
    for (j = 0; j < 3 && r == DT_OK; j++) {
        cc_fill(DT_F32, 99, me, a->out[me][j], 0, DET_N);
        r = dt_comm_allreduce(c, a->out[me][j], DET_N, DT_F32, DT_SUM, algos[j]);
    }
    return r;
}
/* NAIVE and the local NATIVE both reduce in rank order: the same bits; every algorithm gives the same
   bits on every rank and on every run. */
static void test_determinism(void) {
    static det_arg a[2];
    dt_launch_desc d;
    int run, k, j, p = 5, n = quick ? 1000 : DET_N;
    memset(&d, 0, sizeof d);
    d.ranks = p;
    for (run = 0; run < 2; run++)
        for (k = 0; k < p; k++)
            for (j = 0; j < 3; j++) a[run].out[k][j] = (float *)malloc(DET_N * sizeof(float));
    for (run = 0; run < 2; run++) CHECK_OK(dt_launch_local(&d, det_rank, &a[run], NULL));
    CHECK(memcmp(a[0].out[0][0], a[0].out[0][1], (size_t)n * 4) == 0);   /* naive == native */
    for (run = 0; run < 2; run++)
        for (k = 0; k < p; k++)
            for (j = 0; j < 3; j++) CHECK(memcmp(a[run].out[k][j], a[0].out[0][j], (size_t)n * 4) == 0);
    for (run = 0; run < 2; run++)
        for (k = 0; k < p; k++)
            for (j = 0; j < 3; j++) free(a[run].out[k][j]);
}

/* ---- faults ---- */

enum { F_NONE, F_RETURN_OK, F_RETURN_ERROR, F_LATE, F_COUNT_PLUS_ONE, F_OTHER_COLLECTIVE, F_THREAD_EXIT, F_P2P_TOO_BIG };
typedef struct fault_arg {
    int       mode, victim, alltoall;    /* collective #2 is 1: an all-to-all (the communicator's algo), 2: all-to-all-v */
    dt_algo   algo;
    size_t    n;
    double    late;                  /* F_LATE: how long the victim sleeps */
    dt_result first[8], res[8], again[8];
    double    elapsed[8], again_elapsed[8];
    char      msg[8][700], again_msg[8][700];
    int       wrong[8];              /* a rank whose call succeeded with a wrong result */
} fault_arg;

/* collective #2 (and the call after a failure): all-reduce of buf[n], or all-to-all (-v) of n per block
   from buf into buf + 8 (n + 1) */
static dt_result fault_coll(const fault_arg *a, dt_comm *c, float *buf, size_t n) {
    size_t counts[8], displs[8];
    int k;
    for (k = 0; k < 8; k++) { counts[k] = n; displs[k] = (size_t)k * n; }
    if (a->alltoall == 2) return dt_comm_alltoallv(c, buf, counts, displs, buf + 8 * (n + 1), counts, displs, DT_F32);
    if (a->alltoall) return dt_comm_alltoall(c, buf, buf + 8 * (n + 1), n, DT_F32);
    return dt_comm_allreduce(c, buf, n, DT_F32, DT_SUM, a->algo);
}
static dt_result fault_rank(dt_comm *c, void *arg) {
    fault_arg *a = (fault_arg *)arg;
    int me = dt_comm_rank(c);
    size_t n = a->n + (a->mode == F_COUNT_PLUS_ONE && me == a->victim);
    float *buf = (float *)malloc(16 * (n + 1) * sizeof(float));
    double t0;
    dt_result r;
    cc_fill(DT_F32, 3, me, buf, 0, n);
    a->first[me] = dt_comm_allreduce(c, buf, 10, DT_F32, DT_SUM, a->algo);   /* collective #1 goes well */
    if (me == a->victim) {
        if (a->mode == F_RETURN_OK) { free(buf); return DT_OK; }
        if (a->mode == F_RETURN_ERROR) { free(buf); return dt_set_error(DT_ERR_NUMERIC, "the loss became NaN"); }
        if (a->mode == F_THREAD_EXIT) { free(buf); pthread_exit(NULL); }
        if (a->mode == F_LATE) cc_sleep(a->late);
    }
    cc_fill(DT_F32, 3, me, buf, 0, n);
    t0 = dt_time_now();
    if (a->mode == F_OTHER_COLLECTIVE && me == a->victim) r = dt_comm_broadcast(c, buf, n, DT_F32, 0, a->algo);
    else if (a->mode == F_P2P_TOO_BIG) {
        if (me == 0) r = dt_comm_send(c, buf, n, DT_F32, 1, 3);
        else if (me == 1) r = dt_comm_recv(c, buf, n - 1, DT_F32, 0, 3, NULL);
        else r = dt_comm_recv(c, buf, 1, DT_F32, 0, 4, NULL);   /* never comes: rank 0 fails or leaves */
    } else r = fault_coll(a, c, buf, n);
    a->elapsed[me] = dt_time_now() - t0;
    a->res[me] = r;
    snprintf(a->msg[me], sizeof a->msg[me], "%s", dt_last_error());
    a->wrong[me] = r == DT_OK;   /* this collective cannot have succeeded */
    if (r != DT_OK) {   /* broken for good: the next call fails at once with the same cause */
        t0 = dt_time_now();
        a->again[me] = fault_coll(a, c, buf, n);
        if (a->again[me] == DT_OK) a->again[me] = dt_comm_send(c, buf, 1, DT_F32, me, 0);
        a->again_elapsed[me] = dt_time_now() - t0;
        snprintf(a->again_msg[me], sizeof a->again_msg[me], "%s", dt_last_error());
    }
    free(buf);
    return r;
}

/* Runs a fault on p ranks; returns what dt_launch_local returned, with its message in msg. */
static dt_result run_fault(fault_arg *a, int p, double timeout, dt_result *results, char *msg, size_t cap) {
    dt_launch_desc d;
    dt_result r;
    memset(&d, 0, sizeof d);
    d.ranks = p;
    d.comm.timeout = timeout;
    d.comm.algo = a->algo;   /* what the all-to-all runs */
    r = dt_launch_local(&d, fault_rank, a, results);
    snprintf(msg, cap, "%s", dt_last_error());
    return r;
}
static void fault_init(fault_arg *a, int mode, int victim, dt_algo algo, size_t n) {
    memset(a, 0, sizeof *a);
    a->mode = mode; a->victim = victim; a->algo = algo; a->n = n;
}
/* every rank but the victim failed with an error in expect (a bitmask of results), stayed broken */
static void check_others_failed(const fault_arg *a, int p, int skip, unsigned expect, double bound) {
    int k;
    for (k = 0; k < p; k++) {
        CHECK(a->first[k] == DT_OK);
        if (k == skip) continue;
        CHECK(!a->wrong[k]);
        if (!((1u << a->res[k]) & expect)) printf("    rank %d: %s\n", k, a->msg[k]);
        CHECK((1u << a->res[k]) & expect);
        if (!(a->elapsed[k] < bound)) printf("    rank %d took %.3f s (bound %.3f): %s\n", k, a->elapsed[k], bound, a->msg[k]);
        CHECK(a->elapsed[k] < bound);
        CHECK(a->again[k] == a->res[k] && a->again_elapsed[k] < 0.5 && strstr(a->again_msg[k], "failed earlier"));
    }
}
#define BIT(r) (1u << (r))

static void test_fault_rank_returns_early(void) {
    static fault_arg a;
    static const dt_algo algos[] = {DT_ALGO_NATIVE, DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NAIVE};
    dt_result res[8];
    char msg[700];
    int i, k;
    for (i = 0; i < 4; i++) {
        fault_init(&a, F_RETURN_OK, 2, algos[i], 1000);
        CHECK(run_fault(&a, 4, 10.0, res, msg, sizeof msg) == DT_ERR_PEER);
        CHECK(res[2] == DT_OK);
        check_others_failed(&a, 4, 2, BIT(DT_ERR_PEER), 3.0);   /* promptly: far below the 10 s timeout */
        for (k = 0; k < 4; k++) if (k != 2) { CHECK((strstr(a.msg[k], "rank 2 has finished") || strstr(a.msg[k], "2 (finished)")) && strstr(a.msg[k], "all-reduce #2")); }
    }
}

static void test_fault_rank_returns_error(void) {
    static fault_arg a;
    static const dt_algo algos[] = {DT_ALGO_NATIVE, DT_ALGO_RING};
    dt_result res[8];
    char msg[700];
    int i, k;
    for (i = 0; i < 2; i++) {
        fault_init(&a, F_RETURN_ERROR, 1, algos[i], 1000);
                CHECK(run_fault(&a, 3, 10.0, res, msg, sizeof msg) == DT_ERR_NUMERIC);   /* the root cause, not DT_ERR_PEER */
        CHECK(strstr(msg, "became NaN") != NULL);
        CHECK(res[1] == DT_ERR_NUMERIC);
        check_others_failed(&a, 3, 1, BIT(DT_ERR_PEER), 3.0);
        for (k = 0; k < 3; k++) if (k != 1) { if (!(strstr(a.msg[k], "rank 1") && strstr(a.msg[k], "became NaN"))) printf("    rank %d: %s\n", k, a.msg[k]); CHECK(strstr(a.msg[k], "rank 1") && strstr(a.msg[k], "became NaN")); }
    }
}

/* rank 3 sleeps three timeouts: the others give up after about one, naming the operation, its number and
   the missing rank; the sleeper, when it comes, fails at once */
static void test_fault_rank_never_arrives(void) {
    static fault_arg a;
    static const dt_algo algos[] = {DT_ALGO_NATIVE, DT_ALGO_RING};
    dt_result res[8];
    char msg[700];
    double timeout = 0.5;
    int i, k, timeouts;
    for (i = 0; i < 2; i++) {
        fault_init(&a, F_LATE, 3, algos[i], 1000);
        a.late = 3 * timeout;
        CHECK(run_fault(&a, 4, timeout, res, msg, sizeof msg) == DT_ERR_TIMEOUT);
        CHECK(strstr(msg, "all-reduce #2") && strstr(msg, "3"));
        check_others_failed(&a, 4, 3, BIT(DT_ERR_TIMEOUT) | BIT(DT_ERR_PEER), timeout + 2.0);
        for (k = 0, timeouts = 0; k < 3; k++) {
            timeouts += a.res[k] == DT_ERR_TIMEOUT;
            if (!strstr(a.msg[k], "all-reduce #2") || !strstr(a.msg[k], "3 (at #1)"))
                printf("    rank %d: %s\n", k, a.msg[k]);
            CHECK(strstr(a.msg[k], "all-reduce #2") && strstr(a.msg[k], "3 (at #1)"));
            CHECK(a.elapsed[k] >= timeout * 0.9 || a.res[k] == DT_ERR_PEER);
        }
        CHECK(timeouts >= 1);
        if (!(res[3] == DT_ERR_PEER && a.elapsed[3] < 0.5)) printf("    rank 3 (late) %s %s, %.3f s: %s\n", dt_result_str(res[3]), dt_result_str(a.first[3]), a.elapsed[3], a.msg[3]);
        CHECK(res[3] == DT_ERR_PEER && a.elapsed[3] < 0.5);   /* the late rank learns at once */
    }
}

/* one rank calls with one element more, or calls another collective: DT_ERR_MISMATCH, not a wrong result */
static void test_fault_mismatch(void) {
    static fault_arg a;
    static const dt_algo algos[] = {DT_ALGO_NATIVE, DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NAIVE};
    static const size_t ns[] = {10, 100000};
    dt_result res[8];
    char msg[700];
    int i, j, m, k, mism;
    for (m = F_COUNT_PLUS_ONE; m <= F_OTHER_COLLECTIVE; m++)
        for (i = 0; i < 4; i++)
            for (j = 0; j < 2; j++) {
                fault_init(&a, m, 1, algos[i], ns[j]);
                CHECK(run_fault(&a, 4, 10.0, res, msg, sizeof msg) == DT_ERR_MISMATCH);
                check_others_failed(&a, 4, -1, BIT(DT_ERR_MISMATCH) | BIT(DT_ERR_PEER), 3.0);
                for (k = 0, mism = 0; k < 4; k++)
                    if (a.res[k] == DT_ERR_MISMATCH) {
                        mism++;
                        CHECK(strstr(a.msg[k], m == F_COUNT_PLUS_ONE ? (j ? "100001" : "11") : "broadcast") != NULL);
                    }
                CHECK(mism >= 1);
            }
}

static void test_fault_thread_exit(void) {
    static fault_arg a;
    dt_result res[8];
    char msg[700];
    int k;
    fault_init(&a, F_THREAD_EXIT, 2, DT_ALGO_RING, 1000);
    CHECK(run_fault(&a, 4, 10.0, res, msg, sizeof msg) == DT_ERR_STATE);
    CHECK(res[2] == DT_ERR_STATE && strstr(msg, "rank 2") && strstr(msg, "exited"));
    check_others_failed(&a, 4, 2, BIT(DT_ERR_PEER), 3.0);
    for (k = 0; k < 4; k++) if (k != 2) CHECK(strstr(a.msg[k], "rank 2") != NULL);
}

/* a message larger than the receive: DT_ERR_MISMATCH on both sides, with the sizes */
static void test_fault_message_too_big(void) {
    static fault_arg a;
    dt_result res[8];
    char msg[700];
    fault_init(&a, F_P2P_TOO_BIG, -1, DT_ALGO_AUTO, 50);
    CHECK(run_fault(&a, 3, 10.0, res, msg, sizeof msg) == DT_ERR_MISMATCH);
    CHECK(a.res[0] == DT_ERR_MISMATCH && a.res[1] == DT_ERR_MISMATCH && a.res[2] == DT_ERR_PEER);
    /* each side as it was: the receiver names the sender and its own size, the sender the receiver's */
    CHECK(strstr(a.msg[1], "rank 0 sent 200 bytes, more than the 196 this receive accepts") != NULL);
    CHECK(strstr(a.msg[0], "rank 1 accepts only 196 bytes and this message has 200") != NULL);
    check_others_failed(&a, 3, -1, BIT(DT_ERR_MISMATCH) | BIT(DT_ERR_PEER), 3.0);
}

/* all-to-all, natively and pairwise, and all-to-all-v: a rank that has returned, one that comes late, one
   that calls it with another count or calls another collective: every other rank fails in bounded time,
   naming it (all-to-all-v's sizes differ per block, so another count is seen in the bytes that came) */
static void test_fault_alltoall(void) {
    static fault_arg a;
    static const dt_algo algos[] = {DT_ALGO_NATIVE, DT_ALGO_RING, DT_ALGO_RING};
    dt_result res[8];
    char msg[700];
    int i, m, k, mism;
    for (i = 0; i < 3; i++) {
        const char *count_seen = i == 2 ? "bytes" : "1001", *name = i == 2 ? "all-to-all-v #2" : "all-to-all #2";
        fault_init(&a, F_RETURN_OK, 2, algos[i], 100);
        a.alltoall = 1 + (i == 2);
        CHECK(run_fault(&a, 4, 10.0, res, msg, sizeof msg) == DT_ERR_PEER);
        check_others_failed(&a, 4, 2, BIT(DT_ERR_PEER), 3.0);
        for (k = 0; k < 4; k++) if (k != 2) CHECK((strstr(a.msg[k], "rank 2 has finished") || strstr(a.msg[k], "2 (finished)")) && strstr(a.msg[k], name));
        fault_init(&a, F_LATE, 1, algos[i], 100);
        a.alltoall = 1 + (i == 2);
        a.late = 1.5;
        CHECK(run_fault(&a, 3, 0.5, res, msg, sizeof msg) == DT_ERR_TIMEOUT);
        CHECK(strstr(msg, name) != NULL);
        check_others_failed(&a, 3, 1, BIT(DT_ERR_TIMEOUT) | BIT(DT_ERR_PEER), 2.5);
        for (m = F_COUNT_PLUS_ONE; m <= F_OTHER_COLLECTIVE; m++) {
            fault_init(&a, m, 1, algos[i], 1000);
            a.alltoall = 1 + (i == 2);
            CHECK(run_fault(&a, 4, 10.0, res, msg, sizeof msg) == DT_ERR_MISMATCH);
            check_others_failed(&a, 4, -1, BIT(DT_ERR_MISMATCH) | BIT(DT_ERR_PEER), 3.0);
            for (k = 0, mism = 0; k < 4; k++)
                if (a.res[k] == DT_ERR_MISMATCH) {
                    mism++;
                    if (!strstr(a.msg[k], m == F_COUNT_PLUS_ONE ? count_seen : "broadcast")) printf("    rank %d: %s\n", k, a.msg[k]);
                    CHECK(strstr(a.msg[k], m == F_COUNT_PLUS_ONE ? count_seen : "broadcast") != NULL);
                }
            CHECK(mism >= 1);
        }
    }
}

/* ---- hierarchical all-reduce ---- */

/* the shared checks with ranks grouped into nodes (dt_comm_desc.node_size): 2 + 2, uneven nodes (2 + 2 + 1,
   3 + 2), one node (every rank its own: the local default, which the other checks run); HIER among every
   algorithm, and as the default */
static void test_hier_checks(void) {
    static const int ranks[] = {4, 5, 5, 4}, sizes[] = {2, 2, 3, 4};
    dt_comm_desc cd;
    int i;
    memset(&cd, 0, sizeof cd);
    for (i = 0; i < 4; i++) {
        cd.node_size = sizes[i];
        cd.algo = i % 2 ? DT_ALGO_HIER : DT_ALGO_AUTO;
        launch_checks(ranks[i], &cd, i == 0);
    }
}

typedef struct hier_arg { int node_size; float *f[8][3]; int64_t *l[8][2]; int nodes[8], node_of[8][8]; uint64_t sent[8], recv[8]; } hier_arg;
#define HIER_N 10007
/* rank r: random floats all-reduced by HIER, RING and NAIVE; integers by HIER and RING */
static dt_result hier_rank(dt_comm *c, void *arg) {
    hier_arg *a = (hier_arg *)arg;
    static const dt_algo fa[3] = {DT_ALGO_HIER, DT_ALGO_RING, DT_ALGO_NAIVE};
    int me = dt_comm_rank(c), j;
    dt_result r = DT_OK;
    dt_comm_stats st;
    a->nodes[me] = dt_comm_nodes(c, a->node_of[me]);
    for (j = 0; j < 3 && r == DT_OK; j++) {
        cc_fill(DT_F32, 5, me, a->f[me][j], 0, HIER_N);
        dt_comm_reset_stats(c);
        r = dt_comm_allreduce(c, a->f[me][j], HIER_N, DT_F32, j == 0 ? DT_MEAN : DT_SUM, fa[j]);
        st = dt_comm_get_stats(c);
        if (j == 0) { a->sent[me] = st.bytes_sent; a->recv[me] = st.bytes_recv; }
    }
    for (j = 0; j < 2 && r == DT_OK; j++) {
        cc_fill(DT_I64, 6, me, a->l[me][j], 0, HIER_N);
        r = dt_comm_allreduce(c, a->l[me][j], HIER_N, DT_I64, DT_SUM, fa[j]);
    }
    return r;
}
static void run_hier(hier_arg *a, int p, int node_size) {
    dt_launch_desc d;
    memset(&d, 0, sizeof d);
    d.ranks = p;
    d.comm.timeout = 30;
    d.comm.node_size = node_size;
    CHECK_OK(dt_launch_local(&d, hier_rank, a, NULL));
}
/* HIER against the flat algorithms: integer sums equal RING's in any grouping; float sums within rounding
   of it (MEAN: the sum divided by p); every rank its own node: RING's bits; one node: NAIVE's. The ranks
   agree on the grouping, and the bytes: a rank that is not its node's leader sends its data once and
   receives the result once. */
static void test_hier_equals_flat(void) {
    static hier_arg a;
    static const int ps[] = {4, 5, 5, 4, 4}, ns[] = {2, 2, 3, 1, 4};
    int i, k, j;
    for (k = 0; k < 8; k++) {
        for (j = 0; j < 3; j++) a.f[k][j] = (float *)malloc(HIER_N * 4);
        for (j = 0; j < 2; j++) a.l[k][j] = (int64_t *)malloc(HIER_N * 8);
    }
    for (i = 0; i < 5; i++) {
        int p = ps[i], ns_ = ns[i], nodes = (p + ns_ - 1) / ns_;
        size_t e, worst = 0;
        run_hier(&a, p, ns_);
        for (k = 0; k < p; k++) {
            CHECK(a.nodes[k] == nodes);
            for (j = 0; j < p; j++) CHECK(a.node_of[k][j] == j / ns_);
            CHECK(memcmp(a.l[k][0], a.l[k][1], HIER_N * 8) == 0);
            CHECK(memcmp(a.f[k][0], a.f[0][0], HIER_N * 4) == 0);   /* the same bits on every rank */
            for (e = 0; e < HIER_N; e++) {
                float want = a.f[k][1][e] / (float)p;
                if (fabsf(a.f[k][0][e] - want) > 1e-5f * (1 << 23) * p) worst++;
            }
            if (ns_ == 1) for (e = 0; e < HIER_N; e++) worst += a.f[k][0][e] != a.f[k][1][e] / (float)p;
            if (ns_ >= p) for (e = 0; e < HIER_N; e++) worst += a.f[k][0][e] != a.f[k][2][e] / (float)p;
            if (k % ns_) CHECK(a.sent[k] == HIER_N * 4 && a.recv[k] == HIER_N * 4);
        }
        if (worst) printf("    %d ranks as nodes of %d: %zu elements differ\n", p, ns_, worst);
        CHECK(worst == 0);
    }
    for (k = 0; k < 8; k++) {
        for (j = 0; j < 3; j++) free(a.f[k][j]);
        for (j = 0; j < 2; j++) free(a.l[k][j]);
    }
}

/* nodes: dt_comm_set_nodes numbers them by their lowest ranks; DT_NODE_SIZE and its refusal */
static void test_hier_nodes(void) {
    dt_comm *cs[6];
    dt_comm_desc cd;
    int map[6] = {7, 3, 7, 3, 9, 3}, got[6], k;
    CHECK_OK(dt_comm_create_local(cs, 6, NULL));
    if (!cs[0]) return;
    CHECK(dt_comm_nodes(cs[0], got) == 6 && got[5] == 5);   /* local ranks: every rank its own node */
    CHECK_OK(dt_comm_set_nodes(cs[0], map));
    CHECK(dt_comm_nodes(cs[0], got) == 3 && got[0] == 0 && got[1] == 1 && got[2] == 0 && got[3] == 1 && got[4] == 2 && got[5] == 1);
    CHECK_ERR(dt_comm_set_nodes(cs[0], NULL), DT_ERR_INVALID_ARG);
    CHECK(dt_comm_nodes(NULL, NULL) == 0);
    for (k = 0; k < 6; k++) dt_comm_destroy(cs[k]);
    dt_t_setenv("DT_NODE_SIZE", "4");
    CHECK_OK(dt_comm_create_local(cs, 6, NULL));
    if (cs[0]) {
        CHECK(dt_comm_get_desc(cs[0]).node_size == 4 && dt_comm_nodes(cs[0], got) == 2 && got[3] == 0 && got[4] == 1);
        for (k = 0; k < 6; k++) dt_comm_destroy(cs[k]);
    }
    memset(&cd, 0, sizeof cd);
    cd.node_size = 3;   /* declared: the variable is not read */
    CHECK_OK(dt_comm_create_local(cs, 6, &cd));
    if (cs[0]) {
        CHECK(dt_comm_nodes(cs[0], NULL) == 2);
        for (k = 0; k < 6; k++) dt_comm_destroy(cs[k]);
    }
    dt_t_setenv("DT_NODE_SIZE", "two");
    CHECK_ERR(dt_comm_create_local(cs, 2, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "DT_NODE_SIZE='two'") != NULL);
    dt_t_unsetenv("DT_NODE_SIZE");
    cd.node_size = -2;
    CHECK_ERR(dt_comm_create_local(cs, 2, &cd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "node_size") != NULL);
}

/* the link model with nodes of 2: a message inside a node does not use the link; ranks of a node share
   their node's port, so two sends out of one node queue behind each other; HIER crosses between nodes
   in the 2 (L - 1) steps of the leaders' ring */
typedef struct nlink_arg { int mode; double elapsed[4]; float *buf[4]; } nlink_arg;
static dt_result nlink_rank(dt_comm *c, void *arg) {
    nlink_arg *a = (nlink_arg *)arg;
    int me = dt_comm_rank(c);
    double t0;
    dt_result r;
    if ((r = dt_comm_barrier(c)) != DT_OK) return r;
    t0 = dt_time_now();
    if (a->mode == 0) {   /* 0 -> 1 inside node 0, 2 -> 1 from node 1 */
        if (me == 0 || me == 2) r = dt_comm_send(c, a->buf[me], 1000, DT_F32, 1, me);
        else if (me == 1) {
            if ((r = dt_comm_recv(c, a->buf[1], 1000, DT_F32, 0, 0, NULL)) == DT_OK) a->elapsed[0] = dt_time_now() - t0;
            if (r == DT_OK && (r = dt_comm_recv(c, a->buf[1], 1000, DT_F32, 2, 2, NULL)) == DT_OK) a->elapsed[1] = dt_time_now() - t0;
        }
    } else if (a->mode == 1) {   /* 0 -> 2 and 1 -> 3 at once: 400 kB each through node 0's one port */
        if (me < 2) r = dt_comm_send(c, a->buf[me], 100000, DT_F32, me + 2, 0);
        else r = dt_comm_recv(c, a->buf[me], 100000, DT_F32, me - 2, 0, NULL);
    } else r = dt_comm_allreduce(c, a->buf[me], 1000, DT_F32, DT_SUM, a->mode == 2 ? DT_ALGO_HIER : DT_ALGO_RING);
    if (a->mode != 0) a->elapsed[me] = dt_time_now() - t0;
    return r;
}
static void test_hier_link_model(void) {
    static nlink_arg a;
    dt_launch_desc d;
    double L = 0.25, slowest;
    int k, mode;
    for (k = 0; k < 4; k++) a.buf[k] = (float *)calloc(100000, 4);
    memset(&d, 0, sizeof d);
    d.ranks = 4;
    d.comm.timeout = 30;
    d.comm.node_size = 2;
    for (mode = 0; mode < 4; mode++) {
        a.mode = mode;
        d.comm.link_latency = mode == 1 ? 0 : mode == 0 ? L : L / 5;
        d.comm.link_bandwidth = mode == 1 ? 4e6 : 0;
        memset(a.elapsed, 0, sizeof a.elapsed);
        CHECK_OK(dt_launch_local(&d, nlink_rank, &a, NULL));
        for (k = 0, slowest = 0; k < 4; k++) if (a.elapsed[k] > slowest) slowest = a.elapsed[k];
        if (mode == 0) {
            if (!(a.elapsed[0] < L / 2 && a.elapsed[1] >= L * 0.95)) printf("    inside a node %.3f s, between nodes %.3f s\n", a.elapsed[0], a.elapsed[1]);
            CHECK(a.elapsed[0] < L / 2 && a.elapsed[1] >= L * 0.95);
        }
        if (mode == 1) CHECK(slowest >= 0.19);   /* 2 x 400 kB at 4 MB/s through one port, not 0.1 s each */
        if (mode == 2) CHECK(slowest >= 2 * (L / 5) * 0.95);   /* 2 nodes: 2 steps between them */
        /* the flat ring: of its 6 steps' hops, every other one crosses (1 -> 2, 3 -> 0), and a rank waits
           for its left neighbour only: the crossings of a chain of hops add up, 3 of them */
        if (mode == 3) CHECK(slowest >= 3 * (L / 5) * 0.95);
    }
    for (k = 0; k < 4; k++) free(a.buf[k]);
}

/* ---- the link model ---- */

typedef struct link_arg {
    dt_algo algo;
    size_t  n;
    int     p2p;
    double  start[8], elapsed[8];   /* elapsed: from the first rank's start, which every chain of messages follows */
    float  *out[8];
    uint64_t sent[8];   /* messages the rank sent in the timed call */
} link_arg;
static dt_result link_rank(dt_comm *c, void *arg) {
    link_arg *a = (link_arg *)arg;
    int me = dt_comm_rank(c);
    double t0;
    dt_result r;
    cc_fill(DT_F32, 11, me, a->out[me], 0, a->n);
    if ((r = dt_comm_barrier(c)) != DT_OK) return r;
    a->start[me] = t0 = dt_time_now();
    a->sent[me] = dt_comm_get_stats(c).messages_sent;
    if (a->p2p) {
        if (me == 0) r = dt_comm_send(c, a->out[0], a->n, DT_F32, 1, 0);
        else if (me == 1) r = dt_comm_recv(c, a->out[1], a->n, DT_F32, 0, 0, NULL);
    } else r = dt_comm_allreduce(c, a->out[me], a->n, DT_F32, DT_SUM, a->algo);
    a->elapsed[me] = dt_time_now() - t0;
    a->sent[me] = dt_comm_get_stats(c).messages_sent - a->sent[me];
    return r;
}
/* The lower bounds below hold from the first rank's start: a rank's own start may come late (a thread descheduled
   after the barrier on a busy machine), after the messages it waits for were sent. */
static void run_link(link_arg *a, int p, double latency, double bandwidth) {
    dt_launch_desc d;
    double first;
    int k;
    memset(&d, 0, sizeof d);
    d.ranks = p;
    d.comm.timeout = 30;
    d.comm.link_latency = latency;
    d.comm.link_bandwidth = bandwidth;
    CHECK_OK(dt_launch_local(&d, link_rank, a, NULL));
    for (k = 1, first = a->start[0]; k < p; k++) if (a->start[k] < first) first = a->start[k];
    for (k = 0; k < p; k++) a->elapsed[k] += a->start[k] - first;
}
/* The link model's ports (dt__link_reserve, in model seconds): on a ring of p ranks that each post their two
   sends (to i + 1, then to i - 1) at time 0, in rank order, every message has arrived by 2 t, as each port
   carries two messages; a lone message takes t; a receiver busy until 3 gets it at 4, while the sender's port
   is free again at t. Before, a message held the sender's port while it waited for a busy receiver: the ring's
   step took 4 t, and D-PSGD's ring on a slow network about twice its bytes' time. */
static void test_link_ports(void) {
    double out[8], in[8], last, a;
    int p, i, k;
    for (p = 3; p <= 8; p++) {
        for (i = 0; i < p; i++) out[i] = in[i] = 0.0;
        last = 0.0;
        for (i = 0; i < p; i++)
            for (k = 0; k < 2; k++) {
                a = dt__link_reserve(&out[i], &in[k ? (i + p - 1) % p : (i + 1) % p], 0.0, 1.0);
                if (a > last) last = a;
            }
        CHECK(last == 2.0);
        if (last != 2.0) printf("    ring of %d: the last message arrives at %g t\n", p, last);
    }
    out[0] = in[1] = 0.0;
    CHECK(dt__link_reserve(&out[0], &in[1], 5.0, 0.5) == 5.5 && out[0] == 5.5 && in[1] == 5.5);
    out[0] = 0.0; in[1] = 3.0;
    a = dt__link_reserve(&out[0], &in[1], 0.0, 1.0);
    CHECK(a == 4.0 && out[0] == 1.0 && in[1] == 4.0);
}

static void test_link_model(void) {
    static link_arg with, without;
    static const dt_algo algos[] = {DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NAIVE, DT_ALGO_NATIVE};
    double L = 0.02, slowest;
    int p = 4, i, k;
    for (k = 0; k < 8; k++) { with.out[k] = (float *)malloc(100000 * 4); without.out[k] = (float *)malloc(100000 * 4); }
    for (i = 0; i < 4; i++) {
        with.algo = without.algo = algos[i];
        with.n = without.n = 1000;
        with.p2p = without.p2p = 0;
        run_link(&with, p, L, 0);
        run_link(&without, p, 0, 0);
        for (k = 0, slowest = 0; k < p; k++) {
            if (with.elapsed[k] > slowest) slowest = with.elapsed[k];
            /* the same bits as without the link model (the native all-reduce runs as the ring or the tree under it) */
            if (algos[i] != DT_ALGO_NATIVE) CHECK(memcmp(with.out[k], without.out[k], 1000 * 4) == 0);
            /* lower bounds only: each of the ring's 2 (p - 1) steps waits for a message */
            if (algos[i] == DT_ALGO_RING) {
                if (!(with.elapsed[k] >= 2 * (p - 1) * L * 0.95)) printf("    %s rank %d: %.3f s\n", dt_algo_name(algos[i]), k, with.elapsed[k]);
                CHECK(with.elapsed[k] >= 2 * (p - 1) * L * 0.95);
            }
        }
        /* the last rank of the tree waits for 2 log2 p messages in a row, of naive for 2 */
        if (algos[i] == DT_ALGO_TREE) CHECK(slowest >= 4 * L * 0.95);
        /* native under the link model takes the cheaper by the model: for 4 kB and latency alone the tree
           (4 latencies against the ring's 6), whose sums it then has bit for bit */
        if (algos[i] == DT_ALGO_NATIVE) {
            static link_arg tree;
            for (k = 0; k < 8; k++) tree.out[k] = (float *)malloc(1000 * 4);
            tree.algo = DT_ALGO_TREE; tree.n = 1000; tree.p2p = 0;
            run_link(&tree, p, 0, 0);
            CHECK(slowest >= 4 * L * 0.95);
            for (k = 0; k < p; k++) CHECK(memcmp(with.out[k], tree.out[k], 1000 * 4) == 0 && with.sent[k] == tree.sent[k]);
            CHECK(with.sent[0] == 2);   /* the root of a binomial tree over 4 ranks sends to 2 children; a ring rank 6 times */
            for (k = 0; k < 8; k++) free(tree.out[k]);
        }
        if (algos[i] == DT_ALGO_NAIVE) CHECK(slowest >= 2 * L * 0.95);
    }
    /* bandwidth: 400 kB at 4 MB/s take at least 0.1 s */
    with.p2p = 1; with.n = 100000;
    run_link(&with, 2, 0, 4e6);
    CHECK(with.elapsed[1] >= 0.095);
    CHECK(cc_diff_gen(DT_F32, 11, 0, with.out[1], 0, 100000) == 100000);
    for (k = 0; k < 8; k++) { free(with.out[k]); free(without.out[k]); }
}

/* ---- the launcher ---- */

static void test_launch_parse(void) {
    char a0[] = "prog", a1[] = "--ranks", a2[] = "4", a3[] = "--lr", a4[] = "0.1", a5[] = "--algo", a6[] = "tree",
         a7[] = "--timeout", a8[] = "2.5", a9[] = "--link-latency", a10[] = "0.001", a11[] = "--link-bandwidth",
         a12[] = "10M", a13[] = "--threads-per-rank", a14[] = "2", a15[] = "--log-all-ranks", a16[] = "data.bin";
    char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, NULL};
    int argc = 17, i;
    dt_launch_desc d;
    memset(&d, 0, sizeof d);
    CHECK_OK(dt_launch_parse(&argc, argv, &d));
    CHECK(argc == 4 && strcmp(argv[0], "prog") == 0 && strcmp(argv[1], "--lr") == 0 && strcmp(argv[2], "0.1") == 0 &&
          strcmp(argv[3], "data.bin") == 0 && argv[4] == NULL);
    CHECK(d.ranks == 4 && d.comm.algo == DT_ALGO_TREE && d.comm.timeout == 2.5 && d.comm.link_latency == 0.001 &&
          d.comm.link_bandwidth == 10e6 && d.threads_per_rank == 2 && d.log_all_ranks == 1);
    {
        static const char *bad[][2] = {{"--ranks", "0"}, {"--ranks", "x"}, {"--ranks", "2.5"}, {"--ranks", "100000"},
                                       {"--algo", "foo"}, {"--timeout", "-1"}, {"--timeout", "0"}, {"--link-latency", "-0.1"},
                                       {"--link-bandwidth", "10Q"}, {"--threads-per-rank", "0"}, {"--ranks", NULL}, {"--algo", NULL},
                                       {"--ranks", "5e9"}, {"--threads-per-rank", "5e9"}, {"--trace-max-events", "1e15"},
                                       {"--node-size", "0"}, {"--node-size", "1.5"}, {"--node-size", "5e9"}};
        for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
            char b0[] = "prog", b1[32], b2[32];
            char *bv[4] = {b0, b1, b2, NULL};
            int bc = bad[i][1] ? 3 : 2;
            snprintf(b1, sizeof b1, "%s", bad[i][0]);
            snprintf(b2, sizeof b2, "%s", bad[i][1] ? bad[i][1] : "");
            if (!bad[i][1]) bv[2] = NULL;
            memset(&d, 0, sizeof d);
            CHECK_ERR(dt_launch_parse(&bc, bv, &d), DT_ERR_INVALID_ARG);
            if (bad[i][1]) CHECK(strstr(dt_last_error(), bad[i][1]) != NULL);
            CHECK(d.ranks == 0 && d.threads_per_rank == 0 && d.trace_max_events == 0);   /* a refused value is not kept */
        }
    }
    CHECK_ERR(dt_launch_parse(NULL, argv, &d), DT_ERR_INVALID_ARG);
    {   /* --node-size N: the ranks per node of DT_ALGO_HIER and the link model */
        char n0[] = "prog", n1[] = "--algo", n2[] = "hier", n3[] = "--node-size", n4[] = "3";
        char *nv[] = {n0, n1, n2, n3, n4, NULL};
        int nc = 5;
        memset(&d, 0, sizeof d);
        CHECK_OK(dt_launch_parse(&nc, nv, &d));
        CHECK(nc == 1 && d.comm.algo == DT_ALGO_HIER && d.comm.node_size == 3);
    }
    {
        dt_algo al = DT_ALGO_AUTO;
        for (i = 0; i < DT_ALGO_COUNT; i++) { CHECK_OK(dt_algo_parse(dt_algo_name((dt_algo)i), &al)); CHECK(al == (dt_algo)i); }
        CHECK_ERR(dt_algo_parse("rings", &al), DT_ERR_INVALID_ARG);
        CHECK(strcmp(dt_dtype_name(DT_I64), "i64") == 0 && dt_dtype_size(DT_F64) == 8 && dt_dtype_size(DT_U8) == 1 &&
              dt_dtype_size((dt_dtype)77) == 0);
    }
}

/* a log sink that keeps every line, from any thread */
typedef struct log_cap { pthread_mutex_t mu; int n; char lines[64][256]; int levels[64]; } log_cap;
static void capture(void *user, int level, const char *msg) {
    log_cap *l = (log_cap *)user;
    pthread_mutex_lock(&l->mu);
    if (l->n < 64) { snprintf(l->lines[l->n], sizeof l->lines[0], "%s", msg); l->levels[l->n] = level; l->n++; }
    pthread_mutex_unlock(&l->mu);
}
static int has_line(log_cap *l, const char *s) {
    int i;
    for (i = 0; i < l->n; i++) if (strcmp(l->lines[i], s) == 0) return 1;
    return 0;
}
/* A rank's thread has the stack of a main thread on every platform (dt__thread_start: at least 8 MiB), not a new
   thread's default (macOS: 512 KiB, musl: 128 KiB): 2 MiB of local arrays, touched from the top down as a call
   deeper down would, so a smaller stack meets its guard page */
static dt_result big_stack_rank(dt_comm *c, void *arg) {
    volatile unsigned char buf[2 << 20];
    size_t i;
    (void)arg;
    for (i = sizeof buf; i > 0; i -= 1024) buf[i - 1] = (unsigned char)(i >> 10);
    return buf[sizeof buf - 1] == (unsigned char)(sizeof buf >> 10) ? dt_comm_barrier(c) : DT_ERR_STATE;
}
static void test_rank_stack(void) {
    dt_launch_desc d;
    memset(&d, 0, sizeof d);
    d.ranks = 2;
    CHECK_OK(dt_launch(&d, big_stack_rank, NULL));
}

typedef struct launch_arg { int seen_rank[8]; int fail_rank; } launch_arg;
static dt_result launch_rank(dt_comm *c, void *arg) {
    launch_arg *a = (launch_arg *)arg;
    int me = dt_comm_rank(c);
    a->seen_rank[me] = dt_current_rank();
    dt_log(DT_LOG_INFO, "info from %d", me);
    dt_log(DT_LOG_WARN, "warning from %d", me);
    if (me == a->fail_rank) return dt_set_error(DT_ERR_IO, "rank %d could not read its shard", me);
    return dt_comm_barrier(c);
}
static void test_launch_and_log(void) {
    static log_cap cap;
    launch_arg a;
    dt_launch_desc d;
    dt_result res[8];
    int k, errors;
    pthread_mutex_init(&cap.mu, NULL);
    dt_log_configure(capture, &cap, DT_LOG_INFO);
    memset(&d, 0, sizeof d);
    memset(&a, 0, sizeof a);
    a.fail_rank = -1;
    d.ranks = 3;
    CHECK(dt_current_rank() == -1);
    CHECK(dt_launch(&d, launch_rank, &a) == DT_OK);
    for (k = 0; k < 3; k++) CHECK(a.seen_rank[k] == k);
    CHECK(dt_current_rank() == -1);
    /* rank 0's lines as they are; ranks > 0 only warnings, prefixed */
    CHECK(has_line(&cap, "info from 0") && has_line(&cap, "warning from 0") && has_line(&cap, "[rank 1] warning from 1") &&
          has_line(&cap, "[rank 2] warning from 2") && !has_line(&cap, "[rank 1] info from 1") && cap.n == 4);
    cap.n = 0;
    d.log_all_ranks = 1;
    CHECK(dt_launch(&d, launch_rank, &a) == DT_OK);
    CHECK(has_line(&cap, "[rank 1] info from 1") && has_line(&cap, "[rank 2] info from 2") && cap.n == 6);
    /* a failing rank: dt_launch returns the cause's result, with its message naming the rank, and logs it
       once; the others' DT_ERR_PEER, which only repeats it, is no error line */
    cap.n = 0;
    d.log_all_ranks = 0;
    a.fail_rank = 2;
    CHECK(dt_launch(&d, launch_rank, &a) == DT_ERR_IO && strstr(dt_last_error(), "could not read its shard"));
    for (k = 0, errors = 0; k < cap.n; k++) errors += cap.levels[k] == DT_LOG_ERROR;
    CHECK(errors == 1);
    for (k = 0; k < cap.n && cap.levels[k] != DT_LOG_ERROR; k++) {}
    CHECK(k < cap.n && strstr(cap.lines[k], "DT_ERR_IO: rank 2 could not read its shard"));
    CHECK(dt_launch_local(&d, launch_rank, &a, res) == DT_ERR_IO && strstr(dt_last_error(), "could not read its shard"));
    CHECK(res[2] == DT_ERR_IO && res[0] == DT_ERR_PEER && res[1] == DT_ERR_PEER);
    /* one rank (0 = 1) runs on the calling thread, on the self backend */
    d.ranks = 0;
    a.fail_rank = -1;
    CHECK(dt_launch(&d, launch_rank, &a) == DT_OK && a.seen_rank[0] == 0);
    CHECK_ERR(dt_launch_local(&d, NULL, &a, NULL), DT_ERR_INVALID_ARG);
    /* no rank can start (a bad $DT_COMM_TIMEOUT): dt_launch fails and logs why, naming the variable */
    cap.n = 0;
    d.ranks = 2;
    dt_t_setenv("DT_COMM_TIMEOUT", "abc");
    CHECK(dt_launch(&d, launch_rank, &a) == DT_ERR_INVALID_ARG);
    dt_t_unsetenv("DT_COMM_TIMEOUT");
    CHECK(cap.n == 1 && cap.levels[0] == DT_LOG_ERROR && strstr(cap.lines[0], "DT_COMM_TIMEOUT='abc'"));
    dt_log_configure(NULL, NULL, DT_LOG_INFO);
    pthread_mutex_destroy(&cap.mu);
}

/* ---- more ranks than cores ---- */

static dt_result many_rank(dt_comm *c, void *arg) {
    int i, me = dt_comm_rank(c);
    dt_result r = DT_OK;
    (void)arg;
    for (i = 0; i < 200 && r == DT_OK; i++) {
        float v[16];
        int k;
        for (k = 0; k < 16; k++) v[k] = (float)(me + k);
        r = dt_comm_allreduce(c, v, 16, DT_F32, DT_SUM, (dt_algo)(i % DT_ALGO_COUNT));
        if (r == DT_OK && v[3] != (float)(28 + 8 * 3)) r = dt_set_error(DT_ERR_NUMERIC, "rank %d: wrong sum %g", me, v[3]);
    }
    return r;
}
static void test_more_ranks_than_cores(void) {
    dt_launch_desc d;
    memset(&d, 0, sizeof d);
    d.ranks = 8;
    d.comm.timeout = 60;
    CHECK_OK(dt_launch_local(&d, many_rank, NULL, NULL));
}

/* dt_request is 20 words of the caller's memory holding the library's dt__req (the build fails when it
   outgrows them: tests/run.sh checks that it does); dt_request_received counts elements of the type posted. */
static void test_request_storage(void) {
    dt_comm *c = NULL;
    dt_request qs, qr, none;
    double out[5] = {1, 2, 3, 4, 5}, in[8];
    int done = 0;
    CHECK(sizeof(dt_request) == 20 * sizeof(uint64_t) && sizeof(dt__req) <= sizeof(dt_request));
    CHECK(sizeof(dt_message) < sizeof(dt__req));
    CHECK_OK(dt_comm_create_self(&c, NULL));
    if (!c) return;
    memset(&none, 0, sizeof none);   /* zeroed: "none", complete at once */
    CHECK_OK(dt_comm_wait(c, &none));
    CHECK_OK(dt_comm_test(c, &none, &done));
    CHECK(done == 1 && dt_request_received(&none) == 0);
    CHECK_OK(dt_comm_irecv(c, in, 8, DT_F64, 0, 3, &qr));
    CHECK_OK(dt_comm_isend(c, out, 5, DT_F64, 0, 3, &qs));
    CHECK_OK(dt_comm_wait(c, &qr));
    CHECK_OK(dt_comm_wait(c, &qs));
    CHECK(dt_request_received(&qr) == 5 && dt_request_received(&qs) == 0 && memcmp(in, out, sizeof out) == 0);
    dt_comm_destroy(c);
}

/* The backend interface as the local backend answers it, and dt_comm_create_backend's checks. */
static dt_result backend_rank(dt_comm *c, void *arg) {
    float x[3] = {1, 2, 3};
    char what[128];
    int *bad = (int *)arg, me = dt_comm_rank(c), tag;
    const dt_comm_backend *b = dt_comm_backend_table(c);
    if (!b || strcmp(b->name, "local") != 0 || !dt_comm_impl(c) || dt_comm_seq(c) != 0 || dt_comm_broken(c) != DT_OK) bad[me]++;
    if (dt_comm_barrier(c) != DT_OK || dt_comm_allreduce(c, x, 3, DT_F32, DT_SUM, DT_ALGO_RING) != DT_OK) bad[me]++;
    dt_comm_describe(c, what, sizeof what);
    if (dt_comm_seq(c) != 2 || strcmp(what, "all-reduce #2 (3 x f32, sum, ring)") != 0) bad[me]++;
    tag = dt_comm_coll_tag(c);
    if (dt_comm_tag_seq(tag) != 2 || dt_comm_tag_seq(tag ^ 1) != 2 || dt_comm_tag_seq(0) != -1 || dt_comm_tag_seq(DT_TAG_USER_MAX) != -1) bad[me]++;
    if (dt_comm_signature(c) == 0) bad[me]++;
    return DT_OK;
}
static void test_backend_interface(void) {
    static const dt_comm_backend none = {"none", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    dt_launch_desc d;
    dt_comm *c, *cs[2];
    int bad[3] = {0, 0, 0};
    memset(&d, 0, sizeof d);
    d.ranks = 3;
    CHECK_OK(dt_launch_local(&d, backend_rank, bad, NULL));
    CHECK(bad[0] == 0 && bad[1] == 0 && bad[2] == 0);
    CHECK_OK(dt_comm_create_local(cs, 2, NULL));
    if (!cs[0]) return;
    c = cs[0];   /* a failed create sets it to NULL */
    CHECK_ERR(dt_comm_create_backend(&c, &none, NULL, 0, 1, 1 << 30, NULL), DT_ERR_INVALID_ARG);   /* no isend, ... */
    CHECK(c == NULL);
    CHECK_ERR(dt_comm_create_backend(&c, dt_comm_backend_table(cs[0]), NULL, 2, 2, 1 << 30, NULL), DT_ERR_INVALID_ARG);   /* rank 2 of 2 */
    CHECK_ERR(dt_comm_create_backend(&c, dt_comm_backend_table(cs[0]), NULL, 0, 2, 32767, NULL), DT_ERR_UNSUPPORTED);   /* no room for collectives */
    CHECK(strstr(dt_last_error(), "dt_comm_create_local") != NULL && c == NULL);
    CHECK(dt_comm_impl(NULL) == NULL && dt_comm_backend_table(NULL) == NULL && dt_comm_broken(NULL) == DT_OK);
    /* the library's own point-to-point tags lie between the user's and the collectives', and each side
       refuses the other's */
    CHECK(DT__TAG_DDP == DT_TAG_USER_MAX + 1 && DT__TAG_TRACE < DT__TAG_LIB_END && DT__TAG_LIB_END <= DT__TAG_COLL);
    CHECK(dt_comm_tag_seq(DT__TAG_DDP) == -1 && dt_comm_tag_seq(DT__TAG_LIB_END - 1) == -1 && dt_comm_tag_seq(DT__TAG_COLL) == 0);
    CHECK_ERR(dt_comm_send(cs[0], &d, 1, DT_U8, 1, DT__TAG_DDP), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt__lib_send(cs[0], &d, 1, DT_U8, 1, DT_TAG_USER_MAX), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt__lib_send(cs[0], &d, 1, DT_U8, 1, DT__TAG_LIB_END), DT_ERR_INVALID_ARG);
    dt_comm_destroy(cs[0]);
    dt_comm_destroy(cs[1]);
}

int main(int argc, char **argv) {
    const char *q = getenv("DT_TEST_QUICK");
    quick = q && *q && strcmp(q, "0") != 0;
    if (argc > 1) dt_t_only = argv[1];
    RUN(test_launch_parse);
    RUN(test_launch_and_log);
    RUN(test_rank_stack);
    RUN(test_self_and_own_threads);
    RUN(test_request_storage);
    RUN(test_backend_interface);
    RUN(test_checks_1_to_8_ranks);
    RUN(test_checks_small_segments);
    RUN(test_checks_default_algo);
    RUN(test_determinism);
    RUN(test_fault_rank_returns_early);
    RUN(test_fault_rank_returns_error);
    RUN(test_fault_rank_never_arrives);
    RUN(test_fault_mismatch);
    RUN(test_fault_thread_exit);
    RUN(test_fault_message_too_big);
    RUN(test_fault_alltoall);
    RUN(test_hier_checks);
    RUN(test_hier_equals_flat);
    RUN(test_hier_nodes);
    RUN(test_hier_link_model);
    RUN(test_link_ports);
    RUN(test_link_model);
    RUN(test_more_ranks_than_cores);
    return dt_t_summary();
}
