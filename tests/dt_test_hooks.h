/* dt_test_hooks.h - the implementation as the test programs have it. Include it before dtrain.h (after
   dt_test_alloc.h, in a test that counts allocations). A test links the object of its configuration
   (tests/impl_test.c: the Makefile's $(B)/obj/dtrain_test.o, tests/run.sh's `impl`), or compiles the
   implementation in itself (-DDTRAIN_IMPLEMENTATION: run.sh's cross builds): either way with these settings:
   - DT__TEST_HOOKS: the few internals the tests steer or count get a handle with external linkage, the
     dt__test_* functions below, each defined next to what it reads (a test that needs more of the internals,
     test_core, test_diff and test_comm, still compiles the implementation itself);
   - a DT_IMAGE_MAX_PIXELS small enough for test_datasets to exceed. */
#ifndef DT__TEST_HOOKS_H
#define DT__TEST_HOOKS_H
#define DT__TEST_HOOKS
#define DT_IMAGE_MAX_PIXELS 4096
#include <stdint.h>
#include <stddef.h>
struct dt_rng;
int *dt__test_fuse_off(void);          /* dtrain/core/nn.h: 1 plans nothing (no fusion, every gradient added to) */
int64_t *dt__test_tap_min_len(void);   /* dtrain/cpu/cpu.h: the narrowest piece of a GEMM the taps take */
int64_t dt__test_tap_taken(void);      /* calls that took the taps, on this thread */
int dt__test_tier_shifts(void);        /* whether the CPU tier in use has the shifted-row convolutions */
int64_t dt__test_shift_taken(void);    /* dtrain/cpu/cpu_vec.h: calls that took the shifted rows, on this thread */
int64_t dt__test_argmax_row(const float *x, int64_t k);          /* dtrain/core/tensor.h: dt_body_argmax_row */
double dt__test_rng_open01(struct dt_rng *r);                      /* dtrain/core/partition.h: uniform in (0, 1) */
double dt__test_rng_log_gamma(struct dt_rng *r, double shape);     /* log of a Gamma(shape, 1) variate */
uint64_t dt__test_fnv(uint64_t h, const void *data, size_t n);     /* dtrain/train/checkpoint.h: the checksum */
int64_t dt__test_ckpt_words(int section);   /* the words of a checkpoint's header before the sizes (0), of a section (1) */
#endif
