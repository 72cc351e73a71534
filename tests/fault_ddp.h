/* fault_ddp.h - a small DDP run for the fault tests (tests/test_faults.c on local ranks, tests/mpi/fault_ddp.c
   under mpiexec and on local ranks): an MLP on synthetic data, fd_job.steps steps of FD_BATCH samples per
   rank, the gradient averaged by DDP. A NaN loss is reported with its epoch and step, as the examples do.
   With nan_step > 0, one pixel of rank nan_rank's batch at that step is NaN; compress chooses DDP's compression. Faults of the communicator
   come from dt_comm_desc.fault or $DT_FAULT (dt_launch reads it). Needs train_checks.h. */
#ifndef FAULT_DDP_H
#define FAULT_DDP_H

#define FD_IN 12
#define FD_K 4
#define FD_BATCH 4

typedef struct fd_job {
    int steps, nan_rank, nan_step;
    const char *compress;   /* NULL: fp32; else as ddp's --compress (fp16, bf16, topk:R, powersgd:R) */
    int last_no_bias;       /* the last layer without a bias: its weight comes first in DDP's slice (PowerSGD's P) */
} fd_job;

/* The loss of one step, or its failure with the epoch and step in front of the cause. */
static dt_result fd_loss(dt_model *m, const float *x, const int32_t *y, int step) {
    float loss;
    dt_result r = dt_model_forward(m, x, FD_BATCH);
    if (r == DT_OK) r = dt_model_loss_labels(m, y, &loss);
    if (r != DT_OK) {
        const char *cause = strchr(dt_last_error(), ':');   /* after the code's name */
        dt_set_error(r, "epoch 1, step %d: %s", step, cause ? cause + 2 : dt_last_error());
    }
    return r;
}

/* DDP with the compression named as ddp's --compress names it (NULL: fp32). */
static dt_result fd_ddp_create(dt_ddp **d, dt_comm *c, dt_model *m, const char *compress) {
    dt_ddp_desc dd;
    double x = 0.0;
    dt_result r;
    memset(&dd, 0, sizeof dd);
    if (compress && (r = dt_ddp_compress_parse(compress, &dd.compress, &x)) != DT_OK) return r;
    if (dd.compress == DT_DDP_TOPK) dd.topk_ratio = x;
    else if (dd.compress == DT_DDP_POWERSGD) dd.powersgd_rank = (int)x;
    return dt_ddp_create(d, c, m, &dd);
}

static dt_result fd_rank(dt_comm *c, void *arg) {
    const fd_job *j = (const fd_job *)arg;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_optim_desc od;
    float x[FD_BATCH * FD_IN];
    int32_t y[FD_BATCH];
    int s;
    dt_result r;
    memset(&od, 0, sizeof od);
    od.lr = 0.05f;
    tc_data(x, y, FD_BATCH, FD_IN, FD_K);
    if (j->last_no_bias) {
        dt_model_desc md;
        memset(&md, 0, sizeof md);
        md.in_c = FD_IN; md.seed = 1;
        if ((r = dt_model_create(&m, &md)) == DT_OK) {
            dt_linear(m, dt_relu(m, dt_linear(m, dt_model_input(m), 16, 1)), FD_K, 0);
            r = dt_model_finalize(m);
        }
    } else r = tc_mlp(&m, FD_IN, FD_K, 1, 0, 16, 0);
    if (r == DT_OK && (r = dt_optim_create(&o, m, &od)) == DT_OK) r = fd_ddp_create(&d, c, m, j->compress);
    for (s = 1; s <= j->steps && r == DT_OK; s++) {
        if (j->nan_step == s && dt_comm_rank(c) == j->nan_rank) x[3] = NAN;   /* one pixel */
        if ((r = fd_loss(m, x, y, s)) == DT_OK && (r = dt_ddp_backward(d, NULL, FD_BATCH, 1)) == DT_OK) r = dt_optim_step(o);
        dt_model_zero_grad(m);
    }
    if (r == DT_OK) r = fd_loss(m, x, y, s);   /* the examples evaluate after training: a NaN the last step left shows */
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

#endif
