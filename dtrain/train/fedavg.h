/* dtrain/train/fedavg.h - FedAvg: federated averaging, server and clients, with attacks and dropouts.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_fed: rank 0 the server, clients simulated on the other ranks; the round's client draw and dropouts
     from (seed, round), local training with FedProx, attacking clients (label flipping, sign flipping,
     noise), aggregation by aggregate.h, checkpoints between rounds.
   READ FIRST
     dt_fed_round, dt__fed_train_client.
   USES
     dtrain/core/data.h, dtrain/comm/algos.h (the library's point-to-point calls on its reserved tags),
     dtrain/train/checkpoint.h and dtrain/train/aggregate.h, and what they include.
*/
#ifndef DTRAIN_FEDAVG_H
#define DTRAIN_FEDAVG_H
#include "../core/data.h"
#include "../comm/algos.h"
#include "checkpoint.h"
#include "aggregate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a client does with its round, for studying attacks. */
typedef enum dt_fed_behaviour {
    DT_FED_HONEST = 0,
    DT_FED_LABELFLIP,          /* trains on labels mapped through desc.flip (e.g. 1 -> 4, or a permutation) */
    DT_FED_SIGNFLIP,           /* sends the negated update */
    DT_FED_NOISE               /* sends Gaussian noise of std desc.noise_std instead of its update */
} dt_fed_behaviour;

#define DT_FED_MAX_CLASSES 256

/* The server's step from the round's aggregate Delta (the clients' mean update, or a robust aggregator's),
   on the parameters; the buffers (BatchNorm statistics) always take the aggregate as it is. The pseudo-gradient
   form of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, without bias correction:
     AVG      x += lr Delta                                   (FedAvg; lr 1 is McMahan et al.'s)
     AVGM     m = momentum m + Delta; x += lr m                (FedAvgM, Hsu et al. 2019)
     ADAGRAD  m = b1 m + (1 - b1) Delta; v += Delta^2;                          x += lr m / (sqrt(v) + tau)
     ADAM     m = b1 m + (1 - b1) Delta; v = b2 v + (1 - b2) Delta^2;           x += lr m / (sqrt(v) + tau)
     YOGI     m = b1 m + (1 - b1) Delta; v -= (1 - b2) Delta^2 sign(v - Delta^2); x += lr m / (sqrt(v) + tau)
   with m and v zero at the start (FedYogi's v too) and kept in FedAvg's checkpoints. */
typedef enum dt_fed_server {
    DT_FED_SERVER_AVG = 0, DT_FED_SERVER_AVGM, DT_FED_SERVER_ADAGRAD, DT_FED_SERVER_ADAM, DT_FED_SERVER_YOGI,
    DT_FED_SERVER_COUNT
} dt_fed_server;
const char *dt_fed_server_name(dt_fed_server k);   /* "avg", "avgm", "adagrad", "adam", "yogi" */
dt_result   dt_fed_server_parse(const char *s, dt_fed_server *out);

/* Its settings; zero means the default: lr 1 (AVG, AVGM) or 0.01 (the adaptive ones), momentum 0.9 (AVGM's
   beta, the adaptive ones' b1), beta2 0.99, tau 1e-3 (Reddi et al.'s). */
typedef struct dt_fed_server_desc {
    dt_fed_server kind;
    float         lr, momentum, beta2, tau;
} dt_fed_server_desc;

/* DP-FedAvg (McMahan, Ramage, Talwar and Zhang, ICLR 2018), with a trusted server: each report's update (its
   parameters and buffers) is clipped to an L2 norm of at most clip, the clipped updates are summed and divided
   by the clients sampled per round m (not by those that reported: the fixed denominator bounds one client's
   effect by clip / m), and Gaussian noise of std noise_multiplier * clip / m is added to each coordinate. The
   privacy spent after t rounds is dt_dp_epsilon(m / clients, noise_multiplier, t, delta) (aggregate.h), the
   accounting of Poisson sampling applied to the fixed-size draw, as TensorFlow Federated does. The noise is
   drawn from the run's seed, so a run repeats: that serves experiments, not a deployment, whose noise must
   come from a secret source. clip 0: off. Only with the mean aggregator (its sensitivity is the bound). */
typedef struct dt_fed_dp_desc {
    float clip;               /* the clipping norm S (> 0 turns DP on) */
    float noise_multiplier;   /* z: the noise's std is z S / m (0: clipping alone, no privacy) */
} dt_fed_dp_desc;

/* FedAvg settings; zero means the default, except for noise_std, agg.f and optim.lr, where 0 is a request
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
    dt_fed_agg_desc    agg;              /* the aggregator (kind, default the weighted mean) and its settings;
                                            cm_* from the model when zero */
    const dt_dataset  *data;             /* borrowed training set */
    const dt_partition *part;            /* borrowed: part k is client k's samples (parts == clients) */
    const dt_transform *transform;       /* copied; NULL = pixel / 255 */
    const int         *behaviour;        /* [clients] dt_fed_behaviour, copied; NULL = every client honest */
    int32_t            flip[DT_FED_MAX_CLASSES]; /* LABELFLIP: label y becomes flip[y]; all zeros = identity */
    int                flip_set;         /* 1: flip holds a map (else the identity) */
    float              noise_std;        /* NOISE: the noise's std, >= 0 (0: a zero update); DT_DEFAULT: 1 */
    uint64_t           seed;             /* client sampling, dropouts, loader shuffles, noise */
    dt_fed_server_desc server;           /* the server's step from the aggregate (default AVG: x += Delta) */
    dt_fed_dp_desc     dp;               /* DP-FedAvg: clipping and noise in place of the aggregator (default off) */
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
/* Collective checkpoint between rounds: rank 0's global model and its server optimizer's state (m, v), every
   rank's working model (its buffers and dropout RNG carry over from round to round) and meta (put the next
   round in meta.round). Nothing else persists: the draw of each round is a function of (seed, round), and the
   clients' optimizers and loaders are made afresh every round (FedProx's reference is the round's global
   model). A checkpoint of another server optimizer is refused, naming both. */
dt_result dt_fed_save(dt_fed *f, const char *path, const dt_checkpoint_meta *meta);
dt_result dt_fed_load(dt_fed *f, const char *path, dt_checkpoint_meta *meta);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_FEDAVG_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_FEDAVG_IMPLEMENTATION_DONE)
#define DTRAIN_FEDAVG_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"
/* The tag of FedAvg's reports: the library's second (comm/backend.h). */
#define DT__TAG_FEDAVG (DT__TAG_LIB + 1)

/* ---- FedAvg ------------------------------------------------------------------------------------
   The aggregators are pure functions over the updates. The round protocol needs no agreement message:
   every rank draws the same clients and dropouts from (seed, round), so each host knows which clients to
   train and the server knows which updates to expect; it posts one receive per reporting client, in client
   order, which matches the order each host sends in (same tag, same source: messages keep their order). */

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
    float         *server;       /* rank 0: [nserver] the server optimizer's m [n], then v [n] (AVGM: m only) */
    int64_t        nserver;
};

static const char *const dt__fed_server_names[DT_FED_SERVER_COUNT] = {"avg", "avgm", "adagrad", "adam", "yogi"};
const char *dt_fed_server_name(dt_fed_server k) { return dt__enum_name(dt__fed_server_names, DT_FED_SERVER_COUNT, (int)k); }
dt_result dt_fed_server_parse(const char *s, dt_fed_server *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__fed_server_names, DT_FED_SERVER_COUNT, s, &k, "server optimizer");
    if (r == DT_OK && out) *out = (dt_fed_server)k;
    return r;
}

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
    return dt__ckpt_save_extra(f->comm, "dt_fed_save", DT__CKPT_FEDAVG, path, f->model, NULL, meta, (int64_t)f->desc.server.kind,
                               f->server, f->nserver, DT_OK);
}

dt_result dt_fed_load(dt_fed *f, const char *path, dt_checkpoint_meta *meta) {
    if (!f) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_load: fed is NULL");
    int64_t word = 0;
    dt_result r = dt__ckpt_load_extra(f->comm, "dt_fed_load", DT__CKPT_FEDAVG, path, f->model, NULL, meta, &word, f->server,
                                      f->nserver, DT_OK);
    if (r == DT_OK && word != (int64_t)f->desc.server.kind)   /* every rank's section holds the kind: all refuse alike */
        r = dt_set_error(DT_ERR_MISMATCH, "dt_fed_load: rank %d: %s was written with the server optimizer %s; this run has %s",
                         dt_comm_rank(f->comm), path, dt_fed_server_name((dt_fed_server)word), dt_fed_server_name(f->desc.server.kind));
    return r;
}

void dt_fed_destroy(dt_fed *f) {
    if (!f) return;
    DT_FREE(f->behaviour); DT_FREE(f->sel); DT_FREE(f->drop); DT_FREE(f->kept); DT_FREE(f->last_kept);
    DT_FREE(f->global); DT_FREE(f->delta); DT_FREE(f->updates); DT_FREE(f->stats); DT_FREE(f->weights);
    DT_FREE((void *)f->ptrs); DT_FREE(f->who); DT_FREE(f->reqs); DT_FREE(f->ybuf); DT_FREE(f->server);
    DT_FREE(f);
}

/* dt_fed_create's part before its first collective, local to this rank: the desc's checks and defaults and the
   buffers. *out is NULL on failure. */
static dt_result dt__fed_setup(dt_fed **out, dt_comm *c, dt_model *m, const dt_fed_desc *desc) {
    dt_fed *f;
    dt_fed_desc d;
    int me = dt_comm_rank(c), i, nc;
    size_t n;
    *out = NULL;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!d.data || !d.part)   /* the two fields without a default */
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: desc%s is NULL: FedAvg needs the training set "
                            "(desc.data) and its partition into the clients' data (desc.part)", me,
                            !desc ? "" : !d.data ? ".data" : ".part");
    if (!d.clients) d.clients = dt_comm_size(c) > 1 ? dt_comm_size(c) - 1 : 1;
    if (!d.frac) d.frac = 1.0f;
    if (!d.local_epochs) d.local_epochs = 1;
    if (!d.batch) d.batch = 10;
    if (d.noise_std == DT_DEFAULT) d.noise_std = 1.0f;   /* 0 is a request: a noise attacker that sends zeros */
    if (d.optim.lr == DT_DEFAULT) d.optim.lr = dt__optim_default_lr(d.optim.kind);   /* 0 is a request too */
    if (!d.server.lr) d.server.lr = d.server.kind <= DT_FED_SERVER_AVGM ? 1.0f : 0.01f;
    if (!d.server.momentum) d.server.momentum = 0.9f;
    if (!d.server.beta2) d.server.beta2 = 0.99f;
    if (!d.server.tau) d.server.tau = 1e-3f;
    if (!d.agg.cm_rows) {   /* the class-mean check reads the last linear layer's weight */
        for (i = dt_model_param_tensors(m) - 1; i >= 0; i--) {
            dt_param_info pi = dt_model_param_info(m, i);
            if (pi.ndim == 2) {
                d.agg.cm_offset = pi.offset; d.agg.cm_rows = pi.shape[0]; d.agg.cm_cols = pi.shape[1];
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
    if ((int)d.server.kind < 0 || d.server.kind >= DT_FED_SERVER_COUNT || !(d.server.lr > 0.0f && d.server.lr < INFINITY) ||
        !(d.server.momentum > 0.0f && d.server.momentum < 1.0f) || !(d.server.beta2 > 0.0f && d.server.beta2 < 1.0f) ||
        !(d.server.tau > 0.0f && d.server.tau < INFINITY))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: the server optimizer %s with lr %g, momentum %g, beta2 %g, "
                            "tau %g: the kind is one of avg, avgm, adagrad, adam, yogi; lr and tau are finite and > 0; momentum and "
                            "beta2 in (0, 1)", me, dt_fed_server_name(d.server.kind), (double)d.server.lr, (double)d.server.momentum,
                            (double)d.server.beta2, (double)d.server.tau);
    if (!(d.dp.clip >= 0.0f && d.dp.clip < INFINITY) || !(d.dp.noise_multiplier >= 0.0f && d.dp.noise_multiplier < INFINITY) ||
        (d.dp.noise_multiplier > 0.0f && d.dp.clip == 0.0f) || (d.dp.clip > 0.0f && d.agg.kind != DT_FED_MEAN))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: DP with clip %g, noise multiplier %g and the aggregator %s: "
                            "clip and the multiplier are finite and >= 0, noise needs a clip > 0, and DP-FedAvg's bound holds "
                            "for the mean of the clipped updates only (agg.kind DT_FED_MEAN)", me, (double)d.dp.clip,
                            (double)d.dp.noise_multiplier, dt_fed_agg_name(d.agg.kind));
    if ((d.agg.kind == DT_FED_KRUM || d.agg.kind == DT_FED_MULTIKRUM) && d.agg.f < 0 && d.agg.f != DT_DEFAULT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: agg.f is %d: Krum's f is the number of Byzantine "
                            "clients to tolerate, >= 0 (DT_DEFAULT for the default, 1)", me, d.agg.f);
    if (nc < 1 || d.part->parts != nc || !(d.frac > 0.0f && d.frac <= 1.0f) || d.local_epochs < 1 || d.batch < 1 ||
        d.prox_mu < 0.0f || !(d.dropout_prob >= 0.0f && d.dropout_prob < 1.0f) || (int)d.agg.kind < 0 || d.agg.kind >= DT_FED_AGG_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: bad desc (clients %d, partition of %d parts, frac %g, "
                            "local_epochs %d, batch %lld, prox_mu %g, dropout_prob %g): the partition needs one part per "
                            "client, 0 < frac <= 1, 0 <= dropout_prob < 1", me, nc, d.part->parts, (double)d.frac,
                            d.local_epochs, (long long)d.batch, (double)d.prox_mu, (double)d.dropout_prob);
    for (i = 0; d.behaviour && i < nc; i++)   /* a label flipper without a map would train honestly: a study of nothing */
        if (d.behaviour[i] == DT_FED_LABELFLIP && !d.flip_set)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: client %d flips labels (DT_FED_LABELFLIP) but desc.flip_set "
                                "is 0: set desc.flip, the map, and flip_set = 1", me, i);
    if (!(f = (dt_fed *)DT_MALLOC(sizeof *f))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_create: rank %d: no memory", me);
    memset(f, 0, sizeof *f);
    f->comm = c; f->model = m; f->desc = d;
    dt_model_params(m, &f->n);
    dt_model_buffers(m, &f->len);
    f->len += f->n;
    f->desc.behaviour = NULL;
    f->nsel = (int)floor((double)d.frac * (double)nc + 0.5);
    if (f->nsel < 1) f->nsel = 1;
    if (f->nsel > nc) f->nsel = nc;
    if (f->nsel < dt__fed_min_clients(&d.agg)) {
        dt_fed_destroy(f);
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: %s needs at least %d clients per round, but C = %g of %d "
                            "clients samples %d: raise --frac or --clients", me, dt_fed_agg_name(d.agg.kind),
                            dt__fed_min_clients(&d.agg), (double)d.frac, nc, (int)floor((double)d.frac * nc + 0.5));
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
        f->nserver = d.server.kind == DT_FED_SERVER_AVG ? 0 : d.server.kind == DT_FED_SERVER_AVGM ? f->n : 2 * f->n;
        if (f->nserver && (f->server = (float *)DT_MALLOC(sizeof(float) * (size_t)f->nserver)) != NULL)
            memset(f->server, 0, sizeof(float) * (size_t)f->nserver);
    }
    if (!f->behaviour || !f->sel || !f->drop || !f->kept || !f->last_kept || !f->global || !f->delta || !f->ybuf ||
        (me == 0 && (!f->updates || !f->stats || !f->weights || !f->ptrs || !f->who || !f->reqs || (f->nserver && !f->server)))) {
        dt_fed_destroy(f);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_create: rank %d: no memory (the server keeps %d updates of %lld floats: "
                            "lower --frac)", me, f->nsel, (long long)f->len);
    }
    for (i = 0; i < nc; i++) {
        f->behaviour[i] = d.behaviour ? d.behaviour[i] : DT_FED_HONEST;
        f->last_kept[i] = 0;
    }
    *out = f;
    return DT_OK;
}

dt_result dt_fed_create(dt_fed **out, dt_comm *c, dt_model *m, const dt_fed_desc *desc) {
    dt_fed *f = NULL;
    dt_result r;
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_fed_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    r = dt__fed_setup(&f, c, m, desc);
    /* every rank stops if one failed (a bad desc, no memory), before anything waits on it */
    if ((r = dt__same_model(c, m, "dt_fed_create", 0, r)) != DT_OK) { dt_fed_destroy(f); return r; }
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
    {   /* its dropout masks from (seed, client, round), not from the passes its rank ran before: the same on any
           number of ranks (the round in the step's high half: a client runs fewer than 2^32 passes a round) */
        uint64_t rng[3];
        rng[0] = d->seed ^ 0x6a09e667f3bcc909ULL; rng[1] = (uint64_t)k; rng[2] = (uint64_t)round << 32;
        dt__model_set_rng(m, rng);
    }
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
        return dt_set_error(r, "dt_fed_round: rank %d: client %d failed in round %lld: %s", dt_comm_rank(f->comm), k, (long long)round,
                            dt_last_error());
    return DT_OK;
}

/* DP-FedAvg's aggregate (rank 0) of the round's n reports into f->delta: each clipped to f->desc.dp.clip, summed,
   divided by the clients sampled, plus seeded Gaussian noise of std z clip / nsel per coordinate. */
static dt_result dt__fed_dp_aggregate(dt_fed *f, int64_t round, int n) {
    double clip = (double)f->desc.dp.clip;
    float std = (float)((double)f->desc.dp.noise_multiplier * clip / (double)f->nsel);
    int i;
    int64_t j;
    dt_rng nr;
    for (j = 0; j < f->len; j++) f->delta[j] = 0.0f;
    for (i = 0; i < n; i++) {
        const float *u = f->ptrs[i];
        double sq = 0.0, scale;
        for (j = 0; j < f->len; j++) sq += (double)u[j] * (double)u[j];
        if (!(sq < INFINITY))   /* a NaN would pass the clip unscaled */
            return dt_set_error(DT_ERR_NUMERIC, "dt_fed_round: round %lld: client %d's update has the norm %g: it diverged or its "
                                "report is corrupt", (long long)round, f->who[i], sqrt(sq));
        scale = sq > clip * clip ? clip / sqrt(sq) : 1.0;
        for (j = 0; j < f->len; j++) f->delta[j] += (float)(scale * (double)u[j] / (double)f->nsel);
        f->kept[i] = 1;
    }
    if (std > 0.0f) {
        dt__fed_rng(&nr, f, round, 4, 0);
        for (j = 0; j < f->len; j++) f->delta[j] += std * dt_rng_normal(&nr);
    }
    return DT_OK;
}

/* The server optimizer (rank 0): the aggregate Delta [len] becomes the step to add to the global model; the
   buffers' part stays the aggregate. Per element in float, as dt_optim's updates are. */
static void dt__fed_server_step(dt_fed *f, float *delta) {
    const dt_fed_server_desc *s = &f->desc.server;
    float *m = f->server, *v = f->server ? f->server + f->n : NULL, lr = s->lr, b1 = s->momentum, b2 = s->beta2;
    int64_t j;
    switch (s->kind) {
    case DT_FED_SERVER_AVG:
        if (lr != 1.0f) for (j = 0; j < f->n; j++) delta[j] *= lr;
        return;
    case DT_FED_SERVER_AVGM:
        for (j = 0; j < f->n; j++) { m[j] = b1 * m[j] + delta[j]; delta[j] = lr * m[j]; }
        return;
    default:
        for (j = 0; j < f->n; j++) {
            float g = delta[j], g2 = g * g;
            m[j] = b1 * m[j] + (1.0f - b1) * g;
            if (s->kind == DT_FED_SERVER_ADAGRAD) v[j] += g2;
            else if (s->kind == DT_FED_SERVER_ADAM) v[j] = b2 * v[j] + (1.0f - b2) * g2;
            else v[j] -= (1.0f - b2) * g2 * (v[j] > g2 ? 1.0f : v[j] < g2 ? -1.0f : 0.0f);   /* YOGI */
            delta[j] = lr * m[j] / (sqrtf(v[j]) + s->tau);
        }
    }
}

dt_result dt_fed_round(dt_fed *f, int64_t round, dt_fed_round_info *info) {
    dt_comm *c;
    int me, p, nsel, i, nrep = 0, nreq = 0, nagg = 0;
    float lr;
    int64_t j;
    double loss = 0.0, samples = 0.0;
    dt_result r = DT_OK;
    if (!f) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_round: fed is NULL");
    c = f->comm; me = dt_comm_rank(c); p = dt_comm_size(c);
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
    for (i = 0; i < nrep; i++) {   /* each report's counts as the client holds them; clients with no samples report nothing useful */
        int64_t held = f->desc.part->offsets[f->who[i] + 1] - f->desc.part->offsets[f->who[i]];
        char what[96];
        snprintf(what, sizeof what, "client %d's sample count (it holds %lld)", f->who[i], (long long)held);
        if ((r = dt__reduced_check(c, "dt_fed_round", what, f->stats[2 * i], (double)held, (double)held)) != DT_OK) return r;
        snprintf(what, sizeof what, "client %d's training loss sum", f->who[i]);
        if ((r = dt__reduced_check(c, "dt_fed_round", what, f->stats[2 * i + 1], 0.0, DBL_MAX)) != DT_OK) return r;
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
    if (nagg < dt__fed_min_clients(&f->desc.agg)) {   /* too many dropped: the global model stays */
        if (nagg > 0)
            dt_log(DT_LOG_WARN, "dt_fed_round: round %lld: %d clients reported, fewer than %s needs; the global model is kept",
                   (long long)round, nagg, dt_fed_agg_name(f->desc.agg.kind));
        return DT_OK;
    }
    dt_trace_begin("aggregate", "optim");
    dt__trace_arg("clients", NULL, nagg);
    dt__trace_arg("aggregator", f->desc.dp.clip > 0.0f ? "dp" : dt_fed_agg_name(f->desc.agg.kind), 0);
    if (f->desc.dp.clip > 0.0f) r = dt__fed_dp_aggregate(f, round, nagg);
    else r = dt__fed_aggregate(&f->desc.agg, f->ptrs, f->weights, nagg, f->len, f->n, f->delta, f->kept);
    dt_trace_end();
    if (r != DT_OK) return r;
    dt__fed_server_step(f, f->delta);   /* the parameters' step from the aggregate */
    for (j = 0; j < f->len; j++) f->delta[j] += f->global[j];   /* global + the step, as global[j] + delta[j] */
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
