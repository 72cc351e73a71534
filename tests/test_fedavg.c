/* test_fedavg.c - FedAvg: each aggregator against a hand computation, the minimum-client refusals, one client
   with C = 1 and E = 1 equal to plain training on its data, label flipping touching only the flipped labels,
   sign flipping, zero that means zero (the noise std, Krum's f, the learning rate), a batchnorm model's global
   parameters and statistics the same on 1 and 3 ranks, dropouts that leave clients out without hanging,
   100 clients over 4 local ranks, and the server optimizers (FedAvgM, FedAdagrad, FedAdam, FedYogi) against a
   hand computation, resumed bit for bit. */
#define _POSIX_C_SOURCE 200809L   /* mkdtemp, rmdir (dt_test_os.h) */
#include "../dtrain.h"
#include "dt_test.h"
#include "dt_test_os.h"

#define IN 12      /* features */
#define K 4        /* classes */
#define NS 200     /* samples */

static uint8_t PIX[NS * IN];
static int32_t LAB[NS];
static dt_dataset DS;

static void make_data(void) {
    dt_rng r;
    int i;
    dt_rng_init(&r, 11, 0);
    for (i = 0; i < NS * IN; i++) PIX[i] = (uint8_t)dt_rng_below(&r, 256);
    for (i = 0; i < NS; i++) LAB[i] = (int32_t)dt_rng_below(&r, K);
    memset(&DS, 0, sizeof DS);
    DS.count = NS; DS.c = IN; DS.h = 1; DS.w = 1; DS.num_classes = K; DS.pixels = PIX; DS.labels = LAB;
}

/* IN -> 8 (-> batchnorm) -> relu -> K */
/* bn: 1 a batch norm after the first layer; 2 a dropout layer (p 0.5) after its ReLU too */
static dt_result make_model_bn(dt_model **m, int bn) {
    dt_model_desc d;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = IN; d.seed = 3;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    x = dt_model_input(*m);
    x = dt_linear(*m, x, 8, 1);
    if (bn) x = dt_batchnorm(*m, x);
    x = dt_relu(*m, x);
    if (bn == 2) x = dt_dropout(*m, x, 0.5f);
    x = dt_linear(*m, x, K, 1);
    return dt_model_finalize(*m);
}
static dt_result make_model(dt_model **m) { return make_model_bn(m, 0); }

/* dt_fed_aggregate with the aggregator `kind` set in d. */
static dt_result agg(dt_fed_agg kind, const float *const *u, const double *w, int n, int64_t len, float *out, int *kept,
                     dt_fed_agg_desc *d) {
    d->kind = kind;
    return dt_fed_aggregate(d, u, w, n, len, out, kept);
}

/* An IID partition of count samples into parts. */
static dt_result iid(dt_partition *p, int64_t count, int parts, uint64_t seed) {
    dt_partition_desc d;
    memset(&d, 0, sizeof d);
    d.count = count; d.parts = parts; d.seed = seed;
    return dt_partition_create(p, &d);
}

/* 5 clients, 2 coordinates, client 4 the outlier. */
static const float U[5][2] = {{1, 1}, {2, 2}, {3, 3}, {4, 4}, {100, -100}};
static const float *UP[5] = {U[0], U[1], U[2], U[3], U[4]};

static void test_aggregators(void) {
    float out[2] = {0, 0};
    int kept[5], i;
    double w[2] = {1.0, 3.0};
    const float a[2] = {0, 4}, b[2] = {4, 0}, *ab[2] = {a, b};
    dt_fed_agg_desc d;
    memset(&d, 0, sizeof d);
    d.f = DT_DEFAULT;                                                         /* Krum's f: the default, 1 */
    CHECK_OK(agg(DT_FED_MEAN, ab, w, 2, 2, out, kept, &d));            /* (1 * a + 3 * b) / 4 */
    CHECK(out[0] == 3.0f && out[1] == 1.0f && kept[0] && kept[1]);
    CHECK_OK(agg(DT_FED_MEDIAN, UP, NULL, 5, 2, out, kept, &d));       /* sorted columns: 1 2 [3] 4 100, -100 1 [2] 3 4 */
    CHECK(out[0] == 3.0f && out[1] == 2.0f);
    CHECK_OK(agg(DT_FED_MEDIAN, UP, NULL, 4, 2, out, kept, &d));       /* even n: mean of the middle two */
    CHECK(out[0] == 2.5f && out[1] == 2.5f);
    d.trim = 0.2f;                                                            /* 1 cut at each end */
    CHECK_OK(agg(DT_FED_TRIMMED, UP, NULL, 5, 2, out, kept, &d));     /* mean(2,3,4), mean(1,2,3) */
    CHECK(fabsf(out[0] - 3.0f) < 1e-6f && fabsf(out[1] - 2.0f) < 1e-6f);
    for (i = 0; i < 5; i++) CHECK(kept[i]);                                   /* every update enters a trimmed mean */
    /* Krum, f = 1: scores over the 2 nearest: 10, 4, 4, 10, huge; the tie goes to client 1 */
    CHECK_OK(agg(DT_FED_KRUM, UP, NULL, 5, 2, out, kept, &d));
    CHECK(out[0] == 2.0f && out[1] == 2.0f);
    CHECK(!kept[0] && kept[1] && !kept[2] && !kept[3] && !kept[4]);
    out[0] = out[1] = 0.0f;
    CHECK_OK(agg(DT_FED_KRUM, UP, NULL, 5, 2, out, NULL, &d));   /* kept may be NULL */
    CHECK(out[0] == 2.0f && out[1] == 2.0f);
    CHECK_OK(agg(DT_FED_MULTIKRUM, UP, NULL, 5, 2, out, kept, &d));   /* the n - f = 4 best: all but client 4 */
    CHECK(out[0] == 2.5f && out[1] == 2.5f && !kept[4]);
    for (i = 0; i < 4; i++) CHECK(kept[i]);
    d.m = 2;                                                                  /* clients 1 and 2 */
    CHECK_OK(agg(DT_FED_MULTIKRUM, UP, NULL, 5, 2, out, kept, &d));
    CHECK(out[0] == 2.5f && out[1] == 2.5f && kept[1] && kept[2] && !kept[0] && !kept[3]);
    /* f = 0 is a request, not the default: Krum on 4 clients (f = 1 needs 5), scores over the 2 nearest:
       10, 4, 4, 10; multi-Krum's m = n - f = 5 keeps everyone, the plain mean */
    d.f = 0; d.m = 0;
    CHECK_OK(agg(DT_FED_KRUM, UP, NULL, 4, 2, out, kept, &d));
    CHECK(out[0] == 2.0f && out[1] == 2.0f && kept[1] && !kept[0] && !kept[2] && !kept[3]);
    CHECK_OK(agg(DT_FED_MULTIKRUM, UP, NULL, 5, 2, out, kept, &d));
    CHECK(fabsf(out[0] - 22.0f) < 1e-4f && fabsf(out[1] + 18.0f) < 1e-4f);
    for (i = 0; i < 5; i++) CHECK(kept[i]);
    memset(&d, 0, sizeof d);                                                  /* a zeroed desc: f = 0 too */
    CHECK_OK(agg(DT_FED_KRUM, UP, NULL, 3, 2, out, kept, &d));         /* 3 = 2f + 3 clients; scores 2, 2, 2 */
    CHECK(out[0] == 1.0f && out[1] == 1.0f && kept[0] && !kept[1] && !kept[2]);
}

static void test_classmean(void) {
    /* last layer [2 classes, 2], then one bias-like coordinate; client 3 moved class 1's row */
    float u[5][5] = {{1, 1, 0, 0, 9}, {1.1f, 1, 0.1f, 0, 9}, {0.9f, 1, 0, 0.1f, 9}, {1, 1, 5, -5, 9}, {1, 0.9f, 0, 0, 9}};
    const float *p[5] = {u[0], u[1], u[2], u[3], u[4]};
    double w[5] = {1, 1, 1, 1, 1};
    float out[5] = {0, 0, 0, 0, 0};
    int kept[5];
    dt_fed_agg_desc d;
    memset(&d, 0, sizeof d);
    d.cm_offset = 0; d.cm_rows = 2; d.cm_cols = 2;
    CHECK_OK(agg(DT_FED_CLASSMEAN, p, w, 5, 5, out, kept, &d));
    CHECK(kept[0] && kept[1] && kept[2] && !kept[3] && kept[4]);
    CHECK(fabsf(out[2] - 0.025f) < 1e-6f && fabsf(out[4] - 9.0f) < 1e-6f);
}

static void test_refusals(void) {
    float out[2] = {0, 0};
    double bad[2] = {1.0, 0.0};
    dt_fed_agg_desc d;
    memset(&d, 0, sizeof d);
    d.f = DT_DEFAULT;
    CHECK_ERR(agg(DT_FED_KRUM, UP, NULL, 4, 2, out, NULL, &d), DT_ERR_INVALID_ARG);       /* 4 < 2f + 3 = 5 */
    d.f = -3;                                                                                    /* neither f nor DT_DEFAULT */
    CHECK_ERR(agg(DT_FED_KRUM, UP, NULL, 5, 2, out, NULL, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "f = -3") != NULL && strstr(dt_last_error(), "DT_DEFAULT") != NULL);
    CHECK_OK(agg(DT_FED_MEDIAN, UP, NULL, 5, 2, out, NULL, &d));                         /* f is Krum's alone */
    d.f = 2;
    CHECK_ERR(agg(DT_FED_MULTIKRUM, UP, NULL, 5, 2, out, NULL, &d), DT_ERR_INVALID_ARG);  /* 5 < 7 */
    d.trim = 0.5f;
    CHECK_ERR(agg(DT_FED_TRIMMED, UP, NULL, 4, 2, out, NULL, &d), DT_ERR_INVALID_ARG);    /* cuts 2 + 2 of 4 */
    {   /* trim 0 is a request, the unweighted mean of all 5 (it used to become 0.1); DT_DEFAULT is 0.1 (cuts 0 of 5) */
        dt_fed_agg_desc z;
        const double w5[5] = {1, 1, 1, 1, 96};
        memset(&z, 0, sizeof z);
        CHECK_OK(agg(DT_FED_TRIMMED, UP, w5, 5, 2, out, NULL, &z));
        CHECK(fabsf(out[0] - 22.0f) < 1e-5f && fabsf(out[1] + 18.0f) < 1e-5f);   /* (1+2+3+4+100)/5, (1+2+3+4-100)/5 */
        z.trim = DT_DEFAULT;
        CHECK_OK(agg(DT_FED_TRIMMED, UP, NULL, 5, 2, out, NULL, &z));
        CHECK(fabsf(out[0] - 22.0f) < 1e-5f);                                       /* floor(0.1 x 5) = 0 cut */
        z.trim = -0.2f;
        CHECK_ERR(agg(DT_FED_TRIMMED, UP, NULL, 5, 2, out, NULL, &z), DT_ERR_INVALID_ARG);
    }
    d.cm_rows = 1; d.cm_cols = 2;
    CHECK_ERR(agg(DT_FED_CLASSMEAN, UP, NULL, 2, 2, out, NULL, &d), DT_ERR_INVALID_ARG);  /* needs 3 clients */
    CHECK_ERR(dt_fed_aggregate(NULL, UP, bad, 2, 2, out, NULL), DT_ERR_INVALID_ARG);      /* zero weight */
    CHECK_OK(dt_fed_aggregate(NULL, UP, NULL, 2, 2, out, NULL));                          /* NULL: the mean */
    CHECK(out[0] == 1.5f && out[1] == 1.5f);
    d.kind = (dt_fed_agg)DT_FED_AGG_COUNT;
    CHECK_ERR(dt_fed_aggregate(&d, UP, NULL, 5, 2, out, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dt_fed_aggregate: kind is 6; use a dt_fed_agg") != NULL);
}

/* The desc of fed_once: nclients clients on part, batch 7, lr 0.1, seed 5. */
static dt_fed_desc fed_desc(const dt_partition *part, int nclients) {
    dt_fed_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.clients = nclients; fd.batch = 7; fd.optim.lr = 0.1f; fd.data = &DS; fd.part = part; fd.seed = 5;
    return fd;
}

/* One round of FedAvg of desc fd on the self communicator; params [n] receives the new global model. */
static void fed_round_once(const dt_fed_desc *fd, float *params, int64_t n) {
    dt_comm *c = NULL;
    dt_model *m = NULL;
    dt_fed *f = NULL;
    dt_fed_round_info info;
    CHECK_OK(dt_comm_create_self(&c, NULL));
    CHECK_OK(make_model(&m));
    CHECK_OK(dt_fed_create(&f, c, m, fd));
    if (f) {
        CHECK_OK(dt_fed_round(f, 0, &info));
        CHECK(info.selected == fd->clients && info.dropped == 0 && info.kept == fd->clients);
    }
    CHECK_OK(dt_model_get_params(m, params, n));
    dt_fed_destroy(f);
    dt_model_destroy(m);
    dt_comm_destroy(c);
}

/* fed_round_once with these behaviours, label flip (flip_from >= 0) and FedProx mu. */
static void fed_once(const dt_partition *part, int nclients, const int *behaviour, int flip_from, int flip_to,
                     float prox_mu, float *params, int64_t n) {
    dt_fed_desc fd = fed_desc(part, nclients);
    fd.behaviour = behaviour; fd.prox_mu = prox_mu;
    if (flip_from >= 0) {
        int i;
        for (i = 0; i < K; i++) fd.flip[i] = i;
        fd.flip[flip_from] = flip_to;
        fd.flip_set = 1;
    }
    fed_round_once(&fd, params, n);
}

/* FedAvg with one client, C = 1, E = 1: the same parameters as plain training on that client's data. */
static void test_one_client_equals_plain(void) {
    dt_partition part;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_loader *l = NULL;
    dt_optim_desc od;
    dt_loader_desc ld;
    const float *x;
    const int32_t *y;
    int64_t nb, n;
    float loss, *a, *b;
    CHECK_OK(iid(&part, NS, 1, 9));
    CHECK_OK(make_model(&m));
    n = dt_model_param_count(m);
    a = (float *)malloc(sizeof(float) * (size_t)n);
    b = (float *)malloc(sizeof(float) * (size_t)n);
    memset(&od, 0, sizeof od);
    od.lr = 0.1f;
    memset(&ld, 0, sizeof ld);
    ld.dataset = &DS; ld.indices = part.indices; ld.count = NS; ld.batch = 7; ld.shuffle = 1; ld.seed = 5; ld.rank = 0;
    CHECK_OK(dt_optim_create(&o, m, &od));
    CHECK_OK(dt_loader_create(&l, &ld));
    CHECK_OK(dt_loader_start_epoch(l, 0));
    while (dt_loader_next(l, &x, &y, &nb) == DT_OK && nb > 0) {
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_forward(m, x, nb));
        CHECK_OK(dt_model_loss_labels(m, y, &loss));
        CHECK_OK(dt_model_backward(m, NULL));
        CHECK_OK(dt_optim_step(o));
    }
    CHECK_OK(dt_model_get_params(m, a, n));
    fed_once(&part, 1, NULL, -1, 0, 0.0f, b, n);
    CHECK_CLOSE(b, a, n, 1e-6, "one client vs plain training");
    {   /* sign flipping: the global model moves the other way, w0 - delta */
        int sf = DT_FED_SIGNFLIP;
        float *w0 = (float *)malloc(sizeof(float) * (size_t)n), *c = (float *)malloc(sizeof(float) * (size_t)n);
        int64_t j;
        dt_model *m0 = NULL;
        CHECK_OK(make_model(&m0));
        CHECK_OK(dt_model_get_params(m0, w0, n));
        fed_once(&part, 1, &sf, -1, 0, 0.0f, c, n);
        for (j = 0; j < n; j++) c[j] = 2.0f * w0[j] - c[j];   /* w0 + delta */
        CHECK_CLOSE(c, a, n, 1e-5, "sign flipping negates the update");
        fed_once(&part, 1, NULL, -1, 0, 0.5f, c, n);           /* FedProx pulls towards w0: a different model */
        CHECK(dt_t_relerr(c, a, n) > 1e-4);
        dt_model_destroy(m0);
        free(w0); free(c);
    }
    free(a); free(b);
    dt_loader_destroy(l);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_partition_free(&part);
}

/* Label flipping 1 -> 3 changes nothing on data without label 1, and changes the model on data with it. */
static void test_label_flip(void) {
    dt_partition part;
    int64_t n, i, cnt = 0, *ids = (int64_t *)malloc(sizeof(int64_t) * NS);
    int lf = DT_FED_LABELFLIP;
    float *a, *b;
    dt_model *m = NULL;
    CHECK_OK(make_model(&m));
    n = dt_model_param_count(m);
    dt_model_destroy(m);
    a = (float *)malloc(sizeof(float) * (size_t)n);
    b = (float *)malloc(sizeof(float) * (size_t)n);
    for (i = 0; i < NS; i++) if (LAB[i] != 1) ids[cnt++] = i;
    {   /* one client holding only the samples whose label is not 1 */
        int64_t off[2];
        off[0] = 0; off[1] = cnt;
        part.parts = 1; part.offsets = off; part.indices = ids;
        fed_once(&part, 1, NULL, -1, 0, 0.0f, a, n);
        fed_once(&part, 1, &lf, 1, 3, 0.0f, b, n);
        CHECK(memcmp(a, b, sizeof(float) * (size_t)n) == 0);
        fed_once(&part, 1, &lf, 2, 3, 0.0f, b, n);             /* flipping a label it has */
        CHECK(memcmp(a, b, sizeof(float) * (size_t)n) != 0);
    }
    {   /* a label flipper without a map is refused (it would train honestly) */
        dt_partition p1;
        dt_comm *c = NULL;
        dt_fed *f = NULL;
        dt_fed_desc fd;
        CHECK_OK(iid(&p1, NS, 1, 9));
        fd = fed_desc(&p1, 1);
        fd.behaviour = &lf;
        CHECK_OK(dt_comm_create_self(&c, NULL));
        CHECK_OK(make_model(&m));
        CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
        CHECK(f == NULL && strstr(dt_last_error(), "client 0 flips labels") != NULL);
        dt_model_destroy(m);
        dt_comm_destroy(c);
        dt_partition_free(&p1);
    }
    free(ids); free(a); free(b);
}

/* The noise attack's std and Krum's f take 0 as 0 and DT_DEFAULT as the default (1); other negative values,
   and a std that is not finite, are refused at create. So does the clients' learning rate: a round at rate 0
   (optim.lr 0 with SGD and momentum, with Adam; a cosine schedule from 0) leaves the global model as it was,
   optim.lr DT_DEFAULT is the optimizer's default (SGD's 0.01), and a negative rate is refused. */
static void test_zero_is_zero(void) {
    dt_partition part;
    dt_comm *c = NULL;
    dt_model *m = NULL;
    dt_fed *f = NULL;
    dt_fed_desc fd;
    int noise = DT_FED_NOISE, k;
    int64_t n;
    float *w0, *a, *b;
    CHECK_OK(iid(&part, NS, 3, 9));
    CHECK_OK(make_model(&m));
    n = dt_model_param_count(m);
    w0 = (float *)malloc(sizeof(float) * (size_t)n); a = (float *)malloc(sizeof(float) * (size_t)n);
    b = (float *)malloc(sizeof(float) * (size_t)n);
    CHECK_OK(dt_model_get_params(m, w0, n));
    fd = fed_desc(&part, 1);
    part.parts = 1;                            /* one client: the global model moves by its update alone */
    fd.behaviour = &noise;
    fd.noise_std = 0.0f;                       /* a noise attacker that sends zeros: the model stays */
    fed_round_once(&fd, a, n);
    CHECK(memcmp(a, w0, sizeof(float) * (size_t)n) == 0);
    fd.noise_std = DT_DEFAULT;                 /* the default, 1: as asking for 1 */
    fed_round_once(&fd, a, n);
    fd.noise_std = 1.0f;
    fed_round_once(&fd, b, n);
    CHECK(memcmp(a, b, sizeof(float) * (size_t)n) == 0 && memcmp(a, w0, sizeof(float) * (size_t)n) != 0);
    part.parts = 3;
    CHECK_OK(dt_comm_create_self(&c, NULL));
    fd = fed_desc(&part, 3);
    fd.noise_std = -2.0f;
    CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "noise_std is -2") != NULL && strstr(dt_last_error(), "DT_DEFAULT") != NULL);
    fd.noise_std = NAN;
    CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
    fd.noise_std = 0.0f;
    fd.agg.kind = DT_FED_KRUM;                      /* f = 0: Krum takes 3 clients */
    CHECK_OK(dt_fed_create(&f, c, m, &fd));
    dt_fed_destroy(f);
    fd.agg.f = DT_DEFAULT;                /* f = 1 needs 5 */
    CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "at least 5 clients") != NULL);
    fd.agg.f = -4;
    CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "agg.f is -4") != NULL);
    for (k = 0; k < 3; k++) {
        fd = fed_desc(&part, 3);
        fd.optim.lr = 0.0f;
        if (k == 0) fd.optim.momentum = 0.9f;
        if (k == 1) fd.optim.kind = DT_OPTIM_ADAM;
        if (k == 2) { fd.optim.lr = 0.1f; fd.sched.kind = DT_SCHED_COSINE; fd.sched.t_max = 4; }   /* base_lr 0 */
        fed_round_once(&fd, a, n);
        CHECK(memcmp(a, w0, sizeof(float) * (size_t)n) == 0);
    }
    fd = fed_desc(&part, 3);
    fd.optim.lr = DT_DEFAULT;
    fed_round_once(&fd, a, n);
    fd.optim.lr = 0.01f;
    fed_round_once(&fd, b, n);
    CHECK(memcmp(a, b, sizeof(float) * (size_t)n) == 0 && memcmp(a, w0, sizeof(float) * (size_t)n) != 0);
    fd.optim.lr = -3.0f;
    CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "optim.lr -3") != NULL && strstr(dt_last_error(), "DT_DEFAULT") != NULL);
    fd.optim.lr = 0.1f; fd.sched.kind = DT_SCHED_COSINE; fd.sched.base_lr = -1.0f;
    CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "sched.base_lr -1") != NULL);
    CHECK(f == NULL);
    dt_comm_destroy(c);
    dt_model_destroy(m);
    dt_partition_free(&part);
    free(w0); free(a); free(b);
}

typedef struct run_arg { int clients; float frac, dropout; int rounds; int dropped, kept, selected; } run_arg;

static dt_result run_rank(dt_comm *c, void *arg) {
    run_arg *ra = (run_arg *)arg;
    dt_model *m = NULL;
    dt_fed *f = NULL;
    dt_partition part;
    dt_fed_desc fd;
    dt_fed_round_info info;
    dt_result r;
    int64_t t;
    memset(&part, 0, sizeof part);
    if ((r = make_model(&m)) != DT_OK || (r = iid(&part, NS, ra->clients, 1)) != DT_OK) goto done;
    memset(&fd, 0, sizeof fd);
    fd.clients = ra->clients; fd.frac = ra->frac; fd.dropout_prob = ra->dropout; fd.batch = 4; fd.optim.lr = 0.05f;
    fd.data = &DS; fd.part = &part; fd.seed = 2;
    if ((r = dt_fed_create(&f, c, m, &fd)) != DT_OK) goto done;
    for (t = 0; t < ra->rounds && r == DT_OK; t++) {
        r = dt_fed_round(f, t, &info);
        if (r == DT_OK && dt_comm_rank(c) == 0) {
            int *kept = (int *)malloc(sizeof(int) * (size_t)ra->clients), *sel = (int *)malloc(sizeof(int) * (size_t)ra->clients),
                *drop = (int *)malloc(sizeof(int) * (size_t)ra->clients), i, ns, bad = 0;
            dt_fed_last_kept(f, kept);
            ns = dt_fed_draw(f, t, sel, drop);
            for (i = 0; i < ns; i++) bad += kept[sel[i]] == drop[i];   /* dropped ones are out, the others in */
            if (bad) r = dt_set_error(DT_ERR_STATE, "round %lld: %d clients kept or left out wrongly", (long long)t, bad);
            ra->dropped += info.dropped; ra->kept += info.kept; ra->selected += info.selected;
            free(kept); free(sel); free(drop);
        }
    }
done:
    dt_fed_destroy(f);
    dt_model_destroy(m);
    dt_partition_free(&part);
    return r;
}

static dt_result launch(int ranks, run_arg *ra) {
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.ranks = ranks; ld.threads_per_rank = 1; ld.comm.timeout = 20.0;
    return dt_launch_local(&ld, run_rank, ra, NULL);
}

/* BatchNorm statistics are aggregated with the parameters: FedAvg of a batchnorm model on 1 and on 3 local
   ranks (5 clients, 2 rounds) ends with the same global parameters and buffers, bit for bit, and so with the
   same evaluation, for the mean and for two robust aggregators (the median, multi-Krum); and the buffers
   moved from their initial values. Before, rank 0 of 3 (which trains no client) kept its initial statistics. */
#define BN_MAX 256
typedef struct bn_arg { dt_fed_agg agg; int drop; int64_t n, nb; float params[BN_MAX], bufs[BN_MAX]; double acc, loss; } bn_arg;

static dt_result bn_rank(dt_comm *c, void *arg) {
    bn_arg *ba = (bn_arg *)arg;
    dt_model *m = NULL;
    dt_fed *f = NULL;
    dt_partition part;
    dt_fed_desc fd;
    dt_eval_desc ed;
    dt_eval_result ev;
    dt_result r;
    int64_t t;
    memset(&part, 0, sizeof part);
    memset(&ed, 0, sizeof ed);
    ed.dataset = &DS; ed.batch = 64;
    if ((r = make_model_bn(&m, ba->drop ? 2 : 1)) != DT_OK || (r = iid(&part, NS, 5, 1)) != DT_OK) goto done;
    fd = fed_desc(&part, 5);
    fd.batch = 8;                              /* 40 samples a client: no batch of 1, which batch norm refuses */
    fd.agg.kind = ba->agg; fd.agg.f = DT_DEFAULT;
    if ((r = dt_fed_create(&f, c, m, &fd)) != DT_OK) goto done;
    for (t = 0; t < 2 && r == DT_OK; t++) r = dt_fed_round(f, t, NULL);
    if (r == DT_OK && dt_comm_rank(c) == 0) {
        ba->n = dt_model_param_count(m);
        dt_model_buffers(m, &ba->nb);
        if (ba->n > BN_MAX || ba->nb > BN_MAX) { r = dt_set_error(DT_ERR_STATE, "raise BN_MAX"); goto done; }
        if ((r = dt_model_get_params(m, ba->params, ba->n)) != DT_OK || (r = dt_model_get_buffers(m, ba->bufs, ba->nb)) != DT_OK ||
            (r = dt_evaluate(m, &ed, &ev)) != DT_OK) goto done;
        ba->acc = ev.top1; ba->loss = ev.loss;
    }
done:
    dt_fed_destroy(f);
    dt_model_destroy(m);
    dt_partition_free(&part);
    return r;
}

static void test_batchnorm_ranks(void) {
    static const dt_fed_agg aggs[] = {DT_FED_MEAN, DT_FED_MEDIAN, DT_FED_MULTIKRUM};
    static bn_arg one, three;
    dt_launch_desc ld;
    float init[BN_MAX];
    dt_model *m = NULL;
    int a;
    int64_t nb = 0;
    CHECK_OK(make_model_bn(&m, 1));
    if (!m) return;
    dt_model_buffers(m, &nb);
    CHECK(nb > 0 && nb <= BN_MAX);
    CHECK_OK(dt_model_get_buffers(m, init, nb));
    dt_model_destroy(m);
    memset(&ld, 0, sizeof ld);
    ld.threads_per_rank = 1; ld.comm.timeout = 20.0;
    for (a = 0; a < 3; a++) {
        memset(&one, 0, sizeof one); memset(&three, 0, sizeof three);
        one.agg = three.agg = aggs[a];
        ld.ranks = 1;
        CHECK_OK(dt_launch_local(&ld, bn_rank, &one, NULL));
        ld.ranks = 3;
        CHECK_OK(dt_launch_local(&ld, bn_rank, &three, NULL));
        CHECK(one.nb == nb && three.nb == nb && one.n == three.n);
        CHECK(memcmp(one.params, three.params, sizeof(float) * (size_t)one.n) == 0);
        CHECK(memcmp(one.bufs, three.bufs, sizeof(float) * (size_t)nb) == 0);
        CHECK(memcmp(one.bufs, init, sizeof(float) * (size_t)nb) != 0);
        CHECK(one.acc == three.acc && one.loss == three.loss);
        if (memcmp(one.bufs, three.bufs, sizeof(float) * (size_t)nb) != 0 || one.acc != three.acc)
            printf("    %s: accuracy %.4f on 1 rank, %.4f on 3\n", dt_fed_agg_name(aggs[a]), one.acc, three.acc);
    }
}

/* A dropout layer's masks follow the client and the round, not the rank that trains the client: FedAvg of a
   model with dropout ends with the same global model on 1 and 3 ranks, bit for bit. Before, they followed each
   rank's count of forward passes, so the clients a rank trained before changed them. */
static void test_dropout_layer_ranks(void) {
    static bn_arg one, three;
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.threads_per_rank = 1; ld.comm.timeout = 20.0;
    memset(&one, 0, sizeof one); memset(&three, 0, sizeof three);
    one.agg = three.agg = DT_FED_MEAN; one.drop = three.drop = 1;
    ld.ranks = 1;
    CHECK_OK(dt_launch_local(&ld, bn_rank, &one, NULL));
    ld.ranks = 3;
    CHECK_OK(dt_launch_local(&ld, bn_rank, &three, NULL));
    CHECK(one.n > 0 && one.n == three.n && one.nb == three.nb);
    CHECK(memcmp(one.params, three.params, sizeof(float) * (size_t)one.n) == 0);
    CHECK(memcmp(one.bufs, three.bufs, sizeof(float) * (size_t)one.nb) == 0);
    CHECK(one.acc == three.acc && one.loss == three.loss);
}

static void test_dropout(void) {
    run_arg ra;
    memset(&ra, 0, sizeof ra);
    ra.clients = 10; ra.frac = 0.5f; ra.dropout = 0.4f; ra.rounds = 4;
    CHECK_OK(launch(3, &ra));
    CHECK(ra.selected == 20 && ra.dropped > 0 && ra.kept == ra.selected - ra.dropped);
}

static void test_hundred_clients(void) {
    run_arg ra;
    memset(&ra, 0, sizeof ra);
    ra.clients = 100; ra.frac = 1.0f; ra.rounds = 2;
    CHECK_OK(launch(4, &ra));
    CHECK(ra.selected == 200 && ra.kept == 200);
    memset(&ra, 0, sizeof ra);
    ra.clients = 100; ra.frac = 0.1f; ra.rounds = 3;
    CHECK_OK(launch(1, &ra));                                  /* one rank: everything on rank 0 */
    CHECK(ra.selected == 30 && ra.kept == 30);
}

/* Resuming on another number of ranks: FedAvg's state is rank 0's, so a checkpoint saved by 3 local ranks after
   round 2 (a batchnorm model, 5 clients, the Adam server optimizer, whose m and v rank 0 keeps) resumes on 1, 2
   and 4 ranks and ends, after round 4, with the global parameters and statistics of the run never stopped, bit
   for bit (the model has no dropout, whose masks follow each rank's own counter). */
typedef struct el_arg { int from, to; const char *save, *load; int64_t n, nb; float params[BN_MAX], bufs[BN_MAX]; } el_arg;
static dt_result el_rank(dt_comm *c, void *arg) {
    el_arg *ea = (el_arg *)arg;
    dt_model *m = NULL;
    dt_fed *f = NULL;
    dt_partition part;
    dt_fed_desc fd;
    dt_checkpoint_meta meta;
    dt_result r;
    int64_t t;
    memset(&part, 0, sizeof part);
    memset(&meta, 0, sizeof meta);
    if ((r = make_model_bn(&m, 1)) != DT_OK || (r = iid(&part, NS, 5, 1)) != DT_OK) goto done;
    fd = fed_desc(&part, 5);
    fd.batch = 8;
    fd.server.kind = DT_FED_SERVER_ADAM;
    if ((r = dt_fed_create(&f, c, m, &fd)) != DT_OK) goto done;
    if (ea->load && (r = dt_fed_load(f, ea->load, &meta)) != DT_OK) goto done;
    if (ea->load && meta.round != ea->from) { r = dt_set_error(DT_ERR_STATE, "loaded round %lld", (long long)meta.round); goto done; }
    for (t = ea->from; t < ea->to && r == DT_OK; t++) r = dt_fed_round(f, t, NULL);
    meta.round = ea->to;
    if (r == DT_OK && ea->save) r = dt_fed_save(f, ea->save, &meta);
    if (r == DT_OK && dt_comm_rank(c) == 0) {
        ea->n = dt_model_param_count(m);
        dt_model_buffers(m, &ea->nb);
        if (ea->n > BN_MAX || ea->nb > BN_MAX) { r = dt_set_error(DT_ERR_STATE, "raise BN_MAX"); goto done; }
        if ((r = dt_model_get_params(m, ea->params, ea->n)) == DT_OK) r = dt_model_get_buffers(m, ea->bufs, ea->nb);
    }
done:
    dt_fed_destroy(f);
    dt_model_destroy(m);
    dt_partition_free(&part);
    return r;
}
static dt_result el_launch(int ranks, el_arg *ea) {
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.ranks = ranks; ld.threads_per_rank = 1; ld.comm.timeout = 20.0;
    return dt_launch_local(&ld, el_rank, ea, NULL);
}
static void test_resume_other_world(void) {
    static el_arg full, first, rest;
    static const int worlds[3] = {1, 2, 4};
    const char *path = "build/test_fedavg_elastic.ckpt";
    int w;
    memset(&full, 0, sizeof full);
    full.to = 4;
    CHECK_OK(el_launch(3, &full));
    first = full;
    first.to = 2; first.save = path;
    remove(path);
    CHECK_OK(el_launch(3, &first));
    CHECK(memcmp(first.params, full.params, sizeof(float) * (size_t)full.n) != 0);   /* half-way is elsewhere */
    for (w = 0; w < 3; w++) {
        rest = full;
        rest.from = 2; rest.load = path;
        memset(rest.params, 0, sizeof rest.params);
        CHECK_OK(el_launch(worlds[w], &rest));
        CHECK(full.n > 0 && memcmp(rest.params, full.params, sizeof(float) * (size_t)full.n) == 0);
        CHECK(full.nb > 0 && memcmp(rest.bufs, full.bufs, sizeof(float) * (size_t)full.nb) == 0);
    }
    remove(path);
}

/* A FedAvg of 3 clients on one rank with server optimizer `server` (kind, its other settings the defaults):
   created, then rounds [from, to) run; params [n] gets the global model. With start, the global model starts
   from it; with save (and to > from), the state is saved after the last round, with load loaded first. */
static dt_result server_rounds(const dt_partition *part, dt_fed_server_desc server, const float *start, int from, int to, float *params,
                               int64_t n, const char *save, const char *load) {
    dt_comm *c = NULL;
    dt_model *m = NULL;
    dt_fed *f = NULL;
    dt_fed_desc fd = fed_desc(part, 3);
    dt_checkpoint_meta meta;
    dt_result r;
    int t;
    fd.server = server;
    memset(&meta, 0, sizeof meta);
    if ((r = dt_comm_create_self(&c, NULL)) != DT_OK || (r = make_model(&m)) != DT_OK) goto done;
    if (start && (r = dt_model_set_params(m, start, n)) != DT_OK) goto done;
    if ((r = dt_fed_create(&f, c, m, &fd)) != DT_OK) goto done;
    if (load && (r = dt_fed_load(f, load, &meta)) != DT_OK) goto done;
    for (t = from; t < to && r == DT_OK; t++) r = dt_fed_round(f, t, NULL);
    meta.round = to;
    if (r == DT_OK && save) r = dt_fed_save(f, save, &meta);
    if (r == DT_OK) r = dt_model_get_params(m, params, n);
done:
    dt_fed_destroy(f);
    dt_model_destroy(m);
    dt_comm_destroy(c);
    return r;
}

/* The server optimizers against a hand computation from FedAvg's own aggregate: Delta_t is the step a plain
   FedAvg round takes from the same global model (the same clients, data and seed), and m, v follow Reddi et
   al.'s Algorithm 2 for two rounds; AVG with lr 0.5 takes half of Delta. Adam stopped after round 1, saved and
   loaded into a fresh run, ends as the unstopped one, bit for bit; a checkpoint of another server optimizer,
   and bad settings, are refused. */
static void test_server_optimizers(void) {
    static const dt_fed_server kinds[] = {DT_FED_SERVER_AVGM, DT_FED_SERVER_ADAGRAD, DT_FED_SERVER_ADAM, DT_FED_SERVER_YOGI};
    dt_partition part;
    dt_model *m0 = NULL;
    dt_fed_server_desc sd;
    int64_t n, j;
    size_t i;
    float *x0, *x1, *x2, *y, *want, *mv;
    char dir[512], path[600];
    if (dt_t_mkdtemp(dir, sizeof dir, "dt_fed_test") != 0) { CHECK(0); return; }
    snprintf(path, sizeof path, "%s/fed.ckpt", dir);
    CHECK_OK(iid(&part, NS, 3, 4));
    CHECK_OK(make_model(&m0));
    n = dt_model_param_count(m0);
    x0 = (float *)malloc(sizeof(float) * (size_t)n * 7);
    x1 = x0 + n; x2 = x1 + n; y = x2 + n; want = y + n; mv = want + n;   /* mv: m [n], v [n] */
    CHECK_OK(dt_model_get_params(m0, x0, n));
    dt_model_destroy(m0);
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.5f;   /* AVG: x0 + 0.5 Delta */
    CHECK_OK(server_rounds(&part, sd, NULL, 0, 1, x1, n, NULL, NULL));
    memset(&sd, 0, sizeof sd);
    CHECK_OK(server_rounds(&part, sd, NULL, 0, 1, y, n, NULL, NULL));
    for (j = 0; j < n; j++) want[j] = x0[j] + 0.5f * (y[j] - x0[j]);
    CHECK_CLOSE(x1, want, n, 1e-6, "AVG with lr 0.5: half of FedAvg's step");
    for (i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        dt_fed_server k = kinds[i];
        float lr = k == DT_FED_SERVER_AVGM ? 1.0f : 0.01f, b1 = 0.9f, b2 = 0.99f, tau = 1e-3f;
        int t;
        memset(&sd, 0, sizeof sd);
        sd.kind = k;
        CHECK_OK(server_rounds(&part, sd, NULL, 0, 1, x1, n, NULL, NULL));
        CHECK_OK(server_rounds(&part, sd, NULL, 0, 2, x2, n, NULL, NULL));
        memset(mv, 0, sizeof(float) * 2 * (size_t)n);
        for (t = 0; t < 2; t++) {   /* the hand computation, from each round's start (x0, then the optimizer's x1) */
            const float *from = t == 0 ? x0 : x1;
            memset(&sd, 0, sizeof sd);
            CHECK_OK(server_rounds(&part, sd, from, t, t + 1, y, n, NULL, NULL));   /* FedAvg's round: from + Delta */
            for (j = 0; j < n; j++) {
                float g = y[j] - from[j], *mj = mv + j, *vj = mv + n + j;
                if (k == DT_FED_SERVER_AVGM) { *mj = b1 * *mj + g; want[j] = from[j] + lr * *mj; continue; }
                *mj = b1 * *mj + (1.0f - b1) * g;
                if (k == DT_FED_SERVER_ADAGRAD) *vj += g * g;
                else if (k == DT_FED_SERVER_ADAM) *vj = b2 * *vj + (1.0f - b2) * g * g;
                else *vj -= (1.0f - b2) * g * g * (*vj > g * g ? 1.0f : *vj < g * g ? -1.0f : 0.0f);
                want[j] = from[j] + lr * *mj / (sqrtf(*vj) + tau);
            }
            CHECK_CLOSE(t == 0 ? x1 : x2, want, n, 1e-5, dt_fed_server_name(k));
        }
        CHECK(dt_t_relerr(x2, x1, n) > 1e-4);   /* the second round moved the model */
    }
    /* resume: Adam for 3 rounds, against 1 round, a checkpoint, and 2 rounds of a fresh run that loads it */
    memset(&sd, 0, sizeof sd);
    sd.kind = DT_FED_SERVER_ADAM;
    CHECK_OK(server_rounds(&part, sd, NULL, 0, 3, x1, n, NULL, NULL));
    CHECK_OK(server_rounds(&part, sd, NULL, 0, 1, x2, n, path, NULL));
    CHECK_OK(server_rounds(&part, sd, NULL, 1, 3, x2, n, NULL, path));
    CHECK(memcmp(x1, x2, sizeof(float) * (size_t)n) == 0);
    sd.kind = DT_FED_SERVER_YOGI;
    CHECK_ERR(server_rounds(&part, sd, NULL, 1, 3, x2, n, NULL, path), DT_ERR_MISMATCH);
    CHECK(strstr(dt_last_error(), "written with the server optimizer adam; this run has yogi") != NULL);
    sd.kind = DT_FED_SERVER_AVG;   /* no state to load: the checkpoint's floats are refused */
    CHECK(server_rounds(&part, sd, NULL, 1, 3, x2, n, NULL, path) != DT_OK);
    remove(path);
    dt_t_rmdir(dir);
    sd.kind = DT_FED_SERVER_ADAM; sd.beta2 = 1.0f;
    CHECK_ERR(server_rounds(&part, sd, NULL, 0, 1, x2, n, NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "the server optimizer adam with lr 0.01, momentum 0.9, beta2 1") != NULL);
    sd.beta2 = 0.0f; sd.kind = (dt_fed_server)9;
    CHECK_ERR(server_rounds(&part, sd, NULL, 0, 1, x2, n, NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK(dt_fed_server_parse("fedadam", NULL) == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "adagrad, adam or yogi") != NULL);
    free(x0);
    dt_partition_free(&part);
}

/* DP-FedAvg: the accountant against published values (Opacus's test: q 0.04, noise 1.5, 2250 steps, delta 1e-5:
   epsilon 7.32911117143; dp_accounting's example: 10 steps at q 1e-5, noise 1 and 4 at q 1e-4, noise 3, orders
   2..32: epsilon 0.336 at order 23); a round with noise 0 moves the global model by the plain round's step
   clipped to the norm, and noise z adds a Gaussian of std z clip / m; DP with another aggregator, or noise
   without a clip, is refused. */
static void test_dp(void) {
    dt_partition part;
    dt_model *m0 = NULL;
    dt_fed_desc fd;
    double order = 0.0, best = INFINITY, at = 0.0, dot = 0.0, na = 0.0, nb = 0.0, sd = 0.0;
    int a;
    int64_t n, j;
    float *x0, *plain, *dp, *noisy;
    CHECK(fabs(dt_dp_epsilon(0.04, 1.5, 2250, 1e-5, &order) - 7.32911117143) < 1e-6);
    for (a = 2; a <= 32; a++) {
        double e = 10.0 * dt_dp_rdp(1e-5, 1.0, a) + 4.0 * dt_dp_rdp(1e-4, 3.0, a) - (log(1e-5) + log((double)a)) / (a - 1.0) +
                   log((a - 1.0) / a);
        if (e < best) { best = e; at = a; }
    }
    CHECK(fabs(best - 0.33634406339) < 1e-6 && at == 23.0);
    CHECK(fabs(dt_dp_rdp(1.0, 2.0, 5.0) - 5.0 / 8.0) < 1e-12 && dt_dp_rdp(0.0, 1.0, 5.0) == 0.0 && dt_dp_rdp(0.1, 0.0, 2.0) == INFINITY);
    CHECK(dt_dp_epsilon(0.01, 4.0, 1000, 1e-5, NULL) < dt_dp_epsilon(0.01, 4.0, 2000, 1e-5, NULL));   /* more rounds, more spent */
    CHECK_OK(iid(&part, NS, 1, 9));
    CHECK_OK(make_model(&m0));
    n = dt_model_param_count(m0);
    x0 = (float *)malloc(sizeof(float) * (size_t)n * 4);
    plain = x0 + n; dp = plain + n; noisy = dp + n;
    CHECK_OK(dt_model_get_params(m0, x0, n));
    dt_model_destroy(m0);
    fd = fed_desc(&part, 1);
    fed_round_once(&fd, plain, n);
    fd.dp.clip = 1e-3f;
    fed_round_once(&fd, dp, n);
    fd.dp.noise_multiplier = 1.0f;
    fed_round_once(&fd, noisy, n);
    for (j = 0; j < n; j++) {
        double u = plain[j] - x0[j], v = dp[j] - x0[j], w = (double)noisy[j] - dp[j];
        dot += u * v; na += u * u; nb += v * v; sd += w * w;
    }
    CHECK(fabs(sqrt(nb) - 1e-3) < 1e-5);                   /* the step, clipped to the norm (1 client: m = 1) */
    CHECK(dot / sqrt(na * nb) > 0.9999 && sqrt(na) > 1e-2);  /* in the plain step's direction, which was longer */
    CHECK(fabs(sqrt(sd / (double)n) - 1e-3) < 2e-4);        /* the noise: std z clip / m = 1e-3 */
    {
        dt_comm *c = NULL;
        dt_model *m = NULL;
        dt_fed *f = NULL;
        CHECK_OK(dt_comm_create_self(&c, NULL));
        CHECK_OK(make_model(&m));
        fd.agg.kind = DT_FED_MEDIAN;
        CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
        CHECK(strstr(dt_last_error(), "the mean of the clipped updates only") != NULL);
        fd.agg.kind = DT_FED_MEAN; fd.dp.clip = 0.0f;
        CHECK_ERR(dt_fed_create(&f, c, m, &fd), DT_ERR_INVALID_ARG);
        dt_model_destroy(m);
        dt_comm_destroy(c);
    }
    free(x0);
    dt_partition_free(&part);
}

int main(int argc, char **argv) {
    if (argc > 1) dt_t_only = argv[1];
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    make_data();
    RUN(test_aggregators);
    RUN(test_classmean);
    RUN(test_refusals);
    RUN(test_one_client_equals_plain);
    RUN(test_label_flip);
    RUN(test_zero_is_zero);
    RUN(test_batchnorm_ranks);
    RUN(test_dropout_layer_ranks);
    RUN(test_dropout);
    RUN(test_hundred_clients);
    RUN(test_server_optimizers);
    RUN(test_resume_other_world);
    RUN(test_dp);
    return dt_t_summary();
}
