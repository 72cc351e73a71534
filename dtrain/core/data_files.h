/* dtrain/core/data_files.h - datasets from files: IDX (MNIST, Fashion-MNIST) and CIFAR-10.   Part of dtrain
   v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The loaders of IDX files (MNIST, Fashion-MNIST; gzip with DT_USE_ZLIB), of an MNIST directory and of
     CIFAR-10's binary batches into a dt_dataset, kept as uint8; the byte stream they read (raw or gzip,
     told by its magic bytes), and the path and file helpers the image-folder loader uses too.
   USES
     dtrain/core/data.h (dt_dataset) and what it includes; zlib when built with DT_USE_ZLIB.
   READ FIRST
     dt__in_read_payload (a corrupt header costs nothing), dt_dataset_load_idx, dt_dataset_load_cifar10.
*/
#ifndef DTRAIN_DATA_FILES_H
#define DTRAIN_DATA_FILES_H
#include "data.h"

#ifdef __cplusplus
extern "C" {
#endif

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
#ifndef DT_MNIST_DEFAULT_DIR
#define DT_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif
/* CIFAR-10, binary version: dir/data_batch_1.bin .. data_batch_5.bin (train != 0) or dir/test_batch.bin,
   records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32). Gives c = 3, h = w = 32,
   num_classes = 10; class_names from dir/batches.meta.txt (one name per line) when present, else NULL. */
dt_result dt_dataset_load_cifar10(dt_dataset *ds, const char *dir, int train);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DATA_FILES_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_DATA_FILES_IMPLEMENTATION_DONE)
#define DTRAIN_DATA_FILES_IMPLEMENTATION_DONE
#ifdef DT_USE_ZLIB
#include <zlib.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"

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
    int64_t disk;       /* the file's size on disk (compressed), or -1 */
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
    in->disk = dt__file_size(in->fp);
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
   buffer (*out, DT_FREE it). A claim the file's size makes plausible (at most 64 times its bytes on disk: gzip
   shrinks images by far less) gets its buffer at once, on huge pages (dt__advise_huge: Fashion-MNIST's 47 MB
   then take 24 page faults, not 11,500); beyond that the buffer grows with the data actually read, so a
   header that claims more than the file holds costs little. `what` describes the header's claim for the
   message. */
static dt_result dt__in_read_payload(dt__in *in, int64_t head, int64_t want, const char *what, uint8_t **out) {
    int64_t small = (int64_t)1 << 16, plausible = in->disk > 0 && in->disk < INT64_MAX / 64 ? 64 * in->disk : 0;
    int64_t cap = want + 1 <= small || want + 1 <= plausible ? want + 1 : small, have = 0, got;
    uint8_t *buf = (uint8_t *)DT_MALLOC((size_t)cap), *nb;
    dt_result r;
    *out = NULL;
    if (!buf) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", in->path);
    dt__advise_huge(buf, (size_t)cap);
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
    m = dt__get_be32(h);
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
    for (i = 0; i < ndim; i++) dims[i] = dt__get_be32(h + 4 + 4 * i);
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

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
