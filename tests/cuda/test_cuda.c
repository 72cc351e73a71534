/* test_cuda.c - the GPU backend against the CPU: every op of dt_cuda_ops() on the same random inputs as
   dt_cpu_ops() (forward and backward; within 1e-4 relative, 1e-3 for sums over many elements; masks, argmax
   indices and counts exactly), its error reports, two training steps of every zoo model on the GPU and on
   the CPU (VGG-11 within a deep network's tolerance, see test_zoo_steps), and DDP with 2 and 4 local ranks
   sharing one GPU against one rank with the whole batch.
   Without a GPU every test reports "skip" (counted as skipped, not passed). --probe: exit status 0 when
   there is a GPU, 1 when not.
   Built with -DDT_USE_CUDA and linked with dtrain_cuda.cu's object (make test-cuda), or with the host
   emulation of the kernels (tests/cuda/emulate.cc; tests/run.sh section 2b), which has one "GPU". */
#define DTRAIN_IMPLEMENTATION
#include "../../dtrain.h"
#include "../dt_test.h"

#ifndef DT_USE_CUDA
#error "test_cuda.c needs -DDT_USE_CUDA and dtrain_cuda.cu's object (make test-cuda)"
#endif

static dt_cuda *G;              /* the context every op test runs on */
static const dt_ops *GPU, *CPU;
static int quick;               /* DT_TEST_QUICK=1: smaller models and shapes (emulated, sanitized runs) */

/* ---- buffers on both sides: h is the CPU op's, d the GPU op's; both start equal ------------------ */

typedef struct buf { float *h, *d; int64_t n; } buf;
typedef struct ibuf { int32_t *h, *d; int64_t n; } ibuf;

static buf make(int64_t n, float lo, float hi) {
    buf b;
    b.n = n;
    b.h = (float *)malloc(sizeof(float) * (size_t)(n + 1));
    b.d = (float *)GPU->alloc(G, (int64_t)sizeof(float) * (n + 1));
    if (!b.h || !b.d) { printf("    out of memory for %lld floats\n", (long long)n); exit(1); }
    dt_t_fill(b.h, n, lo, hi);
    GPU->upload(G, b.d, b.h, (int64_t)sizeof(float) * n);
    return b;
}
static buf rnd(int64_t n) { return make(n, -1.0f, 1.0f); }
static buf zeros(int64_t n) { return make(n, 0.0f, 0.0f); }
static ibuf labels(int64_t n, int64_t k) {
    ibuf b;
    int64_t i;
    b.n = n;
    b.h = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n + 1));
    b.d = (int32_t *)GPU->alloc(G, (int64_t)sizeof(int32_t) * (n + 1));
    if (!b.h || !b.d) { printf("    out of memory for %lld labels\n", (long long)n); exit(1); }
    for (i = 0; i < n; i++) b.h[i] = (int32_t)(dt_t_rand(0.0f, (float)k) * 0.999f);
    GPU->upload(G, b.d, b.h, (int64_t)sizeof(int32_t) * n);
    return b;
}
static void drop(buf *b) { free(b->h); GPU->free(G, b->d); }
static void idrop(ibuf *b) { free(b->h); GPU->free(G, b->d); }

/* The GPU's copy against the CPU's, within tol (relative, infinity norm). */
static void same(const buf *b, double tol, const char *what) {
    float *got = (float *)malloc(sizeof(float) * (size_t)(b->n + 1));
    if (!got) { CHECK(got != NULL); return; }
    GPU->download(G, got, b->d, (int64_t)sizeof(float) * b->n);
    CHECK_CLOSE(got, b->h, b->n, tol, what);
    free(got);
}
/* bit for bit (masks, copies) */
static void exact(const buf *b, const char *what) {
    float *got = (float *)malloc(sizeof(float) * (size_t)(b->n + 1));
    if (!got) { CHECK(got != NULL); return; }
    GPU->download(G, got, b->d, (int64_t)sizeof(float) * b->n);
    if (memcmp(got, b->h, sizeof(float) * (size_t)b->n) != 0) { dt_t_checks_failed++; printf("    %s: not bit-identical\n", what); }
    free(got);
}
static void iexact(const ibuf *b, const char *what) {
    int32_t *got = (int32_t *)malloc(sizeof(int32_t) * (size_t)(b->n + 1));
    if (!got) { CHECK(got != NULL); return; }
    GPU->download(G, got, b->d, (int64_t)sizeof(int32_t) * b->n);
    if (memcmp(got, b->h, sizeof(int32_t) * (size_t)b->n) != 0) { dt_t_checks_failed++; printf("    %s: indices differ\n", what); }
    free(got);
}
static void scalar(double got, double want, double tol, const char *what) {
    double e = fabs(got - want) / (fabs(want) > 1e-30 ? fabs(want) : 1.0);
    if (!(e <= tol)) { dt_t_checks_failed++; printf("    %s: %.9g on the GPU, %.9g on the CPU (relative error %.3g)\n", what, got, want, e); }
}
#define SYNC() CHECK_OK(GPU->sync(G))
#define TOL 1e-4
#define TOL_SUM 1e-3
#define TOL_DEEP 1e-2   /* a deep network's gradients, where batch norm's backward amplifies rounding */

/* ---- ops ---------------------------------------------------------------------------------------- */

static void test_memory_and_vectors(void) {
    int64_t n = 1000;
    buf a = rnd(n), b = rnd(n), y = rnd(n), z = zeros(n);
    void *p0 = GPU->alloc(G, 0);   /* 0 bytes: a valid pointer, as the CPU's */
    CHECK(p0 != NULL);
    GPU->free(G, p0);
    CPU->copy(NULL, z.h, a.h, n); GPU->copy(G, z.d, a.d, n);
    exact(&z, "copy");
    CPU->fill(NULL, z.h, n - 1, 0.25f); GPU->fill(G, z.d, n - 1, 0.25f);
    exact(&z, "fill");
    CPU->scale(NULL, a.h, n, -1.5f); GPU->scale(G, a.d, n, -1.5f);
    same(&a, TOL, "scale");
    CPU->axpy(NULL, y.h, b.h, n, 0.3f); GPU->axpy(G, y.d, b.d, n, 0.3f);
    same(&y, TOL, "axpy");
    CPU->add(NULL, z.h, a.h, b.h, n); GPU->add(G, z.d, a.d, b.d, n);
    same(&z, TOL, "add");
    SYNC();
    drop(&a); drop(&b); drop(&y); drop(&z);
}

/* every transpose combination, odd sizes, row strides wider than the rows, beta 0 over NaN (never read),
   beta 1 and 0.5, and K = 0 */
static void test_gemm(void) {
    /* the last two sum over K in slices (dt__cu_gemm_split): 9 of 1112 (the last 1104), and 8 of 1025 (the last 1018) */
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 130, 9}, {5, 3, 0}, {8, 12, 10000},
                                        {3, 5, 8193}};
    int s, ta, tb, bi;
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++)
                for (bi = 0; bi < 3; bi++) {
                    int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                    int64_t lda = ac + 3, ldb = bc + 1, ldc = N + 2;
                    float beta = bi == 0 ? 0.0f : bi == 1 ? 1.0f : 0.5f;
                    buf A = rnd(ar * lda + 1), B = rnd(br * ldb + 1), C = rnd(M * ldc);
                    char what[96];
                    if (beta == 0.0f) {   /* NaN in C: beta 0 must not read it */
                        int64_t i;
                        for (i = 0; i < C.n; i++) C.h[i] = NAN;
                        GPU->upload(G, C.d, C.h, (int64_t)sizeof(float) * C.n);
                    }
                    CPU->gemm(NULL, ta, tb, M, N, K, 1.5f, A.h, lda, B.h, ldb, beta, C.h, ldc);
                    GPU->gemm(G, ta, tb, M, N, K, 1.5f, A.d, lda, B.d, ldb, beta, C.d, ldc);
                    {   /* compare the M x N entries only: the padding of C's rows is nobody's */
                        float *got = (float *)malloc(sizeof(float) * (size_t)C.n), *g2, *w2;
                        int64_t i, j;
                        g2 = (float *)malloc(sizeof(float) * (size_t)(M * N + 1));
                        w2 = (float *)malloc(sizeof(float) * (size_t)(M * N + 1));
                        GPU->download(G, got, C.d, (int64_t)sizeof(float) * C.n);
                        for (i = 0; i < M; i++)
                            for (j = 0; j < N; j++) { g2[i * N + j] = got[i * ldc + j]; w2[i * N + j] = C.h[i * ldc + j]; }
                        snprintf(what, sizeof what, "gemm %lldx%lldx%lld ta %d tb %d beta %g", (long long)M, (long long)N,
                                 (long long)K, ta, tb, (double)beta);
                        CHECK_CLOSE(g2, w2, M * N, TOL, what);
                        free(got); free(g2); free(w2);
                    }
                    drop(&A); drop(&B); drop(&C);
                }
    SYNC();
}

static void test_rows(void) {
    int64_t rows = 37, cols = 11;
    buf y = rnd(rows * cols), b = rnd(cols), db = rnd(cols);
    CPU->add_row_bias(NULL, y.h, b.h, rows, cols); GPU->add_row_bias(G, y.d, b.d, rows, cols);
    same(&y, TOL, "add_row_bias");
    CPU->sum_rows_bwd(NULL, db.h, y.h, rows, cols); GPU->sum_rows_bwd(G, db.d, y.d, rows, cols);
    same(&db, TOL, "sum_rows_bwd");
    SYNC();
    drop(&y); drop(&b); drop(&db);
}

/* geometries: n c h w, out channels, kernel kh kw, strides sh sw, padding ph pw; the last four rectangular
   in every way (1 x 3 at stride 1 x 2 padded 0 x 1, 3 x 1 at 2 x 1 padded 1 x 0, 5 x 2 at 2 x 3 padded 2 x 1,
   2 x 5 at 3 x 1 padded 1 x 2) */
static const int64_t geoms[][11] = {
    {2, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1}, {2, 2, 8, 8, 3, 3, 3, 2, 2, 1, 1}, {1, 3, 9, 7, 2, 5, 5, 2, 2, 2, 2},
    {3, 1, 6, 6, 2, 1, 1, 1, 1, 0, 0}, {2, 2, 5, 6, 2, 2, 3, 2, 2, 0, 0}, {1, 2, 4, 4, 3, 3, 3, 3, 3, 1, 1},
    {2, 3, 7, 9, 4, 1, 3, 1, 2, 0, 1}, {2, 2, 9, 7, 3, 3, 1, 2, 1, 1, 0}, {1, 2, 11, 8, 3, 5, 2, 2, 3, 2, 1},
    {2, 2, 8, 11, 2, 2, 5, 3, 1, 1, 2}};
/* geometry i (a padding past half the kernel on an axis, which pooling refuses, is dropped there) */
static dt_conv_geom geom(int i) {
    dt_conv_geom g;
    memset(&g, 0, sizeof g);
    g.n = geoms[i][0]; g.c = geoms[i][1]; g.h = geoms[i][2]; g.w = geoms[i][3]; g.oc = geoms[i][4];
    g.kh = geoms[i][5]; g.kw = geoms[i][6]; g.sh = geoms[i][7]; g.sw = geoms[i][8]; g.ph = geoms[i][9]; g.pw = geoms[i][10];
    if (g.ph * 2 > g.kh) g.ph = 0;
    if (g.pw * 2 > g.kw) g.pw = 0;
    CHECK_OK(dt_conv_geom_resolve(&g));
    return g;
}
#define NGEOMS ((int)(sizeof geoms / sizeof geoms[0]))

static void test_conv_helpers(void) {
    int i;
    for (i = 0; i < NGEOMS; i++) {
        dt_conv_geom g = geom(i);
        int64_t S = g.oh * g.ow, rows = g.c * g.kh * g.kw;
        buf x = rnd(g.n * g.c * g.h * g.w), col = zeros(rows * g.n * S), dx = rnd(x.n);
        buf t = rnd(g.oc * g.n * S), y = zeros(g.n * g.oc * S), b = rnd(g.oc), t2 = zeros(t.n), db = rnd(g.oc);
        CPU->im2col(NULL, &g, x.h, col.h); GPU->im2col(G, &g, x.d, col.d);
        exact(&col, "im2col");
        CPU->col2im_bwd(NULL, &g, col.h, dx.h); GPU->col2im_bwd(G, &g, col.d, dx.d);
        same(&dx, TOL, "col2im_bwd");
        CPU->cs_to_ncs(NULL, y.h, t.h, b.h, g.n, g.oc, S); GPU->cs_to_ncs(G, y.d, t.d, b.d, g.n, g.oc, S);
        exact(&y, "cs_to_ncs with bias");
        CPU->cs_to_ncs(NULL, y.h, t.h, NULL, g.n, g.oc, S); GPU->cs_to_ncs(G, y.d, t.d, NULL, g.n, g.oc, S);
        exact(&y, "cs_to_ncs");
        CPU->ncs_to_cs(NULL, t2.h, y.h, g.n, g.oc, S); GPU->ncs_to_cs(G, t2.d, y.d, g.n, g.oc, S);
        exact(&t2, "ncs_to_cs");
        CPU->channel_sum_bwd(NULL, db.h, y.h, g.n, g.oc, S); GPU->channel_sum_bwd(G, db.d, y.d, g.n, g.oc, S);
        same(&db, TOL, "channel_sum_bwd");
        SYNC();
        drop(&x); drop(&col); drop(&dx); drop(&t); drop(&y); drop(&b); drop(&t2); drop(&db);
    }
}

static void test_pooling(void) {
    int i;
    for (i = 0; i < NGEOMS; i++) {
        dt_conv_geom g = geom(i);
        int64_t in = g.n * g.c * g.h * g.w, out;
        buf x, y, dy, dx;
        ibuf idx;
        g.oc = g.c;
        out = g.n * g.c * g.oh * g.ow;
        x = rnd(in); y = zeros(out); dy = rnd(out); dx = rnd(in);
        idx = labels(out, 1);
        if (i % 2) {   /* ties: values from {0, 1, 2}, so the first maximum must win */
            int64_t j;
            for (j = 0; j < in; j++) x.h[j] = (float)(int)(dt_t_rand(0.0f, 2.999f));
            GPU->upload(G, x.d, x.h, (int64_t)sizeof(float) * in);
        }
        CPU->maxpool_fwd(NULL, &g, x.h, y.h, idx.h); GPU->maxpool_fwd(G, &g, x.d, y.d, idx.d);
        exact(&y, "maxpool_fwd");
        iexact(&idx, "maxpool_fwd argmax");
        CPU->maxpool_bwd(NULL, &g, dy.h, idx.h, dx.h); GPU->maxpool_bwd(G, &g, dy.d, idx.d, dx.d);
        same(&dx, TOL, "maxpool_bwd");
        CPU->avgpool_fwd(NULL, &g, x.h, y.h); GPU->avgpool_fwd(G, &g, x.d, y.d);
        same(&y, TOL, "avgpool_fwd");
        CPU->avgpool_bwd(NULL, &g, dy.h, dx.h); GPU->avgpool_bwd(G, &g, dy.d, dx.d);
        same(&dx, TOL, "avgpool_bwd");
        SYNC();
        drop(&x); drop(&y); drop(&dy); drop(&dx); idrop(&idx);
    }
    {   /* global average pooling */
        int64_t n = 3, c = 5, s = 49;
        buf x = rnd(n * c * s), y = zeros(n * c), dy = rnd(n * c), dx = rnd(n * c * s);
        CPU->gap_fwd(NULL, x.h, y.h, n, c, s); GPU->gap_fwd(G, x.d, y.d, n, c, s);
        same(&y, TOL, "gap_fwd");
        CPU->gap_bwd(NULL, dy.h, dx.h, n, c, s); GPU->gap_bwd(G, dy.d, dx.d, n, c, s);
        same(&dx, TOL, "gap_bwd");
        SYNC();
        drop(&x); drop(&y); drop(&dy); drop(&dx);
    }
}

static void test_activations(void) {
    int64_t n = 5000, rows = 13, k = 10;
    buf x = rnd(n), y = zeros(n), dy = rnd(n), dx = rnd(n), mask = zeros(n);
    buf lx = make(rows * k, -4.0f, 4.0f), ly = zeros(rows * k), ldy = rnd(rows * k), ldx = rnd(rows * k);
    CPU->relu_fwd(NULL, x.h, y.h, n); GPU->relu_fwd(G, x.d, y.d, n);
    exact(&y, "relu_fwd");
    CPU->relu_bwd(NULL, y.h, dy.h, dx.h, n); GPU->relu_bwd(G, y.d, dy.d, dx.d, n);
    same(&dx, TOL, "relu_bwd");
    CPU->dropout_fwd(NULL, x.h, y.h, mask.h, n, 0.3f, 0x1234567890abcdefULL);
    GPU->dropout_fwd(G, x.d, y.d, mask.d, n, 0.3f, 0x1234567890abcdefULL);
    exact(&mask, "dropout mask (the same hash on both)");
    same(&y, TOL, "dropout_fwd");
    CPU->mul_bwd(NULL, dy.h, mask.h, dx.h, n); GPU->mul_bwd(G, dy.d, mask.d, dx.d, n);
    same(&dx, TOL, "mul_bwd");
    CPU->log_softmax_fwd(NULL, lx.h, ly.h, rows, k); GPU->log_softmax_fwd(G, lx.d, ly.d, rows, k);
    same(&ly, TOL, "log_softmax_fwd");
    CPU->log_softmax_bwd(NULL, ly.h, ldy.h, ldx.h, rows, k); GPU->log_softmax_bwd(G, ly.d, ldy.d, ldx.d, rows, k);
    same(&ldx, TOL, "log_softmax_bwd");
    SYNC();
    drop(&x); drop(&y); drop(&dy); drop(&dx); drop(&mask); drop(&lx); drop(&ly); drop(&ldy); drop(&ldx);
}

/* train and eval, forward and backward (with and without dx), 2-D and 1-D, a batch of one */
static void test_batchnorm(void) {
    static const int64_t shapes[][3] = {{4, 3, 10}, {16, 5, 1}, {1, 2, 1}, {8, 4, 256}, {3, 2, 201}};   /* 256, 201: in parts */
    int s, training, with_dx;
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (training = 1; training >= 0; training--) {
            int64_t n = shapes[s][0], c = shapes[s][1], sp = shapes[s][2], cnt = n * c * sp;
            buf x = make(cnt, -2.0f, 3.0f), y = zeros(cnt), gamma = make(c, 0.5f, 1.5f), beta = rnd(c);
            buf rm = rnd(c), rv = make(c, 0.5f, 2.0f), sm = zeros(c), si = zeros(c), dy = rnd(cnt);
            double tol = cnt > 4096 ? TOL_SUM : TOL;
            char what[64];
            CPU->bn_fwd(NULL, training, x.h, y.h, n, c, sp, gamma.h, beta.h, rm.h, rv.h, 1e-5f, 0.1f, sm.h, si.h);
            GPU->bn_fwd(G, training, x.d, y.d, n, c, sp, gamma.d, beta.d, rm.d, rv.d, 1e-5f, 0.1f, sm.d, si.d);
            snprintf(what, sizeof what, "bn_fwd %s [%lld, %lld, %lld]", training ? "train" : "eval", (long long)n,
                     (long long)c, (long long)sp);
            same(&y, tol, what);
            same(&rm, TOL, "bn_fwd running mean");
            same(&rv, TOL, "bn_fwd running var");
            same(&sm, TOL, "bn_fwd saved mean");
            same(&si, TOL, "bn_fwd saved 1/std");
            for (with_dx = 0; with_dx < 2; with_dx++) {
                buf dx = rnd(cnt), dg = rnd(c), db = rnd(c);
                CPU->bn_bwd(NULL, training, x.h, dy.h, with_dx ? dx.h : NULL, n, c, sp, gamma.h, sm.h, si.h, dg.h, db.h);
                GPU->bn_bwd(G, training, x.d, dy.d, with_dx ? dx.d : NULL, n, c, sp, gamma.d, sm.d, si.d, dg.d, db.d);
                same(&dg, tol, "bn_bwd dgamma");
                same(&db, tol, "bn_bwd dbeta");
                if (with_dx) same(&dx, tol, "bn_bwd dx");
                drop(&dx); drop(&dg); drop(&db);
            }
            SYNC();
            drop(&x); drop(&y); drop(&gamma); drop(&beta); drop(&rm); drop(&rv); drop(&sm); drop(&si); drop(&dy);
        }
}

static void test_pad_shortcut(void) {
    static const int64_t shapes[][6] = {{2, 4, 6, 6, 8, 2}, {2, 3, 5, 5, 5, 1}, {1, 2, 5, 7, 6, 2}};
    int s;
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int64_t n = shapes[s][0], c = shapes[s][1], h = shapes[s][2], w = shapes[s][3], oc = shapes[s][4], st = shapes[s][5];
        int64_t oh = (h + st - 1) / st, ow = (w + st - 1) / st;
        buf x = rnd(n * c * h * w), y = rnd(n * oc * oh * ow), dy = rnd(y.n), dx = rnd(x.n);
        CPU->pad_shortcut_fwd(NULL, x.h, y.h, n, c, h, w, oc, st); GPU->pad_shortcut_fwd(G, x.d, y.d, n, c, h, w, oc, st);
        exact(&y, "pad_shortcut_fwd");
        CPU->pad_shortcut_bwd(NULL, dy.h, dx.h, n, c, h, w, oc, st); GPU->pad_shortcut_bwd(G, dy.d, dx.d, n, c, h, w, oc, st);
        same(&dx, TOL, "pad_shortcut_bwd");
        SYNC();
        drop(&x); drop(&y); drop(&dy); drop(&dx);
    }
}

static void test_losses(void) {
    int64_t n = 37, k = 10, i;
    buf x = make(n * k, -3.0f, 3.0f), logp = zeros(n * k), dx = rnd(n * k), t = rnd(n * k);
    ibuf y = labels(n, k);
    float lc = 0.0f, lg = 0.0f;
    int64_t cc = -1, cg = -2;
    CPU->softmax_xent(NULL, x.h, y.h, n, k, dx.h, &lc); GPU->softmax_xent(G, x.d, y.d, n, k, dx.d, &lg);
    scalar(lg, lc, 1e-5, "softmax_xent loss");
    same(&dx, TOL, "softmax_xent gradient");
    CPU->log_softmax_fwd(NULL, x.h, logp.h, n, k); GPU->log_softmax_fwd(G, x.d, logp.d, n, k);
    CPU->nll(NULL, logp.h, y.h, n, k, dx.h, &lc); GPU->nll(G, logp.d, y.d, n, k, dx.d, &lg);
    scalar(lg, lc, 1e-5, "nll loss");
    exact(&dx, "nll gradient");
    /* mse as the model calls it: the target in the gradient buffer, overwritten */
    CPU->mse(NULL, x.h, t.h, n * k, t.h, &lc); GPU->mse(G, x.d, t.d, n * k, t.d, &lg);
    scalar(lg, lc, 1e-5, "mse loss");
    same(&t, TOL, "mse gradient");
    for (i = 0; i < n * k; i++) x.h[i] = (float)(int)dt_t_rand(0.0f, 2.999f);   /* ties: the first maximum counts */
    GPU->upload(G, x.d, x.h, (int64_t)sizeof(float) * n * k);
    CPU->count_correct(NULL, x.h, y.h, n, k, &cc); GPU->count_correct(G, x.d, y.d, n, k, &cg);
    CHECK(cc == cg);
    SYNC();
    drop(&x); drop(&logp); drop(&dx); drop(&t); idrop(&y);
}

static void test_sum_squares(void) {
    int64_t sizes[] = {1, 10, 4097, 3000001}, i;
    for (i = 0; i < 4; i++) {
        buf x = rnd(sizes[i]);
        double c = 0.0, g = 0.0;
        CPU->sum_squares(NULL, x.h, x.n, &c); GPU->sum_squares(G, x.d, x.n, &g);
        scalar(g, c, sizes[i] > 4096 ? TOL_SUM : TOL, "sum_squares");
        SYNC();
        drop(&x);
    }
}

/* two steps of each variant (the first step of momentum starts the buffer) */
static void test_optimizers(void) {
    int64_t n = 3001;
    int v, step;
    for (v = 0; v < 5; v++) {   /* plain, weight decay, momentum + dampening, nesterov, all */
        buf p = rnd(n), g = rnd(n), b = zeros(n);
        float mom = v >= 2 ? 0.9f : 0.0f, damp = v == 2 ? 0.1f : 0.0f, wd = (v == 1 || v == 4) ? 1e-2f : 0.0f;
        int nest = v >= 3;
        for (step = 0; step < 2; step++) {
            CPU->sgd_step(NULL, p.h, g.h, b.h, n, 0.05f, mom, damp, wd, nest, step == 0);
            GPU->sgd_step(G, p.d, g.d, b.d, n, 0.05f, mom, damp, wd, nest, step == 0);
        }
        same(&p, TOL, "sgd_step parameters");
        same(&b, TOL, "sgd_step momentum");
        SYNC();
        drop(&p); drop(&g); drop(&b);
    }
    for (v = 0; v < 3; v++) {   /* Adam, Adam with L2, AdamW */
        buf p = rnd(n), g = rnd(n), m = zeros(n), s2 = zeros(n);
        for (step = 0; step < 2; step++) {
            double t = step + 1;
            float ss = (float)(1e-3 / (1.0 - pow(0.9, t))), bc2 = (float)sqrt(1.0 - pow(0.999, t));
            float wd = v ? 1e-2f : 0.0f;
            CPU->adam_step(NULL, p.h, g.h, m.h, s2.h, n, 1e-3f, 0.9f, 0.999f, 1e-8f, wd, v == 2, ss, bc2);
            GPU->adam_step(G, p.d, g.d, m.d, s2.d, n, 1e-3f, 0.9f, 0.999f, 1e-8f, wd, v == 2, ss, bc2);
        }
        same(&p, TOL, "adam_step parameters");
        same(&m, TOL, "adam_step first moment");
        same(&s2, TOL, "adam_step second moment");
        SYNC();
        drop(&p); drop(&g); drop(&m); drop(&s2);
    }
}

/* A failure inside an op is kept and returned by sync, with the file and line, and stays. */
static void test_errors(void) {
    dt_cuda *cu = NULL;
    dt_cuda_desc d;
    float one = 1.0f;
    memset(&d, 0, sizeof d);
    d.device = dt_cuda_device_count() + 3;
    CHECK_ERR(dt_cuda_create(&cu, &d), DT_ERR_INVALID_ARG);
    CHECK(cu == NULL);
    CHECK_OK(dt_cuda_create(&cu, NULL));
    if (!cu) return;
    CHECK(strlen(dt_cuda_device_name(cu)) > 0);
    /* too large for cuBLAS's 32-bit sizes: refused before anything is read */
    dt_cuda_ops()->gemm(cu, 0, 0, (int64_t)1 << 33, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &one, 1);
    CHECK_ERR(dt_cuda_sync(cu), DT_ERR_UNSUPPORTED);
    CHECK(strstr(dt_last_error(), "dtrain_cuda.h:") != NULL);
    CHECK_ERR(dt_cuda_sync(cu), DT_ERR_UNSUPPORTED);   /* sticky */
    dt_cuda_destroy(cu);
    CHECK_ERR(dt_cuda_sync(NULL), DT_ERR_INVALID_ARG);
    dt_cuda_destroy(NULL);
}

/* ---- whole models ------------------------------------------------------------------------------- */

/* A zoo model on the CPU and the same one on the GPU (desc.ops NULL: a CUDA build's default, on a context
   the model makes), the same batch, two SGD steps with momentum and weight decay: the same loss, gradients,
   parameters, running statistics and outputs. Before the second step the CPU model takes the GPU's
   parameters and running statistics: both steps then start from the same point, so what is compared is
   each step's arithmetic. Left apart, the first step's rounding (about 3e-7 of the gradients) is amplified
   by a deep ReLU network, whose units near zero switch on one side and not the other: ResNet-20's second
   gradients then differ by up to 3e-3 between the GPU and the CPU, and by 4e-2 between two CPU tiers. */
/* |a - b|_2 / |b|_2: the relative error in the 2-norm, for VGG-11's gradients (see test_zoo_steps) */
static double relerr2(const float *a, const float *b, int64_t n) {
    double num = 0.0, den = 0.0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return num != num ? INFINITY : den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static void train_step(dt_zoo_model z, int64_t batch) {
    dt_model *mc = NULL, *mg = NULL;
    dt_optim *oc = NULL, *og = NULL;
    dt_model_desc d;
    dt_optim_desc od;
    int64_t in, np = 0, nb = 0, out, step;
    double ptol = z == DT_ZOO_VGG11 ? TOL_SUM : TOL;   /* parameters after a step (VGG-11: see test_zoo_steps) */
    float *x = NULL, *hc = NULL, *hg = NULL;
    int32_t *y = NULL;
    memset(&d, 0, sizeof d);
    d.seed = 7;
    d.ops = dt_cpu_ops();
    CHECK_OK(dt_zoo_create(&mc, z, 10, &d));
    d.ops = NULL;
    CHECK_OK(dt_zoo_create(&mg, z, 10, &d));
    if (!mc || !mg) goto done;
    memset(&od, 0, sizeof od);
    od.lr = 0.05f; od.momentum = 0.9f; od.weight_decay = 5e-4f;
    CHECK_OK(dt_optim_create(&oc, mc, &od));
    CHECK_OK(dt_optim_create(&og, mg, &od));
    if (!oc || !og) goto done;
    in = dt_model_node_size(mc, 0);
    out = dt_model_node_size(mc, dt_model_output_node(mc));
    dt_model_params(mc, &np);
    dt_model_buffers(mc, &nb);
    x = (float *)malloc(sizeof(float) * (size_t)(batch * in));
    y = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    hc = (float *)malloc(sizeof(float) * (size_t)(np + nb + batch * out + 1));
    hg = (float *)malloc(sizeof(float) * (size_t)(np + nb + batch * out + 1));
    if (!x || !y || !hc || !hg) { CHECK(0); goto done; }
    for (step = 0; step < 2; step++) {
        float lc = 0.0f, lg = 0.0f;
        int64_t i;
        dt_t_fill(x, batch * in, -1.0f, 1.0f);
        for (i = 0; i < batch; i++) y[i] = (int32_t)(i * 3 % 10);
        CHECK_OK(dt_model_forward(mc, x, batch));
        CHECK_OK(dt_model_forward(mg, x, batch));
        CHECK_OK(dt_model_loss_labels(mc, y, &lc));
        CHECK_OK(dt_model_loss_labels(mg, y, &lg));
        scalar(lg, lc, TOL, "loss");
        dt_model_zero_grad(mc);
        dt_model_zero_grad(mg);
        CHECK_OK(dt_model_backward(mc, NULL));
        CHECK_OK(dt_model_backward(mg, NULL));
        CHECK_OK(dt_model_get_grads(mc, hc, np));
        CHECK_OK(dt_model_get_grads(mg, hg, np));
        if (z != DT_ZOO_VGG11) CHECK_CLOSE(hg, hc, np, TOL_SUM, "parameter gradients");
        else {
            double e = relerr2(hg, hc, np);
            CHECK(e <= TOL_DEEP);
            if (!(e <= TOL_DEEP)) printf("    parameter gradients: relative error %.3g > %.1g in the 2-norm\n", e, TOL_DEEP);
        }
        CHECK_OK(dt_optim_step(oc));
        CHECK_OK(dt_optim_step(og));
        if (step == 0) {
            CHECK_OK(dt_model_get_params(mc, hc, np));
            CHECK_OK(dt_model_get_params(mg, hg, np));
            CHECK_CLOSE(hg, hc, np, ptol, "parameters after one step");
            CHECK_OK(dt_model_set_params(mc, hg, np));
            if (nb) {
                CHECK_OK(dt_model_get_buffers(mg, hg, nb));
                CHECK_OK(dt_model_set_buffers(mc, hg, nb));
            }
        }
    }
    CHECK_OK(dt_model_get_params(mc, hc, np));
    CHECK_OK(dt_model_get_params(mg, hg, np));
    CHECK_CLOSE(hg, hc, np, ptol, "parameters after two steps");
    if (nb) {
        CHECK_OK(dt_model_get_buffers(mc, hc, nb));
        CHECK_OK(dt_model_get_buffers(mg, hg, nb));
        CHECK_CLOSE(hg, hc, nb, TOL, "running statistics");
    }
    dt_model_set_mode(mc, DT_MODE_EVAL);   /* eval mode: running statistics, no dropout */
    dt_model_set_mode(mg, DT_MODE_EVAL);
    CHECK_OK(dt_model_forward(mc, x, batch));
    CHECK_OK(dt_model_forward(mg, x, batch));
    CHECK_OK(dt_model_get_output(mc, hc, batch * out));
    CHECK_OK(dt_model_get_output(mg, hg, batch * out));
    CHECK_CLOSE(hg, hc, batch * out, TOL_SUM, "outputs in eval mode");   /* deep sums: VGG-11 differs by 2e-4 */
done:
    free(x); free(y); free(hc); free(hg);
    dt_optim_destroy(oc); dt_optim_destroy(og);
    dt_model_destroy(mc); dt_model_destroy(mg);
}
static void test_simplecnn_step(void) { train_step(DT_ZOO_SIMPLE_CNN, quick ? 4 : 32); }
static void test_resnet20_step(void) { train_step(DT_ZOO_RESNET20, quick ? 2 : 32); }
/* the rest of the zoo: the MLPs, LeNet-5, the FedAvg CNN and VGG-11 (batch norm after 3x3 convolutions
   down to 2x2, max pooling, 9.2 million parameters). A deep network's first gradients come back through
   every batch norm, whose backward subtracts dy's projections on 1 and xhat: it cancels, and amplifies the
   rounding of the GEMMs above (fp32 sums of up to 65,536 terms, in cuBLAS's order on the GPU, in the CPU's
   blocks here) by an amount that depends on the input. Measured, GPU (or host emulation) against the CPU,
   2-norm, one step: on an H200, VGG-11 at batch 64 on one input 1.6e-6 over all gradients, on this test's
   inputs 2.0e-3 and 2.7e-3 (1.4e-4 in the parameters after a step); ResNet-20 at batch 32 9e-4, with
   1.4e-3 in the first convolution's output gradient; the host emulation, whose GEMM sums in double,
   3.5e-4 in VGG-11's first weight gradient. Every layer's forward output agreed within 2e-6. So VGG-11's
   gradients are compared in the 2-norm within TOL_DEEP and its parameters within TOL_SUM; a wrong op
   differs by far more. At batch 16 its last batch norm (4 values an image) makes it worse: two CPU tiers
   then differ by 4% in the largest element. The host emulation (DT_TEST_QUICK) leaves VGG-11 out: a
   minute of loops. */
static void test_zoo_steps(void) {
    static const dt_zoo_model z[] = {DT_ZOO_MLP, DT_ZOO_LENET5, DT_ZOO_FEDAVG_CNN, DT_ZOO_FEDAVG_2NN, DT_ZOO_VGG11};
    size_t i;
    for (i = 0; i < sizeof z / sizeof z[0]; i++) {
        int before = dt_t_checks_failed;
        if (z[i] == DT_ZOO_VGG11 && quick) continue;
        train_step(z[i], z[i] == DT_ZOO_VGG11 ? 64 : quick ? 2 : 16);
        if (dt_t_checks_failed != before) printf("    (in %s)\n", dt_zoo_name(z[i]));
    }
}

/* ---- DDP on one GPU ----------------------------------------------------------------------------- */

#define DDP_B 12          /* global batch: divisible by 2, 3 and 4 */
#define DDP_STEPS 3
#define DDP_IN (3 * 8 * 8)
static float ddp_x[DDP_B * DDP_STEPS * DDP_IN];
static int32_t ddp_y[DDP_B * DDP_STEPS];

/* a small CNN on the GPU: conv, relu, max pool, linear (no batchnorm: per-rank statistics would differ) */
static dt_result ddp_model(dt_model **m) {
    dt_model_desc d;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = 3; d.in_h = 8; d.in_w = 8; d.seed = 3;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_STATE;
    x = dt_maxpool2d(*m, dt_relu(*m, dt_conv2d(*m, dt_model_input(*m), 4, 3, 1, 1)), 2, 2, 0);
    dt_linear(*m, dt_flatten(*m, x), 5, 1);
    return dt_model_finalize(*m);
}

typedef struct ddp_job { int64_t np; float params[4][512]; } ddp_job;

static dt_result ddp_rank(dt_comm *c, void *arg) {
    ddp_job *j = (ddp_job *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c), s;
    int64_t share = DDP_B / p;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_optim_desc od;
    dt_result r;
    float loss;
    memset(&od, 0, sizeof od);
    od.lr = 0.1f; od.momentum = 0.9f;
#define T(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)
    T(ddp_model(&m));
    T(dt_optim_create(&o, m, &od));
    T(dt_ddp_create(&d, c, m, NULL));
    for (s = 0; s < DDP_STEPS; s++) {
        int64_t first = (int64_t)s * DDP_B + me * share;
        T(dt_model_forward(m, ddp_x + first * DDP_IN, share));
        T(dt_model_loss_labels(m, ddp_y + first, &loss));
        T(dt_ddp_backward(d, NULL, share, 1));
        T(dt_optim_step(o));
        dt_model_zero_grad(m);
    }
    T(dt_ddp_join(d, o));
    j->np = dt_model_param_count(m);
    T(j->np <= 512 ? dt_model_get_params(m, j->params[me], j->np) : DT_ERR_SHAPE);
done:
#undef T
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

static void test_ddp_one_gpu(void) {
    static ddp_job ref, job;
    dt_launch_desc ld;
    int ranks, r;
    dt_t_fill(ddp_x, DDP_B * DDP_STEPS * DDP_IN, -1.0f, 1.0f);
    for (r = 0; r < DDP_B * DDP_STEPS; r++) ddp_y[r] = (int32_t)(r * 7 % 5);
    memset(&ld, 0, sizeof ld);
    ld.ranks = 1;
    CHECK_OK(dt_launch_local(&ld, ddp_rank, &ref, NULL));   /* one rank, the whole batch */
    for (ranks = 2; ranks <= 4; ranks += 2) {
        memset(&job, 0, sizeof job);
        ld.ranks = ranks;
        CHECK_OK(dt_launch_local(&ld, ddp_rank, &job, NULL));
        for (r = 0; r < ranks; r++) {
            char what[64];
            snprintf(what, sizeof what, "DDP on %d ranks sharing the GPU, rank %d", ranks, r);
            CHECK(job.np == ref.np);
            CHECK_CLOSE(job.params[r], ref.params[0], ref.np, TOL, what);
        }
    }
}

int main(int argc, char **argv) {
    int n = dt_cuda_device_count();
    const char *q = getenv("DT_TEST_QUICK");
    dt_t_only = argc > 1 ? argv[1] : NULL;
    quick = q && *q && strcmp(q, "0") != 0;
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) {   /* exit status 0 when there is a GPU, for scripts */
        printf("%d GPU%s\n", n, n == 1 ? "" : "s");
        return n > 0 ? 0 : 1;
    }
    CPU = dt_cpu_ops();
    GPU = dt_cuda_ops();
    if (n == 0) dt_t_skip_why = "no GPU (dt_cuda_device_count() is 0)";
    else if (dt_cuda_create(&G, NULL) != DT_OK) { printf("FAIL dt_cuda_create: %s\n", dt_last_error()); return 1; }
    else printf("GPU %d of %d: %s\n", dt_cuda_device(G), n, dt_cuda_device_name(G));
    RUN(test_memory_and_vectors);
    RUN(test_gemm);
    RUN(test_rows);
    RUN(test_conv_helpers);
    RUN(test_pooling);
    RUN(test_activations);
    RUN(test_batchnorm);
    RUN(test_pad_shortcut);
    RUN(test_losses);
    RUN(test_sum_squares);
    RUN(test_optimizers);
    RUN(test_errors);
    RUN(test_simplecnn_step);
    RUN(test_resnet20_step);
    RUN(test_zoo_steps);
    RUN(test_ddp_one_gpu);
    dt_cuda_destroy(G);
    return dt_t_summary();
}
