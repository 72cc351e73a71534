/* dtrain/core/pass.h - a model's forward and backward passes, layer by layer, and its losses.   Part of
   dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The bodies of the passes that dtrain/core/nn.h declares: the plan of a pass (which ReLUs run inside the
     batch norm or residual add before them, which gradients are written instead of added) and its activation
     arena, each layer's forward and backward written once against the dt_ops table, batch norm alone or
     synchronised over the ranks (dt_model_set_bn_sync), dt_model_forward, the losses, dt_model_backward with
     its per-node hook (dt_ddp's buckets). No declarations of its own: a model's whole API is nn.h's.
   USES
     dtrain/core/nn.h, and of its implementation the model's graph that dtrain/core/internal.h shares with this
     file alone (struct dt_model, dt__node), and what it includes.
   READ FIRST
     dt__node_fwd and dt__node_bwd (every layer's two passes in one place), dt_model_forward /
     dt_model_backward, dt__plan.
*/
#ifndef DTRAIN_PASS_H
#define DTRAIN_PASS_H
#include "nn.h"
#endif /* DTRAIN_PASS_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_PASS_IMPLEMENTATION_DONE)
#define DTRAIN_PASS_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../cpu/kernel.h"
#include "internal.h"

/* ---- the plan of a pass and its activation arena ----------------------------------------------------------- */

static int dt__fuse_off;   /* 1: plan nothing: no fusion, every gradient zeroed and added to (the tests compare) */
#ifdef DT__TEST_HOOKS   /* the test programs' handles (tests/dt_test_hooks.h; compiled in by tests/impl_test.c) */
int *dt__test_fuse_off(void);
int *dt__test_fuse_off(void) { return &dt__fuse_off; }
#endif

/* the node whose gradient buffer node i's is (flatten shares its input's) */
static int dt__owner(const dt_model *m, int i) {
    while (m->nodes[i].alias) i = m->nodes[i].in0;
    return i;
}
/* the node that alone reads node i's output (0: none, or several) */
static int dt__only_reader(const dt_model *m, int i) {
    int j, readers = 0, r = 0;
    for (j = i + 1; j < m->nnodes; j++) {
        if (m->nodes[j].in0 == i) { readers++; r = j; }
        if (m->nodes[j].in1 == i) { readers++; r = j; }
    }
    return readers == 1 ? r : 0;
}
/* the residual input of add node a whose other input is the batch norm (a->bn) */
static int dt__residual(const dt__node *a) { return a->in0 == a->bn ? a->in1 : a->in0; }
/* Plans the passes from the graph and the backend's ops. A ReLU whose input only it reads runs inside the
   batch norm or add before it (that node's output and gradient are then never stored); so does a batch
   norm whose only reader is a residual add whose only reader is a ReLU: the add runs all three (when the
   residual is computed after the batch norm, only the add has both); an add runs one batch norm, the first
   (with a batch norm on both inputs, a projection shortcut's, the other runs as itself). An activation gradient's first writer
   in the backward pass (its reader with the highest index) writes it rather than adding to it when its op
   can; the others are zeroed before the pass. */
static void dt__plan(dt_model *m) {
    const dt_ops *O = m->ops;
    int i, j, slot, last = m->nnodes - 1, bnr = O->bn_relu_fwd && O->bn_relu_bwd, addr = O->add_relu_fwd && O->add_relu_bwd;
    for (i = 0; i < m->nnodes; i++) {
        dt__node *n = &m->nodes[i];
        n->relu = 0; n->bn = 0; n->folded = 0; n->zero = 2; n->ow[0] = n->ow[1] = 0;   /* zero 2: no writer seen yet */
    }
    for (i = 1; i < last && !dt__fuse_off; i++) {
        dt__node *n = &m->nodes[i], *a;
        int r = dt__only_reader(m, i), rr;
        if (!r || n->folded) continue;
        if (n->kind == DT_LAYER_BATCHNORM && bnr && m->nodes[r].kind == DT_LAYER_RELU) {
            n->relu = r; m->nodes[r].folded = 1;
        } else if (n->kind == DT_LAYER_BATCHNORM && bnr && (a = &m->nodes[r])->kind == DT_LAYER_ADD && !a->bn && a->in0 != a->in1 &&
                   (a->in0 == i ? a->in1 : a->in0) != n->in0 && (rr = dt__only_reader(m, r)) && m->nodes[rr].kind == DT_LAYER_RELU) {
            n->relu = rr; n->folded = 1; a->bn = i; a->relu = rr; m->nodes[rr].folded = 1;
        } else if (n->kind == DT_LAYER_ADD && addr && !n->bn && n->in0 != n->in1 && m->nodes[r].kind == DT_LAYER_RELU) {
            n->relu = r; m->nodes[r].folded = 1;
        }
    }
    m->nodes[dt__owner(m, last)].zero = 0;   /* the loss gradient is copied in */
    for (j = last; j >= 1; j--) {
        dt__node *n = &m->nodes[j];
        if (n->alias || n->folded) continue;   /* writes no gradient */
        for (slot = 0; slot < 2; slot++) {
            /* an add that runs a batch norm writes the batch norm's input's gradient and the residual's */
            int in = n->bn ? (slot ? dt__residual(n) : m->nodes[n->bn].in0) : (slot ? n->in1 : n->in0);
            dt__node *o;
            if (in < 0 || (o = &m->nodes[dt__owner(m, in)])->zero != 2) continue;
            n->ow[slot] = !dt__fuse_off && (n->kind == DT_LAYER_ADD || n->kind == DT_LAYER_LINEAR ||
                                            (n->kind == DT_LAYER_BATCHNORM && n->relu) || (n->kind == DT_LAYER_CONV2D && O->conv_bwd));
            o->zero = !n->ow[slot];
        }
    }
    for (i = 0; i < m->nnodes; i++)
        if (m->nodes[i].zero == 2) m->nodes[i].zero = 1;
}

/* Sizes and places the activation arena for `batch` samples. Allocation happens only when the batch
   grows past the largest one seen, so a steady training loop never allocates. */
static dt_result dt__reserve(dt_model *m, int64_t batch) {
    int64_t total = 0, itotal = 0, ws = 0, outsz, bx = 0, bdy = 0;
    int i;
    dt_result r;
    float *a;
    int32_t *ia;
    if (batch <= m->cap_batch) return DT_OK;
    if (!m->cap_batch) dt__plan(m);
    outsz = m->nodes[m->nnodes - 1].size;
    for (i = 0; i < m->nnodes; i++) {
        const dt__node *n = &m->nodes[i];
        if (!n->alias && !n->relu) total += 2 * batch * n->size;
        if (n->kind == DT_LAYER_DROPOUT) total += batch * n->size;
        if (n->kind == DT_LAYER_BATCHNORM) total += 2 * n->c;
        if (n->kind == DT_LAYER_MAXPOOL2D) itotal += batch * n->size;
        if (m->bf16 && (n->kind == DT_LAYER_CONV2D || n->kind == DT_LAYER_LINEAR)) {   /* its rounded operands */
            if (batch * m->nodes[n->in0].size > bx) bx = batch * m->nodes[n->in0].size;
            if (batch * n->size > bdy) bdy = batch * n->size;
        }
        if (n->kind == DT_LAYER_CONV2D) {
            /* workspace: col [c kh kw, nb s] + t [oc, nb s] for a chunk of nb images */
            dt_conv_geom g = dt__geom(m, n, batch);
            int64_t per = (g.c * g.kh * g.kw + g.oc) * g.oh * g.ow;
            int64_t nb = DT_CONV_WORKSPACE / per;
            if (nb < 1) nb = 1;
            if (nb > batch) nb = batch;
            if (nb * per > ws) ws = nb * per;
            if (m->ctx == &m->cpu && dt__tap_ws(&g) > ws) ws = dt__tap_ws(&g);   /* the CPU's convolution by taps */
        }
    }
    total += ws + batch * outsz + (m->bf16 ? m->nparams + bx + bdy : 0);
    if (m->ctx == &m->cpu) total += dt__gemm_ws_count(dt__cpu_threads_most());
    itotal += batch;
    if (m->ctx == &m->cpu &&
        (r = dt__fits_memory(4.0 * (double)(total + itotal), "dt_model_forward", "the activations of the batch",
                             "use a smaller batch")) != DT_OK) return r;
    a = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * total);
    ia = (int32_t *)m->ops->alloc(m->ctx, (int64_t)sizeof(int32_t) * itotal);
    if (!a || !ia) {
        if (a) m->ops->free(m->ctx, a);
        if (ia) m->ops->free(m->ctx, ia);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_forward: no memory for the activations of a batch of %lld "
                            "(%lld floats); use a smaller batch", (long long)batch, (long long)total);
    }
    dt__free_arena(m);
    m->arena = a;
    m->iarena = ia;
    m->cap_batch = batch;
    for (i = 0; i < m->nnodes; i++) {
        dt__node *n = &m->nodes[i];
        if (n->alias) { n->out = m->nodes[n->in0].out; n->grad = m->nodes[n->in0].grad; }
        else if (n->relu) n->out = n->grad = NULL;
        else { n->out = a; a += batch * n->size; n->grad = a; a += batch * n->size; }
        if (i == 0 && !m->input_grad) n->grad = NULL;
        n->aux = NULL; n->idx = NULL;
        if (n->kind == DT_LAYER_DROPOUT) { n->aux = a; a += batch * n->size; }
        if (n->kind == DT_LAYER_BATCHNORM) { n->aux = a; a += 2 * n->c; }
        if (n->kind == DT_LAYER_MAXPOOL2D) { n->idx = ia; ia += batch * n->size; }
    }
    m->ws = a; m->ws_count = ws; a += ws;
    if (m->ctx == &m->cpu) {
        m->cpu.conv_ws = m->ws;
        m->cpu.conv_ws_count = ws;
        m->cpu.gemm_ws = a;
        m->cpu.gemm_ws_count = dt__gemm_ws_count(dt__cpu_threads_most());
        a += m->cpu.gemm_ws_count;
    }
    m->seed_grad = a;
    a += batch * outsz;
    m->bf16_w = m->bf16_x = m->bf16_dy = NULL;
    if (m->bf16) { m->bf16_w = a; m->bf16_x = a + m->nparams; m->bf16_dy = m->bf16_x + bx; }
    m->labels = ia;
    return DT_OK;
}

/* ---- forward and backward of each layer --------------------------------------------------------- */

static float *dt__pv(dt_model *m, const dt__node *n, int j) { return m->params + m->pinfo[n->param0 + j].offset; }
static float *dt__gv(dt_model *m, const dt__node *n, int j) { return m->grads + m->pinfo[n->param0 + j].offset; }
static float *dt__bv(dt_model *m, const dt__node *n, int j) { return m->buffers + m->binfo[n->buf0 + j].offset; }

/* The operands of a convolution or linear layer n in the model's precision: its weights (bf16: their copy rounded
   at this forward pass) and its input x of cnt floats (bf16: rounded into the model's buffer, which the next such
   layer overwrites) */
static const float *dt__wv(dt_model *m, const dt__node *n) {
    return m->bf16 ? m->bf16_w + m->pinfo[n->param0].offset : dt__pv(m, n, 0);
}
static const float *dt__operand(dt_model *m, const float *x, int64_t cnt, float *buf) {
    if (!m->bf16) return x;
    dt__round_bf16(buf, x, cnt);
    return buf;
}
/* bf16: every convolution's and linear layer's weights rounded into the copy the pass reads (biases stay float) */
static void dt__round_weights(dt_model *m) {
    int i;
    for (i = 1; i < m->nnodes && m->bf16; i++) {
        const dt__node *n = &m->nodes[i];
        const dt__pinfo *w = &m->pinfo[n->param0];
        if (n->kind == DT_LAYER_CONV2D || n->kind == DT_LAYER_LINEAR) dt__round_bf16(m->bf16_w + w->offset, m->params + w->offset, w->count);
    }
}

/* Convolution as im2col + one GEMM per chunk of images:  t [oc, nb*s] = W [oc, c*kh*kw] col [c*kh*kw, nb*s] */
static void dt__conv_fwd(dt_model *m, const dt__node *n, int64_t batch) {
    const dt_ops *O = m->ops;
    dt_conv_geom g = dt__geom(m, n, batch);
    int64_t ckk = g.c * g.kh * g.kw, S = g.oh * g.ow, per = (ckk + g.oc) * S, nb = m->ws_count / per, i0;
    const float *x = dt__operand(m, m->nodes[n->in0].out, batch * g.c * g.h * g.w, m->bf16_x), *W = dt__wv(m, n);
    const float *b = n->has_bias ? dt__pv(m, n, 1) : NULL;
    if (O->conv_fwd && O->conv_fwd(m->ctx, &g, x, W, b, n->out)) return;
    if (nb < 1) nb = 1;
    for (i0 = 0; i0 < batch; i0 += nb) {
        dt_conv_geom gc = g;
        float *col = m->ws, *t;
        gc.n = batch - i0 < nb ? batch - i0 : nb;
        t = col + ckk * gc.n * S;
        if (O->conv_gemm_fwd) O->conv_gemm_fwd(m->ctx, &gc, x + i0 * g.c * g.h * g.w, W, t);
        else {
            O->im2col(m->ctx, &gc, x + i0 * g.c * g.h * g.w, col);
            O->gemm(m->ctx, 0, 0, g.oc, gc.n * S, ckk, 1.0f, W, ckk, col, gc.n * S, 0.0f, t, gc.n * S);
        }
        O->cs_to_ncs(m->ctx, n->out + i0 * g.oc * S, t, b, gc.n, g.oc, S);
    }
}
/* dW += t col^T;  db += sum dy;  dcol = W^T t, dx += col2im(dcol)   with t = dy as [oc, nb*s] */
static void dt__conv_bwd(dt_model *m, const dt__node *n, int64_t batch, float *dx) {
    const dt_ops *O = m->ops;
    dt_conv_geom g = dt__geom(m, n, batch);
    int64_t ckk = g.c * g.kh * g.kw, S = g.oh * g.ow, per = (ckk + g.oc) * S, nb = m->ws_count / per, i0;
    const float *x = dt__operand(m, m->nodes[n->in0].out, batch * g.c * g.h * g.w, m->bf16_x), *W = dt__wv(m, n);
    const float *dy = dt__operand(m, n->grad, batch * g.oc * S, m->bf16_dy);   /* (the bias's sum takes the float one) */
    float *dW = dt__gv(m, n, 0);
    int done = 0;   /* conv_bwd: 1 all done, 2 dW done */
    if (nb < 1) nb = 1;
    if (n->has_bias) O->channel_sum_bwd(m->ctx, dt__gv(m, n, 1), n->grad, batch, g.oc, S);
    if (O->conv_bwd && (done = O->conv_bwd(m->ctx, &g, x, W, dy, dW, dx, !n->ow[0])) == 1) return;
    if (dx && n->ow[0]) O->fill(m->ctx, dx, batch * g.c * g.h * g.w, 0.0f);   /* the steps below add to it */
    for (i0 = 0; i0 < batch; i0 += nb) {
        dt_conv_geom gc = g;
        float *col = m->ws, *t;
        gc.n = batch - i0 < nb ? batch - i0 : nb;
        t = col + ckk * gc.n * S;
        O->ncs_to_cs(m->ctx, t, dy + i0 * g.oc * S, gc.n, g.oc, S);
        if (done == 2) {}   /* conv_bwd wrote dW */
        else if (O->conv_gemm_wgrad) O->conv_gemm_wgrad(m->ctx, &gc, x + i0 * g.c * g.h * g.w, t, dW);
        else {
            O->im2col(m->ctx, &gc, x + i0 * g.c * g.h * g.w, col);
            O->gemm(m->ctx, 0, 1, g.oc, ckk, gc.n * S, 1.0f, t, gc.n * S, col, gc.n * S, 1.0f, dW, ckk);
        }
        if (dx && !(O->conv_gemm_dgrad && O->conv_gemm_dgrad(m->ctx, &gc, W, dy + i0 * g.oc * S, dx + i0 * g.c * g.h * g.w,
                                                            col, ckk * gc.n * S))) {
            O->gemm(m->ctx, 1, 0, ckk, gc.n * S, g.oc, 1.0f, W, ckk, t, gc.n * S, 0.0f, col, gc.n * S);
            O->col2im_bwd(m->ctx, &gc, col, dx + i0 * g.c * g.h * g.w);
        }
    }
}

/* ---- batch norm, alone or synchronised over the ranks (dt_model_set_bn_sync) ---------------------------------
   Synchronised, in training mode, the layer runs as in eval mode on statistics the ranks share: forward sums x
   and x^2 per channel (dt_ops.bn_sums), has them summed over the ranks with the count of values, and normalises
   with the whole batch's mean and biased variance, moving the running statistics by the whole batch's mean and
   unbiased variance (as the batch-statistics path does with its own); backward runs eval mode's gradient,
   gamma invstd dy, then adds the part through the statistics, gamma invstd (-mean(dy) - xhat mean(dy xhat)),
   with the means taken over the whole batch (dt_ops.bn_affine_acc). Each rank's gradient is a mean over its
   own batch of n, which the samples-weighted sum of the gradients (dt_ddp) weighs by n / N: so each rank sends
   its sums of dy and dy xhat times n, and takes their total over n N s (N s the values per channel of all), the
   whole batch's means as this rank's scale sees them. With equal batches that is PyTorch's SyncBatchNorm. */
static void dt__sync_fail(dt_model *m, dt_result r) { if (m->sync_err == DT_OK) m->sync_err = r; }

static void dt__bn_run_fwd(dt_model *m, dt__node *b, const float *x, const float *res, float *y, int relu, int64_t batch) {
    const dt_ops *O = m->ops;
    void *C = m->ctx;
    int64_t c = b->c, s = b->h * b->w, ch;
    float *rm = dt__bv(m, b, 0), *rv = dt__bv(m, b, 1), *st;
    double *sum = m->sync_sum, cnt;
    if (!m->training || !m->sync_fn) {
        if (relu) O->bn_relu_fwd(C, m->training, x, res, y, batch, c, s, dt__pv(m, b, 0), dt__pv(m, b, 1), rm, rv, b->eps, b->momentum,
                                 b->aux, b->aux + c);
        else O->bn_fwd(C, m->training, x, y, batch, c, s, dt__pv(m, b, 0), dt__pv(m, b, 1), rm, rv, b->eps, b->momentum, b->aux,
                       b->aux + c);
        return;
    }
    st = m->sync_stat + b->sync_at;
    O->bn_sums(C, x, NULL, NULL, batch, c, s, sum);
    for (ch = 0; ch < 2 * c; ch++) sum[ch] *= m->sync_weight;
    sum[2 * c] = m->sync_weight ? (double)(batch * s) : 0.0;
    if (m->sync_err == DT_OK) {
        dt_trace_begin("sync batch norm", "comm");
        dt__sync_fail(m, m->sync_fn(m->sync_user, sum, 2 * c + 1));
        dt_trace_end();
    }
    cnt = m->sync_err == DT_OK ? sum[2 * c] : 0.0;
    b->sync_count = cnt;
    if (cnt > 0.0) {   /* the whole batch's mean and variance (host: mean, variance, unbiased variance) */
        float *h = m->sync_host;
        for (ch = 0; ch < c; ch++) {
            double dm = sum[ch] / cnt, sq = sum[c + ch] - dm * sum[ch], var;
            if (sq < 0.0) sq = 0.0;
            var = sq / cnt;
            h[ch] = (float)dm;
            h[c + ch] = (float)var;
            h[2 * c + ch] = (float)(cnt > 1.0 ? sq / (cnt - 1.0) : var);
            st[ch] = (float)dm;
            st[c + ch] = (float)(1.0 / sqrt(var + (double)b->eps));
        }
        O->upload(C, m->sync_dev, h, (int64_t)sizeof(float) * 3 * c);
        O->scale(C, rm, c, 1.0f - b->momentum);
        O->axpy(C, rm, m->sync_dev, c, b->momentum);
        O->scale(C, rv, c, 1.0f - b->momentum);
        O->axpy(C, rv, m->sync_dev + 2 * c, c, b->momentum);
    } else {   /* no rank had data (all have joined), or the sum failed: the running statistics, untouched */
        O->download(C, st, rm, (int64_t)sizeof(float) * c);
        O->download(C, m->sync_host, rv, (int64_t)sizeof(float) * c);
        for (ch = 0; ch < c; ch++) st[c + ch] = 1.0f / sqrtf(m->sync_host[ch] + b->eps);
        O->copy(C, m->sync_dev, rm, c);
        O->copy(C, m->sync_dev + c, rv, c);
    }
    if (relu) O->bn_relu_fwd(C, 0, x, res, y, batch, c, s, dt__pv(m, b, 0), dt__pv(m, b, 1), m->sync_dev, m->sync_dev + c, b->eps,
                             b->momentum, b->aux, b->aux + c);
    else O->bn_fwd(C, 0, x, y, batch, c, s, dt__pv(m, b, 0), dt__pv(m, b, 1), m->sync_dev, m->sync_dev + c, b->eps, b->momentum,
                   b->aux, b->aux + c);
}

/* y: a fused ReLU's output (NULL: none), dy the gradient of the layer's output or of that ReLU's */
static void dt__bn_run_bwd(dt_model *m, dt__node *b, const float *x, const float *y, const float *dy, float *dx, int acc, float *dr,
                           int acc_r, int64_t batch) {
    const dt_ops *O = m->ops;
    void *C = m->ctx;
    int64_t c = b->c, s = b->h * b->w, ch;
    int sync = m->training && m->sync_fn;
    const float *st;
    double *sum = m->sync_sum, w = (double)m->sync_weight * (double)batch, per;
    float *h = m->sync_host;
    if (y) O->bn_relu_bwd(C, m->training && !sync, x, y, dy, dx, acc, dr, acc_r, batch, c, s, dt__pv(m, b, 0), b->aux, b->aux + c,
                          dt__gv(m, b, 0), dt__gv(m, b, 1));
    else O->bn_bwd(C, m->training && !sync, x, dy, dx, batch, c, s, dt__pv(m, b, 0), b->aux, b->aux + c, dt__gv(m, b, 0),
                   dt__gv(m, b, 1));
    if (!sync || !dx) return;
    st = m->sync_stat + b->sync_at;
    O->bn_sums(C, x, y, dy, batch, c, s, sum);   /* sum dy', sum dy' x */
    for (ch = 0; ch < c; ch++) {   /* weighted by this rank's batch; dy' xhat = dy' (x - mean) invstd */
        sum[c + ch] = w * (sum[c + ch] - (double)st[ch] * sum[ch]) * (double)st[c + ch];
        sum[ch] *= w;
    }
    if (m->sync_err == DT_OK) {
        dt_trace_begin("sync batch norm", "comm");
        dt__sync_fail(m, m->sync_fn(m->sync_user, sum, 2 * c));
        dt_trace_end();
    }
    per = b->sync_count > 0.0 && m->sync_err == DT_OK ? 1.0 / ((double)batch * b->sync_count) : 0.0;
    for (ch = 0; ch < c; ch++) {   /* dx += gamma (a x + b): a = -invstd^2 mean(dy xhat), b = -invstd mean(dy) - a mean */
        double is = (double)st[c + ch], mdy = sum[ch] * per, mdyx = sum[c + ch] * per, a = -is * is * mdyx;
        h[ch] = (float)a;
        h[c + ch] = (float)(-is * mdy - a * (double)st[ch]);
    }
    O->upload(C, m->sync_dev, h, (int64_t)sizeof(float) * 2 * c);
    O->bn_affine_acc(C, dx, x, dt__pv(m, b, 0), m->sync_dev, m->sync_dev + c, batch, c, s);
}

dt_result dt_model_set_bn_sync(dt_model *m, dt_bn_sync_fn fn, void *user) {
    int64_t maxc = 0, at = 0;
    int i;
    dt_result r;
    if ((r = dt__need_final(m, "dt_model_set_bn_sync")) != DT_OK) return r;
    if (fn && (!m->ops->bn_sums || !m->ops->bn_affine_acc))
        return dt_set_error(DT_ERR_UNSUPPORTED, "dt_model_set_bn_sync: the %s backend has no synchronised batch norm "
                            "(dt_ops.bn_sums); run the model on the CPU, or train without it", m->ops->name);
    for (i = 1; i < m->nnodes; i++)
        if (m->nodes[i].kind == DT_LAYER_BATCHNORM) {
            m->nodes[i].sync_at = at;
            at += 2 * m->nodes[i].c;
            if (m->nodes[i].c > maxc) maxc = m->nodes[i].c;
        }
    if (fn && maxc && !m->sync_sum) {
        m->sync_sum = (double *)DT_MALLOC(sizeof(double) * (size_t)(2 * maxc + 1));
        m->sync_stat = (float *)DT_MALLOC(sizeof(float) * (size_t)at);
        m->sync_host = (float *)DT_MALLOC(sizeof(float) * (size_t)(3 * maxc));
        m->sync_dev = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * 3 * maxc);
        if (!m->sync_sum || !m->sync_stat || !m->sync_host || !m->sync_dev) {
            if (m->sync_dev) m->ops->free(m->ctx, m->sync_dev);
            DT_FREE(m->sync_sum); DT_FREE(m->sync_stat); DT_FREE(m->sync_host);
            m->sync_sum = NULL; m->sync_stat = m->sync_host = m->sync_dev = NULL;
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_set_bn_sync: no memory for the statistics of %lld channels",
                                (long long)at);
        }
    }
    m->sync_fn = maxc ? fn : NULL;   /* a model without batch norm has nothing to synchronise */
    m->sync_user = m->sync_fn ? user : NULL;
    return DT_OK;
}

static void dt__node_fwd(dt_model *m, dt__node *n, int64_t batch) {
    const dt_ops *O = m->ops;
    void *C = m->ctx;
    const dt__node *in = &m->nodes[n->in0 < 0 ? 0 : n->in0];
    const float *x = in->out;
    int64_t cnt = batch * n->size;
    switch (n->kind) {
    case DT_LAYER_INPUT: case DT_LAYER_FLATTEN: break;
    case DT_LAYER_LINEAR:      /* y [b, out] = x [b, in] W^T [in, out] + bias */
        O->gemm(C, 0, 1, batch, n->c, in->size, 1.0f, dt__operand(m, x, batch * in->size, m->bf16_x), in->size, dt__wv(m, n), in->size,
                0.0f, n->out, n->c);
        if (n->has_bias) O->add_row_bias(C, n->out, dt__pv(m, n, 1), batch, n->c);
        break;
    case DT_LAYER_CONV2D: dt__conv_fwd(m, n, batch); break;
    case DT_LAYER_MAXPOOL2D: { dt_conv_geom g = dt__geom(m, n, batch); O->maxpool_fwd(C, &g, x, n->out, n->idx); } break;
    case DT_LAYER_AVGPOOL2D: { dt_conv_geom g = dt__geom(m, n, batch); O->avgpool_fwd(C, &g, x, n->out); } break;
    case DT_LAYER_GLOBAL_AVGPOOL: O->gap_fwd(C, x, n->out, batch, in->c, in->h * in->w); break;
    case DT_LAYER_RELU: if (!n->folded) O->relu_fwd(C, x, n->out, cnt); break;
    case DT_LAYER_DROPOUT:
        if (m->training && n->p > 0.0f) {
            uint64_t key = dt__mix64(m->seed ^ dt__mix64(m->stream * 0x100000001b3ULL + (uint64_t)(n - m->nodes)) ^
                                     (m->step * 0x9e3779b97f4a7c15ULL));
            O->dropout_fwd(C, x, n->out, n->aux, cnt, n->p, key);
        } else {
            O->copy(C, n->out, x, cnt);
            O->fill(C, n->aux, cnt, 1.0f);
        }
        break;
    case DT_LAYER_BATCHNORM:
        if (n->folded) break;   /* the add after it runs it */
        dt__bn_run_fwd(m, n, x, NULL, n->relu ? m->nodes[n->relu].out : n->out, n->relu != 0, batch);
        break;
    case DT_LAYER_ADD:
        if (n->bn) {   /* relu(bn(x) + residual) */
            dt__node *b = &m->nodes[n->bn];
            dt__bn_run_fwd(m, b, m->nodes[b->in0].out, m->nodes[dt__residual(n)].out, m->nodes[n->relu].out, 1, batch);
        } else if (n->relu) O->add_relu_fwd(C, m->nodes[n->relu].out, x, m->nodes[n->in1].out, cnt);
        else O->add(C, n->out, x, m->nodes[n->in1].out, cnt);
        break;
    case DT_LAYER_PAD_SHORTCUT: O->pad_shortcut_fwd(C, x, n->out, batch, in->c, in->h, in->w, n->c, n->sh); break;
    case DT_LAYER_LOG_SOFTMAX: O->log_softmax_fwd(C, x, n->out, batch, n->c); break;
    default: break;
    }
}

static void dt__node_bwd(dt_model *m, dt__node *n, int64_t batch) {
    const dt_ops *O = m->ops;
    void *C = m->ctx;
    dt__node *in = &m->nodes[n->in0 < 0 ? 0 : n->in0];
    float *dx = in->grad;      /* NULL when nobody needs the input's gradient */
    const float *x = in->out, *dy = n->grad;
    const dt__node *r = &m->nodes[n->relu];   /* the ReLU run inside this node, when n->relu */
    int64_t cnt = batch * n->size;
    switch (n->kind) {
    case DT_LAYER_INPUT: case DT_LAYER_FLATTEN: break;
    case DT_LAYER_LINEAR: {    /* dW [out, in] += dy^T x;  db += sum_b dy;  dx [b, in] += dy W */
        const float *dyq = dt__operand(m, dy, batch * n->c, m->bf16_dy);   /* (the bias's sum takes the float dy) */
        O->gemm(C, 1, 0, n->c, in->size, batch, 1.0f, dyq, n->c, dt__operand(m, x, batch * in->size, m->bf16_x), in->size, 1.0f,
                dt__gv(m, n, 0), in->size);
        if (n->has_bias) O->sum_rows_bwd(C, dt__gv(m, n, 1), dy, batch, n->c);
        if (dx) O->gemm(C, 0, 0, batch, in->size, n->c, 1.0f, dyq, n->c, dt__wv(m, n), in->size, n->ow[0] ? 0.0f : 1.0f, dx,
                        in->size);
    } break;
    case DT_LAYER_CONV2D: dt__conv_bwd(m, n, batch, dx); break;
    case DT_LAYER_MAXPOOL2D: if (dx) { dt_conv_geom g = dt__geom(m, n, batch); O->maxpool_bwd(C, &g, dy, n->idx, dx); } break;
    case DT_LAYER_AVGPOOL2D: if (dx) { dt_conv_geom g = dt__geom(m, n, batch); O->avgpool_bwd(C, &g, dy, dx); } break;
    case DT_LAYER_GLOBAL_AVGPOOL: if (dx) O->gap_bwd(C, dy, dx, batch, in->c, in->h * in->w); break;
    case DT_LAYER_RELU: if (dx && !n->folded) O->relu_bwd(C, n->out, dy, dx, cnt); break;
    case DT_LAYER_DROPOUT: if (dx) O->mul_bwd(C, dy, n->aux, dx, cnt); break;
    case DT_LAYER_BATCHNORM:
        if (n->folded) break;   /* the add after it runs it */
        if (n->relu) dt__bn_run_bwd(m, n, x, r->out, r->grad, dx, !n->ow[0], NULL, 0, batch);
        else dt__bn_run_bwd(m, n, x, NULL, dy, dx, 1, NULL, 0, batch);
        break;
    case DT_LAYER_ADD: {
        float *dx1 = m->nodes[n->in1].grad;
        if (n->bn) {   /* relu(bn(x) + residual) */
            dt__node *b = &m->nodes[n->bn];
            dt__bn_run_bwd(m, b, m->nodes[b->in0].out, r->out, r->grad, m->nodes[b->in0].grad, !n->ow[0],
                           m->nodes[dt__residual(n)].grad, !n->ow[1], batch);
            break;
        }
        if (n->relu) { O->add_relu_bwd(C, r->out, r->grad, dx, !n->ow[0], dx1, !n->ow[1], cnt); break; }
        if (dx && n->ow[0]) O->copy(C, dx, dy, cnt);
        else if (dx) O->axpy(C, dx, dy, cnt, 1.0f);
        if (dx1 && n->ow[1]) O->copy(C, dx1, dy, cnt);
        else if (dx1) O->axpy(C, dx1, dy, cnt, 1.0f);
    } break;
    case DT_LAYER_PAD_SHORTCUT: if (dx) O->pad_shortcut_bwd(C, dy, dx, batch, in->c, in->h, in->w, n->c, n->sh); break;
    case DT_LAYER_LOG_SOFTMAX: if (dx) O->log_softmax_bwd(C, n->out, dy, dx, batch, n->c); break;
    default: break;
    }
}

/* ---- passes --------------------------------------------------------------------------------------- */

/* Train-mode batch norm needs more than one value per channel: the variance of one value is 0, so the layer
   would output beta and pass back no gradient (PyTorch refuses too). */
static dt_result dt__bn_batch_check(const dt_model *m, int64_t batch) {
    int i;
    for (i = 1; i < m->nnodes && m->training; i++) {
        const dt__node *n = &m->nodes[i];
        if (n->kind != DT_LAYER_BATCHNORM || batch * n->h * n->w > 1) continue;
        return dt_set_error(DT_ERR_SHAPE, "dt_model_forward: batch norm node %d (%s) in training mode gets 1 value per channel "
                            "(a batch of 1 of [%lld, %lld, %lld]): its batch statistics are undefined; train with batches of "
                            "at least 2 (drop_last in dt_loader_desc drops a last batch of 1), or put the model in eval "
                            "mode (dt_model_set_mode(m, DT_MODE_EVAL))", i, n->name, (long long)n->c, (long long)n->h, (long long)n->w);
    }
    return DT_OK;
}

dt_result dt_model_forward(dt_model *m, const float *x, int64_t batch) {
    dt_result r;
    int i;
    if ((r = dt__need_final(m, "dt_model_forward")) != DT_OK) return r;
    if (!x) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_forward: input x is NULL");
    if (batch <= 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_forward: batch is %lld; it must be > 0", (long long)batch);
    if ((r = dt__bn_batch_check(m, batch)) != DT_OK) return r;
    if ((r = dt__reserve(m, batch)) != DT_OK) return r;
    if (m->ctx == &m->cpu) dt__cpu_adapt();   /* fewer threads while the machine is busy */
    dt_trace_begin("forward", "compute");
    dt__trace_arg("batch", NULL, batch);
    m->ops->upload(m->ctx, m->nodes[0].out, x, (int64_t)sizeof(float) * batch * m->nodes[0].size);
    m->sync_err = DT_OK;
    dt__round_weights(m);
    for (i = 1; i < m->nnodes; i++) dt__node_fwd(m, &m->nodes[i], batch);
    r = dt__sync(m, "dt_model_forward");
    if (m->sync_err != DT_OK) r = m->sync_err;   /* a synchronised batch norm's sum failed, with its message */
    dt_trace_end();
    if (m->training) m->step++;
    m->batch = batch;
    m->seed_ready = 0;
    return r;
}

/* Checks that a loss may run on the output and uploads the labels (when given). */
static dt_result dt__loss_prep(dt_model *m, const int32_t *labels, const float *target, const char *what) {
    const dt__node *out;
    dt_result r;
    int64_t i;
    if ((r = dt__need_final(m, what)) != DT_OK) return r;
    if (!m->batch) return dt_set_error(DT_ERR_STATE, "%s: no forward pass yet; call dt_model_forward first", what);
    out = &m->nodes[m->nnodes - 1];
    if (labels || !target) {
        if (!labels) return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL", what);
        if (out->ndim != 1)
            return dt_set_error(DT_ERR_SHAPE, "%s: the output node (%s) is an image; a classification loss needs a vector of "
                                "class scores: end the model with dt_flatten and dt_linear", what, out->name);
        for (i = 0; i < m->batch; i++)
            if (labels[i] < 0 || labels[i] >= out->c)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: label %d of sample %lld is outside [0, %lld): the labels do not "
                                    "match the model's %lld outputs", what, (int)labels[i], (long long)i, (long long)out->c,
                                    (long long)out->c);
        m->ops->upload(m->ctx, m->labels, labels, (int64_t)sizeof(int32_t) * m->batch);
    }
    return DT_OK;
}

static dt_result dt__loss_done(dt_model *m, float loss, const char *what) {
    m->seed_ready = 1;
    if (!(loss == loss) || loss == INFINITY || loss == -INFINITY)
        return dt_set_error(DT_ERR_NUMERIC, "%s: the loss is %g: the model diverged or the input holds NaN/inf; lower the "
                            "learning rate, check the data, or restore the last checkpoint", what, (double)loss);
    return DT_OK;
}

typedef void (*dt__class_loss_fn)(void *, const float *, const int32_t *, int64_t, int64_t, float *, float *);
static dt_result dt__class_loss(dt_model *m, dt__class_loss_fn fn, const int32_t *labels, float *loss, const char *what) {
    dt_result r = dt__loss_prep(m, labels, NULL, what);
    const dt__node *out;
    float l = 0.0f;
    if (r != DT_OK) return r;
    out = &m->nodes[m->nnodes - 1];
    dt_trace_begin("loss", "compute");
    fn(m->ctx, out->out, m->labels, m->batch, out->c, m->seed_grad, &l);
    r = dt__sync(m, what);   /* inside the span: the span is the backend's time */
    dt_trace_end();
    if (r != DT_OK) return r;
    if (loss) *loss = l;
    return dt__loss_done(m, l, what);
}
dt_result dt_model_loss_cross_entropy(dt_model *m, const int32_t *labels, float *loss) {
    return dt__class_loss(m, m ? m->ops->softmax_xent : NULL, labels, loss, "dt_model_loss_cross_entropy");
}
dt_result dt_model_loss_nll(dt_model *m, const int32_t *labels, float *loss) {
    return dt__class_loss(m, m ? m->ops->nll : NULL, labels, loss, "dt_model_loss_nll");
}
dt_result dt_model_loss_labels(dt_model *m, const int32_t *labels, float *loss) {
    if (m && m->nnodes > 1 && m->nodes[m->nnodes - 1].kind == DT_LAYER_LOG_SOFTMAX) return dt_model_loss_nll(m, labels, loss);
    return dt_model_loss_cross_entropy(m, labels, loss);
}
dt_result dt_model_loss_mse(dt_model *m, const float *target, float *loss) {
    dt_result r;
    int64_t cnt;
    float l = 0.0f;
    if (!target) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_loss_mse: target is NULL");
    if ((r = dt__loss_prep(m, NULL, target, "dt_model_loss_mse")) != DT_OK) return r;
    cnt = m->batch * m->nodes[m->nnodes - 1].size;
    /* the target goes through the gradient buffer, which the kernel then overwrites with d loss/d x */
    dt_trace_begin("loss", "compute");
    m->ops->upload(m->ctx, m->seed_grad, target, (int64_t)sizeof(float) * cnt);
    m->ops->mse(m->ctx, m->nodes[m->nnodes - 1].out, m->seed_grad, cnt, m->seed_grad, &l);
    r = dt__sync(m, "dt_model_loss_mse");
    dt_trace_end();
    if (r != DT_OK) return r;
    if (loss) *loss = l;
    return dt__loss_done(m, l, "dt_model_loss_mse");
}

dt_result dt_model_backward(dt_model *m, const float *dy) {
    dt_result r;
    dt__node *out;
    int i;
    if ((r = dt__need_final(m, "dt_model_backward")) != DT_OK) return r;
    if (!m->batch) return dt_set_error(DT_ERR_STATE, "dt_model_backward: no forward pass yet; call dt_model_forward first");
    if (!dy && !m->seed_ready)
        return dt_set_error(DT_ERR_STATE, "dt_model_backward: no loss gradient; call a dt_model_loss_* function after the "
                            "forward pass, or pass the upstream gradient dy");
    out = &m->nodes[m->nnodes - 1];
    if (!out->grad) return dt_set_error(DT_ERR_STATE, "dt_model_backward: the output is the input itself; add a layer");
    dt_trace_begin("backward", "compute");
    dt__trace_arg("batch", NULL, m->batch);
    for (i = 0; i < m->nnodes; i++)   /* the gradients whose first writer adds to them (dt__plan) */
        if (!m->nodes[i].alias && m->nodes[i].grad && m->nodes[i].zero)
            m->ops->fill(m->ctx, m->nodes[i].grad, m->batch * m->nodes[i].size, 0.0f);
    if (dy) m->ops->upload(m->ctx, out->grad, dy, (int64_t)sizeof(float) * m->batch * out->size);
    else m->ops->copy(m->ctx, out->grad, m->seed_grad, m->batch * out->size);
    m->sync_err = DT_OK;
    for (i = m->nnodes - 1; i >= 1; i--) {
        dt__node_bwd(m, &m->nodes[i], m->batch);
        if (m->hook) {   /* the hook reads the gradients: they must be written */
            if ((r = dt__sync(m, "dt_model_backward")) != DT_OK) break;
            m->hook(m->hook_user, m, i);
        }
    }
    if (r == DT_OK) r = dt__sync(m, "dt_model_backward");
    if (r == DT_OK && m->sync_err != DT_OK) r = m->sync_err;
    dt_trace_end();
    return r;
}

void dt_model_set_backward_hook(dt_model *m, dt_backward_hook fn, void *user) {
    if (!m) return;
    m->hook = fn;
    m->hook_user = fn ? user : NULL;
}

void dt_model_zero_grad(dt_model *m) {
    if (!m || !m->finalized) return;
    m->ops->fill(m->ctx, m->grads, m->nparams, 0.0f);
    (void)dt__sync(m, "dt_model_zero_grad");   /* a failure stays with the backend: the next call returns it */
}

dt_result dt_model_get_output(dt_model *m, float *host, int64_t count) {
    dt_result r;
    int64_t want;
    if ((r = dt__need_final(m, "dt_model_get_output")) != DT_OK) return r;
    if (!m->batch) return dt_set_error(DT_ERR_STATE, "dt_model_get_output: no forward pass yet");
    if (!host) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_get_output: host buffer is NULL");
    want = m->batch * m->nodes[m->nnodes - 1].size;
    if (count != want)
        return dt_set_error(DT_ERR_SHAPE, "dt_model_get_output: count is %lld but the output has %lld elements (batch %lld x %lld)",
                            (long long)count, (long long)want, (long long)m->batch, (long long)m->nodes[m->nnodes - 1].size);
    m->ops->download(m->ctx, host, m->nodes[m->nnodes - 1].out, (int64_t)sizeof(float) * want);
    return dt__sync(m, "dt_model_get_output");
}

dt_result dt_model_count_correct(dt_model *m, const int32_t *labels, int64_t *correct) {
    dt_result r = dt__loss_prep(m, labels, NULL, "dt_model_count_correct");
    if (r != DT_OK) return r;
    if (!correct) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_count_correct: correct is NULL");
    m->ops->count_correct(m->ctx, m->nodes[m->nnodes - 1].out, m->labels, m->batch, m->nodes[m->nnodes - 1].c, correct);
    return dt__sync(m, "dt_model_count_correct");
}
#ifdef __cplusplus
}
#endif
#endif /* the implementation */
