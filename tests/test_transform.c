/* Per-batch conversion of uint8 samples: normalisation, random crop with zero padding, horizontal flip;
   deterministic for (seed, epoch, sample). */
#include "../dtrain.h"
#include "dt_test.h"

#define C 3
#define H 4
#define W 5
static uint8_t pix[6 * C * H * W];
static int32_t lab[6] = {0, 1, 2, 0, 1, 2};

static dt_dataset make_ds(void) {
    dt_dataset ds;
    int i;
    memset(&ds, 0, sizeof ds);
    for (i = 0; i < 6 * C * H * W; i++) pix[i] = (uint8_t)(1 + (i * 37) % 254);   /* never 0: padding is visible */
    ds.count = 6; ds.c = C; ds.h = H; ds.w = W; ds.num_classes = 3; ds.pixels = pix; ds.labels = lab;
    return ds;
}

/* dt_dataset_batch with its desc's fields in argument order. */
static dt_result batch(const dt_dataset *ds, const int64_t *idx, int64_t n, const dt_transform *t, uint64_t seed,
                       uint64_t epoch, float *x, int32_t *y) {
    dt_batch_desc d;
    memset(&d, 0, sizeof d);
    d.indices = idx; d.count = n; d.transform = t; d.seed = seed; d.epoch = epoch;
    return dt_dataset_batch(ds, &d, x, y);
}

static void test_plain_and_normalise(void) {
    dt_dataset ds = make_ds();
    int64_t idx[2] = {4, 1}, i;
    float x[2 * C * H * W];
    int32_t y[2];
    dt_transform t;
    CHECK_OK(batch(&ds, idx, 2, NULL, 0, 0, x, y));
    CHECK(y[0] == 1 && y[1] == 1);
    for (i = 0; i < C * H * W; i++) CHECK(fabsf(x[i] - pix[4 * C * H * W + i] / 255.0f) < 1e-6f);
    memset(&t, 0, sizeof t);
    t.mean[0] = 0.5f; t.mean[1] = 0.25f; t.mean[2] = 0.0f; t.std[0] = 0.5f; t.std[1] = 2.0f; t.std[2] = 0.0f;
    CHECK_OK(batch(&ds, idx, 2, &t, 0, 0, x, y));
    for (i = 0; i < C * H * W; i++) {
        int c = (int)(i / (H * W));
        float p = pix[4 * C * H * W + i] / 255.0f, want = c == 0 ? (p - 0.5f) / 0.5f : c == 1 ? (p - 0.25f) / 2.0f : p;
        CHECK(fabsf(x[i] - want) < 1e-5f);
    }
}

/* Every output pixel of a cropped, flipped sample is its source pixel at one common shift (or padding). */
static void test_crop_flip(void) {
    dt_dataset ds = make_ds();
    int64_t idx[6] = {0, 1, 2, 3, 4, 5}, s, shifts_seen = 0, flips = 0;
    float x[6 * C * H * W], x2[6 * C * H * W], x3[6 * C * H * W];
    int32_t y[6];
    dt_transform t;
    memset(&t, 0, sizeof t);
    t.crop_pad = 2; t.flip = 1;
    CHECK_OK(batch(&ds, idx, 6, &t, 9, 3, x, y));
    CHECK_OK(batch(&ds, idx, 6, &t, 9, 3, x2, y));
    CHECK(memcmp(x, x2, sizeof x) == 0);                       /* same (seed, epoch): same result */
    {   /* one sample alone converts as it did inside the batch */
        int64_t one = 4;
        CHECK_OK(batch(&ds, &one, 1, &t, 9, 3, x3, y));
        CHECK(memcmp(x3, x + 4 * C * H * W, sizeof(float) * C * H * W) == 0);
    }
    for (s = 0; s < 6; s++) {
        int found = 0, dy, dx, f;
        const float *o = x + s * C * H * W;
        const uint8_t *p = pix + s * C * H * W;
        for (f = 0; f < 2 && !found; f++)
            for (dy = -2; dy <= 2 && !found; dy++)
                for (dx = -2; dx <= 2 && !found; dx++) {
                    int ok = 1, c, r, q;
                    for (c = 0; c < C && ok; c++)
                        for (r = 0; r < H && ok; r++)
                            for (q = 0; q < W && ok; q++) {
                                int sr = r + dy, sq = (f ? W - 1 - q : q) + dx;
                                float want = (sr >= 0 && sr < H && sq >= 0 && sq < W) ? p[c * H * W + sr * W + sq] / 255.0f : 0.0f;
                                ok = fabsf(o[c * H * W + r * W + q] - want) < 1e-6f;
                            }
                    if (ok) { found = 1; shifts_seen += dy != 0 || dx != 0; flips += f; }
                }
        CHECK(found);
    }
    CHECK(shifts_seen >= 3 && flips >= 1);
    {   /* over many epochs both flip outcomes and every shift occur */
        int e, seen_flip = 0, seen_plain = 0;
        for (e = 0; e < 40; e++) {
            int64_t one = 0;
            dt_transform tf;
            memset(&tf, 0, sizeof tf);
            tf.flip = 1;
            CHECK_OK(batch(&ds, &one, 1, &tf, 9, (uint64_t)e, x3, y));
            if (fabsf(x3[0] - pix[0] / 255.0f) < 1e-6f) seen_plain++;
            else if (fabsf(x3[0] - pix[W - 1] / 255.0f) < 1e-6f) seen_flip++;
        }
        CHECK(seen_flip > 8 && seen_plain > 8 && seen_flip + seen_plain == 40);
    }
    CHECK_OK(batch(&ds, idx, 6, &t, 9, 4, x2, y));   /* another epoch: other choices */
    CHECK(memcmp(x, x2, sizeof x) != 0);
}

static void test_batch_errors(void) {
    dt_dataset ds = make_ds(), empty;
    int64_t bad[1] = {6}, neg[1] = {-1}, ok[1] = {0};
    float x[C * H * W];
    int32_t y[1];
    dt_transform t;
    memset(&empty, 0, sizeof empty);
    memset(&t, 0, sizeof t);
    CHECK_ERR(batch(&ds, bad, 1, NULL, 0, 0, x, y), DT_ERR_INVALID_ARG);
    CHECK_ERR(batch(&ds, neg, 1, NULL, 0, 0, x, y), DT_ERR_INVALID_ARG);
    CHECK_ERR(batch(&ds, ok, 0, NULL, 0, 0, x, y), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "count is 0; set it to the samples of the batch") != NULL);
    CHECK_ERR(batch(&ds, NULL, 1, NULL, 0, 0, x, y), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "indices is NULL") != NULL);
    CHECK_ERR(dt_dataset_batch(&ds, NULL, x, y), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "the desc") != NULL);
    CHECK_ERR(batch(&ds, ok, 1, NULL, 0, 0, NULL, y), DT_ERR_INVALID_ARG);
    CHECK_ERR(batch(&empty, ok, 1, NULL, 0, 0, x, y), DT_ERR_STATE);
    t.crop_pad = -1;
    CHECK_ERR(batch(&ds, ok, 1, &t, 0, 0, x, y), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "crop_pad is -1") != NULL);
    dt_dataset_free(NULL);
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_transform\n");
    RUN(test_plain_and_normalise);
    RUN(test_crop_flip);
    RUN(test_batch_errors);
    return dt_t_summary();
}
