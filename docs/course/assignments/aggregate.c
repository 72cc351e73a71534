/* aggregate.c - assignment 3: FedAvg's robust aggregators, the trimmed mean and Krum (aggregate.md).
   Write student_trimmed_mean and student_krum below; test them with
       make assignment-test A=aggregate
   which compares them, bit for bit, with dt_fed_aggregate (DT_FED_TRIMMED, DT_FED_KRUM) on random client
   updates, ties and outliers, and checks that they refuse what the library refuses. */
#include <stdlib.h>
#include "assignments.h"

dt_result student_trimmed_mean(const float *const *updates, int n, int64_t len, float trim, float *out) {
    /* TODO: t = floor(trim * n) (computed as the sheet says); refuse a trim outside [0, 0.5) or 2 t >= n with
       dt_set_error(DT_ERR_INVALID_ARG, ...); then for each coordinate, sort the n values and average the middle
       n - 2 t in double, in ascending order. */
    (void)updates;
    (void)n;
    (void)len;
    (void)trim;
    (void)out;
    return DT_OK;
}

dt_result student_krum(const float *const *updates, int n, int64_t len, int f, float *out, int *chosen) {
    /* TODO: refuse f < 0 or n < 2 f + 3; squared distances between every pair of updates (in double);
       score(i) = the sum of the n - f - 2 smallest distances from i to the others; choose the lowest score
       (the lower index on ties) and copy that update into out. */
    (void)updates;
    (void)n;
    (void)len;
    (void)f;
    (void)out;
    (void)chosen;
    return DT_OK;
}
