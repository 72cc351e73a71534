/* main.c - the consumer's one implementation file: DTRAIN_IMPLEMENTATION is defined here only. A step of
   a small CNN on 2 local ranks, its gradients averaged; exits 0 when that works and the CMake package's
   version is dtrain.h's. */
#include <stdio.h>
#include <string.h>
#define DTRAIN_IMPLEMENTATION
#include "dtrain.h"

#if !defined(DT_USE_ZLIB) || !defined(DT_USE_STB_IMAGE) || !defined(_OPENMP)
#error "dtrain::zlib, dtrain::stb_image and dtrain::openmp must bring DT_USE_ZLIB, DT_USE_STB_IMAGE and OpenMP"
#endif

dt_result consumer_model(dt_model **out);   /* model.c */

static dt_result rank_main(dt_comm *c, void *arg) {
    dt_model *m;
    float x[4 * 64] = {0}, loss = 0.0f, *g;   /* a batch of 4 [1, 8, 8] images */
    int32_t y[4] = {0, 1, 2, 3};
    int64_t n = 0;
    dt_result r;
    (void)arg;
    x[dt_comm_rank(c)] = 1.0f;                /* the ranks' batches differ */
    if ((r = consumer_model(&m)) != DT_OK) return r;
    if ((r = dt_model_forward(m, x, 4)) == DT_OK && (r = dt_model_loss_cross_entropy(m, y, &loss)) == DT_OK &&
        (r = dt_model_backward(m, NULL)) == DT_OK) {
        g = dt_model_grads(m, &n);
        r = dt_comm_allreduce(c, g, (size_t)n, DT_F32, DT_MEAN, DT_ALGO_RING);
    }
    if (r == DT_OK && dt_comm_rank(c) == 0)
        printf("consumer: dtrain %s, %lld gradients averaged over %d ranks, loss %.4f\n", DT_VERSION_STRING,
               (long long)n, dt_comm_size(c), (double)loss);
    dt_model_destroy(m);
    return r;
}

int main(void) {
    dt_launch_desc ld = {0};
    if (strcmp(CONSUMER_DTRAIN_VERSION, DT_VERSION_STRING) != 0) {
        fprintf(stderr, "consumer: CMake's dtrain package is version %s but its dtrain.h is %s\n",
                CONSUMER_DTRAIN_VERSION, DT_VERSION_STRING);
        return 1;
    }
    ld.ranks = 2;
    return dt_launch(&ld, rank_main, NULL) == DT_OK ? 0 : 1;
}
