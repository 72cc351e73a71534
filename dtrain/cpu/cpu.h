/* dtrain/cpu/cpu.h - the CPU backend: the blocked GEMM, the choice of kernels, and dt_cpu_ops().   Part of
   dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The blocked GEMM (after Goto and van de Geijn: packing into panels that stay in the caches, a small
     register-tiled micro-kernel, threads that share nothing), in portable C; the tiers of kernels (the
     portable one defined here, with dtrain/cpu/cpu_vec.h's convolutions at the baseline ISA; "avx512" and
     "avx2" from dtrain/cpu/cpu_x86.h, "neon" from dtrain/cpu/cpu_arm.h), chosen once per process by the CPU's
     features or $DT_CPU, and dt_cpu_set_tier; the convolutions by taps (stride 1 on small images: a GEMM
     per tap and output row, none of the padding multiplied), on every tier; and the CPU's ops table: the
     ops of dtrain/core/tensor.h, with the chosen tier's kernels where it has them; and the busy-machine watch
     (dt__cpu_adapt: fewer OpenMP threads while they wait for a CPU).
   USES
     dtrain/cpu/cpu_x86.h, dtrain/cpu/cpu_arm.h, dtrain/cpu/cpu_vec.h and dtrain/core/tensor.h (and base.h), through
     what dtrain/cpu/kernel.h declares of them (the kernel table, the tiers' tables, tensor.h's plain ops).
   READ FIRST
     dt__gemm_part (the loops of the blocked GEMM), dt__pack_a and dt__pack_b, dt__micro (the portable
     micro-kernel), dt__pick_kernel (the choice), dt__tap_conv_fwd (the taps), dt__cpu_ops_table (the
     table a model calls).
*/
#ifndef DTRAIN_CPU_H
#define DTRAIN_CPU_H
#include "cpu_vec.h"
#include "cpu_x86.h"
#include "cpu_arm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU backend's ops table (OpenMP when compiled with it): a model's default, where no GPU is built in. */
const dt_ops *dt_cpu_ops(void);

/* CPU GEMM with the semantics of dt_ops.gemm: the blocked one, with the tier's micro-kernel (its plain twin
   is dt_gemm_ref). */
void dt_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* The CPU's kernels come in tiers: "avx512" and "avx2" (x86-64, dtrain/cpu/cpu_x86.h), "neon" (ARM64,
   dtrain/cpu/cpu_arm.h) and "portable" (C that every CPU runs, and that the others are tested against; its
   convolutions by shifted rows in vector extensions at the build's baseline, SSE2 or NEON, where GCC or
   Clang builds it). By default the fastest tier this CPU runs, or the one the environment variable DT_CPU
   names (avx512, avx2, neon, portable). The ops give the same results on every tier up to the order of
   long sums. */
const char *dt_cpu_tier(void);
/* Chooses the tier: "avx512", "avx2", "neon", "portable", or NULL / "auto" for the default.
   DT_ERR_INVALID_ARG for another name, DT_ERR_UNSUPPORTED when this CPU or build lacks the tier (the tier
   in use is then kept).
   Process-wide configuration, like dt_log_configure: call it before threads start. A model takes the tier
   of the moment at every op. */
dt_result dt_cpu_set_tier(const char *tier);

/* Threads on a busy machine. Where other programs hold some of the cores, the kernels' threads wait to run
   (and OpenMP's threads spin while they wait for each other), and a run slows several-fold: a student's laptop
   is always busy. So, on Linux, the CPU backend watches how long its threads wait for a CPU (the kernel's
   run-queue delay of each thread, /proc/thread-self/schedstat), every quarter second of a model's forward
   passes on the calling thread: when one of them waited more than a fifth of the window, twice
   in a row, the calling thread's OpenMP team gets one thread fewer (omp_set_num_threads), down to one; 2
   seconds later it tries one more again (after each try that finds the machine still busy, twice as long, up
   to 64 s) and keeps it while no thread waits. The results are the same bits with any number of threads
   (the kernels sum in a fixed order); only the speed changes. dt_cpu_threads() says the team of the moment;
   a team size the program sets itself (omp_set_num_threads) becomes the new most. Off where the environment
   variable DT_CPU_ADAPT is 0, without OpenMP, and where the platform has no such counter (macOS, Windows:
   there, OMP_WAIT_POLICY=passive is the remedy). dt_cpu_adapt_count() is how many times the calling
   thread's team was resized by it (for tests and logs; dt_log's debug level says each change and why). */
int64_t dt_cpu_adapt_count(void);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CPU_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_CPU_IMPLEMENTATION_DONE)
#define DTRAIN_CPU_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"
#include "kernel.h"   /* the kernel table, the tiers' tables, the plain ops of dtrain/core/tensor.h */

/* ---- the blocked GEMM ------------------------------------------------------------------------- */
/* Blocked GEMM after Goto & van de Geijn: for each (NC x KC) block of op(B), packed into NR-wide
   panels that stay in L2, and each (MC x KC) block of op(A), packed into MR-tall panels, an MR x NR
   micro-kernel accumulates in registers: each A panel (MR x KC, a few KiB) stays in L1 while the B panels
   stream past it from L2. Transposes are absorbed by the packing, so the micro-kernel sees one layout.
   Edges are zero-padded in the packed panels and clipped when written back. MR and NR are the
   micro-kernel's (chosen at run time for the CPU); KC, MC and NC are shared, and K and N are cut into
   blocks of equal size (at most KC, NC) so no block is a sliver. */
#ifndef DT__KC
#define DT__KC 256
#define DT__MC 1248
#define DT__NC 1152
#endif
#define DT__MR_MAX 16
#define DT__NR_MAX 48

#if DT__VEC && defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define DT__SHUFFLE 1
#endif
#endif
#ifdef DT__SHUFFLE
/* c[q] = column q of the 4 x 4 tile whose rows are the 4 floats at s, s + ld, s + 2 ld, s + 3 ld (4 loads, 8
   shuffles) */
static void dt__v4_turn4(const float *s, int64_t ld, dt__v4 c[4]) {
    dt__v4 r0 = dt__v4_load(s), r1 = dt__v4_load(s + ld), r2 = dt__v4_load(s + 2 * ld), r3 = dt__v4_load(s + 3 * ld);
    dt__v4 t0 = __builtin_shufflevector(r0, r1, 0, 4, 1, 5), t1 = __builtin_shufflevector(r0, r1, 2, 6, 3, 7);
    dt__v4 t2 = __builtin_shufflevector(r2, r3, 0, 4, 1, 5), t3 = __builtin_shufflevector(r2, r3, 2, 6, 3, 7);
    c[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5); c[1] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
    c[2] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5); c[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
}
#endif
/* A panel of n rows of src (row stride ld) turned into w-wide steps: dst[p * w + j] = src[j * ld + p] for
   p < kc, j < n, zero for n <= j < w (w at most 48). The portable transposing copy of the GEMM's packing
   (A's rows into MR-tall panels, B^T and im2col^T into NR-wide ones), and the twin of the tiers' pack_bt:
   with GNU C's shuffles, 4 x 4 tiles in registers (4 loads, 8 shuffles, 4 stores where an element at a
   time is a load and a store), the rest element by element. */
static void dt__pack_t(const float *src, int64_t ld, int64_t kc, int64_t n, float *DT__RESTRICT dst, int w) {
    int64_t p, j, j4 = 0, p4 = 0;
#ifdef DT__SHUFFLE
    p4 = kc / 4 * 4;
    for (; j4 + 4 <= n; j4 += 4)
        for (p = 0; p < p4; p += 4) {
            dt__v4 c[4];
            float *d = dst + p * w + j4;
            dt__v4_turn4(src + j4 * ld + p, ld, c);
            memcpy(d, &c[0], sizeof c[0]); memcpy(d + w, &c[1], sizeof c[1]); memcpy(d + 2 * w, &c[2], sizeof c[2]);
            memcpy(d + 3 * w, &c[3], sizeof c[3]);
        }
#endif
    for (j = 0; j < n; j++) {   /* what the tiles left: the last kc % 4 steps of their rows, and the rows after them */
        const float *s = src + j * ld;
        for (p = j < j4 ? p4 : 0; p < kc; p++) dst[p * w + j] = s[p];
    }
    for (p = 0; p < kc; p++)
        for (j = n; j < w; j++) dst[p * w + j] = 0.0f;
}

/* Ap: the mc x kc block of op(A) at (i0, p0) as MR-tall panels, each kc x MR (row p holds MR rows' values) */
static void dt__pack_a(const dt__kernel *kern, int ta, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
                       int64_t kc, float *Ap, int MR) {
    int64_t ir, p, i;
    const int fast = MR == 8 && !ta && kern->pack_a8;   /* 1: 8-tall panels by the tier's 8 x 8 transposes */
    for (ir = 0; ir < mc; ir += MR) {
        int64_t mr = mc - ir < MR ? mc - ir : MR, p8 = 0;
        float *dst = Ap + ir * kc;
        if (ta) {   /* op(A) = A^T: the MR values of a row p are contiguous in A */
            for (p = 0; p < kc; p++) {
                const float *src = A + (p0 + p) * lda + i0 + ir;
                if (mr == 8 && MR == 8) { for (i = 0; i < 8; i++) dst[p * 8 + i] = src[i]; continue; }
                for (i = 0; i < mr; i++) dst[p * MR + i] = src[i];
                for (; i < MR; i++) dst[p * MR + i] = 0.0f;
            }
            continue;
        }
        if (fast && mr == 8) {
            p8 = kc / 8 * 8;
            kern->pack_a8(A + (i0 + ir) * lda + p0, lda, p8, dst);
        }
        dt__pack_t(A + (i0 + ir) * lda + p0 + p8, lda, kc - p8, mr, dst + p8 * MR, MR);   /* (the rest) */
    }
}

/* rows of B [rows, nc] (row stride ldb) into the NR-wide panels of a kc-row block (dst: the first row's
   place in the first panel): row by row, so the reads stream through memory in order instead of hopping
   between kc rows for every panel */
static void dt__pack_b_rows(const float *B, int64_t ldb, int64_t rows, int64_t nc, float *dst, int64_t kc, int NR) {
    int64_t p, jr, j, full = nc / NR * NR;
    for (p = 0; p < rows; p++, dst += NR) {
        const float *src = B + p * ldb;
        if (NR == 48)   /* the AVX-512 kernel's panels: a copy of constant length, unrolled */
            for (jr = 0; jr < full; jr += 48) {
                float *d = dst + jr * kc;
                for (j = 0; j < 48; j++) d[j] = src[jr + j];
            }
        else
            for (jr = 0; jr < full; jr += NR) {
                float *d = dst + jr * kc;
                for (j = 0; j < NR; j++) d[j] = src[jr + j];
            }
        if (full < nc) {
            float *d = dst + full * kc;
            for (j = 0; j < nc - full; j++) d[j] = src[full + j];
            for (; j < NR; j++) d[j] = 0.0f;
        }
    }
}

/* Bp: the kc x nc block of op(B) at (p0, j0) as NR-wide panels, each kc x NR; tmp: KC x NR_MAX floats of
   scratch (at least NC: a row of the block) */
static void dt__pack_b(const dt__kernel *kern, const dt__bsrc *bs, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float *Bp,
                       int NR, float *tmp) {
    const float *B = bs->B;
    const dt_conv_geom *g = bs->g;
    int64_t jr, ldb = bs->ldb;
    /* the tier's transposing copy where it has one for these panels, else the portable one */
    void (*pack_t)(const float *, int64_t, int64_t, int64_t, float *, int) = NR % 16 == 0 && kern->pack_bt ? kern->pack_bt : dt__pack_t;
    for (jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR, p, j;
        float *dst = Bp + jr * kc;
        if (g && !bs->tb) {         /* rows p: col rows p0 + p from output position j0 on, each whole into tmp */
            int64_t S = g->oh * g->ow, n = j0 / S, oy = j0 % S / g->ow, ox = j0 % g->ow;
            int64_t c = p0 / (g->kh * g->kw), ky = p0 / g->kw % g->kh, kx = p0 % g->kw;
            for (p = 0; p < kc; p++) {
                dt__col_span(kern, g, B, c, ky, kx, n, oy, ox, nc, tmp, 1);
                dt__pack_b_rows(tmp, nc, 1, nc, Bp + p * NR, kc, NR);
                if (++kx == g->kw) { kx = 0; if (++ky == g->kh) { ky = 0; c++; } }
            }
            return;
        } else if (g) {             /* columns j: col rows j0 + jr + j, each read from output position p0 on into tmp */
            int64_t S = g->oh * g->ow, n = p0 / S, oy = p0 % S / g->ow, ox = p0 % g->ow;
            for (j = 0; j < nr; j++) {
                int64_t k = j0 + jr + j;
                dt__col_span(kern, g, B, k / (g->kh * g->kw), k / g->kw % g->kh, k % g->kw, n, oy, ox, kc, tmp + j * kc, 1);
            }
            pack_t(tmp, kc, kc, nr, dst, NR);   /* then turned, as B^T's rows below */
        } else if (!bs->tb) {       /* rows of B are contiguous along n: read each whole, for every panel */
            dt__pack_b_rows(B + p0 * ldb + j0, ldb, kc, nc, Bp, kc, NR);
            return;
        } else {                    /* op(B) = B^T: rows of B along k, turned */
            pack_t(B + (j0 + jr) * ldb + p0, ldb, kc, nr, dst, NR);
        }
    }
}

/* The portable micro-kernel, 6 x 8: c[6][8] = sum_p a[p][:] x b[p][:]; then C = alpha c + beta C.
   With GCC and Clang (GNU C's vector types, which need no intrinsics and no -march): the 6 x 8 tile is 12
   vectors of 4 floats that stay in registers, each step 2 loads of b, 6 broadcasts of a and 12 multiplies
   and 12 adds: x86-64's baseline (SSE2, 16 xmm registers: 12 accumulators, 2 of b, 1 of a) gets movups,
   shufps, mulps and addps and nothing on the stack, at -O2 and -O3 alike; aarch64 gets fmul and fadd by
   lane (fmla only where the compiler may contract: gcc -std=c11 does not; the neon tier of cpu_arm.h has
   it). Written as loops over the tile, gcc keeps the accumulators in memory (-O2 unrolls no loop) or
   vectorises across the rows with shuffles (-O3): 2 GFLOP/s against 30-38 on this machine's core.
   DT_NO_SIMD, or another compiler: the same tile in plain loops (DT__VEC, dtrain/core/tensor.h). Each element
   of c is summed in order of p, one rounding per multiply and per add. */
#if DT__VEC
static void dt__micro(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                      int64_t mr, int64_t nr, float alpha, float beta) {
    const dt__v4 z = {0.0f, 0.0f, 0.0f, 0.0f};
    dt__v4 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
    float c[6][8];
    int64_t p;
    for (p = 0; p < kc; p++, a += 6, b += 8) {
        dt__v4 b0 = dt__v4_load(b), b1 = dt__v4_load(b + 4);
        c00 += a[0] * b0; c01 += a[0] * b1;
        c10 += a[1] * b0; c11 += a[1] * b1;
        c20 += a[2] * b0; c21 += a[2] * b1;
        c30 += a[3] * b0; c31 += a[3] * b1;
        c40 += a[4] * b0; c41 += a[4] * b1;
        c50 += a[5] * b0; c51 += a[5] * b1;
    }
    memcpy(c[0], &c00, 16); memcpy(c[0] + 4, &c01, 16); memcpy(c[1], &c10, 16); memcpy(c[1] + 4, &c11, 16);
    memcpy(c[2], &c20, 16); memcpy(c[2] + 4, &c21, 16); memcpy(c[3], &c30, 16); memcpy(c[3] + 4, &c31, 16);
    memcpy(c[4], &c40, 16); memcpy(c[4] + 4, &c41, 16); memcpy(c[5], &c50, 16); memcpy(c[5] + 4, &c51, 16);
    dt__micro_store(&c[0][0], 8, C, ldc, mr, nr, alpha, beta);
}
#else
static void dt__micro(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                      int64_t mr, int64_t nr, float alpha, float beta) {
    float c[6][8];
    int64_t p, i, j;
    memset(c, 0, sizeof c);
    for (p = 0; p < kc; p++)
        for (i = 0; i < 6; i++)
            for (j = 0; j < 8; j++) c[i][j] += a[p * 6 + i] * b[p * 8 + j];
    dt__micro_store(&c[0][0], 8, C, ldc, mr, nr, alpha, beta);
}
#endif

/* ---- the tiers ------------------------------------------------------------------------------ */
/* The portable tier: the micro-kernel above and the portable code of every other entry, but for the
   convolutions by shifted rows of dtrain/cpu/cpu_vec.h at the build's baseline ISA where GCC or Clang builds
   them (SSE2 on x86-64, NEON on aarch64) */
#ifdef DT__VEC_BASE
#define DT__BASE_CONV_FWD dt__vec_conv_fwd_base
#define DT__BASE_CONV_BWD dt__vec_conv_bwd_base
#else
#define DT__BASE_CONV_FWD NULL
#define DT__BASE_CONV_BWD NULL
#endif
static const dt__kernel dt__kernel_portable = {
    "portable", NULL, dt__micro, 6, 8, NULL, NULL, NULL, NULL, NULL, NULL, DT__BASE_CONV_FWD, DT__BASE_CONV_BWD, NULL, NULL, NULL
};
/* Every tier of this build, fastest first */
static const dt__kernel *const dt__kernels[] = {
    DT__X86_KERNELS DT__ARM_KERNELS   /* those the build compiles (dtrain/cpu/kernel.h) */
    &dt__kernel_portable,
};
#define DT__NKERNELS ((int)(sizeof dt__kernels / sizeof dt__kernels[0]))
/* 1 when this CPU runs dt__kernels[k] */
static int dt__kernel_ok(int k) {
    return k >= 0 && k < DT__NKERNELS && (!dt__kernels[k]->runs || dt__kernels[k]->runs());
}
/* the tier named (index into dt__kernels), -1 for a name of no tier, -2 for a tier this build lacks */
static int dt__kernel_find(const char *name) {
    int k;
    for (k = 0; k < DT__NKERNELS; k++)
        if (!strcmp(name, dt__kernels[k]->name)) return k;
    return !strcmp(name, "avx512") || !strcmp(name, "avx2") || !strcmp(name, "neon") ? -2 : -1;
}
/* The tier in use: chosen once, at the first call that needs it (CPU features and $DT_CPU are read once),
   or set by dt_cpu_set_tier. */
static const dt__kernel *dt__kernel_chosen;
static const dt__kernel *dt__kernel_default(void) {
    const char *env = getenv("DT_CPU");
    int k = 0;
    if (env && *env && strcmp(env, "auto") != 0) {
        int want = dt__kernel_find(env);
        if (want >= 0 && dt__kernel_ok(want)) return dt__kernels[want];
        while (!dt__kernel_ok(k)) k++;
        dt_log(DT_LOG_WARN, "DT_CPU=%s: %s; using %s", env,
               want == -1 ? "not a CPU tier (avx512, avx2, neon, portable)" : "this CPU or build cannot run it", dt__kernels[k]->name);
        return dt__kernels[k];
    }
    while (!dt__kernel_ok(k)) k++;   /* the last, portable, always runs */
    return dt__kernels[k];
}
static const dt__kernel *dt__pick_kernel(void) {
    const dt__kernel *k = DT__ATOMIC_LOAD(&dt__kernel_chosen);
    if (!k) {
        k = dt__kernel_default();
        DT__ATOMIC_STORE(&dt__kernel_chosen, k);
    }
    return k;
}
const char *dt_cpu_tier(void) { return dt__pick_kernel()->name; }

/* ---- Threads on a busy machine (dt_cpu_adapt_count's comment) ------------------------------------------- */
#if DT__HAVE_OMP && defined(__linux__) && !defined(DT_NO_THREADS)
#define DT__ADAPT 1
#else
#define DT__ADAPT 0
#endif
/* the calling thread's watch over its team: each thread that starts parallel regions has its own */
typedef struct dt__adapt_state {
    int state;             /* 0: not started, 1: watching, -1: off */
    int most, cur;         /* the team size the program set, and the one in use */
    int over;              /* windows in a row in which a thread waited too long */
    int trying;            /* this window runs one thread more than the last that waited */
    int64_t changes;       /* dt_cpu_adapt_count */
    double t0, retry_at, backoff, window;
    double delay0[64];     /* each team thread's run-queue delay (s) at t0 */
} dt__adapt_state;
static DT__THREAD_LOCAL dt__adapt_state dt__adapt;
static double dt__team_delay(int n, double *d);
/* where the watch reads the time and the team's delays (tests put a script of both here) */
static double (*dt__adapt_clock)(void) = dt_time_now;
static double (*dt__adapt_delays)(int n, double *d) = dt__team_delay;
#if DT__ADAPT
/* seconds of run-queue delay of the calling thread so far (the second number of its schedstat), -1 if unknown */
static double dt__thread_delay(void) {
    double run = 0, wait = -1;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return -1;
    if (fscanf(f, "%lf %lf", &run, &wait) != 2) wait = -1;
    fclose(f);
    return wait < 0 ? -1 : wait * 1e-9;
}
#endif
/* each thread of a team of n reads its own delay (seconds so far) into d[]; 0, or -1 where a delay is unknown */
static double dt__team_delay(int n, double *d) {
#if DT__ADAPT
    int i;
    DT__OMP(parallel num_threads(n) if (n > 1))
    {
        int t = omp_get_thread_num();
        if (t < 64) d[t] = dt__thread_delay();
    }
    for (i = 0; i < n && i < 64; i++)
        if (d[i] < 0) return -1;
    return 0;
#else
    (void)n; (void)d;
    return -1;
#endif
}
static void dt__adapt_set(dt__adapt_state *a, int n, double now, const char *why, double frac) {
#if DT__ADAPT
    dt_log(DT_LOG_DEBUG, "cpu: %d threads -> %d (%s: a thread waited %.0f%% of %.2f s for a CPU)", a->cur, n, why,
           100 * frac, a->window);
    omp_set_num_threads(n);
#else
    (void)why; (void)frac;
#endif
    a->cur = n;
    a->changes++;
    a->over = 0;
    a->t0 = now;
    if (dt__adapt_delays(n, a->delay0) < 0) a->state = -1;
}
/* called by a CPU model's forward pass: once a window, the team's waits decide its size */
static void dt__cpu_adapt(void) {
    dt__adapt_state *a = &dt__adapt;
    double now, frac = 0;
    int i;
    if (a->state < 0) return;
    now = dt__adapt_clock();
    if (a->state == 0) {
        const char *env = getenv("DT_CPU_ADAPT");
        a->state = -1;
        a->most = a->cur = dt_cpu_threads();
        if (!DT__ADAPT || (env && !strcmp(env, "0")) || a->most < 2 || a->most > 64) return;
        if (a->window <= 0) a->window = 0.25;
        a->state = 1;
        a->backoff = 8 * a->window;
        a->t0 = now;
        if (dt__adapt_delays(a->cur, a->delay0) < 0) a->state = -1;
        return;
    }
    if (now - a->t0 < a->window) return;
    if (dt_cpu_threads() != a->cur) {   /* the program set another size: that is the most now */
        a->most = a->cur = dt_cpu_threads();
        a->trying = 0;
        a->over = 0;
        if (a->most < 2 || a->most > 64 || dt__adapt_delays(a->cur, a->delay0) < 0) a->state = -1;
        a->t0 = now;
        return;
    }
    {
        double d[64] = {0};   /* once a window, not at every forward pass */
        if (dt__adapt_delays(a->cur, d) < 0) { a->state = -1; return; }
        for (i = 0; i < a->cur; i++) {   /* a growth outside [0, the window] is another OS thread's: left out */
            double g = d[i] - a->delay0[i];
            if (g >= 0 && g <= now - a->t0 && g / (now - a->t0) > frac) frac = g / (now - a->t0);
        }
        memcpy(a->delay0, d, sizeof(double) * (size_t)a->cur);
    }
    a->t0 = now;
    if (a->trying) {   /* one thread more for a window: kept while nobody waits */
        a->trying = 0;
        if (frac > 0.2) {
            a->backoff = a->backoff * 2 > 64 ? 64 : a->backoff * 2;
            a->retry_at = now + a->backoff;
            dt__adapt_set(a, a->cur - 1, now, "still busy", frac);
        } else {
            a->backoff = 8 * a->window;
            a->retry_at = now + a->backoff;
        }
        return;
    }
    if (frac > 0.2) {
        if (++a->over >= 2 && a->cur > 1) {
            a->retry_at = now + a->backoff;
            dt__adapt_set(a, a->cur - 1, now, "busy", frac);
        }
        return;
    }
    a->over = 0;
    if (a->cur < a->most && now >= a->retry_at) {
        dt__adapt_set(a, a->cur + 1, now, "trying one more", frac);
        a->trying = 1;
    }
}
/* the team size to size workspaces for: the most the watch may return to */
static int dt__cpu_threads_most(void) {
    return dt__adapt.state == 1 && dt__adapt.most > dt_cpu_threads() ? dt__adapt.most : dt_cpu_threads();
}
int64_t dt_cpu_adapt_count(void) { return dt__adapt.changes; }
dt_result dt_cpu_set_tier(const char *tier) {
    int k;
    if (!tier || !strcmp(tier, "auto")) {
        DT__ATOMIC_STORE(&dt__kernel_chosen, dt__kernel_default());
        return DT_OK;
    }
    k = dt__kernel_find(tier);
    if (k == -1)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_cpu_set_tier: '%s' is not a CPU tier: use avx512, avx2 (x86-64), neon (aarch64), portable or auto", tier);
    if (k == -2)
        return dt_set_error(DT_ERR_UNSUPPORTED, "dt_cpu_set_tier(%s): this build has no such kernels (not %s with GCC or Clang, "
                            "or DT_NO_SIMD); the tier stays %s", tier, strcmp(tier, "neon") ? "x86-64" : "aarch64", dt_cpu_tier());
    if (!dt__kernel_ok(k))
        return dt_set_error(DT_ERR_UNSUPPORTED, "dt_cpu_set_tier(%s): this CPU lacks its instructions; the tier stays %s", tier,
                            dt_cpu_tier());
    DT__ATOMIC_STORE(&dt__kernel_chosen, dt__kernels[k]);
    return DT_OK;
}

/* ---- the GEMM's threads and workspace --------------------------------------------------------- */
/* Floats of packing workspace the blocked GEMM needs with `threads` threads: a packed B block, a packed
   A block and a B panel of scratch per thread; and how many threads `count` floats serve. */
#define DT__GEMM_WS_THREAD ((int64_t)DT__KC * (DT__NC + 2 * DT__NR_MAX + DT__MC + DT__MR_MAX))
static int64_t dt__gemm_ws_count(int threads) { return (int64_t)threads * DT__GEMM_WS_THREAD; }
static int dt__gemm_ws_threads(int64_t count) { return (int)(count / DT__GEMM_WS_THREAD); }

/* One thread's share of the blocked GEMM: C[m0:m1, n0:n1], with its own packing space Bp, Ap and tmp.
   The K blocks depend on K alone, so each element of C is summed in the same order whatever the share.
   bf16 (the tier's bf16_runs said yes): each packed panel is turned into bf16 pairs where it lies, and the
   tier's bf16 micro-kernel multiplies them, so the operands are converted once per block, as they are packed. */
static void dt__gemm_part(const dt__kernel *kern, int bf16, float *Bp, float *Ap, float *tmp, int ta, int64_t m0, int64_t m1, int64_t n0,
                          int64_t n1, int64_t K, float alpha, const float *A, int64_t lda, const dt__bsrc *bs, float beta, float *C,
                          int64_t ldc) {
    const int MR = kern->mr, NR = kern->nr;
    const dt__micro_fn fn = bf16 ? kern->bf16_fn : kern->fn;
    int64_t k16 = (K + 15) / 16, nkb = (k16 + DT__KC / 16 - 1) / (DT__KC / 16);   /* K blocks: whole 16s but the last */
    int64_t npan = (n1 - n0 + NR - 1) / NR, nnb = (npan * NR + DT__NC - 1) / DT__NC;
    int64_t ncb = (npan + nnb - 1) / nnb * NR, jc, kb, ic, jr, ir;
    for (kb = 0; kb < nkb; kb++) {   /* K outermost: with one block of A's rows, A is packed once per K block */
        int64_t pc = 16 * (k16 * kb / nkb), kc = (kb + 1 == nkb ? K : 16 * (k16 * (kb + 1) / nkb)) - pc;
        float bet = kb == 0 ? beta : 1.0f;
        for (jc = n0; jc < n1; jc += ncb) {
            int64_t nc = n1 - jc < ncb ? n1 - jc : ncb;
            int64_t kp = bf16 ? (kc + 1) / 2 : kc;   /* the micro-kernel's steps */
            dt__pack_b(kern, bs, pc, kc, jc, nc, Bp, NR, tmp);
            for (jr = 0; bf16 && jr < nc; jr += NR) kern->bf16_pair(Bp + jr * kc, kc, NR);
            for (ic = m0; ic < m1; ic += DT__MC) {
                int64_t mc = m1 - ic < DT__MC ? m1 - ic : DT__MC;
                if (jc == n0 || m1 - m0 > DT__MC) {
                    dt__pack_a(kern, ta, A, lda, ic, mc, pc, kc, Ap, MR);
                    for (ir = 0; bf16 && ir < mc; ir += MR) kern->bf16_pair(Ap + ir * kc, kc, MR);
                }
                for (ir = 0; ir < mc; ir += MR) {        /* A's panel stays in L1 ... */
                    int64_t mr = mc - ir < MR ? mc - ir : MR;
                    for (jr = 0; jr < nc; jr += NR) {    /* ... while B's stream from L2 */
                        int64_t nr = nc - jr < NR ? nc - jr : NR;
                        fn(kp, Ap + ir * kc, Bp + jr * kc, C + (ic + ir) * ldc + jc + jr, ldc, mr, nr, alpha, bet);
                    }
                }
            }
        }
    }
}

/* The blocked GEMM with the kernels of tier kern on at most `threads` threads, on a caller's workspace of
   dt__gemm_ws_count(threads) floats. The threads share nothing: each takes a stretch of C's columns (of
   its rows when C is narrow) and packs what it reads, so no thread ever waits for another inside the GEMM
   (on a busy machine, a barrier waits for the slowest thread's time slice). */
static void dt__gemm_with(const dt__kernel *kern, int bf16, float *ws, int threads, int ta, int64_t M, int64_t N, int64_t K, float alpha,
                          const float *A, int64_t lda, const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    const int MR = kern->mr, NR = kern->nr;
    int64_t npanels = (N + NR - 1) / NR, mpanels = (M + MR - 1) / MR;
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        int64_t i, j;
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    if ((double)M * (double)N * (double)K < 4.0 * DT__PAR_MIN * 64) threads = 1;   /* too small to share */
    (void)threads;   /* without OpenMP */
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0, nt = 1;
        int64_t m0 = 0, m1 = M, n0 = 0, n1 = N;
        float *Bp;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        Bp = ws + (int64_t)tid * DT__GEMM_WS_THREAD;
        /* columns when there are enough and C is at least as wide as tall (each thread then packs all of A,
           the smaller), else rows (each packs all of B) */
        if (npanels >= 4 * (int64_t)nt ? N >= M || mpanels < 4 * (int64_t)nt : mpanels < 4 * (int64_t)nt && npanels >= mpanels) {
            /* in 16s (the AVX-512 kernel runs a stretch's last 16 or 32 columns with only the vectors it
               keeps), so the stretches are even */
            int64_t u = NR % 16 == 0 ? 16 : NR, nu = (N + u - 1) / u;
            n0 = nu * tid / nt * u;
            n1 = nu * (tid + 1) / nt * u;
            if (n1 > N) n1 = N;
        } else {
            m0 = mpanels * tid / nt * MR;
            m1 = mpanels * (tid + 1) / nt * MR;
            if (m1 > M) m1 = M;
        }
        if (m0 < m1 && n0 < n1)
            dt__gemm_part(kern, bf16, Bp, Bp + (int64_t)DT__KC * (DT__NC + DT__NR_MAX), Bp + (int64_t)DT__KC * (DT__NC + DT__NR_MAX + DT__MC + DT__MR_MAX),
                          ta, m0, m1, n0, n1, K, alpha, A, lda, bs, beta, C, ldc);
    }
}

/* op(A) op(B) by the blocked GEMM with the tier's kernels, on workspace ws of `count` floats,
   or on a fresh one when ws is NULL; by the unblocked one when there is no memory for that. bf16: the operands
   are bf16 values (a bf16 model's), which the tier multiplies as bf16 pairs where this CPU can. */
static int dt__gemm_bf16(const dt__kernel *k) { return k->bf16_fn && k->bf16_runs && k->bf16_runs(); }
static void dt__gemm_src(int bf16, float *ws, int64_t count, int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    const dt__kernel *kern = dt__pick_kernel();
    int threads = dt_cpu_threads();
    float *own = NULL;
    if (M <= 0 || N <= 0) return;
    if (ws && dt__gemm_ws_threads(count) < threads) threads = dt__gemm_ws_threads(count);
    if (!ws || threads < 1) {
        threads = dt_cpu_threads();
        if (!(ws = own = (float *)DT_MALLOC(sizeof(float) * (size_t)dt__gemm_ws_count(threads)))) {
            dt__gemm_ref_src(ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
            return;
        }
    }
    dt__gemm_with(kern, bf16 && dt__gemm_bf16(kern), ws, threads, ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
    if (own) DT_FREE(own);
}

void dt_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__gemm_src(0, NULL, 0, ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}

/* GEMM on the state's workspace (without state, on a fresh one) */
static void dt__cpu_gemm_src(void *ctx, int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                             const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    dt__gemm_src(st && st->bf16, st ? st->gemm_ws : NULL, st ? st->gemm_ws_count : 0, ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
}
static void dt__cpu_gemm(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__cpu_gemm_src(ctx, ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}

/* The convolution's GEMMs with im2col(x) packed straight from the images: t = W col and dW += t col^T */
static void dt__cpu_conv_gemm_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, float *t) {
    int64_t ckk = g->c * g->kh * g->kw, ns = g->n * g->oh * g->ow;
    dt__bsrc bs;
    bs.B = x; bs.ldb = 0; bs.tb = 0; bs.g = g;
    dt__cpu_gemm_src(ctx, 0, g->oc, ns, ckk, 1.0f, W, ckk, &bs, 0.0f, t, ns);
}
static void dt__cpu_conv_gemm_wgrad(void *ctx, const dt_conv_geom *g, const float *x, const float *t, float *dW) {
    int64_t ckk = g->c * g->kh * g->kw, ns = g->n * g->oh * g->ow;
    dt__bsrc bs;
    bs.B = x; bs.ldb = 0; bs.tb = 1; bs.g = g;
    dt__cpu_gemm_src(ctx, 0, g->oc, ckk, ns, 1.0f, t, ns, &bs, 1.0f, dW, ckk);
}
/* The input gradient of a stride-1 convolution is itself a convolution, of dy with the flipped and
   transposed kernel W'[c][o][kh-1-ky][kw-1-kx] = W[o][c][ky][kx] and padding kh-1-ph x kw-1-pw (so neither
   padding may pass k - 1; 0 is returned for strides or such padding): t [c, n*h*w] = W' im2col(dy), then
   dx += t as [n, c, h, w]. The GEMM packs from dy, so nothing im2col-sized is written or scattered. */
static int dt__cpu_conv_gemm_dgrad(void *ctx, const dt_conv_geom *g, const float *W, const float *dy, float *dx, float *ws,
                                   int64_t ws_count) {
    int64_t kk = g->kh * g->kw, hw = g->h * g->w, wn = g->c * g->oc * kk, i;
    dt_conv_geom gt = *g;
    dt__bsrc bs;
    float *Wt = ws, *t = ws + wn;
    if (g->sh != 1 || g->sw != 1 || g->ph > g->kh - 1 || g->pw > g->kw - 1 || wn + g->c * g->n * hw > ws_count) return 0;
    gt.c = g->oc; gt.h = g->oh; gt.w = g->ow; gt.oc = g->c; gt.ph = g->kh - 1 - g->ph; gt.pw = g->kw - 1 - g->pw;
    gt.oh = g->h; gt.ow = g->w;
    DT__OMP(parallel for if (wn > DT__PAR_MIN))
    for (i = 0; i < g->c * g->oc; i++) {   /* i = c * oc + o: Wt[c][o] is W[o][c] turned by 180 degrees */
        const float *src = W + ((i % g->oc) * g->c + i / g->oc) * kk;
        int64_t k;
        for (k = 0; k < kk; k++) Wt[i * kk + k] = src[kk - 1 - k];
    }
    bs.B = dy; bs.ldb = 0; bs.tb = 0; bs.g = &gt;
    dt__cpu_gemm_src(ctx, 0, g->c, g->n * hw, g->oc * kk, 1.0f, Wt, g->oc * kk, &bs, 0.0f, t, g->n * hw);
    DT__OMP(parallel for if (g->n * g->c * hw > DT__PAR_MIN))
    for (i = 0; i < g->n * g->c; i++) {   /* i = n * c + ch */
        int64_t n = i / g->c, ch = i % g->c, s;
        float *d = dx + i * hw;
        const float *src = t + (ch * g->n + n) * hw;
        for (s = 0; s < hw; s++) d[s] += src[s];
    }
    return 1;
}

/* ---- convolutions by taps: the stride-1 convolutions of small images, without the padding's zeros ---- */
/* On a small image much of im2col is padding (3 x 3, padding 1: 16% at 8 x 8, 31% at 4 x 4, 56% at 2 x 2),
   and the packed GEMM multiplies those zeros like any other value. A stride-1 convolution is also a sum over
   its kh * kw taps of 1 x 1 convolutions of shifted images, and tap (ky, kx) reads a real pixel exactly on
   the outputs (oy, ox) with oy + ky - ph in [0, h) and ox + kx - pw in [0, w): a rectangle. With the images
   of a chunk laid out as [c][h][w][nb] (the batch innermost), one output row's span of that rectangle is,
   for every image at once, a contiguous stretch of nb * span floats in every channel, so each (tap, output
   row) is one plain GEMM on strided views of the operands (and all the rows of a tap whose span is every
   column of the output and of the image, contiguous together, one GEMM):
     forward          yt[:, oy, span, :]  += W'[tap] (oc x c)    xt[:, iy, span', :]
     input gradient   dxt[:, iy, span', :] += W'[tap]^T (c x oc)  dyt[:, oy, span, :]
     weight gradient  dW'[tap] (oc x c)    += dyt[:, oy, span, :]  xt[:, iy, span', :]^T
   with W'[tap][o][c] = W[o][c][tap] laid out once per call, and dW[o][c][tap] += dW'[tap][o][c] at the end.
   The operands are the model's convolution workspace (dt__cpu_state.conv_ws, sized by dt__tap_ws in
   dt__reserve), the GEMMs' packing space theirs. Each output is summed in one order (the taps in order,
   each by the blocked GEMM, whose sums do not depend on the thread count), whatever the threads. */
/* the share of im2col's entries that must be padding for the taps to pay (the tests set 0 to run every
   stride-1 geometry through them): VGG-11's 8 x 8 layers (16%) gain 4-10% of its step on every tier, and
   the 16 x 16 ones (8%) take the shifted rows */
static double dt__tap_min_zeros = 0.1;
/* the fewest floats of a channel in a GEMM's piece (its span times the chunk's images) for the taps to pay:
   narrower pieces fill little of the micro-kernel's width (VGG-11 at 4 images, its 2 x 2 corner taps 4
   floats wide, lost 23% at AVX-512; with this bound, from 8 images on it loses nothing) */
static int64_t dt__tap_min_len = 32;
static DT__MAYBE_UNUSED DT__THREAD_LOCAL int64_t dt__tap_taken;   /* calls that took them on this thread (for the tests) */
#ifdef DT__TEST_HOOKS   /* the test programs' handles (tests/dt_test_hooks.h; compiled in by tests/impl_test.c) */
int64_t *dt__test_tap_min_len(void);
int64_t dt__test_tap_taken(void);
int dt__test_tier_shifts(void);
int64_t *dt__test_tap_min_len(void) { return &dt__tap_min_len; }
int64_t dt__test_tap_taken(void) { return dt__tap_taken; }
int dt__test_tier_shifts(void) { return dt__pick_kernel()->conv_fwd != NULL; }   /* the tier has shifted convolutions */
#endif

/* the outputs [lo, hi) of one dimension at which tap k reads a real pixel (input = output + k - pad) */
static void dt__tap_range(int64_t k, int64_t pad, int64_t in, int64_t out, int64_t *lo, int64_t *hi) {
    *lo = pad - k > 0 ? pad - k : 0;
    *hi = in + pad - k < out ? in + pad - k : out;
    if (*hi < *lo) *hi = *lo;
}
/* 1 when the taps take g: stride 1 on both axes, padding at most kh - 1 x kw - 1 (so the input gradient's view
   holds too), and at least dt__tap_min_zeros of im2col padding */
static int dt__tap_fits(const dt_conv_geom *g) {
    int64_t k, lo, hi, ry = 0, rx = 0;
    if (g->sh != 1 || g->sw != 1 || g->ph > g->kh - 1 || g->pw > g->kw - 1) return 0;
    for (k = 0; k < g->kh; k++) { dt__tap_range(k, g->ph, g->h, g->oh, &lo, &hi); ry += hi - lo; }
    for (k = 0; k < g->kw; k++) { dt__tap_range(k, g->pw, g->w, g->ow, &lo, &hi); rx += hi - lo; }
    return (double)ry * (double)rx <= (1.0 - dt__tap_min_zeros) * (double)(g->kh * g->kw * g->oh * g->ow);
}
/* Floats of workspace: the fixed part (W' and dW') and one image's (xt, then dxt in its place; yt or dyt) */
static int64_t dt__tap_fixed(const dt_conv_geom *g) { return 2 * g->kh * g->kw * g->oc * g->c; }
static int64_t dt__tap_image(const dt_conv_geom *g) { return g->c * g->h * g->w + g->oc * g->oh * g->ow; }
/* the narrowest span of a tap's output row, in pixels */
static int64_t dt__tap_min_span(const dt_conv_geom *g) {
    int64_t k, lo, hi, m = g->ow;
    for (k = 0; k < g->kw; k++) {
        dt__tap_range(k, g->pw, g->w, g->ow, &lo, &hi);
        if (hi > lo && hi - lo < m) m = hi - lo;
    }
    return m;
}
/* The convolution workspace dt__reserve gives g (g->n images) for the taps: 0 when they do not take g, its
   pieces are too narrow even with every image in one chunk, or their copies of the weights would exceed
   DT_CONV_WORKSPACE (the GEMMs then take g, unless another layer's workspace holds the taps' anyway); else
   room for chunks of images as large as DT_CONV_WORKSPACE allows (at least one image, at most all) */
static int64_t dt__tap_ws(const dt_conv_geom *g) {
    int64_t per = dt__tap_image(g), nb = DT_CONV_WORKSPACE / per;
    if (!dt__tap_fits(g) || dt__tap_fixed(g) > DT_CONV_WORKSPACE || dt__tap_min_span(g) * g->n < dt__tap_min_len) return 0;
    if (nb > g->n) nb = g->n;
    return dt__tap_fixed(g) + (nb < 1 ? 1 : nb) * per;
}
/* Images per chunk on the state's workspace, 0 when the taps do not take g there */
static int64_t dt__tap_chunk(const dt__cpu_state *st, const dt_conv_geom *g) {
    int64_t nb;
    if (!st || !st->conv_ws || !dt__tap_fits(g)) return 0;
    nb = (st->conv_ws_count - dt__tap_fixed(g)) / dt__tap_image(g);
    if (nb > g->n) nb = g->n;
    return nb < 1 || dt__tap_min_span(g) * nb < dt__tap_min_len ? 0 : nb;
}

/* dst [cols][rows] = src [rows][cols]^T (+ bias[i / s] for src's row i), or += it with add: the layout
   changes between [nb][c h w] and [c h w][nb]. In blocks of 32 x 32, whose rows stay in L1 even when both
   strides are powers of two (8 rows of each side at a time, which 8 ways hold); with GNU C's shuffles, 4 x 4
   tiles in registers (dt__v4_turn4, as dt__pack_t). */
static void dt__tap_turn_block(const float *DT__RESTRICT src, int64_t rows, int64_t cols, float *DT__RESTRICT dst, const float *bias,
                               int64_t s, int add, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    int64_t i, j, i4 = i0, j4 = j1;
#ifdef DT__SHUFFLE
    for (; i4 + 4 <= i1; i4 += 4) {
        dt__v4 bv = {0.0f, 0.0f, 0.0f, 0.0f};
        if (bias) { bv[0] = bias[i4 / s]; bv[1] = bias[(i4 + 1) / s]; bv[2] = bias[(i4 + 2) / s]; bv[3] = bias[(i4 + 3) / s]; }
        for (j = j0; j + 4 <= j1; j += 4) {
            dt__v4 c[4];
            int q;
            dt__v4_turn4(src + i4 * cols + j, cols, c);
            for (q = 0; q < 4; q++) {
                float *d = dst + (j + q) * rows + i4;
                dt__v4 v = c[q] + bv;
                if (add) v += dt__v4_load(d);
                memcpy(d, &v, sizeof v);
            }
        }
        j4 = j;
    }
#endif
    for (i = i0; i < i1; i++) {   /* what the tiles left: their rows' last columns, and the rows after them */
        float b = bias ? bias[i / s] : 0.0f;
        for (j = i < i4 ? j4 : j0; j < j1; j++) {
            if (add) dst[j * rows + i] += src[i * cols + j] + b;
            else dst[j * rows + i] = src[i * cols + j] + b;
        }
    }
}
static void dt__tap_turn(const float *src, int64_t rows, int64_t cols, float *dst, const float *bias, int64_t s, int add) {
    int64_t nbi = (rows + 31) / 32, nbj = (cols + 31) / 32, blk;
    DT__OMP(parallel for if (rows * cols > DT__PAR_MIN))
    for (blk = 0; blk < nbi * nbj; blk++) {
        int64_t i0 = blk / nbj * 32, j0 = blk % nbj * 32;
        dt__tap_turn_block(src, rows, cols, dst, bias, s, add, i0, i0 + 32 < rows ? i0 + 32 : rows, j0, j0 + 32 < cols ? j0 + 32 : cols);
    }
}
/* Piece r of tap t for chunks of nb images: its length in floats of a channel (0: no more pieces) and its
   offsets into a channel of the output (*yo, in [oh][ow][nb]) and of the input (*xo, in [h][w][nb]). A
   piece is one output row's span, or all the tap's rows when they span whole rows of both. */
static int64_t dt__tap_piece(const dt_conv_geom *g, int64_t nb, int64_t t, int64_t r, int64_t *yo, int64_t *xo) {
    int64_t ky = t / g->kw, kx = t % g->kw, oy0, oy1, ox0, ox1, rows = 1;
    dt__tap_range(ky, g->ph, g->h, g->oh, &oy0, &oy1);
    dt__tap_range(kx, g->pw, g->w, g->ow, &ox0, &ox1);
    if (ox0 == 0 && ox1 == g->ow && g->ow == g->w) {   /* whole rows: one piece */
        if (r > 0) return 0;
        rows = oy1 - oy0;
    }
    if (oy0 + r >= oy1 || ox1 == ox0) return 0;
    *yo = ((oy0 + r) * g->ow + ox0) * nb;
    *xo = ((oy0 + r + ky - g->ph) * g->w + ox0 + kx - g->pw) * nb;
    return (rows == 1 ? ox1 - ox0 : rows * g->ow) * nb;
}
/* dst = W'[t][o][c] = W[o][c][t] from src = W (back 0), or dst = dW[o][c][t] += dW'[t][o][c] from src = dW'
   (back 1), in blocks of 64 (o, c) so that the kk planes' strides, powers of two in most networks, do not
   evict each other */
static void dt__tap_weights(const dt_conv_geom *g, const float *src, float *dst, int back) {
    int64_t kk = g->kh * g->kw, oc = g->oc * g->c, ib;
    DT__OMP(parallel for if (oc * kk > DT__PAR_MIN))
    for (ib = 0; ib < oc; ib += 64) {
        int64_t i1 = ib + 64 < oc ? ib + 64 : oc, i, t;
        for (t = 0; t < kk; t++)
            for (i = ib; i < i1; i++) {
                if (back) dst[i * kk + t] += src[t * oc + i];
                else dst[t * oc + i] = src[i * kk + t];
            }
    }
}
/* one GEMM of the taps: C (ldc) += op(A) (lda) op(B) (ldb, columns along n unless tb), M x N by K */
static void dt__tap_gemm(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__cpu_gemm_src(ctx, ta, M, N, K, 1.0f, A, lda, &bs, 1.0f, C, ldc);
}
/* One pass over every piece of every tap, for a chunk of n images, xt [c][h][w][n], yt [oc][oh][ow][n] and
   w [tap][oc][c], as the table above: 0 forward (yt += w xt), 1 weight gradient (w += yt xt^T), 2 input
   gradient (xt += w^T yt) */
static void dt__tap_pass(void *ctx, const dt_conv_geom *g, int64_t n, int pass, float *w, float *xt, float *yt) {
    int64_t t, r, len, yo, xo, ldx = g->h * g->w * n, ldy = g->oh * g->ow * n, oc = g->oc * g->c;
    for (t = 0; t < g->kh * g->kw; t++)
        for (r = 0; (len = dt__tap_piece(g, n, t, r, &yo, &xo)) > 0; r++) {
            if (pass == 0) dt__tap_gemm(ctx, 0, 0, g->oc, len, g->c, w + t * oc, g->c, xt + xo, ldx, yt + yo, ldy);
            else if (pass == 1) dt__tap_gemm(ctx, 0, 1, g->oc, g->c, len, yt + yo, ldy, xt + xo, ldx, w + t * oc, g->c);
            else dt__tap_gemm(ctx, 1, 0, g->c, len, g->oc, w + t * oc, g->c, yt + yo, ldy, xt + xo, ldx);
        }
}
/* The forward pass by taps: y [n, oc, oh, ow] = conv(x, W) + b; 0 when the taps do not take g */
static int dt__tap_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int64_t nb = dt__tap_chunk(st, g), xs = g->c * g->h * g->w, ys = g->oc * g->oh * g->ow, i0;
    float *Wt = st ? st->conv_ws : NULL, *xt, *yt;
    if (!nb) return 0;
    xt = Wt + dt__tap_fixed(g);
    dt__tap_weights(g, W, Wt, 0);
    for (i0 = 0; i0 < g->n; i0 += nb) {
        int64_t n = g->n - i0 < nb ? g->n - i0 : nb;
        yt = xt + xs * n;
        dt__tap_turn(x + i0 * xs, n, xs, xt, NULL, 1, 0);
        memset(yt, 0, sizeof(float) * (size_t)(ys * n));
        dt__tap_pass(ctx, g, n, 0, Wt, xt, yt);
        dt__tap_turn(yt, ys, n, y + i0 * ys, b, g->oh * g->ow, 0);
    }
    dt__tap_taken++;
    return 1;
}
/* Both gradients by taps: dW += the weight gradient, dx (+= with accumulate, else =) the input gradient
   (none when dx is NULL); 0 when the taps do not take g */
static int dt__tap_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                            int accumulate) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int64_t nb = dt__tap_chunk(st, g), kk = g->kh * g->kw, oc = g->oc * g->c, xs = g->c * g->h * g->w, ys = g->oc * g->oh * g->ow;
    int64_t i0;
    float *Wt = st ? st->conv_ws : NULL, *dWt, *xt, *dyt;
    if (!nb) return 0;
    dWt = Wt + kk * oc;
    xt = dWt + kk * oc;
    if (dx) dt__tap_weights(g, W, Wt, 0);
    memset(dWt, 0, sizeof(float) * (size_t)(kk * oc));
    for (i0 = 0; i0 < g->n; i0 += nb) {
        int64_t n = g->n - i0 < nb ? g->n - i0 : nb;
        dyt = xt + xs * n;
        dt__tap_turn(x + i0 * xs, n, xs, xt, NULL, 1, 0);
        dt__tap_turn(dy + i0 * ys, n, ys, dyt, NULL, 1, 0);
        dt__tap_pass(ctx, g, n, 1, dWt, xt, dyt);
        if (!dx) continue;
        memset(xt, 0, sizeof(float) * (size_t)(xs * n));   /* xt is done with: dxt takes its place */
        dt__tap_pass(ctx, g, n, 2, Wt, xt, dyt);
        dt__tap_turn(xt, xs, n, dx + i0 * xs, NULL, 1, accumulate);
    }
    dt__tap_weights(g, dWt, dW, 1);
    dt__tap_taken++;
    return 1;
}

/* ---- the ops with a faster twin: the portable code of dtrain/core/tensor.h with the tier's kernels ---- */
static void dt__cpu_im2col(void *ctx, const dt_conv_geom *g, const float *x, float *col) {
    (void)ctx;
    dt__im2col(dt__pick_kernel(), g, x, col);
}
static void dt__cpu_col2im_bwd(void *ctx, const dt_conv_geom *g, const float *col, float *dx) {
    (void)ctx;
    dt__col2im(dt__pick_kernel(), g, col, dx);
}
static void dt__cpu_channel_sum_bwd(void *ctx, float *db, const float *dy, int64_t n, int64_t c, int64_t s) {
    (void)ctx;
    dt__channel_sums(dt__pick_kernel(), db, dy, n, c, s);
}
static void dt__cpu_maxpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y, int32_t *idx) {
    (void)ctx;
    dt__maxpool_fwd(dt__pick_kernel(), g, x, y, idx);
}
static void dt__cpu_bn_fwd(void *ctx, int training, const float *x, float *y, int64_t n, int64_t c, int64_t s,
                           const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                           float *save_mean, float *save_invstd) {
    (void)ctx;
    dt__bn_fwd(dt__pick_kernel(), training, 0, x, NULL, y, n, c, s, gamma, beta, rm, rv, eps, momentum, save_mean, save_invstd);
}
static void dt__cpu_bn_relu_fwd(void *ctx, int training, const float *x, const float *r, float *y, int64_t n, int64_t c,
                                int64_t s, const float *gamma, const float *beta, float *rm, float *rv, float eps,
                                float momentum, float *save_mean, float *save_invstd) {
    (void)ctx;
    dt__bn_fwd(dt__pick_kernel(), training, 1, x, r, y, n, c, s, gamma, beta, rm, rv, eps, momentum, save_mean, save_invstd);
}
static void dt__cpu_bn_bwd(void *ctx, int training, const float *x, const float *dy, float *dx, int64_t n, int64_t c,
                           int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                           float *dgamma, float *dbeta) {
    (void)ctx;
    dt__bn_bwd(dt__pick_kernel(), training, x, NULL, dy, dx, 1, NULL, 0, n, c, s, gamma, save_mean, save_invstd, dgamma, dbeta);
}
static void dt__cpu_bn_relu_bwd(void *ctx, int training, const float *x, const float *y, const float *dy, float *dx,
                                int accumulate, float *dr, int acc_r, int64_t n, int64_t c, int64_t s, const float *gamma,
                                const float *save_mean, const float *save_invstd, float *dgamma, float *dbeta) {
    (void)ctx;
    dt__bn_bwd(dt__pick_kernel(), training, x, y, dy, dx, accumulate, dr, acc_r, n, c, s, gamma, save_mean, save_invstd, dgamma,
               dbeta);
}
/* SyncBatchNorm's halves (dt_ops.bn_sums, bn_affine_acc): batch norm's own sums, per channel */
static void dt__cpu_bn_sums(void *ctx, const float *x, const float *y, const float *dy, int64_t n, int64_t c, int64_t s,
                            double *out) {
    const dt__kernel *k = dt__pick_kernel();
    int64_t ch;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {
        if (!dy) dt__bn_sums(k, x + ch * s, NULL, NULL, n, c * s, s, &out[ch], &out[c + ch]);
        else dt__bn_sums(k, dy + ch * s, x + ch * s, y ? y + ch * s : NULL, n, c * s, s, &out[ch], &out[c + ch]);
    }
}
static void dt__cpu_bn_affine_acc(void *ctx, float *dx, const float *x, const float *g, const float *a, const float *b,
                                  int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        int64_t ch = nc % c, k;
        float ga = g[ch] * a[ch], gb = g[ch] * b[ch];
        const float *xp = x + nc * s;
        float *dxp = dx + nc * s;
        for (k = 0; k < s; k++) dxp[k] += ga * xp[k] + gb;
    }
}
/* convolutions without im2col: by the tier's shifted rows where it has them and takes g (dtrain/cpu/cpu_vec.h,
   cpu_x86.h), else by taps where they take g; 0 leaves g to the packed GEMMs */
static int dt__cpu_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    const dt__kernel *k = dt__pick_kernel();
    return (k->conv_fwd && k->conv_fwd(ctx, g, x, W, b, y)) || dt__tap_conv_fwd(ctx, g, x, W, b, y);
}
static int dt__cpu_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                            float *dx, int accumulate) {
    const dt__kernel *k = dt__pick_kernel();
    int done = k->conv_bwd ? k->conv_bwd(ctx, g, x, W, dy, dW, dx, accumulate) : 0;
    return done ? done : dt__tap_conv_bwd(ctx, g, x, W, dy, dW, dx, accumulate);
}

/* ---- the table ---------------------------------------------------------------------------------- */
static const dt_ops dt__cpu_ops_table = {
    "cpu",
    dt__cpu_alloc, dt__cpu_free, dt__cpu_upload, dt__cpu_upload, dt__cpu_copy,
    dt__cpu_fill, dt__cpu_scale, dt__cpu_axpy, dt__cpu_add,
    dt__cpu_gemm, dt__cpu_add_row_bias, dt__cpu_sum_rows_bwd,
    dt__cpu_im2col, dt__cpu_col2im_bwd, dt__cpu_cs_to_ncs, dt__cpu_ncs_to_cs, dt__cpu_channel_sum_bwd,
    dt__cpu_maxpool_fwd, dt__cpu_maxpool_bwd, dt__cpu_avgpool_fwd, dt__cpu_avgpool_bwd,
    dt__cpu_gap_fwd, dt__cpu_gap_bwd,
    dt__cpu_relu_fwd, dt__cpu_relu_bwd,
    dt__cpu_dropout_fwd, dt__cpu_mul_bwd,
    dt__cpu_bn_fwd, dt__cpu_bn_bwd,
    dt__cpu_pad_shortcut_fwd, dt__cpu_pad_shortcut_bwd,
    dt__cpu_log_softmax_fwd, dt__cpu_log_softmax_bwd,
    dt__cpu_softmax_xent, dt__cpu_nll, dt__cpu_mse, dt__cpu_count_correct,
    dt__cpu_sum_squares, dt__cpu_sgd_step, dt__cpu_adam_step,
    NULL,  /* sync: the CPU ops finish before they return */
    dt__cpu_conv_gemm_fwd, dt__cpu_conv_gemm_wgrad, dt__cpu_conv_gemm_dgrad, dt__cpu_conv_fwd, dt__cpu_conv_bwd,
    dt__cpu_bn_relu_fwd, dt__cpu_bn_relu_bwd, dt__cpu_add_relu_fwd, dt__cpu_add_relu_bwd,
    dt__cpu_bn_sums, dt__cpu_bn_affine_acc
};

const dt_ops *dt_cpu_ops(void) { return &dt__cpu_ops_table; }

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
