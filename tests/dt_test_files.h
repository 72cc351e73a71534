/* dt_test_files.h - removing a temporary directory tree, for the tests and fuzz targets that write files.
   POSIX: the includer defines _POSIX_C_SOURCE before any header. */
#ifndef DT_TEST_FILES_H
#define DT_TEST_FILES_H
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* rm -rf path (without following symbolic links) */
static void dt_t_rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        char p[1024];
        while (d && (e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            dt_t_rm_rf(p);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}
#endif
