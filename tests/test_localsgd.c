/* test_localsgd.c - local SGD and Hogwild: local SGD with period 1 equals N replicas (each with its own
   optimizer and data) averaged after every step, computed here on one thread; with period 3 the replicas
   differ between averages and are equal right after; the initial broadcast; period 0 with explicit
   averages and BatchNorm buffers; Hogwild with one worker is plain SGD exactly, with several workers on a
   linear regression it converges; bad arguments. Hogwild races by design, so this test is not among
   tests/run.sh's ThreadSanitizer runs. */
#include "../dtrain.h"
#include "dt_test.h"
#include "train_checks.h"

#define IN 12        /* features */
#define K 4          /* classes */
#define B 12         /* global batch per step: divisible by 2, 3 and 4 */
#define STEPS 6
#define MAXR 4
#define NSAMP (B * STEPS)
#define MAXP 1024    /* parameters of the test model, at most */

static float X[NSAMP * IN];
static int32_t Y[NSAMP];

static void make_data(void) { tc_data(X, Y, NSAMP, IN, K); }

/* A small MLP (no dropout), optionally with batchnorm; the seed differs per rank to test the broadcast. */
static dt_result make_model(dt_model **m, uint64_t seed, int bn, int hidden) { return tc_mlp(m, IN, K, seed, bn, hidden, 0); }

static dt_result make_optim(dt_optim **o, dt_model *m, float momentum) {
    dt_optim_desc od;
    memset(&od, 0, sizeof od);
    od.lr = 0.1f; od.momentum = momentum;
    return dt_optim_create(o, m, &od);
}

/* One SGD step of m on samples [first, first + n). */
static dt_result sgd_step(dt_model *m, dt_optim *o, int64_t first, int64_t n) {
    float loss;
    dt_result r;
    if ((r = dt_model_forward(m, X + first * IN, n)) != DT_OK) return r;
    if ((r = dt_model_loss_labels(m, Y + first, &loss)) != DT_OK) return r;
    dt_model_zero_grad(m);
    if ((r = dt_model_backward(m, NULL)) != DT_OK) return r;
    return dt_optim_step(o);
}

/* The reference on this thread: p replicas of the seed-1 model, each with its optimizer (momentum 0.9)
   and its share of every step's batch, parameters averaged after every period-th step. */
static void reference(float *out, int64_t n, int p, int period) {
    dt_model *m[MAXR] = {NULL};
    dt_optim *o[MAXR] = {NULL};
    static float sum[MAXP];
    int s, r;
    int64_t i, share = B / p;
    for (r = 0; r < p; r++) {
        CHECK_OK(make_model(&m[r], 1, 0, 16));
        CHECK_OK(make_optim(&o[r], m[r], 0.9f));
    }
    for (s = 0; s < STEPS; s++) {
        for (r = 0; r < p; r++) CHECK_OK(sgd_step(m[r], o[r], (int64_t)s * B + r * share, share));
        if ((s + 1) % period) continue;
        memset(sum, 0, sizeof sum);
        for (r = 0; r < p; r++) {
            const float *w = dt_model_params(m[r], NULL);
            for (i = 0; i < n; i++) sum[i] += w[i];
        }
        for (r = 0; r < p; r++) {
            float *w = dt_model_params(m[r], NULL);
            for (i = 0; i < n; i++) w[i] = sum[i] / (float)p;
        }
    }
    CHECK_OK(dt_model_get_params(m[0], out, n));
    for (r = 0; r < p; r++) { dt_optim_destroy(o[r]); dt_model_destroy(m[r]); }
}

typedef struct job {
    dt_localsgd_desc desc;
    int bn, explicit_average;        /* batchnorm model; dt_localsgd_average after the last step */
    int64_t nparams, nbuf;
    float first[MAXR][MAXP];         /* right after dt_localsgd_create */
    float after[STEPS][MAXR][MAXP];  /* after each step's dt_localsgd_step */
    float params[MAXR][MAXP];        /* at the end */
    float bufs[MAXR][64];            /* buffers at the end */
    dt_localsgd_stats stats[MAXR];
} job;

static dt_result localsgd_rank(dt_comm *c, void *arg) {
    job *j = (job *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c), s;
    int64_t share = B / p;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_localsgd *d = NULL;
    dt_result r;
#define T(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)
    T(make_model(&m, 1 + (uint64_t)me * 77, j->bn, 16));
    T(make_optim(&o, m, 0.9f));
    T(dt_localsgd_create(&d, c, m, &j->desc));
    T(dt_model_get_params(m, j->first[me], j->nparams));
    for (s = 0; s < STEPS; s++) {
        T(sgd_step(m, o, (int64_t)s * B + me * share, share));
        T(dt_localsgd_step(d));
        T(dt_model_get_params(m, j->after[s][me], j->nparams));
    }
    if (j->explicit_average) T(dt_localsgd_average(d));
    T(dt_model_get_params(m, j->params[me], j->nparams));
    if (j->nbuf) T(dt_model_get_buffers(m, j->bufs[me], j->nbuf));
    j->stats[me] = dt_localsgd_get_stats(d);
done:
#undef T
    dt_localsgd_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}


static int64_t model_params(int bn, int64_t *nbuf) {
    dt_model *m = NULL;
    int64_t n = 0;
    CHECK_OK(make_model(&m, 1, bn, 16));
    n = dt_model_param_count(m);
    if (nbuf) dt_model_buffers(m, nbuf);
    dt_model_destroy(m);
    return n;
}

static int same(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* period 1 on 2, 3 and 4 ranks, every all-reduce algorithm: the reference averaged after each step */
static void test_period1(void) {
    static job j;
    static float ref[MAXP];
    int64_t n = model_params(0, NULL);
    int p, a, r;
    char what[96];
    for (p = 2; p <= MAXR; p++) {
        reference(ref, n, p, 1);
        for (a = 0; a < DT_ALGO_COUNT; a++) {
            memset(&j, 0, sizeof j);
            j.nparams = n;
            j.desc.period = 1;
            j.desc.algo = (dt_algo)a;
            CHECK_OK(tc_launch(localsgd_rank, &j, p));
            for (r = 0; r < p; r++) {
                snprintf(what, sizeof what, "period 1, %d ranks, algo %s: rank %d", p, dt_algo_name(j.desc.algo), r);
                CHECK_CLOSE(j.params[r], ref, n, 1e-5, what);
                CHECK(j.stats[r].steps == STEPS && j.stats[r].averages == STEPS);
            }
        }
    }
}

/* period 3: replicas part after steps 1, 2 (4, 5) and meet after steps 3 and 6, at the reference */
static void test_period3(void) {
    static job j;
    static float ref[MAXP];
    int64_t n = model_params(0, NULL);
    int s, r, p = 3;
    memset(&j, 0, sizeof j);
    j.nparams = n;
    j.desc.period = 3;
    CHECK_OK(tc_launch(localsgd_rank, &j, p));
    for (s = 0; s < STEPS; s++)
        for (r = 1; r < p; r++) {
            if ((s + 1) % 3) CHECK(!same(j.after[s][r], j.after[s][0], n));
            else CHECK(same(j.after[s][r], j.after[s][0], n));
        }
    reference(ref, n, p, 3);
    CHECK_CLOSE(j.params[0], ref, n, 1e-5, "period 3, 3 ranks");
    CHECK(j.stats[0].averages == 2 && j.stats[1].steps == STEPS);
}

/* dt_localsgd_create broadcasts rank 0's parameters: ranks built with different seeds start equal */
static void test_broadcast(void) {
    static job j;
    dt_model *m = NULL;
    int r;
    memset(&j, 0, sizeof j);
    j.nparams = model_params(0, NULL);
    CHECK_OK(tc_launch(localsgd_rank, &j, 3));
    CHECK_OK(make_model(&m, 1, 0, 16));   /* rank 0's seed */
    for (r = 0; r < 3 && m; r++) CHECK(same(j.first[r], dt_model_params(m, NULL), j.nparams));
    dt_model_destroy(m);
}

/* period 0: no average until dt_localsgd_average; BatchNorm statistics averaged only with sync_buffers */
static void test_explicit_and_buffers(void) {
    static job j;
    int64_t nbuf = 0, n = model_params(1, &nbuf);
    int r, sb;
    CHECK(nbuf > 0 && nbuf <= 64);
    for (sb = 0; sb < 2; sb++) {
        memset(&j, 0, sizeof j);
        j.nparams = n; j.nbuf = nbuf; j.bn = 1; j.explicit_average = 1;
        j.desc.sync_buffers = sb;
        CHECK_OK(tc_launch(localsgd_rank, &j, 2));
        CHECK(!same(j.after[STEPS - 1][1], j.after[STEPS - 1][0], n));   /* no average during the steps */
        CHECK(same(j.params[1], j.params[0], n));                        /* but after the explicit one */
        CHECK(sb ? same(j.bufs[1], j.bufs[0], nbuf) : !same(j.bufs[1], j.bufs[0], nbuf));
        for (r = 0; r < 2; r++) CHECK(j.stats[r].averages == 1 && j.stats[r].steps == STEPS);
    }
}

/* ---- Hogwild ---- */

static int64_t nbuf(dt_model *m) { int64_t n = 0; dt_model_buffers(m, &n); return n; }

#define HOG_MAXB 64       /* buffers of the batchnorm classifier, at most */
typedef struct hog {
    int     mode;         /* 0: the classifier on X, Y; 1: linear regression on RX, RY */
    int     bn;           /* the classifier with batchnorm */
    float   published[MAXR][HOG_MAXB];   /* each worker's buffers as of its last dt_hogwild_push */
    int     epochs;
    int64_t batch;
    float   lr;
    int     fail_worker;  /* this worker returns an error at once (-1: none) */
} hog;

#define RN 512            /* regression samples */
#define RD 8              /* regression features */
static float RX[RN * RD], RY[RN];

static void make_regression(void) {
    dt_rng r;
    float w[RD];
    int i, k;
    dt_rng_init(&r, 9, 0);
    for (k = 0; k < RD; k++) w[k] = (float)dt_rng_u32(&r) / 4294967296.0f * 2.0f - 1.0f;
    for (i = 0; i < RN; i++) {
        float y = 0.5f;
        for (k = 0; k < RD; k++) {
            RX[i * RD + k] = (float)dt_rng_u32(&r) / 4294967296.0f * 2.0f - 1.0f;
            y += w[k] * RX[i * RD + k];
        }
        RY[i] = y + 0.01f * ((float)dt_rng_u32(&r) / 4294967296.0f - 0.5f);
    }
}

static dt_result make_regressor(dt_model **m, uint64_t seed) {
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    d.in_c = RD; d.seed = seed;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    dt_linear(*m, dt_model_input(*m), 1, 1);
    return dt_model_finalize(*m);
}

/* Worker w takes samples w, w + threads, ... (disjoint data) in batches; pull, forward, backward, push. */
static dt_result hog_worker(dt_hogwild_worker *w, void *arg) {
    hog *h = (hog *)arg;
    dt_model *rep = NULL;
    dt_result r;
    int64_t nsamp = h->mode ? RN : NSAMP, in = h->mode ? RD : IN, e, start, i, k;
    float xb[64 * IN], yb[64];
    int32_t lb[64];
    float loss;
    if (h->batch > 64) return dt_set_error(DT_ERR_INVALID_ARG, "batch %lld > 64", (long long)h->batch);
    if (w->index == h->fail_worker) return dt_set_error(DT_ERR_STATE, "worker %d gives up", w->index);
    if ((r = h->mode ? make_regressor(&rep, 99) : make_model(&rep, 99, h->bn, 16)) != DT_OK) return r;
    if (w->index >= MAXR || nbuf(rep) > HOG_MAXB) r = dt_set_error(DT_ERR_STATE, "raise MAXR or HOG_MAXB");
    dt_model_zero_grad(rep);
    for (e = 0; e < h->epochs && r == DT_OK; e++)
        for (start = w->index; start < nsamp && r == DT_OK; start += h->batch * w->threads) {
            int64_t n = 0;
            for (i = start; i < nsamp && n < h->batch; i += w->threads, n++) {
                for (k = 0; k < in; k++) xb[n * in + k] = h->mode ? RX[i * RD + k] : X[i * IN + k];
                if (h->mode) yb[n] = RY[i]; else lb[n] = Y[i];
            }
            if ((r = dt_hogwild_pull(w->shared, rep)) != DT_OK) break;
            if ((r = dt_model_forward(rep, xb, n)) != DT_OK) break;
            r = h->mode ? dt_model_loss_mse(rep, yb, &loss) : dt_model_loss_labels(rep, lb, &loss);
            if (r == DT_OK) r = dt_model_backward(rep, NULL);
            if (r == DT_OK) r = dt_hogwild_push(w->shared, rep, h->lr);
            if (r == DT_OK) r = dt_model_get_buffers(rep, h->published[w->index], nbuf(rep));
        }
    dt_model_destroy(rep);
    return r;
}

/* one worker: exactly dt_optim's SGD (no momentum) over the same batches, with and without batchnorm: the
   parameters and the published BatchNorm statistics */
static void test_hogwild_one_thread(void) {
    static hog h;
    dt_model *shared = NULL, *m = NULL;
    dt_optim *o = NULL;
    int64_t s, n;
    int bn;
    for (bn = 0; bn < 2; bn++) {
        memset(&h, 0, sizeof h);
        h.epochs = 2; h.batch = 8; h.lr = 0.1f; h.fail_worker = -1; h.bn = bn;
        CHECK_OK(make_model(&shared, 1, bn, 16));
        CHECK_OK(make_model(&m, 1, bn, 16));
        CHECK_OK(make_optim(&o, m, 0.0f));
        CHECK_OK(dt_hogwild_run(shared, 1, hog_worker, &h));
        for (s = 0; s < h.epochs * NSAMP && o; s += h.batch) {
            int64_t first = s % NSAMP;
            CHECK_OK(sgd_step(m, o, first, NSAMP - first < h.batch ? NSAMP - first : h.batch));
        }
        n = dt_model_param_count(m);
        CHECK(shared && m && same(dt_model_params(shared, NULL), dt_model_params(m, NULL), n));
        CHECK(shared && m && nbuf(m) == 2 * bn * 16 &&
              same(dt_model_buffers(shared, NULL), dt_model_buffers(m, NULL), nbuf(m)));
        dt_optim_destroy(o);
        dt_model_destroy(m);
        dt_model_destroy(shared);
    }
}

/* Hogwild publishes the BatchNorm statistics: after two racing workers the shared buffers have moved from
   their initial values, and each element is what one of the workers published last (the last write wins,
   element by element, as for the parameters) */
static void test_hogwild_buffers(void) {
    static hog h;
    dt_model *shared = NULL;
    float init[HOG_MAXB];
    int64_t nb, k, bad = 0;
    memset(&h, 0, sizeof h);
    h.epochs = 2; h.batch = 6; h.lr = 0.1f; h.fail_worker = -1; h.bn = 1;
    CHECK_OK(make_model(&shared, 1, 1, 16));
    if (!shared) return;
    nb = nbuf(shared);
    CHECK(nb > 0 && nb <= HOG_MAXB);
    CHECK_OK(dt_model_get_buffers(shared, init, nb));
    CHECK_OK(dt_hogwild_run(shared, 2, hog_worker, &h));
    CHECK(!same(dt_model_buffers(shared, NULL), init, nb));
    for (k = 0; k < nb; k++) {
        float v = dt_model_buffers(shared, NULL)[k];
        bad += v != h.published[0][k] && v != h.published[1][k];
    }
    CHECK(bad == 0);
    dt_model_destroy(shared);
}

static double regression_loss(dt_model *m) {
    float loss = -1.0f;
    CHECK_OK(dt_model_forward(m, RX, RN));
    CHECK_OK(dt_model_loss_mse(m, RY, &loss));
    return loss;
}

/* four workers racing on one linear regression still drive the loss near the noise floor */
static void test_hogwild_converges(void) {
    hog h;
    dt_model *shared = NULL;
    double before, after;
    memset(&h, 0, sizeof h);
    h.mode = 1; h.epochs = 30; h.batch = 4; h.lr = 0.05f; h.fail_worker = -1;
    CHECK_OK(make_regressor(&shared, 3));
    if (!shared) return;
    before = regression_loss(shared);
    CHECK_OK(dt_hogwild_run(shared, 4, hog_worker, &h));
    after = regression_loss(shared);
    if (!(after < 1e-3 && after < before / 100.0)) printf("    loss %g -> %g\n", before, after);
    CHECK(after < 1e-3 && after < before / 100.0);
    dt_model_destroy(shared);
}

/* ranks that build different models */
static dt_result mismatch_rank(dt_comm *c, void *arg) {
    dt_model *m = NULL;
    dt_localsgd *d = NULL;
    dt_result r;
    (void)arg;
    if ((r = make_model(&m, 1, 0, dt_comm_rank(c) == 1 ? 17 : 16)) == DT_OK) r = dt_localsgd_create(&d, c, m, NULL);
    dt_localsgd_destroy(d);
    dt_model_destroy(m);
    return r;
}

static void test_bad_args(void) {
    dt_comm *c = NULL;
    dt_model *m = NULL, *m2 = NULL, *raw = NULL;
    dt_localsgd *d = NULL;
    dt_localsgd_desc bad;
    dt_model_desc md;
    hog h;
    CHECK_OK(dt_comm_create_self(&c, NULL));
    CHECK_OK(make_model(&m, 1, 0, 16));
    CHECK_OK(make_model(&m2, 1, 0, 17));
    memset(&md, 0, sizeof md);
    md.in_c = IN;
    CHECK_OK(dt_model_create(&raw, &md));
    CHECK_ERR(dt_localsgd_create(NULL, c, m, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_localsgd_create(&d, NULL, m, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_localsgd_create(&d, c, NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_localsgd_create(&d, c, raw, NULL), DT_ERR_STATE);
    memset(&bad, 0, sizeof bad);
    bad.period = -1;
    CHECK_ERR(dt_localsgd_create(&d, c, m, &bad), DT_ERR_INVALID_ARG);
    bad.period = 0; bad.algo = DT_ALGO_COUNT;
    CHECK_ERR(dt_localsgd_create(&d, c, m, &bad), DT_ERR_INVALID_ARG);
    CHECK(d == NULL);
    CHECK_ERR(dt_localsgd_step(NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_localsgd_average(NULL), DT_ERR_INVALID_ARG);
    CHECK(dt_localsgd_get_stats(NULL).steps == 0);
    dt_localsgd_destroy(NULL);
    CHECK_ERR(tc_launch(mismatch_rank, NULL, 2), DT_ERR_MISMATCH);
    CHECK(strstr(dt_last_error(), "17") || strstr(dt_last_error(), "parameters"));
    /* Hogwild */
    memset(&h, 0, sizeof h);
    h.epochs = 1; h.batch = 8; h.lr = 0.1f; h.fail_worker = 2;
    CHECK_ERR(dt_hogwild_run(NULL, 2, hog_worker, &h), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_hogwild_run(raw, 2, hog_worker, &h), DT_ERR_STATE);       /* not finalized */
    CHECK_ERR(dt_hogwild_run(m, 0, hog_worker, &h), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_hogwild_run(m, 2, NULL, &h), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_hogwild_run(m, 3, hog_worker, &h), DT_ERR_STATE);   /* worker 2 fails: named */
    CHECK(strstr(dt_last_error(), "worker 2 of 3") != NULL);
    CHECK_ERR(dt_hogwild_pull(m, m2), DT_ERR_MISMATCH);
    CHECK_ERR(dt_hogwild_push(m, m2, 0.1f), DT_ERR_MISMATCH);
    CHECK_ERR(dt_hogwild_pull(m, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_hogwild_push(m, raw, 0.1f), DT_ERR_STATE);                /* the replica is not finalized */
    CHECK(strstr(dt_last_error(), "the replica is not finalized") != NULL);
    CHECK_ERR(dt_hogwild_push(m, m, -1.0f), DT_ERR_INVALID_ARG);
    dt_model_destroy(raw);
    dt_model_destroy(m2);
    dt_model_destroy(m);
    dt_comm_destroy(c);
}

/* Resuming on another number of ranks: local SGD's replicas (1 step into a period of 10, so they differ) and
   D-PSGD's (a gossip step, then each its own SGD step) saved by 2 ranks load on 3, every rank holding the mean of
   the two saved replicas (their sum in double, halved, rounded once). */
typedef struct ew_job { int dpsgd; const char *path; int load; int64_t np, word; float params[MAXR][MAXP]; } ew_job;
static dt_result ew_rank(dt_comm *c, void *arg) {
    ew_job *j = (ew_job *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c);
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_localsgd *l = NULL;
    dt_dpsgd *d = NULL;
    dt_topology t;
    dt_topology_desc td;
    dt_result r = DT_OK;
#define T(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)
    memset(&t, 0, sizeof t);
    memset(&td, 0, sizeof td);
    td.kind = DT_TOPO_RING; td.world = p;
    T(make_model(&m, 1, 0, 16));
    T(make_optim(&o, m, 0.9f));
    if (j->dpsgd) {
        T(dt_topology_create(&t, &td));
        T(dt_dpsgd_create(&d, c, m, &t, NULL));
    } else {
        dt_localsgd_desc ld;
        memset(&ld, 0, sizeof ld);
        ld.period = 10;
        T(dt_localsgd_create(&l, c, m, &ld));
    }
    if (j->load) {
        T(j->dpsgd ? dt_dpsgd_load(d, j->path, o, NULL) : dt_localsgd_load(l, j->path, o, NULL));
    } else {
        if (j->dpsgd) T(dt_dpsgd_step(d, NULL));   /* a gossip step (on 2 ranks it equalises), then their own steps */
        T(sgd_step(m, o, (int64_t)me * (B / p), B / p));   /* each replica its own samples: they differ */
        if (!j->dpsgd) T(dt_localsgd_step(l));
        T(j->dpsgd ? dt_dpsgd_save(d, j->path, o, NULL) : dt_localsgd_save(l, j->path, o, NULL));
    }
    {   /* rank 0 alone writes the shared count */
        int64_t np = 0;
        dt_model_params(m, &np);
        if (me == 0) j->np = np;
        if (np > MAXP) { r = dt_set_error(DT_ERR_STATE, "raise MAXP"); goto done; }
        T(dt_model_get_params(m, j->params[me], np));
    }
done:
    dt_dpsgd_destroy(d);
    dt_localsgd_destroy(l);
    dt_topology_free(&t);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
#undef T
}
static void test_resume_other_world(void) {
    static ew_job saved, loaded;
    const char *path = "build/test_localsgd_elastic.ckpt";
    int k, r;
    int64_t i;
    for (k = 0; k < 2; k++) {
        memset(&saved, 0, sizeof saved);
        saved.dpsgd = k; saved.path = path;
        remove(path);
        CHECK_OK(tc_launch(ew_rank, &saved, 2));
        CHECK(saved.np > 0 && memcmp(saved.params[0], saved.params[1], sizeof(float) * (size_t)saved.np) != 0);
        loaded = saved;
        loaded.load = 1;
        memset(loaded.params, 0, sizeof loaded.params);
        CHECK_OK(tc_launch(ew_rank, &loaded, 3));
        for (r = 0; r < 3; r++)
            for (i = 0; i < saved.np; i++)
                if (loaded.params[r][i] != (float)(((double)saved.params[0][i] + (double)saved.params[1][i]) / 2)) {
                    CHECK(loaded.params[r][i] == (float)(((double)saved.params[0][i] + (double)saved.params[1][i]) / 2));
                    break;
                }
    }
    remove(path);
}

int main(int argc, char **argv) {
    if (argc > 1) dt_t_only = argv[1];
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    make_data();
    make_regression();
    RUN(test_period1);
    RUN(test_period3);
    RUN(test_broadcast);
    RUN(test_explicit_and_buffers);
    RUN(test_hogwild_one_thread);
    RUN(test_hogwild_buffers);
    RUN(test_hogwild_converges);
    RUN(test_bad_args);
    RUN(test_resume_other_world);
    return dt_t_summary();
}
