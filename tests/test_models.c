/* The model graph and the zoo: parameter counts as PyTorch counts them, PyTorch's parameter names,
   one full forward+backward of SimpleCNN and ResNet-20 against PyTorch, initialisation, gradient
   accumulation, train/eval. DT_TEST_QUICK=1 (the sanitizer builds and qemu, where VGG-11's steps take minutes)
   compares 1 and 3 threads, not 1, 2 and 3, and leaves VGG-11 out of the planned passes' graphs. */
#include "dt_test_hooks.h"   /* the fusion switch and the taps' and shifted rows' counters */
#include "../dtrain.h"
#include "dt_test.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static int quick;   /* DT_TEST_QUICK */

static void test_zoo_param_counts(void) {
    /* the numbers PyTorch prints for the same architectures (tests/fixtures/param_counts.txt) */
    static const struct { dt_zoo_model z; int64_t count; } want[] = {
        {DT_ZOO_SIMPLE_CNN, 421642}, {DT_ZOO_RESNET20, 269722}, {DT_ZOO_FEDAVG_CNN, 1663370},
        {DT_ZOO_FEDAVG_2NN, 199210}, {DT_ZOO_LENET5, 61706}, {DT_ZOO_VGG11, 9231114},
        {DT_ZOO_MLP, 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10}};
    FILE *fp = fopen(DT_TEST_FIXTURES "/param_counts.txt", "r");
    char name[64];
    long long cnt;
    int i, seen = 0;
    for (i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
        dt_model *m;
        CHECK_OK(dt_zoo_create(&m, want[i].z, 0, NULL));
        if (!m) continue;
        if (dt_model_param_count(m) != want[i].count)
            printf("    %s: %lld parameters, expected %lld\n", dt_zoo_name(want[i].z), (long long)dt_model_param_count(m),
                   (long long)want[i].count);
        CHECK(dt_model_param_count(m) == want[i].count);
        {
            dt_zoo_model back = DT_ZOO_COUNT;
            CHECK_OK(dt_zoo_parse(dt_zoo_name(want[i].z), &back));
            CHECK(back == want[i].z);
        }
        dt_model_destroy(m);
    }
    CHECK(fp != NULL);
    while (fp && fscanf(fp, "%63s %lld", name, &cnt) == 2) {   /* and the counts PyTorch wrote */
        dt_zoo_model z = DT_ZOO_COUNT;
        dt_model *m;
        CHECK_OK(dt_zoo_parse(name, &z));
        if (z == DT_ZOO_COUNT) continue;
        CHECK_OK(dt_zoo_create(&m, z, 0, NULL));
        CHECK(m && dt_model_param_count(m) == cnt);
        dt_model_destroy(m);
        seen++;
    }
    CHECK(seen == 6);
    if (fp) fclose(fp);
    {   /* an unknown name is refused, naming the models there are */
        dt_zoo_model z = DT_ZOO_COUNT;
        CHECK_ERR(dt_zoo_parse("resnet56", &z), DT_ERR_INVALID_ARG);
        CHECK(z == DT_ZOO_COUNT && strstr(dt_last_error(), "unknown model 'resnet56': use mlp, simplecnn") != NULL);
        CHECK_ERR(dt_zoo_parse(NULL, &z), DT_ERR_INVALID_ARG);
    }
}

static void test_param_names(void) {
    dt_model *m;
    int i, n;
    CHECK_OK(dt_zoo_create(&m, DT_ZOO_RESNET20, 0, NULL));
    if (!m) return;
    n = dt_model_param_tensors(m);
    CHECK(n == 1 + 2 + 9 * 6 + 2);    /* conv1, bn1, 9 blocks x (conv, bn w, bn b, conv, bn w, bn b), fc */
    CHECK(strcmp(dt_model_param_info(m, 0).name, "conv1.weight") == 0);
    CHECK(strcmp(dt_model_param_info(m, 1).name, "bn1.weight") == 0);
    CHECK(strcmp(dt_model_param_info(m, 3).name, "layers.0.conv1.weight") == 0);
    CHECK(strcmp(dt_model_param_info(m, n - 1).name, "fc.bias") == 0);
    CHECK(strcmp(dt_model_buffer_info(m, 0).name, "bn1.running_mean") == 0);
    CHECK(dt_model_buffer_tensors(m) == 2 * 19);
    {   /* views tile the flat buffer exactly, in order */
        int64_t off = 0;
        for (i = 0; i < n; i++) {
            dt_param_info p = dt_model_param_info(m, i);
            CHECK(p.offset == off);
            off += p.count;
        }
        CHECK(off == dt_model_param_count(m));
        CHECK(dt_model_param_info(m, 0).ndim == 4 && dt_model_param_info(m, 0).shape[1] == 3);
        CHECK(dt_model_param_info(m, n).name == NULL);
    }
    dt_model_destroy(m);
    CHECK_OK(dt_zoo_create(&m, DT_ZOO_VGG11, 0, NULL));
    if (!m) return;
    CHECK(strcmp(dt_model_param_info(m, 0).name, "features.0.weight") == 0);
    CHECK(strcmp(dt_model_param_info(m, 2).name, "features.1.weight") == 0);
    CHECK(strcmp(dt_model_param_info(m, 4).name, "features.4.weight") == 0);
    CHECK(strcmp(dt_model_param_info(m, dt_model_param_tensors(m) - 1).name, "classifier.bias") == 0);
    dt_model_destroy(m);
}

/* One forward + backward of a whole zoo model with PyTorch's weights and inputs. */
static void full_model(dt_zoo_model z, const char *fixture, int training, int nll) {
    dt_t_fix f;
    dt_model *m;
    int64_t np = 0, n, i, nout = 0, nb = 0;
    float *x, *lab, *params, *out_ref, *loss_ref, *grads_ref, *out, *g, loss = 0.0f;
    int32_t labels[16];
    char what[96];
    if (dt_t_fix_load(&f, fixture)) return;
    CHECK_OK(dt_zoo_create(&m, z, 0, NULL));
    n = (int64_t)dt_t_get(&f, "cfg", NULL)[0];
    x = dt_t_get(&f, "x", NULL); lab = dt_t_get(&f, "labels", NULL); params = dt_t_get(&f, "params", &np);
    out_ref = dt_t_get(&f, "out", &nout); loss_ref = dt_t_get(&f, "loss", NULL); grads_ref = dt_t_get(&f, "grads", NULL);
    if (!m || !x || !lab || !params || !out_ref || !loss_ref || !grads_ref) { dt_model_destroy(m); dt_t_fix_free(&f); return; }
    for (i = 0; i < n; i++) labels[i] = (int32_t)lab[i];
    CHECK_OK(dt_model_set_params(m, params, np));
    if (dt_t_has(&f, "buffers_before")) {
        float *bb = dt_t_get(&f, "buffers_before", &nb);
        CHECK_OK(dt_model_set_buffers(m, bb, nb));
    }
    CHECK_OK(dt_model_set_mode(m, training ? DT_MODE_TRAIN : DT_MODE_EVAL));
    CHECK_OK(dt_model_forward(m, x, n));
    out = (float *)malloc(sizeof(float) * (size_t)nout);
    g = (float *)malloc(sizeof(float) * (size_t)np);
    CHECK_OK(dt_model_get_output(m, out, nout));
    snprintf(what, sizeof what, "%s output", fixture);
    CHECK_CLOSE(out, out_ref, nout, 1e-4, what);
    CHECK_OK(nll ? dt_model_loss_nll(m, labels, &loss) : dt_model_loss_cross_entropy(m, labels, &loss));
    {   /* the labels loss picks NLL after a log-softmax, cross-entropy otherwise */
        float l2 = 0.0f;
        CHECK_OK(dt_model_loss_labels(m, labels, &l2));
        CHECK(l2 == loss);
    }
    snprintf(what, sizeof what, "%s loss", fixture);
    CHECK_CLOSE(&loss, loss_ref, 1, 1e-4, what);
    CHECK_OK(dt_model_backward(m, NULL));
    CHECK_OK(dt_model_get_grads(m, g, np));
    snprintf(what, sizeof what, "%s gradients", fixture);
    CHECK_CLOSE(g, grads_ref, np, 1e-4, what);
    {   /* each parameter tensor on its own scale too, so a small tensor's error is not hidden */
        for (i = 0; i < dt_model_param_tensors(m); i++) {
            dt_param_info p = dt_model_param_info(m, i);
            snprintf(what, sizeof what, "%s d%s", fixture, p.name);
            CHECK_CLOSE(g + p.offset, grads_ref + p.offset, p.count, 1e-3, what);
        }
    }
    if (dt_t_has(&f, "buffers_after")) {
        float *ba = dt_t_get(&f, "buffers_after", NULL), *b = (float *)malloc(sizeof(float) * (size_t)nb);
        CHECK_OK(dt_model_get_buffers(m, b, nb));
        snprintf(what, sizeof what, "%s running statistics", fixture);
        CHECK_CLOSE(b, ba, nb, 1e-4, what);
        free(b);
    }
    free(out); free(g);
    dt_model_destroy(m);
    dt_t_fix_free(&f);
}
static void test_torch_simplecnn(void) { full_model(DT_ZOO_SIMPLE_CNN, "simplecnn", 0, 1); }
static void test_torch_resnet20(void) { full_model(DT_ZOO_RESNET20, "resnet20", 1, 0); }

/* PyTorch's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for conv/linear weights and biases;
   reproducible for a seed, different for another stream. */
static void test_init(void) {
    dt_model *a, *b, *c;
    dt_model_desc d;
    int64_t n = 0, i;
    int t, differ = 0;
    memset(&d, 0, sizeof d);
    d.seed = 11;
    CHECK_OK(dt_zoo_create(&a, DT_ZOO_LENET5, 0, &d));
    CHECK_OK(dt_zoo_create(&b, DT_ZOO_LENET5, 0, &d));
    d.stream = 1;
    CHECK_OK(dt_zoo_create(&c, DT_ZOO_LENET5, 0, &d));
    if (!a || !b || !c) return;
    dt_model_params(a, &n);
    CHECK(memcmp(dt_model_params(a, NULL), dt_model_params(b, NULL), sizeof(float) * (size_t)n) == 0);
    for (i = 0; i < n; i++) differ += dt_model_params(a, NULL)[i] != dt_model_params(c, NULL)[i];
    CHECK(differ > n * 9 / 10);
    for (t = 0; t < dt_model_param_tensors(a); t++) {
        dt_param_info p = dt_model_param_info(a, t);
        const float *w = dt_model_params(a, NULL) + p.offset;
        int64_t fan_in = dt_model_param_info(a, t & ~1).count / dt_model_param_info(a, t & ~1).shape[0];
        double bound = 1.0 / sqrt((double)fan_in), sq = 0.0;
        for (i = 0; i < p.count; i++) { CHECK(fabs(w[i]) <= bound); sq += (double)w[i] * w[i]; }
        if (p.count > 1000) CHECK(fabs(sqrt(sq / (double)p.count) - bound / sqrt(3.0)) < 0.05 * bound);
    }
    dt_model_destroy(a); dt_model_destroy(b); dt_model_destroy(c);
    CHECK_OK(dt_zoo_create(&a, DT_ZOO_RESNET20, 0, NULL));
    if (!a) return;
    for (t = 0; t < dt_model_param_tensors(a); t++) {
        dt_param_info p = dt_model_param_info(a, t);
        if (strstr(p.name, "bn") && strstr(p.name, "weight"))
            for (i = 0; i < p.count; i++) CHECK(dt_model_params(a, NULL)[p.offset + i] == 1.0f);
    }
    for (t = 0; t < dt_model_buffer_tensors(a); t++) {
        dt_param_info p = dt_model_buffer_info(a, t);
        for (i = 0; i < p.count; i++) CHECK(dt_model_buffers(a, NULL)[p.offset + i] == (strstr(p.name, "var") ? 1.0f : 0.0f));
    }
    dt_model_destroy(a);
}

/* Gradients accumulate over backward calls until zero_grad; smaller batches reuse the arena. */
static void test_accumulate_and_batches(void) {
    dt_model *m;
    int64_t np, i;
    float x[8 * 784], *g1, *g2, loss;
    int32_t y[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    double err = 0.0;
    CHECK_OK(dt_zoo_create(&m, DT_ZOO_LENET5, 0, NULL));
    if (!m) return;
    dt_t_fill(x, 8 * 784, 0, 1);
    dt_model_params(m, &np);
    g1 = (float *)malloc(sizeof(float) * (size_t)np);
    g2 = (float *)malloc(sizeof(float) * (size_t)np);
    CHECK_OK(dt_model_forward(m, x, 8));
    {   /* LeNet-5 ends in a linear layer: the labels loss is cross-entropy */
        float l2 = 0.0f;
        CHECK_OK(dt_model_loss_labels(m, y, &l2));
        CHECK_OK(dt_model_loss_cross_entropy(m, y, &loss));
        CHECK(l2 == loss);
    }
    CHECK(loss > 1.5f && loss < 3.5f);            /* about ln(10) at initialisation */
    CHECK_OK(dt_model_backward(m, NULL));
    CHECK_OK(dt_model_get_grads(m, g1, np));
    CHECK_OK(dt_model_backward(m, NULL));         /* the same gradient again: doubles */
    CHECK_OK(dt_model_get_grads(m, g2, np));
    for (i = 0; i < np; i++) err = fmax(err, fabs(g2[i] - 2.0f * g1[i]));
    CHECK(err < 1e-6);
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_get_grads(m, g2, np));
    for (i = 0; i < np; i++) CHECK(g2[i] == 0.0f);
    /* a batch of 3 after a batch of 8: the sample results equal a fresh batch of 3 */
    {
        dt_model *m2;
        float o1[30], o2[30];
        CHECK_OK(dt_zoo_create(&m2, DT_ZOO_LENET5, 0, NULL));
        CHECK_OK(dt_model_forward(m, x, 3));
        CHECK_OK(dt_model_forward(m2, x, 3));
        CHECK_OK(dt_model_get_output(m, o1, 30));
        CHECK_OK(dt_model_get_output(m2, o2, 30));
        CHECK(memcmp(o1, o2, sizeof o1) == 0);
        dt_model_destroy(m2);
    }
    free(g1); free(g2);
    dt_model_destroy(m);
}

/* The thread count changes no bit: every sum (GEMM, shifted convolutions, batch norm, reductions) is taken
   in one order by one thread, whichever threads there are. One step of SimpleCNN, ResNet-20 and VGG-11 on 1,
   2 and 3 threads (quick: 1 and 3): loss, output and every gradient equal to the last bit; on a tier with
   shifted convolutions (run.sh runs this on every tier), through them; VGG-11's small images by taps. */
#ifdef _OPENMP   /* (without OpenMP there is one thread: nothing to compare) */
static void test_threads_same_bits(void) {
    static const dt_zoo_model zs[] = {DT_ZOO_SIMPLE_CNN, DT_ZOO_RESNET20, DT_ZOO_VGG11};
    int zi, t, saved = omp_get_max_threads();
    int64_t min_len = *dt__test_tap_min_len();
    *dt__test_tap_min_len() = 0;   /* VGG-11's small layers by taps at 6 images too */
    for (zi = 0; zi < 3; zi++) {
        float *x, *g[3] = {NULL, NULL, NULL}, loss[3];
        int32_t y[6] = {0, 1, 2, 3, 4, 5};
        int64_t np = 0, in = zs[zi] == DT_ZOO_SIMPLE_CNN ? 784 : 3 * 32 * 32;
        x = (float *)malloc(sizeof(float) * (size_t)(6 * in));
        dt_t_fill(x, 6 * in, -1, 1);
        for (t = 0; t < 3; t++) {
            dt_model *m = NULL;
            int64_t taken = dt__test_shift_taken(), taps = dt__test_tap_taken();
            if (quick && t == 1) continue;
            omp_set_num_threads(t + 1);
            CHECK_OK(dt_zoo_create(&m, zs[zi], 0, NULL));   /* the workspace is sized for the threads */
            if (!m) break;
            dt_model_params(m, &np);
            g[t] = (float *)malloc(sizeof(float) * (size_t)np);
            CHECK_OK(dt_model_forward(m, x, 6));
            CHECK_OK(dt_model_loss_labels(m, y, &loss[t]));
            CHECK_OK(dt_model_backward(m, NULL));
            CHECK_OK(dt_model_get_grads(m, g[t], np));
            if (dt__test_tier_shifts()) CHECK(dt__test_shift_taken() > taken);
            /* VGG-11's 3 x 3 convolutions at 8 x 8, 4 x 4 and 2 x 2 by taps (6 of them, forward and backward), on
               every tier (at 6 images their pieces are narrower than the taps take by default) */
            if (zs[zi] == DT_ZOO_VGG11) CHECK(dt__test_tap_taken() == taps + 12);
            if (t > 0) {
                CHECK(loss[t] == loss[0]);
                CHECK(memcmp(g[t], g[0], sizeof(float) * (size_t)np) == 0);
            }
            dt_model_destroy(m);
        }
        omp_set_num_threads(saved);
        for (t = 0; t < 3; t++) free(g[t]);
        free(x);
    }
    *dt__test_tap_min_len() = min_len;
}
#endif

/* The planned passes (ReLUs run inside the batch norm or add before them; first writers of a gradient
   write it rather than add to it) give the same numbers as the layers one by one on zeroed gradients:
   outputs, loss, every parameter and input gradient, running statistics, and eval outputs. Graphs: the zoo
   and small ones with the cases the plan must refuse (a batch norm with two readers, x + x, a ReLU as the
   output, a stride-2 convolution whose input gradient takes the packed path, relu(bn(x) + x), and projection
   shortcuts, whose add has a batch norm on both inputs). */
static int build_fuse_graph(dt_model *m, int which) {
    int x = 0, a, b;
    switch (which) {
    case 0:   /* residual block with option-B shortcut: add + ReLU fused, the block's first BN + ReLU fused */
        a = dt_relu(m, dt_batchnorm(m, dt_conv2d(m, x, 4, 3, 1, 1)));
        b = dt_batchnorm(m, dt_conv2d(m, a, 4, 3, 1, 1));
        x = dt_relu(m, dt_add(m, b, a));
        x = dt_conv2d(m, x, 6, 3, 2, 1);   /* stride 2: the packed path, told to write its input gradient */
        return dt_linear(m, dt_flatten(m, dt_relu(m, dt_batchnorm(m, x))), 5, 1);
    case 1:   /* a batch norm read twice, x + x, a flatten between a ReLU and its reader */
        a = dt_batchnorm(m, dt_conv2d(m, x, 3, 3, 1, 1));
        b = dt_relu(m, dt_add(m, a, dt_relu(m, a)));
        x = dt_relu(m, dt_add(m, b, b));
        return dt_linear(m, dt_flatten(m, x), 5, 0);
    case 3:   /* relu(bn(x) + residual) with the residual computed after the batch norm; and refused, where
                 the residual is the batch norm's own input */
        a = dt_relu(m, dt_batchnorm(m, dt_conv2d(m, x, 4, 3, 1, 1)));
        b = dt_batchnorm(m, dt_conv2d(m, a, 4, 3, 1, 1));
        x = dt_relu(m, dt_add(m, dt_conv2d(m, a, 4, 1, 1, 0), b));
        x = dt_relu(m, dt_add(m, dt_batchnorm(m, x), x));
        return dt_linear(m, dt_flatten(m, x), 5, 1);
    case 4:   /* projection shortcuts: relu(bn(conv(a)) + bn(conv1x1(a))), the add's inputs both batch norms, built
                 main branch first and shortcut first; the add runs one of them, the other runs as itself */
        a = dt_relu(m, dt_batchnorm(m, dt_conv2d(m, x, 4, 3, 1, 1)));
        b = dt_batchnorm(m, dt_conv2d(m, a, 6, 3, 2, 1));
        x = dt_relu(m, dt_add(m, b, dt_batchnorm(m, dt_conv2d(m, a, 6, 1, 2, 0))));
        b = dt_batchnorm(m, dt_conv2d(m, x, 8, 1, 1, 0));
        x = dt_relu(m, dt_add(m, dt_batchnorm(m, dt_conv2d(m, x, 8, 3, 1, 1)), b));
        return dt_linear(m, dt_flatten(m, x), 5, 1);
    default:  /* a ReLU as the output, after a 1-D batch norm */
        x = dt_linear(m, dt_flatten(m, dt_relu(m, dt_conv2d(m, x, 4, 3, 1, 1))), 7, 1);
        return dt_relu(m, dt_batchnorm(m, x));
    }
}
static void test_planned_passes_same_numbers(void) {
    enum { B = 4 };
    int ci, way, i;
    for (ci = 0; ci < 8; ci++) {
        float *x = NULL, *out[2], *g[2], *dx[2], *buf[2], *ev[2], loss[2];
        if (quick && ci == 2) continue;   /* VGG-11 */
        int32_t y[B] = {0, 1, 2, 3};
        int64_t np = 0, nb = 0, in = 0, k = 0, folded[2] = {0, 0};
        for (way = 0; way < 2; way++) {
            dt_model *m = NULL;
            dt_model_desc d = {0};
            d.seed = 7; d.input_grad = 1;
            *dt__test_fuse_off() = way;
            if (ci < 3) {
                static const dt_zoo_model zs[] = {DT_ZOO_SIMPLE_CNN, DT_ZOO_RESNET20, DT_ZOO_VGG11};
                d.in_c = ci ? 3 : 1; d.in_h = d.in_w = ci ? 32 : 28;
                CHECK_OK(dt_zoo_create(&m, zs[ci], 0, &d));
            } else {
                d.in_c = 2; d.in_h = d.in_w = 6;
                CHECK_OK(dt_model_create(&m, &d));
                if (m) build_fuse_graph(m, ci - 3);
                if (m) CHECK_OK(dt_model_finalize(m));
            }
            if (!m) break;
            dt_model_params(m, &np);
            dt_model_buffers(m, &nb);
            in = d.in_c * d.in_h * d.in_w;
            k = dt_model_node_size(m, dt_model_output_node(m));
            if (way == 0) { x = (float *)malloc(sizeof(float) * (size_t)(B * in)); dt_t_fill(x, B * in, -1, 1); }
            out[way] = (float *)malloc(sizeof(float) * (size_t)(B * k));
            ev[way] = (float *)malloc(sizeof(float) * (size_t)(B * k));
            g[way] = (float *)malloc(sizeof(float) * (size_t)np);
            buf[way] = (float *)malloc(sizeof(float) * (size_t)(nb + 1));
            dx[way] = (float *)malloc(sizeof(float) * (size_t)(B * in));
            CHECK_OK(dt_model_forward(m, x, B));
            CHECK_OK(dt_model_get_output(m, out[way], B * k));
            CHECK_OK(dt_model_loss_labels(m, y, &loss[way]));
            CHECK_OK(dt_model_backward(m, NULL));
            CHECK_OK(dt_model_get_grads(m, g[way], np));
            CHECK_OK(dt_model_get_buffers(m, buf[way], nb));
            memcpy(dx[way], dt_model_node_grad(m, 0), sizeof(float) * (size_t)(B * in));
            for (i = 0; i < dt_model_nodes(m); i++)   /* a fused node keeps no output */
                if (dt_model_node_kind(m, i) == DT_LAYER_BATCHNORM || dt_model_node_kind(m, i) == DT_LAYER_ADD)
                    folded[way] += dt_model_node_output(m, i) == NULL;
            dt_model_set_mode(m, DT_MODE_EVAL);
            CHECK_OK(dt_model_forward(m, x, B));
            CHECK_OK(dt_model_get_output(m, ev[way], B * k));
            dt_model_destroy(m);
        }
        *dt__test_fuse_off() = 0;
        if (way < 2) break;
        {
            static const int64_t want[8] = {0, 28, 8, 4, 1, 1, 4, 5};   /* nodes run by others, per graph */
            int64_t bad = 0;
            CHECK(folded[0] == want[ci] && folded[1] == 0);
            CHECK(loss[0] == loss[1]);
            for (i = 0; i < B * k; i++) bad += out[0][i] != out[1][i] || ev[0][i] != ev[1][i];
            for (i = 0; i < np; i++) bad += g[0][i] != g[1][i];
            for (i = 0; i < nb; i++) bad += buf[0][i] != buf[1][i];
            for (i = 0; i < B * in; i++) bad += dx[0][i] != dx[1][i];
            if (bad || folded[0] != want[ci])
                printf("    graph %d: %lld values differ, %lld batch norms and adds fused\n", ci, (long long)bad,
                       (long long)folded[0]);
            CHECK(bad == 0);
        }
        for (way = 0; way < 2; way++) { free(out[way]); free(ev[way]); free(g[way]); free(buf[way]); free(dx[way]); }
        free(x);
    }
}

/* Train mode uses batch statistics and updates running ones; eval uses running ones; correct counts. */
static void test_train_eval(void) {
    dt_model *m;
    float x[4 * 3 * 32 * 32], o1[40], o2[40];
    int32_t y[4] = {1, 2, 3, 4};
    int64_t nb, correct = -1;
    float *b0;
    CHECK_OK(dt_zoo_create(&m, DT_ZOO_RESNET20, 0, NULL));
    if (!m) return;
    dt_t_fill(x, 4 * 3 * 32 * 32, -1, 1);
    b0 = (float *)malloc(sizeof(float) * 4096);
    dt_model_buffers(m, &nb);
    CHECK(nb <= 4096);
    CHECK(dt_model_mode(m) == DT_MODE_TRAIN);
    CHECK_OK(dt_model_get_buffers(m, b0, nb));
    CHECK_OK(dt_model_forward(m, x, 4));
    CHECK_OK(dt_model_get_output(m, o1, 40));
    CHECK(memcmp(b0, dt_model_buffers(m, NULL), sizeof(float) * (size_t)nb) != 0);
    CHECK_ERR(dt_model_set_mode(m, (dt_mode)2), DT_ERR_INVALID_ARG);   /* not a mode: refused, the mode stays */
    CHECK(dt_model_mode(m) == DT_MODE_TRAIN && strstr(dt_last_error(), "DT_MODE_EVAL"));
    CHECK_ERR(dt_model_set_mode(NULL, DT_MODE_EVAL), DT_ERR_INVALID_ARG);
    CHECK_OK(dt_model_set_mode(m, DT_MODE_EVAL));
    CHECK(dt_model_mode(m) == DT_MODE_EVAL && dt_model_mode(NULL) == DT_MODE_TRAIN);
    CHECK_OK(dt_model_get_buffers(m, b0, nb));
    CHECK_OK(dt_model_forward(m, x, 4));
    CHECK_OK(dt_model_get_output(m, o2, 40));
    CHECK(memcmp(b0, dt_model_buffers(m, NULL), sizeof(float) * (size_t)nb) == 0);
    CHECK(memcmp(o1, o2, sizeof o1) != 0);
    CHECK_OK(dt_model_count_correct(m, y, &correct));
    {
        int64_t r, j, c = 0;
        for (r = 0; r < 4; r++) {
            int best = 0;
            for (j = 1; j < 10; j++) if (o2[r * 10 + j] > o2[r * 10 + best]) best = (int)j;
            c += best == y[r];
        }
        CHECK(correct == c);
    }
    free(b0);
    dt_model_destroy(m);
}

/* The builder: shapes flow, names apply, summary lists every node. */
static int summary_lines;
static void count_lines(void *u, int level, const char *msg) { (void)u; (void)level; (void)msg; summary_lines++; }
static void test_builder(void) {
    dt_model *m;
    dt_model_desc d;
    int64_t s[3];
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = 3; d.in_h = 11; d.in_w = 9;
    CHECK_OK(dt_model_create(&m, &d));
    x = dt_conv2d(m, dt_model_input(m), 8, 3, 2, 1);
    CHECK(x == 1 && dt_model_node_shape(m, x, s) == 3 && s[0] == 8 && s[1] == 6 && s[2] == 5);
    x = dt_maxpool2d(m, x, 3, 2, 1);
    CHECK(dt_model_node_shape(m, x, s) == 3 && s[1] == 3 && s[2] == 3);
    x = dt_flatten(m, x);
    CHECK(dt_model_node_size(m, x) == 72 && dt_model_node_kind(m, x) == DT_LAYER_FLATTEN);
    x = dt_model_set_node_name(m, dt_linear(m, x, 5, 1), "head");
    CHECK(strcmp(dt_model_node_name(m, x), "head") == 0);
    CHECK_OK(dt_model_finalize(m));
    CHECK(strcmp(dt_model_param_info(m, 2).name, "head.weight") == 0);
    CHECK(dt_model_nodes(m) == 5 && dt_model_output_node(m) == 4);
    dt_log_configure(count_lines, NULL, DT_LOG_INFO);
    dt_model_summary(m);
    dt_log_configure(NULL, NULL, DT_LOG_INFO);
    CHECK(summary_lines == 1 + 5 + 1);
    dt_model_destroy(m);
    {   /* rectangular windows: a 1 x 3 convolution with strides 1 x 2 and padding 0 x 1, a 3 x 2 pooling with
           strides 2 x 1 and padding 1 x 0 (output (h + 2 ph - kh) / sh + 1 on each axis); the weight's shape */
        dt_conv2d_desc cd;
        dt_pool2d_desc pd;
        memset(&cd, 0, sizeof cd);
        memset(&pd, 0, sizeof pd);
        CHECK_OK(dt_model_create(&m, &d));
        cd.out_channels = 4; cd.kernel_h = 1; cd.kernel_w = 3; cd.stride_w = 2; cd.pad_w = 1;
        x = dt_conv2d_ex(m, dt_model_input(m), &cd);
        CHECK(dt_model_node_shape(m, x, s) == 3 && s[0] == 4 && s[1] == 11 && s[2] == 5);
        pd.kernel_h = 3; pd.kernel_w = 2; pd.stride_w = 1; pd.pad_h = 1;
        x = dt_maxpool2d_ex(m, x, &pd);
        CHECK(dt_model_node_shape(m, x, s) == 3 && s[0] == 4 && s[1] == 4 && s[2] == 4);
        x = dt_avgpool2d_ex(m, x, &pd);
        CHECK(dt_model_node_shape(m, x, s) == 3 && s[1] == 2 && s[2] == 3);
        CHECK_OK(dt_model_finalize(m));
        CHECK(dt_model_param_info(m, 0).ndim == 4 && dt_model_param_info(m, 0).shape[2] == 1 && dt_model_param_info(m, 0).shape[3] == 3);
        dt_model_destroy(m);
        /* a square kernel and a rectangular field at once, kernel 0 with stride, padding past half a pooling
           window, a zero kernel: refused, naming the cause */
        CHECK_OK(dt_model_create(&m, &d));
        cd.kernel = 3;
        CHECK(dt_conv2d_ex(m, dt_model_input(m), &cd) == -1);
        CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
        CHECK(strstr(dt_last_error(), "kernel is 3 and kernel_h") != NULL);
        dt_model_destroy(m);
        CHECK_OK(dt_model_create(&m, &d));
        memset(&pd, 0, sizeof pd);
        pd.stride = 2;
        CHECK(dt_maxpool2d_ex(m, dt_model_input(m), &pd) == -1);
        CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
        dt_model_destroy(m);
        CHECK_OK(dt_model_create(&m, &d));
        pd.stride = 0; pd.kernel_h = 2; pd.kernel_w = 3; pd.pad_w = 2;
        CHECK(dt_avgpool2d_ex(m, dt_model_input(m), &pd) == -1);
        CHECK_ERR(dt_model_finalize(m), DT_ERR_SHAPE);
        CHECK(strstr(dt_last_error(), "more than half the kernel 2 x 3") != NULL);
        dt_model_destroy(m);
        CHECK_OK(dt_model_create(&m, &d));
        CHECK(dt_conv2d(m, dt_model_input(m), 4, 0, 1, 0) == -1);
        CHECK_ERR(dt_model_finalize(m), DT_ERR_SHAPE);
        dt_model_destroy(m);
    }
    {   /* a padding shortcut added when the node array grows (its 17th node, 33rd, ...) still reads its input's shape
           (it read it after the array had moved: under AddressSanitizer, a use after free) */
        int i, k;
        for (k = 16; k <= 32; k += 16) {
            CHECK_OK(dt_model_create(&m, &d));
            for (x = dt_model_input(m), i = 1; i < k; i++) x = dt_relu(m, x);
            CHECK(dt_model_nodes(m) == k);
            x = dt_pad_shortcut(m, x, 5, 2);
            CHECK(dt_model_node_shape(m, x, s) == 3 && s[0] == 5 && s[1] == 6 && s[2] == 5);
            dt_model_destroy(m);
        }
    }
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    quick = getenv("DT_TEST_QUICK") && atoi(getenv("DT_TEST_QUICK"));
    printf("test_models%s\n", quick ? " (DT_TEST_QUICK: threads_same_bits on 1 and 3 threads, planned passes without VGG-11)" : "");
    RUN(test_zoo_param_counts);
    RUN(test_param_names);
    RUN(test_torch_simplecnn);
    RUN(test_torch_resnet20);
    RUN(test_init);
    RUN(test_accumulate_and_batches);
#ifdef _OPENMP
    RUN(test_threads_same_bits);
#endif
    RUN(test_planned_passes_same_numbers);
    RUN(test_train_eval);
    RUN(test_builder);
    return dt_t_summary();
}
