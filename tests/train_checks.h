/* train_checks.h - what the trainer tests share (test_ddp, test_localsgd, mpi/test_train_mpi): the small
   classifier they train, its synthetic data, and a launcher of local ranks with a timeout. Include after dtrain.h
   (with its implementation). */
#ifndef TRAIN_CHECKS_H
#define TRAIN_CHECKS_H
#include <string.h>

/* An MLP in -> hidden (-> batchnorm) -> relu (-> hidden2 -> relu) -> classes, no dropout; hidden2 = 0
   leaves out the second hidden layer. The tests give every rank another seed, so that the trainers'
   initial broadcast matters. */
static dt_result tc_mlp(dt_model **m, int64_t in, int64_t classes, uint64_t seed, int bn, int hidden, int hidden2) {
    dt_model_desc d;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = in; d.seed = seed;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    x = dt_model_input(*m);
    x = dt_linear(*m, x, hidden, 1);
    if (bn) x = dt_batchnorm(*m, x);
    x = dt_relu(*m, x);
    if (hidden2 > 0) {
        x = dt_linear(*m, x, hidden2, 1);
        x = dt_relu(*m, x);
    }
    x = dt_linear(*m, x, classes, 1);
    return dt_model_finalize(*m);
}
/* fn on `ranks` local ranks, with a timeout that keeps a broken test from hanging (test_ddp, test_localsgd) */
static inline dt_result tc_launch(dt_rank_fn fn, void *arg, int ranks) {
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.ranks = ranks;
    ld.comm.timeout = 20;
    return dt_launch_local(&ld, fn, arg, NULL);
}

/* n samples of `in` features uniform in [-1, 1) and labels below k, the same for every test that asks */
static inline void tc_data(float *x, int32_t *y, int64_t n, int64_t in, int64_t k) {
    dt_rng r;
    int64_t i;
    dt_rng_init(&r, 5, 0);
    for (i = 0; i < n * in; i++) x[i] = (float)dt_rng_u32(&r) / 4294967296.0f * 2.0f - 1.0f;
    for (i = 0; i < n; i++) y[i] = (int32_t)(dt_rng_u32(&r) % (uint64_t)k);
}

#endif
