/* cuda_emu.h - the few CUDA runtime and cuBLAS calls dtrain_cuda.h makes, emulated on the host, so that
   its kernels run (as plain loops: DT_CUDA_EMULATE) on machines without a GPU. A test device, like
   sokol's dummy backend: it checks the kernels' index arithmetic and the row-major to column-major GEMM
   mapping against the CPU ops, under AddressSanitizer too; it says nothing about timing, races between
   GPU threads or the real cuBLAS. tests/cuda/emulate.cc compiles dtrain_cuda.h with it (C++). */
#ifndef DT_CUDA_EMU_H
#define DT_CUDA_EMU_H
#define DT_CUDA_EMULATE 1

#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#define __global__
#define __device__
#define __host__
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }

typedef enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
                         cudaErrorInvalidDevice = 101 } cudaError_t;
typedef struct dt__emu_stream *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyDefault = 4 };
enum cudaDeviceAttr { cudaDevAttrConcurrentManagedAccess = 89 };
struct cudaDeviceProp { char name[256]; };
#define cudaStreamNonBlocking 0x01
#define cudaMemAttachGlobal 0x01

typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_ALLOC_FAILED = 3, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef struct dt__emu_blas *cublasHandle_t;

static thread_local cudaError_t dt__emu_last = cudaSuccess;
static cudaError_t dt__emu_ret(cudaError_t e) { if (e != cudaSuccess) dt__emu_last = e; return e; }

static inline cudaError_t cudaGetLastError(void) { cudaError_t e = dt__emu_last; dt__emu_last = cudaSuccess; return e; }
static inline const char *cudaGetErrorName(cudaError_t e) {
    return e == cudaSuccess ? "cudaSuccess" : e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation" :
           e == cudaErrorInvalidDevice ? "cudaErrorInvalidDevice" : "cudaErrorInvalidValue";
}
static inline const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
static inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int d) { return dt__emu_ret(d == 0 ? cudaSuccess : cudaErrorInvalidDevice); }
static inline cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    snprintf(p->name, sizeof p->name, "host emulation of GPU %d", d);
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) { (void)a; (void)d; *v = 1; return cudaSuccess; }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
    (void)f;
    *s = (cudaStream_t)malloc(1);
    return dt__emu_ret(*s ? cudaSuccess : cudaErrorMemoryAllocation);
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) { return dt__emu_ret(s ? cudaSuccess : cudaErrorInvalidValue); }
static inline cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n); return dt__emu_ret(*p ? cudaSuccess : cudaErrorMemoryAllocation); }
static inline cudaError_t cudaMallocManaged(void **p, size_t n, unsigned f) { (void)f; return cudaMalloc(p, n); }
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemGetInfo(size_t *avail, size_t *total) { *avail = *total = (size_t)16 << 30; return cudaSuccess; }
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    (void)k; (void)st;
    memcpy(d, s, n);
    return cudaSuccess;
}

static inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = (cublasHandle_t)malloc(1);
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
static inline cublasStatus_t cublasDestroy(cublasHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { (void)h; (void)s; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) { (void)h; (void)m; return CUBLAS_STATUS_SUCCESS; }
static inline const char *cublasGetStatusName(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE"; }
static inline const char *cublasGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "emulated cuBLAS error"; }
/* The BLAS definition, column-major: C[i + j ldc] = alpha sum_p op(A)(i, p) op(B)(p, j) + beta C (beta 0:
   C not read), op(A)(i, p) = A[i + p lda] (N) or A[p + i lda] (T); with BLAS's argument checks. */
static inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda, const float *B, int ldb,
                                         const float *beta, float *C, int ldc) {
    (void)h;
    if (m < 0 || n < 0 || k < 0 || lda < (ta == CUBLAS_OP_N ? m : k) || lda < 1 || ldb < (tb == CUBLAS_OP_N ? k : n) ||
        ldb < 1 || ldc < m || ldc < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0.0;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? A[i + (size_t)p * lda] : A[p + (size_t)i * lda];
                float b = tb == CUBLAS_OP_N ? B[p + (size_t)j * ldb] : B[j + (size_t)p * ldb];
                acc += (double)a * (double)b;
            }
            float *c = C + i + (size_t)j * ldc;
            *c = (float)(*alpha * acc) + (*beta == 0.0f ? 0.0f : *beta * *c);
        }
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                       int n, int k, const float *alpha, const float *A, int lda,
                                                       long long sa, const float *B, int ldb, long long sb,
                                                       const float *beta, float *C, int ldc, long long sc, int count) {
    for (int i = 0; i < count; i++) {
        cublasStatus_t s = cublasSgemm(h, ta, tb, m, n, k, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return count < 0 ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
}
#endif
