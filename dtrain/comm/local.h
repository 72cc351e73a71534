/* dtrain/comm/local.h - the self and local backends: ranks as threads of this process.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_comm_create_self (one rank) and dt_comm_create_local (n ranks as threads): a backend written
     against dtrain/comm/backend.h like dtrain_mpi.h. Rendezvous messages copied once from the sender's
     buffer to the receiver's, waits that spin briefly and then sleep, native collectives over shared
     memory, the mismatch check of two ranks' signatures, a rank that has gone waking everyone waiting
     for it, and an optional link model of a slow network (whose nodes' ranks share a port).
   USES
     dtrain/comm/algos.h (under the link model the native collectives run the algorithms) and what it
     includes.
   READ FIRST
     dt__local_isend, dt__local_wait, dt__local_allreduce, dt_comm_create_local.
*/
#ifndef DTRAIN_LOCAL_H
#define DTRAIN_LOCAL_H
#include "algos.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator of one rank: every collective is a no-op or a copy, messages to itself are delivered.
   The same program is its own single-process baseline. Free with dt_comm_destroy. */
dt_result dt_comm_create_self(dt_comm **out, const dt_comm_desc *desc);
/* n local ranks in this process, for a caller that runs its own threads: out[0..n) are the ranks'
   communicators; each must be used by one thread only. Free each with dt_comm_destroy (after every rank
   has finished). Most programs use dt_launch instead. */
dt_result dt_comm_create_local(dt_comm **out, int n, const dt_comm_desc *desc);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_LOCAL_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_LOCAL_IMPLEMENTATION_DONE)
#define DTRAIN_LOCAL_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

/* ---- the local backend: ranks as threads of this process ----------------------------------------
   Messages are rendezvous: isend and irecv each look for their partner in the destination's queues
   under that rank's mutex; whichever arrives second unlinks both and copies the data once, straight
   from the sender's buffer to the receiver's, then marks both requests done and wakes their owners.
   A rank that waits spins briefly only when there are no more ranks than cores, then sleeps on its
   condition variable, so waiting ranks leave the cores to working ones. Native collectives meet at a
   barrier and read each other's buffers directly. Every wait has a deadline, and a rank that has gone
   (its function returned, its communicator failed, its thread exited) wakes everyone waiting for it. */

typedef struct dt__lrank {
    dt__mutex   mu;
    dt__cond    cv;
    dt__req    *inbox, *inbox_tail;     /* sends to this rank not yet matched */
    dt__req    *posted, *posted_tail;   /* this rank's receives not yet matched */
    int         gone;                   /* atomic: 1 once the rank has left or failed */
    dt_result   gone_result;
    char        gone_msg[320];
    const void *ptr;                    /* native collectives: the buffer this rank published */
    char        pad[64];
} dt__lrank;

typedef struct dt__lworld {
    int        n, refs, spin;           /* spin: ranks <= cores, waiting may poll for a few microseconds */
    dt__mutex  mu;                      /* barrier state and reference count */
    dt__cond   cv;
    uint64_t   bar_gen;                 /* atomic: barriers completed */
    int        bar_count;
    uint64_t  *bar_sig;                 /* [n][3] signatures of the ranks in the current barrier */
    int        bar_bad[2];              /* per generation parity: a rank whose signature differs, or -1 */
    uint64_t   bar_badsig[2][6];        /* ... rank 0's signature and that rank's */
    double     latency, bandwidth;      /* link model; both 0 = off */
    double    *link_free;               /* [2][n]: when node i's port is next free to send, to receive */
    dt__mutex  link_mu;                 /* the ports: the ranks of a node share one */
    char      *small;                   /* [2][n][DT__LOCAL_SMALL] slots for small native all-reduces */
    dt__lrank *r;
    dt_comm  **comms;
    char       cause[400];              /* the first failure that was not DT_ERR_PEER: the root cause */
} dt__lworld;

#define DT__LOCAL_SMALL 65536            /* bytes: below, a native all-reduce copies into shared slots */
#define DT__SPIN_SECONDS 50e-6           /* how long a waiting rank polls before it sleeps, when ranks <= cores */
#define DT__YIELD_SECONDS 200e-6         /* ... and how long it yields the core first, when ranks > cores */

static void dt__local_free_world(dt__lworld *W) {
    int i;
    if (!W) return;
    for (i = 0; W->r && i < W->n; i++) { dt__cond_destroy(&W->r[i].cv); dt__mutex_destroy(&W->r[i].mu); }
    dt__cond_destroy(&W->cv);
    dt__mutex_destroy(&W->mu);
    dt__mutex_destroy(&W->link_mu);
    DT_FREE(W->r); DT_FREE(W->comms); DT_FREE(W->bar_sig); DT_FREE(W->link_free); DT_FREE(W->small);
    DT_FREE(W);
}

/* Tags match: a collective's by its number alone (the signatures are compared on delivery), others exactly. */
static int dt__ltag_eq(int a, int b) {
    int sa = dt_comm_tag_seq(a), sb = dt_comm_tag_seq(b);
    return sa >= 0 && sb >= 0 ? sa == sb : a == b;
}
static void dt__lq_push(dt__req **head, dt__req **tail, dt__req *q) {
    q->next = NULL;
    if (*tail) (*tail)->next = q; else *head = q;
    *tail = q;
}
static int dt__lq_unlink(dt__req **head, dt__req **tail, dt__req *q) {
    dt__req *prev = NULL, *it;
    for (it = *head; it; prev = it, it = it->next)
        if (it == q) {
            if (prev) prev->next = it->next; else *head = it->next;
            if (*tail == it) *tail = prev;
            return 1;
        }
    return 0;
}
static void dt__local_sleep_until(dt__lworld *W, int me, double t) {
    double now;
    dt__mutex_lock(&W->r[me].mu);
    while ((now = dt_time_now()) < t) dt__cond_wait_for(&W->r[me].cv, &W->r[me].mu, t - now);
    dt__mutex_unlock(&W->r[me].mu);
}
/* Polls *state for a few microseconds when spinning pays (no more ranks than cores); otherwise yields
   once. Returns 1 when it saw want. */
static void dt__cpu_relax(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#endif
}
/* One round of polling before a wait goes to sleep; returns 0 when the polling time since start is
   spent. With no more ranks than cores the waiter spins on its own core; with more, it yields the core
   to a rank that has work, and only keeps doing so for a short while. */
static int dt__local_keep_polling(const dt__lworld *W, double start) {
    int i;
    if (!W->spin) { sched_yield(); return dt_time_now() - start < DT__YIELD_SECONDS; }
    for (i = 0; i < 64; i++) dt__cpu_relax();
    return dt_time_now() - start < DT__SPIN_SECONDS;
}
static int dt__local_spin(const dt__lworld *W, const volatile int *state, int want) {
    double start = dt_time_now();
    while (DT__ATOMIC_LOAD(state) != want)
        if (!dt__local_keep_polling(W, start)) return 0;
    return 1;
}

static void dt__local_complete(dt__lworld *W, dt__req *q) {
    dt__lrank *o = &W->r[q->m.owner];
    dt__mutex_lock(&o->mu);
    DT__ATOMIC_STORE(&q->m.state, DT_REQ_DONE);
    dt__cond_broadcast(&o->cv);
    dt__mutex_unlock(&o->mu);
}
/* s and r are matched and unlinked: check that they belong together, copy, complete both. */
static void dt__local_deliver(dt__lworld *W, dt__req *s, dt__req *r) {
    if (dt_comm_tag_seq(s->m.tag) >= 0 && (s->sig[0] != r->sig[0] || s->sig[1] != r->sig[1] || s->sig[2] != r->sig[2])) {
        memcpy(s->m.impl, r->sig, sizeof r->sig);   /* each side keeps the other's signature for its report */
        memcpy(r->m.impl, s->sig, sizeof s->sig);
        s->error = r->error = DT_ERR_MISMATCH;
    } else if (s->m.bytes > r->m.bytes) {
        s->m.impl[3] = r->m.bytes;
        r->m.impl[3] = s->m.bytes;
        s->error = r->error = DT_ERR_MISMATCH;
    } else {
        if (s->m.bytes) memcpy(r->m.rbuf, s->m.sbuf, s->m.bytes);
        r->m.received = s->m.bytes;
        if (W->latency > 0 || W->bandwidth > 0) r->not_before = s->not_before + W->latency;
    }
    dt__local_complete(W, s);
    dt__local_complete(W, r);
}

/* Rank k has gone. When it failed only because another rank did, the report names the root cause
   rather than nesting one report in the next. */
static dt_result dt__local_gone_error(dt__lworld *W, int k) {
    const char *m = W->r[k].gone_msg;
    if (W->r[k].gone_result == DT_OK) return dt_set_error(DT_ERR_PEER, "rank %d has finished (its function returned DT_OK) and will not send or receive any more", k);
    if (W->r[k].gone_result == DT_ERR_PEER) {
        dt__mutex_lock(&W->mu);
        dt_set_error(DT_ERR_PEER, "rank %d has failed because another did%s%s", k, W->cause[0] ? "; the first failure: " : "", W->cause);
        dt__mutex_unlock(&W->mu);
        return DT_ERR_PEER;
    }
    return dt_set_error(DT_ERR_PEER, "rank %d has failed (%s)%s%s", k, dt_result_str(W->r[k].gone_result), m[0] ? ": " : "", m);
}

/* The link model's two ports, for one message of t seconds (bytes / bandwidth) posted at now: each port is a
   queue of its own (*out, *in: when it has carried what it was given), which the message adds t to, and the
   message has arrived when both have carried it (the caller adds the latency). So a port is never held idle
   by the other: a busy receiver does not keep the sender from sending to someone else meanwhile (the switch
   buffers), and a ring's step, where every rank sends to both neighbours, takes each port's 2 t. */
static double dt__link_reserve(double *out, double *in, double now, double t) {
    *out = (*out > now ? *out : now) + t;
    *in = (*in > now ? *in : now) + t;
    return *out > *in ? *out : *in;
}

static dt_result dt__local_isend(dt_comm *c, dt_message *msg) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt__req *q = (dt__req *)msg, *it;
    int me = dt_comm_rank(c), dst = msg->peer, tag = msg->tag;
    dt__lrank *d = &W->r[dst];
    if (DT__ATOMIC_LOAD(&d->gone) && dst != me) return dt__local_gone_error(W, dst);
    dt__mutex_lock(&d->mu);
    if ((W->latency > 0 || W->bandwidth > 0) && dt__node_of(c, dst) != dt__node_of(c, me)) {
        /* the link model: each node (each rank, unless ranks are grouped into nodes) has one full-duplex
           port to a switch; the message takes bytes / bandwidth on the sender's port and then on the
           receiver's (dt__link_reserve), and arrives latency seconds after. Messages inside a node do not
           use the port. */
        double *out = &W->link_free[dt__node_of(c, me)], *in = &W->link_free[W->n + dt__node_of(c, dst)];
        dt__mutex_lock(&W->link_mu);
        q->not_before = dt__link_reserve(out, in, dt_time_now(), W->bandwidth > 0 ? (double)msg->bytes / W->bandwidth : 0.0);
        dt__mutex_unlock(&W->link_mu);
    }
    for (it = d->posted; it; it = it->next)
        if (it->m.peer == me && dt__ltag_eq(it->m.tag, tag)) break;
    if (it) {
        dt__lq_unlink(&d->posted, &d->posted_tail, it);
        DT__ATOMIC_STORE(&it->m.state, DT_REQ_MATCHED);
        DT__ATOMIC_STORE(&q->m.state, DT_REQ_MATCHED);
        dt__mutex_unlock(&d->mu);
        dt__local_deliver(W, q, it);
        return DT_OK;
    }
    dt__lq_push(&d->inbox, &d->inbox_tail, q);
    dt__mutex_unlock(&d->mu);
    return DT_OK;
}

static dt_result dt__local_irecv(dt_comm *c, dt_message *msg) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt__lrank *me = &W->r[dt_comm_rank(c)];
    dt__req *q = (dt__req *)msg, *it;
    dt__mutex_lock(&me->mu);
    for (it = me->inbox; it; it = it->next)
        if (it->m.owner == msg->peer && dt__ltag_eq(it->m.tag, msg->tag)) break;
    if (it) {
        dt__lq_unlink(&me->inbox, &me->inbox_tail, it);
        DT__ATOMIC_STORE(&it->m.state, DT_REQ_MATCHED);
        DT__ATOMIC_STORE(&q->m.state, DT_REQ_MATCHED);
        dt__mutex_unlock(&me->mu);
        dt__local_deliver(W, it, q);
        return DT_OK;
    }
    dt__lq_push(&me->posted, &me->posted_tail, q);
    dt__mutex_unlock(&me->mu);
    return DT_OK;
}

/* Withdraws q if no one has matched it yet; if its copy is under way, waits for the copy to finish. */
static void dt__local_cancel(dt_comm *c, dt_message *msg) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt__req *q = (dt__req *)msg;
    dt__lrank *holder = &W->r[q->m.kind == DT_REQ_SEND ? q->m.peer : q->m.owner], *me = &W->r[q->m.owner];
    int st;
    if (q->m.kind == DT_REQ_NONE) return;
    dt__mutex_lock(&holder->mu);
    st = DT__ATOMIC_LOAD(&q->m.state);
    if (st == DT_REQ_POSTED) {
        if (q->m.kind == DT_REQ_SEND) dt__lq_unlink(&holder->inbox, &holder->inbox_tail, q);
        else dt__lq_unlink(&holder->posted, &holder->posted_tail, q);
        DT__ATOMIC_STORE(&q->m.state, DT_REQ_CANCELLED);
    }
    dt__mutex_unlock(&holder->mu);
    if (st != DT_REQ_MATCHED) return;
    dt__mutex_lock(&me->mu);
    while (DT__ATOMIC_LOAD(&q->m.state) != DT_REQ_DONE) dt__cond_wait_for(&me->cv, &me->mu, 0.01);
    dt__mutex_unlock(&me->mu);
}

static dt_result dt__mismatch_error(int peer, const uint64_t *mine, const uint64_t *theirs) {
    char a[128], b[128];
    dt__sig_str(mine, a, sizeof a);
    dt__sig_str(theirs, b, sizeof b);
    return dt_set_error(DT_ERR_MISMATCH, "rank %d called %s where this rank called %s: every rank must make the same collective calls in the same order, with the same count, type, op and root",
                        peer, b, a);
}
/* Whether rank k is in this rank's current collective (same sequence number) with another signature,
   which it then copies to other. Reads k's published signature as a seqlock: no lock needed. */
static int dt__local_peer_differs(const dt__lworld *W, const dt_comm *c, int k, uint64_t *other) {
    const dt_comm *o = W->comms[k];
    const uint64_t *coll = o ? dt__comm_coll_sig(o) : NULL;
    uint64_t s0, s1, s2;
    if (!o || k == dt_comm_rank(c) || (dt__comm_sig(c)[2] & 0xff) == DT__OP_P2P) return 0;
    if ((s0 = DT__ATOMIC_LOAD(&coll[0])) != dt__comm_sig(c)[0]) return 0;
    s1 = DT__ATOMIC_LOAD(&coll[1]);
    s2 = DT__ATOMIC_LOAD(&coll[2]);
    if (DT__ATOMIC_LOAD(&coll[0]) != s0 || (s1 == dt__comm_sig(c)[1] && s2 == dt__comm_sig(c)[2])) return 0;
    other[0] = s0; other[1] = s1; other[2] = s2;
    return 1;
}

/* The report for a request that completed with an error. */
static dt_result dt__local_req_error(dt__req *q) {
    if (q->m.impl[3]) {
        if (q->m.kind == DT_REQ_RECV)
            return dt_set_error(DT_ERR_MISMATCH, "rank %d sent %llu bytes, more than the %zu this receive accepts", q->m.peer, (unsigned long long)q->m.impl[3], q->m.bytes);
        return dt_set_error(DT_ERR_MISMATCH, "rank %d accepts only %llu bytes and this message has %zu", q->m.peer, (unsigned long long)q->m.impl[3], q->m.bytes);
    }
    return dt__mismatch_error(q->m.peer, q->sig, q->m.impl);
}
static dt_result dt__local_finish(dt__lworld *W, int me, dt__req *q) {
    if (q->not_before > 0 && dt_time_now() < q->not_before) dt__local_sleep_until(W, me, q->not_before);
    if (q->error != DT_OK) {   /* the report reads the kind: which side this rank was */
        dt_result r = dt__local_req_error(q);
        q->m.kind = DT_REQ_NONE;
        return r;
    }
    return DT_OK;
}

static dt_result dt__local_wait(dt_comm *c, dt_message *msg, double deadline) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt__req *q = (dt__req *)msg;
    dt__lrank *me = &W->r[dt_comm_rank(c)];
    if (DT__ATOMIC_LOAD(&q->m.state) == DT_REQ_CANCELLED) return dt_set_error(DT_ERR_STATE, "the request was cancelled");
    if (DT__ATOMIC_LOAD(&q->m.state) != DT_REQ_DONE && !dt__local_spin(W, &q->m.state, DT_REQ_DONE)) {
        dt__mutex_lock(&me->mu);
        while (DT__ATOMIC_LOAD(&q->m.state) != DT_REQ_DONE) {
            double now = dt_time_now();
            int gone = q->m.peer != dt_comm_rank(c) && DT__ATOMIC_LOAD(&W->r[q->m.peer].gone);
            uint64_t other[3];
            int differs = dt_comm_tag_seq(q->m.tag) >= 0 && dt__local_peer_differs(W, c, q->m.peer, other);
            if (gone || differs || now >= deadline) {
                dt__mutex_unlock(&me->mu);
                dt__local_cancel(c, msg);
                if (DT__ATOMIC_LOAD(&q->m.state) == DT_REQ_DONE) return dt__local_finish(W, dt_comm_rank(c), q);   /* it made it after all */
                if (gone) return dt__local_gone_error(W, q->m.peer);
                if (differs) return dt__mismatch_error(q->m.peer, dt__comm_sig(c), other);
                return dt_set_error(DT_ERR_TIMEOUT, "no %s rank %d within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)",
                                    q->m.kind == DT_REQ_SEND ? "receive was posted by" : "message came from", q->m.peer, dt_comm_get_desc(c).timeout);
            }
            dt__cond_wait_for(&me->cv, &me->mu, deadline - now);
        }
        dt__mutex_unlock(&me->mu);
    }
    return dt__local_finish(W, dt_comm_rank(c), q);
}

static dt_result dt__local_test(dt_comm *c, dt_message *msg, int *done) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt__req *q = (dt__req *)msg;
    *done = 0;
    if (DT__ATOMIC_LOAD(&q->m.state) == DT_REQ_DONE) {
        if (q->not_before > 0 && dt_time_now() < q->not_before) return DT_OK;
        *done = 1;
        return q->error != DT_OK ? dt__local_req_error(q) : DT_OK;
    }
    if (q->m.peer != dt_comm_rank(c) && DT__ATOMIC_LOAD(&W->r[q->m.peer].gone)) {
        dt__local_cancel(c, msg);
        if (DT__ATOMIC_LOAD(&q->m.state) != DT_REQ_DONE) return dt__local_gone_error(W, q->m.peer);
    }
    return DT_OK;
}

/* The rank whose departure keeps the barrier from completing, or -1. W->mu held. */
static int dt__local_gone_rank(dt__lworld *W, int me) {
    int k;
    for (k = 0; k < W->n; k++)
        if (k != me && DT__ATOMIC_LOAD(&W->r[k].gone)) return k;
    return -1;
}
/* The barrier of native collectives. The last rank to arrive compares everyone's signature before it
   releases the others, so a mismatch is reported by every rank, the same way. A rank that gives up
   (a rank gone, another collective, the timeout) withdraws its arrival, so the barrier can never
   complete without it: the others must not go on to read its buffer. */
static dt_result dt__local_barrier(dt_comm *c, double deadline) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    int n = W->n, me = dt_comm_rank(c), k;
    uint64_t gen, other[3];
    double t0 = dt_time_now();
    dt_result r = DT_OK;
    dt__mutex_lock(&W->mu);
    gen = W->bar_gen;
    if ((k = dt__local_gone_rank(W, me)) >= 0) { dt__mutex_unlock(&W->mu); return dt__local_gone_error(W, k); }
    memcpy(&W->bar_sig[(size_t)me * 3], dt__comm_sig(c), 3 * sizeof(uint64_t));
    if (++W->bar_count == n) {
        int bad = -1;
        for (k = 1; k < n && bad < 0; k++)
            if (memcmp(&W->bar_sig[(size_t)k * 3], W->bar_sig, 3 * sizeof(uint64_t)) != 0) bad = k;
        W->bar_bad[gen & 1] = bad;
        if (bad >= 0) {
            memcpy(W->bar_badsig[gen & 1], W->bar_sig, 3 * sizeof(uint64_t));
            memcpy(W->bar_badsig[gen & 1] + 3, &W->bar_sig[(size_t)bad * 3], 3 * sizeof(uint64_t));
        }
        W->bar_count = 0;
        DT__ATOMIC_STORE(&W->bar_gen, gen + 1);
        dt__cond_broadcast(&W->cv);
        dt__mutex_unlock(&W->mu);
    } else {
        dt__mutex_unlock(&W->mu);
        while (DT__ATOMIC_LOAD(&W->bar_gen) == gen && dt__local_keep_polling(W, t0)) {}
        dt__mutex_lock(&W->mu);
        while (DT__ATOMIC_LOAD(&W->bar_gen) == gen) {
            double now = dt_time_now();
            int gone = dt__local_gone_rank(W, me), bad = -1;
            for (k = 0; gone < 0 && bad < 0 && k < n; k++)
                if (dt__local_peer_differs(W, c, k, other)) bad = k;
            if (gone >= 0 || bad >= 0 || now >= deadline) {
                W->bar_count--;
                dt__mutex_unlock(&W->mu);   /* before the reports, which may take it */
                dt__comm_stats(c)->wait_seconds += dt_time_now() - t0;
                if (gone >= 0) return dt__local_gone_error(W, gone);
                if (bad >= 0) return dt__mismatch_error(bad, dt__comm_sig(c), other);
                return dt_set_error(DT_ERR_TIMEOUT, "not every rank arrived within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)", dt_comm_get_desc(c).timeout);
            }
            dt__cond_wait_for(&W->cv, &W->mu, deadline - now);
        }
        dt__mutex_unlock(&W->mu);
    }
    dt__comm_stats(c)->wait_seconds += dt_time_now() - t0;
    if (W->bar_bad[gen & 1] >= 0) {
        char a[128], b[128];
        dt__sig_str(W->bar_badsig[gen & 1], a, sizeof a);
        dt__sig_str(W->bar_badsig[gen & 1] + 3, b, sizeof b);
        r = dt_set_error(DT_ERR_MISMATCH, "rank 0 called %s but rank %d called %s: every rank must make the same collective calls in the same order, with the same count, type, op and root",
                         a, W->bar_bad[gen & 1], b);
    }
    return r;
}

static dt_result dt__local_broadcast(dt_comm *c, void *buf, size_t bytes, int root, double deadline) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt_result r;
    if (W->latency > 0 || W->bandwidth > 0) return dt__tree_broadcast(c, buf, bytes, root);   /* messages feel the link model */
    dt_comm_count_native(c, bytes, 1);
    W->r[dt_comm_rank(c)].ptr = buf;
    if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
    if (dt_comm_rank(c) != root && bytes) memcpy(buf, W->r[root].ptr, bytes);
    return dt__local_barrier(c, deadline);   /* the root's buffer is read until everyone passes here */
}

/* Native all-reduce. Small: each rank copies its data into its slot (double-buffered by barrier
   generation), one barrier, then every rank reduces all slots in rank order. Large: after a barrier
   every buffer is published; rank r reduces slice r of all of them in rank order and writes the result
   into slice r of every buffer (nobody else reads or writes slice r), and a second barrier ends it:
   each byte is read once and written once per rank, no staging copy. Either way element i is
   ((x0 op x1) op x2) ..., the order NAIVE uses too. (A rank that gives up at the second barrier after
   the timeout returns while a stalled rank may still write its slice into that buffer later.) */
static dt_result dt__local_allreduce(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, double deadline) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    size_t es = dt_dtype_size(t), bytes = n * es;
    int p = W->n, me = dt_comm_rank(c), k;
    dt_result r;
    if (W->latency > 0 || W->bandwidth > 0) {
        /* messages feel the link model: the ring, or the binomial tree where the model makes it faster
           (2 ceil(log2 p) messages of the whole buffer against the ring's 2 (p - 1) of a p-th: short ones) */
        void *s = NULL;
        double per = W->bandwidth > 0 ? (double)bytes / W->bandwidth : 0.0;
        int lg = 0;
        while ((1 << lg) < p) lg++;
        if (2.0 * lg * (W->latency + per) < 2.0 * (p - 1) * (W->latency + per / p)) {
            if ((r = dt__comm_scratch(c, bytes + 1, &s)) != DT_OK) return r;
            if ((r = dt__tree_reduce(c, buf, bytes, t, op, 0, s)) != DT_OK) return r;
            return dt__tree_broadcast(c, buf, bytes, 0);
        }
        if ((r = dt__comm_scratch(c, (n / (size_t)p + 1) * es, &s)) != DT_OK) return r;
        return dt__allreduce_ring(c, buf, n, t, op, s);
    }
    dt_comm_count_native(c, bytes, 2);
    if (bytes <= DT__LOCAL_SMALL) {
        uint64_t gen = DT__ATOMIC_LOAD(&W->bar_gen);
        char *slots = W->small + (size_t)(gen & 1) * (size_t)p * DT__LOCAL_SMALL;
        if (bytes) memcpy(slots + (size_t)me * DT__LOCAL_SMALL, buf, bytes);
        if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
        if (bytes) memcpy(buf, slots, bytes);
        for (k = 1; k < p; k++) dt__reduce_into(buf, slots + (size_t)k * DT__LOCAL_SMALL, n, t, op);
        return DT_OK;
    }
    W->r[me].ptr = buf;
    if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
    {
        size_t lo = dt__chunk_off(n, p, me), len = dt__chunk_len(n, p, me), i;
        double tmp[1024];   /* 8 KiB: a block of any element type */
        size_t blk = sizeof tmp / es;
        for (i = 0; i < len; i += blk) {
            size_t m = len - i < blk ? len - i : blk, off = (lo + i) * es;
            memcpy(tmp, (const char *)W->r[0].ptr + off, m * es);
            for (k = 1; k < p; k++) dt__reduce_into(tmp, (const char *)W->r[k].ptr + off, m, t, op);
            for (k = 0; k < p; k++) memcpy((char *)W->r[k].ptr + off, tmp, m * es);   /* only this rank touches slice me */
        }
    }
    return dt__local_barrier(c, deadline);   /* every slice of every buffer is written when all pass here */
}

/* Native all-to-all: every rank publishes its send buffer; after a barrier each copies its block out of
   everyone's, and a second barrier keeps the send buffers until all have. Under the link model the
   blocks travel as messages (pairwise exchange), so they feel it. */
static dt_result dt__local_alltoall(dt_comm *c, const void *send, void *recv, size_t bytes, double deadline) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    int p = W->n, me = dt_comm_rank(c), k;
    dt_result r;
    if (W->latency > 0 || W->bandwidth > 0) return dt__alltoall_even(c, send, recv, bytes);
    dt_comm_count_native(c, bytes * (size_t)p, 1);
    W->r[me].ptr = send;
    if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
    for (k = 0; k < p && bytes; k++) memcpy((char *)recv + (size_t)k * bytes, (const char *)W->r[k].ptr + (size_t)me * bytes, bytes);
    return dt__local_barrier(c, deadline);
}

static void dt__local_missing(dt_comm *c, uint64_t seq, char *msg, size_t cap) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    size_t len = 0;
    int k, any = 0;
    msg[0] = 0;
    for (k = 0; k < W->n && len + 48 < cap; k++) {
        uint64_t s;
        int n;
        if (k == dt_comm_rank(c)) continue;
        if (!W->comms[k]) continue;
        s = DT__ATOMIC_LOAD(&W->comms[k]->seq);
        if (DT__ATOMIC_LOAD(&W->r[k].gone)) n = snprintf(msg + len, cap - len, "%s%d (%s)", any ? ", " : "ranks not in it: ", k, W->r[k].gone_result == DT_OK ? "finished" : "failed");
        else if (s < seq) n = snprintf(msg + len, cap - len, "%s%d (at #%llu)", any ? ", " : "ranks not in it: ", k, (unsigned long long)s);
        else continue;
        if (n > 0) len += (size_t)n;
        any = 1;
    }
}

/* The rank has gone (left, or its communicator failed): mark it, withdraw its pending requests, wake
   everyone so that waits for it end now. */
static void dt__local_gone(dt_comm *c, dt_result res, const char *msg) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt__lrank *me = &W->r[dt_comm_rank(c)];
    dt__req *it, *next;
    int k;
    if (DT__ATOMIC_LOAD(&me->gone)) return;
    dt__mutex_lock(&W->mu);   /* the root cause is written before anyone can see this rank gone */
    if (res != DT_OK && res != DT_ERR_PEER && !W->cause[0]) {   /* named by its rank, unless the message does it */
        if (msg && strncmp(msg, "rank ", 5) == 0) snprintf(W->cause, sizeof W->cause, "%.300s (%s)", msg, dt_result_str(res));
        else snprintf(W->cause, sizeof W->cause, "rank %d: %.300s (%s)", dt_comm_rank(c), msg ? msg : "", dt_result_str(res));
    }
    dt__mutex_unlock(&W->mu);
    dt__mutex_lock(&me->mu);
    if (me->gone) { dt__mutex_unlock(&me->mu); return; }
    me->gone_result = res;
    snprintf(me->gone_msg, sizeof me->gone_msg, "%s", msg ? msg : "");
    DT__ATOMIC_STORE(&me->gone, 1);
    for (it = me->posted; it; it = next) { next = it->next; DT__ATOMIC_STORE(&it->m.state, DT_REQ_CANCELLED); }
    me->posted = me->posted_tail = NULL;
    dt__mutex_unlock(&me->mu);
    for (k = 0; k < W->n; k++) {
        dt__lrank *o = &W->r[k];
        dt__mutex_lock(&o->mu);
        for (it = o->inbox; it; it = next) {
            next = it->next;
            if (it->m.owner == dt_comm_rank(c)) { dt__lq_unlink(&o->inbox, &o->inbox_tail, it); DT__ATOMIC_STORE(&it->m.state, DT_REQ_CANCELLED); }
        }
        dt__cond_broadcast(&o->cv);
        dt__mutex_unlock(&o->mu);
    }
    dt__mutex_lock(&W->mu);
    dt__cond_broadcast(&W->cv);
    dt__mutex_unlock(&W->mu);
}

static void dt__local_destroy(dt_comm *c) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    int last;
    dt__mutex_lock(&W->mu);
    last = --W->refs == 0;
    W->comms[dt_comm_rank(c)] = NULL;
    dt__mutex_unlock(&W->mu);
    if (last) dt__local_free_world(W);
}

/* Local ranks are threads that share memory behind a mutex: any thread may call a rank's communicator. */
static int dt__local_any_thread(const dt_comm *c) { (void)c; return 1; }

static const dt_comm_backend dt__local_backend = {
    "local", dt__local_isend, dt__local_irecv, dt__local_wait, dt__local_test, dt__local_cancel,
    dt__local_barrier, dt__local_allreduce, dt__local_broadcast, dt__local_missing, dt__local_gone, dt__local_destroy,
    dt__local_any_thread, dt__local_alltoall};
static const dt_comm_backend dt__self_backend = {
    "self", dt__local_isend, dt__local_irecv, dt__local_wait, dt__local_test, dt__local_cancel,
    dt__local_barrier, dt__local_allreduce, dt__local_broadcast, dt__local_missing, dt__local_gone, dt__local_destroy, NULL,
    dt__local_alltoall};

dt_result dt_comm_create_local(dt_comm **out, int n, const dt_comm_desc *desc) {
    dt__lworld *W;
    int i, cores = 1;
    dt_result r = DT_OK;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_local: out is NULL");
    if (n < 1 || n > 4096) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_local: %d ranks; use 1 to 4096", n);
    if (n > 1 && !DT__HAVE_THREADS) return dt_set_error(DT_ERR_UNSUPPORTED, "dt_comm_create_local: %d local ranks need threads; this build has DT_NO_THREADS", n);
    for (i = 0; i < n; i++) out[i] = NULL;
    W = (dt__lworld *)DT_MALLOC(sizeof *W);
    if (!W) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_local: no memory");
    memset(W, 0, sizeof *W);
    W->n = n;
    W->r = (dt__lrank *)DT_MALLOC((size_t)n * sizeof *W->r);
    W->comms = (dt_comm **)DT_MALLOC((size_t)n * sizeof *W->comms);
    W->bar_sig = (uint64_t *)DT_MALLOC((size_t)n * 3 * sizeof *W->bar_sig);
    W->small = (char *)DT_MALLOC((size_t)2 * (size_t)n * DT__LOCAL_SMALL);
    if (desc && (desc->link_latency > 0 || desc->link_bandwidth > 0)) {
        W->latency = desc->link_latency;
        W->bandwidth = desc->link_bandwidth;
        W->link_free = (double *)DT_MALLOC((size_t)2 * (size_t)n * sizeof(double));
        if (W->link_free) memset(W->link_free, 0, (size_t)2 * (size_t)n * sizeof(double));
    }
    if (!W->r || !W->comms || !W->bar_sig || !W->small || ((W->latency > 0 || W->bandwidth > 0) && !W->link_free)) {
        DT_FREE(W->r); W->r = NULL;
        dt__local_free_world(W);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_local: no memory for %d ranks", n);
    }
    memset(W->r, 0, (size_t)n * sizeof *W->r);
    memset(W->comms, 0, (size_t)n * sizeof *W->comms);
    dt__mutex_init(&W->mu);
    dt__mutex_init(&W->link_mu);
    dt__cond_init(&W->cv);
    for (i = 0; i < n; i++) { dt__mutex_init(&W->r[i].mu); dt__cond_init(&W->r[i].cv); }
    if (dt__cpu_count() > 0) cores = dt__cpu_count();
    W->spin = n <= cores;
    for (i = 0; i < n && r == DT_OK; i++)
        if ((r = dt_comm_create_backend(&W->comms[i], n == 1 ? &dt__self_backend : &dt__local_backend, W, i, n, 0x7fffffff, desc)) == DT_OK)
            W->refs++;
    if (r != DT_OK) {
        for (i = 0; i < n; i++) DT_FREE(W->comms[i]);   /* no scratch yet: the struct is all there is */
        dt__local_free_world(W);
        return r;
    }
    for (i = 0; i < n; i++) out[i] = W->comms[i];
    return DT_OK;
}

dt_result dt_comm_create_self(dt_comm **out, const dt_comm_desc *desc) {
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_self: out is NULL");
    return dt_comm_create_local(out, 1, desc);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
