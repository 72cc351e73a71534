/* ddp.c - data-parallel SGD (DDP): every rank trains a replica of the model on its share of each global
   batch, and the gradients are averaged before every optimizer step, so the replicas stay equal and the
   run follows one process training with the global batch.

   usage: ddp [--ranks 4] [--model simplecnn] [--dataset fashion-mnist|mnist|cifar10] [--data DIR] [--pad-to 0]
              [--epochs 1] [--batch 128] [--optim sgd] [--lr 0.01] [--momentum 0.5] [--nesterov] [--wd 0]
              [--milestones A,B,...] [--cosine] [--min-lr 0] [--warmup 0] [--seed 0] [--precision fp32] [--limit N] [--test-limit N] [--accum 1]
              [--sync buckets|flat|per-layer|ps|p2p] [--algo naive|ring|tree|native|hier] [--bucket-kb 256]
              [--no-overlap] [--compress fp32|bf16|fp16|topk[:RATIO]|powersgd[:RANK]] [--no-feedback] [--sync-bn]
              [--powersgd-warmup 0] [--csv PATH] [--checkpoint PATH] [--checkpoint-every N] [--resume]
              (and the launcher's flags: --timeout, --link-latency, ...)
   e.g.   ./build/examples/ddp --ranks 4 --epochs 3
          ./build/examples/ddp --ranks 4 --sync ps --limit 6000              (the parameter server)
          ./build/examples/ddp --ranks 4 --model vgg11 --pad-to 32 --lr 0.05 --momentum 0.9 --wd 5e-4 \
                               --milestones 15,25 --epochs 30                 (VGG-11 on Fashion-MNIST at 32x32)
          ./build/examples/ddp --ranks 8 --sync flat --algo ring --link-latency 0.001 --link-bandwidth 100Mbit
          ./build/examples/ddp --ranks 4 --compress topk:0.01 --link-bandwidth 80Mbit  (1% of the gradient sent)
          mpiexec -n 4 ./build-mpi/examples/ddp --epochs 3                    (built with make MPI=1)

   --batch is the global batch: each of the p ranks takes batch / p samples of it (the distributed
   sampler gives every rank a disjoint share of a seeded permutation each epoch), so it must divide by p,
   and it is at most the training set's samples.
   With --accum k each rank splits its share into k micro-batches and communicates once per step. The
   optimizer and schedule flags are every example's (examples/common.h); the schedule steps once per epoch.
   Rank 0 logs each epoch (the test set is evaluated there) and writes the CSV. --checkpoint PATH saves every
   rank's state in one file (dt_ddp_save) at the end of every epoch, or every N optimizer steps with
   --checkpoint-every N, and at the end; --resume continues from it, also in the middle of an epoch, and ends
   with the parameters and CSV rows (appended) of a run that was never stopped. A fresh run refuses a PATH
   that exists; a model with NaN is never saved over the last good checkpoint. --compress sets what each
   rank sends of its gradient (dt_ddp_compress: bf16 or fp16 halves the bytes; topk:0.01 sends the largest 1%
   of each bucket as index-value pairs and keeps the rest for the next step, which --no-feedback drops;
   powersgd:2 sends each weight matrix as two rank-2 factors, with the same feedback, after --powersgd-warmup N
   syncs of the plain gradient, PyTorch's start_powerSGD_iter); the CSV's MB column counts what was sent. --sync-bn makes every batch norm normalise with the statistics of the whole global
   batch, summed over the ranks in forward and backward (dt_ddp_desc.sync_bn, PyTorch's SyncBatchNorm), not
   of the rank's share: with small shares this is what one process with the global batch would learn. */
#define _POSIX_C_SOURCE 200809L   /* isatty, fileno */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#define EX_PROG "ddp"
#include "common.h"

typedef struct args {
    const char *model, *csv;
    long epochs, batch, accum, bucket_kb;
    ex_recipe recipe;   /* --optim, --lr, --momentum, --wd, the schedule */
    dt_ddp_desc ddp;
    ex_data data;   /* --dataset, --data, --limit, --seed and the sets main loads */
    ex_ckpt ckpt;   /* --checkpoint, --checkpoint-every, --resume */
} args;

static void usage(FILE *f) {
    fprintf(f, "usage: ddp [--ranks N] [--model NAME] [--dataset fashion-mnist|mnist|cifar10] [--data DIR] [--pad-to S]\n"
               "           [--epochs N] [--batch N] [--seed N] [--precision fp32|bf16] [--limit N] [--test-limit N] [--accum K]\n");
    ex_recipe_usage(f, 11, 0);
    fprintf(f, "           [--sync buckets|flat|per-layer|ps|p2p] [--algo naive|ring|tree|native|hier] [--bucket-kb N]\n"
               "           [--no-overlap] [--compress fp32|bf16|fp16|topk[:RATIO]|powersgd[:RANK]] [--no-feedback] [--sync-bn]\n"
               "           [--powersgd-warmup N]\n"
               "           [--csv PATH] [--timeout S] [--link-latency S] [--link-bandwidth RATE]\n");
    ex_ckpt_usage(f, 11);
}

static int parse_args(int argc, char **argv, void *arg) {
    args *a = (args *)arg;
    int i, k;
    a->model = "simplecnn"; a->data.dataset = "fashion-mnist";
    a->epochs = 1; a->batch = 128; a->recipe.lr = 0.01; a->recipe.momentum = 0.5; a->accum = 1;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); exit(0); }
        if (!strcmp(f, "--no-overlap")) { a->ddp.no_overlap = 1; continue; }
        if (!strcmp(f, "--no-feedback")) { a->ddp.no_feedback = 1; continue; }
        if (!strcmp(f, "--sync-bn")) { a->ddp.sync_bn = 1; continue; }
        if ((k = ex_recipe_flag(f, v, &a->recipe, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if ((k = ex_ckpt_flag(f, v, &a->ckpt, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if (!v) { fprintf(stderr, "ddp: %s needs a value\n", f); return -1; }
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--csv")) a->csv = v;
        else if (!strcmp(f, "--sync")) {
            if (dt_ddp_method_parse(v, &a->ddp.method) != DT_OK) { fprintf(stderr, "ddp: %s\n", dt_last_error()); return -1; }
        }
        else if (!strcmp(f, "--compress")) {   /* topk:RATIO or powersgd:RANK */
            double x = 0.0;
            if (dt_ddp_compress_parse(v, &a->ddp.compress, &x) != DT_OK) { fprintf(stderr, "ddp: %s\n", dt_last_error()); return -1; }
            if (a->ddp.compress == DT_DDP_TOPK) a->ddp.topk_ratio = x; else a->ddp.powersgd_rank = (int)x;
        }
        else if (!strcmp(f, "--accum")) bad = parse_long(f, v, 1, &a->accum);
        else if (!strcmp(f, "--powersgd-warmup")) {
            long w = 0;
            if (!(bad = parse_long(f, v, 0, &w))) a->ddp.powersgd_warmup = w;
        }
        else if (!strcmp(f, "--bucket-kb")) {   /* at most 1 TiB, so that the bytes (x 1024) cannot overflow */
            if (!(bad = parse_long(f, v, 1, &a->bucket_kb)) && a->bucket_kb > (1L << 30)) {
                fprintf(stderr, "ddp: --bucket-kb %ld is more than 1 TiB (1073741824 KiB); a bucket larger than the model is "
                        "the whole gradient: give at most the model's size\n", a->bucket_kb);
                bad = 1;
            }
        }
        else if (!ex_flag(f, v, &a->data, &a->epochs, &a->batch, &bad)) {   /* not one of the common flags */
            fprintf(stderr, "ddp: unknown flag '%s'\n", f); usage(stderr); return -1;
        }
        if (bad) return -1;
        i++;
    }
    if (dt_zoo_parse(a->model, NULL) != DT_OK) { fprintf(stderr, "ddp: %s\n", dt_last_error()); return -1; }
    if (!strcmp(a->data.dataset, "folder")) { fprintf(stderr, "ddp: --dataset folder is train's; use fashion-mnist, mnist or cifar10\n"); return -1; }
    if (ex_recipe_check(&a->recipe, a->epochs, "epochs") || ex_ckpt_check(&a->ckpt) || (a->csv && ex_out_check("--csv", a->csv))) return -1;
    if (a->ddp.no_feedback && a->ddp.compress < DT_DDP_TOPK) { fprintf(stderr, "ddp: --no-feedback is top-k's and powersgd's\n"); return -1; }
    if (a->ddp.powersgd_warmup && a->ddp.compress != DT_DDP_POWERSGD) { fprintf(stderr, "ddp: --powersgd-warmup needs --compress powersgd\n"); return -1; }
    if (a->ddp.compress && a->ddp.method > DT_DDP_PER_LAYER) { fprintf(stderr, "ddp: --compress needs --sync buckets, flat or per-layer\n"); return -1; }
    a->ddp.bucket_bytes = (int64_t)a->bucket_kb * 1024;
    return 0;
}

/* After loading: the global batch fits the data set, and what a checkpoint to resume must agree with. */
static int prepare(void *arg) {
    args *a = (args *)arg;
    ex_ckpt_keep(&a->ckpt, "--accum", a->accum, NULL);
    return ex_ckpt_prepare(&a->ckpt, &a->data, a->batch, a->epochs, "epoch", " (the global batch, shared by the ranks)");
}

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

/* What rank 0 reports after each epoch, in the log and in the CSV file. */
static const ex_col COLS[] = {EX_COL_TIME, EX_COL_TRAIN_LOSS, EX_COL_TEST_LOSS, EX_COL_TEST_ACC, EX_COL_TOP5, EX_COL_IMG_PER_S,
                              {"comm_s", "%.3f", "comm %.2fs", 1}, EX_COL_BUSIEST_MB};

/* One rank: its replica, optimizer, loader and DDP; the loop is the one-process loop of train.c with
   dt_ddp_backward in place of dt_model_backward and dt_ddp_join at the end of each epoch. */
static dt_result rank_main(dt_comm *c, void *arg) {
    args *a = (args *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c), tty = me == 0 && isatty(fileno(stderr));
    int64_t per_rank = a->batch / p, micro = per_rank / a->accum;
    dt_sampler_desc share = ex_sampler(&a->data, me, p);   /* this rank's share of each epoch */
    int64_t nshare = dt_sampler_size(&share), *ids = NULL, epoch;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_loader *loader = NULL;
    dt_optim_desc od;
    dt_sched_desc sd;
    dt_loader_desc ld;
    dt_checkpoint_meta meta;   /* epoch, batch, step reached; values: the epoch's loss sum, samples, MB, -, seconds */
    uint64_t ck_sent = 0;      /* bytes the checkpoints sent, left out of the reported traffic */
    FILE *csv = NULL;
    char recipe[256];
    dt_result r = DT_OK;

    if (per_rank < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "rank %d: --batch %ld is smaller than the %d ranks: give each rank a sample", me, a->batch, p);
    if (a->batch % p)   /* an even split, or the log's "batch = ranks x share" and the step would disagree */
        return dt_set_error(DT_ERR_INVALID_ARG, "rank %d: --batch %ld does not divide over the %d ranks: give a batch divisible by %d, "
                            "e.g. --batch %lld", me, a->batch, p, p, (long long)(per_rank * p));
    if (per_rank % a->accum)
        return dt_set_error(DT_ERR_INVALID_ARG, "rank %d: --accum %ld does not divide the %lld samples each rank takes of --batch %ld: "
                            "give a batch divisible by ranks x accum (%ld)", me, a->accum, (long long)per_rank, a->batch, (long)p * a->accum);
    TRY(ex_model_create(&m, a->model, &a->data, (uint64_t)me));
    ex_recipe_optim(&a->recipe, &od);
    ex_recipe_sched(&a->recipe, a->epochs, &sd);
    TRY(dt_optim_create(&o, m, &od));
    TRY(dt_ddp_create(&d, c, m, &a->ddp));      /* rank 0's initial weights everywhere */
    if (!(ids = (int64_t *)malloc(sizeof(int64_t) * (size_t)nshare))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "rank %d: no memory", me); goto done; }
    TRY(dt_sampler_indices(&share, ids, &nshare));
    memset(&ld, 0, sizeof ld);
    ld.dataset = &a->data.train; ld.indices = ids; ld.count = nshare; ld.batch = micro;
    ld.transform = &a->data.tt; ld.seed = (uint64_t)a->data.seed; ld.rank = (uint64_t)me; ld.prefetch = 1;
    TRY(dt_loader_create(&loader, &ld));
    memset(&meta, 0, sizeof meta);
    if (a->ckpt.resume) TRY(ex_ckpt_load(&a->ckpt, c, EX_DDP, d, m, o, &meta, &ck_sent));
    if (me == 0) {
        if (a->ckpt.resume) ex_ckpt_resumed(&a->ckpt, &meta, "epoch");
        if (a->ckpt.resume) TRY(ex_csv_keep(a->csv, meta.epoch));   /* the rows the checkpoint covers */
        TRY(ex_report_open(&csv, a->csv, COLS, EX_COUNT(COLS), a->ckpt.resume));
        printf("%s on %s: %lld training and %lld test samples, %lld parameters (%s), %s, batch %ld = %d ranks x %lld, "
               "accum %ld (micro-batches of %lld), seed %ld\n%s backend, sync %s", a->model, a->data.name, (long long)a->data.ntrain, (long long)a->data.test.count,
               (long long)dt_model_param_count(m), dt_precision_name(a->data.precision), ex_recipe_str(&a->recipe, a->epochs, "epochs", recipe, sizeof recipe), a->batch, p,
               (long long)per_rank, a->accum, (long long)micro, a->data.seed, dt_comm_backend_name(c), dt_ddp_method_name(a->ddp.method));
        if (a->ddp.method == DT_DDP_BUCKETS) {   /* buckets hold whole tensors: their real sizes, first reduced first */
            int b;
            printf(" (%d buckets:", dt_ddp_buckets(d));
            for (b = 0; b < dt_ddp_buckets(d); b++) {
                double kb = (double)dt_ddp_bucket_bytes(d, b) / 1e3;
                printf(kb < 1e3 ? "%s %.1f kB" : "%s %.1f MB", b ? "," : "", kb < 1e3 ? kb : kb / 1e3);
            }
            printf(", %s)", dt_ddp_overlapped(d) ? "overlapped with backward" : "after backward");
        }
        if (a->ddp.method <= DT_DDP_PER_LAYER) {   /* what "auto" means on this communicator; 16 bits have no native path */
            dt_algo al = dt_comm_algo(c, a->ddp.algo);
            if ((a->ddp.compress == DT_DDP_BF16 || a->ddp.compress == DT_DDP_FP16) && al == DT_ALGO_NATIVE) al = DT_ALGO_RING;
            printf(", %s", a->ddp.compress == DT_DDP_TOPK ? "all-gather of pairs" : "all-reduce ");
            if (a->ddp.compress != DT_DDP_TOPK) printf("%s", dt_algo_name(al));
        }
        printf(", compress %s", dt_ddp_compress_name(a->ddp.compress));
        if (a->ddp.compress == DT_DDP_TOPK) printf(" %g", a->ddp.topk_ratio > 0 ? a->ddp.topk_ratio : DT_DDP_TOPK_RATIO);
        if (a->ddp.compress == DT_DDP_POWERSGD) printf(" rank %d", a->ddp.powersgd_rank > 0 ? a->ddp.powersgd_rank : DT_DDP_POWERSGD_RANK);
        if (a->ddp.compress >= DT_DDP_TOPK) printf(a->ddp.no_feedback ? " without error feedback" : " with error feedback");
        if (a->ddp.powersgd_warmup) printf(" after %lld plain syncs", (long long)a->ddp.powersgd_warmup);
        if (a->ddp.sync_bn) printf(", batch norm synchronised");
        printf(", %d threads per rank\n", dt_cpu_threads());
        TRY(ex_log_flush());
    }

    for (epoch = meta.epoch; epoch < a->epochs && r == DT_OK; epoch++) {
        const float *x = NULL;
        const int32_t *y = NULL;
        int64_t n = 0, k = meta.batch;
        double t0 = dt_time_now() - meta.values[4], *sums = meta.values, secs, mb;   /* sums: loss x samples, samples */
        float loss = 0.0f;
        dt_ddp_stats st0 = dt_ddp_get_stats(d);
        uint64_t sent0 = dt_comm_get_stats(c).bytes_sent - ck_sent - (uint64_t)meta.values[2];   /* the epoch's start */
        dt_eval_result ev;
        dt_progress bar;
        dt_result got;   /* the loader: DT_OK with n = 0 at the end of the epoch */
        TRY(dt_optim_set_lr(o, dt_sched_lr(&sd, epoch)));
        dt_model_set_mode(m, DT_MODE_TRAIN);
        share.epoch = epoch;
        TRY(dt_sampler_indices(&share, ids, &nshare));   /* this epoch's share */
        TRY(dt_loader_set_indices(loader, ids, nshare));
        TRY(dt_loader_seek(loader, epoch, meta.batch));   /* batch 0, or where a resumed epoch stopped */
        dt_progress_begin(&bar, stderr, dt_loader_batches(loader), tty);
        while ((got = dt_loader_next(loader, &x, &y, &n)) == DT_OK && n > 0) {
            int last = ++k == dt_loader_batches(loader), sync = k % a->accum == 0 || last;
            TRY(dt_model_forward(m, x, n));
            TRY(ex_at(dt_model_loss_labels(m, y, &loss), epoch + 1, k));   /* a NaN loss says when */
            /* the gradients of all ranks are averaged every accum micro-batches (and at the end) */
            TRY(dt_ddp_backward(d, NULL, n, sync));
            if (sync) {
                TRY(dt_optim_step(o));
                dt_model_zero_grad(m);
            }
            sums[0] += (double)loss * (double)n;
            sums[1] += (double)n;
            meta.batch = k;
            dt_progress_update(&bar, k, "loss %.4f", (double)loss);
            if (sync && ex_ckpt_due(&a->ckpt, ++meta.step, 0, 0)) {   /* only after a step: a checkpoint holds no gradient */
                meta.values[2] = (double)(dt_comm_get_stats(c).bytes_sent - ck_sent - sent0);
                meta.values[4] = dt_time_now() - t0;   /* the epoch's seconds so far, for its time */
                TRY(ex_ckpt_save(&a->ckpt, c, EX_DDP, d, m, o, &meta, &ck_sent));
            }
        }
        TRY(got);                          /* the error that stopped the loader, if one did */
        TRY(dt_ddp_join(d, o));            /* ranks with fewer batches shadow the others' last steps */
        TRY(dt_ddp_sync_buffers(d));       /* BatchNorm statistics, if the model has any */
        dt_progress_end(&bar);
        secs = dt_time_now() - t0;
        mb = (double)(dt_comm_get_stats(c).bytes_sent - ck_sent - sent0) / 1e6;
        TRY(ex_epoch_end(c, sums, &mb, m, &a->data, 5, &ev));   /* the mean loss over every sample; the test set, shared */
        if (me == 0) {
            double comm = dt_ddp_get_stats(d).comm_seconds - st0.comm_seconds;
            double v[] = {secs, sums[0] / sums[1], ev.loss, ev.top1, ev.topk, sums[1] / secs, comm, mb};   /* COLS' order */
            TRY(ex_report(csv, a->csv, epoch + 1, a->epochs, COLS, v, EX_COUNT(COLS)));
        }
        TRY(ex_stop_if_diverged(c, epoch + 1, sums[0] / sums[1], &ev, a->data.test.num_classes));   /* before the epoch's checkpoint */
        ex_ckpt_next_epoch(&meta, epoch + 1);
        if (ex_ckpt_due(&a->ckpt, meta.step, 1, epoch + 1 == a->epochs)) TRY(ex_ckpt_save(&a->ckpt, c, EX_DDP, d, m, o, &meta, &ck_sent));
    }
    {   /* what DDP did in this process: the overlap at work, and the rounds ranks with fewer batches shadowed */
        dt_ddp_stats st = dt_ddp_get_stats(d);
        int64_t joined = st.joined_rounds;
        TRY(dt_comm_allreduce(c, &joined, 1, DT_I64, DT_MAX, DT_ALGO_AUTO));
        if (me == 0 && p > 1) {
            printf("ddp: rank 0 synced %lld times", (long long)st.syncs);
            if (dt_ddp_overlapped(d))
                printf(", %lld of its %lld buckets began while backward ran", (long long)st.early_buckets,
                       (long long)st.syncs * dt_ddp_buckets(d));
            printf("; the most rounds a rank took part in after it ran out of batches: %lld\n", (long long)joined);
            TRY(ex_log_flush());
        }
    }
done:
    if (csv) fclose(csv);
    dt_loader_destroy(loader);
    dt_ddp_destroy(d);
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
