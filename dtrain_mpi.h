/* dtrain_mpi.h - the MPI backend of dtrain's communicator.   v0.1.0
   MIT license (see the end of dtrain.h).

   WHAT IT IS
     A dt_comm whose ranks are the processes of an MPI communicator. Every collective algorithm of
     dtrain.h (naive, ring, tree) runs unchanged over MPI point-to-point messages and gives the same bits
     as on local ranks; NATIVE uses MPI's own all-reduce, broadcast and all-to-all. The nodes of
     DT_ALGO_HIER are the ranks that share memory (MPI_Comm_split_type), unless dt_comm_desc.node_size or
     DT_NODE_SIZE declares others.

   HOW TO INCLUDE
     Compile with mpicc and -DDT_USE_MPI (make MPI=1): dtrain.h then includes this file at its end, so
         #define DTRAIN_IMPLEMENTATION
         #include "dtrain.h"
     in one file gives the MPI backend too, and dt_launch runs each process started by mpiexec as one rank
     of MPI_COMM_WORLD (dt_launch_mpi, registered as dt_launch's launcher for such jobs). This file includes only what it needs, dtrain/comm/backend.h and dtrain/comm/launch.h
     (the communicator's modules, on dtrain/core/base.h): including "dtrain_mpi.h" alone gives the communicator
     and this backend, and dtrain.h adds the models, optimizers, data and trainers. Link with MPI (mpicc does).

   API
     dt_comm_create_mpi(&c, comm, &desc)   a dt_comm over a duplicate of comm (collective over comm)
     dt_comm_mpi_handle(c)                 that duplicate, for the program's own MPI calls
     dt_comm_destroy(c)                    frees it
     dt_launch_mpi(&desc, fn, arg)         what dt_launch runs under mpiexec (one rank per process)
   It is written against the backend interface of dtrain/comm/backend.h alone: a model for another transport.

   QUICK START
     dt_launch does all of this for a rank function; a program that runs MPI itself:
         int provided;
         MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
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
     once with DT_ERR_PEER "rank K has failed (...): <its message>". At the end of dt_launch the ranks tell
     each other how they ended: each failure is logged once (by the lowest rank that failed that way), a
     timeout's message gains the ranks that had not reached its collective, and when a rank has not ended
     the timeout and a second after the run failed (stalled), the job ends with MPI_Abort, exit status 1,
     naming it (MPI_Finalize would wait for it forever). Collectives called differently on
     different ranks (kind, order, count, type, op, root, algorithm) fail with DT_ERR_MISMATCH: the point-
     to-point algorithms see it in the message tags, NATIVE collectives in a signature check (one small
     all-reduce before each; see docs/design.md). A communicator that has failed may leave MPI requests
     pending that MPI cannot cancel; destroying it keeps its MPI communicator (it is not freed, so MPI
     cannot give its context to a new communicator that would then receive stale messages).

   THREADS
     One thread at a time calls MPI. dt_launch initialises MPI with MPI_THREAD_SERIALIZED: DDP's helper
     thread reduces buckets while the rank's thread runs backward (the two hand the communicator over
     through a mutex; OpenMP threads inside kernels never call MPI). A program that initialises MPI itself
     needs at least FUNNELED; below SERIALIZED, DDP reduces its buckets after backward, on the rank's
     thread (it says so in a warning). Waiting ranks poll with MPI_Test and back off (sched_yield for
     50 ms, then naps growing to 1 ms), so ranks oversubscribing the cores leave them to the ranks that
     work. MPI makes progress on a non-blocking collective only inside MPI calls, so the yield phase is
     long enough for a large one to run at full speed (naps from the start slowed a 16 MiB all-reduce of
     2 ranks from 3 to 17 ms). A thread other than
     the communicator's creator (DDP's helper, while the rank's thread runs backward) polls every 50 us
     and naps in between instead: its polls are what move the buckets (MPICH's default build has no
     progress thread), and its naps leave the cores to backward (yielding, it slowed backward more than
     it hid: docs/performance.md, "DDP under MPI").

   VERSION
     dtrain.h's (DT_VERSION_*; see its VERSION section): take the three headers from the same release.
*/
#ifndef DTRAIN_MPI_H
#define DTRAIN_MPI_H

#include <mpi.h>
/* This backend's launcher is dt_launch's under mpiexec: registered before dtrain/comm/launch.h's
   implementation is compiled (dtrain.h, which includes this file last, registers it the same way). */
#if defined(DT_USE_MPI) && !defined(DT__LAUNCH_PROCESSES)
#define DT__LAUNCH_PROCESSES dt_launch_mpi
#endif
#include "dtrain/comm/backend.h"   /* the interface this backend fills (and the communicator, dtrain/core/base.h) */
#include "dtrain/comm/launch.h"    /* dt_launch_rank, for dt_launch_mpi */

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over a duplicate of comm (MPI_Comm_dup, with MPI_ERRORS_RETURN): its rank and size
   are comm's. Collective over comm; MPI must be initialised. desc may be NULL (defaults, as for local
   ranks; the link model is ignored). Free with dt_comm_destroy. */
dt_result dt_comm_create_mpi(dt_comm **out, MPI_Comm comm, const dt_comm_desc *desc);
/* The MPI communicator c uses (owned by c), or MPI_COMM_NULL when c is not an MPI communicator. */
MPI_Comm  dt_comm_mpi_handle(const dt_comm *c);
/* What dt_launch does under mpiexec: runs fn as this process's rank of MPI_COMM_WORLD (MPI initialised
   with MPI_THREAD_SERIALIZED unless the program did, and then finalized here too). Collective over
   MPI_COMM_WORLD. Returns fn's result (or the launcher's failure), logged when it is not DT_OK. */
dt_result dt_launch_mpi(const dt_launch_desc *desc, dt_rank_fn fn, void *arg);

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
#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "dtrain/core/internal.h"

/* ---- the MPI backend ----------------------------------------------------------------------------
   Written against dtrain/comm/backend.h's backend interface alone (dt_comm_create_backend, dt_message, ...).
   Tags: user messages 0 .. DT_TAG_USER_MAX; collectives (dt_comm_coll_tag) below tag_ub; tag_ub itself
   carries abort notices. Each wait polls MPI_Test and, between polls, looks for abort notices and, in a
   collective, at the first message pending from the rank it waits for: a collective tag with another
   collective number (dt_comm_tag_seq) or another signature hash means a mismatch. */

#define DT__MPI_NOTICE 480              /* bytes of message in an abort notice */
#define DT__MPI_CANCEL_WAIT 0.5         /* seconds, after a failure, that cancels may wait for MPI in all */
#define DT__MPI_YIELD_SECONDS 5e-2      /* seconds a wait yields before it naps */
#define DT__MPI_ORDER_GRACE 0.2         /* seconds a message of a later collective must stay first in line */
#define DT__MPI_HELPER_NAP 5e-5         /* seconds between polls of a thread that is not the communicator's creator */

typedef char dt__mpi_request_fits[sizeof(MPI_Request) <= sizeof(((dt_message *)0)->impl) ? 1 : -1];

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
    void          *stage;               /* the native collectives' data, [stage_bytes]: MPI may write it after a failure */
    size_t         stage_bytes;
    int            stuck;               /* a native collective failed: MPI still holds its request (and M, stage) */
    int            serialized;          /* MPI runs at MPI_THREAD_SERIALIZED or above: any thread may call c */
    pthread_t      owner;               /* the thread that created c */
} dt__mpi;

static dt__mpi *dt__mpi_of(const dt_comm *c) { return (dt__mpi *)dt_comm_impl(c); }
static MPI_Request dt__mpi_req_get(const dt_message *q) { MPI_Request r; memcpy(&r, q->impl, sizeof r); return r; }
static void dt__mpi_req_set(dt_message *q, MPI_Request r) { memcpy(q->impl, &r, sizeof r); }

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
static void dt__mpi_backoff(double *since) {
    double now = dt_time_now(), nap;
    if (*since == 0) *since = now;
    if (now - *since < DT__MPI_YIELD_SECONDS) { sched_yield(); return; }
    nap = (now - *since) / 8;
    dt_sleep(nap < 1e-5 ? 1e-5 : nap > 1e-3 ? 1e-3 : nap);
}

/* DT_ERR_PEER once an abort notice of this communicator has arrived (sticky: the run has failed). */
static dt_result dt__mpi_notices(dt_comm *c) {
    dt__mpi *M = dt__mpi_of(c);
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
    dt__mpi *M = dt__mpi_of(c);
    int mine = dt_comm_coll_tag(c), me = dt_comm_rank(c), k, lo = src < 0 ? 0 : src, hi = src < 0 ? dt_comm_size(c) : src + 1;
    char what[128];
    for (k = lo; k < hi; k++) {
        MPI_Status st;
        int flag = 0, tag;
        if (k == me) continue;
        DT__MPI_TRY(MPI_Iprobe(k, MPI_ANY_TAG, M->comm, &flag, &st));
        if (!flag) continue;
        tag = st.MPI_TAG;
        if (dt_comm_tag_seq(tag) < 0 || tag == M->abort_tag) continue;
        if (dt_comm_tag_seq(tag) != dt_comm_tag_seq(mine)) {
            if (src < 0) continue;   /* a rank ahead of this one, already in a later collective */
            *ahead = 1;
            dt_comm_describe(c, what, sizeof what);
            return dt_set_error(DT_ERR_MISMATCH, "rank %d sent a message of another collective while this rank waits for its part of %s: "
                                "the ranks called collectives in a different order", k, what);
        }
        if (src >= 0 && tag == mine) continue;
        dt_comm_describe(c, what, sizeof what);
        return dt_set_error(DT_ERR_MISMATCH, "rank %d called a different collective, or the same with a different count, type, op, root "
                            "or algorithm, as collective #%llu (this rank called %s)", k, (unsigned long long)dt_comm_seq(c), what);
    }
    return DT_OK;
}

/* Polls *rq until it completes (DT_OK, *st filled; *rc MPI_Test's code), the deadline passes
   (DT_ERR_TIMEOUT, no message: the caller says what was missing), an abort notice arrives (DT_ERR_PEER)
   or the probe of rank probe (-1: all, -2: none) finds a mismatch. The probe drives MPI's progress, so
   what it sees may have arrived after this request completed: the request is tested again first. A
   message of a later collective may also overtake the completion of a large message still being copied,
   so that verdict must hold for DT__MPI_ORDER_GRACE seconds. Between polls the creator's thread backs
   off (dt__mpi_backoff), any other thread naps DT__MPI_HELPER_NAP. */
static dt_result dt__mpi_poll(dt_comm *c, MPI_Request *rq, MPI_Status *st, double deadline, int probe, int *rc) {
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
        if (pthread_equal(pthread_self(), dt__mpi_of(c)->owner)) dt__mpi_backoff(&since);
        else dt_sleep(DT__MPI_HELPER_NAP);   /* another thread (DDP's helper) waits while the owner computes */
    }
}

/* Posts the message the library filled in (MPI_Isend or MPI_Irecv); its MPI_Request goes into q->impl. */
static dt_result dt__mpi_post(dt_comm *c, dt_message *q) {
    dt__mpi *M = dt__mpi_of(c);
    MPI_Request rq = MPI_REQUEST_NULL;
    dt__mpi_req_set(q, MPI_REQUEST_NULL);
    if (q->bytes > (size_t)INT_MAX)
        return dt_set_error(DT_ERR_UNSUPPORTED, "a message of %zu bytes: MPI counts are int, so one message carries at most %d bytes; "
                            "send it in parts (collectives split theirs into segment_bytes)", q->bytes, INT_MAX);
    if (q->kind == DT_REQ_SEND) DT__MPI_TRY(MPI_Isend((void *)(uintptr_t)q->sbuf, (int)q->bytes, MPI_BYTE, q->peer, q->tag, M->comm, &rq));
    else DT__MPI_TRY(MPI_Irecv(q->rbuf, (int)q->bytes, MPI_BYTE, q->peer, q->tag, M->comm, &rq));
    dt__mpi_req_set(q, rq);
    return DT_OK;
}

/* A request MPI_Test reported complete: its error (truncation is a mismatch), the bytes received. */
static dt_result dt__mpi_complete(dt_message *q, MPI_Status *st, int rc) {
    int n = 0;
    q->state = DT_REQ_DONE;
    dt__mpi_req_set(q, MPI_REQUEST_NULL);
    if (rc != MPI_SUCCESS) {
        int cls = 0;
        MPI_Error_class(rc, &cls);
        if (cls == MPI_ERR_TRUNCATE)
            return dt_set_error(DT_ERR_MISMATCH, "rank %d sent more than the %zu bytes this receive accepts", q->peer, q->bytes);
        return dt__mpi_error(rc, q->kind == DT_REQ_SEND ? "MPI_Isend" : "MPI_Irecv");
    }
    if (q->kind == DT_REQ_RECV) {
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
static void dt__mpi_cancel(dt_comm *c, dt_message *q) {
    dt__mpi *M = dt__mpi_of(c);
    MPI_Request rq = dt__mpi_req_get(q);
    int flag = 0;
    double since = 0;
    if (q->kind == DT_REQ_NONE || q->state == DT_REQ_DONE || rq == MPI_REQUEST_NULL) return;
    if (M->cancel_until == 0) M->cancel_until = dt_time_now() + DT__MPI_CANCEL_WAIT;
    if (MPI_Cancel(&rq) == MPI_SUCCESS)
        while (MPI_Test(&rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && dt_time_now() < M->cancel_until)
            dt__mpi_backoff(&since);
    if (!flag && rq != MPI_REQUEST_NULL) MPI_Request_free(&rq);
    dt__mpi_req_set(q, MPI_REQUEST_NULL);
    q->state = DT_REQ_CANCELLED;
}

static dt_result dt__mpi_wait(dt_comm *c, dt_message *q, double deadline) {
    MPI_Request rq = dt__mpi_req_get(q);
    MPI_Status st;
    int rc = MPI_SUCCESS, probe = q->kind == DT_REQ_RECV && dt_comm_tag_seq(q->tag) >= 0 ? q->peer : -2;
    dt_result r;
    if (q->state == DT_REQ_CANCELLED) return dt_set_error(DT_ERR_STATE, "the request was cancelled");
    if (q->state == DT_REQ_DONE) return DT_OK;
    r = dt__mpi_poll(c, &rq, &st, deadline, probe, &rc);
    dt__mpi_req_set(q, rq);
    if (r == DT_OK) return dt__mpi_complete(q, &st, rc);
    dt__mpi_cancel(c, q);
    if (r == DT_ERR_TIMEOUT)
        return dt_set_error(DT_ERR_TIMEOUT, "no %s rank %d within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)",
                            q->kind == DT_REQ_SEND ? "receive was posted by" : "message came from", q->peer, dt_comm_get_desc(c).timeout);
    return r;
}

static dt_result dt__mpi_test(dt_comm *c, dt_message *q, int *done) {
    MPI_Request rq = dt__mpi_req_get(q);
    MPI_Status st;
    int rc, flag = 0;
    dt_result r;
    *done = 0;
    if (q->state == DT_REQ_DONE) { *done = 1; return DT_OK; }
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
    if (r != DT_OK) dt__mpi_of(c)->stuck = 1;
    if (r == DT_ERR_TIMEOUT)
        return dt_set_error(DT_ERR_TIMEOUT, "not every rank arrived within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)", dt_comm_get_desc(c).timeout);
    if (r == DT_OK && rc != MPI_SUCCESS) return dt__mpi_error(rc, call);
    return r;
}

/* Before every native collective: an all-reduce (MAX) of {h, ~h}, h a 64-bit hash of the signature
   (number, kind, count, type, op, root, algorithm). Everyone gets the same pair, and it equals a rank's
   own exactly when every h is equal, so all ranks reach the same verdict. It costs one all-reduce of
   16 bytes (a few microseconds in shared memory, one latency-bound round on a network), and it is also
   the barrier: no rank leaves an all-reduce before every rank has entered it. */
static dt_result dt__mpi_sigcheck(dt_comm *c, double deadline) {
    dt__mpi *M = dt__mpi_of(c);
    uint64_t h = dt_comm_signature(c), *mine = M->sig_in, *all = M->sig_out;
    MPI_Request rq = MPI_REQUEST_NULL;
    dt_result r;
    mine[0] = h; mine[1] = ~h;
    DT__MPI_TRY(MPI_Iallreduce(mine, all, 2, MPI_UINT64_T, MPI_MAX, M->comm, &rq));
    r = dt__mpi_native_wait(c, &rq, deadline, "MPI_Iallreduce");
    if (r == DT_ERR_PEER && M->in.result == DT_ERR_MISMATCH) {
        /* a rank whose check completed found a mismatch: so will this one, once MPI delivers the result */
        int flag = 0, rc;
        double since = 0;
        while ((rc = MPI_Test(&rq, &flag, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !flag && dt_time_now() < deadline) dt__mpi_backoff(&since);
        if (rc != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Iallreduce");
        if (flag) { r = DT_OK; M->stuck = 0; }
    }
    if (r != DT_OK) return r;
    if (all[0] != mine[0] || all[1] != mine[1]) {
        char what[128];
        dt_comm_describe(c, what, sizeof what);
        return dt_set_error(DT_ERR_MISMATCH, "another rank called a different collective, or the same with a different count, type, op, root "
                            "or algorithm, as collective #%llu (this rank called %s): every rank must make the same collective calls in the same order",
                            (unsigned long long)dt_comm_seq(c), what);
    }
    return DT_OK;
}

static dt_result dt__mpi_barrier(dt_comm *c, double deadline) { return dt__mpi_sigcheck(c, deadline); }

/* The native collectives run on M->stage, a buffer of the communicator's, never on the caller's: a
   collective that failed (a peer gone, the deadline passed) leaves its request with MPI, which may complete
   it later and write the result; by then the caller may have freed its buffer (a model destroyed as its
   rank ends), and MPI's write corrupted the heap. The stage, like M, is kept while MPI holds a request.
   The price is a copy in and out of each native collective's data. */
static void *dt__mpi_stage(dt__mpi *M, size_t bytes) {
    if (bytes > M->stage_bytes) {
        void *p = DT_MALLOC(bytes);
        if (!p) return NULL;
        DT_FREE(M->stage);
        M->stage = p;
        M->stage_bytes = bytes;
    }
    return M->stage;
}

static dt_result dt__mpi_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, double deadline) {
    dt__mpi *M = dt__mpi_of(c);
    static const int opn[] = {0, 0, 1, 2};
    MPI_Datatype types[] = {MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, MPI_UINT8_T};
    MPI_Op ops[] = {MPI_SUM, MPI_MAX, MPI_MIN};
    size_t es = dt_dtype_size(t), off;
    dt_result r = dt__mpi_sigcheck(c, deadline);
    /* MPICH 4.0 (Debian 12) compares MPI_UINT8_T and MPI_UNSIGNED_CHAR as signed in MPI_MAX and MPI_MIN
       (max(84, 169) = 84). Flipping the top bit maps unsigned order onto signed order, so max/min of
       bytes run as MPI_INT8_T on x ^ 0x80 and flip back. */
    int flip = t == DT_U8 && (op == DT_MAX || op == DT_MIN);
    size_t part = count < (size_t)INT_MAX ? count : (size_t)INT_MAX;   /* MPI counts are int */
    unsigned char *st;
    if (r != DT_OK) return r;
    if (!(st = (unsigned char *)dt__mpi_stage(M, part * es + 1)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "MPI all-reduce: no memory to stage %zu bytes", part * es);
    if (flip) types[DT_U8] = MPI_INT8_T;
    dt_comm_count_native(c, count * es, 2);
    for (off = 0; r == DT_OK && off < count; ) {
        size_t n = count - off < part ? count - off : part, i;
        MPI_Request rq = MPI_REQUEST_NULL;
        memcpy(st, (char *)buf + off * es, n * es);
        if (flip) for (i = 0; i < n; i++) st[i] ^= 0x80;
        DT__MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, st, (int)n, types[t], ops[opn[op]], M->comm, &rq));
        if ((r = dt__mpi_native_wait(c, &rq, deadline, "MPI_Iallreduce")) != DT_OK) break;
        if (flip) for (i = 0; i < n; i++) st[i] ^= 0x80;
        memcpy((char *)buf + off * es, st, n * es);
        off += n;
    }
    return r;
}

static dt_result dt__mpi_broadcast(dt_comm *c, void *buf, size_t bytes, int root, double deadline) {
    dt__mpi *M = dt__mpi_of(c);
    size_t off, part = bytes < ((size_t)1 << 30) ? bytes : ((size_t)1 << 30);
    dt_result r = dt__mpi_sigcheck(c, deadline);
    char *st;
    if (r != DT_OK) return r;
    if (!(st = (char *)dt__mpi_stage(M, part + 1)))   /* see dt__mpi_stage */
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "MPI broadcast: no memory to stage %zu bytes", part);
    dt_comm_count_native(c, bytes, 1);
    for (off = 0; r == DT_OK && off < bytes; ) {
        size_t n = bytes - off < part ? bytes - off : part;
        MPI_Request rq = MPI_REQUEST_NULL;
        if (dt_comm_rank(c) == root) memcpy(st, (char *)buf + off, n);
        DT__MPI_TRY(MPI_Ibcast(st, (int)n, MPI_BYTE, root, M->comm, &rq));
        if ((r = dt__mpi_native_wait(c, &rq, deadline, "MPI_Ibcast")) != DT_OK) break;
        if (dt_comm_rank(c) != root) memcpy((char *)buf + off, st, n);
        off += n;
    }
    return r;
}

/* Native all-to-all (MPI_Ialltoall) on the stage: send blocks in the first half, received ones in the
   second. Blocks are moved in parts of at most 1 GiB over all ranks, since MPI counts are int. */
static dt_result dt__mpi_alltoall(dt_comm *c, const void *send, void *recv, size_t bytes, double deadline) {
    dt__mpi *M = dt__mpi_of(c);
    size_t p = (size_t)dt_comm_size(c), part = ((size_t)1 << 30) / p, off, k;
    dt_result r = dt__mpi_sigcheck(c, deadline);
    char *st;
    if (r != DT_OK) return r;
    if (part > bytes) part = bytes;
    if (!(st = (char *)dt__mpi_stage(M, 2 * p * part + 1)))   /* see dt__mpi_stage */
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "MPI all-to-all: no memory to stage %zu bytes", 2 * p * part);
    dt_comm_count_native(c, bytes * p, 1);
    for (off = 0; r == DT_OK && off < bytes; ) {
        size_t n = bytes - off < part ? bytes - off : part;
        MPI_Request rq = MPI_REQUEST_NULL;
        for (k = 0; k < p; k++) memcpy(st + k * n, (const char *)send + k * bytes + off, n);
        DT__MPI_TRY(MPI_Ialltoall(st, (int)n, MPI_BYTE, st + p * n, (int)n, MPI_BYTE, M->comm, &rq));
        if ((r = dt__mpi_native_wait(c, &rq, deadline, "MPI_Ialltoall")) != DT_OK) break;
        for (k = 0; k < p; k++) memcpy((char *)recv + k * bytes + off, st + p * n + k * n, n);
        off += n;
    }
    return r;
}

/* A rank that failed sends every other rank the abort notice (once; not when this rank's failure is
   only the echo of another's notice, which reached everyone already). The sends finish in the
   background (the notice is small, so MPI sends it eagerly) and are completed by destroy. MPI cannot
   tell the others that a rank finished (DT_OK): their waits for it end at the timeout. */
static void dt__mpi_leave(dt_comm *c, dt_result r, const char *msg) {
    dt__mpi *M = dt__mpi_of(c);
    int k;
    if (r == DT_OK || M->notified || (r == DT_ERR_PEER && M->peer >= 0)) return;
    M->notified = 1;
    M->out.id = M->id;
    M->out.result = (int32_t)r;
    snprintf(M->out.msg, sizeof M->out.msg, "%s", msg ? msg : "");
    for (k = 0; k < dt_comm_size(c); k++)
        if (k == dt_comm_rank(c) || MPI_Isend(&M->out, (int)sizeof M->out, MPI_BYTE, k, M->abort_tag, M->comm, &M->out_reqs[k]) != MPI_SUCCESS)
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
    dt__mpi *M = dt__mpi_of(c);
    int k, pending = 0;
    double since = 0;
    double until = dt_time_now() + 1.0;
    if (!M) return;
    for (k = 0; k < dt_comm_size(c); k++) {   /* the notices: at most a second more, then left to MPI */
        int flag = 0;
        while (M->out_reqs[k] != MPI_REQUEST_NULL && MPI_Test(&M->out_reqs[k], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag &&
               dt_time_now() < until)
            dt__mpi_backoff(&since);
        if (M->out_reqs[k] != MPI_REQUEST_NULL) { MPI_Request_free(&M->out_reqs[k]); pending = 1; }
    }
    if (!dt_comm_broken(c) && !M->notified) {
        dt__mpi_notices(c);   /* a notice that came after this rank's last call: taken off the queue */
        MPI_Comm_free(&M->comm);
    } else dt__mpi_keep(M->comm);
    DT_FREE(M->out_reqs);
    if (!pending && !M->stuck) { DT_FREE(M->stage); DT_FREE(M); }   /* else MPI may still read M->out or write M->sig_out, M->stage */
}

/* Another thread may call MPI, one at a time, when MPI was initialised SERIALIZED (dt_launch does) or MULTIPLE. */
static int dt__mpi_any_thread(const dt_comm *c) { return dt__mpi_of(c)->serialized; }

static const dt_comm_backend dt__mpi_backend = {
    "mpi", dt__mpi_post, dt__mpi_post, dt__mpi_wait, dt__mpi_test, dt__mpi_cancel,
    dt__mpi_barrier, dt__mpi_allreduce, dt__mpi_broadcast, NULL, dt__mpi_leave, dt__mpi_destroy, dt__mpi_any_thread,
    dt__mpi_alltoall};

MPI_Comm dt_comm_mpi_handle(const dt_comm *c) {
    return dt_comm_backend_table(c) == &dt__mpi_backend && dt_comm_impl(c) ? dt__mpi_of(c)->comm : MPI_COMM_NULL;
}

/* The part of create that may fail after the duplicate exists: this rank, the world, the largest tag, the
   identity abort notices carry, the notices' requests. */
static dt_result dt__mpi_setup(dt__mpi *M, int *rank, int *size, int *tag_ub) {
    int flag = 0, *ub = NULL, k, level = MPI_THREAD_SINGLE;
    static uint64_t made = 0;
    dt_rng g;
    DT__MPI_TRY(MPI_Comm_set_errhandler(M->comm, MPI_ERRORS_RETURN));
    DT__MPI_TRY(MPI_Query_thread(&level));
    M->serialized = level >= MPI_THREAD_SERIALIZED;
    M->owner = pthread_self();
    DT__MPI_TRY(MPI_Comm_rank(M->comm, rank));
    DT__MPI_TRY(MPI_Comm_size(M->comm, size));
    DT__MPI_TRY(MPI_Comm_get_attr(M->comm, MPI_TAG_UB, &ub, &flag));
    *tag_ub = M->abort_tag = flag && ub ? *ub : -1;   /* collectives' tags stay below it (dt_comm_create_backend checks it) */
    dt_rng_init(&g, (uint64_t)(dt_time_now() * 1e9) ^ ((uint64_t)getpid() << 32), ++made);
    M->id = (uint64_t)dt_rng_u32(&g) << 32;
    M->id |= dt_rng_u32(&g);
    DT__MPI_TRY(MPI_Bcast(&M->id, 1, MPI_UINT64_T, 0, M->comm));
    M->out_reqs = (MPI_Request *)DT_MALLOC((size_t)*size * sizeof *M->out_reqs);
    if (!M->out_reqs) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_mpi: no memory for %d ranks", *size);
    for (k = 0; k < *size; k++) M->out_reqs[k] = MPI_REQUEST_NULL;
    return DT_OK;
}

/* The nodes (DT_ALGO_HIER): the ranks that share memory (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED), each
   node named by its lowest rank, which every rank learns of every other (MPI_Allgather). */
static dt_result dt__mpi_nodes(dt_comm *c) {
    dt__mpi *M = dt__mpi_of(c);
    MPI_Comm node = MPI_COMM_NULL;
    int me = dt_comm_rank(c), lead = me, rc, *all;
    dt_result r;
    DT__MPI_TRY(MPI_Comm_split_type(M->comm, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node));
    rc = MPI_Allreduce(&me, &lead, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Allreduce");
    if (!(all = (int *)DT_MALLOC(sizeof(int) * (size_t)dt_comm_size(c))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_mpi: no memory for %d ranks", dt_comm_size(c));
    rc = MPI_Allgather(&lead, 1, MPI_INT, all, 1, MPI_INT, M->comm);
    r = rc != MPI_SUCCESS ? dt__mpi_error(rc, "MPI_Allgather") : dt_comm_set_nodes(c, all);
    DT_FREE(all);
    return r;
}

dt_result dt_comm_create_mpi(dt_comm **out, MPI_Comm comm, const dt_comm_desc *desc) {
    dt__mpi *M;
    int init = 0, rc, rank = 0, size = 1, tag_ub = -1;
    dt_result r;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_mpi: out is NULL");
    *out = NULL;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init)
        return dt_set_error(DT_ERR_STATE, "dt_comm_create_mpi: MPI is not initialised: call MPI_Init_thread first (dt_launch does)");
    if (comm == MPI_COMM_NULL) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_mpi: comm is MPI_COMM_NULL");
    if (desc && desc->segment_bytes > (size_t)INT_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_mpi: segment_bytes %zu exceeds what one MPI message carries (%d)", desc->segment_bytes, INT_MAX);
    if (!(M = (dt__mpi *)DT_MALLOC(sizeof *M))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_mpi: no memory");
    memset(M, 0, sizeof *M);
    M->peer = -1;
    M->comm = MPI_COMM_NULL;
    if ((rc = MPI_Comm_dup(comm, &M->comm)) != MPI_SUCCESS) r = dt__mpi_error(rc, "MPI_Comm_dup");
    else r = dt__mpi_setup(M, &rank, &size, &tag_ub);
    if (r == DT_OK) r = dt_comm_create_backend(out, &dt__mpi_backend, M, rank, size, tag_ub, desc);
    if (r == DT_OK && dt_comm_get_desc(*out).node_size == 0 && (r = dt__mpi_nodes(*out)) != DT_OK) {
        dt_comm_destroy(*out);   /* frees M too */
        *out = NULL;
        return r;
    }
    if (r != DT_OK) {
        if (M->comm != MPI_COMM_NULL) MPI_Comm_free(&M->comm);
        DT_FREE(M->out_reqs); DT_FREE(M);
    }
    return r;
}

/* ---- the launcher under mpiexec ---------------------------------------------------------------- */

/* The end of a run. Every rank sends every other how it ended (its result) on a communicator of its own
   (end). While no failure is known a rank waits as long as the others work; once this rank has failed,
   or another's abort notice has come, it waits the timeout and a second more (the others' waits end by
   their timeout), and a rank that has not ended by then is stalled: MPI_Finalize would wait for it
   forever, so this rank logs its failure and the stalled ranks, and ends the job with MPI_Abort (exit
   status 1, every process). Otherwise returns 1 when this rank's failure (message m) is the one to log:
   the lowest rank's of its result, as every rank's NaN loss is one report; DT_ERR_PEER, which only
   follows from another rank's failure, only when no rank failed otherwise. A timeout's message gains the
   ranks that had not reached its collective (MPI cannot tell which rank a native collective misses). */
static int dt__mpi_end(dt_comm *c, MPI_Comm end, dt_result r, char *m, size_t cap) {
    int me = dt_comm_rank(c), n = dt_comm_size(c), k, done = 0, mine[2], first = me, other = 0, *res;
    double since = 0, heard = r != DT_OK ? dt_time_now() : 0, grace = dt_comm_get_desc(c).timeout + 1.0;
    MPI_Request *rq;
    if (r == DT_OK || r == DT_ERR_PEER) grace += 0.5;   /* the failed rank that caused it goes first and reports the cause */
    char late[160] = "";
    size_t len = 0;
    mine[0] = (int)r;
    mine[1] = (int)dt_comm_seq(c);   /* the collective this rank reached */
    res = (int *)DT_MALLOC((size_t)n * 2 * sizeof *res);
    rq = (MPI_Request *)DT_MALLOC((size_t)n * 2 * sizeof *rq);
    if (!res || !rq) { DT_FREE(res); DT_FREE(rq); return r != DT_OK; }   /* no memory to compare: log it */
    for (k = 0; k < 2 * n; k++) rq[k] = MPI_REQUEST_NULL;
    for (k = 0; k < n; k++) {
        res[2 * k] = k == me ? mine[0] : -1;
        res[2 * k + 1] = mine[1];
        if (k != me && (MPI_Irecv(&res[2 * k], 2, MPI_INT, k, 0, end, &rq[k]) != MPI_SUCCESS ||
                        MPI_Isend(mine, 2, MPI_INT, k, 0, end, &rq[n + k]) != MPI_SUCCESS)) heard = heard > 0 ? heard : dt_time_now();
    }
    while (!done) {
        for (k = 0, done = 1; k < 2 * n; k++) {
            int flag = 1;
            if (rq[k] != MPI_REQUEST_NULL && MPI_Test(&rq[k], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) rq[k] = MPI_REQUEST_NULL;
            done &= flag;
        }
        if (heard == 0 && dt__mpi_notices(c) != DT_OK) heard = dt_time_now();
        if (!done && heard > 0 && dt_time_now() > heard + grace) break;
        if (!done) dt__mpi_backoff(&since);
    }
    if (!done) {
        for (k = 0; k < n && len + 16 < sizeof late; k++)
            if (k != me && res[2 * k] < 0) {
                int w = snprintf(late + len, sizeof late - len, "%s%d", len ? ", " : "", k);
                if (w > 0) len += (size_t)w;
            }
        if (r != DT_OK) dt_log(r == DT_ERR_PEER ? DT_LOG_DEBUG : DT_LOG_ERROR, "%s", m);
        dt_log(DT_LOG_ERROR, "rank %d: the run has failed and rank%s %s %s not ended %.3g s later (stalled): ending the job (MPI_Abort), "
               "since MPI_Finalize would wait for %s forever", me, strchr(late, ',') ? "s" : "", late[0] ? late : "?",
               strchr(late, ',') ? "have" : "has", grace, strchr(late, ',') ? "them" : "it");
        fflush(NULL);
        dt_sleep(0.2);   /* mpiexec forwards the lines before it tears the job down (they were lost now and then) */
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (k = n - 1; k >= 0; k--) {
        if (res[2 * k] == mine[0]) first = k;
        other |= res[2 * k] != DT_OK && res[2 * k] != DT_ERR_PEER;
    }
    for (k = 0, len = strlen(m); r == DT_ERR_TIMEOUT && k < n && len + 40 < cap; k++)
        if (res[2 * k + 1] < mine[1]) {
            int w = snprintf(m + len, cap - len, "%s%d (at #%d)", strstr(m, "; ranks not in it: ") ? ", " : "; ranks not in it: ", k, res[2 * k + 1]);
            if (w > 0) len += (size_t)w;
        }
    DT_FREE(res);
    DT_FREE(rq);
    return r != DT_OK && first == me && (r != DT_ERR_PEER || !other);
}

/* Each process is one rank of MPI_COMM_WORLD: MPI_Init_thread (SERIALIZED) unless the program did, the
   communicator, then dt_launch_rank (the logger's rank, OpenMP threads for this node's cores over its
   ranks, the timeline, fn, a failure logged and announced), then the end (dt__mpi_end: a stalled rank
   ends the job). MPI_Finalize only when this call initialised MPI. */
dt_result dt_launch_mpi(const dt_launch_desc *desc, dt_rank_fn fn, void *arg) {
    int had = 0, provided = 0, rc, local = 1;
    MPI_Comm end = MPI_COMM_NULL;   /* the end's all-reduce (dt__mpi_end) */
    char msg[DT__ERROR_CAP];
    dt_comm *c = NULL;
    dt_launch_desc d;
    dt_result r = DT_OK;
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    if (MPI_Initialized(&had) != MPI_SUCCESS) had = 0;
    if (!had && (rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided)) != MPI_SUCCESS) {
        r = dt__mpi_error(rc, "MPI_Init_thread");
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        return r;
    }
    if (!fn) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_launch: the rank function is NULL");
    else if ((rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) != MPI_SUCCESS) r = dt__mpi_error(rc, "MPI_Comm_set_errhandler");
    else r = dt_comm_create_mpi(&c, MPI_COMM_WORLD, &d.comm);
    if (r == DT_OK && (rc = MPI_Comm_dup(MPI_COMM_WORLD, &end)) != MPI_SUCCESS) r = dt__mpi_error(rc, "MPI_Comm_dup");
    if (r == DT_OK) {
        MPI_Comm node;   /* the ranks sharing this node's cores */
        if (MPI_Comm_split_type(dt_comm_mpi_handle(c), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
            if (MPI_Comm_size(node, &local) != MPI_SUCCESS || local < 1) local = 1;
            MPI_Comm_free(&node);
        }
        r = dt_launch_rank(c, &d, local, fn, arg);
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        if (dt__mpi_end(c, end, r, msg, sizeof msg)) dt_log(DT_LOG_ERROR, "%s", msg);
        dt__error_restore(msg);   /* this rank's failure, also when another's was logged */
        MPI_Comm_free(&end);
    } else dt_log(DT_LOG_ERROR, "%s", dt_last_error()[0] ? dt_last_error() : "its rank function failed");
    dt_comm_destroy(c);
    if (!had) MPI_Finalize();
    return r;
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_IMPLEMENTATION && DTRAIN_MPI_DECLARED */
