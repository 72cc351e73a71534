/* fedavg.c: federated averaging (FedAvg), SimpleCNN on Fashion-MNIST, 8 clients on 4 ranks, without flags.
   Rank 0 is the server; the clients are simulated on ranks 1..3. Each round the server samples half of the
   clients, each trains one local epoch from the global model on its own data, and the server averages
   their updates (weighted by their sample counts) into the global model. The full program, with robust
   aggregators, attacks, FedProx and dropouts: examples/fedavg.c. */
#include <stdio.h>
#define DTRAIN_IMPLEMENTATION
#include "dtrain.h"

enum { RANKS = 4, SAMPLES = 8000, CLIENTS = 8, ROUNDS = 3, LOCAL_EPOCHS = 1, BATCH = 32 };   /* 1000 images a client */
static const float FRAC = 0.5f, LR = 0.05f, MOMENTUM = 0.9f;  /* FRAC: the share of the clients in a round */

static dt_dataset train, test;                               /* loaded by main, read by every rank */
static const dt_transform NORM = {{0.2860f}, {0.3530f}, 0, 0};   /* x = (pixel / 255 - mean) / std */

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

static dt_result rank_main(dt_comm *c, void *arg) {   /* runs once on every rank */
    dt_model *m = NULL; dt_fed *f = NULL;
    dt_model_desc md = {0}; dt_fed_desc fd = {0};
    dt_partition part = {0}; dt_partition_desc pd = {0};   /* pd: zero = an IID split */
    dt_eval_desc ed = {0};                                 /* zero = batches of 1000, top-1 */
    dt_result r;
    (void)arg;
    md.seed = 1;
    TRY(dt_zoo_create(&m, DT_ZOO_SIMPLE_CNN, 10, &md));     /* on rank 0 the global model, elsewhere a client's */
    pd.count = SAMPLES; pd.parts = CLIENTS; pd.seed = 1;
    TRY(dt_partition_create(&part, &pd));                   /* client k's images: part k (the same on every rank) */
    ed.dataset = &test; ed.transform = &NORM;               /* evaluated on the test set */
    fd.clients = CLIENTS; fd.frac = FRAC; fd.local_epochs = LOCAL_EPOCHS; fd.batch = BATCH;
    fd.optim.lr = LR; fd.optim.momentum = MOMENTUM;          /* each client's optimizer, fresh every round */
    fd.data = &train; fd.part = &part; fd.transform = &NORM; fd.seed = 1;
    TRY(dt_fed_create(&f, c, m, &fd));                       /* agg 0: the weighted mean, FedAvg's */
    for (int round = 0; round < ROUNDS; round++) {
        dt_fed_round_info info;
        dt_eval_result ev;
        /* rank 0 sends the global model; the sampled clients train and send local - global; rank 0 adds
           the mean of those updates to the global model */
        TRY(dt_fed_round(f, round, &info));
        if (dt_comm_rank(c) == 0) {
            TRY(dt_evaluate(m, &ed, &ev));
            printf("round %d  clients %d  train loss %.4f  test acc %.2f%%\n", round + 1, info.kept, info.train_loss,
                   100.0 * ev.top1);
        }
    }
done:
    dt_fed_destroy(f); dt_partition_free(&part); dt_model_destroy(m);
    return r;
}

int main(void) {
    dt_launch_desc ld = {0};
    ld.ranks = RANKS;                                          /* threads; under mpiexec, one rank per process */
    if (dt_dataset_load_mnist_dir(&train, NULL, 1) != DT_OK || dt_dataset_load_mnist_dir(&test, NULL, 0) != DT_OK) {
        fprintf(stderr, "fedavg: %s\n", dt_last_error());   /* NULL: Debian's /usr/share/datasets/fashion-mnist */
        return 1;
    }
    if (dt_launch(&ld, rank_main, NULL) != DT_OK) return 1;    /* dt_launch has logged which rank failed and why */
    dt_dataset_free(&train); dt_dataset_free(&test);
    return 0;
}
