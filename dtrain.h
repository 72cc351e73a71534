/* dtrain.h - header-only C library for distributed training of neural networks.   v0.1.0
   MIT license (see the end of this file).

   WHAT IT IS
     One include that gives a C program float32 tensors, layers with forward and backward passes, losses
     and a small model zoo, optimizers, datasets and partitioners, communication, and the distributed
     trainers (DDP, D-PSGD, FedAvg, local SGD, Hogwild), built on flat parameter buffers so that every
     distributed algorithm becomes a vector operation on one array. This file is the manual; the library
     is in the modules of the folder dtrain/ next to it, which it includes (see MODULES at the end).

   HOW TO INCLUDE
     In exactly one C (or C++) file of your project:
         #define DTRAIN_IMPLEMENTATION
         #include "dtrain.h"
     Everywhere else just #include "dtrain.h". Compile with -fopenmp to use every core (optional: without
     OpenMP the same code runs on one thread). Link with -lm. Keep dtrain.h and the folder dtrain/ side by
     side (make install does; -I names the directory that holds both). One file to copy instead: make
     single writes build/single/dtrain.h, the same library amalgamated (with dtrain_mpi.h, dtrain_cuda.h
     and dtrain_cuda.cu beside it).

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
             // N threads here, one rank per process under mpiexec; exit status 0, or 1 after a failure
             return dt_launch(&ld, rank_main, NULL) == DT_OK ? 0 : 1;
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
     |                          |                  | chunk; larger = fewer, bigger GEMMs (and the     |
     |                          |                  | most weights the CPU's taps copy: 2 per weight)  |
     | DT_NO_OPENMP             | undefined        | ignore OpenMP even when compiling with -fopenmp  |
     | DT_NO_THREADS            | undefined        | no POSIX threads: loaders need prefetch = 0, one |
     |                          |                  | local rank only, DDP does not overlap, Hogwild's |
     |                          |                  | workers run one after another                    |
     | DT_POSIX_MINIMAL         | defined on macOS,| only the POSIX calls macOS has: no barriers,     |
     |                          | else undefined   | spin locks, timers, sem_timedwait or clock_      |
     |                          |                  | nanosleep (dtrain/core/base.h); every build keeps|
     |                          |                  | to that today, so it changes no code yet         |
     | DT_NO_SIMD               | undefined        | no AVX2, AVX-512, NEON or vector-extension       |
     |                          |                  | kernels: the portable ones as plain loops        |
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
   DTRAIN_IMPLEMENTATION_LINKED (undefined by default): the implementation is in another object of the
   program (e.g. a file holding only the #define and the include, compiled once), so a #define
   DTRAIN_IMPLEMENTATION in this file is ignored; a one-file program can so be linked with that object too (the
   Makefile builds the examples that way).
   The environment variable DT_COMM_TIMEOUT (seconds) sets the default communicator timeout (300 s);
   DT_FAULT (a test aid, "rank=R,coll=N,kind=fail|return|stall:S|hang|nan") injects a fault (dt_comm_desc);
   DT_NODE_SIZE (ranks per node) groups the ranks into nodes for DT_ALGO_HIER and the link model;
   DT_CPU (avx512, avx2, neon, portable) the CPU kernels' tier (default: the fastest this CPU runs; dtrain/cpu/cpu.h).
   DT_CPU_ADAPT=0 keeps every OpenMP thread on a busy machine (by default, on Linux, a team whose threads wait
   for a CPU gets fewer of them for a while: dt_cpu_adapt_count in dtrain/cpu/cpu.h).
   dtrain_cuda.h's DTRAIN_CUDA_IMPLEMENTATION, DT_CUDA_EMULATE and DT_CUDA_DEVICE are in its own manual.

   OPTIONAL FEATURES AND POSIX
     Without DT_USE_ZLIB and DT_USE_STB_IMAGE the header needs nothing but the C library; a .gz file or an
     image folder then fails with DT_ERR_UNSUPPORTED naming the macro to build with. DT_USE_ZLIB includes
     <zlib.h>. DT_USE_STB_IMAGE includes <stb/stb_image.h> and <stb/stb_image_resize.h> but not their
     implementations (Debian's -lstb holds them; with your own copies, in a folder stb/ on the include path,
     compile them once with STB_IMAGE_IMPLEMENTATION and STB_IMAGE_RESIZE_IMPLEMENTATION, as the project's
     Makefile does with make STB_DIR=DIR), and lists directories with POSIX
     opendir/readdir/stat from <dirent.h> and <sys/stat.h>. Those headers declare these functions without a
     feature-test macro (glibc, musl, macOS, the BSDs), so dtrain.h defines none and does not depend on what
     the including file defined or included first; where a system wants one, pass -D_POSIX_C_SOURCE=200809L.
     Windows: MinGW-w64's GCC (its POSIX-threads variant) builds the library; MSVC, which has no POSIX
     threads, does not. There the implementation includes <windows.h> (WIN32_LEAN_AND_MEAN, NOMINMAX), and
     dtrain.h, included before the C library's headers, asks for MinGW's C99 printf (__USE_MINGW_ANSI_STDIO).

   MEMORY OWNERSHIP
     Whoever creates, destroys: dt_model_create / dt_model_destroy. A model owns three flat allocations
     (parameters, gradients, non-trainable buffers) planned once by dt_model_finalize, and an activation
     arena sized for the largest batch seen (grown outside the steady state, never inside it). Pointers
     returned by dt_model_params() and friends stay valid until dt_model_destroy. Nothing is freed by a
     function that did not allocate it. The same holds for every object: dt_X_create allocates and
     dt_X_destroy frees (optim, loader, comm, ddp, dpsgd, localsgd, fed; destroy accepts NULL); dataset
     loaders fill a dt_dataset that dt_dataset_free empties, dt_partition_create a dt_partition for
     dt_partition_free, dt_topology_create a dt_topology for dt_topology_free (dt_topology_one_peer_exp a
     dt_topology_schedule for dt_topology_schedule_free). Pointers in a *_desc are
     borrowed (they must outlive the object) or copied at create, as each field's comment says. In a *_desc
     zero means the default, except in the few fields where 0 is a valid request (a learning rate, Krum's
     f, the noise attack's noise_std): there 0 means 0 and DT_DEFAULT asks for the default.

   ERRORS
     Fallible functions return dt_result (DT_OK == 0). dt_result_str(r) names the code; dt_last_error()
     returns a message for the last failure on the calling thread, naming the cause and, when known, the
     fix. The library never calls exit() and never aborts on bad user input. Builder calls (dt_conv2d, ...)
     return a node id, or -1 after an error; the error is also kept in the model and returned by
     dt_model_finalize, so a chain of builder calls needs one check at the end (dt_model_set_node_name too).
     The trainers' entry points (dt_ddp_create, dt_dpsgd_create, dt_localsgd_create, dt_fed_create,
     dt_hogwild_run) check their arguments alike: a NULL out, communicator or model is DT_ERR_INVALID_ARG, a
     model not finalized DT_ERR_STATE; a NULL desc is read as a zeroed one (the defaults), so it is refused
     only where a zeroed desc is (dt_fed_create's data and part have no default); *out is NULL on failure.

   THREADS AND RANKS
     There is no global mutable state except the logger and the CPU tier (dt_cpu_set_tier), which are
     configuration set once before threads start. Each thread (each local rank) owns its models; a model
     must not be used by two threads at once. The last-error message is per thread. Kernels use OpenMP
     inside one call.
     A loader with prefetch = 1 owns one background thread (POSIX threads: compile with -pthread) that
     converts the next batch while the caller trains on the current one; it only reads the dataset, which
     must not change while the loader lives, and it converts on one OpenMP thread. The batches are the same
     with prefetch = 0, which converts on the calling thread and is what a build without threads uses
     (define DT_NO_THREADS; then prefetch = 1 fails with DT_ERR_UNSUPPORTED).

     Ranks: dt_launch runs a rank function on N ranks. Local ranks are threads (with a stack of at least 8 MiB,
     Linux's default, also on macOS and musl, whose threads get less by default); each owns its models,
     optimizers and data and shares nothing with the others but its communicator (dt_comm), which must be
     used by its own thread only. Each local rank gets cores / ranks OpenMP threads (--threads-per-rank).
     Waiting ranks sleep rather than spin when there are more ranks than cores. Every wait ends by the
     communicator's timeout: a rank that fails, returns or stops calling makes the others fail with
     DT_ERR_PEER or DT_ERR_TIMEOUT naming the operation, its sequence number and the missing ranks, and
     ranks that call different collectives get DT_ERR_MISMATCH. A communicator that failed stays failed.
     A failed run ends in bounded time, its cause logged once and naming the rank: a rank that has not
     ended the timeout and a second after the failure is reported as stalled (left running on local
     ranks, so the program must exit; under MPI the job ends with MPI_Abort).
     Logging: rank 0's lines are the log; other ranks' warnings and errors are shown prefixed "[rank r]"
     (all their lines with --log-all-ranks). Timeline: with --trace PATH (dt_launch_desc.trace_path) every
     rank records spans of its compute and communication, written to PATH as a Chrome trace (JSON) for
     https://ui.perfetto.dev when the ranks finish; dt_trace_begin/dt_trace_end add the program's own.

   BACKENDS
     Layers call a table of backend operations (dt_ops) and never loop over elements themselves. The CPU
     table, dt_cpu_ops(), is dtrain/cpu/cpu.h's; another backend supplies another table in dt_model_desc: the GPU's
     is dt_cuda_ops() (dtrain_cuda.h: CUDA kernels and cuBLAS), the default in builds with DT_USE_CUDA (this
     file registers it, dt_cuda_backend(), below; the modules name no backend). Communication has its own
     table (dt_comm_backend): self (one rank), local (threads; dtrain/comm/local.h) and mpi (dtrain_mpi.h),
     each written against the backend interface of dtrain/comm/backend.h. The collective algorithms (naive,
     ring, tree, hier: hierarchical over nodes of ranks,
     dt_comm_desc.node_size / $DT_NODE_SIZE / --node-size) are written once over its point-to-point calls,
     so they behave and round the same on every backend; NATIVE uses the backend's own (all-reduce,
     broadcast, all-to-all).

   VERSION
     DT_VERSION_MAJOR, DT_VERSION_MINOR, DT_VERSION_PATCH (integers) and DT_VERSION_STRING ("0.1.0") are
     this release's version (defined in dtrain/core/base.h), which the top comment of every header repeats:
     take dtrain.h, its modules, dtrain_mpi.h and dtrain_cuda.h from the same release. The library is compiled into the program, so
     the version matters at compile time only: #if DT_VERSION_MAJOR > 0 || DT_VERSION_MINOR >= 2 keeps
     code that needs release 0.2 from older ones. Versioning is semantic: a patch release changes no
     declaration; a minor release adds functions, constants and *_desc fields (zero keeps the old
     behaviour) and changes or removes nothing; a major release may change or remove declarations. While
     MAJOR is 0 (now), a minor release may change declarations too. Files have versions of their own: a
     checkpoint records its format version, and one of another format version is refused, naming both
     (DT_ERR_FORMAT).

   MODULES (dtrain/, in the order included: each uses only modules above it; each one's top comment says
   what it holds, what it uses and which functions to read first): the core, in dtrain/core/, with the CPU
   backend in dtrain/cpu/ (cpu_vec.h, cpu_x86.h, cpu_arm.h, cpu.h):
     base.h     results and errors, allocator hooks, logging, RNG, timers, progress, the timeline
                recorder, threads
     tensor.h   tensor views, the backend ops table (dt_ops), and the CPU ops in plain C: the reference
                twins of the fast kernels, the naive GEMM and convolution
     cpu_vec.h  the convolutions by shifted rows: their loops, and their tiles written once in GCC/Clang
                vector extensions for AVX2, SSE2 and NEON (optional to read)
     cpu_x86.h  the AVX2 and AVX-512 kernels (the library's only x86 intrinsics; optional to read)
     cpu_arm.h  the NEON kernels of ARM64 (the library's only ARM intrinsics; optional to read)
     cpu.h      the CPU backend: the blocked GEMM, the kernels' tiers and their choice, the convolutions
                of small images by taps, dt_cpu_ops()
     nn.h       the model graph on flat buffers: the builder, the layers, finalize, the model's API
     pass.h     the forward and backward passes layer by layer, the plan of a pass, batch norm alone and
                synchronised, the losses
     zoo.h      the model zoo: MLP, SimpleCNN, LeNet-5, the FedAvg paper's CNN and 2NN, VGG-11, ResNet-20
     optim.h    SGD, Adam, AdamW over the flat buffers; gradient clipping; learning-rate schedules
     partition.h  partitioners (IID, shards, Dirichlet, ...) and the distributed sampler
     data.h     datasets in memory, transforms, the loader
     data_files.h  datasets from IDX (MNIST, Fashion-MNIST) and CIFAR-10 files
     image_folder.h  datasets from image folders (stb_image)
   communication, in dtrain/comm/:
     topology.h gossip topologies: mixing matrices, spectral gaps, time-varying schedules
     comm.h     the communicator's API: element types, options, point-to-point, collectives, counters
     backend.h  the backend-author interface (dt_comm_backend, dt_message) and the generic layer behind
                it: the communicator's state, signatures, point-to-point through a backend, creation
     algos.h    the algorithms (naive, ring, tree, hier, all-to-all) and the calls of comm.h that run
                them, with their checks and the injected faults
     local.h    the self and local backends (ranks as threads, the link model)
     launch.h   the launcher (dt_launch, its flags) and the timeline file
   and the trainers, a file each, in dtrain/train/:
     eval.h     evaluation: loss and accuracy of a classifier over a data set
     checkpoint.h  checkpoints of every rank in one file (atomic, checked), and the checks every trainer
                shares
     localsgd.h local SGD (periodic averaging) and Hogwild (lock-free threads on one buffer)
     compress.h DDP's gradients sent as bf16, fp16, top-k pairs or PowerSGD factors with error feedback
     ddp.h      DDP: gradient averaging by five methods, buckets overlapped with backward, accumulation,
                uneven data
     dpsgd.h    D-PSGD (gossip through a mixing matrix)
     aggregate.h  FedAvg's robust aggregators (pure functions over the clients' updates)
     fedavg.h   FedAvg (server and clients, dropouts, attacks)
   Between them, the internal headers (no API): dtrain/core/internal.h, the library-internal calls one module
   offers the later ones (with two views of private state: the model, which pass.h shares with nn.h, and the
   communicator, which dtrain/comm/ shares), and dtrain/cpu/kernel.h,
   the CPU kernel seam (the kernel table and what the CPU backend's files share with tensor.h's plain ops)
   (docs/design.md, "The lines between modules"; tools/check_modules.py checks that modules use nothing else).
   Beside this file: dtrain_mpi.h (the MPI backend of comm/backend.h) and dtrain_cuda.h (the GPU's ops table).
*/
#ifndef DTRAIN_H
#define DTRAIN_H
#endif /* DTRAIN_H */
/* Backends are registered here, the composition root, not named by the modules. Built with DT_USE_MPI,
   dt_launch (dtrain/comm/launch.h) runs a program started by mpiexec through dtrain_mpi.h's launcher
   (which dtrain_mpi.h registers the same way when it is included alone). */
#if defined(DT_USE_MPI) && !defined(DT__LAUNCH_PROCESSES)
#define DT__LAUNCH_PROCESSES dt_launch_mpi
#endif
/* With DT_USE_CUDA the GPU's, dt_cuda_backend() (declared by dtrain_cuda.h, included below, and defined by its
   implementation, dtrain_cuda.cu), is the default backend of models whose desc.ops is NULL (dtrain/core/nn.h
   calls the function this names). */
#if defined(DT_USE_CUDA) && !defined(DT__DEFAULT_BACKEND)
#define DT__DEFAULT_BACKEND dt_cuda_backend
#endif
/* The modules, in dependency order: each uses only the ones before it. Every module holds its declarations
   and, under DTRAIN_IMPLEMENTATION, its implementation, so this file may be included again after
   #define DTRAIN_IMPLEMENTATION. */
#ifdef DTRAIN_IMPLEMENTATION_LINKED   /* the implementation is another object's */
#undef DTRAIN_IMPLEMENTATION
#endif
#include "dtrain/core/base.h"
#include "dtrain/core/tensor.h"
#include "dtrain/cpu/cpu_vec.h"
#include "dtrain/cpu/cpu_x86.h"
#include "dtrain/cpu/cpu_arm.h"
#include "dtrain/cpu/cpu.h"
#include "dtrain/core/nn.h"
#include "dtrain/core/pass.h"
#include "dtrain/core/zoo.h"
#include "dtrain/core/optim.h"
#include "dtrain/core/partition.h"
#include "dtrain/core/data.h"
#include "dtrain/core/data_files.h"
#include "dtrain/core/image_folder.h"
#include "dtrain/comm/topology.h"
#include "dtrain/comm/comm.h"
#include "dtrain/comm/backend.h"
#include "dtrain/comm/algos.h"
#include "dtrain/comm/local.h"
#include "dtrain/comm/launch.h"
#include "dtrain/train/eval.h"
#include "dtrain/train/checkpoint.h"
#include "dtrain/train/localsgd.h"
#include "dtrain/train/compress.h"
#include "dtrain/train/ddp.h"
#include "dtrain/train/dpsgd.h"
#include "dtrain/train/aggregate.h"
#include "dtrain/train/fedavg.h"

/* The MPI backend, declarations and (with DTRAIN_IMPLEMENTATION) implementation, for builds with MPI. */
#ifdef DT_USE_MPI
#include "dtrain_mpi.h"
#endif
/* The GPU backend's declarations, for builds with CUDA (its implementation is dtrain_cuda.cu, compiled by
   nvcc). */
#ifdef DT_USE_CUDA
#include "dtrain_cuda.h"
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
