/* dt_test_alloc.h - allocator hooks for tests that count allocations and can be told to fail after a
   number of them, record the largest size asked, and refuse sizes above refuse_above. Include it BEFORE dtrain.h's implementation: it defines DT_MALLOC, DT_REALLOC and
   DT_FREE. live_allocs is the number of blocks not yet freed; total_allocs counts allocations since it
   was last reset; fail_after >= 0 makes every allocation from that count on return NULL. */
#ifndef DT_TEST_ALLOC_H
#define DT_TEST_ALLOC_H
#include <stdlib.h>
#include <stddef.h>

static long live_allocs, total_allocs, fail_after = -1;
static size_t largest_request;   /* the largest size asked of t_malloc since it was last reset */
static size_t refuse_above;      /* when nonzero, t_malloc refuses larger requests (a test that must never get them) */
static void *t_malloc(size_t n) {
    if (n > largest_request) largest_request = n;
    if (refuse_above && n > refuse_above) return NULL;
    if (fail_after >= 0 && total_allocs >= fail_after) return NULL;
    total_allocs++; live_allocs++;
    return malloc(n);
}
static void *t_realloc(void *p, size_t n) {
    void *q;
    if (fail_after >= 0 && total_allocs >= fail_after) return NULL;
    total_allocs++;
    q = realloc(p, n);
    if (q && !p) live_allocs++;
    return q;
}
static void t_free(void *p) { if (p) live_allocs--; free(p); }
#define DT_MALLOC(n) t_malloc(n)
#define DT_REALLOC(p, n) t_realloc(p, n)
#define DT_FREE(p) t_free(p)
#endif
