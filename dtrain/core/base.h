/* dtrain/core/base.h - what every other module stands on.   Part of dtrain v0.1.0, MIT license (see the end of
   dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     Results and errors (dt_result, dt_set_error, dt_last_error), the allocator hooks (DT_MALLOC, DT_FREE),
     logging, random numbers (PCG32 streams), timers, the progress bar, the version macros; and for the
     modules after it: the timeline recorder behind dt_trace_begin (one event lane per thread, written out
     by dtrain/comm/launch.h's launcher), the thread, mutex and condition helpers over POSIX threads, OpenMP's
     pragma macro, the byte order of files (dt__le32: little-endian on every host), and the loop bodies shared
     with the GPU backend (the dropout hash).
   USES
     The C library; POSIX threads unless DT_NO_THREADS; OpenMP when compiled with it.
   READ FIRST
     dt_set_error (every failure in the library ends there, with its message), dt_rng_init and
     dt_rng_u32 (why every rank draws from its own stream of one seed), dt__trace_add (what a span costs
     when tracing is on: one store in a per-thread array; off: one branch).
*/
#ifndef DTRAIN_BASE_H
#define DTRAIN_BASE_H
/* MinGW-w64: C99's printf (%zu, %lld) from MinGW's stdio rather than msvcrt's, which lacks them; it takes effect
   where dtrain.h comes before the C library's headers (or with -D__USE_MINGW_ANSI_STDIO=1 on the command line) */
#if defined(__MINGW32__) && !defined(__USE_MINGW_ANSI_STDIO)
#define __USE_MINGW_ANSI_STDIO 1
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the printf format check of the calls below. On MinGW-w64 GCC's plain "printf" means msvcrt's (no %zu): the
   library formats with MinGW's C99 stdio (or the UCRT's), so it checks gnu_printf */
#if defined(__MINGW32__) && !defined(__clang__) && (defined(_UCRT) || __USE_MINGW_ANSI_STDIO)
#define DT__PRINTF(f, a) __attribute__((format(gnu_printf, f, a)))
#elif defined(__MINGW32__) && !defined(__clang__)
#define DT__PRINTF(f, a) __attribute__((format(ms_printf, f, a)))
#elif defined(__GNUC__)
#define DT__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define DT__PRINTF(f, a)
#endif

#define DT_VERSION_MAJOR 0
#define DT_VERSION_MINOR 1
#define DT_VERSION_PATCH 0
#define DT_VERSION_STRING "0.1.0"

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

/* In a *_desc, zero means the default. Where 0 is itself a valid request (dt_optim_desc.lr, Krum's f, the
   noise attack's noise_std), the field takes 0 as 0 and DT_DEFAULT asks for its default; the field's
   comment says so. */
#define DT_DEFAULT (-1)

/* Name of a result code, e.g. "DT_ERR_SHAPE". Never NULL. */
const char *dt_result_str(dt_result r);
/* Message of the last failure on the calling thread ("" if none). Valid until the next failure. */
const char *dt_last_error(void);
/* Records a failure message for the calling thread and returns r; for backends and extensions. */
dt_result dt_set_error(dt_result r, const char *fmt, ...)
    DT__PRINTF(2, 3);

/* Logging. Levels: DT_LOG_ERROR < DT_LOG_WARN < DT_LOG_INFO < DT_LOG_DEBUG. */
enum { DT_LOG_ERROR = 0, DT_LOG_WARN = 1, DT_LOG_INFO = 2, DT_LOG_DEBUG = 3 };
typedef void (*dt_log_fn)(void *user, int level, const char *msg);
/* Sets the log sink and the most verbose level shown. fn NULL restores the default (stderr).
   Process-wide configuration: call before starting threads. */
void dt_log_configure(dt_log_fn fn, void *user, int max_level);
/* Logs one line (printf format) at the given level. */
void dt_log(int level, const char *fmt, ...)
    DT__PRINTF(2, 3);

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
/* Sleeps the calling thread for about `seconds` without spinning (with DT_NO_THREADS: polls the clock). */
void   dt_sleep(double seconds);

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
    DT__PRINTF(3, 4);
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

/* Byte order of files (internal: for the library's readers and writers and the tests' fixtures). Every number
   dtrain writes to a file or reads from one of its own (checkpoints; the tests' fixtures) is little-endian: the
   order x86-64 and aarch64 keep in memory, where these calls compile to nothing and a file is the memory's bytes.
   A big-endian host (s390x) swaps each word once, in place, between the file's order and its own. Formats of
   others are read byte by byte in theirs (IDX's big-endian header: dt__get_be32). */
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define DT__BIG_ENDIAN 1
#else
#define DT__BIG_ENDIAN 0   /* little-endian; a compiler that does not say (MSVC) targets little-endian hosts only */
#endif
/* n 32-bit words (float, int32, uint32) at p, in place: from little-endian to the host's order, or back (the same
   swap); nothing on a little-endian host */
static inline void dt__le32(void *p, size_t n) {
#if DT__BIG_ENDIAN
    unsigned char *b = (unsigned char *)p, t;
    for (; n > 0; n--, b += 4) { t = b[0]; b[0] = b[3]; b[3] = t; t = b[1]; b[1] = b[2]; b[2] = t; }
#else
    (void)p; (void)n;
#endif
}
/* n 64-bit words (double, int64, uint64) at p, in place, the same way */
static inline void dt__le64(void *p, size_t n) {
#if DT__BIG_ENDIAN
    unsigned char *b = (unsigned char *)p, t;
    int i;
    for (; n > 0; n--, b += 8)
        for (i = 0; i < 4; i++) { t = b[i]; b[i] = b[7 - i]; b[7 - i] = t; }
#else
    (void)p; (void)n;
#endif
}
/* One word at p, any alignment, in a file's order, from or to a host value (one load or store where the order
   is the host's) */
static inline void dt__put_le64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint64_t dt__get_le64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint32_t dt__get_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
/* 1 when the host is big-endian, asked at run time: what DT__BIG_ENDIAN must say (dt_checkpoint_save checks it) */
static inline int dt__host_big_endian(void) {
    const uint32_t one = 1;
    return *(const unsigned char *)&one == 0;
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_BASE_H */

/* Shared with the GPU backend: dtrain_cuda.cu (compiled by nvcc, where DT__HD makes these device
   functions too) computes the same numbers from the same definitions. Part of either implementation, never of
   the declarations. */
#if (defined(DTRAIN_IMPLEMENTATION) || defined(DTRAIN_CUDA_IMPLEMENTATION)) && !defined(DTRAIN_BASE_SHARED_DONE)
#define DTRAIN_BASE_SHARED_DONE
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
static inline DT__HD float dt_body_hash_uniform(uint64_t key, uint64_t counter) {
    uint64_t z = dt__mix64(key + 0x9e3779b97f4a7c15ULL * (counter + 1));
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}
#endif /* shared with the GPU backend */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_BASE_IMPLEMENTATION_DONE)
#define DTRAIN_BASE_IMPLEMENTATION_DONE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <float.h>
#include <errno.h>
/* The platform: POSIX (Linux, macOS, the BSDs) or Windows (MinGW-w64, with its POSIX threads: winpthreads). What
   differs is behind the small calls of this file (clocks, the CPU count, memory, files: dt__open_read,
   dt__file_sync, dt__dir_sync, dt__file_replace), never under #ifdef in the modules. */
#if defined(__unix__) || defined(__APPLE__)
/* Strict C11 (-std=c11) hides POSIX's fileno from <stdio.h> in glibc and musl, and fsync from glibc's <unistd.h>
   (behind feature-test macros, which dtrain.h does not define): declared here again, which is harmless where the
   headers declare them too; the parentheses keep a fileno that is also a macro (macOS, the BSDs) unexpanded. */
#if !defined(__cplusplus)
extern int (fileno)(FILE *stream);
extern int (fsync)(int fd);
#endif
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>
#if defined(__linux__) && !defined(DT_POSIX_MINIMAL)
#include <sys/mman.h>
#if !defined(__cplusplus)
extern int madvise(void *addr, size_t len, int advice);   /* hidden by strict C11 too (dt__advise_huge) */
#endif
#endif
#elif defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN   /* windows.h without winsock, RPC (its `small` macro), OLE and the rest */
#endif
#ifndef NOMINMAX
#define NOMINMAX              /* nor its min and max macros */
#endif
#include <windows.h>
#include <sys/stat.h>
#include <io.h>
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

#ifdef __cplusplus
#define DT__THREAD_LOCAL thread_local
#define DT__RESTRICT __restrict
#else
#define DT__THREAD_LOCAL _Thread_local
#define DT__RESTRICT restrict
#endif
/* OpenMP only pays off above a few thousand elements; below, one thread is faster. */
#define DT__PAR_MIN 16384
#if defined(__GNUC__)
#define DT__MAYBE_UNUSED __attribute__((unused))
#else
#define DT__MAYBE_UNUSED
#endif
/* acquire loads and release stores of a word other threads read (GCC and Clang builtins, in C and C++) */
#define DT__ATOMIC_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define DT__ATOMIC_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"

#define DT__ERROR_CAP 512
static DT__THREAD_LOCAL char dt__errmsg[DT__ERROR_CAP];
/* Sets the last error's text verbatim (a message formatted and kept earlier): the call other modules use,
   with DT__ERROR_CAP for the size of a copy, never dt__errmsg itself. */
static inline void dt__error_restore(const char *msg) { snprintf(dt__errmsg, sizeof dt__errmsg, "%s", msg); }

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

/* Formats into a buffer of its own first: a caller may pass dt_last_error() as an argument, to wrap the
   cause in its own context, and writing straight into dt__errmsg would overwrite the cause while reading it. */
dt_result dt_set_error(dt_result r, const char *fmt, ...) {
    char msg[sizeof dt__errmsg];
    int n = snprintf(msg, sizeof msg, "%s: ", dt_result_str(r));
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof msg) vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    memcpy(dt__errmsg, msg, sizeof msg);
    return r;
}

/* the name of enum value k in names[0..n) ("unknown" outside), and the value of name s, refused naming the choices:
   every *_name and *_parse of the library */
static inline const char *dt__enum_name(const char *const *names, int n, int k) { return k >= 0 && k < n ? names[k] : "unknown"; }
static inline dt_result dt__enum_parse(const char *const *names, int n, const char *s, int *out, const char *what) {
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

/* Opens a file the library reads (a data set, a checkpoint): fopen(path, "rb"), after refusing what is not a
   regular file, since opening a FIFO blocks until a writer comes and a device may never end. NULL on failure,
   with *why saying why (strerror's text, or what the path is) for the caller's message. */
static inline FILE *dt__open_read(const char *path, const char **why) {
    FILE *fp;
#if defined(__unix__) || defined(__APPLE__) || defined(_WIN32)
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        *why = S_ISDIR(st.st_mode) ? "it is a directory, not a file"
                                   : "it is not a regular file (a FIFO, socket or device, which would block or never end)";
        return NULL;
    }
#endif
    if (!(fp = fopen(path, "rb"))) *why = strerror(errno);
    return fp;
}

/* The machine's physical memory in bytes, 0 where it cannot be told: what memory planned in one piece must fit
   in. malloc may grant more than there is (overcommit), and the kernel then kills the process, saying nothing,
   when the memory is first written; asking first turns that into DT_ERR_OUT_OF_MEMORY with a message. */
static inline double dt__phys_bytes(void) {
#if (defined(__unix__) || defined(__APPLE__)) && defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && size > 0) return (double)pages * (double)size;
#elif defined(_WIN32)
    MEMORYSTATUSEX ms;
    ms.dwLength = sizeof ms;
    if (GlobalMemoryStatusEx(&ms)) return (double)ms.ullTotalPhys;
#endif
    return 0.0;
}

/* Asks Linux to back a large buffer (a model's activation arena and flat buffers) with transparent huge pages:
   2 MiB pages where there would be 4 KiB ones, so the first pass over fresh memory takes 512 times fewer page
   faults (in a virtual machine each costs microseconds: a short run spent as long in them as in training). Linux
   leaves that to the program by default (/sys/kernel/mm/transparent_hugepage/enabled: madvise); the advice
   covers the 2 MiB-aligned part of a buffer of 8 MiB or more and changes no value. Where the kernel declines,
   and on other systems, nothing happens. */
static inline void dt__advise_huge(void *p, size_t bytes) {
#if defined(__linux__) && !defined(DT_POSIX_MINIMAL) && (defined(MADV_HUGEPAGE) || defined(__x86_64__) || \
    defined(__aarch64__) || defined(__s390x__) || defined(__powerpc64__) || defined(__riscv))
#ifdef MADV_HUGEPAGE
    const int advice = MADV_HUGEPAGE;
#else
    const int advice = 14;    /* Linux's MADV_HUGEPAGE on these machines, which strict C11 hides */
#endif
    const uintptr_t huge = (uintptr_t)1 << 21;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), b = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (p && bytes >= 4 * huge && b > a) (void)madvise((void *)a, (size_t)(b - a), advice);
#else
    (void)p; (void)bytes;
#endif
}

/* The CPUs this process may run on (OpenMP's count where it is there), 0 where it cannot be told. */
static inline int dt__cpu_count(void) {
#if DT__HAVE_OMP
    return omp_get_num_procs();
#elif (defined(__unix__) || defined(__APPLE__)) && defined(_SC_NPROCESSORS_ONLN)
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 0;
#elif defined(_WIN32)
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return (int)si.dwNumberOfProcessors;
#else
    return 0;
#endif
}

/* Atomic saves (checkpoints, the trace): write "PATH.tmp", dt__file_sync it, close it, dt__file_replace it over
   PATH, dt__dir_sync PATH's directory; a reader sees the old file or the new one, never half of one.
   dt__file_sync: flushes f's data to the disk (POSIX fsync, macOS F_FULLFSYNC, Windows _commit); 0 or -1. */
static inline int dt__file_sync(FILE *f) {
#if defined(__unix__) || defined(__APPLE__)
    if (fflush(f) != 0) return -1;
#if defined(F_FULLFSYNC)   /* macOS: fsync leaves the data in the drive's cache, F_FULLFSYNC flushes that too */
    if (fcntl(fileno(f), F_FULLFSYNC) == 0) return 0;   /* refused (a file system without it): fsync */
#endif
    return fsync(fileno(f)) == 0 ? 0 : -1;
#elif defined(_WIN32)
    return fflush(f) == 0 && _commit(_fileno(f)) == 0 ? 0 : -1;
#else
    return fflush(f) == 0 ? 0 : -1;
#endif
}
/* Makes a rename in path's directory durable (POSIX: fsync of the directory; a directory that cannot be synced,
   as some file systems refuse, is no error: the rename itself is). Windows: MoveFileEx's write-through did it. */
static inline void dt__dir_sync(const char *path) {
#if defined(__unix__) || defined(__APPLE__)
    char dir[1024];
    const char *slash = strrchr(path, '/');
    int fd;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if ((fd = open(dir, O_RDONLY)) < 0) return;
    (void)fsync(fd);
    close(fd);
#else
    (void)path;
#endif
}
/* Renames from over to, replacing a file there: POSIX rename does; Windows' rename refuses an existing file, so
   MoveFileEx replaces it (and writes through before it returns). 0, or an errno value. */
static inline int dt__file_replace(const char *from, const char *to) {
#if defined(_WIN32)
    if (MoveFileExA(from, to, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) return 0;
    switch (GetLastError()) {
    case ERROR_FILE_NOT_FOUND: case ERROR_PATH_NOT_FOUND: return ENOENT;
    case ERROR_ACCESS_DENIED: case ERROR_SHARING_VIOLATION: case ERROR_LOCK_VIOLATION: return EACCES;
    case ERROR_NOT_SAME_DEVICE: return EXDEV;
    case ERROR_DISK_FULL: case ERROR_HANDLE_DISK_FULL: return ENOSPC;
    default: return EIO;
    }
#else
    return rename(from, to) == 0 ? 0 : (errno ? errno : EIO);
#endif
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

float dt_hash_uniform(uint64_t key, uint64_t counter) { return dt_body_hash_uniform(key, counter); }

double dt_time_now(void) {
#if defined(_WIN32)
    LARGE_INTEGER n, f;   /* the performance counter, and its counts per second (fixed at boot, cheap to ask) */
    QueryPerformanceCounter(&n);
    QueryPerformanceFrequency(&f);
    return (double)n.QuadPart / (double)f.QuadPart;
#else
    struct timespec ts;
#if defined(CLOCK_MONOTONIC)
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    timespec_get(&ts, TIME_UTC);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
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
static inline void dt__trace_arg(const char *key, const char *s, int64_t v) {
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
static inline dt__trace_lane *dt__trace_lane_of(int lane) {
    dt__trace_lane *L = dt__tls_trace;
    return L && lane < DT__TRACE_LANES ? L - L->lane + lane : NULL;
}
/* For a function whose span is opened deeper down (a collective's, by dt__coll_start): the depth before
   the call, and closing every span opened since, which passes the call's result through. */
static inline int dt__trace_mark(void) { return dt__tls_trace ? dt__tls_trace->depth : 0; }
static inline dt_result dt__trace_close(int mark, dt_result r) {
    while (dt__tls_trace && dt__tls_trace->depth > mark) dt_trace_end();
    return r;
}

/* (partitioners and loader: implementation) */
/* ---- threads --------------------------------------------------------------------------------- */
/* A minimal internal wrapper over POSIX threads (the loader's prefetch thread; later the local backend's
   ranks). POSIX threads rather than C11 <threads.h>: they exist on Linux, macOS (which has no
   <threads.h>), the BSDs and MinGW, and the same calls compile as C and as C++. With DT_NO_THREADS the
   mutex and condition calls do nothing and starting a thread fails, so callers check DT__HAVE_THREADS
   and report DT_ERR_UNSUPPORTED first. Each function returns 0 on success or an error number.
   DT_POSIX_MINIMAL (defined by itself on macOS) says the library uses only the POSIX calls macOS has: threads
   (create, join, exit, cleanup handlers, the stack size of their attributes), mutexes, condition variables with
   pthread_cond_timedwait on the realtime clock (macOS has no pthread_condattr_setclock), sched_yield and sysconf;
   no barriers (pthread_barrier_t), spin locks (pthread_spin_*), timers (timer_create), timed semaphores
   (sem_timedwait) or clock_nanosleep. What those would give is built from the calls here: a wait with a deadline
   is dt__cond_wait_for, a sleep dt_sleep, a barrier a count and a generation under a dt__mutex waited on with
   dt__cond_wait_for (dtrain/comm/local.h's, which also ends by the communicator's timeout), a spin wait a loop
   over DT__ATOMIC_LOAD that yields with sched_yield. Every build keeps to that subset today (strict C11 hides the
   others in glibc's headers anyway), so the switch changes no code: a module that wants more must keep a fallback
   for it under DT_POSIX_MINIMAL, here. tests/run.sh's section 2g builds with it and tests/posix_minimal.h, which
   poisons the names macOS lacks. */
#if defined(__APPLE__) && !defined(DT_POSIX_MINIMAL)
#define DT_POSIX_MINIMAL 1
#endif
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
static inline void *dt__thread_main(void *t) {
    ((dt__thread *)t)->fn(((dt__thread *)t)->arg);
    return NULL;
}
/* The least stack a thread started here gets: Linux's default (glibc takes the stack limit, 8 MiB), which the
   main thread has everywhere; macOS gives a new thread 512 KiB and musl 128 KiB, where a rank function with a
   large local array would overflow on a rank's thread what runs on the main thread. */
#define DT__THREAD_STACK ((size_t)8 << 20)
/* Runs fn(arg) on a new thread, of a stack of at least DT__THREAD_STACK; *t must stay where it is until
   dt__thread_join. */
static inline int dt__thread_start(dt__thread *t, void (*fn)(void *), void *arg) {
    pthread_attr_t attr;
    size_t stack = 0;
    int err;
    t->fn = fn;
    t->arg = arg;
    if ((err = pthread_attr_init(&attr)) != 0) return err;
    if (pthread_attr_getstacksize(&attr, &stack) != 0 || stack < DT__THREAD_STACK)
        (void)pthread_attr_setstacksize(&attr, DT__THREAD_STACK);   /* refused: the default stack, as before */
    err = pthread_create(&t->id, &attr, dt__thread_main, t);
    pthread_attr_destroy(&attr);
    return err;
}
static inline void dt__thread_join(dt__thread *t) { pthread_join(t->id, NULL); }
static inline int  dt__mutex_init(dt__mutex *m) { return pthread_mutex_init(&m->m, NULL); }
static inline void dt__mutex_destroy(dt__mutex *m) { pthread_mutex_destroy(&m->m); }
static inline void dt__mutex_lock(dt__mutex *m) { pthread_mutex_lock(&m->m); }
static inline void dt__mutex_unlock(dt__mutex *m) { pthread_mutex_unlock(&m->m); }
static inline int  dt__cond_init(dt__cond *c) { return pthread_cond_init(&c->c, NULL); }
static inline void dt__cond_destroy(dt__cond *c) { pthread_cond_destroy(&c->c); }
static inline void dt__cond_wait(dt__cond *c, dt__mutex *m) { pthread_cond_wait(&c->c, &m->m); }   /* re-check the predicate */
static inline void dt__cond_signal(dt__cond *c) { pthread_cond_signal(&c->c); }
static inline void dt__cond_broadcast(dt__cond *c) { pthread_cond_broadcast(&c->c); }
/* dt__thread_guarded(g, body, gone, arg): runs body(arg); if the thread ends inside it (pthread_exit), gone(arg) runs
   on the thread's way out. *g must stay where it is until the thread has ended. POSIX runs cleanup handlers at
   pthread_exit; winpthreads runs only its keys' destructors there, so on Windows a key's destructor calls gone. */
typedef struct dt__thread_guard { void (*gone)(void *); void *arg; } dt__thread_guard;
#if defined(_WIN32)
static pthread_once_t dt__guard_once = PTHREAD_ONCE_INIT;
static pthread_key_t dt__guard_key;
static inline void dt__guard_fire(void *g) {   /* winpthreads calls it with NULL too, at every thread's end */
    if (g) ((dt__thread_guard *)g)->gone(((dt__thread_guard *)g)->arg);
}
static inline void dt__guard_init(void) { pthread_key_create(&dt__guard_key, dt__guard_fire); }
static inline void dt__thread_guarded(dt__thread_guard *g, void (*body)(void *), void (*gone)(void *), void *arg) {
    g->gone = gone;
    g->arg = arg;
    pthread_once(&dt__guard_once, dt__guard_init);
    pthread_setspecific(dt__guard_key, g);
    body(arg);
    pthread_setspecific(dt__guard_key, NULL);
}
#else
static inline void dt__thread_guarded(dt__thread_guard *g, void (*body)(void *), void (*gone)(void *), void *arg) {
    g->gone = gone;
    g->arg = arg;
    pthread_cleanup_push(gone, arg);
    body(arg);
    pthread_cleanup_pop(0);
}
#endif
#else
#define DT__HAVE_THREADS 0
static inline int sched_yield(void) { return 0; }
typedef struct dt__thread { void (*fn)(void *arg); void *arg; } dt__thread;
typedef struct dt__mutex { int unused; } dt__mutex;
typedef struct dt__cond { int unused; } dt__cond;
static inline int  dt__thread_start(dt__thread *t, void (*fn)(void *), void *arg) { t->fn = fn; t->arg = arg; return -1; }
static inline void dt__thread_join(dt__thread *t) { (void)t; }
static inline int  dt__mutex_init(dt__mutex *m) { (void)m; return 0; }
static inline void dt__mutex_destroy(dt__mutex *m) { (void)m; }
static inline void dt__mutex_lock(dt__mutex *m) { (void)m; }
static inline void dt__mutex_unlock(dt__mutex *m) { (void)m; }
static inline int  dt__cond_init(dt__cond *c) { (void)c; return 0; }
static inline void dt__cond_destroy(dt__cond *c) { (void)c; }
static inline void dt__cond_wait(dt__cond *c, dt__mutex *m) { (void)c; (void)m; }
static inline void dt__cond_signal(dt__cond *c) { (void)c; }
static inline void dt__cond_broadcast(dt__cond *c) { (void)c; }
typedef struct dt__thread_guard { int unused; } dt__thread_guard;
static inline void dt__thread_guarded(dt__thread_guard *g, void (*body)(void *), void (*gone)(void *), void *arg) {
    (void)g; (void)gone;
    body(arg);
}
#endif

/* Sleeps on rank me's condition variable for at most s seconds (its mutex held). */
static inline void dt__cond_wait_for(dt__cond *c, dt__mutex *m, double s) {
#if DT__HAVE_THREADS
    struct timespec ts;
    double frac;
#if defined(_WIN32)
    clock_gettime(CLOCK_REALTIME, &ts);   /* winpthreads' clock (msvcrt has no timespec_get) */
#else
    timespec_get(&ts, TIME_UTC);   /* the clock pthread_cond_timedwait's deadline is on */
#endif
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

/* A timed wait on a condition nobody signals: a sleep from the calls every platform here has (C11's
   thrd_sleep is missing on macOS, POSIX's nanosleep from strict C11). */
void dt_sleep(double seconds) {
    double end = dt_time_now() + seconds, now;
#if DT__HAVE_THREADS
    static dt__mutex mu = {PTHREAD_MUTEX_INITIALIZER};
    static dt__cond cv = {PTHREAD_COND_INITIALIZER};
    dt__mutex_lock(&mu);
    while ((now = dt_time_now()) < end) dt__cond_wait_for(&cv, &mu, end - now);
    dt__mutex_unlock(&mu);
#else
    while ((now = dt_time_now()) < end) {}
#endif
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
