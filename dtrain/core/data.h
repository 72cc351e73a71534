/* dtrain/core/data.h - datasets, transforms, partitioners, the distributed sampler and the loader.   Part of
   dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     Loaders for IDX files (MNIST, Fashion-MNIST; gzip with DT_USE_ZLIB), CIFAR-10 binary batches and
     image folders (stb_image, with DT_USE_STB_IMAGE), kept as uint8; normalisation, random crop and flip;
     the partitioners (fractions, IID, contiguous, the FedAvg paper's label shards, Dirichlet label skew),
     each sample in exactly one part; a distributed sampler with PyTorch's semantics; and the loader: the
     batches of one rank, the same for (seed, epoch, rank), converted on a background thread.
   USES
     dtrain/core/base.h only (a dataset knows nothing of models); zlib, stb_image and POSIX directories when
     built with them.
   READ FIRST
     dt_partition_dirichlet, dt_sampler_indices, dt_loader_next.
*/
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H
#include "base.h"

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

/* Per-batch conversion: x = (pixel / 255 - mean[c]) / std[c] after an optional random crop (zero padding
   of crop_pad pixels on each side, then a crop of the original size) and an optional random horizontal
   flip (p = 0.5). Zero means the default: mean 0, std 1, no crop, no flip. */
typedef struct dt_transform {
    float   mean[3], std[3];
    int64_t crop_pad;
    int     flip;
} dt_transform;

/* Converts samples idx[0..n) of ds into x [n, c, h, w] and y [n] (host memory). Random choices are a
   pure function of (seed, epoch, sample index), so any rank or thread converting a sample in an epoch
   gets the same result. t may be NULL (x = pixel / 255). */
dt_result dt_dataset_batch(const dt_dataset *ds, const int64_t *idx, int64_t n, const dt_transform *t, uint64_t seed,
                           uint64_t epoch, float *x, int32_t *y);

/* (dataset loaders: declarations) */

/* Dataset loaders. Each one zeroes *ds, then fills it with arrays it allocates (free them with
   dt_dataset_free), so a *ds holding a previous dataset must be freed first. On failure *ds is left
   zeroed with nothing allocated, and dt_last_error() names the file and the cause. Pixels are stored as
   read; normalisation happens per batch (dt_dataset_batch). Not collective: each rank loads its copy. */

/* MNIST-style IDX files: images (magic 0x00000803, big-endian dims N, H, W, then N*H*W bytes) and labels
   (magic 0x00000801, dim N, then N bytes in 0..9). Either file may be gzip-compressed (detected by its
   first two bytes; needs DT_USE_ZLIB). Gives c = 1, num_classes = 10, class_names NULL. */
dt_result dt_dataset_load_idx(dt_dataset *ds, const char *images_path, const char *labels_path);
/* MNIST or Fashion-MNIST from a directory: train-{images-idx3,labels-idx1}-ubyte (t10k-... when train is
   0), each raw or with .gz appended (raw preferred). dir NULL means DT_MNIST_DEFAULT_DIR, where Debian's
   package dataset-fashion-mnist installs Fashion-MNIST. */
dt_result dt_dataset_load_mnist_dir(dt_dataset *ds, const char *dir, int train);
/* CIFAR-10, binary version: dir/data_batch_1.bin .. data_batch_5.bin (train != 0) or dir/test_batch.bin,
   records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32). Gives c = 3, h = w = 32,
   num_classes = 10; class_names from dir/batches.meta.txt (one name per line) when present, else NULL. */
dt_result dt_dataset_load_cifar10(dt_dataset *ds, const char *dir, int train);
/* torchvision's ImageFolder layout, root/<class>/<image>: classes are the sub-directories of root in
   byte-wise (Python sorted()) order, label = position in that order, class_names their names; images in
   a class are taken in name order. Files with the extensions torchvision accepts (.jpg .jpeg .png .ppm
   .bmp .pgm .tif .tiff .webp, any case) are images, other files and names starting with '.' are skipped.
   Each image is decoded to `channels` components (1 or 3; 0 means 3) and resized to h x w with
   stb_image_resize's default filter. PNG, JPEG, BMP and binary PGM/PPM decode; TIFF and WebP are
   refused with a message. Needs DT_USE_STB_IMAGE (and POSIX <dirent.h>). */
dt_result dt_dataset_load_image_folder(dt_dataset *ds, const char *root, int64_t h, int64_t w, int64_t channels);

/* (partitioners and loader: declarations) */
/* ---- partitions ------------------------------------------------------------------------------ */

/* A split of the sample ids 0..count-1 into `parts` disjoint lists that together hold every id exactly
   once. Part p is indices[offsets[p] .. offsets[p+1]); offsets[0] = 0 and offsets[parts] = count. The
   constructors allocate offsets and indices as one block (indices points into it), zero *p on failure,
   and are pure functions of their arguments: every rank computes the same partition from the same seed
   without communicating. A part can be empty only where its constructor says so. */
typedef struct dt_partition {
    int      parts;
    int64_t *offsets;            /* [parts + 1] */
    int64_t *indices;            /* [count] sample ids; part p is indices[offsets[p] .. offsets[p+1]) */
} dt_partition;

/* Frees what a constructor allocated and zeroes *p. NULL is allowed. */
void dt_partition_free(dt_partition *p);

/* Train/val/test style split: a seeded shuffle of 0..count-1, then consecutive slices, part p taking
   fractions[p] of the samples (e.g. {0.7f, 0.2f, 0.1f}). fractions [parts], each >= 0, summing to 1 within
   1e-4. Sizes: n_p = floor(count * f_p / sum(f)); the samples left over (fewer than parts) go one each to
   the parts with f_p > 0 in order 0, 1, 2, ...; so the sizes sum to count and f_p = 0 gives an empty part. */
dt_result dt_partition_fractions(dt_partition *p, int64_t count, const float *fractions, int parts, uint64_t seed);
/* Equal IID shards: a seeded shuffle, then part p takes floor(count / parts) samples, plus one when
   p < count % parts (sizes differ by at most 1; parts beyond count are empty). */
dt_result dt_partition_iid(dt_partition *p, int64_t count, int parts, uint64_t seed);
/* Contiguous blocks in index order, sizes as dt_partition_iid: part p is [start_p, start_p + n_p). */
dt_result dt_partition_contiguous(dt_partition *p, int64_t count, int parts);
/* Pathological non-IID split of the FedAvg paper (McMahan et al. 2017): the ids are sorted by label (stable,
   so ties keep id order), cut into S = parts * shards_per_part shards of floor(count / S) ids (the first
   count % S shards one more), and each part receives shards_per_part shards drawn at random without
   replacement (seeded). With 2 shards per part most parts hold at most 2 labels. labels [count], each >= 0.
   Parts are empty only when count < S leaves shards empty. */
dt_result dt_partition_shards(dt_partition *p, const int32_t *labels, int64_t count, int parts, int shards_per_part,
                              uint64_t seed);
/* Label skew: for each class, proportions q ~ Dirichlet(alpha, ..., alpha) over the parts, and the class's
   samples (shuffled) are cut at floor(n_class * cumsum(q)). Small alpha (0.1) = each part dominated by a
   few classes; large alpha (100) = near IID. labels [count] in [0, num_classes). When count >= parts no part
   is empty: an allocation with an empty part is redrawn (up to 100 draws, as common implementations do),
   and if one remains empty, one sample at a time moves to it from the largest part. */
dt_result dt_partition_dirichlet(dt_partition *p, const int32_t *labels, int64_t count, int64_t num_classes, int parts,
                                 float alpha, uint64_t seed);
/* Label histogram of each part: hist [parts, num_classes], hist[p * num_classes + k] = samples of class k in
   part p. labels is indexed by sample id; a label outside [0, num_classes) is an error. */
dt_result dt_partition_histogram(const dt_partition *p, const int32_t *labels, int64_t num_classes, int64_t *hist);

/* ---- distributed sampler --------------------------------------------------------------------- */

/* Samples per rank and epoch: ceil(count / world), or floor(count / world) when drop_last (0 for bad
   arguments). */
int64_t dt_sampler_size(int64_t count, int world, int drop_last);
/* PyTorch's DistributedSampler: rank's sample ids for one epoch. The list is a permutation of 0..count-1
   seeded by (seed, epoch) alone, the same on every rank (identity when shuffle = 0); drop_last = 0 pads it
   to total = ceil(count / world) * world by repeating it from its start, drop_last = 1 truncates it to
   floor(count / world) * world; rank takes positions rank, rank + world, rank + 2 world, ... So every rank
   gets *n_out = dt_sampler_size(count, world, drop_last) ids, and the ranks' shares are disjoint apart from
   the padding. out [dt_sampler_size(...)]. With shuffle it allocates a temporary [count] permutation. */
dt_result dt_sampler_indices(int64_t count, int rank, int world, uint64_t seed, int64_t epoch, int shuffle,
                             int drop_last, int64_t *out, int64_t *n_out);

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
#ifdef DT_USE_ZLIB
#include <zlib.h>
#endif
#ifdef DT_USE_STB_IMAGE
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <dirent.h>
#include <sys/stat.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

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

dt_result dt_dataset_batch(const dt_dataset *ds, const int64_t *idx, int64_t n, const dt_transform *t, uint64_t seed,
                           uint64_t epoch, float *x, int32_t *y) {
    int64_t i, plane, chans;
    float scale[3], shift[3];
    if (!ds || !idx || !x || !y) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: NULL argument");
    if (n <= 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: n is %lld; it must be > 0", (long long)n);
    if (!ds->pixels || !ds->labels || ds->count <= 0)
        return dt_set_error(DT_ERR_STATE, "dt_dataset_batch: the dataset is empty; load it first");
    if (t && t->crop_pad < 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: crop_pad is negative");
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

/* (dataset loaders: implementation) */

#ifndef DT_MNIST_DEFAULT_DIR
#define DT_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif
#ifndef DT_IMAGE_MAX_PIXELS
#define DT_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
#endif

/* "a" + "b" + "c" in a new DT_MALLOC'd string, or NULL when out of memory. */
static char *dt__str3(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = (char *)DT_MALLOC(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}
/* dir/name; no second '/' when dir already ends with one. */
static char *dt__path(const char *dir, const char *name) {
    size_t n = strlen(dir);
    return dt__str3(dir, (n > 0 && dir[n - 1] == '/') ? "" : "/", name);
}
static uint32_t dt__be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static int dt__file_exists(const char *path) {   /* a FIFO "exists": dt__in_open then says what it is */
    const char *why;
    FILE *fp = dt__open_read(path, &why);
    if (fp) fclose(fp);
    return fp != NULL || strstr(why, "regular") != NULL;
}
/* Size of an open regular file (the position is restored to the start), or -1. The first read fails on
   a directory, whose "size" could be anything. */
static int64_t dt__file_size(FILE *fp) {
    long n;
    if ((fgetc(fp) == EOF && ferror(fp)) || fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0 ||
        fseek(fp, 0, SEEK_SET) != 0)
        return -1;
    return (int64_t)n;
}

/* An input file read as a byte stream, gzip-compressed or not; gzip is recognised by its magic bytes
   1f 8b, not by the name. Sizes and positions of a gzip file are those of the decompressed data. */
typedef struct dt__in {
    FILE *fp;
    void *gz;           /* gzFile when DT_USE_ZLIB */
    const char *path;
} dt__in;

static void dt__in_close(dt__in *in) {
    if (in->fp) fclose(in->fp);
#ifdef DT_USE_ZLIB
    if (in->gz) gzclose((gzFile)in->gz);
#endif
    in->fp = NULL;
    in->gz = NULL;
}

static dt_result dt__in_open(dt__in *in, const char *path) {
    uint8_t m[2];
    size_t n;
    const char *why;
    memset(in, 0, sizeof *in);
    in->path = path;
    if (!(in->fp = dt__open_read(path, &why))) return dt_set_error(DT_ERR_IO, "cannot open %s: %s", path, why);
    n = fread(m, 1, 2, in->fp);
    if (ferror(in->fp)) { dt__in_close(in); return dt_set_error(DT_ERR_IO, "cannot read %s: %s", path, strerror(errno)); }
    if (n == 2 && m[0] == 0x1f && m[1] == 0x8b) {
        dt__in_close(in);
#ifdef DT_USE_ZLIB
        if (!(in->gz = (void *)gzopen(path, "rb")))
            return dt_set_error(DT_ERR_IO, "zlib cannot open %s: %s", path, errno ? strerror(errno) : "out of memory");
        gzbuffer((gzFile)in->gz, 1u << 17);
        return DT_OK;
#else
        return dt_set_error(DT_ERR_UNSUPPORTED, "%s is gzip-compressed; build with -DDT_USE_ZLIB and link -lz, or "
                            "decompress it with gunzip", path);
#endif
    }
    if (fseek(in->fp, 0, SEEK_SET) != 0) {
        dt__in_close(in);
        return dt_set_error(DT_ERR_IO, "cannot seek in %s (is it a regular file?)", path);
    }
    return DT_OK;
}

/* Reads up to n bytes; *got < n only at the end of the data. Read errors and corrupt gzip data fail. */
static dt_result dt__in_read(dt__in *in, void *buf, int64_t n, int64_t *got) {
    *got = 0;
    while (*got < n) {
        int64_t want = n - *got < ((int64_t)1 << 30) ? n - *got : ((int64_t)1 << 30), r;
        char *dst = (char *)buf + *got;
        if (in->fp) {
            r = (int64_t)fread(dst, 1, (size_t)want, in->fp);
            if (r < want && ferror(in->fp))
                return dt_set_error(DT_ERR_IO, "cannot read %s: %s", in->path, strerror(errno));
        } else {
#ifdef DT_USE_ZLIB
            int zerr = Z_OK;
            const char *zmsg;
            r = gzread((gzFile)in->gz, dst, (unsigned)want);
            zmsg = gzerror((gzFile)in->gz, &zerr);
            if (zerr == Z_ERRNO) return dt_set_error(DT_ERR_IO, "cannot read %s: %s", in->path, strerror(errno));
            if (r < 0 || (r < want && zerr != Z_OK)) {
                size_t np = strlen(in->path);   /* zlib's message repeats the path: "path: what" */
                if (zmsg && strncmp(zmsg, in->path, np) == 0 && zmsg[np] == ':' && zmsg[np + 1] == ' ') zmsg += np + 2;
                return dt_set_error(DT_ERR_FORMAT, "%s: the gzip data is truncated or corrupt (zlib: %s); download the "
                                    "file again", in->path, zmsg ? zmsg : "unknown error");
            }
#else
            r = 0;
#endif
        }
        *got += r;
        if (r < want) break;
    }
    return DT_OK;
}

/* Reads the rest of a file, which must be exactly `want` bytes after a header of `head` bytes, into a new
   buffer (*out, DT_FREE it). The buffer grows with the data actually read, so a header that claims more
   than the file holds costs nothing. `what` describes the header's claim for the message. */
static dt_result dt__in_read_payload(dt__in *in, int64_t head, int64_t want, const char *what, uint8_t **out) {
    int64_t cap = want + 1 < ((int64_t)1 << 16) ? want + 1 : ((int64_t)1 << 16), have = 0, got;
    uint8_t *buf = (uint8_t *)DT_MALLOC((size_t)cap), *nb;
    dt_result r;
    *out = NULL;
    if (!buf) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", in->path);
    for (;;) {   /* read up to want + 1 bytes: one more than expected tells a too-long file */
        if ((r = dt__in_read(in, buf + have, cap - have, &got)) != DT_OK) { DT_FREE(buf); return r; }
        have += got;
        if (have < cap || cap == want + 1) break;
        cap = cap > (want + 1) / 2 ? want + 1 : 2 * cap;
        if (!(nb = (uint8_t *)DT_REALLOC(buf, (size_t)cap))) {
            DT_FREE(buf);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s (%lld bytes)", in->path, (long long)want);
        }
        buf = nb;
    }
    if (have > want) {   /* count the rest for the message */
        do {
            if ((r = dt__in_read(in, buf, cap, &got)) != DT_OK) { DT_FREE(buf); return r; }
            have += got;
        } while (got == cap);
    }
    if (have != want) {
        DT_FREE(buf);
        return dt_set_error(DT_ERR_FORMAT, "%s is %s: its header (%s) needs %lld bytes but the file has %lld%s; %s",
                            in->path, have < want ? "truncated" : "longer than its header says", what,
                            (long long)(head + want), (long long)(head + have), in->gz ? " (decompressed)" : "",
                            have < want ? "download it again" : "the header or the file is corrupt");
    }
    *out = buf;
    return DT_OK;
}

/* Reads an IDX header: magic, then ndim big-endian uint32 dims. */
static dt_result dt__idx_header(dt__in *in, uint32_t magic, int ndim, uint32_t *dims) {
    uint8_t h[16];
    int64_t need = 4 + 4 * (int64_t)ndim, got;
    uint32_t m;
    int i;
    dt_result r = dt__in_read(in, h, need, &got);
    if (r != DT_OK) return r;
    if (got < 4)
        return dt_set_error(DT_ERR_FORMAT, "%s is %lld bytes, too short for an IDX file (its header alone is %lld "
                            "bytes)", in->path, (long long)got, (long long)need);
    m = dt__be32(h);
    if (m != magic) {
        if (magic == 0x803 && m == 0x801)
            return dt_set_error(DT_ERR_FORMAT, "%s is an IDX labels file (magic 0x00000801), given as the images file; "
                                "pass the *-images-idx3-ubyte file first and the labels second", in->path);
        if (magic == 0x801 && m == 0x803)
            return dt_set_error(DT_ERR_FORMAT, "%s is an IDX images file (magic 0x00000803), given as the labels file; "
                                "pass the *-images-idx3-ubyte file first and the labels second", in->path);
        return dt_set_error(DT_ERR_FORMAT, "%s: magic number 0x%08lx is not an IDX %s file's 0x%08lx (unsigned bytes, "
                            "%d dimension%s); is it an MNIST file?", in->path, (unsigned long)m,
                            magic == 0x803 ? "images" : "labels", (unsigned long)magic, ndim, ndim > 1 ? "s" : "");
    }
    if (got < need)
        return dt_set_error(DT_ERR_FORMAT, "%s is truncated inside its IDX header: %lld of %lld bytes; download it again",
                            in->path, (long long)got, (long long)need);
    for (i = 0; i < ndim; i++) dims[i] = dt__be32(h + 4 + 4 * i);
    return DT_OK;
}

dt_result dt_dataset_load_idx(dt_dataset *ds, const char *images_path, const char *labels_path) {
    dt__in im, lb;
    uint32_t di[3] = {0, 0, 0}, dl[1] = {0};
    uint8_t *lab = NULL;
    uint64_t n, plane;
    int64_t i;
    char what[96];
    dt_result r;
    memset(&im, 0, sizeof im);
    memset(&lb, 0, sizeof lb);
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_idx: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!images_path || !labels_path)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_idx: %s path is NULL", images_path ? "labels" : "images");
    if ((r = dt__in_open(&im, images_path)) != DT_OK || (r = dt__idx_header(&im, 0x803, 3, di)) != DT_OK ||
        (r = dt__in_open(&lb, labels_path)) != DT_OK || (r = dt__idx_header(&lb, 0x801, 1, dl)) != DT_OK)
        goto fail;
    n = di[0];
    plane = (uint64_t)di[1] * di[2];
    if (n == 0 || plane == 0) {
        r = dt_set_error(DT_ERR_FORMAT, "%s: its header says %lu images of %lux%lu; there is nothing to load",
                         images_path, (unsigned long)di[0], (unsigned long)di[1], (unsigned long)di[2]);
        goto fail;
    }
    if (plane > (uint64_t)(INT64_MAX / 2) / n || plane * n > (uint64_t)(SIZE_MAX / 2)) {
        r = dt_set_error(DT_ERR_FORMAT, "%s: its header says %lu images of %lux%lu, more bytes than this machine can "
                         "address; the header is corrupt", images_path, (unsigned long)di[0], (unsigned long)di[1],
                         (unsigned long)di[2]);
        goto fail;
    }
    if (dl[0] != di[0]) {
        r = dt_set_error(DT_ERR_FORMAT, "%s holds %lu images but %s holds %lu labels; the two files must come from the "
                         "same set (both train-* or both t10k-*)", images_path, (unsigned long)di[0], labels_path,
                         (unsigned long)dl[0]);
        goto fail;
    }
    snprintf(what, sizeof what, "%lu images of %lux%lu", (unsigned long)di[0], (unsigned long)di[1], (unsigned long)di[2]);
    if ((r = dt__in_read_payload(&im, 16, (int64_t)(n * plane), what, &ds->pixels)) != DT_OK) goto fail;
    snprintf(what, sizeof what, "%lu labels", (unsigned long)dl[0]);
    if ((r = dt__in_read_payload(&lb, 8, (int64_t)n, what, &lab)) != DT_OK) goto fail;
    for (i = 0; i < (int64_t)n; i++)
        if (lab[i] > 9) {
            r = dt_set_error(DT_ERR_FORMAT, "%s: label %d at index %lld is outside 0..9; MNIST-style labels are class "
                             "indices below 10", labels_path, (int)lab[i], (long long)i);
            goto fail;
        }
    if (!(ds->labels = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)n))) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for the %llu labels of %s", (unsigned long long)n, labels_path);
        goto fail;
    }
    for (i = 0; i < (int64_t)n; i++) ds->labels[i] = lab[i];
    DT_FREE(lab);
    dt__in_close(&im);
    dt__in_close(&lb);
    ds->count = (int64_t)n;
    ds->c = 1;
    ds->h = di[1];
    ds->w = di[2];
    ds->num_classes = 10;
    snprintf(ds->source, sizeof ds->source, "%s", images_path);
    return DT_OK;
fail:
    DT_FREE(lab);
    dt__in_close(&im);
    dt__in_close(&lb);
    dt_dataset_free(ds);
    return r;
}

dt_result dt_dataset_load_mnist_dir(dt_dataset *ds, const char *dir, int train) {
    const char *kind[2] = {"images-idx3-ubyte", "labels-idx1-ubyte"};
    char *path[2] = {NULL, NULL}, *name = NULL;
    dt_result r = DT_OK;
    int k;
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_mnist_dir: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!dir) dir = DT_MNIST_DEFAULT_DIR;
    for (k = 0; k < 2 && r == DT_OK; k++) {   /* the raw file when there, else the .gz */
        char *gz = NULL;
        if (!(name = dt__str3(train ? "train-" : "t10k-", kind[k], "")) || !(path[k] = dt__path(dir, name)) ||
            (!dt__file_exists(path[k]) && !(gz = dt__str3(path[k], ".gz", "")))) {
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dataset_load_mnist_dir: no memory for a path");
        } else if (gz) {
            if (!dt__file_exists(gz))
                r = dt_set_error(DT_ERR_IO, "cannot open %s or %s: %s; install the Debian package dataset-fashion-mnist, "
                                 "or pass the directory that holds the MNIST files", path[k], gz, strerror(errno));
            DT_FREE(path[k]);
            path[k] = gz;
        }
        DT_FREE(name);
        name = NULL;
    }
    if (r == DT_OK) r = dt_dataset_load_idx(ds, path[0], path[1]);
    DT_FREE(path[0]);
    DT_FREE(path[1]);
    return r;
}

dt_result dt_dataset_load_cifar10(dt_dataset *ds, const char *dir, int train) {
    enum { REC = 3073, MAXF = 5 };
    FILE *fp[MAXF] = {NULL, NULL, NULL, NULL, NULL}, *mf = NULL;
    char *path[MAXF] = {NULL, NULL, NULL, NULL, NULL}, *meta = NULL, *text = NULL;
    const char *why;
    int64_t recs[MAXF], total = 0, i, done = 0;
    int nf = train ? 5 : 1, f;
    dt_result r = DT_OK;
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_cifar10: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!dir) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_cifar10: dir is NULL; pass the directory of the "
                                  "binary version (cifar-10-batches-bin)");
    for (f = 0; f < nf; f++) {   /* plan: every file's size, checked, before anything is allocated */
        char name[32];
        int64_t size;
        if (train) snprintf(name, sizeof name, "data_batch_%d.bin", f + 1);
        else snprintf(name, sizeof name, "test_batch.bin");
        if (!(path[f] = dt__path(dir, name))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for a path"); goto done; }
        if (!(fp[f] = dt__open_read(path[f], &why))) {
            r = dt_set_error(DT_ERR_IO, "cannot open %s: %s; CIFAR-10 needs the binary version (cifar-10-binary.tar.gz, "
                             "unpacked)", path[f], why);
            goto done;
        }
        if ((size = dt__file_size(fp[f])) < 0) {
            r = dt_set_error(DT_ERR_IO, "cannot find the size of %s (is it a regular file?)", path[f]);
            goto done;
        }
        if (size == 0) {
            r = dt_set_error(DT_ERR_FORMAT, "%s is empty; a CIFAR-10 batch holds records of %d bytes", path[f], REC);
            goto done;
        }
        if (size % REC != 0) {
            r = dt_set_error(DT_ERR_FORMAT, "%s is %lld bytes, not a whole number of %d-byte CIFAR-10 records: record %lld "
                             "(counting from 0) is %lld bytes; download the binary version again", path[f],
                             (long long)size, REC, (long long)(size / REC), (long long)(size % REC));
            goto done;
        }
        recs[f] = size / REC;
        total += recs[f];
    }
    ds->pixels = (uint8_t *)DT_MALLOC((size_t)total * (REC - 1));
    ds->labels = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)total);
    if (!ds->pixels || !ds->labels) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for %lld CIFAR-10 images from %s", (long long)total, dir);
        goto done;
    }
    for (f = 0; f < nf; f++)
        for (i = 0; i < recs[f]; i++, done++) {
            uint8_t label;
            if (fread(&label, 1, 1, fp[f]) != 1 || fread(ds->pixels + done * (REC - 1), 1, REC - 1, fp[f]) != REC - 1) {
                r = dt_set_error(DT_ERR_IO, "cannot read record %lld of %s: %s", (long long)i, path[f],
                                 ferror(fp[f]) ? strerror(errno) : "the file shrank while being read");
                goto done;
            }
            if (label > 9) {
                r = dt_set_error(DT_ERR_FORMAT, "%s: record %lld (counting from 0) has label %d; CIFAR-10 labels are 0..9 "
                                 "(is this CIFAR-100, or not the binary version?)", path[f], (long long)i, (int)label);
                goto done;
            }
            ds->labels[done] = label;
        }
    ds->count = total;
    ds->c = 3;
    ds->h = ds->w = 32;
    ds->num_classes = 10;
    snprintf(ds->source, sizeof ds->source, "%s", dir);
    if (!(meta = dt__path(dir, "batches.meta.txt"))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for a path"); goto done; }
    if ((mf = dt__open_read(meta, &why)) != NULL) {   /* class names, if the file is there: one per non-blank line, trimmed */
        int64_t size = dt__file_size(mf), k = 0;
        char *p, *line;
        if (size < 0 || size > 65536) {
            r = dt_set_error(DT_ERR_FORMAT, "%s: %s; it should hold the 10 class names, one per line", meta,
                             size < 0 ? "cannot find its size" : "too large");
            goto done;
        }
        if (!(text = (char *)DT_MALLOC((size_t)size + 1)) ||
            !(ds->class_names = (char **)DT_MALLOC(10 * sizeof(char *)))) {
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", meta);
            goto done;
        }
        memset(ds->class_names, 0, 10 * sizeof(char *));
        if ((int64_t)fread(text, 1, (size_t)size, mf) != size) {
            r = dt_set_error(DT_ERR_IO, "cannot read %s", meta);
            goto done;
        }
        text[size] = '\0';
        if ((int64_t)strlen(text) != size) {
            r = dt_set_error(DT_ERR_FORMAT, "%s holds NUL bytes; it should be text, the 10 class names one per line", meta);
            goto done;
        }
        for (p = text; *p; ) {
            char *end;
            line = p;
            while (*p && *p != '\n') p++;
            end = p;
            if (*p) p++;
            while (line < end && (*line == ' ' || *line == '\t' || *line == '\r')) line++;
            while (end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) end--;
            if (end == line) continue;
            if (k == 10) { k = 11; break; }
            if (!(ds->class_names[k] = (char *)DT_MALLOC((size_t)(end - line) + 1))) {
                r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", meta);
                goto done;
            }
            memcpy(ds->class_names[k], line, (size_t)(end - line));
            ds->class_names[k++][end - line] = '\0';
        }
        if (k != 10) {
            r = dt_set_error(DT_ERR_FORMAT, "%s holds %s10 class names; CIFAR-10's has 10, one per line (remove the "
                             "file to load without names)", meta, k > 10 ? "more than " : k < 10 ? "fewer than " : "");
            goto done;
        }
    }
done:
    for (f = 0; f < nf; f++) {
        if (fp[f]) fclose(fp[f]);
        DT_FREE(path[f]);
    }
    if (mf) fclose(mf);
    DT_FREE(meta);
    DT_FREE(text);
    if (r != DT_OK) dt_dataset_free(ds);
    return r;
}

#ifdef DT_USE_STB_IMAGE
/* A growable array of DT_MALLOC'd strings. */
typedef struct dt__strs { char **s; int64_t n, cap; } dt__strs;

static void dt__strs_free(dt__strs *l) {
    int64_t i;
    for (i = 0; i < l->n; i++) DT_FREE(l->s[i]);
    DT_FREE(l->s);
    memset(l, 0, sizeof *l);
}
/* Appends str (owned from now on: freed here on failure). Returns 0, or -1 when out of memory. */
static int dt__strs_push(dt__strs *l, char *str) {
    if (!str) return -1;
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        char **s = (char **)DT_REALLOC(l->s, sizeof(char *) * (size_t)cap);
        if (!s) { DT_FREE(str); return -1; }
        l->s = s;
        l->cap = cap;
    }
    l->s[l->n++] = str;
    return 0;
}
static int dt__strs_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* torchvision's IMG_EXTENSIONS, compared without case. */
static int dt__is_image_name(const char *name) {
    static const char *ext[] = {"jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"};
    const char *dot = strrchr(name, '.');
    size_t i, j;
    if (!dot) return 0;
    for (i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        for (j = 0; ext[i][j] && dot[1 + j]; j++) {
            char ch = dot[1 + j];
            if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
            if (ch != ext[i][j]) break;
        }
        if (!ext[i][j] && !dot[1 + j]) return 1;
    }
    return 0;
}

/* The names in dir that do not start with '.' and are directories (dirs != 0) or regular files with an
   image extension, sorted byte-wise (as Python's sorted()). stat() follows symbolic links, as torchvision. */
static dt_result dt__list_dir(const char *dir, int dirs, dt__strs *out) {
    DIR *d;
    dt_result r = DT_OK;
    memset(out, 0, sizeof *out);
    if (!(d = opendir(dir))) return dt_set_error(DT_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    for (;;) {
        struct dirent *e;
        struct stat st;
        char *p;
        int keep;
        errno = 0;
        if (!(e = readdir(d))) {
            if (errno) r = dt_set_error(DT_ERR_IO, "cannot list directory %s: %s", dir, strerror(errno));
            break;
        }
        if (e->d_name[0] == '.' || (!dirs && !dt__is_image_name(e->d_name))) continue;
        if (!(p = dt__path(dir, e->d_name))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", dir); break; }
        keep = stat(p, &st) == 0 && (dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
        DT_FREE(p);
        if (keep && dt__strs_push(out, dt__str3(e->d_name, "", "")) != 0) {
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", dir);
            break;
        }
    }
    closedir(d);
    if (r != DT_OK) dt__strs_free(out);
    else if (out->n > 1) qsort(out->s, (size_t)out->n, sizeof(char *), dt__strs_cmp);
    return r;
}

/* Accepts PNG, JPEG and BMP (for stb_image) and binary PGM/PPM (decoded here). Refuses everything else:
   formats outside torchvision's list (stb_image would also try GIF, PSD, HDR, PIC and TGA, whose loaders
   are the least robust, and TGA has no magic number, so random bytes could "decode") and the listed
   formats stb_image cannot decode, with a message saying so. */
static dt_result dt__image_sniff(const char *path, const uint8_t *b, int64_t n) {
    static const uint8_t png[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    if (n >= 8 && memcmp(b, png, 8) == 0) return DT_OK;
    if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return DT_OK;                  /* JPEG */
    if (n >= 2 && b[0] == 'B' && b[1] == 'M') return DT_OK;                                    /* BMP */
    if (n >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return DT_OK;                   /* PGM, PPM */
    if (n >= 4 && ((b[0] == 'I' && b[1] == 'I' && b[2] == 42 && b[3] == 0) || (b[0] == 'M' && b[1] == 'M' && b[2] == 0 && b[3] == 42)))
        return dt_set_error(DT_ERR_FORMAT, "%s is a TIFF image, which stb_image cannot decode; convert it to PNG", path);
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0)
        return dt_set_error(DT_ERR_FORMAT, "%s is a WebP image, which stb_image cannot decode; convert it to PNG", path);
    if (n >= 2 && b[0] == 'P' && (b[1] == '2' || b[1] == '3'))
        return dt_set_error(DT_ERR_FORMAT, "%s is a text (P2/P3) PGM/PPM image; only the binary kinds (P5/P6) are read, "
                            "convert it", path);
    return dt_set_error(DT_ERR_FORMAT, "%s cannot be decoded: it is not a PNG, JPEG, BMP or binary PGM/PPM image (it "
                        "starts %02x %02x %02x %02x)", path, n > 0 ? b[0] : 0, n > 1 ? b[1] : 0, n > 2 ? b[2] : 0,
                        n > 3 ? b[3] : 0);
}

/* Binary PGM/PPM (P5/P6) are decoded here rather than by stb_image 2.27, which reads 16-bit samples in
   the wrong byte order, reads past its buffer when converting them (CVE-2021-42716, found again by
   fuzz/fuzz_image.c), returns uninitialised memory for a truncated file and can overflow an int while
   parsing the header. Samples are scaled so that maxval is 255, as the Netpbm format defines. Gives
   *out [h, w, comp] (DT_FREE it), comp 1 (PGM) or 3 (PPM). */
static dt_result dt__pnm_decode(const char *path, const uint8_t *b, int64_t n, uint8_t **out, int *ow, int *oh,
                                int *ocomp) {
    int64_t pos = 2, v[3] = {0, 0, 0}, need, i, np, maxv;
    int k, comp = b[1] == '6' ? 3 : 1, wide;
    *out = NULL;
    for (k = 0; k < 3; k++) {   /* width, height, maxval, each after whitespace and # comments */
        for (;;) {
            while (pos < n && (b[pos] == ' ' || b[pos] == '\t' || b[pos] == '\n' || b[pos] == '\v' || b[pos] == '\f' ||
                               b[pos] == '\r'))
                pos++;
            if (pos >= n || b[pos] != '#') break;
            while (pos < n && b[pos] != '\n' && b[pos] != '\r') pos++;
        }
        if (pos >= n || b[pos] < '0' || b[pos] > '9')
            return dt_set_error(DT_ERR_FORMAT, "%s: its PGM/PPM header is incomplete (width, height and maxval expected)",
                                path);
        while (pos < n && b[pos] >= '0' && b[pos] <= '9') {
            v[k] = v[k] * 10 + (b[pos++] - '0');
            if (v[k] > (1 << 24)) return dt_set_error(DT_ERR_FORMAT, "%s: a number in its PGM/PPM header is too large", path);
        }
    }
    if (pos >= n || !(b[pos] == ' ' || b[pos] == '\t' || b[pos] == '\n' || b[pos] == '\v' || b[pos] == '\f' || b[pos] == '\r'))
        return dt_set_error(DT_ERR_FORMAT, "%s: its PGM/PPM header does not end with a whitespace character", path);
    pos++;
    maxv = v[2];
    if (v[0] == 0 || v[1] == 0 || maxv == 0 || maxv > 65535)
        return dt_set_error(DT_ERR_FORMAT, "%s: its PGM/PPM header says %lldx%lld pixels with maxval %lld; all must be "
                            "positive and maxval at most 65535", path, (long long)v[0], (long long)v[1], (long long)maxv);
    np = v[0] * v[1];
    if (np > (int64_t)DT_IMAGE_MAX_PIXELS)
        return dt_set_error(DT_ERR_FORMAT, "%s is %lldx%lld pixels, more than DT_IMAGE_MAX_PIXELS (%lld); define that macro "
                            "larger or shrink the image", path, (long long)v[0], (long long)v[1], (long long)DT_IMAGE_MAX_PIXELS);
    wide = maxv > 255;
    need = np * comp * (wide ? 2 : 1);
    if (n - pos < need)
        return dt_set_error(DT_ERR_FORMAT, "%s is truncated: its PGM/PPM header says %lldx%lld pixels (%lld bytes) but %lld "
                            "bytes follow the header", path, (long long)v[0], (long long)v[1], (long long)need,
                            (long long)(n - pos));
    if (!(*out = (uint8_t *)DT_MALLOC((size_t)(np * comp))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to decode %s", path);
    for (i = 0; i < np * comp; i++) {
        int64_t x = wide ? ((int64_t)b[pos + 2 * i] << 8) | b[pos + 2 * i + 1] : b[pos + i];   /* big-endian */
        (*out)[i] = x >= maxv ? 255 : (uint8_t)((x * 255 + maxv / 2) / maxv);
    }
    *ow = (int)v[0];
    *oh = (int)v[1];
    *ocomp = comp;
    return DT_OK;
}

/* Decodes the image file at path into dst [ch, h, w]; buf/bufcap is a reusable read buffer and tmp an
   [h, w, ch] scratch buffer. The image is decoded with its own components and converted here, as
   stb_image converts (grey = (77 R + 150 G + 29 B) >> 8, alpha dropped), so that stb_image's conversion
   code, where CVE-2021-42716 lives, is never run. */
/* stb_image 2.27 grows its buffer for a PNG's IDAT chunks to the length a chunk claims before checking
   that the file holds that much, so a few corrupt bytes ask for gigabytes (found by fuzz/fuzz_image.c).
   Every chunk up to IEND must fit in the file. */
static dt_result dt__png_check(const char *path, const uint8_t *b, int64_t n) {
    int64_t pos = 8;
    while (n - pos >= 12) {
        int64_t len = (int64_t)dt__be32(b + pos);
        if (len > n - pos - 12)
            return dt_set_error(DT_ERR_FORMAT, "%s is truncated or corrupt: a PNG chunk at byte %lld claims %lld bytes, the "
                                "file has %lld left", path, (long long)pos, (long long)len, (long long)(n - pos - 12));
        if (memcmp(b + pos + 4, "IEND", 4) == 0) break;
        pos += 12 + len;
    }
    return DT_OK;
}

/* stb_image 2.27 decodes a JPEG scan with Huffman tables that were never defined (uninitialised memory:
   its decoder then indexes past its tables; found by fuzz/fuzz_image.c with stb_image built in). This
   walks the markers and checks that each scan's tables, as stb_image will use them, were defined by a DHT
   (and its quantisation tables by a DQT) before it. */
static dt_result dt__jpeg_check(const char *path, const uint8_t *b, int64_t n) {
    int64_t pos = 2;
    int dht[2][4], dqt[4], ncomp = 0, progressive = 0, i;
    int comp_id[4] = {0, 0, 0, 0}, comp_tq[4] = {0, 0, 0, 0};
    memset(dht, 0, sizeof dht);
    memset(dqt, 0, sizeof dqt);
    for (;;) {
        int64_t len, p, end;
        int marker;
        while (pos < n && b[pos] != 0xff) pos++;           /* to the next marker (past entropy-coded data) */
        while (pos < n && b[pos] == 0xff) pos++;
        if (pos >= n) return DT_OK;                           /* no EOI: stb_image decodes what is there */
        marker = b[pos++];
        if (marker == 0xd9) return DT_OK;                     /* EOI */
        if (marker == 0x00 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) continue;   /* no segment */
        if (n - pos < 2 || (len = ((int64_t)b[pos] << 8) | b[pos + 1]) < 2 || len > n - pos)
            return dt_set_error(DT_ERR_FORMAT, "%s is truncated or corrupt: the JPEG segment at byte %lld runs past the "
                                "end of the file", path, (long long)(pos - 2));
        p = pos + 2;
        end = pos + len;
        pos = end;
        if (marker == 0xc4) {                                 /* DHT: class, id, 16 counts, values */
            while (p < end) {
                int64_t count = 0;
                int tc = b[p] >> 4, th = b[p] & 15;
                if (tc > 1 || th > 3 || end - p < 17) break;   /* stb_image refuses it */
                for (i = 1; i <= 16; i++) count += b[p + i];
                dht[tc][th] = 1;
                p += 17 + count;
            }
        } else if (marker == 0xdb) {                          /* DQT: precision and id, 64 entries */
            while (p < end) {
                int tq = b[p] & 15;
                if (tq > 3) break;
                dqt[tq] = 1;
                p += 1 + 64 * ((b[p] >> 4) ? 2 : 1);
            }
        } else if (marker == 0xc0 || marker == 0xc1 || marker == 0xc2) {   /* SOF: the components */
            progressive = marker == 0xc2;
            if (end - p >= 6) {
                ncomp = b[p + 5] < 4 ? b[p + 5] : 4;
                for (i = 0; i < ncomp && p + 6 + 3 * i + 2 < end; i++) {
                    comp_id[i] = b[p + 6 + 3 * i];
                    comp_tq[i] = b[p + 6 + 3 * i + 2] & 3;
                }
            }
        } else if (marker == 0xda && end - p >= 1) {          /* SOS: components and their tables, Ss, Se, Ah/Al */
            int ns = b[p], ss, ah, k;
            if (end - p < 1 + 2 * (int64_t)ns + 3) continue;  /* stb_image refuses it */
            ss = b[p + 1 + 2 * ns];
            ah = b[p + 3 + 2 * ns] >> 4;
            for (k = 0; k < ns; k++) {
                int id = b[p + 1 + 2 * k], td = b[p + 2 + 2 * k] >> 4, ta = b[p + 2 + 2 * k] & 15, c;
                int need_dc = progressive ? (ss == 0 && ah == 0) : 1, need_ac = progressive ? ss > 0 : 1;
                for (c = 0; c < ncomp && comp_id[c] != id; c++) {}
                if (c == ncomp || td > 3 || ta > 3) continue;     /* stb_image refuses these itself */
                if ((need_dc && !dht[0][td]) || (need_ac && !dht[1][ta]) || !dqt[comp_tq[c]])
                    return dt_set_error(DT_ERR_FORMAT, "%s is corrupt: a JPEG scan uses a %s table that was never "
                                        "defined", path, !dqt[comp_tq[c]] ? "quantisation" : "Huffman");
            }
        }
    }
}

static void dt__image_free(uint8_t *img, int pnm) {
    if (pnm) DT_FREE(img);
    else stbi_image_free(img);
}
static dt_result dt__image_load(const char *path, int64_t h, int64_t w, int64_t ch, uint8_t **buf, int64_t *bufcap,
                                uint8_t *tmp, uint8_t *dst) {
    const char *why;
    FILE *fp = dt__open_read(path, &why);
    int64_t size, i, c, np;
    int iw = 0, ih = 0, comp = 0, pnm = 0;
    uint8_t *img = NULL, *conv = NULL;
    const uint8_t *src;
    if (!fp) return dt_set_error(DT_ERR_IO, "cannot open %s: %s", path, why);
    if ((size = dt__file_size(fp)) < 0 || size > INT32_MAX) {
        fclose(fp);
        return dt_set_error(size < 0 ? DT_ERR_IO : DT_ERR_FORMAT, "%s: %s", path,
                            size < 0 ? "cannot find its size (is it a regular file?)" : "larger than 2 GiB; not an image");
    }
    if (size == 0) { fclose(fp); return dt_set_error(DT_ERR_FORMAT, "%s is empty; it cannot be decoded", path); }
    if (size > *bufcap) {
        uint8_t *nb = (uint8_t *)DT_REALLOC(*buf, (size_t)size);
        if (!nb) { fclose(fp); return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s (%lld bytes)", path, (long long)size); }
        *buf = nb;
        *bufcap = size;
    }
    if ((int64_t)fread(*buf, 1, (size_t)size, fp) != size) {
        fclose(fp);
        return dt_set_error(DT_ERR_IO, "cannot read %s", path);
    }
    fclose(fp);
    if (dt__image_sniff(path, *buf, size) != DT_OK) return DT_ERR_FORMAT;
    if ((*buf)[0] == 'P') {   /* sniffed: P5 or P6 */
        dt_result r = dt__pnm_decode(path, *buf, size, &img, &iw, &ih, &comp);
        if (r != DT_OK) return r;
        pnm = 1;
    } else {
        if ((*buf)[0] == 0x89 && dt__png_check(path, *buf, size) != DT_OK) return DT_ERR_FORMAT;
        if ((*buf)[0] == 0xff && dt__jpeg_check(path, *buf, size) != DT_OK) return DT_ERR_FORMAT;
        if (!stbi_info_from_memory(*buf, (int)size, &iw, &ih, &comp)) {
            why = stbi_failure_reason();
            return dt_set_error(DT_ERR_FORMAT, "%s cannot be decoded: %s (stb_image)", path, why ? why : "unknown reason");
        }
        if (iw <= 0 || ih <= 0 || (int64_t)iw * ih > (int64_t)DT_IMAGE_MAX_PIXELS)
            return dt_set_error(DT_ERR_FORMAT, "%s is %dx%d pixels, more than DT_IMAGE_MAX_PIXELS (%lld); define that macro "
                                "larger or shrink the image", path, iw, ih, (long long)DT_IMAGE_MAX_PIXELS);
        if (!(img = stbi_load_from_memory(*buf, (int)size, &iw, &ih, &comp, 0))) {
            why = stbi_failure_reason();
            return dt_set_error(DT_ERR_FORMAT, "%s cannot be decoded: %s (stb_image)", path, why ? why : "unknown reason");
        }
    }
    np = (int64_t)iw * ih;
    src = img;
    if (comp < 1 || comp > 4 || iw <= 0 || ih <= 0 || np > (int64_t)DT_IMAGE_MAX_PIXELS) {
        dt__image_free(img, pnm);
        return dt_set_error(DT_ERR_FORMAT, "%s: stb_image decoded %dx%d pixels of %d components; the file is corrupt", path,
                            iw, ih, comp);
    }
    if (comp != ch) {
        if (!(conv = (uint8_t *)DT_MALLOC((size_t)(np * ch)))) {
            dt__image_free(img, pnm);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to convert %s (%dx%d pixels)", path, iw, ih);
        }
        for (i = 0; i < np; i++) {
            const uint8_t *p = img + i * comp;
            if (ch == 3) {   /* comp 1, 2: grey (and alpha); comp 4: RGBA */
                conv[3 * i] = p[0];
                conv[3 * i + 1] = comp >= 3 ? p[1] : p[0];
                conv[3 * i + 2] = comp >= 3 ? p[2] : p[0];
            } else {
                conv[i] = comp >= 3 ? (uint8_t)((p[0] * 77 + p[1] * 150 + p[2] * 29) >> 8) : p[0];
            }
        }
        src = conv;
    }
    if (iw != w || ih != h) {
        if (!stbir_resize_uint8(src, iw, ih, 0, tmp, (int)w, (int)h, 0, (int)ch)) {
            dt__image_free(img, pnm);
            DT_FREE(conv);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "stb_image_resize could not resize %s from %dx%d to %lldx%lld "
                                "(out of memory)", path, iw, ih, (long long)w, (long long)h);
        }
    } else {
        memcpy(tmp, src, (size_t)(h * w * ch));
    }
    dt__image_free(img, pnm);
    DT_FREE(conv);
    for (c = 0; c < ch; c++)   /* HWC -> CHW */
        for (i = 0; i < h * w; i++) dst[c * h * w + i] = tmp[i * ch + c];
    return DT_OK;
}

dt_result dt_dataset_load_image_folder(dt_dataset *ds, const char *root, int64_t h, int64_t w, int64_t channels) {
    dt__strs cls, names, files;
    int64_t *start = NULL, k, i, bufcap = 0, sample;
    uint8_t *buf = NULL, *tmp = NULL;
    dt_result r;
    memset(&cls, 0, sizeof cls);
    memset(&names, 0, sizeof names);
    memset(&files, 0, sizeof files);
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!root) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder: root is NULL");
    if (channels == 0) channels = 3;
    if (channels != 1 && channels != 3)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder(%s): channels is %lld; use 1 (grey), 3 "
                            "(RGB) or 0 (RGB)", root, (long long)channels);
    if (h <= 0 || w <= 0 || h > INT32_MAX || w > INT32_MAX || h * w > (int64_t)DT_IMAGE_MAX_PIXELS)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder(%s): size %lldx%lld is invalid; h and w "
                            "must be > 0 with h * w <= DT_IMAGE_MAX_PIXELS (%lld)", root, (long long)h, (long long)w,
                            (long long)DT_IMAGE_MAX_PIXELS);
    if ((r = dt__list_dir(root, 1, &cls)) != DT_OK) goto fail;
    if (cls.n == 0) {
        r = dt_set_error(DT_ERR_FORMAT, "%s holds no class directories; an image folder is root/<class>/<image>", root);
        goto fail;
    }
    if (!(start = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(cls.n + 1)))) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", root);
        goto fail;
    }
    for (k = 0; k < cls.n; k++) {   /* every image path, class by class, each class in name order */
        char *dir = dt__path(root, cls.s[k]);
        if (!dir) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", root); goto fail; }
        r = dt__list_dir(dir, 0, &names);
        start[k] = files.n;
        for (i = 0; r == DT_OK && i < names.n; i++)
            if (dt__strs_push(&files, dt__path(dir, names.s[i])) != 0)
                r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", root);
        if (r == DT_OK && names.n == 0)
            r = dt_set_error(DT_ERR_FORMAT, "class directory %s holds no images (files ending .jpg .jpeg .png .ppm .bmp "
                             ".pgm .tif .tiff .webp); add images or remove the directory", dir);
        DT_FREE(dir);
        dt__strs_free(&names);
        if (r != DT_OK) goto fail;
    }
    start[cls.n] = files.n;
    if ((uint64_t)files.n > (uint64_t)(SIZE_MAX / 2) / (uint64_t)(channels * h * w)) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: %lld images of %lldx%lldx%lld do not fit in memory", root,
                         (long long)files.n, (long long)channels, (long long)h, (long long)w);
        goto fail;
    }
    ds->pixels = (uint8_t *)DT_MALLOC((size_t)(files.n * channels * h * w));
    ds->labels = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)files.n);
    tmp = (uint8_t *)DT_MALLOC((size_t)(channels * h * w));
    if (!ds->pixels || !ds->labels || !tmp) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for %lld images of %lldx%lldx%lld from %s", (long long)files.n,
                         (long long)channels, (long long)h, (long long)w, root);
        goto fail;
    }
    for (k = 0; k < cls.n; k++)
        for (sample = start[k]; sample < start[k + 1]; sample++) {
            ds->labels[sample] = (int32_t)k;
            r = dt__image_load(files.s[sample], h, w, channels, &buf, &bufcap, tmp,
                               ds->pixels + sample * channels * h * w);
            if (r != DT_OK) goto fail;
        }
    ds->count = files.n;
    ds->c = channels;
    ds->h = h;
    ds->w = w;
    ds->num_classes = cls.n;
    ds->class_names = cls.s;   /* the class list's strings become the dataset's */
    snprintf(ds->source, sizeof ds->source, "%s", root);
    dt__strs_free(&files);
    DT_FREE(start);
    DT_FREE(buf);
    DT_FREE(tmp);
    return DT_OK;
fail:
    dt__strs_free(&cls);
    dt__strs_free(&files);
    DT_FREE(start);
    DT_FREE(buf);
    DT_FREE(tmp);
    dt_dataset_free(ds);
    return r;
}
#else
dt_result dt_dataset_load_image_folder(dt_dataset *ds, const char *root, int64_t h, int64_t w, int64_t channels) {
    (void)h; (void)w; (void)channels;
    if (ds) memset(ds, 0, sizeof *ds);
    return dt_set_error(DT_ERR_UNSUPPORTED, "dt_dataset_load_image_folder(%s): image decoding is not built in; build "
                        "with -DDT_USE_STB_IMAGE and link -lstb (Debian: libstb-dev)", root ? root : "NULL");
}
#endif /* DT_USE_STB_IMAGE */


/* ---- random helpers for the partitioners, the sampler and the loader ------------------------- */

/* RNG streams of the partitioners and the sampler: fixed, so that every rank draws the same numbers. */
#define DT__STREAM_PARTITION 0x7061727469ULL
#define DT__STREAM_SAMPLER   0x73616d706cULL
/* Draws of dt_partition_dirichlet before it moves samples into parts left empty. */
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

/* ---- partitions ------------------------------------------------------------------------------ */

void dt_partition_free(dt_partition *p) {
    if (!p) return;
    DT_FREE(p->offsets);   /* offsets and indices are one block */
    memset(p, 0, sizeof *p);
}

/* Zeroes *p and checks the arguments every constructor has. */
static dt_result dt__partition_check(dt_partition *p, int64_t count, int parts, const char *fn) {
    if (!p) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the partition pointer is NULL", fn);
    memset(p, 0, sizeof *p);
    if (count < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0 (the number of samples)", fn,
                            (long long)count);
    if (parts < 1) return dt_set_error(DT_ERR_INVALID_ARG, "%s: parts is %d; it must be >= 1", fn, parts);
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

dt_result dt_partition_fractions(dt_partition *p, int64_t count, const float *fractions, int parts, uint64_t seed) {
    const char *fn = "dt_partition_fractions";
    double sum = 0.0;
    int64_t left, n, *off;
    int k;
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, fn);
    if (e != DT_OK) return e;
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
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
    dt__shuffle(p->indices, count, &r);
    return DT_OK;
}

dt_result dt_partition_iid(dt_partition *p, int64_t count, int parts, uint64_t seed) {
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, "dt_partition_iid");
    if (e != DT_OK || (e = dt__partition_alloc(p, parts, count, "dt_partition_iid")) != DT_OK) return e;
    dt__offsets_equal(p->offsets, parts, count);
    dt__iota(p->indices, count);
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
    dt__shuffle(p->indices, count, &r);
    return DT_OK;
}

dt_result dt_partition_contiguous(dt_partition *p, int64_t count, int parts) {
    dt_result e = dt__partition_check(p, count, parts, "dt_partition_contiguous");
    if (e != DT_OK || (e = dt__partition_alloc(p, parts, count, "dt_partition_contiguous")) != DT_OK) return e;
    dt__offsets_equal(p->offsets, parts, count);
    dt__iota(p->indices, count);
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

dt_result dt_partition_shards(dt_partition *p, const int32_t *labels, int64_t count, int parts, int shards_per_part,
                              uint64_t seed) {
    const char *fn = "dt_partition_shards";
    int64_t i, shards, q, rem, pos, *tmp, *sorted, *perm;
    int k, j;
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, fn);
    if (e != DT_OK) return e;
    if (shards_per_part < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: shards_per_part is %d; it must be >= 1 (the FedAvg paper uses 2)", fn,
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
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
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

dt_result dt_partition_dirichlet(dt_partition *p, const int32_t *labels, int64_t count, int64_t num_classes, int parts,
                                 float alpha, uint64_t seed) {
    const char *fn = "dt_partition_dirichlet";
    int64_t i, k, cells, n64, *byclass, *coff, *cnt, *tot, *pos;
    double *w;
    char *mem;
    int j, attempt, empty;
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, fn);
    if (e != DT_OK) return e;
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
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
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

dt_result dt_partition_histogram(const dt_partition *p, const int32_t *labels, int64_t num_classes, int64_t *hist) {
    const char *fn = "dt_partition_histogram";
    int64_t i, id;
    int k;
    if (!p || !hist) return dt_set_error(DT_ERR_INVALID_ARG, "%s: NULL argument (partition and hist are needed)", fn);
    if (p->parts < 1 || !p->offsets)
        return dt_set_error(DT_ERR_STATE, "%s: the partition has no parts; build it with a dt_partition_* constructor", fn);
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

int64_t dt_sampler_size(int64_t count, int world, int drop_last) {
    if (count < 0 || world < 1) return 0;
    return count / world + (!drop_last && count % world != 0 ? 1 : 0);
}

dt_result dt_sampler_indices(int64_t count, int rank, int world, uint64_t seed, int64_t epoch, int shuffle,
                             int drop_last, int64_t *out, int64_t *n_out) {
    const char *fn = "dt_sampler_indices";
    int64_t n, j, *perm = NULL;
    dt_rng r;
    if (!n_out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: n_out is NULL", fn);
    *n_out = 0;
    if (count < 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0", fn, (long long)count);
    if (world < 1 || rank < 0 || rank >= world)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d of world %d; it needs world >= 1 and 0 <= rank < world", fn,
                            rank, world);
    if (epoch < 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: epoch is %lld; it must be >= 0", fn, (long long)epoch);
    n = dt_sampler_size(count, world, drop_last);
    if (n == 0) return DT_OK;
    if (!out)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: out is NULL; it must hold dt_sampler_size(count, world, drop_last) = "
                            "%lld ids", fn, (long long)n);
    if (shuffle) {
        if ((uint64_t)count > SIZE_MAX / sizeof(int64_t) || !(perm = (int64_t *)DT_MALLOC((size_t)count * sizeof(int64_t))))
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for a permutation of %lld samples", fn,
                                (long long)count);
        dt__iota(perm, count);
        dt__rng_epoch(&r, seed, (uint64_t)epoch, DT__STREAM_SAMPLER);
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
    int64_t start = k * l->batch, n = l->count - start < l->batch ? l->count - start : l->batch;
    return dt_dataset_batch(l->ds, l->order + start, n, l->has_tf ? &l->tf : NULL, l->seed, (uint64_t)l->epoch,
                            l->x[slot], l->y[slot]);
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
