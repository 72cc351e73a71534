#define _POSIX_C_SOURCE 200809L   /* dt_test_os.h's setenv: the busy-machine watch's tests */
/* Base (results, RNG, timers), GEMM against its naive twin, and convolution (im2col + GEMM, chunked)
   against a direct convolution. Built with a tiny convolution workspace so chunking is exercised. */
#define DT_CONV_WORKSPACE 3000
#define DTRAIN_IMPLEMENTATION   /* here, not linked (Makefile): DT_CONV_WORKSPACE, and the kernels' internals */
#include "../dtrain.h"
#include "dt_test.h"
#include "dt_test_os.h"

static void test_result_strings(void) {
    int i, j;
    for (i = 0; i < DT_RESULT_COUNT; i++) {
        CHECK(strncmp(dt_result_str((dt_result)i), "DT_", 3) == 0);
        for (j = 0; j < i; j++) CHECK(strcmp(dt_result_str((dt_result)i), dt_result_str((dt_result)j)) != 0);
    }
    CHECK(strcmp(dt_result_str((dt_result)999), "DT_ERR_UNKNOWN") == 0);
    CHECK(dt_set_error(DT_ERR_IO, "cannot open %s", "x.bin") == DT_ERR_IO);
    CHECK(strstr(dt_last_error(), "x.bin") != NULL && strstr(dt_last_error(), "DT_ERR_IO") != NULL);
}

static int log_lines;
static char log_last[256];
static void log_sink(void *user, int level, const char *msg) {
    (void)user; (void)level;
    log_lines++;
    snprintf(log_last, sizeof log_last, "%s", msg);
}
static void test_logger(void) {
    dt_log_configure(log_sink, NULL, DT_LOG_WARN);
    dt_log(DT_LOG_INFO, "hidden %d", 1);
    dt_log(DT_LOG_WARN, "shown %d", 2);
    CHECK(log_lines == 1 && strcmp(log_last, "shown 2") == 0);
    dt_log_configure(NULL, NULL, DT_LOG_INFO);
}

static void test_rng(void) {
    dt_rng a, b, c;
    int i, same = 0;
    double sum = 0, sq = 0, nsum = 0, nsq = 0;
    int hist[10] = {0};
    dt_rng_init(&a, 42, 0);
    dt_rng_init(&b, 42, 0);
    dt_rng_init(&c, 42, 1);
    for (i = 0; i < 1000; i++) {
        uint32_t x = dt_rng_u32(&a), y = dt_rng_u32(&b), z = dt_rng_u32(&c);
        CHECK(x == y);
        same += x == z;
    }
    CHECK(same < 3);                         /* another stream is another sequence */
    for (i = 0; i < 100000; i++) {
        float u = dt_rng_uniform(&a), n = dt_rng_normal(&a);
        uint32_t k = dt_rng_below(&a, 10);
        CHECK(u >= 0.0f && u < 1.0f);
        CHECK(k < 10);
        hist[k]++;
        sum += u; sq += (double)u * u; nsum += n; nsq += (double)n * n;
    }
    CHECK(fabs(sum / 1e5 - 0.5) < 0.01 && fabs(sq / 1e5 - 1.0 / 3.0) < 0.01);
    CHECK(fabs(nsum / 1e5) < 0.02 && fabs(nsq / 1e5 - 1.0) < 0.03);
    for (i = 0; i < 10; i++) CHECK(hist[i] > 9400 && hist[i] < 10600);
    /* the counter-based hash: pure function, uniform */
    sum = 0;
    for (i = 0; i < 100000; i++) {
        float u = dt_hash_uniform(7, (uint64_t)i);
        CHECK(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    CHECK(fabs(sum / 1e5 - 0.5) < 0.01);
    CHECK(dt_hash_uniform(7, 3) == dt_hash_uniform(7, 3) && dt_hash_uniform(7, 3) != dt_hash_uniform(8, 3));
}

static void test_timer(void) {
    dt_timer t;
    double t0 = dt_time_now(), lap;
    volatile double x = 0;
    int i;
    memset(&t, 0, sizeof t);
    dt_timer_start(&t);
    for (i = 0; i < 100000; i++) x += i;
    lap = dt_timer_stop(&t);
    CHECK(x > 0);
    CHECK(lap >= 0.0 && t.total == lap && t.count == 1);
    CHECK(dt_time_now() >= t0);
}

static void test_progress(void) {
    FILE *f = tmpfile();
    dt_progress p;
    char buf[512];
    size_t n;
    dt_progress_begin(&p, f, 10, 1);
    dt_progress_update(&p, 3, "loss %.2f", 0.5);
    dt_progress_update(&p, 4, "skipped: drawn less than 0.1 s ago");
    dt_progress_update(&p, 10, "done");
    dt_progress_end(&p);
    rewind(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    CHECK(strstr(buf, "     3/10 [=========>") != NULL && strstr(buf, "loss 0.50") != NULL);
    CHECK(strstr(buf, "skipped") == NULL && strstr(buf, "[================================] done") != NULL);
    fclose(f);
    f = tmpfile();
    dt_progress_begin(&p, f, 10, 0);                       /* disabled: writes nothing */
    dt_progress_update(&p, 3, "x");
    dt_progress_end(&p);
    CHECK(ftell(f) == 0);
    fclose(f);
}

static void test_tensor(void) {
    float buf[24];
    int64_t s[3] = {2, 3, 4};
    dt_tensor t = dt_tensor_view(buf, 3, s), u = dt_tensor_4d(buf, 1, 2, 3, 4);
    CHECK(t.ndim == 3 && dt_tensor_count(&t) == 24 && t.data == buf);
    CHECK(u.ndim == 4 && dt_tensor_count(&u) == 24);
}

/* 1 when this CPU runs the tier dt__kernels[k]; else the test's part on it is said to be skipped */
static int tier_runs(int k, const char *test) {
    char name[96];
    if (dt__kernel_ok(k)) return 1;
    snprintf(name, sizeof name, "%s[%s]", test, dt__kernels[k]->name);
    dt_t_skip(name, "this CPU lacks the tier's instructions");
    return 0;
}

/* GEMM: the blocked GEMM with each micro-kernel this CPU runs against the naive one, on shapes around and
   across the tile and block sizes. */
static void test_gemm_vs_naive(void) {
    static const int64_t dims[] = {1, 2, 5, 6, 7, 15, 16, 17, 33, 49, 95, 97, 130, 257};
    int nd = (int)(sizeof dims / sizeof dims[0]), cases = 0, ta, tb, k, kernels = 0;
    int64_t im, in_, ik;
    float *ws = (float *)malloc(sizeof(float) * (size_t)dt__gemm_ws_count(dt_cpu_threads()));
    for (k = 0; k < DT__NKERNELS; k++) {
    if (!tier_runs(k, "test_gemm_vs_naive")) continue;
    kernels++;
    for (im = 0; im < nd; im += 2)
        for (in_ = 0; in_ < nd; in_ += 3)
            for (ik = 0; ik < nd; ik += 2)
                for (ta = 0; ta < 2; ta++)
                    for (tb = 0; tb < 2; tb++) {
                        int64_t M = dims[im], N = dims[in_], K = dims[ik];
                        int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
                        float *A = (float *)malloc(sizeof(float) * (size_t)((ta ? K : M) * lda));
                        float *B = (float *)malloc(sizeof(float) * (size_t)((tb ? N : K) * ldb));
                        float *C1 = (float *)malloc(sizeof(float) * (size_t)(M * ldc));
                        float *C2 = (float *)malloc(sizeof(float) * (size_t)(M * ldc));
                        float alpha = (cases % 3 == 0) ? 1.0f : 0.7f, beta = (float)(cases % 4) * 0.5f;
                        char what[96];
                        dt_t_fill(A, (ta ? K : M) * lda, -1, 1);
                        dt_t_fill(B, (tb ? N : K) * ldb, -1, 1);
                        dt_t_fill(C1, M * ldc, -1, 1);
                        memcpy(C2, C1, sizeof(float) * (size_t)(M * ldc));
                        dt__bsrc bs;
                        bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
                        dt__gemm_with(dt__kernels[k], 0, ws, dt_cpu_threads(), ta, M, N, K, alpha, A, lda, &bs, beta, C1, ldc);
                        dt_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
                        snprintf(what, sizeof what, "gemm %s ta=%d tb=%d M=%lld N=%lld K=%lld", dt__kernels[k]->name, ta, tb,
                                 (long long)M, (long long)N, (long long)K);
                        CHECK_CLOSE(C1, C2, M * ldc, 2e-6, what);
                        free(A); free(B); free(C1); free(C2);
                        cases++;
                    }
    }
    free(ws);
    printf("    %d cases on %d micro-kernels (%s first)\n", cases, kernels, dt__pick_kernel()->name);
    CHECK(kernels >= 1 && cases > 300 * kernels);
}

/* GEMM shapes across the blocks (more rows than DT__MC, more columns than DT__NC, several K blocks) with each
   micro-kernel: equal to the naive GEMM, and the same bits on one thread as on all (each element summed in
   one order) */
static void test_gemm_blocks(void) {
    static const int64_t shapes[][3] = {{DT__MC + 12, 50, 30}, {10, DT__NC + 48 * 2 + 5, DT__KC + 44}, {9, 2 * DT__NC + 1, 17}};
    int64_t s;
    int k, ta, tb;
    float *ws = (float *)malloc(sizeof(float) * (size_t)dt__gemm_ws_count(dt_cpu_threads()));
    for (k = 0; k < DT__NKERNELS; k++) {
        if (!tier_runs(k, "test_gemm_blocks")) continue;
        for (s = 0; s < (int64_t)(sizeof shapes / sizeof shapes[0]); s++)
            for (ta = 0; ta < 2; ta++)
                for (tb = 0; tb < 2; tb++) {
                    int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], lda = ta ? M : K, ldb = tb ? K : N;
                    float *A = (float *)malloc(sizeof(float) * (size_t)(M * K)), *B = (float *)malloc(sizeof(float) * (size_t)(K * N));
                    float *C1 = (float *)malloc(sizeof(float) * (size_t)(M * N)), *C2 = (float *)malloc(sizeof(float) * (size_t)(M * N));
                    float *C3 = (float *)malloc(sizeof(float) * (size_t)(M * N));
                    char what[96];
                    dt__bsrc bs;
                    dt_t_fill(A, M * K, -1, 1);
                    dt_t_fill(B, K * N, -1, 1);
                    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
                    dt__gemm_with(dt__kernels[k], 0, ws, dt_cpu_threads(), ta, M, N, K, 1.0f, A, lda, &bs, 0.0f, C1, N);
                    dt__gemm_with(dt__kernels[k], 0, ws, 1, ta, M, N, K, 1.0f, A, lda, &bs, 0.0f, C3, N);
                    dt_gemm_ref(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C2, N);
                    snprintf(what, sizeof what, "gemm %s ta=%d tb=%d M=%lld N=%lld K=%lld", dt__kernels[k]->name, ta, tb,
                             (long long)M, (long long)N, (long long)K);
                    CHECK_CLOSE(C1, C2, M * N, 2e-6, what);
                    CHECK(memcmp(C1, C3, sizeof(float) * (size_t)(M * N)) == 0);
                    free(A); free(B); free(C1); free(C2); free(C3);
                }
    }
    free(ws);
}

/* The GEMM on bf16 operands (a bf16 model's): on each tier that multiplies bf16 pairs (AVX512_BF16), against the
   naive float GEMM on the operands rounded to bf16 first. The products of bf16 values are exact in float, so the
   two differ only in the order of their sums: 1e-5 of the largest output, where a missed or wrong rounding
   (bf16 keeps 8 bits) shows as 1e-3 or more. Shapes around the tiles, across K blocks (odd kc: the last pair's
   zero), with both transposes and an im2col source. */
static void test_gemm_bf16(void) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 17, 3}, {8, 48, 16}, {9, 49, 33}, {16, 96, 257}, {33, 130, 95},
                                        {DT__MC + 12, 50, 30}, {10, DT__NC + 48 * 2 + 5, DT__KC + 45}};
    int64_t s;
    int k, ta, tb, tiers = 0, cases = 0;
    float *ws = (float *)malloc(sizeof(float) * (size_t)dt__gemm_ws_count(dt_cpu_threads()));
    for (k = 0; k < DT__NKERNELS; k++) {
        char name[96];
        if (!dt__kernel_ok(k)) continue;
        if (!dt__gemm_bf16(dt__kernels[k])) {
            if (dt__kernels[k]->bf16_fn || !strcmp(dt__kernels[k]->name, "avx512")) {
                snprintf(name, sizeof name, "test_gemm_bf16[%s]", dt__kernels[k]->name);
                dt_t_skip(name, dt__kernels[k]->bf16_fn ? "this CPU lacks AVX512_BF16" : "this compiler lacks avx512bf16");
            }
            continue;
        }
        tiers++;
        for (s = 0; s < (int64_t)(sizeof shapes / sizeof shapes[0]); s++)
            for (ta = 0; ta < 2; ta++)
                for (tb = 0; tb < 2; tb++) {
                    int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 3;
                    int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb;
                    float *A = (float *)malloc(sizeof(float) * (size_t)na), *B = (float *)malloc(sizeof(float) * (size_t)nb);
                    float *Ar = (float *)malloc(sizeof(float) * (size_t)na), *Br = (float *)malloc(sizeof(float) * (size_t)nb);
                    float *C1 = (float *)malloc(sizeof(float) * (size_t)(M * N)), *C2 = (float *)malloc(sizeof(float) * (size_t)(M * N));
                    float *C3 = (float *)malloc(sizeof(float) * (size_t)(M * N));
                    float beta = (float)(cases % 3) * 0.5f;
                    char what[128];
                    dt__bsrc bs;
                    dt_t_fill(A, na, -1, 1);
                    dt_t_fill(B, nb, -1, 1);
                    dt_t_fill(C1, M * N, -1, 1);
                    memcpy(C2, C1, sizeof(float) * (size_t)(M * N));
                    memcpy(C3, C1, sizeof(float) * (size_t)(M * N));
                    dt__round_bf16(Ar, A, na);
                    dt__round_bf16(Br, B, nb);
                    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
                    dt__gemm_with(dt__kernels[k], 1, ws, dt_cpu_threads(), ta, M, N, K, 0.5f, A, lda, &bs, beta, C1, N);
                    dt__gemm_with(dt__kernels[k], 1, ws, 1, ta, M, N, K, 0.5f, A, lda, &bs, beta, C3, N);
                    dt_gemm_ref(ta, tb, M, N, K, 0.5f, Ar, lda, Br, ldb, beta, C2, N);
                    snprintf(what, sizeof what, "gemm bf16 %s ta=%d tb=%d M=%lld N=%lld K=%lld", dt__kernels[k]->name, ta, tb,
                             (long long)M, (long long)N, (long long)K);
                    CHECK_CLOSE(C1, C2, M * N, 1e-5, what);
                    CHECK(memcmp(C1, C3, sizeof(float) * (size_t)(M * N)) == 0);   /* one order of sums, any threads */
                    free(A); free(B); free(Ar); free(Br); free(C1); free(C2); free(C3);
                    cases++;
                }
        {   /* B = im2col(x) straight from the images, as the convolutions' GEMMs: t = W col */
            dt_conv_geom g;
            int64_t ckk, ns, nx, nw;
            float *x, *W, *xr, *Wr, *col, *t1, *t2;
            memset(&g, 0, sizeof g);
            g.n = 3; g.c = 5; g.h = 9; g.w = 7; g.oc = 11; g.kh = g.kw = 3; g.sh = g.sw = 1; g.ph = g.pw = 1; g.oh = 9; g.ow = 7;
            ckk = g.c * 9; ns = g.n * g.oh * g.ow; nx = g.n * g.c * g.h * g.w; nw = g.oc * ckk;
            x = (float *)malloc(sizeof(float) * (size_t)nx); xr = (float *)malloc(sizeof(float) * (size_t)nx);
            W = (float *)malloc(sizeof(float) * (size_t)nw); Wr = (float *)malloc(sizeof(float) * (size_t)nw);
            col = (float *)malloc(sizeof(float) * (size_t)(ckk * ns));
            t1 = (float *)malloc(sizeof(float) * (size_t)(g.oc * ns)); t2 = (float *)malloc(sizeof(float) * (size_t)(g.oc * ns));
            dt_t_fill(x, nx, -2, 2); dt_t_fill(W, nw, -1, 1);
            dt__round_bf16(xr, x, nx); dt__round_bf16(Wr, W, nw);
            {
                dt__bsrc bs;
                bs.B = x; bs.ldb = 0; bs.tb = 0; bs.g = &g;
                dt__gemm_with(dt__kernels[k], 1, ws, dt_cpu_threads(), 0, g.oc, ns, ckk, 1.0f, W, ckk, &bs, 0.0f, t1, ns);
            }
            dt__im2col(NULL, &g, xr, col);
            dt_gemm_ref(0, 0, g.oc, ns, ckk, 1.0f, Wr, ckk, col, ns, 0.0f, t2, ns);
            CHECK_CLOSE(t1, t2, g.oc * ns, 1e-5, "gemm bf16 with im2col(x)");
            free(x); free(xr); free(W); free(Wr); free(col); free(t1); free(t2);
        }
    }
    free(ws);
    printf("    %d cases on %d tiers with bf16 products\n", cases, tiers);
}

/* A bf16 model (dt_model_desc.precision) on every tier this CPU runs: a linear layer's forward and both gradients and
   a convolution's forward equal the float references on bf16-rounded operands (x, W, dy; the bias and its gradient
   in float) up to the order of the sums; SimpleCNN's loss and gradients the same on every tier as on the portable
   one, and near the float model's (bf16's rounding, 2^-9 an operand, is all that separates them, but through five
   layers it moves the largest gradient a few percent). The precision's value is checked. */
static void test_model_bf16(void) {
    dt_model_desc md;
    dt_model *m = NULL;
    dt_precision p;
    int k;
    dt_t_state = 37;   /* the same inputs whichever tests ran before */
    memset(&md, 0, sizeof md);
    md.in_c = 3; md.precision = (dt_precision)7;
    CHECK_ERR(dt_model_create(&m, &md), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "DT_PRECISION_BF16") != NULL);
    CHECK_ERR(dt_precision_parse("fp16", &p), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "fp32 or bf16") != NULL);
    CHECK_OK(dt_precision_parse("bf16", &p)); CHECK(p == DT_PRECISION_BF16);
    CHECK(!strcmp(dt_precision_name(DT_PRECISION_FP32), "fp32"));
    for (k = 0; k < DT__NKERNELS; k++) {
        enum { B = 6, NIN = 37, NOUT = 5 };
        float x[B * NIN], xr[B * NIN], dy[B * NOUT], dyr[B * NOUT], Wr[NOUT * NIN], y[B * NOUT], dW[NOUT * NIN], dx[B * NIN], db[NOUT];
        const float *P;
        int64_t i;
        char what[64];
        if (!tier_runs(k, "test_model_bf16")) continue;
        CHECK_OK(dt_cpu_set_tier(dt__kernels[k]->name));
        memset(&md, 0, sizeof md);
        md.in_c = NIN; md.seed = 3; md.precision = DT_PRECISION_BF16; md.input_grad = 1;
        CHECK_OK(dt_model_create(&m, &md));
        dt_linear(m, 0, NOUT, 1);
        CHECK_OK(dt_model_finalize(m));
        dt_t_fill(x, B * NIN, -2, 2);
        dt_t_fill(dy, B * NOUT, -1, 1);
        dt__round_bf16(xr, x, B * NIN);
        dt__round_bf16(dyr, dy, B * NOUT);
        P = dt_model_params(m, NULL);
        dt__round_bf16(Wr, P, NOUT * NIN);
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_forward(m, x, B));
        CHECK_OK(dt_model_backward(m, dy));
        for (i = 0; i < B * NOUT; i++) y[i] = P[NOUT * NIN + i % NOUT];
        dt_gemm_ref(0, 1, B, NOUT, NIN, 1.0f, xr, NIN, Wr, NIN, 1.0f, y, NOUT);
        dt_gemm_ref(1, 0, NOUT, NIN, B, 1.0f, dyr, NOUT, xr, NIN, 0.0f, dW, NIN);
        dt_gemm_ref(0, 0, B, NIN, NOUT, 1.0f, dyr, NOUT, Wr, NIN, 0.0f, dx, NIN);
        for (i = 0; i < NOUT; i++) db[i] = dy[i] + dy[NOUT + i] + dy[2 * NOUT + i] + dy[3 * NOUT + i] + dy[4 * NOUT + i] + dy[5 * NOUT + i];
        snprintf(what, sizeof what, "bf16 linear %s", dt__kernels[k]->name);
        CHECK_CLOSE(dt_model_node_output(m, 1), y, B * NOUT, 1e-6, what);
        CHECK_CLOSE(dt_model_grads(m, NULL), dW, NOUT * NIN, 1e-6, what);
        CHECK_CLOSE(dt_model_grads(m, NULL) + NOUT * NIN, db, NOUT, 1e-6, what);
        CHECK_CLOSE(dt_model_node_grad(m, 0), dx, B * NIN, 1e-6, what);
        dt_model_destroy(m);
        {   /* a convolution's forward: dt_conv2d_ref on the rounded operands */
            dt_conv_geom g;
            float cx[2 * 3 * 9 * 9], cxr[2 * 3 * 9 * 9], cwr[4 * 3 * 9], cy[2 * 4 * 9 * 9];
            memset(&g, 0, sizeof g);
            g.n = 2; g.c = 3; g.h = g.w = 9; g.oc = 4; g.kh = g.kw = 3; g.sh = g.sw = 1; g.ph = g.pw = 1;
            CHECK_OK(dt_conv_geom_resolve(&g));
            memset(&md, 0, sizeof md);
            md.in_c = 3; md.in_h = md.in_w = 9; md.seed = 4; md.precision = DT_PRECISION_BF16;
            CHECK_OK(dt_model_create(&m, &md));
            dt_conv2d(m, 0, 4, 3, 1, 1);
            CHECK_OK(dt_model_finalize(m));
            dt_t_fill(cx, 2 * 3 * 81, -2, 2);
            dt__round_bf16(cxr, cx, 2 * 3 * 81);
            P = dt_model_params(m, NULL);
            dt__round_bf16(cwr, P, 4 * 27);
            CHECK_OK(dt_model_forward(m, cx, 2));
            dt_conv2d_ref(&g, cxr, cwr, P + 4 * 27, cy);
            snprintf(what, sizeof what, "bf16 conv %s", dt__kernels[k]->name);
            CHECK_CLOSE(dt_model_node_output(m, 1), cy, 2 * 4 * 81, 1e-6, what);
            dt_model_destroy(m);
        }
    }
    {   /* SimpleCNN: each tier against the portable one, and bf16 near fp32 */
        enum { B = 8 };
        static float x[B * 28 * 28], g[3][450000];
        float loss[3];
        int32_t labels[B];
        int64_t np = 0, i;
        int run;
        dt_t_fill(x, B * 28 * 28, 0, 1);
        for (i = 0; i < B; i++) labels[i] = (int32_t)(i * 3 % 10);
        for (k = 0; k < DT__NKERNELS; k++) {
            char what[64];
            if (!dt__kernel_ok(k)) continue;
            for (run = 0; run < 3; run++) {   /* 0: bf16 on the portable tier, 1: bf16 on tier k, 2: fp32 */
                CHECK_OK(dt_cpu_set_tier(run == 1 ? dt__kernels[k]->name : "portable"));
                memset(&md, 0, sizeof md);
                md.in_c = 1; md.in_h = md.in_w = 28; md.seed = 5; md.precision = run == 2 ? DT_PRECISION_FP32 : DT_PRECISION_BF16;
                CHECK_OK(dt_zoo_create(&m, DT_ZOO_SIMPLE_CNN, 10, &md));
                dt_model_params(m, &np);
                CHECK(np <= 450000);
                dt_model_zero_grad(m);
                CHECK_OK(dt_model_forward(m, x, B));
                CHECK_OK(dt_model_loss_cross_entropy(m, labels, &loss[run]));
                CHECK_OK(dt_model_backward(m, NULL));
                memcpy(g[run], dt_model_grads(m, NULL), sizeof(float) * (size_t)np);
                dt_model_destroy(m);
            }
            printf("    simplecnn bf16 %s: loss %.6f (portable %.6f, fp32 %.6f); gradients %.2g from portable's, %.2g from fp32's\n",
                   dt__kernels[k]->name, (double)loss[1], (double)loss[0], (double)loss[2], dt_t_relerr(g[1], g[0], np),
                   dt_t_relerr(g[0], g[2], np));
            snprintf(what, sizeof what, "bf16 simplecnn %s vs portable", dt__kernels[k]->name);
            CHECK(fabsf(loss[1] - loss[0]) <= 1e-4f * fabsf(loss[0]));
            CHECK_CLOSE(g[1], g[0], np, 1e-3, what);   /* (3e-8 at avx512 here; 0 elsewhere: a bf16 product is exact, fused or not) */
            CHECK(fabsf(loss[2] - loss[0]) <= 2e-2f * fabsf(loss[2]));
            CHECK_CLOSE(g[0], g[2], np, 0.3, "bf16 simplecnn vs fp32");   /* input-dependent: 0.021, 0.076, 0.187 seen (a gross error is ~1) */
            CHECK(dt_t_relerr(g[0], g[2], np) > 1e-5);   /* the operands were rounded */
        }
    }
    CHECK_OK(dt_cpu_set_tier(NULL));
}

/* beta = 0 must not read C: garbage (NaN) there must not leak into the result */
static void test_gemm_beta_zero_ignores_c(void) {
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 0, 1, 1, 1}, C[4], R[4];
    int i;
    for (i = 0; i < 4; i++) C[i] = NAN;
    dt_gemm(0, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2);
    dt_gemm_ref(0, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, R, 2);
    for (i = 0; i < 4; i++) CHECK(C[i] == R[i]);
    CHECK(R[0] == 4 && R[1] == 5 && R[2] == 10 && R[3] == 11);
}

/* direct (naive) convolution backward, the twin of col2im + GEMM */
static void conv_bwd_ref(const dt_conv_geom *g, const float *x, const float *w, const float *dy, float *dx, float *dw,
                         float *db) {
    int64_t n, o, oy, ox, c, ky, kx;
    memset(dx, 0, sizeof(float) * (size_t)(g->n * g->c * g->h * g->w));
    memset(dw, 0, sizeof(float) * (size_t)(g->oc * g->c * g->kh * g->kw));
    memset(db, 0, sizeof(float) * (size_t)g->oc);
    for (n = 0; n < g->n; n++)
        for (o = 0; o < g->oc; o++)
            for (oy = 0; oy < g->oh; oy++)
                for (ox = 0; ox < g->ow; ox++) {
                    float d = dy[((n * g->oc + o) * g->oh + oy) * g->ow + ox];
                    db[o] += d;
                    for (c = 0; c < g->c; c++)
                        for (ky = 0; ky < g->kh; ky++)
                            for (kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                dw[((o * g->c + c) * g->kh + ky) * g->kw + kx] += d * x[((n * g->c + c) * g->h + iy) * g->w + ix];
                                dx[((n * g->c + c) * g->h + iy) * g->w + ix] += d * w[((o * g->c + c) * g->kh + ky) * g->kw + kx];
                            }
                }
}

/* a square window in a row of the convolution tables: n, c, h, w, oc, k, stride, pad */
#define SQ(n, c, h, w, oc, k, s, p) {n, c, h, w, oc, k, k, s, s, p, p}
/* geometry from a table row: n, c, h, w, oc, kh, kw, sh, sw, ph, pw */
static dt_conv_geom conv_geom(const int64_t *cs) {
    dt_conv_geom g;
    memset(&g, 0, sizeof g);
    g.n = cs[0]; g.c = cs[1]; g.h = cs[2]; g.w = cs[3]; g.oc = cs[4];
    g.kh = cs[5]; g.kw = cs[6]; g.sh = cs[7]; g.sw = cs[8]; g.ph = cs[9]; g.pw = cs[10];
    CHECK_OK(dt_conv_geom_resolve(&g));
    return g;
}
/* a model of one convolution of geometry g (its weights: those of the seed) */
static dt_model *conv_model(const dt_conv_geom *g, uint64_t seed) {
    dt_model *m;
    dt_model_desc d;
    dt_conv2d_desc cd;
    memset(&d, 0, sizeof d);
    d.in_c = g->c; d.in_h = g->h; d.in_w = g->w; d.seed = seed; d.input_grad = 1;
    memset(&cd, 0, sizeof cd);
    cd.out_channels = g->oc; cd.kernel_h = g->kh; cd.kernel_w = g->kw; cd.stride_h = g->sh; cd.stride_w = g->sw;
    cd.pad_h = g->ph; cd.pad_w = g->pw;
    CHECK_OK(dt_model_create(&m, &d));
    dt_conv2d_ex(m, dt_model_input(m), &cd);
    CHECK_OK(dt_model_finalize(m));
    return m;
}
/* Which convolutions the tier's shifted rows take (dtrain/cpu/cpu_vec.h), forward (bwd 0) or backward (bwd 1):
   strides 1 or 2 on each axis, at least an image per thread, a tier with shifted convolutions (avx512, avx2,
   and portable or neon built by GCC or Clang); backward, at stride 1 on both axes, padding at most k - 1 */
static int shift_takes(const dt_conv_geom *g, int bwd) {
    if (!dt__pick_kernel()->conv_fwd || dt__shift_off || g->sh > 2 || g->sw > 2 || g->n < dt_cpu_threads()) return 0;
    return !bwd || g->sh == 2 || g->sw == 2 || (g->ph < g->kh && g->pw < g->kw);
}

static void test_conv_vs_direct(void) {
    /* n, c, h, w, oc, kh, kw, sh, sw, ph, pw */
    static const int64_t cases[][11] = {SQ(1, 1, 5, 5, 1, 3, 1, 0), SQ(3, 2, 7, 6, 4, 3, 1, 1), SQ(2, 3, 9, 9, 5, 3, 2, 1),
                                        SQ(4, 5, 8, 11, 3, 1, 1, 0), SQ(2, 4, 6, 6, 6, 1, 2, 0), SQ(3, 3, 10, 7, 2, 5, 1, 2),
                                        SQ(5, 16, 8, 8, 17, 3, 1, 1), SQ(2, 3, 13, 13, 7, 4, 3, 2), SQ(9, 2, 6, 6, 3, 3, 1, 1),
                                        /* the GEMMs' k and n across their blocks (256 and 1152): 360 x 2700 */
                                        SQ(3, 40, 30, 30, 9, 3, 1, 1), SQ(7, 29, 25, 23, 5, 3, 2, 1),
                                        /* the packing's 16-lane steps: 16 x 16, 4 x 4 and 2 x 2 images (VGG-11's) */
                                        SQ(3, 5, 16, 16, 7, 3, 1, 1), SQ(6, 8, 4, 4, 9, 3, 1, 1), SQ(9, 6, 2, 2, 10, 3, 1, 1),
                                        /* col2im on small images: more output channels than pixels, stride 2 */
                                        SQ(2, 3, 2, 2, 40, 3, 1, 1), SQ(5, 4, 4, 4, 6, 3, 2, 1),
                                        /* stride 1 by shifted rows (AVX-512): ResNet-20's first stage, rows and
                                           channels not multiples of the tiles, padding past k - 1 (the
                                           backward pass then by GEMM), a 5 x 5 window, the weight gradient
                                           over several blocks of images */
                                        SQ(6, 16, 32, 32, 16, 3, 1, 1), SQ(4, 3, 9, 9, 13, 3, 1, 1), SQ(3, 2, 8, 8, 5, 3, 1, 3),
                                        SQ(5, 7, 5, 6, 9, 5, 1, 2), SQ(8, 64, 32, 32, 6, 3, 1, 1), SQ(4, 1, 28, 28, 32, 3, 1, 1),
                                        /* SimpleCNN's conv2 at 16 images: the packing shared by the threads */
                                        SQ(16, 32, 14, 14, 64, 3, 1, 1),
                                        /* stride 2 by phase planes: ResNet-20's two, odd sizes, no padding */
                                        SQ(4, 16, 32, 32, 32, 3, 2, 1), SQ(3, 32, 16, 16, 64, 3, 2, 1), SQ(3, 5, 9, 11, 20, 3, 2, 1),
                                        SQ(2, 3, 8, 7, 17, 3, 2, 0),
                                        /* the tiles' edges on every tier (rows of 8, 6 and 2, columns of 48
                                           and 16): odd channel counts and sizes, 5 x 5 without padding, 1 x 1
                                           padded (the backward pass then by GEMM), stride 2 padded by 2 */
                                        SQ(3, 7, 11, 9, 13, 5, 1, 0), SQ(2, 5, 7, 5, 11, 1, 1, 1), SQ(3, 9, 13, 11, 7, 3, 1, 2),
                                        SQ(2, 7, 9, 9, 11, 3, 2, 2), SQ(4, 3, 15, 13, 5, 1, 1, 0),
                                        /* rectangular windows: 1 x 3, 3 x 1, 5 x 2 and 2 x 5 at stride 1, padded
                                           0 x 1, 1 x 0, 2 x 1, 1 x 2; a 1-D convolution (1 x 7 on one row) */
                                        {3, 4, 7, 9, 5, 1, 3, 1, 1, 0, 1}, {3, 4, 9, 7, 5, 3, 1, 1, 1, 1, 0},
                                        {2, 3, 11, 8, 6, 5, 2, 1, 1, 2, 1}, {2, 3, 8, 11, 6, 2, 5, 1, 1, 1, 2},
                                        {3, 4, 1, 20, 6, 1, 7, 1, 1, 0, 3},
                                        /* strides 1 x 2, 2 x 1 and 2 x 2 with rectangular kernels and padding */
                                        {3, 5, 6, 13, 7, 1, 3, 1, 2, 0, 1}, {3, 5, 13, 6, 7, 3, 1, 2, 1, 1, 0},
                                        {2, 3, 11, 9, 5, 5, 2, 2, 2, 2, 1}, {2, 3, 9, 12, 5, 2, 5, 2, 2, 0, 2},
                                        {3, 4, 10, 9, 6, 2, 5, 2, 1, 1, 2}, {3, 4, 9, 10, 6, 5, 2, 1, 2, 2, 0},
                                        /* 3 x 3 at strides 1 x 2 and 2 x 1, and at stride 2 padded 1 x 0; a 1 x 1
                                           kernel at stride 2 x 1 (odd padded rows get no gradient) */
                                        {3, 6, 9, 11, 10, 3, 3, 1, 2, 1, 1}, {3, 6, 11, 9, 10, 3, 3, 2, 1, 0, 1},
                                        {3, 5, 10, 9, 18, 3, 3, 2, 2, 1, 0}, {2, 3, 7, 8, 4, 1, 1, 2, 1, 0, 0},
                                        /* past what the shifted rows take: strides 3 x 1 and 1 x 3, and padding
                                           past k - 1 on one axis (their backward pass then by GEMM) */
                                        {2, 3, 10, 9, 4, 3, 2, 3, 1, 1, 0}, {2, 3, 9, 10, 4, 2, 3, 1, 3, 0, 1},
                                        {2, 3, 6, 5, 4, 3, 1, 1, 1, 1, 1}, {2, 5, 23, 29, 7, 2, 3, 2, 2, 1, 1}};
    int ci, k, i;
    for (ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        dt_model *m;
        dt_conv_geom g = conv_geom(cases[ci]);
        int64_t np, xs, ys;
        float *x, *y, *dy, *yref, *dxr, *dwr, *gr;
        xs = g.n * g.c * g.h * g.w;
        ys = g.n * g.oc * g.oh * g.ow;
        x = (float *)malloc(sizeof(float) * (size_t)xs); dxr = (float *)malloc(sizeof(float) * (size_t)xs);
        y = (float *)malloc(sizeof(float) * (size_t)ys); yref = (float *)malloc(sizeof(float) * (size_t)ys);
        dy = (float *)malloc(sizeof(float) * (size_t)ys);
        dt_t_fill(x, xs, -1, 1);
        dt_t_fill(dy, ys, -1, 1);
        m = conv_model(&g, (uint64_t)ci);   /* the reference, once per case: every model of its seed has these weights */
        {
            float *p = dt_model_params(m, &np);
            dwr = (float *)malloc(sizeof(float) * (size_t)np);
            gr = (float *)malloc(sizeof(float) * (size_t)np);
            dt_conv2d_ref(&g, x, p, p + g.oc * g.c * g.kh * g.kw, yref);
            conv_bwd_ref(&g, x, p, dy, dxr, dwr, dwr + g.oc * g.c * g.kh * g.kw);
        }
        dt_model_destroy(m);
        for (k = 0; k < DT__NKERNELS; k++) {   /* on every tier this CPU runs, */
            if (!dt__kernel_ok(k)) continue;
            CHECK_OK(dt_cpu_set_tier(dt__kernels[k]->name));
            for (i = 0; i < 2; i++) {           /* by both paths */
                int64_t taken = dt__shift_taken;
                char what[96];
                const char *path = i ? "packed GEMM" : "shifted rows where taken";
                dt__shift_off = i;
                m = conv_model(&g, (uint64_t)ci);
                CHECK_OK(dt_model_forward(m, x, g.n));
                CHECK_OK(dt_model_get_output(m, y, ys));
                snprintf(what, sizeof what, "%s: conv case %d forward, %s", dt_cpu_tier(), ci, path);
                CHECK_CLOSE(y, yref, ys, 1e-5, what);
                /* the shifted path runs where it applies, never when switched off */
                CHECK(dt__shift_taken == taken + shift_takes(&g, 0));
                CHECK_OK(dt_model_backward(m, dy));
                CHECK_OK(dt_model_get_grads(m, gr, np));
                snprintf(what, sizeof what, "%s: conv case %d dW,db, %s", dt_cpu_tier(), ci, path);
                CHECK_CLOSE(gr, dwr, np, 1e-5, what);
                snprintf(what, sizeof what, "%s: conv case %d dx, %s", dt_cpu_tier(), ci, path);
                CHECK_CLOSE(dt_model_node_grad(m, 0), dxr, xs, 1e-5, what);
                CHECK(dt__shift_taken == taken + shift_takes(&g, 0) + shift_takes(&g, 1));
                dt_model_destroy(m);
            }
        }
        free(x); free(y); free(yref); free(dy); free(dxr); free(dwr); free(gr);
    }
    dt__shift_off = 0;
    for (k = 0; k < DT__NKERNELS; k++) {
        char why[96];
        if (!tier_runs(k, "test_conv_vs_direct")) continue;
        if (dt__kernels[k]->conv_fwd) continue;
        snprintf(why, sizeof why, "the tier %s has none: both runs took the packed GEMM", dt__kernels[k]->name);
        dt_t_skip("test_conv_vs_direct's shifted rows", why);
    }
    CHECK_OK(dt_cpu_set_tier(NULL));
}

/* ---- every kernel of a faster CPU tier against its portable twin (dtrain/cpu/cpu.h's kernel tables) ---- */
static int twin_tier;   /* the tier under test: an index into dt__kernels */

static float *twin_alloc(int64_t n) { return (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

/* A convolution's operands, its references (dt_conv2d_ref, conv_bwd_ref) and room for a path's results */
typedef struct conv_io {
    int64_t xs, ys, kk;
    float *x, *W, *b, *dy, *dx0, *dW0;   /* inputs; the gradients' values before the backward pass adds to them */
    float *yref, *dxr, *dwr, *dbr;       /* references */
    float *y, *dx, *dW, *want;           /* results */
} conv_io;
static void conv_io_make(conv_io *io, const dt_conv_geom *g) {
    io->xs = g->n * g->c * g->h * g->w; io->ys = g->n * g->oc * g->oh * g->ow; io->kk = g->oc * g->c * g->kh * g->kw;
    io->x = twin_alloc(io->xs); io->dx = twin_alloc(io->xs); io->dx0 = twin_alloc(io->xs); io->dxr = twin_alloc(io->xs);
    io->want = twin_alloc(io->xs > io->kk ? io->xs : io->kk);
    io->dy = twin_alloc(io->ys); io->y = twin_alloc(io->ys); io->yref = twin_alloc(io->ys);
    io->W = twin_alloc(io->kk); io->dW = twin_alloc(io->kk); io->dW0 = twin_alloc(io->kk); io->dwr = twin_alloc(io->kk);
    io->b = twin_alloc(g->oc); io->dbr = twin_alloc(g->oc);
    dt_t_fill(io->x, io->xs, -1, 1); dt_t_fill(io->dy, io->ys, -1, 1); dt_t_fill(io->W, io->kk, -1, 1);
    dt_t_fill(io->b, g->oc, -1, 1); dt_t_fill(io->dx0, io->xs, -1, 1); dt_t_fill(io->dW0, io->kk, -1, 1);
    conv_bwd_ref(g, io->x, io->W, io->dy, io->dxr, io->dwr, io->dbr);
}
static void conv_io_free(conv_io *io) {
    free(io->x); free(io->dx); free(io->dx0); free(io->dxr); free(io->want); free(io->dy); free(io->y); free(io->yref);
    free(io->W); free(io->dW); free(io->dW0); free(io->dwr); free(io->b); free(io->dbr);
}
typedef int (*conv_fwd_fn)(void *, const dt_conv_geom *, const float *, const float *, const float *, float *);
typedef int (*conv_bwd_fn)(void *, const dt_conv_geom *, const float *, const float *, const float *, float *, float *, int);
/* A path of dt_ops.conv_fwd and conv_bwd on ctx against the references, three times: forward with the bias
   and dx written, forward without the bias and dx added to (accumulate), and no dx (then left as it was);
   dW added to what it held. Every call must take g. what: the path, the tier and the case. */
static void conv_path_check(const char *what, conv_fwd_fn fwd, conv_bwd_fn bwd, void *ctx, const dt_conv_geom *g, conv_io *io) {
    char msg[160];
    int64_t i;
    int acc;
    for (acc = 0; acc < 3; acc++) {   /* dx written, added to, none; the bias, none */
        snprintf(msg, sizeof msg, "%s, forward%s", what, acc == 1 ? " without bias" : "");
        dt_conv2d_ref(g, io->x, io->W, acc == 1 ? NULL : io->b, io->yref);
        CHECK(fwd(ctx, g, io->x, io->W, acc == 1 ? NULL : io->b, io->y) == 1);
        CHECK_CLOSE(io->y, io->yref, io->ys, 1e-5, msg);
        memcpy(io->dx, io->dx0, sizeof(float) * (size_t)io->xs);
        memcpy(io->dW, io->dW0, sizeof(float) * (size_t)io->kk);
        CHECK(bwd(ctx, g, io->x, io->W, io->dy, io->dW, acc == 2 ? NULL : io->dx, acc) == 1);
        for (i = 0; i < io->kk; i++) io->want[i] = io->dW0[i] + io->dwr[i];
        snprintf(msg, sizeof msg, "%s, dW +=", what);
        CHECK_CLOSE(io->dW, io->want, io->kk, 1e-5, msg);
        if (acc == 2) { CHECK(memcmp(io->dx, io->dx0, sizeof(float) * (size_t)io->xs) == 0); continue; }
        for (i = 0; i < io->xs; i++) io->want[i] = acc ? io->dx0[i] + io->dxr[i] : io->dxr[i];
        snprintf(msg, sizeof msg, "%s, dx %s", what, acc ? "+=" : "=");
        CHECK_CLOSE(io->dx, io->want, io->xs, 1e-5, msg);
    }
}

/* The convolutions by taps (dtrain/cpu/cpu.h) on every tier against dt_conv2d_ref and the direct gradients:
   forward with and without bias, dW added to what it held, dx written or added (accumulate), no dx; small
   and odd images, windows 3 x 3 (padding 0 to 2), 5 x 5, 1 x 3, 3 x 1, 2 x 5 and 5 x 2 (padding 0 x 1,
   1 x 0, 2 x 1, 1 x 2), channels across the GEMM's K blocks, and workspaces of one, several and all images
   per chunk. Every geometry is taken (dt__tap_min_zeros and dt__tap_min_len 0), and must be; and by the
   GEMMs' input gradient as a convolution of dy (dt__cpu_conv_gemm_dgrad), which declines a stride. */
static void test_conv_taps(void) {
    static const int64_t cases[][9] = {   /* n, c, h, w, oc, kh, kw, ph, pw */
        {3, 4, 1, 1, 5, 3, 3, 1, 1}, {5, 6, 2, 2, 7, 3, 3, 1, 1}, {4, 3, 3, 5, 6, 3, 3, 1, 1}, {7, 5, 4, 4, 9, 3, 3, 1, 1},
        {3, 4, 7, 7, 5, 3, 3, 1, 1}, {4, 3, 4, 4, 5, 5, 5, 2, 2}, {3, 5, 5, 6, 4, 5, 5, 2, 2}, {4, 3, 6, 5, 5, 3, 3, 0, 0},
        {3, 4, 4, 5, 6, 1, 3, 0, 1}, {3, 4, 5, 4, 6, 3, 1, 1, 0}, {2, 3, 3, 3, 4, 3, 3, 2, 2}, {3, 3, 4, 6, 4, 3, 3, 1, 0},
        {3, 4, 5, 7, 5, 5, 2, 2, 1}, {3, 4, 7, 5, 5, 2, 5, 1, 2}, {2, 3, 3, 9, 4, 2, 5, 0, 2},
        {3, 20, 2, 2, 260, 3, 3, 1, 1}, {2, 260, 3, 2, 8, 3, 3, 1, 1}};
    int ci, k, cw;
    dt__tap_min_zeros = 0.0;
    dt__tap_min_len = 0;
    for (ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        const int64_t *cs = cases[ci];
        dt_conv_geom g;
        int64_t ws;
        conv_io io;
        dt__cpu_state st;
        memset(&g, 0, sizeof g);
        g.n = cs[0]; g.c = cs[1]; g.h = cs[2]; g.w = cs[3]; g.oc = cs[4];
        g.kh = cs[5]; g.kw = cs[6]; g.sh = g.sw = 1; g.ph = cs[7]; g.pw = cs[8];
        CHECK_OK(dt_conv_geom_resolve(&g));
        conv_io_make(&io, &g);
        memset(&st, 0, sizeof st);   /* (bf16 0: float GEMMs) */
        st.gemm_ws_count = dt__gemm_ws_count(dt_cpu_threads());
        st.gemm_ws = twin_alloc(st.gemm_ws_count);
        ws = dt__tap_fixed(&g) + g.n * dt__tap_image(&g);
        st.conv_ws = twin_alloc(ws);
        for (k = 0; k < DT__NKERNELS; k++) {
            if (!dt__kernel_ok(k)) continue;
            CHECK_OK(dt_cpu_set_tier(dt__kernels[k]->name));
            for (cw = 0; cw < 3; cw++) {   /* chunks of 1 image, of about a third of them, of all */
                int64_t nb = cw == 0 ? 1 : cw == 1 ? (g.n + 2) / 3 : g.n, taken = dt__tap_taken;
                char what[128];
                st.conv_ws_count = dt__tap_fixed(&g) + nb * dt__tap_image(&g);
                CHECK(dt__tap_chunk(&st, &g) == nb);
                snprintf(what, sizeof what, "%s: taps case %d, %lld a chunk", dt_cpu_tier(), ci, (long long)nb);
                conv_path_check(what, dt__tap_conv_fwd, dt__tap_conv_bwd, &st, &g, &io);
                CHECK(dt__tap_taken == taken + 6);
            }
            {   /* the GEMMs' input gradient as a convolution of dy takes these geometries too (stride 1, padding
                   at most k - 1 on each axis) with room for the flipped weights and the images, not with a float
                   less */
                int64_t wn = io.kk + g.c * g.n * g.h * g.w, i;
                float *gws = twin_alloc(wn);
                char what[128];
                memcpy(io.dx, io.dx0, sizeof(float) * (size_t)io.xs);
                CHECK(dt__cpu_conv_gemm_dgrad(&st, &g, io.W, io.dy, io.dx, gws, wn) == 1);
                for (i = 0; i < io.xs; i++) io.want[i] = io.dx0[i] + io.dxr[i];
                snprintf(what, sizeof what, "%s: the GEMMs' input gradient, taps case %d, dx +=", dt_cpu_tier(), ci);
                CHECK_CLOSE(io.dx, io.want, io.xs, 1e-5, what);
                CHECK(dt__cpu_conv_gemm_dgrad(&st, &g, io.W, io.dy, io.dx, gws, wn - 1) == 0);
                g.sw = 2;   /* a stride: declined, with nothing written */
                memcpy(io.dx, io.dx0, sizeof(float) * (size_t)io.xs);
                CHECK(dt__cpu_conv_gemm_dgrad(&st, &g, io.W, io.dy, io.dx, gws, wn) == 0);
                CHECK(memcmp(io.dx, io.dx0, sizeof(float) * (size_t)io.xs) == 0);
                g.sw = 1;
                free(gws);
            }
        }
        st.conv_ws_count = dt__tap_fixed(&g);   /* no room for an image: not taken */
        CHECK(dt__tap_chunk(&st, &g) == 0 && !dt__tap_conv_fwd(&st, &g, io.x, io.W, io.b, io.y));
        conv_io_free(&io);
        free(st.gemm_ws); free(st.conv_ws);
    }
    dt__tap_min_zeros = 0.1;
    dt__tap_min_len = 32;
    {   /* which geometries the taps take by default: 3 x 3 with padding 1 on 8 x 8, 4 x 4 and 2 x 2, not 16 x 16,
           not stride 2, not padding past k - 1; 2 x 2 images (the corner taps' spans of 1 pixel) from 32 a
           chunk on */
        dt_conv_geom g;
        dt__cpu_state st;
        float one = 0.0f;
        memset(&g, 0, sizeof g);
        memset(&st, 0, sizeof st);
        g.n = 2; g.c = 3; g.oc = 4; g.kh = g.kw = 3; g.sh = g.sw = 1; g.ph = g.pw = 1;
        g.h = g.w = 4; CHECK_OK(dt_conv_geom_resolve(&g)); CHECK(dt__tap_fits(&g));
        g.h = g.w = 2; CHECK_OK(dt_conv_geom_resolve(&g)); CHECK(dt__tap_fits(&g));
        g.h = g.w = 8; CHECK_OK(dt_conv_geom_resolve(&g)); CHECK(dt__tap_fits(&g));
        g.h = g.w = 16; CHECK_OK(dt_conv_geom_resolve(&g)); CHECK(!dt__tap_fits(&g));
        g.h = g.w = 4; g.sh = g.sw = 2; CHECK_OK(dt_conv_geom_resolve(&g)); CHECK(!dt__tap_fits(&g));
        g.sh = g.sw = 1; g.ph = g.pw = 3; CHECK_OK(dt_conv_geom_resolve(&g)); CHECK(!dt__tap_fits(&g));
        g.ph = g.pw = 1; g.h = g.w = 2; g.n = 40; CHECK_OK(dt_conv_geom_resolve(&g));
        memset(&st, 0, sizeof st);   /* (bf16 0: float GEMMs) */
        st.conv_ws = &one;   /* (not written: dt__tap_chunk only counts) */
        st.conv_ws_count = dt__tap_fixed(&g) + 32 * dt__tap_image(&g);
        CHECK(dt__tap_chunk(&st, &g) == 32);
        st.conv_ws_count -= dt__tap_image(&g);
        CHECK(dt__tap_chunk(&st, &g) == 0);
        CHECK(dt__tap_ws(&g) > 0);          /* reserved from 32 images on */
        g.n = 31;
        CHECK(dt__tap_ws(&g) == 0);
    }
    CHECK_OK(dt_cpu_set_tier(NULL));
}
/* The convolutions by shifted rows of every tier that has them (dtrain/cpu/cpu_vec.h, cpu_x86.h), called
   directly, against dt_conv2d_ref and the direct gradients as test_conv_taps: rectangular windows (1 x 3,
   3 x 1, 5 x 2, 2 x 5, 1 x 7 on one row) at strides 1 x 1, 1 x 2, 2 x 1 and 2 x 2 with padding 0 x 1, 1 x 0,
   2 x 1 and more, 3 x 3 at unequal strides (the dot-product tile for the weight gradient) and at stride 2
   padded 1 x 0 (the transposed tile), windows narrower than the stride (phases of the input gradient
   without taps), and tiles' edges (13 rows, 61 columns). Each is taken whole, the input gradient by phase
   planes at the strides; strides of 3 and windows wider than 64 are not, nor at stride 1 the backward pass
   with padding past k - 1. */
static void test_conv_shifted(void) {
    static const int64_t cases[][11] = {   /* n, c, h, w, oc, kh, kw, sh, sw, ph, pw */
        {2, 4, 7, 9, 5, 1, 3, 1, 1, 0, 1}, {2, 4, 9, 7, 5, 3, 1, 1, 1, 1, 0}, {2, 3, 11, 8, 6, 5, 2, 1, 1, 2, 1},
        {2, 3, 8, 11, 6, 2, 5, 1, 1, 1, 2}, {3, 4, 1, 20, 6, 1, 7, 1, 1, 0, 3},
        {2, 5, 6, 13, 7, 1, 3, 1, 2, 0, 1}, {2, 6, 9, 11, 10, 3, 3, 1, 2, 1, 1}, {2, 3, 8, 11, 6, 2, 5, 1, 2, 1, 2},
        {2, 5, 13, 6, 7, 3, 1, 2, 1, 1, 0}, {2, 6, 11, 9, 10, 3, 3, 2, 1, 0, 1}, {2, 3, 11, 8, 6, 5, 2, 2, 1, 2, 0},
        {2, 3, 11, 9, 5, 5, 2, 2, 2, 2, 1}, {2, 3, 9, 12, 5, 2, 5, 2, 2, 0, 2}, {2, 5, 10, 9, 18, 3, 3, 2, 2, 1, 0},
        {2, 3, 7, 8, 4, 1, 1, 2, 2, 0, 0}, {2, 3, 7, 8, 4, 1, 2, 2, 1, 0, 0}, {2, 4, 9, 9, 5, 4, 4, 2, 2, 1, 1},
        {2, 11, 9, 61, 13, 3, 2, 2, 2, 1, 1}, {2, 3, 4, 40, 5, 1, 9, 1, 2, 0, 4}};
    static const int64_t declined[][11] = {   /* the last one's backward pass only */
        {2, 3, 10, 9, 4, 3, 2, 3, 1, 1, 0}, {2, 3, 9, 10, 4, 2, 3, 1, 3, 0, 1}, {2, 1, 1, 80, 2, 1, 65, 1, 1, 0, 0},
        {2, 3, 6, 5, 4, 3, 1, 1, 1, 1, 1}};
    int ci, k, tiers = 0, nd = (int)(sizeof declined / sizeof declined[0]);
    dt__cpu_state st;
    memset(&st, 0, sizeof st);
    st.gemm_ws_count = dt__gemm_ws_count(dt_cpu_threads());
    st.gemm_ws = twin_alloc(st.gemm_ws_count);
    for (k = 0; k < DT__NKERNELS; k++) {
        const dt__kernel *kn = dt__kernels[k];
        if (!dt__kernel_ok(k) || !kn->conv_fwd) continue;
        tiers++;
        for (ci = 0; ci < (int)(sizeof cases / sizeof cases[0]) + nd; ci++) {
            int dec = ci >= (int)(sizeof cases / sizeof cases[0]);
            int64_t row[11], taken = dt__shift_taken;
            dt_conv_geom g;
            conv_io io;
            char what[128];
            memcpy(row, dec ? declined[ci - (int)(sizeof cases / sizeof cases[0])] : cases[ci], sizeof row);
            if (row[0] < dt_cpu_threads()) row[0] = dt_cpu_threads();   /* (they take an image per thread at least) */
            g = conv_geom(row);
            conv_io_make(&io, &g);
            if (!dec) {
                snprintf(what, sizeof what, "%s: shifted rows, case %d", kn->name, ci);
                conv_path_check(what, kn->conv_fwd, kn->conv_bwd, &st, &g, &io);
                CHECK(dt__shift_taken == taken + 6);
            } else {
                int fwd = kn->conv_fwd(&st, &g, io.x, io.W, io.b, io.y);
                CHECK(fwd == (ci + 1 == (int)(sizeof cases / sizeof cases[0]) + nd));
                CHECK(kn->conv_bwd(&st, &g, io.x, io.W, io.dy, io.dW, io.dx, 0) == 0);
                CHECK(dt__shift_taken == taken + fwd);
            }
            conv_io_free(&io);
        }
    }
    free(st.gemm_ws);
    if (!tiers) dt_t_skip("test_conv_shifted", "no tier of this build and CPU has shifted convolutions");
}

/* the same bits, or a failed check naming what differs */
static void twin_same(const void *a, const void *b, int64_t bytes, const char *what) {
    if (memcmp(a, b, (size_t)bytes) != 0) { dt_t_checks_failed++; printf("    %s differs from the portable twin\n", what); }
}

static void test_tier_twins(void) {
    /* n, c, h, w, oc, kh, kw, sh, sw, ph, pw: images of 2x2 and 4x4 (one permutation each), 8x8, 16x16 and
       32x32 (16-lane tiles), odd sizes, strides 1 and 2, 5x5 windows; rectangular windows, strides and padding
       on each of AVX-512's paths: images of 8 and 15 pixels (a gather of two images, a permutation), 16 x 8
       and 4 x 32 images of their own size (16-lane tiles of 2 rows and of a row's 16 columns), and the rest
       of a row at strides 2 x 1 and 1 x 2 */
    static const int64_t geoms[][11] = {SQ(3, 2, 2, 2, 4, 3, 1, 1), SQ(5, 3, 4, 4, 4, 3, 2, 1), SQ(4, 2, 8, 8, 4, 3, 1, 1),
                                        SQ(2, 3, 16, 16, 4, 3, 1, 1), SQ(2, 2, 32, 32, 4, 5, 1, 2), SQ(3, 2, 5, 7, 4, 3, 1, 0),
                                        SQ(2, 2, 7, 9, 4, 3, 2, 1), SQ(3, 1, 28, 28, 4, 5, 1, 2), SQ(9, 2, 2, 2, 4, 1, 1, 0),
                                        SQ(4, 3, 3, 3, 4, 2, 1, 1),
                                        {3, 2, 2, 4, 4, 1, 3, 1, 1, 0, 1}, {4, 2, 2, 2, 4, 2, 1, 1, 1, 1, 0},
                                        {2, 2, 5, 3, 4, 3, 1, 1, 1, 1, 0}, {2, 2, 16, 8, 4, 3, 1, 1, 1, 1, 0},
                                        {2, 2, 4, 32, 4, 1, 5, 1, 1, 0, 2}, {2, 3, 9, 13, 4, 2, 5, 2, 1, 1, 2},
                                        {2, 3, 13, 9, 4, 5, 2, 1, 2, 2, 0}, {2, 2, 11, 10, 4, 3, 2, 2, 2, 1, 0}};
    const dt__kernel *k = dt__kernels[twin_tier], *p = &dt__kernel_portable;
    int gi, used = 0;
    char what[96];
    for (gi = 0; gi < (int)(sizeof geoms / sizeof geoms[0]); gi++) {
        dt_conv_geom g = conv_geom(geoms[gi]);
        int64_t xs, cs;
        float *x, *c1, *c2, *d1, *d2;
        xs = g.n * g.c * g.h * g.w;
        cs = g.c * g.kh * g.kw * g.n * g.oh * g.ow;
        x = twin_alloc(xs); c1 = twin_alloc(cs); c2 = twin_alloc(cs); d1 = twin_alloc(xs); d2 = twin_alloc(xs);
        dt_t_fill(x, xs, -1, 1);
        dt__im2col(k, &g, x, c1);     /* data movement: the same floats */
        dt__im2col(NULL, &g, x, c2);
        snprintf(what, sizeof what, "%s im2col, geometry %d", k->name, gi);
        twin_same(c1, c2, (int64_t)sizeof(float) * cs, what);
        dt_t_fill(c1, cs, -1, 1);
        dt_t_fill(d1, xs, -1, 1);
        memcpy(d2, d1, sizeof(float) * (size_t)xs);
        dt__col2im(k, &g, c1, d1);    /* the taps added in the portable loop's order: the same bits */
        dt__col2im(NULL, &g, c1, d2);
        snprintf(what, sizeof what, "%s col2im, geometry %d", k->name, gi);
        twin_same(d1, d2, (int64_t)sizeof(float) * xs, what);
        {   /* the convolution GEMMs' packing of op(B) from the images, both ways round, with the tier's panels */
            dt__bsrc bs;
            int64_t kk = g.c * g.kh * g.kw, ns = g.n * g.oh * g.ow, tb;
            int64_t kc = kk < DT__KC ? kk : DT__KC, nc = ns < 100 ? ns : 100;
            float *tmp = twin_alloc((int64_t)DT__KC * (DT__NC + DT__NR_MAX)), *b1, *b2;
            for (tb = 0; tb < 2; tb++) {
                int64_t rows = tb ? (ns < DT__KC ? ns : DT__KC) : kc, cols = tb ? (kk < 100 ? kk : 100) : nc;
                int64_t np = (cols + k->nr - 1) / k->nr * k->nr * rows;
                b1 = twin_alloc(np); b2 = twin_alloc(np);
                bs.B = x; bs.ldb = 0; bs.tb = (int)tb; bs.g = &g;
                dt__pack_b(k, &bs, 0, rows, 0, cols, b1, k->nr, tmp);
                dt__pack_b(p, &bs, 0, rows, 0, cols, b2, k->nr, tmp);
                snprintf(what, sizeof what, "%s packing of im2col%s, geometry %d", k->name, tb ? "^T" : "", gi);
                twin_same(b1, b2, (int64_t)sizeof(float) * np, what);
                free(b1); free(b2);
            }
            free(tmp);
        }
        free(x); free(c1); free(c2); free(d1); free(d2);
        used++;
    }
    {   /* the GEMM's packing of matrices: A's 8-tall panels, B^T's panels */
        const int64_t M = 19, K = 37, lda = K + 3, N = 61, ldb = K + 1;
        float *A = twin_alloc(M * lda), *B = twin_alloc(N * ldb), *a1 = twin_alloc(24 * K), *a2 = twin_alloc(24 * K);
        float *tmp = twin_alloc((int64_t)DT__KC * (DT__NC + DT__NR_MAX));
        int64_t np = (N + k->nr - 1) / k->nr * k->nr * K;
        float *b1 = twin_alloc(np), *b2 = twin_alloc(np);
        dt__bsrc bs;
        dt_t_fill(A, M * lda, -1, 1);
        dt_t_fill(B, N * ldb, -1, 1);
        dt__pack_a(k, 0, A, lda, 0, M, 2, K - 2, a1, 8);
        dt__pack_a(p, 0, A, lda, 0, M, 2, K - 2, a2, 8);
        twin_same(a1, a2, (int64_t)sizeof(float) * 24 * (K - 2), "packing of A");
        bs.B = B; bs.ldb = ldb; bs.tb = 1; bs.g = NULL;
        dt__pack_b(k, &bs, 1, K - 1, 0, N, b1, k->nr, tmp);
        dt__pack_b(p, &bs, 1, K - 1, 0, N, b2, k->nr, tmp);
        twin_same(b1, b2, (int64_t)sizeof(float) * np, "packing of B^T");
        free(A); free(B); free(a1); free(a2); free(b1); free(b2); free(tmp);
    }
    {   /* 2 x 2 max pooling: values and indices, ties and NaN (the first maximum, the first NaN); then the
           windows next to it, which its row kernel must leave to the general loop: 2 x 2 at strides 2 x 1 and
           1 x 2 or padded 0 x 1 and 1 x 0, 2 x 1 and 1 x 2 at stride 2, 3 x 2 and 2 x 3; each also against
           dt_body_maxpool_window, window by window */
        /* rows of 19, 1, 33, 13 and 8 outputs: whole and partial steps of 16 (AVX-512) and of 8 (AVX2) */
        static const int64_t shapes[][4] = {{3, 4, 8, 38}, {2, 3, 2, 2}, {1, 2, 6, 66}, {2, 2, 4, 26}, {1, 3, 4, 16}};
        static const int64_t windows[][6] = {{2, 2, 2, 2, 0, 0}, {2, 2, 2, 1, 0, 0}, {2, 2, 1, 2, 0, 0}, {2, 2, 2, 2, 0, 1},
                                             {2, 2, 2, 2, 1, 0}, {2, 1, 2, 2, 0, 0}, {1, 2, 2, 2, 0, 0}, {3, 2, 2, 1, 1, 0},
                                             {2, 3, 1, 2, 0, 1}};
        int si, wi;
        for (si = 0; si < 5; si++)
            for (wi = 0; wi < (int)(sizeof windows / sizeof windows[0]); wi++) {
                dt_conv_geom g;
                int64_t xs, ys, i, nc, o, at;
                float *x, *y1, *y2, best;
                int32_t *i1, *i2;
                memset(&g, 0, sizeof g);
                g.n = shapes[si][0]; g.c = shapes[si][1]; g.h = shapes[si][2]; g.w = shapes[si][3];
                g.kh = windows[wi][0]; g.kw = windows[wi][1]; g.sh = windows[wi][2]; g.sw = windows[wi][3];
                g.ph = windows[wi][4]; g.pw = windows[wi][5];
                CHECK_OK(dt_conv_geom_resolve(&g));
                g.oc = g.c;
                xs = g.n * g.c * g.h * g.w; ys = g.n * g.c * g.oh * g.ow;
                x = twin_alloc(xs); y1 = twin_alloc(ys); y2 = twin_alloc(ys);
                i1 = (int32_t *)calloc((size_t)ys, sizeof(int32_t)); i2 = (int32_t *)calloc((size_t)ys, sizeof(int32_t));
                dt_t_fill(x, xs, -1, 1);
                for (i = 0; i < xs; i += 7) x[i] = x[i + 1 < xs ? i + 1 : i];   /* ties */
                for (i = 5; i < xs; i += 23) x[i] = NAN;
                dt__maxpool_fwd(k, &g, x, y1, i1);
                dt__maxpool_fwd(NULL, &g, x, y2, i2);
                snprintf(what, sizeof what, "%lld x %lld max pooling's maxima, window %d", (long long)g.kh, (long long)g.kw, wi);
                twin_same(y1, y2, (int64_t)sizeof(float) * ys, what);
                twin_same(i1, i2, (int64_t)sizeof(int32_t) * ys, "max pooling's indices");
                for (nc = 0; nc < g.n * g.c; nc++)
                    for (o = 0; o < g.oh * g.ow; o++) {
                        best = dt_body_maxpool_window(&g, x + nc * g.h * g.w, o / g.ow, o % g.ow, &at);
                        CHECK(i1[nc * g.oh * g.ow + o] == at);
                        CHECK(memcmp(&y1[nc * g.oh * g.ow + o], &best, sizeof best) == 0);
                    }
                free(x); free(y1); free(y2); free(i1); free(i2);
            }
    }
    {   /* batch norm's channel sums in double: x, x*x; x, x*y; through a ReLU's mask; rows with tails. The
           AVX2 tier adds in the portable order: the same bits; AVX-512's lanes add in another order */
        static const int64_t shapes[][3] = {{3, 2, 37}, {4, 3, 64}, {2, 1, 5}, {5, 2, 1024}};
        const int exact = strcmp(k->name, "avx2") == 0;
        int si, kind;
        for (si = 0; si < 4; si++)
            for (kind = 0; kind < 3; kind++) {
                int64_t n = shapes[si][0], c = shapes[si][1], s = shapes[si][2], ch;
                float *x = twin_alloc(n * c * s), *y = twin_alloc(n * c * s), *db1 = twin_alloc(c), *db2 = twin_alloc(c);
                dt_t_fill(x, n * c * s, -1, 1);
                dt_t_fill(y, n * c * s, -1, 1);
                for (ch = 0; ch < c; ch++) {
                    double a1, b1, a2, b2;
                    const float *yy = kind == 1 ? y + ch * s : NULL, *mk = kind == 2 ? y + ch * s : NULL;
                    dt__bn_sums(k, x + ch * s, yy, mk, n, c * s, s, &a1, &b1);
                    dt__bn_sums(NULL, x + ch * s, yy, mk, n, c * s, s, &a2, &b2);
                    CHECK(fabs(a1 - a2) <= 1e-12 * (1.0 + fabs(a2)) && fabs(b1 - b2) <= 1e-12 * (1.0 + fabs(b2)));
                    if (exact) twin_same(&a1, &a2, (int64_t)sizeof a1, "batch norm's sum");
                    if (exact) twin_same(&b1, &b2, (int64_t)sizeof b1, "batch norm's sum of products");
                }
                dt__channel_sums(k, db1, x, n, c, s);
                dt__channel_sums(NULL, db2, x, n, c, s);
                CHECK_CLOSE(db1, db2, c, 1e-6, "channel sums");
                if (exact) twin_same(db1, db2, (int64_t)sizeof(float) * c, "channel sums");
                free(x); free(y); free(db1); free(db2);
            }
    }
    printf("    %s: im2col, col2im and the packing on %d geometries, pooling, channel sums\n", k->name, used);
}

/* The busy-machine watch (dtrain/cpu/cpu.h, dt_cpu_adapt_count): its decisions on a script of times and
   delays, and the delays it reads on this machine under load. */
#if DT__ADAPT
static double adapt_now, adapt_delay[2];
static double adapt_clock(void) { return adapt_now; }
static double adapt_delays(int n, double *d) {
    int i;
    for (i = 0; i < n; i++) d[i] = adapt_delay[i % 2];
    return 0;
}
/* one window of the script: the time becomes t, thread 1 waited `wait` more seconds; the team size after it */
static int adapt_at(double t, double wait) {
    adapt_now = t;
    adapt_delay[1] += wait;
    dt__cpu_adapt();
    return dt_cpu_threads();
}
#endif
static void test_cpu_adapt_decisions(void) {
#if DT__ADAPT
    int saved = omp_get_max_threads();
    const char *env = getenv("DT_CPU_ADAPT");
    if (env) { dt_t_skip("test_cpu_adapt_decisions", "DT_CPU_ADAPT is set"); return; }
    omp_set_num_threads(2);
    memset(&dt__adapt, 0, sizeof dt__adapt);
    dt__adapt.window = 1;
    dt__adapt_clock = adapt_clock;
    dt__adapt_delays = adapt_delays;
    CHECK(adapt_at(0, 0) == 2 && dt__adapt.state == 1 && dt_cpu_adapt_count() == 0);
    CHECK(adapt_at(0.5, 0.4) == 2);    /* within the window: nothing decided */
    CHECK(adapt_at(1, 0.1) == 2);      /* waited half the window: once is not enough */
    CHECK(adapt_at(2, 0.5) == 1 && dt_cpu_adapt_count() == 1);   /* twice: one thread fewer */
    CHECK(dt__cpu_threads_most() == 2);                          /* workspaces stay sized for two */
    CHECK(adapt_at(3, 0) == 1 && adapt_at(9, 0) == 1);           /* 8 windows before it tries again */
    CHECK(adapt_at(10, 0) == 2 && dt_cpu_adapt_count() == 2);    /* tries one more */
    CHECK(adapt_at(11, 0.5) == 1 && dt_cpu_adapt_count() == 3);  /* still busy: back, and waits twice as long */
    CHECK(adapt_at(26, 0) == 1 && adapt_at(27, 0) == 2);         /* 16 windows later */
    CHECK(adapt_at(28, 0) == 2 && dt_cpu_adapt_count() == 4);    /* nobody waited: kept */
    CHECK(adapt_at(29, 0.1) == 2 && adapt_at(30, 0.1) == 2 && adapt_at(31, 0.1) == 2);   /* a tenth is not busy */
    CHECK(adapt_at(32, 5) == 2 && adapt_at(33, 5) == 2);         /* a growth longer than the window is not a wait */
    omp_set_num_threads(3);                                      /* the program's own size becomes the most */
    CHECK(adapt_at(34, 0) == 3 && dt__adapt.most == 3 && dt__cpu_threads_most() == 3);
    CHECK(adapt_at(35, 0.5) == 3 && adapt_at(36, 0.5) == 2 && dt__cpu_threads_most() == 3);
    /* DT_CPU_ADAPT=0: off */
    memset(&dt__adapt, 0, sizeof dt__adapt);
    dt__adapt.window = 1;
    dt_t_setenv("DT_CPU_ADAPT", "0");
    CHECK(adapt_at(40, 0) == 2 && adapt_at(41, 1) == 2 && adapt_at(42, 1) == 2 && adapt_at(43, 1) == 2);
    CHECK(dt__adapt.state == -1 && dt_cpu_adapt_count() == 0);
    dt_t_unsetenv("DT_CPU_ADAPT");
    memset(&dt__adapt, 0, sizeof dt__adapt);
    dt__adapt_clock = dt_time_now;
    dt__adapt_delays = dt__team_delay;
    omp_set_num_threads(saved);
#else
    dt_t_skip("test_cpu_adapt_decisions", "no OpenMP, or not Linux: the watch is off");
#endif
}
#if DT__ADAPT
static volatile int hog_stop;
static volatile double hog_sink;
static void hog(void *arg) {
    (void)arg;
    while (!hog_stop) hog_sink = hog_sink * 1.0000001 + 1e-9;
}
#endif
static void test_cpu_adapt_reads(void) {
#if DT__ADAPT
    double d[2] = {-1, -1}, before, t0;
    dt__thread hogs[8];
    int i, n = dt__cpu_count() * 2;
    CHECK(dt__thread_delay() >= 0);   /* Linux's /proc/thread-self/schedstat (every distribution's kernel has it) */
    CHECK(dt__team_delay(2, d) == 0 && d[0] >= 0 && d[1] >= 0);
    if (n > 8) n = 8;
    before = dt__thread_delay();
    hog_stop = 0;
    for (i = 0; i < n; i++) CHECK(dt__thread_start(&hogs[i], hog, NULL) == 0);
    for (t0 = dt_time_now(); dt_time_now() - t0 < 0.3;) hog_sink += 1;
    hog_stop = 1;
    for (i = 0; i < n; i++) dt__thread_join(&hogs[i]);
    /* twice as many spinning threads as CPUs: this thread waited for one */
    CHECK(dt__thread_delay() - before > 0.01);
#else
    dt_t_skip("test_cpu_adapt_reads", "no OpenMP, or not Linux: the watch is off");
#endif
}

static void test_cpu_tier(void) {
    const char *was = dt_cpu_tier();
#ifdef __aarch64__
    const char *foreign = "avx2", *arch = "x86-64";   /* a tier of the other architecture, and its name */
#else
    const char *foreign = "neon", *arch = "aarch64";
#endif
    int k;
    CHECK(was && *was);
    CHECK_OK(dt_cpu_set_tier("portable"));   /* the tier every CPU runs, in every build */
    CHECK(dt__pick_kernel() == &dt__kernel_portable && strcmp(dt_cpu_tier(), dt__kernel_portable.name) == 0);
    CHECK_ERR(dt_cpu_set_tier("avx9000"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "avx9000") && strstr(dt_last_error(), "portable") && strstr(dt_last_error(), "neon"));
    CHECK(dt__pick_kernel() == &dt__kernel_portable);   /* a refused name keeps the tier */
    CHECK_ERR(dt_cpu_set_tier(foreign), DT_ERR_UNSUPPORTED);
    CHECK(strstr(dt_last_error(), "build") && strstr(dt_last_error(), arch));
    for (k = 0; k < DT__NKERNELS; k++) {             /* every tier of this build: chosen where the CPU runs it */
        if (dt__kernel_ok(k)) { CHECK_OK(dt_cpu_set_tier(dt__kernels[k]->name)); CHECK(dt__pick_kernel() == dt__kernels[k]); }
        else { CHECK_ERR(dt_cpu_set_tier(dt__kernels[k]->name), DT_ERR_UNSUPPORTED); CHECK(strstr(dt_last_error(), "lacks")); }
    }
    {   /* a tier of another CPU (avx512 off x86-64, neon off aarch64) is named, but refused by this build */
        const char *other = dt__kernel_find("neon") == -2 ? "neon" : "avx512";
        CHECK(dt__kernel_find(other) == -2);
        CHECK_ERR(dt_cpu_set_tier(other), DT_ERR_UNSUPPORTED);
        CHECK(strstr(dt_last_error(), "build"));
    }
    CHECK_OK(dt_cpu_set_tier(NULL));   /* the default: $DT_CPU's tier, else the first tier this CPU runs */
    CHECK(strcmp(dt_cpu_tier(), was) == 0);
    for (k = 0; !dt__kernel_ok(k); k++) {}
    if (!getenv("DT_CPU")) CHECK(dt__pick_kernel() == dt__kernels[k]);
}

static void test_geom_errors(void) {
    dt_conv_geom g;
    memset(&g, 0, sizeof g);
    g.c = 1; g.h = 2; g.w = 2; g.kh = g.kw = 5; g.sh = g.sw = 1;
    CHECK_ERR(dt_conv_geom_resolve(&g), DT_ERR_SHAPE);
    g.kh = g.kw = 0;
    CHECK_ERR(dt_conv_geom_resolve(&g), DT_ERR_SHAPE);
    g.h = 2; g.w = 9; g.kh = 5; g.kw = 3; g.ph = 1; g.pw = 0;   /* too tall, not too wide: both axes named */
    CHECK_ERR(dt_conv_geom_resolve(&g), DT_ERR_SHAPE);
    CHECK(strstr(dt_last_error(), "kernel 5x3") && strstr(dt_last_error(), "padded input 4x9") && strstr(dt_last_error(), "padding 1x0"));
    g.ph = 2;
    CHECK_OK(dt_conv_geom_resolve(&g));
    CHECK(g.oh == 2 && g.ow == 7);
}

/* The CPU backend's large buffers (a model's activation arena) are backed by transparent huge pages where Linux
   leaves that to the program (dt__advise_huge): a 32 MiB buffer of the CPU ops' alloc, once written, has some in
   /proc/self/smaps. Where the kernel's mode is not "madvise" (always: they come anyway; never: they cannot) there
   is nothing to tell, and x86-64 only: qemu-user (the other machines' runs) takes the advice and drops it. Not in
   the build that keeps to macOS's POSIX subset (DT_POSIX_MINIMAL), which gives no advice, as macOS has none. */
static void test_alloc_huge_pages(void) {
#if defined(__linux__) && defined(__x86_64__) && !defined(DT_POSIX_MINIMAL)
    char mode[256] = "", line[512];
    size_t bytes = (size_t)32 << 20;
    unsigned long lo, hi, at;
    long kb = 0, k;
    int in = 0;
    char *p;
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) { if (!fgets(mode, sizeof mode, f)) mode[0] = 0; fclose(f); }
    if (!strstr(mode, "[madvise]")) { printf("     (transparent huge pages are not \"madvise\" here: %s)\n", mode); return; }
    p = (char *)dt_cpu_ops()->alloc(NULL, (int64_t)bytes);
    CHECK(p != NULL);
    if (!p) return;
    memset(p, 1, bytes);
    at = (unsigned long)(uintptr_t)p;
    if ((f = fopen("/proc/self/smaps", "r")) != NULL) {   /* the advice splits the mapping: each part that overlaps */
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
                in = lo < at + bytes && hi > at;
            else if (in && sscanf(line, "AnonHugePages: %ld kB", &k) == 1) kb += k;
        }
        fclose(f);
    }
    CHECK(kb >= 2048);
    if (kb < 2048) printf("     the 32 MiB buffer has %ld kB of huge pages\n", kb);
    dt_cpu_ops()->free(NULL, p);
#endif
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_core (%d threads)\n", dt_cpu_threads());
    RUN(test_result_strings);
    RUN(test_logger);
    RUN(test_rng);
    RUN(test_timer);
    RUN(test_tensor);
    RUN(test_alloc_huge_pages);
    RUN(test_progress);
    RUN(test_gemm_vs_naive);
    RUN(test_gemm_blocks);
    RUN(test_gemm_bf16);
    RUN(test_model_bf16);
    RUN(test_gemm_beta_zero_ignores_c);
    RUN(test_conv_vs_direct);
    RUN(test_conv_taps);
    RUN(test_conv_shifted);
    RUN(test_cpu_tier);
    RUN(test_cpu_adapt_decisions);
    RUN(test_cpu_adapt_reads);
    for (twin_tier = 0; twin_tier < DT__NKERNELS; twin_tier++) {   /* each faster tier against the portable one */
        char name[64];
        if (dt__kernels[twin_tier] == &dt__kernel_portable) continue;
        snprintf(name, sizeof name, "test_tier_twins[%s]", dt__kernels[twin_tier]->name);
        if (tier_runs(twin_tier, "test_tier_twins")) dt_t_run(name, test_tier_twins);
    }
    if (DT__NKERNELS == 1) dt_t_skip("test_tier_twins", "this build has only the portable tier (DT_NO_SIMD, or neither x86-64 nor aarch64)");
    RUN(test_geom_errors);
    return dt_t_summary();
}
