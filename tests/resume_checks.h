/* resume_checks.h - the kill-and-resume run that test_resume (local ranks) and mpi/test_resume_mpi (mpiexec,
   driven by tests/run.sh) share. One program run trains a small model with batch norm and dropout on
   generated images, with one trainer (single: the loop of one process with dt_checkpoint_save; ddp, localsgd,
   dpsgd (a ring), dpsgd-exp (the one-peer exponential schedule), sgp (push-sum on a directed ring with the chord
   0 -> 2, whose weights leave 1), fedavg on every rank of the launch), a checkpoint every `every` steps (FedAvg: rounds). With
   --kill-at K, rank K % world raises SIGKILL on itself after step K (its checkpoint, if any, written):
   the whole process dies, and under mpiexec the job. With --resume it continues from the checkpoint when
   there is one (and fails unless it resumes from step --expect-from). At the end rank 0 writes every rank's
   parameters, buffers and running loss sum to --out: a resumed run must write the bytes an uninterrupted one
   writes. What must be restored for that: parameters, buffers, optimizer state and step counts, the dropout
   RNG, the loader's epoch and batch (shuffle and crop and flip of the batches after), the caller's RNG (it
   scales each step's learning rate), a schedule over the step, local SGD's steps since its average, D-PSGD's
   step (the graph of a time-varying topology), push-sum's numerators and weight, and FedAvg's round. Include after dtrain.h (with its implementation), with _POSIX_C_SOURCE defined. */
#ifndef RESUME_CHECKS_H
#define RESUME_CHECKS_H
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RS_N 96          /* samples, 1 x 8 x 8, 4 classes */
#define RS_BATCH 8

typedef struct rs_args {
    const char *trainer;     /* single, ddp, localsgd, dpsgd, dpsgd-exp, sgp, fedavg */
    int         ranks;       /* local ranks (ignored under mpiexec) */
    int         steps, every, kill_at, resume, expect_from;
    const char *ckpt, *out;
} rs_args;

static uint8_t rs_pix[RS_N * 64];
static int32_t rs_lab[RS_N];

/* Generates the samples; once, before the ranks start (they only read them). */
static void rs_fill(void) {
    dt_rng r;
    int i;
    dt_rng_init(&r, 17, 0);
    for (i = 0; i < RS_N; i++) rs_lab[i] = (int32_t)dt_rng_below(&r, 4);
    for (i = 0; i < RS_N * 64; i++)   /* a class's pixels are brighter in its quarter of the image */
        rs_pix[i] = (uint8_t)(dt_rng_below(&r, 128) + ((i % 64) / 16 == rs_lab[i / 64] ? 100 : 0));
}

static dt_dataset rs_data(void) {
    dt_dataset ds;
    memset(&ds, 0, sizeof ds);
    ds.count = RS_N; ds.c = 1; ds.h = 8; ds.w = 8; ds.num_classes = 4; ds.pixels = rs_pix; ds.labels = rs_lab;
    return ds;
}

/* conv, batch norm, relu, pool, dropout, linear; each rank starts from another seed (the trainers' broadcast) */
static dt_result rs_model(dt_model **m, int rank) {
    dt_model_desc d;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = 1; d.in_h = 8; d.in_w = 8; d.seed = 11 + (uint64_t)rank; d.stream = (uint64_t)rank;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    x = dt_relu(*m, dt_batchnorm(*m, dt_conv2d(*m, 0, 4, 3, 1, 1)));
    x = dt_dropout(*m, dt_maxpool2d(*m, x, 2, 2, 0), 0.25f);
    dt_linear(*m, dt_flatten(*m, x), 4, 1);
    return dt_model_finalize(*m);
}

/* Resumes from a->ckpt if asked and it exists (rank 0 looks; all follow). *from = the step resumed from. */
static dt_result rs_resume(dt_comm *c, const rs_args *a, int kind, void *trainer, dt_model *m, dt_optim *o,
                           dt_checkpoint_meta *meta, int64_t *from) {
    int64_t exists = 0;
    dt_result r = DT_OK;
    FILE *f;
    *from = 0;
    if (!a->resume) return DT_OK;
    if (dt_comm_rank(c) == 0 && (f = fopen(a->ckpt, "rb")) != NULL) { exists = 1; fclose(f); }
    if ((r = dt_comm_broadcast(c, &exists, 1, DT_I64, 0, DT_ALGO_AUTO)) != DT_OK || !exists) return r;
    switch (kind) {
    case 0: r = dt_checkpoint_load(a->ckpt, m, o, meta); break;
    case 1: r = dt_ddp_load((dt_ddp *)trainer, a->ckpt, o, meta); break;
    case 2: r = dt_localsgd_load((dt_localsgd *)trainer, a->ckpt, o, meta); break;
    case 3: r = dt_dpsgd_load((dt_dpsgd *)trainer, a->ckpt, o, meta); break;
    default: r = dt_fed_load((dt_fed *)trainer, a->ckpt, meta); break;
    }
    *from = kind == 4 ? meta->round : meta->step;
    return r;
}

static dt_result rs_save(int kind, void *trainer, const rs_args *a, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta) {
    switch (kind) {
    case 0: return dt_checkpoint_save(a->ckpt, m, o, meta);
    case 1: return dt_ddp_save((dt_ddp *)trainer, a->ckpt, o, meta);
    case 2: return dt_localsgd_save((dt_localsgd *)trainer, a->ckpt, o, meta);
    case 3: return dt_dpsgd_save((dt_dpsgd *)trainer, a->ckpt, o, meta);
    default: return dt_fed_save((dt_fed *)trainer, a->ckpt, meta);
    }
}

/* Rank 0 writes every rank's parameters and buffers, then every rank's loss sum. */
static dt_result rs_write(dt_comm *c, const rs_args *a, dt_model *m, double loss_sum) {
    int64_t np = 0, nb = 0, n, p = dt_comm_size(c);
    float *mine, *all = NULL;
    double *sums = NULL;
    dt_result r = DT_OK;
    FILE *f;
    dt_model_params(m, &np);
    dt_model_buffers(m, &nb);
    n = np + nb;
    mine = (float *)malloc(sizeof(float) * (size_t)n);
    all = (float *)malloc(sizeof(float) * (size_t)(n * p));
    sums = (double *)malloc(sizeof(double) * (size_t)p);
    if (!mine || !all || !sums) { free(mine); free(all); free(sums); return DT_ERR_OUT_OF_MEMORY; }
    memcpy(mine, dt_model_params(m, NULL), sizeof(float) * (size_t)np);
    memcpy(mine + np, dt_model_buffers(m, NULL), sizeof(float) * (size_t)nb);
    if ((r = dt_comm_gather(c, mine, all, (size_t)n, DT_F32, 0)) == DT_OK)
        r = dt_comm_gather(c, &loss_sum, sums, 1, DT_F64, 0);
    if (r == DT_OK && dt_comm_rank(c) == 0) {
        dt__le32(all, (size_t)(n * p));   /* little-endian, as every file of dtrain's (dtrain/core/base.h) */
        dt__le64(sums, (size_t)p);
        if (!(f = fopen(a->out, "wb")) || fwrite(all, sizeof(float), (size_t)(n * p), f) != (size_t)(n * p) ||
            fwrite(sums, sizeof(double), (size_t)p, f) != (size_t)p)
            r = dt_set_error(DT_ERR_IO, "cannot write %s", a->out);
        if (f) fclose(f);
    }
    free(mine); free(all); free(sums);
    return r;
}

/* After a step (or round) is done: the checkpoint, then the kill. */
static dt_result rs_after(dt_comm *c, const rs_args *a, int kind, void *trainer, dt_model *m, dt_optim *o,
                          const dt_checkpoint_meta *meta, int64_t step) {
    dt_result r = DT_OK;
    if (step % a->every == 0) r = rs_save(kind, trainer, a, m, o, meta);
    if (r == DT_OK && step == a->kill_at && dt_comm_rank(c) == a->kill_at % dt_comm_size(c)) raise(SIGKILL);
    return r;
}

static int rs_kind(const char *t) {
    static const char *const names[] = {"single", "ddp", "localsgd", "dpsgd", "fedavg"};
    int i;
    for (i = 0; i < 5; i++)
        if (!strcmp(t, names[i])) return i;
    return strcmp(t, "dpsgd-exp") && strcmp(t, "sgp") ? -1 : 3;   /* D-PSGD over the one-peer exponential schedule, push-sum */
}

/* FedAvg: 5 clients, 4 sampled a round, the server on rank 0. */
static dt_result rs_fed(dt_comm *c, const rs_args *a, dt_model *m, dt_checkpoint_meta *meta, double *loss) {
    dt_dataset ds = rs_data();
    dt_partition part;
    dt_partition_desc pd;
    dt_fed_desc fd;
    dt_fed *f = NULL;
    dt_transform t;
    dt_fed_round_info info;
    int64_t from = 0, round;
    dt_result r;
    memset(&t, 0, sizeof t);
    t.crop_pad = 1; t.flip = 1;
    memset(&fd, 0, sizeof fd);
    memset(&pd, 0, sizeof pd);
    pd.count = RS_N; pd.parts = 5; pd.seed = 3;   /* IID */
    if ((r = dt_partition_create(&part, &pd)) != DT_OK) return r;
    fd.clients = 5; fd.frac = 0.8f; fd.batch = RS_BATCH; fd.data = &ds; fd.part = &part; fd.transform = &t; fd.seed = 9;
    fd.optim.kind = DT_OPTIM_SGD; fd.optim.lr = 0.05f; fd.optim.momentum = 0.9f; fd.prox_mu = 0.01f;
    if ((r = dt_fed_create(&f, c, m, &fd)) == DT_OK && (r = rs_resume(c, a, 4, f, m, NULL, meta, &from)) == DT_OK) {
        if (a->resume && from != a->expect_from)
            r = dt_set_error(DT_ERR_STATE, "resumed from round %lld, expected %d", (long long)from, a->expect_from);
        for (round = meta->round; round < a->steps && r == DT_OK; ) {
            if ((r = dt_fed_round(f, round, &info)) != DT_OK) break;
            meta->values[0] += info.train_loss;
            meta->round = ++round;
            r = rs_after(c, a, 4, f, m, NULL, meta, round);
        }
        *loss = meta->values[0];
    }
    dt_fed_destroy(f);
    dt_partition_free(&part);
    return r;
}

/* One step of the trainer on batch x [n], y [n] at rate lr. */
static dt_result rs_step(int kind, void *trainer, dt_model *m, dt_optim *o, const float *x, const int32_t *y, int64_t n,
                         float lr, float *loss) {
    dt_result r;
    if ((r = dt_optim_set_lr(o, lr)) != DT_OK) return r;
    dt_model_zero_grad(m);
    if ((r = dt_model_forward(m, x, n)) != DT_OK || (r = dt_model_loss_labels(m, y, loss)) != DT_OK) return r;
    if (kind == 1) r = dt_ddp_backward((dt_ddp *)trainer, NULL, n, 1);
    else r = dt_model_backward(m, NULL);
    if (r != DT_OK) return r;
    if (kind == 3) return dt_dpsgd_step((dt_dpsgd *)trainer, o);
    if ((r = dt_optim_step(o)) != DT_OK) return r;
    return kind == 2 ? dt_localsgd_step((dt_localsgd *)trainer) : DT_OK;
}

static dt_result rs_rank(dt_comm *c, void *arg) {
    const rs_args *a = (const rs_args *)arg;
    int kind = rs_kind(a->trainer), me = dt_comm_rank(c), p = dt_comm_size(c);
    dt_dataset ds = rs_data();
    int64_t ids[RS_N], nids = 0, i, from = 0;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_optim_desc od;
    dt_loader *l = NULL;
    dt_loader_desc ld;
    dt_transform t;
    dt_sched_desc sd;
    dt_checkpoint_meta meta;
    void *trainer = NULL;
    dt_topology topo;
    dt_topology_schedule sched;
    dt_result r;
    memset(&meta, 0, sizeof meta);
    memset(&topo, 0, sizeof topo);
    memset(&sched, 0, sizeof sched);
    dt_rng_init(&meta.rng, 23, (uint64_t)me);
    if (kind < 0 || (kind == 0 && p != 1)) return dt_set_error(DT_ERR_INVALID_ARG, "trainer %s on %d ranks", a->trainer, p);
    if ((r = rs_model(&m, me)) != DT_OK) return r;
    if (kind == 4) {
        double loss = 0.0;
        if ((r = rs_fed(c, a, m, &meta, &loss)) == DT_OK) r = rs_write(c, a, m, loss);
        dt_model_destroy(m);
        return r;
    }
    memset(&od, 0, sizeof od);
    od.kind = DT_OPTIM_SGD; od.lr = 0.05f; od.momentum = 0.9f; od.weight_decay = 1e-3f;
    memset(&sd, 0, sizeof sd);
    sd.kind = DT_SCHED_MULTISTEP; sd.base_lr = 0.05f; sd.milestones[0] = 4; sd.milestones[1] = 8; sd.gamma = 0.5f;
    memset(&t, 0, sizeof t);
    t.crop_pad = 1; t.flip = 1;
    for (i = me; i < RS_N; i += p) ids[nids++] = i;   /* rank r's samples: r, r + p, ... */
    memset(&ld, 0, sizeof ld);
    ld.dataset = &ds; ld.indices = ids; ld.count = nids; ld.batch = RS_BATCH; ld.shuffle = 1; ld.transform = &t;
    ld.seed = 5; ld.rank = (uint64_t)me; ld.prefetch = 1;
    if ((r = dt_optim_create(&o, m, &od)) != DT_OK || (r = dt_loader_create(&l, &ld)) != DT_OK) goto done;
    if (kind == 1) r = dt_ddp_create((dt_ddp **)&trainer, c, m, NULL);
    if (kind == 2) {
        dt_localsgd_desc lsd;
        memset(&lsd, 0, sizeof lsd);
        lsd.period = 4; lsd.sync_buffers = 1;   /* not a divisor of --every: checkpoints fall between averages */
        r = dt_localsgd_create((dt_localsgd **)&trainer, c, m, &lsd);
    }
    if (kind == 3) {
        dt_topology_desc td;
        dt_dpsgd_desc dd;
        memset(&td, 0, sizeof td);
        memset(&dd, 0, sizeof dd);
        td.kind = DT_TOPO_RING; td.world = p; td.mixing = DT_MIXING_METROPOLIS;
        dd.mix_buffers = 1;
        if (!strcmp(a->trainer, "sgp")) {   /* push-sum (SGP's order) on i -> i + 1 and 0 -> 2 */
            uint8_t adj[64 * 64];
            int q;
            if (p > 64) return dt_set_error(DT_ERR_INVALID_ARG, "sgp on %d ranks: at most 64", p);
            memset(adj, 0, sizeof adj);
            for (q = 0; q < p; q++) adj[q * p + (q + 1) % p] = 1;
            if (p > 2) adj[0 * p + 2] = 1;
            td.kind = DT_TOPO_CUSTOM; td.adjacency = adj; td.directed = 1; td.mixing = DT_MIXING_UNIFORM;
            dd.push_sum = 1; dd.order = DT_DPSGD_ADAPT_THEN_COMBINE;
            if ((r = dt_topology_create(&topo, &td)) == DT_OK) r = dt_dpsgd_create((dt_dpsgd **)&trainer, c, m, &topo, &dd);
        } else if (strcmp(a->trainer, "dpsgd")) {   /* dpsgd-exp: step t's graph is sched.graphs[t mod period] */
            dd.schedule = dt_topology_schedule_at; dd.schedule_user = &sched;
            if ((r = dt_topology_one_peer_exp(&sched, p)) == DT_OK) dd.period = sched.period;
            if (r == DT_OK) r = dt_dpsgd_create((dt_dpsgd **)&trainer, c, m, NULL, &dd);
        } else if ((r = dt_topology_create(&topo, &td)) == DT_OK) r = dt_dpsgd_create((dt_dpsgd **)&trainer, c, m, &topo, &dd);
    }
    if (r != DT_OK || (r = rs_resume(c, a, kind, trainer, m, o, &meta, &from)) != DT_OK) goto done;
    if (a->resume && from != a->expect_from) {
        r = dt_set_error(DT_ERR_STATE, "rank %d resumed from step %lld, expected %d", me, (long long)from, a->expect_from);
        goto done;
    }
    if ((r = dt_loader_seek(l, meta.epoch, meta.batch)) != DT_OK) goto done;
    while (meta.step < a->steps && r == DT_OK) {
        const float *x;
        const int32_t *y;
        int64_t n;
        float loss = 0.0f, lr;
        if ((r = dt_loader_next(l, &x, &y, &n)) != DT_OK) break;
        if (n == 0) {   /* the epoch's end */
            meta.epoch++;
            meta.batch = 0;
            r = dt_loader_start_epoch(l, meta.epoch);
            continue;
        }
        lr = dt_sched_lr(&sd, meta.step) * (0.75f + 0.5f * dt_rng_uniform(&meta.rng));
        if ((r = rs_step(kind, trainer, m, o, x, y, n, lr, &loss)) != DT_OK) break;
        meta.values[0] += loss;
        meta.batch++;
        meta.step++;
        r = rs_after(c, a, kind, trainer, m, o, &meta, meta.step);
    }
    if (r == DT_OK) r = rs_write(c, a, m, meta.values[0]);
done:
    if (kind == 1) dt_ddp_destroy((dt_ddp *)trainer);
    if (kind == 2) dt_localsgd_destroy((dt_localsgd *)trainer);
    if (kind == 3) dt_dpsgd_destroy((dt_dpsgd *)trainer);
    dt_topology_free(&topo);
    dt_topology_schedule_free(&sched);
    dt_loader_destroy(l);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

/* The child's flags: --trainer T --ranks N --steps S --every E --ckpt PATH --out PATH [--kill-at K]
   [--resume --expect-from S]. Returns 0 on success, 1 on failure, 2 for bad flags. */
static int rs_main(int argc, char **argv) {
    rs_args a;
    dt_launch_desc ld;
    int i;
    memset(&a, 0, sizeof a);
    a.trainer = "ddp"; a.ranks = 1; a.steps = 10; a.every = 3;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--resume")) { a.resume = 1; continue; }
        if (!v) { fprintf(stderr, "%s needs a value\n", f); return 2; }
        i++;
        if (!strcmp(f, "--trainer")) a.trainer = v;
        else if (!strcmp(f, "--ranks")) a.ranks = atoi(v);
        else if (!strcmp(f, "--steps")) a.steps = atoi(v);
        else if (!strcmp(f, "--every")) a.every = atoi(v);
        else if (!strcmp(f, "--kill-at")) a.kill_at = atoi(v);
        else if (!strcmp(f, "--expect-from")) a.expect_from = atoi(v);
        else if (!strcmp(f, "--ckpt")) a.ckpt = v;
        else if (!strcmp(f, "--out")) a.out = v;
        else { fprintf(stderr, "unknown flag %s\n", f); return 2; }
    }
    if (!a.ckpt || !a.out || rs_kind(a.trainer) < 0 || a.every < 1) {
        fprintf(stderr, "--ckpt, --out and --trainer single|ddp|localsgd|dpsgd|dpsgd-exp|sgp|fedavg are needed, --every >= 1\n");
        return 2;
    }
    rs_fill();
    memset(&ld, 0, sizeof ld);
    ld.ranks = a.ranks;
    ld.threads_per_rank = 1;
    ld.comm.timeout = 60;
    return dt_launch(&ld, rs_rank, &a) == DT_OK ? 0 : 1;
}

#endif
