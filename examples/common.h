/* common.h - what the examples share: their main() (ex_main: the launcher's flags, the example's own, the
   data, dt_launch), their data flags, the datasets with their usual transforms, the end of an epoch (the
   loss and traffic over the ranks, the test set on rank 0) and rank 0's report of it (ex_report: the log line
   and the CSV row). What an example teaches stays in the example: its rank_main. Define EX_PROG (the
   program's name, for messages) before including it, after dtrain.h. The functions are static inline, so an
   example that uses only some of them compiles without warnings. */
#ifndef EX_COMMON_H
#define EX_COMMON_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int parse_long(const char *flag, const char *v, long lo, long *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo) { fprintf(stderr, "%s: %s needs an integer >= %ld, got '%s'\n", EX_PROG, flag, lo, v ? v : ""); return -1; }
    *out = x;
    return 0;
}
static inline int parse_double(const char *flag, const char *v, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= 0.0)) { fprintf(stderr, "%s: %s needs a number >= 0, got '%s'\n", EX_PROG, flag, v ? v : ""); return -1; }
    *out = x;
    return 0;
}

/* Loads train and test sets; transforms as torchvision's usual recipes for each dataset. */
static inline dt_result load_data(const char *dataset, const char *data, long size, long seed, dt_dataset *train, dt_dataset *test,
                                  dt_transform *tt, dt_transform *te, dt_partition *split) {
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

/* The data a training example reads: the flags that choose it and, after ex_load, the two sets. Each
   example's args embeds one, zeroed, with the default dataset set before the flags are read. */
typedef struct ex_data {
    const char *dataset, *dir;    /* --dataset (NULL where the example has no such flag), --data DIR */
    long limit, seed;             /* --limit N: the first N training samples; --seed */
    dt_dataset train, test;       /* loaded once by main, read by every local rank */
    dt_transform tt, te;          /* the training transform (with its augmentation) and the test one */
    int64_t ntrain;               /* the training samples used: --limit or all */
} ex_data;

/* The flags every training example takes: --dataset, --data, --limit, --seed, --batch, and --epochs and
   --lr (> 0) where the example gives them a place. Returns 1 when f is one of them (*bad is then nonzero
   when its value v is wrong; parse_long and parse_double say why), 0 when it is not. */
static inline int ex_flag(const char *f, const char *v, ex_data *d, long *epochs, long *batch, double *lr, int *bad) {
    if (!strcmp(f, "--dataset") && d->dataset) d->dataset = v;
    else if (!strcmp(f, "--data")) d->dir = v;
    else if (!strcmp(f, "--limit")) *bad = parse_long(f, v, 1, &d->limit);
    else if (!strcmp(f, "--seed")) *bad = parse_long(f, v, 0, &d->seed);
    else if (!strcmp(f, "--batch")) *bad = parse_long(f, v, 1, batch);
    else if (!strcmp(f, "--epochs") && epochs) *bad = parse_long(f, v, 1, epochs);
    else if (!strcmp(f, "--lr") && lr) *bad = parse_double(f, v, lr) || !(*lr > 0.0);
    else return 0;
    return 1;
}

/* Frees what ex_load loaded. An image folder's test set is its training set, freed once. */
static inline void ex_free(ex_data *d) {
    if (d->test.pixels != d->train.pixels) dt_dataset_free(&d->test);
    dt_dataset_free(&d->train);
}

/* Loads d->dataset (an image folder's images at 32x32) and sets d->ntrain. Returns the exit status: 0, or 1 after
   saying why on stderr, with nothing left loaded. */
static inline int ex_load(ex_data *d) {
    dt_partition none;   /* an image folder's 90/10 split, which only train.c uses */
    memset(&none, 0, sizeof none);
    if (load_data(d->dataset, d->dir, 32, d->seed, &d->train, &d->test, &d->tt, &d->te, &none) != DT_OK) {
        fprintf(stderr, "%s: %s\n", EX_PROG, dt_last_error());
        ex_free(d);
        return 1;
    }
    dt_partition_free(&none);
    d->ntrain = d->limit && d->limit < d->train.count ? d->limit : d->train.count;   /* --limit: the first N samples */
    return 0;
}

/* Creates the zoo model `name` for d's images and classes; its weights come from --seed, and stream (e.g.
   the rank) picks its random stream. */
static inline dt_result ex_model_create(dt_model **m, const char *name, const ex_data *d, uint64_t stream) {
    dt_model_desc md;
    memset(&md, 0, sizeof md);
    md.in_c = d->train.c; md.in_h = d->train.h; md.in_w = d->train.w; md.seed = (uint64_t)d->seed; md.stream = stream;
    return dt_zoo_create(m, (dt_zoo_model)dt_zoo_from_name(name), d->train.num_classes, &md);
}

/* The end of an epoch, on every rank (collective): sums (loss x samples, samples) are summed over the
   ranks, *mb (the MB this rank sent) becomes the busiest rank's, and rank 0 evaluates m on the test set
   (top-1 and top-k accuracy into *ev). */
static inline dt_result ex_epoch_end(dt_comm *c, double sums[2], double *mb, dt_model *m, const ex_data *d, int topk,
                                     dt_eval_result *ev) {
    dt_result r;
    if ((r = dt_comm_allreduce(c, sums, 2, DT_F64, DT_SUM, DT_ALGO_AUTO)) != DT_OK) return r;
    if ((r = dt_comm_allreduce(c, mb, 1, DT_F64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    return dt_comm_rank(c) == 0 ? dt_evaluate(m, &d->test, NULL, 0, &d->te, 1000, topk, ev) : DT_OK;
}

/* One column of what rank 0 reports after an epoch: its CSV name and format, and its text in the log line, a
   printf format of one double that is given the value times scale (100 shows a fraction as a percentage). */
typedef struct ex_col { const char *name, *csv, *log; double scale; } ex_col;
/* The number of elements of an array. */
#define EX_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* The columns most examples report. */
#define EX_COL_TIME       {"time_s", "%.3f", "%7.2fs", 1}
#define EX_COL_TRAIN_LOSS {"train_loss", "%.6f", "train loss %.4f", 1}
#define EX_COL_TEST_LOSS  {"test_loss", "%.6f", "test loss %.4f", 1}
#define EX_COL_TEST_ACC   {"test_acc", "%.6f", "test acc %6.2f%%", 100}
#define EX_COL_TOP5       {"test_top5", "%.6f", "top-5 %6.2f%%", 100}
#define EX_COL_IMG_PER_S  {"img_per_s", "%.1f", "%.0f img/s", 1}
#define EX_COL_BUSIEST_MB {"busiest_rank_mb", "%.3f", "%.1f MB sent by the busiest rank", 1}

/* Opens path for rank 0's report and writes the CSV header, "epoch" and the n columns' names; append (a
   resumed run) adds to the file, without a header. Without a path *csv is NULL. */
static inline dt_result ex_report_open(FILE **csv, const char *path, const ex_col *cols, int n, int append) {
    int i;
    *csv = NULL;
    if (!path) return DT_OK;
    if (!(*csv = fopen(path, append ? "a" : "w"))) return dt_set_error(DT_ERR_IO, "cannot write %s", path);
    if (append) return DT_OK;
    fputs("epoch", *csv);
    for (i = 0; i < n; i++) fprintf(*csv, ",%s", cols[i].name);
    fputc('\n', *csv);
    return DT_OK;
}

/* Rank 0's report of epoch `epoch` (1-based) of `epochs`: on stdout the line "epoch   E/N" and each column's
   text, two spaces apart; in csv (if any) the row "E" and each value, comma-separated. v [n] holds the values in
   the columns' order. Both are flushed: a stopped run keeps the epochs it reported. */
static inline void ex_report(FILE *csv, int64_t epoch, long epochs, const ex_col *cols, const double *v, int n) {
    int i;
    printf("epoch %3lld/%ld", (long long)epoch, epochs);
    for (i = 0; i < n; i++) {
        printf("  ");
        printf(cols[i].log, v[i] * cols[i].scale);
    }
    printf("\n");
    fflush(stdout);
    if (!csv) return;
    fprintf(csv, "%lld", (long long)epoch);
    for (i = 0; i < n; i++) {
        fputc(',', csv);
        fprintf(csv, cols[i].csv, v[i]);
    }
    fputc('\n', csv);
    fflush(csv);
}

/* Opens path for the CSV rows and writes their header (with its newline); without a path *csv is NULL. */
static inline dt_result ex_csv_open(FILE **csv, const char *path, const char *header) {
    *csv = NULL;
    if (!path) return DT_OK;
    if (!(*csv = fopen(path, "w"))) return dt_set_error(DT_ERR_IO, "cannot write %s", path);
    fputs(header, *csv);
    return DT_OK;
}

/* Writes one row (printf format) to the CSV file, if there is one, and flushes it: a stopped run keeps
   the rows of the epochs it finished. */
static inline void ex_csv_row(FILE *csv, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static inline void ex_csv_row(FILE *csv, const char *fmt, ...) {
    va_list ap;
    if (!csv) return;
    va_start(ap, fmt);
    vfprintf(csv, fmt, ap);
    va_end(ap);
    fflush(csv);
}

/* What ex_main needs of an example: its usage text, its own flags, an optional step after the data is loaded,
   and the work of one rank. */
typedef struct ex_example {
    void      (*usage)(FILE *f);
    int       (*parse)(int argc, char **argv, void *args);   /* the example's flags: 0, or -1 after saying why */
    int       (*prepare)(void *args);                        /* NULL, or after loading: 0, or the exit status */
    dt_result (*rank_main)(dt_comm *c, void *args);          /* one rank's work, run by dt_launch */
} ex_example;

/* The main() of an example that runs on ranks: takes the launcher's flags out of argv (--ranks N, default 4,
   --timeout, --link-latency, ...), then ex->parse reads the rest into args; data (NULL: the example reads
   none) is loaded, ex->prepare runs, and dt_launch runs ex->rank_main(c, args) on every rank. Returns the exit
   status: 2 for a bad flag, 1 when the data cannot be loaded or a rank failed (dt_launch has logged it), 0. */
static inline int ex_main(int argc, char **argv, const ex_example *ex, void *args, ex_data *data) {
    dt_launch_desc ld;
    int rc;
    memset(&ld, 0, sizeof ld);
    ld.ranks = 4;
    if (dt_launch_parse(&argc, argv, &ld) != DT_OK) {
        fprintf(stderr, "%s: %s\n", EX_PROG, dt_last_error());
        ex->usage(stderr);
        return 2;
    }
    if (ex->parse(argc, argv, args)) return 2;
    if (data && (rc = ex_load(data)) != 0) return rc;
    rc = ex->prepare ? ex->prepare(args) : 0;
    if (rc == 0) rc = dt_launch(&ld, ex->rank_main, args) == DT_OK ? 0 : 1;   /* 1 when a rank failed */
    if (data) ex_free(data);
    return rc;
}

#endif
