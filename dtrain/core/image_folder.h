/* dtrain/core/image_folder.h - datasets from image folders (torchvision's ImageFolder).   Part of dtrain
   v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_dataset_load_image_folder: classes from the sub-directories, images decoded by stb_image (with
     DT_USE_STB_IMAGE) and resized by stb_image_resize; the checks that keep stb_image off its faults
     (content sniffed before decoding, PNG chunks and JPEG tables checked) and dtrain's own PGM/PPM decoder.
   USES
     dtrain/core/data_files.h (the path and file helpers) and what it includes; stb_image and POSIX
     directories when built with DT_USE_STB_IMAGE.
   READ FIRST
     dt__image_load, dt_dataset_load_image_folder.
*/
#ifndef DTRAIN_IMAGE_FOLDER_H
#define DTRAIN_IMAGE_FOLDER_H
#include "data_files.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A dataset loader with the contract of dtrain/core/data_files.h's (it zeroes *ds, fills it with arrays for
   dt_dataset_free, leaves it zeroed on failure; not collective).
   torchvision's ImageFolder layout, root/<class>/<image>: classes are the sub-directories of root in
   byte-wise (Python sorted()) order, label = position in that order, class_names their names; images in
   a class are taken in name order. Files with the extensions torchvision accepts (.jpg .jpeg .png .ppm
   .bmp .pgm .tif .tiff .webp, any case) are images, other files and names starting with '.' are skipped.
   What has an image's name but is not a regular file (a directory, a dangling symbolic link, a FIFO) is
   skipped too, with one warning (dt_log) per kind, giving the count and the first one.
   Each image is decoded to `channels` components (1 or 3; 0 means 3) and resized to h x w with
   stb_image_resize's default filter. PNG, JPEG, BMP and binary PGM/PPM decode; TIFF and WebP are
   refused with a message. Needs DT_USE_STB_IMAGE (and POSIX <dirent.h>). */
dt_result dt_dataset_load_image_folder(dt_dataset *ds, const char *root, int64_t h, int64_t w, int64_t channels);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_IMAGE_FOLDER_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_IMAGE_FOLDER_IMPLEMENTATION_DONE)
#define DTRAIN_IMAGE_FOLDER_IMPLEMENTATION_DONE
#ifdef DT_USE_STB_IMAGE
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <dirent.h>
#include <sys/stat.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"

#ifndef DT_IMAGE_MAX_PIXELS
#define DT_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
#endif

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

/* What a class directory holds under an image's name but cannot serve as one, counted by kind so that the
   load warns once per kind (dt__skips_warn): a directory, what stat() cannot follow (a dangling symbolic link,
   no permission), and what is not a regular file (a FIFO, a socket, a device). */
enum { DT__SKIP_DIR, DT__SKIP_UNREADABLE, DT__SKIP_SPECIAL, DT__SKIP_KINDS };
typedef struct dt__skips {
    int64_t n[DT__SKIP_KINDS];
    char    first[DT__SKIP_KINDS][256];   /* the first of each kind, for the warning */
} dt__skips;

static void dt__skips_warn(const char *root, const dt__skips *sk) {
    static const char *const what[DT__SKIP_KINDS] = {
        "directories with an image's name (their contents are not walked)",
        "entries with an image's name that cannot be opened (dangling symbolic links, or no permission)",
        "entries with an image's name that are not regular files (FIFOs, sockets or devices)"};
    int k;
    for (k = 0; k < DT__SKIP_KINDS; k++)
        if (sk->n[k])
            dt_log(DT_LOG_WARN, "image folder %s: skipped %lld %s, the first %s", root, (long long)sk->n[k], what[k], sk->first[k]);
}

/* The names in dir that do not start with '.' and are directories (dirs != 0) or regular files with an
   image extension, sorted byte-wise (as Python's sorted()). stat() follows symbolic links, as torchvision.
   With an image extension, what is not a regular file is counted in sk (NULL: not counted). */
static dt_result dt__list_dir(const char *dir, int dirs, dt__strs *out, dt__skips *sk) {
    DIR *d;
    dt_result r = DT_OK;
    memset(out, 0, sizeof *out);
    if (!(d = opendir(dir))) return dt_set_error(DT_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    for (;;) {
        struct dirent *e;
        struct stat st;
        char *p;
        int keep, found;
        errno = 0;
        if (!(e = readdir(d))) {
            if (errno) r = dt_set_error(DT_ERR_IO, "cannot list directory %s: %s", dir, strerror(errno));
            break;
        }
        if (e->d_name[0] == '.' || (!dirs && !dt__is_image_name(e->d_name))) continue;
        if (!(p = dt__path(dir, e->d_name))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", dir); break; }
        found = stat(p, &st) == 0;
        keep = found && (dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
        if (!keep && !dirs && sk) {
            int kind = !found ? DT__SKIP_UNREADABLE : S_ISDIR(st.st_mode) ? DT__SKIP_DIR : DT__SKIP_SPECIAL;
            if (sk->n[kind]++ == 0) snprintf(sk->first[kind], sizeof sk->first[kind], "%s", p);
        }
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

/* The refusal of an image of w x h pixels, more than DT_IMAGE_MAX_PIXELS. */
static dt_result dt__image_too_large(const char *path, int64_t w, int64_t h) {
    return dt_set_error(DT_ERR_FORMAT, "%s is %lldx%lld pixels, more than DT_IMAGE_MAX_PIXELS (%lld); define that macro larger "
                        "or shrink the image", path, (long long)w, (long long)h, (long long)DT_IMAGE_MAX_PIXELS);
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
        return dt__image_too_large(path, v[0], v[1]);
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
        int64_t len = (int64_t)dt__get_be32(b + pos);
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

/* The width and height a PNG (its IHDR), BMP (its info header) or JPEG (its frame header) claims, read before
   stb_image sees the file: stb_image refuses a header it finds too large for its own limits, then tries every
   other format and reports "unknown image type", which hides the cause. Returns 1 with *w and *h, or 0 when the
   header holds no valid size (stb_image then says what is wrong). */
static int dt__image_dims(const uint8_t *b, int64_t n, int64_t *w, int64_t *h) {
    int64_t pos = 2;
    if (n >= 24 && b[0] == 0x89 && memcmp(b + 12, "IHDR", 4) == 0) {   /* PNG: sizes of 1 .. 2^31 - 1 */
        *w = (int64_t)dt__get_be32(b + 16); *h = (int64_t)dt__get_be32(b + 20);
        return *w > 0 && *h > 0 && *w <= INT32_MAX && *h <= INT32_MAX;
    }
    if (n >= 26 && b[0] == 'B' && b[1] == 'M') {   /* BMP: 16-bit sizes in the old 12-byte header, else 32-bit; a negative height is top-down */
        uint32_t hsize = (uint32_t)b[14] | (uint32_t)b[15] << 8 | (uint32_t)b[16] << 16 | (uint32_t)b[17] << 24;
        if (hsize == 12) { *w = b[18] | b[19] << 8; *h = b[20] | b[21] << 8; }
        else {
            uint32_t uw = (uint32_t)b[18] | (uint32_t)b[19] << 8 | (uint32_t)b[20] << 16 | (uint32_t)b[21] << 24;
            uint32_t uh = (uint32_t)b[22] | (uint32_t)b[23] << 8 | (uint32_t)b[24] << 16 | (uint32_t)b[25] << 24;
            *w = uw < 0x80000000u ? (int64_t)uw : -1;
            *h = uh < 0x80000000u ? (int64_t)uh : uh == 0x80000000u ? -1 : (int64_t)(0x100000000ULL - uh);
        }
        return *w > 0 && *h > 0;
    }
    if (n < 4 || b[0] != 0xff || b[1] != 0xd8) return 0;
    while (pos + 4 <= n && b[pos] == 0xff) {   /* JPEG: the segments before the frame header (SOF0 .. SOF15) */
        int marker;
        while (pos < n && b[pos] == 0xff) pos++;
        if (pos + 3 > n) return 0;
        marker = b[pos++];
        if (marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc) {
            if (pos + 7 > n) return 0;
            *h = (int64_t)b[pos + 3] << 8 | b[pos + 4]; *w = (int64_t)b[pos + 5] << 8 | b[pos + 6];
            return *w > 0 && *h > 0;
        }
        if (marker == 0xd8 || (marker >= 0xd0 && marker <= 0xd7) || marker == 0x01) continue;   /* no segment */
        pos += (int64_t)b[pos] << 8 | b[pos + 1];
    }
    return 0;
}

static void dt__image_free(uint8_t *img, int pnm) {
    if (pnm) DT_FREE(img);
    else stbi_image_free(img);
}
static dt_result dt__image_load(const char *path, int64_t h, int64_t w, int64_t ch, uint8_t **buf, int64_t *bufcap,
                                uint8_t *tmp, uint8_t *dst) {
    const char *why;
    FILE *fp = dt__open_read(path, &why);
    int64_t size, i, c, np, hw = 0, hh = 0;
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
        if (dt__image_dims(*buf, size, &hw, &hh) && hw * hh > (int64_t)DT_IMAGE_MAX_PIXELS)   /* before stb_image's own limits */
            return dt__image_too_large(path, hw, hh);
        if (!stbi_info_from_memory(*buf, (int)size, &iw, &ih, &comp)) {
            why = stbi_failure_reason();
            return dt_set_error(DT_ERR_FORMAT, "%s cannot be decoded: %s (stb_image)", path, why ? why : "unknown reason");
        }
        if (iw <= 0 || ih <= 0 || (int64_t)iw * ih > (int64_t)DT_IMAGE_MAX_PIXELS)
            return dt__image_too_large(path, iw, ih);
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
    dt__skips skips;
    int64_t *start = NULL, k, i, bufcap = 0, sample;
    uint8_t *buf = NULL, *tmp = NULL;
    dt_result r;
    memset(&skips, 0, sizeof skips);
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
    if ((r = dt__list_dir(root, 1, &cls, NULL)) != DT_OK) goto fail;
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
        r = dt__list_dir(dir, 0, &names, &skips);
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
    dt__skips_warn(root, &skips);
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
                        "with -DDT_USE_STB_IMAGE and link -lstb (Debian: libstb-dev), or your own stb_image.h and "
                        "stb_image_resize.h compiled once with STB_IMAGE_IMPLEMENTATION and "
                        "STB_IMAGE_RESIZE_IMPLEMENTATION (dtrain's Makefile: make STB_DIR=DIR)", root ? root : "NULL");
}
#endif /* DT_USE_STB_IMAGE */

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
