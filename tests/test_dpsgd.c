/* test_dpsgd.c - D-PSGD: with the fully connected topology it is parameter averaging every step (checked
   against replicas stepped by hand on one thread); each step follows the formula of its order on a ring
   of 4 (combine-then-adapt, adapt-then-combine); pure gossip on a ring keeps the mean, keeps the replicas
   different and shrinks the consensus distance at least as fast as the spectral gap says; the average of
   the replicas; the gossip traffic; BatchNorm statistics gossiped with mix_buffers and averaged by
   dt_dpsgd_average; bad arguments. Time-varying topologies: the one-peer exponential schedule reaches exact
   consensus in log2 p steps on 4 and 8 ranks (bit for bit: every replica is the mean) and not on 3; the hook
   is asked for the right steps; a bad graph from it stops every rank with a named error, a schedule whose
   graphs never connect the ranks is refused. */
#include "../dtrain.h"
#include "dt_test.h"

#define IN 3         /* a linear model 3 -> 2 with bias: 8 parameters */
#define K 2
#define NP 8
#define B 4          /* samples per rank and step */
#define STEPS 3
#define MAXR 6
#define LR 0.1f

static float X[STEPS * MAXR * B * IN], T[STEPS * MAXR * B * K];

static void make_data(void) {
    dt_rng r;
    int i;
    dt_rng_init(&r, 7, 0);
    for (i = 0; i < STEPS * MAXR * B * IN; i++) X[i] = (float)dt_rng_u32(&r) / 4294967296.0f * 2.0f - 1.0f;
    for (i = 0; i < STEPS * MAXR * B * K; i++) T[i] = (float)dt_rng_u32(&r) / 4294967296.0f * 2.0f - 1.0f;
}

static dt_result make_model(dt_model **m, uint64_t seed) {
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    d.in_c = IN; d.seed = seed;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    dt_linear(*m, dt_model_input(*m), K, 1);
    return dt_model_finalize(*m);
}

/* The gradient of rank r's batch of step s at the model's parameters (accumulated into a zeroed buffer). */
static dt_result grad_at(dt_model *m, int s, int r) {
    float loss;
    dt_result e;
    int64_t first = ((int64_t)s * MAXR + r) * B;
    dt_model_zero_grad(m);
    if ((e = dt_model_forward(m, X + first * IN, B)) != DT_OK) return e;
    if ((e = dt_model_loss_mse(m, T + first * K, &loss)) != DT_OK) return e;
    return dt_model_backward(m, NULL);
}

typedef struct job {
    dt_topology_kind kind;
    dt_dpsgd_order   order;
    int              gossip;                     /* 1: pure gossip from distinct replicas (no training) */
    float pre[STEPS][MAXR][NP], grad[STEPS][MAXR][NP], post[STEPS][MAXR][NP];
    double dist[MAXR][11];                       /* gossip: each rank's consensus distance before step t */
    float  mean0[MAXR][NP], mean1[MAXR][NP], avg[MAXR][NP], restored[MAXR][NP], mine[MAXR][NP];
    double after_average[MAXR];
    uint64_t bytes[MAXR];
    dt_topology topo;
} job;

static dt_result dpsgd_rank(dt_comm *c, void *arg) {
    job *j = (job *)arg;
    int me = dt_comm_rank(c), s;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_dpsgd *d = NULL;
    dt_dpsgd_desc dd;
    dt_optim_desc od;
    dt_result r;
    memset(&dd, 0, sizeof dd);
    dd.order = j->order;
    memset(&od, 0, sizeof od);
    od.lr = LR;
#define T_(call) do { if ((r = (call)) != DT_OK) goto out; } while (0)
    T_(make_model(&m, 100 + (uint64_t)me));          /* different on every rank: dt_dpsgd_create broadcasts rank 0's */
    T_(dt_optim_create(&o, m, &od));
    T_(dt_dpsgd_create(&d, c, m, &j->topo, &dd));
    if (j->gossip) {
        float p[NP];
        dt_rng g;
        int k;
        dt_rng_init(&g, 3, (uint64_t)me);
        for (k = 0; k < NP; k++) p[k] = (float)dt_rng_u32(&g) / 4294967296.0f * 2.0f - 1.0f;
        T_(dt_model_set_params(m, p, NP));
        memcpy(j->mine[me], p, sizeof p);
        T_(dt_dpsgd_average(d, j->mean0[me]));
        T_(dt_dpsgd_use_average(d, 1));
        T_(dt_model_get_params(m, j->avg[me], NP));
        T_(dt_dpsgd_use_average(d, 0));
        T_(dt_model_get_params(m, j->restored[me], NP));
        for (s = 0; s < 10; s++) {
            T_(dt_dpsgd_consensus(d, &j->dist[me][s]));
            T_(dt_dpsgd_step(d, NULL));
        }
        T_(dt_dpsgd_consensus(d, &j->dist[me][10]));
        j->bytes[me] = dt_dpsgd_get_stats(d).bytes_sent;
        T_(dt_dpsgd_average(d, j->mean1[me]));
        T_(dt_dpsgd_average(d, NULL));
        T_(dt_dpsgd_consensus(d, &j->after_average[me]));
    } else {
        for (s = 0; s < STEPS; s++) {
            T_(grad_at(m, s, me));
            T_(dt_model_get_params(m, j->pre[s][me], NP));
            T_(dt_model_get_grads(m, j->grad[s][me], NP));
            T_(dt_dpsgd_step(d, o));
            T_(dt_model_get_params(m, j->post[s][me], NP));
        }
    }
#undef T_
out:
    dt_dpsgd_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

static dt_result launch(job *j, int ranks) {
    dt_launch_desc ld;
    dt_topology_desc td;
    dt_result r;
    memset(&td, 0, sizeof td);
    td.kind = j->kind; td.world = ranks;
    if ((r = dt_topology_create(&j->topo, &td)) != DT_OK) return r;
    memset(&ld, 0, sizeof ld);
    ld.ranks = ranks;
    ld.comm.timeout = 20;
    r = dt_launch_local(&ld, dpsgd_rank, j, NULL);
    dt_topology_free(&j->topo);
    return r;
}

/* Full topology: replicas stepped by hand on one thread, averaged as DDP-style parameter averaging would:
   combine-then-adapt x_i <- mean_j x_j - lr g_i(x_i), adapt-then-combine x_i <- mean_j (x_j - lr g_j(x_j)). */
static void test_full_is_averaging(void) {
    static job j;
    int order, ranks = 3, s, i, k, q;
    for (order = 0; order < DT_DPSGD_ORDER_COUNT; order++) {
        float x[MAXR][NP], g[MAXR][NP], ref[NP];
        dt_model *m = NULL;
        memset(&j, 0, sizeof j);
        j.kind = DT_TOPO_FULL;
        j.order = (dt_dpsgd_order)order;
        CHECK_OK(launch(&j, ranks));
        CHECK_OK(make_model(&m, 100));                /* rank 0's initial parameters */
        if (!m) return;
        for (i = 0; i < ranks; i++) CHECK_OK(dt_model_get_params(m, x[i], NP));
        for (s = 0; s < STEPS; s++) {
            for (i = 0; i < ranks; i++) {
                CHECK_OK(dt_model_set_params(m, x[i], NP));
                CHECK_OK(grad_at(m, s, i));
                CHECK_OK(dt_model_get_grads(m, g[i], NP));
            }
            for (k = 0; k < NP; k++) {
                double acc = 0.0;
                for (q = 0; q < ranks; q++) acc += (order == DT_DPSGD_ADAPT_THEN_COMBINE ? x[q][k] - LR * g[q][k] : x[q][k]);
                ref[k] = (float)(acc / ranks);
            }
            for (i = 0; i < ranks; i++)
                for (k = 0; k < NP; k++) x[i][k] = order == DT_DPSGD_ADAPT_THEN_COMBINE ? ref[k] : ref[k] - LR * g[i][k];
        }
        for (i = 0; i < ranks; i++) CHECK_CLOSE(j.post[STEPS - 1][i], x[i], NP, 1e-5, dt_dpsgd_order_name((dt_dpsgd_order)order));
        if (order == DT_DPSGD_ADAPT_THEN_COMBINE)     /* every rank sums the same replicas in the same order */
            for (i = 1; i < ranks; i++) CHECK(memcmp(j.post[STEPS - 1][i], j.post[STEPS - 1][0], sizeof(float) * NP) == 0);
        dt_model_destroy(m);
    }
}

/* Ring of 4 (W = 1/3 on itself and its two neighbours, 0 across): each step follows its order's formula
   from the parameters and gradients the ranks had before it. */
static void test_orders_on_ring(void) {
    static job j;
    int order, ranks = 4, s, i, k, q;
    for (order = 0; order < DT_DPSGD_ORDER_COUNT; order++) {
        memset(&j, 0, sizeof j);
        j.kind = DT_TOPO_RING;
        j.order = (dt_dpsgd_order)order;
        CHECK_OK(launch(&j, ranks));
        for (i = 1; i < ranks; i++) CHECK(memcmp(j.pre[0][i], j.pre[0][0], sizeof(float) * NP) == 0);   /* broadcast */
        for (s = 0; s < STEPS; s++)
            for (i = 0; i < ranks; i++) {
                float want[NP];
                for (k = 0; k < NP; k++) {
                    double acc = 0.0;
                    for (q = 0; q < ranks; q++) {
                        double w = (q == i || q == (i + 1) % ranks || q == (i + ranks - 1) % ranks) ? 1.0 / 3.0 : 0.0;
                        acc += w * (order == DT_DPSGD_ADAPT_THEN_COMBINE ? j.pre[s][q][k] - LR * j.grad[s][q][k] : j.pre[s][q][k]);
                    }
                    want[k] = (float)(order == DT_DPSGD_ADAPT_THEN_COMBINE ? acc : acc - LR * j.grad[s][i][k]);
                }
                CHECK_CLOSE(j.post[s][i], want, NP, 1e-5, dt_dpsgd_order_name((dt_dpsgd_order)order));
            }
        /* a ring of 4 is not fully connected: after a step the replicas differ */
        CHECK(memcmp(j.post[STEPS - 1][0], j.post[STEPS - 1][2], sizeof(float) * NP) != 0);
    }
}

/* Pure gossip on a ring of 6 from distinct replicas: ||X_t - mean||_F <= rho^t ||X_0 - mean||_F with
   rho = 1 - spectral gap, and mean_i ||e_i|| <= ||E||_F / sqrt(N) <= sum_i ||e_i|| / sqrt(N), so the
   consensus distance d_t <= sqrt(N) rho^t d_0. The mean stays (W is doubly stochastic); the replicas stay
   different; the average sets every replica to the mean. */
static void test_gossip_rate(void) {
    static job j;
    int ranks = MAXR, i, k, t;
    double rho, mean;
    dt_topology_desc td;
    dt_topology topo;
    memset(&j, 0, sizeof j);
    j.kind = DT_TOPO_RING;
    j.gossip = 1;
    CHECK_OK(launch(&j, ranks));
    memset(&td, 0, sizeof td);
    td.kind = DT_TOPO_RING; td.world = ranks;
    CHECK_OK(dt_topology_create(&topo, &td));
    rho = 1.0 - topo.spectral_gap;
    CHECK(rho > 0.0 && rho < 1.0);
    for (i = 0; i < ranks; i++) {
        CHECK(j.dist[i][0] == j.dist[0][0] && j.dist[i][10] == j.dist[0][10]);   /* the same on every rank */
        CHECK(j.after_average[i] == 0.0);
    }
    CHECK(j.dist[0][0] > 0.1);
    for (t = 1; t <= 10; t++) {
        CHECK(j.dist[0][t] <= sqrt((double)ranks) * pow(rho, t) * j.dist[0][0] * (1.0 + 1e-6));
        CHECK(j.dist[0][t] < j.dist[0][t - 1]);
    }
    CHECK(j.dist[0][10] > 1e-4);                       /* not averaged away: the ring still disagrees */
    for (k = 0; k < NP; k++) {
        for (mean = 0.0, i = 0; i < ranks; i++) mean += j.mine[i][k];
        mean /= ranks;
        for (i = 0; i < ranks; i++) {
            CHECK(fabs(j.mean0[i][k] - mean) < 1e-6);
            CHECK(fabs(j.mean1[i][k] - mean) < 1e-5);  /* gossip keeps the mean */
            CHECK(j.avg[i][k] == j.mean0[i][k]);       /* dt_dpsgd_use_average loads it ... */
            CHECK(j.restored[i][k] == j.mine[i][k]);   /* ... and puts the replica back */
        }
    }
    for (i = 0; i < ranks; i++) CHECK(j.bytes[i] == 10u * 2u * NP * sizeof(float));   /* two neighbours a step */
    dt_topology_free(&topo);
}

/* BatchNorm statistics: with mix_buffers every step gossips them like the parameters, x_i <- sum_j W[i][j] x_j
   (checked against the formula on a ring of 4); without, the step leaves them; either way dt_dpsgd_average
   gives every replica the mean of the ranks' statistics, with the mean parameters. */
#define BNB (2 * K)   /* running mean and variance of K channels */
typedef struct bn_job {
    int mix;
    dt_topology topo;
    float before[MAXR][BNB], after[MAXR][BNB], avg[MAXR][BNB];
} bn_job;

static dt_result bn_rank(dt_comm *c, void *arg) {
    bn_job *j = (bn_job *)arg;
    int me = dt_comm_rank(c);
    dt_model *m = NULL;
    dt_dpsgd *d = NULL;
    dt_dpsgd_desc dd;
    dt_model_desc md;
    dt_result r;
    memset(&dd, 0, sizeof dd);
    dd.mix_buffers = j->mix;
    memset(&md, 0, sizeof md);
    md.in_c = IN; md.seed = 100;
    if ((r = dt_model_create(&m, &md)) != DT_OK) return r;
    dt_batchnorm(m, dt_linear(m, dt_model_input(m), K, 1));
    if ((r = dt_model_finalize(m)) == DT_OK && (r = dt_dpsgd_create(&d, c, m, &j->topo, &dd)) == DT_OK &&
        (r = dt_model_forward(m, X + (int64_t)me * B * IN, B)) == DT_OK &&   /* each rank's statistics move apart */
        (r = dt_model_get_buffers(m, j->before[me], BNB)) == DT_OK && (r = dt_dpsgd_step(d, NULL)) == DT_OK &&
        (r = dt_model_get_buffers(m, j->after[me], BNB)) == DT_OK && (r = dt_dpsgd_average(d, NULL)) == DT_OK)
        r = dt_model_get_buffers(m, j->avg[me], BNB);
    dt_dpsgd_destroy(d);
    dt_model_destroy(m);
    return r;
}

static void test_buffers(void) {
    static bn_job j;
    dt_topology_desc td;
    dt_launch_desc ld;
    int i, k, q, p = 4;
    for (j.mix = 0; j.mix < 2; j.mix++) {
        float want[BNB], mean[BNB];
        memset(&td, 0, sizeof td);
        td.kind = DT_TOPO_RING; td.world = p;
        CHECK_OK(dt_topology_create(&j.topo, &td));
        memset(&ld, 0, sizeof ld);
        ld.ranks = p; ld.comm.timeout = 20;
        CHECK_OK(dt_launch_local(&ld, bn_rank, &j, NULL));
        CHECK(memcmp(j.before[0], j.before[1], sizeof j.before[0]) != 0);
        for (k = 0; k < BNB; k++) {
            double s = 0.0;
            for (q = 0; q < p; q++) s += j.after[q][k];
            mean[k] = (float)(s / p);
        }
        for (i = 0; i < p; i++) {
            for (k = 0; k < BNB; k++) {
                double acc = 0.0;
                for (q = 0; q < p; q++) acc += j.topo.weights[i * p + q] * (double)j.before[q][k];
                want[k] = j.mix ? (float)acc : j.before[i][k];
            }
            CHECK_CLOSE(j.after[i], want, BNB, 1e-6, j.mix ? "buffers gossiped" : "buffers left by the step");
            CHECK_CLOSE(j.avg[i], mean, BNB, 1e-6, "the average's buffers");
        }
        dt_topology_free(&j.topo);
    }
}

/* ---- time-varying topologies ---- */
#define SR 8          /* ranks, at most */
#define SSTEPS 4      /* gossip steps taken */
typedef struct sched_job {
    int p, bad_at, stuck;        /* bad_at: the step whose graph is corrupted (-1: none); stuck: always graph 0 */
    dt_topology_schedule s;
    dt_topology bad;             /* s.graphs[1] with an asymmetric W */
    double badw[SR * SR];
    int64_t calls[SR][16];       /* the steps each rank's hook was asked for */
    int ncalls[SR], nsteps[SR];
    float start[SR][NP], after[SR][SSTEPS + 1][NP];
    double dist[SR][SSTEPS + 1];
    uint64_t bytes[SR];
    dt_result err[SR];
    char msg[SR][512];
} sched_job;
typedef struct hook_user { sched_job *j; int rank; } hook_user;

static const dt_topology *hook(int64_t step, void *user) {
    hook_user *h = (hook_user *)user;
    sched_job *j = h->j;
    if (j->ncalls[h->rank] < 16) j->calls[h->rank][j->ncalls[h->rank]++] = step;
    if (step == j->bad_at) return &j->bad;
    return dt_topology_schedule_at(j->stuck ? 0 : step, &j->s);
}

/* Pure gossip from distinct integer replicas (their mean is exact in floats for p a power of two). */
static dt_result sched_rank(dt_comm *c, void *arg) {
    sched_job *j = (sched_job *)arg;
    int me = dt_comm_rank(c), k, t;
    hook_user hu;
    dt_model *m = NULL;
    dt_dpsgd *d = NULL;
    dt_dpsgd_desc dd;
    dt_result r;
    hu.j = j; hu.rank = me;
    memset(&dd, 0, sizeof dd);
    dd.schedule = hook; dd.schedule_user = &hu; dd.period = j->s.period;
    for (k = 0; k < NP; k++) j->start[me][k] = (float)((me * 37 + k * 11) % 23 - 11);
    if ((r = make_model(&m, 1)) == DT_OK && (r = dt_dpsgd_create(&d, c, m, NULL, &dd)) == DT_OK)
        r = dt_model_set_params(m, j->start[me], NP);   /* after the create's broadcast */
    for (t = 0; t <= SSTEPS && r == DT_OK; t++) {
        if ((r = dt_dpsgd_consensus(d, &j->dist[me][t])) != DT_OK || (r = dt_model_get_params(m, j->after[me][t], NP)) != DT_OK)
            break;
        if (t < SSTEPS && (r = dt_dpsgd_step(d, NULL)) == DT_OK) j->nsteps[me]++;
    }
    j->bytes[me] = dt_dpsgd_get_stats(d).bytes_sent;
    j->err[me] = r;
    if (r != DT_OK) snprintf(j->msg[me], sizeof j->msg[me], "%s", dt_last_error());
    if (r != DT_OK && d) dt_model_get_params(m, j->after[me][j->nsteps[me] + 1], NP);   /* what the refused step left */
    dt_dpsgd_destroy(d);
    dt_model_destroy(m);
    return DT_OK;   /* the job records each rank's result */
}

static void sched_launch(sched_job *j) {
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.ranks = j->p; ld.comm.timeout = 20;
    CHECK_OK(dt_launch_local(&ld, sched_rank, j, NULL));
}

/* One peer a step at distance 2^(t mod log2 p): after log2 p steps of pure gossip every replica holds the
   mean exactly (the butterfly of an all-reduce, the same bits on every rank), never before; each rank sends
   one replica a step. On 3 ranks a rank whose partner is missing sits a step out: the mean stays, but the
   replicas only approach it. The hook is asked for steps 0 .. period-1 at create, then for each step. */
static void test_one_peer_exp(void) {
    static sched_job j;
    int ps[3] = {4, 8, 3}, q;
    for (q = 0; q < 3; q++) {
        int p = ps[q], period = p == 8 ? 3 : 2, pow2 = p != 3, i, k, t;
        float mean[NP];
        memset(&j, 0, sizeof j);
        j.p = p; j.bad_at = -1;
        CHECK_OK(dt_topology_one_peer_exp(&j.s, p));
        sched_launch(&j);
        for (k = 0; k < NP; k++) {
            double sum = 0.0;
            for (i = 0; i < p; i++) sum += j.start[i][k];
            mean[k] = (float)(sum / p);
        }
        for (i = 0; i < p; i++) {
            CHECK_OK(j.err[i]);
            CHECK(j.ncalls[i] == period + SSTEPS);
            for (t = 0; t < period; t++) CHECK(j.calls[i][t] == t);
            for (t = 0; t < SSTEPS; t++) CHECK(j.calls[i][period + t] == t);
            CHECK(j.dist[i][period - 1] > 0.1);                       /* not yet */
            if (pow2) {
                CHECK(memcmp(j.after[i][period], mean, sizeof mean) == 0);   /* every replica is the mean, exactly */
                CHECK(j.dist[i][period] == 0.0 && j.dist[i][SSTEPS] == 0.0);
                CHECK(j.bytes[i] == (uint64_t)SSTEPS * NP * sizeof(float));   /* one peer a step */
            } else {
                CHECK(j.dist[i][period] > 0.01 && j.dist[i][period] < j.dist[i][0]);
            }
        }
        if (!pow2) {   /* steps 0, 2 pair 0-1 (2 alone); steps 1, 3 pair 0-2 (1 alone) */
            for (k = 0; k < NP; k++) {
                double s = 0.0;
                for (i = 0; i < p; i++) s += j.after[i][SSTEPS][k];
                CHECK(fabs(s / p - mean[k]) < 1e-5);                 /* the mean stays */
            }
            CHECK(j.bytes[0] == 4u * NP * sizeof(float) && j.bytes[1] == 2u * NP * sizeof(float) &&
                  j.bytes[2] == 2u * NP * sizeof(float));
        }
        dt_topology_schedule_free(&j.s);
    }
}

/* A hook that hands out a W that is not symmetric at step 2 stops every rank there, naming the step and the
   fault, with the replica as step 1 left it; at step 1, within the period, dt_dpsgd_create refuses it; one
   that always hands out the same one-peer graph never connects 4 ranks and is refused by dt_dpsgd_create.
   Every rank gives the same verdict. */
static void test_schedule_refusals(void) {
    static sched_job j;
    char want[160];
    int i;
    memset(&j, 0, sizeof j);
    j.p = 4; j.bad_at = 2;
    CHECK_OK(dt_topology_one_peer_exp(&j.s, 4));
    j.bad = j.s.graphs[0];
    memcpy(j.badw, j.bad.weights, sizeof(double) * 16);
    j.badw[0 * 4 + 0] = 0.25; j.badw[0 * 4 + 1] = 0.75;   /* row 0 still sums to 1 */
    j.bad.weights = j.badw;
    sched_launch(&j);
    for (i = 0; i < 4; i++) {
        CHECK_ERR(j.err[i], DT_ERR_INVALID_ARG);
        CHECK(j.nsteps[i] == 2 && j.ncalls[i] == 2 + 3);
        snprintf(want, sizeof want, "dt_dpsgd_step: rank %d: the schedule's graph of step 2: the mixing matrix is not symmetric", i);
        CHECK(strstr(j.msg[i], want) != NULL);
        CHECK(memcmp(j.after[i][3], j.after[i][2], sizeof(float) * NP) == 0);   /* nothing changed */
    }
    j.bad_at = 1;
    memset(j.ncalls, 0, sizeof j.ncalls);
    sched_launch(&j);
    for (i = 0; i < 4; i++) {
        CHECK_ERR(j.err[i], DT_ERR_INVALID_ARG);
        snprintf(want, sizeof want, "dt_dpsgd_create: rank %d: the schedule's graph of step 1: the mixing matrix is not symmetric", i);
        CHECK(strstr(j.msg[i], want) != NULL);
    }
    j.bad_at = -1; j.stuck = 1;
    sched_launch(&j);
    for (i = 0; i < 4; i++) {
        CHECK_ERR(j.err[i], DT_ERR_INVALID_ARG);
        CHECK(strstr(j.msg[i], "the schedule's graphs of steps 0 .. 1: the union of the 2 graphs is not connected") != NULL);
    }
    dt_topology_schedule_free(&j.s);
}

static void test_bad_args(void) {
    dt_comm *c = NULL;
    dt_model *m = NULL, *raw = NULL;
    dt_optim *o = NULL;
    dt_dpsgd *d = NULL;
    dt_topology t2, t1;
    dt_topology_desc td;
    dt_dpsgd_desc dd;
    dt_model_desc md;
    dt_optim_desc od;
    dt_dpsgd_order ord = DT_DPSGD_COMBINE_THEN_ADAPT;
    float before[NP], after[NP], g[NP];
    double dist;
    int k;
    memset(&td, 0, sizeof td);
    memset(&dd, 0, sizeof dd);
    memset(&md, 0, sizeof md);
    memset(&od, 0, sizeof od);
    od.lr = LR;
    md.in_c = IN;
    td.kind = DT_TOPO_RING; td.world = 2;
    CHECK_OK(dt_topology_create(&t2, &td));
    td.world = 1;
    CHECK_OK(dt_topology_create(&t1, &td));
    CHECK_OK(dt_comm_create_self(&c, NULL));
    CHECK_OK(make_model(&m, 1));
    CHECK_OK(dt_model_create(&raw, &md));
    CHECK_ERR(dt_dpsgd_create(&d, c, m, &t2, NULL), DT_ERR_INVALID_ARG);   /* 2 ranks' topology, 1 rank */
    CHECK(d == NULL && strstr(dt_last_error(), "rank 0") != NULL);
    CHECK_ERR(dt_dpsgd_create(NULL, c, m, &t1, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_create(&d, NULL, m, &t1, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_create(&d, c, NULL, &t1, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_create(&d, c, raw, &t1, NULL), DT_ERR_STATE);       /* not finalized */
    CHECK_ERR(dt_dpsgd_create(&d, c, m, NULL, NULL), DT_ERR_INVALID_ARG);
    dd.order = (dt_dpsgd_order)7;
    CHECK_ERR(dt_dpsgd_create(&d, c, m, &t1, &dd), DT_ERR_INVALID_ARG);
    dd.order = DT_DPSGD_COMBINE_THEN_ADAPT;
    dd.schedule = dt_topology_schedule_at; dd.period = 1;   /* user NULL: no graph for step 0 */
    CHECK_ERR(dt_dpsgd_create(&d, c, m, &t1, &dd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "both a topology and a schedule") != NULL);
    CHECK_ERR(dt_dpsgd_create(&d, c, m, NULL, &dd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "the schedule gave no graph (NULL) for step 0") != NULL);
    dd.period = 0;
    CHECK_ERR(dt_dpsgd_create(&d, c, m, NULL, &dd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "desc.period >= 1") != NULL);
    {   /* a schedule of 2 ranks' graphs on 1 rank */
        dt_topology_schedule two;
        CHECK_OK(dt_topology_one_peer_exp(&two, 2));
        dd.schedule_user = &two; dd.period = two.period;
        CHECK_ERR(dt_dpsgd_create(&d, c, m, NULL, &dd), DT_ERR_INVALID_ARG);
        CHECK(strstr(dt_last_error(), "the topology has 2 ranks, not 1") != NULL);
        dt_topology_schedule_free(&two);
    }
    memset(&dd, 0, sizeof dd);
    CHECK_ERR(dt_dpsgd_step(NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_consensus(NULL, &dist), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_average(NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_use_average(NULL, 1), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_order_parse("sideways", &ord), DT_ERR_INVALID_ARG);
    CHECK_OK(dt_dpsgd_order_parse("atc", &ord));
    CHECK(ord == DT_DPSGD_ADAPT_THEN_COMBINE);
    /* one rank: a D-PSGD step is an SGD step; consensus 0; no traffic */
    CHECK_OK(dt_dpsgd_create(&d, c, m, &t1, NULL));
    CHECK_OK(dt_optim_create(&o, m, &od));
    CHECK_ERR(dt_dpsgd_consensus(d, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_dpsgd_use_average(d, 0), DT_ERR_STATE);
    CHECK_OK(grad_at(m, 0, 0));
    CHECK_OK(dt_model_get_params(m, before, NP));
    CHECK_OK(dt_model_get_grads(m, g, NP));
    CHECK_OK(dt_dpsgd_step(d, o));
    CHECK_OK(dt_model_get_params(m, after, NP));
    for (k = 0; k < NP; k++) CHECK(after[k] == before[k] - LR * g[k]);
    CHECK_OK(dt_dpsgd_consensus(d, &dist));
    CHECK(dist == 0.0);
    CHECK(dt_dpsgd_get_stats(d).steps == 1 && dt_dpsgd_get_stats(d).bytes_sent == 0);
    CHECK_OK(dt_dpsgd_use_average(d, 1));
    CHECK_ERR(dt_dpsgd_step(d, o), DT_ERR_STATE);                        /* the replica is put aside */
    CHECK_OK(dt_dpsgd_use_average(d, 0));
    CHECK(dt_dpsgd_get_stats(NULL).steps == 0);
    dt_dpsgd_destroy(d);
    dt_dpsgd_destroy(NULL);
    dt_optim_destroy(o);
    dt_model_destroy(raw);
    dt_model_destroy(m);
    dt_comm_destroy(c);
    dt_topology_free(&t1);
    dt_topology_free(&t2);
}

int main(int argc, char **argv) {
    if (argc > 1) dt_t_only = argv[1];
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    make_data();
    RUN(test_full_is_averaging);
    RUN(test_orders_on_ring);
    RUN(test_gossip_rate);
    RUN(test_buffers);
    RUN(test_bad_args);
    RUN(test_one_peer_exp);
    RUN(test_schedule_refusals);
    return dt_t_summary();
}
