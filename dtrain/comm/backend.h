/* dtrain/comm/backend.h - for backend authors: the interface a transport fills, and the layer behind it.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The backend-author interface: dt_comm_backend (point-to-point transport, optional native
     collectives), dt_message (a request as its backend sees it), DT_REQ_*, and the calls a backend
     uses (dt_comm_create_backend, dt_comm_impl, the current operation's number, signature and tag,
     dt_comm_count_native, dt_comm_set_nodes). dtrain_mpi.h and the local backend are written against
     it. The implementation is the generic layer every backend plugs into: the communicator's private
     state (struct dt_comm, whose body dtrain/core/internal.h holds as the view dtrain/comm/'s modules share;
     the request state dt__req in a dt_request's words), signatures and tags,
     failure reports, the reductions of received data, point-to-point through the backend with its
     counters, and creating and destroying communicators. Programs use dtrain/comm/comm.h instead.
   USES
     dtrain/comm/comm.h (the communicator's types) and what it includes.
   READ FIRST
     dt_comm_backend and dt_message, then dt__post, dt__wait and dt__step, then dt_comm_create_backend.
*/
#ifndef DTRAIN_BACKEND_H
#define DTRAIN_BACKEND_H
#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a transport needs to become a dt_comm backend: dtrain_mpi.h is written against these names alone,
   and the local and self backends (dtrain/comm/local.h) use them too. Programs need none of it. A backend
   is a table of functions (dt_comm_backend) and its own state (impl); the library above it does the
   argument checks, signatures, counters, error reports and every algorithm (docs/design.md, "The
   communicator"). */

/* A request's kind and progress (dt_message.kind, dt_message.state). */
enum { DT_REQ_NONE = 0, DT_REQ_SEND = 1, DT_REQ_RECV = 2 };
enum { DT_REQ_POSTED = 0, DT_REQ_MATCHED = 1, DT_REQ_DONE = 2, DT_REQ_CANCELLED = 3 };

/* A request as its backend sees it. The library fills in the message and sets state DT_REQ_POSTED
   before it calls isend or irecv; the backend keeps what it needs in impl and completes the request:
   received (a receive), then state DT_REQ_DONE, or DT_REQ_CANCELLED when cancel withdrew it. */
typedef struct dt_message {
    int          kind;         /* DT_REQ_SEND or DT_REQ_RECV */
    int          peer, tag;    /* destination or source; the tag (dt_comm_tag_seq tells collectives' apart) */
    int          owner;        /* the posting rank */
    size_t       bytes;        /* the size posted */
    size_t       received;     /* a completed receive: bytes that arrived (<= bytes) */
    const void  *sbuf;         /* a send's data */
    void        *rbuf;         /* a receive's buffer */
    volatile int state;        /* DT_REQ_POSTED .. DT_REQ_CANCELLED */
    uint64_t     impl[4];      /* the backend's own (e.g. an MPI_Request) */
} dt_message;

/* A backend: point-to-point transport plus optional native collectives (NULL = none; the library's
   algorithms are used). Deadlines are absolute dt_time_now() seconds: past one a backend returns
   DT_ERR_TIMEOUT, and DT_ERR_PEER when the peer has gone, with a message set by dt_set_error (the library
   adds the rank and the operation). */
typedef struct dt_comm_backend {
    const char *name;
    dt_result (*isend)(dt_comm *c, dt_message *m);                  /* post m (filled in by the library) */
    dt_result (*irecv)(dt_comm *c, dt_message *m);
    dt_result (*wait)(dt_comm *c, dt_message *m, double deadline);  /* until m is done */
    dt_result (*test)(dt_comm *c, dt_message *m, int *done);        /* *done = 1 when m is done; no waiting */
    void      (*cancel)(dt_comm *c, dt_message *m);                 /* after an error: withdraw a pending m */
    dt_result (*barrier)(dt_comm *c, double deadline);
    dt_result (*allreduce)(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, double deadline);
    dt_result (*broadcast)(dt_comm *c, void *buf, size_t bytes, int root, double deadline);
    /* appends to msg the ranks that have not reached collective seq (or "" when it cannot tell) */
    void      (*missing)(dt_comm *c, uint64_t seq, char *msg, size_t cap);
    /* this rank has gone: it failed with r (message msg), or finished (DT_OK); tell the other ranks where
       the transport can, so that they stop waiting for it */
    void      (*leave)(dt_comm *c, dt_result r, const char *msg);
    void      (*destroy)(dt_comm *c);                               /* frees impl (dt_comm_destroy calls it) */
    /* 1 when a thread other than the one that created c may call c while that one does not (calls on c
       stay one at a time, handed over through a mutex): DDP's helper thread then reduces buckets during
       backward. NULL: only the creating thread (DDP reduces after backward). */
    int       (*any_thread)(const dt_comm *c);
    /* native all-to-all of blocks of bytes (dt_comm_alltoall); NULL: the library's pairwise exchange */
    dt_result (*alltoall)(dt_comm *c, const void *send, void *recv, size_t bytes, double deadline);
} dt_comm_backend;

/* A communicator of rank `rank` of `size` over backend, whose state is impl (freed by backend->destroy
   from dt_comm_destroy). tag_ub: the largest tag the transport carries (user tags, the library's own, then
   collective tags below it; DT_ERR_UNSUPPORTED when too small). desc as for dt_comm_create_local (the link
   model is the backend's to honour). On failure *out is NULL and impl is still the caller's. */
dt_result dt_comm_create_backend(dt_comm **out, const dt_comm_backend *backend, void *impl, int rank, int size,
                                 int tag_ub, const dt_comm_desc *desc);
void     *dt_comm_impl(const dt_comm *c);                           /* the backend's state given at creation */
const dt_comm_backend *dt_comm_backend_table(const dt_comm *c);     /* the table c runs on */
/* The backend's grouping of ranks into nodes (node_of[size]: equal values = one node), for DT_ALGO_HIER,
   the link model and dt_comm_nodes; a backend that knows it calls this once, after creation, unless
   dt_comm_get_desc(c).node_size declares one. Without it every rank is its own node. */
dt_result dt_comm_set_nodes(dt_comm *c, const int *node_of);
/* The number of the current (or last) collective: 1 for the first. */
uint64_t  dt_comm_seq(const dt_comm *c);
/* A 64-bit hash of the current operation's signature (number, kind, count, type, op, root, algorithm):
   equal on two ranks when they are in the same collective; a backend compares it to detect a mismatch. */
uint64_t  dt_comm_signature(const dt_comm *c);
/* The current operation as text for reports, e.g. "all-reduce #17 (1000 x f32, sum, ring)". */
void      dt_comm_describe(const dt_comm *c, char *buf, size_t cap);
/* DT_OK, or the error that broke c: after a failure every call on c returns it. */
dt_result dt_comm_broken(const dt_comm *c);
/* Counts a native collective's traffic as a ring's: factor (p - 1) / p bytes per rank each way (factor 2
   for all-reduce, 1 for broadcast), so the counters compare across algorithms. */
void      dt_comm_count_native(dt_comm *c, size_t bytes, int factor);
/* The tag of the current collective's messages (from its number and a hash of its signature; below tag_ub). */
int       dt_comm_coll_tag(const dt_comm *c);
/* The collective number a collective tag carries (equal for two tags of one collective), or -1 for a
   point-to-point tag (the user's, or the library's own). */
int       dt_comm_tag_seq(int tag);

/* Internal (for the algorithms, the local backend and the library's own messages; not the API):
   what a communicator is doing, the kind of its current operation (stored in its signature's third word); */
enum { DT__OP_P2P = 0, DT__OP_BARRIER, DT__OP_BROADCAST, DT__OP_REDUCE, DT__OP_ALLREDUCE, DT__OP_SCATTER,
       DT__OP_GATHER, DT__OP_ALLGATHER, DT__OP_REDUCE_SCATTER, DT__OP_NEIGHBOR, DT__OP_ALLTOALL, DT__OP_ALLTOALLV,
       DT__OP_COUNT };
/* the kinds of fault to inject (dt_comm_desc.fault); */
enum { DT__FAULT_NONE = 0, DT__FAULT_FAIL, DT__FAULT_RETURN, DT__FAULT_STALL, DT__FAULT_HANG, DT__FAULT_NAN };
/* and the tags: the user's are 0 .. DT_TAG_USER_MAX. Above them, DT__TAG_LIB .. DT__TAG_LIB_END - 1 belong to
   the library's own point-to-point messages, which only its internal calls (dt__lib_send, ...) may use: a
   user's tag can never meet them. A module that sends such messages names its tag DT__TAG_LIB + k, k its own:
   0 DDP's parameter server and P2P (ddp.h), 1 FedAvg's reports (fedavg.h), 2 the timeline under MPI (launch.h). */
enum { DT__TAG_LIB = DT_TAG_USER_MAX + 1, DT__TAG_LIB_END = DT_TAG_USER_MAX + 65 };
/* Internal, for the algorithms and the local backend (not the API): a fault to inject (dt_comm_desc.fault),
   parsed; */
typedef struct dt__fault {
    int      kind, rank;
    uint64_t coll;
    double   seconds;   /* stall */
    int      fired;     /* set when it fired: under dt_launch a rank whose fault never fired fails, since a fault
                           test that injects nothing would pass without testing anything */
    char     spec[64];  /* as given, for the reports */
} dt__fault;
/* and what a dt_request holds: the message its backend sees, then what only the library (and its local
   backend) keeps. A dt_request's reserved words are only ever read and written as this struct (its size and
   alignment are checked in the implementation). */
typedef struct dt__req {
    dt_message      m;            /* first: a backend's dt_message * is the dt__req * */
    uint64_t        sig[3];       /* the operation the message belongs to (the local backend compares them) */
    double          not_before;   /* local link model: the time the message has crossed the link */
    dt_result       error;        /* local: a mismatch found when the message was matched */
    int             esize;        /* bytes per element of the type posted (dt_request_received) */
    struct dt__req *next;         /* local: the queue link */
} dt__req;
#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_BACKEND_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_BACKEND_IMPLEMENTATION_DONE)
#define DTRAIN_BACKEND_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

/* ---- communicator: the generic layer ----------------------------------------------------------- */
/* Everything between the calls and the transport: the collective's signature and sequence number, error
   reports, counters, and point-to-point through the backend; the algorithms over it are in algos.h. */

#ifdef __cplusplus
#define DT__STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define DT__STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* The communicator of one rank, struct dt_comm: its body is in dtrain/core/internal.h (under this module's
   heading), the view of it that the communicator's modules share (dtrain/comm/: the algorithms of algos.h read
   its fields); to the other modules and to the programs it is opaque. */
typedef struct dt__req_align { char c; dt__req r; } dt__req_align;
typedef struct dt__request_align { char c; dt_request r; } dt__request_align;
DT__STATIC_ASSERT(sizeof(dt__req) <= sizeof(dt_request), "dtrain: dt_request has too few reserved words for dt__req");
DT__STATIC_ASSERT(offsetof(dt__request_align, r) >= offsetof(dt__req_align, r), "dtrain: dt_request is less aligned than dt__req");
static dt__req *dt__rq(dt_request *q) { return (dt__req *)(void *)q; }
/* The names of the kinds of operation (DT__OP_*: above). */
static const char *dt__op_names[DT__OP_COUNT] = {"point-to-point", "barrier", "broadcast", "reduce", "all-reduce",
                                                  "scatter", "gather", "all-gather", "reduce-scatter",
                                                  "neighbour exchange", "all-to-all", "all-to-all-v"};
/* From DT__TAG_COLL up the tags belong to collectives: number and signature hash (dt_comm_coll_tag). */
#define DT__TAG_COLL DT__TAG_LIB_END
#define DT__TAG_HASH_BITS 6

/* The accessors dtrain/core/internal.h declares for the backends (comm/local.h), and the name of a kind of operation
   for the algorithms' trace */
static inline dt_comm_stats *dt__comm_stats(dt_comm *c) { return &c->stats; }
static inline const uint64_t *dt__comm_sig(const dt_comm *c) { return c->sig; }
static inline const uint64_t *dt__comm_coll_sig(const dt_comm *c) { return c->coll_sig; }
static inline const char *dt__op_name(int kind) { return dt__op_names[kind]; }

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : 0; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : 1; }
const char *dt_comm_backend_name(const dt_comm *c) { return (c && c->backend) ? c->backend->name : "none"; }
dt_comm_stats dt_comm_get_stats(const dt_comm *c) {
    dt_comm_stats z;
    if (c) return c->stats;
    memset(&z, 0, sizeof z);
    return z;
}
void dt_comm_reset_stats(dt_comm *c) { if (c) memset(&c->stats, 0, sizeof c->stats); }
dt_comm_desc dt_comm_get_desc(const dt_comm *c) {
    dt_comm_desc z;
    if (c) return c->desc;
    memset(&z, 0, sizeof z);
    return z;
}

/* The signature of an operation: sig[0] sequence number, sig[1] count, sig[2] kind | type | op | root | algo.
   Two ranks in the same collective have equal signatures; the transport compares them. */
static void dt__comm_begin(dt_comm *c, int kind, size_t count, int t, int op, int root, int algo) {
    c->sig[0] = c->seq;
    c->sig[1] = (uint64_t)count;
    c->sig[2] = (uint64_t)kind | ((uint64_t)(t & 0xff) << 8) | ((uint64_t)(op & 0xff) << 16) |
                ((uint64_t)(uint32_t)(root + 1) << 24) | ((uint64_t)(algo & 0xff) << 56);
}
static void dt__sig_str(const uint64_t *sig, char *buf, size_t cap) {
    int kind = (int)(sig[2] & 0xff), t = (int)((sig[2] >> 8) & 0xff), op = (int)((sig[2] >> 16) & 0xff);
    int root = (int)((sig[2] >> 24) & 0xffffffffu) - 1, algo = (int)(sig[2] >> 56);
    int n = snprintf(buf, cap, "%s #%llu (", kind < DT__OP_COUNT ? dt__op_name(kind) : "?", (unsigned long long)sig[0]);
    if (n < 0 || (size_t)n >= cap) return;
    if (kind == DT__OP_BARRIER) { snprintf(buf + n, cap - (size_t)n, "%s)", dt_algo_name((dt_algo)algo)); return; }
    if (kind == DT__OP_ALLTOALLV) { snprintf(buf + n, cap - (size_t)n, "%s, a size per block)", dt_dtype_name((dt_dtype)t)); return; }
    n += snprintf(buf + n, cap - (size_t)n, "%llu x %s", (unsigned long long)sig[1], dt_dtype_name((dt_dtype)t));
    if ((size_t)n >= cap) return;
    if (kind == DT__OP_REDUCE || kind == DT__OP_ALLREDUCE || kind == DT__OP_REDUCE_SCATTER)
        n += snprintf(buf + n, cap - (size_t)n, ", %s", dt__reduce_name(op));
    if ((size_t)n >= cap) return;
    if (root >= 0 && (kind == DT__OP_BROADCAST || kind == DT__OP_REDUCE || kind == DT__OP_SCATTER || kind == DT__OP_GATHER))
        n += snprintf(buf + n, cap - (size_t)n, ", root %d", root);
    if ((size_t)n >= cap) return;
    if (kind == DT__OP_BROADCAST || kind == DT__OP_REDUCE || kind == DT__OP_ALLREDUCE)
        n += snprintf(buf + n, cap - (size_t)n, ", %s", dt_algo_name((dt_algo)algo));
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}
static uint64_t dt__sig_hash(const uint64_t *sig) {
    uint64_t h = 1469598103934665603ull ^ sig[1];
    h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull;
    h ^= sig[2];
    h = (h ^ (h >> 31)) * 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}
/* The tag of the current collective's messages: DT__TAG_COLL + (seq mod nseq) << 6 + a 6-bit hash of the
   signature, so a transport that matches on tags alone (MPI) still tells collectives and their sizes apart. */
int dt_comm_coll_tag(const dt_comm *c) {
    uint64_t nseq = (uint64_t)((c->tag_ub - DT__TAG_COLL) >> DT__TAG_HASH_BITS);
    return DT__TAG_COLL + (int)(((c->sig[0] % nseq) << DT__TAG_HASH_BITS) | (dt__sig_hash(c->sig) & ((1u << DT__TAG_HASH_BITS) - 1)));
}
int dt_comm_tag_seq(int tag) { return tag >= DT__TAG_COLL ? (tag - DT__TAG_COLL) >> DT__TAG_HASH_BITS : -1; }

void dt_comm_describe(const dt_comm *c, char *buf, size_t cap) {
    if (!c || !buf || !cap) { if (buf && cap) buf[0] = 0; return; }
    if ((c->sig[2] & 0xff) == DT__OP_P2P) snprintf(buf, cap, "point-to-point");
    else dt__sig_str(c->sig, buf, cap);
}
/* The seq is mixed in too: two collectives of one signature must not look alike. */
uint64_t dt_comm_signature(const dt_comm *c) { return c ? dt__sig_hash(c->sig) ^ dt__mix64(c->sig[0] + 0x9e3779b97f4a7c15ull) : 0; }
uint64_t dt_comm_seq(const dt_comm *c) { return c ? c->seq : 0; }
void *dt_comm_impl(const dt_comm *c) { return c ? c->impl : NULL; }
const dt_comm_backend *dt_comm_backend_table(const dt_comm *c) { return c ? c->backend : NULL; }
dt_result dt_comm_broken(const dt_comm *c) { return c ? c->broken : DT_OK; }

/* A message that may begin with its result code's name ("DT_ERR_IO: ..."): the text after it. */
static const char *dt__cause(const char *m, dt_result r) {
    const char *pre = dt_result_str(r);
    size_t lp = strlen(pre);
    return strncmp(m, pre, lp) == 0 && m[lp] == ':' ? m + lp + 1 + (m[lp + 1] == ' ') : m;
}

/* Records a failure of the current operation: the communicator becomes unusable (every later call
   returns the same error), the other ranks are told where the backend can, and dt_last_error() reads
   "rank R: <operation>: <cause>[; <who is missing>]". cause is the transport's message. */
static dt_result dt__comm_fail(dt_comm *c, dt_result r, const char *cause) {
    char what[160], miss[192] = "";
    cause = dt__cause(cause, r);
    dt_comm_describe(c, what, sizeof what);
    if ((c->sig[2] & 0xff) != DT__OP_P2P && c->backend->missing) c->backend->missing(c, c->sig[0], miss, sizeof miss);
    snprintf(c->broken_msg, sizeof c->broken_msg, "rank %d: %s: %s%s%s", c->rank, what, cause, miss[0] ? "; " : "", miss);
    c->broken = r;
    if (c->backend->leave) c->backend->leave(c, r, c->broken_msg);
    return dt_set_error(r, "%s", c->broken_msg);
}
/* A call on a communicator that failed before. */
static dt_result dt__comm_broken(const dt_comm *c) {
    return dt_set_error(c->broken, "this communicator failed earlier and cannot be used (destroy it): %s", c->broken_msg);
}

/* 1 when a thread other than c's creator may call c, one thread at a time (the backend's any_thread). */
static inline int dt__comm_any_thread(const dt_comm *c) { return c->backend->any_thread && c->backend->any_thread(c); }

/* Scratch memory kept by the communicator: grown outside the steady state, reused by every call. */
static dt_result dt__comm_scratch(dt_comm *c, size_t bytes, void **out) {
    if (bytes > c->scratch_bytes) {
        void *p = DT_MALLOC(bytes);
        if (!p) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "communicator: no memory for %zu bytes of scratch", bytes);
        DT_FREE(c->scratch);
        c->scratch = p;
        c->scratch_bytes = bytes;
    }
    *out = c->scratch;
    return DT_OK;
}
static dt_result dt__comm_reqs(dt_comm *c, int n, dt_request **out) {
    if (n > c->nreqs) {
        dt_request *p = (dt_request *)DT_MALLOC((size_t)n * sizeof *p);
        if (!p) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "communicator: no memory for %d requests", n);
        DT_FREE(c->reqs);
        c->reqs = p;
        c->nreqs = n;
    }
    *out = c->reqs;
    return DT_OK;
}

/* Element-wise dst = dst (op) src over n elements; MEAN reduces as SUM (the division comes once, after). */
#define DT__REDUCE_LOOP(T)                                                                               \
    do {                                                                                                 \
        T *d = (T *)dst;                                                                                 \
        const T *s = (const T *)src;                                                                     \
        size_t i;                                                                                        \
        if (op == DT_SUM || op == DT_MEAN) for (i = 0; i < n; i++) d[i] = d[i] + s[i];                   \
        else if (op == DT_MAX) for (i = 0; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];                 \
        else for (i = 0; i < n; i++) d[i] = s[i] < d[i] ? s[i] : d[i];                                   \
    } while (0)
/* The 16-bit floats: decoded, combined in float, encoded (one rounding per partial sum). */
static void dt__reduce_half(uint16_t *dst, const uint16_t *src, size_t n, dt_dtype t, dt_reduce_op op) {
    float (*dec)(uint16_t) = t == DT_BF16 ? dt_bf16_to_float : dt_f16_to_float;
    uint16_t (*enc)(float) = t == DT_BF16 ? dt_bf16_from_float : dt_f16_from_float;
    size_t i;
    for (i = 0; i < n; i++) {
        float a = dec(dst[i]), b = dec(src[i]);
        dst[i] = enc(op == DT_SUM || op == DT_MEAN ? a + b : op == DT_MAX ? (b > a ? b : a) : (b < a ? b : a));
    }
}
static void dt__reduce_into(void *DT__RESTRICT dst, const void *DT__RESTRICT src, size_t n, dt_dtype t, dt_reduce_op op) {
    switch (t) {
    case DT_BF16: case DT_F16: dt__reduce_half((uint16_t *)dst, (const uint16_t *)src, n, t, op); break;
    case DT_F32: DT__REDUCE_LOOP(float); break;
    case DT_F64: DT__REDUCE_LOOP(double); break;
    case DT_I32: DT__REDUCE_LOOP(int32_t); break;
    case DT_I64: DT__REDUCE_LOOP(int64_t); break;
    default: DT__REDUCE_LOOP(uint8_t); break;
    }
}
#undef DT__REDUCE_LOOP
/* MEAN's division, the same expression on every path: x / p. */
static void dt__mean_finish(void *buf, size_t n, dt_dtype t, int p) {
    size_t i;
    if (t == DT_F32) { float *x = (float *)buf; for (i = 0; i < n; i++) x[i] = x[i] / (float)p; }
    else if (t == DT_F64) { double *x = (double *)buf; for (i = 0; i < n; i++) x[i] = x[i] / (double)p; }
    else if (t == DT_BF16) { uint16_t *x = (uint16_t *)buf; for (i = 0; i < n; i++) x[i] = dt_bf16_from_float(dt_bf16_to_float(x[i]) / (float)p); }
    else if (t == DT_F16) { uint16_t *x = (uint16_t *)buf; for (i = 0; i < n; i++) x[i] = dt_f16_from_float(dt_f16_to_float(x[i]) / (float)p); }
}

/* ---- point-to-point through the backend, with counters and error reports ---- */

/* Fills in q's message (kind, peer, tag, ... and the operation's signature) and has the backend post it.
   esize: bytes per element of the type posted. A request whose post failed is "none". */
static dt_result dt__post(dt_comm *c, int kind, const void *buf, size_t bytes, int peer, int tag, int esize, dt__req *q) {
    dt_result r;
    memset(q, 0, sizeof *q);
    q->m.kind = kind; q->m.peer = peer; q->m.tag = tag; q->m.owner = c->rank; q->m.bytes = bytes;
    if (kind == DT_REQ_SEND) q->m.sbuf = buf; else q->m.rbuf = (void *)(uintptr_t)buf;
    q->m.state = DT_REQ_POSTED;
    memcpy(q->sig, c->sig, sizeof q->sig);
    q->esize = esize;
    r = kind == DT_REQ_SEND ? c->backend->isend(c, &q->m) : c->backend->irecv(c, &q->m);
    if (r != DT_OK) { q->m.kind = DT_REQ_NONE; return dt__comm_fail(c, r, dt_last_error()); }
    if (kind == DT_REQ_SEND) { c->stats.bytes_sent += bytes; c->stats.messages_sent++; }
    return DT_OK;
}
static dt_result dt__isend(dt_comm *c, const void *buf, size_t bytes, int dst, int tag, dt__req *q) {
    return dt__post(c, DT_REQ_SEND, buf, bytes, dst, tag, 1, q);
}
static dt_result dt__irecv(dt_comm *c, void *buf, size_t bytes, int src, int tag, dt__req *q) {
    return dt__post(c, DT_REQ_RECV, buf, bytes, src, tag, 1, q);
}
/* Waits for q. exact: a receive must bring exactly its bytes (every message of a collective). */
static dt_result dt__wait(dt_comm *c, dt__req *q, int exact) {
    double t0 = dt_time_now();
    int kind = q->m.kind, peer = q->m.peer;
    size_t want = q->m.bytes;
    dt_result r = c->backend->wait(c, &q->m, t0 + c->desc.timeout);
    c->stats.wait_seconds += dt_time_now() - t0;
    if (r != DT_OK) return dt__comm_fail(c, r, dt_last_error());
    if (kind == DT_REQ_RECV) {
        c->stats.bytes_recv += q->m.received;
        c->stats.messages_recv++;
        if (exact && q->m.received != want) {
            char m[160];
            snprintf(m, sizeof m, "rank %d sent %zu bytes where this rank expected %zu: the ranks called it with different sizes",
                     peer, q->m.received, want);
            return dt__comm_fail(c, DT_ERR_MISMATCH, m);
        }
    }
    return DT_OK;
}
/* After a failure: withdraw the requests still pending, so no rank later touches their buffers. */
static void dt__cancel_all(dt_comm *c, dt_request *reqs, int n) {
    int i;
    for (i = 0; i < n; i++) {
        dt__req *q = dt__rq(&reqs[i]);
        if (q->m.kind != DT_REQ_NONE && q->m.state != DT_REQ_DONE && c->backend->cancel) c->backend->cancel(c, &q->m);
    }
}

/* One step of an algorithm: send sbytes of sbuf to dst while receiving rbytes from src, in segments of
   segment_bytes so the next segment travels while this one is reduced. With reduce set, the data
   received lands in tmp and is reduced into rbuf segment by segment; otherwise it lands in rbuf.
   dst or src < 0 skips that half. A side of 0 bytes still sends one empty message, so that every
   message carries the collective's signature. The algorithms reach it through the wrappers below
   (dt__send, dt__recv, dt__recv_reduce, dt__signal) and dt__ring_step in dtrain/comm/algos.h. */
static dt_result dt__step(dt_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes, int src,
                          void *tmp, int reduce, dt_dtype t, dt_reduce_op op) {
    size_t es = dt_dtype_size(t), seg = c->desc.segment_bytes / es * es;   /* whole elements: each segment is reduced alone */
    int ns, nr, tag = dt_comm_coll_tag(c), i;
    dt_request *q = NULL;
    dt_result r;
    if (seg == 0) seg = es;
    ns = dst >= 0 ? (int)(sbytes ? (sbytes + seg - 1) / seg : 1) : 0;
    nr = src >= 0 ? (int)(rbytes ? (rbytes + seg - 1) / seg : 1) : 0;
    if ((r = dt__comm_reqs(c, ns + nr, &q)) != DT_OK) return r;
    memset(q, 0, (size_t)(ns + nr) * sizeof *q);
    for (i = 0; i < nr; i++) {
        size_t off = (size_t)i * seg, len = rbytes - off < seg ? rbytes - off : seg;
        if (rbytes == 0) off = len = 0;
        if ((r = dt__irecv(c, len ? (char *)(reduce ? tmp : rbuf) + off : NULL, len, src, tag, dt__rq(&q[ns + i]))) != DT_OK) goto fail;
    }
    for (i = 0; i < ns; i++) {
        size_t off = (size_t)i * seg, len = sbytes - off < seg ? sbytes - off : seg;
        if (sbytes == 0) off = len = 0;
        if ((r = dt__isend(c, len ? (const char *)sbuf + off : NULL, len, dst, tag, dt__rq(&q[i]))) != DT_OK) goto fail;
    }
    for (i = 0; i < nr; i++) {
        dt__req *rq = dt__rq(&q[ns + i]);
        if ((r = dt__wait(c, rq, 1)) != DT_OK) goto fail;
        if (reduce && rq->m.bytes)
            dt__reduce_into((char *)rbuf + (size_t)i * seg, (char *)tmp + (size_t)i * seg, rq->m.bytes / es, t, op);
    }
    for (i = 0; i < ns; i++)
        if ((r = dt__wait(c, dt__rq(&q[i]), 1)) != DT_OK) goto fail;
    return DT_OK;
fail:
    dt__cancel_all(c, q, ns + nr);
    return r;
}
/* The one-way steps the algorithms are written in. t sets the segments (whole elements), so a send and
   its receive must name the same type; the bytes of a broadcast travel as DT_U8. */
static dt_result dt__send(dt_comm *c, const void *buf, size_t bytes, int dst, dt_dtype t) {
    return dt__step(c, buf, bytes, dst, NULL, 0, -1, NULL, 0, t, DT_SUM);
}
static dt_result dt__recv(dt_comm *c, void *buf, size_t bytes, int src, dt_dtype t) {
    return dt__step(c, NULL, 0, -1, buf, bytes, src, NULL, 0, t, DT_SUM);
}
/* Receives bytes from src into tmp and reduces them into buf (buf = buf op received), segment by segment. */
static dt_result dt__recv_reduce(dt_comm *c, void *buf, size_t bytes, int src, void *tmp, dt_dtype t, dt_reduce_op op) {
    return dt__step(c, NULL, 0, -1, buf, bytes, src, tmp, 1, t, op);
}
/* A round of the dissemination barrier: an empty message to dst while one comes from src. */
static dt_result dt__signal(dt_comm *c, int dst, int src) {
    return dt__step(c, NULL, 0, dst, NULL, 0, src, NULL, 0, DT_U8, DT_SUM);
}

/* The node of rank k: the backend's grouping, else desc.node_size consecutive ranks, else k alone. */
static int dt__node_of(const dt_comm *c, int k) {
    if (c->node) return c->node[k];
    return c->desc.node_size > 0 ? k / c->desc.node_size : k;
}

/* Parses a fault spec (dt_comm_desc.fault) into *f; name: the constructor, for the report. */
static dt_result dt__fault_parse(const char *s, dt__fault *f, const char *name) {
    long long rank = -1, coll = 0;
    char kind[16] = "", rest[2];
    double secs = 0;
    memset(f, 0, sizeof *f);
    if (!s || !*s) return DT_OK;
    if (sscanf(s, "rank=%lld,coll=%lld,kind=stall:%lf%1s", &rank, &coll, &secs, rest) == 3) {
        if (secs > 0 && secs < 1e6) f->kind = DT__FAULT_STALL;
    } else if (sscanf(s, "rank=%lld,coll=%lld,kind=%15[a-z]%1s", &rank, &coll, kind, rest) != 3) kind[0] = 0;
    if (strcmp(kind, "fail") == 0) f->kind = DT__FAULT_FAIL;
    else if (strcmp(kind, "return") == 0) f->kind = DT__FAULT_RETURN;
    else if (strcmp(kind, "hang") == 0) f->kind = DT__FAULT_HANG;
    else if (strcmp(kind, "nan") == 0) f->kind = DT__FAULT_NAN;
    if (f->kind == DT__FAULT_NONE || rank < 0 || rank >= (1LL << 30) || coll < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: the fault '%s' (DT_FAULT or dt_comm_desc.fault) is not rank=R,coll=N,kind=K "
                            "with R >= 0, N >= 1 and K one of fail, return, stall:SECONDS, hang, nan", name, s);
    f->rank = (int)rank;
    f->coll = (uint64_t)coll;
    f->seconds = secs;
    snprintf(f->spec, sizeof f->spec, "%s", s);
    return DT_OK;
}

/* ---- creating and destroying communicators ------------------------------------------------------
   Every backend's communicators are made here, from desc (and the environment): the local and self
   backends' by dt_comm_create_local, MPI's by dt_comm_create_mpi. Reports name the constructor
   dt_comm_create_<backend name>. */
dt_result dt_comm_create_backend(dt_comm **out, const dt_comm_backend *backend, void *impl, int rank, int size,
                                 int tag_ub, const dt_comm_desc *desc) {
    const char *env = getenv("DT_COMM_TIMEOUT"), *node_env = getenv("DT_NODE_SIZE"), *name;
    int tag_min = DT__TAG_COLL + (4 << DT__TAG_HASH_BITS);
    dt_comm_desc d;
    dt__fault fault;
    dt_comm *c;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_backend: out is NULL");
    *out = NULL;
    if (!backend || !backend->isend || !backend->irecv || !backend->wait || !backend->test)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_backend: the backend needs isend, irecv, wait and test");
    name = backend->name ? backend->name : "backend";
    if (size < 1 || rank < 0 || rank >= size)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: rank %d of %d ranks", name, rank, size);
    if (tag_ub < tag_min)
        return dt_set_error(DT_ERR_UNSUPPORTED, "dt_comm_create_%s: the transport's largest tag is %d; dtrain needs at least %d (user tags, "
                            "then collective tags)", name, tag_ub, tag_min);
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    if (d.timeout < 0 || d.link_latency < 0 || d.link_bandwidth < 0 || !(d.timeout == d.timeout))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: timeout, link latency and link bandwidth must not be negative", name);
    if (d.algo < DT_ALGO_AUTO || d.algo >= DT_ALGO_COUNT) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: unknown algorithm %d", name, (int)d.algo);
    if (d.node_size < 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: node_size is %d; give the ranks per node, or 0 for the backend's grouping", name, d.node_size);
    if (d.node_size == 0 && node_env && *node_env) {
        char *end;
        long v = strtol(node_env, &end, 10);
        if (*end || v < 1 || v > 1000000000)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: DT_NODE_SIZE='%s' is not a whole number of ranks per node (>= 1)", name, node_env);
        d.node_size = (int)v;
    }
    if (d.timeout == 0 && env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (*end || !(v > 0)) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: DT_COMM_TIMEOUT='%s' is not a positive number of seconds", name, env);
        d.timeout = v;
    }
    if (d.timeout == 0) d.timeout = DT_TIMEOUT_DEFAULT;
    if (d.segment_bytes == 0) d.segment_bytes = (size_t)256 << 10;
    if (!d.fault) d.fault = getenv("DT_FAULT");
    if (dt__fault_parse(d.fault, &fault, name) != DT_OK) return DT_ERR_INVALID_ARG;
    if (fault.kind != DT__FAULT_NONE && fault.rank >= size)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_%s: the fault '%s' (DT_FAULT or dt_comm_desc.fault) names rank %d, but the "
                            "run has %d ranks (0..%d): it would never fire; name one of them", name, d.fault, fault.rank, size, size - 1);
    if (!(c = (dt_comm *)DT_MALLOC(sizeof *c))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_%s: no memory", name);
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->size = size;
    c->backend = backend;
    c->impl = impl;
    c->desc = d;
    c->tag_ub = tag_ub;
    c->fault = fault;
    *out = c;
    return DT_OK;
}

dt_result dt_comm_set_nodes(dt_comm *c, const int *node_of) {
    int k, j;
    if (!c || !node_of) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_set_nodes: communicator and node_of must not be NULL");
    if (!c->node && !(c->node = (int *)DT_MALLOC(sizeof(int) * (size_t)c->size)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_set_nodes: no memory for %d ranks", c->size);
    for (k = 0, j = 0; k < c->size; k++) {   /* renumbered in the order of the nodes' lowest ranks */
        int i;
        for (i = 0; i < k && node_of[i] != node_of[k]; i++) {}
        c->node[k] = i < k ? c->node[i] : j++;
    }
    return DT_OK;
}
int dt_comm_nodes(const dt_comm *c, int *node_of) {
    int k, n = 0;
    if (!c) return 0;
    for (k = 0; k < c->size; k++) {
        int j = dt__node_of(c, k);
        if (node_of) node_of[k] = j;
        if (j + 1 > n) n = j + 1;
    }
    return n;
}

void dt_comm_leave(dt_comm *c, dt_result r, const char *msg) {
    if (c && !c->broken && c->backend->leave) c->backend->leave(c, r, msg ? msg : "");   /* broken: it has told them */
}

void dt_comm_destroy(dt_comm *c) {
    if (!c) return;
    DT_FREE(c->scratch);
    DT_FREE(c->reqs);
    DT_FREE(c->node);
    if (c->backend && c->backend->destroy) c->backend->destroy(c);
    DT_FREE(c);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
