/* Every layer and loss, forward AND backward: against PyTorch's numbers (fixtures written by
   tests/gen_fixtures.py) and against finite differences on small odd shapes. */
#include "dt_test_hooks.h"   /* dt_body_argmax_row, a loop body of the implementation */
#include "../dtrain.h"
#include "dt_test.h"

#define TOL 1e-4   /* relative error allowed against PyTorch */

static dt_model *new_model(int64_t c, int64_t h, int64_t w) {
    dt_model *m = NULL;
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    d.in_c = c; d.in_h = h; d.in_w = w; d.seed = 5; d.input_grad = 1;
    CHECK_OK(dt_model_create(&m, &d));
    return m;
}

/* Concatenates fixture records (those present) into one host array, in the given order. */
static float *concat(dt_t_fix *f, const char **names, int k, int64_t *count) {
    int64_t total = 0, n = 0, off = 0;
    float *out;
    int i;
    for (i = 0; i < k; i++) if (dt_t_has(f, names[i])) { dt_t_get(f, names[i], &n); total += n; }
    out = (float *)malloc(sizeof(float) * (size_t)(total + 1));
    for (i = 0; i < k; i++)
        if (dt_t_has(f, names[i])) {
            float *p = dt_t_get(f, names[i], &n);
            memcpy(out + off, p, sizeof(float) * (size_t)n);
            off += n;
        }
    *count = total;
    return out;
}

/* Runs a finalized one-layer model on the fixture's x and dy and compares y, dx and the parameter
   gradients (records named in gnames, concatenated) with PyTorch's. */
static void compare_layer(dt_model *m, dt_t_fix *f, int64_t batch, const char **pnames, const char **gnames, int np,
                          const char *what) {
    int64_t n = 0, ycount = 0, pc = 0;
    float *x = dt_t_get(f, "x", &n), *dy = dt_t_get(f, "dy", &ycount), *yref = dt_t_get(f, "y", NULL);
    float *dxref = dt_t_get(f, "dx", NULL), *y;
    char msg[96];
    if (!x || !dy || !yref || !dxref) return;
    if (np) {
        float *p = concat(f, pnames, np, &pc);
        CHECK_OK(dt_model_set_params(m, p, pc));
        free(p);
    }
    y = (float *)malloc(sizeof(float) * (size_t)ycount);
    CHECK_OK(dt_model_forward(m, x, batch));
    CHECK_OK(dt_model_get_output(m, y, ycount));
    snprintf(msg, sizeof msg, "%s: y", what);
    CHECK_CLOSE(y, yref, ycount, TOL, msg);
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_backward(m, dy));
    snprintf(msg, sizeof msg, "%s: dx", what);
    CHECK_CLOSE(dt_model_node_grad(m, 0), dxref, n, TOL, msg);
    if (np) {
        int64_t gc;
        float *gref = concat(f, gnames, np, &gc), *g = (float *)malloc(sizeof(float) * (size_t)(gc + 1));
        CHECK(gc == pc);
        CHECK_OK(dt_model_get_grads(m, g, gc));
        snprintf(msg, sizeof msg, "%s: parameter gradients", what);
        CHECK_CLOSE(g, gref, gc, TOL, msg);
        free(g); free(gref);
    }
    free(y);
}

static const char *P_WB[] = {"w", "b"}, *G_WB[] = {"dw", "db"};

static void test_torch_linear(void) {
    const char *cases[] = {"linear_a", "linear_b"};
    int i;
    for (i = 0; i < 2; i++) {
        dt_t_fix f;
        float *cfg;
        dt_model *m;
        if (dt_t_fix_load(&f, cases[i])) continue;
        cfg = dt_t_get(&f, "cfg", NULL);
        m = new_model((int64_t)cfg[1], 0, 0);
        dt_linear(m, dt_model_input(m), (int64_t)cfg[2], (int)cfg[3]);
        CHECK_OK(dt_model_finalize(m));
        compare_layer(m, &f, (int64_t)cfg[0], P_WB, G_WB, 2, cases[i]);
        dt_model_destroy(m);
        dt_t_fix_free(&f);
    }
}

/* The convolutions against PyTorch: square windows (cfg N C H W OC K stride pad bias), and rectangular ones
   (cfg N C H W OC KH KW SH SW PH PW bias: 1 x 3 at stride 1 x 2, 3 x 1 at 2 x 1, 5 x 2 at 2 x 2 padded 2 x 1,
   2 x 5 padded 1 x 2, 1 x 4 at stride 1 x 3 on one row without bias), by whichever path the CPU tier takes */
static void test_torch_conv2d(void) {
    const char *cases[] = {"conv2d_a", "conv2d_b", "conv2d_c", "conv2d_d", "conv2d_e", "conv2d_rect_a", "conv2d_rect_b",
                           "conv2d_rect_c", "conv2d_rect_d", "conv2d_rect_e"};
    int i;
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        dt_t_fix f;
        float *cfg;
        int64_t nc = 0;
        dt_model *m;
        dt_conv2d_desc d;
        if (dt_t_fix_load(&f, cases[i])) continue;
        cfg = dt_t_get(&f, "cfg", &nc);
        m = new_model((int64_t)cfg[1], (int64_t)cfg[2], (int64_t)cfg[3]);
        memset(&d, 0, sizeof d);
        d.out_channels = (int64_t)cfg[4];
        if (nc == 12) {
            d.kernel_h = (int64_t)cfg[5]; d.kernel_w = (int64_t)cfg[6]; d.stride_h = (int64_t)cfg[7]; d.stride_w = (int64_t)cfg[8];
            d.pad_h = (int64_t)cfg[9]; d.pad_w = (int64_t)cfg[10];
        } else {
            d.kernel = (int64_t)cfg[5]; d.stride = (int64_t)cfg[6]; d.pad = (int64_t)cfg[7];
        }
        d.no_bias = cfg[nc - 1] == 0.0f;
        CHECK(dt_conv2d_ex(m, dt_model_input(m), &d) == 1);
        CHECK_OK(dt_model_finalize(m));
        compare_layer(m, &f, (int64_t)cfg[0], P_WB, G_WB, 2, cases[i]);
        dt_model_destroy(m);
        dt_t_fix_free(&f);
    }
}

/* cfg N C H W K stride pad (dt_maxpool2d, dt_avgpool2d), or N C H W KH KW SH SW PH PW (the _ex forms) */
static void pool_cases(const char **cases, int k, int maxpool) {
    int i;
    for (i = 0; i < k; i++) {
        dt_t_fix f;
        float *cfg;
        int64_t nc = 0;
        dt_model *m;
        if (dt_t_fix_load(&f, cases[i])) continue;
        cfg = dt_t_get(&f, "cfg", &nc);
        m = new_model((int64_t)cfg[1], (int64_t)cfg[2], (int64_t)cfg[3]);
        if (nc == 10) {
            dt_pool2d_desc d;
            memset(&d, 0, sizeof d);
            d.kernel_h = (int64_t)cfg[4]; d.kernel_w = (int64_t)cfg[5]; d.stride_h = (int64_t)cfg[6]; d.stride_w = (int64_t)cfg[7];
            d.pad_h = (int64_t)cfg[8]; d.pad_w = (int64_t)cfg[9];
            CHECK((maxpool ? dt_maxpool2d_ex(m, 0, &d) : dt_avgpool2d_ex(m, 0, &d)) == 1);
        } else if (maxpool) dt_maxpool2d(m, 0, (int64_t)cfg[4], (int64_t)cfg[5], (int64_t)cfg[6]);
        else dt_avgpool2d(m, 0, (int64_t)cfg[4], (int64_t)cfg[5], (int64_t)cfg[6]);
        CHECK_OK(dt_model_finalize(m));
        compare_layer(m, &f, (int64_t)cfg[0], NULL, NULL, 0, cases[i]);
        dt_model_destroy(m);
        dt_t_fix_free(&f);
    }
}
/* rectangular: 2 x 3 at stride 2 x 1 padded 1 x 1, 3 x 1 at 2 x 1 padded 1 x 0, 1 x 3 at 1 x 2 padded 0 x 1 */
static void test_torch_maxpool(void) {
    const char *cases[] = {"maxpool_a", "maxpool_b", "maxpool_c", "maxpool_rect_a", "maxpool_rect_b", "maxpool_rect_c"};
    pool_cases(cases, 6, 1);
}
/* Max pooling's ties and NaN, by the 2 x 2 stride-2 path and the general one (a 2 x 2 window at stride 1 on
   the same rows): the first maximum in scan order wins, a NaN wins over numbers and the first NaN over
   later ones; the gradient goes to the winner only. */
static void test_maxpool_ties_nan(void) {
    const float nan = (float)NAN;
    /* one 2 x 8 image: windows (cols 0-1) tie 3,3 / 3,1 -> first; (2-3) 1 NaN / 5 NaN -> first NaN (row 0);
       (4-5) -1 -1 / -1 -1 -> first; (6-7) 0 2 / 7 7 -> row 1's first 7 */
    static const float img[16] = {3, 3, 1, 0, -1, -1, 0, 2, 3, 1, 5, 0, -1, -1, 7, 7};
    float x[16], y[4], dy[4] = {1, 2, 3, 4}, dx[16], want_dx[16] = {1, 0, 0, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0};
    int stride, i;
    memcpy(x, img, sizeof x);
    x[3] = nan; x[11] = nan;
    for (stride = 2; stride >= 1; stride--) {
        dt_model *m = new_model(1, 2, 8);
        int node = dt_maxpool2d(m, 0, 2, stride, 0);
        CHECK_OK(dt_model_finalize(m));
        CHECK_OK(dt_model_forward(m, x, 1));
        if (stride == 2) {
            CHECK(dt_model_node_size(m, node) == 4);
            CHECK_OK(dt_model_get_output(m, y, 4));
            CHECK(y[0] == 3 && y[1] != y[1] && y[2] == -1 && y[3] == 7);
            CHECK_OK(dt_model_backward(m, dy));
            memcpy(dx, dt_model_node_grad(m, 0), sizeof dx);
            for (i = 0; i < 16; i++) CHECK(dx[i] == want_dx[i]);
        } else {   /* windows at columns 0, 2, 4, 6 of the stride-1 output are the same windows */
            float y1[7];
            CHECK(dt_model_node_size(m, node) == 7);
            CHECK_OK(dt_model_get_output(m, y1, 7));
            CHECK(y1[0] == 3 && y1[2] != y1[2] && y1[4] == -1 && y1[6] == 7);
        }
        dt_model_destroy(m);
    }
    {   /* rows long enough for the vector path (32 columns a step) and its scalar tail: 2 x 2 images of 2 x 70
           from {-1, 0, 1, NaN}, so ties and NaN are everywhere; each window against the rule */
        float xs[2 * 140], ys[2 * 35], dys[2 * 35], dxs[2 * 140];
        dt_model *m = new_model(2, 2, 70);
        uint64_t st = 7;
        int k;
        for (i = 0; i < 2 * 140; i++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            k = (int)(st >> 60) % 4;
            xs[i] = k == 3 ? nan : (float)(k - 1);
        }
        for (i = 0; i < 2 * 35; i++) dys[i] = (float)(i + 1);
        dt_maxpool2d(m, 0, 2, 2, 0);
        CHECK_OK(dt_model_finalize(m));
        CHECK_OK(dt_model_forward(m, xs, 1));
        CHECK_OK(dt_model_get_output(m, ys, 2 * 35));
        CHECK_OK(dt_model_backward(m, dys));
        memcpy(dxs, dt_model_node_grad(m, 0), sizeof dxs);
        for (i = 0; i < 2 * 35; i++) {
            const float *w0 = xs + (i / 35) * 140 + 2 * (i % 35);
            const int taps[4] = {0, 1, 70, 71};
            int t, win = 0;
            for (t = 1; t < 4; t++)
                if (w0[taps[win]] == w0[taps[win]] && !(w0[taps[t]] <= w0[taps[win]])) win = t;
            CHECK(ys[i] == w0[taps[win]] || (ys[i] != ys[i] && w0[taps[win]] != w0[taps[win]]));
            for (t = 0; t < 4; t++) CHECK(dxs[w0 + taps[t] - xs] == (t == win ? dys[i] : 0.0f));
        }
        dt_model_destroy(m);
    }
}
/* the padding's zeros counted in the mean (count_include_pad); rectangular: the windows of the max pooling
   cases a and b, and 2 x 4 at stride 2 x 3 padded 0 x 2 */
static void test_torch_avgpool(void) {
    const char *cases[] = {"avgpool_a", "avgpool_b", "avgpool_rect_a", "avgpool_rect_b", "avgpool_rect_c"};
    pool_cases(cases, 5, 0);
}

/* Parameter-free layers: the fixture's cfg gives N, then the input shape, then the layer's settings. */
static int build_gap(dt_model *m, const float *cfg) { (void)cfg; return dt_global_avgpool(m, 0); }
static int build_relu(dt_model *m, const float *cfg) { (void)cfg; return dt_relu(m, 0); }
static int build_log_softmax(dt_model *m, const float *cfg) { (void)cfg; return dt_log_softmax(m, 0); }
static int build_shortcut(dt_model *m, const float *cfg) {   /* N C H W stride pad_each_side */
    return dt_pad_shortcut(m, 0, (int64_t)(cfg[1] + 2 * cfg[5]), (int64_t)cfg[4]);
}
static void test_torch_gap_relu_logsoftmax_shortcut(void) {
    static const struct { const char *fixture; int image; int (*build)(dt_model *, const float *); } cases[] = {
        {"gap_a", 1, build_gap}, {"relu_a", 0, build_relu}, {"log_softmax_a", 0, build_log_softmax},
        {"pad_shortcut_a", 1, build_shortcut}};
    int i;
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        dt_t_fix f;
        float *cfg;
        dt_model *m;
        if (dt_t_fix_load(&f, cases[i].fixture)) continue;
        cfg = dt_t_get(&f, "cfg", NULL);
        m = cases[i].image ? new_model((int64_t)cfg[1], (int64_t)cfg[2], (int64_t)cfg[3]) : new_model((int64_t)cfg[1], 0, 0);
        cases[i].build(m, cfg);
        CHECK_OK(dt_model_finalize(m));
        compare_layer(m, &f, (int64_t)cfg[0], NULL, NULL, 0, cases[i].fixture);
        dt_model_destroy(m);
        dt_t_fix_free(&f);
    }
}

static void bn_case(const char *name, int twod, int training) {
    dt_t_fix f;
    float *cfg, *rm0, *rv0, bufs[64];
    int64_t c, nb, n;
    dt_model *m;
    if (dt_t_fix_load(&f, name)) return;
    cfg = dt_t_get(&f, "cfg", NULL);   /* 2d: N C H W eps momentum;  1d: N D eps momentum */
    c = (int64_t)cfg[1];
    m = twod ? new_model(c, (int64_t)cfg[2], (int64_t)cfg[3]) : new_model(c, 0, 0);
    dt_batchnorm_ex(m, 0, twod ? cfg[4] : cfg[2], twod ? cfg[5] : cfg[3]);
    CHECK_OK(dt_model_finalize(m));
    rm0 = dt_t_get(&f, "rm0", NULL); rv0 = dt_t_get(&f, "rv0", &n);
    if (!rm0 || !rv0) { dt_model_destroy(m); dt_t_fix_free(&f); return; }
    CHECK(dt_model_buffers(m, &nb) && nb == 2 * c && nb <= 64);
    memcpy(bufs, rm0, sizeof(float) * (size_t)c);
    memcpy(bufs + c, rv0, sizeof(float) * (size_t)c);
    CHECK_OK(dt_model_set_buffers(m, bufs, nb));
    CHECK_OK(dt_model_set_mode(m, training ? DT_MODE_TRAIN : DT_MODE_EVAL));
    compare_layer(m, &f, (int64_t)cfg[0], P_WB, G_WB, 2, name);
    if (training) {
        float *rm1 = dt_t_get(&f, "rm1", NULL), *rv1 = dt_t_get(&f, "rv1", NULL);
        CHECK_OK(dt_model_get_buffers(m, bufs, nb));
        if (rm1 && rv1) {
            CHECK_CLOSE(bufs, rm1, c, TOL, "running_mean after one step");
            CHECK_CLOSE(bufs + c, rv1, c, TOL, "running_var after one step");
        }
    } else {
        CHECK_OK(dt_model_get_buffers(m, bufs, nb));
        CHECK(memcmp(bufs, rm0, sizeof(float) * (size_t)c) == 0);   /* eval leaves running stats alone */
    }
    dt_model_destroy(m);
    dt_t_fix_free(&f);
}
static void test_torch_batchnorm(void) {
    bn_case("bn2d_train", 1, 1);
    bn_case("bn2d_eval", 1, 0);
    bn_case("bn1d_train", 0, 1);
    bn_case("bn1d_eval", 0, 0);
}

/* Train-mode batch norm refuses one value per channel (a batch of 1 of a vector or of 1 x 1 maps), naming the
   layer, its shape and the fixes, as PyTorch refuses it; two values (a batch of 2, or a 2 x 1 map), and eval
   mode, are fine. */
static void test_batchnorm_one_value(void) {
    static const int64_t shapes[][4] = {{3, 0, 0, 1}, {3, 1, 1, 1}, {3, 0, 0, 2}, {3, 2, 1, 1}};   /* c h w batch */
    float x[12] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f, 1.0f, 2.0f, -3.0f, 0.0f, 0.5f, 1.0f};
    int s;
    for (s = 0; s < 4; s++) {
        dt_model *m = new_model(shapes[s][0], shapes[s][1], shapes[s][2]);
        int one = s < 2;
        dt_model_set_node_name(m, dt_batchnorm(m, 0), "bn_one");
        CHECK_OK(dt_model_finalize(m));
        if (one) {
            CHECK_ERR(dt_model_forward(m, x, shapes[s][3]), DT_ERR_SHAPE);
            CHECK(strstr(dt_last_error(), "bn_one") && strstr(dt_last_error(), "1 value per channel") &&
                  strstr(dt_last_error(), "[3, 1, 1]") && strstr(dt_last_error(), "at least 2") &&
                  strstr(dt_last_error(), "eval mode"));
            dt_model_set_mode(m, DT_MODE_EVAL);
        }
        CHECK_OK(dt_model_forward(m, x, shapes[s][3]));
        dt_model_destroy(m);
    }
}

/* Losses on an identity network (flatten of a vector input is the input itself). */
static void test_torch_losses(void) {
    const char *cases[] = {"xent_a", "nll_a", "mse_a"};
    int i;
    for (i = 0; i < 3; i++) {
        dt_t_fix f;
        float *cfg, *x, *lref, *dxref, loss = 0.0f;
        int64_t nx = 0, k;
        int32_t labels[64];
        dt_model *m;
        if (dt_t_fix_load(&f, cases[i])) continue;
        cfg = dt_t_get(&f, "cfg", NULL);   /* N K */
        x = dt_t_get(&f, "x", &nx); lref = dt_t_get(&f, "loss", NULL); dxref = dt_t_get(&f, "dx", NULL);
        m = new_model((int64_t)cfg[1], 0, 0);
        dt_flatten(m, 0);
        CHECK_OK(dt_model_finalize(m));
        CHECK_OK(dt_model_forward(m, x, (int64_t)cfg[0]));
        if (i < 2) {
            float *lab = dt_t_get(&f, "labels", NULL);
            for (k = 0; k < (int64_t)cfg[0]; k++) labels[k] = (int32_t)lab[k];
            CHECK_OK(i == 0 ? dt_model_loss_cross_entropy(m, labels, &loss) : dt_model_loss_nll(m, labels, &loss));
        } else {
            CHECK_OK(dt_model_loss_mse(m, dt_t_get(&f, "target", NULL), &loss));
        }
        CHECK_CLOSE(&loss, lref, 1, TOL, cases[i]);
        CHECK_OK(dt_model_backward(m, NULL));
        CHECK_CLOSE(dt_model_node_grad(m, 0), dxref, nx, TOL, cases[i]);
        dt_model_destroy(m);
        dt_t_fix_free(&f);
    }
}

/* ---- finite differences ------------------------------------------------------------------------ */

enum { GC_SUM, GC_XENT, GC_NLL, GC_MSE };

static double objective(dt_model *m, const float *x, int64_t batch, int mode, const float *r, const int32_t *labels,
                        const float *target, int64_t ycount) {
    double f = 0.0;
    int64_t i;
    float loss = 0.0f, *y;
    CHECK_OK(dt_model_forward(m, x, batch));
    if (mode == GC_XENT) { CHECK_OK(dt_model_loss_cross_entropy(m, labels, &loss)); return loss; }
    if (mode == GC_NLL) { CHECK_OK(dt_model_loss_nll(m, labels, &loss)); return loss; }
    if (mode == GC_MSE) { CHECK_OK(dt_model_loss_mse(m, target, &loss)); return loss; }
    y = (float *)malloc(sizeof(float) * (size_t)ycount);
    CHECK_OK(dt_model_get_output(m, y, ycount));
    for (i = 0; i < ycount; i++) f += (double)y[i] * (double)r[i];
    free(y);
    return f;
}

/* Checks the analytic gradient of the objective w.r.t. the input and every parameter tensor against
   central differences on up to 24 coordinates each. `spread` makes inputs distinct by at least 0.05 (for
   max and relu kinks). */
static void gradcheck(dt_model *m, int64_t batch, int mode, int spread, const char *what) {
    int64_t xs = batch * dt_model_node_size(m, 0), ys = batch * dt_model_node_size(m, dt_model_output_node(m));
    int64_t np, i, j, k = dt_model_node_size(m, dt_model_output_node(m));
    float *x = (float *)malloc(sizeof(float) * (size_t)xs), *r = (float *)malloc(sizeof(float) * (size_t)ys);
    float *target = (float *)malloc(sizeof(float) * (size_t)ys), *p = dt_model_params(m, &np), *ga, *dxa;
    int32_t labels[64];
    const double h = mode == GC_SUM ? 1e-2 : 1e-3;   /* losses are O(1) scalars: a smaller step keeps relu kinks out */
    double worst = 0.0;
    int bad = 0;
    for (i = 0; i < xs; i++) x[i] = dt_t_rand(-1.5f, 1.5f);
    if (spread) {   /* a random permutation of a grid, shifted off zero */
        for (i = 0; i < xs; i++) x[i] = 0.05f * (float)(i - xs / 2) + 0.025f;
        for (i = xs - 1; i > 0; i--) { j = (int64_t)dt_t_rand(0.0f, (float)i + 0.999f); float t = x[i]; x[i] = x[j]; x[j] = t; }
    }
    dt_t_fill(r, ys, -1, 1);
    dt_t_fill(target, ys, -1, 1);
    for (i = 0; i < batch; i++) labels[i] = (int32_t)(i * 7 % k);
    objective(m, x, batch, mode, r, labels, target, ys);
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_backward(m, mode == GC_SUM ? r : NULL));
    ga = (float *)malloc(sizeof(float) * (size_t)(np + 1));
    dxa = (float *)malloc(sizeof(float) * (size_t)xs);
    CHECK_OK(dt_model_get_grads(m, ga, np));
    memcpy(dxa, dt_model_node_grad(m, 0), sizeof(float) * (size_t)xs);
    /* coordinates: input first, then parameters */
    for (i = 0; i < 24 + 24 * dt_model_param_tensors(m); i++) {
        int t = (int)(i / 24) - 1;
        int64_t idx;
        float *slot, old, ana;
        double fp, fm, num, tol;
        if (t < 0) { idx = (int64_t)dt_t_rand(0.0f, (float)xs - 0.001f); slot = x + idx; ana = dxa[idx]; }
        else {
            dt_param_info pi = dt_model_param_info(m, t);
            idx = pi.offset + (int64_t)dt_t_rand(0.0f, (float)pi.count - 0.001f);
            slot = p + idx; ana = ga[idx];
        }
        old = *slot;
        *slot = old + (float)h; fp = objective(m, x, batch, mode, r, labels, target, ys);
        *slot = old - (float)h; fm = objective(m, x, batch, mode, r, labels, target, ys);
        *slot = old;
        num = (fp - fm) / (2.0 * h);
        tol = 1e-2 * fabs(num) + 2e-3;
        if (fabs(num - ana) > worst) worst = fabs(num - ana);
        if (fabs(num - ana) > tol) {
            if (bad++ < 3)
                printf("    %s: d/d%s[%lld] analytic %.6f numeric %.6f\n", what, t < 0 ? "x" : dt_model_param_info(m, t).name,
                       (long long)(t < 0 ? idx : idx - dt_model_param_info(m, t).offset), (double)ana, num);
        }
    }
    if (bad) { dt_t_checks_failed++; printf("    %s: %d coordinates off (worst |diff| %.3g)\n", what, bad, worst); }
    free(x); free(r); free(target); free(ga); free(dxa);
}

/* Finalizes a built model, sets its mode, checks its gradients and destroys it. */
static void gc_model(dt_model *m, int64_t batch, int mode, int training, int spread, const char *what) {
    CHECK_OK(dt_model_finalize(m));
    CHECK_OK(dt_model_set_mode(m, training ? DT_MODE_TRAIN : DT_MODE_EVAL));
    gradcheck(m, batch, mode, spread, what);
    dt_model_destroy(m);
}

static void gc_image(int64_t c, int64_t h, int64_t w, int64_t batch, int kind, int64_t a, int64_t b, int64_t s,
                     int64_t pd, int mode, const char *what) {
    dt_model *m = new_model(c, h, w);
    int x = 0;
    dt_conv2d_desc d;
    switch (kind) {
    case 0: memset(&d, 0, sizeof d); d.out_channels = a; d.kernel = b; d.stride = s; d.pad = pd; d.no_bias = mode;
            x = dt_conv2d_ex(m, x, &d); mode = GC_SUM; break;
    case 1: x = dt_maxpool2d(m, x, b, s, pd); break;
    case 2: x = dt_avgpool2d(m, x, b, s, pd); break;
    case 3: x = dt_global_avgpool(m, x); break;
    case 4: x = dt_batchnorm(m, x); break;
    case 5: x = dt_pad_shortcut(m, x, a, s); break;
    case 6: x = dt_relu(m, x); break;
    case 7: x = dt_add(m, dt_relu(m, x), x); break;   /* two consumers of the input: gradients must add */
    }
    (void)x;
    gc_model(m, batch, mode, 1, kind == 1 || kind == 6 || kind == 7, what);
}

static void test_gradcheck_conv(void) {
    gc_image(3, 7, 6, 2, 0, 4, 3, 2, 1, 0, "conv k3 s2 p1");
    gc_image(2, 5, 5, 3, 0, 3, 1, 1, 0, 0, "conv k1 s1 p0");
    gc_image(2, 6, 9, 2, 0, 2, 4, 3, 2, 1, "conv k4 s3 p2 no bias");
    gc_image(1, 9, 9, 1, 0, 2, 5, 1, 2, 0, "conv k5 s1 p2");
}
static void test_gradcheck_pools(void) {
    gc_image(2, 7, 6, 2, 1, 0, 3, 2, 1, GC_SUM, "maxpool k3 s2 p1");
    gc_image(2, 6, 6, 2, 1, 0, 2, 2, 0, GC_SUM, "maxpool k2 s2");
    gc_image(2, 7, 6, 2, 2, 0, 3, 2, 1, GC_SUM, "avgpool k3 s2 p1");
    gc_image(3, 5, 5, 2, 2, 0, 2, 1, 0, GC_SUM, "avgpool k2 s1");
    gc_image(3, 5, 4, 2, 3, 0, 0, 0, 0, GC_SUM, "global avgpool");
}
static void test_gradcheck_misc(void) {
    gc_image(3, 4, 5, 4, 4, 0, 0, 0, 0, GC_SUM, "batchnorm2d train");
    gc_image(3, 6, 5, 2, 5, 7, 0, 2, 0, GC_SUM, "pad shortcut s2");
    gc_image(2, 3, 3, 2, 6, 0, 0, 0, 0, GC_SUM, "relu");
    gc_image(2, 3, 3, 2, 7, 0, 0, 0, 0, GC_SUM, "residual add");
    {   /* batchnorm in eval mode, 1-D batchnorm, linear with and without bias, log-softmax */
        dt_model *m = new_model(3, 4, 5);
        dt_batchnorm(m, 0);
        gc_model(m, 3, GC_SUM, 0, 0, "batchnorm2d eval");
        m = new_model(6, 0, 0);
        dt_batchnorm(m, 0);
        gc_model(m, 5, GC_SUM, 1, 0, "batchnorm1d train");
        m = new_model(7, 0, 0);
        dt_linear(m, 0, 5, 1);
        gc_model(m, 3, GC_SUM, 1, 0, "linear");
        m = new_model(2, 3, 3);
        dt_linear(m, dt_flatten(m, 0), 4, 0);
        gc_model(m, 3, GC_SUM, 1, 0, "flatten + linear without bias");
        m = new_model(7, 0, 0);
        dt_log_softmax(m, 0);
        gc_model(m, 4, GC_SUM, 1, 0, "log-softmax");
    }
}
static void test_gradcheck_losses(void) {
    dt_model *m = new_model(7, 0, 0);
    dt_linear(m, 0, 5, 1);
    CHECK_OK(dt_model_finalize(m));
    gradcheck(m, 3, GC_XENT, 0, "linear + cross-entropy");
    gradcheck(m, 3, GC_MSE, 0, "linear + mse");
    dt_model_destroy(m);
    m = new_model(7, 0, 0);
    dt_log_softmax(m, dt_linear(m, 0, 5, 1));
    gc_model(m, 4, GC_NLL, 1, 0, "linear + log-softmax + nll");
    /* a small CNN end to end: conv, batchnorm, relu, pool, dropout (eval), linear, cross-entropy */
    m = new_model(2, 6, 6);
    {
        int x = dt_relu(m, dt_batchnorm(m, dt_conv2d(m, 0, 3, 3, 1, 1)));
        x = dt_dropout(m, dt_avgpool2d(m, x, 2, 2, 0), 0.3f);
        dt_linear(m, dt_flatten(m, x), 4, 1);
    }
    gc_model(m, 3, GC_XENT, 0, 0, "small CNN + cross-entropy");
}

/* Dropout: mask of 0 and 1/(1-p) at rate p in training, the same mask in backward, new masks each step,
   the same masks for the same seed, identity in eval. */
static void test_dropout(void) {
    const int64_t n = 20000;
    float *x = (float *)malloc(sizeof(float) * n), *y = (float *)malloc(sizeof(float) * n);
    float *y2 = (float *)malloc(sizeof(float) * n), *dy = (float *)malloc(sizeof(float) * n);
    dt_model *m = new_model(n, 0, 0), *m2 = new_model(n, 0, 0);
    int64_t i, zeros = 0, diff = 0;
    int bad = 0;
    dt_dropout(m, 0, 0.3f);
    dt_dropout(m2, 0, 0.3f);
    CHECK_OK(dt_model_finalize(m));
    CHECK_OK(dt_model_finalize(m2));
    dt_t_fill(x, n, 0.5f, 1.5f);
    dt_t_fill(dy, n, -1, 1);
    CHECK_OK(dt_model_forward(m, x, 1));
    CHECK_OK(dt_model_get_output(m, y, n));
    CHECK_OK(dt_model_backward(m, dy));
    for (i = 0; i < n; i++) {
        float mask = y[i] / x[i], dx = dt_model_node_grad(m, 0)[i];
        if (y[i] == 0.0f) { zeros++; bad += dx != 0.0f; }
        else { bad += fabsf(mask - 1.0f / 0.7f) > 1e-5f; bad += fabsf(dx - dy[i] * mask) > 1e-5f; }
    }
    CHECK(bad == 0);
    CHECK(zeros > 0.28 * n && zeros < 0.32 * n);
    CHECK_OK(dt_model_forward(m2, x, 1));                 /* same seed, same step: same mask */
    CHECK_OK(dt_model_get_output(m2, y2, n));
    CHECK(memcmp(y, y2, sizeof(float) * n) == 0);
    CHECK_OK(dt_model_forward(m, x, 1));                  /* next step: another mask */
    CHECK_OK(dt_model_get_output(m, y2, n));
    for (i = 0; i < n; i++) diff += (y[i] == 0.0f) != (y2[i] == 0.0f);
    CHECK(diff > n / 10);
    dt_model_set_mode(m, DT_MODE_EVAL);
    CHECK_OK(dt_model_forward(m, x, 1));
    CHECK_OK(dt_model_get_output(m, y2, n));
    CHECK(memcmp(x, y2, sizeof(float) * n) == 0);
    free(x); free(y); free(y2); free(dy);
    dt_model_destroy(m);
    dt_model_destroy(m2);
}

/* NaN goes through a ReLU, as in PyTorch, in the op and in the fused batch norm and residual add, so a model
   with a NaN weight gives a NaN loss that dt_model_loss_labels refuses (a ReLU that turned NaN into 0 hid it). */
static void test_relu_keeps_nan(void) {
    const dt_ops *ops = dt_cpu_ops();
    float x[4] = {NAN, -1.0f, 2.0f, -0.0f}, y[4], one[4] = {1, 1, 1, 1}, xi[2 * 3 * 32 * 32], loss = 0.0f;
    int32_t labels[2] = {1, 2};
    int z, k;
    ops->relu_fwd(NULL, x, y, 4);
    CHECK(isnan(y[0]) && y[1] == 0.0f && y[2] == 2.0f && y[3] == 0.0f && !signbit(y[3]));
    ops->add_relu_fwd(NULL, y, x, one, 4);
    CHECK(isnan(y[0]) && y[1] == 0.0f && y[2] == 3.0f && y[3] == 1.0f);
    {   /* the accuracy op's argmax takes the first NaN, as PyTorch's, so a NaN row is right only by its position */
        float sc[8] = {0.1f, 0.9f, NAN, 0.2f, 0.5f, 0.2f, 0.1f, 0.0f};
        int32_t lab[2] = {1, 0};
        int64_t right = -1;
        CHECK(dt__test_argmax_row(sc, 4) == 2 && dt__test_argmax_row(sc + 4, 4) == 0);
        ops->count_correct(NULL, sc, lab, 2, 4, &right);
        CHECK(right == 1);
    }
    for (k = 0; k < 2 * 3 * 32 * 32; k++) xi[k] = (float)(k % 7) * 0.1f;
    for (z = 0; z < 2; z++) {   /* SimpleCNN (ReLU layers) and ResNet-20 (ReLU fused into batch norm and the add) */
        dt_model *m = NULL;
        dt_model_desc md;
        memset(&md, 0, sizeof md);
        md.in_c = 3; md.in_h = 32; md.in_w = 32;
        CHECK_OK(dt_zoo_create(&m, z ? DT_ZOO_RESNET20 : DT_ZOO_SIMPLE_CNN, 10, &md));
        if (!m) continue;
        dt_model_params(m, NULL)[0] = NAN;   /* one weight of the first convolution */
        CHECK_OK(dt_model_forward(m, xi, 2));
        CHECK_ERR(dt_model_loss_labels(m, labels, &loss), DT_ERR_NUMERIC);
        {   /* evaluation: the loss is NaN and no NaN score counts as a correct prediction */
            dt_dataset ds;
            dt_eval_result ev;
            uint8_t pix[2 * 3 * 32 * 32];
            memset(&ds, 0, sizeof ds);
            memset(pix, 100, sizeof pix);
            ds.count = 2; ds.c = 3; ds.h = 32; ds.w = 32; ds.num_classes = 10; ds.pixels = pix; ds.labels = labels;
            dt_eval_desc ed;
            memset(&ed, 0, sizeof ed);
            ed.dataset = &ds; ed.batch = 2; ed.topk = 5;
            CHECK_OK(dt_evaluate(m, &ed, &ev));
            CHECK(isnan(ev.loss) && ev.top1 == 0.0 && ev.topk == 0.0);
        }
        dt_model_destroy(m);
    }
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_layers\n");
    RUN(test_torch_linear);
    RUN(test_torch_conv2d);
    RUN(test_torch_maxpool);
    RUN(test_maxpool_ties_nan);
    RUN(test_torch_avgpool);
    RUN(test_torch_gap_relu_logsoftmax_shortcut);
    RUN(test_torch_batchnorm);
    RUN(test_batchnorm_one_value);
    RUN(test_torch_losses);
    RUN(test_gradcheck_conv);
    RUN(test_gradcheck_pools);
    RUN(test_gradcheck_misc);
    RUN(test_gradcheck_losses);
    RUN(test_dropout);
    RUN(test_relu_keeps_nan);
    return dt_t_summary();
}
