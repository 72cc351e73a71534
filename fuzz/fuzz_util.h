/* fuzz_util.h - what the fuzz targets share: a private temporary directory per process
   ($TMPDIR/dt_fuzz_<pid>, /tmp without TMPDIR), removed at exit, where each input is written as the files a loader reads, and a
   check of the invariants of a loaded dataset. Include it before anything else (it asks for POSIX). */
#ifndef DT_FUZZ_UTIL_H
#define DT_FUZZ_UTIL_H
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../dtrain.h"   /* the declarations; the target includes it again for the implementation */

static char fz_dir[200];

#include "../tests/dt_test_files.h"
static void fz_cleanup(void) { if (fz_dir[0]) dt_t_rm_rf(fz_dir); }

/* fz_dir/rel in one of a few rotating buffers; creates fz_dir on first use */
static const char *fz_path(const char *rel) {
    static char buf[4][320];
    static int next;
    char *p = buf[next++ & 3];
    if (!fz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fz_dir, sizeof fz_dir, "%s/dt_fuzz_%ld", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
        dt_t_rm_rf(fz_dir);
        if (mkdir(fz_dir, 0700) != 0) { perror(fz_dir); abort(); }
        atexit(fz_cleanup);
    }
    snprintf(p, 320, "%s/%s", fz_dir, rel);
    return p;
}
static inline void fz_mkdir(const char *rel) { mkdir(fz_path(rel), 0700); }
static void fz_write(const char *rel, const uint8_t *data, size_t n) {
    FILE *fp = fopen(fz_path(rel), "wb");
    if (!fp || (n && fwrite(data, 1, n, fp) != n)) { perror(fz_path(rel)); abort(); }
    fclose(fp);
}

/* A successful load must give a consistent dataset; reading every byte lets ASan check the sizes. A failed
   one must leave *ds zeroed. */
static void fz_check(dt_result r, const dt_dataset *ds) {
    int64_t i, n;
    unsigned sum = 0;
    if (r != DT_OK) {
        dt_dataset z;
        memset(&z, 0, sizeof z);
        if (memcmp(&z, ds, sizeof z) != 0 || dt_last_error()[0] == '\0') abort();
        return;
    }
    if (ds->count <= 0 || ds->c <= 0 || ds->h <= 0 || ds->w <= 0 || ds->num_classes <= 0 || !ds->pixels || !ds->labels)
        abort();
    n = ds->count * ds->c * ds->h * ds->w;
    for (i = 0; i < n; i++) sum += ds->pixels[i];
    for (i = 0; i < ds->count; i++)
        if (ds->labels[i] < 0 || ds->labels[i] >= ds->num_classes) abort();
    if (ds->class_names)
        for (i = 0; i < ds->num_classes; i++) sum += (unsigned)strlen(ds->class_names[i]);
    if (sum == 0xffffffffu) fputc(' ', stderr);   /* keep the reads */
}
#endif
