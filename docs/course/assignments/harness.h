/* harness.h - what the assignments' harnesses (test_*.c) share: the "ok" / "FAIL" lines and their count, the
   comparison of two float vectors bit for bit (naming the first element that differs, with both values and
   their bits), and the random test data. Each harness ends with "N passed, N failed" and exits 1 when a case
   failed, as the project's tests do (tests/run.sh counts them). */
#ifndef COURSE_HARNESS_H
#define COURSE_HARNESS_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain.h"

static int h_passed, h_failed;

#if defined(__GNUC__) || defined(__clang__)
static inline void h_report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
/* One case: "ok   ..." or "FAIL ..." */
static inline void h_report(int ok, const char *fmt, ...) {
    va_list ap;
    fputs(ok ? "ok   " : "FAIL ", stdout);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
    if (ok) h_passed++; else h_failed++;
}
static inline int h_end(const char *what) {
    if (h_failed) printf("%s: %d case(s) failed; the FAIL lines above say where\n", what, h_failed);
    printf("%d passed, %d failed\n", h_passed, h_failed);
    return h_failed ? 1 : 0;
}

static inline uint32_t h_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
/* Elements of want [n] and got [n] whose bits differ: how many, and the first in *first (-1: none). */
static inline int64_t h_diff(const float *want, const float *got, int64_t n, int64_t *first) {
    int64_t k, count = 0;
    *first = -1;
    for (k = 0; k < n; k++)
        if (h_bits(want[k]) != h_bits(got[k])) {
            if (*first < 0) *first = k;
            count++;
        }
    return count;
}
/* "expected 1.5 (0x3fc00000), got 0.5 (0x3f000000)" into out */
static inline void h_values(char *out, size_t cap, float want, float got) {
    snprintf(out, cap, "expected %.9g (0x%08x), got %.9g (0x%08x)", (double)want, (unsigned)h_bits(want), (double)got,
             (unsigned)h_bits(got));
}

/* Runs fn(arg) on p local ranks (threads, one OpenMP thread each) whose waits time out after 10 s, so a message
   that never comes fails a case in 10 s, not 300. Returns 0, after a FAIL line, when a rank did not return at all:
   its thread still runs and uses the case's memory, so the harness must stop. Else 1, and *r the launch's result. */
static inline int h_launch(int p, dt_rank_fn fn, void *arg, const char *what, dt_result *r) {
    dt_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.ranks = p;
    ld.threads_per_rank = 1;
    ld.comm.timeout = 10.0;
    *r = dt_launch_local(&ld, fn, arg, NULL);
    if (*r == DT_ERR_TIMEOUT && strstr(dt_last_error(), "stalled")) {
        h_report(0, "%s: a rank did not return (%s); the harness stops here", what, dt_last_error());
        return 0;
    }
    return 1;
}

/* The rank whose failure to report: the lowest that failed of its own (not DT_ERR_PEER, which only follows
   another rank's failure), else the lowest that failed; -1 when none did. */
static inline int h_first_failure(const dt_result *ret, int p) {
    int i;
    for (i = 0; i < p; i++) if (ret[i] != DT_OK && ret[i] != DT_ERR_PEER) return i;
    for (i = 0; i < p; i++) if (ret[i] != DT_OK) return i;
    return -1;
}

/* "DT_ERR_X: message" for a function's result r and the message it left (dt_last_error, which names the result
   already when the library set it), into out [cap]. */
static inline const char *h_why(char *out, size_t cap, dt_result r, const char *msg) {
    const char *name = dt_result_str(r);
    if (strncmp(msg, name, strlen(name)) == 0) snprintf(out, cap, "%s", msg);
    else snprintf(out, cap, "%s (the last message: %s)", name, msg[0] ? msg : "none");
    return out;
}

/* Whether to run the next case: not after a wait timed out (a message that never came), which every later case
   would repeat, 10 s a rank at a time. */
static inline int h_go_on(const dt_result *ret, int p, dt_result r) {
    int i, timeout = r == DT_ERR_TIMEOUT;
    for (i = 0; i < p; i++) timeout |= ret[i] == DT_ERR_TIMEOUT;
    if (timeout) printf("(the cases after this one were not run: a rank waited 10 s for a message that never came)\n");
    return !timeout;
}

/* A random float whose magnitude spans 2^-8 .. 2^8, either sign (never zero): sums of such values round
   differently in different orders, so only the library's order gives its bits. */
static inline float h_value(dt_rng *r) {
    float m = 1.0f + (float)(dt_rng_u32(r) >> 8) / 16777216.0f;   /* [1, 2) */
    int e = (int)(dt_rng_u32(r) % 17u) - 8;
    float x = m;
    for (; e > 0; e--) x *= 2.0f;
    for (; e < 0; e++) x *= 0.5f;
    return (dt_rng_u32(r) & 1u) ? -x : x;
}
/* A float that marks "not written": the harnesses fill the output with it first. */
static inline float h_unwritten(void) {
    uint32_t u = 0x7fc0dead;   /* a quiet NaN */
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
