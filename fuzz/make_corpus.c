/* make_corpus.c - writes the fuzz targets' seed inputs (small valid files of each kind) into
   fuzz/corpus/<target>/. Not a fuzz target itself; rebuild the seeds with
       cc -std=c11 fuzz/make_corpus.c -o /tmp/make_corpus -lstb -lz && /tmp/make_corpus fuzz/corpus */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <zlib.h>
#include <stb/stb_image_write.h>

typedef struct buf { uint8_t d[8192]; size_t n; } buf;
static const char *root;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > sizeof b->d) { fprintf(stderr, "seed too large\n"); exit(1); }
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void put8(buf *b, unsigned v) { uint8_t c = (uint8_t)v; put(b, &c, 1); }
static void put32be(buf *b, uint32_t v) { put8(b, v >> 24); put8(b, v >> 16); put8(b, v >> 8); put8(b, v); }
static void save(const char *target, const char *name, const buf *b) {
    char p[512];
    FILE *fp;
    snprintf(p, sizeof p, "%s/%s", root, target);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/%s", root, target, name);
    if (!(fp = fopen(p, "wb")) || fwrite(b->d, 1, b->n, fp) != b->n) { perror(p); exit(1); }
    fclose(fp);
}
/* b's bytes as a gzip stream */
static buf gzip(const buf *b) {
    buf out;
    z_stream s;
    memset(&s, 0, sizeof s);
    memset(&out, 0, sizeof out);
    if (deflateInit2(&s, 9, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK) exit(1);
    s.next_in = (Bytef *)b->d;
    s.avail_in = (uInt)b->n;
    s.next_out = out.d;
    s.avail_out = sizeof out.d;
    if (deflate(&s, Z_FINISH) != Z_STREAM_END) exit(1);
    out.n = sizeof out.d - s.avail_out;
    deflateEnd(&s);
    return out;
}
static buf idx_images(uint32_t n, uint32_t h, uint32_t w) {
    buf b;
    uint32_t i;
    b.n = 0;
    put32be(&b, 0x803); put32be(&b, n); put32be(&b, h); put32be(&b, w);
    for (i = 0; i < n * h * w; i++) put8(&b, i * 37);
    return b;
}
static buf idx_labels(uint32_t n) {
    buf b;
    uint32_t i;
    b.n = 0;
    put32be(&b, 0x801); put32be(&b, n);
    for (i = 0; i < n; i++) put8(&b, i % 10);
    return b;
}
/* fuzz_idx input: 2-byte length of the images file, the images file, the labels file */
static void idx_seed(const char *name, const buf *img, const buf *lab) {
    buf b;
    b.n = 0;
    put8(&b, img->n >> 8); put8(&b, img->n);
    put(&b, img->d, img->n);
    put(&b, lab->d, lab->n);
    save("fuzz_idx", name, &b);
}

static void to_buf(void *ctx, void *data, int size) { put((buf *)ctx, data, (size_t)size); }
/* fuzz_image input: a parameter byte, then the image file */
static void image_seed(const char *name, unsigned param, const buf *img) {
    buf b;
    b.n = 0;
    put8(&b, param);
    put(&b, img->d, img->n);
    save("fuzz_image", name, &b);
}

int main(int argc, char **argv) {
    buf img, lab, gi, gl, b;
    uint8_t px[16 * 16 * 4];
    int i;
    if (argc != 2) { fprintf(stderr, "usage: make_corpus fuzz/corpus\n"); return 2; }
    root = argv[1];
    mkdir(root, 0755);

    img = idx_images(2, 3, 4); lab = idx_labels(2);
    gi = gzip(&img); gl = gzip(&lab);
    idx_seed("raw", &img, &lab);
    idx_seed("gzip", &gi, &gl);
    idx_seed("gzip-images", &gi, &lab);
    img = idx_images(1, 1, 1); lab = idx_labels(1);
    idx_seed("one", &img, &lab);
    img = idx_images(12, 8, 8); lab = idx_labels(12);
    gi = gzip(&img); gl = gzip(&lab);
    idx_seed("gzip-12", &gi, &gl);

    b.n = 0;   /* fuzz_cifar: meta length, batches.meta.txt, test_batch.bin */
    {
        static const char meta[] = "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n";
        put8(&b, sizeof meta - 1);
        put(&b, meta, sizeof meta - 1);
        put8(&b, 7);
        for (i = 0; i < 3072; i++) put8(&b, i * 13);
        save("fuzz_cifar", "meta", &b);
        b.n = 0;
        put8(&b, 0);
        put8(&b, 3);
        for (i = 0; i < 3072; i++) put8(&b, i);
        save("fuzz_cifar", "plain", &b);
    }

    for (i = 0; i < (int)sizeof px; i++) px[i] = (uint8_t)(i * 29 + (i >> 4));
    b.n = 0; stbi_write_png_to_func(to_buf, &b, 4, 4, 3, px, 12);   image_seed("rgb.png", 0x36, &b);
    b.n = 0; stbi_write_png_to_func(to_buf, &b, 3, 2, 1, px, 3);    image_seed("grey.png", 0x13, &b);
    b.n = 0; stbi_write_png_to_func(to_buf, &b, 5, 3, 4, px, 20);   image_seed("rgba.png", 0x24, &b);
    b.n = 0; stbi_write_png_to_func(to_buf, &b, 2, 2, 2, px, 4);    image_seed("grey-alpha.png", 0x75, &b);
    b.n = 0; stbi_write_jpg_to_func(to_buf, &b, 16, 16, 3, px, 90); image_seed("rgb.jpg", 0x7e, &b);
    b.n = 0; stbi_write_jpg_to_func(to_buf, &b, 8, 8, 1, px, 50);   image_seed("grey.jpg", 0x0f, &b);
    b.n = 0; stbi_write_bmp_to_func(to_buf, &b, 4, 3, 3, px);       image_seed("rgb.bmp", 0x34, &b);
    b.n = 0; stbi_write_bmp_to_func(to_buf, &b, 3, 3, 4, px);       image_seed("rgba.bmp", 0x25, &b);
    b.n = 0; put(&b, "P6\n3 2\n255\n", 11); put(&b, px, 18);        image_seed("rgb.ppm", 0x22, &b);
    b.n = 0; put(&b, "P5\n2 2\n255\n", 11); put(&b, px, 4);         image_seed("grey.pgm", 0x13, &b);
    b.n = 0; put(&b, "P5\n2 2\n65535\n", 13); put(&b, px, 8);       image_seed("grey16.pgm", 0x12, &b);
    return 0;
}
