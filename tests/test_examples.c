/* The flags the examples share (examples/common.h) that a unit test can hold to their meaning: a rate
   (--link-bandwidth) read as bytes per second with or without a unit, garbage refused, and printed in the
   charts' Gbit/s and Mbit/s; the datasets without a default directory refused before any file is read.
   Their output files: a path that cannot be written refused before the run, a write that fails (/dev/full)
   an error at once, naming the file and the cause. Their checkpoints: an empty --checkpoint refused, a resume
   with other flags (--batch, --limit, ...) or past the run's length refused naming both values; a --batch no
   data set can fill refused. */
#define _POSIX_C_SOURCE 200809L   /* mkdtemp, rmdir */
#include "../dtrain.h"
#include "dt_test.h"
#define EX_PROG "test_examples"
#include "../examples/common.h"
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];
static const char *tpath(const char *name) {   /* dir/name, in one of a few rotating buffers */
    static char buf[4][128];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}
static int exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static void test_rate_units(void) {
    static const struct { const char *v; double bytes; } ok[] = {
        {"125000000", 125e6}, {"1.25e8", 125e6}, {"100M", 100e6}, {"100m", 100e6}, {"2K", 2e3}, {"1G", 1e9},
        {"125MB", 125e6}, {"125MB/s", 125e6}, {"5kB", 5e3}, {"1GB", 1e9},
        {"100Mbit", 12.5e6}, {"100Mbit/s", 12.5e6}, {"1Gbit", 125e6}, {"10Gbit", 1.25e9}, {"64kbit", 8e3}, {"0.5Gbit", 62.5e6}};
    int i;
    for (i = 0; i < EX_COUNT(ok); i++) {
        double x = -1.0;
        CHECK(ex_parse_rate("--link-bandwidth", ok[i].v, &x) == 0);
        CHECK(fabs(x - ok[i].bytes) <= 1e-9 * ok[i].bytes);
        if (fabs(x - ok[i].bytes) > 1e-9 * ok[i].bytes) printf("    '%s' read as %g bytes/s, not %g\n", ok[i].v, x, ok[i].bytes);
    }
}

static void test_rate_garbage(void) {
    /* "Mb" and "mbit" are not units here: megabit or megabyte would be a guess */
    static const char *const bad[] = {"", "x", "0", "-1", "1e400", "nan", "inf", "100Mb", "100 Mbit", "100Mbits", "1T",
                                      "100Mbit/", "100/s/s", "Gbit", "1Gbit/sec", "12,5MB"};
    int i;
    for (i = 0; i < EX_COUNT(bad); i++) {
        double x = 7.0;
        CHECK(ex_parse_rate("--link-bandwidth", bad[i], &x) == -1);
        CHECK(x == 7.0);   /* untouched */
    }
    CHECK(ex_parse_rate("--link-bandwidth", NULL, NULL) == -1);
}

static void test_rate_words(void) {
    char buf[64];
    CHECK(!strcmp(ex_rate_str(12.5e6, buf, sizeof buf), "100 Mbit/s"));
    CHECK(!strcmp(ex_rate_str(125e6, buf, sizeof buf), "1 Gbit/s"));
    CHECK(!strcmp(ex_rate_str(1.25e9, buf, sizeof buf), "10 Gbit/s"));
    CHECK(!strcmp(ex_rate_str(100e6, buf, sizeof buf), "800 Mbit/s"));
    CHECK(!strcmp(ex_rate_str(1e3, buf, sizeof buf), "8 kbit/s"));
}

/* argv with every --link-bandwidth taken out, the last one's value kept, the other flags in their order */
static void test_take_rate(void) {
    char a0[] = "prog", a1[] = "--ranks", a2[] = "8", a3[] = "--link-bandwidth", a4[] = "1Gbit", a5[] = "--link-bandwidth",
         a6[] = "100Mbit", a7[] = "--epochs", a8[] = "1", b3[] = "--link-bandwidth", b4[] = "fast";
    char *argv[10] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, NULL}, *bad[5] = {a0, b3, b4, NULL, NULL};
    int argc = 9, n = 3;
    double x = 0.0;
    CHECK(ex_take_rate(&argc, argv, "--link-bandwidth", &x) == 0);
    CHECK(argc == 5 && x == 12.5e6);
    CHECK(argc == 5 && !strcmp(argv[1], "--ranks") && !strcmp(argv[2], "8") && !strcmp(argv[3], "--epochs") && argv[5] == NULL);
    CHECK(ex_take_rate(&n, bad, "--link-bandwidth", &x) == -1);
    n = 2;   /* the flag without its value */
    CHECK(ex_take_rate(&n, bad, "--link-bandwidth", &x) == -1);
}

static void test_dataset_dirs(void) {
    CHECK(ex_data_check("fashion-mnist", NULL) == 0);   /* Debian's directory is its default */
    CHECK(ex_data_check("mnist", NULL) == -1);          /* not Fashion-MNIST's files under MNIST's name */
    CHECK(ex_data_check("cifar10", NULL) == -1);
    CHECK(ex_data_check("mnist", "some/dir") == 0);
    CHECK(ex_data_check("cifar10", "cifar-10-batches-bin") == 0);
}

/* --csv (any output path): an empty one, one in a missing directory and a directory are refused; a writable one is
   accepted and not left behind; an existing file is kept as it was */
static void test_out_check(void) {
    FILE *f;
    CHECK(ex_out_check("--csv", "") == -1);
    CHECK(ex_out_check("--csv", tpath("none/x.csv")) == -1);
    CHECK(ex_out_check("--csv", dir) == -1);
    CHECK(ex_out_check("--csv", tpath("new.csv")) == 0);
    CHECK(!exists(tpath("new.csv")));
    if ((f = fopen(tpath("old.csv"), "wb")) != NULL) { fputs("epoch\n1\n", f); fclose(f); }
    CHECK(ex_out_check("--csv", tpath("old.csv")) == 0);
    if ((f = fopen(tpath("old.csv"), "rb")) != NULL) {
        char b[16] = "";
        size_t n = fread(b, 1, sizeof b - 1, f);
        fclose(f);
        CHECK(n == 8 && !strcmp(b, "epoch\n1\n"));
    } else CHECK(!"old.csv is gone");
    remove(tpath("old.csv"));
}

/* A CSV on a full disk (/dev/full): the header's write fails in ex_report_open and ex_csv_open, a row's in ex_report
   and ex_csv_row, each with DT_ERR_IO naming the file and the cause, at that write (not at the file's close) */
static void test_csv_full(void) {
    static const ex_col cols[2] = {EX_COL_TRAIN_LOSS, EX_COL_TEST_LOSS};
    const double v[2] = {1.5, 2.5};
    FILE *csv = NULL;
    if (!exists("/dev/full")) { printf("    skipped: no /dev/full\n"); return; }
    CHECK_ERR(ex_report_open(&csv, "/dev/full", cols, 2, 0), DT_ERR_IO);
    CHECK(strstr(dt_last_error(), "/dev/full") && strstr(dt_last_error(), strerror(ENOSPC)));
    if (csv) fclose(csv);
    csv = NULL;
    CHECK_ERR(ex_csv_open(&csv, "/dev/full", "round,loss\n", 0), DT_ERR_IO);
    CHECK(strstr(dt_last_error(), "/dev/full") && strstr(dt_last_error(), strerror(ENOSPC)));
    if (csv) fclose(csv);
    if (!(csv = fopen("/dev/full", "w"))) { CHECK(!"cannot open /dev/full"); return; }
    CHECK_ERR(ex_report(csv, "/dev/full", 1, 2, cols, v, 2), DT_ERR_IO);
    CHECK(strstr(dt_last_error(), "cannot write /dev/full") && strstr(dt_last_error(), strerror(ENOSPC)));
    clearerr(csv);
    CHECK_ERR(ex_csv_row(csv, "/dev/full", "%d,%g\n", 1, 0.5), DT_ERR_IO);
    CHECK(strstr(dt_last_error(), "cannot write /dev/full") && strstr(dt_last_error(), strerror(ENOSPC)));
    fclose(csv);
    /* and a file that takes the rows: each one is there after its call, the header once */
    CHECK_OK(ex_report_open(&csv, tpath("ok.csv"), cols, 2, 0));
    CHECK_OK(ex_report(csv, tpath("ok.csv"), 1, 2, cols, v, 2));
    if (csv) fclose(csv);
    csv = NULL;
    CHECK_OK(ex_report_open(&csv, tpath("ok.csv"), cols, 2, 1));
    CHECK_OK(ex_report(csv, tpath("ok.csv"), 2, 2, cols, v, 2));
    if (csv) fclose(csv);
    if ((csv = fopen(tpath("ok.csv"), "rb")) != NULL) {
        char b[128] = "";
        size_t n = fread(b, 1, sizeof b - 1, csv);
        fclose(csv);
        CHECK(n > 0 && !strcmp(b, "epoch,train_loss,test_loss\n1,1.500000,2.500000\n2,1.500000,2.500000\n"));
    } else CHECK(!"ok.csv is missing");
    remove(tpath("ok.csv"));
}

/* --checkpoint '': refused at parse time (before, ".tmp" was created and the run failed at its first save) */
static void test_ckpt_empty_path(void) {
    ex_ckpt k;
    int bad = 0;
    memset(&k, 0, sizeof k);
    CHECK(ex_ckpt_flag("--checkpoint", "", &k, &bad) == 2 && bad && k.path == NULL);
    bad = 0;
    CHECK(ex_ckpt_flag("--checkpoint", tpath("x.ckpt"), &k, &bad) == 2 && !bad && k.path != NULL);
}

/* --batch 1e14 (parsed as 100000000000000): more than the data set's samples, refused; the whole set is a batch */
static void test_batch_bound(void) {
    CHECK(ex_batch_check(100000000000000L, 60000, "fashion-mnist", "") == 2);
    CHECK(ex_batch_check(60001, 60000, "fashion-mnist", "") == 2);
    CHECK(ex_batch_check(60000, 60000, "fashion-mnist", "") == 0);
    CHECK(ex_batch_check(128, 60000, "fashion-mnist", "") == 0);
}

/* A checkpoint records the flags ex_ckpt_keep names: resumed with the same ones it loads; with another --batch, --limit
   or --topology (in words) it is refused naming the flag and both values; one saved after epoch 5 is refused by a
   run of 3 epochs, naming --epochs; the model is not what the refusal is about */
static const char *shape_name(long k) { return k == 0 ? "ring" : k == 1 ? "torus" : "other"; }
static void test_ckpt_flags(void) {
    dt_model *m = NULL;
    dt_model_desc md;
    dt_checkpoint_meta meta, got;
    ex_ckpt save, load;
    memset(&md, 0, sizeof md);
    md.in_c = 1; md.in_h = 2; md.in_w = 2; md.seed = 1;
    CHECK_OK(dt_model_create(&m, &md));
    dt_linear(m, dt_flatten(m, 0), 3, 1);
    CHECK_OK(dt_model_finalize(m));
    memset(&save, 0, sizeof save);
    save.path = tpath("k.ckpt");
    ex_ckpt_run(&save, 10, "epoch");
    ex_ckpt_keep(&save, "--batch", 20, NULL);
    ex_ckpt_keep(&save, "--limit", 512, NULL);
    ex_ckpt_keep(&save, "--topology", 0, shape_name);
    memset(&meta, 0, sizeof meta);
    meta.epoch = 5; meta.step = 40; meta.values[0] = 3.0;
    CHECK_OK(ex_ckpt_save(&save, NULL, EX_SINGLE, NULL, m, NULL, &meta, NULL));
    CHECK(meta.values[5] == 0.0);   /* the caller's meta is left as it was */
    load = save;
    memset(&got, 0, sizeof got);
    CHECK_OK(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL));
    CHECK(got.epoch == 5 && got.step == 40 && got.values[0] == 3.0);
    load.keep[0].value = 32;
    CHECK_ERR(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "with --batch 20; this run has --batch 32") != NULL);
    load = save;
    load.keep[1].value = 1024;
    CHECK_ERR(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "with --limit 512; this run has --limit 1024") != NULL);
    load = save;
    load.keep[2].value = 1;
    CHECK_ERR(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "with --topology ring; this run has --topology torus") != NULL);
    load = save;
    ex_ckpt_run(&load, 3, "epoch");
    CHECK_ERR(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "after epoch 5, past this run's 3 epochs: give --epochs 5 or more") != NULL);
    ex_ckpt_run(&load, 5, "epoch");   /* a finished run resumed: nothing left to do, not an error */
    CHECK_OK(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL));
    /* with the run's samples and batch (ex_ckpt_prepare): 40 steps after 5 epochs of 512 samples in batches of 20
       fit (at most 27 an epoch); 400 do not, nor a batch of the epoch past its samples */
    load.samples = 512; load.batch = 20;
    CHECK_OK(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL));
    meta.step = 400;
    CHECK_OK(ex_ckpt_save(&save, NULL, EX_SINGLE, NULL, m, NULL, &meta, NULL));
    CHECK_ERR(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL), DT_ERR_FORMAT);
    CHECK(strstr(dt_last_error(), "step 400 and batch 0 after epoch 5: more than a run of 512 samples in batches of 20") != NULL);
    meta.step = 40; meta.batch = 513;
    CHECK_OK(ex_ckpt_save(&save, NULL, EX_SINGLE, NULL, m, NULL, &meta, NULL));
    CHECK_ERR(ex_ckpt_load(&load, NULL, EX_SINGLE, NULL, m, NULL, &got, NULL), DT_ERR_FORMAT);
    remove(save.path);
    dt_model_destroy(m);
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_examples\n");
    RUN(test_rate_units);
    RUN(test_rate_garbage);
    RUN(test_rate_words);
    RUN(test_take_rate);
    RUN(test_dataset_dirs);
    strcpy(dir, "/tmp/dt_test_examples_XXXXXX");
    if (!mkdtemp(dir)) { printf("cannot create a temporary directory under /tmp\n"); return 1; }
    RUN(test_out_check);
    RUN(test_csv_full);
    RUN(test_ckpt_empty_path);
    RUN(test_batch_bound);
    RUN(test_ckpt_flags);
    rmdir(dir);
    return dt_t_summary();
}
