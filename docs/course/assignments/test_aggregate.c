/* test_aggregate.c - the harness of assignment 3 (aggregate.md): student_trimmed_mean and student_krum against
   dt_fed_aggregate (DT_FED_TRIMMED, DT_FED_KRUM) on the updates of 1 to 30 clients: random values whose sums
   round differently in different orders, columns full of ties, a Byzantine client far from the others, and
   clients sending identical updates (Krum's ties); with sample counts as weights, which both aggregators ignore.
   A group passes when every case in it gives the library's bits in every coordinate (and for Krum the library's
   client), and refuses (DT_ERR_INVALID_ARG) exactly the cases the library refuses, leaving out as it was. A
   group that differs names the case, the coordinate and both values. Aggregation is local: no ranks, no traffic.
   usage: test_aggregate          (make assignment-test A=aggregate builds and runs it) */
#include <math.h>
#include "assignments.h"
#include "harness.h"

#define MAXN   30
#define MAXLEN 1000

enum { RANDOM = 0, TIES, OUTLIER, TWINS, CANCEL, KINDS };
static const char *const kind_names[KINDS] = {"random values", "ties (values -2 .. 2)", "a Byzantine client (x 1000)",
                                              "identical twins (clients 2i and 2i + 1)",
                                              "cancellation (-2^61, 2^8, 2^60, 2^60 and +-2^62, shuffled)"};

static float data[MAXN][MAXLEN];
static const float *updates[MAXN];
static double weights[MAXN];

/* n clients' updates of len, of the kind; weights: sample counts 1 .. 100 */
static void make_updates(int kind, int n, int64_t len, uint64_t seed) {
    dt_rng g;
    int i;
    int64_t j;
    dt_rng_init(&g, 36, seed);
    for (i = 0; i < n; i++) {
        for (j = 0; j < len; j++) {
            if (kind == TIES) data[i][j] = (float)((int)(dt_rng_u32(&g) % 5u) - 2);   /* 0 is +0: no -0 anywhere */
            else data[i][j] = h_value(&g);
        }
        if (kind == TWINS && i % 2 == 1) memcpy(data[i], data[i - 1], sizeof(float) * (size_t)len);
        updates[i] = data[i];
        weights[i] = (double)(1 + dt_rng_u32(&g) % 100u);
    }
    if (kind == OUTLIER) for (j = 0; j < len; j++) data[n / 2][j] *= 1000.0f;
    /* Sums of a few floats in double are almost always exact, so any order gives the same bits; these columns are
       not: ascending, -2^61 + 2^8 + 2^60 + 2^60 is 2^8 in double, descending 0 (2^61 + 2^8 rounds to 2^61). The
       -2^62 and 2^62 around them are what trimming cuts; each column's values go to the clients in a random order. */
    if (kind == CANCEL && n >= 4)
        for (j = 0; j < len; j++) {
            float v[MAXN];
            v[0] = -2305843009213693952.0f; v[1] = 256.0f; v[2] = v[3] = 1152921504606846976.0f;   /* -2^61, 2^8, 2^60 */
            for (i = 4; i < n; i++) v[i] = i % 2 ? 4611686018427387904.0f : -4611686018427387904.0f;   /* +-2^62 */
            for (i = n - 1; i > 0; i--) {   /* Fisher-Yates */
                int k = (int)(dt_rng_u32(&g) % (uint32_t)(i + 1));
                float x = v[i]; v[i] = v[k]; v[k] = x;
            }
            for (i = 0; i < n; i++) data[i][j] = v[i];
        }
}

/* Whether out [len] still holds the "not written" mark everywhere. */
static int untouched(const float *out, int64_t len) {
    int64_t j;
    for (j = 0; j < len; j++) if (h_bits(out[j]) != h_bits(h_unwritten())) return 0;
    return 1;
}

/* One case of either aggregator (krum: f, else trim); 1 when it matches, else 0 with why in err [cap]. */
static int one_case(int krum, int n, int64_t len, float trim, int f, char *err, size_t cap) {
    static float want[MAXLEN], got[MAXLEN];
    dt_fed_agg_desc a;
    int kept[MAXN], chosen = -7, lib_chosen = -1, i;
    int64_t j, first, diff;
    dt_result rl, rs;
    char lib_msg[256], vals[160];
    memset(&a, 0, sizeof a);
    a.kind = krum ? DT_FED_KRUM : DT_FED_TRIMMED;
    a.trim = trim;
    a.f = f;
    for (j = 0; j < len; j++) want[j] = got[j] = h_unwritten();
    rl = dt_fed_aggregate(&a, updates, weights, n, len, want, kept);
    snprintf(lib_msg, sizeof lib_msg, "%s", dt_last_error());
    rs = krum ? student_krum(updates, n, len, f, got, &chosen) : student_trimmed_mean(updates, n, len, trim, got);
    if (rl != DT_OK) {
        if (rs != DT_ERR_INVALID_ARG) {
            snprintf(err, cap, "the library refuses it (%s), your function returned %s", lib_msg, dt_result_str(rs));
            return 0;
        }
        if (!untouched(got, len) || (krum && chosen != -7)) {
            snprintf(err, cap, "your function refused it, as the library does, but wrote to %s", krum && chosen != -7 ? "chosen" : "out");
            return 0;
        }
        return 1;
    }
    if (rs != DT_OK) {
        char why[300];
        snprintf(err, cap, "your function returned %s where the library aggregates", h_why(why, sizeof why, rs, dt_last_error()));
        return 0;
    }
    if (krum) {
        for (i = 0; i < n; i++) if (kept[i]) lib_chosen = i;
        if (chosen != lib_chosen) {
            if (chosen == -7) snprintf(err, cap, "expected client %d, got none (*chosen was not written)", lib_chosen);
            else snprintf(err, cap, "expected client %d, got client %d", lib_chosen, chosen);
            return 0;
        }
    }
    if ((diff = h_diff(want, got, len, &first)) != 0) {
        h_values(vals, sizeof vals, want[first], got[first]);
        snprintf(err, cap, "coordinate %lld: %s (%lld of %lld coordinates differ)", (long long)first, vals, (long long)diff,
                 (long long)len);
        return 0;
    }
    return 1;
}

int main(void) {
    static const int clients[] = {1, 2, 3, 4, 5, 7, 10, 11, 20, 30};   /* 20: 0.45f * 20 is 9 in float, 8.99.. in double */
    static const float trims[] = {0.0f, 0.1f, 0.2f, 0.25f, 0.3f, 0.45f, 0.5f, -0.1f};
    static const int64_t lens[] = {1, 17, MAXLEN};
    static const int krum_nf[][2] = {{3, 0}, {4, 0}, {5, 1}, {6, 1}, {7, 2}, {10, 3}, {11, 1}, {30, 5},
                                     {2, 0}, {4, 1}, {6, 2}, {8, -2}};   /* the last four: refused */
    int kind, c, t, l, refused, cases, ok;
    char err[512];
    for (kind = 0; kind < KINDS; kind++)
        for (c = 0; c < (int)(sizeof clients / sizeof clients[0]); c++) {
            int n = clients[c];
            ok = 1; cases = refused = 0;
            for (l = 0; l < (int)(sizeof lens / sizeof lens[0]) && ok; l++) {
                make_updates(kind, n, lens[l], (uint64_t)(kind * 1000 + n));
                for (t = 0; t < (int)(sizeof trims / sizeof trims[0]) && ok; t++) {
                    int cut = (int)floor((double)trims[t] * (double)n);
                    ok = one_case(0, n, lens[l], trims[t], 0, err, sizeof err);
                    if (!ok) h_report(0, "trimmed mean, %s, n=%d len=%lld trim=%g: %s", kind_names[kind], n, (long long)lens[l],
                                      (double)trims[t], err);
                    cases++;
                    refused += trims[t] < 0.0f || trims[t] >= 0.5f || 2 * cut >= n;
                }
            }
            if (ok) h_report(1, "trimmed mean, %s, n=%d: %d cases (trim, len) with the library's bits, %d of them refused by both",
                             kind_names[kind], n, cases, refused);
        }
    for (kind = 0; kind < KINDS; kind++) {
        ok = 1; cases = refused = 0;
        for (c = 0; c < (int)(sizeof krum_nf / sizeof krum_nf[0]) && ok; c++)
            for (l = 0; l < (int)(sizeof lens / sizeof lens[0]) && ok; l++) {
                int n = krum_nf[c][0], f = krum_nf[c][1];
                make_updates(kind, n, lens[l], (uint64_t)(kind * 1000 + 100 + n));
                ok = one_case(1, n, lens[l], 0.0f, f, err, sizeof err);
                if (!ok) h_report(0, "Krum, %s, n=%d f=%d len=%lld: %s", kind_names[kind], n, f, (long long)lens[l], err);
                cases++;
                refused += f < 0 || n < 2 * f + 3;
            }
        if (ok) h_report(1, "Krum, %s: %d cases (n, f, len) choose the library's client, %d of them refused by both",
                         kind_names[kind], cases, refused);
    }
    return h_end("test_aggregate");
}
