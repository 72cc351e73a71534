/* test_train_mpi.c - the trainers under mpiexec end with the bits they end with on local ranks (tests/run.sh
   runs it with -n 2, 3, 4):
     mpicc -DDT_USE_MPI (make MPI=1), then mpiexec -n 4 build-mpi/tests/mpi/test_train_mpi [name-filter]
   Each case trains a small MLP on synthetic data for a few steps with one trainer configuration (DDP, local
   SGD, D-PSGD, FedAvg): first every MPI process as its rank of a fresh MPI communicator, then rank 0 alone
   on as many local ranks (threads) with the same communicator options, while the others wait. Each rank
   records what it ends with: its parameters right after the trainer's create and at the end, its buffers,
   the loss of each of its steps, D-PSGD's consensus distances and average, FedAvg's round reports and kept
   clients, the trainer's counters. Rank 0 gathers the MPI records and compares them with the local ones,
   rank by rank. With the library's own algorithms (NAIVE, RING, TREE, and the methods written on messages:
   DDP's parameter server and point-to-point, D-PSGD's gossip, FedAvg's reports) every bit must match. Where
   a float depends on a NATIVE all-reduce (MPI_Allreduce against the local shared-memory sum, which may
   add in another order) it must match within a relative TOL, and every counter exactly. Hogwild is
   threads sharing one process's memory and has no MPI form. D-PSGD also runs over the one-peer exponential
   schedule, and its pure gossip on the MPI processes reaches the mean bit for bit in log2 p steps when p is
   a power of two; push-sum (SGP) on a directed graph and on the directed one-peer exponential schedule
   likewise. Rank 0 prints one line per test (failed
   checks summed over the ranks) and "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#include "../../dtrain.h"
#include "../dt_test.h"
#include "../train_checks.h"
#include "mpi_test.h"
#ifndef DT_USE_MPI
#error "build this test with MPI: mpicc -DDT_USE_MPI (make MPI=1)"
#endif

#define IN 12                   /* features */
#define K 4                     /* classes */
#define B 24                    /* global batch of a step, split over the ranks (each gets B / world) */
#define STEPS 4
#define NS (B * (STEPS + 1))    /* samples: local SGD takes one step more */
#define MAXR 8                  /* world sizes 2 .. MAXR */
#define MAXP 512                /* parameters of the test models, at most */
#define MAXB 64                 /* buffers */
#define CLIENTS 7               /* FedAvg: more clients than ranks, several on one rank */
#define ROUNDS 3
#define TOL 1e-5                /* NATIVE all-reduces: relative difference allowed */

static dt_comm *W;              /* the communicator dt_launch made */
static int me, np;
static dt_comm_desc Wdesc;

/* ---- data and model ---- */
static uint8_t PIX[NS * IN];
static int32_t LAB[NS];
static float X[NS * IN];        /* PIX as floats in [-1, 1] */
static dt_dataset DS;           /* PIX and LAB, for FedAvg's loaders */

static void make_data(void) {
    dt_rng r;
    int i;
    dt_rng_init(&r, 5, 0);
    for (i = 0; i < NS * IN; i++) {
        PIX[i] = (uint8_t)dt_rng_below(&r, 256);
        X[i] = (float)PIX[i] / 127.5f - 1.0f;
    }
    for (i = 0; i < NS; i++) LAB[i] = (int32_t)dt_rng_below(&r, K);
    memset(&DS, 0, sizeof DS);
    DS.count = NS; DS.c = IN; DS.h = 1; DS.w = 1; DS.num_classes = K; DS.pixels = PIX; DS.labels = LAB;
}

/* forward and loss on samples [first, first + n) */
static dt_result fwd(dt_model *m, int64_t first, int64_t n, float *loss) {
    dt_result r = dt_model_forward(m, X + first * IN, n);
    return r != DT_OK ? r : dt_model_loss_labels(m, LAB + first, loss);
}
/* the same, then the gradient of that loss alone */
static dt_result grad(dt_model *m, int64_t first, int64_t n, float *loss) {
    dt_result r = fwd(m, first, n, loss);
    if (r != DT_OK) return r;
    dt_model_zero_grad(m);
    return dt_model_backward(m, NULL);
}

/* ---- a case: one trainer configuration, and what each rank ends with ---- */
enum { TR_DDP, TR_LOCALSGD, TR_DPSGD, TR_FED };

typedef struct rec {
    float   first[MAXP];             /* parameters right after the trainer's create */
    float   params[MAXP];            /* at the end */
    float   bufs[MAXB];              /* buffers at the end */
    float   avg[MAXP];               /* D-PSGD: dt_dpsgd_average */
    float   loss[2 * (STEPS + 1)];   /* the loss of each forward of this rank */
    double  metric[STEPS + ROUNDS];  /* D-PSGD: consensus after each step; FedAvg: each round's train loss */
    int64_t count[4 + ROUNDS * (5 + CLIENTS)];   /* the trainer's counters; FedAvg: each round's report */
} rec;

typedef struct job {
    int              trainer, bn;
    dt_algo          comm_algo;    /* the communicators' default: what DT_ALGO_AUTO means */
    int              exact;        /* 1: parameters, buffers and losses bit for bit */
    int              exact_mean;   /* 1: D-PSGD's consensus and average (an AUTO all-reduce) bit for bit */
    int              mode;         /* DDP: 0 a batch a step, 1 two micro-batches, 2 odd ranks one batch less
                                      (dt_ddp_join), 3 dt_model_backward + dt_ddp_sync */
    dt_ddp_desc      ddp;
    dt_localsgd_desc lsgd;
    dt_dpsgd_desc    dpsgd;
    dt_topology_desc topo;         /* its world is the communicator's */
    int              one_peer;     /* D-PSGD: the one-peer exponential schedule instead of topo; 2: the directed one */
    int              chord;        /* D-PSGD: the directed ring with the chord 0 -> 2 instead of topo (push-sum) */
    float            momentum;
    dt_fed_agg       agg;
    float            frac, dropout, trim;
    int              attacker;     /* FedAvg: client attacker - 1 flips the sign of its update (0: none) */
    int              local;        /* 1: out[rank] (local ranks), 0: out[0] (this process's rank) */
    rec             *out;
} job;

#define T(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

/* DDP: STEPS steps of B / world samples per rank, the step's batch split over the ranks in rank order */
static dt_result ddp_rank(dt_comm *c, const job *j, dt_model *m, dt_optim *o, rec *out) {
    int me_ = dt_comm_rank(c), s, nb = j->mode == 2 && me_ % 2 ? STEPS - 1 : STEPS, nl = 0;
    int64_t share = B / dt_comm_size(c);
    dt_ddp *d = NULL;
    dt_ddp_stats st;
    dt_result r;
    T(dt_ddp_create(&d, c, m, &j->ddp));
    T(dt_model_get_params(m, out->first, dt_model_param_count(m)));
    for (s = 0; s < nb; s++) {
        int64_t first = (int64_t)s * B + me_ * share;
        if (j->mode == 1) {   /* two micro-batches of unequal size, synced on the second */
            int64_t a = share / 2 + 1;
            T(fwd(m, first, a, &out->loss[nl++]));
            T(dt_ddp_backward(d, NULL, a, 0));
            T(fwd(m, first + a, share - a, &out->loss[nl++]));
            T(dt_ddp_backward(d, NULL, share - a, 1));
        } else if (j->mode == 3) {
            T(fwd(m, first, share, &out->loss[nl++]));
            T(dt_model_backward(m, NULL));
            T(dt_ddp_sync(d, share));
        } else {
            T(fwd(m, first, share, &out->loss[nl++]));
            T(dt_ddp_backward(d, NULL, share, 1));
        }
        T(dt_optim_step(o));
        dt_model_zero_grad(m);
    }
    T(dt_ddp_join(d, o));
    if (j->bn && !j->ddp.sync_buffers) T(dt_ddp_sync_buffers(d));
    st = dt_ddp_get_stats(d);
    out->count[0] = st.syncs;
    out->count[1] = st.joined_rounds;
    out->count[2] = dt_ddp_buckets(d);
    out->count[3] = dt_ddp_overlapped(d);   /* BUCKETS: 1 on local ranks and on MPI (dt_launch's MPI_THREAD_SERIALIZED) */
done:
    dt_ddp_destroy(d);
    return r;
}

/* local SGD: STEPS + 1 steps of B / world samples per rank, averages every lsgd.period steps and at the end */
static dt_result localsgd_rank(dt_comm *c, const job *j, dt_model *m, dt_optim *o, rec *out) {
    int me_ = dt_comm_rank(c), s;
    int64_t share = B / dt_comm_size(c);
    dt_localsgd *d = NULL;
    dt_result r;
    T(dt_localsgd_create(&d, c, m, &j->lsgd));
    T(dt_model_get_params(m, out->first, dt_model_param_count(m)));
    for (s = 0; s < STEPS + 1; s++) {
        T(grad(m, (int64_t)s * B + me_ * share, share, &out->loss[s]));
        T(dt_optim_step(o));
        T(dt_localsgd_step(d));
    }
    T(dt_localsgd_average(d));
    out->count[0] = dt_localsgd_get_stats(d).steps;
    out->count[1] = dt_localsgd_get_stats(d).averages;
done:
    dt_localsgd_destroy(d);
    return r;
}

/* D-PSGD: STEPS steps of B / world samples per rank, the consensus distance after each, then the average */
static dt_result dpsgd_rank(dt_comm *c, const job *j, dt_model *m, dt_optim *o, rec *out) {
    int me_ = dt_comm_rank(c), s;
    int64_t share = B / dt_comm_size(c);
    dt_dpsgd *d = NULL;
    dt_topology t;
    dt_topology_schedule sched;
    dt_topology_desc td = j->topo;
    dt_dpsgd_desc dd = j->dpsgd;
    dt_result r;
    memset(&t, 0, sizeof t);
    memset(&sched, 0, sizeof sched);
    td.world = dt_comm_size(c);
    if (j->chord) {   /* i -> i + 1 and 0 -> 2: not regular, so push-sum's weights leave 1 */
        uint8_t adj[MAXR * MAXR];
        int q;
        memset(adj, 0, sizeof adj);
        for (q = 0; q < td.world; q++) adj[q * td.world + (q + 1) % td.world] = 1;
        if (td.world > 2) adj[0 * td.world + 2] = 1;
        td.kind = DT_TOPO_CUSTOM; td.adjacency = adj; td.directed = 1;
        T(dt_topology_create(&t, &td));
        T(dt_dpsgd_create(&d, c, m, &t, &dd));
    } else if (j->one_peer) {
        T(j->one_peer == 2 ? dt_topology_one_peer_exp_directed(&sched, td.world) : dt_topology_one_peer_exp(&sched, td.world));
        dd.schedule = dt_topology_schedule_at; dd.schedule_user = &sched; dd.period = sched.period;
        T(dt_dpsgd_create(&d, c, m, NULL, &dd));
    } else {
        T(dt_topology_create(&t, &td));
        T(dt_dpsgd_create(&d, c, m, &t, &dd));
    }
    T(dt_model_get_params(m, out->first, dt_model_param_count(m)));
    for (s = 0; s < STEPS; s++) {
        T(grad(m, (int64_t)s * B + me_ * share, share, &out->loss[s]));
        T(dt_dpsgd_step(d, o));
        T(dt_dpsgd_consensus(d, &out->metric[s]));
    }
    T(dt_dpsgd_average(d, out->avg));
    out->count[0] = dt_dpsgd_get_stats(d).steps;
    out->count[1] = (int64_t)dt_dpsgd_get_stats(d).bytes_sent;
done:
    dt_dpsgd_destroy(d);
    dt_topology_free(&t);
    dt_topology_schedule_free(&sched);
    return r;
}

/* FedAvg: CLIENTS clients (an IID partition of the samples) over the ranks, ROUNDS rounds; every rank
   records each round's report and rank 0 the clients kept in the aggregate. The clients' optimizers are
   FedAvg's own (o is not used). */
static dt_result fed_rank(dt_comm *c, const job *j, dt_model *m, rec *out) {
    int behaviour[CLIENTS], i;
    dt_fed *f = NULL;
    dt_partition part;
    dt_partition_desc pd;
    dt_fed_desc fd;
    dt_result r;
    int64_t t;
    memset(&part, 0, sizeof part);
    for (i = 0; i < CLIENTS; i++) behaviour[i] = i == j->attacker - 1 ? DT_FED_SIGNFLIP : DT_FED_HONEST;
    memset(&pd, 0, sizeof pd);
    pd.count = NS; pd.parts = CLIENTS; pd.seed = 1;   /* IID */
    T(dt_partition_create(&part, &pd));
    memset(&fd, 0, sizeof fd);
    fd.clients = CLIENTS; fd.frac = j->frac; fd.dropout_prob = j->dropout; fd.local_epochs = 2; fd.batch = 5;
    fd.optim.lr = 0.05f; fd.optim.momentum = j->momentum; fd.agg.kind = j->agg; fd.data = &DS; fd.part = &part;
    fd.behaviour = behaviour; fd.seed = 2; fd.agg.trim = j->trim; fd.agg.f = DT_DEFAULT;   /* multi-Krum: n - 1 kept */
    T(dt_fed_create(&f, c, m, &fd));
    T(dt_model_get_params(m, out->first, dt_model_param_count(m)));
    for (t = 0; t < ROUNDS; t++) {
        dt_fed_round_info info;
        int64_t *q = out->count + 4 + t * (5 + CLIENTS);
        int kept[CLIENTS], sel[CLIENTS], drop[CLIENTS], ns;
        T(dt_fed_round(f, t, &info));
        out->metric[t] = info.train_loss;
        q[0] = info.selected; q[1] = info.dropped; q[2] = info.kept; q[3] = info.samples;
        dt_fed_last_kept(f, kept);
        for (i = 0; i < CLIENTS; i++) q[5 + i] = kept[i];   /* + 2 sampled, + 4 dropped out */
        q[4] = ns = dt_fed_draw(f, t, sel, drop);
        for (i = 0; i < ns; i++) q[5 + sel[i]] += 2 + 4 * drop[i];
    }
done:
    dt_fed_destroy(f);
    dt_partition_free(&part);
    return r;
}
#undef T

/* One rank of a case: its model (an MLP 12 -> 16 (-> batchnorm) -> 10 -> 4, seeded by rank) and optimizer
   (SGD with weight decay), the trainer, then the parameters and buffers it ends with. */
static dt_result train_rank(dt_comm *c, void *arg) {
    const job *j = (const job *)arg;
    rec *out = j->local ? &j->out[dt_comm_rank(c)] : j->out;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_optim_desc od;
    dt_result r;
    int64_t nb = 0;
    memset(&od, 0, sizeof od);
    od.lr = 0.1f; od.momentum = j->momentum; od.weight_decay = 1e-4f;
    if ((r = tc_mlp(&m, IN, K, 1 + 77 * (uint64_t)dt_comm_rank(c), j->bn, 16, 10)) == DT_OK && (r = dt_optim_create(&o, m, &od)) == DT_OK) {
        switch (j->trainer) {
        case TR_DDP: r = ddp_rank(c, j, m, o, out); break;
        case TR_LOCALSGD: r = localsgd_rank(c, j, m, o, out); break;
        case TR_DPSGD: r = dpsgd_rank(c, j, m, o, out); break;
        default: r = fed_rank(c, j, m, out); break;
        }
    }
    if (r == DT_OK) dt_model_buffers(m, &nb);
    if (r == DT_OK && nb > MAXB) r = dt_set_error(DT_ERR_STATE, "%lld buffers: raise MAXB", (long long)nb);
    if (r == DT_OK) r = dt_model_get_params(m, out->params, dt_model_param_count(m));
    if (r == DT_OK && nb > 0) r = dt_model_get_buffers(m, out->bufs, nb);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

/* ---- MPI against local ranks ---- */

static double native_diff;   /* the largest relative difference of the fields compared within TOL */

/* compares one field of rank r's records: bit for bit, or within TOL relative to the field's largest value */
static void same_floats(const char *what, const char *field, int r, const float *mpi, const float *loc, int64_t n, int exact) {
    double e = dt_t_relerr(mpi, loc, n);
    if (!exact && e > native_diff) native_diff = e;
    if (exact ? memcmp(mpi, loc, sizeof(float) * (size_t)n) == 0 : e <= TOL) return;
    dt_t_checks_failed++;
    printf("    %s: rank %d's %s differ between MPI and local ranks (relative %.3g%s)\n", what, r, field, e,
           exact ? ", bits expected" : "");
}
static void same_doubles(const char *what, const char *field, int r, const double *mpi, const double *loc, int n, int exact) {
    int i;
    for (i = 0; i < n; i++) {
        double e = fabs(mpi[i] - loc[i]) / (fabs(loc[i]) > 1e-30 ? fabs(loc[i]) : 1.0);
        if (!exact && e > native_diff) native_diff = e;
        if (exact ? memcmp(&mpi[i], &loc[i], sizeof(double)) == 0 : e <= TOL) continue;
        dt_t_checks_failed++;
        printf("    %s: rank %d's %s[%d] differs between MPI and local ranks: %.17g against %.17g\n", what, r, field, i, mpi[i], loc[i]);
    }
}
static void compare(const job *j, const char *what, const rec *mpi, const rec *loc) {
    int r;
    native_diff = 0.0;
    for (r = 0; r < np; r++) {
        const rec *a = &mpi[r], *b = &loc[r];
        same_floats(what, "initial parameters", r, a->first, b->first, MAXP, 1);   /* a broadcast: a byte copy */
        same_floats(what, "parameters", r, a->params, b->params, MAXP, j->exact);
        same_floats(what, "buffers", r, a->bufs, b->bufs, MAXB, j->exact);
        same_floats(what, "losses", r, a->loss, b->loss, 2 * (STEPS + 1), j->exact);
        same_floats(what, "D-PSGD average", r, a->avg, b->avg, MAXP, j->exact && j->exact_mean);
        same_doubles(what, j->trainer == TR_FED ? "train loss" : "consensus", r, a->metric, b->metric, STEPS + ROUNDS,
                     j->exact && j->exact_mean);
        if (memcmp(a->count, b->count, sizeof a->count) != 0) {
            dt_t_checks_failed++;
            printf("    %s: rank %d's counters differ between MPI and local ranks\n", what, r);
        }
        if (j->exact && j->exact_mean && memcmp(a, b, sizeof *a) != 0) {   /* nothing left out above */
            dt_t_checks_failed++;
            printf("    %s: rank %d's records differ\n", what, r);
        }
    }
    if ((!j->exact || !j->exact_mean) && native_diff > 0.0)
        printf("    %s: the floats NATIVE touches differ by a relative %.2g at most\n", what, native_diff);
    else if (!j->exact || !j->exact_mean)
        printf("    %s: the floats NATIVE touches are the same bits here too\n", what);
    /* not vacuous: the parameters moved, and the replicas that must agree do */
    if (memcmp(mpi[0].params, mpi[0].first, sizeof mpi[0].params) == 0) {
        dt_t_checks_failed++;
        printf("    %s: training left the parameters where they were\n", what);
    }
    if (j->trainer == TR_FED) {   /* clients dropped out, and multi-Krum left one out */
        int64_t dropped = 0, left_out = 0;
        int t, k;
        for (t = 0; t < ROUNDS; t++) {
            const int64_t *q = mpi[0].count + 4 + t * (5 + CLIENTS);
            dropped += q[1];
            for (k = 0; k < CLIENTS; k++) left_out += q[5 + k] == 2;   /* sampled, reported, not kept */
        }
        CHECK(j->dropout == 0.0f || dropped > 0);
        CHECK(j->agg != DT_FED_MULTIKRUM || left_out > 0);
    }
    for (r = 1; r < np; r++) {
        CHECK(memcmp(mpi[r].first, mpi[0].first, sizeof mpi[0].first) == 0 || j->trainer == TR_FED);
        if ((j->trainer == TR_DDP || j->trainer == TR_LOCALSGD) && j->exact) CHECK(memcmp(mpi[r].params, mpi[0].params, sizeof mpi[0].params) == 0);
    }
}

/* FedAvg: rank 0's global model (parameters and buffers, which moved) is the one the same run ends with on
   one local rank, where rank 0 trains every client itself. */
static void same_global(job *j, const char *what, const rec *mpi) {
    rec *one = (rec *)calloc(1, sizeof(rec));
    dt_launch_desc d;
    dt_model *m = NULL;
    float init[MAXB];
    if (!one) { printf("out of memory\n"); exit(2); }
    memset(&d, 0, sizeof d);
    memset(init, 0, sizeof init);
    CHECK_OK(tc_mlp(&m, IN, K, 1, 1, 16, 10));   /* the initial statistics */
    CHECK_OK(dt_model_get_buffers(m, init, 32));
    dt_model_destroy(m);
    d.ranks = 1;
    j->local = 1;
    j->out = one;
    CHECK_OK(dt_launch_local(&d, train_rank, j, NULL));
    same_floats(what, "global parameters (one local rank)", 0, mpi[0].params, one->params, MAXP, 1);
    same_floats(what, "global buffers (one local rank)", 0, mpi[0].bufs, one->bufs, MAXB, 1);
    CHECK(memcmp(one->bufs, init, sizeof init) != 0);
    free(one);
}

/* Runs the case on MPI (every rank), then on np local ranks (rank 0), and compares on rank 0. */
static void run_case(job *j, const char *what) {
    rec *mine = (rec *)calloc(1, sizeof(rec)), *mpi = (rec *)calloc((size_t)np, sizeof(rec)), *loc = (rec *)calloc((size_t)np, sizeof(rec));
    dt_comm_desc cd = Wdesc;
    dt_comm *c = NULL;
    if (!mine || !mpi || !loc) { printf("out of memory\n"); exit(2); }
    cd.algo = j->comm_algo;
    CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &cd));
    if (c) {
        j->local = 0;
        j->out = mine;
        CHECK_OK(train_rank(c, j));
        dt_comm_destroy(c);
    }
    CHECK_OK(dt_comm_gather(W, mine, me == 0 ? mpi : NULL, sizeof(rec), DT_U8, 0));
    if (me == 0) {
        dt_launch_desc d;
        memset(&d, 0, sizeof d);
        d.ranks = np;
        d.comm = cd;
        j->local = 1;
        j->out = loc;
        CHECK_OK(dt_launch_local(&d, train_rank, j, NULL));
        if (j->trainer == TR_DDP) {   /* overlapped with backward on both, or on neither */
            int r, over = j->ddp.method == DT_DDP_BUCKETS && !j->ddp.no_overlap;
            for (r = 0; r < np; r++) CHECK(mpi[r].count[3] == over && loc[r].count[3] == over);
            if (j->ddp.method == DT_DDP_BUCKETS && j->ddp.bucket_bytes == 200) CHECK(mpi[0].count[2] == 3);
        }
        compare(j, what, mpi, loc);
        if (j->trainer == TR_FED && j->bn) same_global(j, what, mpi);
    }
    free(mine); free(mpi); free(loc);
}

static job base(int trainer, dt_algo comm_algo) {
    job j;
    memset(&j, 0, sizeof j);
    j.trainer = trainer;
    j.comm_algo = comm_algo;
    j.exact = j.exact_mean = 1;
    j.momentum = 0.9f;
    return j;
}

/* ---- the tests ---- */
static const dt_algo algos[] = {DT_ALGO_NAIVE, DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NATIVE};
#define N_OF(a) (sizeof(a) / sizeof(a[0]))

/* every averaging method; the all-reduce methods with every algorithm. BUCKETS: 200 bytes a bucket
   (three buckets), overlapped with backward, and once without overlap */
static void test_ddp_methods(void) {
    int meth;
    size_t a;
    char what[128];
    for (meth = 0; meth < DT_DDP_METHOD_COUNT; meth++)
        for (a = 0; a < N_OF(algos); a++) {
            int allreduce = meth == DT_DDP_BUCKETS || meth == DT_DDP_FLAT || meth == DT_DDP_PER_LAYER;
            job j = base(TR_DDP, DT_ALGO_RING);
            if (!allreduce && a) break;
            j.ddp.method = (dt_ddp_method)meth;
            j.ddp.algo = allreduce ? algos[a] : DT_ALGO_AUTO;
            j.ddp.bucket_bytes = 200;
            j.exact = j.ddp.algo != DT_ALGO_NATIVE;
            snprintf(what, sizeof what, "ddp %s%s%s", dt_ddp_method_name(j.ddp.method), allreduce ? " " : "",
                     allreduce ? dt_algo_name(j.ddp.algo) : "");
            run_case(&j, what);
        }
    {
        job j = base(TR_DDP, DT_ALGO_RING);
        j.ddp.bucket_bytes = 200;
        j.ddp.no_overlap = 1;
        run_case(&j, "ddp buckets ring, no overlap");
    }
}

/* accumulation, unequal batch counts (join), backward + dt_ddp_sync, BatchNorm statistics at every sync,
   synchronised batch norm (with and without a join); and a communicator whose default is NATIVE */
static void test_ddp_modes(void) {
    static const char *names[] = {"", "two micro-batches", "odd ranks one batch less", "backward + dt_ddp_sync"};
    int mode, meth;
    char what[128];
    for (mode = 1; mode <= 3; mode++) {
        job j = base(TR_DDP, DT_ALGO_RING);
        j.mode = mode;
        j.ddp.bucket_bytes = 200;
        snprintf(what, sizeof what, "ddp buckets ring, %s", names[mode]);
        run_case(&j, what);
    }
    for (meth = 1; meth < DT_DDP_METHOD_COUNT; meth++) {   /* FLAT and PER_LAYER on the communicator's TREE */
        job j = base(TR_DDP, DT_ALGO_TREE);
        j.mode = 2;
        j.ddp.method = (dt_ddp_method)meth;
        snprintf(what, sizeof what, "ddp %s%s, odd ranks one batch less", dt_ddp_method_name(j.ddp.method),
                 meth <= DT_DDP_PER_LAYER ? " tree" : "");
        run_case(&j, what);
    }
    {
        job j = base(TR_DDP, DT_ALGO_RING);
        j.bn = 1;
        j.ddp.sync_buffers = 1;
        j.ddp.bucket_bytes = 200;
        run_case(&j, "ddp buckets ring, batchnorm statistics at every sync");
    }
    for (mode = 0; mode <= 2; mode += 2) {   /* synchronised batch norm: its sums between the overlapped buckets */
        job j = base(TR_DDP, DT_ALGO_RING);
        j.bn = 1;
        j.mode = mode;
        j.ddp.sync_bn = 1;
        j.ddp.bucket_bytes = 200;
        run_case(&j, mode ? "ddp buckets ring, synchronised batchnorm, odd ranks one batch less"
                          : "ddp buckets ring, synchronised batchnorm");
    }
    {
        job j = base(TR_DDP, DT_ALGO_NATIVE);
        j.bn = 1;
        j.ddp.algo = DT_ALGO_RING;   /* the AUTO collectives (the samples' agreement, the initial broadcast)
                                        are NATIVE's, but they carry integers and copies: the same bits */
        run_case(&j, "ddp buckets ring on a native communicator, batchnorm");
    }
}

/* compressed gradients (dt_ddp_compress): bf16 in overlapped buckets on a NATIVE communicator (16 bits
   run as RING on both backends), fp16 flat over the tree, top-k with error feedback in buckets with a rank
   one batch short (join), top-k without feedback per layer, PowerSGD in buckets with a rank one batch short,
   with and without a warm-up of plain syncs: the same bits under MPI as on local ranks */
static void test_ddp_compress(void) {
    job j = base(TR_DDP, DT_ALGO_NATIVE);
    j.ddp.bucket_bytes = 200;
    j.ddp.compress = DT_DDP_BF16;
    run_case(&j, "ddp buckets bf16, native communicator");
    j = base(TR_DDP, DT_ALGO_TREE);
    j.ddp.method = DT_DDP_FLAT;
    j.ddp.compress = DT_DDP_FP16;
    run_case(&j, "ddp flat fp16 tree");
    j = base(TR_DDP, DT_ALGO_RING);
    j.mode = 2;
    j.ddp.bucket_bytes = 200;
    j.ddp.compress = DT_DDP_TOPK;
    j.ddp.topk_ratio = 0.05;
    run_case(&j, "ddp buckets top-k 5%, odd ranks one batch less");
    j = base(TR_DDP, DT_ALGO_RING);
    j.ddp.method = DT_DDP_PER_LAYER;
    j.ddp.compress = DT_DDP_TOPK;
    j.ddp.no_feedback = 1;
    run_case(&j, "ddp per-layer top-k 1% without feedback");
    j = base(TR_DDP, DT_ALGO_RING);
    j.mode = 2;
    j.ddp.bucket_bytes = 200;
    j.ddp.compress = DT_DDP_POWERSGD;
    j.ddp.powersgd_rank = 1;
    run_case(&j, "ddp buckets powersgd rank 1, odd ranks one batch less");
    j.ddp.powersgd_warmup = 2;   /* the warm-up's count of syncs is the same on every rank, joined ones included */
    run_case(&j, "ddp buckets powersgd rank 1 after 2 plain syncs, odd ranks one batch less");
}

/* DDP under MPI sums buckets while backward runs, and ends with the bits of summing them after it. The
   model's first layer (2048 x 256, its backward some milliseconds) comes last in backward, after the two
   small buckets of the layers above it are final: their all-reduces must begin before backward returns
   (dt_ddp_stats.early_buckets), on every rank, in at least one of the steps; a DDP that reduced after
   backward counts none. The same steps without overlap give the same parameters, bit for bit. */
#define OV_IN 2048
#define OV_B 64
#define OV_STEPS 6
static dt_result overlap_rank(dt_comm *c, int no_overlap, float *params, int64_t *early, int *overlapped) {
    float *x = (float *)malloc(sizeof(float) * OV_B * OV_IN);
    int32_t y[OV_B];
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_optim_desc od;
    dt_ddp_desc dd;
    dt_rng g;
    float loss;
    int s, i;
    dt_result r = x ? DT_OK : DT_ERR_OUT_OF_MEMORY;
    memset(&od, 0, sizeof od);
    memset(&dd, 0, sizeof dd);
    od.lr = 0.01f;
    dd.algo = DT_ALGO_RING;
    dd.bucket_bytes = 128;   /* three buckets: the last layer, the middle one, the first */
    dd.no_overlap = no_overlap;
    dt_rng_init(&g, 11, (uint64_t)dt_comm_rank(c));
    for (i = 0; x && i < OV_B * OV_IN; i++) x[i] = dt_rng_uniform(&g) - 0.5f;
    for (i = 0; i < OV_B; i++) y[i] = (int32_t)dt_rng_below(&g, K);
#define T(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)
    if (r != DT_OK) goto done;
    T(tc_mlp(&m, OV_IN, K, 3, 0, 256, 8));
    T(dt_optim_create(&o, m, &od));
    T(dt_ddp_create(&d, c, m, &dd));
    for (s = 0; s < OV_STEPS; s++) {
        T(dt_model_forward(m, x, OV_B));
        T(dt_model_loss_labels(m, y, &loss));
        T(dt_ddp_backward(d, NULL, OV_B, 1));
        T(dt_optim_step(o));
        dt_model_zero_grad(m);
    }
    T(dt_model_get_params(m, params, dt_model_param_count(m)));
    *early = dt_ddp_get_stats(d).early_buckets;
    *overlapped = dt_ddp_overlapped(d);
#undef T
done:
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    free(x);
    return r;
}
static void test_ddp_overlap(void) {
    int64_t n = OV_IN * 256 + 256 + 256 * 8 + 8 + 8 * K + K, early[2] = {-1, -1};
    float *p[2];
    int ov[2] = {-1, -1}, k;
    p[0] = (float *)calloc((size_t)n, sizeof(float));
    p[1] = (float *)calloc((size_t)n, sizeof(float));
    for (k = 0; k < 2 && p[0] && p[1]; k++) {
        dt_comm *c = NULL;
        CHECK_OK(dt_comm_create_mpi(&c, MPI_COMM_WORLD, &Wdesc));
        if (c) CHECK_OK(overlap_rank(c, k, p[k], &early[k], &ov[k]));
        dt_comm_destroy(c);
    }
    CHECK(ov[0] == 1 && early[0] > 0);
    CHECK(ov[1] == 0 && early[1] == 0);
    CHECK(p[0] && p[1] && memcmp(p[0], p[1], sizeof(float) * (size_t)n) == 0);
    if (me == 0) printf("    %lld of %d buckets began during backward on rank 0\n", (long long)early[0], 3 * OV_STEPS);
    free(p[0]); free(p[1]);
}

/* period 2 over 5 steps and a final average, every algorithm; BatchNorm buffers averaged too */
static void test_localsgd(void) {
    size_t a;
    char what[128];
    for (a = 0; a < N_OF(algos); a++) {
        job j = base(TR_LOCALSGD, DT_ALGO_RING);
        j.lsgd.period = 2;
        j.lsgd.algo = algos[a];
        j.exact = algos[a] != DT_ALGO_NATIVE;
        snprintf(what, sizeof what, "local SGD period 2, %s", dt_algo_name(algos[a]));
        run_case(&j, what);
    }
    {
        job j = base(TR_LOCALSGD, DT_ALGO_RING);
        j.bn = 1;
        j.lsgd.sync_buffers = 1;
        run_case(&j, "local SGD period 0, batchnorm buffers");
    }
}

/* both orders on a ring; an exponential graph with Metropolis weights gossiping BatchNorm buffers too;
   the full graph; and on a NATIVE communicator, where only the consensus and the average are NATIVE's */
static void test_dpsgd(void) {
    int order;
    char what[128];
    for (order = 0; order < DT_DPSGD_ORDER_COUNT; order++) {
        job j = base(TR_DPSGD, DT_ALGO_RING);
        j.dpsgd.order = (dt_dpsgd_order)order;
        j.topo.kind = DT_TOPO_RING;
        snprintf(what, sizeof what, "d-psgd %s, ring", dt_dpsgd_order_name(j.dpsgd.order));
        run_case(&j, what);
    }
    {
        job j = base(TR_DPSGD, DT_ALGO_TREE);
        j.topo.kind = DT_TOPO_EXPONENTIAL;
        j.topo.mixing = DT_MIXING_METROPOLIS;
        j.bn = 1;
        j.dpsgd.mix_buffers = 1;
        run_case(&j, "d-psgd cta, exponential graph, metropolis, batchnorm buffers");
    }
    {
        job j = base(TR_DPSGD, DT_ALGO_NAIVE);
        j.topo.kind = DT_TOPO_FULL;
        j.dpsgd.order = DT_DPSGD_ADAPT_THEN_COMBINE;
        j.momentum = 0.0f;
        run_case(&j, "d-psgd atc, full graph");
    }
    {
        job j = base(TR_DPSGD, DT_ALGO_NATIVE);
        j.topo.kind = DT_TOPO_RING;
        j.exact_mean = 0;
        run_case(&j, "d-psgd cta, ring, native communicator");
    }
    {
        job j = base(TR_DPSGD, DT_ALGO_RING);
        j.one_peer = 1;
        j.bn = 1;
        j.dpsgd.mix_buffers = 1;
        run_case(&j, "d-psgd cta, one-peer exponential schedule, batchnorm buffers");
    }
    {
        job j = base(TR_DPSGD, DT_ALGO_RING);
        j.chord = 1;
        j.bn = 1;
        j.dpsgd.push_sum = 1;
        j.dpsgd.mix_buffers = 1;
        j.dpsgd.order = DT_DPSGD_ADAPT_THEN_COMBINE;
        run_case(&j, "push-sum atc, directed ring with a chord, batchnorm buffers");
    }
    {
        job j = base(TR_DPSGD, DT_ALGO_RING);
        j.one_peer = 2;
        j.dpsgd.push_sum = 1;
        run_case(&j, "push-sum cta, directed one-peer exponential schedule");
    }
}

/* Pure gossip over the one-peer exponential schedule on the MPI processes, from distinct integer replicas:
   with a power of two of them, after log2 p steps every replica is the mean, bit for bit, and the consensus
   distance 0; on 3 (a rank sits each step out) the mean stays but the replicas still differ. */
static void one_peer_consensus(int directed) {
    dt_topology_schedule s;
    dt_dpsgd_desc dd;
    dt_dpsgd *d = NULL;
    dt_model *m = NULL;
    float x[MAXP], mean[MAXP], avg[MAXP];
    double dist = -1.0;
    int64_t n, k;
    int t, i, pow2 = (np & (np - 1)) == 0;
    memset(&dd, 0, sizeof dd);
    CHECK_OK(directed ? dt_topology_one_peer_exp_directed(&s, np) : dt_topology_one_peer_exp(&s, np));
    dd.push_sum = directed;
    if (directed) dd.order = DT_DPSGD_ADAPT_THEN_COMBINE;   /* push-sum: the values set after the create are pushed at once */
    dd.schedule = dt_topology_schedule_at; dd.schedule_user = &s; dd.period = s.period;
    CHECK_OK(tc_mlp(&m, IN, K, 1, 0, 16, 10));
    if (!m || !s.graphs) return;
    n = dt_model_param_count(m);
    for (k = 0; k < n; k++) {
        double sum = 0.0;
        for (i = 0; i < np; i++) sum += (double)((i * 37 + k * 11) % 23 - 11);
        x[k] = (float)((me * 37 + k * 11) % 23 - 11);
        mean[k] = (float)(sum / np);
    }
    CHECK_OK(dt_dpsgd_create(&d, W, m, NULL, &dd));
    CHECK_OK(dt_model_set_params(m, x, n));
    for (t = 0; t < s.period; t++) CHECK_OK(dt_dpsgd_step(d, NULL));
    CHECK_OK(dt_dpsgd_consensus(d, &dist));
    CHECK_OK(dt_model_get_params(m, x, n));
    CHECK_OK(dt_dpsgd_average(d, avg));
    if (pow2) CHECK(dist == 0.0 && memcmp(x, mean, sizeof(float) * (size_t)n) == 0);
    else CHECK(dist > 0.1);
    for (k = 0; k < n; k++) CHECK(fabs(avg[k] - mean[k]) < 1e-5);
    if (directed) CHECK(dt_dpsgd_push_weight(d) == 1.0 &&   /* one peer each step, the numerators and the weight */
                        dt_dpsgd_get_stats(d).bytes_sent == (uint64_t)s.period * (uint64_t)(n + 1) * sizeof(float));
    else CHECK(dt_dpsgd_get_stats(d).bytes_sent == (uint64_t)(np == 3 && me > 0 ? 1 : s.period) * (uint64_t)n * sizeof(float));
    dt_dpsgd_destroy(d);
    dt_model_destroy(m);
    dt_topology_schedule_free(&s);
}
static void test_one_peer_consensus(void) { one_peer_consensus(0); }
/* push-sum over the directed one-peer exponential schedule: the same (on 3 the mean is approached) */
static void test_push_sum_consensus(void) { one_peer_consensus(1); }

/* CLIENTS clients over the ranks (on 2 ranks all on rank 1): the mean with seeded dropouts and a fraction;
   multi-Krum against a sign-flipping client; the trimmed mean with dropouts; on RING and NATIVE
   communicators alike (FedAvg broadcasts and sends; nothing it does is reduced). With batchnorm (the mean,
   and the median against a sign-flipping client) run_case also holds rank 0's global parameters and
   statistics to those of the same run on one local rank: aggregated, they do not depend on the world size */
static void test_fedavg(void) {
    job j = base(TR_FED, DT_ALGO_RING);
    j.agg = DT_FED_MEAN; j.frac = 6.0f / 7.0f; j.dropout = 0.3f;
    run_case(&j, "fedavg mean, C = 6/7, dropout 0.3");
    j = base(TR_FED, DT_ALGO_NATIVE);
    j.agg = DT_FED_MULTIKRUM; j.frac = 1.0f; j.attacker = 3; j.momentum = 0.0f;
    run_case(&j, "fedavg multi-krum, client 2 flips signs, native communicator");
    j = base(TR_FED, DT_ALGO_TREE);
    j.agg = DT_FED_TRIMMED; j.trim = 0.2f; j.frac = 1.0f; j.dropout = 0.25f;
    run_case(&j, "fedavg trimmed mean 0.2, dropout 0.25");
    j = base(TR_FED, DT_ALGO_RING);
    j.agg = DT_FED_MEAN; j.frac = 1.0f; j.dropout = 0.3f; j.bn = 1;
    run_case(&j, "fedavg mean, dropout 0.3, batchnorm");
    j = base(TR_FED, DT_ALGO_RING);
    j.agg = DT_FED_MEDIAN; j.frac = 1.0f; j.attacker = 3; j.bn = 1;
    run_case(&j, "fedavg median, client 2 flips signs, batchnorm");
}

static dt_result rank_main(dt_comm *c, void *arg) {
    dt_result r;
    (void)arg;
    W = c;
    me = dt_comm_rank(c);
    np = dt_comm_size(c);
    if (strcmp(dt_comm_backend_name(c), "mpi") != 0 || np < 2 || np > MAXR)
        return dt_set_error(DT_ERR_STATE, "start this test with mpiexec -n 2 (up to %d), not alone", MAXR);
    if ((r = mt_begin(me)) != DT_OK) return r;
    if (me == 0) printf("%d MPI ranks against %d local ranks\n", np, np);
    mt_run("ddp_methods", test_ddp_methods);
    mt_run("ddp_modes", test_ddp_modes);
    mt_run("ddp_overlap", test_ddp_overlap);
    mt_run("ddp_compress", test_ddp_compress);
    mt_run("localsgd", test_localsgd);
    mt_run("dpsgd", test_dpsgd);
    mt_run("dpsgd_one_peer_consensus", test_one_peer_consensus);
    mt_run("dpsgd_push_sum_consensus", test_push_sum_consensus);
    mt_run("fedavg", test_fedavg);
    return mt_end();
}

int main(int argc, char **argv) {
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);   /* FedAvg warns when dropouts leave too few reports */
    make_data();
    return mt_main(argc, argv, 256, 60, &Wdesc, rank_main);   /* segments of 256 bytes: the ring's pipeline
                                                                  even on these small buffers */
}
