/* dtrain/cpu/cpu_arm.h - the CPU's fast kernels for ARM64 (AArch64): NEON.   Part of dtrain v0.1.0, MIT license
   (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The library's only ARM intrinsics, reached only through the kernel table at the end of this file (the
     tier "neon"), which dtrain/cpu/cpu.h puts first on aarch64: every ARMv8-A CPU has NEON (Advanced SIMD), so
     the tier is chosen at compile time and needs no test of the CPU. Each kernel answers to a portable twin
     that test_core holds it equal to:
       kernel             portable twin
       dt__micro_neon     dt__micro (cpu.h): the GEMM's micro-kernel, 8 x 12
     The tier's convolutions by shifted rows are dtrain/cpu/cpu_vec.h's, written once in vector extensions and
     compiled for aarch64's baseline, which is NEON.
     A build for another CPU, with a compiler other than GCC or Clang, or with DT_NO_SIMD, compiles none of it.
   USES
     dtrain/cpu/cpu_vec.h (and tensor.h, base.h through it), through what dtrain/cpu/kernel.h declares of them;
     <arm_neon.h>.
   READ FIRST
     dt__micro_neon.
*/
#ifndef DTRAIN_CPU_ARM_H
#define DTRAIN_CPU_ARM_H
#include "cpu_vec.h"
/* (no declarations: everything here is reached through dtrain/cpu/cpu.h's kernel tables) */
#endif /* DTRAIN_CPU_ARM_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_CPU_ARM_IMPLEMENTATION_DONE)
#define DTRAIN_CPU_ARM_IMPLEMENTATION_DONE
#if defined(__GNUC__) && defined(__aarch64__) && !defined(DT_NO_SIMD)
#define DT__ARM 1
#include <arm_neon.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"
#include "kernel.h"   /* the kernel table, and cpu_vec.h's convolutions at the baseline */

#ifdef DT__ARM
/* ---- GEMM micro-kernel --------------------------------------------------------------------------- */
/* 8 rows x 3 vectors of 4: 24 accumulator registers of NEON's 32, 3 for a step of b and 2 for its 8 values
   of a, each multiply-add a fused fmla by lane (a's value taken from a lane of a register, no broadcast).
   Intrinsics, because plain C cannot ask for the fused form: gcc with -std=c11 contracts no a * b + c
   (-ffp-contract=off), so the portable kernel's vector types give an fmul and an fadd, half the rate of
   the two FMA pipes. On paper: 24 fmla (96 multiply-adds) per 5 loads, so 16 FLOP per cycle where a core
   issues two fmla per cycle (Cortex-A76, Neoverse N1, V1), 32 with four (Apple M1 and later). */
#define DT__NEON_ROW(i, av, l)                                                                                          \
    do {                                                                                                                \
        c##i##0 = vfmaq_laneq_f32(c##i##0, b0, av, l);                                                                  \
        c##i##1 = vfmaq_laneq_f32(c##i##1, b1, av, l);                                                                  \
        c##i##2 = vfmaq_laneq_f32(c##i##2, b2, av, l);                                                                  \
    } while (0)
#define DT__NEON_OUT(i) do { vst1q_f32(c[i], c##i##0); vst1q_f32(c[i] + 4, c##i##1); vst1q_f32(c[i] + 8, c##i##2); } while (0)
static void dt__micro_neon(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                           int64_t mr, int64_t nr, float alpha, float beta) {
    float32x4_t c00 = vdupq_n_f32(0.0f), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00, c20 = c00, c21 = c00,
                c22 = c00, c30 = c00, c31 = c00, c32 = c00, c40 = c00, c41 = c00, c42 = c00, c50 = c00, c51 = c00,
                c52 = c00, c60 = c00, c61 = c00, c62 = c00, c70 = c00, c71 = c00, c72 = c00;
    float c[8][12];
    int64_t p;
    for (p = 0; p < kc; p++, a += 8, b += 12) {
        float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8);
        float32x4_t a0 = vld1q_f32(a), a1 = vld1q_f32(a + 4);
        DT__NEON_ROW(0, a0, 0); DT__NEON_ROW(1, a0, 1); DT__NEON_ROW(2, a0, 2); DT__NEON_ROW(3, a0, 3);
        DT__NEON_ROW(4, a1, 0); DT__NEON_ROW(5, a1, 1); DT__NEON_ROW(6, a1, 2); DT__NEON_ROW(7, a1, 3);
    }
    DT__NEON_OUT(0); DT__NEON_OUT(1); DT__NEON_OUT(2); DT__NEON_OUT(3);
    DT__NEON_OUT(4); DT__NEON_OUT(5); DT__NEON_OUT(6); DT__NEON_OUT(7);
    dt__micro_store(&c[0][0], 12, C, ldc, mr, nr, alpha, beta);
}
#undef DT__NEON_ROW
#undef DT__NEON_OUT

/* ---- the table: what the tier replaces (dtrain/cpu/cpu.h chooses it) ----------------------------------- */
/* NEON (every AArch64 CPU): the GEMM's micro-kernel and dtrain/cpu/cpu_vec.h's convolutions (compiled for the
   baseline, which on aarch64 is NEON); the rest is portable */
static const dt__kernel dt__kernel_neon = {
    "neon", NULL, dt__micro_neon, 8, 12, NULL, NULL, NULL, NULL, NULL, NULL, dt__vec_conv_fwd_base, dt__vec_conv_bwd_base, NULL, NULL, NULL
};
#endif /* DT__ARM */

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
