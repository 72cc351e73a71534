/* dtrain/core/tensor.h - tensors, the backend ops table, and the CPU's plain reference ops.   Part of dtrain
   v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     Tensor views and window geometry; dt_ops, the table of operations every layer calls (one table per
     backend: dtrain/cpu/cpu.h fills the CPU's, dtrain_cuda.h the GPU's); the loop bodies the CPU and the GPU
     share (pooling windows, softmax rows, the optimizers' updates); and the CPU ops in plain C, those with a
     faster twin taking dt__kernel, the table of what a faster CPU tier may replace (dtrain/cpu/kernel.h):
     im2col and col2im, pooling, batch norm, activations, losses, the optimizer steps, the naive GEMM
     (dt_gemm_ref) and the naive convolution (dt_conv2d_ref). Each op is the reference twin of its fast
     kernels: read these to know what an op computes; dtrain/cpu/cpu_x86.h and dtrain/cpu/cpu_arm.h compute
     the same faster. The loops that compilers
     leave scalar as written (batch norm's sums) use GNU C's vector types where there are (DT__VEC), with
     the plain loop beside them for DT_NO_SIMD and other compilers: the same bits either way.
   USES
     dtrain/core/base.h; dtrain/cpu/kernel.h, the seam it shares with the CPU backend's files.
   READ FIRST
     struct dt_ops (each op's shapes and contract), dt__col_span (im2col one row stretch at a time, never
     materialised), dt_gemm_ref, dt__bn_fwd and dt__bn_bwd (batch norm with its sums in double),
     dt__maxpool_fwd, struct dt__kernel in dtrain/cpu/kernel.h (the seam to the fast kernels: each entry names
     its twin here; that file declares what of this module the CPU backend's files use).
*/
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
    /* optional (NULL: this backend has no synchronised batch norm, which dt_model_set_bn_sync then refuses): the
       two halves a SyncBatchNorm adds around bn_fwd and bn_bwd run in eval mode (dtrain/core/pass.h). bn_sums: per
       channel of x [n, c, s], in double, into host memory: with dy NULL, out[ch] = sum x and out[c + ch] =
       sum x^2; otherwise, with dy' = dy where y > 0 (y not NULL: a fused ReLU's output) or dy, out[ch] = sum dy'
       and out[c + ch] = sum dy' x. bn_affine_acc: dx [n, c, s] += g[ch] (a[ch] x + b[ch]). */
    void  (*bn_sums)(void *ctx, const float *x, const float *y, const float *dy, int64_t n, int64_t c, int64_t s, double *out);
    void  (*bn_affine_acc)(void *ctx, float *dx, const float *x, const float *g, const float *a, const float *b, int64_t n,
                           int64_t c, int64_t s);
} dt_ops;

/* A backend that a build registers as the default of models whose dt_model_desc.ops is NULL (dtrain.h
   registers the GPU's, dtrain_cuda.h's dt_cuda_backend(), with DT_USE_CUDA; without one the default is the
   CPU): its table, and the context a model creates for itself when desc.ops_ctx is NULL and destroys last. */
typedef struct dt_backend {
    const dt_ops *(*ops)(void);               /* the table */
    dt_result     (*ctx_create)(void **ctx);  /* a context with the backend's defaults into *ctx; on failure
                                                 the error dt_model_create returns */
    void          (*ctx_destroy)(void *ctx);  /* frees what ctx_create made */
} dt_backend;

/* The plain GEMM with the semantics of dt_ops.gemm (a double accumulator per element), the twin of the
   blocked dt_gemm of dtrain/cpu/cpu.h */
void dt_gemm_ref(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Naive direct convolution, the twin of im2col + GEMM: y [n, oc, oh, ow] = w [oc, c, kh, kw] * x + b */
void dt_conv2d_ref(const dt_conv_geom *g, const float *x, const float *w, const float *b, float *y);
/* Number of threads the CPU kernels use (1 without OpenMP). */
int dt_cpu_threads(void);

/* FOR BACKENDS: the loop bodies. The ops whose bodies are more than a line have them as functions that a
   backend calls in its own loops, so that every backend computes the same numbers from one definition:
   dt_body_relu, dt_body_maxpool_window, dt_body_avgpool_window, dt_body_log_softmax_row, dt_body_log_softmax_row_bwd,
   dt_body_softmax_xent_row, dt_body_argmax_row, dt_body_sgd_update, dt_body_adam_update (below, after
   these declarations) and dt_body_hash_uniform (dtrain/core/base.h). They are static inline, host and device
   functions under nvcc, and are defined where DTRAIN_IMPLEMENTATION or DTRAIN_CUDA_IMPLEMENTATION is:
   dtrain_cuda.h's kernels are their other user. */

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TENSOR_H */

/* ============================================================================================== */
/* The loop bodies for backends: the CPU ops below and the CUDA kernels of dtrain_cuda.h (compiled */
/* by nvcc, where DT__HD makes them device functions too) compute the same numbers from one        */
/* definition. Part of either implementation, never of the declarations.                           */
/* ============================================================================================== */

#if (defined(DTRAIN_IMPLEMENTATION) || defined(DTRAIN_CUDA_IMPLEMENTATION)) && !defined(DTRAIN_SHARED_DONE)
#define DTRAIN_SHARED_DONE
#include <math.h>
/* ReLU: max(0, v), with NaN kept, as in PyTorch: a NaN that a ReLU turned into 0 would hide a diverged
   model from the loss's check (NaN weights feeding ReLUs gave a finite loss). -0 becomes 0. The backward
   passes keep their mask y > 0 (a NaN output's gradient is 0: the loss is NaN by then and training stops). */
static inline DT__HD float dt_body_relu(float v) { return v <= 0.0f ? 0.0f : v; }

/* Max pooling of window (oy, ox) of the plane xp [h, w], checking every tap against the borders: the
   maximum, and its offset in *at (-1 when the window holds no pixel). The first maximum wins and NaN
   propagates, as in PyTorch. */
static inline DT__HD float dt_body_maxpool_window(const dt_conv_geom *g, const float *xp, int64_t oy, int64_t ox, int64_t *at) {
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
static inline DT__HD float dt_body_avgpool_window(const dt_conv_geom *g, const float *xp, int64_t oy, int64_t ox) {
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
/* y [k] = x - log(sum exp(x)), as (x - max) - log(sum exp(x - max)) (PyTorch's order): x - max is exact, so the
   most probable class's log-probability keeps its digits (x - (max + log(sum)) rounded it to half a unit of
   the largest logit: -1.31607e-4 for -1.31495e-4, an NLL gradient 0.1% off, a loss of 2.2e-7 read as 0) */
static inline DT__HD void dt_body_log_softmax_row(const float *x, float *y, int64_t k) {
    float mx, ls;
    double sum = dt__exp_sum(x, k, &mx);
    int64_t j;
    ls = (float)log(sum);
    for (j = 0; j < k; j++) y[j] = (x[j] - mx) - ls;
}
/* dx [k] += dy - exp(y) sum(dy), for y = log_softmax(x) */
static inline DT__HD void dt_body_log_softmax_row_bwd(const float *y, const float *dy, float *dx, int64_t k) {
    float sum = 0.0f;
    int64_t j;
    for (j = 0; j < k; j++) sum += dy[j];
    for (j = 0; j < k; j++) dx[j] += dy[j] - expf(y[j]) * sum;
}
/* Softmax cross-entropy of one row x [k] with its label, for a batch of n: dx [k] = (softmax(x) -
   onehot(label)) / n; returns the row's loss (NaN for a label outside [0, k)). */
static inline DT__HD double dt_body_softmax_xent_row(const float *x, int64_t label, int64_t k, int64_t n, float *dx) {
    float mx;
    double sum = dt__exp_sum(x, k, &mx), lse = (double)mx + log(sum);
    int64_t j;
    for (j = 0; j < k; j++) dx[j] = (float)((exp((double)x[j] - lse) - (j == label ? 1.0 : 0.0)) / (double)n);
    return label >= 0 && label < k ? lse - (double)x[label] : (double)NAN;
}
/* index of the first maximum of a row x [k] */
static inline DT__HD int64_t dt_body_argmax_row(const float *x, int64_t k) {   /* the first NaN wins, as in PyTorch */
    int64_t best = 0, j;
    for (j = 1; j < k && x[best] == x[best]; j++)
        if (x[j] > x[best] || x[j] != x[j]) best = j;
    return best;
}

/* One element of the optimizers' updates (dt_ops.sgd_step, adam_step), in torch.optim's order. */
static inline DT__HD void dt_body_sgd_update(float *p, const float *g, float *buf, int64_t i, float lr, float momentum,
                                         float dampening, float wd, int nesterov, int first) {
    float d = wd != 0.0f ? g[i] + wd * p[i] : g[i];
    if (momentum != 0.0f) {
        float b = first ? d : buf[i] * momentum + (1.0f - dampening) * d;
        buf[i] = b;
        d = nesterov ? d + momentum * b : b;
    }
    p[i] -= lr * d;
}
static inline DT__HD void dt_body_adam_update(float *p, const float *g, float *m, float *v, int64_t i, float lr, float beta1,
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
#ifndef DT_CONV_WORKSPACE
#define DT_CONV_WORKSPACE (1 << 24)
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"
#include "../cpu/kernel.h"   /* the kernel table, the vector types, dt__bsrc, dt__cpu_state: the seam to dtrain/cpu/ */
#ifdef DT__TEST_HOOKS   /* the test programs' handles (tests/dt_test_hooks.h; compiled in by tests/impl_test.c) */
int64_t dt__test_argmax_row(const float *x, int64_t k);
int64_t dt__test_argmax_row(const float *x, int64_t k) { return dt_body_argmax_row(x, k); }
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
                            "padding %lldx%lld): use a smaller kernel or more padding", (long long)g->kh, (long long)g->kw,
                            (long long)(g->h + 2 * g->ph), (long long)(g->w + 2 * g->pw), (long long)g->h,
                            (long long)g->w, (long long)g->ph, (long long)g->pw);
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

/* ---- GNU C's vector types, and the CPU kernel table -------------------------------------------------------- */
/* DT__VEC (GCC's and Clang's vector types for the portable kernels: dt__v4 ...) and dt__kernel (what a faster
   CPU tier may replace), the seam between these ops and the CPU backend, are in dtrain/cpu/kernel.h. */
#if DT__VEC
/* a vector from 4 floats at p (memcpy: unaligned) */
static DT__MAYBE_UNUSED dt__v4 dt__v4_load(const float *p) { dt__v4 v; memcpy(&v, p, sizeof v); return v; }
#endif

/* ---- im2col and the reference GEMM ---------------------------------------------------------- */

/* im2col's index arithmetic, the same for every stretch of a row (c, ky, kx): output columns [lo, hi) of
   any row read inside the image */
static void dt__col_cols(const dt_conv_geom *g, int64_t kx, int64_t *lo, int64_t *hi) {
    *lo = kx >= g->pw ? 0 : (g->pw - kx + g->sw - 1) / g->sw;
    *hi = g->w + g->pw - kx > 0 ? (g->w + g->pw - kx - 1) / g->sw + 1 : 0;
    if (*hi > g->ow) *hi = g->ow;
    if (*lo > *hi) *lo = *hi;
}


/* One stretch of a row of im2col(x) for geometry g, never materialised whole: row (c, ky, kx) of col
   [c*kh*kw, n*oh*ow], the `len` columns from output position (n, oy, ox) on, written to dst[i * stride].
   Reads zero outside the image (the padding). im2col and the convolution GEMMs' packing share it; k (NULL:
   none) may hold a faster stretch. */
static void dt__col_span(const dt__kernel *k, const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx,
                         int64_t n, int64_t oy, int64_t ox, int64_t len, float *DT__RESTRICT dst, int64_t stride) {
    int64_t lo, hi;
    if (stride == 1 && k && k->col_span) {
        k->col_span(g, x, c, ky, kx, n, oy, ox, len, dst);
        return;
    }
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

/* op(B)[p][j] of a B source (dt__bsrc, dtrain/cpu/kernel.h: a matrix B, or im2col of images) */
static float dt__bval(const dt__bsrc *bs, int64_t p, int64_t j) {
    const dt_conv_geom *g = bs->g;
    float v;
    if (!g) return bs->tb ? bs->B[j * bs->ldb + p] : bs->B[p * bs->ldb + j];
    {
        int64_t k = bs->tb ? j : p, pos = bs->tb ? p : j, S = g->oh * g->ow;
        dt__col_span(NULL, g, bs->B, k / (g->kh * g->kw), k / g->kw % g->kh, k % g->kw, pos / S, pos % S / g->ow, pos % g->ow, 1, &v, 1);
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
    void *p;
    (void)ctx;
    if (bytes <= 0) bytes = 1;
    p = DT_MALLOC((size_t)bytes);
    dt__advise_huge(p, (size_t)bytes);   /* the activation arena's first pass: fewer page faults */
    return p;
}
static void dt__cpu_free(void *ctx, void *p) { (void)ctx; DT_FREE(p); }
static void dt__cpu_upload(void *ctx, void *dst, const void *src, int64_t bytes) {
    (void)ctx;
    if (bytes > 0 && dst != src) memcpy(dst, src, (size_t)bytes);
}
/* bf16's rounding on floats: the high 16 bits after adding half an ulp of bf16 (less where the bit kept is even),
   so ties go to even; a NaN keeps its sign and is made quiet, as dt_bf16_from_float (comm.h) does for the wire */
static void dt__round_bf16(float *y, const float *x, int64_t n) {
    int64_t i;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
        else u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
        memcpy(&y[i], &u, sizeof u);
    }
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

/* ---- the ops of the CPU table with a faster twin: dtrain/cpu/cpu.h passes the chosen kernel table k ---- */
/* (Each takes k, NULL for the portable code alone; the ops in the table are dtrain/cpu/cpu.h's.) */

static void dt__im2col(const dt__kernel *k, const dt_conv_geom *g, const float *x, float *col) {
    int64_t rows = g->c * g->kh * g->kw, S = g->oh * g->ow, r;
    DT__OMP(parallel for schedule(static) if (rows * g->n * S > DT__PAR_MIN))
    for (r = 0; r < rows; r++)
        dt__col_span(k, g, x, r / (g->kh * g->kw), (r / g->kw) % g->kh, r % g->kw, 0, 0, 0, g->n * S, col + r * g->n * S, 1);
}

static void dt__col2im(const dt__kernel *k, const dt_conv_geom *g, const float *col, float *dx) {
    int64_t S = g->oh * g->ow, nc;
    if (k && k->col2im && k->col2im(g, col, dx)) return;
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
static void dt__bn_sums(const dt__kernel *k, const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s,
                        double *sx, double *sxy);
/* db [c] += the sums of dy over images and positions (the bias gradient of a convolution) */
static void dt__channel_sums(const dt__kernel *k, float *db, const float *dy, int64_t n, int64_t c, int64_t s) {
    int64_t ch;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {   /* in double on independent lanes, as batch norm's sums */
        double acc, sq;
        dt__bn_sums(k, dy + ch * s, NULL, NULL, n, c * s, s, &acc, &sq);
        db[ch] += (float)acc;
    }
}

/* cnt outputs of a row of 2 x 2 stride-2 max pooling: yo, io from input rows r0 and r1 (r0 at offset i0 of
   its plane, w wide). A tap replaces the best unless the best is NaN or the tap is <= it: first maximum,
   first NaN. Selects, not branches (which the data mispredicts), each with its condition written in it: so
   gcc -O3 and clang vectorise the loop (compares and selects on 4 outputs at a time at x86-64's baseline),
   where gcc left the same selects scalar with the condition kept in an int for both. */
static void dt__maxpool2_row(const float *DT__RESTRICT r0, const float *DT__RESTRICT r1, int64_t w, int32_t i0,
                             float *DT__RESTRICT yo, int32_t *DT__RESTRICT io, int64_t cnt) {
    int64_t ox;
    for (ox = 0; ox < cnt; ox++) {
        int32_t at = i0 + 2 * (int32_t)ox, bi = at;
        float best = r0[2 * ox], v0 = r0[2 * ox + 1], v1 = r1[2 * ox], v2 = r1[2 * ox + 1];
        bi = !(v0 <= best) && best == best ? at + 1 : bi;
        best = !(v0 <= best) && best == best ? v0 : best;
        bi = !(v1 <= best) && best == best ? at + (int32_t)w : bi;
        best = !(v1 <= best) && best == best ? v1 : best;
        bi = !(v2 <= best) && best == best ? at + (int32_t)w + 1 : bi;
        best = !(v2 <= best) && best == best ? v2 : best;
        yo[ox] = best;
        io[ox] = bi;
    }
}
static void dt__maxpool_fwd(const dt__kernel *k, const dt_conv_geom *g, const float *x, float *y, int32_t *idx) {
    int64_t nc;
    if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0) {
        /* 2 x 2, stride 2: every window inside, a row at a time (the tier's kernel 16 outputs a step) */
        void (*row)(const float *, const float *, int64_t, int32_t, float *, int32_t *, int) = k ? k->maxpool2 : NULL;
        DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * 4 > DT__PAR_MIN))
        for (nc = 0; nc < g->n * g->c; nc++) {
            int64_t oy, ox, w = g->w;
            for (oy = 0; oy < g->oh; oy++) {
                const float *r0 = x + nc * g->h * w + 2 * oy * w, *r1 = r0 + w;
                float *yo = y + (nc * g->oh + oy) * g->ow;
                int32_t *io = idx + (nc * g->oh + oy) * g->ow, i0 = (int32_t)(2 * oy * w);
                ox = 0;
                if (row)   /* 16 outputs a step, the last step of fewer */
                    for (; ox < g->ow; ox += 16)
                        row(r0 + 2 * ox, r1 + 2 * ox, w, i0 + 2 * (int32_t)ox, yo + ox, io + ox, g->ow - ox < 16 ? (int)(g->ow - ox) : 16);
                if (ox < g->ow) dt__maxpool2_row(r0 + 2 * ox, r1 + 2 * ox, w, i0 + 2 * (int32_t)ox, yo + ox, io + ox, g->ow - ox);
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
                    best = dt_body_maxpool_window(g, xp, oy, ox, &bi);   /* at the border: checked taps */
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
            for (ox = 0; ox < g->ow; ox++) y[(nc * g->oh + oy) * g->ow + ox] = dt_body_avgpool_window(g, xp, oy, ox);
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
    for (i = 0; i < n; i++) y[i] = dt_body_relu(x[i]);
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
        mask[i] = dt_body_hash_uniform(key, (uint64_t)i) >= p ? keep : 0.0f;
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
/* dt__bn_sums's 8 lanes over one row's whole 8s: a[j] += p[k], b[j] += p[k] q[k] for k % 8 == j, in order
   of k (p[k] as 0 where r is not NULL and r[k] is not > 0); returns the floats done. Vector types where
   there are (DT__VEC): a pair of 4 lanes for each sum, the mask by a compare, each lane's adds in the order
   of the loop below; so the same bits. The loop alone is not vectorised by gcc (the test of r is a branch
   in it, and without it gcc's lanes stay in memory). */
static int64_t dt__bn_lanes(const float *DT__RESTRICT p, const float *DT__RESTRICT q, const float *DT__RESTRICT r, int64_t s,
                            double *DT__RESTRICT a, double *DT__RESTRICT b) {
    int64_t k;
#if DT__VEC
    const dt__v4 z = {0.0f, 0.0f, 0.0f, 0.0f};
    dt__v4d a0, a1, b0, b1;
    memcpy(&a0, a, sizeof a0); memcpy(&a1, a + 4, sizeof a1); memcpy(&b0, b, sizeof b0); memcpy(&b1, b + 4, sizeof b1);
    for (k = 0; k + 8 <= s; k += 8) {
        dt__v4 x0 = dt__v4_load(p + k), x1 = dt__v4_load(p + k + 4);
        dt__v4d d0, d1;
        if (r) {   /* the same for every k: gcc takes it out of the loop */
            x0 = (dt__v4)((dt__v4i)x0 & (dt__v4_load(r + k) > z));
            x1 = (dt__v4)((dt__v4i)x1 & (dt__v4_load(r + k + 4) > z));
        }
        d0 = __builtin_convertvector(x0, dt__v4d);
        d1 = __builtin_convertvector(x1, dt__v4d);
        a0 += d0; a1 += d1;
        b0 += d0 * __builtin_convertvector(dt__v4_load(q + k), dt__v4d);
        b1 += d1 * __builtin_convertvector(dt__v4_load(q + k + 4), dt__v4d);
    }
    memcpy(a, &a0, sizeof a0); memcpy(a + 4, &a1, sizeof a1); memcpy(b, &b0, sizeof b0); memcpy(b + 4, &b1, sizeof b1);
#else
    int j;
    for (k = 0; k + 8 <= s; k += 8)
        for (j = 0; j < 8; j++) {
            double pv = r && !(r[k + j] > 0.0f) ? 0.0 : (double)p[k + j];
            a[j] += pv;
            b[j] += pv * (double)q[k + j];
        }
#endif
    return k;
}
static void dt__bn_sums(const dt__kernel *kt, const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s,
                        double *sx, double *sxy) {
    double a[16] = {0}, b[16] = {0};
    int64_t i, k;
    int j, w;
    if (kt && kt->bn_sums) {   /* a faster twin: its vector lanes in a[8..15], b[8..15], added to the 8 here */
        kt->bn_sums(x, y, mk, n, cs, s, a, b);
        for (j = 0; j < 8; j++) { a[j] += a[j + 8]; b[j] += b[j + 8]; }
        n = 0;
    }
    for (i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = (y ? y : x) + i * cs, *r = mk ? mk + i * cs : NULL;
        k = dt__bn_lanes(p, q, r, s, a, b);
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
static void dt__bn_fwd(const dt__kernel *kt, int training, int relu, const float *x, const float *res, float *y, int64_t n, int64_t c, int64_t s,
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
            dt__bn_sums(kt, x + ch * s, NULL, NULL, n, c * s, s, &sum, &sq);
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
                    yp[k] = dt_body_relu(v);
                }
            else if (relu)
                for (k = 0; k < s; k++) {
                    float v = xp[k] * g + b;
                    yp[k] = dt_body_relu(v);
                }
            else
                for (k = 0; k < s; k++) yp[k] = xp[k] * g + b;
        }
    }
}
/* batch norm's backward pass for the gradient dy of its output, or (y not NULL) of y = max(0, its output
   [+ a residual]); dx += (acc 1) or = (acc 0); dr (not NULL: the residual's gradient) += (acc_r 1) or =
   dy where y > 0 */
static void dt__bn_bwd(const dt__kernel *kt, int training, const float *x, const float *y, const float *dy, float *dx, int acc, float *dr, int acc_r,
                       int64_t n, int64_t c, int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                       float *dgamma, float *dbeta) {
    int64_t ch;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {
        int64_t i, k, cnt = n * s;
        double sdy, sdyx;
        float mean = save_mean[ch], invstd = save_invstd[ch];
        dt__bn_sums(kt, dy + ch * s, x + ch * s, y ? y + ch * s : NULL, n, c * s, s, &sdy, &sdyx);
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
static void dt__cpu_add_relu_fwd(void *ctx, float *y, const float *a, const float *b, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        y[i] = dt_body_relu(a[i] + b[i]);
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
    for (r = 0; r < n; r++) dt_body_log_softmax_row(x + r * k, y + r * k, k);
}
static void dt__cpu_log_softmax_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n, int64_t k) {
    int64_t r;
    (void)ctx;
    DT__OMP(parallel for if (n * k > DT__PAR_MIN))
    for (r = 0; r < n; r++) dt_body_log_softmax_row_bwd(y + r * k, dy + r * k, dx + r * k, k);
}
/* Losses run on one thread: their cost is O(n k), tiny next to any layer, and a fixed order keeps the
   loss bit-reproducible. Labels were checked by the caller. */
static void dt__cpu_softmax_xent(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, float *dx,
                                 float *loss) {
    int64_t r;
    double total = 0.0;
    (void)ctx;
    for (r = 0; r < n; r++) total += dt_body_softmax_xent_row(x + r * k, labels[r], k, n, dx + r * k);
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
    for (r = 0; r < n; r++) c += dt_body_argmax_row(x + r * k, k) == labels[r];
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
    for (i = 0; i < n; i++) dt_body_sgd_update(p, g, buf, i, lr, momentum, dampening, wd, nesterov, first);
}
static void dt__cpu_adam_step(void *ctx, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) dt_body_adam_update(p, g, m, v, i, lr, beta1, beta2, eps, wd, decoupled, step_size, bc2_sqrt);
}


#ifdef __cplusplus
}
#endif
#endif /* the implementation */
