/* bench_machine.c - this machine's limits, for the benchmark's ratios: the FP32 FMA peak with the widest
   vectors the CPU has (AVX-512, else AVX2+FMA, else scalar C) on dt_cpu_threads() threads, the bf16 peak
   (vdpbf16ps, where the CPU has AVX512_BF16: 4 FLOPs a lane, two products and two additions), and memory
   copy bandwidth. Median of 7 windows.

   usage: bench_machine
   Output, CSV: limit,value,unit  (peak_fma,<GFLOP/s>,GFLOP/s, peak_bf16 likewise where there is one, and
   memcpy,<GB/s>,GB/s; the ISA in a comment) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define DTRAIN_IMPLEMENTATION   /* here, not linked (Makefile): DT__OMP, the implementation's OpenMP macro */
#include "../dtrain.h"
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define X86 1
#endif

#define CHAINS 16        /* independent FMA chains: hide the FMA latency on two ports */
#define ITERS 20000000L

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#ifdef X86
__attribute__((target("avx512f"), noinline)) static float fma512(long n) {
    __m512 acc[CHAINS], a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
    float out[16];
    int j;
    long i;
    for (j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps((float)j);
    for (i = 0; i < n; i++)
        for (j = 0; j < CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
    for (j = 1; j < CHAINS; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
    _mm512_storeu_ps(out, acc[0]);
    return out[0];
}
__attribute__((target("avx2,fma"), noinline)) static float fma256(long n) {
    __m256 acc[12], a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);   /* 12 + 2 of 16 ymm */
    float out[8];
    int j;
    long i;
    for (j = 0; j < 12; j++) acc[j] = _mm256_set1_ps((float)j);
    for (i = 0; i < n; i++)
        for (j = 0; j < 12; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
    for (j = 1; j < 12; j++) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    _mm256_storeu_ps(out, acc[0]);
    return out[0];
}
#ifdef DT__X86_BF16
__attribute__((target("avx512f,avx512bf16"), noinline)) static float dp512(long n) {
    __m512 acc[CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);   /* 1, 1e-7 */
    float out[16];
    int j;
    long i;
    for (j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps((float)j);
    for (i = 0; i < n; i++)
        for (j = 0; j < CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    for (j = 1; j < CHAINS; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
    _mm512_storeu_ps(out, acc[0]);
    return out[0];
}
#endif
#endif
static float fma_scalar(long n) {
    float acc[CHAINS];
    int j;
    long i;
    for (j = 0; j < CHAINS; j++) acc[j] = (float)j;
    for (i = 0; i < n; i++)
        for (j = 0; j < CHAINS; j++) acc[j] = acc[j] * 0.9999999f + 1e-7f;
    return acc[0] + acc[CHAINS - 1];
}

int main(void) {
    int threads = dt_cpu_threads(), w, lanes = 1, chains = CHAINS;
    float (*fn)(long) = fma_scalar;
    const char *isa = "scalar";
    double g[7];
    size_t bytes = (size_t)256 << 20;
    char *src, *dst;
    volatile float sink = 0.0f;
#ifdef X86
    if (__builtin_cpu_supports("avx512f")) { fn = fma512; isa = "avx512"; lanes = 16; }
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) { fn = fma256; isa = "avx2"; lanes = 8; chains = 12; }
#endif
    for (w = 0; w < 7; w++) {
        double t0 = dt_time_now();
        DT__OMP(parallel)
        {
            float r = fn(ITERS);
            DT__OMP(atomic)
            sink += r;
        }
        g[w] = 2.0 * lanes * chains * (double)ITERS * threads / (dt_time_now() - t0) / 1e9;
    }
    qsort(g, 7, sizeof(double), cmp_double);
    printf("# FMA peak with %s on %d threads\npeak_fma,%.1f,GFLOP/s\n", isa, threads, g[3]);
#ifdef DT__X86_BF16
    if (dt__x86_bf16_runs()) {   /* what a bf16 model's GEMMs may reach (dtrain/cpu/cpu_x86.h) */
        for (w = 0; w < 7; w++) {
            double t0 = dt_time_now();
            DT__OMP(parallel)
            {
                float r = dp512(ITERS / 2);
                DT__OMP(atomic)
                sink += r;
            }
            g[w] = 4.0 * 16 * CHAINS * (double)(ITERS / 2) * threads / (dt_time_now() - t0) / 1e9;
        }
        qsort(g, 7, sizeof(double), cmp_double);
        printf("# bf16 peak with avx512_bf16 (vdpbf16ps) on %d threads\npeak_bf16,%.1f,GFLOP/s\n", threads, g[3]);
    }
#endif
    /* the kernels dtrain's programs run here, in this environment: $DT_CPU chooses another tier */
    printf("# dtrain's CPU tier: %s (DT_CPU=avx512, avx2, neon or portable chooses another)\n", dt_cpu_tier());
    src = (char *)malloc(bytes);
    dst = (char *)malloc(bytes);
    if (!src || !dst) { fprintf(stderr, "bench_machine: no memory for 2 x 256 MiB\n"); return 1; }
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    for (w = 0; w < 7; w++) {   /* each thread copies its slice */
        double t0 = dt_time_now();
        DT__OMP(parallel)
        {
            int tid = 0, nt = 1;
#if DT__HAVE_OMP
            tid = omp_get_thread_num();
            nt = omp_get_num_threads();
#endif
            memcpy(dst + bytes / (size_t)nt * (size_t)tid, src + bytes / (size_t)nt * (size_t)tid, bytes / (size_t)nt);
        }
        g[w] = (double)bytes / (dt_time_now() - t0) / 1e9;
    }
    qsort(g, 7, sizeof(double), cmp_double);
    printf("memcpy,%.1f,GB/s\n", g[3]);
    free(src);
    free(dst);
    return sink == 12345.0f;
}
