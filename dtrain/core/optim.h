/* dtrain/core/optim.h - optimizers over the flat buffers, gradient clipping, learning-rate schedules.   Part of
   dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW in torch.optim's order of
     operations, each one fused pass over the flat parameter, gradient and state buffers (dt_ops.sgd_step,
     adam_step); freezing and per-tensor step counts; clipping by the global norm; constant, multi-step
     and cosine schedules with warm-up.
   USES
     dtrain/core/nn.h (the model's buffers and ops) and what it includes.
   READ FIRST
     dt_optim_step, dt_sched_lr.
*/
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_optim_kind { DT_OPTIM_SGD = 0, DT_OPTIM_ADAM, DT_OPTIM_ADAMW } dt_optim_kind;

/* Optimizer settings, zero = default except for lr, where 0 is a request (DT_DEFAULT in base.h). The semantics
   are torch.optim's SGD, Adam and AdamW. */
typedef struct dt_optim_desc {
    dt_optim_kind kind;
    float lr;                      /* >= 0 (0: the parameters stay); DT_DEFAULT: 0.01 (SGD), 0.001 (Adam, AdamW) */
    float momentum, dampening;     /* SGD */
    int   nesterov;                /* SGD; needs momentum > 0 and dampening 0 */
    float weight_decay;            /* L2 added to the gradient (SGD, Adam); decoupled (AdamW, default 0.01) */
    float beta1, beta2, eps;       /* Adam(W): defaults 0.9, 0.999, 1e-8 */
    float clip_norm;               /* > 0: each step first clips the gradients' global 2-norm to it
                                      (dt_optim_clip_grad_norm); 0: no clipping */
} dt_optim_desc;

typedef struct dt_optim dt_optim;

/* Creates an optimizer for the model's parameters, with its state (momentum, Adam moments) in flat
   buffers of the parameters' layout. The model must be finalized and must outlive the optimizer. desc NULL:
   every default (SGD, lr 0.01). */
dt_result dt_optim_create(dt_optim **out, dt_model *m, const dt_optim_desc *desc);
void      dt_optim_destroy(dt_optim *o);
/* One update of every trainable parameter from dt_model_grads(). One loop over the flat buffer (or over
   each stretch between frozen tensors), after the clipping desc.clip_norm asks for (a gradient norm that is
   not finite is then DT_ERR_NUMERIC, and nothing is updated). */
dt_result dt_optim_step(dt_optim *o);
dt_result dt_optim_set_lr(dt_optim *o, float lr);   /* a finite lr >= 0 (0 is 0: a schedule may end there) */
float     dt_optim_lr(const dt_optim *o);
/* Freezes (frozen = 1) or unfreezes the parameter tensors whose name starts with prefix ("" or NULL =
   all); frozen tensors are neither updated nor clipped. Returns the number of tensors matched, or -1. */
int       dt_optim_freeze(dt_optim *o, const char *prefix, int frozen);
/* Scales the trainable gradients so their global 2-norm is at most max_norm, as
   torch.nn.utils.clip_grad_norm_; *total_norm (may be NULL) receives the norm before clipping. */
dt_result dt_optim_clip_grad_norm(dt_optim *o, float max_norm, float *total_norm);
/* Optimizer state, for checkpoints: the flat state (0, 1 or 2 parameter-sized arrays, backend memory)
   and the per-tensor step counts. */
float    *dt_optim_state(dt_optim *o, int64_t *count);
int       dt_optim_tensors(const dt_optim *o);
int64_t   dt_optim_tensor_steps(const dt_optim *o, int i);
dt_result dt_optim_set_tensor_steps(dt_optim *o, const int64_t *steps, int count);

/* Learning-rate schedules as pure functions of the step (or epoch) t = 0, 1, ...: the rate of step t. */
typedef enum dt_sched_kind { DT_SCHED_CONSTANT = 0, DT_SCHED_MULTISTEP, DT_SCHED_COSINE } dt_sched_kind;
#define DT_SCHED_MAX_MILESTONES 8
typedef struct dt_sched_desc {
    dt_sched_kind kind;
    float   base_lr;
    int64_t milestones[DT_SCHED_MAX_MILESTONES]; /* multistep: lr *= gamma at each (ascending; 0 ends the list) */
    float   gamma;                                /* multistep: default 0.1 */
    int64_t t_max;                                /* cosine: half-period (CosineAnnealingLR's T_max) */
    float   min_lr;                               /* cosine: the floor (eta_min) */
    int64_t warmup;                               /* linear warm-up steps before the schedule (0 = none) */
    float   warmup_start;                         /* warm-up starts at base_lr * this (default 1/3) */
} dt_sched_desc;
/* The rate at t, as PyTorch's MultiStepLR / CosineAnnealingLR, preceded by LinearLR through SequentialLR
   when warmup > 0 (the main schedule then counts from t - warmup). */
float dt_sched_lr(const dt_sched_desc *s, int64_t t);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OPTIM_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_OPTIM_IMPLEMENTATION_DONE)
#define DTRAIN_OPTIM_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"

/* The rate DT_DEFAULT stands for: torch.optim's SGD has none, so 0.01 as the common course default; Adam's. */
static inline float dt__optim_default_lr(dt_optim_kind k) { return k == DT_OPTIM_SGD ? 0.01f : 0.001f; }

struct dt_optim {
    dt_model *m;
    dt_optim_desc d;
    float *state;                 /* [nstate * nparams]: SGD momentum, or Adam m then v */
    int64_t nstate;
    int ntensors;
    int64_t *steps;               /* per parameter tensor */
    unsigned char *frozen;        /* per parameter tensor */
};

dt_result dt_optim_create(dt_optim **out, dt_model *m, const dt_optim_desc *desc) {
    dt_optim *o;
    dt_optim_desc d;
    const dt_ops *ops;
    void *ctx;
    int64_t nparams;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: out is NULL");
    *out = NULL;
    if (!m || !dt__model_finalized(m)) return dt_set_error(DT_ERR_STATE, "dt_optim_create: the model is NULL or not finalized");
    if (desc) d = *desc;
    else { memset(&d, 0, sizeof d); d.lr = DT_DEFAULT; }
    if (d.kind < DT_OPTIM_SGD || d.kind > DT_OPTIM_ADAMW)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: unknown optimizer kind %d", (int)d.kind);
    if (d.lr == DT_DEFAULT) d.lr = dt__optim_default_lr(d.kind);   /* 0 is a request: no update */
    if (d.kind != DT_OPTIM_SGD) {
        if (d.beta1 == 0.0f) d.beta1 = 0.9f;
        if (d.beta2 == 0.0f) d.beta2 = 0.999f;
        if (d.eps == 0.0f) d.eps = 1e-8f;
        if (d.kind == DT_OPTIM_ADAMW && d.weight_decay == 0.0f) d.weight_decay = 0.01f;
    }
    if (!(d.lr >= 0.0f && d.lr < INFINITY) || d.momentum < 0.0f || d.weight_decay < 0.0f || d.dampening < 0.0f ||
        !(d.beta1 >= 0.0f && d.beta1 < 1.0f) || !(d.beta2 >= 0.0f && d.beta2 < 1.0f) || d.eps < 0.0f ||
        !(d.clip_norm >= 0.0f && d.clip_norm < INFINITY))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: invalid setting (lr %g, momentum %g, dampening %g, weight "
                            "decay %g, betas %g %g, eps %g, clip_norm %g): lr and clip_norm must be finite numbers >= 0 "
                            "(lr DT_DEFAULT for the default), the others >= 0 and betas < 1",
                            (double)d.lr, (double)d.momentum, (double)d.dampening, (double)d.weight_decay,
                            (double)d.beta1, (double)d.beta2, (double)d.eps, (double)d.clip_norm);
    if (d.nesterov && (d.momentum <= 0.0f || d.dampening != 0.0f))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: Nesterov momentum needs momentum > 0 and dampening 0 "
                            "(as torch.optim.SGD)");
    o = (dt_optim *)DT_MALLOC(sizeof *o);
    if (!o) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_optim_create: no memory");
    memset(o, 0, sizeof *o);
    o->m = m;
    o->d = d;
    o->ntensors = dt_model_param_tensors(m);
    ops = dt__model_ops(m, &ctx);
    nparams = dt_model_param_count(m);
    o->nstate = d.kind == DT_OPTIM_SGD ? (d.momentum != 0.0f ? 1 : 0) : 2;
    o->steps = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(o->ntensors + 1));
    o->frozen = (unsigned char *)DT_MALLOC((size_t)o->ntensors + 1);
    if (o->nstate) o->state = (float *)ops->alloc(ctx, (int64_t)sizeof(float) * o->nstate * nparams);
    if (!o->steps || !o->frozen || (o->nstate && !o->state)) {
        long long want = (long long)(o->nstate * nparams);
        dt_optim_destroy(o);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_optim_create: no memory for the optimizer state (%lld floats)", want);
    }
    memset(o->steps, 0, sizeof(int64_t) * (size_t)o->ntensors);
    memset(o->frozen, 0, (size_t)o->ntensors);
    if (o->nstate) ops->fill(ctx, o->state, o->nstate * nparams, 0.0f);
    {
        dt_result r = dt__sync(m, "dt_optim_create");
        if (r != DT_OK) { dt_optim_destroy(o); return r; }
    }
    *out = o;
    return DT_OK;
}

void dt_optim_destroy(dt_optim *o) {
    if (!o) return;
    if (o->state) {
        void *ctx;
        const dt_ops *ops = dt__model_ops(o->m, &ctx);
        ops->free(ctx, o->state);
    }
    DT_FREE(o->steps);
    DT_FREE(o->frozen);
    DT_FREE(o);
}

dt_result dt_optim_set_lr(dt_optim *o, float lr) {
    if (!o) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_set_lr: the optimizer is NULL");
    if (!(lr >= 0.0f) || !isfinite(lr))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_set_lr: learning rate %g: it must be finite and >= 0 (a schedule "
                            "that ends at 0 may set 0); the rate stays %g", (double)lr, (double)o->d.lr);
    o->d.lr = lr;
    return DT_OK;
}
float dt_optim_lr(const dt_optim *o) { return o ? o->d.lr : 0.0f; }

int dt_optim_freeze(dt_optim *o, const char *prefix, int frozen) {
    int i, n = 0;
    size_t len = prefix ? strlen(prefix) : 0;
    if (!o) return -1;
    for (i = 0; i < o->ntensors; i++)
        if (!len || strncmp(dt_model_param_info(o->m, i).name, prefix, len) == 0) { o->frozen[i] = (unsigned char)(frozen != 0); n++; }
    return n;
}

/* Calls fn over maximal stretches [first, last) of trainable tensors that share a step count, so the
   common case (nothing frozen) is one loop over the whole flat buffer. */
typedef void (*dt__stretch_fn)(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg);
static void dt__optim_stretches(dt_optim *o, dt__stretch_fn fn, void *arg) {
    int i = 0;
    while (i < o->ntensors) {
        int j = i;
        if (o->frozen[i]) { i++; continue; }
        dt_param_info first, last;
        while (j + 1 < o->ntensors && !o->frozen[j + 1] && o->steps[j + 1] == o->steps[i]) j++;
        first = dt_model_param_info(o->m, i);
        last = dt_model_param_info(o->m, j);
        fn(o, first.offset, last.offset + last.count - first.offset, o->steps[i], arg);
        i = j + 1;
    }
}

static void dt__optim_apply(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg) {
    void *ctx;
    const dt_ops *ops = dt__model_ops(o->m, &ctx);
    float *params = dt_model_params(o->m, NULL), *grads = dt_model_grads(o->m, NULL);
    const dt_optim_desc *d = &o->d;
    (void)arg;
    if (d->kind == DT_OPTIM_SGD) {
        ops->sgd_step(ctx, params + off, grads + off, o->state ? o->state + off : NULL, n, d->lr, d->momentum,
                      d->dampening, d->weight_decay, d->nesterov, step == 0);
    } else {
        /* bias corrections in double, as Python computes them, then used in float like PyTorch's kernels */
        double t = (double)(step + 1);
        double bc1 = 1.0 - pow((double)d->beta1, t), bc2 = 1.0 - pow((double)d->beta2, t);
        ops->adam_step(ctx, params + off, grads + off, o->state + off, o->state + dt_model_param_count(o->m) + off, n, d->lr,
                       d->beta1, d->beta2, d->eps, d->weight_decay, d->kind == DT_OPTIM_ADAMW,
                          (float)((double)d->lr / bc1), (float)sqrt(bc2));
    }
}

dt_result dt_optim_step(dt_optim *o) {
    int i;
    if (!o) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_step: optimizer is NULL");
    if (o->d.clip_norm > 0.0f) {
        dt_result r = dt_optim_clip_grad_norm(o, o->d.clip_norm, NULL);
        if (r != DT_OK) return r;
    }
    dt_trace_begin("optimizer step", "optim");
    dt__optim_stretches(o, dt__optim_apply, NULL);
    for (i = 0; i < o->ntensors; i++) o->steps[i] += !o->frozen[i];
    {
        dt_result r = dt__sync(o->m, "dt_optim_step");
        dt_trace_end();
        return r;
    }
}

static void dt__optim_sumsq(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg) {
    double part = 0.0;
    void *ctx;
    const dt_ops *ops = dt__model_ops(o->m, &ctx);
    (void)step;
    ops->sum_squares(ctx, dt_model_grads(o->m, NULL) + off, n, &part);
    *(double *)arg += part;
}
static void dt__optim_scale(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg) {
    void *ctx;
    const dt_ops *ops = dt__model_ops(o->m, &ctx);
    (void)step;
    ops->scale(ctx, dt_model_grads(o->m, NULL) + off, n, *(float *)arg);
}

dt_result dt_optim_clip_grad_norm(dt_optim *o, float max_norm, float *total_norm) {
    double sq = 0.0;
    float norm, coef;
    dt_result r;
    if (!o) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_clip_grad_norm: optimizer is NULL");
    if (!(max_norm > 0.0f)) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_clip_grad_norm: max_norm %g must be > 0", (double)max_norm);
    dt__optim_stretches(o, dt__optim_sumsq, &sq);
    if ((r = dt__sync(o->m, "dt_optim_clip_grad_norm")) != DT_OK) return r;
    norm = (float)sqrt(sq);
    if (total_norm) *total_norm = norm;
    if (!(norm == norm) || norm == INFINITY)
        return dt_set_error(DT_ERR_NUMERIC, "dt_optim_clip_grad_norm: the gradient norm is %g; the loss diverged or the "
                            "data holds NaN/inf", (double)norm);
    coef = max_norm / (norm + 1e-6f);
    if (coef < 1.0f) dt__optim_stretches(o, dt__optim_scale, &coef);
    return dt__sync(o->m, "dt_optim_clip_grad_norm");
}

/* The accessors dtrain/core/internal.h declares for checkpoints. */
static inline dt_model *dt__optim_model(const dt_optim *o) { return o->m; }
static inline dt_optim_desc *dt__optim_desc(dt_optim *o) { return &o->d; }
static inline int64_t *dt__optim_steps(dt_optim *o) { return o->steps; }

float *dt_optim_state(dt_optim *o, int64_t *count) {
    if (count) *count = o ? o->nstate * dt_model_param_count(o->m) : 0;
    return o ? o->state : NULL;
}
int dt_optim_tensors(const dt_optim *o) { return o ? o->ntensors : 0; }
int64_t dt_optim_tensor_steps(const dt_optim *o, int i) { return (o && i >= 0 && i < o->ntensors) ? o->steps[i] : 0; }
dt_result dt_optim_set_tensor_steps(dt_optim *o, const int64_t *steps, int count) {
    if (!o || !steps) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_set_tensor_steps: NULL argument");
    if (count != o->ntensors)
        return dt_set_error(DT_ERR_SHAPE, "dt_optim_set_tensor_steps: %d step counts for %d parameter tensors", count, o->ntensors);
    memcpy(o->steps, steps, sizeof(int64_t) * (size_t)count);
    return DT_OK;
}

static float dt__sched_main(const dt_sched_desc *s, int64_t t) {
    int i;
    double lr = s->base_lr;
    if (s->kind == DT_SCHED_MULTISTEP) {
        double gamma = s->gamma != 0.0f ? s->gamma : 0.1;
        for (i = 0; i < DT_SCHED_MAX_MILESTONES && s->milestones[i] > 0; i++)
            if (t >= s->milestones[i]) lr *= gamma;
    } else if (s->kind == DT_SCHED_COSINE && s->t_max > 0) {
        /* CosineAnnealingLR's closed form; past t_max it continues the cosine, as PyTorch does */
        lr = s->min_lr + (s->base_lr - s->min_lr) * (1.0 + cos(3.14159265358979323846 * (double)t / (double)s->t_max)) / 2.0;
    }
    return (float)lr;
}

float dt_sched_lr(const dt_sched_desc *s, int64_t t) {
    if (!s) return 0.0f;
    if (t < 0) t = 0;
    if (s->warmup > 0 && t < s->warmup) {
        double f0 = s->warmup_start != 0.0f ? s->warmup_start : 1.0 / 3.0;
        return (float)(s->base_lr * (f0 + (1.0 - f0) * (double)t / (double)s->warmup));
    }
    return dt__sched_main(s, t - (s->warmup > 0 ? s->warmup : 0));
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
