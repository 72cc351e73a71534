/* zoo.c - the model zoo at a glance: for each model, its layers and parameter count, and the time of a
   training step's forward + loss + backward on random data.

   usage: zoo [--model NAME|all] [--batch N] [--steps N] [--summary] [--seed N] [--tier avx512|avx2|neon|portable]
   e.g.   ./build/examples/zoo --model resnet20 --batch 128 --summary                              */
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call) do { dt_result r_ = (call); if (r_ != DT_OK) { \
    fprintf(stderr, "zoo: %s\n", dt_last_error()); return 1; } } while (0)

static void usage(FILE *f) {
    int z;
    fprintf(f, "usage: zoo [--model NAME|all] [--batch N] [--steps N] [--summary] [--seed N] [--tier avx512|avx2|neon|portable]\n"
               "models:");
    for (z = 0; z < DT_ZOO_COUNT; z++) fprintf(f, " %s", dt_zoo_name((dt_zoo_model)z));
    fprintf(f, "\n");
}

/* strtol with the whole string and a range checked; -1 on error */
static long parse_long(const char *s, long lo, long hi) {
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v >= lo && v <= hi) ? v : -1;
}

static int run_model(dt_zoo_model z, long batch, long steps, int summary, unsigned long seed) {
    dt_model *m;
    dt_model_desc d;
    int64_t in_size, i;
    float *x, loss = 0.0f;
    int32_t *y;
    double t0 = 0.0, dt;
    long s;
    memset(&d, 0, sizeof d);
    d.seed = seed;
    CHECK(dt_zoo_create(&m, z, 10, &d));
    if (summary) dt_model_summary(m);
    in_size = dt_model_node_size(m, 0);
    x = (float *)malloc(sizeof(float) * (size_t)(batch * in_size));
    y = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    if (!x || !y) { fprintf(stderr, "zoo: out of memory for a batch of %ld\n", batch); return 1; }
    {
        dt_rng rng;
        dt_rng_init(&rng, seed, 1);
        for (i = 0; i < batch * in_size; i++) x[i] = dt_rng_normal(&rng);
        for (i = 0; i < batch; i++) y[i] = (int32_t)dt_rng_below(&rng, 10);
    }
    /* one untimed step sizes the activation arena; the timed ones then allocate nothing */
    for (s = -1; s < steps; s++) {
        if (s == 0) t0 = dt_time_now();
        CHECK(dt_model_forward(m, x, batch));
        CHECK(z == DT_ZOO_SIMPLE_CNN ? dt_model_loss_nll(m, y, &loss) : dt_model_loss_cross_entropy(m, y, &loss));
        dt_model_zero_grad(m);
        CHECK(dt_model_backward(m, NULL));
    }
    dt = (dt_time_now() - t0) / (double)steps;
    printf("%-11s %10lld params  batch %4ld  loss %.4f  fwd+bwd %8.2f ms  %8.1f img/s\n", dt_zoo_name(z),
           (long long)dt_model_param_count(m), batch, (double)loss, 1e3 * dt, (double)batch / dt);
    free(x); free(y);
    dt_model_destroy(m);
    return 0;
}

int main(int argc, char **argv) {
    long batch = 32, steps = 3, seed = 0;
    int summary = 0, i, z, which = -1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--summary")) summary = 1;
        else if (!strcmp(a, "--model") && v) {
            dt_zoo_model zm = DT_ZOO_MLP;
            if (strcmp(v, "all") && dt_zoo_parse(v, &zm) != DT_OK) { fprintf(stderr, "zoo: %s\n", dt_last_error()); usage(stderr); return 2; }
            which = strcmp(v, "all") ? (int)zm : -1;
            i++;
        } else if (!strcmp(a, "--batch") && v) {
            if ((batch = parse_long(v, 1, 1 << 20)) < 0) { fprintf(stderr, "zoo: --batch needs an integer in 1..1048576, got '%s'\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--steps") && v) {
            if ((steps = parse_long(v, 1, 1 << 20)) < 0) { fprintf(stderr, "zoo: --steps needs an integer >= 1, got '%s'\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            if ((seed = parse_long(v, 0, 0x7fffffffL)) < 0) { fprintf(stderr, "zoo: --seed needs an integer >= 0, got '%s'\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--tier") && v) {   /* the CPU kernels' tier (as DT_CPU=...) */
            if (dt_cpu_set_tier(v) != DT_OK) { fprintf(stderr, "zoo: %s\n", dt_last_error()); return 2; }
            i++;
        } else { fprintf(stderr, "zoo: unknown or incomplete flag '%s'\n", a); usage(stderr); return 2; }
    }
    printf("dtrain %s, %d threads, CPU tier %s\n", DT_VERSION_STRING, dt_cpu_threads(), dt_cpu_tier());
    for (z = 0; z < DT_ZOO_COUNT; z++)
        if ((which < 0 || which == z) && run_model((dt_zoo_model)z, batch, steps, summary, (unsigned long)seed)) return 1;
    return 0;
}
