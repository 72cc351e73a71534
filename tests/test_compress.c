/* test_compress.c - DDP's gradient compression and what it stands on: the 16-bit floats (rounding to
   nearest even against an oracle built on the decoders), the all-reduce over DT_BF16 and DT_F16 against
   the exact sum within their rounding (and charged half of f32's time by the link model), top-k selection
   against a sorting reference, a DDP sync with top-k and error feedback against its emulation on the host
   (residual + sent = input, bit for bit), PowerSGD's sync (rank-1 gradients exact, residual + result =
   input), a short run in which top-k 1% with error feedback (and PowerSGD) lands in fp32's accuracy band
   and top-k without it does not, and resumed top-k and PowerSGD runs that end with the bits of
   uninterrupted ones. DT_TEST_QUICK=1 (sanitizer and portable builds) leaves out the accuracy run. */
#include "../dtrain.h"
#include "dt_test.h"
#include "train_checks.h"

/* ---- 16-bit floats ---- */

/* The float nearest x among the codes lo and lo + 1 (as decoded by dec), ties to the even code. */
static uint16_t nearest(float x, uint16_t lo, float (*dec)(uint16_t)) {
    double a = fabs((double)x), dl = a - fabs((double)dec(lo)), dh = fabs((double)dec((uint16_t)(lo + 1))) - a;
    return dl < dh || (dl == dh && (lo & 1) == 0) ? lo : (uint16_t)(lo + 1);
}
/* The oracle: the largest positive code not above |x| by bisection over the decoder (codes of positive
   values ascend with their values), then the nearer of it and the next; past the largest finite value
   `top` by half an ulp or more: infinity (inf, the code after top). */
static uint16_t oracle(float x, float (*dec)(uint16_t), uint16_t top, uint16_t inf) {
    double a = fabs((double)x), half_ulp = ((double)dec(top) - (double)dec((uint16_t)(top - 1))) / 2;
    uint16_t lo = 0, hi = top, sign = x < 0 ? 0x8000 : 0, r;
    if (a >= (double)dec(top) + half_ulp) return (uint16_t)(sign | inf);
    while (lo < hi) {   /* largest code with dec(code) <= a */
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if ((double)dec(mid) <= a) lo = mid; else hi = (uint16_t)(mid - 1);
    }
    r = lo == top ? top : nearest(x, lo, dec);
    return (uint16_t)(sign | r);
}

static void check_codec(const char *what, uint16_t (*enc)(float), float (*dec)(uint16_t), uint16_t top, uint16_t inf) {
    dt_rng g;
    uint32_t h, bad = 0;
    int i;
    for (h = 0; h < 65536; h++) {   /* every code but NaN comes back as itself */
        float v = dec((uint16_t)h);
        if (v == v && enc(v) != (uint16_t)h) bad++;
    }
    CHECK(bad == 0);
    dt_rng_init(&g, 11, 0);
    for (i = 0; i < 400000; i++) {   /* random bit patterns: every exponent; then values near ties */
        uint32_t u = dt_rng_u32(&g);
        float x;
        if (i % 2) u = (u & 0xffff0000u) | (i % 4 == 1 ? 0x8000u : 0x7fffu);   /* bf16 ties and near-ties */
        if (i % 8 == 3) u = (u & 0xc7ffffffu) | 0x38000000u;                   /* half's range */
        if (i % 8 == 7) u = (u & 0xc7ffe000u) | 0x38001000u;                   /* half's ties */
        memcpy(&x, &u, sizeof x);
        if (x != x) continue;
        if (enc(x) != oracle(x, dec, top, inf)) {
            if (bad++ < 3) printf("    %s: %.9g (0x%08x) gives 0x%04x, nearest even 0x%04x\n", what, (double)x, (unsigned)u,
                                  (unsigned)enc(x), (unsigned)oracle(x, dec, top, inf));
        }
    }
    CHECK(bad == 0);
    CHECK(dec(enc(NAN)) != dec(enc(NAN)));
}

static void test_half_rounding(void) {
    CHECK(dt_bf16_from_float(1.0f) == 0x3f80 && dt_bf16_to_float(0xc000) == -2.0f);
    CHECK(dt_f16_from_float(1.0f) == 0x3c00 && dt_f16_to_float(0x7bff) == 65504.0f && dt_f16_to_float(1) == ldexpf(1.0f, -24));
    CHECK(dt_f16_from_float(65520.0f) == 0x7c00 && dt_f16_from_float(65519.0f) == 0x7bff);
    CHECK(dt_f16_from_float(ldexpf(1.0f, -25)) == 0 && dt_f16_from_float(ldexpf(1.5f, -25)) == 1);
    CHECK(dt_dtype_size(DT_BF16) == 2 && dt_dtype_size(DT_F16) == 2 && !strcmp(dt_dtype_name(DT_F16), "f16"));
    check_codec("bf16", dt_bf16_from_float, dt_bf16_to_float, 0x7f7f, 0x7f80);
    check_codec("f16", dt_f16_from_float, dt_f16_to_float, 0x7bff, 0x7c00);
}

/* ---- the all-reduce over 16-bit floats ---- */

#define AN 3001           /* elements: not a multiple of any world size, so the ring's chunks differ */
#define MAXR 5

typedef struct ajob {
    dt_dtype t;
    dt_algo algo;
    uint16_t out[MAXR][AN];
    uint64_t sent16[MAXR], sent32[MAXR];
} ajob;

/* rank r's value i: magnitudes from 1e-3 to 1e2 with both signs, so sums cancel and round */
static float aval(int r, int i) {
    dt_rng g;
    dt_rng_init(&g, 17, (uint64_t)(r * AN + i));
    return ((float)dt_rng_u32(&g) / 4294967296.0f - 0.5f) * powf(10.0f, (float)(dt_rng_u32(&g) % 6) - 3.0f);
}

static dt_result a_rank(dt_comm *c, void *arg) {
    ajob *j = (ajob *)arg;
    int me = dt_comm_rank(c), i;
    uint16_t *h = j->out[me];
    float f[AN];
    dt_comm_stats s0, s1, s2;
    dt_result r;
    for (i = 0; i < AN; i++) {
        f[i] = aval(me, i);
        h[i] = j->t == DT_BF16 ? dt_bf16_from_float(f[i]) : dt_f16_from_float(f[i]);
    }
    s0 = dt_comm_get_stats(c);
    if ((r = dt_comm_allreduce(c, h, AN, j->t, DT_SUM, j->algo)) != DT_OK) return r;
    s1 = dt_comm_get_stats(c);
    if ((r = dt_comm_allreduce(c, f, AN, DT_F32, DT_SUM, j->algo == DT_ALGO_NATIVE ? DT_ALGO_RING : j->algo)) != DT_OK) return r;
    s2 = dt_comm_get_stats(c);
    j->sent16[me] = s1.bytes_sent - s0.bytes_sent;
    j->sent32[me] = s2.bytes_sent - s1.bytes_sent;
    return DT_OK;
}

/* Each element within (p - 1) roundings of a partial sum (each at most u times the sum of magnitudes) and
   the rounding of each input of the exact sum; the same bits on every rank; half the bytes of f32 (NATIVE
   runs as RING for 16 bits). Some element must differ from the float sum, or nothing was rounded. */
static void test_allreduce_half(void) {
    static ajob j;
    static const dt_algo algos[] = {DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NAIVE, DT_ALGO_NATIVE};
    int p, a, t, r, i;
    for (t = 0; t < 2; t++)
        for (p = 2; p <= MAXR; p++)
            for (a = 0; a < 4; a++) {
                double u = t == 0 ? ldexp(1.0, -8) : ldexp(1.0, -11), worst = 0.0;
                int rounded = 0;
                float (*dec)(uint16_t) = t == 0 ? dt_bf16_to_float : dt_f16_to_float;
                memset(&j, 0, sizeof j);
                j.t = t == 0 ? DT_BF16 : DT_F16;
                j.algo = algos[a];
                CHECK_OK(tc_launch(a_rank, &j, p));
                for (i = 0; i < AN; i++) {
                    double exact = 0.0, mag = 0.0, got = (double)dec(j.out[0][i]);
                    float f32 = 0.0f;
                    for (r = 0; r < p; r++) {
                        exact += (double)aval(r, i);
                        mag += fabs((double)aval(r, i));
                        f32 += aval(r, i);
                    }
                    for (r = 1; r < p; r++) CHECK(j.out[r][i] == j.out[0][i]);
                    if (fabs(got - exact) / (p * u * mag) > worst) worst = fabs(got - exact) / (p * u * mag);
                    rounded += got != (double)f32;
                }
                if (!(worst <= 1.0))
                    printf("    %s p=%d %s: error %.3g of the bound\n", dt_dtype_name(j.t), p, dt_algo_name(j.algo), worst);
                CHECK(worst <= 1.0);
                CHECK(rounded > AN / 10);
                for (r = 0; r < p; r++) CHECK(j.sent16[r] * 2 == j.sent32[r] && j.sent16[r] > 0);
            }
}

/* The link model charges what is sent: on 2 ranks behind 10 MB/s links, a ring all-reduce of 2^20 elements
   moves 4 MB per rank as f32 (0.4 s) and 2 MB as bf16 (0.2 s). Sleeps dominate, so the bound holds on a
   loaded machine: bf16 under 0.75 of f32's time; under DT_TEST_QUICK (the sanitizers, whose ThreadSanitizer
   build on a loaded machine took 0.44 s for bf16's conversions and sleeps against f32's 0.56 s) under f32's. */
static int quick;   /* DT_TEST_QUICK */
#define LN (1 << 20)
typedef struct ljob { double secs[2]; } ljob;
static dt_result l_rank(dt_comm *c, void *arg) {
    ljob *j = (ljob *)arg;
    static float f[2][LN];
    static uint16_t h[2][LN];
    int me = dt_comm_rank(c);
    double t0;
    dt_result r;
    memset(f[me], 0, sizeof f[me]);
    memset(h[me], 0, sizeof h[me]);
    t0 = dt_time_now();
    if ((r = dt_comm_allreduce(c, f[me], LN, DT_F32, DT_SUM, DT_ALGO_RING)) != DT_OK) return r;
    if (me == 0) j->secs[0] = dt_time_now() - t0;
    t0 = dt_time_now();
    if ((r = dt_comm_allreduce(c, h[me], LN, DT_BF16, DT_SUM, DT_ALGO_RING)) != DT_OK) return r;
    if (me == 0) j->secs[1] = dt_time_now() - t0;
    return DT_OK;
}
static void test_link_model_half(void) {
    ljob j;
    dt_launch_desc ld;
    memset(&j, 0, sizeof j);
    memset(&ld, 0, sizeof ld);
    ld.ranks = 2;
    ld.comm.timeout = 20;
    ld.comm.link_bandwidth = 10e6;
    CHECK_OK(dt_launch_local(&ld, l_rank, &j, NULL));
    printf("    behind 10 MB/s: f32 %.3f s, bf16 %.3f s\n", j.secs[0], j.secs[1]);
    CHECK(j.secs[0] >= 0.35 && j.secs[1] < (quick ? 1.0 : 0.75) * j.secs[0]);
}

/* fp16 sends each rank's share of the average, not its samples times its gradient: gradients of 1024 on 2 ranks
   of 64 samples each travel as 512 (1024 x 64 = 65536 is past fp16's 65504, infinity if sent as it was) and
   arrive as the average, 1024, exactly; bf16 (fp32's range) sends the weighted sum and gets 1024 too. */
typedef struct hjob { dt_ddp_compress kind; float got[2][2]; } hjob;
static dt_result h_rank(dt_comm *c, void *arg) {
    hjob *j = (hjob *)arg;
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_ddp_desc dd;
    int64_t n = 0, i;
    float *g;
    dt_result r = tc_mlp(&m, 4, 3, 1, 0, 6, 0);
    memset(&dd, 0, sizeof dd);
    dd.method = DT_DDP_FLAT;
    dd.compress = j->kind;
    if (r == DT_OK) r = dt_ddp_create(&d, c, m, &dd);
    if (r == DT_OK) {
        g = dt_model_grads(m, &n);
        for (i = 0; i < n; i++) g[i] = 1024.0f;
        r = dt_ddp_sync(d, 64);
        j->got[dt_comm_rank(c)][0] = g[0];
        j->got[dt_comm_rank(c)][1] = g[n - 1];
        for (i = 0; r == DT_OK && i < n; i++)
            if (g[i] != 1024.0f) r = dt_set_error(DT_ERR_NUMERIC, "rank %d: gradient %lld is %g, not 1024", dt_comm_rank(c), (long long)i, (double)g[i]);
    }
    dt_ddp_destroy(d);
    dt_model_destroy(m);
    return r;
}
static void test_half_range(void) {
    static hjob j;
    int k;
    for (k = 0; k < 2; k++) {
        memset(&j, 0, sizeof j);
        j.kind = k ? DT_DDP_BF16 : DT_DDP_FP16;
        CHECK_OK(tc_launch(h_rank, &j, 2));
        CHECK(j.got[0][0] == 1024.0f && j.got[1][1] == 1024.0f);
    }
}

/* ---- top-k ---- */

typedef struct pair { float a; int32_t i; } pair;
static int by_magnitude(const void *x, const void *y) {   /* larger magnitude first, then the lower index */
    const pair *p = (const pair *)x, *q = (const pair *)y;
    if (p->a != q->a) return p->a > q->a ? -1 : 1;
    return p->i < q->i ? -1 : p->i > q->i;
}

static void test_topk_split(void) {
    enum { N = 5000 };
    static float x[N], in[N], val[N], back[N];
    static int32_t idx[N];
    static pair ref[N];
    static const int64_t ks[] = {0, 1, 7, 50, 333, N - 1, N, N + 5};
    dt_rng g;
    int t, q;
    int64_t i;
    dt_rng_init(&g, 3, 0);
    for (t = 0; t < 3; t++)
        for (q = 0; q < (int)(sizeof ks / sizeof ks[0]); q++) {
            int64_t k = ks[q], want = k < N ? k : N, got, bad = 0;
            for (i = 0; i < N; i++) {   /* t = 1: many equal magnitudes of both signs (ties); t = 2: also zeros */
                float v = (float)dt_rng_u32(&g) / 4294967296.0f - 0.5f;
                if (t > 0) v = (float)((int)(v * 16.0f)) / 8.0f;
                in[i] = x[i] = t == 2 && i % 3 == 0 ? 0.0f : v;
                ref[i].a = fabsf(in[i]);
                ref[i].i = (int32_t)i;
            }
            qsort(ref, N, sizeof ref[0], by_magnitude);
            got = dt_topk_split(x, N, k, idx, val);
            CHECK(got == want);
            memcpy(back, x, sizeof x);
            for (i = 0; i < got; i++) {
                bad += i > 0 && idx[i] <= idx[i - 1];      /* ascending */
                bad += x[idx[i]] != 0.0f || val[i] != in[idx[i]];
                back[idx[i]] += val[i];
            }
            CHECK(bad == 0);
            CHECK(memcmp(back, in, sizeof in) == 0);       /* residual + sent = the input, exactly */
            qsort(ref, (size_t)want, sizeof ref[0], by_magnitude);
            for (i = 0; i < want; i++) {                   /* the same set as the sort's first k */
                int32_t *hit = NULL;
                int64_t s;
                for (s = 0; s < got && !hit; s++) if (idx[s] == ref[i].i) hit = &idx[s];
                bad += hit == NULL;
            }
            CHECK(bad == 0);
        }
}

/* ---- DDP with top-k and error feedback, against its emulation ---- */

#define SIN 8
#define SK 3
#define SR 3           /* ranks */
#define SYNCS 3

typedef struct sjob {
    dt_ddp_desc desc;
    int lowrank;         /* 1: every rank's gradient the same, each weight matrix of rank 1 (u v^T) */
    int64_t n;
    float in[SR][SYNCS][256], grads[SR][SYNCS][256], res[SR][SYNCS][256];
    char matrix[256];    /* element i belongs to a weight matrix (every one is compressed at rank 1 here) */
} sjob;

/* rank r's gradient at sync s (set by hand; samples = 2) */
static float sgrad(int r, int s, int64_t i) {
    dt_rng g;
    dt_rng_init(&g, 23, (uint64_t)((r * SYNCS + s) * 1000 + i));
    return (float)dt_rng_u32(&g) / 4294967296.0f - 0.5f;
}

/* Each weight matrix [rows, cols] of g becomes u v^T (u, v from sync s); biases stay. */
static void lowrank(dt_model *m, float *g, int s) {
    int t;
    int64_t a, b;
    for (t = 0; t < dt_model_param_tensors(m); t++) {
        dt_param_info pi = dt_model_param_info(m, t);
        int64_t rows = pi.shape[0], cols = pi.ndim >= 2 ? pi.count / rows : 0;
        for (a = 0; a < rows && cols; a++)
            for (b = 0; b < cols; b++) g[pi.offset + a * cols + b] = sgrad(1, s, a) * sgrad(2, s, b);
    }
}

static dt_result s_rank(dt_comm *c, void *arg) {
    sjob *j = (sjob *)arg;
    int me = dt_comm_rank(c), s;
    int64_t i, n = 0, nr = 0;
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_result r;
    if ((r = tc_mlp(&m, SIN, SK, (uint64_t)me + 1, 0, 6, 0)) != DT_OK) return r;
    if ((r = dt_ddp_create(&d, c, m, &j->desc)) == DT_OK) {
        float *g = dt_model_grads(m, &n);
        if (me == 0) {
            int t;
            j->n = n;
            for (t = 0; t < dt_model_param_tensors(m) && n <= 256; t++) {
                dt_param_info pi = dt_model_param_info(m, t);
                memset(j->matrix + pi.offset, pi.ndim >= 2, (size_t)pi.count);
            }
        }
        for (s = 0; s < SYNCS && r == DT_OK && n <= 256; s++) {
            const float *res;
            for (i = 0; i < n; i++) g[i] = sgrad(j->lowrank ? 0 : me, s, i);
            if (j->lowrank) lowrank(m, g, s);
            memcpy(j->in[me][s], g, sizeof(float) * (size_t)n);
            if ((r = dt_ddp_sync(d, 2)) != DT_OK) break;
            memcpy(j->grads[me][s], g, sizeof(float) * (size_t)n);
            res = dt_ddp_residual(d, &nr);
            if (res && nr == n) memcpy(j->res[me][s], res, sizeof(float) * (size_t)n);
        }
    }
    dt_ddp_destroy(d);
    dt_model_destroy(m);
    return r;
}

/* Every rank's step, emulated: weighted gradient (x 2 samples) + residual, dt_topk_split, the pairs
   summed in rank order, divided by the 6 samples. The bits must match the ranks', the residuals too. */
static void test_ddp_topk_sync(void) {
    static sjob j;
    static float res[SR][256], sum[256], acc[256], val[256];
    static int32_t idx[256];
    int s, r, fb;
    int64_t i, k, n;
    for (fb = 0; fb < 2; fb++) {
        memset(&j, 0, sizeof j);
        j.desc.method = DT_DDP_FLAT;
        j.desc.compress = DT_DDP_TOPK;
        j.desc.topk_ratio = 0.1;
        j.desc.no_feedback = !fb;
        memset(res, 0, sizeof res);
        CHECK_OK(tc_launch(s_rank, &j, SR));
        n = j.n;
        k = (int64_t)ceil(0.1 * (double)n);
        CHECK(n > 0 && n <= 256);
        for (s = 0; s < SYNCS && n <= 256; s++) {
            memset(sum, 0, sizeof sum);
            for (r = 0; r < SR; r++) {
                int64_t kept = 0;
                for (i = 0; i < n; i++) acc[i] = sgrad(r, s, i) * 2.0f + res[r][i];
                CHECK(dt_topk_split(acc, n, k, idx, val) == k);
                for (i = 0; i < k; i++) sum[idx[i]] += val[i];
                for (i = 0; i < n; i++) kept += acc[i] == 0.0f;
                CHECK(kept >= k);
                if (fb) memcpy(res[r], acc, sizeof(float) * (size_t)n);
                CHECK(memcmp(j.res[r][s], res[r], sizeof(float) * (size_t)n) == 0);   /* zeros without feedback */
            }
            for (i = 0; i < n; i++) sum[i] /= (float)(2 * SR);
            for (r = 0; r < SR; r++) CHECK(memcmp(j.grads[r][s], sum, sizeof(float) * (size_t)n) == 0);
        }
    }
}

/* PowerSGD rank 1 on 3 ranks: a gradient of rank-1 matrices, the same on every rank, comes back as itself
   (each rank's projection is exact); for full-rank gradients, the residual is what the average left of this
   rank's input, to rounding (residual + result = input, the units: samples = 2 per rank, 6 in all), and
   without feedback it stays 0. */
static void test_powersgd_sync(void) {
    static sjob j;
    int s, r, fb;
    int64_t i, n;
    memset(&j, 0, sizeof j);
    j.desc.method = DT_DDP_FLAT;
    j.desc.compress = DT_DDP_POWERSGD;
    j.desc.powersgd_rank = 1;
    j.lowrank = 1;
    CHECK_OK(tc_launch(s_rank, &j, SR));
    n = j.n;
    CHECK(n > 0 && n <= 256);
    for (s = 0; s < SYNCS && n <= 256; s++)
        for (r = 0; r < SR; r++) CHECK_CLOSE(j.grads[r][s], j.in[0][s], n, 1e-5, "rank-1 gradients through PowerSGD rank 1");
    for (fb = 0; fb < 2; fb++) {
        double worst = 0.0, big = 0.0;
        memset(&j, 0, sizeof j);
        j.desc.method = DT_DDP_BUCKETS;
        j.desc.bucket_bytes = 64;
        j.desc.compress = DT_DDP_POWERSGD;
        j.desc.powersgd_rank = 1;
        j.desc.no_feedback = !fb;
        CHECK_OK(tc_launch(s_rank, &j, SR));
        for (s = 0; s < SYNCS && n <= 256; s++)
            for (r = 0; r < SR; r++)
                for (i = 0; i < n; i++) {   /* M = 2 g + the last residual; residual = M - 2 * result (P Q^T / 3) */
                    if (!j.matrix[i]) { worst = j.res[r][s][i] != 0.0f ? 1e30 : worst; continue; }
                    double M = 2.0 * j.in[r][s][i] + (fb && s ? j.res[r][s - 1][i] : 0.0);
                    double e = fb ? fabs(j.res[r][s][i] - (M - 2.0 * j.grads[r][s][i])) : fabs(j.res[r][s][i]);
                    worst = e > worst ? e : worst;
                    big = fabs(M) > big ? fabs(M) : big;
                }
        CHECK(worst <= 1e-5 * big);
        CHECK(memcmp(j.grads[0], j.grads[1], sizeof j.grads[0]) == 0 && memcmp(j.grads[0], j.grads[2], sizeof j.grads[0]) == 0);
    }
}

/* ---- accuracy: fp32, top-k 1% with and without error feedback ---- */

#define CIN 32
#define CK 10
#define CN 2048        /* training samples; as many for the test */
#define CB 64          /* global batch */
#define CEPOCHS 30
static float CX[2 * CN * CIN];
static int32_t CY[2 * CN];

/* Labels from a fixed random linear teacher (argmax of W x), so an MLP can learn them well. */
static void make_teacher_data(void) {
    static float w[CK * CIN];
    dt_rng g;
    int64_t i, c, f;
    dt_rng_init(&g, 29, 0);
    for (i = 0; i < CK * CIN; i++) w[i] = (float)dt_rng_u32(&g) / 4294967296.0f - 0.5f;
    for (i = 0; i < 2 * CN; i++) {
        float best = -1e30f;
        for (f = 0; f < CIN; f++) CX[i * CIN + f] = (float)dt_rng_u32(&g) / 4294967296.0f * 2.0f - 1.0f;
        for (c = 0; c < CK; c++) {
            float z = 0.0f;
            for (f = 0; f < CIN; f++) z += w[c * CIN + f] * CX[i * CIN + f];
            if (z > best) { best = z; CY[i] = (int32_t)c; }
        }
    }
}

typedef struct cjob {
    dt_ddp_desc desc;
    double acc;      /* rank 0: test accuracy at the end */
    uint64_t sent;   /* rank 0: bytes sent */
} cjob;

/* The MLP of these runs, its SGD with momentum, and its DDP. */
static dt_result make_trio(dt_comm *c, const dt_ddp_desc *desc, dt_model **m, dt_optim **o, dt_ddp **d) {
    dt_optim_desc od;
    dt_result r;
    memset(&od, 0, sizeof od);
    od.lr = 0.1f; od.momentum = 0.9f;
    if ((r = tc_mlp(m, CIN, CK, (uint64_t)dt_comm_rank(c) + 1, 0, 64, 0)) != DT_OK) return r;
    if ((r = dt_optim_create(o, *m, &od)) != DT_OK) return r;
    return dt_ddp_create(d, c, *m, desc);
}
static void free_trio(dt_model *m, dt_optim *o, dt_ddp *d) {
    dt_ddp_destroy(d);
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

/* Steps from..to-1 with global batches of CB training samples, in order, round and round. */
static dt_result train_steps(dt_comm *c, dt_ddp *d, dt_model *m, dt_optim *o, int64_t from, int64_t to) {
    int64_t s, share = CB / dt_comm_size(c);
    float loss;
    dt_result r = DT_OK;
    for (s = from; s < to && r == DT_OK; s++) {
        int64_t first = (s % (CN / CB)) * CB + dt_comm_rank(c) * share;
        if ((r = dt_model_forward(m, CX + first * CIN, share)) == DT_OK && (r = dt_model_loss_labels(m, CY + first, &loss)) == DT_OK &&
            (r = dt_ddp_backward(d, NULL, share, 1)) == DT_OK && (r = dt_optim_step(o)) == DT_OK) dt_model_zero_grad(m);
    }
    return r;
}

static dt_result c_rank(dt_comm *c, void *arg) {
    cjob *j = (cjob *)arg;
    int64_t correct = 0, i;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_result r = make_trio(c, &j->desc, &m, &o, &d);
    if (r == DT_OK) r = train_steps(c, d, m, o, 0, CEPOCHS * (CN / CB));
    dt_model_set_mode(m, DT_MODE_EVAL);
    for (i = 0; i < CN && r == DT_OK && dt_comm_rank(c) == 0; i += 256) {
        int64_t got = 0;
        if ((r = dt_model_forward(m, CX + (CN + i) * CIN, 256)) == DT_OK) r = dt_model_count_correct(m, CY + CN + i, &got);
        correct += got;
    }
    if (dt_comm_rank(c) == 0) {
        j->acc = (double)correct / CN;
        j->sent = dt_comm_get_stats(c).bytes_sent;
    }
    free_trio(m, o, d);
    return r;
}

/* 30 epochs of 32 steps on 2 ranks (an MLP of 2762 parameters; fp32 reaches about 0.89 on this teacher,
   top-k 1% with feedback 0.885, without it 0.71, PowerSGD rank 2 0.876): top-k 1% (28 entries a step) and
   PowerSGD rank 2 with error feedback within 0.03 of fp32, bf16 within 0.01, and top-k 1% without feedback
   more than 0.1 below fp32. Top-k sends (4 + 4) bytes for each of its k, a twentieth of fp32's bytes or
   less; bf16 a little over half (the two counts go as floats); PowerSGD under a fifth (its Ps and Qs, and
   the biases as they are). Deterministic: the bands only absorb another CPU tier's rounding. */
static void test_accuracy_band(void) {
    cjob fp, bf, tk, nf, ps;
    memset(&fp, 0, sizeof fp); memset(&bf, 0, sizeof bf); memset(&tk, 0, sizeof tk); memset(&nf, 0, sizeof nf);
    memset(&ps, 0, sizeof ps);
    fp.desc.method = bf.desc.method = tk.desc.method = nf.desc.method = ps.desc.method = DT_DDP_FLAT;
    ps.desc.compress = DT_DDP_POWERSGD;
    bf.desc.compress = DT_DDP_BF16;
    tk.desc.compress = nf.desc.compress = DT_DDP_TOPK;
    nf.desc.no_feedback = 1;
    CHECK_OK(tc_launch(c_rank, &fp, 2));
    CHECK_OK(tc_launch(c_rank, &bf, 2));
    CHECK_OK(tc_launch(c_rank, &tk, 2));
    CHECK_OK(tc_launch(c_rank, &nf, 2));
    CHECK_OK(tc_launch(c_rank, &ps, 2));
    printf("    accuracy: fp32 %.3f, bf16 %.3f, top-k 1%% with feedback %.3f, without %.3f, powersgd rank 2 %.3f; bytes sent "
           "%llu, %llu, %llu, %llu\n", fp.acc, bf.acc, tk.acc, nf.acc, ps.acc, (unsigned long long)fp.sent,
           (unsigned long long)bf.sent, (unsigned long long)tk.sent, (unsigned long long)ps.sent);
    CHECK(fp.acc > 0.8);
    CHECK(fabs(bf.acc - fp.acc) <= 0.01);
    CHECK(fabs(tk.acc - fp.acc) <= 0.03);
    CHECK(nf.acc < fp.acc - 0.1);
    CHECK(tk.sent * 20 <= fp.sent && bf.sent * 100 <= fp.sent * 51);
    CHECK(fabs(ps.acc - fp.acc) <= 0.03);
    CHECK(ps.sent * 5 <= fp.sent);
}

/* ---- resume keeps the residual ---- */

#define RSTEPS 6
typedef struct rjob {
    dt_ddp_desc desc;
    int stop;            /* 0: run all steps; k: save after step k, then a fresh model, load and go on */
    int load_only;       /* 1: only load path (2: without the optimizer) */
    const char *path;
    float params[2][4096];
    float res[2][4096];  /* the residual as saved (stop), or as loaded (load_only) */
    int64_t n;
} rjob;

static void keep_residual(const dt_ddp *d, float *out) {
    int64_t n = 0;
    const float *res = dt_ddp_residual(d, &n);
    if (res && n <= 4096) memcpy(out, res, sizeof(float) * (size_t)n);
}

static dt_result r_rank(dt_comm *c, void *arg) {
    rjob *j = (rjob *)arg;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_result r = make_trio(c, &j->desc, &m, &o, &d);
    if (r == DT_OK && j->load_only) r = dt_ddp_load(d, j->path, j->load_only == 2 ? NULL : o, NULL);
    if (r == DT_OK && j->load_only) keep_residual(d, j->res[dt_comm_rank(c)]);
    if (r == DT_OK && j->stop) {
        if ((r = train_steps(c, d, m, o, 0, j->stop)) == DT_OK) r = dt_ddp_save(d, j->path, o, NULL);
        keep_residual(d, j->res[dt_comm_rank(c)]);
        free_trio(m, o, d);
        m = NULL; o = NULL; d = NULL;
        if (r == DT_OK && (r = make_trio(c, &j->desc, &m, &o, &d)) == DT_OK) r = dt_ddp_load(d, j->path, o, NULL);
    }
    if (r == DT_OK && !j->load_only) r = train_steps(c, d, m, o, j->stop, RSTEPS);
    if (dt_comm_rank(c) == 0) j->n = dt_model_param_count(m);
    if (r == DT_OK && dt_model_param_count(m) <= 4096) r = dt_model_get_params(m, j->params[dt_comm_rank(c)], dt_model_param_count(m));
    free_trio(m, o, d);
    return r;
}

/* Top-k with feedback, and PowerSGD, stopped after step 3, saved and resumed, end with the uninterrupted
   run's bits (the residual, and PowerSGD's Qs, travel in the checkpoint: without them the steps after
   resume send other values). */
static void test_resume_residual(void) {
    static rjob full, resumed;
    const char *path = "build/test_compress.ckpt";
    int kind;
    for (kind = 0; kind < 2; kind++) {
        memset(&full, 0, sizeof full);
        full.desc.compress = kind ? DT_DDP_POWERSGD : DT_DDP_TOPK;
        full.path = path;
        resumed = full;
        resumed.stop = 3;
        remove(path);
        CHECK_OK(tc_launch(r_rank, &full, 2));
        CHECK_OK(tc_launch(r_rank, &resumed, 2));
        CHECK(full.n > 0 && full.n <= 4096);
        CHECK(memcmp(full.params, resumed.params, sizeof full.params) == 0);
    }
    remove(path);
}

/* PowerSGD's warm-up (powersgd_warmup, PyTorch's start_powerSGD_iter): with a warm-up of all 6 steps the run
   ends with fp32's bits; with 3 it follows fp32 for 3 steps and then PowerSGD (neither fp32's bits nor those
   of PowerSGD from the first step); stopped after step 2 (in the warm-up) or 4 (after it), saved and resumed,
   it ends with the uninterrupted run's bits: the checkpoint keeps the count of syncs. */
static void test_powersgd_warmup(void) {
    static rjob fp32, all, none, three, resumed;
    const char *path = "build/test_compress_warmup.ckpt";
    int stop;
    memset(&fp32, 0, sizeof fp32);
    fp32.path = path;
    all = fp32;
    all.desc.compress = DT_DDP_POWERSGD;
    all.desc.powersgd_rank = 1;
    none = all;
    three = all;
    all.desc.powersgd_warmup = RSTEPS;
    three.desc.powersgd_warmup = 3;
    CHECK_OK(tc_launch(r_rank, &fp32, 2));
    CHECK_OK(tc_launch(r_rank, &all, 2));
    CHECK_OK(tc_launch(r_rank, &none, 2));
    CHECK_OK(tc_launch(r_rank, &three, 2));
    CHECK(fp32.n > 0 && fp32.n <= 4096);
    CHECK(memcmp(all.params, fp32.params, sizeof fp32.params) == 0);
    CHECK(memcmp(three.params, fp32.params, sizeof fp32.params) != 0);
    CHECK(memcmp(three.params, none.params, sizeof fp32.params) != 0);
    for (stop = 2; stop <= 4; stop += 2) {
        resumed = three;
        resumed.stop = stop;
        remove(path);
        CHECK_OK(tc_launch(r_rank, &resumed, 2));
        CHECK(memcmp(resumed.params, three.params, sizeof three.params) == 0);
    }
    remove(path);
}

/* A checkpoint with a residual is refused by a run that keeps none (bf16), naming the cause; a top-k run
   loads it, the residual as saved, also without loading the optimizer. */
static void test_resume_mismatch(void) {
    static rjob w, rd;
    const char *path = "build/test_compress_mismatch.ckpt";
    memset(&w, 0, sizeof w);
    w.desc.compress = DT_DDP_TOPK;
    w.path = path;
    w.stop = 1;
    rd = w;
    rd.stop = 0;
    rd.load_only = 1;
    rd.desc.compress = DT_DDP_BF16;
    remove(path);
    CHECK_OK(tc_launch(r_rank, &w, 2));
    CHECK_ERR(tc_launch(r_rank, &rd, 2), DT_ERR_FORMAT);
    CHECK(strstr(dt_last_error(), "--compress") != NULL);
    rd.desc.compress = DT_DDP_TOPK;
    CHECK_OK(tc_launch(r_rank, &rd, 2));
    CHECK(memcmp(rd.res, w.res, sizeof w.res) == 0);
    memset(rd.res, 0, sizeof rd.res);
    rd.load_only = 2;   /* without the optimizer: the residual after the optimizer's part is found all the same */
    CHECK_OK(tc_launch(r_rank, &rd, 2));
    CHECK(memcmp(rd.res, w.res, sizeof w.res) == 0);
    remove(path);
}

/* ---- bad settings ---- */

static dt_result bad_rank(dt_comm *c, void *arg) {
    dt_ddp_desc *desc = (dt_ddp_desc *)arg;
    dt_model *m = NULL;
    dt_ddp *d = NULL;
    dt_result r = tc_mlp(&m, SIN, SK, 1, 0, 6, 0);
    if (r == DT_OK) r = dt_ddp_create(&d, c, m, desc);
    dt_ddp_destroy(d);
    dt_model_destroy(m);
    return r;
}

static void test_bad_settings(void) {
    dt_ddp_desc desc;
    dt_ddp_compress k = DT_DDP_FP32;
    double ratio = -1.0;
    memset(&desc, 0, sizeof desc);
    desc.compress = DT_DDP_BF16;
    desc.method = DT_DDP_PARAM_SERVER;
    CHECK_ERR(tc_launch(bad_rank, &desc, 2), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "--sync") != NULL);
    desc.method = DT_DDP_BUCKETS;
    desc.compress = DT_DDP_TOPK;
    desc.topk_ratio = 1.5;
    CHECK_ERR(tc_launch(bad_rank, &desc, 2), DT_ERR_INVALID_ARG);
    desc.topk_ratio = 0.0;
    desc.compress = (dt_ddp_compress)9;
    CHECK_ERR(tc_launch(bad_rank, &desc, 2), DT_ERR_INVALID_ARG);
    CHECK_OK(dt_ddp_compress_parse("topk:0.05", &k, &ratio));
    CHECK(k == DT_DDP_TOPK && ratio == 0.05);
    CHECK_OK(dt_ddp_compress_parse("bf16", &k, &ratio));
    CHECK(k == DT_DDP_BF16 && ratio == 0.0);
    CHECK_ERR(dt_ddp_compress_parse("bf16:0.5", &k, &ratio), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_compress_parse("topk:0", &k, &ratio), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_compress_parse("topk:2", &k, &ratio), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_compress_parse("topk:x", &k, &ratio), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_compress_parse("int8", &k, &ratio), DT_ERR_INVALID_ARG);
    CHECK_OK(dt_ddp_compress_parse("powersgd:4", &k, &ratio));
    CHECK(k == DT_DDP_POWERSGD && ratio == 4.0);
    CHECK_ERR(dt_ddp_compress_parse("powersgd:1.5", &k, &ratio), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_ddp_compress_parse("powersgd:0", &k, &ratio), DT_ERR_INVALID_ARG);
    desc.compress = DT_DDP_POWERSGD;
    desc.powersgd_rank = -1;
    CHECK_ERR(tc_launch(bad_rank, &desc, 2), DT_ERR_INVALID_ARG);
    desc.powersgd_rank = 0;
    desc.powersgd_warmup = -1;   /* a warm-up is >= 0, and PowerSGD's */
    CHECK_ERR(tc_launch(bad_rank, &desc, 2), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "powersgd_warmup") != NULL);
    desc.powersgd_warmup = 5;
    desc.compress = DT_DDP_TOPK;
    CHECK_ERR(tc_launch(bad_rank, &desc, 2), DT_ERR_INVALID_ARG);
    CHECK(!strcmp(dt_ddp_compress_name(DT_DDP_FP16), "fp16"));
}

int main(int argc, char **argv) {
    const char *q = getenv("DT_TEST_QUICK");
    quick = q && *q && strcmp(q, "0") != 0;
    if (argc > 1) dt_t_only = argv[1];
    dt_log_configure(NULL, NULL, DT_LOG_ERROR);
    make_teacher_data();
    RUN(test_half_rounding);
    RUN(test_allreduce_half);
    RUN(test_half_range);
    RUN(test_link_model_half);
    RUN(test_topk_split);
    RUN(test_ddp_topk_sync);
    RUN(test_powersgd_sync);
    if (quick) dt_t_skip("test_accuracy_band", "DT_TEST_QUICK (the sanitizer and portable builds): 3840 steps are the plain build's");
    else RUN(test_accuracy_band);
    RUN(test_resume_residual);
    RUN(test_powersgd_warmup);
    RUN(test_resume_mismatch);
    RUN(test_bad_settings);
    return dt_t_summary();
}
