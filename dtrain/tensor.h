/* dtrain/tensor.h - TOPCOMMENT */
#ifndef DTRAIN_TENSOR_H
#define DTRAIN_TENSOR_H
#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MAX_DIMS 4

/* A float32 view of contiguous memory, NCHW order. It never owns its data. */
typedef struct dt_tensor {
    float  *data;
    int     ndim;
    int64_t shape[DT_MAX_DIMS];
} dt_tensor;

dt_tensor dt_tensor_view(float *data, int ndim, const int64_t *shape);
dt_tensor dt_tensor_4d(float *data, int64_t n, int64_t c, int64_t h, int64_t w);
int64_t   dt_tensor_count(const dt_tensor *t);        /* number of elements */

/* Geometry of a 2-D window op (convolution or pooling) over a batch: input [n, c, h, w],
   output [n, oc, oh, ow], window kh x kw, stride sh x sw, zero padding ph x pw. */
typedef struct dt_conv_geom {
    int64_t n, c, h, w;
    int64_t oc, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw;
} dt_conv_geom;
/* Fills oh/ow from the rest; DT_ERR_SHAPE when the window does not fit. */
dt_result dt_conv_geom_resolve(dt_conv_geom *g);

/* The backend ops table. Every pointer argument is backend memory (host memory for the CPU table).
   `ctx` is the backend's own state (NULL for the CPU). Functions named *_bwd ACCUMULATE into the
   gradients they write (+=), so a node read by two consumers receives the sum of both gradients.
   Shapes are stated as [rows, cols] in row-major order. */
typedef struct dt_ops {
    const char *name;
    /* memory */
    void *(*alloc)(void *ctx, int64_t bytes);                           /* NULL when out of memory */
    void  (*free)(void *ctx, void *p);
    void  (*upload)(void *ctx, void *dst, const void *host_src, int64_t bytes);
    void  (*download)(void *ctx, void *host_dst, const void *src, int64_t bytes);
    void  (*copy)(void *ctx, float *dst, const float *src, int64_t n);
    /* vectors */
    void  (*fill)(void *ctx, float *x, int64_t n, float v);
    void  (*scale)(void *ctx, float *x, int64_t n, float a);             /* x *= a */
    void  (*axpy)(void *ctx, float *y, const float *x, int64_t n, float a); /* y += a x */
    void  (*add)(void *ctx, float *y, const float *a, const float *b, int64_t n); /* y = a + b */
    /* C[M,N] = alpha op(A) op(B) + beta C; op(A) [M,K], op(B) [K,N]; ta/tb nonzero = transposed;
       lda/ldb/ldc are row strides of A, B, C as stored. beta == 0 never reads C. */
    void  (*gemm)(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
    /* y[r, i] = x[r, i] + b[i]  for y,x [rows, cols], b [cols] (x may equal y) */
    void  (*add_row_bias)(void *ctx, float *y, const float *b, int64_t rows, int64_t cols);
    /* db[i] += sum_r dy[r, i]  for dy [rows, cols] */
    void  (*sum_rows_bwd)(void *ctx, float *db, const float *dy, int64_t rows, int64_t cols);
    /* convolution helpers for x [n, c, h, w]: col [c*kh*kw, n*oh*ow] */
    void  (*im2col)(void *ctx, const dt_conv_geom *g, const float *x, float *col);
    void  (*col2im_bwd)(void *ctx, const dt_conv_geom *g, const float *col, float *dx); /* dx += */
    /* y [n, c, s] <- t [c, n*s] (+ b[c] when b != NULL);  and its inverse t [c, n*s] <- y [n, c, s] */
    void  (*cs_to_ncs)(void *ctx, float *y, const float *t, const float *b, int64_t n, int64_t c, int64_t s);
    void  (*ncs_to_cs)(void *ctx, float *t, const float *y, int64_t n, int64_t c, int64_t s);
    /* db[c] += sum_{n,s} dy[n, c, s] */
    void  (*channel_sum_bwd)(void *ctx, float *db, const float *dy, int64_t n, int64_t c, int64_t s);
    /* pooling over geometry g (g->oc == g->c); idx [n, c, oh, ow] remembers each max's input offset */
    void  (*maxpool_fwd)(void *ctx, const dt_conv_geom *g, const float *x, float *y, int32_t *idx);
    void  (*maxpool_bwd)(void *ctx, const dt_conv_geom *g, const float *dy, const int32_t *idx, float *dx);
    void  (*avgpool_fwd)(void *ctx, const dt_conv_geom *g, const float *x, float *y);
    void  (*avgpool_bwd)(void *ctx, const dt_conv_geom *g, const float *dy, float *dx);
    /* y [n, c] = mean over s of x [n, c, s] */
    void  (*gap_fwd)(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t s);
    void  (*gap_bwd)(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t s);
    /* activations */
    void  (*relu_fwd)(void *ctx, const float *x, float *y, int64_t n);
    void  (*relu_bwd)(void *ctx, const float *y, const float *dy, float *dx, int64_t n);
    /* dropout: mask[i] = 0 or 1/(1-p) from dt_hash_uniform(key, i); y = x * mask */
    void  (*dropout_fwd)(void *ctx, const float *x, float *y, float *mask, int64_t n, float p, uint64_t key);
    void  (*mul_bwd)(void *ctx, const float *dy, const float *mask, float *dx, int64_t n); /* dx += dy*mask */
    /* batch normalisation of x [n, c, s] per channel. Train: batch statistics (biased variance),
       running stats rm/rv updated as PyTorch (unbiased variance, momentum); saves mean and 1/std.
       Eval: running statistics. bwd: training selects the batch-statistics gradient; dx may be NULL. */
    void  (*bn_fwd)(void *ctx, int training, const float *x, float *y, int64_t n, int64_t c, int64_t s,
                    const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                    float *save_mean, float *save_invstd);
    void  (*bn_bwd)(void *ctx, int training, const float *x, const float *dy, float *dx, int64_t n, int64_t c,
                    int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                    float *dgamma, float *dbeta);
    /* option-A shortcut: y [n, oc, oh, ow] = x[:, :, ::stride, ::stride] with (oc - c)/2 zero channels
       on each side; x [n, c, h, w] */
    void  (*pad_shortcut_fwd)(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t h, int64_t w,
                              int64_t oc, int64_t stride);
    void  (*pad_shortcut_bwd)(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t h, int64_t w,
                              int64_t oc, int64_t stride);
    /* rows of x [n, k] */
    void  (*log_softmax_fwd)(void *ctx, const float *x, float *y, int64_t n, int64_t k);
    void  (*log_softmax_bwd)(void *ctx, const float *y, const float *dy, float *dx, int64_t n, int64_t k);
    /* losses, mean over the batch: write the loss to *loss (host) and d loss / d x into dx (overwrite) */
    void  (*softmax_xent)(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k,
                          float *dx, float *loss);
    void  (*nll)(void *ctx, const float *logp, const int32_t *labels, int64_t n, int64_t k, float *dx, float *loss);
    void  (*mse)(void *ctx, const float *x, const float *target, int64_t n, float *dx, float *loss);
    /* correct[0] = number of rows of x [n, k] whose first maximum is at labels[row] (host int64) */
    void  (*count_correct)(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, int64_t *correct);
    /* out[0] = sum of x[i]^2 (host double) */
    void  (*sum_squares)(void *ctx, const float *x, int64_t n, double *out);
    /* fused optimizer updates over a stretch of the flat buffers, as torch.optim (see section 4):
       SGD: g' = g + wd p; buf = first ? g' : momentum buf + (1 - dampening) g' (when momentum != 0);
            d = nesterov ? g' + momentum buf : (momentum != 0 ? buf : g'); p -= lr d.
       Adam: g' = g + wd p (decoupled = 0) or p *= 1 - lr wd (decoupled = 1, AdamW); m = b1 m + (1-b1) g';
            v = b2 v + (1-b2) g'^2; p -= step_size m / (sqrt(v) / bc2_sqrt + eps). */
    void  (*sgd_step)(void *ctx, float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                      float dampening, float wd, int nesterov, int first);
    void  (*adam_step)(void *ctx, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                       float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt);
    /* Waits until every op issued so far has finished, then returns DT_OK or the first failure of any op
       on this ctx (ops return nothing, so an asynchronous backend keeps its failure, with its message, for
       sync to return; dt_last_error() then holds the message). The model calls it at the end of every
       public call that issued ops, so host code may read backend memory the host can address (the CUDA
       backend's managed memory) once the call has returned. NULL: the ops finish before they return and
       never fail (the CPU). */
    dt_result (*sync)(void *ctx);
    /* optional (NULL: im2col into a workspace, then gemm): the convolution's GEMMs without materialising
       col = im2col(x) [c*kh*kw, n*oh*ow]:  t [oc, n*oh*ow] = W [oc, c*kh*kw] col;  dW += t col^T */
    void  (*conv_gemm_fwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, float *t);
    void  (*conv_gemm_wgrad)(void *ctx, const dt_conv_geom *g, const float *x, const float *t, float *dW);
    /* optional (NULL or 0 returned: gemm, then col2im_bwd): dx [n, c, h, w] += the input gradient of the
       convolution for dy [n, oc, oh, ow], using ws (ws_count floats) as scratch; returns 1 when done */
    int   (*conv_gemm_dgrad)(void *ctx, const dt_conv_geom *g, const float *W, const float *dy, float *dx, float *ws,
                             int64_t ws_count);
    /* optional (NULL or 0 returned: the entries above): the whole convolution on [n, c, h, w] tensors, where
       the backend has a faster way for this geometry. conv_fwd: y [n, oc, oh, ow] = conv(x, W) + b (b NULL:
       none); conv_bwd: dW += and (dx not NULL) dx += (accumulate 1) or = (accumulate 0) the gradients for
       dy [n, oc, oh, ow] (not the bias's). Both return 1 when done, 0 (having written nothing) when the caller
       is to take the entries above; conv_bwd returns 2 when it wrote dW but left dx to them. */
    int   (*conv_fwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y);
    int   (*conv_bwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                      int accumulate);
    /* optional pairs (NULL: the layers one by one): a ReLU fused into the layer before it, when the ReLU is
       that layer's only reader. bn_relu_fwd: y = max(0, bn(x) + r) (r NULL: max(0, bn(x)); a batch norm
       whose only reader is a residual add, whose only reader is the ReLU), other arguments as bn_fwd's;
       bn_relu_bwd: bn_bwd's gradients for the ReLU's output y and its gradient dy, with dx += (accumulate 1)
       or = (0), and dr (when not NULL: r's gradient) += or = (acc_r) dy where y > 0, else 0; dx may be NULL.
       add_relu_fwd: y = max(0, a + b); add_relu_bwd: da and db (each may be NULL) += or = (acc_a, acc_b) dy
       where y > 0, else 0. Both members of a pair are given, or neither. */
    void  (*bn_relu_fwd)(void *ctx, int training, const float *x, const float *r, float *y, int64_t n, int64_t c, int64_t s,
                         const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                         float *save_mean, float *save_invstd);
    void  (*bn_relu_bwd)(void *ctx, int training, const float *x, const float *y, const float *dy, float *dx, int accumulate,
                         float *dr, int acc_r, int64_t n, int64_t c, int64_t s, const float *gamma, const float *save_mean,
                         const float *save_invstd, float *dgamma, float *dbeta);
    void  (*add_relu_fwd)(void *ctx, float *y, const float *a, const float *b, int64_t n);
    void  (*add_relu_bwd)(void *ctx, const float *y, const float *dy, float *da, int acc_a, float *db, int acc_b, int64_t n);
} dt_ops;

/* The CPU backend (OpenMP when compiled with it). */
const dt_ops *dt_cpu_ops(void);

/* CPU GEMM with the semantics of dt_ops.gemm: the blocked, vectorised one and its naive twin. */
void dt_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void dt_gemm_ref(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Naive direct convolution, the twin of im2col + GEMM: y [n, oc, oh, ow] = w [oc, c, kh, kw] * x + b */
void dt_conv2d_ref(const dt_conv_geom *g, const float *x, const float *w, const float *b, float *y);
/* Number of threads the CPU kernels use (1 without OpenMP). */
int dt_cpu_threads(void);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TENSOR_H */

/* ============================================================================================== */
/* Loop bodies shared by the two backends: the CPU ops below and the CUDA kernels of dtrain_cuda.h  */
/* (compiled by nvcc, where DT__HD makes them device functions too), so both compute the same      */
/* numbers from one definition. Part of either implementation, never of the declarations.          */
/* ============================================================================================== */

#if (defined(DTRAIN_IMPLEMENTATION) || defined(DTRAIN_CUDA_IMPLEMENTATION)) && !defined(DTRAIN_SHARED_DONE)
#define DTRAIN_SHARED_DONE
#include <math.h>
/* Max pooling of window (oy, ox) of the plane xp [h, w], checking every tap against the borders: the
   maximum, and its offset in *at (-1 when the window holds no pixel). The first maximum wins and NaN
   propagates, as in PyTorch. */
static inline DT__HD float dt__maxpool_window(const dt_conv_geom *g, const float *xp, int64_t oy, int64_t ox, int64_t *at) {
    float best = -INFINITY;
    int64_t bi = -1, ky, kx;
    for (ky = 0; ky < g->kh; ky++) {
        int64_t iy = oy * g->sh - g->ph + ky;
        if (iy < 0 || iy >= g->h) continue;
        for (kx = 0; kx < g->kw; kx++) {
            int64_t ix = ox * g->sw - g->pw + kx;
            float v;
            if (ix < 0 || ix >= g->w) continue;
            v = xp[iy * g->w + ix];
            if (bi < 0 || v > best || v != v) { best = v; bi = iy * g->w + ix; }
            if (v != v) { *at = bi; return best; }
        }
    }
    *at = bi;
    return best;
}
/* Average pooling of window (oy, ox) of the plane xp [h, w]; zero padding counts in the mean. */
static inline DT__HD float dt__avgpool_window(const dt_conv_geom *g, const float *xp, int64_t oy, int64_t ox) {
    float acc = 0.0f;
    int64_t ky, kx;
    for (ky = 0; ky < g->kh; ky++) {
        int64_t iy = oy * g->sh - g->ph + ky;
        if (iy < 0 || iy >= g->h) continue;
        for (kx = 0; kx < g->kw; kx++) {
            int64_t ix = ox * g->sw - g->pw + kx;
            if (ix >= 0 && ix < g->w) acc += xp[iy * g->w + ix];
        }
    }
    return acc * (1.0f / (float)(g->kh * g->kw));
}

/* sum_j exp(x_j - max) of a row x [k], in double, with the row's maximum in *mx */
static inline DT__HD double dt__exp_sum(const float *x, int64_t k, float *mx) {
    float m = -INFINITY;
    double sum = 0.0;
    int64_t j;
    for (j = 0; j < k; j++) m = x[j] > m ? x[j] : m;
    for (j = 0; j < k; j++) sum += exp((double)(x[j] - m));
    *mx = m;
    return sum;
}
/* y [k] = x - log(sum exp(x)) */
static inline DT__HD void dt__log_softmax_row(const float *x, float *y, int64_t k) {
    float mx;
    double sum = dt__exp_sum(x, k, &mx);
    float lse = mx + (float)log(sum);
    int64_t j;
    for (j = 0; j < k; j++) y[j] = x[j] - lse;
}
/* dx [k] += dy - exp(y) sum(dy), for y = log_softmax(x) */
static inline DT__HD void dt__log_softmax_row_bwd(const float *y, const float *dy, float *dx, int64_t k) {
    float sum = 0.0f;
    int64_t j;
    for (j = 0; j < k; j++) sum += dy[j];
    for (j = 0; j < k; j++) dx[j] += dy[j] - expf(y[j]) * sum;
}
/* Softmax cross-entropy of one row x [k] with its label, for a batch of n: dx [k] = (softmax(x) -
   onehot(label)) / n; returns the row's loss (NaN for a label outside [0, k)). */
static inline DT__HD double dt__softmax_xent_row(const float *x, int64_t label, int64_t k, int64_t n, float *dx) {
    float mx;
    double sum = dt__exp_sum(x, k, &mx), lse = (double)mx + log(sum);
    int64_t j;
    for (j = 0; j < k; j++) dx[j] = (float)((exp((double)x[j] - lse) - (j == label ? 1.0 : 0.0)) / (double)n);
    return label >= 0 && label < k ? lse - (double)x[label] : (double)NAN;
}
/* index of the first maximum of a row x [k] */
static inline DT__HD int64_t dt__argmax_row(const float *x, int64_t k) {
    int64_t best = 0, j;
    for (j = 1; j < k; j++)
        if (x[j] > x[best]) best = j;
    return best;
}

/* One element of the optimizers' updates (dt_ops.sgd_step, adam_step), in torch.optim's order. */
static inline DT__HD void dt__sgd_update(float *p, const float *g, float *buf, int64_t i, float lr, float momentum,
                                         float dampening, float wd, int nesterov, int first) {
    float d = wd != 0.0f ? g[i] + wd * p[i] : g[i];
    if (momentum != 0.0f) {
        float b = first ? d : buf[i] * momentum + (1.0f - dampening) * d;
        buf[i] = b;
        d = nesterov ? d + momentum * b : b;
    }
    p[i] -= lr * d;
}
static inline DT__HD void dt__adam_update(float *p, const float *g, float *m, float *v, int64_t i, float lr, float beta1,
                                          float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {
    float gi = g[i], pi = p[i];
    if (decoupled) pi *= 1.0f - lr * wd;
    else if (wd != 0.0f) gi += wd * pi;
    m[i] = m[i] * beta1 + (1.0f - beta1) * gi;
    v[i] = v[i] * beta2 + (1.0f - beta2) * gi * gi;
    p[i] = pi - step_size * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));
}
#endif /* the shared loop bodies */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_TENSOR_IMPLEMENTATION_DONE)
#define DTRAIN_TENSOR_IMPLEMENTATION_DONE
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
#include <immintrin.h>
#endif
#ifndef DT_CONV_WORKSPACE
#define DT_CONV_WORKSPACE (1 << 24)
#endif

#ifdef __cplusplus
extern "C" {
#endif

dt_tensor dt_tensor_view(float *data, int ndim, const int64_t *shape) {
    dt_tensor t;
    int i;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.ndim = ndim < 0 ? 0 : (ndim > DT_MAX_DIMS ? DT_MAX_DIMS : ndim);
    for (i = 0; i < t.ndim; i++) t.shape[i] = shape ? shape[i] : 0;
    return t;
}
dt_tensor dt_tensor_4d(float *data, int64_t n, int64_t c, int64_t h, int64_t w) {
    int64_t s[4];
    s[0] = n; s[1] = c; s[2] = h; s[3] = w;
    return dt_tensor_view(data, 4, s);
}
int64_t dt_tensor_count(const dt_tensor *t) {
    int64_t n = 1;
    int i;
    for (i = 0; i < t->ndim; i++) n *= t->shape[i];
    return t->ndim ? n : 0;
}

dt_result dt_conv_geom_resolve(dt_conv_geom *g) {
    if (g->n < 0 || g->c <= 0 || g->h <= 0 || g->w <= 0 || g->kh <= 0 || g->kw <= 0 || g->sh <= 0 ||
        g->sw <= 0 || g->ph < 0 || g->pw < 0)
        return dt_set_error(DT_ERR_SHAPE, "window geometry needs positive sizes: input %lldx%lldx%lld, kernel %lldx%lld, "
                            "stride %lldx%lld, padding %lldx%lld", (long long)g->c, (long long)g->h, (long long)g->w,
                            (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw, (long long)g->ph,
                            (long long)g->pw);
    if (g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
        return dt_set_error(DT_ERR_SHAPE, "kernel %lldx%lld does not fit the padded input %lldx%lld (input %lldx%lld, "
                            "padding %lld): use a smaller kernel or more padding", (long long)g->kh, (long long)g->kw,
                            (long long)(g->h + 2 * g->ph), (long long)(g->w + 2 * g->pw), (long long)g->h,
                            (long long)g->w, (long long)g->ph);
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    return DT_OK;
}

int dt_cpu_threads(void) {
#if DT__HAVE_OMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

/* im2col's index arithmetic, the same for every stretch of a row (c, ky, kx): output columns [lo, hi) of
   any row read inside the image */
static void dt__col_cols(const dt_conv_geom *g, int64_t kx, int64_t *lo, int64_t *hi) {
    *lo = kx >= g->pw ? 0 : (g->pw - kx + g->sw - 1) / g->sw;
    *hi = g->w + g->pw - kx > 0 ? (g->w + g->pw - kx - 1) / g->sw + 1 : 0;
    if (*hi > g->ow) *hi = g->ow;
    if (*lo > *hi) *lo = *hi;
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
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
#define DT__COL_SPAN_AVX512 1
#endif

/* One stretch of a row of im2col(x) for geometry g, never materialised whole: row (c, ky, kx) of col
   [c*kh*kw, n*oh*ow], the `len` columns from output position (n, oy, ox) on, written to dst[i * stride].
   Reads zero outside the image (the padding). im2col and the convolution GEMMs' packing share it. */
static void dt__col_span(const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx, int64_t n, int64_t oy,
                         int64_t ox, int64_t len, float *DT__RESTRICT dst, int64_t stride) {
    int64_t lo, hi;
#ifdef DT__COL_SPAN_AVX512
    if (stride == 1 && __builtin_cpu_supports("avx512f")) {
        dt__col_span_avx512(g, x, c, ky, kx, n, oy, ox, len, dst);
        return;
    }
#endif
    dt__col_cols(g, kx, &lo, &hi);
    while (len > 0) {
        int64_t end = ox + len < g->ow ? ox + len : g->ow, iy = oy * g->sh - g->ph + ky, a = end, b = end, i;
        if (iy >= 0 && iy < g->h) {   /* [a, b): inside the image */
            a = lo < ox ? ox : lo > end ? end : lo;
            b = hi < a ? a : hi > end ? end : hi;
        }
        for (i = ox; i < a; i++, dst += stride) *dst = 0.0f;
        if (a < b) {
            const float *xr = x + ((n * g->c + c) * g->h + iy) * g->w + kx - g->pw;   /* + ox * sw: output column ox */
            if (g->sw == 1 && stride == 1) {   /* short stretches: a loop, not a call to memcpy */
                const float *src = xr + a;
                for (i = 0; i < b - a; i++) dst[i] = src[i];
                dst += b - a;
            }
            else for (i = a; i < b; i++, dst += stride) *dst = xr[i * g->sw];
        }
        for (i = b; i < end; i++, dst += stride) *dst = 0.0f;
        len -= end - ox;
        ox = 0;
        if (++oy == g->oh) { oy = 0; n++; }
    }
}

/* Where a GEMM's op(B) comes from: a matrix B with row stride ldb (transposed when tb), or, when g is set,
   im2col(B) of the images B with geometry g, packed straight from the images and never materialised:
   op(B) = col [c*kh*kw, n*oh*ow] (tb = 0) or its transpose (tb = 1). */
typedef struct dt__bsrc { const float *B; int64_t ldb; int tb; const dt_conv_geom *g; } dt__bsrc;

/* op(B)[p][j] of a B source */
static float dt__bval(const dt__bsrc *bs, int64_t p, int64_t j) {
    const dt_conv_geom *g = bs->g;
    float v;
    if (!g) return bs->tb ? bs->B[j * bs->ldb + p] : bs->B[p * bs->ldb + j];
    {
        int64_t k = bs->tb ? j : p, pos = bs->tb ? p : j, S = g->oh * g->ow;
        dt__col_span(g, bs->B, k / (g->kh * g->kw), k / g->kw % g->kh, k % g->kw, pos / S, pos % S / g->ow, pos % g->ow, 1, &v, 1);
    }
    return v;
}

/* The unblocked GEMM: a double accumulator per element, in order of p. */
static void dt__gemm_ref_src(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                             const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    int64_t i, j, p;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double acc = 0.0;
            for (p = 0; p < K; p++) acc += (double)(ta ? A[p * lda + i] : A[i * lda + p]) * (double)dt__bval(bs, p, j);
            C[i * ldc + j] = (float)(alpha * acc) + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
        }
}

void dt_gemm_ref(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__gemm_ref_src(ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}

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
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
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
#define DT__PACK_A8_AVX 1
#endif

/* Ap: the mc x kc block of op(A) at (i0, p0) as MR-tall panels, each kc x MR (row p holds MR rows' values) */
static void dt__pack_a(int ta, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float *Ap, int MR) {
    int64_t ir, p, i;
#ifdef DT__PACK_A8_AVX
    const int simd = MR == 8 && !ta && __builtin_cpu_supports("avx");   /* 1: 8-tall panels by 8 x 8 transposes */
#endif
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
#ifdef DT__PACK_A8_AVX
        if (simd && mr == 8) {
            p8 = kc / 8 * 8;
            dt__pack_a8_avx(A + (i0 + ir) * lda + p0, lda, p8, dst);
        }
#endif
        for (i = 0; i < mr; i++) {   /* row by row of A, each read along k */
            const float *src = A + (i0 + ir + i) * lda + p0;
            for (p = p8; p < kc; p++) dst[p * MR + i] = src[p];
        }
        for (; i < MR; i++)
            for (p = 0; p < kc; p++) dst[p * MR + i] = 0.0f;
    }
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
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
#define DT__PACK_BT_AVX512 1
#endif

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
static void dt__pack_b(const dt__bsrc *bs, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float *Bp, int NR, float *tmp) {
    const float *B = bs->B;
    const dt_conv_geom *g = bs->g;
    int64_t jr, ldb = bs->ldb;
    for (jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR, p, j;
        float *dst = Bp + jr * kc;
        if (g && !bs->tb) {         /* rows p: col rows p0 + p from output position j0 on, each whole into tmp */
            int64_t S = g->oh * g->ow, n = j0 / S, oy = j0 % S / g->ow, ox = j0 % g->ow;
            int64_t c = p0 / (g->kh * g->kw), ky = p0 / g->kw % g->kh, kx = p0 % g->kw;
            for (p = 0; p < kc; p++) {
                dt__col_span(g, B, c, ky, kx, n, oy, ox, nc, tmp, 1);
                dt__pack_b_rows(tmp, nc, 1, nc, Bp + p * NR, kc, NR);
                if (++kx == g->kw) { kx = 0; if (++ky == g->kh) { ky = 0; c++; } }
            }
            return;
        } else if (g) {             /* columns j: col rows j0 + jr + j, each read from output position p0 on */
            int64_t S = g->oh * g->ow, n = p0 / S, oy = p0 % S / g->ow, ox = p0 % g->ow;
            int simd = 0;           /* 1: the rows go into tmp, then a 16 x 16 transpose packs them */
#ifdef DT__PACK_BT_AVX512
            simd = NR % 16 == 0 && __builtin_cpu_supports("avx512f");
#endif
            for (j = 0; j < nr; j++) {
                int64_t k = j0 + jr + j;
                dt__col_span(g, B, k / (g->kh * g->kw), k / g->kw % g->kh, k % g->kw, n, oy, ox, kc,
                             simd ? tmp + j * kc : dst + j, simd ? 1 : NR);
            }
#ifdef DT__PACK_BT_AVX512
            if (simd) { dt__pack_bt_avx512(tmp, kc, kc, nr, dst, NR); continue; }
#endif
            for (; j < NR; j++)
                for (p = 0; p < kc; p++) dst[p * NR + j] = 0.0f;
        } else if (!bs->tb) {       /* rows of B are contiguous along n: read each whole, for every panel */
            dt__pack_b_rows(B + p0 * ldb + j0, ldb, kc, nc, Bp, kc, NR);
            return;
        } else {                    /* op(B) = B^T: read each row of B along k */
#ifdef DT__PACK_BT_AVX512
            if (NR % 16 == 0 && __builtin_cpu_supports("avx512f")) {
                dt__pack_bt_avx512(B + (j0 + jr) * ldb + p0, ldb, kc, nr, dst, NR);
                continue;
            }
#endif
            for (j = 0; j < nr; j++) {
                const float *src = B + (j0 + jr + j) * ldb + p0;
                for (p = 0; p < kc; p++) dst[p * NR + j] = src[p];
            }
            for (; j < NR; j++)
                for (p = 0; p < kc; p++) dst[p * NR + j] = 0.0f;
        }
    }
}

/* C[mr, nr] = alpha c + beta C, the clipped write-back of a micro-tile c (row stride ldt; beta == 0
   never reads C) */
static void dt__micro_store(const float *c, int64_t ldt, float *C, int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {
    int64_t i, j;
    for (i = 0; i < mr; i++) {
        float *crow = C + i * ldc;
        const float *t = c + i * ldt;
        if (beta == 0.0f)
            for (j = 0; j < nr; j++) crow[j] = alpha * t[j];
        else if (beta == 1.0f)
            for (j = 0; j < nr; j++) crow[j] += alpha * t[j];
        else
            for (j = 0; j < nr; j++) crow[j] = alpha * t[j] + beta * crow[j];
    }
}

/* The portable micro-kernel, 6 x 16: c[MR][NR] = sum_p a[p][:] x b[p][:]; then C = alpha c + beta C.
   Written so that the inner loop over NR contiguous floats vectorises. */
static void dt__micro(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                      int64_t mr, int64_t nr, float alpha, float beta) {
    float c[6][16];
    int64_t p, i, j;
    memset(c, 0, sizeof c);
    for (p = 0; p < kc; p++) {
        const float *bp = b + p * 16;
        const float *ap = a + p * 6;
        for (i = 0; i < 6; i++) {
            float av = ap[i];
            for (j = 0; j < 16; j++) c[i][j] += av * bp[j];
        }
    }
    dt__micro_store(&c[0][0], 16, C, ldc, mr, nr, alpha, beta);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
#define DT__X86 1
/* x86 micro-kernels, chosen at run time. AVX2 + FMA: 6 rows x 2 vectors of 8 = 12 accumulator
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
#endif

/* A micro-kernel and its tile: the packing follows mr and nr. */
typedef void (*dt__micro_fn)(int64_t, const float *, const float *, float *, int64_t, int64_t, int64_t, float, float);
typedef struct dt__kernel { const char *name; dt__micro_fn fn; int mr, nr; } dt__kernel;
static const dt__kernel dt__kernels[] = {
#ifdef DT__X86
    {"avx512", dt__micro_avx512, DT__MR512, 16 * DT__NV512},
    {"avx2", dt__micro_avx2, 6, 16},
#endif
    {"portable", dt__micro, 6, 16},
};
/* 1 when this CPU can run kernels[k] */
static int dt__kernel_ok(int k) {
#ifdef DT__X86
    if (dt__kernels[k].fn == dt__micro_avx512) return __builtin_cpu_supports("avx512f");
    if (dt__kernels[k].fn == dt__micro_avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return k >= 0;
}
/* the fastest kernel this CPU runs: the first of the table it can */
static const dt__kernel *dt__pick_kernel(void) {
    int k = 0;
    while (!dt__kernel_ok(k)) k++;
    return &dt__kernels[k];
}

/* Floats of packing workspace the blocked GEMM needs with `threads` threads: a packed B block, a packed
   A block and a B panel of scratch per thread; and how many threads `count` floats serve. */
#define DT__GEMM_WS_THREAD ((int64_t)DT__KC * (DT__NC + 2 * DT__NR_MAX + DT__MC + DT__MR_MAX))
static int64_t dt__gemm_ws_count(int threads) { return (int64_t)threads * DT__GEMM_WS_THREAD; }
static int dt__gemm_ws_threads(int64_t count) { return (int)(count / DT__GEMM_WS_THREAD); }

/* One thread's share of the blocked GEMM: C[m0:m1, n0:n1], with its own packing space Bp, Ap and tmp.
   The K blocks depend on K alone, so each element of C is summed in the same order whatever the share. */
static void dt__gemm_part(const dt__kernel *kern, float *Bp, float *Ap, float *tmp, int ta, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                          int64_t K, float alpha, const float *A, int64_t lda, const dt__bsrc *bs, float beta, float *C,
                          int64_t ldc) {
    const int MR = kern->mr, NR = kern->nr;
    int64_t k16 = (K + 15) / 16, nkb = (k16 + DT__KC / 16 - 1) / (DT__KC / 16);   /* K blocks: whole 16s but the last */
    int64_t npan = (n1 - n0 + NR - 1) / NR, nnb = (npan * NR + DT__NC - 1) / DT__NC;
    int64_t ncb = (npan + nnb - 1) / nnb * NR, jc, kb, ic, jr, ir;
    for (kb = 0; kb < nkb; kb++) {   /* K outermost: with one block of A's rows, A is packed once per K block */
        int64_t pc = 16 * (k16 * kb / nkb), kc = (kb + 1 == nkb ? K : 16 * (k16 * (kb + 1) / nkb)) - pc;
        float bet = kb == 0 ? beta : 1.0f;
        for (jc = n0; jc < n1; jc += ncb) {
            int64_t nc = n1 - jc < ncb ? n1 - jc : ncb;
            dt__pack_b(bs, pc, kc, jc, nc, Bp, NR, tmp);
            for (ic = m0; ic < m1; ic += DT__MC) {
                int64_t mc = m1 - ic < DT__MC ? m1 - ic : DT__MC;
                if (jc == n0 || m1 - m0 > DT__MC) dt__pack_a(ta, A, lda, ic, mc, pc, kc, Ap, MR);
                for (ir = 0; ir < mc; ir += MR) {        /* A's panel stays in L1 ... */
                    int64_t mr = mc - ir < MR ? mc - ir : MR;
                    for (jr = 0; jr < nc; jr += NR) {    /* ... while B's stream from L2 */
                        int64_t nr = nc - jr < NR ? nc - jr : NR;
                        kern->fn(kc, Ap + ir * kc, Bp + jr * kc, C + (ic + ir) * ldc + jc + jr, ldc, mr, nr, alpha, bet);
                    }
                }
            }
        }
    }
}

/* The blocked GEMM with micro-kernel kern on at most `threads` threads, on a caller's workspace of
   dt__gemm_ws_count(threads) floats. The threads share nothing: each takes a stretch of C's columns (of
   its rows when C is narrow) and packs what it reads, so no thread ever waits for another inside the GEMM
   (on a busy machine, a barrier waits for the slowest thread's time slice). */
static void dt__gemm_with(const dt__kernel *kern, float *ws, int threads, int ta, int64_t M, int64_t N, int64_t K, float alpha,
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
            dt__gemm_part(kern, Bp, Bp + (int64_t)DT__KC * (DT__NC + DT__NR_MAX), Bp + (int64_t)DT__KC * (DT__NC + DT__NR_MAX + DT__MC + DT__MR_MAX),
                          ta, m0, m1, n0, n1, K, alpha, A, lda, bs, beta, C, ldc);
    }
}

/* op(A) op(B) by the blocked GEMM with this CPU's fastest micro-kernel, on workspace ws of `count` floats,
   or on a fresh one when ws is NULL; by the unblocked one when there is no memory for that. */
static void dt__gemm_src(float *ws, int64_t count, int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
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
    dt__gemm_with(dt__pick_kernel(), ws, threads, ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
    if (own) DT_FREE(own);
}

void dt_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__gemm_src(NULL, 0, ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}

void dt_conv2d_ref(const dt_conv_geom *g, const float *x, const float *w, const float *b, float *y) {
    int64_t n, o, oy, ox, c, ky, kx;
    for (n = 0; n < g->n; n++)
        for (o = 0; o < g->oc; o++)
            for (oy = 0; oy < g->oh; oy++)
                for (ox = 0; ox < g->ow; ox++) {
                    double acc = b ? b[o] : 0.0;
                    for (c = 0; c < g->c; c++)
                        for (ky = 0; ky < g->kh; ky++)
                            for (kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                acc += (double)x[((n * g->c + c) * g->h + iy) * g->w + ix] *
                                       (double)w[((o * g->c + c) * g->kh + ky) * g->kw + kx];
                            }
                    y[((n * g->oc + o) * g->oh + oy) * g->ow + ox] = (float)acc;
                }
}

/* ---- CPU ops ---------------------------------------------------------------------------------- */

static void *dt__cpu_alloc(void *ctx, int64_t bytes) {
    (void)ctx;
    if (bytes <= 0) bytes = 1;
    return DT_MALLOC((size_t)bytes);
}
static void dt__cpu_free(void *ctx, void *p) { (void)ctx; DT_FREE(p); }
static void dt__cpu_upload(void *ctx, void *dst, const void *src, int64_t bytes) {
    (void)ctx;
    if (bytes > 0 && dst != src) memcpy(dst, src, (size_t)bytes);
}
static void dt__cpu_copy(void *ctx, float *dst, const float *src, int64_t n) {
    (void)ctx;
    if (n > 0 && dst != src) memmove(dst, src, sizeof(float) * (size_t)n);
}
static void dt__cpu_fill(void *ctx, float *x, int64_t n, float v) {
    int64_t i;
    (void)ctx;
    if (v == 0.0f && n > 0) {   /* memset's wide stores, a stretch per thread */
        int64_t parts = n > DT__PAR_MIN ? dt_cpu_threads() : 1;
        DT__OMP(parallel for if (parts > 1))
        for (i = 0; i < parts; i++) memset(x + n * i / parts, 0, sizeof(float) * (size_t)(n * (i + 1) / parts - n * i / parts));
        return;
    }
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) x[i] = v;
}
static void dt__cpu_scale(void *ctx, float *x, int64_t n, float a) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) x[i] *= a;
}
static void dt__cpu_axpy(void *ctx, float *y, const float *x, int64_t n, float a) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) y[i] += a * x[i];
}
static void dt__cpu_add(void *ctx, float *y, const float *a, const float *b, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) y[i] = a[i] + b[i];
}
/* The CPU backend's own state, when a model gives it one: the GEMM packing workspace, so a training
   step allocates nothing. */
typedef struct dt__cpu_state { float *gemm_ws; int64_t gemm_ws_count; } dt__cpu_state;

/* GEMM on the state's workspace (without state, on a fresh one) */
static void dt__cpu_gemm_src(void *ctx, int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                             const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    dt__gemm_src(st ? st->gemm_ws : NULL, st ? st->gemm_ws_count : 0, ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
}
static void dt__cpu_gemm(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__cpu_gemm_src(ctx, ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}
/* ---- convolutions by shifted rows ---------------------------------------------------------------- */
/* With an image zero-padded to hp x wp (hp = h + 2 ph, wp = w + 2 pw), output pixel (oy, ox) of a stride-1
   convolution reads padded pixel (oy + ky, ox + kx). Over s = oy * wp + ox, row k = (c, ky, kx) of im2col
   is the padded image itself from offset c * hp * wp + ky * wp + kx on, so the GEMM reads its B operand
   straight from the padded image through a table of K offsets and packs nothing: the output is computed
   over oh rows of wp columns and the last wp - ow columns of each row are dropped. Stride-2 3 x 3
   convolutions take the same tiles over phase planes (dt__shift_geom, dt__shift_dgrad2). Each thread takes
   whole images (forward, input gradient) or fixed units of the weight gradient over every image, so each
   output is summed in one order whatever the thread count. AVX-512 only; other CPUs, other strides and
   kernels too large for the caches take the packed GEMM. */
static int dt__shift_off;                  /* 1: never take the shifted path (the tests compare both paths) */
static DT__THREAD_LOCAL int64_t dt__shift_taken;   /* calls that took it on this thread (for the tests) */
#ifdef DT__X86
#define DT__SHIFT_MAX_W (1 << 17)   /* most weights (oc * c * kh * kw) a shifted convolution takes */
#define DT__SHIFT_SLACK 128         /* zeros after a padded image: the dropped columns read past its end */

/* The padded geometry of one image of c channels h x w, padded by ph, pw, for a kh x kw window with stride
   st (1 or 2). With stride 2 each channel is stored as 4 phase planes of hq x wq (plane (a, b) holds the
   padded pixels (2 qy + a, 2 qx + b)), so that output (oy, ox) reads tap (ky, kx) in plane (ky % 2, kx % 2)
   at (oy + ky / 2, ox + kx / 2): a shifted row again, over s = oy * wq + ox, with nothing computed twice. */
typedef struct dt__shift_geom {
    int64_t c, h, w, ph, pw, kh, kw, hp, wp, oh, ow;
    int64_t st, hq, wq;   /* stride; a phase plane's rows and columns (hp, wp with stride 1) */
    int64_t cp;      /* floats of one channel: st * st * hq * wq */
    int64_t ns;      /* outputs computed per channel: oh * wq */
    int64_t plane;   /* floats of one padded image: c * cp + DT__SHIFT_SLACK */
} dt__shift_geom;
static dt__shift_geom dt__shift_make(int64_t c, int64_t h, int64_t w, int64_t ph, int64_t pw, int64_t kh, int64_t kw, int64_t st) {
    dt__shift_geom s;
    s.c = c; s.h = h; s.w = w; s.ph = ph; s.pw = pw; s.kh = kh; s.kw = kw; s.st = st;
    s.hp = h + 2 * ph; s.wp = w + 2 * pw; s.oh = (s.hp - kh) / st + 1; s.ow = (s.wp - kw) / st + 1;
    s.hq = (s.hp + st - 1) / st; s.wq = (s.wp + st - 1) / st;
    s.cp = st * st * s.hq * s.wq;
    s.ns = s.oh * s.wq;
    s.plane = c * s.cp + DT__SHIFT_SLACK;
    return s;
}
/* offsets of im2col's rows (c, ky, kx), c from c0 to c1, into a padded image */
static void dt__shift_offsets(const dt__shift_geom *s, int64_t c0, int64_t c1, int32_t *off) {
    int64_t c, ky, kx, k = 0, st = s->st;
    for (c = c0; c < c1; c++)
        for (ky = 0; ky < s->kh; ky++)
            for (kx = 0; kx < s->kw; kx++)
                off[k++] = (int32_t)((c - c0) * s->cp + ((ky % st) * st + kx % st) * s->hq * s->wq + ky / st * s->wq + kx / st);
}
/* rows x len floats from src (rows lds apart) to dst (rows ldd apart) */
__attribute__((target("avx512f")))
static void dt__shift_copy(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t len) {
    __mmask16 tail = (__mmask16)((1u << (len % 16)) - 1u);
    int64_t r, j, full = len / 16 * 16;
    for (r = 0; r < rows; r++, dst += ldd, src += lds) {
        for (j = 0; j < full; j += 16) _mm512_storeu_ps(dst + j, _mm512_loadu_ps(src + j));
        if (tail) _mm512_mask_storeu_ps(dst + j, tail, _mm512_maskz_loadu_ps(tail, src + j));
    }
}
/* channels c0..c1 of image x [c, h, w] into the padded image xp (whose borders and slack are zero) */
__attribute__((target("avx512f")))
static void dt__shift_pad(const dt__shift_geom *s, const float *x, int64_t c0, int64_t c1, float *xp) {
    int64_t c, iy, ix;
    if (s->st == 1) {
        for (c = c0; c < c1; c++)
            dt__shift_copy(xp + ((c - c0) * s->hp + s->ph) * s->wp + s->pw, s->wp, x + c * s->h * s->w, s->w, s->h, s->w);
        return;
    }
    for (c = c0; c < c1; c++)   /* stride 2: each row's even and odd padded columns to their planes */
        for (iy = 0; iy < s->h; iy++) {
            int64_t py = iy + s->ph, pq = s->hq * s->wq;
            const float *src = x + (c * s->h + iy) * s->w;
            float *row = xp + (c - c0) * s->cp + (py % 2) * 2 * pq + py / 2 * s->wq;
            /* input column ix0 + 2j goes to plane pw % 2 at ix0 / 2 + j + pw / 2, ix0 + 2j + 1 to the other
               plane at ix0 / 2 + j + (pw + 1) / 2 */
            float *ev = row + (s->pw % 2) * pq + s->pw / 2, *od = row + ((s->pw + 1) % 2) * pq + (s->pw + 1) / 2;
            for (ix = 0; ix < s->w; ix += 16) {
                int len = s->w - ix < 16 ? (int)(s->w - ix) : 16;
                __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << len) - 1u), src + ix);
                _mm512_mask_storeu_ps(ev + ix / 2, (__mmask16)((1u << (len + 1) / 2) - 1u), _mm512_maskz_compress_ps(0x5555, v));
                _mm512_mask_storeu_ps(od + ix / 2, (__mmask16)((1u << len / 2) - 1u), _mm512_maskz_compress_ps(0xAAAA, v));
            }
        }
}

/* Where a vector of 16 computed columns goes: its kept lanes (keep: those of output pixels, not the
   wp - ow junk columns after each row) to the output from pixel `at` on, in order. */
typedef struct dt__shift_vec { int64_t at; uint32_t keep; } dt__shift_vec;
/* the first 16-byte boundary at or after p, for a table inside the float workspace (4 floats of slack) */
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
/* one tile of the shifted GEMM: sum_k a[k][i] xp[off[k] + j] for 8 rows i (rows kept) x 48 columns j, each
   vector's kept lanes written (packed together) to row i of dst (rows S apart) plus bias[i] (bias NULL:
   none), or added to it (add 1) */
__attribute__((target("avx512f")))
static void dt__shift_tile(int64_t K, const float *DT__RESTRICT a, const float *xp, const int32_t *off, const dt__shift_vec *vec,
                           float *dst, int64_t S, const float *bias, int add, int rows) {
    __m512 c[8][3];
    int64_t k;
    int i, v;
    for (i = 0; i < 8; i++)
        for (v = 0; v < 3; v++) c[i][v] = _mm512_setzero_ps();
    for (k = 0; k < K; k++) {
        const float *b = xp + off[k], *ak = a + 8 * k;
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), b2 = _mm512_loadu_ps(b + 32);
        for (i = 0; i < 8; i++) {
            __m512 av = _mm512_set1_ps(ak[i]);
            c[i][0] = _mm512_fmadd_ps(av, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(av, b1, c[i][1]);
            c[i][2] = _mm512_fmadd_ps(av, b2, c[i][2]);
        }
    }
    for (i = 0; i < rows; i++) {
        __m512 b = _mm512_set1_ps(bias ? bias[i] : 0.0f);
        for (v = 0; v < 3; v++) {
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
static void dt__shift_wtile(int64_t nimg, int64_t ld, const float *d, int64_t ldd, int64_t dstride, const float *xp,
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
/* One image of the shifted convolution: pads src [s->c, h, w] into xp and runs the tiles of Ap [rows, K],
   which write dst [rows, oh, ow] plus bias[row] (bias NULL: none), or add to it (add 1); vec from
   dt__shift_vecs */
static void dt__shift_image(const dt__shift_geom *s, const float *src, const float *Ap, int64_t rows, const int32_t *off,
                            float *xp, const dt__shift_vec *vec, float *dst, const float *bias, int add) {
    int64_t K = s->c * s->kh * s->kw, S = s->oh * s->ow, t, j;
    dt__shift_pad(s, src, 0, s->c, xp);
#define DT__SHIFT_TILE_AT(t, j)                                                                                         \
    dt__shift_tile(K, Ap + t * K, xp + j, off, vec + j / 16, dst + t * S, S, bias ? bias + t : NULL, add,                \
                   rows - t < 8 ? (int)(rows - t) : 8)
    if (K * 48 <= 8192)   /* a strip of the image fits in L1: it serves every tile of rows */
        for (j = 0; j < s->ns; j += 48)
            for (t = 0; t < rows; t += 8) DT__SHIFT_TILE_AT(t, j);
    else                  /* a tile of rows of the kernel stays in L1 while the image streams from L2 */
        for (t = 0; t < rows; t += 8)
            for (j = 0; j < s->ns; j += 48) DT__SHIFT_TILE_AT(t, j);
#undef DT__SHIFT_TILE_AT
}

/* A [rows, K] packed for dt__shift_tile: per tile of 8 rows, K groups of 8 (rows past the end are zero).
   flip: row r, column (o, ky, kx) is W[o][r][kh-1-ky][kw-1-kx] of W [oc = K / kk, rows, kh, kw] (the input
   gradient's kernel), else A is W [rows, K] itself. */
static void dt__shift_pack_a(const float *W, int64_t rows, int64_t K, int flip, int64_t kk, float *Ap) {
    int64_t t, nt = (rows + 7) / 8;
    DT__OMP(parallel for if (nt * K * 8 > DT__PAR_MIN))
    for (t = 0; t < nt; t++) {
        int64_t k, i;   /* declared here: private to each thread */
        for (k = 0; k < K; k++)
            for (i = 0; i < 8; i++) {
                int64_t r = t * 8 + i;
                float v = 0.0f;
                if (r < rows) v = flip ? W[((k / kk) * rows + r) * kk + (kk - 1 - k % kk)] : W[r * K + k];
                Ap[(t * K + k) * 8 + i] = v;
            }
    }
}

/* The shifted convolution of n images src [n, s->c, h, w] with the packed kernel Ap [rows, c*kh*kw] on
   `threads` threads: dst [n, rows, oh, ow] = it + bias (add 0; bias NULL: none), or += it (add 1).
   ws: threads * need floats, need from dt__shift_run_need. */
#define DT__SHIFT_NVEC(s) (((s)->ns + 47) / 48 * 3)   /* vectors of columns the tiles compute */
static int64_t dt__shift_run_need(const dt__shift_geom *s) {
    return s->plane + 4 + 4 * DT__SHIFT_NVEC(s) + s->c * s->kh * s->kw + 16;   /* a table entry: 4 floats */
}
static void dt__shift_run(const dt__shift_geom *s, int64_t n, const float *src, const float *Ap, int64_t rows, float *dst,
                          const float *bias, int add, float *ws, int64_t need, int threads) {
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
            dt__shift_image(s, src + img * s->c * s->h * s->w, Ap, rows, off, xp, vec, dst + img * rows * S, bias, add);
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
   row ranges x channel ranges; each pads its channels of a block of images and sums over every image. */
static void dt__shift_wgrad(const dt_conv_geom *g, const float *x, const float *dy, float *dW, float *ws, int64_t ws_count,
                            int threads) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, 1);
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
                    dt__shift_pad(&s, x + (b0 + img) * g->c * g->h * g->w, c0, c1, xb + img * xstride);
                    for (o = o0; o < o1; o++)
                        dt__shift_copy(db + (img * nco + o - o0) * ld, s.wp, dy + ((b0 + img) * g->oc + o) * S, g->ow, g->oh, g->ow);
                }
                for (o = o0; o < o1; o += 4)
                    for (k = 0; k < K0; k += DT__WT_K)
                        dt__shift_wtile(m, ld, db + (o - o0) * ld, ld, nco * ld, xb, xstride, off + k, dW + o * K + c0 * kk + k, K,
                                        o1 - o < 4 ? (int)(o1 - o) : 4, K0 - k < DT__WT_K ? (int)(K0 - k) : DT__WT_K);
            }
        }
    }
}

/* The weight gradient of a 3 x 3 convolution with dy transposed: dbT [S][ocp] holds each output position's
   dy for every output channel (ocp: oc rounded up to 16, the rest zero), so one tile keeps dW^T's 9 taps of
   one input channel for 16 or 32 output channels in registers and sums over the positions there: each tap
   broadcasts its padded x, which a vector of dbT multiplies. No horizontal sums, and 10 or 11 loads feed 9
   or 18 multiply-adds from data small enough for L1 and L2 (the dot-product tile above streams 4 rows of dy
   and 6 of x per 24 from L2). dWT [9][ocp] += the image's sums for tap (ky, kx) at row ky * 3 + kx. */
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
static void dt__transpose_dy(const float *dy, int64_t oc, int64_t S, float *dbT, int64_t ocp) {
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
/* Floats of workspace the shifted weight gradient of g takes per thread, whatever the thread count (counted
   for every channel, so the path taken does not depend on it): for 3 x 3, the padded image, dy transposed
   and dW^T; otherwise one image's worth of padded image and dy rows plus an offset table. */
static int64_t dt__shift_wgrad_need(const dt_conv_geom *g) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh);
    if (g->kh == 3 && g->kw == 3) return s.plane + (g->oh * g->ow + g->c * 9) * ((g->oc + 15) / 16 * 16);
    return dt__shift_wgrad_image(&s, g->oc) + g->c * g->kh * g->kw + 16;
}
/* The 3 x 3 weight gradient dW [oc, c*9] += by the transposed tiles. The work is cut into units of one
   input channel x 32 output channels; each thread takes a range of units and every image in order, so
   each sum runs in one order whatever the thread count. */
static void dt__shift_wgrad3(const dt_conv_geom *g, const float *x, const float *dy, float *dW, float *ws, int64_t ws_count,
                             int threads) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, 3, 3, g->sh);
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
                dt__shift_pad(&s, x + img * g->c * g->h * g->w, c0, c1, xp);
                dt__transpose_dy(dy + img * g->oc * S, g->oc, S, dbT, ocp);
                for (u = u0; u < u1; u++) {
                    const float *xc;
                    float *dc;
                    c = u / nto; o = u % nto * 32;
                    xc = xp + (c - c0) * hw;
                    dc = dWT + (c - c0) * 9 * ocp + o;
                    if (s.st == 1 && ocp - o >= 32) dt__wt3_tile32(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
                    else if (s.st == 1) dt__wt3_tile16(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
                    else if (ocp - o >= 32) dt__wt3_tile32s2(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
                    else dt__wt3_tile16s2(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
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
/* The input gradient of a stride-2 3 x 3 convolution by phase planes: dx's padded pixel (2 qy + a, 2 qx + b)
   takes the taps (ky, kx) = (a + 2 ty, b + 2 tx), which read dy at (qy - ty, qx - tx); so each phase (a, b)
   is a shifted-row convolution of dy (padded by a row and a column before it) with 1 x 1 to 2 x 2 taps, and
   the four phases' results are interleaved into dx. Floats of workspace: shared (the packed kernels, offsets
   and column table) and per thread (padded dy and the phases' results); dt__shift_dgrad2_fits asks for both
   per thread, so whether it runs does not depend on the thread count. */
typedef struct dt__dgrad2_geom { int64_t hq, wq, wd, pd, S, rp, nv, shared, per; } dt__dgrad2_geom;
static dt__dgrad2_geom dt__dgrad2_make(const dt_conv_geom *g) {
    dt__dgrad2_geom d;
    d.hq = (g->h + 2 * g->ph + 1) / 2; d.wq = (g->w + 2 * g->pw + 1) / 2; d.wd = d.wq + 1;
    d.pd = (d.hq + 1) * d.wd; d.S = d.hq * d.wq; d.rp = (g->c + 7) / 8 * 8;
    d.nv = (d.hq * d.wd + 47) / 48 * 3;
    d.shared = d.rp * 9 * g->oc + 9 * g->oc + 4 + 4 * d.nv + 16;
    d.per = g->oc * d.pd + DT__SHIFT_SLACK + 4 * d.S * g->c;
    return d;
}
static int dt__shift_dgrad2_fits(const dt__cpu_state *st, const dt_conv_geom *g, int threads) {
    dt__dgrad2_geom d = dt__dgrad2_make(g);
    return g->kh == 3 && g->kw == 3 && g->sh == 2 && g->sw == 2 && d.shared + d.per <= st->gemm_ws_count / threads;
}
static void dt__shift_dgrad2(dt__cpu_state *st, const dt_conv_geom *g, const float *W, const float *dy, float *dx, int add,
                             int threads) {
    dt__dgrad2_geom d = dt__dgrad2_make(g);
    int64_t K0[5], p, t, k, rows = g->c;
    float *Ap = st->gemm_ws, *ws = st->gemm_ws + d.shared;
    int32_t *off = (int32_t *)(void *)(Ap + d.rp * 9 * g->oc);
    dt__shift_vec *vec = dt__shift_vec_at(Ap + d.rp * 9 * g->oc + 9 * g->oc);
    dt__shift_geom vg;
    memset(&vg, 0, sizeof vg);
    vg.wq = d.wd; vg.oh = d.hq; vg.ow = d.wq;   /* computed over hq rows of wd, kept wq of each */
    dt__shift_vecs(&vg, d.nv, vec);
    K0[0] = 0;
    for (p = 0; p < 4; p++) {   /* phase p = 2a + b: (2 - a) x (2 - b) taps (ty, tx) */
        int64_t a = p / 2, b = p % 2, na = 2 - a, nb = 2 - b, Kp = g->oc * na * nb;
        K0[p + 1] = K0[p] + Kp;
        for (k = 0; k < Kp; k++) {
            int64_t o = k / (na * nb), ty = k % (na * nb) / nb, tx = k % nb;
            off[K0[p] + k] = (int32_t)(o * d.pd + (1 - ty) * d.wd + (1 - tx));
            for (t = 0; t < d.rp; t++)
                Ap[K0[p] * d.rp + (t / 8 * Kp + k) * 8 + t % 8] =
                    t < rows ? W[((o * g->c + t) * 3 + a + 2 * ty) * 3 + b + 2 * tx] : 0.0f;
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
                dt__shift_copy(dyp + o * d.pd + d.wd + 1, d.wd, dyi + o * g->oh * g->ow, g->ow, g->oh, g->ow);
            for (q = 0; q < 4; q++) {
                int64_t Kp = K0[q + 1] - K0[q];
                for (r = 0; r < rows; r += 8)
                    for (j = 0; j < d.hq * d.wd; j += 48)
                        dt__shift_tile(Kp, Ap + K0[q] * d.rp + r * Kp, dyp + j, off + K0[q], vec + j / 16, P + (q * rows + r) * d.S,
                                       d.S, NULL, 0, rows - r < 8 ? (int)(rows - r) : 8);
            }
            for (c = 0; c < rows; c++)   /* the phases interleaved into dx */
                for (iy = 0; iy < g->h; iy++) {
                    int64_t py = iy + g->ph;
                    const float *p0 = P + ((py % 2) * 2 * rows + c) * d.S + py / 2 * d.wq;
                    float *dr = dxi + (c * g->h + iy) * g->w;
                    for (ix = 0; ix < g->w; ix++) {
                        int64_t px = ix + g->pw;
                        float v = p0[(px % 2) * rows * d.S + px / 2];
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
static void dt__shift_conv(dt__cpu_state *st, const dt_conv_geom *g, const float *W, const float *src, const float *b, float *dst,
                           int grad, int add, int threads) {
    int64_t kk = g->kh * g->kw, rows = grad ? g->c : g->oc, K = (grad ? g->oc : g->c) * kk, ap = (rows + 7) / 8 * 8 * K;
    dt__shift_geom s = grad ? dt__shift_make(g->oc, g->oh, g->ow, g->kh - 1 - g->ph, g->kw - 1 - g->pw, g->kh, g->kw, 1)
                            : dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh);
    dt__shift_pack_a(W, rows, K, grad, kk, st->gemm_ws);
    dt__shift_run(&s, g->n, src, st->gemm_ws, rows, dst, b, add, st->gemm_ws + ap, dt__shift_run_need(&s), threads);
}
/* 1 when the shifted path takes this convolution (forward, or grad: both gradients) on the model's
   workspace with `threads` threads: stride 1, AVX-512, a kernel small enough for the caches, at least an
   image per thread (with fewer, the packed GEMM shares better), the input gradient's padding k - 1 - p
   not negative, and the workspace large enough */
static int dt__shift_fits(const dt__cpu_state *st, const dt_conv_geom *g, int grad, int threads) {
    int64_t kk = g->kh * g->kw;
    dt__shift_geom s;
    if (!st || !st->gemm_ws || dt__shift_off || g->sh != g->sw || g->sh < 1 || g->sh > 2 ||
        (g->sh == 2 && (g->kh != 3 || g->kw != 3)) || g->kw + 64 > DT__SHIFT_SLACK || g->oc * g->c * kk > DT__SHIFT_MAX_W ||
        g->n < threads || !__builtin_cpu_supports("avx512f"))
        return 0;
    s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh);
    if (!grad) return (g->oc + 7) / 8 * 8 * g->c * kk + threads * dt__shift_run_need(&s) <= st->gemm_ws_count;
    if (st->gemm_ws_count / threads < dt__shift_wgrad_need(g)) return 0;
    if (g->sh == 2) return 1;   /* the weight gradient only */
    if (g->ph > g->kh - 1 || g->pw > g->kw - 1) return 0;
    s = dt__shift_make(g->oc, g->oh, g->ow, g->kh - 1 - g->ph, g->kw - 1 - g->pw, g->kh, g->kw, 1);
    return (g->c + 7) / 8 * 8 * g->oc * kk + threads * dt__shift_run_need(&s) <= st->gemm_ws_count;
}
static int dt__cpu_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int threads = dt_cpu_threads();
    if (!dt__shift_fits(st, g, 0, threads)) return 0;
    dt__shift_conv(st, g, W, x, b, y, 0, 0, threads);
    dt__shift_taken++;
    return 1;
}
static int dt__cpu_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                            float *dx, int accumulate) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int threads = dt_cpu_threads();
    if (!dt__shift_fits(st, g, 1, threads)) return 0;
    if (g->kh == 3 && g->kw == 3) dt__shift_wgrad3(g, x, dy, dW, st->gemm_ws, st->gemm_ws_count, threads);
    else dt__shift_wgrad(g, x, dy, dW, st->gemm_ws, st->gemm_ws_count, threads);
    dt__shift_taken++;
    if (dx && g->sh == 2 && !dt__shift_dgrad2_fits(st, g, threads)) return 2;   /* the input gradient by the GEMMs */
    if (dx && g->sh == 2) { dt__shift_dgrad2(st, g, W, dy, dx, accumulate != 0, threads); return 1; }
    if (dx) dt__shift_conv(st, g, W, dy, NULL, dx, 1, accumulate != 0, threads);
    return 1;
}
#else
static int dt__cpu_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    (void)ctx; (void)g; (void)x; (void)W; (void)b; (void)y; (void)dt__shift_off; (void)dt__shift_taken;
    return 0;
}
static int dt__cpu_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                            float *dx, int accumulate) {
    (void)ctx; (void)g; (void)x; (void)W; (void)dy; (void)dW; (void)dx; (void)accumulate;
    return 0;
}
#endif

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
   transposed kernel W'[c][o][kh-1-ky][kw-1-kx] = W[o][c][ky][kx] and padding k-1-p: t [c, n*h*w] = W' im2col(dy),
   then dx += t as [n, c, h, w]. The GEMM packs from dy, so nothing im2col-sized is written or scattered. */
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
/* (In C, OpenMP makes only the parallel loop's own variable private: inner loops declare theirs inside.) */
static void dt__cpu_add_row_bias(void *ctx, float *y, const float *b, int64_t rows, int64_t cols) {
    int64_t r;
    (void)ctx;
    DT__OMP(parallel for if (rows * cols > DT__PAR_MIN))
    for (r = 0; r < rows; r++) {
        int64_t i;
        for (i = 0; i < cols; i++) y[r * cols + i] += b[i];
    }
}
static void dt__cpu_sum_rows_bwd(void *ctx, float *db, const float *dy, int64_t rows, int64_t cols) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (rows * cols > DT__PAR_MIN))
    for (i = 0; i < cols; i++) {
        float acc = 0.0f;
        int64_t r;
        for (r = 0; r < rows; r++) acc += dy[r * cols + i];
        db[i] += acc;
    }
}

static void dt__cpu_im2col(void *ctx, const dt_conv_geom *g, const float *x, float *col) {
    int64_t rows = g->c * g->kh * g->kw, S = g->oh * g->ow, r;
    (void)ctx;
    DT__OMP(parallel for schedule(static) if (rows * g->n * S > DT__PAR_MIN))
    for (r = 0; r < rows; r++)
        dt__col_span(g, x, r / (g->kh * g->kw), (r / g->kw) % g->kh, r % g->kw, 0, 0, 0, g->n * S, col + r * g->n * S, 1);
}

#ifdef DT__COL_SPAN_AVX512
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
#endif

static void dt__cpu_col2im_bwd(void *ctx, const dt_conv_geom *g, const float *col, float *dx) {
    int64_t S = g->oh * g->ow, nc;
    (void)ctx;
#ifdef DT__COL_SPAN_AVX512
    if (__builtin_cpu_supports("avx512f") && dt__col2im_small(g, col, dx)) return;
#endif
    /* one (image, channel) plane per iteration: its rows of col only write into that plane */
    DT__OMP(parallel for schedule(static) if (g->c * g->kh * g->kw * g->n * S > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        int64_t n = nc / g->c, c = nc % g->c, ky, kx, oy, ox;
        float *xc = dx + (n * g->c + c) * g->h * g->w;
        for (ky = 0; ky < g->kh; ky++)
            for (kx = 0; kx < g->kw; kx++) {
                int64_t r = (c * g->kh + ky) * g->kw + kx;
                const float *src = col + r * g->n * S + n * S;
                int64_t lo = kx >= g->pw ? 0 : (g->pw - kx + g->sw - 1) / g->sw;
                int64_t hi = g->w + g->pw - kx > 0 ? (g->w + g->pw - kx - 1) / g->sw + 1 : 0;
                if (hi > g->ow) hi = g->ow;
                for (oy = 0; oy < g->oh; oy++) {
                    int64_t iy = oy * g->sh - g->ph + ky;
                    int64_t base = iy * g->w - g->pw + kx;
                    const float *s = src + oy * g->ow;
                    if (iy < 0 || iy >= g->h) continue;
                    if (g->sw == 1) for (ox = lo; ox < hi; ox++) xc[base + ox] += s[ox];
                    else for (ox = lo; ox < hi; ox++) xc[base + ox * g->sw] += s[ox];
                }
            }
    }
}

static void dt__cpu_cs_to_ncs(void *ctx, float *y, const float *t, const float *b, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        int64_t i = nc / c, ch = nc % c, k;
        const float *src = t + ch * n * s + i * s;
        float *dst = y + nc * s, bias = b ? b[ch] : 0.0f;
        for (k = 0; k < s; k++) dst[k] = src[k] + bias;
    }
}
static void dt__cpu_ncs_to_cs(void *ctx, float *t, const float *y, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        int64_t i = nc / c, ch = nc % c;
        memcpy(t + ch * n * s + i * s, y + nc * s, sizeof(float) * (size_t)s);
    }
}
static void dt__bn_sums(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *sx,
                        double *sxy);
static void dt__cpu_channel_sum_bwd(void *ctx, float *db, const float *dy, int64_t n, int64_t c, int64_t s) {
    int64_t ch;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {   /* in double on independent lanes, as batch norm's sums */
        double acc, sq;
        dt__bn_sums(dy + ch * s, NULL, NULL, n, c * s, s, &acc, &sq);
        db[ch] += (float)acc;
    }
}

#ifdef DT__X86
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
#endif
static void dt__cpu_maxpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y, int32_t *idx) {
    int64_t nc;
    (void)ctx;
    if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0) {
        /* 2 x 2, stride 2: every window inside; selects instead of branches (which the data mispredicts).
           A tap replaces the best unless the best is NaN or the tap is <= it: first maximum, first NaN. */
        int simd = 0;
#ifdef DT__X86
        simd = __builtin_cpu_supports("avx512f");
#endif
        (void)simd;
        DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * 4 > DT__PAR_MIN))
        for (nc = 0; nc < g->n * g->c; nc++) {
            int64_t oy, ox, w = g->w;
            for (oy = 0; oy < g->oh; oy++) {
                const float *r0 = x + nc * g->h * w + 2 * oy * w, *r1 = r0 + w;
                float *yo = y + (nc * g->oh + oy) * g->ow;
                int32_t *io = idx + (nc * g->oh + oy) * g->ow, i0 = (int32_t)(2 * oy * w);
                ox = 0;
#ifdef DT__X86
                if (simd)   /* 16 outputs a step, the last step masked */
                    for (; ox < g->ow; ox += 16)
                        dt__maxpool2_avx512(r0 + 2 * ox, r1 + 2 * ox, w, i0 + 2 * (int32_t)ox, yo + ox, io + ox,
                                            g->ow - ox < 16 ? (int)(g->ow - ox) : 16);
#endif
                for (; ox < g->ow; ox++) {
                    float best = r0[2 * ox], v;
                    int32_t bi = i0 + 2 * (int32_t)ox, t;
                    v = r0[2 * ox + 1]; t = best == best && !(v <= best); best = t ? v : best; bi = t ? i0 + 2 * (int32_t)ox + 1 : bi;
                    v = r1[2 * ox];     t = best == best && !(v <= best); best = t ? v : best; bi = t ? i0 + (int32_t)w + 2 * (int32_t)ox : bi;
                    v = r1[2 * ox + 1]; t = best == best && !(v <= best); best = t ? v : best;
                    bi = t ? i0 + (int32_t)w + 2 * (int32_t)ox + 1 : bi;
                    yo[ox] = best;
                    io[ox] = bi;
                }
            }
        }
        return;
    }
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * g->kh * g->kw > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        const float *xp = x + nc * g->h * g->w;
        int64_t oy, ox, ky, kx;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) {
                float best;
                int64_t bi, y0 = oy * g->sh - g->ph, x0 = ox * g->sw - g->pw;
                if (y0 >= 0 && x0 >= 0 && y0 + g->kh <= g->h && x0 + g->kw <= g->w) {
                    /* inside: no bounds checks; first maximum wins, NaN propagates */
                    bi = y0 * g->w + x0;
                    best = xp[bi];
                    for (ky = 0; ky < g->kh && best == best; ky++)
                        for (kx = 0; kx < g->kw; kx++) {
                            float v = xp[(y0 + ky) * g->w + x0 + kx];
                            if (v > best || v != v) { best = v; bi = (y0 + ky) * g->w + x0 + kx; if (v != v) break; }
                        }
                } else {
                    best = dt__maxpool_window(g, xp, oy, ox, &bi);   /* at the border: checked taps */
                }
                y[(nc * g->oh + oy) * g->ow + ox] = best;
                idx[(nc * g->oh + oy) * g->ow + ox] = (int32_t)bi;
            }
    }
}
static void dt__cpu_maxpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, const int32_t *idx, float *dx) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        int64_t k, S = g->oh * g->ow;
        float *dxp = dx + nc * g->h * g->w;
        for (k = 0; k < S; k++)
            if (idx[nc * S + k] >= 0) dxp[idx[nc * S + k]] += dy[nc * S + k];
    }
}
static void dt__cpu_avgpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * g->kh * g->kw > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        const float *xp = x + nc * g->h * g->w;
        int64_t oy, ox;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) y[(nc * g->oh + oy) * g->ow + ox] = dt__avgpool_window(g, xp, oy, ox);
    }
}
static void dt__cpu_avgpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, float *dx) {
    int64_t nc;
    float inv = 1.0f / (float)(g->kh * g->kw);
    (void)ctx;
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * g->kh * g->kw > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        float *dxp = dx + nc * g->h * g->w;
        int64_t oy, ox, ky, kx;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) {
                float v = dy[(nc * g->oh + oy) * g->ow + ox] * inv;
                for (ky = 0; ky < g->kh; ky++) {
                    int64_t iy = oy * g->sh - g->ph + ky;
                    if (iy < 0 || iy >= g->h) continue;
                    for (kx = 0; kx < g->kw; kx++) {
                        int64_t ix = ox * g->sw - g->pw + kx;
                        if (ix >= 0 && ix < g->w) dxp[iy * g->w + ix] += v;
                    }
                }
            }
    }
}
static void dt__cpu_gap_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        float acc = 0.0f;
        int64_t k;
        for (k = 0; k < s; k++) acc += x[nc * s + k];
        y[nc] = acc / (float)s;
    }
}
static void dt__cpu_gap_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        float v = dy[nc] / (float)s;
        int64_t k;
        for (k = 0; k < s; k++) dx[nc * s + k] += v;
    }
}
static void dt__cpu_relu_fwd(void *ctx, const float *x, float *y, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
static void dt__cpu_relu_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {   /* dy read unconditionally, so the select vectorises */
        float d = dy[i];
        dx[i] += y[i] > 0.0f ? d : 0.0f;
    }
}
static void dt__cpu_dropout_fwd(void *ctx, const float *x, float *y, float *mask, int64_t n, float p, uint64_t key) {
    int64_t i;
    float keep = 1.0f / (1.0f - p);
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        mask[i] = dt__hash_uniform(key, (uint64_t)i) >= p ? keep : 0.0f;
        y[i] = x[i] * mask[i];
    }
}
static void dt__cpu_mul_bwd(void *ctx, const float *dy, const float *mask, float *dx, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) dx[i] += dy[i] * mask[i];
}

/* Sums over the n rows of s floats, rows cs apart, of x and of x*x (y NULL) or of x and x*y, in double on 8
   independent lanes (which the compiler turns into vector adds; one chain of double adds would wait on
   each add's latency), added pairwise at the end. mk not NULL: x counts as 0 where mk (laid out as x) is
   not > 0 (the gradient through a ReLU whose output is mk). */
#ifdef DT__X86
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
#endif
static void dt__bn_sums(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *sx,
                        double *sxy) {
    double a[16] = {0}, b[16] = {0};
    int64_t i, k;
    int j, w;
#ifdef DT__X86
    if (__builtin_cpu_supports("avx512f")) {
        dt__bn_sums512(x, y, mk, n, cs, s, a, b);
        for (j = 0; j < 8; j++) { a[j] += a[j + 8]; b[j] += b[j + 8]; }
        n = 0;
    }
#endif
    for (i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = (y ? y : x) + i * cs, *r = mk ? mk + i * cs : NULL;
        for (k = 0; k + 8 <= s; k += 8)
            for (j = 0; j < 8; j++) {
                double pv = r && !(r[k + j] > 0.0f) ? 0.0 : (double)p[k + j];
                a[j] += pv;
                b[j] += pv * (double)q[k + j];
            }
        for (; k < s; k++) {
            double pv = r && !(r[k] > 0.0f) ? 0.0 : (double)p[k];
            a[k % 8] += pv;
            b[k % 8] += pv * (double)q[k];
        }
    }
    for (w = 4; w > 0; w /= 2)
        for (j = 0; j < w; j++) { a[j] += a[j + w]; b[j] += b[j + w]; }
    *sx = a[0];
    *sxy = b[0];
}
/* batch norm's forward pass; when relu is 1, then + res (res not NULL) and ReLU */
static void dt__bn_fwd(int training, int relu, const float *x, const float *res, float *y, int64_t n, int64_t c, int64_t s,
                       const float *gamma,
                       const float *beta, float *rm, float *rv, float eps, float momentum, float *save_mean,
                       float *save_invstd) {
    int64_t ch;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {
        int64_t i, k, cnt = n * s;
        float mean, invstd, g, b;
        if (training) {
            /* sums in double: the variance as E[x^2] - mean^2 keeps 1e-6 relative to PyTorch at any batch
               (float data has 24 bits; double leaves 29 for the cancellation) */
            double sum, sq, dm, var;
            dt__bn_sums(x + ch * s, NULL, NULL, n, c * s, s, &sum, &sq);
            dm = sum / (double)cnt;
            sq -= dm * sum;   /* sum of (x - mean)^2 */
            if (sq < 0.0) sq = 0.0;
            mean = (float)dm;
            var = sq / (double)cnt;
            invstd = (float)(1.0 / sqrt(var + (double)eps));
            rm[ch] = (1.0f - momentum) * rm[ch] + momentum * mean;
            rv[ch] = (1.0f - momentum) * rv[ch] + momentum * (float)(cnt > 1 ? sq / (double)(cnt - 1) : var);
        } else {
            mean = rm[ch];
            invstd = 1.0f / sqrtf(rv[ch] + eps);
        }
        save_mean[ch] = mean;
        save_invstd[ch] = invstd;
        g = gamma[ch] * invstd;
        b = beta[ch] - mean * g;
        for (i = 0; i < n; i++) {
            const float *xp = x + (i * c + ch) * s;
            float *yp = y + (i * c + ch) * s;
            if (relu && res)
                for (k = 0; k < s; k++) {
                    float v = (xp[k] * g + b) + res[(i * c + ch) * s + k];
                    yp[k] = v > 0.0f ? v : 0.0f;
                }
            else if (relu)
                for (k = 0; k < s; k++) {
                    float v = xp[k] * g + b;
                    yp[k] = v > 0.0f ? v : 0.0f;
                }
            else
                for (k = 0; k < s; k++) yp[k] = xp[k] * g + b;
        }
    }
}
static void dt__cpu_bn_fwd(void *ctx, int training, const float *x, float *y, int64_t n, int64_t c, int64_t s,
                           const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                           float *save_mean, float *save_invstd) {
    (void)ctx;
    dt__bn_fwd(training, 0, x, NULL, y, n, c, s, gamma, beta, rm, rv, eps, momentum, save_mean, save_invstd);
}
static void dt__cpu_bn_relu_fwd(void *ctx, int training, const float *x, const float *r, float *y, int64_t n, int64_t c,
                                int64_t s, const float *gamma, const float *beta, float *rm, float *rv, float eps,
                                float momentum, float *save_mean, float *save_invstd) {
    (void)ctx;
    dt__bn_fwd(training, 1, x, r, y, n, c, s, gamma, beta, rm, rv, eps, momentum, save_mean, save_invstd);
}
/* batch norm's backward pass for the gradient dy of its output, or (y not NULL) of y = max(0, its output
   [+ a residual]); dx += (acc 1) or = (acc 0); dr (not NULL: the residual's gradient) += (acc_r 1) or =
   dy where y > 0 */
static void dt__bn_bwd(int training, const float *x, const float *y, const float *dy, float *dx, int acc, float *dr, int acc_r,
                       int64_t n, int64_t c, int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                       float *dgamma, float *dbeta) {
    int64_t ch;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {
        int64_t i, k, cnt = n * s;
        double sdy, sdyx;
        float mean = save_mean[ch], invstd = save_invstd[ch];
        dt__bn_sums(dy + ch * s, x + ch * s, y ? y + ch * s : NULL, n, c * s, s, &sdy, &sdyx);
        sdyx = (sdyx - (double)mean * sdy) * (double)invstd;   /* sum of dy * xhat */
        dgamma[ch] += (float)sdyx;
        dbeta[ch] += (float)sdy;
        if (dx) {
            float gi = gamma[ch] * invstd;
            float mdy = training ? (float)(sdy / (double)cnt) : 0.0f;
            float mdyx = training ? (float)(sdyx / (double)cnt) : 0.0f;
            /* dx += gi (dy - mdy - xhat mdyx) with xhat = (x - mean) invstd */
            float cx = -gi * invstd * mdyx, c0 = -gi * mdy;
            for (i = 0; i < n; i++) {
                const float *dyp = dy + (i * c + ch) * s, *xp = x + (i * c + ch) * s, *yp = y ? y + (i * c + ch) * s : NULL;
                float *dxp = dx + (i * c + ch) * s;
                if (!yp && acc) for (k = 0; k < s; k++) dxp[k] += gi * dyp[k] + cx * (xp[k] - mean) + c0;
                else if (!yp) for (k = 0; k < s; k++) dxp[k] = gi * dyp[k] + cx * (xp[k] - mean) + c0;
                else if (acc)
                    for (k = 0; k < s; k++) {
                        float d = dyp[k];   /* read unconditionally, so the select vectorises */
                        dxp[k] += gi * (yp[k] > 0.0f ? d : 0.0f) + cx * (xp[k] - mean) + c0;
                    }
                else
                    for (k = 0; k < s; k++) {
                        float d = dyp[k];
                        dxp[k] = gi * (yp[k] > 0.0f ? d : 0.0f) + cx * (xp[k] - mean) + c0;
                    }
            }
        }
        for (i = 0; dr && y && i < n; i++) {
            const float *dyp = dy + (i * c + ch) * s, *yp = y + (i * c + ch) * s;
            float *drp = dr + (i * c + ch) * s;
            if (acc_r) for (k = 0; k < s; k++) { float d = dyp[k]; drp[k] += yp[k] > 0.0f ? d : 0.0f; }
            else for (k = 0; k < s; k++) { float d = dyp[k]; drp[k] = yp[k] > 0.0f ? d : 0.0f; }
        }
    }
}
static void dt__cpu_bn_bwd(void *ctx, int training, const float *x, const float *dy, float *dx, int64_t n, int64_t c,
                           int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                           float *dgamma, float *dbeta) {
    (void)ctx;
    dt__bn_bwd(training, x, NULL, dy, dx, 1, NULL, 0, n, c, s, gamma, save_mean, save_invstd, dgamma, dbeta);
}
static void dt__cpu_bn_relu_bwd(void *ctx, int training, const float *x, const float *y, const float *dy, float *dx,
                                int accumulate, float *dr, int acc_r, int64_t n, int64_t c, int64_t s, const float *gamma,
                                const float *save_mean, const float *save_invstd, float *dgamma, float *dbeta) {
    (void)ctx;
    dt__bn_bwd(training, x, y, dy, dx, accumulate, dr, acc_r, n, c, s, gamma, save_mean, save_invstd, dgamma, dbeta);
}
static void dt__cpu_add_relu_fwd(void *ctx, float *y, const float *a, const float *b, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        float v = a[i] + b[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
/* d = dy where y > 0, else 0, written (acc 0) or added (acc 1) to each of da, db that is not NULL */
static void dt__cpu_add_relu_bwd(void *ctx, const float *y, const float *dy, float *da, int acc_a, float *db, int acc_b,
                                 int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i += 4096) {   /* a block at a time, so each loop below is a plain vector loop */
        int64_t k, e = n - i < 4096 ? n : i + 4096;
        if (da && acc_a) for (k = i; k < e; k++) { float d = dy[k]; da[k] += y[k] > 0.0f ? d : 0.0f; }
        else if (da) for (k = i; k < e; k++) { float d = dy[k]; da[k] = y[k] > 0.0f ? d : 0.0f; }
        if (db && acc_b) for (k = i; k < e; k++) { float d = dy[k]; db[k] += y[k] > 0.0f ? d : 0.0f; }
        else if (db) for (k = i; k < e; k++) { float d = dy[k]; db[k] = y[k] > 0.0f ? d : 0.0f; }
    }
}

static void dt__cpu_pad_shortcut_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t h, int64_t w,
                                     int64_t oc, int64_t stride) {
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride, lo = (oc - c) / 2, no;
    (void)ctx;
    DT__OMP(parallel for if (n * oc * oh * ow > DT__PAR_MIN))
    for (no = 0; no < n * oc; no++) {
        int64_t i = no / oc, o = no % oc, ci = o - lo, yy, xx;
        float *yp = y + no * oh * ow;
        if (ci < 0 || ci >= c) { memset(yp, 0, sizeof(float) * (size_t)(oh * ow)); continue; }
        for (yy = 0; yy < oh; yy++)
            for (xx = 0; xx < ow; xx++) yp[yy * ow + xx] = x[((i * c + ci) * h + yy * stride) * w + xx * stride];
    }
}
static void dt__cpu_pad_shortcut_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t h, int64_t w,
                                     int64_t oc, int64_t stride) {
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride, lo = (oc - c) / 2, nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * oh * ow > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        int64_t i = nc / c, ci = nc % c, yy, xx;
        const float *dyp = dy + (i * oc + ci + lo) * oh * ow;
        for (yy = 0; yy < oh; yy++)
            for (xx = 0; xx < ow; xx++) dx[(nc * h + yy * stride) * w + xx * stride] += dyp[yy * ow + xx];
    }
}

static void dt__cpu_log_softmax_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t k) {
    int64_t r;
    (void)ctx;
    DT__OMP(parallel for if (n * k > DT__PAR_MIN))
    for (r = 0; r < n; r++) dt__log_softmax_row(x + r * k, y + r * k, k);
}
static void dt__cpu_log_softmax_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n, int64_t k) {
    int64_t r;
    (void)ctx;
    DT__OMP(parallel for if (n * k > DT__PAR_MIN))
    for (r = 0; r < n; r++) dt__log_softmax_row_bwd(y + r * k, dy + r * k, dx + r * k, k);
}
/* Losses run on one thread: their cost is O(n k), tiny next to any layer, and a fixed order keeps the
   loss bit-reproducible. Labels were checked by the caller. */
static void dt__cpu_softmax_xent(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, float *dx,
                                 float *loss) {
    int64_t r;
    double total = 0.0;
    (void)ctx;
    for (r = 0; r < n; r++) total += dt__softmax_xent_row(x + r * k, labels[r], k, n, dx + r * k);
    *loss = (float)(total / (double)n);
}
static void dt__cpu_nll(void *ctx, const float *logp, const int32_t *labels, int64_t n, int64_t k, float *dx,
                        float *loss) {
    int64_t r;
    double total = 0.0;
    (void)ctx;
    memset(dx, 0, sizeof(float) * (size_t)(n * k));
    for (r = 0; r < n; r++) {
        total -= (double)logp[r * k + labels[r]];
        dx[r * k + labels[r]] = -1.0f / (float)n;
    }
    *loss = (float)(total / (double)n);
}
static void dt__cpu_mse(void *ctx, const float *x, const float *target, int64_t n, float *dx, float *loss) {
    int64_t i;
    double total = 0.0;
    (void)ctx;
    for (i = 0; i < n; i++) {
        float d = x[i] - target[i];
        total += (double)d * (double)d;
        dx[i] = 2.0f * d / (float)n;
    }
    *loss = (float)(total / (double)n);
}
static void dt__cpu_count_correct(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k,
                                  int64_t *correct) {
    int64_t r, c = 0;
    (void)ctx;
    for (r = 0; r < n; r++) c += dt__argmax_row(x + r * k, k) == labels[r];
    *correct = c;
}

static void dt__cpu_sum_squares(void *ctx, const float *x, int64_t n, double *out) {
    double acc = 0.0;
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for reduction(+:acc) if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
    *out = acc;
}
/* The order of operations follows torch.optim's single-tensor code, so results agree to the last bits. */
static void dt__cpu_sgd_step(void *ctx, float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                             float dampening, float wd, int nesterov, int first) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) dt__sgd_update(p, g, buf, i, lr, momentum, dampening, wd, nesterov, first);
}
static void dt__cpu_adam_step(void *ctx, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) dt__adam_update(p, g, m, v, i, lr, beta1, beta2, eps, wd, decoupled, step_size, bc2_sqrt);
}

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
    dt__cpu_bn_relu_fwd, dt__cpu_bn_relu_bwd, dt__cpu_add_relu_fwd, dt__cpu_add_relu_bwd
};

const dt_ops *dt_cpu_ops(void) { return &dt__cpu_ops_table; }

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
