/* dtrain_cuda.h - the GPU backend of dtrain: the dt_ops table in CUDA kernels and cuBLAS.   v0.1.0
   MIT license (see the end of dtrain.h).

   WHAT IT IS
     A second implementation of dtrain.h's backend ops table (dt_ops), for NVIDIA GPUs. Layers, losses,
     optimizers and trainers are the header's own: they call the table and never know which one it is.
     GEMM is cuBLAS's; every other op is a small kernel, one GPU thread per output element (or per row,
     per (image, channel) plane, per channel, per chunk), whose body is the CPU op's loop body, often the
     very function (dtrain.h's shared loop bodies: pooling windows, softmax rows, optimizer updates, the
     dropout hash). So the two backends give the same numbers up to the order of long sums, and the same
     dropout masks bit for bit. There are no atomics: every result is the same from run to run.

   HOW TO BUILD
     The declarations below are plain C; the implementation is CUDA C++ and is compiled once, by nvcc,
     from dtrain_cuda.cu (which defines DTRAIN_CUDA_IMPLEMENTATION and includes this file):
         nvcc -O3 -fmad=false -gencode arch=compute_90,code=sm_90 -c dtrain_cuda.cu -o dtrain_cuda.o
         cc -std=c11 -O3 -fopenmp -DDT_USE_CUDA prog.c dtrain_cuda.o \
            -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++ -lm
     make CUDA=1 does this for every example and test (build-cuda/). The program itself is unchanged:
     built with DT_USE_CUDA, dtrain.h includes this file and a model whose desc.ops is NULL runs on the
     GPU (on desc.ops_ctx when it is a dt_cuda, else on a dt_cuda the model creates and destroys).
     desc.ops = dt_cpu_ops() still gives a CPU model in the same program.

   API
     dt_cuda_device_count()          GPUs usable here; 0 (not an error) without a GPU or a driver
     dt_cuda_create(&cu, &desc)      a context on one GPU: stream, cuBLAS handle, scratch memory
     dt_cuda_ops()                   the ops table; pass the context as dt_model_desc.ops_ctx
     dt_cuda_sync(cu)                waits for the context's work; its first failure, if any
     dt_cuda_destroy(cu)
     dt_cuda_device(cu), dt_cuda_device_name(cu)   the context's GPU: index and name

   QUICK START
     A model on a context of the program's own (in a DT_USE_CUDA build, desc.ops NULL does the same with a
     context the model creates); training is then the CPU's code, images and labels in host memory:
         dt_cuda *cu;
         if (dt_cuda_create(&cu, NULL) != DT_OK) { puts(dt_last_error()); return 1; }   // e.g. no GPU
         printf("GPU %d: %s\n", dt_cuda_device(cu), dt_cuda_device_name(cu));
         dt_model_desc d = {0};
         d.ops = dt_cuda_ops();
         d.ops_ctx = cu;
         dt_model *m;
         dt_result r = dt_zoo_create(&m, DT_ZOO_SIMPLE_CNN, 10, &d);
         if (r != DT_OK) { puts(dt_last_error()); dt_cuda_destroy(cu); return 1; }
         float loss;
         dt_model_forward(m, images, batch);                   // images: host [batch, 1, 28, 28]
         dt_model_loss_labels(m, labels, &loss);               // the loss: a host float
         dt_model_destroy(m);                                  // everything on the context first,
         dt_cuda_destroy(cu);                                  // then the context

   MEMORY
     The ops allocate managed (unified) memory by default: the model's flat parameter, gradient and
     buffer arrays, the optimizer state and the activation arena live on the GPU, and host code may still
     read and write them (the trainers' collectives, Hogwild, D-PSGD's mixing) once the model call that
     issued the work has returned: the model calls dt_ops.sync at the end of each. The GPU must support
     concurrent managed access (every Linux GPU since Pascal; not Windows); dt_cuda_create refuses others.
     desc.device_memory = 1 allocates plain device memory instead, for programs in which only the ops
     touch the buffers (one process, no trainer): then dt_model_get_params etc. are the only way in.
     Uploads and downloads are synchronous (a copy on the context's stream, then a wait).

   ERRORS
     Every CUDA and cuBLAS call is checked. The ops return nothing, so a failure is kept in the context
     (the first one, with the call, CUDA's or cuBLAS's error name and string, and the file and line) and
     returned by the next dt_ops.sync: by the model call that issued the op, as DT_ERR_DEVICE (or
     DT_ERR_OUT_OF_MEMORY). Failures are sticky: a context that failed keeps returning its first error
     (after a kernel fault the CUDA context is unusable anyway). Allocation failures are not sticky:
     alloc returns NULL and the model reports DT_ERR_OUT_OF_MEMORY.

   THREADS
     A context belongs to one thread at a time, like a model. Local ranks (threads) each create their
     own models, so each rank has its own context and stream, and several ranks share one GPU.

   OPTIONS (dt_cuda_desc; a NULL desc reads the environment)
     device         the GPU's index; with desc NULL, $DT_CUDA_DEVICE or 0
     device_memory  1: cudaMalloc rather than cudaMallocManaged (see MEMORY); with desc NULL,
                    $DT_CUDA_MEMORY=device (or managed, the default)
     $DT_CUDA_PROFILE=1 (any desc): each kernel, GEMM and host copy is timed (CUDA events, waited for) and
                    dt_cuda_destroy prints the GPU's busy time by name to stderr

   MACROS
     DT_USE_CUDA                  (dtrain.h's) in every file of a program that uses this backend
     DTRAIN_CUDA_IMPLEMENTATION   defined by dtrain_cuda.cu, the one translation unit of the implementation
     DT_MALLOC(n), DT_FREE(p)     dtrain.h's allocator hooks, when nvcc is given them too (-D)
     DT_CUDA_EMULATE              for tests only: the kernels run as host loops over CUDA calls the test
                                  supplies (tests/cuda/cuda_emu.h), so no GPU or CUDA toolkit is needed

   NOT YET (docs/design.md, "GPU backend")
     pinned host staging and a side stream that copies the next batch while this one trains; NCCL for
     several GPUs; explicit staged copies for the local and MPI communicators (managed memory stands in).

   VERSION
     dtrain.h's (DT_VERSION_*; see its VERSION section): take the three headers from the same release.
*/
/* What the GPU backend needs of dtrain: the ops table it fills and the loop bodies it shares with the CPU
   (dtrain/core/tensor.h, which includes dtrain/core/base.h). With DT_USE_CUDA, dtrain.h includes this file and
   registers dt_cuda_backend() as a model's default backend (dtrain/core/nn.h names no backend); the guards
   DTRAIN_CUDA_H, DTRAIN_CUDA_DECLARED and DTRAIN_SHARED_DONE order the parts. */
#include "dtrain/core/tensor.h"
#ifndef DTRAIN_CUDA_H
#define DTRAIN_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* A GPU context: the device, a stream, a cuBLAS handle, scratch memory and the first failure. */
typedef struct dt_cuda dt_cuda;

/* Context settings; zero means the default. */
typedef struct dt_cuda_desc {
    int device;          /* GPU index (0 = the first) */
    int device_memory;   /* 1: plain device memory, which host code must not touch; 0: managed memory */
} dt_cuda_desc;

/* Number of CUDA GPUs this process can use; 0 when there is none or no driver (never an error). */
int       dt_cuda_device_count(void);
/* Creates a context on a GPU (desc NULL: $DT_CUDA_DEVICE or 0, and $DT_CUDA_MEMORY or managed memory). DT_ERR_UNSUPPORTED when
   no GPU is usable, naming the cause. *out is NULL on failure. */
dt_result dt_cuda_create(dt_cuda **out, const dt_cuda_desc *desc);
/* Waits for the context's work and frees it. Everything allocated through it must be freed first (a
   model or optimizer on it is destroyed before it). NULL is allowed. */
void      dt_cuda_destroy(dt_cuda *cu);
/* The GPU ops table; its ctx argument is a dt_cuda. */
const dt_ops *dt_cuda_ops(void);
/* The GPU as a default backend (dt_backend): dt_cuda_ops(), and contexts made by dt_cuda_create(&cu, NULL)
   and freed by dt_cuda_destroy. dtrain.h registers it with DT_USE_CUDA, so that a model whose desc.ops is
   NULL runs on the GPU. */
const dt_backend *dt_cuda_backend(void);
/* Waits until the context's work is done; DT_OK or the context's first failure (the table's sync). */
dt_result dt_cuda_sync(dt_cuda *cu);
/* The context's GPU: its index and its name (e.g. "NVIDIA H100 80GB HBM3"). */
int         dt_cuda_device(const dt_cuda *cu);
const char *dt_cuda_device_name(const dt_cuda *cu);

#ifdef __cplusplus
}
#endif
#define DTRAIN_CUDA_DECLARED
#endif /* DTRAIN_CUDA_H */

/* ============================================================================================== */
/* Implementation: CUDA C++, compiled by nvcc in one translation unit (dtrain_cuda.cu).            */
/* ============================================================================================== */
#if defined(DTRAIN_CUDA_IMPLEMENTATION) && defined(DTRAIN_CUDA_DECLARED) && defined(DTRAIN_SHARED_DONE) && \
    !defined(DTRAIN_CUDA_IMPLEMENTATION_DONE)
#define DTRAIN_CUDA_IMPLEMENTATION_DONE
#include "dtrain/core/internal.h"

/* DT_CUDA_EMULATE: whoever defines it provides the few CUDA and cuBLAS calls below and runs each kernel
   as one host loop (tests/cuda/cuda_emu.h does, so the kernels' index arithmetic is tested on machines
   without a GPU, under AddressSanitizer too). */
#ifndef DT_CUDA_EMULATE
#include <cuda_runtime.h>
#include <cublas_v2.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <math.h>
#include <limits.h>

/* dtrain.h's allocator hooks (for the context struct), when the build gives them to nvcc too */
#ifndef DT_MALLOC
#define DT_MALLOC(n) malloc(n)
#define DT_FREE(p) free(p)
#endif

struct dt_cuda {
    int            device;
    int            managed;         /* allocations are managed memory */
    char           name[256];
    cudaStream_t   stream;          /* every op of this context runs on it, in order */
    cublasHandle_t blas;            /* bound to stream */
    void          *scratch;         /* device memory for reductions, grown on demand, never held across ops */
    int64_t        scratch_bytes;
    dt_result      err;             /* the first failure (sticky), with its message */
    char           msg[480];
    int            profile;         /* $DT_CUDA_PROFILE: time each kernel, GEMM and copy (see dt__cu_prof_end) */
    int            nprof;
    struct { const char *name; double ms; int64_t calls; } prof[64];
#ifndef DT_CUDA_EMULATE
    cudaEvent_t    ev0, ev1;
#endif
};

/* ---- errors ----------------------------------------------------------------------------------- */

static void dt__cu_fail(dt_cuda *cu, dt_result r, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    int n;
    if (cu->err != DT_OK) return;   /* the first failure is the cause; later ones follow from it */
    cu->err = r;
    va_start(ap, fmt);
    n = vsnprintf(cu->msg, sizeof cu->msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof cu->msg) snprintf(cu->msg + n, sizeof cu->msg - (size_t)n, " (%s:%d)", file, line);
}

/* Keeps a failed CUDA call; returns nonzero when it failed. */
static int dt__cu_check(dt_cuda *cu, cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    dt__cu_fail(cu, e == cudaErrorMemoryAllocation ? DT_ERR_OUT_OF_MEMORY : DT_ERR_DEVICE, file, line,
                "%s failed: %s: %s", call, cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
}
static int dt__cublas_check(dt_cuda *cu, cublasStatus_t s, const char *call, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    dt__cu_fail(cu, s == CUBLAS_STATUS_ALLOC_FAILED ? DT_ERR_OUT_OF_MEMORY : DT_ERR_DEVICE, file, line,
                "%s failed: %s: %s", call, cublasGetStatusName(s), cublasGetStatusString(s));
    return 1;
}
#define DT__CU(cu, call) dt__cu_check((cu), (call), #call, __FILE__, __LINE__)
#define DT__CUBLAS(cu, call) dt__cublas_check((cu), (call), #call, __FILE__, __LINE__)

/* ---- profile ($DT_CUDA_PROFILE=1) ---------------------------------------------------------------
   Each kernel launch, GEMM and host copy is timed with a pair of CUDA events and waited for, and the times
   are summed by name; dt_cuda_destroy prints the table to stderr, largest first. The waits serialise the
   stream (the host's launch gaps are not counted), so the sum is the GPU's busy time, not the wall time. */
static inline void dt__cu_prof_begin(dt_cuda *cu) {
#ifndef DT_CUDA_EMULATE
    if (cu->profile) (void)cudaEventRecord(cu->ev0, cu->stream);
#else
    (void)cu;
#endif
}
static inline void dt__cu_prof_end(dt_cuda *cu, const char *name) {
#ifndef DT_CUDA_EMULATE
    float ms = 0.0f;
    int i;
    if (!cu->profile || cudaEventRecord(cu->ev1, cu->stream) != cudaSuccess || cudaEventSynchronize(cu->ev1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, cu->ev0, cu->ev1) != cudaSuccess)
        return;
    for (i = 0; i < cu->nprof && strcmp(cu->prof[i].name, name); i++) {}
    if (i == cu->nprof) {
        if (i == (int)(sizeof cu->prof / sizeof cu->prof[0])) return;
        cu->prof[cu->nprof++].name = name;
    }
    cu->prof[i].ms += ms;
    cu->prof[i].calls++;
#else
    (void)cu; (void)name;
#endif
}

/* ---- kernels ------------------------------------------------------------------------------------
   Every kernel is a grid-stride loop over independent work items (DT__CU_FOR): item i writes only its own
   outputs, so there are no atomics, no shared memory and no races, and the results do not depend on the
   launch shape. Launches are checked (cudaGetLastError) and skipped for zero items. */

#define DT__CU_THREADS 256
#define DT__CU_MAX_BLOCKS 65536

/* The kernels that index by division (im2col, the layout changes, batch norm, pooling) are templates on
   the index type I: 32-bit arithmetic when every index of the launch fits (DT__CU_LAUNCH_IX picks it),
   else 64-bit. A GPU divides 32-bit integers in a few instructions and 64-bit ones in a long sequence,
   and these kernels do several divisions per element. */
#ifndef DT__CU_FITS_32   /* (tests define it as 0 to run the 64-bit kernels) */
#define DT__CU_FITS_32 ((int64_t)1 << 30)   /* room for the grid stride above the largest index */
#endif

#ifdef DT_CUDA_EMULATE
#define DT__CU_FOR_T(I, i, n) for (I i = 0; i < (I)(n); i++)
#define DT__CU_LAUNCH(cu, n, kernel, args) do { (void)(cu); if ((n) > 0) kernel args; } while (0)
#else
#define DT__CU_FOR_T(I, i, n) \
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < (I)(n); i += (I)gridDim.x * (I)blockDim.x)
#define DT__CU_LAUNCH(cu, n, kernel, args) do { if ((n) > 0) {                                              \
        dt__cu_prof_begin(cu);                                                                           \
        kernel<<<dt__cu_blocks(n), DT__CU_THREADS, 0, (cu)->stream>>> args;                              \
        dt__cu_check((cu), cudaGetLastError(), "launch of " #kernel, __FILE__, __LINE__);                \
        dt__cu_prof_end(cu, #kernel); } } while (0)
static unsigned dt__cu_blocks(int64_t n) {
    int64_t b = (n + DT__CU_THREADS - 1) / DT__CU_THREADS;
    return (unsigned)(b < DT__CU_MAX_BLOCKS ? b : DT__CU_MAX_BLOCKS);
}
#endif
#define DT__CU_FOR(i, n) DT__CU_FOR_T(int64_t, i, n)
/* launches kernel<int> when `largest` (the largest element count any index of the launch reaches) fits in
   32 bits, else kernel<int64_t> */
#define DT__CU_LAUNCH_IX(cu, n, largest, kernel, args) do {                                                  \
        if ((largest) < DT__CU_FITS_32) DT__CU_LAUNCH(cu, n, kernel<int>, args);                           \
        else DT__CU_LAUNCH(cu, n, kernel<int64_t>, args); } while (0)

/* the convolution or pooling geometry g as constants n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw of type I */
#define DT__CU_GEOM(I, g)                                                                                    \
    const I n = (I)(g).n, c = (I)(g).c, h = (I)(g).h, w = (I)(g).w, oh = (I)(g).oh, ow = (I)(g).ow,            \
            kh = (I)(g).kh, kw = (I)(g).kw, sh = (I)(g).sh, sw = (I)(g).sw, ph = (I)(g).ph, pw = (I)(g).pw

/* Division by a launch's constant without a divide instruction (Granlund and Montgomery's method, as
   PyTorch's IntDivider): for 0 <= x < 2^31 and 1 <= d < 2^31, x / d = (umulhi(x, m) + x) >> s with
   s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, made on the host once a launch. The 32-bit
   kernels (indices below 2^30, so the sum cannot overflow) divide so; the 64-bit ones divide plainly. */
typedef struct dt__cu_div { int64_t d; uint32_t m; int s; } dt__cu_div;
static dt__cu_div dt__cu_div_of(int64_t d) {
    dt__cu_div f;
    int s = 0;
    if (d < 1) d = 1;
    while (s < 31 && ((int64_t)1 << s) < d) s++;
    f.d = d;
    f.s = s;
    f.m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - (uint64_t)d)) / (uint64_t)d + 1);
    return f;
}
static __device__ inline int dt__cu_quot(const dt__cu_div &f, int x) {
    return (int)((__umulhi((unsigned)x, f.m) + (unsigned)x) >> f.s);
}
static __device__ inline int64_t dt__cu_quot(const dt__cu_div &f, int64_t x) { return x / f.d; }

/* vectors */
static __global__ void dt__k_fill(float *x, int64_t n, float v) { DT__CU_FOR(i, n) x[i] = v; }
static __global__ void dt__k_scale(float *x, int64_t n, float a) { DT__CU_FOR(i, n) x[i] *= a; }
static __global__ void dt__k_axpy(float *y, const float *x, int64_t n, float a) { DT__CU_FOR(i, n) y[i] += a * x[i]; }
static __global__ void dt__k_add(float *y, const float *a, const float *b, int64_t n) { DT__CU_FOR(i, n) y[i] = a[i] + b[i]; }

/* C[M, N] = beta C (beta 0: zeros, C not read): GEMM with K = 0 */
static __global__ void dt__k_gemm_beta(float *C, int64_t M, int64_t N, int64_t ldc, float beta) {
    DT__CU_FOR(i, M * N) {
        float *c = C + (i / N) * ldc + i % N;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}
/* y [rows, cols] += b [cols] */
template <typename I> static __global__ void dt__k_add_row_bias(float *y, const float *b, I rows, I cols) {
    DT__CU_FOR_T(I, i, rows * cols) y[i] += b[i % cols];
}
/* one thread per column i: db[i] += sum over rows, in row order (the CPU's order) */
static __global__ void dt__k_sum_rows(float *db, const float *dy, int64_t rows, int64_t cols) {
    DT__CU_FOR(i, cols) {
        float acc = 0.0f;
        for (int64_t r = 0; r < rows; r++) acc += dy[r * cols + i];
        db[i] += acc;
    }
}

/* col [c*kh*kw, n*oh*ow]: one thread per element of col; zero where the window reads padding */
/* the dividers of an im2col launch: by n oh ow, oh ow, ow, kh kw and kw (dt__cu_im2col_divs) */
typedef struct dt__cu_im2col_div { dt__cu_div NS, S, ow, khw, kw; } dt__cu_im2col_div;
template <typename I> static __global__ void dt__k_im2col(dt_conv_geom g, dt__cu_im2col_div D, const float *x, float *col) {
    DT__CU_GEOM(I, g);
    const I S = oh * ow, NS = n * S, total = c * kh * kw * NS;
    DT__CU_FOR_T(I, idx, total) {
        I r = dt__cu_quot(D.NS, idx), q = idx - r * NS, ni = dt__cu_quot(D.S, q), sp = q - ni * S;
        I oy = dt__cu_quot(D.ow, sp), ox = sp - oy * ow;
        I ci = dt__cu_quot(D.khw, r), rk = r - ci * kh * kw, ky = dt__cu_quot(D.kw, rk), kx = rk - ky * kw;
        I iy = oy * sh - ph + ky, ix = ox * sw - pw + kx;
        col[idx] = (iy >= 0 && iy < h && ix >= 0 && ix < w) ? x[((ni * c + ci) * h + iy) * w + ix] : 0.0f;
    }
}
/* dx [n, c, h, w] += col2im(col): one thread per input element gathers the entries of col that read it,
   kernel offsets (ky, kx) in the order the CPU scatters them */
/* the dividers of a col2im launch: by w, h, c and the strides */
typedef struct dt__cu_col2im_div { dt__cu_div w, h, c, sh, sw; } dt__cu_col2im_div;
template <typename I> static __global__ void dt__k_col2im(dt_conv_geom g, dt__cu_col2im_div D, const float *col, float *dx) {
    DT__CU_GEOM(I, g);
    const I S = oh * ow, NS = n * S, total = n * c * h * w;
    DT__CU_FOR_T(I, idx, total) {
        I t = dt__cu_quot(D.w, idx), ix = idx - t * w, t2 = dt__cu_quot(D.h, t), iy = t - t2 * h;
        I ni = dt__cu_quot(D.c, t2), ci = t2 - ni * c;
        float v = dx[idx];
        for (I ky = 0; ky < kh; ky++) {
            I ty = iy + ph - ky, oy;          /* oy * sh - ph + ky == iy */
            if (ty < 0) continue;
            oy = dt__cu_quot(D.sh, ty);
            if (oy * sh != ty || oy >= oh) continue;
            for (I kx = 0; kx < kw; kx++) {
                I tx = ix + pw - kx, ox;
                if (tx < 0) continue;
                ox = dt__cu_quot(D.sw, tx);
                if (ox * sw != tx || ox >= ow) continue;
                v += col[((ci * kh + ky) * kw + kx) * NS + ni * S + oy * ow + ox];
            }
        }
        dx[idx] = v;
    }
}
/* y [n, c, s] = t [c, n*s] (+ b[c]) */
template <typename I> static __global__ void dt__k_cs_to_ncs(float *y, const float *t, const float *b, I n, I c, I s,
                                                             dt__cu_div ds, dt__cu_div dc) {
    DT__CU_FOR_T(I, idx, n * c * s) {
        I q = dt__cu_quot(ds, idx), k = idx - q * s, i = dt__cu_quot(dc, q), ch = q - i * c;
        y[idx] = t[ch * n * s + i * s + k] + (b ? b[ch] : 0.0f);
    }
}
/* t [c, n*s] = y [n, c, s] */
template <typename I> static __global__ void dt__k_ncs_to_cs(float *t, const float *y, I n, I c, I s, dt__cu_div ds,
                                                             dt__cu_div dc) {
    DT__CU_FOR_T(I, idx, n * c * s) {
        I q = dt__cu_quot(ds, idx), k = idx - q * s, i = dt__cu_quot(dc, q), ch = q - i * c;
        t[ch * n * s + i * s + k] = y[idx];
    }
}

/* Per (image, channel) sums over s of x [n, c, s], in double: part[(i*c + ch)*J + j] sums the elements
   j, j + J, j + 2J, ... of the plane (J parts a plane, so that neighbouring threads read neighbouring
   elements and a plane's sum is J-way parallel; dt__k_join_parts adds the J parts in order). mode 0: x;
   mode 1: (x - center[ch])^2; mode 2: x as a float sum in element order (the CPU's channel_sum_bwd, stored
   exactly; J must be 1). */
template <typename I> static __global__ void dt__k_plane_sums(const float *x, const float *center, int mode, I n, I c, I s,
                                                              I J, double *part) {
    DT__CU_FOR_T(I, it, n * c * J) {
        I ic = it / J, j = it % J;
        const float *p = x + ic * s;
        double acc = 0.0;
        if (mode == 1) {
            double mu = (double)center[ic % c];
            for (I k = j; k < s; k += J) { double d = (double)p[k] - mu; acc += d * d; }
        } else if (mode == 2) {
            float f = 0.0f;
            for (I k = 0; k < s; k++) f += p[k];
            acc = (double)f;
        } else {
            for (I k = j; k < s; k += J) acc += (double)p[k];
        }
        part[it] = acc;
    }
}
/* out[i] = the sum of in[i*J .. i*J + J-1], in order, for i < m */
static __global__ void dt__k_join_parts(const double *in, int64_t m, int64_t J, double *out) {
    DT__CU_FOR(i, m) {
        double acc = 0.0;
        for (int64_t j = 0; j < J; j++) acc += in[i * J + j];
        out[i] = acc;
    }
}
/* db[ch] += sum over images of part[i*c + ch], in image order */
static __global__ void dt__k_channel_total(float *db, const double *part, int64_t n, int64_t c) {
    DT__CU_FOR(ch, c) {
        double acc = 0.0;
        for (int64_t i = 0; i < n; i++) acc += part[i * c + ch];
        db[ch] += (float)acc;
    }
}

/* pooling: one thread per output; first maximum wins, NaN propagates (as the CPU and PyTorch) */
template <typename I> static __global__ void dt__k_maxpool_fwd(dt_conv_geom g, const float *x, float *y, int32_t *idx) {
    DT__CU_GEOM(I, g);
    DT__CU_FOR_T(I, o, n * c * oh * ow) {
        I ox = o % ow, oy = (o / ow) % oh, nc = o / (ow * oh);
        int64_t bi;
        y[o] = dt_body_maxpool_window(&g, x + nc * h * w, oy, ox, &bi);
        idx[o] = (int32_t)bi;
    }
    (void)kh; (void)kw; (void)sh; (void)sw; (void)ph; (void)pw;
}
/* dx += dy routed by idx: one thread per input element gathers the outputs whose window holds it, in
   output order (kernel offsets from the last to the first); mode 0 max (where idx names it), 1 average */
template <typename I> static __global__ void dt__k_pool_bwd(int avg, dt_conv_geom g, const float *dy, const int32_t *idx, float *dx) {
    DT__CU_GEOM(I, g);
    const float inv = 1.0f / (float)(kh * kw);
    DT__CU_FOR_T(I, i, n * c * h * w) {
        I ix = i % w, iy = (i / w) % h, nc = i / (w * h);
        float v = dx[i];
        for (I ky = kh - 1; ky >= 0; ky--) {
            I ty = iy + ph - ky, oy = ty / sh;
            if (ty < 0 || ty % sh != 0 || oy >= oh) continue;
            for (I kx = kw - 1; kx >= 0; kx--) {
                I tx = ix + pw - kx, ox = tx / sw, o;
                if (tx < 0 || tx % sw != 0 || ox >= ow) continue;
                o = (nc * oh + oy) * ow + ox;
                if (avg) v += dy[o] * inv;
                else if (idx[o] == (int32_t)(iy * w + ix)) v += dy[o];
            }
        }
        dx[i] = v;
    }
}
static __global__ void dt__k_avgpool_fwd(dt_conv_geom g, const float *x, float *y) {
    int64_t total = g.n * g.c * g.oh * g.ow;
    DT__CU_FOR(o, total) {
        int64_t ox = o % g.ow, oy = (o / g.ow) % g.oh, nc = o / (g.ow * g.oh);
        y[o] = dt_body_avgpool_window(&g, x + nc * g.h * g.w, oy, ox);
    }
}
/* y [n, c] = mean over s of x [n, c, s] */
static __global__ void dt__k_gap_fwd(const float *x, float *y, int64_t nc, int64_t s) {
    DT__CU_FOR(i, nc) {
        float acc = 0.0f;
        for (int64_t k = 0; k < s; k++) acc += x[i * s + k];
        y[i] = acc / (float)s;
    }
}
template <typename I> static __global__ void dt__k_gap_bwd(const float *dy, float *dx, I nc, I s) {
    DT__CU_FOR_T(I, i, nc * s) dx[i] += dy[i / s] / (float)s;
}

/* activations and dropout */
static __global__ void dt__k_relu_fwd(const float *x, float *y, int64_t n) { DT__CU_FOR(i, n) y[i] = dt_body_relu(x[i]); }
static __global__ void dt__k_relu_bwd(const float *y, const float *dy, float *dx, int64_t n) {
    DT__CU_FOR(i, n) dx[i] += y[i] > 0.0f ? dy[i] : 0.0f;
}
static __global__ void dt__k_dropout(const float *x, float *y, float *mask, int64_t n, float p, float keep, uint64_t key) {
    DT__CU_FOR(i, n) {
        mask[i] = dt_body_hash_uniform(key, (uint64_t)i) >= p ? keep : 0.0f;
        y[i] = x[i] * mask[i];
    }
}
static __global__ void dt__k_mul_bwd(const float *dy, const float *mask, float *dx, int64_t n) {
    DT__CU_FOR(i, n) dx[i] += dy[i] * mask[i];
}

/* batchnorm, per channel, from the plane sums of dt__k_plane_sums (cnt = n*s) */
static __global__ void dt__k_bn_mean(const double *part, int64_t n, int64_t c, int64_t cnt, float *save_mean) {
    DT__CU_FOR(ch, c) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += part[i * c + ch];
        save_mean[ch] = (float)(sum / (double)cnt);
    }
}
static __global__ void dt__k_bn_var(const double *part, int64_t n, int64_t c, int64_t cnt, float eps, float momentum,
                                    float *rm, float *rv, const float *save_mean, float *save_invstd) {
    DT__CU_FOR(ch, c) {
        double sq = 0.0, var;
        float mean = save_mean[ch];
        for (int64_t i = 0; i < n; i++) sq += part[i * c + ch];
        var = sq / (double)cnt;
        save_invstd[ch] = (float)(1.0 / sqrt(var + (double)eps));
        rm[ch] = (1.0f - momentum) * rm[ch] + momentum * mean;
        rv[ch] = (1.0f - momentum) * rv[ch] + momentum * (float)(cnt > 1 ? sq / (double)(cnt - 1) : var);
    }
}
static __global__ void dt__k_bn_eval_stats(const float *rm, const float *rv, int64_t c, float eps, float *save_mean,
                                           float *save_invstd) {
    DT__CU_FOR(ch, c) {
        save_mean[ch] = rm[ch];
        save_invstd[ch] = 1.0f / sqrtf(rv[ch] + eps);
    }
}
template <typename I> static __global__ void dt__k_bn_apply(const float *x, float *y, I n, I c, I s, dt__cu_div ds,
                                                            dt__cu_div dc, const float *gamma, const float *beta,
                                                            const float *save_mean, const float *save_invstd) {
    DT__CU_FOR_T(I, i, n * c * s) {
        I q = dt__cu_quot(ds, i), ch = q - dt__cu_quot(dc, q) * c;
        float g = gamma[ch] * save_invstd[ch], b = beta[ch] - save_mean[ch] * g;
        y[i] = x[i] * g + b;
    }
}
/* per (image, channel): sums of dy and of dy * xhat, in double, in J parts a plane (as dt__k_plane_sums) */
template <typename I> static __global__ void dt__k_bn_bwd_sums(const float *x, const float *dy, I n, I c, I s, I J,
                                                               const float *save_mean, const float *save_invstd,
                                                               double *pdy, double *pdyx) {
    DT__CU_FOR_T(I, it, n * c * J) {
        I ic = it / J, j = it % J, ch = ic % c;
        float mean = save_mean[ch], invstd = save_invstd[ch];
        double a = 0.0, b = 0.0;
        for (I k = j; k < s; k += J) {
            float d = dy[ic * s + k];
            a += d;
            b += (double)d * (double)((x[ic * s + k] - mean) * invstd);
        }
        pdy[it] = a;
        pdyx[it] = b;
    }
}
/* per channel: dgamma, dbeta += the sums; coef[ch], coef[c + ch] = their means (training) or 0 */
static __global__ void dt__k_bn_bwd_channel(int training, const double *pdy, const double *pdyx, int64_t n, int64_t c,
                                            int64_t cnt, float *dgamma, float *dbeta, float *coef) {
    DT__CU_FOR(ch, c) {
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t i = 0; i < n; i++) { sdy += pdy[i * c + ch]; sdyx += pdyx[i * c + ch]; }
        dgamma[ch] += (float)sdyx;
        dbeta[ch] += (float)sdy;
        coef[ch] = training ? (float)(sdy / (double)cnt) : 0.0f;
        coef[c + ch] = training ? (float)(sdyx / (double)cnt) : 0.0f;
    }
}
template <typename I> static __global__ void dt__k_bn_bwd_dx(const float *x, const float *dy, float *dx, I n, I c, I s,
                                                             dt__cu_div ds, dt__cu_div dc, const float *gamma,
                                                             const float *save_mean, const float *save_invstd,
                                                             const float *coef) {
    DT__CU_FOR_T(I, i, n * c * s) {
        I q = dt__cu_quot(ds, i), ch = q - dt__cu_quot(dc, q) * c;
        float invstd = save_invstd[ch], gi = gamma[ch] * invstd, xhat = (x[i] - save_mean[ch]) * invstd;
        dx[i] += gi * (dy[i] - coef[ch] - xhat * coef[c + ch]);
    }
}

/* option-A shortcut: y [n, oc, oh, ow] from x [n, c, h, w], (oc - c)/2 zero channels on each side */
template <typename I> static __global__ void dt__k_pad_fwd(const float *x, float *y, I n, I c, I h, I w, I oc,
                                     I stride, I oh, I ow) {
    I lo = (oc - c) / 2;
    DT__CU_FOR_T(I, i, n * oc * oh * ow) {
        I xx = i % ow, yy = (i / ow) % oh, o = (i / (ow * oh)) % oc, ni = i / (ow * oh * oc), ci = o - lo;
        y[i] = (ci >= 0 && ci < c) ? x[((ni * c + ci) * h + yy * stride) * w + xx * stride] : 0.0f;
    }
}
/* one thread per element of dy's unpadded channels; each writes its own element of dx */
template <typename I> static __global__ void dt__k_pad_bwd(const float *dy, float *dx, I n, I c, I h, I w, I oc,
                                     I stride, I oh, I ow) {
    I lo = (oc - c) / 2;
    DT__CU_FOR_T(I, i, n * c * oh * ow) {
        I xx = i % ow, yy = (i / ow) % oh, ci = (i / (ow * oh)) % c, ni = i / (ow * oh * c);
        dx[((ni * c + ci) * h + yy * stride) * w + xx * stride] += dy[((ni * oc + ci + lo) * oh + yy) * ow + xx];
    }
}

/* rows of x [n, k], one thread per row */
static __global__ void dt__k_log_softmax_fwd(const float *x, float *y, int64_t n, int64_t k) {
    DT__CU_FOR(r, n) dt_body_log_softmax_row(x + r * k, y + r * k, k);
}
static __global__ void dt__k_log_softmax_bwd(const float *y, const float *dy, float *dx, int64_t n, int64_t k) {
    DT__CU_FOR(r, n) dt_body_log_softmax_row_bwd(y + r * k, dy + r * k, dx + r * k, k);
}
/* losses: one thread per row (per element for mse) writes its gradient and its term of the sum, which
   dt__cu_sum then adds up in a fixed order. A label outside [0, k) (the model checks them) gives NaN. */
static __global__ void dt__k_softmax_xent(const float *x, const int32_t *labels, int64_t n, int64_t k, float *dx,
                                          double *term) {
    DT__CU_FOR(r, n) term[r] = dt_body_softmax_xent_row(x + r * k, labels[r], k, n, dx + r * k);
}
static __global__ void dt__k_nll(const float *logp, const int32_t *labels, int64_t n, int64_t k, float *dx, double *term) {
    DT__CU_FOR(r, n) {
        int64_t lab = labels[r];
        for (int64_t j = 0; j < k; j++) dx[r * k + j] = j == lab ? -1.0f / (float)n : 0.0f;
        term[r] = (lab >= 0 && lab < k) ? -(double)logp[r * k + lab] : (double)NAN;
    }
}
/* target may be dx (the model passes the target in the gradient buffer): element i reads it, then writes */
static __global__ void dt__k_mse(const float *x, const float *target, int64_t n, float *dx, double *term) {
    DT__CU_FOR(i, n) {
        float d = x[i] - target[i];
        term[i] = (double)d * (double)d;
        dx[i] = 2.0f * d / (float)n;
    }
}
static __global__ void dt__k_correct(const float *x, const int32_t *labels, int64_t n, int64_t k, double *term) {
    DT__CU_FOR(r, n) term[r] = dt_body_argmax_row(x + r * k, k) == (int64_t)labels[r] ? 1.0 : 0.0;
}

/* Sums in a fixed order: part[j] = the sum of chunk j (DT__CU_CHUNK consecutive terms, in order), then
   one thread adds the chunk sums in order. term = xd[i], or xf[i], or xf[i]^2 (square). */
#define DT__CU_CHUNK 4096
static __global__ void dt__k_chunk_sums(const float *xf, const double *xd, int square, int64_t n, double *part) {
    DT__CU_FOR(j, (n + DT__CU_CHUNK - 1) / DT__CU_CHUNK) {
        int64_t lo = j * DT__CU_CHUNK, hi = lo + DT__CU_CHUNK < n ? lo + DT__CU_CHUNK : n;
        double acc = 0.0;
        for (int64_t i = lo; i < hi; i++) {
            double t = xd ? xd[i] : (double)xf[i];
            acc += square ? t * t : t;
        }
        part[j] = acc;
    }
}
static __global__ void dt__k_sum_parts(const double *part, int64_t np, double *out) {
    DT__CU_FOR(t, 1) {
        double acc = 0.0;
        for (int64_t j = 0; j < np; j++) acc += part[j];
        out[t] = acc;
    }
}

/* optimizers: one thread per element */
static __global__ void dt__k_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float momentum, float dampening,
                                 float wd, int nesterov, int first) {
    DT__CU_FOR(i, n) dt_body_sgd_update(p, g, buf, i, lr, momentum, dampening, wd, nesterov, first);
}
static __global__ void dt__k_adam(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                                  float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {
    DT__CU_FOR(i, n) dt_body_adam_update(p, g, m, v, i, lr, beta1, beta2, eps, wd, decoupled, step_size, bc2_sqrt);
}

/* ---- the ops ---------------------------------------------------------------------------------- */

/* Each op starts here: the calling thread's current device becomes the context's. */
static dt_cuda *dt__cu_enter(void *ctx) {
    dt_cuda *cu = (dt_cuda *)ctx;
    DT__CU(cu, cudaSetDevice(cu->device));
    return cu;
}

/* The scratch memory, at least `bytes` (never held across ops); NULL after a failure (kept). */
static void *dt__cu_scratch(dt_cuda *cu, int64_t bytes) {
    void *p = NULL;
    if (bytes <= cu->scratch_bytes) return cu->scratch;
    if (cu->scratch) {   /* earlier ops on the stream may still read it */
        if (DT__CU(cu, cudaStreamSynchronize(cu->stream)) || DT__CU(cu, cudaFree(cu->scratch))) return NULL;
        cu->scratch = NULL;
        cu->scratch_bytes = 0;
    }
    if (DT__CU(cu, cudaMalloc(&p, (size_t)bytes))) return NULL;
    cu->scratch = p;
    cu->scratch_bytes = bytes;
    return p;
}

/* Doubles of workspace dt__cu_sum needs for n terms. */
static int64_t dt__cu_sum_ws(int64_t n) { return (n + DT__CU_CHUNK - 1) / DT__CU_CHUNK + 1; }

/* The sum of n terms (see dt__k_chunk_sums) into *host, on the workspace ws [dt__cu_sum_ws(n)] doubles. */
static void dt__cu_sum(dt_cuda *cu, const float *xf, const double *xd, int64_t n, int square, double *ws, double *host) {
    int64_t np = (n + DT__CU_CHUNK - 1) / DT__CU_CHUNK;
    *host = 0.0;
    if (n <= 0) return;
    DT__CU_LAUNCH(cu, np, dt__k_chunk_sums, (xf, xd, square, n, ws));
    DT__CU_LAUNCH(cu, 1, dt__k_sum_parts, (ws, np, ws + np));
    if (!DT__CU(cu, cudaMemcpyAsync(host, ws + np, sizeof(double), cudaMemcpyDefault, cu->stream)))
        DT__CU(cu, cudaStreamSynchronize(cu->stream));
}

/* Managed memory is never asked for beyond what the GPU has free (less a reserve for cuBLAS and the
   other contexts' scratch): oversubscribed managed memory pages in and out, and can stall the GPU. */
#define DT__CU_RESERVE ((size_t)256 << 20)
static void *dt__cu_alloc(void *ctx, int64_t bytes) {
    dt_cuda *cu = dt__cu_enter(ctx);
    void *p = NULL;
    size_t avail = 0, total = 0;
    cudaError_t e;
    if (bytes <= 0) bytes = 1;
    if (cu->managed) {
        if (DT__CU(cu, cudaMemGetInfo(&avail, &total))) return NULL;
        if ((size_t)bytes + DT__CU_RESERVE > avail) {
            dt_set_error(DT_ERR_OUT_OF_MEMORY, "GPU %d has %lld of its %lld MiB free; %lld MiB more (and a reserve of %lld) "
                         "would oversubscribe its managed memory: use a smaller batch or model", cu->device,
                         (long long)(avail >> 20), (long long)(total >> 20), (long long)(bytes >> 20),
                         (long long)(DT__CU_RESERVE >> 20));
            return NULL;
        }
    }
    e = cu->managed ? cudaMallocManaged(&p, (size_t)bytes, cudaMemAttachGlobal) : cudaMalloc(&p, (size_t)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   /* not sticky: the caller reports the failed allocation */
        dt_set_error(DT_ERR_OUT_OF_MEMORY, "the GPU has no memory for %lld bytes (%s): %s", (long long)bytes,
                     cu->managed ? "cudaMallocManaged" : "cudaMalloc", cudaGetErrorString(e));
        return NULL;
    }
    return p;
}
static void dt__cu_free(void *ctx, void *p) {
    dt_cuda *cu = dt__cu_enter(ctx);
    if (!p) return;
    DT__CU(cu, cudaStreamSynchronize(cu->stream));   /* queued ops may still use it */
    DT__CU(cu, cudaFree(p));
}
/* host <-> backend copies, finished when they return (the host buffer may be reused at once) */
static void dt__cu_memcpy(void *ctx, void *dst, const void *src, int64_t bytes) {
    dt_cuda *cu = dt__cu_enter(ctx);
    if (bytes <= 0 || dst == src) return;
    dt__cu_prof_begin(cu);
    if (!DT__CU(cu, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, cu->stream)))
        DT__CU(cu, cudaStreamSynchronize(cu->stream));
    dt__cu_prof_end(cu, "host copies (upload, download)");
}
static void dt__cu_copy(void *ctx, float *dst, const float *src, int64_t n) {
    dt_cuda *cu = dt__cu_enter(ctx);
    if (n <= 0 || dst == src) return;
    if (dst < src + n && src < dst + n) {   /* cudaMemcpy does not allow overlap; no layer asks for it */
        dt__cu_fail(cu, DT_ERR_INVALID_ARG, __FILE__, __LINE__, "copy: the %lld floats at %p and %p overlap", (long long)n,
                    (const void *)src, (void *)dst);
        return;
    }
    DT__CU(cu, cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)n, cudaMemcpyDefault, cu->stream));
}
static void dt__cu_fill(void *ctx, float *x, int64_t n, float v) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_fill, (x, n, v));
}
static void dt__cu_scale(void *ctx, float *x, int64_t n, float a) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_scale, (x, n, a));
}
static void dt__cu_axpy(void *ctx, float *y, const float *x, int64_t n, float a) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_axpy, (y, x, n, a));
}
static void dt__cu_add(void *ctx, float *y, const float *a, const float *b, int64_t n) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_add, (y, a, b, n));
}

/* Row-major C = alpha op(A) op(B) + beta C on column-major cuBLAS: a row-major matrix with row stride ld
   is, read column-major with leading dimension ld, its transpose. So C^T [N, M] = op(B)^T op(A)^T is one
   column-major GEMM with the operands swapped: A' = B (transposed iff tb), B' = A (transposed iff ta),
   m' = N, n' = M, k' = K, and the row strides as leading dimensions. */
/* Split K: a product with few outputs and a long sum (a convolution's weight gradient: oc x c kh kw outputs,
   a sum over every pixel of the batch) gives cuBLAS too few tiles to fill the GPU. It is computed as P
   products over slices of K into a workspace (one strided-batched call, and one more for a shorter last
   slice), then C = alpha (the slices' sum, in slice order) + beta C. P is fixed by the shape, so the
   result does not vary from run to run. Returns 0 when the shape is not split (or the workspace failed). */
#define DT__CU_SPLIT_MIN_K 8192             /* shorter sums are not split */
#define DT__CU_SPLIT_SLICE 1024             /* at least this many terms a slice */
#define DT__CU_SPLIT_WS ((int64_t)1 << 24)  /* floats of partial products at most */
static __global__ void dt__k_gemm_slices(const float *W, int64_t P, int64_t M, int64_t N, float alpha, float beta, float *C,
                                         int64_t ldc) {
    DT__CU_FOR(i, M * N) {
        float acc = 0.0f, *c = C + (i / N) * ldc + i % N;
        for (int64_t p = 0; p < P; p++) acc += W[p * M * N + i];
        *c = alpha * acc + (beta == 0.0f ? 0.0f : beta * *c);
    }
}
static int dt__cu_gemm_split(dt_cuda *cu, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t P = K / DT__CU_SPLIT_SLICE, Kc, last;
    float one = 1.0f, zero = 0.0f, *W;
    if (K < DT__CU_SPLIT_MIN_K || M * N * 8 > DT__CU_SPLIT_WS) return 0;
    if (P > 64) P = 64;
    if (P * M * N > DT__CU_SPLIT_WS) P = DT__CU_SPLIT_WS / (M * N);   /* at least 8 */
    Kc = (K + P - 1) / P;
    P = (K + Kc - 1) / Kc;
    last = K - (P - 1) * Kc;
    if (!(W = (float *)dt__cu_scratch(cu, (int64_t)sizeof(float) * P * M * N))) return 0;
    /* slice p: op(A)[:, p Kc ..] and op(B)[p Kc .., :]; W_p [M, N] (row-major), as cuBLAS's column-major W_p^T */
    dt__cu_prof_begin(cu);
    if (P > 1)
        DT__CUBLAS(cu, cublasSgemmStridedBatched(cu->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                 (int)N, (int)M, (int)Kc, &one, B, (int)ldb, tb ? Kc : Kc * ldb, A, (int)lda,
                                                 ta ? Kc * lda : Kc, &zero, W, (int)N, M * N, (int)(P - 1)));
    DT__CUBLAS(cu, cublasSgemm(cu->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                               (int)last, &one, B + (P - 1) * (tb ? Kc : Kc * ldb), (int)ldb,
                               A + (P - 1) * (ta ? Kc * lda : Kc), (int)lda, &zero, W + (P - 1) * M * N, (int)N));
    dt__cu_prof_end(cu, "cublasSgemm, K split");
    DT__CU_LAUNCH(cu, M * N, dt__k_gemm_slices, (W, P, M, N, alpha, beta, C, ldc));
    return 1;
}
static void dt__cu_gemm(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                        int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt_cuda *cu = dt__cu_enter(ctx);
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { DT__CU_LAUNCH(cu, M * N, dt__k_gemm_beta, (C, M, N, ldc, beta)); return; }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX) {
        dt__cu_fail(cu, DT_ERR_UNSUPPORTED, __FILE__, __LINE__, "gemm: M %lld, N %lld, K %lld or a row stride exceeds "
                    "cuBLAS's 32-bit sizes", (long long)M, (long long)N, (long long)K);
        return;
    }
    if (dt__cu_gemm_split(cu, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    dt__cu_prof_begin(cu);
    DT__CUBLAS(cu, cublasSgemm(cu->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                               (int)K, &alpha, B, (int)ldb, A, (int)lda, &beta, C, (int)ldc));
    dt__cu_prof_end(cu, "cublasSgemm");
}
static void dt__cu_add_row_bias(void *ctx, float *y, const float *b, int64_t rows, int64_t cols) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, rows * cols, rows * cols, dt__k_add_row_bias, (y, b, rows, cols));
}
static void dt__cu_sum_rows_bwd(void *ctx, float *db, const float *dy, int64_t rows, int64_t cols) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, cols, dt__k_sum_rows, (db, dy, rows, cols));
}
/* the largest element count a convolution's or pooling's indices reach: col, the input or the output */
static int64_t dt__cu_geom_largest(const dt_conv_geom *g) {
    int64_t col = g->c * g->kh * g->kw * g->n * g->oh * g->ow, in = g->n * g->c * g->h * g->w, out = g->n * g->c * g->oh * g->ow;
    return col > in ? (col > out ? col : out) : (in > out ? in : out);
}
static int64_t dt__cu_pad_largest(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t oh, int64_t ow) {
    return n * c * h * w > n * oc * oh * ow ? n * c * h * w : n * oc * oh * ow;
}
static dt__cu_im2col_div dt__cu_im2col_divs(const dt_conv_geom *g) {
    dt__cu_im2col_div D;
    D.NS = dt__cu_div_of(g->n * g->oh * g->ow); D.S = dt__cu_div_of(g->oh * g->ow); D.ow = dt__cu_div_of(g->ow);
    D.khw = dt__cu_div_of(g->kh * g->kw); D.kw = dt__cu_div_of(g->kw);
    return D;
}
static dt__cu_col2im_div dt__cu_col2im_divs(const dt_conv_geom *g) {
    dt__cu_col2im_div D;
    D.w = dt__cu_div_of(g->w); D.h = dt__cu_div_of(g->h); D.c = dt__cu_div_of(g->c);
    D.sh = dt__cu_div_of(g->sh); D.sw = dt__cu_div_of(g->sw);
    return D;
}
static void dt__cu_im2col(void *ctx, const dt_conv_geom *g, const float *x, float *col) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, g->c * g->kh * g->kw * g->n * g->oh * g->ow, dt__cu_geom_largest(g), dt__k_im2col, (*g, dt__cu_im2col_divs(g), x, col));
}
static void dt__cu_col2im_bwd(void *ctx, const dt_conv_geom *g, const float *col, float *dx) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, g->n * g->c * g->h * g->w, dt__cu_geom_largest(g), dt__k_col2im, (*g, dt__cu_col2im_divs(g), col, dx));
}
static void dt__cu_cs_to_ncs(void *ctx, float *y, const float *t, const float *b, int64_t n, int64_t c, int64_t s) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, n * c * s, n * c * s, dt__k_cs_to_ncs, (y, t, b, n, c, s, dt__cu_div_of(s), dt__cu_div_of(c)));
}
static void dt__cu_ncs_to_cs(void *ctx, float *t, const float *y, int64_t n, int64_t c, int64_t s) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, n * c * s, n * c * s, dt__k_ncs_to_cs, (t, y, n, c, s, dt__cu_div_of(s), dt__cu_div_of(c)));
}
/* Parts a plane of s elements is summed in: DT__CU_PARTS when the plane is long, else 1 (a thread a plane). */
#define DT__CU_PARTS 32
static int64_t dt__cu_parts(int64_t s) { return s >= 4 * DT__CU_PARTS ? DT__CU_PARTS : 1; }

/* part [n c] = the per-plane sums of dt__k_plane_sums in mode `mode`; ws: n c dt__cu_parts(s) doubles of
   workspace (unused when that is 1, and in mode 2) */
static void dt__cu_plane_sums(dt_cuda *cu, const float *x, const float *center, int mode, int64_t n, int64_t c, int64_t s,
                              double *ws, double *part) {
    int64_t J = mode == 2 ? 1 : dt__cu_parts(s);
    DT__CU_LAUNCH_IX(cu, n * c * J, n * c * (s > J ? s : J), dt__k_plane_sums, (x, center, mode, n, c, s, J, J > 1 ? ws : part));
    if (J > 1) DT__CU_LAUNCH(cu, n * c, dt__k_join_parts, (ws, n * c, J, part));
}
static void dt__cu_channel_sum_bwd(void *ctx, float *db, const float *dy, int64_t n, int64_t c, int64_t s) {
    dt_cuda *cu = dt__cu_enter(ctx);
    double *part = (double *)dt__cu_scratch(cu, (int64_t)sizeof(double) * n * c);
    if (!part || n * c <= 0) return;
    dt__cu_plane_sums(cu, dy, (const float *)NULL, 2, n, c, s, NULL, part);
    DT__CU_LAUNCH(cu, c, dt__k_channel_total, (db, part, n, c));
}
static void dt__cu_maxpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y, int32_t *idx) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, g->n * g->c * g->oh * g->ow, dt__cu_geom_largest(g), dt__k_maxpool_fwd, (*g, x, y, idx));
}
static void dt__cu_maxpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, const int32_t *idx, float *dx) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, g->n * g->c * g->h * g->w, dt__cu_geom_largest(g), dt__k_pool_bwd, (0, *g, dy, idx, dx));
}
static void dt__cu_avgpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, g->n * g->c * g->oh * g->ow, dt__k_avgpool_fwd, (*g, x, y));
}
static void dt__cu_avgpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, float *dx) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, g->n * g->c * g->h * g->w, dt__cu_geom_largest(g), dt__k_pool_bwd, (1, *g, dy, (const int32_t *)NULL, dx));
}
static void dt__cu_gap_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t s) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n * c, dt__k_gap_fwd, (x, y, n * c, s));
}
static void dt__cu_gap_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t s) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH_IX(cu, n * c * s, n * c * s, dt__k_gap_bwd, (dy, dx, n * c, s));
}
static void dt__cu_relu_fwd(void *ctx, const float *x, float *y, int64_t n) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_relu_fwd, (x, y, n));
}
static void dt__cu_relu_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_relu_bwd, (y, dy, dx, n));
}
static void dt__cu_dropout_fwd(void *ctx, const float *x, float *y, float *mask, int64_t n, float p, uint64_t key) {
    dt_cuda *cu = dt__cu_enter(ctx);
    float keep = 1.0f / (1.0f - p);   /* computed as the CPU computes it */
    DT__CU_LAUNCH(cu, n, dt__k_dropout, (x, y, mask, n, p, keep, key));
}
static void dt__cu_mul_bwd(void *ctx, const float *dy, const float *mask, float *dx, int64_t n) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_mul_bwd, (dy, mask, dx, n));
}

/* Training: mean and biased variance from per-plane sums in double (two passes, as the CPU), running
   statistics with the unbiased variance; eval: the running statistics. Then y = x g + b per channel. */
static void dt__cu_bn_fwd(void *ctx, int training, const float *x, float *y, int64_t n, int64_t c, int64_t s,
                          const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                          float *save_mean, float *save_invstd) {
    dt_cuda *cu = dt__cu_enter(ctx);
    if (n * c * s <= 0) return;
    if (training) {
        double *part = (double *)dt__cu_scratch(cu, (int64_t)sizeof(double) * n * c * (1 + dt__cu_parts(s)));
        if (!part) return;
        dt__cu_plane_sums(cu, x, (const float *)NULL, 0, n, c, s, part + n * c, part);
        DT__CU_LAUNCH(cu, c, dt__k_bn_mean, (part, n, c, n * s, save_mean));
        dt__cu_plane_sums(cu, x, save_mean, 1, n, c, s, part + n * c, part);
        DT__CU_LAUNCH(cu, c, dt__k_bn_var, (part, n, c, n * s, eps, momentum, rm, rv, save_mean, save_invstd));
    } else {
        DT__CU_LAUNCH(cu, c, dt__k_bn_eval_stats, (rm, rv, c, eps, save_mean, save_invstd));
    }
    DT__CU_LAUNCH_IX(cu, n * c * s, n * c * s, dt__k_bn_apply, (x, y, n, c, s, dt__cu_div_of(s), dt__cu_div_of(c), gamma, beta, save_mean, save_invstd));
}
static void dt__cu_bn_bwd(void *ctx, int training, const float *x, const float *dy, float *dx, int64_t n, int64_t c,
                          int64_t s, const float *gamma, const float *save_mean, const float *save_invstd, float *dgamma,
                          float *dbeta) {
    dt_cuda *cu = dt__cu_enter(ctx);
    double *pdy, *parts;
    float *coef;
    int64_t J, sums;
    if (n * c * s <= 0) return;
    /* scratch: per-plane sums of dy and dy * xhat [n c] doubles each, their parts [n c J] each (J > 1), then
       the two means [2 c] floats */
    J = dt__cu_parts(s);
    sums = 2 * n * c * (J > 1 ? 1 + J : 1);
    pdy = (double *)dt__cu_scratch(cu, (int64_t)sizeof(double) * sums + (int64_t)sizeof(float) * 2 * c);
    if (!pdy) return;
    coef = (float *)(pdy + sums);
    parts = J > 1 ? pdy + 2 * n * c : pdy;   /* J == 1: the parts are the sums */
    DT__CU_LAUNCH_IX(cu, n * c * J, n * c * s, dt__k_bn_bwd_sums, (x, dy, n, c, s, J, save_mean, save_invstd, parts, parts + n * c * J));
    if (J > 1) {
        DT__CU_LAUNCH(cu, n * c, dt__k_join_parts, (parts, n * c, J, pdy));
        DT__CU_LAUNCH(cu, n * c, dt__k_join_parts, (parts + n * c * J, n * c, J, pdy + n * c));
    }
    DT__CU_LAUNCH(cu, c, dt__k_bn_bwd_channel, (training, pdy, pdy + n * c, n, c, n * s, dgamma, dbeta, coef));
    if (dx) DT__CU_LAUNCH_IX(cu, n * c * s, n * c * s, dt__k_bn_bwd_dx, (x, dy, dx, n, c, s, dt__cu_div_of(s), dt__cu_div_of(c), gamma, save_mean, save_invstd, coef));
}
static void dt__cu_pad_shortcut_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t h, int64_t w,
                                    int64_t oc, int64_t stride) {
    dt_cuda *cu = dt__cu_enter(ctx);
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    DT__CU_LAUNCH_IX(cu, n * oc * oh * ow, dt__cu_pad_largest(n, c, h, w, oc, oh, ow), dt__k_pad_fwd, (x, y, n, c, h, w, oc, stride, oh, ow));
}
static void dt__cu_pad_shortcut_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t h, int64_t w,
                                    int64_t oc, int64_t stride) {
    dt_cuda *cu = dt__cu_enter(ctx);
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    DT__CU_LAUNCH_IX(cu, n * c * oh * ow, dt__cu_pad_largest(n, c, h, w, oc, oh, ow), dt__k_pad_bwd, (dy, dx, n, c, h, w, oc, stride, oh, ow));
}
static void dt__cu_log_softmax_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t k) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_log_softmax_fwd, (x, y, n, k));
}
static void dt__cu_log_softmax_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n, int64_t k) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_log_softmax_bwd, (y, dy, dx, n, k));
}

/* Scratch for `terms` per-row (or per-element) terms and their sum's workspace: the terms come first. */
static double *dt__cu_terms(dt_cuda *cu, int64_t terms) {
    return (double *)dt__cu_scratch(cu, (int64_t)sizeof(double) * (terms + dt__cu_sum_ws(terms)));
}
static void dt__cu_softmax_xent(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, float *dx,
                                float *loss) {
    dt_cuda *cu = dt__cu_enter(ctx);
    double *term = dt__cu_terms(cu, n), total = 0.0;
    *loss = NAN;
    if (!term || n <= 0) return;
    DT__CU_LAUNCH(cu, n, dt__k_softmax_xent, (x, labels, n, k, dx, term));
    dt__cu_sum(cu, NULL, term, n, 0, term + n, &total);
    *loss = (float)(total / (double)n);
}
static void dt__cu_nll(void *ctx, const float *logp, const int32_t *labels, int64_t n, int64_t k, float *dx, float *loss) {
    dt_cuda *cu = dt__cu_enter(ctx);
    double *term = dt__cu_terms(cu, n), total = 0.0;
    *loss = NAN;
    if (!term || n <= 0) return;
    DT__CU_LAUNCH(cu, n, dt__k_nll, (logp, labels, n, k, dx, term));
    dt__cu_sum(cu, NULL, term, n, 0, term + n, &total);
    *loss = (float)(total / (double)n);
}
static void dt__cu_mse(void *ctx, const float *x, const float *target, int64_t n, float *dx, float *loss) {
    dt_cuda *cu = dt__cu_enter(ctx);
    double *term = dt__cu_terms(cu, n), total = 0.0;
    *loss = NAN;
    if (!term || n <= 0) return;
    DT__CU_LAUNCH(cu, n, dt__k_mse, (x, target, n, dx, term));
    dt__cu_sum(cu, NULL, term, n, 0, term + n, &total);
    *loss = (float)(total / (double)n);
}
static void dt__cu_count_correct(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, int64_t *correct) {
    dt_cuda *cu = dt__cu_enter(ctx);
    double *term = dt__cu_terms(cu, n), total = 0.0;
    *correct = 0;
    if (!term || n <= 0) return;
    DT__CU_LAUNCH(cu, n, dt__k_correct, (x, labels, n, k, term));
    dt__cu_sum(cu, NULL, term, n, 0, term + n, &total);
    *correct = (int64_t)(total + 0.5);   /* a sum of ones and zeros, exact in double */
}
static void dt__cu_sum_squares(void *ctx, const float *x, int64_t n, double *out) {
    dt_cuda *cu = dt__cu_enter(ctx);
    double *ws = (double *)dt__cu_scratch(cu, (int64_t)sizeof(double) * dt__cu_sum_ws(n));
    *out = 0.0;
    if (ws) dt__cu_sum(cu, x, NULL, n, 1, ws, out);
}
static void dt__cu_sgd_step(void *ctx, float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                            float dampening, float wd, int nesterov, int first) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_sgd, (p, g, buf, n, lr, momentum, dampening, wd, nesterov, first));
}
static void dt__cu_adam_step(void *ctx, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU_LAUNCH(cu, n, dt__k_adam, (p, g, m, v, n, lr, beta1, beta2, eps, wd, decoupled, step_size, bc2_sqrt));
}
static dt_result dt__cu_sync(void *ctx) {
    dt_cuda *cu = dt__cu_enter(ctx);
    DT__CU(cu, cudaStreamSynchronize(cu->stream));
    if (cu->err != DT_OK) return dt_set_error(cu->err, "%s", cu->msg);
    return DT_OK;
}

static const dt_ops dt__cuda_ops_table = {
    "cuda",
    dt__cu_alloc, dt__cu_free, dt__cu_memcpy, dt__cu_memcpy, dt__cu_copy,
    dt__cu_fill, dt__cu_scale, dt__cu_axpy, dt__cu_add,
    dt__cu_gemm, dt__cu_add_row_bias, dt__cu_sum_rows_bwd,
    dt__cu_im2col, dt__cu_col2im_bwd, dt__cu_cs_to_ncs, dt__cu_ncs_to_cs, dt__cu_channel_sum_bwd,
    dt__cu_maxpool_fwd, dt__cu_maxpool_bwd, dt__cu_avgpool_fwd, dt__cu_avgpool_bwd,
    dt__cu_gap_fwd, dt__cu_gap_bwd,
    dt__cu_relu_fwd, dt__cu_relu_bwd,
    dt__cu_dropout_fwd, dt__cu_mul_bwd,
    dt__cu_bn_fwd, dt__cu_bn_bwd,
    dt__cu_pad_shortcut_fwd, dt__cu_pad_shortcut_bwd,
    dt__cu_log_softmax_fwd, dt__cu_log_softmax_bwd,
    dt__cu_softmax_xent, dt__cu_nll, dt__cu_mse, dt__cu_count_correct,
    dt__cu_sum_squares, dt__cu_sgd_step, dt__cu_adam_step,
    dt__cu_sync,
    NULL, NULL, NULL,  /* conv_gemm_fwd, conv_gemm_wgrad, conv_gemm_dgrad: im2col or col2im, and cuBLAS */
    NULL, NULL,        /* conv_fwd, conv_bwd: the same */
    NULL, NULL, NULL, NULL,  /* bn_relu_*, add_relu_*: the layers one by one */
    NULL, NULL               /* bn_sums, bn_affine_acc: no synchronised batch norm on the GPU yet */
};

/* ---- contexts --------------------------------------------------------------------------------- */

/* GPUs usable, and CUDA's reason when there are none. */
static int dt__cu_count(const char **why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    *why = "the driver reports none";
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   /* no driver or no device: an answer, not a failure */
        *why = cudaGetErrorString(e);
        return 0;
    }
    return n;
}

int dt_cuda_device_count(void) {
    const char *why;
    return dt__cu_count(&why);
}

const dt_ops *dt_cuda_ops(void) { return &dt__cuda_ops_table; }

/* the profile's table on stderr, largest time first (dt__cu_prof_end) */
static void dt__cu_prof_print(dt_cuda *cu) {
    double total = 0.0;
    int i, j;
    for (i = 0; i < cu->nprof; i++) total += cu->prof[i].ms;
    fprintf(stderr, "dt_cuda profile, GPU %d (%s): %.3f ms busy\n%-44s %9s %11s %7s\n", cu->device, cu->name, total,
            "kernel, GEMM or copy", "calls", "ms", "share");
    for (i = 0; i < cu->nprof; i++) {
        int best = i;
        for (j = i + 1; j < cu->nprof; j++)
            if (cu->prof[j].ms > cu->prof[best].ms) best = j;
        if (best != i) { char t[sizeof cu->prof[0]]; memcpy(t, &cu->prof[i], sizeof t); cu->prof[i] = cu->prof[best];
                         memcpy(&cu->prof[best], t, sizeof t); }
        fprintf(stderr, "%-44s %9lld %11.3f %6.1f%%\n", cu->prof[i].name, (long long)cu->prof[i].calls, cu->prof[i].ms,
                total > 0.0 ? 100.0 * cu->prof[i].ms / total : 0.0);
    }
}
void dt_cuda_destroy(dt_cuda *cu) {
    if (!cu) return;
    (void)cudaSetDevice(cu->device);
    if (cu->stream) (void)cudaStreamSynchronize(cu->stream);
    if (cu->profile) dt__cu_prof_print(cu);
#ifndef DT_CUDA_EMULATE
    if (cu->ev0) (void)cudaEventDestroy(cu->ev0);
    if (cu->ev1) (void)cudaEventDestroy(cu->ev1);
#endif
    if (cu->scratch) (void)cudaFree(cu->scratch);
    if (cu->blas) (void)cublasDestroy(cu->blas);
    if (cu->stream) (void)cudaStreamDestroy(cu->stream);
    (void)cudaGetLastError();
    DT_FREE(cu);
}

dt_result dt_cuda_create(dt_cuda **out, const dt_cuda_desc *desc) {
    dt_cuda *cu;
    struct cudaDeviceProp prop;
    const char *why, *env;
    int count, device = 0, concurrent = 0, device_memory = 0;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_cuda_create: out is NULL");
    *out = NULL;
    if (desc) device = desc->device, device_memory = desc->device_memory;
    else {
        if ((env = getenv("DT_CUDA_DEVICE")) != NULL && *env) {
            char *end;
            long v = strtol(env, &end, 10);
            if (*end || v < 0 || v > INT_MAX)
                return dt_set_error(DT_ERR_INVALID_ARG, "dt_cuda_create: DT_CUDA_DEVICE is '%s'; it must be a GPU index (0, 1, ...)", env);
            device = (int)v;
        }
        if ((env = getenv("DT_CUDA_MEMORY")) != NULL && *env) {
            if (!strcmp(env, "device")) device_memory = 1;
            else if (strcmp(env, "managed"))
                return dt_set_error(DT_ERR_INVALID_ARG, "dt_cuda_create: DT_CUDA_MEMORY is '%s'; it must be 'managed' (the "
                                    "default) or 'device' (plain device memory, for programs that use no trainer)", env);
        }
    }
    count = dt__cu_count(&why);
    if (count == 0)
        return dt_set_error(DT_ERR_UNSUPPORTED, "dt_cuda_create: no CUDA GPU is usable (%s); this program was built for the "
                            "GPU (DT_USE_CUDA): run it on a machine with an NVIDIA GPU and its driver, or build it without "
                            "CUDA=1", why);
    if (device < 0 || device >= count)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_cuda_create: there is no GPU %d; this machine has %d (0 to %d)", device,
                            count, count - 1);
    cu = (dt_cuda *)DT_MALLOC(sizeof *cu);
    if (!cu) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_cuda_create: no memory");
    memset(cu, 0, sizeof *cu);
    cu->device = device;
    cu->managed = !device_memory;
    memset(&prop, 0, sizeof prop);
    if (!DT__CU(cu, cudaSetDevice(device)) && !DT__CU(cu, cudaGetDeviceProperties(&prop, device)) &&
        !DT__CU(cu, cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device))) {
        snprintf(cu->name, sizeof cu->name, "%s", prop.name);
        if (cu->managed && !concurrent)
            dt__cu_fail(cu, DT_ERR_UNSUPPORTED, __FILE__, __LINE__, "GPU %d (%s) cannot share managed memory with the CPU "
                        "while it computes (cudaDevAttrConcurrentManagedAccess is 0, e.g. on Windows); set "
                        "dt_cuda_desc.device_memory = 1 for a program that uses no trainer", device, cu->name);
        else if (!DT__CU(cu, cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) &&
                 !DT__CUBLAS(cu, cublasCreate(&cu->blas)) && !DT__CUBLAS(cu, cublasSetStream(cu->blas, cu->stream)))
            DT__CUBLAS(cu, cublasSetMathMode(cu->blas, CUBLAS_DEFAULT_MATH));   /* full FP32: no TF32 */
#ifndef DT_CUDA_EMULATE
        env = getenv("DT_CUDA_PROFILE");
        if (cu->err == DT_OK && env && *env && strcmp(env, "0") && !DT__CU(cu, cudaEventCreate(&cu->ev0)) &&
            !DT__CU(cu, cudaEventCreate(&cu->ev1)))
            cu->profile = 1;
#endif
    }
    if (cu->err != DT_OK) {
        dt_result r = dt_set_error(cu->err, "dt_cuda_create on GPU %d: %s", device, cu->msg);
        dt_cuda_destroy(cu);
        return r;
    }
    *out = cu;
    return DT_OK;
}

dt_result dt_cuda_sync(dt_cuda *cu) {
    if (!cu) return dt_set_error(DT_ERR_INVALID_ARG, "dt_cuda_sync: context is NULL");
    return dt__cu_sync(cu);
}
int dt_cuda_device(const dt_cuda *cu) { return cu ? cu->device : -1; }
const char *dt_cuda_device_name(const dt_cuda *cu) { return cu ? cu->name : ""; }

/* the registered default backend (dt_cuda_backend): a model's own context, on the environment's GPU */
static dt_result dt__cu_ctx_create(void **ctx) {
    dt_cuda *cu = NULL;
    dt_result r = dt_cuda_create(&cu, NULL);
    *ctx = cu;
    return r;
}
static void dt__cu_ctx_destroy(void *ctx) { dt_cuda_destroy((dt_cuda *)ctx); }
const dt_backend *dt_cuda_backend(void) {
    static const dt_backend backend = {dt_cuda_ops, dt__cu_ctx_create, dt__cu_ctx_destroy};
    return &backend;
}

#endif /* the implementation */
