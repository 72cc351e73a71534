/* dtrain/cpu/cpu_x86.h - the CPU's fast kernels for x86-64: AVX2 and AVX-512.   Part of dtrain v0.1.0, MIT
   license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The only intrinsics of the library. Nothing here is needed to understand an algorithm: every kernel
     answers to a portable twin that computes the same (test_core holds each pair equal, on every tier
     this CPU runs), and is reached only through the kernel tables at the end of this file, which
     dtrain/cpu/cpu.h chooses from once per process by the CPU's features (or DT_CPU):
       kernel                                 portable twin
       dt__col_span_avx512                    dt__col_span (tensor.h): im2col's row stretches, same floats
       dt__pack_a8_avx, dt__pack_bt_avx512    dt__pack_a, dt__pack_b (cpu.h): the GEMM's packing, same floats
       dt__micro_avx512 (8 x 48), _avx2       dt__micro (cpu.h): the GEMM's micro-kernel
       dt__col2im_small                       dt__col2im (tensor.h), the same sums in the same order
       dt__maxpool2_avx512, _avx2             dt__maxpool_fwd's 2 x 2 rows (tensor.h), the same selects
       dt__bn_sums512, _avx2                  dt__bn_sums (tensor.h): batch norm's sums in double (AVX2's
                                              in the portable order: the same bits)
       dt__shift_kern_avx512                  the tiles of dtrain/cpu/cpu_vec.h's convolutions by shifted rows
                                              (twins: its vector-extension tiles, im2col + GEMM and
                                              dt_conv2d_ref), which the avx2 tier takes from cpu_vec.h
     A build without x86-64 GCC or Clang, or with DT_NO_SIMD, compiles none of it.
   USES
     dtrain/cpu/cpu_vec.h and dtrain/core/tensor.h (and base.h through them), through what dtrain/cpu/kernel.h
     declares of them; <immintrin.h>.
   READ FIRST
     The tables at the end; then dt__shift_tile_avx512, the AVX-512 form of dtrain/cpu/cpu_vec.h's tile, which
     writes its kept lanes by compress and masked stores.
*/
#ifndef DTRAIN_CPU_X86_H
#define DTRAIN_CPU_X86_H
#include "cpu_vec.h"
/* (no declarations: everything here is reached through dtrain/cpu/cpu.h's kernel tables) */
#endif /* DTRAIN_CPU_X86_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_CPU_X86_IMPLEMENTATION_DONE)
#define DTRAIN_CPU_X86_IMPLEMENTATION_DONE
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
#define DT__X86 1
#include <immintrin.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"
#include "kernel.h"   /* the kernel table, and cpu_vec.h's tiles and drivers */

#ifdef DT__X86
/* ---- im2col and packing ----------------------------------------------------------------------- */
/* dt__col_span with AVX-512 into contiguous dst, in steps of three kinds: a whole image of at most 16 pixels
   and 16 outputs by one permutation of its plane; with stride 1 and same-size outputs whose rows tile 16
   lanes (or the other way round), 16 outputs at a time as 16 pixels of the plane shifted by (ky - ph,
   kx - pw), the lanes outside the image masked; else the rest of an output row, by masked loads and stores
   (stride 1) or one by one */
__attribute__((target("avx512f")))
static void dt__col_span_avx512(const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx, int64_t n, int64_t oy,
                                int64_t ox, int64_t len, float *DT__RESTRICT dst) {
    int64_t lo, hi, S = g->oh * g->ow, hw = g->h * g->w, i;
    __m512i vi = _mm512_setzero_si512();
    __m512i gv = _mm512_setzero_si512();
    __mmask16 vm = 0, colm = 0, gm = 0;
    int small = S <= 16 && hw <= 16, tile = 0;
    const int64_t per = S <= 8 ? 16 / S : 1;   /* images per 16 lanes */
    dt__col_cols(g, kx, &lo, &hi);
    if (small && len >= S) {   /* which pixel each output of an image reads (vm: inside the image) */
        int32_t idx[16];
        int64_t r = 0, col = 0, im = 0, l = 0;   /* counters, not divisions: this runs once per call */
        for (i = 0; i < 16; i++) {
            int64_t iy = r * g->sh - g->ph + ky, ix = col * g->sw - g->pw + kx;
            idx[i] = 0;
            if (i < S && iy >= 0 && iy < g->h && ix >= 0 && ix < g->w) { idx[i] = (int32_t)(iy * g->w + ix); vm |= (__mmask16)(1u << i); }
            if (++col == g->ow) { col = 0; r++; }
        }
        vi = _mm512_loadu_si512(idx);
        if (S <= 8) {   /* 16 / S images at a time: lane i reads pixel idx[i % S] of image i / S, by a gather */
            int32_t gi[16];
            for (i = 0; i < 16; i++) {
                gi[i] = im < per ? (int32_t)(im * g->c * hw) + idx[l] : 0;
                if (im < per && (vm >> l & 1u)) gm |= (__mmask16)(1u << i);
                if (++l == S) { l = 0; im++; }
            }
            gv = _mm512_loadu_si512(gi);
        }
    }
    tile = !small && len >= 16 && g->sw == 1 && g->sh == 1 && g->w == g->ow && g->h == g->oh && S % 16 == 0 &&
           (16 % g->ow == 0 || g->ow % 16 == 0);
    if (tile && g->ow < 16) {   /* 16 lanes = 16 / ow output rows; colm: the lanes inside the image's columns */
        int64_t col;
        for (i = 0, col = 0; i < 16; i++, col = col + 1 == g->ow ? 0 : col + 1)
            if (col >= lo && col < hi) colm |= (__mmask16)(1u << i);
    }
    while (len > 0) {
        int64_t end, iy, a, b, q;
        if (small && S <= 8 && ox == 0 && oy == 0 && len >= per * S) {
            const float *base = x + (n * g->c + c) * hw;
            _mm512_mask_storeu_ps(dst, (__mmask16)((1u << (per * S)) - 1u),
                                  _mm512_mask_i32gather_ps(_mm512_setzero_ps(), gm, gv, base, 4));
            dst += per * S; len -= per * S; n += per;
            continue;
        }
        if (small && ox == 0 && oy == 0 && len >= S) {
            __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << hw) - 1u), x + (n * g->c + c) * hw);
            _mm512_mask_storeu_ps(dst, (__mmask16)((1u << S) - 1u), _mm512_maskz_permutexvar_ps(vm, vi, v));
            dst += S; len -= S; n++;
            continue;
        }
        if (tile && len >= 16 && (g->ow < 16 ? ox == 0 && oy % (16 / g->ow) == 0 : ox % 16 == 0)) {
            /* 16 outputs at a time, to the image's end: pixels (oy + ky - ph, ox + kx - pw) on */
            const float *base = x + (n * g->c + c) * hw + (ky - g->ph) * g->w + kx - g->pw;
            __mmask16 m;
            if (g->ow < 16) {
                int64_t r16 = 16 / g->ow;
                for (; oy < g->oh && len >= 16; oy += r16, len -= 16, dst += 16) {
                    int64_t t0 = oy + ky - g->ph;   /* the first of the r16 input rows */
                    m = colm;
                    if (t0 < 0 || t0 + r16 > g->h) {
                        __mmask16 rows = 0;
                        for (i = 0; i < r16; i++)
                            if (t0 + i >= 0 && t0 + i < g->h) rows |= (__mmask16)(((1u << g->ow) - 1u) << (i * g->ow));
                        m &= rows;
                    }
                    _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(m, m ? base + oy * g->ow : x));
                }
            } else
                for (; oy < g->oh && len >= 16; len -= 16, dst += 16) {
                    int64_t t0 = oy + ky - g->ph, va = lo > ox ? lo - ox : 0, vb = hi - ox < 16 ? hi - ox : 16;
                    m = t0 >= 0 && t0 < g->h && va < vb ? (__mmask16)(((1u << vb) - 1u) & ~((1u << va) - 1u)) : (__mmask16)0;
                    _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(m, m ? base + oy * g->ow + ox : x));
                    if ((ox += 16) == g->ow) { ox = 0; oy++; }
                }
            if (oy == g->oh) { oy = 0; n++; }
            continue;
        }
        end = ox + len < g->ow ? ox + len : g->ow;
        iy = oy * g->sh - g->ph + ky;
        a = end; b = end;
        if (iy >= 0 && iy < g->h) {   /* [a, b): inside the image */
            a = lo < ox ? ox : lo > end ? end : lo;
            b = hi < a ? a : hi > end ? end : hi;
        }
        if (g->sw == 1) {
            const float *xr = a < b ? x + ((n * g->c + c) * g->h + iy) * g->w + kx - g->pw : x;
            for (q = ox; q < end; q += 16) {
                int64_t m = end - q < 16 ? end - q : 16, va = a > q ? a : q, vb = b < q + m ? b : q + m;
                __mmask16 lm = va < vb ? (__mmask16)(((1u << (vb - q)) - 1u) & ~((1u << (va - q)) - 1u)) : (__mmask16)0;
                _mm512_mask_storeu_ps(dst, (__mmask16)((1u << m) - 1u), _mm512_maskz_loadu_ps(lm, lm ? xr + q : x));
                dst += m;
            }
        } else {
            for (i = ox; i < a; i++) *dst++ = 0.0f;
            if (a < b) {
                const float *xr = x + ((n * g->c + c) * g->h + iy) * g->w + kx - g->pw;
                for (i = a; i < b; i++) *dst++ = xr[i * g->sw];
            }
            for (i = b; i < end; i++) *dst++ = 0.0f;
        }
        len -= end - ox;
        ox = 0;
        if (++oy == g->oh) { oy = 0; n++; }
    }
}

/* An 8-tall panel of A's rows with AVX: dst[p * 8 + i] = A[i * lda + p] for p < kc8 (a multiple of 8),
   transposing 8 x 8 tiles in registers */
__attribute__((target("avx")))
static void dt__pack_a8_avx(const float *A, int64_t lda, int64_t kc8, float *dst) {
    int64_t p;
    for (p = 0; p < kc8; p += 8) {
        __m256 r[8], t[8], u[8];
        int i;
        for (i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(A + i * lda + p);
        for (i = 0; i < 4; i++) {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (i = 0; i < 2; i++) {   /* u[4i + k]: column k (low half) and k + 4 (high half) of rows 4i..4i+3 */
            u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
            u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
            u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
            u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        for (i = 0; i < 4; i++) {
            _mm256_storeu_ps(dst + (p + i) * 8, _mm256_permute2f128_ps(u[i], u[4 + i], 0x20));
            _mm256_storeu_ps(dst + (p + i + 4) * 8, _mm256_permute2f128_ps(u[i], u[4 + i], 0x31));
        }
    }
}

/* A panel of op(B) = B^T with AVX-512: dst[p * NR + j] = B[j * ldb + p] for p < kc, j < nr (NR a multiple
   of 16; zero for j >= nr), transposing 16 x 16 tiles in registers. */
__attribute__((target("avx512f")))
static void dt__pack_bt_avx512(const float *B, int64_t ldb, int64_t kc, int64_t nr, float *dst, int NR) {
    const __mmask16 all = 0xFFFF;   /* the zero-masking forms: no undefined inputs for gcc to warn about */
    int64_t q, p0;
    for (q = 0; q < NR; q += 16)
        for (p0 = 0; p0 < kc; p0 += 16) {
            __m512 r[16], t[16], u[16];
            __mmask16 pm = kc - p0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (kc - p0)) - 1u);
            int i, k;
            for (i = 0; i < 16; i++)
                r[i] = q + i < nr ? _mm512_maskz_loadu_ps(pm, B + (q + i) * ldb + p0) : _mm512_setzero_ps();
            for (i = 0; i < 8; i++) {
                t[2 * i] = _mm512_maskz_unpacklo_ps(all, r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * i], r[2 * i + 1]);
            }
            for (i = 0; i < 4; i++) {   /* u[4i + k], lane L: column 4L + k of rows 4i..4i+3 */
                u[4 * i] = _mm512_maskz_shuffle_ps(all, t[4 * i], t[4 * i + 2], 0x44);
                u[4 * i + 1] = _mm512_maskz_shuffle_ps(all, t[4 * i], t[4 * i + 2], 0xEE);
                u[4 * i + 2] = _mm512_maskz_shuffle_ps(all, t[4 * i + 1], t[4 * i + 3], 0x44);
                u[4 * i + 3] = _mm512_maskz_shuffle_ps(all, t[4 * i + 1], t[4 * i + 3], 0xEE);
            }
            for (k = 0; k < 4; k++) {   /* column 4L + k of all 16 rows */
                __m512 x0 = _mm512_maskz_shuffle_f32x4(all, u[k], u[4 + k], 0x44), x1 = _mm512_maskz_shuffle_f32x4(all, u[k], u[4 + k], 0xEE);
                __m512 y0 = _mm512_maskz_shuffle_f32x4(all, u[8 + k], u[12 + k], 0x44), y1 = _mm512_maskz_shuffle_f32x4(all, u[8 + k], u[12 + k], 0xEE);
                r[k] = _mm512_maskz_shuffle_f32x4(all, x0, y0, 0x88);
                r[4 + k] = _mm512_maskz_shuffle_f32x4(all, x0, y0, 0xDD);
                r[8 + k] = _mm512_maskz_shuffle_f32x4(all, x1, y1, 0x88);
                r[12 + k] = _mm512_maskz_shuffle_f32x4(all, x1, y1, 0xDD);
            }
            for (i = 0; i < 16 && p0 + i < kc; i++) _mm512_storeu_ps(dst + (p0 + i) * NR + q, r[i]);
        }
}

/* ---- GEMM micro-kernels ---------------------------------------------------------------------- */
/* AVX2 + FMA: 6 rows x 2 vectors of 8 = 12 accumulator
   registers of 16, the shape that keeps both FMA units of a core busy. */
__attribute__((target("avx2,fma")))
static void dt__micro_avx2(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                           int64_t mr, int64_t nr, float alpha, float beta) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    float c[6][16];
    int64_t p;
    for (p = 0; p < kc; p++) {
        __m256 b0 = _mm256_loadu_ps(b + p * 16), b1 = _mm256_loadu_ps(b + p * 16 + 8), av;
        const float *ap = a + p * 6;
        av = _mm256_broadcast_ss(ap + 0); c00 = _mm256_fmadd_ps(av, b0, c00); c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(ap + 1); c10 = _mm256_fmadd_ps(av, b0, c10); c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(ap + 2); c20 = _mm256_fmadd_ps(av, b0, c20); c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(ap + 3); c30 = _mm256_fmadd_ps(av, b0, c30); c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(ap + 4); c40 = _mm256_fmadd_ps(av, b0, c40); c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(ap + 5); c50 = _mm256_fmadd_ps(av, b0, c50); c51 = _mm256_fmadd_ps(av, b1, c51);
    }
    if (mr == 6 && nr == 16 && alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
        /* a whole tile with the common scalars: straight from the registers to C */
        __m256 *acc[6][2];
        int64_t i;
        acc[0][0] = &c00; acc[0][1] = &c01; acc[1][0] = &c10; acc[1][1] = &c11; acc[2][0] = &c20; acc[2][1] = &c21;
        acc[3][0] = &c30; acc[3][1] = &c31; acc[4][0] = &c40; acc[4][1] = &c41; acc[5][0] = &c50; acc[5][1] = &c51;
        for (i = 0; i < 6; i++) {
            float *crow = C + i * ldc;
            if (beta == 0.0f) {
                _mm256_storeu_ps(crow, *acc[i][0]);
                _mm256_storeu_ps(crow + 8, *acc[i][1]);
            } else {
                _mm256_storeu_ps(crow, _mm256_add_ps(_mm256_loadu_ps(crow), *acc[i][0]));
                _mm256_storeu_ps(crow + 8, _mm256_add_ps(_mm256_loadu_ps(crow + 8), *acc[i][1]));
            }
        }
        return;
    }
    _mm256_storeu_ps(c[0], c00); _mm256_storeu_ps(c[0] + 8, c01);
    _mm256_storeu_ps(c[1], c10); _mm256_storeu_ps(c[1] + 8, c11);
    _mm256_storeu_ps(c[2], c20); _mm256_storeu_ps(c[2] + 8, c21);
    _mm256_storeu_ps(c[3], c30); _mm256_storeu_ps(c[3] + 8, c31);
    _mm256_storeu_ps(c[4], c40); _mm256_storeu_ps(c[4] + 8, c41);
    _mm256_storeu_ps(c[5], c50); _mm256_storeu_ps(c[5] + 8, c51);
    dt__micro_store(&c[0][0], 16, C, ldc, mr, nr, alpha, beta);
}

/* AVX-512: DT__MR512 rows x DT__NV512 vectors of 16, the accumulators in zmm registers (32 of them);
   edges are written with masked loads and stores, so every tile leaves from the registers. */
#ifndef DT__MR512
#define DT__MR512 8
#define DT__NV512 3
#endif
/* the kernel's body for the first nv vectors of the tile (nv constant where it is inlined): a panel's last
   tile of 32 or 16 columns runs only the multiply-adds it keeps */
__attribute__((target("avx512f"), always_inline))
static inline void dt__micro512_nv(int nv, int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C,
                                   int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {
    __m512 c[DT__MR512][DT__NV512], va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[DT__NV512];
    int64_t p;
    int i, v;
    for (i = 0; i < DT__MR512 && i < mr; i++)   /* C's tile is read only at the end: fetch it meanwhile */
        for (v = 0; v < nv; v++) _mm_prefetch((const char *)(C + i * ldc + 16 * v), _MM_HINT_T0);
    for (i = 0; i < DT__MR512; i++)
        for (v = 0; v < DT__NV512; v++) c[i][v] = _mm512_setzero_ps();   /* all: no register left undefined */
    for (p = 0; p < kc; p++) {
        const float *bp = b + p * (16 * DT__NV512), *ap = a + p * DT__MR512;
        __m512 bv[DT__NV512];
        /* B's panels stream from L2: ask for them 16 steps ahead (the hardware prefetcher alone falls behind) */
        for (v = 0; v < nv; v++) _mm_prefetch((const char *)(bp + 16 * 16 * DT__NV512 + 16 * v), _MM_HINT_T0);
        for (v = 0; v < nv; v++) bv[v] = _mm512_loadu_ps(bp + 16 * v);
        for (i = 0; i < DT__MR512; i++) {
            __m512 av = _mm512_set1_ps(ap[i]);
            for (v = 0; v < nv; v++) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
        }
    }
    if (mr == DT__MR512 && nr == 16 * DT__NV512 && alpha == 1.0f) {
        /* a whole tile: loops of constant length, so the accumulators never leave the registers */
        for (i = 0; i < DT__MR512; i++)
            for (v = 0; v < DT__NV512; v++) {
                float *cp = C + i * ldc + 16 * v;
                if (beta == 0.0f) _mm512_storeu_ps(cp, c[i][v]);
                else if (beta == 1.0f) _mm512_storeu_ps(cp, _mm512_add_ps(c[i][v], _mm512_loadu_ps(cp)));
                else _mm512_storeu_ps(cp, _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), c[i][v]));
            }
        return;
    }
    for (v = 0; v < DT__NV512; v++) {
        int64_t left = v < nv ? nr - 16 * v : 0;
        mask[v] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
    }
    for (i = 0; i < DT__MR512 && i < mr; i++) {
        float *crow = C + i * ldc;
        for (v = 0; v < nv; v++) {
            __m512 r = alpha == 1.0f ? c[i][v] : _mm512_mul_ps(va, c[i][v]);
            if (!mask[v]) continue;
            if (beta == 1.0f) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask[v], crow + 16 * v));
            else if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], crow + 16 * v), r);
            _mm512_mask_storeu_ps(crow + 16 * v, mask[v], r);
        }
    }
}
__attribute__((target("avx512f")))
static void dt__micro_avx512(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                             int64_t mr, int64_t nr, float alpha, float beta) {
    if (nr > 32) dt__micro512_nv(DT__NV512, kc, a, b, C, ldc, mr, nr, alpha, beta);
    else if (nr > 16) dt__micro512_nv(2, kc, a, b, C, ldc, mr, nr, alpha, beta);
    else dt__micro512_nv(1, kc, a, b, C, ldc, mr, nr, alpha, beta);
}

/* ---- the GEMM on bf16 pairs (AVX512_BF16: Cooper Lake, Sapphire Rapids, Zen 4) ----------------------------- */
/* vdpbf16ps adds to each float lane the two products of a pair of bf16 (exact in float) in turn, so a tile sums
   as the float kernel does but two terms a step; the compiler needs avx512bf16 (GCC 10, Clang 9) */
#if defined(__clang__) ? __clang_major__ >= 9 && __clang_major__ != 16 : __GNUC__ >= 10   /* clang 16 (Debian's) crashes on it */
#define DT__X86_BF16 1
#include <cpuid.h>
/* CPUID.(EAX=7, ECX=1):EAX bit 5, on a CPU whose OS keeps the AVX-512 state (avx512f) */
static int dt__x86_bf16_runs(void) {
    static int known = -1;
    int k = DT__ATOMIC_LOAD(&known);
    if (k < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        k = __builtin_cpu_supports("avx512f") && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1u);
        DT__ATOMIC_STORE(&known, k);
    }
    return k;
}
/* a packed panel [kc][w] turned in place into bf16 pairs [(kc + 1) / 2][w] (kernel.h's bf16_pair): row q is written
   after rows 2q and 2q + 1 are read, and only rows q and below were read before, so nothing is overwritten unread.
   vcvtneps2bf16 rounds to nearest even (denormals flushed to zero, as vdpbf16ps would) */
__attribute__((target("avx512f,avx512bf16")))
static void dt__bf16_pair_avx512(float *panel, int64_t kc, int w) {
    int64_t q, kc2 = (kc + 1) / 2;
    int j;
    for (q = 0; q < kc2; q++) {
        const float *r0 = panel + 2 * q * w, *r1 = 2 * q + 1 < kc ? r0 + w : NULL;
        for (j = 0; j < w; j += 16) {
            __mmask16 m = w - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (w - j)) - 1u);
            __m512 v0 = _mm512_maskz_loadu_ps(m, r0 + j), v1 = r1 ? _mm512_maskz_loadu_ps(m, r1 + j) : _mm512_setzero_ps();
            __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v0));
            __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v1));
            _mm512_mask_storeu_epi32(panel + q * w + j, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}
/* dt__micro512_nv on pair panels: a [kc][8] and b [kc][48] pairs, one vdpbf16ps per accumulator a step */
__attribute__((target("avx512f,avx512bf16"), always_inline))
static inline void dt__micro512_bf16_nv(int nv, int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C,
                                        int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {
    __m512 c[DT__MR512][DT__NV512], va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[DT__NV512];
    int64_t p;
    int i, v;
    for (i = 0; i < DT__MR512 && i < mr; i++)
        for (v = 0; v < nv; v++) _mm_prefetch((const char *)(C + i * ldc + 16 * v), _MM_HINT_T0);
    for (i = 0; i < DT__MR512; i++)
        for (v = 0; v < DT__NV512; v++) c[i][v] = _mm512_setzero_ps();
    for (p = 0; p < kc; p++) {
        const float *bp = b + p * (16 * DT__NV512), *ap = a + p * DT__MR512;
        __m512bh bv[DT__NV512];
        for (v = 0; v < nv; v++) _mm_prefetch((const char *)(bp + 16 * 16 * DT__NV512 + 16 * v), _MM_HINT_T0);
        for (v = 0; v < nv; v++) bv[v] = (__m512bh)_mm512_loadu_si512(bp + 16 * v);
        for (i = 0; i < DT__MR512; i++) {
            int32_t pair;
            __m512bh av;
            memcpy(&pair, ap + i, sizeof pair);
            av = (__m512bh)_mm512_set1_epi32(pair);
            for (v = 0; v < nv; v++) c[i][v] = _mm512_dpbf16_ps(c[i][v], av, bv[v]);
        }
    }
    if (mr == DT__MR512 && nr == 16 * DT__NV512 && alpha == 1.0f) {
        for (i = 0; i < DT__MR512; i++)
            for (v = 0; v < DT__NV512; v++) {
                float *cp = C + i * ldc + 16 * v;
                if (beta == 0.0f) _mm512_storeu_ps(cp, c[i][v]);
                else if (beta == 1.0f) _mm512_storeu_ps(cp, _mm512_add_ps(c[i][v], _mm512_loadu_ps(cp)));
                else _mm512_storeu_ps(cp, _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), c[i][v]));
            }
        return;
    }
    for (v = 0; v < DT__NV512; v++) {
        int64_t left = v < nv ? nr - 16 * v : 0;
        mask[v] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
    }
    for (i = 0; i < DT__MR512 && i < mr; i++) {
        float *crow = C + i * ldc;
        for (v = 0; v < nv; v++) {
            __m512 r = alpha == 1.0f ? c[i][v] : _mm512_mul_ps(va, c[i][v]);
            if (!mask[v]) continue;
            if (beta == 1.0f) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask[v], crow + 16 * v));
            else if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], crow + 16 * v), r);
            _mm512_mask_storeu_ps(crow + 16 * v, mask[v], r);
        }
    }
}
__attribute__((target("avx512f,avx512bf16")))
static void dt__micro_bf16_avx512(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                                  int64_t mr, int64_t nr, float alpha, float beta) {
    if (nr > 32) dt__micro512_bf16_nv(DT__NV512, kc, a, b, C, ldc, mr, nr, alpha, beta);
    else if (nr > 16) dt__micro512_bf16_nv(2, kc, a, b, C, ldc, mr, nr, alpha, beta);
    else dt__micro512_bf16_nv(1, kc, a, b, C, ldc, mr, nr, alpha, beta);
}
#define DT__X86_BF16_ENTRIES dt__x86_bf16_runs, dt__bf16_pair_avx512, dt__micro_bf16_avx512
#else
#define DT__X86_BF16_ENTRIES NULL, NULL, NULL
#endif

/* ---- convolutions by shifted rows ---------------------------------------------------------------- */
/* The AVX-512 tier's inner kernels of the convolutions by shifted rows; the geometry, the tables and the
   loops over images, tiles and threads are dtrain/cpu/cpu_vec.h's drivers, which every tier shares (read them
   first). A tile here is 8 rows x 48 columns (24 accumulators of 16 lanes), or 16 or 32 columns for an
   image's last tile, and it writes each vector's kept lanes with vcompressps and a masked store instead of
   going through a buffer. */
/* rows x len floats from src (rows lds apart) to dst (rows ldd apart) */
__attribute__((target("avx512f")))
static void dt__shift_copy_avx512(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t len) {
    __mmask16 tail = (__mmask16)((1u << (len % 16)) - 1u);
    int64_t r, j, full = len / 16 * 16;
    for (r = 0; r < rows; r++, dst += ldd, src += lds) {
        for (j = 0; j < full; j += 16) _mm512_storeu_ps(dst + j, _mm512_loadu_ps(src + j));
        if (tail) _mm512_mask_storeu_ps(dst + j, tail, _mm512_maskz_loadu_ps(tail, src + j));
    }
}
/* channels c0..c1 of image x [c, h, w] into the padded image xp (whose borders and slack are zero) */
__attribute__((target("avx512f")))
static void dt__shift_pad_avx512(const dt__shift_geom *s, const float *x, int64_t c0, int64_t c1, float *xp) {
    int64_t c, iy, ix;
    if (s->sh == 1 && s->sw == 1) {
        for (c = c0; c < c1; c++)
            dt__shift_copy_avx512(xp + ((c - c0) * s->hp + s->ph) * s->wp + s->pw, s->wp, x + c * s->h * s->w, s->w, s->h, s->w);
        return;
    }
    for (c = c0; c < c1; c++)   /* strides: each row to its plane of rows (py % sh); at stride 2 across, its even and odd
                                   padded columns to their planes */
        for (iy = 0; iy < s->h; iy++) {
            int64_t py = iy + s->ph, pq = s->hq * s->wq;
            const float *src = x + (c * s->h + iy) * s->w;
            float *row = xp + (c - c0) * s->cp + (py % s->sh) * s->sw * pq + py / s->sh * s->wq, *ev, *od;
            if (s->sw == 1) { dt__shift_copy_avx512(row + s->pw, 0, src, 0, 1, s->w); continue; }
            /* input column ix0 + 2j goes to plane pw % 2 at ix0 / 2 + j + pw / 2, ix0 + 2j + 1 to the other
               plane at ix0 / 2 + j + (pw + 1) / 2 */
            ev = row + (s->pw % 2) * pq + s->pw / 2; od = row + ((s->pw + 1) % 2) * pq + (s->pw + 1) / 2;
            for (ix = 0; ix < s->w; ix += 16) {
                int len = s->w - ix < 16 ? (int)(s->w - ix) : 16;
                __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << len) - 1u), src + ix);
                _mm512_mask_storeu_ps(ev + ix / 2, (__mmask16)((1u << (len + 1) / 2) - 1u), _mm512_maskz_compress_ps(0x5555, v));
                _mm512_mask_storeu_ps(od + ix / 2, (__mmask16)((1u << len / 2) - 1u), _mm512_maskz_compress_ps(0xAAAA, v));
            }
        }
}

/* one tile of the shifted GEMM: sum_k a[k][i] xp[off[k] + j] for 8 rows i (rows kept) x 16 nv columns j
   (nv 1 to 3, a constant where it is inlined), each vector's kept lanes written (packed together) to row i
   of dst (rows S apart) plus bias[i] (bias NULL: none), or added to it (add 1) */
__attribute__((target("avx512f"), always_inline))
static inline void dt__shift_tile512_nv(int nv, int64_t K, const float *DT__RESTRICT a, const float *xp, const int32_t *off,
                                        const dt__shift_vec *vec, float *dst, int64_t S, const float *bias, int add, int rows) {
    __m512 c[8][3];
    int64_t k;
    int i, v;
    for (i = 0; i < 8; i++)
        for (v = 0; v < nv; v++) c[i][v] = _mm512_setzero_ps();
    for (k = 0; k < K; k++) {
        const float *b = xp + off[k], *ak = a + 8 * k;
        __m512 bv[3];
        for (v = 0; v < nv; v++) bv[v] = _mm512_loadu_ps(b + 16 * v);
        for (i = 0; i < 8; i++) {
            __m512 av = _mm512_set1_ps(ak[i]);
            for (v = 0; v < nv; v++) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
        }
    }
    for (i = 0; i < rows; i++) {
        __m512 b = _mm512_set1_ps(bias ? bias[i] : 0.0f);
        for (v = 0; v < nv; v++) {
            __mmask16 keep = (__mmask16)vec[v].keep, m;
            float *d = dst + i * S + vec[v].at;
            __m512 y = _mm512_add_ps(c[i][v], b);
            if (keep == 0xFFFF) {
                _mm512_storeu_ps(d, add ? _mm512_add_ps(y, _mm512_loadu_ps(d)) : y);
            } else if (keep) {
                m = (__mmask16)((1u << __builtin_popcount(keep)) - 1u);
                y = _mm512_maskz_compress_ps(keep, y);
                _mm512_mask_storeu_ps(d, m, add ? _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, d)) : y);
            }
        }
    }
}
/* the tile of 48 columns, or of the 16 or 32 that an image's last tile keeps (the vectors after them keep
   nothing): an 8 x 8 image's 80 computed columns (8 rows of 10) are 48 + 32, not 2 x 48 */
__attribute__((target("avx512f")))
static void dt__shift_tile_avx512(int64_t K, const float *DT__RESTRICT a, const float *xp, const int32_t *off, const dt__shift_vec *vec,
                           float *dst, int64_t S, const float *bias, int add, int rows) {
    if (vec[2].keep) dt__shift_tile512_nv(3, K, a, xp, off, vec, dst, S, bias, add, rows);
    else if (vec[1].keep) dt__shift_tile512_nv(2, K, a, xp, off, vec, dst, S, bias, add, rows);
    else dt__shift_tile512_nv(1, K, a, xp, off, vec, dst, S, bias, add, rows);
}
/* the sum of a vector's 16 floats (pairwise; through memory, which GCC 12's C++ front end warns less about) */
__attribute__((target("avx512f")))
static float dt__hsum512(__m512 v) {
    float t[16];
    int w, i;
    _mm512_storeu_ps(t, v);
    for (w = 8; w > 0; w /= 2)
        for (i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
}
/* dW[i][k] += sum over nimg images and s of d[img][i][s] xp[img][off[k] + s], for 4 rows i and
   DT__WT_K k (ni, nk of them kept); d's rows are ldd apart and ld long (a multiple of 16), images dstride
   and xstride apart. 4 x 6 accumulators: 10 loads feed 24 multiply-adds. */
#define DT__WT_K 6
__attribute__((target("avx512f")))
static void dt__shift_wtile_avx512(int64_t nimg, int64_t ld, const float *d, int64_t ldd, int64_t dstride, const float *xp,
                            int64_t xstride, const int32_t *off, float *dW, int64_t ldw, int ni, int nk) {
    __m512 acc[4][DT__WT_K];
    const float *dr[4];
    int32_t o[DT__WT_K];
    int64_t img, s;
    int i, j;
    for (i = 0; i < 4; i++) {
        dr[i] = d + (i < ni ? i : ni - 1) * ldd;
        for (j = 0; j < DT__WT_K; j++) acc[i][j] = _mm512_setzero_ps();
    }
    for (j = 0; j < DT__WT_K; j++) o[j] = off[j < nk ? j : nk - 1];
    for (img = 0; img < nimg; img++) {
        const float *x = xp + img * xstride, *d0 = dr[0] + img * dstride, *d1 = dr[1] + img * dstride,
                    *d2 = dr[2] + img * dstride, *d3 = dr[3] + img * dstride;
        for (s = 0; s < ld; s += 16) {
            __m512 a0 = _mm512_loadu_ps(d0 + s), a1 = _mm512_loadu_ps(d1 + s), a2 = _mm512_loadu_ps(d2 + s),
                   a3 = _mm512_loadu_ps(d3 + s);
            for (j = 0; j < DT__WT_K; j++) {
                __m512 b = _mm512_loadu_ps(x + o[j] + s);
                acc[0][j] = _mm512_fmadd_ps(a0, b, acc[0][j]);
                acc[1][j] = _mm512_fmadd_ps(a1, b, acc[1][j]);
                acc[2][j] = _mm512_fmadd_ps(a2, b, acc[2][j]);
                acc[3][j] = _mm512_fmadd_ps(a3, b, acc[3][j]);
            }
        }
    }
    for (i = 0; i < ni; i++)
        for (j = 0; j < nk; j++) dW[i * ldw + j] += dt__hsum512(acc[i][j]);
}
/* The 3 x 3 weight gradient's transposed tile (dtrain/cpu/cpu_vec.h, dt__shift_wgrad3): dWT [9][ocp] += one
   input channel's sums for tap (ky, kx) at row ky * 3 + kx, for 16 (ov 1) or 32 (ov 2) output channels. */
/* named accumulators (not an array), so that every compiler and level keeps them in registers */
#define DT__WT3_TAP(t, row, kx) do {                                          \
        __m512 b_ = _mm512_set1_ps(row[ox + kx]);                               \
        a##t##0 = _mm512_fmadd_ps(b_, d0, a##t##0);                             \
        if (ov > 1) a##t##1 = _mm512_fmadd_ps(b_, d1, a##t##1);                 \
    } while (0)
#define DT__WT3_OUT(t) do {                                                   \
        float *p_ = dWT + t * ocp;                                              \
        _mm512_storeu_ps(p_, _mm512_add_ps(_mm512_loadu_ps(p_), a##t##0));      \
        if (ov > 1) _mm512_storeu_ps(p_ + 16, _mm512_add_ps(_mm512_loadu_ps(p_ + 16), a##t##1)); \
    } while (0)
__attribute__((always_inline, target("avx512f")))
static inline void dt__wt3_tile(const int ov, const int st, const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow,
                                const float *dbT, int64_t ocp, float *dWT) {
    __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a10 = z, a20 = z, a30 = z, a40 = z, a50 = z, a60 = z, a70 = z, a80 = z;
    __m512 a01 = z, a11 = z, a21 = z, a31 = z, a41 = z, a51 = z, a61 = z, a71 = z, a81 = z;
    int64_t oy, ox;
    for (oy = 0; oy < oh; oy++) {
        const float *dr = dbT + oy * ow * ocp;
        if (st == 1) {   /* tap (ky, kx) at row oy + ky, column ox + kx */
            const float *r0 = x + oy * wq, *r1 = r0 + wq, *r2 = r1 + wq;
            for (ox = 0; ox < ow; ox++, dr += ocp) {
                __m512 d0 = _mm512_loadu_ps(dr), d1 = ov > 1 ? _mm512_loadu_ps(dr + 16) : z;
                DT__WT3_TAP(0, r0, 0); DT__WT3_TAP(1, r0, 1); DT__WT3_TAP(2, r0, 2);
                DT__WT3_TAP(3, r1, 0); DT__WT3_TAP(4, r1, 1); DT__WT3_TAP(5, r1, 2);
                DT__WT3_TAP(6, r2, 0); DT__WT3_TAP(7, r2, 1); DT__WT3_TAP(8, r2, 2);
            }
        } else {         /* stride 2: tap (ky, kx) in phase plane (ky % 2, kx % 2) (pq floats each) */
            const float *e0 = x + oy * wq, *e1 = e0 + wq, *f0 = e0 + pq, *f1 = f0 + wq, *g0 = f0 + pq, *h0 = g0 + pq;
            for (ox = 0; ox < ow; ox++, dr += ocp) {
                __m512 d0 = _mm512_loadu_ps(dr), d1 = ov > 1 ? _mm512_loadu_ps(dr + 16) : z;
                DT__WT3_TAP(0, e0, 0); DT__WT3_TAP(1, f0, 0); DT__WT3_TAP(2, e0, 1);
                DT__WT3_TAP(3, g0, 0); DT__WT3_TAP(4, h0, 0); DT__WT3_TAP(5, g0, 1);
                DT__WT3_TAP(6, e1, 0); DT__WT3_TAP(7, f1, 0); DT__WT3_TAP(8, e1, 1);
            }
        }
    }
    DT__WT3_OUT(0); DT__WT3_OUT(1); DT__WT3_OUT(2); DT__WT3_OUT(3); DT__WT3_OUT(4);
    DT__WT3_OUT(5); DT__WT3_OUT(6); DT__WT3_OUT(7); DT__WT3_OUT(8);
}
#undef DT__WT3_TAP
#undef DT__WT3_OUT
#define DT__WT3_VARIANT(name, ov, st)                                                                                   \
    __attribute__((target("avx512f"))) static void name(const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow, \
                                                        const float *dbT, int64_t ocp, float *dWT) {                    \
        dt__wt3_tile(ov, st, x, wq, pq, oh, ow, dbT, ocp, dWT);                                                          \
    }
DT__WT3_VARIANT(dt__wt3_tile16, 1, 1)
DT__WT3_VARIANT(dt__wt3_tile32, 2, 1)
DT__WT3_VARIANT(dt__wt3_tile16s2, 1, 2)
DT__WT3_VARIANT(dt__wt3_tile32s2, 2, 2)
#undef DT__WT3_VARIANT
/* r[i] <- column i of the 16 x 16 block whose rows are r[0..15] (maskz forms: the plain ones trip GCC 12's
   C++ -Wmaybe-uninitialized inside its own header) */
__attribute__((target("avx512f")))
static void dt__tr16(__m512 *r) {
    __m512 u[16], t[16];
    int i, j;
    for (i = 0; i < 8; i++) {
        u[2 * i] = _mm512_maskz_unpacklo_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
        u[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
    }
    for (i = 0; i < 4; i++)
        for (j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(u[4 * i + j]), b = _mm512_castps_pd(u[4 * i + j + 2]);
            t[4 * i + 2 * j] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, a, b));
            t[4 * i + 2 * j + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, a, b));
        }
    for (i = 0; i < 2; i++)
        for (j = 0; j < 4; j++) {
            u[8 * i + j] = _mm512_maskz_shuffle_f32x4(0xFFFF, t[8 * i + j], t[8 * i + j + 4], 0x88);
            u[8 * i + j + 4] = _mm512_maskz_shuffle_f32x4(0xFFFF, t[8 * i + j], t[8 * i + j + 4], 0xdd);
        }
    for (j = 0; j < 8; j++) {
        r[j] = _mm512_maskz_shuffle_f32x4(0xFFFF, u[j], u[j + 8], 0x88);
        r[j + 8] = _mm512_maskz_shuffle_f32x4(0xFFFF, u[j], u[j + 8], 0xdd);
    }
}
/* dbT [S][ocp] <- dy [oc][S] transposed, columns oc..ocp zero */
__attribute__((target("avx512f")))
static void dt__transpose_dy_avx512(const float *dy, int64_t oc, int64_t S, float *dbT, int64_t ocp) {
    int64_t o0, s0;
    int i;
    for (o0 = 0; o0 < ocp; o0 += 16)
        for (s0 = 0; s0 < S; s0 += 16) {
            __m512 r[16];
            int ns = S - s0 < 16 ? (int)(S - s0) : 16;
            __mmask16 m = (__mmask16)((1u << ns) - 1u);
            for (i = 0; i < 16; i++) r[i] = o0 + i < oc ? _mm512_maskz_loadu_ps(m, dy + (o0 + i) * S + s0) : _mm512_setzero_ps();
            dt__tr16(r);
            for (i = 0; i < ns; i++) _mm512_storeu_ps(dbT + (s0 + i) * ocp + o0, r[i]);
        }
}
/* the 3 x 3 weight gradient's tile for a unit of 16 or 32 output channels */
static void dt__wt3_avx512(int st, int width, const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow, const float *dbT,
                           int64_t ocp, float *dWT) {
    if (st == 1 && width == 32) dt__wt3_tile32(x, wq, pq, oh, ow, dbT, ocp, dWT);
    else if (st == 1) dt__wt3_tile16(x, wq, pq, oh, ow, dbT, ocp, dWT);
    else if (width == 32) dt__wt3_tile32s2(x, wq, pq, oh, ow, dbT, ocp, dWT);
    else dt__wt3_tile16s2(x, wq, pq, oh, ow, dbT, ocp, dWT);
}
/* the AVX-512 kernels for dtrain/cpu/cpu_vec.h's drivers, and the tier's dt_ops.conv_fwd and conv_bwd */
static const dt__shift_kern dt__shift_kern_avx512 = {
    8, 48, dt__shift_tile_avx512, 4, DT__WT_K, dt__shift_wtile_avx512, dt__wt3_avx512, dt__shift_copy_avx512,
    dt__shift_pad_avx512, dt__transpose_dy_avx512
};
static int dt__x86_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    return dt__shift_conv_fwd(&dt__shift_kern_avx512, ctx, g, x, W, b, y);
}
static int dt__x86_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                            float *dx, int accumulate) {
    return dt__shift_conv_bwd(&dt__shift_kern_avx512, ctx, g, x, W, dy, dW, dx, accumulate);
}

/* col2im of one plane xc of at most 16 pixels with AVX-512: tap k's S outputs (at src + k * ld) moved onto
   their pixels by the permutation inv[k] and added there, masked by invm[k] so the other pixels are left as
   they are; the taps in the order of the scalar loop, so the sums round alike */
__attribute__((target("avx512f")))
static void dt__col2im_plane_avx512(const float *src, int64_t ld, int64_t S, int64_t hw, int64_t kk, const int32_t *inv,
                                    const __mmask16 *invm, float *xc) {
    const __mmask16 pm = (__mmask16)((1u << hw) - 1u), sm = (__mmask16)((1u << S) - 1u);
    __m512 acc = _mm512_maskz_loadu_ps(pm, xc);
    int64_t k;
    for (k = 0; k < kk; k++) {
        __m512 v = _mm512_maskz_loadu_ps(sm, src + k * ld);
        acc = _mm512_mask_add_ps(acc, invm[k], acc, _mm512_maskz_permutexvar_ps(invm[k], _mm512_loadu_si512(inv + 16 * k), v));
    }
    _mm512_mask_storeu_ps(xc, pm, acc);
}
/* col2im for images of at most 16 pixels and 16 outputs, a plane at a time in a register; 0 (nothing
   written) when the geometry does not fit */
static int dt__col2im_small(const dt_conv_geom *g, const float *col, float *dx) {
    int64_t S = g->oh * g->ow, hw = g->h * g->w, kk = g->kh * g->kw, nc, t, i;
    int32_t inv[32 * 16];
    __mmask16 invm[32];
    if (S > 16 || hw > 16 || kk > 32) return 0;
    for (t = 0; t < kk; t++) {   /* inv[t][pixel]: the output that tap t reads from that pixel */
        int64_t ky = t / g->kw, kx = t % g->kw, oy, ox;
        invm[t] = 0;
        for (i = 0; i < 16; i++) inv[16 * t + i] = 0;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) {
                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                inv[16 * t + iy * g->w + ix] = (int32_t)(oy * g->ow + ox);
                invm[t] |= (__mmask16)(1u << (iy * g->w + ix));
            }
    }
    DT__OMP(parallel for schedule(static) if (g->c * kk * g->n * S > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++)   /* nc = n * c + ch */
        dt__col2im_plane_avx512(col + (nc % g->c) * kk * g->n * S + nc / g->c * S, g->n * S, S, hw, kk, inv, invm, dx + nc * hw);
    return 1;
}

/* cnt (at most 16) outputs of a 2 x 2 stride-2 max pooling row with AVX-512: rows r0, r1 from column
   2 * ox0 on, the indices from i0 (the window's first tap) on; the same selects as the scalar loop. Masked
   loads and stores: nothing past the 2 * cnt columns is touched. */
__attribute__((target("avx512f")))
static void dt__maxpool2_avx512(const float *r0, const float *r1, int64_t w, int32_t i0, float *yo, int32_t *io, int cnt) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __mmask16 lo = (__mmask16)(cnt >= 8 ? 0xFFFF : (1u << (2 * cnt)) - 1u),
              hi = (__mmask16)(cnt <= 8 ? 0 : cnt >= 16 ? 0xFFFF : (1u << (2 * cnt - 16)) - 1u),
              out = (__mmask16)(cnt >= 16 ? 0xFFFF : (1u << cnt) - 1u);
    __m512 a0 = _mm512_maskz_loadu_ps(lo, r0), a1 = _mm512_maskz_loadu_ps(hi, r0 + 16), b0 = _mm512_maskz_loadu_ps(lo, r1),
           b1 = _mm512_maskz_loadu_ps(hi, r1 + 16);
    __m512 tap[4], best;
    __m512i first = _mm512_add_epi32(_mm512_set1_epi32(i0), _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                              11, 12, 13, 14, 15), 1));
    __m512i bi = first, off[4];
    int k;
    tap[0] = _mm512_permutex2var_ps(a0, even, a1); tap[1] = _mm512_permutex2var_ps(a0, odd, a1);
    tap[2] = _mm512_permutex2var_ps(b0, even, b1); tap[3] = _mm512_permutex2var_ps(b0, odd, b1);
    off[1] = _mm512_set1_epi32(1); off[2] = _mm512_set1_epi32((int32_t)w); off[3] = _mm512_set1_epi32((int32_t)w + 1);
    best = tap[0];
    for (k = 1; k < 4; k++) {
        __mmask16 t = _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q) & _mm512_cmp_ps_mask(tap[k], best, _CMP_NLE_UQ);
        best = _mm512_mask_blend_ps(t, best, tap[k]);
        bi = _mm512_mask_blend_epi32(t, bi, _mm512_add_epi32(first, off[k]));
    }
    _mm512_mask_storeu_ps(yo, out, best);
    _mm512_mask_storeu_epi32((void *)io, out, bi);
}

/* the same sums with AVX-512: 16 floats a step into four vectors of 8 doubles; the lanes then added as
   dt__bn_sums adds its 8 */
__attribute__((target("avx512f")))
static void dt__bn_sums512(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *a,
                           double *b) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), b0 = _mm512_setzero_pd(), b1 = _mm512_setzero_pd();
    int64_t i, k;
    for (i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = (y ? y : x) + i * cs, *r = mk ? mk + i * cs : NULL;
        for (k = 0; k + 16 <= s; k += 16) {
            /* maskz: the plain conversion trips GCC 12's C++ -Wmaybe-uninitialized inside its own header */
            __mmask16 keep = r ? _mm512_cmp_ps_mask(_mm512_loadu_ps(r + k), _mm512_setzero_ps(), _CMP_GT_OQ) : 0xFFFF;
            __m512d p0 = _mm512_maskz_cvtps_pd((__mmask8)keep, _mm256_loadu_ps(p + k)),
                    p1 = _mm512_maskz_cvtps_pd((__mmask8)(keep >> 8), _mm256_loadu_ps(p + k + 8));
            __m512d q0 = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(q + k)),
                    q1 = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(q + k + 8));
            a0 = _mm512_add_pd(a0, p0); a1 = _mm512_add_pd(a1, p1);
            b0 = _mm512_fmadd_pd(p0, q0, b0); b1 = _mm512_fmadd_pd(p1, q1, b1);
        }
        for (; k < s; k++) {
            double pv = r && !(r[k] > 0.0f) ? 0.0 : (double)p[k];
            a[k % 8] += pv;
            b[k % 8] += pv * (double)q[k];
        }
    }
    _mm512_storeu_pd(a + 8, _mm512_add_pd(a0, a1));
    _mm512_storeu_pd(b + 8, _mm512_add_pd(b0, b1));
}

/* ---- AVX2 pooling and batch norm sums ---------------------------------------------------------- */
/* the even (odd 0) or odd (odd 1) floats of the 16 in lo, hi, in order: shuffles work within 128-bit halves,
   so the pairs they leave are put in order by a permutation of 64-bit quarters (AVX2 has no two-register
   permutation of floats) */
__attribute__((target("avx2"), always_inline))
static inline __m256 dt__deal_avx2(__m256 lo, __m256 hi, int odd) {
    __m256 t = odd ? _mm256_shuffle_ps(lo, hi, 0xDD) : _mm256_shuffle_ps(lo, hi, 0x88);   /* lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6 */
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8));
}
/* the selects of 2 x 2 max pooling on a vector of outputs (V: __m256 or __m128, VI its integers, P the
   intrinsics' prefix): the tap wins unless the best is NaN or the tap is <= it */
#define DT__POOL_SELECT(V, VI, P, tap, first, off, best, bi) do {                                                   \
        int k_;                                                                                                     \
        best = tap[0]; bi = first;                                                                                  \
        for (k_ = 1; k_ < 4; k_++) {                                                                                \
            V t_ = P##_and_ps(P##_cmp_ps(best, best, _CMP_ORD_Q), P##_cmp_ps(tap[k_], best, _CMP_NLE_UQ));          \
            V n_ = P##_castsi##VI##_ps(P##_add_epi32(first, off[k_]));   /* the tap's index */                      \
            best = P##_blendv_ps(best, tap[k_], t_);                                                                \
            bi = P##_castps_si##VI(P##_blendv_ps(P##_castsi##VI##_ps(bi), n_, t_));                                 \
        }                                                                                                           \
    } while (0)
/* dt__maxpool2_avx512 with AVX2: 8 outputs a step, the taps dealt from the two rows' 16 floats, then 4 with
   128-bit vectors, the same selects (compare and blend, no mask registers); the last cnt % 4 by the portable
   row, dt__maxpool2_row (AVX2's masked stores are slow on AMD's cores: a kernel of masked steps ran at half
   the portable loop's speed) */
__attribute__((target("avx2")))
static void dt__maxpool2_avx2(const float *r0, const float *r1, int64_t w, int32_t i0, float *yo, int32_t *io, int cnt) {
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i off[4] = {_mm256_setzero_si256(), _mm256_set1_epi32(1), _mm256_set1_epi32((int32_t)w),
                            _mm256_set1_epi32((int32_t)w + 1)};
    int o;
    for (o = 0; o + 8 <= cnt; o += 8) {
        __m256 a0 = _mm256_loadu_ps(r0 + 2 * o), a1 = _mm256_loadu_ps(r0 + 2 * o + 8);
        __m256 b0 = _mm256_loadu_ps(r1 + 2 * o), b1 = _mm256_loadu_ps(r1 + 2 * o + 8);
        __m256 tap[4], best;
        __m256i first = _mm256_add_epi32(_mm256_set1_epi32(i0 + 2 * o), lane2), bi;
        tap[0] = dt__deal_avx2(a0, a1, 0); tap[1] = dt__deal_avx2(a0, a1, 1);
        tap[2] = dt__deal_avx2(b0, b1, 0); tap[3] = dt__deal_avx2(b0, b1, 1);
        DT__POOL_SELECT(__m256, 256, _mm256, tap, first, off, best, bi);
        _mm256_storeu_ps(yo + o, best);
        _mm256_storeu_si256((__m256i *)(void *)(io + o), bi);
    }
    if (o + 4 <= cnt) {   /* 128-bit shuffles deal 8 floats in order */
        const __m128i off4[4] = {_mm_setzero_si128(), _mm_set1_epi32(1), _mm_set1_epi32((int32_t)w),
                                 _mm_set1_epi32((int32_t)w + 1)};
        __m128 a0 = _mm_loadu_ps(r0 + 2 * o), a1 = _mm_loadu_ps(r0 + 2 * o + 4);
        __m128 b0 = _mm_loadu_ps(r1 + 2 * o), b1 = _mm_loadu_ps(r1 + 2 * o + 4);
        __m128 tap[4], best;
        __m128i first = _mm_add_epi32(_mm_set1_epi32(i0 + 2 * o), _mm_setr_epi32(0, 2, 4, 6)), bi;
        tap[0] = _mm_shuffle_ps(a0, a1, 0x88); tap[1] = _mm_shuffle_ps(a0, a1, 0xDD);
        tap[2] = _mm_shuffle_ps(b0, b1, 0x88); tap[3] = _mm_shuffle_ps(b0, b1, 0xDD);
        DT__POOL_SELECT(__m128, 128, _mm, tap, first, off4, best, bi);
        _mm_storeu_ps(yo + o, best);
        _mm_storeu_si128((__m128i *)(void *)(io + o), bi);
        o += 4;
    }
    if (o < cnt) dt__maxpool2_row(r0 + 2 * o, r1 + 2 * o, w, i0 + 2 * o, yo + o, io + o, cnt - o);
}
#undef DT__POOL_SELECT

/* dt__bn_sums's lanes with AVX2 + FMA, in dt__bn_sums's own order: each row's 8s into lanes 0..7, then its
   tail into lanes 0 .. s % 8 - 1 (m not NULL: a masked load, so the other lanes add zero), so every lane adds the same
   terms in the same order as the portable loop, and the result has its bits; a product of two floats is
   exact in double, so the fused multiply-add rounds as the multiply and add do. Lanes 8..15 stay zero. */
__attribute__((target("avx2,fma"), always_inline))
static inline void dt__bn_step_avx2(const float *p, const float *q, const float *r, const __m256i *m, __m256d *a, __m256d *b) {
    __m256 x = m ? _mm256_maskload_ps(p, *m) : _mm256_loadu_ps(p), y = m ? _mm256_maskload_ps(q, *m) : _mm256_loadu_ps(q);
    __m256d x0, x1;
    if (r)   /* 0 where r is not > 0 */
        x = _mm256_and_ps(x, _mm256_cmp_ps(m ? _mm256_maskload_ps(r, *m) : _mm256_loadu_ps(r), _mm256_setzero_ps(), _CMP_GT_OQ));
    x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    a[0] = _mm256_add_pd(a[0], x0);
    a[1] = _mm256_add_pd(a[1], x1);
    b[0] = _mm256_fmadd_pd(x0, _mm256_cvtps_pd(_mm256_castps256_ps128(y)), b[0]);
    b[1] = _mm256_fmadd_pd(x1, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)), b[1]);
}
__attribute__((target("avx2,fma")))
static void dt__bn_sums_avx2(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *a,
                             double *b) {
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(s % 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256d va[2], vb[2];
    int64_t i, k;
    va[0] = _mm256_loadu_pd(a); va[1] = _mm256_loadu_pd(a + 4);
    vb[0] = _mm256_loadu_pd(b); vb[1] = _mm256_loadu_pd(b + 4);
    for (i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = (y ? y : x) + i * cs, *r = mk ? mk + i * cs : NULL;
        if (r) {
            for (k = 0; k + 8 <= s; k += 8) dt__bn_step_avx2(p + k, q + k, r + k, NULL, va, vb);
            if (k < s) dt__bn_step_avx2(p + k, q + k, r + k, &tail, va, vb);
        } else {   /* (a loop of its own: the mask's test leaves it) */
            for (k = 0; k + 8 <= s; k += 8) dt__bn_step_avx2(p + k, q + k, NULL, NULL, va, vb);
            if (k < s) dt__bn_step_avx2(p + k, q + k, NULL, &tail, va, vb);
        }
    }
    _mm256_storeu_pd(a, va[0]); _mm256_storeu_pd(a + 4, va[1]);
    _mm256_storeu_pd(b, vb[0]); _mm256_storeu_pd(b + 4, vb[1]);
}

/* ---- the tables: what each tier replaces (dtrain/cpu/cpu.h chooses one) --------------------------------- */
static int dt__x86_avx512_runs(void) { return __builtin_cpu_supports("avx512f"); }
static int dt__x86_avx2_runs(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
/* AVX-512 (Skylake-X and later Xeons, Ice Lake and later, Zen 4): everything above */
static const dt__kernel dt__kernel_avx512 = {
    "avx512", dt__x86_avx512_runs, dt__micro_avx512, DT__MR512, 16 * DT__NV512, dt__col_span_avx512, dt__pack_a8_avx,
    dt__pack_bt_avx512, dt__col2im_small, dt__maxpool2_avx512, dt__bn_sums512, dt__x86_conv_fwd, dt__x86_conv_bwd,
    DT__X86_BF16_ENTRIES   /* where the CPU has AVX512_BF16 too */
};
/* AVX2 + FMA (Haswell and later, Zen): the GEMM's micro-kernel, dtrain/cpu/cpu_vec.h's convolutions, 2 x 2 max
   pooling and batch norm's sums; the rest is portable */
static const dt__kernel dt__kernel_avx2 = {
    "avx2", dt__x86_avx2_runs, dt__micro_avx2, 6, 16, NULL, NULL, NULL, NULL, dt__maxpool2_avx2, dt__bn_sums_avx2,
    dt__vec_conv_fwd_avx2, dt__vec_conv_bwd_avx2, NULL, NULL, NULL
};
#endif /* DT__X86 */

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
