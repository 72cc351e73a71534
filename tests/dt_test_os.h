/* dt_test_os.h - the few calls of the tests that the C library lacks, on POSIX and on Windows (MinGW-w64):
   environment variables, a temporary directory, directories, FIFOs and a watchdog. POSIX: the includer defines
   _POSIX_C_SOURCE before any header. */
#ifndef DT_TEST_OS_H
#define DT_TEST_OS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(_WIN32)
#include <direct.h>
#include <process.h>
#define DT_T_HAVE_FIFO 0   /* Windows has no FIFOs in its file system */
#else
#include <sys/stat.h>
#include <unistd.h>
#define DT_T_HAVE_FIFO 1
#endif

#if defined(__GNUC__)
#define DT_T_OS_UNUSED __attribute__((unused))
#else
#define DT_T_OS_UNUSED
#endif

/* setenv(name, value, 1) and unsetenv(name); 0 on success */
static DT_T_OS_UNUSED int dt_t_setenv(const char *name, const char *value) {
#if defined(_WIN32)
    char kv[512];
    if (snprintf(kv, sizeof kv, "%s=%s", name, value) >= (int)sizeof kv) return -1;
    return _putenv(kv);   /* copies kv */
#else
    return setenv(name, value, 1);
#endif
}
static DT_T_OS_UNUSED int dt_t_unsetenv(const char *name) {
#if defined(_WIN32)
    char kv[256];
    if (snprintf(kv, sizeof kv, "%s=", name) >= (int)sizeof kv) return -1;
    return _putenv(kv);   /* "NAME=" removes it */
#else
    return unsetenv(name);
#endif
}

static DT_T_OS_UNUSED int dt_t_mkdir(const char *path) {
#if defined(_WIN32)
    return _mkdir(path);
#else
    return mkdir(path, 0700);
#endif
}
static DT_T_OS_UNUSED int dt_t_rmdir(const char *path) {
#if defined(_WIN32)
    return _rmdir(path);
#else
    return rmdir(path);
#endif
}

/* A new directory of this process: /tmp/NAME_XXXXXX (mkdtemp), or on Windows %TEMP%\NAME_PID_K. Its path in
   dir[n]; 0, or -1 when none could be created. */
static DT_T_OS_UNUSED int dt_t_mkdtemp(char *dir, size_t n, const char *name) {
#if defined(_WIN32)
    const char *tmp = getenv("TEMP");
    int k;
    if (!tmp || !*tmp) tmp = getenv("TMP");
    if (!tmp || !*tmp) tmp = ".";
    for (k = 0; k < 1000; k++) {
        if (snprintf(dir, n, "%s\\%s_%d_%d", tmp, name, (int)_getpid(), k) >= (int)n) return -1;
        if (_mkdir(dir) == 0) return 0;
    }
    return -1;
#else
    if (snprintf(dir, n, "/tmp/%s_XXXXXX", name) >= (int)n) return -1;
    return mkdtemp(dir) ? 0 : -1;
#endif
}

/* a FIFO at path (DT_T_HAVE_FIFO 0: none can be made, -1) */
static DT_T_OS_UNUSED int dt_t_mkfifo(const char *path) {
#if DT_T_HAVE_FIFO
    return mkfifo(path, 0600);
#else
    (void)path;
    return -1;
#endif
}

/* SIGALRM after s seconds (0: cancels it), so a check that would block forever ends the test; none on Windows */
static DT_T_OS_UNUSED void dt_t_alarm(unsigned s) {
#if defined(_WIN32)
    (void)s;
#else
    alarm(s);
#endif
}
#endif
