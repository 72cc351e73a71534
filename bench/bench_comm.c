/* bench_comm - all-reduce time and algorithmic bandwidth of every dtrain algorithm on this backend.
   Sizes 1 KiB .. 64 MiB of float32, SUM, in place. Per size: 5 warm-up calls, then 7 windows of
   repetitions sized for ~0.2 s each (one barrier before each window); a window's time is the slowest
   rank's; the median window is reported, as in the peers' mpi_allreduce.c and gloo_allreduce.py.
   Output: one CSV line per (algorithm, size): backend,ranks,algo,bytes,reps,time_us,algbw_GBps,correct.
   Built with -DDT_USE_MPI and started by mpiexec it measures the MPI backend and MPICH's own
   MPI_Allreduce (algo "mpich", separate send/receive buffers like the peer program).
     ./bench_comm --ranks 2 [--algos naive,ring,tree,native] [--max-bytes N] [--window S] */
#include "../dtrain.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts { char algos[128]; size_t max_bytes; double window; } opts;
static const size_t sizes[] = {1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};

static int cmp_double(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

/* One all-reduce of the kind being measured. */
static dt_result one(dt_comm *c, const char *algo, float *buf, float *recv, size_t n) {
#ifdef DT_USE_MPI
    if (strcmp(algo, "mpich") == 0)
        return MPI_Allreduce(buf, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS ? DT_OK : DT_ERR_COMM;
#endif
    dt_algo a = DT_ALGO_AUTO;
    (void)recv;
    if (dt_algo_parse(algo, &a) != DT_OK) return DT_ERR_INVALID_ARG;
    return dt_comm_allreduce(c, buf, n, DT_F32, DT_SUM, a);
}

static dt_result measure(dt_comm *c, const opts *o, const char *algo) {
    int p = dt_comm_size(c), si, w, i;
    for (si = 0; si < 5 && sizes[si] <= o->max_bytes; si++) {
        size_t bytes = sizes[si], n = bytes / 4, k;
        float *buf = (float *)malloc(bytes), *recv = (float *)malloc(bytes);
        double tw[7], est, t0;
        int reps, correct = 1;
        dt_result r = DT_OK;
        if (!buf || !recv) { free(buf); free(recv); return dt_set_error(DT_ERR_OUT_OF_MEMORY, "bench_comm: no memory for %zu bytes", bytes); }
        /* correctness first: ranks hold rank + 1, the sum is p (p + 1) / 2 */
        for (k = 0; k < n; k++) buf[k] = (float)(dt_comm_rank(c) + 1);
        if ((r = one(c, algo, buf, recv, n)) != DT_OK) goto out;
        {
            const float *res = strcmp(algo, "mpich") == 0 ? recv : buf;
            for (k = 0; k < n; k++) if (res[k] != (float)(p * (p + 1) / 2)) { correct = 0; break; }
        }
        for (i = 0; i < 4 && r == DT_OK; i++) r = one(c, algo, buf, recv, n);
        if (r == DT_OK) r = dt_comm_barrier(c);
        t0 = dt_time_now();
        for (i = 0; i < 3 && r == DT_OK; i++) r = one(c, algo, buf, recv, n);
        est = (dt_time_now() - t0) / 3;
        if (r == DT_OK) r = dt_comm_broadcast(c, &est, 1, DT_F64, 0, DT_ALGO_AUTO);
        if (r != DT_OK) goto out;
        reps = (int)(o->window / (est > 1e-9 ? est : 1e-9));
        if (reps < 2) reps = 2;
        if (reps > 20000) reps = 20000;
        for (w = 0; w < 7 && r == DT_OK; w++) {
            double t;
            if ((r = dt_comm_barrier(c)) != DT_OK) break;
            t = dt_time_now();
            for (i = 0; i < reps && r == DT_OK; i++) r = one(c, algo, buf, recv, n);
            t = (dt_time_now() - t) / reps;
            if (r == DT_OK) r = dt_comm_allreduce(c, &t, 1, DT_F64, DT_MAX, DT_ALGO_AUTO);
            tw[w] = t;
        }
        if (r == DT_OK) r = dt_comm_allreduce(c, &correct, 1, DT_I32, DT_MIN, DT_ALGO_AUTO);
        if (r != DT_OK) goto out;
        qsort(tw, 7, sizeof tw[0], cmp_double);
        if (dt_comm_rank(c) == 0) {
            printf("%s,%d,%s,%zu,%d,%.2f,%.3f,%d\n", dt_comm_backend_name(c), p, algo, bytes, reps, tw[3] * 1e6,
                   (double)bytes / tw[3] / 1e9, correct);
            fflush(stdout);
        }
    out:
        free(buf);
        free(recv);
        if (r != DT_OK) return r;
    }
    return DT_OK;
}

static dt_result rank_main(dt_comm *c, void *arg) {
    const opts *o = (const opts *)arg;
    char list[128], *a, *save = NULL;
    snprintf(list, sizeof list, "%s", o->algos);
    for (a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        dt_result r = measure(c, o, a);
        if (r != DT_OK) return r;
    }
    return DT_OK;
}

int main(int argc, char **argv) {
    dt_launch_desc ld;
    opts o;
    int i;
    memset(&ld, 0, sizeof ld);
    memset(&o, 0, sizeof o);
#ifdef DT_USE_MPI
    snprintf(o.algos, sizeof o.algos, "naive,ring,tree,native,mpich");
#else
    snprintf(o.algos, sizeof o.algos, "naive,ring,tree,native");
#endif
    o.max_bytes = (size_t)64 << 20;
    o.window = 0.2;
    ld.threads_per_rank = 1;
    if (dt_launch_parse(&argc, argv, &ld) != DT_OK) { fprintf(stderr, "bench_comm: %s\n", dt_last_error()); return 2; }
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--algos") == 0 && i + 1 < argc) snprintf(o.algos, sizeof o.algos, "%s", argv[++i]);
        else if (strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc) o.max_bytes = (size_t)strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--window") == 0 && i + 1 < argc) o.window = atof(argv[++i]);
        else { fprintf(stderr, "bench_comm: unknown argument '%s'\nusage: bench_comm [--ranks N] [--algos naive,ring,tree,native] [--max-bytes N] [--window S]\n", argv[i]); return 2; }
    }
    return dt_launch(&ld, rank_main, &o) == DT_OK ? 0 : 1;
}
