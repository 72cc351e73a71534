/* dtrain.h - header-only C library for distributed training of neural networks.   v0.1.0
   MIT license (see the end of this file).

   WHAT IT IS
     One header that gives a C program float32 tensors, layers with forward and backward passes, losses
     and a small model zoo, built on flat parameter buffers so that every distributed algorithm becomes a
     vector operation on one array.

   HOW TO INCLUDE
     In exactly one C (or C++) file of your project:
         #define DTRAIN_IMPLEMENTATION
         #include "dtrain.h"
     Everywhere else just #include "dtrain.h". Compile with -fopenmp to use every core (optional: without
     OpenMP the same code runs on one thread). Link with -lm.

   QUICK START
         dt_model *m;
         dt_model_desc d = {0};
         d.in_c = 1; d.in_h = 28; d.in_w = 28;          // per-sample input shape (C, H, W)
         d.seed = 42;
         if (dt_model_create(&m, &d) != DT_OK) { puts(dt_last_error()); return 1; }
         int x = dt_model_input(m);
         x = dt_conv2d(m, x, 16, 3, 1, 1);             // out channels, kernel, stride, padding
         x = dt_relu(m, x);
         x = dt_maxpool2d(m, x, 2, 2, 0);
         x = dt_flatten(m, x);
         x = dt_linear(m, x, 10, 1);
         if (dt_model_finalize(m) != DT_OK) { puts(dt_last_error()); dt_model_destroy(m); return 1; }
                                                       // ^ plans the flat buffers, initialises weights
         float loss;
         dt_model_forward(m, images, batch);           // images: [batch, 1, 28, 28] floats
         dt_model_loss_cross_entropy(m, labels, &loss); // labels: [batch] int32
         dt_model_zero_grad(m);
         dt_model_backward(m, NULL);                   // gradients accumulate into dt_model_grads(m, NULL)
         dt_model_destroy(m);
     README.md's quick start is a whole program: a model trained by an optimizer and DDP on N ranks.

   DISTRIBUTED QUICK START
         static dt_result rank_main(dt_comm *c, void *arg) {    // runs once per rank
             float g[1000] = {0};                               // e.g. this rank's gradient
             g[0] = (float)dt_comm_rank(c);
             (void)arg;                                         // dt_launch's last argument
             return dt_comm_allreduce(c, g, 1000, DT_F32, DT_MEAN, DT_ALGO_AUTO);   // collective
         }
         int main(int argc, char **argv) {
             dt_launch_desc ld = {0};
             if (dt_launch_parse(&argc, argv, &ld) != DT_OK) return 2;   // takes --ranks N etc. out of argv
             return dt_launch(&ld, rank_main, NULL);   // N threads here; one rank per process under mpiexec
         }
     ./prog --ranks 4 runs four ranks as threads of one process (the local backend). Built with mpicc
     -DDT_USE_MPI, mpiexec -n 4 ./prog runs the same source on MPI (dtrain_mpi.h).

   CONFIGURATION MACROS (define before the implementation include; DT_USE_MPI and DT_USE_CUDA for every
   file, e.g. with -D on the command line)
     | macro                    | default          | meaning                                          |
     |--------------------------|------------------|--------------------------------------------------|
     | DTRAIN_IMPLEMENTATION    | undefined        | emit the implementation in this file             |
     | DT_MALLOC(n)             | malloc(n)        | allocator hooks: define all three or none        |
     | DT_REALLOC(p, n)         | realloc(p, n)    |                                                  |
     | DT_FREE(p)               | free(p)          |                                                  |
     | DT_CONV_WORKSPACE        | 1 << 24          | elements of im2col workspace per convolution     |
     |                          |                  | chunk; larger = fewer, bigger GEMMs              |
     | DT_NO_OPENMP             | undefined        | ignore OpenMP even when compiling with -fopenmp  |
     | DT_NO_THREADS            | undefined        | no POSIX threads: loaders need prefetch = 0, one |
     |                          |                  | local rank only, DDP does not overlap, Hogwild's |
     |                          |                  | workers run one after another                    |
     | DT_NO_SIMD               | undefined        | no AVX2 or AVX-512 kernels: the portable C ones  |
     | DT_USE_ZLIB              | undefined        | gzip-compressed IDX files (zlib); link -lz       |
     | DT_USE_STB_IMAGE         | undefined        | image folders: stb_image decodes, stb_image_     |
     |                          |                  | resize resizes; link -lstb (Debian libstb-dev)   |
     | DT_MNIST_DEFAULT_DIR     | "/usr/share/     | what dt_dataset_load_mnist_dir reads for dir     |
     |                          | datasets/fashion-| NULL (Debian's dataset-fashion-mnist)            |
     |                          | mnist"           |                                                  |
     | DT_IMAGE_MAX_PIXELS      | 1 << 26          | largest image (w * h) an image folder may hold   |
     | DT_USE_MPI               | undefined        | include dtrain_mpi.h (the MPI backend) and let   |
     |                          |                  | dt_launch use MPI under mpiexec; build with mpicc|
     | DT_USE_CUDA              | undefined        | include dtrain_cuda.h (the GPU backend): models  |
     |                          |                  | whose desc.ops is NULL run on the GPU; link      |
     |                          |                  | dtrain_cuda.cu's object (nvcc), -lcublas -lcudart|
   The environment variable DT_COMM_TIMEOUT (seconds) sets the default communicator timeout (300 s).
   dtrain_cuda.h's DTRAIN_CUDA_IMPLEMENTATION, DT_CUDA_EMULATE and DT_CUDA_DEVICE are in its own manual.

   OPTIONAL FEATURES AND POSIX
     Without DT_USE_ZLIB and DT_USE_STB_IMAGE the header needs nothing but the C library; a .gz file or an
     image folder then fails with DT_ERR_UNSUPPORTED naming the macro to build with. DT_USE_ZLIB includes
     <zlib.h>. DT_USE_STB_IMAGE includes <stb/stb_image.h> and <stb/stb_image_resize.h> but not their
     implementations (Debian's -lstb holds them; with your own copies, compile them once with
     STB_IMAGE_IMPLEMENTATION and STB_IMAGE_RESIZE_IMPLEMENTATION), and lists directories with POSIX
     opendir/readdir/stat from <dirent.h> and <sys/stat.h>. Those headers declare these functions without a
     feature-test macro (glibc, musl, macOS, the BSDs), so dtrain.h defines none and does not depend on what
     the including file defined or included first; where a system wants one, pass -D_POSIX_C_SOURCE=200809L.
     Windows has no <dirent.h>: leave DT_USE_STB_IMAGE undefined there.

   MEMORY OWNERSHIP
     Whoever creates, destroys: dt_model_create / dt_model_destroy. A model owns three flat allocations
     (parameters, gradients, non-trainable buffers) planned once by dt_model_finalize, and an activation
     arena sized for the largest batch seen (grown outside the steady state, never inside it). Pointers
     returned by dt_model_params() and friends stay valid until dt_model_destroy. Nothing is freed by a
     function that did not allocate it. The same holds for every object: dt_X_create allocates and
     dt_X_destroy frees (optim, loader, comm, ddp, dpsgd, localsgd, fed; destroy accepts NULL); dataset
     loaders fill a dt_dataset that dt_dataset_free empties, partitioners a dt_partition for
     dt_partition_free, dt_topology_create a dt_topology for dt_topology_free. Pointers in a *_desc are
     borrowed (they must outlive the object) or copied at create, as each field's comment says.

   ERRORS
     Fallible functions return dt_result (DT_OK == 0). dt_result_str(r) names the code; dt_last_error()
     returns a message for the last failure on the calling thread, naming the cause and, when known, the
     fix. The library never calls exit() and never aborts on bad user input. Builder calls (dt_conv2d, ...)
     return a node id, or -1 after an error; the error is also kept in the model and returned by
     dt_model_finalize, so a chain of builder calls needs one check at the end.

   THREADS AND RANKS
     There is no global mutable state except the logger, which is configuration set once before
     threads start. Each thread (each local rank) owns its models; a model must not be used by two threads
     at once. The last-error message is per thread. Kernels use OpenMP inside one call.
     A loader with prefetch = 1 owns one background thread (POSIX threads: compile with -pthread) that
     converts the next batch while the caller trains on the current one; it only reads the dataset, which
     must not change while the loader lives, and it converts on one OpenMP thread. The batches are the same
     with prefetch = 0, which converts on the calling thread and is what a build without threads uses
     (define DT_NO_THREADS; then prefetch = 1 fails with DT_ERR_UNSUPPORTED).

     Ranks: dt_launch runs a rank function on N ranks. Local ranks are threads; each owns its models,
     optimizers and data and shares nothing with the others but its communicator (dt_comm), which must be
     used by its own thread only. Each local rank gets cores / ranks OpenMP threads (--threads-per-rank).
     Waiting ranks sleep rather than spin when there are more ranks than cores. Every wait ends by the
     communicator's timeout: a rank that fails, returns or stops calling makes the others fail with
     DT_ERR_PEER or DT_ERR_TIMEOUT naming the operation, its sequence number and the missing ranks, and
     ranks that call different collectives get DT_ERR_MISMATCH. A communicator that failed stays failed.
     Logging: rank 0's lines are the log; other ranks' warnings and errors are shown prefixed "[rank r]"
     (all their lines with --log-all-ranks). Timeline: with --trace PATH (dt_launch_desc.trace_path) every
     rank records spans of its compute and communication, written to PATH as a Chrome trace (JSON) for
     https://ui.perfetto.dev when the ranks finish; dt_trace_begin/dt_trace_end add the program's own.

   BACKENDS
     Layers call a table of backend operations (dt_ops) and never loop over elements themselves. The CPU
     table, dt_cpu_ops(), is in this file; another backend supplies another table in dt_model_desc: the GPU's
     is dt_cuda_ops() (dtrain_cuda.h: CUDA kernels and cuBLAS), the default in builds with DT_USE_CUDA.
     Communication has its own table (dt_comm_backend): self (one rank), local (threads, here) and mpi
     (dtrain_mpi.h). The collective algorithms (naive, ring, tree) are written once over its point-to-point
     calls, so they behave and round the same on every backend; NATIVE uses the backend's own.

   VERSION
     DT_VERSION_MAJOR, DT_VERSION_MINOR, DT_VERSION_PATCH (integers) and DT_VERSION_STRING ("0.1.0") are
     this release's version, which the first line of each of the three headers repeats: take dtrain.h,
     dtrain_mpi.h and dtrain_cuda.h from the same release. The library is compiled into the program, so
     the version matters at compile time only: #if DT_VERSION_MAJOR > 0 || DT_VERSION_MINOR >= 2 keeps
     code that needs release 0.2 from older ones. Versioning is semantic: a patch release changes no
     declaration; a minor release adds functions, constants and *_desc fields (zero keeps the old
     behaviour) and changes or removes nothing; a major release may change or remove declarations. While
     MAJOR is 0 (now), a minor release may change declarations too. Files have versions of their own: a
     checkpoint records its format version, and one of another format version is refused, naming both
     (DT_ERR_FORMAT).

   TABLE OF CONTENTS (declarations and implementation follow the same order)
     1. base     results and errors, allocator hooks, logging, RNG, timers
     2. tensor   tensor views, the backend ops table, GEMM and its naive twin, im2col/col2im
     3. nn       model graph on flat buffers, layers, losses, model zoo
     4. optim    SGD, Adam, AdamW over the flat buffers; gradient clipping; learning-rate schedules
     5. data     datasets (IDX, CIFAR-10, image folders), transforms, partitioners, the loader
     6. comm     gossip topologies; the communicator: point-to-point, collectives and their algorithms,
                 the self and local backends, faults and counters; the launcher
     7. train    evaluation, checkpoints, and the trainers: local SGD and Hogwild, DDP (gradient averaging
                 by five methods, buckets overlapped with backward, accumulation, uneven data), D-PSGD
                 (gossip through a mixing matrix), FedAvg (server and clients, robust aggregation, attacks)
*/
#ifndef DTRAIN_H
#define DTRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_VERSION_MAJOR 0
#define DT_VERSION_MINOR 1
#define DT_VERSION_PATCH 0
#define DT_VERSION_STRING "0.1.0"

/* ============================================================================================== */
/* 1. base                                                                                        */
/* ============================================================================================== */

/* Result of every fallible call. DT_OK is zero. */
typedef enum dt_result {
    DT_OK = 0,
    DT_ERR_INVALID_ARG,   /* a NULL where a buffer is needed, a zero or negative size, a bad flag */
    DT_ERR_SHAPE,         /* tensor shapes that do not fit together */
    DT_ERR_OUT_OF_MEMORY, /* an allocation failed */
    DT_ERR_STATE,         /* a call in the wrong order (e.g. forward before finalize) */
    DT_ERR_IO,            /* a file could not be opened, read or written */
    DT_ERR_FORMAT,        /* a file's content is corrupt or of the wrong kind */
    DT_ERR_NUMERIC,       /* NaN or infinity where a finite number is required */
    DT_ERR_UNSUPPORTED,   /* valid request this build or backend cannot serve */
    DT_ERR_TIMEOUT,       /* a rank waited longer than the communicator's timeout for another */
    DT_ERR_PEER,          /* another rank failed or left, so this operation cannot complete */
    DT_ERR_MISMATCH,      /* ranks made different collective calls (kind, order, count, type, op, root) */
    DT_ERR_COMM,          /* the transport failed (e.g. an MPI error, with MPI's message) */
    DT_ERR_DEVICE,        /* the GPU or its libraries failed (a CUDA or cuBLAS error, with their message) */
    DT_RESULT_COUNT
} dt_result;

/* Name of a result code, e.g. "DT_ERR_SHAPE". Never NULL. */
const char *dt_result_str(dt_result r);
/* Message of the last failure on the calling thread ("" if none). Valid until the next failure. */
const char *dt_last_error(void);
/* Records a failure message for the calling thread and returns r; for backends and extensions. */
dt_result dt_set_error(dt_result r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Logging. Levels: DT_LOG_ERROR < DT_LOG_WARN < DT_LOG_INFO < DT_LOG_DEBUG. */
enum { DT_LOG_ERROR = 0, DT_LOG_WARN = 1, DT_LOG_INFO = 2, DT_LOG_DEBUG = 3 };
typedef void (*dt_log_fn)(void *user, int level, const char *msg);
/* Sets the log sink and the most verbose level shown. fn NULL restores the default (stderr).
   Process-wide configuration: call before starting threads. */
void dt_log_configure(dt_log_fn fn, void *user, int max_level);
/* Logs one line (printf format) at the given level. */
void dt_log(int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Random numbers: PCG32 (O'Neill), 2^63 independent streams per seed. A rank uses stream = rank, so
   ranks draw independent sequences from one seed and the same (seed, stream) always repeats. */
typedef struct dt_rng { uint64_t state, inc; } dt_rng;
void     dt_rng_init(dt_rng *r, uint64_t seed, uint64_t stream);
uint32_t dt_rng_u32(dt_rng *r);
uint32_t dt_rng_below(dt_rng *r, uint32_t n);          /* uniform integer in [0, n), unbiased; n > 0 */
float    dt_rng_uniform(dt_rng *r);                    /* uniform float in [0, 1), 24 random bits */
float    dt_rng_normal(dt_rng *r);                     /* standard normal (Box-Muller) */
/* Counter-based uniform in [0, 1): a pure function of (key, counter), for masks any backend repeats. */
float    dt_hash_uniform(uint64_t key, uint64_t counter);

/* Timers: wall-clock seconds from a monotonic clock where the platform has one. */
double dt_time_now(void);
typedef struct dt_timer { double start, total; int64_t count; } dt_timer;
void   dt_timer_start(dt_timer *t);
double dt_timer_stop(dt_timer *t);                     /* adds the lap to total, returns the lap */

/* A one-line progress bar for a terminal: "  37/469 [=====>      ]  <your text>", redrawn in place at
   most ten times a second. enabled = 0 makes every call a no-op (e.g. when output is not a terminal). */
typedef struct dt_progress {
    void   *out;                 /* FILE * */
    int64_t total;
    double  start, last_draw;
    int     enabled, drawn;
} dt_progress;
void dt_progress_begin(dt_progress *p, void *file, int64_t total, int enabled);
void dt_progress_update(dt_progress *p, int64_t done, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void dt_progress_end(dt_progress *p);  /* erases the bar, so the next log line starts clean */

/* Timeline. With dt_launch_desc.trace_path set (the --trace PATH flag), dt_launch records spans of each
   rank's compute and communication (forward, loss, backward, optimizer steps, loader waits, every
   collective and point-to-point wait, DDP's buckets, gossip, FedAvg's clients and aggregation) and writes
   them to PATH in the Chrome trace event format (JSON; open it in https://ui.perfetto.dev or
   chrome://tracing): one process per rank, one thread per lane (the rank's thread; DDP's helper thread).
   These calls add the program's own spans on the calling thread. Spans nest: dt_trace_end closes the
   latest span begun. name and category are stored, not copied: they must stay valid until dt_launch
   returns (string literals do). Outside dt_launch, on threads of its own, or with tracing off, every
   call is one branch and records nothing. */
void dt_trace_begin(const char *name, const char *category);
void dt_trace_end(void);
void dt_trace_instant(const char *name, const char *category);   /* a point in time */
int  dt_trace_enabled(void);   /* 1 when the calling thread records */

/* ============================================================================================== */
/* 2. tensor and backend ops                                                                      */
/* ============================================================================================== */

#define DT_MAX_DIMS 4

/* A float32 view of contiguous memory, NCHW order. It never owns its data. */
typedef struct dt_tensor {
    float  *data;
    int     ndim;
    int64_t shape[DT_MAX_DIMS];
} dt_tensor;

dt_tensor dt_tensor_view(float *data, int ndim, const int64_t *shape);
dt_tensor dt_tensor_4d(float *data, int64_t n, int64_t c, int64_t h, int64_t w);
int64_t   dt_tensor_count(const dt_tensor *t);        /* number of elements */

/* Geometry of a 2-D window op (convolution or pooling) over a batch: input [n, c, h, w],
   output [n, oc, oh, ow], window kh x kw, stride sh x sw, zero padding ph x pw. */
typedef struct dt_conv_geom {
    int64_t n, c, h, w;
    int64_t oc, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw;
} dt_conv_geom;
/* Fills oh/ow from the rest; DT_ERR_SHAPE when the window does not fit. */
dt_result dt_conv_geom_resolve(dt_conv_geom *g);

/* The backend ops table. Every pointer argument is backend memory (host memory for the CPU table).
   `ctx` is the backend's own state (NULL for the CPU). Functions named *_bwd ACCUMULATE into the
   gradients they write (+=), so a node read by two consumers receives the sum of both gradients.
   Shapes are stated as [rows, cols] in row-major order. */
typedef struct dt_ops {
    const char *name;
    /* memory */
    void *(*alloc)(void *ctx, int64_t bytes);                           /* NULL when out of memory */
    void  (*free)(void *ctx, void *p);
    void  (*upload)(void *ctx, void *dst, const void *host_src, int64_t bytes);
    void  (*download)(void *ctx, void *host_dst, const void *src, int64_t bytes);
    void  (*copy)(void *ctx, float *dst, const float *src, int64_t n);
    /* vectors */
    void  (*fill)(void *ctx, float *x, int64_t n, float v);
    void  (*scale)(void *ctx, float *x, int64_t n, float a);             /* x *= a */
    void  (*axpy)(void *ctx, float *y, const float *x, int64_t n, float a); /* y += a x */
    void  (*add)(void *ctx, float *y, const float *a, const float *b, int64_t n); /* y = a + b */
    /* C[M,N] = alpha op(A) op(B) + beta C; op(A) [M,K], op(B) [K,N]; ta/tb nonzero = transposed;
       lda/ldb/ldc are row strides of A, B, C as stored. beta == 0 never reads C. */
    void  (*gemm)(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
    /* y[r, i] = x[r, i] + b[i]  for y,x [rows, cols], b [cols] (x may equal y) */
    void  (*add_row_bias)(void *ctx, float *y, const float *b, int64_t rows, int64_t cols);
    /* db[i] += sum_r dy[r, i]  for dy [rows, cols] */
    void  (*sum_rows_bwd)(void *ctx, float *db, const float *dy, int64_t rows, int64_t cols);
    /* convolution helpers for x [n, c, h, w]: col [c*kh*kw, n*oh*ow] */
    void  (*im2col)(void *ctx, const dt_conv_geom *g, const float *x, float *col);
    void  (*col2im_bwd)(void *ctx, const dt_conv_geom *g, const float *col, float *dx); /* dx += */
    /* y [n, c, s] <- t [c, n*s] (+ b[c] when b != NULL);  and its inverse t [c, n*s] <- y [n, c, s] */
    void  (*cs_to_ncs)(void *ctx, float *y, const float *t, const float *b, int64_t n, int64_t c, int64_t s);
    void  (*ncs_to_cs)(void *ctx, float *t, const float *y, int64_t n, int64_t c, int64_t s);
    /* db[c] += sum_{n,s} dy[n, c, s] */
    void  (*channel_sum_bwd)(void *ctx, float *db, const float *dy, int64_t n, int64_t c, int64_t s);
    /* pooling over geometry g (g->oc == g->c); idx [n, c, oh, ow] remembers each max's input offset */
    void  (*maxpool_fwd)(void *ctx, const dt_conv_geom *g, const float *x, float *y, int32_t *idx);
    void  (*maxpool_bwd)(void *ctx, const dt_conv_geom *g, const float *dy, const int32_t *idx, float *dx);
    void  (*avgpool_fwd)(void *ctx, const dt_conv_geom *g, const float *x, float *y);
    void  (*avgpool_bwd)(void *ctx, const dt_conv_geom *g, const float *dy, float *dx);
    /* y [n, c] = mean over s of x [n, c, s] */
    void  (*gap_fwd)(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t s);
    void  (*gap_bwd)(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t s);
    /* activations */
    void  (*relu_fwd)(void *ctx, const float *x, float *y, int64_t n);
    void  (*relu_bwd)(void *ctx, const float *y, const float *dy, float *dx, int64_t n);
    /* dropout: mask[i] = 0 or 1/(1-p) from dt_hash_uniform(key, i); y = x * mask */
    void  (*dropout_fwd)(void *ctx, const float *x, float *y, float *mask, int64_t n, float p, uint64_t key);
    void  (*mul_bwd)(void *ctx, const float *dy, const float *mask, float *dx, int64_t n); /* dx += dy*mask */
    /* batch normalisation of x [n, c, s] per channel. Train: batch statistics (biased variance),
       running stats rm/rv updated as PyTorch (unbiased variance, momentum); saves mean and 1/std.
       Eval: running statistics. bwd: training selects the batch-statistics gradient; dx may be NULL. */
    void  (*bn_fwd)(void *ctx, int training, const float *x, float *y, int64_t n, int64_t c, int64_t s,
                    const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                    float *save_mean, float *save_invstd);
    void  (*bn_bwd)(void *ctx, int training, const float *x, const float *dy, float *dx, int64_t n, int64_t c,
                    int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                    float *dgamma, float *dbeta);
    /* option-A shortcut: y [n, oc, oh, ow] = x[:, :, ::stride, ::stride] with (oc - c)/2 zero channels
       on each side; x [n, c, h, w] */
    void  (*pad_shortcut_fwd)(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t h, int64_t w,
                              int64_t oc, int64_t stride);
    void  (*pad_shortcut_bwd)(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t h, int64_t w,
                              int64_t oc, int64_t stride);
    /* rows of x [n, k] */
    void  (*log_softmax_fwd)(void *ctx, const float *x, float *y, int64_t n, int64_t k);
    void  (*log_softmax_bwd)(void *ctx, const float *y, const float *dy, float *dx, int64_t n, int64_t k);
    /* losses, mean over the batch: write the loss to *loss (host) and d loss / d x into dx (overwrite) */
    void  (*softmax_xent)(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k,
                          float *dx, float *loss);
    void  (*nll)(void *ctx, const float *logp, const int32_t *labels, int64_t n, int64_t k, float *dx, float *loss);
    void  (*mse)(void *ctx, const float *x, const float *target, int64_t n, float *dx, float *loss);
    /* correct[0] = number of rows of x [n, k] whose first maximum is at labels[row] (host int64) */
    void  (*count_correct)(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, int64_t *correct);
    /* out[0] = sum of x[i]^2 (host double) */
    void  (*sum_squares)(void *ctx, const float *x, int64_t n, double *out);
    /* fused optimizer updates over a stretch of the flat buffers, as torch.optim (see section 4):
       SGD: g' = g + wd p; buf = first ? g' : momentum buf + (1 - dampening) g' (when momentum != 0);
            d = nesterov ? g' + momentum buf : (momentum != 0 ? buf : g'); p -= lr d.
       Adam: g' = g + wd p (decoupled = 0) or p *= 1 - lr wd (decoupled = 1, AdamW); m = b1 m + (1-b1) g';
            v = b2 v + (1-b2) g'^2; p -= step_size m / (sqrt(v) / bc2_sqrt + eps). */
    void  (*sgd_step)(void *ctx, float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                      float dampening, float wd, int nesterov, int first);
    void  (*adam_step)(void *ctx, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                       float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt);
    /* Waits until every op issued so far has finished, then returns DT_OK or the first failure of any op
       on this ctx (ops return nothing, so an asynchronous backend keeps its failure, with its message, for
       sync to return; dt_last_error() then holds the message). The model calls it at the end of every
       public call that issued ops, so host code may read backend memory the host can address (the CUDA
       backend's managed memory) once the call has returned. NULL: the ops finish before they return and
       never fail (the CPU). */
    dt_result (*sync)(void *ctx);
    /* optional (NULL: im2col into a workspace, then gemm): the convolution's GEMMs without materialising
       col = im2col(x) [c*kh*kw, n*oh*ow]:  t [oc, n*oh*ow] = W [oc, c*kh*kw] col;  dW += t col^T */
    void  (*conv_gemm_fwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, float *t);
    void  (*conv_gemm_wgrad)(void *ctx, const dt_conv_geom *g, const float *x, const float *t, float *dW);
    /* optional (NULL or 0 returned: gemm, then col2im_bwd): dx [n, c, h, w] += the input gradient of the
       convolution for dy [n, oc, oh, ow], using ws (ws_count floats) as scratch; returns 1 when done */
    int   (*conv_gemm_dgrad)(void *ctx, const dt_conv_geom *g, const float *W, const float *dy, float *dx, float *ws,
                             int64_t ws_count);
    /* optional (NULL or 0 returned: the entries above): the whole convolution on [n, c, h, w] tensors, where
       the backend has a faster way for this geometry. conv_fwd: y [n, oc, oh, ow] = conv(x, W) + b (b NULL:
       none); conv_bwd: dW += and (dx not NULL) dx += (accumulate 1) or = (accumulate 0) the gradients for
       dy [n, oc, oh, ow] (not the bias's). Both return 1 when done, 0 (having written nothing) when the caller
       is to take the entries above; conv_bwd returns 2 when it wrote dW but left dx to them. */
    int   (*conv_fwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y);
    int   (*conv_bwd)(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW, float *dx,
                      int accumulate);
    /* optional pairs (NULL: the layers one by one): a ReLU fused into the layer before it, when the ReLU is
       that layer's only reader. bn_relu_fwd: y = max(0, bn(x) + r) (r NULL: max(0, bn(x)); a batch norm
       whose only reader is a residual add, whose only reader is the ReLU), other arguments as bn_fwd's;
       bn_relu_bwd: bn_bwd's gradients for the ReLU's output y and its gradient dy, with dx += (accumulate 1)
       or = (0), and dr (when not NULL: r's gradient) += or = (acc_r) dy where y > 0, else 0; dx may be NULL.
       add_relu_fwd: y = max(0, a + b); add_relu_bwd: da and db (each may be NULL) += or = (acc_a, acc_b) dy
       where y > 0, else 0. Both members of a pair are given, or neither. */
    void  (*bn_relu_fwd)(void *ctx, int training, const float *x, const float *r, float *y, int64_t n, int64_t c, int64_t s,
                         const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                         float *save_mean, float *save_invstd);
    void  (*bn_relu_bwd)(void *ctx, int training, const float *x, const float *y, const float *dy, float *dx, int accumulate,
                         float *dr, int acc_r, int64_t n, int64_t c, int64_t s, const float *gamma, const float *save_mean,
                         const float *save_invstd, float *dgamma, float *dbeta);
    void  (*add_relu_fwd)(void *ctx, float *y, const float *a, const float *b, int64_t n);
    void  (*add_relu_bwd)(void *ctx, const float *y, const float *dy, float *da, int acc_a, float *db, int acc_b, int64_t n);
} dt_ops;

/* The CPU backend (OpenMP when compiled with it). */
const dt_ops *dt_cpu_ops(void);

/* CPU GEMM with the semantics of dt_ops.gemm: the blocked, vectorised one and its naive twin. */
void dt_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void dt_gemm_ref(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Naive direct convolution, the twin of im2col + GEMM: y [n, oc, oh, ow] = w [oc, c, kh, kw] * x + b */
void dt_conv2d_ref(const dt_conv_geom *g, const float *x, const float *w, const float *b, float *y);
/* Number of threads the CPU kernels use (1 without OpenMP). */
int dt_cpu_threads(void);

/* ============================================================================================== */
/* 3. nn: model graph on flat buffers, layers, losses, model zoo                                  */
/* ============================================================================================== */

typedef enum dt_layer_kind {
    DT_LAYER_INPUT = 0, DT_LAYER_LINEAR, DT_LAYER_CONV2D, DT_LAYER_MAXPOOL2D, DT_LAYER_AVGPOOL2D,
    DT_LAYER_GLOBAL_AVGPOOL, DT_LAYER_RELU, DT_LAYER_DROPOUT, DT_LAYER_BATCHNORM, DT_LAYER_FLATTEN,
    DT_LAYER_ADD, DT_LAYER_PAD_SHORTCUT, DT_LAYER_LOG_SOFTMAX, DT_LAYER_KIND_COUNT
} dt_layer_kind;

/* Name of a layer kind, e.g. "conv2d". */
const char *dt_layer_kind_str(dt_layer_kind k);

/* Model configuration; zero means the default. */
typedef struct dt_model_desc {
    int64_t       in_c, in_h, in_w;   /* per-sample input shape; in_h = in_w = 0 for a vector of in_c */
    uint64_t      seed;               /* weight initialisation and dropout masks (default 0) */
    uint64_t      stream;             /* RNG stream, e.g. the rank (default 0) */
    const dt_ops *ops;                /* backend (default dt_cpu_ops(); dt_cuda_ops() in a DT_USE_CUDA build) */
    void         *ops_ctx;            /* backend state passed to every op (the GPU's: a dt_cuda, or NULL for one
                                         the model creates and destroys) */
    int           input_grad;         /* 1: also compute the gradient w.r.t. the input (dt_model_node_grad(m, 0)) */
} dt_model_desc;

typedef struct dt_model dt_model;

/* A named view into a flat buffer: parameters (trainable) or buffers (running statistics). */
typedef struct dt_param_info {
    const char *name;                 /* e.g. "conv1.weight", "layers.0.bn1.running_mean" */
    int         node;                 /* node that owns it */
    int64_t     offset, count;        /* elements, into dt_model_params() or dt_model_buffers() */
    int         ndim;
    int64_t     shape[DT_MAX_DIMS];
} dt_param_info;

/* Creates an empty model holding only its input node. *out is NULL on failure. */
dt_result dt_model_create(dt_model **out, const dt_model_desc *desc);
/* Frees everything the model allocated. NULL is allowed. */
void dt_model_destroy(dt_model *m);

/* Builder: each call adds one node and returns its id (or -1 after an error, kept for finalize).
   Shapes are checked here, so a bad network fails where it is written. */
int dt_model_input(dt_model *m);                                                /* id of the input node */
int dt_linear(dt_model *m, int x, int64_t out_features, int bias);              /* x: [in] -> [out] */
typedef struct dt_conv2d_desc {
    int64_t out_channels;
    int64_t kernel, stride, pad;     /* square window; stride 0 = 1 */
    int     no_bias;                 /* 1 = no bias (before a batchnorm) */
} dt_conv2d_desc;
int dt_conv2d(dt_model *m, int x, int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad);
int dt_conv2d_ex(dt_model *m, int x, const dt_conv2d_desc *d);
int dt_maxpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad); /* stride 0 = kernel */
int dt_avgpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad); /* zero padding counted */
int dt_global_avgpool(dt_model *m, int x);                                      /* [c,h,w] -> [c] */
int dt_relu(dt_model *m, int x);
int dt_dropout(dt_model *m, int x, float p);                                    /* 0 <= p < 1 */
int dt_batchnorm(dt_model *m, int x);                                           /* 2-D for [c,h,w], 1-D for [c] */
int dt_batchnorm_ex(dt_model *m, int x, float eps, float momentum);             /* defaults 1e-5, 0.1 */
int dt_flatten(dt_model *m, int x);                                             /* [c,h,w] -> [c*h*w], no copy */
int dt_add(dt_model *m, int a, int b);                                          /* residual sum, same shapes */
int dt_pad_shortcut(dt_model *m, int x, int64_t out_channels, int64_t stride);  /* ResNet option A */
int dt_log_softmax(dt_model *m, int x);                                         /* over [k] */
/* Names a node; its parameters become "<name>.weight" etc. Returns x. */
int dt_model_name(dt_model *m, int x, const char *name);

/* Plans and allocates the flat buffers and initialises weights as PyTorch does by default
   (kaiming-uniform a=sqrt(5) for conv/linear weights, uniform(+-1/sqrt(fan_in)) biases, batchnorm 1/0).
   Returns the first builder error, if any. The last node added is the model's output. */
dt_result dt_model_finalize(dt_model *m);

/* Training mode (default): dropout active, batchnorm uses batch statistics. Eval: the opposite. */
void dt_model_train(dt_model *m, int training);
int  dt_model_is_training(const dt_model *m);

/* Forward pass on a host batch x [batch, in_c, in_h, in_w]. Grows the activation arena the first
   time a larger batch is seen. */
dt_result dt_model_forward(dt_model *m, const float *x, int64_t batch);
/* Losses on the output node of the last forward, mean over the batch. They return the loss in *loss and
   set the output's gradient for dt_model_backward. labels: host int32 [batch] in [0, k). */
dt_result dt_model_loss_cross_entropy(dt_model *m, const int32_t *labels, float *loss); /* softmax + NLL */
dt_result dt_model_loss_nll(dt_model *m, const int32_t *labels, float *loss);           /* on log-probs */
dt_result dt_model_loss_mse(dt_model *m, const float *target, float *loss);             /* target host [batch, k] */
/* The classification loss that fits the model: NLL when it ends in dt_log_softmax, cross-entropy otherwise. */
dt_result dt_model_loss_labels(dt_model *m, const int32_t *labels, float *loss);
/* Backward pass: gradients ACCUMULATE into dt_model_grads(). dy (host, shape of the output) is the
   upstream gradient; NULL uses the gradient set by the last dt_model_loss_* call. */
dt_result dt_model_backward(dt_model *m, const float *dy);
/* Sets every parameter gradient to zero. */
void dt_model_zero_grad(dt_model *m);
/* A function dt_model_backward calls right after each node's backward (node = nnodes - 1 down to 1): from
   then on the gradients of the parameters of nodes >= node are final for this pass (parameters are laid
   out in node order, so that is every gradient from some offset to the end of the flat buffer). It runs on
   the caller's thread, between two nodes. dt_ddp uses it to start reducing a bucket of gradients while
   backward goes on. fn NULL removes it; one hook per model. */
typedef void (*dt_backward_hook)(void *user, dt_model *m, int node);
void dt_model_set_backward_hook(dt_model *m, dt_backward_hook fn, void *user);
/* Copies the output of the last forward ([batch, out...]) to host memory; count = batch * output size. */
dt_result dt_model_output(dt_model *m, float *host, int64_t count);
/* Number of correctly classified samples of the last forward (argmax of the output vs labels). */
dt_result dt_model_count_correct(dt_model *m, const int32_t *labels, int64_t *correct);

/* Flat buffers (backend memory; host memory for the CPU backend). count may be NULL. */
float  *dt_model_params(dt_model *m, int64_t *count);
float  *dt_model_grads(dt_model *m, int64_t *count);
float  *dt_model_buffers(dt_model *m, int64_t *count);
int64_t dt_model_param_count(const dt_model *m);       /* trainable elements, as PyTorch counts them */
/* Copy all parameters (or buffers) from / to host memory; count must match exactly. */
dt_result dt_model_set_params(dt_model *m, const float *host, int64_t count);
dt_result dt_model_get_params(dt_model *m, float *host, int64_t count);
dt_result dt_model_get_grads(dt_model *m, float *host, int64_t count);
dt_result dt_model_set_buffers(dt_model *m, const float *host, int64_t count);
dt_result dt_model_get_buffers(dt_model *m, float *host, int64_t count);
/* Named listing: parameters in creation order, then buffers. */
int dt_model_param_tensors(const dt_model *m);
int dt_model_buffer_tensors(const dt_model *m);
dt_param_info dt_model_param_info(const dt_model *m, int i);
dt_param_info dt_model_buffer_info(const dt_model *m, int i);
/* Graph inspection. */
int         dt_model_nodes(const dt_model *m);
int         dt_model_output_node(const dt_model *m);
dt_layer_kind dt_model_node_kind(const dt_model *m, int node);
const char *dt_model_node_name(const dt_model *m, int node);
int64_t     dt_model_node_size(const dt_model *m, int node);          /* per-sample element count */
int         dt_model_node_shape(const dt_model *m, int node, int64_t shape[3]); /* returns ndim (1 or 3) */
/* Read access to a node's activation or gradient of the last pass ([batch, size], backend memory). NULL
   for a batch norm or add whose only reader is a ReLU, when the backend runs the ReLU inside it (the CPU
   does): that output is never stored; the ReLU's is. */
const float *dt_model_node_output(const dt_model *m, int node);
const float *dt_model_node_grad(const dt_model *m, int node);
/* Writes a table of the layers, shapes and parameter counts (like torchsummary) with dt_log(INFO). */
void dt_model_summary(const dt_model *m);

/* Model zoo. Each builds on a created, empty model (input shape from its desc), names its layers as the
   usual PyTorch modules do, and finalizes it. num_classes 0 = 10. */
typedef enum dt_zoo_model {
    DT_ZOO_MLP = 0,       /* flatten, hidden layers of `width` (default 512, 256) with ReLU, linear */
    DT_ZOO_SIMPLE_CNN,    /* tutorial CNN for 1x28x28: 421,642 parameters; log-softmax output */
    DT_ZOO_LENET5,        /* LeNet-5 for 1x28x28 (padding 2 on conv1): 61,706 parameters */
    DT_ZOO_FEDAVG_CNN,    /* McMahan et al. CNN for 1x28x28: 1,663,370 parameters */
    DT_ZOO_FEDAVG_2NN,    /* McMahan et al. 2NN (784-200-200-10): 199,210 parameters */
    DT_ZOO_VGG11,         /* VGG-11 with batchnorm for 3x32x32: 9,231,114 parameters */
    DT_ZOO_RESNET20,      /* ResNet-20 (option A shortcuts) for 3x32x32: 269,722 parameters */
    DT_ZOO_COUNT
} dt_zoo_model;
const char *dt_zoo_name(dt_zoo_model z);                  /* "resnet20", ... */
int         dt_zoo_from_name(const char *name);           /* -1 when unknown */
/* Creates and finalizes a zoo model. desc's input shape is filled in when zero. */
dt_result dt_zoo_create(dt_model **out, dt_zoo_model z, int64_t num_classes, const dt_model_desc *desc);

/* ============================================================================================== */
/* 4. optim: optimizers over the flat buffers, learning-rate schedules                            */
/* ============================================================================================== */

typedef enum dt_optim_kind { DT_OPTIM_SGD = 0, DT_OPTIM_ADAM, DT_OPTIM_ADAMW } dt_optim_kind;

/* Optimizer settings, zero = default. The semantics are torch.optim's SGD, Adam and AdamW. */
typedef struct dt_optim_desc {
    dt_optim_kind kind;
    float lr;                      /* default 0.01 (SGD), 0.001 (Adam, AdamW) */
    float momentum, dampening;     /* SGD */
    int   nesterov;                /* SGD; needs momentum > 0 and dampening 0 */
    float weight_decay;            /* L2 added to the gradient (SGD, Adam); decoupled (AdamW, default 0.01) */
    float beta1, beta2, eps;       /* Adam(W): defaults 0.9, 0.999, 1e-8 */
} dt_optim_desc;

typedef struct dt_optim dt_optim;

/* Creates an optimizer for the model's parameters, with its state (momentum, Adam moments) in flat
   buffers of the parameters' layout. The model must be finalized and must outlive the optimizer. */
dt_result dt_optim_create(dt_optim **out, dt_model *m, const dt_optim_desc *desc);
void      dt_optim_destroy(dt_optim *o);
/* One update of every trainable parameter from dt_model_grads(). One loop over the flat buffer (or over
   each stretch between frozen tensors). */
dt_result dt_optim_step(dt_optim *o);
void      dt_optim_set_lr(dt_optim *o, float lr);
float     dt_optim_lr(const dt_optim *o);
/* Freezes (frozen = 1) or unfreezes the parameter tensors whose name starts with prefix ("" or NULL =
   all); frozen tensors are neither updated nor clipped. Returns the number of tensors matched, or -1. */
int       dt_optim_freeze(dt_optim *o, const char *prefix, int frozen);
/* Scales the trainable gradients so their global 2-norm is at most max_norm, as
   torch.nn.utils.clip_grad_norm_; *total_norm (may be NULL) receives the norm before clipping. */
dt_result dt_optim_clip_grad_norm(dt_optim *o, float max_norm, float *total_norm);
/* Optimizer state, for checkpoints: the flat state (0, 1 or 2 parameter-sized arrays, backend memory)
   and the per-tensor step counts. */
float    *dt_optim_state(dt_optim *o, int64_t *count);
int       dt_optim_tensors(const dt_optim *o);
int64_t   dt_optim_tensor_steps(const dt_optim *o, int i);
dt_result dt_optim_set_tensor_steps(dt_optim *o, const int64_t *steps, int count);

/* Learning-rate schedules as pure functions of the step (or epoch) t = 0, 1, ...: the rate of step t. */
typedef enum dt_sched_kind { DT_SCHED_CONSTANT = 0, DT_SCHED_MULTISTEP, DT_SCHED_COSINE } dt_sched_kind;
#define DT_SCHED_MAX_MILESTONES 8
typedef struct dt_sched_desc {
    dt_sched_kind kind;
    float   base_lr;
    int64_t milestones[DT_SCHED_MAX_MILESTONES]; /* multistep: lr *= gamma at each (ascending; 0 ends the list) */
    float   gamma;                                /* multistep: default 0.1 */
    int64_t t_max;                                /* cosine: half-period (CosineAnnealingLR's T_max) */
    float   min_lr;                               /* cosine: the floor (eta_min) */
    int64_t warmup;                               /* linear warm-up steps before the schedule (0 = none) */
    float   warmup_start;                         /* warm-up starts at base_lr * this (default 1/3) */
} dt_sched_desc;
/* The rate at t, as PyTorch's MultiStepLR / CosineAnnealingLR, preceded by LinearLR through SequentialLR
   when warmup > 0 (the main schedule then counts from t - warmup). */
float dt_sched_lr(const dt_sched_desc *s, int64_t t);

/* ============================================================================================== */
/* 5. data: datasets, transforms, partitioners, loader                                            */
/* ============================================================================================== */

/* A labelled image dataset held in memory as uint8, converted to float per batch. Loaders fill it and
   dt_dataset_free releases what they allocated; a dataset built by hand may point at the caller's
   arrays (then do not call dt_dataset_free). */
typedef struct dt_dataset {
    int64_t  count;              /* samples */
    int64_t  c, h, w;            /* per-sample shape: channels, height, width */
    int64_t  num_classes;
    uint8_t *pixels;             /* [count, c, h, w] */
    int32_t *labels;             /* [count], each in [0, num_classes) */
    char   **class_names;        /* [num_classes] or NULL */
    char     source[256];        /* where it was loaded from, for messages */
} dt_dataset;

/* Frees the arrays a loader allocated and zeroes *ds. NULL is allowed. */
void dt_dataset_free(dt_dataset *ds);

/* Per-batch conversion: x = (pixel / 255 - mean[c]) / std[c] after an optional random crop (zero padding
   of crop_pad pixels on each side, then a crop of the original size) and an optional random horizontal
   flip (p = 0.5). Zero means the default: mean 0, std 1, no crop, no flip. */
typedef struct dt_transform {
    float   mean[3], std[3];
    int64_t crop_pad;
    int     flip;
} dt_transform;

/* Converts samples idx[0..n) of ds into x [n, c, h, w] and y [n] (host memory). Random choices are a
   pure function of (seed, epoch, sample index), so any rank or thread converting a sample in an epoch
   gets the same result. t may be NULL (x = pixel / 255). */
dt_result dt_dataset_batch(const dt_dataset *ds, const int64_t *idx, int64_t n, const dt_transform *t, uint64_t seed,
                           uint64_t epoch, float *x, int32_t *y);

/* (dataset loaders: declarations) */

/* Dataset loaders. Each one zeroes *ds, then fills it with arrays it allocates (free them with
   dt_dataset_free), so a *ds holding a previous dataset must be freed first. On failure *ds is left
   zeroed with nothing allocated, and dt_last_error() names the file and the cause. Pixels are stored as
   read; normalisation happens per batch (dt_dataset_batch). Not collective: each rank loads its copy. */

/* MNIST-style IDX files: images (magic 0x00000803, big-endian dims N, H, W, then N*H*W bytes) and labels
   (magic 0x00000801, dim N, then N bytes in 0..9). Either file may be gzip-compressed (detected by its
   first two bytes; needs DT_USE_ZLIB). Gives c = 1, num_classes = 10, class_names NULL. */
dt_result dt_dataset_load_idx(dt_dataset *ds, const char *images_path, const char *labels_path);
/* MNIST or Fashion-MNIST from a directory: train-{images-idx3,labels-idx1}-ubyte (t10k-... when train is
   0), each raw or with .gz appended (raw preferred). dir NULL means DT_MNIST_DEFAULT_DIR, where Debian's
   package dataset-fashion-mnist installs Fashion-MNIST. */
dt_result dt_dataset_load_mnist_dir(dt_dataset *ds, const char *dir, int train);
/* CIFAR-10, binary version: dir/data_batch_1.bin .. data_batch_5.bin (train != 0) or dir/test_batch.bin,
   records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32). Gives c = 3, h = w = 32,
   num_classes = 10; class_names from dir/batches.meta.txt (one name per line) when present, else NULL. */
dt_result dt_dataset_load_cifar10(dt_dataset *ds, const char *dir, int train);
/* torchvision's ImageFolder layout, root/<class>/<image>: classes are the sub-directories of root in
   byte-wise (Python sorted()) order, label = position in that order, class_names their names; images in
   a class are taken in name order. Files with the extensions torchvision accepts (.jpg .jpeg .png .ppm
   .bmp .pgm .tif .tiff .webp, any case) are images, other files and names starting with '.' are skipped.
   Each image is decoded to `channels` components (1 or 3; 0 means 3) and resized to h x w with
   stb_image_resize's default filter. PNG, JPEG, BMP and binary PGM/PPM decode; TIFF and WebP are
   refused with a message. Needs DT_USE_STB_IMAGE (and POSIX <dirent.h>). */
dt_result dt_dataset_load_image_folder(dt_dataset *ds, const char *root, int64_t h, int64_t w, int64_t channels);

/* (partitioners and loader: declarations) */
/* ---- partitions ------------------------------------------------------------------------------ */

/* A split of the sample ids 0..count-1 into `parts` disjoint lists that together hold every id exactly
   once. Part p is indices[offsets[p] .. offsets[p+1]); offsets[0] = 0 and offsets[parts] = count. The
   constructors allocate offsets and indices as one block (indices points into it), zero *p on failure,
   and are pure functions of their arguments: every rank computes the same partition from the same seed
   without communicating. A part can be empty only where its constructor says so. */
typedef struct dt_partition {
    int      parts;
    int64_t *offsets;            /* [parts + 1] */
    int64_t *indices;            /* [count] sample ids; part p is indices[offsets[p] .. offsets[p+1]) */
} dt_partition;

/* Frees what a constructor allocated and zeroes *p. NULL is allowed. */
void dt_partition_free(dt_partition *p);

/* Train/val/test style split: a seeded shuffle of 0..count-1, then consecutive slices, part p taking
   fractions[p] of the samples (e.g. {0.7f, 0.2f, 0.1f}). fractions [parts], each >= 0, summing to 1 within
   1e-4. Sizes: n_p = floor(count * f_p / sum(f)); the samples left over (fewer than parts) go one each to
   the parts with f_p > 0 in order 0, 1, 2, ...; so the sizes sum to count and f_p = 0 gives an empty part. */
dt_result dt_partition_fractions(dt_partition *p, int64_t count, const float *fractions, int parts, uint64_t seed);
/* Equal IID shards: a seeded shuffle, then part p takes floor(count / parts) samples, plus one when
   p < count % parts (sizes differ by at most 1; parts beyond count are empty). */
dt_result dt_partition_iid(dt_partition *p, int64_t count, int parts, uint64_t seed);
/* Contiguous blocks in index order, sizes as dt_partition_iid: part p is [start_p, start_p + n_p). */
dt_result dt_partition_contiguous(dt_partition *p, int64_t count, int parts);
/* Pathological non-IID split of the FedAvg paper (McMahan et al. 2017): the ids are sorted by label (stable,
   so ties keep id order), cut into S = parts * shards_per_part shards of floor(count / S) ids (the first
   count % S shards one more), and each part receives shards_per_part shards drawn at random without
   replacement (seeded). With 2 shards per part most parts hold at most 2 labels. labels [count], each >= 0.
   Parts are empty only when count < S leaves shards empty. */
dt_result dt_partition_shards(dt_partition *p, const int32_t *labels, int64_t count, int parts, int shards_per_part,
                              uint64_t seed);
/* Label skew: for each class, proportions q ~ Dirichlet(alpha, ..., alpha) over the parts, and the class's
   samples (shuffled) are cut at floor(n_class * cumsum(q)). Small alpha (0.1) = each part dominated by a
   few classes; large alpha (100) = near IID. labels [count] in [0, num_classes). When count >= parts no part
   is empty: an allocation with an empty part is redrawn (up to 100 draws, as common implementations do),
   and if one remains empty, one sample at a time moves to it from the largest part. */
dt_result dt_partition_dirichlet(dt_partition *p, const int32_t *labels, int64_t count, int64_t num_classes, int parts,
                                 float alpha, uint64_t seed);
/* Label histogram of each part: hist [parts, num_classes], hist[p * num_classes + k] = samples of class k in
   part p. labels is indexed by sample id; a label outside [0, num_classes) is an error. */
dt_result dt_partition_histogram(const dt_partition *p, const int32_t *labels, int64_t num_classes, int64_t *hist);

/* ---- distributed sampler --------------------------------------------------------------------- */

/* Samples per rank and epoch: ceil(count / world), or floor(count / world) when drop_last (0 for bad
   arguments). */
int64_t dt_sampler_size(int64_t count, int world, int drop_last);
/* PyTorch's DistributedSampler: rank's sample ids for one epoch. The list is a permutation of 0..count-1
   seeded by (seed, epoch) alone, the same on every rank (identity when shuffle = 0); drop_last = 0 pads it
   to total = ceil(count / world) * world by repeating it from its start, drop_last = 1 truncates it to
   floor(count / world) * world; rank takes positions rank, rank + world, rank + 2 world, ... So every rank
   gets *n_out = dt_sampler_size(count, world, drop_last) ids, and the ranks' shares are disjoint apart from
   the padding. out [dt_sampler_size(...)]. With shuffle it allocates a temporary [count] permutation. */
dt_result dt_sampler_indices(int64_t count, int rank, int world, uint64_t seed, int64_t epoch, int shuffle,
                             int drop_last, int64_t *out, int64_t *n_out);

/* ---- loader ---------------------------------------------------------------------------------- */

/* Batches of one rank's samples, converted to float by dt_dataset_batch. Zero means the default. */
typedef struct dt_loader_desc {
    const dt_dataset   *dataset;     /* borrowed: must stay valid and unchanged while the loader lives */
    const int64_t      *indices;     /* this rank's sample ids (e.g. a partition's part), copied at create; */
    int64_t             count;       /* NULL (and count 0) = all samples of the dataset in order */
    int64_t             batch;       /* samples per batch (default 64) */
    int                 shuffle;     /* 1: a new seeded order of the indices every epoch; 0: the given order */
    int                 drop_last;   /* 1: drop the last partial batch */
    const dt_transform *transform;   /* copied at create; NULL = pixel / 255 */
    uint64_t            seed;        /* shuffle and transform randomness */
    uint64_t            rank;        /* RNG stream of the shuffle: different ranks, different orders */
    int                 prefetch;    /* 1: a background thread converts batch k+1 while batch k is used */
} dt_loader_desc;

typedef struct dt_loader dt_loader;

/* Creates a loader; all its memory (order and batch buffers) is allocated here, nothing later. It checks
   every index against the dataset. With prefetch it starts its thread. *out is NULL on failure. One thread
   at a time may call a loader's functions. */
dt_result dt_loader_create(dt_loader **out, const dt_loader_desc *d);
/* Stops the prefetch thread (also mid-epoch) and frees everything the loader allocated. NULL is allowed. */
void dt_loader_destroy(dt_loader *l);
/* Begins epoch `epoch` (>= 0), also in the middle of another one. The batches of an epoch are a pure
   function of (desc, epoch): the order is the indices shuffled by (seed, rank, epoch) (or as given), the
   transforms are dt_dataset_batch's for (seed, epoch); timing and prefetch never change them. */
dt_result dt_loader_start_epoch(dt_loader *l, int64_t epoch);
/* Next batch of the epoch: x [n, c, h, w] and y [n] point into the loader and stay valid until the next
   call on l. Returns 1 for a batch, 0 at the end of the epoch, -1 on error (dt_last_error). */
int dt_loader_next(dt_loader *l, const float **x, const int32_t **y, int64_t *n);
/* Batches per epoch: ceil(count / batch), or floor(count / batch) with drop_last. */
int64_t dt_loader_batches(const dt_loader *l);
/* Replaces the sample ids (count at most the count at create), e.g. with dt_sampler_indices's for the next
   epoch; ends the current epoch, and dt_loader_start_epoch uses the new ids. Copies them; allocates nothing. */
dt_result dt_loader_set_indices(dt_loader *l, const int64_t *indices, int64_t count);

/* ============================================================================================== */
/* 6. comm: topologies, the communicator and its backends, the launcher                          */
/* ============================================================================================== */

/* The graph over which decentralised algorithms (D-PSGD, gossip) average, and its mixing matrix W:
   rank i's new value is sum_j W[i][j] x_j over itself and its neighbours. */
typedef enum dt_topology_kind {
    DT_TOPO_RING = 0,      /* i - 1 and i + 1 (mod world): the D-PSGD ring */
    DT_TOPO_TORUS,         /* rows x cols grid with wrap-around: up to 4 neighbours */
    DT_TOPO_EXPONENTIAL,   /* i +- 2^k (mod world) for 2^k < world: log2(world) hops to anyone */
    DT_TOPO_FULL,          /* everyone: W = 1/world, the same as all-reduce */
    DT_TOPO_CUSTOM         /* the adjacency matrix given in the desc */
} dt_topology_kind;
typedef enum dt_mixing_kind {
    DT_MIXING_UNIFORM = 0, /* W[i][j] = 1 / (deg(i) + 1) for j in {i} u N(i): needs a regular graph */
    DT_MIXING_METROPOLIS   /* W[i][j] = 1 / (1 + max(deg(i), deg(j))), W[i][i] = 1 - the rest: any graph */
} dt_mixing_kind;
typedef struct dt_topology_desc {
    dt_topology_kind kind;
    int              world;      /* number of ranks, >= 1 */
    int              rows;       /* torus: rows (must divide world); 0 = the most square factorisation */
    const uint8_t   *adjacency;  /* custom: [world * world], nonzero = edge; must be symmetric */
    dt_mixing_kind   mixing;
} dt_topology_desc;
typedef struct dt_topology {
    int     world;
    double *weights;             /* [world, world] mixing matrix */
    int    *offsets;             /* [world + 1]: neighbours of rank i are neighbors[offsets[i] .. offsets[i+1]) */
    int    *neighbors;           /* ascending, without i itself */
    double  spectral_gap;        /* 1 - max(|lambda_2|, |lambda_min|) of W: how fast gossip mixes (0 = never);
                                    -1 when not computed (more than 1024 ranks) */
    double  lambda2;             /* the second largest |eigenvalue| */
} dt_topology;
/* Builds the graph and its mixing matrix and checks that W is symmetric, doubly stochastic and the graph
   connected (otherwise DT_ERR_INVALID_ARG naming the rank and what fails, and the fix); computes the
   spectral gap. *t is zeroed on failure. */
dt_result dt_topology_create(dt_topology *t, const dt_topology_desc *desc);
void      dt_topology_free(dt_topology *t);
const char *dt_topology_name(dt_topology_kind k);   /* "ring", "torus", ... */

/* ---- the communicator ------------------------------------------------------------------------ */

/* Element types a message or a reduction carries. */
typedef enum dt_dtype { DT_F32 = 0, DT_F64, DT_I32, DT_I64, DT_U8, DT_DTYPE_COUNT } dt_dtype;
size_t      dt_dtype_size(dt_dtype t);           /* bytes per element; 0 for an unknown type */
const char *dt_dtype_name(dt_dtype t);           /* "f32", ... */

/* Reductions. MEAN is SUM divided by the world size, for floating-point types only. */
typedef enum dt_reduce_op { DT_SUM = 0, DT_MEAN, DT_MAX, DT_MIN } dt_reduce_op;

/* How all-reduce, reduce and broadcast move data. Every algorithm but NATIVE is written once in this
   file over point-to-point messages, so it behaves and rounds the same on every backend:
     NAIVE   everyone sends to the root, the root reduces in rank order and sends the result back: the
             parameter-server pattern; 2 (p - 1) messages of n elements through one rank.
     RING    reduce-scatter then all-gather around the ring: 2 (p - 1) steps of n / p elements each, every
             link busy; the bandwidth-optimal choice for large n. Chunks are sent in segments so the
             next segment travels while the previous one is reduced.
     TREE    binomial tree to the root and back: 2 log2(p) steps of n elements; the latency-optimal choice
             for small n.
     NATIVE  the backend's own: a shared-memory all-reduce for local ranks, MPI_Allreduce for MPI.
   For a given world size, NAIVE, RING and TREE give bit-identical results on every backend; NATIVE
   is deterministic run to run but may round differently. AUTO (0) is the communicator's default. */
typedef enum dt_algo { DT_ALGO_AUTO = 0, DT_ALGO_NAIVE, DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_NATIVE, DT_ALGO_COUNT } dt_algo;
const char *dt_algo_name(dt_algo a);             /* "auto", "naive", "ring", "tree", "native" */
dt_result   dt_algo_parse(const char *s, dt_algo *out);

/* Per-rank traffic counters, since the communicator was created (or last reset). Bytes count payload
   this rank put on, or took off, a link: for point-to-point messages and the library's algorithms the
   exact figure; for NATIVE collectives that of a ring (2 (p - 1) / p n per rank). wait_seconds is the
   time the rank spent blocked, waiting for others. */
typedef struct dt_comm_stats {
    uint64_t bytes_sent, bytes_recv;
    uint64_t messages_sent, messages_recv;
    uint64_t collectives;                  /* collective calls made */
    double   wait_seconds;
} dt_comm_stats;

/* A pending point-to-point operation. It lives in the caller's memory and must stay where it is (not be
   copied or freed) until dt_comm_wait or dt_comm_test has completed it. */
typedef struct dt_request {
    int         kind;          /* 0 none or completed, 1 send, 2 receive */
    int         peer, tag;     /* destination or source; tag */
    int         owner;         /* posting rank */
    size_t      bytes;         /* posted size */
    size_t      received;      /* a completed receive: bytes that arrived (<= bytes) */
    const void *sbuf;
    void       *rbuf;
    uint64_t    sig[3];        /* the collective this message belongs to, for mismatch reports */
    double      not_before;    /* link model: the time the message has crossed the link */
    volatile int state;        /* backend's progress */
    dt_result   error;
    char       *error_msg;     /* backend's message when error != DT_OK (owned by the backend) */
    void       *next;          /* backend's queue link */
    uint64_t    impl[4];       /* backend's own (e.g. an MPI_Request) */
} dt_request;

typedef struct dt_comm dt_comm;

/* A backend: point-to-point transport plus optional native collectives (NULL = none; the library's
   algorithms are used). Deadlines are absolute dt_time_now() seconds; a backend returns DT_ERR_TIMEOUT
   past it, DT_ERR_PEER when the peer has gone, with a message from dt__comm_fail-style reports.
   Documented in docs/design.md; the local and self backends are in this file, MPI in dtrain_mpi.h. */
typedef struct dt_comm_backend {
    const char *name;
    dt_result (*isend)(dt_comm *c, const void *buf, size_t bytes, int dst, int tag, dt_request *req);
    dt_result (*irecv)(dt_comm *c, void *buf, size_t bytes, int src, int tag, dt_request *req);
    dt_result (*wait)(dt_comm *c, dt_request *req, double deadline);
    dt_result (*test)(dt_comm *c, dt_request *req, int *done);
    void      (*cancel)(dt_comm *c, dt_request *req);   /* after an error: withdraw a pending request */
    dt_result (*barrier)(dt_comm *c, double deadline);
    dt_result (*allreduce)(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, double deadline);
    dt_result (*broadcast)(dt_comm *c, void *buf, size_t bytes, int root, double deadline);
    /* appends to msg the ranks that have not reached collective seq (or "" when it cannot tell) */
    void      (*missing)(dt_comm *c, uint64_t seq, char *msg, size_t cap);
    /* tells the other ranks that this one failed (its message), so they stop waiting for it */
    void      (*fail)(dt_comm *c, dt_result r, const char *msg);
    void      (*destroy)(dt_comm *c);
} dt_comm_backend;

/* The communicator of one rank. Fields are read-only for users; dt_comm_rank()/dt_comm_size() read them. */
struct dt_comm {
    int                    rank, size;
    const dt_comm_backend *backend;
    void                  *impl;            /* backend state */
    dt_algo                algo;            /* what DT_ALGO_AUTO means for this communicator */
    double                 timeout;         /* seconds any single wait may last */
    size_t                 segment_bytes;   /* ring pipeline segment */
    uint64_t               seq;             /* collectives started: the number in error messages */
    uint64_t               sig[3];          /* the operation in progress (its signature) */
    uint64_t               coll_sig[3];     /* the collective in progress, published for other ranks'
                                               mismatch checks (a seqlock: [0] is written last) */
    int                    tag_ub;          /* largest tag the transport carries; user tags < DT_TAG_USER_MAX */
    dt_result              broken;          /* sticky: after a failure every call returns it */
    char                   broken_msg[512];
    dt_comm_stats          stats;
    void                  *scratch;         /* reused by the algorithms */
    size_t                 scratch_bytes;
    dt_request            *reqs;            /* reused by the algorithms */
    int                    nreqs;
    void                  *user;            /* free for the caller */
};

#define DT_TAG_USER_MAX  32767             /* user point-to-point tags are 0 .. DT_TAG_USER_MAX */
#define DT_TIMEOUT_DEFAULT 300.0           /* seconds; the environment variable DT_COMM_TIMEOUT overrides */

/* Options of a communicator; zero means the default. */
typedef struct dt_comm_desc {
    dt_algo algo;              /* default algorithm: 0 = NATIVE where the backend has one, else RING */
    double  timeout;           /* seconds a wait may last before DT_ERR_TIMEOUT: 0 = $DT_COMM_TIMEOUT or 300 */
    size_t  segment_bytes;     /* ring pipeline segment: 0 = 256 KiB */
    /* link model (local backend only; both 0 = off): each rank has one full-duplex link to a switch that
       sends and receives at most bandwidth bytes/s (messages queue behind each other on both ends), and
       every message arrives latency seconds after it has left. Under it the native all-reduce and
       broadcast run over messages too (as TREE for the broadcast; for the all-reduce as RING, or as TREE
       where the model makes that faster: short messages), so a NATIVE float sum rounds as that one's */
    double  link_latency;
    double  link_bandwidth;
} dt_comm_desc;

int  dt_comm_rank(const dt_comm *c);
int  dt_comm_size(const dt_comm *c);
const char *dt_comm_backend_name(const dt_comm *c);   /* "self", "local", "mpi" */

/* A communicator of one rank: every collective is a no-op or a copy, messages to itself are delivered.
   The same program is its own single-process baseline. Free with dt_comm_destroy. */
dt_result dt_comm_create_self(dt_comm **out, const dt_comm_desc *desc);
/* n local ranks in this process, for a caller that runs its own threads: out[0..n) are the ranks'
   communicators; each must be used by one thread only. Free each with dt_comm_destroy (after every rank
   has finished). Most programs use dt_launch instead. */
dt_result dt_comm_create_local(dt_comm **out, int n, const dt_comm_desc *desc);
/* Marks this rank as gone (its function returned r, with message msg): ranks waiting for it fail at once
   with DT_ERR_PEER instead of waiting for the timeout. dt_launch calls it when a rank function returns. */
void      dt_comm_leave(dt_comm *c, dt_result r, const char *msg);
void      dt_comm_destroy(dt_comm *c);

/* Point-to-point, blocking and non-blocking. Messages between two ranks with the same tag arrive in the
   order sent. A receive accepts at most count elements; *received (may be NULL) gets how many came.
   A send completes when the receiver has the data. */
dt_result dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag);
dt_result dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, size_t *received);
dt_result dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request *req);
dt_result dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request *req);
dt_result dt_comm_wait(dt_comm *c, dt_request *req);
dt_result dt_comm_waitall(dt_comm *c, dt_request *reqs, int n);
dt_result dt_comm_test(dt_comm *c, dt_request *req, int *done);

/* Collectives: every rank of the communicator calls the same ones in the same order with the same count,
   type, op and root; a rank that calls another, or another size, gets DT_ERR_MISMATCH rather than a wrong
   result. Buffers are in place where one buffer is given. algo 0 = the communicator's default. */
dt_result dt_comm_barrier(dt_comm *c);
dt_result dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_algo algo);
/* buf: in, and on root the result; other ranks' buf is left unchanged. */
dt_result dt_comm_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, int root, dt_algo algo);
dt_result dt_comm_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, dt_algo algo);
/* root's send[size * count] is split in rank order; each rank gets its count elements in recv. send is
   read on root only (NULL elsewhere). */
dt_result dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
/* each rank's send[count] lands at recv[rank * count] on root (recv NULL elsewhere). */
dt_result dt_comm_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
/* each rank's send[count] lands at recv[rank * count] on every rank (ring). */
dt_result dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
/* send[size * count] on every rank; rank r gets in recv[count] the reduction of everyone's block r (ring). */
dt_result dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_reduce_op op);
/* Neighbour exchange for gossip: send goes to each rank in to[0..nto), and recv[i * count] receives from
   from[i], i < nfrom. Every rank calls it (with its own lists; a rank may list none); the edges must
   match (a in b's to exactly when b in a's from). */
dt_result dt_comm_neighbor_exchange(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                                    const int *to, int nto, const int *from, int nfrom);

/* Counters of this rank (see dt_comm_stats), and their reset. */
dt_comm_stats dt_comm_get_stats(const dt_comm *c);   /* zeros for NULL */
void dt_comm_reset_stats(dt_comm *c);

/* ---- the launcher ---------------------------------------------------------------------------- */

/* A rank's work: its communicator and the argument given to dt_launch. Returning an error stops the
   run: the other ranks' waits for this one fail with DT_ERR_PEER. */
typedef dt_result (*dt_rank_fn)(dt_comm *comm, void *arg);

typedef struct dt_launch_desc {
    int          ranks;            /* local ranks (threads); 0 = 1. Ignored under mpiexec */
    int          threads_per_rank; /* OpenMP threads of each rank: 0 = cores / ranks, at least 1 */
    int          log_all_ranks;    /* show ranks > 0's info lines too (always shown: warnings, errors) */
    dt_comm_desc comm;
    const char  *trace_path;       /* write a timeline of every rank here (Chrome trace JSON); NULL = off */
    int64_t      trace_max_events; /* events kept per rank and lane; later ones are dropped and counted
                                      (0 = DT_TRACE_MAX_EVENTS) */
} dt_launch_desc;

#define DT_TRACE_MAX_EVENTS (1 << 19)   /* about 60 MB per lane at most, allocated as events come */

/* Takes the launcher's flags out of argv (argc updated), leaving the program's own:
     --ranks N            local ranks (threads in this process)
     --algo A             default collective algorithm: naive, ring, tree, native
     --timeout S          seconds a rank may wait for another before the run fails
     --link-latency S     link model: seconds per message (local ranks)
     --link-bandwidth B   link model: bytes per second per link, with suffix K, M or G (local ranks)
     --threads-per-rank T OpenMP threads per rank
     --log-all-ranks      show every rank's log lines, prefixed "[rank r]"
     --trace PATH         write a timeline of every rank's compute and communication to PATH (Chrome
                          trace JSON, for https://ui.perfetto.dev or chrome://tracing)
     --trace-max-events N events kept per rank and thread (default DT_TRACE_MAX_EVENTS)
   Returns DT_ERR_INVALID_ARG naming a bad value. */
dt_result dt_launch_parse(int *argc, char **argv, dt_launch_desc *d);

/* Runs fn on every rank and returns 0 when every rank returned DT_OK, else 1 after logging each failed
   rank's error. Under mpiexec (built with DT_USE_MPI) each process is one rank on MPI_COMM_WORLD;
   otherwise desc->ranks threads on the local backend (1 rank: the self backend). Log lines of rank r > 0
   are prefixed "[rank r]" and, unless log_all_ranks, only warnings and errors are shown. With trace_path,
   the timeline is written after the ranks have finished, also when one failed; a trace that cannot be
   written makes the run fail (1) with a message naming the path. Under MPI rank 0 gathers every rank's
   events and writes the file; when that fails (a rank has died) each rank writes PATH.rank<r>. */
int dt_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg);
/* The same on local ranks, returning each rank's result in results[ranks] (may be NULL) and the first
   failure (the lowest failed rank's) as the return value, with its message in dt_last_error(). */
dt_result dt_launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results);
/* The rank of the calling thread inside dt_launch (-1 outside): what the logger prefixes. */
int dt_current_rank(void);

/* ============================================================================================== */
/* 7. train: evaluation, checkpoints, the trainers (local SGD, Hogwild, DDP, D-PSGD, FedAvg)      */
/* ============================================================================================== */

/* Loss and accuracy of a classifier over samples idx[0..count) of ds (idx NULL = all), in eval mode
   (the mode is restored after). The loss is NLL when the model ends in dt_log_softmax, cross-entropy
   otherwise. topk (e.g. 5) also counts samples whose label is among the k highest scores. */
typedef struct dt_eval_result {
    double  loss;            /* mean over the samples */
    double  top1, topk;      /* fractions in [0, 1] */
    int64_t count;
    int     k;
} dt_eval_result;
dt_result dt_evaluate(dt_model *m, const dt_dataset *ds, const int64_t *idx, int64_t count, const dt_transform *t,
                      int64_t batch, int topk, dt_eval_result *out);

/* Checkpoints: parameters, buffers, the model's dropout RNG (seed, stream, step), optimizer state and step
   counts, and the caller's progress (epoch, step, round, an RNG). The file has a magic number, a version,
   the sizes, a signature of the model's parameter names and shapes, and a checksum. Saving writes
   "<path>.tmp", flushes it to disk and renames it over path, so a crash never leaves a half-written file
   in place. Loading checks everything before it changes the model: a file of another model, of another
   version, truncated or damaged is refused with a message naming the file and the cause. */
typedef struct dt_checkpoint_meta {
    int64_t epoch, step, round;   /* the caller's counters: e.g. epochs completed */
    dt_rng  rng;                  /* any RNG the caller wants restored */
} dt_checkpoint_meta;
/* o may be NULL (no optimizer state saved); meta may be NULL (zeros). */
dt_result dt_checkpoint_save(const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta);
/* o NULL skips the optimizer state in the file; meta NULL skips the counters. */
dt_result dt_checkpoint_load(const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta);

/* ---- local SGD and Hogwild ---------------------------------------------------------------------- */

/* Local SGD (periodic model averaging, the synchronous parallel SGD workload): every rank trains its
   replica on its own shard with its own optimizer, and every `period` steps the PARAMETERS of all ranks
   are replaced by their mean (one all-reduce over the flat parameter buffer). Between averages nothing is
   communicated, so it sends period times less than DDP; with period 1 and plain SGD it is DDP's update up
   to float rounding. Optimizer state (momentum, Adam's moments) stays local and is never averaged. */
typedef struct dt_localsgd_desc {
    int     period;         /* average at every period-th dt_localsgd_step; 0 = only at dt_localsgd_average
                               (e.g. once per epoch) */
    dt_algo algo;           /* all-reduce algorithm (0 = the communicator's default) */
    int     sync_buffers;   /* 1: average the buffers (BatchNorm running statistics) with the parameters */
} dt_localsgd_desc;

typedef struct dt_localsgd dt_localsgd;

/* Steps counted, averages made, and the seconds spent in them on this rank. */
typedef struct dt_localsgd_stats {
    int64_t steps, averages;
    double  comm_seconds;
} dt_localsgd_stats;

/* Collective. Wraps model m (finalized, the same architecture on every rank) on communicator c: checks that
   every rank has the same parameter count and broadcasts rank 0's parameters and buffers, so every rank
   starts equal. c and m must outlive it. Host buffers (the CPU backend). *out is NULL on failure. */
dt_result dt_localsgd_create(dt_localsgd **out, dt_comm *c, dt_model *m, const dt_localsgd_desc *desc);
void      dt_localsgd_destroy(dt_localsgd *d);                 /* NULL is allowed */
/* Call after each optimizer step. Collective on the calls that average (every period-th since the last
   average), so every rank must make the same number of calls between averages. */
dt_result dt_localsgd_step(dt_localsgd *d);
/* Collective: averages the parameters (and buffers, with sync_buffers) now, e.g. at the end of an epoch,
   and restarts the count of steps. */
dt_result dt_localsgd_average(dt_localsgd *d);
dt_localsgd_stats dt_localsgd_get_stats(const dt_localsgd *d);   /* zeros for NULL */

/* Hogwild (Recht et al., 2011): several threads of one process update ONE shared parameter buffer with
   plain SGD, without any lock, each on its own data. The races are intended: a worker may read parameters
   that another worker is halfway through updating, and two updates of the same element may lose one of
   them; for sparse or convex problems this costs little and removes all waiting. (So ThreadSanitizer
   reports dt_hogwild_pull and dt_hogwild_push, and the tests keep Hogwild out of its runs.)
   Each worker owns a replica: a dt_model of the same architecture for its activations and gradients. A
   step is: dt_hogwild_pull (shared parameters -> replica), forward, loss, backward on the replica,
   dt_hogwild_push (shared -= lr * gradient). */
typedef struct dt_hogwild_worker {
    int       index, threads;   /* this worker, of `threads` */
    dt_model *shared;           /* the model whose parameters every worker updates */
} dt_hogwild_worker;
typedef dt_result (*dt_hogwild_fn)(dt_hogwild_worker *w, void *arg);

/* Runs fn on `threads` threads (each with its dt_hogwild_worker) and waits for all of them; each gets
   cores / threads OpenMP threads. threads = 1 runs fn on the caller's thread; without thread support the
   workers run one after another. Returns DT_OK, or the lowest failed worker's result with its message. */
dt_result dt_hogwild_run(dt_model *shared, int threads, dt_hogwild_fn fn, void *arg);
/* Copies the shared model's parameters into the replica's (no lock: see above). Same parameter count. */
dt_result dt_hogwild_pull(dt_model *shared, dt_model *replica);
/* shared -= lr * the replica's gradient, element by element and without a lock, then zeroes the
   replica's gradient. With one worker this is exactly dt_optim_step with SGD (no momentum). */
dt_result dt_hogwild_push(dt_model *shared, dt_model *replica, float lr);

/* ---- DDP: data-parallel SGD over the flat gradient buffer ------------------------------------ */

/* How dt_ddp averages the gradients of the ranks. Each is a few lines over the flat buffer; they give the
   same average (up to float rounding) and differ in who sends what:
     BUCKETS       one all-reduce per bucket of about bucket_bytes of consecutive tensors, taken from the
                   end of the buffer (backward finishes the last layers first); with dt_ddp_backward on the
                   local backend a helper thread reduces each bucket as soon as backward has finished its
                   layers, so communication overlaps the rest of the backward pass (the default)
     FLAT          one all-reduce over the whole gradient buffer, after backward
     PER_LAYER     one all-reduce per parameter tensor, last tensor first
     PARAM_SERVER  dt_comm_gather of every gradient to rank 0, which sums them in rank order, then
                   dt_comm_broadcast (naive: rank 0 sends to each) of the result
     P2P           the same by hand: each rank isends its gradient to rank 0 and receives the sum back;
                   rank 0 irecvs from everyone, sums, isends to everyone (user tag DT_DDP_TAG)
   The all-reduce methods use desc.algo (naive, ring, tree, native; 0 = the communicator's default). */
typedef enum dt_ddp_method {
    DT_DDP_BUCKETS = 0, DT_DDP_FLAT, DT_DDP_PER_LAYER, DT_DDP_PARAM_SERVER, DT_DDP_P2P, DT_DDP_METHOD_COUNT
} dt_ddp_method;
const char *dt_ddp_method_name(dt_ddp_method k);             /* "buckets", "flat", "per-layer", "ps", "p2p" */
dt_result   dt_ddp_method_parse(const char *s, dt_ddp_method *out);

/* Default bucket size: SimpleCNN's gradient in 2 buckets, ResNet-20's in 4, so backward has something to
   overlap; docs/performance.md ("DDP bucket size", make bench-buckets) has the measurements from 16 KiB to 4 MiB. */
#define DT_DDP_BUCKET_BYTES (256 * 1024)
#define DT_DDP_TAG 32000                   /* the point-to-point tag of DT_DDP_P2P */

/* DDP settings; zero means the default. */
typedef struct dt_ddp_desc {
    dt_ddp_method method;       /* default BUCKETS */
    dt_algo       algo;         /* all-reduce algorithm of BUCKETS, FLAT, PER_LAYER (0 = communicator's default) */
    int64_t       bucket_bytes; /* BUCKETS: bytes of gradient per bucket (0 = DT_DDP_BUCKET_BYTES); a tensor is
                                   never split, so a bucket holds at least one tensor */
    int           no_overlap;   /* 1: BUCKETS reduce after backward, on the caller's thread */
    int           sync_buffers; /* 1: average the buffers (BatchNorm running statistics) at every gradient
                                   sync; 0: only when the caller calls dt_ddp_sync_buffers (e.g. each epoch) */
} dt_ddp_desc;

typedef struct dt_ddp dt_ddp;

/* What a rank's dt_ddp has done: gradient syncs, rounds it took part in after joining, and the seconds the
   caller's thread spent blocked in communication (with overlap: only the part backward did not hide). */
typedef struct dt_ddp_stats {
    int64_t syncs, joined_rounds;
    double  comm_seconds;
} dt_ddp_stats;

/* Collective. Wraps model m (finalized, the same architecture on every rank) for data-parallel training
   on communicator c: broadcasts rank 0's parameters and buffers so every rank starts equal, and plans the
   buckets. Both c and m must outlive the dt_ddp. Host buffers (the CPU backend). *out is NULL on failure. */
dt_result dt_ddp_create(dt_ddp **out, dt_comm *c, dt_model *m, const dt_ddp_desc *desc);
/* Stops the helper thread, removes the backward hook, frees what dt_ddp_create allocated. NULL is allowed. */
void      dt_ddp_destroy(dt_ddp *d);
/* Backward pass of a micro-batch of `samples` samples (its loss a mean over them), like dt_model_backward
   (dy as there). With sync = 0 nothing is communicated: the gradient accumulates, weighted by samples.
   With sync = 1 (collective) the accumulated gradients of all ranks are averaged, each sample weighing the
   same: afterwards every rank's dt_model_grads holds the gradient of the mean loss over all the samples
   of all ranks since the last sync. Then step the optimizer and zero the gradients. */
dt_result dt_ddp_backward(dt_ddp *d, const float *dy, int64_t samples, int sync);
/* Collective: the same averaging for a gradient computed by plain dt_model_backward calls, which the
   caller states is the mean over `samples` samples. Never overlapped. */
dt_result dt_ddp_sync(dt_ddp *d, int64_t samples);
/* Collective: call when this rank has no more batches (e.g. at the end of every epoch, on every rank).
   Until every rank has joined, it takes part in the others' gradient syncs with a zero gradient and zero
   weight and steps o (may be NULL) with the average, so its replica stays equal to theirs. Ranks with
   unequal numbers of batches thus finish the epoch without hanging. */
dt_result dt_ddp_join(dt_ddp *d, dt_optim *o);
/* Collective: averages the model's buffers (BatchNorm running mean and variance) over the ranks. */
dt_result dt_ddp_sync_buffers(dt_ddp *d);
/* Collective: broadcasts rank 0's parameters and buffers (what dt_ddp_create does). */
dt_result dt_ddp_broadcast_params(dt_ddp *d);
dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d);       /* zeros for NULL */
int          dt_ddp_buckets(const dt_ddp *d);         /* buckets planned (BUCKETS), else 0 */
int          dt_ddp_overlapped(const dt_ddp *d);      /* 1 when buckets are reduced during backward */

/* ---- D-PSGD ---------------------------------------------------------------------------------- */

/* Decentralised parallel SGD (Lian et al. 2017): no all-reduce; each rank keeps its own replica x_i and,
   every step, averages it with its neighbours' through the mixing matrix W of a dt_topology. In which
   order the local update and the averaging happen:
     COMBINE_THEN_ADAPT  the original D-PSGD: x_i <- sum_j W[i][j] x_j - lr g_i, where g_i is the gradient
                         at the replica before averaging (the default)
     ADAPT_THEN_COMBINE  step first, then average: x_i <- sum_j W[i][j] (x_j - lr g_j) */
typedef enum dt_dpsgd_order {
    DT_DPSGD_COMBINE_THEN_ADAPT = 0, DT_DPSGD_ADAPT_THEN_COMBINE, DT_DPSGD_ORDER_COUNT
} dt_dpsgd_order;
const char *dt_dpsgd_order_name(dt_dpsgd_order k);          /* "cta", "atc" */
dt_result   dt_dpsgd_order_parse(const char *s, dt_dpsgd_order *out);

/* D-PSGD settings; zero means the default. */
typedef struct dt_dpsgd_desc {
    dt_dpsgd_order order;       /* default COMBINE_THEN_ADAPT */
    int            mix_buffers; /* 1: also gossip the buffers (BatchNorm running statistics) every step */
} dt_dpsgd_desc;

typedef struct dt_dpsgd dt_dpsgd;

/* What a rank's dt_dpsgd has done: steps (gossip rounds), the payload bytes this rank sent in them (from
   dt_comm_get_stats; the all-reduces of dt_dpsgd_consensus and dt_dpsgd_average are not counted), and the
   seconds spent in the neighbour exchange. */
typedef struct dt_dpsgd_stats {
    int64_t  steps;
    uint64_t bytes_sent;
    double   comm_seconds;
} dt_dpsgd_stats;

/* Collective. Wraps model m (finalized, the same architecture on every rank) for D-PSGD on communicator c
   over topology t, which must have c's world size; broadcasts rank 0's parameters and buffers so the
   replicas start equal. c, m and t must outlive the dt_dpsgd. Host buffers. *out is NULL on failure. */
dt_result dt_dpsgd_create(dt_dpsgd **out, dt_comm *c, dt_model *m, const dt_topology *t, const dt_dpsgd_desc *desc);
/* Frees what dt_dpsgd_create allocated. NULL is allowed. */
void      dt_dpsgd_destroy(dt_dpsgd *d);
/* Collective: one D-PSGD step, after dt_model_backward, in place of dt_optim_step (then zero the gradients).
   Every rank sends its replica to its neighbours (dt_comm_neighbor_exchange) and mixes what it receives,
   summing W[i][j] x_j over j = 0, 1, ... (itself in its place) in double, so the result is the same on
   every backend. COMBINE_THEN_ADAPT: the replica x_i is sent, o steps x_i to x_i' with the gradient at
   x_i, and x_i becomes sum_j W[i][j] x_j + (x_i' - x_i): the update o computed before averaging (weight
   decay and momentum included) is added to the average. ADAPT_THEN_COMBINE: o steps first, then the
   stepped replicas are mixed. o NULL: a pure gossip step x_i <- sum_j W[i][j] x_j. */
dt_result dt_dpsgd_step(dt_dpsgd *d, dt_optim *o);
/* Collective: *dist = mean over ranks of ||x_i - x_avg|| (2-norm over all parameters), on every rank. */
dt_result dt_dpsgd_consensus(dt_dpsgd *d, double *dist);
/* Collective: out [dt_model_param_count] receives the mean of all replicas' parameters. out NULL: every
   rank's model itself is set to the mean parameters and mean buffers (for the final evaluation). */
dt_result dt_dpsgd_average(dt_dpsgd *d, float *out);
/* Evaluating the averaged model in the middle of training: use = 1 (collective) keeps this rank's replica
   aside and loads the mean parameters and buffers into the model; use = 0 (local) puts the replica back. */
dt_result dt_dpsgd_use_average(dt_dpsgd *d, int use);
dt_dpsgd_stats dt_dpsgd_get_stats(const dt_dpsgd *d);    /* zeros for NULL */

/* ---- FedAvg ---------------------------------------------------------------------------------- */

/* Federated averaging (McMahan et al. 2017) with robust aggregation. The server's aggregation is a pure
   function over flat float vectors (one update per client), so it is testable without ranks:
     MEAN       sum_i w_i u_i / sum_i w_i, the weights being the clients' sample counts (FedAvg)
     MEDIAN     coordinate-wise median (the mean of the two middle values when n is even)
     TRIMMED    coordinate-wise trimmed mean: t = floor(trim * n) smallest and t largest values dropped;
                refused when 2 t >= n
     KRUM       the update whose summed squared distance to its n - f - 2 nearest others is smallest
                (Blanchard et al. 2017); refused when n < 2 f + 3, Krum's minimum-client condition
     MULTIKRUM  the plain mean of the m updates of lowest Krum score (m = n - f by default); same condition
     CLASSMEAN  the class-mean check: the rows of the final linear layer's weight update, one per class, are
                compared across clients. For class c, d_c(i) = ||row_c(u_i) - coordinate median over clients
                of row_c|| and s_c = median over i of d_c(i); client i is an outlier when d_c(i) > k s_c for
                some class c. The others are averaged as MEAN. A label-flipping client moves the rows of the
                classes it flips, which honest clients leave alike. Needs n >= 3.
   Ties are broken by the lower client index, so the result is deterministic. */
typedef enum dt_fed_agg {
    DT_FED_MEAN = 0, DT_FED_MEDIAN, DT_FED_TRIMMED, DT_FED_KRUM, DT_FED_MULTIKRUM, DT_FED_CLASSMEAN, DT_FED_AGG_COUNT
} dt_fed_agg;
const char *dt_fed_agg_name(dt_fed_agg k);   /* "mean", "median", "trimmed", "krum", "multikrum", "classmean" */
dt_result   dt_fed_agg_parse(const char *s, dt_fed_agg *out);

/* Aggregator settings; zero means the default. */
typedef struct dt_fed_agg_desc {
    float   trim;              /* TRIMMED: fraction cut at each end (default 0.1) */
    int     f;                 /* KRUM, MULTIKRUM: Byzantine clients tolerated (default 1) */
    int     m;                 /* MULTIKRUM: updates averaged (0 = n - f) */
    float   k;                 /* CLASSMEAN: outlier threshold in median distances (default 3) */
    int64_t cm_offset;         /* CLASSMEAN: the final linear weight [cm_rows classes, cm_cols] inside each */
    int64_t cm_rows, cm_cols;  /*   update (dt_fed fills these from the model) */
    int    *kept;              /* out, may be NULL: [n], 1 for each client whose update entered the result
                                  (all for MEAN, MEDIAN and TRIMMED) */
} dt_fed_agg_desc;

/* Aggregates n updates, each updates[i][0..len), into out[len] (out may not alias an update). weights [n]
   (sample counts, > 0) are used by MEAN and CLASSMEAN; NULL means equal weights. Allocates scratch of
   n * (n + len) doubles at most (Krum's distances, a column for the median). desc may be NULL. */
dt_result dt_fed_aggregate(dt_fed_agg kind, const float *const *updates, const double *weights, int n, int64_t len,
                           float *out, const dt_fed_agg_desc *desc);

/* What a client does with its round, for studying attacks. */
typedef enum dt_fed_behaviour {
    DT_FED_HONEST = 0,
    DT_FED_LABELFLIP,          /* trains on labels mapped through desc.flip (e.g. 1 -> 4, or a permutation) */
    DT_FED_SIGNFLIP,           /* sends the negated update */
    DT_FED_NOISE               /* sends Gaussian noise of std desc.noise_std instead of its update */
} dt_fed_behaviour;

#define DT_FED_MAX_CLASSES 256
#define DT_FED_TAG 32100       /* the point-to-point tag of the clients' updates */

/* FedAvg settings; zero means the default. */
typedef struct dt_fed_desc {
    int                clients;          /* N simulated clients (default: ranks - 1, or 1 on one rank) */
    float              frac;             /* C: fraction of the clients sampled each round (default 1; at least 1) */
    int                local_epochs;     /* E (default 1) */
    int64_t            batch;            /* B (default 10) */
    dt_optim_desc      optim;            /* each client's optimizer, fresh every round (SGD or Adam) */
    dt_sched_desc      sched;            /* learning rate of round t = dt_sched_lr(&sched, t) when sched.kind or
                                            sched.base_lr is set (e.g. cosine with t_max = rounds); else optim.lr */
    float              prox_mu;          /* FedProx: mu (w - w_global) added to every local gradient (0 = off) */
    float              dropout_prob;     /* probability that a sampled client drops out of a round */
    dt_fed_agg         agg;
    dt_fed_agg_desc    agg_desc;         /* kept is set by dt_fed; cm_* from the model when zero */
    const dt_dataset  *data;             /* borrowed training set */
    const dt_partition *part;            /* borrowed: part k is client k's samples (parts == clients) */
    const dt_transform *transform;       /* copied; NULL = pixel / 255 */
    const int         *behaviour;        /* [clients] dt_fed_behaviour, copied; NULL = every client honest */
    int32_t            flip[DT_FED_MAX_CLASSES]; /* LABELFLIP: label y becomes flip[y]; all zeros = identity */
    int                flip_set;         /* 1: flip holds a map (else the identity) */
    float              noise_std;        /* NOISE: default 1 */
    uint64_t           seed;             /* client sampling, dropouts, loader shuffles, noise */
} dt_fed_desc;

typedef struct dt_fed dt_fed;

/* What one round did (complete on rank 0; the draw is known everywhere). */
typedef struct dt_fed_round_info {
    int     selected, dropped, kept;     /* clients sampled, dropped out, and in the aggregate */
    double  train_loss;                  /* mean local training loss over the samples of the clients that reported */
    int64_t samples;                     /* samples the reporting clients trained on, per local epoch */
    float   lr;                          /* the clients' learning rate this round */
} dt_fed_round_info;

/* Collective. Rank 0 is the server; client k trains on rank 1 + k mod (ranks - 1), or on rank 0 when there
   is one rank. m (finalized, the same architecture on every rank) is the server's global model on rank 0 and
   a rank's working copy elsewhere; rank 0's parameters are the initial global model. c, m, the dataset and
   the partition must outlive the dt_fed. *out is NULL on failure. */
dt_result dt_fed_create(dt_fed **out, dt_comm *c, dt_model *m, const dt_fed_desc *desc);
void      dt_fed_destroy(dt_fed *f);
/* Collective: one round. Every rank draws the same clients (seeded by (seed, round)) and the same dropouts,
   so nobody waits for a client that dropped; the global model is broadcast from rank 0; each host trains its
   sampled clients in client order, E epochs of batch B from the global model (client k's loader shuffles with
   stream k and epoch round * E + e), and sends delta = w_local - w_global and its sample count to rank 0,
   which aggregates and adds the result to the global model. Rank 0's model holds the new global model after.
   When dropouts leave fewer reports than the aggregator needs, the round keeps the global model (a warning);
   dt_fed_create refuses a C that samples too few clients for it in the first place. */
dt_result dt_fed_round(dt_fed *f, int64_t round, dt_fed_round_info *info);
/* The clients sampled in a round (sorted) and whether each drops out: a pure function of (desc, round).
   sel and dropped [clients]; returns the count sampled. */
int       dt_fed_draw(const dt_fed *f, int64_t round, int *sel, int *dropped);
/* Rank 0: which clients of the last round entered the aggregate, kept [clients] (1/0); others get zeros. */
void      dt_fed_last_kept(const dt_fed *f, int *kept);

#ifdef __cplusplus
}
#endif

/* The GPU backend's declarations in CUDA builds: dt_cuda_ops() is then a model's default backend (its
   implementation is dtrain_cuda.cu, compiled by nvcc). */
#ifdef DT_USE_CUDA
#include "dtrain_cuda.h"
#endif
#endif /* DTRAIN_H */

/* ============================================================================================== */
/* Loop bodies shared by the two backends: the CPU ops below and the CUDA kernels of dtrain_cuda.h  */
/* (compiled by nvcc, where DT__HD makes them device functions too), so both compute the same      */
/* numbers from one definition. Part of either implementation, never of the declarations.          */
/* ============================================================================================== */
#if (defined(DTRAIN_IMPLEMENTATION) || defined(DTRAIN_CUDA_IMPLEMENTATION)) && !defined(DTRAIN_SHARED_DONE)
#define DTRAIN_SHARED_DONE
#include <math.h>
#if defined(__CUDACC__)
#define DT__HD __host__ __device__
#else
#define DT__HD
#endif

/* splitmix64's finaliser: a good 64-bit mix, cheap on any backend */
static inline DT__HD uint64_t dt__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
/* dt_hash_uniform: the dropout masks are a pure function of (key, element), the same on every backend */
static inline DT__HD float dt__hash_uniform(uint64_t key, uint64_t counter) {
    uint64_t z = dt__mix64(key + 0x9e3779b97f4a7c15ULL * (counter + 1));
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* Max pooling of window (oy, ox) of the plane xp [h, w], checking every tap against the borders: the
   maximum, and its offset in *at (-1 when the window holds no pixel). The first maximum wins and NaN
   propagates, as in PyTorch. */
static inline DT__HD float dt__maxpool_window(const dt_conv_geom *g, const float *xp, int64_t oy, int64_t ox, int64_t *at) {
    float best = -INFINITY;
    int64_t bi = -1, ky, kx;
    for (ky = 0; ky < g->kh; ky++) {
        int64_t iy = oy * g->sh - g->ph + ky;
        if (iy < 0 || iy >= g->h) continue;
        for (kx = 0; kx < g->kw; kx++) {
            int64_t ix = ox * g->sw - g->pw + kx;
            float v;
            if (ix < 0 || ix >= g->w) continue;
            v = xp[iy * g->w + ix];
            if (bi < 0 || v > best || v != v) { best = v; bi = iy * g->w + ix; }
            if (v != v) { *at = bi; return best; }
        }
    }
    *at = bi;
    return best;
}
/* Average pooling of window (oy, ox) of the plane xp [h, w]; zero padding counts in the mean. */
static inline DT__HD float dt__avgpool_window(const dt_conv_geom *g, const float *xp, int64_t oy, int64_t ox) {
    float acc = 0.0f;
    int64_t ky, kx;
    for (ky = 0; ky < g->kh; ky++) {
        int64_t iy = oy * g->sh - g->ph + ky;
        if (iy < 0 || iy >= g->h) continue;
        for (kx = 0; kx < g->kw; kx++) {
            int64_t ix = ox * g->sw - g->pw + kx;
            if (ix >= 0 && ix < g->w) acc += xp[iy * g->w + ix];
        }
    }
    return acc * (1.0f / (float)(g->kh * g->kw));
}

/* sum_j exp(x_j - max) of a row x [k], in double, with the row's maximum in *mx */
static inline DT__HD double dt__exp_sum(const float *x, int64_t k, float *mx) {
    float m = -INFINITY;
    double sum = 0.0;
    int64_t j;
    for (j = 0; j < k; j++) m = x[j] > m ? x[j] : m;
    for (j = 0; j < k; j++) sum += exp((double)(x[j] - m));
    *mx = m;
    return sum;
}
/* y [k] = x - log(sum exp(x)) */
static inline DT__HD void dt__log_softmax_row(const float *x, float *y, int64_t k) {
    float mx;
    double sum = dt__exp_sum(x, k, &mx);
    float lse = mx + (float)log(sum);
    int64_t j;
    for (j = 0; j < k; j++) y[j] = x[j] - lse;
}
/* dx [k] += dy - exp(y) sum(dy), for y = log_softmax(x) */
static inline DT__HD void dt__log_softmax_row_bwd(const float *y, const float *dy, float *dx, int64_t k) {
    float sum = 0.0f;
    int64_t j;
    for (j = 0; j < k; j++) sum += dy[j];
    for (j = 0; j < k; j++) dx[j] += dy[j] - expf(y[j]) * sum;
}
/* Softmax cross-entropy of one row x [k] with its label, for a batch of n: dx [k] = (softmax(x) -
   onehot(label)) / n; returns the row's loss (NaN for a label outside [0, k)). */
static inline DT__HD double dt__softmax_xent_row(const float *x, int64_t label, int64_t k, int64_t n, float *dx) {
    float mx;
    double sum = dt__exp_sum(x, k, &mx), lse = (double)mx + log(sum);
    int64_t j;
    for (j = 0; j < k; j++) dx[j] = (float)((exp((double)x[j] - lse) - (j == label ? 1.0 : 0.0)) / (double)n);
    return label >= 0 && label < k ? lse - (double)x[label] : (double)NAN;
}
/* index of the first maximum of a row x [k] */
static inline DT__HD int64_t dt__argmax_row(const float *x, int64_t k) {
    int64_t best = 0, j;
    for (j = 1; j < k; j++)
        if (x[j] > x[best]) best = j;
    return best;
}

/* One element of the optimizers' updates (dt_ops.sgd_step, adam_step), in torch.optim's order. */
static inline DT__HD void dt__sgd_update(float *p, const float *g, float *buf, int64_t i, float lr, float momentum,
                                         float dampening, float wd, int nesterov, int first) {
    float d = wd != 0.0f ? g[i] + wd * p[i] : g[i];
    if (momentum != 0.0f) {
        float b = first ? d : buf[i] * momentum + (1.0f - dampening) * d;
        buf[i] = b;
        d = nesterov ? d + momentum * b : b;
    }
    p[i] -= lr * d;
}
static inline DT__HD void dt__adam_update(float *p, const float *g, float *m, float *v, int64_t i, float lr, float beta1,
                                          float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {
    float gi = g[i], pi = p[i];
    if (decoupled) pi *= 1.0f - lr * wd;
    else if (wd != 0.0f) gi += wd * pi;
    m[i] = m[i] * beta1 + (1.0f - beta1) * gi;
    v[i] = v[i] * beta2 + (1.0f - beta2) * gi * gi;
    p[i] = pi - step_size * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));
}
#endif /* the shared loop bodies */

/* ============================================================================================== */
/* ============================================================================================== */
/*                                        IMPLEMENTATION                                          */
/* ============================================================================================== */
/* ============================================================================================== */
#ifdef DTRAIN_IMPLEMENTATION
#ifndef DTRAIN_IMPLEMENTATION_DONE
#define DTRAIN_IMPLEMENTATION_DONE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <float.h>
#include <errno.h>
#ifdef DT_USE_ZLIB
#include <zlib.h>
#endif
#ifdef DT_USE_STB_IMAGE
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <dirent.h>
#include <sys/stat.h>
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
#include <immintrin.h>
#endif

#if defined(_OPENMP) && !defined(DT_NO_OPENMP)
#include <omp.h>
#define DT__HAVE_OMP 1
#define DT__PRAGMA(x) _Pragma(#x)
#define DT__OMP(x) DT__PRAGMA(omp x)
#else
#define DT__HAVE_OMP 0
#define DT__OMP(x)
#endif

#if defined(DT_MALLOC) && defined(DT_FREE) && defined(DT_REALLOC)
#elif !defined(DT_MALLOC) && !defined(DT_FREE) && !defined(DT_REALLOC)
#define DT_MALLOC(n) malloc(n)
#define DT_REALLOC(p, n) realloc(p, n)
#define DT_FREE(p) free(p)
#else
#error "dtrain: define all of DT_MALLOC, DT_REALLOC and DT_FREE, or none of them"
#endif
#ifndef DT_CONV_WORKSPACE
#define DT_CONV_WORKSPACE (1 << 24)
#endif

#ifdef __cplusplus
#define DT__THREAD_LOCAL thread_local
#define DT__RESTRICT __restrict
#else
#define DT__THREAD_LOCAL _Thread_local
#define DT__RESTRICT restrict
#endif
/* OpenMP only pays off above a few thousand elements; below, one thread is faster. */
#define DT__PAR_MIN 16384

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* 1. base                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

static DT__THREAD_LOCAL char dt__errmsg[512];

const char *dt_result_str(dt_result r) {
    switch (r) {
    case DT_OK: return "DT_OK";
    case DT_ERR_INVALID_ARG: return "DT_ERR_INVALID_ARG";
    case DT_ERR_SHAPE: return "DT_ERR_SHAPE";
    case DT_ERR_OUT_OF_MEMORY: return "DT_ERR_OUT_OF_MEMORY";
    case DT_ERR_STATE: return "DT_ERR_STATE";
    case DT_ERR_IO: return "DT_ERR_IO";
    case DT_ERR_FORMAT: return "DT_ERR_FORMAT";
    case DT_ERR_NUMERIC: return "DT_ERR_NUMERIC";
    case DT_ERR_UNSUPPORTED: return "DT_ERR_UNSUPPORTED";
    case DT_ERR_TIMEOUT: return "DT_ERR_TIMEOUT";
    case DT_ERR_PEER: return "DT_ERR_PEER";
    case DT_ERR_MISMATCH: return "DT_ERR_MISMATCH";
    case DT_ERR_COMM: return "DT_ERR_COMM";
    case DT_ERR_DEVICE: return "DT_ERR_DEVICE";
    default: return "DT_ERR_UNKNOWN";
    }
}

const char *dt_last_error(void) { return dt__errmsg; }

dt_result dt_set_error(dt_result r, const char *fmt, ...) {
    int n = snprintf(dt__errmsg, sizeof dt__errmsg, "%s: ", dt_result_str(r));
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof dt__errmsg) vsnprintf(dt__errmsg + n, sizeof dt__errmsg - (size_t)n, fmt, ap);
    va_end(ap);
    return r;
}

static dt_log_fn dt__log_fn = NULL;
static void *dt__log_user = NULL;
static int dt__log_level = DT_LOG_INFO;

void dt_log_configure(dt_log_fn fn, void *user, int max_level) {
    dt__log_fn = fn;
    dt__log_user = user;
    dt__log_level = max_level;
}

static DT__THREAD_LOCAL int dt__tls_rank = -1;   /* the rank of this thread inside dt_launch */
static int dt__log_all_ranks = 0;

void dt_log(int level, const char *fmt, ...) {
    char buf[1024];
    int n = 0;
    va_list ap;
    if (level > dt__log_level) return;
    if (dt__tls_rank > 0) {   /* rank 0's lines are the log; the others' show their rank, and only when asked */
        if (level > DT_LOG_WARN && !dt__log_all_ranks) return;
        n = snprintf(buf, sizeof buf, "[rank %d] ", dt__tls_rank);
    }
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (dt__log_fn) { dt__log_fn(dt__log_user, level, buf); return; }
    if (level <= DT_LOG_WARN) fprintf(stderr, "dtrain %s: %s\n", level == DT_LOG_ERROR ? "error" : "warning", buf);
    else fprintf(stderr, "%s\n", buf);
}

void dt_rng_init(dt_rng *r, uint64_t seed, uint64_t stream) {
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    (void)dt_rng_u32(r);
    r->state += seed;
    (void)dt_rng_u32(r);
}

uint32_t dt_rng_u32(dt_rng *r) {
    uint64_t old = r->state;
    uint32_t xorshifted, rot;
    r->state = old * 6364136223846793005ULL + r->inc;
    xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31u));
}

uint32_t dt_rng_below(dt_rng *r, uint32_t n) {
    uint32_t threshold, x;
    if (n == 0) return 0;
    threshold = (uint32_t)(-n) % n;
    for (;;) {
        x = dt_rng_u32(r);
        if (x >= threshold) return x % n;
    }
}

float dt_rng_uniform(dt_rng *r) { return (float)(dt_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

float dt_rng_normal(dt_rng *r) {
    float u1 = dt_rng_uniform(r), u2 = dt_rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

float dt_hash_uniform(uint64_t key, uint64_t counter) { return dt__hash_uniform(key, counter); }

double dt_time_now(void) {
    struct timespec ts;
#if defined(CLOCK_MONOTONIC)
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    timespec_get(&ts, TIME_UTC);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
void dt_timer_start(dt_timer *t) { t->start = dt_time_now(); }
double dt_timer_stop(dt_timer *t) {
    double lap = dt_time_now() - t->start;
    t->total += lap;
    t->count++;
    return lap;
}

void dt_progress_begin(dt_progress *p, void *file, int64_t total, int enabled) {
    memset(p, 0, sizeof *p);
    p->out = file ? file : stderr;
    p->total = total;
    p->enabled = enabled && total > 0;
    p->start = dt_time_now();
}
void dt_progress_update(dt_progress *p, int64_t done, const char *fmt, ...) {
    char text[160], bar[33];
    double now;
    int i, fill;
    va_list ap;
    if (!p || !p->enabled) return;
    now = dt_time_now();
    if (p->drawn && now - p->last_draw < 0.1 && done < p->total) return;
    p->last_draw = now;
    p->drawn = 1;
    fill = (int)(32 * (done < p->total ? done : p->total) / p->total);
    for (i = 0; i < 32; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[32] = 0;
    text[0] = 0;
    if (fmt) { va_start(ap, fmt); vsnprintf(text, sizeof text, fmt, ap); va_end(ap); }
    fprintf((FILE *)p->out, "\r%6lld/%lld [%s] %s\033[K", (long long)done, (long long)p->total, bar, text);
    fflush((FILE *)p->out);
}
void dt_progress_end(dt_progress *p) {
    if (!p || !p->enabled || !p->drawn) return;
    fprintf((FILE *)p->out, "\r\033[K");
    fflush((FILE *)p->out);
    p->drawn = 0;
}

/* ---- the timeline recorder ----------------------------------------------------------------------
   Every rank has DT__TRACE_LANES lanes (0: the rank's thread, 1: DDP's helper thread), and a thread
   records into the lane its thread-local pointer names: each lane has one writer, nothing is locked, and
   the launcher reads the lanes after the threads have been joined. NULL (tracing off, or a thread of no
   rank) costs one branch. Events are kept in begin order; a span's end fills in t1 of the event its
   begin appended, found through a stack of open spans. */
#define DT__TRACE_LANES 2
#define DT__TRACE_DEPTH 32     /* open spans per lane; deeper ones are dropped */
#define DT__TRACE_ARGS 3
typedef struct dt__trace_kv { const char *key, *s; int64_t v; } dt__trace_kv;   /* s NULL: the number v */
typedef struct dt__trace_ev {
    const char   *name, *cat;
    double        t0, t1;      /* seconds since the origin; t1 < 0: not ended yet */
    char          ph;          /* 'X' a span, 'i' an instant */
    char          nargs;
    dt__trace_kv  arg[DT__TRACE_ARGS];
} dt__trace_ev;
typedef struct dt__trace_lane {
    dt__trace_ev *ev;
    int64_t       n, cap, max, dropped;
    int64_t       open[DT__TRACE_DEPTH];   /* the open spans' events (-1: dropped) */
    int           depth, lane;
    double        origin;                  /* dt_time_now() of time 0 */
} dt__trace_lane;
static DT__THREAD_LOCAL dt__trace_lane *dt__tls_trace = NULL;

/* Appends an event; -1 when the lane is full (counted) or out of memory. */
static int64_t dt__trace_add(dt__trace_lane *L, const char *name, const char *cat, char ph) {
    dt__trace_ev *e;
    if (L->n == L->cap) {
        int64_t cap = L->cap ? 2 * L->cap : 1024;
        dt__trace_ev *p;
        if (cap > L->max) cap = L->max;
        if (cap <= L->n || !(p = (dt__trace_ev *)DT_REALLOC(L->ev, sizeof *p * (size_t)cap))) { L->dropped++; return -1; }
        L->ev = p;
        L->cap = cap;
    }
    e = &L->ev[L->n];
    e->name = name ? name : "?";
    e->cat = cat ? cat : "user";
    e->t0 = dt_time_now() - L->origin;
    e->t1 = ph == 'X' ? -1.0 : e->t0;
    e->ph = ph;
    e->nargs = 0;
    return L->n++;
}
void dt_trace_begin(const char *name, const char *category) {
    dt__trace_lane *L = dt__tls_trace;
    if (!L) return;
    if (L->depth < DT__TRACE_DEPTH) L->open[L->depth] = dt__trace_add(L, name, category, 'X');
    else L->dropped++;
    L->depth++;
}
void dt_trace_end(void) {
    dt__trace_lane *L = dt__tls_trace;
    if (!L || L->depth == 0) return;
    if (--L->depth < DT__TRACE_DEPTH && L->open[L->depth] >= 0) L->ev[L->open[L->depth]].t1 = dt_time_now() - L->origin;
}
void dt_trace_instant(const char *name, const char *category) {
    if (dt__tls_trace) (void)dt__trace_add(dt__tls_trace, name, category, 'i');
}
int dt_trace_enabled(void) { return dt__tls_trace != NULL; }

/* An argument of the innermost open span (shown by Perfetto when the span is selected): the number v, or
   the string s when s is not NULL. key and s are stored, like names. */
static void dt__trace_arg(const char *key, const char *s, int64_t v) {
    dt__trace_lane *L = dt__tls_trace;
    dt__trace_ev *e;
    if (!L || L->depth == 0 || L->depth > DT__TRACE_DEPTH || L->open[L->depth - 1] < 0) return;
    e = &L->ev[L->open[L->depth - 1]];
    if (e->nargs >= DT__TRACE_ARGS) return;
    e->arg[(int)e->nargs].key = key;
    e->arg[(int)e->nargs].s = s;
    e->arg[(int)e->nargs].v = v;
    e->nargs++;
}
/* Lane `lane` of the calling thread's rank (a rank's lanes are consecutive), for a thread it starts; or NULL. */
static dt__trace_lane *dt__trace_lane_of(int lane) {
    dt__trace_lane *L = dt__tls_trace;
    return L && lane < DT__TRACE_LANES ? L - L->lane + lane : NULL;
}
/* For a function whose span is opened deeper down (a collective's, by dt__coll_start): the depth before
   the call, and closing every span opened since, which passes the call's result through. */
static int dt__trace_mark(void) { return dt__tls_trace ? dt__tls_trace->depth : 0; }
static dt_result dt__trace_close(int mark, dt_result r) {
    while (dt__tls_trace && dt__tls_trace->depth > mark) dt_trace_end();
    return r;
}

/* ---------------------------------------------------------------------------------------------- */
/* 2. tensor and the CPU ops table                                                                */
/* ---------------------------------------------------------------------------------------------- */

dt_tensor dt_tensor_view(float *data, int ndim, const int64_t *shape) {
    dt_tensor t;
    int i;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.ndim = ndim < 0 ? 0 : (ndim > DT_MAX_DIMS ? DT_MAX_DIMS : ndim);
    for (i = 0; i < t.ndim; i++) t.shape[i] = shape ? shape[i] : 0;
    return t;
}
dt_tensor dt_tensor_4d(float *data, int64_t n, int64_t c, int64_t h, int64_t w) {
    int64_t s[4];
    s[0] = n; s[1] = c; s[2] = h; s[3] = w;
    return dt_tensor_view(data, 4, s);
}
int64_t dt_tensor_count(const dt_tensor *t) {
    int64_t n = 1;
    int i;
    for (i = 0; i < t->ndim; i++) n *= t->shape[i];
    return t->ndim ? n : 0;
}

dt_result dt_conv_geom_resolve(dt_conv_geom *g) {
    if (g->n < 0 || g->c <= 0 || g->h <= 0 || g->w <= 0 || g->kh <= 0 || g->kw <= 0 || g->sh <= 0 ||
        g->sw <= 0 || g->ph < 0 || g->pw < 0)
        return dt_set_error(DT_ERR_SHAPE, "window geometry needs positive sizes: input %lldx%lldx%lld, kernel %lldx%lld, "
                            "stride %lldx%lld, padding %lldx%lld", (long long)g->c, (long long)g->h, (long long)g->w,
                            (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw, (long long)g->ph,
                            (long long)g->pw);
    if (g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
        return dt_set_error(DT_ERR_SHAPE, "kernel %lldx%lld does not fit the padded input %lldx%lld (input %lldx%lld, "
                            "padding %lld): use a smaller kernel or more padding", (long long)g->kh, (long long)g->kw,
                            (long long)(g->h + 2 * g->ph), (long long)(g->w + 2 * g->pw), (long long)g->h,
                            (long long)g->w, (long long)g->ph);
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    return DT_OK;
}

int dt_cpu_threads(void) {
#if DT__HAVE_OMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

/* im2col's index arithmetic, the same for every stretch of a row (c, ky, kx): output columns [lo, hi) of
   any row read inside the image */
static void dt__col_cols(const dt_conv_geom *g, int64_t kx, int64_t *lo, int64_t *hi) {
    *lo = kx >= g->pw ? 0 : (g->pw - kx + g->sw - 1) / g->sw;
    *hi = g->w + g->pw - kx > 0 ? (g->w + g->pw - kx - 1) / g->sw + 1 : 0;
    if (*hi > g->ow) *hi = g->ow;
    if (*lo > *hi) *lo = *hi;
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
/* dt__col_span with AVX-512 into contiguous dst, in steps of three kinds: a whole image of at most 16 pixels
   and 16 outputs by one permutation of its plane; with stride 1 and same-size outputs whose rows tile 16
   lanes (or the other way round), 16 outputs at a time as 16 pixels of the plane shifted by (ky - ph,
   kx - pw), the lanes outside the image masked; else the rest of an output row, by masked loads and stores
   (stride 1) or one by one */
__attribute__((target("avx512f")))
static void dt__col_span_avx512(const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx, int64_t n, int64_t oy,
                                int64_t ox, int64_t len, float *DT__RESTRICT dst) {
    int64_t lo, hi, S = g->oh * g->ow, hw = g->h * g->w, i;
    __m512i vi = _mm512_setzero_si512();
    __m512i gv = _mm512_setzero_si512();
    __mmask16 vm = 0, colm = 0, gm = 0;
    int small = S <= 16 && hw <= 16, tile = 0;
    const int64_t per = S <= 8 ? 16 / S : 1;   /* images per 16 lanes */
    dt__col_cols(g, kx, &lo, &hi);
    if (small && len >= S) {   /* which pixel each output of an image reads (vm: inside the image) */
        int32_t idx[16];
        int64_t r = 0, col = 0, im = 0, l = 0;   /* counters, not divisions: this runs once per call */
        for (i = 0; i < 16; i++) {
            int64_t iy = r * g->sh - g->ph + ky, ix = col * g->sw - g->pw + kx;
            idx[i] = 0;
            if (i < S && iy >= 0 && iy < g->h && ix >= 0 && ix < g->w) { idx[i] = (int32_t)(iy * g->w + ix); vm |= (__mmask16)(1u << i); }
            if (++col == g->ow) { col = 0; r++; }
        }
        vi = _mm512_loadu_si512(idx);
        if (S <= 8) {   /* 16 / S images at a time: lane i reads pixel idx[i % S] of image i / S, by a gather */
            int32_t gi[16];
            for (i = 0; i < 16; i++) {
                gi[i] = im < per ? (int32_t)(im * g->c * hw) + idx[l] : 0;
                if (im < per && (vm >> l & 1u)) gm |= (__mmask16)(1u << i);
                if (++l == S) { l = 0; im++; }
            }
            gv = _mm512_loadu_si512(gi);
        }
    }
    tile = !small && len >= 16 && g->sw == 1 && g->sh == 1 && g->w == g->ow && g->h == g->oh && S % 16 == 0 &&
           (16 % g->ow == 0 || g->ow % 16 == 0);
    if (tile && g->ow < 16) {   /* 16 lanes = 16 / ow output rows; colm: the lanes inside the image's columns */
        int64_t col;
        for (i = 0, col = 0; i < 16; i++, col = col + 1 == g->ow ? 0 : col + 1)
            if (col >= lo && col < hi) colm |= (__mmask16)(1u << i);
    }
    while (len > 0) {
        int64_t end, iy, a, b, q;
        if (small && S <= 8 && ox == 0 && oy == 0 && len >= per * S) {
            const float *base = x + (n * g->c + c) * hw;
            _mm512_mask_storeu_ps(dst, (__mmask16)((1u << (per * S)) - 1u),
                                  _mm512_mask_i32gather_ps(_mm512_setzero_ps(), gm, gv, base, 4));
            dst += per * S; len -= per * S; n += per;
            continue;
        }
        if (small && ox == 0 && oy == 0 && len >= S) {
            __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << hw) - 1u), x + (n * g->c + c) * hw);
            _mm512_mask_storeu_ps(dst, (__mmask16)((1u << S) - 1u), _mm512_maskz_permutexvar_ps(vm, vi, v));
            dst += S; len -= S; n++;
            continue;
        }
        if (tile && len >= 16 && (g->ow < 16 ? ox == 0 && oy % (16 / g->ow) == 0 : ox % 16 == 0)) {
            /* 16 outputs at a time, to the image's end: pixels (oy + ky - ph, ox + kx - pw) on */
            const float *base = x + (n * g->c + c) * hw + (ky - g->ph) * g->w + kx - g->pw;
            __mmask16 m;
            if (g->ow < 16) {
                int64_t r16 = 16 / g->ow;
                for (; oy < g->oh && len >= 16; oy += r16, len -= 16, dst += 16) {
                    int64_t t0 = oy + ky - g->ph;   /* the first of the r16 input rows */
                    m = colm;
                    if (t0 < 0 || t0 + r16 > g->h) {
                        __mmask16 rows = 0;
                        for (i = 0; i < r16; i++)
                            if (t0 + i >= 0 && t0 + i < g->h) rows |= (__mmask16)(((1u << g->ow) - 1u) << (i * g->ow));
                        m &= rows;
                    }
                    _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(m, m ? base + oy * g->ow : x));
                }
            } else
                for (; oy < g->oh && len >= 16; len -= 16, dst += 16) {
                    int64_t t0 = oy + ky - g->ph, va = lo > ox ? lo - ox : 0, vb = hi - ox < 16 ? hi - ox : 16;
                    m = t0 >= 0 && t0 < g->h && va < vb ? (__mmask16)(((1u << vb) - 1u) & ~((1u << va) - 1u)) : (__mmask16)0;
                    _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(m, m ? base + oy * g->ow + ox : x));
                    if ((ox += 16) == g->ow) { ox = 0; oy++; }
                }
            if (oy == g->oh) { oy = 0; n++; }
            continue;
        }
        end = ox + len < g->ow ? ox + len : g->ow;
        iy = oy * g->sh - g->ph + ky;
        a = end; b = end;
        if (iy >= 0 && iy < g->h) {   /* [a, b): inside the image */
            a = lo < ox ? ox : lo > end ? end : lo;
            b = hi < a ? a : hi > end ? end : hi;
        }
        if (g->sw == 1) {
            const float *xr = a < b ? x + ((n * g->c + c) * g->h + iy) * g->w + kx - g->pw : x;
            for (q = ox; q < end; q += 16) {
                int64_t m = end - q < 16 ? end - q : 16, va = a > q ? a : q, vb = b < q + m ? b : q + m;
                __mmask16 lm = va < vb ? (__mmask16)(((1u << (vb - q)) - 1u) & ~((1u << (va - q)) - 1u)) : (__mmask16)0;
                _mm512_mask_storeu_ps(dst, (__mmask16)((1u << m) - 1u), _mm512_maskz_loadu_ps(lm, lm ? xr + q : x));
                dst += m;
            }
        } else {
            for (i = ox; i < a; i++) *dst++ = 0.0f;
            if (a < b) {
                const float *xr = x + ((n * g->c + c) * g->h + iy) * g->w + kx - g->pw;
                for (i = a; i < b; i++) *dst++ = xr[i * g->sw];
            }
            for (i = b; i < end; i++) *dst++ = 0.0f;
        }
        len -= end - ox;
        ox = 0;
        if (++oy == g->oh) { oy = 0; n++; }
    }
}
#define DT__COL_SPAN_AVX512 1
#endif

/* One stretch of a row of im2col(x) for geometry g, never materialised whole: row (c, ky, kx) of col
   [c*kh*kw, n*oh*ow], the `len` columns from output position (n, oy, ox) on, written to dst[i * stride].
   Reads zero outside the image (the padding). im2col and the convolution GEMMs' packing share it. */
static void dt__col_span(const dt_conv_geom *g, const float *x, int64_t c, int64_t ky, int64_t kx, int64_t n, int64_t oy,
                         int64_t ox, int64_t len, float *DT__RESTRICT dst, int64_t stride) {
    int64_t lo, hi;
#ifdef DT__COL_SPAN_AVX512
    if (stride == 1 && __builtin_cpu_supports("avx512f")) {
        dt__col_span_avx512(g, x, c, ky, kx, n, oy, ox, len, dst);
        return;
    }
#endif
    dt__col_cols(g, kx, &lo, &hi);
    while (len > 0) {
        int64_t end = ox + len < g->ow ? ox + len : g->ow, iy = oy * g->sh - g->ph + ky, a = end, b = end, i;
        if (iy >= 0 && iy < g->h) {   /* [a, b): inside the image */
            a = lo < ox ? ox : lo > end ? end : lo;
            b = hi < a ? a : hi > end ? end : hi;
        }
        for (i = ox; i < a; i++, dst += stride) *dst = 0.0f;
        if (a < b) {
            const float *xr = x + ((n * g->c + c) * g->h + iy) * g->w + kx - g->pw;   /* + ox * sw: output column ox */
            if (g->sw == 1 && stride == 1) {   /* short stretches: a loop, not a call to memcpy */
                const float *src = xr + a;
                for (i = 0; i < b - a; i++) dst[i] = src[i];
                dst += b - a;
            }
            else for (i = a; i < b; i++, dst += stride) *dst = xr[i * g->sw];
        }
        for (i = b; i < end; i++, dst += stride) *dst = 0.0f;
        len -= end - ox;
        ox = 0;
        if (++oy == g->oh) { oy = 0; n++; }
    }
}

/* Where a GEMM's op(B) comes from: a matrix B with row stride ldb (transposed when tb), or, when g is set,
   im2col(B) of the images B with geometry g, packed straight from the images and never materialised:
   op(B) = col [c*kh*kw, n*oh*ow] (tb = 0) or its transpose (tb = 1). */
typedef struct dt__bsrc { const float *B; int64_t ldb; int tb; const dt_conv_geom *g; } dt__bsrc;

/* op(B)[p][j] of a B source */
static float dt__bval(const dt__bsrc *bs, int64_t p, int64_t j) {
    const dt_conv_geom *g = bs->g;
    float v;
    if (!g) return bs->tb ? bs->B[j * bs->ldb + p] : bs->B[p * bs->ldb + j];
    {
        int64_t k = bs->tb ? j : p, pos = bs->tb ? p : j, S = g->oh * g->ow;
        dt__col_span(g, bs->B, k / (g->kh * g->kw), k / g->kw % g->kh, k % g->kw, pos / S, pos % S / g->ow, pos % g->ow, 1, &v, 1);
    }
    return v;
}

/* The unblocked GEMM: a double accumulator per element, in order of p. */
static void dt__gemm_ref_src(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                             const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    int64_t i, j, p;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double acc = 0.0;
            for (p = 0; p < K; p++) acc += (double)(ta ? A[p * lda + i] : A[i * lda + p]) * (double)dt__bval(bs, p, j);
            C[i * ldc + j] = (float)(alpha * acc) + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
        }
}

void dt_gemm_ref(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__gemm_ref_src(ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}

/* Blocked GEMM after Goto & van de Geijn: for each (NC x KC) block of op(B), packed into NR-wide
   panels that stay in L2, and each (MC x KC) block of op(A), packed into MR-tall panels, an MR x NR
   micro-kernel accumulates in registers: each A panel (MR x KC, a few KiB) stays in L1 while the B panels
   stream past it from L2. Transposes are absorbed by the packing, so the micro-kernel sees one layout.
   Edges are zero-padded in the packed panels and clipped when written back. MR and NR are the
   micro-kernel's (chosen at run time for the CPU); KC, MC and NC are shared, and K and N are cut into
   blocks of equal size (at most KC, NC) so no block is a sliver. */
#ifndef DT__KC
#define DT__KC 256
#define DT__MC 1248
#define DT__NC 1152
#endif
#define DT__MR_MAX 16
#define DT__NR_MAX 48
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
/* An 8-tall panel of A's rows with AVX: dst[p * 8 + i] = A[i * lda + p] for p < kc8 (a multiple of 8),
   transposing 8 x 8 tiles in registers */
__attribute__((target("avx")))
static void dt__pack_a8_avx(const float *A, int64_t lda, int64_t kc8, float *dst) {
    int64_t p;
    for (p = 0; p < kc8; p += 8) {
        __m256 r[8], t[8], u[8];
        int i;
        for (i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(A + i * lda + p);
        for (i = 0; i < 4; i++) {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (i = 0; i < 2; i++) {   /* u[4i + k]: column k (low half) and k + 4 (high half) of rows 4i..4i+3 */
            u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
            u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
            u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
            u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        for (i = 0; i < 4; i++) {
            _mm256_storeu_ps(dst + (p + i) * 8, _mm256_permute2f128_ps(u[i], u[4 + i], 0x20));
            _mm256_storeu_ps(dst + (p + i + 4) * 8, _mm256_permute2f128_ps(u[i], u[4 + i], 0x31));
        }
    }
}
#define DT__PACK_A8_AVX 1
#endif

/* Ap: the mc x kc block of op(A) at (i0, p0) as MR-tall panels, each kc x MR (row p holds MR rows' values) */
static void dt__pack_a(int ta, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float *Ap, int MR) {
    int64_t ir, p, i;
#ifdef DT__PACK_A8_AVX
    const int simd = MR == 8 && !ta && __builtin_cpu_supports("avx");   /* 1: 8-tall panels by 8 x 8 transposes */
#endif
    for (ir = 0; ir < mc; ir += MR) {
        int64_t mr = mc - ir < MR ? mc - ir : MR, p8 = 0;
        float *dst = Ap + ir * kc;
        if (ta) {   /* op(A) = A^T: the MR values of a row p are contiguous in A */
            for (p = 0; p < kc; p++) {
                const float *src = A + (p0 + p) * lda + i0 + ir;
                if (mr == 8 && MR == 8) { for (i = 0; i < 8; i++) dst[p * 8 + i] = src[i]; continue; }
                for (i = 0; i < mr; i++) dst[p * MR + i] = src[i];
                for (; i < MR; i++) dst[p * MR + i] = 0.0f;
            }
            continue;
        }
#ifdef DT__PACK_A8_AVX
        if (simd && mr == 8) {
            p8 = kc / 8 * 8;
            dt__pack_a8_avx(A + (i0 + ir) * lda + p0, lda, p8, dst);
        }
#endif
        for (i = 0; i < mr; i++) {   /* row by row of A, each read along k */
            const float *src = A + (i0 + ir + i) * lda + p0;
            for (p = p8; p < kc; p++) dst[p * MR + i] = src[p];
        }
        for (; i < MR; i++)
            for (p = 0; p < kc; p++) dst[p * MR + i] = 0.0f;
    }
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
/* A panel of op(B) = B^T with AVX-512: dst[p * NR + j] = B[j * ldb + p] for p < kc, j < nr (NR a multiple
   of 16; zero for j >= nr), transposing 16 x 16 tiles in registers. */
__attribute__((target("avx512f")))
static void dt__pack_bt_avx512(const float *B, int64_t ldb, int64_t kc, int64_t nr, float *dst, int NR) {
    const __mmask16 all = 0xFFFF;   /* the zero-masking forms: no undefined inputs for gcc to warn about */
    int64_t q, p0;
    for (q = 0; q < NR; q += 16)
        for (p0 = 0; p0 < kc; p0 += 16) {
            __m512 r[16], t[16], u[16];
            __mmask16 pm = kc - p0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (kc - p0)) - 1u);
            int i, k;
            for (i = 0; i < 16; i++)
                r[i] = q + i < nr ? _mm512_maskz_loadu_ps(pm, B + (q + i) * ldb + p0) : _mm512_setzero_ps();
            for (i = 0; i < 8; i++) {
                t[2 * i] = _mm512_maskz_unpacklo_ps(all, r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * i], r[2 * i + 1]);
            }
            for (i = 0; i < 4; i++) {   /* u[4i + k], lane L: column 4L + k of rows 4i..4i+3 */
                u[4 * i] = _mm512_maskz_shuffle_ps(all, t[4 * i], t[4 * i + 2], 0x44);
                u[4 * i + 1] = _mm512_maskz_shuffle_ps(all, t[4 * i], t[4 * i + 2], 0xEE);
                u[4 * i + 2] = _mm512_maskz_shuffle_ps(all, t[4 * i + 1], t[4 * i + 3], 0x44);
                u[4 * i + 3] = _mm512_maskz_shuffle_ps(all, t[4 * i + 1], t[4 * i + 3], 0xEE);
            }
            for (k = 0; k < 4; k++) {   /* column 4L + k of all 16 rows */
                __m512 x0 = _mm512_maskz_shuffle_f32x4(all, u[k], u[4 + k], 0x44), x1 = _mm512_maskz_shuffle_f32x4(all, u[k], u[4 + k], 0xEE);
                __m512 y0 = _mm512_maskz_shuffle_f32x4(all, u[8 + k], u[12 + k], 0x44), y1 = _mm512_maskz_shuffle_f32x4(all, u[8 + k], u[12 + k], 0xEE);
                r[k] = _mm512_maskz_shuffle_f32x4(all, x0, y0, 0x88);
                r[4 + k] = _mm512_maskz_shuffle_f32x4(all, x0, y0, 0xDD);
                r[8 + k] = _mm512_maskz_shuffle_f32x4(all, x1, y1, 0x88);
                r[12 + k] = _mm512_maskz_shuffle_f32x4(all, x1, y1, 0xDD);
            }
            for (i = 0; i < 16 && p0 + i < kc; i++) _mm512_storeu_ps(dst + (p0 + i) * NR + q, r[i]);
        }
}
#define DT__PACK_BT_AVX512 1
#endif

/* rows of B [rows, nc] (row stride ldb) into the NR-wide panels of a kc-row block (dst: the first row's
   place in the first panel): row by row, so the reads stream through memory in order instead of hopping
   between kc rows for every panel */
static void dt__pack_b_rows(const float *B, int64_t ldb, int64_t rows, int64_t nc, float *dst, int64_t kc, int NR) {
    int64_t p, jr, j, full = nc / NR * NR;
    for (p = 0; p < rows; p++, dst += NR) {
        const float *src = B + p * ldb;
        if (NR == 48)   /* the AVX-512 kernel's panels: a copy of constant length, unrolled */
            for (jr = 0; jr < full; jr += 48) {
                float *d = dst + jr * kc;
                for (j = 0; j < 48; j++) d[j] = src[jr + j];
            }
        else
            for (jr = 0; jr < full; jr += NR) {
                float *d = dst + jr * kc;
                for (j = 0; j < NR; j++) d[j] = src[jr + j];
            }
        if (full < nc) {
            float *d = dst + full * kc;
            for (j = 0; j < nc - full; j++) d[j] = src[full + j];
            for (; j < NR; j++) d[j] = 0.0f;
        }
    }
}

/* Bp: the kc x nc block of op(B) at (p0, j0) as NR-wide panels, each kc x NR; tmp: KC x NR_MAX floats of
   scratch (at least NC: a row of the block) */
static void dt__pack_b(const dt__bsrc *bs, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float *Bp, int NR, float *tmp) {
    const float *B = bs->B;
    const dt_conv_geom *g = bs->g;
    int64_t jr, ldb = bs->ldb;
    for (jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR, p, j;
        float *dst = Bp + jr * kc;
        if (g && !bs->tb) {         /* rows p: col rows p0 + p from output position j0 on, each whole into tmp */
            int64_t S = g->oh * g->ow, n = j0 / S, oy = j0 % S / g->ow, ox = j0 % g->ow;
            int64_t c = p0 / (g->kh * g->kw), ky = p0 / g->kw % g->kh, kx = p0 % g->kw;
            for (p = 0; p < kc; p++) {
                dt__col_span(g, B, c, ky, kx, n, oy, ox, nc, tmp, 1);
                dt__pack_b_rows(tmp, nc, 1, nc, Bp + p * NR, kc, NR);
                if (++kx == g->kw) { kx = 0; if (++ky == g->kh) { ky = 0; c++; } }
            }
            return;
        } else if (g) {             /* columns j: col rows j0 + jr + j, each read from output position p0 on */
            int64_t S = g->oh * g->ow, n = p0 / S, oy = p0 % S / g->ow, ox = p0 % g->ow;
            int simd = 0;           /* 1: the rows go into tmp, then a 16 x 16 transpose packs them */
#ifdef DT__PACK_BT_AVX512
            simd = NR % 16 == 0 && __builtin_cpu_supports("avx512f");
#endif
            for (j = 0; j < nr; j++) {
                int64_t k = j0 + jr + j;
                dt__col_span(g, B, k / (g->kh * g->kw), k / g->kw % g->kh, k % g->kw, n, oy, ox, kc,
                             simd ? tmp + j * kc : dst + j, simd ? 1 : NR);
            }
#ifdef DT__PACK_BT_AVX512
            if (simd) { dt__pack_bt_avx512(tmp, kc, kc, nr, dst, NR); continue; }
#endif
            for (; j < NR; j++)
                for (p = 0; p < kc; p++) dst[p * NR + j] = 0.0f;
        } else if (!bs->tb) {       /* rows of B are contiguous along n: read each whole, for every panel */
            dt__pack_b_rows(B + p0 * ldb + j0, ldb, kc, nc, Bp, kc, NR);
            return;
        } else {                    /* op(B) = B^T: read each row of B along k */
#ifdef DT__PACK_BT_AVX512
            if (NR % 16 == 0 && __builtin_cpu_supports("avx512f")) {
                dt__pack_bt_avx512(B + (j0 + jr) * ldb + p0, ldb, kc, nr, dst, NR);
                continue;
            }
#endif
            for (j = 0; j < nr; j++) {
                const float *src = B + (j0 + jr + j) * ldb + p0;
                for (p = 0; p < kc; p++) dst[p * NR + j] = src[p];
            }
            for (; j < NR; j++)
                for (p = 0; p < kc; p++) dst[p * NR + j] = 0.0f;
        }
    }
}

/* C[mr, nr] = alpha c + beta C, the clipped write-back of a micro-tile c (row stride ldt; beta == 0
   never reads C) */
static void dt__micro_store(const float *c, int64_t ldt, float *C, int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {
    int64_t i, j;
    for (i = 0; i < mr; i++) {
        float *crow = C + i * ldc;
        const float *t = c + i * ldt;
        if (beta == 0.0f)
            for (j = 0; j < nr; j++) crow[j] = alpha * t[j];
        else if (beta == 1.0f)
            for (j = 0; j < nr; j++) crow[j] += alpha * t[j];
        else
            for (j = 0; j < nr; j++) crow[j] = alpha * t[j] + beta * crow[j];
    }
}

/* The portable micro-kernel, 6 x 16: c[MR][NR] = sum_p a[p][:] x b[p][:]; then C = alpha c + beta C.
   Written so that the inner loop over NR contiguous floats vectorises. */
static void dt__micro(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                      int64_t mr, int64_t nr, float alpha, float beta) {
    float c[6][16];
    int64_t p, i, j;
    memset(c, 0, sizeof c);
    for (p = 0; p < kc; p++) {
        const float *bp = b + p * 16;
        const float *ap = a + p * 6;
        for (i = 0; i < 6; i++) {
            float av = ap[i];
            for (j = 0; j < 16; j++) c[i][j] += av * bp[j];
        }
    }
    dt__micro_store(&c[0][0], 16, C, ldc, mr, nr, alpha, beta);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(DT_NO_SIMD)
#define DT__X86 1
/* x86 micro-kernels, chosen at run time. AVX2 + FMA: 6 rows x 2 vectors of 8 = 12 accumulator
   registers of 16, the shape that keeps both FMA units of a core busy. */
__attribute__((target("avx2,fma")))
static void dt__micro_avx2(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                           int64_t mr, int64_t nr, float alpha, float beta) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    float c[6][16];
    int64_t p;
    for (p = 0; p < kc; p++) {
        __m256 b0 = _mm256_loadu_ps(b + p * 16), b1 = _mm256_loadu_ps(b + p * 16 + 8), av;
        const float *ap = a + p * 6;
        av = _mm256_broadcast_ss(ap + 0); c00 = _mm256_fmadd_ps(av, b0, c00); c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(ap + 1); c10 = _mm256_fmadd_ps(av, b0, c10); c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(ap + 2); c20 = _mm256_fmadd_ps(av, b0, c20); c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(ap + 3); c30 = _mm256_fmadd_ps(av, b0, c30); c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(ap + 4); c40 = _mm256_fmadd_ps(av, b0, c40); c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(ap + 5); c50 = _mm256_fmadd_ps(av, b0, c50); c51 = _mm256_fmadd_ps(av, b1, c51);
    }
    if (mr == 6 && nr == 16 && alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
        /* a whole tile with the common scalars: straight from the registers to C */
        __m256 *acc[6][2];
        int64_t i;
        acc[0][0] = &c00; acc[0][1] = &c01; acc[1][0] = &c10; acc[1][1] = &c11; acc[2][0] = &c20; acc[2][1] = &c21;
        acc[3][0] = &c30; acc[3][1] = &c31; acc[4][0] = &c40; acc[4][1] = &c41; acc[5][0] = &c50; acc[5][1] = &c51;
        for (i = 0; i < 6; i++) {
            float *crow = C + i * ldc;
            if (beta == 0.0f) {
                _mm256_storeu_ps(crow, *acc[i][0]);
                _mm256_storeu_ps(crow + 8, *acc[i][1]);
            } else {
                _mm256_storeu_ps(crow, _mm256_add_ps(_mm256_loadu_ps(crow), *acc[i][0]));
                _mm256_storeu_ps(crow + 8, _mm256_add_ps(_mm256_loadu_ps(crow + 8), *acc[i][1]));
            }
        }
        return;
    }
    _mm256_storeu_ps(c[0], c00); _mm256_storeu_ps(c[0] + 8, c01);
    _mm256_storeu_ps(c[1], c10); _mm256_storeu_ps(c[1] + 8, c11);
    _mm256_storeu_ps(c[2], c20); _mm256_storeu_ps(c[2] + 8, c21);
    _mm256_storeu_ps(c[3], c30); _mm256_storeu_ps(c[3] + 8, c31);
    _mm256_storeu_ps(c[4], c40); _mm256_storeu_ps(c[4] + 8, c41);
    _mm256_storeu_ps(c[5], c50); _mm256_storeu_ps(c[5] + 8, c51);
    dt__micro_store(&c[0][0], 16, C, ldc, mr, nr, alpha, beta);
}

/* AVX-512: DT__MR512 rows x DT__NV512 vectors of 16, the accumulators in zmm registers (32 of them);
   edges are written with masked loads and stores, so every tile leaves from the registers. */
#ifndef DT__MR512
#define DT__MR512 8
#define DT__NV512 3
#endif
/* the kernel's body for the first nv vectors of the tile (nv constant where it is inlined): a panel's last
   tile of 32 or 16 columns runs only the multiply-adds it keeps */
__attribute__((target("avx512f"), always_inline))
static inline void dt__micro512_nv(int nv, int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C,
                                   int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {
    __m512 c[DT__MR512][DT__NV512], va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[DT__NV512];
    int64_t p;
    int i, v;
    for (i = 0; i < DT__MR512 && i < mr; i++)   /* C's tile is read only at the end: fetch it meanwhile */
        for (v = 0; v < nv; v++) _mm_prefetch((const char *)(C + i * ldc + 16 * v), _MM_HINT_T0);
    for (i = 0; i < DT__MR512; i++)
        for (v = 0; v < DT__NV512; v++) c[i][v] = _mm512_setzero_ps();   /* all: no register left undefined */
    for (p = 0; p < kc; p++) {
        const float *bp = b + p * (16 * DT__NV512), *ap = a + p * DT__MR512;
        __m512 bv[DT__NV512];
        /* B's panels stream from L2: ask for them 16 steps ahead (the hardware prefetcher alone falls behind) */
        for (v = 0; v < nv; v++) _mm_prefetch((const char *)(bp + 16 * 16 * DT__NV512 + 16 * v), _MM_HINT_T0);
        for (v = 0; v < nv; v++) bv[v] = _mm512_loadu_ps(bp + 16 * v);
        for (i = 0; i < DT__MR512; i++) {
            __m512 av = _mm512_set1_ps(ap[i]);
            for (v = 0; v < nv; v++) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
        }
    }
    if (mr == DT__MR512 && nr == 16 * DT__NV512 && alpha == 1.0f) {
        /* a whole tile: loops of constant length, so the accumulators never leave the registers */
        for (i = 0; i < DT__MR512; i++)
            for (v = 0; v < DT__NV512; v++) {
                float *cp = C + i * ldc + 16 * v;
                if (beta == 0.0f) _mm512_storeu_ps(cp, c[i][v]);
                else if (beta == 1.0f) _mm512_storeu_ps(cp, _mm512_add_ps(c[i][v], _mm512_loadu_ps(cp)));
                else _mm512_storeu_ps(cp, _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), c[i][v]));
            }
        return;
    }
    for (v = 0; v < DT__NV512; v++) {
        int64_t left = v < nv ? nr - 16 * v : 0;
        mask[v] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
    }
    for (i = 0; i < DT__MR512 && i < mr; i++) {
        float *crow = C + i * ldc;
        for (v = 0; v < nv; v++) {
            __m512 r = alpha == 1.0f ? c[i][v] : _mm512_mul_ps(va, c[i][v]);
            if (!mask[v]) continue;
            if (beta == 1.0f) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask[v], crow + 16 * v));
            else if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], crow + 16 * v), r);
            _mm512_mask_storeu_ps(crow + 16 * v, mask[v], r);
        }
    }
}
__attribute__((target("avx512f")))
static void dt__micro_avx512(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b, float *C, int64_t ldc,
                             int64_t mr, int64_t nr, float alpha, float beta) {
    if (nr > 32) dt__micro512_nv(DT__NV512, kc, a, b, C, ldc, mr, nr, alpha, beta);
    else if (nr > 16) dt__micro512_nv(2, kc, a, b, C, ldc, mr, nr, alpha, beta);
    else dt__micro512_nv(1, kc, a, b, C, ldc, mr, nr, alpha, beta);
}
#endif

/* A micro-kernel and its tile: the packing follows mr and nr. */
typedef void (*dt__micro_fn)(int64_t, const float *, const float *, float *, int64_t, int64_t, int64_t, float, float);
typedef struct dt__kernel { const char *name; dt__micro_fn fn; int mr, nr; } dt__kernel;
static const dt__kernel dt__kernels[] = {
#ifdef DT__X86
    {"avx512", dt__micro_avx512, DT__MR512, 16 * DT__NV512},
    {"avx2", dt__micro_avx2, 6, 16},
#endif
    {"portable", dt__micro, 6, 16},
};
/* 1 when this CPU can run kernels[k] */
static int dt__kernel_ok(int k) {
#ifdef DT__X86
    if (dt__kernels[k].fn == dt__micro_avx512) return __builtin_cpu_supports("avx512f");
    if (dt__kernels[k].fn == dt__micro_avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return k >= 0;
}
/* the fastest kernel this CPU runs: the first of the table it can */
static const dt__kernel *dt__pick_kernel(void) {
    int k = 0;
    while (!dt__kernel_ok(k)) k++;
    return &dt__kernels[k];
}

/* Floats of packing workspace the blocked GEMM needs with `threads` threads: a packed B block, a packed
   A block and a B panel of scratch per thread; and how many threads `count` floats serve. */
#define DT__GEMM_WS_THREAD ((int64_t)DT__KC * (DT__NC + 2 * DT__NR_MAX + DT__MC + DT__MR_MAX))
static int64_t dt__gemm_ws_count(int threads) { return (int64_t)threads * DT__GEMM_WS_THREAD; }
static int dt__gemm_ws_threads(int64_t count) { return (int)(count / DT__GEMM_WS_THREAD); }

/* One thread's share of the blocked GEMM: C[m0:m1, n0:n1], with its own packing space Bp, Ap and tmp.
   The K blocks depend on K alone, so each element of C is summed in the same order whatever the share. */
static void dt__gemm_part(const dt__kernel *kern, float *Bp, float *Ap, float *tmp, int ta, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                          int64_t K, float alpha, const float *A, int64_t lda, const dt__bsrc *bs, float beta, float *C,
                          int64_t ldc) {
    const int MR = kern->mr, NR = kern->nr;
    int64_t k16 = (K + 15) / 16, nkb = (k16 + DT__KC / 16 - 1) / (DT__KC / 16);   /* K blocks: whole 16s but the last */
    int64_t npan = (n1 - n0 + NR - 1) / NR, nnb = (npan * NR + DT__NC - 1) / DT__NC;
    int64_t ncb = (npan + nnb - 1) / nnb * NR, jc, kb, ic, jr, ir;
    for (kb = 0; kb < nkb; kb++) {   /* K outermost: with one block of A's rows, A is packed once per K block */
        int64_t pc = 16 * (k16 * kb / nkb), kc = (kb + 1 == nkb ? K : 16 * (k16 * (kb + 1) / nkb)) - pc;
        float bet = kb == 0 ? beta : 1.0f;
        for (jc = n0; jc < n1; jc += ncb) {
            int64_t nc = n1 - jc < ncb ? n1 - jc : ncb;
            dt__pack_b(bs, pc, kc, jc, nc, Bp, NR, tmp);
            for (ic = m0; ic < m1; ic += DT__MC) {
                int64_t mc = m1 - ic < DT__MC ? m1 - ic : DT__MC;
                if (jc == n0 || m1 - m0 > DT__MC) dt__pack_a(ta, A, lda, ic, mc, pc, kc, Ap, MR);
                for (ir = 0; ir < mc; ir += MR) {        /* A's panel stays in L1 ... */
                    int64_t mr = mc - ir < MR ? mc - ir : MR;
                    for (jr = 0; jr < nc; jr += NR) {    /* ... while B's stream from L2 */
                        int64_t nr = nc - jr < NR ? nc - jr : NR;
                        kern->fn(kc, Ap + ir * kc, Bp + jr * kc, C + (ic + ir) * ldc + jc + jr, ldc, mr, nr, alpha, bet);
                    }
                }
            }
        }
    }
}

/* The blocked GEMM with micro-kernel kern on at most `threads` threads, on a caller's workspace of
   dt__gemm_ws_count(threads) floats. The threads share nothing: each takes a stretch of C's columns (of
   its rows when C is narrow) and packs what it reads, so no thread ever waits for another inside the GEMM
   (on a busy machine, a barrier waits for the slowest thread's time slice). */
static void dt__gemm_with(const dt__kernel *kern, float *ws, int threads, int ta, int64_t M, int64_t N, int64_t K, float alpha,
                          const float *A, int64_t lda, const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    const int MR = kern->mr, NR = kern->nr;
    int64_t npanels = (N + NR - 1) / NR, mpanels = (M + MR - 1) / MR;
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        int64_t i, j;
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    if ((double)M * (double)N * (double)K < 4.0 * DT__PAR_MIN * 64) threads = 1;   /* too small to share */
    (void)threads;   /* without OpenMP */
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0, nt = 1;
        int64_t m0 = 0, m1 = M, n0 = 0, n1 = N;
        float *Bp;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        Bp = ws + (int64_t)tid * DT__GEMM_WS_THREAD;
        /* columns when there are enough and C is at least as wide as tall (each thread then packs all of A,
           the smaller), else rows (each packs all of B) */
        if (npanels >= 4 * (int64_t)nt ? N >= M || mpanels < 4 * (int64_t)nt : mpanels < 4 * (int64_t)nt && npanels >= mpanels) {
            /* in 16s (the AVX-512 kernel runs a stretch's last 16 or 32 columns with only the vectors it
               keeps), so the stretches are even */
            int64_t u = NR % 16 == 0 ? 16 : NR, nu = (N + u - 1) / u;
            n0 = nu * tid / nt * u;
            n1 = nu * (tid + 1) / nt * u;
            if (n1 > N) n1 = N;
        } else {
            m0 = mpanels * tid / nt * MR;
            m1 = mpanels * (tid + 1) / nt * MR;
            if (m1 > M) m1 = M;
        }
        if (m0 < m1 && n0 < n1)
            dt__gemm_part(kern, Bp, Bp + (int64_t)DT__KC * (DT__NC + DT__NR_MAX), Bp + (int64_t)DT__KC * (DT__NC + DT__NR_MAX + DT__MC + DT__MR_MAX),
                          ta, m0, m1, n0, n1, K, alpha, A, lda, bs, beta, C, ldc);
    }
}

/* op(A) op(B) by the blocked GEMM with this CPU's fastest micro-kernel, on workspace ws of `count` floats,
   or on a fresh one when ws is NULL; by the unblocked one when there is no memory for that. */
static void dt__gemm_src(float *ws, int64_t count, int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    int threads = dt_cpu_threads();
    float *own = NULL;
    if (M <= 0 || N <= 0) return;
    if (ws && dt__gemm_ws_threads(count) < threads) threads = dt__gemm_ws_threads(count);
    if (!ws || threads < 1) {
        threads = dt_cpu_threads();
        if (!(ws = own = (float *)DT_MALLOC(sizeof(float) * (size_t)dt__gemm_ws_count(threads)))) {
            dt__gemm_ref_src(ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
            return;
        }
    }
    dt__gemm_with(dt__pick_kernel(), ws, threads, ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
    if (own) DT_FREE(own);
}

void dt_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__gemm_src(NULL, 0, ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}

void dt_conv2d_ref(const dt_conv_geom *g, const float *x, const float *w, const float *b, float *y) {
    int64_t n, o, oy, ox, c, ky, kx;
    for (n = 0; n < g->n; n++)
        for (o = 0; o < g->oc; o++)
            for (oy = 0; oy < g->oh; oy++)
                for (ox = 0; ox < g->ow; ox++) {
                    double acc = b ? b[o] : 0.0;
                    for (c = 0; c < g->c; c++)
                        for (ky = 0; ky < g->kh; ky++)
                            for (kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                acc += (double)x[((n * g->c + c) * g->h + iy) * g->w + ix] *
                                       (double)w[((o * g->c + c) * g->kh + ky) * g->kw + kx];
                            }
                    y[((n * g->oc + o) * g->oh + oy) * g->ow + ox] = (float)acc;
                }
}

/* ---- CPU ops ---------------------------------------------------------------------------------- */

static void *dt__cpu_alloc(void *ctx, int64_t bytes) {
    (void)ctx;
    if (bytes <= 0) bytes = 1;
    return DT_MALLOC((size_t)bytes);
}
static void dt__cpu_free(void *ctx, void *p) { (void)ctx; DT_FREE(p); }
static void dt__cpu_upload(void *ctx, void *dst, const void *src, int64_t bytes) {
    (void)ctx;
    if (bytes > 0 && dst != src) memcpy(dst, src, (size_t)bytes);
}
static void dt__cpu_copy(void *ctx, float *dst, const float *src, int64_t n) {
    (void)ctx;
    if (n > 0 && dst != src) memmove(dst, src, sizeof(float) * (size_t)n);
}
static void dt__cpu_fill(void *ctx, float *x, int64_t n, float v) {
    int64_t i;
    (void)ctx;
    if (v == 0.0f && n > 0) {   /* memset's wide stores, a stretch per thread */
        int64_t parts = n > DT__PAR_MIN ? dt_cpu_threads() : 1;
        DT__OMP(parallel for if (parts > 1))
        for (i = 0; i < parts; i++) memset(x + n * i / parts, 0, sizeof(float) * (size_t)(n * (i + 1) / parts - n * i / parts));
        return;
    }
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) x[i] = v;
}
static void dt__cpu_scale(void *ctx, float *x, int64_t n, float a) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) x[i] *= a;
}
static void dt__cpu_axpy(void *ctx, float *y, const float *x, int64_t n, float a) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) y[i] += a * x[i];
}
static void dt__cpu_add(void *ctx, float *y, const float *a, const float *b, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) y[i] = a[i] + b[i];
}
/* The CPU backend's own state, when a model gives it one: the GEMM packing workspace, so a training
   step allocates nothing. */
typedef struct dt__cpu_state { float *gemm_ws; int64_t gemm_ws_count; } dt__cpu_state;

/* GEMM on the state's workspace (without state, on a fresh one) */
static void dt__cpu_gemm_src(void *ctx, int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                             const dt__bsrc *bs, float beta, float *C, int64_t ldc) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    dt__gemm_src(st ? st->gemm_ws : NULL, st ? st->gemm_ws_count : 0, ta, M, N, K, alpha, A, lda, bs, beta, C, ldc);
}
static void dt__cpu_gemm(void *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt__bsrc bs;
    bs.B = B; bs.ldb = ldb; bs.tb = tb; bs.g = NULL;
    dt__cpu_gemm_src(ctx, ta, M, N, K, alpha, A, lda, &bs, beta, C, ldc);
}
/* ---- convolutions by shifted rows ---------------------------------------------------------------- */
/* With an image zero-padded to hp x wp (hp = h + 2 ph, wp = w + 2 pw), output pixel (oy, ox) of a stride-1
   convolution reads padded pixel (oy + ky, ox + kx). Over s = oy * wp + ox, row k = (c, ky, kx) of im2col
   is the padded image itself from offset c * hp * wp + ky * wp + kx on, so the GEMM reads its B operand
   straight from the padded image through a table of K offsets and packs nothing: the output is computed
   over oh rows of wp columns and the last wp - ow columns of each row are dropped. Stride-2 3 x 3
   convolutions take the same tiles over phase planes (dt__shift_geom, dt__shift_dgrad2). Each thread takes
   whole images (forward, input gradient) or fixed units of the weight gradient over every image, so each
   output is summed in one order whatever the thread count. AVX-512 only; other CPUs, other strides and
   kernels too large for the caches take the packed GEMM. */
static int dt__shift_off;                  /* 1: never take the shifted path (the tests compare both paths) */
static DT__THREAD_LOCAL int64_t dt__shift_taken;   /* calls that took it on this thread (for the tests) */
#ifdef DT__X86
#define DT__SHIFT_MAX_W (1 << 17)   /* most weights (oc * c * kh * kw) a shifted convolution takes */
#define DT__SHIFT_SLACK 128         /* zeros after a padded image: the dropped columns read past its end */

/* The padded geometry of one image of c channels h x w, padded by ph, pw, for a kh x kw window with stride
   st (1 or 2). With stride 2 each channel is stored as 4 phase planes of hq x wq (plane (a, b) holds the
   padded pixels (2 qy + a, 2 qx + b)), so that output (oy, ox) reads tap (ky, kx) in plane (ky % 2, kx % 2)
   at (oy + ky / 2, ox + kx / 2): a shifted row again, over s = oy * wq + ox, with nothing computed twice. */
typedef struct dt__shift_geom {
    int64_t c, h, w, ph, pw, kh, kw, hp, wp, oh, ow;
    int64_t st, hq, wq;   /* stride; a phase plane's rows and columns (hp, wp with stride 1) */
    int64_t cp;      /* floats of one channel: st * st * hq * wq */
    int64_t ns;      /* outputs computed per channel: oh * wq */
    int64_t plane;   /* floats of one padded image: c * cp + DT__SHIFT_SLACK */
} dt__shift_geom;
static dt__shift_geom dt__shift_make(int64_t c, int64_t h, int64_t w, int64_t ph, int64_t pw, int64_t kh, int64_t kw, int64_t st) {
    dt__shift_geom s;
    s.c = c; s.h = h; s.w = w; s.ph = ph; s.pw = pw; s.kh = kh; s.kw = kw; s.st = st;
    s.hp = h + 2 * ph; s.wp = w + 2 * pw; s.oh = (s.hp - kh) / st + 1; s.ow = (s.wp - kw) / st + 1;
    s.hq = (s.hp + st - 1) / st; s.wq = (s.wp + st - 1) / st;
    s.cp = st * st * s.hq * s.wq;
    s.ns = s.oh * s.wq;
    s.plane = c * s.cp + DT__SHIFT_SLACK;
    return s;
}
/* offsets of im2col's rows (c, ky, kx), c from c0 to c1, into a padded image */
static void dt__shift_offsets(const dt__shift_geom *s, int64_t c0, int64_t c1, int32_t *off) {
    int64_t c, ky, kx, k = 0, st = s->st;
    for (c = c0; c < c1; c++)
        for (ky = 0; ky < s->kh; ky++)
            for (kx = 0; kx < s->kw; kx++)
                off[k++] = (int32_t)((c - c0) * s->cp + ((ky % st) * st + kx % st) * s->hq * s->wq + ky / st * s->wq + kx / st);
}
/* rows x len floats from src (rows lds apart) to dst (rows ldd apart) */
__attribute__((target("avx512f")))
static void dt__shift_copy(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t len) {
    __mmask16 tail = (__mmask16)((1u << (len % 16)) - 1u);
    int64_t r, j, full = len / 16 * 16;
    for (r = 0; r < rows; r++, dst += ldd, src += lds) {
        for (j = 0; j < full; j += 16) _mm512_storeu_ps(dst + j, _mm512_loadu_ps(src + j));
        if (tail) _mm512_mask_storeu_ps(dst + j, tail, _mm512_maskz_loadu_ps(tail, src + j));
    }
}
/* channels c0..c1 of image x [c, h, w] into the padded image xp (whose borders and slack are zero) */
__attribute__((target("avx512f")))
static void dt__shift_pad(const dt__shift_geom *s, const float *x, int64_t c0, int64_t c1, float *xp) {
    int64_t c, iy, ix;
    if (s->st == 1) {
        for (c = c0; c < c1; c++)
            dt__shift_copy(xp + ((c - c0) * s->hp + s->ph) * s->wp + s->pw, s->wp, x + c * s->h * s->w, s->w, s->h, s->w);
        return;
    }
    for (c = c0; c < c1; c++)   /* stride 2: each row's even and odd padded columns to their planes */
        for (iy = 0; iy < s->h; iy++) {
            int64_t py = iy + s->ph, pq = s->hq * s->wq;
            const float *src = x + (c * s->h + iy) * s->w;
            float *row = xp + (c - c0) * s->cp + (py % 2) * 2 * pq + py / 2 * s->wq;
            /* input column ix0 + 2j goes to plane pw % 2 at ix0 / 2 + j + pw / 2, ix0 + 2j + 1 to the other
               plane at ix0 / 2 + j + (pw + 1) / 2 */
            float *ev = row + (s->pw % 2) * pq + s->pw / 2, *od = row + ((s->pw + 1) % 2) * pq + (s->pw + 1) / 2;
            for (ix = 0; ix < s->w; ix += 16) {
                int len = s->w - ix < 16 ? (int)(s->w - ix) : 16;
                __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << len) - 1u), src + ix);
                _mm512_mask_storeu_ps(ev + ix / 2, (__mmask16)((1u << (len + 1) / 2) - 1u), _mm512_maskz_compress_ps(0x5555, v));
                _mm512_mask_storeu_ps(od + ix / 2, (__mmask16)((1u << len / 2) - 1u), _mm512_maskz_compress_ps(0xAAAA, v));
            }
        }
}

/* Where a vector of 16 computed columns goes: its kept lanes (keep: those of output pixels, not the
   wp - ow junk columns after each row) to the output from pixel `at` on, in order. */
typedef struct dt__shift_vec { int64_t at; uint32_t keep; } dt__shift_vec;
/* the first 16-byte boundary at or after p, for a table inside the float workspace (4 floats of slack) */
static dt__shift_vec *dt__shift_vec_at(float *p) { return (dt__shift_vec *)(void *)(((uintptr_t)p + 15) & ~(uintptr_t)15); }
static void dt__shift_vecs(const dt__shift_geom *s, int64_t nv, dt__shift_vec *v) {
    int64_t i, col;
    int l;
    for (i = 0; i < nv; i++) {
        v[i].at = -1; v[i].keep = 0;
        for (l = 0; l < 16; l++) {
            col = i * 16 + l;
            if (col / s->wq >= s->oh || col % s->wq >= s->ow) continue;
            v[i].keep |= 1u << l;
            if (v[i].at < 0) v[i].at = col / s->wq * s->ow + col % s->wq;
        }
        if (v[i].at < 0) v[i].at = 0;   /* nothing kept: never written */
    }
}
/* one tile of the shifted GEMM: sum_k a[k][i] xp[off[k] + j] for 8 rows i (rows kept) x 48 columns j, each
   vector's kept lanes written (packed together) to row i of dst (rows S apart) plus bias[i] (bias NULL:
   none), or added to it (add 1) */
__attribute__((target("avx512f")))
static void dt__shift_tile(int64_t K, const float *DT__RESTRICT a, const float *xp, const int32_t *off, const dt__shift_vec *vec,
                           float *dst, int64_t S, const float *bias, int add, int rows) {
    __m512 c[8][3];
    int64_t k;
    int i, v;
    for (i = 0; i < 8; i++)
        for (v = 0; v < 3; v++) c[i][v] = _mm512_setzero_ps();
    for (k = 0; k < K; k++) {
        const float *b = xp + off[k], *ak = a + 8 * k;
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), b2 = _mm512_loadu_ps(b + 32);
        for (i = 0; i < 8; i++) {
            __m512 av = _mm512_set1_ps(ak[i]);
            c[i][0] = _mm512_fmadd_ps(av, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(av, b1, c[i][1]);
            c[i][2] = _mm512_fmadd_ps(av, b2, c[i][2]);
        }
    }
    for (i = 0; i < rows; i++) {
        __m512 b = _mm512_set1_ps(bias ? bias[i] : 0.0f);
        for (v = 0; v < 3; v++) {
            __mmask16 keep = (__mmask16)vec[v].keep, m;
            float *d = dst + i * S + vec[v].at;
            __m512 y = _mm512_add_ps(c[i][v], b);
            if (keep == 0xFFFF) {
                _mm512_storeu_ps(d, add ? _mm512_add_ps(y, _mm512_loadu_ps(d)) : y);
            } else if (keep) {
                m = (__mmask16)((1u << __builtin_popcount(keep)) - 1u);
                y = _mm512_maskz_compress_ps(keep, y);
                _mm512_mask_storeu_ps(d, m, add ? _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, d)) : y);
            }
        }
    }
}
/* the sum of a vector's 16 floats (pairwise; through memory, which GCC 12's C++ front end warns less about) */
__attribute__((target("avx512f")))
static float dt__hsum512(__m512 v) {
    float t[16];
    int w, i;
    _mm512_storeu_ps(t, v);
    for (w = 8; w > 0; w /= 2)
        for (i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
}
/* dW[i][k] += sum over nimg images and s of d[img][i][s] xp[img][off[k] + s], for 4 rows i and
   DT__WT_K k (ni, nk of them kept); d's rows are ldd apart and ld long (a multiple of 16), images dstride
   and xstride apart. 4 x 6 accumulators: 10 loads feed 24 multiply-adds. */
#define DT__WT_K 6
__attribute__((target("avx512f")))
static void dt__shift_wtile(int64_t nimg, int64_t ld, const float *d, int64_t ldd, int64_t dstride, const float *xp,
                            int64_t xstride, const int32_t *off, float *dW, int64_t ldw, int ni, int nk) {
    __m512 acc[4][DT__WT_K];
    const float *dr[4];
    int32_t o[DT__WT_K];
    int64_t img, s;
    int i, j;
    for (i = 0; i < 4; i++) {
        dr[i] = d + (i < ni ? i : ni - 1) * ldd;
        for (j = 0; j < DT__WT_K; j++) acc[i][j] = _mm512_setzero_ps();
    }
    for (j = 0; j < DT__WT_K; j++) o[j] = off[j < nk ? j : nk - 1];
    for (img = 0; img < nimg; img++) {
        const float *x = xp + img * xstride, *d0 = dr[0] + img * dstride, *d1 = dr[1] + img * dstride,
                    *d2 = dr[2] + img * dstride, *d3 = dr[3] + img * dstride;
        for (s = 0; s < ld; s += 16) {
            __m512 a0 = _mm512_loadu_ps(d0 + s), a1 = _mm512_loadu_ps(d1 + s), a2 = _mm512_loadu_ps(d2 + s),
                   a3 = _mm512_loadu_ps(d3 + s);
            for (j = 0; j < DT__WT_K; j++) {
                __m512 b = _mm512_loadu_ps(x + o[j] + s);
                acc[0][j] = _mm512_fmadd_ps(a0, b, acc[0][j]);
                acc[1][j] = _mm512_fmadd_ps(a1, b, acc[1][j]);
                acc[2][j] = _mm512_fmadd_ps(a2, b, acc[2][j]);
                acc[3][j] = _mm512_fmadd_ps(a3, b, acc[3][j]);
            }
        }
    }
    for (i = 0; i < ni; i++)
        for (j = 0; j < nk; j++) dW[i * ldw + j] += dt__hsum512(acc[i][j]);
}
/* One image of the shifted convolution: pads src [s->c, h, w] into xp and runs the tiles of Ap [rows, K],
   which write dst [rows, oh, ow] plus bias[row] (bias NULL: none), or add to it (add 1); vec from
   dt__shift_vecs */
static void dt__shift_image(const dt__shift_geom *s, const float *src, const float *Ap, int64_t rows, const int32_t *off,
                            float *xp, const dt__shift_vec *vec, float *dst, const float *bias, int add) {
    int64_t K = s->c * s->kh * s->kw, S = s->oh * s->ow, t, j;
    dt__shift_pad(s, src, 0, s->c, xp);
#define DT__SHIFT_TILE_AT(t, j)                                                                                         \
    dt__shift_tile(K, Ap + t * K, xp + j, off, vec + j / 16, dst + t * S, S, bias ? bias + t : NULL, add,                \
                   rows - t < 8 ? (int)(rows - t) : 8)
    if (K * 48 <= 8192)   /* a strip of the image fits in L1: it serves every tile of rows */
        for (j = 0; j < s->ns; j += 48)
            for (t = 0; t < rows; t += 8) DT__SHIFT_TILE_AT(t, j);
    else                  /* a tile of rows of the kernel stays in L1 while the image streams from L2 */
        for (t = 0; t < rows; t += 8)
            for (j = 0; j < s->ns; j += 48) DT__SHIFT_TILE_AT(t, j);
#undef DT__SHIFT_TILE_AT
}

/* A [rows, K] packed for dt__shift_tile: per tile of 8 rows, K groups of 8 (rows past the end are zero).
   flip: row r, column (o, ky, kx) is W[o][r][kh-1-ky][kw-1-kx] of W [oc = K / kk, rows, kh, kw] (the input
   gradient's kernel), else A is W [rows, K] itself. */
static void dt__shift_pack_a(const float *W, int64_t rows, int64_t K, int flip, int64_t kk, float *Ap) {
    int64_t t, nt = (rows + 7) / 8;
    DT__OMP(parallel for if (nt * K * 8 > DT__PAR_MIN))
    for (t = 0; t < nt; t++) {
        int64_t k, i;   /* declared here: private to each thread */
        for (k = 0; k < K; k++)
            for (i = 0; i < 8; i++) {
                int64_t r = t * 8 + i;
                float v = 0.0f;
                if (r < rows) v = flip ? W[((k / kk) * rows + r) * kk + (kk - 1 - k % kk)] : W[r * K + k];
                Ap[(t * K + k) * 8 + i] = v;
            }
    }
}

/* The shifted convolution of n images src [n, s->c, h, w] with the packed kernel Ap [rows, c*kh*kw] on
   `threads` threads: dst [n, rows, oh, ow] = it + bias (add 0; bias NULL: none), or += it (add 1).
   ws: threads * need floats, need from dt__shift_run_need. */
#define DT__SHIFT_NVEC(s) (((s)->ns + 47) / 48 * 3)   /* vectors of columns the tiles compute */
static int64_t dt__shift_run_need(const dt__shift_geom *s) {
    return s->plane + 4 + 4 * DT__SHIFT_NVEC(s) + s->c * s->kh * s->kw + 16;   /* a table entry: 4 floats */
}
static void dt__shift_run(const dt__shift_geom *s, int64_t n, const float *src, const float *Ap, int64_t rows, float *dst,
                          const float *bias, int add, float *ws, int64_t need, int threads) {
    int64_t S = s->oh * s->ow;
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0;
        int64_t img;
        float *xp;
        dt__shift_vec *vec;
        int32_t *off;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
#endif
        xp = ws + tid * need;
        vec = dt__shift_vec_at(xp + s->plane);
        off = (int32_t *)(void *)(vec + DT__SHIFT_NVEC(s));
        memset(xp, 0, sizeof(float) * (size_t)s->plane);
        dt__shift_vecs(s, DT__SHIFT_NVEC(s), vec);
        dt__shift_offsets(s, 0, s->c, off);
        DT__OMP(for schedule(static))
        for (img = 0; img < n; img++)
            dt__shift_image(s, src + img * s->c * s->h * s->w, Ap, rows, off, xp, vec, dst + img * rows * S, bias, add);
    }
    (void)threads;
}

/* Floats the weight gradient takes per image of s's geometry when one thread has all oc rows: the padded
   image and dy's rows in s's layout (a multiple of 16 long). A thread needs one image's worth plus an offset
   table of c * kh * kw + 16. */
static int64_t dt__shift_wgrad_image(const dt__shift_geom *s, int64_t oc) {
    return s->plane + (oc + 3) / 4 * 4 * ((s->ns + 15) / 16 * 16);
}
/* The shifted weight gradient dW [oc, c*kh*kw] += dy col^T of geometry g, dy [n, oc, oh, ow], on ws
   (ws_count floats for `threads` threads, as dt__shift_fits checked). The threads split dW into a grid of
   row ranges x channel ranges; each pads its channels of a block of images and sums over every image. */
static void dt__shift_wgrad(const dt_conv_geom *g, const float *x, const float *dy, float *dW, float *ws, int64_t ws_count,
                            int threads) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, 1);
    int64_t kk = g->kh * g->kw, K = g->c * kk, S = g->oh * g->ow, ld = (s.ns + 15) / 16 * 16, per = ws_count / threads;
    int64_t ot = (g->oc + 3) / 4;
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0, nt = 1;
        int64_t gco, gci, o0, o1, c0, c1, nco, K0, xstride, per_img, nb, b0, img, o, k;
        float *xb, *db;
        int32_t *off;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        gco = nt < ot ? nt : ot;
        gci = nt / gco < g->c ? nt / gco : g->c;
        if (tid < gco * gci) {
            o0 = ot * (tid / gci) / gco * 4; o1 = ot * (tid / gci + 1) / gco * 4;
            if (o1 > g->oc) o1 = g->oc;
            c0 = g->c * (tid % gci) / gci; c1 = g->c * (tid % gci + 1) / gci;
            nco = o1 - o0; K0 = (c1 - c0) * kk;
            xstride = (c1 - c0) * s.cp + DT__SHIFT_SLACK;
            per_img = xstride + nco * ld;
            /* about 1 MB of images, counted for all channels and rows, so the blocks (and with them the order
               of the sums) are the same for every thread count */
            nb = ((per - K - 16) < (1 << 18) ? (per - K - 16) : (1 << 18)) / dt__shift_wgrad_image(&s, g->oc);
            if (nb < 1) nb = 1;
            if (nb > g->n) nb = g->n;
            off = (int32_t *)(ws + tid * per);
            xb = ws + tid * per + K0 + 16;
            db = xb + nb * xstride;
            dt__shift_offsets(&s, c0, c1, off);
            memset(xb, 0, sizeof(float) * (size_t)(nb * per_img));
            for (b0 = 0; b0 < g->n; b0 += nb) {
                int64_t m = g->n - b0 < nb ? g->n - b0 : nb;
                for (img = 0; img < m; img++) {
                    dt__shift_pad(&s, x + (b0 + img) * g->c * g->h * g->w, c0, c1, xb + img * xstride);
                    for (o = o0; o < o1; o++)
                        dt__shift_copy(db + (img * nco + o - o0) * ld, s.wp, dy + ((b0 + img) * g->oc + o) * S, g->ow, g->oh, g->ow);
                }
                for (o = o0; o < o1; o += 4)
                    for (k = 0; k < K0; k += DT__WT_K)
                        dt__shift_wtile(m, ld, db + (o - o0) * ld, ld, nco * ld, xb, xstride, off + k, dW + o * K + c0 * kk + k, K,
                                        o1 - o < 4 ? (int)(o1 - o) : 4, K0 - k < DT__WT_K ? (int)(K0 - k) : DT__WT_K);
            }
        }
    }
}

/* The weight gradient of a 3 x 3 convolution with dy transposed: dbT [S][ocp] holds each output position's
   dy for every output channel (ocp: oc rounded up to 16, the rest zero), so one tile keeps dW^T's 9 taps of
   one input channel for 16 or 32 output channels in registers and sums over the positions there: each tap
   broadcasts its padded x, which a vector of dbT multiplies. No horizontal sums, and 10 or 11 loads feed 9
   or 18 multiply-adds from data small enough for L1 and L2 (the dot-product tile above streams 4 rows of dy
   and 6 of x per 24 from L2). dWT [9][ocp] += the image's sums for tap (ky, kx) at row ky * 3 + kx. */
/* named accumulators (not an array), so that every compiler and level keeps them in registers */
#define DT__WT3_TAP(t, row, kx) do {                                          \
        __m512 b_ = _mm512_set1_ps(row[ox + kx]);                               \
        a##t##0 = _mm512_fmadd_ps(b_, d0, a##t##0);                             \
        if (ov > 1) a##t##1 = _mm512_fmadd_ps(b_, d1, a##t##1);                 \
    } while (0)
#define DT__WT3_OUT(t) do {                                                   \
        float *p_ = dWT + t * ocp;                                              \
        _mm512_storeu_ps(p_, _mm512_add_ps(_mm512_loadu_ps(p_), a##t##0));      \
        if (ov > 1) _mm512_storeu_ps(p_ + 16, _mm512_add_ps(_mm512_loadu_ps(p_ + 16), a##t##1)); \
    } while (0)
__attribute__((always_inline, target("avx512f")))
static inline void dt__wt3_tile(const int ov, const int st, const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow,
                                const float *dbT, int64_t ocp, float *dWT) {
    __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a10 = z, a20 = z, a30 = z, a40 = z, a50 = z, a60 = z, a70 = z, a80 = z;
    __m512 a01 = z, a11 = z, a21 = z, a31 = z, a41 = z, a51 = z, a61 = z, a71 = z, a81 = z;
    int64_t oy, ox;
    for (oy = 0; oy < oh; oy++) {
        const float *dr = dbT + oy * ow * ocp;
        if (st == 1) {   /* tap (ky, kx) at row oy + ky, column ox + kx */
            const float *r0 = x + oy * wq, *r1 = r0 + wq, *r2 = r1 + wq;
            for (ox = 0; ox < ow; ox++, dr += ocp) {
                __m512 d0 = _mm512_loadu_ps(dr), d1 = ov > 1 ? _mm512_loadu_ps(dr + 16) : z;
                DT__WT3_TAP(0, r0, 0); DT__WT3_TAP(1, r0, 1); DT__WT3_TAP(2, r0, 2);
                DT__WT3_TAP(3, r1, 0); DT__WT3_TAP(4, r1, 1); DT__WT3_TAP(5, r1, 2);
                DT__WT3_TAP(6, r2, 0); DT__WT3_TAP(7, r2, 1); DT__WT3_TAP(8, r2, 2);
            }
        } else {         /* stride 2: tap (ky, kx) in phase plane (ky % 2, kx % 2) (pq floats each) */
            const float *e0 = x + oy * wq, *e1 = e0 + wq, *f0 = e0 + pq, *f1 = f0 + wq, *g0 = f0 + pq, *h0 = g0 + pq;
            for (ox = 0; ox < ow; ox++, dr += ocp) {
                __m512 d0 = _mm512_loadu_ps(dr), d1 = ov > 1 ? _mm512_loadu_ps(dr + 16) : z;
                DT__WT3_TAP(0, e0, 0); DT__WT3_TAP(1, f0, 0); DT__WT3_TAP(2, e0, 1);
                DT__WT3_TAP(3, g0, 0); DT__WT3_TAP(4, h0, 0); DT__WT3_TAP(5, g0, 1);
                DT__WT3_TAP(6, e1, 0); DT__WT3_TAP(7, f1, 0); DT__WT3_TAP(8, e1, 1);
            }
        }
    }
    DT__WT3_OUT(0); DT__WT3_OUT(1); DT__WT3_OUT(2); DT__WT3_OUT(3); DT__WT3_OUT(4);
    DT__WT3_OUT(5); DT__WT3_OUT(6); DT__WT3_OUT(7); DT__WT3_OUT(8);
}
#undef DT__WT3_TAP
#undef DT__WT3_OUT
#define DT__WT3_VARIANT(name, ov, st)                                                                                   \
    __attribute__((target("avx512f"))) static void name(const float *x, int64_t wq, int64_t pq, int64_t oh, int64_t ow, \
                                                        const float *dbT, int64_t ocp, float *dWT) {                    \
        dt__wt3_tile(ov, st, x, wq, pq, oh, ow, dbT, ocp, dWT);                                                          \
    }
DT__WT3_VARIANT(dt__wt3_tile16, 1, 1)
DT__WT3_VARIANT(dt__wt3_tile32, 2, 1)
DT__WT3_VARIANT(dt__wt3_tile16s2, 1, 2)
DT__WT3_VARIANT(dt__wt3_tile32s2, 2, 2)
#undef DT__WT3_VARIANT
/* r[i] <- column i of the 16 x 16 block whose rows are r[0..15] (maskz forms: the plain ones trip GCC 12's
   C++ -Wmaybe-uninitialized inside its own header) */
__attribute__((target("avx512f")))
static void dt__tr16(__m512 *r) {
    __m512 u[16], t[16];
    int i, j;
    for (i = 0; i < 8; i++) {
        u[2 * i] = _mm512_maskz_unpacklo_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
        u[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
    }
    for (i = 0; i < 4; i++)
        for (j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(u[4 * i + j]), b = _mm512_castps_pd(u[4 * i + j + 2]);
            t[4 * i + 2 * j] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, a, b));
            t[4 * i + 2 * j + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, a, b));
        }
    for (i = 0; i < 2; i++)
        for (j = 0; j < 4; j++) {
            u[8 * i + j] = _mm512_maskz_shuffle_f32x4(0xFFFF, t[8 * i + j], t[8 * i + j + 4], 0x88);
            u[8 * i + j + 4] = _mm512_maskz_shuffle_f32x4(0xFFFF, t[8 * i + j], t[8 * i + j + 4], 0xdd);
        }
    for (j = 0; j < 8; j++) {
        r[j] = _mm512_maskz_shuffle_f32x4(0xFFFF, u[j], u[j + 8], 0x88);
        r[j + 8] = _mm512_maskz_shuffle_f32x4(0xFFFF, u[j], u[j + 8], 0xdd);
    }
}
/* dbT [S][ocp] <- dy [oc][S] transposed, columns oc..ocp zero */
__attribute__((target("avx512f")))
static void dt__transpose_dy(const float *dy, int64_t oc, int64_t S, float *dbT, int64_t ocp) {
    int64_t o0, s0;
    int i;
    for (o0 = 0; o0 < ocp; o0 += 16)
        for (s0 = 0; s0 < S; s0 += 16) {
            __m512 r[16];
            int ns = S - s0 < 16 ? (int)(S - s0) : 16;
            __mmask16 m = (__mmask16)((1u << ns) - 1u);
            for (i = 0; i < 16; i++) r[i] = o0 + i < oc ? _mm512_maskz_loadu_ps(m, dy + (o0 + i) * S + s0) : _mm512_setzero_ps();
            dt__tr16(r);
            for (i = 0; i < ns; i++) _mm512_storeu_ps(dbT + (s0 + i) * ocp + o0, r[i]);
        }
}
/* Floats of workspace the shifted weight gradient of g takes per thread, whatever the thread count (counted
   for every channel, so the path taken does not depend on it): for 3 x 3, the padded image, dy transposed
   and dW^T; otherwise one image's worth of padded image and dy rows plus an offset table. */
static int64_t dt__shift_wgrad_need(const dt_conv_geom *g) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh);
    if (g->kh == 3 && g->kw == 3) return s.plane + (g->oh * g->ow + g->c * 9) * ((g->oc + 15) / 16 * 16);
    return dt__shift_wgrad_image(&s, g->oc) + g->c * g->kh * g->kw + 16;
}
/* The 3 x 3 weight gradient dW [oc, c*9] += by the transposed tiles. The work is cut into units of one
   input channel x 32 output channels; each thread takes a range of units and every image in order, so
   each sum runs in one order whatever the thread count. */
static void dt__shift_wgrad3(const dt_conv_geom *g, const float *x, const float *dy, float *dW, float *ws, int64_t ws_count,
                             int threads) {
    dt__shift_geom s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, 3, 3, g->sh);
    int64_t S = g->oh * g->ow, ocp = (g->oc + 15) / 16 * 16, hw = s.cp, pq = s.hq * s.wq, per = ws_count / threads;
    int64_t nto = (ocp + 31) / 32, units = g->c * nto;
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0, nt = 1;
        int64_t u0, u1, c0, c1, u, img, c, o, oe, t;
        float *xp, *dbT, *dWT;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        u0 = units * tid / nt; u1 = units * (tid + 1) / nt;
        c0 = u0 / nto; c1 = u1 > u0 ? (u1 - 1) / nto + 1 : c0;   /* the channels the units touch */
        xp = ws + tid * per;
        dbT = xp + (c1 - c0) * hw;
        dWT = dbT + S * ocp;
        if (u0 < u1) {
            memset(xp, 0, sizeof(float) * (size_t)((c1 - c0) * hw));
            memset(dWT, 0, sizeof(float) * (size_t)((c1 - c0) * 9 * ocp));
            for (img = 0; img < g->n; img++) {
                dt__shift_pad(&s, x + img * g->c * g->h * g->w, c0, c1, xp);
                dt__transpose_dy(dy + img * g->oc * S, g->oc, S, dbT, ocp);
                for (u = u0; u < u1; u++) {
                    const float *xc;
                    float *dc;
                    c = u / nto; o = u % nto * 32;
                    xc = xp + (c - c0) * hw;
                    dc = dWT + (c - c0) * 9 * ocp + o;
                    if (s.st == 1 && ocp - o >= 32) dt__wt3_tile32(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
                    else if (s.st == 1) dt__wt3_tile16(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
                    else if (ocp - o >= 32) dt__wt3_tile32s2(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
                    else dt__wt3_tile16s2(xc, s.wq, pq, g->oh, g->ow, dbT + o, ocp, dc);
                }
            }
            for (u = u0; u < u1; u++) {
                c = u / nto; o = u % nto * 32; oe = o + 32 < g->oc ? o + 32 : g->oc;
                for (; o < oe; o++)
                    for (t = 0; t < 9; t++) dW[(o * g->c + c) * 9 + t] += dWT[((c - c0) * 9 + t) * ocp + o];
            }
        }
    }
}
/* The input gradient of a stride-2 3 x 3 convolution by phase planes: dx's padded pixel (2 qy + a, 2 qx + b)
   takes the taps (ky, kx) = (a + 2 ty, b + 2 tx), which read dy at (qy - ty, qx - tx); so each phase (a, b)
   is a shifted-row convolution of dy (padded by a row and a column before it) with 1 x 1 to 2 x 2 taps, and
   the four phases' results are interleaved into dx. Floats of workspace: shared (the packed kernels, offsets
   and column table) and per thread (padded dy and the phases' results); dt__shift_dgrad2_fits asks for both
   per thread, so whether it runs does not depend on the thread count. */
typedef struct dt__dgrad2_geom { int64_t hq, wq, wd, pd, S, rp, nv, shared, per; } dt__dgrad2_geom;
static dt__dgrad2_geom dt__dgrad2_make(const dt_conv_geom *g) {
    dt__dgrad2_geom d;
    d.hq = (g->h + 2 * g->ph + 1) / 2; d.wq = (g->w + 2 * g->pw + 1) / 2; d.wd = d.wq + 1;
    d.pd = (d.hq + 1) * d.wd; d.S = d.hq * d.wq; d.rp = (g->c + 7) / 8 * 8;
    d.nv = (d.hq * d.wd + 47) / 48 * 3;
    d.shared = d.rp * 9 * g->oc + 9 * g->oc + 4 + 4 * d.nv + 16;
    d.per = g->oc * d.pd + DT__SHIFT_SLACK + 4 * d.S * g->c;
    return d;
}
static int dt__shift_dgrad2_fits(const dt__cpu_state *st, const dt_conv_geom *g, int threads) {
    dt__dgrad2_geom d = dt__dgrad2_make(g);
    return g->kh == 3 && g->kw == 3 && g->sh == 2 && g->sw == 2 && d.shared + d.per <= st->gemm_ws_count / threads;
}
static void dt__shift_dgrad2(dt__cpu_state *st, const dt_conv_geom *g, const float *W, const float *dy, float *dx, int add,
                             int threads) {
    dt__dgrad2_geom d = dt__dgrad2_make(g);
    int64_t K0[5], p, t, k, rows = g->c;
    float *Ap = st->gemm_ws, *ws = st->gemm_ws + d.shared;
    int32_t *off = (int32_t *)(void *)(Ap + d.rp * 9 * g->oc);
    dt__shift_vec *vec = dt__shift_vec_at(Ap + d.rp * 9 * g->oc + 9 * g->oc);
    dt__shift_geom vg;
    memset(&vg, 0, sizeof vg);
    vg.wq = d.wd; vg.oh = d.hq; vg.ow = d.wq;   /* computed over hq rows of wd, kept wq of each */
    dt__shift_vecs(&vg, d.nv, vec);
    K0[0] = 0;
    for (p = 0; p < 4; p++) {   /* phase p = 2a + b: (2 - a) x (2 - b) taps (ty, tx) */
        int64_t a = p / 2, b = p % 2, na = 2 - a, nb = 2 - b, Kp = g->oc * na * nb;
        K0[p + 1] = K0[p] + Kp;
        for (k = 0; k < Kp; k++) {
            int64_t o = k / (na * nb), ty = k % (na * nb) / nb, tx = k % nb;
            off[K0[p] + k] = (int32_t)(o * d.pd + (1 - ty) * d.wd + (1 - tx));
            for (t = 0; t < d.rp; t++)
                Ap[K0[p] * d.rp + (t / 8 * Kp + k) * 8 + t % 8] =
                    t < rows ? W[((o * g->c + t) * 3 + a + 2 * ty) * 3 + b + 2 * tx] : 0.0f;
        }
    }
    DT__OMP(parallel num_threads(threads) if (threads > 1))
    {
        int tid = 0;
        int64_t img, o, j, r, c, iy, ix, q;   /* declared here: private to each thread */
        float *dyp, *P;
#if DT__HAVE_OMP
        tid = omp_get_thread_num();
#endif
        dyp = ws + tid * d.per;
        P = dyp + g->oc * d.pd + DT__SHIFT_SLACK;
        memset(dyp, 0, sizeof(float) * (size_t)(g->oc * d.pd + DT__SHIFT_SLACK));
        DT__OMP(for schedule(static))
        for (img = 0; img < g->n; img++) {
            const float *dyi = dy + img * g->oc * g->oh * g->ow;
            float *dxi = dx + img * g->c * g->h * g->w;
            for (o = 0; o < g->oc; o++)
                dt__shift_copy(dyp + o * d.pd + d.wd + 1, d.wd, dyi + o * g->oh * g->ow, g->ow, g->oh, g->ow);
            for (q = 0; q < 4; q++) {
                int64_t Kp = K0[q + 1] - K0[q];
                for (r = 0; r < rows; r += 8)
                    for (j = 0; j < d.hq * d.wd; j += 48)
                        dt__shift_tile(Kp, Ap + K0[q] * d.rp + r * Kp, dyp + j, off + K0[q], vec + j / 16, P + (q * rows + r) * d.S,
                                       d.S, NULL, 0, rows - r < 8 ? (int)(rows - r) : 8);
            }
            for (c = 0; c < rows; c++)   /* the phases interleaved into dx */
                for (iy = 0; iy < g->h; iy++) {
                    int64_t py = iy + g->ph;
                    const float *p0 = P + ((py % 2) * 2 * rows + c) * d.S + py / 2 * d.wq;
                    float *dr = dxi + (c * g->h + iy) * g->w;
                    for (ix = 0; ix < g->w; ix++) {
                        int64_t px = ix + g->pw;
                        float v = p0[(px % 2) * rows * d.S + px / 2];
                        dr[ix] = add ? dr[ix] + v : v;
                    }
                }
        }
    }
    (void)threads;
}
/* The forward pass (grad 0: y = conv(x, W) + b) or the input gradient (grad 1: dx = the convolution of dy
   with the flipped kernel, or dx += it with add 1) by shifted rows on the model's workspace. Each thread
   takes whole images. */
static void dt__shift_conv(dt__cpu_state *st, const dt_conv_geom *g, const float *W, const float *src, const float *b, float *dst,
                           int grad, int add, int threads) {
    int64_t kk = g->kh * g->kw, rows = grad ? g->c : g->oc, K = (grad ? g->oc : g->c) * kk, ap = (rows + 7) / 8 * 8 * K;
    dt__shift_geom s = grad ? dt__shift_make(g->oc, g->oh, g->ow, g->kh - 1 - g->ph, g->kw - 1 - g->pw, g->kh, g->kw, 1)
                            : dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh);
    dt__shift_pack_a(W, rows, K, grad, kk, st->gemm_ws);
    dt__shift_run(&s, g->n, src, st->gemm_ws, rows, dst, b, add, st->gemm_ws + ap, dt__shift_run_need(&s), threads);
}
/* 1 when the shifted path takes this convolution (forward, or grad: both gradients) on the model's
   workspace with `threads` threads: stride 1, AVX-512, a kernel small enough for the caches, at least an
   image per thread (with fewer, the packed GEMM shares better), the input gradient's padding k - 1 - p
   not negative, and the workspace large enough */
static int dt__shift_fits(const dt__cpu_state *st, const dt_conv_geom *g, int grad, int threads) {
    int64_t kk = g->kh * g->kw;
    dt__shift_geom s;
    if (!st || !st->gemm_ws || dt__shift_off || g->sh != g->sw || g->sh < 1 || g->sh > 2 ||
        (g->sh == 2 && (g->kh != 3 || g->kw != 3)) || g->kw + 64 > DT__SHIFT_SLACK || g->oc * g->c * kk > DT__SHIFT_MAX_W ||
        g->n < threads || !__builtin_cpu_supports("avx512f"))
        return 0;
    s = dt__shift_make(g->c, g->h, g->w, g->ph, g->pw, g->kh, g->kw, g->sh);
    if (!grad) return (g->oc + 7) / 8 * 8 * g->c * kk + threads * dt__shift_run_need(&s) <= st->gemm_ws_count;
    if (st->gemm_ws_count / threads < dt__shift_wgrad_need(g)) return 0;
    if (g->sh == 2) return 1;   /* the weight gradient only */
    if (g->ph > g->kh - 1 || g->pw > g->kw - 1) return 0;
    s = dt__shift_make(g->oc, g->oh, g->ow, g->kh - 1 - g->ph, g->kw - 1 - g->pw, g->kh, g->kw, 1);
    return (g->c + 7) / 8 * 8 * g->oc * kk + threads * dt__shift_run_need(&s) <= st->gemm_ws_count;
}
static int dt__cpu_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int threads = dt_cpu_threads();
    if (!dt__shift_fits(st, g, 0, threads)) return 0;
    dt__shift_conv(st, g, W, x, b, y, 0, 0, threads);
    dt__shift_taken++;
    return 1;
}
static int dt__cpu_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                            float *dx, int accumulate) {
    dt__cpu_state *st = (dt__cpu_state *)ctx;
    int threads = dt_cpu_threads();
    if (!dt__shift_fits(st, g, 1, threads)) return 0;
    if (g->kh == 3 && g->kw == 3) dt__shift_wgrad3(g, x, dy, dW, st->gemm_ws, st->gemm_ws_count, threads);
    else dt__shift_wgrad(g, x, dy, dW, st->gemm_ws, st->gemm_ws_count, threads);
    dt__shift_taken++;
    if (dx && g->sh == 2 && !dt__shift_dgrad2_fits(st, g, threads)) return 2;   /* the input gradient by the GEMMs */
    if (dx && g->sh == 2) { dt__shift_dgrad2(st, g, W, dy, dx, accumulate != 0, threads); return 1; }
    if (dx) dt__shift_conv(st, g, W, dy, NULL, dx, 1, accumulate != 0, threads);
    return 1;
}
#else
static int dt__cpu_conv_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *b, float *y) {
    (void)ctx; (void)g; (void)x; (void)W; (void)b; (void)y; (void)dt__shift_off; (void)dt__shift_taken;
    return 0;
}
static int dt__cpu_conv_bwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, const float *dy, float *dW,
                            float *dx, int accumulate) {
    (void)ctx; (void)g; (void)x; (void)W; (void)dy; (void)dW; (void)dx; (void)accumulate;
    return 0;
}
#endif

/* The convolution's GEMMs with im2col(x) packed straight from the images: t = W col and dW += t col^T */
static void dt__cpu_conv_gemm_fwd(void *ctx, const dt_conv_geom *g, const float *x, const float *W, float *t) {
    int64_t ckk = g->c * g->kh * g->kw, ns = g->n * g->oh * g->ow;
    dt__bsrc bs;
    bs.B = x; bs.ldb = 0; bs.tb = 0; bs.g = g;
    dt__cpu_gemm_src(ctx, 0, g->oc, ns, ckk, 1.0f, W, ckk, &bs, 0.0f, t, ns);
}
static void dt__cpu_conv_gemm_wgrad(void *ctx, const dt_conv_geom *g, const float *x, const float *t, float *dW) {
    int64_t ckk = g->c * g->kh * g->kw, ns = g->n * g->oh * g->ow;
    dt__bsrc bs;
    bs.B = x; bs.ldb = 0; bs.tb = 1; bs.g = g;
    dt__cpu_gemm_src(ctx, 0, g->oc, ckk, ns, 1.0f, t, ns, &bs, 1.0f, dW, ckk);
}
/* The input gradient of a stride-1 convolution is itself a convolution, of dy with the flipped and
   transposed kernel W'[c][o][kh-1-ky][kw-1-kx] = W[o][c][ky][kx] and padding k-1-p: t [c, n*h*w] = W' im2col(dy),
   then dx += t as [n, c, h, w]. The GEMM packs from dy, so nothing im2col-sized is written or scattered. */
static int dt__cpu_conv_gemm_dgrad(void *ctx, const dt_conv_geom *g, const float *W, const float *dy, float *dx, float *ws,
                                   int64_t ws_count) {
    int64_t kk = g->kh * g->kw, hw = g->h * g->w, wn = g->c * g->oc * kk, i;
    dt_conv_geom gt = *g;
    dt__bsrc bs;
    float *Wt = ws, *t = ws + wn;
    if (g->sh != 1 || g->sw != 1 || g->ph > g->kh - 1 || g->pw > g->kw - 1 || wn + g->c * g->n * hw > ws_count) return 0;
    gt.c = g->oc; gt.h = g->oh; gt.w = g->ow; gt.oc = g->c; gt.ph = g->kh - 1 - g->ph; gt.pw = g->kw - 1 - g->pw;
    gt.oh = g->h; gt.ow = g->w;
    DT__OMP(parallel for if (wn > DT__PAR_MIN))
    for (i = 0; i < g->c * g->oc; i++) {   /* i = c * oc + o: Wt[c][o] is W[o][c] turned by 180 degrees */
        const float *src = W + ((i % g->oc) * g->c + i / g->oc) * kk;
        int64_t k;
        for (k = 0; k < kk; k++) Wt[i * kk + k] = src[kk - 1 - k];
    }
    bs.B = dy; bs.ldb = 0; bs.tb = 0; bs.g = &gt;
    dt__cpu_gemm_src(ctx, 0, g->c, g->n * hw, g->oc * kk, 1.0f, Wt, g->oc * kk, &bs, 0.0f, t, g->n * hw);
    DT__OMP(parallel for if (g->n * g->c * hw > DT__PAR_MIN))
    for (i = 0; i < g->n * g->c; i++) {   /* i = n * c + ch */
        int64_t n = i / g->c, ch = i % g->c, s;
        float *d = dx + i * hw;
        const float *src = t + (ch * g->n + n) * hw;
        for (s = 0; s < hw; s++) d[s] += src[s];
    }
    return 1;
}
/* (In C, OpenMP makes only the parallel loop's own variable private: inner loops declare theirs inside.) */
static void dt__cpu_add_row_bias(void *ctx, float *y, const float *b, int64_t rows, int64_t cols) {
    int64_t r;
    (void)ctx;
    DT__OMP(parallel for if (rows * cols > DT__PAR_MIN))
    for (r = 0; r < rows; r++) {
        int64_t i;
        for (i = 0; i < cols; i++) y[r * cols + i] += b[i];
    }
}
static void dt__cpu_sum_rows_bwd(void *ctx, float *db, const float *dy, int64_t rows, int64_t cols) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (rows * cols > DT__PAR_MIN))
    for (i = 0; i < cols; i++) {
        float acc = 0.0f;
        int64_t r;
        for (r = 0; r < rows; r++) acc += dy[r * cols + i];
        db[i] += acc;
    }
}

static void dt__cpu_im2col(void *ctx, const dt_conv_geom *g, const float *x, float *col) {
    int64_t rows = g->c * g->kh * g->kw, S = g->oh * g->ow, r;
    (void)ctx;
    DT__OMP(parallel for schedule(static) if (rows * g->n * S > DT__PAR_MIN))
    for (r = 0; r < rows; r++)
        dt__col_span(g, x, r / (g->kh * g->kw), (r / g->kw) % g->kh, r % g->kw, 0, 0, 0, g->n * S, col + r * g->n * S, 1);
}

#ifdef DT__COL_SPAN_AVX512
/* col2im of one plane xc of at most 16 pixels with AVX-512: tap k's S outputs (at src + k * ld) moved onto
   their pixels by the permutation inv[k] and added there, masked by invm[k] so the other pixels are left as
   they are; the taps in the order of the scalar loop, so the sums round alike */
__attribute__((target("avx512f")))
static void dt__col2im_plane_avx512(const float *src, int64_t ld, int64_t S, int64_t hw, int64_t kk, const int32_t *inv,
                                    const __mmask16 *invm, float *xc) {
    const __mmask16 pm = (__mmask16)((1u << hw) - 1u), sm = (__mmask16)((1u << S) - 1u);
    __m512 acc = _mm512_maskz_loadu_ps(pm, xc);
    int64_t k;
    for (k = 0; k < kk; k++) {
        __m512 v = _mm512_maskz_loadu_ps(sm, src + k * ld);
        acc = _mm512_mask_add_ps(acc, invm[k], acc, _mm512_maskz_permutexvar_ps(invm[k], _mm512_loadu_si512(inv + 16 * k), v));
    }
    _mm512_mask_storeu_ps(xc, pm, acc);
}
/* col2im for images of at most 16 pixels and 16 outputs, a plane at a time in a register; 0 (nothing
   written) when the geometry does not fit */
static int dt__col2im_small(const dt_conv_geom *g, const float *col, float *dx) {
    int64_t S = g->oh * g->ow, hw = g->h * g->w, kk = g->kh * g->kw, nc, t, i;
    int32_t inv[32 * 16];
    __mmask16 invm[32];
    if (S > 16 || hw > 16 || kk > 32) return 0;
    for (t = 0; t < kk; t++) {   /* inv[t][pixel]: the output that tap t reads from that pixel */
        int64_t ky = t / g->kw, kx = t % g->kw, oy, ox;
        invm[t] = 0;
        for (i = 0; i < 16; i++) inv[16 * t + i] = 0;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) {
                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                inv[16 * t + iy * g->w + ix] = (int32_t)(oy * g->ow + ox);
                invm[t] |= (__mmask16)(1u << (iy * g->w + ix));
            }
    }
    DT__OMP(parallel for schedule(static) if (g->c * kk * g->n * S > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++)   /* nc = n * c + ch */
        dt__col2im_plane_avx512(col + (nc % g->c) * kk * g->n * S + nc / g->c * S, g->n * S, S, hw, kk, inv, invm, dx + nc * hw);
    return 1;
}
#endif

static void dt__cpu_col2im_bwd(void *ctx, const dt_conv_geom *g, const float *col, float *dx) {
    int64_t S = g->oh * g->ow, nc;
    (void)ctx;
#ifdef DT__COL_SPAN_AVX512
    if (__builtin_cpu_supports("avx512f") && dt__col2im_small(g, col, dx)) return;
#endif
    /* one (image, channel) plane per iteration: its rows of col only write into that plane */
    DT__OMP(parallel for schedule(static) if (g->c * g->kh * g->kw * g->n * S > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        int64_t n = nc / g->c, c = nc % g->c, ky, kx, oy, ox;
        float *xc = dx + (n * g->c + c) * g->h * g->w;
        for (ky = 0; ky < g->kh; ky++)
            for (kx = 0; kx < g->kw; kx++) {
                int64_t r = (c * g->kh + ky) * g->kw + kx;
                const float *src = col + r * g->n * S + n * S;
                int64_t lo = kx >= g->pw ? 0 : (g->pw - kx + g->sw - 1) / g->sw;
                int64_t hi = g->w + g->pw - kx > 0 ? (g->w + g->pw - kx - 1) / g->sw + 1 : 0;
                if (hi > g->ow) hi = g->ow;
                for (oy = 0; oy < g->oh; oy++) {
                    int64_t iy = oy * g->sh - g->ph + ky;
                    int64_t base = iy * g->w - g->pw + kx;
                    const float *s = src + oy * g->ow;
                    if (iy < 0 || iy >= g->h) continue;
                    if (g->sw == 1) for (ox = lo; ox < hi; ox++) xc[base + ox] += s[ox];
                    else for (ox = lo; ox < hi; ox++) xc[base + ox * g->sw] += s[ox];
                }
            }
    }
}

static void dt__cpu_cs_to_ncs(void *ctx, float *y, const float *t, const float *b, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        int64_t i = nc / c, ch = nc % c, k;
        const float *src = t + ch * n * s + i * s;
        float *dst = y + nc * s, bias = b ? b[ch] : 0.0f;
        for (k = 0; k < s; k++) dst[k] = src[k] + bias;
    }
}
static void dt__cpu_ncs_to_cs(void *ctx, float *t, const float *y, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        int64_t i = nc / c, ch = nc % c;
        memcpy(t + ch * n * s + i * s, y + nc * s, sizeof(float) * (size_t)s);
    }
}
static void dt__bn_sums(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *sx,
                        double *sxy);
static void dt__cpu_channel_sum_bwd(void *ctx, float *db, const float *dy, int64_t n, int64_t c, int64_t s) {
    int64_t ch;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {   /* in double on independent lanes, as batch norm's sums */
        double acc, sq;
        dt__bn_sums(dy + ch * s, NULL, NULL, n, c * s, s, &acc, &sq);
        db[ch] += (float)acc;
    }
}

#ifdef DT__X86
/* cnt (at most 16) outputs of a 2 x 2 stride-2 max pooling row with AVX-512: rows r0, r1 from column
   2 * ox0 on, the indices from i0 (the window's first tap) on; the same selects as the scalar loop. Masked
   loads and stores: nothing past the 2 * cnt columns is touched. */
__attribute__((target("avx512f")))
static void dt__maxpool2_avx512(const float *r0, const float *r1, int64_t w, int32_t i0, float *yo, int32_t *io, int cnt) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __mmask16 lo = (__mmask16)(cnt >= 8 ? 0xFFFF : (1u << (2 * cnt)) - 1u),
              hi = (__mmask16)(cnt <= 8 ? 0 : cnt >= 16 ? 0xFFFF : (1u << (2 * cnt - 16)) - 1u),
              out = (__mmask16)(cnt >= 16 ? 0xFFFF : (1u << cnt) - 1u);
    __m512 a0 = _mm512_maskz_loadu_ps(lo, r0), a1 = _mm512_maskz_loadu_ps(hi, r0 + 16), b0 = _mm512_maskz_loadu_ps(lo, r1),
           b1 = _mm512_maskz_loadu_ps(hi, r1 + 16);
    __m512 tap[4], best;
    __m512i first = _mm512_add_epi32(_mm512_set1_epi32(i0), _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                              11, 12, 13, 14, 15), 1));
    __m512i bi = first, off[4];
    int k;
    tap[0] = _mm512_permutex2var_ps(a0, even, a1); tap[1] = _mm512_permutex2var_ps(a0, odd, a1);
    tap[2] = _mm512_permutex2var_ps(b0, even, b1); tap[3] = _mm512_permutex2var_ps(b0, odd, b1);
    off[1] = _mm512_set1_epi32(1); off[2] = _mm512_set1_epi32((int32_t)w); off[3] = _mm512_set1_epi32((int32_t)w + 1);
    best = tap[0];
    for (k = 1; k < 4; k++) {
        __mmask16 t = _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q) & _mm512_cmp_ps_mask(tap[k], best, _CMP_NLE_UQ);
        best = _mm512_mask_blend_ps(t, best, tap[k]);
        bi = _mm512_mask_blend_epi32(t, bi, _mm512_add_epi32(first, off[k]));
    }
    _mm512_mask_storeu_ps(yo, out, best);
    _mm512_mask_storeu_epi32((void *)io, out, bi);
}
#endif
static void dt__cpu_maxpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y, int32_t *idx) {
    int64_t nc;
    (void)ctx;
    if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0) {
        /* 2 x 2, stride 2: every window inside; selects instead of branches (which the data mispredicts).
           A tap replaces the best unless the best is NaN or the tap is <= it: first maximum, first NaN. */
        int simd = 0;
#ifdef DT__X86
        simd = __builtin_cpu_supports("avx512f");
#endif
        (void)simd;
        DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * 4 > DT__PAR_MIN))
        for (nc = 0; nc < g->n * g->c; nc++) {
            int64_t oy, ox, w = g->w;
            for (oy = 0; oy < g->oh; oy++) {
                const float *r0 = x + nc * g->h * w + 2 * oy * w, *r1 = r0 + w;
                float *yo = y + (nc * g->oh + oy) * g->ow;
                int32_t *io = idx + (nc * g->oh + oy) * g->ow, i0 = (int32_t)(2 * oy * w);
                ox = 0;
#ifdef DT__X86
                if (simd)   /* 16 outputs a step, the last step masked */
                    for (; ox < g->ow; ox += 16)
                        dt__maxpool2_avx512(r0 + 2 * ox, r1 + 2 * ox, w, i0 + 2 * (int32_t)ox, yo + ox, io + ox,
                                            g->ow - ox < 16 ? (int)(g->ow - ox) : 16);
#endif
                for (; ox < g->ow; ox++) {
                    float best = r0[2 * ox], v;
                    int32_t bi = i0 + 2 * (int32_t)ox, t;
                    v = r0[2 * ox + 1]; t = best == best && !(v <= best); best = t ? v : best; bi = t ? i0 + 2 * (int32_t)ox + 1 : bi;
                    v = r1[2 * ox];     t = best == best && !(v <= best); best = t ? v : best; bi = t ? i0 + (int32_t)w + 2 * (int32_t)ox : bi;
                    v = r1[2 * ox + 1]; t = best == best && !(v <= best); best = t ? v : best;
                    bi = t ? i0 + (int32_t)w + 2 * (int32_t)ox + 1 : bi;
                    yo[ox] = best;
                    io[ox] = bi;
                }
            }
        }
        return;
    }
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * g->kh * g->kw > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        const float *xp = x + nc * g->h * g->w;
        int64_t oy, ox, ky, kx;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) {
                float best;
                int64_t bi, y0 = oy * g->sh - g->ph, x0 = ox * g->sw - g->pw;
                if (y0 >= 0 && x0 >= 0 && y0 + g->kh <= g->h && x0 + g->kw <= g->w) {
                    /* inside: no bounds checks; first maximum wins, NaN propagates */
                    bi = y0 * g->w + x0;
                    best = xp[bi];
                    for (ky = 0; ky < g->kh && best == best; ky++)
                        for (kx = 0; kx < g->kw; kx++) {
                            float v = xp[(y0 + ky) * g->w + x0 + kx];
                            if (v > best || v != v) { best = v; bi = (y0 + ky) * g->w + x0 + kx; if (v != v) break; }
                        }
                } else {
                    best = dt__maxpool_window(g, xp, oy, ox, &bi);   /* at the border: checked taps */
                }
                y[(nc * g->oh + oy) * g->ow + ox] = best;
                idx[(nc * g->oh + oy) * g->ow + ox] = (int32_t)bi;
            }
    }
}
static void dt__cpu_maxpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, const int32_t *idx, float *dx) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        int64_t k, S = g->oh * g->ow;
        float *dxp = dx + nc * g->h * g->w;
        for (k = 0; k < S; k++)
            if (idx[nc * S + k] >= 0) dxp[idx[nc * S + k]] += dy[nc * S + k];
    }
}
static void dt__cpu_avgpool_fwd(void *ctx, const dt_conv_geom *g, const float *x, float *y) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * g->kh * g->kw > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        const float *xp = x + nc * g->h * g->w;
        int64_t oy, ox;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) y[(nc * g->oh + oy) * g->ow + ox] = dt__avgpool_window(g, xp, oy, ox);
    }
}
static void dt__cpu_avgpool_bwd(void *ctx, const dt_conv_geom *g, const float *dy, float *dx) {
    int64_t nc;
    float inv = 1.0f / (float)(g->kh * g->kw);
    (void)ctx;
    DT__OMP(parallel for if (g->n * g->c * g->oh * g->ow * g->kh * g->kw > DT__PAR_MIN))
    for (nc = 0; nc < g->n * g->c; nc++) {
        float *dxp = dx + nc * g->h * g->w;
        int64_t oy, ox, ky, kx;
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) {
                float v = dy[(nc * g->oh + oy) * g->ow + ox] * inv;
                for (ky = 0; ky < g->kh; ky++) {
                    int64_t iy = oy * g->sh - g->ph + ky;
                    if (iy < 0 || iy >= g->h) continue;
                    for (kx = 0; kx < g->kw; kx++) {
                        int64_t ix = ox * g->sw - g->pw + kx;
                        if (ix >= 0 && ix < g->w) dxp[iy * g->w + ix] += v;
                    }
                }
            }
    }
}
static void dt__cpu_gap_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        float acc = 0.0f;
        int64_t k;
        for (k = 0; k < s; k++) acc += x[nc * s + k];
        y[nc] = acc / (float)s;
    }
}
static void dt__cpu_gap_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t s) {
    int64_t nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        float v = dy[nc] / (float)s;
        int64_t k;
        for (k = 0; k < s; k++) dx[nc * s + k] += v;
    }
}
static void dt__cpu_relu_fwd(void *ctx, const float *x, float *y, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
static void dt__cpu_relu_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {   /* dy read unconditionally, so the select vectorises */
        float d = dy[i];
        dx[i] += y[i] > 0.0f ? d : 0.0f;
    }
}
static void dt__cpu_dropout_fwd(void *ctx, const float *x, float *y, float *mask, int64_t n, float p, uint64_t key) {
    int64_t i;
    float keep = 1.0f / (1.0f - p);
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        mask[i] = dt__hash_uniform(key, (uint64_t)i) >= p ? keep : 0.0f;
        y[i] = x[i] * mask[i];
    }
}
static void dt__cpu_mul_bwd(void *ctx, const float *dy, const float *mask, float *dx, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) dx[i] += dy[i] * mask[i];
}

/* Sums over the n rows of s floats, rows cs apart, of x and of x*x (y NULL) or of x and x*y, in double on 8
   independent lanes (which the compiler turns into vector adds; one chain of double adds would wait on
   each add's latency), added pairwise at the end. mk not NULL: x counts as 0 where mk (laid out as x) is
   not > 0 (the gradient through a ReLU whose output is mk). */
#ifdef DT__X86
/* the same sums with AVX-512: 16 floats a step into four vectors of 8 doubles; the lanes then added as
   dt__bn_sums adds its 8 */
__attribute__((target("avx512f")))
static void dt__bn_sums512(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *a,
                           double *b) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), b0 = _mm512_setzero_pd(), b1 = _mm512_setzero_pd();
    int64_t i, k;
    for (i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = (y ? y : x) + i * cs, *r = mk ? mk + i * cs : NULL;
        for (k = 0; k + 16 <= s; k += 16) {
            /* maskz: the plain conversion trips GCC 12's C++ -Wmaybe-uninitialized inside its own header */
            __mmask16 keep = r ? _mm512_cmp_ps_mask(_mm512_loadu_ps(r + k), _mm512_setzero_ps(), _CMP_GT_OQ) : 0xFFFF;
            __m512d p0 = _mm512_maskz_cvtps_pd((__mmask8)keep, _mm256_loadu_ps(p + k)),
                    p1 = _mm512_maskz_cvtps_pd((__mmask8)(keep >> 8), _mm256_loadu_ps(p + k + 8));
            __m512d q0 = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(q + k)),
                    q1 = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(q + k + 8));
            a0 = _mm512_add_pd(a0, p0); a1 = _mm512_add_pd(a1, p1);
            b0 = _mm512_fmadd_pd(p0, q0, b0); b1 = _mm512_fmadd_pd(p1, q1, b1);
        }
        for (; k < s; k++) {
            double pv = r && !(r[k] > 0.0f) ? 0.0 : (double)p[k];
            a[k % 8] += pv;
            b[k % 8] += pv * (double)q[k];
        }
    }
    _mm512_storeu_pd(a + 8, _mm512_add_pd(a0, a1));
    _mm512_storeu_pd(b + 8, _mm512_add_pd(b0, b1));
}
#endif
static void dt__bn_sums(const float *x, const float *y, const float *mk, int64_t n, int64_t cs, int64_t s, double *sx,
                        double *sxy) {
    double a[16] = {0}, b[16] = {0};
    int64_t i, k;
    int j, w;
#ifdef DT__X86
    if (__builtin_cpu_supports("avx512f")) {
        dt__bn_sums512(x, y, mk, n, cs, s, a, b);
        for (j = 0; j < 8; j++) { a[j] += a[j + 8]; b[j] += b[j + 8]; }
        n = 0;
    }
#endif
    for (i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = (y ? y : x) + i * cs, *r = mk ? mk + i * cs : NULL;
        for (k = 0; k + 8 <= s; k += 8)
            for (j = 0; j < 8; j++) {
                double pv = r && !(r[k + j] > 0.0f) ? 0.0 : (double)p[k + j];
                a[j] += pv;
                b[j] += pv * (double)q[k + j];
            }
        for (; k < s; k++) {
            double pv = r && !(r[k] > 0.0f) ? 0.0 : (double)p[k];
            a[k % 8] += pv;
            b[k % 8] += pv * (double)q[k];
        }
    }
    for (w = 4; w > 0; w /= 2)
        for (j = 0; j < w; j++) { a[j] += a[j + w]; b[j] += b[j + w]; }
    *sx = a[0];
    *sxy = b[0];
}
/* batch norm's forward pass; when relu is 1, then + res (res not NULL) and ReLU */
static void dt__bn_fwd(int training, int relu, const float *x, const float *res, float *y, int64_t n, int64_t c, int64_t s,
                       const float *gamma,
                       const float *beta, float *rm, float *rv, float eps, float momentum, float *save_mean,
                       float *save_invstd) {
    int64_t ch;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {
        int64_t i, k, cnt = n * s;
        float mean, invstd, g, b;
        if (training) {
            /* sums in double: the variance as E[x^2] - mean^2 keeps 1e-6 relative to PyTorch at any batch
               (float data has 24 bits; double leaves 29 for the cancellation) */
            double sum, sq, dm, var;
            dt__bn_sums(x + ch * s, NULL, NULL, n, c * s, s, &sum, &sq);
            dm = sum / (double)cnt;
            sq -= dm * sum;   /* sum of (x - mean)^2 */
            if (sq < 0.0) sq = 0.0;
            mean = (float)dm;
            var = sq / (double)cnt;
            invstd = (float)(1.0 / sqrt(var + (double)eps));
            rm[ch] = (1.0f - momentum) * rm[ch] + momentum * mean;
            rv[ch] = (1.0f - momentum) * rv[ch] + momentum * (float)(cnt > 1 ? sq / (double)(cnt - 1) : var);
        } else {
            mean = rm[ch];
            invstd = 1.0f / sqrtf(rv[ch] + eps);
        }
        save_mean[ch] = mean;
        save_invstd[ch] = invstd;
        g = gamma[ch] * invstd;
        b = beta[ch] - mean * g;
        for (i = 0; i < n; i++) {
            const float *xp = x + (i * c + ch) * s;
            float *yp = y + (i * c + ch) * s;
            if (relu && res)
                for (k = 0; k < s; k++) {
                    float v = (xp[k] * g + b) + res[(i * c + ch) * s + k];
                    yp[k] = v > 0.0f ? v : 0.0f;
                }
            else if (relu)
                for (k = 0; k < s; k++) {
                    float v = xp[k] * g + b;
                    yp[k] = v > 0.0f ? v : 0.0f;
                }
            else
                for (k = 0; k < s; k++) yp[k] = xp[k] * g + b;
        }
    }
}
static void dt__cpu_bn_fwd(void *ctx, int training, const float *x, float *y, int64_t n, int64_t c, int64_t s,
                           const float *gamma, const float *beta, float *rm, float *rv, float eps, float momentum,
                           float *save_mean, float *save_invstd) {
    (void)ctx;
    dt__bn_fwd(training, 0, x, NULL, y, n, c, s, gamma, beta, rm, rv, eps, momentum, save_mean, save_invstd);
}
static void dt__cpu_bn_relu_fwd(void *ctx, int training, const float *x, const float *r, float *y, int64_t n, int64_t c,
                                int64_t s, const float *gamma, const float *beta, float *rm, float *rv, float eps,
                                float momentum, float *save_mean, float *save_invstd) {
    (void)ctx;
    dt__bn_fwd(training, 1, x, r, y, n, c, s, gamma, beta, rm, rv, eps, momentum, save_mean, save_invstd);
}
/* batch norm's backward pass for the gradient dy of its output, or (y not NULL) of y = max(0, its output
   [+ a residual]); dx += (acc 1) or = (acc 0); dr (not NULL: the residual's gradient) += (acc_r 1) or =
   dy where y > 0 */
static void dt__bn_bwd(int training, const float *x, const float *y, const float *dy, float *dx, int acc, float *dr, int acc_r,
                       int64_t n, int64_t c, int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                       float *dgamma, float *dbeta) {
    int64_t ch;
    DT__OMP(parallel for if (n * c * s > DT__PAR_MIN))
    for (ch = 0; ch < c; ch++) {
        int64_t i, k, cnt = n * s;
        double sdy, sdyx;
        float mean = save_mean[ch], invstd = save_invstd[ch];
        dt__bn_sums(dy + ch * s, x + ch * s, y ? y + ch * s : NULL, n, c * s, s, &sdy, &sdyx);
        sdyx = (sdyx - (double)mean * sdy) * (double)invstd;   /* sum of dy * xhat */
        dgamma[ch] += (float)sdyx;
        dbeta[ch] += (float)sdy;
        if (dx) {
            float gi = gamma[ch] * invstd;
            float mdy = training ? (float)(sdy / (double)cnt) : 0.0f;
            float mdyx = training ? (float)(sdyx / (double)cnt) : 0.0f;
            /* dx += gi (dy - mdy - xhat mdyx) with xhat = (x - mean) invstd */
            float cx = -gi * invstd * mdyx, c0 = -gi * mdy;
            for (i = 0; i < n; i++) {
                const float *dyp = dy + (i * c + ch) * s, *xp = x + (i * c + ch) * s, *yp = y ? y + (i * c + ch) * s : NULL;
                float *dxp = dx + (i * c + ch) * s;
                if (!yp && acc) for (k = 0; k < s; k++) dxp[k] += gi * dyp[k] + cx * (xp[k] - mean) + c0;
                else if (!yp) for (k = 0; k < s; k++) dxp[k] = gi * dyp[k] + cx * (xp[k] - mean) + c0;
                else if (acc)
                    for (k = 0; k < s; k++) {
                        float d = dyp[k];   /* read unconditionally, so the select vectorises */
                        dxp[k] += gi * (yp[k] > 0.0f ? d : 0.0f) + cx * (xp[k] - mean) + c0;
                    }
                else
                    for (k = 0; k < s; k++) {
                        float d = dyp[k];
                        dxp[k] = gi * (yp[k] > 0.0f ? d : 0.0f) + cx * (xp[k] - mean) + c0;
                    }
            }
        }
        for (i = 0; dr && y && i < n; i++) {
            const float *dyp = dy + (i * c + ch) * s, *yp = y + (i * c + ch) * s;
            float *drp = dr + (i * c + ch) * s;
            if (acc_r) for (k = 0; k < s; k++) { float d = dyp[k]; drp[k] += yp[k] > 0.0f ? d : 0.0f; }
            else for (k = 0; k < s; k++) { float d = dyp[k]; drp[k] = yp[k] > 0.0f ? d : 0.0f; }
        }
    }
}
static void dt__cpu_bn_bwd(void *ctx, int training, const float *x, const float *dy, float *dx, int64_t n, int64_t c,
                           int64_t s, const float *gamma, const float *save_mean, const float *save_invstd,
                           float *dgamma, float *dbeta) {
    (void)ctx;
    dt__bn_bwd(training, x, NULL, dy, dx, 1, NULL, 0, n, c, s, gamma, save_mean, save_invstd, dgamma, dbeta);
}
static void dt__cpu_bn_relu_bwd(void *ctx, int training, const float *x, const float *y, const float *dy, float *dx,
                                int accumulate, float *dr, int acc_r, int64_t n, int64_t c, int64_t s, const float *gamma,
                                const float *save_mean, const float *save_invstd, float *dgamma, float *dbeta) {
    (void)ctx;
    dt__bn_bwd(training, x, y, dy, dx, accumulate, dr, acc_r, n, c, s, gamma, save_mean, save_invstd, dgamma, dbeta);
}
static void dt__cpu_add_relu_fwd(void *ctx, float *y, const float *a, const float *b, int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        float v = a[i] + b[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
/* d = dy where y > 0, else 0, written (acc 0) or added (acc 1) to each of da, db that is not NULL */
static void dt__cpu_add_relu_bwd(void *ctx, const float *y, const float *dy, float *da, int acc_a, float *db, int acc_b,
                                 int64_t n) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i += 4096) {   /* a block at a time, so each loop below is a plain vector loop */
        int64_t k, e = n - i < 4096 ? n : i + 4096;
        if (da && acc_a) for (k = i; k < e; k++) { float d = dy[k]; da[k] += y[k] > 0.0f ? d : 0.0f; }
        else if (da) for (k = i; k < e; k++) { float d = dy[k]; da[k] = y[k] > 0.0f ? d : 0.0f; }
        if (db && acc_b) for (k = i; k < e; k++) { float d = dy[k]; db[k] += y[k] > 0.0f ? d : 0.0f; }
        else if (db) for (k = i; k < e; k++) { float d = dy[k]; db[k] = y[k] > 0.0f ? d : 0.0f; }
    }
}

static void dt__cpu_pad_shortcut_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t c, int64_t h, int64_t w,
                                     int64_t oc, int64_t stride) {
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride, lo = (oc - c) / 2, no;
    (void)ctx;
    DT__OMP(parallel for if (n * oc * oh * ow > DT__PAR_MIN))
    for (no = 0; no < n * oc; no++) {
        int64_t i = no / oc, o = no % oc, ci = o - lo, yy, xx;
        float *yp = y + no * oh * ow;
        if (ci < 0 || ci >= c) { memset(yp, 0, sizeof(float) * (size_t)(oh * ow)); continue; }
        for (yy = 0; yy < oh; yy++)
            for (xx = 0; xx < ow; xx++) yp[yy * ow + xx] = x[((i * c + ci) * h + yy * stride) * w + xx * stride];
    }
}
static void dt__cpu_pad_shortcut_bwd(void *ctx, const float *dy, float *dx, int64_t n, int64_t c, int64_t h, int64_t w,
                                     int64_t oc, int64_t stride) {
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride, lo = (oc - c) / 2, nc;
    (void)ctx;
    DT__OMP(parallel for if (n * c * oh * ow > DT__PAR_MIN))
    for (nc = 0; nc < n * c; nc++) {
        int64_t i = nc / c, ci = nc % c, yy, xx;
        const float *dyp = dy + (i * oc + ci + lo) * oh * ow;
        for (yy = 0; yy < oh; yy++)
            for (xx = 0; xx < ow; xx++) dx[(nc * h + yy * stride) * w + xx * stride] += dyp[yy * ow + xx];
    }
}

static void dt__cpu_log_softmax_fwd(void *ctx, const float *x, float *y, int64_t n, int64_t k) {
    int64_t r;
    (void)ctx;
    DT__OMP(parallel for if (n * k > DT__PAR_MIN))
    for (r = 0; r < n; r++) dt__log_softmax_row(x + r * k, y + r * k, k);
}
static void dt__cpu_log_softmax_bwd(void *ctx, const float *y, const float *dy, float *dx, int64_t n, int64_t k) {
    int64_t r;
    (void)ctx;
    DT__OMP(parallel for if (n * k > DT__PAR_MIN))
    for (r = 0; r < n; r++) dt__log_softmax_row_bwd(y + r * k, dy + r * k, dx + r * k, k);
}
/* Losses run on one thread: their cost is O(n k), tiny next to any layer, and a fixed order keeps the
   loss bit-reproducible. Labels were checked by the caller. */
static void dt__cpu_softmax_xent(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k, float *dx,
                                 float *loss) {
    int64_t r;
    double total = 0.0;
    (void)ctx;
    for (r = 0; r < n; r++) total += dt__softmax_xent_row(x + r * k, labels[r], k, n, dx + r * k);
    *loss = (float)(total / (double)n);
}
static void dt__cpu_nll(void *ctx, const float *logp, const int32_t *labels, int64_t n, int64_t k, float *dx,
                        float *loss) {
    int64_t r;
    double total = 0.0;
    (void)ctx;
    memset(dx, 0, sizeof(float) * (size_t)(n * k));
    for (r = 0; r < n; r++) {
        total -= (double)logp[r * k + labels[r]];
        dx[r * k + labels[r]] = -1.0f / (float)n;
    }
    *loss = (float)(total / (double)n);
}
static void dt__cpu_mse(void *ctx, const float *x, const float *target, int64_t n, float *dx, float *loss) {
    int64_t i;
    double total = 0.0;
    (void)ctx;
    for (i = 0; i < n; i++) {
        float d = x[i] - target[i];
        total += (double)d * (double)d;
        dx[i] = 2.0f * d / (float)n;
    }
    *loss = (float)(total / (double)n);
}
static void dt__cpu_count_correct(void *ctx, const float *x, const int32_t *labels, int64_t n, int64_t k,
                                  int64_t *correct) {
    int64_t r, c = 0;
    (void)ctx;
    for (r = 0; r < n; r++) c += dt__argmax_row(x + r * k, k) == labels[r];
    *correct = c;
}

static void dt__cpu_sum_squares(void *ctx, const float *x, int64_t n, double *out) {
    double acc = 0.0;
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for reduction(+:acc) if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
    *out = acc;
}
/* The order of operations follows torch.optim's single-tensor code, so results agree to the last bits. */
static void dt__cpu_sgd_step(void *ctx, float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                             float dampening, float wd, int nesterov, int first) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) dt__sgd_update(p, g, buf, i, lr, momentum, dampening, wd, nesterov, first);
}
static void dt__cpu_adam_step(void *ctx, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {
    int64_t i;
    (void)ctx;
    DT__OMP(parallel for if (n > DT__PAR_MIN))
    for (i = 0; i < n; i++) dt__adam_update(p, g, m, v, i, lr, beta1, beta2, eps, wd, decoupled, step_size, bc2_sqrt);
}

static const dt_ops dt__cpu_ops_table = {
    "cpu",
    dt__cpu_alloc, dt__cpu_free, dt__cpu_upload, dt__cpu_upload, dt__cpu_copy,
    dt__cpu_fill, dt__cpu_scale, dt__cpu_axpy, dt__cpu_add,
    dt__cpu_gemm, dt__cpu_add_row_bias, dt__cpu_sum_rows_bwd,
    dt__cpu_im2col, dt__cpu_col2im_bwd, dt__cpu_cs_to_ncs, dt__cpu_ncs_to_cs, dt__cpu_channel_sum_bwd,
    dt__cpu_maxpool_fwd, dt__cpu_maxpool_bwd, dt__cpu_avgpool_fwd, dt__cpu_avgpool_bwd,
    dt__cpu_gap_fwd, dt__cpu_gap_bwd,
    dt__cpu_relu_fwd, dt__cpu_relu_bwd,
    dt__cpu_dropout_fwd, dt__cpu_mul_bwd,
    dt__cpu_bn_fwd, dt__cpu_bn_bwd,
    dt__cpu_pad_shortcut_fwd, dt__cpu_pad_shortcut_bwd,
    dt__cpu_log_softmax_fwd, dt__cpu_log_softmax_bwd,
    dt__cpu_softmax_xent, dt__cpu_nll, dt__cpu_mse, dt__cpu_count_correct,
    dt__cpu_sum_squares, dt__cpu_sgd_step, dt__cpu_adam_step,
    NULL,  /* sync: the CPU ops finish before they return */
    dt__cpu_conv_gemm_fwd, dt__cpu_conv_gemm_wgrad, dt__cpu_conv_gemm_dgrad, dt__cpu_conv_fwd, dt__cpu_conv_bwd,
    dt__cpu_bn_relu_fwd, dt__cpu_bn_relu_bwd, dt__cpu_add_relu_fwd, dt__cpu_add_relu_bwd
};

const dt_ops *dt_cpu_ops(void) { return &dt__cpu_ops_table; }

/* ---------------------------------------------------------------------------------------------- */
/* 3. nn                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

const char *dt_layer_kind_str(dt_layer_kind k) {
    static const char *names[DT_LAYER_KIND_COUNT] = {"input", "linear", "conv2d", "maxpool2d", "avgpool2d",
        "global_avgpool", "relu", "dropout", "batchnorm", "flatten", "add", "pad_shortcut", "log_softmax"};
    return (k >= 0 && k < DT_LAYER_KIND_COUNT) ? names[k] : "unknown";
}

typedef struct dt__node {
    dt_layer_kind kind;
    int in0, in1;                   /* input node ids (-1 = none) */
    int ndim;                       /* per-sample output: [c] (1) or [c, h, w] (3) */
    int64_t c, h, w, size;
    int64_t k, stride, pad;         /* conv / pool window */
    int has_bias;
    float p, eps, momentum;         /* dropout, batchnorm */
    int param0, nparams, buf0, nbufs;
    int alias;                      /* 1: output and gradient are the input's (flatten) */
    /* set by dt__plan: */
    int relu;                       /* batchnorm or add: the ReLU node it runs inside itself (0: none) */
    int bn;                         /* add: the batch norm (one of its inputs) it runs too (0: none) */
    unsigned char folded;           /* relu, or batchnorm run by an add: run by another node */
    unsigned char zero;             /* the gradient is zeroed before backward (its first writer adds to it) */
    unsigned char ow[2];            /* the backward pass writes (not adds) the gradient of input 0 / 1 */
    char name[64];
    /* arena pointers, set by dt__reserve */
    float *out, *grad, *aux;        /* aux: dropout mask [batch*size] or batchnorm mean, invstd [2c] */
    int32_t *idx;                   /* maxpool argmax [batch*size] */
} dt__node;

typedef struct dt__pinfo {
    char name[80];
    int node, ndim;
    int64_t offset, count, shape[DT_MAX_DIMS];
} dt__pinfo;

struct dt_model {
    const dt_ops *ops;
    void *ctx;
    uint64_t seed, stream;
    int input_vector;               /* input is [c] rather than [c, h, w] */
    int input_grad;
    dt__node *nodes;
    int nnodes, cap_nodes;
    dt__pinfo *pinfo, *binfo;
    int npinfo, cap_pinfo, nbinfo, cap_binfo;
    int64_t nparams, nbuffers;
    dt_result error;                /* first builder error, sticky */
    char error_msg[512];
    int finalized, training, seed_ready;
    float *params, *grads, *buffers;
    /* activation arena */
    int64_t cap_batch, batch;
    float *arena;
    int32_t *iarena;
    float *seed_grad;               /* gradient of the loss w.r.t. the output [cap_batch, out size] */
    int32_t *labels;                /* [cap_batch] */
    float *ws;                      /* convolution workspace */
    int64_t ws_count;
    uint64_t step;                  /* forward passes in training mode: the dropout counter */
    dt_backward_hook hook;          /* called after each node's backward (dt_ddp's buckets) */
    void *hook_user;
    dt__cpu_state cpu;              /* the CPU backend's state (ctx) when no other is given */
    void *own_ctx;                  /* a backend context the model created (the CUDA build's default), or NULL */
};

/* Waits for the backend's ops (dt_ops.sync) and returns their first failure, named after the call. */
static dt_result dt__sync(const dt_model *m, const char *what) {
    char msg[sizeof dt__errmsg];
    const char *prev, *name;
    size_t k;
    dt_result r;
    if (!m->ops->sync || (r = m->ops->sync(m->ctx)) == DT_OK) return DT_OK;
    prev = dt_last_error();
    name = dt_result_str(r);
    k = strlen(name);
    if (strncmp(prev, name, k) == 0 && prev[k] == ':' && prev[k + 1] == ' ') prev += k + 2;   /* one "DT_ERR_...: " */
    snprintf(msg, sizeof msg, "%s", prev);
    return dt_set_error(r, "%s: %s", what, msg);
}

/* ---- builder ---------------------------------------------------------------------------------- */

static int dt__fail_build(dt_model *m, dt_result r, const char *fmt, ...) {
    if (m->error == DT_OK) {
        va_list ap;
        int n = snprintf(m->error_msg, sizeof m->error_msg, "%s: ", dt_result_str(r));
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof m->error_msg)
            vsnprintf(m->error_msg + n, sizeof m->error_msg - (size_t)n, fmt, ap);
        va_end(ap);
        m->error = r;
    }
    snprintf(dt__errmsg, sizeof dt__errmsg, "%s", m->error_msg);
    return -1;
}

/* Validates a builder call's input; returns 0 when the call may go on. */
static int dt__check_input(dt_model *m, int x, const char *what) {
    if (!m) { dt_set_error(DT_ERR_INVALID_ARG, "%s: model is NULL", what); return -1; }
    if (m->error != DT_OK) { snprintf(dt__errmsg, sizeof dt__errmsg, "%s", m->error_msg); return -1; }
    if (m->finalized) return dt__fail_build(m, DT_ERR_STATE, "%s: model is already finalized; add every layer before dt_model_finalize", what);
    if (x < 0 || x >= m->nnodes) return dt__fail_build(m, DT_ERR_INVALID_ARG, "%s: input node %d does not exist (model has %d nodes)", what, x, m->nnodes);
    return 0;
}

static dt__node *dt__add_node(dt_model *m, dt_layer_kind kind, int in0) {
    dt__node *n;
    if (m->nnodes == m->cap_nodes) {
        int cap = m->cap_nodes ? 2 * m->cap_nodes : 16;
        dt__node *nn = (dt__node *)DT_REALLOC(m->nodes, sizeof(dt__node) * (size_t)cap);
        if (!nn) { dt__fail_build(m, DT_ERR_OUT_OF_MEMORY, "out of memory growing the node list to %d nodes", cap); return NULL; }
        m->nodes = nn;
        m->cap_nodes = cap;
    }
    n = &m->nodes[m->nnodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->in0 = in0;
    n->in1 = -1;
    n->param0 = m->npinfo;
    n->buf0 = m->nbinfo;
    if (in0 >= 0) {
        const dt__node *src = &m->nodes[in0];
        n->ndim = src->ndim; n->c = src->c; n->h = src->h; n->w = src->w; n->size = src->size;
    }
    snprintf(n->name, sizeof n->name, "%s%d", dt_layer_kind_str(kind), m->nnodes);
    m->nnodes++;
    return n;
}

static void dt__set_shape3(dt__node *n, int64_t c, int64_t h, int64_t w) {
    n->ndim = 3; n->c = c; n->h = h; n->w = w; n->size = c * h * w;
}
static void dt__set_shape1(dt__node *n, int64_t c) {
    n->ndim = 1; n->c = c; n->h = 1; n->w = 1; n->size = c;
}

/* Adds a parameter (buf = 0) or buffer (buf = 1) view to the node last added. */
static int dt__add_view(dt_model *m, int buf, const char *suffix, int ndim, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    dt__pinfo **arr = buf ? &m->binfo : &m->pinfo;
    int *cnt = buf ? &m->nbinfo : &m->npinfo, *cap = buf ? &m->cap_binfo : &m->cap_pinfo;
    dt__pinfo *p;
    dt__node *n = &m->nodes[m->nnodes - 1];
    if (*cnt == *cap) {
        int c2 = *cap ? 2 * *cap : 16;
        dt__pinfo *np = (dt__pinfo *)DT_REALLOC(*arr, sizeof(dt__pinfo) * (size_t)c2);
        if (!np) return dt__fail_build(m, DT_ERR_OUT_OF_MEMORY, "out of memory growing the parameter list");
        *arr = np;
        *cap = c2;
    }
    p = &(*arr)[(*cnt)++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", suffix);   /* full names are made at finalize */
    p->node = m->nnodes - 1;
    p->ndim = ndim;
    p->shape[0] = s0; p->shape[1] = s1; p->shape[2] = s2; p->shape[3] = s3;
    p->count = s0 * (ndim > 1 ? s1 : 1) * (ndim > 2 ? s2 : 1) * (ndim > 3 ? s3 : 1);
    if (buf) { p->offset = m->nbuffers; m->nbuffers += p->count; n->nbufs++; }
    else { p->offset = m->nparams; m->nparams += p->count; n->nparams++; }
    return 0;
}

dt_result dt_model_create(dt_model **out, const dt_model_desc *desc) {
    dt_model *m;
    dt__node *in;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_create: out is NULL");
    *out = NULL;
    if (!desc) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_create: desc is NULL; pass a dt_model_desc with the input shape");
    if (desc->in_c <= 0 || desc->in_h < 0 || desc->in_w < 0 || ((desc->in_h == 0) != (desc->in_w == 0)))
        return dt_set_error(DT_ERR_SHAPE, "dt_model_create: input shape (c=%lld, h=%lld, w=%lld) is invalid; set in_c > 0 and "
                            "either both in_h and in_w > 0 (images) or both 0 (vectors)",
                            (long long)desc->in_c, (long long)desc->in_h, (long long)desc->in_w);
    m = (dt_model *)DT_MALLOC(sizeof *m);
    if (!m) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_create: no memory for the model");
    memset(m, 0, sizeof *m);
    m->ops = desc->ops ? desc->ops : dt_cpu_ops();
    m->ctx = desc->ops_ctx;
#ifdef DT_USE_CUDA
    if (!desc->ops || desc->ops == dt_cuda_ops()) {   /* a CUDA build: the GPU is the default, on the given
                                                          dt_cuda or on one the model creates */
        m->ops = dt_cuda_ops();
        if (!m->ctx) {
            dt_cuda *cu = NULL;
            dt_result r = dt_cuda_create(&cu, NULL);
            if (r != DT_OK) { DT_FREE(m); return r; }
            m->ctx = m->own_ctx = cu;
        }
    }
#endif
    if (m->ops == dt_cpu_ops() && !m->ctx) m->ctx = &m->cpu;   /* workspace placed by dt__reserve */
    m->seed = desc->seed;
    m->stream = desc->stream;
    m->training = 1;
    m->input_vector = desc->in_h == 0;
    m->input_grad = desc->input_grad != 0;
    in = dt__add_node(m, DT_LAYER_INPUT, -1);
    if (!in) { dt_model_destroy(m); return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_create: no memory for nodes"); }
    if (m->input_vector) dt__set_shape1(in, desc->in_c);
    else dt__set_shape3(in, desc->in_c, desc->in_h, desc->in_w);
    snprintf(in->name, sizeof in->name, "input");
    *out = m;
    return DT_OK;
}

static void dt__free_arena(dt_model *m) {
    if (m->arena) m->ops->free(m->ctx, m->arena);
    if (m->iarena) m->ops->free(m->ctx, m->iarena);
    m->arena = NULL;
    m->iarena = NULL;
    m->cap_batch = 0;
    m->cpu.gemm_ws = NULL;
    m->cpu.gemm_ws_count = 0;
}

void dt_model_destroy(dt_model *m) {
    if (!m) return;
    dt__free_arena(m);
    if (m->params) m->ops->free(m->ctx, m->params);
    if (m->grads) m->ops->free(m->ctx, m->grads);
    if (m->buffers) m->ops->free(m->ctx, m->buffers);
#ifdef DT_USE_CUDA
    if (m->own_ctx) dt_cuda_destroy((dt_cuda *)m->own_ctx);   /* after everything allocated on it */
#endif
    DT_FREE(m->nodes);
    DT_FREE(m->pinfo);
    DT_FREE(m->binfo);
    DT_FREE(m);
}

int dt_model_input(dt_model *m) { return m ? 0 : -1; }

int dt_linear(dt_model *m, int x, int64_t out_features, int bias) {
    dt__node *n;
    int64_t in;
    if (dt__check_input(m, x, "dt_linear")) return -1;
    if (m->nodes[x].ndim != 1)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_linear: input node %d (%s) has shape [%lld, %lld, %lld]; a linear layer needs "
                              "a vector: insert dt_flatten before it", x, m->nodes[x].name, (long long)m->nodes[x].c,
                              (long long)m->nodes[x].h, (long long)m->nodes[x].w);
    if (out_features <= 0) return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_linear: out_features is %lld; it must be > 0", (long long)out_features);
    in = m->nodes[x].size;
    if (!(n = dt__add_node(m, DT_LAYER_LINEAR, x))) return -1;
    dt__set_shape1(n, out_features);
    n->has_bias = bias != 0;
    if (dt__add_view(m, 0, "weight", 2, out_features, in, 0, 0)) return -1;
    if (n->has_bias && dt__add_view(m, 0, "bias", 1, out_features, 0, 0, 0)) return -1;
    return m->nnodes - 1;
}

/* Window geometry of node n over its input (batch left 0). */
static dt_conv_geom dt__geom(const dt_model *m, const dt__node *n, int64_t batch) {
    const dt__node *src = &m->nodes[n->in0];
    dt_conv_geom g;
    memset(&g, 0, sizeof g);
    g.n = batch; g.c = src->c; g.h = src->h; g.w = src->w;
    g.oc = n->c; g.oh = n->h; g.ow = n->w;
    g.kh = g.kw = n->k; g.sh = g.sw = n->stride; g.ph = g.pw = n->pad;
    return g;
}

static int dt__window(dt_model *m, int x, dt_layer_kind kind, int64_t oc, int64_t k, int64_t stride, int64_t pad,
                      const char *what) {
    dt_conv_geom g;
    dt__node *n;
    const dt__node *src;
    if (dt__check_input(m, x, what)) return -1;
    src = &m->nodes[x];
    if (src->ndim != 3)
        return dt__fail_build(m, DT_ERR_SHAPE, "%s: input node %d (%s) is a vector of %lld; it needs an image [c, h, w]",
                              what, x, src->name, (long long)src->size);
    if (kind == DT_LAYER_MAXPOOL2D || kind == DT_LAYER_AVGPOOL2D) {
        if (stride == 0) stride = k;
        if (pad * 2 > k)
            return dt__fail_build(m, DT_ERR_SHAPE, "%s: padding %lld is more than half the kernel %lld (PyTorch's limit too)",
                                  what, (long long)pad, (long long)k);
    } else if (stride == 0) stride = 1;
    memset(&g, 0, sizeof g);
    g.c = src->c; g.h = src->h; g.w = src->w; g.kh = g.kw = k; g.sh = g.sw = stride; g.ph = g.pw = pad;
    if (oc <= 0) return dt__fail_build(m, DT_ERR_INVALID_ARG, "%s: out_channels is %lld; it must be > 0", what, (long long)oc);
    if (dt_conv_geom_resolve(&g) != DT_OK) return dt__fail_build(m, DT_ERR_SHAPE, "%s: %s", what, dt_last_error());
    if (!(n = dt__add_node(m, kind, x))) return -1;
    dt__set_shape3(n, oc, g.oh, g.ow);
    n->k = k; n->stride = stride; n->pad = pad;
    return m->nnodes - 1;
}

int dt_conv2d_ex(dt_model *m, int x, const dt_conv2d_desc *d) {
    int id;
    dt__node *n;
    int64_t cin;
    if (!d) { if (m) return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_conv2d_ex: desc is NULL"); return -1; }
    id = dt__window(m, x, DT_LAYER_CONV2D, d->out_channels, d->kernel, d->stride, d->pad, "dt_conv2d");
    if (id < 0) return -1;
    n = &m->nodes[id];
    cin = m->nodes[x].c;
    n->has_bias = !d->no_bias;
    if (dt__add_view(m, 0, "weight", 4, d->out_channels, cin, d->kernel, d->kernel)) return -1;
    if (n->has_bias && dt__add_view(m, 0, "bias", 1, d->out_channels, 0, 0, 0)) return -1;
    return id;
}
int dt_conv2d(dt_model *m, int x, int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad) {
    dt_conv2d_desc d;
    memset(&d, 0, sizeof d);
    d.out_channels = out_channels; d.kernel = kernel; d.stride = stride; d.pad = pad;
    return dt_conv2d_ex(m, x, &d);
}
int dt_maxpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad) {
    if (dt__check_input(m, x, "dt_maxpool2d")) return -1;
    return dt__window(m, x, DT_LAYER_MAXPOOL2D, m->nodes[x].c, kernel, stride, pad, "dt_maxpool2d");
}
int dt_avgpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad) {
    if (dt__check_input(m, x, "dt_avgpool2d")) return -1;
    return dt__window(m, x, DT_LAYER_AVGPOOL2D, m->nodes[x].c, kernel, stride, pad, "dt_avgpool2d");
}

static int dt__unary(dt_model *m, int x, dt_layer_kind kind, const char *what) {
    if (dt__check_input(m, x, what)) return -1;
    if (!dt__add_node(m, kind, x)) return -1;
    return m->nnodes - 1;
}

int dt_global_avgpool(dt_model *m, int x) {
    int id;
    if (dt__check_input(m, x, "dt_global_avgpool")) return -1;
    if (m->nodes[x].ndim != 3)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_global_avgpool: input node %d (%s) is a vector; it needs an image [c, h, w]",
                              x, m->nodes[x].name);
    if ((id = dt__unary(m, x, DT_LAYER_GLOBAL_AVGPOOL, "dt_global_avgpool")) < 0) return -1;
    dt__set_shape1(&m->nodes[id], m->nodes[x].c);
    return id;
}
int dt_relu(dt_model *m, int x) { return dt__unary(m, x, DT_LAYER_RELU, "dt_relu"); }
int dt_dropout(dt_model *m, int x, float p) {
    int id;
    if (dt__check_input(m, x, "dt_dropout")) return -1;
    if (!(p >= 0.0f && p < 1.0f))
        return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_dropout: p = %g; it must be in [0, 1)", (double)p);
    if ((id = dt__unary(m, x, DT_LAYER_DROPOUT, "dt_dropout")) < 0) return -1;
    m->nodes[id].p = p;
    return id;
}
int dt_batchnorm_ex(dt_model *m, int x, float eps, float momentum) {
    int id;
    int64_t c;
    if (dt__check_input(m, x, "dt_batchnorm")) return -1;
    if (eps == 0.0f) eps = 1e-5f;
    if (momentum == 0.0f) momentum = 0.1f;
    if (!(eps > 0.0f) || !(momentum > 0.0f && momentum <= 1.0f))
        return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_batchnorm: eps %g must be > 0 and momentum %g in (0, 1]",
                              (double)eps, (double)momentum);
    if ((id = dt__unary(m, x, DT_LAYER_BATCHNORM, "dt_batchnorm")) < 0) return -1;
    m->nodes[id].eps = eps;
    m->nodes[id].momentum = momentum;
    c = m->nodes[id].c;
    if (dt__add_view(m, 0, "weight", 1, c, 0, 0, 0) || dt__add_view(m, 0, "bias", 1, c, 0, 0, 0) ||
        dt__add_view(m, 1, "running_mean", 1, c, 0, 0, 0) || dt__add_view(m, 1, "running_var", 1, c, 0, 0, 0))
        return -1;
    return id;
}
int dt_batchnorm(dt_model *m, int x) { return dt_batchnorm_ex(m, x, 0.0f, 0.0f); }
int dt_flatten(dt_model *m, int x) {
    int id;
    if ((id = dt__unary(m, x, DT_LAYER_FLATTEN, "dt_flatten")) < 0) return -1;
    dt__set_shape1(&m->nodes[id], m->nodes[x].size);
    m->nodes[id].alias = 1;
    return id;
}
int dt_add(dt_model *m, int a, int b) {
    int id;
    const dt__node *na, *nb;
    if (dt__check_input(m, a, "dt_add") || dt__check_input(m, b, "dt_add")) return -1;
    na = &m->nodes[a]; nb = &m->nodes[b];
    if (na->ndim != nb->ndim || na->c != nb->c || na->h != nb->h || na->w != nb->w)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_add: node %d (%s) is [%lld, %lld, %lld] but node %d (%s) is [%lld, %lld, %lld]; "
                              "a residual sum needs equal shapes (use dt_pad_shortcut or a 1x1 conv on the shortcut)",
                              a, na->name, (long long)na->c, (long long)na->h, (long long)na->w, b, nb->name,
                              (long long)nb->c, (long long)nb->h, (long long)nb->w);
    if ((id = dt__unary(m, a, DT_LAYER_ADD, "dt_add")) < 0) return -1;
    m->nodes[id].in1 = b;
    return id;
}
int dt_pad_shortcut(dt_model *m, int x, int64_t out_channels, int64_t stride) {
    int id;
    const dt__node *src;
    if (dt__check_input(m, x, "dt_pad_shortcut")) return -1;
    src = &m->nodes[x];
    if (src->ndim != 3 || out_channels < src->c || (out_channels - src->c) % 2 != 0 || stride <= 0)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_pad_shortcut: input node %d (%s) with %lld channels cannot be padded to %lld "
                              "channels with stride %lld: it needs an image, out_channels >= in_channels with an even "
                              "difference, and stride > 0", x, src->name, (long long)src->c, (long long)out_channels,
                              (long long)stride);
    if ((id = dt__unary(m, x, DT_LAYER_PAD_SHORTCUT, "dt_pad_shortcut")) < 0) return -1;
    dt__set_shape3(&m->nodes[id], out_channels, (src->h + stride - 1) / stride, (src->w + stride - 1) / stride);
    m->nodes[id].stride = stride;
    return id;
}
int dt_log_softmax(dt_model *m, int x) {
    if (dt__check_input(m, x, "dt_log_softmax")) return -1;
    if (m->nodes[x].ndim != 1)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_log_softmax: input node %d (%s) is an image; flatten it first", x, m->nodes[x].name);
    return dt__unary(m, x, DT_LAYER_LOG_SOFTMAX, "dt_log_softmax");
}
int dt_model_name(dt_model *m, int x, const char *name) {
    if (!m || x < 0 || x >= m->nnodes || !name) return -1;
    snprintf(m->nodes[x].name, sizeof m->nodes[x].name, "%s", name);
    return x;
}

/* ---- finalize: flat buffers and initialisation ------------------------------------------------ */

static void dt__full_names(dt_model *m, dt__pinfo *arr, int count) {
    int i;
    for (i = 0; i < count; i++) {
        char suffix[80];
        snprintf(suffix, sizeof suffix, "%s", arr[i].name);
        snprintf(arr[i].name, sizeof arr[i].name, "%.60s.%.18s", m->nodes[arr[i].node].name, suffix);
    }
}

dt_result dt_model_finalize(dt_model *m) {
    float *hp = NULL, *hb = NULL;
    dt_rng rng;
    dt_result r;
    int i;
    if (!m) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_finalize: model is NULL");
    if (m->error != DT_OK) { snprintf(dt__errmsg, sizeof dt__errmsg, "%s", m->error_msg); return m->error; }
    if (m->finalized) return dt_set_error(DT_ERR_STATE, "dt_model_finalize: the model is already finalized");
    if (m->nnodes < 2) return dt_set_error(DT_ERR_STATE, "dt_model_finalize: the model has no layers; add some with dt_linear, dt_conv2d, ...");
    dt__full_names(m, m->pinfo, m->npinfo);
    dt__full_names(m, m->binfo, m->nbinfo);
    m->params = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * m->nparams);
    m->grads = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * m->nparams);
    m->buffers = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * m->nbuffers);
    hp = (float *)DT_MALLOC(sizeof(float) * (size_t)(m->nparams + 1));
    hb = (float *)DT_MALLOC(sizeof(float) * (size_t)(m->nbuffers + 1));
    if (!m->params || !m->grads || !m->buffers || !hp || !hb) {
        DT_FREE(hp); DT_FREE(hb);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_finalize: no memory for %lld parameters and %lld buffer elements",
                            (long long)m->nparams, (long long)m->nbuffers);
    }
    /* PyTorch's defaults: kaiming_uniform_(a=sqrt(5)) gives weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
       and biases use the same bound; batchnorm starts at weight 1, bias 0, mean 0, var 1. */
    dt_rng_init(&rng, m->seed, m->stream);
    for (i = 0; i < m->npinfo; i++) {
        const dt__pinfo *p = &m->pinfo[i];
        const dt__node *n = &m->nodes[p->node];
        int64_t j, fan_in = 1;
        int is_bias = strstr(p->name, ".bias") != NULL && strcmp(p->name + strlen(p->name) - 5, ".bias") == 0;
        if (n->kind == DT_LAYER_BATCHNORM) {
            for (j = 0; j < p->count; j++) hp[p->offset + j] = is_bias ? 0.0f : 1.0f;
            continue;
        }
        fan_in = m->pinfo[n->param0].count / m->pinfo[n->param0].shape[0];
        {
            float bound = 1.0f / sqrtf((float)fan_in);
            for (j = 0; j < p->count; j++) hp[p->offset + j] = (2.0f * dt_rng_uniform(&rng) - 1.0f) * bound;
        }
    }
    for (i = 0; i < m->nbinfo; i++) {
        const dt__pinfo *p = &m->binfo[i];
        int64_t j;
        float v = strstr(p->name, "running_var") ? 1.0f : 0.0f;
        for (j = 0; j < p->count; j++) hb[p->offset + j] = v;
    }
    m->ops->upload(m->ctx, m->params, hp, (int64_t)sizeof(float) * m->nparams);
    m->ops->upload(m->ctx, m->buffers, hb, (int64_t)sizeof(float) * m->nbuffers);
    m->ops->fill(m->ctx, m->grads, m->nparams, 0.0f);
    DT_FREE(hp);
    DT_FREE(hb);
    if ((r = dt__sync(m, "dt_model_finalize")) != DT_OK) return r;
    m->finalized = 1;
    return DT_OK;
}

static int dt__fuse_off;   /* 1: plan nothing: no fusion, every gradient zeroed and added to (the tests compare) */

/* the node whose gradient buffer node i's is (flatten shares its input's) */
static int dt__owner(const dt_model *m, int i) {
    while (m->nodes[i].alias) i = m->nodes[i].in0;
    return i;
}
/* the node that alone reads node i's output (0: none, or several) */
static int dt__only_reader(const dt_model *m, int i) {
    int j, readers = 0, r = 0;
    for (j = i + 1; j < m->nnodes; j++) {
        if (m->nodes[j].in0 == i) { readers++; r = j; }
        if (m->nodes[j].in1 == i) { readers++; r = j; }
    }
    return readers == 1 ? r : 0;
}
/* the residual input of add node a whose other input is the batch norm (a->bn) */
static int dt__residual(const dt__node *a) { return a->in0 == a->bn ? a->in1 : a->in0; }
/* Plans the passes from the graph and the backend's ops. A ReLU whose input only it reads runs inside the
   batch norm or add before it (that node's output and gradient are then never stored); so does a batch
   norm whose only reader is a residual add whose only reader is a ReLU: the add runs all three (when the
   residual is computed after the batch norm, only the add has both). An activation gradient's first writer
   in the backward pass (its reader with the highest index) writes it rather than adding to it when its op
   can; the others are zeroed before the pass. */
static void dt__plan(dt_model *m) {
    const dt_ops *O = m->ops;
    int i, j, slot, last = m->nnodes - 1, bnr = O->bn_relu_fwd && O->bn_relu_bwd, addr = O->add_relu_fwd && O->add_relu_bwd;
    for (i = 0; i < m->nnodes; i++) {
        dt__node *n = &m->nodes[i];
        n->relu = 0; n->bn = 0; n->folded = 0; n->zero = 2; n->ow[0] = n->ow[1] = 0;   /* zero 2: no writer seen yet */
    }
    for (i = 1; i < last && !dt__fuse_off; i++) {
        dt__node *n = &m->nodes[i], *a;
        int r = dt__only_reader(m, i), rr;
        if (!r || n->folded) continue;
        if (n->kind == DT_LAYER_BATCHNORM && bnr && m->nodes[r].kind == DT_LAYER_RELU) {
            n->relu = r; m->nodes[r].folded = 1;
        } else if (n->kind == DT_LAYER_BATCHNORM && bnr && (a = &m->nodes[r])->kind == DT_LAYER_ADD && a->in0 != a->in1 &&
                   (a->in0 == i ? a->in1 : a->in0) != n->in0 && (rr = dt__only_reader(m, r)) && m->nodes[rr].kind == DT_LAYER_RELU) {
            n->relu = rr; n->folded = 1; a->bn = i; a->relu = rr; m->nodes[rr].folded = 1;
        } else if (n->kind == DT_LAYER_ADD && addr && !n->bn && n->in0 != n->in1 && m->nodes[r].kind == DT_LAYER_RELU) {
            n->relu = r; m->nodes[r].folded = 1;
        }
    }
    m->nodes[dt__owner(m, last)].zero = 0;   /* the loss gradient is copied in */
    for (j = last; j >= 1; j--) {
        dt__node *n = &m->nodes[j];
        if (n->alias || n->folded) continue;   /* writes no gradient */
        for (slot = 0; slot < 2; slot++) {
            /* an add that runs a batch norm writes the batch norm's input's gradient and the residual's */
            int in = n->bn ? (slot ? dt__residual(n) : m->nodes[n->bn].in0) : (slot ? n->in1 : n->in0);
            dt__node *o;
            if (in < 0 || (o = &m->nodes[dt__owner(m, in)])->zero != 2) continue;
            n->ow[slot] = !dt__fuse_off && (n->kind == DT_LAYER_ADD || n->kind == DT_LAYER_LINEAR ||
                                            (n->kind == DT_LAYER_BATCHNORM && n->relu) || (n->kind == DT_LAYER_CONV2D && O->conv_bwd));
            o->zero = !n->ow[slot];
        }
    }
    for (i = 0; i < m->nnodes; i++)
        if (m->nodes[i].zero == 2) m->nodes[i].zero = 1;
}

/* Sizes and places the activation arena for `batch` samples. Allocation happens only when the batch
   grows past the largest one seen, so a steady training loop never allocates. */
static dt_result dt__reserve(dt_model *m, int64_t batch) {
    int64_t total = 0, itotal = 0, ws = 0, outsz;
    int i;
    float *a;
    int32_t *ia;
    if (batch <= m->cap_batch) return DT_OK;
    if (!m->cap_batch) dt__plan(m);
    outsz = m->nodes[m->nnodes - 1].size;
    for (i = 0; i < m->nnodes; i++) {
        const dt__node *n = &m->nodes[i];
        if (!n->alias && !n->relu) total += 2 * batch * n->size;
        if (n->kind == DT_LAYER_DROPOUT) total += batch * n->size;
        if (n->kind == DT_LAYER_BATCHNORM) total += 2 * n->c;
        if (n->kind == DT_LAYER_MAXPOOL2D) itotal += batch * n->size;
        if (n->kind == DT_LAYER_CONV2D) {
            /* workspace: col [c k k, nb s] + t [oc, nb s] for a chunk of nb images */
            dt_conv_geom g = dt__geom(m, n, batch);
            int64_t per = (g.c * g.kh * g.kw + g.oc) * g.oh * g.ow;
            int64_t nb = DT_CONV_WORKSPACE / per;
            if (nb < 1) nb = 1;
            if (nb > batch) nb = batch;
            if (nb * per > ws) ws = nb * per;
        }
    }
    total += ws + batch * outsz;
    if (m->ctx == &m->cpu) total += dt__gemm_ws_count(dt_cpu_threads());
    itotal += batch;
    a = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * total);
    ia = (int32_t *)m->ops->alloc(m->ctx, (int64_t)sizeof(int32_t) * itotal);
    if (!a || !ia) {
        if (a) m->ops->free(m->ctx, a);
        if (ia) m->ops->free(m->ctx, ia);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_forward: no memory for the activations of a batch of %lld "
                            "(%lld floats); use a smaller batch", (long long)batch, (long long)total);
    }
    dt__free_arena(m);
    m->arena = a;
    m->iarena = ia;
    m->cap_batch = batch;
    for (i = 0; i < m->nnodes; i++) {
        dt__node *n = &m->nodes[i];
        if (n->alias) { n->out = m->nodes[n->in0].out; n->grad = m->nodes[n->in0].grad; }
        else if (n->relu) n->out = n->grad = NULL;
        else { n->out = a; a += batch * n->size; n->grad = a; a += batch * n->size; }
        if (i == 0 && !m->input_grad) n->grad = NULL;
        n->aux = NULL; n->idx = NULL;
        if (n->kind == DT_LAYER_DROPOUT) { n->aux = a; a += batch * n->size; }
        if (n->kind == DT_LAYER_BATCHNORM) { n->aux = a; a += 2 * n->c; }
        if (n->kind == DT_LAYER_MAXPOOL2D) { n->idx = ia; ia += batch * n->size; }
    }
    m->ws = a; m->ws_count = ws; a += ws;
    if (m->ctx == &m->cpu) {
        m->cpu.gemm_ws = a;
        m->cpu.gemm_ws_count = dt__gemm_ws_count(dt_cpu_threads());
        a += m->cpu.gemm_ws_count;
    }
    m->seed_grad = a;
    m->labels = ia;
    return DT_OK;
}

void dt_model_train(dt_model *m, int training) { if (m) m->training = training != 0; }
int dt_model_is_training(const dt_model *m) { return m ? m->training : 0; }

/* ---- forward and backward of each layer --------------------------------------------------------- */

static float *dt__pv(dt_model *m, const dt__node *n, int j) { return m->params + m->pinfo[n->param0 + j].offset; }
static float *dt__gv(dt_model *m, const dt__node *n, int j) { return m->grads + m->pinfo[n->param0 + j].offset; }
static float *dt__bv(dt_model *m, const dt__node *n, int j) { return m->buffers + m->binfo[n->buf0 + j].offset; }

/* Convolution as im2col + one GEMM per chunk of images:  t [oc, nb*s] = W [oc, c*k*k] col [c*k*k, nb*s] */
static void dt__conv_fwd(dt_model *m, const dt__node *n, int64_t batch) {
    const dt_ops *O = m->ops;
    dt_conv_geom g = dt__geom(m, n, batch);
    int64_t ckk = g.c * g.kh * g.kw, S = g.oh * g.ow, per = (ckk + g.oc) * S, nb = m->ws_count / per, i0;
    const float *x = m->nodes[n->in0].out, *W = dt__pv(m, n, 0), *b = n->has_bias ? dt__pv(m, n, 1) : NULL;
    if (O->conv_fwd && O->conv_fwd(m->ctx, &g, x, W, b, n->out)) return;
    if (nb < 1) nb = 1;
    for (i0 = 0; i0 < batch; i0 += nb) {
        dt_conv_geom gc = g;
        float *col = m->ws, *t;
        gc.n = batch - i0 < nb ? batch - i0 : nb;
        t = col + ckk * gc.n * S;
        if (O->conv_gemm_fwd) O->conv_gemm_fwd(m->ctx, &gc, x + i0 * g.c * g.h * g.w, W, t);
        else {
            O->im2col(m->ctx, &gc, x + i0 * g.c * g.h * g.w, col);
            O->gemm(m->ctx, 0, 0, g.oc, gc.n * S, ckk, 1.0f, W, ckk, col, gc.n * S, 0.0f, t, gc.n * S);
        }
        O->cs_to_ncs(m->ctx, n->out + i0 * g.oc * S, t, b, gc.n, g.oc, S);
    }
}
/* dW += t col^T;  db += sum dy;  dcol = W^T t, dx += col2im(dcol)   with t = dy as [oc, nb*s] */
static void dt__conv_bwd(dt_model *m, const dt__node *n, int64_t batch, float *dx) {
    const dt_ops *O = m->ops;
    dt_conv_geom g = dt__geom(m, n, batch);
    int64_t ckk = g.c * g.kh * g.kw, S = g.oh * g.ow, per = (ckk + g.oc) * S, nb = m->ws_count / per, i0;
    const float *x = m->nodes[n->in0].out, *W = dt__pv(m, n, 0);
    float *dW = dt__gv(m, n, 0);
    int done = 0;   /* conv_bwd: 1 all done, 2 dW done */
    if (nb < 1) nb = 1;
    if (n->has_bias) O->channel_sum_bwd(m->ctx, dt__gv(m, n, 1), n->grad, batch, g.oc, S);
    if (O->conv_bwd && (done = O->conv_bwd(m->ctx, &g, x, W, n->grad, dW, dx, !n->ow[0])) == 1) return;
    if (dx && n->ow[0]) O->fill(m->ctx, dx, batch * g.c * g.h * g.w, 0.0f);   /* the steps below add to it */
    for (i0 = 0; i0 < batch; i0 += nb) {
        dt_conv_geom gc = g;
        float *col = m->ws, *t;
        gc.n = batch - i0 < nb ? batch - i0 : nb;
        t = col + ckk * gc.n * S;
        O->ncs_to_cs(m->ctx, t, n->grad + i0 * g.oc * S, gc.n, g.oc, S);
        if (done == 2) {}   /* conv_bwd wrote dW */
        else if (O->conv_gemm_wgrad) O->conv_gemm_wgrad(m->ctx, &gc, x + i0 * g.c * g.h * g.w, t, dW);
        else {
            O->im2col(m->ctx, &gc, x + i0 * g.c * g.h * g.w, col);
            O->gemm(m->ctx, 0, 1, g.oc, ckk, gc.n * S, 1.0f, t, gc.n * S, col, gc.n * S, 1.0f, dW, ckk);
        }
        if (dx && !(O->conv_gemm_dgrad && O->conv_gemm_dgrad(m->ctx, &gc, W, n->grad + i0 * g.oc * S, dx + i0 * g.c * g.h * g.w,
                                                            col, ckk * gc.n * S))) {
            O->gemm(m->ctx, 1, 0, ckk, gc.n * S, g.oc, 1.0f, W, ckk, t, gc.n * S, 0.0f, col, gc.n * S);
            O->col2im_bwd(m->ctx, &gc, col, dx + i0 * g.c * g.h * g.w);
        }
    }
}

static void dt__node_fwd(dt_model *m, dt__node *n, int64_t batch) {
    const dt_ops *O = m->ops;
    void *C = m->ctx;
    const dt__node *in = &m->nodes[n->in0 < 0 ? 0 : n->in0];
    const float *x = in->out;
    int64_t cnt = batch * n->size;
    switch (n->kind) {
    case DT_LAYER_INPUT: case DT_LAYER_FLATTEN: break;
    case DT_LAYER_LINEAR:      /* y [b, out] = x [b, in] W^T [in, out] + bias */
        O->gemm(C, 0, 1, batch, n->c, in->size, 1.0f, x, in->size, dt__pv(m, n, 0), in->size, 0.0f, n->out, n->c);
        if (n->has_bias) O->add_row_bias(C, n->out, dt__pv(m, n, 1), batch, n->c);
        break;
    case DT_LAYER_CONV2D: dt__conv_fwd(m, n, batch); break;
    case DT_LAYER_MAXPOOL2D: { dt_conv_geom g = dt__geom(m, n, batch); O->maxpool_fwd(C, &g, x, n->out, n->idx); } break;
    case DT_LAYER_AVGPOOL2D: { dt_conv_geom g = dt__geom(m, n, batch); O->avgpool_fwd(C, &g, x, n->out); } break;
    case DT_LAYER_GLOBAL_AVGPOOL: O->gap_fwd(C, x, n->out, batch, in->c, in->h * in->w); break;
    case DT_LAYER_RELU: if (!n->folded) O->relu_fwd(C, x, n->out, cnt); break;
    case DT_LAYER_DROPOUT:
        if (m->training && n->p > 0.0f) {
            uint64_t key = dt__mix64(m->seed ^ dt__mix64(m->stream * 0x100000001b3ULL + (uint64_t)(n - m->nodes)) ^
                                     (m->step * 0x9e3779b97f4a7c15ULL));
            O->dropout_fwd(C, x, n->out, n->aux, cnt, n->p, key);
        } else {
            O->copy(C, n->out, x, cnt);
            O->fill(C, n->aux, cnt, 1.0f);
        }
        break;
    case DT_LAYER_BATCHNORM:
        if (n->folded) break;   /* the add after it runs it */
        if (n->relu)
            O->bn_relu_fwd(C, m->training, x, NULL, m->nodes[n->relu].out, batch, n->c, n->h * n->w, dt__pv(m, n, 0),
                           dt__pv(m, n, 1), dt__bv(m, n, 0), dt__bv(m, n, 1), n->eps, n->momentum, n->aux, n->aux + n->c);
        else
            O->bn_fwd(C, m->training, x, n->out, batch, n->c, n->h * n->w, dt__pv(m, n, 0), dt__pv(m, n, 1), dt__bv(m, n, 0),
                      dt__bv(m, n, 1), n->eps, n->momentum, n->aux, n->aux + n->c);
        break;
    case DT_LAYER_ADD:
        if (n->bn) {   /* relu(bn(x) + residual) */
            dt__node *b = &m->nodes[n->bn];
            O->bn_relu_fwd(C, m->training, m->nodes[b->in0].out, m->nodes[dt__residual(n)].out, m->nodes[n->relu].out, batch,
                           b->c, b->h * b->w, dt__pv(m, b, 0), dt__pv(m, b, 1), dt__bv(m, b, 0), dt__bv(m, b, 1), b->eps,
                           b->momentum, b->aux, b->aux + b->c);
        } else if (n->relu) O->add_relu_fwd(C, m->nodes[n->relu].out, x, m->nodes[n->in1].out, cnt);
        else O->add(C, n->out, x, m->nodes[n->in1].out, cnt);
        break;
    case DT_LAYER_PAD_SHORTCUT: O->pad_shortcut_fwd(C, x, n->out, batch, in->c, in->h, in->w, n->c, n->stride); break;
    case DT_LAYER_LOG_SOFTMAX: O->log_softmax_fwd(C, x, n->out, batch, n->c); break;
    default: break;
    }
}

static void dt__node_bwd(dt_model *m, dt__node *n, int64_t batch) {
    const dt_ops *O = m->ops;
    void *C = m->ctx;
    dt__node *in = &m->nodes[n->in0 < 0 ? 0 : n->in0];
    float *dx = in->grad;      /* NULL when nobody needs the input's gradient */
    const float *x = in->out, *dy = n->grad;
    const dt__node *r = &m->nodes[n->relu];   /* the ReLU run inside this node, when n->relu */
    int64_t cnt = batch * n->size;
    switch (n->kind) {
    case DT_LAYER_INPUT: case DT_LAYER_FLATTEN: break;
    case DT_LAYER_LINEAR:      /* dW [out, in] += dy^T x;  db += sum_b dy;  dx [b, in] += dy W */
        O->gemm(C, 1, 0, n->c, in->size, batch, 1.0f, dy, n->c, x, in->size, 1.0f, dt__gv(m, n, 0), in->size);
        if (n->has_bias) O->sum_rows_bwd(C, dt__gv(m, n, 1), dy, batch, n->c);
        if (dx) O->gemm(C, 0, 0, batch, in->size, n->c, 1.0f, dy, n->c, dt__pv(m, n, 0), in->size, n->ow[0] ? 0.0f : 1.0f, dx,
                        in->size);
        break;
    case DT_LAYER_CONV2D: dt__conv_bwd(m, n, batch, dx); break;
    case DT_LAYER_MAXPOOL2D: if (dx) { dt_conv_geom g = dt__geom(m, n, batch); O->maxpool_bwd(C, &g, dy, n->idx, dx); } break;
    case DT_LAYER_AVGPOOL2D: if (dx) { dt_conv_geom g = dt__geom(m, n, batch); O->avgpool_bwd(C, &g, dy, dx); } break;
    case DT_LAYER_GLOBAL_AVGPOOL: if (dx) O->gap_bwd(C, dy, dx, batch, in->c, in->h * in->w); break;
    case DT_LAYER_RELU: if (dx && !n->folded) O->relu_bwd(C, n->out, dy, dx, cnt); break;
    case DT_LAYER_DROPOUT: if (dx) O->mul_bwd(C, dy, n->aux, dx, cnt); break;
    case DT_LAYER_BATCHNORM:
        if (n->folded) break;   /* the add after it runs it */
        if (n->relu)
            O->bn_relu_bwd(C, m->training, x, r->out, r->grad, dx, !n->ow[0], NULL, 0, batch, n->c, n->h * n->w, dt__pv(m, n, 0),
                           n->aux, n->aux + n->c, dt__gv(m, n, 0), dt__gv(m, n, 1));
        else
            O->bn_bwd(C, m->training, x, dy, dx, batch, n->c, n->h * n->w, dt__pv(m, n, 0), n->aux, n->aux + n->c,
                      dt__gv(m, n, 0), dt__gv(m, n, 1));
        break;
    case DT_LAYER_ADD: {
        float *dx1 = m->nodes[n->in1].grad;
        if (n->bn) {   /* relu(bn(x) + residual) */
            dt__node *b = &m->nodes[n->bn];
            O->bn_relu_bwd(C, m->training, m->nodes[b->in0].out, r->out, r->grad, m->nodes[b->in0].grad, !n->ow[0],
                           m->nodes[dt__residual(n)].grad, !n->ow[1], batch, b->c, b->h * b->w, dt__pv(m, b, 0), b->aux,
                           b->aux + b->c, dt__gv(m, b, 0), dt__gv(m, b, 1));
            break;
        }
        if (n->relu) { O->add_relu_bwd(C, r->out, r->grad, dx, !n->ow[0], dx1, !n->ow[1], cnt); break; }
        if (dx && n->ow[0]) O->copy(C, dx, dy, cnt);
        else if (dx) O->axpy(C, dx, dy, cnt, 1.0f);
        if (dx1 && n->ow[1]) O->copy(C, dx1, dy, cnt);
        else if (dx1) O->axpy(C, dx1, dy, cnt, 1.0f);
    } break;
    case DT_LAYER_PAD_SHORTCUT: if (dx) O->pad_shortcut_bwd(C, dy, dx, batch, in->c, in->h, in->w, n->c, n->stride); break;
    case DT_LAYER_LOG_SOFTMAX: if (dx) O->log_softmax_bwd(C, n->out, dy, dx, batch, n->c); break;
    default: break;
    }
}

/* ---- passes --------------------------------------------------------------------------------------- */

static dt_result dt__need_final(const dt_model *m, const char *what) {
    if (!m) return dt_set_error(DT_ERR_INVALID_ARG, "%s: model is NULL", what);
    if (!m->finalized) return dt_set_error(DT_ERR_STATE, "%s: call dt_model_finalize after building the model", what);
    return DT_OK;
}

dt_result dt_model_forward(dt_model *m, const float *x, int64_t batch) {
    dt_result r;
    int i;
    if ((r = dt__need_final(m, "dt_model_forward")) != DT_OK) return r;
    if (!x) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_forward: input x is NULL");
    if (batch <= 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_forward: batch is %lld; it must be > 0", (long long)batch);
    if ((r = dt__reserve(m, batch)) != DT_OK) return r;
    dt_trace_begin("forward", "compute");
    dt__trace_arg("batch", NULL, batch);
    m->ops->upload(m->ctx, m->nodes[0].out, x, (int64_t)sizeof(float) * batch * m->nodes[0].size);
    for (i = 1; i < m->nnodes; i++) dt__node_fwd(m, &m->nodes[i], batch);
    r = dt__sync(m, "dt_model_forward");
    dt_trace_end();
    if (m->training) m->step++;
    m->batch = batch;
    m->seed_ready = 0;
    return r;
}

/* Checks that a loss may run on the output and uploads the labels (when given). */
static dt_result dt__loss_prep(dt_model *m, const int32_t *labels, const float *target, const char *what) {
    const dt__node *out;
    dt_result r;
    int64_t i;
    if ((r = dt__need_final(m, what)) != DT_OK) return r;
    if (!m->batch) return dt_set_error(DT_ERR_STATE, "%s: no forward pass yet; call dt_model_forward first", what);
    out = &m->nodes[m->nnodes - 1];
    if (labels || !target) {
        if (!labels) return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL", what);
        if (out->ndim != 1)
            return dt_set_error(DT_ERR_SHAPE, "%s: the output node (%s) is an image; a classification loss needs a vector of "
                                "class scores: end the model with dt_flatten and dt_linear", what, out->name);
        for (i = 0; i < m->batch; i++)
            if (labels[i] < 0 || labels[i] >= out->c)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: label %d of sample %lld is outside [0, %lld): the labels do not "
                                    "match the model's %lld outputs", what, (int)labels[i], (long long)i, (long long)out->c,
                                    (long long)out->c);
        m->ops->upload(m->ctx, m->labels, labels, (int64_t)sizeof(int32_t) * m->batch);
    }
    return DT_OK;
}

static dt_result dt__loss_done(dt_model *m, float loss, const char *what) {
    m->seed_ready = 1;
    if (!(loss == loss) || loss == INFINITY || loss == -INFINITY)
        return dt_set_error(DT_ERR_NUMERIC, "%s: the loss is %g: the model diverged or the input holds NaN/inf; lower the "
                            "learning rate, check the data, or restore the last checkpoint", what, (double)loss);
    return DT_OK;
}

typedef void (*dt__class_loss_fn)(void *, const float *, const int32_t *, int64_t, int64_t, float *, float *);
static dt_result dt__class_loss(dt_model *m, dt__class_loss_fn fn, const int32_t *labels, float *loss, const char *what) {
    dt_result r = dt__loss_prep(m, labels, NULL, what);
    const dt__node *out;
    float l = 0.0f;
    if (r != DT_OK) return r;
    out = &m->nodes[m->nnodes - 1];
    dt_trace_begin("loss", "compute");
    fn(m->ctx, out->out, m->labels, m->batch, out->c, m->seed_grad, &l);
    r = dt__sync(m, what);   /* inside the span: the span is the backend's time */
    dt_trace_end();
    if (r != DT_OK) return r;
    if (loss) *loss = l;
    return dt__loss_done(m, l, what);
}
dt_result dt_model_loss_cross_entropy(dt_model *m, const int32_t *labels, float *loss) {
    return dt__class_loss(m, m ? m->ops->softmax_xent : NULL, labels, loss, "dt_model_loss_cross_entropy");
}
dt_result dt_model_loss_nll(dt_model *m, const int32_t *labels, float *loss) {
    return dt__class_loss(m, m ? m->ops->nll : NULL, labels, loss, "dt_model_loss_nll");
}
dt_result dt_model_loss_labels(dt_model *m, const int32_t *labels, float *loss) {
    if (m && m->nnodes > 1 && m->nodes[m->nnodes - 1].kind == DT_LAYER_LOG_SOFTMAX) return dt_model_loss_nll(m, labels, loss);
    return dt_model_loss_cross_entropy(m, labels, loss);
}
dt_result dt_model_loss_mse(dt_model *m, const float *target, float *loss) {
    dt_result r;
    int64_t cnt;
    float l = 0.0f;
    if (!target) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_loss_mse: target is NULL");
    if ((r = dt__loss_prep(m, NULL, target, "dt_model_loss_mse")) != DT_OK) return r;
    cnt = m->batch * m->nodes[m->nnodes - 1].size;
    /* the target goes through the gradient buffer, which the kernel then overwrites with d loss/d x */
    dt_trace_begin("loss", "compute");
    m->ops->upload(m->ctx, m->seed_grad, target, (int64_t)sizeof(float) * cnt);
    m->ops->mse(m->ctx, m->nodes[m->nnodes - 1].out, m->seed_grad, cnt, m->seed_grad, &l);
    r = dt__sync(m, "dt_model_loss_mse");
    dt_trace_end();
    if (r != DT_OK) return r;
    if (loss) *loss = l;
    return dt__loss_done(m, l, "dt_model_loss_mse");
}

dt_result dt_model_backward(dt_model *m, const float *dy) {
    dt_result r;
    dt__node *out;
    int i;
    if ((r = dt__need_final(m, "dt_model_backward")) != DT_OK) return r;
    if (!m->batch) return dt_set_error(DT_ERR_STATE, "dt_model_backward: no forward pass yet; call dt_model_forward first");
    if (!dy && !m->seed_ready)
        return dt_set_error(DT_ERR_STATE, "dt_model_backward: no loss gradient; call a dt_model_loss_* function after the "
                            "forward pass, or pass the upstream gradient dy");
    out = &m->nodes[m->nnodes - 1];
    if (!out->grad) return dt_set_error(DT_ERR_STATE, "dt_model_backward: the output is the input itself; add a layer");
    dt_trace_begin("backward", "compute");
    dt__trace_arg("batch", NULL, m->batch);
    for (i = 0; i < m->nnodes; i++)   /* the gradients whose first writer adds to them (dt__plan) */
        if (!m->nodes[i].alias && m->nodes[i].grad && m->nodes[i].zero)
            m->ops->fill(m->ctx, m->nodes[i].grad, m->batch * m->nodes[i].size, 0.0f);
    if (dy) m->ops->upload(m->ctx, out->grad, dy, (int64_t)sizeof(float) * m->batch * out->size);
    else m->ops->copy(m->ctx, out->grad, m->seed_grad, m->batch * out->size);
    for (i = m->nnodes - 1; i >= 1; i--) {
        dt__node_bwd(m, &m->nodes[i], m->batch);
        if (m->hook) {   /* the hook reads the gradients: they must be written */
            if ((r = dt__sync(m, "dt_model_backward")) != DT_OK) break;
            m->hook(m->hook_user, m, i);
        }
    }
    if (r == DT_OK) r = dt__sync(m, "dt_model_backward");
    dt_trace_end();
    return r;
}

void dt_model_set_backward_hook(dt_model *m, dt_backward_hook fn, void *user) {
    if (!m) return;
    m->hook = fn;
    m->hook_user = fn ? user : NULL;
}

void dt_model_zero_grad(dt_model *m) {
    if (!m || !m->finalized) return;
    m->ops->fill(m->ctx, m->grads, m->nparams, 0.0f);
    (void)dt__sync(m, "dt_model_zero_grad");   /* a failure stays with the backend: the next call returns it */
}

dt_result dt_model_output(dt_model *m, float *host, int64_t count) {
    dt_result r;
    int64_t want;
    if ((r = dt__need_final(m, "dt_model_output")) != DT_OK) return r;
    if (!m->batch) return dt_set_error(DT_ERR_STATE, "dt_model_output: no forward pass yet");
    if (!host) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_output: host buffer is NULL");
    want = m->batch * m->nodes[m->nnodes - 1].size;
    if (count != want)
        return dt_set_error(DT_ERR_SHAPE, "dt_model_output: count is %lld but the output has %lld elements (batch %lld x %lld)",
                            (long long)count, (long long)want, (long long)m->batch, (long long)m->nodes[m->nnodes - 1].size);
    m->ops->download(m->ctx, host, m->nodes[m->nnodes - 1].out, (int64_t)sizeof(float) * want);
    return dt__sync(m, "dt_model_output");
}

dt_result dt_model_count_correct(dt_model *m, const int32_t *labels, int64_t *correct) {
    dt_result r = dt__loss_prep(m, labels, NULL, "dt_model_count_correct");
    if (r != DT_OK) return r;
    if (!correct) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_count_correct: correct is NULL");
    m->ops->count_correct(m->ctx, m->nodes[m->nnodes - 1].out, m->labels, m->batch, m->nodes[m->nnodes - 1].c, correct);
    return dt__sync(m, "dt_model_count_correct");
}

/* ---- flat buffers and listing --------------------------------------------------------------------- */

float *dt_model_params(dt_model *m, int64_t *count) {
    if (count) *count = m ? m->nparams : 0;
    return m ? m->params : NULL;
}
float *dt_model_grads(dt_model *m, int64_t *count) {
    if (count) *count = m ? m->nparams : 0;
    return m ? m->grads : NULL;
}
float *dt_model_buffers(dt_model *m, int64_t *count) {
    if (count) *count = m ? m->nbuffers : 0;
    return m ? m->buffers : NULL;
}
int64_t dt_model_param_count(const dt_model *m) { return m ? m->nparams : 0; }

static dt_result dt__xfer(dt_model *m, float *dev, float *host_dst, const float *host_src, int64_t have, int64_t count,
                          const char *what) {
    dt_result r;
    if ((r = dt__need_final(m, what)) != DT_OK) return r;
    if (!host_dst && !host_src) return dt_set_error(DT_ERR_INVALID_ARG, "%s: host buffer is NULL", what);
    if (count != have)
        return dt_set_error(DT_ERR_SHAPE, "%s: count is %lld but the model has %lld; the buffer belongs to another model",
                            what, (long long)count, (long long)have);
    if (host_src) m->ops->upload(m->ctx, dev, host_src, (int64_t)sizeof(float) * count);
    else m->ops->download(m->ctx, host_dst, dev, (int64_t)sizeof(float) * count);
    return dt__sync(m, what);
}
dt_result dt_model_set_params(dt_model *m, const float *host, int64_t count) {
    return dt__xfer(m, m ? m->params : NULL, NULL, host, m ? m->nparams : 0, count, "dt_model_set_params");
}
dt_result dt_model_get_params(dt_model *m, float *host, int64_t count) {
    return dt__xfer(m, m ? m->params : NULL, host, NULL, m ? m->nparams : 0, count, "dt_model_get_params");
}
dt_result dt_model_get_grads(dt_model *m, float *host, int64_t count) {
    return dt__xfer(m, m ? m->grads : NULL, host, NULL, m ? m->nparams : 0, count, "dt_model_get_grads");
}
dt_result dt_model_set_buffers(dt_model *m, const float *host, int64_t count) {
    return dt__xfer(m, m ? m->buffers : NULL, NULL, host, m ? m->nbuffers : 0, count, "dt_model_set_buffers");
}
dt_result dt_model_get_buffers(dt_model *m, float *host, int64_t count) {
    return dt__xfer(m, m ? m->buffers : NULL, host, NULL, m ? m->nbuffers : 0, count, "dt_model_get_buffers");
}

int dt_model_param_tensors(const dt_model *m) { return m ? m->npinfo : 0; }
int dt_model_buffer_tensors(const dt_model *m) { return m ? m->nbinfo : 0; }
static dt_param_info dt__info(const dt__pinfo *p) {
    dt_param_info r;
    int i;
    memset(&r, 0, sizeof r);
    if (!p) return r;
    r.name = p->name; r.node = p->node; r.offset = p->offset; r.count = p->count; r.ndim = p->ndim;
    for (i = 0; i < DT_MAX_DIMS; i++) r.shape[i] = p->shape[i];
    return r;
}
dt_param_info dt_model_param_info(const dt_model *m, int i) {
    return dt__info(m && i >= 0 && i < m->npinfo ? &m->pinfo[i] : NULL);
}
dt_param_info dt_model_buffer_info(const dt_model *m, int i) {
    return dt__info(m && i >= 0 && i < m->nbinfo ? &m->binfo[i] : NULL);
}

int dt_model_nodes(const dt_model *m) { return m ? m->nnodes : 0; }
int dt_model_output_node(const dt_model *m) { return m ? m->nnodes - 1 : -1; }
static const dt__node *dt__node_at(const dt_model *m, int node) {
    return (m && node >= 0 && node < m->nnodes) ? &m->nodes[node] : NULL;
}
dt_layer_kind dt_model_node_kind(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n ? n->kind : DT_LAYER_KIND_COUNT;
}
const char *dt_model_node_name(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n ? n->name : NULL;
}
int64_t dt_model_node_size(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n ? n->size : 0;
}
int dt_model_node_shape(const dt_model *m, int node, int64_t shape[3]) {
    const dt__node *n = dt__node_at(m, node);
    if (!n) return 0;
    shape[0] = n->c; shape[1] = n->h; shape[2] = n->w;
    return n->ndim;
}
const float *dt_model_node_output(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n && m->batch ? n->out : NULL;
}
const float *dt_model_node_grad(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n && m->batch ? n->grad : NULL;
}

void dt_model_summary(const dt_model *m) {
    int i, j;
    if (!m) return;
    dt_log(DT_LOG_INFO, "%-4s %-24s %-15s %-18s %12s", "node", "name", "layer", "output", "params");
    for (i = 0; i < m->nnodes; i++) {
        const dt__node *n = &m->nodes[i];
        char shape[64];
        int64_t np = 0;
        for (j = 0; j < n->nparams; j++) np += m->pinfo[n->param0 + j].count;
        if (n->ndim == 3) snprintf(shape, sizeof shape, "[%lld, %lld, %lld]", (long long)n->c, (long long)n->h, (long long)n->w);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)n->c);
        dt_log(DT_LOG_INFO, "%-4d %-24.24s %-15s %-18s %12lld", i, n->name, dt_layer_kind_str(n->kind), shape, (long long)np);
    }
    dt_log(DT_LOG_INFO, "parameters: %lld trainable, %lld buffer elements", (long long)m->nparams, (long long)m->nbuffers);
}

/* ---- model zoo ------------------------------------------------------------------------------------- */

static const char *dt__zoo_names[DT_ZOO_COUNT] = {"mlp", "simplecnn", "lenet5", "fedavg_cnn", "fedavg_2nn", "vgg11", "resnet20"};
const char *dt_zoo_name(dt_zoo_model z) { return (z >= 0 && z < DT_ZOO_COUNT) ? dt__zoo_names[z] : "unknown"; }
int dt_zoo_from_name(const char *name) {
    int i;
    if (!name) return -1;
    for (i = 0; i < DT_ZOO_COUNT; i++)
        if (strcmp(name, dt__zoo_names[i]) == 0) return i;
    return -1;
}

/* conv (optionally without bias) + name */
static int dt__zconv(dt_model *m, int x, int64_t oc, int64_t k, int64_t s, int64_t p, int no_bias, const char *name) {
    dt_conv2d_desc d;
    memset(&d, 0, sizeof d);
    d.out_channels = oc; d.kernel = k; d.stride = s; d.pad = p; d.no_bias = no_bias;
    return dt_model_name(m, dt_conv2d_ex(m, x, &d), name);
}
static int dt__zfc(dt_model *m, int x, int64_t out, const char *name) { return dt_model_name(m, dt_linear(m, x, out, 1), name); }

static void dt__zoo_build(dt_model *m, dt_zoo_model z, int64_t nc) {
    int x = dt_model_input(m), i;
    char nm[64];
    switch (z) {
    case DT_ZOO_MLP: case DT_ZOO_FEDAVG_2NN: {   /* two hidden layers with ReLU */
        int64_t h1 = z == DT_ZOO_MLP ? 512 : 200, h2 = z == DT_ZOO_MLP ? 256 : 200;
        x = dt_relu(m, dt__zfc(m, dt_flatten(m, x), h1, "fc1"));
        dt__zfc(m, dt_relu(m, dt__zfc(m, x, h2, "fc2")), nc, "fc3");
    } break;
    case DT_ZOO_SIMPLE_CNN:
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 32, 3, 1, 1, 0, "conv1")), 2, 2, 0);
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 64, 3, 1, 1, 0, "conv2")), 2, 2, 0);
        x = dt_flatten(m, dt_model_name(m, dt_dropout(m, x, 0.25f), "dropout1"));
        x = dt_model_name(m, dt_dropout(m, dt_relu(m, dt__zfc(m, x, 128, "fc1")), 0.5f), "dropout2");
        dt_log_softmax(m, dt__zfc(m, x, nc, "fc2"));
        break;
    case DT_ZOO_LENET5:
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 6, 5, 1, 2, 0, "conv1")), 2, 2, 0);
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 16, 5, 1, 0, 0, "conv2")), 2, 2, 0);
        x = dt_flatten(m, x);
        x = dt_relu(m, dt__zfc(m, x, 120, "fc1"));
        x = dt_relu(m, dt__zfc(m, x, 84, "fc2"));
        dt__zfc(m, x, nc, "fc3");
        break;
    case DT_ZOO_FEDAVG_CNN:
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 32, 5, 1, 2, 0, "conv1")), 2, 2, 0);
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 64, 5, 1, 2, 0, "conv2")), 2, 2, 0);
        x = dt_flatten(m, x);
        x = dt_relu(m, dt__zfc(m, x, 512, "fc1"));
        dt__zfc(m, x, nc, "fc2");
        break;
    case DT_ZOO_VGG11: {
        static const int cfg[] = {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0};
        int idx = 0;   /* index in PyTorch's nn.Sequential, so names match "features.N.weight" */
        for (i = 0; i < (int)(sizeof cfg / sizeof cfg[0]); i++) {
            if (cfg[i] == 0) { x = dt_maxpool2d(m, x, 2, 2, 0); idx++; continue; }
            snprintf(nm, sizeof nm, "features.%d", idx);
            x = dt__zconv(m, x, cfg[i], 3, 1, 1, 0, nm);
            snprintf(nm, sizeof nm, "features.%d", idx + 1);
            x = dt_relu(m, dt_model_name(m, dt_batchnorm(m, x), nm));
            idx += 3;
        }
        dt__zfc(m, dt_flatten(m, x), nc, "classifier");
    } break;
    case DT_ZOO_RESNET20: {
        int64_t cin = 16;
        int stage, blk, b = 0;
        x = dt_relu(m, dt_model_name(m, dt_batchnorm(m, dt__zconv(m, x, 16, 3, 1, 1, 1, "conv1")), "bn1"));
        for (stage = 0; stage < 3; stage++) {
            int64_t cout = 16 << stage;
            for (blk = 0; blk < 3; blk++, b++) {
                int64_t s = (stage > 0 && blk == 0) ? 2 : 1;
                int y, sc = x;
                snprintf(nm, sizeof nm, "layers.%d.conv1", b);
                y = dt__zconv(m, x, cout, 3, s, 1, 1, nm);
                snprintf(nm, sizeof nm, "layers.%d.bn1", b);
                y = dt_relu(m, dt_model_name(m, dt_batchnorm(m, y), nm));
                snprintf(nm, sizeof nm, "layers.%d.conv2", b);
                y = dt__zconv(m, y, cout, 3, 1, 1, 1, nm);
                snprintf(nm, sizeof nm, "layers.%d.bn2", b);
                y = dt_model_name(m, dt_batchnorm(m, y), nm);
                if (s != 1 || cin != cout) sc = dt_pad_shortcut(m, x, cout, s);
                x = dt_relu(m, dt_add(m, y, sc));
                cin = cout;
            }
        }
        dt__zfc(m, dt_global_avgpool(m, x), nc, "fc");
    } break;
    default: break;
    }
}

dt_result dt_zoo_create(dt_model **out, dt_zoo_model z, int64_t num_classes, const dt_model_desc *desc) {
    dt_model_desc d;
    dt_result r;
    int cifar = z == DT_ZOO_VGG11 || z == DT_ZOO_RESNET20;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_zoo_create: out is NULL");
    *out = NULL;
    if (z < 0 || z >= DT_ZOO_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_zoo_create: unknown model %d; use a dt_zoo_model value", (int)z);
    if (num_classes < 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_zoo_create: num_classes is %lld", (long long)num_classes);
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.in_c == 0) { d.in_c = cifar ? 3 : 1; d.in_h = d.in_w = cifar ? 32 : 28; }
    if ((r = dt_model_create(out, &d)) != DT_OK) return r;
    dt__zoo_build(*out, z, num_classes ? num_classes : 10);
    if ((r = dt_model_finalize(*out)) != DT_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_model_destroy(*out);
        *out = NULL;
        return dt_set_error(r, "dt_zoo_create(%s): %s", dt_zoo_name(z), msg);
    }
    return DT_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* 4. optim                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

struct dt_optim {
    dt_model *m;
    dt_optim_desc d;
    float *state;                 /* [nstate * nparams]: SGD momentum, or Adam m then v */
    int64_t nstate;
    int ntensors;
    int64_t *steps;               /* per parameter tensor */
    unsigned char *frozen;        /* per parameter tensor */
};

dt_result dt_optim_create(dt_optim **out, dt_model *m, const dt_optim_desc *desc) {
    dt_optim *o;
    dt_optim_desc d;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: out is NULL");
    *out = NULL;
    if (!m || !m->finalized) return dt_set_error(DT_ERR_STATE, "dt_optim_create: the model is NULL or not finalized");
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.kind < DT_OPTIM_SGD || d.kind > DT_OPTIM_ADAMW)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: unknown optimizer kind %d", (int)d.kind);
    if (d.lr == 0.0f) d.lr = d.kind == DT_OPTIM_SGD ? 0.01f : 0.001f;
    if (d.kind != DT_OPTIM_SGD) {
        if (d.beta1 == 0.0f) d.beta1 = 0.9f;
        if (d.beta2 == 0.0f) d.beta2 = 0.999f;
        if (d.eps == 0.0f) d.eps = 1e-8f;
        if (d.kind == DT_OPTIM_ADAMW && d.weight_decay == 0.0f) d.weight_decay = 0.01f;
    }
    if (!(d.lr > 0.0f) || d.momentum < 0.0f || d.weight_decay < 0.0f || d.dampening < 0.0f ||
        !(d.beta1 >= 0.0f && d.beta1 < 1.0f) || !(d.beta2 >= 0.0f && d.beta2 < 1.0f) || d.eps < 0.0f)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: invalid setting (lr %g, momentum %g, dampening %g, weight "
                            "decay %g, betas %g %g, eps %g): lr must be > 0, the others >= 0 and betas < 1",
                            (double)d.lr, (double)d.momentum, (double)d.dampening, (double)d.weight_decay,
                            (double)d.beta1, (double)d.beta2, (double)d.eps);
    if (d.nesterov && (d.momentum <= 0.0f || d.dampening != 0.0f))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_create: Nesterov momentum needs momentum > 0 and dampening 0 "
                            "(as torch.optim.SGD)");
    o = (dt_optim *)DT_MALLOC(sizeof *o);
    if (!o) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_optim_create: no memory");
    memset(o, 0, sizeof *o);
    o->m = m;
    o->d = d;
    o->ntensors = m->npinfo;
    o->nstate = d.kind == DT_OPTIM_SGD ? (d.momentum != 0.0f ? 1 : 0) : 2;
    o->steps = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(o->ntensors + 1));
    o->frozen = (unsigned char *)DT_MALLOC((size_t)o->ntensors + 1);
    if (o->nstate) o->state = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * o->nstate * m->nparams);
    if (!o->steps || !o->frozen || (o->nstate && !o->state)) {
        long long want = (long long)(o->nstate * m->nparams);
        dt_optim_destroy(o);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_optim_create: no memory for the optimizer state (%lld floats)", want);
    }
    memset(o->steps, 0, sizeof(int64_t) * (size_t)o->ntensors);
    memset(o->frozen, 0, (size_t)o->ntensors);
    if (o->nstate) m->ops->fill(m->ctx, o->state, o->nstate * m->nparams, 0.0f);
    {
        dt_result r = dt__sync(m, "dt_optim_create");
        if (r != DT_OK) { dt_optim_destroy(o); return r; }
    }
    *out = o;
    return DT_OK;
}

void dt_optim_destroy(dt_optim *o) {
    if (!o) return;
    if (o->state) o->m->ops->free(o->m->ctx, o->state);
    DT_FREE(o->steps);
    DT_FREE(o->frozen);
    DT_FREE(o);
}

void  dt_optim_set_lr(dt_optim *o, float lr) { if (o && lr >= 0.0f) o->d.lr = lr; }
float dt_optim_lr(const dt_optim *o) { return o ? o->d.lr : 0.0f; }

int dt_optim_freeze(dt_optim *o, const char *prefix, int frozen) {
    int i, n = 0;
    size_t len = prefix ? strlen(prefix) : 0;
    if (!o) return -1;
    for (i = 0; i < o->ntensors; i++)
        if (!len || strncmp(o->m->pinfo[i].name, prefix, len) == 0) { o->frozen[i] = (unsigned char)(frozen != 0); n++; }
    return n;
}

/* Calls fn over maximal stretches [first, last) of trainable tensors that share a step count, so the
   common case (nothing frozen) is one loop over the whole flat buffer. */
typedef void (*dt__stretch_fn)(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg);
static void dt__optim_stretches(dt_optim *o, dt__stretch_fn fn, void *arg) {
    int i = 0;
    while (i < o->ntensors) {
        int j = i;
        if (o->frozen[i]) { i++; continue; }
        while (j + 1 < o->ntensors && !o->frozen[j + 1] && o->steps[j + 1] == o->steps[i]) j++;
        fn(o, o->m->pinfo[i].offset, o->m->pinfo[j].offset + o->m->pinfo[j].count - o->m->pinfo[i].offset, o->steps[i], arg);
        i = j + 1;
    }
}

static void dt__optim_apply(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg) {
    dt_model *m = o->m;
    const dt_optim_desc *d = &o->d;
    (void)arg;
    if (d->kind == DT_OPTIM_SGD) {
        m->ops->sgd_step(m->ctx, m->params + off, m->grads + off, o->state ? o->state + off : NULL, n, d->lr, d->momentum,
                         d->dampening, d->weight_decay, d->nesterov, step == 0);
    } else {
        /* bias corrections in double, as Python computes them, then used in float like PyTorch's kernels */
        double t = (double)(step + 1);
        double bc1 = 1.0 - pow((double)d->beta1, t), bc2 = 1.0 - pow((double)d->beta2, t);
        m->ops->adam_step(m->ctx, m->params + off, m->grads + off, o->state + off, o->state + m->nparams + off, n, d->lr,
                          d->beta1, d->beta2, d->eps, d->weight_decay, d->kind == DT_OPTIM_ADAMW,
                          (float)((double)d->lr / bc1), (float)sqrt(bc2));
    }
}

dt_result dt_optim_step(dt_optim *o) {
    int i;
    if (!o) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_step: optimizer is NULL");
    dt_trace_begin("optimizer step", "optim");
    dt__optim_stretches(o, dt__optim_apply, NULL);
    for (i = 0; i < o->ntensors; i++) o->steps[i] += !o->frozen[i];
    {
        dt_result r = dt__sync(o->m, "dt_optim_step");
        dt_trace_end();
        return r;
    }
}

static void dt__optim_sumsq(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg) {
    double part = 0.0;
    (void)step;
    o->m->ops->sum_squares(o->m->ctx, o->m->grads + off, n, &part);
    *(double *)arg += part;
}
static void dt__optim_scale(dt_optim *o, int64_t off, int64_t n, int64_t step, void *arg) {
    (void)step;
    o->m->ops->scale(o->m->ctx, o->m->grads + off, n, *(float *)arg);
}

dt_result dt_optim_clip_grad_norm(dt_optim *o, float max_norm, float *total_norm) {
    double sq = 0.0;
    float norm, coef;
    dt_result r;
    if (!o) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_clip_grad_norm: optimizer is NULL");
    if (!(max_norm > 0.0f)) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_clip_grad_norm: max_norm %g must be > 0", (double)max_norm);
    dt__optim_stretches(o, dt__optim_sumsq, &sq);
    if ((r = dt__sync(o->m, "dt_optim_clip_grad_norm")) != DT_OK) return r;
    norm = (float)sqrt(sq);
    if (total_norm) *total_norm = norm;
    if (!(norm == norm) || norm == INFINITY)
        return dt_set_error(DT_ERR_NUMERIC, "dt_optim_clip_grad_norm: the gradient norm is %g; the loss diverged or the "
                            "data holds NaN/inf", (double)norm);
    coef = max_norm / (norm + 1e-6f);
    if (coef < 1.0f) dt__optim_stretches(o, dt__optim_scale, &coef);
    return dt__sync(o->m, "dt_optim_clip_grad_norm");
}

float *dt_optim_state(dt_optim *o, int64_t *count) {
    if (count) *count = o ? o->nstate * o->m->nparams : 0;
    return o ? o->state : NULL;
}
int dt_optim_tensors(const dt_optim *o) { return o ? o->ntensors : 0; }
int64_t dt_optim_tensor_steps(const dt_optim *o, int i) { return (o && i >= 0 && i < o->ntensors) ? o->steps[i] : 0; }
dt_result dt_optim_set_tensor_steps(dt_optim *o, const int64_t *steps, int count) {
    if (!o || !steps) return dt_set_error(DT_ERR_INVALID_ARG, "dt_optim_set_tensor_steps: NULL argument");
    if (count != o->ntensors)
        return dt_set_error(DT_ERR_SHAPE, "dt_optim_set_tensor_steps: %d step counts for %d parameter tensors", count, o->ntensors);
    memcpy(o->steps, steps, sizeof(int64_t) * (size_t)count);
    return DT_OK;
}

static float dt__sched_main(const dt_sched_desc *s, int64_t t) {
    int i;
    double lr = s->base_lr;
    if (s->kind == DT_SCHED_MULTISTEP) {
        double gamma = s->gamma != 0.0f ? s->gamma : 0.1;
        for (i = 0; i < DT_SCHED_MAX_MILESTONES && s->milestones[i] > 0; i++)
            if (t >= s->milestones[i]) lr *= gamma;
    } else if (s->kind == DT_SCHED_COSINE && s->t_max > 0) {
        /* CosineAnnealingLR's closed form; past t_max it continues the cosine, as PyTorch does */
        lr = s->min_lr + (s->base_lr - s->min_lr) * (1.0 + cos(3.14159265358979323846 * (double)t / (double)s->t_max)) / 2.0;
    }
    return (float)lr;
}

float dt_sched_lr(const dt_sched_desc *s, int64_t t) {
    if (!s) return 0.0f;
    if (t < 0) t = 0;
    if (s->warmup > 0 && t < s->warmup) {
        double f0 = s->warmup_start != 0.0f ? s->warmup_start : 1.0 / 3.0;
        return (float)(s->base_lr * (f0 + (1.0 - f0) * (double)t / (double)s->warmup));
    }
    return dt__sched_main(s, t - (s->warmup > 0 ? s->warmup : 0));
}

/* ---------------------------------------------------------------------------------------------- */
/* 5. data                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

void dt_dataset_free(dt_dataset *ds) {
    int64_t i;
    if (!ds) return;
    if (ds->class_names)
        for (i = 0; i < ds->num_classes; i++) DT_FREE(ds->class_names[i]);
    DT_FREE(ds->class_names);
    DT_FREE(ds->pixels);
    DT_FREE(ds->labels);
    memset(ds, 0, sizeof *ds);
}

dt_result dt_dataset_batch(const dt_dataset *ds, const int64_t *idx, int64_t n, const dt_transform *t, uint64_t seed,
                           uint64_t epoch, float *x, int32_t *y) {
    int64_t i, plane, chans;
    float scale[3], shift[3];
    if (!ds || !idx || !x || !y) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: NULL argument");
    if (n <= 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: n is %lld; it must be > 0", (long long)n);
    if (!ds->pixels || !ds->labels || ds->count <= 0)
        return dt_set_error(DT_ERR_STATE, "dt_dataset_batch: the dataset is empty; load it first");
    if (t && t->crop_pad < 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: crop_pad is negative");
    plane = ds->h * ds->w;
    chans = ds->c;
    for (i = 0; i < 3; i++) {   /* x = p * scale + shift, with scale = 1 / (255 std), shift = -mean / std */
        float sd = (t && t->std[i] != 0.0f) ? t->std[i] : 1.0f, mu = t ? t->mean[i] : 0.0f;
        scale[i] = 1.0f / (255.0f * sd);
        shift[i] = -mu / sd;
    }
    for (i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= ds->count)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_batch: sample index %lld is outside the dataset %s of %lld samples",
                                (long long)idx[i], ds->source[0] ? ds->source : "(in memory)", (long long)ds->count);
    DT__OMP(parallel for if (n * chans * plane > DT__PAR_MIN))
    for (i = 0; i < n; i++) {
        const uint8_t *src = ds->pixels + idx[i] * chans * plane;
        float *dst = x + i * chans * plane;
        int64_t dy = 0, dx = 0, c, r, q;
        int flip = 0;
        if (t && (t->crop_pad > 0 || t->flip)) {
            /* one hash stream per (seed, epoch, sample): the same choices wherever it is converted */
            uint64_t key = dt__mix64(seed ^ dt__mix64(epoch + 0x632be59bd9b4e019ULL)) ^ (uint64_t)idx[i];
            if (t->crop_pad > 0) {
                int64_t span = 2 * t->crop_pad + 1;
                dy = (int64_t)(dt_hash_uniform(key, 0) * (float)span) - t->crop_pad;
                dx = (int64_t)(dt_hash_uniform(key, 1) * (float)span) - t->crop_pad;
                if (dy > t->crop_pad) dy = t->crop_pad;
                if (dx > t->crop_pad) dx = t->crop_pad;
            }
            flip = t->flip && dt_hash_uniform(key, 2) < 0.5f;
        }
        y[i] = ds->labels[idx[i]];
        for (c = 0; c < chans; c++) {
            float sc = scale[c < 3 ? c : 2], sh = shift[c < 3 ? c : 2];
            for (r = 0; r < ds->h; r++)
                for (q = 0; q < ds->w; q++) {
                    /* output (r, q) reads input (r + dy, q' + dx) where q' is q mirrored when flipped;
                       outside the image is the zero padding, which normalises like a zero pixel */
                    int64_t sr = r + dy, sq = (flip ? ds->w - 1 - q : q) + dx;
                    float p = (sr >= 0 && sr < ds->h && sq >= 0 && sq < ds->w) ? (float)src[c * plane + sr * ds->w + sq] : 0.0f;
                    dst[c * plane + r * ds->w + q] = p * sc + sh;
                }
        }
    }
    return DT_OK;
}

/* (dataset loaders: implementation) */

#ifndef DT_MNIST_DEFAULT_DIR
#define DT_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif
#ifndef DT_IMAGE_MAX_PIXELS
#define DT_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
#endif

/* "a" + "b" + "c" in a new DT_MALLOC'd string, or NULL when out of memory. */
static char *dt__str3(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = (char *)DT_MALLOC(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}
/* dir/name; no second '/' when dir already ends with one. */
static char *dt__path(const char *dir, const char *name) {
    size_t n = strlen(dir);
    return dt__str3(dir, (n > 0 && dir[n - 1] == '/') ? "" : "/", name);
}
static uint32_t dt__be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static int dt__file_exists(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (fp) fclose(fp);
    return fp != NULL;
}
/* Size of an open regular file (the position is restored to the start), or -1. The first read fails on
   a directory, whose "size" could be anything. */
static int64_t dt__file_size(FILE *fp) {
    long n;
    if ((fgetc(fp) == EOF && ferror(fp)) || fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0 ||
        fseek(fp, 0, SEEK_SET) != 0)
        return -1;
    return (int64_t)n;
}

/* An input file read as a byte stream, gzip-compressed or not; gzip is recognised by its magic bytes
   1f 8b, not by the name. Sizes and positions of a gzip file are those of the decompressed data. */
typedef struct dt__in {
    FILE *fp;
    void *gz;           /* gzFile when DT_USE_ZLIB */
    const char *path;
} dt__in;

static void dt__in_close(dt__in *in) {
    if (in->fp) fclose(in->fp);
#ifdef DT_USE_ZLIB
    if (in->gz) gzclose((gzFile)in->gz);
#endif
    in->fp = NULL;
    in->gz = NULL;
}

static dt_result dt__in_open(dt__in *in, const char *path) {
    uint8_t m[2];
    size_t n;
    memset(in, 0, sizeof *in);
    in->path = path;
    if (!(in->fp = fopen(path, "rb"))) return dt_set_error(DT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    n = fread(m, 1, 2, in->fp);
    if (ferror(in->fp)) { dt__in_close(in); return dt_set_error(DT_ERR_IO, "cannot read %s: %s", path, strerror(errno)); }
    if (n == 2 && m[0] == 0x1f && m[1] == 0x8b) {
        dt__in_close(in);
#ifdef DT_USE_ZLIB
        if (!(in->gz = (void *)gzopen(path, "rb")))
            return dt_set_error(DT_ERR_IO, "zlib cannot open %s: %s", path, errno ? strerror(errno) : "out of memory");
        gzbuffer((gzFile)in->gz, 1u << 17);
        return DT_OK;
#else
        return dt_set_error(DT_ERR_UNSUPPORTED, "%s is gzip-compressed; build with -DDT_USE_ZLIB and link -lz, or "
                            "decompress it with gunzip", path);
#endif
    }
    if (fseek(in->fp, 0, SEEK_SET) != 0) {
        dt__in_close(in);
        return dt_set_error(DT_ERR_IO, "cannot seek in %s (is it a regular file?)", path);
    }
    return DT_OK;
}

/* Reads up to n bytes; *got < n only at the end of the data. Read errors and corrupt gzip data fail. */
static dt_result dt__in_read(dt__in *in, void *buf, int64_t n, int64_t *got) {
    *got = 0;
    while (*got < n) {
        int64_t want = n - *got < ((int64_t)1 << 30) ? n - *got : ((int64_t)1 << 30), r;
        char *dst = (char *)buf + *got;
        if (in->fp) {
            r = (int64_t)fread(dst, 1, (size_t)want, in->fp);
            if (r < want && ferror(in->fp))
                return dt_set_error(DT_ERR_IO, "cannot read %s: %s", in->path, strerror(errno));
        } else {
#ifdef DT_USE_ZLIB
            int zerr = Z_OK;
            const char *zmsg;
            r = gzread((gzFile)in->gz, dst, (unsigned)want);
            zmsg = gzerror((gzFile)in->gz, &zerr);
            if (zerr == Z_ERRNO) return dt_set_error(DT_ERR_IO, "cannot read %s: %s", in->path, strerror(errno));
            if (r < 0 || (r < want && zerr != Z_OK)) {
                size_t np = strlen(in->path);   /* zlib's message repeats the path: "path: what" */
                if (zmsg && strncmp(zmsg, in->path, np) == 0 && zmsg[np] == ':' && zmsg[np + 1] == ' ') zmsg += np + 2;
                return dt_set_error(DT_ERR_FORMAT, "%s: the gzip data is truncated or corrupt (zlib: %s); download the "
                                    "file again", in->path, zmsg ? zmsg : "unknown error");
            }
#else
            r = 0;
#endif
        }
        *got += r;
        if (r < want) break;
    }
    return DT_OK;
}

/* Reads the rest of a file, which must be exactly `want` bytes after a header of `head` bytes, into a new
   buffer (*out, DT_FREE it). The buffer grows with the data actually read, so a header that claims more
   than the file holds costs nothing. `what` describes the header's claim for the message. */
static dt_result dt__in_read_payload(dt__in *in, int64_t head, int64_t want, const char *what, uint8_t **out) {
    int64_t cap = want + 1 < ((int64_t)1 << 16) ? want + 1 : ((int64_t)1 << 16), have = 0, got;
    uint8_t *buf = (uint8_t *)DT_MALLOC((size_t)cap), *nb;
    dt_result r;
    *out = NULL;
    if (!buf) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", in->path);
    for (;;) {   /* read up to want + 1 bytes: one more than expected tells a too-long file */
        if ((r = dt__in_read(in, buf + have, cap - have, &got)) != DT_OK) { DT_FREE(buf); return r; }
        have += got;
        if (have < cap || cap == want + 1) break;
        cap = cap > (want + 1) / 2 ? want + 1 : 2 * cap;
        if (!(nb = (uint8_t *)DT_REALLOC(buf, (size_t)cap))) {
            DT_FREE(buf);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s (%lld bytes)", in->path, (long long)want);
        }
        buf = nb;
    }
    if (have > want) {   /* count the rest for the message */
        do {
            if ((r = dt__in_read(in, buf, cap, &got)) != DT_OK) { DT_FREE(buf); return r; }
            have += got;
        } while (got == cap);
    }
    if (have != want) {
        DT_FREE(buf);
        return dt_set_error(DT_ERR_FORMAT, "%s is %s: its header (%s) needs %lld bytes but the file has %lld%s; %s",
                            in->path, have < want ? "truncated" : "longer than its header says", what,
                            (long long)(head + want), (long long)(head + have), in->gz ? " (decompressed)" : "",
                            have < want ? "download it again" : "the header or the file is corrupt");
    }
    *out = buf;
    return DT_OK;
}

/* Reads an IDX header: magic, then ndim big-endian uint32 dims. */
static dt_result dt__idx_header(dt__in *in, uint32_t magic, int ndim, uint32_t *dims) {
    uint8_t h[16];
    int64_t need = 4 + 4 * (int64_t)ndim, got;
    uint32_t m;
    int i;
    dt_result r = dt__in_read(in, h, need, &got);
    if (r != DT_OK) return r;
    if (got < 4)
        return dt_set_error(DT_ERR_FORMAT, "%s is %lld bytes, too short for an IDX file (its header alone is %lld "
                            "bytes)", in->path, (long long)got, (long long)need);
    m = dt__be32(h);
    if (m != magic) {
        if (magic == 0x803 && m == 0x801)
            return dt_set_error(DT_ERR_FORMAT, "%s is an IDX labels file (magic 0x00000801), given as the images file; "
                                "pass the *-images-idx3-ubyte file first and the labels second", in->path);
        if (magic == 0x801 && m == 0x803)
            return dt_set_error(DT_ERR_FORMAT, "%s is an IDX images file (magic 0x00000803), given as the labels file; "
                                "pass the *-images-idx3-ubyte file first and the labels second", in->path);
        return dt_set_error(DT_ERR_FORMAT, "%s: magic number 0x%08lx is not an IDX %s file's 0x%08lx (unsigned bytes, "
                            "%d dimension%s); is it an MNIST file?", in->path, (unsigned long)m,
                            magic == 0x803 ? "images" : "labels", (unsigned long)magic, ndim, ndim > 1 ? "s" : "");
    }
    if (got < need)
        return dt_set_error(DT_ERR_FORMAT, "%s is truncated inside its IDX header: %lld of %lld bytes; download it again",
                            in->path, (long long)got, (long long)need);
    for (i = 0; i < ndim; i++) dims[i] = dt__be32(h + 4 + 4 * i);
    return DT_OK;
}

dt_result dt_dataset_load_idx(dt_dataset *ds, const char *images_path, const char *labels_path) {
    dt__in im, lb;
    uint32_t di[3] = {0, 0, 0}, dl[1] = {0};
    uint8_t *lab = NULL;
    uint64_t n, plane;
    int64_t i;
    char what[96];
    dt_result r;
    memset(&im, 0, sizeof im);
    memset(&lb, 0, sizeof lb);
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_idx: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!images_path || !labels_path)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_idx: %s path is NULL", images_path ? "labels" : "images");
    if ((r = dt__in_open(&im, images_path)) != DT_OK || (r = dt__idx_header(&im, 0x803, 3, di)) != DT_OK ||
        (r = dt__in_open(&lb, labels_path)) != DT_OK || (r = dt__idx_header(&lb, 0x801, 1, dl)) != DT_OK)
        goto fail;
    n = di[0];
    plane = (uint64_t)di[1] * di[2];
    if (n == 0 || plane == 0) {
        r = dt_set_error(DT_ERR_FORMAT, "%s: its header says %lu images of %lux%lu; there is nothing to load",
                         images_path, (unsigned long)di[0], (unsigned long)di[1], (unsigned long)di[2]);
        goto fail;
    }
    if (plane > (uint64_t)(INT64_MAX / 2) / n || plane * n > (uint64_t)(SIZE_MAX / 2)) {
        r = dt_set_error(DT_ERR_FORMAT, "%s: its header says %lu images of %lux%lu, more bytes than this machine can "
                         "address; the header is corrupt", images_path, (unsigned long)di[0], (unsigned long)di[1],
                         (unsigned long)di[2]);
        goto fail;
    }
    if (dl[0] != di[0]) {
        r = dt_set_error(DT_ERR_FORMAT, "%s holds %lu images but %s holds %lu labels; the two files must come from the "
                         "same set (both train-* or both t10k-*)", images_path, (unsigned long)di[0], labels_path,
                         (unsigned long)dl[0]);
        goto fail;
    }
    snprintf(what, sizeof what, "%lu images of %lux%lu", (unsigned long)di[0], (unsigned long)di[1], (unsigned long)di[2]);
    if ((r = dt__in_read_payload(&im, 16, (int64_t)(n * plane), what, &ds->pixels)) != DT_OK) goto fail;
    snprintf(what, sizeof what, "%lu labels", (unsigned long)dl[0]);
    if ((r = dt__in_read_payload(&lb, 8, (int64_t)n, what, &lab)) != DT_OK) goto fail;
    for (i = 0; i < (int64_t)n; i++)
        if (lab[i] > 9) {
            r = dt_set_error(DT_ERR_FORMAT, "%s: label %d at index %lld is outside 0..9; MNIST-style labels are class "
                             "indices below 10", labels_path, (int)lab[i], (long long)i);
            goto fail;
        }
    if (!(ds->labels = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)n))) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for the %llu labels of %s", (unsigned long long)n, labels_path);
        goto fail;
    }
    for (i = 0; i < (int64_t)n; i++) ds->labels[i] = lab[i];
    DT_FREE(lab);
    dt__in_close(&im);
    dt__in_close(&lb);
    ds->count = (int64_t)n;
    ds->c = 1;
    ds->h = di[1];
    ds->w = di[2];
    ds->num_classes = 10;
    snprintf(ds->source, sizeof ds->source, "%s", images_path);
    return DT_OK;
fail:
    DT_FREE(lab);
    dt__in_close(&im);
    dt__in_close(&lb);
    dt_dataset_free(ds);
    return r;
}

dt_result dt_dataset_load_mnist_dir(dt_dataset *ds, const char *dir, int train) {
    const char *kind[2] = {"images-idx3-ubyte", "labels-idx1-ubyte"};
    char *path[2] = {NULL, NULL}, *name = NULL;
    dt_result r = DT_OK;
    int k;
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_mnist_dir: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!dir) dir = DT_MNIST_DEFAULT_DIR;
    for (k = 0; k < 2 && r == DT_OK; k++) {   /* the raw file when there, else the .gz */
        char *gz = NULL;
        if (!(name = dt__str3(train ? "train-" : "t10k-", kind[k], "")) || !(path[k] = dt__path(dir, name)) ||
            (!dt__file_exists(path[k]) && !(gz = dt__str3(path[k], ".gz", "")))) {
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dataset_load_mnist_dir: no memory for a path");
        } else if (gz) {
            if (!dt__file_exists(gz))
                r = dt_set_error(DT_ERR_IO, "cannot open %s or %s: %s; install the Debian package dataset-fashion-mnist, "
                                 "or pass the directory that holds the MNIST files", path[k], gz, strerror(errno));
            DT_FREE(path[k]);
            path[k] = gz;
        }
        DT_FREE(name);
        name = NULL;
    }
    if (r == DT_OK) r = dt_dataset_load_idx(ds, path[0], path[1]);
    DT_FREE(path[0]);
    DT_FREE(path[1]);
    return r;
}

dt_result dt_dataset_load_cifar10(dt_dataset *ds, const char *dir, int train) {
    enum { REC = 3073, MAXF = 5 };
    FILE *fp[MAXF] = {NULL, NULL, NULL, NULL, NULL}, *mf = NULL;
    char *path[MAXF] = {NULL, NULL, NULL, NULL, NULL}, *meta = NULL, *text = NULL;
    int64_t recs[MAXF], total = 0, i, done = 0;
    int nf = train ? 5 : 1, f;
    dt_result r = DT_OK;
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_cifar10: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!dir) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_cifar10: dir is NULL; pass the directory of the "
                                  "binary version (cifar-10-batches-bin)");
    for (f = 0; f < nf; f++) {   /* plan: every file's size, checked, before anything is allocated */
        char name[32];
        int64_t size;
        if (train) snprintf(name, sizeof name, "data_batch_%d.bin", f + 1);
        else snprintf(name, sizeof name, "test_batch.bin");
        if (!(path[f] = dt__path(dir, name))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for a path"); goto done; }
        if (!(fp[f] = fopen(path[f], "rb"))) {
            r = dt_set_error(DT_ERR_IO, "cannot open %s: %s; CIFAR-10 needs the binary version (cifar-10-binary.tar.gz, "
                             "unpacked)", path[f], strerror(errno));
            goto done;
        }
        if ((size = dt__file_size(fp[f])) < 0) {
            r = dt_set_error(DT_ERR_IO, "cannot find the size of %s (is it a regular file?)", path[f]);
            goto done;
        }
        if (size == 0) {
            r = dt_set_error(DT_ERR_FORMAT, "%s is empty; a CIFAR-10 batch holds records of %d bytes", path[f], REC);
            goto done;
        }
        if (size % REC != 0) {
            r = dt_set_error(DT_ERR_FORMAT, "%s is %lld bytes, not a whole number of %d-byte CIFAR-10 records: record %lld "
                             "(counting from 0) is %lld bytes; download the binary version again", path[f],
                             (long long)size, REC, (long long)(size / REC), (long long)(size % REC));
            goto done;
        }
        recs[f] = size / REC;
        total += recs[f];
    }
    ds->pixels = (uint8_t *)DT_MALLOC((size_t)total * (REC - 1));
    ds->labels = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)total);
    if (!ds->pixels || !ds->labels) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for %lld CIFAR-10 images from %s", (long long)total, dir);
        goto done;
    }
    for (f = 0; f < nf; f++)
        for (i = 0; i < recs[f]; i++, done++) {
            uint8_t label;
            if (fread(&label, 1, 1, fp[f]) != 1 || fread(ds->pixels + done * (REC - 1), 1, REC - 1, fp[f]) != REC - 1) {
                r = dt_set_error(DT_ERR_IO, "cannot read record %lld of %s: %s", (long long)i, path[f],
                                 ferror(fp[f]) ? strerror(errno) : "the file shrank while being read");
                goto done;
            }
            if (label > 9) {
                r = dt_set_error(DT_ERR_FORMAT, "%s: record %lld (counting from 0) has label %d; CIFAR-10 labels are 0..9 "
                                 "(is this CIFAR-100, or not the binary version?)", path[f], (long long)i, (int)label);
                goto done;
            }
            ds->labels[done] = label;
        }
    ds->count = total;
    ds->c = 3;
    ds->h = ds->w = 32;
    ds->num_classes = 10;
    snprintf(ds->source, sizeof ds->source, "%s", dir);
    if (!(meta = dt__path(dir, "batches.meta.txt"))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for a path"); goto done; }
    if ((mf = fopen(meta, "rb")) != NULL) {   /* class names: one per non-blank line, trimmed */
        int64_t size = dt__file_size(mf), k = 0;
        char *p, *line;
        if (size < 0 || size > 65536) {
            r = dt_set_error(DT_ERR_FORMAT, "%s: %s; it should hold the 10 class names, one per line", meta,
                             size < 0 ? "cannot find its size" : "too large");
            goto done;
        }
        if (!(text = (char *)DT_MALLOC((size_t)size + 1)) ||
            !(ds->class_names = (char **)DT_MALLOC(10 * sizeof(char *)))) {
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", meta);
            goto done;
        }
        memset(ds->class_names, 0, 10 * sizeof(char *));
        if ((int64_t)fread(text, 1, (size_t)size, mf) != size) {
            r = dt_set_error(DT_ERR_IO, "cannot read %s", meta);
            goto done;
        }
        text[size] = '\0';
        if ((int64_t)strlen(text) != size) {
            r = dt_set_error(DT_ERR_FORMAT, "%s holds NUL bytes; it should be text, the 10 class names one per line", meta);
            goto done;
        }
        for (p = text; *p; ) {
            char *end;
            line = p;
            while (*p && *p != '\n') p++;
            end = p;
            if (*p) p++;
            while (line < end && (*line == ' ' || *line == '\t' || *line == '\r')) line++;
            while (end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) end--;
            if (end == line) continue;
            if (k == 10) { k = 11; break; }
            if (!(ds->class_names[k] = (char *)DT_MALLOC((size_t)(end - line) + 1))) {
                r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", meta);
                goto done;
            }
            memcpy(ds->class_names[k], line, (size_t)(end - line));
            ds->class_names[k++][end - line] = '\0';
        }
        if (k != 10) {
            r = dt_set_error(DT_ERR_FORMAT, "%s holds %s10 class names; CIFAR-10's has 10, one per line (remove the "
                             "file to load without names)", meta, k > 10 ? "more than " : k < 10 ? "fewer than " : "");
            goto done;
        }
    }
done:
    for (f = 0; f < nf; f++) {
        if (fp[f]) fclose(fp[f]);
        DT_FREE(path[f]);
    }
    if (mf) fclose(mf);
    DT_FREE(meta);
    DT_FREE(text);
    if (r != DT_OK) dt_dataset_free(ds);
    return r;
}

#ifdef DT_USE_STB_IMAGE
/* A growable array of DT_MALLOC'd strings. */
typedef struct dt__strs { char **s; int64_t n, cap; } dt__strs;

static void dt__strs_free(dt__strs *l) {
    int64_t i;
    for (i = 0; i < l->n; i++) DT_FREE(l->s[i]);
    DT_FREE(l->s);
    memset(l, 0, sizeof *l);
}
/* Appends str (owned from now on: freed here on failure). Returns 0, or -1 when out of memory. */
static int dt__strs_push(dt__strs *l, char *str) {
    if (!str) return -1;
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        char **s = (char **)DT_REALLOC(l->s, sizeof(char *) * (size_t)cap);
        if (!s) { DT_FREE(str); return -1; }
        l->s = s;
        l->cap = cap;
    }
    l->s[l->n++] = str;
    return 0;
}
static int dt__strs_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* torchvision's IMG_EXTENSIONS, compared without case. */
static int dt__is_image_name(const char *name) {
    static const char *ext[] = {"jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"};
    const char *dot = strrchr(name, '.');
    size_t i, j;
    if (!dot) return 0;
    for (i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        for (j = 0; ext[i][j] && dot[1 + j]; j++) {
            char ch = dot[1 + j];
            if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
            if (ch != ext[i][j]) break;
        }
        if (!ext[i][j] && !dot[1 + j]) return 1;
    }
    return 0;
}

/* The names in dir that do not start with '.' and are directories (dirs != 0) or regular files with an
   image extension, sorted byte-wise (as Python's sorted()). stat() follows symbolic links, as torchvision. */
static dt_result dt__list_dir(const char *dir, int dirs, dt__strs *out) {
    DIR *d;
    dt_result r = DT_OK;
    memset(out, 0, sizeof *out);
    if (!(d = opendir(dir))) return dt_set_error(DT_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    for (;;) {
        struct dirent *e;
        struct stat st;
        char *p;
        int keep;
        errno = 0;
        if (!(e = readdir(d))) {
            if (errno) r = dt_set_error(DT_ERR_IO, "cannot list directory %s: %s", dir, strerror(errno));
            break;
        }
        if (e->d_name[0] == '.' || (!dirs && !dt__is_image_name(e->d_name))) continue;
        if (!(p = dt__path(dir, e->d_name))) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", dir); break; }
        keep = stat(p, &st) == 0 && (dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
        DT_FREE(p);
        if (keep && dt__strs_push(out, dt__str3(e->d_name, "", "")) != 0) {
            r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", dir);
            break;
        }
    }
    closedir(d);
    if (r != DT_OK) dt__strs_free(out);
    else if (out->n > 1) qsort(out->s, (size_t)out->n, sizeof(char *), dt__strs_cmp);
    return r;
}

/* Accepts PNG, JPEG and BMP (for stb_image) and binary PGM/PPM (decoded here). Refuses everything else:
   formats outside torchvision's list (stb_image would also try GIF, PSD, HDR, PIC and TGA, whose loaders
   are the least robust, and TGA has no magic number, so random bytes could "decode") and the listed
   formats stb_image cannot decode, with a message saying so. */
static dt_result dt__image_sniff(const char *path, const uint8_t *b, int64_t n) {
    static const uint8_t png[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    if (n >= 8 && memcmp(b, png, 8) == 0) return DT_OK;
    if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return DT_OK;                  /* JPEG */
    if (n >= 2 && b[0] == 'B' && b[1] == 'M') return DT_OK;                                    /* BMP */
    if (n >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return DT_OK;                   /* PGM, PPM */
    if (n >= 4 && ((b[0] == 'I' && b[1] == 'I' && b[2] == 42 && b[3] == 0) || (b[0] == 'M' && b[1] == 'M' && b[2] == 0 && b[3] == 42)))
        return dt_set_error(DT_ERR_FORMAT, "%s is a TIFF image, which stb_image cannot decode; convert it to PNG", path);
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0)
        return dt_set_error(DT_ERR_FORMAT, "%s is a WebP image, which stb_image cannot decode; convert it to PNG", path);
    if (n >= 2 && b[0] == 'P' && (b[1] == '2' || b[1] == '3'))
        return dt_set_error(DT_ERR_FORMAT, "%s is a text (P2/P3) PGM/PPM image; only the binary kinds (P5/P6) are read, "
                            "convert it", path);
    return dt_set_error(DT_ERR_FORMAT, "%s cannot be decoded: it is not a PNG, JPEG, BMP or binary PGM/PPM image (it "
                        "starts %02x %02x %02x %02x)", path, n > 0 ? b[0] : 0, n > 1 ? b[1] : 0, n > 2 ? b[2] : 0,
                        n > 3 ? b[3] : 0);
}

/* Binary PGM/PPM (P5/P6) are decoded here rather than by stb_image 2.27, which reads 16-bit samples in
   the wrong byte order, reads past its buffer when converting them (CVE-2021-42716, found again by
   fuzz/fuzz_image.c), returns uninitialised memory for a truncated file and can overflow an int while
   parsing the header. Samples are scaled so that maxval is 255, as the Netpbm format defines. Gives
   *out [h, w, comp] (DT_FREE it), comp 1 (PGM) or 3 (PPM). */
static dt_result dt__pnm_decode(const char *path, const uint8_t *b, int64_t n, uint8_t **out, int *ow, int *oh,
                                int *ocomp) {
    int64_t pos = 2, v[3] = {0, 0, 0}, need, i, np, maxv;
    int k, comp = b[1] == '6' ? 3 : 1, wide;
    *out = NULL;
    for (k = 0; k < 3; k++) {   /* width, height, maxval, each after whitespace and # comments */
        for (;;) {
            while (pos < n && (b[pos] == ' ' || b[pos] == '\t' || b[pos] == '\n' || b[pos] == '\v' || b[pos] == '\f' ||
                               b[pos] == '\r'))
                pos++;
            if (pos >= n || b[pos] != '#') break;
            while (pos < n && b[pos] != '\n' && b[pos] != '\r') pos++;
        }
        if (pos >= n || b[pos] < '0' || b[pos] > '9')
            return dt_set_error(DT_ERR_FORMAT, "%s: its PGM/PPM header is incomplete (width, height and maxval expected)",
                                path);
        while (pos < n && b[pos] >= '0' && b[pos] <= '9') {
            v[k] = v[k] * 10 + (b[pos++] - '0');
            if (v[k] > (1 << 24)) return dt_set_error(DT_ERR_FORMAT, "%s: a number in its PGM/PPM header is too large", path);
        }
    }
    if (pos >= n || !(b[pos] == ' ' || b[pos] == '\t' || b[pos] == '\n' || b[pos] == '\v' || b[pos] == '\f' || b[pos] == '\r'))
        return dt_set_error(DT_ERR_FORMAT, "%s: its PGM/PPM header does not end with a whitespace character", path);
    pos++;
    maxv = v[2];
    if (v[0] == 0 || v[1] == 0 || maxv == 0 || maxv > 65535)
        return dt_set_error(DT_ERR_FORMAT, "%s: its PGM/PPM header says %lldx%lld pixels with maxval %lld; all must be "
                            "positive and maxval at most 65535", path, (long long)v[0], (long long)v[1], (long long)maxv);
    np = v[0] * v[1];
    if (np > (int64_t)DT_IMAGE_MAX_PIXELS)
        return dt_set_error(DT_ERR_FORMAT, "%s is %lldx%lld pixels, more than DT_IMAGE_MAX_PIXELS (%lld); define that macro "
                            "larger or shrink the image", path, (long long)v[0], (long long)v[1], (long long)DT_IMAGE_MAX_PIXELS);
    wide = maxv > 255;
    need = np * comp * (wide ? 2 : 1);
    if (n - pos < need)
        return dt_set_error(DT_ERR_FORMAT, "%s is truncated: its PGM/PPM header says %lldx%lld pixels (%lld bytes) but %lld "
                            "bytes follow the header", path, (long long)v[0], (long long)v[1], (long long)need,
                            (long long)(n - pos));
    if (!(*out = (uint8_t *)DT_MALLOC((size_t)(np * comp))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to decode %s", path);
    for (i = 0; i < np * comp; i++) {
        int64_t x = wide ? ((int64_t)b[pos + 2 * i] << 8) | b[pos + 2 * i + 1] : b[pos + i];   /* big-endian */
        (*out)[i] = x >= maxv ? 255 : (uint8_t)((x * 255 + maxv / 2) / maxv);
    }
    *ow = (int)v[0];
    *oh = (int)v[1];
    *ocomp = comp;
    return DT_OK;
}

/* Decodes the image file at path into dst [ch, h, w]; buf/bufcap is a reusable read buffer and tmp an
   [h, w, ch] scratch buffer. The image is decoded with its own components and converted here, as
   stb_image converts (grey = (77 R + 150 G + 29 B) >> 8, alpha dropped), so that stb_image's conversion
   code, where CVE-2021-42716 lives, is never run. */
/* stb_image 2.27 grows its buffer for a PNG's IDAT chunks to the length a chunk claims before checking
   that the file holds that much, so a few corrupt bytes ask for gigabytes (found by fuzz/fuzz_image.c).
   Every chunk up to IEND must fit in the file. */
static dt_result dt__png_check(const char *path, const uint8_t *b, int64_t n) {
    int64_t pos = 8;
    while (n - pos >= 12) {
        int64_t len = (int64_t)dt__be32(b + pos);
        if (len > n - pos - 12)
            return dt_set_error(DT_ERR_FORMAT, "%s is truncated or corrupt: a PNG chunk at byte %lld claims %lld bytes, the "
                                "file has %lld left", path, (long long)pos, (long long)len, (long long)(n - pos - 12));
        if (memcmp(b + pos + 4, "IEND", 4) == 0) break;
        pos += 12 + len;
    }
    return DT_OK;
}

/* stb_image 2.27 decodes a JPEG scan with Huffman tables that were never defined (uninitialised memory:
   its decoder then indexes past its tables; found by fuzz/fuzz_image.c with stb_image built in). This
   walks the markers and checks that each scan's tables, as stb_image will use them, were defined by a DHT
   (and its quantisation tables by a DQT) before it. */
static dt_result dt__jpeg_check(const char *path, const uint8_t *b, int64_t n) {
    int64_t pos = 2;
    int dht[2][4], dqt[4], ncomp = 0, progressive = 0, i;
    int comp_id[4] = {0, 0, 0, 0}, comp_tq[4] = {0, 0, 0, 0};
    memset(dht, 0, sizeof dht);
    memset(dqt, 0, sizeof dqt);
    for (;;) {
        int64_t len, p, end;
        int marker;
        while (pos < n && b[pos] != 0xff) pos++;           /* to the next marker (past entropy-coded data) */
        while (pos < n && b[pos] == 0xff) pos++;
        if (pos >= n) return DT_OK;                           /* no EOI: stb_image decodes what is there */
        marker = b[pos++];
        if (marker == 0xd9) return DT_OK;                     /* EOI */
        if (marker == 0x00 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) continue;   /* no segment */
        if (n - pos < 2 || (len = ((int64_t)b[pos] << 8) | b[pos + 1]) < 2 || len > n - pos)
            return dt_set_error(DT_ERR_FORMAT, "%s is truncated or corrupt: the JPEG segment at byte %lld runs past the "
                                "end of the file", path, (long long)(pos - 2));
        p = pos + 2;
        end = pos + len;
        pos = end;
        if (marker == 0xc4) {                                 /* DHT: class, id, 16 counts, values */
            while (p < end) {
                int64_t count = 0;
                int tc = b[p] >> 4, th = b[p] & 15;
                if (tc > 1 || th > 3 || end - p < 17) break;   /* stb_image refuses it */
                for (i = 1; i <= 16; i++) count += b[p + i];
                dht[tc][th] = 1;
                p += 17 + count;
            }
        } else if (marker == 0xdb) {                          /* DQT: precision and id, 64 entries */
            while (p < end) {
                int tq = b[p] & 15;
                if (tq > 3) break;
                dqt[tq] = 1;
                p += 1 + 64 * ((b[p] >> 4) ? 2 : 1);
            }
        } else if (marker == 0xc0 || marker == 0xc1 || marker == 0xc2) {   /* SOF: the components */
            progressive = marker == 0xc2;
            if (end - p >= 6) {
                ncomp = b[p + 5] < 4 ? b[p + 5] : 4;
                for (i = 0; i < ncomp && p + 6 + 3 * i + 2 < end; i++) {
                    comp_id[i] = b[p + 6 + 3 * i];
                    comp_tq[i] = b[p + 6 + 3 * i + 2] & 3;
                }
            }
        } else if (marker == 0xda && end - p >= 1) {          /* SOS: components and their tables, Ss, Se, Ah/Al */
            int ns = b[p], ss, ah, k;
            if (end - p < 1 + 2 * (int64_t)ns + 3) continue;  /* stb_image refuses it */
            ss = b[p + 1 + 2 * ns];
            ah = b[p + 3 + 2 * ns] >> 4;
            for (k = 0; k < ns; k++) {
                int id = b[p + 1 + 2 * k], td = b[p + 2 + 2 * k] >> 4, ta = b[p + 2 + 2 * k] & 15, c;
                int need_dc = progressive ? (ss == 0 && ah == 0) : 1, need_ac = progressive ? ss > 0 : 1;
                for (c = 0; c < ncomp && comp_id[c] != id; c++) {}
                if (c == ncomp || td > 3 || ta > 3) continue;     /* stb_image refuses these itself */
                if ((need_dc && !dht[0][td]) || (need_ac && !dht[1][ta]) || !dqt[comp_tq[c]])
                    return dt_set_error(DT_ERR_FORMAT, "%s is corrupt: a JPEG scan uses a %s table that was never "
                                        "defined", path, !dqt[comp_tq[c]] ? "quantisation" : "Huffman");
            }
        }
    }
}

static void dt__image_free(uint8_t *img, int pnm) {
    if (pnm) DT_FREE(img);
    else stbi_image_free(img);
}
static dt_result dt__image_load(const char *path, int64_t h, int64_t w, int64_t ch, uint8_t **buf, int64_t *bufcap,
                                uint8_t *tmp, uint8_t *dst) {
    FILE *fp = fopen(path, "rb");
    int64_t size, i, c, np;
    int iw = 0, ih = 0, comp = 0, pnm = 0;
    uint8_t *img = NULL, *conv = NULL;
    const uint8_t *src;
    const char *why;
    if (!fp) return dt_set_error(DT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if ((size = dt__file_size(fp)) < 0 || size > INT32_MAX) {
        fclose(fp);
        return dt_set_error(size < 0 ? DT_ERR_IO : DT_ERR_FORMAT, "%s: %s", path,
                            size < 0 ? "cannot find its size (is it a regular file?)" : "larger than 2 GiB; not an image");
    }
    if (size == 0) { fclose(fp); return dt_set_error(DT_ERR_FORMAT, "%s is empty; it cannot be decoded", path); }
    if (size > *bufcap) {
        uint8_t *nb = (uint8_t *)DT_REALLOC(*buf, (size_t)size);
        if (!nb) { fclose(fp); return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s (%lld bytes)", path, (long long)size); }
        *buf = nb;
        *bufcap = size;
    }
    if ((int64_t)fread(*buf, 1, (size_t)size, fp) != size) {
        fclose(fp);
        return dt_set_error(DT_ERR_IO, "cannot read %s", path);
    }
    fclose(fp);
    if (dt__image_sniff(path, *buf, size) != DT_OK) return DT_ERR_FORMAT;
    if ((*buf)[0] == 'P') {   /* sniffed: P5 or P6 */
        dt_result r = dt__pnm_decode(path, *buf, size, &img, &iw, &ih, &comp);
        if (r != DT_OK) return r;
        pnm = 1;
    } else {
        if ((*buf)[0] == 0x89 && dt__png_check(path, *buf, size) != DT_OK) return DT_ERR_FORMAT;
        if ((*buf)[0] == 0xff && dt__jpeg_check(path, *buf, size) != DT_OK) return DT_ERR_FORMAT;
        if (!stbi_info_from_memory(*buf, (int)size, &iw, &ih, &comp)) {
            why = stbi_failure_reason();
            return dt_set_error(DT_ERR_FORMAT, "%s cannot be decoded: %s (stb_image)", path, why ? why : "unknown reason");
        }
        if (iw <= 0 || ih <= 0 || (int64_t)iw * ih > (int64_t)DT_IMAGE_MAX_PIXELS)
            return dt_set_error(DT_ERR_FORMAT, "%s is %dx%d pixels, more than DT_IMAGE_MAX_PIXELS (%lld); define that macro "
                                "larger or shrink the image", path, iw, ih, (long long)DT_IMAGE_MAX_PIXELS);
        if (!(img = stbi_load_from_memory(*buf, (int)size, &iw, &ih, &comp, 0))) {
            why = stbi_failure_reason();
            return dt_set_error(DT_ERR_FORMAT, "%s cannot be decoded: %s (stb_image)", path, why ? why : "unknown reason");
        }
    }
    np = (int64_t)iw * ih;
    src = img;
    if (comp < 1 || comp > 4 || iw <= 0 || ih <= 0 || np > (int64_t)DT_IMAGE_MAX_PIXELS) {
        dt__image_free(img, pnm);
        return dt_set_error(DT_ERR_FORMAT, "%s: stb_image decoded %dx%d pixels of %d components; the file is corrupt", path,
                            iw, ih, comp);
    }
    if (comp != ch) {
        if (!(conv = (uint8_t *)DT_MALLOC((size_t)(np * ch)))) {
            dt__image_free(img, pnm);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to convert %s (%dx%d pixels)", path, iw, ih);
        }
        for (i = 0; i < np; i++) {
            const uint8_t *p = img + i * comp;
            if (ch == 3) {   /* comp 1, 2: grey (and alpha); comp 4: RGBA */
                conv[3 * i] = p[0];
                conv[3 * i + 1] = comp >= 3 ? p[1] : p[0];
                conv[3 * i + 2] = comp >= 3 ? p[2] : p[0];
            } else {
                conv[i] = comp >= 3 ? (uint8_t)((p[0] * 77 + p[1] * 150 + p[2] * 29) >> 8) : p[0];
            }
        }
        src = conv;
    }
    if (iw != w || ih != h) {
        if (!stbir_resize_uint8(src, iw, ih, 0, tmp, (int)w, (int)h, 0, (int)ch)) {
            dt__image_free(img, pnm);
            DT_FREE(conv);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "stb_image_resize could not resize %s from %dx%d to %lldx%lld "
                                "(out of memory)", path, iw, ih, (long long)w, (long long)h);
        }
    } else {
        memcpy(tmp, src, (size_t)(h * w * ch));
    }
    dt__image_free(img, pnm);
    DT_FREE(conv);
    for (c = 0; c < ch; c++)   /* HWC -> CHW */
        for (i = 0; i < h * w; i++) dst[c * h * w + i] = tmp[i * ch + c];
    return DT_OK;
}

dt_result dt_dataset_load_image_folder(dt_dataset *ds, const char *root, int64_t h, int64_t w, int64_t channels) {
    dt__strs cls, names, files;
    int64_t *start = NULL, k, i, bufcap = 0, sample;
    uint8_t *buf = NULL, *tmp = NULL;
    dt_result r;
    memset(&cls, 0, sizeof cls);
    memset(&names, 0, sizeof names);
    memset(&files, 0, sizeof files);
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!root) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder: root is NULL");
    if (channels == 0) channels = 3;
    if (channels != 1 && channels != 3)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder(%s): channels is %lld; use 1 (grey), 3 "
                            "(RGB) or 0 (RGB)", root, (long long)channels);
    if (h <= 0 || w <= 0 || h > INT32_MAX || w > INT32_MAX || h * w > (int64_t)DT_IMAGE_MAX_PIXELS)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dataset_load_image_folder(%s): size %lldx%lld is invalid; h and w "
                            "must be > 0 with h * w <= DT_IMAGE_MAX_PIXELS (%lld)", root, (long long)h, (long long)w,
                            (long long)DT_IMAGE_MAX_PIXELS);
    if ((r = dt__list_dir(root, 1, &cls)) != DT_OK) goto fail;
    if (cls.n == 0) {
        r = dt_set_error(DT_ERR_FORMAT, "%s holds no class directories; an image folder is root/<class>/<image>", root);
        goto fail;
    }
    if (!(start = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(cls.n + 1)))) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", root);
        goto fail;
    }
    for (k = 0; k < cls.n; k++) {   /* every image path, class by class, each class in name order */
        char *dir = dt__path(root, cls.s[k]);
        if (!dir) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", root); goto fail; }
        r = dt__list_dir(dir, 0, &names);
        start[k] = files.n;
        for (i = 0; r == DT_OK && i < names.n; i++)
            if (dt__strs_push(&files, dt__path(dir, names.s[i])) != 0)
                r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to list %s", root);
        if (r == DT_OK && names.n == 0)
            r = dt_set_error(DT_ERR_FORMAT, "class directory %s holds no images (files ending .jpg .jpeg .png .ppm .bmp "
                             ".pgm .tif .tiff .webp); add images or remove the directory", dir);
        DT_FREE(dir);
        dt__strs_free(&names);
        if (r != DT_OK) goto fail;
    }
    start[cls.n] = files.n;
    if ((uint64_t)files.n > (uint64_t)(SIZE_MAX / 2) / (uint64_t)(channels * h * w)) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: %lld images of %lldx%lldx%lld do not fit in memory", root,
                         (long long)files.n, (long long)channels, (long long)h, (long long)w);
        goto fail;
    }
    ds->pixels = (uint8_t *)DT_MALLOC((size_t)(files.n * channels * h * w));
    ds->labels = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)files.n);
    tmp = (uint8_t *)DT_MALLOC((size_t)(channels * h * w));
    if (!ds->pixels || !ds->labels || !tmp) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory for %lld images of %lldx%lldx%lld from %s", (long long)files.n,
                         (long long)channels, (long long)h, (long long)w, root);
        goto fail;
    }
    for (k = 0; k < cls.n; k++)
        for (sample = start[k]; sample < start[k + 1]; sample++) {
            ds->labels[sample] = (int32_t)k;
            r = dt__image_load(files.s[sample], h, w, channels, &buf, &bufcap, tmp,
                               ds->pixels + sample * channels * h * w);
            if (r != DT_OK) goto fail;
        }
    ds->count = files.n;
    ds->c = channels;
    ds->h = h;
    ds->w = w;
    ds->num_classes = cls.n;
    ds->class_names = cls.s;   /* the class list's strings become the dataset's */
    snprintf(ds->source, sizeof ds->source, "%s", root);
    dt__strs_free(&files);
    DT_FREE(start);
    DT_FREE(buf);
    DT_FREE(tmp);
    return DT_OK;
fail:
    dt__strs_free(&cls);
    dt__strs_free(&files);
    DT_FREE(start);
    DT_FREE(buf);
    DT_FREE(tmp);
    dt_dataset_free(ds);
    return r;
}
#else
dt_result dt_dataset_load_image_folder(dt_dataset *ds, const char *root, int64_t h, int64_t w, int64_t channels) {
    (void)h; (void)w; (void)channels;
    if (ds) memset(ds, 0, sizeof *ds);
    return dt_set_error(DT_ERR_UNSUPPORTED, "dt_dataset_load_image_folder(%s): image decoding is not built in; build "
                        "with -DDT_USE_STB_IMAGE and link -lstb (Debian: libstb-dev)", root ? root : "NULL");
}
#endif /* DT_USE_STB_IMAGE */

/* (partitioners and loader: implementation) */
/* ---- threads --------------------------------------------------------------------------------- */
/* A minimal internal wrapper over POSIX threads (the loader's prefetch thread; later the local backend's
   ranks). POSIX threads rather than C11 <threads.h>: they exist on Linux, macOS (which has no
   <threads.h>), the BSDs and MinGW, and the same calls compile as C and as C++. With DT_NO_THREADS the
   mutex and condition calls do nothing and starting a thread fails, so callers check DT__HAVE_THREADS
   and report DT_ERR_UNSUPPORTED first. Each function returns 0 on success or an error number. */
#if !defined(DT_NO_THREADS)
#ifdef __cplusplus
}
#endif
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#ifdef __cplusplus
extern "C" {
#endif
#define DT__HAVE_THREADS 1
typedef struct dt__thread { void (*fn)(void *arg); void *arg; pthread_t id; } dt__thread;
typedef struct dt__mutex { pthread_mutex_t m; } dt__mutex;
typedef struct dt__cond { pthread_cond_t c; } dt__cond;
static void *dt__thread_main(void *t) {
    ((dt__thread *)t)->fn(((dt__thread *)t)->arg);
    return NULL;
}
/* Runs fn(arg) on a new thread; *t must stay where it is until dt__thread_join. */
static int dt__thread_start(dt__thread *t, void (*fn)(void *), void *arg) {
    t->fn = fn;
    t->arg = arg;
    return pthread_create(&t->id, NULL, dt__thread_main, t);
}
static void dt__thread_join(dt__thread *t) { pthread_join(t->id, NULL); }
static int  dt__mutex_init(dt__mutex *m) { return pthread_mutex_init(&m->m, NULL); }
static void dt__mutex_destroy(dt__mutex *m) { pthread_mutex_destroy(&m->m); }
static void dt__mutex_lock(dt__mutex *m) { pthread_mutex_lock(&m->m); }
static void dt__mutex_unlock(dt__mutex *m) { pthread_mutex_unlock(&m->m); }
static int  dt__cond_init(dt__cond *c) { return pthread_cond_init(&c->c, NULL); }
static void dt__cond_destroy(dt__cond *c) { pthread_cond_destroy(&c->c); }
static void dt__cond_wait(dt__cond *c, dt__mutex *m) { pthread_cond_wait(&c->c, &m->m); }   /* re-check the predicate */
static void dt__cond_signal(dt__cond *c) { pthread_cond_signal(&c->c); }
static void dt__cond_broadcast(dt__cond *c) { pthread_cond_broadcast(&c->c); }
#else
#define DT__HAVE_THREADS 0
static int sched_yield(void) { return 0; }
typedef struct dt__thread { void (*fn)(void *arg); void *arg; } dt__thread;
typedef struct dt__mutex { int unused; } dt__mutex;
typedef struct dt__cond { int unused; } dt__cond;
static int  dt__thread_start(dt__thread *t, void (*fn)(void *), void *arg) { t->fn = fn; t->arg = arg; return -1; }
static void dt__thread_join(dt__thread *t) { (void)t; }
static int  dt__mutex_init(dt__mutex *m) { (void)m; return 0; }
static void dt__mutex_destroy(dt__mutex *m) { (void)m; }
static void dt__mutex_lock(dt__mutex *m) { (void)m; }
static void dt__mutex_unlock(dt__mutex *m) { (void)m; }
static int  dt__cond_init(dt__cond *c) { (void)c; return 0; }
static void dt__cond_destroy(dt__cond *c) { (void)c; }
static void dt__cond_wait(dt__cond *c, dt__mutex *m) { (void)c; (void)m; }
static void dt__cond_signal(dt__cond *c) { (void)c; }
static void dt__cond_broadcast(dt__cond *c) { (void)c; }
#endif

/* ---- random helpers for the partitioners, the sampler and the loader ------------------------- */

/* RNG streams of the partitioners and the sampler: fixed, so that every rank draws the same numbers. */
#define DT__STREAM_PARTITION 0x7061727469ULL
#define DT__STREAM_SAMPLER   0x73616d706cULL
/* Draws of dt_partition_dirichlet before it moves samples into parts left empty. */
#define DT__DIRICHLET_TRIES 100

/* Uniform double in the open interval (0, 1), 52 random bits: never 0, so its logarithm is finite. */
static double dt__rng_open01(dt_rng *r) {
    uint64_t hi = dt_rng_u32(r) >> 6, lo = dt_rng_u32(r) >> 6;
    return ((double)((hi << 26) | lo) + 0.5) * (1.0 / 4503599627370496.0);
}

/* Uniform integer in [0, n), unbiased, for n up to 2^64 - 1 (dt_rng_below covers 32 bits). n > 0. */
static uint64_t dt__rng_below64(dt_rng *r, uint64_t n) {
    uint64_t threshold, hi, x;
    if (n <= 0xffffffffULL) return dt_rng_below(r, (uint32_t)n);
    threshold = (0 - n) % n;
    for (;;) {
        hi = dt_rng_u32(r);
        x = (hi << 32) | dt_rng_u32(r);
        if (x >= threshold) return x % n;
    }
}

/* Fisher-Yates shuffle of a [n]. */
static void dt__shuffle(int64_t *a, int64_t n, dt_rng *r) {
    int64_t i, j, t;
    for (i = n - 1; i > 0; i--) {
        j = (int64_t)dt__rng_below64(r, (uint64_t)i + 1);
        t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

/* The generator of one (seed, epoch) on one stream; the mixed seed puts epochs far apart on the stream. */
static void dt__rng_epoch(dt_rng *r, uint64_t seed, uint64_t epoch, uint64_t stream) {
    dt_rng_init(r, dt__mix64(seed ^ dt__mix64(epoch + 0x9e3779b97f4a7c15ULL)), stream);
}

/* log of a Gamma(shape, 1) variate, shape > 0: Marsaglia and Tsang (2000), "A simple method for generating
   gamma variables". For shape < 1 it uses Gamma(shape) = Gamma(shape + 1) * U^(1/shape) (the boost);
   returning the logarithm keeps tiny shapes (alpha = 0.01) from underflowing to 0. */
static double dt__rng_log_gamma(dt_rng *r, double shape) {
    double boost = 0.0, d, c, x, v, u;
    if (shape < 1.0) {
        boost = log(dt__rng_open01(r)) / shape;
        shape += 1.0;
    }
    d = shape - 1.0 / 3.0;
    c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        do {   /* standard normal x (Box-Muller, one of the pair) with 1 + c x > 0 */
            double u1 = dt__rng_open01(r), u2 = dt__rng_open01(r);
            x = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        u = dt__rng_open01(r);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return log(d * v) + boost;
    }
}

/* ---- partitions ------------------------------------------------------------------------------ */

void dt_partition_free(dt_partition *p) {
    if (!p) return;
    DT_FREE(p->offsets);   /* offsets and indices are one block */
    memset(p, 0, sizeof *p);
}

/* Zeroes *p and checks the arguments every constructor has. */
static dt_result dt__partition_check(dt_partition *p, int64_t count, int parts, const char *fn) {
    if (!p) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the partition pointer is NULL", fn);
    memset(p, 0, sizeof *p);
    if (count < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0 (the number of samples)", fn,
                            (long long)count);
    if (parts < 1) return dt_set_error(DT_ERR_INVALID_ARG, "%s: parts is %d; it must be >= 1", fn, parts);
    return DT_OK;
}

/* Allocates offsets [parts + 1] and indices [count] as one block. */
static dt_result dt__partition_alloc(dt_partition *p, int parts, int64_t count, const char *fn) {
    uint64_t n = (uint64_t)parts + 1 + (uint64_t)count;
    if (n > SIZE_MAX / sizeof(int64_t) || !(p->offsets = (int64_t *)DT_MALLOC((size_t)n * sizeof(int64_t))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for a partition of %lld samples into %d parts", fn,
                            (long long)count, parts);
    p->parts = parts;
    p->indices = p->offsets + parts + 1;
    return DT_OK;
}

/* offsets of parts of sizes floor(count / parts) + (p < count % parts) */
static void dt__offsets_equal(int64_t *off, int parts, int64_t count) {
    int64_t q = count / parts, rem = count % parts;
    int k;
    off[0] = 0;
    for (k = 0; k < parts; k++) off[k + 1] = off[k] + q + (k < rem ? 1 : 0);
}

static void dt__iota(int64_t *a, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) a[i] = i;
}

dt_result dt_partition_fractions(dt_partition *p, int64_t count, const float *fractions, int parts, uint64_t seed) {
    const char *fn = "dt_partition_fractions";
    double sum = 0.0;
    int64_t left, n, *off;
    int k;
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, fn);
    if (e != DT_OK) return e;
    if (!fractions)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: fractions is NULL; pass one fraction per part, e.g. {0.7f, 0.2f, 0.1f}", fn);
    for (k = 0; k < parts; k++) {
        if (!(fractions[k] >= 0.0f && fractions[k] <= FLT_MAX))
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: fractions[%d] is %g; each fraction must be a finite number >= 0",
                                fn, k, (double)fractions[k]);
        sum += (double)fractions[k];
    }
    if (fabs(sum - 1.0) > 1e-4)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the %d fractions sum to %.6f; they must sum to 1 (within 1e-4)", fn,
                            parts, sum);
    if ((e = dt__partition_alloc(p, parts, count, fn)) != DT_OK) return e;
    off = p->offsets;
    left = count;
    for (k = 0; k < parts; k++) {   /* sizes first, in off[k + 1] */
        n = (int64_t)floor((double)count * ((double)fractions[k] / sum));
        if (n > left) n = left;     /* rounding can never hand out more than count */
        off[k + 1] = n;
        left -= n;
    }
    for (k = 0; left > 0; k = (k + 1) % parts)   /* the leftover (< parts): one each to nonzero parts, in order */
        if (fractions[k] > 0.0f) { off[k + 1]++; left--; }
    off[0] = 0;
    for (k = 0; k < parts; k++) off[k + 1] += off[k];
    dt__iota(p->indices, count);
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
    dt__shuffle(p->indices, count, &r);
    return DT_OK;
}

dt_result dt_partition_iid(dt_partition *p, int64_t count, int parts, uint64_t seed) {
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, "dt_partition_iid");
    if (e != DT_OK || (e = dt__partition_alloc(p, parts, count, "dt_partition_iid")) != DT_OK) return e;
    dt__offsets_equal(p->offsets, parts, count);
    dt__iota(p->indices, count);
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
    dt__shuffle(p->indices, count, &r);
    return DT_OK;
}

dt_result dt_partition_contiguous(dt_partition *p, int64_t count, int parts) {
    dt_result e = dt__partition_check(p, count, parts, "dt_partition_contiguous");
    if (e != DT_OK || (e = dt__partition_alloc(p, parts, count, "dt_partition_contiguous")) != DT_OK) return e;
    dt__offsets_equal(p->offsets, parts, count);
    dt__iota(p->indices, count);
    return DT_OK;
}

/* Stable sort of ids [n] by labels[id]: bottom-up merge sort with scratch tmp [n]. */
static void dt__sort_by_label(int64_t *ids, int64_t *tmp, int64_t n, const int32_t *labels) {
    int64_t width, i, *src = ids, *dst = tmp, *t;
    for (width = 1; width < n; width *= 2) {
        for (i = 0; i < n; i += 2 * width) {
            int64_t mid = i + width < n ? i + width : n, hi = i + 2 * width < n ? i + 2 * width : n;
            int64_t a = i, b = mid, k = i;
            while (a < mid && b < hi) dst[k++] = labels[src[b]] < labels[src[a]] ? src[b++] : src[a++];
            while (a < mid) dst[k++] = src[a++];
            while (b < hi) dst[k++] = src[b++];
        }
        t = src; src = dst; dst = t;
    }
    if (src != ids) memcpy(ids, src, (size_t)n * sizeof *ids);
}

dt_result dt_partition_shards(dt_partition *p, const int32_t *labels, int64_t count, int parts, int shards_per_part,
                              uint64_t seed) {
    const char *fn = "dt_partition_shards";
    int64_t i, shards, q, rem, pos, *tmp, *sorted, *perm;
    int k, j;
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, fn);
    if (e != DT_OK) return e;
    if (shards_per_part < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: shards_per_part is %d; it must be >= 1 (the FedAvg paper uses 2)", fn,
                            shards_per_part);
    if (count > 0 && !labels) return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL; pass the dataset's labels", fn);
    for (i = 0; i < count; i++)
        if (labels[i] < 0)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels[%lld] is %d; labels must be >= 0", fn, (long long)i,
                                (int)labels[i]);
    shards = (int64_t)parts * shards_per_part;
    if ((uint64_t)count + (uint64_t)shards > SIZE_MAX / sizeof(int64_t) ||
        !(tmp = (int64_t *)DT_MALLOC((size_t)(count + shards) * sizeof(int64_t))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld samples and %lld shards", fn,
                            (long long)count, (long long)shards);
    if ((e = dt__partition_alloc(p, parts, count, fn)) != DT_OK) { DT_FREE(tmp); return e; }
    sorted = tmp;
    perm = tmp + count;
    dt__iota(sorted, count);
    dt__sort_by_label(sorted, p->indices, count, labels);   /* p->indices is the scratch here */
    dt__iota(perm, shards);
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
    dt__shuffle(perm, shards, &r);
    q = count / shards;
    rem = count % shards;
    pos = 0;
    for (k = 0; k < parts; k++) {   /* part k takes shards perm[k * spp .. (k + 1) * spp) */
        p->offsets[k] = pos;
        for (j = 0; j < shards_per_part; j++) {
            int64_t s = perm[(int64_t)k * shards_per_part + j];
            int64_t start = s * q + (s < rem ? s : rem), size = q + (s < rem ? 1 : 0);
            memcpy(p->indices + pos, sorted + start, (size_t)size * sizeof(int64_t));
            pos += size;
        }
    }
    p->offsets[parts] = pos;
    DT_FREE(tmp);
    return DT_OK;
}

dt_result dt_partition_dirichlet(dt_partition *p, const int32_t *labels, int64_t count, int64_t num_classes, int parts,
                                 float alpha, uint64_t seed) {
    const char *fn = "dt_partition_dirichlet";
    int64_t i, k, cells, n64, *byclass, *coff, *cnt, *tot, *pos;
    double *w;
    char *mem;
    int j, attempt, empty;
    dt_rng r;
    dt_result e = dt__partition_check(p, count, parts, fn);
    if (e != DT_OK) return e;
    if (num_classes < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: num_classes is %lld; it must be >= 1 (the dataset's num_classes)", fn,
                            (long long)num_classes);
    if (!(alpha > 0.0f && alpha <= FLT_MAX))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: alpha is %g; it must be a finite number > 0 (0.1 = strong label "
                            "skew, 100 = near IID)", fn, (double)alpha);
    if (count > 0 && !labels) return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL; pass the dataset's labels", fn);
    for (i = 0; i < count; i++)
        if (labels[i] < 0 || labels[i] >= num_classes)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels[%lld] is %d, outside [0, %lld); pass the dataset's "
                                "num_classes", fn, (long long)i, (int)labels[i], (long long)num_classes);
    /* scratch: byclass [count], coff [num_classes + 1], cnt [num_classes, parts], tot [parts], pos [parts],
       then w [parts] doubles */
    if (num_classes > (INT64_MAX / 8) / parts) cells = -1;
    else cells = num_classes * parts;
    n64 = cells < 0 ? -1 : count + num_classes + 1 + cells + 2 * (int64_t)parts;
    if (n64 < 0 || (uint64_t)n64 + (uint64_t)parts > SIZE_MAX / 8 ||
        !(mem = (char *)DT_MALLOC((size_t)(n64 + parts) * 8)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld classes x %d parts", fn,
                            (long long)num_classes, parts);
    if ((e = dt__partition_alloc(p, parts, count, fn)) != DT_OK) { DT_FREE(mem); return e; }
    byclass = (int64_t *)mem;
    coff = byclass + count;
    cnt = coff + num_classes + 1;
    tot = cnt + cells;
    pos = tot + parts;
    w = (double *)(pos + parts);
    /* counting sort of the ids by class: coff[k] is where class k starts */
    memset(coff, 0, (size_t)(num_classes + 1) * sizeof *coff);
    for (i = 0; i < count; i++) coff[labels[i] + 1]++;
    for (k = 0; k < num_classes; k++) coff[k + 1] += coff[k];
    for (i = 0; i < count; i++) byclass[coff[labels[i]]++] = i;
    for (k = num_classes; k > 0; k--) coff[k] = coff[k - 1];
    coff[0] = 0;
    dt_rng_init(&r, seed, DT__STREAM_PARTITION);
    for (k = 0; k < num_classes; k++) dt__shuffle(byclass + coff[k], coff[k + 1] - coff[k], &r);
    for (attempt = 0; attempt < DT__DIRICHLET_TRIES; attempt++) {
        memset(tot, 0, (size_t)parts * sizeof *tot);
        for (k = 0; k < num_classes; k++) {
            int64_t nk = coff[k + 1] - coff[k], prev = 0, c, *row = cnt + k * parts;
            double mx = -HUGE_VAL, sum = 0.0, acc = 0.0;
            if (nk == 0) { memset(row, 0, (size_t)parts * sizeof *row); continue; }
            for (j = 0; j < parts; j++) {   /* q = g / sum(g), g_j ~ Gamma(alpha), computed from log g */
                w[j] = dt__rng_log_gamma(&r, (double)alpha);
                if (w[j] > mx) mx = w[j];
            }
            for (j = 0; j < parts; j++) sum += (w[j] = exp(w[j] - mx));
            for (j = 0; j < parts; j++) {   /* cut the class at floor(nk * cumsum(q)) */
                acc += w[j];
                c = j == parts - 1 ? nk : (int64_t)floor((double)nk * (acc / sum));
                if (c > nk) c = nk;
                if (c < prev) c = prev;
                row[j] = c - prev;
                tot[j] += c - prev;
                prev = c;
            }
        }
        for (empty = 0, j = 0; j < parts; j++) empty += tot[j] == 0;
        if (empty == 0 || count < parts) break;
    }
    if (count >= parts)   /* still empty after the redraws: move one sample to it from the largest part */
        for (j = 0; j < parts; j++) {
            int big = 0, kk = 0;
            if (tot[j] > 0) continue;
            for (i = 1; i < parts; i++) if (tot[i] > tot[big]) big = (int)i;
            for (k = 1; k < num_classes; k++) if (cnt[k * parts + big] > cnt[kk * parts + big]) kk = (int)k;
            cnt[kk * parts + big]--; tot[big]--;
            cnt[kk * parts + j]++; tot[j]++;
        }
    p->offsets[0] = 0;
    for (j = 0; j < parts; j++) {
        p->offsets[j + 1] = p->offsets[j] + tot[j];
        pos[j] = p->offsets[j];
    }
    for (k = 0; k < num_classes; k++) {   /* class k's shuffled ids, cut in part order */
        int64_t s = coff[k];
        for (j = 0; j < parts; j++) {
            int64_t c = cnt[k * parts + j];
            memcpy(p->indices + pos[j], byclass + s, (size_t)c * sizeof(int64_t));
            pos[j] += c;
            s += c;
        }
    }
    DT_FREE(mem);
    return DT_OK;
}

dt_result dt_partition_histogram(const dt_partition *p, const int32_t *labels, int64_t num_classes, int64_t *hist) {
    const char *fn = "dt_partition_histogram";
    int64_t i, id;
    int k;
    if (!p || !hist) return dt_set_error(DT_ERR_INVALID_ARG, "%s: NULL argument (partition and hist are needed)", fn);
    if (p->parts < 1 || !p->offsets)
        return dt_set_error(DT_ERR_STATE, "%s: the partition has no parts; build it with a dt_partition_* constructor", fn);
    if (num_classes < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: num_classes is %lld; it must be >= 1", fn, (long long)num_classes);
    if (p->offsets[p->parts] > 0 && (!labels || !p->indices))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: labels is NULL; pass the dataset's labels", fn);
    memset(hist, 0, (size_t)p->parts * (size_t)num_classes * sizeof *hist);
    for (k = 0; k < p->parts; k++)
        for (i = p->offsets[k]; i < p->offsets[k + 1]; i++) {
            id = p->indices[i];
            if (id < 0)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: part %d holds the negative sample id %lld", fn, k, (long long)id);
            if (labels[id] < 0 || labels[id] >= num_classes)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: sample %lld (part %d) has label %d, outside [0, %lld); pass "
                                    "the dataset's num_classes", fn, (long long)id, k, (int)labels[id],
                                    (long long)num_classes);
            hist[(int64_t)k * num_classes + labels[id]]++;
        }
    return DT_OK;
}

/* ---- distributed sampler --------------------------------------------------------------------- */

int64_t dt_sampler_size(int64_t count, int world, int drop_last) {
    if (count < 0 || world < 1) return 0;
    return count / world + (!drop_last && count % world != 0 ? 1 : 0);
}

dt_result dt_sampler_indices(int64_t count, int rank, int world, uint64_t seed, int64_t epoch, int shuffle,
                             int drop_last, int64_t *out, int64_t *n_out) {
    const char *fn = "dt_sampler_indices";
    int64_t n, j, *perm = NULL;
    dt_rng r;
    if (!n_out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: n_out is NULL", fn);
    *n_out = 0;
    if (count < 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0", fn, (long long)count);
    if (world < 1 || rank < 0 || rank >= world)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d of world %d; it needs world >= 1 and 0 <= rank < world", fn,
                            rank, world);
    if (epoch < 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: epoch is %lld; it must be >= 0", fn, (long long)epoch);
    n = dt_sampler_size(count, world, drop_last);
    if (n == 0) return DT_OK;
    if (!out)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: out is NULL; it must hold dt_sampler_size(count, world, drop_last) = "
                            "%lld ids", fn, (long long)n);
    if (shuffle) {
        if ((uint64_t)count > SIZE_MAX / sizeof(int64_t) || !(perm = (int64_t *)DT_MALLOC((size_t)count * sizeof(int64_t))))
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for a permutation of %lld samples", fn,
                                (long long)count);
        dt__iota(perm, count);
        dt__rng_epoch(&r, seed, (uint64_t)epoch, DT__STREAM_SAMPLER);
        dt__shuffle(perm, count, &r);
    }
    for (j = 0; j < n; j++) {   /* position in the padded (or truncated) list; padding repeats it from the start */
        int64_t at = (rank + j * world) % count;
        out[j] = perm ? perm[at] : at;
    }
    DT_FREE(perm);
    *n_out = n;
    return DT_OK;
}

/* ---- loader ---------------------------------------------------------------------------------- */

struct dt_loader {
    const dt_dataset *ds;
    dt_transform      tf;
    int               has_tf, shuffle, drop_last, prefetch;
    uint64_t          seed, rank;
    int64_t           batch, count, cap;   /* samples per batch; sample ids now; ids at most (buffer size) */
    int64_t          *ids, *order;         /* [cap]: the given ids; this epoch's order */
    float            *x[2];                /* [rows, c, h, w] each; the second only with prefetch */
    int32_t          *y[2];                /* [rows] */
    int64_t           epoch, next;         /* epoch (-1 = none started), next batch to hand out */
    /* prefetch: the worker converts batch `job` into slot job % 2, then sets `done` = job. The caller asks
       for batch k + 1 only after it received batch k, so at most one batch is in flight and the slot being
       written is never the one the caller holds. The worker reads order, epoch and count, which the caller
       changes only while the worker is idle (dt__loader_quiesce). */
    dt__thread        thread;
    dt__mutex         mu;
    dt__cond          wake, ready;         /* wake: a job or quit for the worker; ready: a batch finished */
    int               sync_ok, thread_ok, busy, quit;
    int64_t           job, done;           /* -1 = none */
    dt_result         done_r;
    char              done_msg[512];
};

static dt_result dt__loader_convert(dt_loader *l, int64_t k, int slot) {
    int64_t start = k * l->batch, n = l->count - start < l->batch ? l->count - start : l->batch;
    return dt_dataset_batch(l->ds, l->order + start, n, l->has_tf ? &l->tf : NULL, l->seed, (uint64_t)l->epoch,
                            l->x[slot], l->y[slot]);
}

static void dt__loader_worker(void *arg) {
    dt_loader *l = (dt_loader *)arg;
    int64_t k;
    dt_result r;
#if DT__HAVE_OMP
    omp_set_num_threads(1);   /* a background thread: leave the cores to the training thread's kernels */
#endif
    dt__mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && l->job < 0) dt__cond_wait(&l->wake, &l->mu);
        if (l->quit) break;
        k = l->job;
        l->job = -1;
        l->busy = 1;
        dt__mutex_unlock(&l->mu);
        r = dt__loader_convert(l, k, (int)(k & 1));
        dt__mutex_lock(&l->mu);
        if (r != DT_OK) {   /* the message is per thread: hand it to the caller's thread, without "CODE: " */
            const char *msg = dt_last_error();
            size_t pre = strlen(dt_result_str(r));
            if (strncmp(msg, dt_result_str(r), pre) == 0 && msg[pre] == ':') msg += pre + (msg[pre + 1] == ' ' ? 2 : 1);
            snprintf(l->done_msg, sizeof l->done_msg, "%s", msg);
        }
        l->busy = 0;
        l->done = k;
        l->done_r = r;
        dt__cond_broadcast(&l->ready);
    }
    dt__mutex_unlock(&l->mu);
}

/* Cancels a batch not yet begun and waits for the one being converted: afterwards the worker touches
   nothing until the next request. */
static void dt__loader_quiesce(dt_loader *l) {
    if (!l->thread_ok) return;
    dt__mutex_lock(&l->mu);
    l->job = -1;
    while (l->busy) dt__cond_wait(&l->ready, &l->mu);
    l->done = -1;
    dt__mutex_unlock(&l->mu);
}

static void dt__loader_request(dt_loader *l, int64_t k) {
    dt__mutex_lock(&l->mu);
    l->job = k;
    dt__cond_signal(&l->wake);
    dt__mutex_unlock(&l->mu);
}

/* Checks ids [n] against the dataset. */
static dt_result dt__loader_check_ids(const dt_dataset *ds, const int64_t *ids, int64_t n, const char *fn) {
    int64_t i;
    for (i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= ds->count)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: indices[%lld] is %lld, outside the dataset %s of %lld samples; "
                                "pass sample ids in [0, count)", fn, (long long)i, (long long)ids[i],
                                ds->source[0] ? ds->source : "(in memory)", (long long)ds->count);
    return DT_OK;
}

/* bytes rounded up to a multiple of 64, so that each array of the loader's block starts on a cache line */
static size_t dt__round64(size_t n) { return (n + 63) & ~(size_t)63; }

dt_result dt_loader_create(dt_loader **out, const dt_loader_desc *d) {
    const char *fn = "dt_loader_create";
    const dt_dataset *ds;
    dt_loader *l;
    char *mem;
    int64_t batch, cap, rows, sample, i;
    int s, slots;
    double want;
    size_t at, bytes_x, bytes_y, bytes_ids;
    dt_result e;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the desc is NULL; pass a dt_loader_desc (zero = defaults)", fn);
    if (!(ds = d->dataset))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: desc.dataset is NULL; point it at a loaded dt_dataset", fn);
    if (!ds->pixels || !ds->labels || ds->count <= 0 || ds->c <= 0 || ds->h <= 0 || ds->w <= 0)
        return dt_set_error(DT_ERR_STATE, "%s: the dataset %s is empty (count %lld, shape %lldx%lldx%lld); load it first",
                            fn, ds->source[0] ? ds->source : "(in memory)", (long long)ds->count, (long long)ds->c,
                            (long long)ds->h, (long long)ds->w);
    if (d->batch < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: batch is %lld; it must be > 0 (or 0 for the default 64)", fn,
                            (long long)d->batch);
    if (d->count < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be >= 0", fn, (long long)d->count);
    if (!d->indices && d->count != 0 && d->count != ds->count)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld but indices is NULL; pass the sample ids, or count 0 "
                            "for all %lld samples of the dataset", fn, (long long)d->count, (long long)ds->count);
    if (d->indices && (e = dt__loader_check_ids(ds, d->indices, d->count, fn)) != DT_OK) return e;
    if (d->transform && d->transform->crop_pad < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: transform.crop_pad is %lld; it must be >= 0", fn,
                            (long long)d->transform->crop_pad);
    if (d->prefetch && !DT__HAVE_THREADS)
        return dt_set_error(DT_ERR_UNSUPPORTED, "%s: prefetch needs threads, and this build defines DT_NO_THREADS; set "
                            "prefetch = 0 (the batches are the same, converted on the calling thread)", fn);
    batch = d->batch ? d->batch : 64;
    cap = d->indices ? d->count : ds->count;
    sample = ds->c * ds->h * ds->w;
    rows = batch < cap ? batch : (cap > 0 ? cap : 1);   /* a batch never holds more than all the samples */
    slots = d->prefetch ? 2 : 1;
    /* one block: the loader, ids and order [cap], then per slot x [rows, c, h, w] and y [rows] */
    want = (double)sizeof(dt_loader) + 16.0 * (double)cap + (double)slots * (double)rows * ((double)sample + 1.0) * 4.0;
    if (want > (double)(SIZE_MAX / 4))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: the batch buffers would need %.0f bytes; use a smaller batch", fn, want);
    bytes_ids = dt__round64((size_t)cap * sizeof(int64_t));
    bytes_x = dt__round64((size_t)rows * (size_t)sample * sizeof(float));
    bytes_y = dt__round64((size_t)rows * sizeof(int32_t));
    at = dt__round64(sizeof(dt_loader));
    if (!(mem = (char *)DT_MALLOC(at + 2 * bytes_ids + (size_t)slots * (bytes_x + bytes_y))))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: out of memory for %.1f MiB of order and batch buffers; use a "
                            "smaller batch", fn, want / 1048576.0);
    l = (dt_loader *)mem;
    memset(l, 0, sizeof *l);
    l->ids = (int64_t *)(mem + at);
    l->order = (int64_t *)(mem + at + bytes_ids);
    at += 2 * bytes_ids;
    for (s = 0; s < slots; s++) {
        l->x[s] = (float *)(mem + at);
        l->y[s] = (int32_t *)(mem + at + bytes_x);
        at += bytes_x + bytes_y;
    }
    l->ds = ds;
    if (d->transform) { l->tf = *d->transform; l->has_tf = 1; }
    l->shuffle = d->shuffle != 0;
    l->drop_last = d->drop_last != 0;
    l->prefetch = d->prefetch != 0;
    l->seed = d->seed;
    l->rank = d->rank;
    l->batch = batch;
    l->count = l->cap = cap;
    if (d->indices) { if (cap > 0) memcpy(l->ids, d->indices, (size_t)cap * sizeof(int64_t)); }
    else for (i = 0; i < cap; i++) l->ids[i] = i;
    l->epoch = -1;
    l->job = l->done = -1;
    if (l->prefetch) {
        int err = dt__mutex_init(&l->mu);
        if (err == 0 && (err = dt__cond_init(&l->wake)) != 0) dt__mutex_destroy(&l->mu);
        if (err == 0 && (err = dt__cond_init(&l->ready)) != 0) { dt__cond_destroy(&l->wake); dt__mutex_destroy(&l->mu); }
        if (err != 0) {
            DT_FREE(mem);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: could not create the prefetch thread's mutex (error %d); set "
                                "prefetch = 0", fn, err);
        }
        l->sync_ok = 1;
        if ((err = dt__thread_start(&l->thread, dt__loader_worker, l)) != 0) {
            dt_loader_destroy(l);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: could not start the prefetch thread (error %d); set prefetch "
                                "= 0 or raise the process's thread limit", fn, err);
        }
        l->thread_ok = 1;
    }
    *out = l;
    return DT_OK;
}

void dt_loader_destroy(dt_loader *l) {
    if (!l) return;
    if (l->thread_ok) {   /* the worker finishes a batch in flight, sees quit and returns */
        dt__mutex_lock(&l->mu);
        l->quit = 1;
        dt__cond_signal(&l->wake);
        dt__mutex_unlock(&l->mu);
        dt__thread_join(&l->thread);
    }
    if (l->sync_ok) {
        dt__cond_destroy(&l->ready);
        dt__cond_destroy(&l->wake);
        dt__mutex_destroy(&l->mu);
    }
    DT_FREE(l);
}

int64_t dt_loader_batches(const dt_loader *l) {
    if (!l) return 0;
    return l->count / l->batch + (!l->drop_last && l->count % l->batch != 0 ? 1 : 0);
}

dt_result dt_loader_start_epoch(dt_loader *l, int64_t epoch) {
    dt_rng r;
    if (!l) return dt_set_error(DT_ERR_INVALID_ARG, "dt_loader_start_epoch: the loader is NULL");
    if (epoch < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_loader_start_epoch: epoch is %lld; it must be >= 0", (long long)epoch);
    dt__loader_quiesce(l);
    if (l->count > 0) memcpy(l->order, l->ids, (size_t)l->count * sizeof(int64_t));
    if (l->shuffle) {   /* from the given order each epoch: the order depends on (seed, rank, epoch) only */
        dt__rng_epoch(&r, l->seed, (uint64_t)epoch, l->rank);
        dt__shuffle(l->order, l->count, &r);
    }
    l->epoch = epoch;
    l->next = 0;
    if (l->thread_ok && dt_loader_batches(l) > 0) dt__loader_request(l, 0);
    return DT_OK;
}

int dt_loader_next(dt_loader *l, const float **x, const int32_t **y, int64_t *n) {
    int64_t k, left;
    int slot;
    dt_result r;
    char msg[512];
    if (!l || !x || !y || !n) {
        dt_set_error(DT_ERR_INVALID_ARG, "dt_loader_next: NULL argument (the loader, x, y and n are needed)");
        return -1;
    }
    *x = NULL; *y = NULL; *n = 0;
    if (l->epoch < 0) {
        dt_set_error(DT_ERR_STATE, "dt_loader_next: no epoch started; call dt_loader_start_epoch(loader, epoch) first "
                     "(also after dt_loader_set_indices)");
        return -1;
    }
    k = l->next;
    if (k >= dt_loader_batches(l)) return 0;
    dt_trace_begin("next batch", "data");   /* the wait for the prefetched batch, or its conversion */
    if (l->thread_ok) {
        slot = (int)(k & 1);
        dt__mutex_lock(&l->mu);
        while (l->done != k) dt__cond_wait(&l->ready, &l->mu);
        r = l->done_r;
        if (r != DT_OK) snprintf(msg, sizeof msg, "%s", l->done_msg);
        dt__mutex_unlock(&l->mu);
        if (r == DT_OK && k + 1 < dt_loader_batches(l)) dt__loader_request(l, k + 1);   /* into the slot of batch k - 1 */
        if (r != DT_OK) dt_set_error(r, "%s", msg);
    } else {
        slot = 0;
        r = dt__loader_convert(l, k, 0);
    }
    dt_trace_end();
    if (r != DT_OK) return -1;
    left = l->count - k * l->batch;
    l->next = k + 1;
    *x = l->x[slot];
    *y = l->y[slot];
    *n = left < l->batch ? left : l->batch;
    return 1;
}

dt_result dt_loader_set_indices(dt_loader *l, const int64_t *indices, int64_t count) {
    const char *fn = "dt_loader_set_indices";
    dt_result e;
    if (!l) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the loader is NULL", fn);
    if (count < 0 || count > l->cap)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: count is %lld; it must be in [0, %lld], the count at create", fn,
                            (long long)count, (long long)l->cap);
    if (count > 0 && !indices) return dt_set_error(DT_ERR_INVALID_ARG, "%s: indices is NULL", fn);
    if ((e = dt__loader_check_ids(l->ds, indices, count, fn)) != DT_OK) return e;
    dt__loader_quiesce(l);
    if (count > 0) memcpy(l->ids, indices, (size_t)count * sizeof(int64_t));
    l->count = count;
    l->epoch = -1;
    l->next = 0;
    return DT_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* 6. comm                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

const char *dt_topology_name(dt_topology_kind k) {
    static const char *names[] = {"ring", "torus", "exponential", "full", "custom"};
    return (k >= DT_TOPO_RING && k <= DT_TOPO_CUSTOM) ? names[k] : "unknown";
}

void dt_topology_free(dt_topology *t) {
    if (!t) return;
    DT_FREE(t->weights);
    DT_FREE(t->offsets);
    DT_FREE(t->neighbors);
    memset(t, 0, sizeof *t);
}

/* Eigenvalues of the symmetric n x n matrix a (destroyed) by cyclic Jacobi rotations, into ev[n]. */
static void dt__sym_eigenvalues(double *a, int n, double *ev) {
    int sweep, p, q, k;
    for (sweep = 0; sweep < 100; sweep++) {
        double off = 0.0;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
        if (off < 1e-22) break;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) {
                double apq = a[p * n + q], theta, t, c, s;
                if (fabs(apq) < 1e-300) continue;
                theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                c = 1.0 / sqrt(t * t + 1.0);
                s = t * c;
                for (k = 0; k < n; k++) {   /* A <- A J (columns p, q) */
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (k = 0; k < n; k++) {   /* A <- J^T A (rows p, q) */
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
    }
    for (k = 0; k < n; k++) ev[k] = a[k * n + k];
}

dt_result dt_topology_create(dt_topology *t, const dt_topology_desc *desc) {
    int n, i, j, rows = 0, cols = 0, nedges = 0;
    uint8_t *adj = NULL;
    int *stack = NULL, *seen = NULL;
    double *work = NULL, *ev = NULL;
    dt_result r = DT_OK;
    if (!t) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: topology is NULL");
    memset(t, 0, sizeof *t);
    if (!desc) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: desc is NULL");
    n = desc->world;
    if (n < 1 || n > 65536) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: world is %d; it must be in 1..65536", n);
    if (desc->kind < DT_TOPO_RING || desc->kind > DT_TOPO_CUSTOM)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: unknown topology %d", (int)desc->kind);
    if (desc->mixing != DT_MIXING_UNIFORM && desc->mixing != DT_MIXING_METROPOLIS)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: unknown mixing %d", (int)desc->mixing);
    if (desc->kind == DT_TOPO_CUSTOM && !desc->adjacency)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: a custom topology needs the adjacency matrix [world * world]");
    if (desc->kind == DT_TOPO_TORUS) {
        rows = desc->rows;
        if (rows == 0)   /* the most square factorisation */
            for (rows = (int)sqrt((double)n); rows > 1 && n % rows; rows--) {}
        if (rows < 1 || n % rows)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: a torus of %d ranks cannot have %d rows; rows must "
                                "divide the world size (or be 0 for the most square grid)", n, desc->rows);
        cols = n / rows;
    }
    adj = (uint8_t *)DT_MALLOC((size_t)n * (size_t)n);
    t->weights = (double *)DT_MALLOC(sizeof(double) * (size_t)n * (size_t)n);
    t->offsets = (int *)DT_MALLOC(sizeof(int) * (size_t)(n + 1));
    if (!adj || !t->weights || !t->offsets) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for %d ranks", n); goto done; }
    memset(adj, 0, (size_t)n * (size_t)n);
    for (i = 0; i < n; i++) {
        int d;
        switch (desc->kind) {
        case DT_TOPO_RING:
            adj[i * n + (i + 1) % n] = adj[i * n + (i + n - 1) % n] = 1;
            break;
        case DT_TOPO_TORUS: {
            int rr = i / cols, cc = i % cols;
            adj[i * n + rr * cols + (cc + 1) % cols] = adj[i * n + rr * cols + (cc + cols - 1) % cols] = 1;
            adj[i * n + ((rr + 1) % rows) * cols + cc] = adj[i * n + ((rr + rows - 1) % rows) * cols + cc] = 1;
        } break;
        case DT_TOPO_EXPONENTIAL:
            for (d = 1; d < n; d *= 2) adj[i * n + (i + d) % n] = adj[i * n + (i + n - d % n) % n] = 1;
            break;
        case DT_TOPO_FULL:
            for (j = 0; j < n; j++) adj[i * n + j] = 1;
            break;
        case DT_TOPO_CUSTOM:
            for (j = 0; j < n; j++) adj[i * n + j] = desc->adjacency[i * n + j] != 0;
            break;
        }
        adj[i * n + i] = 0;   /* self-loops are implicit in W[i][i] */
    }
    for (i = 0; i < n; i++)
        for (j = 0; j < n; j++)
            if (adj[i * n + j] != adj[j * n + i]) {
                r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the adjacency is not symmetric (%d -> %d but not %d -> %d); "
                                 "gossip needs undirected edges", i, j, j, i);
                goto done;
            }
    /* neighbour lists */
    t->offsets[0] = 0;
    for (i = 0; i < n; i++) {
        for (j = 0; j < n; j++) nedges += adj[i * n + j];
        t->offsets[i + 1] = nedges;
    }
    t->neighbors = (int *)DT_MALLOC(sizeof(int) * (size_t)(nedges + 1));
    if (!t->neighbors) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for %d edges", nedges); goto done; }
    for (i = 0, nedges = 0; i < n; i++)
        for (j = 0; j < n; j++)
            if (adj[i * n + j]) t->neighbors[nedges++] = j;
    /* mixing weights */
    for (i = 0; i < n; i++) {
        int di = t->offsets[i + 1] - t->offsets[i];
        double rest = 1.0;
        for (j = 0; j < n; j++) {
            int dj = t->offsets[j + 1] - t->offsets[j];
            double w = 0.0;
            if (adj[i * n + j]) w = desc->mixing == DT_MIXING_UNIFORM ? 1.0 / (di + 1) : 1.0 / (1 + (di > dj ? di : dj));
            t->weights[i * n + j] = w;
            rest -= w;
        }
        t->weights[i * n + i] = rest;
    }
    for (i = 0; i < n; i++) {   /* symmetric and doubly stochastic (rows sum to 1 by construction) */
        double col = 0.0;
        for (j = 0; j < n; j++) {
            col += t->weights[j * n + i];
            if (fabs(t->weights[i * n + j] - t->weights[j * n + i]) > 1e-12) {
                r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the %s mixing matrix is not symmetric (ranks %d and %d "
                                 "have degrees %d and %d): use DT_MIXING_METROPOLIS for graphs that are not regular",
                                 desc->mixing == DT_MIXING_UNIFORM ? "uniform" : "Metropolis", i, j,
                                 t->offsets[i + 1] - t->offsets[i], t->offsets[j + 1] - t->offsets[j]);
                goto done;
            }
        }
        if (fabs(col - 1.0) > 1e-9 || t->weights[i * n + i] < -1e-12) {
            r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the mixing matrix is not doubly stochastic at rank %d "
                             "(column sum %g, self weight %g)", i, col, t->weights[i * n + i]);
            goto done;
        }
    }
    /* connected: a search from rank 0 reaches everyone */
    stack = (int *)DT_MALLOC(sizeof(int) * (size_t)n);
    seen = (int *)DT_MALLOC(sizeof(int) * (size_t)n);
    if (!stack || !seen) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory"); goto done; }
    {
        int top = 0, reached = 1, k;
        memset(seen, 0, sizeof(int) * (size_t)n);
        seen[0] = 1;
        stack[top++] = 0;
        while (top) {
            int v = stack[--top];
            for (k = t->offsets[v]; k < t->offsets[v + 1]; k++)
                if (!seen[t->neighbors[k]]) { seen[t->neighbors[k]] = 1; reached++; stack[top++] = t->neighbors[k]; }
        }
        if (reached != n) {
            for (k = 0; k < n && seen[k]; k++) {}
            r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the graph is not connected (rank %d cannot be reached from "
                             "rank 0): gossip would never reach consensus; add edges", k);
            goto done;
        }
    }
    /* spectral gap from the eigenvalues of W (symmetric, so real); Jacobi costs O(world^3) per sweep, so
       beyond 1024 ranks the gap is left at -1 (not computed) */
    t->world = n;
    if (n > 1024) { t->spectral_gap = t->lambda2 = -1.0; goto done; }
    work = (double *)DT_MALLOC(sizeof(double) * (size_t)n * (size_t)n);
    ev = (double *)DT_MALLOC(sizeof(double) * (size_t)n);
    if (!work || !ev) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for the spectrum"); goto done; }
    memcpy(work, t->weights, sizeof(double) * (size_t)n * (size_t)n);
    dt__sym_eigenvalues(work, n, ev);
    {
        /* the largest eigenvalue is 1 (the consensus direction); lambda2 is the largest |ev| among the rest */
        int top1 = 0, k;
        double l2 = 0.0;
        for (k = 1; k < n; k++) if (ev[k] > ev[top1]) top1 = k;
        for (k = 0; k < n; k++) if (k != top1 && fabs(ev[k]) > l2) l2 = fabs(ev[k]);
        t->lambda2 = l2;
        t->spectral_gap = 1.0 - l2;
    }
    t->world = n;
done:
    DT_FREE(adj); DT_FREE(stack); DT_FREE(seen); DT_FREE(work); DT_FREE(ev);
    if (r != DT_OK) dt_topology_free(t);
    return r;
}

/* ---- communicator: the generic layer ----------------------------------------------------------- */
/* Everything above the transport: argument checks, the collective's signature and sequence number,
   error reports, counters, and the algorithms (naive, ring, tree) written once over isend/irecv. */

#define DT__ATOMIC_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define DT__ATOMIC_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

enum { DT__REQ_NONE = 0, DT__REQ_SEND = 1, DT__REQ_RECV = 2 };
enum { DT__ST_POSTED = 0, DT__ST_MATCHED = 1, DT__ST_DONE = 2, DT__ST_CANCELLED = 3 };
/* What a communicator is doing: the kind of its current operation, stored in sig[2]. */
enum { DT__OP_P2P = 0, DT__OP_BARRIER, DT__OP_BROADCAST, DT__OP_REDUCE, DT__OP_ALLREDUCE, DT__OP_SCATTER,
       DT__OP_GATHER, DT__OP_ALLGATHER, DT__OP_REDUCE_SCATTER, DT__OP_NEIGHBOR, DT__OP_COUNT };
static const char *dt__op_names[DT__OP_COUNT] = {"point-to-point", "barrier", "broadcast", "reduce", "all-reduce",
                                                  "scatter", "gather", "all-gather", "reduce-scatter",
                                                  "neighbour exchange"};
#define DT__TAG_COLL 32768          /* tags from here up belong to collectives: seq and signature hash */
#define DT__TAG_HASH_BITS 6

size_t dt_dtype_size(dt_dtype t) {
    switch (t) {
    case DT_F32: case DT_I32: return 4;
    case DT_F64: case DT_I64: return 8;
    case DT_U8: return 1;
    default: return 0;
    }
}
const char *dt_dtype_name(dt_dtype t) {
    static const char *n[] = {"f32", "f64", "i32", "i64", "u8"};
    return (t >= DT_F32 && t < DT_DTYPE_COUNT) ? n[t] : "unknown";
}
/* The names of an enum's values, shared by the dt_*_name / dt_*_parse pairs: the name of k ("unknown"
   outside 0..n-1), and the value named s (or DT_ERR_INVALID_ARG listing the choices; what names the kind). */
static const char *dt__enum_name(const char *const *names, int n, int k) { return k >= 0 && k < n ? names[k] : "unknown"; }
static dt_result dt__enum_parse(const char *const *names, int n, const char *s, int *out, const char *what) {
    char list[256];
    size_t len = 0;
    int k;
    for (k = 0; s && k < n; k++)
        if (strcmp(s, names[k]) == 0) { *out = k; return DT_OK; }
    list[0] = 0;
    for (k = 0; k < n && len < sizeof list; k++) {
        int w = snprintf(list + len, sizeof list - len, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", names[k]);
        if (w > 0) len += (size_t)w;
    }
    return dt_set_error(DT_ERR_INVALID_ARG, "unknown %s '%s': use %s", what, s ? s : "(null)", list);
}

static const char *const dt__algo_names[DT_ALGO_COUNT] = {"auto", "naive", "ring", "tree", "native"};
const char *dt_algo_name(dt_algo a) { return dt__enum_name(dt__algo_names, DT_ALGO_COUNT, (int)a); }
dt_result dt_algo_parse(const char *s, dt_algo *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__algo_names, DT_ALGO_COUNT, s, &k, "collective algorithm");
    if (r == DT_OK && out) *out = (dt_algo)k;
    return r;
}
static const char *dt__reduce_name(int op) {
    static const char *n[] = {"sum", "mean", "max", "min"};
    return (op >= 0 && op <= DT_MIN) ? n[op] : "none";
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : 0; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : 1; }
const char *dt_comm_backend_name(const dt_comm *c) { return (c && c->backend) ? c->backend->name : "none"; }
dt_comm_stats dt_comm_get_stats(const dt_comm *c) {
    dt_comm_stats z;
    if (c) return c->stats;
    memset(&z, 0, sizeof z);
    return z;
}
void dt_comm_reset_stats(dt_comm *c) { if (c) memset(&c->stats, 0, sizeof c->stats); }

/* The signature of an operation: sig[0] sequence number, sig[1] count, sig[2] kind | type | op | root | algo.
   Two ranks in the same collective have equal signatures; the transport compares them. */
static void dt__comm_begin(dt_comm *c, int kind, size_t count, int t, int op, int root, int algo) {
    c->sig[0] = c->seq;
    c->sig[1] = (uint64_t)count;
    c->sig[2] = (uint64_t)kind | ((uint64_t)(t & 0xff) << 8) | ((uint64_t)(op & 0xff) << 16) |
                ((uint64_t)(uint32_t)(root + 1) << 24) | ((uint64_t)(algo & 0xff) << 56);
}
static void dt__sig_str(const uint64_t *sig, char *buf, size_t cap) {
    int kind = (int)(sig[2] & 0xff), t = (int)((sig[2] >> 8) & 0xff), op = (int)((sig[2] >> 16) & 0xff);
    int root = (int)((sig[2] >> 24) & 0xffffffffu) - 1, algo = (int)(sig[2] >> 56);
    int n = snprintf(buf, cap, "%s #%llu (", kind < DT__OP_COUNT ? dt__op_names[kind] : "?", (unsigned long long)sig[0]);
    if (n < 0 || (size_t)n >= cap) return;
    if (kind == DT__OP_BARRIER) { snprintf(buf + n, cap - (size_t)n, "%s)", dt_algo_name((dt_algo)algo)); return; }
    n += snprintf(buf + n, cap - (size_t)n, "%llu x %s", (unsigned long long)sig[1], dt_dtype_name((dt_dtype)t));
    if ((size_t)n >= cap) return;
    if (kind == DT__OP_REDUCE || kind == DT__OP_ALLREDUCE || kind == DT__OP_REDUCE_SCATTER)
        n += snprintf(buf + n, cap - (size_t)n, ", %s", dt__reduce_name(op));
    if ((size_t)n >= cap) return;
    if (root >= 0 && (kind == DT__OP_BROADCAST || kind == DT__OP_REDUCE || kind == DT__OP_SCATTER || kind == DT__OP_GATHER))
        n += snprintf(buf + n, cap - (size_t)n, ", root %d", root);
    if ((size_t)n >= cap) return;
    if (kind == DT__OP_BROADCAST || kind == DT__OP_REDUCE || kind == DT__OP_ALLREDUCE)
        n += snprintf(buf + n, cap - (size_t)n, ", %s", dt_algo_name((dt_algo)algo));
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}
static uint64_t dt__sig_hash(const uint64_t *sig) {
    uint64_t h = 1469598103934665603ull ^ sig[1];
    h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull;
    h ^= sig[2];
    h = (h ^ (h >> 31)) * 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}
/* The tag of the current collective's messages: DT__TAG_COLL + (seq mod nseq) << 6 + a 6-bit hash of the
   signature, so a transport that matches on tags alone (MPI) still tells collectives and their sizes apart. */
static int dt__coll_tag(const dt_comm *c) {
    uint64_t nseq = (uint64_t)((c->tag_ub - DT__TAG_COLL) >> DT__TAG_HASH_BITS);
    return DT__TAG_COLL + (int)(((c->sig[0] % nseq) << DT__TAG_HASH_BITS) | (dt__sig_hash(c->sig) & ((1u << DT__TAG_HASH_BITS) - 1)));
}

/* The description of the current operation for error messages. */
static void dt__comm_what(const dt_comm *c, char *buf, size_t cap) {
    if ((c->sig[2] & 0xff) == DT__OP_P2P) snprintf(buf, cap, "point-to-point");
    else dt__sig_str(c->sig, buf, cap);
}

/* Records a failure of the current operation: the communicator becomes unusable (every later call
   returns the same error), the other ranks are told where the backend can, and dt_last_error() reads
   "rank R: <operation>: <cause>[; <who is missing>]". cause is the transport's message. */
static dt_result dt__comm_fail(dt_comm *c, dt_result r, const char *cause) {
    char what[160], miss[192] = "";
    const char *pre = dt_result_str(r);
    size_t lp = strlen(pre);
    if (strncmp(cause, pre, lp) == 0 && cause[lp] == ':') cause += lp + 1 + (cause[lp + 1] == ' ');
    dt__comm_what(c, what, sizeof what);
    if ((c->sig[2] & 0xff) != DT__OP_P2P && c->backend->missing) c->backend->missing(c, c->sig[0], miss, sizeof miss);
    snprintf(c->broken_msg, sizeof c->broken_msg, "rank %d: %s: %s%s%s", c->rank, what, cause, miss[0] ? "; " : "", miss);
    c->broken = r;
    if (c->backend->fail) c->backend->fail(c, r, c->broken_msg);
    return dt_set_error(r, "%s", c->broken_msg);
}
/* A call on a communicator that failed before. */
static dt_result dt__comm_broken(const dt_comm *c) {
    return dt_set_error(c->broken, "this communicator failed earlier and cannot be used (destroy it): %s", c->broken_msg);
}

/* Scratch memory kept by the communicator: grown outside the steady state, reused by every call. */
static dt_result dt__comm_scratch(dt_comm *c, size_t bytes, void **out) {
    if (bytes > c->scratch_bytes) {
        void *p = DT_MALLOC(bytes);
        if (!p) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "communicator: no memory for %zu bytes of scratch", bytes);
        DT_FREE(c->scratch);
        c->scratch = p;
        c->scratch_bytes = bytes;
    }
    *out = c->scratch;
    return DT_OK;
}
static dt_result dt__comm_reqs(dt_comm *c, int n, dt_request **out) {
    if (n > c->nreqs) {
        dt_request *p = (dt_request *)DT_MALLOC((size_t)n * sizeof *p);
        if (!p) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "communicator: no memory for %d requests", n);
        DT_FREE(c->reqs);
        c->reqs = p;
        c->nreqs = n;
    }
    *out = c->reqs;
    return DT_OK;
}

/* Element-wise dst = dst (op) src over n elements; MEAN reduces as SUM (the division comes once, after). */
#define DT__REDUCE_LOOP(T)                                                                               \
    do {                                                                                                 \
        T *d = (T *)dst;                                                                                 \
        const T *s = (const T *)src;                                                                     \
        size_t i;                                                                                        \
        if (op == DT_SUM || op == DT_MEAN) for (i = 0; i < n; i++) d[i] = d[i] + s[i];                   \
        else if (op == DT_MAX) for (i = 0; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];                 \
        else for (i = 0; i < n; i++) d[i] = s[i] < d[i] ? s[i] : d[i];                                   \
    } while (0)
static void dt__reduce_into(void *DT__RESTRICT dst, const void *DT__RESTRICT src, size_t n, dt_dtype t, dt_reduce_op op) {
    switch (t) {
    case DT_F32: DT__REDUCE_LOOP(float); break;
    case DT_F64: DT__REDUCE_LOOP(double); break;
    case DT_I32: DT__REDUCE_LOOP(int32_t); break;
    case DT_I64: DT__REDUCE_LOOP(int64_t); break;
    default: DT__REDUCE_LOOP(uint8_t); break;
    }
}
#undef DT__REDUCE_LOOP
/* MEAN's division, the same expression on every path: x / p. */
static void dt__mean_finish(void *buf, size_t n, dt_dtype t, int p) {
    size_t i;
    if (t == DT_F32) { float *x = (float *)buf; for (i = 0; i < n; i++) x[i] = x[i] / (float)p; }
    else if (t == DT_F64) { double *x = (double *)buf; for (i = 0; i < n; i++) x[i] = x[i] / (double)p; }
}

/* ---- point-to-point through the backend, with counters and error reports ---- */

static dt_result dt__isend(dt_comm *c, const void *buf, size_t bytes, int dst, int tag, dt_request *q) {
    dt_result r = c->backend->isend(c, buf, bytes, dst, tag, q);
    if (r != DT_OK) return dt__comm_fail(c, r, dt_last_error());
    c->stats.bytes_sent += bytes;
    c->stats.messages_sent++;
    return DT_OK;
}
static dt_result dt__irecv(dt_comm *c, void *buf, size_t bytes, int src, int tag, dt_request *q) {
    dt_result r = c->backend->irecv(c, buf, bytes, src, tag, q);
    return r != DT_OK ? dt__comm_fail(c, r, dt_last_error()) : DT_OK;
}
/* Waits for q. exact: a receive must bring exactly q->bytes (every message of a collective). */
static dt_result dt__wait(dt_comm *c, dt_request *q, int exact) {
    double t0 = dt_time_now();
    int kind = q->kind, peer = q->peer;
    size_t want = q->bytes;
    dt_result r = c->backend->wait(c, q, t0 + c->timeout);
    c->stats.wait_seconds += dt_time_now() - t0;
    if (r != DT_OK) return dt__comm_fail(c, r, dt_last_error());
    if (kind == DT__REQ_RECV) {
        c->stats.bytes_recv += q->received;
        c->stats.messages_recv++;
        if (exact && q->received != want) {
            char m[160];
            snprintf(m, sizeof m, "rank %d sent %zu bytes where this rank expected %zu: the ranks called it with different sizes",
                     peer, q->received, want);
            return dt__comm_fail(c, DT_ERR_MISMATCH, m);
        }
    }
    return DT_OK;
}
/* After a failure: withdraw the requests still pending, so no rank later touches their buffers. */
static void dt__cancel_all(dt_comm *c, dt_request *q, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (q[i].kind != DT__REQ_NONE && q[i].state != DT__ST_DONE && c->backend->cancel) c->backend->cancel(c, &q[i]);
}

/* One step of an algorithm: send sbytes of sbuf to dst while receiving rbytes from src, in segments of
   c->segment_bytes so the next segment travels while this one is reduced. With reduce set, the data
   received lands in tmp and is reduced into rbuf segment by segment; otherwise it lands in rbuf.
   dst or src < 0 skips that half. A side of 0 bytes still sends one empty message, so that every
   message carries the collective's signature. */
static dt_result dt__step(dt_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes, int src,
                          void *tmp, int reduce, dt_dtype t, dt_reduce_op op) {
    size_t es = dt_dtype_size(t), seg = c->segment_bytes / es * es;   /* whole elements: each segment is reduced alone */
    int ns, nr, tag = dt__coll_tag(c), i;
    dt_request *q = NULL;
    dt_result r;
    if (seg == 0) seg = es;
    ns = dst >= 0 ? (int)(sbytes ? (sbytes + seg - 1) / seg : 1) : 0;
    nr = src >= 0 ? (int)(rbytes ? (rbytes + seg - 1) / seg : 1) : 0;
    if ((r = dt__comm_reqs(c, ns + nr, &q)) != DT_OK) return r;
    memset(q, 0, (size_t)(ns + nr) * sizeof *q);
    for (i = 0; i < nr; i++) {
        size_t off = (size_t)i * seg, len = rbytes - off < seg ? rbytes - off : seg;
        if (rbytes == 0) off = len = 0;
        if ((r = dt__irecv(c, len ? (char *)(reduce ? tmp : rbuf) + off : NULL, len, src, tag, &q[ns + i])) != DT_OK) goto fail;
    }
    for (i = 0; i < ns; i++) {
        size_t off = (size_t)i * seg, len = sbytes - off < seg ? sbytes - off : seg;
        if (sbytes == 0) off = len = 0;
        if ((r = dt__isend(c, len ? (const char *)sbuf + off : NULL, len, dst, tag, &q[i])) != DT_OK) goto fail;
    }
    for (i = 0; i < nr; i++) {
        if ((r = dt__wait(c, &q[ns + i], 1)) != DT_OK) goto fail;
        if (reduce && q[ns + i].bytes)
            dt__reduce_into((char *)rbuf + (size_t)i * seg, (char *)tmp + (size_t)i * seg, q[ns + i].bytes / es, t, op);
    }
    for (i = 0; i < ns; i++)
        if ((r = dt__wait(c, &q[i], 1)) != DT_OK) goto fail;
    return DT_OK;
fail:
    dt__cancel_all(c, q, ns + nr);
    return r;
}

/* Chunk k of n elements split over p ranks: the first n % p chunks have one element more. */
static size_t dt__chunk_off(size_t n, int p, int k) { return (size_t)k * (n / (size_t)p) + ((size_t)k < n % (size_t)p ? (size_t)k : n % (size_t)p); }
static size_t dt__chunk_len(size_t n, int p, int k) { return n / (size_t)p + ((size_t)k < n % (size_t)p ? 1 : 0); }

/* Ring reduce-scatter, in place: afterwards rank r holds chunk r reduced over all ranks. Step s sends
   chunk r - s - 1 to the right and reduces chunk r - s - 2 from the left into its own, so chunk k starts
   at rank k + 1 and picks up one rank per step: the order of the reduction is fixed by the ring. */
static dt_result dt__ring_reduce_scatter(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, void *tmp) {
    int p = c->size, me = c->rank, s;
    int right = (me + 1) % p, left = (me + p - 1) % p;
    size_t es = dt_dtype_size(t);
    for (s = 0; s < p - 1; s++) {
        int ks = ((me - s - 1) % p + p) % p, kr = ((me - s - 2) % p + 2 * p) % p;
        dt_result r = dt__step(c, (char *)buf + dt__chunk_off(n, p, ks) * es, dt__chunk_len(n, p, ks) * es, right,
                               (char *)buf + dt__chunk_off(n, p, kr) * es, dt__chunk_len(n, p, kr) * es, left, tmp, 1, t, op);
        if (r != DT_OK) return r;
    }
    return DT_OK;
}
/* Ring all-gather, in place: rank r starts with chunk r and ends with all of them. */
static dt_result dt__ring_allgather(dt_comm *c, void *buf, size_t n, dt_dtype t) {
    int p = c->size, me = c->rank, s;
    int right = (me + 1) % p, left = (me + p - 1) % p;
    size_t es = dt_dtype_size(t);
    for (s = 0; s < p - 1; s++) {
        int ks = ((me - s) % p + p) % p, kr = ((me - s - 1) % p + p) % p;
        dt_result r = dt__step(c, (char *)buf + dt__chunk_off(n, p, ks) * es, dt__chunk_len(n, p, ks) * es, right,
                               (char *)buf + dt__chunk_off(n, p, kr) * es, dt__chunk_len(n, p, kr) * es, left, NULL, 0, t, DT_SUM);
        if (r != DT_OK) return r;
    }
    return DT_OK;
}
/* tmp: one chunk (n / p + 1 elements) of scratch. */
static dt_result dt__allreduce_ring(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, void *tmp) {
    size_t es = dt_dtype_size(t);
    dt_result r = dt__ring_reduce_scatter(c, buf, n, t, op, tmp);
    if (r == DT_OK && op == DT_MEAN)   /* each rank divides the chunk it owns, so all get the same bits */
        dt__mean_finish((char *)buf + dt__chunk_off(n, c->size, c->rank) * es, dt__chunk_len(n, c->size, c->rank), t, c->size);
    if (r == DT_OK) r = dt__ring_allgather(c, buf, n, t);
    return r;
}

/* Binomial tree over ranks renumbered so the root is 0 (v = (rank - root) mod p). Reduce: in round
   k (mask = 2^k) a rank with bit k set sends its partial result to v - mask and stops; the others add
   what v + mask sends them. Broadcast: the same edges in the other direction. */
static dt_result dt__tree_reduce(dt_comm *c, void *buf, size_t bytes, dt_dtype t, dt_reduce_op op, int root, void *tmp) {
    int p = c->size, v = (c->rank - root + p) % p, mask;
    for (mask = 1; mask < p; mask <<= 1) {
        dt_result r;
        if (v & mask) return dt__step(c, buf, bytes, (v - mask + root) % p, NULL, 0, -1, NULL, 0, t, op);
        if (v + mask < p && (r = dt__step(c, NULL, 0, -1, buf, bytes, (v + mask + root) % p, tmp, 1, t, op)) != DT_OK) return r;
    }
    return DT_OK;
}
static dt_result dt__tree_broadcast(dt_comm *c, void *buf, size_t bytes, int root) {
    int p = c->size, v = (c->rank - root + p) % p, mask = 1;
    dt_result r;
    while (mask < p) {
        if (v & mask) {
            if ((r = dt__step(c, NULL, 0, -1, buf, bytes, (v - mask + root) % p, NULL, 0, DT_U8, DT_SUM)) != DT_OK) return r;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < p && (r = dt__step(c, buf, bytes, (v + mask + root) % p, NULL, 0, -1, NULL, 0, DT_U8, DT_SUM)) != DT_OK)
            return r;
    return DT_OK;
}
/* Naive: the root talks to everyone in rank order; the reduction is x0 op x1 op ... op x(p-1). */
/* mine and tmp: n elements of scratch each, on the root. */
static dt_result dt__naive_reduce(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, int root, void *mine, void *tmp) {
    size_t bytes = n * dt_dtype_size(t);
    int k;
    dt_result r;
    if (c->rank != root) return dt__step(c, buf, bytes, root, NULL, 0, -1, NULL, 0, t, op);
    if (bytes) memcpy(mine, buf, bytes);
    for (k = 0; k < c->size; k++) {
        if (k == root) {
            if (k == 0) continue;   /* buf already is x0 */
            dt__reduce_into(buf, mine, n, t, op);
        } else if (k == 0) {
            if ((r = dt__step(c, NULL, 0, -1, buf, bytes, 0, NULL, 0, t, op)) != DT_OK) return r;
        } else if ((r = dt__step(c, NULL, 0, -1, buf, bytes, k, tmp, 1, t, op)) != DT_OK) return r;
    }
    return DT_OK;
}
static dt_result dt__naive_broadcast(dt_comm *c, void *buf, size_t bytes, int root) {
    int k;
    dt_result r;
    if (c->rank != root) return dt__step(c, NULL, 0, -1, buf, bytes, root, NULL, 0, DT_U8, DT_SUM);
    for (k = 0; k < c->size; k++)
        if (k != root && (r = dt__step(c, buf, bytes, k, NULL, 0, -1, NULL, 0, DT_U8, DT_SUM)) != DT_OK) return r;
    return DT_OK;
}
/* Ring broadcast: a pipelined chain root -> root + 1 -> ...; each segment is passed on as it arrives. */
static dt_result dt__ring_broadcast(dt_comm *c, void *buf, size_t bytes, int root) {
    int p = c->size, me = c->rank, right = (me + 1) % p, left = (me + p - 1) % p;
    size_t seg = c->segment_bytes, off = 0;
    do {
        size_t len = bytes - off < seg ? bytes - off : seg;
        dt_result r;
        if (me != root && (r = dt__step(c, NULL, 0, -1, (char *)buf + off, len, left, NULL, 0, DT_U8, DT_SUM)) != DT_OK) return r;
        if (right != root && (r = dt__step(c, (char *)buf + off, len, right, NULL, 0, -1, NULL, 0, DT_U8, DT_SUM)) != DT_OK) return r;
        off += len;
    } while (off < bytes);
    return DT_OK;
}

/* ---- the public calls ------------------------------------------------------------------------- */

/* Buffers of no elements may be NULL, but the algorithms still offset them (by 0), which C leaves
   undefined for NULL: such buffers get a dummy address, never read or written. */
static void *dt__nonnull(const void *p) {
    static char none[8];
    return p ? (void *)(uintptr_t)p : (void *)none;
}

/* Checks shared by every call; sets the error and returns nonzero when the call cannot go ahead. */
static dt_result dt__comm_check(dt_comm *c, const char *fn, const void *buf, size_t count, dt_dtype t, int peer, const char *peer_name) {
    size_t es = dt_dtype_size(t);
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: communicator is NULL", fn);
    if (c->broken) return dt__comm_broken(c);
    if (es == 0) return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown element type %d: use DT_F32, DT_F64, DT_I32, DT_I64 or DT_U8", fn, (int)t);
    if (count > (SIZE_MAX / 4) / es / (size_t)c->size) return dt_set_error(DT_ERR_INVALID_ARG, "%s: count %zu is too large", fn, count);
    if (count > 0 && !buf) return dt_set_error(DT_ERR_INVALID_ARG, "%s: buffer is NULL with count %zu", fn, count);
    if (peer_name && (peer < 0 || peer >= c->size))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s %d is not a rank of this communicator (0..%d)", fn, peer_name, peer, c->size - 1);
    return DT_OK;
}
static dt_result dt__tag_check(const dt_comm *c, const char *fn, int tag) {
    (void)c;
    if (tag < 0 || tag > DT_TAG_USER_MAX) return dt_set_error(DT_ERR_INVALID_ARG, "%s: tag %d is outside 0..%d", fn, tag, DT_TAG_USER_MAX);
    return DT_OK;
}
/* Starts collective number c->seq + 1: its signature, its counter; the seq is published for reports. */
static void dt__coll_start(dt_comm *c, int kind, size_t count, dt_dtype t, int op, int root, dt_algo algo) {
    DT__ATOMIC_STORE(&c->seq, c->seq + 1);
    dt__comm_begin(c, kind, count, (int)t, op, root, (int)algo);
    DT__ATOMIC_STORE(&c->coll_sig[0], UINT64_MAX);   /* readers that see this ignore the rest */
    DT__ATOMIC_STORE(&c->coll_sig[1], c->sig[1]);
    DT__ATOMIC_STORE(&c->coll_sig[2], c->sig[2]);
    DT__ATOMIC_STORE(&c->coll_sig[0], c->sig[0]);
    c->stats.collectives++;
    if (dt__tls_trace) {   /* closed by the public call's wrapper (dt__trace_close) */
        dt_trace_begin(dt__op_names[kind], "comm");
        dt__trace_arg("bytes", NULL, (int64_t)(count * dt_dtype_size(t)));
        dt__trace_arg("algo", dt_algo_name(algo), 0);
        dt__trace_arg("seq", NULL, (int64_t)c->seq);
    }
}
static dt_result dt__algo_check(const char *fn, dt_algo a) {
    if (a < DT_ALGO_AUTO || a >= DT_ALGO_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown algorithm %d: use DT_ALGO_AUTO, _NAIVE, _RING, _TREE or _NATIVE", fn, (int)a);
    return DT_OK;
}
static dt_algo dt__algo_resolve(const dt_comm *c, dt_algo a, int has_native) {
    if (a <= DT_ALGO_AUTO || a >= DT_ALGO_COUNT) a = c->algo;
    if (a <= DT_ALGO_AUTO || a >= DT_ALGO_COUNT) a = has_native ? DT_ALGO_NATIVE : DT_ALGO_RING;
    if (a == DT_ALGO_NATIVE && !has_native) a = DT_ALGO_RING;
    return a;
}
/* A native collective's traffic, counted by the backend as a ring's would be: factor (p - 1) / p bytes
   per rank each way (factor 2 for all-reduce, 1 for broadcast). */
static void dt__count_native(dt_comm *c, size_t bytes, int factor) {
    uint64_t b = (uint64_t)((double)bytes * factor * (c->size - 1) / c->size);
    c->stats.bytes_sent += b;
    c->stats.bytes_recv += b;
}
static dt_result dt__native(dt_comm *c, dt_result r) { return r == DT_OK ? DT_OK : dt__comm_fail(c, r, dt_last_error()); }

dt_result dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag, dt_request *req) {
    dt_result r = dt__comm_check(c, "dt_comm_isend", buf, count, t, dst, "destination");
    if (r == DT_OK) r = dt__tag_check(c, "dt_comm_isend", tag);
    if (r == DT_OK && !req) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_isend: request is NULL");
    if (r != DT_OK) return r;
    dt__comm_begin(c, DT__OP_P2P, count, (int)t, 0, dst, 0);
    return dt__isend(c, buf, count * dt_dtype_size(t), dst, tag, req);
}
dt_result dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, dt_request *req) {
    dt_result r = dt__comm_check(c, "dt_comm_irecv", buf, count, t, src, "source");
    if (r == DT_OK) r = dt__tag_check(c, "dt_comm_irecv", tag);
    if (r == DT_OK && !req) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_irecv: request is NULL");
    if (r != DT_OK) return r;
    dt__comm_begin(c, DT__OP_P2P, count, (int)t, 0, src, 0);
    return dt__irecv(c, buf, count * dt_dtype_size(t), src, tag, req);
}
dt_result dt_comm_wait(dt_comm *c, dt_request *req) {
    if (!c || !req) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_wait: %s is NULL", c ? "request" : "communicator");
    if (req->kind == DT__REQ_NONE) return DT_OK;   /* completed before, or never posted */
    if (c->broken) { if (c->backend->cancel) c->backend->cancel(c, req); return dt__comm_broken(c); }
    dt__comm_begin(c, DT__OP_P2P, req->bytes, DT_U8, 0, req->peer, 0);
    {
        dt_result r;
        dt_trace_begin(req->kind == DT__REQ_SEND ? "wait send" : "wait recv", "comm");
        dt__trace_arg("peer", NULL, req->peer);
        dt__trace_arg("bytes", NULL, (int64_t)req->bytes);
        dt__trace_arg("tag", NULL, req->tag);
        r = dt__wait(c, req, 0);
        dt_trace_end();
        if (r == DT_OK) req->kind = DT__REQ_NONE;
        return r;
    }
}
dt_result dt_comm_waitall(dt_comm *c, dt_request *reqs, int n) {
    int i;
    dt_result r = DT_OK;
    if (n > 0 && !reqs) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_waitall: requests are NULL");
    for (i = 0; i < n && r == DT_OK; i++) r = dt_comm_wait(c, &reqs[i]);
    if (r != DT_OK && c) dt__cancel_all(c, reqs, n);
    return r;
}
dt_result dt_comm_test(dt_comm *c, dt_request *req, int *done) {
    dt_result r;
    if (!c || !req || !done) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_test: communicator, request and done must not be NULL");
    *done = 0;
    if (req->kind == DT__REQ_NONE) { *done = 1; return DT_OK; }
    if (c->broken) return dt__comm_broken(c);
    if ((r = c->backend->test(c, req, done)) != DT_OK) {
        dt__comm_begin(c, DT__OP_P2P, req->bytes, DT_U8, 0, req->peer, 0);
        return dt__comm_fail(c, r, dt_last_error());
    }
    if (*done) {
        if (req->kind == DT__REQ_RECV) { c->stats.bytes_recv += req->received; c->stats.messages_recv++; }
        req->kind = DT__REQ_NONE;
    }
    return DT_OK;
}
dt_result dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag) {
    dt_request q;
    dt_result r = dt_comm_isend(c, buf, count, t, dst, tag, &q);
    return r == DT_OK ? dt_comm_wait(c, &q) : r;
}
dt_result dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag, size_t *received) {
    dt_request q;
    dt_result r = dt_comm_irecv(c, buf, count, t, src, tag, &q);
    if (r == DT_OK) r = dt_comm_wait(c, &q);
    if (r == DT_OK && received) *received = q.received / dt_dtype_size(t);
    return r;
}

static dt_result dt__coll_barrier(dt_comm *c) {
    int k;
    dt_result r = dt__comm_check(c, "dt_comm_barrier", NULL, 0, DT_U8, 0, NULL);
    dt_algo a;
    if (r != DT_OK) return r;
    a = dt__algo_resolve(c, DT_ALGO_AUTO, c->backend->barrier != NULL);
    dt__coll_start(c, DT__OP_BARRIER, 0, DT_U8, 0, -1, a);
    if (c->size == 1) return DT_OK;
    if (a == DT_ALGO_NATIVE) return dt__native(c, c->backend->barrier(c, dt_time_now() + c->timeout));
    /* dissemination: in round k everyone signals rank + 2^k and hears from rank - 2^k */
    for (k = 1; k < c->size && r == DT_OK; k <<= 1)
        r = dt__step(c, NULL, 0, (c->rank + k) % c->size, NULL, 0, (c->rank - k + c->size) % c->size, NULL, 0, DT_U8, DT_SUM);
    return r;
}

static dt_result dt__coll_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_algo algo) {
    dt_result r = dt__comm_check(c, "dt_comm_broadcast", buf, count, t, root, "root");
    size_t bytes;
    if (r == DT_OK) r = dt__algo_check("dt_comm_broadcast", algo);
    if (r != DT_OK) return r;
    if (!count) buf = dt__nonnull(buf);
    bytes = count * dt_dtype_size(t);
    algo = dt__algo_resolve(c, algo, c->backend->broadcast != NULL);
    dt__coll_start(c, DT__OP_BROADCAST, count, t, 0, root, algo);
    if (c->size == 1) return DT_OK;
    switch (algo) {
    case DT_ALGO_NATIVE:
        return dt__native(c, c->backend->broadcast(c, buf, bytes, root, dt_time_now() + c->timeout));
    case DT_ALGO_NAIVE: return dt__naive_broadcast(c, buf, bytes, root);
    case DT_ALGO_RING: return dt__ring_broadcast(c, buf, bytes, root);
    default: return dt__tree_broadcast(c, buf, bytes, root);
    }
}

static dt_result dt__reduce_args(dt_comm *c, const char *fn, dt_dtype t, dt_reduce_op op) {
    if (op < DT_SUM || op > DT_MIN) return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown reduction %d: use DT_SUM, DT_MEAN, DT_MAX or DT_MIN", fn, (int)op);
    if (op == DT_MEAN && t != DT_F32 && t != DT_F64)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: DT_MEAN needs a floating-point type, not %s: use DT_SUM and divide", fn, dt_dtype_name(t));
    (void)c;
    return DT_OK;
}

static dt_result dt__coll_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, dt_algo algo) {
    dt_result r = dt__comm_check(c, "dt_comm_allreduce", buf, count, t, 0, NULL);
    size_t es, bytes;
    void *s = NULL;
    if (r == DT_OK) r = dt__reduce_args(c, "dt_comm_allreduce", t, op);
    if (r == DT_OK) r = dt__algo_check("dt_comm_allreduce", algo);
    if (r != DT_OK) return r;
    if (!count) buf = dt__nonnull(buf);
    es = dt_dtype_size(t);
    bytes = count * es;
    algo = dt__algo_resolve(c, algo, c->backend->allreduce != NULL);
    dt__coll_start(c, DT__OP_ALLREDUCE, count, t, op, -1, algo);
    if (c->size == 1) return DT_OK;
    switch (algo) {
    case DT_ALGO_NATIVE:
        r = dt__native(c, c->backend->allreduce(c, buf, count, t, op == DT_MEAN ? DT_SUM : op, dt_time_now() + c->timeout));
        break;
    case DT_ALGO_RING:
        if ((r = dt__comm_scratch(c, (count / (size_t)c->size + 1) * es, &s)) == DT_OK) r = dt__allreduce_ring(c, buf, count, t, op, s);
        return r;   /* the ring divides for MEAN itself */
    case DT_ALGO_TREE:
        if ((r = dt__comm_scratch(c, bytes + 1, &s)) == DT_OK) r = dt__tree_reduce(c, buf, bytes, t, op, 0, s);
        if (r == DT_OK) r = dt__tree_broadcast(c, buf, bytes, 0);
        break;
    default:
        if ((r = dt__comm_scratch(c, 2 * bytes + 1, &s)) == DT_OK) r = dt__naive_reduce(c, buf, count, t, op, 0, s, (char *)s + bytes);
        if (r == DT_OK) r = dt__naive_broadcast(c, buf, bytes, 0);
        break;
    }
    if (r == DT_OK && op == DT_MEAN) dt__mean_finish(buf, count, t, c->size);
    return r;
}

static dt_result dt__coll_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, int root, dt_algo algo) {
    dt_result r = dt__comm_check(c, "dt_comm_reduce", buf, count, t, root, "root");
    size_t es, bytes;
    char *s = NULL;
    if (r == DT_OK) r = dt__reduce_args(c, "dt_comm_reduce", t, op);
    if (r == DT_OK) r = dt__algo_check("dt_comm_reduce", algo);
    if (r != DT_OK) return r;
    if (!count) buf = dt__nonnull(buf);
    es = dt_dtype_size(t);
    bytes = count * es;
    algo = dt__algo_resolve(c, algo, 0);   /* no backend has a native reduce: NATIVE and AUTO mean RING */
    dt__coll_start(c, DT__OP_REDUCE, count, t, op, root, algo);
    if (c->size == 1) return DT_OK;
    if ((r = dt__comm_scratch(c, 2 * bytes + es + 1, (void **)&s)) != DT_OK) return r;
    if (algo == DT_ALGO_NAIVE) {
        r = dt__naive_reduce(c, buf, count, t, op, root, s, s + bytes);
    } else if (algo == DT_ALGO_TREE) {   /* non-roots reduce into a copy: their buffer stays as it was */
        char *work = c->rank == root ? (char *)buf : s;
        if (work != buf && bytes) memcpy(work, buf, bytes);
        r = dt__tree_reduce(c, work, bytes, t, op, root, s + bytes);
    } else {   /* ring reduce-scatter on a copy, then every rank sends its reduced chunk to the root */
        int p = c->size, k;
        if (bytes) memcpy(s, buf, bytes);
        r = dt__ring_reduce_scatter(c, s, count, t, op, s + bytes);
        for (k = 0; k < p && r == DT_OK; k++) {
            size_t off = dt__chunk_off(count, p, k) * es, len = dt__chunk_len(count, p, k) * es;
            if (c->rank == root && k == root) { if (len) memcpy((char *)buf + off, s + off, len); }
            else if (c->rank == root) r = dt__step(c, NULL, 0, -1, (char *)buf + off, len, k, NULL, 0, t, op);
            else if (c->rank == k) r = dt__step(c, s + off, len, root, NULL, 0, -1, NULL, 0, t, op);
        }
    }
    if (r == DT_OK && op == DT_MEAN && c->rank == root) dt__mean_finish(buf, count, t, c->size);
    return r;
}

static dt_result dt__coll_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    dt_result r = dt__comm_check(c, "dt_comm_scatter", recv, count, t, root, "root");
    size_t bytes;
    int k;
    if (r == DT_OK && c->rank == root && count > 0 && !send) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_scatter: the root's send buffer is NULL");
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    dt__coll_start(c, DT__OP_SCATTER, count, t, 0, root, DT_ALGO_NAIVE);
    if (c->rank != root) return dt__step(c, NULL, 0, -1, recv, bytes, root, NULL, 0, t, DT_SUM);
    for (k = 0; k < c->size && r == DT_OK; k++) {
        if (k == root) { if (bytes) memmove(recv, (const char *)send + (size_t)k * bytes, bytes); }
        else r = dt__step(c, (const char *)send + (size_t)k * bytes, bytes, k, NULL, 0, -1, NULL, 0, t, DT_SUM);
    }
    return r;
}

static dt_result dt__coll_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    dt_result r = dt__comm_check(c, "dt_comm_gather", send, count, t, root, "root");
    size_t bytes;
    int k;
    if (r == DT_OK && c->rank == root && count > 0 && !recv) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_gather: the root's receive buffer is NULL");
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    dt__coll_start(c, DT__OP_GATHER, count, t, 0, root, DT_ALGO_NAIVE);
    if (c->rank != root) return dt__step(c, send, bytes, root, NULL, 0, -1, NULL, 0, t, DT_SUM);
    for (k = 0; k < c->size && r == DT_OK; k++) {
        if (k == root) { if (bytes) memmove((char *)recv + (size_t)k * bytes, send, bytes); }
        else r = dt__step(c, NULL, 0, -1, (char *)recv + (size_t)k * bytes, bytes, k, NULL, 0, t, DT_SUM);
    }
    return r;
}

static dt_result dt__coll_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    dt_result r = dt__comm_check(c, "dt_comm_allgather", send, count, t, 0, NULL);
    size_t bytes;
    if (r == DT_OK && count > 0 && !recv) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_allgather: receive buffer is NULL");
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    dt__coll_start(c, DT__OP_ALLGATHER, count, t, 0, -1, DT_ALGO_RING);
    if (bytes) memmove((char *)recv + (size_t)c->rank * bytes, send, bytes);
    if (c->size == 1) return DT_OK;
    return dt__ring_allgather(c, recv, count * (size_t)c->size, t);   /* p equal chunks of count */
}

static dt_result dt__coll_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_reduce_op op) {
    dt_result r = dt__comm_check(c, "dt_comm_reduce_scatter", send, count, t, 0, NULL);
    size_t bytes, es;
    char *s = NULL;
    if (r == DT_OK && count > 0 && !recv) r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_reduce_scatter: receive buffer is NULL");
    if (r == DT_OK) r = dt__reduce_args(c, "dt_comm_reduce_scatter", t, op);
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    es = dt_dtype_size(t);
    bytes = count * es;
    dt__coll_start(c, DT__OP_REDUCE_SCATTER, count, t, op, -1, DT_ALGO_RING);
    if ((r = dt__comm_scratch(c, bytes * (size_t)(c->size + 1) + 1, (void **)&s)) != DT_OK) return r;
    if (bytes) memcpy(s, send, bytes * (size_t)c->size);
    if (c->size > 1) r = dt__ring_reduce_scatter(c, s, count * (size_t)c->size, t, op, s + bytes * (size_t)c->size);
    if (r == DT_OK && op == DT_MEAN) dt__mean_finish(s + (size_t)c->rank * bytes, count, t, c->size);
    if (r == DT_OK && bytes) memcpy(recv, s + (size_t)c->rank * bytes, bytes);
    return r;
}

static dt_result dt__coll_neighbor_exchange(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                                            const int *to, int nto, const int *from, int nfrom) {
    dt_result r = dt__comm_check(c, "dt_comm_neighbor_exchange", send, count, t, 0, NULL);
    size_t bytes;
    dt_request *q = NULL;
    int i;
    if (r == DT_OK && (nto < 0 || nfrom < 0 || (nto > 0 && !to) || (nfrom > 0 && !from) || (nfrom > 0 && count > 0 && !recv)))
        r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_neighbor_exchange: a neighbour list or the receive buffer is missing");
    for (i = 0; r == DT_OK && i < nto + nfrom; i++) {
        int k = i < nto ? to[i] : from[i - nto];
        if (k < 0 || k >= c->size)
            r = dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_neighbor_exchange: neighbour %d is not a rank (0..%d)", k, c->size - 1);
    }
    if (r != DT_OK) return r;
    if (!count) { send = dt__nonnull(send); recv = dt__nonnull(recv); }
    bytes = count * dt_dtype_size(t);
    dt__coll_start(c, DT__OP_NEIGHBOR, count, t, 0, -1, DT_ALGO_NAIVE);
    if (nto + nfrom == 0) return DT_OK;   /* a rank with no neighbours has nothing to do (and no requests) */
    if ((r = dt__comm_reqs(c, nto + nfrom, &q)) != DT_OK) return r;
    memset(q, 0, (size_t)(nto + nfrom) * sizeof *q);
    for (i = 0; i < nfrom && r == DT_OK; i++) r = dt__irecv(c, (char *)recv + (size_t)i * bytes, bytes, from[i], dt__coll_tag(c), &q[nto + i]);
    for (i = 0; i < nto && r == DT_OK; i++) r = dt__isend(c, send, bytes, to[i], dt__coll_tag(c), &q[i]);
    for (i = 0; i < nto + nfrom && r == DT_OK; i++) r = dt__wait(c, &q[i], 1);
    if (r != DT_OK) dt__cancel_all(c, q, nto + nfrom);
    return r;
}

/* The public collectives: the bodies above inside the span that dt__coll_start opens. */
dt_result dt_comm_barrier(dt_comm *c) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_barrier(c));
}
dt_result dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_algo algo) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_broadcast(c, buf, count, t, root, algo));
}
dt_result dt_comm_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, int root, dt_algo algo) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_reduce(c, buf, count, t, op, root, algo));
}
dt_result dt_comm_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_reduce_op op, dt_algo algo) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_allreduce(c, buf, count, t, op, algo));
}
dt_result dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_scatter(c, send, recv, count, t, root));
}
dt_result dt_comm_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_gather(c, send, recv, count, t, root));
}
dt_result dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_allgather(c, send, recv, count, t));
}
dt_result dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_reduce_op op) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_reduce_scatter(c, send, recv, count, t, op));
}
dt_result dt_comm_neighbor_exchange(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                                    const int *to, int nto, const int *from, int nfrom) {
    int mark = dt__trace_mark();
    return dt__trace_close(mark, dt__coll_neighbor_exchange(c, send, recv, count, t, to, nto, from, nfrom));
}

/* ---- the local backend: ranks as threads of this process ----------------------------------------
   Messages are rendezvous: isend and irecv each look for their partner in the destination's queues
   under that rank's mutex; whichever arrives second unlinks both and copies the data once, straight
   from the sender's buffer to the receiver's, then marks both requests done and wakes their owners.
   A rank that waits spins briefly only when there are no more ranks than cores, then sleeps on its
   condition variable, so waiting ranks leave the cores to working ones. Native collectives meet at a
   barrier and read each other's buffers directly. Every wait has a deadline, and a rank that has gone
   (its function returned, its communicator failed, its thread exited) wakes everyone waiting for it. */

typedef struct dt__lrank {
    dt__mutex   mu;
    dt__cond    cv;
    dt_request *inbox, *inbox_tail;     /* sends to this rank not yet matched */
    dt_request *posted, *posted_tail;   /* this rank's receives not yet matched */
    int         gone;                   /* atomic: 1 once the rank has left or failed */
    dt_result   gone_result;
    char        gone_msg[320];
    const void *ptr;                    /* native collectives: the buffer this rank published */
    char        pad[64];
} dt__lrank;

typedef struct dt__lworld {
    int        n, refs, spin;           /* spin: ranks <= cores, waiting may poll for a few microseconds */
    dt__mutex  mu;                      /* barrier state and reference count */
    dt__cond   cv;
    uint64_t   bar_gen;                 /* atomic: barriers completed */
    int        bar_count;
    uint64_t  *bar_sig;                 /* [n][3] signatures of the ranks in the current barrier */
    int        bar_bad[2];              /* per generation parity: a rank whose signature differs, or -1 */
    uint64_t   bar_badsig[2][6];        /* ... rank 0's signature and that rank's */
    double     latency, bandwidth;      /* link model; both 0 = off */
    double    *link_free;               /* [2][n]: when rank i's port is next free to send, to receive */
    char      *small;                   /* [2][n][DT__LOCAL_SMALL] slots for small native all-reduces */
    dt__lrank *r;
    dt_comm  **comms;
    char       cause[400];              /* the first failure that was not DT_ERR_PEER: the root cause */
} dt__lworld;

#define DT__LOCAL_SMALL 65536            /* bytes: below, a native all-reduce copies into shared slots */
#define DT__SPIN_SECONDS 50e-6           /* how long a waiting rank polls before it sleeps, when ranks <= cores */
#define DT__YIELD_SECONDS 200e-6         /* ... and how long it yields the core first, when ranks > cores */

static void dt__local_free_world(dt__lworld *W) {
    int i;
    if (!W) return;
    for (i = 0; W->r && i < W->n; i++) { dt__cond_destroy(&W->r[i].cv); dt__mutex_destroy(&W->r[i].mu); }
    dt__cond_destroy(&W->cv);
    dt__mutex_destroy(&W->mu);
    DT_FREE(W->r); DT_FREE(W->comms); DT_FREE(W->bar_sig); DT_FREE(W->link_free); DT_FREE(W->small);
    DT_FREE(W);
}

static int dt__ltag_eq(int a, int b) {
    if (a >= DT__TAG_COLL && b >= DT__TAG_COLL) return ((a - DT__TAG_COLL) >> DT__TAG_HASH_BITS) == ((b - DT__TAG_COLL) >> DT__TAG_HASH_BITS);
    return a == b;
}
static void dt__lq_push(dt_request **head, dt_request **tail, dt_request *q) {
    q->next = NULL;
    if (*tail) (*tail)->next = q; else *head = q;
    *tail = q;
}
static int dt__lq_unlink(dt_request **head, dt_request **tail, dt_request *q) {
    dt_request *prev = NULL, *it;
    for (it = *head; it; prev = it, it = (dt_request *)it->next)
        if (it == q) {
            if (prev) prev->next = it->next; else *head = (dt_request *)it->next;
            if (*tail == it) *tail = prev;
            return 1;
        }
    return 0;
}
/* Sleeps on rank me's condition variable for at most s seconds (its mutex held). */
static void dt__cond_wait_for(dt__cond *c, dt__mutex *m, double s) {
#if DT__HAVE_THREADS
    struct timespec ts;
    double frac;
    timespec_get(&ts, TIME_UTC);
    if (s > 0.05) s = 0.05;   /* waiters wake now and then to look for mismatched ranks */
    if (s < 0.0) s = 0.0;
    frac = (double)ts.tv_nsec + s * 1e9;
    ts.tv_sec += (time_t)(frac / 1e9);
    ts.tv_nsec = (long)(frac - (double)(time_t)(frac / 1e9) * 1e9);
    pthread_cond_timedwait(&c->c, &m->m, &ts);
#else
    (void)c; (void)m; (void)s;
#endif
}
static void dt__local_sleep_until(dt__lworld *W, int me, double t) {
    double now;
    dt__mutex_lock(&W->r[me].mu);
    while ((now = dt_time_now()) < t) dt__cond_wait_for(&W->r[me].cv, &W->r[me].mu, t - now);
    dt__mutex_unlock(&W->r[me].mu);
}
/* Polls *state for a few microseconds when spinning pays (no more ranks than cores); otherwise yields
   once. Returns 1 when it saw want. */
static void dt__cpu_relax(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#endif
}
/* One round of polling before a wait goes to sleep; returns 0 when the polling time since start is
   spent. With no more ranks than cores the waiter spins on its own core; with more, it yields the core
   to a rank that has work, and only keeps doing so for a short while. */
static int dt__local_keep_polling(const dt__lworld *W, double start) {
    int i;
    if (!W->spin) { sched_yield(); return dt_time_now() - start < DT__YIELD_SECONDS; }
    for (i = 0; i < 64; i++) dt__cpu_relax();
    return dt_time_now() - start < DT__SPIN_SECONDS;
}
static int dt__local_spin(const dt__lworld *W, const volatile int *state, int want) {
    double start = dt_time_now();
    while (DT__ATOMIC_LOAD(state) != want)
        if (!dt__local_keep_polling(W, start)) return 0;
    return 1;
}

static void dt__local_complete(dt__lworld *W, dt_request *q) {
    dt__lrank *o = &W->r[q->owner];
    dt__mutex_lock(&o->mu);
    DT__ATOMIC_STORE(&q->state, DT__ST_DONE);
    dt__cond_broadcast(&o->cv);
    dt__mutex_unlock(&o->mu);
}
/* s and r are matched and unlinked: check that they belong together, copy, complete both. */
static void dt__local_deliver(dt__lworld *W, dt_request *s, dt_request *r) {
    if (s->tag >= DT__TAG_COLL && (s->sig[0] != r->sig[0] || s->sig[1] != r->sig[1] || s->sig[2] != r->sig[2])) {
        memcpy(s->impl, r->sig, sizeof r->sig);   /* each side keeps the other's signature for its report */
        memcpy(r->impl, s->sig, sizeof s->sig);
        s->error = r->error = DT_ERR_MISMATCH;
    } else if (s->bytes > r->bytes) {
        s->impl[3] = r->bytes;
        r->impl[3] = s->bytes;
        s->error = r->error = DT_ERR_MISMATCH;
    } else {
        if (s->bytes) memcpy(r->rbuf, s->sbuf, s->bytes);
        r->received = s->bytes;
        if (W->latency > 0 || W->bandwidth > 0) r->not_before = s->not_before + W->latency;
    }
    dt__local_complete(W, s);
    dt__local_complete(W, r);
}

/* Rank k has gone. When it failed only because another rank did, the report names the root cause
   rather than nesting one report in the next. */
static dt_result dt__local_gone_error(dt__lworld *W, int k) {
    const char *m = W->r[k].gone_msg;
    if (W->r[k].gone_result == DT_OK) return dt_set_error(DT_ERR_PEER, "rank %d has finished (its function returned DT_OK) and will not send or receive any more", k);
    if (W->r[k].gone_result == DT_ERR_PEER) {
        dt__mutex_lock(&W->mu);
        dt_set_error(DT_ERR_PEER, "rank %d has failed because another did%s%s", k, W->cause[0] ? "; the first failure: " : "", W->cause);
        dt__mutex_unlock(&W->mu);
        return DT_ERR_PEER;
    }
    return dt_set_error(DT_ERR_PEER, "rank %d has failed (%s)%s%s", k, dt_result_str(W->r[k].gone_result), m[0] ? ": " : "", m);
}

static dt_result dt__local_isend(dt_comm *c, const void *buf, size_t bytes, int dst, int tag, dt_request *q) {
    dt__lworld *W = (dt__lworld *)c->impl;
    dt__lrank *d = &W->r[dst];
    dt_request *it;
    memset(q, 0, sizeof *q);
    q->kind = DT__REQ_SEND; q->peer = dst; q->tag = tag; q->owner = c->rank; q->bytes = bytes; q->sbuf = buf;
    memcpy(q->sig, c->sig, sizeof q->sig);
    if (DT__ATOMIC_LOAD(&d->gone) && dst != c->rank) { q->kind = DT__REQ_NONE; return dt__local_gone_error(W, dst); }
    dt__mutex_lock(&d->mu);
    if ((W->latency > 0 || W->bandwidth > 0) && dst != c->rank) {
        /* the link model: each rank has one full-duplex port to a switch. The message waits until the
           sender's port is free to send and the receiver's to receive, occupies both for bytes /
           bandwidth, and arrives latency seconds after it has left. (The receiver's slot is taken under
           its mutex, held here; the sender's is only ever touched by the sender.) */
        double *out = &W->link_free[c->rank], *in = &W->link_free[W->n + dst], start = dt_time_now();
        if (*out > start) start = *out;
        if (*in > start) start = *in;
        *out = *in = start + (W->bandwidth > 0 ? (double)bytes / W->bandwidth : 0.0);
        q->not_before = *out;
    }
    for (it = d->posted; it; it = (dt_request *)it->next)
        if (it->peer == c->rank && dt__ltag_eq(it->tag, tag)) break;
    if (it) {
        dt__lq_unlink(&d->posted, &d->posted_tail, it);
        DT__ATOMIC_STORE(&it->state, DT__ST_MATCHED);
        DT__ATOMIC_STORE(&q->state, DT__ST_MATCHED);
        dt__mutex_unlock(&d->mu);
        dt__local_deliver(W, q, it);
        return DT_OK;
    }
    dt__lq_push(&d->inbox, &d->inbox_tail, q);
    dt__mutex_unlock(&d->mu);
    return DT_OK;
}

static dt_result dt__local_irecv(dt_comm *c, void *buf, size_t bytes, int src, int tag, dt_request *q) {
    dt__lworld *W = (dt__lworld *)c->impl;
    dt__lrank *me = &W->r[c->rank];
    dt_request *it;
    memset(q, 0, sizeof *q);
    q->kind = DT__REQ_RECV; q->peer = src; q->tag = tag; q->owner = c->rank; q->bytes = bytes; q->rbuf = buf;
    memcpy(q->sig, c->sig, sizeof q->sig);
    dt__mutex_lock(&me->mu);
    for (it = me->inbox; it; it = (dt_request *)it->next)
        if (it->owner == src && dt__ltag_eq(it->tag, tag)) break;
    if (it) {
        dt__lq_unlink(&me->inbox, &me->inbox_tail, it);
        DT__ATOMIC_STORE(&it->state, DT__ST_MATCHED);
        DT__ATOMIC_STORE(&q->state, DT__ST_MATCHED);
        dt__mutex_unlock(&me->mu);
        dt__local_deliver(W, it, q);
        return DT_OK;
    }
    dt__lq_push(&me->posted, &me->posted_tail, q);
    dt__mutex_unlock(&me->mu);
    return DT_OK;
}

/* Withdraws q if no one has matched it yet; if its copy is under way, waits for the copy to finish. */
static void dt__local_cancel(dt_comm *c, dt_request *q) {
    dt__lworld *W = (dt__lworld *)c->impl;
    dt__lrank *holder = &W->r[q->kind == DT__REQ_SEND ? q->peer : q->owner], *me = &W->r[q->owner];
    int st;
    if (q->kind == DT__REQ_NONE) return;
    dt__mutex_lock(&holder->mu);
    st = DT__ATOMIC_LOAD(&q->state);
    if (st == DT__ST_POSTED) {
        if (q->kind == DT__REQ_SEND) dt__lq_unlink(&holder->inbox, &holder->inbox_tail, q);
        else dt__lq_unlink(&holder->posted, &holder->posted_tail, q);
        DT__ATOMIC_STORE(&q->state, DT__ST_CANCELLED);
    }
    dt__mutex_unlock(&holder->mu);
    if (st != DT__ST_MATCHED) return;
    dt__mutex_lock(&me->mu);
    while (DT__ATOMIC_LOAD(&q->state) != DT__ST_DONE) dt__cond_wait_for(&me->cv, &me->mu, 0.01);
    dt__mutex_unlock(&me->mu);
}

static dt_result dt__mismatch_error(int peer, const uint64_t *mine, const uint64_t *theirs) {
    char a[128], b[128];
    dt__sig_str(mine, a, sizeof a);
    dt__sig_str(theirs, b, sizeof b);
    return dt_set_error(DT_ERR_MISMATCH, "rank %d called %s where this rank called %s: every rank must make the same collective calls in the same order, with the same count, type, op and root",
                        peer, b, a);
}
/* Whether rank k is in this rank's current collective (same sequence number) with another signature,
   which it then copies to other. Reads k's published signature as a seqlock: no lock needed. */
static int dt__local_peer_differs(const dt__lworld *W, const dt_comm *c, int k, uint64_t *other) {
    const dt_comm *o = W->comms[k];
    uint64_t s0, s1, s2;
    if (!o || k == c->rank || (c->sig[2] & 0xff) == DT__OP_P2P) return 0;
    if ((s0 = DT__ATOMIC_LOAD(&o->coll_sig[0])) != c->sig[0]) return 0;
    s1 = DT__ATOMIC_LOAD(&o->coll_sig[1]);
    s2 = DT__ATOMIC_LOAD(&o->coll_sig[2]);
    if (DT__ATOMIC_LOAD(&o->coll_sig[0]) != s0 || (s1 == c->sig[1] && s2 == c->sig[2])) return 0;
    other[0] = s0; other[1] = s1; other[2] = s2;
    return 1;
}

/* The report for a request that completed with an error. */
static dt_result dt__local_req_error(dt_request *q) {
    if (q->impl[3]) {
        if (q->kind == DT__REQ_RECV)
            return dt_set_error(DT_ERR_MISMATCH, "rank %d sent %llu bytes, more than the %zu this receive accepts", q->peer, (unsigned long long)q->impl[3], q->bytes);
        return dt_set_error(DT_ERR_MISMATCH, "rank %d accepts only %llu bytes and this message has %zu", q->peer, (unsigned long long)q->impl[3], q->bytes);
    }
    return dt__mismatch_error(q->peer, q->sig, q->impl);
}
static dt_result dt__local_finish(dt__lworld *W, int me, dt_request *q) {
    if (q->not_before > 0 && dt_time_now() < q->not_before) dt__local_sleep_until(W, me, q->not_before);
    if (q->error != DT_OK) { q->kind = DT__REQ_NONE; return dt__local_req_error(q); }
    return DT_OK;
}

static dt_result dt__local_wait(dt_comm *c, dt_request *q, double deadline) {
    dt__lworld *W = (dt__lworld *)c->impl;
    dt__lrank *me = &W->r[c->rank];
    if (DT__ATOMIC_LOAD(&q->state) == DT__ST_CANCELLED) return dt_set_error(DT_ERR_STATE, "the request was cancelled");
    if (DT__ATOMIC_LOAD(&q->state) != DT__ST_DONE && !dt__local_spin(W, &q->state, DT__ST_DONE)) {
        dt__mutex_lock(&me->mu);
        while (DT__ATOMIC_LOAD(&q->state) != DT__ST_DONE) {
            double now = dt_time_now();
            int gone = q->peer != c->rank && DT__ATOMIC_LOAD(&W->r[q->peer].gone);
            uint64_t other[3];
            int differs = q->tag >= DT__TAG_COLL && dt__local_peer_differs(W, c, q->peer, other);
            if (gone || differs || now >= deadline) {
                dt__mutex_unlock(&me->mu);
                dt__local_cancel(c, q);
                if (DT__ATOMIC_LOAD(&q->state) == DT__ST_DONE) return dt__local_finish(W, c->rank, q);   /* it made it after all */
                if (gone) return dt__local_gone_error(W, q->peer);
                if (differs) return dt__mismatch_error(q->peer, c->sig, other);
                return dt_set_error(DT_ERR_TIMEOUT, "no %s rank %d within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)",
                                    q->kind == DT__REQ_SEND ? "receive was posted by" : "message came from", q->peer, c->timeout);
            }
            dt__cond_wait_for(&me->cv, &me->mu, deadline - now);
        }
        dt__mutex_unlock(&me->mu);
    }
    return dt__local_finish(W, c->rank, q);
}

static dt_result dt__local_test(dt_comm *c, dt_request *q, int *done) {
    dt__lworld *W = (dt__lworld *)c->impl;
    *done = 0;
    if (DT__ATOMIC_LOAD(&q->state) == DT__ST_DONE) {
        if (q->not_before > 0 && dt_time_now() < q->not_before) return DT_OK;
        *done = 1;
        return q->error != DT_OK ? dt__local_req_error(q) : DT_OK;
    }
    if (q->peer != c->rank && DT__ATOMIC_LOAD(&W->r[q->peer].gone)) {
        dt__local_cancel(c, q);
        if (DT__ATOMIC_LOAD(&q->state) != DT__ST_DONE) return dt__local_gone_error(W, q->peer);
    }
    return DT_OK;
}

/* The rank whose departure keeps the barrier from completing, or -1. W->mu held. */
static int dt__local_gone_rank(dt__lworld *W, int me) {
    int k;
    for (k = 0; k < W->n; k++)
        if (k != me && DT__ATOMIC_LOAD(&W->r[k].gone)) return k;
    return -1;
}
/* The barrier of native collectives. The last rank to arrive compares everyone's signature before it
   releases the others, so a mismatch is reported by every rank, the same way. A rank that gives up
   (a rank gone, another collective, the timeout) withdraws its arrival, so the barrier can never
   complete without it: the others must not go on to read its buffer. */
static dt_result dt__local_barrier(dt_comm *c, double deadline) {
    dt__lworld *W = (dt__lworld *)c->impl;
    int n = W->n, me = c->rank, k;
    uint64_t gen, other[3];
    double t0 = dt_time_now();
    dt_result r = DT_OK;
    dt__mutex_lock(&W->mu);
    gen = W->bar_gen;
    if ((k = dt__local_gone_rank(W, me)) >= 0) { dt__mutex_unlock(&W->mu); return dt__local_gone_error(W, k); }
    memcpy(&W->bar_sig[(size_t)me * 3], c->sig, 3 * sizeof(uint64_t));
    if (++W->bar_count == n) {
        int bad = -1;
        for (k = 1; k < n && bad < 0; k++)
            if (memcmp(&W->bar_sig[(size_t)k * 3], W->bar_sig, 3 * sizeof(uint64_t)) != 0) bad = k;
        W->bar_bad[gen & 1] = bad;
        if (bad >= 0) {
            memcpy(W->bar_badsig[gen & 1], W->bar_sig, 3 * sizeof(uint64_t));
            memcpy(W->bar_badsig[gen & 1] + 3, &W->bar_sig[(size_t)bad * 3], 3 * sizeof(uint64_t));
        }
        W->bar_count = 0;
        DT__ATOMIC_STORE(&W->bar_gen, gen + 1);
        dt__cond_broadcast(&W->cv);
        dt__mutex_unlock(&W->mu);
    } else {
        dt__mutex_unlock(&W->mu);
        while (DT__ATOMIC_LOAD(&W->bar_gen) == gen && dt__local_keep_polling(W, t0)) {}
        dt__mutex_lock(&W->mu);
        while (DT__ATOMIC_LOAD(&W->bar_gen) == gen) {
            double now = dt_time_now();
            int gone = dt__local_gone_rank(W, me), bad = -1;
            for (k = 0; gone < 0 && bad < 0 && k < n; k++)
                if (dt__local_peer_differs(W, c, k, other)) bad = k;
            if (gone >= 0 || bad >= 0 || now >= deadline) {
                W->bar_count--;
                dt__mutex_unlock(&W->mu);   /* before the reports, which may take it */
                c->stats.wait_seconds += dt_time_now() - t0;
                if (gone >= 0) return dt__local_gone_error(W, gone);
                if (bad >= 0) return dt__mismatch_error(bad, c->sig, other);
                return dt_set_error(DT_ERR_TIMEOUT, "not every rank arrived within %.3g s (the communicator's timeout; set it with --timeout, DT_COMM_TIMEOUT or dt_comm_desc.timeout)", c->timeout);
            }
            dt__cond_wait_for(&W->cv, &W->mu, deadline - now);
        }
        dt__mutex_unlock(&W->mu);
    }
    c->stats.wait_seconds += dt_time_now() - t0;
    if (W->bar_bad[gen & 1] >= 0) {
        char a[128], b[128];
        dt__sig_str(W->bar_badsig[gen & 1], a, sizeof a);
        dt__sig_str(W->bar_badsig[gen & 1] + 3, b, sizeof b);
        r = dt_set_error(DT_ERR_MISMATCH, "rank 0 called %s but rank %d called %s: every rank must make the same collective calls in the same order, with the same count, type, op and root",
                         a, W->bar_bad[gen & 1], b);
    }
    return r;
}

static dt_result dt__local_broadcast(dt_comm *c, void *buf, size_t bytes, int root, double deadline) {
    dt__lworld *W = (dt__lworld *)c->impl;
    dt_result r;
    if (W->latency > 0 || W->bandwidth > 0) return dt__tree_broadcast(c, buf, bytes, root);   /* messages feel the link model */
    dt__count_native(c, bytes, 1);
    W->r[c->rank].ptr = buf;
    if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
    if (c->rank != root && bytes) memcpy(buf, W->r[root].ptr, bytes);
    return dt__local_barrier(c, deadline);   /* the root's buffer is read until everyone passes here */
}

/* Native all-reduce. Small: each rank copies its data into its slot (double-buffered by barrier
   generation), one barrier, then every rank reduces all slots in rank order. Large: after a barrier
   every buffer is published; rank r reduces slice r of all of them in rank order and writes the result
   into slice r of every buffer (nobody else reads or writes slice r), and a second barrier ends it:
   each byte is read once and written once per rank, no staging copy. Either way element i is
   ((x0 op x1) op x2) ..., the order NAIVE uses too. (A rank that gives up at the second barrier after
   the timeout returns while a stalled rank may still write its slice into that buffer later.) */
static dt_result dt__local_allreduce(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, double deadline) {
    dt__lworld *W = (dt__lworld *)c->impl;
    size_t es = dt_dtype_size(t), bytes = n * es;
    int p = W->n, me = c->rank, k;
    dt_result r;
    if (W->latency > 0 || W->bandwidth > 0) {
        /* messages feel the link model: the ring, or the binomial tree where the model makes it faster
           (2 ceil(log2 p) messages of the whole buffer against the ring's 2 (p - 1) of a p-th: short ones) */
        void *s = NULL;
        double per = W->bandwidth > 0 ? (double)bytes / W->bandwidth : 0.0;
        int lg = 0;
        while ((1 << lg) < p) lg++;
        if (2.0 * lg * (W->latency + per) < 2.0 * (p - 1) * (W->latency + per / p)) {
            if ((r = dt__comm_scratch(c, bytes + 1, &s)) != DT_OK) return r;
            if ((r = dt__tree_reduce(c, buf, bytes, t, op, 0, s)) != DT_OK) return r;
            return dt__tree_broadcast(c, buf, bytes, 0);
        }
        if ((r = dt__comm_scratch(c, (n / (size_t)p + 1) * es, &s)) != DT_OK) return r;
        return dt__allreduce_ring(c, buf, n, t, op, s);
    }
    dt__count_native(c, bytes, 2);
    if (bytes <= DT__LOCAL_SMALL) {
        uint64_t gen = DT__ATOMIC_LOAD(&W->bar_gen);
        char *slots = W->small + (size_t)(gen & 1) * (size_t)p * DT__LOCAL_SMALL;
        if (bytes) memcpy(slots + (size_t)me * DT__LOCAL_SMALL, buf, bytes);
        if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
        if (bytes) memcpy(buf, slots, bytes);
        for (k = 1; k < p; k++) dt__reduce_into(buf, slots + (size_t)k * DT__LOCAL_SMALL, n, t, op);
        return DT_OK;
    }
    W->r[me].ptr = buf;
    if ((r = dt__local_barrier(c, deadline)) != DT_OK) return r;
    {
        size_t lo = dt__chunk_off(n, p, me), len = dt__chunk_len(n, p, me), i;
        double tmp[1024];   /* 8 KiB: a block of any element type */
        size_t blk = sizeof tmp / es;
        for (i = 0; i < len; i += blk) {
            size_t m = len - i < blk ? len - i : blk, off = (lo + i) * es;
            memcpy(tmp, (const char *)W->r[0].ptr + off, m * es);
            for (k = 1; k < p; k++) dt__reduce_into(tmp, (const char *)W->r[k].ptr + off, m, t, op);
            for (k = 0; k < p; k++) memcpy((char *)W->r[k].ptr + off, tmp, m * es);   /* only this rank touches slice me */
        }
    }
    return dt__local_barrier(c, deadline);   /* every slice of every buffer is written when all pass here */
}

static void dt__local_missing(dt_comm *c, uint64_t seq, char *msg, size_t cap) {
    dt__lworld *W = (dt__lworld *)c->impl;
    size_t len = 0;
    int k, any = 0;
    msg[0] = 0;
    for (k = 0; k < W->n && len + 48 < cap; k++) {
        uint64_t s;
        int n;
        if (k == c->rank) continue;
        if (!W->comms[k]) continue;
        s = DT__ATOMIC_LOAD(&W->comms[k]->seq);
        if (DT__ATOMIC_LOAD(&W->r[k].gone)) n = snprintf(msg + len, cap - len, "%s%d (%s)", any ? ", " : "ranks not in it: ", k, W->r[k].gone_result == DT_OK ? "finished" : "failed");
        else if (s < seq) n = snprintf(msg + len, cap - len, "%s%d (at #%llu)", any ? ", " : "ranks not in it: ", k, (unsigned long long)s);
        else continue;
        if (n > 0) len += (size_t)n;
        any = 1;
    }
}

/* The rank has gone (left, or its communicator failed): mark it, withdraw its pending requests, wake
   everyone so that waits for it end now. */
static void dt__local_gone(dt_comm *c, dt_result res, const char *msg) {
    dt__lworld *W = (dt__lworld *)c->impl;
    dt__lrank *me = &W->r[c->rank];
    dt_request *it, *next;
    int k;
    if (DT__ATOMIC_LOAD(&me->gone)) return;
    dt__mutex_lock(&W->mu);   /* the root cause is written before anyone can see this rank gone */
    if (res != DT_OK && res != DT_ERR_PEER && !W->cause[0]) {   /* named by its rank, unless the message does it */
        if (msg && strncmp(msg, "rank ", 5) == 0) snprintf(W->cause, sizeof W->cause, "%.300s (%s)", msg, dt_result_str(res));
        else snprintf(W->cause, sizeof W->cause, "rank %d: %.300s (%s)", c->rank, msg ? msg : "", dt_result_str(res));
    }
    dt__mutex_unlock(&W->mu);
    dt__mutex_lock(&me->mu);
    if (me->gone) { dt__mutex_unlock(&me->mu); return; }
    me->gone_result = res;
    snprintf(me->gone_msg, sizeof me->gone_msg, "%s", msg ? msg : "");
    DT__ATOMIC_STORE(&me->gone, 1);
    for (it = me->posted; it; it = next) { next = (dt_request *)it->next; DT__ATOMIC_STORE(&it->state, DT__ST_CANCELLED); }
    me->posted = me->posted_tail = NULL;
    dt__mutex_unlock(&me->mu);
    for (k = 0; k < W->n; k++) {
        dt__lrank *o = &W->r[k];
        dt__mutex_lock(&o->mu);
        for (it = o->inbox; it; it = next) {
            next = (dt_request *)it->next;
            if (it->owner == c->rank) { dt__lq_unlink(&o->inbox, &o->inbox_tail, it); DT__ATOMIC_STORE(&it->state, DT__ST_CANCELLED); }
        }
        dt__cond_broadcast(&o->cv);
        dt__mutex_unlock(&o->mu);
    }
    dt__mutex_lock(&W->mu);
    dt__cond_broadcast(&W->cv);
    dt__mutex_unlock(&W->mu);
}
static void dt__local_fail(dt_comm *c, dt_result r, const char *msg) { dt__local_gone(c, r, msg); }

static void dt__local_destroy(dt_comm *c) {
    dt__lworld *W = (dt__lworld *)c->impl;
    int last;
    dt__mutex_lock(&W->mu);
    last = --W->refs == 0;
    W->comms[c->rank] = NULL;
    dt__mutex_unlock(&W->mu);
    if (last) dt__local_free_world(W);
}

static const dt_comm_backend dt__local_backend = {
    "local", dt__local_isend, dt__local_irecv, dt__local_wait, dt__local_test, dt__local_cancel,
    dt__local_barrier, dt__local_allreduce, dt__local_broadcast, dt__local_missing, dt__local_fail, dt__local_destroy};
static const dt_comm_backend dt__self_backend = {
    "self", dt__local_isend, dt__local_irecv, dt__local_wait, dt__local_test, dt__local_cancel,
    dt__local_barrier, dt__local_allreduce, dt__local_broadcast, dt__local_missing, dt__local_fail, dt__local_destroy};

/* Fills the fields every backend shares from desc (and the environment). */
static dt_result dt__comm_init(dt_comm *c, const dt_comm_desc *desc, const char *fn) {
    const char *env = getenv("DT_COMM_TIMEOUT");
    c->algo = desc ? desc->algo : DT_ALGO_AUTO;
    c->timeout = desc && desc->timeout > 0 ? desc->timeout : DT_TIMEOUT_DEFAULT;
    if ((!desc || desc->timeout <= 0) && env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (*end || !(v > 0)) return dt_set_error(DT_ERR_INVALID_ARG, "%s: DT_COMM_TIMEOUT='%s' is not a positive number of seconds", fn, env);
        c->timeout = v;
    }
    c->segment_bytes = desc && desc->segment_bytes ? desc->segment_bytes : (size_t)256 << 10;
    if (c->algo < DT_ALGO_AUTO || c->algo >= DT_ALGO_COUNT) return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown algorithm %d", fn, (int)c->algo);
    if (desc && (desc->timeout < 0 || desc->link_latency < 0 || desc->link_bandwidth < 0 || !(desc->timeout == desc->timeout)))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: timeout, link latency and link bandwidth must not be negative", fn);
    return DT_OK;
}

dt_result dt_comm_create_local(dt_comm **out, int n, const dt_comm_desc *desc) {
    dt__lworld *W;
    int i, cores = 1;
    dt_result r = DT_OK;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_local: out is NULL");
    if (n < 1 || n > 4096) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_local: %d ranks; use 1 to 4096", n);
    if (n > 1 && !DT__HAVE_THREADS) return dt_set_error(DT_ERR_UNSUPPORTED, "dt_comm_create_local: %d local ranks need threads; this build has DT_NO_THREADS", n);
    for (i = 0; i < n; i++) out[i] = NULL;
    W = (dt__lworld *)DT_MALLOC(sizeof *W);
    if (!W) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_local: no memory");
    memset(W, 0, sizeof *W);
    W->n = n;
    W->r = (dt__lrank *)DT_MALLOC((size_t)n * sizeof *W->r);
    W->comms = (dt_comm **)DT_MALLOC((size_t)n * sizeof *W->comms);
    W->bar_sig = (uint64_t *)DT_MALLOC((size_t)n * 3 * sizeof *W->bar_sig);
    W->small = (char *)DT_MALLOC((size_t)2 * (size_t)n * DT__LOCAL_SMALL);
    if (desc && (desc->link_latency > 0 || desc->link_bandwidth > 0)) {
        W->latency = desc->link_latency;
        W->bandwidth = desc->link_bandwidth;
        W->link_free = (double *)DT_MALLOC((size_t)2 * (size_t)n * sizeof(double));
        if (W->link_free) memset(W->link_free, 0, (size_t)2 * (size_t)n * sizeof(double));
    }
    if (!W->r || !W->comms || !W->bar_sig || !W->small || ((W->latency > 0 || W->bandwidth > 0) && !W->link_free)) {
        DT_FREE(W->r); W->r = NULL;
        dt__local_free_world(W);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_local: no memory for %d ranks", n);
    }
    memset(W->r, 0, (size_t)n * sizeof *W->r);
    memset(W->comms, 0, (size_t)n * sizeof *W->comms);
    dt__mutex_init(&W->mu);
    dt__cond_init(&W->cv);
    for (i = 0; i < n; i++) { dt__mutex_init(&W->r[i].mu); dt__cond_init(&W->r[i].cv); }
#if DT__HAVE_OMP
    cores = omp_get_num_procs();
#elif DT__HAVE_THREADS && defined(_SC_NPROCESSORS_ONLN)
    cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
#endif
    W->spin = n <= cores;
    for (i = 0; i < n && r == DT_OK; i++) {
        dt_comm *c = (dt_comm *)DT_MALLOC(sizeof *c);
        if (!c) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_comm_create_local: no memory"); break; }
        memset(c, 0, sizeof *c);
        c->rank = i;
        c->size = n;
        c->backend = n == 1 ? &dt__self_backend : &dt__local_backend;
        c->impl = W;
        c->tag_ub = 0x7fffffff;
        W->comms[i] = c;
        W->refs++;
        r = dt__comm_init(c, desc, "dt_comm_create_local");
    }
    if (r != DT_OK) {
        for (i = 0; i < n; i++) { if (W->comms[i]) DT_FREE(W->comms[i]); }
        dt__local_free_world(W);
        return r;
    }
    for (i = 0; i < n; i++) out[i] = W->comms[i];
    return DT_OK;
}

dt_result dt_comm_create_self(dt_comm **out, const dt_comm_desc *desc) {
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_create_self: out is NULL");
    return dt_comm_create_local(out, 1, desc);
}

void dt_comm_leave(dt_comm *c, dt_result r, const char *msg) {
    if (c && c->backend && c->backend->destroy == dt__local_destroy) dt__local_gone(c, r, msg);
    else if (c && r != DT_OK && !c->broken && c->backend->fail) c->backend->fail(c, r, msg ? msg : "");
}

void dt_comm_destroy(dt_comm *c) {
    if (!c) return;
    DT_FREE(c->scratch);
    DT_FREE(c->reqs);
    if (c->backend && c->backend->destroy) c->backend->destroy(c);
    DT_FREE(c);
}

/* ---- the launcher ------------------------------------------------------------------------------ */

int dt_current_rank(void) { return dt__tls_rank; }

static dt_result dt__parse_num(const char *flag, const char *v, double lo, double *out) {
    char *end;
    double x, mul = 1.0;
    if (!v) return dt_set_error(DT_ERR_INVALID_ARG, "%s needs a value", flag);
    x = strtod(v, &end);
    if (end != v && *end && !end[1]) {
        if (*end == 'K' || *end == 'k') { mul = 1e3; end++; }
        else if (*end == 'M' || *end == 'm') { mul = 1e6; end++; }
        else if (*end == 'G' || *end == 'g') { mul = 1e9; end++; }
    }
    if (end == v || *end || !(x * mul >= lo) || x * mul > 1e18)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s '%s' is not a number >= %g", flag, v, lo);
    *out = x * mul;
    return DT_OK;
}

dt_result dt_launch_parse(int *argc, char **argv, dt_launch_desc *d) {
    int i, o = 1;
    if (!argc || !argv || !d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch_parse: argc, argv and desc must not be NULL");
    for (i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        double x;
        dt_result r = DT_OK;
        if (strcmp(a, "--ranks") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 4096 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--ranks '%s': use a whole number from 1 to 4096", v);
            if (r == DT_OK) d->ranks = (int)x;   /* only a checked value: (int) of 5e9 is undefined */
            i++;
        } else if (strcmp(a, "--threads-per-rank") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1024 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--threads-per-rank '%s': use a whole number from 1 to 1024", v);
            if (r == DT_OK) d->threads_per_rank = (int)x;
            i++;
        } else if (strcmp(a, "--algo") == 0) {
            if (!v) r = dt_set_error(DT_ERR_INVALID_ARG, "--algo needs a value: naive, ring, tree or native");
            else r = dt_algo_parse(v, &d->comm.algo);
            i++;
        } else if (strcmp(a, "--timeout") == 0) {
            if ((r = dt__parse_num(a, v, 1e-3, &x)) == DT_OK) d->comm.timeout = x;
            i++;
        } else if (strcmp(a, "--link-latency") == 0) {
            if ((r = dt__parse_num(a, v, 0, &x)) == DT_OK) d->comm.link_latency = x;
            i++;
        } else if (strcmp(a, "--link-bandwidth") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK) d->comm.link_bandwidth = x;
            i++;
        } else if (strcmp(a, "--log-all-ranks") == 0) {
            d->log_all_ranks = 1;
        } else if (strcmp(a, "--trace") == 0) {
            if (!v || !*v) r = dt_set_error(DT_ERR_INVALID_ARG, "--trace needs a file name, e.g. --trace run.json");
            d->trace_path = v; i++;
        } else if (strcmp(a, "--trace-max-events") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1e12 || x != (double)(int64_t)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--trace-max-events '%s': use a whole number from 1 to 1e12", v);
            if (r == DT_OK) d->trace_max_events = (int64_t)x;
            i++;
        } else {
            argv[o++] = argv[i];
            continue;
        }
        if (r != DT_OK) return r;
    }
    *argc = o;
    argv[o] = NULL;
    return DT_OK;
}

/* ---- the timeline file ------------------------------------------------------------------------ */

/* Lanes for n ranks (rank r's are lanes[r * DT__TRACE_LANES ...]), with time 0 now; NULL without memory. */
static dt__trace_lane *dt__trace_lanes(int n, int64_t max) {
    dt__trace_lane *L = (dt__trace_lane *)DT_MALLOC(sizeof *L * (size_t)n * DT__TRACE_LANES);
    double t0 = dt_time_now();
    int i;
    if (!L) return NULL;
    memset(L, 0, sizeof *L * (size_t)n * DT__TRACE_LANES);
    for (i = 0; i < n * DT__TRACE_LANES; i++) {
        L[i].lane = i % DT__TRACE_LANES;
        L[i].max = max > 0 ? max : DT_TRACE_MAX_EVENTS;
        L[i].origin = t0;
    }
    return L;
}
static void dt__trace_lanes_free(dt__trace_lane *L, int n) {
    int i;
    for (i = 0; L && i < n * DT__TRACE_LANES; i++) DT_FREE(L[i].ev);
    DT_FREE(L);
}

/* Text that grows; oom is set, and nothing more added, once an allocation fails. */
typedef struct dt__text { char *p; size_t n, cap; int oom; } dt__text;
static int dt__text_reserve(dt__text *t, size_t more) {
    size_t cap = t->cap ? t->cap : 4096;
    char *p;
    if (t->oom) return -1;
    if (t->n + more < t->cap) return 0;
    while (cap <= t->n + more) cap *= 2;
    if (!(p = (char *)DT_REALLOC(t->p, cap))) { t->oom = 1; return -1; }
    t->p = p;
    t->cap = cap;
    return 0;
}
static void dt__text_add(dt__text *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void dt__text_add(dt__text *t, const char *fmt, ...) {
    va_list ap;
    int k;
    if (dt__text_reserve(t, 256) != 0) return;
    va_start(ap, fmt);
    k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k >= t->cap - t->n && dt__text_reserve(t, (size_t)k + 1) == 0) {   /* did not fit: again */
        va_start(ap, fmt);
        k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
        va_end(ap);
    }
    if (k < 0) t->oom = 1;
    if (!t->oom) t->n += (size_t)k;
}
/* s as a JSON string: quotes, backslashes and control characters escaped (other bytes as they are: UTF-8). */
static void dt__text_json(dt__text *t, const char *s) {
    static const char hex[] = "0123456789abcdef";
    char *o;
    if (dt__text_reserve(t, 6 * strlen(s) + 3) != 0) return;
    o = t->p + t->n;
    *o++ = '"';
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { *o++ = '\\'; *o++ = (char)ch; }
        else if (ch < 0x20) { memcpy(o, "\\u00", 4); o[4] = hex[ch >> 4]; o[5] = hex[ch & 15]; o += 6; }
        else *o++ = (char)ch;
    }
    *o++ = '"';
    *o = 0;
    t->n = (size_t)(o - t->p);
}

/* Appends rank's lanes as trace events (pid = rank, tid = lane), each preceded by ",\n": metadata naming
   the process and its threads, then the events in begin order; spans still open end at `end` (seconds
   since time 0) and say "unfinished". Adds the events to *events and the dropped ones to *dropped. */
static void dt__trace_format(dt__text *t, const dt__trace_lane *lanes, int rank, double end, int64_t *events, int64_t *dropped) {
    static const char *const lane_names[DT__TRACE_LANES] = {"main", "ddp buckets"};
    int64_t i, lost = 0;
    int l, a;
    dt__text_add(t, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", rank, rank);
    dt__text_add(t, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}", rank, rank);
    for (l = 0; l < DT__TRACE_LANES; l++) {
        const dt__trace_lane *L = &lanes[l];
        lost += L->dropped;
        if (l > 0 && L->n == 0) continue;
        dt__text_add(t, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}", rank, l,
                     lane_names[l]);
        for (i = 0; i < L->n; i++) {
            const dt__trace_ev *e = &L->ev[i];
            int open = e->ph == 'X' && e->t1 < 0;
            dt__text_add(t, ",\n{\"name\":");
            dt__text_json(t, e->name);
            dt__text_add(t, ",\"cat\":");
            dt__text_json(t, e->cat);
            dt__text_add(t, ",\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", e->ph, rank, l, 1e6 * e->t0);
            if (e->ph == 'X') dt__text_add(t, ",\"dur\":%.3f", 1e6 * ((open ? end : e->t1) - e->t0));
            else dt__text_add(t, ",\"s\":\"t\"");
            if (e->nargs || open) {
                dt__text_add(t, ",\"args\":{");
                for (a = 0; a < e->nargs; a++) {
                    dt__text_add(t, "%s", a ? "," : "");
                    dt__text_json(t, e->arg[a].key ? e->arg[a].key : "?");
                    if (e->arg[a].s) { dt__text_add(t, ":"); dt__text_json(t, e->arg[a].s); }
                    else dt__text_add(t, ":%lld", (long long)e->arg[a].v);
                }
                if (open) dt__text_add(t, "%s\"unfinished\":1", e->nargs ? "," : "");
                dt__text_add(t, "}");
            }
            dt__text_add(t, "}");
        }
        *events += L->n;
    }
    if (lost)
        dt__text_add(t, ",\n{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"labels\":\"%lld events "
                     "dropped\"}}", rank, (long long)lost);
    *dropped += lost;
}

/* Writes the trace file: the events of body (as dt__trace_format made them) in one JSON object, into
   path.tmp, renamed over path once complete, so a reader never sees half a file. Logs where it went. */
static dt_result dt__trace_write(const char *path, const dt__text *body, int ranks, int64_t events, int64_t dropped, int64_t max) {
    char tmp[1024];
    FILE *f;
    int ok, err;
    if (body->oom) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "trace %s: no memory for the text of %lld events", path, (long long)events);
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "trace %s: the path is too long", path);
    if (!(f = fopen(tmp, "wb")))
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: creating %s failed: %s", path, tmp, strerror(errno));
    ok = fputs("{\"traceEvents\":[", f) >= 0 && (body->n < 1 || fwrite(body->p + 1, 1, body->n - 1, f) == body->n - 1) &&
         fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"dtrain %s\",\"ranks\":%d,\"events\":%lld,"
                 "\"dropped_events\":%lld}}\n", DT_VERSION_STRING, ranks, (long long)events, (long long)dropped) > 0;
    err = errno;
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
    if (!ok) {
        remove(tmp);
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: writing %s failed: %s", path, tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        remove(tmp);
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: renaming %s to it failed: %s", path, tmp, strerror(err));
    }
    dt_log(DT_LOG_INFO, "trace: %s (%lld events, open in https://ui.perfetto.dev or chrome://tracing)", path, (long long)events);
    if (dropped)
        dt_log(DT_LOG_WARN, "trace %s: %lld events were dropped, past %lld per rank and thread; raise the cap with "
               "--trace-max-events N (dt_launch_desc.trace_max_events)", path, (long long)dropped, (long long)max);
    return DT_OK;
}

/* After the local ranks have been joined: every rank's lanes into one file. */
static dt_result dt__trace_finish_local(const char *path, dt__trace_lane *lanes, int n) {
    dt__text t;
    int64_t events = 0, dropped = 0;
    double end = dt_time_now() - lanes[0].origin;
    dt_result r;
    int i;
    memset(&t, 0, sizeof t);
    for (i = 0; i < n; i++) dt__trace_format(&t, lanes + i * DT__TRACE_LANES, i, end, &events, &dropped);
    r = dt__trace_write(path, &t, n, events, dropped, lanes[0].max);
    DT_FREE(t.p);
    return r;
}

typedef struct dt__rank_ctx {
    dt_comm    *comm;
    dt_rank_fn  fn;
    void       *arg;
    int         threads, finished, order;
    dt_result   result;
    char        msg[512];
    dt__thread  thread;
    dt__trace_lane *trace;   /* the rank's lanes when tracing, else NULL */
} dt__rank_ctx;

#if DT__HAVE_THREADS
static void dt__rank_exit(void *p) {   /* the thread ended inside fn (pthread_exit): the rank has gone */
    dt__rank_ctx *x = (dt__rank_ctx *)p;
    if (x->finished) return;
    x->result = DT_ERR_STATE;
    snprintf(x->msg, sizeof x->msg, "DT_ERR_STATE: rank %d: its thread exited before its rank function returned", x->comm->rank);
    dt_comm_leave(x->comm, x->result, x->msg + strlen("DT_ERR_STATE: "));
}
#endif
static void dt__rank_body(dt__rank_ctx *x) {
    x->result = x->fn(x->comm, x->arg);
    if (x->result != DT_OK) {
        snprintf(x->msg, sizeof x->msg, "%s", dt_last_error());
        if (!x->msg[0]) snprintf(x->msg, sizeof x->msg, "%s: rank %d's function failed", dt_result_str(x->result), x->comm->rank);
    }
    x->finished = 1;
    {   /* the cause without the result-code prefix, for the others' reports */
        const char *m = x->msg, *pre = dt_result_str(x->result);
        size_t lp = strlen(pre);
        if (strncmp(m, pre, lp) == 0 && m[lp] == ':') m += lp + 1 + (m[lp + 1] == ' ');
        dt_comm_leave(x->comm, x->result, m);
    }
}
static void dt__rank_main(void *p) {
    dt__rank_ctx *x = (dt__rank_ctx *)p;
    dt__tls_rank = x->comm->rank;
    dt__tls_trace = x->trace;
#if DT__HAVE_OMP
    omp_set_num_threads(x->threads);
#endif
#if DT__HAVE_THREADS
    pthread_cleanup_push(dt__rank_exit, x);
    dt__rank_body(x);
    pthread_cleanup_pop(0);
#else
    dt__rank_body(x);
#endif
    dt__tls_rank = -1;
    dt__tls_trace = NULL;
}

static int dt__default_threads(int ranks) {
    int cores = 1;
#if DT__HAVE_OMP
    cores = omp_get_num_procs();
#endif
    return cores / ranks > 1 ? cores / ranks : 1;
}

/* Runs the ranks; with log set, logs every failed rank's message, the likely cause (a failure other than
   DT_ERR_PEER, which only follows from another rank's) first. */
static dt_result dt__launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results, int log) {
    dt_launch_desc d;
    dt__rank_ctx *x;
    dt_comm **comms;
    dt__trace_lane *lanes = NULL;
    int n, i, cause = -1;
    dt_result r;
    if (!fn) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch: the rank function is NULL");
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    n = d.ranks > 0 ? d.ranks : 1;
    x = (dt__rank_ctx *)DT_MALLOC((size_t)n * sizeof *x);
    comms = (dt_comm **)DT_MALLOC((size_t)n * sizeof *comms);
    if (d.trace_path) lanes = dt__trace_lanes(n, d.trace_max_events);
    if (!x || !comms || (d.trace_path && !lanes)) {
        DT_FREE(x); DT_FREE(comms); DT_FREE(lanes);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: no memory for %d ranks", n);
    }
    if ((r = dt_comm_create_local(comms, n, &d.comm)) != DT_OK) { DT_FREE(x); DT_FREE(comms); DT_FREE(lanes); return r; }
    memset(x, 0, (size_t)n * sizeof *x);
    dt__log_all_ranks = d.log_all_ranks;
    for (i = 0; i < n; i++) {
        x[i].comm = comms[i];
        x[i].fn = fn;
        x[i].arg = arg;
        x[i].threads = d.threads_per_rank > 0 ? d.threads_per_rank : dt__default_threads(n);
        x[i].trace = lanes ? lanes + i * DT__TRACE_LANES : NULL;
    }
    if (n == 1) dt__rank_main(&x[0]);   /* one rank runs on the calling thread */
    else {
        int started;
        for (started = 0; started < n; started++)
            if (dt__thread_start(&x[started].thread, dt__rank_main, &x[started]) != 0) break;
        for (i = started; i < n; i++) {   /* could not start: these ranks have gone */
            x[i].result = DT_ERR_OUT_OF_MEMORY;
            snprintf(x[i].msg, sizeof x[i].msg, "DT_ERR_OUT_OF_MEMORY: rank %d: its thread could not be started", i);
            dt_comm_leave(comms[i], x[i].result, x[i].msg + 22);
        }
        for (i = 0; i < started; i++) dt__thread_join(&x[i].thread);
    }
    for (i = 0; i < n; i++) {
        if (results) results[i] = x[i].result;
        if (x[i].result != DT_OK && (cause < 0 || (x[cause].result == DT_ERR_PEER && x[i].result != DT_ERR_PEER))) cause = i;
    }
    r = DT_OK;
    if (cause >= 0) {
        if (log) {
            dt_log(DT_LOG_ERROR, "%s", x[cause].msg);
            for (i = 0; i < n; i++) if (i != cause && x[i].result != DT_OK) dt_log(DT_LOG_ERROR, "%s", x[i].msg);
        }
        r = x[cause].result;
        {
            const char *m = x[cause].msg, *pre = dt_result_str(r);
            size_t lp = strlen(pre);
            if (strncmp(m, pre, lp) == 0 && m[lp] == ':') m += lp + 1 + (m[lp + 1] == ' ');
            dt_set_error(r, "%s", m);
        }
    }
    if (lanes) {   /* also after a failure: the trace of a failed run shows where each rank was */
        char cause_msg[512];
        dt_result rt;
        snprintf(cause_msg, sizeof cause_msg, "%s", dt_last_error());
        rt = dt__trace_finish_local(d.trace_path, lanes, n);
        if (rt != DT_OK && log) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        if (rt != DT_OK && r == DT_OK) r = rt;
        else if (rt != DT_OK) snprintf(dt__errmsg, sizeof dt__errmsg, "%s", cause_msg);   /* the run's failure comes first */
        dt__trace_lanes_free(lanes, n);
    }
    for (i = 0; i < n; i++) dt_comm_destroy(comms[i]);
    DT_FREE(comms);
    DT_FREE(x);
    return r;
}

dt_result dt_launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results) {
    return dt__launch_local(desc, fn, arg, results, 0);
}

/* Started by mpiexec? Hydra (MPICH) sets PMI_SIZE, Open MPI OMPI_COMM_WORLD_SIZE, PMIx PMIX_RANK. */
static int dt__mpiexec_size(void) {
    const char *v = getenv("PMI_SIZE");
    if (!v) v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v && getenv("PMIX_RANK")) v = "2";
    return v ? atoi(v) : 0;
}

#ifdef DT_USE_MPI
int dt__mpi_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg);   /* in dtrain_mpi.h */
#endif

int dt_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg) {
    int np = dt__mpiexec_size();
    dt_launch_desc d;
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
#ifdef DT_USE_MPI
    if (np > 0) return dt__mpi_launch(&d, fn, arg);
#else
    if (np > 1) {
        dt_log(DT_LOG_ERROR, "this program was started by mpiexec with %d processes but built without MPI: "
                             "rebuild it with MPI (make MPI=1: mpicc -DDT_USE_MPI), or run it alone with --ranks %d", np, np);
        return 1;
    }
#endif
    return dt__launch_local(&d, fn, arg, NULL, 1) == DT_OK ? 0 : 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* 7. train                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

dt_result dt_evaluate(dt_model *m, const dt_dataset *ds, const int64_t *idx, int64_t count, const dt_transform *t,
                      int64_t batch, int topk, dt_eval_result *out) {
    dt_result r = DT_OK;
    int64_t start, k, in_size, i, j, top1 = 0, topk_hits = 0;
    int was_training;
    double loss_sum = 0.0;
    float *x = NULL, *scores = NULL;
    int32_t *y = NULL;
    int64_t *ids = NULL;
    if ((r = dt__need_final(m, "dt_evaluate")) != DT_OK) return r;
    if (!ds || !out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: dataset or result is NULL");
    memset(out, 0, sizeof *out);
    if (!idx) count = ds->count;
    if (count <= 0 || batch <= 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: count %lld and batch %lld must be > 0", (long long)count, (long long)batch);
    in_size = m->nodes[0].size;
    k = m->nodes[m->nnodes - 1].size;
    if (ds->c * ds->h * ds->w != in_size)
        return dt_set_error(DT_ERR_SHAPE, "dt_evaluate: samples of %s are %lldx%lldx%lld but the model takes %lld values",
                            ds->source[0] ? ds->source : "the dataset", (long long)ds->c, (long long)ds->h,
                            (long long)ds->w, (long long)in_size);
    if (topk < 1) topk = 1;
    if (topk > k) topk = (int)k;
    if (batch > count) batch = count;
    x = (float *)DT_MALLOC(sizeof(float) * (size_t)(batch * in_size));
    scores = (float *)DT_MALLOC(sizeof(float) * (size_t)(batch * k));
    y = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)batch);
    ids = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)batch);
    if (!x || !scores || !y || !ids) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_evaluate: no memory for a batch of %lld", (long long)batch);
        goto done;
    }
    was_training = m->training;
    m->training = 0;
    dt_trace_begin("evaluate", "compute");
    dt__trace_arg("samples", NULL, count);
    for (start = 0; start < count && r == DT_OK; start += batch) {
        int64_t n = count - start < batch ? count - start : batch;
        float loss = 0.0f;
        for (i = 0; i < n; i++) ids[i] = idx ? idx[start + i] : start + i;
        if ((r = dt_dataset_batch(ds, ids, n, t, 0, 0, x, y)) != DT_OK) break;
        if ((r = dt_model_forward(m, x, n)) != DT_OK) break;
        r = dt_model_loss_labels(m, y, &loss);
        if (r != DT_OK && r != DT_ERR_NUMERIC) break;
        r = DT_OK;                                /* a NaN loss is reported as such in the result */
        loss_sum += (double)loss * (double)n;
        m->ops->download(m->ctx, scores, m->nodes[m->nnodes - 1].out, (int64_t)sizeof(float) * n * k);
        for (i = 0; i < n; i++) {
            const float *row = scores + i * k;
            int64_t above = 0;                    /* classes scoring strictly higher than the label, or equal and earlier */
            for (j = 0; j < k; j++)
                above += row[j] > row[y[i]] || (row[j] == row[y[i]] && j < y[i]);
            top1 += above == 0;
            topk_hits += above < topk;
        }
    }
    dt_trace_end();
    m->training = was_training;
    if (r == DT_OK) {
        out->count = count;
        out->loss = loss_sum / (double)count;
        out->top1 = (double)top1 / (double)count;
        out->topk = (double)topk_hits / (double)count;
        out->k = topk;
    }
done:
    DT_FREE(x); DT_FREE(scores); DT_FREE(y); DT_FREE(ids);
    return r;
}

/* ---- checkpoints ---- */

#define DT__CKPT_MAGIC "DTCKPT\r\n"
#define DT__CKPT_VERSION 1u

/* FNV-1a, 64-bit, over bytes: the checksum and the model signature */
static uint64_t dt__fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
    return h;
}
static uint64_t dt__model_signature(const dt_model *m) {
    uint64_t h = 0xcbf29ce484222325ULL;
    int i;
    for (i = 0; i < m->npinfo; i++) {
        h = dt__fnv(h, m->pinfo[i].name, strlen(m->pinfo[i].name));
        h = dt__fnv(h, m->pinfo[i].shape, sizeof m->pinfo[i].shape);
    }
    for (i = 0; i < m->nbinfo; i++) h = dt__fnv(h, m->binfo[i].name, strlen(m->binfo[i].name));
    return h;
}

/* The header: magic, then 15 little-endian 64-bit words: version, model signature, nparams, nbuffers,
   nstate, ntensors, optimizer kind, the model's dropout seed, stream and step, the caller's epoch, step,
   round, and RNG state and increment. Then params, buffers, optimizer state (float32), per-tensor step
   counts (int64), and the FNV-1a checksum of everything before it. */
#define DT__CKPT_HEAD_WORDS 15

static void dt__put_u64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t dt__get_u64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static int dt__little_endian(void) {
    const uint32_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Makes the data of f durable before the rename. POSIX fsync where the platform has it. */
#if defined(__unix__) || defined(__APPLE__)
#if !defined(__cplusplus) && defined(__GLIBC__) && !defined(__USE_POSIX)
extern int fileno(FILE *stream);
#endif
#if !defined(__cplusplus) && defined(__GLIBC__) && !defined(__USE_POSIX199309) && !defined(__USE_MISC)
extern int fsync(int fd);
#endif
#include <unistd.h>
static int dt__sync_file(FILE *f) { return fflush(f) == 0 && fsync(fileno(f)) == 0 ? 0 : -1; }
#else
static int dt__sync_file(FILE *f) { return fflush(f) == 0 ? 0 : -1; }
#endif

dt_result dt_checkpoint_save(const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta) {
    char tmp[1024];
    unsigned char head[8 + 8 * DT__CKPT_HEAD_WORDS], tail[8];
    uint64_t words[DT__CKPT_HEAD_WORDS], sum = 0xcbf29ce484222325ULL;
    int64_t nstate = 0, total, i;
    float *host = NULL;
    int64_t *steps = NULL;
    FILE *f;
    dt_result r;
    if ((r = dt__need_final(m, "dt_checkpoint_save")) != DT_OK) return r;
    if (!path || !*path) return dt_set_error(DT_ERR_INVALID_ARG, "dt_checkpoint_save: path is empty");
    if (o && o->m != m) return dt_set_error(DT_ERR_INVALID_ARG, "dt_checkpoint_save: the optimizer belongs to another model");
    if (!dt__little_endian()) return dt_set_error(DT_ERR_UNSUPPORTED, "dt_checkpoint_save: big-endian hosts are not supported");
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_checkpoint_save: path is too long");
    if (o) dt_optim_state(o, &nstate);
    total = m->nparams + m->nbuffers + nstate;
    host = (float *)DT_MALLOC(sizeof(float) * (size_t)(total + 1));
    steps = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)((o ? o->ntensors : 0) + 1));
    if (!host || !steps) {
        DT_FREE(host); DT_FREE(steps);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_checkpoint_save: no memory to stage %lld values", (long long)total);
    }
    m->ops->download(m->ctx, host, m->params, (int64_t)sizeof(float) * m->nparams);
    m->ops->download(m->ctx, host + m->nparams, m->buffers, (int64_t)sizeof(float) * m->nbuffers);
    if (nstate) m->ops->download(m->ctx, host + m->nparams + m->nbuffers, o->state, (int64_t)sizeof(float) * nstate);
    for (i = 0; o && i < o->ntensors; i++) steps[i] = o->steps[i];
    words[0] = DT__CKPT_VERSION; words[1] = dt__model_signature(m); words[2] = (uint64_t)m->nparams;
    words[3] = (uint64_t)m->nbuffers; words[4] = (uint64_t)nstate; words[5] = (uint64_t)(o ? o->ntensors : 0);
    words[6] = o ? (uint64_t)o->d.kind : 0; words[7] = m->seed; words[8] = m->stream; words[9] = m->step;
    words[10] = (uint64_t)(meta ? meta->epoch : 0); words[11] = (uint64_t)(meta ? meta->step : 0);
    words[12] = (uint64_t)(meta ? meta->round : 0);
    words[13] = meta ? meta->rng.state : 0; words[14] = meta ? meta->rng.inc : 0;
    memcpy(head, DT__CKPT_MAGIC, 8);
    for (i = 0; i < DT__CKPT_HEAD_WORDS; i++) dt__put_u64(head + 8 + 8 * i, words[i]);
    sum = dt__fnv(sum, head, sizeof head);
    sum = dt__fnv(sum, host, sizeof(float) * (size_t)total);
    sum = dt__fnv(sum, steps, sizeof(int64_t) * (size_t)(o ? o->ntensors : 0));
    dt__put_u64(tail, sum);
    if (!(f = fopen(tmp, "wb"))) {
        DT_FREE(host); DT_FREE(steps);
        return dt_set_error(DT_ERR_IO, "dt_checkpoint_save: cannot create %s (does the directory exist and is it writable?)", tmp);
    }
    r = DT_OK;
    if (fwrite(head, 1, sizeof head, f) != sizeof head || fwrite(host, sizeof(float), (size_t)total, f) != (size_t)total ||
        fwrite(steps, sizeof(int64_t), (size_t)(o ? o->ntensors : 0), f) != (size_t)(o ? o->ntensors : 0) ||
        fwrite(tail, 1, sizeof tail, f) != sizeof tail || dt__sync_file(f) != 0)
        r = dt_set_error(DT_ERR_IO, "dt_checkpoint_save: writing %s failed (disk full?); the previous %s is untouched", tmp, path);
    if (fclose(f) != 0 && r == DT_OK)
        r = dt_set_error(DT_ERR_IO, "dt_checkpoint_save: closing %s failed; the previous %s is untouched", tmp, path);
    if (r == DT_OK && rename(tmp, path) != 0)
        r = dt_set_error(DT_ERR_IO, "dt_checkpoint_save: cannot rename %s to %s", tmp, path);
    if (r != DT_OK) remove(tmp);
    DT_FREE(host); DT_FREE(steps);
    return r;
}

dt_result dt_checkpoint_load(const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta) {
    unsigned char head[8 + 8 * DT__CKPT_HEAD_WORDS], tail[8];
    uint64_t w[DT__CKPT_HEAD_WORDS], sum = 0xcbf29ce484222325ULL;
    int64_t total, nt, i, have_state = 0;
    long size;
    float *host = NULL;
    int64_t *steps = NULL;
    FILE *f;
    dt_result r;
    if ((r = dt__need_final(m, "dt_checkpoint_load")) != DT_OK) return r;
    if (!path) return dt_set_error(DT_ERR_INVALID_ARG, "dt_checkpoint_load: path is NULL");
    if (!(f = fopen(path, "rb"))) return dt_set_error(DT_ERR_IO, "dt_checkpoint_load: cannot open %s (no such file, or no permission)", path);
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return dt_set_error(DT_ERR_IO, "dt_checkpoint_load: cannot read %s", path);
    }
    if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, DT__CKPT_MAGIC, 8) != 0) {
        fclose(f);
        return dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: %s is not a dtrain checkpoint (wrong magic number or too short)", path);
    }
    for (i = 0; i < DT__CKPT_HEAD_WORDS; i++) w[i] = dt__get_u64(head + 8 + 8 * i);
    if (w[0] != DT__CKPT_VERSION) {
        fclose(f);
        return dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: %s has format version %llu; this dtrain reads version %u",
                            path, (unsigned long long)w[0], DT__CKPT_VERSION);
    }
    if (w[2] != (uint64_t)m->nparams || w[3] != (uint64_t)m->nbuffers || w[1] != dt__model_signature(m)) {
        fclose(f);
        return dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: %s holds another model (%llu parameters, %llu buffer values, "
                            "signature %016llx) than this one (%lld, %lld, %016llx): build the same model to load it",
                            path, (unsigned long long)w[2], (unsigned long long)w[3], (unsigned long long)w[1],
                            (long long)m->nparams, (long long)m->nbuffers, (unsigned long long)dt__model_signature(m));
    }
    if (w[4] > (uint64_t)(2 * m->nparams) || w[5] > 1000000u) {
        fclose(f);
        return dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: %s is damaged (impossible optimizer sizes)", path);
    }
    total = m->nparams + m->nbuffers + (int64_t)w[4];
    nt = (int64_t)w[5];
    if ((int64_t)size != (int64_t)sizeof head + 4 * total + 8 * nt + 8) {
        fclose(f);
        return dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: %s is %ld bytes but its header describes %lld: the file is "
                            "truncated or damaged", path, size, (long long)((int64_t)sizeof head + 4 * total + 8 * nt + 8));
    }
    if (o) {
        int64_t want;
        dt_optim_state(o, &want);
        if (w[5] == 0)
            r = dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: %s has no optimizer state; pass NULL for the optimizer "
                             "to load the model alone", path);
        else if (w[6] != (uint64_t)o->d.kind || (int64_t)w[4] != want || nt != o->ntensors)
            r = dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: the optimizer state in %s (kind %llu, %llu values) does not "
                             "fit this optimizer (kind %d, %lld values)", path, (unsigned long long)w[6],
                             (unsigned long long)w[4], (int)o->d.kind, (long long)want);
        if (r != DT_OK) { fclose(f); return r; }
        have_state = 1;
    }
    host = (float *)DT_MALLOC(sizeof(float) * (size_t)(total + 1));
    steps = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    if (!host || !steps) {
        fclose(f); DT_FREE(host); DT_FREE(steps);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_checkpoint_load: no memory to stage %s", path);
    }
    if (fread(host, sizeof(float), (size_t)total, f) != (size_t)total || fread(steps, sizeof(int64_t), (size_t)nt, f) != (size_t)nt ||
        fread(tail, 1, 8, f) != 8) {
        r = dt_set_error(DT_ERR_IO, "dt_checkpoint_load: reading %s failed", path);
    } else {
        sum = dt__fnv(sum, head, sizeof head);
        sum = dt__fnv(sum, host, sizeof(float) * (size_t)total);
        sum = dt__fnv(sum, steps, sizeof(int64_t) * (size_t)nt);
        if (sum != dt__get_u64(tail))
            r = dt_set_error(DT_ERR_FORMAT, "dt_checkpoint_load: %s is damaged (checksum mismatch); use an earlier checkpoint", path);
    }
    fclose(f);
    if (r == DT_OK) {   /* everything checked: only now does the model change */
        m->ops->upload(m->ctx, m->params, host, (int64_t)sizeof(float) * m->nparams);
        m->ops->upload(m->ctx, m->buffers, host + m->nparams, (int64_t)sizeof(float) * m->nbuffers);
        m->seed = w[7]; m->stream = w[8]; m->step = w[9];
        if (have_state) {
            if (w[4]) m->ops->upload(m->ctx, o->state, host + m->nparams + m->nbuffers, (int64_t)sizeof(float) * (int64_t)w[4]);
            memcpy(o->steps, steps, sizeof(int64_t) * (size_t)nt);
        }
        if (meta) {
            meta->epoch = (int64_t)w[10]; meta->step = (int64_t)w[11]; meta->round = (int64_t)w[12];
            meta->rng.state = w[13]; meta->rng.inc = w[14];
        }
    }
    DT_FREE(host); DT_FREE(steps);
    return r;
}

/* ---- shared by the trainers -------------------------------------------------------------------- */

/* Collective, for every trainer's create: checks that all ranks built a model of the same size (one
   all-reduce of {n, -n} with MAX: both come back unchanged only when every n is equal), then, with
   broadcast set, gives every rank rank 0's parameters and buffers so the replicas start equal. */
static dt_result dt__same_model(dt_comm *c, dt_model *m, const char *fn, int broadcast) {
    int64_t nb = 0, n, v[2];
    float *b = dt_model_buffers(m, &nb);
    dt_result r;
    n = m->nparams + nb;
    v[0] = n;
    v[1] = -n;
    if ((r = dt_comm_allreduce(c, v, 2, DT_I64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    if (v[0] != n || -v[1] != n)
        return dt_set_error(DT_ERR_MISMATCH, "%s: rank %d: its model has %lld parameters and buffers but another rank's has %lld: "
                            "every rank must build the same model", fn, c->rank, (long long)n, (long long)(v[0] != n ? v[0] : -v[1]));
    if (!broadcast) return DT_OK;
    if ((r = dt_comm_broadcast(c, m->params, (size_t)m->nparams, DT_F32, 0, DT_ALGO_AUTO)) != DT_OK) return r;
    return nb > 0 ? dt_comm_broadcast(c, b, (size_t)nb, DT_F32, 0, DT_ALGO_AUTO) : DT_OK;
}

/* ---- local SGD and Hogwild ---------------------------------------------------------------------- */

struct dt_localsgd {
    dt_comm          *comm;
    dt_model         *model;
    dt_localsgd_desc  desc;
    int64_t           since;   /* steps since the last average */
    dt_localsgd_stats stats;
};

dt_result dt_localsgd_create(dt_localsgd **out, dt_comm *c, dt_model *m, const dt_localsgd_desc *desc) {
    dt_localsgd_desc dd;
    dt_localsgd *d;
    dt_result r;
    int me = c ? c->rank : -1;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_create: out is NULL");
    *out = NULL;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_create: the communicator is NULL");
    if (!m || !m->finalized)
        return dt_set_error(m ? DT_ERR_STATE : DT_ERR_INVALID_ARG, "dt_localsgd_create: rank %d: the model is %s", me,
                            m ? "not finalized: call dt_model_finalize first" : "NULL");
    if (dd.period < 0 || dd.algo < 0 || dd.algo >= DT_ALGO_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_create: rank %d: bad desc (period %d, algo %d): period is >= 0 "
                            "(0 = only at dt_localsgd_average), algo a dt_algo", me, dd.period, (int)dd.algo);
    if ((r = dt__same_model(c, m, "dt_localsgd_create", 1)) != DT_OK) return r;
    if (!(d = (dt_localsgd *)DT_MALLOC(sizeof *d))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_localsgd_create: rank %d: no memory", me);
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->desc = dd;
    *out = d;
    return DT_OK;
}

void dt_localsgd_destroy(dt_localsgd *d) { DT_FREE(d); }

dt_result dt_localsgd_average(dt_localsgd *d) {
    dt_result r = DT_OK;
    int64_t nb = 0;
    float *b;
    double t0 = dt_time_now();
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_average: localsgd is NULL");
    d->since = 0;
    if (d->comm->size > 1) {
        dt_trace_begin("local sgd average", "comm");
        r = dt_comm_allreduce(d->comm, d->model->params, (size_t)d->model->nparams, DT_F32, DT_MEAN, d->desc.algo);
        b = dt_model_buffers(d->model, &nb);
        if (r == DT_OK && d->desc.sync_buffers && nb > 0)
            r = dt_comm_allreduce(d->comm, b, (size_t)nb, DT_F32, DT_MEAN, d->desc.algo);
        dt_trace_end();
    }
    d->stats.comm_seconds += dt_time_now() - t0;
    d->stats.averages += r == DT_OK;
    return r;
}

dt_result dt_localsgd_step(dt_localsgd *d) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_localsgd_step: localsgd is NULL");
    d->stats.steps++;
    return d->desc.period > 0 && ++d->since >= d->desc.period ? dt_localsgd_average(d) : DT_OK;
}

dt_localsgd_stats dt_localsgd_get_stats(const dt_localsgd *d) {
    dt_localsgd_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

/* Hogwild. The shared buffer is read and written by every worker with plain loads and stores: that is the
   algorithm, not an oversight (see the declarations). Only the start and the end are synchronised, by
   thread creation and join. */
typedef struct dt__hogwild_ctx {
    dt_hogwild_worker w;
    dt_hogwild_fn     fn;
    void             *arg;
    int               omp_threads;
    dt_result         result;
    char              msg[512];
    dt__thread        thread;
} dt__hogwild_ctx;

static void dt__hogwild_main(void *p) {
    dt__hogwild_ctx *x = (dt__hogwild_ctx *)p;
#if DT__HAVE_OMP
    omp_set_num_threads(x->omp_threads);
#endif
    x->result = x->fn(&x->w, x->arg);
    if (x->result != DT_OK) snprintf(x->msg, sizeof x->msg, "%s", dt_last_error());
}

dt_result dt_hogwild_run(dt_model *shared, int threads, dt_hogwild_fn fn, void *arg) {
    dt__hogwild_ctx *x;
    dt_result r = DT_OK;
    int i, started = 0, omp_caller = dt_cpu_threads();
    if (!shared || !shared->finalized || !fn || threads < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_hogwild_run: %s", !shared ? "the shared model is NULL" :
                            !shared->finalized ? "the shared model is not finalized: call dt_model_finalize first" :
                            !fn ? "the worker function is NULL" : "threads must be >= 1");
    if (threads == 1) {
        dt_hogwild_worker w;
        w.index = 0; w.threads = 1; w.shared = shared;
        return fn(&w, arg);
    }
    if (!(x = (dt__hogwild_ctx *)DT_MALLOC(sizeof *x * (size_t)threads)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_hogwild_run: no memory for %d workers", threads);
    memset(x, 0, sizeof *x * (size_t)threads);
    for (i = 0; i < threads; i++) {
        x[i].w.index = i; x[i].w.threads = threads; x[i].w.shared = shared;
        x[i].fn = fn; x[i].arg = arg; x[i].omp_threads = dt__default_threads(threads);
    }
    /* without threads (or when one cannot start) the rest run on this thread, one after another */
    for (i = 0; i < threads; i++) started += DT__HAVE_THREADS && dt__thread_start(&x[i].thread, dt__hogwild_main, &x[i]) == 0;
    for (i = started; i < threads; i++) dt__hogwild_main(&x[i]);
    for (i = 0; i < started; i++) dt__thread_join(&x[i].thread);
#if DT__HAVE_OMP
    omp_set_num_threads(omp_caller);   /* in case workers ran on this thread */
#else
    (void)omp_caller;
#endif
    for (i = 0; i < threads && r == DT_OK; i++)
        if (x[i].result != DT_OK) r = dt_set_error(x[i].result, "dt_hogwild_run: worker %d of %d: %s", i, threads, x[i].msg);
    DT_FREE(x);
    return r;
}

static dt_result dt__hogwild_check(dt_model *shared, dt_model *replica, const char *what) {
    if (!shared || !replica || !shared->finalized || !replica->finalized)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the shared model and the replica must be finalized models", what);
    if (shared->nparams != replica->nparams)
        return dt_set_error(DT_ERR_MISMATCH, "%s: the replica has %lld parameters but the shared model %lld: build the "
                            "replica with the same architecture", what, (long long)replica->nparams, (long long)shared->nparams);
    return DT_OK;
}

dt_result dt_hogwild_pull(dt_model *shared, dt_model *replica) {
    dt_result r = dt__hogwild_check(shared, replica, "dt_hogwild_pull");
    if (r == DT_OK) memcpy(replica->params, shared->params, sizeof(float) * (size_t)shared->nparams);
    return r;
}

dt_result dt_hogwild_push(dt_model *shared, dt_model *replica, float lr) {
    dt_result r = dt__hogwild_check(shared, replica, "dt_hogwild_push");
    float *p, *g;
    int64_t i, n;
    if (r != DT_OK) return r;
    if (!(lr >= 0.0f)) return dt_set_error(DT_ERR_INVALID_ARG, "dt_hogwild_push: lr %g must be >= 0", (double)lr);
    p = shared->params; g = replica->grads; n = shared->nparams;
    for (i = 0; i < n; i++) p[i] -= lr * g[i];   /* the same arithmetic as the SGD step */
    dt_model_zero_grad(replica);
    return DT_OK;
}

/* ---- DDP ---------------------------------------------------------------------------------------
   Every sync has two halves. First the ranks agree, in one all-reduce of two integers, on the samples
   behind the gradients (and on how many ranks still have data: dt_ddp_join's ranks say 0); each rank then
   scales its gradient by its share, last micro-batch's samples / all samples (its buffer holds a mean over
   its last micro-batch, see dt_ddp_backward), so that the SUM over ranks is the mean over every sample.
   Then the method sums: the same collectives in the same order on every rank, so a joined rank that
   contributes zeros can shadow the others. With BUCKETS and overlap, a helper thread owns the communicator
   from the agreement to the end of backward: the backward hook moves `ready` down the buffer and the
   helper reduces each bucket as soon as `ready` has passed its start. */

static const char *const dt__ddp_method_names[DT_DDP_METHOD_COUNT] = {"buckets", "flat", "per-layer", "ps", "p2p"};
const char *dt_ddp_method_name(dt_ddp_method k) { return dt__enum_name(dt__ddp_method_names, DT_DDP_METHOD_COUNT, (int)k); }

dt_result dt_ddp_method_parse(const char *s, dt_ddp_method *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__ddp_method_names, DT_DDP_METHOD_COUNT, s, &k, "DDP sync method");
    if (r == DT_OK && out) *out = (dt_ddp_method)k;
    return r;
}

struct dt_ddp {
    dt_comm     *comm;
    dt_model    *model;
    dt_ddp_desc  desc;
    int64_t      n;                 /* gradient elements */
    int          ntensors, nbuckets;
    int64_t     *toff, *tcnt;       /* [ntensors] parameter tensors, last first (the order backward ends them) */
    int64_t     *boff, *bcnt;       /* [nbuckets] buckets of whole tensors, last first */
    int64_t     *ready_at;          /* [nodes]: after node i's backward the gradients [ready_at[i], n) are final */
    float       *gathered;          /* PARAM_SERVER and P2P, rank 0: [size * n] everyone's gradient */
    dt_request  *reqs;              /* P2P, rank 0: [size] */
    int64_t      acc_samples;       /* samples accumulated since the last sync */
    int64_t      last_samples;      /* the last micro-batch's: the buffer is (sum of gradients) / this */
    float        scale;             /* this rank's weight in the sum of the current sync */
    dt_ddp_stats stats;
    int          tls_rank;          /* the creator's rank for log prefixes, given to the helper thread */
    dt__trace_lane *trace;          /* the creator's rank's lane for the helper thread, or NULL */
    /* overlap (BUCKETS on local ranks) */
    int          overlap, in_sync;  /* in_sync: the caller's thread is in an overlapped backward */
    int64_t      ready_seen;        /* caller's copy of `ready` */
    dt__thread   thread;
    dt__mutex    mu;
    dt__cond     cv;
    int          quit, job;         /* under mu */
    int64_t      ready;             /* under mu: gradients [ready, n) are final */
    dt_result    herr;              /* under mu: the helper's failure and message */
    char         hmsg[512];
};

/* Sums this rank's slice (already in g) with slots 1..p-1 of gathered, in rank order. */
static void dt__ddp_sum_slots(float *g, const float *gathered, int p, int64_t cnt) {
    int i;
    int64_t j;
    for (i = 1; i < p; i++)
        for (j = 0; j < cnt; j++) g[j] += gathered[(int64_t)i * cnt + j];
}

/* Weighs this rank's gradients [off, off + cnt) and sums them over the ranks by the chosen method. */
static dt_result dt__ddp_reduce(dt_ddp *d, int64_t off, int64_t cnt) {
    dt_comm *c = d->comm;
    float *g = d->model->grads + off;
    int p = c->size, me = c->rank, i;
    int64_t j;
    dt_result r = DT_OK;
    if (d->scale != 1.0f)
        for (j = 0; j < cnt; j++) g[j] *= d->scale;
    if (p == 1) return DT_OK;
    switch (d->desc.method) {
    case DT_DDP_PARAM_SERVER:   /* everyone to rank 0, which sums and sends the result to everyone */
        if ((r = dt_comm_gather(c, g, me == 0 ? d->gathered : NULL, (size_t)cnt, DT_F32, 0)) != DT_OK) return r;
        if (me == 0) dt__ddp_sum_slots(g, d->gathered, p, cnt);
        return dt_comm_broadcast(c, g, (size_t)cnt, DT_F32, 0, DT_ALGO_NAIVE);
    case DT_DDP_P2P:            /* the same with messages written by hand */
        if (me != 0) {
            if ((r = dt_comm_send(c, g, (size_t)cnt, DT_F32, 0, DT_DDP_TAG)) != DT_OK) return r;
            return dt_comm_recv(c, g, (size_t)cnt, DT_F32, 0, DT_DDP_TAG, NULL);
        }
        for (i = 1; i < p && r == DT_OK; i++)
            r = dt_comm_irecv(c, d->gathered + (int64_t)i * cnt, (size_t)cnt, DT_F32, i, DT_DDP_TAG, &d->reqs[i]);
        if (r == DT_OK) r = dt_comm_waitall(c, d->reqs + 1, i - 1);
        if (r != DT_OK) return r;
        dt__ddp_sum_slots(g, d->gathered, p, cnt);
        for (i = 1; i < p && r == DT_OK; i++) r = dt_comm_isend(c, g, (size_t)cnt, DT_F32, i, DT_DDP_TAG, &d->reqs[i]);
        if (r == DT_OK) r = dt_comm_waitall(c, d->reqs + 1, i - 1);
        return r;
    default:                    /* BUCKETS, FLAT, PER_LAYER: all-reduce of a slice */
        return dt_comm_allreduce(c, g, (size_t)cnt, DT_F32, DT_SUM, d->desc.algo);
    }
}

/* The whole buffer, in the method's order of collectives, buckets from `from` on. */
static dt_result dt__ddp_reduce_all(dt_ddp *d, int from) {
    dt_result r = DT_OK;
    int i;
    if (d->desc.method == DT_DDP_BUCKETS)
        for (i = from; i < d->nbuckets && r == DT_OK; i++) r = dt__ddp_reduce(d, d->boff[i], d->bcnt[i]);
    else if (d->desc.method == DT_DDP_PER_LAYER)
        for (i = 0; i < d->ntensors && r == DT_OK; i++) r = dt__ddp_reduce(d, d->toff[i], d->tcnt[i]);
    else
        r = dt__ddp_reduce(d, 0, d->n);
    return r;
}

/* First half of a sync: the samples of all ranks and the number of ranks with data; sets this rank's weight. */
static dt_result dt__ddp_agree(dt_ddp *d, int active, int64_t *nactive) {
    int64_t v[2];
    dt_result r;
    v[0] = active ? d->acc_samples : 0;
    v[1] = active;
    if ((r = dt_comm_allreduce(d->comm, v, 2, DT_I64, DT_SUM, DT_ALGO_AUTO)) != DT_OK) return r;
    *nactive = v[1];
    d->scale = active && v[0] > 0 ? (float)((double)d->last_samples / (double)v[0]) : 0.0f;
    return DT_OK;
}

#if DT__HAVE_THREADS
static void dt__ddp_helper(void *arg) {
    dt_ddp *d = (dt_ddp *)arg;
    dt__tls_rank = d->tls_rank;
    dt__tls_trace = d->trace;
    dt__mutex_lock(&d->mu);
    for (;;) {
        int b;
        while (!d->quit && !d->job) dt__cond_wait(&d->cv, &d->mu);
        if (d->quit) break;
        for (b = 0; b < d->nbuckets && d->herr == DT_OK; b++) {
            dt_result r;
            while (d->ready > d->boff[b]) dt__cond_wait(&d->cv, &d->mu);
            dt__mutex_unlock(&d->mu);
            dt_trace_begin("bucket", "comm");
            dt__trace_arg("bucket", NULL, b);
            dt__trace_arg("bytes", NULL, d->bcnt[b] * (int64_t)sizeof(float));
            r = dt__ddp_reduce(d, d->boff[b], d->bcnt[b]);
            dt_trace_end();
            dt__mutex_lock(&d->mu);
            if (r != DT_OK) {
                d->herr = r;
                snprintf(d->hmsg, sizeof d->hmsg, "%s", dt_last_error());
            }
        }
        d->job = 0;
        dt__cond_broadcast(&d->cv);
    }
    dt__mutex_unlock(&d->mu);
}

static void dt__ddp_hook(void *user, dt_model *m, int node) {
    dt_ddp *d = (dt_ddp *)user;
    (void)m;
    if (!d->in_sync || d->ready_at[node] >= d->ready_seen) return;
    d->ready_seen = d->ready_at[node];
    dt__mutex_lock(&d->mu);
    d->ready = d->ready_seen;
    dt__cond_broadcast(&d->cv);
    dt__mutex_unlock(&d->mu);
}
#endif

static void dt__ddp_free(dt_ddp *d) {
    DT_FREE(d->toff); DT_FREE(d->tcnt); DT_FREE(d->boff); DT_FREE(d->bcnt); DT_FREE(d->ready_at);
    DT_FREE(d->gathered); DT_FREE(d->reqs);
    DT_FREE(d);
}

/* Tensors last first, buckets of whole tensors from the end, and where each node's backward leaves the
   final gradients. */
static dt_result dt__ddp_plan(dt_ddp *d) {
    dt_model *m = d->model;
    int nt = dt_model_param_tensors(m), nodes = dt_model_nodes(m), i, nb = 0;
    int64_t cap = d->desc.bucket_bytes / (int64_t)sizeof(float), have = 0;
    d->ntensors = nt;
    d->toff = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->tcnt = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->boff = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->bcnt = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->ready_at = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nodes + 1));
    if (!d->toff || !d->tcnt || !d->boff || !d->bcnt || !d->ready_at) return DT_ERR_OUT_OF_MEMORY;
    for (i = 0; i < nodes; i++) d->ready_at[i] = d->n;
    for (i = 0; i < nt; i++) {
        dt_param_info pi = dt_model_param_info(m, nt - 1 - i);
        d->toff[i] = pi.offset;
        d->tcnt[i] = pi.count;
        if (pi.offset < d->ready_at[pi.node]) d->ready_at[pi.node] = pi.offset;
    }
    for (i = nodes - 2; i >= 0; i--)   /* node i's backward comes after every later node's */
        if (d->ready_at[i + 1] < d->ready_at[i]) d->ready_at[i] = d->ready_at[i + 1];
    for (i = 0; i < nt; i++) {         /* tensors are consecutive: a bucket is [its last tensor's offset, previous start) */
        if (have == 0) { d->bcnt[nb] = 0; nb++; }
        d->boff[nb - 1] = d->toff[i];
        d->bcnt[nb - 1] += d->tcnt[i];
        have += d->tcnt[i];
        if (have >= cap) have = 0;
    }
    d->nbuckets = d->desc.method == DT_DDP_BUCKETS ? nb : 0;
    return DT_OK;
}

dt_result dt_ddp_broadcast_params(dt_ddp *d) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_broadcast_params: ddp is NULL");
    return dt__same_model(d->comm, d->model, "dt_ddp_broadcast_params", 1);
}

dt_result dt_ddp_create(dt_ddp **out, dt_comm *c, dt_model *m, const dt_ddp_desc *desc) {
    dt_ddp_desc dd;
    dt_ddp *d;
    dt_result r;
    int me = c ? c->rank : -1;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: out is NULL");
    *out = NULL;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: the communicator is NULL");
    if (!m || !m->finalized)
        return dt_set_error(m ? DT_ERR_STATE : DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: the model is %s", me,
                            m ? "not finalized: call dt_model_finalize first" : "NULL");
    if (dd.method < 0 || dd.method >= DT_DDP_METHOD_COUNT || dd.algo < 0 || dd.algo >= DT_ALGO_COUNT || dd.bucket_bytes < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_create: rank %d: bad desc (method %d, algo %d, bucket_bytes %lld): "
                            "method is a dt_ddp_method, algo a dt_algo, bucket_bytes >= 0", me, (int)dd.method,
                            (int)dd.algo, (long long)dd.bucket_bytes);
    if (!dd.bucket_bytes) dd.bucket_bytes = DT_DDP_BUCKET_BYTES;
    if (!(d = (dt_ddp *)DT_MALLOC(sizeof *d))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory", me);
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->desc = dd;
    d->n = m->nparams;
    d->tls_rank = dt__tls_rank;
    d->trace = dt__trace_lane_of(1);
    if (dt__ddp_plan(d) != DT_OK) {
        dt__ddp_free(d);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank %d: no memory for the plan", me);
    }
    if ((dd.method == DT_DDP_PARAM_SERVER || dd.method == DT_DDP_P2P) && me == 0 && c->size > 1) {
        d->gathered = (float *)DT_MALLOC(sizeof(float) * (size_t)(c->size * (d->n ? d->n : 1)));
        d->reqs = (dt_request *)DT_MALLOC(sizeof(dt_request) * (size_t)c->size);
        if (!d->gathered || !d->reqs) {
            dt__ddp_free(d);
            return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_ddp_create: rank 0: no memory to gather %d gradients of %lld floats "
                                "(the parameter server's buffer); use --sync flat or buckets", c->size, (long long)m->nparams);
        }
    }
    if ((r = dt__same_model(c, m, "dt_ddp_create", 1)) != DT_OK) { dt__ddp_free(d); return r; }
    /* the helper thread calls the communicator: local ranks only (MPI is initialised FUNNELED) */
#if DT__HAVE_THREADS
    if (dd.method == DT_DDP_BUCKETS && !dd.no_overlap && c->size > 1 && strcmp(dt_comm_backend_name(c), "local") == 0) {
        if (dt__mutex_init(&d->mu) == 0 && dt__cond_init(&d->cv) == 0 && dt__thread_start(&d->thread, dt__ddp_helper, d) == 0) {
            d->overlap = 1;
            dt_model_set_backward_hook(m, dt__ddp_hook, d);
        } else {
            dt_log(DT_LOG_WARN, "dt_ddp_create: rank %d: could not start the helper thread; buckets are reduced after backward", me);
        }
    }
#endif
    *out = d;
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
    if (!d) return;
#if DT__HAVE_THREADS
    if (d->overlap) {
        dt__mutex_lock(&d->mu);
        d->quit = 1;
        dt__cond_broadcast(&d->cv);
        dt__mutex_unlock(&d->mu);
        dt__thread_join(&d->thread);
        dt__cond_destroy(&d->cv);
        dt__mutex_destroy(&d->mu);
    }
#endif
    if (d->model->hook_user == d) dt_model_set_backward_hook(d->model, NULL, NULL);
    dt__ddp_free(d);
}

static dt_result dt__ddp_bad(const dt_ddp *d, int64_t samples, const char *what) {
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "%s: ddp is NULL", what);
    if (samples <= 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d: samples is %lld; give the batch's sample count (> 0)", what,
                            d->comm->rank, (long long)samples);
    return DT_OK;
}

/* After the sum: buffers if asked, counters, and a fresh accumulation. */
static dt_result dt__ddp_done(dt_ddp *d, dt_result r, double t0) {
    if (r == DT_OK && d->desc.sync_buffers) r = dt_ddp_sync_buffers(d);
    d->stats.comm_seconds += dt_time_now() - t0;
    d->stats.syncs += r == DT_OK;
    d->acc_samples = d->last_samples = 0;
    return r;
}

dt_result dt_ddp_sync(dt_ddp *d, int64_t samples) {
    dt_result r;
    int64_t nactive;
    double t0 = dt_time_now();
    if ((r = dt__ddp_bad(d, samples, "dt_ddp_sync")) != DT_OK) return r;
    d->acc_samples = d->last_samples = samples;
    dt_trace_begin("ddp sync", "comm");
    if ((r = dt__ddp_agree(d, 1, &nactive)) == DT_OK) r = dt__ddp_reduce_all(d, 0);
    dt_trace_end();
    return dt__ddp_done(d, r, t0);
}

dt_result dt_ddp_backward(dt_ddp *d, const float *dy, int64_t samples, int sync) {
    dt_result r, rb;
    int64_t j, nactive;
    double t0;
    if ((r = dt__ddp_bad(d, samples, "dt_ddp_backward")) != DT_OK) return r;
    if (d->last_samples > 0 && d->last_samples != samples) {   /* keep the buffer = sum of gradients / samples */
        float f = (float)((double)d->last_samples / (double)samples);
        for (j = 0; j < d->n; j++) d->model->grads[j] *= f;
    }
    d->acc_samples += samples;
    d->last_samples = samples;
    if (!sync) return dt_model_backward(d->model, dy);
    t0 = dt_time_now();
    if ((r = dt__ddp_agree(d, 1, &nactive)) != DT_OK) return dt__ddp_done(d, r, t0);
    if (!d->overlap) {
        t0 -= dt_time_now();   /* backward's time is not communication */
        rb = dt_model_backward(d->model, dy);
        t0 += dt_time_now();
        if (rb != DT_OK) return rb;
        dt_trace_begin("ddp sync", "comm");
        r = dt__ddp_reduce_all(d, 0);
        dt_trace_end();
        return dt__ddp_done(d, r, t0);
    }
    /* hand the communicator to the helper, run backward, then wait for the buckets backward did not hide */
    dt__mutex_lock(&d->mu);
    d->ready = d->ready_seen = d->n;
    d->herr = DT_OK;
    d->job = 1;
    dt__cond_broadcast(&d->cv);
    dt__mutex_unlock(&d->mu);
    d->in_sync = 1;
    t0 -= dt_time_now();
    rb = dt_model_backward(d->model, dy);
    t0 += dt_time_now();
    d->in_sync = 0;
    dt_trace_begin("wait for buckets", "comm");   /* the communication backward did not hide */
    dt__mutex_lock(&d->mu);
    d->ready = 0;
    dt__cond_broadcast(&d->cv);
    while (d->job) dt__cond_wait(&d->cv, &d->mu);
    r = d->herr;
    dt__mutex_unlock(&d->mu);
    dt_trace_end();
    if (rb != DT_OK) return rb;
    if (r != DT_OK) snprintf(dt__errmsg, sizeof dt__errmsg, "%s", d->hmsg);
    return dt__ddp_done(d, r, t0);
}

/* dt_ddp_join's rounds: until no rank has data, the others' syncs with a zero gradient. */
static dt_result dt__ddp_join_rounds(dt_ddp *d, dt_optim *o) {
    dt_result r;
    int64_t nactive;
    for (;;) {
        double t0 = dt_time_now();
        if ((r = dt__ddp_agree(d, 0, &nactive)) != DT_OK) return r;
        if (nactive == 0) { d->stats.comm_seconds += dt_time_now() - t0; return DT_OK; }   /* everyone has joined */
        dt_model_zero_grad(d->model);
        r = dt__ddp_reduce_all(d, 0);
        if ((r = dt__ddp_done(d, r, t0)) != DT_OK) return r;
        d->stats.syncs--;
        d->stats.joined_rounds++;
        if (o && (r = dt_optim_step(o)) != DT_OK) return r;
        dt_model_zero_grad(d->model);
    }
}
dt_result dt_ddp_join(dt_ddp *d, dt_optim *o) {
    int mark = dt__trace_mark();
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_join: ddp is NULL");
    if (d->acc_samples)
        return dt_set_error(DT_ERR_STATE, "dt_ddp_join: rank %d has %lld samples accumulated but not synced: pass sync = 1 "
                            "to dt_ddp_backward on the last batch", d->comm->rank, (long long)d->acc_samples);
    dt_trace_begin("ddp join", "comm");
    return dt__trace_close(mark, dt__ddp_join_rounds(d, o));
}

dt_result dt_ddp_sync_buffers(dt_ddp *d) {
    int64_t nb = 0;
    float *b;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_ddp_sync_buffers: ddp is NULL");
    b = dt_model_buffers(d->model, &nb);
    if (nb == 0 || d->comm->size == 1) return DT_OK;
    return dt_comm_allreduce(d->comm, b, (size_t)nb, DT_F32, DT_MEAN, d->desc.algo);
}

dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d) {
    dt_ddp_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

int dt_ddp_buckets(const dt_ddp *d) { return d ? d->nbuckets : 0; }
int dt_ddp_overlapped(const dt_ddp *d) { return d ? d->overlap : 0; }

/* ---- D-PSGD ------------------------------------------------------------------------------------
   One neighbour exchange per step sends the replica (n floats) to each neighbour and receives theirs
   into recv. The mix sums W[i][j] x_j over a fixed list (the ranks j = 0, 1, ... with an edge to i, and i
   itself in its place), in double, then adds the local update x_i' - x_i (zero when nothing stepped in
   between), so with the fully connected topology every rank computes the same average bit for bit. */

static const char *const dt__dpsgd_order_names[DT_DPSGD_ORDER_COUNT] = {"cta", "atc"};
const char *dt_dpsgd_order_name(dt_dpsgd_order k) { return dt__enum_name(dt__dpsgd_order_names, DT_DPSGD_ORDER_COUNT, (int)k); }

dt_result dt_dpsgd_order_parse(const char *s, dt_dpsgd_order *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__dpsgd_order_names, DT_DPSGD_ORDER_COUNT, s, &k, "D-PSGD order (cta: combine then adapt, atc: adapt then combine)");
    if (r == DT_OK && out) *out = (dt_dpsgd_order)k;
    return r;
}

struct dt_dpsgd {
    dt_comm           *comm;
    dt_model          *model;
    const dt_topology *topo;
    dt_dpsgd_desc      desc;
    int64_t            n, nb;       /* parameters, buffers */
    int                deg;         /* neighbours of this rank */
    const int         *nbrs;        /* [deg] ascending (the topology's) */
    double            *w;           /* [deg + 1] W[i][j] in mixing order (j ascending, i in its place) */
    int                self_at;     /* position of this rank in that order */
    const float      **src;         /* [deg + 1] the replicas being mixed */
    float             *recv;        /* [deg * max(n, nb)] the neighbours' replicas */
    float             *own;         /* [max(n, nb)] this rank's replica as sent */
    float             *keep;        /* [n + nb] the replica kept aside by dt_dpsgd_use_average */
    float             *avg;         /* [n + nb] the mean, for consensus and averages */
    int                using_avg;
    dt_dpsgd_stats     stats;
};

static void dt__dpsgd_free(dt_dpsgd *d) {
    DT_FREE(d->w);
    DT_FREE((void *)d->src);
    DT_FREE(d->recv);
    DT_FREE(d->own);
    DT_FREE(d->keep);
    DT_FREE(d->avg);
    DT_FREE(d);
}

/* Sends own [cnt] to the neighbours, then x[k] = sum_j W[i][j] x_j[k] + (x[k] - own[k]). */
static dt_result dt__dpsgd_gossip(dt_dpsgd *d, float *x, const float *own, int64_t cnt) {
    int q, m = d->deg + 1;
    int64_t k;
    uint64_t b0 = d->comm->stats.bytes_sent;
    double t0 = dt_time_now();
    dt_result r = dt_comm_neighbor_exchange(d->comm, own, d->recv, (size_t)cnt, DT_F32, d->nbrs, d->deg, d->nbrs, d->deg);
    d->stats.comm_seconds += dt_time_now() - t0;
    d->stats.bytes_sent += d->comm->stats.bytes_sent - b0;
    if (r != DT_OK) return r;
    for (q = 0; q < m; q++) d->src[q] = q == d->self_at ? own : d->recv + (int64_t)(q - (q > d->self_at)) * cnt;
    dt_trace_begin("gossip mix", "optim");
    DT__OMP(parallel for if (cnt * m > DT__PAR_MIN))
    for (k = 0; k < cnt; k++) {
        double acc = 0.0;
        int j;
        for (j = 0; j < m; j++) acc += d->w[j] * (double)d->src[j][k];
        x[k] = (float)(acc + ((double)x[k] - (double)own[k]));
    }
    dt_trace_end();
    return DT_OK;
}

/* Collective: the mean of every rank's params and buffers into d->avg [n + nb]. */
static dt_result dt__dpsgd_mean(dt_dpsgd *d) {
    dt_result r;
    memcpy(d->avg, d->model->params, sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(d->avg + d->n, dt_model_buffers(d->model, NULL), sizeof(float) * (size_t)d->nb);
    if (d->comm->size == 1) return DT_OK;
    r = dt_comm_allreduce(d->comm, d->avg, (size_t)(d->n + d->nb), DT_F32, DT_MEAN, DT_ALGO_AUTO);
    return r;
}

dt_result dt_dpsgd_create(dt_dpsgd **out, dt_comm *c, dt_model *m, const dt_topology *t, const dt_dpsgd_desc *desc) {
    dt_dpsgd_desc dd;
    dt_dpsgd *d;
    dt_result r;
    int64_t big;
    int me = c ? c->rank : -1, q;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: out is NULL");
    *out = NULL;
    memset(&dd, 0, sizeof dd);
    if (desc) dd = *desc;
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: the communicator is NULL");
    if (!m || !m->finalized)
        return dt_set_error(m ? DT_ERR_STATE : DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: the model is %s", me,
                            m ? "not finalized: call dt_model_finalize first" : "NULL");
    if (!t || !t->weights || !t->offsets)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: the topology is %s: build it with dt_topology_create", me,
                            t ? "empty" : "NULL");
    if (t->world != c->size)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: the topology has %d ranks but the communicator %d: "
                            "give dt_topology_desc.world = dt_comm_size(c)", me, t->world, c->size);
    if (dd.order < 0 || dd.order >= DT_DPSGD_ORDER_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_create: rank %d: bad order %d: use a dt_dpsgd_order", me, (int)dd.order);
    if (!(d = (dt_dpsgd *)DT_MALLOC(sizeof *d))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory", me);
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->topo = t;
    d->desc = dd;
    d->n = m->nparams;
    dt_model_buffers(m, &d->nb);
    d->deg = t->offsets[me + 1] - t->offsets[me];
    d->nbrs = t->neighbors + t->offsets[me];
    big = d->n > d->nb ? d->n : d->nb;
    d->w = (double *)DT_MALLOC(sizeof(double) * (size_t)(d->deg + 1));
    d->src = (const float **)DT_MALLOC(sizeof(float *) * (size_t)(d->deg + 1));
    d->recv = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->deg * big + 1));
    d->own = (float *)DT_MALLOC(sizeof(float) * (size_t)(big + 1));
    d->keep = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + d->nb + 1));
    d->avg = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + d->nb + 1));
    if (!d->w || !d->src || !d->recv || !d->own || !d->keep || !d->avg) {
        dt__dpsgd_free(d);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_dpsgd_create: rank %d: no memory for %d neighbours' replicas of %lld floats",
                            me, t->offsets[me + 1] - t->offsets[me], (long long)big);
    }
    d->self_at = d->deg;
    for (q = 0; q < d->deg; q++)
        if (d->nbrs[q] > me) { d->self_at = q; break; }
    for (q = 0; q <= d->deg; q++) {
        int j = q == d->self_at ? me : d->nbrs[q - (q > d->self_at)];
        d->w[q] = t->weights[(int64_t)me * t->world + j];
    }
    if ((r = dt__same_model(c, m, "dt_dpsgd_create", 1)) != DT_OK) { dt__dpsgd_free(d); return r; }
    *out = d;
    return DT_OK;
}

void dt_dpsgd_destroy(dt_dpsgd *d) {
    if (d) dt__dpsgd_free(d);
}

dt_result dt_dpsgd_step(dt_dpsgd *d, dt_optim *o) {
    float *x;
    dt_result r;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_step: dpsgd is NULL");
    if (d->using_avg)
        return dt_set_error(DT_ERR_STATE, "dt_dpsgd_step: rank %d: the model holds the average: call dt_dpsgd_use_average(d, 0) "
                            "first", d->comm->rank);
    x = d->model->params;
    if (o && d->desc.order == DT_DPSGD_ADAPT_THEN_COMBINE && (r = dt_optim_step(o)) != DT_OK) return r;
    memcpy(d->own, x, sizeof(float) * (size_t)d->n);
    if (o && d->desc.order == DT_DPSGD_COMBINE_THEN_ADAPT) {
        /* the update at the replica before averaging: x' = x - lr g(x); the mix adds x' - own */
        if ((r = dt_optim_step(o)) != DT_OK) return r;
    }
    if ((r = dt__dpsgd_gossip(d, x, d->own, d->n)) != DT_OK) return r;
    if (d->desc.mix_buffers && d->nb) {
        float *b = dt_model_buffers(d->model, NULL);
        memcpy(d->own, b, sizeof(float) * (size_t)d->nb);
        if ((r = dt__dpsgd_gossip(d, b, d->own, d->nb)) != DT_OK) return r;
    }
    d->stats.steps++;
    return DT_OK;
}

dt_result dt_dpsgd_consensus(dt_dpsgd *d, double *dist) {
    double s = 0.0;
    int64_t k;
    dt_result r;
    if (!d || !dist) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_consensus: %s is NULL", d ? "dist" : "dpsgd");
    *dist = 0.0;
    if ((r = dt__dpsgd_mean(d)) != DT_OK) return r;
    for (k = 0; k < d->n; k++) {
        double e = (double)d->model->params[k] - (double)d->avg[k];
        s += e * e;
    }
    s = sqrt(s);
    if (d->comm->size > 1 && (r = dt_comm_allreduce(d->comm, &s, 1, DT_F64, DT_SUM, DT_ALGO_AUTO)) != DT_OK) return r;
    *dist = s / (double)d->comm->size;
    return DT_OK;
}

dt_result dt_dpsgd_average(dt_dpsgd *d, float *out) {
    dt_result r;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_average: dpsgd is NULL");
    if ((r = dt__dpsgd_mean(d)) != DT_OK) return r;
    if (out) { memcpy(out, d->avg, sizeof(float) * (size_t)d->n); return DT_OK; }
    memcpy(d->model->params, d->avg, sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(dt_model_buffers(d->model, NULL), d->avg + d->n, sizeof(float) * (size_t)d->nb);
    return DT_OK;
}

dt_result dt_dpsgd_use_average(dt_dpsgd *d, int use) {
    float *b;
    if (!d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_dpsgd_use_average: dpsgd is NULL");
    if (!!use == d->using_avg)
        return dt_set_error(DT_ERR_STATE, "dt_dpsgd_use_average: rank %d: the model %s the average already", d->comm->rank,
                            use ? "holds" : "does not hold");
    b = dt_model_buffers(d->model, NULL);
    if (!use) {
        memcpy(d->model->params, d->keep, sizeof(float) * (size_t)d->n);
        if (d->nb) memcpy(b, d->keep + d->n, sizeof(float) * (size_t)d->nb);
        d->using_avg = 0;
        return DT_OK;
    }
    memcpy(d->keep, d->model->params, sizeof(float) * (size_t)d->n);
    if (d->nb) memcpy(d->keep + d->n, b, sizeof(float) * (size_t)d->nb);
    d->using_avg = 1;
    return dt_dpsgd_average(d, NULL);
}

dt_dpsgd_stats dt_dpsgd_get_stats(const dt_dpsgd *d) {
    dt_dpsgd_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

/* ---- FedAvg ------------------------------------------------------------------------------------
   The aggregators are pure functions over the updates. The round protocol needs no agreement message:
   every rank draws the same clients and dropouts from (seed, round), so each host knows which clients to
   train and the server knows which updates to expect; it posts one receive per reporting client, in client
   order, which matches the order each host sends in (same tag, same source: messages keep their order). */

static const char *const dt__fed_agg_names[DT_FED_AGG_COUNT] = {"mean", "median", "trimmed", "krum", "multikrum", "classmean"};
const char *dt_fed_agg_name(dt_fed_agg k) { return dt__enum_name(dt__fed_agg_names, DT_FED_AGG_COUNT, (int)k); }

dt_result dt_fed_agg_parse(const char *s, dt_fed_agg *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__fed_agg_names, DT_FED_AGG_COUNT, s, &k, "aggregator");
    if (r == DT_OK && out) *out = (dt_fed_agg)k;
    return r;
}

/* Insertion sort: the columns are as short as the number of clients, and it is stable. */
static void dt__fed_sort(double *v, int n) {
    int i, j;
    for (i = 1; i < n; i++) {
        double x = v[i];
        for (j = i - 1; j >= 0 && v[j] > x; j--) v[j + 1] = v[j];
        v[j + 1] = x;
    }
}

static double dt__fed_median_sorted(const double *v, int n) {
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* out = sum over the kept clients of (w_i / W) u_i, in client order (kept NULL = all). */
static void dt__fed_mean(const float *const *u, const double *w, const int *kept, int n, int64_t len, float *out) {
    double total = 0.0;
    int i;
    int64_t j;
    for (i = 0; i < n; i++) if (!kept || kept[i]) total += w ? w[i] : 1.0;
    for (j = 0; j < len; j++) out[j] = 0.0f;
    for (i = 0; i < n; i++) {
        float s;
        if (kept && !kept[i]) continue;
        s = (float)((w ? w[i] : 1.0) / total);
        for (j = 0; j < len; j++) out[j] += s * u[i][j];
    }
}

/* Coordinate-wise median (t < 0) or mean of the sorted column without its t lowest and t highest. */
static void dt__fed_columns(const float *const *u, int n, int64_t len, int t, double *col, float *out) {
    int64_t j;
    int i;
    for (j = 0; j < len; j++) {
        double s = 0.0;
        for (i = 0; i < n; i++) col[i] = u[i][j];
        dt__fed_sort(col, n);
        if (t < 0) { out[j] = (float)dt__fed_median_sorted(col, n); continue; }
        for (i = t; i < n - t; i++) s += col[i];
        out[j] = (float)(s / (double)(n - 2 * t));
    }
}

/* Krum scores: score[i] = sum of the n - f - 2 smallest squared distances from u_i to the others; order
   gets the clients by increasing score (ties: lower index first). dist [n * n], tmp [n]. */
static void dt__fed_krum(const float *const *u, int n, int64_t len, int f, double *dist, double *tmp, double *score,
                         int *order) {
    int i, k, c = n - f - 2;
    int64_t j;
    for (i = 0; i < n; i++) {
        dist[i * n + i] = 0.0;
        for (k = i + 1; k < n; k++) {
            double s = 0.0;
            for (j = 0; j < len; j++) { double d = (double)u[i][j] - (double)u[k][j]; s += d * d; }
            dist[i * n + k] = dist[k * n + i] = s;
        }
    }
    for (i = 0; i < n; i++) {
        double s = 0.0;
        int m = 0;
        for (k = 0; k < n; k++) if (k != i) tmp[m++] = dist[i * n + k];
        dt__fed_sort(tmp, m);
        for (k = 0; k < c; k++) s += tmp[k];
        score[i] = s;
        order[i] = i;
    }
    for (i = 1; i < n; i++) {   /* stable insertion sort of the indices by score */
        int x = order[i];
        for (k = i - 1; k >= 0 && score[order[k]] > score[x]; k--) order[k + 1] = order[k];
        order[k + 1] = x;
    }
}

/* The class-mean check: kept[i] = 0 for a client whose row of some class lies beyond k median distances
   from that class's coordinate-median row. col [n], d [n], med [cols]. */
static void dt__fed_classmean(const float *const *u, int n, const dt_fed_agg_desc *a, double *col, double *d,
                              double *sorted, float *med, int *kept) {
    int64_t c, j;
    int i;
    for (i = 0; i < n; i++) kept[i] = 1;
    for (c = 0; c < a->cm_rows; c++) {
        int64_t base = a->cm_offset + c * a->cm_cols;
        double s;
        for (j = 0; j < a->cm_cols; j++) {
            for (i = 0; i < n; i++) col[i] = u[i][base + j];
            dt__fed_sort(col, n);
            med[j] = (float)dt__fed_median_sorted(col, n);
        }
        for (i = 0; i < n; i++) {
            double q = 0.0;
            for (j = 0; j < a->cm_cols; j++) { double e = (double)u[i][base + j] - (double)med[j]; q += e * e; }
            d[i] = sorted[i] = sqrt(q);
        }
        dt__fed_sort(sorted, n);
        s = dt__fed_median_sorted(sorted, n);
        for (i = 0; i < n; i++) if (d[i] > (double)a->k * s) kept[i] = 0;
    }
}

dt_result dt_fed_aggregate(dt_fed_agg kind, const float *const *updates, const double *weights, int n, int64_t len,
                           float *out, const dt_fed_agg_desc *desc) {
    dt_fed_agg_desc a;
    double *scratch = NULL;
    int *order = NULL, *kept = NULL, i, t = 0;
    dt_result r = DT_OK;
    memset(&a, 0, sizeof a);
    if (desc) a = *desc;
    if (!a.trim) a.trim = 0.1f;
    if (!a.f) a.f = 1;
    if (!a.k) a.k = 3.0f;
    if (!updates || !out || n < 1 || len < 0 || kind < 0 || kind >= DT_FED_AGG_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: bad arguments (updates %p, out %p, n %d, len %lld, "
                            "kind %d): give n >= 1 updates of len >= 0 and a dt_fed_agg", (const void *)updates,
                            (void *)out, n, (long long)len, (int)kind);
    for (i = 0; i < n; i++) {
        if (!updates[i]) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: update %d is NULL", i);
        if (weights && !(weights[i] > 0.0 && weights[i] < INFINITY))
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: client %d's weight is %g; weights are sample counts > 0",
                                i, weights[i]);
    }
    if (kind == DT_FED_TRIMMED) {
        t = (int)floor((double)a.trim * (double)n);
        if (a.trim < 0.0f || 2 * t >= n)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: trimmed mean of %d clients with trim %g cuts %d at each "
                                "end, leaving none: need 2 * floor(trim * n) < n", n, (double)a.trim, t);
    }
    if ((kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) && (a.f < 0 || n < 2 * a.f + 3))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: %s with f = %d Byzantine clients needs n >= 2f + 3 = %d clients, "
                            "got %d: sample more clients or lower f", dt_fed_agg_name(kind), a.f, 2 * a.f + 3, n);
    if (kind == DT_FED_MULTIKRUM && (a.m < 0 || a.m > n))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: multikrum m = %d, need 0 <= m <= n = %d", a.m, n);
    if (kind == DT_FED_CLASSMEAN && (n < 3 || a.k < 1.0f || a.cm_rows < 1 || a.cm_cols < 1 || a.cm_offset < 0 ||
                                     a.cm_offset + a.cm_rows * a.cm_cols > len))
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_aggregate: classmean needs n >= 3 clients (got %d), k >= 1 (got %g) and "
                            "the last layer's weight [%lld, %lld] at offset %lld inside the update of %lld", n, (double)a.k,
                            (long long)a.cm_rows, (long long)a.cm_cols, (long long)a.cm_offset, (long long)len);
    scratch = (double *)DT_MALLOC(sizeof(double) * (size_t)(n * (n + 4) + (kind == DT_FED_CLASSMEAN ? a.cm_cols : 0)));
    order = (int *)DT_MALLOC(sizeof(int) * (size_t)n * 2);
    if (!scratch || !order) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_aggregate: no memory for %d clients", n); goto done; }
    kept = order + n;
    for (i = 0; i < n; i++) kept[i] = 1;
    switch (kind) {
    case DT_FED_MEAN: dt__fed_mean(updates, weights, NULL, n, len, out); break;
    case DT_FED_MEDIAN: dt__fed_columns(updates, n, len, -1, scratch, out); break;
    case DT_FED_TRIMMED: dt__fed_columns(updates, n, len, t, scratch, out); break;
    case DT_FED_KRUM:
    case DT_FED_MULTIKRUM: {
        int m = kind == DT_FED_KRUM ? 1 : (a.m ? a.m : n - a.f);
        dt__fed_krum(updates, n, len, a.f, scratch, scratch + n * n, scratch + n * n + n, order);
        for (i = 0; i < n; i++) kept[i] = 0;
        for (i = 0; i < m; i++) kept[order[i]] = 1;
        dt__fed_mean(updates, NULL, kept, n, len, out);
        break;
    }
    default: /* DT_FED_CLASSMEAN */
        dt__fed_classmean(updates, n, &a, scratch, scratch + n, scratch + 2 * n, (float *)(scratch + 3 * n), kept);
        dt__fed_mean(updates, weights, kept, n, len, out);
        break;
    }
    if (a.kept) for (i = 0; i < n; i++) a.kept[i] = kept[i];
done:
    DT_FREE(scratch);
    DT_FREE(order);
    return r;
}

/* The fewest updates the aggregator accepts (Krum's 2f + 3, the class-mean check's 3). */
static int dt__fed_min_clients(dt_fed_agg kind, const dt_fed_agg_desc *a) {
    if (kind == DT_FED_KRUM || kind == DT_FED_MULTIKRUM) return 2 * (a->f ? a->f : 1) + 3;
    if (kind == DT_FED_CLASSMEAN) return 3;
    if (kind == DT_FED_TRIMMED) { int n = 1; while (2 * (int)floor((double)(a->trim ? a->trim : 0.1f) * n) >= n && n < 1000) n++; return n; }
    return 1;
}

struct dt_fed {
    dt_comm       *comm;
    dt_model      *model;
    dt_fed_desc    desc;
    int64_t        n;            /* parameters */
    int            nsel;         /* clients sampled per round */
    int           *behaviour;    /* [clients] */
    int           *sel, *drop;   /* [clients] the round's draw */
    int           *kept, *last_kept; /* [nsel] of the aggregate; [clients] by client id */
    float         *global;       /* [n] the round's global model */
    float         *delta;        /* [n] a host's update being sent */
    float         *updates;      /* rank 0: [nsel * n] the reported updates */
    double        *stats;        /* rank 0: [nsel * 2] samples and loss sum of each report */
    double        *weights;      /* rank 0: [nsel] */
    const float  **ptrs;         /* rank 0: [nsel] */
    int           *who;          /* rank 0: [nsel] client of each report */
    dt_request    *reqs;         /* rank 0: [nsel * 2] */
    int32_t       *ybuf;         /* [batch] flipped labels */
};

static void dt__fed_rng(dt_rng *r, const dt_fed *f, int64_t round, uint64_t what, uint64_t stream) {
    dt_rng_init(r, f->desc.seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(round + 1)) ^ (what << 56), stream);
}

int dt_fed_draw(const dt_fed *f, int64_t round, int *sel, int *dropped) {
    int nc, i, m;
    int *perm = sel;
    dt_rng r;
    if (!f || !sel || !dropped) return 0;
    nc = f->desc.clients;
    m = f->nsel;
    for (i = 0; i < nc; i++) perm[i] = i;
    dt__fed_rng(&r, f, round, 1, 0);
    for (i = 0; i < m; i++) {   /* partial Fisher-Yates: the first m of a seeded permutation */
        int j = i + (int)dt_rng_below(&r, (uint32_t)(nc - i)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (i = 1; i < m; i++) {   /* sorted, so hosts and server walk the clients in the same order */
        int x = sel[i], j;
        for (j = i - 1; j >= 0 && sel[j] > x; j--) sel[j + 1] = sel[j];
        sel[j + 1] = x;
    }
    for (i = 0; i < m; i++) {
        dt_rng d;
        dt__fed_rng(&d, f, round, 2, (uint64_t)sel[i]);
        dropped[i] = f->desc.dropout_prob > 0.0f && dt_rng_uniform(&d) < f->desc.dropout_prob;
    }
    return m;
}

void dt_fed_last_kept(const dt_fed *f, int *kept) {
    int i;
    if (!f || !kept) return;
    for (i = 0; i < f->desc.clients; i++) kept[i] = f->last_kept ? f->last_kept[i] : 0;
}

void dt_fed_destroy(dt_fed *f) {
    if (!f) return;
    DT_FREE(f->behaviour); DT_FREE(f->sel); DT_FREE(f->drop); DT_FREE(f->kept); DT_FREE(f->last_kept);
    DT_FREE(f->global); DT_FREE(f->delta); DT_FREE(f->updates); DT_FREE(f->stats); DT_FREE(f->weights);
    DT_FREE((void *)f->ptrs); DT_FREE(f->who); DT_FREE(f->reqs); DT_FREE(f->ybuf);
    DT_FREE(f);
}

dt_result dt_fed_create(dt_fed **out, dt_comm *c, dt_model *m, const dt_fed_desc *desc) {
    dt_fed *f;
    dt_fed_desc d;
    int me = c ? c->rank : -1, i, nc;
    size_t n;
    dt_result r;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: out is NULL");
    *out = NULL;
    if (!c || !m || !m->finalized || !desc || !desc->data || !desc->part)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: needs a communicator, a finalized model, a desc, "
                            "its dataset and its partition", me);
    d = *desc;
    if (!d.clients) d.clients = c->size > 1 ? c->size - 1 : 1;
    if (!d.frac) d.frac = 1.0f;
    if (!d.local_epochs) d.local_epochs = 1;
    if (!d.batch) d.batch = 10;
    if (!d.noise_std) d.noise_std = 1.0f;
    if (!d.agg_desc.cm_rows) {   /* the class-mean check reads the last linear layer's weight */
        for (i = dt_model_param_tensors(m) - 1; i >= 0; i--) {
            dt_param_info pi = dt_model_param_info(m, i);
            if (pi.ndim == 2) {
                d.agg_desc.cm_offset = pi.offset; d.agg_desc.cm_rows = pi.shape[0]; d.agg_desc.cm_cols = pi.shape[1];
                break;
            }
        }
    }
    nc = d.clients;
    if (nc < 1 || d.part->parts != nc || !(d.frac > 0.0f && d.frac <= 1.0f) || d.local_epochs < 1 || d.batch < 1 ||
        d.prox_mu < 0.0f || !(d.dropout_prob >= 0.0f && d.dropout_prob < 1.0f) || d.agg < 0 || d.agg >= DT_FED_AGG_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: bad desc (clients %d, partition of %d parts, frac %g, "
                            "local_epochs %d, batch %lld, prox_mu %g, dropout_prob %g): the partition needs one part per "
                            "client, 0 < frac <= 1, 0 <= dropout_prob < 1", me, nc, d.part->parts, (double)d.frac,
                            d.local_epochs, (long long)d.batch, (double)d.prox_mu, (double)d.dropout_prob);
    if (!(f = (dt_fed *)DT_MALLOC(sizeof *f))) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_create: rank %d: no memory", me);
    memset(f, 0, sizeof *f);
    f->comm = c; f->model = m; f->desc = d; f->n = m->nparams;
    f->desc.behaviour = NULL;
    f->desc.agg_desc.kept = NULL;
    f->nsel = (int)floor((double)d.frac * (double)nc + 0.5);
    if (f->nsel < 1) f->nsel = 1;
    if (f->nsel > nc) f->nsel = nc;
    if (f->nsel < dt__fed_min_clients(d.agg, &d.agg_desc)) {
        dt_fed_destroy(f);
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_create: rank %d: %s needs at least %d clients per round, but C = %g of %d "
                            "clients samples %d: raise --frac or --clients", me, dt_fed_agg_name(d.agg),
                            dt__fed_min_clients(d.agg, &d.agg_desc), (double)d.frac, nc, (int)floor((double)d.frac * nc + 0.5));
    }
    n = (size_t)(f->n ? f->n : 1);
    f->behaviour = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->sel = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->drop = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->kept = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->last_kept = (int *)DT_MALLOC(sizeof(int) * (size_t)nc);
    f->global = (float *)DT_MALLOC(sizeof(float) * n);
    f->delta = (float *)DT_MALLOC(sizeof(float) * n);
    f->ybuf = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)d.batch);
    if (me == 0) {
        f->updates = (float *)DT_MALLOC(sizeof(float) * n * (size_t)f->nsel);
        f->stats = (double *)DT_MALLOC(sizeof(double) * 2 * (size_t)f->nsel);
        f->weights = (double *)DT_MALLOC(sizeof(double) * (size_t)f->nsel);
        f->ptrs = (const float **)DT_MALLOC(sizeof(float *) * (size_t)f->nsel);
        f->who = (int *)DT_MALLOC(sizeof(int) * (size_t)f->nsel);
        f->reqs = (dt_request *)DT_MALLOC(sizeof(dt_request) * 2 * (size_t)f->nsel);
    }
    if (!f->behaviour || !f->sel || !f->drop || !f->kept || !f->last_kept || !f->global || !f->delta || !f->ybuf ||
        (me == 0 && (!f->updates || !f->stats || !f->weights || !f->ptrs || !f->who || !f->reqs))) {
        dt_fed_destroy(f);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_fed_create: rank %d: no memory (the server keeps %d updates of %lld floats: "
                            "lower --frac)", me, f->nsel, (long long)f->n);
    }
    for (i = 0; i < nc; i++) {
        f->behaviour[i] = desc->behaviour ? desc->behaviour[i] : DT_FED_HONEST;
        f->last_kept[i] = 0;
    }
    if ((r = dt__same_model(c, m, "dt_fed_create", 0)) != DT_OK) { dt_fed_destroy(f); return r; }
    *out = f;
    return DT_OK;
}

/* Client k's local training from f->global: E epochs of batch B with a fresh optimizer at rate lr. Leaves
   delta = w_local - w_global (after the client's behaviour) and st = {samples, loss sum over the epochs}. */
static dt_result dt__fed_train_client(dt_fed *f, int k, int64_t round, float lr, float *delta, double *st) {
    const dt_fed_desc *d = &f->desc;
    dt_model *m = f->model;
    float *w = dt_model_params(m, NULL), *g = dt_model_grads(m, NULL);
    int64_t off = d->part->offsets[k], cnt = d->part->offsets[k + 1] - off, j, e;
    dt_optim *o = NULL;
    dt_loader *l = NULL;
    dt_optim_desc od = d->optim;
    dt_loader_desc ld;
    dt_result r;
    int flip = f->behaviour[k] == DT_FED_LABELFLIP && d->flip_set;
    st[0] = (double)cnt;
    st[1] = 0.0;
    for (j = 0; j < f->n; j++) delta[j] = 0.0f;
    if (cnt == 0) return DT_OK;
    dt_trace_begin("client training", "compute");
    dt__trace_arg("client", NULL, k);
    dt__trace_arg("round", NULL, round);
    dt__trace_arg("samples", NULL, cnt);
    memcpy(w, f->global, sizeof(float) * (size_t)f->n);
    od.lr = lr;
    memset(&ld, 0, sizeof ld);
    ld.dataset = d->data; ld.indices = d->part->indices + off; ld.count = cnt; ld.batch = d->batch;
    ld.shuffle = 1; ld.transform = d->transform; ld.seed = d->seed; ld.rank = (uint64_t)k;
    if ((r = dt_optim_create(&o, m, &od)) != DT_OK || (r = dt_loader_create(&l, &ld)) != DT_OK) goto done;
    for (e = 0; e < d->local_epochs && r == DT_OK; e++) {
        const float *x;
        const int32_t *y;
        int64_t nb;
        int got;
        float loss = 0.0f;
        if ((r = dt_loader_start_epoch(l, round * d->local_epochs + e)) != DT_OK) break;
        while (r == DT_OK && (got = dt_loader_next(l, &x, &y, &nb)) == 1) {
            if (flip) {
                for (j = 0; j < nb; j++)
                    f->ybuf[j] = y[j] >= 0 && y[j] < DT_FED_MAX_CLASSES ? d->flip[y[j]] : y[j];
                y = f->ybuf;
            }
            dt_model_zero_grad(m);
            if ((r = dt_model_forward(m, x, nb)) != DT_OK || (r = dt_model_loss_labels(m, y, &loss)) != DT_OK ||
                (r = dt_model_backward(m, NULL)) != DT_OK) break;
            if (d->prox_mu > 0.0f)   /* FedProx: the gradient of (mu / 2) ||w - w_global||^2 */
                for (j = 0; j < f->n; j++) g[j] += d->prox_mu * (w[j] - f->global[j]);
            if ((r = dt_optim_step(o)) != DT_OK) break;
            st[1] += (double)loss * (double)nb;
        }
        if (r == DT_OK && got < 0) r = DT_ERR_STATE;
    }
    if (r != DT_OK) goto done;
    if (f->behaviour[k] == DT_FED_NOISE) {
        dt_rng nr;
        dt__fed_rng(&nr, f, round, 3, (uint64_t)k);
        for (j = 0; j < f->n; j++) delta[j] = d->noise_std * dt_rng_normal(&nr);
    } else {
        float s = f->behaviour[k] == DT_FED_SIGNFLIP ? -1.0f : 1.0f;
        for (j = 0; j < f->n; j++) delta[j] = s * (w[j] - f->global[j]);
    }
done:
    dt_trace_end();
    dt_loader_destroy(l);
    dt_optim_destroy(o);
    if (r != DT_OK)
        return dt_set_error(r, "dt_fed_round: rank %d: client %d failed in round %lld: %s", f->comm->rank, k, (long long)round,
                            dt_last_error());
    return DT_OK;
}

dt_result dt_fed_round(dt_fed *f, int64_t round, dt_fed_round_info *info) {
    dt_comm *c;
    int me, p, nsel, i, nrep = 0, nreq = 0, nagg = 0;
    float lr, *w;
    double loss = 0.0, samples = 0.0;
    dt_result r = DT_OK;
    if (!f) return dt_set_error(DT_ERR_INVALID_ARG, "dt_fed_round: fed is NULL");
    c = f->comm; me = c->rank; p = c->size;
    w = dt_model_params(f->model, NULL);
    lr = (f->desc.sched.kind != DT_SCHED_CONSTANT || f->desc.sched.base_lr > 0.0f) ? dt_sched_lr(&f->desc.sched, round)
                                                                                     : f->desc.optim.lr;
    if (info) memset(info, 0, sizeof *info);
    nsel = dt_fed_draw(f, round, f->sel, f->drop);
    if (me == 0) memcpy(f->global, w, sizeof(float) * (size_t)f->n);
    if ((r = dt_comm_broadcast(c, f->global, (size_t)f->n, DT_F32, 0, DT_ALGO_AUTO)) != DT_OK) return r;
    /* the server posts a receive for every remote client that reports, in client order */
    for (i = 0; i < nsel && me == 0; i++) {
        int k = f->sel[i], host = p == 1 ? 0 : 1 + k % (p - 1);
        if (f->drop[i]) continue;
        f->who[nrep] = k;
        if (host != 0) {
            if ((r = dt_comm_irecv(c, f->stats + 2 * nrep, 2, DT_F64, host, DT_FED_TAG, &f->reqs[nreq++])) != DT_OK ||
                (r = dt_comm_irecv(c, f->updates + (int64_t)nrep * f->n, (size_t)f->n, DT_F32, host, DT_FED_TAG,
                                   &f->reqs[nreq++])) != DT_OK) return r;
        }
        nrep++;
    }
    for (i = 0; i < nsel && r == DT_OK; i++) {   /* hosts train their clients */
        int k = f->sel[i], host = p == 1 ? 0 : 1 + k % (p - 1);
        double st[2];
        if (f->drop[i] || host != me) continue;
        if (p == 1) {
            int slot, s;
            for (slot = 0, s = 0; s < i; s++) slot += !f->drop[s];
            r = dt__fed_train_client(f, k, round, lr, f->updates + (int64_t)slot * f->n, f->stats + 2 * slot);
            continue;
        }
        if ((r = dt__fed_train_client(f, k, round, lr, f->delta, st)) != DT_OK) break;
        if ((r = dt_comm_send(c, st, 2, DT_F64, 0, DT_FED_TAG)) != DT_OK) break;
        r = dt_comm_send(c, f->delta, (size_t)f->n, DT_F32, 0, DT_FED_TAG);
    }
    if (r != DT_OK || me != 0) return r;
    if (nreq && (r = dt_comm_waitall(c, f->reqs, nreq)) != DT_OK) return r;
    for (i = 0; i < f->desc.clients; i++) f->last_kept[i] = 0;
    for (i = 0; i < nrep; i++) {   /* clients with no samples report nothing useful */
        loss += f->stats[2 * i + 1];
        samples += f->stats[2 * i];
        if (f->stats[2 * i] <= 0.0) continue;
        f->ptrs[nagg] = f->updates + (int64_t)i * f->n;
        f->weights[nagg] = f->stats[2 * i];
        f->who[nagg++] = f->who[i];
    }
    if (info) {
        info->selected = nsel;
        info->dropped = nsel - nrep;
        info->samples = (int64_t)samples;
        info->train_loss = samples > 0.0 ? loss / (samples * f->desc.local_epochs) : 0.0;
        info->lr = lr;
    }
    memcpy(w, f->global, sizeof(float) * (size_t)f->n);
    if (nagg < dt__fed_min_clients(f->desc.agg, &f->desc.agg_desc)) {   /* too many dropped: the global model stays */
        if (nagg > 0)
            dt_log(DT_LOG_WARN, "dt_fed_round: round %lld: %d clients reported, fewer than %s needs; the global model is kept",
                   (long long)round, nagg, dt_fed_agg_name(f->desc.agg));
        return DT_OK;
    }
    f->desc.agg_desc.kept = f->kept;
    dt_trace_begin("aggregate", "optim");
    dt__trace_arg("clients", NULL, nagg);
    dt__trace_arg("aggregator", dt_fed_agg_name(f->desc.agg), 0);
    r = dt_fed_aggregate(f->desc.agg, f->ptrs, f->weights, nagg, f->n, f->delta, &f->desc.agg_desc);
    dt_trace_end();
    f->desc.agg_desc.kept = NULL;
    if (r != DT_OK) return r;
    for (i = 0; i < f->n; i++) w[i] = f->global[i] + f->delta[i];
    for (i = 0; i < nagg; i++) {
        f->last_kept[f->who[i]] = f->kept[i];
        if (info) info->kept += f->kept[i];
    }
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_IMPLEMENTATION_DONE */
#endif /* DTRAIN_IMPLEMENTATION */

/* The MPI backend, declarations and (with DTRAIN_IMPLEMENTATION) implementation, for builds with MPI. */
#ifdef DT_USE_MPI
#include "dtrain_mpi.h"
#endif

/*
MIT License

Copyright (c) 2026 the dtrain authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated
documentation files (the "Software"), to deal in the Software without restriction, including without limitation
the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to
permit persons to whom the Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or substantial portions of
the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE
WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR
COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
