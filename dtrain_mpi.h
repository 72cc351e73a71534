/* dtrain_mpi.h - the MPI backend of dtrain's communicator.   v0.1.0
   MIT license (see the end of dtrain.h).

   WHAT IT IS
     A dt_comm whose ranks are the processes of an MPI communicator. Every collective algorithm of
     dtrain.h (naive, ring, tree) runs unchanged over MPI point-to-point messages and gives the same bits
     as on local ranks; NATIVE uses MPI's own all-reduce and broadcast.

   HOW TO INCLUDE
     Compile with mpicc and -DDT_USE_MPI (make MPI=1): dtrain.h then includes this file at its end, so
         #define DTRAIN_IMPLEMENTATION
         #include "dtrain.h"
     in one file gives the MPI backend too, and dt_launch runs each process started by mpiexec as one rank
     of MPI_COMM_WORLD. This file includes only what it needs, dtrain/comm.h (the communicator, on
     dtrain/base.h): including "dtrain_mpi.h" alone gives the communicator and this backend, and dtrain.h
     adds the models, optimizers, data and trainers. Link with MPI (mpicc does).

   API
     dt_comm_create_mpi(&c, comm, &desc)   a dt_comm over a duplicate of comm (collective over comm)
     dt_comm_mpi_handle(c)                 that duplicate, for the program's own MPI calls
     dt_comm_destroy(c)                    frees it

   QUICK START
     dt_launch does all of this for a rank function; a program that runs MPI itself:
         int provided;
         MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
         dt_comm *c;
         if (dt_comm_create_mpi(&c, MPI_COMM_WORLD, NULL) != DT_OK) { puts(dt_last_error()); return 1; }
         float g[1000] = {0};                                  // e.g. this rank's gradient
         if (dt_comm_allreduce(c, g, 1000, DT_F32, DT_MEAN, DT_ALGO_RING) != DT_OK)   // collective
             puts(dt_last_error());
         MPI_Barrier(dt_comm_mpi_handle(c));                   // the program's own calls, on the duplicate
         dt_comm_destroy(c);
         MPI_Finalize();

   ERRORS
     The duplicate communicator has MPI_ERRORS_RETURN: an MPI failure becomes DT_ERR_COMM with the name of
     the MPI call and MPI's own message, never an abort. Every wait has the communicator's deadline
     (DT_ERR_TIMEOUT names the rank waited for). A rank whose communicator fails, or whose rank function
     returns an error under dt_launch, sends every other rank an abort notice; their waits then fail at
     once with DT_ERR_PEER "rank K has failed (...): <its message>". Collectives called differently on
     different ranks (kind, order, count, type, op, root, algorithm) fail with DT_ERR_MISMATCH: the point-
     to-point algorithms see it in the message tags, NATIVE collectives in a signature check (one small
     all-reduce before each; see docs/design.md). A communicator that has failed may leave MPI requests
     pending that MPI cannot cancel; destroying it keeps its MPI communicator (it is not freed, so MPI
     cannot give its context to a new communicator that would then receive stale messages).

   THREADS
     One thread per process calls MPI: the one that uses the dt_comm. dt_launch initialises MPI with
     MPI_THREAD_FUNNELED (OpenMP threads inside kernels never call MPI). A program that initialises MPI
     itself needs at least FUNNELED, or SERIALIZED when different threads use different communicators
     one at a time. Waiting ranks poll with MPI_Test and back off (sched_yield for 50 ms, then naps growing to
     1 ms), so ranks oversubscribing the cores leave them to the ranks that work. MPI makes progress on a
     non-blocking collective only inside MPI calls, so the yield phase is long enough for a large one
     to run at full speed (naps from the start slowed a 16 MiB all-reduce of 2 ranks from 3 to 17 ms).

   VERSION
     dtrain.h's (DT_VERSION_*; see its VERSION section): take the three headers from the same release.
*/
#ifndef DTRAIN_MPI_H
#define DTRAIN_MPI_H

#include <mpi.h>
#include "dtrain/comm.h"   /* the communicator this backend fills (and dtrain/base.h) */

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over a duplicate of comm (MPI_Comm_dup, with MPI_ERRORS_RETURN): its rank and size
   are comm's. Collective over comm; MPI must be initialised. desc may be NULL (defaults, as for local
   ranks; the link model is ignored). Free with dt_comm_destroy. */
dt_result dt_comm_create_mpi(dt_comm **out, MPI_Comm comm, const dt_comm_desc *desc);
/* The MPI communicator c uses (owned by c), or MPI_COMM_NULL when c is not an MPI communicator. */
MPI_Comm  dt_comm_mpi_handle(const dt_comm *c);

#ifdef __cplusplus
}
#endif
#define DTRAIN_MPI_DECLARED
#endif /* DTRAIN_MPI_H */

/* (DTRAIN_MPI_DECLARED: after the declarations, also where make single's dtrain.h, which this file then
   includes, includes this file again at its end) */
#if defined(DTRAIN_IMPLEMENTATION) && defined(DTRAIN_MPI_DECLARED) && !defined(DTRAIN_MPI_IMPLEMENTATION_DONE)
#define DTRAIN_MPI_IMPLEMENTATION_DONE
#include <limits.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the MPI backend ----------------------------------------------------------------------------
   Tags: user messages 0 .. DT_TAG_USER_MAX; collectives DT__TAG_COLL .. tag_ub - 1 (dt__coll_tag keeps
   below tag_ub); tag_ub itself carries abort notices. Each wait polls MPI_Test and, between polls, looks
   for abort notices and, in a collective, at the first message pending from the rank it waits for: a
   collective tag with another sequence number or another signature hash means a mismatch. */

#define DT__MPI_NOTICE 480              /* bytes of message in an abort notice */
#define DT__MPI_CANCEL_WAIT 0.5         /* seconds, after a failure, that cancels may wait for MPI in all */
#define DT__MPI_YIELD_SECONDS 5e-2      /* seconds a wait yields before it naps */
#define DT__MPI_ORDER_GRACE 0.2         /* seconds a message of a later collective must stay first in line */

typedef char dt__mpi_request_fits[sizeof(MPI_Request) <= sizeof(((dt_request *)0)->impl) ? 1 : -1];

typedef struct dt__mpi_notice {
    uint64_t id;                        /* the communicator's identity: a stale notice is ignored */
    int32_t  result;
    char     msg[DT__MPI_NOTICE];
} dt__mpi_notice;

typedef struct dt__mpi {
    MPI_Comm       comm;                /* the duplicate, MPI_ERRORS_RETURN */
    uint64_t       id;                  /* agreed at creation (rank 0's, broadcast) */
    int            abort_tag;           /* tag_ub */
    int            notified;            /* this rank has sent its notice */
    int            peer;                /* a notice came from this rank (-1: none) */
    dt__mpi_notice in, out;             /* the notice received, the one sent */
    MPI_Request   *out_reqs;            /* [size] the notice's sends */
    double         cancel_until;        /* 0, or the end of the time cancels may wait */
    uint64_t       sig_in[2], sig_out[2];  /* the signature check's buffers: MPI may write them after a failure */
    int            stuck;               /* a native collective failed: MPI still holds its request (and M) */
    dt__mutex      mu;                  /* naps: a timed wait on a condition nobody signals */
    dt__cond       cv;
} dt__mpi;

static MPI_Request dt__mpi_req_get(const dt_request *q) { MPI_Request r; memcpy(&r, q->impl, sizeof r); return r; }
static void dt__mpi_req_set(dt_request *q, MPI_Request r) { memcpy(q->impl, &r, sizeof r); }

/* DT_ERR_COMM naming the MPI call and MPI's message. */
static dt_result dt__mpi_error(int rc, const char *call) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error code %d", rc);
    return dt_set_error(DT_ERR_COMM, "%s failed: %s", call, s);
}
#define DT__MPI_TRY(call) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) return dt__mpi_error(rc_, #call); } while (0)

/* Yields (sched_yield: a waiting rank gives its core to any rank that can run) for the first
   DT__MPI_YIELD_SECONDS of a wait, then naps of an eighth of the time waited so far, from 10 us up to
   1 ms: no spinning on a busy machine, and little added latency for a short wait. */
static void dt__mpi_backoff(dt__mpi *M, double *since) {
    double now = dt_time_now(), nap;
    if (*since == 0) *since = now;
    if (now - *since < DT__MPI_YIELD_SECONDS) { sched_yield(); return; }
    nap = (now - *since) / 8;
    nap = nap < 1e-5 ? 1e-5 : nap > 1e-3 ? 1e-3 : nap;
    dt__mutex_lock(&M->mu);
    dt__cond_wait_for(&M->cv, &M->mu, nap);
    dt__mutex_unlock(&M->mu);
}

/* DT_ERR_PEER once an abort notice of this communicator has arrived (sticky: the run has failed). */
static dt_result dt__mpi_notices(dt_comm *c) {
    dt__mpi *M = (dt__mpi *)c->impl;
    while (M->peer < 0) {
        MPI_Status st;
        int flag = 0;
        DT__MPI_TRY(MPI_Iprobe(MPI_ANY_SOURCE, M->abort_tag, M->comm, &flag, &st));
        if (!flag) return DT_OK;
        DT__MPI_TRY(MPI_Recv(&M->in, (int)sizeof M->in, MPI_BYTE, st.MPI_SOURCE, M->abort_tag, M->comm, MPI_STATUS_IGNORE));
        if (M->in.id == M->id) M->peer = st.MPI_SOURCE;
    }
    M->in.msg[DT__MPI_NOTICE - 1] = 0;
    return dt_set_error(DT_ERR_PEER, "rank %d has failed (%s): %s", M->peer, dt_result_str((dt_result)M->in.result), M->in.msg);
}

/* Looks at the first message pending from rank src (every other rank when src < 0, for a native
   collective): a collective tag of the current collective number with another signature, or of another
   number, means the ranks disagree (*ahead set for the latter). User tags are not judged; a pending
   notice is left to dt__mpi_notices. */
static dt_result dt__mpi_probe(dt_comm *c, int src, int *ahead) {
    dt__mpi *M = (dt__mpi *)c->impl;
    int mine = dt__coll_tag(c), k, lo = src < 0 ? 0 : src, hi = src < 0 ? c->size : src + 1;
    char what[128];
    for (k = lo; k < hi; k++) {
        MPI_Status st;
        int flag = 0, tag;
        if (k == c->rank) continue;
        DT__MPI_TRY(MPI_Iprobe(k, MPI_ANY_TAG, M->comm, &flag, &st));
        if (!flag) continue;
        tag = st.MPI_TAG;
        if (tag < DT__TAG_COLL || tag == M->abort_tag) continue;
        if (((tag - DT__TAG_COLL) >> DT__TAG_HASH_BITS) != ((mine - DT__TAG_COLL) >> DT__TAG_HASH_BITS)) {
            if (src < 0) continue;   /* a rank ahead of this one, already in a later collective */
            *ahead = 1;
            dt__sig_str(c->sig, what, sizeof what);
            return dt_set_error(DT_ERR_MISMATCH, "rank %d sent a message of another collective while this rank waits for its part of %s: "
                                "the ranks called collectives in a different order", k, what);
        }
        if (src >= 0 && tag == mine) continue;
        dt__sig_str(c->sig, what, sizeof what);
        return dt_set_error(DT_ERR_MISMATCH, "rank %d called a different collective, or the same with a different count, type, op, root "
                            "or algorithm, as collective #%llu (this rank called %s)", k, (unsigned long long)c->sig[0], what);
    }
    return DT_OK;
}

/* Polls *rq until it completes (DT_OK, *st filled; *rc MPI_Test's code), the deadline passes
   (DT_ERR_TIMEOUT, no message: the caller says what was missing), an abort notice arrives (DT_ERR_PEER)
   or the probe of rank probe (-1: all, -2: none) finds a mismatch. The probe drives MPI's progress, so
   what it sees may have arrived after this request completed: the request is tested again first. A
   message of a later collective may also overtake the completion of a large message still being copied,
   so that verdict must hold for DT__MPI_ORDER_GRACE seconds. */
static dt_result dt__mpi_poll(dt_comm *c, MPI_Request *rq, MPI_Status *st, double deadline, int probe, int *rc) {
    dt__mpi *M = (dt__mpi *)c->impl;
    int flag = 0, ahead = 0;
    double since = 0;
    double suspect = 0, now;
    dt_result r;
    for (;;) {
        *rc = MPI_Test(rq, &flag, st);
        if (*rc != MPI_SUCCESS || flag) return DT_OK;
        if ((r = dt__mpi_notices(c)) != DT_OK) return r;
        now = dt_time_now();
        if (probe > -2 && (r = dt__mpi_probe(c, probe, &ahead)) != DT_OK) {
            *rc = MPI_Test(rq, &flag, st);
            if (*rc != MPI_SUCCESS || flag) return DT_OK;
            if (!ahead || (suspect > 0 && now - suspect > DT__MPI_ORDER_GRACE)) return r;
            if (suspect == 0) suspect = now;
        } else suspect = 0;
        if (now >= deadline) return DT_ERR_TIMEOUT;
        dt__mpi_backoff(M, &since);
    }
}

static dt_result dt__mpi_post(dt_comm *c, void *buf, size_t bytes, int peer, int tag, dt_request *q, int kind) {
    dt__mpi *M = (dt__mpi *)c->impl;
    MPI_Request rq = MPI_REQUEST_NULL;
    memset(q, 0, sizeof *q);
    q->kind = kind; q->peer = peer; q->tag = tag; q->owner = c->rank; q->bytes = bytes;
    if (kind == DT__REQ_SEND) q->sbuf = buf; else q->rbuf = buf;
    memcpy(q->sig, c->sig, sizeof q->sig);
    dt__mpi_req_set(q, MPI_REQUEST_NULL);
    if (bytes > (size_t)INT_MAX) {
        q->kind = DT__REQ_NONE;
        return dt_set_error(DT_ERR_UNSUPPORTED, "a message of %zu bytes: MPI counts are int, so one message carries at most %d bytes; "
                            "send it in parts (collectives split theirs into segment_bytes)", bytes, INT_MAX);
    }
    if (kind == DT__REQ_SEND) DT__MPI_TRY(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, M->comm, &rq));
    else DT__MPI_TRY(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, M->comm, &rq));
    dt__mpi_req_set(q, rq);
    q->state = DT__ST_POSTED;
    return DT_OK;
}
static dt_result dt__mpi_isend(dt_comm *c, const void *buf, size_t bytes, int dst, int tag, dt_request *q) {
    return dt__mpi_post(c, (void *)(uintptr_t)buf, bytes, dst, tag, q, DT__REQ_SEND);
}
static dt_result dt__mpi_irecv(dt_comm *c, void *buf, size_t bytes, int src, int tag, dt_request *q) {
    return dt__mpi_post(c, buf, bytes, src, tag, q, DT__REQ_RECV);
}

/* A request MPI_Test reported complete: its error (truncation is a mismatch), the bytes received. */
static dt_result dt__mpi_complete(dt_request *q, MPI_Status *st, int rc) {
    int n = 0;
    q->state = DT__ST_DONE;
    dt__mpi_req_set(q, MPI_REQUEST_NULL);
    if (rc != MPI_SUCCESS) {
        int cls = 0;
        MPI_Error_class(rc, &cls);
        if (cls == MPI_ERR_TRUNCATE)
            return dt_set_error(DT_ERR_MISMATCH, "rank %d sent more than the %zu bytes this receive accepts", q->peer, q->bytes);
        return dt__mpi_error(rc, q->kind == DT__REQ_SEND ? "MPI_Isend" : "MPI_Irecv");
    }
    if (q->kind == DT__REQ_RECV) {
        if ((rc = MPI_Get_count(st, MPI_BYTE, &n)) != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Get_count");
        q->received = (size_t)n;
    }
    return DT_OK;
}

/* Withdraws a pending request after a failure: MPI_Cancel, then MPI_Test until it is cancelled or
   complete, for at most DT__MPI_CANCEL_WAIT seconds over all the communicator's cancels. A request MPI
   did not settle by then is freed (MPI_Request_free): a send may still go out, a receive may still
   write its buffer, so keep buffers of a failed communicator until the program ends or MPI is
   finalized if that matters. */
static void dt__mpi_cancel(dt_comm *c, dt_request *q) {
    dt__mpi *M = (dt__mpi *)c->impl;
    MPI_Request rq = dt__mpi_req_get(q);
    int flag = 0;
    double since = 0;
    if (q->kind == DT__REQ_NONE || q->state == DT__ST_DONE || rq == MPI_REQUEST_NULL) return;
    if (M->cancel_until == 0) M->cancel_until = dt_time_now() + DT__MPI_CANCEL_WAIT;
    if (MPI_Cancel(&rq) == MPI_SUCCESS)
        while (MPI_Test(&rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && dt_time_now() < M->cancel_until)
            dt__mpi_backoff(M, &since);
    if (!flag && rq != MPI_REQUEST_NULL) MPI_Request_free(&rq);
    dt__mpi_req_set(q, MPI_REQUEST_NULL);
    q->state = DT__ST_CANCELLED;
}

static dt_result dt__mpi_wait(dt_comm *c, dt_request *q, double deadline) {
    MPI_Request rq = dt__mpi_req_get(q);
    MPI_Status st;
    int rc = MPI_SUCCESS, probe = q->kind == DT__REQ_RECV && q->tag >= DT__TAG_COLL ? q->peer : -2;
    dt_result r;
    if (q->state == DT__ST_CANCELLED) return dt_set_error(DT_ERR_STATE, "the request was cancelled");
    if (q->state == DT__ST_DONE) return DT_OK;
    r = dt__mpi_poll(c, &rq, &st, deadline, probe, &rc);
    dt__mpi_req_set(q, rq);
    if (r == DT_OK) return dt__mpi_complete(q, &st, rc);
    dt__mpi_cancel(c, q);
    if (r == DT_ERR_TIMEOUT)
        return dt_set_error(DT_ERR_TIMEOUT, "no %s rank %d within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)",
                            q->kind == DT__REQ_SEND ? "receive was posted by" : "message came from", q->peer, c->timeout);
    return r;
}

static dt_result dt__mpi_test(dt_comm *c, dt_request *q, int *done) {
    MPI_Request rq = dt__mpi_req_get(q);
    MPI_Status st;
    int rc, flag = 0;
    dt_result r;
    *done = 0;
    if (q->state == DT__ST_DONE) { *done = 1; return DT_OK; }
    rc = MPI_Test(&rq, &flag, &st);
    dt__mpi_req_set(q, rq);
    if (rc != MPI_SUCCESS || flag) { *done = 1; return dt__mpi_complete(q, &st, rc); }
    if ((r = dt__mpi_notices(c)) != DT_OK) { dt__mpi_cancel(c, q); return r; }
    return DT_OK;
}

/* Waits for a native collective's request; MPI cannot cancel one, so after a failure it stays pending. */
static dt_result dt__mpi_native_wait(dt_comm *c, MPI_Request *rq, double deadline, const char *call) {
    MPI_Status st;
    int rc = MPI_SUCCESS;
    dt_result r = dt__mpi_poll(c, rq, &st, deadline, -1, &rc);
    if (r != DT_OK) ((dt__mpi *)c->impl)->stuck = 1;
    if (r == DT_ERR_TIMEOUT)
        return dt_set_error(DT_ERR_TIMEOUT, "not every rank arrived within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)", c->timeout);
    if (r == DT_OK && rc != MPI_SUCCESS) return dt__mpi_error(rc, call);
    return r;
}

/* Before every native collective: an all-reduce (MAX) of {h, ~h}, h a 64-bit hash of the signature
   (number, kind, count, type, op, root, algorithm). Everyone gets the same pair, and it equals a rank's
   own exactly when every h is equal, so all ranks reach the same verdict. It costs one all-reduce of
   16 bytes (a few microseconds in shared memory, one latency-bound round on a network), and it is also
   the barrier: no rank leaves an all-reduce before every rank has entered it. */
static dt_result dt__mpi_sigcheck(dt_comm *c, double deadline) {
    dt__mpi *M = (dt__mpi *)c->impl;
    uint64_t h = dt__sig_hash(c->sig) ^ dt__mix64(c->sig[0] + 0x9e3779b97f4a7c15ull), *mine = M->sig_in, *all = M->sig_out;
    MPI_Request rq = MPI_REQUEST_NULL;
    dt_result r;
    mine[0] = h; mine[1] = ~h;
    DT__MPI_TRY(MPI_Iallreduce(mine, all, 2, MPI_UINT64_T, MPI_MAX, M->comm, &rq));
    r = dt__mpi_native_wait(c, &rq, deadline, "MPI_Iallreduce");
    if (r == DT_ERR_PEER && M->in.result == DT_ERR_MISMATCH) {
        /* a rank whose check completed found a mismatch: so will this one, once MPI delivers the result */
        int flag = 0, rc;
        double since = 0;
        while ((rc = MPI_Test(&rq, &flag, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !flag && dt_time_now() < deadline) dt__mpi_backoff(M, &since);
        if (rc != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Iallreduce");
        if (flag) { r = DT_OK; M->stuck = 0; }
    }
    if (r != DT_OK) return r;
    if (all[0] != mine[0] || all[1] != mine[1]) {
        char what[128];
        dt__sig_str(c->sig, what, sizeof what);
        return dt_set_error(DT_ERR_MISMATCH, "another rank called a different collective, or the same with a different count, type, op, root "
                            "or algorithm, as collective #%llu (this rank called %s): every rank must make the same collective calls in the same order",
                            (unsigned long long)c->sig[0], what);
    }
    return DT_OK;
}

static dt_result dt__mpi_barrier(dt_comm *c, double deadline) { return dt__mpi_sigcheck(c, deadline); }

static dt_result dt__mpi_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, double deadline) {
    dt__mpi *M = (dt__mpi *)c->impl;
    static const int opn[] = {0, 0, 1, 2};
    MPI_Datatype types[] = {MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, MPI_UINT8_T};
    MPI_Op ops[] = {MPI_SUM, MPI_MAX, MPI_MIN};
    size_t es = dt_dtype_size(t), off;
    dt_result r = dt__mpi_sigcheck(c, deadline);
    /* MPICH 4.0 (Debian 12) compares MPI_UINT8_T and MPI_UNSIGNED_CHAR as signed in MPI_MAX and MPI_MIN
       (max(84, 169) = 84). Flipping the top bit maps unsigned order onto signed order, so max/min of
       bytes run as MPI_INT8_T on x ^ 0x80 and flip back. */
    int flip = t == DT_U8 && (op == DT_MAX || op == DT_MIN);
    if (flip) { for (off = 0; off < count; off++) ((unsigned char *)buf)[off] ^= 0x80; types[DT_U8] = MPI_INT8_T; }
    dt__count_native(c, count * es, 2);
    for (off = 0; r == DT_OK && off < count; ) {   /* MPI counts are int: parts of at most INT_MAX elements */
        size_t n = count - off < (size_t)INT_MAX ? count - off : (size_t)INT_MAX;
        MPI_Request rq = MPI_REQUEST_NULL;
        DT__MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n, types[t], ops[opn[op]], M->comm, &rq));
        r = dt__mpi_native_wait(c, &rq, deadline, "MPI_Iallreduce");
        off += n;
    }
    if (flip) for (off = 0; off < count; off++) ((unsigned char *)buf)[off] ^= 0x80;
    return r;
}

static dt_result dt__mpi_broadcast(dt_comm *c, void *buf, size_t bytes, int root, double deadline) {
    dt__mpi *M = (dt__mpi *)c->impl;
    size_t off;
    dt_result r = dt__mpi_sigcheck(c, deadline);
    dt__count_native(c, bytes, 1);
    for (off = 0; r == DT_OK && off < bytes; ) {
        size_t n = bytes - off < ((size_t)1 << 30) ? bytes - off : ((size_t)1 << 30);
        MPI_Request rq = MPI_REQUEST_NULL;
        DT__MPI_TRY(MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE, root, M->comm, &rq));
        r = dt__mpi_native_wait(c, &rq, deadline, "MPI_Ibcast");
        off += n;
    }
    return r;
}

/* Sends every other rank the abort notice (once; not when this rank's failure is only the echo of
   another's notice, which reached everyone already). The sends finish in the background (the notice
   is small, so MPI sends it eagerly) and are completed by destroy. */
static void dt__mpi_fail(dt_comm *c, dt_result r, const char *msg) {
    dt__mpi *M = (dt__mpi *)c->impl;
    int k;
    if (M->notified || (r == DT_ERR_PEER && M->peer >= 0)) return;
    M->notified = 1;
    M->out.id = M->id;
    M->out.result = (int32_t)r;
    snprintf(M->out.msg, sizeof M->out.msg, "%s", msg ? msg : "");
    for (k = 0; k < c->size; k++)
        if (k == c->rank || MPI_Isend(&M->out, (int)sizeof M->out, MPI_BYTE, k, M->abort_tag, M->comm, &M->out_reqs[k]) != MPI_SUCCESS)
            M->out_reqs[k] = MPI_REQUEST_NULL;
}

/* Receives and drops the messages waiting on a failed communicator (which is kept, not freed), so that
   MPI does not hold them, or warn about them, until it is finalized. */
static void dt__mpi_drain(MPI_Comm comm) {
    MPI_Status st;
    int flag = 1, n = 0;
    while (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &st) == MPI_SUCCESS && flag) {
        void *b = MPI_Get_count(&st, MPI_BYTE, &n) == MPI_SUCCESS ? DT_MALLOC(n > 0 ? (size_t)n : 1) : NULL;
        if (!b) return;
        MPI_Recv(b, n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, comm, MPI_STATUS_IGNORE);
        DT_FREE(b);
    }
}
/* The failed communicators kept until MPI_Finalize, which drains them once more (messages of a failed
   collective may arrive after its communicator was destroyed) through the delete callback of an
   attribute on MPI_COMM_SELF, the standard's hook for work at finalize. One thread calls MPI. */
static MPI_Comm *dt__mpi_kept = NULL;
static int dt__mpi_nkept = 0;
static int dt__mpi_at_finalize(MPI_Comm self, int key, void *val, void *extra) {
    int i;
    (void)self; (void)key; (void)val; (void)extra;
    for (i = 0; i < dt__mpi_nkept; i++) dt__mpi_drain(dt__mpi_kept[i]);
    DT_FREE(dt__mpi_kept);
    dt__mpi_kept = NULL;
    dt__mpi_nkept = 0;
    return MPI_SUCCESS;
}
static void dt__mpi_keep(MPI_Comm comm) {
    MPI_Comm *p = (MPI_Comm *)DT_REALLOC(dt__mpi_kept, (size_t)(dt__mpi_nkept + 1) * sizeof *p);
    dt__mpi_drain(comm);
    if (!p) return;
    if (!dt__mpi_kept) {
        int key;
        if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, dt__mpi_at_finalize, &key, NULL) != MPI_SUCCESS ||
            MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL) != MPI_SUCCESS) { DT_FREE(p); return; }
    }
    dt__mpi_kept = p;
    dt__mpi_kept[dt__mpi_nkept++] = comm;
}

static void dt__mpi_destroy(dt_comm *c) {
    dt__mpi *M = (dt__mpi *)c->impl;
    int k, pending = 0;
    double since = 0;
    double until = dt_time_now() + 1.0;
    if (!M) return;
    for (k = 0; k < c->size; k++) {   /* the notices: at most a second more, then left to MPI */
        int flag = 0;
        while (M->out_reqs[k] != MPI_REQUEST_NULL && MPI_Test(&M->out_reqs[k], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag &&
               dt_time_now() < until)
            dt__mpi_backoff(M, &since);
        if (M->out_reqs[k] != MPI_REQUEST_NULL) { MPI_Request_free(&M->out_reqs[k]); pending = 1; }
    }
    if (!c->broken && !M->notified) {
        dt__mpi_notices(c);   /* a notice that came after this rank's last call: taken off the queue */
        MPI_Comm_free(&M->comm);
    } else dt__mpi_keep(M->comm);
    dt__cond_destroy(&M->cv);
    dt__mutex_destroy(&M->mu);
    DT_FREE(M->out_reqs);
    if (!pending && !M->stuck) DT_FREE(M);   /* else MPI may still read M->out or write M->sig_out */
    c->impl = NULL;
}

static const dt_comm_backend dt__mpi_backend = {
    "mpi", dt__mpi_isend, dt__mpi_irecv, dt__mpi_wait, dt__mpi_test, dt__mpi_cancel,
    dt__mpi_barrier, dt__mpi_allreduce, dt__mpi_broadcast, NULL, dt__mpi_fail, dt__mpi_destroy};

MPI_Comm dt_comm_mpi_handle(const dt_comm *c) {
    return c && c->backend == &dt__mpi_backend && c->impl ? ((const dt__mpi *)c->impl)->comm : MPI_COMM_NULL;
}

/* The part of create that may fail after the duplicate exists. */
static dt_result dt__mpi_setup(dt_comm *c, dt__mpi *M) {
    int flag = 0, *ub = NULL, k;
    static uint64_t made = 0;
    DT__MPI_TRY(MPI_Comm_set_errhandler(M->comm, MPI_ERRORS_RETURN));
    DT__MPI_TRY(MPI_Comm_rank(M->comm, &c->rank));
    DT__MPI_TRY(MPI_Comm_size(M->comm, &c->size));
    DT__MPI_TRY(MPI_Comm_get_attr(M->comm, MPI_TAG_UB, &ub, &flag));
    if (!flag || !ub || *ub < DT__TAG_COLL + (4 << DT__TAG_HASH_BITS))
        return dt_set_error(DT_ERR_UNSUPPORTED, "dt_comm_create_mpi: this MPI's largest tag (MPI_TAG_UB) is %d; dtrain needs at least %d "
                            "(user tags, then collective tags, then one for abort notices)", flag && ub ? *ub : -1, DT__TAG_COLL + (4 << DT__TAG_HASH_BITS));
    c->tag_ub = M->abort_tag = *ub;
    if (c->segment_bytes > (size_t)INT_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_mpi: segment_bytes %zu exceeds what one MPI message carries (%d)", c->segment_bytes, INT_MAX);
    M->id = dt__mix64((uint64_t)(dt_time_now() * 1e9) ^ ((uint64_t)getpid() << 32) ^ ++made);
    DT__MPI_TRY(MPI_Bcast(&M->id, 1, MPI_UINT64_T, 0, M->comm));
    M->out_reqs = (MPI_Request *)DT_MALLOC((size_t)c->size * sizeof *M->out_reqs);
    if (!M->out_reqs) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_mpi: no memory for %d ranks", c->size);
    for (k = 0; k < c->size; k++) M->out_reqs[k] = MPI_REQUEST_NULL;
    return DT_OK;
}

dt_result dt_comm_create_mpi(dt_comm **out, MPI_Comm comm, const dt_comm_desc *desc) {
    dt_comm *c;
    dt__mpi *M;
    int init = 0, rc;
    dt_result r;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_mpi: out is NULL");
    *out = NULL;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init)
        return dt_set_error(DT_ERR_STATE, "dt_comm_create_mpi: MPI is not initialised: call MPI_Init_thread first (dt_launch does)");
    if (comm == MPI_COMM_NULL) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_mpi: comm is MPI_COMM_NULL");
    c = (dt_comm *)DT_MALLOC(sizeof *c);
    M = (dt__mpi *)DT_MALLOC(sizeof *M);
    if (!c || !M) { DT_FREE(c); DT_FREE(M); return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_mpi: no memory"); }
    memset(c, 0, sizeof *c);
    memset(M, 0, sizeof *M);
    M->peer = -1;
    M->comm = MPI_COMM_NULL;
    c->backend = &dt__mpi_backend;
    c->impl = M;
    r = dt__comm_init(c, desc, "dt_comm_create_mpi");
    if (r == DT_OK && (rc = MPI_Comm_dup(comm, &M->comm)) != MPI_SUCCESS) r = dt__mpi_error(rc, "MPI_Comm_dup");
    if (r == DT_OK) r = dt__mpi_setup(c, M);
    if (r != DT_OK) {
        if (M->comm != MPI_COMM_NULL) MPI_Comm_free(&M->comm);
        DT_FREE(M->out_reqs); DT_FREE(M); DT_FREE(c);
        return r;
    }
    dt__mutex_init(&M->mu);
    dt__cond_init(&M->cv);
    *out = c;
    return DT_OK;
}

/* ---- the launcher under mpiexec ---------------------------------------------------------------- */

/* The timeline under MPI. A barrier aligns the clocks: time 0 is the moment just after it on every rank.
   At the end every rank formats its own events; rank 0 gathers the sizes, receives each rank's text in
   rank order, and broadcasts that it has them all; then it writes the one file. A rank that failed, or
   whose part of the exchange failed (a rank has died), writes its own events to PATH.rank<r> instead. */
#define DT__TRACE_TAG 32200            /* the user tag of the texts sent to rank 0 */
#define DT__TRACE_CHUNK (1 << 26)      /* bytes per message, well below MPI's INT_MAX */

static dt_result dt__mpi_trace_start(dt_comm *c, const dt_launch_desc *desc, dt__trace_lane **lanes) {
    dt_result r;
    int i;
    if (!(*lanes = dt__trace_lanes(1, desc->trace_max_events)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: rank %d: no memory for the trace", c->rank);
    if ((r = dt_comm_barrier(c)) != DT_OK) return r;
    for (i = 0; i < DT__TRACE_LANES; i++) (*lanes)[i].origin = dt_time_now();
    dt_comm_reset_stats(c);   /* the barrier is not the program's */
    return DT_OK;
}

/* Rank 0 appends rank k's text of len bytes to t; the others send theirs. */
static dt_result dt__mpi_trace_move(dt_comm *c, dt__text *t, int k, int64_t len) {
    int64_t off, part;
    size_t got = 0;
    dt_result r = DT_OK;
    if (c->rank == 0 && dt__text_reserve(t, (size_t)len + 1) != 0)
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "trace: rank 0: no memory for rank %d's %lld bytes of events", k, (long long)len);
    for (off = 0; off < len && r == DT_OK; off += part) {
        part = len - off < DT__TRACE_CHUNK ? len - off : DT__TRACE_CHUNK;
        if (c->rank != 0) r = dt_comm_send(c, t->p + off, (size_t)part, DT_U8, 0, DT__TRACE_TAG);
        else if ((r = dt_comm_recv(c, t->p + t->n + off, (size_t)part, DT_U8, k, DT__TRACE_TAG, &got)) == DT_OK && got != (size_t)part)
            r = dt_set_error(DT_ERR_MISMATCH, "trace: rank %d sent %zu bytes of events where %lld were due", k, got, (long long)part);
    }
    if (r == DT_OK && c->rank == 0) t->n += (size_t)len;
    return r;
}

static dt_result dt__mpi_trace_finish(dt_comm *c, const char *path, dt__trace_lane *lanes, int failed) {
    dt__text t;
    int64_t mine[3] = {0, 0, 0}, *all = NULL, events, dropped;   /* bytes of text, events, dropped events */
    int me = c->rank, k, ok = 0, done = 1;
    char own[1024];
    dt_result r = DT_OK;
    memset(&t, 0, sizeof t);
    dt__trace_format(&t, lanes, me, dt_time_now() - lanes[0].origin, &mine[1], &mine[2]);
    mine[0] = (int64_t)t.n;
    events = mine[1];
    dropped = mine[2];
    if (!failed && !t.oom && (me != 0 || (all = (int64_t *)DT_MALLOC(sizeof(int64_t) * 3 * (size_t)c->size)))) {
        r = dt_comm_gather(c, mine, all, 3, DT_I64, 0);
        if (me != 0 && r == DT_OK) r = dt__mpi_trace_move(c, &t, 0, mine[0]);
        for (k = 1; me == 0 && k < c->size && r == DT_OK; k++) {
            r = dt__mpi_trace_move(c, &t, k, all[3 * k]);
            events += all[3 * k + 1];
            dropped += all[3 * k + 2];
        }
        if (r == DT_OK) r = dt_comm_broadcast(c, &done, 1, DT_I32, 0, DT_ALGO_AUTO);   /* rank 0 has every text */
        ok = r == DT_OK;
    }
    DT_FREE(all);
    if (ok && me == 0) r = dt__trace_write(path, &t, c->size, events, dropped, lanes[0].max);
    else if (!ok) {
        t.n = (size_t)mine[0];   /* this rank's own events */
        if (snprintf(own, sizeof own, "%s.rank%d", path, me) >= (int)sizeof own) r = dt_set_error(DT_ERR_INVALID_ARG, "trace %s: the path is too long", path);
        else {
            dt_log(DT_LOG_WARN, "trace: rank %d's events could not be gathered on rank 0 (%s); it writes them to %s", me,
                   failed ? "this rank failed" : dt_last_error(), own);
            r = dt__trace_write(own, &t, 1, mine[1], mine[2], lanes[0].max);
        }
    }
    DT_FREE(t.p);
    return r;
}

/* Each process is one rank of MPI_COMM_WORLD: MPI_Init_thread (FUNNELED) unless the program did, the
   communicator, OpenMP threads (threads_per_rank, or this node's cores over its ranks), fn; a failure is
   logged and announced to the other ranks. MPI_Finalize only when this call initialised MPI. */
int dt__mpi_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg) {
    int had = 0, provided = 0, rc, local = 1;
    dt_comm *c = NULL;
    dt__trace_lane *lanes = NULL;
    dt_result r = DT_OK, rt = DT_OK;
    if (MPI_Initialized(&had) != MPI_SUCCESS) had = 0;
    if (!had && (rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS) {
        dt__mpi_error(rc, "MPI_Init_thread");
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        return 1;
    }
    if (!fn) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_launch: the rank function is NULL");
    else if ((rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) != MPI_SUCCESS) r = dt__mpi_error(rc, "MPI_Comm_set_errhandler");
    else r = dt_comm_create_mpi(&c, MPI_COMM_WORLD, &desc->comm);
    if (r == DT_OK) {
        MPI_Comm node;   /* the ranks sharing this node's cores */
        if (MPI_Comm_split_type(dt_comm_mpi_handle(c), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
            if (MPI_Comm_size(node, &local) != MPI_SUCCESS || local < 1) local = 1;
            MPI_Comm_free(&node);
        }
        dt__tls_rank = c->rank;
        dt__log_all_ranks = desc->log_all_ranks;
#if DT__HAVE_OMP
        omp_set_num_threads(desc->threads_per_rank > 0 ? desc->threads_per_rank : dt__default_threads(local));
#endif
        if (desc->trace_path) r = dt__mpi_trace_start(c, desc, &lanes);
        dt__tls_trace = lanes;
        if (r == DT_OK) r = fn(c, arg);
        dt__tls_trace = NULL;
    }
    if (r != DT_OK) {
        const char *m = dt_last_error(), *pre = dt_result_str(r);
        size_t lp = strlen(pre);
        if (!m[0]) m = "its rank function failed";
        dt_log(DT_LOG_ERROR, "%s", m);
        if (strncmp(m, pre, lp) == 0 && m[lp] == ':') m += lp + 1 + (m[lp + 1] == ' ');
        if (c) dt_comm_leave(c, r, m);
    }
    if (lanes && (rt = dt__mpi_trace_finish(c, desc->trace_path, lanes, r != DT_OK)) != DT_OK)
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    dt__trace_lanes_free(lanes, 1);
    dt_comm_destroy(c);
    dt__tls_rank = -1;
    if (!had) MPI_Finalize();
    return r == DT_OK && rt == DT_OK ? 0 : 1;
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_IMPLEMENTATION && DTRAIN_MPI_DECLARED */
