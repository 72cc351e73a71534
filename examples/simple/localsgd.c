/* localsgd.c: local SGD (periodic model averaging), SimpleCNN on Fashion-MNIST, on 4 ranks, without flags.
   Every rank trains its own replica on its shard with its own optimizer and communicates nothing while it
   does; every 8 steps, and at the end of each epoch, the replicas are replaced by their mean (one
   all-reduce of the flat parameter buffer). The full program, with every option: examples/localsgd.c. */
#include <stdio.h>
#define DTRAIN_IMPLEMENTATION
#include "dtrain.h"

enum { RANKS = 4, SAMPLES = 4000, EPOCHS = 3, BATCH = 32, PERIOD = 8 };   /* the first 4000 images; 32 per rank */
static const float LR = 0.05f, MOMENTUM = 0.9f;

static dt_dataset train, test;                               /* loaded by main, read by every rank */
static const dt_transform NORM = {{0.2860f}, {0.3530f}, 0, 0};   /* x = (pixel / 255 - mean) / std */

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

static dt_result rank_main(dt_comm *c, void *arg) {   /* runs once on every rank */
    int me = dt_comm_rank(c);
    dt_model *m = NULL; dt_optim *o = NULL; dt_localsgd *d = NULL; dt_loader *l = NULL;
    dt_model_desc md = {0}; dt_optim_desc od = {0}; dt_loader_desc ld = {0}; dt_localsgd_desc sd = {0};
    dt_partition part = {0}; dt_partition_desc pd = {0};   /* pd: zero = an IID split */
    dt_eval_desc ed = {0};                                 /* zero = batches of 1000, top-1 */
    dt_result r;
    (void)arg;
    md.seed = 1; od.lr = LR; od.momentum = MOMENTUM; sd.period = PERIOD;
    TRY(dt_zoo_create(&m, DT_ZOO_SIMPLE_CNN, 10, &md));
    TRY(dt_optim_create(&o, m, &od));                          /* its state (momentum) stays on this rank */
    TRY(dt_localsgd_create(&d, c, m, &sd));                    /* rank 0's weights on every rank */
    pd.count = SAMPLES; pd.parts = dt_comm_size(c); pd.seed = 1;
    TRY(dt_partition_create(&part, &pd));                      /* the same split everywhere: my shard is part me */
    ed.dataset = &test; ed.transform = &NORM;                  /* evaluated on the test set */
    ld.dataset = &train; ld.indices = part.indices + part.offsets[me]; ld.count = part.offsets[me + 1] - part.offsets[me];
    ld.batch = BATCH; ld.shuffle = 1; ld.transform = &NORM; ld.rank = (uint64_t)me;
    TRY(dt_loader_create(&l, &ld));
    for (int epoch = 0; epoch < EPOCHS; epoch++) {
        const float *x = NULL; const int32_t *y = NULL; int64_t n = 0;
        double sum[2] = {0.0, 0.0};                             /* loss x samples, samples */
        float loss;
        dt_eval_result ev;
        TRY(dt_loader_start_epoch(l, epoch));
        while ((r = dt_loader_next(l, &x, &y, &n)) == DT_OK && n > 0) {
            TRY(dt_model_forward(m, x, n));                    /* x [n, 1, 28, 28] -> log-probabilities [n, 10] */
            TRY(dt_model_loss_labels(m, y, &loss));
            TRY(dt_model_backward(m, NULL));                   /* this replica's gradient, nothing sent */
            TRY(dt_optim_step(o));                             /* a step of its own */
            TRY(dt_localsgd_step(d));                          /* every PERIOD-th step: the replicas averaged */
            dt_model_zero_grad(m);
            sum[0] += (double)loss * (double)n; sum[1] += (double)n;
        }
        TRY(r);                                                /* the loader's error, if it stopped on one */
        TRY(dt_localsgd_average(d));                           /* the epoch ends with one model on every rank */
        TRY(dt_comm_allreduce(c, sum, 2, DT_F64, DT_SUM, DT_ALGO_AUTO));
        if (me == 0) {
            TRY(dt_evaluate(m, &ed, &ev));
            printf("epoch %d  train loss %.4f  test acc %.2f%%\n", epoch + 1, sum[0] / sum[1], 100.0 * ev.top1);
        }
    }
done:
    dt_loader_destroy(l); dt_partition_free(&part); dt_localsgd_destroy(d); dt_optim_destroy(o); dt_model_destroy(m);
    return r;
}

int main(void) {
    dt_launch_desc ld = {0};
    ld.ranks = RANKS;                                          /* threads; under mpiexec, one rank per process */
    if (dt_dataset_load_mnist_dir(&train, NULL, 1) != DT_OK || dt_dataset_load_mnist_dir(&test, NULL, 0) != DT_OK) {
        fprintf(stderr, "localsgd: %s\n", dt_last_error()); /* NULL: Debian's /usr/share/datasets/fashion-mnist */
        return 1;
    }
    if (dt_launch(&ld, rank_main, NULL) != DT_OK) return 1;    /* dt_launch has logged which rank failed and why */
    dt_dataset_free(&train); dt_dataset_free(&test);
    return 0;
}
