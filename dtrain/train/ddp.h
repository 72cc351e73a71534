/* dtrain/train/ddp.h - DDP: data-parallel SGD over the flat gradient buffer.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_ddp: the gradient buffer summed over the ranks by a parameter server, point-to-point, per layer,
     flat, or in buckets reduced by a helper thread as backward finishes them; weighting by samples,
     accumulation, uneven data (dt_ddp_join), synchronised batch norm, checkpoints. What travels for each
     slice (fp32, or compress.h's bf16, fp16, top-k, PowerSGD) is chosen in dt__ddp_reduce.
   READ FIRST
     dt_ddp_backward with dt__ddp_hook and dt__ddp_helper (buckets launched as backward finishes them),
     dt__ddp_reduce.
   USES
     dtrain/comm/algos.h (the library's point-to-point calls on its reserved tags), dtrain/train/checkpoint.h
     and dtrain/train/compress.h, and what they include.
*/
#ifndef DTRAIN_DDP_H
#define DTRAIN_DDP_H
#include "../comm/algos.h"
#include "checkpoint.h"
#include "compress.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    int64_t       powersgd_warmup; /* POWERSGD: the first syncs (counted on every rank, joined rounds included, and
                                   kept by checkpoints) sum the plain fp32 gradient, as PyTorch's start_powerSGD_iter
                                   (default 0: compress from the first) */
    int           sync_bn;      /* 1: synchronised batch norm (dt_model_set_bn_sync): in training, every batch norm
                                   normalises with the statistics of all ranks' batches, one all-reduce of 2c + 1
                                   doubles per layer in forward and of 2c in backward; the running statistics stay
                                   equal on every rank. The CPU backend. */
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

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DDP_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_DDP_IMPLEMENTATION_DONE)
#define DTRAIN_DDP_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"
/* The tag of DDP's own messages (parameter server, P2P): the library's first (comm/backend.h). */
#define DT__TAG_DDP (DT__TAG_LIB + 0)

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
    int64_t      seq;               /* sync sequences begun, the same on every rank (POWERSGD's warm-up; checkpoints) */
    dt_ddp_stats stats;
    dt__compress z;                 /* desc.compress other than FP32, more than one rank (compress.h) */
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
    /* synchronised batch norm: a sum the caller's thread hands the helper during an overlapped backward */
    double      *bn_buf;            /* under mu: its doubles, bn_n of them, while bn_job is 1 */
    int64_t      bn_n;
    int          bn_job;
    dt_result    bn_err;            /* under mu: its result and message */
    char         bn_msg[512];
    float       *join_x, *join_dy;  /* sync_bn: the zero batch of 2 a joined rank's rounds run (dt_ddp_join) */
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
    int p = dt_comm_size(c), me = dt_comm_rank(c), i;
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
static int dt__ddp_slices(const dt_ddp *d, const int64_t **off, const int64_t **cnt) {
    static const int64_t zero = 0;
    if (d->desc.method == DT_DDP_BUCKETS && d->nbuckets) { *off = d->boff; *cnt = d->bcnt; return d->nbuckets; }
    if (d->desc.method == DT_DDP_PER_LAYER && d->ntensors) { *off = d->toff; *cnt = d->tcnt; return d->ntensors; }
    *off = &zero; *cnt = &d->n;
    return 1;
}
static int dt__ddp_ncoll(const dt_ddp *d) {
    const int64_t *off, *cnt;
    return dt__ddp_slices(d, &off, &cnt);
}
static void dt__ddp_slice(const dt_ddp *d, int i, int64_t *off, int64_t *cnt) {
    const int64_t *o, *c;
    dt__ddp_slices(d, &o, &c);
    *off = o[i];
    *cnt = c[i];
}

/* This rank's part in a sync: its weight, and what the first collective carries (one rank: no sum, so the
   weight is the share of the last micro-batch in the samples accumulated). */
static void dt__ddp_begin(dt_ddp *d, int active) {
    d->active = active;
    d->seq++;
    if (dt_comm_size(d->comm) > 1) { d->scale = active ? (float)d->last_samples : 0.0f; return; }
    d->scale = active ? (float)((double)d->last_samples / (double)d->acc_samples) : 0.0f;
    d->total = (double)d->acc_samples;
    d->nactive = active;
}

/* After the first collective: the samples of all ranks and how many still have data (user: the dt_ddp; the
   compressors call it too). */
static dt_result dt__ddp_counts(void *user, float total, float nactive) {
    dt_ddp *d = (dt_ddp *)user;
    dt_result r;
    if ((r = dt__reduced_check(d->comm, "DDP sync", "the number of ranks with data (all-reduced)", nactive, 0.0,
                               (double)dt_comm_size(d->comm))) != DT_OK ||
        (r = dt__reduced_check(d->comm, "DDP sync", "the samples of all ranks (all-reduced)", total, nactive > 0 ? nactive : 0.0,
                               nactive > 0 ? HUGE_VAL : 0.0)) != DT_OK)
        return r;
    if (nactive != floorf(nactive) || total != floorf(total))
        return dt_set_error(DT_ERR_NUMERIC, "DDP sync: rank %d: the all-reduced counts (%g ranks with data, %g samples) are not whole "
                            "numbers: a rank sent a wrong count (a corrupt message, or DT_FAULT kind=nan); the step is not applied",
                            dt_comm_rank(d->comm), nactive, total);
    d->total = total;
    d->nactive = (int64_t)nactive;
    if (d->total >= DT__DDP_MAX_SAMPLES)
        return dt_set_error(DT_ERR_INVALID_ARG, "DDP sync: rank %d: %.0f samples in one sync, but a float counts them exactly only below %.0f: "
                            "sync more often (fewer micro-batches per sync, or smaller batches)", dt_comm_rank(d->comm), d->total, DT__DDP_MAX_SAMPLES);
    return DT_OK;
}

/* Weighs this rank's gradients of collective i and sums them over the ranks; the first collective goes
   through carry with this rank's samples and activity after the slice. */
static dt_result dt__ddp_reduce(dt_ddp *d, int i) {
    int64_t off, cnt, j;
    float *g;
    dt_result r;
    dt__ddp_slice(d, i, &off, &cnt);
    g = dt_model_grads(d->model, NULL) + off;
    if (d->scale != 1.0f)
        for (j = 0; j < cnt; j++) g[j] *= d->scale;
    if (dt_comm_size(d->comm) == 1) return DT_OK;
    if (d->desc.compress != DT_DDP_FP32 && d->seq > d->desc.powersgd_warmup)   /* past PowerSGD's warm-up (seq counts this one) */
        return dt__compress_slice(&d->z, i, dt_model_grads(d->model, NULL), off, cnt, d->active, d->acc_samples);
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

/* A synchronised batch norm's sum (dt_model_set_bn_sync), in place over the ranks. */
static dt_result dt__ddp_bn_allreduce(dt_ddp *d, double *buf, int64_t n) {
    return dt_comm_allreduce(d->comm, buf, (size_t)n, DT_F64, DT_SUM, d->desc.algo);
}

#if DT__HAVE_THREADS
/* The helper, under mu: the caller's pending batch norm sum, done (unless a bucket failed) and handed back. */
static void dt__ddp_serve_bn(dt_ddp *d) {
    dt_result r = d->herr;
    if (r == DT_OK) {
        dt__mutex_unlock(&d->mu);
        r = dt__ddp_bn_allreduce(d, d->bn_buf, d->bn_n);
        dt__mutex_lock(&d->mu);
    }
    d->bn_err = r;
    if (r != DT_OK) snprintf(d->bn_msg, sizeof d->bn_msg, "%s", d->herr != DT_OK ? d->hmsg : dt_last_error());
    d->bn_job = 0;
    dt__cond_broadcast(&d->cv);
}

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
            /* the buckets and the batch norms' sums in backward's order, the same on every rank: a bucket whose
               gradients are final goes before a sum the caller asks for after them */
            while (d->ready > d->boff[b]) {
                if (d->bn_job) dt__ddp_serve_bn(d);
                else dt__cond_wait(&d->cv, &d->mu);
            }
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
        if (d->bn_job) dt__ddp_serve_bn(d);   /* asked while the last bucket was in flight */
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
    DT_FREE(d->gathered); DT_FREE(d->reqs); DT_FREE(d->carry); DT_FREE(d->join_x); DT_FREE(d->join_dy);
    dt__compress_free(&d->z);
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
    return dt__same_model(d->comm, d->model, "dt_ddp_broadcast_params", 1, DT_OK);
}

/* The compression settings: a known kind, a ratio in (0, 1], an all-reduce method; fills in the default ratio. */
static dt_result dt__ddp_compress_check(dt_ddp_desc *dd, int64_t nparams, int me) {
    if (dd->compress < 0 || dd->compress >= DT_DDP_COMPRESS_COUNT || !(dd->topk_ratio >= 0.0 && dd->topk_ratio <= 1.0))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: bad desc (compress %d, topk_ratio %g): compress is a "
                            "dt_ddp_compress, topk_ratio in (0, 1] (0: %g)", me, (int)dd->compress, dd->topk_ratio, DT_DDP_TOPK_RATIO);
    if (dd->compress != DT_DDP_FP32 && (dd->method == DT_DDP_PARAM_SERVER || dd->method == DT_DDP_P2P))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: compression (%s) works with the all-reduce methods: use "
                            "--sync buckets, flat or per-layer, not %s", me, dt_ddp_compress_name(dd->compress), dt_ddp_method_name(dd->method));
    if (dd->compress == DT_DDP_TOPK && nparams > INT32_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: top-k sends 32-bit indices, but the model has %lld "
                            "parameters: use bf16", me, (long long)nparams);
    if (dd->powersgd_warmup < 0 || (dd->powersgd_warmup > 0 && dd->compress != DT_DDP_POWERSGD))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: powersgd_warmup %lld: give the plain syncs before "
                            "PowerSGD starts (>= 0), with compress POWERSGD", me, (long long)dd->powersgd_warmup);
    if (dd->powersgd_rank < 0 || dd->powersgd_rank > 1024)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: powersgd_rank %d: give a rank from 1 to 1024 (0: %d)", me,
                            dd->powersgd_rank, DT_DDP_POWERSGD_RANK);
    if (dd->topk_ratio == 0.0) dd->topk_ratio = DT_DDP_TOPK_RATIO;
    if (dd->powersgd_rank == 0) dd->powersgd_rank = DT_DDP_POWERSGD_RANK;
    return DT_OK;
}


/* The compressor: the settings, this dt_ddp's plan and its slices (compress.h). */
static dt_result dt__ddp_compress_init(dt_ddp *d) {
    const int64_t *soff, *scnt;
    int nslices = dt__ddp_slices(d, &soff, &scnt);
    dt__compress *z = &d->z;
    z->kind = d->desc.compress;
    z->algo = d->desc.algo;
    z->topk_ratio = d->desc.topk_ratio;
    z->no_feedback = d->desc.no_feedback;
    z->powersgd_rank = d->desc.powersgd_rank;
    z->comm = d->comm;
    z->model = d->model;
    z->n = d->n;
    z->ntensors = d->ntensors;
    z->toff = d->toff;
    z->tcnt = d->tcnt;
    z->counts = dt__ddp_counts;
    z->user = d;
    return dt__compress_alloc(z, nslices, soff, scnt);
}

/* dt_model_set_bn_sync's sum: on the caller's thread, or, while an overlapped backward has given the
   communicator to the helper, by the helper between its buckets */
static dt_result dt__ddp_bn_sum(void *user, double *buf, int64_t n) {
    dt_ddp *d = (dt_ddp *)user;
    if (dt_comm_size(d->comm) == 1) return DT_OK;
#if DT__HAVE_THREADS
    if (d->in_sync) {
        dt_result r;
        dt__mutex_lock(&d->mu);
        if (d->job) {
            d->bn_buf = buf;
            d->bn_n = n;
            d->bn_job = 1;
            dt__cond_broadcast(&d->cv);
            while (d->bn_job) dt__cond_wait(&d->cv, &d->mu);
            r = d->bn_err;
            dt__mutex_unlock(&d->mu);
            if (r != DT_OK) dt__error_restore(d->bn_msg);
            return r;
        }
        dt__mutex_unlock(&d->mu);   /* the helper is done with this sync's buckets: the communicator is free */
    }
#endif
    return dt__ddp_bn_allreduce(d, buf, n);
}

/* dt_ddp_create's part before its first collective, local to this rank: the desc's checks, the plan and the
   buffers. *out is NULL on failure (d freed). */
static dt_result dt__ddp_setup(dt_ddp **out, dt_comm *c, dt_model *m, dt_ddp_desc dd) {
    dt_ddp *d;
    dt_result r;
    int64_t np = 0;
    int me = dt_comm_rank(c);
    *out = NULL;
    if (dd.method < 0 || dd.method >= DT_DDP_METHOD_COUNT || dd.algo < 0 || dd.algo >= DT_ALGO_COUNT || dd.bucket_bytes < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: bad desc (method %d, algo %d, bucket_bytes %lld): "
                            "method is a dt_ddp_method, algo a dt_algo, bucket_bytes >= 0", me, (int)dd.method,
                            (int)dd.algo, (long long)dd.bucket_bytes);
    if (!dd.bucket_bytes) dd.bucket_bytes = DT_DDP_BUCKET_BYTES;
    dt_model_params(m, &np);
    if ((r = dt__ddp_compress_check(&dd, np, me)) != DT_OK) return r;
    if (!(d = (dt_ddp *)DT_MALLOC(sizeof *d))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory", me);
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->desc = dd;
    d->n = np;
    d->tls_rank = dt__tls_rank;
    d->trace = dt__trace_lane_of(1);
    if (dt__ddp_plan(d) != DT_OK)
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for the plan", me);
    if (r == DT_OK && dt_comm_size(c) > 1) {   /* the first collective's slice and the two counts after it */
        int64_t off, cnt;
        dt__ddp_slice(d, 0, &off, &cnt);
        if (!(d->carry = (float *)DT_MALLOC(sizeof(float) * (size_t)(cnt + 2))))
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for %lld floats", me, (long long)cnt + 2);
    }
    if (r == DT_OK && (dd.method == DT_DDP_PARAM_SERVER || dd.method == DT_DDP_P2P) && me == 0 && dt_comm_size(c) > 1) {
        d->gathered = (float *)DT_MALLOC(sizeof(float) * (size_t)(dt_comm_size(c) * (d->n + 2)));
        d->reqs = (dt_request *)DT_MALLOC(sizeof(dt_request) * (size_t)dt_comm_size(c));
        if (!d->gathered || !d->reqs)
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank 0: no memory to gather %d gradients of %lld floats "
                             "(the parameter server's buffer); use --sync flat or buckets", dt_comm_size(c), (long long)np);
    }
    if (r == DT_OK && dt_comm_size(c) > 1 && dd.compress != DT_DDP_FP32 && dt__ddp_compress_init(d) != DT_OK)
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for the %s buffers", me, dt_ddp_compress_name(dd.compress));
    if (r == DT_OK && dd.sync_bn) {   /* the batch norms' sums, and the zero batch of a joined rank's rounds */
        int64_t in = dt_model_node_size(m, 0), outsz = dt_model_node_size(m, dt_model_output_node(m));
        d->join_x = (float *)DT_MALLOC(sizeof(float) * (size_t)(2 * in));
        d->join_dy = (float *)DT_MALLOC(sizeof(float) * (size_t)(2 * outsz));
        if (!d->join_x || !d->join_dy) r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for a batch of 2", me);
        else {
            memset(d->join_x, 0, sizeof(float) * (size_t)(2 * in));
            memset(d->join_dy, 0, sizeof(float) * (size_t)(2 * outsz));
            r = dt_model_set_bn_sync(m, dt__ddp_bn_sum, d);
        }
    }
    if (r != DT_OK) { dt__ddp_free(d); return r; }
    *out = d;
    return DT_OK;
}

dt_result dt_ddp_create(dt_ddp **out, dt_comm *c, dt_model *m, const dt_ddp_desc *desc) {
    dt_ddp_desc dd;
    dt_ddp *d = NULL;
    dt_result r;
    int me = dt_comm_rank(c);
    (void)me;   /* the helper's messages name it; without threads there are none */
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_ddp_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    r = dt__ddp_setup(&d, c, m, dd);
    if ((r = dt__same_model(c, m, "dt_ddp_create", 1, r)) != DT_OK) {   /* every rank stops if one failed */
        if (d && d->desc.sync_bn) dt_model_set_bn_sync(m, NULL, NULL);
        if (d) dt__ddp_free(d);
        return r;
    }
    dd = d->desc;
    /* the helper thread calls the communicator: where its backend allows that (local ranks; MPI at
       MPI_THREAD_SERIALIZED or above) */
#if DT__HAVE_THREADS
    if (dd.method == DT_DDP_BUCKETS && !dd.no_overlap && dt_comm_size(c) > 1 && d->nbuckets > 0 && !dt__comm_any_thread(c)) {
        dt_log(DT_LOG_WARN, "dt_ddp_create: rank %d: the %s communicator may be called only by the thread that created it "
               "(MPI: initialised below MPI_THREAD_SERIALIZED), so buckets are reduced after backward; for overlap, "
               "initialise MPI with MPI_THREAD_SERIALIZED (dt_launch does)", me, dt_comm_backend_name(c));
    } else if (dd.method == DT_DDP_BUCKETS && !dd.no_overlap && dt_comm_size(c) > 1 && d->nbuckets > 0) {
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
    if (dt__model_hook_user(d->model) == d) dt_model_set_backward_hook(d->model, NULL, NULL);
    if (d->desc.sync_bn) dt_model_set_bn_sync(d->model, NULL, NULL);
    dt__ddp_free(d);
}

static dt_result dt__ddp_bad(const dt_ddp *d, int64_t samples, const char *what) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "%s: ddp is NULL", what);
    if (samples <= 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d: samples is %lld; give the batch's sample count (> 0)", what,
                            dt_comm_rank(d->comm), (long long)samples);
    return DT_OK;
}

/* After the sum: the division by all samples, buffers if asked, counters, and a fresh accumulation. */
static dt_result dt__ddp_done(dt_ddp *d, dt_result r, double t0) {
    float *g = dt_model_grads(d->model, NULL), total = (float)d->total;
    int64_t j;
    int averaged = d->desc.compress != DT_DDP_FP32 && d->seq > d->desc.powersgd_warmup && dt__compress_averaged(&d->z);
    if (r == DT_OK && dt_comm_size(d->comm) > 1 && total > 0 && !averaged)   /* fp16 divided before it sent */
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

static dt_result dt__ddp_backward_sync(dt_ddp *d, const float *dy, int active);
dt_result dt_ddp_backward(dt_ddp *d, const float *dy, int64_t samples, int sync) {
    dt_result r;
    int64_t j;
    if ((r = dt__ddp_bad(d, samples, "dt_ddp_backward")) != DT_OK) return r;
    if (d->last_samples > 0 && d->last_samples != samples) {   /* keep the buffer = sum of gradients / samples */
        float f = (float)((double)d->last_samples / (double)samples), *g = dt_model_grads(d->model, NULL);
        for (j = 0; j < d->n; j++) g[j] *= f;
    }
    d->acc_samples += samples;
    d->last_samples = samples;
    if (!sync) return dt_model_backward(d->model, dy);
    return dt__ddp_backward_sync(d, dy, 1);
}

/* dt_ddp_backward's pass that syncs; active 0: a joined rank's pass over a zero batch (sync_bn) */
static dt_result dt__ddp_backward_sync(dt_ddp *d, const float *dy, int active) {
    dt_result r, rb;
    double t0;
    dt__ddp_begin(d, active);
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
    if (r != DT_OK) dt__error_restore(d->hmsg);   /* the helper thread's message, as it was */
    return dt__ddp_done(d, r, t0);
}

/* With sync_bn a joined rank runs the others' passes too, forward and backward over a zero batch of 2 that adds
   nothing to the batch norms' sums, so that its sums and buckets come in the order of theirs. */
static dt_result dt__ddp_join_pass(dt_ddp *d) {
    dt_result r;
    dt__model_bn_sync_weight(d->model, 0);
    r = dt_model_forward(d->model, d->join_x, 2);
    if (r == DT_OK) r = dt__ddp_backward_sync(d, d->join_dy, 0);
    dt__model_bn_sync_weight(d->model, 1);
    return r;
}
/* dt_ddp_join's rounds: until no rank has data, the others' syncs with a zero gradient. */
static dt_result dt__ddp_join_rounds(dt_ddp *d, dt_optim *o) {
    dt_result r;
    for (;;) {
        double t0 = dt_time_now();
        dt_model_zero_grad(d->model);
        if (d->desc.sync_bn && dt_model_mode(d->model) == DT_MODE_TRAIN) {
            int64_t syncs = d->stats.syncs;
            if ((r = dt__ddp_join_pass(d)) != DT_OK) return r;
            if (d->nactive == 0) { d->stats.syncs = syncs; return DT_OK; }   /* everyone has joined */
            d->stats.syncs = syncs;
            d->stats.joined_rounds++;
            if (o && (r = dt_optim_step(o)) != DT_OK) return r;
            dt_model_zero_grad(d->model);
            continue;
        }
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
                            "to dt_ddp_backward on the last batch", dt_comm_rank(d->comm), (long long)d->acc_samples);
    dt_trace_begin("ddp join", "comm");
    return dt__trace_close(mark, dt__ddp_join_rounds(d, o));
}

dt_result dt_ddp_sync_buffers(dt_ddp *d) {
    int64_t nb = 0;
    float *b;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_sync_buffers: ddp is NULL");
    b = dt_model_buffers(d->model, &nb);
    if (nb == 0 || dt_comm_size(d->comm) == 1) return DT_OK;
    return dt_comm_allreduce(d->comm, b, (size_t)nb, DT_F32, DT_MEAN, d->desc.algo);
}

dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d) {
    dt_ddp_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

int dt_ddp_buckets(const dt_ddp *d) { return d ? d->nbuckets : 0; }
const float *dt_ddp_residual(const dt_ddp *d, int64_t *n) {
    int has = d && d->z.residual && !d->desc.no_feedback;
    if (n) *n = has ? d->n : 0;
    return has ? d->z.residual : NULL;
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
                           "and a checkpoint holds no gradients: save after a step that synchronised", dt_comm_rank(d->comm),
                           (long long)d->acc_samples);
    return dt__ckpt_save_extra(d->comm, "dt_ddp_save", DT__CKPT_DDP, path, d->model, o, meta, d->seq, d->z.residual, d->z.nstate, pre);
}

dt_result dt_ddp_load(dt_ddp *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta) {
    dt_result r;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_load: ddp is NULL");
    int64_t seq = 0;
    r = dt__ckpt_load_extra(d->comm, "dt_ddp_load", DT__CKPT_DDP, path, d->model, o, meta, &seq, d->z.residual, d->z.nstate, DT_OK);
    if (r == DT_OK && seq < 0)   /* the word: the syncs done (0 in files from before it was kept) */
        return dt_set_error(DT_ERR_FORMAT, "dt_ddp_load: rank %d: %s counts %lld syncs; a count is >= 0: the file is damaged",
                            dt_comm_rank(d->comm), path, (long long)seq);
    if (r == DT_OK) { d->acc_samples = d->last_samples = 0; d->seq = seq; }
    return r;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
