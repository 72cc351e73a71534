/* hogwild.c: Hogwild, SimpleCNN on Fashion-MNIST, 4 threads of one process, without flags. The threads train
   ONE shared model, each on its own shard of the data, and apply their SGD steps to its parameters without
   any lock (Niu et al., 2011): a thread may read parameters another is halfway through updating. The races
   are the algorithm, traded for never waiting. The full program, with every option: examples/hogwild.c. */
#include <stdio.h>
#define DTRAIN_IMPLEMENTATION
#include "dtrain.h"

enum { THREADS = 4, SAMPLES = 4000, EPOCHS = 3, BATCH = 32 };  /* the first 4000 training images */
static const float LR = 0.05f;                                 /* plain SGD: a lock-free step keeps no state */

static dt_dataset train, test;                               /* loaded by main, read by every thread */
static const dt_transform NORM = {{0.2860f}, {0.3530f}, 0, 0};   /* x = (pixel / 255 - mean) / std */
static dt_model *replica[THREADS];                           /* each thread's activations and gradients */
static dt_partition part;                                    /* thread t's shard: part t */
static double sums[THREADS][2];                              /* each thread's loss x samples, samples */

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

static dt_result worker(dt_hogwild_worker *w, void *arg) {   /* one thread, one epoch on its shard */
    int t = w->index;
    dt_model *rep = replica[t];
    dt_loader *l = NULL; dt_loader_desc ld = {0};
    const float *x = NULL; const int32_t *y = NULL; int64_t n = 0;
    float loss;
    dt_result r;
    ld.dataset = &train; ld.indices = part.indices + part.offsets[t]; ld.count = part.offsets[t + 1] - part.offsets[t];
    ld.batch = BATCH; ld.shuffle = 1; ld.transform = &NORM; ld.rank = (uint64_t)t;
    TRY(dt_loader_create(&l, &ld));
    TRY(dt_loader_start_epoch(l, *(int *)arg));
    while ((r = dt_loader_next(l, &x, &y, &n)) == DT_OK && n > 0) {
        TRY(dt_hogwild_pull(w->shared, rep));                  /* the shared parameters, as they are right now */
        TRY(dt_model_forward(rep, x, n));                      /* x [n, 1, 28, 28] -> log-probabilities [n, 10] */
        TRY(dt_model_loss_labels(rep, y, &loss));
        TRY(dt_model_backward(rep, NULL));
        TRY(dt_hogwild_push(w->shared, rep, LR));              /* shared -= LR * gradient, unlocked */
        sums[t][0] += (double)loss * (double)n; sums[t][1] += (double)n;
    }
done:
    dt_loader_destroy(l);
    return r;                                                  /* the loader's error too, if it stopped on one */
}

int main(void) {
    dt_model *shared = NULL; dt_model_desc md = {0};
    dt_partition_desc pd = {0};                                /* zero = an IID split */
    dt_eval_desc ed = {0};                                     /* zero = batches of 1000, top-1 */
    dt_eval_result ev;
    dt_result r;
    md.seed = 1;
    TRY(dt_dataset_load_mnist_dir(&train, NULL, 1));           /* NULL: Debian's /usr/share/datasets/fashion-mnist */
    TRY(dt_dataset_load_mnist_dir(&test, NULL, 0));
    pd.count = SAMPLES; pd.parts = THREADS; pd.seed = 1;
    TRY(dt_partition_create(&part, &pd));
    ed.dataset = &test; ed.transform = &NORM;                  /* evaluated on the test set */
    TRY(dt_zoo_create(&shared, DT_ZOO_SIMPLE_CNN, 10, &md));   /* the one model every thread updates */
    for (int t = 0; t < THREADS; t++) TRY(dt_zoo_create(&replica[t], DT_ZOO_SIMPLE_CNN, 10, &md));
    for (int epoch = 0; epoch < EPOCHS; epoch++) {
        double loss = 0.0, seen = 0.0;
        for (int t = 0; t < THREADS; t++) sums[t][0] = sums[t][1] = 0.0;
        TRY(dt_hogwild_run(shared, THREADS, worker, &epoch));  /* THREADS threads run worker, and are waited for */
        for (int t = 0; t < THREADS; t++) { loss += sums[t][0]; seen += sums[t][1]; }
        TRY(dt_evaluate(shared, &ed, &ev));
        printf("epoch %d  train loss %.4f  test acc %.2f%%\n", epoch + 1, loss / seen, 100.0 * ev.top1);
    }
done:
    if (r != DT_OK) fprintf(stderr, "hogwild: %s\n", dt_last_error());
    for (int t = 0; t < THREADS; t++) dt_model_destroy(replica[t]);
    dt_model_destroy(shared); dt_partition_free(&part); dt_dataset_free(&train); dt_dataset_free(&test);
    return r == DT_OK ? 0 : 1;
}
