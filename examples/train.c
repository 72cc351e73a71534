/* train.c - trains a zoo model in one process: the loop every distributed trainer builds on.

   usage: train [--model simplecnn] [--dataset fashion-mnist|mnist|cifar10|folder] [--data DIR] [--pad-to 0]
                [--epochs 3] [--batch 128] [--optim sgd|adam|adamw] [--lr 0.01] [--momentum 0.5] [--nesterov]
                [--wd 0] [--milestones 80,120] [--cosine] [--min-lr 0] [--warmup 0]
                [--seed 0] [--precision fp32] [--limit N] [--test-limit N] [--size 32] [--csv PATH] [--checkpoint PATH] [--checkpoint-every N] [--resume]
   e.g.   ./build/examples/train --model simplecnn --epochs 3                    (Fashion-MNIST)
          ./build/examples/train --model resnet20 --dataset cifar10 --data ~/cifar-10-batches-bin \
                                 --lr 0.1 --momentum 0.9 --wd 5e-4 --milestones 80,120 --epochs 160

   Each epoch: shuffle (seeded by seed and epoch), forward, loss, backward, optimizer step per batch;
   then the test set in eval mode. The optimizer and schedule flags are every example's (examples/common.h):
   --milestones for the step schedule, --cosine for the cosine one; the schedule steps once per epoch. One
   log line per epoch; the same figures go to the CSV file. With --checkpoint PATH the whole state (model,
   optimizer, the epoch and batch reached, the epoch's loss so far) is saved to PATH at the end of every epoch,
   or every N steps with --checkpoint-every N, and at the end; --resume continues from PATH and ends with the
   same parameters, bit for bit, and the same CSV rows (appended) as a run that was never stopped. A fresh
   run refuses a PATH that exists, and a model with NaN is never saved over the last good checkpoint; a resume
   with another --batch or --limit is refused. --batch is at most the training set's samples. A --csv or
   --checkpoint PATH that cannot be written is refused before training; a CSV row or log line whose write fails
   (a full disk) stops the run at once, naming the file. */
#define _POSIX_C_SOURCE 200809L   /* isatty, fileno */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#define EX_PROG "train"
#include "common.h"

#define TRY(call) do { dt_result r_ = (call); if (r_ != DT_OK) { \
    fprintf(stderr, "train: %s\n", dt_last_error()); goto fail; } } while (0)

/* What main reports after each epoch, in the log and in the CSV file. */
static const ex_col COLS[] = {EX_COL_TIME, {"lr", "%.6g", "lr %.5f", 1}, EX_COL_TRAIN_LOSS, EX_COL_TEST_LOSS, EX_COL_TEST_ACC,
                              EX_COL_TOP5, EX_COL_IMG_PER_S};

typedef struct args {
    const char *model, *csv;
    long epochs, batch, size;
    ex_recipe recipe;   /* --optim, --lr, --momentum, --wd, the schedule */
    ex_data data;   /* --dataset, --data, --limit, --seed and the sets main loads */
    ex_ckpt ckpt;   /* --checkpoint, --checkpoint-every, --resume */
} args;

static void usage(FILE *f) {
    fprintf(f, "usage: train [--model NAME] [--dataset fashion-mnist|mnist|cifar10|folder] [--data DIR] [--pad-to S]\n"
               "             [--epochs N] [--batch N]\n");
    ex_recipe_usage(f, 13, 0);
    fprintf(f, "             [--seed N] [--precision fp32|bf16] [--limit N] [--test-limit N] [--size N] [--csv PATH]\n");
    ex_ckpt_usage(f, 13);
}

static int parse_args(int argc, char **argv, args *a) {
    int i, k;
    memset(a, 0, sizeof *a);
    a->model = "simplecnn"; a->data.dataset = "fashion-mnist";
    a->epochs = 3; a->batch = 128; a->size = 32; a->recipe.lr = 0.01; a->recipe.momentum = 0.5;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); exit(0); }
        if ((k = ex_recipe_flag(f, v, &a->recipe, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if ((k = ex_ckpt_flag(f, v, &a->ckpt, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if (!strcmp(f, "--sched")) {   /* the spelling before the examples shared their flags */
            fprintf(stderr, "train: --sched is no longer a flag: --milestones A,B,... gives the step schedule, --cosine the "
                            "cosine one, and neither a constant rate\n");
            return -1;
        }
        if (!v) { fprintf(stderr, "train: %s needs a value\n", f); return -1; }
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--csv")) a->csv = v;
        else if (!strcmp(f, "--size")) bad = parse_long(f, v, 1, &a->size);
        else if (!ex_flag(f, v, &a->data, &a->epochs, &a->batch, &bad)) {   /* not one of the common flags */
            fprintf(stderr, "train: unknown flag '%s'\n", f); usage(stderr); return -1;
        }
        if (bad) return -1;
        i++;
    }
    if (dt_zoo_parse(a->model, NULL) != DT_OK) { fprintf(stderr, "train: %s\n", dt_last_error()); return -1; }
    if (ex_ckpt_check(&a->ckpt) || (a->csv && ex_out_check("--csv", a->csv))) return -1;
    return ex_recipe_check(&a->recipe, a->epochs, "epochs");
}

int main(int argc, char **argv) {
    args a;
    dt_partition split;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_loader *loader = NULL;
    dt_optim_desc od;
    dt_sched_desc sd;
    dt_loader_desc ld;
    dt_eval_desc ed;
    dt_checkpoint_meta meta;
    FILE *csv = NULL;
    const int64_t *train_idx = NULL, *test_idx = NULL;
    int64_t *limit_idx = NULL;
    int64_t ntrain, ntest, epoch;
    int rc = 1, tty = isatty(fileno(stderr));
    char recipe[256];

    memset(&split, 0, sizeof split);
    if (parse_args(argc, argv, &a)) return 2;
    if (ex_data_check(a.data.dataset, a.data.dir)) goto fail;
    if (load_data(a.data.dataset, a.data.dir, a.size, a.data.seed, &a.data.train, &a.data.test, &a.data.tt, &a.data.te, &split) != DT_OK) {
        fprintf(stderr, "train: %s\n", dt_last_error());
        ex_data_help(a.data.dataset, a.data.dir);   /* which files, and where to get them */
        goto fail;
    }
    if ((rc = ex_pad(&a.data)) != 0) goto fail;   /* --pad-to (2: images larger than it) */
    rc = 1;                                        /* the status of every failure below */
    ntrain = split.parts ? split.offsets[1] : a.data.train.count;
    ntest = split.parts ? split.offsets[2] - split.offsets[1] : a.data.test.count;
    if (a.data.test_limit && a.data.test_limit < ntest) ntest = a.data.test_limit;   /* --test-limit: the first N */
    if (!split.parts) a.data.test.count = ntest;
    if (split.parts) { train_idx = split.indices; test_idx = split.indices + split.offsets[1]; }
    memset(&ed, 0, sizeof ed);   /* the test set, or the folder's test part; top-1 and top-5 */
    ed.dataset = &a.data.test; ed.indices = test_idx; ed.count = test_idx ? ntest : 0; ed.transform = &a.data.te; ed.topk = 5;
    if (a.data.limit && a.data.limit < ntrain) {   /* the first --limit training samples (a quick run) */
        int64_t i;
        if (!(limit_idx = (int64_t *)malloc(sizeof(int64_t) * (size_t)a.data.limit))) { fprintf(stderr, "train: out of memory\n"); goto fail; }
        for (i = 0; i < a.data.limit; i++) limit_idx[i] = train_idx ? train_idx[i] : i;
        train_idx = limit_idx;
        ntrain = a.data.limit;
    }
    a.data.ntrain = ntrain;   /* the batch fits the data; what a checkpoint to resume must agree with */
    if ((rc = ex_ckpt_prepare(&a.ckpt, &a.data, a.batch, a.epochs, "epoch", "")) != 0) goto fail;
    rc = 1;

    TRY(ex_model_create(&m, a.model, &a.data, 0));
    ex_recipe_optim(&a.recipe, &od);
    TRY(dt_optim_create(&o, m, &od));
    ex_recipe_sched(&a.recipe, a.epochs, &sd);
    memset(&meta, 0, sizeof meta);   /* epoch, batch, step reached; values: the epoch's loss sum, samples, -, -, seconds */
    if (a.ckpt.resume) {
        TRY(ex_ckpt_load(&a.ckpt, NULL, EX_SINGLE, NULL, m, o, &meta, NULL));
        ex_ckpt_resumed(&a.ckpt, &meta, "epoch");
    }
    memset(&ld, 0, sizeof ld);
    ld.dataset = &a.data.train; ld.indices = train_idx; ld.count = train_idx ? ntrain : 0; ld.batch = a.batch; ld.shuffle = 1;
    ld.transform = &a.data.tt; ld.seed = (uint64_t)a.data.seed; ld.prefetch = 1;
    TRY(dt_loader_create(&loader, &ld));
    if (a.ckpt.resume) TRY(ex_csv_keep(a.csv, meta.epoch));   /* the rows the checkpoint covers; the run appends the rest */
    TRY(ex_report_open(&csv, a.csv, COLS, EX_COUNT(COLS), a.ckpt.resume));
    printf("%s on %s: %lld training and %lld test samples, %lld parameters (%s), %s, batch %ld, %d threads, seed %ld\n",
           a.model, a.data.name, (long long)ntrain, (long long)ntest, (long long)dt_model_param_count(m), dt_precision_name(a.data.precision),
           ex_recipe_str(&a.recipe, a.epochs, "epochs", recipe, sizeof recipe), a.batch, dt_cpu_threads(), a.data.seed);
    TRY(ex_log_flush());

    for (epoch = meta.epoch; epoch < a.epochs; epoch++) {
        const float *x = NULL;
        const int32_t *y = NULL;
        int64_t n = 0;
        double t0 = dt_time_now() - meta.values[4], secs, v[EX_COUNT(COLS)];
        float lr = dt_sched_lr(&sd, epoch), loss = 0.0f;
        dt_eval_result ev;
        dt_progress bar;
        dt_result got;   /* the loader: DT_OK with n = 0 at the end of the epoch */
        TRY(dt_optim_set_lr(o, lr));
        dt_model_set_mode(m, DT_MODE_TRAIN);
        TRY(dt_loader_seek(loader, epoch, meta.batch));   /* batch 0, or where a resumed epoch stopped */
        dt_progress_begin(&bar, stderr, dt_loader_batches(loader), tty);
        while ((got = dt_loader_next(loader, &x, &y, &n)) == DT_OK && n > 0) {
            TRY(dt_model_forward(m, x, n));
            TRY(ex_at(dt_model_loss_labels(m, y, &loss), epoch + 1, meta.batch + 1));   /* a NaN loss says when */
            dt_model_zero_grad(m);
            TRY(dt_model_backward(m, NULL));
            TRY(dt_optim_step(o));
            meta.values[0] += (double)loss * (double)n;   /* the epoch's loss sum and samples, kept by a checkpoint */
            meta.values[1] += (double)n;
            meta.batch++;
            dt_progress_update(&bar, meta.batch, "loss %.4f", (double)loss);
            if (ex_ckpt_due(&a.ckpt, ++meta.step, 0, 0)) {
                meta.values[4] = dt_time_now() - t0;   /* the epoch's seconds so far, for its time and img/s */
                TRY(ex_ckpt_save(&a.ckpt, NULL, EX_SINGLE, NULL, m, o, &meta, NULL));
            }
        }
        TRY(got);
        dt_progress_end(&bar);
        secs = dt_time_now() - t0;
        TRY(dt_evaluate(m, &ed, &ev));
        v[0] = secs; v[1] = (double)lr; v[2] = meta.values[0] / meta.values[1]; v[3] = ev.loss; v[4] = ev.top1; v[5] = ev.topk;
        v[6] = meta.values[1] / secs;
        TRY(ex_report(csv, a.csv, epoch + 1, a.epochs, COLS, v, EX_COUNT(COLS)));
        TRY(ex_stop_if_diverged(NULL, epoch + 1, meta.values[0] / meta.values[1], &ev, a.data.test.num_classes));   /* before the epoch's checkpoint */
        ex_ckpt_next_epoch(&meta, epoch + 1);
        if (ex_ckpt_due(&a.ckpt, meta.step, 1, epoch + 1 == a.epochs))
            TRY(ex_ckpt_save(&a.ckpt, NULL, EX_SINGLE, NULL, m, o, &meta, NULL));
    }
    rc = 0;
fail:
    if (csv) fclose(csv);
    dt_loader_destroy(loader);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    ex_free(&a.data);
    dt_partition_free(&split);
    free(limit_idx);
    return rc;
}
