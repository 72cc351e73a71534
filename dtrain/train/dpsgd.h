/* dtrain/train/dpsgd.h - D-PSGD: decentralised SGD by gossip over a topology.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_dpsgd: each rank's replica mixed with its neighbours' through the mixing matrix every step, CTA
     or ATC order, time-varying topologies, consensus distance, the averaged model, checkpoints; push-sum
     (SGP) over directed and time-varying graphs, the model holding the de-biased x / w.
   READ FIRST
     dt_dpsgd_step, dt__dpsgd_gossip, dt__dpsgd_push.
   USES
     dtrain/comm/topology.h and dtrain/train/checkpoint.h, and what they include.
*/
#ifndef DTRAIN_DPSGD_H
#define DTRAIN_DPSGD_H
#include "../comm/topology.h"
#include "checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    int            push_sum;    /* 1: push-sum gossip (SGP, Assran et al. 2019), which directed graphs need
                                   (column-stochastic W; plain D-PSGD refuses them): each rank keeps a numerator
                                   x and a weight w (1 at create), mixes both, and its model holds the
                                   de-biased z = x / w, which forward, backward and evaluation use */
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
   stepped replicas are mixed. o NULL: a pure gossip step x_i <- sum_j W[i][j] x_j.
   Push-sum (desc.push_sum): the step's change of the model, u = z' - z (o's update, the forward's to the
   buffers, any the caller made since the last step: z is x / w as the last step left it), goes into the
   numerator; ADAPT_THEN_COMBINE (SGP's order) sends (x + u, w) to the out-neighbours, x and w become the sums
   over the in-neighbours (W[i][j] x_j, in double, in rank order); COMBINE_THEN_ADAPT sends (x, w) and adds u
   to the sum. Then the model is set to z = x / w. */
dt_result dt_dpsgd_step(dt_dpsgd *d, dt_optim *o);
/* Collective: *dist = mean over ranks of ||x_i - x_avg|| (2-norm over all parameters), on every rank. */
dt_result dt_dpsgd_consensus(dt_dpsgd *d, double *dist);
/* Collective: out [dt_model_param_count] receives the mean of all replicas' parameters. out NULL: every
   rank's model itself is set to the mean parameters and mean buffers (for the final evaluation); push-sum
   restarts from it (x = the mean, w = 1). Push-sum's replicas are the de-biased models z = x / w. */
dt_result dt_dpsgd_average(dt_dpsgd *d, float *out);
/* Evaluating the averaged model in the middle of training: use = 1 (collective) keeps this rank's replica
   aside and loads the mean parameters and buffers into the model; use = 0 (local) puts the replica back. */
dt_result dt_dpsgd_use_average(dt_dpsgd *d, int use);
dt_dpsgd_stats dt_dpsgd_get_stats(const dt_dpsgd *d);    /* zeros for NULL */
/* This rank's push-sum weight w: its numerators are w times the model (to float rounding), and the weights of
   all ranks sum to the world size. 1 without push-sum, 0 for NULL. Local. */
double dt_dpsgd_push_weight(const dt_dpsgd *d);
/* Collective checkpoint of every rank's replica (they differ), optimizer o (may be NULL), meta and the step
   count, so a schedule resumes at the graph it stopped at; push-sum's numerators and weight too (x / w does
   not give x back to the bit). Not while the model holds the average (dt_dpsgd_use_average). A push-sum
   checkpoint loaded by another number of ranks restarts push-sum from the ranks' mean model (w = 1). */
dt_result dt_dpsgd_save(dt_dpsgd *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta);
dt_result dt_dpsgd_load(dt_dpsgd *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DPSGD_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_DPSGD_IMPLEMENTATION_DONE)
#define DTRAIN_DPSGD_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

/* ---- D-PSGD ------------------------------------------------------------------------------------
   One neighbour exchange per step sends the replica (n floats) to each neighbour and receives theirs
   into recv. The mix sums W[i][j] x_j over a fixed list (the ranks j = 0, 1, ... with an edge to i, and i
   itself in its place), in double, then adds the local update x_i' - x_i (zero when nothing stepped in
   between), so with the fully connected topology every rank computes the same average bit for bit.
   With a schedule the row of W, the neighbour lists and the room for their replicas follow the step's
   graph (dt__dpsgd_use_graph), after every rank has checked that graph the same way: a bad one stops every
   rank before any message, so none waits for a neighbour that refused.
   Push-sum (dt__dpsgd_push) sends to the out-neighbours and receives from the in-neighbours (the two lists
   of a directed graph; the same list otherwise) one message of the numerators with the weight w as its
   last float, mixed by the same sum: w takes exactly the mixing x does. */

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
    int64_t            msg;         /* floats of one neighbour's message: max(n, nb); push-sum n + nbm + 1 */
    int64_t            nbm;         /* push-sum: the buffers mixed (nb with mix_buffers, else 0) */
    int64_t            step;        /* the next step's number: the schedule's t, kept in checkpoints */
    int                deg;         /* neighbours of this rank in the current graph */
    int                cap;         /* neighbours that w, src and recv have room for */
    const int         *nbrs;        /* [deg] ascending (the graph's): the ranks this rank receives from */
    const int         *outs;        /* [nout] ascending: the ranks it sends to (nbrs unless the graph is directed) */
    int                nout;
    double            *w;           /* [deg + 1] W[i][j] in mixing order (j ascending, i in its place) */
    int                self_at;     /* position of this rank in that order */
    const float      **src;         /* [deg + 1] the replicas being mixed */
    float             *recv;        /* [cap * msg] the neighbours' replicas */
    float             *own;         /* [msg] this rank's replica as sent */
    float             *num;         /* push-sum [n + nbm + 2]: the numerators x of the parameters and of the mixed
                                       buffers, the weight w, and the world size (written for checkpoints) */
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
    DT_FREE(d->num);
    DT_FREE(d);
}

/* Sends own [cnt] to the neighbours, then x[k] = sum_j W[i][j] x_j[k] + (x[k] - own[k]). */
static dt_result dt__dpsgd_gossip(dt_dpsgd *d, float *x, const float *own, int64_t cnt) {
    int q, m = d->deg + 1;
    int64_t k;
    uint64_t b0 = dt_comm_get_stats(d->comm).bytes_sent;
    double t0 = dt_time_now();
    dt_neighbors nb;   /* undirected: the same ranks both ways */
    dt_result r;
    nb.to = d->outs;
    nb.nto = d->nout;
    nb.from = d->nbrs;
    nb.nfrom = d->deg;
    r = dt_comm_neighbor_exchange(d->comm, own, d->recv, (size_t)cnt, DT_F32, &nb);
    d->stats.comm_seconds += dt_time_now() - t0;
    d->stats.bytes_sent += dt_comm_get_stats(d->comm).bytes_sent - b0;
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
    int me = dt_comm_rank(d->comm), deg = g->offsets[me + 1] - g->offsets[me], q;
    int64_t big = d->msg;
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
    d->outs = g->directed ? g->out_neighbors + g->out_offsets[me] : d->nbrs;
    d->nout = g->directed ? g->out_offsets[me + 1] - g->out_offsets[me] : deg;
    d->self_at = d->deg;
    for (q = 0; q < d->deg; q++)
        if (d->nbrs[q] > me) { d->self_at = q; break; }
    for (q = 0; q <= d->deg; q++) {
        int j = q == d->self_at ? me : d->nbrs[q - (q > d->self_at)];
        d->w[q] = g->weights[(int64_t)me * g->world + j];
    }
    return DT_OK;
}

/* Plain D-PSGD refuses a directed graph (who: the message's start). */
static dt_result dt__dpsgd_undirected(const dt_dpsgd *d, const dt_topology *g, const char *who) {
    if (!g->directed || d->desc.push_sum) return DT_OK;
    return dt_set_error(DT_ERR_INVALID_ARG, "%s is directed (its W is column stochastic, not symmetric): D-PSGD's average "
                        "would drift from the mean; set dt_dpsgd_desc.push_sum = 1 to gossip over it by push-sum (SGP)", who);
}

/* The schedule's graph of step t, checked (the union over the period is checked once, at create). */
static dt_result dt__dpsgd_graph_at(const dt_dpsgd *d, int64_t t, const char *fn, const dt_topology **g) {
    char who[96];
    dt_result r;
    if (!(*g = d->desc.schedule(t, d->desc.schedule_user)))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d: the schedule gave no graph (NULL) for step %lld", fn,
                            dt_comm_rank(d->comm), (long long)t);
    snprintf(who, sizeof who, "%s: rank %d: the schedule's graph of step %lld", fn, dt_comm_rank(d->comm), (long long)t);
    if ((r = dt_topology_check(*g, dt_comm_size(d->comm), who)) != DT_OK) return r;
    return dt__dpsgd_undirected(d, *g, who);
}

/* Checks the graphs of steps 0 .. period-1 and their union, and makes room for the most neighbours any has. */
static dt_result dt__dpsgd_schedule_start(dt_dpsgd *d) {
    const dt_topology **g = (const dt_topology **)DT_MALLOC(sizeof *g * (size_t)d->desc.period);
    dt_result r = g ? DT_OK : dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory", dt_comm_rank(d->comm));
    int q;
    for (q = 0; q < d->desc.period && r == DT_OK; q++) r = dt__dpsgd_graph_at(d, q, "dt_dpsgd_create", &g[q]);
    if (r == DT_OK) {
        char who[96];
        snprintf(who, sizeof who, "dt_dpsgd_create: rank %d: the schedule's graphs of steps 0 .. %d", dt_comm_rank(d->comm), d->desc.period - 1);
        r = dt_topology_check_union(g, d->desc.period, dt_comm_size(d->comm), who);
    }
    for (q = 0; q < d->desc.period && r == DT_OK; q++) r = dt__dpsgd_use_graph(d, g[q]);
    DT_FREE((void *)g);
    return r;
}

/* Push-sum from the model as it is: x = z (parameters, and the mixed buffers), w = 1. */
static void dt__dpsgd_push_reset(dt_dpsgd *d) {
    memcpy(d->num, dt_model_params(d->model, NULL), sizeof(float) * (size_t)d->n);
    if (d->nbm) memcpy(d->num + d->n, dt_model_buffers(d->model, NULL), sizeof(float) * (size_t)d->nbm);
    d->num[d->n + d->nbm] = 1.0f;
}

/* Push-sum's step. The change of the model since the last step, u = z' - z with z = x / w as that step left
   it (the optimizer's update, the forward's to the mixed buffers, the caller's), goes into the numerators:
   ATC sends x + u, CTA sends x and adds u after the mix. The mix (dt__dpsgd_gossip over [x, w]) sums
   W[i][j] (x_j, w_j) over the in-neighbours; the model becomes z = x / w. Without a change u is 0 and x
   stays bit for bit. */
static dt_result dt__dpsgd_push(dt_dpsgd *d, dt_optim *o) {
    float *z = dt_model_params(d->model, NULL), *b = dt_model_buffers(d->model, NULL), *x = d->num, *own = d->own;
    int64_t n = d->n, cnt = d->n + d->nbm, k;
    int atc = d->desc.order == DT_DPSGD_ADAPT_THEN_COMBINE;
    double w = (double)x[cnt];
    dt_result r;
    if (o && (r = dt_optim_step(o)) != DT_OK) return r;
    DT__OMP(parallel for if (cnt > DT__PAR_MIN))
    for (k = 0; k < cnt; k++) {
        double u = (double)(k < n ? z[k] : b[k - n]) - (double)(float)((double)x[k] / w);
        float moved = (float)((double)x[k] + u);
        own[k] = atc ? moved : x[k];
        x[k] = moved;
    }
    own[cnt] = x[cnt];
    if ((r = dt__dpsgd_gossip(d, x, own, cnt + 1)) != DT_OK) return r;
    w = (double)x[cnt];
    DT__OMP(parallel for if (cnt > DT__PAR_MIN))
    for (k = 0; k < cnt; k++) {
        float v = (float)((double)x[k] / w);
        if (k < n) z[k] = v; else b[k - n] = v;
    }
    return DT_OK;
}

/* Collective: the mean of every rank's params and buffers into d->avg [n + nb]. */
static dt_result dt__dpsgd_mean(dt_dpsgd *d) {
    dt_result r;
    memcpy(d->avg, dt_model_params(d->model, NULL), sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(d->avg + d->n, dt_model_buffers(d->model, NULL), sizeof(float) * (size_t)d->nb);
    if (dt_comm_size(d->comm) == 1) return DT_OK;
    r = dt_comm_allreduce(d->comm, d->avg, (size_t)(d->n + d->nb), DT_F32, DT_MEAN, DT_ALGO_AUTO);
    return r;
}

dt_result dt_dpsgd_create(dt_dpsgd **out, dt_comm *c, dt_model *m, const dt_topology *t, const dt_dpsgd_desc *desc) {
    dt_dpsgd_desc dd;
    dt_dpsgd *d = NULL;
    dt_result r;
    int me = dt_comm_rank(c);
    if (out) *out = NULL;
    if ((r = dt__trainer_check("dt_dpsgd_create", out != NULL, 1, c, m, "the model")) != DT_OK) return r;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (dd.schedule && t)
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: both a topology and a schedule: give the topology NULL "
                         "when desc.schedule gives each step's graph", me);
    else if (dd.schedule && dd.period < 1)
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: a schedule needs desc.period >= 1 (is %d): the steps "
                         "over which its graphs together connect every rank (e.g. dt_topology_schedule.period)", me, dd.period);
    else if (!dd.schedule && (!t || !t->weights || !t->offsets))
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: the topology is %s: build it with dt_topology_create", me,
                         t ? "empty" : "NULL");
    else if (!dd.schedule && t->world != dt_comm_size(c))
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: the topology has %d ranks but the communicator %d: "
                         "give dt_topology_desc.world = dt_comm_size(c)", me, t->world, dt_comm_size(c));
    else if (dd.order < 0 || dd.order >= DT_DPSGD_ORDER_COUNT)
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: bad order %d: use a dt_dpsgd_order", me, (int)dd.order);
    else if (!(d = (dt_dpsgd *)DT_MALLOC(sizeof *d)))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory", me);
    if (d) {
        memset(d, 0, sizeof *d);
        d->comm = c;
        d->model = m;
        d->desc = dd;
        dt_model_params(m, &d->n);
        dt_model_buffers(m, &d->nb);
        d->nbm = dd.push_sum && dd.mix_buffers ? d->nb : 0;
        d->msg = dd.push_sum ? d->n + d->nbm + 1 : d->n > d->nb ? d->n : d->nb;
        d->own = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->msg + 1));
        d->keep = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + d->nb + 1));
        d->avg = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + d->nb + 1));
        if (dd.push_sum) d->num = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + d->nbm + 2));
        if (!d->own || !d->keep || !d->avg || (dd.push_sum && !d->num))
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory for the replicas of %lld floats", me, (long long)d->msg);
        else if (!dd.schedule) {
            char who[64];
            snprintf(who, sizeof who, "dt_dpsgd_create: rank %d: the topology", me);
            if ((r = dt__dpsgd_undirected(d, t, who)) == DT_OK) r = dt__dpsgd_use_graph(d, t);
        } else r = dt__dpsgd_schedule_start(d);
    }
    /* every rank stops if one failed (a bad graph on one rank, no memory), before anything waits on it */
    if ((r = dt__same_model(c, m, "dt_dpsgd_create", 1, r)) != DT_OK) { if (d) dt__dpsgd_free(d); return r; }
    if (d->num) dt__dpsgd_push_reset(d);   /* x = the broadcast model, w = 1 */
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
                            "first", dt_comm_rank(d->comm));
    if (d->desc.schedule) {   /* this step's graph, before anything changes */
        const dt_topology *g;
        if ((r = dt__dpsgd_graph_at(d, d->step, "dt_dpsgd_step", &g)) != DT_OK || (r = dt__dpsgd_use_graph(d, g)) != DT_OK) return r;
    }
    if (d->desc.push_sum) {
        if ((r = dt__dpsgd_push(d, o)) != DT_OK) return r;
        d->step++;
        d->stats.steps++;
        return DT_OK;
    }
    x = dt_model_params(d->model, NULL);
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
    const float *x;
    dt_result r;
    if (!d || !dist) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_consensus: %s is NULL", d ? "dist" : "dpsgd");
    *dist = 0.0;
    if ((r = dt__dpsgd_mean(d)) != DT_OK) return r;
    x = dt_model_params(d->model, NULL);
    for (k = 0; k < d->n; k++) {
        double e = (double)x[k] - (double)d->avg[k];
        s += e * e;
    }
    s = sqrt(s);
    if (dt_comm_size(d->comm) > 1 && (r = dt_comm_allreduce(d->comm, &s, 1, DT_F64, DT_SUM, DT_ALGO_AUTO)) != DT_OK) return r;
    *dist = s / (double)dt_comm_size(d->comm);
    return DT_OK;
}

dt_result dt_dpsgd_average(dt_dpsgd *d, float *out) {
    dt_result r;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_average: dpsgd is NULL");
    if ((r = dt__dpsgd_mean(d)) != DT_OK) return r;
    if (out) { memcpy(out, d->avg, sizeof(float) * (size_t)d->n); return DT_OK; }
    memcpy(dt_model_params(d->model, NULL), d->avg, sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(dt_model_buffers(d->model, NULL), d->avg + d->n, sizeof(float) * (size_t)d->nb);
    if (d->num && !d->using_avg) dt__dpsgd_push_reset(d);   /* push-sum goes on from the mean */
    return DT_OK;
}

dt_result dt_dpsgd_use_average(dt_dpsgd *d, int use) {
    float *b;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_use_average: dpsgd is NULL");
    if (!!use == d->using_avg)
        return dt_set_error(DT_ERR_STATE, "dt_dpsgd_use_average: rank %d: the model %s the average already", dt_comm_rank(d->comm),
                            use ? "holds" : "does not hold");
    b = dt_model_buffers(d->model, NULL);
    if (!use) {
        memcpy(dt_model_params(d->model, NULL), d->keep, sizeof(float) * (size_t)d->n);
        if (d->nb) memcpy(b, d->keep + d->n, sizeof(float) * (size_t)d->nb);
        d->using_avg = 0;
        return DT_OK;
    }
    memcpy(d->keep, dt_model_params(d->model, NULL), sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(d->keep + d->n, b, sizeof(float) * (size_t)d->nb);
    d->using_avg = 1;   /* before the average: push-sum's numerators stay for the replica put back */
    return dt_dpsgd_average(d, NULL);
}

dt_dpsgd_stats dt_dpsgd_get_stats(const dt_dpsgd *d) {
    dt_dpsgd_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

double dt_dpsgd_push_weight(const dt_dpsgd *d) { return !d ? 0.0 : d->num ? (double)d->num[d->n + d->nbm] : 1.0; }

/* The replica is the model's parameters, except while it holds the average. */
static dt_result dt__dpsgd_own_replica(const dt_dpsgd *d, const char *fn) {
    return d->using_avg ? dt_set_error(DT_ERR_STATE, "%s: rank %d: the model holds the average, not the replica: call "
                                       "dt_dpsgd_use_average(d, 0) first", fn, dt_comm_rank(d->comm)) : DT_OK;
}

/* Push-sum's floats in a checkpoint: the numerators, w, and the world that saved them. */
static int64_t dt__dpsgd_nextra(const dt_dpsgd *d) { return d->num ? d->n + d->nbm + 2 : 0; }

dt_result dt_dpsgd_save(dt_dpsgd *d, const char *path, dt_optim *o, const dt_checkpoint_meta *meta) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_save: dpsgd is NULL");
    if (d->num) d->num[d->n + d->nbm + 1] = (float)dt_comm_size(d->comm);
    return dt__ckpt_save_extra(d->comm, "dt_dpsgd_save", DT__CKPT_DPSGD, path, d->model, o, meta, d->step, d->num,
                               dt__dpsgd_nextra(d), dt__dpsgd_own_replica(d, "dt_dpsgd_save"));
}

dt_result dt_dpsgd_load(dt_dpsgd *d, const char *path, dt_optim *o, dt_checkpoint_meta *meta) {
    dt_result r;
    double w;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_load: dpsgd is NULL");
    r = dt__ckpt_load_extra(d->comm, "dt_dpsgd_load", DT__CKPT_DPSGD, path, d->model, o, meta, &d->step, d->num,
                            dt__dpsgd_nextra(d), dt__dpsgd_own_replica(d, "dt_dpsgd_load"));
    if (r == DT_OK && (d->step < 0 || d->step > DT_CHECKPOINT_MAX_COUNT))   /* the step picks a time-varying graph */
        r = dt_set_error(DT_ERR_FORMAT, "dt_dpsgd_load: rank %d: %s holds the step %lld, outside 0..%lld: the file is damaged or "
                         "foreign", dt_comm_rank(d->comm), path, (long long)d->step, (long long)DT_CHECKPOINT_MAX_COUNT);
    if (r != DT_OK || !d->num) return r;
    /* another world's file holds the old ranks' means (checkpoint.h): their x / w is not the model, so push-sum
       restarts from the model, the mean of theirs */
    if (d->num[d->n + d->nbm + 1] != (float)dt_comm_size(d->comm)) dt__dpsgd_push_reset(d);
    w = (double)d->num[d->n + d->nbm];
    if (!(w > 0.0 && w < 1e30))
        return dt_set_error(DT_ERR_FORMAT, "dt_dpsgd_load: rank %d: %s holds the push-sum weight %g, which must be positive and "
                            "finite: the file is damaged or foreign", dt_comm_rank(d->comm), path, w);
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
