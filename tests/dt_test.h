/* dt_test.h - the tests' tiny harness: checks that count, a runner that ends with "N passed, N failed",
   and a reader for the PyTorch fixtures written by tests/gen_fixtures.py. */
#ifndef DT_TEST_H
#define DT_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdint.h>

#if defined(__GNUC__)
#define DT_T_UNUSED __attribute__((unused))
#else
#define DT_T_UNUSED
#endif

#ifndef DT_TEST_FIXTURES
#define DT_TEST_FIXTURES "tests/fixtures"
#endif

static DT_T_UNUSED int dt_t_checks_failed;   /* failed checks in the running test */

#define CHECK(cond) do { if (!(cond)) { dt_t_checks_failed++; \
    printf("    check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_OK(expr) do { dt_result r_ = (expr); if (r_ != DT_OK) { dt_t_checks_failed++; \
    printf("    %s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr, dt_result_str(r_), dt_last_error()); } } while (0)
#define CHECK_ERR(expr, code) do { dt_result r_ = (expr); if (r_ != (code)) { dt_t_checks_failed++; \
    printf("    %s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr, dt_result_str(r_), #code); } \
    else if (strlen(dt_last_error()) < 20) { dt_t_checks_failed++; \
    printf("    %s:%d: %s gave no useful message: \"%s\"\n", __FILE__, __LINE__, #expr, dt_last_error()); } } while (0)

/* max |a - b| / max |b|: relative error of a against the reference b, in the infinity norm */
static DT_T_UNUSED double dt_t_relerr(const float *a, const float *b, int64_t n) {
    double num = 0.0, den = 0.0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]), m = fabs((double)b[i]);
        if (d > num || d != d) num = d != d ? INFINITY : d;
        if (m > den) den = m;
    }
    return den > 0.0 ? num / den : num;
}
#define CHECK_CLOSE(a, b, n, tol, what) do { double e_ = dt_t_relerr((a), (b), (n)); if (!(e_ <= (tol))) { \
    dt_t_checks_failed++; printf("    %s:%d: %s: relative error %.3g > %.1g\n", __FILE__, __LINE__, (what), e_, (double)(tol)); } } while (0)

typedef void (*dt_t_fn)(void);
static DT_T_UNUSED int dt_t_passed, dt_t_failed, dt_t_skipped;
/* argv[1]: run only the tests whose name contains one of these comma-separated words ("threads,planned"), or,
   after a ~, all but those ("~threads,planned"); tests/run.sh splits a long program into parallel runs so */
static const char *dt_t_only;
static const char *dt_t_skip_why; /* when set, every test is skipped (counted apart), e.g. "no GPU" */

static DT_T_UNUSED int dt_t_selected(const char *name) {
    const char *p = dt_t_only;
    int but = 0;
    if (!p) return 1;
    if (*p == '~') { but = 1; p++; }
    while (*p) {
        char word[64];
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof word) {
            memcpy(word, p, n); word[n] = 0;
            if (strstr(name, word)) return !but;
        }
        p += n + (p[n] == ',');
    }
    return but;
}
static DT_T_UNUSED void dt_t_run(const char *name, dt_t_fn fn) {
    if (!dt_t_selected(name)) return;
    if (dt_t_skip_why) { dt_t_skipped++; printf("skip %s: %s\n", name, dt_t_skip_why); fflush(stdout); return; }
    double t0 = dt_time_now();
    dt_t_checks_failed = 0;
    fn();
    t0 = dt_time_now() - t0;
    if (dt_t_checks_failed) { dt_t_failed++; printf("FAIL %s", name); }
    else { dt_t_passed++; printf("ok   %s", name); }
    if (t0 >= 1) printf(" (%.1f s)", t0);   /* where a suite's time goes */
    printf("\n");
    fflush(stdout);
}
#define RUN(fn) dt_t_run(#fn, fn)
/* A test that cannot run here (e.g. kernels for instructions this CPU lacks): said, and counted as skipped,
   never as passed */
static DT_T_UNUSED void dt_t_skip(const char *name, const char *why) {
    if (!dt_t_selected(name)) return;
    dt_t_skipped++;
    printf("skip %s: %s\n", name, why);
    fflush(stdout);
}
/* "N passed, N failed" (what tests/run.sh adds up), after "N skipped" when tests were skipped */
static DT_T_UNUSED int dt_t_summary(void) {
    if (dt_t_skipped) printf("%d skipped\n", dt_t_skipped);
    printf("%d passed, %d failed\n", dt_t_passed, dt_t_failed);
    return dt_t_failed ? 1 : 0;
}

/* ---- fixtures: "DTFIX001", then records (u32 name_len, name, u32 ndim, i64 dims[ndim], f32 data) ---- */
#define DT_T_MAX_REC 32
typedef struct dt_t_rec { char name[32]; int ndim; int64_t dims[4], count; float *data; } dt_t_rec;
typedef struct dt_t_fix { int n; dt_t_rec rec[DT_T_MAX_REC]; } dt_t_fix;

static DT_T_UNUSED void dt_t_fix_free(dt_t_fix *f) {
    int i;
    for (i = 0; i < f->n; i++) free(f->rec[i].data);
    f->n = 0;
}
/* Returns 0 on success; a missing or corrupt fixture is a failed check, not a crash. */
static DT_T_UNUSED int dt_t_fix_load(dt_t_fix *f, const char *name) {
    char path[512], magic[8];
    FILE *fp;
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/%s.bin", DT_TEST_FIXTURES, name);
    if (!(fp = fopen(path, "rb"))) { dt_t_checks_failed++; printf("    cannot open fixture %s\n", path); return -1; }
    if (fread(magic, 1, 8, fp) != 8 || memcmp(magic, "DTFIX001", 8) != 0) goto bad;
    for (;;) {
        uint32_t len, nd;
        dt_t_rec *r;
        int i;
        if (fread(&len, 4, 1, fp) != 1) break;
        dt__le32(&len, 1);   /* the fixtures are little-endian (dtrain/core/base.h: the byte order of files) */
        if (f->n == DT_T_MAX_REC || len >= sizeof r->name) goto bad;
        r = &f->rec[f->n++];
        memset(r, 0, sizeof *r);
        if (fread(r->name, 1, len, fp) != len || fread(&nd, 4, 1, fp) != 1) goto bad;
        dt__le32(&nd, 1);
        if (nd > 4) goto bad;
        r->ndim = (int)nd;
        r->count = 1;
        for (i = 0; i < r->ndim; i++) {
            if (fread(&r->dims[i], 8, 1, fp) != 1) goto bad;
            dt__le64(&r->dims[i], 1);
            if (r->dims[i] < 0 || r->dims[i] > (1 << 24)) goto bad;
            r->count *= r->dims[i];
        }
        r->data = (float *)malloc(sizeof(float) * (size_t)(r->count + 1));
        if (!r->data || fread(r->data, 4, (size_t)r->count, fp) != (size_t)r->count) goto bad;
        dt__le32(r->data, (size_t)r->count);
    }
    fclose(fp);
    return 0;
bad:
    fclose(fp);
    dt_t_checks_failed++;
    printf("    fixture %s is corrupt; regenerate with /usr/bin/python3 tests/gen_fixtures.py\n", path);
    dt_t_fix_free(f);
    return -1;
}
/* The record's data, or NULL (and a failed check) when absent. */
static DT_T_UNUSED float *dt_t_get(dt_t_fix *f, const char *name, int64_t *count) {
    int i;
    for (i = 0; i < f->n; i++)
        if (strcmp(f->rec[i].name, name) == 0) { if (count) *count = f->rec[i].count; return f->rec[i].data; }
    dt_t_checks_failed++;
    printf("    fixture has no record \"%s\"\n", name);
    return NULL;
}
static DT_T_UNUSED int dt_t_has(dt_t_fix *f, const char *name) {
    int i;
    for (i = 0; i < f->n; i++)
        if (strcmp(f->rec[i].name, name) == 0) return 1;
    return 0;
}

/* uniform in [lo, hi) from a private LCG, independent of the library under test */
static uint64_t dt_t_state = 88172645463325252ULL;
static float dt_t_rand(float lo, float hi) {
    dt_t_state = dt_t_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((dt_t_state >> 40) * (1.0 / 16777216.0));
}
static DT_T_UNUSED void dt_t_fill(float *x, int64_t n, float lo, float hi) {
    int64_t i;
    for (i = 0; i < n; i++) x[i] = dt_t_rand(lo, hi);
}
#endif
