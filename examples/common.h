/* common.h - what the examples share: number flags and the datasets with their usual transforms.
   Define EX_PROG (the program's name, for messages) before including it, after dtrain.h. */
#ifndef EX_COMMON_H
#define EX_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_long(const char *flag, const char *v, long lo, long *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo) { fprintf(stderr, "%s: %s needs an integer >= %ld, got '%s'\n", EX_PROG, flag, lo, v ? v : ""); return -1; }
    *out = x;
    return 0;
}
static int parse_double(const char *flag, const char *v, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= 0.0)) { fprintf(stderr, "%s: %s needs a number >= 0, got '%s'\n", EX_PROG, flag, v ? v : ""); return -1; }
    *out = x;
    return 0;
}

/* Loads train and test sets; transforms as torchvision's usual recipes for each dataset. */
static dt_result load_data(const char *dataset, const char *data, long size, long seed, dt_dataset *train, dt_dataset *test, dt_transform *tt, dt_transform *te,
                           dt_partition *split) {
    dt_result r;
    memset(tt, 0, sizeof *tt);
    if (!strcmp(dataset, "fashion-mnist") || !strcmp(dataset, "mnist")) {
        int fashion = !strcmp(dataset, "fashion-mnist");
        if ((r = dt_dataset_load_mnist_dir(train, data, 1)) != DT_OK) return r;
        if ((r = dt_dataset_load_mnist_dir(test, data, 0)) != DT_OK) return r;
        tt->mean[0] = fashion ? 0.2860f : 0.1307f;
        tt->std[0] = fashion ? 0.3530f : 0.3081f;
    } else if (!strcmp(dataset, "cifar10")) {
        static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
        if ((r = dt_dataset_load_cifar10(train, data, 1)) != DT_OK) return r;
        if ((r = dt_dataset_load_cifar10(test, data, 0)) != DT_OK) return r;
        memcpy(tt->mean, mean, sizeof mean);
        memcpy(tt->std, std, sizeof std);
        tt->crop_pad = 4;
        tt->flip = 1;
    } else if (!strcmp(dataset, "folder")) {
        const float frac[2] = {0.9f, 0.1f};
        if (!data) return dt_set_error(DT_ERR_INVALID_ARG, "--dataset folder needs --data ROOT (ROOT/<class>/<image>)");
        if ((r = dt_dataset_load_image_folder(train, data, size, size, 3)) != DT_OK) return r;
        /* one folder: a seeded 90/10 split; the test set shares the training set's pixels */
        if ((r = dt_partition_fractions(split, train->count, frac, 2, (uint64_t)seed)) != DT_OK) return r;
        *test = *train;
        tt->mean[0] = tt->mean[1] = tt->mean[2] = 0.5f;
        tt->std[0] = tt->std[1] = tt->std[2] = 0.5f;
        tt->flip = 1;
    } else {
        return dt_set_error(DT_ERR_INVALID_ARG, "unknown --dataset '%s': use fashion-mnist, mnist, cifar10 or folder", dataset);
    }
    *te = *tt;
    te->crop_pad = 0;
    te->flip = 0;
    return DT_OK;
}

#endif
