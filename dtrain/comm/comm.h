/* dtrain/comm/comm.h - the communicator: what a program calls to move data between ranks.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The communicator's user API: element types (with bf16 and fp16 for the wire), reductions, the
     algorithms' names, counters, dt_comm and its options (dt_comm_desc: algorithm, timeout, link model,
     nodes, an injected fault), point-to-point calls and the collectives (all-to-all among them); the
     element types and the half-precision conversions are implemented here. The rest of the communicator
     is in the modules that follow, in this order:
       dtrain/comm/backend.h  the backend-author interface (dt_comm_backend, dt_message) and the generic
                              layer behind it: the communicator's state, signatures, tags, counters,
                              point-to-point through the backend, creation and destruction
       dtrain/comm/algos.h    the algorithms written once over isend/irecv (naive, ring, tree,
                              hierarchical, pairwise all-to-all) and the calls declared here that run
                              them, with their checks and the fault injection
       dtrain/comm/local.h    the self and local backends (ranks as threads)
       dtrain/comm/launch.h   the launcher (dt_launch), its flags and the timeline file
   USES
     dtrain/core/base.h only (what travels is bytes: the trainers in dtrain/train/ bring the models).
   READ FIRST
     dt_comm_allreduce and dt_algo here, then dt__allreduce_ring in dtrain/comm/algos.h.
*/
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H
#include "../core/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types a message or a reduction carries. DT_BF16 and DT_F16 are 16-bit floats for the wire
   (bfloat16: float's exponent and 7 bits of mantissa; IEEE half: 5 and 10), held as uint16_t: a
   reduction decodes both operands to float, combines them in float, and encodes the result rounded to
   nearest, ties to even (dt_bf16_from_float, dt_f16_from_float), so every partial sum that travels is
   rounded once. A backend's NATIVE all-reduce never sees them: they run on RING (so they give the same
   bits on every backend). */
typedef enum dt_dtype { DT_F32 = 0, DT_F64, DT_I32, DT_I64, DT_U8, DT_BF16, DT_F16, DT_DTYPE_COUNT } dt_dtype;
size_t      dt_dtype_size(dt_dtype t);           /* bytes per element; 0 for an unknown type */
const char *dt_dtype_name(dt_dtype t);           /* "f32", ..., "bf16", "f16" */
uint16_t    dt_bf16_from_float(float x);         /* round to nearest even; NaN stays NaN, overflow is infinity */
float       dt_bf16_to_float(uint16_t h);        /* exact */
uint16_t    dt_f16_from_float(float x);          /* round to nearest even, subnormals included; past 65504: infinity */
float       dt_f16_to_float(uint16_t h);         /* exact */

/* Reductions. MEAN is SUM divided by the world size, for floating-point types only. */
typedef enum dt_reduce_op { DT_SUM = 0, DT_MEAN, DT_MAX, DT_MIN } dt_reduce_op;

/* How all-reduce, reduce and broadcast move data. Every algorithm but NATIVE is written once, in
   dtrain/comm/algos.h, over point-to-point messages, so it behaves and rounds the same on every backend:
     NAIVE   everyone sends to the root, the root reduces in rank order and sends the result back: the
             parameter-server pattern; 2 (p - 1) messages of n elements through one rank.
     RING    reduce-scatter then all-gather around the ring: 2 (p - 1) steps of n / p elements each, every
             link busy; the bandwidth-optimal choice for large n. Chunks are sent in segments so the
             next segment travels while the previous one is reduced.
     TREE    binomial tree to the root and back: 2 log2(p) steps of n elements; the latency-optimal choice
             for small n.
     NATIVE  the backend's own: a shared-memory all-reduce for local ranks, MPI_Allreduce for MPI.
     HIER    hierarchical, for ranks grouped into nodes (dt_comm_nodes): the ranks of a node reduce to its
             leader (its lowest rank) in rank order, the L leaders all-reduce around a ring of their own,
             and each leader sends the result to its node. Only 2 (L - 1) / L n elements per node cross
             between nodes, where a flat ring passes 2 (p - 1) / p n through each rank's link. Every rank
             its own node: the same bits as RING; one node: as NAIVE. All-reduce only: reduce and
             broadcast run it as RING and TREE.
   For a given world size (and grouping, for HIER), NAIVE, RING, TREE and HIER give bit-identical results
   on every backend; NATIVE is deterministic run to run but may round differently. AUTO (0) is the
   communicator's default. */
typedef enum dt_algo { DT_ALGO_AUTO = 0, DT_ALGO_NAIVE, DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NATIVE, DT_ALGO_HIER, DT_ALGO_COUNT } dt_algo;
const char *dt_algo_name(dt_algo a);             /* "auto", "naive", "ring", "tree", "native", "hier" */
dt_result   dt_algo_parse(const char *s, dt_algo *out);

/* Per-rank traffic counters, since the communicator was created (or last reset). Bytes count payload
   this rank put on, or took off, a link: for point-to-point messages and the library's algorithms the
   exact figure; for NATIVE collectives that of a ring (2 (p - 1) / p n per rank). wait_seconds is the
   time the rank spent blocked, waiting for others. */
typedef struct dt_comm_stats {
    uint64_t bytes_sent, bytes_recv;
    uint64_t messages_sent, messages_recv;
    uint64_t collectives;                  /* collective calls made */
    double   wait_seconds;
} dt_comm_stats;

/* A pending point-to-point operation. It lives in the caller's memory and must stay where it is (not be
   copied or freed) until dt_comm_wait or dt_comm_test has completed it; a zeroed one is "none". What it
   holds is private (the library's, and its backend's dt_message); dt_request_received reads the result. */
#ifndef DT__REQUEST_WORDS
#define DT__REQUEST_WORDS 20   /* (tests/run.sh builds with fewer once, to see the check fail) */
#endif
typedef struct dt_request {
    uint64_t reserved[DT__REQUEST_WORDS];   /* opaque: the implementation checks at compile time that its state fits */
} dt_request;

/* The communicator of one rank: opaque. dt_comm_rank, dt_comm_size, dt_comm_get_desc read it. */
typedef struct dt_comm dt_comm;

#define DT_TAG_USER_MAX  32767             /* user point-to-point tags are 0 .. DT_TAG_USER_MAX (the library's own are above) */
#define DT_TIMEOUT_DEFAULT 300.0           /* seconds; the environment variable DT_COMM_TIMEOUT overrides */

/* Options of a communicator; zero means the default. */
typedef struct dt_comm_desc {
    dt_algo algo;              /* default algorithm: 0 = NATIVE where the backend has one, else RING */
    double  timeout;           /* seconds a wait may last before DT_ERR_TIMEOUT: 0 = $DT_COMM_TIMEOUT or 300 */
    size_t  segment_bytes;     /* ring pipeline segment: 0 = 256 KiB */
    /* link model (local backend only; both 0 = off): each rank has one full-duplex link to a switch that
       sends and receives at most bandwidth bytes/s (messages queue behind each other on both ends), and
       every message arrives latency seconds after it has left. Under it the native all-reduce and
       broadcast run over messages too (as TREE for the broadcast; for the all-reduce as RING, or as TREE
       where the model makes that faster: short messages), so a NATIVE float sum rounds as that one's.
       With nodes (node_size, or the backend's), the ranks of a node share their node's link, and messages
       inside a node do not use it: they cost what the copy costs, as in shared memory */
    double  link_latency;
    double  link_bandwidth;
    /* ranks per node, for DT_ALGO_HIER and the link model: ranks 0 .. node_size - 1 are node 0, and so
       on (the last node may have fewer). 0 = $DT_NODE_SIZE, else the backend's own grouping: under MPI
       the ranks that share memory (MPI_Comm_split_type), on local ranks every rank its own node */
    int     node_size;
    /* a fault to inject, a test aid: NULL = $DT_FAULT (unset: none). "rank=R,coll=N,kind=K": rank R, at
       the start of its collective number N (1 for the first; the number error reports give), and K is
         fail      the collective fails (DT_ERR_STATE) and the rank's communicator with it
         return    the rank leaves the run as if its function had returned DT_OK there; its own later
                   calls fail with DT_ERR_PEER
         stall:S   the rank sleeps S seconds, then goes on
         hang      the rank sleeps for good (the others time out; dt_launch returns without it)
         nan       the first element of the rank's f32 data in that collective becomes NaN (DDP: the
                   gradient), so the run must stop at a NaN loss
       A bad spec fails the creation with DT_ERR_INVALID_ARG. See docs/design.md, "Faults". */
    const char *fault;
} dt_comm_desc;

int  dt_comm_rank(const dt_comm *c);
int  dt_comm_size(const dt_comm *c);
const char *dt_comm_backend_name(const dt_comm *c);   /* "self", "local", "mpi" */
/* The options c runs with: its desc with the defaults filled in (timeout, segment_bytes; algo as given,
   DT_ALGO_AUTO unless set). Zeros for NULL. */
dt_comm_desc dt_comm_get_desc(const dt_comm *c);
/* The algorithm dt_comm_allreduce(c, ..., algo) runs: algo itself, or for DT_ALGO_AUTO the communicator's
   default (dt_comm_desc.algo, else NATIVE where the backend has a native all-reduce, else RING); NATIVE
   becomes RING on a backend without one. What a program prints as "auto". */
dt_algo dt_comm_algo(const dt_comm *c, dt_algo algo);

/* Marks this rank as gone (its function returned r, with message msg): ranks waiting for it fail at once
   with DT_ERR_PEER instead of waiting for the timeout. dt_launch calls it when a rank function returns. */
void      dt_comm_leave(dt_comm *c, dt_result r, const char *msg);
void      dt_comm_destroy(dt_comm *c);

/* Point-to-point, blocking and non-blocking. Messages between two ranks with the same tag arrive in the
   order sent. A receive accepts at most count elements; *received (may be NULL) gets how many came.
   A send completes when the receiver has the data. */
dt_result dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag);
dt_result dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, size_t *received);
dt_result dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request *req);
dt_result dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request *req);
dt_result dt_comm_wait(dt_comm *c, dt_request *req);
dt_result dt_comm_waitall(dt_comm *c, dt_request *reqs, int n);
dt_result dt_comm_test(dt_comm *c, dt_request *req, int *done);
/* Elements a completed receive got (of the type it was posted with; <= its count); 0 for a send. */
size_t    dt_request_received(const dt_request *req);

/* Collectives: every rank of the communicator calls the same ones in the same order with the same count,
   type, op and root; a rank that calls another, or another size, gets DT_ERR_MISMATCH rather than a wrong
   result. Buffers are in place where one buffer is given. algo 0 = the communicator's default. */
dt_result dt_comm_barrier(dt_comm *c);
dt_result dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_algo algo);
/* buf: in, and on root the result; other ranks' buf is left unchanged. */
dt_result dt_comm_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, int root, dt_algo algo);
dt_result dt_comm_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, dt_algo algo);
/* root's send[size * count] is split in rank order; each rank gets its count elements in recv. send is
   read on root only (NULL elsewhere). */
dt_result dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
/* each rank's send[count] lands at recv[rank * count] on root (recv NULL elsewhere). */
dt_result dt_comm_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
/* each rank's send[count] lands at recv[rank * count] on every rank (ring). */
dt_result dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
/* send[size * count] on every rank; rank r gets in recv[count] the reduction of everyone's block r (ring). */
dt_result dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_reduce_op op);
/* send[size * count] and recv[size * count] on every rank (not overlapping): block j of rank i's send lands
   in block i of rank j's recv. Pairwise exchange (p - 1 steps: to rank + s, from rank - s), or the
   backend's native all-to-all (MPI_Alltoall; shared memory on local ranks) when the communicator's
   default algorithm is AUTO or NATIVE. */
dt_result dt_comm_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
/* The same with a size per block, in elements: rank i's block j is send[sdispls[j] ..] of sendcounts[j]
   elements and lands in rank j's recv[rdispls[i] ..] of recvcounts[i], which must equal it (else
   DT_ERR_MISMATCH on both). Arrays of size entries; blocks must not overlap. Pairwise exchange. */
dt_result dt_comm_alltoallv(dt_comm *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                            void *recv, const size_t *recvcounts, const size_t *rdispls, dt_dtype t);
/* The neighbours of one rank in a dt_comm_neighbor_exchange: it sends to to[0..nto) and receives from
   from[0..nfrom). Zero: no neighbours. */
typedef struct dt_neighbors {
    const int *to;       /* [nto] ranks */
    int        nto;      /* >= 0 */
    const int *from;     /* [nfrom] ranks */
    int        nfrom;    /* >= 0 */
} dt_neighbors;
/* Neighbour exchange for gossip: send goes to each rank in nb->to, and recv[i * count] receives from
   nb->from[i], i < nfrom. Every rank calls it (with its own lists; a rank may list none); the edges must
   match (a in b's to exactly when b in a's from). */
dt_result dt_comm_neighbor_exchange(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                                    const dt_neighbors *nb);

/* The nodes of c's ranks (dt_comm_desc.node_size): returns how many nodes there are and, when node_of is not
   NULL, writes node_of[size]: each rank's node, numbered 0, 1, ... in the order of their lowest ranks. */
int dt_comm_nodes(const dt_comm *c, int *node_of);

/* Counters of this rank (see dt_comm_stats), and their reset. */
dt_comm_stats dt_comm_get_stats(const dt_comm *c);   /* zeros for NULL */
void dt_comm_reset_stats(dt_comm *c);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMM_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_COMM_IMPLEMENTATION_DONE)
#define DTRAIN_COMM_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

size_t dt_dtype_size(dt_dtype t) {
    switch (t) {
    case DT_F32: case DT_I32: return 4;
    case DT_F64: case DT_I64: return 8;
    case DT_U8: return 1;
    case DT_BF16: case DT_F16: return 2;
    default: return 0;
    }
}
const char *dt_dtype_name(dt_dtype t) {
    static const char *n[] = {"f32", "f64", "i32", "i64", "u8", "bf16", "f16"};
    return (t >= DT_F32 && t < DT_DTYPE_COUNT) ? n[t] : "unknown";
}
static int dt__dtype_half(dt_dtype t) { return t == DT_BF16 || t == DT_F16; }

/* bfloat16 is the top half of a float: rounding adds 0x7fff plus the kept part's lowest bit (ties to even);
   a carry into the exponent is the next binade, or infinity. A NaN keeps a mantissa bit so it stays NaN. */
uint16_t dt_bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float dt_bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* Half: 5 exponent bits (bias 15), 10 mantissa bits; below 2^-14 subnormal in steps of 2^-24. */
uint16_t dt_f16_from_float(float x) {
    uint32_t u, a, sign;
    memcpy(&u, &x, sizeof u);
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* 65520 and up round to infinity */
    if (a < 0x38800000u) {                                    /* below 2^-14: a multiple of 2^-24 */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift, q, rem, half;
        if (e < 102) return (uint16_t)sign;                   /* below 2^-25: rounds to zero */
        shift = 126 - e;                                      /* x = m 2^(e - 150) = (m >> shift) 2^-24 */
        q = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1);
        q += rem > half || (rem == half && (q & 1u));
        return (uint16_t)(sign | q);                          /* q = 0x400 is the smallest normal: right */
    }
    a -= 0x38000000u;                                         /* rebias the exponent: 127 - 15 = 112 */
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}
float dt_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float x;
    if (e == 0) {   /* zero or subnormal: m 2^-24, exact in float */
        x = (float)m * 5.9604644775390625e-8f;
        return sign ? -x : x;
    }
    u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    memcpy(&x, &u, sizeof x);
    return x;
}
/* The names of an enum's values, shared by the dt_*_name / dt_*_parse pairs: the name of k ("unknown"
   outside 0..n-1), and the value named s (or DT_ERR_INVALID_ARG listing the choices; what names the kind). */

static const char *const dt__algo_names[DT_ALGO_COUNT] = {"auto", "naive", "ring", "tree", "native", "hier"};
const char *dt_algo_name(dt_algo a) { return dt__enum_name(dt__algo_names, DT_ALGO_COUNT, (int)a); }
dt_result dt_algo_parse(const char *s, dt_algo *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__algo_names, DT_ALGO_COUNT, s, &k, "collective algorithm");
    if (r == DT_OK && out) *out = (dt_algo)k;
    return r;
}
static const char *dt__reduce_name(int op) {
    static const char *n[] = {"sum", "mean", "max", "min"};
    return (op >= 0 && op <= DT_MIN) ? n[op] : "none";
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
