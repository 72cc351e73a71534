/* dpsgd.c - decentralised parallel SGD (D-PSGD): no all-reduce and no server; every rank trains its own
   replica on its shard and, every step, averages it with its neighbours' on a ring (or another topology)
   through the mixing matrix W. The replicas drift apart a little (the consensus distance) and their
   average is the model: it is evaluated each epoch and at the end, as the original workload does.
   --topology one-peer-exp changes the graph every step: at step t each rank averages with the one peer
   i xor 2^(t mod log2 p), weights 1/2 (dt_topology_one_peer_exp), so it sends one replica a step where the
   ring sends two, and with p a power of two the replicas reach their mean exactly every log2 p steps.
   --push-sum gossips by push-sum (SGP, Assran et al. 2019: each rank mixes a numerator x and a weight w and
   trains and evaluates x / w), which the directed graphs need: --topology directed-ring (i -> i + 1),
   directed-exponential (i -> i + 2^k) and directed-one-peer-exp (at step t, i -> i + 2^(t mod log2 p)), each
   rank keeping 1 / (outdeg + 1) of its mass and sending as much along each edge. Plain D-PSGD refuses them.

   usage: dpsgd [--ranks 4] [--model resnet20] [--dataset fashion-mnist|mnist|cifar10] [--data DIR]
                [--topology ring|torus|exponential|full|one-peer-exp|directed-ring|directed-exponential|directed-one-peer-exp]
                [--push-sum] [--mixing uniform|metropolis] [--order cta|atc] [--epochs 1] [--batch 32] [--optim sgd] [--lr 0.1]
                [--momentum 0.9] [--nesterov] [--wd 1e-4] [--milestones 50,75] [--cosine] [--min-lr 0] [--warmup 0]
                [--seed 0] [--precision fp32] [--limit N] [--test-limit N] [--pad-to 32] [--csv PATH] [--checkpoint PATH] [--checkpoint-every N] [--resume]
                (and the launcher's flags: --timeout, --link-latency, --link-bandwidth RATE, ...)
   e.g.   ./build/examples/dpsgd --ranks 4 --limit 2000                        (Fashion-MNIST padded to 32x32)
          ./build/examples/dpsgd --ranks 4 --dataset cifar10 --data cifar-10-batches-bin --epochs 100 --milestones 50,75
          ./build/examples/dpsgd --ranks 8 --link-latency 0.001 --link-bandwidth 100Mbit
          ./build/examples/dpsgd --ranks 8 --topology directed-one-peer-exp --push-sum --order atc --limit 2000

   --dataset and --data mean what they mean in every example: by default Fashion-MNIST from its default
   directory, zero-padded to 32x32 as ResNet-20 expects (--pad-to 0 keeps its 28x28, the input of SimpleCNN
   as ddp.c trains it, for comparisons with DDP); --dataset cifar10 --data DIR (CIFAR-10's
   cifar-10-batches-bin) trains on CIFAR-10 with random crops and flips.
   --batch is per rank; every rank takes a disjoint share of a seeded permutation each epoch. The optimizer
   and schedule flags are every example's (examples/common.h): the learning rate is multiplied by 0.1 at
   each epoch of --milestones. --limit N keeps the first N samples of the training and of the test set.
   Rank 0 logs the epochs and writes the CSV. --checkpoint PATH saves every rank's replica (they differ) and
   optimizer in one file (dt_dpsgd_save) at the end of every epoch, or every N steps with --checkpoint-every N,
   and at the end (before the final average); --resume continues from it and ends with the parameters and
   CSV rows (appended) of a run that was never stopped. A fresh run refuses a PATH that exists; a model with
   NaN is never saved over the last good checkpoint. */
#define _POSIX_C_SOURCE 200809L   /* isatty, fileno */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#define EX_PROG "dpsgd"
#include "common.h"

typedef struct args {
    const char *model, *csv;
    long epochs, batch;
    ex_recipe recipe;   /* --optim, --lr, --momentum, --wd, the schedule */
    dt_topology_desc topo;
    int topology;   /* --topology: its index in TOPOLOGIES */
    int one_peer;   /* --topology one-peer-exp (1) or directed-one-peer-exp (2): a schedule of graphs in place of topo */
    dt_dpsgd_desc dpsgd;
    ex_ckpt ckpt;   /* --checkpoint, --checkpoint-every, --resume */
    ex_data data;   /* --dataset, --data, --limit, --seed and the sets main loads */
} args;

/* --topology's values; the directed ones (from DIRECTED on) need --push-sum */
static const char *const TOPOLOGIES[] = {"ring", "torus", "exponential", "full", "one-peer-exp",
                                         "directed-ring", "directed-exponential", "directed-one-peer-exp"};
#define DIRECTED 5

static void usage(FILE *f) {
    fprintf(f, "usage: dpsgd [--ranks N] [--model NAME] [--dataset fashion-mnist|mnist|cifar10] [--data DIR]\n"
               "             [--topology ring|torus|exponential|full|one-peer-exp|directed-ring|directed-exponential|\n"
               "                         directed-one-peer-exp] [--push-sum] [--mixing uniform|metropolis] [--order cta|atc]\n"
               "             [--epochs N] [--batch N]\n"
               "             [--seed N] [--precision fp32|bf16] [--limit N] [--test-limit N] [--pad-to S] [--csv PATH]\n");
    ex_recipe_usage(f, 13, 0);
    fprintf(f, "             [--timeout S] [--link-latency S] [--link-bandwidth RATE]\n");
    ex_ckpt_usage(f, 13);
}

static int parse_args(int argc, char **argv, void *arg) {
    args *a = (args *)arg;
    int i, k;
    a->model = "resnet20"; a->data.dataset = "fashion-mnist"; a->data.pad_to = 32;
    a->epochs = 1; a->batch = 32; a->recipe.lr = 0.1; a->recipe.momentum = 0.9; a->recipe.wd = 1e-4;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); exit(0); }
        if ((k = ex_recipe_flag(f, v, &a->recipe, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if ((k = ex_ckpt_flag(f, v, &a->ckpt, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if (!strcmp(f, "--push-sum")) { a->dpsgd.push_sum = 1; continue; }
        if (!v) { fprintf(stderr, "dpsgd: %s needs a value\n", f); return -1; }
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--csv")) a->csv = v;
        else if (!strcmp(f, "--topology")) {
            static const dt_topology_kind kinds[] = {DT_TOPO_RING, DT_TOPO_TORUS, DT_TOPO_EXPONENTIAL, DT_TOPO_FULL, DT_TOPO_RING,
                                                     DT_TOPO_RING, DT_TOPO_EXPONENTIAL, DT_TOPO_RING};
            for (k = 0; k < EX_COUNT(TOPOLOGIES) && strcmp(v, TOPOLOGIES[k]); k++) {}
            if (k == EX_COUNT(TOPOLOGIES)) {
                fprintf(stderr, "dpsgd: unknown --topology '%s': ring, torus, exponential, full or one-peer-exp; with --push-sum "
                                "also directed-ring, directed-exponential or directed-one-peer-exp\n", v);
                return -1;
            }
            a->topology = k;
            a->topo.kind = kinds[k];
            a->topo.directed = k >= DIRECTED;
            a->one_peer = !strcmp(v, "one-peer-exp") ? 1 : !strcmp(v, "directed-one-peer-exp") ? 2 : 0;
        }
        else if (!strcmp(f, "--mixing")) {
            if (strcmp(v, "uniform") && strcmp(v, "metropolis")) { fprintf(stderr, "dpsgd: --mixing is uniform or metropolis\n"); return -1; }
            a->topo.mixing = !strcmp(v, "metropolis") ? DT_MIXING_METROPOLIS : DT_MIXING_UNIFORM;
        }
        else if (!strcmp(f, "--order")) {
            if (dt_dpsgd_order_parse(v, &a->dpsgd.order) != DT_OK) { fprintf(stderr, "dpsgd: %s\n", dt_last_error()); return -1; }
        }
        else if (!ex_flag(f, v, &a->data, &a->epochs, &a->batch, &bad)) {   /* not one of the common flags */
            fprintf(stderr, "dpsgd: unknown flag '%s'\n", f); usage(stderr); return -1;
        }
        if (bad) return -1;
        i++;
    }
    if (dt_zoo_parse(a->model, NULL) != DT_OK) { fprintf(stderr, "dpsgd: %s\n", dt_last_error()); return -1; }
    if (!strcmp(a->data.dataset, "folder")) { fprintf(stderr, "dpsgd: --dataset folder is train's; use fashion-mnist, mnist or cifar10\n"); return -1; }
    if (a->topo.directed && !a->dpsgd.push_sum) {   /* the library refuses it too; said here before any data is read */
        fprintf(stderr, "dpsgd: --topology %s is directed (its mixing matrix is not symmetric), which plain D-PSGD cannot "
                        "average over: add --push-sum\n", TOPOLOGIES[a->topology]);
        return -1;
    }
    if (a->topo.directed && a->topo.mixing == DT_MIXING_METROPOLIS) {
        fprintf(stderr, "dpsgd: --mixing metropolis needs an undirected --topology; a directed one takes push weights\n");
        return -1;
    }
    return ex_recipe_check(&a->recipe, a->epochs, "epochs") || ex_ckpt_check(&a->ckpt) || (a->csv && ex_out_check("--csv", a->csv)) ? -1 : 0;
}

/* --topology's value in words, as the checkpoint records it: its index in TOPOLOGIES, + 8 with --push-sum
   (push-sum's state, its numerators and weights, is another checkpoint's). */
static const char *topology_name(long k) {
    static const char *const push[] = {"ring --push-sum", "torus --push-sum", "exponential --push-sum", "full --push-sum",
                                       "one-peer-exp --push-sum", "directed-ring --push-sum", "directed-exponential --push-sum",
                                       "directed-one-peer-exp --push-sum"};
    return k >= 0 && k < 8 ? TOPOLOGIES[k] : k >= 8 && k < 16 ? push[k - 8] : "unknown";
}

/* After loading: --limit applied to the test set too, unless --test-limit says otherwise; the batch fits the data
   set; what a checkpoint to resume must agree with. */
static int prepare(void *arg) {
    args *a = (args *)arg;
    if (a->data.limit && !a->data.test_limit && a->data.limit < a->data.test.count) a->data.test.count = a->data.limit;
    ex_ckpt_keep(&a->ckpt, "--topology", a->topology + 8L * a->dpsgd.push_sum, topology_name);
    return ex_ckpt_prepare(&a->ckpt, &a->data, a->batch, a->epochs, "epoch", " (each rank's batch)");
}

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

/* What rank 0 reports after each epoch, in the log and in the CSV file. */
static const ex_col COLS[] = {EX_COL_TIME, {"lr", "%.6g", "lr %.4g", 1}, EX_COL_TRAIN_LOSS,
                              {"test_loss", "%.6f", "averaged model: test loss %.4f", 1}, EX_COL_TEST_ACC,
                              {"consensus", "%.6g", "consensus %.4g", 1}, EX_COL_BUSIEST_MB};

/* One rank: its replica, optimizer, loader and D-PSGD; the loop is the one-process loop of train.c with
   dt_dpsgd_step in place of dt_optim_step. */
static dt_result rank_main(dt_comm *c, void *arg) {
    args *a = (args *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c), tty = me == 0 && isatty(fileno(stderr));
    dt_sampler_desc share = ex_sampler(&a->data, me, p);   /* this rank's share of each epoch */
    int64_t nshare = dt_sampler_size(&share), *ids = NULL, epoch;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_dpsgd *d = NULL;
    dt_loader *loader = NULL;
    dt_topology topo;
    dt_topology_schedule sched;   /* --topology one-peer-exp */
    dt_topology_desc td = a->topo;
    dt_dpsgd_desc dd = a->dpsgd;
    dt_optim_desc od;
    dt_sched_desc sd;
    dt_loader_desc ld;
    dt_eval_result ev;
    dt_checkpoint_meta meta;   /* epoch, batch, step reached; values: the epoch's loss sum, samples, MB, -, seconds */
    FILE *csv = NULL;
    char recipe[256], graph[160];
    dt_result r = DT_OK;

    memset(&topo, 0, sizeof topo);
    memset(&sched, 0, sizeof sched);
    td.world = p;
    if (a->one_peer) {   /* step t mixes over sched.graphs[t mod period] */
        TRY(a->one_peer == 2 ? dt_topology_one_peer_exp_directed(&sched, p) : dt_topology_one_peer_exp(&sched, p));
        dd.schedule = dt_topology_schedule_at; dd.schedule_user = &sched; dd.period = sched.period;
    } else TRY(dt_topology_create(&topo, &td));
    TRY(ex_model_create(&m, a->model, &a->data, (uint64_t)me));
    ex_recipe_optim(&a->recipe, &od);
    ex_recipe_sched(&a->recipe, a->epochs, &sd);
    TRY(dt_optim_create(&o, m, &od));
    TRY(dt_dpsgd_create(&d, c, m, a->one_peer ? NULL : &topo, &dd));   /* rank 0's initial weights everywhere */
    if (!(ids = (int64_t *)malloc(sizeof(int64_t) * (size_t)nshare))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "rank %d: no memory", me); goto done; }
    TRY(dt_sampler_indices(&share, ids, &nshare));
    memset(&ld, 0, sizeof ld);
    ld.dataset = &a->data.train; ld.indices = ids; ld.count = nshare; ld.batch = a->batch;
    ld.transform = &a->data.tt; ld.seed = (uint64_t)a->data.seed; ld.rank = (uint64_t)me; ld.prefetch = 1;
    TRY(dt_loader_create(&loader, &ld));
    memset(&meta, 0, sizeof meta);
    if (a->ckpt.resume) TRY(ex_ckpt_load(&a->ckpt, c, EX_DPSGD, d, m, o, &meta, NULL));
    if (me == 0) {
        if (a->ckpt.resume) ex_ckpt_resumed(&a->ckpt, &meta, "epoch");
        if (a->ckpt.resume) TRY(ex_csv_keep(a->csv, meta.epoch));   /* the rows the checkpoint covers */
        TRY(ex_report_open(&csv, a->csv, COLS, EX_COUNT(COLS), a->ckpt.resume));
        if (a->one_peer == 2)   /* a shift: every rank has its peer; the exact mean needs p a power of two */
            snprintf(graph, sizeof graph, "directed-one-peer-exp topology (one peer a step, i -> i + 2^(t mod %d), half kept; %s)",
                     sched.period, (p & (p - 1)) ? "not a power of two: a period's mixing never averages exactly"
                                                 : "a period's mixing averages exactly");
        else if (td.directed)
            snprintf(graph, sizeof graph, "%s topology (push weights 1/(outdeg+1))", TOPOLOGIES[a->topology]);
        else if (!a->one_peer)
            snprintf(graph, sizeof graph, "%s topology (%s mixing, spectral gap %.4f)", dt_topology_name(td.kind),
                     td.mixing == DT_MIXING_METROPOLIS ? "metropolis" : "uniform", topo.spectral_gap);
        else   /* a rank without a partner i xor 2^k sits that step out: no exact mean then */
            snprintf(graph, sizeof graph, "one-peer-exp topology (one peer a step, i xor 2^(t mod %d), weights 1/2; %s)",
                     sched.period, (p & (p - 1)) ? "not a power of two: a period's mixing never averages exactly"
                                                 : "a period's mixing averages exactly");
        printf("%s on %s: %lld training and %lld test samples, %lld parameters (%s), %s, "
               "batch %ld per rank, seed %ld\nD-PSGD (%s%s) on %d ranks, %s, %s backend\n",
               a->model, a->data.name, (long long)a->data.ntrain, (long long)a->data.test.count, (long long)dt_model_param_count(m),
               dt_precision_name(a->data.precision), ex_recipe_str(&a->recipe, a->epochs, "epochs", recipe, sizeof recipe), a->batch, a->data.seed,
               dt_dpsgd_order_name(a->dpsgd.order), a->dpsgd.push_sum ? ", push-sum" : "", p, graph, dt_comm_backend_name(c));
        TRY(ex_log_flush());
    }

    for (epoch = meta.epoch; epoch < a->epochs && r == DT_OK; epoch++) {
        const float *x = NULL;
        const int32_t *y = NULL;
        int64_t n = 0;
        double t0 = dt_time_now() - meta.values[4], *sums = meta.values, secs, mb, dist;   /* sums: loss x samples, samples */
        float loss = 0.0f, lr = dt_sched_lr(&sd, epoch);
        uint64_t sent0 = dt_dpsgd_get_stats(d).bytes_sent - (uint64_t)meta.values[2];   /* gossip only: no checkpoint's */
        dt_result e;
        dt_progress bar;
        dt_result got;   /* the loader: DT_OK with n = 0 at the end of the epoch */
        TRY(dt_optim_set_lr(o, lr));
        dt_model_set_mode(m, DT_MODE_TRAIN);
        share.epoch = epoch;
        TRY(dt_sampler_indices(&share, ids, &nshare));   /* this epoch's share */
        TRY(dt_loader_set_indices(loader, ids, nshare));
        TRY(dt_loader_seek(loader, epoch, meta.batch));   /* batch 0, or where a resumed epoch stopped */
        dt_progress_begin(&bar, stderr, dt_loader_batches(loader), tty);
        /* every rank has the same number of batches (the sampler pads), so the gossip steps pair up */
        while ((got = dt_loader_next(loader, &x, &y, &n)) == DT_OK && n > 0) {
            TRY(dt_model_forward(m, x, n));
            TRY(ex_at(dt_model_loss_labels(m, y, &loss), epoch + 1, meta.batch + 1));   /* a NaN loss says when */
            TRY(dt_model_backward(m, NULL));
            TRY(dt_dpsgd_step(d, o));        /* the local update and the average with the neighbours */
            dt_model_zero_grad(m);
            sums[0] += (double)loss * (double)n;
            sums[1] += (double)n;
            dt_progress_update(&bar, ++meta.batch, "loss %.4f", (double)loss);
            if (ex_ckpt_due(&a->ckpt, ++meta.step, 0, 0)) {
                meta.values[2] = (double)(dt_dpsgd_get_stats(d).bytes_sent - sent0);
                meta.values[4] = dt_time_now() - t0;   /* the epoch's seconds so far, for its time */
                TRY(ex_ckpt_save(&a->ckpt, c, EX_DPSGD, d, m, o, &meta, NULL));
            }
        }
        TRY(got);                          /* the error that stopped the loader, if one did */
        dt_progress_end(&bar);
        secs = dt_time_now() - t0;
        mb = (double)(dt_dpsgd_get_stats(d).bytes_sent - sent0) / 1e6;   /* this rank's gossip traffic */
        TRY(dt_dpsgd_consensus(d, &dist));
        TRY(dt_dpsgd_use_average(d, 1));     /* the average of the replicas, evaluated by all */
        e = ex_epoch_end(c, sums, &mb, m, &a->data, 1, &ev);   /* and the mean loss over every sample */
        TRY(dt_dpsgd_use_average(d, 0));     /* each rank's own replica again */
        TRY(e);
        if (me == 0) {
            double v[] = {secs, (double)lr, sums[0] / sums[1], ev.loss, ev.top1, dist, mb};   /* COLS' order */
            TRY(ex_report(csv, a->csv, epoch + 1, a->epochs, COLS, v, EX_COUNT(COLS)));
        }
        TRY(ex_stop_if_diverged(c, epoch + 1, sums[0] / sums[1], &ev, a->data.test.num_classes));   /* before the epoch's checkpoint */
        ex_ckpt_next_epoch(&meta, epoch + 1);
        if (ex_ckpt_due(&a->ckpt, meta.step, 1, epoch + 1 == a->epochs)) TRY(ex_ckpt_save(&a->ckpt, c, EX_DPSGD, d, m, o, &meta, NULL));
    }
    /* the end: every replica becomes the average, which is the trained model */
    TRY(dt_dpsgd_average(d, NULL));
    if (me == 0) {
        TRY(ex_test(m, &a->data, 1, &ev));
        printf("average of the %d replicas: test loss %.4f  test acc %.2f%%\n", p, ev.loss, 100.0 * ev.top1);
    }
done:
    if (csv) fclose(csv);
    dt_loader_destroy(loader);
    dt_dpsgd_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_topology_free(&topo);
    dt_topology_schedule_free(&sched);
    free(ids);
    return r;
}

static const ex_example EXAMPLE = {usage, parse_args, prepare, rank_main};

int main(int argc, char **argv) {
    static args a;   /* zeroed; parse_args sets the defaults */
    return ex_main(argc, argv, &EXAMPLE, &a, &a.data);
}
