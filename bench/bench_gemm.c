/* bench_gemm.c - GFLOP/s of dtrain's GEMM at the shapes the models' convolutions and linear layers give
   (and squares), next to OpenBLAS's sgemm when built with -DBENCH_OPENBLAS (link -lopenblas): the two
   alternate window by window, on the same inputs and the same number of threads.

   usage: bench_gemm [--windows 7] [--min-seconds 0.2] [--shape NAME]
   One CSV line per shape on stdout:
     shape,M,N,K,threads,dtrain_gflops,openblas_gflops,ratio
   GFLOP/s = 2 M N K per call, median over the windows; each window repeats the call for at least
   --min-seconds. openblas_gflops and ratio are empty without OpenBLAS. C = A B, row-major, beta 0. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../dtrain.h"
#ifdef BENCH_OPENBLAS
#include <cblas.h>
extern void openblas_set_num_threads(int);
#endif

typedef struct shape { const char *name; int64_t M, N, K; int ta, tb; } shape;
/* convolution as GEMM at batch 128: forward t [oc, n*s] = W [oc, c*9] col [c*9, n*s]; the weight gradient
   dW [oc, c*9] = t [oc, n*s] col^T; linear layers [batch, in] x W^T */
static const shape shapes[] = {
    {"square512", 512, 512, 512, 0, 0},
    {"square1024", 1024, 1024, 1024, 0, 0},
    {"simplecnn.conv2.fwd", 64, 128 * 14 * 14, 32 * 9, 0, 0},
    {"simplecnn.fc1.fwd", 128, 128, 3136, 0, 1},
    {"resnet20.s1.fwd", 16, 128 * 32 * 32, 16 * 9, 0, 0},
    {"resnet20.s2.fwd", 32, 128 * 16 * 16, 32 * 9, 0, 0},
    {"resnet20.s3.fwd", 64, 128 * 8 * 8, 64 * 9, 0, 0},
    {"resnet20.s3.wgrad", 64, 64 * 9, 128 * 8 * 8, 0, 1},
    {"resnet20.s3.dgrad", 64 * 9, 128 * 8 * 8, 64, 1, 0},
    {"vgg11.conv2.fwd", 128, 128 * 16 * 16, 64 * 9, 0, 0},
    {"vgg11.conv4.fwd", 256, 128 * 8 * 8, 256 * 9, 0, 0},
    {"vgg11.conv6.fwd", 512, 128 * 4 * 4, 512 * 9, 0, 0},
    {"vgg11.conv4.wgrad", 256, 256 * 9, 128 * 8 * 8, 0, 1},
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef void (*gemm_fn)(const shape *s, const float *A, const float *B, float *C);
static void run_dtrain(const shape *s, const float *A, const float *B, float *C) {
    dt_gemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, s->ta ? s->M : s->K, B, s->tb ? s->K : s->N, 0.0f, C, s->N);
}
#ifdef BENCH_OPENBLAS
static void run_openblas(const shape *s, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, (int)s->M, (int)s->N,
                (int)s->K, 1.0f, A, (int)(s->ta ? s->M : s->K), B, (int)(s->tb ? s->K : s->N), 0.0f, C, (int)s->N);
}
#endif

/* GFLOP/s of one window: the call repeated for at least `secs` */
static double window(gemm_fn f, const shape *s, const float *A, const float *B, float *C, double secs) {
    double t0 = dt_time_now(), t;
    long reps = 0;
    do { f(s, A, B, C); reps++; } while ((t = dt_time_now() - t0) < secs);
    return 2.0 * (double)s->M * (double)s->N * (double)s->K * (double)reps / t / 1e9;
}

int main(int argc, char **argv) {
    long windows = 7, w;
    double secs = 0.2;
    const char *only = NULL;
    size_t k;
    int i;
    for (i = 1; i < argc; i += 2) {   /* flag and value */
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--windows") && v && atol(v) > 0) windows = atol(v);
        else if (!strcmp(f, "--min-seconds") && v && atof(v) > 0) secs = atof(v);
        else if (!strcmp(f, "--shape") && v) only = v;
        else { fprintf(stderr, "usage: bench_gemm [--windows N] [--min-seconds S] [--shape NAME]\n"); return 2; }
    }
#ifdef BENCH_OPENBLAS
    openblas_set_num_threads(dt_cpu_threads());
#endif
    for (k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const shape *s = &shapes[k];
        float *A = (float *)malloc(sizeof(float) * (size_t)(s->M * s->K)), *B = (float *)malloc(sizeof(float) * (size_t)(s->K * s->N));
        float *C = (float *)malloc(sizeof(float) * (size_t)(s->M * s->N));
        double *gd = (double *)malloc(sizeof(double) * (size_t)windows), *go = (double *)malloc(sizeof(double) * (size_t)windows);
        dt_rng rng;
        int64_t j;
        if (only && strcmp(only, s->name)) { free(A); free(B); free(C); free(gd); free(go); continue; }
        if (!A || !B || !C || !gd || !go) { fprintf(stderr, "bench_gemm: out of memory at %s\n", s->name); return 1; }
        dt_rng_init(&rng, 1, 0);
        for (j = 0; j < s->M * s->K; j++) A[j] = dt_rng_uniform(&rng) - 0.5f;
        for (j = 0; j < s->K * s->N; j++) B[j] = dt_rng_uniform(&rng) - 0.5f;
        run_dtrain(s, A, B, C);   /* warm-up */
#ifdef BENCH_OPENBLAS
        run_openblas(s, A, B, C);
#endif
        for (w = 0; w < windows; w++) {
            gd[w] = window(run_dtrain, s, A, B, C, secs);
#ifdef BENCH_OPENBLAS
            go[w] = window(run_openblas, s, A, B, C, secs);
#endif
        }
        qsort(gd, (size_t)windows, sizeof(double), cmp_double);
        printf("%s,%lld,%lld,%lld,%d,%.1f", s->name, (long long)s->M, (long long)s->N, (long long)s->K, dt_cpu_threads(), gd[windows / 2]);
#ifdef BENCH_OPENBLAS
        qsort(go, (size_t)windows, sizeof(double), cmp_double);
        printf(",%.1f,%.3f\n", go[windows / 2], gd[windows / 2] / go[windows / 2]);
#else
        printf(",,\n");
#endif
        fflush(stdout);
        free(A); free(B); free(C); free(gd); free(go);
    }
    return 0;
}
