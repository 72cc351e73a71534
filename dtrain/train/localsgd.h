/* dtrain/train/localsgd.h - local SGD (periodic model averaging) and Hogwild (lock-free threads).
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     Local SGD: every rank trains its replica and every K steps the parameters are averaged (one
     all-reduce); its checkpoint keeps the steps since the last average. Hogwild: threads of one process
     updating one shared parameter buffer without locks.
   READ FIRST
     dt_localsgd_step, dt_hogwild_push.
   USES
     dtrain/comm/launch.h (the threads a rank gets) and dtrain/train/checkpoint.h, and what they include.
*/
#ifndef DTRAIN_LOCALSGD_H
#define DTRAIN_LOCALSGD_H
#include "../comm/launch.h"
#include "checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_LOCALSGD_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_LOCALSGD_IMPLEMENTATION_DONE)
#define DTRAIN_LOCALSGD_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

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
    dt_localsgd *d = NULL;
    dt_result r;
    int me = dt_comm_rank(c);
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_localsgd_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (dd.period < 0 || dd.algo < 0 || dd.algo >= DT_ALGO_COUNT)
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_create: rank %d: bad desc (period %d, algo %d): period is >= 0 "
                         "(0 = only at dt_localsgd_average), algo a dt_algo", me, dd.period, (int)dd.algo);
    else if (!(d = (dt_localsgd *)DT_MALLOC(sizeof *d)))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_localsgd_create: rank %d: no memory", me);
    if ((r = dt__same_model(c, m, "dt_localsgd_create", 1, r)) != DT_OK || !d) {   /* every rank stops if one failed */
        if (d) DT_FREE(d);
        return r;
    }
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
    int64_t nb = 0, np = 0;
    float *b, *p;
    double t0 = dt_time_now();
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_average: localsgd is NULL");
    d->since = 0;
    if (dt_comm_size(d->comm) > 1) {
        dt_trace_begin("local sgd average", "comm");
        p = dt_model_params(d->model, &np);
        r = dt_comm_allreduce(d->comm, p, (size_t)np, DT_F32, DT_MEAN, d->desc.algo);
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
    dt_result r = dt__ckpt_load_comm(d->comm, "dt_localsgd_load", DT__CKPT_LOCALSGD, path, d->model, o, meta, &d->since, DT_OK);
    if (r == DT_OK && (d->since < 0 || (d->desc.period > 0 && d->since >= d->desc.period)))   /* else the averages fall elsewhere */
        r = dt_set_error(DT_ERR_FORMAT, "dt_localsgd_load: rank %d: %s holds %lld steps since the last average, outside 0..%lld for "
                         "period %lld: the file is damaged or foreign", dt_comm_rank(d->comm), path, (long long)d->since,
                         (long long)d->desc.period - 1, (long long)d->desc.period);
    return r;
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
    int64_t sp = 0, sb = 0, rp = 0, rb = 0;
    if ((r = dt__trainer_check(what, 1, 0, NULL, shared, "the shared model")) != DT_OK ||
        (r = dt__trainer_check(what, 1, 0, NULL, replica, "the replica")) != DT_OK) return r;
    dt_model_params(shared, &sp); dt_model_buffers(shared, &sb);
    dt_model_params(replica, &rp); dt_model_buffers(replica, &rb);
    if (sp != rp || sb != rb)
        return dt_set_error(DT_ERR_MISMATCH, "%s: the replica has %lld parameters and %lld buffer elements but the shared "
                            "model %lld and %lld: build the replica with the same architecture", what,
                            (long long)rp, (long long)rb, (long long)sp, (long long)sb);
    return DT_OK;
}

dt_result dt_hogwild_pull(dt_model *shared, dt_model *replica) {
    dt_result r = dt__hogwild_check(shared, replica, "dt_hogwild_pull");
    int64_t n = 0, nb = 0;
    float *p, *b;
    if (r != DT_OK) return r;
    p = dt_model_params(shared, &n);
    b = dt_model_buffers(shared, &nb);
    memcpy(dt_model_params(replica, NULL), p, sizeof(float) * (size_t)n);
    memcpy(dt_model_buffers(replica, NULL), b, sizeof(float) * (size_t)nb);
    return DT_OK;
}

dt_result dt_hogwild_push(dt_model *shared, dt_model *replica, float lr) {
    dt_result r = dt__hogwild_check(shared, replica, "dt_hogwild_push");
    float *p, *g, *b;
    int64_t i, n = 0, nb = 0;
    if (r != DT_OK) return r;
    if (!(lr >= 0.0f)) return dt_set_error(DT_ERR_INVALID_ARG, "dt_hogwild_push: lr %g must be >= 0", (double)lr);
    p = dt_model_params(shared, &n); g = dt_model_grads(replica, NULL);
    for (i = 0; i < n; i++) p[i] -= lr * g[i];   /* the same arithmetic as the SGD step */
    /* publishes the statistics the replica's forward updated: the shared model is evaluated with them */
    b = dt_model_buffers(shared, &nb);
    memcpy(b, dt_model_buffers(replica, NULL), sizeof(float) * (size_t)nb);
    dt_model_zero_grad(replica);
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
