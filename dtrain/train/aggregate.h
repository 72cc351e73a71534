/* dtrain/train/aggregate.h - FedAvg's aggregators: pure functions over the clients' updates.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_fed_aggregate: the sample-weighted mean, coordinate-wise median and trimmed mean, Krum and
     Multi-Krum, and the class-mean check, over flat float vectors, testable without ranks; dt_dp_epsilon and
     dt_dp_rdp: the privacy accountant of DP-FedAvg (RDP of the sampled Gaussian mechanism).
   READ FIRST
     dt__fed_aggregate.
   USES
     dtrain/comm/comm.h (its enum name helpers), and what it includes.
*/
#ifndef DTRAIN_AGGREGATE_H
#define DTRAIN_AGGREGATE_H
#include "../comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- FedAvg: the aggregators ------------------------------------------------------------------ */

/* Federated averaging (McMahan et al. 2017) with robust aggregation. The server's aggregation is a pure
   function over flat float vectors (one update per client), so it is testable without ranks:
     MEAN       sum_i w_i u_i / sum_i w_i, the weights being the clients' sample counts (FedAvg)
     MEDIAN     coordinate-wise median (the mean of the two middle values when n is even)
     TRIMMED    coordinate-wise trimmed mean: t = floor(trim * n) smallest and t largest values dropped;
                refused when 2 t >= n
     KRUM       the update whose summed squared distance to its n - f - 2 nearest others is smallest
                (Blanchard et al. 2017); refused when n < 2 f + 3, Krum's minimum-client condition
     MULTIKRUM  the plain mean of the m updates of lowest Krum score (m = n - f by default); same condition
     CLASSMEAN  the class-mean check: the rows of the final linear layer's weight update, one per class, are
                compared across clients. For class c, d_c(i) = ||row_c(u_i) - coordinate median over clients
                of row_c|| and s_c = median over i of d_c(i); client i is an outlier when d_c(i) > k s_c for
                some class c. The others are averaged as MEAN. A label-flipping client moves the rows of the
                classes it flips, which honest clients leave alike. Needs n >= 3.
   Ties are broken by the lower client index, so the result is deterministic. */
typedef enum dt_fed_agg {
    DT_FED_MEAN = 0, DT_FED_MEDIAN, DT_FED_TRIMMED, DT_FED_KRUM, DT_FED_MULTIKRUM, DT_FED_CLASSMEAN, DT_FED_AGG_COUNT
} dt_fed_agg;
const char *dt_fed_agg_name(dt_fed_agg k);   /* "mean", "median", "trimmed", "krum", "multikrum", "classmean" */
dt_result   dt_fed_agg_parse(const char *s, dt_fed_agg *out);

/* Aggregator settings; zero means the default, except for trim and f, where 0 is a request (DT_DEFAULT in
   base.h asks for the default). */
typedef struct dt_fed_agg_desc {
    dt_fed_agg kind;           /* the aggregator (default DT_FED_MEAN) */
    float   trim;              /* TRIMMED: fraction cut at each end, in [0, 0.5) (0: none, the unweighted mean); DT_DEFAULT: 0.1 */
    int     f;                 /* KRUM, MULTIKRUM: Byzantine clients tolerated, >= 0 (0: none); DT_DEFAULT: 1 */
    int     m;                 /* MULTIKRUM: updates averaged (0 = n - f) */
    float   k;                 /* CLASSMEAN: outlier threshold in median distances (default 3) */
    int64_t cm_offset;         /* CLASSMEAN: the final linear weight [cm_rows classes, cm_cols] inside each */
    int64_t cm_rows, cm_cols;  /*   update (dt_fed fills these from the model) */
} dt_fed_agg_desc;

/* Aggregates n updates, each updates[i][0..len), into out[len] with the aggregator desc->kind (out may not
   alias an update); kept [n] (may be NULL) receives 1 for each client whose update entered the result, 0 for
   the others (all 1 for MEAN, MEDIAN and TRIMMED). weights [n] (sample counts, > 0) are used by MEAN and
   CLASSMEAN; NULL means equal weights. Allocates scratch of n * (n + len) doubles at most (Krum's
   distances, a column for the median). desc may be NULL: the weighted mean. */
dt_result dt_fed_aggregate(const dt_fed_agg_desc *desc, const float *const *updates, const double *weights, int n,
                           int64_t len, float *out, int *kept);

/* ---- DP-FedAvg: the privacy accountant ------------------------------------------------------- */

/* Renyi DP of the sampled Gaussian mechanism (Mironov, Talwar and Zhang 2019, Section 3.3: each record, here
   each client, is in a step with probability q, and the sum of the clipped contributions gets Gaussian noise
   of noise_multiplier times the clipping norm). dt_dp_rdp: one step's RDP at order (> 1; integer orders
   exactly, fractional ones by the series of the paper); q in [0, 1], noise_multiplier > 0 (0: infinity).
   dt_dp_epsilon: the epsilon of `steps` such steps for delta, minimised over the orders 1.1, 1.2, ..., 10.9
   and 12 ... 63 (Opacus's) with the conversion of Balle et al. 2020 (Theorem 21): eps = steps rdp(a) -
   (log delta + log a) / (a - 1) + log((a - 1) / a), at least 0; *best_order (may be NULL) gets the order. The same
   numbers as Opacus's RDPAccountant and dp_accounting's. */
double dt_dp_rdp(double q, double noise_multiplier, double order);
double dt_dp_epsilon(double q, double noise_multiplier, int64_t steps, double delta, double *best_order);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_AGGREGATE_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_AGGREGATE_IMPLEMENTATION_DONE)
#define DTRAIN_AGGREGATE_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

static const char *const dt__fed_agg_names[DT_FED_AGG_COUNT] = {"mean", "median", "trimmed", "krum", "multikrum", "classmean"};
const char *dt_fed_agg_name(dt_fed_agg k) { return dt__enum_name(dt__fed_agg_names, DT_FED_AGG_COUNT, (int)k); }

dt_result dt_fed_agg_parse(const char *s, dt_fed_agg *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__fed_agg_names, DT_FED_AGG_COUNT, s, &k, "aggregator");
    if (r == DT_OK && out) *out = (dt_fed_agg)k;
    return r;
}

/* Insertion sort: the columns are as short as the number of clients, and it is stable. */
static void dt__fed_sort(double *v, int n) {
    int i, j;
    for (i = 1; i < n; i++) {
        double x = v[i];
        for (j = i - 1; j >= 0 && v[j] > x; j--) v[j + 1] = v[j];
        v[j + 1] = x;
    }
}

static double dt__fed_median_sorted(const double *v, int n) {
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* out = sum over the kept clients of (w_i / W) u_i, in client order (kept NULL = all). */
static void dt__fed_mean(const float *const *u, const double *w, const int *kept, int n, int64_t len, float *out) {
    double total = 0.0;
    int i;
    int64_t j;
    for (i = 0; i < n; i++) if (!kept || kept[i]) total += w ? w[i] : 1.0;
    for (j = 0; j < len; j++) out[j] = 0.0f;
    for (i = 0; i < n; i++) {
        float s;
        if (kept && !kept[i]) continue;
        s = (float)((w ? w[i] : 1.0) / total);
        for (j = 0; j < len; j++) out[j] += s * u[i][j];
    }
}

/* Coordinate-wise median (t < 0) or mean of the sorted column without its t lowest and t highest. */
static void dt__fed_columns(const float *const *u, int n, int64_t len, int t, double *col, float *out) {
    int64_t j;
    int i;
    for (j = 0; j < len; j++) {
        double s = 0.0;
        for (i = 0; i < n; i++) col[i] = u[i][j];
        dt__fed_sort(col, n);
        if (t < 0) { out[j] = (float)dt__fed_median_sorted(col, n); continue; }
        for (i = t; i < n - t; i++) s += col[i];
        out[j] = (float)(s / (double)(n - 2 * t));
    }
}

/* Krum scores: score[i] = sum of the n - f - 2 smallest squared distances from u_i to the others; order
   gets the clients by increasing score (ties: lower index first). dist [n * n], tmp [n]. */
static void dt__fed_krum(const float *const *u, int n, int64_t len, int f, double *dist, double *tmp, double *score,
                         int *order) {
    int i, k, c = n - f - 2;
    int64_t j;
    for (i = 0; i < n; i++) {
        dist[i * n + i] = 0.0;
        for (k = i + 1; k < n; k++) {
            double s = 0.0;
            for (j = 0; j < len; j++) { double d = (double)u[i][j] - (double)u[k][j]; s += d * d; }
            dist[i * n + k] = dist[k * n + i] = s;
        }
    }
    for (i = 0; i < n; i++) {
        double s = 0.0;
        int m = 0;
        for (k = 0; k < n; k++) if (k != i) tmp[m++] = dist[i * n + k];
        dt__fed_sort(tmp, m);
        for (k = 0; k < c; k++) s += tmp[k];
        score[i] = s;
        order[i] = i;
    }
    for (i = 1; i < n; i++) {   /* stable insertion sort of the indices by score */
        int x = order[i];
        for (k = i - 1; k >= 0 && score[order[k]] > score[x]; k--) order[k + 1] = order[k];
        order[k + 1] = x;
    }
}

/* The class-mean check: kept[i] = 0 for a client whose row of some class lies beyond k median distances
   from that class's coordinate-median row. col [n], d [n], med [cols]. */
static void dt__fed_classmean(const float *const *u, int n, const dt_fed_agg_desc *a, double *col, double *d,
                              double *sorted, float *med, int *kept) {
    int64_t c, j;
    int i;
    for (i = 0; i < n; i++) kept[i] = 1;
    for (c = 0; c < a->cm_rows; c++) {
        int64_t base = a->cm_offset + c * a->cm_cols;
        double s;
        for (j = 0; j < a->cm_cols; j++) {
            for (i = 0; i < n; i++) col[i] = u[i][base + j];
            dt__fed_sort(col, n);
            med[j] = (float)dt__fed_median_sorted(col, n);
        }
        for (i = 0; i < n; i++) {
            double q = 0.0;
            for (j = 0; j < a->cm_cols; j++) { double e = (double)u[i][base + j] - (double)med[j]; q += e * e; }
            d[i] = sorted[i] = sqrt(q);
        }
        dt__fed_sort(sorted, n);
        s = dt__fed_median_sorted(sorted, n);
        for (i = 0; i < n; i++) if (d[i] > (double)a->k * s) kept[i] = 0;
    }
}

/* Krum's f: 0 is a request (no Byzantine client), DT_DEFAULT the default, 1. */
static int dt__fed_krum_f(const dt_fed_agg_desc *a) { return a->f == DT_DEFAULT ? 1 : a->f; }

/* dt_fed_aggregate, where only the first sel_len of the len coordinates choose the clients (Krum's distances,
   the class-mean rows): dt_fed's updates are the parameters followed by the buffers, and the buffers go
   through the same aggregator without a say in whom it keeps (docs/design.md, "BatchNorm statistics in
   the trainers"). */
static dt_result dt__fed_aggregate(const dt_fed_agg_desc *desc, const float *const *updates, const double *weights, int n,
                                   int64_t len, int64_t sel_len, float *out, int *kept_out) {
    dt_fed_agg_desc a;
    dt_fed_agg kind;
    double *scratch = NULL;
    int *order = NULL, *kept = NULL, i, t = 0;
    dt_result r = DT_OK;
    memset(&a, 0, sizeof a);
    if (desc) a = *desc;
    kind = a.kind;
    if (a.trim == DT_DEFAULT) a.trim = 0.1f;   /* 0 is a request: nothing cut */
    a.f = dt__fed_krum_f(&a);
    if (!a.k) a.k = 3.0f;
    if ((int)kind < 0 || kind >= DT_FED_AGG_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: kind is %d; use a dt_fed_agg (DT_FED_MEAN, _MEDIAN, "
                            "_TRIMMED, _KRUM, _MULTIKRUM or _CLASSMEAN)", (int)kind);
    if (!updates || !out || n < 1 || len < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: bad arguments (updates %p, out %p, n %d, len %lld): "
                            "give n >= 1 updates of len >= 0", (const void *)updates, (void *)out, n, (long long)len);
    for (i = 0; i < n; i++) {
        if (!updates[i]) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: update %d is NULL", i);
        if (weights && !(weights[i] > 0.0 && weights[i] < INFINITY))
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: client %d's weight is %g; weights are sample counts > 0",
                                i, weights[i]);
    }
    if (kind == DT_FED_TRIMMED) {
        t = (int)floor((double)a.trim * (double)n);
        if (!(a.trim >= 0.0f && a.trim < 0.5f) || 2 * t >= n)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: trimmed mean of %d clients with trim %g cuts %d at each "
                                "end: need 0 <= trim < 0.5 (DT_DEFAULT for the default, 0.1) and 2 * floor(trim * n) < n", n,
                                (double)a.trim, t);
    }
    if ((kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) && a.f < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: %s with f = %d: f is the number of Byzantine clients "
                            "to tolerate, >= 0 (DT_DEFAULT for the default, 1)", dt_fed_agg_name(kind), a.f);
    if ((kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) && n < 2 * a.f + 3)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: %s with f = %d Byzantine clients needs n >= 2f + 3 = %d clients, "
                            "got %d: sample more clients or lower f", dt_fed_agg_name(kind), a.f, 2 * a.f + 3, n);
    if (kind == DT_FED_MULTIKRUM && (a.m < 0 || a.m > n))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: multikrum m = %d, need 0 <= m <= n = %d", a.m, n);
    if (kind == DT_FED_CLASSMEAN && (n < 3 || a.k < 1.0f || a.cm_rows < 1 || a.cm_cols < 1 || a.cm_offset < 0 ||
                                     a.cm_offset + a.cm_rows * a.cm_cols > sel_len))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: classmean needs n >= 3 clients (got %d), k >= 1 (got %g) and "
                            "the last layer's weight [%lld, %lld] at offset %lld inside the update of %lld", n, (double)a.k,
                            (long long)a.cm_rows, (long long)a.cm_cols, (long long)a.cm_offset, (long long)sel_len);
    scratch = (double *)DT_MALLOC(sizeof(double) * (size_t)(n * (n + 4) + (kind == DT_FED_CLASSMEAN ? a.cm_cols : 0)));
    order = (int *)DT_MALLOC(sizeof(int) * (size_t)n * 2);
    if (!scratch || !order) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_aggregate: no memory for %d clients", n); goto done; }
    kept = order + n;
    for (i = 0; i < n; i++) kept[i] = 1;
    switch (kind) {
    case DT_FED_MEAN: dt__fed_mean(updates, weights, NULL, n, len, out); break;
    case DT_FED_MEDIAN: dt__fed_columns(updates, n, len, -1, scratch, out); break;
    case DT_FED_TRIMMED: dt__fed_columns(updates, n, len, t, scratch, out); break;
    case DT_FED_KRUM:
    case DT_FED_MULTIKRUM: {
        int m = kind == DT_FED_KRUM ? 1 : (a.m ? a.m : n - a.f);
        dt__fed_krum(updates, n, sel_len, a.f, scratch, scratch + n * n, scratch + n * n + n, order);
        for (i = 0; i < n; i++) kept[i] = 0;
        for (i = 0; i < m; i++) kept[order[i]] = 1;
        dt__fed_mean(updates, NULL, kept, n, len, out);
        break;
    }
    default: /* DT_FED_CLASSMEAN */
        dt__fed_classmean(updates, n, &a, scratch, scratch + n, scratch + 2 * n, (float *)(scratch + 3 * n), kept);
        dt__fed_mean(updates, weights, kept, n, len, out);
        break;
    }
    if (kept_out) for (i = 0; i < n; i++) kept_out[i] = kept[i];
done:
    DT_FREE(scratch);
    DT_FREE(order);
    return r;
}

dt_result dt_fed_aggregate(const dt_fed_agg_desc *desc, const float *const *updates, const double *weights, int n,
                           int64_t len, float *out, int *kept) {
    return dt__fed_aggregate(desc, updates, weights, n, len, len, out, kept);
}

/* log(exp(a) + exp(b)) and log(exp(a) - exp(b)) (a >= b), -inf for 0; log(erfc(x)), with its asymptotic
   series where erfc underflows. */
static double dt__log_add(double a, double b) {
    double lo = a < b ? a : b, hi = a < b ? b : a;
    return lo == -INFINITY ? hi : log1p(exp(lo - hi)) + hi;
}
static double dt__log_sub(double a, double b) {
    if (b == -INFINITY) return a;
    if (a <= b) return -INFINITY;
    return log(expm1(a - b)) + b;
}
static double dt__log_erfc(double x) {
    double r = erfc(x);
    if (r > 0.0) return log(r);
    return -0.5 * log(3.14159265358979323846) - log(x) - x * x - 0.5 / (x * x) + 0.625 / pow(x, 4) - 37.0 / 24.0 / pow(x, 6) + 353.0 / 64.0 / pow(x, 8);
}

double dt_dp_rdp(double q, double z, double a) {
    double log_a = -INFINITY, s2 = 2.0 * z * z;
    if (q <= 0.0) return 0.0;
    if (!(z > 0.0) || !(a > 1.0) || a == INFINITY) return INFINITY;
    if (q >= 1.0) return a / s2;
    if (a == floor(a)) {   /* A_a = sum_i C(a, i) q^i (1 - q)^(a - i) exp((i^2 - i) / (2 z^2)) */
        int64_t i, n = (int64_t)a;
        for (i = 0; i <= n; i++)
            log_a = dt__log_add(log_a, lgamma(a + 1.0) - lgamma((double)i + 1.0) - lgamma(a - (double)i + 1.0) + (double)i * log(q) +
                                           (a - (double)i) * log1p(-q) + ((double)i * (double)i - (double)i) / s2);
    } else {   /* the two halves of the integral, over (-inf, z0] and [z0, inf), as series in i */
        double a0 = -INFINITY, a1 = -INFINITY, z0 = z * z * log(1.0 / q - 1.0) + 0.5, coef = 1.0;
        int64_t i;
        for (i = 0;; i++) {
            double j = a - (double)i, lc = log(fabs(coef)), s0, s1;
            s0 = lc + (double)i * log(q) + j * log1p(-q) + ((double)i * (double)i - (double)i) / s2 +
                 log(0.5) + dt__log_erfc(((double)i - z0) / (sqrt(2.0) * z));
            s1 = lc + j * log(q) + (double)i * log1p(-q) + (j * j - j) / s2 + log(0.5) + dt__log_erfc((z0 - j) / (sqrt(2.0) * z));
            if (coef > 0.0) { a0 = dt__log_add(a0, s0); a1 = dt__log_add(a1, s1); }
            else { a0 = dt__log_sub(a0, s0); a1 = dt__log_sub(a1, s1); }
            if ((s0 > s1 ? s0 : s1) < -30.0 || i > 100000) break;
            coef *= (a - (double)i) / (double)(i + 1);   /* C(a, i + 1) */
        }
        log_a = dt__log_add(a0, a1);
    }
    return log_a / (a - 1.0);
}

double dt_dp_epsilon(double q, double z, int64_t steps, double delta, double *best_order) {
    double best = INFINITY, at = 0.0;
    int k;
    for (k = 0; k < 99 + 52; k++) {
        double a = k < 99 ? 1.0 + (double)(k + 1) / 10.0 : (double)(12 + k - 99);
        double e = (double)steps * dt_dp_rdp(q, z, a) - (log(delta) + log(a)) / (a - 1.0) + log((a - 1.0) / a);
        if (e < best) { best = e; at = a; }
    }
    if (best_order) *best_order = at;
    return best < 0.0 ? 0.0 : best;
}

/* The fewest updates the aggregator a->kind accepts (Krum's 2f + 3, the class-mean check's 3). */
static int dt__fed_min_clients(const dt_fed_agg_desc *a) {
    dt_fed_agg kind = a->kind;
    if (kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) return 2 * dt__fed_krum_f(a) + 3;
    if (kind == DT_FED_CLASSMEAN) return 3;
    if (kind == DT_FED_TRIMMED) { int n = 1; while (2 * (int)floor((double)(a->trim == DT_DEFAULT ? 0.1f : a->trim) * n) >= n && n < 1000) n++; return n; }
    return 1;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
