/* test_comm_mpi.c - the communicator over MPI, started by mpiexec (tests/run.sh runs it with -n 2, 3, 4):
     mpicc -DDT_USE_MPI (make MPI=1), then mpiexec -n 4 build-mpi/tests/mpi/test_comm_mpi [name-filter]
   Every rank can compute every rank's input, so each checks its results against a serial reference;
   the data of those checks are multiples of 1/4, whose sums are exact in any order. With random data,
   rank 0 also runs the same algorithms on local ranks (threads) and every rank compares the bits.
   Fault tests use fresh communicators: a mismatch, a rank that stops, a rank that leaves with an error.
   Rank 0 prints one line per test (failed checks summed over the ranks) and "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#include "../../dtrain.h"
#include "../dt_test.h"
#include "../comm_checks.h"
#include "mpi_test.h"
#ifndef DT_USE_MPI
#error "build this test with MPI: mpicc -DDT_USE_MPI (make MPI=1)"
#endif

#define BIG 1000003                     /* not divisible by 2, 3 or 4 */
static const size_t counts[] = {0, 1, 7, 1000};
static const dt_algo algos[] = {DT_ALGO_NAIVE, DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NATIVE, DT_ALGO_HIER};
static const dt_dtype types[] = {DT_F32, DT_F64, DT_I32, DT_I64};
static const dt_reduce_op ops[] = {DT_SUM, DT_MEAN, DT_MAX, DT_MIN};
#define N_OF(a) (sizeof(a) / sizeof(a[0]))

static dt_comm *W;                      /* the communicator dt_launch made */
static int me, np;
static dt_comm_desc Wdesc;

/* ---- data: element i of rank k's input ---- */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* exact: an integer in [-1000, 1000], divided by 4 for floating-point types; else a random float with
   an exponent spread over 2^-8 .. 2^8, whose sums round differently in every order */
static double value(dt_dtype t, int k, size_t i, int salt, int exact) {
    uint64_t h = mix(((uint64_t)(unsigned)salt << 48) ^ ((uint64_t)(unsigned)k << 40) ^ (uint64_t)i);
    double v = (double)(int)(h % 2001) - 1000.0;
    if (t == DT_I32 || t == DT_I64) return v;
    if (exact) return v * 0.25;
    return ((double)(h >> 11) * (1.0 / 9007199254740992.0) - 0.5) * ldexp(1.0, (int)((h >> 3) % 17) - 8);
}
static void put(void *b, dt_dtype t, size_t i, double v) {
    switch (t) {
    case DT_F32: ((float *)b)[i] = (float)v; break;
    case DT_F64: ((double *)b)[i] = v; break;
    case DT_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    default: ((uint8_t *)b)[i] = (uint8_t)v; break;
    }
}
static void fill(void *b, dt_dtype t, size_t n, int k, int salt, int exact) {
    size_t i;
    for (i = 0; i < n; i++) put(b, t, i, value(t, k, i, salt, exact));
}
/* The reduction of every rank's exact input (sums are exact, so any order gives these bits); MEAN
   divides in the element type, as the library does. */
static void reference(void *out, dt_dtype t, dt_reduce_op op, size_t n, int salt) {
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        double a = value(t, 0, i, salt, 1);
        for (k = 1; k < np; k++) {
            double v = value(t, k, i, salt, 1);
            a = op == DT_MAX ? (v > a ? v : a) : op == DT_MIN ? (v < a ? v : a) : a + v;
        }
        if (op == DT_MEAN && t == DT_F32) a = (double)((float)a / (float)np);
        else if (op == DT_MEAN) a = a / (double)np;
        put(out, t, i, a);
    }
}
static void *xalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { printf("out of memory\n"); exit(2); }
    return p;
}

/* ---- point-to-point ---- */
static void test_sendrecv(void) {
    static const size_t ns[] = {0, 1, 7, 1000, BIG};
    int right = (me + 1) % np, left = (me + np - 1) % np;
    size_t j;
    for (j = 0; j < N_OF(ns); j++) {
        size_t n = ns[j], got = 99;
        float *s = (float *)xalloc(n * 4), *r = (float *)xalloc((n + 3) * 4), *ref = (float *)xalloc(n * 4);
        dt_request qs, qr;
        int done_s = 0, done_r = 0;
        double until;
        fill(s, DT_F32, n, me, 1, 1);
        fill(ref, DT_F32, n, left, 1, 1);
        /* blocking: even ranks send first, odd ranks receive first (a ring of 2 and more) */
        if (me % 2 == 0) {
            CHECK_OK(dt_comm_send(W, s, n, DT_F32, right, 5));
            CHECK_OK(dt_comm_recv(W, r, n + 3, DT_F32, left, 5, &got));
        } else {
            CHECK_OK(dt_comm_recv(W, r, n + 3, DT_F32, left, 5, &got));
            CHECK_OK(dt_comm_send(W, s, n, DT_F32, right, 5));
        }
        CHECK(got == n);
        CHECK(n == 0 || memcmp(r, ref, n * 4) == 0);
        /* non-blocking, completed by dt_comm_test */
        memset(r, 0, (n + 3) * 4);
        CHECK_OK(dt_comm_irecv(W, r, n, DT_F32, left, DT_TAG_USER_MAX, &qr));
        CHECK_OK(dt_comm_isend(W, s, n, DT_F32, right, DT_TAG_USER_MAX, &qs));
        until = dt_time_now() + 30;
        while ((!done_s || !done_r) && dt_time_now() < until) {
            if (!done_r) CHECK_OK(dt_comm_test(W, &qr, &done_r));
            if (!done_s) CHECK_OK(dt_comm_test(W, &qs, &done_s));
            mt_nap(1e-5);
        }
        CHECK(done_s && done_r);
        CHECK(n == 0 || memcmp(r, ref, n * 4) == 0);
        CHECK_OK(dt_comm_wait(W, &qr));   /* completed: a no-op */
        free(s); free(r); free(ref);
    }
    {   /* tags keep messages apart: two sent in one order are received in the other */
        int32_t a = me * 10 + 1, b = me * 10 + 2, x = 0, y = 0;
        dt_request q[4];
        CHECK_OK(dt_comm_isend(W, &a, 1, DT_I32, right, 1, &q[0]));
        CHECK_OK(dt_comm_isend(W, &b, 1, DT_I32, right, 2, &q[1]));
        CHECK_OK(dt_comm_irecv(W, &y, 1, DT_I32, left, 2, &q[2]));
        CHECK_OK(dt_comm_irecv(W, &x, 1, DT_I32, left, 1, &q[3]));
        CHECK_OK(dt_comm_waitall(W, q, 4));
        CHECK(x == left * 10 + 1 && y == left * 10 + 2);
    }
    {   /* a message longer than the receive: DT_ERR_MISMATCH (on a communicator of its own: it breaks) */
        dt_comm *c;
        int32_t big[8] = {0}, small[4];
        CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &Wdesc));
        if (me == 0) CHECK_OK(dt_comm_send(c, big, 8, DT_I32, 1, 3));
        if (me == 1) CHECK_ERR(dt_comm_recv(c, small, 4, DT_I32, 0, 3, NULL), DT_ERR_MISMATCH);
        dt_comm_destroy(c);
    }
    CHECK_ERR(dt_comm_send(W, NULL, 0, DT_F32, right, DT_TAG_USER_MAX + 1), DT_ERR_INVALID_ARG);
    CHECK(strcmp(dt_comm_backend_name(W), "mpi") == 0);
    CHECK(dt_comm_size(W) == np && dt_comm_rank(W) == me);
}

/* ---- collectives against the serial reference ---- */
static const char *opname(dt_reduce_op op) { static const char *n[] = {"sum", "mean", "max", "min"}; return n[op]; }
static void differs(const char *what, dt_algo a, dt_dtype t, int op, size_t n) {
    dt_t_checks_failed++;
    printf("    rank %d: %s differs from the reference: %s %s %s n=%zu\n", me, what, dt_algo_name(a), dt_dtype_name(t),
           op >= 0 ? opname((dt_reduce_op)op) : "-", n);
}
static void check_allreduce(dt_comm *c, dt_algo a, dt_dtype t, dt_reduce_op op, size_t n, int salt) {
    size_t es = dt_dtype_size(t);
    void *b = xalloc(n * es), *ref = xalloc(n * es);
    fill(b, t, n, me, salt, 1);
    reference(ref, t, op, n, salt);
    CHECK_OK(dt_comm_allreduce(c, b, n, t, op, a));
    if (n && memcmp(b, ref, n * es) != 0) differs("all-reduce", a, t, (int)op, n);
    free(b); free(ref);
}
static void test_allreduce(void) {
    size_t ai, ti, oi, ni;
    int salt = 10;
    for (ai = 0; ai < N_OF(algos); ai++)
        for (ti = 0; ti < N_OF(types); ti++)
            for (oi = 0; oi < N_OF(ops); oi++) {
                if (ops[oi] == DT_MEAN && (types[ti] == DT_I32 || types[ti] == DT_I64)) continue;
                for (ni = 0; ni < N_OF(counts); ni++) check_allreduce(W, algos[ai], types[ti], ops[oi], counts[ni], salt++);
            }
}
static void test_allreduce_big(void) {   /* BIG elements, and several MiB of f64 */
    size_t ai;
    for (ai = 0; ai < N_OF(algos); ai++) {
        check_allreduce(W, algos[ai], DT_F32, DT_SUM, BIG, 100);
        check_allreduce(W, algos[ai], DT_F64, DT_MEAN, BIG, 101);
        check_allreduce(W, algos[ai], DT_I32, DT_MAX, BIG, 102);
        check_allreduce(W, algos[ai], DT_I64, DT_MIN, BIG, 103);
    }
}
static void test_reduce(void) {
    static const size_t ns[] = {0, 1, 7, 1000, BIG};
    size_t ai, ni, ti;
    int salt = 200;
    for (ai = 0; ai < N_OF(algos); ai++)
        for (ti = 0; ti < N_OF(types); ti++)
            for (ni = 0; ni < N_OF(ns); ni++) {
                dt_dtype t = types[ti];
                dt_reduce_op op = ops[(ni + ti) % N_OF(ops)] == DT_MEAN && (t == DT_I32 || t == DT_I64) ? DT_SUM : ops[(ni + ti) % N_OF(ops)];
                size_t n = ns[ni], es = dt_dtype_size(t);
                int root = (int)(ni + ai) % np;
                void *b = xalloc(n * es), *ref = xalloc(n * es);
                fill(b, t, n, me, salt, 1);
                if (me == root) reference(ref, t, op, n, salt);
                else memcpy(ref, b, n * es);   /* the others' buffers stay as they were */
                CHECK_OK(dt_comm_reduce(W, b, n, t, op, root, algos[ai]));
                if (n && memcmp(b, ref, n * es) != 0) differs("reduce", algos[ai], t, (int)op, n);
                free(b); free(ref);
                salt++;
            }
}
static void test_broadcast(void) {
    static const size_t ns[] = {0, 1, 7, 1000, BIG};
    size_t ai, ni;
    int salt = 300;
    for (ai = 0; ai < N_OF(algos); ai++)
        for (ni = 0; ni < N_OF(ns); ni++) {
            dt_dtype t = types[(ai + ni) % N_OF(types)];
            size_t n = ns[ni], es = dt_dtype_size(t);
            int root = (int)(ni + ai + 1) % np;
            void *b = xalloc(n * es), *ref = xalloc(n * es);
            fill(b, t, n, me, salt, 1);
            fill(ref, t, n, root, salt, 1);
            CHECK_OK(dt_comm_broadcast(W, b, n, t, root, algos[ai]));
            if (n && memcmp(b, ref, n * es) != 0) differs("broadcast", algos[ai], t, -1, n);
            free(b); free(ref);
            salt++;
        }
}
static void test_barrier(void) {
    size_t ai;
    for (ai = 0; ai < N_OF(algos); ai++) {   /* the barrier uses the communicator's default algorithm */
        dt_comm_desc d = Wdesc;
        dt_comm *c;
        int i;
        d.algo = algos[ai];
        CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &d));
        for (i = 0; i < 2; i++) {
            int late = (int)(ai + (size_t)i) % np;
            double t0;
            CHECK_OK(dt_comm_barrier(c));
            t0 = dt_time_now();
            if (me == late) mt_nap(0.3);   /* a late rank: nobody may leave before it arrives */
            CHECK_OK(dt_comm_barrier(c));
            CHECK(dt_time_now() - t0 > 0.25);
        }
        dt_comm_destroy(c);
    }
}
/* scatter, gather, allgather, reduce_scatter with counts per rank (so BIG / np elements in all) */
static void test_data_movement(void) {
    static const size_t ns[] = {0, 1, 7, 1000, BIG / 4};
    size_t ni;
    int salt = 400;
    for (ni = 0; ni < N_OF(ns); ni++, salt += 4) {
        dt_dtype t = types[ni % N_OF(types)];
        size_t n = ns[ni], es = dt_dtype_size(t), all = n * (size_t)np;
        int root = (int)ni % np, k;
        char *send = (char *)xalloc(all * es), *recv = (char *)xalloc(all * es), *ref = (char *)xalloc(all * es);
        /* scatter: root's send[np * n], block k to rank k */
        fill(send, t, all, root, salt, 1);
        CHECK_OK(dt_comm_scatter(W, me == root ? send : NULL, recv, n, t, root));
        if (n && memcmp(recv, send + (size_t)me * n * es, n * es) != 0) differs("scatter", DT_ALGO_NAIVE, t, -1, n);
        /* gather: each rank's n to root's recv[k * n] */
        fill(send, t, n, me, salt + 1, 1);
        for (k = 0; k < np; k++) fill(ref + (size_t)k * n * es, t, n, k, salt + 1, 1);
        CHECK_OK(dt_comm_gather(W, send, me == root ? recv : NULL, n, t, root));
        if (me == root && n && memcmp(recv, ref, all * es) != 0) differs("gather", DT_ALGO_NAIVE, t, -1, n);
        /* allgather: the same on every rank */
        memset(recv, 0, all * es);
        CHECK_OK(dt_comm_allgather(W, send, recv, n, t));
        if (n && memcmp(recv, ref, all * es) != 0) differs("all-gather", DT_ALGO_RING, t, -1, n);
        /* reduce_scatter: block me of the sum of everyone's send[np * n] */
        fill(send, t, all, me, salt + 2, 1);
        reference(ref, t, DT_SUM, all, salt + 2);
        CHECK_OK(dt_comm_reduce_scatter(W, send, recv, n, t, DT_SUM));
        if (n && memcmp(recv, ref + (size_t)me * n * es, n * es) != 0) differs("reduce-scatter", DT_ALGO_RING, t, DT_SUM, n);
        free(send); free(recv); free(ref);
    }
}
/* neighbour exchange on a ring: to the right and the left, from the left and the right */
static void test_neighbors(void) {
    static const size_t ns[] = {0, 1, 1000, BIG};
    size_t ni;
    for (ni = 0; ni < N_OF(ns); ni++) {
        size_t n = ns[ni];
        int right = (me + 1) % np, left = (me + np - 1) % np, to[2], from[2];
        double *send = (double *)xalloc(n * 8), *recv = (double *)xalloc(2 * n * 8), *ref = (double *)xalloc(2 * n * 8);
        to[0] = right; to[1] = left; from[0] = left; from[1] = right;
        fill(send, DT_F64, n, me, 500 + (int)ni, 1);
        fill(ref, DT_F64, n, left, 500 + (int)ni, 1);
        fill(ref + n, DT_F64, n, right, 500 + (int)ni, 1);
        dt_neighbors both = {to, 2, from, 2};
        CHECK_OK(dt_comm_neighbor_exchange(W, send, recv, n, DT_F64, &both));
        if (n && memcmp(recv, ref, 2 * n * 8) != 0) differs("neighbour exchange", DT_ALGO_NAIVE, DT_F64, -1, n);
        free(send); free(recv); free(ref);
    }
}

/* ---- the same bits as local ranks ---- */
typedef struct bit_job { dt_algo algo; dt_dtype t; dt_reduce_op op; size_t n; int salt, reduce, node_size; void **out; } bit_job;
static dt_result bit_rank(dt_comm *c, void *arg) {   /* one local rank: random input, then the collective */
    bit_job *j = (bit_job *)arg;
    int r = dt_comm_rank(c);
    fill(j->out[r], j->t, j->n, r, j->salt, 0);
    if (j->reduce) return dt_comm_reduce(c, j->out[r], j->n, j->t, j->op, dt_comm_size(c) - 1, j->algo);
    return dt_comm_allreduce(c, j->out[r], j->n, j->t, j->op, j->algo);
}
/* Runs j on np local ranks (threads) in this process, grouped into nodes as j->node_size says; outs[k]
   gets rank k's result (allocated here). */
static void bit_local(bit_job *j, void **outs, size_t es) {
    dt_launch_desc d;
    int k;
    memset(&d, 0, sizeof d);
    d.ranks = np;
    d.threads_per_rank = 1;
    d.comm = Wdesc;
    d.comm.node_size = j->node_size;
    for (k = 0; k < np; k++) outs[k] = xalloc(j->n * es);
    j->out = outs;
    CHECK_OK(dt_launch_local(&d, bit_rank, j, NULL));
}
static void test_bits(void) {
    static const dt_algo a3[] = {DT_ALGO_NAIVE, DT_ALGO_RING, DT_ALGO_TREE};
    static const size_t ns[] = {7, 1000, BIG};
    size_t ai, ni;
    int tt, oo, red, salt = 600, k;
    for (ai = 0; ai < N_OF(a3); ai++)
        for (ni = 0; ni < N_OF(ns); ni++)
            for (tt = 0; tt < 2; tt++)
                for (oo = 0; oo < 2; oo++)
                    for (red = 0; red < 2; red++, salt++) {
                        bit_job j;
                        size_t es;
                        void *mine, *loc, *outs[64];
                        int root = np - 1;
                        j.algo = a3[ai]; j.t = tt ? DT_F64 : DT_F32; j.op = oo ? DT_MEAN : DT_SUM; j.n = ns[ni]; j.salt = salt; j.reduce = red;
                        j.node_size = 0;
                        es = dt_dtype_size(j.t);
                        mine = xalloc(j.n * es);
                        fill(mine, j.t, j.n, me, salt, 0);
                        if (red) CHECK_OK(dt_comm_reduce(W, mine, j.n, j.t, j.op, root, j.algo));
                        else CHECK_OK(dt_comm_allreduce(W, mine, j.n, j.t, j.op, j.algo));
                        if (me == 0) {   /* the same on np local ranks (threads) inside this process */
                            bit_local(&j, outs, es);
                            for (k = 1; k < np && !red; k++) CHECK(memcmp(outs[k], outs[0], j.n * es) == 0);
                            loc = outs[red ? root : 0];
                            for (k = 0; k < np; k++) if (outs[k] != loc) free(outs[k]);
                        } else loc = xalloc(j.n * es);
                        CHECK_OK(dt_comm_broadcast(W, loc, j.n, j.t, 0, DT_ALGO_NATIVE));   /* a byte copy */
                        if ((!red || me == root) && memcmp(mine, loc, j.n * es) != 0) {
                            dt_t_checks_failed++;
                            printf("    rank %d: %s %s %s %s n=%zu: MPI and local ranks differ\n", me, red ? "reduce" : "all-reduce",
                                   dt_algo_name(j.algo), dt_dtype_name(j.t), opname(j.op), j.n);
                        }
                        free(mine); free(loc);
                    }
}

/* ---- all-to-all and the hierarchical all-reduce ---- */

/* all-to-all, pairwise (default algorithm RING) and MPI's own (NATIVE): block k of rank me's send holds
   its elements k n ..; block k of what it receives must be rank k's elements me n .. */
static void test_alltoall(void) {
    static const dt_algo as[] = {DT_ALGO_RING, DT_ALGO_NATIVE};
    static const size_t ns[] = {0, 1, 7, 1000, BIG / 4};
    size_t ai, ni;
    for (ai = 0; ai < N_OF(as); ai++) {
        dt_comm_desc d = Wdesc;
        dt_comm *c = NULL;
        d.algo = as[ai];
        CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &d));
        if (!c) return;
        for (ni = 0; ni < N_OF(ns); ni++) {
            dt_dtype t = types[(ai + ni) % N_OF(types)];
            size_t n = ns[ni], es = dt_dtype_size(t), all = n * (size_t)np;
            char *send = (char *)xalloc(all * es), *recv = (char *)xalloc(all * es), *ref = (char *)xalloc(all * es);
            dt_comm_stats st;
            int k;
            fill(send, t, all, me, 700 + (int)ni, 1);
            for (k = 0; k < np; k++) {
                char *tmp = (char *)xalloc(all * es);
                fill(tmp, t, all, k, 700 + (int)ni, 1);
                memcpy(ref + (size_t)k * n * es, tmp + (size_t)me * n * es, n * es);
                free(tmp);
            }
            dt_comm_reset_stats(c);
            CHECK_OK(dt_comm_alltoall(c, send, recv, n, t));
            st = dt_comm_get_stats(c);
            if (n && memcmp(recv, ref, all * es) != 0) differs("all-to-all", as[ai], t, -1, n);
            CHECK(st.bytes_sent == (uint64_t)(np - 1) * n * es && st.collectives == 1);
            free(send); free(recv); free(ref);
        }
        dt_comm_destroy(c);
    }
}

/* the hierarchical all-reduce with the nodes MPI reports (the ranks that share memory) and with declared
   nodes of 2 and of 3 (uneven when they do not divide np): exact sums against the reference; random
   floats with the bits of as many local ranks grouped alike */
static void test_hier(void) {
    static const int sizes[] = {0, 2, 3};
    size_t si, ni;
    for (si = 0; si < N_OF(sizes); si++) {
        dt_comm_desc d = Wdesc;
        dt_comm *c = NULL;
        int node_of[64], nodes, k, same = 0, local = 0;
        d.node_size = sizes[si];
        CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &d));
        if (!c) return;
        nodes = dt_comm_nodes(c, node_of);
        for (k = 0; k < np; k++) same += node_of[k] == node_of[me];
        if (sizes[si] == 0) {   /* MPI's grouping: as many in this node as share its memory */
            MPI_Comm shm;
            CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &shm) == MPI_SUCCESS);
            MPI_Comm_size(shm, &local);
            MPI_Comm_free(&shm);
            CHECK(same == local && node_of[0] == 0);
        } else {
            CHECK(nodes == (np + sizes[si] - 1) / sizes[si]);
            for (k = 0; k < np; k++) CHECK(node_of[k] == k / sizes[si]);
        }
        check_allreduce(c, DT_ALGO_HIER, DT_F32, DT_SUM, 1000, 800 + (int)si);
        check_allreduce(c, DT_ALGO_HIER, DT_F64, DT_MEAN, BIG, 810 + (int)si);
        check_allreduce(c, DT_ALGO_HIER, DT_I64, DT_MAX, 7, 820 + (int)si);
        for (ni = 0; ni < 2 && (sizes[si] > 0 || nodes == 1); ni++) {
            bit_job j;
            void *mine, *outs[64];
            j.algo = DT_ALGO_HIER; j.t = DT_F32; j.op = ni ? DT_MEAN : DT_SUM; j.n = ni ? BIG : 1000; j.salt = 830 + (int)ni;
            j.reduce = 0; j.node_size = sizes[si] ? sizes[si] : np;
            mine = xalloc(j.n * 4);
            fill(mine, DT_F32, j.n, me, j.salt, 0);
            CHECK_OK(dt_comm_allreduce(c, mine, j.n, DT_F32, j.op, DT_ALGO_HIER));
            if (me == 0) {   /* the same on np local ranks (threads) inside this process */
                bit_local(&j, outs, 4);
                for (k = 1; k < np; k++) free(outs[k]);
            } else outs[0] = xalloc(j.n * 4);
            CHECK_OK(dt_comm_broadcast(W, outs[0], j.n, DT_F32, 0, DT_ALGO_NATIVE));   /* a byte copy */
            if (memcmp(mine, outs[0], j.n * 4) != 0) {
                dt_t_checks_failed++;
                printf("    rank %d: hier %s n=%zu, nodes of %d: MPI and local ranks differ\n", me, opname(j.op), j.n, j.node_size);
            }
            free(mine); free(outs[0]);
        }
        dt_comm_destroy(c);
    }
    {   /* DT_NODE_SIZE declares them when dt_comm_desc.node_size is 0, as on local ranks */
        dt_comm_desc d = Wdesc;
        dt_comm *c = NULL;
        int node_of[64], k;
        d.node_size = 0;
        setenv("DT_NODE_SIZE", "2", 1);
        CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &d));
        unsetenv("DT_NODE_SIZE");
        if (!c) return;
        CHECK(dt_comm_get_desc(c).node_size == 2 && dt_comm_nodes(c, node_of) == (np + 1) / 2);
        for (k = 0; k < np; k++) CHECK(node_of[k] == k / 2);
        check_allreduce(c, DT_ALGO_HIER, DT_F32, DT_MEAN, 1000, 840);
        dt_comm_destroy(c);
    }
}

/* ---- faults: each on a fresh communicator, which the failure breaks ---- */
static dt_comm *fresh(double timeout, dt_algo a) {
    dt_comm_desc d = Wdesc;
    dt_comm *c = NULL;
    d.timeout = timeout;
    d.algo = a;
    CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &d));
    return c;
}
/* the last rank calls all-reduce with one element more (or, order = 1, rank 0 calls a broadcast first):
   every rank fails promptly with DT_ERR_MISMATCH, or DT_ERR_PEER from a rank that saw it */
static void mismatch_case(dt_algo a, int order) {
    dt_comm *c = fresh(10, a);
    static float buf[1001];   /* static: MPI may still own it after the failure (see dtrain_mpi.h) */
    size_t n = 1000 + (!order && me == np - 1);
    double t0 = dt_time_now(), el;
    dt_result r;
    if (!c) return;
    if (order && me == 0) r = dt_comm_broadcast(c, buf, n, DT_F32, 0, DT_ALGO_AUTO);
    else r = dt_comm_allreduce(c, buf, n, DT_F32, DT_SUM, DT_ALGO_AUTO);
    if (r == DT_OK && order && me == 0)   /* a root's sends complete without the receiver: it learns at its next wait */
        r = dt_comm_barrier(c);
    el = dt_time_now() - t0;
    if (r != DT_ERR_MISMATCH && r != DT_ERR_PEER) {
        dt_t_checks_failed++;
        printf("    rank %d: %s%s: %s, expected DT_ERR_MISMATCH or DT_ERR_PEER: %s\n", me, dt_algo_name(a), order ? " (order)" : "",
               dt_result_str(r), dt_last_error());
    }
    CHECK(strstr(dt_last_error(), "#1 (") != NULL || strstr(dt_last_error(), "#2 (") != NULL);
    if (a == DT_ALGO_NATIVE && !order) CHECK(r == DT_ERR_MISMATCH);   /* the signature check: every rank sees it */
    CHECK(el < 9.0);
    CHECK(mt_sum_ranks(r == DT_ERR_MISMATCH) >= 1);
    CHECK(dt_comm_barrier(c) == r);   /* broken: every later call returns the same */
    dt_comm_destroy(c);
}
/* the last rank calls all-to-all (v set: all-to-all-v) with one element more per block (pairwise or MPI's
   own): every rank fails promptly with DT_ERR_MISMATCH, or DT_ERR_PEER from a rank that saw it */
static void alltoall_mismatch_case(dt_algo a, int v) {
    dt_comm *c = fresh(10, a);
    static float send[64 * 101], recv[64 * 101];   /* static: MPI may still own them after the failure */
    size_t n = 100 + (me == np - 1), counts[64], displs[64];
    double t0 = dt_time_now();
    dt_result r;
    int k;
    if (!c) return;
    for (k = 0; k < np; k++) { counts[k] = n; displs[k] = (size_t)k * n; }
    if (v) r = dt_comm_alltoallv(c, send, counts, displs, recv, counts, displs, DT_F32);
    else r = dt_comm_alltoall(c, send, recv, n, DT_F32);
    if (r != DT_ERR_MISMATCH && r != DT_ERR_PEER) {
        dt_t_checks_failed++;
        printf("    rank %d: all-to-all %s: %s, expected DT_ERR_MISMATCH or DT_ERR_PEER: %s\n", me, dt_algo_name(a), dt_result_str(r), dt_last_error());
    }
    CHECK(strstr(dt_last_error(), v ? "all-to-all-v #1" : "all-to-all #1") != NULL || strstr(dt_last_error(), "#1 (") != NULL);
    CHECK(dt_time_now() - t0 < 9.0);
    CHECK(mt_sum_ranks(r == DT_ERR_MISMATCH) >= 1);
    CHECK(dt_comm_barrier(c) == r);
    dt_comm_destroy(c);
}
static void test_fault_mismatch(void) {
    size_t ai;
    alltoall_mismatch_case(DT_ALGO_RING, 0);
    alltoall_mismatch_case(DT_ALGO_NATIVE, 0);
    alltoall_mismatch_case(DT_ALGO_AUTO, 1);
    for (ai = 0; ai < N_OF(algos); ai++) mismatch_case(algos[ai], 0);
    mismatch_case(DT_ALGO_RING, 1);
    mismatch_case(DT_ALGO_NATIVE, 1);
}
/* the last rank stops for 3 timeouts: the others fail within about a timeout, naming the collective */
static void test_fault_stall(void) {
    static const dt_algo as[] = {DT_ALGO_RING, DT_ALGO_NATIVE};
    size_t ai;
    for (ai = 0; ai < N_OF(as); ai++) {
        dt_comm *c = fresh(1.0, as[ai]);
        static float buf[1000];   /* static: MPI may still own it after the failure (see dtrain_mpi.h) */
        double t0, el;
        dt_result r;
        if (!c) return;
        if (me == np - 1) mt_nap(3.0);
        t0 = dt_time_now();
        r = dt_comm_allreduce(c, buf, 1000, DT_F32, DT_SUM, DT_ALGO_AUTO);
        el = dt_time_now() - t0;
        if (me != np - 1) {
            CHECK(r == DT_ERR_TIMEOUT || r == DT_ERR_PEER);
            CHECK(el < 2.5);
        } else CHECK(r == DT_ERR_PEER && el < 1.0);   /* the others' notices were waiting for it */
        CHECK(strstr(dt_last_error(), "all-reduce #1 (1000 x f32") != NULL);
        if (r == DT_ERR_TIMEOUT) CHECK(strstr(dt_last_error(), "within 1 s") != NULL);
        CHECK(mt_sum_ranks(r == DT_ERR_TIMEOUT) >= 1);
        if (me == 0 && dt_t_checks_failed) printf("    rank 0: %s\n", dt_last_error());
        dt_comm_destroy(c);
    }
}
/* rank 1 leaves with an error of its own: the others' next wait fails at once, with its message */
static void test_fault_leave(void) {
    dt_comm *c = fresh(30, DT_ALGO_RING);
    static float buf[100];
    if (!c) return;
    if (me == 1) dt_comm_leave(c, DT_ERR_IO, "cannot read shard 7");
    else {
        double t0 = dt_time_now();
        CHECK_ERR(dt_comm_allreduce(c, buf, 100, DT_F32, DT_SUM, DT_ALGO_AUTO), DT_ERR_PEER);
        CHECK(strstr(dt_last_error(), "rank 1 has failed (DT_ERR_IO): cannot read shard 7") != NULL);
        CHECK(dt_time_now() - t0 < 5.0);
    }
    dt_comm_destroy(c);
}
/* rank 0 sends 100 floats where rank 1 receives at most 99: rank 1's report names rank 0 as the sender and
   its own size as the receive's (MPI completes the send without the receiver, so rank 0 learns it at its
   next wait, from rank 1's notice) */
static void test_fault_p2p_too_big(void) {
    dt_comm *c = fresh(10, DT_ALGO_RING);
    static float buf[100];   /* static: MPI may still own it after the failure (see dtrain_mpi.h) */
    dt_result r = DT_OK;
    if (!c) return;
    if (me == 0) r = dt_comm_send(c, buf, 100, DT_F32, 1, 5);
    else if (me == 1) {
        CHECK_ERR(dt_comm_recv(c, buf, 99, DT_F32, 0, 5, NULL), DT_ERR_MISMATCH);
        CHECK(strstr(dt_last_error(), "rank 0 sent more than the 396 bytes this receive accepts") != NULL);
        if (dt_t_checks_failed) printf("    rank 1: %s\n", dt_last_error());
    }
    if (me == 0 && r == DT_OK) CHECK(dt_comm_barrier(c) == DT_ERR_PEER && strstr(dt_last_error(), "this receive accepts") != NULL);
    dt_comm_destroy(c);
}
static void test_errors(void) {
    dt_comm *c = NULL;
    CHECK_ERR(dt_comm_create_mpi(&c, MPI_COMM_NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK(c == NULL);
    c = fresh(5, DT_ALGO_AUTO);
    if (c && me == 0) {   /* one MPI message carries at most INT_MAX bytes */
        char b[1];
        CHECK_ERR(dt_comm_isend(c, b, (size_t)INT_MAX + 1, DT_U8, 1, 0, NULL), DT_ERR_INVALID_ARG);
        {
            dt_request q;
            CHECK_ERR(dt_comm_isend(c, b, (size_t)INT_MAX + 1, DT_U8, 1, 0, &q), DT_ERR_UNSUPPORTED);
        }
    }
    dt_comm_destroy(c);
    {   /* a segment larger than an MPI message */
        dt_comm_desc d = Wdesc;
        d.segment_bytes = (size_t)INT_MAX + 1;
        CHECK_ERR(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &d), DT_ERR_INVALID_ARG);
    }
    CHECK(dt_comm_mpi_handle(W) != MPI_COMM_NULL && dt_comm_mpi_handle(NULL) == MPI_COMM_NULL);
}

/* the backend-independent checks the local tests run too (tests/comm_checks.h), here on MPI */
static void test_shared_checks(void) {
    static comm_checks_arg a;
    a.seed = 7;
    a.big = 0;
    if (comm_checks_run(W, &a) != DT_OK) dt_t_checks_failed++;
    dt_t_checks_failed += a.failures[me];
}

static dt_result rank_main(dt_comm *c, void *arg) {
    (void)arg;
    W = c;
    me = dt_comm_rank(c);
    np = dt_comm_size(c);
    if (strcmp(dt_comm_backend_name(c), "mpi") != 0 || np < 2 || np > 64)
        return dt_set_error(DT_ERR_STATE, "start this test with mpiexec -n 2 (up to 64), not alone");
    if (mt_begin(me) != DT_OK) return DT_ERR_COMM;
    if (me == 0) printf("%d MPI ranks, segments of %zu bytes\n", np, Wdesc.segment_bytes);
    mt_run("sendrecv", test_sendrecv);
    mt_run("barrier", test_barrier);
    mt_run("allreduce", test_allreduce);
    mt_run("allreduce_big", test_allreduce_big);
    mt_run("reduce", test_reduce);
    mt_run("broadcast", test_broadcast);
    mt_run("data_movement", test_data_movement);
    mt_run("neighbors", test_neighbors);
    mt_run("alltoall", test_alltoall);
    mt_run("hier", test_hier);
    mt_run("bits", test_bits);
    mt_run("errors", test_errors);
    mt_run("shared_checks", test_shared_checks);
    mt_run("fault_mismatch", test_fault_mismatch);
    mt_run("fault_stall", test_fault_stall);
    mt_run("fault_leave", test_fault_leave);
    mt_run("fault_p2p_too_big", test_fault_p2p_too_big);
    return mt_end();
}

int main(int argc, char **argv) {
    return mt_main(argc, argv, 4096, 120, &Wdesc, rank_main);   /* many segments: the ring's pipeline at work */
}
