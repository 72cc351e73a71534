/* hogwild.c - Hogwild: several threads of one process train ONE model, each on its own shard of the data,
   and apply their SGD steps to the shared parameters without any lock (Niu et al., 2011). A thread may
   read parameters another is halfway through updating, or overwrite another's update of the same element:
   the races are the algorithm, traded for never waiting.

   usage: hogwild [--threads 4] [--model simplecnn] [--dataset fashion-mnist|mnist|cifar10] [--data DIR] [--pad-to 0]
                  [--epochs 1] [--batch 32] [--lr 0.01] [--milestones A,B,...] [--cosine] [--min-lr 0] [--warmup 0]
                  [--seed 0] [--precision fp32] [--limit N] [--test-limit N] [--csv PATH]
   e.g.   ./build/examples/hogwild --threads 4 --epochs 3
          ./build/examples/hogwild --threads 1 --limit 6000        (plain SGD: the baseline)

   Each worker thread has its own replica of the model for activations and gradients; a step pulls the
   shared parameters into it, runs forward and backward on the worker's batch, and pushes
   shared -= lr * gradient. Every epoch the sampler deals the (limited) training set into one disjoint
   shard per thread; after it the shared model is evaluated on the test set. The step is plain SGD (a lock-free
   update has no optimizer state), so of the examples' optimizer flags (examples/common.h) it takes --lr and
   the schedule's, which sets the rate of each epoch. --checkpoint and --resume, which the other training
   examples take, are refused: the threads' unlocked updates land in an order the scheduler picks, so no
   resumed run could end with the parameters of one that was never stopped. */
#define _POSIX_C_SOURCE 200809L   /* isatty, fileno */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#define EX_PROG "hogwild"
#include "common.h"

#define MAX_THREADS 256

typedef struct args {
    const char *model, *csv;
    long threads, epochs, batch;
    ex_recipe recipe;                 /* --lr and the schedule (plain SGD) */
    ex_data data;                     /* --dataset, --data, --limit, --seed and the sets main loads */
    int64_t epoch;
    float lr;                         /* this epoch's rate */
    dt_model *replica[MAX_THREADS];   /* one per worker, made by main */
    dt_optim *clip[MAX_THREADS];      /* --clip-grad: each replica's clipping (its step is the push's) */
    double sums[MAX_THREADS][2];      /* each worker's loss sum and samples this epoch */
    dt_progress bar;                  /* drawn by worker 0, from its own batches */
} args;

static void usage(FILE *f) {
    fprintf(f, "usage: hogwild [--threads N] [--model NAME] [--dataset fashion-mnist|mnist|cifar10] [--data DIR] [--pad-to S]\n"
               "               [--epochs N] [--batch N] [--seed N] [--precision fp32|bf16] [--limit N] [--test-limit N] [--csv PATH]\n");
    ex_recipe_usage(f, 15, 1);
}

static int parse_args(int argc, char **argv, args *a) {
    int i, k;
    a->model = "simplecnn"; a->data.dataset = "fashion-mnist";
    a->threads = 4; a->epochs = 1; a->batch = 32; a->recipe.lr = 0.01; a->recipe.plain = 1;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); exit(0); }
        if ((k = ex_recipe_flag(f, v, &a->recipe, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if (!strcmp(f, "--checkpoint") || !strcmp(f, "--checkpoint-every") || !strcmp(f, "--resume")) {
            fprintf(stderr, "hogwild: %s: Hogwild cannot resume exactly: its threads update the shared model without locks, in "
                            "an order the scheduler picks, so no two runs end with the same parameters; the other training "
                            "examples take --checkpoint and --resume\n", f);
            return -1;
        }
        if (!v) { fprintf(stderr, "hogwild: %s needs a value\n", f); return -1; }
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--csv")) a->csv = v;
        else if (!strcmp(f, "--threads")) bad = parse_long(f, v, 1, &a->threads) || (a->threads > MAX_THREADS && fprintf(stderr, "hogwild: at most %d threads\n", MAX_THREADS));
        else if (!ex_flag(f, v, &a->data, &a->epochs, &a->batch, &bad)) {   /* not one of the common flags */
            fprintf(stderr, "hogwild: unknown flag '%s'\n", f); usage(stderr); return -1;
        }
        if (bad) return -1;
        i++;
    }
    if (dt_zoo_parse(a->model, NULL) != DT_OK) { fprintf(stderr, "hogwild: %s\n", dt_last_error()); return -1; }
    if (!strcmp(a->data.dataset, "folder")) { fprintf(stderr, "hogwild: --dataset folder is train's; use fashion-mnist, mnist or cifar10\n"); return -1; }
    return ex_recipe_check(&a->recipe, a->epochs, "epochs") || (a->csv && ex_out_check("--csv", a->csv)) ? -1 : 0;
}

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

/* What main reports after each epoch, in the log and in the CSV file. */
static const ex_col COLS[] = {EX_COL_TIME, EX_COL_TRAIN_LOSS, EX_COL_TEST_LOSS, EX_COL_TEST_ACC, EX_COL_TOP5, EX_COL_IMG_PER_S};

/* One worker, one epoch on its shard: pull, forward, backward, push, with no lock anywhere. */
static dt_result worker(dt_hogwild_worker *w, void *arg) {
    args *a = (args *)arg;
    dt_model *rep = a->replica[w->index];
    dt_sampler_desc shard = ex_sampler(&a->data, w->index, w->threads);   /* this worker's shard of the epoch */
    int64_t nshare = dt_sampler_size(&shard), *ids, n = 0, b = 0;
    dt_loader *loader = NULL;
    dt_loader_desc ld;
    const float *x = NULL;
    const int32_t *y = NULL;
    float loss = 0.0f;
    dt_result r = DT_OK;
    dt_result got;   /* the loader: DT_OK with n = 0 at the end of the epoch */
    if (!(ids = (int64_t *)malloc(sizeof(int64_t) * (size_t)nshare))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory");
    shard.epoch = a->epoch;
    TRY(dt_sampler_indices(&shard, ids, &nshare));
    memset(&ld, 0, sizeof ld);
    ld.dataset = &a->data.train; ld.indices = ids; ld.count = nshare; ld.batch = a->batch;
    ld.transform = &a->data.tt; ld.seed = (uint64_t)a->data.seed; ld.rank = (uint64_t)w->index;
    TRY(dt_loader_create(&loader, &ld));
    TRY(dt_loader_start_epoch(loader, a->epoch));
    dt_model_zero_grad(rep);
    while ((got = dt_loader_next(loader, &x, &y, &n)) == DT_OK && n > 0) {
        TRY(dt_hogwild_pull(w->shared, rep));          /* the shared parameters, as they are right now */
        TRY(dt_model_forward(rep, x, n));
        TRY(dt_model_loss_labels(rep, y, &loss));
        TRY(dt_model_backward(rep, NULL));
        if (a->clip[w->index]) TRY(dt_optim_clip_grad_norm(a->clip[w->index], (float)a->recipe.clip, NULL));   /* --clip-grad */
        TRY(dt_hogwild_push(w->shared, rep, a->lr));   /* shared -= lr * gradient, unlocked */
        a->sums[w->index][0] += (double)loss * (double)n;
        a->sums[w->index][1] += (double)n;
        if (w->index == 0) dt_progress_update(&a->bar, ++b, "loss %.4f", (double)loss);
    }
    TRY(got);
done:
    dt_loader_destroy(loader);
    free(ids);
    return r;
}

int main(int argc, char **argv) {
    static args a;
    dt_model *shared = NULL;
    dt_sched_desc sd;
    FILE *csv = NULL;
    char recipe[256];
    dt_result r = DT_OK;
    long i;
    int rc, tty = isatty(fileno(stderr));
    if (parse_args(argc, argv, &a)) return 2;
    if ((rc = ex_load(&a.data)) != 0) return rc;
    if ((rc = ex_batch_check(a.batch, a.data.train.count, a.data.dataset, " (each thread's batch)")) != 0) { ex_free(&a.data); return rc; }
    TRY(ex_model_create(&shared, a.model, &a.data, 0));
    for (i = 0; i < a.threads; i++)   /* replicas: only their activations and gradients are used */
        TRY(ex_model_create(&a.replica[i], a.model, &a.data, (uint64_t)i + 1));
    for (i = 0; i < a.threads && a.recipe.clip > 0.0; i++) TRY(dt_optim_create(&a.clip[i], a.replica[i], NULL));
    TRY(ex_report_open(&csv, a.csv, COLS, EX_COUNT(COLS), 0));
    ex_recipe_sched(&a.recipe, a.epochs, &sd);
    printf("%s on %s: %lld training and %lld test samples, %lld parameters (%s), %s, batch %ld, seed %ld\n"
           "hogwild: %ld threads update one shared parameter buffer without locks\n", a.model, a.data.name, (long long)a.data.ntrain,
           (long long)a.data.test.count, (long long)dt_model_param_count(shared), dt_precision_name(a.data.precision),
           ex_recipe_str(&a.recipe, a.epochs, "epochs", recipe, sizeof recipe), a.batch, a.data.seed, a.threads);
    TRY(ex_log_flush());
    for (a.epoch = 0; a.epoch < a.epochs; a.epoch++) {
        double t0 = dt_time_now(), loss = 0.0, seen = 0.0, secs, v[EX_COUNT(COLS)];
        dt_sampler_desc shard = ex_sampler(&a.data, 0, (int)a.threads);
        int64_t nb = (dt_sampler_size(&shard) + a.batch - 1) / a.batch;
        dt_eval_result ev;
        memset(a.sums, 0, sizeof a.sums);
        a.lr = dt_sched_lr(&sd, a.epoch);
        for (i = 0; i < a.threads; i++) dt_model_set_mode(a.replica[i], DT_MODE_TRAIN);
        dt_progress_begin(&a.bar, stderr, nb, tty);
        TRY(dt_hogwild_run(shared, (int)a.threads, worker, &a));
        dt_progress_end(&a.bar);
        secs = dt_time_now() - t0;
        for (i = 0; i < a.threads; i++) { loss += a.sums[i][0]; seen += a.sums[i][1]; }
        TRY(ex_test(shared, &a.data, 5, &ev));
        v[0] = secs; v[1] = loss / seen; v[2] = ev.loss; v[3] = ev.top1; v[4] = ev.topk; v[5] = seen / secs;
        TRY(ex_report(csv, a.csv, a.epoch + 1, a.epochs, COLS, v, EX_COUNT(COLS)));
    }
done:
    if (r != DT_OK) fprintf(stderr, "hogwild: %s\n", dt_last_error());
    if (csv) fclose(csv);
    for (i = 0; i < a.threads; i++) { dt_optim_destroy(a.clip[i]); dt_model_destroy(a.replica[i]); }
    dt_model_destroy(shared);
    ex_free(&a.data);
    return r == DT_OK ? 0 : 1;
}
