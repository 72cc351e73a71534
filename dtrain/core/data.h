/* dtrain/core/data.h - datasets in memory, transforms and the loader.   Part of dtrain v0.1.0, MIT license
   (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The labelled image dataset, kept as uint8 (dt_dataset); its per-batch conversion to float with
     normalisation, random crop and flip (dt_dataset_batch); and the loader: the batches of one rank, the
     same for (seed, epoch, rank), converted on a background thread. The files that fill a dataset are
     read by dtrain/core/data_files.h (IDX, CIFAR-10) and dtrain/core/image_folder.h (image folders).
   USES
     dtrain/core/partition.h (the seeded shuffle of an epoch) and what it includes (a dataset knows nothing
     of models).
   READ FIRST
     dt_dataset_batch, dt_loader_next.
*/
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H
#include "partition.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A labelled image dataset held in memory as uint8, converted to float per batch. Loaders fill it and
   dt_dataset_free releases what they allocated; a dataset built by hand may point at the caller's
   arrays (then do not call dt_dataset_free). */
typedef struct dt_dataset {
    int64_t  count;              /* samples */
    int64_t  c, h, w;            /* per-sample shape: channels, height, width */
    int64_t  num_classes;
    uint8_t *pixels;             /* [count, c, h, w] */
    int32_t *labels;             /* [count], each in [0, num_classes) */
    char   **class_names;        /* [num_classes] or NULL */
    char     source[256];        /* where it was loaded from, for messages */
} dt_dataset;

/* Frees the arrays a loader allocated and zeroes *ds. NULL is allowed. */
void dt_dataset_free(dt_dataset *ds);
/* Zero-pads every image of ds to h x w, centred (torchvision's Pad before ToTensor; e.g. Fashion-MNIST's
   28x28 to VGG-11's 32x32), in place: the pixels array is replaced by one allocated here, so ds must hold
   arrays a loader allocated. h and w at least the images' size; the same size leaves ds as it is. */
dt_result dt_dataset_pad(dt_dataset *ds, int64_t h, int64_t w);

/* Per-batch conversion: x = (pixel / 255 - mean[c]) / std[c] after an optional random crop (zero padding
   of crop_pad pixels on each side, then a crop of the original size) and an optional random horizontal
   flip (p = 0.5). Zero means the default: mean 0, std 1, no crop, no flip. */
typedef struct dt_transform {
    float   mean[3], std[3];
    int64_t crop_pad;
    int     flip;
} dt_transform;

/* The samples dt_dataset_batch converts, and how. Zero means the default where there is one. */
typedef struct dt_batch_desc {
    const int64_t      *indices;     /* [count] sample ids of the dataset */
    int64_t             count;       /* > 0 (no default) */
    const dt_transform *transform;   /* NULL = pixel / 255 */
    uint64_t            seed;        /* the transform's random choices are a function of (seed, epoch, id) */
    uint64_t            epoch;
} dt_batch_desc;

/* Converts samples d->indices[0..count) of ds into x [count, c, h, w] and y [count] (host memory). Random
   choices are a pure function of (seed, epoch, sample index), so any rank or thread converting a sample in
   an epoch gets the same result. */
dt_result dt_dataset_batch(const dt_dataset *ds, const dt_batch_desc *d, float *x, int32_t *y);

/* ---- loader ---------------------------------------------------------------------------------- */

/* Batches of one rank's samples, converted to float by dt_dataset_batch. Zero means the default. */
typedef struct dt_loader_desc {
    const dt_dataset   *dataset;     /* borrowed: must stay valid and unchanged while the loader lives */
    const int64_t      *indices;     /* this rank's sample ids (e.g. a partition's part), copied at create; */
    int64_t             count;       /* NULL (and count 0) = all samples of the dataset in order */
    int64_t             batch;       /* samples per batch (default 64) */
    int                 shuffle;     /* 1: a new seeded order of the indices every epoch; 0: the given order */
    int                 drop_last;   /* 1: drop the last partial batch */
    const dt_transform *transform;   /* copied at create; NULL = pixel / 255 */
    uint64_t            seed;        /* shuffle and transform randomness */
    uint64_t            rank;        /* RNG stream of the shuffle: different ranks, different orders */
    int                 prefetch;    /* 1: a background thread converts batch k+1 while batch k is used */
} dt_loader_desc;

typedef struct dt_loader dt_loader;

/* Creates a loader; all its memory (order and batch buffers) is allocated here, nothing later. It checks
   every index against the dataset. With prefetch it starts its thread. *out is NULL on failure. One thread
   at a time may call a loader's functions. */
dt_result dt_loader_create(dt_loader **out, const dt_loader_desc *d);
/* Stops the prefetch thread (also mid-epoch) and frees everything the loader allocated. NULL is allowed. */
void dt_loader_destroy(dt_loader *l);
/* Begins epoch `epoch` (>= 0), also in the middle of another one. The batches of an epoch are a pure
   function of (desc, epoch): the order is the indices shuffled by (seed, rank, epoch) (or as given), the
   transforms are dt_dataset_batch's for (seed, epoch); timing and prefetch never change them. */
dt_result dt_loader_start_epoch(dt_loader *l, int64_t epoch);
/* Begins epoch `epoch` at its batch `batch` (0 .. dt_loader_batches): the batches skipped are not converted,
   and the ones after are those an uninterrupted epoch hands out (same order, same transforms), so a run
   resumed from a checkpoint in the middle of an epoch sees the data it would have seen. */
dt_result dt_loader_seek(dt_loader *l, int64_t epoch, int64_t batch);
/* Next batch of the epoch: x [n, c, h, w] and y [n] point into the loader and stay valid until the next
   call on l. At the end of the epoch it returns DT_OK with *n = 0 (x and y NULL): a batch is never empty, so
       while ((r = dt_loader_next(l, &x, &y, &n)) == DT_OK && n > 0) { ... }
   runs the epoch, and r tells after it whether it ended (DT_OK) or failed. */
dt_result dt_loader_next(dt_loader *l, const float **x, const int32_t **y, int64_t *n);
/* Batches per epoch: ceil(count / batch), or floor(count / batch) with drop_last. */
int64_t dt_loader_batches(const dt_loader *l);
/* Replaces the sample ids (count at most the count at create), e.g. with dt_sampler_indices's for the next
   epoch; ends the current epoch, and dt_loader_start_epoch uses the new ids. Copies them; allocates nothing. */
dt_result dt_loader_set_indices(dt_loader *l, const int64_t *indices, int64_t count);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DATA_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_DATA_IMPLEMENTATION_DONE)
#define DTRAIN_DATA_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"

void dt_dataset_free(dt_dataset *ds) {
    int64_t i;
    if (!ds) return;
    if (ds->class_names)
        for (i = 0; i < ds->num_classes; i++) DT_FREE(ds->class_names[i]);
    DT_FREE(ds->class_names);
    DT_FREE(ds->pixels);
    DT_FREE(ds->labels);
    memset(ds, 0, sizeof *ds);
}

dt_result dt_dataset_pad(dt_dataset *ds, int64_t h, int64_t w) {
    int64_t top, left, i, y;
    uint8_t *p;
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_pad: NULL dataset");
    if (!ds->pixels || ds->count <= 0) return dt_set_error(DT_ERR_STATE, "dt_dataset_pad: the dataset is empty; load it first");
    if (h < ds->h || w < ds->w)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_pad: %lldx%lld is smaller than the images of %s (%lldx%lld); "
                            "give at least their size", (long long)h, (long long)w, ds->source, (long long)ds->h, (long long)ds->w);
    if (h == ds->h && w == ds->w) return DT_OK;
    if (h > (int64_t)1 << 20 || w > (int64_t)1 << 20 || (uint64_t)(ds->count * ds->c) > SIZE_MAX / (uint64_t)h / (uint64_t)w)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_pad: %lldx%lld images of %s would not fit in memory",
                            (long long)h, (long long)w, ds->source);
    p = (uint8_t *)DT_MALLOC((size_t)(ds->count * ds->c * h * w));
    if (!p) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dataset_pad: no memory to pad %s to %lldx%lld", ds->source,
                                (long long)h, (long long)w);
    memset(p, 0, (size_t)(ds->count * ds->c * h * w));
    top = (h - ds->h) / 2; left = (w - ds->w) / 2;
    for (i = 0; i < ds->count * ds->c; i++)
        for (y = 0; y < ds->h; y++)
            memcpy(p + (i * h + y + top) * w + left, ds->pixels + (i * ds->h + y) * ds->w, (size_t)ds->w);
    DT_FREE(ds->pixels);
    ds->pixels = p;
    ds->h = h; ds->w = w;
    return DT_OK;
}

dt_result dt_dataset_batch(const dt_dataset *ds, const dt_batch_desc *d, float *x, int32_t *y) {
    const int64_t *idx;
    const dt_transform *t;
    uint64_t seed, epoch;
    int64_t i, n, plane, chans;
    float scale[3], shift[3];
    if (!ds || !d || !x || !y)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: NULL argument (the dataset, the desc, x and y are needed)");
    idx = d->indices; n = d->count; t = d->transform; seed = d->seed; epoch = d->epoch;
    if (n <= 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: count is %lld; set it to the samples of the batch, > 0",
                            (long long)n);
    if (!idx) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: indices is NULL; pass the batch's %lld sample ids",
                                  (long long)n);
    if (!ds->pixels || !ds->labels || ds->count <= 0)
        return dt_set_error(DT_ERR_STATE, "dt_dataset_batch: the dataset is empty; load it first");
    if (t && t->crop_pad < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: the transform's crop_pad is %lld; it must be >= 0 (0: no crop)",
                            (long long)t->crop_pad);
    plane = ds->h * ds->w;
    chans = ds->c;
    for (i = 0; i < 3; i++) {   /* x = p * scale + shift, with scale = 1 / (255 std), shift = -mean / std */
        float sd = (t && t->std[i] != 0.0f) ? t->std[i] : 1.0f, mu = t ? t->mean[i] : 0.0f;
        scale[i] = 1.0f / (255.0f * sd);
        shift[i] = -mu / sd;
    }
    for (i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= ds->count)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: sample index %lld is outside the dataset %s of %lld samples",
                                (long long)idx[i], ds->source[0] ? ds->source : "(in memory)", (long long)ds->count);
    DT__OMP(parallel for if (n * chans * plane > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        const uint8_t *src = ds->pixels + idx[i] * chans * plane;
        float *dst = x + i * chans * plane;
        int64_t dy = 0, dx = 0, c, r, q;
        int flip = 0;
        if (t && (t->crop_pad > 0 || t->flip)) {
            /* one hash stream per (seed, epoch, sample): the same choices wherever it is converted */
            uint64_t key = dt__mix64(seed ^ dt__mix64(epoch + 0x632be59bd9b4e019ULL)) ^ (uint64_t)idx[i];
            if (t->crop_pad > 0) {
                int64_t span = 2 * t->crop_pad + 1;
                dy = (int64_t)(dt_hash_uniform(key, 0) * (float)span) - t->crop_pad;
                dx = (int64_t)(dt_hash_uniform(key, 1) * (float)span) - t->crop_pad;
                if (dy > t->crop_pad) dy = t->crop_pad;
                if (dx > t->crop_pad) dx = t->crop_pad;
            }
            flip = t->flip && dt_hash_uniform(key, 2) < 0.5f;
        }
        y[i] = ds->labels[idx[i]];
        for (c = 0; c < chans; c++) {
            float sc = scale[c < 3 ? c : 2], sh = shift[c < 3 ? c : 2];
            for (r = 0; r < ds->h; r++)
                for (q = 0; q < ds->w; q++) {
                    /* output (r, q) reads input (r + dy, q' + dx) where q' is q mirrored when flipped;
                       outside the image is the zero padding, which normalises like a zero pixel */
                    int64_t sr = r + dy, sq = (flip ? ds->w - 1 - q : q) + dx;
                    float p = (sr >= 0 && sr < ds->h && sq >= 0 && sq < ds->w) ? (float)src[c * plane + sr * ds->w + sq] : 0.0f;
                    dst[c * plane + r * ds->w + q] = p * sc + sh;
                }
        }
    }
    return DT_OK;
}

/* ---- loader ---------------------------------------------------------------------------------- */

struct dt_loader {
    const dt_dataset *ds;
    dt_transform      tf;
    int               has_tf, shuffle, drop_last, prefetch;
    uint64_t          seed, rank;
    int64_t           batch, count, cap;   /* samples per batch; sample ids now; ids at most (buffer size) */
    int64_t          *ids, *order;         /* [cap]: the given ids; this epoch's order */
    float            *x[2];                /* [rows, c, h, w] each; the second only with prefetch */
    int32_t          *y[2];                /* [rows] */
    int64_t           epoch, next;         /* epoch (-1 = none started), next batch to hand out */
    /* prefetch: the worker converts batch `job` into slot job % 2, then sets `done` = job. The caller asks
       for batch k + 1 only after it received batch k, so at most one batch is in flight and the slot being
       written is never the one the caller holds. The worker reads order, epoch and count, which the caller
       changes only while the worker is idle (dt__loader_quiesce). */
    dt__thread        thread;
    dt__mutex         mu;
    dt__cond          wake, ready;         /* wake: a job or quit for the worker; ready: a batch finished */
    int               sync_ok, thread_ok, busy, quit;
    int64_t           job, done;           /* -1 = none */
    dt_result         done_r;
    char              done_msg[512];
};

static dt_result dt__loader_convert(dt_loader *l, int64_t k, int slot) {
    int64_t start = k * l->batch;
    dt_batch_desc b;
    b.indices = l->order + start;
    b.count = l->count - start < l->batch ? l->count - start : l->batch;
    b.transform = l->has_tf ? &l->tf : NULL;
    b.seed = l->seed;
    b.epoch = (uint64_t)l->epoch;
    return dt_dataset_batch(l->ds, &b, l->x[slot], l->y[slot]);
}

static void dt__loader_worker(void *arg) {
    dt_loader *l = (dt_loader *)arg;
    int64_t k;
    dt_result r;
#if DT__HAVE_OMP
    omp_set_num_threads(1);   /* a background thread: leave the cores to the training thread's kernels */
#endif
    dt__mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && l->job < 0) dt__cond_wait(&l->wake, &l->mu);
        if (l->quit) break;
        k = l->job;
        l->job = -1;
        l->busy = 1;
        dt__mutex_unlock(&l->mu);
        r = dt__loader_convert(l, k, (int)(k & 1));
        dt__mutex_lock(&l->mu);
        if (r != DT_OK) {   /* the message is per thread: hand it to the caller's thread, without "CODE: " */
            const char *msg = dt_last_error();
            size_t pre = strlen(dt_result_str(r));
            if (strncmp(msg, dt_result_str(r), pre) == 0 && msg[pre] == ':') msg += pre + (msg[pre + 1] == ' ' ? 2 : 1);
            snprintf(l->done_msg, sizeof l->done_msg, "%s", msg);
        }
        l->busy = 0;
        l->done = k;
        l->done_r = r;
        dt__cond_broadcast(&l->ready);
    }
    dt__mutex_unlock(&l->mu);
}

/* Cancels a batch not yet begun and waits for the one being converted: afterwards the worker touches
   nothing until the next request. */
static void dt__loader_quiesce(dt_loader *l) {
    if (!l->thread_ok) return;
    dt__mutex_lock(&l->mu);
    l->job = -1;
    while (l->busy) dt__cond_wait(&l->ready, &l->mu);
    l->done = -1;
    dt__mutex_unlock(&l->mu);
}

static void dt__loader_request(dt_loader *l, int64_t k) {
    dt__mutex_lock(&l->mu);
    l->job = k;
    dt__cond_signal(&l->wake);
    dt__mutex_unlock(&l->mu);
}

/* Checks ids [n] against the dataset. */
static dt_result dt__loader_check_ids(const dt_dataset *ds, const int64_t *ids, int64_t n, const char *fn) {
    int64_t i;
    for (i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= ds->count)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: indices[%lld] is %lld, outside the dataset %s of %lld samples; "
                                "pass sample ids in [0, count)", fn, (long long)i, (long long)ids[i],
                                ds->source[0] ? ds->source : "(in memory)", (long long)ds->count);
    return DT_OK;
}

/* bytes rounded up to a multiple of 64, so that each array of the loader's block starts on a cache line */
static size_t dt__round64(size_t n) { return (n + 63) & ~(size_t)63; }

dt_result dt_loader_create(dt_loader **out, const dt_loader_desc *d) {
    const char *fn = "dt_loader_create";
    const dt_dataset *ds;
    dt_loader *l;
    char *mem;
    int64_t batch, cap, rows, sample, i;
    int s, slots;
    double want;
    size_t at, bytes_x, bytes_y, bytes_ids;
    dt_result e;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the desc is NULL; pass a dt_loader_desc (zero = defaults)", fn);
    if (!(ds = d->dataset))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: desc.dataset is NULL; point it at a loaded dt_dataset", fn);
    if (!ds->pixels || !ds->labels || ds->count <= 0 || ds->c <= 0 || ds->h <= 0 || ds->w <= 0)
        return dt_set_error(DT_ERR_STATE, "%s: the dataset %s is empty (count %lld, shape %lldx%lldx%lld); load it first",
                            fn, ds->source[0] ? ds->source : "(in memory)", (long long)ds->count, (long long)ds->c,
                            (long long)ds->h, (long long)ds->w);
    if (d->batch < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: batch is %lld; it must be > 0 (or 0 for the default 64)", fn,
                            (long long)d->batch);
    if (d->count < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0", fn, (long long)d->count);
    if (!d->indices && d->count != 0 && d->count != ds->count)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld but indices is NULL; pass the sample ids, or count 0 "
                            "for all %lld samples of the dataset", fn, (long long)d->count, (long long)ds->count);
    if (d->indices && (e = dt__loader_check_ids(ds, d->indices, d->count, fn)) != DT_OK) return e;
    if (d->transform && d->transform->crop_pad < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: transform.crop_pad is %lld; it must be >= 0", fn,
                            (long long)d->transform->crop_pad);
    if (d->prefetch && !DT__HAVE_THREADS)
        return dt_set_error(DT_ERR_UNSUPPORTED, "%s: prefetch needs threads, and this build defines DT_NO_THREADS; set "
                            "prefetch = 0 (the batches are the same, converted on the calling thread)", fn);
    batch = d->batch ? d->batch : 64;
    cap = d->indices ? d->count : ds->count;
    sample = ds->c * ds->h * ds->w;
    rows = batch < cap ? batch : (cap > 0 ? cap : 1);   /* a batch never holds more than all the samples */
    slots = d->prefetch ? 2 : 1;
    /* one block: the loader, ids and order [cap], then per slot x [rows, c, h, w] and y [rows] */
    want = (double)sizeof(dt_loader) + 16.0 * (double)cap + (double)slots * (double)rows * ((double)sample + 1.0) * 4.0;
    if (want > (double)(SIZE_MAX / 4))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: the batch buffers would need %.0f bytes; use a smaller batch", fn, want);
    bytes_ids = dt__round64((size_t)cap * sizeof(int64_t));
    bytes_x = dt__round64((size_t)rows * (size_t)sample * sizeof(float));
    bytes_y = dt__round64((size_t)rows * sizeof(int32_t));
    at = dt__round64(sizeof(dt_loader));
    if (!(mem = (char *)DT_MALLOC(at + 2 * bytes_ids + (size_t)slots * (bytes_x + bytes_y))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for %.1f MiB of order and batch buffers; use a "
                            "smaller batch", fn, want / 1048576.0);
    l = (dt_loader *)mem;
    memset(l, 0, sizeof *l);
    l->ids = (int64_t *)(mem + at);
    l->order = (int64_t *)(mem + at + bytes_ids);
    at += 2 * bytes_ids;
    for (s = 0; s < slots; s++) {
        l->x[s] = (float *)(mem + at);
        l->y[s] = (int32_t *)(mem + at + bytes_x);
        at += bytes_x + bytes_y;
    }
    l->ds = ds;
    if (d->transform) { l->tf = *d->transform; l->has_tf = 1; }
    l->shuffle = d->shuffle != 0;
    l->drop_last = d->drop_last != 0;
    l->prefetch = d->prefetch != 0;
    l->seed = d->seed;
    l->rank = d->rank;
    l->batch = batch;
    l->count = l->cap = cap;
    if (d->indices) { if (cap > 0) memcpy(l->ids, d->indices, (size_t)cap * sizeof(int64_t)); }
    else for (i = 0; i < cap; i++) l->ids[i] = i;
    l->epoch = -1;
    l->job = l->done = -1;
    if (l->prefetch) {
        int err = dt__mutex_init(&l->mu);
        if (err == 0 && (err = dt__cond_init(&l->wake)) != 0) dt__mutex_destroy(&l->mu);
        if (err == 0 && (err = dt__cond_init(&l->ready)) != 0) { dt__cond_destroy(&l->wake); dt__mutex_destroy(&l->mu); }
        if (err != 0) {
            DT_FREE(mem);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: could not create the prefetch thread's mutex (error %d); set "
                                "prefetch = 0", fn, err);
        }
        l->sync_ok = 1;
        if ((err = dt__thread_start(&l->thread, dt__loader_worker, l)) != 0) {
            dt_loader_destroy(l);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: could not start the prefetch thread (error %d); set prefetch "
                                "= 0 or raise the process's thread limit", fn, err);
        }
        l->thread_ok = 1;
    }
    *out = l;
    return DT_OK;
}

void dt_loader_destroy(dt_loader *l) {
    if (!l) return;
    if (l->thread_ok) {   /* the worker finishes a batch in flight, sees quit and returns */
        dt__mutex_lock(&l->mu);
        l->quit = 1;
        dt__cond_signal(&l->wake);
        dt__mutex_unlock(&l->mu);
        dt__thread_join(&l->thread);
    }
    if (l->sync_ok) {
        dt__cond_destroy(&l->ready);
        dt__cond_destroy(&l->wake);
        dt__mutex_destroy(&l->mu);
    }
    DT_FREE(l);
}

int64_t dt_loader_batches(const dt_loader *l) {
    if (!l) return 0;
    return l->count / l->batch + (!l->drop_last && l->count % l->batch != 0 ? 1 : 0);
}

/* dt_loader_start_epoch and dt_loader_seek: fn names the caller in messages */
static dt_result dt__loader_begin(dt_loader *l, int64_t epoch, int64_t batch, const char *fn) {
    dt_rng r;
    if (!l) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the loader is NULL", fn);
    if (epoch < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: epoch is %lld; it must be >= 0", fn, (long long)epoch);
    if (batch < 0 || batch > dt_loader_batches(l))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: batch is %lld; an epoch of this loader has batches 0 .. %lld (the last "
                            "one: the epoch's end)", fn, (long long)batch, (long long)dt_loader_batches(l));
    dt__loader_quiesce(l);
    if (l->count > 0) memcpy(l->order, l->ids, (size_t)l->count * sizeof(int64_t));
    if (l->shuffle) {   /* from the given order each epoch: the order depends on (seed, rank, epoch) only */
        dt__rng_epoch(&r, l->seed, (uint64_t)epoch, l->rank);
        dt__shuffle(l->order, l->count, &r);
    }
    l->epoch = epoch;
    l->next = batch;   /* the order and the transforms depend on (seed, rank, epoch) only: skipping costs nothing */
    if (l->thread_ok && batch < dt_loader_batches(l)) dt__loader_request(l, batch);
    return DT_OK;
}

dt_result dt_loader_start_epoch(dt_loader *l, int64_t epoch) { return dt__loader_begin(l, epoch, 0, "dt_loader_start_epoch"); }
dt_result dt_loader_seek(dt_loader *l, int64_t epoch, int64_t batch) { return dt__loader_begin(l, epoch, batch, "dt_loader_seek"); }

dt_result dt_loader_next(dt_loader *l, const float **x, const int32_t **y, int64_t *n) {
    int64_t k, left;
    int slot;
    dt_result r;
    char msg[512];
    if (!l || !x || !y || !n)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_loader_next: NULL argument (the loader, x, y and n are needed)");
    *x = NULL; *y = NULL; *n = 0;
    if (l->epoch < 0)
        return dt_set_error(DT_ERR_STATE, "dt_loader_next: no epoch started; call dt_loader_start_epoch(loader, epoch) first "
                            "(also after dt_loader_set_indices)");
    k = l->next;
    if (k >= dt_loader_batches(l)) return DT_OK;   /* the end of the epoch: n = 0 */
    dt_trace_begin("next batch", "data");   /* the wait for the prefetched batch, or its conversion */
    if (l->thread_ok) {
        slot = (int)(k & 1);
        dt__mutex_lock(&l->mu);
        while (l->done != k) dt__cond_wait(&l->ready, &l->mu);
        r = l->done_r;
        if (r != DT_OK) snprintf(msg, sizeof msg, "%s", l->done_msg);
        dt__mutex_unlock(&l->mu);
        if (r == DT_OK && k + 1 < dt_loader_batches(l)) dt__loader_request(l, k + 1);   /* into the slot of batch k - 1 */
        if (r != DT_OK) dt_set_error(r, "%s", msg);
    } else {
        slot = 0;
        r = dt__loader_convert(l, k, 0);
    }
    dt_trace_end();
    if (r != DT_OK) return r;
    left = l->count - k * l->batch;
    l->next = k + 1;
    *x = l->x[slot];
    *y = l->y[slot];
    *n = left < l->batch ? left : l->batch;
    return DT_OK;
}

dt_result dt_loader_set_indices(dt_loader *l, const int64_t *indices, int64_t count) {
    const char *fn = "dt_loader_set_indices";
    dt_result e;
    if (!l) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the loader is NULL", fn);
    if (count < 0 || count > l->cap)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be in [0, %lld], the count at create", fn,
                            (long long)count, (long long)l->cap);
    if (count > 0 && !indices) return dt_set_error(DT_ERR_INVALID_ARG, "%s: indices is NULL", fn);
    if ((e = dt__loader_check_ids(l->ds, indices, count, fn)) != DT_OK) return e;
    dt__loader_quiesce(l);
    if (count > 0) memcpy(l->ids, indices, (size_t)count * sizeof(int64_t));
    l->count = count;
    l->epoch = -1;
    l->next = 0;
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
