/* tests/test_diff.c - the differential test: seeded random graphs, each run through the model as users run it
   (every fusion of the plan and every fast kernel on, on each CPU tier of this build that this CPU runs, in
   one binary) and through the same graph with the plan's fusions off and the reference kernels (the direct
   convolution and its gradients with double sums, dt_gemm_ref, and the plain loops of dtrain/core/tensor.h with
   no tier's kernels), and compared: logits, loss, every parameter's gradient, the input's gradient, the
   batch norms' running statistics, every parameter after SGD and Adam steps, and the logits in eval mode.

     test_diff [--graphs N] [--seed S] [--graph I] [--tiers T,T...] [--dump DIR] [--verbose]

   Graph i of a run is a pure function of (S, i): a failure prints both, and `--seed S --graph i` replays it
   alone. --tiers (e.g. neon) runs only the tiers named. Graphs 0 and 1 are the two findings of issue 28's parity run, as reported (gdirected). Default: the CI run's count (DT_TEST_QUICK=1: fewer; DT_DIFF_GRAPHS overrides; `make test-diff`
   runs a larger count). --dump DIR also writes each graph, its data, the state before each step and the
   default tier's results to DIR (gNNNN.txt and gNNNN.bin, the fixtures' record format), which
   tests/diff_torch.py compares with float64 PyTorch.

   Graphs: an image input of 1 to 132 channels and 1x1 to 33x33 pixels (not square), a batch of 1 to 40;
   convolutions with kernels 1 to 5 wide, square or not, strides 1 and 2 (or 1 x 2, 2 x 1), padding 0 to 2,
   with and without bias; batch norm in training and in eval mode; ReLU; max and average pooling with square
   and rectangular windows; residual blocks with every shortcut (identity, ResNet's padding shortcut, a 1x1
   convolution with and without batch norm, a k x k one with batch norm: a projection shortcut), built main
   branch first or shortcut first; relu(bn(x) + x); dropout; global average pooling or a flatten; linear
   layers with a 1-D batch norm; cross entropy on logits or NLL on a log-softmax. Each graph's convolutions
   and products are bounded in size (DIFF_BUDGET multiply-adds a batch), so hundreds run in about a minute.

   Tolerance. Each comparison is the relative error in the infinity norm, max |fast - ref| / max |ref|, of a
   tensor (each parameter's gradient and value on its own). What float32 rounding may cause there is measured,
   not guessed: the reference runs a second time on its inputs, parameters, buffers and optimizer state each
   moved by one unit in the last place of float32 (relative 2^-23, a random sign per element): its relative
   distance from the reference, the spread, is how far rounding at float32's precision moves this tensor in
   this graph (through every cancellation of batch norm, every long sum). A fast path passes when its error is
   at most DIFF_C times the spread plus DIFF_FLOOR; a defect of the kind this test exists for (a folded batch
   norm never computed, a wrong tap) is off by 1e-3 to 1, thousands of spreads. Each step starts every model
   from the reference's state (parameters, buffers, optimizer state), so rounding does not compound over the
   steps, and Adam's first step, which turns a gradient of 1e-9 and one of -1e-9 into steps of +lr and -lr,
   cannot make one step's rounding look like a defect in the next.

   ReLU and max pooling are discontinuous: where a pre-activation is within rounding of zero, or two values of
   a pooling window within rounding of each other, the fast path and the reference may decide differently,
   which is correct, and the backward pass then routes a gradient elsewhere. The test finds such a step (a
   ReLU's mask or a pooling's argmax differs), still compares its forward values, and leaves its gradients
   and steps out, counting it; more than DIFF_FLIPS_MAX of a run's steps so left out fail the run.

   Coverage. Every fast path must be taken by some graph of the run, on every tier that has it: the shifted
   rows (forward, both gradients, stride 2's input gradient by phases, the weight gradient alone), the taps
   (forward and backward), the packed GEMMs (forward, weight gradient, the input gradient as a convolution,
   and by GEMM + col2im), the tier's kernel entries (im2col stretches, the GEMM's packing, col2im, 2 x 2
   pooling, batch norm's sums), and the plan's fusions (bn_relu in training and eval, relu(bn(x) + r),
   add_relu, and written-not-added gradients by the add, linear, fused batch norm and convolution). The
   test counts them (wrapping the tier's kernel table and the CPU's ops table) and fails naming any that no
   graph reached. */
#define DTRAIN_IMPLEMENTATION   /* here, not linked (Makefile): the kernels' internals */
#include "../dtrain.h"
#include "dt_test.h"

#include <errno.h>

#ifndef DIFF_GRAPHS
#define DIFF_GRAPHS 500        /* graphs of a make test run */
#endif
#define DIFF_GRAPHS_QUICK 40   /* under DT_TEST_QUICK=1 (no OpenMP, sanitizers, qemu) */
#define DIFF_GRAPHS_MAX 1000   /* more while a fast path is still to be taken, up to this many */
#define DIFF_BUDGET 2.0e6      /* multiply-adds of a graph's convolutions and products per batch, at most */
#define DIFF_C 128.0           /* a fast path's error may be this many spreads ... */
#define DIFF_FLOOR 4e-6        /* ... plus this (relative) */
#define DIFF_FLIPS_MAX 0.05    /* the share of steps whose gradients a ReLU or pooling decision leaves out */
#define DIFF_STEPS 4           /* 2 SGD, then 2 Adam */
#define MAXN 96

/* ---- a private RNG (splitmix64), independent of the library ---- */
static uint64_t rs;
static uint64_t rnext(void) {
    uint64_t z = (rs += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static int64_t rint_(int64_t lo, int64_t hi) { return lo + (int64_t)(rnext() % (uint64_t)(hi - lo + 1)); }   /* [lo, hi] */
static int rchance(double p) { return (double)(rnext() >> 11) * (1.0 / 9007199254740992.0) < p; }
static float runi(void) { return (float)((double)(rnext() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
/* channels: mostly few, sometimes many (up to 132, across the GEMM's blocks of 128) */
static int64_t rchan(void) { return rchance(0.6) ? rint_(1, 8) : rchance(0.6) ? rint_(9, 32) : rint_(33, 132); }

/* ---- a graph: the builder calls that make it, replayed for every model ---- */
enum { G_CONV, G_BN, G_RELU, G_MAXPOOL, G_AVGPOOL, G_GAP, G_FLATTEN, G_LINEAR, G_ADD, G_PAD, G_DROPOUT, G_LOGSOFTMAX };
static const char *gop_name[] = {"conv", "bn", "relu", "maxpool", "avgpool", "gap", "flatten", "linear", "add", "pad_shortcut",
                                 "dropout", "log_softmax"};
typedef struct gnode {
    int op, in0, in1;
    int64_t oc, kh, kw, sh, sw, ph, pw;   /* conv, pooling (pad_shortcut: oc, sh) ; linear: oc */
    int bias;
    float p;                              /* dropout */
} gnode;
typedef struct graph {
    uint64_t seed;
    int index, nn;                        /* nodes after the input (ids 1 .. nn) */
    gnode node[MAXN + 1];
    int64_t c, h, w, batch, classes;
    int eval;                             /* every pass in eval mode */
    int shift_off, taps_all, small_ws;    /* the fast model: no shifted rows (the packed GEMMs instead); taps for
                                             every stride-1 geometry they can take; in the backward pass a GEMM
                                             workspace only as large as the shifted rows' weight gradient needs
                                             (their input gradient of stride 2 then leaves to the GEMMs, as on
                                             images larger than a graph here has) */
    float momentum, wd, adam_wd;
    int nesterov, adamw;
    double macs;
} graph;

static int gapply(dt_model *m, const gnode *g) {
    if (g->op == G_CONV || g->op == G_MAXPOOL || g->op == G_AVGPOOL) {
        int square = g->kh == g->kw && g->sh == g->sw && g->ph == g->pw;
        if (g->op == G_CONV) {
            dt_conv2d_desc d;
            memset(&d, 0, sizeof d);
            d.out_channels = g->oc; d.no_bias = !g->bias;
            if (square) { d.kernel = g->kh; d.stride = g->sh; d.pad = g->ph; }
            else { d.kernel_h = g->kh; d.kernel_w = g->kw; d.stride_h = g->sh; d.stride_w = g->sw; d.pad_h = g->ph; d.pad_w = g->pw; }
            return dt_conv2d_ex(m, g->in0, &d);
        } else {
            dt_pool2d_desc d;
            memset(&d, 0, sizeof d);
            if (square) { d.kernel = g->kh; d.stride = g->sh; d.pad = g->ph; }
            else { d.kernel_h = g->kh; d.kernel_w = g->kw; d.stride_h = g->sh; d.stride_w = g->sw; d.pad_h = g->ph; d.pad_w = g->pw; }
            return g->op == G_MAXPOOL ? dt_maxpool2d_ex(m, g->in0, &d) : dt_avgpool2d_ex(m, g->in0, &d);
        }
    }
    switch (g->op) {
    case G_BN: return dt_batchnorm(m, g->in0);
    case G_RELU: return dt_relu(m, g->in0);
    case G_GAP: return dt_global_avgpool(m, g->in0);
    case G_FLATTEN: return dt_flatten(m, g->in0);
    case G_LINEAR: return dt_linear(m, g->in0, g->oc, g->bias);
    case G_ADD: return dt_add(m, g->in0, g->in1);
    case G_PAD: return dt_pad_shortcut(m, g->in0, g->oc, g->sh);
    case G_DROPOUT: return dt_dropout(m, g->in0, g->p);
    default: return dt_log_softmax(m, g->in0);
    }
}

/* the generator's scratch model, in which each node is added as it is drawn (its shape from the library) */
static dt_model *gm;
static graph *gg;
static int gadd(gnode g) {
    int id;
    if (gg->nn == MAXN) return -1;
    id = gapply(gm, &g);
    if (id < 0) return -1;
    gg->node[++gg->nn] = g;
    return id;
}
static gnode gnew(int op, int in0) {
    gnode g;
    memset(&g, 0, sizeof g);
    g.op = op; g.in0 = in0; g.in1 = -1;
    return g;
}
static void gshape(int x, int64_t *c, int64_t *h, int64_t *w) {
    int64_t s[3] = {0, 0, 0};
    if (dt_model_node_shape(gm, x, s) == 3) { *c = s[0]; *h = s[1]; *w = s[2]; }
    else { *c = s[0]; *h = *w = 0; }
}
/* a window of kh x kw (each 1..kmax), square or not, that fits an image h x w with padding up to pmax */
static void gwindow(gnode *g, int64_t h, int64_t w, int64_t kmax, int pool) {
    int square = rchance(0.55);
    g->kh = rint_(1, kmax); g->kw = square ? g->kh : rint_(1, kmax);
    if (pool) {
        g->ph = rint_(0, g->kh / 2); g->pw = square ? g->ph : rint_(0, g->kw / 2);
        g->sh = rchance(0.5) ? g->kh : rint_(1, g->kh); g->sw = square ? g->sh : rchance(0.5) ? g->kw : rint_(1, g->kw);
    } else {
        g->ph = rint_(0, 2); g->pw = square ? g->ph : rint_(0, 2);
        g->sh = rchance(0.65) ? 1 : 2; g->sw = square || rchance(0.5) ? g->sh : 3 - g->sh;
    }
    if (g->kh > h + 2 * g->ph) g->kh = h + 2 * g->ph;
    if (g->kw > w + 2 * g->pw) g->kw = w + 2 * g->pw;
    if (pool) {   /* padding at most half the (clipped) kernel */
        if (g->ph * 2 > g->kh) g->ph = g->kh / 2;
        if (g->pw * 2 > g->kw) g->pw = g->kw / 2;
        if (g->kh > h + 2 * g->ph) g->kh = h + 2 * g->ph;
        if (g->kw > w + 2 * g->pw) g->kw = w + 2 * g->pw;
    }
}
static int gconv(int x, int64_t oc, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int bias) {
    gnode g = gnew(G_CONV, x);
    g.oc = oc; g.kh = kh; g.kw = kw; g.sh = sh; g.sw = sw; g.ph = ph; g.pw = pw; g.bias = bias;
    return gadd(g);
}
/* a residual block: relu?(main + shortcut), main = conv k (stride s) [bn] relu conv k [bn], with the shortcut
   of kind sk; the two branches built in either order and added in either order */
static int gresidual(int x) {
    int64_t c, h, w, oc, kh, kw, s, a = -1, b, t;
    int sk, bn = rchance(0.8), first_short = rchance(0.4), mid, main, sc = -1, y;
    gshape(x, &c, &h, &w);
    kh = rchance(0.6) ? 3 : rchance(0.5) ? 1 : rchance(0.5) ? 5 : 3;
    kw = rchance(0.8) ? kh : (kh == 1 ? 3 : 1);
    s = rchance(0.6) ? 1 : 2;
    sk = (int)rint_(0, 4);   /* 0 identity, 1 padding (option A), 2 1x1 conv, 3 1x1 conv + bn, 4 k x k conv + bn */
    oc = rchance(0.5) ? c : c + 2 * rint_(0, 8);
    if (sk == 0 && (s != 1 || oc != c)) sk = s == 1 && rchance(0.5) ? 0 : 1 + (int)rint_(0, 3);
    if (sk == 0) oc = c;
    if (sk == 1 && (oc < c || (oc - c) % 2)) oc = c;
    for (t = 0; t < 2; t++) {
        if ((t == 0) == first_short) {   /* the shortcut */
            if (sk == 0) sc = x;
            else if (sk == 1) { gnode g = gnew(G_PAD, x); g.oc = oc; g.sh = s; sc = gadd(g); }
            else if (sk == 2 || sk == 3) {
                sc = gconv(x, oc, 1, 1, s, s, 0, 0, sk == 2);
                if (sk == 3) sc = gadd(gnew(G_BN, sc));
            } else sc = gadd(gnew(G_BN, gconv(x, oc, kh, kw, s, s, (kh - 1) / 2, (kw - 1) / 2, 0)));
            if (sc < 0) return -1;
        } else {
            mid = gconv(x, oc, kh, kw, s, s, (kh - 1) / 2, (kw - 1) / 2, !bn);
            if (bn) mid = gadd(gnew(G_BN, mid));
            mid = gadd(gnew(G_RELU, mid));
            main = gconv(mid, oc, kh, kw, 1, 1, (kh - 1) / 2, (kw - 1) / 2, !bn);
            if (bn) main = gadd(gnew(G_BN, main));
            if (main < 0) return -1;
            a = main;
        }
    }
    b = sc;
    {
        gnode g = gnew(G_ADD, rchance(0.5) ? (int)a : (int)b);
        g.in1 = g.in0 == (int)a ? (int)b : (int)a;
        y = gadd(g);
    }
    return rchance(0.8) ? gadd(gnew(G_RELU, y)) : y;
}
/* draws graph `index` of a run with `seed` into G; 0 when built */
static int gdraw(graph *G, uint64_t seed, int index, int attempt) {
    dt_model_desc d;
    int x, blocks, b, i;
    int64_t c, h, w;
    memset(G, 0, sizeof *G);
    rs = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)index * 1000003ULL + (uint64_t)attempt * 7919ULL + 1;
    G->seed = seed; G->index = index;
    G->c = rchance(0.4) ? rint_(1, 3) : rchan();
    G->h = rint_(1, 33); G->w = rchance(0.5) ? G->h : rint_(1, 33);
    G->batch = rchance(0.5) ? rint_(1, 8) : rint_(9, 40);
    G->classes = rint_(2, 10);
    G->eval = rchance(0.15);
    G->shift_off = rchance(0.3);
    G->taps_all = rchance(0.4);
    G->small_ws = rchance(0.15);
    G->momentum = rchance(0.7) ? 0.9f : 0.0f; G->nesterov = G->momentum > 0.0f && rchance(0.3);
    G->wd = rchance(0.5) ? 5e-4f : 0.0f; G->adamw = rchance(0.3); G->adam_wd = G->adamw || rchance(0.3) ? 1e-2f : 0.0f;
    memset(&d, 0, sizeof d);
    d.in_c = G->c; d.in_h = G->h; d.in_w = G->w;
    if (dt_model_create(&gm, &d) != DT_OK) return -1;
    gg = G;
    x = 0;
    blocks = (int)rint_(1, 4);
    for (b = 0; b < blocks && x >= 0; b++) {
        int kind = (int)rint_(0, 99);
        gshape(x, &c, &h, &w);
        if (kind < 35) {           /* conv [bn] [relu] [dropout] */
            gnode g = gnew(G_CONV, x);
            gwindow(&g, h, w, 5, 0);
            g.oc = rchan();
            g.bias = rchance(0.5);
            x = gadd(g);
            if (x >= 0 && rchance(0.5)) x = gadd(gnew(G_BN, x));
            if (x >= 0 && rchance(0.65)) x = gadd(gnew(G_RELU, x));
            if (x >= 0 && rchance(0.08)) { gnode g2 = gnew(G_DROPOUT, x); g2.p = rchance(0.5) ? 0.0f : 0.3f; x = gadd(g2); }
        } else if (kind < 70) {
            x = gresidual(x);
        } else if (kind < 88) {    /* pooling */
            gnode g = gnew(rchance(0.6) ? G_MAXPOOL : G_AVGPOOL, x);
            gwindow(&g, h, w, 3, 1);
            if (rchance(0.25)) { g.kh = g.kw = g.sh = g.sw = 2; g.ph = g.pw = 0; if (h < 2 || w < 2) g.kh = g.kw = g.sh = g.sw = 1; }
            x = gadd(g);
        } else if (kind < 94) {    /* relu(bn(x) + x): the add's residual is the batch norm's own input */
            int y = gadd(gnew(G_BN, x));
            gnode g = gnew(G_ADD, y);
            g.in1 = x;
            x = gadd(g);
            if (x >= 0) x = gadd(gnew(G_RELU, x));
        } else {                   /* batch norm, ReLU */
            x = gadd(gnew(G_BN, x));
            if (x >= 0 && rchance(0.6)) x = gadd(gnew(G_RELU, x));
        }
    }
    if (x >= 0) {
        gshape(x, &c, &h, &w);
        x = gadd(gnew(c * h * w <= 4096 && rchance(0.5) ? G_FLATTEN : G_GAP, x));
    }
    if (x >= 0 && rchance(0.5)) {   /* a hidden layer */
        gnode g = gnew(G_LINEAR, x);
        g.oc = rint_(1, 64); g.bias = rchance(0.7);
        x = gadd(g);
        if (x >= 0 && rchance(0.4)) x = gadd(gnew(G_BN, x));
        if (x >= 0 && rchance(0.7)) x = gadd(gnew(G_RELU, x));
        if (x >= 0 && rchance(0.2)) { gnode g2 = gnew(G_DROPOUT, x); g2.p = rchance(0.5) ? 0.0f : 0.25f; x = gadd(g2); }
    }
    if (x >= 0) {
        gnode g = gnew(G_LINEAR, x);
        g.oc = G->classes; g.bias = rchance(0.8);
        x = gadd(g);
    }
    if (x >= 0 && rchance(0.3)) x = gadd(gnew(G_LOGSOFTMAX, x));
    if (x >= 0) {   /* the multiply-adds of a batch; and batch norm with one value a channel needs eval mode */
        G->macs = 0.0;
        for (i = 1; i <= G->nn; i++) {
            const gnode *g = &G->node[i];
            int64_t ic, ih, iw, oc, oh, ow;
            gshape(g->in0, &ic, &ih, &iw);
            gshape(i, &oc, &oh, &ow);
            if (g->op == G_CONV) G->macs += (double)G->batch * (double)(oc * oh * ow) * (double)(ic * g->kh * g->kw);
            if (g->op == G_LINEAR) G->macs += (double)G->batch * (double)oc * (double)dt_model_node_size(gm, g->in0);
            if (g->op == G_BN && G->batch * (ih ? ih * iw : 1) == 1) G->eval = 1;
        }
    }
    dt_model_destroy(gm);
    gm = NULL;
    return x < 0 || G->macs > DIFF_BUDGET ? -1 : 0;
}
/* The first graphs of every run are the two findings, replayed as they were reported:
   0: a ResNet downsampling block with a projection shortcut (conv + BN on the main branch, 1x1 conv + BN on the
      shortcut, ReLU after the add), whose first batch norm the plan folded away uncomputed;
   1: 16 -> 16 channels, 3 x 3, stride 1, padding 1, 8 x 8 images, batch 32, with the shifted rows off (so the
      taps take it), through SGD and Adam steps, reported with a wrong input gradient at the second Adam pass on
      the AVX tiers. */
#define DIFF_DIRECTED 2
static int gdirected(graph *G, uint64_t seed, int index) {
    dt_model_desc d;
    int x, a, b;
    memset(G, 0, sizeof *G);
    rs = seed + (uint64_t)index;
    G->seed = seed; G->index = index;
    G->classes = 10; G->momentum = 0.9f; G->wd = 5e-4f;
    if (index == 0) { G->c = 3; G->h = G->w = 16; G->batch = 8; }
    else { G->c = 16; G->h = G->w = 8; G->batch = 32; G->shift_off = 1; }
    memset(&d, 0, sizeof d);
    d.in_c = G->c; d.in_h = G->h; d.in_w = G->w;
    if (dt_model_create(&gm, &d) != DT_OK) return -1;
    gg = G;
    if (index == 0) {
        x = gadd(gnew(G_RELU, gadd(gnew(G_BN, gconv(0, 16, 3, 3, 1, 1, 1, 1, 0)))));
        a = gadd(gnew(G_RELU, gadd(gnew(G_BN, gconv(x, 32, 3, 3, 2, 2, 1, 1, 0)))));
        a = gadd(gnew(G_BN, gconv(a, 32, 3, 3, 1, 1, 1, 1, 0)));
        b = gadd(gnew(G_BN, gconv(x, 32, 1, 1, 2, 2, 0, 0, 0)));
        {
            gnode g = gnew(G_ADD, a);
            g.in1 = b;
            x = gadd(gnew(G_RELU, gadd(g)));
        }
        x = gadd(gnew(G_GAP, x));
    } else {
        x = gadd(gnew(G_RELU, gconv(0, 16, 3, 3, 1, 1, 1, 1, 1)));
        x = gadd(gnew(G_RELU, gconv(x, 16, 3, 3, 1, 1, 1, 1, 1)));
        x = gadd(gnew(G_FLATTEN, x));
    }
    {
        gnode g = gnew(G_LINEAR, x);
        g.oc = G->classes; g.bias = 1;
        x = gadd(g);
    }
    dt_model_destroy(gm);
    gm = NULL;
    return x < 0 ? -1 : 0;
}
static void gmake(graph *G, uint64_t seed, int index) {
    int attempt = 0;
    if (index < DIFF_DIRECTED && gdirected(G, seed, index) == 0) return;
    while (gdraw(G, seed, index, attempt) != 0) attempt++;
}

/* ---- counting the fast paths ---- */
enum {
    P_SHIFT_FWD, P_SHIFT_FWD2, P_SHIFT_BWD, P_SHIFT_WGRAD3, P_SHIFT_DGRAD2, P_SHIFT_WGRAD_ONLY, P_TAPS_FWD, P_TAPS_BWD, P_GEMM_FWD, P_GEMM_WGRAD,
    P_GEMM_DGRAD, P_COL2IM_DGRAD, P_K_COL_SPAN, P_K_PACK_A8, P_K_PACK_BT, P_K_COL2IM, P_K_MAXPOOL2, P_K_BN_SUMS,
    P_BN_RELU, P_BN_RELU_EVAL, P_BN_ADD_RELU, P_ADD_RELU, P_OW_ADD, P_OW_LINEAR, P_OW_BN, P_OW_CONV, P_COUNT
};
static const char *path_name[P_COUNT] = {
    "shifted rows: forward", "shifted rows: forward of stride 2 by phases", "shifted rows: both gradients",
    "shifted rows: 3 x 3 weight gradient by transposed tiles", "shifted rows: stride 2's input gradient by phases",
    "shifted rows: the weight gradient alone", "taps: forward", "taps: both gradients", "packed GEMM: forward",
    "packed GEMM: weight gradient", "packed GEMM: input gradient as a convolution", "GEMM + col2im: input gradient",
    "kernel: im2col stretches", "kernel: A's 8-tall panels", "kernel: B^T's panels", "kernel: col2im", "kernel: 2 x 2 max pooling",
    "kernel: batch norm's sums", "plan: bn_relu (training)", "plan: bn_relu (eval)", "plan: relu(bn(x) + r) in the add",
    "plan: add_relu", "plan: the add writes its inputs' gradients", "plan: linear writes its input's gradient",
    "plan: a fused batch norm writes its input's gradient", "plan: a convolution writes its input's gradient"};
static int64_t taken[8][P_COUNT];   /* per tier */
static int cur_tier;                /* index into dt__kernels of the fast model's tier */
#define COUNT(p) __atomic_fetch_add(&taken[cur_tier][p], 1, __ATOMIC_RELAXED)

/* the tier's kernel table, each entry counted */
static const dt__kernel *orig;
static dt__kernel wrapped[8];
static void w_col_span(const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx, int64_t n, int64_t oy, int64_t ox,
                       int64_t len, float *dst) {
    COUNT(P_K_COL_SPAN);
    orig->col_span(g, x, c, ky, kx, n, oy, ox, len, dst);
}
static void w_pack_a8(const float *A, int64_t lda, int64_t kc8, float *dst) { COUNT(P_K_PACK_A8); orig->pack_a8(A, lda, kc8, dst); }
static void w_pack_bt(const float *B, int64_t ldb, int64_t kc, int64_t nr, float *dst, int NR) {
    COUNT(P_K_PACK_BT);
    orig->pack_bt(B, ldb, kc, nr, dst, NR);
}
static int w_col2im(const dt_conv_geom *g, const float *col, float *dx) {
    int r = orig->col2im(g, col, dx);
    if (r) COUNT(P_K_COL2IM);
    return r;
}
static void w_maxpool2(const float *r0, const float *r1, int64_t w, int32_t i0, float *yo, int32_t *io, int cnt) {
    COUNT(P_K_MAXPOOL2);
    orig->maxpool2(r0, r1, w, i0, yo, io, cnt);
}
static void w_bn_sums(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *a, double *b) {
    COUNT(P_K_BN_SUMS);
    orig->bn_sums(x, y, mk, n, cs, s, a, b);
}
static void wrap_kernels(void) {
    int k;
    for (k = 0; k < DT__NKERNELS && k < 8; k++) {
        const dt__kernel *o = dt__kernels[k];
        dt__kernel *w = &wrapped[k];
        *w = *o;
        if (o->col_span) w->col_span = w_col_span;
        if (o->pack_a8) w->pack_a8 = w_pack_a8;
        if (o->pack_bt) w->pack_bt = w_pack_bt;
        if (o->col2im) w->col2im = w_col2im;
        if (o->maxpool2) w->maxpool2 = w_maxpool2;
        if (o->bn_sums) w->bn_sums = w_bn_sums;
    }
}
/* the fast model's tier k, counted */
static void use_tier(int k) {
    cur_tier = k;
    orig = dt__kernels[k];
    DT__ATOMIC_STORE(&dt__kernel_chosen, (const dt__kernel *)&wrapped[k]);
}

/* the CPU's ops table, its convolutions and fused pairs counted */
static dt_ops fast_ops;
static int f_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    int64_t s0 = dt__shift_taken, t0 = dt__tap_taken;
    int r = dt_cpu_ops()->conv_fwd(ctx, g, x, W, b, y);
    if (dt__shift_taken > s0) COUNT(g->sh * g->sw > 1 ? P_SHIFT_FWD2 : P_SHIFT_FWD);
    if (dt__tap_taken > t0) COUNT(P_TAPS_FWD);
    return r;
}
static int f_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                      int accumulate) {
    int64_t s0 = dt__shift_taken, t0 = dt__tap_taken;
    int r = dt_cpu_ops()->conv_bwd(ctx, g, x, W, dy, dW, dx, accumulate);
    if (dt__shift_taken > s0) {
        COUNT(r == 2 ? P_SHIFT_WGRAD_ONLY : dx && g->sh * g->sw > 1 ? P_SHIFT_DGRAD2 : P_SHIFT_BWD);
#ifdef DT__SHIFT
        if (dt__shift_wgrad3_fits(g)) COUNT(P_SHIFT_WGRAD3);
#endif
    }
    if (dt__tap_taken > t0) COUNT(P_TAPS_BWD);
    return r;
}
static void f_conv_gemm_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, float *t) {
    COUNT(P_GEMM_FWD);
    dt_cpu_ops()->conv_gemm_fwd(ctx, g, x, W, t);
}
static void f_conv_gemm_wgrad(void *ctx, const dt_conv_geom *g, const float *x, const float *t, float *dW) {
    COUNT(P_GEMM_WGRAD);
    dt_cpu_ops()->conv_gemm_wgrad(ctx, g, x, t, dW);
}
static int f_conv_gemm_dgrad(void *ctx, const dt_conv_geom *g, const float *W, const float *dy, float *dx, float *ws, int64_t wc) {
    int r = dt_cpu_ops()->conv_gemm_dgrad(ctx, g, W, dy, dx, ws, wc);
    if (r) COUNT(P_GEMM_DGRAD);
    return r;
}
static void f_col2im(void *ctx, const dt_conv_geom *g, const float *col, float *dx) {
    COUNT(P_COL2IM_DGRAD);
    dt_cpu_ops()->col2im_bwd(ctx, g, col, dx);
}

static void *xmalloc(int64_t n) {
    void *p = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!p) { fprintf(stderr, "test_diff: out of memory\n"); exit(2); }
    return p;
}

/* ---- the reference ops: no tier's kernels, no fused pairs, the direct convolution with double sums ---- */
static dt_ops ref_ops;
static void r_gemm(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)ctx;
    dt_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
static void r_im2col(void *ctx, const dt_conv_geom *g, const float *x, float *col) { (void)ctx; dt__im2col(NULL, g, x, col); }
static void r_col2im(void *ctx, const dt_conv_geom *g, const float *col, float *dx) { (void)ctx; dt__col2im(NULL, g, col, dx); }
static void r_channel_sum(void *ctx, float *db, const float *dy, int64_t n, int64_t c, int64_t s) {
    (void)ctx;
    dt__channel_sums(NULL, db, dy, n, c, s);
}
static void r_maxpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y, int32_t *idx) {
    (void)ctx;
    dt__maxpool_fwd(NULL, g, x, y, idx);
}
static void r_bn_fwd(void *ctx, int training, const float *x, float *y, int64_t n, int64_t c, int64_t s, const float *gamma,
                     const float *beta, float *rm, float *rv, float eps, float momentum, float *sm, float *si) {
    (void)ctx;
    dt__bn_fwd(NULL, training, 0, x, NULL, y, n, c, s, gamma, beta, rm, rv, eps, momentum, sm, si);
}
static void r_bn_bwd(void *ctx, int training, const float *x, const float *dy, float *dx, int64_t n, int64_t c, int64_t s,
                     const float *gamma, const float *sm, const float *si, float *dgamma, float *dbeta) {
    (void)ctx;
    dt__bn_bwd(NULL, training, x, NULL, dy, dx, 1, NULL, 0, n, c, s, gamma, sm, si, dgamma, dbeta);
}
static int r_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    (void)ctx;
    dt_conv2d_ref(g, x, W, b, y);
    return 1;
}
/* dW += and dx = or += the direct gradients, each summed in double, or (f32) in float: each product and sum
   rounded to float, in the loops' order */
static int conv_bwd_direct(const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                           int accumulate, int f32) {
    int64_t xs = g->n * g->c * g->h * g->w, ws = g->oc * g->c * g->kh * g->kw, n, o, oy, ox, c, ky, kx, i;
    double *ax = (double *)xmalloc(8 * (xs + ws)), *aw = ax + xs;
    for (n = 0; n < g->n; n++)
        for (o = 0; o < g->oc; o++)
            for (oy = 0; oy < g->oh; oy++)
                for (ox = 0; ox < g->ow; ox++) {
                    double d = dy[((n * g->oc + o) * g->oh + oy) * g->ow + ox];
                    for (c = 0; c < g->c; c++)
                        for (ky = 0; ky < g->kh; ky++)
                            for (kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx, wi, xi;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                wi = ((o * g->c + c) * g->kh + ky) * g->kw + kx;
                                xi = ((n * g->c + c) * g->h + iy) * g->w + ix;
                                aw[wi] += d * x[xi];
                                ax[xi] += d * W[wi];
                                if (f32) {
                                    aw[wi] = (float)aw[wi];   /* (d * x is exact in double: one rounding, as float's) */
                                    ax[xi] = (float)ax[xi];
                                }
                            }
                }
    for (i = 0; i < ws; i++) dW[i] = (float)((double)dW[i] + aw[i]);
    for (i = 0; dx && i < xs; i++) dx[i] = accumulate ? (float)((double)dx[i] + ax[i]) : (float)ax[i];
    free(ax);
    return 1;
}
static int r_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                      int accumulate) {
    (void)ctx;
    return conv_bwd_direct(g, x, W, dy, dW, dx, accumulate, 0);
}
/* The same in float: every sum in float, in the loops' order (the spread's model, below) */
static dt_ops ref32_ops;
static void r32_gemm(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t i, j, k;
    (void)ctx;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            float acc = 0.0f;
            for (k = 0; k < K; k++) acc += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = beta == 0.0f ? alpha * acc : alpha * acc + beta * C[i * ldc + j];
        }
}
static int r32_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    int64_t n, o, oy, ox, c, ky, kx;
    (void)ctx;
    for (n = 0; n < g->n; n++)
        for (o = 0; o < g->oc; o++)
            for (oy = 0; oy < g->oh; oy++)
                for (ox = 0; ox < g->ow; ox++) {
                    float acc = 0.0f;
                    for (c = 0; c < g->c; c++)
                        for (ky = 0; ky < g->kh; ky++)
                            for (kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                acc += x[((n * g->c + c) * g->h + iy) * g->w + ix] * W[((o * g->c + c) * g->kh + ky) * g->kw + kx];
                            }
                    y[((n * g->oc + o) * g->oh + oy) * g->ow + ox] = acc + (b ? b[o] : 0.0f);
                }
    return 1;
}
static int r32_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                        int accumulate) {
    (void)ctx;
    return conv_bwd_direct(g, x, W, dy, dW, dx, accumulate, 1);
}
static void make_tables(void) {
    fast_ops = *dt_cpu_ops();
    fast_ops.conv_fwd = f_conv_fwd; fast_ops.conv_bwd = f_conv_bwd;
    fast_ops.conv_gemm_fwd = f_conv_gemm_fwd; fast_ops.conv_gemm_wgrad = f_conv_gemm_wgrad;
    fast_ops.conv_gemm_dgrad = f_conv_gemm_dgrad; fast_ops.col2im_bwd = f_col2im;
    ref_ops = *dt_cpu_ops();
    ref_ops.name = "reference";
    ref_ops.gemm = r_gemm; ref_ops.im2col = r_im2col; ref_ops.col2im_bwd = r_col2im; ref_ops.channel_sum_bwd = r_channel_sum;
    ref_ops.maxpool_fwd = r_maxpool_fwd; ref_ops.bn_fwd = r_bn_fwd; ref_ops.bn_bwd = r_bn_bwd;
    ref_ops.conv_gemm_fwd = NULL; ref_ops.conv_gemm_wgrad = NULL; ref_ops.conv_gemm_dgrad = NULL;
    ref_ops.conv_fwd = r_conv_fwd; ref_ops.conv_bwd = r_conv_bwd;
    ref_ops.bn_relu_fwd = NULL; ref_ops.bn_relu_bwd = NULL; ref_ops.add_relu_fwd = NULL; ref_ops.add_relu_bwd = NULL;
    ref32_ops = ref_ops;
    ref32_ops.name = "reference in float";
    ref32_ops.gemm = r32_gemm; ref32_ops.conv_fwd = r32_conv_fwd; ref32_ops.conv_bwd = r32_conv_bwd;
}

/* ---- models of a graph, and their state ---- */
static dt_model *build(const graph *G, const dt_ops *ops) {
    dt_model *m = NULL;
    dt_model_desc d;
    int i;
    memset(&d, 0, sizeof d);
    d.in_c = G->c; d.in_h = G->h; d.in_w = G->w; d.seed = G->seed + (uint64_t)G->index; d.input_grad = 1;
    if (dt_model_create(&m, &d) != DT_OK) return NULL;
    for (i = 1; i <= G->nn; i++) gapply(m, &G->node[i]);
    if (dt_model_finalize(m) != DT_OK) { dt_model_destroy(m); return NULL; }
    m->ops = ops;                  /* the CPU backend's state (m->cpu) stays its context */
    dt_model_set_mode(m, G->eval ? DT_MODE_EVAL : DT_MODE_TRAIN);
    return m;
}
typedef struct state {             /* what a step starts from */
    float *params, *bufs, *opt;    /* opt: the optimizer's flat state (SGD's momentum, Adam's m then v) */
    int64_t np, nb, nopt, steps[256];
    int ntensors;
} state;
typedef struct result {            /* what a step gives */
    float *logits, *eval, loss, *grads, *dx, *bufs, *params, *relu, *argmax, *drop;   /* drop: the dropout masks */
    int64_t nlogits, ndx, nrelu, nargmax, ndrop;
} result;
static dt_optim *optim_for(const graph *G, dt_model *m, int step) {
    dt_optim *o = NULL;
    dt_optim_desc d;
    memset(&d, 0, sizeof d);
    if (step < 2) { d.kind = DT_OPTIM_SGD; d.lr = 0.05f; d.momentum = G->momentum; d.nesterov = G->nesterov; d.weight_decay = G->wd; }
    else { d.kind = G->adamw ? DT_OPTIM_ADAMW : DT_OPTIM_ADAM; d.lr = 1e-3f; d.weight_decay = G->adam_wd; }
    if (dt_optim_create(&o, m, &d) != DT_OK) return NULL;
    return o;
}
static void state_get(state *S, dt_model *m, dt_optim *o) {
    int i;
    S->params = dt_model_params(m, &S->np);
    S->bufs = dt_model_buffers(m, &S->nb);
    S->opt = dt_optim_state(o, &S->nopt);
    S->ntensors = dt_optim_tensors(o);
    for (i = 0; i < S->ntensors && i < 256; i++) S->steps[i] = dt_optim_tensor_steps(o, i);
}
static void state_copy(state *dst, const state *src) {
    int64_t np = src->np, nb = src->nb, no = src->nopt;
    *dst = *src;
    dst->params = (float *)xmalloc(4 * np); memcpy(dst->params, src->params, 4 * (size_t)np);
    dst->bufs = (float *)xmalloc(4 * nb); memcpy(dst->bufs, src->bufs, 4 * (size_t)nb);
    dst->opt = (float *)xmalloc(4 * no); if (no) memcpy(dst->opt, src->opt, 4 * (size_t)no);
}
static void state_free(state *S) { free(S->params); free(S->bufs); free(S->opt); }
static void state_set(dt_model *m, dt_optim *o, const state *S) {
    int64_t n;
    float *st = dt_optim_state(o, &n);
    CHECK_OK(dt_model_set_params(m, S->params, S->np));
    CHECK_OK(dt_model_set_buffers(m, S->bufs, S->nb));
    if (n == S->nopt && n) memcpy(st, S->opt, 4 * (size_t)n);
    CHECK_OK(dt_optim_set_tensor_steps(o, S->steps, S->ntensors));
}
/* each element times 1 +- 2^-23 */
static void perturb(float *x, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) x[i] *= (rnext() & 1) ? 1.0f + 0x1p-23f : 1.0f - 0x1p-23f;
}
/* One step of model m (with optimizer o) from state S on (x, y): forward, loss, backward, the optimizer's step;
   then, when eval is set, a forward pass in eval mode on the new state. */
static void run_step(const graph *G, dt_model *m, dt_optim *o, const state *S, const float *x, const int32_t *y, int step,
                     result *R) {
    int64_t np, nb, i, nr = 0, na = 0;
    dt_result r;
    state_set(m, o, S);
    dt_model_zero_grad(m);
    m->step = (uint64_t)step;   /* the dropout masks: the same on every model */
    dt__fuse_off = m->ops != &fast_ops;   /* the reference plans nothing (the plan is made at the first pass) */
    CHECK_OK(dt_model_forward(m, x, G->batch));
    dt__fuse_off = 0;
    R->nlogits = G->batch * dt_model_node_size(m, dt_model_output_node(m));
    R->logits = (float *)xmalloc(4 * R->nlogits);
    CHECK_OK(dt_model_get_output(m, R->logits, R->nlogits));
    r = dt_model_loss_labels(m, y, &R->loss);
    CHECK(r == DT_OK);
    {
        int64_t keep = m->cpu.gemm_ws_count, need = 0;
#ifdef DT__SHIFT
        if (m->ops == &fast_ops && G->small_ws)
            for (i = 1; i < m->nnodes; i++) {
                dt_conv_geom g;
                if (m->nodes[i].kind != DT_LAYER_CONV2D) continue;
                g = dt__geom(m, &m->nodes[i], G->batch);
                if (g.sh * g.sw > 1 && dt__shift_wgrad_need(&g) * dt_cpu_threads() > need)
                    need = dt__shift_wgrad_need(&g) * dt_cpu_threads();
            }
#endif
        if (need && need < keep) m->cpu.gemm_ws_count = need;
        CHECK_OK(dt_model_backward(m, NULL));
        m->cpu.gemm_ws_count = keep;
    }
    dt_model_grads(m, &np);
    dt_model_buffers(m, &nb);
    R->grads = (float *)xmalloc(4 * np); memcpy(R->grads, dt_model_grads(m, NULL), 4 * (size_t)np);
    R->bufs = (float *)xmalloc(4 * nb); if (nb) memcpy(R->bufs, dt_model_buffers(m, NULL), 4 * (size_t)nb);
    R->ndx = G->batch * G->c * G->h * G->w;
    R->dx = (float *)xmalloc(4 * R->ndx); memcpy(R->dx, dt_model_node_grad(m, 0), 4 * (size_t)R->ndx);
    for (i = 1; i < m->nnodes; i++) {   /* the decisions: each ReLU's mask, each max pooling's argmax */
        if (m->nodes[i].kind == DT_LAYER_RELU) nr += G->batch * m->nodes[i].size;
        if (m->nodes[i].kind == DT_LAYER_MAXPOOL2D) na += G->batch * m->nodes[i].size;
    }
    R->relu = (float *)xmalloc(4 * nr); R->argmax = (float *)xmalloc(4 * na);
    R->nrelu = R->nargmax = R->ndrop = 0;
    for (i = 1; i < m->nnodes; i++) if (m->nodes[i].kind == DT_LAYER_DROPOUT) R->ndrop += G->batch * m->nodes[i].size;
    R->drop = (float *)xmalloc(4 * R->ndrop);
    R->ndrop = 0;
    for (i = 1; i < m->nnodes; i++) {
        const dt__node *n = &m->nodes[i];
        int64_t k, cnt = G->batch * n->size;
        if (n->kind == DT_LAYER_RELU) for (k = 0; k < cnt; k++) R->relu[R->nrelu++] = n->out[k] > 0.0f;
        if (n->kind == DT_LAYER_MAXPOOL2D) for (k = 0; k < cnt; k++) R->argmax[R->nargmax++] = (float)n->idx[k];
        if (n->kind == DT_LAYER_DROPOUT) { memcpy(R->drop + R->ndrop, n->aux, 4 * (size_t)cnt); R->ndrop += cnt; }
    }
    CHECK_OK(dt_optim_step(o));
    R->params = (float *)xmalloc(4 * np); memcpy(R->params, dt_model_params(m, NULL), 4 * (size_t)np);
    R->eval = NULL;
    if (step == DIFF_STEPS - 1) {   /* the new parameters' logits in eval mode (running statistics) */
        dt_mode mode = dt_model_mode(m);
        dt_model_set_mode(m, DT_MODE_EVAL);
        R->eval = (float *)xmalloc(4 * R->nlogits);
        CHECK_OK(dt_model_forward(m, x, G->batch));
        CHECK_OK(dt_model_get_output(m, R->eval, R->nlogits));
        CHECK_OK(dt_model_set_mode(m, mode));
    }
}
/* The parameters after graph G's step `step` from state S with gradients g, as the optimizer's update computes
   them (torch.optim's formulas, in double), and in slack what float rounding may move each: the update's
   inputs rounded (g + wd p, and Adam's first moment, both sums that may cancel) and its result. The fast model's
   step is held to its own gradients, which are held to the reference's: compared with the reference's
   parameters instead, Adam's first step, lr g / (|g| + eps), turns gradients that are rounding (a bias's before
   a batch norm) into steps of +lr or -lr, whose difference says nothing of the kernels. */
/* Adam's step for gradient d from moments m0, v0, with the constants as the library has them: floats, and
   1 - beta in float (0.001f is not 1 - 0.999f) */
static double adam_update(double d, double m0, double v0, double bc1, double bc2) {
    double mm = (double)0.9f * m0 + (double)(1.0f - 0.9f) * d, vv = (double)0.999f * v0 + (double)(1.0f - 0.999f) * d * d;
    return (double)(float)((double)1e-3f / bc1) * (mm / (sqrt(vv) / (double)(float)sqrt(bc2) + (double)1e-8f));
}
static void expect_step(const graph *G, const dt_model *m, const state *S, const float *g, int step, double *out, double *slack) {
    int t;
    for (t = 0; t < m->npinfo; t++) {
        int64_t off = m->pinfo[t].offset, i;
        double tt = (double)(S->steps[t] + 1), bc1 = 1.0 - pow((double)0.9f, tt), bc2 = 1.0 - pow((double)0.999f, tt);
        for (i = off; i < off + m->pinfo[t].count; i++) {
            double p = S->params[i], d = g[i], dd, u, um, up, mround;
            if (step < 2) {
                dd = 0x1p-23 * (fabs(d) + fabs((double)G->wd * p));
                if (G->wd != 0.0f) d += (double)G->wd * p;
                if (G->momentum != 0.0f) {
                    double b = S->steps[t] == 0 ? d : (double)S->opt[i] * G->momentum + d;
                    dd += 0x1p-23 * (fabs(b) + fabs(d));
                    d = G->nesterov ? d + (double)G->momentum * b : b;
                    dd *= 2.0;
                }
                out[i] = p - (double)0.05f * d;
                slack[i] = 0.05 * dd + 0x1p-22 * (fabs(p) + 0.05 * fabs(d));
            } else {
                if (G->adamw) p *= (double)(1.0f - 1e-3f * G->adam_wd);
                else d += (double)G->adam_wd * p;
                dd = 0x1p-23 * (fabs((double)g[i]) + fabs((double)G->adam_wd * p)) +
                     0x1p-23 * (fabs(0.9 * S->opt[i]) + fabs(0.1 * d)) / 0.1;   /* m's rounding, as a change of d */
                u = adam_update(d, S->opt[i], S->opt[S->np + i], bc1, bc2);
                um = adam_update(d - dd, S->opt[i], S->opt[S->np + i], bc1, bc2);
                up = adam_update(d + dd, S->opt[i], S->opt[S->np + i], bc1, bc2);
                mround = fabs(up - u) > fabs(um - u) ? fabs(up - u) : fabs(um - u);
                out[i] = p - u;
                slack[i] = mround + 0x1p-21 * (fabs(p) + fabs(u));
            }
        }
    }
}
static void result_free(result *R) {
    free(R->logits); free(R->eval); free(R->grads); free(R->dx); free(R->bufs); free(R->params); free(R->relu); free(R->argmax);
    free(R->drop);
    memset(R, 0, sizeof *R);
}

/* ---- comparison ---- */
static double maxdiff(const float *a, const float *b, int64_t n) {   /* max |a - b|, NaN as infinity */
    double m = 0.0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}
static double maxabs(const float *a, int64_t n) {
    double m = 0.0;
    int64_t i;
    for (i = 0; i < n; i++) if (fabs((double)a[i]) > m) m = fabs((double)a[i]);
    return m;
}
static double worst_err[8], worst_ratio[8];   /* per tier: the largest relative error of a tensor that float32 determines
                                                 well (a spread under 1e-4 of it, and not under 1e-3 of its kind's
                                                 largest), and difference / tolerance */
static char worst_what[8][160];
static int failures, quiet, verbose;
static int64_t compared[8], flips_skipped[8], steps_run[8], ratio_hist[8][8];
static const graph *cur_graph;
/* Compares a tensor of the fast model with the reference's: its largest difference may be DIFF_C times the
   spread's plus DIFF_FLOOR times the larger of the reference's largest value and `family`, the largest of its
   kind in the model (all gradients, the input's among them; all buffers): a sum that cancels to rounding, such
   as the gradient of a bias before a batch norm (zero but for rounding), or every gradient before a batch norm
   whose output is averaged (a batch norm's output has mean 0 whatever its input, so global pooling after it
   passes back nothing but rounding), is then held to the scale of its kind, not to its own.
   `extra` is added to the tolerance (the loss's: what its logits' may move it). Returns the tolerance. */
static const float *pert2;   /* the second spread's run of the tensor compare is given (the same offset) */
static double compare(const char *what, const float *fast, const float *ref, const float *pert, int64_t n, int step, double family,
                      double extra) {
    double e = maxdiff(fast, ref, n), s = maxdiff(pert, ref, n), s2 = pert2 ? maxdiff(pert2, ref, n) : 0.0, r = maxabs(ref, n), scale = r > family ? r : family;
    double tol, ratio;
    if (s2 > s) s = s2;
    tol = DIFF_C * s + DIFF_FLOOR * scale + extra;
    ratio = tol > 0.0 ? e / tol : e > 0.0 ? INFINITY : 0.0;
    int b = ratio <= 0.0 ? 0 : (int)floor(log10(ratio)) + 7;
    compared[cur_tier]++;
    ratio_hist[cur_tier][b < 0 ? 0 : b > 7 ? 7 : b]++;
    if (s <= 1e-4 * r && r >= 1e-3 * scale && r > 0.0 && e / r > worst_err[cur_tier])   /* of a well-determined tensor */
        worst_err[cur_tier] = e / r;
    if (ratio > worst_ratio[cur_tier]) {
        worst_ratio[cur_tier] = ratio;
        snprintf(worst_what[cur_tier], sizeof worst_what[cur_tier], "graph %d, step %d, %.100s", cur_graph->index, step, what);
    }
    if (verbose > 2 || (verbose > 1 && ratio > 0.1))
        printf("      graph %d tier %s step %d %s: difference %.3g, spread %.3g, largest %.3g (of its kind %.3g): %.3g of the "
               "tolerance\n", cur_graph->index, dt__kernels[cur_tier]->name, step, what, e, s, r, family, ratio);
    if (ratio <= 1.0) return tol;
    failures++;
    dt_t_checks_failed++;
    if (quiet < 40)
        printf("    graph %d (--seed %llu --graph %d), tier %s, step %d, %s: largest difference %.3g (relative %.3g) > tolerance %.3g "
               "(spread %.3g)\n", cur_graph->index, (unsigned long long)cur_graph->seed, cur_graph->index, dt__kernels[cur_tier]->name,
               step, what, e, r > 0.0 ? e / r : e, tol, s);
    quiet++;
    return tol;
}
/* the fast model's parameters after its step against the step of its gradients (expect_step): within the
   float rounding of the update (a few units in the last place of the parameter, 1e-5 of the step) */
static void check_step(const graph *G, const dt_model *m, const state *S, const result *R, int step) {
    double *want = (double *)xmalloc(16 * S->np), *slack = want + S->np;
    int64_t i, bad = -1;
    expect_step(G, m, S, R->grads, step, want, slack);
    for (i = 0; i < S->np && bad < 0; i++)
        if (!(fabs((double)R->params[i] - want[i]) <= 2.0 * slack[i])) bad = i;
    compared[cur_tier]++;
    if (bad >= 0) {
        failures++;
        dt_t_checks_failed++;
        if (quiet++ < 40)
            printf("    graph %d (--seed %llu --graph %d), tier %s, step %d: parameter %lld is %.9g after the %s step, its "
                   "gradient's step gives %.9g (+- %.3g)\n", G->index, (unsigned long long)G->seed, G->index, dt__kernels[cur_tier]->name,
                   step, (long long)bad, (double)R->params[bad], step < 2 ? "SGD" : "Adam", want[bad], 2.0 * slack[bad]);
        if (verbose)
            printf("      from %.9g, gradient %.9g, state %.9g %.9g, step %lld\n", (double)S->params[bad], (double)R->grads[bad],
                   S->nopt ? (double)S->opt[bad] : 0.0, S->nopt > S->np ? (double)S->opt[S->np + bad] : 0.0, (long long)S->steps[0]);
    }
    free(want);
}
/* the plan's fusions of a fast model (after its first pass) */
static void count_plan(const dt_model *m) {
    int i;
    for (i = 1; i < m->nnodes; i++) {
        const dt__node *n = &m->nodes[i];
        if (n->kind == DT_LAYER_BATCHNORM && n->relu && !n->folded) COUNT(m->training ? P_BN_RELU : P_BN_RELU_EVAL);
        if (n->kind == DT_LAYER_ADD && n->bn) COUNT(P_BN_ADD_RELU);
        if (n->kind == DT_LAYER_ADD && n->relu && !n->bn) COUNT(P_ADD_RELU);
        if (n->ow[0] || n->ow[1])
            COUNT(n->kind == DT_LAYER_ADD ? P_OW_ADD : n->kind == DT_LAYER_LINEAR ? P_OW_LINEAR : n->kind == DT_LAYER_BATCHNORM ? P_OW_BN : P_OW_CONV);
    }
}

/* ---- the dump for tests/diff_torch.py ---- */
static FILE *dump_bin;
/* n words of `size` bytes (4 or 8) from p, little-endian as every fixture (dtrain/core/base.h: dt__le32) */
static void dump_le(const void *p, size_t size, size_t n) {
    unsigned char buf[4096];
    const unsigned char *b = (const unsigned char *)p;
    if (!DT__BIG_ENDIAN) { fwrite(p, size, n, dump_bin); return; }
    while (n > 0) {
        size_t k = n < sizeof buf / size ? n : sizeof buf / size;
        memcpy(buf, b, k * size);
        if (size == 4) dt__le32(buf, k); else dt__le64(buf, k);
        fwrite(buf, size, k, dump_bin);
        b += k * size; n -= k;
    }
}
static void dump_rec(const char *name, const float *data, int ndim, const int64_t *dims) {
    uint32_t len = (uint32_t)strlen(name), nd = (uint32_t)ndim;
    int64_t cnt = 1;
    int i;
    if (!dump_bin) return;
    for (i = 0; i < ndim; i++) cnt *= dims[i];
    dump_le(&len, 4, 1); fwrite(name, 1, len, dump_bin); dump_le(&nd, 4, 1);
    dump_le(dims, 8, (size_t)ndim); dump_le(data, 4, (size_t)cnt);
}
static void dump_vec(const char *name, int k, const float *data, int64_t n) {
    char nm[96];
    if (k >= 0) snprintf(nm, sizeof nm, "%s%d", name, k);
    else snprintf(nm, sizeof nm, "%s", name);
    dump_rec(nm, data, 1, &n);
}
static int dump_open(const char *dir, const graph *G, const dt_model *m) {
    char path[600];
    FILE *t;
    int i;
    snprintf(path, sizeof path, "%s/g%04d.txt", dir, G->index);
    if (!(t = fopen(path, "w"))) { printf("    cannot write %s: %s\n", path, strerror(errno)); return -1; }
    fprintf(t, "graph %d seed %llu\n", G->index, (unsigned long long)G->seed);
    fprintf(t, "input %lld %lld %lld batch %lld classes %lld mode %s\n", (long long)G->c, (long long)G->h, (long long)G->w,
            (long long)G->batch, (long long)G->classes, G->eval ? "eval" : "train");
    for (i = 1; i <= G->nn; i++) {
        const gnode *g = &G->node[i];
        fprintf(t, "node %d %s in %d", i, gop_name[g->op], g->in0);
        if (g->op == G_CONV)
            fprintf(t, " oc %lld k %lld %lld s %lld %lld p %lld %lld bias %d", (long long)g->oc, (long long)g->kh, (long long)g->kw,
                    (long long)g->sh, (long long)g->sw, (long long)g->ph, (long long)g->pw, g->bias);
        if (g->op == G_MAXPOOL || g->op == G_AVGPOOL)
            fprintf(t, " k %lld %lld s %lld %lld p %lld %lld", (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw,
                    (long long)g->ph, (long long)g->pw);
        if (g->op == G_BN) fprintf(t, " eps %g momentum %g", (double)m->nodes[i].eps, (double)m->nodes[i].momentum);
        if (g->op == G_LINEAR) fprintf(t, " out %lld bias %d", (long long)g->oc, g->bias);
        if (g->op == G_ADD) fprintf(t, " %d", g->in1);
        if (g->op == G_PAD) fprintf(t, " oc %lld s %lld", (long long)g->oc, (long long)g->sh);
        if (g->op == G_DROPOUT) fprintf(t, " p %g", (double)g->p);
        fprintf(t, "\n");
    }
    for (i = 0; i < DIFF_STEPS; i++) {
        if (i < 2)
            fprintf(t, "step %d sgd lr %g momentum %g dampening 0 nesterov %d wd %g\n", i, 0.05, (double)G->momentum, G->nesterov,
                    (double)G->wd);
        else
            fprintf(t, "step %d adam lr %g beta1 0.9 beta2 0.999 eps 1e-08 wd %g decoupled %d\n", i, 1e-3, (double)G->adam_wd, G->adamw);
    }
    for (i = 0; i < dt_model_param_tensors(m); i++) {
        dt_param_info p = dt_model_param_info(m, i);
        fprintf(t, "param %s node %d offset %lld count %lld\n", p.name, p.node, (long long)p.offset, (long long)p.count);
    }
    for (i = 0; i < dt_model_buffer_tensors(m); i++) {
        dt_param_info p = dt_model_buffer_info(m, i);
        fprintf(t, "buffer %s node %d offset %lld count %lld\n", p.name, p.node, (long long)p.offset, (long long)p.count);
    }
    fclose(t);
    snprintf(path, sizeof path, "%s/g%04d.bin", dir, G->index);
    if (!(dump_bin = fopen(path, "wb"))) { printf("    cannot write %s: %s\n", path, strerror(errno)); return -1; }
    fwrite("DTFIX001", 1, 8, dump_bin);
    return 0;
}

static const char *tiers_named;   /* --tiers: a comma-separated list, or NULL for every tier this CPU runs */
static int tier_on(int k) {
    const char *t = tiers_named;
    size_t n = strlen(dt__kernels[k]->name);
    if (!dt__kernel_ok(k)) return 0;
    while (t && *t) {
        if (!strncmp(t, dt__kernels[k]->name, n) && (t[n] == ',' || t[n] == '\0')) return 1;
        t = strchr(t, ',');
        if (t) t++;
    }
    return !tiers_named;
}
/* ---- one graph ---- */
static const char *dump_dir;
static void run_graph(const graph *G) {
    dt_model *ref, *pert, *fast;
    dt_optim *oref = NULL, *opert = NULL, *ofast = NULL;
    state S, P;
    float *x, *xp;
    int32_t *y;
    int64_t nx = G->batch * G->c * G->h * G->w, i;
    int step, k, t, default_tier = 0;
    double zeros = dt__tap_min_zeros;
    int64_t min_len = dt__tap_min_len;
    cur_graph = G;
    while (dt__kernels[default_tier] != dt__pick_kernel()) default_tier++;
    ref = build(G, &ref_ops);
    pert = build(G, &ref32_ops);
    fast = build(G, &fast_ops);
    if (!ref || !pert || !fast) {
        dt_t_checks_failed++;
        printf("    graph %d (--seed %llu --graph %d) could not be built: %s\n", G->index, (unsigned long long)G->seed, G->index,
               dt_last_error());
        dt_model_destroy(ref); dt_model_destroy(pert); dt_model_destroy(fast);
        return;
    }
    if (verbose)
        printf("    graph %d: [%lld, %lld, %lld] x %lld, %d nodes, %.2g MACs%s%s%s\n", G->index, (long long)G->c, (long long)G->h,
               (long long)G->w, (long long)G->batch, G->nn, G->macs, G->eval ? ", eval" : "", G->shift_off ? ", no shifted rows" : "",
               G->taps_all ? ", taps everywhere" : "");
    x = (float *)xmalloc(4 * nx); xp = (float *)xmalloc(4 * nx);
    y = (int32_t *)xmalloc(4 * G->batch);
    for (i = 0; i < nx; i++) x[i] = runi();
    for (i = 0; i < G->batch; i++) y[i] = (int32_t)rint_(0, G->classes - 1);
    memcpy(xp, x, 4 * (size_t)nx);
    perturb(xp, nx);
    if (dump_dir && dump_open(dump_dir, G, fast) == 0) {
        int64_t d4[4] = {G->batch, G->c, G->h, G->w}, nb = G->batch;
        float *yf = (float *)xmalloc(4 * G->batch);
        for (i = 0; i < G->batch; i++) yf[i] = (float)y[i];
        dump_rec("x", x, 4, d4);
        dump_rec("labels", yf, 1, &nb);
        free(yf);
    }
    for (step = 0; step < DIFF_STEPS; step++) {
        result RR, RP, RQ, RF;
        double tol;
        if (step == 0 || step == 2) {   /* SGD for steps 0 and 1, Adam for 2 and 3, each from its own fresh state */
            dt_optim_destroy(oref); dt_optim_destroy(opert); dt_optim_destroy(ofast);
            oref = optim_for(G, ref, step); opert = optim_for(G, pert, step); ofast = optim_for(G, fast, step);
            if (!oref || !opert || !ofast) { CHECK(0); break; }
        }
        {
            state now;
            state_get(&now, ref, oref);
            state_copy(&S, &now);
            state_copy(&P, &now);
        }
        perturb(P.params, P.np); perturb(P.bufs, P.nb); perturb(P.opt, P.nopt);
        run_step(G, pert, opert, &P, xp, y, step, &RP);
        run_step(G, pert, opert, &S, x, y, step, &RQ);
        run_step(G, ref, oref, &S, x, y, step, &RR);   /* last: ref's state is the next step's */
        if (dump_dir && dump_bin) {
            float st[256];
            dump_vec("p", step, S.params, S.np); dump_vec("b", step, S.bufs, S.nb); dump_vec("o", step, S.opt, S.nopt);
            for (i = 0; i < S.ntensors && i < 256; i++) st[i] = (float)S.steps[i];
            dump_vec("ost", step, st, S.ntensors);
        }
        for (k = 0; k < DT__NKERNELS; k++) {
            if (!tier_on(k)) continue;
            use_tier(k);
            dt__shift_off = G->shift_off;
            if (G->taps_all) { dt__tap_min_zeros = 0.0; dt__tap_min_len = 0; }
            run_step(G, fast, ofast, &S, x, y, step, &RF);
            dt__shift_off = 0; dt__tap_min_zeros = zeros; dt__tap_min_len = min_len;
            if (step == 0) count_plan(fast);
            steps_run[k]++;
            pert2 = RQ.logits;
            tol = compare("logits", RF.logits, RR.logits, RP.logits, RR.nlogits, step, 0.0, 0.0);
            /* the loss moves at most twice as far as its logits (the mean of z_y - logsumexp z, or of log-probabilities) */
            pert2 = &RQ.loss;
            compare("loss", &RF.loss, &RR.loss, &RP.loss, 1, step, 0.0, 2.0 * tol);
            for (t = 0; t < dt_model_buffer_tensors(ref); t++) {
                dt_param_info b = dt_model_buffer_info(ref, t);
                pert2 = RQ.bufs + b.offset;
                compare(b.name, RF.bufs + b.offset, RR.bufs + b.offset, RP.bufs + b.offset, b.count, step, maxabs(RR.bufs, S.nb), 0.0);
            }
            pert2 = RQ.eval;
            if (RF.eval) compare("eval-mode logits", RF.eval, RR.eval, RP.eval, RR.nlogits, step, 0.0, 0.0);
            if (memcmp(RF.relu, RR.relu, 4 * (size_t)RR.nrelu) || memcmp(RF.argmax, RR.argmax, 4 * (size_t)RR.nargmax)) {
                flips_skipped[k]++;   /* a ReLU or pooling decided otherwise within rounding: the gradients differ */
            } else {
                pert2 = RQ.dx;
                double gfam = maxabs(RR.grads, S.np) > maxabs(RR.dx, RR.ndx) ? maxabs(RR.grads, S.np) : maxabs(RR.dx, RR.ndx);
                compare("input gradient", RF.dx, RR.dx, RP.dx, RR.ndx, step, gfam, 0.0);
                for (t = 0; t < dt_model_param_tensors(ref); t++) {
                    dt_param_info p = dt_model_param_info(ref, t);
                    char what[128];
                    snprintf(what, sizeof what, "%s gradient", p.name);
                    pert2 = RQ.grads + p.offset;
                    compare(what, RF.grads + p.offset, RR.grads + p.offset, RP.grads + p.offset, p.count, step, gfam, 0.0);
                }
                check_step(G, fast, &S, &RF, step);
            }
            if (dump_bin && k == default_tier) {
                char nm[32];
                dump_vec("logits", step, RF.logits, RF.nlogits); dump_vec("loss", step, &RF.loss, 1);
                dump_vec("grads", step, RF.grads, S.np); dump_vec("dx", step, RF.dx, RF.ndx);
                dump_vec("bufs", step, RF.bufs, S.nb); dump_vec("pnew", step, RF.params, S.np);
                dump_vec("relu", step, RF.relu, RF.nrelu); dump_vec("argmax", step, RF.argmax, RF.nargmax);
                if (RF.eval) dump_vec("eval", -1, RF.eval, RF.nlogits);
                for (t = 1, i = 0; t < fast->nnodes; t++)   /* the masks of the training pass (the eval pass after
                                                               step 3 overwrote the nodes' with ones) */
                    if (fast->nodes[t].kind == DT_LAYER_DROPOUT) {
                        snprintf(nm, sizeof nm, "mask%d_", step);
                        dump_vec(nm, t, RF.drop + i, G->batch * fast->nodes[t].size);
                        i += G->batch * fast->nodes[t].size;
                    }
            }
            result_free(&RF);
        }
        DT__ATOMIC_STORE(&dt__kernel_chosen, dt__kernels[default_tier]);
        result_free(&RR); result_free(&RP); result_free(&RQ);
        state_free(&S); state_free(&P);
    }
    if (dump_bin) { fclose(dump_bin); dump_bin = NULL; }
    dt_optim_destroy(oref); dt_optim_destroy(opert); dt_optim_destroy(ofast);
    dt_model_destroy(ref); dt_model_destroy(pert); dt_model_destroy(fast);
    free(x); free(xp); free(y);
}

/* 1 when tier k has path p at all */
static int path_exists(int k, int p) {
    const dt__kernel *o = dt__kernels[k];
    if (p <= P_SHIFT_WGRAD_ONLY) return o->conv_fwd != NULL;
    if (p == P_K_COL_SPAN) return o->col_span != NULL;
    if (p == P_K_PACK_A8) return o->pack_a8 != NULL;
    if (p == P_K_PACK_BT) return o->pack_bt != NULL;
    if (p == P_K_COL2IM) return o->col2im != NULL;
    if (p == P_K_MAXPOOL2) return o->maxpool2 != NULL;
    if (p == P_K_BN_SUMS) return o->bn_sums != NULL;
    return 1;
}
static int all_taken(void) {
    int k, p;
    for (k = 0; k < DT__NKERNELS; k++)
        for (p = 0; p < P_COUNT && tier_on(k); p++)
            if (path_exists(k, p) && !taken[k][p]) return 0;
    return 1;
}

int main(int argc, char **argv) {
    int graphs = getenv("DT_TEST_QUICK") && atoi(getenv("DT_TEST_QUICK")) ? DIFF_GRAPHS_QUICK : DIFF_GRAPHS, only = -1, i, k, p, ran;
    uint64_t seed = 20261127;
    double t0;
    if (getenv("DT_DIFF_GRAPHS")) graphs = atoi(getenv("DT_DIFF_GRAPHS"));
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--graphs") && i + 1 < argc) graphs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--graph") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump_dir = argv[++i];
        else if (!strcmp(argv[i], "--tiers") && i + 1 < argc) tiers_named = argv[++i];
        else if (!strcmp(argv[i], "--verbose")) verbose++;
        else {
            fprintf(stderr, "usage: test_diff [--graphs N] [--seed S] [--graph I] [--tiers T,T...] [--dump DIR] [--verbose]\n");
            return 2;
        }
    }
    for (k = 0; k < DT__NKERNELS && tiers_named; k++) if (tier_on(k)) break;
    if (k == DT__NKERNELS) {
        fprintf(stderr, "test_diff: --tiers %s names no tier this CPU runs\n", tiers_named);
        return 2;
    }
    printf("test_diff: %d graphs or more from seed %llu on the tiers", only >= 0 ? 1 : graphs, (unsigned long long)seed);
    for (k = 0; k < DT__NKERNELS; k++) if (tier_on(k)) printf(" %s", dt__kernels[k]->name);
    printf(" (%d threads)\n", dt_cpu_threads());
    make_tables();
    wrap_kernels();
    t0 = dt_time_now();
    dt_t_checks_failed = 0;
    /* the run's graphs, and then more (up to DIFF_GRAPHS_MAX) while a fast path is still to be taken */
    for (i = only >= 0 ? only : 0; only >= 0 ? i == only : i < graphs || (!dump_dir && i < DIFF_GRAPHS_MAX && !all_taken()); i++) {
        graph G;
        gmake(&G, seed, i);
        run_graph(&G);
    }
    ran = only >= 0 ? 1 : i;
    if (dt_t_checks_failed) { dt_t_failed++; printf("FAIL fast paths against the reference on %d random graphs\n", ran); }
    else { dt_t_passed++; printf("ok   fast paths against the reference on %d random graphs (%.1f s)\n", ran, dt_time_now() - t0); }
    for (k = 0; k < DT__NKERNELS; k++) {
        int missing = 0;
        if (!tier_on(k)) continue;
        printf("     %-8s %lld comparisons, worst relative error %.3g (of a tensor with a spread under 1e-4 of it, not all "
               "rounding), worst difference / tolerance %.3g (%s); %lld of %lld steps' gradients left out for a ReLU or pooling decided within "
               "rounding\n", dt__kernels[k]->name, (long long)compared[k],
               worst_err[k], worst_ratio[k], worst_what[k][0] ? worst_what[k] : "-", (long long)flips_skipped[k], (long long)steps_run[k]);
        if (verbose) {
            printf("     %-8s difference / tolerance:", dt__kernels[k]->name);
            for (p = 0; p < 8; p++) printf(" %s1e%d: %lld", p ? "<" : "<=", p - 6, (long long)ratio_hist[k][p]);
            printf("\n");
        }
        if (only >= 0 || dump_dir) continue;   /* one graph, or a dump for PyTorch: the paths are another run's to check */
        dt_t_checks_failed = 0;
        for (p = 0; p < P_COUNT; p++) {
            if (path_exists(k, p) && !taken[k][p]) {
                missing++;
                dt_t_checks_failed++;
                printf("    %s: no graph took \"%s\"\n", dt__kernels[k]->name, path_name[p]);
            }
        }
        if ((double)flips_skipped[k] > DIFF_FLIPS_MAX * (double)steps_run[k]) {
            dt_t_checks_failed++;
            printf("    %s: %lld of %lld steps left out, more than %.0f%%\n", dt__kernels[k]->name, (long long)flips_skipped[k],
                   (long long)steps_run[k], 100.0 * DIFF_FLIPS_MAX);
        }
        if (dt_t_checks_failed) { dt_t_failed++; printf("FAIL every fast path taken on %s (%d missing)\n", dt__kernels[k]->name, missing); }
        else { dt_t_passed++; printf("ok   every fast path taken on %s\n", dt__kernels[k]->name); }
    }
    return dt_t_summary();
}
