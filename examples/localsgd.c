/* localsgd.c - local SGD (periodic model averaging), the synchronous parallel SGD workload: every rank
   trains its own replica on its own shard of the data with its own optimizer, and every K steps (and at
   the end of every epoch) the replicas' parameters are replaced by their mean. Between averages the ranks
   do not talk at all, so they send K times less than DDP; with --period 0 they average once per epoch.

   usage: localsgd [--ranks 4] [--model simplecnn] [--dataset fashion-mnist|mnist|cifar10] [--data DIR] [--pad-to 0]
                   [--epochs 1] [--batch 32] [--optim sgd] [--lr 0.01] [--momentum 0.5] [--nesterov] [--wd 0]
                   [--milestones A,B,...] [--cosine] [--min-lr 0] [--warmup 0] [--period 0] [--seed 0] [--precision fp32] [--limit N] [--test-limit N]
                   [--csv PATH] [--checkpoint PATH] [--checkpoint-every N] [--resume]
                   (and the launcher's flags: --algo, --timeout, --link-latency, ...)
   e.g.   ./build/examples/localsgd --ranks 4 --epochs 3                 (average once per epoch)
          ./build/examples/localsgd --ranks 4 --period 8 --limit 12000   (every 8 steps)

   --batch is each rank's batch: with p ranks a step consumes p x batch samples. The distributed sampler
   gives every rank a disjoint shard of a seeded permutation each epoch, and the same number of steps, so
   the ranks meet at every K-th step. Momentum stays on its rank (it is never averaged). The optimizer and
   schedule flags are every example's (examples/common.h); the schedule steps once per epoch. Rank 0
   evaluates the averaged model on the test set after each epoch and writes the CSV. --checkpoint PATH saves
   every rank's replica, optimizer and steps since the last average in one file (dt_localsgd_save) at the end
   of every epoch, or every N steps with --checkpoint-every N (between averages too), and at the end;
   --resume continues from it and ends with the parameters and CSV rows (appended) of a run that was never
   stopped. A fresh run refuses a PATH that exists; a model with NaN is never saved over a good checkpoint. */
#define _POSIX_C_SOURCE 200809L   /* isatty, fileno */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#define EX_PROG "localsgd"
#include "common.h"

typedef struct args {
    const char *model, *csv;
    long epochs, batch, period;
    ex_recipe recipe;   /* --optim, --lr, --momentum, --wd, the schedule */
    ex_ckpt ckpt;   /* --checkpoint, --checkpoint-every, --resume */
    ex_data data;   /* --dataset, --data, --limit, --seed and the sets main loads */
} args;

static void usage(FILE *f) {
    fprintf(f, "usage: localsgd [--ranks N] [--model NAME] [--dataset fashion-mnist|mnist|cifar10] [--data DIR] [--pad-to S]\n"
               "                [--epochs N] [--batch N] [--period K] [--seed N] [--precision fp32|bf16] [--limit N] [--test-limit N] [--csv PATH]\n");
    ex_recipe_usage(f, 16, 0);
    fprintf(f, "                [--algo naive|ring|tree|native|hier] [--timeout S] [--link-latency S] [--link-bandwidth RATE]\n");
    ex_ckpt_usage(f, 16);
}

static int parse_args(int argc, char **argv, void *arg) {
    args *a = (args *)arg;
    int i, k;
    a->model = "simplecnn"; a->data.dataset = "fashion-mnist";
    a->epochs = 1; a->batch = 32; a->recipe.lr = 0.01; a->recipe.momentum = 0.5;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); exit(0); }
        if ((k = ex_recipe_flag(f, v, &a->recipe, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if ((k = ex_ckpt_flag(f, v, &a->ckpt, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if (!v) { fprintf(stderr, "localsgd: %s needs a value\n", f); return -1; }
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--csv")) a->csv = v;
        else if (!strcmp(f, "--period")) bad = parse_long(f, v, 0, &a->period);
        else if (!ex_flag(f, v, &a->data, &a->epochs, &a->batch, &bad)) {   /* not one of the common flags */
            fprintf(stderr, "localsgd: unknown flag '%s'\n", f); usage(stderr); return -1;
        }
        if (bad) return -1;
        i++;
    }
    if (dt_zoo_parse(a->model, NULL) != DT_OK) { fprintf(stderr, "localsgd: %s\n", dt_last_error()); return -1; }
    if (!strcmp(a->data.dataset, "folder")) { fprintf(stderr, "localsgd: --dataset folder is train's; use fashion-mnist, mnist or cifar10\n"); return -1; }
    if (a->period > 1000000) { fprintf(stderr, "localsgd: --period %ld is too large\n", a->period); return -1; }
    return ex_recipe_check(&a->recipe, a->epochs, "epochs") || ex_ckpt_check(&a->ckpt) || (a->csv && ex_out_check("--csv", a->csv)) ? -1 : 0;
}

/* After loading: the batch fits the data set, and what a checkpoint to resume must agree with. */
static int prepare(void *arg) {
    args *a = (args *)arg;
    ex_ckpt_keep(&a->ckpt, "--period", a->period, NULL);
    return ex_ckpt_prepare(&a->ckpt, &a->data, a->batch, a->epochs, "epoch", "");
}

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

/* What rank 0 reports after each epoch, in the log and in the CSV file. */
static const ex_col COLS[] = {EX_COL_TIME, EX_COL_TRAIN_LOSS, EX_COL_TEST_LOSS, EX_COL_TEST_ACC, EX_COL_TOP5, EX_COL_IMG_PER_S,
                              {"comm_s", "%.3f", "comm %.2fs", 1}, {"averages", "%.0f", "%.0f averages", 1}, EX_COL_BUSIEST_MB};

/* One rank: the one-process loop of train.c on this rank's shard, with dt_localsgd_step after each
   optimizer step and dt_localsgd_average at the end of each epoch. */
static dt_result rank_main(dt_comm *c, void *arg) {
    args *a = (args *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c), tty = me == 0 && isatty(fileno(stderr));
    dt_sampler_desc shard = ex_sampler(&a->data, me, p);   /* this rank's shard of each epoch */
    int64_t nshare = dt_sampler_size(&shard), *ids = NULL, epoch;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_localsgd *d = NULL;
    dt_loader *loader = NULL;
    dt_optim_desc od;
    dt_sched_desc lr_sched;
    dt_loader_desc ld;
    dt_localsgd_desc sd;
    dt_checkpoint_meta meta;   /* epoch, batch, step reached; values: the epoch's loss sum, samples, MB, averages, seconds */
    uint64_t ck_sent = 0;      /* bytes the checkpoints sent, left out of the reported traffic */
    FILE *csv = NULL;
    char recipe[256];
    dt_result r = DT_OK;

    TRY(ex_model_create(&m, a->model, &a->data, (uint64_t)me));
    ex_recipe_optim(&a->recipe, &od);
    ex_recipe_sched(&a->recipe, a->epochs, &lr_sched);
    TRY(dt_optim_create(&o, m, &od));
    memset(&sd, 0, sizeof sd);
    sd.period = (int)a->period;
    sd.sync_buffers = 1;                          /* BatchNorm statistics too, if the model has any */
    TRY(dt_localsgd_create(&d, c, m, &sd));       /* rank 0's initial weights everywhere */
    if (!(ids = (int64_t *)malloc(sizeof(int64_t) * (size_t)nshare))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "rank %d: no memory", me); goto done; }
    TRY(dt_sampler_indices(&shard, ids, &nshare));
    memset(&ld, 0, sizeof ld);
    ld.dataset = &a->data.train; ld.indices = ids; ld.count = nshare; ld.batch = a->batch;
    ld.transform = &a->data.tt; ld.seed = (uint64_t)a->data.seed; ld.rank = (uint64_t)me; ld.prefetch = 1;
    TRY(dt_loader_create(&loader, &ld));
    memset(&meta, 0, sizeof meta);
    if (a->ckpt.resume) TRY(ex_ckpt_load(&a->ckpt, c, EX_LOCALSGD, d, m, o, &meta, &ck_sent));
    if (me == 0) {
        if (a->ckpt.resume) ex_ckpt_resumed(&a->ckpt, &meta, "epoch");
        if (a->ckpt.resume) TRY(ex_csv_keep(a->csv, meta.epoch));   /* the rows the checkpoint covers */
        TRY(ex_report_open(&csv, a->csv, COLS, EX_COUNT(COLS), a->ckpt.resume));
        printf("%s on %s: %lld training and %lld test samples, %lld parameters (%s), %s, %d ranks x batch %ld, seed %ld\n"
               "%s backend, local SGD: parameters averaged ", a->model, a->data.name, (long long)a->data.ntrain, (long long)a->data.test.count,
               (long long)dt_model_param_count(m), dt_precision_name(a->data.precision), ex_recipe_str(&a->recipe, a->epochs, "epochs", recipe, sizeof recipe), p, a->batch,
               a->data.seed, dt_comm_backend_name(c));
        if (a->period) printf("every %ld steps and ", a->period);
        printf("at the end of each epoch, %d threads per rank\n", dt_cpu_threads());
        TRY(ex_log_flush());
    }

    for (epoch = meta.epoch; epoch < a->epochs && r == DT_OK; epoch++) {
        const float *x = NULL;
        const int32_t *y = NULL;
        int64_t n = 0;
        double t0 = dt_time_now() - meta.values[4], *sums = meta.values, secs, mb;   /* sums: loss x samples, samples */
        float loss = 0.0f;
        dt_localsgd_stats st0 = dt_localsgd_get_stats(d), st;
        uint64_t sent0 = dt_comm_get_stats(c).bytes_sent - ck_sent - (uint64_t)meta.values[2];   /* the epoch's start */
        int64_t avg0 = st0.averages - (int64_t)meta.values[3];
        dt_eval_result ev;
        dt_progress bar;
        dt_result got;   /* the loader: DT_OK with n = 0 at the end of the epoch */
        TRY(dt_optim_set_lr(o, dt_sched_lr(&lr_sched, epoch)));
        dt_model_set_mode(m, DT_MODE_TRAIN);
        shard.epoch = epoch;
        TRY(dt_sampler_indices(&shard, ids, &nshare));   /* this epoch's shard */
        TRY(dt_loader_set_indices(loader, ids, nshare));
        TRY(dt_loader_seek(loader, epoch, meta.batch));   /* batch 0, or where a resumed epoch stopped */
        dt_progress_begin(&bar, stderr, dt_loader_batches(loader), tty);
        while ((got = dt_loader_next(loader, &x, &y, &n)) == DT_OK && n > 0) {
            TRY(dt_model_forward(m, x, n));
            TRY(ex_at(dt_model_loss_labels(m, y, &loss), epoch + 1, meta.batch + 1));   /* a NaN loss says when */
            dt_model_zero_grad(m);
            TRY(dt_model_backward(m, NULL));       /* this rank's gradient only: nothing is communicated */
            TRY(dt_optim_step(o));
            TRY(dt_localsgd_step(d));              /* every period-th step: the replicas are averaged */
            sums[0] += (double)loss * (double)n;
            sums[1] += (double)n;
            dt_progress_update(&bar, ++meta.batch, "loss %.4f", (double)loss);
            if (ex_ckpt_due(&a->ckpt, ++meta.step, 0, 0)) {
                meta.values[2] = (double)(dt_comm_get_stats(c).bytes_sent - ck_sent - sent0);
                meta.values[3] = (double)(dt_localsgd_get_stats(d).averages - avg0);
                meta.values[4] = dt_time_now() - t0;   /* the epoch's seconds so far, for its time */
                TRY(ex_ckpt_save(&a->ckpt, c, EX_LOCALSGD, d, m, o, &meta, &ck_sent));
            }
        }
        TRY(got);                          /* the error that stopped the loader, if one did */
        TRY(dt_localsgd_average(d));               /* the epoch ends with one model */
        dt_progress_end(&bar);
        secs = dt_time_now() - t0;
        mb = (double)(dt_comm_get_stats(c).bytes_sent - ck_sent - sent0) / 1e6;
        TRY(ex_epoch_end(c, sums, &mb, m, &a->data, 5, &ev));   /* the mean loss over every sample; the test set, shared */
        st = dt_localsgd_get_stats(d);
        if (me == 0) {
            double v[] = {secs, sums[0] / sums[1], ev.loss, ev.top1, ev.topk, sums[1] / secs, st.comm_seconds - st0.comm_seconds,
                          (double)(st.averages - avg0), mb};   /* COLS' order */
            TRY(ex_report(csv, a->csv, epoch + 1, a->epochs, COLS, v, EX_COUNT(COLS)));
        }
        TRY(ex_stop_if_diverged(c, epoch + 1, sums[0] / sums[1], &ev, a->data.test.num_classes));   /* before the epoch's checkpoint */
        ex_ckpt_next_epoch(&meta, epoch + 1);
        if (ex_ckpt_due(&a->ckpt, meta.step, 1, epoch + 1 == a->epochs))
            TRY(ex_ckpt_save(&a->ckpt, c, EX_LOCALSGD, d, m, o, &meta, &ck_sent));
    }
done:
    if (csv) fclose(csv);
    dt_loader_destroy(loader);
    dt_localsgd_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    free(ids);
    return r;
}

static const ex_example EXAMPLE = {usage, parse_args, prepare, rank_main};

int main(int argc, char **argv) {
    static args a;   /* zeroed; parse_args sets the defaults */
    return ex_main(argc, argv, &EXAMPLE, &a, &a.data);
}
