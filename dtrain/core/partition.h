/* dtrain/core/partition.h - the partitioners and the distributed sampler.   Part of dtrain v0.1.0, MIT
   license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The partitioners (fractions, IID, contiguous, the FedAvg paper's label shards, Dirichlet label skew),
     each sample in exactly one part; a distributed sampler with PyTorch's semantics; and the seeded
     draws they share with the loader of dtrain/core/data.h (the shuffle of an epoch's order): pure
     functions of their seeds, so every rank computes the same split without communicating.
   USES
     dtrain/core/base.h only (a partition is of sample ids: it knows nothing of datasets or models).
   READ FIRST
     dt_partition_create (and dt__partition_dirichlet), dt_sampler_indices.
*/
#ifndef DTRAIN_PARTITION_H
#define DTRAIN_PARTITION_H
#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- partitions ------------------------------------------------------------------------------ */

/* A split of the sample ids 0..count-1 into `parts` disjoint lists that together hold every id exactly
   once. Part p is indices[offsets[p] .. offsets[p+1]); offsets[0] = 0 and offsets[parts] = count.
   dt_partition_create allocates offsets and indices as one block (indices points into it), zeroes *p on
   failure, and is a pure function of its desc: every rank computes the same partition from the same seed
   without communicating. A part can be empty only where its kind says so. */
typedef struct dt_partition {
    int      parts;
    int64_t *offsets;            /* [parts + 1] */
    int64_t *indices;            /* [count] sample ids; part p is indices[offsets[p] .. offsets[p+1]) */
} dt_partition;

/* The partitioners. Every one is a pure function of its desc, each sample in exactly one part:
     IID         a seeded shuffle, then part p takes floor(count / parts) samples, plus one when
                 p < count % parts (sizes differ by at most 1; parts beyond count are empty)
     CONTIGUOUS  the same sizes as blocks in index order: part p is [start_p, start_p + n_p)
     FRACTIONS   train/val/test style: a seeded shuffle, then consecutive slices, part p taking fractions[p]
                 of the samples (e.g. {0.7f, 0.2f, 0.1f}), each >= 0, summing to 1 within 1e-4. Sizes:
                 n_p = floor(count * f_p / sum(f)); the samples left over (fewer than parts) go one each to
                 the parts with f_p > 0 in order 0, 1, 2, ...; so f_p = 0 gives an empty part
     SHARDS      the pathological non-IID split of the FedAvg paper (McMahan et al. 2017): the ids are sorted
                 by label (stable, so ties keep id order), cut into S = parts * shards_per_part shards of
                 floor(count / S) ids (the first count % S shards one more), and each part receives
                 shards_per_part shards drawn at random without replacement. With 2 shards per part most
                 parts hold at most 2 labels. Parts are empty only when count < S leaves shards empty
     DIRICHLET   label skew: for each class, proportions q ~ Dirichlet(alpha, ..., alpha) over the parts, and
                 the class's samples (shuffled) are cut at floor(n_class * cumsum(q)). Small alpha (0.1) =
                 each part dominated by a few classes; large alpha (100) = near IID. When count >= parts no
                 part is empty: an allocation with an empty part is redrawn (up to 100 draws, as common
                 implementations do), and if one remains empty, one sample at a time moves to it from the
                 largest part */
typedef enum dt_partition_kind {
    DT_PARTITION_IID = 0, DT_PARTITION_CONTIGUOUS, DT_PARTITION_FRACTIONS, DT_PARTITION_SHARDS, DT_PARTITION_DIRICHLET,
    DT_PARTITION_KIND_COUNT
} dt_partition_kind;
const char *dt_partition_kind_name(dt_partition_kind k);   /* "iid", "contiguous", "fractions", "shards", "dirichlet" */
dt_result   dt_partition_kind_parse(const char *s, dt_partition_kind *out);

/* A partition's settings; zero means the default where there is one. A setting of another kind than `kind`
   (fractions, shards_per_part, num_classes, alpha) is refused, so a forgotten kind cannot go unnoticed. */
typedef struct dt_partition_desc {
    dt_partition_kind kind;             /* default DT_PARTITION_IID */
    int64_t           count;            /* the samples, ids 0..count-1, >= 0 */
    int               parts;            /* >= 1 (no default) */
    uint64_t          seed;             /* the shuffles and draws (CONTIGUOUS draws nothing) */
    const float      *fractions;        /* FRACTIONS: [parts] */
    const int32_t    *labels;           /* SHARDS (each >= 0), DIRICHLET (each in [0, num_classes)): [count] */
    int               shards_per_part;  /* SHARDS: default 2, the FedAvg paper's */
    int64_t           num_classes;      /* DIRICHLET: >= 1 (no default: the dataset's num_classes) */
    float             alpha;            /* DIRICHLET: the concentration, finite and > 0 (no default) */
} dt_partition_desc;

/* Builds the partition d describes into *p, allocating offsets and indices as one block; *p is zeroed on
   failure, and a wrong setting is DT_ERR_INVALID_ARG naming the field and the fix. */
dt_result dt_partition_create(dt_partition *p, const dt_partition_desc *d);
/* Frees what dt_partition_create allocated and zeroes *p. NULL is allowed. */
void dt_partition_free(dt_partition *p);
/* Label histogram of each part: hist [parts, num_classes], hist[p * num_classes + k] = samples of class k in
   part p. labels is indexed by sample id; a label outside [0, num_classes) is an error. */
dt_result dt_partition_histogram(const dt_partition *p, const int32_t *labels, int64_t num_classes, int64_t *hist);

/* ---- distributed sampler --------------------------------------------------------------------- */

/* PyTorch's DistributedSampler, configured. Zero means the default where there is one. */
typedef struct dt_sampler_desc {
    int64_t  count;       /* the samples, ids 0..count-1, >= 0 */
    int      rank;        /* whose share: 0 <= rank < world */
    int      world;       /* the ranks sharing the samples, >= 1 (no default: e.g. dt_comm_size) */
    uint64_t seed;        /* the shuffle's, the same on every rank */
    int64_t  epoch;       /* >= 0; each epoch its own permutation */
    int      shuffle;     /* 1: a permutation seeded by (seed, epoch); 0 (default): the ids in order */
    int      drop_last;   /* 1: truncate to floor(count / world) per rank; 0 (default): pad to ceil(count / world) */
} dt_sampler_desc;

/* Samples per rank and epoch: ceil(count / world), or floor(count / world) with drop_last (0 for NULL or
   bad fields). */
int64_t dt_sampler_size(const dt_sampler_desc *d);
/* d->rank's sample ids for epoch d->epoch. The list is a permutation of 0..count-1 seeded by (seed, epoch)
   alone, the same on every rank (identity without shuffle); without drop_last it is padded to
   total = ceil(count / world) * world by repeating it from its start, with drop_last truncated to
   floor(count / world) * world; rank takes positions rank, rank + world, rank + 2 world, ... So every rank
   gets *n_out = dt_sampler_size(d) ids, and the ranks' shares are disjoint apart from the padding.
   out [dt_sampler_size(d)]. With shuffle it allocates a temporary [count] permutation. */
dt_result dt_sampler_indices(const dt_sampler_desc *d, int64_t *out, int64_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PARTITION_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_PARTITION_IMPLEMENTATION_DONE)
#define DTRAIN_PARTITION_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"

/* ---- random helpers for the partitioners, the sampler and the loader ------------------------- */

/* RNG streams of the partitioners and the sampler: fixed, so that every rank draws the same numbers. */
#define DT__STREAM_PARTITION 0x7061727469ULL
#define DT__STREAM_SAMPLER   0x73616d706cULL
/* Draws of the Dirichlet partitioner before it moves samples into parts left empty. */
#define DT__DIRICHLET_TRIES 100

/* Uniform double in the open interval (0, 1), 52 random bits: never 0, so its logarithm is finite. */
static double dt__rng_open01(dt_rng *r) {
    uint64_t hi = dt_rng_u32(r) >> 6, lo = dt_rng_u32(r) >> 6;
    return ((double)((hi << 26) | lo) + 0.5) * (1.0 / 4503599627370496.0);
}

/* Uniform integer in [0, n), unbiased, for n up to 2^64 - 1 (dt_rng_below covers 32 bits). n > 0. */
static uint64_t dt__rng_below64(dt_rng *r, uint64_t n) {
    uint64_t threshold, hi, x;
    if (n <= 0xffffffffULL) return dt_rng_below(r, (uint32_t)n);
    threshold = (0 - n) % n;
    for (;;) {
        hi = dt_rng_u32(r);
        x = (hi << 32) | dt_rng_u32(r);
        if (x >= threshold) return x % n;
    }
}

/* Fisher-Yates shuffle of a [n]. */
static void dt__shuffle(int64_t *a, int64_t n, dt_rng *r) {
    int64_t i, j, t;
    for (i = n - 1; i > 0; i--) {
        j = (int64_t)dt__rng_below64(r, (uint64_t)i + 1);
        t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

/* The generator of one (seed, epoch) on one stream; the mixed seed puts epochs far apart on the stream. */
static void dt__rng_epoch(dt_rng *r, uint64_t seed, uint64_t epoch, uint64_t stream) {
    dt_rng_init(r, dt__mix64(seed ^ dt__mix64(epoch + 0x9e3779b97f4a7c15ULL)), stream);
}

/* log of a Gamma(shape, 1) variate, shape > 0: Marsaglia and Tsang (2000), "A simple method for generating
   gamma variables". For shape < 1 it uses Gamma(shape) = Gamma(shape + 1) * U^(1/shape) (the boost);
   returning the logarithm keeps tiny shapes (alpha = 0.01) from underflowing to 0. */
static double dt__rng_log_gamma(dt_rng *r, double shape) {
    double boost = 0.0, d, c, x, v, u;
    if (shape < 1.0) {
        boost = log(dt__rng_open01(r)) / shape;
        shape += 1.0;
    }
    d = shape - 1.0 / 3.0;
    c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        do {   /* standard normal x (Box-Muller, one of the pair) with 1 + c x > 0 */
            double u1 = dt__rng_open01(r), u2 = dt__rng_open01(r);
            x = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        u = dt__rng_open01(r);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return log(d * v) + boost;
    }
}
#ifdef DT__TEST_HOOKS   /* the test programs' handles (tests/dt_test_hooks.h; compiled in by tests/impl_test.c) */
double dt__test_rng_open01(dt_rng *r);
double dt__test_rng_log_gamma(dt_rng *r, double shape);
double dt__test_rng_open01(dt_rng *r) { return dt__rng_open01(r); }
double dt__test_rng_log_gamma(dt_rng *r, double shape) { return dt__rng_log_gamma(r, shape); }
#endif

/* ---- partitions ------------------------------------------------------------------------------ */

void dt_partition_free(dt_partition *p) {
    if (!p) return;
    DT_FREE(p->offsets);   /* offsets and indices are one block */
    memset(p, 0, sizeof *p);
}

static const char *const dt__partition_kind_names[DT_PARTITION_KIND_COUNT] = {"iid", "contiguous", "fractions", "shards",
                                                                                "dirichlet"};
const char *dt_partition_kind_name(dt_partition_kind k) {
    return dt__enum_name(dt__partition_kind_names, DT_PARTITION_KIND_COUNT, (int)k);
}

dt_result dt_partition_kind_parse(const char *s, dt_partition_kind *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__partition_kind_names, DT_PARTITION_KIND_COUNT, s, &k, "partition");
    if (r == DT_OK && out) *out = (dt_partition_kind)k;
    return r;
}

/* Zeroes *p and checks what every kind has, and that no other kind's setting is set (a forgotten kind
   would otherwise build an IID split silently). fn gets "dt_partition_create (KIND)" for the messages. */
static dt_result dt__partition_check(dt_partition *p, const dt_partition_desc *d, char *fn, size_t fn_size) {
    const char *other = NULL;
    snprintf(fn, fn_size, "dt_partition_create");
    if (!p) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the partition pointer is NULL", fn);
    memset(p, 0, sizeof *p);
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the desc is NULL; pass a dt_partition_desc with count and parts", fn);
    if ((int)d->kind < 0 || d->kind >= DT_PARTITION_KIND_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: kind is %d; use a dt_partition_kind (DT_PARTITION_IID, _CONTIGUOUS, "
                            "_FRACTIONS, _SHARDS or _DIRICHLET)", fn, (int)d->kind);
    snprintf(fn, fn_size, "dt_partition_create (%s)", dt_partition_kind_name(d->kind));
    if (d->count < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0 (the number of samples)", fn,
                            (long long)d->count);
    if (d->parts < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: parts is %d; set it to the number of parts, >= 1 (e.g. the ranks or "
                            "clients)", fn, d->parts);
    if (d->fractions && d->kind != DT_PARTITION_FRACTIONS) other = "fractions (DT_PARTITION_FRACTIONS)";
    else if (d->shards_per_part && d->kind != DT_PARTITION_SHARDS) other = "shards_per_part (DT_PARTITION_SHARDS)";
    else if (d->num_classes && d->kind != DT_PARTITION_DIRICHLET) other = "num_classes (DT_PARTITION_DIRICHLET)";
    else if (d->alpha != 0.0f && d->kind != DT_PARTITION_DIRICHLET) other = "alpha (DT_PARTITION_DIRICHLET)";
    if (other)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s is set, which this kind does not use; set kind to the one that "
                            "does, or leave the field 0", fn, other);
    return DT_OK;
}

/* Allocates offsets [parts + 1] and indices [count] as one block. */
static dt_result dt__partition_alloc(dt_partition *p, int parts, int64_t count, const char *fn) {
    uint64_t n = (uint64_t)parts + 1 + (uint64_t)count;
    if (n > SIZE_MAX / sizeof(int64_t) || !(p->offsets = (int64_t *)DT_MALLOC((size_t)n * sizeof(int64_t))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for a partition of %lld samples into %d parts", fn,
                            (long long)count, parts);
    p->parts = parts;
    p->indices = p->offsets + parts + 1;
    return DT_OK;
}

/* offsets of parts of sizes floor(count / parts) + (p < count % parts) */
static void dt__offsets_equal(int64_t *off, int parts, int64_t count) {
    int64_t q = count / parts, rem = count % parts;
    int k;
    off[0] = 0;
    for (k = 0; k < parts; k++) off[k + 1] = off[k] + q + (k < rem ? 1 : 0);
}

static void dt__iota(int64_t *a, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) a[i] = i;
}

static dt_result dt__partition_fractions(dt_partition *p, const dt_partition_desc *d, const char *fn) {
    const float *fractions = d->fractions;
    double sum = 0.0;
    int64_t count = d->count, left, n, *off;
    int k, parts = d->parts;
    dt_rng r;
    dt_result e;
    if (!fractions)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: fractions is NULL; pass one fraction per part, e.g. {0.7f, 0.2f, 0.1f}", fn);
    for (k = 0; k < parts; k++) {
        if (!(fractions[k] >= 0.0f && fractions[k] <= FLT_MAX))
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: fractions[%d] is %g; each fraction must be a finite number >= 0",
                                fn, k, (double)fractions[k]);
        sum += (double)fractions[k];
    }
    if (fabs(sum - 1.0) > 1e-4)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the %d fractions sum to %.6f; they must sum to 1 (within 1e-4)", fn,
                            parts, sum);
    if ((e = dt__partition_alloc(p, parts, count, fn)) != DT_OK) return e;
    off = p->offsets;
    left = count;
    for (k = 0; k < parts; k++) {   /* sizes first, in off[k + 1] */
        n = (int64_t)floor((double)count * ((double)fractions[k] / sum));
        if (n > left) n = left;     /* rounding can never hand out more than count */
        off[k + 1] = n;
        left -= n;
    }
    for (k = 0; left > 0; k = (k + 1) % parts)   /* the leftover (< parts): one each to nonzero parts, in order */
        if (fractions[k] > 0.0f) { off[k + 1]++; left--; }
    off[0] = 0;
    for (k = 0; k < parts; k++) off[k + 1] += off[k];
    dt__iota(p->indices, count);
    dt_rng_init(&r, d->seed, DT__STREAM_PARTITION);
    dt__shuffle(p->indices, count, &r);
    return DT_OK;
}

/* IID (shuffle) and CONTIGUOUS: parts of sizes differing by at most one. */
static dt_result dt__partition_equal(dt_partition *p, const dt_partition_desc *d, const char *fn) {
    dt_rng r;
    dt_result e = dt__partition_alloc(p, d->parts, d->count, fn);
    if (e != DT_OK) return e;
    dt__offsets_equal(p->offsets, d->parts, d->count);
    dt__iota(p->indices, d->count);
    if (d->kind == DT_PARTITION_IID) {
        dt_rng_init(&r, d->seed, DT__STREAM_PARTITION);
        dt__shuffle(p->indices, d->count, &r);
    }
    return DT_OK;
}

/* Stable sort of ids [n] by labels[id]: bottom-up merge sort with scratch tmp [n]. */
static void dt__sort_by_label(int64_t *ids, int64_t *tmp, int64_t n, const int32_t *labels) {
    int64_t width, i, *src = ids, *dst = tmp, *t;
    for (width = 1; width < n; width *= 2) {
        for (i = 0; i < n; i += 2 * width) {
            int64_t mid = i + width < n ? i + width : n, hi = i + 2 * width < n ? i + 2 * width : n;
            int64_t a = i, b = mid, k = i;
            while (a < mid && b < hi) dst[k++] = labels[src[b]] < labels[src[a]] ? src[b++] : src[a++];
            while (a < mid) dst[k++] = src[a++];
            while (b < hi) dst[k++] = src[b++];
        }
        t = src; src = dst; dst = t;
    }
    if (src != ids) memcpy(ids, src, (size_t)n * sizeof *ids);
}

static dt_result dt__partition_shards(dt_partition *p, const dt_partition_desc *d, const char *fn) {
    const int32_t *labels = d->labels;
    int64_t count = d->count, i, shards, q, rem, pos, *tmp, *sorted, *perm;
    int k, j, parts = d->parts, shards_per_part = d->shards_per_part ? d->shards_per_part : 2;
    dt_rng r;
    dt_result e;
    if (shards_per_part < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: shards_per_part is %d; it must be >= 1, or 0 for the default 2 (the FedAvg paper's)", fn,
                            shards_per_part);
    if (count > 0 && !labels) return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL; pass the dataset's labels", fn);
    for (i = 0; i < count; i++)
        if (labels[i] < 0)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels[%lld] is %d; labels must be >= 0", fn, (long long)i,
                                (int)labels[i]);
    shards = (int64_t)parts * shards_per_part;
    if ((uint64_t)count + (uint64_t)shards > SIZE_MAX / sizeof(int64_t) ||
        !(tmp = (int64_t *)DT_MALLOC((size_t)(count + shards) * sizeof(int64_t))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld samples and %lld shards", fn,
                            (long long)count, (long long)shards);
    if ((e = dt__partition_alloc(p, parts, count, fn)) != DT_OK) { DT_FREE(tmp); return e; }
    sorted = tmp;
    perm = tmp + count;
    dt__iota(sorted, count);
    dt__sort_by_label(sorted, p->indices, count, labels);   /* p->indices is the scratch here */
    dt__iota(perm, shards);
    dt_rng_init(&r, d->seed, DT__STREAM_PARTITION);
    dt__shuffle(perm, shards, &r);
    q = count / shards;
    rem = count % shards;
    pos = 0;
    for (k = 0; k < parts; k++) {   /* part k takes shards perm[k * spp .. (k + 1) * spp) */
        p->offsets[k] = pos;
        for (j = 0; j < shards_per_part; j++) {
            int64_t s = perm[(int64_t)k * shards_per_part + j];
            int64_t start = s * q + (s < rem ? s : rem), size = q + (s < rem ? 1 : 0);
            memcpy(p->indices + pos, sorted + start, (size_t)size * sizeof(int64_t));
            pos += size;
        }
    }
    p->offsets[parts] = pos;
    DT_FREE(tmp);
    return DT_OK;
}

static dt_result dt__partition_dirichlet(dt_partition *p, const dt_partition_desc *d, const char *fn) {
    const int32_t *labels = d->labels;
    int64_t count = d->count, num_classes = d->num_classes, i, k, cells, n64, *byclass, *coff, *cnt, *tot, *pos;
    float alpha = d->alpha;
    double *w;
    char *mem;
    int j, attempt, empty, parts = d->parts;
    dt_rng r;
    dt_result e;
    if (num_classes < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: num_classes is %lld; it must be >= 1 (the dataset's num_classes)", fn,
                            (long long)num_classes);
    if (!(alpha > 0.0f && alpha <= FLT_MAX))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: alpha is %g; it must be a finite number > 0 (0.1 = strong label "
                            "skew, 100 = near IID)", fn, (double)alpha);
    if (count > 0 && !labels) return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL; pass the dataset's labels", fn);
    for (i = 0; i < count; i++)
        if (labels[i] < 0 || labels[i] >= num_classes)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels[%lld] is %d, outside [0, %lld); pass the dataset's "
                                "num_classes", fn, (long long)i, (int)labels[i], (long long)num_classes);
    /* scratch: byclass [count], coff [num_classes + 1], cnt [num_classes, parts], tot [parts], pos [parts],
       then w [parts] doubles */
    if (num_classes > (INT64_MAX / 8) / parts) cells = -1;
    else cells = num_classes * parts;
    n64 = cells < 0 ? -1 : count + num_classes + 1 + cells + 2 * (int64_t)parts;
    if (n64 < 0 || (uint64_t)n64 + (uint64_t)parts > SIZE_MAX / 8 ||
        !(mem = (char *)DT_MALLOC((size_t)(n64 + parts) * 8)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld classes x %d parts", fn,
                            (long long)num_classes, parts);
    if ((e = dt__partition_alloc(p, parts, count, fn)) != DT_OK) { DT_FREE(mem); return e; }
    byclass = (int64_t *)mem;
    coff = byclass + count;
    cnt = coff + num_classes + 1;
    tot = cnt + cells;
    pos = tot + parts;
    w = (double *)(pos + parts);
    /* counting sort of the ids by class: coff[k] is where class k starts */
    memset(coff, 0, (size_t)(num_classes + 1) * sizeof *coff);
    for (i = 0; i < count; i++) coff[labels[i] + 1]++;
    for (k = 0; k < num_classes; k++) coff[k + 1] += coff[k];
    for (i = 0; i < count; i++) byclass[coff[labels[i]]++] = i;
    for (k = num_classes; k > 0; k--) coff[k] = coff[k - 1];
    coff[0] = 0;
    dt_rng_init(&r, d->seed, DT__STREAM_PARTITION);
    for (k = 0; k < num_classes; k++) dt__shuffle(byclass + coff[k], coff[k + 1] - coff[k], &r);
    for (attempt = 0; attempt < DT__DIRICHLET_TRIES; attempt++) {
        memset(tot, 0, (size_t)parts * sizeof *tot);
        for (k = 0; k < num_classes; k++) {
            int64_t nk = coff[k + 1] - coff[k], prev = 0, c, *row = cnt + k * parts;
            double mx = -HUGE_VAL, sum = 0.0, acc = 0.0;
            if (nk == 0) { memset(row, 0, (size_t)parts * sizeof *row); continue; }
            for (j = 0; j < parts; j++) {   /* q = g / sum(g), g_j ~ Gamma(alpha), computed from log g */
                w[j] = dt__rng_log_gamma(&r, (double)alpha);
                if (w[j] > mx) mx = w[j];
            }
            for (j = 0; j < parts; j++) sum += (w[j] = exp(w[j] - mx));
            for (j = 0; j < parts; j++) {   /* cut the class at floor(nk * cumsum(q)) */
                acc += w[j];
                c = j == parts - 1 ? nk : (int64_t)floor((double)nk * (acc / sum));
                if (c > nk) c = nk;
                if (c < prev) c = prev;
                row[j] = c - prev;
                tot[j] += c - prev;
                prev = c;
            }
        }
        for (empty = 0, j = 0; j < parts; j++) empty += tot[j] == 0;
        if (empty == 0 || count < parts) break;
    }
    if (count >= parts)   /* still empty after the redraws: move one sample to it from the largest part */
        for (j = 0; j < parts; j++) {
            int big = 0, kk = 0;
            if (tot[j] > 0) continue;
            for (i = 1; i < parts; i++) if (tot[i] > tot[big]) big = (int)i;
            for (k = 1; k < num_classes; k++) if (cnt[k * parts + big] > cnt[kk * parts + big]) kk = (int)k;
            cnt[kk * parts + big]--; tot[big]--;
            cnt[kk * parts + j]++; tot[j]++;
        }
    p->offsets[0] = 0;
    for (j = 0; j < parts; j++) {
        p->offsets[j + 1] = p->offsets[j] + tot[j];
        pos[j] = p->offsets[j];
    }
    for (k = 0; k < num_classes; k++) {   /* class k's shuffled ids, cut in part order */
        int64_t s = coff[k];
        for (j = 0; j < parts; j++) {
            int64_t c = cnt[k * parts + j];
            memcpy(p->indices + pos[j], byclass + s, (size_t)c * sizeof(int64_t));
            pos[j] += c;
            s += c;
        }
    }
    DT_FREE(mem);
    return DT_OK;
}

dt_result dt_partition_create(dt_partition *p, const dt_partition_desc *d) {
    char fn[48];
    dt_result e = dt__partition_check(p, d, fn, sizeof fn);
    if (e != DT_OK) return e;
    switch (d->kind) {
    case DT_PARTITION_FRACTIONS: return dt__partition_fractions(p, d, fn);
    case DT_PARTITION_SHARDS: return dt__partition_shards(p, d, fn);
    case DT_PARTITION_DIRICHLET: return dt__partition_dirichlet(p, d, fn);
    default: return dt__partition_equal(p, d, fn);   /* IID, CONTIGUOUS */
    }
}

dt_result dt_partition_histogram(const dt_partition *p, const int32_t *labels, int64_t num_classes, int64_t *hist) {
    const char *fn = "dt_partition_histogram";
    int64_t i, id;
    int k;
    if (!p || !hist) return dt_set_error(DT_ERR_INVALID_ARG, "%s: NULL argument (partition and hist are needed)", fn);
    if (p->parts < 1 || !p->offsets)
        return dt_set_error(DT_ERR_STATE, "%s: the partition has no parts; build it with dt_partition_create", fn);
    if (num_classes < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: num_classes is %lld; it must be >= 1", fn, (long long)num_classes);
    if (p->offsets[p->parts] > 0 && (!labels || !p->indices))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL; pass the dataset's labels", fn);
    memset(hist, 0, (size_t)p->parts * (size_t)num_classes * sizeof *hist);
    for (k = 0; k < p->parts; k++)
        for (i = p->offsets[k]; i < p->offsets[k + 1]; i++) {
            id = p->indices[i];
            if (id < 0)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: part %d holds the negative sample id %lld", fn, k, (long long)id);
            if (labels[id] < 0 || labels[id] >= num_classes)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: sample %lld (part %d) has label %d, outside [0, %lld); pass "
                                    "the dataset's num_classes", fn, (long long)id, k, (int)labels[id],
                                    (long long)num_classes);
            hist[(int64_t)k * num_classes + labels[id]]++;
        }
    return DT_OK;
}

/* ---- distributed sampler --------------------------------------------------------------------- */

int64_t dt_sampler_size(const dt_sampler_desc *d) {
    if (!d || d->count < 0 || d->world < 1) return 0;
    return d->count / d->world + (!d->drop_last && d->count % d->world != 0 ? 1 : 0);
}

dt_result dt_sampler_indices(const dt_sampler_desc *d, int64_t *out, int64_t *n_out) {
    const char *fn = "dt_sampler_indices";
    int64_t n, j, count, *perm = NULL;
    int rank, world;
    dt_rng r;
    if (!n_out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: n_out is NULL", fn);
    *n_out = 0;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the desc is NULL; pass a dt_sampler_desc with count, rank and world", fn);
    count = d->count; rank = d->rank; world = d->world;
    if (count < 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0", fn, (long long)count);
    if (world < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: world is %d; set it to the number of ranks sharing the samples, >= 1 "
                            "(e.g. dt_comm_size)", fn, world);
    if (rank < 0 || rank >= world)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank is %d of world %d; it must be in 0 .. world - 1", fn, rank, world);
    if (d->epoch < 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: epoch is %lld; it must be >= 0", fn, (long long)d->epoch);
    if ((d->shuffle != 0 && d->shuffle != 1) || (d->drop_last != 0 && d->drop_last != 1))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: shuffle is %d and drop_last %d; each must be 0 or 1", fn, d->shuffle,
                            d->drop_last);
    n = dt_sampler_size(d);
    if (n == 0) return DT_OK;
    if (!out)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: out is NULL; it must hold dt_sampler_size(d) = %lld ids", fn, (long long)n);
    if (d->shuffle) {
        if ((uint64_t)count > SIZE_MAX / sizeof(int64_t) || !(perm = (int64_t *)DT_MALLOC((size_t)count * sizeof(int64_t))))
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for a permutation of %lld samples", fn,
                                (long long)count);
        dt__iota(perm, count);
        dt__rng_epoch(&r, d->seed, (uint64_t)d->epoch, DT__STREAM_SAMPLER);
        dt__shuffle(perm, count, &r);
    }
    for (j = 0; j < n; j++) {   /* position in the padded (or truncated) list; padding repeats it from the start */
        int64_t at = (rank + j * world) % count;
        out[j] = perm ? perm[at] : at;
    }
    DT_FREE(perm);
    *n_out = n;
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
