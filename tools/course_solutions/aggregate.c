/* tools/course_solutions/aggregate.c - the reference solution of assignment 3
   (docs/course/assignments/aggregate.md), for instructors: not part of what students are given.
   make assignment-test A=aggregate SOLUTIONS=1 runs the harness on it. */
#include <math.h>
#include <stdlib.h>
#include "assignments.h"

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

dt_result student_trimmed_mean(const float *const *updates, int n, int64_t len, float trim, float *out) {
    int t = (int)floor((double)trim * (double)n), i;
    int64_t j;
    double *col;
    if (!(trim >= 0.0f && trim < 0.5f) || 2 * t >= n)
        return dt_set_error(DT_ERR_INVALID_ARG, "student_trimmed_mean: trim %g of %d clients cuts %d at each end: need "
                            "0 <= trim < 0.5 and 2 t < n", (double)trim, n, t);
    if (!(col = (double *)malloc(sizeof(double) * (size_t)n)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "student_trimmed_mean: no memory for %d clients", n);
    for (j = 0; j < len; j++) {
        double s = 0.0;
        for (i = 0; i < n; i++) col[i] = updates[i][j];
        qsort(col, (size_t)n, sizeof *col, by_value);
        for (i = t; i < n - t; i++) s += col[i];   /* ascending */
        out[j] = (float)(s / (double)(n - 2 * t));
    }
    free(col);
    return DT_OK;
}

dt_result student_krum(const float *const *updates, int n, int64_t len, int f, float *out, int *chosen) {
    int i, k, m, best = 0, nearest = n - f - 2;
    int64_t j;
    double *dist, *row, *score;
    if (f < 0 || n < 2 * f + 3)
        return dt_set_error(DT_ERR_INVALID_ARG, "student_krum: f = %d with %d clients: need f >= 0 and n >= 2 f + 3", f, n);
    dist = (double *)malloc(sizeof(double) * (size_t)(n * n + 2 * n));
    if (!dist) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "student_krum: no memory for %d clients", n);
    row = dist + n * n;
    score = row + n;
    for (i = 0; i < n; i++)   /* squared distances, summed over the coordinates in order, in double */
        for (k = i; k < n; k++) {
            double s = 0.0;
            for (j = 0; j < len && k != i; j++) { double d = (double)updates[i][j] - (double)updates[k][j]; s += d * d; }
            dist[i * n + k] = dist[k * n + i] = s;
        }
    for (i = 0; i < n; i++) {   /* the sum of the nearest n - f - 2, smallest first */
        double s = 0.0;
        for (k = 0, m = 0; k < n; k++) if (k != i) row[m++] = dist[i * n + k];
        qsort(row, (size_t)m, sizeof *row, by_value);
        for (k = 0; k < nearest; k++) s += row[k];
        score[i] = s;
        if (score[i] < score[best]) best = i;   /* strictly lower: ties keep the lower index */
    }
    for (j = 0; j < len; j++) out[j] = updates[best][j];
    *chosen = best;
    free(dist);
    return DT_OK;
}
