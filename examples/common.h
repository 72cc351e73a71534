/* common.h - what the examples share: their main() (ex_main: the launcher's flags, the example's own, the
   data, dt_launch), their data flags (--pad-to too), their optimizer and schedule flags (ex_recipe: the
   recipe, checked and printed whole), their checkpoint flags (ex_ckpt: --checkpoint, --checkpoint-every,
   --resume; the saves and loads through each trainer), the datasets with their usual transforms, the end of
   an epoch (the loss and traffic over the ranks, the test set on rank 0) and rank 0's report of it
   (ex_report: the log line and the CSV row). What an example teaches stays in the example: its rank_main. Define EX_PROG (the
   program's name, for messages) before including it, after dtrain.h. The functions are static inline, so an
   example that uses only some of them compiles without warnings. */
#ifndef EX_COMMON_H
#define EX_COMMON_H
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number of elements of an array. */
#define EX_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static inline int parse_long(const char *flag, const char *v, long lo, long *out) {
    char *end;
    long x;
    errno = 0;
    x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || errno == ERANGE) {   /* ERANGE: past LONG_MAX, which strtol would return */
        fprintf(stderr, "%s: %s needs an integer >= %ld%s, got '%s'\n", EX_PROG, flag, lo, errno == ERANGE ? " that fits a long" : "",
                v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}
static inline int parse_double(const char *flag, const char *v, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= 0.0) || !isfinite(x)) {   /* "inf" and "nan" parse too */
        fprintf(stderr, "%s: %s needs a finite number >= 0, got '%s'\n", EX_PROG, flag, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* A rate flag (--link-bandwidth): bytes per second as a plain number (125000000, 1.25e8), with a decimal
   suffix K, M or G (k, m, g too: bytes, as dt_launch_parse reads them: 125M), or with a unit, optionally followed by "/s":
   KB (kB), MB, GB (bytes per second: 125MB) or Kbit (kbit), Mbit, Gbit (bits per second, as networks are sold: 100Mbit,
   1Gbit/s, 10Gbit). Returns 0 with bytes per second in *out, or -1 after saying why. */
static inline int ex_parse_rate(const char *flag, const char *v, double *out) {
    static const struct { const char *unit; double bytes; } units[] = {
        {"", 1}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9},
        {"KB", 1e3}, {"kB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
        {"Kbit", 1e3 / 8}, {"kbit", 1e3 / 8}, {"Mbit", 1e6 / 8}, {"Gbit", 1e9 / 8}};
    char *end;
    double x = v ? strtod(v, &end) : 0;
    size_t n;
    int i;
    if (v && *v && end != v && isfinite(x) && x > 0.0) {
        n = strlen(end);
        if (n >= 2 && !strcmp(end + n - 2, "/s")) n -= 2;   /* "1Gbit/s" as "1Gbit" */
        for (i = 0; i < EX_COUNT(units); i++)
            if (strlen(units[i].unit) == n && !strncmp(end, units[i].unit, n)) {
                *out = x * units[i].bytes;
                return 0;
            }
    }
    fprintf(stderr, "%s: %s needs a rate > 0: bytes per second (125000000, or with a unit 125MB) or bits per second "
                    "(100Mbit, 1Gbit, 10Gbit), got '%s'\n", EX_PROG, flag, v ? v : "");
    return -1;
}

/* A rate of bytes per second in the charts' words: "100 Mbit/s", "1 Gbit/s", "12.5 Gbit/s". Returns buf. */
static inline const char *ex_rate_str(double bytes_per_s, char *buf, size_t size) {
    double bits = bytes_per_s * 8.0;
    if (bits >= 1e9) snprintf(buf, size, "%g Gbit/s", bits / 1e9);
    else if (bits >= 1e6) snprintf(buf, size, "%g Mbit/s", bits / 1e6);
    else snprintf(buf, size, "%g kbit/s", bits / 1e3);
    return buf;
}

/* The training recipe every example that trains with SGD shares: the optimizer and its learning-rate schedule,
   from one set of flags (ex_recipe_flag), checked in one place (ex_recipe_check), turned into the library's descs
   (ex_recipe_optim, ex_recipe_sched) and printed whole in the example's header line (ex_recipe_str). The schedule
   is stepped once per epoch (per round in fedavg). Each example sets its defaults, and what its step cannot do,
   before reading the flags. */
typedef struct ex_recipe {
    dt_optim_kind kind;                   /* --optim sgd|adam|adamw */
    double lr, momentum, wd, min_lr;      /* --lr, --momentum (SGD), --wd, --min-lr (the floor of --cosine) */
    double clip;                          /* --clip-grad X: each step's gradient norm clipped to X (0: not clipped) */
    int nesterov, cosine;                 /* --nesterov (SGD, momentum > 0), --cosine */
    long warmup;                          /* --warmup N: N epochs (rounds) of linear warm-up from lr / 3 */
    int64_t milestones[DT_SCHED_MAX_MILESTONES];   /* --milestones A,B,...: lr x 0.1 at each, counted after the warm-up */
    int plain;                            /* set by the example: its step is plain SGD (no --optim, --momentum, --wd, --nesterov) */
    int lr_zero;                          /* set by the example: --lr 0 means something there */
    int momentum_given, wd_given, min_lr_given;   /* which of these the flags set, for the checks */
} ex_recipe;

/* Prints the recipe's flags for a usage text, each line after `indent` spaces. */
static inline void ex_recipe_usage(FILE *f, int indent, int plain) {
    if (!plain) fprintf(f, "%*s[--optim sgd|adam|adamw] [--lr X] [--momentum X] [--nesterov] [--wd X]\n", indent, "");
    fprintf(f, "%*s%s[--milestones A,B,...] [--cosine] [--min-lr X] [--warmup N] [--clip-grad X]\n", indent, "", plain ? "[--lr X] " : "");
}

/* --milestones A,B,...: up to DT_SCHED_MAX_MILESTONES ascending epochs > 0. Returns 0, or -1 after saying why. */
static inline int ex_parse_milestones(const char *v, int64_t *ms) {
    const char *p = v;
    char *end;
    int k = 0;
    memset(ms, 0, sizeof(int64_t) * DT_SCHED_MAX_MILESTONES);
    for (;;) {
        long e = strtol(p, &end, 10);
        if (end == p || e < 1 || k == DT_SCHED_MAX_MILESTONES || (k > 0 && e <= ms[k - 1]) || (*end && *end != ',') ||
            (*end == ',' && !end[1])) {
            fprintf(stderr, "%s: --milestones needs up to %d ascending epochs > 0 separated by commas (e.g. 80,120), got '%s'\n",
                    EX_PROG, DT_SCHED_MAX_MILESTONES, v);
            return -1;
        }
        ms[k++] = e;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* One of the recipe's flags (--clip-grad too): returns the words of argv it takes (1 for --nesterov and --cosine, 2 with a value),
   0 when f is not one of them. *bad is nonzero when its value v is wrong (it says why). */
static inline int ex_recipe_flag(const char *f, const char *v, ex_recipe *r, int *bad) {
    if (!strcmp(f, "--nesterov")) { r->nesterov = 1; return 1; }
    if (!strcmp(f, "--cosine")) { r->cosine = 1; return 1; }
    if (strcmp(f, "--optim") && strcmp(f, "--lr") && strcmp(f, "--momentum") && strcmp(f, "--wd") && strcmp(f, "--min-lr") &&
        strcmp(f, "--warmup") && strcmp(f, "--milestones") && strcmp(f, "--clip-grad")) return 0;
    if (!v) { fprintf(stderr, "%s: %s needs a value\n", EX_PROG, f); *bad = 1; return 2; }
    if (!strcmp(f, "--optim")) {
        if (!strcmp(v, "sgd")) r->kind = DT_OPTIM_SGD;
        else if (!strcmp(v, "adam")) r->kind = DT_OPTIM_ADAM;
        else if (!strcmp(v, "adamw")) r->kind = DT_OPTIM_ADAMW;
        else { fprintf(stderr, "%s: --optim needs sgd, adam or adamw, got '%s'\n", EX_PROG, v); *bad = 1; }
    }
    else if (!strcmp(f, "--lr")) *bad = parse_double(f, v, &r->lr);
    else if (!strcmp(f, "--momentum")) { *bad = parse_double(f, v, &r->momentum); r->momentum_given = 1; }
    else if (!strcmp(f, "--wd")) { *bad = parse_double(f, v, &r->wd); r->wd_given = 1; }
    else if (!strcmp(f, "--min-lr")) { *bad = parse_double(f, v, &r->min_lr); r->min_lr_given = 1; }
    else if (!strcmp(f, "--warmup")) *bad = parse_long(f, v, 0, &r->warmup);
    else if (!strcmp(f, "--clip-grad")) {
        if (!(*bad = parse_double(f, v, &r->clip)) && !(r->clip > 0.0)) {
            fprintf(stderr, "%s: --clip-grad needs a gradient norm > 0 (leave it out for none), got %g\n", EX_PROG, r->clip);
            *bad = 1;
        }
    }
    else *bad = ex_parse_milestones(v, r->milestones);
    return 2;
}

/* The checks of a recipe as a whole, for a run of `total` epochs (rounds: unit). Returns 0, or -1 after saying why
   on stderr. AdamW without --wd gets the library's default decay (0.01), so that the header line is true. */
static inline int ex_recipe_check(ex_recipe *r, long total, const char *unit) {
    const char *optim = r->kind == DT_OPTIM_SGD ? "sgd" : r->kind == DT_OPTIM_ADAM ? "adam" : "adamw";
    const char *why = NULL;
    if (r->plain && (r->kind != DT_OPTIM_SGD || r->momentum != 0.0 || r->wd != 0.0 || r->nesterov))
        why = r->kind != DT_OPTIM_SGD ? "--optim" : r->momentum != 0.0 ? "--momentum" : r->wd != 0.0 ? "--wd" : "--nesterov";
    if (why) {
        fprintf(stderr, "%s: %s: this example's step is plain SGD (parameters -= lr x gradient); it takes --lr and the schedule's "
                        "flags only\n", EX_PROG, why);
        return -1;
    }
    if (!(r->lr > 0.0) && !r->lr_zero) {
        fprintf(stderr, "%s: --lr needs a number > 0: with lr 0 the model would not train, got %g\n", EX_PROG, r->lr);
        return -1;
    }
    if (r->kind != DT_OPTIM_SGD && (r->momentum_given || r->nesterov)) {
        fprintf(stderr, "%s: %s is SGD's: --optim %s has no momentum (its betas are 0.9 and 0.999); drop it or use --optim sgd\n",
                EX_PROG, r->nesterov ? "--nesterov" : "--momentum", optim);
        return -1;
    }
    if (r->nesterov && r->momentum == 0.0) {
        fprintf(stderr, "%s: --nesterov needs --momentum > 0 (e.g. --momentum 0.9)\n", EX_PROG);
        return -1;
    }
    if (r->kind == DT_OPTIM_ADAMW && r->wd == 0.0) {
        if (r->wd_given) { fprintf(stderr, "%s: --optim adamw with --wd 0 is Adam: use --optim adam, or a --wd > 0\n", EX_PROG); return -1; }
        r->wd = 0.01;   /* the library's default for AdamW */
    }
    if (r->kind != DT_OPTIM_SGD) r->momentum = 0.0;   /* an example's SGD default does not apply */
    if (r->cosine && r->milestones[0]) {
        fprintf(stderr, "%s: --milestones and --cosine are two schedules: give one of them\n", EX_PROG);
        return -1;
    }
    if (r->min_lr_given && !r->cosine) {
        fprintf(stderr, "%s: --min-lr is the floor of the cosine schedule: give --cosine too, or drop --min-lr\n", EX_PROG);
        return -1;
    }
    if (r->warmup >= total) {
        fprintf(stderr, "%s: --warmup %ld needs more %s than that: the run has %ld\n", EX_PROG, r->warmup, unit, total);
        return -1;
    }
    return 0;
}

/* The optimizer of the recipe. */
static inline void ex_recipe_optim(const ex_recipe *r, dt_optim_desc *od) {
    memset(od, 0, sizeof *od);
    od->kind = r->kind;
    od->lr = (float)r->lr; od->momentum = (float)r->momentum; od->nesterov = r->nesterov; od->weight_decay = (float)r->wd;
    od->clip_norm = (float)r->clip;
}

/* The schedule of the recipe, for a run of `total` epochs (rounds): the cosine spans what the warm-up leaves. */
static inline void ex_recipe_sched(const ex_recipe *r, long total, dt_sched_desc *sd) {
    memset(sd, 0, sizeof *sd);
    sd->kind = r->cosine ? DT_SCHED_COSINE : r->milestones[0] ? DT_SCHED_MULTISTEP : DT_SCHED_CONSTANT;
    sd->base_lr = (float)r->lr; sd->min_lr = (float)r->min_lr; sd->warmup = r->warmup; sd->t_max = total - r->warmup;
    memcpy(sd->milestones, r->milestones, sizeof sd->milestones);
}

/* The whole recipe in words, for the header line, e.g. "sgd lr 0.1 momentum 0.9 nesterov wd 0.0005, lr x0.1 at
   epochs 80,120 after 5 warm-up epochs". Returns buf. */
static inline const char *ex_recipe_str(const ex_recipe *r, long total, const char *unit, char *buf, size_t size) {
    size_t n;
    int i;
    if (r->kind == DT_OPTIM_SGD)
        n = (size_t)snprintf(buf, size, "sgd lr %g momentum %g%s wd %g", r->lr, r->momentum, r->nesterov ? " nesterov" : "", r->wd);
    else n = (size_t)snprintf(buf, size, "%s lr %g wd %g", r->kind == DT_OPTIM_ADAM ? "adam" : "adamw", r->lr, r->wd);
    if (n < size && r->cosine) n += (size_t)snprintf(buf + n, size - n, ", cosine to %g over %ld %s", r->min_lr, total - r->warmup, unit);
    else if (n < size && r->milestones[0]) {
        n += (size_t)snprintf(buf + n, size - n, ", lr x0.1 at %s ", unit);
        for (i = 0; i < DT_SCHED_MAX_MILESTONES && r->milestones[i] && n < size; i++)
            n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? "," : "", (long long)r->milestones[i]);
    } else if (n < size) n += (size_t)snprintf(buf + n, size - n, ", constant lr");
    if (n < size && r->warmup) n += (size_t)snprintf(buf + n, size - n, " after %ld warm-up %s", r->warmup, unit);
    if (n < size && r->clip > 0.0) snprintf(buf + n, size - n, ", gradient norm clipped to %g", r->clip);
    return buf;
}

/* Says on stderr which files --dataset NAME reads from --data DIR and where to get them, after a load failed. */
static inline void ex_data_help(const char *dataset, const char *dir) {
    const char *idx = "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte "
                      "(each may be gzipped, .gz)";
    if (!strcmp(dataset, "fashion-mnist"))
        fprintf(stderr, "%s: --dataset fashion-mnist reads %s from --data DIR (default %s, where Debian's package "
                "dataset-fashion-mnist installs them: apt install dataset-fashion-mnist; elsewhere, the four files of "
                "https://github.com/zalandoresearch/fashion-mnist, data/fashion)%s%s\n", EX_PROG, idx, DT_MNIST_DEFAULT_DIR,
                dir ? "; --data was " : "", dir ? dir : "");
    else if (!strcmp(dataset, "mnist"))
        fprintf(stderr, "%s: --dataset mnist reads MNIST's %s from --data DIR (http://yann.lecun.com/exdb/mnist/, or the "
                "MNIST/raw directory torchvision's download leaves)%s%s\n", EX_PROG, idx, dir ? "; --data was " : "", dir ? dir : "");
    else if (!strcmp(dataset, "cifar10"))
        fprintf(stderr, "%s: --dataset cifar10 reads data_batch_1.bin .. data_batch_5.bin and test_batch.bin from --data DIR: "
                "the directory cifar-10-batches-bin that https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz unpacks to "
                "(the binary version, not the Python one)%s%s\n", EX_PROG, dir ? "; --data was " : "", dir ? dir : "");
}

/* Before loading: --data is needed where the dataset has no default directory (only Fashion-MNIST has one, Debian's:
   MNIST would otherwise be read from Fashion-MNIST's files). Returns 0, or -1 after saying why and where to get it. */
static inline int ex_data_check(const char *dataset, const char *dir) {
    if (dir || (strcmp(dataset, "mnist") && strcmp(dataset, "cifar10"))) return 0;
    fprintf(stderr, "%s: --dataset %s needs --data DIR: it has no default directory\n", EX_PROG, dataset);
    ex_data_help(dataset, dir);
    return -1;
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
        dt_partition_desc pd;
        if (!data) return dt_set_error(DT_ERR_INVALID_ARG, "--dataset folder needs --data ROOT (ROOT/<class>/<image>)");
        if ((r = dt_dataset_load_image_folder(train, data, size, size, 3)) != DT_OK) return r;
        /* one folder: a seeded 90/10 split; the test set shares the training set's pixels */
        memset(&pd, 0, sizeof pd);
        pd.kind = DT_PARTITION_FRACTIONS; pd.count = train->count; pd.parts = 2; pd.fractions = frac; pd.seed = (uint64_t)seed;
        if ((r = dt_partition_create(split, &pd)) != DT_OK) return r;
        if (split->offsets[1] == 0 || split->offsets[2] == split->offsets[1])   /* found now, not at the first evaluation */
            return dt_set_error(DT_ERR_INVALID_ARG, "%s holds %lld images: too few for a 90/10 split into training and test "
                                "images (each needs one); give a folder of at least 10 images", data, (long long)train->count);
        *test = *train;
        tt->mean[0] = tt->mean[1] = tt->mean[2] = 0.5f;
        tt->std[0] = tt->std[1] = tt->std[2] = 0.5f;
        tt->flip = 1;
    } else {
        return dt_set_error(DT_ERR_INVALID_ARG, "unknown --dataset '%s': use fashion-mnist, mnist, cifar10 or folder", dataset);
    }
    if (test->c != train->c || test->h != train->h || test->w != train->w || test->num_classes != train->num_classes)
        return dt_set_error(DT_ERR_FORMAT, "the test images (%s: %lldx%lldx%lld, %lld classes) are not of the training images' "   /* found now, not after training */
                            "kind (%s: %lldx%lldx%lld, %lld classes): give a directory whose two sets belong together",
                            test->source, (long long)test->c, (long long)test->h, (long long)test->w, (long long)test->num_classes,
                            train->source, (long long)train->c, (long long)train->h, (long long)train->w,
                            (long long)train->num_classes);
    *te = *tt;
    te->crop_pad = 0;
    te->flip = 0;
    return DT_OK;
}

/* The data a training example reads: the flags that choose it and, after ex_load, the two sets. Each
   example's args embeds one, zeroed, with the default dataset (and padding) set before the flags are read. */
typedef struct ex_data {
    const char *dataset, *dir;    /* --dataset (NULL where the example has no such flag), --data DIR */
    long limit, seed;             /* --limit N: the first N training samples; --seed */
    long test_limit;              /* --test-limit N: the first N test samples are evaluated (0: all) */
    long pad_to;                  /* --pad-to S: smaller images zero-padded to S x S (e.g. 28x28 to 32x32 for VGG-11); 0: kept */
    dt_precision precision;       /* --precision fp32|bf16: the model's (dt_model_desc.precision) */
    dt_dataset train, test;       /* loaded once by main, read by every local rank */
    dt_transform tt, te;          /* the training transform (with its augmentation) and the test one */
    int64_t ntrain;               /* the training samples used: --limit or all */
    char name[128];               /* the data as the header line names it, e.g. "fashion-mnist 28x28 zero-padded to 32x32" */
} ex_data;

/* The flags every training example takes: --dataset, --data, --limit, --test-limit, --seed, --pad-to, --precision, --batch, and --epochs
   where the example gives it a place (the optimizer's flags are ex_recipe_flag's). Returns 1 when f is one of
   them (*bad is then nonzero when its value v is wrong; parse_long says why), 0 when it is not. */
static inline int ex_flag(const char *f, const char *v, ex_data *d, long *epochs, long *batch, int *bad) {
    if (!strcmp(f, "--dataset") && d->dataset) d->dataset = v;
    else if (!strcmp(f, "--data")) d->dir = v;
    else if (!strcmp(f, "--limit")) *bad = parse_long(f, v, 1, &d->limit);
    else if (!strcmp(f, "--test-limit")) *bad = parse_long(f, v, 1, &d->test_limit);
    else if (!strcmp(f, "--seed")) *bad = parse_long(f, v, 0, &d->seed);
    else if (!strcmp(f, "--pad-to")) *bad = parse_long(f, v, 0, &d->pad_to);
    else if (!strcmp(f, "--precision")) {
        if ((*bad = dt_precision_parse(v, &d->precision) != DT_OK ? -1 : 0) != 0) fprintf(stderr, "%s: --precision: %s\n", EX_PROG, dt_last_error());
    }
    else if (!strcmp(f, "--batch")) *bad = parse_long(f, v, 1, batch);
    else if (!strcmp(f, "--epochs") && epochs) *bad = parse_long(f, v, 1, epochs);
    else return 0;
    return 1;
}

/* Frees what ex_load loaded. An image folder's test set is its training set, freed once. */
static inline void ex_free(ex_data *d) {
    if (d->test.pixels != d->train.pixels) dt_dataset_free(&d->test);
    dt_dataset_free(&d->train);
}

/* Adds the training transform's augmentation, which shapes training, to d->name (" with random crops (pad 4) and
   flips"); nothing without one. Returns 0. */
static inline int ex_name_augment(ex_data *d) {
    size_t n = strlen(d->name);
    if (d->tt.crop_pad && d->tt.flip) snprintf(d->name + n, sizeof d->name - n, " with random crops (pad %d) and flips", (int)d->tt.crop_pad);
    else if (d->tt.crop_pad) snprintf(d->name + n, sizeof d->name - n, " with random crops (pad %d)", (int)d->tt.crop_pad);
    else if (d->tt.flip) snprintf(d->name + n, sizeof d->name - n, " with random flips");
    return 0;
}

/* After loading: --pad-to, and d->name. Returns the exit status: 0; 2 when the images are larger than --pad-to;
   1 when there is no memory (said on stderr). */
static inline int ex_pad(ex_data *d) {
    int64_t h = d->train.h, w = d->train.w, s = d->pad_to;
    int shared = d->test.pixels == d->train.pixels;   /* an image folder's test set is its training set */
    snprintf(d->name, sizeof d->name, "%s %lldx%lld", d->dataset, (long long)h, (long long)w);
    if (!s || (h == s && w == s)) return ex_name_augment(d);
    if (h > s || w > s) {
        fprintf(stderr, "%s: --pad-to %ld: the images of %s are %lldx%lld already; give a size of at least %lld, or 0\n", EX_PROG,
                d->pad_to, d->dataset, (long long)h, (long long)w, (long long)(h > w ? h : w));
        return 2;
    }
    if (dt_dataset_pad(&d->train, s, s) != DT_OK || (!shared && dt_dataset_pad(&d->test, s, s) != DT_OK)) {
        fprintf(stderr, "%s: %s\n", EX_PROG, dt_last_error());
        return 1;
    }
    if (shared) d->test = d->train;
    snprintf(d->name, sizeof d->name, "%s %lldx%lld zero-padded to %lldx%lld", d->dataset, (long long)h, (long long)w,
             (long long)s, (long long)s);
    return ex_name_augment(d);
}

/* Loads d->dataset (an image folder's images at 32x32), pads it (--pad-to), sets d->ntrain and cuts the test set
   to --test-limit. Returns the exit
   status: 0, or 1 (2 for a --pad-to smaller than the images) after saying why on stderr, with nothing left loaded. */
static inline int ex_load(ex_data *d) {
    dt_partition none;   /* an image folder's 90/10 split, which only train.c uses */
    int rc;
    memset(&none, 0, sizeof none);
    if (ex_data_check(d->dataset, d->dir)) return 1;
    if (load_data(d->dataset, d->dir, 32, d->seed, &d->train, &d->test, &d->tt, &d->te, &none) != DT_OK) {
        fprintf(stderr, "%s: %s\n", EX_PROG, dt_last_error());
        ex_data_help(d->dataset, d->dir);
        ex_free(d);
        return 1;
    }
    dt_partition_free(&none);
    if ((rc = ex_pad(d)) != 0) { ex_free(d); return rc; }
    d->ntrain = d->limit && d->limit < d->train.count ? d->limit : d->train.count;   /* --limit: the first N samples */
    if (d->test_limit && d->test_limit < d->test.count) d->test.count = d->test_limit;   /* --test-limit: the first N */
    return 0;
}

/* After loading: --batch is at most the training set's `count` samples (all of them, before --limit: with a
   smaller --limit each epoch is one step of the --limit samples), so that a batch no data set can fill (--batch
   100000000000000) is refused before any memory is sized from it. note ends the message ("" or e.g. " (the
   global batch)"). Returns 0, or 2 after saying why. */
static inline int ex_batch_check(long batch, int64_t count, const char *dataset, const char *note) {
    if (batch <= count) return 0;
    fprintf(stderr, "%s: --batch %ld is more than the %lld training samples of %s: give --batch %lld or less%s\n", EX_PROG, batch,
            (long long)count, dataset, (long long)count, note);
    return 2;
}

/* The sampler of the training examples: rank's share of the d->ntrain training samples, reshuffled each epoch
   (set .epoch), as PyTorch's DistributedSampler with shuffle and without drop_last. */
static inline dt_sampler_desc ex_sampler(const ex_data *d, int rank, int world) {
    dt_sampler_desc s;
    memset(&s, 0, sizeof s);
    s.count = d->ntrain; s.rank = rank; s.world = world; s.seed = (uint64_t)d->seed; s.shuffle = 1;
    return s;
}

/* Creates the zoo model `name` for d's images and classes; its weights come from --seed, and stream (e.g.
   the rank) picks its random stream. A model that needs larger images (VGG-11 on 28x28) is refused naming
   --pad-to. */
static inline dt_result ex_model_create(dt_model **m, const char *name, const ex_data *d, uint64_t stream) {
    dt_model_desc md;
    dt_result r;
    char why[1024];
    dt_zoo_model z = DT_ZOO_MLP;
    memset(&md, 0, sizeof md);
    md.in_c = d->train.c; md.in_h = d->train.h; md.in_w = d->train.w; md.seed = (uint64_t)d->seed; md.stream = stream;
    md.precision = d->precision;
    if ((r = dt_zoo_parse(name, &z)) != DT_OK || (r = dt_zoo_create(m, z, d->train.num_classes, &md)) != DT_ERR_SHAPE || d->train.h >= 32)
        return r;
    snprintf(why, sizeof why, "%s", dt_last_error());   /* dt_set_error writes over the message it would quote */
    return dt_set_error(r, "%s does not fit %s's %lldx%lld images: zero-pad them with --pad-to 32 (%s)", name, d->dataset,
                        (long long)d->train.h, (long long)d->train.w, why);
}

/* m's loss and top-1 / top-k accuracy on d's test set, with the test transform (dt_evaluate's batch of 1000);
   with c (collective), the batches shared among its ranks, which hold the same m: the same result. */
static inline dt_result ex_test_on(dt_comm *c, dt_model *m, const ex_data *d, int topk, dt_eval_result *ev) {
    dt_eval_desc e;
    memset(&e, 0, sizeof e);
    e.dataset = &d->test; e.transform = &d->te; e.topk = topk;
    return c ? dt_evaluate_comm(c, m, &e, ev) : dt_evaluate(m, &e, ev);
}
static inline dt_result ex_test(dt_model *m, const ex_data *d, int topk, dt_eval_result *ev) { return ex_test_on(NULL, m, d, topk, ev); }

/* The end of an epoch, on every rank (collective): sums (loss x samples, samples) are summed over the
   ranks, *mb (the MB this rank sent) becomes the busiest rank's, and the ranks, which hold the same m,
   evaluate it on the test set together (top-1 and top-k accuracy into *ev, on every rank): no rank waits
   through another's whole evaluation, so --timeout need only cover the slowest rank's share. */
static inline dt_result ex_epoch_end(dt_comm *c, double sums[2], double *mb, dt_model *m, const ex_data *d, int topk,
                                     dt_eval_result *ev) {
    dt_result r;
    if ((r = dt_comm_allreduce(c, sums, 2, DT_F64, DT_SUM, DT_ALGO_AUTO)) != DT_OK) return r;
    if ((r = dt_comm_allreduce(c, mb, 1, DT_F64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    return ex_test_on(c, m, d, topk, ev);
}

/* After an epoch's report, before its checkpoint: a run whose mean training loss or test loss (ev, rank 0's) is
   not finite has diverged, even while its weights are still finite numbers (so large that the forward pass
   overflows), and stops here, so that the epoch's checkpoint does not replace the last good one. Collective
   on c (NULL: one process): every rank follows rank 0's verdict. A run at chance with finite losses (test
   accuracy at most 1.5 / classes, training loss at least 0.97 ln(classes), a uniform guess's) goes on, with
   a warning: it is a result, which a learning-rate sweep wants, and it may recover. */
static inline dt_result ex_stop_if_diverged(dt_comm *c, int64_t epoch, double train_loss, const dt_eval_result *ev, int64_t classes) {
    int root = !c || dt_comm_rank(c) == 0;
    double bad = root && !(isfinite(train_loss) && isfinite(ev->loss));
    dt_result r;
    if (c && (r = dt_comm_broadcast(c, &bad, 1, DT_F64, 0, DT_ALGO_AUTO)) != DT_OK) return r;
    if (!bad) {
        if (root && classes > 1 && ev->top1 <= 1.5 / (double)classes && train_loss >= 0.97 * log((double)classes))
            dt_log(DT_LOG_WARN, "epoch %lld: test accuracy %.2f%% is chance (1/%lld) and the training loss %.4f is no better than a uniform guess's "
                   "(ln %lld = %.4f): the run learns nothing; lower --lr (or --momentum), or check the labels",
                   (long long)epoch, 100.0 * ev->top1, (long long)classes, train_loss, (long long)classes, log((double)classes));
        return DT_OK;
    }
    if (!root) return dt_set_error(DT_ERR_PEER, "rank 0 found that the run diverged in epoch %lld", (long long)epoch);
    return dt_set_error(DT_ERR_NUMERIC, "epoch %lld: the %s loss is %g: the model diverged; the run stops before saving it, "
                        "so the last checkpoint, if any, is kept: resume from it with a lower --lr", (long long)epoch,
                        isfinite(train_loss) ? "test" : "training", isfinite(train_loss) ? ev->loss : train_loss);
}

/* One column of what rank 0 reports after an epoch: its CSV name and format, and its text in the log line, a
   printf format of one double that is given the value times scale (100 shows a fraction as a percentage). */
typedef struct ex_col { const char *name, *csv, *log; double scale; } ex_col;
/* The columns most examples report. */
#define EX_COL_TIME       {"time_s", "%.3f", "%7.2fs", 1}
#define EX_COL_TRAIN_LOSS {"train_loss", "%.6f", "train loss %.4f", 1}
#define EX_COL_TEST_LOSS  {"test_loss", "%.6f", "test loss %.4f", 1}
#define EX_COL_TEST_ACC   {"test_acc", "%.6f", "test acc %6.2f%%", 100}
#define EX_COL_TOP5       {"test_top5", "%.6f", "top-5 %6.2f%%", 100}
#define EX_COL_IMG_PER_S  {"img_per_s", "%.1f", "%.0f img/s", 1}
#define EX_COL_BUSIEST_MB {"busiest_rank_mb", "%.3f", "%.1f MB sent by the busiest rank", 1}

/* Flushes f, one of the run's output files (what: its name in a message, e.g. the CSV's path): DT_OK, or DT_ERR_IO
   naming the file and the cause, so that a full disk or a write error stops the run at the first write that
   failed, not in silence at its end. */
static inline dt_result ex_flush(FILE *f, const char *what) {
    errno = 0;
    if (fflush(f) == 0 && !ferror(f)) return DT_OK;
    return dt_set_error(DT_ERR_IO, "cannot write %s: %s", what, errno ? strerror(errno) : "a write failed");
}
/* The log: the lines a run prints on stdout, flushed and checked as ex_flush does. */
static inline dt_result ex_log_flush(void) { return ex_flush(stdout, "the log (standard output)"); }

/* Whether path can be created (opened for appending, so an existing file is left as it is): 0, or the errno of
   the failure. A file it created is removed again. */
static inline int ex_can_create(const char *path) {
    FILE *f;
    int had;
    if ((f = fopen(path, "rb")) != NULL) fclose(f);
    had = f != NULL;
    if (!(f = fopen(path, "ab"))) return errno ? errno : EIO;
    fclose(f);
    if (!had) remove(path);
    return 0;
}
/* Before the run, where the file is written (on the first process only under mpiexec: rank 0 writes it): that
   an output file (--csv) can be created, so that a missing or unwritable directory, or an empty path, is found
   now and not after the first epoch. Returns 0, or -1 after saying why. */
static inline int ex_out_check(const char *flag, const char *path) {
    const char *mpi_rank = getenv("PMI_RANK");
    int err;
    if (!*path) {
        fprintf(stderr, "%s: %s needs a file name, got ''\n", EX_PROG, flag);
        return -1;
    }
    if ((mpi_rank && strcmp(mpi_rank, "0")) || (err = ex_can_create(path)) == 0) return 0;
    fprintf(stderr, "%s: %s %s: cannot create it (%s): give a path in an existing, writable directory\n", EX_PROG, flag, path,
            strerror(err));
    return -1;
}

/* Opens path for rank 0's report and writes the CSV header, "epoch" and the n columns' names; append (a
   resumed run) adds to the file, with the header only if the file is empty. Without a path *csv is NULL.
   A file that cannot be opened or written (the header flushed) is DT_ERR_IO, naming it and the cause. */
static inline dt_result ex_report_open(FILE **csv, const char *path, const ex_col *cols, int n, int append) {
    int i;
    *csv = NULL;
    if (!path) return DT_OK;
    if (!(*csv = fopen(path, append ? "a" : "w"))) return dt_set_error(DT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (append && fseek(*csv, 0, SEEK_END) == 0 && ftell(*csv) > 0) return DT_OK;
    fputs("epoch", *csv);
    for (i = 0; i < n; i++) fprintf(*csv, ",%s", cols[i].name);
    fputc('\n', *csv);
    return ex_flush(*csv, path);
}

/* Rank 0's report of epoch `epoch` (1-based) of `epochs`: on stdout the line "epoch   E/N" and each column's
   text, two spaces apart; in csv (if any; path is its name) the row "E" and each value, comma-separated. v [n]
   holds the values in the columns' order. Both are flushed: a stopped run keeps the epochs it reported; a write
   that fails (a full disk) is DT_ERR_IO, naming the file and the cause. */
static inline dt_result ex_report(FILE *csv, const char *path, int64_t epoch, long epochs, const ex_col *cols, const double *v, int n) {
    dt_result r;
    int i;
    printf("epoch %3lld/%ld", (long long)epoch, epochs);
    for (i = 0; i < n; i++) {
        printf("  ");
        printf(cols[i].log, v[i] * cols[i].scale);
    }
    printf("\n");
    if ((r = ex_log_flush()) != DT_OK || !csv) return r;
    fprintf(csv, "%lld", (long long)epoch);
    for (i = 0; i < n; i++) {
        fputc(',', csv);
        fprintf(csv, cols[i].csv, v[i]);
    }
    fputc('\n', csv);
    return ex_flush(csv, path);
}

/* Opens path for the CSV rows and writes their header (with its newline); append (a resumed run) adds to the
   file, with the header only if the file is empty. Without a path *csv is NULL. Failures as ex_report_open's. */
static inline dt_result ex_csv_open(FILE **csv, const char *path, const char *header, int append) {
    *csv = NULL;
    if (!path) return DT_OK;
    if (!(*csv = fopen(path, append ? "a" : "w"))) return dt_set_error(DT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (append && fseek(*csv, 0, SEEK_END) == 0 && ftell(*csv) > 0) return DT_OK;
    fputs(header, *csv);
    return ex_flush(*csv, path);
}

/* Writes one row (printf format) to the CSV file path, if there is one (csv), and flushes it: a stopped run keeps
   the rows of the rounds it finished; a write that fails is DT_ERR_IO, as in ex_report. */
static inline dt_result ex_csv_row(FILE *csv, const char *path, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline dt_result ex_csv_row(FILE *csv, const char *path, const char *fmt, ...) {
    va_list ap;
    if (!csv) return DT_OK;
    va_start(ap, fmt);
    vfprintf(csv, fmt, ap);
    va_end(ap);
    return ex_flush(csv, path);
}

/* Checkpoints, the flags every training example shares: --checkpoint PATH saves the run's whole state to PATH
   every --checkpoint-every N steps (rounds in fedavg; default: at the end of every epoch, or round) and at the
   end; --resume continues from PATH and ends with the parameters, bit for bit, of a run that was never stopped,
   appending to its CSV. A fresh run refuses a PATH that exists (it would write over a previous run's state), and
   an empty PATH. The checkpoint records the flags that shape the steps it counts (ex_ckpt_keep: --batch, --limit
   and the example's own, e.g. --period): a resume with another value, or with fewer epochs (rounds) than it has
   done, is refused naming both. */
#define EX_CKPT_KEEP 3   /* the flags a checkpoint records (in its meta's values 5, 6, 7) */
typedef struct ex_ckpt {
    const char *path;   /* --checkpoint PATH; NULL: no checkpoints */
    long every;         /* --checkpoint-every N; 0: at the end of every epoch (round) */
    int resume;         /* --resume */
    /* set by the example once its data is loaded (ex_ckpt_run), before any rank runs: */
    long total;         /* the run's epochs (rounds): a checkpoint past them is refused */
    const char *unit;   /* "epoch" or "round" */
    int64_t samples;    /* the training samples (ex_ckpt_prepare), which bound the steps and batches of an epoch; 0: unchecked */
    long batch;         /* --batch */
    int nkeep;          /* the flags a resumed run must share with the run that saved (ex_ckpt_keep) */
    struct { const char *flag; long value; const char *(*name)(long); } keep[EX_CKPT_KEEP];
} ex_ckpt;

/* Before the run: its length (total epochs or rounds, in unit), which a resumed checkpoint must not be past. */
static inline void ex_ckpt_run(ex_ckpt *k, long total, const char *unit) { k->total = total; k->unit = unit; }

/* Before the run: a flag whose value shapes the steps a checkpoint counts (--batch, --limit as the training samples,
   --period, --clients, --topology): saved with every checkpoint, and a resume with another value is refused,
   naming both (name: NULL, or the value in words). At most EX_CKPT_KEEP of them. */
static inline void ex_ckpt_keep(ex_ckpt *k, const char *flag, long value, const char *(*name)(long)) {
    if (k->nkeep == EX_CKPT_KEEP) return;
    k->keep[k->nkeep].flag = flag; k->keep[k->nkeep].value = value; k->keep[k->nkeep].name = name;
    k->nkeep++;
}

/* Before the run, once the data is loaded (an example's prepare): the run's length, and --batch and --limit (the
   training samples) as flags a resume must share; then ex_batch_check (note: its message's end). Returns its status. */
static inline int ex_ckpt_prepare(ex_ckpt *k, const ex_data *d, long batch, long total, const char *unit, const char *note) {
    ex_ckpt_run(k, total, unit);
    k->samples = d->ntrain; k->batch = batch > 0 ? batch : 1;
    ex_ckpt_keep(k, "--batch", batch, NULL);
    ex_ckpt_keep(k, "--limit", (long)d->ntrain, NULL);
    return ex_batch_check(batch, d->train.count, d->dataset, note);
}

/* After a load: the checkpoint's recorded flags (value + 1; 0 where none was recorded) against this run's, and its
   epoch (round) against the run's length. DT_OK, or DT_ERR_INVALID_ARG naming the flag and both values. */
static inline dt_result ex_ckpt_agrees(const ex_ckpt *k, const dt_checkpoint_meta *meta) {
    int i;
    for (i = 0; i < k->nkeep; i++) {
        double saved = meta->values[5 + i] - 1.0;
        char was[64], now[64];
        if (meta->values[5 + i] == 0.0 || saved == (double)k->keep[i].value) continue;
        if (k->keep[i].name && saved >= 0.0 && saved < 1e9) snprintf(was, sizeof was, "%s", k->keep[i].name((long)saved));
        else snprintf(was, sizeof was, "%.0f", saved);
        if (k->keep[i].name) snprintf(now, sizeof now, "%s", k->keep[i].name(k->keep[i].value));
        else snprintf(now, sizeof now, "%ld", k->keep[i].value);
        return dt_set_error(DT_ERR_INVALID_ARG, "%s was saved by a run with %s %s; this run has %s %s: resume with the flags "
                            "that wrote it", k->path, k->keep[i].flag, was, k->keep[i].flag, now);
    }
    if (k->unit && meta->epoch > k->total)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s was saved after %s %lld, past this run's %ld %ss: give --%ss %lld or more to "
                            "continue it", k->path, k->unit, (long long)meta->epoch, k->total, k->unit, k->unit,
                            (long long)meta->epoch);
    /* every example's steps an epoch are at most samples / batch + 1 (ddp's too, its batch being global), and its
       batches of an epoch (ddp's micro-batches) at most its samples */
    if (k->samples && (meta->step > (meta->epoch + 1) * (k->samples / k->batch + 2) || meta->batch > k->samples))
        return dt_set_error(DT_ERR_FORMAT, "%s holds step %lld and batch %lld after %s %lld: more than a run of %lld samples in "
                            "batches of %ld can have reached; the file is damaged or not this run's", k->path, (long long)meta->step,
                            (long long)meta->batch, k->unit, (long long)meta->epoch, (long long)k->samples, k->batch);
    return DT_OK;
}

/* Prints the checkpoint flags for a usage text, after `indent` spaces. */
static inline void ex_ckpt_usage(FILE *f, int indent) {
    fprintf(f, "%*s[--checkpoint PATH] [--checkpoint-every N] [--resume]\n", indent, "");
}

/* One of the checkpoint flags: returns the words of argv it takes (1 for --resume, 2 with a value), 0 when f is
   not one of them. *bad is nonzero when its value v is wrong (it says why). */
static inline int ex_ckpt_flag(const char *f, const char *v, ex_ckpt *k, int *bad) {
    if (!strcmp(f, "--resume")) {
        if (v && strncmp(v, "--", 2)) {   /* the spelling "--resume PATH" */
            fprintf(stderr, "%s: --resume takes no value: it continues from the --checkpoint file (--checkpoint %s --resume)\n",
                    EX_PROG, v);
            *bad = 1;
        }
        k->resume = 1;
        return 1;
    }
    if (strcmp(f, "--checkpoint") && strcmp(f, "--checkpoint-every")) return 0;
    if (!v) { fprintf(stderr, "%s: %s needs a value\n", EX_PROG, f); *bad = 1; return 2; }
    if (!strcmp(f, "--checkpoint") && !*v) { fprintf(stderr, "%s: --checkpoint needs a file name, got ''\n", EX_PROG); *bad = 1; }
    else if (!strcmp(f, "--checkpoint")) k->path = v;
    else *bad = parse_long(f, v, 1, &k->every);
    return 2;
}

/* The checks of the checkpoint flags as a whole, before any data is loaded: the flags agree, a fresh run does
   not write over an existing checkpoint, and PATH.tmp (what every save writes first) can be created, so that an
   unwritable directory is found now and not after the first epoch. Returns 0, or -1 after saying why. */
static inline int ex_ckpt_check(const ex_ckpt *k) {
    char tmp[4096];
    FILE *f;
    int err;
    if (!k->path) {
        if (k->every || k->resume) {
            fprintf(stderr, "%s: %s needs --checkpoint PATH (%s)\n", EX_PROG, k->every ? "--checkpoint-every" : "--resume",
                    k->every ? "the file to save to" : "the file to continue from");
            return -1;
        }
        return 0;
    }
    if (!k->resume && (f = fopen(k->path, "rb")) != NULL) {
        fclose(f);
        fprintf(stderr, "%s: --checkpoint %s exists: a fresh run would write over it; continue that run with --resume, "
                        "or remove the file\n", EX_PROG, k->path);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", k->path);   /* a crashed save's leftover there is kept: the next save replaces it */
    if ((err = ex_can_create(tmp)) == 0) return 0;
    fprintf(stderr, "%s: --checkpoint %s: cannot create %s (%s): give a path in an existing, writable directory\n", EX_PROG,
            k->path, tmp, strerror(err));
    return -1;
}

/* Whether a checkpoint is due: after step `step` (1-based) inside an epoch (end 0), or at the end of an epoch
   or round (end 1; last: the run's last), where it is due without --checkpoint-every, and at the end of the run. */
static inline int ex_ckpt_due(const ex_ckpt *k, int64_t step, int end, int last) {
    if (!k->path) return 0;
    if (end) return !k->every || last;
    return k->every && step % k->every == 0;
}

/* The meta of a run at the start of epoch (round) `epoch`: the running sums of the epoch before are cleared. */
static inline void ex_ckpt_next_epoch(dt_checkpoint_meta *meta, int64_t epoch) {
    meta->epoch = epoch;
    meta->batch = 0;
    memset(meta->values, 0, sizeof meta->values);
}

/* Says on stdout where a resumed run continues (unit: "epoch" or "round"). */
static inline void ex_ckpt_resumed(const ex_ckpt *k, const dt_checkpoint_meta *meta, const char *unit) {
    if (meta->batch) printf("resumed from %s in %s %lld after its batch %lld (step %lld)\n", k->path, unit, (long long)meta->epoch + 1,
                            (long long)meta->batch, (long long)meta->step);
    else printf("resumed from %s after %s %lld (step %lld)\n", k->path, unit, (long long)meta->epoch, (long long)meta->step);
    fflush(stdout);
}

/* Which trainer's save and load a checkpoint goes through (t is its object; NULL for EX_SINGLE). */
typedef enum ex_trainer { EX_SINGLE, EX_DDP, EX_LOCALSGD, EX_DPSGD, EX_FED } ex_trainer;

/* Saves the run's state to k->path through trainer t (collective on c, which is NULL in one process). A model
   that diverged (NaN or infinite values on any rank) is refused by the library on every rank, and the last
   good checkpoint stays. *sent (may be NULL) grows by the bytes this rank sent for it, which the examples
   leave out of the traffic they report. */
static inline dt_result ex_ckpt_save(const ex_ckpt *k, dt_comm *c, ex_trainer kind, void *t, dt_model *m, dt_optim *o,
                                     const dt_checkpoint_meta *run, uint64_t *sent) {
    uint64_t s0 = c ? dt_comm_get_stats(c).bytes_sent : 0;
    dt_checkpoint_meta with = *run, *meta = &with;   /* with the flags ex_ckpt_keep named */
    dt_result r;
    int i;
    for (i = 0; i < k->nkeep; i++) with.values[5 + i] = (double)k->keep[i].value + 1.0;
    switch (kind) {
    case EX_SINGLE:   r = dt_checkpoint_save(k->path, m, o, meta); break;
    case EX_DDP:      r = dt_ddp_save((dt_ddp *)t, k->path, o, meta); break;
    case EX_LOCALSGD: r = dt_localsgd_save((dt_localsgd *)t, k->path, o, meta); break;
    case EX_DPSGD:    r = dt_dpsgd_save((dt_dpsgd *)t, k->path, o, meta); break;
    default:          r = dt_fed_save((dt_fed *)t, k->path, meta); break;
    }
    if (c && sent) *sent += dt_comm_get_stats(c).bytes_sent - s0;
    return r;
}

/* Loads k->path into the run through trainer t (collective on c; NULL in one process): a missing, damaged or
   mismatched file is refused with the library's message, and one saved with other flags (ex_ckpt_keep) or past the
   run's length (ex_ckpt_run) with ex_ckpt_agrees's; every rank refuses it alike. *sent grows as ex_ckpt_save's does. */
static inline dt_result ex_ckpt_load(const ex_ckpt *k, dt_comm *c, ex_trainer kind, void *t, dt_model *m, dt_optim *o,
                                     dt_checkpoint_meta *meta, uint64_t *sent) {
    uint64_t s0 = c ? dt_comm_get_stats(c).bytes_sent : 0;
    dt_result r;
    meta->sum_values = 0x3u;   /* values 0, 1: each rank's loss sum and samples; the rest (bytes, time, flags) rank 0's */
    switch (kind) {
    case EX_SINGLE:   r = dt_checkpoint_load(k->path, m, o, meta); break;
    case EX_DDP:      r = dt_ddp_load((dt_ddp *)t, k->path, o, meta); break;
    case EX_LOCALSGD: r = dt_localsgd_load((dt_localsgd *)t, k->path, o, meta); break;
    case EX_DPSGD:    r = dt_dpsgd_load((dt_dpsgd *)t, k->path, o, meta); break;
    default:          r = dt_fed_load((dt_fed *)t, k->path, meta); break;
    }
    if (c && sent) *sent += dt_comm_get_stats(c).bytes_sent - s0;
    return r == DT_OK ? ex_ckpt_agrees(k, meta) : r;
}

/* A resumed run's CSV: keeps the header and the rows of the first `done` epochs (rounds), the ones the checkpoint
   covers, and drops any row written after it, so that the rows the run appends are not there twice. A missing
   file is left missing (ex_report_open then writes the header). */
static inline dt_result ex_csv_keep(const char *path, int64_t done) {
    FILE *f;
    char *buf, *line, *next;
    long size;
    size_t kept = 0, got;
    if (!path || !(f = fopen(path, "rb"))) return DT_OK;
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    rewind(f);
    if (size < 0 || !(buf = (char *)malloc((size_t)size + 1))) { fclose(f); return dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory to read %s", path); }
    got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    buf[got] = '\0';
    for (line = buf; *line; line = next) {   /* the header, then rows whose first field is an epoch <= done */
        next = strchr(line, '\n');
        next = next ? next + 1 : line + strlen(line);
        if (line == buf || strtoll(line, NULL, 10) <= done) {
            memmove(buf + kept, line, (size_t)(next - line));
            kept += (size_t)(next - line);
        }
    }
    errno = 0;
    if (!(f = fopen(path, "wb")) || fwrite(buf, 1, kept, f) != kept || fflush(f) != 0) {
        int err = errno;
        if (f) fclose(f);
        free(buf);
        return dt_set_error(DT_ERR_IO, "cannot rewrite %s: %s", path, err ? strerror(err) : "a write failed");
    }
    free(buf);
    return fclose(f) == 0 ? DT_OK : dt_set_error(DT_ERR_IO, "cannot rewrite %s: %s", path, strerror(errno));
}

/* What ex_main needs of an example: its usage text, its own flags, an optional step after the data is loaded,
   and the work of one rank. */
typedef struct ex_example {
    void      (*usage)(FILE *f);
    int       (*parse)(int argc, char **argv, void *args);   /* the example's flags: 0, or -1 after saying why */
    int       (*prepare)(void *args);                        /* NULL, or after loading: 0, or the exit status */
    dt_result (*rank_main)(dt_comm *c, void *args);          /* one rank's work, run by dt_launch */
} ex_example;

/* A training step's failure with where it happened in front of its cause ("epoch 2, step 17: ... the loss
   is nan"), so that a diverged run says when; epoch and step count from 1. DT_OK passes through. */
static inline dt_result ex_at(dt_result r, long long epoch, long long step) {
    if (r != DT_OK) {
        const char *m = dt_last_error(), *c = strchr(m, ':');
        dt_set_error(r, "epoch %lld, step %lld: %s", epoch, step, c && strncmp(m, "DT_", 3) == 0 ? c + 2 : m);
    }
    return r;
}

/* Takes every "flag RATE" out of argv (argc updated), before dt_launch_parse, which knows only bytes per second:
   the last one's bytes per second go to *out (left as it is without one). Returns 0, or -1 after saying why. */
static inline int ex_take_rate(int *argc, char **argv, const char *flag, double *out) {
    int i, o = 1;
    for (i = 1; i < *argc; i++) {
        if (strcmp(argv[i], flag)) { argv[o++] = argv[i]; continue; }
        if (ex_parse_rate(flag, i + 1 < *argc ? argv[i + 1] : NULL, out)) return -1;
        i++;
    }
    *argc = o;
    argv[o] = NULL;
    return 0;
}

/* Says on stdout, once (by the first process under mpiexec), what the link model makes of every message, in the
   units of the charts, so that a run's log names the network it emulated. */
static inline void ex_link_say(const dt_comm_desc *d) {
    const char *mpi_rank = getenv("PMI_RANK"), *env = getenv("DT_NODE_SIZE");
    int node = d->node_size > 0 ? d->node_size : env ? atoi(env) : 0;   /* with nodes the port is the node's */
    char rate[64], who[64];
    if (!(d->link_latency > 0.0 || d->link_bandwidth > 0.0) || (mpi_rank && strcmp(mpi_rank, "0"))) return;
    if (node > 1) snprintf(who, sizeof who, "every node of %d ranks", node);
    else snprintf(who, sizeof who, "every rank");
    printf("link model (local ranks): %s one full-duplex port of %s, every message %g ms of latency\n", who,
           d->link_bandwidth > 0.0 ? ex_rate_str(d->link_bandwidth, rate, sizeof rate) : "unlimited bandwidth", d->link_latency * 1e3);
    fflush(stdout);
}

/* The main() of an example that runs on ranks: takes the launcher's flags out of argv (--ranks N, default 4,
   --timeout, --link-latency, --link-bandwidth with units (ex_parse_rate), ...), then ex->parse reads the rest into args; data (NULL: the example reads
   none) is loaded, ex->prepare runs, and dt_launch runs ex->rank_main(c, args) on every rank. Returns the exit
   status: 2 for a bad flag, 1 when the data cannot be loaded or a rank failed (dt_launch has logged it), 0. */
static inline int ex_main(int argc, char **argv, const ex_example *ex, void *args, ex_data *data) {
    dt_launch_desc ld;
    double bw = 0.0;
    int rc;
    memset(&ld, 0, sizeof ld);
    ld.ranks = 4;
    if (ex_take_rate(&argc, argv, "--link-bandwidth", &bw)) { ex->usage(stderr); return 2; }
    if (dt_launch_parse(&argc, argv, &ld) != DT_OK) {
        fprintf(stderr, "%s: %s\n", EX_PROG, dt_last_error());
        ex->usage(stderr);
        return 2;
    }
    if (bw > 0.0) ld.comm.link_bandwidth = bw;
    if (ex->parse(argc, argv, args)) return 2;
    if (data && (rc = ex_load(data)) != 0) return rc;
    rc = ex->prepare ? ex->prepare(args) : 0;
    if (rc == 0) ex_link_say(&ld.comm);
    if (rc == 0) rc = dt_launch(&ld, ex->rank_main, args) == DT_OK ? 0 : 1;   /* 1 when a rank failed */
    if (data && rc == 0) ex_free(data);   /* after a failure a stalled rank's thread may still read it: exit now */
    return rc;
}

#endif
