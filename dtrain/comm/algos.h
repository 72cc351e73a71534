/* dtrain/comm/algos.h - the algorithms written once over isend/irecv, and the calls that run them.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The collective algorithms over the backend's point-to-point (dtrain/comm/backend.h), with fixed
     summation orders so every backend gives the same bits: naive gather-reduce-broadcast, ring
     reduce-scatter + all-gather (pipelined in segments), binomial tree, hierarchical over nodes of ranks,
     pairwise all-to-all; then the public point-to-point and collective calls declared in
     dtrain/comm/comm.h: their argument checks, the collective's start (signature, sequence number, the
     injected fault of dt_comm_desc.fault) and the choice of an algorithm. No declarations of its own.
   USES
     dtrain/comm/backend.h (the generic layer) and what it includes; the communicator's fields through its view
     in dtrain/core/internal.h (struct dt_comm, under backend.h's heading).
   READ FIRST
     dt__allreduce_ring with dt__ring_reduce_scatter and dt__ring_allgather, dt__tree_reduce, the naive
     algorithms, dt__allreduce_hier, then dt__coll_allreduce (how a call picks one).
*/
#ifndef DTRAIN_ALGOS_H
#define DTRAIN_ALGOS_H
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* (none: the calls this module implements are declared in dtrain/comm/comm.h) */

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_ALGOS_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_ALGOS_IMPLEMENTATION_DONE)
#define DTRAIN_ALGOS_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

/* Chunk k of n elements split over p ranks: the first n % p chunks have one element more. */
static size_t dt__chunk_off(size_t n, int p, int k) { return (size_t)k * (n / (size_t)p) + ((size_t)k < n % (size_t)p ? (size_t)k : n % (size_t)p); }
static size_t dt__chunk_len(size_t n, int p, int k) { return n / (size_t)p + ((size_t)k < n % (size_t)p ? 1 : 0); }
/* The leader of node j: its lowest rank (nodes are numbered in the order of their lowest ranks). */
static int dt__node_leader(const dt_comm *c, int j) {
    int k;
    if (!c->node) return c->desc.node_size > 0 ? j * c->desc.node_size : j;
    for (k = 0; k < c->size && c->node[k] != j; k++) {}
    return k;
}
/* The ring the ring algorithms run around: every rank in rank order, or while DT_ALGO_HIER's leaders
   all-reduce (ring_nodes set) the nodes' leaders in node order. Its size, this rank's place in it, and
   the rank at place k (mod the size). */
static int dt__ring_size(const dt_comm *c) { return c->ring_nodes > 0 ? c->ring_nodes : c->size; }
static int dt__ring_me(const dt_comm *c) { return c->ring_nodes > 0 ? dt__node_of(c, c->rank) : c->rank; }
static int dt__ring_rank(const dt_comm *c, int k) {
    int p = dt__ring_size(c);
    k = (k % p + p) % p;
    return c->ring_nodes > 0 ? dt__node_leader(c, k) : k;
}
/* A step of a ring over the p chunks of buf[n]: chunk ks goes to the right neighbour while chunk kr comes
   from the left, reduced into buf's chunk kr through tmp (tmp set) or written over it (tmp NULL). */
static dt_result dt__ring_step(dt_comm *c, void *buf, size_t n, dt_dtype t, int ks, int kr, void *tmp, dt_reduce_op op) {
    int p = dt__ring_size(c), right = dt__ring_rank(c, dt__ring_me(c) + 1), left = dt__ring_rank(c, dt__ring_me(c) - 1);
    size_t es = dt_dtype_size(t);
    return dt__step(c, (char *)buf + dt__chunk_off(n, p, ks) * es, dt__chunk_len(n, p, ks) * es, right,
                    (char *)buf + dt__chunk_off(n, p, kr) * es, dt__chunk_len(n, p, kr) * es, left, tmp, tmp != NULL, t, op);
}

/* Ring reduce-scatter, in place: afterwards rank r holds chunk r reduced over all ranks. Step s sends
   chunk r - s - 1 to the right and reduces chunk r - s - 2 from the left into its own, so chunk k starts
   at rank k + 1 and picks up one rank per step: the order of the reduction is fixed by the ring. */
static dt_result dt__ring_reduce_scatter(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, void *tmp) {
    int p = dt__ring_size(c), me = dt__ring_me(c), s;
    for (s = 0; s < p - 1; s++) {
        int ks = ((me - s - 1) % p + p) % p, kr = ((me - s - 2) % p + 2 * p) % p;
        dt_result r = dt__ring_step(c, buf, n, t, ks, kr, tmp, op);
        if (r != DT_OK) return r;
    }
    return DT_OK;
}
/* Ring all-gather, in place: rank r starts with chunk r and ends with all of them. */
static dt_result dt__ring_allgather(dt_comm *c, void *buf, size_t n, dt_dtype t) {
    int p = dt__ring_size(c), me = dt__ring_me(c), s;
    for (s = 0; s < p - 1; s++) {
        int ks = ((me - s) % p + p) % p, kr = ((me - s - 1) % p + p) % p;
        dt_result r = dt__ring_step(c, buf, n, t, ks, kr, NULL, DT_SUM);
        if (r != DT_OK) return r;
    }
    return DT_OK;
}
/* tmp: one chunk (n / p + 1 elements) of scratch. */
static dt_result dt__allreduce_ring(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, void *tmp) {
    size_t es = dt_dtype_size(t);
    dt_result r = dt__ring_reduce_scatter(c, buf, n, t, op, tmp);
    if (r == DT_OK && op == DT_MEAN)   /* each rank divides the chunk it owns, so all get the same bits */
        dt__mean_finish((char *)buf + dt__chunk_off(n, c->size, c->rank) * es, dt__chunk_len(n, c->size, c->rank), t, c->size);
    if (r == DT_OK) r = dt__ring_allgather(c, buf, n, t);
    return r;
}

/* Binomial tree over ranks renumbered so the root is 0 (v = (rank - root) mod p). Reduce: in round
   k (mask = 2^k) a rank with bit k set sends its partial result to v - mask and stops; the others add
   what v + mask sends them. Broadcast: the same edges in the other direction. */
static dt_result dt__tree_reduce(dt_comm *c, void *buf, size_t bytes, dt_dtype t, dt_reduce_op op, int root, void *tmp) {
    int p = c->size, v = (c->rank - root + p) % p, mask;
    for (mask = 1; mask < p; mask <<= 1) {
        dt_result r;
        if (v & mask) return dt__send(c, buf, bytes, (v - mask + root) % p, t);
        if (v + mask < p && (r = dt__recv_reduce(c, buf, bytes, (v + mask + root) % p, tmp, t, op)) != DT_OK) return r;
    }
    return DT_OK;
}
static dt_result dt__tree_broadcast(dt_comm *c, void *buf, size_t bytes, int root) {
    int p = c->size, v = (c->rank - root + p) % p, mask = 1;
    dt_result r;
    while (mask < p) {
        if (v & mask) {
            if ((r = dt__recv(c, buf, bytes, (v - mask + root) % p, DT_U8)) != DT_OK) return r;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < p && (r = dt__send(c, buf, bytes, (v + mask + root) % p, DT_U8)) != DT_OK) return r;
    return DT_OK;
}
/* Naive: the root talks to everyone in rank order; the reduction is x0 op x1 op ... op x(p-1). */
/* mine and tmp: n elements of scratch each, on the root. */
static dt_result dt__naive_reduce(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, int root, void *mine, void *tmp) {
    size_t bytes = n * dt_dtype_size(t);
    int k;
    dt_result r;
    if (c->rank != root) return dt__send(c, buf, bytes, root, t);
    if (bytes) memcpy(mine, buf, bytes);
    for (k = 0; k < c->size; k++) {
        if (k == root) {
            if (k == 0) continue;   /* buf already is x0 */
            dt__reduce_into(buf, mine, n, t, op);
        } else if (k == 0) {
            if ((r = dt__recv(c, buf, bytes, 0, t)) != DT_OK) return r;
        } else if ((r = dt__recv_reduce(c, buf, bytes, k, tmp, t, op)) != DT_OK) return r;
    }
    return DT_OK;
}
static dt_result dt__naive_broadcast(dt_comm *c, void *buf, size_t bytes, int root) {
    int k;
    dt_result r;
    if (c->rank != root) return dt__recv(c, buf, bytes, root, DT_U8);
    for (k = 0; k < c->size; k++)
        if (k != root && (r = dt__send(c, buf, bytes, k, DT_U8)) != DT_OK) return r;
    return DT_OK;
}
/* Ring broadcast: a pipelined chain root -> root + 1 -> ...; each segment is passed on as it arrives. */
static dt_result dt__ring_broadcast(dt_comm *c, void *buf, size_t bytes, int root) {
    int p = c->size, me = c->rank, right = (me + 1) % p, left = (me + p - 1) % p;
    size_t seg = c->desc.segment_bytes, off = 0;
    do {
        size_t len = bytes - off < seg ? bytes - off : seg;
        dt_result r;
        if (me != root && (r = dt__recv(c, (char *)buf + off, len, left, DT_U8)) != DT_OK) return r;
        if (right != root && (r = dt__send(c, (char *)buf + off, len, right, DT_U8)) != DT_OK) return r;
        off += len;
    } while (off < bytes);
    return DT_OK;
}

/* Hierarchical all-reduce (DT_ALGO_HIER), in place: each rank sends its data to its node's leader, which
   reduces them in rank order as they come (its own first); the leaders all-reduce around the ring of
   leaders; each leader sends the result to its node's ranks in rank order. MEAN is left to the caller,
   who divides once, as the flat algorithms do. tmp: n + 1 elements of scratch. */
static dt_result dt__allreduce_hier(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, void *tmp) {
    int me = c->rank, node = dt__node_of(c, me), lead = dt__node_leader(c, node), nodes = dt_comm_nodes(c, NULL), k;
    size_t bytes = n * dt_dtype_size(t);
    dt_result r = DT_OK;
    if (op == DT_MEAN) op = DT_SUM;
    if (me != lead) {
        if ((r = dt__send(c, buf, bytes, lead, t)) != DT_OK) return r;
        return dt__recv(c, buf, bytes, lead, t);
    }
    for (k = me + 1; k < c->size && r == DT_OK; k++)
        if (dt__node_of(c, k) == node) r = dt__recv_reduce(c, buf, bytes, k, tmp, t, op);
    if (r == DT_OK && nodes > 1) {
        c->ring_nodes = nodes;
        r = dt__allreduce_ring(c, buf, n, t, op, tmp);
        c->ring_nodes = 0;
    }
    for (k = me + 1; k < c->size && r == DT_OK; k++)
        if (dt__node_of(c, k) == node) r = dt__send(c, buf, bytes, k, t);
    return r;
}

/* The blocks of an all-to-all: block k of a buffer is counts[k] units at displs[k] units, or with counts
   and displs NULL one unit at k units (dt_comm_alltoall's blocks of `unit` bytes). */
typedef struct dt__blocks { const size_t *counts, *displs; size_t unit; } dt__blocks;
static size_t dt__blk_off(const dt__blocks *b, int k) { return (b->displs ? b->displs[k] : (size_t)k) * b->unit; }
static size_t dt__blk_len(const dt__blocks *b, int k) { return (b->counts ? b->counts[k] : 1) * b->unit; }
/* All-to-all by pairwise exchange: in step s block me + s goes to rank me + s while block me - s comes
   from rank me - s, so each step every rank sends one block and receives one, and no link carries two.
   A receive must get exactly its block's bytes (dt__step), so blocks of different sizes are a mismatch. */
static dt_result dt__alltoall_pairwise(dt_comm *c, const void *send, const dt__blocks *sb, void *recv, const dt__blocks *rb) {
    int p = c->size, me = c->rank, s;
    size_t own = dt__blk_len(sb, me);
    dt_result r = DT_OK;
    if (own != dt__blk_len(rb, me)) {
        char m[160];
        snprintf(m, sizeof m, "this rank sends itself %zu bytes but receives %zu from itself: its counts for itself differ", own, dt__blk_len(rb, me));
        return dt__comm_fail(c, DT_ERR_MISMATCH, m);
    }
    if (own) memmove((char *)recv + dt__blk_off(rb, me), (const char *)send + dt__blk_off(sb, me), own);
    for (s = 1; s < p && r == DT_OK; s++) {
        int dst = (me + s) % p, src = (me - s + p) % p;
        r = dt__step(c, (const char *)send + dt__blk_off(sb, dst), dt__blk_len(sb, dst), dst, (char *)recv + dt__blk_off(rb, src),
                     dt__blk_len(rb, src), src, NULL, 0, DT_U8, DT_SUM);
    }
    return r;
}
/* dt_comm_alltoall's blocks: one of bytes each, block k at k * bytes. */
static dt_result dt__alltoall_even(dt_comm *c, const void *send, void *recv, size_t bytes) {
    dt__blocks b;
    b.counts = b.displs = NULL;
    b.unit = bytes;
    return dt__alltoall_pairwise(c, send, &b, recv, &b);
}

/* ---- the public calls ------------------------------------------------------------------------- */

/* Buffers of no elements may be NULL, but the algorithms still offset them (by 0), which C leaves
   undefined for NULL: such buffers get a dummy address, never read or written. */
static void *dt__nonnull(const void *p) {
    static char none[8];
    return p ? (void *)(uintptr_t)p : (void *)none;
}

/* Checks shared by every call; sets the error and returns nonzero when the call cannot go ahead. */
static dt_result dt__comm_check(dt_comm *c, const char *fn, const void *buf, size_t count, dt_dtype t, int peer, const char *peer_name) {
    size_t es = dt_dtype_size(t);
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: communicator is NULL", fn);
    if (c->broken) return dt__comm_broken(c);
    if (es == 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown element type %d: use DT_F32, DT_F64, DT_I32, DT_I64, DT_U8, DT_BF16 or DT_F16", fn, (int)t);
    if (count > (SIZE_MAX / 4) / es / (size_t)c->size) return dt_set_error(DT_ERR_INVALID_ARG, "%s: count %zu is too large", fn, count);
    if (count > 0 && !buf) return dt_set_error(DT_ERR_INVALID_ARG, "%s: buffer is NULL with count %zu", fn, count);
    if (peer_name && (peer < 0 || peer >= c->size))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s %d is not a rank of this communicator (0..%d)", fn, peer_name, peer, c->size - 1);
    return DT_OK;
}
/* lib: one of the library's own tags, else a user's. */
static dt_result dt__tag_check(const char *fn, int tag, int lib) {
    if (!lib && (tag < 0 || tag > DT_TAG_USER_MAX)) return dt_set_error(DT_ERR_INVALID_ARG, "%s: tag %d is outside 0..%d", fn, tag, DT_TAG_USER_MAX);
    if (lib && (tag <= DT_TAG_USER_MAX || tag >= DT__TAG_LIB_END))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the library's tag %d is outside its own %d..%d", fn, tag, DT_TAG_USER_MAX + 1, DT__TAG_LIB_END - 1);
    return DT_OK;
}
/* The fault dt_comm_desc.fault asks for, when this is its rank and collective. data: the rank's own elements
   in the collective (NULL: none: scatter, gather, the all-gathers, all-to-all, the neighbour exchange; a
   broadcast's on its root only, since the others' are overwritten), where kind nan writes its NaN into the
   first element; a collective with no float of this rank's to poison (no data, or integers) is a failure
   that says so, not a fault that changes nothing. */
static dt_result dt__fault_fire(dt_comm *c, void *data, size_t count, dt_dtype t) {
    static const char *names[] = {"", "fail", "return", "stall", "hang", "nan"};
    dt__fault *f = &c->fault;
    char what[160], cause[512];
    if (f->kind == DT__FAULT_NONE || c->rank != f->rank || c->seq != f->coll) return DT_OK;
    f->fired = 1;
    dt_comm_describe(c, what, sizeof what);
    if (f->kind == DT__FAULT_NAN && (!data || count == 0 || (t != DT_F32 && t != DT_F64 && t != DT_F16 && t != DT_BF16))) {
        snprintf(cause, sizeof cause, "DT_FAULT '%s' (kind=nan, a test aid) has no float of rank %d's to poison in this collective (%s); "
                 "name an all-reduce, a reduce or a broadcast from this rank of floats (--trace PATH records the collectives with their numbers)",
                 f->spec, c->rank, !data || count == 0 ? "it poisons only a rank's own elements of an all-reduce, a reduce or a "
                 "broadcast's root" : "its elements are integers");
        return dt__comm_fail(c, DT_ERR_INVALID_ARG, cause);
    }
    dt_log(DT_LOG_WARN, "rank %d: %s: DT_FAULT injects kind=%s here (a test aid)", c->rank, what, names[f->kind]);
    if (f->kind == DT__FAULT_STALL || f->kind == DT__FAULT_HANG || f->kind == DT__FAULT_RETURN)
        DT__ATOMIC_STORE(&c->seq, c->seq - 1);   /* this rank has not arrived: the others' reports say so */
    switch (f->kind) {
    case DT__FAULT_FAIL: return dt__comm_fail(c, DT_ERR_STATE, "an injected failure (DT_FAULT kind=fail, a test aid)");
    case DT__FAULT_RETURN:   /* gone as a finished rank; this rank's own later calls fail */
        if (c->backend->leave) c->backend->leave(c, DT_OK, "");
        snprintf(c->broken_msg, sizeof c->broken_msg, "rank %d: %s: this rank has left the run (DT_FAULT kind=return, a test aid)", c->rank, what);
        c->broken = DT_ERR_PEER;
        return dt__comm_broken(c);
    case DT__FAULT_STALL: dt_sleep(f->seconds); DT__ATOMIC_STORE(&c->seq, c->seq + 1); return DT_OK;
    case DT__FAULT_HANG: for (;;) dt_sleep(3600.0);
    default:
        if (t == DT_F32) ((float *)data)[0] = NAN;
        else if (t == DT_F64) ((double *)data)[0] = NAN;
        else ((uint16_t *)data)[0] = t == DT_F16 ? 0x7e00 : 0x7fc0;   /* the quiet NaNs of fp16 and bf16 */
        return DT_OK;
    }
}

/* Under dt_launch, after a rank's function returned DT_OK: a failure when this rank's injected fault never fired
   (its collective was never reached), naming how far the rank got. */
static dt_result dt__fault_unfired(const dt_comm *c) {
    const dt__fault *f = &c->fault;
    if (f->kind == DT__FAULT_NONE || f->fired || c->rank != f->rank) return DT_OK;
    return dt_set_error(DT_ERR_INVALID_ARG, "rank %d: DT_FAULT '%s' (a test aid) never fired: this rank ran %llu collectives, and the "
                        "fault waits for #%llu; name a collective the run reaches (--trace PATH records them with their numbers)", c->rank, f->spec,
                        (unsigned long long)c->seq, (unsigned long long)f->coll);
}

/* Starts collective number c->seq + 1: its signature, its counter; the seq is published for reports.
   Then the injected fault, if this is its collective (the only failure: the caller returns it). */
static dt_result dt__coll_start(dt_comm *c, int kind, const void *data, size_t count, dt_dtype t, int op, int root, dt_algo algo) {
    DT__ATOMIC_STORE(&c->seq, c->seq + 1);
    dt__comm_begin(c, kind, count, (int)t, op, root, (int)algo);
    DT__ATOMIC_STORE(&c->coll_sig[0], UINT64_MAX);   /* readers that see this ignore the rest */
    DT__ATOMIC_STORE(&c->coll_sig[1], c->sig[1]);
    DT__ATOMIC_STORE(&c->coll_sig[2], c->sig[2]);
    DT__ATOMIC_STORE(&c->coll_sig[0], c->sig[0]);
    c->stats.collectives++;
    if (dt__tls_trace) {   /* closed by the public call's wrapper (dt__trace_close) */
        dt_trace_begin(dt__op_name(kind), "comm");
        dt__trace_arg("bytes", NULL, (int64_t)(count * dt_dtype_size(t)));
        dt__trace_arg("algo", dt_algo_name(algo), 0);
        dt__trace_arg("seq", NULL, (int64_t)c->seq);
    }
    return dt__fault_fire(c, (void *)(uintptr_t)data, count, t);
}
static dt_result dt__algo_check(const char *fn, dt_algo a) {
    if (a < DT_ALGO_AUTO || a >= DT_ALGO_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown algorithm %d: use DT_ALGO_AUTO, _NAIVE, _RING, _TREE, _NATIVE or _HIER", fn, (int)a);
    return DT_OK;
}
static dt_algo dt__algo_resolve(const dt_comm *c, dt_algo a, int has_native) {
    if (a <= DT_ALGO_AUTO || a >= DT_ALGO_COUNT) a = c->desc.algo;
    if (a <= DT_ALGO_AUTO || a >= DT_ALGO_COUNT) a = has_native ? DT_ALGO_NATIVE : DT_ALGO_RING;
    if (a == DT_ALGO_NATIVE && !has_native) a = DT_ALGO_RING;
    return a;
}
dt_algo dt_comm_algo(const dt_comm *c, dt_algo algo) {
    return c ? dt__algo_resolve(c, algo, c->backend->allreduce != NULL) : algo;
}
void dt_comm_count_native(dt_comm *c, size_t bytes, int factor) {
    uint64_t b = (uint64_t)((double)bytes * factor * (c->size - 1) / c->size);
    c->stats.bytes_sent += b;
    c->stats.bytes_recv += b;
}
static dt_result dt__native(dt_comm *c, dt_result r) { return r == DT_OK ? DT_OK : dt__comm_fail(c, r, dt_last_error()); }

/* Posts a point-to-point send or receive of count elements: the public calls' (user tags), and with lib
   set the library's own (its reserved tags). */
static dt_result dt__p2p_post(dt_comm *c, int kind, const void *buf, size_t count, dt_dtype t, int peer, int tag, dt_request *req, int lib) {
    const char *fn = kind == DT_REQ_SEND ? "dt_comm_isend" : "dt_comm_irecv";
    dt_result r = dt__comm_check(c, fn, buf, count, t, peer, kind == DT_REQ_SEND ? "destination" : "source");
    if (r == DT_OK) r = dt__tag_check(fn, tag, lib);
    if (r == DT_OK && !req) r = dt_set_error(DT_ERR_INVALID_ARG, "%s: request is NULL", fn);
    if (r != DT_OK) return r;
    dt__comm_begin(c, DT__OP_P2P, count, (int)t, 0, peer, 0);
    return dt__post(c, kind, buf, count * dt_dtype_size(t), peer, tag, (int)dt_dtype_size(t), dt__rq(req));
}
dt_result dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request *req) {
    return dt__p2p_post(c, DT_REQ_SEND, buf, count, t, dst, tag, req, 0);
}
dt_result dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request *req) {
    return dt__p2p_post(c, DT_REQ_RECV, buf, count, t, src, tag, req, 0);
}
dt_result dt_comm_wait(dt_comm *c, dt_request *req) {
    dt__req *q = dt__rq(req);
    if (!c || !req) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_wait: %s is NULL", c ? "request" : "communicator");
    if (q->m.kind == DT_REQ_NONE) return DT_OK;   /* completed before, or never posted */
    if (c->broken) { if (c->backend->cancel) c->backend->cancel(c, &q->m); return dt__comm_broken(c); }
    dt__comm_begin(c, DT__OP_P2P, q->m.bytes, DT_U8, 0, q->m.peer, 0);
    {
        dt_result r;
        dt_trace_begin(q->m.kind == DT_REQ_SEND ? "wait send" : "wait recv", "comm");
        dt__trace_arg("peer", NULL, q->m.peer);
        dt__trace_arg("bytes", NULL, (int64_t)q->m.bytes);
        dt__trace_arg("tag", NULL, q->m.tag);
        r = dt__wait(c, q, 0);
        dt_trace_end();
        if (r == DT_OK) q->m.kind = DT_REQ_NONE;
        return r;
    }
}
dt_result dt_comm_waitall(dt_comm *c, dt_request *reqs, int n) {
    int i;
    dt_result r = DT_OK;
    if (n > 0 && !reqs) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_waitall: requests are NULL");
    for (i = 0; i < n && r == DT_OK; i++) r = dt_comm_wait(c, &reqs[i]);
    if (r != DT_OK && c) dt__cancel_all(c, reqs, n);
    return r;
}
dt_result dt_comm_test(dt_comm *c, dt_request *req, int *done) {
    dt__req *q = dt__rq(req);
    dt_result r;
    if (!c || !req || !done) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_test: communicator, request and done must not be NULL");
    *done = 0;
    if (q->m.kind == DT_REQ_NONE) { *done = 1; return DT_OK; }
    if (c->broken) return dt__comm_broken(c);
    if ((r = c->backend->test(c, &q->m, done)) != DT_OK) {
        dt__comm_begin(c, DT__OP_P2P, q->m.bytes, DT_U8, 0, q->m.peer, 0);
        return dt__comm_fail(c, r, dt_last_error());
    }
    if (*done) {
        if (q->m.kind == DT_REQ_RECV) { c->stats.bytes_recv += q->m.received; c->stats.messages_recv++; }
        q->m.kind = DT_REQ_NONE;
    }
    return DT_OK;
}
size_t dt_request_received(const dt_request *req) {
    const dt__req *q = (const dt__req *)(const void *)req;
    return q && q->esize > 0 ? q->m.received / (size_t)q->esize : 0;
}
/* A blocking send or receive: a post and its wait. */
static dt_result dt__p2p(dt_comm *c, int kind, const void *buf, size_t count, dt_dtype t, int peer, int tag, size_t *received, int lib) {
    dt_request q;
    dt_result r = dt__p2p_post(c, kind, buf, count, t, peer, tag, &q, lib);
    if (r == DT_OK) r = dt_comm_wait(c, &q);
    if (r == DT_OK && received) *received = dt_request_received(&q);
    return r;
}
dt_result dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag) {
    return dt__p2p(c, DT_REQ_SEND, buf, count, t, dst, tag, NULL, 0);
}
dt_result dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, size_t *received) {
    return dt__p2p(c, DT_REQ_RECV, buf, count, t, src, tag, received, 0);
}
/* The library's own point-to-point messages (dtrain/train/ddp.h's and fedavg.h's, the launcher's timeline): the same
   calls on its reserved tags DT__TAG_DDP, DT__TAG_FEDAVG, DT__TAG_TRACE, which the public ones refuse. */
static inline dt_result dt__lib_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request *req) {
    return dt__p2p_post(c, DT_REQ_SEND, buf, count, t, dst, tag, req, 1);
}
static inline dt_result dt__lib_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request *req) {
    return dt__p2p_post(c, DT_REQ_RECV, buf, count, t, src, tag, req, 1);
}
static inline dt_result dt__lib_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag) {
    return dt__p2p(c, DT_REQ_SEND, buf, count, t, dst, tag, NULL, 1);
}
static inline dt_result dt__lib_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, size_t *received) {
    return dt__p2p(c, DT_REQ_RECV, buf, count, t, src, tag, received, 1);
}

static dt_result dt__coll_barrier(dt_comm *c) {
    int k;
    dt_result r = dt__comm_check(c, "dt_comm_barrier", NULL, 0, DT_U8, 0, NULL);
    dt_algo a;
    if (r != DT_OK) return r;
    a = dt__algo_resolve(c, DT_ALGO_AUTO, c->backend->barrier != NULL);
    if ((r = dt__coll_start(c, DT__OP_BARRIER, NULL, 0, DT_U8, 0, -1, a)) != DT_OK) return r;
    if (c->size == 1) return DT_OK;
    if (a == DT_ALGO_NATIVE) return dt__native(c, c->backend->barrier(c, dt_time_now() + c->desc.timeout));
    /* dissemination: in round k everyone signals rank + 2^k and hears from rank - 2^k */
    for (k = 1; k < c->size && r == DT_OK; k <<= 1)
        r = dt__signal(c, (c->rank + k) % c->size, (c->rank - k + c->size) % c->size);
    return r;
}

static dt_result dt__coll_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_algo algo) {
    dt_result r = dt__comm_check(c, "dt_comm_broadcast", buf, count, t, root, "root");
    size_t bytes;
    if (r == DT_OK) r = dt__algo_check("dt_comm_broadcast", algo);
    if (r != DT_OK) return r;
    if (!count) buf = dt__nonnull(buf);
    bytes = count * dt_dtype_size(t);
    algo = dt__algo_resolve(c, algo, c->backend->broadcast != NULL);
    if ((r = dt__coll_start(c, DT__OP_BROADCAST, c->rank == root ? buf : NULL, count, t, 0, root, algo)) != DT_OK) return r;
    if (c->size == 1) return DT_OK;
    switch (algo) {
    case DT_ALGO_NATIVE:
        return dt__native(c, c->backend->broadcast(c, buf, bytes, root, dt_time_now() + c->desc.timeout));
    case DT_ALGO_NAIVE: return dt__naive_broadcast(c, buf, bytes, root);
    case DT_ALGO_RING: return dt__ring_broadcast(c, buf, bytes, root);
    default: return dt__tree_broadcast(c, buf, bytes, root);
    }
}

static dt_result dt__reduce_args(dt_comm *c, const char *fn, dt_dtype t, dt_reduce_op op) {
    if (op < DT_SUM || op > DT_MIN) return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown reduction %d: use DT_SUM, DT_MEAN, DT_MAX or DT_MIN", fn, (int)op);
    if (op == DT_MEAN && t != DT_F32 && t != DT_F64 && !dt__dtype_half(t))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: DT_MEAN needs a floating-point type, not %s: use DT_SUM and divide", fn, dt_dtype_name(t));
    (void)c;
    return DT_OK;
}

static dt_result dt__coll_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, dt_algo algo) {
    dt_result r = dt__comm_check(c, "dt_comm_allreduce", buf, count, t, 0, NULL);
    size_t es, bytes;
    void *s = NULL;
    if (r == DT_OK) r = dt__reduce_args(c, "dt_comm_allreduce", t, op);
    if (r == DT_OK) r = dt__algo_check("dt_comm_allreduce", algo);
    if (r != DT_OK) return r;
    if (!count) buf = dt__nonnull(buf);
    es = dt_dtype_size(t);
    bytes = count * es;
    algo = dt__algo_resolve(c, algo, c->backend->allreduce != NULL && !dt__dtype_half(t));   /* 16 bits: no native path */
    if ((r = dt__coll_start(c, DT__OP_ALLREDUCE, buf, count, t, op, -1, algo)) != DT_OK) return r;
    if (c->size == 1) return DT_OK;
    switch (algo) {
    case DT_ALGO_NATIVE:
        r = dt__native(c, c->backend->allreduce(c, buf, count, t, op == DT_MEAN ? DT_SUM : op, dt_time_now() + c->desc.timeout));
        break;
    case DT_ALGO_RING:
        if ((r = dt__comm_scratch(c, (count / (size_t)c->size + 1) * es, &s)) == DT_OK) r = dt__allreduce_ring(c, buf, count, t, op, s);
        return r;   /* the ring divides for MEAN itself */
    case DT_ALGO_HIER:
        if ((r = dt__comm_scratch(c, bytes + es, &s)) == DT_OK) r = dt__allreduce_hier(c, buf, count, t, op, s);
        break;
    case DT_ALGO_TREE:
        if ((r = dt__comm_scratch(c, bytes + 1, &s)) == DT_OK) r = dt__tree_reduce(c, buf, bytes, t, op, 0, s);
        if (r == DT_OK) r = dt__tree_broadcast(c, buf, bytes, 0);
        break;
    default:
        if ((r = dt__comm_scratch(c, 2 * bytes + 1, &s)) == DT_OK) r = dt__naive_reduce(c, buf, count, t, op, 0, s, (char *)s + bytes);
        if (r == DT_OK) r = dt__naive_broadcast(c, buf, bytes, 0);
        break;
    }
    if (r == DT_OK && op == DT_MEAN) dt__mean_finish(buf, count, t, c->size);
    return r;
}

static dt_result dt__coll_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, int root, dt_algo algo) {
    dt_result r = dt__comm_check(c, "dt_comm_reduce", buf, count, t, root, "root");
    size_t es, bytes;
    char *s = NULL;
    if (r == DT_OK) r = dt__reduce_args(c, "dt_comm_reduce", t, op);
    if (r == DT_OK) r = dt__algo_check("dt_comm_reduce", algo);
    if (r != DT_OK) return r;
    if (!count) buf = dt__nonnull(buf);
    es = dt_dtype_size(t);
    bytes = count * es;
    algo = dt__algo_resolve(c, algo, 0);   /* no backend has a native reduce: NATIVE and AUTO mean RING */
    if ((r = dt__coll_start(c, DT__OP_REDUCE, buf, count, t, op, root, algo)) != DT_OK) return r;
    if (c->size == 1) return DT_OK;
    if ((r = dt__comm_scratch(c, 2 * bytes + es + 1, (void **)&s)) != DT_OK) return r;
    if (algo == DT_ALGO_NAIVE) {
        r = dt__naive_reduce(c, buf, count, t, op, root, s, s + bytes);
    } else if (algo == DT_ALGO_TREE) {   /* non-roots reduce into a copy: their buffer stays as it was */
        char *work = c->rank == root ? (char *)buf : s;
        if (work != buf && bytes) memcpy(work, buf, bytes);
        r = dt__tree_reduce(c, work, bytes, t, op, root, s + bytes);
    } else {   /* ring reduce-scatter on a copy, then every rank sends its reduced chunk to the root */
        int p = c->size, k;
        if (bytes) memcpy(s, buf, bytes);
        r = dt__ring_reduce_scatter(c, s, count, t, op, s + bytes);
        for (k = 0; k < p && r == DT_OK; k++) {
            size_t off = dt__chunk_off(count, p, k) * es, len = dt__chunk_len(count, p, k) * es;
            if (c->rank == root && k == root) { if (len) memcpy((char *)buf + off, s + off, len); }
            else if (c->rank == root) r = dt__recv(c, (char *)buf + off, len, k, t);
            else if (c->rank == k) r = dt__send(c, s + off, len, root, t);
        }
    }
    if (r == DT_OK && op == DT_MEAN && c->rank == root) dt__mean_finish(buf, count, t, c->size);
    return r;
}

static dt_result dt__coll_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    dt_result r = dt__comm_check(c, "dt_comm_scatter", recv, count, t, root, "root");
    size_t bytes;
    int k;
    if (r == DT_OK && c->rank == root && count > 0 && !send) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_scatter: the root's send buffer is NULL");
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    if ((r = dt__coll_start(c, DT__OP_SCATTER, NULL, count, t, 0, root, DT_ALGO_NAIVE)) != DT_OK) return r;
    if (c->rank != root) return dt__recv(c, recv, bytes, root, t);
    for (k = 0; k < c->size && r == DT_OK; k++) {
        if (k == root) { if (bytes) memmove(recv, (const char *)send + (size_t)k * bytes, bytes); }
        else r = dt__send(c, (const char *)send + (size_t)k * bytes, bytes, k, t);
    }
    return r;
}

static dt_result dt__coll_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    dt_result r = dt__comm_check(c, "dt_comm_gather", send, count, t, root, "root");
    size_t bytes;
    int k;
    if (r == DT_OK && c->rank == root && count > 0 && !recv) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_gather: the root's receive buffer is NULL");
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    if ((r = dt__coll_start(c, DT__OP_GATHER, NULL, count, t, 0, root, DT_ALGO_NAIVE)) != DT_OK) return r;
    if (c->rank != root) return dt__send(c, send, bytes, root, t);
    for (k = 0; k < c->size && r == DT_OK; k++) {
        if (k == root) { if (bytes) memmove((char *)recv + (size_t)k * bytes, send, bytes); }
        else r = dt__recv(c, (char *)recv + (size_t)k * bytes, bytes, k, t);
    }
    return r;
}

static dt_result dt__coll_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    dt_result r = dt__comm_check(c, "dt_comm_allgather", send, count, t, 0, NULL);
    size_t bytes;
    if (r == DT_OK && count > 0 && !recv) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_allgather: receive buffer is NULL");
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    if ((r = dt__coll_start(c, DT__OP_ALLGATHER, NULL, count, t, 0, -1, DT_ALGO_RING)) != DT_OK) return r;
    if (bytes) memmove((char *)recv + (size_t)c->rank * bytes, send, bytes);
    if (c->size == 1) return DT_OK;
    return dt__ring_allgather(c, recv, count * (size_t)c->size, t);   /* p equal chunks of count */
}

static dt_result dt__coll_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_reduce_op op) {
    dt_result r = dt__comm_check(c, "dt_comm_reduce_scatter", send, count, t, 0, NULL);
    size_t bytes, es;
    char *s = NULL;
    if (r == DT_OK && count > 0 && !recv) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_reduce_scatter: receive buffer is NULL");
    if (r == DT_OK) r = dt__reduce_args(c, "dt_comm_reduce_scatter", t, op);
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    es = dt_dtype_size(t);
    bytes = count * es;
    if ((r = dt__coll_start(c, DT__OP_REDUCE_SCATTER, NULL, count, t, op, -1, DT_ALGO_RING)) != DT_OK) return r;
    if ((r = dt__comm_scratch(c, bytes * (size_t)(c->size + 1) + 1, (void **)&s)) != DT_OK) return r;
    if (bytes) memcpy(s, send, bytes * (size_t)c->size);
    if (c->size > 1) r = dt__ring_reduce_scatter(c, s, count * (size_t)c->size, t, op, s + bytes * (size_t)c->size);
    if (r == DT_OK && op == DT_MEAN) dt__mean_finish(s + (size_t)c->rank * bytes, count, t, c->size);
    if (r == DT_OK && bytes) memcpy(recv, s + (size_t)c->rank * bytes, bytes);
    return r;
}

static dt_result dt__coll_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    dt_result r = dt__comm_check(c, "dt_comm_alltoall", send, count, t, 0, NULL);
    size_t bytes, all;
    dt_algo algo;
    if (r == DT_OK && count > 0 && !recv) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_alltoall: receive buffer is NULL");
    if (r != DT_OK) return r;
    bytes = count * dt_dtype_size(t);
    all = bytes * (size_t)c->size;
    if (count > 0 && (const char *)send < (char *)recv + all && (char *)recv < (const char *)send + all)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_alltoall: the send and receive buffers overlap; all-to-all does not work in "
                            "place: give it a receive buffer of its own (size * count elements)");
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    algo = dt__algo_resolve(c, DT_ALGO_AUTO, c->backend->alltoall != NULL) == DT_ALGO_NATIVE ? DT_ALGO_NATIVE : DT_ALGO_NAIVE;
    if ((r = dt__coll_start(c, DT__OP_ALLTOALL, NULL, count, t, 0, -1, algo)) != DT_OK) return r;
    if (algo == DT_ALGO_NATIVE && c->size > 1) return dt__native(c, c->backend->alltoall(c, send, recv, bytes, dt_time_now() + c->desc.timeout));
    return dt__alltoall_even(c, send, recv, bytes);
}

/* The blocks' checks: arrays given, each block's end within what size_t can address, a buffer where a
   block is not empty. side: "send" or "receive". */
static dt_result dt__blocks_check(const dt_comm *c, const void *buf, const size_t *counts, const size_t *displs, size_t es, const char *side) {
    int k;
    if (!counts || !displs) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_alltoallv: the %s counts or displacements are NULL", side);
    for (k = 0; k < c->size; k++) {
        if (counts[k] > (SIZE_MAX / 4) / es || displs[k] > (SIZE_MAX / 4) / es - counts[k])
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_alltoallv: %s block %d (%zu elements at %zu) is too large", side, k, counts[k], displs[k]);
        if (counts[k] && !buf) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_alltoallv: the %s buffer is NULL with block %d of %zu elements", side, k, counts[k]);
    }
    return DT_OK;
}
static dt_result dt__coll_alltoallv(dt_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                                    void *recv, const size_t *rcounts, const size_t *rdispls, dt_dtype t) {
    dt_result r = dt__comm_check(c, "dt_comm_alltoallv", NULL, 0, t, 0, NULL);
    dt__blocks sb, rb;
    if (r == DT_OK) r = dt__blocks_check(c, send, scounts, sdispls, dt_dtype_size(t), "send");
    if (r == DT_OK) r = dt__blocks_check(c, recv, rcounts, rdispls, dt_dtype_size(t), "receive");
    if (r != DT_OK) return r;
    sb.counts = scounts; sb.displs = sdispls; rb.counts = rcounts; rb.displs = rdispls;
    sb.unit = rb.unit = dt_dtype_size(t);
    if ((r = dt__coll_start(c, DT__OP_ALLTOALLV, NULL, 0, t, 0, -1, DT_ALGO_NAIVE)) != DT_OK) return r;
    return dt__alltoall_pairwise(c, dt__nonnull(send), &sb, dt__nonnull(recv), &rb);
}

static dt_result dt__coll_neighbor_exchange(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                                            const dt_neighbors *nb) {
    const char *fn = "dt_comm_neighbor_exchange";
    dt_result r = dt__comm_check(c, fn, send, count, t, 0, NULL);
    const int *to = nb ? nb->to : NULL, *from = nb ? nb->from : NULL;
    int nto = nb ? nb->nto : 0, nfrom = nb ? nb->nfrom : 0;
    size_t bytes;
    dt_request *q = NULL;
    int i;
    if (r == DT_OK && !nb)
        r = dt_set_error(DT_ERR_INVALID_ARG, "%s: the neighbours are NULL; pass a dt_neighbors (zeroed: none)", fn);
    else if (r == DT_OK && (nto < 0 || (nto > 0 && !to)))
        r = dt_set_error(DT_ERR_INVALID_ARG, "%s: nto is %d and to %s; give to [nto] ranks, nto >= 0", fn, nto,
                         to ? "is set" : "is NULL");
    else if (r == DT_OK && (nfrom < 0 || (nfrom > 0 && !from)))
        r = dt_set_error(DT_ERR_INVALID_ARG, "%s: nfrom is %d and from %s; give from [nfrom] ranks, nfrom >= 0", fn, nfrom,
                         from ? "is set" : "is NULL");
    else if (r == DT_OK && nfrom > 0 && count > 0 && !recv)
        r = dt_set_error(DT_ERR_INVALID_ARG, "%s: recv is NULL; it must hold nfrom x count = %d x %zu elements", fn, nfrom,
                         count);
    for (i = 0; r == DT_OK && i < nto + nfrom; i++) {
        int k = i < nto ? to[i] : from[i - nto];
        if (k < 0 || k >= c->size)
            r = dt_set_error(DT_ERR_INVALID_ARG, "%s: neighbour %d (%s[%d]) is not a rank (0..%d)", fn, k,
                             i < nto ? "to" : "from", i < nto ? i : i - nto, c->size - 1);
    }
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    if ((r = dt__coll_start(c, DT__OP_NEIGHBOR, NULL, count, t, 0, -1, DT_ALGO_NAIVE)) != DT_OK) return r;
    if (nto + nfrom == 0) return DT_OK;   /* a rank with no neighbours has nothing to do (and no requests) */
    if ((r = dt__comm_reqs(c, nto + nfrom, &q)) != DT_OK) return r;
    memset(q, 0, (size_t)(nto + nfrom) * sizeof *q);
    for (i = 0; i < nfrom && r == DT_OK; i++) r = dt__irecv(c, (char *)recv + (size_t)i * bytes, bytes, from[i], dt_comm_coll_tag(c), dt__rq(&q[nto + i]));
    for (i = 0; i < nto && r == DT_OK; i++) r = dt__isend(c, send, bytes, to[i], dt_comm_coll_tag(c), dt__rq(&q[i]));
    for (i = 0; i < nto + nfrom && r == DT_OK; i++) r = dt__wait(c, dt__rq(&q[i]), 1);
    if (r != DT_OK) dt__cancel_all(c, q, nto + nfrom);
    return r;
}

/* The public collectives: the bodies above inside the span that dt__coll_start opens. */
dt_result dt_comm_barrier(dt_comm *c) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_barrier(c));
}
dt_result dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_algo algo) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_broadcast(c, buf, count, t, root, algo));
}
dt_result dt_comm_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, int root, dt_algo algo) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_reduce(c, buf, count, t, op, root, algo));
}
dt_result dt_comm_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, dt_algo algo) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_allreduce(c, buf, count, t, op, algo));
}
dt_result dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_scatter(c, send, recv, count, t, root));
}
dt_result dt_comm_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_gather(c, send, recv, count, t, root));
}
dt_result dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_allgather(c, send, recv, count, t));
}
dt_result dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_reduce_op op) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_reduce_scatter(c, send, recv, count, t, op));
}
dt_result dt_comm_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_alltoall(c, send, recv, count, t));
}
dt_result dt_comm_alltoallv(dt_comm *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                            void *recv, const size_t *recvcounts, const size_t *rdispls, dt_dtype t) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_alltoallv(c, send, sendcounts, sdispls, recv, recvcounts, rdispls, t));
}
dt_result dt_comm_neighbor_exchange(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                                    const dt_neighbors *nb) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_neighbor_exchange(c, send, recv, count, t, nb));
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
