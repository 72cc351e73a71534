/* emulate.cc - dtrain_cuda.h's implementation on the host emulation of tests/cuda/cuda_emu.h: the kernels
   run as loops, so test_cuda.c checks them against the CPU ops on a machine without a GPU (g++ -x c++). */
#include "cuda_emu.h"
#define DTRAIN_CUDA_IMPLEMENTATION
#include "../../dtrain_cuda.h"
