/* test_pushsum.c - push-sum gossip (SGP, Assran et al. 2019) on directed and time-varying graphs.
   Directed topologies: push weights (column stochastic, 1 / (outdeg + 1)), in- and out-lists, strong
   connectivity, the checks refusing what push-sum cannot use; the directed one-peer exponential graph's
   period multiplies to the averaging matrix for 4 and 8 ranks (and not for 3). D-PSGD with push_sum: pure
   gossip on a directed ring of 3, 4 and 5 local ranks reaches the mean of the initial values within 1e-6
   and keeps the sum of the numerators; on a directed graph that is not regular the weights move away from
   1, the numerators x alone do not reach the mean but the de-biased models x / w do, and one step follows
   the formula (parameters and batch-norm buffers, both orders); the directed one-peer exponential graph gives
   every rank the mean bit for bit in log2 p steps on 4 and 8 ranks; plain D-PSGD refuses a directed graph,
   static or from a schedule; on one rank a push-sum step is an SGD step; training with momentum and batch
   norm lowers the loss and ends with the same bits under another thread schedule. */
#include "../dtrain.h"
#include "dt_test.h"

#define IN 3         /* a linear model 3 -> 2 with bias: 8 parameters */
#define K 2
#define NP 8
#define MAXR 8
#define GSTEPS 100   /* gossip steps on the directed rings */

static dt_result make_model(dt_model **m, uint64_t seed, int bn) {
    dt_model_desc d;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = IN; d.seed = seed;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    x = dt_linear(*m, dt_model_input(*m), K, 1);
    if (bn) dt_batchnorm(*m, x);
    return dt_model_finalize(*m);
}

/* The directed ring plus the chord 0 -> 2: rank 0 sends to two ranks, so W is not doubly stochastic. */
static dt_result chord_graph(dt_topology *t, int p) {
    uint8_t adj[MAXR * MAXR];
    dt_topology_desc td;
    int i;
    memset(adj, 0, sizeof adj);
    for (i = 0; i < p; i++) adj[i * p + (i + 1) % p] = 1;
    adj[0 * p + 2] = 1;
    memset(&td, 0, sizeof td);
    td.kind = DT_TOPO_CUSTOM; td.world = p; td.adjacency = adj; td.directed = 1;
    return dt_topology_create(t, &td);
}

/* ---- directed topologies ---- */

static void test_directed_topologies(void) {
    dt_topology t, u;
    dt_topology_desc td;
    dt_topology_schedule s;
    uint8_t adj[9];
    double col, wbad[16];
    int i, j, p;
    memset(&td, 0, sizeof td);
    td.kind = DT_TOPO_RING; td.world = 4; td.directed = 1;
    CHECK_OK(dt_topology_create(&t, &td));
    CHECK(t.directed == 1 && t.spectral_gap == -1.0);
    for (i = 0; i < 4; i++) {   /* i -> i + 1: receives from i - 1, sends to i + 1, keeps 1/2 */
        CHECK(t.offsets[i + 1] - t.offsets[i] == 1 && t.neighbors[t.offsets[i]] == (i + 3) % 4);
        CHECK(t.out_offsets[i + 1] - t.out_offsets[i] == 1 && t.out_neighbors[t.out_offsets[i]] == (i + 1) % 4);
        for (j = 0; j < 4; j++) CHECK(t.weights[i * 4 + j] == (j == i || j == (i + 3) % 4 ? 0.5 : 0.0));
    }
    CHECK_OK(dt_topology_check(&t, 4, NULL));
    memcpy(wbad, t.weights, sizeof wbad);   /* column 1 sums to 1.25 */
    t.weights[2 * 4 + 1] = 0.75;
    CHECK_ERR(dt_topology_check(&t, 4, "here"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "here: the push weights are not column stochastic: column 1") != NULL);
    t.weights[2 * 4 + 1] = 0.5;
    t.weights[3 * 4 + 1] = 0.25; t.weights[1 * 4 + 1] = 0.25;   /* column 1 sums to 1, but 1 -> 3 is no edge */
    CHECK_ERR(dt_topology_check(&t, 4, "here"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "there is no edge 1 -> 3") != NULL);
    memcpy(t.weights, wbad, sizeof wbad);
    t.weights[0] = 0.0; t.weights[1 * 4 + 0] = 1.0;             /* rank 0 keeps nothing */
    CHECK_ERR(dt_topology_check(&t, 4, "here"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "a rank must keep a share of its own mass") != NULL);
    memcpy(t.weights, wbad, sizeof wbad);
    t.out_neighbors[0] = 2;                                     /* 0 sends to 2, but 2 receives from 1 */
    CHECK_ERR(dt_topology_check(&t, 4, "here"), DT_ERR_INVALID_ARG);
    t.out_neighbors[0] = 1;
    CHECK_OK(dt_topology_check(&t, 4, "here"));
    dt_topology_free(&t);

    td.kind = DT_TOPO_EXPONENTIAL; td.world = 8;                /* i -> i + 1, 2, 4: keeps 1/4 */
    CHECK_OK(dt_topology_create(&t, &td));
    for (i = 0; i < 8; i++) {
        for (col = 0.0, j = 0; j < 8; j++) col += t.weights[j * 8 + i];
        CHECK(col == 1.0 && t.weights[i * 8 + i] == 0.25 && t.weights[((i + 4) % 8) * 8 + i] == 0.25);
        CHECK(t.weights[((i + 7) % 8) * 8 + i] == 0.0);
    }
    dt_topology_free(&t);
    td.mixing = DT_MIXING_METROPOLIS;
    CHECK_ERR(dt_topology_create(&t, &td), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "Metropolis weights need undirected edges") != NULL);
    td.mixing = DT_MIXING_UNIFORM;

    CHECK_OK(chord_graph(&t, 4));                               /* not regular: rows do not sum to 1 */
    CHECK(t.weights[1 * 4 + 0] == 1.0 / 3.0 && t.weights[2 * 4 + 0] == 1.0 / 3.0 && t.weights[2 * 4 + 1] == 0.5);
    dt_topology_free(&t);
    memset(adj, 0, sizeof adj);                                 /* 0 -> 1 -> 2 -> 1: nobody reaches 0 */
    adj[0 * 3 + 1] = adj[1 * 3 + 2] = adj[2 * 3 + 1] = 1;
    td.kind = DT_TOPO_CUSTOM; td.world = 3; td.adjacency = adj;
    CHECK_ERR(dt_topology_create(&t, &td), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "the graph is not strongly connected (rank 1 cannot reach rank 0") != NULL);
    td.directed = 0;                                            /* the same adjacency, undirected: not symmetric */
    CHECK_ERR(dt_topology_create(&t, &td), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "not symmetric") != NULL);
    td.kind = DT_TOPO_RING; td.world = 5;                       /* the undirected ring is as before */
    CHECK_OK(dt_topology_create(&u, &td));
    CHECK(!u.directed && !u.out_offsets && u.spectral_gap > 0.0);
    dt_topology_free(&u);

    /* directed one-peer exponential: the period's product is the averaging matrix for 4 and 8 ranks */
    for (p = 3; p <= 8; p++) {
        double prod[MAXR * MAXR], next[MAXR * MAXR], err = 0.0;
        int k, q;
        if (p != 3 && p != 4 && p != 8) continue;
        CHECK_OK(dt_topology_one_peer_exp_directed(&s, p));
        CHECK(s.period == (p == 8 ? 3 : 2));
        for (i = 0; i < p * p; i++) prod[i] = i % (p + 1) == 0;
        for (k = 0; k < s.period; k++) {
            const dt_topology *g = dt_topology_schedule_at(k, &s);
            CHECK_OK(dt_topology_check(g, p, NULL));
            CHECK(g->directed && g->out_neighbors[g->out_offsets[1]] == (1 + (1 << k)) % p);
            for (i = 0; i < p; i++)
                for (j = 0; j < p; j++) {
                    double acc = 0.0;
                    for (q = 0; q < p; q++) acc += g->weights[i * p + q] * prod[q * p + j];
                    next[i * p + j] = acc;
                }
            memcpy(prod, next, sizeof(double) * (size_t)(p * p));
        }
        for (i = 0; i < p * p; i++) err = fabs(prod[i] - 1.0 / p) > err ? fabs(prod[i] - 1.0 / p) : err;
        if (p == 3) CHECK(err > 0.1); else CHECK(err == 0.0);
        {   /* each graph alone does not connect more than 2 ranks; the schedule's union does */
            const dt_topology *g[3] = {&s.graphs[0], &s.graphs[1], &s.graphs[s.period - 1]};
            if (p != 3) {   /* i -> i + 2^(period-1) alone: two cycles */
                CHECK_ERR(dt_topology_check_union(g + 2, 1, p, "one"), DT_ERR_INVALID_ARG);
                CHECK(strstr(dt_last_error(), "one: the union of the 1 graphs is not strongly connected") != NULL);
            }
            CHECK_OK(dt_topology_check_union(g, s.period, p, NULL));
        }
        dt_topology_schedule_free(&s);
    }
    CHECK_ERR(dt_topology_one_peer_exp_directed(&s, 0), DT_ERR_INVALID_ARG);
}

/* ---- pure gossip ---- */
typedef struct gjob {
    int p, steps, order, bn, sched;   /* sched: the directed one-peer exponential schedule */
    dt_topology topo;
    dt_topology_schedule s;
    float start[MAXR][NP], after1[MAXR][NP], end[MAXR][NP];
    float binit[MAXR][2 * K], bstart[MAXR][2 * K], bafter[MAXR][2 * K];
    double w1[MAXR], w[MAXR], dist[MAXR][GSTEPS + 1];
    uint64_t bytes[MAXR];
} gjob;

/* Distinct replicas (integers: their means are exact for p a power of two), set after the create (a change
   the first step pushes), then `steps` gossip steps. With bn the parameters are left as the create's
   broadcast made them, and a forward moves each rank's batch-norm statistics apart. */
static dt_result gossip_rank(dt_comm *c, void *arg) {
    gjob *j = (gjob *)arg;
    int me = dt_comm_rank(c), k, t;
    dt_model *m = NULL;
    dt_dpsgd *d = NULL;
    dt_dpsgd_desc dd;
    dt_result r;
    memset(&dd, 0, sizeof dd);
    dd.push_sum = 1; dd.order = (dt_dpsgd_order)j->order; dd.mix_buffers = j->bn;
    if (j->sched) { dd.schedule = dt_topology_schedule_at; dd.schedule_user = &j->s; dd.period = j->s.period; }
    for (k = 0; k < NP; k++) j->start[me][k] = (float)((me * 37 + k * 11) % 23 - 11);
    if ((r = make_model(&m, 1, j->bn)) != DT_OK || (r = dt_dpsgd_create(&d, c, m, j->sched ? NULL : &j->topo, &dd)) != DT_OK)
        goto out;
    if (j->bn) {
        float x[4 * IN];
        for (k = 0; k < 4 * IN; k++) x[k] = (float)((me * 7 + k * 5) % 11) - 5.0f;
        if ((r = dt_model_get_buffers(m, j->binit[me], 2 * K)) != DT_OK || (r = dt_model_forward(m, x, 4)) != DT_OK ||
            (r = dt_model_get_buffers(m, j->bstart[me], 2 * K)) != DT_OK)
            goto out;
    } else if ((r = dt_model_set_params(m, j->start[me], NP)) != DT_OK) goto out;
    for (t = 0; t < j->steps && r == DT_OK; t++) {
        if ((r = dt_dpsgd_consensus(d, &j->dist[me][t])) != DT_OK || (r = dt_dpsgd_step(d, NULL)) != DT_OK) break;
        if (t == 0) {
            j->w1[me] = dt_dpsgd_push_weight(d);
            if (!j->bn && (r = dt_model_get_params(m, j->after1[me], NP)) != DT_OK) break;
            if (j->bn && (r = dt_model_get_buffers(m, j->bafter[me], 2 * K)) != DT_OK) break;
        }
    }
    if (r == DT_OK) r = dt_dpsgd_consensus(d, &j->dist[me][j->steps]);
    if (r == DT_OK && !j->bn) r = dt_model_get_params(m, j->end[me], NP);
    j->w[me] = dt_dpsgd_push_weight(d);
    j->bytes[me] = dt_dpsgd_get_stats(d).bytes_sent;
out:
    dt_dpsgd_destroy(d);
    dt_model_destroy(m);
    return r;
}

static void gossip_launch(gjob *j) {
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.ranks = j->p; ld.comm.timeout = 20;
    CHECK_OK(dt_launch_local(&ld, gossip_rank, j, NULL));
}

static void means(const gjob *j, double *mean) {
    int i, k;
    for (k = 0; k < NP; k++) {
        for (mean[k] = 0.0, i = 0; i < j->p; i++) mean[k] += j->start[i][k];
        mean[k] /= j->p;
    }
}

/* Directed rings of 3, 4 and 5: plain gossip cannot use them (W is not symmetric); push-sum's models reach
   the mean of the initial values within 1e-6, the weights stay 1 (W is doubly stochastic here) and the sum of
   the numerators stays the sum of the initial values; each rank sends one message of NP + 1 floats a step. */
static void test_directed_ring(void) {
    static gjob j;
    dt_topology_desc td;
    int p, i, k;
    for (p = 3; p <= 5; p++) {
        double mean[NP], err = 0.0, sum;
        memset(&j, 0, sizeof j);
        j.p = p; j.steps = GSTEPS; j.order = DT_DPSGD_ADAPT_THEN_COMBINE;
        memset(&td, 0, sizeof td);
        td.kind = DT_TOPO_RING; td.world = p; td.directed = 1;
        CHECK_OK(dt_topology_create(&j.topo, &td));
        gossip_launch(&j);
        means(&j, mean);
        for (i = 0; i < p; i++) {
            for (k = 0; k < NP; k++) err = fabs(j.end[i][k] - mean[k]) > err ? fabs(j.end[i][k] - mean[k]) : err;
            CHECK(j.w[i] == 1.0);
            CHECK(j.dist[i][0] > 1.0 && j.dist[i][GSTEPS] < 1e-6);
            CHECK(j.bytes[i] == (uint64_t)GSTEPS * (NP + 1) * sizeof(float));
        }
        for (k = 0; k < NP; k++) {
            for (sum = 0.0, i = 0; i < p; i++) sum += (double)j.end[i][k] * j.w[i];
            CHECK(fabs(sum - mean[k] * p) < 1e-5);
        }
        printf("    directed ring of %d: largest distance to the mean after %d steps %.3g, consensus %.3g\n", p, GSTEPS, err,
               j.dist[0][GSTEPS]);
        CHECK(err < 1e-6);
        dt_topology_free(&j.topo);
    }
}

/* The directed ring of 4 with the chord 0 -> 2 (column stochastic, not row stochastic): the weights leave 1
   and still sum to 4; the numerators x = w z alone stay away from the mean, the de-biased models reach it;
   the first step (ATC) follows the formula z_i = sum_j W[i][j] x_j / sum_j W[i][j] w_j, x_j the values set
   and w_j = 1. With batch norm, the buffers the forward moved are mixed the same way, ATC and CTA by their
   formulas. */
static void test_not_regular(void) {
    static gjob j;
    int i, k, q, p = 4, order;
    double mean[NP], wsum = 0.0, zerr = 0.0, xerr = 0.0;
    memset(&j, 0, sizeof j);
    j.p = p; j.steps = GSTEPS; j.order = DT_DPSGD_ADAPT_THEN_COMBINE;
    CHECK_OK(chord_graph(&j.topo, p));
    gossip_launch(&j);
    means(&j, mean);
    for (i = 0; i < p; i++) {
        wsum += j.w[i];
        for (k = 0; k < NP; k++) {
            zerr = fabs(j.end[i][k] - mean[k]) > zerr ? fabs(j.end[i][k] - mean[k]) : zerr;
            xerr = fabs(j.end[i][k] * j.w[i] - mean[k]) > xerr ? fabs(j.end[i][k] * j.w[i] - mean[k]) : xerr;
        }
    }
    printf("    chord graph of 4: weights %.4f %.4f %.4f %.4f; the models within %.3g of the mean, the numerators %.3g\n",
           j.w[0], j.w[1], j.w[2], j.w[3], zerr, xerr);
    CHECK(fabs(wsum - p) < 1e-5 && fabs(j.w[2] - 1.0) > 0.1);
    CHECK(zerr < 1e-6);
    CHECK(xerr > 0.1);                                 /* without the division there is no consensus on the mean */
    for (i = 0; i < p; i++) {
        float want[NP];
        double rowsum = 0.0;
        for (q = 0; q < p; q++) rowsum += j.topo.weights[i * p + q];
        CHECK(j.w1[i] == (double)(float)rowsum);
        for (k = 0; k < NP; k++) {
            double acc = 0.0;
            for (q = 0; q < p; q++) acc += j.topo.weights[i * p + q] * j.start[q][k];
            want[k] = (float)(acc / rowsum);
        }
        CHECK_CLOSE(j.after1[i], want, NP, 1e-6, "the first push-sum step");
    }
    dt_topology_free(&j.topo);
    for (order = 0; order < DT_DPSGD_ORDER_COUNT; order++) {   /* batch-norm statistics, mix_buffers */
        memset(&j, 0, sizeof j);
        j.p = p; j.steps = 1; j.bn = 1; j.order = order;
        CHECK_OK(chord_graph(&j.topo, p));
        gossip_launch(&j);
        CHECK(memcmp(j.bstart[0], j.bstart[1], sizeof j.bstart[0]) != 0);
        for (i = 0; i < p; i++) {
            float want[2 * K], *init = j.binit[0];   /* the statistics at create: rank 0's on every rank */
            double rowsum = 0.0;
            for (q = 0; q < p; q++) rowsum += j.topo.weights[i * p + q];
            for (k = 0; k < 2 * K; k++) {
                double acc = 0.0;
                for (q = 0; q < p; q++) acc += j.topo.weights[i * p + q] * (order == DT_DPSGD_ADAPT_THEN_COMBINE ? j.bstart[q][k] : init[k]);
                if (order == DT_DPSGD_COMBINE_THEN_ADAPT) acc += j.bstart[i][k] - init[k];   /* this rank's change, added after */
                want[k] = (float)(acc / rowsum);
            }
            CHECK_CLOSE(j.bafter[i], want, 2 * K, 1e-6, dt_dpsgd_order_name((dt_dpsgd_order)order));
        }
        dt_topology_free(&j.topo);
    }
}

/* The directed one-peer exponential schedule: the exact mean, bit for bit on every rank, in log2 p steps on
   4 and 8 ranks (not one step sooner); on 3 the mean is approached. One message of NP + 1 floats a step. */
static void test_one_peer_directed(void) {
    static gjob j;
    int ps[3] = {4, 8, 3}, q, i, k;
    for (q = 0; q < 3; q++) {
        int p = ps[q], period = p == 8 ? 3 : 2;
        double mean[NP];
        float fm[NP];
        memset(&j, 0, sizeof j);
        j.p = p; j.steps = period; j.sched = 1; j.order = DT_DPSGD_ADAPT_THEN_COMBINE;
        CHECK_OK(dt_topology_one_peer_exp_directed(&j.s, p));
        gossip_launch(&j);
        means(&j, mean);
        for (k = 0; k < NP; k++) fm[k] = (float)mean[k];
        for (i = 0; i < p; i++) {
            CHECK(j.dist[i][period - 1] > 0.1);
            CHECK(j.bytes[i] == (uint64_t)period * (NP + 1) * sizeof(float));
            if (p != 3) CHECK(memcmp(j.end[i], fm, sizeof fm) == 0 && j.dist[i][period] == 0.0 && j.w[i] == 1.0);
            if (p != 3) CHECK(memcmp(j.binit[i], j.binit[0], sizeof j.binit[0]) == 0);
            else CHECK(j.dist[i][period] > 0.01 && j.dist[i][period] < j.dist[i][0]);
        }
        if (p != 3) printf("    directed one-peer exponential on %d ranks: every model is the mean, bit for bit, after %d steps\n", p, period);
        dt_topology_schedule_free(&j.s);
    }
}

/* Plain D-PSGD refuses a directed graph, given or from a schedule, saying to set push_sum; with push_sum the
   same graph is taken. On one rank a push-sum step is an SGD step, bit for bit, and the weight stays 1. */
static void test_refusals_and_one_rank(void) {
    dt_comm *c = NULL;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_dpsgd *d = NULL;
    dt_topology t;
    dt_topology_schedule s;
    dt_topology_desc td;
    dt_dpsgd_desc dd;
    dt_optim_desc od;
    float before[NP], after[NP], g[NP], x[2 * IN], y[2 * K] = {0.5f, -1.0f, 2.0f, 0.0f}, loss;
    int k;
    memset(&td, 0, sizeof td);
    memset(&dd, 0, sizeof dd);
    td.kind = DT_TOPO_RING; td.world = 1; td.directed = 1;
    CHECK_OK(dt_topology_create(&t, &td));
    CHECK_OK(dt_topology_one_peer_exp_directed(&s, 1));
    CHECK_OK(dt_comm_create_self(&c, NULL));
    CHECK_OK(make_model(&m, 1, 0));
    CHECK_ERR(dt_dpsgd_create(&d, c, m, &t, &dd), DT_ERR_INVALID_ARG);
    CHECK(d == NULL && strstr(dt_last_error(), "dt_dpsgd_create: rank 0: the topology is directed") != NULL &&
          strstr(dt_last_error(), "set dt_dpsgd_desc.push_sum = 1") != NULL);
    dd.schedule = dt_topology_schedule_at; dd.schedule_user = &s; dd.period = s.period;
    CHECK_ERR(dt_dpsgd_create(&d, c, m, NULL, &dd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "the schedule's graph of step 0 is directed") != NULL);
    dd.push_sum = 1;
    CHECK_OK(dt_dpsgd_create(&d, c, m, NULL, &dd));
    dt_dpsgd_destroy(d);
    d = NULL;
    memset(&dd, 0, sizeof dd);
    dd.push_sum = 1;
    CHECK_OK(dt_dpsgd_create(&d, c, m, &t, &dd));
    memset(&od, 0, sizeof od);
    od.lr = 0.1f; od.momentum = 0.9f;
    CHECK_OK(dt_optim_create(&o, m, &od));
    for (k = 0; k < 2 * IN; k++) x[k] = 0.25f * (float)k - 0.5f;
    for (k = 0; k < 3 && o && d; k++) {
        int q;
        CHECK_OK(dt_model_forward(m, x, 2));
        CHECK_OK(dt_model_loss_mse(m, y, &loss));
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward(m, NULL));
        CHECK_OK(dt_model_get_params(m, before, NP));
        CHECK_OK(dt_model_get_grads(m, g, NP));
        CHECK_OK(dt_dpsgd_step(d, o));
        CHECK_OK(dt_model_get_params(m, after, NP));
        if (k == 0) for (q = 0; q < NP; q++) CHECK(after[q] == before[q] - 0.1f * g[q]);   /* no momentum yet */
        CHECK(memcmp(after, before, sizeof after) != 0);
    }
    CHECK(dt_dpsgd_push_weight(d) == 1.0 && dt_dpsgd_push_weight(NULL) == 0.0);
    dt_dpsgd_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_comm_destroy(c);
    dt_topology_free(&t);
    dt_topology_schedule_free(&s);
}

/* ---- training ---- */
#define TIN 16
#define TK 4
#define TB 8
#define TSTEPS 30
typedef struct tjob {
    int p;
    dt_topology topo;
    float loss[MAXR][TSTEPS];
    float params[MAXR][TIN * 32 + 32 + 32 * TK + TK + 64];
    double w[MAXR];
    int64_t np;
} tjob;

/* A batch-norm MLP on a learnable task (the label is the quarter of the input with the largest sum), SGD with
   momentum, push-sum over the chord graph (not regular: the weights move), ATC, buffers mixed. */
static dt_result train_rank(dt_comm *c, void *arg) {
    tjob *j = (tjob *)arg;
    int me = dt_comm_rank(c), s, i, k;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_dpsgd *d = NULL;
    dt_model_desc md;
    dt_optim_desc od;
    dt_dpsgd_desc dd;
    dt_rng g;
    float x[TB * TIN];
    int32_t y[TB];
    dt_result r;
    memset(&md, 0, sizeof md);
    md.in_c = TIN; md.seed = 5 + (uint64_t)me;
    if ((r = dt_model_create(&m, &md)) != DT_OK) return r;
    dt_linear(m, dt_relu(m, dt_batchnorm(m, dt_linear(m, dt_model_input(m), 32, 1))), TK, 1);
    memset(&od, 0, sizeof od);
    od.lr = 0.05f; od.momentum = 0.9f; od.weight_decay = 1e-4f;
    memset(&dd, 0, sizeof dd);
    dd.push_sum = 1; dd.mix_buffers = 1; dd.order = DT_DPSGD_ADAPT_THEN_COMBINE;
    if ((r = dt_model_finalize(m)) != DT_OK || (r = dt_optim_create(&o, m, &od)) != DT_OK ||
        (r = dt_dpsgd_create(&d, c, m, &j->topo, &dd)) != DT_OK) goto out;
    dt_rng_init(&g, 9, (uint64_t)me);
    for (s = 0; s < TSTEPS && r == DT_OK; s++) {
        for (i = 0; i < TB; i++) {
            float best = -1e9f, q[TK] = {0};
            for (k = 0; k < TIN; k++) { x[i * TIN + k] = dt_rng_uniform(&g) - 0.5f; q[k / (TIN / TK)] += x[i * TIN + k]; }
            for (k = 0; k < TK; k++) if (q[k] > best) { best = q[k]; y[i] = k; }
        }
        dt_model_zero_grad(m);
        if ((r = dt_model_forward(m, x, TB)) != DT_OK || (r = dt_model_loss_labels(m, y, &j->loss[me][s])) != DT_OK ||
            (r = dt_model_backward(m, NULL)) != DT_OK)
            break;
        r = dt_dpsgd_step(d, o);
    }
    j->np = dt_model_param_count(m);
    j->w[me] = dt_dpsgd_push_weight(d);
    if (r == DT_OK) r = dt_model_get_params(m, j->params[me], j->np);
out:
    dt_dpsgd_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

static void test_training(void) {
    static tjob a, b;
    dt_launch_desc ld;
    int i, s;
    double first = 0.0, last = 0.0;
    memset(&a, 0, sizeof a);
    a.p = 4;
    CHECK_OK(chord_graph(&a.topo, 4));
    memset(&ld, 0, sizeof ld);
    ld.ranks = 4; ld.comm.timeout = 30; ld.threads_per_rank = 1;
    CHECK_OK(dt_launch_local(&ld, train_rank, &a, NULL));
    b = a;
    memset(b.params, 0, sizeof b.params);
    ld.threads_per_rank = 2;   /* another schedule of the ranks' threads */
    CHECK_OK(dt_launch_local(&ld, train_rank, &b, NULL));
    CHECK(a.np > 0 && (size_t)a.np <= sizeof a.params[0] / sizeof(float));
    CHECK(memcmp(a.params, b.params, sizeof a.params) == 0 && memcmp(a.loss, b.loss, sizeof a.loss) == 0);
    for (i = 0; i < 4; i++)
        for (s = 0; s < 5; s++) { first += a.loss[i][s]; last += a.loss[i][TSTEPS - 1 - s]; }
    printf("    push-sum training on the chord graph of 4: mean loss %.4f over the first 5 steps, %.4f over the last 5; "
           "weights %.3f %.3f %.3f %.3f\n", first / 20.0, last / 20.0, a.w[0], a.w[1], a.w[2], a.w[3]);
    CHECK(last < 0.8 * first);
    CHECK(fabs(a.w[2] - 1.0) > 0.01);
    CHECK(memcmp(a.params[0], a.params[1], sizeof(float) * (size_t)a.np) != 0);   /* the replicas differ */
    dt_topology_free(&a.topo);
}

int main(int argc, char **argv) {
    if (argc > 1) dt_t_only = argv[1];
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    RUN(test_directed_topologies);
    RUN(test_directed_ring);
    RUN(test_not_regular);
    RUN(test_one_peer_directed);
    RUN(test_refusals_and_one_rank);
    RUN(test_training);
    return dt_t_summary();
}
