/* test_ddp.c - the DDP trainer: every averaging method on 2, 3 and 4 local ranks with per-rank batch B/N
   ends, after k SGD steps, with the parameters of one rank trained with batch B; the initial broadcast;
   gradient accumulation; ranks with unequal numbers of batches; BatchNorm statistics; bad arguments.
   DT_TEST_QUICK=1 (sanitizer builds) tries fewer algorithms. */
#include "../dtrain.h"
#include "dt_test.h"
#include "train_checks.h"

#define IN 12        /* features */
#define K 4          /* classes */
#define B 12         /* global batch: divisible by 2, 3 and 4 */
#define STEPS 3
#define MAXR 4
#define NSAMP (B * STEPS)

static int quick;
static float X[NSAMP * IN];
static int32_t Y[NSAMP];

static void make_data(void) { tc_data(X, Y, NSAMP, IN, K); }

/* A small MLP (no dropout, no batchnorm), or with batchnorm; seed differs per rank to test the broadcast. */
static dt_result make_model(dt_model **m, uint64_t seed, int bn, int hidden) { return tc_mlp(m, IN, K, seed, bn, hidden, 10); }

static dt_result make_optim(dt_optim **o, dt_model *m) {
    dt_optim_desc od;
    memset(&od, 0, sizeof od);
    od.lr = 0.1f; od.momentum = 0.9f;
    return dt_optim_create(o, m, &od);
}

/* One step's forward and loss on samples [first, first + n). */
static dt_result fwd(dt_model *m, int64_t first, int64_t n) {
    float loss;
    dt_result r = dt_model_forward(m, X + first * IN, n);
    return r != DT_OK ? r : dt_model_loss_labels(m, Y + first, &loss);
}

/* The reference: one process, steps[s] = (first sample, count) of each step's batch. */
static void reference(float *out, int64_t nparams, const int64_t (*steps)[2], int nsteps) {
    dt_model *m = NULL;
    dt_optim *o = NULL;
    int s;
    CHECK_OK(make_model(&m, 1, 0, 16));
    CHECK_OK(make_optim(&o, m));
    for (s = 0; s < nsteps && m && o; s++) {
        CHECK_OK(fwd(m, steps[s][0], steps[s][1]));
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward(m, NULL));
        CHECK_OK(dt_optim_step(o));
    }
    if (m) CHECK_OK(dt_model_get_params(m, out, nparams));
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

typedef struct job {
    dt_ddp_desc desc;
    int mode;                  /* 0 equal shares; 1 accumulation; 2 unequal batch counts; 3 plain backward + dt_ddp_sync;
                                  4 equal shares with the program's own messages in flight (user_post) */
    int64_t nparams;
    float params[MAXR][1024];  /* each rank's parameters at the end */
    float first[MAXR][1024];   /* right after dt_ddp_create */
    dt_ddp_stats stats[MAXR];
    int buckets[MAXR], tensors[MAXR];
    int64_t bucket_bytes[MAXR];   /* the sum of dt_ddp_bucket_bytes over the buckets, -1 if out of range gave non-zero */
    uint64_t colls[MAXR];      /* equal shares: collectives of the STEPS syncs (the join's excluded) */
    float sent[MAXR][1024], got[MAXR][2][MAXR][1024];   /* mode 4: each rank's message; what each received */
    dt_request reqs[MAXR][2 * MAXR];
    int user_bad[MAXR];
} job;

/* Mode 4: the program's own messages in flight while DDP trains, on the user's largest tag and on 32000
   (the tag DDP's P2P method took from the user's range before it had tags of its own), each as long as
   the gradient: rank i's send on 32000 to rank 0 and rank 0's to each rank stay pending until after the
   training, and so do rank 0's receives on DT_TAG_USER_MAX. A DDP message that matched one of them would
   change the parameters or the messages. */
#define OLD_DDP_TAG 32000
static dt_result user_post(dt_comm *c, job *j) {
    int me = dt_comm_rank(c), p = dt_comm_size(c), i, nr = 0;
    size_t n = (size_t)j->nparams;
    dt_result r = DT_OK;
    for (i = 0; i < (int)n; i++) j->sent[me][i] = 1000.0f + (float)me + (float)i / 1024.0f;
    if (me != 0) return dt_comm_isend(c, j->sent[me], n, DT_F32, 0, OLD_DDP_TAG, &j->reqs[me][nr]);
    for (i = 1; i < p && r == DT_OK; i++) r = dt_comm_irecv(c, j->got[0][0][i], n, DT_F32, i, DT_TAG_USER_MAX, &j->reqs[0][nr++]);
    for (i = 1; i < p && r == DT_OK; i++) r = dt_comm_isend(c, j->sent[0], n, DT_F32, i, OLD_DDP_TAG, &j->reqs[0][nr++]);
    return r;
}
static dt_result user_finish(dt_comm *c, job *j) {
    int me = dt_comm_rank(c), p = dt_comm_size(c), i;
    size_t n = (size_t)j->nparams, got = 0;
    dt_result r;
    if (me != 0) {
        if ((r = dt_comm_send(c, j->sent[me], n, DT_F32, 0, DT_TAG_USER_MAX)) != DT_OK ||
            (r = dt_comm_recv(c, j->got[me][1][0], n, DT_F32, 0, OLD_DDP_TAG, &got)) != DT_OK ||
            (r = dt_comm_wait(c, &j->reqs[me][0])) != DT_OK) return r;
        j->user_bad[me] += got != n || memcmp(j->got[me][1][0], j->sent[0], n * sizeof(float)) != 0;
        return DT_OK;
    }
    for (i = 1; i < p; i++) {
        if ((r = dt_comm_recv(c, j->got[0][1][i], n, DT_F32, i, OLD_DDP_TAG, &got)) != DT_OK) return r;
        j->user_bad[0] += got != n;
    }
    if ((r = dt_comm_waitall(c, j->reqs[0], 2 * (p - 1))) != DT_OK) return r;
    for (i = 1; i < p; i++)
        j->user_bad[0] += dt_request_received(&j->reqs[0][i - 1]) != n || memcmp(j->got[0][0][i], j->sent[i], n * sizeof(float)) != 0 ||
                          memcmp(j->got[0][1][i], j->sent[i], n * sizeof(float)) != 0;
    return DT_OK;
}

static dt_result ddp_rank(dt_comm *c, void *arg) {
    job *j = (job *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c), s;
    int64_t share = B / p;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_result r;
#define T(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)
    T(make_model(&m, 1 + (uint64_t)me * 77, 0, 16));
    T(make_optim(&o, m));
    T(dt_ddp_create(&d, c, m, &j->desc));
    T(dt_model_get_params(m, j->first[me], j->nparams));
    j->buckets[me] = dt_ddp_buckets(d);
    j->tensors[me] = dt_model_param_tensors(m);
    for (s = 0; s < j->buckets[me]; s++) j->bucket_bytes[me] += dt_ddp_bucket_bytes(d, s);
    if (dt_ddp_bucket_bytes(d, -1) || dt_ddp_bucket_bytes(d, j->buckets[me])) j->bucket_bytes[me] = -1;
    if (j->mode == 2) {   /* rank 0: 3 batches of 4; rank 1: 1 batch of 2 (samples 4 + 12 s .. and 16..17) */
        int nb = me == 0 ? STEPS : 1;
        for (s = 0; s < nb; s++) {
            T(fwd(m, me == 0 ? 12 * s : 16, me == 0 ? 4 : 2));
            T(dt_ddp_backward(d, NULL, me == 0 ? 4 : 2, 1));
            T(dt_optim_step(o));
            dt_model_zero_grad(m);
        }
        T(dt_ddp_join(d, o));
    } else {
        uint64_t c0 = dt_comm_get_stats(c).collectives;
        if (j->mode == 4) T(user_post(c, j));
        for (s = 0; s < STEPS; s++) {
            int64_t first = (int64_t)s * B + me * share;
            if (j->mode == 1) {   /* two micro-batches of unequal size, synced on the second */
                int64_t a = share / 2 + (share > 2), b2 = share - a;
                T(fwd(m, first, a));
                T(dt_ddp_backward(d, NULL, a, 0));
                T(fwd(m, first + a, b2));
                T(dt_ddp_backward(d, NULL, b2, 1));
            } else if (j->mode == 3) {
                T(fwd(m, first, share));
                T(dt_model_backward(m, NULL));
                T(dt_ddp_sync(d, share));
            } else {
                T(fwd(m, first, share));
                T(dt_ddp_backward(d, NULL, share, 1));
            }
            T(dt_optim_step(o));
            dt_model_zero_grad(m);
        }
        j->colls[me] = dt_comm_get_stats(c).collectives - c0;
        T(dt_ddp_join(d, o));
        if (j->mode == 4) T(user_finish(c, j));
    }
    T(dt_model_get_params(m, j->params[me], j->nparams));
    j->stats[me] = dt_ddp_get_stats(d);
done:
#undef T
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}

static void run_job(job *j, int ranks) { CHECK_OK(tc_launch(ddp_rank, j, ranks)); }

static int64_t model_params(void) {
    dt_model *m = NULL;
    int64_t n = 0;
    CHECK_OK(make_model(&m, 1, 0, 16));
    n = dt_model_param_count(m);
    dt_model_destroy(m);
    return n;
}

/* N ranks with B/N each = one rank with B, for every method (and all-reduce algorithm) */
static void test_equivalence(void) {
    static job j;
    static float ref[1024];
    int64_t steps[STEPS][2], n = model_params();
    int s, p, meth, a, mode;
    for (s = 0; s < STEPS; s++) { steps[s][0] = (int64_t)s * B; steps[s][1] = B; }
    reference(ref, n, (const int64_t(*)[2])steps, STEPS);
    for (meth = 0; meth < DT_DDP_METHOD_COUNT; meth++)
        for (a = 0; a < DT_ALGO_COUNT; a++) {
            int allreduce = meth == DT_DDP_BUCKETS || meth == DT_DDP_FLAT || meth == DT_DDP_PER_LAYER;
            if (a && (!allreduce || (quick && a != DT_ALGO_RING))) continue;
            for (p = 2; p <= MAXR; p++)
                for (mode = 0; mode < (meth == DT_DDP_BUCKETS ? 4 : 1); mode++) {
                    int r;
                    char what[128];
                    memset(&j, 0, sizeof j);
                    j.nparams = n;
                    j.desc.method = (dt_ddp_method)meth;
                    j.desc.algo = (dt_algo)a;
                    /* buckets: one tensor each, two tensors, or everything (default), or no overlap */
                    j.desc.bucket_bytes = mode == 0 ? 4 : mode == 1 ? 200 : 0;
                    j.desc.no_overlap = mode == 3;
                    run_job(&j, p);
                    for (r = 0; r < p; r++) {
                        snprintf(what, sizeof what, "%s, algo %s, %d ranks, mode %d: rank %d", dt_ddp_method_name(j.desc.method),
                                 dt_algo_name(j.desc.algo), p, mode, r);
                        CHECK_CLOSE(j.params[r], ref, n, 1e-5, what);
                    }
                    if (meth == DT_DDP_BUCKETS) CHECK(j.buckets[0] == (mode == 0 ? 6 : mode == 1 ? 3 : 1));
                    CHECK(j.bucket_bytes[0] == (meth == DT_DDP_BUCKETS ? n * (int64_t)sizeof(float) : 0));   /* the buckets tile the buffer */
                    /* the samples ride with the gradient: a sync is a bucket's or tensor's all-reduce each,
                       one all-reduce of the buffer (FLAT), a gather and a broadcast (PS), or messages (P2P) */
                    for (r = 0; r < p; r++)
                        CHECK(j.colls[r] == STEPS * (uint64_t)(meth == DT_DDP_BUCKETS ? j.buckets[0] : meth == DT_DDP_PER_LAYER ? j.tensors[0]
                                                               : meth == DT_DDP_FLAT ? 1 : meth == DT_DDP_PARAM_SERVER ? 2 : 0));
                }
        }
}

/* dt_ddp_create broadcasts rank 0's parameters: ranks built with different seeds start equal */
static void test_broadcast(void) {
    static job j;
    int r;
    memset(&j, 0, sizeof j);
    j.nparams = model_params();
    run_job(&j, 3);
    for (r = 1; r < 3; r++) CHECK(memcmp(j.first[r], j.first[0], sizeof(float) * (size_t)j.nparams) == 0);
    CHECK(j.stats[0].syncs == STEPS && j.stats[0].joined_rounds == 0);
}

/* two micro-batches (sizes 2 + 1 ... 3 + 3) accumulated, then one sync = one batch; and plain backward +
   dt_ddp_sync; on one rank (the self backend) too */
static void test_accumulation(void) {
    static job j;
    static float ref[1024];
    int64_t steps[STEPS][2], n = model_params();
    int s, p, r, mode;
    for (s = 0; s < STEPS; s++) { steps[s][0] = (int64_t)s * B; steps[s][1] = B; }
    reference(ref, n, (const int64_t(*)[2])steps, STEPS);
    for (mode = 1; mode <= 3; mode += 2)
        for (p = 1; p <= MAXR; p++) {
            memset(&j, 0, sizeof j);
            j.nparams = n;
            j.mode = mode;
            j.desc.method = DT_DDP_FLAT;
            run_job(&j, p);
            for (r = 0; r < p; r++) CHECK_CLOSE(j.params[r], ref, n, 1e-5, mode == 1 ? "accumulation" : "dt_ddp_sync");
        }
}

/* rank 0 has 3 batches of 4 samples, rank 1 one batch of 2: the first step averages 6 samples, then
   rank 1 joins with zero weight for 2 rounds; both end equal to the reference, for every method */
static void test_uneven(void) {
    static job j;
    static float ref[1024];
    const int64_t steps[STEPS][2] = {{0, 4}, {12, 4}, {24, 4}};
    int64_t n = model_params();
    dt_model *m = NULL;
    dt_optim *o = NULL;
    int meth, s;
    /* the reference's first step is over samples 0..3 and 16..17: build it by hand */
    CHECK_OK(make_model(&m, 1, 0, 16));
    CHECK_OK(make_optim(&o, m));
    if (!m || !o) { dt_optim_destroy(o); dt_model_destroy(m); return; }
    {
        float x6[6 * IN];
        int32_t y6[6];
        float loss;
        memcpy(x6, X, sizeof(float) * 4 * IN); memcpy(x6 + 4 * IN, X + 16 * IN, sizeof(float) * 2 * IN);
        memcpy(y6, Y, sizeof(int32_t) * 4); memcpy(y6 + 4, Y + 16, sizeof(int32_t) * 2);
        CHECK_OK(dt_model_forward(m, x6, 6));
        CHECK_OK(dt_model_loss_labels(m, y6, &loss));
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward(m, NULL));
        CHECK_OK(dt_optim_step(o));
    }
    for (s = 1; s < STEPS; s++) {
        CHECK_OK(fwd(m, steps[s][0], steps[s][1]));
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward(m, NULL));
        CHECK_OK(dt_optim_step(o));
    }
    CHECK_OK(dt_model_get_params(m, ref, n));
    dt_optim_destroy(o);
    dt_model_destroy(m);
    for (meth = 0; meth < DT_DDP_METHOD_COUNT; meth++) {
        memset(&j, 0, sizeof j);
        j.nparams = n;
        j.mode = 2;
        j.desc.method = (dt_ddp_method)meth;
        j.desc.bucket_bytes = 4;
        run_job(&j, 2);
        CHECK_CLOSE(j.params[0], ref, n, 1e-5, dt_ddp_method_name(j.desc.method));
        CHECK_CLOSE(j.params[1], ref, n, 1e-5, dt_ddp_method_name(j.desc.method));
        CHECK(j.stats[1].joined_rounds == 2 && j.stats[1].syncs == 1 && j.stats[0].syncs == 3 && j.stats[0].joined_rounds == 0);
    }
}

/* BatchNorm running statistics: dt_ddp_sync_buffers gives every rank the mean of the ranks' buffers;
   sync_buffers = 1 does it at every sync */
typedef struct bn_job { int every; int64_t nb; float before[MAXR][64], after[MAXR][64]; } bn_job;
static dt_result bn_rank(dt_comm *c, void *arg) {
    bn_job *j = (bn_job *)arg;
    int me = dt_comm_rank(c);
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_ddp_desc dd;
    dt_result r;
    memset(&dd, 0, sizeof dd);
    dd.sync_buffers = j->every;
    if ((r = make_model(&m, 3, 1, 8)) == DT_OK && (r = dt_ddp_create(&d, c, m, &dd)) == DT_OK &&
        (r = fwd(m, me * 6, 6)) == DT_OK && (r = dt_model_get_buffers(m, j->before[me], j->nb)) == DT_OK) {
        if (j->every) r = dt_ddp_backward(d, NULL, 6, 1);
        else r = dt_ddp_sync_buffers(d);
        if (r == DT_OK) r = dt_model_get_buffers(m, j->after[me], j->nb);
    }
    dt_ddp_destroy(d);
    dt_model_destroy(m);
    return r;
}
static void test_batchnorm_stats(void) {
    static bn_job j;
    dt_model *m = NULL;
    int every, r;
    int64_t i;
    CHECK_OK(make_model(&m, 3, 1, 8));
    memset(&j, 0, sizeof j);
    if (m) dt_model_buffers(m, &j.nb);
    dt_model_destroy(m);
    CHECK(j.nb >= 16 && j.nb <= 64);
    for (every = 0; every < 2; every++) {
        j.every = every;
        CHECK_OK(tc_launch(bn_rank, &j, 3));
        CHECK(memcmp(j.before[0], j.before[1], sizeof(float) * (size_t)j.nb) != 0);   /* the ranks saw different data */
        for (i = 0; i < j.nb; i++) {
            float want = (j.before[0][i] + j.before[1][i] + j.before[2][i]) / 3.0f;
            for (r = 0; r < 3; r++) CHECK(fabsf(j.after[r][i] - want) <= 1e-6f * (1.0f + fabsf(want)));
        }
    }
}

/* Synchronised batch norm (dt_ddp_desc.sync_bn): a small residual CNN whose batch norms run both fused paths
   (batch norm + ReLU, batch norm + residual add + ReLU), trained two SGD steps on 2, 3 and 4 local ranks
   (overlapped buckets of 200 bytes, so the batch norms' sums go between buckets on the helper thread, and
   without overlap), on 3 ranks with unequal batches (6, 4, 2), and on 2 ranks where rank 1 has no second
   batch (dt_ddp_join): each ends with the parameters and running statistics of one process trained on the
   whole batches, to rounding, the same bits on every rank. Without sync_bn the same 2 ranks end elsewhere. */
#define SB_C 2
#define SB_HW 6
#define SB_IN (SB_C * SB_HW * SB_HW)
#define SB_N 30   /* samples: two steps of 12, and 6 for the join's second step */
static float SBX[SB_N * SB_IN];
static int32_t SBY[SB_N];
static dt_result sb_model(dt_model **m, uint64_t seed) {
    dt_model_desc d;
    int x, y;
    memset(&d, 0, sizeof d);
    d.in_c = SB_C; d.in_h = SB_HW; d.in_w = SB_HW; d.seed = seed;
    if (dt_model_create(m, &d) != DT_OK) return DT_ERR_OUT_OF_MEMORY;
    x = dt_model_input(*m);
    x = dt_relu(*m, dt_batchnorm(*m, dt_conv2d(*m, x, 4, 3, 1, 1)));
    y = dt_batchnorm(*m, dt_conv2d(*m, x, 4, 3, 1, 1));
    x = dt_relu(*m, dt_add(*m, y, x));
    x = dt_linear(*m, dt_global_avgpool(*m, x), 3, 1);
    return dt_model_finalize(*m);
}
typedef struct sb_job {
    dt_ddp_desc desc;
    int64_t first[2][MAXR], count[2][MAXR];   /* each step's slice of each rank (count 0: it joins) */
    int64_t np, nb;
    float params[MAXR][256], bufs[MAXR][64];
} sb_job;
static dt_result sb_steps(dt_model *m, dt_optim *o, dt_ddp *d, const sb_job *j, int me) {
    dt_result r = DT_OK;
    int s;
    float loss;
    for (s = 0; s < 2 && r == DT_OK; s++) {
        if (d && j->count[s][me] == 0) return dt_ddp_join(d, o);
        dt_model_zero_grad(m);
        if ((r = dt_model_forward(m, SBX + j->first[s][me] * SB_IN, j->count[s][me])) != DT_OK ||
            (r = dt_model_loss_labels(m, SBY + j->first[s][me], &loss)) != DT_OK)
            return r;
        r = d ? dt_ddp_backward(d, NULL, j->count[s][me], 1) : dt_model_backward(m, NULL);
        if (r == DT_OK) r = dt_optim_step(o);
    }
    return r != DT_OK || !d ? r : dt_ddp_join(d, o);
}
static dt_result sb_rank(dt_comm *c, void *arg) {
    sb_job *j = (sb_job *)arg;
    int me = c ? dt_comm_rank(c) : 0;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_result r = sb_model(&m, 1 + 7 * (uint64_t)me);
    if (r == DT_OK) r = make_optim(&o, m);
    if (r == DT_OK && c) r = dt_ddp_create(&d, c, m, &j->desc);
    if (r == DT_OK) r = sb_steps(m, o, d, j, me);
    if (r == DT_OK) r = dt_model_get_params(m, j->params[me], j->np);
    if (r == DT_OK) r = dt_model_get_buffers(m, j->bufs[me], j->nb);
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}
/* the ranks' slices: step s's batch of 12 (or, with join, 6 for rank 0 alone) split as `sizes` */
static void sb_split(sb_job *j, int p, const int64_t *sizes, int join) {
    int s, r;
    for (s = 0; s < 2; s++) {
        int64_t at = 12 * s;
        for (r = 0; r < p; r++) {
            j->first[s][r] = at;
            j->count[s][r] = s == 1 && join ? (r == 0 ? 6 : 0) : sizes[r];
            at += j->count[s][r];
        }
    }
}
/* the largest |a - b| / (1 + |b|) */
static double sb_diff(const float *a, const float *b, int64_t n) {
    double worst = 0.0, e;
    int64_t i;
    for (i = 0; i < n; i++)
        if ((e = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)b[i]))) > worst || e != e) worst = e != e ? 1e30 : e;
    return worst;
}
static void test_sync_bn(void) {
    static sb_job ref, j;
    static const int64_t even[4][4] = {{12}, {6, 6}, {4, 4, 4}, {3, 3, 3, 3}}, uneven[3] = {6, 4, 2};
    dt_model *m = NULL;
    int p, ov, join, r;
    double e, eb;
    tc_data(SBX, SBY, SB_N, SB_IN, 3);
    CHECK_OK(sb_model(&m, 1));
    memset(&ref, 0, sizeof ref);
    if (m) { dt_model_params(m, &ref.np); dt_model_buffers(m, &ref.nb); }
    dt_model_destroy(m);
    CHECK(ref.np <= 256 && ref.nb <= 64 && ref.nb == 16);
    for (join = 0; join < 2; join++) {   /* the reference: one process, batches of 12, 12 (or 12, 6) */
        static sb_job one;
        one = ref;
        sb_split(&one, 1, even[0], 0);
        if (join) one.count[1][0] = 6;
        CHECK_OK(sb_rank(NULL, &one));
        for (p = join ? 2 : 1; p <= (join ? 2 : 5); p++) {
            for (ov = 0; ov < 2; ov++) {
                int ranks = p == 5 ? 3 : p;   /* 5: 3 ranks, unequal batches */
                j = ref;
                j.desc.sync_bn = 1;
                j.desc.bucket_bytes = 200;
                j.desc.no_overlap = ov;
                sb_split(&j, ranks, p == 5 ? uneven : even[ranks - 1], join);
                CHECK_OK(tc_launch(sb_rank, &j, ranks));
                e = sb_diff(j.params[0], one.params[0], j.np);
                eb = sb_diff(j.bufs[0], one.bufs[0], j.nb);
                if (ov == 0 || e > 1e-6 || eb > 1e-6)
                    printf("    %d rank%s%s%s%s: parameters within %.1e, running statistics within %.1e of one process\n", ranks,
                           ranks > 1 ? "s" : "", p == 5 ? ", batches 6 4 2" : "", join ? ", rank 1 joins" : "",
                           ov ? ", no overlap" : "", e, eb);
                CHECK(e <= 1e-6 && eb <= 1e-6);
                for (r = 1; r < ranks; r++)
                    CHECK(memcmp(j.params[r], j.params[0], sizeof(float) * (size_t)j.np) == 0 &&
                          memcmp(j.bufs[r], j.bufs[0], sizeof(float) * (size_t)j.nb) == 0);
            }
        }
        if (!join) {   /* the test can fail: each rank's own statistics end elsewhere */
            j = ref;
            j.desc.bucket_bytes = 200;
            sb_split(&j, 2, even[1], 0);
            CHECK_OK(tc_launch(sb_rank, &j, 2));
            e = sb_diff(j.params[0], one.params[0], j.np);
            printf("    2 ranks without sync_bn: parameters %.1e from one process's\n", e);
            CHECK(e > 1e-3);
        }
    }
}

/* dt_model_set_bn_sync before finalize, and on a backend without the ops it needs: named errors */
static dt_result sb_never(void *user, double *buf, int64_t n) { (void)user; (void)buf; (void)n; return DT_ERR_COMM; }
static void test_sync_bn_refused(void) {
    static dt_ops no_sums;
    dt_model *m = NULL;
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    d.in_c = 4;
    CHECK_OK(dt_model_create(&m, &d));
    if (m) dt_batchnorm(m, dt_linear(m, dt_model_input(m), 3, 1));
    CHECK(dt_model_set_bn_sync(m, sb_never, NULL) == DT_ERR_STATE);
    dt_model_destroy(m);
    m = NULL;
    no_sums = *dt_cpu_ops();
    no_sums.bn_sums = NULL;
    d.ops = &no_sums;
    CHECK_OK(dt_model_create(&m, &d));
    if (m) dt_batchnorm(m, dt_linear(m, dt_model_input(m), 3, 1));
    CHECK_OK(dt_model_finalize(m));
    CHECK(dt_model_set_bn_sync(m, sb_never, NULL) == DT_ERR_UNSUPPORTED);
    CHECK(strstr(dt_last_error(), "no synchronised batch norm") != NULL);
    CHECK_OK(dt_model_set_bn_sync(m, NULL, NULL));   /* turning it off is always allowed */
    dt_model_destroy(m);
    m = NULL;
    d.ops = NULL;   /* on the CPU: a sum that fails is what the pass returns */
    CHECK_OK(dt_model_create(&m, &d));
    if (m) dt_batchnorm(m, dt_linear(m, dt_model_input(m), 3, 1));
    CHECK_OK(dt_model_finalize(m));
    CHECK_OK(dt_model_set_bn_sync(m, sb_never, NULL));
    {
        float x[8] = {1, 2, 3, 4, 5, 6, 7, 9};
        CHECK(dt_model_forward(m, x, 2) == DT_ERR_COMM);
        CHECK_OK(dt_model_set_mode(m, DT_MODE_EVAL));   /* eval mode uses the running statistics: no sum */
        CHECK_OK(dt_model_forward(m, x, 2));
    }
    dt_model_destroy(m);
}

/* Resuming on another number of ranks: DDP's replicas are equal, so a checkpoint of 2 ranks after step 1 loads on
   3 (and on 1), every rank taking the mean of the saved ones (the same parameters and momentum), and the steps after
   it, of the same global batches, end where the run never stopped ends, to rounding; the ranks stay equal; the
   meta's values marked as sums are summed over the old ranks o with o mod the new world = r, the others rank 0's. */
typedef struct el_job {
    int from, to;
    const char *save, *load;
    int64_t np;
    float params[MAXR][1024];
    double got[MAXR][2];   /* after a load: meta.values[0] (a sum over the ranks) and [3] (rank 0's) */
} el_job;
static dt_result el_rank(dt_comm *c, void *arg) {
    el_job *j = (el_job *)arg;
    int me = dt_comm_rank(c), p = dt_comm_size(c), s;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_checkpoint_meta meta;
    dt_result r = make_model(&m, 1 + 5 * (uint64_t)me, 0, 16);
    memset(&meta, 0, sizeof meta);
    if (r == DT_OK) r = make_optim(&o, m);
    if (r == DT_OK) r = dt_ddp_create(&d, c, m, NULL);
    meta.sum_values = 1u;   /* values[0] is a sum over the ranks */
    if (r == DT_OK && j->load) r = dt_ddp_load(d, j->load, o, &meta);
    j->got[me][0] = meta.values[0];
    j->got[me][1] = meta.values[3];
    if (r == DT_OK && j->load && meta.step != j->from) r = dt_set_error(DT_ERR_STATE, "loaded step %lld", (long long)meta.step);
    for (s = j->from; s < j->to && r == DT_OK; s++) {   /* global batch s: samples [12 s, 12 s + 12), in rank order */
        int64_t share = B / p;
        dt_model_zero_grad(m);
        if ((r = fwd(m, (int64_t)s * B + me * share, share)) == DT_OK && (r = dt_ddp_backward(d, NULL, share, 1)) == DT_OK)
            r = dt_optim_step(o);
    }
    meta.step = j->to;
    meta.values[0] = me + 1;   /* a rank's share of a total: 1 + 2 = 3 on 2 ranks */
    meta.values[3] = 10 + me;  /* what rank 0's says for all */
    if (r == DT_OK && j->save) r = dt_ddp_save(d, j->save, o, &meta);
    if (r == DT_OK) {   /* rank 0 alone writes the shared count */
        int64_t np = 0;
        dt_model_params(m, &np);
        if (me == 0) j->np = np;
        r = np <= 1024 ? dt_model_get_params(m, j->params[me], np) : dt_set_error(DT_ERR_STATE, "too many parameters");
    }
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return r;
}
static void test_resume_other_world(void) {
    static el_job full, rest;
    const char *path = "build/test_ddp_elastic.ckpt";
    int w, r, i;
    memset(&full, 0, sizeof full);
    full.to = STEPS;
    CHECK_OK(tc_launch(el_rank, &full, 2));
    memset(&rest, 0, sizeof rest);
    rest.to = 1; rest.save = path;
    remove(path);
    CHECK_OK(tc_launch(el_rank, &rest, 2));
    for (w = 1; w <= 3; w += 2) {
        double worst = 0.0;
        memset(&rest, 0, sizeof rest);
        rest.from = 1; rest.to = STEPS; rest.load = path;
        CHECK_OK(tc_launch(el_rank, &rest, w));
        for (i = 0; i < full.np; i++) {
            double e = fabs((double)rest.params[0][i] - (double)full.params[0][i]);
            if (e > worst) worst = e;
        }
        printf("    saved by 2 ranks after step 1, resumed on %d: parameters within %.1e of the run never stopped\n", w, worst);
        CHECK(full.np > 0 && worst <= 1e-6);
        for (r = 1; r < w; r++) CHECK(memcmp(rest.params[r], rest.params[0], sizeof(float) * (size_t)full.np) == 0);
        /* meta.values: [0] marked a sum: old ranks 0 and 1 (1 + 2) on 1 rank; on 3, rank 0 has 1, rank 1 has 2, rank 2
           none; [3] rank 0's (10) everywhere */
        CHECK(w == 1 ? rest.got[0][0] == 3.0 : rest.got[0][0] == 1.0 && rest.got[1][0] == 2.0 && rest.got[2][0] == 0.0);
        for (r = 0; r < w; r++) CHECK(rest.got[r][1] == 10.0);
    }
    remove(path);
}

/* bad arguments and a model that differs between ranks: errors that name the rank, nothing hangs */
typedef struct bad_job { int case_; dt_result got[MAXR]; char msg[MAXR][512]; } bad_job;
static dt_result bad_rank(dt_comm *c, void *arg) {
    bad_job *j = (bad_job *)arg;
    int me = dt_comm_rank(c);
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_result r = make_model(&m, 1, 0, j->case_ == 0 && me == 1 ? 17 : 16);
    if (r == DT_OK) {
        if ((r = dt_ddp_create(&d, c, m, NULL)) == DT_OK && (r = fwd(m, 0, 4)) == DT_OK) {
            if (j->case_ == 1 && me == 1) {   /* leaves before the buckets */
                r = dt_set_error(DT_ERR_IO, "rank 1 could not read its data");
            } else if (j->case_ == 2) {       /* 2^23 samples each: 2^24 in one sync, more than a float counts */
                r = dt_ddp_sync(d, (int64_t)1 << 23);
            } else {
                r = dt_ddp_backward(d, NULL, 4, 1);
            }
        }
    }
    j->got[me] = r;
    snprintf(j->msg[me], sizeof j->msg[me], "%s", dt_last_error());
    dt_ddp_destroy(d);
    dt_model_destroy(m);
    return r;
}
static void test_bad_args(void) {
    static bad_job j;
    dt_comm *c = NULL;
    dt_model *m = NULL, *raw = NULL;
    dt_model_desc md;
    dt_ddp *d = (dt_ddp *)&j;
    dt_ddp_desc dd;
    dt_ddp_method k;
    CHECK_OK(dt_comm_create_self(&c, NULL));
    CHECK_OK(make_model(&m, 1, 0, 16));
    memset(&md, 0, sizeof md);
    md.in_c = IN;
    CHECK_OK(dt_model_create(&raw, &md));
    memset(&dd, 0, sizeof dd);
    CHECK_ERR(dt_ddp_create(NULL, c, m, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_create(&d, NULL, m, NULL), DT_ERR_INVALID_ARG);
    CHECK(d == NULL);
    CHECK_ERR(dt_ddp_create(&d, c, NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_create(&d, c, raw, NULL), DT_ERR_STATE);
    CHECK(strstr(dt_last_error(), "rank 0") != NULL);
    dd.method = DT_DDP_METHOD_COUNT;
    CHECK_ERR(dt_ddp_create(&d, c, m, &dd), DT_ERR_INVALID_ARG);
    dd.method = DT_DDP_FLAT; dd.algo = (dt_algo)99;
    CHECK_ERR(dt_ddp_create(&d, c, m, &dd), DT_ERR_INVALID_ARG);
    dd.algo = DT_ALGO_AUTO; dd.bucket_bytes = -1;
    CHECK_ERR(dt_ddp_create(&d, c, m, &dd), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_method_parse("allgather", &k), DT_ERR_INVALID_ARG);
    CHECK(dt_ddp_method_parse("per-layer", &k) == DT_OK && k == DT_DDP_PER_LAYER);
    CHECK(strcmp(dt_ddp_method_name((dt_ddp_method)42), "unknown") == 0);
    CHECK_ERR(dt_ddp_backward(NULL, NULL, 4, 1), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_sync(NULL, 4), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_join(NULL, NULL), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_sync_buffers(NULL), DT_ERR_INVALID_ARG);
    dt_ddp_destroy(NULL);
    CHECK(dt_ddp_get_stats(NULL).syncs == 0 && dt_ddp_buckets(NULL) == 0 && dt_ddp_overlapped(NULL) == 0 && dt_ddp_bucket_bytes(NULL, 0) == 0);
    if (c && m && dt_ddp_create(&d, c, m, NULL) == DT_OK) {
        CHECK_ERR(dt_ddp_backward(d, NULL, 0, 1), DT_ERR_INVALID_ARG);
        CHECK(strstr(dt_last_error(), "rank 0") != NULL);
        CHECK_ERR(dt_ddp_sync(d, -3), DT_ERR_INVALID_ARG);
        CHECK_OK(fwd(m, 0, 4));
        CHECK_OK(dt_ddp_backward(d, NULL, 4, 0));
        CHECK_ERR(dt_ddp_join(d, NULL), DT_ERR_STATE);   /* samples accumulated but not synced */
        CHECK_OK(dt_ddp_sync(d, 4));
        CHECK_OK(dt_ddp_join(d, NULL));
        dt_ddp_destroy(d);
    }
    dt_model_destroy(raw);
    dt_model_destroy(m);
    dt_comm_destroy(c);
    /* a rank with another model: both fail with DT_ERR_MISMATCH naming themselves; a rank that leaves:
       the other's overlapped backward fails with DT_ERR_PEER instead of waiting */
    memset(&j, 0, sizeof j);
    j.case_ = 0;
    CHECK(tc_launch(bad_rank, &j, 2) != DT_OK);
    CHECK(j.got[0] == DT_ERR_MISMATCH && j.got[1] == DT_ERR_MISMATCH);
    CHECK(strstr(j.msg[0], "rank 0") && strstr(j.msg[0], "same model") && strstr(j.msg[1], "rank 1"));
    memset(&j, 0, sizeof j);
    j.case_ = 1;
    CHECK(tc_launch(bad_rank, &j, 2) != DT_OK);
    CHECK(j.got[0] == DT_ERR_PEER && strstr(j.msg[0], "rank 1") && j.got[1] == DT_ERR_IO);
    /* the sample counts travel as floats: a sync of 2^24 samples is refused on every rank, saying why */
    memset(&j, 0, sizeof j);
    j.case_ = 2;
    CHECK(tc_launch(bad_rank, &j, 2) != DT_OK);
    CHECK(j.got[0] == DT_ERR_INVALID_ARG && j.got[1] == DT_ERR_INVALID_ARG);
    CHECK(strstr(j.msg[0], "16777216 samples") && strstr(j.msg[1], "sync more often"));
}

/* DDP's own messages (the parameter server by hand, DT_DDP_P2P) have tags of the library's, which a
   program cannot use: the program's messages in flight on the user's tags, the largest included, never
   meet them, and the training ends with the bits of a run without them. */
static void test_user_tags(void) {
    static job j, plain;
    int p, r;
    for (p = 2; p <= MAXR; p++) {
        memset(&plain, 0, sizeof plain);
        plain.nparams = model_params();
        plain.desc.method = DT_DDP_P2P;
        run_job(&plain, p);
        memset(&j, 0, sizeof j);
        j.nparams = plain.nparams;
        j.desc.method = DT_DDP_P2P;
        j.mode = 4;
        run_job(&j, p);
        for (r = 0; r < p; r++) {
            CHECK(memcmp(j.params[r], plain.params[r], sizeof(float) * (size_t)j.nparams) == 0);
            CHECK(j.user_bad[r] == 0);
        }
    }
}

int main(int argc, char **argv) {
    const char *q = getenv("DT_TEST_QUICK");
    quick = q && *q && strcmp(q, "0") != 0;
    if (argc > 1) dt_t_only = argv[1];
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    make_data();
    RUN(test_equivalence);
    RUN(test_broadcast);
    RUN(test_accumulation);
    RUN(test_uneven);
    RUN(test_user_tags);
    RUN(test_batchnorm_stats);
    RUN(test_sync_bn);
    RUN(test_sync_bn_refused);
    RUN(test_resume_other_world);
    RUN(test_bad_args);
    return dt_t_summary();
}
