/* bench_models.c - training-step throughput of the model zoo: forward, loss, backward and an SGD step
   (momentum 0.9) on random inputs, as ../bench/torch_models.py does for PyTorch.

   usage: bench_models [--model simplecnn|resnet20|vgg11|...] [--batch 128] [--warmup 3] [--iters 3] [--windows 7]
                       [--precision fp32|bf16]

   One CSV line per model on stdout:
     model,batch,threads,params,img_per_s_median,img_per_s_min,img_per_s_max,base_rss_mb,peak_rss_mb
   img/s is the median (min, max) over the windows of `iters` steps each, after `warmup` untimed steps (the
   first sizes the activation arena; the timed steps allocate nothing). base_rss_mb is the resident memory
   before the model is built, peak_rss_mb the process's peak (getrusage): the difference is what training
   the model takes (parameters, gradients, optimizer state, activations, workspaces). One model a process. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "../dtrain.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* resident memory now, from /proc (0 where there is none) */
static double rss_mb(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) { if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0; fclose(f); }
    return (double)resident * 4096.0 / 1048576.0;
}

static long arg_long(const char *flag, const char *v, long lo) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo) { fprintf(stderr, "bench_models: %s needs an integer >= %ld\n", flag, lo); exit(2); }
    return x;
}

#define CHECK(call) do { if ((call) != DT_OK) { fprintf(stderr, "bench_models: %s\n", dt_last_error()); return 1; } } while (0)

int main(int argc, char **argv) {
    const char *name = "simplecnn", *prec = "fp32";
    long batch = 128, warmup = 3, iters = 3, windows = 7, w, s, i;
    dt_zoo_model z = DT_ZOO_MLP;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_model_desc md;
    dt_optim_desc od;
    float *x, loss;
    int32_t *y;
    int64_t in_size;
    double *rate, t0, base = rss_mb();
    struct rusage ru;
    dt_rng rng;
    for (i = 1; i < argc; i += 2) {   /* flag and value */
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--model") && v) name = v;
        else if (!strcmp(f, "--batch")) batch = arg_long(f, v, 1);
        else if (!strcmp(f, "--warmup")) warmup = arg_long(f, v, 1);
        else if (!strcmp(f, "--iters")) iters = arg_long(f, v, 1);
        else if (!strcmp(f, "--windows")) windows = arg_long(f, v, 1);
        else if (!strcmp(f, "--precision") && v) prec = v;
        else {
            fprintf(stderr, "usage: bench_models [--model NAME] [--batch N] [--warmup N] [--iters N] [--windows N] [--precision fp32|bf16]\n");
            return 2;
        }
    }
    if (dt_zoo_parse(name, &z) != DT_OK) { fprintf(stderr, "bench_models: %s\n", dt_last_error()); return 2; }
    memset(&md, 0, sizeof md);
    if (dt_precision_parse(prec, &md.precision) != DT_OK) { fprintf(stderr, "bench_models: %s\n", dt_last_error()); return 2; }
    CHECK(dt_zoo_create(&m, z, 10, &md));
    memset(&od, 0, sizeof od);
    od.lr = 0.01f;
    od.momentum = 0.9f;
    CHECK(dt_optim_create(&o, m, &od));
    in_size = dt_model_node_size(m, 0);
    x = (float *)malloc(sizeof(float) * (size_t)(batch * in_size));
    y = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    rate = (double *)malloc(sizeof(double) * (size_t)windows);
    if (!x || !y || !rate) { fprintf(stderr, "bench_models: out of memory\n"); return 1; }
    dt_rng_init(&rng, 0, 1);
    for (i = 0; i < batch * in_size; i++) x[i] = dt_rng_normal(&rng);
    for (i = 0; i < batch; i++) y[i] = (int32_t)dt_rng_below(&rng, 10);
    dt_model_set_mode(m, DT_MODE_TRAIN);
    for (w = -1; w < windows; w++) {
        t0 = dt_time_now();
        for (s = 0; s < (w < 0 ? warmup : iters); s++) {
            CHECK(dt_model_forward(m, x, batch));
            CHECK(dt_model_loss_labels(m, y, &loss));
            dt_model_zero_grad(m);
            CHECK(dt_model_backward(m, NULL));
            CHECK(dt_optim_step(o));
        }
        if (w >= 0) rate[w] = (double)(iters * batch) / (dt_time_now() - t0);
    }
    qsort(rate, (size_t)windows, sizeof(double), cmp_double);
    getrusage(RUSAGE_SELF, &ru);
    printf("%s,%ld,%d,%lld,%.1f,%.1f,%.1f,%.1f,%.1f\n", name, batch, dt_cpu_threads(), (long long)dt_model_param_count(m),
           rate[windows / 2], rate[0], rate[windows - 1], base, (double)ru.ru_maxrss / 1024.0);
    free(rate); free(x); free(y);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return 0;
}
