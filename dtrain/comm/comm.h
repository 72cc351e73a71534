/* dtrain/comm/comm.h - communication: topologies, the communicator, its algorithms and backends, the launcher.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     Gossip topologies and their mixing matrices (ring, torus, exponential, full, your own; checked
     symmetric, doubly stochastic and connected) and time-varying ones (dt_topology_schedule: the one-peer
     exponential graph; each step's matrix checked symmetric and doubly stochastic, the period's union
     connected); dt_comm: point-to-point, the collectives (all-to-all among them) and the algorithms
     written once over isend/irecv (naive gather-reduce-broadcast, ring reduce-scatter + all-gather, tree,
     hierarchical over nodes of ranks), with fixed summation orders so every backend gives the same bits;
     the checks that
     turn a failed, late or mismatched rank into an error instead of a hang; counters; the self backend
     and the local one (ranks as threads, with an optional link model of a slow network, whose nodes'
     ranks share a port), both written
     against the backend interface that dtrain_mpi.h uses too (the end of the declarations); the
     launcher (dt_launch: threads here, processes under mpiexec with dtrain_mpi.h) and the timeline file.
   USES
     dtrain/core/base.h only (what travels is bytes: the trainers in dtrain/train/train.h bring the models).
   READ FIRST
     dt__allreduce_ring with dt__ring_reduce_scatter and dt__ring_allgather, dt__tree_reduce, the naive
     algorithms, dt__coll_allreduce (how a call picks one), dt_topology_create; then the local backend
     (dt__local_isend, dt__local_wait) and the backend interface (dt_comm_backend, dt_message) to see
     what a transport must do.
*/
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H
#include "../core/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The graph over which decentralised algorithms (D-PSGD, gossip) average, and its mixing matrix W:
   rank i's new value is sum_j W[i][j] x_j over itself and its neighbours. */
typedef enum dt_topology_kind {
    DT_TOPO_RING = 0,      /* i - 1 and i + 1 (mod world): the D-PSGD ring */
    DT_TOPO_TORUS,         /* rows x cols grid with wrap-around: up to 4 neighbours */
    DT_TOPO_EXPONENTIAL,   /* i +- 2^k (mod world) for 2^k < world: log2(world) hops to anyone */
    DT_TOPO_FULL,          /* everyone: W = 1/world, the same as all-reduce */
    DT_TOPO_CUSTOM         /* the adjacency matrix given in the desc */
} dt_topology_kind;
typedef enum dt_mixing_kind {
    DT_MIXING_UNIFORM = 0, /* W[i][j] = 1 / (deg(i) + 1) for j in {i} u N(i): needs a regular graph */
    DT_MIXING_METROPOLIS   /* W[i][j] = 1 / (1 + max(deg(i), deg(j))), W[i][i] = 1 - the rest: any graph */
} dt_mixing_kind;
typedef struct dt_topology_desc {
    dt_topology_kind kind;
    int              world;      /* number of ranks, >= 1 */
    int              rows;       /* torus: rows (must divide world); 0 = the most square factorisation */
    const uint8_t   *adjacency;  /* custom: [world * world], nonzero = edge; must be symmetric */
    dt_mixing_kind   mixing;
} dt_topology_desc;
typedef struct dt_topology {
    int     world;
    double *weights;             /* [world, world] mixing matrix */
    int    *offsets;             /* [world + 1]: neighbours of rank i are neighbors[offsets[i] .. offsets[i+1]) */
    int    *neighbors;           /* ascending, without i itself */
    double  spectral_gap;        /* 1 - max(|lambda_2|, |lambda_min|) of W: how fast gossip mixes (0 = never);
                                    -1 when not computed (more than 1024 ranks) */
    double  lambda2;             /* the second largest |eigenvalue| */
} dt_topology;
/* Builds the graph and its mixing matrix and checks that W is symmetric, doubly stochastic and the graph
   connected (otherwise DT_ERR_INVALID_ARG naming the rank and what fails, and the fix); computes the
   spectral gap. *t is zeroed on failure. */
dt_result dt_topology_create(dt_topology *t, const dt_topology_desc *desc);
void      dt_topology_free(dt_topology *t);
const char *dt_topology_name(dt_topology_kind k);   /* "ring", "torus", ... */
/* Checks one mixing matrix, as a time-varying topology must pass it at every step: t has world ranks,
   ascending neighbour lists that match (j lists i exactly when i lists j), and W is non-negative,
   symmetric, doubly stochastic and zero off the edges. Connectivity is not asked of a single graph (see
   dt_topology_check_union). DT_ERR_INVALID_ARG naming the rank and what fails; fn prefixes the message. */
dt_result dt_topology_check(const dt_topology *t, int world, const char *fn);
/* Checks each of g[0..n) with dt_topology_check and that their union is connected: gossip over graphs used
   in turn then reaches every rank, though no single graph need connect them. */
dt_result dt_topology_check_union(const dt_topology *const *g, int n, int world, const char *fn);

/* A time-varying topology: step t gossips over graphs[t mod period] (D-PSGD's dt_dpsgd_desc.schedule). */
typedef struct dt_topology_schedule {
    int          world, period;
    dt_topology *graphs;         /* [period], each with weights 1/2 on its one edge per rank */
} dt_topology_schedule;
/* The one-peer exponential graph: at step t, rank i exchanges with the one peer i xor 2^k, k = t mod period,
   period = ceil(log2 world), with weights 1/2 (itself) and 1/2 (the peer). Each W_t is symmetric and doubly
   stochastic; no single one is connected, their union (the hypercube's edges) is. For world a power of two
   the product of the period's W_t is exactly the averaging matrix (1/world everywhere): any values reach
   their mean in log2 world steps, each rank sending one replica a step. For other worlds a rank whose
   partner i xor 2^k is not a rank sits step k out (W_t[i][i] = 1): the mixing is still symmetric and
   doubly stochastic and reaches consensus geometrically, never exactly. *s is zeroed on failure. */
dt_result dt_topology_one_peer_exp(dt_topology_schedule *s, int world);
void      dt_topology_schedule_free(dt_topology_schedule *s);
/* graphs[step mod period] of the dt_topology_schedule *s: a dt_dpsgd_desc.schedule function. */
const dt_topology *dt_topology_schedule_at(int64_t step, void *s);

/* ---- the communicator ------------------------------------------------------------------------ */

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

/* How all-reduce, reduce and broadcast move data. Every algorithm but NATIVE is written once in this
   file over point-to-point messages, so it behaves and rounds the same on every backend:
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

/* A communicator of one rank: every collective is a no-op or a copy, messages to itself are delivered.
   The same program is its own single-process baseline. Free with dt_comm_destroy. */
dt_result dt_comm_create_self(dt_comm **out, const dt_comm_desc *desc);
/* n local ranks in this process, for a caller that runs its own threads: out[0..n) are the ranks'
   communicators; each must be used by one thread only. Free each with dt_comm_destroy (after every rank
   has finished). Most programs use dt_launch instead. */
dt_result dt_comm_create_local(dt_comm **out, int n, const dt_comm_desc *desc);
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
/* Neighbour exchange for gossip: send goes to each rank in to[0..nto), and recv[i * count] receives from
   from[i], i < nfrom. Every rank calls it (with its own lists; a rank may list none); the edges must
   match (a in b's to exactly when b in a's from). */
dt_result dt_comm_neighbor_exchange(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                                    const int *to, int nto, const int *from, int nfrom);

/* The nodes of c's ranks (dt_comm_desc.node_size): returns how many nodes there are and, when node_of is not
   NULL, writes node_of[size]: each rank's node, numbered 0, 1, ... in the order of their lowest ranks. */
int dt_comm_nodes(const dt_comm *c, int *node_of);

/* Counters of this rank (see dt_comm_stats), and their reset. */
dt_comm_stats dt_comm_get_stats(const dt_comm *c);   /* zeros for NULL */
void dt_comm_reset_stats(dt_comm *c);

/* ---- the launcher ---------------------------------------------------------------------------- */

/* A rank's work: its communicator and the argument given to dt_launch. Returning an error stops the
   run: the other ranks' waits for this one fail with DT_ERR_PEER. */
typedef dt_result (*dt_rank_fn)(dt_comm *comm, void *arg);

typedef struct dt_launch_desc {
    int          ranks;            /* local ranks (threads); 0 = 1. Ignored under mpiexec */
    int          threads_per_rank; /* OpenMP threads of each rank: 0 = cores / ranks, at least 1 */
    int          log_all_ranks;    /* show ranks > 0's info lines too (always shown: warnings, errors) */
    dt_comm_desc comm;
    const char  *trace_path;       /* write a timeline of every rank here (Chrome trace JSON); NULL = off */
    int64_t      trace_max_events; /* events kept per rank and lane; later ones are dropped and counted
                                      (0 = DT_TRACE_MAX_EVENTS) */
} dt_launch_desc;

#define DT_TRACE_MAX_EVENTS (1 << 19)   /* about 60 MB per lane at most, allocated as events come */

/* Takes the launcher's flags out of argv (argc updated), leaving the program's own:
     --ranks N            local ranks (threads in this process)
     --algo A             default collective algorithm: naive, ring, tree, native, hier
     --node-size N        ranks per node (DT_ALGO_HIER, the link model); default: the backend's grouping
     --timeout S          seconds a rank may wait for another before the run fails
     --link-latency S     link model: seconds per message (local ranks)
     --link-bandwidth B   link model: bytes per second per link, with suffix K, M or G (local ranks)
     --threads-per-rank T OpenMP threads per rank
     --log-all-ranks      show every rank's log lines, prefixed "[rank r]"
     --trace PATH         write a timeline of every rank's compute and communication to PATH (Chrome
                          trace JSON, for https://ui.perfetto.dev or chrome://tracing)
     --trace-max-events N events kept per rank and thread (default DT_TRACE_MAX_EVENTS)
   Returns DT_ERR_INVALID_ARG naming a bad value. */
dt_result dt_launch_parse(int *argc, char **argv, dt_launch_desc *d);

/* Runs fn on every rank and returns DT_OK when every rank returned DT_OK, else, after logging the failure,
   the cause's result (a failure other than DT_ERR_PEER, which only follows from another rank's), its
   message, naming the rank, in dt_last_error(); under MPI, this process's rank's. The cause is logged
   once: ranks that failed the same way are named on one line (local ranks) or say nothing (MPI), and
   DT_ERR_PEER is logged at DT_LOG_DEBUG. Every failure ends in bounded time: once a rank has failed the
   others have the communicator's timeout and a second more to end. On local ranks a rank that has not
   is reported as stalled (DT_ERR_TIMEOUT) and its thread left running, so the program must then exit
   without freeing what the ranks use; under MPI the job is ended with MPI_Abort (MPI_Finalize would wait
   for the stalled process). A program's main
   returns `dt_launch(...) == DT_OK ? 0 : 1`: exit status 0, or 1 after a failure. Under mpiexec (built
   with DT_USE_MPI) each process is one rank on MPI_COMM_WORLD (dt_launch_mpi); otherwise desc->ranks
   threads on the local backend (1 rank: the self backend). Log lines of rank r > 0 are prefixed
   "[rank r]" and, unless log_all_ranks, only warnings and errors are shown. With trace_path, the timeline
   is written after the ranks have finished, also when one failed; a trace that cannot be written makes
   the run fail (DT_ERR_IO) with a message naming the path. Under MPI rank 0 gathers every rank's events
   and writes the file; when that fails (a rank has died) each rank writes PATH.rank<r>. */
dt_result dt_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg);
/* The same on local ranks without logging, returning each rank's result in results[ranks] (may be NULL)
   and the cause as the return value (the lowest rank's failure of its own, else a stalled rank's, else a
   timeout's, else DT_ERR_PEER), with its message in dt_last_error(). */
dt_result dt_launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results);
/* The rank of the calling thread inside dt_launch (-1 outside): what the logger prefixes. */
int dt_current_rank(void);

/* ---- the backend interface ------------------------------------------------------------------
   What a transport needs to become a dt_comm backend: dtrain_mpi.h is written against these names alone,
   and the local and self backends below use them too. Programs need none of it. A backend is a table of
   functions (dt_comm_backend) and its own state (impl); the library above it does the argument checks,
   signatures, counters, error reports and every algorithm (docs/design.md, "The communicator"). */

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
const dt_comm_backend *dt_comm_get_backend(const dt_comm *c);       /* the table c runs on */
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
/* Runs fn as this process's one rank on c, for a backend's launcher (dt_launch_mpi): the logger's rank,
   OpenMP threads (desc->threads_per_rank, or the node's cores over local_ranks), the timeline (with
   desc->trace_path: a barrier aligns the clocks; at the end rank 0 gathers every rank's events and writes
   the file, and a rank that cannot take part writes PATH.rank<r>), and a failure announced (dt_comm_leave)
   and left in dt_last_error(), naming the rank, for the backend's launcher to log (dt_launch_mpi logs
   each failure once, not once per rank). Collective over c. Returns fn's result, or the trace's failure. */
dt_result dt_launch_rank(dt_comm *c, const dt_launch_desc *desc, int local_ranks, dt_rank_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMM_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_COMM_IMPLEMENTATION_DONE)
#define DTRAIN_COMM_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif

const char *dt_topology_name(dt_topology_kind k) {
    static const char *names[] = {"ring", "torus", "exponential", "full", "custom"};
    return (k >= DT_TOPO_RING && k <= DT_TOPO_CUSTOM) ? names[k] : "unknown";
}

void dt_topology_free(dt_topology *t) {
    if (!t) return;
    DT_FREE(t->weights);
    DT_FREE(t->offsets);
    DT_FREE(t->neighbors);
    memset(t, 0, sizeof *t);
}

/* Eigenvalues of the symmetric n x n matrix a (destroyed) by cyclic Jacobi rotations, into ev[n]. */
static void dt__sym_eigenvalues(double *a, int n, double *ev) {
    int sweep, p, q, k;
    for (sweep = 0; sweep < 100; sweep++) {
        double off = 0.0;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
        if (off < 1e-22) break;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) {
                double apq = a[p * n + q], theta, t, c, s;
                if (fabs(apq) < 1e-300) continue;
                theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                c = 1.0 / sqrt(t * t + 1.0);
                s = t * c;
                for (k = 0; k < n; k++) {   /* A <- A J (columns p, q) */
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (k = 0; k < n; k++) {   /* A <- J^T A (rows p, q) */
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
    }
    for (k = 0; k < n; k++) ev[k] = a[k * n + k];
}

/* How many ranks a search from rank 0 reaches over the union of the edges of g[0..ng), all of world ranks;
   *missing is the first rank it does not reach. -1 when there is no memory for the search. */
static int dt__topology_reach(const dt_topology *const *g, int ng, int world, int *missing) {
    int *stack = (int *)DT_MALLOC(sizeof(int) * (size_t)world), *seen = (int *)DT_MALLOC(sizeof(int) * (size_t)world);
    int top = 0, reached = 1, q, k;
    if (!stack || !seen) { DT_FREE(stack); DT_FREE(seen); return -1; }
    memset(seen, 0, sizeof(int) * (size_t)world);
    seen[0] = 1;
    stack[top++] = 0;
    while (top) {
        int v = stack[--top];
        for (q = 0; q < ng; q++)
            for (k = g[q]->offsets[v]; k < g[q]->offsets[v + 1]; k++)
                if (!seen[g[q]->neighbors[k]]) { seen[g[q]->neighbors[k]] = 1; reached++; stack[top++] = g[q]->neighbors[k]; }
    }
    for (k = 0; k < world && seen[k]; k++) {}
    *missing = k;
    DT_FREE(stack); DT_FREE(seen);
    return reached;
}

/* Builds desc's graph and mixing matrix and checks them. part = 1: one graph of a time-varying topology,
   which need not be connected alone; its spectrum is left to the caller. */
static dt_result dt__topology_build(dt_topology *t, const dt_topology_desc *desc, int part) {
    int n, i, j, rows = 0, cols = 0, nedges = 0;
    uint8_t *adj = NULL;
    double *work = NULL, *ev = NULL;
    dt_result r = DT_OK;
    if (!t) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: topology is NULL");
    memset(t, 0, sizeof *t);
    if (!desc) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: desc is NULL");
    n = desc->world;
    if (n < 1 || n > 65536) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: world is %d; it must be in 1..65536", n);
    if (desc->kind < DT_TOPO_RING || desc->kind > DT_TOPO_CUSTOM)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: unknown topology %d", (int)desc->kind);
    if (desc->mixing != DT_MIXING_UNIFORM && desc->mixing != DT_MIXING_METROPOLIS)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: unknown mixing %d", (int)desc->mixing);
    if (desc->kind == DT_TOPO_CUSTOM && !desc->adjacency)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: a custom topology needs the adjacency matrix [world * world]");
    if (desc->kind == DT_TOPO_TORUS) {
        rows = desc->rows;
        if (rows == 0)   /* the most square factorisation */
            for (rows = (int)sqrt((double)n); rows > 1 && n % rows; rows--) {}
        if (rows < 1 || n % rows)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: a torus of %d ranks cannot have %d rows; rows must "
                                "divide the world size (or be 0 for the most square grid)", n, desc->rows);
        cols = n / rows;
    }
    adj = (uint8_t *)DT_MALLOC((size_t)n * (size_t)n);
    t->weights = (double *)DT_MALLOC(sizeof(double) * (size_t)n * (size_t)n);
    t->offsets = (int *)DT_MALLOC(sizeof(int) * (size_t)(n + 1));
    if (!adj || !t->weights || !t->offsets) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for %d ranks", n); goto done; }
    memset(adj, 0, (size_t)n * (size_t)n);
    for (i = 0; i < n; i++) {
        int d;
        switch (desc->kind) {
        case DT_TOPO_RING:
            adj[i * n + (i + 1) % n] = adj[i * n + (i + n - 1) % n] = 1;
            break;
        case DT_TOPO_TORUS: {
            int rr = i / cols, cc = i % cols;
            adj[i * n + rr * cols + (cc + 1) % cols] = adj[i * n + rr * cols + (cc + cols - 1) % cols] = 1;
            adj[i * n + ((rr + 1) % rows) * cols + cc] = adj[i * n + ((rr + rows - 1) % rows) * cols + cc] = 1;
        } break;
        case DT_TOPO_EXPONENTIAL:
            for (d = 1; d < n; d *= 2) adj[i * n + (i + d) % n] = adj[i * n + (i + n - d % n) % n] = 1;
            break;
        case DT_TOPO_FULL:
            for (j = 0; j < n; j++) adj[i * n + j] = 1;
            break;
        case DT_TOPO_CUSTOM:
            for (j = 0; j < n; j++) adj[i * n + j] = desc->adjacency[i * n + j] != 0;
            break;
        }
        adj[i * n + i] = 0;   /* self-loops are implicit in W[i][i] */
    }
    for (i = 0; i < n; i++)
        for (j = 0; j < n; j++)
            if (adj[i * n + j] != adj[j * n + i]) {
                r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the adjacency is not symmetric (%d -> %d but not %d -> %d); "
                                 "gossip needs undirected edges", i, j, j, i);
                goto done;
            }
    /* neighbour lists */
    t->offsets[0] = 0;
    for (i = 0; i < n; i++) {
        for (j = 0; j < n; j++) nedges += adj[i * n + j];
        t->offsets[i + 1] = nedges;
    }
    t->neighbors = (int *)DT_MALLOC(sizeof(int) * (size_t)(nedges + 1));
    if (!t->neighbors) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for %d edges", nedges); goto done; }
    for (i = 0, nedges = 0; i < n; i++)
        for (j = 0; j < n; j++)
            if (adj[i * n + j]) t->neighbors[nedges++] = j;
    /* mixing weights */
    for (i = 0; i < n; i++) {
        int di = t->offsets[i + 1] - t->offsets[i];
        double rest = 1.0;
        for (j = 0; j < n; j++) {
            int dj = t->offsets[j + 1] - t->offsets[j];
            double w = 0.0;
            if (adj[i * n + j]) w = desc->mixing == DT_MIXING_UNIFORM ? 1.0 / (di + 1) : 1.0 / (1 + (di > dj ? di : dj));
            t->weights[i * n + j] = w;
            rest -= w;
        }
        t->weights[i * n + i] = rest;
    }
    for (i = 0; i < n; i++) {   /* symmetric and doubly stochastic (rows sum to 1 by construction) */
        double col = 0.0;
        for (j = 0; j < n; j++) {
            col += t->weights[j * n + i];
            if (fabs(t->weights[i * n + j] - t->weights[j * n + i]) > 1e-12) {
                r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the %s mixing matrix is not symmetric (ranks %d and %d "
                                 "have degrees %d and %d): use DT_MIXING_METROPOLIS for graphs that are not regular",
                                 desc->mixing == DT_MIXING_UNIFORM ? "uniform" : "Metropolis", i, j,
                                 t->offsets[i + 1] - t->offsets[i], t->offsets[j + 1] - t->offsets[j]);
                goto done;
            }
        }
        if (fabs(col - 1.0) > 1e-9 || t->weights[i * n + i] < -1e-12) {
            r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the mixing matrix is not doubly stochastic at rank %d "
                             "(column sum %g, self weight %g)", i, col, t->weights[i * n + i]);
            goto done;
        }
    }
    t->world = n;
    if (part) goto done;
    {   /* connected: a search from rank 0 reaches everyone */
        const dt_topology *one = t;
        int missing = 0, reached = dt__topology_reach(&one, 1, n, &missing);
        if (reached < 0) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory"); goto done; }
        if (reached != n) {
            r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the graph is not connected (rank %d cannot be reached from "
                             "rank 0): gossip would never reach consensus; add edges", missing);
            goto done;
        }
    }
    /* spectral gap from the eigenvalues of W (symmetric, so real); Jacobi costs O(world^3) per sweep, so
       beyond 1024 ranks the gap is left at -1 (not computed) */
    if (n > 1024) { t->spectral_gap = t->lambda2 = -1.0; goto done; }
    work = (double *)DT_MALLOC(sizeof(double) * (size_t)n * (size_t)n);
    ev = (double *)DT_MALLOC(sizeof(double) * (size_t)n);
    if (!work || !ev) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for the spectrum"); goto done; }
    memcpy(work, t->weights, sizeof(double) * (size_t)n * (size_t)n);
    dt__sym_eigenvalues(work, n, ev);
    {
        /* the largest eigenvalue is 1 (the consensus direction); lambda2 is the largest |ev| among the rest */
        int top1 = 0, k;
        double l2 = 0.0;
        for (k = 1; k < n; k++) if (ev[k] > ev[top1]) top1 = k;
        for (k = 0; k < n; k++) if (k != top1 && fabs(ev[k]) > l2) l2 = fabs(ev[k]);
        t->lambda2 = l2;
        t->spectral_gap = 1.0 - l2;
    }
    t->world = n;
done:
    DT_FREE(adj); DT_FREE(work); DT_FREE(ev);
    if (r != DT_OK) dt_topology_free(t);
    return r;
}

dt_result dt_topology_create(dt_topology *t, const dt_topology_desc *desc) { return dt__topology_build(t, desc, 0); }

/* Whether rank i's ascending neighbour list holds j. */
static int dt__topology_lists(const dt_topology *t, int i, int j) {
    int lo = t->offsets[i], hi = t->offsets[i + 1];
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (t->neighbors[mid] == j) return 1;
        if (t->neighbors[mid] < j) lo = mid + 1; else hi = mid;
    }
    return 0;
}

dt_result dt_topology_check(const dt_topology *t, int world, const char *fn) {
    int n, i, j, k;
    if (!fn) fn = "dt_topology_check";
    if (!t || !t->weights || !t->offsets || !t->neighbors)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the topology is %s: build it with dt_topology_create", fn, t ? "empty" : "NULL");
    if ((n = t->world) != world)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the topology has %d ranks, not %d: give dt_topology_desc.world = %d", fn, n,
                            world, world);
    for (i = 0; i < n; i++) {
        double row = 0.0;
        if (t->offsets[i] < 0 || t->offsets[i + 1] < t->offsets[i] || (i == 0 && t->offsets[0] != 0))
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: the neighbour offsets of rank %d do not ascend from 0", fn, i);
        for (k = t->offsets[i]; k < t->offsets[i + 1]; k++) {
            j = t->neighbors[k];
            if (j < 0 || j >= n || j == i || (k > t->offsets[i] && j <= t->neighbors[k - 1]))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d's neighbour list must hold other ranks in ascending order, "
                                    "and holds %d at position %d", fn, i, j, k - t->offsets[i]);
            if (!dt__topology_lists(t, j, i))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d lists %d as a neighbour but %d does not list %d: gossip needs "
                                    "undirected edges", fn, i, j, j, i);
        }
        for (j = 0; j < n; j++) {
            double w = t->weights[(int64_t)i * n + j];
            row += w;
            if (!(w >= 0.0))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: W[%d][%d] is %g: mixing weights must be >= 0", fn, i, j, w);
            if (fabs(w - t->weights[(int64_t)j * n + i]) > 1e-12)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: the mixing matrix is not symmetric: W[%d][%d] = %g but W[%d][%d] = %g",
                                    fn, i, j, w, j, i, t->weights[(int64_t)j * n + i]);
            if (w != 0.0 && j != i && !dt__topology_lists(t, i, j))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: W[%d][%d] = %g but %d is not a neighbour of %d: a weight off the "
                                    "graph mixes a replica that is never sent", fn, i, j, w, j, i);
        }
        if (fabs(row - 1.0) > 1e-9)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: the mixing matrix is not doubly stochastic: row %d (and, W being "
                                "symmetric, column %d) sums to %.17g, not 1, so gossip would not keep the mean", fn, i, i, row);
    }
    return DT_OK;
}

dt_result dt_topology_check_union(const dt_topology *const *g, int n, int world, const char *fn) {
    int q, missing = 0, reached;
    dt_result r;
    if (!fn) fn = "dt_topology_check_union";
    if (!g || n < 1) return dt_set_error(DT_ERR_INVALID_ARG, "%s: no graphs to check (%d)", fn, n);
    for (q = 0; q < n; q++)
        if ((r = dt_topology_check(g[q], world, fn)) != DT_OK) return r;
    if ((reached = dt__topology_reach(g, n, world, &missing)) < 0) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    if (reached != world)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the union of the %d graphs is not connected (rank %d cannot be reached from "
                            "rank 0): gossip would never reach consensus; add edges or graphs", fn, n, missing);
    return DT_OK;
}

void dt_topology_schedule_free(dt_topology_schedule *s) {
    int k;
    if (!s) return;
    for (k = 0; s->graphs && k < s->period; k++) dt_topology_free(&s->graphs[k]);
    DT_FREE(s->graphs);
    memset(s, 0, sizeof *s);
}

dt_result dt_topology_one_peer_exp(dt_topology_schedule *s, int world) {
    dt_topology_desc d;
    uint8_t *adj;
    int k, i, period = 1;
    dt_result r = DT_OK;
    if (!s) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_one_peer_exp: schedule is NULL");
    memset(s, 0, sizeof *s);
    if (world < 1 || world > 65536)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_one_peer_exp: world is %d; it must be in 1..65536", world);
    while ((1 << period) < world) period++;   /* ceil(log2 world), at least 1 */
    adj = (uint8_t *)DT_MALLOC((size_t)world * (size_t)world);
    s->graphs = (dt_topology *)DT_MALLOC(sizeof(dt_topology) * (size_t)period);
    if (!adj || !s->graphs) {
        DT_FREE(adj); DT_FREE(s->graphs); s->graphs = NULL;
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_one_peer_exp: no memory for %d ranks", world);
    }
    memset(s->graphs, 0, sizeof(dt_topology) * (size_t)period);
    s->world = world;
    s->period = period;
    memset(&d, 0, sizeof d);
    d.kind = DT_TOPO_CUSTOM; d.world = world; d.adjacency = adj;   /* uniform: 1/2 on both ends of each edge */
    for (k = 0; k < period && r == DT_OK; k++) {
        memset(adj, 0, (size_t)world * (size_t)world);
        for (i = 0; i < world; i++)
            if ((i ^ (1 << k)) < world) adj[(int64_t)i * world + (i ^ (1 << k))] = 1;
        r = dt__topology_build(&s->graphs[k], &d, 1);
        /* W is a pairing: eigenvalue 1 for each pair's mean and each rank alone, 0 for each pair's difference */
        s->graphs[k].lambda2 = world > 2 ? 1.0 : 0.0;
        s->graphs[k].spectral_gap = 1.0 - s->graphs[k].lambda2;
    }
    DT_FREE(adj);
    if (r != DT_OK) dt_topology_schedule_free(s);
    return r;
}

const dt_topology *dt_topology_schedule_at(int64_t step, void *s) {
    const dt_topology_schedule *q = (const dt_topology_schedule *)s;
    if (!q || !q->graphs || q->period < 1 || step < 0) return NULL;
    return &q->graphs[step % q->period];
}

/* ---- communicator: the generic layer ----------------------------------------------------------- */
/* Everything above the transport: argument checks, the collective's signature and sequence number,
   error reports, counters, and the algorithms (naive, ring, tree) written once over isend/irecv. */

#ifdef __cplusplus
#define DT__STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define DT__STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* The communicator of one rank: private to the library (a backend reads it through the backend interface). */
/* A fault to inject (dt_comm_desc.fault), parsed. */
enum { DT__FAULT_NONE = 0, DT__FAULT_FAIL, DT__FAULT_RETURN, DT__FAULT_STALL, DT__FAULT_HANG, DT__FAULT_NAN };
typedef struct dt__fault {
    int      kind, rank;
    uint64_t coll;
    double   seconds;   /* stall */
} dt__fault;

struct dt_comm {
    int                    rank, size;
    const dt_comm_backend *backend;
    void                  *impl;            /* backend state */
    dt_comm_desc           desc;            /* the options, defaults filled in; desc.algo is what AUTO means */
    uint64_t               seq;             /* collectives started: the number in error messages */
    uint64_t               sig[3];          /* the operation in progress (its signature) */
    uint64_t               coll_sig[3];     /* the collective in progress, published for other ranks'
                                               mismatch checks (a seqlock: [0] is written last) */
    int                    tag_ub;          /* largest tag the transport carries */
    dt_result              broken;          /* sticky: after a failure every call returns it */
    char                   broken_msg[512];
    dt_comm_stats          stats;
    void                  *scratch;         /* reused by the algorithms */
    size_t                 scratch_bytes;
    dt_request            *reqs;            /* reused by the algorithms */
    int                    nreqs;
    dt__fault              fault;           /* desc.fault parsed: kind 0 = none */
    int                   *node;            /* [size] the backend's nodes (dt_comm_set_nodes); NULL: by desc.node_size */
    int                    ring_nodes;      /* > 0 while DT_ALGO_HIER's leaders run the ring: it is then the ring of
                                               the ring_nodes nodes' leaders (dt__ring_size) */
};

/* What a dt_request holds: the message its backend sees, then what only the library (and its local
   backend) keeps. A dt_request's reserved words are only ever read and written as this struct. */
typedef struct dt__req {
    dt_message      m;            /* first: a backend's dt_message * is the dt__req * */
    uint64_t        sig[3];       /* the operation the message belongs to (the local backend compares them) */
    double          not_before;   /* local link model: the time the message has crossed the link */
    dt_result       error;        /* local: a mismatch found when the message was matched */
    int             esize;        /* bytes per element of the type posted (dt_request_received) */
    struct dt__req *next;         /* local: the queue link */
} dt__req;
typedef struct dt__req_align { char c; dt__req r; } dt__req_align;
typedef struct dt__request_align { char c; dt_request r; } dt__request_align;
DT__STATIC_ASSERT(sizeof(dt__req) <= sizeof(dt_request), "dtrain: dt_request has too few reserved words for dt__req");
DT__STATIC_ASSERT(offsetof(dt__request_align, r) >= offsetof(dt__req_align, r), "dtrain: dt_request is less aligned than dt__req");
static dt__req *dt__rq(dt_request *q) { return (dt__req *)(void *)q; }
/* What a communicator is doing: the kind of its current operation, stored in sig[2]. */
enum { DT__OP_P2P = 0, DT__OP_BARRIER, DT__OP_BROADCAST, DT__OP_REDUCE, DT__OP_ALLREDUCE, DT__OP_SCATTER,
       DT__OP_GATHER, DT__OP_ALLGATHER, DT__OP_REDUCE_SCATTER, DT__OP_NEIGHBOR, DT__OP_ALLTOALL, DT__OP_ALLTOALLV,
       DT__OP_COUNT };
static const char *dt__op_names[DT__OP_COUNT] = {"point-to-point", "barrier", "broadcast", "reduce", "all-reduce",
                                                  "scatter", "gather", "all-gather", "reduce-scatter",
                                                  "neighbour exchange", "all-to-all", "all-to-all-v"};
/* Tags: the user's are 0 .. DT_TAG_USER_MAX. Above them, 64 belong to the library's own point-to-point
   messages (DDP's parameter server and P2P, FedAvg's reports, the timeline under MPI), which only its
   internal calls (dt__lib_send, ...) may use: a user's tag can never meet them. From DT__TAG_COLL up they
   belong to collectives: number and signature hash (dt_comm_coll_tag). */
enum { DT__TAG_DDP = DT_TAG_USER_MAX + 1, DT__TAG_FEDAVG, DT__TAG_TRACE, DT__TAG_LIB_END = DT_TAG_USER_MAX + 65 };
#define DT__TAG_COLL DT__TAG_LIB_END
#define DT__TAG_HASH_BITS 6

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
static const char *dt__enum_name(const char *const *names, int n, int k) { return k >= 0 && k < n ? names[k] : "unknown"; }
static dt_result dt__enum_parse(const char *const *names, int n, const char *s, int *out, const char *what) {
    char list[256];
    size_t len = 0;
    int k;
    for (k = 0; s && k < n; k++)
        if (strcmp(s, names[k]) == 0) { *out = k; return DT_OK; }
    list[0] = 0;
    for (k = 0; k < n && len < sizeof list; k++) {
        int w = snprintf(list + len, sizeof list - len, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", names[k]);
        if (w > 0) len += (size_t)w;
    }
    return dt_set_error(DT_ERR_INVALID_ARG, "unknown %s '%s': use %s", what, s ? s : "(null)", list);
}

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
    int n = snprintf(buf, cap, "%s #%llu (", kind < DT__OP_COUNT ? dt__op_names[kind] : "?", (unsigned long long)sig[0]);
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
const dt_comm_backend *dt_comm_get_backend(const dt_comm *c) { return c ? c->backend : NULL; }
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
   message carries the collective's signature. The algorithms reach it through the wrappers below:
   dt__send, dt__recv, dt__recv_reduce, dt__signal and dt__ring_step. */
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

/* Chunk k of n elements split over p ranks: the first n % p chunks have one element more. */
static size_t dt__chunk_off(size_t n, int p, int k) { return (size_t)k * (n / (size_t)p) + ((size_t)k < n % (size_t)p ? (size_t)k : n % (size_t)p); }
static size_t dt__chunk_len(size_t n, int p, int k) { return n / (size_t)p + ((size_t)k < n % (size_t)p ? 1 : 0); }
/* The node of rank k: the backend's grouping, else desc.node_size consecutive ranks, else k alone. */
static int dt__node_of(const dt_comm *c, int k) {
    if (c->node) return c->node[k];
    return c->desc.node_size > 0 ? k / c->desc.node_size : k;
}
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
/* The fault dt_comm_desc.fault asks for, when this is its rank and collective. data: the rank's own f32
   elements in the collective (NULL: none), where kind nan writes. */
static dt_result dt__fault_fire(dt_comm *c, void *data, size_t count, dt_dtype t) {
    static const char *names[] = {"", "fail", "return", "stall", "hang", "nan"};
    const dt__fault *f = &c->fault;
    char what[160];
    if (f->kind == DT__FAULT_NONE || c->rank != f->rank || c->seq != f->coll) return DT_OK;
    dt_comm_describe(c, what, sizeof what);
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
        if (data && count > 0 && t == DT_F32) ((float *)data)[0] = NAN;
        return DT_OK;
    }
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
    return DT_OK;
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
        dt_trace_begin(dt__op_names[kind], "comm");
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
/* The library's own point-to-point messages (train.h's DDP and FedAvg, the launcher's timeline): the same
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
    if ((r = dt__coll_start(c, DT__OP_BROADCAST, buf, count, t, 0, root, algo)) != DT_OK) return r;
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
                                            const int *to, int nto, const int *from, int nfrom) {
    dt_result r = dt__comm_check(c, "dt_comm_neighbor_exchange", send, count, t, 0, NULL);
    size_t bytes;
    dt_request *q = NULL;
    int i;
    if (r == DT_OK && (nto < 0 || nfrom < 0 || (nto > 0 && !to) || (nfrom > 0 && !from) || (nfrom > 0 && count > 0 && !recv)))
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_neighbor_exchange: a neighbour list or the receive buffer is missing");
    for (i = 0; r == DT_OK && i < nto + nfrom; i++) {
        int k = i < nto ? to[i] : from[i - nto];
        if (k < 0 || k >= c->size)
            r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_neighbor_exchange: neighbour %d is not a rank (0..%d)", k, c->size - 1);
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
                                    const int *to, int nto, const int *from, int nfrom) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_neighbor_exchange(c, send, recv, count, t, to, nto, from, nfrom));
}

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

static dt_result dt__local_isend(dt_comm *c, dt_message *msg) {
    dt__lworld *W = (dt__lworld *)dt_comm_impl(c);
    dt__req *q = (dt__req *)msg, *it;
    int me = dt_comm_rank(c), dst = msg->peer, tag = msg->tag;
    dt__lrank *d = &W->r[dst];
    if (DT__ATOMIC_LOAD(&d->gone) && dst != me) return dt__local_gone_error(W, dst);
    dt__mutex_lock(&d->mu);
    if ((W->latency > 0 || W->bandwidth > 0) && dt__node_of(c, dst) != dt__node_of(c, me)) {
        /* the link model: each node (each rank, unless ranks are grouped into nodes) has one full-duplex
           port to a switch. The message waits until the sender's port is free to send and the
           receiver's to receive, occupies both for bytes / bandwidth, and arrives latency seconds after
           it has left. Messages inside a node do not use the port. */
        double *out = &W->link_free[dt__node_of(c, me)], *in = &W->link_free[W->n + dt__node_of(c, dst)], start;
        dt__mutex_lock(&W->link_mu);
        start = dt_time_now();
        if (*out > start) start = *out;
        if (*in > start) start = *in;
        *out = *in = start + (W->bandwidth > 0 ? (double)msg->bytes / W->bandwidth : 0.0);
        q->not_before = *out;
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
    uint64_t s0, s1, s2;
    if (!o || k == c->rank || (c->sig[2] & 0xff) == DT__OP_P2P) return 0;
    if ((s0 = DT__ATOMIC_LOAD(&o->coll_sig[0])) != c->sig[0]) return 0;
    s1 = DT__ATOMIC_LOAD(&o->coll_sig[1]);
    s2 = DT__ATOMIC_LOAD(&o->coll_sig[2]);
    if (DT__ATOMIC_LOAD(&o->coll_sig[0]) != s0 || (s1 == c->sig[1] && s2 == c->sig[2])) return 0;
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
    dt__lrank *me = &W->r[c->rank];
    if (DT__ATOMIC_LOAD(&q->m.state) == DT_REQ_CANCELLED) return dt_set_error(DT_ERR_STATE, "the request was cancelled");
    if (DT__ATOMIC_LOAD(&q->m.state) != DT_REQ_DONE && !dt__local_spin(W, &q->m.state, DT_REQ_DONE)) {
        dt__mutex_lock(&me->mu);
        while (DT__ATOMIC_LOAD(&q->m.state) != DT_REQ_DONE) {
            double now = dt_time_now();
            int gone = q->m.peer != c->rank && DT__ATOMIC_LOAD(&W->r[q->m.peer].gone);
            uint64_t other[3];
            int differs = dt_comm_tag_seq(q->m.tag) >= 0 && dt__local_peer_differs(W, c, q->m.peer, other);
            if (gone || differs || now >= deadline) {
                dt__mutex_unlock(&me->mu);
                dt__local_cancel(c, msg);
                if (DT__ATOMIC_LOAD(&q->m.state) == DT_REQ_DONE) return dt__local_finish(W, c->rank, q);   /* it made it after all */
                if (gone) return dt__local_gone_error(W, q->m.peer);
                if (differs) return dt__mismatch_error(q->m.peer, c->sig, other);
                return dt_set_error(DT_ERR_TIMEOUT, "no %s rank %d within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)",
                                    q->m.kind == DT_REQ_SEND ? "receive was posted by" : "message came from", q->m.peer, c->desc.timeout);
            }
            dt__cond_wait_for(&me->cv, &me->mu, deadline - now);
        }
        dt__mutex_unlock(&me->mu);
    }
    return dt__local_finish(W, c->rank, q);
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
    if (q->m.peer != c->rank && DT__ATOMIC_LOAD(&W->r[q->m.peer].gone)) {
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
    int n = W->n, me = c->rank, k;
    uint64_t gen, other[3];
    double t0 = dt_time_now();
    dt_result r = DT_OK;
    dt__mutex_lock(&W->mu);
    gen = W->bar_gen;
    if ((k = dt__local_gone_rank(W, me)) >= 0) { dt__mutex_unlock(&W->mu); return dt__local_gone_error(W, k); }
    memcpy(&W->bar_sig[(size_t)me * 3], c->sig, 3 * sizeof(uint64_t));
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
                c->stats.wait_seconds += dt_time_now() - t0;
                if (gone >= 0) return dt__local_gone_error(W, gone);
                if (bad >= 0) return dt__mismatch_error(bad, c->sig, other);
                return dt_set_error(DT_ERR_TIMEOUT, "not every rank arrived within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)", c->desc.timeout);
            }
            dt__cond_wait_for(&W->cv, &W->mu, deadline - now);
        }
        dt__mutex_unlock(&W->mu);
    }
    c->stats.wait_seconds += dt_time_now() - t0;
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
    W->r[c->rank].ptr = buf;
    if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
    if (c->rank != root && bytes) memcpy(buf, W->r[root].ptr, bytes);
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
    int p = W->n, me = c->rank, k;
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
    int p = W->n, me = c->rank, k;
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
        if (k == c->rank) continue;
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
    dt__lrank *me = &W->r[c->rank];
    dt__req *it, *next;
    int k;
    if (DT__ATOMIC_LOAD(&me->gone)) return;
    dt__mutex_lock(&W->mu);   /* the root cause is written before anyone can see this rank gone */
    if (res != DT_OK && res != DT_ERR_PEER && !W->cause[0]) {   /* named by its rank, unless the message does it */
        if (msg && strncmp(msg, "rank ", 5) == 0) snprintf(W->cause, sizeof W->cause, "%.300s (%s)", msg, dt_result_str(res));
        else snprintf(W->cause, sizeof W->cause, "rank %d: %.300s (%s)", c->rank, msg ? msg : "", dt_result_str(res));
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
            if (it->m.owner == c->rank) { dt__lq_unlink(&o->inbox, &o->inbox_tail, it); DT__ATOMIC_STORE(&it->m.state, DT_REQ_CANCELLED); }
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
    W->comms[c->rank] = NULL;
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
#if DT__HAVE_OMP
    cores = omp_get_num_procs();
#elif DT__HAVE_THREADS && defined(_SC_NPROCESSORS_ONLN)
    cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
#endif
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

/* ---- the launcher ------------------------------------------------------------------------------ */

int dt_current_rank(void) { return dt__tls_rank; }

static dt_result dt__parse_num(const char *flag, const char *v, double lo, double *out) {
    char *end;
    double x, mul = 1.0;
    if (!v) return dt_set_error(DT_ERR_INVALID_ARG, "%s needs a value", flag);
    x = strtod(v, &end);
    if (end != v && *end && !end[1]) {
        if (*end == 'K' || *end == 'k') { mul = 1e3; end++; }
        else if (*end == 'M' || *end == 'm') { mul = 1e6; end++; }
        else if (*end == 'G' || *end == 'g') { mul = 1e9; end++; }
    }
    if (end == v || *end || !(x * mul >= lo) || x * mul > 1e18)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s '%s' is not a number >= %g", flag, v, lo);
    *out = x * mul;
    return DT_OK;
}

dt_result dt_launch_parse(int *argc, char **argv, dt_launch_desc *d) {
    int i, o = 1;
    if (!argc || !argv || !d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch_parse: argc, argv and desc must not be NULL");
    for (i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        double x;
        dt_result r = DT_OK;
        if (strcmp(a, "--ranks") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 4096 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--ranks '%s': use a whole number from 1 to 4096", v);
            if (r == DT_OK) d->ranks = (int)x;   /* only a checked value: (int) of 5e9 is undefined */
            i++;
        } else if (strcmp(a, "--threads-per-rank") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1024 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--threads-per-rank '%s': use a whole number from 1 to 1024", v);
            if (r == DT_OK) d->threads_per_rank = (int)x;
            i++;
        } else if (strcmp(a, "--algo") == 0) {
            if (!v) r = dt_set_error(DT_ERR_INVALID_ARG, "--algo needs a value: naive, ring, tree, native or hier");
            else r = dt_algo_parse(v, &d->comm.algo);
            i++;
        } else if (strcmp(a, "--node-size") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1e9 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--node-size '%s': use a whole number of ranks per node, from 1", v);
            if (r == DT_OK) d->comm.node_size = (int)x;
            i++;
        } else if (strcmp(a, "--timeout") == 0) {
            if ((r = dt__parse_num(a, v, 1e-3, &x)) == DT_OK) d->comm.timeout = x;
            i++;
        } else if (strcmp(a, "--link-latency") == 0) {
            if ((r = dt__parse_num(a, v, 0, &x)) == DT_OK) d->comm.link_latency = x;
            i++;
        } else if (strcmp(a, "--link-bandwidth") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK) d->comm.link_bandwidth = x;
            i++;
        } else if (strcmp(a, "--log-all-ranks") == 0) {
            d->log_all_ranks = 1;
        } else if (strcmp(a, "--trace") == 0) {
            if (!v || !*v) r = dt_set_error(DT_ERR_INVALID_ARG, "--trace needs a file name, e.g. --trace run.json");
            d->trace_path = v; i++;
        } else if (strcmp(a, "--trace-max-events") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1e12 || x != (double)(int64_t)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--trace-max-events '%s': use a whole number from 1 to 1e12", v);
            if (r == DT_OK) d->trace_max_events = (int64_t)x;
            i++;
        } else {
            argv[o++] = argv[i];
            continue;
        }
        if (r != DT_OK) return r;
    }
    *argc = o;
    argv[o] = NULL;
    return DT_OK;
}

/* ---- the timeline file ------------------------------------------------------------------------ */

/* Lanes for n ranks (rank r's are lanes[r * DT__TRACE_LANES ...]), with time 0 now; NULL without memory. */
static dt__trace_lane *dt__trace_lanes(int n, int64_t max) {
    dt__trace_lane *L = (dt__trace_lane *)DT_MALLOC(sizeof *L * (size_t)n * DT__TRACE_LANES);
    double t0 = dt_time_now();
    int i;
    if (!L) return NULL;
    memset(L, 0, sizeof *L * (size_t)n * DT__TRACE_LANES);
    for (i = 0; i < n * DT__TRACE_LANES; i++) {
        L[i].lane = i % DT__TRACE_LANES;
        L[i].max = max > 0 ? max : DT_TRACE_MAX_EVENTS;
        L[i].origin = t0;
    }
    return L;
}
static void dt__trace_lanes_free(dt__trace_lane *L, int n) {
    int i;
    for (i = 0; L && i < n * DT__TRACE_LANES; i++) DT_FREE(L[i].ev);
    DT_FREE(L);
}

/* Text that grows; oom is set, and nothing more added, once an allocation fails. */
typedef struct dt__text { char *p; size_t n, cap; int oom; } dt__text;
static int dt__text_reserve(dt__text *t, size_t more) {
    size_t cap = t->cap ? t->cap : 4096;
    char *p;
    if (t->oom) return -1;
    if (t->n + more < t->cap) return 0;
    while (cap <= t->n + more) cap *= 2;
    if (!(p = (char *)DT_REALLOC(t->p, cap))) { t->oom = 1; return -1; }
    t->p = p;
    t->cap = cap;
    return 0;
}
static void dt__text_add(dt__text *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void dt__text_add(dt__text *t, const char *fmt, ...) {
    va_list ap;
    int k;
    if (dt__text_reserve(t, 256) != 0) return;
    va_start(ap, fmt);
    k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k >= t->cap - t->n && dt__text_reserve(t, (size_t)k + 1) == 0) {   /* did not fit: again */
        va_start(ap, fmt);
        k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
        va_end(ap);
    }
    if (k < 0) t->oom = 1;
    if (!t->oom) t->n += (size_t)k;
}
/* s as a JSON string: quotes, backslashes and control characters escaped (other bytes as they are: UTF-8). */
static void dt__text_json(dt__text *t, const char *s) {
    static const char hex[] = "0123456789abcdef";
    char *o;
    if (dt__text_reserve(t, 6 * strlen(s) + 3) != 0) return;
    o = t->p + t->n;
    *o++ = '"';
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { *o++ = '\\'; *o++ = (char)ch; }
        else if (ch < 0x20) { memcpy(o, "\\u00", 4); o[4] = hex[ch >> 4]; o[5] = hex[ch & 15]; o += 6; }
        else *o++ = (char)ch;
    }
    *o++ = '"';
    *o = 0;
    t->n = (size_t)(o - t->p);
}

/* Appends rank's lanes as trace events (pid = rank, tid = lane), each preceded by ",\n": metadata naming
   the process and its threads, then the events in begin order; spans still open end at `end` (seconds
   since time 0) and say "unfinished". Adds the events to *events and the dropped ones to *dropped. */
static void dt__trace_format(dt__text *t, const dt__trace_lane *lanes, int rank, double end, int64_t *events, int64_t *dropped) {
    static const char *const lane_names[DT__TRACE_LANES] = {"main", "ddp buckets"};
    int64_t i, lost = 0;
    int l, a;
    dt__text_add(t, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", rank, rank);
    dt__text_add(t, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}", rank, rank);
    for (l = 0; l < DT__TRACE_LANES; l++) {
        const dt__trace_lane *L = &lanes[l];
        lost += L->dropped;
        if (l > 0 && L->n == 0) continue;
        dt__text_add(t, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}", rank, l,
                     lane_names[l]);
        for (i = 0; i < L->n; i++) {
            const dt__trace_ev *e = &L->ev[i];
            int open = e->ph == 'X' && e->t1 < 0;
            dt__text_add(t, ",\n{\"name\":");
            dt__text_json(t, e->name);
            dt__text_add(t, ",\"cat\":");
            dt__text_json(t, e->cat);
            dt__text_add(t, ",\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", e->ph, rank, l, 1e6 * e->t0);
            if (e->ph == 'X') dt__text_add(t, ",\"dur\":%.3f", 1e6 * ((open ? end : e->t1) - e->t0));
            else dt__text_add(t, ",\"s\":\"t\"");
            if (e->nargs || open) {
                dt__text_add(t, ",\"args\":{");
                for (a = 0; a < e->nargs; a++) {
                    dt__text_add(t, "%s", a ? "," : "");
                    dt__text_json(t, e->arg[a].key ? e->arg[a].key : "?");
                    if (e->arg[a].s) { dt__text_add(t, ":"); dt__text_json(t, e->arg[a].s); }
                    else dt__text_add(t, ":%lld", (long long)e->arg[a].v);
                }
                if (open) dt__text_add(t, "%s\"unfinished\":1", e->nargs ? "," : "");
                dt__text_add(t, "}");
            }
            dt__text_add(t, "}");
        }
        *events += L->n;
    }
    if (lost)
        dt__text_add(t, ",\n{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"labels\":\"%lld events "
                     "dropped\"}}", rank, (long long)lost);
    *dropped += lost;
}

/* Before a run: that path.tmp can be created (and is removed again), so an unwritable --trace fails at
   once, not after the training it was to record. */
static dt_result dt__trace_check_path(const char *path) {
    char tmp[1024];
    FILE *f;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "trace %s: the path is too long", path);
    if (!(f = fopen(tmp, "wb")))
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: creating %s failed: %s (does the directory exist and is "
                            "it writable?); nothing was run", path, tmp, strerror(errno));
    fclose(f);
    remove(tmp);
    return DT_OK;
}

/* Writes the trace file: the events of body (as dt__trace_format made them) in one JSON object, into
   path.tmp, renamed over path once complete, so a reader never sees half a file. Logs where it went. */
static dt_result dt__trace_write(const char *path, const dt__text *body, int ranks, int64_t events, int64_t dropped, int64_t max) {
    char tmp[1024];
    FILE *f;
    int ok, err;
    if (body->oom) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "trace %s: no memory for the text of %lld events", path, (long long)events);
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "trace %s: the path is too long", path);
    if (!(f = fopen(tmp, "wb")))
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: creating %s failed: %s", path, tmp, strerror(errno));
    ok = fputs("{\"traceEvents\":[", f) >= 0 && (body->n < 1 || fwrite(body->p + 1, 1, body->n - 1, f) == body->n - 1) &&
         fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"dtrain %s\",\"ranks\":%d,\"events\":%lld,"
                 "\"dropped_events\":%lld}}\n", DT_VERSION_STRING, ranks, (long long)events, (long long)dropped) > 0;
    err = errno;
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
    if (!ok) {
        remove(tmp);
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: writing %s failed: %s", path, tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        remove(tmp);
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: renaming %s to it failed: %s", path, tmp, strerror(err));
    }
    dt_log(DT_LOG_INFO, "trace: %s (%lld events, open in https://ui.perfetto.dev or chrome://tracing)", path, (long long)events);
    if (dropped)
        dt_log(DT_LOG_WARN, "trace %s: %lld events were dropped, past %lld per rank and thread; raise the cap with "
               "--trace-max-events N (dt_launch_desc.trace_max_events)", path, (long long)dropped, (long long)max);
    return DT_OK;
}

/* After the local ranks have been joined: every rank's lanes into one file. */
static dt_result dt__trace_finish_local(const char *path, dt__trace_lane *lanes, int n) {
    dt__text t;
    int64_t events = 0, dropped = 0;
    double end = dt_time_now() - lanes[0].origin;
    dt_result r;
    int i;
    memset(&t, 0, sizeof t);
    for (i = 0; i < n; i++) dt__trace_format(&t, lanes + i * DT__TRACE_LANES, i, end, &events, &dropped);
    r = dt__trace_write(path, &t, n, events, dropped, lanes[0].max);
    DT_FREE(t.p);
    return r;
}

/* How the ranks of dt_launch end: counted as they do, and the time of the first failure, after which
   the launcher waits a bounded time for the rest (a rank stalled for good is left behind). */
typedef struct dt__launch_end {
    dt__mutex mu;
    dt__cond  cv;
    int       ended;
    double    failed_at;   /* 0: no rank has failed yet */
} dt__launch_end;

typedef struct dt__rank_ctx {
    dt__launch_end *end;
    int         ended;     /* under end->mu */
    dt_comm    *comm;
    dt_rank_fn  fn;
    void       *arg;
    int         threads, finished, order;
    dt_result   result;
    char        msg[512];
    dt__thread  thread;
    dt__trace_lane *trace;   /* the rank's lanes when tracing, else NULL */
} dt__rank_ctx;

/* The rank has ended (returned, or its thread exited): the launcher counts it. */
static void dt__rank_ended(dt__rank_ctx *x) {
    dt__mutex_lock(&x->end->mu);
    x->ended = 1;
    x->end->ended++;
    if (x->result != DT_OK && x->end->failed_at == 0) x->end->failed_at = dt_time_now();
    dt__cond_broadcast(&x->end->cv);
    dt__mutex_unlock(&x->end->mu);
}
#if DT__HAVE_THREADS
static void dt__rank_exit(void *p) {   /* the thread ended inside fn (pthread_exit): the rank has gone */
    dt__rank_ctx *x = (dt__rank_ctx *)p;
    if (x->finished) return;
    x->result = DT_ERR_STATE;
    snprintf(x->msg, sizeof x->msg, "DT_ERR_STATE: rank %d: its thread exited before its rank function returned", x->comm->rank);
    dt_comm_leave(x->comm, x->result, x->msg + strlen("DT_ERR_STATE: "));
    dt__rank_ended(x);
}
#endif
/* A rank's failure as the launcher reports it: "CODE: rank R: message", the rank added where the
   message does not begin with one (a NaN loss, a file that cannot be read). */
static void dt__rank_msg(char *out, size_t cap, int rank, dt_result r, const char *m) {
    m = dt__cause(m, r);
    if (!m[0]) snprintf(out, cap, "%s: rank %d's function failed", dt_result_str(r), rank);
    else if (strncmp(m, "rank ", 5) == 0) snprintf(out, cap, "%s: %.470s", dt_result_str(r), m);
    else snprintf(out, cap, "%s: rank %d: %.460s", dt_result_str(r), rank, m);
}
static void dt__rank_body(dt__rank_ctx *x) {
    x->result = x->fn(x->comm, x->arg);
    if (x->result != DT_OK) dt__rank_msg(x->msg, sizeof x->msg, x->comm->rank, x->result, dt_last_error());
    x->finished = 1;
    dt_comm_leave(x->comm, x->result, dt__cause(x->msg, x->result));   /* without the code's name: the others' reports add it */
}
static void dt__rank_main(void *p) {
    dt__rank_ctx *x = (dt__rank_ctx *)p;
    dt__tls_rank = x->comm->rank;
    dt__tls_trace = x->trace;
#if DT__HAVE_OMP
    omp_set_num_threads(x->threads);
#endif
#if DT__HAVE_THREADS
    pthread_cleanup_push(dt__rank_exit, x);
    dt__rank_body(x);
    pthread_cleanup_pop(0);
#else
    dt__rank_body(x);
#endif
    dt__tls_rank = -1;
    dt__tls_trace = NULL;
    dt__rank_ended(x);
}

static int dt__default_threads(int ranks) {
    int cores = 1;
#if DT__HAVE_OMP
    cores = omp_get_num_procs();
#endif
    return cores / ranks > 1 ? cores / ranks : 1;
}

/* How likely rank i's failure is the run's cause: an error of its own, then a rank that never returned
   (stalled), then a timeout (which may only be the wait for a stalled rank), then DT_ERR_PEER (which
   only follows from another rank's failure). */
static int dt__cause_rank(const dt__rank_ctx *x) {
    if (x->result == DT_OK) return -1;
    if (!x->ended) return 2;
    return x->result == DT_ERR_PEER ? 0 : x->result == DT_ERR_TIMEOUT ? 1 : 3;
}

/* Waits for the ranks to end; once one has failed, only grace seconds more (the others' waits end by
   their timeout). Returns how many have not ended: stalled, left running. */
static int dt__launch_wait(dt__launch_end *e, int started, double grace) {
    int left;
    dt__mutex_lock(&e->mu);
    while (e->ended < started) {
        double now = dt_time_now();
        if (e->failed_at > 0 && now >= e->failed_at + grace) break;
        dt__cond_wait_for(&e->cv, &e->mu, e->failed_at > 0 ? e->failed_at + grace - now : 1.0);
    }
    left = started - e->ended;
    dt__mutex_unlock(&e->mu);
    return left;
}

/* Logs the failed ranks: the cause in full; the others' that say the same (every rank's NaN loss) on one
   line; other failures in full; DT_ERR_PEER, which only repeats the cause, at DT_LOG_DEBUG. */
static void dt__launch_log(const dt__rank_ctx *x, int n, int cause) {
    char same[256] = "";
    size_t len = 0;
    int i;
    const char *cm = strchr(x[cause].msg, ':');
    dt_log(DT_LOG_ERROR, "%s", x[cause].msg);
    for (i = 0; i < n; i++) {
        const char *m = strchr(x[i].msg, ':');
        if (i == cause || x[i].result == DT_OK) continue;
        if (x[i].result == DT_ERR_PEER) dt_log(DT_LOG_DEBUG, "%s", x[i].msg);
        else if (x[i].result == x[cause].result && m && cm && strchr(m + 2, ':') && strchr(cm + 2, ':') &&
                 strcmp(strchr(m + 2, ':'), strchr(cm + 2, ':')) == 0 && len + 16 < sizeof same) {
            int k = snprintf(same + len, sizeof same - len, "%s%d", len ? ", " : "", i);
            if (k > 0) len += (size_t)k;
        } else dt_log(DT_LOG_ERROR, "%s", x[i].msg);
    }
    if (len) dt_log(DT_LOG_ERROR, "rank%s %s failed the same way", strchr(same, ',') ? "s" : "", same);
}

/* Runs the ranks; with log set, logs the failures (dt__launch_log). After the first failure the others
   have their communicator's timeout and a second more to end; a rank that has not (stalled outside the
   communicator, or for good) is reported as the failure and its thread left running: its communicator,
   context and the caller's data stay as they are, and the process must exit. */
static dt_result dt__launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results, int log) {
    dt_launch_desc d;
    dt__rank_ctx *x;
    dt_comm **comms;
    dt__trace_lane *lanes = NULL;
    dt__launch_end *e;
    int n, i, cause = -1, stalled = 0;
    dt_result r;
    if (!fn) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch: the rank function is NULL");
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    n = d.ranks > 0 ? d.ranks : 1;
    x = (dt__rank_ctx *)DT_MALLOC((size_t)n * sizeof *x);
    comms = (dt_comm **)DT_MALLOC((size_t)n * sizeof *comms);
    e = (dt__launch_end *)DT_MALLOC(sizeof *e);
    if (d.trace_path) lanes = dt__trace_lanes(n, d.trace_max_events);
    if (!x || !comms || !e || (d.trace_path && !lanes))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: no memory for %d ranks", n);
    else if (!d.trace_path || (r = dt__trace_check_path(d.trace_path)) == DT_OK)
        r = dt_comm_create_local(comms, n, &d.comm);
    if (r != DT_OK) {   /* no rank ran: logged like a rank's failure, so a program that prints nothing else says why */
        if (log) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        DT_FREE(x); DT_FREE(comms); DT_FREE(lanes); DT_FREE(e);
        return r;
    }
    memset(x, 0, (size_t)n * sizeof *x);
    memset(e, 0, sizeof *e);
    dt__mutex_init(&e->mu);
    dt__cond_init(&e->cv);
    dt__log_all_ranks = d.log_all_ranks;
    for (i = 0; i < n; i++) {
        x[i].end = e;
        x[i].comm = comms[i];
        x[i].fn = fn;
        x[i].arg = arg;
        x[i].threads = d.threads_per_rank > 0 ? d.threads_per_rank : dt__default_threads(n);
        x[i].trace = lanes ? lanes + i * DT__TRACE_LANES : NULL;
    }
    if (n == 1) dt__rank_main(&x[0]);   /* one rank runs on the calling thread */
    else {
        int started;
        for (started = 0; started < n; started++)
            if (dt__thread_start(&x[started].thread, dt__rank_main, &x[started]) != 0) break;
        for (i = started; i < n; i++) {   /* could not start: these ranks have gone */
            x[i].result = DT_ERR_OUT_OF_MEMORY;
            snprintf(x[i].msg, sizeof x[i].msg, "DT_ERR_OUT_OF_MEMORY: rank %d: its thread could not be started", i);
            dt_comm_leave(comms[i], x[i].result, x[i].msg + 22);
            x[i].ended = 1;
        }
        stalled = dt__launch_wait(e, started, dt_comm_get_desc(comms[0]).timeout + 1.0);
        for (i = 0; i < started; i++) {
            dt__mutex_lock(&e->mu);
            if (!x[i].ended) {   /* read under the mutex: the thread may end just now, and is then joined */
                x[i].result = DT_ERR_TIMEOUT;
                snprintf(x[i].msg, sizeof x[i].msg, "DT_ERR_TIMEOUT: rank %d has not returned %.3g s after the run failed: it is stalled (its "
                         "thread is left running, so the process must exit now)", i, dt_comm_get_desc(comms[0]).timeout + 1.0);
            }
            dt__mutex_unlock(&e->mu);
            if (x[i].result != DT_ERR_TIMEOUT || x[i].finished) dt__thread_join(&x[i].thread);
        }
    }
    for (i = 0; i < n; i++) {
        if (results) results[i] = x[i].result;
        if (dt__cause_rank(&x[i]) > (cause < 0 ? -1 : dt__cause_rank(&x[cause]))) cause = i;
    }
    r = DT_OK;
    if (cause >= 0) {
        if (log) dt__launch_log(x, n, cause);
        r = x[cause].result;
        dt_set_error(r, "%s", dt__cause(x[cause].msg, r));
    }
    if (stalled) {   /* the stalled threads may still use all of it but the array of pointers */
        if (lanes && log) dt_log(DT_LOG_WARN, "the timeline was not written to %s: a rank is still running", d.trace_path);
        DT_FREE(comms);
        return r;
    }
    if (lanes) {   /* also after a failure: the trace of a failed run shows where each rank was */
        char cause_msg[512];
        dt_result rt;
        snprintf(cause_msg, sizeof cause_msg, "%s", dt_last_error());
        rt = dt__trace_finish_local(d.trace_path, lanes, n);
        if (rt != DT_OK && log) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        if (rt != DT_OK && r == DT_OK) r = rt;
        else if (rt != DT_OK) snprintf(dt__errmsg, sizeof dt__errmsg, "%s", cause_msg);   /* the run's failure comes first */
        dt__trace_lanes_free(lanes, n);
    }
    for (i = 0; i < n; i++) dt_comm_destroy(comms[i]);
    dt__cond_destroy(&e->cv);
    dt__mutex_destroy(&e->mu);
    DT_FREE(e);
    DT_FREE(comms);
    DT_FREE(x);
    return r;
}

dt_result dt_launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results) {
    return dt__launch_local(desc, fn, arg, results, 0);
}

/* Started by mpiexec? Hydra (MPICH) sets PMI_SIZE, Open MPI OMPI_COMM_WORLD_SIZE, PMIx PMIX_RANK. */
static int dt__mpiexec_size(void) {
    const char *v = getenv("PMI_SIZE");
    if (!v) v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v && getenv("PMIX_RANK")) v = "2";
    return v ? atoi(v) : 0;
}

/* ---- a launcher for one rank per process (MPI's) ------------------------------------------------
   The timeline of such a run: a barrier aligns the clocks (time 0 is the moment just after it on every
   rank). At the end every rank formats its own events; rank 0 gathers the sizes, receives each rank's
   text in rank order, and broadcasts that it has them all; then it writes the one file. A rank that
   failed, or whose part of the exchange failed (a rank has died), writes its own events to PATH.rank<r>. */
#define DT__TRACE_CHUNK (1 << 26)      /* bytes per message, well below MPI's INT_MAX */

static dt_result dt__launch_trace_start(dt_comm *c, const dt_launch_desc *desc, dt__trace_lane **lanes) {
    dt_result r = c->rank == 0 ? dt__trace_check_path(desc->trace_path) : DT_OK;   /* rank 0 writes the file */
    int64_t bad = r != DT_OK;
    dt_result e;
    int i;
    if ((e = dt_comm_allreduce(c, &bad, 1, DT_I64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return e;
    if (bad) return r != DT_OK ? r : dt_set_error(DT_ERR_PEER, "dt_launch: rank 0 cannot write the trace %s", desc->trace_path);
    if (!(*lanes = dt__trace_lanes(1, desc->trace_max_events)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: rank %d: no memory for the trace", c->rank);
    if ((r = dt_comm_barrier(c)) != DT_OK) return r;
    for (i = 0; i < DT__TRACE_LANES; i++) (*lanes)[i].origin = dt_time_now();
    dt_comm_reset_stats(c);   /* the barrier is not the program's */
    return DT_OK;
}

/* Rank 0 appends rank k's text of len bytes to t; the others send theirs. */
static dt_result dt__launch_trace_move(dt_comm *c, dt__text *t, int k, int64_t len) {
    int64_t off, part;
    size_t got = 0;
    dt_result r = DT_OK;
    if (c->rank == 0 && dt__text_reserve(t, (size_t)len + 1) != 0)
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "trace: rank 0: no memory for rank %d's %lld bytes of events", k, (long long)len);
    for (off = 0; off < len && r == DT_OK; off += part) {
        part = len - off < DT__TRACE_CHUNK ? len - off : DT__TRACE_CHUNK;
        if (c->rank != 0) r = dt__lib_send(c, t->p + off, (size_t)part, DT_U8, 0, DT__TAG_TRACE);
        else if ((r = dt__lib_recv(c, t->p + t->n + off, (size_t)part, DT_U8, k, DT__TAG_TRACE, &got)) == DT_OK && got != (size_t)part)
            r = dt_set_error(DT_ERR_MISMATCH, "trace: rank %d sent %zu bytes of events where %lld were due", k, got, (long long)part);
    }
    if (r == DT_OK && c->rank == 0) t->n += (size_t)len;
    return r;
}

static dt_result dt__launch_trace_finish(dt_comm *c, const char *path, dt__trace_lane *lanes, int failed) {
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
        if (me != 0 && r == DT_OK) r = dt__launch_trace_move(c, &t, 0, mine[0]);
        for (k = 1; me == 0 && k < c->size && r == DT_OK; k++) {
            r = dt__launch_trace_move(c, &t, k, all[3 * k]);
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

dt_result dt_launch_rank(dt_comm *c, const dt_launch_desc *desc, int local_ranks, dt_rank_fn fn, void *arg) {
    dt__trace_lane *lanes = NULL;
    dt_result r = DT_OK, rt = DT_OK;
    char m[512];
    if (!c || !desc || !fn) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch_rank: communicator, desc and rank function must not be NULL");
    dt__tls_rank = c->rank;
    dt__log_all_ranks = desc->log_all_ranks;
#if DT__HAVE_OMP
    omp_set_num_threads(desc->threads_per_rank > 0 ? desc->threads_per_rank : dt__default_threads(local_ranks > 0 ? local_ranks : 1));
#else
    (void)local_ranks;
#endif
    if (desc->trace_path) r = dt__launch_trace_start(c, desc, &lanes);
    dt__tls_trace = lanes;
    if (r == DT_OK) r = fn(c, arg);
    dt__tls_trace = NULL;
    if (r != DT_OK) {   /* logged by the backend's launcher, once for every rank that failed the same way */
        dt__rank_msg(m, sizeof m, c->rank, r, dt_last_error());
        dt_comm_leave(c, r, dt__cause(m, r));
    }
    if (lanes && (rt = dt__launch_trace_finish(c, desc->trace_path, lanes, r != DT_OK)) != DT_OK)
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    if (r != DT_OK) dt_set_error(r, "%s", dt__cause(m, r));   /* the rank's failure, not the trace's */
    dt__trace_lanes_free(lanes, 1);
    dt__tls_rank = -1;
    return r != DT_OK ? r : rt;
}

#ifdef DT_USE_MPI
dt_result dt_launch_mpi(const dt_launch_desc *desc, dt_rank_fn fn, void *arg);   /* in dtrain_mpi.h */
#endif

dt_result dt_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg) {
    int np = dt__mpiexec_size();
    dt_launch_desc d;
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
#ifdef DT_USE_MPI
    if (np > 0) return dt_launch_mpi(&d, fn, arg);
#else
    if (np > 1) {
        dt_result r = dt_set_error(DT_ERR_UNSUPPORTED, "this program was started by mpiexec with %d processes but built without MPI: "
                                   "rebuild it with MPI (make MPI=1: mpicc -DDT_USE_MPI), or run it alone with --ranks %d", np, np);
        dt_log(DT_LOG_ERROR, "%s", dt_last_error() + strlen("DT_ERR_UNSUPPORTED: "));
        return r;
    }
#endif
    return dt__launch_local(&d, fn, arg, NULL, 1);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
