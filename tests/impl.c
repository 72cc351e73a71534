/* The implementation alone, compiled once per configuration (the Makefile's $(B)/obj/dtrain.o, and tests/run.sh's
   objects without OpenMP, under the sanitizers and with MPI) and linked into every program of that configuration
   whose source does not define DTRAIN_IMPLEMENTATION itself. */
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
