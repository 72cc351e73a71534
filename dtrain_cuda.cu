/* dtrain_cuda.cu - the GPU backend's implementation: the one translation unit nvcc compiles (see dtrain_cuda.h). */
#define DTRAIN_CUDA_IMPLEMENTATION
#include "dtrain_cuda.h"
