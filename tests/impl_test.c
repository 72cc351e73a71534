/* The implementation as the test programs link it, compiled once per configuration (the Makefile's
   $(B)/obj/dtrain_test.o, and tests/run.sh's objects without OpenMP, under the sanitizers, with MPI, for
   qemu, wine and musl): the counting allocator of dt_test_alloc.h and the settings of dt_test_hooks.h. A
   test whose source defines DTRAIN_IMPLEMENTATION itself compiles it alone. (tests/impl.c is the plain
   object the examples and benchmarks link.) */
#define DTRAIN_IMPLEMENTATION
#include "dt_test_alloc.h"
#include "dt_test_hooks.h"
#include "../dtrain.h"
