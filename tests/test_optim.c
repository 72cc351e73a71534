/* Optimizers, gradient clipping, frozen parameters and LR schedules against PyTorch's trajectories
   (fixtures written by tests/gen_optim_fixtures.py): 20 steps within 1e-5 relative. */
#include "../dtrain.h"
#include "dt_test.h"

/* A float constant as a float: where float arithmetic is evaluated in double (FLT_EVAL_METHOD 1: s390x's gcc
   -std=c11), 0.01f alone keeps the decimal's double value, which no float (dt_optim_lr's) equals; a cast rounds. */
#define F32(x) ((float)(x))

/* Linear(2,3) + Linear(3,2): parameter tensors of shapes (3,2), (3,), (2,3), (2,) as in the fixtures */
static dt_model *two_linear(void) {
    dt_model *m = NULL;
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    d.in_c = 2;
    CHECK_OK(dt_model_create(&m, &d));
    dt_model_set_node_name(m, dt_linear(m, dt_model_set_node_name(m, dt_linear(m, 0, 3, 1), "fc1"), 2, 1), "fc2");
    CHECK_OK(dt_model_finalize(m));
    return m;
}

/* One fixture's trajectory; with clip_in_desc, its clipping through dt_optim_desc.clip_norm (inside each step)
   instead of a call of dt_optim_clip_grad_norm before it. */
static void run_case_as(const char *name, int clip_in_desc) {
    dt_t_fix f;
    dt_model *m;
    dt_optim *o = NULL;
    dt_optim_desc od;
    dt_sched_desc sd;
    float *cfg, *p0, *grads, *traj, *lrs, *norms;
    int64_t n = 0, steps, s;
    char fx[64], what[128];
    snprintf(fx, sizeof fx, "optim_%s", name);
    if (dt_t_fix_load(&f, fx)) return;
    cfg = dt_t_get(&f, "cfg", NULL); p0 = dt_t_get(&f, "p0", &n); grads = dt_t_get(&f, "grads", NULL);
    traj = dt_t_get(&f, "traj", NULL); lrs = dt_t_get(&f, "lrs", NULL); norms = dt_t_get(&f, "norms", NULL);
    if (!cfg || !p0 || !grads || !traj || !lrs || !norms) { dt_t_fix_free(&f); return; }
    m = two_linear();
    CHECK(dt_model_param_count(m) == n);
    CHECK_OK(dt_model_set_params(m, p0, n));
    memset(&od, 0, sizeof od);
    od.kind = (dt_optim_kind)(int)cfg[0]; od.lr = cfg[1]; od.momentum = cfg[2]; od.dampening = cfg[3];
    od.weight_decay = cfg[4]; od.nesterov = cfg[5] != 0.0f; od.beta1 = cfg[6]; od.beta2 = cfg[7]; od.eps = cfg[8];
    if (od.kind == DT_OPTIM_SGD) od.beta1 = od.beta2 = od.eps = 0.0f;
    memset(&sd, 0, sizeof sd);
    sd.kind = (dt_sched_kind)(int)cfg[10]; sd.base_lr = cfg[1];
    sd.milestones[0] = (int64_t)cfg[11]; sd.milestones[1] = (int64_t)cfg[12]; sd.gamma = cfg[13];
    sd.t_max = (int64_t)cfg[14]; sd.min_lr = cfg[15]; sd.warmup = (int64_t)cfg[16]; sd.warmup_start = cfg[17];
    steps = (int64_t)cfg[18];
    if (clip_in_desc) od.clip_norm = cfg[9];
    CHECK_OK(dt_optim_create(&o, m, &od));
    if (!o) { dt_model_destroy(m); dt_t_fix_free(&f); return; }
    if ((int)cfg[19] >= 1) CHECK(dt_optim_freeze(o, "fc1.weight", 1) == 1);
    if ((int)cfg[19] >= 2) CHECK(dt_optim_freeze(o, "fc1.bias", 1) == 1);
    for (s = 0; s < steps; s++) {
        float lr = dt_sched_lr(&sd, s), norm = 0.0f;
        snprintf(what, sizeof what, "%s: lr at step %lld", name, (long long)s);
        CHECK_CLOSE(&lr, &lrs[s], 1, 1e-6, what);
        CHECK_OK(dt_optim_set_lr(o, lr));
        memcpy(dt_model_grads(m, NULL), grads + s * n, sizeof(float) * (size_t)n);
        if (cfg[9] > 0.0f && !clip_in_desc) {
            CHECK_OK(dt_optim_clip_grad_norm(o, cfg[9], &norm));
            snprintf(what, sizeof what, "%s: gradient norm at step %lld", name, (long long)s);
            CHECK_CLOSE(&norm, &norms[s], 1, 1e-5, what);
        }
        CHECK_OK(dt_optim_step(o));
        snprintf(what, sizeof what, "%s: parameters after step %lld", name, (long long)s + 1);
        CHECK_CLOSE(dt_model_params(m, NULL), traj + s * n, n, 1e-5, what);
    }
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_t_fix_free(&f);
}

static void run_case(const char *name) { run_case_as(name, 0); }

static void test_torch_sgd(void) {
    run_case("sgd_plain");
    run_case("sgd_momentum");
    run_case("sgd_nesterov");
}
static void test_torch_adam(void) {
    run_case("adam");
    run_case("adam_wd");
    run_case("adamw");
}
static void test_torch_schedules(void) {
    run_case("sgd_multistep");
    run_case("sgd_warmup_cosine");
}
static void test_torch_clip_and_frozen(void) {
    run_case("sgd_clip");
    run_case("adam_cosine_clip");
    run_case_as("sgd_clip", 1);           /* dt_optim_desc.clip_norm: the same trajectory */
    run_case_as("adam_cosine_clip", 1);
    run_case("sgd_frozen");
    run_case("adamw_frozen_multistep");
}

/* Frozen tensors keep their values exactly; unfreezing resumes their updates; state has the layout. */
static void test_freeze_and_state(void) {
    dt_model *m = two_linear();
    dt_optim *o;
    dt_optim_desc d;
    int64_t n, sn, i;
    float before[17];
    memset(&d, 0, sizeof d);
    d.kind = DT_OPTIM_ADAM; d.lr = DT_DEFAULT;
    CHECK_OK(dt_optim_create(&o, m, &d));
    CHECK(dt_optim_lr(o) == F32(0.001f));
    CHECK(dt_optim_state(o, &sn) != NULL && sn == 2 * dt_model_param_count(m));
    CHECK(dt_optim_freeze(o, NULL, 1) == 4);
    CHECK(dt_optim_freeze(o, "fc2", 0) == 2);
    CHECK(dt_optim_freeze(o, "nothing", 1) == 0);
    dt_model_params(m, &n);
    memcpy(before, dt_model_params(m, NULL), sizeof before);
    for (i = 0; i < n; i++) dt_model_grads(m, NULL)[i] = 1.0f;
    CHECK_OK(dt_optim_step(o));
    for (i = 0; i < 9; i++) CHECK(dt_model_params(m, NULL)[i] == before[i]);       /* fc1: 6 + 3 frozen */
    for (i = 9; i < n; i++) CHECK(dt_model_params(m, NULL)[i] != before[i]);
    CHECK(dt_optim_tensor_steps(o, 0) == 0 && dt_optim_tensor_steps(o, 2) == 1);
    {
        int64_t st[4] = {5, 5, 5, 5};
        CHECK_OK(dt_optim_set_tensor_steps(o, st, 4));
        CHECK(dt_optim_tensor_steps(o, 3) == 5);
        CHECK_ERR(dt_optim_set_tensor_steps(o, st, 3), DT_ERR_SHAPE);
    }
    CHECK(dt_optim_tensors(o) == 4);
    dt_optim_destroy(o);
    d.kind = DT_OPTIM_SGD;                     /* plain SGD keeps no state */
    CHECK_OK(dt_optim_create(&o, m, &d));
    CHECK(dt_optim_state(o, &sn) == NULL && sn == 0);
    CHECK(dt_optim_lr(o) == F32(0.01f));
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

static void test_optim_errors(void) {
    dt_model *m = two_linear();
    dt_optim *o = (dt_optim *)&o;
    dt_optim_desc d;
    float norm;
    memset(&d, 0, sizeof d);
    CHECK_ERR(dt_optim_create(NULL, m, &d), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_optim_create(&o, NULL, &d), DT_ERR_STATE);
    CHECK(o == NULL);
    d.lr = -2.0f;                              /* neither a rate nor DT_DEFAULT */
    CHECK_ERR(dt_optim_create(&o, m, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "lr -2") != NULL && strstr(dt_last_error(), "DT_DEFAULT") != NULL);
    d.lr = INFINITY;
    CHECK_ERR(dt_optim_create(&o, m, &d), DT_ERR_INVALID_ARG);
    d.lr = 0.1f; d.nesterov = 1;
    CHECK_ERR(dt_optim_create(&o, m, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "Nesterov") != NULL);
    d.nesterov = 0; d.kind = (dt_optim_kind)7;
    CHECK_ERR(dt_optim_create(&o, m, &d), DT_ERR_INVALID_ARG);
    d.kind = DT_OPTIM_ADAM; d.beta1 = 1.0f;
    CHECK_ERR(dt_optim_create(&o, m, &d), DT_ERR_INVALID_ARG);
    d.beta1 = 0.0f;
    CHECK_OK(dt_optim_create(&o, m, &d));
    CHECK_ERR(dt_optim_clip_grad_norm(o, 0.0f, &norm), DT_ERR_INVALID_ARG);
    dt_model_grads(m, NULL)[3] = NAN;
    CHECK_ERR(dt_optim_clip_grad_norm(o, 1.0f, &norm), DT_ERR_NUMERIC);
    CHECK_ERR(dt_optim_step(NULL), DT_ERR_INVALID_ARG);
    dt_optim_destroy(o);
    o = NULL;
    d.clip_norm = -1.0f;
    CHECK_ERR(dt_optim_create(&o, m, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "clip_norm -1") != NULL);
    d.clip_norm = INFINITY;
    CHECK_ERR(dt_optim_create(&o, m, &d), DT_ERR_INVALID_ARG);
    d.clip_norm = 1.0f;   /* a step that clips a NaN gradient: DT_ERR_NUMERIC, and no parameter moves */
    CHECK_OK(dt_optim_create(&o, m, &d));
    if (o) {
        int64_t np = 0;
        float before[64], *p = dt_model_params(m, &np);
        if (np > 64) np = 64;
        memcpy(before, p, sizeof(float) * (size_t)np);
        CHECK_ERR(dt_optim_step(o), DT_ERR_NUMERIC);
        CHECK(memcmp(before, p, sizeof(float) * (size_t)np) == 0);
    }
    dt_optim_destroy(o);
    dt_optim_destroy(NULL);
    dt_model_destroy(m);
}

/* lr 0 is 0, not the default: SGD (momentum, weight decay, Nesterov), Adam and AdamW leave every parameter
   as it was, from create and from dt_optim_set_lr (a schedule that ends at 0); a NULL desc is every default;
   dt_optim_set_lr refuses a rate that is negative or not finite. */
static void test_lr_zero(void) {
    dt_model *m = two_linear();
    dt_optim *o = NULL;
    dt_optim_desc d;
    int64_t n, i;
    int kind, step;
    float before[17];
    dt_model_params(m, &n);
    CHECK(n <= 17);
    for (kind = DT_OPTIM_SGD; kind <= DT_OPTIM_ADAMW + 1; kind++) {
        memset(&d, 0, sizeof d);
        d.kind = kind > DT_OPTIM_ADAMW ? DT_OPTIM_SGD : (dt_optim_kind)kind;
        d.lr = kind > DT_OPTIM_ADAMW ? 0.1f : 0.0f;   /* the last: 0.1, then set to 0 */
        d.weight_decay = 0.01f;
        if (d.kind == DT_OPTIM_SGD) { d.momentum = 0.9f; d.nesterov = 1; }
        CHECK_OK(dt_optim_create(&o, m, &d));
        if (!o) continue;
        if (kind > DT_OPTIM_ADAMW) CHECK_OK(dt_optim_set_lr(o, 0.0f));
        CHECK(dt_optim_lr(o) == 0.0f);
        memcpy(before, dt_model_params(m, NULL), sizeof(float) * (size_t)n);
        for (step = 0; step < 3; step++) {
            for (i = 0; i < n; i++) dt_model_grads(m, NULL)[i] = 0.5f - 0.1f * (float)i;
            CHECK_OK(dt_optim_step(o));
        }
        CHECK(memcmp(before, dt_model_params(m, NULL), sizeof(float) * (size_t)n) == 0);
        dt_optim_destroy(o);
    }
    CHECK_OK(dt_optim_create(&o, m, NULL));
    CHECK(dt_optim_lr(o) == F32(0.01f));
    /* a negative, NaN or infinite rate is refused, naming it, and the rate stays */
    CHECK_ERR(dt_optim_set_lr(o, -0.1f), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_optim_set_lr(o, NAN), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_optim_set_lr(o, INFINITY), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "learning rate inf") != NULL);
    CHECK(dt_optim_lr(o) == F32(0.01f));
    CHECK_ERR(dt_optim_set_lr(NULL, 0.1f), DT_ERR_INVALID_ARG);
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

/* Schedules at chosen points, written out: multistep x0.1 at 80 and 120, cosine with a floor, warm-up. */
static void test_schedules_by_hand(void) {
    dt_sched_desc s;
    memset(&s, 0, sizeof s);
    s.kind = DT_SCHED_MULTISTEP; s.base_lr = 0.1f; s.milestones[0] = 80; s.milestones[1] = 120;
    CHECK(fabsf(dt_sched_lr(&s, 79) - 0.1f) < 1e-7f && fabsf(dt_sched_lr(&s, 80) - 0.01f) < 1e-7f);
    CHECK(fabsf(dt_sched_lr(&s, 120) - 0.001f) < 1e-8f && fabsf(dt_sched_lr(&s, 500) - 0.001f) < 1e-8f);
    memset(&s, 0, sizeof s);
    s.kind = DT_SCHED_COSINE; s.base_lr = 1.0f; s.t_max = 10; s.min_lr = 0.1f;
    CHECK(dt_sched_lr(&s, 0) == 1.0f && fabsf(dt_sched_lr(&s, 5) - 0.55f) < 1e-6f && fabsf(dt_sched_lr(&s, 10) - 0.1f) < 1e-6f);
    s.kind = DT_SCHED_CONSTANT; s.warmup = 4; s.warmup_start = 0.0f;          /* default start 1/3 */
    CHECK(fabsf(dt_sched_lr(&s, 0) - 1.0f / 3.0f) < 1e-6f && fabsf(dt_sched_lr(&s, 2) - 2.0f / 3.0f) < 1e-6f);
    CHECK(dt_sched_lr(&s, 4) == 1.0f && dt_sched_lr(&s, -3) == dt_sched_lr(&s, 0) && dt_sched_lr(NULL, 1) == 0.0f);
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_optim\n");
    RUN(test_torch_sgd);
    RUN(test_torch_adam);
    RUN(test_torch_schedules);
    RUN(test_torch_clip_and_frozen);
    RUN(test_freeze_and_state);
    RUN(test_optim_errors);
    RUN(test_lr_zero);
    RUN(test_schedules_by_hand);
    return dt_t_summary();
}
