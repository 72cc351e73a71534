/* dtrain/train/train.h - the trainers: local SGD, Hogwild, DDP, D-PSGD and FedAvg; evaluation and checkpoints.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     Evaluation; checkpoints of every rank in one file (magic, version, checksum, atomic writes by rank 0,
     a save and load for each trainer); and thin objects over the flat
     buffers that keep each algorithm visible: local SGD (average every K steps), Hogwild (lock-free
     updates of one shared buffer), DDP (the gradient buffer averaged by a parameter server,
     point-to-point, per layer, flat, or in buckets overlapped with backward; accumulation, uneven data,
     synchronised batch norm; the gradient sent as bf16, fp16, top-k pairs or PowerSGD factors with error
     feedback), D-PSGD (gossip with the mixing matrix, CTA or ATC order, consensus) and
     FedAvg (server and clients, sample-weighted aggregation, robust aggregators, attacks, dropouts).
   USES
     dtrain/core/optim.h, dtrain/core/data.h, dtrain/comm/topology.h and dtrain/comm/launch.h (the
     communicator's modules), and what they include: every module before it.
   READ FIRST
     dt_ddp_backward with dt__ddp_hook (buckets launched as backward finishes them), dt__dpsgd_gossip,
     dt_fed_round with dt_fed_aggregate, dt_localsgd_step.
*/
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H
#include "../core/optim.h"
#include "../core/data.h"
#include "../comm/topology.h"
#include "../comm/launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loss and accuracy of a classifier over samples idx[0..count) of ds (idx NULL = all), in eval mode
   (the mode is restored after). The loss is NLL when the model ends in dt_log_softmax, cross-entropy
   otherwise. topk (e.g. 5) also counts samples whose label is among the k highest scores. */
typedef struct dt_eval_result {
    double  loss;            /* mean over the samples */
    double  top1, topk;      /* fractions in [0, 1] */
    int64_t count;
    int     k;
} dt_eval_result;
dt_result dt_evaluate(dt_model *m, const dt_dataset *ds, const int64_t *idx, int64_t count, const dt_transform *t,
                      int64_t batch, int topk, dt_eval_result *out);

/* Checkpoints: parameters, buffers, the model's dropout RNG (seed, stream, step), optimizer state, step
   counts and learning rate, and the caller's progress (dt_checkpoint_meta) - of every rank, in one file.
   The file has a magic number, a version, the world size, the writer (dt_checkpoint_save, or which
   trainer's save), one section per rank with a signature of the model's parameter names and shapes, and a
   checksum. Rank 0 alone writes it: "<path>.tmp", flushed to disk, renamed over path, the directory synced;
   the call returns on every rank only after that, with rank 0's result, so every rank agrees which
   checkpoint is the last complete one and a crash at any moment leaves the previous one whole. Loading
   checks everything before it changes anything: a file that is not a checkpoint, of another version,
   truncated or damaged (the checksum), of another world size, writer or model, or with an optimizer state
   that does not fit is refused with a message naming the file and the cause, on every rank, and no rank's
   model or optimizer changes. A model holding NaN or infinity (a diverged run) is never saved: every rank
   gets DT_ERR_NUMERIC and the checkpoint already at path stays; a file holding such values, or negative
   counters, is refused on load. Rank 0 stages the whole file in memory (one section per rank). */
#define DT_CHECKPOINT_VALUES 8
typedef struct dt_checkpoint_meta {
    int64_t epoch, step, round;   /* the caller's counters: e.g. epochs completed */
    int64_t batch;                /* batches of the current epoch done: where dt_loader_seek resumes */
    dt_rng  rng;                  /* any RNG the caller wants restored */
    double  values[DT_CHECKPOINT_VALUES];  /* any numbers the caller wants restored, e.g. running loss sums */
} dt_checkpoint_meta;
/* One process (the single-process loop): a checkpoint of one rank. o may be NULL (no optimizer state saved);
   meta may be NULL (zeros). */
dt_result dt_checkpoint_save(const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta);
/* o NULL skips the optimizer state in the file; meta NULL skips the counters. */
dt_result dt_checkpoint_load(const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta);
/* Collective: the same for every rank of c (its model m, optimizer o, meta), e.g. a loop of your own over the
   communicator; on one rank the file is dt_checkpoint_save's. Each rank gets its own section back. */
dt_result dt_checkpoint_save_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta);
dt_result dt_checkpoint_load_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta);
/* Each trainer saves and resumes through its own pair (dt_ddp_save, dt_localsgd_save, dt_dpsgd_save,
   dt_fed_save and their _load), declared with it below: the same file with the trainer's state added. */

/* ---- local SGD and Hogwild ---------------------------------------------------------------------- */

/* Local SGD (periodic model averaging, the synchronous parallel SGD workload): every rank trains its
   replica on its own shard with its own optimizer, and every `period` steps the PARAMETERS of all ranks
   are replaced by their mean (one all-reduce over the flat parameter buffer). Between averages nothing is
   communicated, so it sends period times less than DDP; with period 1 and plain SGD it is DDP's update up
   to float rounding. Optimizer state (momentum, Adam's moments) stays local and is never averaged. */
typedef struct dt_localsgd_desc {
    int     period;         /* average at every period-th dt_localsgd_step; 0 = only at dt_localsgd_average
                               (e.g. once per epoch) */
    dt_algo algo;           /* all-reduce algorithm (0 = the communicator's default) */
    int     sync_buffers;   /* 1: average the buffers (BatchNorm running statistics) with the parameters */
} dt_localsgd_desc;

typedef struct dt_localsgd dt_localsgd;

/* Steps counted, averages made, and the seconds spent in them on this rank. */
typedef struct dt_localsgd_stats {
    int64_t steps, averages;
    double  comm_seconds;
} dt_localsgd_stats;

/* Collective. Wraps model m (finalized, the same architecture on every rank) on communicator c: checks that
   every rank has the same parameter count and broadcasts rank 0's parameters and buffers, so every rank
   starts equal. c and m must outlive it. desc NULL: the defaults. Host buffers (the CPU backend). *out is NULL
   on failure. */
dt_result dt_localsgd_create(dt_localsgd **out, dt_comm *c, dt_model *m, const dt_localsgd_desc *desc);
void      dt_localsgd_destroy(dt_localsgd *d);                 /* NULL is allowed */
/* Call after each optimizer step. Collective on the calls that average (every period-th since the last
   average), so every rank must make the same number of calls between averages. */
dt_result dt_localsgd_step(dt_localsgd *d);
/* Collective: averages the parameters (and buffers, with sync_buffers) now, e.g. at the end of an epoch,
   and restarts the count of steps. */
dt_result dt_localsgd_average(dt_localsgd *d);
dt_localsgd_stats dt_localsgd_get_stats(const dt_localsgd *d);   /* zeros for NULL */
/* Collective checkpoint of every rank's model, optimizer o (may be NULL) and meta, and the steps since the
   last average, so a resumed run averages at the same steps (see dt_checkpoint_save_comm). */
dt_result dt_localsgd_save(dt_localsgd *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta);
dt_result dt_localsgd_load(dt_localsgd *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta);

/* Hogwild (Niu, Recht, Re and Wright, NIPS 2011): several threads of one process update ONE shared parameter
   buffer with plain SGD, without any lock, each on its own data. The races are intended: a worker may read
   parameters that another worker is halfway through updating, and two updates of the same element may lose
   one of them. The paper's analysis assumes sparse separable costs, atomic single-coordinate writes and a
   bounded delay; the plain `p[i] -= lr * g[i]` here is not atomic, a network's gradient is dense, and with
   more threads than cores the delay is unbounded, so here it is an experiment that removes all waiting, not
   the paper's guarantee. (So ThreadSanitizer
   reports dt_hogwild_pull and dt_hogwild_push, and the tests keep Hogwild out of its runs.)
   Each worker owns a replica: a dt_model of the same architecture for its activations and gradients. A
   step is: dt_hogwild_pull (shared parameters and buffers -> replica), forward, loss, backward on the
   replica, dt_hogwild_push (shared -= lr * gradient; the replica's buffers, the BatchNorm statistics its
   forward updated, published to the shared model). */
typedef struct dt_hogwild_worker {
    int       index, threads;   /* this worker, of `threads` */
    dt_model *shared;           /* the model whose parameters every worker updates */
} dt_hogwild_worker;
typedef dt_result (*dt_hogwild_fn)(dt_hogwild_worker *w, void *arg);

/* Runs fn on `threads` threads (each with its dt_hogwild_worker) and waits for all of them; each gets
   cores / threads OpenMP threads. threads = 1 runs fn on the caller's thread; without thread support the
   workers run one after another. Returns DT_OK, or the lowest failed worker's result with its message. */
dt_result dt_hogwild_run(dt_model *shared, int threads, dt_hogwild_fn fn, void *arg);
/* Copies the shared model's parameters and buffers into the replica's (no lock: see above). Same parameter
   and buffer counts. */
dt_result dt_hogwild_pull(dt_model *shared, dt_model *replica);
/* shared -= lr * the replica's gradient, element by element and without a lock, then zeroes the
   replica's gradient; the shared buffers become the replica's (a later push overwrites them, as it may
   overwrite an update). With one worker this is exactly dt_optim_step with SGD (no momentum). */
dt_result dt_hogwild_push(dt_model *shared, dt_model *replica, float lr);

/* ---- DDP: data-parallel SGD over the flat gradient buffer ------------------------------------ */

/* How dt_ddp averages the gradients of the ranks. Each is a few lines over the flat buffer; they give the
   same average (up to float rounding) and differ in who sends what:
     BUCKETS       one all-reduce per bucket of about bucket_bytes of consecutive tensors, taken from the
                   end of the buffer (backward finishes the last layers first); with dt_ddp_backward a
                   helper thread reduces each bucket as soon as backward has finished its layers, so
                   communication overlaps the rest of the backward pass (the default; on local ranks, and
                   under MPI initialised MPI_THREAD_SERIALIZED or above, as dt_launch does)
     FLAT          one all-reduce over the whole gradient buffer, after backward
     PER_LAYER     one all-reduce per parameter tensor, last tensor first
     PARAM_SERVER  dt_comm_gather of every gradient to rank 0, which sums them in rank order, then
                   dt_comm_broadcast (naive: rank 0 sends to each) of the result
     P2P           the same by hand: each rank isends its gradient to rank 0 and receives the sum back;
                   rank 0 irecvs from everyone, sums, isends to everyone (on a tag of the library's own)
   The all-reduce methods use desc.algo (naive, ring, tree, native; 0 = the communicator's default).
   Each sync is that and nothing more: the ranks' sample counts travel as two floats after the first
   bucket (or tensor, or buffer), not in an all-reduce of their own. */
typedef enum dt_ddp_method {
    DT_DDP_BUCKETS = 0, DT_DDP_FLAT, DT_DDP_PER_LAYER, DT_DDP_PARAM_SERVER, DT_DDP_P2P, DT_DDP_METHOD_COUNT
} dt_ddp_method;
const char *dt_ddp_method_name(dt_ddp_method k);             /* "buckets", "flat", "per-layer", "ps", "p2p" */
dt_result   dt_ddp_method_parse(const char *s, dt_ddp_method *out);

/* What the all-reduce methods (BUCKETS, FLAT, PER_LAYER) put on the wire for each slice of the weighted
   gradient (the slice this rank sums with the others'). Each compresses one slice at a time, so buckets
   still overlap backward. With one rank nothing is sent and nothing is compressed.
     FP32  the floats (the default)
     BF16  each float rounded to bfloat16 (nearest, ties to even) by this rank, summed by the all-reduce
           over DT_BF16: every addition decodes to float, adds in float and rounds the partial sum to
           bfloat16 before it travels on (the ring's reduce-scatter: p - 1 roundings); decoded at the end.
           The two sample counts, which 16 bits would not count exactly, go first in an all-reduce of two
           floats of their own (in the sync's first collective)
     FP16  the same with IEEE half (5 exponent bits: a weighted gradient above 65504 becomes infinity)
     TOPK  top-k sparsification with error feedback (Stich et al. 2018): this rank adds its residual (what
           it has not sent yet) to the slice, keeps the k = ceil(topk_ratio x slice) entries of largest
           magnitude (dt_topk_split; ties to the lower index), sends them as (index, value) pairs in an
           all-gather (with the two counts after them), and keeps the rest as the next sync's residual;
           every rank then sums everyone's pairs into a zeroed slice in rank order, so all get the same
           bits. no_feedback drops the rest instead (plain top-k, to compare).
     POWERSGD  rank-r PowerSGD with error feedback (Vogels et al. 2019) for each matrix-shaped tensor of the
           slice (a weight [out, in], a conv weight as [out, in k k]; where (rows + cols) r < rows cols):
           M = slice + residual; P = M Q summed over the ranks (one all-reduce of floats, with the slice's
           vectors, sent as they are, and the counts), orthonormalized; Q = M^T P summed (a second
           all-reduce); the slice becomes P Q^T and the residual M - P Q^T / p. Q starts from the seeded
           same values on every rank and is kept from step to step (one power iteration per step).
   The communicator's counters count what travels: 2 bytes an element for BF16 and FP16, (4 + 4) bytes a
   pair for TOPK, 4 (rows + cols) r bytes a matrix for POWERSGD, and the local backend's link model charges
   those sizes. */
typedef enum dt_ddp_compress {
    DT_DDP_FP32 = 0, DT_DDP_BF16, DT_DDP_FP16, DT_DDP_TOPK, DT_DDP_POWERSGD, DT_DDP_COMPRESS_COUNT
} dt_ddp_compress;
const char *dt_ddp_compress_name(dt_ddp_compress k);         /* "fp32", "bf16", "fp16", "topk", "powersgd" */
/* Parses "fp32", "bf16", "fp16", "topk", "topk:RATIO" (RATIO in (0, 1], e.g. 0.01), "powersgd" or
   "powersgd:R" (R a whole number from 1 to 1024); *param (may be NULL) gets RATIO or R, or 0 (the default) when none
   is given. */
dt_result   dt_ddp_compress_parse(const char *s, dt_ddp_compress *out, double *param);
#define DT_DDP_TOPK_RATIO 0.01   /* TOPK's default fraction: 1% of each slice */
#define DT_DDP_POWERSGD_RANK 2   /* POWERSGD's default rank */
/* Top-k of x [n] by magnitude: the k entries of largest |x[i]| (equal magnitudes: the lower index first)
   go to idx [k] (ascending) and val [k], and become 0 in x, which is left holding the rest exactly (x in =
   x out + the pairs scattered). k is clipped to 0..n; returns it. O(n): a radix select on the magnitudes'
   bits, then one pass. */
int64_t dt_topk_split(float *x, int64_t n, int64_t k, int32_t *idx, float *val);

/* Default bucket size: SimpleCNN's gradient in 2 buckets, ResNet-20's in 4, so backward has something to
   overlap; docs/performance.md ("DDP bucket size", make bench-buckets) has the measurements from 16 KiB to 4 MiB. */
#define DT_DDP_BUCKET_BYTES (256 * 1024)

/* DDP settings; zero means the default. */
typedef struct dt_ddp_desc {
    dt_ddp_method method;       /* default BUCKETS */
    dt_algo       algo;         /* all-reduce algorithm of BUCKETS, FLAT, PER_LAYER (0 = communicator's default) */
    int64_t       bucket_bytes; /* BUCKETS: bytes of gradient per bucket (0 = DT_DDP_BUCKET_BYTES); a tensor is
                                   never split, so a bucket holds at least one tensor */
    int           no_overlap;   /* 1: BUCKETS reduce after backward, on the caller's thread */
    int           sync_buffers; /* 1: average the buffers (BatchNorm running statistics) at every gradient
                                   sync; 0: only when the caller calls dt_ddp_sync_buffers (e.g. each epoch) */
    dt_ddp_compress compress;   /* what travels (BUCKETS, FLAT, PER_LAYER; default FP32): see above */
    double        topk_ratio;   /* TOPK: fraction of each slice sent, in (0, 1]; 0 = DT_DDP_TOPK_RATIO */
    int           no_feedback;  /* TOPK, POWERSGD: 1 drops what is not sent instead of keeping it as a residual */
    int           powersgd_rank; /* POWERSGD: rank r of the approximation, 1 to 1024; 0 = DT_DDP_POWERSGD_RANK */
} dt_ddp_desc;

typedef struct dt_ddp dt_ddp;

/* What a rank's dt_ddp has done: gradient syncs, rounds it took part in after joining, and the seconds the
   caller's thread spent blocked in communication (with overlap: only the part backward did not hide). */
typedef struct dt_ddp_stats {
    int64_t syncs, joined_rounds;
    int64_t early_buckets;   /* buckets whose sum began while backward still ran (overlap at work) */
    double  comm_seconds;
} dt_ddp_stats;

/* Collective. Wraps model m (finalized, the same architecture on every rank) for data-parallel training
   on communicator c: broadcasts rank 0's parameters and buffers so every rank starts equal, and plans the
   buckets. Both c and m must outlive the dt_ddp. desc NULL: the defaults. Host buffers (the CPU backend). *out
   is NULL on failure. */
dt_result dt_ddp_create(dt_ddp **out, dt_comm *c, dt_model *m, const dt_ddp_desc *desc);
/* Stops the helper thread, removes the backward hook, frees what dt_ddp_create allocated. NULL is allowed. */
void      dt_ddp_destroy(dt_ddp *d);
/* Backward pass of a micro-batch of `samples` samples (its loss a mean over them), like dt_model_backward
   (dy as there). With sync = 0 nothing is communicated: the gradient accumulates, weighted by samples.
   With sync = 1 (collective) the accumulated gradients of all ranks are averaged, each sample weighing the
   same: afterwards every rank's dt_model_grads holds the gradient of the mean loss over all the samples
   of all ranks since the last sync (fewer than 2^24 samples per sync: the count travels as a float; more
   is DT_ERR_INVALID_ARG). Then step the optimizer and zero the gradients. */
dt_result dt_ddp_backward(dt_ddp *d, const float *dy, int64_t samples, int sync);
/* Collective: the same averaging for a gradient computed by plain dt_model_backward calls, which the
   caller states is the mean over `samples` samples. Never overlapped. */
dt_result dt_ddp_sync(dt_ddp *d, int64_t samples);
/* Collective: call when this rank has no more batches (e.g. at the end of every epoch, on every rank).
   Until every rank has joined, it takes part in the others' gradient syncs with a zero gradient and zero
   weight and steps o (may be NULL) with the average, so its replica stays equal to theirs. Ranks with
   unequal numbers of batches thus finish the epoch without hanging. The ranks learn that all have joined
   from the first collective of a sync, so the last round costs that one (a bucket, or FLAT's buffer). */
dt_result dt_ddp_join(dt_ddp *d, dt_optim *o);
/* Collective: averages the model's buffers (BatchNorm running mean and variance) over the ranks. */
dt_result dt_ddp_sync_buffers(dt_ddp *d);
/* Collective: broadcasts rank 0's parameters and buffers (what dt_ddp_create does). */
dt_result dt_ddp_broadcast_params(dt_ddp *d);
dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d);       /* zeros for NULL */
int          dt_ddp_buckets(const dt_ddp *d);         /* buckets planned (BUCKETS), else 0 */
int          dt_ddp_overlapped(const dt_ddp *d);      /* 1 when buckets are reduced during backward */
/* Bytes of gradient in bucket i (0 = the first reduced: the end of the buffer) of a BUCKETS dt_ddp; buckets
   hold whole tensors, so one may be far above desc.bucket_bytes. 0 when i is not a bucket. */
int64_t      dt_ddp_bucket_bytes(const dt_ddp *d, int i);
/* TOPK or POWERSGD with error feedback: this rank's residual [*n] (what it has not sent yet, in the units
   of its weighted gradient: the mean's gradient times the micro-batch's samples), else NULL and *n = 0. */
const float *dt_ddp_residual(const dt_ddp *d, int64_t *n);
/* Collective checkpoint of every rank's model, optimizer o (may be NULL) and meta, and with TOPK or POWERSGD
   its residual and PowerSGD's Qs (so a resumed run sends what the uninterrupted one would): the replicas are equal,
   but each rank's dropout RNG and data position are its own. Save after a step that synchronised (a
   checkpoint holds no gradients: accumulated ones are refused). Loading also starts a fresh accumulation. */
dt_result dt_ddp_save(dt_ddp *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta);
dt_result dt_ddp_load(dt_ddp *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta);

/* ---- D-PSGD ---------------------------------------------------------------------------------- */

/* Decentralised parallel SGD (Lian et al. 2017): no all-reduce; each rank keeps its own replica x_i and,
   every step, averages it with its neighbours' through the mixing matrix W of a dt_topology. In which
   order the local update and the averaging happen:
     COMBINE_THEN_ADAPT  the original D-PSGD: x_i <- sum_j W[i][j] x_j - lr g_i, where g_i is the gradient
                         at the replica before averaging (the default)
     ADAPT_THEN_COMBINE  step first, then average: x_i <- sum_j W[i][j] (x_j - lr g_j) */
typedef enum dt_dpsgd_order {
    DT_DPSGD_COMBINE_THEN_ADAPT = 0, DT_DPSGD_ADAPT_THEN_COMBINE, DT_DPSGD_ORDER_COUNT
} dt_dpsgd_order;
const char *dt_dpsgd_order_name(dt_dpsgd_order k);          /* "cta", "atc" */
dt_result   dt_dpsgd_order_parse(const char *s, dt_dpsgd_order *out);

/* A time-varying topology: the graph step t gossips over (t = 0, 1, ... counts dt_dpsgd_step calls and is
   restored by dt_dpsgd_load). It must give every rank the same graph for the same t, every time it is
   asked, and the graph must live until the step is done. dt_topology_schedule_at (user: a
   dt_topology_schedule, e.g. dt_topology_one_peer_exp's) cycles through a list. */
typedef const dt_topology *(*dt_dpsgd_schedule_fn)(int64_t step, void *user);

/* D-PSGD settings; zero means the default. */
typedef struct dt_dpsgd_desc {
    dt_dpsgd_order order;       /* default COMBINE_THEN_ADAPT */
    int            mix_buffers; /* 1: also gossip the buffers (BatchNorm running statistics) every step */
    dt_dpsgd_schedule_fn schedule;   /* NULL: every step over dt_dpsgd_create's topology. Otherwise step t
                                        mixes with schedule(t, schedule_user), and the topology given to
                                        dt_dpsgd_create must be NULL */
    void          *schedule_user;
    int            period;      /* with schedule (>= 1): dt_dpsgd_create checks that the union of the graphs
                                   of steps 0 .. period-1 is connected (a single graph need not be) */
} dt_dpsgd_desc;

typedef struct dt_dpsgd dt_dpsgd;

/* What a rank's dt_dpsgd has done: steps (gossip rounds), the payload bytes this rank sent in them (from
   dt_comm_get_stats; the all-reduces of dt_dpsgd_consensus and dt_dpsgd_average are not counted), and the
   seconds spent in the neighbour exchange. */
typedef struct dt_dpsgd_stats {
    int64_t  steps;
    uint64_t bytes_sent;
    double   comm_seconds;
} dt_dpsgd_stats;

/* Collective. Wraps model m (finalized, the same architecture on every rank) for D-PSGD on communicator c
   over topology t, which must have c's world size; broadcasts rank 0's parameters and buffers so the
   replicas start equal. c, m and t must outlive the dt_dpsgd. desc NULL: the defaults. Host buffers. *out is
   NULL on failure. With desc->schedule, t is NULL and the graphs change every step: each step's W must pass
   dt_topology_check (symmetric, doubly stochastic, on c's world) and the union over desc->period steps
   dt_topology_check_union (connected); create checks steps 0 .. period-1, each step its own graph. */
dt_result dt_dpsgd_create(dt_dpsgd **out, dt_comm *c, dt_model *m, const dt_topology *t, const dt_dpsgd_desc *desc);
/* Frees what dt_dpsgd_create allocated. NULL is allowed. */
void      dt_dpsgd_destroy(dt_dpsgd *d);
/* Collective: one D-PSGD step, after dt_model_backward, in place of dt_optim_step (then zero the gradients).
   Every rank sends its replica to its neighbours in the step's graph (dt_comm_neighbor_exchange; a bad
   graph from the schedule is refused, on every rank, before anything is sent) and mixes what it receives,
   summing W[i][j] x_j over j = 0, 1, ... (itself in its place) in double, so the result is the same on
   every backend. COMBINE_THEN_ADAPT: the replica x_i is sent, o steps x_i to x_i' with the gradient at
   x_i, and x_i becomes sum_j W[i][j] x_j + (x_i' - x_i): the update o computed before averaging (weight
   decay and momentum included) is added to the average. ADAPT_THEN_COMBINE: o steps first, then the
   stepped replicas are mixed. o NULL: a pure gossip step x_i <- sum_j W[i][j] x_j. */
dt_result dt_dpsgd_step(dt_dpsgd *d, dt_optim *o);
/* Collective: *dist = mean over ranks of ||x_i - x_avg|| (2-norm over all parameters), on every rank. */
dt_result dt_dpsgd_consensus(dt_dpsgd *d, double *dist);
/* Collective: out [dt_model_param_count] receives the mean of all replicas' parameters. out NULL: every
   rank's model itself is set to the mean parameters and mean buffers (for the final evaluation). */
dt_result dt_dpsgd_average(dt_dpsgd *d, float *out);
/* Evaluating the averaged model in the middle of training: use = 1 (collective) keeps this rank's replica
   aside and loads the mean parameters and buffers into the model; use = 0 (local) puts the replica back. */
dt_result dt_dpsgd_use_average(dt_dpsgd *d, int use);
dt_dpsgd_stats dt_dpsgd_get_stats(const dt_dpsgd *d);    /* zeros for NULL */
/* Collective checkpoint of every rank's replica (they differ), optimizer o (may be NULL), meta and the step
   count, so a schedule resumes at the graph it stopped at. Not while the model holds the average
   (dt_dpsgd_use_average). */
dt_result dt_dpsgd_save(dt_dpsgd *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta);
dt_result dt_dpsgd_load(dt_dpsgd *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta);

/* ---- FedAvg ---------------------------------------------------------------------------------- */

/* Federated averaging (McMahan et al. 2017) with robust aggregation. The server's aggregation is a pure
   function over flat float vectors (one update per client), so it is testable without ranks:
     MEAN       sum_i w_i u_i / sum_i w_i, the weights being the clients' sample counts (FedAvg)
     MEDIAN     coordinate-wise median (the mean of the two middle values when n is even)
     TRIMMED    coordinate-wise trimmed mean: t = floor(trim * n) smallest and t largest values dropped;
                refused when 2 t >= n
     KRUM       the update whose summed squared distance to its n - f - 2 nearest others is smallest
                (Blanchard et al. 2017); refused when n < 2 f + 3, Krum's minimum-client condition
     MULTIKRUM  the plain mean of the m updates of lowest Krum score (m = n - f by default); same condition
     CLASSMEAN  the class-mean check: the rows of the final linear layer's weight update, one per class, are
                compared across clients. For class c, d_c(i) = ||row_c(u_i) - coordinate median over clients
                of row_c|| and s_c = median over i of d_c(i); client i is an outlier when d_c(i) > k s_c for
                some class c. The others are averaged as MEAN. A label-flipping client moves the rows of the
                classes it flips, which honest clients leave alike. Needs n >= 3.
   Ties are broken by the lower client index, so the result is deterministic. */
typedef enum dt_fed_agg {
    DT_FED_MEAN = 0, DT_FED_MEDIAN, DT_FED_TRIMMED, DT_FED_KRUM, DT_FED_MULTIKRUM, DT_FED_CLASSMEAN, DT_FED_AGG_COUNT
} dt_fed_agg;
const char *dt_fed_agg_name(dt_fed_agg k);   /* "mean", "median", "trimmed", "krum", "multikrum", "classmean" */
dt_result   dt_fed_agg_parse(const char *s, dt_fed_agg *out);

/* Aggregator settings; zero means the default, except for f, where 0 is a request (DT_DEFAULT in base.h). */
typedef struct dt_fed_agg_desc {
    float   trim;              /* TRIMMED: fraction cut at each end (default 0.1) */
    int     f;                 /* KRUM, MULTIKRUM: Byzantine clients tolerated, >= 0 (0: none); DT_DEFAULT: 1 */
    int     m;                 /* MULTIKRUM: updates averaged (0 = n - f) */
    float   k;                 /* CLASSMEAN: outlier threshold in median distances (default 3) */
    int64_t cm_offset;         /* CLASSMEAN: the final linear weight [cm_rows classes, cm_cols] inside each */
    int64_t cm_rows, cm_cols;  /*   update (dt_fed fills these from the model) */
} dt_fed_agg_desc;

/* Aggregates n updates, each updates[i][0..len), into out[len] (out may not alias an update); kept [n] (may
   be NULL) receives 1 for each client whose update entered the result, 0 for the others (all 1 for MEAN,
   MEDIAN and TRIMMED). weights [n] (sample counts, > 0) are used by MEAN and CLASSMEAN; NULL means equal
   weights. Allocates scratch of n * (n + len) doubles at most (Krum's distances, a column for the median).
   desc may be NULL. */
dt_result dt_fed_aggregate(dt_fed_agg kind, const float *const *updates, const double *weights, int n, int64_t len,
                           float *out, int *kept, const dt_fed_agg_desc *desc);

/* What a client does with its round, for studying attacks. */
typedef enum dt_fed_behaviour {
    DT_FED_HONEST = 0,
    DT_FED_LABELFLIP,          /* trains on labels mapped through desc.flip (e.g. 1 -> 4, or a permutation) */
    DT_FED_SIGNFLIP,           /* sends the negated update */
    DT_FED_NOISE               /* sends Gaussian noise of std desc.noise_std instead of its update */
} dt_fed_behaviour;

#define DT_FED_MAX_CLASSES 256

/* FedAvg settings; zero means the default, except for noise_std, agg_desc.f and optim.lr, where 0 is a request
   and DT_DEFAULT asks for the default. */
typedef struct dt_fed_desc {
    int                clients;          /* N simulated clients (default: ranks - 1, or 1 on one rank) */
    float              frac;             /* C: fraction of the clients sampled each round (default 1; at least 1) */
    int                local_epochs;     /* E (default 1) */
    int64_t            batch;            /* B (default 10) */
    dt_optim_desc      optim;            /* each client's optimizer, fresh every round (SGD or Adam); optim.lr
                                            0 is 0, DT_DEFAULT the optimizer's default */
    dt_sched_desc      sched;            /* learning rate of round t = dt_sched_lr(&sched, t) when any field of
                                            sched is set (e.g. cosine with t_max = rounds); zeroed: optim.lr */
    float              prox_mu;          /* FedProx: mu (w - w_global) added to every local gradient (0 = off) */
    float              dropout_prob;     /* probability that a sampled client drops out of a round */
    dt_fed_agg         agg;
    dt_fed_agg_desc    agg_desc;         /* cm_* from the model when zero */
    const dt_dataset  *data;             /* borrowed training set */
    const dt_partition *part;            /* borrowed: part k is client k's samples (parts == clients) */
    const dt_transform *transform;       /* copied; NULL = pixel / 255 */
    const int         *behaviour;        /* [clients] dt_fed_behaviour, copied; NULL = every client honest */
    int32_t            flip[DT_FED_MAX_CLASSES]; /* LABELFLIP: label y becomes flip[y]; all zeros = identity */
    int                flip_set;         /* 1: flip holds a map (else the identity) */
    float              noise_std;        /* NOISE: the noise's std, >= 0 (0: a zero update); DT_DEFAULT: 1 */
    uint64_t           seed;             /* client sampling, dropouts, loader shuffles, noise */
} dt_fed_desc;

typedef struct dt_fed dt_fed;

/* What one round did (complete on rank 0; the draw is known everywhere). */
typedef struct dt_fed_round_info {
    int     selected, dropped, kept;     /* clients sampled, dropped out, and in the aggregate */
    double  train_loss;                  /* mean local training loss over the samples of the clients that reported */
    int64_t samples;                     /* samples the reporting clients trained on, per local epoch */
    float   lr;                          /* the clients' learning rate this round */
} dt_fed_round_info;

/* Collective. Rank 0 is the server; client k trains on rank 1 + k mod (ranks - 1), or on rank 0 when there
   is one rank. m (finalized, the same architecture on every rank) is the server's global model on rank 0 and
   a rank's working copy elsewhere; rank 0's parameters and buffers are the initial global model. c, m, the
   dataset and the partition must outlive the dt_fed. desc NULL is refused as a zeroed desc is (data and part
   have no default). *out is NULL on failure. */
dt_result dt_fed_create(dt_fed **out, dt_comm *c, dt_model *m, const dt_fed_desc *desc);
void      dt_fed_destroy(dt_fed *f);
/* Collective: one round. Every rank draws the same clients (seeded by (seed, round)) and the same dropouts,
   so nobody waits for a client that dropped; the global model is broadcast from rank 0; each host trains its
   sampled clients in client order, E epochs of batch B from the global model (client k's loader shuffles with
   stream k and epoch round * E + e), and sends delta = local - global and its sample count to rank 0, which
   aggregates and adds the result to the global model. The model is its parameters and its buffers (BatchNorm
   statistics): they travel, train and aggregate together, the aggregator's choice of clients made on the
   parameters. Rank 0's model holds the new global model after.
   When dropouts leave fewer reports than the aggregator needs, the round keeps the global model (a warning);
   dt_fed_create refuses a C that samples too few clients for it in the first place. */
dt_result dt_fed_round(dt_fed *f, int64_t round, dt_fed_round_info *info);
/* The clients sampled in a round (sorted) and whether each drops out: a pure function of (desc, round).
   sel and dropped [clients]; returns the count sampled. */
int       dt_fed_draw(const dt_fed *f, int64_t round, int *sel, int *dropped);
/* Rank 0: which clients of the last round entered the aggregate, kept [clients] (1/0); others get zeros. */
void      dt_fed_last_kept(const dt_fed *f, int *kept);
/* Collective checkpoint between rounds: rank 0's global model, every rank's working model (its buffers and
   dropout RNG carry over from round to round) and meta (put the next round in meta.round). Nothing else
   persists: the draw of each round is a function of (seed, round), and the clients' optimizers and loaders
   are made afresh every round (FedProx's reference is the round's global model). */
dt_result dt_fed_save(dt_fed *f, const char *path, const dt_checkpoint_meta *meta);
dt_result dt_fed_load(dt_fed *f, const char *path, dt_checkpoint_meta *meta);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TRAIN_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_TRAIN_IMPLEMENTATION_DONE)
#define DTRAIN_TRAIN_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif

dt_result dt_evaluate(dt_model *m, const dt_dataset *ds, const int64_t *idx, int64_t count, const dt_transform *t,
                      int64_t batch, int topk, dt_eval_result *out) {
    dt_result r = DT_OK;
    int64_t start, k, in_size, i, j, top1 = 0, topk_hits = 0;
    int was_training;
    double loss_sum = 0.0;
    float *x = NULL, *scores = NULL;
    int32_t *y = NULL;
    int64_t *ids = NULL;
    if ((r = dt__need_final(m, "dt_evaluate")) != DT_OK) return r;
    if (!ds || !out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: dataset or result is NULL");
    memset(out, 0, sizeof *out);
    if (!idx) count = ds->count;
    if (count <= 0 || batch <= 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: count %lld and batch %lld must be > 0", (long long)count, (long long)batch);
    in_size = m->nodes[0].size;
    k = m->nodes[m->nnodes - 1].size;
    if (ds->c * ds->h * ds->w != in_size)
        return dt_set_error(DT_ERR_SHAPE, "dt_evaluate: samples of %s are %lldx%lldx%lld but the model takes %lld values",
                            ds->source[0] ? ds->source : "the dataset", (long long)ds->c, (long long)ds->h,
                            (long long)ds->w, (long long)in_size);
    if (topk < 1) topk = 1;
    if (topk > k) topk = (int)k;
    if (batch > count) batch = count;
    x = (float *)DT_MALLOC(sizeof(float) * (size_t)(batch * in_size));
    scores = (float *)DT_MALLOC(sizeof(float) * (size_t)(batch * k));
    y = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)batch);
    ids = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)batch);
    if (!x || !scores || !y || !ids) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_evaluate: no memory for a batch of %lld", (long long)batch);
        goto done;
    }
    was_training = m->training;
    m->training = 0;
    dt_trace_begin("evaluate", "compute");
    dt__trace_arg("samples", NULL, count);
    for (start = 0; start < count && r == DT_OK; start += batch) {
        int64_t n = count - start < batch ? count - start : batch;
        float loss = 0.0f;
        for (i = 0; i < n; i++) ids[i] = idx ? idx[start + i] : start + i;
        if ((r = dt_dataset_batch(ds, ids, n, t, 0, 0, x, y)) != DT_OK) break;
        if ((r = dt_model_forward(m, x, n)) != DT_OK) break;
        r = dt_model_loss_labels(m, y, &loss);
        if (r != DT_OK && r != DT_ERR_NUMERIC) break;
        r = DT_OK;                                /* a NaN loss is reported as such in the result */
        loss_sum += (double)loss * (double)n;
        m->ops->download(m->ctx, scores, m->nodes[m->nnodes - 1].out, (int64_t)sizeof(float) * n * k);
        for (i = 0; i < n; i++) {
            const float *row = scores + i * k;
            int64_t above = 0;                    /* classes scoring strictly higher than the label, or equal and earlier */
            for (j = 0; j < k; j++)
                above += row[j] > row[y[i]] || (row[j] == row[y[i]] && j < y[i]) || row[j] != row[j];   /* NaN: wrong */
            top1 += above == 0;
            topk_hits += above < topk;
        }
    }
    dt_trace_end();
    m->training = was_training;
    if (r == DT_OK) {
        out->count = count;
        out->loss = loss_sum / (double)count;
        out->top1 = (double)top1 / (double)count;
        out->topk = (double)topk_hits / (double)count;
        out->k = topk;
    }
done:
    DT_FREE(x); DT_FREE(scores); DT_FREE(y); DT_FREE(ids);
    return r;
}

/* ---- checkpoints ----
   Version 2. One file holds every rank's state, written by rank 0 alone, so that its atomicity is one
   rename: a crash before the rename leaves the previous checkpoint whole, and no file ever mixes ranks of
   two checkpoints. The file: the magic, then little-endian 64-bit words: the version, the world size, the
   trainer (DT__CKPT_PLAIN, ...), each rank's section size in bytes [world]; then the sections in rank
   order; then the FNV-1a checksum of everything before it. A section: DT__CKPT_SEC_WORDS words (see
   dt__ckpt_words), then the parameters, buffers and optimizer state (float32) and the per-tensor step
   counts (int64). Everything is staged in memory: rank 0 holds the whole file while it writes or reads. */

#define DT__CKPT_MAGIC "DTCKPT\r\n"
#define DT__CKPT_VERSION 2u
#define DT__CKPT_HEAD_WORDS 3          /* version, world, trainer; then the sizes */
#define DT__CKPT_SEC_WORDS (19 + DT_CHECKPOINT_VALUES)

/* Which call wrote a checkpoint: each trainer's resume reads only its own. */
enum { DT__CKPT_PLAIN = 0, DT__CKPT_DDP, DT__CKPT_LOCALSGD, DT__CKPT_DPSGD, DT__CKPT_FEDAVG, DT__CKPT_TRAINERS };
static const char *const dt__ckpt_writers[DT__CKPT_TRAINERS] = {
    "dt_checkpoint_save(_comm)", "dt_ddp_save", "dt_localsgd_save", "dt_dpsgd_save", "dt_fed_save"};

/* FNV-1a, 64-bit, over bytes: the checksum and the model signature */
static uint64_t dt__fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
    return h;
}
static uint64_t dt__model_signature(const dt_model *m) {
    uint64_t h = 0xcbf29ce484222325ULL;
    int i;
    for (i = 0; i < m->npinfo; i++) {
        h = dt__fnv(h, m->pinfo[i].name, strlen(m->pinfo[i].name));
        h = dt__fnv(h, m->pinfo[i].shape, sizeof m->pinfo[i].shape);
    }
    for (i = 0; i < m->nbinfo; i++) h = dt__fnv(h, m->binfo[i].name, strlen(m->binfo[i].name));
    return h;
}

static void dt__put_u64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t dt__get_u64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static int dt__little_endian(void) {
    const uint32_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Makes the data of f, and then the rename in its directory, durable. POSIX fsync where the platform has
   it; a directory that cannot be synced (some file systems refuse) is no error: the rename itself is. */
#if defined(__unix__) || defined(__APPLE__)
#if !defined(__cplusplus) && defined(__GLIBC__) && !defined(__USE_POSIX)
extern int fileno(FILE *stream);
#endif
#if !defined(__cplusplus) && defined(__GLIBC__) && !defined(__USE_POSIX199309) && !defined(__USE_MISC)
extern int fsync(int fd);
#endif
#include <unistd.h>
#include <fcntl.h>
static int dt__sync_file(FILE *f) { return fflush(f) == 0 && fsync(fileno(f)) == 0 ? 0 : -1; }
static void dt__sync_dir(const char *path) {
    char dir[1024];
    const char *slash = strrchr(path, '/');
    int fd;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if ((fd = open(dir, O_RDONLY)) < 0) return;
    (void)fsync(fd);
    close(fd);
}
#else
static int dt__sync_file(FILE *f) { return fflush(f) == 0 ? 0 : -1; }
static void dt__sync_dir(const char *path) { (void)path; }
#endif

/* One rank's part of a checkpoint call. */
typedef struct dt__ckpt {
    dt_comm   *c;          /* NULL: one process, no communicator */
    int        rank, world, trainer;
    const char *fn, *path;
    dt_model  *m;
    dt_optim  *o;
    int64_t    word;       /* the trainer's own state (local SGD: steps since the last average) */
    float     *extra;      /* [nextra] the trainer's own floats (DDP's residual and PowerSGD's Qs), host memory; or NULL */
    int64_t    nextra;
} dt__ckpt;

static int64_t dt__ckpt_state(const dt__ckpt *k) {
    int64_t n = 0;
    if (k->o) dt_optim_state(k->o, &n);
    return n;
}
static int64_t dt__ckpt_section_bytes(const dt__ckpt *k) {
    return 8 * DT__CKPT_SEC_WORDS + 4 * (k->m->nparams + k->m->nbuffers + dt__ckpt_state(k)) +
           8 * (int64_t)(k->o ? k->o->ntensors : 0) + 4 * k->nextra;
}

/* The words of a section: rank, model signature, parameters, buffer values, optimizer state values and
   tensors (0: no optimizer), optimizer kind and learning rate (its float's bits), the model's dropout RNG
   (seed, stream, step), the meta (epoch, step, round, batch, RNG state and increment, the values' bits),
   the trainer's word and its floats' count (0 in files written before there were any). */
static void dt__ckpt_words(const dt__ckpt *k, const dt_checkpoint_meta *meta, uint64_t *w) {
    dt_checkpoint_meta z;
    uint32_t lr = 0;
    float f = k->o ? k->o->d.lr : 0.0f;
    int i;
    memset(&z, 0, sizeof z);
    if (!meta) meta = &z;
    memcpy(&lr, &f, sizeof lr);
    w[0] = (uint64_t)k->rank; w[1] = dt__model_signature(k->m); w[2] = (uint64_t)k->m->nparams;
    w[3] = (uint64_t)k->m->nbuffers; w[4] = (uint64_t)dt__ckpt_state(k); w[5] = (uint64_t)(k->o ? k->o->ntensors : 0);
    w[6] = k->o ? (uint64_t)k->o->d.kind : 0; w[7] = lr;
    w[8] = k->m->seed; w[9] = k->m->stream; w[10] = k->m->step;
    w[11] = (uint64_t)meta->epoch; w[12] = (uint64_t)meta->step; w[13] = (uint64_t)meta->round;
    w[14] = (uint64_t)meta->batch; w[15] = meta->rng.state; w[16] = meta->rng.inc;
    w[17] = (uint64_t)k->word; w[18] = (uint64_t)k->nextra;
    for (i = 0; i < DT_CHECKPOINT_VALUES; i++) memcpy(&w[19 + i], &meta->values[i], sizeof(double));
}

/* This rank's section into sec [dt__ckpt_section_bytes]. */
static void dt__ckpt_write_section(const dt__ckpt *k, const dt_checkpoint_meta *meta, unsigned char *sec) {
    uint64_t w[DT__CKPT_SEC_WORDS];
    dt_model *m = k->m;
    int64_t ns = dt__ckpt_state(k), i;
    unsigned char *p = sec + 8 * DT__CKPT_SEC_WORDS;
    dt__ckpt_words(k, meta, w);
    for (i = 0; i < DT__CKPT_SEC_WORDS; i++) dt__put_u64(sec + 8 * i, w[i]);
    m->ops->download(m->ctx, p, m->params, 4 * m->nparams);
    p += 4 * m->nparams;
    if (m->nbuffers) m->ops->download(m->ctx, p, m->buffers, 4 * m->nbuffers);
    p += 4 * m->nbuffers;
    if (ns) m->ops->download(m->ctx, p, k->o->state, 4 * ns);
    p += 4 * ns;
    for (i = 0; k->o && i < k->o->ntensors; i++) dt__put_u64(p + 8 * i, (uint64_t)k->o->steps[i]);
    p += 8 * (k->o ? k->o->ntensors : 0);
    if (k->nextra) memcpy(p, k->extra, 4 * (size_t)k->nextra);
}

/* The values of a section [len] that must be finite (parameters, buffers, optimizer state: the floats after its
   words, `nf` of them) and its counters, which are never negative: a section that holds NaN or infinity
   comes from a diverged run, and saving it would replace a good checkpoint with a useless one. `doing` says
   "save" or "load" for the message. */
static dt_result dt__ckpt_check_values(const dt__ckpt *k, const unsigned char *sec, int64_t nf, const char *doing) {
    const unsigned char *p = sec + 8 * DT__CKPT_SEC_WORDS;
    int64_t i, bad = 0, first = -1;
    for (i = 0; i < nf; i++) {
        float v;
        memcpy(&v, p + 4 * i, sizeof v);
        if (!(v - v == 0.0f)) { bad++; if (first < 0) first = i; }   /* NaN or infinity */
    }
    for (i = 11; i <= 14; i++)   /* epoch, step, round, batch */
        if ((int64_t)dt__get_u64(sec + 8 * i) < 0)
            return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds a negative epoch, step, round or batch: the file is "
                                "damaged or was not written by dtrain", k->fn, k->rank, k->path);
    if (!bad) return DT_OK;
    if (doing[0] == 's')
        return dt_set_error(DT_ERR_NUMERIC, "%s: rank %d: %lld of its %lld values (parameters, buffers, optimizer state; the first "
                            "at %lld) are NaN or infinite: the model diverged; nothing is written (a checkpoint already at %s is "
                            "kept: resume from it with a lower learning rate)", k->fn, k->rank, (long long)bad,
                            (long long)nf, (long long)first, k->path);
    return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds %lld NaN or infinite values (the first at %lld): it was saved "
                        "from a diverged run or is damaged; use an earlier checkpoint", k->fn, k->rank, k->path, (long long)bad,
                        (long long)first);
}

/* Collective agreement on a result: every rank returns DT_OK, or the result and message of the lowest rank
   that failed (so all ranks report the same cause). */
static dt_result dt__ckpt_agree(const dt__ckpt *k, dt_result r) {
    int64_t first = r != DT_OK ? k->rank : k->world, code = (int64_t)r;
    char msg[512];
    dt_result e;
    if (!k->c || k->world == 1) return r;
    if ((e = dt_comm_allreduce(k->c, &first, 1, DT_I64, DT_MIN, DT_ALGO_AUTO)) != DT_OK) return e;
    if (first == k->world) return DT_OK;
    memset(msg, 0, sizeof msg);
    if (first == k->rank) {
        const char *s = dt_last_error();
        size_t pre = strlen(dt_result_str(r));   /* without its "DT_ERR_...: ", which dt_set_error adds back */
        if (strncmp(s, dt_result_str(r), pre) == 0 && s[pre] == ':') s += pre + (s[pre + 1] == ' ' ? 2 : 1);
        snprintf(msg, sizeof msg, "%s", s);
    }
    if ((e = dt_comm_broadcast(k->c, &code, 1, DT_I64, (int)first, DT_ALGO_AUTO)) != DT_OK ||
        (e = dt_comm_broadcast(k->c, msg, sizeof msg, DT_U8, (int)first, DT_ALGO_AUTO)) != DT_OK) return e;
    msg[sizeof msg - 1] = 0;
    return dt_set_error((dt_result)code, "%s", msg);
}

/* Rank 0: writes file [bytes] to "<path>.tmp", flushes it to disk, renames it over path, syncs the directory. */
static dt_result dt__ckpt_write_file(const dt__ckpt *k, const unsigned char *file, int64_t bytes) {
    char tmp[1024];
    FILE *f;
    dt_result r = DT_OK;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", k->path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: path is too long", k->fn);
    if (!(f = fopen(tmp, "wb")))
        return dt_set_error(DT_ERR_IO, "%s: cannot create %s (does the directory exist and is it writable?)", k->fn, tmp);
    if (fwrite(file, 1, (size_t)bytes, f) != (size_t)bytes || dt__sync_file(f) != 0)
        r = dt_set_error(DT_ERR_IO, "%s: writing %s failed (disk full?); the previous %s is untouched", k->fn, tmp, k->path);
    if (fclose(f) != 0 && r == DT_OK)
        r = dt_set_error(DT_ERR_IO, "%s: closing %s failed; the previous %s is untouched", k->fn, tmp, k->path);
    if (r == DT_OK && rename(tmp, k->path) != 0)
        r = dt_set_error(DT_ERR_IO, "%s: cannot rename %s to %s", k->fn, tmp, k->path);
    if (r != DT_OK) remove(tmp);
    else dt__sync_dir(k->path);
    return r;
}

/* Collective (or one process with k->c NULL): every rank's section, gathered by rank 0, which writes the file.
   Every rank returns rank 0's result: the checkpoint exists for all of them once the file is complete. */
static dt_result dt__ckpt_save(dt__ckpt *k, const dt_checkpoint_meta *meta) {
    int64_t mine = dt__ckpt_section_bytes(k), most = 0, head, bytes = 0, off, i;
    int64_t *sizes = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)k->world);
    unsigned char *sec = NULL, *file = NULL, *slots = NULL;
    dt_result r = DT_OK;
    if (!sizes) r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", k->fn, k->rank);
    if ((r = dt__ckpt_agree(k, r)) != DT_OK) { DT_FREE(sizes); return r; }
    sizes[0] = mine;
    if (k->c && k->world > 1 && (r = dt_comm_allgather(k->c, &mine, sizes, 1, DT_I64)) != DT_OK) { DT_FREE(sizes); return r; }
    head = 8 + 8 * (DT__CKPT_HEAD_WORDS + k->world);
    for (i = 0; i < k->world; i++) { most = sizes[i] > most ? sizes[i] : most; bytes += sizes[i]; }
    bytes += head + 8;
    sec = (unsigned char *)DT_MALLOC((size_t)most);   /* padded to the largest, for one gather */
    if (k->rank == 0) {
        file = (unsigned char *)DT_MALLOC((size_t)bytes);
        slots = (unsigned char *)DT_MALLOC((size_t)(most * k->world));
    }
    if (!sec || (k->rank == 0 && (!file || !slots)))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory to stage %lld bytes of checkpoint", k->fn, k->rank,
                         (long long)(k->rank == 0 ? bytes + most * (k->world + 1) : most));
    if ((r = dt__ckpt_agree(k, r)) == DT_OK) {
        memset(sec, 0, (size_t)most);
        dt__ckpt_write_section(k, meta, sec);
        r = dt__ckpt_agree(k, dt__ckpt_check_values(k, sec, k->m->nparams + k->m->nbuffers + dt__ckpt_state(k), "save"));
    }
    if (r == DT_OK) {
        if (k->c && k->world > 1) r = dt_comm_gather(k->c, sec, slots, (size_t)most, DT_U8, 0);
        else memcpy(slots, sec, (size_t)most);
    }
    if (r == DT_OK && k->rank == 0) {
        memcpy(file, DT__CKPT_MAGIC, 8);
        dt__put_u64(file + 8, DT__CKPT_VERSION);
        dt__put_u64(file + 16, (uint64_t)k->world);
        dt__put_u64(file + 24, (uint64_t)k->trainer);
        for (i = 0, off = head; i < k->world; off += sizes[i], i++) {
            dt__put_u64(file + 32 + 8 * i, (uint64_t)sizes[i]);
            memcpy(file + off, slots + i * most, (size_t)sizes[i]);
        }
        dt__put_u64(file + bytes - 8, dt__fnv(0xcbf29ce484222325ULL, file, (size_t)(bytes - 8)));
        r = dt__ckpt_write_file(k, file, bytes);
    }
    DT_FREE(sizes); DT_FREE(sec); DT_FREE(file); DT_FREE(slots);
    return dt__ckpt_agree(k, r);
}

/* Rank 0: the whole file into *file [*bytes]. */
static dt_result dt__ckpt_read_file(const dt__ckpt *k, unsigned char **file, int64_t *bytes) {
    FILE *f;
    long size;
    const char *why;
    *file = NULL;
    if (!(f = dt__open_read(k->path, &why)))   /* a FIFO is refused, not waited on */
        return dt_set_error(DT_ERR_IO, "%s: cannot open %s: %s", k->fn, k->path, why);
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return dt_set_error(DT_ERR_IO, "%s: cannot read %s", k->fn, k->path);
    }
    if (!(*file = (unsigned char *)DT_MALLOC((size_t)size + 1))) {
        fclose(f);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: no memory to stage %s (%ld bytes)", k->fn, k->path, size);
    }
    *bytes = (int64_t)size;
    if (fread(*file, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        return dt_set_error(DT_ERR_IO, "%s: reading %s failed", k->fn, k->path);
    }
    fclose(f);
    return DT_OK;
}

/* Rank 0: the checks of the whole file, in the order that makes each message true: what it is (magic,
   version), whether it is whole (sizes, checksum), then whether it fits this run (world size, trainer).
   sizes [k->world] receives the sections' sizes. */
static dt_result dt__ckpt_check_file(const dt__ckpt *k, const unsigned char *file, int64_t bytes, int64_t *sizes) {
    uint64_t version, world, trainer, i;
    int64_t head, sum = 0;
    if (bytes < 8 + 8 * DT__CKPT_HEAD_WORDS + 8 || memcmp(file, DT__CKPT_MAGIC, 8) != 0)   /* + the checksum */
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is not a dtrain checkpoint (wrong magic number or too short)", k->fn, k->path);
    version = dt__get_u64(file + 8); world = dt__get_u64(file + 16); trainer = dt__get_u64(file + 24);
    if (version != DT__CKPT_VERSION)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s has format version %llu; this dtrain reads version %u%s", k->fn, k->path,
                            (unsigned long long)version, DT__CKPT_VERSION,
                            version == 1 ? " (version 1 held one model; save it again with this dtrain)" : "");
    if (world < 1 || world > (uint64_t)(bytes - 8 - 8 * DT__CKPT_HEAD_WORDS - 8) / 8)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is truncated or damaged (a world of %llu ranks in %lld bytes)", k->fn,
                            k->path, (unsigned long long)world, (long long)bytes);
    head = 8 + 8 * (DT__CKPT_HEAD_WORDS + (int64_t)world);
    for (i = 0; i < world && sum <= bytes; i++) {
        uint64_t s = dt__get_u64(file + 32 + 8 * i);
        sum = s < 8 * DT__CKPT_SEC_WORDS || s > (uint64_t)bytes ? bytes + 1 : sum + (int64_t)s;
    }
    if (sum + head + 8 != bytes)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is %lld bytes, which is not what its header describes: the file is "
                            "truncated or damaged; use an earlier checkpoint", k->fn, k->path, (long long)bytes);
    if (dt__fnv(0xcbf29ce484222325ULL, file, (size_t)(bytes - 8)) != dt__get_u64(file + bytes - 8))
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is damaged (checksum mismatch); use an earlier checkpoint", k->fn, k->path);
    if (world != (uint64_t)k->world)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s holds the state of %llu ranks but this run has %d: resume on %llu ranks",
                            k->fn, k->path, (unsigned long long)world, k->world, (unsigned long long)world);
    if (trainer != (uint64_t)k->trainer)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s was written by %s; %s reads what %s writes: resume with the trainer that "
                            "wrote it", k->fn, k->path, trainer < DT__CKPT_TRAINERS ? dt__ckpt_writers[trainer] : "an unknown trainer",
                            k->fn, dt__ckpt_writers[k->trainer]);
    for (i = 0; i < world; i++) sizes[i] = (int64_t)dt__get_u64(file + 32 + 8 * i);
    return DT_OK;
}

/* Each rank: its section [len] against its model and optimizer; w receives the section's words. */
static dt_result dt__ckpt_check_section(const dt__ckpt *k, const unsigned char *sec, int64_t len, uint64_t *w) {
    dt_model *m = k->m;
    int i;
    for (i = 0; i < DT__CKPT_SEC_WORDS; i++) w[i] = dt__get_u64(sec + 8 * i);
    if (w[0] != (uint64_t)k->rank || w[4] > (uint64_t)len || w[5] > (uint64_t)len || w[18] > (uint64_t)len ||
        (int64_t)(8 * DT__CKPT_SEC_WORDS + 4 * (w[2] + w[3] + w[4] + w[18]) + 8 * w[5]) != len)
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: its section of %s is damaged (impossible sizes)", k->fn, k->rank, k->path);
    if (w[2] != (uint64_t)m->nparams || w[3] != (uint64_t)m->nbuffers || w[1] != dt__model_signature(m))
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds another model (%llu parameters, %llu buffer values, signature "
                            "%016llx) than this one (%lld, %lld, %016llx): build the same model to load it", k->fn, k->rank,
                            k->path, (unsigned long long)w[2], (unsigned long long)w[3], (unsigned long long)w[1],
                            (long long)m->nparams, (long long)m->nbuffers, (unsigned long long)dt__model_signature(m));
    if (k->o && w[5] == 0)
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s has no optimizer state; pass NULL for the optimizer to load the "
                            "model alone", k->fn, k->rank, k->path);
    if (k->o && (w[6] != (uint64_t)k->o->d.kind || w[4] != (uint64_t)dt__ckpt_state(k) || w[5] != (uint64_t)k->o->ntensors))
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: the optimizer state in %s (kind %llu, %llu values) does not fit this "
                            "optimizer (kind %d, %lld values)", k->fn, k->rank, k->path, (unsigned long long)w[6],
                            (unsigned long long)w[4], (int)k->o->d.kind, (long long)dt__ckpt_state(k));
    if (w[18] != (uint64_t)k->nextra)
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds %llu values of the trainer's own state (DDP: the compression's "
                            "residual, and PowerSGD's Qs) but this run keeps %lld: resume with the settings that wrote it (DDP: the same --compress, "
                            "with or without error feedback)", k->fn, k->rank, k->path, (unsigned long long)w[18],
                            (long long)k->nextra);
    return dt__ckpt_check_values(k, sec, (int64_t)(w[2] + w[3] + w[4]), "load");
}

/* Each rank, after every rank's checks passed: its section into its model, optimizer, meta and word. */
static void dt__ckpt_apply(dt__ckpt *k, const unsigned char *sec, const uint64_t *w, dt_checkpoint_meta *meta) {
    dt_model *m = k->m;
    const unsigned char *p = sec + 8 * DT__CKPT_SEC_WORDS;
    uint32_t lr = (uint32_t)w[7];
    int64_t i;
    int j;
    m->ops->upload(m->ctx, m->params, p, 4 * m->nparams);
    p += 4 * m->nparams;
    if (m->nbuffers) m->ops->upload(m->ctx, m->buffers, p, 4 * m->nbuffers);
    p += 4 * m->nbuffers;
    m->seed = w[8]; m->stream = w[9]; m->step = w[10];
    if (k->o) {
        if (w[4]) m->ops->upload(m->ctx, k->o->state, p, 4 * (int64_t)w[4]);
        for (i = 0; i < k->o->ntensors; i++) k->o->steps[i] = (int64_t)dt__get_u64(p + 4 * (int64_t)w[4] + 8 * i);
        memcpy(&k->o->d.lr, &lr, sizeof lr);
    }
    p += 4 * (int64_t)w[4] + 8 * (int64_t)w[5];   /* the optimizer's part, loaded or not: the trainer's floats follow */
    if (k->nextra) memcpy(k->extra, p, 4 * (size_t)k->nextra);
    if (meta) {
        meta->epoch = (int64_t)w[11]; meta->step = (int64_t)w[12]; meta->round = (int64_t)w[13];
        meta->batch = (int64_t)w[14]; meta->rng.state = w[15]; meta->rng.inc = w[16];
        for (j = 0; j < DT_CHECKPOINT_VALUES; j++) memcpy(&meta->values[j], &w[19 + j], sizeof(double));
    }
    k->word = (int64_t)w[17];
}

/* Collective (or one process with k->c NULL): rank 0 reads and checks the file and hands each rank its
   section; each rank checks its own; only when every check passed on every rank does any rank change. */
static dt_result dt__ckpt_load(dt__ckpt *k, dt_checkpoint_meta *meta) {
    int64_t *sizes = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)k->world), bytes = 0, most = 0, i, off;
    unsigned char *file = NULL, *slots = NULL, *sec = NULL;
    uint64_t w[DT__CKPT_SEC_WORDS];
    int packed = 0;
    dt_result r = DT_OK;
    if (!sizes) r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", k->fn, k->rank);
    else if (k->rank == 0 && (r = dt__ckpt_read_file(k, &file, &bytes)) == DT_OK) r = dt__ckpt_check_file(k, file, bytes, sizes);
    if ((r = dt__ckpt_agree(k, r)) != DT_OK) goto done;
    if (k->c && k->world > 1 && (r = dt_comm_broadcast(k->c, sizes, (size_t)k->world, DT_I64, 0, DT_ALGO_AUTO)) != DT_OK)
        goto done;
    for (i = 0; i < k->world; i++) most = sizes[i] > most ? sizes[i] : most;
    if (k->rank == 0) {   /* the sections as slots of the largest one's size: in place when they are equal */
        slots = file + 8 + 8 * (DT__CKPT_HEAD_WORDS + k->world);
        for (i = 0; i < k->world; i++) packed |= sizes[i] != most;
        if (packed && (slots = (unsigned char *)DT_MALLOC((size_t)(most * k->world))) != NULL)
            for (i = 0, off = 8 + 8 * (DT__CKPT_HEAD_WORDS + k->world); i < k->world; off += sizes[i], i++)
                memcpy(slots + i * most, file + off, (size_t)sizes[i]);
    }
    sec = (unsigned char *)DT_MALLOC((size_t)most);
    if (!sec || (k->rank == 0 && !slots))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory to stage %lld bytes of checkpoint", k->fn, k->rank,
                         (long long)most);
    if ((r = dt__ckpt_agree(k, r)) != DT_OK) goto done;
    if (k->c && k->world > 1) r = dt_comm_scatter(k->c, slots, sec, (size_t)most, DT_U8, 0);
    else memcpy(sec, slots, (size_t)most);
    if (r == DT_OK) r = dt__ckpt_check_section(k, sec, sizes[k->rank], w);
    if ((r = dt__ckpt_agree(k, r)) == DT_OK) dt__ckpt_apply(k, sec, w, meta);   /* everything checked everywhere */
done:
    if (packed) DT_FREE(slots);
    DT_FREE(sizes); DT_FREE(file); DT_FREE(sec);
    return r;
}

/* Fills the call's description; refuses what no rank can save or load. */
static dt_result dt__ckpt_init(dt__ckpt *k, dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m,
                               dt_optim *o) {
    dt_result r;
    memset(k, 0, sizeof *k);
    k->c = c; k->fn = fn; k->trainer = trainer; k->path = path; k->m = m; k->o = o;
    k->rank = c ? dt_comm_rank(c) : 0;
    k->world = c ? dt_comm_size(c) : 1;
    if ((r = dt__need_final(m, fn)) != DT_OK) return r;
    if (!path || !*path) return dt_set_error(DT_ERR_INVALID_ARG, "%s: path is empty", fn);
    if (o && o->m != m) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the optimizer belongs to another model", fn);
    if (!dt__little_endian()) return dt_set_error(DT_ERR_UNSUPPORTED, "%s: big-endian hosts are not supported", fn);
    return DT_OK;
}

dt_result dt_checkpoint_save(const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, NULL, "dt_checkpoint_save", DT__CKPT_PLAIN, path, m, o);
    return r != DT_OK ? r : dt__ckpt_save(&k, meta);
}

dt_result dt_checkpoint_load(const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, NULL, "dt_checkpoint_load", DT__CKPT_PLAIN, path, m, o);
    return r != DT_OK ? r : dt__ckpt_load(&k, meta);
}

/* The collective entry points: each rank's refusal of its own arguments is agreed like any other failure, so
   no rank waits in a collective that another never enters. */
static dt_result dt__ckpt_save_extra(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                     const dt_checkpoint_meta *meta, int64_t word, float *extra, int64_t nextra, dt_result pre) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, c, fn, trainer, path, m, o);
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    k.word = word;
    k.extra = extra;
    k.nextra = nextra;
    if ((r = dt__ckpt_agree(&k, pre != DT_OK ? pre : r)) != DT_OK) return r;
    return dt__ckpt_save(&k, meta);
}
static dt_result dt__ckpt_save_comm(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                    const dt_checkpoint_meta *meta, int64_t word, dt_result pre) {
    return dt__ckpt_save_extra(c, fn, trainer, path, m, o, meta, word, NULL, 0, pre);
}
static dt_result dt__ckpt_load_extra(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                     dt_checkpoint_meta *meta, int64_t *word, float *extra, int64_t nextra, dt_result pre) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, c, fn, trainer, path, m, o);
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    k.extra = extra;
    k.nextra = nextra;
    if ((r = dt__ckpt_agree(&k, pre != DT_OK ? pre : r)) != DT_OK || (r = dt__ckpt_load(&k, meta)) != DT_OK) return r;
    if (word) *word = k.word;
    return DT_OK;
}
static dt_result dt__ckpt_load_comm(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                    dt_checkpoint_meta *meta, int64_t *word, dt_result pre) {
    return dt__ckpt_load_extra(c, fn, trainer, path, m, o, meta, word, NULL, 0, pre);
}

dt_result dt_checkpoint_save_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta) {
    return dt__ckpt_save_comm(c, "dt_checkpoint_save_comm", DT__CKPT_PLAIN, path, m, o, meta, 0, DT_OK);
}
dt_result dt_checkpoint_load_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta) {
    return dt__ckpt_load_comm(c, "dt_checkpoint_load_comm", DT__CKPT_PLAIN, path, m, o, meta, NULL, DT_OK);
}

/* ---- shared by the trainers -------------------------------------------------------------------- */

/* The checks every trainer's create and dt_hogwild_run (and Hogwild's pull and push) start with, so that they
   refuse the same things alike: a NULL out, communicator (when the trainer has one: has_comm) or model is
   DT_ERR_INVALID_ARG, a model that is not finalized DT_ERR_STATE. `model` names it in the message ("the
   model", "the replica"). A NULL desc is no error: every create reads it as a zeroed desc. */
static dt_result dt__trainer_check(const char *fn, int has_out, int has_comm, const dt_comm *c, const dt_model *m,
                                   const char *model) {
    char at[32] = "";   /* "rank 3: " */
    if (has_comm && c) snprintf(at, sizeof at, "rank %d: ", dt_comm_rank(c));
    if (!has_out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (has_comm && !c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    if (!m) return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s%s is NULL", fn, at, model);
    if (!m->finalized)
        return dt_set_error(DT_ERR_STATE, "%s: %s%s is not finalized: call dt_model_finalize after building it", fn, at, model);
    return DT_OK;
}

/* Collective, for every trainer's create: checks that all ranks built a model of the same size (one
   all-reduce of {n, -n} with MAX: both come back unchanged only when every n is equal), then, with
   broadcast set, gives every rank rank 0's parameters and buffers so the replicas start equal. */
static dt_result dt__same_model(dt_comm *c, dt_model *m, const char *fn, int broadcast) {
    int64_t nb = 0, n, v[2];
    float *b = dt_model_buffers(m, &nb);
    dt_result r;
    n = m->nparams + nb;
    v[0] = n;
    v[1] = -n;
    if ((r = dt_comm_allreduce(c, v, 2, DT_I64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    if (v[0] != n || -v[1] != n)
        return dt_set_error(DT_ERR_MISMATCH, "%s: rank %d: its model has %lld parameters and buffers but another rank's has %lld: "
                            "every rank must build the same model", fn, c->rank, (long long)n, (long long)(v[0] != n ? v[0] : -v[1]));
    if (!broadcast) return DT_OK;
    if ((r = dt_comm_broadcast(c, m->params, (size_t)m->nparams, DT_F32, 0, DT_ALGO_AUTO)) != DT_OK) return r;
    return nb > 0 ? dt_comm_broadcast(c, b, (size_t)nb, DT_F32, 0, DT_ALGO_AUTO) : DT_OK;
}

/* ---- local SGD and Hogwild ---------------------------------------------------------------------- */

struct dt_localsgd {
    dt_comm          *comm;
    dt_model         *model;
    dt_localsgd_desc  desc;
    int64_t           since;   /* steps since the last average */
    dt_localsgd_stats stats;
};

dt_result dt_localsgd_create(dt_localsgd **out, dt_comm *c, dt_model *m, const dt_localsgd_desc *desc) {
    dt_localsgd_desc dd;
    dt_localsgd *d;
    dt_result r;
    int me = dt_comm_rank(c);
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_localsgd_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (dd.period < 0 || dd.algo < 0 || dd.algo >= DT_ALGO_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_create: rank %d: bad desc (period %d, algo %d): period is >= 0 "
                            "(0 = only at dt_localsgd_average), algo a dt_algo", me, dd.period, (int)dd.algo);
    if ((r = dt__same_model(c, m, "dt_localsgd_create", 1)) != DT_OK) return r;
    if (!(d = (dt_localsgd *)DT_MALLOC(sizeof *d))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_localsgd_create: rank %d: no memory", me);
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->desc = dd;
    *out = d;
    return DT_OK;
}

void dt_localsgd_destroy(dt_localsgd *d) { DT_FREE(d); }

dt_result dt_localsgd_average(dt_localsgd *d) {
    dt_result r = DT_OK;
    int64_t nb = 0;
    float *b;
    double t0 = dt_time_now();
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_average: localsgd is NULL");
    d->since = 0;
    if (d->comm->size > 1) {
        dt_trace_begin("local sgd average", "comm");
        r = dt_comm_allreduce(d->comm, d->model->params, (size_t)d->model->nparams, DT_F32, DT_MEAN, d->desc.algo);
        b = dt_model_buffers(d->model, &nb);
        if (r == DT_OK && d->desc.sync_buffers && nb > 0)
            r = dt_comm_allreduce(d->comm, b, (size_t)nb, DT_F32, DT_MEAN, d->desc.algo);
        dt_trace_end();
    }
    d->stats.comm_seconds += dt_time_now() - t0;
    d->stats.averages += r == DT_OK;
    return r;
}

dt_result dt_localsgd_step(dt_localsgd *d) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_step: localsgd is NULL");
    d->stats.steps++;
    return d->desc.period > 0 && ++d->since >= d->desc.period ? dt_localsgd_average(d) : DT_OK;
}

dt_localsgd_stats dt_localsgd_get_stats(const dt_localsgd *d) {
    dt_localsgd_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

dt_result dt_localsgd_save(dt_localsgd *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_save: localsgd is NULL");
    return dt__ckpt_save_comm(d->comm, "dt_localsgd_save", DT__CKPT_LOCALSGD, path, d->model, o, meta, d->since, DT_OK);
}

dt_result dt_localsgd_load(dt_localsgd *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_load: localsgd is NULL");
    return dt__ckpt_load_comm(d->comm, "dt_localsgd_load", DT__CKPT_LOCALSGD, path, d->model, o, meta, &d->since, DT_OK);
}

/* Hogwild. The shared buffer is read and written by every worker with plain loads and stores: that is the
   algorithm, not an oversight (see the declarations). Only the start and the end are synchronised, by
   thread creation and join. */
typedef struct dt__hogwild_ctx {
    dt_hogwild_worker w;
    dt_hogwild_fn     fn;
    void             *arg;
    int               omp_threads;
    dt_result         result;
    char              msg[512];
    dt__thread        thread;
} dt__hogwild_ctx;

static void dt__hogwild_main(void *p) {
    dt__hogwild_ctx *x = (dt__hogwild_ctx *)p;
#if DT__HAVE_OMP
    omp_set_num_threads(x->omp_threads);
#endif
    x->result = x->fn(&x->w, x->arg);
    if (x->result != DT_OK) snprintf(x->msg, sizeof x->msg, "%s", dt_last_error());
}

dt_result dt_hogwild_run(dt_model *shared, int threads, dt_hogwild_fn fn, void *arg) {
    dt__hogwild_ctx *x;
    dt_result r = DT_OK;
    int i, started = 0, omp_caller = dt_cpu_threads();
    if ((r = dt__trainer_check("dt_hogwild_run", 1, 0, NULL, shared, "the shared model")) != DT_OK) return r;
    if (!fn || threads < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_hogwild_run: %s", !fn ? "the worker function is NULL" : "threads must be >= 1");
    if (threads == 1) {
        dt_hogwild_worker w;
        w.index = 0; w.threads = 1; w.shared = shared;
        return fn(&w, arg);
    }
    if (!(x = (dt__hogwild_ctx *)DT_MALLOC(sizeof *x * (size_t)threads)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_hogwild_run: no memory for %d workers", threads);
    memset(x, 0, sizeof *x * (size_t)threads);
    for (i = 0; i < threads; i++) {
        x[i].w.index = i; x[i].w.threads = threads; x[i].w.shared = shared;
        x[i].fn = fn; x[i].arg = arg; x[i].omp_threads = dt__default_threads(threads);
    }
    /* without threads (or when one cannot start) the rest run on this thread, one after another */
    for (i = 0; i < threads; i++) started += DT__HAVE_THREADS && dt__thread_start(&x[i].thread, dt__hogwild_main, &x[i]) == 0;
    for (i = started; i < threads; i++) dt__hogwild_main(&x[i]);
    for (i = 0; i < started; i++) dt__thread_join(&x[i].thread);
#if DT__HAVE_OMP
    omp_set_num_threads(omp_caller);   /* in case workers ran on this thread */
#else
    (void)omp_caller;
#endif
    for (i = 0; i < threads && r == DT_OK; i++)
        if (x[i].result != DT_OK) r = dt_set_error(x[i].result, "dt_hogwild_run: worker %d of %d: %s", i, threads, x[i].msg);
    DT_FREE(x);
    return r;
}

static dt_result dt__hogwild_check(dt_model *shared, dt_model *replica, const char *what) {
    dt_result r;
    if ((r = dt__trainer_check(what, 1, 0, NULL, shared, "the shared model")) != DT_OK ||
        (r = dt__trainer_check(what, 1, 0, NULL, replica, "the replica")) != DT_OK) return r;
    if (shared->nparams != replica->nparams || shared->nbuffers != replica->nbuffers)
        return dt_set_error(DT_ERR_MISMATCH, "%s: the replica has %lld parameters and %lld buffer elements but the shared "
                            "model %lld and %lld: build the replica with the same architecture", what,
                            (long long)replica->nparams, (long long)replica->nbuffers, (long long)shared->nparams,
                            (long long)shared->nbuffers);
    return DT_OK;
}

dt_result dt_hogwild_pull(dt_model *shared, dt_model *replica) {
    dt_result r = dt__hogwild_check(shared, replica, "dt_hogwild_pull");
    if (r != DT_OK) return r;
    memcpy(replica->params, shared->params, sizeof(float) * (size_t)shared->nparams);
    memcpy(replica->buffers, shared->buffers, sizeof(float) * (size_t)shared->nbuffers);
    return DT_OK;
}

dt_result dt_hogwild_push(dt_model *shared, dt_model *replica, float lr) {
    dt_result r = dt__hogwild_check(shared, replica, "dt_hogwild_push");
    float *p, *g;
    int64_t i, n;
    if (r != DT_OK) return r;
    if (!(lr >= 0.0f)) return dt_set_error(DT_ERR_INVALID_ARG, "dt_hogwild_push: lr %g must be >= 0", (double)lr);
    p = shared->params; g = replica->grads; n = shared->nparams;
    for (i = 0; i < n; i++) p[i] -= lr * g[i];   /* the same arithmetic as the SGD step */
    /* publishes the statistics the replica's forward updated: the shared model is evaluated with them */
    memcpy(shared->buffers, replica->buffers, sizeof(float) * (size_t)shared->nbuffers);
    dt_model_zero_grad(replica);
    return DT_OK;
}

/* ---- DDP ---------------------------------------------------------------------------------------
   A sync is one sequence of collectives, the same on every rank (so a joined rank that contributes zeros
   can shadow the others): the buckets (BUCKETS), the tensors (PER_LAYER), or the whole buffer. Each rank
   weighs its gradient by its samples (its buffer holds a mean over its last micro-batch, see
   dt_ddp_backward, so the weight is that micro-batch's size), and the first collective carries two more
   floats, this rank's samples and whether it still has data (dt_ddp_join's ranks say 0): after it every
   rank knows the samples of all and divides the summed buffer by them at the end, one collective per
   bucket and nothing else. When no rank has data any more, the ranks see it after that first collective
   and all stop there. With BUCKETS and overlap, a helper thread owns the communicator from the start of
   backward to its end: the backward hook moves `ready` down the buffer and the helper reduces each bucket
   as soon as `ready` has passed its start. */

static const char *const dt__ddp_method_names[DT_DDP_METHOD_COUNT] = {"buckets", "flat", "per-layer", "ps", "p2p"};
const char *dt_ddp_method_name(dt_ddp_method k) { return dt__enum_name(dt__ddp_method_names, DT_DDP_METHOD_COUNT, (int)k); }

dt_result dt_ddp_method_parse(const char *s, dt_ddp_method *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__ddp_method_names, DT_DDP_METHOD_COUNT, s, &k, "DDP sync method");
    if (r == DT_OK && out) *out = (dt_ddp_method)k;
    return r;
}

static const char *const dt__ddp_compress_names[DT_DDP_COMPRESS_COUNT] = {"fp32", "bf16", "fp16", "topk", "powersgd"};
const char *dt_ddp_compress_name(dt_ddp_compress k) { return dt__enum_name(dt__ddp_compress_names, DT_DDP_COMPRESS_COUNT, (int)k); }

dt_result dt_ddp_compress_parse(const char *s, dt_ddp_compress *out, double *param) {
    char name[16], *end = NULL;
    const char *colon = s ? strchr(s, ':') : NULL;
    double x = 0.0;
    int k = 0;
    dt_result r;
    if (colon && (size_t)(colon - s) < sizeof name) {
        snprintf(name, sizeof name, "%.*s", (int)(colon - s), s);
        s = name;
    }
    if ((r = dt__enum_parse(dt__ddp_compress_names, DT_DDP_COMPRESS_COUNT, s, &k,
                            "DDP compression (topk:RATIO, powersgd:RANK for a parameter)")) != DT_OK) return r;
    if (colon) {
        x = strtod(colon + 1, &end);
        if ((k != DT_DDP_TOPK && k != DT_DDP_POWERSGD) || end == colon + 1 || *end || !(x > 0.0) ||
            (k == DT_DDP_TOPK && x > 1.0) || (k == DT_DDP_POWERSGD && (x != floor(x) || x > 1024.0)))
            return dt_set_error(DT_ERR_INVALID_ARG, "DDP compression '%s%s': only topk takes a ratio, a number in (0, 1] "
                                "(e.g. topk:0.01 sends 1%% of each slice), and powersgd a rank, a whole number from 1 to "
                                "1024 (e.g. powersgd:2)", s, colon);
    }
    if (out) *out = (dt_ddp_compress)k;
    if (param) *param = x;
    return DT_OK;
}

/* The k-th largest of the keys |x[i]| (a float's magnitude orders as its bits), a byte at a time from the
   top; *take gets how many entries equal to it belong to the top k (the first ones, by index). */
static uint32_t dt__topk_threshold(const float *x, int64_t n, int64_t k, int64_t *take) {
    uint32_t prefix = 0, mask = 0;
    int64_t want = k, hist[256], i;
    int shift, b = 0;
    for (shift = 24; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        for (i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof u);
            u &= 0x7fffffffu;
            if ((u & mask) == prefix) hist[(u >> shift) & 255u]++;
        }
        for (b = 255; b > 0 && want > hist[b]; b--) want -= hist[b];
        prefix |= (uint32_t)b << shift;
        mask |= 255u << shift;
    }
    *take = want;
    return prefix;
}

int64_t dt_topk_split(float *x, int64_t n, int64_t k, int32_t *idx, float *val) {
    int64_t take, i, got = 0;
    uint32_t t;
    if (k <= 0 || n <= 0) return 0;
    if (k > n) k = n;
    t = dt__topk_threshold(x, n, k, &take);
    for (i = 0; i < n && got < k; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= 0x7fffffffu;
        if (u > t || (u == t && take-- > 0)) {
            idx[got] = (int32_t)i;
            val[got++] = x[i];
            x[i] = 0.0f;
        }
    }
    return got;
}

/* Samples of one sync travel as a float: exact below 2^24 (a sum that reaches it may have rounded). */
#define DT__DDP_MAX_SAMPLES 16777216.0

struct dt_ddp {
    dt_comm     *comm;
    dt_model    *model;
    dt_ddp_desc  desc;
    int64_t      n;                 /* gradient elements */
    int          ntensors, nbuckets;
    int64_t     *toff, *tcnt;       /* [ntensors] parameter tensors, last first (the order backward ends them) */
    int64_t     *boff, *bcnt;       /* [nbuckets] buckets of whole tensors, last first */
    int64_t     *ready_at;          /* [nodes]: after node i's backward the gradients [ready_at[i], n) are final */
    float       *gathered;          /* PARAM_SERVER and P2P, rank 0: [size * (n + 2)] everyone's gradient */
    dt_request  *reqs;              /* P2P, rank 0: [size] */
    float       *carry;             /* [first collective's count + 2]: its slice, then samples and active */
    int64_t      acc_samples;       /* samples accumulated since the last sync */
    int64_t      last_samples;      /* the last micro-batch's: the buffer is (sum of gradients) / this */
    float        scale;             /* this rank's weight in the sum of the current sync */
    int          active;            /* this rank has data in the current sync */
    double       total;             /* after the first collective: the samples of all ranks */
    int64_t      nactive;           /* ... and the ranks with data */
    dt_ddp_stats stats;
    /* compression (desc.compress, more than one rank) */
    uint16_t    *half;              /* BF16, FP16: [largest slice] the slice as it travels */
    float       *residual;          /* TOPK with feedback: [n] what this rank has not sent yet */
    int32_t     *sel_idx;           /* TOPK: [largest k] the pairs chosen */
    float       *sel_val;
    int32_t     *wire, *gathered_wire;  /* TOPK: [2 k + 2] this rank's pairs and counts; [size (2 kmax + 2)] everyone's */
    int64_t     *mrows, *mcols, *qoff;  /* POWERSGD: [ntensors + 1] in toff's order: a matrix's shape (0: sent as
                                           it is) and where its Q starts in psq */
    float       *psq;               /* POWERSGD: the Qs, after the residual's n floats (one block: both are saved) */
    float       *psbuf;             /* POWERSGD: [largest slice's Ps and vectors + 2] */
    int64_t      nstate;            /* floats of residual (and POWERSGD's Qs) that a checkpoint keeps */
    int          tls_rank;          /* the creator's rank for log prefixes, given to the helper thread */
    dt__trace_lane *trace;          /* the creator's rank's lane for the helper thread, or NULL */
    /* overlap (BUCKETS where the backend lets another thread call the communicator) */
    int          overlap, in_sync;  /* in_sync: the caller's thread is in an overlapped backward */
    int64_t      ready_seen;        /* caller's copy of `ready` */
    dt__thread   thread;
    dt__mutex    mu;
    dt__cond     cv;
    int          quit, job;         /* under mu */
    int          bw_done;           /* under mu: the caller's backward has returned */
    int64_t      ready;             /* under mu: gradients [ready, n) are final */
    dt_result    herr;              /* under mu: the helper's failure and message */
    char         hmsg[512];
};

/* Sums this rank's slice (already in g) with slots 1..p-1 of gathered, in rank order. */
static void dt__ddp_sum_slots(float *g, const float *gathered, int p, int64_t cnt) {
    int i;
    int64_t j;
    for (i = 1; i < p; i++)
        for (j = 0; j < cnt; j++) g[j] += gathered[(int64_t)i * cnt + j];
}

/* Sums g [cnt] over the ranks by the chosen method. */
static dt_result dt__ddp_sum(dt_ddp *d, float *g, int64_t cnt) {
    dt_comm *c = d->comm;
    int p = c->size, me = c->rank, i;
    dt_result r = DT_OK;
    switch (d->desc.method) {
    case DT_DDP_PARAM_SERVER:   /* everyone to rank 0, which sums and sends the result to everyone */
        if ((r = dt_comm_gather(c, g, me == 0 ? d->gathered : NULL, (size_t)cnt, DT_F32, 0)) != DT_OK) return r;
        if (me == 0) dt__ddp_sum_slots(g, d->gathered, p, cnt);
        return dt_comm_broadcast(c, g, (size_t)cnt, DT_F32, 0, DT_ALGO_NAIVE);
    case DT_DDP_P2P:            /* the same with messages written by hand */
        if (me != 0) {
            if ((r = dt__lib_send(c, g, (size_t)cnt, DT_F32, 0, DT__TAG_DDP)) != DT_OK) return r;
            return dt__lib_recv(c, g, (size_t)cnt, DT_F32, 0, DT__TAG_DDP, NULL);
        }
        for (i = 1; i < p && r == DT_OK; i++)
            r = dt__lib_irecv(c, d->gathered + (int64_t)i * cnt, (size_t)cnt, DT_F32, i, DT__TAG_DDP, &d->reqs[i]);
        if (r == DT_OK) r = dt_comm_waitall(c, d->reqs + 1, i - 1);
        if (r != DT_OK) return r;
        dt__ddp_sum_slots(g, d->gathered, p, cnt);
        for (i = 1; i < p && r == DT_OK; i++) r = dt__lib_isend(c, g, (size_t)cnt, DT_F32, i, DT__TAG_DDP, &d->reqs[i]);
        if (r == DT_OK) r = dt_comm_waitall(c, d->reqs + 1, i - 1);
        return r;
    default:                    /* BUCKETS, FLAT, PER_LAYER: all-reduce of a slice */
        return dt_comm_allreduce(c, g, (size_t)cnt, DT_F32, DT_SUM, d->desc.algo);
    }
}

/* The collectives of a sync: buckets, tensors (PER_LAYER) or the whole buffer; collective i's slice. */
static int dt__ddp_ncoll(const dt_ddp *d) {
    if (d->desc.method == DT_DDP_BUCKETS && d->nbuckets) return d->nbuckets;
    return d->desc.method == DT_DDP_PER_LAYER && d->ntensors ? d->ntensors : 1;
}
static void dt__ddp_slice(const dt_ddp *d, int i, int64_t *off, int64_t *cnt) {
    if (d->desc.method == DT_DDP_BUCKETS && d->nbuckets) { *off = d->boff[i]; *cnt = d->bcnt[i]; }
    else if (d->desc.method == DT_DDP_PER_LAYER && d->ntensors) { *off = d->toff[i]; *cnt = d->tcnt[i]; }
    else { *off = 0; *cnt = d->n; }
}

/* This rank's part in a sync: its weight, and what the first collective carries (one rank: no sum, so the
   weight is the share of the last micro-batch in the samples accumulated). */
static void dt__ddp_begin(dt_ddp *d, int active) {
    d->active = active;
    if (d->comm->size > 1) { d->scale = active ? (float)d->last_samples : 0.0f; return; }
    d->scale = active ? (float)((double)d->last_samples / (double)d->acc_samples) : 0.0f;
    d->total = (double)d->acc_samples;
    d->nactive = active;
}

/* After the first collective: the samples of all ranks and how many still have data. */
static dt_result dt__ddp_counts(dt_ddp *d, float total, float nactive) {
    d->total = total;
    d->nactive = (int64_t)nactive;
    if (d->total >= DT__DDP_MAX_SAMPLES)
        return dt_set_error(DT_ERR_INVALID_ARG, "DDP sync: rank %d: %.0f samples in one sync, but a float counts them exactly only below %.0f: "
                            "sync more often (fewer micro-batches per sync, or smaller batches)", d->comm->rank, d->total, DT__DDP_MAX_SAMPLES);
    return DT_OK;
}

/* BF16 and FP16: the slice rounded to 16 bits, summed over DT_BF16 or DT_F16 (partial sums rounded as they
   travel), decoded; the first collective's counts go before it as two floats. */
static dt_result dt__ddp_half(dt_ddp *d, int i, float *g, int64_t cnt) {
    int bf = d->desc.compress == DT_DDP_BF16;
    float counts[2];
    int64_t j;
    dt_result r;
    if (i == 0) {
        counts[0] = d->active ? (float)d->acc_samples : 0.0f;
        counts[1] = (float)d->active;
        if ((r = dt_comm_allreduce(d->comm, counts, 2, DT_F32, DT_SUM, d->desc.algo)) != DT_OK) return r;
        if ((r = dt__ddp_counts(d, counts[0], counts[1])) != DT_OK) return r;
    }
    for (j = 0; j < cnt; j++) d->half[j] = bf ? dt_bf16_from_float(g[j]) : dt_f16_from_float(g[j]);
    if ((r = dt_comm_allreduce(d->comm, d->half, (size_t)cnt, bf ? DT_BF16 : DT_F16, DT_SUM, d->desc.algo)) != DT_OK) return r;
    for (j = 0; j < cnt; j++) g[j] = bf ? dt_bf16_to_float(d->half[j]) : dt_f16_to_float(d->half[j]);
    return DT_OK;
}

/* TOPK's k for a slice of cnt elements. */
static int64_t dt__ddp_topk_k(const dt_ddp *d, int64_t cnt) {
    int64_t k = (int64_t)ceil(d->desc.topk_ratio * (double)cnt);
    return k < 1 ? 1 : k > cnt ? cnt : k;
}

/* TOPK: residual + slice, its top k as pairs in an all-gather with the counts after them (a rank without
   data sends k zeros and keeps its residual), the rest kept as the residual; then everyone's pairs summed
   into the zeroed slice in rank order. wire: [k indices][k values' bits][samples' bits][active]. */
static dt_result dt__ddp_topk(dt_ddp *d, int i, float *g, int64_t off, int64_t cnt) {
    int64_t k = dt__ddp_topk_k(d, cnt), w = 2 * k + 2, j;
    int p = d->comm->size, q;
    float *res = d->residual ? d->residual + off : NULL, v, total = 0.0f, nactive = 0.0f;
    dt_result r;
    if (d->active) {
        if (res) for (j = 0; j < cnt; j++) g[j] += res[j];
        dt_topk_split(g, cnt, k, d->sel_idx, d->sel_val);
        if (res) memcpy(res, g, sizeof(float) * (size_t)cnt);
    } else {
        memset(d->sel_idx, 0, sizeof(int32_t) * (size_t)k);
        memset(d->sel_val, 0, sizeof(float) * (size_t)k);
    }
    v = d->active ? (float)d->acc_samples : 0.0f;
    memcpy(d->wire, d->sel_idx, sizeof(int32_t) * (size_t)k);
    memcpy(d->wire + k, d->sel_val, sizeof(float) * (size_t)k);
    memcpy(d->wire + 2 * k, &v, sizeof v);
    d->wire[2 * k + 1] = d->active;
    if ((r = dt_comm_allgather(d->comm, d->wire, d->gathered_wire, (size_t)w, DT_I32)) != DT_OK) return r;
    memset(g, 0, sizeof(float) * (size_t)cnt);
    for (q = 0; q < p; q++) {
        const int32_t *pw = d->gathered_wire + (int64_t)q * w;
        for (j = 0; j < k; j++) {
            memcpy(&v, pw + k + j, sizeof v);
            g[pw[j]] += v;
        }
        memcpy(&v, pw + 2 * k, sizeof v);
        total += v;
        nactive += (float)pw[2 * k + 1];
    }
    return i == 0 ? dt__ddp_counts(d, total, nactive) : DT_OK;
}

/* POWERSGD: tensor t (in d->toff's order) is a matrix [rows, cols] to compress when rank r saves bytes:
   (rows + cols) r < rows cols; its Q [cols, r] starts at d->qoff[t] in d->psq. */
static int dt__psgd_matrix(const dt_ddp *d, int t) { return d->mrows[t] > 0; }

/* P [rows, r]: its columns made orthonormal in order (Gram-Schmidt, sums in double: the same bits on
   every rank, which all hold the same summed P). A column that vanishes stays zero. */
static void dt__psgd_orthonormalize(float *P, int64_t rows, int r) {
    int c, j;
    int64_t i;
    for (c = 0; c < r; c++) {
        double norm = 0.0;
        for (j = 0; j < c; j++) {
            double dot = 0.0;
            for (i = 0; i < rows; i++) dot += (double)P[i * r + c] * (double)P[i * r + j];
            for (i = 0; i < rows; i++) P[i * r + c] -= (float)dot * P[i * r + j];
        }
        for (i = 0; i < rows; i++) norm += (double)P[i * r + c] * (double)P[i * r + c];
        if (norm > 0.0)
            for (i = 0; i < rows; i++) P[i * r + c] = (float)((double)P[i * r + c] / sqrt(norm));
    }
}

/* The tensors of slice [off, off + cnt): their positions in d->toff's order, first..last. */
static void dt__psgd_tensors(const dt_ddp *d, int64_t off, int64_t cnt, int *first, int *last) {
    int t;
    *first = d->ntensors;
    *last = -1;
    for (t = 0; t < d->ntensors; t++)
        if (d->toff[t] >= off && d->toff[t] < off + cnt) {
            if (t < *first) *first = t;
            *last = t;
        }
}

/* POWERSGD (Vogels et al. 2019), one power iteration per step with Q warm-started from the last:
   M = slice + residual for each matrix tensor; P = M Q summed over the ranks (with the vectors, sent as
   they are, and the first collective's counts in the same all-reduce), orthonormalized; Q = M^T P summed;
   the slice becomes P Q^T (the sum of the ranks' projections), the residual M - P Q^T / p. */
static dt_result dt__ddp_powersgd(dt_ddp *d, int i, int64_t off, int64_t cnt) {
    int r = d->desc.powersgd_rank, p = d->comm->size, t, first, last, c;
    int fb = d->residual != NULL && !d->desc.no_feedback && d->active;
    float *grads = d->model->grads, *buf = d->psbuf, *q0;
    int64_t pos = 0, a, b, nq = 0;
    dt_result rr;
    dt__psgd_tensors(d, off, cnt, &first, &last);
    for (t = first; t <= last; t++) {   /* P = M Q, or the vector as it is */
        float *M = grads + d->toff[t];
        if (!dt__psgd_matrix(d, t)) {
            memcpy(buf + pos, M, sizeof(float) * (size_t)d->tcnt[t]);
            pos += d->tcnt[t];
            continue;
        }
        if (fb) for (a = 0; a < d->tcnt[t]; a++) M[a] += d->residual[d->toff[t] + a];
        for (a = 0; a < d->mrows[t]; a++)
            for (c = 0; c < r; c++) {
                float s = 0.0f;
                for (b = 0; b < d->mcols[t]; b++) s += M[a * d->mcols[t] + b] * d->psq[d->qoff[t] + b * r + c];
                buf[pos + a * r + c] = s;
            }
        pos += d->mrows[t] * r;
        nq += d->mcols[t] * r;
    }
    if (i == 0) { buf[pos] = d->active ? (float)d->acc_samples : 0.0f; buf[pos + 1] = (float)d->active; }
    if ((rr = dt_comm_allreduce(d->comm, buf, (size_t)(pos + (i == 0 ? 2 : 0)), DT_F32, DT_SUM, d->desc.algo)) != DT_OK) return rr;
    if (i == 0 && (rr = dt__ddp_counts(d, buf[pos], buf[pos + 1])) != DT_OK) return rr;
    for (t = first, pos = 0; t <= last; t++) {   /* Q = M^T P with P orthonormal; vectors: their sum */
        float *M = grads + d->toff[t], *P = buf + pos, *Q = d->psq + d->qoff[t];
        if (!dt__psgd_matrix(d, t)) {
            memcpy(M, buf + pos, sizeof(float) * (size_t)d->tcnt[t]);
            pos += d->tcnt[t];
            continue;
        }
        dt__psgd_orthonormalize(P, d->mrows[t], r);
        for (b = 0; b < d->mcols[t] * r; b++) Q[b] = 0.0f;
        for (a = 0; a < d->mrows[t]; a++)
            for (b = 0; b < d->mcols[t]; b++)
                for (c = 0; c < r; c++) Q[b * r + c] += M[a * d->mcols[t] + b] * P[a * r + c];
        pos += d->mrows[t] * r;
    }
    if (nq == 0) return DT_OK;
    q0 = d->psq + d->qoff[first];   /* the slice's Qs are consecutive (a vector's qoff is the next matrix's) */
    if ((rr = dt_comm_allreduce(d->comm, q0, (size_t)nq, DT_F32, DT_SUM, d->desc.algo)) != DT_OK) return rr;
    for (t = first, pos = 0; t <= last; t++) {   /* the slice: P Q^T; the residual: what this rank's M kept */
        float *M = grads + d->toff[t], *P = buf + pos, *Q = d->psq + d->qoff[t];
        if (!dt__psgd_matrix(d, t)) { pos += d->tcnt[t]; continue; }
        for (a = 0; a < d->mrows[t]; a++)
            for (b = 0; b < d->mcols[t]; b++) {
                float s = 0.0f;
                for (c = 0; c < r; c++) s += P[a * r + c] * Q[b * r + c];
                if (fb) d->residual[d->toff[t] + a * d->mcols[t] + b] = M[a * d->mcols[t] + b] - s / (float)p;
                M[a * d->mcols[t] + b] = s;
            }
        pos += d->mrows[t] * r;
    }
    return DT_OK;
}

/* Weighs this rank's gradients of collective i and sums them over the ranks; the first collective goes
   through carry with this rank's samples and activity after the slice. */
static dt_result dt__ddp_reduce(dt_ddp *d, int i) {
    int64_t off, cnt, j;
    float *g;
    dt_result r;
    dt__ddp_slice(d, i, &off, &cnt);
    g = d->model->grads + off;
    if (d->scale != 1.0f)
        for (j = 0; j < cnt; j++) g[j] *= d->scale;
    if (d->comm->size == 1) return DT_OK;
    if (d->desc.compress == DT_DDP_TOPK) return dt__ddp_topk(d, i, g, off, cnt);
    if (d->desc.compress == DT_DDP_POWERSGD) return dt__ddp_powersgd(d, i, off, cnt);
    if (d->desc.compress != DT_DDP_FP32) return dt__ddp_half(d, i, g, cnt);
    if (i > 0) return dt__ddp_sum(d, g, cnt);
    memcpy(d->carry, g, sizeof(float) * (size_t)cnt);
    d->carry[cnt] = d->active ? (float)d->acc_samples : 0.0f;
    d->carry[cnt + 1] = (float)d->active;
    if ((r = dt__ddp_sum(d, d->carry, cnt + 2)) != DT_OK) return r;
    memcpy(g, d->carry, sizeof(float) * (size_t)cnt);
    return dt__ddp_counts(d, d->carry[cnt], d->carry[cnt + 1]);
}

/* The whole sequence; everyone stops after the first collective once no rank has data. */
static dt_result dt__ddp_reduce_all(dt_ddp *d) {
    dt_result r = DT_OK;
    int i, n = dt__ddp_ncoll(d);
    for (i = 0; i < n && r == DT_OK; i++) {
        r = dt__ddp_reduce(d, i);
        if (i == 0 && r == DT_OK && d->nactive == 0) break;
    }
    return r;
}

#if DT__HAVE_THREADS
static void dt__ddp_helper(void *arg) {
    dt_ddp *d = (dt_ddp *)arg;
    dt__tls_rank = d->tls_rank;
    dt__tls_trace = d->trace;
    dt__mutex_lock(&d->mu);
    for (;;) {
        int b;
        while (!d->quit && !d->job) dt__cond_wait(&d->cv, &d->mu);
        if (d->quit) break;
        for (b = 0; b < d->nbuckets && d->herr == DT_OK; b++) {
            dt_result r;
            while (d->ready > d->boff[b]) dt__cond_wait(&d->cv, &d->mu);
            d->stats.early_buckets += !d->bw_done;   /* the caller's thread reads stats only once job is 0 */
            dt__mutex_unlock(&d->mu);
            dt_trace_begin("bucket", "comm");
            dt__trace_arg("bucket", NULL, b);
            dt__trace_arg("bytes", NULL, d->bcnt[b] * (int64_t)sizeof(float));
            r = dt__ddp_reduce(d, b);
            dt_trace_end();
            dt__mutex_lock(&d->mu);
            if (r != DT_OK) {
                d->herr = r;
                snprintf(d->hmsg, sizeof d->hmsg, "%s", dt_last_error());
            }
        }
        d->job = 0;
        dt__cond_broadcast(&d->cv);
    }
    dt__mutex_unlock(&d->mu);
}

static void dt__ddp_hook(void *user, dt_model *m, int node) {
    dt_ddp *d = (dt_ddp *)user;
    (void)m;
    if (!d->in_sync || d->ready_at[node] >= d->ready_seen) return;
    d->ready_seen = d->ready_at[node];
    dt__mutex_lock(&d->mu);
    d->ready = d->ready_seen;
    dt__cond_broadcast(&d->cv);
    dt__mutex_unlock(&d->mu);
}
#endif

static void dt__ddp_free(dt_ddp *d) {
    DT_FREE(d->toff); DT_FREE(d->tcnt); DT_FREE(d->boff); DT_FREE(d->bcnt); DT_FREE(d->ready_at);
    DT_FREE(d->gathered); DT_FREE(d->reqs); DT_FREE(d->carry);
    DT_FREE(d->half); DT_FREE(d->residual); DT_FREE(d->sel_idx); DT_FREE(d->sel_val); DT_FREE(d->wire);
    DT_FREE(d->gathered_wire); DT_FREE(d->mrows); DT_FREE(d->mcols); DT_FREE(d->qoff); DT_FREE(d->psbuf);
    DT_FREE(d);
}

/* Tensors last first, buckets of whole tensors from the end, and where each node's backward leaves the
   final gradients. */
static dt_result dt__ddp_plan(dt_ddp *d) {
    dt_model *m = d->model;
    int nt = dt_model_param_tensors(m), nodes = dt_model_nodes(m), i, nb = 0;
    int64_t cap = d->desc.bucket_bytes / (int64_t)sizeof(float), have = 0;
    d->ntensors = nt;
    d->toff = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->tcnt = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->boff = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->bcnt = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->ready_at = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nodes + 1));
    if (!d->toff || !d->tcnt || !d->boff || !d->bcnt || !d->ready_at) return DT_ERR_OUT_OF_MEMORY;
    for (i = 0; i < nodes; i++) d->ready_at[i] = d->n;
    for (i = 0; i < nt; i++) {
        dt_param_info pi = dt_model_param_info(m, nt - 1 - i);
        d->toff[i] = pi.offset;
        d->tcnt[i] = pi.count;
        if (pi.offset < d->ready_at[pi.node]) d->ready_at[pi.node] = pi.offset;
    }
    for (i = nodes - 2; i >= 0; i--)   /* node i's backward comes after every later node's */
        if (d->ready_at[i + 1] < d->ready_at[i]) d->ready_at[i] = d->ready_at[i + 1];
    for (i = 0; i < nt; i++) {         /* tensors are consecutive: a bucket is [its last tensor's offset, previous start) */
        if (have == 0) { d->bcnt[nb] = 0; nb++; }
        d->boff[nb - 1] = d->toff[i];
        d->bcnt[nb - 1] += d->tcnt[i];
        have += d->tcnt[i];
        if (have >= cap) have = 0;
    }
    d->nbuckets = d->desc.method == DT_DDP_BUCKETS ? nb : 0;
    return DT_OK;
}

dt_result dt_ddp_broadcast_params(dt_ddp *d) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_broadcast_params: ddp is NULL");
    return dt__same_model(d->comm, d->model, "dt_ddp_broadcast_params", 1);
}

/* The compression settings: a known kind, a ratio in (0, 1], an all-reduce method; fills in the default ratio. */
static dt_result dt__ddp_compress_check(dt_ddp_desc *dd, const dt_model *m, int me) {
    if (dd->compress < 0 || dd->compress >= DT_DDP_COMPRESS_COUNT || !(dd->topk_ratio >= 0.0 && dd->topk_ratio <= 1.0))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: bad desc (compress %d, topk_ratio %g): compress is a "
                            "dt_ddp_compress, topk_ratio in (0, 1] (0: %g)", me, (int)dd->compress, dd->topk_ratio, DT_DDP_TOPK_RATIO);
    if (dd->compress != DT_DDP_FP32 && (dd->method == DT_DDP_PARAM_SERVER || dd->method == DT_DDP_P2P))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: compression (%s) works with the all-reduce methods: use "
                            "--sync buckets, flat or per-layer, not %s", me, dt_ddp_compress_name(dd->compress), dt_ddp_method_name(dd->method));
    if (dd->compress == DT_DDP_TOPK && m->nparams > INT32_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: top-k sends 32-bit indices, but the model has %lld "
                            "parameters: use bf16", me, (long long)m->nparams);
    if (dd->powersgd_rank < 0 || dd->powersgd_rank > 1024)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: powersgd_rank %d: give a rank from 1 to 1024 (0: %d)", me,
                            dd->powersgd_rank, DT_DDP_POWERSGD_RANK);
    if (dd->topk_ratio == 0.0) dd->topk_ratio = DT_DDP_TOPK_RATIO;
    if (dd->powersgd_rank == 0) dd->powersgd_rank = DT_DDP_POWERSGD_RANK;
    return DT_OK;
}

/* POWERSGD's plan: which tensors are matrices, where their Qs go, the largest slice's all-reduce; the
   residual (zeros) and the Qs (seeded, the same on every rank) in one block. */
static dt_result dt__psgd_alloc(dt_ddp *d) {
    int nt = d->ntensors, r = d->desc.powersgd_rank, t, i, first, last;
    int64_t q = 0, most = 0, off, cnt, j;
    dt_rng g;
    d->mrows = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->mcols = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->qoff = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    if (!d->mrows || !d->mcols || !d->qoff) return DT_ERR_OUT_OF_MEMORY;
    for (t = 0; t < nt; t++) {
        dt_param_info pi = dt_model_param_info(d->model, nt - 1 - t);
        int64_t rows = pi.ndim >= 2 ? pi.shape[0] : 0, cols = rows > 0 ? pi.count / rows : 0;
        int mat = rows > 0 && (rows + cols) * r < rows * cols;
        d->mrows[t] = mat ? rows : 0;
        d->mcols[t] = mat ? cols : 0;
        d->qoff[t] = q;
        q += mat ? cols * r : 0;
    }
    d->qoff[nt] = q;
    for (i = 0; i < dt__ddp_ncoll(d); i++) {   /* the slice's Ps and vectors */
        int64_t w = 2;
        dt__ddp_slice(d, i, &off, &cnt);
        dt__psgd_tensors(d, off, cnt, &first, &last);
        for (t = first; t <= last; t++) w += d->mrows[t] ? d->mrows[t] * r : d->tcnt[t];
        most = w > most ? w : most;
    }
    d->nstate = d->n + q;
    d->psbuf = (float *)DT_MALLOC(sizeof(float) * (size_t)most);
    if (!d->psbuf || !(d->residual = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->nstate + 1)))) return DT_ERR_OUT_OF_MEMORY;
    memset(d->residual, 0, sizeof(float) * (size_t)d->n);
    d->psq = d->residual + d->n;
    dt_rng_init(&g, 0x9057cdULL, 0);
    for (j = 0; j < q; j++) d->psq[j] = (float)dt_rng_u32(&g) / 4294967296.0f * 2.0f - 1.0f;
    return DT_OK;
}

/* The compression's buffers, sized for the largest slice of a sync; the residual starts at zero. */
static dt_result dt__ddp_compress_alloc(dt_ddp *d) {
    int64_t most = 0, off, cnt, k;
    int i, p = d->comm->size;
    for (i = 0; i < dt__ddp_ncoll(d); i++) {
        dt__ddp_slice(d, i, &off, &cnt);
        most = cnt > most ? cnt : most;
    }
    if (d->desc.compress == DT_DDP_BF16 || d->desc.compress == DT_DDP_FP16)
        return (d->half = (uint16_t *)DT_MALLOC(sizeof(uint16_t) * (size_t)(most + 1))) ? DT_OK : DT_ERR_OUT_OF_MEMORY;
    if (d->desc.compress == DT_DDP_POWERSGD) return dt__psgd_alloc(d);
    if (d->desc.compress != DT_DDP_TOPK) return DT_OK;
    d->nstate = d->desc.no_feedback ? 0 : d->n;
    k = dt__ddp_topk_k(d, most);
    d->sel_idx = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)k);
    d->sel_val = (float *)DT_MALLOC(sizeof(float) * (size_t)k);
    d->wire = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)(2 * k + 2));
    d->gathered_wire = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)p * (size_t)(2 * k + 2));
    if (!d->desc.no_feedback && (d->residual = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + 1))) != NULL)
        memset(d->residual, 0, sizeof(float) * (size_t)(d->n + 1));
    return d->sel_idx && d->sel_val && d->wire && d->gathered_wire && (d->desc.no_feedback || d->residual) ? DT_OK : DT_ERR_OUT_OF_MEMORY;
}

dt_result dt_ddp_create(dt_ddp **out, dt_comm *c, dt_model *m, const dt_ddp_desc *desc) {
    dt_ddp_desc dd;
    dt_ddp *d;
    dt_result r;
    int me = dt_comm_rank(c);
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_ddp_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (dd.method < 0 || dd.method >= DT_DDP_METHOD_COUNT || dd.algo < 0 || dd.algo >= DT_ALGO_COUNT || dd.bucket_bytes < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: bad desc (method %d, algo %d, bucket_bytes %lld): "
                            "method is a dt_ddp_method, algo a dt_algo, bucket_bytes >= 0", me, (int)dd.method,
                            (int)dd.algo, (long long)dd.bucket_bytes);
    if (!dd.bucket_bytes) dd.bucket_bytes = DT_DDP_BUCKET_BYTES;
    if ((r = dt__ddp_compress_check(&dd, m, me)) != DT_OK) return r;
    if (!(d = (dt_ddp *)DT_MALLOC(sizeof *d))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory", me);
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->desc = dd;
    d->n = m->nparams;
    d->tls_rank = dt__tls_rank;
    d->trace = dt__trace_lane_of(1);
    if (dt__ddp_plan(d) != DT_OK) {
        dt__ddp_free(d);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for the plan", me);
    }
    if (c->size > 1) {   /* the first collective's slice and the two counts after it */
        int64_t off, cnt;
        dt__ddp_slice(d, 0, &off, &cnt);
        if (!(d->carry = (float *)DT_MALLOC(sizeof(float) * (size_t)(cnt + 2)))) {
            dt__ddp_free(d);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for %lld floats", me, (long long)cnt + 2);
        }
    }
    if ((dd.method == DT_DDP_PARAM_SERVER || dd.method == DT_DDP_P2P) && me == 0 && c->size > 1) {
        d->gathered = (float *)DT_MALLOC(sizeof(float) * (size_t)(c->size * (d->n + 2)));
        d->reqs = (dt_request *)DT_MALLOC(sizeof(dt_request) * (size_t)c->size);
        if (!d->gathered || !d->reqs) {
            dt__ddp_free(d);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank 0: no memory to gather %d gradients of %lld floats "
                                "(the parameter server's buffer); use --sync flat or buckets", c->size, (long long)m->nparams);
        }
    }
    if (c->size > 1 && dt__ddp_compress_alloc(d) != DT_OK) {
        dt__ddp_free(d);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for the %s buffers", me, dt_ddp_compress_name(dd.compress));
    }
    if ((r = dt__same_model(c, m, "dt_ddp_create", 1)) != DT_OK) { dt__ddp_free(d); return r; }
    /* the helper thread calls the communicator: where its backend allows that (local ranks; MPI at
       MPI_THREAD_SERIALIZED or above) */
#if DT__HAVE_THREADS
    if (dd.method == DT_DDP_BUCKETS && !dd.no_overlap && c->size > 1 && d->nbuckets > 0 && !dt__comm_any_thread(c)) {
        dt_log(DT_LOG_WARN, "dt_ddp_create: rank %d: the %s communicator may be called only by the thread that created it "
               "(MPI: initialised below MPI_THREAD_SERIALIZED), so buckets are reduced after backward; for overlap, "
               "initialise MPI with MPI_THREAD_SERIALIZED (dt_launch does)", me, dt_comm_backend_name(c));
    } else if (dd.method == DT_DDP_BUCKETS && !dd.no_overlap && c->size > 1 && d->nbuckets > 0) {
        if (dt__mutex_init(&d->mu) == 0 && dt__cond_init(&d->cv) == 0 && dt__thread_start(&d->thread, dt__ddp_helper, d) == 0) {
            d->overlap = 1;
            dt_model_set_backward_hook(m, dt__ddp_hook, d);
        } else {
            dt_log(DT_LOG_WARN, "dt_ddp_create: rank %d: could not start the helper thread; buckets are reduced after backward", me);
        }
    }
#endif
    *out = d;
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
    if (!d) return;
#if DT__HAVE_THREADS
    if (d->overlap) {
        dt__mutex_lock(&d->mu);
        d->quit = 1;
        dt__cond_broadcast(&d->cv);
        dt__mutex_unlock(&d->mu);
        dt__thread_join(&d->thread);
        dt__cond_destroy(&d->cv);
        dt__mutex_destroy(&d->mu);
    }
#endif
    if (d->model->hook_user == d) dt_model_set_backward_hook(d->model, NULL, NULL);
    dt__ddp_free(d);
}

static dt_result dt__ddp_bad(const dt_ddp *d, int64_t samples, const char *what) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "%s: ddp is NULL", what);
    if (samples <= 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d: samples is %lld; give the batch's sample count (> 0)", what,
                            d->comm->rank, (long long)samples);
    return DT_OK;
}

/* After the sum: the division by all samples, buffers if asked, counters, and a fresh accumulation. */
static dt_result dt__ddp_done(dt_ddp *d, dt_result r, double t0) {
    float *g = d->model->grads, total = (float)d->total;
    int64_t j;
    if (r == DT_OK && d->comm->size > 1 && total > 0)
        for (j = 0; j < d->n; j++) g[j] /= total;
    if (r == DT_OK && d->desc.sync_buffers) r = dt_ddp_sync_buffers(d);
    d->stats.comm_seconds += dt_time_now() - t0;
    d->stats.syncs += r == DT_OK;
    d->acc_samples = d->last_samples = 0;
    return r;
}

dt_result dt_ddp_sync(dt_ddp *d, int64_t samples) {
    dt_result r;
    double t0 = dt_time_now();
    if ((r = dt__ddp_bad(d, samples, "dt_ddp_sync")) != DT_OK) return r;
    d->acc_samples = d->last_samples = samples;
    dt_trace_begin("ddp sync", "comm");
    dt__ddp_begin(d, 1);
    r = dt__ddp_reduce_all(d);
    dt_trace_end();
    return dt__ddp_done(d, r, t0);
}

dt_result dt_ddp_backward(dt_ddp *d, const float *dy, int64_t samples, int sync) {
    dt_result r, rb;
    int64_t j;
    double t0;
    if ((r = dt__ddp_bad(d, samples, "dt_ddp_backward")) != DT_OK) return r;
    if (d->last_samples > 0 && d->last_samples != samples) {   /* keep the buffer = sum of gradients / samples */
        float f = (float)((double)d->last_samples / (double)samples);
        for (j = 0; j < d->n; j++) d->model->grads[j] *= f;
    }
    d->acc_samples += samples;
    d->last_samples = samples;
    if (!sync) return dt_model_backward(d->model, dy);
    dt__ddp_begin(d, 1);
    if (!d->overlap) {
        if ((rb = dt_model_backward(d->model, dy)) != DT_OK) return rb;
        t0 = dt_time_now();
        dt_trace_begin("ddp sync", "comm");
        r = dt__ddp_reduce_all(d);
        dt_trace_end();
        return dt__ddp_done(d, r, t0);
    }
    /* hand the communicator to the helper, run backward, then wait for the buckets backward did not hide */
    dt__mutex_lock(&d->mu);
    d->ready = d->ready_seen = d->n;
    d->herr = DT_OK;
    d->job = 1;
    d->bw_done = 0;
    dt__cond_broadcast(&d->cv);
    dt__mutex_unlock(&d->mu);
    d->in_sync = 1;
    rb = dt_model_backward(d->model, dy);
    t0 = dt_time_now();   /* from here on the caller's thread waits for communication */
    d->in_sync = 0;
    dt_trace_begin("wait for buckets", "comm");   /* the communication backward did not hide */
    dt__mutex_lock(&d->mu);
    d->ready = 0;
    d->bw_done = 1;
    dt__cond_broadcast(&d->cv);
    while (d->job) dt__cond_wait(&d->cv, &d->mu);
    r = d->herr;
    dt__mutex_unlock(&d->mu);
    dt_trace_end();
    if (rb != DT_OK) return rb;
    if (r != DT_OK) snprintf(dt__errmsg, sizeof dt__errmsg, "%s", d->hmsg);
    return dt__ddp_done(d, r, t0);
}

/* dt_ddp_join's rounds: until no rank has data, the others' syncs with a zero gradient. */
static dt_result dt__ddp_join_rounds(dt_ddp *d, dt_optim *o) {
    dt_result r;
    for (;;) {
        double t0 = dt_time_now();
        dt_model_zero_grad(d->model);
        dt__ddp_begin(d, 0);
        r = dt__ddp_reduce_all(d);
        if (r == DT_OK && d->nactive == 0) { d->stats.comm_seconds += dt_time_now() - t0; return DT_OK; }   /* everyone has joined */
        if ((r = dt__ddp_done(d, r, t0)) != DT_OK) return r;
        d->stats.syncs--;
        d->stats.joined_rounds++;
        if (o && (r = dt_optim_step(o)) != DT_OK) return r;
        dt_model_zero_grad(d->model);
    }
}
dt_result dt_ddp_join(dt_ddp *d, dt_optim *o) {
    int mark = dt__trace_mark();
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_join: ddp is NULL");
    if (d->acc_samples)
        return dt_set_error(DT_ERR_STATE, "dt_ddp_join: rank %d has %lld samples accumulated but not synced: pass sync = 1 "
                            "to dt_ddp_backward on the last batch", d->comm->rank, (long long)d->acc_samples);
    dt_trace_begin("ddp join", "comm");
    return dt__trace_close(mark, dt__ddp_join_rounds(d, o));
}

dt_result dt_ddp_sync_buffers(dt_ddp *d) {
    int64_t nb = 0;
    float *b;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_sync_buffers: ddp is NULL");
    b = dt_model_buffers(d->model, &nb);
    if (nb == 0 || d->comm->size == 1) return DT_OK;
    return dt_comm_allreduce(d->comm, b, (size_t)nb, DT_F32, DT_MEAN, d->desc.algo);
}

dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d) {
    dt_ddp_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

int dt_ddp_buckets(const dt_ddp *d) { return d ? d->nbuckets : 0; }
const float *dt_ddp_residual(const dt_ddp *d, int64_t *n) {
    int has = d && d->residual && !d->desc.no_feedback;
    if (n) *n = has ? d->n : 0;
    return has ? d->residual : NULL;
}
int dt_ddp_overlapped(const dt_ddp *d) { return d ? d->overlap : 0; }
int64_t dt_ddp_bucket_bytes(const dt_ddp *d, int i) {
    return d && i >= 0 && i < d->nbuckets ? d->bcnt[i] * (int64_t)sizeof(float) : 0;
}

dt_result dt_ddp_save(dt_ddp *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta) {
    dt_result pre = DT_OK;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_save: ddp is NULL");
    if (d->acc_samples)
        pre = dt_set_error(DT_ERR_STATE, "dt_ddp_save: rank %d: the gradient of %lld samples is accumulated but not synchronised, "
                           "and a checkpoint holds no gradients: save after a step that synchronised", d->comm->rank,
                           (long long)d->acc_samples);
    return dt__ckpt_save_extra(d->comm, "dt_ddp_save", DT__CKPT_DDP, path, d->model, o, meta, 0, d->residual, d->nstate, pre);
}

dt_result dt_ddp_load(dt_ddp *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta) {
    dt_result r;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_load: ddp is NULL");
    r = dt__ckpt_load_extra(d->comm, "dt_ddp_load", DT__CKPT_DDP, path, d->model, o, meta, NULL, d->residual, d->nstate, DT_OK);
    if (r == DT_OK) d->acc_samples = d->last_samples = 0;
    return r;
}

/* ---- D-PSGD ------------------------------------------------------------------------------------
   One neighbour exchange per step sends the replica (n floats) to each neighbour and receives theirs
   into recv. The mix sums W[i][j] x_j over a fixed list (the ranks j = 0, 1, ... with an edge to i, and i
   itself in its place), in double, then adds the local update x_i' - x_i (zero when nothing stepped in
   between), so with the fully connected topology every rank computes the same average bit for bit.
   With a schedule the row of W, the neighbour lists and the room for their replicas follow the step's
   graph (dt__dpsgd_use_graph), after every rank has checked that graph the same way: a bad one stops every
   rank before any message, so none waits for a neighbour that refused. */

static const char *const dt__dpsgd_order_names[DT_DPSGD_ORDER_COUNT] = {"cta", "atc"};
const char *dt_dpsgd_order_name(dt_dpsgd_order k) { return dt__enum_name(dt__dpsgd_order_names, DT_DPSGD_ORDER_COUNT, (int)k); }

dt_result dt_dpsgd_order_parse(const char *s, dt_dpsgd_order *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__dpsgd_order_names, DT_DPSGD_ORDER_COUNT, s, &k, "D-PSGD order (cta: combine then adapt, atc: adapt then combine)");
    if (r == DT_OK && out) *out = (dt_dpsgd_order)k;
    return r;
}

struct dt_dpsgd {
    dt_comm           *comm;
    dt_model          *model;
    dt_dpsgd_desc      desc;
    int64_t            n, nb;       /* parameters, buffers */
    int64_t            step;        /* the next step's number: the schedule's t, kept in checkpoints */
    int                deg;         /* neighbours of this rank in the current graph */
    int                cap;         /* neighbours that w, src and recv have room for */
    const int         *nbrs;        /* [deg] ascending (the graph's) */
    double            *w;           /* [deg + 1] W[i][j] in mixing order (j ascending, i in its place) */
    int                self_at;     /* position of this rank in that order */
    const float      **src;         /* [deg + 1] the replicas being mixed */
    float             *recv;        /* [cap * max(n, nb)] the neighbours' replicas */
    float             *own;         /* [max(n, nb)] this rank's replica as sent */
    float             *keep;        /* [n + nb] the replica kept aside by dt_dpsgd_use_average */
    float             *avg;         /* [n + nb] the mean, for consensus and averages */
    int                using_avg;
    dt_dpsgd_stats     stats;
};

static void dt__dpsgd_free(dt_dpsgd *d) {
    DT_FREE(d->w);
    DT_FREE((void *)d->src);
    DT_FREE(d->recv);
    DT_FREE(d->own);
    DT_FREE(d->keep);
    DT_FREE(d->avg);
    DT_FREE(d);
}

/* Sends own [cnt] to the neighbours, then x[k] = sum_j W[i][j] x_j[k] + (x[k] - own[k]). */
static dt_result dt__dpsgd_gossip(dt_dpsgd *d, float *x, const float *own, int64_t cnt) {
    int q, m = d->deg + 1;
    int64_t k;
    uint64_t b0 = d->comm->stats.bytes_sent;
    double t0 = dt_time_now();
    dt_result r = dt_comm_neighbor_exchange(d->comm, own, d->recv, (size_t)cnt, DT_F32, d->nbrs, d->deg, d->nbrs, d->deg);
    d->stats.comm_seconds += dt_time_now() - t0;
    d->stats.bytes_sent += d->comm->stats.bytes_sent - b0;
    if (r != DT_OK) return r;
    for (q = 0; q < m; q++) d->src[q] = q == d->self_at ? own : d->recv + (int64_t)(q - (q > d->self_at)) * cnt;
    dt_trace_begin("gossip mix", "optim");
    DT__OMP(parallel for if (cnt * m > DT__PAR_MIN))
    for (k = 0; k < cnt; k++) {
        double acc = 0.0;
        int j;
        for (j = 0; j < m; j++) acc += d->w[j] * (double)d->src[j][k];
        x[k] = (float)(acc + ((double)x[k] - (double)own[k]));
    }
    dt_trace_end();
    return DT_OK;
}

/* Takes this rank's row of graph g for the next exchanges: its neighbours, their weights in mixing order
   and room for their replicas (grown when g has more neighbours than any graph before). */
static dt_result dt__dpsgd_use_graph(dt_dpsgd *d, const dt_topology *g) {
    int me = d->comm->rank, deg = g->offsets[me + 1] - g->offsets[me], q;
    int64_t big = d->n > d->nb ? d->n : d->nb;
    if (deg > d->cap || !d->w) {
        double *w = (double *)DT_REALLOC(d->w, sizeof(double) * (size_t)(deg + 1));
        const float **src = w ? (const float **)DT_REALLOC((void *)d->src, sizeof(float *) * (size_t)(deg + 1)) : NULL;
        float *recv = src ? (float *)DT_REALLOC(d->recv, sizeof(float) * (size_t)(deg * big + 1)) : NULL;
        if (w) d->w = w;
        if (src) d->src = src;
        if (!recv)
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd: rank %d: no memory for %d neighbours' replicas of %lld floats",
                                me, deg, (long long)big);
        d->recv = recv;
        d->cap = deg;
    }
    d->deg = deg;
    d->nbrs = g->neighbors + g->offsets[me];
    d->self_at = d->deg;
    for (q = 0; q < d->deg; q++)
        if (d->nbrs[q] > me) { d->self_at = q; break; }
    for (q = 0; q <= d->deg; q++) {
        int j = q == d->self_at ? me : d->nbrs[q - (q > d->self_at)];
        d->w[q] = g->weights[(int64_t)me * g->world + j];
    }
    return DT_OK;
}

/* The schedule's graph of step t, checked (the union over the period is checked once, at create). */
static dt_result dt__dpsgd_graph_at(const dt_dpsgd *d, int64_t t, const char *fn, const dt_topology **g) {
    char who[96];
    if (!(*g = d->desc.schedule(t, d->desc.schedule_user)))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d: the schedule gave no graph (NULL) for step %lld", fn,
                            d->comm->rank, (long long)t);
    snprintf(who, sizeof who, "%s: rank %d: the schedule's graph of step %lld", fn, d->comm->rank, (long long)t);
    return dt_topology_check(*g, d->comm->size, who);
}

/* Checks the graphs of steps 0 .. period-1 and their union, and makes room for the most neighbours any has. */
static dt_result dt__dpsgd_schedule_start(dt_dpsgd *d) {
    const dt_topology **g = (const dt_topology **)DT_MALLOC(sizeof *g * (size_t)d->desc.period);
    dt_result r = g ? DT_OK : dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory", d->comm->rank);
    int q;
    for (q = 0; q < d->desc.period && r == DT_OK; q++) r = dt__dpsgd_graph_at(d, q, "dt_dpsgd_create", &g[q]);
    if (r == DT_OK) {
        char who[96];
        snprintf(who, sizeof who, "dt_dpsgd_create: rank %d: the schedule's graphs of steps 0 .. %d", d->comm->rank, d->desc.period - 1);
        r = dt_topology_check_union(g, d->desc.period, d->comm->size, who);
    }
    for (q = 0; q < d->desc.period && r == DT_OK; q++) r = dt__dpsgd_use_graph(d, g[q]);
    DT_FREE((void *)g);
    return r;
}

/* Collective: the mean of every rank's params and buffers into d->avg [n + nb]. */
static dt_result dt__dpsgd_mean(dt_dpsgd *d) {
    dt_result r;
    memcpy(d->avg, d->model->params, sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(d->avg + d->n, dt_model_buffers(d->model, NULL), sizeof(float) * (size_t)d->nb);
    if (d->comm->size == 1) return DT_OK;
    r = dt_comm_allreduce(d->comm, d->avg, (size_t)(d->n + d->nb), DT_F32, DT_MEAN, DT_ALGO_AUTO);
    return r;
}

dt_result dt_dpsgd_create(dt_dpsgd **out, dt_comm *c, dt_model *m, const dt_topology *t, const dt_dpsgd_desc *desc) {
    dt_dpsgd_desc dd;
    dt_dpsgd *d;
    dt_result r;
    int64_t big;
    int me = dt_comm_rank(c);
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_dpsgd_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (dd.schedule && t)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: both a topology and a schedule: give the topology NULL "
                            "when desc.schedule gives each step's graph", me);
    if (dd.schedule && dd.period < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: a schedule needs desc.period >= 1 (is %d): the steps "
                            "over which its graphs together connect every rank (e.g. dt_topology_schedule.period)", me, dd.period);
    if (!dd.schedule && (!t || !t->weights || !t->offsets))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: the topology is %s: build it with dt_topology_create", me,
                            t ? "empty" : "NULL");
    if (!dd.schedule && t->world != c->size)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: the topology has %d ranks but the communicator %d: "
                            "give dt_topology_desc.world = dt_comm_size(c)", me, t->world, c->size);
    if (dd.order < 0 || dd.order >= DT_DPSGD_ORDER_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: bad order %d: use a dt_dpsgd_order", me, (int)dd.order);
    if (!(d = (dt_dpsgd *)DT_MALLOC(sizeof *d))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory", me);
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->desc = dd;
    d->n = m->nparams;
    dt_model_buffers(m, &d->nb);
    big = d->n > d->nb ? d->n : d->nb;
    d->own = (float *)DT_MALLOC(sizeof(float) * (size_t)(big + 1));
    d->keep = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + d->nb + 1));
    d->avg = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + d->nb + 1));
    if (!d->own || !d->keep || !d->avg)
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory for the replicas of %lld floats", me, (long long)big);
    else r = dd.schedule ? dt__dpsgd_schedule_start(d) : dt__dpsgd_use_graph(d, t);
    if (r != DT_OK || (r = dt__same_model(c, m, "dt_dpsgd_create", 1)) != DT_OK) { dt__dpsgd_free(d); return r; }
    *out = d;
    return DT_OK;
}

void dt_dpsgd_destroy(dt_dpsgd *d) {
    if (d) dt__dpsgd_free(d);
}

dt_result dt_dpsgd_step(dt_dpsgd *d, dt_optim *o) {
    float *x;
    dt_result r;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_step: dpsgd is NULL");
    if (d->using_avg)
        return dt_set_error(DT_ERR_STATE, "dt_dpsgd_step: rank %d: the model holds the average: call dt_dpsgd_use_average(d, 0) "
                            "first", d->comm->rank);
    if (d->desc.schedule) {   /* this step's graph, before anything changes */
        const dt_topology *g;
        if ((r = dt__dpsgd_graph_at(d, d->step, "dt_dpsgd_step", &g)) != DT_OK || (r = dt__dpsgd_use_graph(d, g)) != DT_OK) return r;
    }
    x = d->model->params;
    if (o && d->desc.order == DT_DPSGD_ADAPT_THEN_COMBINE && (r = dt_optim_step(o)) != DT_OK) return r;
    memcpy(d->own, x, sizeof(float) * (size_t)d->n);
    if (o && d->desc.order == DT_DPSGD_COMBINE_THEN_ADAPT) {
        /* the update at the replica before averaging: x' = x - lr g(x); the mix adds x' - own */
        if ((r = dt_optim_step(o)) != DT_OK) return r;
    }
    if ((r = dt__dpsgd_gossip(d, x, d->own, d->n)) != DT_OK) return r;
    if (d->desc.mix_buffers && d->nb) {
        float *b = dt_model_buffers(d->model, NULL);
        memcpy(d->own, b, sizeof(float) * (size_t)d->nb);
        if ((r = dt__dpsgd_gossip(d, b, d->own, d->nb)) != DT_OK) return r;
    }
    d->step++;
    d->stats.steps++;
    return DT_OK;
}

dt_result dt_dpsgd_consensus(dt_dpsgd *d, double *dist) {
    double s = 0.0;
    int64_t k;
    dt_result r;
    if (!d || !dist) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_consensus: %s is NULL", d ? "dist" : "dpsgd");
    *dist = 0.0;
    if ((r = dt__dpsgd_mean(d)) != DT_OK) return r;
    for (k = 0; k < d->n; k++) {
        double e = (double)d->model->params[k] - (double)d->avg[k];
        s += e * e;
    }
    s = sqrt(s);
    if (d->comm->size > 1 && (r = dt_comm_allreduce(d->comm, &s, 1, DT_F64, DT_SUM, DT_ALGO_AUTO)) != DT_OK) return r;
    *dist = s / (double)d->comm->size;
    return DT_OK;
}

dt_result dt_dpsgd_average(dt_dpsgd *d, float *out) {
    dt_result r;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_average: dpsgd is NULL");
    if ((r = dt__dpsgd_mean(d)) != DT_OK) return r;
    if (out) { memcpy(out, d->avg, sizeof(float) * (size_t)d->n); return DT_OK; }
    memcpy(d->model->params, d->avg, sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(dt_model_buffers(d->model, NULL), d->avg + d->n, sizeof(float) * (size_t)d->nb);
    return DT_OK;
}

dt_result dt_dpsgd_use_average(dt_dpsgd *d, int use) {
    float *b;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_use_average: dpsgd is NULL");
    if (!!use == d->using_avg)
        return dt_set_error(DT_ERR_STATE, "dt_dpsgd_use_average: rank %d: the model %s the average already", d->comm->rank,
                            use ? "holds" : "does not hold");
    b = dt_model_buffers(d->model, NULL);
    if (!use) {
        memcpy(d->model->params, d->keep, sizeof(float) * (size_t)d->n);
        if (d->nb) memcpy(b, d->keep + d->n, sizeof(float) * (size_t)d->nb);
        d->using_avg = 0;
        return DT_OK;
    }
    memcpy(d->keep, d->model->params, sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(d->keep + d->n, b, sizeof(float) * (size_t)d->nb);
    d->using_avg = 1;
    return dt_dpsgd_average(d, NULL);
}

dt_dpsgd_stats dt_dpsgd_get_stats(const dt_dpsgd *d) {
    dt_dpsgd_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

/* The replica is the model's parameters, except while it holds the average. */
static dt_result dt__dpsgd_own_replica(const dt_dpsgd *d, const char *fn) {
    return d->using_avg ? dt_set_error(DT_ERR_STATE, "%s: rank %d: the model holds the average, not the replica: call "
                                       "dt_dpsgd_use_average(d, 0) first", fn, d->comm->rank) : DT_OK;
}

dt_result dt_dpsgd_save(dt_dpsgd *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_save: dpsgd is NULL");
    return dt__ckpt_save_comm(d->comm, "dt_dpsgd_save", DT__CKPT_DPSGD, path, d->model, o, meta, d->step,
                              dt__dpsgd_own_replica(d, "dt_dpsgd_save"));
}

dt_result dt_dpsgd_load(dt_dpsgd *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_load: dpsgd is NULL");
    return dt__ckpt_load_comm(d->comm, "dt_dpsgd_load", DT__CKPT_DPSGD, path, d->model, o, meta, &d->step,
                              dt__dpsgd_own_replica(d, "dt_dpsgd_load"));
}

/* ---- FedAvg ------------------------------------------------------------------------------------
   The aggregators are pure functions over the updates. The round protocol needs no agreement message:
   every rank draws the same clients and dropouts from (seed, round), so each host knows which clients to
   train and the server knows which updates to expect; it posts one receive per reporting client, in client
   order, which matches the order each host sends in (same tag, same source: messages keep their order). */

static const char *const dt__fed_agg_names[DT_FED_AGG_COUNT] = {"mean", "median", "trimmed", "krum", "multikrum", "classmean"};
const char *dt_fed_agg_name(dt_fed_agg k) { return dt__enum_name(dt__fed_agg_names, DT_FED_AGG_COUNT, (int)k); }

dt_result dt_fed_agg_parse(const char *s, dt_fed_agg *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__fed_agg_names, DT_FED_AGG_COUNT, s, &k, "aggregator");
    if (r == DT_OK && out) *out = (dt_fed_agg)k;
    return r;
}

/* Insertion sort: the columns are as short as the number of clients, and it is stable. */
static void dt__fed_sort(double *v, int n) {
    int i, j;
    for (i = 1; i < n; i++) {
        double x = v[i];
        for (j = i - 1; j >= 0 && v[j] > x; j--) v[j + 1] = v[j];
        v[j + 1] = x;
    }
}

static double dt__fed_median_sorted(const double *v, int n) {
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* out = sum over the kept clients of (w_i / W) u_i, in client order (kept NULL = all). */
static void dt__fed_mean(const float *const *u, const double *w, const int *kept, int n, int64_t len, float *out) {
    double total = 0.0;
    int i;
    int64_t j;
    for (i = 0; i < n; i++) if (!kept || kept[i]) total += w ? w[i] : 1.0;
    for (j = 0; j < len; j++) out[j] = 0.0f;
    for (i = 0; i < n; i++) {
        float s;
        if (kept && !kept[i]) continue;
        s = (float)((w ? w[i] : 1.0) / total);
        for (j = 0; j < len; j++) out[j] += s * u[i][j];
    }
}

/* Coordinate-wise median (t < 0) or mean of the sorted column without its t lowest and t highest. */
static void dt__fed_columns(const float *const *u, int n, int64_t len, int t, double *col, float *out) {
    int64_t j;
    int i;
    for (j = 0; j < len; j++) {
        double s = 0.0;
        for (i = 0; i < n; i++) col[i] = u[i][j];
        dt__fed_sort(col, n);
        if (t < 0) { out[j] = (float)dt__fed_median_sorted(col, n); continue; }
        for (i = t; i < n - t; i++) s += col[i];
        out[j] = (float)(s / (double)(n - 2 * t));
    }
}

/* Krum scores: score[i] = sum of the n - f - 2 smallest squared distances from u_i to the others; order
   gets the clients by increasing score (ties: lower index first). dist [n * n], tmp [n]. */
static void dt__fed_krum(const float *const *u, int n, int64_t len, int f, double *dist, double *tmp, double *score,
                         int *order) {
    int i, k, c = n - f - 2;
    int64_t j;
    for (i = 0; i < n; i++) {
        dist[i * n + i] = 0.0;
        for (k = i + 1; k < n; k++) {
            double s = 0.0;
            for (j = 0; j < len; j++) { double d = (double)u[i][j] - (double)u[k][j]; s += d * d; }
            dist[i * n + k] = dist[k * n + i] = s;
        }
    }
    for (i = 0; i < n; i++) {
        double s = 0.0;
        int m = 0;
        for (k = 0; k < n; k++) if (k != i) tmp[m++] = dist[i * n + k];
        dt__fed_sort(tmp, m);
        for (k = 0; k < c; k++) s += tmp[k];
        score[i] = s;
        order[i] = i;
    }
    for (i = 1; i < n; i++) {   /* stable insertion sort of the indices by score */
        int x = order[i];
        for (k = i - 1; k >= 0 && score[order[k]] > score[x]; k--) order[k + 1] = order[k];
        order[k + 1] = x;
    }
}

/* The class-mean check: kept[i] = 0 for a client whose row of some class lies beyond k median distances
   from that class's coordinate-median row. col [n], d [n], med [cols]. */
static void dt__fed_classmean(const float *const *u, int n, const dt_fed_agg_desc *a, double *col, double *d,
                              double *sorted, float *med, int *kept) {
    int64_t c, j;
    int i;
    for (i = 0; i < n; i++) kept[i] = 1;
    for (c = 0; c < a->cm_rows; c++) {
        int64_t base = a->cm_offset + c * a->cm_cols;
        double s;
        for (j = 0; j < a->cm_cols; j++) {
            for (i = 0; i < n; i++) col[i] = u[i][base + j];
            dt__fed_sort(col, n);
            med[j] = (float)dt__fed_median_sorted(col, n);
        }
        for (i = 0; i < n; i++) {
            double q = 0.0;
            for (j = 0; j < a->cm_cols; j++) { double e = (double)u[i][base + j] - (double)med[j]; q += e * e; }
            d[i] = sorted[i] = sqrt(q);
        }
        dt__fed_sort(sorted, n);
        s = dt__fed_median_sorted(sorted, n);
        for (i = 0; i < n; i++) if (d[i] > (double)a->k * s) kept[i] = 0;
    }
}

/* Krum's f: 0 is a request (no Byzantine client), DT_DEFAULT the default, 1. */
static int dt__fed_krum_f(const dt_fed_agg_desc *a) { return a->f == DT_DEFAULT ? 1 : a->f; }

/* dt_fed_aggregate, where only the first sel_len of the len coordinates choose the clients (Krum's distances,
   the class-mean rows): dt_fed's updates are the parameters followed by the buffers, and the buffers go
   through the same aggregator without a say in whom it keeps (docs/design.md, "BatchNorm statistics in
   the trainers"). */
static dt_result dt__fed_aggregate(dt_fed_agg kind, const float *const *updates, const double *weights, int n, int64_t len,
                                   int64_t sel_len, float *out, int *kept_out, const dt_fed_agg_desc *desc) {
    dt_fed_agg_desc a;
    double *scratch = NULL;
    int *order = NULL, *kept = NULL, i, t = 0;
    dt_result r = DT_OK;
    memset(&a, 0, sizeof a);
    if (desc) a = *desc;
    if (!a.trim) a.trim = 0.1f;
    a.f = dt__fed_krum_f(&a);
    if (!a.k) a.k = 3.0f;
    if (!updates || !out || n < 1 || len < 0 || kind < 0 || kind >= DT_FED_AGG_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: bad arguments (updates %p, out %p, n %d, len %lld, "
                            "kind %d): give n >= 1 updates of len >= 0 and a dt_fed_agg", (const void *)updates,
                            (void *)out, n, (long long)len, (int)kind);
    for (i = 0; i < n; i++) {
        if (!updates[i]) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: update %d is NULL", i);
        if (weights && !(weights[i] > 0.0 && weights[i] < INFINITY))
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: client %d's weight is %g; weights are sample counts > 0",
                                i, weights[i]);
    }
    if (kind == DT_FED_TRIMMED) {
        t = (int)floor((double)a.trim * (double)n);
        if (a.trim < 0.0f || 2 * t >= n)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: trimmed mean of %d clients with trim %g cuts %d at each "
                                "end, leaving none: need 2 * floor(trim * n) < n", n, (double)a.trim, t);
    }
    if ((kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) && a.f < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: %s with f = %d: f is the number of Byzantine clients "
                            "to tolerate, >= 0 (DT_DEFAULT for the default, 1)", dt_fed_agg_name(kind), a.f);
    if ((kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) && n < 2 * a.f + 3)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: %s with f = %d Byzantine clients needs n >= 2f + 3 = %d clients, "
                            "got %d: sample more clients or lower f", dt_fed_agg_name(kind), a.f, 2 * a.f + 3, n);
    if (kind == DT_FED_MULTIKRUM && (a.m < 0 || a.m > n))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: multikrum m = %d, need 0 <= m <= n = %d", a.m, n);
    if (kind == DT_FED_CLASSMEAN && (n < 3 || a.k < 1.0f || a.cm_rows < 1 || a.cm_cols < 1 || a.cm_offset < 0 ||
                                     a.cm_offset + a.cm_rows * a.cm_cols > sel_len))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: classmean needs n >= 3 clients (got %d), k >= 1 (got %g) and "
                            "the last layer's weight [%lld, %lld] at offset %lld inside the update of %lld", n, (double)a.k,
                            (long long)a.cm_rows, (long long)a.cm_cols, (long long)a.cm_offset, (long long)sel_len);
    scratch = (double *)DT_MALLOC(sizeof(double) * (size_t)(n * (n + 4) + (kind == DT_FED_CLASSMEAN ? a.cm_cols : 0)));
    order = (int *)DT_MALLOC(sizeof(int) * (size_t)n * 2);
    if (!scratch || !order) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_aggregate: no memory for %d clients", n); goto done; }
    kept = order + n;
    for (i = 0; i < n; i++) kept[i] = 1;
    switch (kind) {
    case DT_FED_MEAN: dt__fed_mean(updates, weights, NULL, n, len, out); break;
    case DT_FED_MEDIAN: dt__fed_columns(updates, n, len, -1, scratch, out); break;
    case DT_FED_TRIMMED: dt__fed_columns(updates, n, len, t, scratch, out); break;
    case DT_FED_KRUM:
    case DT_FED_MULTIKRUM: {
        int m = kind == DT_FED_KRUM ? 1 : (a.m ? a.m : n - a.f);
        dt__fed_krum(updates, n, sel_len, a.f, scratch, scratch + n * n, scratch + n * n + n, order);
        for (i = 0; i < n; i++) kept[i] = 0;
        for (i = 0; i < m; i++) kept[order[i]] = 1;
        dt__fed_mean(updates, NULL, kept, n, len, out);
        break;
    }
    default: /* DT_FED_CLASSMEAN */
        dt__fed_classmean(updates, n, &a, scratch, scratch + n, scratch + 2 * n, (float *)(scratch + 3 * n), kept);
        dt__fed_mean(updates, weights, kept, n, len, out);
        break;
    }
    if (kept_out) for (i = 0; i < n; i++) kept_out[i] = kept[i];
done:
    DT_FREE(scratch);
    DT_FREE(order);
    return r;
}

dt_result dt_fed_aggregate(dt_fed_agg kind, const float *const *updates, const double *weights, int n, int64_t len,
                           float *out, int *kept, const dt_fed_agg_desc *desc) {
    return dt__fed_aggregate(kind, updates, weights, n, len, len, out, kept, desc);
}

/* The fewest updates the aggregator accepts (Krum's 2f + 3, the class-mean check's 3). */
static int dt__fed_min_clients(dt_fed_agg kind, const dt_fed_agg_desc *a) {
    if (kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) return 2 * dt__fed_krum_f(a) + 3;
    if (kind == DT_FED_CLASSMEAN) return 3;
    if (kind == DT_FED_TRIMMED) { int n = 1; while (2 * (int)floor((double)(a->trim ? a->trim : 0.1f) * n) >= n && n < 1000) n++; return n; }
    return 1;
}

struct dt_fed {
    dt_comm       *comm;
    dt_model      *model;
    dt_fed_desc    desc;
    int64_t        n, len;       /* parameters; parameters and buffers: a model or an update [len] */
    int            nsel;         /* clients sampled per round */
    int           *behaviour;    /* [clients] */
    int           *sel, *drop;   /* [clients] the round's draw */
    int           *kept, *last_kept; /* [nsel] of the aggregate; [clients] by client id */
    float         *global;       /* [len] the round's global model */
    float         *delta;        /* [len] a host's update being sent */
    float         *updates;      /* rank 0: [nsel * len] the reported updates */
    double        *stats;        /* rank 0: [nsel * 2] samples and loss sum of each report */
    double        *weights;      /* rank 0: [nsel] */
    const float  **ptrs;         /* rank 0: [nsel] */
    int           *who;          /* rank 0: [nsel] client of each report */
    dt_request    *reqs;         /* rank 0: [nsel * 2] */
    int32_t       *ybuf;         /* [batch] flipped labels */
};

/* The model as FedAvg moves it: its parameters, then its buffers (BatchNorm running statistics), [len]. */
static void dt__fed_get(dt_fed *f, float *dst) {
    memcpy(dst, dt_model_params(f->model, NULL), sizeof(float) * (size_t)f->n);
    memcpy(dst + f->n, dt_model_buffers(f->model, NULL), sizeof(float) * (size_t)(f->len - f->n));
}
static void dt__fed_put(dt_fed *f, const float *src) {
    memcpy(dt_model_params(f->model, NULL), src, sizeof(float) * (size_t)f->n);
    memcpy(dt_model_buffers(f->model, NULL), src + f->n, sizeof(float) * (size_t)(f->len - f->n));
}

/* A schedule is set when any of its fields is: a zeroed sched leaves the rate to optim.lr. */
static int dt__sched_set(const dt_sched_desc *s) {
    return s->kind != DT_SCHED_CONSTANT || s->base_lr != 0.0f || s->milestones[0] != 0 || s->gamma != 0.0f || s->t_max != 0 ||
           s->min_lr != 0.0f || s->warmup != 0 || s->warmup_start != 0.0f;
}

static void dt__fed_rng(dt_rng *r, const dt_fed *f, int64_t round, uint64_t what, uint64_t stream) {
    dt_rng_init(r, f->desc.seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(round + 1)) ^ (what << 56), stream);
}

int dt_fed_draw(const dt_fed *f, int64_t round, int *sel, int *dropped) {
    int nc, i, m;
    int *perm = sel;
    dt_rng r;
    if (!f || !sel || !dropped) return 0;
    nc = f->desc.clients;
    m = f->nsel;
    for (i = 0; i < nc; i++) perm[i] = i;
    dt__fed_rng(&r, f, round, 1, 0);
    for (i = 0; i < m; i++) {   /* partial Fisher-Yates: the first m of a seeded permutation */
        int j = i + (int)dt_rng_below(&r, (uint32_t)(nc - i)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (i = 1; i < m; i++) {   /* sorted, so hosts and server walk the clients in the same order */
        int x = sel[i], j;
        for (j = i - 1; j >= 0 && sel[j] > x; j--) sel[j + 1] = sel[j];
        sel[j + 1] = x;
    }
    for (i = 0; i < m; i++) {
        dt_rng d;
        dt__fed_rng(&d, f, round, 2, (uint64_t)sel[i]);
        dropped[i] = f->desc.dropout_prob > 0.0f && dt_rng_uniform(&d) < f->desc.dropout_prob;
    }
    return m;
}

void dt_fed_last_kept(const dt_fed *f, int *kept) {
    int i;
    if (!f || !kept) return;
    for (i = 0; i < f->desc.clients; i++) kept[i] = f->last_kept ? f->last_kept[i] : 0;
}

dt_result dt_fed_save(dt_fed *f, const char *path, const dt_checkpoint_meta *meta) {
    if (!f) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_save: fed is NULL");
    return dt__ckpt_save_comm(f->comm, "dt_fed_save", DT__CKPT_FEDAVG, path, f->model, NULL, meta, 0, DT_OK);
}

dt_result dt_fed_load(dt_fed *f, const char *path, dt_checkpoint_meta *meta) {
    if (!f) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_load: fed is NULL");
    return dt__ckpt_load_comm(f->comm, "dt_fed_load", DT__CKPT_FEDAVG, path, f->model, NULL, meta, NULL, DT_OK);
}

void dt_fed_destroy(dt_fed *f) {
    if (!f) return;
    DT_FREE(f->behaviour); DT_FREE(f->sel); DT_FREE(f->drop); DT_FREE(f->kept); DT_FREE(f->last_kept);
    DT_FREE(f->global); DT_FREE(f->delta); DT_FREE(f->updates); DT_FREE(f->stats); DT_FREE(f->weights);
    DT_FREE((void *)f->ptrs); DT_FREE(f->who); DT_FREE(f->reqs); DT_FREE(f->ybuf);
    DT_FREE(f);
}

dt_result dt_fed_create(dt_fed **out, dt_comm *c, dt_model *m, const dt_fed_desc *desc) {
    dt_fed *f;
    dt_fed_desc d;
    int me = dt_comm_rank(c), i, nc;
    size_t n;
    dt_result r;
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_fed_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!d.data || !d.part)   /* the two fields without a default */
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: desc%s is NULL: FedAvg needs the training set "
                            "(desc.data) and its partition into the clients' data (desc.part)", me,
                            !desc ? "" : !d.data ? ".data" : ".part");
    if (!d.clients) d.clients = c->size > 1 ? c->size - 1 : 1;
    if (!d.frac) d.frac = 1.0f;
    if (!d.local_epochs) d.local_epochs = 1;
    if (!d.batch) d.batch = 10;
    if (d.noise_std == DT_DEFAULT) d.noise_std = 1.0f;   /* 0 is a request: a noise attacker that sends zeros */
    if (d.optim.lr == DT_DEFAULT) d.optim.lr = dt__optim_default_lr(d.optim.kind);   /* 0 is a request too */
    if (!d.agg_desc.cm_rows) {   /* the class-mean check reads the last linear layer's weight */
        for (i = dt_model_param_tensors(m) - 1; i >= 0; i--) {
            dt_param_info pi = dt_model_param_info(m, i);
            if (pi.ndim == 2) {
                d.agg_desc.cm_offset = pi.offset; d.agg_desc.cm_rows = pi.shape[0]; d.agg_desc.cm_cols = pi.shape[1];
                break;
            }
        }
    }
    nc = d.clients;
    if (!(d.noise_std >= 0.0f && d.noise_std < INFINITY))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: noise_std is %g: the noise attack's std is a finite "
                            "number >= 0 (DT_DEFAULT for the default, 1)", me, (double)d.noise_std);
    if (!(d.optim.lr >= 0.0f && d.optim.lr < INFINITY) ||
        (dt__sched_set(&d.sched) && !(d.sched.base_lr >= 0.0f && d.sched.base_lr < INFINITY && d.sched.min_lr >= 0.0f)))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: the clients' rate is %s %g: a learning rate is a "
                            "finite number >= 0 (0 leaves the model; optim.lr DT_DEFAULT: the optimizer's default)", me,
                            dt__sched_set(&d.sched) ? "sched.base_lr" : "optim.lr",
                            (double)(dt__sched_set(&d.sched) ? d.sched.base_lr : d.optim.lr));
    if ((d.agg == DT_FED_KRUM || d.agg == DT_FED_MULTIKRUM) && d.agg_desc.f < 0 && d.agg_desc.f != DT_DEFAULT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: agg_desc.f is %d: Krum's f is the number of Byzantine "
                            "clients to tolerate, >= 0 (DT_DEFAULT for the default, 1)", me, d.agg_desc.f);
    if (nc < 1 || d.part->parts != nc || !(d.frac > 0.0f && d.frac <= 1.0f) || d.local_epochs < 1 || d.batch < 1 ||
        d.prox_mu < 0.0f || !(d.dropout_prob >= 0.0f && d.dropout_prob < 1.0f) || d.agg < 0 || d.agg >= DT_FED_AGG_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: bad desc (clients %d, partition of %d parts, frac %g, "
                            "local_epochs %d, batch %lld, prox_mu %g, dropout_prob %g): the partition needs one part per "
                            "client, 0 < frac <= 1, 0 <= dropout_prob < 1", me, nc, d.part->parts, (double)d.frac,
                            d.local_epochs, (long long)d.batch, (double)d.prox_mu, (double)d.dropout_prob);
    if (!(f = (dt_fed *)DT_MALLOC(sizeof *f))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_create: rank %d: no memory", me);
    memset(f, 0, sizeof *f);
    f->comm = c; f->model = m; f->desc = d; f->n = m->nparams; f->len = m->nparams + m->nbuffers;
    f->desc.behaviour = NULL;
    f->nsel = (int)floor((double)d.frac * (double)nc + 0.5);
    if (f->nsel < 1) f->nsel = 1;
    if (f->nsel > nc) f->nsel = nc;
    if (f->nsel < dt__fed_min_clients(d.agg, &d.agg_desc)) {
        dt_fed_destroy(f);
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: %s needs at least %d clients per round, but C = %g of %d "
                            "clients samples %d: raise --frac or --clients", me, dt_fed_agg_name(d.agg),
                            dt__fed_min_clients(d.agg, &d.agg_desc), (double)d.frac, nc, (int)floor((double)d.frac * nc + 0.5));
    }
    n = (size_t)(f->len ? f->len : 1);
    f->behaviour = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->sel = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->drop = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->kept = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->last_kept = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->global = (float *)DT_MALLOC(sizeof(float) * n);
    f->delta = (float *)DT_MALLOC(sizeof(float) * n);
    f->ybuf = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)d.batch);
    if (me == 0) {
        f->updates = (float *)DT_MALLOC(sizeof(float) * n * (size_t)f->nsel);
        f->stats = (double *)DT_MALLOC(sizeof(double) * 2 * (size_t)f->nsel);
        f->weights = (double *)DT_MALLOC(sizeof(double) * (size_t)f->nsel);
        f->ptrs = (const float **)DT_MALLOC(sizeof(float *) * (size_t)f->nsel);
        f->who = (int *)DT_MALLOC(sizeof(int) * (size_t)f->nsel);
        f->reqs = (dt_request *)DT_MALLOC(sizeof(dt_request) * 2 * (size_t)f->nsel);
    }
    if (!f->behaviour || !f->sel || !f->drop || !f->kept || !f->last_kept || !f->global || !f->delta || !f->ybuf ||
        (me == 0 && (!f->updates || !f->stats || !f->weights || !f->ptrs || !f->who || !f->reqs))) {
        dt_fed_destroy(f);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_create: rank %d: no memory (the server keeps %d updates of %lld floats: "
                            "lower --frac)", me, f->nsel, (long long)f->len);
    }
    for (i = 0; i < nc; i++) {
        f->behaviour[i] = d.behaviour ? d.behaviour[i] : DT_FED_HONEST;
        f->last_kept[i] = 0;
    }
    if ((r = dt__same_model(c, m, "dt_fed_create", 0)) != DT_OK) { dt_fed_destroy(f); return r; }
    *out = f;
    return DT_OK;
}

/* Client k's local training from f->global (parameters and buffers): E epochs of batch B with a fresh
   optimizer at rate lr. Leaves delta [len] = local - global (after the client's behaviour: an attacker
   controls all it sends, statistics included) and st = {samples, loss sum over the epochs}. */
static dt_result dt__fed_train_client(dt_fed *f, int k, int64_t round, float lr, float *delta, double *st) {
    const dt_fed_desc *d = &f->desc;
    dt_model *m = f->model;
    float *w = dt_model_params(m, NULL), *g = dt_model_grads(m, NULL);
    int64_t off = d->part->offsets[k], cnt = d->part->offsets[k + 1] - off, j, e;
    dt_optim *o = NULL;
    dt_loader *l = NULL;
    dt_optim_desc od = d->optim;
    dt_loader_desc ld;
    dt_result r;
    int flip = f->behaviour[k] == DT_FED_LABELFLIP && d->flip_set;
    st[0] = (double)cnt;
    st[1] = 0.0;
    for (j = 0; j < f->len; j++) delta[j] = 0.0f;
    if (cnt == 0) return DT_OK;
    dt_trace_begin("client training", "compute");
    dt__trace_arg("client", NULL, k);
    dt__trace_arg("round", NULL, round);
    dt__trace_arg("samples", NULL, cnt);
    dt__fed_put(f, f->global);   /* every client starts from the global statistics too, not the last client's */
    od.lr = lr;
    memset(&ld, 0, sizeof ld);
    ld.dataset = d->data; ld.indices = d->part->indices + off; ld.count = cnt; ld.batch = d->batch;
    ld.shuffle = 1; ld.transform = d->transform; ld.seed = d->seed; ld.rank = (uint64_t)k;
    if ((r = dt_optim_create(&o, m, &od)) != DT_OK || (r = dt_loader_create(&l, &ld)) != DT_OK) goto done;
    for (e = 0; e < d->local_epochs && r == DT_OK; e++) {
        const float *x;
        const int32_t *y;
        int64_t nb;
        float loss = 0.0f;
        if ((r = dt_loader_start_epoch(l, round * d->local_epochs + e)) != DT_OK) break;
        while ((r = dt_loader_next(l, &x, &y, &nb)) == DT_OK && nb > 0) {
            if (flip) {
                for (j = 0; j < nb; j++)
                    f->ybuf[j] = y[j] >= 0 && y[j] < DT_FED_MAX_CLASSES ? d->flip[y[j]] : y[j];
                y = f->ybuf;
            }
            dt_model_zero_grad(m);
            if ((r = dt_model_forward(m, x, nb)) != DT_OK || (r = dt_model_loss_labels(m, y, &loss)) != DT_OK ||
                (r = dt_model_backward(m, NULL)) != DT_OK) break;
            if (d->prox_mu > 0.0f)   /* FedProx: the gradient of (mu / 2) ||w - w_global||^2 */
                for (j = 0; j < f->n; j++) g[j] += d->prox_mu * (w[j] - f->global[j]);
            if ((r = dt_optim_step(o)) != DT_OK) break;
            st[1] += (double)loss * (double)nb;
        }
    }
    if (r != DT_OK) goto done;
    if (f->behaviour[k] == DT_FED_NOISE) {
        dt_rng nr;
        dt__fed_rng(&nr, f, round, 3, (uint64_t)k);
        for (j = 0; j < f->len; j++) delta[j] = d->noise_std * dt_rng_normal(&nr);
    } else {
        float s = f->behaviour[k] == DT_FED_SIGNFLIP ? -1.0f : 1.0f;
        dt__fed_get(f, delta);
        for (j = 0; j < f->len; j++) delta[j] = s * (delta[j] - f->global[j]);
    }
done:
    dt_trace_end();
    dt_loader_destroy(l);
    dt_optim_destroy(o);
    if (r != DT_OK)
        return dt_set_error(r, "dt_fed_round: rank %d: client %d failed in round %lld: %s", f->comm->rank, k, (long long)round,
                            dt_last_error());
    return DT_OK;
}

dt_result dt_fed_round(dt_fed *f, int64_t round, dt_fed_round_info *info) {
    dt_comm *c;
    int me, p, nsel, i, nrep = 0, nreq = 0, nagg = 0;
    float lr;
    int64_t j;
    double loss = 0.0, samples = 0.0;
    dt_result r = DT_OK;
    if (!f) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_round: fed is NULL");
    c = f->comm; me = c->rank; p = c->size;
    lr = dt__sched_set(&f->desc.sched) ? dt_sched_lr(&f->desc.sched, round) : f->desc.optim.lr;
    if (info) memset(info, 0, sizeof *info);
    nsel = dt_fed_draw(f, round, f->sel, f->drop);
    if (me == 0) dt__fed_get(f, f->global);
    if ((r = dt_comm_broadcast(c, f->global, (size_t)f->len, DT_F32, 0, DT_ALGO_AUTO)) != DT_OK) return r;
    /* the server posts a receive for every remote client that reports, in client order */
    for (i = 0; i < nsel && me == 0; i++) {
        int k = f->sel[i], host = p == 1 ? 0 : 1 + k % (p - 1);
        if (f->drop[i]) continue;
        f->who[nrep] = k;
        if (host != 0) {
            if ((r = dt__lib_irecv(c, f->stats + 2 * nrep, 2, DT_F64, host, DT__TAG_FEDAVG, &f->reqs[nreq++])) != DT_OK ||
                (r = dt__lib_irecv(c, f->updates + (int64_t)nrep * f->len, (size_t)f->len, DT_F32, host, DT__TAG_FEDAVG,
                                   &f->reqs[nreq++])) != DT_OK) return r;
        }
        nrep++;
    }
    for (i = 0; i < nsel && r == DT_OK; i++) {   /* hosts train their clients */
        int k = f->sel[i], host = p == 1 ? 0 : 1 + k % (p - 1);
        double st[2];
        if (f->drop[i] || host != me) continue;
        if (p == 1) {
            int slot, s;
            for (slot = 0, s = 0; s < i; s++) slot += !f->drop[s];
            r = dt__fed_train_client(f, k, round, lr, f->updates + (int64_t)slot * f->len, f->stats + 2 * slot);
            continue;
        }
        if ((r = dt__fed_train_client(f, k, round, lr, f->delta, st)) != DT_OK) break;
        if ((r = dt__lib_send(c, st, 2, DT_F64, 0, DT__TAG_FEDAVG)) != DT_OK) break;
        r = dt__lib_send(c, f->delta, (size_t)f->len, DT_F32, 0, DT__TAG_FEDAVG);
    }
    if (r != DT_OK || me != 0) return r;
    if (nreq && (r = dt_comm_waitall(c, f->reqs, nreq)) != DT_OK) return r;
    for (i = 0; i < f->desc.clients; i++) f->last_kept[i] = 0;
    for (i = 0; i < nrep; i++) {   /* clients with no samples report nothing useful */
        loss += f->stats[2 * i + 1];
        samples += f->stats[2 * i];
        if (f->stats[2 * i] <= 0.0) continue;
        f->ptrs[nagg] = f->updates + (int64_t)i * f->len;
        f->weights[nagg] = f->stats[2 * i];
        f->who[nagg++] = f->who[i];
    }
    if (info) {
        info->selected = nsel;
        info->dropped = nsel - nrep;
        info->samples = (int64_t)samples;
        info->train_loss = samples > 0.0 ? loss / (samples * f->desc.local_epochs) : 0.0;
        info->lr = lr;
    }
    dt__fed_put(f, f->global);
    if (nagg < dt__fed_min_clients(f->desc.agg, &f->desc.agg_desc)) {   /* too many dropped: the global model stays */
        if (nagg > 0)
            dt_log(DT_LOG_WARN, "dt_fed_round: round %lld: %d clients reported, fewer than %s needs; the global model is kept",
                   (long long)round, nagg, dt_fed_agg_name(f->desc.agg));
        return DT_OK;
    }
    dt_trace_begin("aggregate", "optim");
    dt__trace_arg("clients", NULL, nagg);
    dt__trace_arg("aggregator", dt_fed_agg_name(f->desc.agg), 0);
    r = dt__fed_aggregate(f->desc.agg, f->ptrs, f->weights, nagg, f->len, f->n, f->delta, f->kept, &f->desc.agg_desc);
    dt_trace_end();
    if (r != DT_OK) return r;
    for (j = 0; j < f->len; j++) f->delta[j] += f->global[j];   /* global + the aggregate, as global[j] + delta[j] */
    dt__fed_put(f, f->delta);
    for (i = 0; i < nagg; i++) {
        f->last_kept[f->who[i]] = f->kept[i];
        if (info) info->kept += f->kept[i];
    }
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
