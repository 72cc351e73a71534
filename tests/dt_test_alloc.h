/* dt_test_alloc.h - allocator hooks for tests that count allocations and can be told to fail after a
   number of them, record the largest size asked, and refuse sizes above refuse_above. live_allocs is the
   number of blocks not yet freed; total_allocs counts allocations since it was last reset; fail_after >= 0
   makes every allocation from that count on return NULL. Include it before dtrain.h. The translation unit
   that compiles the implementation (tests/impl_test.c, or a test compiled with -DDTRAIN_IMPLEMENTATION)
   defines the hooks and points DT_MALLOC, DT_REALLOC and DT_FREE at them; a test that links that object
   reads the same counters through the declarations here. */
#ifndef DT_TEST_ALLOC_H
#define DT_TEST_ALLOC_H
#include <stdlib.h>
#include <stddef.h>

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_IMPLEMENTATION_LINKED)
long live_allocs, total_allocs, fail_after = -1;
size_t largest_request;   /* the largest size asked of t_malloc since it was last reset */
size_t refuse_above;      /* when nonzero, t_malloc refuses larger requests (a test that must never get them) */
void *t_malloc(size_t n);
void *t_realloc(void *p, size_t n);
void t_free(void *p);
/* the counts are atomic: every test links this allocator, and local ranks allocate on their own threads */
#define DT_TA_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define DT_TA_ADD(x, v) __atomic_add_fetch(&(x), (v), __ATOMIC_RELAXED)
void *t_malloc(size_t n) {
    size_t big = DT_TA_LOAD(largest_request);
    while (n > big && !__atomic_compare_exchange_n(&largest_request, &big, n, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    if (DT_TA_LOAD(refuse_above) && n > DT_TA_LOAD(refuse_above)) return NULL;
    if (DT_TA_LOAD(fail_after) >= 0 && DT_TA_LOAD(total_allocs) >= DT_TA_LOAD(fail_after)) return NULL;
    DT_TA_ADD(total_allocs, 1); DT_TA_ADD(live_allocs, 1);
    return malloc(n);
}
void *t_realloc(void *p, size_t n) {
    void *q;
    if (DT_TA_LOAD(fail_after) >= 0 && DT_TA_LOAD(total_allocs) >= DT_TA_LOAD(fail_after)) return NULL;
    DT_TA_ADD(total_allocs, 1);
    q = realloc(p, n);
    if (q && !p) DT_TA_ADD(live_allocs, 1);
    return q;
}
void t_free(void *p) { if (p) DT_TA_ADD(live_allocs, -1); free(p); }
#define DT_MALLOC(n) t_malloc(n)
#define DT_REALLOC(p, n) t_realloc(p, n)
#define DT_FREE(p) t_free(p)
#else
extern long live_allocs, total_allocs, fail_after;
extern size_t largest_request, refuse_above;
#endif
#endif
