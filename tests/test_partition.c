/* Partitioners (fractions, IID, contiguous, label shards, Dirichlet label skew), the distributed sampler and
   the batch loader: every sample exactly once, sizes as documented, determinism per seed, PyTorch's
   DistributedSampler padding, prefetch on == off byte for byte, clean errors and out-of-memory paths. */
#include "dt_test_alloc.h"   /* the counting allocator */
#include "dt_test_hooks.h"   /* the RNG's internals */
#include "../dtrain.h"
#include "dt_test.h"

static const int64_t counts[] = {1, 2, 3, 5, 7, 10, 13, 31, 64, 97, 100, 1000, 4099};
static const int parts_list[] = {1, 2, 3, 4, 7, 8, 16, 33};
#define NCOUNTS ((int)(sizeof counts / sizeof counts[0]))
#define NPARTS ((int)(sizeof parts_list / sizeof parts_list[0]))

/* The partitioners and the sampler with their settings in argument order, for the tests that sweep them. */
static dt_result part_make(dt_partition *p, dt_partition_kind kind, int64_t count, int parts, uint64_t seed,
                           dt_partition_desc *d) {
    d->kind = kind; d->count = count; d->parts = parts; d->seed = seed;
    return dt_partition_create(p, d);
}
static dt_result part_iid(dt_partition *p, int64_t count, int parts, uint64_t seed) {
    dt_partition_desc d = {0};
    return part_make(p, DT_PARTITION_IID, count, parts, seed, &d);
}
static dt_result part_contiguous(dt_partition *p, int64_t count, int parts) {
    dt_partition_desc d = {0};
    return part_make(p, DT_PARTITION_CONTIGUOUS, count, parts, 0, &d);
}
static dt_result part_fractions(dt_partition *p, int64_t count, const float *fractions, int parts, uint64_t seed) {
    dt_partition_desc d = {0};
    d.fractions = fractions;
    return part_make(p, DT_PARTITION_FRACTIONS, count, parts, seed, &d);
}
static dt_result part_shards(dt_partition *p, const int32_t *labels, int64_t count, int parts, int spp, uint64_t seed) {
    dt_partition_desc d = {0};
    d.labels = labels; d.shards_per_part = spp;
    return part_make(p, DT_PARTITION_SHARDS, count, parts, seed, &d);
}
static dt_result part_dirichlet(dt_partition *p, const int32_t *labels, int64_t count, int64_t num_classes, int parts,
                                float alpha, uint64_t seed) {
    dt_partition_desc d = {0};
    d.labels = labels; d.num_classes = num_classes; d.alpha = alpha;
    return part_make(p, DT_PARTITION_DIRICHLET, count, parts, seed, &d);
}
static dt_sampler_desc sampler_desc(int64_t count, int rank, int world, uint64_t seed, int64_t epoch, int shuffle,
                                    int drop_last) {
    dt_sampler_desc d = {0};
    d.count = count; d.rank = rank; d.world = world; d.seed = seed; d.epoch = epoch; d.shuffle = shuffle;
    d.drop_last = drop_last;
    return d;
}
static dt_result sampler(int64_t count, int rank, int world, uint64_t seed, int64_t epoch, int shuffle, int drop_last,
                         int64_t *out, int64_t *n) {
    dt_sampler_desc d = sampler_desc(count, rank, world, seed, epoch, shuffle, drop_last);
    return dt_sampler_indices(&d, out, n);
}
static int64_t sampler_size(int64_t count, int world, int drop_last) {
    dt_sampler_desc d = sampler_desc(count, 0, world, 0, 0, 0, drop_last);
    return dt_sampler_size(&d);
}

/* A valid partition of count samples into parts: offsets from 0 to count, non-decreasing, every id once. */
static int valid_partition(const dt_partition *p, int64_t count, int parts) {
    char *seen;
    int64_t i;
    int k, ok = 1;
    if (p->parts != parts || !p->offsets || p->offsets[0] != 0 || p->offsets[parts] != count) return 0;
    for (k = 0; k < parts; k++)
        if (p->offsets[k + 1] < p->offsets[k]) return 0;
    seen = (char *)calloc((size_t)count + 1, 1);
    for (i = 0; i < count && ok; i++) {
        int64_t id = p->indices[i];
        if (id < 0 || id >= count || seen[id]) ok = 0;
        else seen[id] = 1;
    }
    free(seen);
    return ok;
}

static int64_t part_size(const dt_partition *p, int k) { return p->offsets[k + 1] - p->offsets[k]; }

static int same_partition(const dt_partition *a, const dt_partition *b) {
    return a->parts == b->parts && memcmp(a->offsets, b->offsets, sizeof(int64_t) * (size_t)(a->parts + 1)) == 0 &&
           memcmp(a->indices, b->indices, sizeof(int64_t) * (size_t)a->offsets[a->parts]) == 0;
}

/* labels [count] in [0, classes) from the tests' own generator */
static int32_t *random_labels(int64_t count, int classes) {
    int32_t *lab = (int32_t *)malloc(sizeof(int32_t) * (size_t)(count + 1));
    int64_t i;
    for (i = 0; i < count; i++) {
        int c = (int)dt_t_rand(0.0f, (float)classes);
        lab[i] = c >= classes ? classes - 1 : c;
    }
    return lab;
}

/* Gamma(shape) from Marsaglia-Tsang: mean shape, variance shape; tiny shapes stay finite in log space. */
static void test_gamma_sampler(void) {
    static const double shapes[] = {0.1, 0.5, 1.0, 2.5, 10.0};
    int s, i, n = 40000;
    dt_rng r;
    for (s = 0; s < 5; s++) {
        double k = shapes[s], sum = 0.0, sum2 = 0.0, mean, var;
        dt_rng_init(&r, 7, (uint64_t)s);
        for (i = 0; i < n; i++) {
            double g = exp(dt__test_rng_log_gamma(&r, k));
            CHECK(g >= 0.0);
            sum += g;
            sum2 += g * g;
        }
        mean = sum / n;
        var = sum2 / n - mean * mean;
        CHECK(fabs(mean - k) < 5.0 * sqrt(k / n) + 1e-3);
        CHECK(fabs(var - k) < 0.3 * k);
    }
    dt_rng_init(&r, 7, 99);
    for (i = 0; i < 1000; i++) {
        double lg = dt__test_rng_log_gamma(&r, 0.001);
        CHECK(lg == lg && lg < 1e300 && lg > -1e300);
    }
    for (i = 0; i < 1000; i++) {
        double u = dt__test_rng_open01(&r);
        CHECK(u > 0.0 && u < 1.0);
    }
}

static void test_contiguous_and_iid(void) {
    int a, b, k;
    uint64_t seed;
    for (a = 0; a < NCOUNTS; a++)
        for (b = 0; b < NPARTS; b++) {
            int64_t count = counts[a], i;
            int parts = parts_list[b];
            dt_partition c, p, q;
            CHECK_OK(part_contiguous(&c, count, parts));
            CHECK(valid_partition(&c, count, parts));
            for (i = 0; i < count; i++) CHECK(c.indices[i] == i);   /* blocks in index order */
            for (k = 0; k < parts; k++)
                CHECK(part_size(&c, k) == count / parts + (k < count % parts ? 1 : 0));
            for (seed = 1; seed <= 3; seed++) {
                CHECK_OK(part_iid(&p, count, parts, seed));
                CHECK_OK(part_iid(&q, count, parts, seed));
                CHECK(valid_partition(&p, count, parts));
                CHECK(memcmp(p.offsets, c.offsets, sizeof(int64_t) * (size_t)(parts + 1)) == 0);   /* same sizes */
                CHECK(same_partition(&p, &q));                                                   /* deterministic */
                dt_partition_free(&q);
                CHECK_OK(part_iid(&q, count, parts, seed + 100));
                if (count >= 10) CHECK(!same_partition(&p, &q));                                 /* seeds differ */
                if (count >= 100) CHECK(memcmp(p.indices, c.indices, sizeof(int64_t) * (size_t)count) != 0);
                dt_partition_free(&p);
                dt_partition_free(&q);
            }
            dt_partition_free(&c);
            CHECK(c.offsets == NULL && c.indices == NULL && c.parts == 0);
        }
    {   /* count 0 is allowed: every part empty */
        dt_partition p;
        CHECK_OK(part_iid(&p, 0, 3, 1));
        CHECK(valid_partition(&p, 0, 3));
        dt_partition_free(&p);
    }
    dt_partition_free(NULL);
}

/* The documented rule: n_p = floor(count f_p / sum f), then the leftover one each to nonzero parts in order. */
static void expected_fraction_sizes(int64_t count, const float *f, int parts, int64_t *n) {
    double sum = 0.0;
    int64_t left = count;
    int k;
    for (k = 0; k < parts; k++) sum += f[k];
    for (k = 0; k < parts; k++) { n[k] = (int64_t)floor((double)count * (f[k] / sum)); left -= n[k]; }
    for (k = 0; left > 0; k = (k + 1) % parts)
        if (f[k] > 0.0f) { n[k]++; left--; }
}

static void test_fractions(void) {
    static const float f3[] = {0.7f, 0.2f, 0.1f}, f2[] = {0.5f, 0.5f}, f1[] = {1.0f}, fz[] = {0.0f, 0.5f, 0.5f},
                       fz2[] = {0.25f, 0.0f, 0.75f}, f4[] = {0.333333f, 0.333333f, 0.333334f, 0.0f},
                       fodd[] = {0.10005f, 0.9f};   /* sums to 1.00005: accepted */
    const float *fs[] = {f3, f2, f1, fz, fz2, f4, fodd};
    const int np[] = {3, 2, 1, 3, 3, 4, 2};
    int a, b, k;
    uint64_t seed;
    for (b = 0; b < 7; b++)
        for (a = 0; a < NCOUNTS; a++) {
            int64_t count = counts[a], want[4];
            expected_fraction_sizes(count, fs[b], np[b], want);
            for (seed = 0; seed < 3; seed++) {
                dt_partition p, q;
                CHECK_OK(part_fractions(&p, count, fs[b], np[b], seed));
                CHECK(valid_partition(&p, count, np[b]));
                for (k = 0; k < np[b]; k++) {
                    CHECK(part_size(&p, k) == want[k]);
                    if (fs[b][k] == 0.0f) CHECK(part_size(&p, k) == 0);   /* a zero fraction stays empty */
                }
                CHECK_OK(part_fractions(&q, count, fs[b], np[b], seed));
                CHECK(same_partition(&p, &q));
                dt_partition_free(&q);
                CHECK_OK(part_fractions(&q, count, fs[b], np[b], seed + 7));
                if (count >= 10) CHECK(!same_partition(&p, &q));
                dt_partition_free(&p);
                dt_partition_free(&q);
            }
        }
    {   /* 0.7/0.2/0.1 of 1000 is exactly 700/200/100; of 10 samples 7/2/1; of 11: 7+1, 2, 1 */
        dt_partition p;
        CHECK_OK(part_fractions(&p, 1000, f3, 3, 5));
        CHECK(part_size(&p, 0) == 700 && part_size(&p, 1) == 200 && part_size(&p, 2) == 100);
        dt_partition_free(&p);
        CHECK_OK(part_fractions(&p, 11, f3, 3, 5));
        CHECK(part_size(&p, 0) == 8 && part_size(&p, 1) == 2 && part_size(&p, 2) == 1);
        dt_partition_free(&p);
    }
}

static int labels_in_part(const dt_partition *p, int k, const int32_t *lab, int classes) {
    int seen[64] = {0}, n = 0;
    int64_t i;
    for (i = p->offsets[k]; i < p->offsets[k + 1]; i++)
        if (!seen[lab[p->indices[i]]]) { seen[lab[p->indices[i]]] = 1; n++; }
    (void)classes;
    return n;
}

static void test_shards(void) {
    int a, b, k;
    uint64_t seed;
    {   /* 10 classes x 100 samples (labels scattered over the ids), 50 parts x 2 shards of 10: each part
           holds 20 samples of at most 2 labels, and within a shard ids ascend (stable sort) */
        int32_t lab[1000];
        int64_t i;
        dt_partition p, q;
        for (i = 0; i < 1000; i++) lab[i] = (int32_t)((i * 7) % 10);
        CHECK_OK(part_shards(&p, lab, 1000, 50, 2, 3));
        CHECK(valid_partition(&p, 1000, 50));
        for (k = 0; k < 50; k++) {
            int64_t o = p.offsets[k];
            CHECK(part_size(&p, k) == 20);
            CHECK(labels_in_part(&p, k, lab, 10) <= 2);
            for (i = 1; i < 10; i++) {
                CHECK(p.indices[o + i] > p.indices[o + i - 1]);
                CHECK(p.indices[o + 10 + i] > p.indices[o + 10 + i - 1]);
                CHECK(lab[p.indices[o + i]] == lab[p.indices[o]]);
            }
        }
        CHECK_OK(part_shards(&q, lab, 1000, 50, 2, 3));
        CHECK(same_partition(&p, &q));
        dt_partition_free(&q);
        CHECK_OK(part_shards(&q, lab, 1000, 50, 2, 4));
        CHECK(!same_partition(&p, &q));
        dt_partition_free(&p);
        dt_partition_free(&q);
    }
    {   /* FedAvg-like: random labels, 100 parts x 2 shards of 30: shards rarely straddle two classes */
        int32_t *lab = random_labels(6000, 10);
        dt_partition p, iid;
        int at_most_2 = 0;
        double avg_shard = 0.0, avg_iid = 0.0;
        CHECK_OK(part_shards(&p, lab, 6000, 100, 2, 11));
        CHECK_OK(part_iid(&iid, 6000, 100, 11));
        CHECK(valid_partition(&p, 6000, 100));
        for (k = 0; k < 100; k++) {
            int n = labels_in_part(&p, k, lab, 10);
            CHECK(part_size(&p, k) == 60);
            CHECK(n <= 4);
            at_most_2 += n <= 2;
            avg_shard += n / 100.0;
            avg_iid += labels_in_part(&iid, k, lab, 10) / 100.0;
        }
        CHECK(at_most_2 >= 80);
        CHECK(avg_shard < 2.3 && avg_iid > 9.0);
        dt_partition_free(&p);
        dt_partition_free(&iid);
        free(lab);
    }
    for (a = 0; a < NCOUNTS; a++)   /* any size: complete, sizes of S near-equal shards, deterministic */
        for (b = 0; b < NPARTS; b++) {
            int64_t count = counts[a];
            int parts = parts_list[b], spp;
            int32_t *lab = random_labels(count, 10);
            for (spp = 1; spp <= 3; spp++)
                for (seed = 0; seed < 2; seed++) {
                    dt_partition p, q;
                    int64_t S = (int64_t)parts * spp, qs = count / S;
                    CHECK_OK(part_shards(&p, lab, count, parts, spp, seed));
                    CHECK(valid_partition(&p, count, parts));
                    for (k = 0; k < parts; k++)
                        CHECK(part_size(&p, k) >= spp * qs && part_size(&p, k) <= spp * (qs + 1));
                    CHECK_OK(part_shards(&q, lab, count, parts, spp, seed));
                    CHECK(same_partition(&p, &q));
                    dt_partition_free(&p);
                    dt_partition_free(&q);
                }
            free(lab);
        }
}

/* average over parts of the number of classes that together hold 90% of a part's samples */
static double classes_for_90(const int64_t *hist, int parts, int classes) {
    double total = 0.0;
    int k, c, j;
    for (k = 0; k < parts; k++) {
        int64_t h[64], sum = 0, acc = 0;
        for (c = 0; c < classes; c++) { h[c] = hist[k * classes + c]; sum += h[c]; }
        for (c = 0; c < classes; c++)   /* sort descending */
            for (j = c + 1; j < classes; j++)
                if (h[j] > h[c]) { int64_t t = h[c]; h[c] = h[j]; h[j] = t; }
        for (c = 0; c < classes && acc * 10 < sum * 9; c++) acc += h[c];
        total += c;
    }
    return total / parts;
}

static void test_dirichlet(void) {
    int a, b, k, s;
    uint64_t seed;
    {   /* alpha 0.1: a few classes make up each part; alpha 100: nearly all 10 */
        int32_t *lab = random_labels(5000, 10);
        int64_t hist[20 * 10];
        for (seed = 1; seed <= 3; seed++) {
            dt_partition skew, flat;
            double c_skew, c_flat;
            CHECK_OK(part_dirichlet(&skew, lab, 5000, 10, 20, 0.1f, seed));
            CHECK_OK(part_dirichlet(&flat, lab, 5000, 10, 20, 100.0f, seed));
            CHECK(valid_partition(&skew, 5000, 20) && valid_partition(&flat, 5000, 20));
            for (k = 0; k < 20; k++) CHECK(part_size(&skew, k) > 0 && part_size(&flat, k) > 0);
            CHECK_OK(dt_partition_histogram(&skew, lab, 10, hist));
            c_skew = classes_for_90(hist, 20, 10);
            CHECK_OK(dt_partition_histogram(&flat, lab, 10, hist));
            c_flat = classes_for_90(hist, 20, 10);
            if (!(c_skew < 4.0 && c_flat > 8.0 && c_skew < 0.4 * c_flat))
                printf("    alpha 0.1: %.2f classes hold 90%%, alpha 100: %.2f\n", c_skew, c_flat);
            CHECK(c_skew < 4.0 && c_flat > 8.0 && c_skew < 0.4 * c_flat);
            dt_partition_free(&skew);
            dt_partition_free(&flat);
        }
        free(lab);
    }
    {   /* tiny alpha, as many parts as samples: no part empty (redraws, then moves) */
        static const int64_t n[] = {20, 25, 40, 64};
        static const int np[] = {20, 25, 33, 64};
        for (s = 0; s < 4; s++)
            for (seed = 0; seed < 4; seed++) {
                int32_t *lab = random_labels(n[s], 10);
                dt_partition p;
                CHECK_OK(part_dirichlet(&p, lab, n[s], 10, np[s], 0.01f, seed));
                CHECK(valid_partition(&p, n[s], np[s]));
                for (k = 0; k < np[s]; k++) CHECK(part_size(&p, k) >= 1);
                dt_partition_free(&p);
                free(lab);
            }
    }
    for (a = 0; a < NCOUNTS; a++)   /* any size: complete; no empty part when count >= parts; deterministic */
        for (b = 0; b < NPARTS; b++) {
            static const float alphas[] = {0.05f, 1.0f, 100.0f};
            int64_t count = counts[a];
            int parts = parts_list[b];
            int32_t *lab = random_labels(count, 7);
            for (s = 0; s < 3; s++)
                for (seed = 0; seed < 2; seed++) {
                    dt_partition p, q;
                    CHECK_OK(part_dirichlet(&p, lab, count, 7, parts, alphas[s], seed));
                    CHECK(valid_partition(&p, count, parts));
                    if (count >= parts)
                        for (k = 0; k < parts; k++) CHECK(part_size(&p, k) >= 1);
                    CHECK_OK(part_dirichlet(&q, lab, count, 7, parts, alphas[s], seed));
                    CHECK(same_partition(&p, &q));
                    dt_partition_free(&q);
                    CHECK_OK(part_dirichlet(&q, lab, count, 7, parts, alphas[s], seed + 50));
                    if (count >= 100 && parts >= 2) CHECK(!same_partition(&p, &q));
                    dt_partition_free(&p);
                    dt_partition_free(&q);
                }
            free(lab);
        }
}

static void test_histogram(void) {
    int32_t lab[6] = {0, 1, 2, 2, 1, 2};
    int64_t hist[2 * 3];
    dt_partition p;
    CHECK_OK(part_contiguous(&p, 6, 2));   /* {0, 1, 2} and {3, 4, 5} */
    CHECK_OK(dt_partition_histogram(&p, lab, 3, hist));
    CHECK(hist[0] == 1 && hist[1] == 1 && hist[2] == 1 && hist[3] == 0 && hist[4] == 1 && hist[5] == 2);
    CHECK_ERR(dt_partition_histogram(&p, lab, 2, hist), DT_ERR_INVALID_ARG);   /* label 2 with 2 classes */
    CHECK(strstr(dt_last_error(), "num_classes") != NULL);
    lab[4] = -1;
    CHECK_ERR(dt_partition_histogram(&p, lab, 3, hist), DT_ERR_INVALID_ARG);
    lab[4] = 1;
    CHECK_ERR(dt_partition_histogram(&p, NULL, 3, hist), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_partition_histogram(&p, lab, 0, hist), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_partition_histogram(&p, lab, 3, NULL), DT_ERR_INVALID_ARG);
    dt_partition_free(&p);
    CHECK_ERR(dt_partition_histogram(&p, lab, 3, hist), DT_ERR_STATE);        /* freed: no parts */
}

static void test_partition_errors(void) {
    dt_partition p;
    float f[3] = {0.5f, 0.3f, 0.1f};
    int32_t lab[4] = {0, 1, 2, 3};
    memset(&p, 0x5a, sizeof p);
    CHECK_ERR(part_fractions(&p, 10, f, 3, 0), DT_ERR_INVALID_ARG);     /* sums to 0.9 */
    CHECK(p.offsets == NULL && p.indices == NULL && p.parts == 0);              /* zeroed on failure */
    CHECK(strstr(dt_last_error(), "sum") != NULL);
    f[2] = -0.2f; f[0] = 0.9f;
    CHECK_ERR(part_fractions(&p, 10, f, 3, 0), DT_ERR_INVALID_ARG);     /* negative */
    CHECK(strstr(dt_last_error(), "fractions[2]") != NULL);
    f[2] = NAN;
    CHECK_ERR(part_fractions(&p, 10, f, 3, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_fractions(&p, 10, NULL, 3, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_fractions(&p, 10, f, 0, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_fractions(NULL, 10, f, 3, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_iid(&p, -1, 2, 0), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "count") != NULL);
    CHECK_ERR(part_iid(&p, 10, 0, 0), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "parts") != NULL);
    CHECK_ERR(part_contiguous(&p, 10, -3), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_shards(&p, lab, 4, 2, -1, 0), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dt_partition_create (shards): shards_per_part is -1") != NULL);
    CHECK_ERR(part_shards(&p, NULL, 4, 2, 2, 0), DT_ERR_INVALID_ARG);
    lab[3] = -4;
    CHECK_ERR(part_shards(&p, lab, 4, 2, 1, 0), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "labels[3]") != NULL);
    CHECK_ERR(part_dirichlet(&p, lab, 4, 4, 2, 0.5f, 0), DT_ERR_INVALID_ARG);   /* label -4 */
    lab[3] = 3;
    CHECK_ERR(part_dirichlet(&p, lab, 4, 3, 2, 0.5f, 0), DT_ERR_INVALID_ARG);   /* label 3 of 3 classes */
    CHECK(strstr(dt_last_error(), "num_classes") != NULL);
    CHECK_ERR(part_dirichlet(&p, lab, 4, 4, 2, 0.0f, 0), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "alpha") != NULL);
    CHECK_ERR(part_dirichlet(&p, lab, 4, 4, 2, NAN, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_dirichlet(&p, lab, 4, 4, 2, INFINITY, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_dirichlet(&p, lab, 4, 0, 2, 1.0f, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(part_dirichlet(&p, NULL, 4, 4, 2, 1.0f, 0), DT_ERR_INVALID_ARG);
    CHECK(p.offsets == NULL && p.parts == 0);
    CHECK(live_allocs == 0);
}

/* dt_partition_desc: zero is an IID split, shards_per_part 0 is 2, and what is wrong is refused naming the field. */
static void test_partition_desc(void) {
    static const struct { dt_partition_kind kind; const char *name; } kinds[] = {
        {DT_PARTITION_IID, "iid"}, {DT_PARTITION_CONTIGUOUS, "contiguous"}, {DT_PARTITION_FRACTIONS, "fractions"},
        {DT_PARTITION_SHARDS, "shards"}, {DT_PARTITION_DIRICHLET, "dirichlet"}};
    dt_partition p, q;
    dt_partition_desc d;
    dt_partition_kind k;
    float f[2] = {0.5f, 0.5f};
    int32_t lab[8] = {0, 1, 0, 1, 1, 0, 1, 0};
    int i;
    for (i = 0; i < 5; i++) {
        CHECK(strcmp(dt_partition_kind_name(kinds[i].kind), kinds[i].name) == 0);
        CHECK_OK(dt_partition_kind_parse(kinds[i].name, &k));
        CHECK(k == kinds[i].kind);
    }
    CHECK(strcmp(dt_partition_kind_name(DT_PARTITION_KIND_COUNT), "unknown") == 0);
    CHECK_ERR(dt_partition_kind_parse("random", &k), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "unknown partition 'random': use iid, contiguous, fractions, shards or dirichlet") != NULL);
    memset(&d, 0, sizeof d);   /* zero: IID */
    d.count = 10; d.parts = 3; d.seed = 4;
    CHECK_OK(dt_partition_create(&p, &d));
    CHECK_OK(part_iid(&q, 10, 3, 4));
    CHECK(valid_partition(&p, 10, 3) && memcmp(p.indices, q.indices, 10 * sizeof(int64_t)) == 0);
    dt_partition_free(&p); dt_partition_free(&q);
    d.kind = DT_PARTITION_SHARDS; d.labels = lab; d.count = 8; d.parts = 2;   /* shards_per_part 0: 2 */
    CHECK_OK(dt_partition_create(&p, &d));
    CHECK_OK(part_shards(&q, lab, 8, 2, 2, 4));
    CHECK(memcmp(p.offsets, q.offsets, 3 * sizeof(int64_t)) == 0 && memcmp(p.indices, q.indices, 8 * sizeof(int64_t)) == 0);
    dt_partition_free(&p); dt_partition_free(&q);
    memset(&p, 0x5a, sizeof p);
    CHECK_ERR(dt_partition_create(&p, NULL), DT_ERR_INVALID_ARG);
    CHECK(p.offsets == NULL && strstr(dt_last_error(), "desc is NULL") != NULL);
    memset(&d, 0, sizeof d);
    d.count = 10;   /* parts left 0: no default */
    CHECK_ERR(dt_partition_create(&p, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dt_partition_create (iid): parts is 0; set it to the number of parts") != NULL);
    d.parts = 2; d.kind = (dt_partition_kind)9;
    CHECK_ERR(dt_partition_create(&p, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "kind is 9") != NULL);
    d.kind = DT_PARTITION_IID; d.fractions = f;   /* fractions without their kind: not silently IID */
    CHECK_ERR(dt_partition_create(&p, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "fractions (DT_PARTITION_FRACTIONS) is set") != NULL);
    d.kind = DT_PARTITION_FRACTIONS;
    CHECK_OK(dt_partition_create(&p, &d));
    dt_partition_free(&p);
    d.shards_per_part = 2;
    CHECK_ERR(dt_partition_create(&p, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "shards_per_part (DT_PARTITION_SHARDS)") != NULL);
    d.shards_per_part = 0; d.fractions = NULL; d.kind = DT_PARTITION_SHARDS; d.labels = lab; d.count = 8; d.alpha = 0.5f;
    CHECK_ERR(dt_partition_create(&p, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "alpha (DT_PARTITION_DIRICHLET)") != NULL);
    d.alpha = 0.0f; d.num_classes = 2;
    CHECK_ERR(dt_partition_create(&p, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "num_classes (DT_PARTITION_DIRICHLET)") != NULL);
    d.kind = DT_PARTITION_DIRICHLET;   /* alpha left 0: no default */
    CHECK_ERR(dt_partition_create(&p, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dt_partition_create (dirichlet): alpha is 0") != NULL);
    d.alpha = 0.5f;
    CHECK_OK(dt_partition_create(&p, &d));
    CHECK(valid_partition(&p, 8, 2));
    dt_partition_free(&p);
    CHECK(live_allocs == 0);
}

static void test_sampler(void) {
    static const int worlds[] = {1, 2, 3, 4, 5, 8, 16};
    int a, b, sh, dl, rk;
    for (a = 0; a < NCOUNTS; a++)
        for (b = 0; b < 7; b++)
            for (sh = 0; sh < 2; sh++)
                for (dl = 0; dl < 2; dl++) {
                    int64_t count = counts[a], n, m, j, want, *perm, *out, *again;
                    int world = worlds[b];
                    int *hits = (int *)calloc((size_t)count, sizeof(int));
                    want = dl ? count / world : (count + world - 1) / world;
                    CHECK(sampler_size(count, world, dl) == want);
                    perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)count);
                    out = (int64_t *)malloc(sizeof(int64_t) * (size_t)(want + 1));
                    again = (int64_t *)malloc(sizeof(int64_t) * (size_t)(count + 1));   /* also a whole epoch */
                    /* the whole epoch's list is rank 0 of a world of 1 */
                    CHECK_OK(sampler(count, 0, 1, 42, 3, sh, 0, perm, &n));
                    CHECK(n == count);
                    if (!sh) for (j = 0; j < count; j++) CHECK(perm[j] == j);
                    for (rk = 0; rk < world; rk++) {
                        CHECK_OK(sampler(count, rk, world, 42, 3, sh, dl, out, &n));
                        CHECK(n == want);                                     /* every rank the same length */
                        for (j = 0; j < n; j++) {
                            int64_t at = rk + j * world;                      /* position in the padded list */
                            CHECK(dl ? at < count : at < want * world);
                            CHECK(out[j] == perm[at % count]);                /* padding repeats from the start */
                            hits[out[j]]++;
                        }
                        CHECK_OK(sampler(count, rk, world, 42, 3, sh, dl, again, &m));
                        CHECK(m == n && memcmp(out, again, sizeof(int64_t) * (size_t)n) == 0);
                    }
                    {   /* union over ranks: every sample (drop_last 0), each at most once apart from padding */
                        int64_t covered = 0, total = 0;
                        for (j = 0; j < count; j++) { covered += hits[j] > 0; total += hits[j]; }
                        CHECK(total == want * world);
                        if (!dl) CHECK(covered == count);
                        else CHECK(covered == total);                         /* truncated: no repeats */
                        for (j = 0; j < count; j++) CHECK(hits[j] <= (total + count - 1) / count);
                    }
                    if (sh && count >= 10) {   /* another epoch or seed: another permutation */
                        CHECK_OK(sampler(count, 0, 1, 42, 4, sh, 0, again, &n));
                        CHECK(memcmp(perm, again, sizeof(int64_t) * (size_t)count) != 0);
                        CHECK_OK(sampler(count, 0, 1, 43, 3, sh, 0, again, &n));
                        CHECK(memcmp(perm, again, sizeof(int64_t) * (size_t)count) != 0);
                    }
                    free(hits); free(perm); free(out); free(again);
                }
}

/* PyTorch's DistributedSampler(range(10), num_replicas=4, shuffle=False): padded to 12 with 0, 1. */
static void test_sampler_pytorch_example(void) {
    static const int64_t pad[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}}, cut[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
    int64_t out[3], n, big[16];
    int r;
    for (r = 0; r < 4; r++) {
        CHECK_OK(sampler(10, r, 4, 0, 0, 0, 0, out, &n));
        CHECK(n == 3 && memcmp(out, pad[r], sizeof out) == 0);
        CHECK_OK(sampler(10, r, 4, 0, 0, 0, 1, out, &n));
        CHECK(n == 2 && out[0] == cut[r][0] && out[1] == cut[r][1]);
    }
    /* 3 samples on 8 ranks: padded to 8 with 0, 1, 2, 0, 1 (repeated as often as needed) */
    for (r = 0; r < 8; r++) {
        CHECK_OK(sampler(3, r, 8, 0, 0, 0, 0, big, &n));
        CHECK(n == 1 && big[0] == r % 3);
        CHECK_OK(sampler(3, r, 8, 0, 0, 0, 1, big, &n));
        CHECK(n == 0);
    }
    CHECK_OK(sampler(0, 0, 2, 0, 0, 1, 0, NULL, &n));   /* nothing to sample */
    CHECK(n == 0);
    CHECK_ERR(sampler(10, 4, 4, 0, 0, 0, 0, out, &n), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "rank") != NULL);
    CHECK_ERR(sampler(10, -1, 4, 0, 0, 0, 0, out, &n), DT_ERR_INVALID_ARG);
    CHECK_ERR(sampler(10, 0, 0, 0, 0, 0, 0, out, &n), DT_ERR_INVALID_ARG);
    CHECK_ERR(sampler(-5, 0, 1, 0, 0, 0, 0, out, &n), DT_ERR_INVALID_ARG);
    CHECK_ERR(sampler(10, 0, 4, 0, -1, 0, 0, out, &n), DT_ERR_INVALID_ARG);
    CHECK_ERR(sampler(10, 0, 4, 0, 0, 0, 0, NULL, &n), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "dt_sampler_size") != NULL);
    CHECK_ERR(sampler(10, 0, 4, 0, 0, 0, 0, out, NULL), DT_ERR_INVALID_ARG);
    CHECK(sampler_size(10, 0, 0) == 0 && sampler_size(-1, 2, 0) == 0 && sampler_size(7, 2, 1) == 3);
    CHECK(dt_sampler_size(NULL) == 0);
}

/* dt_sampler_desc: each wrong field refused, naming it and the fix. */
static void test_sampler_desc(void) {
    dt_sampler_desc d;
    int64_t out[10], n = 5;
    CHECK_ERR(dt_sampler_indices(NULL, out, &n), DT_ERR_INVALID_ARG);
    CHECK(n == 0 && strstr(dt_last_error(), "desc is NULL") != NULL);
    memset(&d, 0, sizeof d);
    d.count = 10;   /* world left 0: no default */
    CHECK_ERR(dt_sampler_indices(&d, out, &n), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "world is 0; set it to the number of ranks") != NULL);
    d.world = 2; d.rank = 2;
    CHECK_ERR(dt_sampler_indices(&d, out, &n), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "rank is 2 of world 2") != NULL);
    d.rank = 1; d.shuffle = 2;
    CHECK_ERR(dt_sampler_indices(&d, out, &n), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "shuffle is 2 and drop_last 0; each must be 0 or 1") != NULL);
    d.shuffle = 0; d.drop_last = -1;
    CHECK_ERR(dt_sampler_indices(&d, out, &n), DT_ERR_INVALID_ARG);
    d.drop_last = 0;
    CHECK_OK(dt_sampler_indices(&d, out, &n));
    CHECK(n == 5 && out[0] == 1 && out[4] == 9 && dt_sampler_size(&d) == 5);
}

/* ---- loader ---- */

#define NS 103                      /* samples (a prime) */
#define SC 1
#define SH 2
#define SW 3
static uint8_t ds_pix[NS * SC * SH * SW];
static int32_t ds_lab[NS];

/* Pixels 0 and 1 of a sample hold its id, so a batch tells which samples it holds. */
static dt_dataset make_ds(void) {
    dt_dataset ds;
    int i, j;
    memset(&ds, 0, sizeof ds);
    for (i = 0; i < NS; i++) {
        uint8_t *p = ds_pix + i * SC * SH * SW;
        p[0] = (uint8_t)(i & 255);
        p[1] = (uint8_t)(i >> 8);
        for (j = 2; j < SC * SH * SW; j++) p[j] = (uint8_t)((i * 31 + j * 17) & 255);
        ds_lab[i] = i % 7;
    }
    ds.count = NS; ds.c = SC; ds.h = SH; ds.w = SW; ds.num_classes = 7; ds.pixels = ds_pix; ds.labels = ds_lab;
    return ds;
}

static int64_t id_of(const float *x) {
    return (int64_t)lrintf(x[0] * 255.0f) + 256 * (int64_t)lrintf(x[1] * 255.0f);
}

/* Runs one epoch, writes the sample ids in order (ids [NS]) and returns how many; -1 on a wrong batch. */
static int64_t epoch_ids(dt_loader *l, int64_t epoch, int64_t *ids, int64_t *batches, int64_t *last_n) {
    const float *x;
    const int32_t *y;
    int64_t n, total = 0, i;
    dt_result r;
    *batches = 0;
    *last_n = 0;
    CHECK_OK(dt_loader_start_epoch(l, epoch));
    while ((r = dt_loader_next(l, &x, &y, &n)) == DT_OK && n > 0) {
        for (i = 0; i < n; i++) {
            int64_t id = id_of(x + i * SC * SH * SW);
            if (id < 0 || id >= NS || y[i] != ds_lab[id] || total >= NS) return -1;
            ids[total++] = id;
        }
        (*batches)++;
        *last_n = n;
    }
    CHECK_OK(r);
    CHECK(dt_loader_next(l, &x, &y, &n) == DT_OK && n == 0 && x == NULL && y == NULL);   /* stays at the end */
    return total;
}

static void test_loader_batches(void) {
    dt_dataset ds = make_ds();
    static const int64_t batch[] = {10, 1, 7, 103, 200, 0};
    int b, dl, pf, sh;
    for (b = 0; b < 6; b++)
        for (dl = 0; dl < 2; dl++)
            for (pf = 0; pf < 2; pf++)
                for (sh = 0; sh < 2; sh++) {
                    dt_loader *l;
                    dt_loader_desc d;
                    int64_t ids[NS], nb, last, got, i, B = batch[b] ? batch[b] : 64, want_b;
                    int seen[NS] = {0};
                    memset(&d, 0, sizeof d);
                    d.dataset = &ds; d.batch = batch[b]; d.drop_last = dl; d.prefetch = pf; d.shuffle = sh;
                    d.seed = 5;
                    CHECK_OK(dt_loader_create(&l, &d));
                    want_b = dl ? NS / B : (NS + B - 1) / B;
                    CHECK(dt_loader_batches(l) == want_b);
                    got = epoch_ids(l, 0, ids, &nb, &last);
                    CHECK(nb == want_b);
                    CHECK(got == (dl ? want_b * B : NS));
                    if (nb > 0) CHECK(last == (dl || NS % B == 0 ? B : NS % B));   /* the last batch's size */
                    for (i = 0; i < got; i++) seen[ids[i]]++;
                    for (i = 0; i < NS; i++) CHECK(seen[i] <= 1 && (dl || seen[i] == 1));   /* each sample once */
                    if (!sh) for (i = 0; i < got; i++) CHECK(ids[i] == i);
                    dt_loader_destroy(l);
                }
    CHECK(live_allocs == 0);
}

static void test_loader_determinism(void) {
    dt_dataset ds = make_ds();
    dt_loader *a, *b, *c;
    dt_loader_desc d;
    int64_t part[40], ia[NS], ib[NS], ic[NS], nb, last, i, e;
    int pf;
    for (i = 0; i < 40; i++) part[i] = 100 - 2 * i;   /* a subset, in a given order */
    for (pf = 0; pf < 2; pf++) {
        memset(&d, 0, sizeof d);
        d.dataset = &ds; d.indices = part; d.count = 40; d.batch = 6; d.shuffle = 1; d.seed = 9; d.rank = 2;
        d.prefetch = pf;
        CHECK_OK(dt_loader_create(&a, &d));
        CHECK_OK(dt_loader_create(&b, &d));
        d.rank = 3;
        CHECK_OK(dt_loader_create(&c, &d));
        for (e = 0; e < 3; e++) {
            int seen[NS] = {0};
            CHECK(epoch_ids(a, e, ia, &nb, &last) == 40 && nb == 7 && last == 4);
            CHECK(epoch_ids(b, e, ib, &nb, &last) == 40);
            CHECK(epoch_ids(c, e, ic, &nb, &last) == 40);
            CHECK(memcmp(ia, ib, sizeof(int64_t) * 40) == 0);   /* same (seed, rank, epoch): same batches */
            CHECK(memcmp(ia, ic, sizeof(int64_t) * 40) != 0);   /* another rank: another order */
            for (i = 0; i < 40; i++) seen[ia[i]]++;
            for (i = 0; i < 40; i++) CHECK(seen[part[i]] == 1);   /* exactly the given samples */
            CHECK(epoch_ids(b, e + 1, ib, &nb, &last) == 40);
            CHECK(memcmp(ia, ib, sizeof(int64_t) * 40) != 0);   /* another epoch: another order */
        }
        CHECK(epoch_ids(a, 1, ia, &nb, &last) == 40);            /* epochs can be revisited in any order */
        CHECK(epoch_ids(b, 1, ib, &nb, &last) == 40);
        CHECK(memcmp(ia, ib, sizeof(int64_t) * 40) == 0);
        dt_loader_destroy(a);
        dt_loader_destroy(b);
        dt_loader_destroy(c);
        d.shuffle = 0;                                           /* no shuffle: the given order every epoch */
        CHECK_OK(dt_loader_create(&a, &d));
        for (e = 0; e < 2; e++) {
            CHECK(epoch_ids(a, e, ia, &nb, &last) == 40);
            CHECK(memcmp(ia, part, sizeof part) == 0);
        }
        dt_loader_destroy(a);
    }
    {   /* an empty part (more ranks than samples) gives an epoch of no batches */
        memset(&d, 0, sizeof d);
        d.dataset = &ds; d.indices = part; d.count = 0; d.prefetch = 1;
        CHECK_OK(dt_loader_create(&a, &d));
        CHECK(dt_loader_batches(a) == 0);
        CHECK(epoch_ids(a, 0, ia, &nb, &last) == 0 && nb == 0);
        dt_loader_destroy(a);
    }
    CHECK(live_allocs == 0);
}

/* Every batch of `epochs` epochs, x, y and n concatenated; returns the bytes written. */
static size_t record(dt_loader *l, int epochs, unsigned char *buf, size_t cap) {
    const float *x;
    const int32_t *y;
    int64_t n;
    size_t at = 0, bx;
    int e;
    for (e = 0; e < epochs; e++) {
        CHECK_OK(dt_loader_start_epoch(l, e));
        while (dt_loader_next(l, &x, &y, &n) == DT_OK && n > 0) {
            bx = sizeof(float) * (size_t)n * SC * SH * SW;
            if (at + bx + sizeof(int32_t) * (size_t)n + sizeof n > cap) { CHECK(0); return at; }
            memcpy(buf + at, &n, sizeof n); at += sizeof n;
            memcpy(buf + at, x, bx); at += bx;
            memcpy(buf + at, y, sizeof(int32_t) * (size_t)n); at += sizeof(int32_t) * (size_t)n;
        }
    }
    return at;
}

static void test_loader_prefetch_identical(void) {
    dt_dataset ds = make_ds();
    dt_transform t;
    dt_loader *l0, *l1;
    dt_loader_desc d;
    size_t cap = 1 << 20, n0, n1;
    unsigned char *b0 = (unsigned char *)malloc(cap), *b1 = (unsigned char *)malloc(cap);
    int dl;
    long allocs;
    memset(&t, 0, sizeof t);
    t.mean[0] = 0.4f; t.std[0] = 0.3f; t.crop_pad = 1; t.flip = 1;
    for (dl = 0; dl < 2; dl++) {
        memset(&d, 0, sizeof d);
        d.dataset = &ds; d.batch = 8; d.shuffle = 1; d.drop_last = dl; d.transform = &t; d.seed = 77; d.rank = 1;
        CHECK_OK(dt_loader_create(&l0, &d));
        d.prefetch = 1;
        CHECK_OK(dt_loader_create(&l1, &d));
        memset(&t, 0, sizeof t);   /* the loader copied the transform */
        t.mean[0] = 0.4f; t.std[0] = 0.3f; t.crop_pad = 1; t.flip = 1;
        allocs = total_allocs;
        n0 = record(l0, 4, b0, cap);
        n1 = record(l1, 4, b1, cap);
        CHECK(total_allocs == allocs);   /* nothing allocated after create */
        CHECK(n0 > 0 && n0 == n1 && memcmp(b0, b1, n0) == 0);
        dt_loader_destroy(l0);
        dt_loader_destroy(l1);
    }
    free(b0);
    free(b1);
    CHECK(live_allocs == 0);
}

/* The worker converts batch k + 1 while the caller holds batch k. */
static void test_loader_prefetches_ahead(void) {
#if DT__HAVE_THREADS
    dt_dataset ds = make_ds();
    dt_loader *l;
    dt_loader_desc d;
    const float *x;
    const int32_t *y;
    int64_t n, done = -1;
    double t0;
    memset(&d, 0, sizeof d);
    d.dataset = &ds; d.batch = 10; d.prefetch = 1;
    CHECK_OK(dt_loader_create(&l, &d));
    CHECK_OK(dt_loader_start_epoch(l, 0));
    CHECK(dt_loader_next(l, &x, &y, &n) == DT_OK && n > 0);
    t0 = dt_time_now();
    while (done != 1 && dt_time_now() - t0 < 10.0) {   /* without calling next again */
        dt__mutex_lock(&l->mu);
        done = l->done;
        dt__mutex_unlock(&l->mu);
    }
    CHECK(done == 1);
    CHECK(id_of(x) == 0 && n == 10);                      /* batch 0 untouched meanwhile */
    dt_loader_destroy(l);
#endif
}

static void test_loader_mid_epoch(void) {
    dt_dataset ds = make_ds();
    dt_loader *l, *ref;
    dt_loader_desc d;
    const float *x;
    const int32_t *y;
    int64_t n, ia[NS], ib[NS], nb, last;
    int trial, k;
    memset(&d, 0, sizeof d);
    d.dataset = &ds; d.batch = 4; d.shuffle = 1; d.seed = 3;
    CHECK_OK(dt_loader_create(&ref, &d));
    for (trial = 0; trial < 40; trial++) {
        d.prefetch = trial % 4 != 3;
        CHECK_OK(dt_loader_create(&l, &d));
        if (trial % 5 == 4) { dt_loader_destroy(l); continue; }   /* destroy before any epoch */
        CHECK_OK(dt_loader_start_epoch(l, trial));
        for (k = 0; k < trial % 7; k++) CHECK(dt_loader_next(l, &x, &y, &n) == DT_OK && n > 0);
        if (trial % 2) {   /* a new epoch in the middle of one: the same batches as a fresh start */
            CHECK(epoch_ids(l, trial + 1, ia, &nb, &last) == NS);
            CHECK(epoch_ids(ref, trial + 1, ib, &nb, &last) == NS);
            CHECK(memcmp(ia, ib, sizeof ia) == 0);
            CHECK_OK(dt_loader_start_epoch(l, 0));
            for (k = 0; k < trial % 3; k++) CHECK(dt_loader_next(l, &x, &y, &n) == DT_OK && n > 0);
        }
        dt_loader_destroy(l);   /* mid-epoch: the worker may be converting */
    }
    dt_loader_destroy(ref);
    dt_loader_destroy(NULL);
    CHECK(live_allocs == 0);
}

/* DistributedSampler semantics through the loader: the sampler's ids per epoch, set before the epoch. */
static void test_loader_with_sampler(void) {
    dt_dataset ds = make_ds();
    dt_loader *l[3];
    dt_loader_desc d;
    int64_t want[NS], got[NS], n, nb, last, e;
    const float *x;
    const int32_t *y;
    int r;
    memset(&d, 0, sizeof d);
    d.dataset = &ds; d.batch = 5; d.prefetch = 1;
    for (r = 0; r < 3; r++) {
        d.count = sampler_size(NS, 3, 0);
        CHECK_OK(sampler(NS, r, 3, 1, 0, 1, 0, want, &n));
        d.indices = want;
        CHECK_OK(dt_loader_create(&l[r], &d));
    }
    for (e = 0; e < 3; e++) {
        int hits[NS] = {0}, i;
        for (r = 0; r < 3; r++) {
            CHECK_OK(sampler(NS, r, 3, 1, e, 1, 0, want, &n));
            CHECK_OK(dt_loader_set_indices(l[r], want, n));
            CHECK_ERR(dt_loader_next(l[r], &x, &y, &nb), DT_ERR_STATE);   /* no epoch after new ids */
            CHECK(strstr(dt_last_error(), "dt_loader_start_epoch") != NULL);
            CHECK_OK(sampler(NS, r, 3, 1, e, 1, 0, want, &n));
            CHECK(epoch_ids(l[r], e, got, &nb, &last) == n && n == 35);
            CHECK(memcmp(got, want, sizeof(int64_t) * (size_t)n) == 0);
            for (i = 0; i < n; i++) hits[got[i]]++;
        }
        for (i = 0; i < NS; i++) CHECK(hits[i] >= 1);   /* 105 = 103 + 2 padded */
    }
    CHECK_ERR(dt_loader_set_indices(l[0], want, 36), DT_ERR_INVALID_ARG);   /* more than at create */
    want[0] = NS;
    CHECK_ERR(dt_loader_set_indices(l[0], want, 3), DT_ERR_INVALID_ARG);
    CHECK_OK(dt_loader_set_indices(l[0], want, 0));
    CHECK_OK(dt_loader_start_epoch(l[0], 0));
    CHECK(dt_loader_batches(l[0]) == 0);
    for (r = 0; r < 3; r++) dt_loader_destroy(l[r]);
    CHECK(live_allocs == 0);
}

static void test_loader_errors(void) {
    dt_dataset ds = make_ds(), empty;
    dt_loader *l = (dt_loader *)&l;
    dt_loader_desc d;
    dt_transform t;
    int64_t idx[3] = {0, 5, NS};
    const float *x;
    const int32_t *y;
    int64_t n;
    memset(&empty, 0, sizeof empty);
    memset(&t, 0, sizeof t);
    memset(&d, 0, sizeof d);
    CHECK_ERR(dt_loader_create(&l, NULL), DT_ERR_INVALID_ARG);
    CHECK(l == NULL);
    CHECK_ERR(dt_loader_create(NULL, &d), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_INVALID_ARG);           /* NULL dataset */
    CHECK(strstr(dt_last_error(), "dataset") != NULL);
    d.dataset = &empty;
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_STATE);                 /* not loaded */
    CHECK(strstr(dt_last_error(), "load") != NULL);
    d.dataset = &ds;
    d.batch = -1;
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "batch") != NULL);
    d.batch = 4;
    d.indices = idx; d.count = 3;                                      /* index NS is out of range */
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "indices[2]") != NULL && strstr(dt_last_error(), "103") != NULL);
    idx[2] = -1;
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_INVALID_ARG);
    d.count = -2;
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_INVALID_ARG);
    d.indices = NULL; d.count = 5;                                     /* count without indices */
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_INVALID_ARG);
    d.count = 0;
    t.crop_pad = -1;
    d.transform = &t;
    CHECK_ERR(dt_loader_create(&l, &d), DT_ERR_INVALID_ARG);
    CHECK(l == NULL);
    d.transform = NULL;
    d.batch = 0;                                                       /* default 64 */
    CHECK_OK(dt_loader_create(&l, &d));
    CHECK(dt_loader_batches(l) == 2);
    CHECK_ERR(dt_loader_next(l, &x, &y, &n), DT_ERR_STATE);            /* no epoch yet */
    CHECK(strstr(dt_last_error(), "DT_ERR_STATE") != NULL);
    CHECK_ERR(dt_loader_next(l, NULL, &y, &n), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_loader_start_epoch(l, -1), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_loader_start_epoch(NULL, 0), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_loader_set_indices(NULL, idx, 1), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_loader_set_indices(l, NULL, 1), DT_ERR_INVALID_ARG);
    CHECK(dt_loader_batches(NULL) == 0);
    dt_loader_destroy(l);
    {   /* a conversion that fails (here: the dataset shrank under the loader) is reported by next, also
           when it failed on the prefetch thread, and again on the following call */
        int pf;
        for (pf = 0; pf < 2; pf++) {
            dt_dataset shrink = make_ds();
            memset(&d, 0, sizeof d);
            d.dataset = &shrink; d.batch = 10; d.prefetch = pf;
            CHECK_OK(dt_loader_create(&l, &d));
            shrink.count = 12;   /* batch 0 holds samples 0..9, batch 1 samples 10..19 */
            CHECK_OK(dt_loader_start_epoch(l, 0));
            CHECK(dt_loader_next(l, &x, &y, &n) == DT_OK && n == 10);
            CHECK(dt_loader_next(l, &x, &y, &n) == DT_ERR_INVALID_ARG && x == NULL && n == 0);
            CHECK(strncmp(dt_last_error(), "DT_ERR_INVALID_ARG: dt_dataset_batch: sample index", 50) == 0);
            CHECK_ERR(dt_loader_next(l, &x, &y, &n), DT_ERR_INVALID_ARG);
            shrink.count = NS;
            if (pf) CHECK_ERR(dt_loader_next(l, &x, &y, &n), DT_ERR_INVALID_ARG);   /* prefetch keeps the failed batch */
            else CHECK(dt_loader_next(l, &x, &y, &n) == DT_OK && n == 10);
            CHECK_OK(dt_loader_start_epoch(l, 1));                    /* a new epoch clears it */
            CHECK(dt_loader_next(l, &x, &y, &n) == DT_OK && n == 10);
            dt_loader_destroy(l);
        }
    }
    CHECK(live_allocs == 0);
}

/* Out of memory at every allocation: an error, *out or *p zeroed, nothing leaked. */
static void test_out_of_memory(void) {
    dt_dataset ds = make_ds();
    int32_t *lab = random_labels(500, 10);
    int64_t out[500], n;
    long k;
    int pf, ok;
    for (k = 0; k < 4; k++) {
        dt_partition p;
        dt_loader *l;
        dt_loader_desc d;
        dt_result r;
        total_allocs = 0; fail_after = k;
        r = part_dirichlet(&p, lab, 500, 10, 7, 0.5f, 1);
        CHECK(r == (k >= 2 ? DT_OK : DT_ERR_OUT_OF_MEMORY) && (r == DT_OK || p.offsets == NULL));
        dt_partition_free(&p);
        total_allocs = 0;
        r = part_shards(&p, lab, 500, 7, 2, 1);
        CHECK(r == (k >= 2 ? DT_OK : DT_ERR_OUT_OF_MEMORY) && (r == DT_OK || p.offsets == NULL));
        dt_partition_free(&p);
        total_allocs = 0;
        r = part_iid(&p, 500, 7, 1);
        CHECK(r == (k >= 1 ? DT_OK : DT_ERR_OUT_OF_MEMORY));
        dt_partition_free(&p);
        total_allocs = 0;
        r = sampler(500, 1, 3, 0, 0, 1, 0, out, &n);
        CHECK(r == (k >= 1 ? DT_OK : DT_ERR_OUT_OF_MEMORY) && (r == DT_OK || n == 0));
        for (pf = 0; pf < 2; pf++) {
            memset(&d, 0, sizeof d);
            d.dataset = &ds; d.prefetch = pf;
            total_allocs = 0;
            l = (dt_loader *)&l;
            r = dt_loader_create(&l, &d);
            ok = r == (k >= 1 ? DT_OK : DT_ERR_OUT_OF_MEMORY) && (r == DT_OK) == (l != NULL);
            CHECK(ok);
            if (r == DT_ERR_OUT_OF_MEMORY) CHECK(strstr(dt_last_error(), "memory") != NULL);
            dt_loader_destroy(l);
        }
        fail_after = -1;
        CHECK(live_allocs == 0);
    }
    free(lab);
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_partition\n");
    RUN(test_gamma_sampler);
    RUN(test_contiguous_and_iid);
    RUN(test_fractions);
    RUN(test_shards);
    RUN(test_dirichlet);
    RUN(test_histogram);
    RUN(test_partition_errors);
    RUN(test_partition_desc);
    RUN(test_sampler);
    RUN(test_sampler_pytorch_example);
    RUN(test_sampler_desc);
    RUN(test_loader_batches);
    RUN(test_loader_determinism);
    RUN(test_loader_prefetch_identical);
    RUN(test_loader_prefetches_ahead);
    RUN(test_loader_mid_epoch);
    RUN(test_loader_with_sampler);
    RUN(test_loader_errors);
    RUN(test_out_of_memory);
    return dt_t_summary();
}
