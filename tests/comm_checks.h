/* comm_checks.h - the communicator's checks that hold on every backend: one rank function,
   comm_checks_run, that runs every primitive (point-to-point, every collective with every algorithm, op
   and type) and compares each result with a serial reference. Every rank can compute every rank's input
   from (rank, index, seed), so each rank checks its own result alone, with no extra communication.
   Float sums are compared bit for bit against a reference that reduces in the algorithm's documented
   order (NAIVE and the local NATIVE: rank order; RING: around the ring; TREE: the binomial tree; HIER:
   rank order in each node, then around the ring of the nodes, as dt_comm_nodes groups them); only a
   NATIVE sum on another backend (MPI_Allreduce, whose order is its own) is compared with a tolerance.
   Include after dtrain.h (with its implementation) and with _POSIX_C_SOURCE defined (nanosleep).
   Usage: comm_checks_arg a = {seed, big}; every rank runs comm_checks_run(comm, &a), then
   a.failures[rank] holds that rank's failed checks (0 = all passed). */
#ifndef COMM_CHECKS_H
#define COMM_CHECKS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <limits.h>
#include <sched.h>   /* sched_yield */

#define CC_MAX_RANKS 256

typedef struct comm_checks_arg {
    uint64_t seed;
    int      big;                          /* 1: also the million-element and multi-MiB cases */
    int      failures[CC_MAX_RANKS];       /* out: failed checks per rank (each rank writes its own) */
} comm_checks_arg;

/* one rank's state: its communicator and its failures */
typedef struct cc_rank {
    dt_comm *c;
    int      rank, p, fails;
    uint64_t seed;
} cc_rank;

#define CC_CHECK(x, cond) do { if (!(cond)) { (x)->fails++; \
    printf("    rank %d: check failed at %s:%d: %s\n", (x)->rank, __FILE__, __LINE__, #cond); } } while (0)
/* a call that must succeed; on failure the rank stops (the others then fail with DT_ERR_PEER, not hang) */
#define CC_OK(x, expr) do { dt_result r_ = (expr); if (r_ != DT_OK) { (x)->fails++; \
    printf("    rank %d: %s:%d: %s returned %s: %s\n", (x)->rank, __FILE__, __LINE__, #expr, dt_result_str(r_), dt_last_error()); \
    return r_; } } while (0)
/* a call that must fail with code and a message of some substance, leaving the communicator usable */
#define CC_ERR(x, expr, code) do { dt_result r_ = (expr); if (r_ != (code) || strlen(dt_last_error()) < 30) { (x)->fails++; \
    printf("    rank %d: %s:%d: %s returned %s (\"%s\"), expected %s with a message\n", (x)->rank, __FILE__, __LINE__, \
           #expr, dt_result_str(r_), dt_last_error(), #code); } } while (0)

static void cc_sleep(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0) {}
}

/* ---- inputs: a pure function of (seed, rank, index) ---- */

typedef union cc_val { float f; double d; int32_t i; int64_t l; uint8_t u; } cc_val;

static uint64_t cc_mix(uint64_t z) {   /* splitmix64's finaliser */
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* The key of rank r's input. */
static uint64_t cc_key(uint64_t seed, int r) { return cc_mix(seed * 1000003u + (uint64_t)r); }
/* Element i of the input with key k (rank r's: cc_key(seed, r)). Floats span 32 binary orders of
   magnitude, so the order of a sum shows in its bits; integers stay small enough that sums of 256 ranks
   do not overflow; u8 sums wrap, as in C. */
static cc_val cc_gen(dt_dtype t, uint64_t k, size_t i) {
    uint64_t h = cc_mix(k ^ (uint64_t)i);
    double scale = (double)(1u << (h >> 59)) / 256.0;   /* 2^-8 .. 2^23 */
    cc_val v;
    memset(&v, 0, sizeof v);
    switch (t) {
    case DT_F32: v.f = (float)((double)((int32_t)(h & 0xffffff) - 0x800000) / 8388608.0 * scale); break;
    case DT_F64: v.d = (double)((int64_t)(h & 0xfffffffffffffull) - 0x8000000000000ll) / 4503599627370496.0 * scale; break;
    case DT_I32: v.i = (int32_t)(h % 2000001u) - 1000000; break;
    case DT_I64: v.l = (int64_t)(h >> 24) - ((int64_t)1 << 39); break;
    default: v.u = (uint8_t)(h >> 17); break;
    }
    return v;
}
static void cc_fill(dt_dtype t, uint64_t seed, int r, void *buf, size_t off, size_t n) {
    size_t es = dt_dtype_size(t), i;
    uint64_t k = cc_key(seed, r);
    for (i = 0; i < n; i++) { cc_val v = cc_gen(t, k, off + i); memcpy((char *)buf + i * es, &v, es); }
}
/* the same bits: a and b hold es (1, 4 or 8) bytes */
static int cc_same(const void *a, const void *b, size_t es) {
    uint64_t x = 0, y = 0;
    memcpy(&x, a, es);
    memcpy(&y, b, es);
    return x == y;
}
/* buf[i] == rank r's element off + i, for i < n; the index of the first difference, or n */
static size_t cc_diff_gen(dt_dtype t, uint64_t seed, int r, const void *buf, size_t off, size_t n) {
    size_t es = dt_dtype_size(t), i;
    uint64_t k = cc_key(seed, r);
    for (i = 0; i < n; i++) { cc_val v = cc_gen(t, k, off + i); if (!cc_same((const char *)buf + i * es, &v, es)) return i; }
    return n;
}
static void *cc_alloc(size_t bytes) {
    void *p = malloc(bytes + 16);
    if (!p) { fprintf(stderr, "comm_checks: out of memory\n"); abort(); }
    memset(p, 0xa5, bytes + 16);
    return p;
}

/* ---- the serial reference ---- */

/* d (op) s exactly as the library computes it: the same expression and operand order */
static cc_val cc_apply(dt_dtype t, dt_reduce_op op, cc_val d, cc_val s) {
#define CC_OP(F, T) d.F = (op == DT_SUM || op == DT_MEAN) ? (T)(d.F + s.F) : op == DT_MAX ? (s.F > d.F ? s.F : d.F) : (s.F < d.F ? s.F : d.F)
    switch (t) {
    case DT_F32: CC_OP(f, float); break;
    case DT_F64: CC_OP(d, double); break;
    case DT_I32: CC_OP(i, int32_t); break;
    case DT_I64: CC_OP(l, int64_t); break;
    default: CC_OP(u, uint8_t); break;
    }
#undef CC_OP
    return d;
}
/* The chunk of element i when n elements are split over p ranks as the ring splits them. */
static int cc_chunk_of(size_t i, size_t n, int p) {
    size_t q = n / (size_t)p, rem = n % (size_t)p;
    return i < rem * (q + 1) ? (int)(i / (q + 1)) : (int)(rem + (i - rem * (q + 1)) / q);
}
/* Element i (of n) of the reduction of every rank's input in the order of algo (NAIVE: rank order,
   the local NATIVE's too; RING: chunk k starts at rank k + 1 and each rank adds its own value to what
   arrives; TREE: the binomial tree rooted at root; HIER: each node's ranks in rank order, then the ring
   over the nodes; node[p] numbers the nodes 0 .. nodes - 1), divided by p for MEAN. keys: the ranks'
   cc_key; x: 2 p values of scratch. */
static cc_val cc_ref(dt_dtype t, dt_reduce_op op, dt_algo algo, int p, int root, const uint64_t *keys, size_t i, size_t n, cc_val *x,
                     const int *node, int nodes) {
    cc_val acc;
    int k, j, mask;
    for (k = 0; k < p; k++) x[k] = cc_gen(t, keys[k], i);
    if (algo == DT_ALGO_RING) {
        int ch = cc_chunk_of(i, n, p);
        acc = x[(ch + 1) % p];
        for (j = 2; j <= p; j++) acc = cc_apply(t, op, x[(ch + j) % p], acc);
    } else if (algo == DT_ALGO_TREE) {   /* x[v] is virtual rank v's partial: rank (v + root) mod p */
        cc_val *y = x + p;
        for (k = 0; k < p; k++) y[k] = x[(k + root) % p];
        for (mask = 1; mask < p; mask <<= 1)
            for (k = 0; k + mask < p; k += 2 * mask) y[k] = cc_apply(t, op, y[k], y[k + mask]);
        acc = y[0];
    } else if (algo == DT_ALGO_HIER) {   /* y[j]: node j's sum, from its lowest rank up */
        cc_val *y = x + p;
        int ch = cc_chunk_of(i, n, nodes);
        for (j = 0; j < nodes; j++) {
            for (k = 0; node[k] != j; k++) {}
            for (y[j] = x[k++]; k < p; k++)
                if (node[k] == j) y[j] = cc_apply(t, op, y[j], x[k]);
        }
        acc = y[(ch + 1) % nodes];
        for (j = 2; j <= nodes; j++) acc = cc_apply(t, op, y[(ch + j) % nodes], acc);
    } else {
        acc = x[0];
        for (k = 1; k < p; k++) acc = cc_apply(t, op, acc, x[k]);
    }
    if (op == DT_MEAN && t == DT_F32) acc.f = acc.f / (float)p;
    if (op == DT_MEAN && t == DT_F64) acc.d = acc.d / (double)p;
    return acc;
}
/* What algo means for an all-reduce (native = 1) or a reduce (native = 0) on this communicator: the
   tests' own reading of the rule, which dt_comm_algo must agree with (cc_algo_query). */
static dt_algo cc_resolve(const dt_comm *c, dt_algo a, int native) {
    int has = native && dt_comm_backend_table(c)->allreduce != NULL;
    if (a == DT_ALGO_AUTO) a = dt_comm_get_desc(c).algo;
    if (a == DT_ALGO_AUTO) a = has ? DT_ALGO_NATIVE : DT_ALGO_RING;
    if (a == DT_ALGO_NATIVE && !has) a = DT_ALGO_RING;
    if (a == DT_ALGO_HIER && !native) a = DT_ALGO_RING;   /* reduce runs HIER as RING */
    return a;
}
typedef struct cc_want {    /* what a reduced buffer should hold */
    const char  *what;
    dt_dtype     t;
    dt_reduce_op op;
    dt_algo      algo;
    int          root, exact;
    size_t       base, n, ntot;    /* buf[i] is element base + i of ntot */
    uint64_t    *keys;
    cc_val      *x;
    int         *node, nodes;      /* HIER: each rank's node */
} cc_want;
/* Checks buf[i]; prints and returns 1 when it is wrong. */
static int cc_check_at(cc_rank *x, const cc_want *w, const void *buf, size_t i) {
    size_t es = dt_dtype_size(w->t);
    dt_dtype t = w->t;
    cc_val want = cc_ref(t, w->op, w->algo, x->p, w->root, w->keys, w->base + i, w->ntot, w->x, w->node, w->nodes), got;
    memset(&got, 0, sizeof got);
    memcpy(&got, (const char *)buf + i * es, es);
    if (w->exact ? cc_same(&got, &want, es)
                 : fabs((t == DT_F32 ? got.f : got.d) - (t == DT_F32 ? want.f : want.d)) <= (t == DT_F32 ? 1e-5 : 1e-13) * x->p * (1 << 23))
        return 0;
    x->fails++;
    printf("    rank %d: %s (%zu x %s, %s, %s, root %d, %d ranks, %s): element %zu is %.17g, expected %.17g\n",
           x->rank, w->what, w->n, dt_dtype_name(t), w->op == DT_SUM ? "sum" : w->op == DT_MEAN ? "mean" : w->op == DT_MAX ? "max" : "min",
           dt_algo_name(w->algo), w->root, x->p, w->exact ? "bit for bit" : "within tolerance", w->base + i,
           t == DT_F32 ? got.f : t == DT_F64 ? got.d : t == DT_I32 ? got.i : t == DT_I64 ? (double)got.l : got.u,
           t == DT_F32 ? want.f : t == DT_F64 ? want.d : t == DT_I32 ? want.i : t == DT_I64 ? (double)want.l : want.u);
    return 1;
}
/* Compares buf[0..n) with the reduction of elements base + i of a total of ntot. Exact unless a
   floating-point sum was made in an order we do not know (NATIVE outside the local backends). Large
   results are checked on a sample: the ends, both sides of every ring chunk boundary, and every 61st
   element (61 is prime: every residue of the chunk and segment sizes comes up). */
static void cc_check_reduced(cc_rank *x, const char *what, const void *buf, size_t base, size_t n, size_t ntot,
                             dt_dtype t, dt_reduce_op op, dt_algo algo, int root) {
    const char *be = dt_comm_backend_name(x->c);
    int isfloat = t == DT_F32 || t == DT_F64, sum = op == DT_SUM || op == DT_MEAN, k, bad = 0;
    size_t i, edge = n > 65536 ? 2048 : n;
    cc_want w;
    w.what = what; w.t = t; w.op = op; w.algo = algo; w.root = root;
    w.exact = !(isfloat && sum && algo == DT_ALGO_NATIVE && strcmp(be, "local") != 0 && strcmp(be, "self") != 0);
    w.base = base; w.n = n; w.ntot = ntot;
    w.keys = (uint64_t *)cc_alloc((size_t)x->p * sizeof(uint64_t));
    w.x = (cc_val *)cc_alloc(2 * (size_t)x->p * sizeof(cc_val));
    w.node = (int *)cc_alloc((size_t)x->p * sizeof(int));
    w.nodes = dt_comm_nodes(x->c, w.node);
    for (k = 0; k < x->p; k++) w.keys[k] = cc_key(x->seed, k);
    for (i = 0; !bad && i < edge; i++) bad = cc_check_at(x, &w, buf, i);
    if (edge < n) {
        for (i = n - edge; !bad && i < n; i++) bad = cc_check_at(x, &w, buf, i);
        for (i = 0; !bad && i < n; i += 61) bad = cc_check_at(x, &w, buf, i);
        for (k = 1; !bad && k < x->p; k++) {   /* ring chunk k starts at global element b */
            size_t b = (size_t)k * (ntot / (size_t)x->p) + ((size_t)k < ntot % (size_t)x->p ? (size_t)k : ntot % (size_t)x->p);
            for (i = b >= base + 4 ? b - base - 4 : 0; !bad && i < n && i + base < b + 4; i++) bad = cc_check_at(x, &w, buf, i);
        }
    }
    free(w.keys);
    free(w.x);
    free(w.node);
}

/* ---- collectives ---- */

static dt_result cc_allreduce(cc_rank *x, dt_dtype t, dt_reduce_op op, dt_algo algo, size_t n) {
    void *buf = cc_alloc(n * dt_dtype_size(t));
    dt_result r;
    cc_fill(t, x->seed, x->rank, buf, 0, n);
    r = dt_comm_allreduce(x->c, buf, n, t, op, algo);
    if (r == DT_OK) cc_check_reduced(x, "all-reduce", buf, 0, n, n, t, op, cc_resolve(x->c, algo, 1), 0);
    free(buf);
    CC_OK(x, r);
    return DT_OK;
}

static dt_result cc_reduce(cc_rank *x, dt_dtype t, dt_reduce_op op, dt_algo algo, int root, size_t n) {
    void *buf = cc_alloc(n * dt_dtype_size(t));
    dt_result r;
    cc_fill(t, x->seed, x->rank, buf, 0, n);
    r = dt_comm_reduce(x->c, buf, n, t, op, root, algo);
    if (r == DT_OK && x->rank == root) cc_check_reduced(x, "reduce", buf, 0, n, n, t, op, cc_resolve(x->c, algo, 0), root);
    if (r == DT_OK && x->rank != root) CC_CHECK(x, cc_diff_gen(t, x->seed, x->rank, buf, 0, n) == n);   /* left unchanged */
    free(buf);
    CC_OK(x, r);
    return DT_OK;
}

static dt_result cc_broadcast(cc_rank *x, dt_dtype t, dt_algo algo, int root, size_t n) {
    void *buf = cc_alloc(n * dt_dtype_size(t));
    dt_result r;
    cc_fill(t, x->seed ^ 77, x->rank, buf, 0, n);   /* every rank starts with something else */
    r = dt_comm_broadcast(x->c, buf, n, t, root, algo);
    if (r == DT_OK && cc_diff_gen(t, x->seed ^ 77, root, buf, 0, n) != n) {
        x->fails++;
        printf("    rank %d: broadcast of %zu x %s from %d (%s) differs at %zu\n", x->rank, n, dt_dtype_name(t), root,
               dt_algo_name(algo), cc_diff_gen(t, x->seed ^ 77, root, buf, 0, n));
    }
    free(buf);
    CC_OK(x, r);
    return DT_OK;
}

/* scatter, gather, all-gather and reduce-scatter of n elements per rank */
static dt_result cc_placement(cc_rank *x, dt_dtype t, int root, size_t n) {
    size_t es = dt_dtype_size(t), pn = n * (size_t)x->p;
    char *big = (char *)cc_alloc(pn * es), *one = (char *)cc_alloc(n * es);
    int k, me = x->rank;
    dt_result r;
    /* scatter: root's element k n + i goes to rank k */
    if (me == root) cc_fill(t, x->seed, root, big, 0, pn);
    r = dt_comm_scatter(x->c, me == root ? big : NULL, one, n, t, root);
    if (r == DT_OK) CC_CHECK(x, cc_diff_gen(t, x->seed, root, one, (size_t)me * n, n) == n);
    /* gather: rank k's n elements land at k n on root; the others give no receive buffer */
    if (r == DT_OK) {
        cc_fill(t, x->seed, me, one, 0, n);
        r = dt_comm_gather(x->c, one, me == root ? big : NULL, n, t, root);
        for (k = 0; r == DT_OK && me == root && k < x->p; k++) CC_CHECK(x, cc_diff_gen(t, x->seed, k, big + (size_t)k * n * es, 0, n) == n);
    }
    /* all-gather: the same on every rank */
    if (r == DT_OK) {
        memset(big, 0x5a, pn * es);
        r = dt_comm_allgather(x->c, one, big, n, t);
        for (k = 0; r == DT_OK && k < x->p; k++) CC_CHECK(x, cc_diff_gen(t, x->seed, k, big + (size_t)k * n * es, 0, n) == n);
    }
    /* reduce-scatter: rank k gets block k of the sum over ranks, reduced around the ring */
    if (r == DT_OK && t != DT_U8) {
        dt_reduce_op op = (t == DT_F32 || t == DT_F64) ? DT_MEAN : DT_SUM;
        cc_fill(t, x->seed, me, big, 0, pn);
        r = dt_comm_reduce_scatter(x->c, big, one, n, t, op);
        if (r == DT_OK) cc_check_reduced(x, "reduce-scatter", one, (size_t)me * n, n, pn, t, op, DT_ALGO_RING, 0);
        if (r == DT_OK) CC_CHECK(x, cc_diff_gen(t, x->seed, me, big, 0, pn) == pn);   /* send is not touched */
        if (r == DT_OK) r = dt_comm_reduce_scatter(x->c, big, one, n, t, DT_MAX);
        if (r == DT_OK) cc_check_reduced(x, "reduce-scatter", one, (size_t)me * n, n, pn, t, DT_MAX, DT_ALGO_RING, 0);
    }
    free(big);
    free(one);
    CC_OK(x, r);
    return DT_OK;
}

/* all-to-all of n elements per block: rank me's block k holds its elements k n ..; block k of what it
   receives must be rank k's elements me n ..; each rank sends every block but its own */
static dt_result cc_alltoall(cc_rank *x, dt_dtype t, size_t n) {
    size_t es = dt_dtype_size(t), pn = n * (size_t)x->p;
    char *send = (char *)cc_alloc(pn * es), *recv = (char *)cc_alloc(pn * es);
    int k, me = x->rank;
    dt_comm_stats st;
    dt_result r;
    cc_fill(t, x->seed, me, send, 0, pn);
    memset(recv, 0x5a, pn * es);
    dt_comm_reset_stats(x->c);
    r = dt_comm_alltoall(x->c, send, recv, n, t);
    st = dt_comm_get_stats(x->c);
    for (k = 0; r == DT_OK && k < x->p; k++) {
        size_t d = cc_diff_gen(t, x->seed, k, recv + (size_t)k * n * es, (size_t)me * n, n);
        if (d != n) {
            x->fails++;
            printf("    rank %d: all-to-all of %zu x %s (%d ranks): block %d differs at %zu\n", me, n, dt_dtype_name(t), x->p, k, d);
        }
    }
    if (r == DT_OK) CC_CHECK(x, st.bytes_sent == (uint64_t)(x->p - 1) * n * es && st.bytes_recv == st.bytes_sent && st.collectives == 1);
    if (r == DT_OK) CC_CHECK(x, cc_diff_gen(t, x->seed, me, send, 0, pn) == pn);   /* send is only read */
    free(send);
    free(recv);
    CC_OK(x, r);
    return DT_OK;
}

/* all-to-all-v: rank i sends rank j (i + 2 j + salt) mod 5 elements (some none), its elements j 1000 ..;
   the send blocks lie in reverse rank order, the received ones in rank order with a gap between them */
static size_t cc_vcount(int from, int to, int salt) { return (size_t)((from + 2 * to + salt) % 5); }
static dt_result cc_alltoallv(cc_rank *x, dt_dtype t, int salt) {
    size_t es = dt_dtype_size(t), sc[CC_MAX_RANKS], sd[CC_MAX_RANKS], rc[CC_MAX_RANKS], rd[CC_MAX_RANKS], so = 0, ro = 0, sent = 0;
    char *send = (char *)cc_alloc(5 * (size_t)x->p * es), *recv = (char *)cc_alloc(6 * (size_t)x->p * es);
    int k, me = x->rank;
    dt_comm_stats st;
    dt_result r;
    for (k = x->p - 1; k >= 0; k--) {
        sc[k] = cc_vcount(me, k, salt);
        sd[k] = so;
        so += sc[k];
        cc_fill(t, x->seed, me, send + sd[k] * es, (size_t)k * 1000, sc[k]);
        if (k != me) sent += sc[k] * es;
    }
    for (k = 0; k < x->p; k++) {
        rc[k] = cc_vcount(k, me, salt);
        rd[k] = ro;
        ro += rc[k] + 1;
    }
    dt_comm_reset_stats(x->c);
    r = dt_comm_alltoallv(x->c, send, sc, sd, recv, rc, rd, t);
    st = dt_comm_get_stats(x->c);
    for (k = 0; r == DT_OK && k < x->p; k++)
        CC_CHECK(x, cc_diff_gen(t, x->seed, k, recv + rd[k] * es, (size_t)me * 1000, rc[k]) == rc[k]);
    if (r == DT_OK) CC_CHECK(x, st.bytes_sent == sent && st.collectives == 1);
    free(send);
    free(recv);
    CC_OK(x, r);
    return DT_OK;
}

/* neighbour exchange: over a topology's edges, then a one-way shift (to the right, from the left) */
static dt_result cc_neighbors(cc_rank *x, dt_topology_kind kind, size_t n) {
    dt_topology topo;
    dt_topology_desc d;
    size_t es = dt_dtype_size(DT_F64);
    int me = x->rank, nn, i, right = (me + 1) % x->p, left = (me + x->p - 1) % x->p;
    const int *nb;
    dt_neighbors ring;
    char *send = (char *)cc_alloc(n * es), *recv;
    dt_result r;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.world = x->p;
    CC_OK(x, dt_topology_create(&topo, &d));
    nn = topo.offsets[me + 1] - topo.offsets[me];
    nb = topo.neighbors + topo.offsets[me];
    recv = (char *)cc_alloc((size_t)(nn + 1) * n * es);
    cc_fill(DT_F64, x->seed, me, send, 0, n);
    ring.to = ring.from = nb; ring.nto = ring.nfrom = nn;
    r = dt_comm_neighbor_exchange(x->c, send, recv, n, DT_F64, &ring);
    for (i = 0; r == DT_OK && i < nn; i++) CC_CHECK(x, cc_diff_gen(DT_F64, x->seed, nb[i], recv + (size_t)i * n * es, 0, n) == n);
    if (r == DT_OK) {
        dt_neighbors one = {&right, 1, &left, 1};
        r = dt_comm_neighbor_exchange(x->c, send, recv, n, DT_F64, &one);
    }
    if (r == DT_OK) CC_CHECK(x, cc_diff_gen(DT_F64, x->seed, left, recv, 0, n) == n);
    /* a rank may list nobody: only rank 0 sends, to rank p - 1 */
    if (r == DT_OK) {
        int to = x->p - 1, from = 0;
        memset(recv, 0, n * es);
        dt_neighbors some = {&to, me == 0, &from, me == x->p - 1};
        r = dt_comm_neighbor_exchange(x->c, send, recv, n, DT_F64, &some);
        if (r == DT_OK && me == x->p - 1) CC_CHECK(x, cc_diff_gen(DT_F64, x->seed, 0, recv, 0, n) == n);
    }
    dt_topology_free(&topo);
    free(send);
    free(recv);
    CC_OK(x, r);
    return DT_OK;
}

/* ---- point-to-point ---- */

#define CC_NMSG 5
static dt_result cc_p2p(cc_rank *x) {
    dt_comm *c = x->c;
    int me = x->rank, right = (me + 1) % x->p, left = (me + x->p - 1) % x->p, j, done, polls;
    size_t got, sizes[CC_NMSG] = {3, 0, 1000, 1, 17}, sent = 0;
    dt_request q[CC_NMSG + 2], rq;
    double out[CC_NMSG][1000], in[1000], a[8], b[8];
    uint8_t u[300];
    dt_comm_stats st = {0, 0, 0, 0, 0, 0};
    dt_comm_reset_stats(c);
    /* several messages with one tag arrive in the order sent */
    for (j = 0; j < CC_NMSG; j++) {
        cc_fill(DT_F64, x->seed + (uint64_t)j, me, out[j], 0, sizes[j]);
        CC_OK(x, dt_comm_isend(c, out[j], sizes[j], DT_F64, right, 5, &q[j]));
        sent += sizes[j] * 8;
    }
    for (j = 0; j < CC_NMSG; j++) {
        memset(in, 0, sizeof in);
        CC_OK(x, dt_comm_recv(c, in, 1000, DT_F64, left, 5, &got));
        CC_CHECK(x, got == sizes[j] && cc_diff_gen(DT_F64, x->seed + (uint64_t)j, left, in, 0, got) == got);
    }
    CC_OK(x, dt_comm_waitall(c, q, CC_NMSG));
    CC_OK(x, dt_comm_wait(c, &q[0]));   /* completed before: nothing to do */
    /* tags select: received in the other order */
    cc_fill(DT_F64, x->seed, me, a, 0, 8);
    cc_fill(DT_F64, x->seed + 1, me, b, 0, 8);
    CC_OK(x, dt_comm_isend(c, a, 8, DT_F64, right, 7, &q[0]));
    CC_OK(x, dt_comm_isend(c, b, 8, DT_F64, right, DT_TAG_USER_MAX, &q[1]));
    CC_OK(x, dt_comm_recv(c, in, 8, DT_F64, left, DT_TAG_USER_MAX, NULL));
    CC_CHECK(x, cc_diff_gen(DT_F64, x->seed + 1, left, in, 0, 8) == 8);
    CC_OK(x, dt_comm_recv(c, in, 8, DT_F64, left, 7, NULL));
    CC_CHECK(x, cc_diff_gen(DT_F64, x->seed, left, in, 0, 8) == 8);
    CC_OK(x, dt_comm_waitall(c, q, 2));
    sent += 2 * 8 * 8;
    /* to itself */
    CC_OK(x, dt_comm_isend(c, a, 8, DT_F64, me, 0, &q[0]));
    CC_OK(x, dt_comm_recv(c, in, 8, DT_F64, me, 0, &got));
    CC_CHECK(x, got == 8 && memcmp(in, a, sizeof a) == 0);
    CC_OK(x, dt_comm_wait(c, &q[0]));
    sent += 8 * 8;
    /* polling with test; a receive larger than the message (u8) */
    cc_fill(DT_U8, x->seed, me, u, 0, 200);
    memset(u + 200, 0, 100);
    CC_OK(x, dt_comm_irecv(c, u + 200, 100, DT_U8, left, 1, &rq));
    CC_OK(x, dt_comm_isend(c, u, 60, DT_U8, right, 1, &q[0]));
    for (polls = 0, done = 0; !done && polls < 100000000; polls++) {
        CC_OK(x, dt_comm_test(c, &rq, &done));
        if (!done) sched_yield();
    }
    CC_CHECK(x, done && dt_request_received(&rq) == 60 && cc_diff_gen(DT_U8, x->seed, left, u + 200, 0, 60) == 60);
    CC_OK(x, dt_comm_test(c, &rq, &done));
    CC_CHECK(x, done);
    for (done = 0; !done;) { CC_OK(x, dt_comm_test(c, &q[0], &done)); if (!done) sched_yield(); }
    sent += 60;
    /* the counters: exact for point-to-point */
    st = dt_comm_get_stats(c);
    CC_CHECK(x, st.bytes_sent == sent && st.bytes_recv == sent);
    CC_CHECK(x, st.messages_sent == CC_NMSG + 4 && st.messages_recv == CC_NMSG + 4 && st.collectives == 0);
    return DT_OK;
}

/* ---- counters ---- */

/* A ring all-reduce of n f32: each rank sends every chunk but its own (reduce-scatter) and every chunk
   but the next one's (all-gather): 2 (p - 1) / p n elements within a chunk's rounding. */
static dt_result cc_counters(cc_rank *x, size_t n) {
    int p = x->p, me = x->rank, k;
    float *buf = (float *)cc_alloc(n * 4);
    size_t seg = dt_comm_get_desc(x->c).segment_bytes, len[CC_MAX_RANKS] = {0};
    uint64_t sent, recv, msgs = 0;
    dt_comm_stats st = {0, 0, 0, 0, 0, 0};
    double ideal = 2.0 * (p - 1) / p * (double)n * 4;
    for (k = 0; k < p; k++) len[k] = (n / (size_t)p + ((size_t)k < n % (size_t)p)) * 4;
    sent = 2 * (uint64_t)n * 4 - len[me] - len[(me + 1) % p];
    recv = 2 * (uint64_t)n * 4 - len[me] - len[(me + p - 1) % p];
    for (k = 0; k < p; k++)
        if (k != me) msgs += len[k] ? (len[k] + seg - 1) / seg : 1;   /* reduce-scatter: every chunk but mine */
    for (k = 0; k < p; k++)
        if (k != (me + 1) % p) msgs += len[k] ? (len[k] + seg - 1) / seg : 1;
    cc_fill(DT_F32, x->seed, me, buf, 0, n);
    dt_comm_reset_stats(x->c);
    CC_OK(x, dt_comm_allreduce(x->c, buf, n, DT_F32, DT_SUM, DT_ALGO_RING));
    st = dt_comm_get_stats(x->c);
    if (p == 1) CC_CHECK(x, st.bytes_sent == 0 && st.bytes_recv == 0 && st.messages_sent == 0);
    else {
        CC_CHECK(x, st.bytes_sent == sent && st.bytes_recv == recv);
        CC_CHECK(x, fabs((double)st.bytes_sent - ideal) <= 2 * 4 && fabs((double)st.bytes_recv - ideal) <= 2 * 4);
        CC_CHECK(x, st.messages_sent == msgs);
    }
    CC_CHECK(x, st.collectives == 1);
    /* NATIVE counts as a ring would */
    dt_comm_reset_stats(x->c);
    CC_OK(x, dt_comm_allreduce(x->c, buf, n, DT_F32, DT_MAX, DT_ALGO_NATIVE));
    st = dt_comm_get_stats(x->c);
    CC_CHECK(x, fabs((double)st.bytes_sent - ideal) <= 1 && fabs((double)st.bytes_recv - ideal) <= 1 && st.collectives == 1);
    dt_comm_reset_stats(x->c);
    st = dt_comm_get_stats(x->c);
    CC_CHECK(x, st.bytes_sent == 0 && st.bytes_recv == 0 && st.messages_sent == 0 && st.collectives == 0 && st.wait_seconds == 0);
    /* wait_seconds: everyone waits for rank 0, which is 0.1 s late */
    if (p > 1) {
        if (me == 0) cc_sleep(0.1);
        CC_OK(x, dt_comm_allreduce(x->c, buf, 1, DT_F32, DT_SUM, DT_ALGO_RING));
        st = dt_comm_get_stats(x->c);
        if (me != 0) CC_CHECK(x, st.wait_seconds >= 0.05);
    }
    free(buf);
    return DT_OK;
}

/* ---- bad arguments: DT_ERR_INVALID_ARG with a message, and the communicator still works ---- */

static dt_result cc_bad_args(cc_rank *x) {
    dt_comm *c = x->c;
    float f[4] = {1, 2, 3, 4}, g[4 * CC_MAX_RANKS];
    int32_t i32[4] = {1, 2, 3, 4};
    int bad = x->p, nb = -1, done;
    dt_request q;
    memset(&q, 0, sizeof q);
    CC_ERR(x, dt_comm_allreduce(NULL, f, 4, DT_F32, DT_SUM, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_allreduce(c, NULL, 4, DT_F32, DT_SUM, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_allreduce(c, f, 4, (dt_dtype)9, DT_SUM, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_allreduce(c, f, 4, DT_F32, (dt_reduce_op)9, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_allreduce(c, f, 4, DT_F32, DT_SUM, (dt_algo)9), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_allreduce(c, i32, 4, DT_I32, DT_MEAN, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_reduce(c, i32, 4, DT_I64, DT_MEAN, 0, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_reduce(c, f, 4, DT_F32, DT_SUM, bad, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_reduce(c, f, 4, DT_F32, DT_SUM, -1, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_broadcast(c, f, 4, DT_F32, bad, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_broadcast(c, NULL, 4, DT_F32, 0, DT_ALGO_AUTO), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_scatter(c, f, f, 1, DT_F32, bad), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_gather(c, NULL, g, 1, DT_F32, 0), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_allgather(c, f, NULL, 1, DT_F32), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_reduce_scatter(c, g, f, 1, DT_I32, DT_MEAN), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_reduce_scatter(c, g, NULL, 1, DT_F32, DT_SUM), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_alltoall(c, g, NULL, 1, DT_F32), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_alltoall(c, NULL, g, 1, DT_F32), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_alltoall(c, g, g + x->p - 1, 1, DT_F32), DT_ERR_INVALID_ARG);   /* overlapping by one element */
    CC_ERR(x, dt_comm_alltoall(c, g, g + x->p, 1, (dt_dtype)9), DT_ERR_INVALID_ARG);
    {
        size_t cnt[CC_MAX_RANKS] = {0}, big[CC_MAX_RANKS] = {0}, one[CC_MAX_RANKS] = {0};
        big[x->p - 1] = SIZE_MAX / 2;
        one[0] = 1;
        CC_ERR(x, dt_comm_alltoallv(c, g, NULL, cnt, g, cnt, cnt, DT_F32), DT_ERR_INVALID_ARG);
        CC_ERR(x, dt_comm_alltoallv(c, g, cnt, cnt, g, big, cnt, DT_F32), DT_ERR_INVALID_ARG);
        CC_ERR(x, dt_comm_alltoallv(c, NULL, one, cnt, g, cnt, cnt, DT_U8), DT_ERR_INVALID_ARG);
    }
    {
        dt_neighbors e1 = {&bad, 1, &bad, 1}, e2 = {&nb, 1, NULL, 0}, e3 = {NULL, 1, NULL, 0}, e4 = {&nb, 1, &nb, -1};
        CC_ERR(x, dt_comm_neighbor_exchange(c, f, g, 1, DT_F32, &e1), DT_ERR_INVALID_ARG);
        CC_CHECK(x, strstr(dt_last_error(), "(to[0]) is not a rank") != NULL);
        CC_ERR(x, dt_comm_neighbor_exchange(c, f, g, 1, DT_F32, NULL), DT_ERR_INVALID_ARG);
        CC_CHECK(x, strstr(dt_last_error(), "the neighbours are NULL") != NULL);
        CC_ERR(x, dt_comm_neighbor_exchange(c, f, g, 1, DT_F32, &e2), DT_ERR_INVALID_ARG);
        CC_ERR(x, dt_comm_neighbor_exchange(c, f, g, 1, DT_F32, &e3), DT_ERR_INVALID_ARG);
        CC_CHECK(x, strstr(dt_last_error(), "nto is 1 and to is NULL") != NULL);
        CC_ERR(x, dt_comm_neighbor_exchange(c, f, g, 1, DT_F32, &e4), DT_ERR_INVALID_ARG);
        CC_CHECK(x, strstr(dt_last_error(), "nfrom is -1") != NULL);
    }
    CC_ERR(x, dt_comm_send(c, f, 4, DT_F32, bad, 0), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_send(c, f, 4, DT_F32, 0, -1), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_send(c, f, 4, DT_F32, 0, DT_TAG_USER_MAX + 1), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_send(c, NULL, 4, DT_F32, 0, 0), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_recv(c, f, 4, DT_F32, -1, 0, NULL), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_recv(c, f, 4, (dt_dtype)-1, 0, 0, NULL), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_isend(c, f, 4, DT_F32, 0, 0, NULL), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_irecv(NULL, f, 4, DT_F32, 0, 0, &q), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_wait(c, NULL), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_wait(NULL, &q), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_waitall(c, NULL, 2), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_test(c, &q, NULL), DT_ERR_INVALID_ARG);
    CC_ERR(x, dt_comm_barrier(NULL), DT_ERR_INVALID_ARG);
    CC_OK(x, dt_comm_test(c, &q, &done));   /* a request never posted is complete */
    CC_CHECK(x, done == 1 && dt_request_received(&q) == 0);
    /* count 0 needs no buffer; and after all this the communicator works */
    CC_OK(x, dt_comm_allreduce(c, NULL, 0, DT_F32, DT_SUM, DT_ALGO_AUTO));
    CC_OK(x, dt_comm_broadcast(c, NULL, 0, DT_U8, 0, DT_ALGO_RING));
    return cc_allreduce(x, DT_F32, DT_SUM, DT_ALGO_AUTO, 7);
}

/* ---- the queries: dt_comm_algo, dt_comm_get_desc ---- */

/* dt_comm_algo answers what the tests' own reading of the rule (cc_resolve) says, for every algorithm:
   on the self, local and MPI backends, whatever the communicator's default. */
static dt_result cc_queries(cc_rank *x) {
    dt_comm_desc d = dt_comm_get_desc(x->c);
    int al;
    for (al = DT_ALGO_AUTO; al < DT_ALGO_COUNT; al++) CC_CHECK(x, dt_comm_algo(x->c, (dt_algo)al) == cc_resolve(x->c, (dt_algo)al, 1));
    CC_CHECK(x, dt_comm_algo(x->c, DT_ALGO_AUTO) == (d.algo != DT_ALGO_AUTO ? d.algo : DT_ALGO_NATIVE));   /* every backend here has one */
    CC_CHECK(x, dt_comm_algo(x->c, DT_ALGO_TREE) == DT_ALGO_TREE);
    CC_CHECK(x, d.timeout > 0 && d.segment_bytes > 0);   /* the defaults filled in */
    return DT_OK;
}

/* ---- the whole set ---- */

static dt_result cc_run_all(cc_rank *x, const comm_checks_arg *a) {
    static const size_t counts[] = {0, 1, 2, 7, 1000};
    static const dt_dtype types[] = {DT_F32, DT_F64, DT_I32, DT_I64, DT_U8};
    int p = x->p, ti, op, al, ci, k;
    int roots[3];
    size_t big = 1000003;
    roots[0] = 0; roots[1] = p - 1; roots[2] = p / 2;
    CC_OK(x, cc_bad_args(x));
    CC_OK(x, cc_queries(x));
    CC_OK(x, cc_p2p(x));
    CC_OK(x, dt_comm_barrier(x->c));
    /* every type, op and algorithm, small counts */
    for (ti = 0; ti < 5; ti++)
        for (op = DT_SUM; op <= DT_MIN; op++)
            for (al = DT_ALGO_AUTO; al < DT_ALGO_COUNT; al++)
                for (ci = 0; ci < 5; ci++) {
                    if (op == DT_MEAN && types[ti] != DT_F32 && types[ti] != DT_F64) continue;
                    CC_OK(x, cc_allreduce(x, types[ti], (dt_reduce_op)op, (dt_algo)al, counts[ci]));
                    if (ci == 0 || ci == 4) CC_OK(x, cc_reduce(x, types[ti], (dt_reduce_op)op, (dt_algo)al, roots[(ti + op + al) % 3], counts[ci]));
                }
    for (al = DT_ALGO_AUTO; al < DT_ALGO_COUNT; al++)
        for (k = 0; k < 3; k++) {
            CC_OK(x, cc_reduce(x, DT_F32, DT_SUM, (dt_algo)al, roots[k], 1000));
            for (ci = 0; ci < 5; ci++) CC_OK(x, cc_broadcast(x, types[(ci + k) % 5], (dt_algo)al, roots[k], counts[ci]));
        }
    for (k = 0; k < 3; k++)
        for (ci = 0; ci < 5; ci++) {
            CC_OK(x, cc_placement(x, types[(ci + k) % 4], roots[k], counts[ci]));
            CC_OK(x, cc_alltoall(x, types[(ci + k) % 5], counts[ci]));
        }
    for (k = 0; k < 5; k++) CC_OK(x, cc_alltoallv(x, types[k], k));
    CC_OK(x, cc_placement(x, DT_U8, roots[1], 1000));
    CC_OK(x, cc_neighbors(x, DT_TOPO_RING, 1000));
    CC_OK(x, cc_neighbors(x, DT_TOPO_TORUS, 7));
    CC_OK(x, cc_neighbors(x, DT_TOPO_RING, 0));
    CC_OK(x, cc_counters(x, 1000));
    CC_OK(x, cc_counters(x, 7));
    if (a->big) {   /* a million elements (not a multiple of any p > 1) and a few MiB */
        float *r1 = (float *)cc_alloc(big * 4), *r2 = (float *)cc_alloc(big * 4);
        for (al = DT_ALGO_AUTO; al < DT_ALGO_COUNT; al++) CC_OK(x, cc_allreduce(x, DT_F32, DT_SUM, (dt_algo)al, big));
        CC_OK(x, cc_allreduce(x, DT_F64, DT_MEAN, DT_ALGO_RING, big));
        CC_OK(x, cc_allreduce(x, DT_I64, DT_SUM, DT_ALGO_NATIVE, big));
        CC_OK(x, cc_allreduce(x, DT_I32, DT_MIN, DT_ALGO_TREE, big));
        CC_OK(x, cc_reduce(x, DT_F32, DT_SUM, DT_ALGO_RING, roots[1], big));
        CC_OK(x, cc_broadcast(x, DT_U8, DT_ALGO_RING, roots[2], (size_t)3 << 20));
        CC_OK(x, cc_broadcast(x, DT_F32, DT_ALGO_TREE, roots[1], big));
        CC_OK(x, cc_placement(x, DT_F32, roots[1], big / (size_t)p));
        CC_OK(x, cc_alltoall(x, DT_F32, big / (size_t)p));
        CC_OK(x, cc_counters(x, big));
        /* determinism: the same all-reduce twice gives the same bits; the ring on repeated runs */
        cc_fill(DT_F32, x->seed, x->rank, r1, 0, big);
        memcpy(r2, r1, big * 4);
        CC_OK(x, dt_comm_allreduce(x->c, r1, big, DT_F32, DT_SUM, DT_ALGO_RING));
        CC_OK(x, dt_comm_allreduce(x->c, r2, big, DT_F32, DT_SUM, DT_ALGO_RING));
        CC_CHECK(x, memcmp(r1, r2, big * 4) == 0);
        free(r1);
        free(r2);
    }
    return DT_OK;
}

/* The rank function: arg is a comm_checks_arg; failures[rank] gets this rank's failed checks. */
static dt_result comm_checks_run(dt_comm *c, void *arg) {
    comm_checks_arg *a = (comm_checks_arg *)arg;
    cc_rank x;
    dt_result r;
    memset(&x, 0, sizeof x);
    x.c = c;
    x.rank = dt_comm_rank(c);
    x.p = dt_comm_size(c);
    x.seed = a->seed;
    if (x.p > CC_MAX_RANKS) { printf("    comm_checks: at most %d ranks\n", CC_MAX_RANKS); return DT_ERR_INVALID_ARG; }
    r = cc_run_all(&x, a);
    a->failures[x.rank] = x.fails;
    return r;
}
#endif
