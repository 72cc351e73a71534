/* dtrain/cpu/cpu_vec.h - the convolutions by shifted rows, written once for every CPU's vectors.   Part of
   dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The convolutions without im2col behind dt_ops.conv_fwd / conv_bwd (docs/design.md, "Convolutions
     without im2col: shifted rows"), in two layers:
       the drivers    the padded geometry, the offset and column tables, the packing of the weights, the
                      loops over images, tiles and threads, and the test of what fits the workspace; plain C
                      that every tier shares, calling a tier's inner kernels through a dt__shift_kern table
       the kernels    the inner tiles (forward and input gradient: dt__vtile; weight gradient: dt__vwtile and
                      dt__vwt3), written once with GCC/Clang vector extensions and instantiated per tier:
                        dt__shift_kern_avx2   x86-64 AVX2 + FMA: 8-float vectors (target attribute)
                        dt__shift_kern_base   the build's baseline: SSE2 on x86-64, NEON on aarch64 (4 floats)
                      The AVX-512 tier plugs its intrinsic kernels (dtrain/cpu/cpu_x86.h) into the same drivers.
     Their twins are im2col + GEMM (dtrain/core/pass.h, cpu.h) and dt_conv2d_ref; test_core and test_models hold
     them equal on every tier the CPU runs.
   HOW THE KERNELS ARE WRITTEN ONCE
     C has no templates, and a vector type has one width (GCC lowers a type wider than the target's
     registers through memory), so the kernels are the body of one macro rather than functions (and rather
     than a section included once per tier, which make single's one file could not repeat),
     DT__VEC_KERNELS(T, TARGET, V, VL, MR, OV, WR, WK): V a vector of VL floats, TARGET the functions'
     target attribute (empty for the baseline), MR, OV, WR, WK the tile shapes, chosen so that the
     accumulators and operands fit the tier's registers (16 on x86-64, 32 on aarch64; the loops over
     them unrolled by pragma, so they stay in registers at -O2 as at -O3). Each use defines
     the functions dt__vtile_T, dt__vwtile_T, dt__vwt3_T and the table dt__shift_kern_T. Loads and stores
     are memcpy of a vector (unaligned, and no aliasing rules broken); a scalar times a vector broadcasts
     it; there is no compress or mask register: a tile's 16 columns go through a small buffer and its kept
     runs (the columns of real pixels) are copied out. The multiply-adds are fused where the CPU can:
     GCC compiles this section with fp-contract=fast (its default outside ISO C), Clang fuses within an
     expression by default, and both then emit FMA (AVX2) or FMLA (NEON) for `c += a * b`.
     Not compiled with DT_NO_SIMD, compilers other than GCC and Clang, or CPUs other than x86 and aarch64
     (the GEMMs then take every convolution).
   USES
     dtrain/core/tensor.h (and base.h through it), through dtrain/cpu/kernel.h (the CPU kernel seam), which also
     holds this module's types that the AVX-512 tier shares (dt__shift_geom, dt__shift_kern).
   READ FIRST
     dt__shift_tile_fn in dtrain/cpu/kernel.h (what a tile computes), dt__shift_image and dt__shift_run (the
     forward pass), DT__VEC_KERNELS (the kernels), dt__shift_conv_fwd and dt__shift_conv_bwd (what the tiers
     call).
*/
#ifndef DTRAIN_CPU_VEC_H
#define DTRAIN_CPU_VEC_H
#include "../core/tensor.h"
/* (no declarations: everything here is reached through dtrain/cpu/cpu.h's kernel tables) */
#endif /* DTRAIN_CPU_VEC_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_CPU_VEC_IMPLEMENTATION_DONE)
#define DTRAIN_CPU_VEC_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"
#include "kernel.h"   /* what is compiled here (DT__SHIFT, DT__VEC_X86, DT__VEC_BASE), and the tiles' tables */

/* The tests' hooks of the shifted convolutions, in every build so the tests compile everywhere */
static DT__MAYBE_UNUSED int dt__shift_off;                  /* 1: never take the shifted path (the tests compare both paths) */
static DT__MAYBE_UNUSED DT__THREAD_LOCAL int64_t dt__shift_taken;   /* calls that took it on this thread (for the tests) */
#ifdef DT__TEST_HOOKS   /* the test programs' handles (tests/dt_test_hooks.h; compiled in by tests/impl_test.c) */
int64_t dt__test_shift_taken(void);
int64_t dt__test_shift_taken(void) { return dt__shift_taken; }
#endif

#ifdef DT__SHIFT
/* ---- the drivers: geometry, tables, loops (every tier) ------------------------------------------- */
/* With an image zero-padded to hp x wp (hp = h + 2 ph, wp = w + 2 pw), output pixel (oy, ox) of a stride-1
   convolution reads padded pixel (oy + ky, ox + kx). Over s = oy * wp + ox, row k = (c, ky, kx) of im2col
   is the padded image itself from offset c * hp * wp + ky * wp + kx on, so the GEMM reads its B operand
   straight from the padded image through a table of K offsets and packs nothing: the output is computed
   over oh rows of wp columns and the last wp - ow columns of each row are dropped. Convolutions of stride 2
   on either axis take the same tiles over phase planes (dt__shift_geom, dt__shift_dgrad2). Each thread takes
   whole images (forward, input gradient) or fixed units of the weight gradient over every image, so each
   output is summed in one order whatever the thread count. Other strides and kernels too large for the
   caches take the packed GEMM. */
#define DT__SHIFT_MAX_W (1 << 17)   /* most weights (oc * c * kh * kw) a shifted convolution takes */
#define DT__SHIFT_SLACK 128         /* zeros after a padded image: the dropped columns read past its end */

/* the padded geometry of one image (dt__shift_geom, dtrain/cpu/kernel.h: the phase planes of strides 2) */
static dt__shift_geom dt__shift_make(int64_t c, int64_t h, int64_t w, int64_t ph, int64_t pw, int64_t kh, int64_t kw, int64_t sh,
                                     int64_t sw) {
    dt__shift_geom s;
    s.c = c; s.h = h; s.w = w; s.ph = ph; s.pw = pw; s.kh = kh; s.kw = kw; s.sh = sh; s.sw = sw;
    s.hp = h + 2 * ph; s.wp = w + 2 * pw; s.oh = (s.hp - kh) / sh + 1; s.ow = (s.wp - kw) / sw + 1;
    s.hq = (s.hp + sh - 1) / sh; s.wq = (s.wp + sw - 1) / sw;
    s.cp = sh * sw * s.hq * s.wq;
    s.ns = s.oh * s.wq;
    s.plane = c * s.cp + DT__SHIFT_SLACK;
    return s;
}
/* offsets of im2col's rows (c, ky, kx), c from c0 to c1, into a padded image */
static void dt__shift_offsets(const dt__shift_geom *s, int64_t c0, int64_t c1, int32_t *off) {
    int64_t c, ky, kx, k = 0, sh = s->sh, sw = s->sw;
    for (c = c0; c < c1; c++)
        for (ky = 0; ky < s->kh; ky++)
            for (kx = 0; kx < s->kw; kx++)
                off[k++] = (int32_t)((c - c0) * s->cp + ((ky % sh) * sw + kx % sw) * s->hq * s->wq + ky / sh * s->wq + kx / sw);
}

/* Where 16 computed columns go (dt__shift_vec, dtrain/cpu/kernel.h). The first 16-byte boundary at or after p, for
   a table inside the float workspace (4 floats of slack); and the table of nv entries for geometry s. */
static dt__shift_vec *dt__shift_vec_at(float *p) { return (dt__shift_vec *)(void *)(((uintptr_t)p + 15) & ~(uintptr_t)15); }
static void dt__shift_vecs(const dt__shift_geom *s, int64_t nv, dt__shift_vec *v) {
    int64_t i, col;
    int l;
    for (i = 0; i < nv; i++) {
        v[i].at = -1; v[i].keep = 0;
        for (l = 0; l < 16; l++) {
            col = i * 16 + l;
            if (col / s->wq >= s->oh || col % s->wq >= s->ow) continue;
            v[i].keep |= 1u << l;
            if (v[i].at < 0) v[i].at = col / s->wq * s->ow + col % s->wq;
        }
        if (v[i].at < 0) v[i].at = 0;   /* nothing kept: never written */
    }
}

/* A tier's inner kernels (dt__shift_kern, dtrain/cpu/kernel.h: a tile, the weight gradient's tiles, the data
   movement); those of every tier but AVX-512 are written once, below. The data movement in plain C (memcpy moves
   rows as fast as vectors do): */
static void dt__shift_copy_c(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t len) {
    int64_t r;
    for (r = 0; r < rows; r++) memcpy(dst + r * ldd, src + r * lds, sizeof(float) * (size_t)len);
}
static void dt__shift_pad_c(const dt__shift_geom *s, const float *x, int64_t c0, int64_t c1, float *xp) {
    int64_t c, iy, ix, pq = s->hq * s->wq;
    if (s->sh == 1 && s->sw == 1) {
        for (c = c0; c < c1; c++)
            dt__shift_copy_c(xp + ((c - c0) * s->hp + s->ph) * s->wp + s->pw, s->wp, x + c * s->h * s->w, s->w, s->h, s->w);
        return;
    }
    for (c = c0; c < c1; c++)   /* strides: padded pixel (py, px) to plane (py % sh, px % sw) at (py / sh, px / sw) */
        for (iy = 0; iy < s->h; iy++) {
            int64_t py = iy + s->ph;
            const float *src = x + (c * s->h + iy) * s->w;
            float *row = xp + (c - c0) * s->cp + (py % s->sh) * s->sw * pq + py / s->sh * s->wq;
            if (s->sw == 1) memcpy(row + s->pw, src, sizeof(float) * (size_t)s->w);
            else for (ix = 0; ix < s->w; ix++) row[((ix + s->pw) % 2) * pq + (ix + s->pw) / 2] = src[ix];
        }
}
static void dt__transpose_dy_c(const float *dy, int64_t oc, int64_t S, float *dbT, int64_t ocp) {
    int64_t o0, s0, o, s;
    for (s0 = 0; s0 < S; s0 += 16)   /* 16 x 16 blocks: each read and written line is used whole */
        for (o0 = 0; o0 < ocp; o0 += 16)
            for (s = s0; s < S && s < s0 + 16; s++)
                for (o = o0; o < o0 + 16; o++) dbT[s * ocp + o] = o < oc ? dy[o * S + s] : 0.0f;
}

/* rows rounded up to whole tiles of mr */
static int64_t dt__shift_rows(int64_t rows, int mr) { return (rows + mr - 1) / mr * mr; }
/* A [rows, K] packed for a tile of mr rows: per tile, K groups of mr (rows past the end are zero). flip:
   row r, column (o, ky, kx) is W[o][r][kh-1-ky][kw-1-kx] of W [oc = K / kk, rows, kh, kw] (the input
   gradient's kernel), else A is W [rows, K] itself. */
static void dt__shift_pack_a(const float *W, int64_t rows, int64_t K, int flip, int64_t kk, int mr, float *Ap) {
    int64_t t, nt = (rows + mr - 1) / mr;
    DT__OMP(parallel for if (nt * K * mr > DT__PAR_MIN))
    for (t = 0; t < nt; t++) {
        int64_t k, i;   /* declared here: private to each thread */
        for (k = 0; k < K; k++)
            for (i = 0; i < mr; i++) {
                int64_t r = t * mr + i;
                float v = 0.0f;
                if (r < rows) v = flip ? W[((k / kk) * rows + r) * kk + (kk - 1 - k % kk)] : W[r * K + k];
                Ap[(t * K + k) * mr + i] = v;
            }
    }
}

/* One image of the shifted convolution: pads src [s->c, h, w] into xp and runs the tiles of Ap [rows, K],
   which write dst [rows, oh, ow] plus bias[row] (bias NULL: none), or add to it (add 1); vec from
   dt__shift_vecs */
static void dt__shift_image(const dt__shift_kern *kn, const dt__shift_geom *s, const float *src, const float *Ap, int64_t rows,
                            const int32_t *off, float *xp, const dt__shift_vec *vec, float *dst, const float *bias, int add) {
    int64_t K = s->c * s->kh * s->kw, S = s->oh * s->ow, t, j;
    kn->pad(s, src, 0, s->c, xp);
#define DT__SHIFT_TILE_AT(t, j)                                                                                         \
    kn->tile(K, Ap + t * K, xp + j, off, vec + j / 16, dst + t * S, S, bias ? bias + t : NULL, add,                     \
             rows - t < kn->mr ? (int)(rows - t) : kn->mr)
    if (K * kn->nc <= 8192)   /* a strip of the image fits in L1: it serves every tile of rows */
        for (j = 0; j < s->ns; j += kn->nc)
            for (t = 0; t < rows; t += kn->mr) DT__SHIFT_TILE_AT(t, j);
    else                      /* a tile of rows of the kernel stays in L1 while the image streams from L2 */
        for (t = 0; t < rows; t += kn->mr)
            for (j = 0; j < s->ns; j += kn->nc) DT__SHIFT_TILE_AT(t, j);
#undef DT__SHIFT_TILE_AT
}

/* The shifted convolution of n images src [n, s->c, h, w] with the packed kernel Ap [rows, c*kh*kw] on
   `threads` threads: dst [n, rows, oh, ow] = it + bias (add 0; bias NULL: none), or += it (add 1).
   ws: threads * need floats, need from dt__shift_run_need. */
#define DT__SHIFT_NVEC(s) (((s)->ns + 47) / 48 * 3)   /* 16-column groups the widest tiles compute */
static int64_t dt__shift_run_need(const dt__shift_geom *s) {
    return s->plane + 4 + 4 * DT__SHIFT_NVEC(s) + s->c * s->kh * s->kw + 16;   /* a table entry: 4 floats */
}
static void dt__shift_run(const dt__shift_kern *kn, const dt__shift_geom *s, int64_t n, const float *src, const float *Ap,
                          int64_t rows, float *dst, const float *bias, int add, float *ws, int64_t need, int threads) {
    int64_t S = s->oh * s->ow;
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0;
        int64_t img;
        float *xp;
        dt__shift_vec *vec;
        int32_t *off;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
#endif
        xp = ws + tid * need;
        vec = dt__shift_vec_at(xp + s->plane);
        off = (int32_t *)(void *)(vec + DT__SHIFT_NVEC(s));
        memset(xp, 0, sizeof(float) * (size_t)s->plane);
        dt__shift_vecs(s, DT__SHIFT_NVEC(s), vec);
        dt__shift_offsets(s, 0, s->c, off);
        DT__OMP(for schedule(static))
        for (img = 0; img < n; img++)
            dt__shift_image(kn, s, src + img * s->c * s->h * s->w, Ap, rows, off, xp, vec, dst + img * rows * S, bias, add);
    }
    (void)threads;
}

/* Floats the weight gradient takes per image of s's geometry when one thread has all oc rows: the padded
   image and dy's rows in s's layout (a multiple of 16 long). A thread needs one image's worth plus an offset
   table of c * kh * kw + 16. */
static int64_t dt__shift_wgrad_image(const dt__shift_geom *s, int64_t oc) {
    return s->plane + (oc + 3) / 4 * 4 * ((s->ns + 15) / 16 * 16);
}
/* The shifted weight gradient dW [oc, c*kh*kw] += dy col^T of geometry g, dy [n, oc, oh, ow], on ws
   (ws_count floats for `threads` threads, as dt__shift_fits checked). The threads split dW into a grid of
   row ranges (in 4s) x channel ranges; each pads its channels of a block of images and sums over every
   image. */
static void dt__shift_wgrad(const dt__shift_kern *kn, const dt_conv_geom *g, const float *x, const float *dy, float *dW,
                            float *ws, int64_t ws_count, int threads) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh, g->sw);
    int64_t kk = g->kh * g->kw, K = g->c * kk, S = g->oh * g->ow, ld = (s.ns + 15) / 16 * 16, per = ws_count / threads;
    int64_t ot = (g->oc + 3) / 4;
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0, nt = 1;
        int64_t gco, gci, o0, o1, c0, c1, nco, K0, xstride, per_img, nb, b0, img, o, k;
        float *xb, *db;
        int32_t *off;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        gco = nt < ot ? nt : ot;
        gci = nt / gco < g->c ? nt / gco : g->c;
        if (tid < gco * gci) {
            o0 = ot * (tid / gci) / gco * 4; o1 = ot * (tid / gci + 1) / gco * 4;
            if (o1 > g->oc) o1 = g->oc;
            c0 = g->c * (tid % gci) / gci; c1 = g->c * (tid % gci + 1) / gci;
            nco = o1 - o0; K0 = (c1 - c0) * kk;
            xstride = (c1 - c0) * s.cp + DT__SHIFT_SLACK;
            per_img = xstride + nco * ld;
            /* about 1 MB of images, counted for all channels and rows, so the blocks (and with them the order
               of the sums) are the same for every thread count */
            nb = ((per - K - 16) < (1 << 18) ? (per - K - 16) : (1 << 18)) / dt__shift_wgrad_image(&s, g->oc);
            if (nb < 1) nb = 1;
            if (nb > g->n) nb = g->n;
            off = (int32_t *)(ws + tid * per);
            xb = ws + tid * per + K0 + 16;
            db = xb + nb * xstride;
            dt__shift_offsets(&s, c0, c1, off);
            memset(xb, 0, sizeof(float) * (size_t)(nb * per_img));
            for (b0 = 0; b0 < g->n; b0 += nb) {
                int64_t m = g->n - b0 < nb ? g->n - b0 : nb;
                for (img = 0; img < m; img++) {
                    kn->pad(&s, x + (b0 + img) * g->c * g->h * g->w, c0, c1, xb + img * xstride);
                    for (o = o0; o < o1; o++)
                        kn->copy(db + (img * nco + o - o0) * ld, s.wq, dy + ((b0 + img) * g->oc + o) * S, g->ow, g->oh, g->ow);
                }
                for (o = o0; o < o1; o += kn->wr)
                    for (k = 0; k < K0; k += kn->wk)
                        kn->wtile(m, ld, db + (o - o0) * ld, ld, nco * ld, xb, xstride, off + k, dW + o * K + c0 * kk + k, K,
                                  o1 - o < kn->wr ? (int)(o1 - o) : kn->wr, K0 - k < kn->wk ? (int)(K0 - k) : kn->wk);
            }
        }
    }
}

/* The weight gradient of a 3 x 3 convolution with dy transposed: dbT [S][ocp] holds each output position's
   dy for every output channel (ocp: oc rounded up to 16, the rest zero), so one tile keeps dW^T's 9 taps of
   one input channel for a vector or two of output channels in registers and sums over the positions there:
   each tap broadcasts its padded x, which a vector of dbT multiplies. No horizontal sums, and 10 or 11 loads
   feed 9 or 18 multiply-adds from data small enough for L1 and L2 (the dot-product tile streams 4 rows of
   dy and 6 of x per 24 from L2). */
/* 1 when the weight gradient of g takes the transposed tiles: 3 x 3, the same stride on both axes */
static int dt__shift_wgrad3_fits(const dt_conv_geom *g) { return g->kh == 3 && g->kw == 3 && g->sh == g->sw; }
/* Floats of workspace the shifted weight gradient of g takes per thread, whatever the thread count (counted
   for every channel, so the path taken does not depend on it): for the transposed tiles, the padded image,
   dy transposed and dW^T; otherwise one image's worth of padded image and dy rows plus an offset table. */
static int64_t dt__shift_wgrad_need(const dt_conv_geom *g) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh, g->sw);
    if (dt__shift_wgrad3_fits(g)) return s.plane + (g->oh * g->ow + g->c * 9) * ((g->oc + 15) / 16 * 16);
    return dt__shift_wgrad_image(&s, g->oc) + g->c * g->kh * g->kw + 16;
}
/* The 3 x 3 weight gradient dW [oc, c*9] += by the transposed tiles (one stride for both axes). The work is
   cut into units of one input channel x 32 output channels; each thread takes a range of units and every
   image in order, so each sum runs in one order whatever the thread count. */
static void dt__shift_wgrad3(const dt__shift_kern *kn, const dt_conv_geom *g, const float *x, const float *dy, float *dW,
                             float *ws, int64_t ws_count, int threads) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, 3, 3, g->sh, g->sw);
    int64_t S = g->oh * g->ow, ocp = (g->oc + 15) / 16 * 16, hw = s.cp, pq = s.hq * s.wq, per = ws_count / threads;
    int64_t nto = (ocp + 31) / 32, units = g->c * nto;
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0, nt = 1;
        int64_t u0, u1, c0, c1, u, img, c, o, oe, t;
        float *xp, *dbT, *dWT;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        u0 = units * tid / nt; u1 = units * (tid + 1) / nt;
        c0 = u0 / nto; c1 = u1 > u0 ? (u1 - 1) / nto + 1 : c0;   /* the channels the units touch */
        xp = ws + tid * per;
        dbT = xp + (c1 - c0) * hw;
        dWT = dbT + S * ocp;
        if (u0 < u1) {
            memset(xp, 0, sizeof(float) * (size_t)((c1 - c0) * hw));
            memset(dWT, 0, sizeof(float) * (size_t)((c1 - c0) * 9 * ocp));
            for (img = 0; img < g->n; img++) {
                kn->pad(&s, x + img * g->c * g->h * g->w, c0, c1, xp);
                kn->transpose_dy(dy + img * g->oc * S, g->oc, S, dbT, ocp);
                for (u = u0; u < u1; u++) {
                    c = u / nto; o = u % nto * 32;
                    kn->wt3((int)s.sh, ocp - o >= 32 ? 32 : 16, xp + (c - c0) * hw, s.wq, pq, g->oh, g->ow, dbT + o, ocp,
                            dWT + (c - c0) * 9 * ocp + o);
                }
            }
            for (u = u0; u < u1; u++) {
                c = u / nto; o = u % nto * 32; oe = o + 32 < g->oc ? o + 32 : g->oc;
                for (; o < oe; o++)
                    for (t = 0; t < 9; t++) dW[(o * g->c + c) * 9 + t] += dWT[((c - c0) * 9 + t) * ocp + o];
            }
        }
    }
}

/* The input gradient of a convolution of strides sh, sw (1 or 2 each, not both 1) by phase planes: dx's padded
   pixel (sh qy + a, sw qx + b) takes the taps (ky, kx) = (a + sh ty, b + sw tx), which read dy at (qy - ty,
   qx - tx); so each phase (a, b) is a shifted-row convolution of dy (padded by th - 1 rows and tw - 1
   columns before it, th = ceil(kh / sh), tw = ceil(kw / sw)) with up to th x tw taps (a 3 x 3 window at
   stride 2: 1 x 1 to 2 x 2), and the sh * sw phases' results are interleaved into dx. Floats of workspace:
   shared (the packed kernels, offsets and column table) and per thread (padded dy and the phases' results);
   dt__shift_dgrad2_fits asks for both per thread, so whether it runs does not depend on the thread count. */
typedef struct dt__dgrad2_geom { int64_t th, tw, hq, wq, wd, pd, S, rp, nv, shared, per; } dt__dgrad2_geom;
static dt__dgrad2_geom dt__dgrad2_make(const dt_conv_geom *g, int mr) {
    dt__dgrad2_geom d;
    int64_t kk = g->kh * g->kw;
    d.th = (g->kh + g->sh - 1) / g->sh; d.tw = (g->kw + g->sw - 1) / g->sw;
    d.hq = (g->h + 2 * g->ph + g->sh - 1) / g->sh; d.wq = (g->w + 2 * g->pw + g->sw - 1) / g->sw; d.wd = d.wq + d.tw - 1;
    d.pd = (d.hq + d.th - 1) * d.wd; d.S = d.hq * d.wq; d.rp = dt__shift_rows(g->c, mr);
    d.nv = (d.hq * d.wd + 47) / 48 * 3;
    d.shared = d.rp * kk * g->oc + kk * g->oc + 4 + 4 * d.nv + 16;
    d.per = g->oc * d.pd + DT__SHIFT_SLACK + g->sh * g->sw * d.S * g->c;
    return d;
}
static int dt__shift_dgrad2_fits(const dt__shift_kern *kn, const dt__cpu_state *st, const dt_conv_geom *g, int threads) {
    dt__dgrad2_geom d = dt__dgrad2_make(g, kn->mr);
    return g->sh * g->sw > 1 && d.shared + d.per <= st->gemm_ws_count / threads;
}
static void dt__shift_dgrad2(const dt__shift_kern *kn, dt__cpu_state *st, const dt_conv_geom *g, const float *W, const float *dy,
                             float *dx, int add, int threads) {
    dt__dgrad2_geom d = dt__dgrad2_make(g, kn->mr);
    int64_t K0[5], p, t, k, rows = g->c, mr = kn->mr, kk = g->kh * g->kw, np = g->sh * g->sw;
    float *Ap = st->gemm_ws, *ws = st->gemm_ws + d.shared;
    int32_t *off = (int32_t *)(void *)(Ap + d.rp * kk * g->oc);
    dt__shift_vec *vec = dt__shift_vec_at(Ap + d.rp * kk * g->oc + kk * g->oc);
    dt__shift_geom vg;
    memset(&vg, 0, sizeof vg);
    vg.wq = d.wd; vg.oh = d.hq; vg.ow = d.wq;   /* computed over hq rows of wd, kept wq of each */
    dt__shift_vecs(&vg, d.nv, vec);
    K0[0] = 0;
    for (p = 0; p < np; p++) {   /* phase p = a sw + b: na x nb taps (ty, tx), none where the window is narrower than the stride */
        int64_t a = p / g->sw, b = p % g->sw, na = (g->kh - a + g->sh - 1) / g->sh, nb = (g->kw - b + g->sw - 1) / g->sw;
        int64_t Kp = g->oc * na * nb;
        K0[p + 1] = K0[p] + Kp;
        for (k = 0; k < Kp; k++) {
            int64_t o = k / (na * nb), ty = k % (na * nb) / nb, tx = k % nb;
            off[K0[p] + k] = (int32_t)(o * d.pd + (d.th - 1 - ty) * d.wd + (d.tw - 1 - tx));
            for (t = 0; t < d.rp; t++)
                Ap[K0[p] * d.rp + (t / mr * Kp + k) * mr + t % mr] =
                    t < rows ? W[((o * g->c + t) * g->kh + a + g->sh * ty) * g->kw + b + g->sw * tx] : 0.0f;
        }
    }
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0;
        int64_t img, o, j, r, c, iy, ix, q;   /* declared here: private to each thread */
        float *dyp, *P;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
#endif
        dyp = ws + tid * d.per;
        P = dyp + g->oc * d.pd + DT__SHIFT_SLACK;
        memset(dyp, 0, sizeof(float) * (size_t)(g->oc * d.pd + DT__SHIFT_SLACK));
        DT__OMP(for schedule(static))
        for (img = 0; img < g->n; img++) {
            const float *dyi = dy + img * g->oc * g->oh * g->ow;
            float *dxi = dx + img * g->c * g->h * g->w;
            for (o = 0; o < g->oc; o++)
                kn->copy(dyp + o * d.pd + (d.th - 1) * d.wd + d.tw - 1, d.wd, dyi + o * g->oh * g->ow, g->ow, g->oh, g->ow);
            for (q = 0; q < np; q++) {   /* (a phase without taps: its tiles write zeros) */
                int64_t Kp = K0[q + 1] - K0[q];
                for (r = 0; r < rows; r += mr)
                    for (j = 0; j < d.hq * d.wd; j += kn->nc)
                        kn->tile(Kp, Ap + K0[q] * d.rp + r * Kp, dyp + j, off + K0[q], vec + j / 16, P + (q * rows + r) * d.S,
                                 d.S, NULL, 0, rows - r < mr ? (int)(rows - r) : (int)mr);
            }
            for (c = 0; c < rows; c++)   /* the phases interleaved into dx (strides 1 or 2: % and / by a mask and a shift) */
                for (iy = 0; iy < g->h; iy++) {
                    int64_t py = iy + g->ph, mw = g->sw - 1;
                    const float *p0 = P + ((py & (g->sh - 1)) * g->sw * rows + c) * d.S + (py >> (g->sh - 1)) * d.wq;
                    float *dr = dxi + (c * g->h + iy) * g->w;
                    for (ix = 0; ix < g->w; ix++) {
                        int64_t px = ix + g->pw;
                        float v = p0[(px & mw) * rows * d.S + (px >> mw)];
                        dr[ix] = add ? dr[ix] + v : v;
                    }
                }
        }
    }
    (void)threads;
}
/* The forward pass (grad 0: y = conv(x, W) + b) or the input gradient (grad 1: dx = the convolution of dy
   with the flipped kernel, or dx += it with add 1) by shifted rows on the model's workspace. Each thread
   takes whole images. */
static void dt__shift_conv(const dt__shift_kern *kn, dt__cpu_state *st, const dt_conv_geom *g, const float *W, const float *src,
                           const float *b, float *dst, int grad, int add, int threads) {
    int64_t kk = g->kh * g->kw, rows = grad ? g->c : g->oc, K = (grad ? g->oc : g->c) * kk, ap = dt__shift_rows(rows, kn->mr) * K;
    dt__shift_geom s = grad ? dt__shift_make(g->oc, g->oh, g->ow, g->kh - 1 - g->ph, g->kw - 1 - g->pw, g->kh, g->kw, 1, 1)
                            : dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh, g->sw);
    dt__shift_pack_a(W, rows, K, grad, kk, kn->mr, st->gemm_ws);
    dt__shift_run(kn, &s, g->n, src, st->gemm_ws, rows, dst, b, add, st->gemm_ws + ap, dt__shift_run_need(&s), threads);
}
/* 1 when the shifted path takes this convolution (forward, or grad: both gradients) on the model's
   workspace with `threads` threads: strides 1 or 2 on each axis, a kernel small enough for the caches (and
   at most 64 wide: the dropped columns read past a padded image), at least an image per thread (with fewer,
   the packed GEMM shares better), at stride 1 the input gradient's padding k - 1 - p not negative, and the
   workspace large enough */
static int dt__shift_fits(const dt__shift_kern *kn, const dt__cpu_state *st, const dt_conv_geom *g, int grad, int threads) {
    int64_t kk = g->kh * g->kw;
    dt__shift_geom s;
    if (!st || !st->gemm_ws || dt__shift_off || g->sh < 1 || g->sh > 2 || g->sw < 1 || g->sw > 2 || g->kw + 64 > DT__SHIFT_SLACK ||
        g->oc * g->c * kk > DT__SHIFT_MAX_W || g->n < threads)
        return 0;
    s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh, g->sw);
    if (!grad) return dt__shift_rows(g->oc, kn->mr) * g->c * kk + threads * dt__shift_run_need(&s) <= st->gemm_ws_count;
    if (st->gemm_ws_count / threads < dt__shift_wgrad_need(g)) return 0;
    if (g->sh * g->sw > 1) return 1;   /* the weight gradient; the input gradient's phases are checked when it runs */
    if (g->ph > g->kh - 1 || g->pw > g->kw - 1) return 0;
    s = dt__shift_make(g->oc, g->oh, g->ow, g->kh - 1 - g->ph, g->kw - 1 - g->pw, g->kh, g->kw, 1, 1);
    return dt__shift_rows(g->c, kn->mr) * g->oc * kk + threads * dt__shift_run_need(&s) <= st->gemm_ws_count;
}
/* dt_ops.conv_fwd and conv_bwd with a tier's kernels: 0 when the GEMMs are to take the convolution; 2 when
   conv_bwd wrote dW but leaves dx to them */
static int dt__shift_conv_fwd(const dt__shift_kern *kn, void *ctx, const dt_conv_geom *g, const float *x, const float *W,
                              const float *b, float *y) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int threads = dt_cpu_threads();
    if (!dt__shift_fits(kn, st, g, 0, threads)) return 0;
    dt__shift_conv(kn, st, g, W, x, b, y, 0, 0, threads);
    dt__shift_taken++;
    return 1;
}
static int dt__shift_conv_bwd(const dt__shift_kern *kn, void *ctx, const dt_conv_geom *g, const float *x, const float *W,
                              const float *dy, float *dW, float *dx, int accumulate) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int threads = dt_cpu_threads();
    if (!dt__shift_fits(kn, st, g, 1, threads)) return 0;
    if (dt__shift_wgrad3_fits(g)) dt__shift_wgrad3(kn, g, x, dy, dW, st->gemm_ws, st->gemm_ws_count, threads);
    else dt__shift_wgrad(kn, g, x, dy, dW, st->gemm_ws, st->gemm_ws_count, threads);
    dt__shift_taken++;
    if (dx && g->sh * g->sw > 1 && !dt__shift_dgrad2_fits(kn, st, g, threads)) return 2;   /* the input gradient by the GEMMs */
    if (dx && g->sh * g->sw > 1) { dt__shift_dgrad2(kn, st, g, W, dy, dx, accumulate != 0, threads); return 1; }
    if (dx) dt__shift_conv(kn, st, g, W, dy, NULL, dx, 1, accumulate != 0, threads);
    return 1;
}
#endif /* DT__SHIFT */

#if defined(DT__VEC_X86) || defined(DT__VEC_BASE)
/* ---- the kernels, once for every tier's vectors ---------------------------------------------------- */
/* Fused multiply-adds where the target has them: GCC contracts `c += a * b` only with fp-contract=fast
   (-std=c11 turns it off); Clang contracts within an expression by default. */
#if !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif

/* every iteration of a loop over a tile's registers written out, at -O2 too, so its vectors stay in
   registers (GCC and Clang both read this pragma) */
#define DT__UNROLL _Pragma("GCC unroll 16")
/* the lanes of one vector as floats, t[VL] from and to memory */
#define DT__VLOAD(V, p) (__extension__({ V v_; memcpy(&v_, (p), sizeof v_); v_; }))

/* DT__VEC_KERNELS(T, TARGET, V, VL, MR, OV, WR, WK): the kernels of tier T on vectors V of VL floats.
     dt__vtile_T    MR rows x 16 columns (16 / VL vectors): MR * 16 / VL accumulators, 16 / VL loads of
                    the image and MR broadcasts of the weights per k
     dt__vwt3_T     9 taps x OV vectors of output channels: 9 * OV accumulators, OV loads of dy^T and 9
                    broadcasts of x per position; OV * VL channels per call, which a 16 or 32 wide unit
                    repeats
     dt__vwtile_T   WR rows of dy x WK offsets into x, VL positions at a time: WR * WK accumulators */
#define DT__VEC_KERNELS(T, TARGET, V, VL, MR, OV, WR, WK)                                                              \
    TARGET static void dt__vtile_##T(int64_t K, const float *DT__RESTRICT a, const float *xp, const int32_t *off,      \
                                     const dt__shift_vec *vec, float *dst, int64_t S, const float *bias, int add,      \
                                     int rows) {                                                                       \
        V c[MR][16 / VL], z;                                                                                           \
        float y[16];                                                                                                   \
        int64_t k;                                                                                                     \
        int i, v;                                                                                                      \
        memset(&z, 0, sizeof z);                                                                                       \
        DT__UNROLL for (i = 0; i < MR; i++)                                                                            \
            DT__UNROLL for (v = 0; v < 16 / VL; v++) c[i][v] = z;                                                      \
        for (k = 0; k < K; k++) {                                                                                      \
            const float *b = xp + off[k], *ak = a + MR * k;                                                            \
            V bv[16 / VL];                                                                                             \
            DT__UNROLL for (v = 0; v < 16 / VL; v++) bv[v] = DT__VLOAD(V, b + v * VL);                                 \
            DT__UNROLL for (i = 0; i < MR; i++)                                                                        \
                DT__UNROLL for (v = 0; v < 16 / VL; v++) c[i][v] += ak[i] * bv[v];                                     \
        }                                                                                                              \
        for (i = 0; i < rows; i++) {                                                                                   \
            DT__UNROLL for (v = 0; v < 16 / VL; v++) {                                                                 \
                V r = c[i][v] + (bias ? bias[i] : 0.0f);                                                               \
                memcpy(y + v * VL, &r, sizeof r);                                                                      \
            }                                                                                                          \
            dt__vkept(y, vec->keep, dst + i * S + vec->at, add);                                                       \
        }                                                                                                              \
    }                                                                                                                  \
    TARGET static inline __attribute__((always_inline)) void dt__vwt3_body_##T(const int st, const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow, \
                                         const float *dbT, int64_t ocp, float *dWT) {                                  \
        V acc[9][OV], z;                                                                                               \
        int64_t oy, ox, toff[9];                                                                                       \
        int t, v;                                                                                                      \
        memset(&z, 0, sizeof z);                                                                                       \
        DT__UNROLL for (t = 0; t < 9; t++) {   /* tap (ky, kx): stride 1 at (ky, kx), stride 2 in plane (ky % 2, kx % 2) */ \
            int ky = t / 3, kx = t % 3;                                                                                \
            toff[t] = st == 1 ? ky * wq + kx : ((ky % 2) * 2 + kx % 2) * pq + ky / 2 * wq + kx / 2;                    \
            DT__UNROLL for (v = 0; v < OV; v++) acc[t][v] = z;                                                         \
        }                                                                                                              \
        for (oy = 0; oy < oh; oy++) {                                                                                  \
            const float *dr = dbT + oy * ow * ocp, *row = x + oy * wq;                                                 \
            for (ox = 0; ox < ow; ox++, dr += ocp) {                                                                   \
                V d[OV];                                                                                               \
                DT__UNROLL for (v = 0; v < OV; v++) d[v] = DT__VLOAD(V, dr + v * VL);                                  \
                DT__UNROLL for (t = 0; t < 9; t++) {                                                                   \
                    float xv = row[toff[t] + ox];                                                                      \
                    DT__UNROLL for (v = 0; v < OV; v++) acc[t][v] += xv * d[v];                                        \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        DT__UNROLL for (t = 0; t < 9; t++)                                                                             \
            DT__UNROLL for (v = 0; v < OV; v++) {                                                                      \
                V s = DT__VLOAD(V, dWT + t * ocp + v * VL) + acc[t][v];                                                \
                memcpy(dWT + t * ocp + v * VL, &s, sizeof s);                                                          \
            }                                                                                                          \
    }                                                                                                                  \
    TARGET static void dt__vwt3_##T(int st, int width, const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow, \
                                    const float *dbT, int64_t ocp, float *dWT) {                                       \
        int o;                                                                                                         \
        for (o = 0; o < width; o += OV * VL)                                                                           \
            if (st == 1) dt__vwt3_body_##T(1, x, wq, pq, oh, ow, dbT + o, ocp, dWT + o);                               \
            else dt__vwt3_body_##T(2, x, wq, pq, oh, ow, dbT + o, ocp, dWT + o);                                       \
    }                                                                                                                  \
    TARGET static void dt__vwtile_##T(int64_t nimg, int64_t ld, const float *d, int64_t ldd, int64_t dstride,          \
                                      const float *xp, int64_t xstride, const int32_t *off, float *dW, int64_t ldw,    \
                                      int ni, int nk) {                                                                \
        V acc[WR][WK], z;                                                                                              \
        const float *dr[WR];                                                                                           \
        int32_t o[WK];                                                                                                 \
        int64_t img, s;                                                                                                \
        int i, j;                                                                                                      \
        memset(&z, 0, sizeof z);                                                                                       \
        DT__UNROLL for (i = 0; i < WR; i++) {                                                                          \
            dr[i] = d + (i < ni ? i : ni - 1) * ldd;                                                                   \
            DT__UNROLL for (j = 0; j < WK; j++) acc[i][j] = z;                                                         \
        }                                                                                                              \
        DT__UNROLL for (j = 0; j < WK; j++) o[j] = off[j < nk ? j : nk - 1];                                           \
        for (img = 0; img < nimg; img++) {                                                                             \
            const float *xi = xp + img * xstride;                                                                      \
            for (s = 0; s < ld; s += VL) {                                                                             \
                V av[WR];                                                                                              \
                DT__UNROLL for (i = 0; i < WR; i++) av[i] = DT__VLOAD(V, dr[i] + img * dstride + s);                   \
                DT__UNROLL for (j = 0; j < WK; j++) {                                                                  \
                    V b = DT__VLOAD(V, xi + o[j] + s);                                                                 \
                    DT__UNROLL for (i = 0; i < WR; i++) acc[i][j] += av[i] * b;                                        \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        for (i = 0; i < ni; i++)                                                                                       \
            for (j = 0; j < nk; j++) {                                                                                 \
                float t[VL];                                                                                           \
                memcpy(t, &acc[i][j], sizeof t);                                                                       \
                dW[i * ldw + j] += dt__vsum(t, VL);                                                                    \
            }                                                                                                          \
    }                                                                                                                  \
    static const dt__shift_kern dt__shift_kern_##T = {MR, 16, dt__vtile_##T, WR, WK, dt__vwtile_##T, dt__vwt3_##T,     \
                                                      dt__shift_copy_c, dt__shift_pad_c, dt__transpose_dy_c};

/* the kept lanes of 16 computed columns y (keep: bit l for lane l) to d in order, or added to it (add 1):
   each run of kept lanes by one loop, so no lane is tested alone (not inlined: GCC then loses track of
   which lanes of y a tile wrote, and warns) */
static __attribute__((noinline)) void dt__vkept(const float *y, uint32_t keep, float *d, int add) {
    int l, n, q;
    if (keep == 0xFFFFu) {
        if (add) for (q = 0; q < 16; q++) d[q] += y[q];
        else memcpy(d, y, sizeof(float) * 16);
        return;
    }
    while (keep) {
        l = __builtin_ctz(keep);
        n = __builtin_ctz(~(keep >> l));   /* keep has 16 bits: the complement ends the run */
        if (add) for (q = 0; q < n; q++) d[q] += y[l + q];
        else memcpy(d, y + l, sizeof(float) * (size_t)n);
        d += n;
        keep &= ~(((1u << n) - 1u) << l);
    }
}
/* the sum of n (a power of 2) floats, pairwise */
static inline __attribute__((always_inline)) float dt__vsum(float *t, int n) {
    int w, i;
    for (w = n / 2; w > 0; w /= 2)
        for (i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
}

#ifdef DT__VEC_X86
/* AVX2 + FMA: 16 registers of 8 floats; tiles 6 x 16 (12 accumulators), 9 taps x 8 channels (9), 2 x 6 (12) */
typedef float dt__v8 __attribute__((vector_size(32)));
DT__VEC_KERNELS(avx2, __attribute__((target("avx2,fma"))), dt__v8, 8, 6, 1, 2, 6)
#endif
#ifdef DT__VEC_BASE
#ifdef __aarch64__
/* NEON: 32 registers of 4 floats; tiles 5 x 16 (20 accumulators; with 6 rows GCC holds the 6 weights in
   registers of their own and spills accumulators), 9 taps x 8 channels (18), 4 x 4 (16) */
DT__VEC_KERNELS(base, , dt__v4, 4, 5, 2, 4, 4)
#else
/* SSE2: 16 registers of 4 floats, no FMA (a product needs a register of its own); tiles 2 x 16 (8
   accumulators), 9 taps x 4 channels (9), 2 x 4 (8) */
DT__VEC_KERNELS(base, , dt__v4, 4, 2, 1, 2, 4)
#endif
#endif
#undef DT__VEC_KERNELS
#undef DT__VLOAD
#undef DT__UNROLL

#if !defined(__clang__)
#pragma GCC pop_options
#endif

/* the tiers' dt_ops.conv_fwd and conv_bwd (dtrain/cpu/cpu.h's, cpu_x86.h's and cpu_arm.h's tables) */
#ifdef DT__VEC_X86
static int dt__vec_conv_fwd_avx2(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    return dt__shift_conv_fwd(&dt__shift_kern_avx2, ctx, g, x, W, b, y);
}
static int dt__vec_conv_bwd_avx2(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                                 float *dx, int accumulate) {
    return dt__shift_conv_bwd(&dt__shift_kern_avx2, ctx, g, x, W, dy, dW, dx, accumulate);
}
#endif
#ifdef DT__VEC_BASE
static int dt__vec_conv_fwd_base(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    return dt__shift_conv_fwd(&dt__shift_kern_base, ctx, g, x, W, b, y);
}
static int dt__vec_conv_bwd_base(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                                 float *dx, int accumulate) {
    return dt__shift_conv_bwd(&dt__shift_kern_base, ctx, g, x, W, dy, dW, dx, accumulate);
}
#endif
#endif /* the kernels */

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
