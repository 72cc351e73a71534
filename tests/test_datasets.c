/* Dataset loaders: IDX files (raw and gzip), MNIST directories, CIFAR-10 binary batches and image folders.
   Every input is generated here, in a temporary directory removed at the end; Fashion-MNIST from Debian's
   dataset-fashion-mnist is also loaded when it is installed. Every bad input must give the right code,
   a message naming the file, a zeroed dataset and no allocation left (counted here, and by the ASan run).
   Built without DT_USE_ZLIB / DT_USE_STB_IMAGE, the gzip and image tests check DT_ERR_UNSUPPORTED instead. */
#define _POSIX_C_SOURCE 200809L   /* mkdtemp, lstat, rmdir, unlink: the tests' own file handling */
#include "dt_test_alloc.h"   /* the counting allocator */
#include "dt_test_hooks.h"   /* DT_IMAGE_MAX_PIXELS 4096: small, so the test can exceed it */
#include "../dtrain.h"
#include "dt_test.h"
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef DT_USE_ZLIB
#include <zlib.h>
#endif
#ifdef DT_USE_STB_IMAGE
#include <stb/stb_image_write.h>
#endif

/* ---- files in the temporary directory ---- */
static char tmp_root[64];

/* tmp_root/rel, in one of a few rotating buffers */
static const char *tp(const char *rel) {
    static char buf[8][512];
    static int next;
    char *p = buf[next++ & 7];
    snprintf(p, 512, "%s/%s", tmp_root, rel);
    return p;
}
static void mkdir_rel(const char *rel) {
    if (mkdir(tp(rel), 0755) != 0) { dt_t_checks_failed++; printf("    cannot create %s\n", tp(rel)); }
}
static void write_file(const char *rel, const void *data, size_t n) {
    FILE *fp = fopen(tp(rel), "wb");
    if (!fp || fwrite(data, 1, n, fp) != n) { dt_t_checks_failed++; printf("    cannot write %s\n", tp(rel)); }
    if (fp) fclose(fp);
}
/* The file's bytes (malloc'd, *n its size), or NULL. */
static DT_T_UNUSED uint8_t *read_file(const char *rel, size_t *n) {
    FILE *fp = fopen(tp(rel), "rb");
    uint8_t *b;
    long size;
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    b = (uint8_t *)malloc((size_t)size + 1);
    *n = fread(b, 1, (size_t)size, fp);
    fclose(fp);
    return b;
}
#ifdef DT_USE_ZLIB
static void write_gz(const char *rel, const void *data, size_t n) {
    gzFile gz = gzopen(tp(rel), "wb");
    if (!gz || gzwrite(gz, data, (unsigned)n) != (int)n) { dt_t_checks_failed++; printf("    cannot write %s\n", tp(rel)); }
    if (gz) gzclose(gz);
}
#endif
#include "dt_test_files.h"

static uint64_t rnd_state = 0x9e3779b97f4a7c15ULL;
static uint8_t rnd8(void) {
    rnd_state = rnd_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint8_t)(rnd_state >> 56);
}
static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* ---- checks shared by the failure cases ---- */
static int ds_is_zero(const dt_dataset *ds) {
    dt_dataset z;
    memset(&z, 0, sizeof z);
    return memcmp(&z, ds, sizeof z) == 0;
}
/* A load that must fail with `want`, a message containing `name`, *ds zeroed and nothing allocated. */
static void expect_fail(dt_result got, dt_result want, const char *name, const dt_dataset *ds, int line) {
    int bad = 0;
    if (got != want) { printf("    line %d: returned %s, expected %s\n", line, dt_result_str(got), dt_result_str(want)); bad = 1; }
    if (name && !strstr(dt_last_error(), name)) { printf("    line %d: the message does not name \"%s\"\n", line, name); bad = 1; }
    if (!ds_is_zero(ds)) { printf("    line %d: *ds is not zeroed after the failure\n", line); bad = 1; }
    if (live_allocs != 0) { printf("    line %d: %ld allocations left after the failure\n", line, live_allocs); bad = 1; }
    if (bad) dt_t_checks_failed++;
    if (bad || getenv("DT_TEST_VERBOSE")) printf("    message: %s\n", dt_last_error());
}
#define EXPECT_FAIL(expr, code, name) expect_fail((expr), (code), (name), &ds, __LINE__)
/* Message contains s (for details beyond the file name). */
#define CHECK_MSG(s) do { if (!strstr(dt_last_error(), (s))) { dt_t_checks_failed++; \
    printf("    %s:%d: message lacks \"%s\": %s\n", __FILE__, __LINE__, (s), dt_last_error()); } } while (0)

/* ---- IDX ---- */
#define IN 7
#define IH 3
#define IW 5
static uint8_t idx_pix[IN * IH * IW];
static const uint8_t idx_lab[IN] = {3, 1, 4, 1, 5, 9, 0};

/* An IDX images file for n images of h x w from pix (NULL: random), in a malloc'd buffer of *len bytes. */
static uint8_t *idx_images(uint32_t n, uint32_t h, uint32_t w, const uint8_t *pix, size_t *len) {
    size_t i, np = (size_t)n * h * w;
    uint8_t *b = (uint8_t *)malloc(16 + np);
    put_be32(b, 0x803); put_be32(b + 4, n); put_be32(b + 8, h); put_be32(b + 12, w);
    for (i = 0; i < np; i++) b[16 + i] = pix ? pix[i] : rnd8();
    *len = 16 + np;
    return b;
}
static uint8_t *idx_labels(uint32_t n, const uint8_t *lab, size_t *len) {
    size_t i;
    uint8_t *b = (uint8_t *)malloc(8 + n);
    put_be32(b, 0x801); put_be32(b + 4, n);
    for (i = 0; i < n; i++) b[8 + i] = lab ? lab[i] : (uint8_t)(i % 10);
    *len = 8 + n;
    return b;
}
/* Writes the standard small pair as <stem>-img / <stem>-lab (gzip when gz). */
static void write_idx_pair(const char *img, const char *lab, int gz) {
    size_t li, ll;
    uint8_t *bi = idx_images(IN, IH, IW, idx_pix, &li), *bl = idx_labels(IN, idx_lab, &ll);
#ifdef DT_USE_ZLIB
    if (gz) { write_gz(img, bi, li); write_gz(lab, bl, ll); }
    else
#endif
    { (void)gz; write_file(img, bi, li); write_file(lab, bl, ll); }
    free(bi);
    free(bl);
}
static void check_idx_small(const dt_dataset *ds) {
    int i;
    CHECK(ds->count == IN && ds->c == 1 && ds->h == IH && ds->w == IW && ds->num_classes == 10);
    CHECK(ds->class_names == NULL && ds->pixels && ds->labels);
    if (!ds->pixels || !ds->labels || ds->count != IN) return;
    CHECK(memcmp(ds->pixels, idx_pix, sizeof idx_pix) == 0);
    for (i = 0; i < IN; i++) CHECK(ds->labels[i] == idx_lab[i]);
}

static void test_idx_raw(void) {
    dt_dataset ds;
    size_t li, ll;
    uint8_t *bi, *bl;
    write_idx_pair("a-img", "a-lab", 0);
    CHECK_OK(dt_dataset_load_idx(&ds, tp("a-img"), tp("a-lab")));
    check_idx_small(&ds);
    CHECK(strstr(ds.source, "a-img") != NULL);
    dt_dataset_free(&ds);
    CHECK(ds_is_zero(&ds) && live_allocs == 0);
    /* larger than the first read buffer (64 KiB), so the buffer grows */
    bi = idx_images(300, 28, 28, NULL, &li);
    bl = idx_labels(300, NULL, &ll);
    write_file("big-img", bi, li);
    write_file("big-lab", bl, ll);
    CHECK_OK(dt_dataset_load_idx(&ds, tp("big-img"), tp("big-lab")));
    CHECK(ds.count == 300 && ds.h == 28 && ds.w == 28);
    if (ds.pixels && ds.count == 300) CHECK(memcmp(ds.pixels, bi + 16, li - 16) == 0);
    if (ds.labels && ds.count == 300) CHECK(ds.labels[299] == 9 && ds.labels[123] == 3);
    dt_dataset_free(&ds);
    free(bi);
    free(bl);
    CHECK(live_allocs == 0);
}

/* dt_dataset_pad: zeros around each image, centred (an odd margin puts the extra row and column after); a size
   smaller than the images refused naming both; the same size a no-op; memory accounted */
static void test_pad(void) {
    dt_dataset ds;
    int64_t i, y, x, h = IH + 3, w = IW + 4, top = 1, left = 2;
    int bad = 0;
    write_idx_pair("p-img", "p-lab", 0);
    CHECK_OK(dt_dataset_load_idx(&ds, tp("p-img"), tp("p-lab")));
    CHECK_ERR(dt_dataset_pad(&ds, IH - 1, IW), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "smaller than the images") != NULL);
    CHECK_OK(dt_dataset_pad(&ds, IH, IW));
    check_idx_small(&ds);
    CHECK_OK(dt_dataset_pad(&ds, h, w));
    CHECK(ds.h == h && ds.w == w && ds.count == IN && live_allocs == 2);
    for (i = 0; ds.pixels && ds.h == h && i < IN; i++)
        for (y = 0; y < h; y++)
            for (x = 0; x < w; x++) {
                int in = y >= top && y < top + IH && x >= left && x < left + IW;
                uint8_t want = in ? idx_pix[(i * IH + y - top) * IW + x - left] : 0;
                bad += ds.pixels[(i * h + y) * w + x] != want;
            }
    CHECK(bad == 0);
    dt_dataset_free(&ds);
    CHECK(live_allocs == 0);
    CHECK_ERR(dt_dataset_pad(&ds, h, w), DT_ERR_STATE);
}

#ifdef DT_USE_ZLIB
static void test_idx_gzip(void) {
    dt_dataset ds;
    size_t li, ll;
    uint8_t *bi, *bl;
    write_idx_pair("g-img.gz", "g-lab.gz", 1);
    CHECK_OK(dt_dataset_load_idx(&ds, tp("g-img.gz"), tp("g-lab.gz")));
    check_idx_small(&ds);
    dt_dataset_free(&ds);
    /* detected by content, not name: a gzip file without .gz, mixed with a raw one */
    write_idx_pair("m-img", "m-lab.gz", 1);
    write_idx_pair("r-img", "r-lab", 0);
    CHECK_OK(dt_dataset_load_idx(&ds, tp("m-img"), tp("r-lab")));
    check_idx_small(&ds);
    dt_dataset_free(&ds);
    CHECK_OK(dt_dataset_load_idx(&ds, tp("r-img"), tp("m-lab.gz")));
    check_idx_small(&ds);
    dt_dataset_free(&ds);
    bi = idx_images(500, 28, 28, NULL, &li);
    bl = idx_labels(500, NULL, &ll);
    write_gz("bigz-img", bi, li);
    write_gz("bigz-lab", bl, ll);
    CHECK_OK(dt_dataset_load_idx(&ds, tp("bigz-img"), tp("bigz-lab")));
    CHECK(ds.count == 500);
    if (ds.pixels && ds.count == 500) CHECK(memcmp(ds.pixels, bi + 16, li - 16) == 0);
    dt_dataset_free(&ds);
    free(bi);
    free(bl);
    CHECK(live_allocs == 0);
}
#else
static void test_idx_gzip_unsupported(void) {
    dt_dataset ds;
    static const uint8_t fake[4] = {0x1f, 0x8b, 8, 0};
    write_idx_pair("r-img", "r-lab", 0);
    write_file("fake.gz", fake, sizeof fake);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("fake.gz"), tp("r-lab")), DT_ERR_UNSUPPORTED, "fake.gz");
    CHECK_MSG("DT_USE_ZLIB");
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("r-img"), tp("fake.gz")), DT_ERR_UNSUPPORTED, "fake.gz");
}
#endif

/* writes an images file whose header is (magic, n, h, w) over `payload` pixel bytes */
static void write_idx_raw_header(const char *rel, uint32_t magic, uint32_t n, uint32_t h, uint32_t w, size_t payload) {
    uint8_t *b = (uint8_t *)calloc(1, 16 + payload);
    put_be32(b, magic); put_be32(b + 4, n); put_be32(b + 8, h); put_be32(b + 12, w);
    write_file(rel, b, 16 + payload);
    free(b);
}

static void test_idx_errors(void) {
    dt_dataset ds;
    size_t li, ll;
    uint8_t *bi, *bl;
    char num[32];
    memset(&ds, 0x5a, sizeof ds);   /* a failed load must zero whatever was there */
    write_idx_pair("e-img", "e-lab", 0);
    bi = idx_images(IN, IH, IW, idx_pix, &li);
    bl = idx_labels(IN, idx_lab, &ll);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("no-such-img"), tp("e-lab")), DT_ERR_IO, "no-such-img");
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-img"), tp("no-such-lab")), DT_ERR_IO, "no-such-lab");
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tmp_root, tp("e-lab")), DT_ERR_IO, tmp_root);            /* a directory */
    EXPECT_FAIL(dt_dataset_load_idx(&ds, NULL, tp("e-lab")), DT_ERR_INVALID_ARG, "images");
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-img"), NULL), DT_ERR_INVALID_ARG, "labels");
    CHECK_ERR(dt_dataset_load_idx(NULL, tp("e-img"), tp("e-lab")), DT_ERR_INVALID_ARG);
    /* magic numbers */
    write_idx_raw_header("magic-img", 0x804, IN, IH, IW, IN * IH * IW);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("magic-img"), tp("e-lab")), DT_ERR_FORMAT, "magic-img");
    CHECK_MSG("0x00000804");
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-lab"), tp("e-img")), DT_ERR_FORMAT, "e-lab");    /* swapped */
    CHECK_MSG("labels file");
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-img"), tp("e-img")), DT_ERR_FORMAT, "e-img");
    write_file("tiny-img", bi, 3);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("tiny-img"), tp("e-lab")), DT_ERR_FORMAT, "tiny-img");
    write_file("empty-img", bi, 0);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("empty-img"), tp("e-lab")), DT_ERR_FORMAT, "empty-img");
    write_file("hdr-img", bi, 10);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("hdr-img"), tp("e-lab")), DT_ERR_FORMAT, "hdr-img");
    write_file("hdr-lab", bl, 6);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-img"), tp("hdr-lab")), DT_ERR_FORMAT, "hdr-lab");
    /* sizes: truncated, too long, header dims that do not match the file */
    write_file("trunc-img", bi, li - 5);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("trunc-img"), tp("e-lab")), DT_ERR_FORMAT, "trunc-img");
    snprintf(num, sizeof num, "%lu", (unsigned long)li);        /* the expected size ... */
    CHECK_MSG(num);
    snprintf(num, sizeof num, "%lu", (unsigned long)(li - 5));  /* ... and the actual one */
    CHECK_MSG(num);
    CHECK_MSG("truncated");
    write_file("trunc-lab", bl, ll - 1);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-img"), tp("trunc-lab")), DT_ERR_FORMAT, "trunc-lab");
    {
        uint8_t *longer = (uint8_t *)calloc(1, li + 3);
        memcpy(longer, bi, li);
        write_file("long-img", longer, li + 3);
        free(longer);
    }
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("long-img"), tp("e-lab")), DT_ERR_FORMAT, "long-img");
    snprintf(num, sizeof num, "%lu", (unsigned long)(li + 3));
    CHECK_MSG(num);
    write_idx_raw_header("dims-img", 0x803, IN, IH + 1, IW, IN * IH * IW);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("dims-img"), tp("e-lab")), DT_ERR_FORMAT, "dims-img");
    write_idx_raw_header("zero-img", 0x803, IN, 0, IW, 0);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("zero-img"), tp("e-lab")), DT_ERR_FORMAT, "zero-img");
    write_idx_raw_header("huge-img", 0x803, 0xffffffffu, 0xffffffffu, 0xffffffffu, 8);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("huge-img"), tp("e-lab")), DT_ERR_FORMAT, "huge-img");
    write_idx_raw_header("wrap-img", 0x803, 0xffffffffu, 0x10000u, 0x10000u, 8);   /* n * h * w wraps past 2^64 */
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("wrap-img"), tp("e-lab")), DT_ERR_FORMAT, "wrap-img");
    /* a claim of 10^12 bytes that does not overflow: refused as truncated, without allocating it */
    write_idx_raw_header("claim-img", 0x803, 1000000u, 1000u, 1000u, 64);
    {
        uint8_t *cl = idx_labels(1000000u, NULL, &ll);
        write_file("claim-lab", cl, ll);
        free(cl);
    }
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("claim-img"), tp("claim-lab")), DT_ERR_FORMAT, "claim-img");
    /* the two files disagree; a label out of range */
    {
        uint8_t *b6 = idx_labels(IN - 1, idx_lab, &ll);
        write_file("six-lab", b6, ll);
        free(b6);
    }
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-img"), tp("six-lab")), DT_ERR_FORMAT, "six-lab");
    CHECK_MSG("e-img");
    {
        uint8_t bad[IN];
        memcpy(bad, idx_lab, IN);
        bad[4] = 10;
        free(bl);
        bl = idx_labels(IN, bad, &ll);
        write_file("ten-lab", bl, ll);
    }
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("e-img"), tp("ten-lab")), DT_ERR_FORMAT, "ten-lab");
    CHECK_MSG("label 10 at index 4");
#ifdef DT_USE_ZLIB
    {   /* a cut gzip stream and corrupt deflate data */
        size_t n = 0;
        uint8_t *gz;
        write_idx_pair("cut-img.gz", "cut-lab.gz", 1);
        gz = read_file("cut-img.gz", &n);
        CHECK(gz && n > 40);
        if (gz && n > 40) {
            write_file("cut-img.gz", gz, n / 2);
            EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("cut-img.gz"), tp("e-lab")), DT_ERR_FORMAT, "cut-img.gz");
            write_file("cut-img.gz", gz, 2);
            EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("cut-img.gz"), tp("e-lab")), DT_ERR_FORMAT, "cut-img.gz");
            gz[n - 6] ^= 0x55;   /* the CRC */
            write_file("crc-img.gz", gz, n);
            EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("crc-img.gz"), tp("e-lab")), DT_ERR_FORMAT, "crc-img.gz");
            gz[n - 6] ^= 0x55;
            memset(gz + 12, 0xff, 8);   /* the deflate data */
            write_file("bad-img.gz", gz, n);
            EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("bad-img.gz"), tp("e-lab")), DT_ERR_FORMAT, "bad-img.gz");
        }
        free(gz);
        /* a well-formed gzip file whose content is truncated IDX */
        write_gz("short-img.gz", bi, li - 1);
        EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("short-img.gz"), tp("e-lab")), DT_ERR_FORMAT, "short-img.gz");
        CHECK_MSG("decompressed");
    }
#endif
    free(bi);
    free(bl);
}

/* Every allocation in turn fails: the load returns DT_ERR_OUT_OF_MEMORY and frees everything. */
static void oom_sweep(dt_result (*load)(dt_dataset *, const void *), const void *arg, const char *what) {
    long k;
    dt_dataset ds;
    for (k = 0; k < 10000; k++) {
        dt_result r;
        live_allocs = total_allocs = 0;
        fail_after = k;
        r = load(&ds, arg);
        fail_after = -1;
        if (r == DT_OK) {
            CHECK(k > 0);
            dt_dataset_free(&ds);
            CHECK(live_allocs == 0);
            return;
        }
        if (r != DT_ERR_OUT_OF_MEMORY || !ds_is_zero(&ds) || live_allocs != 0) {
            dt_t_checks_failed++;
            printf("    %s, allocation %ld failing: %s, %ld allocations left: %s\n", what, k, dt_result_str(r),
                   live_allocs, dt_last_error());
            return;
        }
    }
    dt_t_checks_failed++;
    printf("    %s never succeeded\n", what);
}
static dt_result load_idx_pair(dt_dataset *ds, const void *arg) {
    const char *stem = (const char *)arg;
    char img[600], lab[600];
    snprintf(img, sizeof img, "%s-img", tp(stem));
    snprintf(lab, sizeof lab, "%s-lab", tp(stem));
    return dt_dataset_load_idx(ds, img, lab);
}
static void test_idx_out_of_memory(void) {
    size_t li, ll;
    uint8_t *bi = idx_images(200, 28, 28, NULL, &li), *bl = idx_labels(200, NULL, &ll);
    write_file("oom-img", bi, li);
    write_file("oom-lab", bl, ll);
    oom_sweep(load_idx_pair, "oom", "raw IDX");
#ifdef DT_USE_ZLIB
    write_gz("oomz-img", bi, li);
    write_gz("oomz-lab", bl, ll);
    oom_sweep(load_idx_pair, "oomz", "gzip IDX");
#endif
    free(bi);
    free(bl);
}

/* ---- MNIST directories ---- */
static void write_idx_n(const char *rel_img, const char *rel_lab, uint32_t n, int gz) {
    size_t li, ll;
    uint8_t *bi = idx_images(n, 28, 28, NULL, &li), *bl = idx_labels(n, NULL, &ll);
#ifdef DT_USE_ZLIB
    if (gz) { write_gz(rel_img, bi, li); write_gz(rel_lab, bl, ll); }
    else
#endif
    { (void)gz; write_file(rel_img, bi, li); write_file(rel_lab, bl, ll); }
    free(bi);
    free(bl);
}
static void test_mnist_dir(void) {
    dt_dataset ds;
    mkdir_rel("mnist");
    mkdir_rel("mnist-empty");
    mkdir_rel("mnist-nolab");
    write_idx_n("mnist/train-images-idx3-ubyte", "mnist/train-labels-idx1-ubyte", 3, 0);
#ifdef DT_USE_ZLIB
    write_idx_n("mnist/train-images-idx3-ubyte.gz", "mnist/train-labels-idx1-ubyte.gz", 2, 1);   /* raw preferred */
    write_idx_n("mnist/t10k-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz", 4, 1);
#else
    write_idx_n("mnist/t10k-images-idx3-ubyte", "mnist/t10k-labels-idx1-ubyte", 4, 0);
#endif
    CHECK_OK(dt_dataset_load_mnist_dir(&ds, tp("mnist"), 1));
    CHECK(ds.count == 3 && ds.c == 1 && ds.h == 28 && ds.w == 28 && ds.num_classes == 10);
    CHECK(strstr(ds.source, "train-images-idx3-ubyte") != NULL);
    dt_dataset_free(&ds);
    CHECK_OK(dt_dataset_load_mnist_dir(&ds, tp("mnist/"), 0));
    CHECK(ds.count == 4 && strstr(ds.source, "t10k-images-idx3-ubyte") != NULL && !strstr(ds.source, "//"));
    dt_dataset_free(&ds);
    CHECK(live_allocs == 0);
    EXPECT_FAIL(dt_dataset_load_mnist_dir(&ds, tp("mnist-empty"), 1), DT_ERR_IO, "mnist-empty/train-images-idx3-ubyte");
    CHECK_MSG("dataset-fashion-mnist");
    EXPECT_FAIL(dt_dataset_load_mnist_dir(&ds, tp("mnist-empty"), 0), DT_ERR_IO, "t10k-images-idx3-ubyte");
    write_idx_n("mnist-nolab/train-images-idx3-ubyte", "mnist-nolab/x", 3, 0);
    EXPECT_FAIL(dt_dataset_load_mnist_dir(&ds, tp("mnist-nolab"), 1), DT_ERR_IO, "train-labels-idx1-ubyte");
    CHECK_ERR(dt_dataset_load_mnist_dir(NULL, NULL, 1), DT_ERR_INVALID_ARG);
}

#define FASHION "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
static DT_T_UNUSED void test_fashion_mnist(void) {
    dt_dataset ds;
    int64_t hist[10] = {0}, i, bad = 0;
    int t;
    for (t = 1; t >= 0; t--) {
        int64_t want = t ? 60000 : 10000;
        bad = 0;
        CHECK_OK(dt_dataset_load_mnist_dir(&ds, NULL, t));
        CHECK(ds.count == want && ds.c == 1 && ds.h == 28 && ds.w == 28 && ds.num_classes == 10);
        if (!ds.labels || ds.count != want) { dt_dataset_free(&ds); continue; }
        memset(hist, 0, sizeof hist);
        for (i = 0; i < ds.count; i++) {
            if (ds.labels[i] < 0 || ds.labels[i] > 9) bad++;
            else hist[ds.labels[i]]++;
        }
        CHECK(bad == 0);
        for (i = 0; i < 10; i++) CHECK(hist[i] > want / 10 - want / 100 && hist[i] < want / 10 + want / 100);
        for (i = 0, bad = 0; i < 28 * 28; i++) bad += ds.pixels[i] != 0;
        CHECK(bad > 100);   /* the first image is not blank */
        dt_dataset_free(&ds);
    }
    CHECK(live_allocs == 0);
}

/* ---- CIFAR-10 ---- */
#define CREC 3073
static const int cifar_recs[5] = {3, 1, 2, 2, 4};
static uint8_t cifar_pix[16 * 3072];
static int32_t cifar_lab[16];

/* writes rel with n records starting at sample s0 of cifar_pix / cifar_lab */
static void write_cifar(const char *rel, int s0, int n) {
    uint8_t *b = (uint8_t *)malloc((size_t)n * CREC);
    int i;
    for (i = 0; i < n; i++) {
        b[i * CREC] = (uint8_t)cifar_lab[s0 + i];
        memcpy(b + i * CREC + 1, cifar_pix + (size_t)(s0 + i) * 3072, 3072);
    }
    write_file(rel, b, (size_t)n * CREC);
    free(b);
}
static void make_cifar_dir(const char *dir, int meta) {
    char rel[64];
    int f, s = 0;
    mkdir_rel(dir);
    for (f = 0; f < 5; f++) {
        snprintf(rel, sizeof rel, "%s/data_batch_%d.bin", dir, f + 1);
        write_cifar(rel, s, cifar_recs[f]);
        s += cifar_recs[f];
    }
    snprintf(rel, sizeof rel, "%s/test_batch.bin", dir);
    write_cifar(rel, 11, 5);
    if (meta) {
        static const char names[] = "airplane\nautomobile\r\nbird\n  cat \ndeer\n\ndog\nfrog\nhorse\nship\ntruck\n\n";
        snprintf(rel, sizeof rel, "%s/batches.meta.txt", dir);
        write_file(rel, names, sizeof names - 1);
    }
}
static void test_cifar10(void) {
    static const char *want[10] = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
    dt_dataset ds;
    int i;
    make_cifar_dir("cifar", 1);
    make_cifar_dir("cifar-nometa", 0);
    CHECK_OK(dt_dataset_load_cifar10(&ds, tp("cifar"), 1));
    CHECK(ds.count == 12 && ds.c == 3 && ds.h == 32 && ds.w == 32 && ds.num_classes == 10);
    if (ds.pixels && ds.labels && ds.count == 12) {
        CHECK(memcmp(ds.pixels, cifar_pix, 12 * 3072) == 0);
        CHECK(memcmp(ds.labels, cifar_lab, 12 * sizeof(int32_t)) == 0);
    }
    CHECK(ds.class_names != NULL);
    if (ds.class_names)
        for (i = 0; i < 10; i++) CHECK(ds.class_names[i] && strcmp(ds.class_names[i], want[i]) == 0);
    dt_dataset_free(&ds);
    CHECK_OK(dt_dataset_load_cifar10(&ds, tp("cifar-nometa"), 0));
    CHECK(ds.count == 5 && ds.class_names == NULL);
    if (ds.pixels && ds.labels && ds.count == 5) {
        CHECK(memcmp(ds.pixels, cifar_pix + 11 * 3072, 5 * 3072) == 0);
        CHECK(memcmp(ds.labels, cifar_lab + 11, 5 * sizeof(int32_t)) == 0);
    }
    dt_dataset_free(&ds);
    CHECK(live_allocs == 0);
}

static void test_cifar10_errors(void) {
    dt_dataset ds;
    uint8_t junk[100] = {0};
    memset(&ds, 0, sizeof ds);
    make_cifar_dir("cbad", 0);
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, NULL, 1), DT_ERR_INVALID_ARG, "dir");
    CHECK_ERR(dt_dataset_load_cifar10(NULL, tp("cbad"), 1), DT_ERR_INVALID_ARG);
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("no-such-dir"), 0), DT_ERR_IO, "no-such-dir/test_batch.bin");
    unlink(tp("cbad/data_batch_3.bin"));
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 1), DT_ERR_IO, "data_batch_3.bin");
    write_cifar("cbad/data_batch_3.bin", 4, 2);
    CHECK_OK(dt_dataset_load_cifar10(&ds, tp("cbad"), 1));
    dt_dataset_free(&ds);
    {   /* two records and 100 bytes: record 2 is truncated */
        FILE *fp = fopen(tp("cbad/data_batch_4.bin"), "ab");
        if (fp) { fwrite(junk, 1, sizeof junk, fp); fclose(fp); }
    }
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 1), DT_ERR_FORMAT, "data_batch_4.bin");
    CHECK_MSG("record 2");
    write_cifar("cbad/data_batch_4.bin", 6, 2);
    write_file("cbad/data_batch_5.bin", junk, 0);
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 1), DT_ERR_FORMAT, "data_batch_5.bin");
    write_cifar("cbad/data_batch_5.bin", 8, 4);
    cifar_lab[5] = 10;   /* record 1 of data_batch_2 (samples 3, 4) */
    cifar_lab[4] = 12;
    write_cifar("cbad/data_batch_2.bin", 3, 2);
    cifar_lab[5] = (5 * 7) % 10;
    cifar_lab[4] = (4 * 7) % 10;
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 1), DT_ERR_FORMAT, "data_batch_2.bin");
    CHECK_MSG("record 1 ");
    CHECK_MSG("label 12");
    write_cifar("cbad/data_batch_2.bin", 3, 2);
    write_file("cbad/batches.meta.txt", "a\nb\nc\nd\ne\nf\ng\nh\ni\n", 18);
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 1), DT_ERR_FORMAT, "batches.meta.txt");
    write_file("cbad/batches.meta.txt", "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n", 22);
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 1), DT_ERR_FORMAT, "batches.meta.txt");
    write_file("cbad/batches.meta.txt", "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\0k\n", 22);
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 1), DT_ERR_FORMAT, "batches.meta.txt");
    unlink(tp("cbad/test_batch.bin"));
    mkdir_rel("cbad/test_batch.bin");   /* a directory where a file should be */
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cbad"), 0), DT_ERR_IO, "test_batch.bin");
    write_file("cbad/batches.meta.txt", "a\nb\nc\nd\ne\nf\ng\nh\ni\nj", 19);
    CHECK_OK(dt_dataset_load_cifar10(&ds, tp("cbad"), 1));
    CHECK(ds.class_names && ds.class_names[9] && strcmp(ds.class_names[9], "j") == 0);
    dt_dataset_free(&ds);
    CHECK(live_allocs == 0);
}

/* A FIFO (or device) where a data file should be is refused at once, naming the path and what it is; opening
   it would block until a writer came. alarm() turns a regression (a hang) into a failure the runner sees. */
static void test_fifo_refused(void) {
    dt_dataset ds;
    memset(&ds, 0, sizeof ds);
    alarm(60);
    make_cifar_dir("cfifo", 0);
    unlink(tp("cfifo/test_batch.bin"));
    CHECK(mkfifo(tp("cfifo/test_batch.bin"), 0600) == 0);
    EXPECT_FAIL(dt_dataset_load_cifar10(&ds, tp("cfifo"), 0), DT_ERR_IO, "test_batch.bin");
    CHECK_MSG("not a regular file");
    write_idx_pair("fifo-img", "fifo-lab", 0);
    CHECK(mkfifo(tp("fifo-pipe"), 0600) == 0);
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("fifo-pipe"), tp("fifo-lab")), DT_ERR_IO, "fifo-pipe");
    CHECK_MSG("not a regular file");
    EXPECT_FAIL(dt_dataset_load_idx(&ds, tp("fifo-img"), tp("fifo-pipe")), DT_ERR_IO, "fifo-pipe");
    mkdir_rel("mfifo");   /* a data set directory whose training images are a FIFO */
    write_idx_pair("mfifo/train-images-idx3-ubyte", "mfifo/train-labels-idx1-ubyte", 0);
    unlink(tp("mfifo/train-images-idx3-ubyte"));
    CHECK(mkfifo(tp("mfifo/train-images-idx3-ubyte"), 0600) == 0);
    EXPECT_FAIL(dt_dataset_load_mnist_dir(&ds, tp("mfifo"), 1), DT_ERR_IO, "train-images-idx3-ubyte");
    CHECK_MSG("not a regular file");
    alarm(0);
}

static dt_result load_cifar(dt_dataset *ds, const void *arg) { return dt_dataset_load_cifar10(ds, tp((const char *)arg), 1); }
static void test_cifar10_out_of_memory(void) {
    make_cifar_dir("cifar-oom", 1);
    oom_sweep(load_cifar, "cifar-oom", "CIFAR-10 with names");
}

/* ---- image folders ---- */
#ifdef DT_USE_STB_IMAGE
#define FH 4
#define FW 6
/* a FH x FW RGB image whose pixels are a function of seed */
static void rgb_image(uint8_t *img, int seed) {
    int i;
    for (i = 0; i < FH * FW * 3; i++) img[i] = (uint8_t)(seed * 31 + i * 7);
}
static void write_png(const char *rel, int w, int h, int comp, const uint8_t *img) {
    if (!stbi_write_png(tp(rel), w, h, comp, img, w * comp)) { dt_t_checks_failed++; printf("    cannot write %s\n", tp(rel)); }
}
/* CHW sample `s` of ds equals the HWC image img (comp 3) */
static int sample_is(const dt_dataset *ds, int64_t s, const uint8_t *img) {
    int64_t c, i;
    if (!ds->pixels || s >= ds->count) return 0;
    for (c = 0; c < 3; c++)
        for (i = 0; i < FH * FW; i++)
            if (ds->pixels[(s * 3 + c) * FH * FW + i] != img[i * 3 + c]) return 0;
    return 1;
}

static void test_image_folder(void) {
    /* class names sorted byte-wise: "B" < "a" < "a_1" < "b"; files too: "10.png" < "2.png" < "Z.PNG" < "a.png" */
    static const char *classes[4] = {"b", "a", "B", "a_1"}, *sorted[4] = {"B", "a", "a_1", "b"};
    uint8_t img[FH * FW * 3], grey[FH * FW];
    dt_dataset ds;
    int k, i;
    char rel[64];
    mkdir_rel("folder");
    for (k = 0; k < 4; k++) {
        snprintf(rel, sizeof rel, "folder/%s", classes[k]);
        mkdir_rel(rel);
    }
    for (k = 0; k < 4; k++) {   /* one image per class, named after its class, seed = its position in sorted order */
        int pos = 0;
        while (strcmp(sorted[pos], classes[k]) != 0) pos++;
        rgb_image(img, 100 + pos);
        snprintf(rel, sizeof rel, "folder/%s/x.png", classes[k]);
        write_png(rel, FW, FH, 3, img);
    }
    /* class "a": more images, in an order the loader must sort, and things it must skip */
    rgb_image(img, 1); write_png("folder/a/2.png", FW, FH, 3, img);
    rgb_image(img, 2); write_png("folder/a/10.png", FW, FH, 3, img);
    rgb_image(img, 3); write_png("folder/a/Z.PNG", FW, FH, 3, img);
    rgb_image(img, 4); write_png("folder/a/.hidden.png", FW, FH, 3, img);
    for (i = 0; i < FH * FW; i++) grey[i] = (uint8_t)(i * 9);
    write_png("folder/a/g.png", FW, FH, 1, grey);           /* grey, loaded as RGB */
    write_file("folder/a/readme.txt", "not an image", 12);
    write_file("folder/a/png", "not an image", 12);
    write_file("folder/a/x.png.txt", "not an image", 12);
    mkdir_rel("folder/a/sub.png");                           /* a directory, even with an image name */
    write_png("folder/a/sub.png/y.png", FW, FH, 3, img);
    write_file("folder/notes.txt", "a file at the root is not a class", 33);
    mkdir_rel("folder/.cache");                              /* hidden: not a class */
    write_png("folder/.cache/z.png", FW, FH, 3, img);

    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("folder"), FH, FW, 3));
    CHECK(ds.count == 8 && ds.c == 3 && ds.h == FH && ds.w == FW && ds.num_classes == 4);
    CHECK(strstr(ds.source, "folder") != NULL);
    if (ds.class_names && ds.num_classes == 4)
        for (k = 0; k < 4; k++) CHECK(ds.class_names[k] && strcmp(ds.class_names[k], sorted[k]) == 0);
    else CHECK(ds.class_names != NULL);
    if (ds.labels && ds.count == 8) {
        static const int32_t want[8] = {0, 1, 1, 1, 1, 1, 2, 3};
        for (i = 0; i < 8; i++) CHECK(ds.labels[i] == want[i]);
        /* sample order: B/x, a/10, a/2, a/Z.PNG, a/g, a/x, a_1/x, b/x */
        rgb_image(img, 100); CHECK(sample_is(&ds, 0, img));
        rgb_image(img, 2);   CHECK(sample_is(&ds, 1, img));
        rgb_image(img, 1);   CHECK(sample_is(&ds, 2, img));
        rgb_image(img, 3);   CHECK(sample_is(&ds, 3, img));
        for (i = 0; i < FH * FW; i++) img[3 * i] = img[3 * i + 1] = img[3 * i + 2] = grey[i];
        CHECK(sample_is(&ds, 4, img));
        rgb_image(img, 101); CHECK(sample_is(&ds, 5, img));
        rgb_image(img, 102); CHECK(sample_is(&ds, 6, img));
        rgb_image(img, 103); CHECK(sample_is(&ds, 7, img));
    }
    dt_dataset_free(&ds);
    CHECK(live_allocs == 0);
    /* channels 0 means 3 */
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("folder/"), FH, FW, 0));
    CHECK(ds.count == 8 && ds.c == 3);
    rgb_image(img, 100);
    CHECK(sample_is(&ds, 0, img));
    dt_dataset_free(&ds);
    /* channels 1: stb_image's luma, (77 r + 150 g + 29 b) >> 8 */
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("folder"), FH, FW, 1));
    CHECK(ds.count == 8 && ds.c == 1);
    if (ds.pixels && ds.count == 8) {
        int ok = 1;
        rgb_image(img, 100);
        for (i = 0; i < FH * FW; i++)
            ok &= ds.pixels[i] == (uint8_t)((77 * img[3 * i] + 150 * img[3 * i + 1] + 29 * img[3 * i + 2]) >> 8);
        CHECK(ok);
        for (i = 0; i < FH * FW; i++) ok &= ds.pixels[4 * FH * FW + i] == grey[i];
        CHECK(ok);
    }
    dt_dataset_free(&ds);
    CHECK(live_allocs == 0);
}

/* What has an image's name in a class but is no image file is skipped with one warning per kind, giving the
   count and the first one: directories, dangling symbolic links, FIFOs. */
static char skip_log[4][512];
static int skip_lines;
static void skip_sink(void *user, int level, const char *msg) {
    (void)user;
    if (level == DT_LOG_WARN && skip_lines < 4) snprintf(skip_log[skip_lines], sizeof skip_log[0], "%s", msg);
    if (level == DT_LOG_WARN) skip_lines++;
}
static void test_image_folder_skips(void) {
    uint8_t img[FH * FW * 3];
    dt_dataset ds;
    int k, dirs = -1, links = -1, fifos = -1;
    rgb_image(img, 5);
    mkdir_rel("skips");
    mkdir_rel("skips/c");
    write_png("skips/c/ok.png", FW, FH, 3, img);
    mkdir_rel("skips/c/d1.png");
    mkdir_rel("skips/c/d2.jpg");
    CHECK(symlink(tp("skips/c/gone.png"), tp("skips/c/l.png")) == 0);   /* dangling */
    CHECK(mkfifo(tp("skips/c/f.png"), 0600) == 0);
    skip_lines = 0;
    dt_log_configure(skip_sink, NULL, DT_LOG_INFO);
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("skips"), FH, FW, 3));
    dt_log_configure(NULL, NULL, DT_LOG_INFO);
    CHECK(ds.count == 1);
    dt_dataset_free(&ds);
    CHECK(skip_lines == 3);
    for (k = 0; k < 3 && k < skip_lines; k++) {
        CHECK(strstr(skip_log[k], tp("skips")) != NULL);
        if (strstr(skip_log[k], "skipped 2 directories") && strstr(skip_log[k], "skips/c/d")) dirs = k;
        if (strstr(skip_log[k], "skipped 1 entries") && strstr(skip_log[k], "dangling") && strstr(skip_log[k], "skips/c/l.png")) links = k;
        if (strstr(skip_log[k], "skipped 1 entries") && strstr(skip_log[k], "FIFO") && strstr(skip_log[k], "skips/c/f.png")) fifos = k;
    }
    CHECK(dirs >= 0 && links >= 0 && fifos >= 0);
    if (dirs < 0 || links < 0 || fifos < 0)
        for (k = 0; k < 4 && k < skip_lines; k++) printf("    warning: %s\n", skip_log[k]);
    CHECK(live_allocs == 0);
}

/* JPEG (lossy: close), resizing (shape; a uniform colour stays exactly that colour) */
static void test_image_folder_jpeg_resize(void) {
    enum { JW = 32, JH = 24 };
    uint8_t jp[JH * JW * 3], flat[7 * 5 * 3];
    dt_dataset ds;
    int i, c;
    mkdir_rel("jpeg");
    mkdir_rel("jpeg/c");
    for (i = 0; i < JH * JW; i++) {   /* smooth gradients: JPEG keeps them well */
        jp[3 * i] = (uint8_t)(40 + 4 * (i % JW));
        jp[3 * i + 1] = (uint8_t)(30 + 6 * (i / JW));
        jp[3 * i + 2] = 128;
    }
    if (!stbi_write_jpg(tp("jpeg/c/p.jpg"), JW, JH, 3, jp, 95)) { dt_t_checks_failed++; printf("    cannot write a JPEG\n"); }
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("jpeg"), JH, JW, 3));
    CHECK(ds.count == 1 && ds.c == 3 && ds.h == JH && ds.w == JW);
    if (ds.pixels && ds.count == 1) {
        double sum = 0;
        int worst = 0;
        for (c = 0; c < 3; c++)
            for (i = 0; i < JH * JW; i++) {
                int d = abs((int)ds.pixels[c * JH * JW + i] - (int)jp[3 * i + c]);
                sum += d;
                if (d > worst) worst = d;
            }
        CHECK(sum / (3 * JH * JW) < 3.0 && worst < 24);
    }
    dt_dataset_free(&ds);

    mkdir_rel("flat");
    mkdir_rel("flat/c");
    for (i = 0; i < 7 * 5; i++) { flat[3 * i] = 10; flat[3 * i + 1] = 200; flat[3 * i + 2] = 255; }
    write_png("flat/c/f.png", 7, 5, 3, flat);
    rgb_image(jp, 5);
    write_png("flat/c/g.bmp.png", FW, FH, 3, jp);
    {
        static const int64_t sizes[3][2] = {{3, 4}, {11, 13}, {1, 1}};   /* down, up, to one pixel */
        int s;
        for (s = 0; s < 3; s++) {
            int64_t h = sizes[s][0], w = sizes[s][1], n = h * w;
            CHECK_OK(dt_dataset_load_image_folder(&ds, tp("flat"), h, w, 3));
            CHECK(ds.count == 2 && ds.c == 3 && ds.h == h && ds.w == w);
            if (ds.pixels && ds.count == 2) {
                int ok = 1;
                for (i = 0; i < n; i++) ok &= ds.pixels[i] == 10 && ds.pixels[n + i] == 200 && ds.pixels[2 * n + i] == 255;
                CHECK(ok);
            }
            dt_dataset_free(&ds);
        }
    }
    CHECK(live_allocs == 0);
}

/* Loads root "fmt" holding the one image fmt/c/<name> with the given bytes, as 2x3 with ch channels. */
static dt_result load_one(const char *name, const void *bytes, size_t n, int64_t ch, dt_dataset *ds) {
    char rel[64];
    dt_result r;
    snprintf(rel, sizeof rel, "fmt/c/%s", name);
    write_file(rel, bytes, n);
    r = dt_dataset_load_image_folder(ds, tp("fmt"), 2, 3, ch);
    unlink(tp(rel));
    return r;
}
/* PGM/PPM (decoded by dtrain), BMP, PNG with alpha: exact values */
static void test_image_folder_formats(void) {
    static const uint8_t ppm[] = "P6\n# a comment\n3 2\n255\n"
        "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\xff";
    static const uint8_t pgm16[] = "P5 3 2 65535 \x12\x34\xab\xcd\xff\xff\x00\x00\x00\xff\x80\x00";
    static const uint8_t pgm15[] = "P5\n3\n2\n15\n\x00\x01\x07\x08\x0f\x0e";
    uint8_t img[2 * 3 * 4];
    dt_dataset ds;
    int i, c, ok;
    mkdir_rel("fmt");
    mkdir_rel("fmt/c");
    CHECK_OK(load_one("a.ppm", ppm, sizeof ppm - 1, 3, &ds));
    if (ds.pixels && ds.count == 1) {
        for (ok = 1, c = 0; c < 3; c++)
            for (i = 0; i < 6; i++) ok &= ds.pixels[c * 6 + i] == ppm[sizeof ppm - 1 - 18 + 3 * i + c];
        CHECK(ok);
    }
    dt_dataset_free(&ds);
    CHECK_OK(load_one("a.pgm", pgm16, sizeof pgm16 - 1, 1, &ds));   /* 16-bit, big-endian: scaled to 0..255 */
    if (ds.pixels && ds.count == 1) {
        static const uint8_t want[6] = {0x12, 0xab, 0xff, 0x00, 0x01, 0x80};   /* 0x00ff * 255 / 65535 rounds to 1 */
        for (i = 0; i < 6; i++) CHECK(ds.pixels[i] == want[i]);
    }
    dt_dataset_free(&ds);
    CHECK_OK(load_one("b.pgm", pgm15, sizeof pgm15 - 1, 3, &ds));   /* maxval 15 is white */
    if (ds.pixels && ds.count == 1) {
        static const uint8_t want[6] = {0, 17, 119, 136, 255, 238};
        for (ok = 1, c = 0; c < 3; c++)
            for (i = 0; i < 6; i++) ok &= ds.pixels[c * 6 + i] == want[i];
        CHECK(ok);
    }
    dt_dataset_free(&ds);
    for (i = 0; i < 24; i++) img[i] = (uint8_t)(i * 11 + 3);
    /* RGBA and grey + alpha PNG (alpha dropped), BMP */
    write_png("fmt/c/rgba.png", 3, 2, 4, img);
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("fmt"), 2, 3, 3));
    if (ds.pixels && ds.count == 1) {
        for (ok = 1, c = 0; c < 3; c++)
            for (i = 0; i < 6; i++) ok &= ds.pixels[c * 6 + i] == img[4 * i + c];
        CHECK(ok);
    }
    dt_dataset_free(&ds);
    unlink(tp("fmt/c/rgba.png"));
    write_png("fmt/c/ga.png", 3, 2, 2, img);
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("fmt"), 2, 3, 3));
    if (ds.pixels && ds.count == 1) {
        for (ok = 1, c = 0; c < 3; c++)
            for (i = 0; i < 6; i++) ok &= ds.pixels[c * 6 + i] == img[2 * i];
        CHECK(ok);
    }
    dt_dataset_free(&ds);
    unlink(tp("fmt/c/ga.png"));
    if (!stbi_write_bmp(tp("fmt/c/x.bmp"), 3, 2, 3, img)) { dt_t_checks_failed++; printf("    cannot write a BMP\n"); }
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("fmt"), 2, 3, 3));
    if (ds.pixels && ds.count == 1) {
        for (ok = 1, c = 0; c < 3; c++)
            for (i = 0; i < 6; i++) ok &= ds.pixels[c * 6 + i] == img[3 * i + c];
        CHECK(ok);
    }
    dt_dataset_free(&ds);
    unlink(tp("fmt/c/x.bmp"));
    /* bad PGM/PPM: truncated, a header number too large, no maxval, maxval 0 */
    EXPECT_FAIL(load_one("cut.ppm", ppm, sizeof ppm - 2, 3, &ds), DT_ERR_FORMAT, "cut.ppm");
    CHECK_MSG("truncated");
    EXPECT_FAIL(load_one("big.pgm", "P5 99999999999 1 255 x", 22, 3, &ds), DT_ERR_FORMAT, "big.pgm");
    EXPECT_FAIL(load_one("nomax.pgm", "P5 3 2", 6, 3, &ds), DT_ERR_FORMAT, "nomax.pgm");
    EXPECT_FAIL(load_one("zero.pgm", "P5 3 2 0\n123456", 15, 3, &ds), DT_ERR_FORMAT, "zero.pgm");
    EXPECT_FAIL(load_one("huge.pgm", "P5 5000 5000 255\n1", 19, 3, &ds), DT_ERR_FORMAT, "DT_IMAGE_MAX_PIXELS");
    EXPECT_FAIL(load_one("text.pgm", "P2 1 1 255 7\n", 13, 3, &ds), DT_ERR_FORMAT, "text.pgm");
    CHECK(live_allocs == 0);
}

static void test_image_folder_errors(void) {
    dt_dataset ds;
    uint8_t img[FH * FW * 3], *png;
    size_t n = 0;
    memset(&ds, 0, sizeof ds);
    rgb_image(img, 9);
    mkdir_rel("bad");
    mkdir_rel("bad/c");
    write_png("bad/c/ok.png", FW, FH, 3, img);
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("no-such-root"), FH, FW, 3), DT_ERR_IO, "no-such-root");
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, NULL, FH, FW, 3), DT_ERR_INVALID_ARG, "root");
    CHECK_ERR(dt_dataset_load_image_folder(NULL, tp("bad"), FH, FW, 3), DT_ERR_INVALID_ARG);
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), 0, FW, 3), DT_ERR_INVALID_ARG, "bad");
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, -2, 3), DT_ERR_INVALID_ARG, "bad");
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 2), DT_ERR_INVALID_ARG, "channels");
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), 100, 100, 3), DT_ERR_INVALID_ARG, "DT_IMAGE_MAX_PIXELS");
    /* no classes: an empty root, a root of files and hidden directories */
    mkdir_rel("noclass");
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("noclass"), FH, FW, 3), DT_ERR_FORMAT, "noclass");
    write_png("noclass/i.png", FW, FH, 3, img);
    mkdir_rel("noclass/.git");
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("noclass"), FH, FW, 3), DT_ERR_FORMAT, "noclass");
    /* a class without images */
    mkdir_rel("bad/empty");
    write_file("bad/empty/list.txt", "x", 1);
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "bad/empty");
    unlink(tp("bad/empty/list.txt"));
    rmdir(tp("bad/empty"));
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3));
    dt_dataset_free(&ds);
    /* undecodable images: each named in the message */
    write_file("bad/c/junk.png", "this is not a PNG file at all", 29);
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "junk.png");
    unlink(tp("bad/c/junk.png"));
    png = read_file("bad/c/ok.png", &n);
    CHECK(png && n > 40);
    if (png && n > 40) {
        write_file("bad/c/cut.png", png, n / 2);                 /* a truncated PNG */
        EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "cut.png");
        CHECK_MSG("stb_image");
        unlink(tp("bad/c/cut.png"));
        {   /* the IDAT chunk claims more than the file holds */
            size_t pos = 8;
            while (pos + 8 <= n && memcmp(png + pos + 4, "IDAT", 4) != 0)
                pos += 12 + (((size_t)png[pos] << 24) | ((size_t)png[pos + 1] << 16) | ((size_t)png[pos + 2] << 8) | png[pos + 3]);
            CHECK(pos + 8 <= n);
            if (pos + 8 <= n) {
                uint8_t save[4];
                memcpy(save, png + pos, 4);
                put_be32(png + pos, 0x7ffffff0u);
                write_file("bad/c/claim.png", png, n);
                EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "claim.png");
                CHECK_MSG("PNG chunk");
                unlink(tp("bad/c/claim.png"));
                memcpy(png + pos, save, 4);
            }
        }
        memset(png + 16, 0xee, 13);                              /* a PNG whose header chunk is garbage */
        write_file("bad/c/garbage.PNG", png, n);
        EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "garbage.PNG");
        CHECK_MSG("stb_image");
        unlink(tp("bad/c/garbage.PNG"));
    }
    free(png);
    {   /* JPEG scans that use tables never defined (stb_image 2.27 would read uninitialised memory) */
        size_t i, sos = 0, sof = 0;
        uint8_t *jpg;
        if (!stbi_write_jpg(tp("bad/c/j.jpg"), FW, FH, 3, img, 90)) { dt_t_checks_failed++; printf("    cannot write a JPEG\n"); }
        CHECK_OK(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3));
        dt_dataset_free(&ds);
        jpg = read_file("bad/c/j.jpg", &n);
        for (i = 0; jpg && i + 1 < n; i++) {
            if (jpg[i] == 0xff && jpg[i + 1] == 0xda && !sos) sos = i;
            if (jpg[i] == 0xff && jpg[i + 1] == 0xc0 && !sof) sof = i;
        }
        CHECK(sos > 0 && sof > 0);
        if (sos > 0 && sof > 0) {
            uint8_t keep = jpg[sos + 6];
            jpg[sos + 6] = 0x33;                             /* component 1: DC and AC table 3 */
            write_file("bad/c/j.jpg", jpg, n);
            EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "j.jpg");
            CHECK_MSG("Huffman");
            jpg[sos + 6] = keep;
            jpg[sof + 12] = 3;                               /* component 1: quantisation table 3 */
            write_file("bad/c/j.jpg", jpg, n);
            EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "j.jpg");
            CHECK_MSG("quantisation");
        }
        free(jpg);
        unlink(tp("bad/c/j.jpg"));
    }
    write_file("bad/c/e.jpg", "", 0);
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "e.jpg");
    unlink(tp("bad/c/e.jpg"));
    write_file("bad/c/t.tiff", "II*\0\x08\0\0\0\0\0", 10);
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "t.tiff");
    CHECK_MSG("TIFF");
    unlink(tp("bad/c/t.tiff"));
    write_file("bad/c/w.webp", "RIFF\x10\0\0\0WEBPVP8 ", 16);
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "w.webp");
    unlink(tp("bad/c/w.webp"));
    write_file("bad/c/g.jpg", "GIF89a\x01\0\x01\0\0\0\0;", 14);   /* a GIF, whatever its name */
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "g.jpg");
    unlink(tp("bad/c/g.jpg"));
    {   /* larger than DT_IMAGE_MAX_PIXELS (4096 in this test) */
        uint8_t *big = (uint8_t *)calloc(100 * 50, 1);
        write_png("bad/c/big.png", 100, 50, 1, big);
        free(big);
    }
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, "big.png");
    CHECK_MSG("DT_IMAGE_MAX_PIXELS");
    unlink(tp("bad/c/big.png"));
    {   /* a header that claims 100000 x 100000 pixels (60000 x 60000 in a JPEG), beyond stb_image's own limits too:
           the same message, from the header, not stb_image's "unknown image type" */
        static const char *const names[3] = {"bad/c/claim.png", "bad/c/claim.bmp", "bad/c/claim.jpg"};
        uint8_t *b;
        size_t i;
        int k;
        if (!stbi_write_png(tp(names[0]), FW, FH, 3, img, FW * 3) || !stbi_write_bmp(tp(names[1]), FW, FH, 3, img) ||
            !stbi_write_jpg(tp(names[2]), FW, FH, 3, img, 90)) { dt_t_checks_failed++; printf("    cannot write the images\n"); }
        for (k = 0; k < 3; k++) {
            b = read_file(names[k], &n);
            CHECK(b && n > 30);
            if (!b || n <= 30) { free(b); continue; }
            if (k == 0) { put_be32(b + 16, 100000); put_be32(b + 20, 100000); }   /* IHDR's width and height */
            if (k == 1) { b[18] = 0xa0; b[19] = 0x86; b[20] = 0x01; b[22] = 0xa0; b[23] = 0x86; b[24] = 0x01; }   /* 100000, LE */
            for (i = 2; k == 2 && i + 8 < n; i++)   /* the frame header (SOF0): height, then width, big-endian */
                if (b[i] == 0xff && b[i + 1] == 0xc0) { b[i + 5] = b[i + 7] = 0xea; b[i + 6] = b[i + 8] = 0x60; break; }
            write_file(names[k], b, n);
            free(b);
            EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3), DT_ERR_FORMAT, names[k] + 6);
            CHECK_MSG(k == 2 ? "is 60000x60000 pixels, more than DT_IMAGE_MAX_PIXELS" : "is 100000x100000 pixels, more than DT_IMAGE_MAX_PIXELS");
            unlink(tp(names[k]));
        }
    }
    CHECK_OK(dt_dataset_load_image_folder(&ds, tp("bad"), FH, FW, 3));
    dt_dataset_free(&ds);
    CHECK(live_allocs == 0);
}

static dt_result load_folder(dt_dataset *ds, const void *arg) { return dt_dataset_load_image_folder(ds, tp((const char *)arg), 3, 5, 3); }
static void test_image_folder_out_of_memory(void) {
    uint8_t img[FH * FW * 3];
    int k;
    mkdir_rel("folder-oom");
    for (k = 0; k < 3; k++) {
        static const char *cls[3] = {"folder-oom/x", "folder-oom/y", "folder-oom/z"};
        char rel[64];
        mkdir_rel(cls[k]);
        rgb_image(img, k);
        snprintf(rel, sizeof rel, "%s/1.png", cls[k]);
        write_png(rel, FW, FH, 3, img);
        snprintf(rel, sizeof rel, "%s/2.png", cls[k]);
        write_png(rel, FW, FH, k == 2 ? 1 : 3, img);   /* a grey one: converted to RGB */
    }
    write_file("folder-oom/z/3.ppm", "P6 1 1 255 abc", 14);
    oom_sweep(load_folder, "folder-oom", "image folder");
}
#else
static void test_image_folder_unsupported(void) {
    dt_dataset ds;
    mkdir_rel("folder");
    EXPECT_FAIL(dt_dataset_load_image_folder(&ds, tp("folder"), 4, 4, 3), DT_ERR_UNSUPPORTED, "folder");
    CHECK_MSG("DT_USE_STB_IMAGE");
    CHECK_MSG("libstb-dev");
    CHECK_MSG("STB_DIR");
}
#endif

int main(int argc, char **argv) {
    int rc;
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_datasets\n");
    strcpy(tmp_root, "/tmp/dt_test_datasets_XXXXXX");
    if (!mkdtemp(tmp_root)) { printf("cannot create a temporary directory under /tmp\n0 passed, 1 failed\n"); return 1; }
    {   /* the data the IDX and CIFAR-10 files are written from */
        int i;
        for (i = 0; i < (int)sizeof idx_pix; i++) idx_pix[i] = rnd8();
        for (i = 0; i < 16 * 3072; i++) cifar_pix[i] = rnd8();
        for (i = 0; i < 16; i++) cifar_lab[i] = (i * 7) % 10;
    }
    RUN(test_idx_raw);
    RUN(test_pad);
#ifdef DT_USE_ZLIB
    RUN(test_idx_gzip);
#else
    RUN(test_idx_gzip_unsupported);
#endif
    RUN(test_idx_errors);
    RUN(test_idx_out_of_memory);
    RUN(test_mnist_dir);
    {
        FILE *fp = fopen(FASHION, "rb");
#ifdef DT_USE_ZLIB
        if (fp) { fclose(fp); RUN(test_fashion_mnist); }
        else printf("skipped test_fashion_mnist: %s is absent (apt-get install dataset-fashion-mnist)\n", FASHION);
#else
        if (fp) fclose(fp);
        printf("skipped test_fashion_mnist: built without DT_USE_ZLIB\n");
#endif
    }
    RUN(test_cifar10);
    RUN(test_cifar10_errors);
    RUN(test_fifo_refused);
    RUN(test_cifar10_out_of_memory);
#ifdef DT_USE_STB_IMAGE
    RUN(test_image_folder);
    RUN(test_image_folder_skips);
    RUN(test_image_folder_jpeg_resize);
    RUN(test_image_folder_formats);
    RUN(test_image_folder_errors);
    RUN(test_image_folder_out_of_memory);
#else
    RUN(test_image_folder_unsupported);
#endif
    rc = dt_t_summary();
    dt_t_rm_rf(tmp_root);
    return rc;
}
