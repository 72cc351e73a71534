/* quickstart.c: a small network learns which of two numbers is larger, by data-parallel SGD on N ranks */
#include <stdio.h>
#define DTRAIN_IMPLEMENTATION
#include "dtrain.h"

static dt_result rank_main(dt_comm *c, void *arg) {   /* runs once on every rank */
    dt_model *m = NULL; dt_optim *o = NULL; dt_ddp *d = NULL;
    dt_model_desc md = {0}; dt_optim_desc od = {0}; dt_ddp_desc dd = {0};   /* zero = the defaults */
    float x[64 * 2], loss = 0.0f;                      /* this rank's batch: [64, 2] */
    int32_t y[64];                                     /* its labels: [64] */
    dt_rng rng;
    dt_result r;
    (void)arg;
    md.in_c = 2; md.seed = 42;                         /* the input: a vector of 2 */
    od.lr = 0.1f; od.momentum = 0.9f;
    dt_rng_init(&rng, 7, (uint64_t)dt_comm_rank(c));   /* each rank draws its own samples */
    if ((r = dt_model_create(&m, &md)) != DT_OK) return r;
    dt_linear(m, dt_relu(m, dt_linear(m, dt_model_input(m), 16, 1)), 2, 1);   /* 2 -> 16 -> ReLU -> 2 */
    if ((r = dt_model_finalize(m)) != DT_OK || (r = dt_optim_create(&o, m, &od)) != DT_OK ||
        (r = dt_ddp_create(&d, c, m, &dd)) != DT_OK) goto done;          /* rank 0's weights on every rank */
    for (int step = 1; step <= 200 && r == DT_OK; step++) {
        for (int i = 0; i < 64; i++) {
            x[2 * i] = dt_rng_uniform(&rng); x[2 * i + 1] = dt_rng_uniform(&rng);
            y[i] = x[2 * i] > x[2 * i + 1];
        }
        if ((r = dt_model_forward(m, x, 64)) != DT_OK || (r = dt_model_loss_cross_entropy(m, y, &loss)) != DT_OK ||
            (r = dt_ddp_backward(d, NULL, 64, 1)) != DT_OK ||   /* backward; gradients averaged over the ranks */
            (r = dt_optim_step(o)) != DT_OK) break;
        dt_model_zero_grad(m);
        if (step % 50 == 0 && (r = dt_comm_allreduce(c, &loss, 1, DT_F32, DT_MEAN, DT_ALGO_AUTO)) == DT_OK &&
            dt_comm_rank(c) == 0)
            printf("step %3d  loss %.4f  (world size %d)\n", step, loss, dt_comm_size(c));
    }
done:
    dt_ddp_destroy(d); dt_optim_destroy(o); dt_model_destroy(m);
    return r;
}

int main(int argc, char **argv) {
    dt_launch_desc ld = {0};
    if (dt_launch_parse(&argc, argv, &ld) != DT_OK) { fprintf(stderr, "%s\n", dt_last_error()); return 2; }
    /* --ranks N: N threads; under mpiexec: one rank per process. Exit status 0, or 1 after a failure */
    return dt_launch(&ld, rank_main, NULL) == DT_OK ? 0 : 1;
}
