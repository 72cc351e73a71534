/* dtrain/cpu/kernel.h - the CPU kernel seam: what dtrain/core/tensor.h's plain ops and the CPU backend's files
   (dtrain/cpu/) share (not part of the API).   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h).

   The second internal header beside dtrain/core/internal.h, in its form (docs/design.md, "The modules"; checked by
   tools/check_modules.py): a group per module that provides something here, under the heading that names it
   and under #ifdef DTRAIN_<NAME>_IMPLEMENTATION_DONE, which that module defines where its implementation part
   begins; the module includes this file there, after internal.h, and so does each module that uses a group.
   No include guard: a group's types and macros are defined once (under a guard of their own), its prototypes
   may repeat. Where a module here names another's function, type or macro, this is where it is declared:
     tensor.h     the kernel table dt__kernel (what a faster tier may replace, each entry beside its portable
                  twin), GNU C's vector types (DT__VEC), the GEMM's B source dt__bsrc, the CPU backend's state
                  dt__cpu_state (the model holds one: dtrain/core/nn.h), and the plain ops the CPU table
                  takes (as they are, or with the chosen table: the k or kt argument)
     cpu_vec.h    which convolutions by shifted rows a build compiles, the tiles' table dt__shift_kern that
                  each tier fills (cpu_x86.h's AVX-512 tiles), the drivers that take one, and the tiers' entries
     cpu_x86.h    its tables (AVX-512, AVX2), cpu_arm.h its (NEON), for dtrain/cpu/cpu.h's list of tiers
   make single writes each group in where its module includes this file. */

/* ==== dtrain/core/tensor.h: the kernel table, the vector types, and the plain ops of the CPU table ==== */
#ifdef DTRAIN_TENSOR_IMPLEMENTATION_DONE
#ifndef DT__KERNEL_TENSOR_TYPES
#define DT__KERNEL_TENSOR_TYPES
/* The portable kernels' vectors: GCC's and Clang's vector types (no intrinsics, no -march) compile to the
   baseline's vector instructions (SSE2 on x86-64, NEON on aarch64). DT__VEC is 0 with another compiler or
   DT_NO_SIMD, and the kernels then run as plain loops; so it is where float arithmetic is evaluated in double
   (FLT_EVAL_METHOD 1: s390x's gcc in ISO C mode, -std=c11), which promotes the scalar of a vector's product
   past what the vector types take. Loads and stores go through memcpy: unaligned (dt__v4_load). The types
   are there wherever GCC or Clang builds SIMD: dtrain/cpu/cpu_vec.h's kernels at the baseline take dt__v4
   also where DT__VEC is 0 (GCC before 9). */
#if defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 9) && !defined(DT_NO_SIMD) && \
    (!defined(__FLT_EVAL_METHOD__) || __FLT_EVAL_METHOD__ == 0)
#define DT__VEC 1
#else
#define DT__VEC 0
#endif
#if defined(__GNUC__) && !defined(DT_NO_SIMD)
typedef float dt__v4 __attribute__((vector_size(16)));
typedef int32_t dt__v4i __attribute__((vector_size(16)));
typedef double dt__v4d __attribute__((vector_size(32)));   /* two SSE2 or NEON registers */
#endif

/* What a faster CPU tier may replace. dtrain/cpu/cpu.h chooses one table per process (the fastest this CPU runs,
   or the one dt_cpu_set_tier names) and passes it down; dtrain/cpu/cpu_x86.h fills the AVX2 and AVX-512 tables.
   An entry left NULL runs the portable code, which is its reference twin: the function named in its comment
   (in dtrain/core/tensor.h or dtrain/cpu/cpu.h), with the same contract. test_core holds every entry equal to its twin. */
typedef void (*dt__micro_fn)(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int64_t mr, int64_t nr,
                             float alpha, float beta);
typedef struct dt__kernel {
    const char *name;     /* the tier: "avx512", "avx2", "portable" ("neon" on aarch64) */
    int (*runs)(void);    /* 1 when this CPU has the tier's instructions (NULL: every CPU does) */
    /* the blocked GEMM's micro-kernel (twin: dt__micro, dtrain/cpu/cpu.h): C = alpha a b + beta C for an
       mr x nr tile of packed panels a [kc][mr] and b [kc][nr]; the packing follows mr and nr */
    dt__micro_fn fn;
    int mr, nr;
    /* dt__col_span with stride 1 (contiguous dst) */
    void (*col_span)(const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx, int64_t n, int64_t oy,
                     int64_t ox, int64_t len, float *dst);
    /* dt__pack_a's 8-tall panels of A's rows: dst[p * 8 + i] = A[i * lda + p], p < kc8 (a multiple of 8) */
    void (*pack_a8)(const float *A, int64_t lda, int64_t kc8, float *dst);
    /* dt__pack_b's panels of B^T: dst[p * NR + j] = B[j * ldb + p], p < kc, j < nr, zero for j >= nr (NR a
       multiple of 16) */
    void (*pack_bt)(const float *B, int64_t ldb, int64_t kc, int64_t nr, float *dst, int NR);
    /* dt__col2im for the geometries it takes: 1 when it wrote dx, 0 to leave it to the portable loop */
    int (*col2im)(const dt_conv_geom *g, const float *col, float *dx);
    /* cnt (at most 16) outputs of a 2 x 2 stride-2 max pooling row, as dt__maxpool_fwd's scalar loop */
    void (*maxpool2)(const float *r0, const float *r1, int64_t w, int32_t i0, float *yo, int32_t *io, int cnt);
    /* dt__bn_sums's sums before the lanes are added: a[16], b[16] (zero on entry) += the terms k with
       k % 8 == j in lane j or j + 8, which dt__bn_sums then adds (AVX-512: its vector lanes in 8..15, the
       tail in 0..7; AVX2: all in 0..7, in the portable loop's order) */
    void (*bn_sums)(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *a, double *b);
    /* dt_ops.conv_fwd and conv_bwd (convolutions without im2col: 0 = not taken, the GEMMs then run; twins:
       dt_conv2d_ref and the im2col + GEMM path of dtrain/core/pass.h) */
    int (*conv_fwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y);
    int (*conv_bwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                    int accumulate);
    /* The GEMM on bf16 operands (a bf16 model's, dt__cpu_state.bf16), where the CPU multiplies bf16 pairs (bf16_runs
       NULL or 0: the float micro-kernel above runs on the rounded floats; twin: dt__gemm_ref_src on bf16-rounded
       operands, the same up to the order of the sums). bf16_pair turns a packed panel [kc][w] of floats, in place, into
       (kc + 1) / 2 rows of w pairs (the bf16 of rows 2q and 2q + 1, a zero after an odd kc's last row), each pair the
       32 bits of one float; bf16_fn is fn on such panels, kc counting pairs. */
    int (*bf16_runs)(void);
    void (*bf16_pair)(float *panel, int64_t kc, int w);
    dt__micro_fn bf16_fn;
} dt__kernel;

/* Where a GEMM's op(B) comes from: a matrix B with row stride ldb (transposed when tb), or, when g is set,
   im2col(B) of the images B with geometry g, packed straight from the images and never materialised:
   op(B) = col [c*kh*kw, n*oh*ow] (tb = 0) or its transpose (tb = 1). */
typedef struct dt__bsrc { const float *B; int64_t ldb; int tb; const dt_conv_geom *g; } dt__bsrc;

/* The CPU backend's own state, when a model gives it one: the GEMM packing workspace and the model's
   convolution workspace (the taps' operands, dtrain/cpu/cpu.h), so a training step allocates nothing.
   bf16: the model's precision is bf16, so its GEMMs' operands are bf16 values, which a tier with bf16 products
   (AVX512_BF16) may multiply as such (dtrain/cpu/cpu.h's dt__gemm_src). */
typedef struct dt__cpu_state { float *gemm_ws; int64_t gemm_ws_count; float *conv_ws; int64_t conv_ws_count; int bf16; } dt__cpu_state;
#endif /* the types */

#if DT__VEC
static dt__v4 dt__v4_load(const float *p);
#endif
/* im2col's columns inside the image, and one stretch of a row of im2col (k: a faster stretch; NULL: none) */
static void dt__col_cols(const dt_conv_geom *g, int64_t kx, int64_t *lo, int64_t *hi);
static void dt__col_span(const dt__kernel *k, const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx,
                         int64_t n, int64_t oy, int64_t ox, int64_t len, float *DT__RESTRICT dst, int64_t stride);
/* the unblocked GEMM, the twin of dtrain/cpu/cpu.h's blocked one; a micro-tile's clipped write-back */
static void dt__gemm_ref_src(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                             const dt__bsrc *bs, float beta, float *C, int64_t ldc);
static void dt__micro_store(const float *c, int64_t ldt, float *C, int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta);
/* the ops with a faster twin, taking the chosen table (NULL: the portable code alone); a 2 x 2 pooling row */
static void dt__im2col(const dt__kernel *k, const dt_conv_geom *g, const float *x, float *col);
static void dt__col2im(const dt__kernel *k, const dt_conv_geom *g, const float *col, float *dx);
static void dt__channel_sums(const dt__kernel *k, float *db, const float *dy, int64_t n, int64_t c, int64_t s);
static void dt__maxpool_fwd(const dt__kernel *k, const dt_conv_geom *g, const float *x, float *y, int32_t *idx);
static void dt__maxpool2_row(const float *DT__RESTRICT r0, const float *DT__RESTRICT r1, int64_t w, int32_t i0,
                             float *DT__RESTRICT yo, int32_t *DT__RESTRICT io, int64_t cnt);
static void dt__bn_fwd(const dt__kernel *kt, int training, int relu, const float *x, const float *res, float *y, int64_t n, int64_t c, int64_t s,
                       const float *gamma,
                       const float *beta, float *rm, float *rv, float eps, float momentum, float *save_mean,
                       float *save_invstd);
/* batch norm's sums of one channel in double (sx += x, sxy += x y, or x x with y NULL; mk: a mask that zeroes x where it is not > 0) */
static void dt__bn_sums(const dt__kernel *k, const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s,
                        double *sx, double *sxy);
static void dt__bn_bwd(const dt__kernel *kt, int training, const float *x, const float *y, const float *dy, float *dx, int acc, float *dr, int acc_r,
                       int64_t n, int64_t c, int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                       float *dgamma, float *dbeta);
/* y = x rounded to bfloat16 (nearest, ties to even, NaN kept: dt_bf16_from_float's rounding), as floats; y may be x */
static void dt__round_bf16(float *y, const float *x, int64_t n);
/* the plain ops the CPU table takes as they are, in dt_ops' order */
static void *dt__cpu_alloc(void *ctx, int64_t bytes);
static void dt__cpu_free(void *ctx, void *p);
static void dt__cpu_upload(void *ctx, void *dst, const void *src, int64_t bytes);
static void dt__cpu_copy(void *ctx, float *dst, const float *src, int64_t n);
static void dt__cpu_fill(void *ctx, float *x, int64_t n, float v);
static void dt__cpu_scale(void *ctx, float *x, int64_t n, float a);
static void dt__cpu_axpy(void *ctx, float *y, const float *x, int64_t n, float a);
static void dt__cpu_add(void *ctx, float *y, const float *a, const float *b, int64_t n);
static void dt__cpu_add_row_bias(void *ctx, float *y, const float *b, int64_t rows, int64_t cols);
static void dt__cpu_sum_rows_bwd(void *ctx, float *db, const float *dy, int64_t rows, int64_t cols);
static void dt__cpu_cs_to_ncs(void *ctx, float *y, const float *t, const float *b, int64_t n, int64_t c, int64_t s);
static void dt__cpu_ncs_to_cs(void *ctx, float *t, const float *y, int64_t n, int64_t c, int64_t s);
static void dt__cpu_maxpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, const int32_t *idx, float *dx);
static void dt__cpu_avgpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y);
static void dt__cpu_avgpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, float *dx);
static void dt__cpu_gap_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t s);
static void dt__cpu_gap_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t s);
static void dt__cpu_relu_fwd(void *ctx, const float *x, float *y, int64_t n);
static void dt__cpu_relu_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n);
static void dt__cpu_dropout_fwd(void *ctx, const float *x, float *y, float *mask, int64_t n, float p, uint64_t key);
static void dt__cpu_mul_bwd(void *ctx, const float *dy, const float *mask, float *dx, int64_t n);
static void dt__cpu_pad_shortcut_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t h, int64_t w,
                                     int64_t oc, int64_t stride);
static void dt__cpu_pad_shortcut_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t h, int64_t w,
                                     int64_t oc, int64_t stride);
static void dt__cpu_log_softmax_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t k);
static void dt__cpu_log_softmax_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n, int64_t k);
static void dt__cpu_softmax_xent(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, float *dx,
                                 float *loss);
static void dt__cpu_nll(void *ctx, const float *logp, const int32_t *labels, int64_t n, int64_t k, float *dx,
                        float *loss);
static void dt__cpu_mse(void *ctx, const float *x, const float *target, int64_t n, float *dx, float *loss);
static void dt__cpu_count_correct(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k,
                                  int64_t *correct);
static void dt__cpu_sum_squares(void *ctx, const float *x, int64_t n, double *out);
static void dt__cpu_sgd_step(void *ctx, float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                             float dampening, float wd, int nesterov, int first);
static void dt__cpu_adam_step(void *ctx, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt);
static void dt__cpu_add_relu_fwd(void *ctx, float *y, const float *a, const float *b, int64_t n);
static void dt__cpu_add_relu_bwd(void *ctx, const float *y, const float *dy, float *da, int acc_a, float *db, int acc_b,
                                 int64_t n);
#endif

/* ==== dtrain/cpu/cpu_vec.h: the convolutions by shifted rows, and the tiles' table a tier fills ==== */
#ifdef DTRAIN_CPU_VEC_IMPLEMENTATION_DONE
#ifndef DT__KERNEL_CPU_VEC_TYPES
#define DT__KERNEL_CPU_VEC_TYPES
/* what the build compiles (GCC or Clang, x86 or aarch64, not DT_NO_SIMD) */
#if defined(__GNUC__) && !defined(DT_NO_SIMD) && (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__))
#define DT__SHIFT 1      /* the shifted convolutions are compiled */
#if defined(__x86_64__) || defined(__i386__)
#define DT__VEC_X86 1    /* and their AVX2 kernels */
#endif
#if defined(__x86_64__) || defined(__aarch64__)
#define DT__VEC_BASE 1   /* and their kernels at the baseline ISA (SSE2, NEON) */
#endif
#endif

#ifdef DT__SHIFT
/* The padded geometry of one image of c channels h x w, padded by ph, pw, for a kh x kw window with strides
   sh, sw (1 or 2 each). With strides each channel is stored as sh * sw phase planes of hq x wq (plane (a, b)
   holds the padded pixels (sh qy + a, sw qx + b)), so that output (oy, ox) reads tap (ky, kx) in plane
   (ky % sh, kx % sw) at (oy + ky / sh, ox + kx / sw): a shifted row again, over s = oy * wq + ox, with nothing
   computed twice. */
typedef struct dt__shift_geom {
    int64_t c, h, w, ph, pw, kh, kw, hp, wp, oh, ow;
    int64_t sh, sw, hq, wq;   /* strides; a phase plane's rows and columns (hp, wp with stride 1) */
    int64_t cp;      /* floats of one channel: sh * sw * hq * wq */
    int64_t ns;      /* outputs computed per channel: oh * wq */
    int64_t plane;   /* floats of one padded image: c * cp + DT__SHIFT_SLACK */
} dt__shift_geom;

/* Where 16 computed columns go: their kept lanes (keep: those of output pixels, not the wp - ow junk
   columns after each row) to the output from pixel `at` on, in order. */
typedef struct dt__shift_vec { int64_t at; uint32_t keep; } dt__shift_vec;

/* A tier's inner kernels of the shifted convolutions. A tile: sum_k a[k][i] xp[off[k] + j] for mr rows i
   (rows of them kept) x nc columns j, each 16 columns' kept lanes written (packed together, as vec says)
   to row i of dst (rows S apart) plus bias[i] (bias NULL: none), or added to it (add 1); a is packed by
   dt__shift_pack_a in groups of mr rows. */
typedef void (*dt__shift_tile_fn)(int64_t K, const float *DT__RESTRICT a, const float *xp, const int32_t *off,
                                  const dt__shift_vec *vec, float *dst, int64_t S, const float *bias, int add, int rows);
typedef struct dt__shift_kern {
    int mr, nc;   /* a tile's rows (at most 8) and columns (16 or 48) */
    dt__shift_tile_fn tile;
    /* the weight gradient's dot-product tile: dW[i][k] += sum over nimg images and s < ld of d[img][i][s]
       xp[img][off[k] + s], for wr rows i and wk offsets k (ni, nk of them kept); d's rows ldd apart, ld a
       multiple of 16, images dstride and xstride apart; wr divides 4, the threads' unit of rows */
    int wr, wk;
    void (*wtile)(int64_t nimg, int64_t ld, const float *d, int64_t ldd, int64_t dstride, const float *xp, int64_t xstride,
                  const int32_t *off, float *dW, int64_t ldw, int ni, int nk);
    /* the 3 x 3 weight gradient's transposed tile (dt__shift_wgrad3): dWT [9][ocp] += one input channel's
       taps for `width` (16 or 32) output channels, over the positions of one image; st the stride of both axes */
    void (*wt3)(int st, int width, const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow, const float *dbT,
                int64_t ocp, float *dWT);
    /* data movement: rows x len floats from src (rows lds apart) to dst (rows ldd apart); channels c0..c1 of
       an image into its padded image (whose borders and slack are zero); dbT [S][ocp] <- dy [oc][S]
       transposed, columns oc..ocp zero */
    void (*copy)(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t len);
    void (*pad)(const dt__shift_geom *s, const float *x, int64_t c0, int64_t c1, float *xp);
    void (*transpose_dy)(const float *dy, int64_t oc, int64_t S, float *dbT, int64_t ocp);
} dt__shift_kern;
#endif
#endif /* the types */

#ifdef DT__SHIFT
/* dt_ops.conv_fwd and conv_bwd with a tier's tiles kn (cpu_x86.h's AVX-512 tier passes its own): 0 when the GEMMs
   are to take the convolution; 2 when conv_bwd wrote dW but leaves dx to them */
static int dt__shift_conv_fwd(const dt__shift_kern *kn, void *ctx, const dt_conv_geom *g, const float *x, const float *W,
                              const float *b, float *y);
static int dt__shift_conv_bwd(const dt__shift_kern *kn, void *ctx, const dt_conv_geom *g, const float *x, const float *W,
                              const float *dy, float *dW, float *dx, int accumulate);
#endif
/* the same with the tiles written once in vector extensions: AVX2 + FMA (the avx2 tier), the baseline ISA (the
   portable tier; NEON's) */
#ifdef DT__VEC_X86
static int dt__vec_conv_fwd_avx2(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y);
static int dt__vec_conv_bwd_avx2(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                                 float *dx, int accumulate);
#endif
#ifdef DT__VEC_BASE
static int dt__vec_conv_fwd_base(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y);
static int dt__vec_conv_bwd_base(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                                 float *dx, int accumulate);
#endif
#endif

/* ==== dtrain/cpu/cpu_x86.h: the AVX-512 and AVX2 tiers ==== */
#ifdef DTRAIN_CPU_X86_IMPLEMENTATION_DONE
/* its tables (static const dt__kernel, at the end of cpu_x86.h), fastest first, which begin dtrain/cpu/cpu.h's list
   of tiers; nothing where the build compiles none (DT__X86: x86 with GCC or Clang, not DT_NO_SIMD) */
#ifdef DT__X86
#define DT__X86_KERNELS &dt__kernel_avx512, &dt__kernel_avx2,
#else
#define DT__X86_KERNELS
#endif
#endif

/* ==== dtrain/cpu/cpu_arm.h: the NEON tier ==== */
#ifdef DTRAIN_CPU_ARM_IMPLEMENTATION_DONE
/* its table (static const dt__kernel, at the end of cpu_arm.h) for dtrain/cpu/cpu.h's list of tiers; nothing where
   the build compiles none (DT__ARM: aarch64 with GCC or Clang, not DT_NO_SIMD) */
#ifdef DT__ARM
#define DT__ARM_KERNELS &dt__kernel_neon,
#else
#define DT__ARM_KERNELS
#endif
#endif
