/* Bad input to the API returns an error code with a message that names the cause; nothing crashes
   (this file also runs under AddressSanitizer + UndefinedBehaviorSanitizer). */
#define _POSIX_C_SOURCE 200809L   /* sysconf: the machine's memory */
#include <unistd.h>
#include "dt_test_alloc.h"   /* the counting allocator */
#include "dt_test_hooks.h"
#include "../dtrain.h"
#include "dt_test.h"

static dt_model *image_model(void) {
    dt_model *m = NULL;
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    d.in_c = 2; d.in_h = 6; d.in_w = 6;
    CHECK_OK(dt_model_create(&m, &d));
    return m;
}

static void test_create_errors(void) {
    dt_model *m = (dt_model *)&m;
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    CHECK_ERR(dt_model_create(NULL, &d), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_model_create(&m, NULL), DT_ERR_INVALID_ARG);
    CHECK(m == NULL);
    CHECK_ERR(dt_model_create(&m, &d), DT_ERR_SHAPE);            /* in_c = 0 */
    CHECK(strstr(dt_last_error(), "in_c") != NULL);
    d.in_c = 3; d.in_h = 5;                                        /* h without w */
    CHECK_ERR(dt_model_create(&m, &d), DT_ERR_SHAPE);
    d.in_h = -1; d.in_w = -1;
    CHECK_ERR(dt_model_create(&m, &d), DT_ERR_SHAPE);
    CHECK_ERR(dt_zoo_create(&m, (dt_zoo_model)99, 0, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_zoo_create(NULL, DT_ZOO_MLP, 0, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_zoo_create(&m, DT_ZOO_MLP, -3, NULL), DT_ERR_INVALID_ARG);
    d.in_c = 1; d.in_h = 8; d.in_w = 8;                            /* too small for 5 poolings */
    CHECK_ERR(dt_zoo_create(&m, DT_ZOO_VGG11, 0, &d), DT_ERR_SHAPE);
    CHECK(m == NULL && strstr(dt_last_error(), "vgg11") != NULL);
    dt_model_destroy(NULL);
}

static void test_builder_errors(void) {
    dt_model *m = image_model();
    int x;
    if (!m) return;
    CHECK(dt_linear(m, 0, 10, 1) == -1);                           /* linear on an image */
    CHECK(strstr(dt_last_error(), "dt_flatten") != NULL);
    /* the error is sticky: later calls fail and finalize reports the first one */
    CHECK(dt_relu(m, 0) == -1);
    CHECK_ERR(dt_model_finalize(m), DT_ERR_SHAPE);
    CHECK(strstr(dt_last_error(), "dt_linear") != NULL);
    dt_model_destroy(m);

    m = image_model();
    CHECK(dt_conv2d(m, 0, 4, 9, 1, 0) == -1);                      /* kernel larger than the input */
    CHECK_ERR(dt_model_finalize(m), DT_ERR_SHAPE);
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_conv2d(m, 7, 4, 3, 1, 1) == -1);                      /* no such node */
    CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_conv2d(m, 0, 0, 3, 1, 1) == -1);                      /* zero channels */
    CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_conv2d_ex(m, 0, NULL) == -1);
    CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_maxpool2d(m, 0, 2, 2, 2) == -1);                      /* padding > kernel / 2 */
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_dropout(m, 0, 1.0f) == -1);
    CHECK(strstr(dt_last_error(), "[0, 1)") != NULL);
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_batchnorm_ex(m, 0, -1.0f, 0.1f) == -1);
    dt_model_destroy(m);
    m = image_model();
    x = dt_conv2d(m, 0, 3, 3, 1, 1);
    CHECK(dt_add(m, x, 0) == -1);                                  /* 3 vs 2 channels */
    CHECK(strstr(dt_last_error(), "equal shapes") != NULL);
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_pad_shortcut(m, 0, 5, 2) == -1);                      /* odd channel difference */
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_log_softmax(m, 0) == -1);
    dt_model_destroy(m);
    m = image_model();
    CHECK(dt_global_avgpool(m, dt_flatten(m, 0)) == -1);
    dt_model_destroy(m);
    m = image_model();
    CHECK_ERR(dt_model_finalize(m), DT_ERR_STATE);                 /* no layers */
    dt_relu(m, 0);
    CHECK_OK(dt_model_finalize(m));
    CHECK_ERR(dt_model_finalize(m), DT_ERR_STATE);                 /* twice */
    CHECK(dt_relu(m, 1) == -1);                                    /* building after finalize */
    dt_model_destroy(m);
    CHECK(dt_relu(NULL, 0) == -1);
    CHECK_ERR(dt_model_finalize(NULL), DT_ERR_INVALID_ARG);
}

/* dt_model_set_node_name is a builder call: its errors are kept for finalize, like the layers'. */
static void test_node_name_errors(void) {
    char longname[62];
    const char *bad[3] = {NULL, "", longname};
    dt_model *m;
    int i;
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';                          /* 61 characters */
    for (i = 0; i < 3; i++) {
        if (!(m = image_model())) return;
        CHECK(dt_model_set_node_name(m, dt_relu(m, 0), bad[i]) == -1);
        CHECK(strstr(dt_last_error(), "dt_model_set_node_name") != NULL && strstr(dt_last_error(), "1 to 60") != NULL);
        CHECK(dt_relu(m, 0) == -1);                                /* sticky */
        CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
        CHECK(strstr(dt_last_error(), "dt_model_set_node_name") != NULL);
        dt_model_destroy(m);
    }
    if (!(m = image_model())) return;
    CHECK(dt_model_set_node_name(m, 5, "x") == -1);                /* no such node */
    CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
    dt_model_destroy(m);
    if (!(m = image_model())) return;
    CHECK(dt_model_set_node_name(m, dt_relu(m, 0), longname + 1) == 1);   /* 60 characters: fine */
    CHECK(strcmp(dt_model_node_name(m, 1), longname + 1) == 0);
    CHECK(dt_model_set_node_name(m, dt_conv2d(m, 9, 4, 3, 1, 1), "c") == -1);   /* a failed layer: its error is kept */
    CHECK_ERR(dt_model_finalize(m), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dt_conv2d") != NULL);
    dt_model_destroy(m);
    if (!(m = image_model())) return;
    dt_relu(m, 0);
    CHECK_OK(dt_model_finalize(m));
    CHECK(dt_model_set_node_name(m, 1, "late") == -1);             /* after finalize: the names are planned */
    CHECK(strstr(dt_last_error(), "finalized") != NULL && strcmp(dt_model_node_name(m, 1), "late") != 0);
    dt_model_destroy(m);
    CHECK(dt_model_set_node_name(NULL, 0, "x") == -1);
    CHECK(strstr(dt_last_error(), "NULL") != NULL);
}

static void test_run_errors(void) {
    dt_model *m = image_model();
    float x[2 * 72], out[20], p[4];
    int32_t y[2] = {1, 2}, ybad[2] = {1, 10};
    float loss;
    int64_t np;
    if (!m) return;
    memset(x, 0, sizeof x);
    dt_linear(m, dt_flatten(m, 0), 10, 1);
    CHECK_ERR(dt_model_forward(m, x, 2), DT_ERR_STATE);            /* before finalize */
    CHECK_OK(dt_model_finalize(m));
    CHECK_ERR(dt_model_loss_cross_entropy(m, y, &loss), DT_ERR_STATE);  /* before forward */
    CHECK_ERR(dt_model_backward(m, NULL), DT_ERR_STATE);
    CHECK_ERR(dt_model_forward(m, NULL, 2), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_model_forward(m, x, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_model_forward(m, x, -5), DT_ERR_INVALID_ARG);
    CHECK_OK(dt_model_forward(m, x, 2));
    CHECK_ERR(dt_model_backward(m, NULL), DT_ERR_STATE);           /* no loss yet */
    CHECK_ERR(dt_model_loss_cross_entropy(m, ybad, &loss), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "label 10") != NULL);
    CHECK_ERR(dt_model_loss_nll(m, NULL, &loss), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_model_loss_mse(m, NULL, &loss), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_model_get_output(m, out, 19), DT_ERR_SHAPE);
    CHECK_ERR(dt_model_get_output(m, NULL, 20), DT_ERR_INVALID_ARG);
    CHECK_OK(dt_model_get_output(m, out, 20));
    dt_model_params(m, &np);
    CHECK_ERR(dt_model_set_params(m, p, 4), DT_ERR_SHAPE);
    CHECK_ERR(dt_model_set_params(m, NULL, np), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_model_get_grads(m, p, 4), DT_ERR_SHAPE);
    CHECK_ERR(dt_model_set_buffers(m, p, 4), DT_ERR_SHAPE);
    CHECK_ERR(dt_model_count_correct(m, y, NULL), DT_ERR_INVALID_ARG);
    /* a NaN in the input makes a NaN loss: a numeric error that says what to do */
    x[3] = NAN;
    CHECK_OK(dt_model_forward(m, x, 2));
    CHECK_ERR(dt_model_loss_cross_entropy(m, y, &loss), DT_ERR_NUMERIC);
    CHECK(strstr(dt_last_error(), "learning rate") != NULL);
    dt_model_destroy(m);
    /* classification loss on an image output */
    m = image_model();
    dt_relu(m, 0);
    CHECK_OK(dt_model_finalize(m));
    CHECK_OK(dt_model_forward(m, x, 1));
    CHECK_ERR(dt_model_loss_cross_entropy(m, y, &loss), DT_ERR_SHAPE);
    dt_model_destroy(m);
    /* queries on NULL or out of range answer harmlessly */
    CHECK(dt_model_params(NULL, &np) == NULL && np == 0);
    CHECK(dt_model_param_count(NULL) == 0 && dt_model_nodes(NULL) == 0);
    CHECK(dt_model_node_name(NULL, 0) == NULL);
    CHECK(dt_model_param_info(NULL, 0).name == NULL);
    CHECK(strcmp(dt_layer_kind_str((dt_layer_kind)77), "unknown") == 0);
}

/* Everything the library allocates goes through the hooks and is freed; when an allocation fails at
   any point, the call returns DT_ERR_OUT_OF_MEMORY (or succeeds), nothing crashes and nothing leaks. */
/* The one rule of the trainers' entry points (dtrain.h, ERRORS): a NULL desc is a zeroed desc (the defaults;
   FedAvg's names its data, so a NULL or zeroed one is refused alike), a NULL out, communicator or model is
   DT_ERR_INVALID_ARG, a model that is not finalized DT_ERR_STATE naming dt_model_finalize; *out is NULL after
   any failure. */
static dt_result hog_noop(dt_hogwild_worker *w, void *arg) { (void)w; (void)arg; return DT_OK; }
static void test_trainer_create_rule(void) {
    dt_comm *c = NULL;
    dt_model *m = image_model(), *raw = image_model();
    dt_topology t;
    dt_topology_desc td;
    dt_fed_desc zero;
    dt_ddp *ddp = (dt_ddp *)&c;
    dt_dpsgd *dps = (dt_dpsgd *)&c;
    dt_localsgd *ls = (dt_localsgd *)&c;
    dt_fed *fed = (dt_fed *)&c;
    int k;
    memset(&t, 0, sizeof t);
    memset(&td, 0, sizeof td);
    memset(&zero, 0, sizeof zero);
    td.world = 1;
    if (!m || !raw) { dt_model_destroy(m); dt_model_destroy(raw); return; }
    dt_conv2d(m, 0, 2, 3, 1, 1);
    CHECK_OK(dt_model_finalize(m));
    CHECK_OK(dt_comm_create_self(&c, NULL));
    CHECK_OK(dt_topology_create(&t, &td));
    /* a NULL desc: the defaults */
    CHECK_OK(dt_ddp_create(&ddp, c, m, NULL));
    CHECK_OK(dt_dpsgd_create(&dps, c, m, &t, NULL));
    CHECK_OK(dt_localsgd_create(&ls, c, m, NULL));
    CHECK(ddp && dps && ls);
    dt_ddp_destroy(ddp); dt_dpsgd_destroy(dps); dt_localsgd_destroy(ls);
    CHECK_ERR(dt_fed_create(&fed, c, m, NULL), DT_ERR_INVALID_ARG);
    CHECK(fed == NULL && strstr(dt_last_error(), "desc is NULL") != NULL && strstr(dt_last_error(), "desc.data") != NULL);
    CHECK_ERR(dt_fed_create(&fed, c, m, &zero), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "desc.data is NULL") != NULL);
    /* an unfinalised model, then a NULL one, a NULL communicator and a NULL out: the same codes everywhere */
    for (k = 0; k < 4; k++) {
        dt_model *mk = k == 0 ? raw : k == 1 ? NULL : m;
        dt_comm *ck = k == 2 ? NULL : c;
        dt_result want = k == 0 ? DT_ERR_STATE : DT_ERR_INVALID_ARG;
        const char *says = k == 0 ? "not finalized: call dt_model_finalize" : k == 1 ? "the model is NULL" :
                           k == 2 ? "the communicator is NULL" : "out is NULL";
        ddp = (dt_ddp *)&c; dps = (dt_dpsgd *)&c; ls = (dt_localsgd *)&c; fed = (dt_fed *)&c;
        CHECK_ERR(dt_ddp_create(k == 3 ? NULL : &ddp, ck, mk, NULL), want);
        CHECK(strstr(dt_last_error(), "dt_ddp_create") != NULL && strstr(dt_last_error(), says) != NULL);
        CHECK_ERR(dt_dpsgd_create(k == 3 ? NULL : &dps, ck, mk, &t, NULL), want);
        CHECK(strstr(dt_last_error(), "dt_dpsgd_create") != NULL && strstr(dt_last_error(), says) != NULL);
        CHECK_ERR(dt_localsgd_create(k == 3 ? NULL : &ls, ck, mk, NULL), want);
        CHECK(strstr(dt_last_error(), "dt_localsgd_create") != NULL && strstr(dt_last_error(), says) != NULL);
        CHECK_ERR(dt_fed_create(k == 3 ? NULL : &fed, ck, mk, NULL), want);   /* before its desc is read */
        CHECK(strstr(dt_last_error(), "dt_fed_create") != NULL && strstr(dt_last_error(), says) != NULL);
        if (k < 3) CHECK(ddp == NULL && dps == NULL && ls == NULL && fed == NULL);
    }
    CHECK_ERR(dt_hogwild_run(raw, 2, hog_noop, NULL), DT_ERR_STATE);
    CHECK(strstr(dt_last_error(), "the shared model is not finalized: call dt_model_finalize") != NULL);
    CHECK_ERR(dt_hogwild_run(NULL, 2, hog_noop, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "the shared model is NULL") != NULL);
    CHECK_OK(dt_hogwild_run(m, 2, hog_noop, NULL));
    dt_topology_free(&t);
    dt_comm_destroy(c);
    dt_model_destroy(raw);
    dt_model_destroy(m);
}

static void test_allocator_hooks_and_oom(void) {
    dt_model *m;
    float x[2 * 784];
    int32_t y[2] = {3, 4};
    float loss;
    long k, needed, ooms = 0;
    memset(x, 0, sizeof x);
    live_allocs = total_allocs = 0;
    fail_after = -1;
    CHECK_OK(dt_zoo_create(&m, DT_ZOO_LENET5, 0, NULL));
    CHECK_OK(dt_model_forward(m, x, 2));
    CHECK_OK(dt_model_loss_cross_entropy(m, y, &loss));
    CHECK_OK(dt_model_backward(m, NULL));
    dt_model_destroy(m);
    needed = total_allocs;
    CHECK(needed > 5);
    CHECK(live_allocs == 0);
    for (k = 0; k < needed; k++) {
        dt_result r;
        live_allocs = total_allocs = 0;
        fail_after = k;
        r = dt_zoo_create(&m, DT_ZOO_LENET5, 0, NULL);
        if (r == DT_OK) r = dt_model_forward(m, x, 2);
        if (r == DT_OK) r = dt_model_loss_cross_entropy(m, y, &loss);
        if (r == DT_OK) r = dt_model_backward(m, NULL);
        CHECK(r == DT_OK || r == DT_ERR_OUT_OF_MEMORY);
        if (r == DT_ERR_OUT_OF_MEMORY) { ooms++; CHECK(strstr(dt_last_error(), "memory") != NULL); }
        dt_model_destroy(m);
        m = NULL;
        CHECK(live_allocs == 0);
    }
    CHECK(ooms > 5);
    fail_after = -1;
}

/* A training step allocates nothing once the first step has sized the arena: forward, loss, backward
   and the optimizer run on memory planned in advance (the GEMM's packing space included). */
static void test_no_allocation_in_the_step(void) {
    dt_model *m;
    dt_optim *o;
    dt_optim_desc od;
    float x[16 * 3 * 32 * 32], loss;
    int32_t y[16];
    long before;
    int i, z;
    for (i = 0; i < 16; i++) y[i] = i % 10;
    for (i = 0; i < 16 * 3 * 32 * 32; i++) x[i] = (float)((i * 7) % 13) / 13.0f;
    for (z = 0; z < 2; z++) {
        fail_after = -1;
        CHECK_OK(dt_zoo_create(&m, z ? DT_ZOO_RESNET20 : DT_ZOO_LENET5, 0, NULL));
        memset(&od, 0, sizeof od);
        od.kind = z ? DT_OPTIM_ADAM : DT_OPTIM_SGD; od.lr = DT_DEFAULT; od.momentum = z ? 0.0f : 0.9f;
        CHECK_OK(dt_optim_create(&o, m, &od));
        for (i = 0; i < 4; i++) {
            int64_t batch = i == 3 ? 5 : 16;       /* a smaller last batch reuses the arena too */
            if (i == 1) before = total_allocs;
            CHECK_OK(dt_model_forward(m, x, batch));
            CHECK_OK(dt_model_loss_labels(m, y, &loss));
            dt_model_zero_grad(m);
            CHECK_OK(dt_model_backward(m, NULL));
            CHECK_OK(dt_optim_clip_grad_norm(o, 5.0f, NULL));
            CHECK_OK(dt_optim_step(o));
        }
        CHECK(total_allocs == before);
        dt_optim_destroy(o);
        dt_model_destroy(m);
    }
}

/* A message that wraps the last error (dt_set_error(r, "context: %s", dt_last_error())) keeps the cause whole:
   the wrapper reads the message it replaces. */
static void test_error_wraps_last_error(void) {
    dt_set_error(DT_ERR_IO, "cannot open %s", "x.idx");
    dt_set_error(DT_ERR_STATE, "client %d failed: %s", 3, dt_last_error());
    CHECK(strstr(dt_last_error(), "client 3 failed: ") != NULL);
    CHECK(strstr(dt_last_error(), "cannot open x.idx") != NULL);
    CHECK(strncmp(dt_last_error(), dt_result_str(DT_ERR_STATE), strlen(dt_result_str(DT_ERR_STATE))) == 0);
}

/* A model or a batch larger than the machine's memory is refused before anything that large is allocated
   (malloc may grant it, and the kernel would kill the process when the pages are first written). */
static void test_larger_than_memory(void) {
    dt_model *m = NULL;
    dt_model_desc d;
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    double phys = (double)pages * (double)psize;
    int64_t side;
    float x[4] = {0};
    refuse_above = (size_t)1 << 30;   /* should the check be missing, nothing that large is really allocated */
    /* a linear layer whose weights alone take 60% of the memory: each buffer fits, all of them do not */
    side = (int64_t)sqrt(0.6 * phys / 4.0);
    memset(&d, 0, sizeof d);
    d.in_c = side; d.in_h = 1; d.in_w = 1;
    CHECK_OK(dt_model_create(&m, &d));
    CHECK(dt_linear(m, dt_flatten(m, 0), side, 0) > 0);
    largest_request = 0;
    CHECK_ERR(dt_model_finalize(m), DT_ERR_OUT_OF_MEMORY);
    CHECK(strstr(dt_last_error(), "GB of memory") && strstr(dt_last_error(), "dt_model_finalize"));
    CHECK(largest_request < (size_t)1 << 30);   /* refused before the allocation, not by it */
    dt_model_destroy(m);
    /* a small model whose batch would not fit: refused by the forward pass, which names the batch */
    m = NULL;
    d.in_c = 4;
    CHECK_OK(dt_model_create(&m, &d));
    CHECK(dt_linear(m, dt_flatten(m, 0), 4, 1) > 0);
    CHECK_OK(dt_model_finalize(m));
    largest_request = 0;
    CHECK_ERR(dt_model_forward(m, x, (int64_t)(phys / 16.0)), DT_ERR_OUT_OF_MEMORY);
    CHECK(strstr(dt_last_error(), "smaller batch") != NULL);
    CHECK(largest_request < (size_t)1 << 30);
    dt_model_destroy(m);
    refuse_above = 0;
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_errors\n");
    RUN(test_create_errors);
    RUN(test_error_wraps_last_error);
    RUN(test_builder_errors);
    RUN(test_node_name_errors);
    RUN(test_run_errors);
    RUN(test_trainer_create_rule);
    RUN(test_allocator_hooks_and_oom);
    if (sysconf(_SC_PHYS_PAGES) > 0) RUN(test_larger_than_memory);
    else dt_t_skip("test_larger_than_memory", "the machine's memory cannot be told");
    RUN(test_no_allocation_in_the_step);
    return dt_t_summary();
}
