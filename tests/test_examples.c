/* The flags the examples share (examples/common.h) that a unit test can hold to their meaning: a rate
   (--link-bandwidth) read as bytes per second with or without a unit, garbage refused, and printed in the
   charts' Gbit/s and Mbit/s; the datasets without a default directory refused before any file is read. */
#define DTRAIN_IMPLEMENTATION   /* here, not linked (Makefile): examples/common.h uses DT_MALLOC, DT_FREE */
#include "../dtrain.h"
#include "dt_test.h"
#define EX_PROG "test_examples"
#include "../examples/common.h"

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

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_examples\n");
    RUN(test_rate_units);
    RUN(test_rate_garbage);
    RUN(test_rate_words);
    RUN(test_take_rate);
    RUN(test_dataset_dirs);
    return dt_t_summary();
}
