/* dpsgd.c: decentralised parallel SGD (D-PSGD), SimpleCNN on Fashion-MNIST, on 4 ranks in a ring, without
   flags. No all-reduce and no server: every rank trains its own replica on its shard and, each step, averages
   it with its two neighbours' (the mixing matrix W of the ring). The replicas drift a little apart; their
   average is the model, evaluated after each epoch. The full program, with every option: examples/dpsgd.c. */
#include <stdio.h>
#define DTRAIN_IMPLEMENTATION
#include "dtrain.h"

enum { RANKS = 4, SAMPLES = 4000, EPOCHS = 3, BATCH = 32 };   /* the first 4000 training images; 32 per rank */
static const float LR = 0.05f, MOMENTUM = 0.9f;

static dt_dataset train, test;                               /* loaded by main, read by every rank */
static const dt_transform NORM = {{0.2860f}, {0.3530f}, 0, 0};   /* x = (pixel / 255 - mean) / std */

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

static dt_result rank_main(dt_comm *c, void *arg) {   /* runs once on every rank */
    int me = dt_comm_rank(c);
    dt_model *m = NULL; dt_optim *o = NULL; dt_dpsgd *d = NULL; dt_loader *l = NULL;
    dt_model_desc md = {0}; dt_optim_desc od = {0}; dt_loader_desc ld = {0}; dt_topology_desc td = {0};
    dt_topology ring = {0};
    dt_partition part = {0}; dt_partition_desc pd = {0};   /* pd: zero = an IID split */
    dt_eval_desc ed = {0};                                 /* zero = batches of 1000, top-1 */
    dt_result r;
    (void)arg;
    md.seed = 1; od.lr = LR; od.momentum = MOMENTUM;
    td.kind = DT_TOPO_RING; td.world = dt_comm_size(c);       /* rank i's neighbours: i - 1 and i + 1 */
    TRY(dt_zoo_create(&m, DT_ZOO_SIMPLE_CNN, 10, &md));
    TRY(dt_optim_create(&o, m, &od));
    TRY(dt_topology_create(&ring, &td));                       /* W: 1/3 for me and each neighbour */
    TRY(dt_dpsgd_create(&d, c, m, &ring, NULL));               /* the replicas start from rank 0's weights */
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
        dt_result e;                                           /* the evaluation's result */
        TRY(dt_loader_start_epoch(l, epoch));
        while ((r = dt_loader_next(l, &x, &y, &n)) == DT_OK && n > 0) {
            TRY(dt_model_forward(m, x, n));                    /* x [n, 1, 28, 28] -> log-probabilities [n, 10] */
            TRY(dt_model_loss_labels(m, y, &loss));
            TRY(dt_model_backward(m, NULL));                   /* this replica's gradient, nothing sent */
            TRY(dt_dpsgd_step(d, o));                          /* x_i <- sum_j W[i][j] x_j - lr g_i: gossip + step */
            dt_model_zero_grad(m);
            sum[0] += (double)loss * (double)n; sum[1] += (double)n;
        }
        TRY(r);                                                /* the loader's error, if it stopped on one */
        TRY(dt_comm_allreduce(c, sum, 2, DT_F64, DT_SUM, DT_ALGO_AUTO));
        TRY(dt_dpsgd_use_average(d, 1));                       /* every rank: its replica aside, the mean loaded */
        e = me == 0 ? dt_evaluate(m, &ed, &ev) : DT_OK;
        TRY(dt_dpsgd_use_average(d, 0));                       /* each its own replica again */
        TRY(e);
        if (me == 0)
            printf("epoch %d  train loss %.4f  test acc %.2f%% (the average of the replicas)\n", epoch + 1,
                   sum[0] / sum[1], 100.0 * ev.top1);
    }
done:
    dt_loader_destroy(l); dt_partition_free(&part); dt_dpsgd_destroy(d); dt_topology_free(&ring);
    dt_optim_destroy(o); dt_model_destroy(m);
    return r;
}

int main(void) {
    dt_launch_desc ld = {0};
    ld.ranks = RANKS;                                          /* threads; under mpiexec, one rank per process */
    if (dt_dataset_load_mnist_dir(&train, NULL, 1) != DT_OK || dt_dataset_load_mnist_dir(&test, NULL, 0) != DT_OK) {
        fprintf(stderr, "dpsgd: %s\n", dt_last_error());    /* NULL: Debian's /usr/share/datasets/fashion-mnist */
        return 1;
    }
    if (dt_launch(&ld, rank_main, NULL) != DT_OK) return 1;    /* dt_launch has logged which rank failed and why */
    dt_dataset_free(&train); dt_dataset_free(&test);
    return 0;
}
