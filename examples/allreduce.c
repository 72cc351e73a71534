/* allreduce.c - the all-reduce algorithms side by side: every rank holds a vector, all-reduce sums them,
   and each algorithm's time, result and traffic (bytes sent by each rank, the busiest rank, time spent
   waiting) are printed. With the link model, one machine behaves like a slow network.

   usage: allreduce [--ranks N] [--count N] [--iters N] [--algos naive,ring,tree,native,hier]
                    [--link-latency S] [--link-bandwidth RATE] [--timeout S] [--log-all-ranks]
   e.g.   ./build/examples/allreduce --ranks 4 --count 1000000
          ./build/examples/allreduce --ranks 8 --count 100000 --link-latency 0.001 --link-bandwidth 100Mbit
          mpiexec -n 4 ./build-mpi/examples/allreduce --count 1000000       (built with make MPI=1)
   --link-bandwidth RATE is bytes per second (1e8, 100M) or a rate with its unit (100Mbit, 1Gbit/s, 125MB), as in
   every example (examples/common.h); the log says it in Mbit/s or Gbit/s, as the charts do.   */
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define EX_PROG "allreduce"
#include "common.h"

typedef struct opts { long count, iters; char algos[128]; } opts;

static void usage(FILE *f) {
    fprintf(f, "usage: allreduce [--ranks N] [--count N] [--iters N] [--algos naive,ring,tree,native,hier]\n"
               "                 [--link-latency S] [--link-bandwidth RATE] [--timeout S] [--log-all-ranks]\n");
}

static int parse_args(int argc, char **argv, void *arg) {
    opts *o = (opts *)arg;
    int i;
    o->count = 1000000;
    o->iters = 10;
    snprintf(o->algos, sizeof o->algos, "naive,ring,tree,native");
    for (i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) o->count = strtol(argv[++i], &end, 10);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) o->iters = strtol(argv[++i], &end, 10);
        else if (strcmp(argv[i], "--algos") == 0 && i + 1 < argc) snprintf(o->algos, sizeof o->algos, "%s", argv[++i]);
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { usage(stdout); exit(0); }
        else { fprintf(stderr, "allreduce: unknown argument '%s'\n", argv[i]); usage(stderr); return -1; }
        if (end && (*end || o->count < 0 || o->iters < 1)) {
            fprintf(stderr, "allreduce: '%s' is not a valid value for %s (count >= 0, iters >= 1)\n", argv[i], argv[i - 1]);
            return -1;
        }
    }
    return 0;
}

static dt_result run_algo(dt_comm *c, const opts *o, dt_algo a, float *x) {
    int p = dt_comm_size(c), me = dt_comm_rank(c);
    long i, it;
    double t0, dt, sent, busiest, wait, maxwait, want;
    float err = 0.0f;
    dt_comm_stats st;
    dt_result r;
    /* rank r holds x[i] = r + i mod 7: the sum is p (p - 1) / 2 + p (i mod 7), exact in float32 */
    if ((r = dt_comm_barrier(c)) != DT_OK) return r;
    dt_comm_reset_stats(c);
    t0 = dt_time_now();
    for (it = 0; it < o->iters; it++) {
        for (i = 0; i < o->count; i++) x[i] = (float)(me + i % 7);
        if ((r = dt_comm_allreduce(c, x, (size_t)o->count, DT_F32, DT_SUM, a)) != DT_OK) return r;
    }
    dt = (dt_time_now() - t0) / (double)o->iters;
    st = dt_comm_get_stats(c);
    for (i = 0; i < o->count; i++) {
        want = p * (p - 1) / 2.0 + p * (double)(i % 7);
        if (x[i] != (float)want) { err = 1.0f; break; }
    }
    /* the report's own reductions come after the counters were read */
    sent = busiest = (double)st.bytes_sent / (double)o->iters;
    wait = maxwait = st.wait_seconds / (double)o->iters;
    if ((r = dt_comm_allreduce(c, &dt, 1, DT_F64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    if ((r = dt_comm_allreduce(c, &busiest, 1, DT_F64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    if ((r = dt_comm_allreduce(c, &sent, 1, DT_F64, DT_SUM, DT_ALGO_AUTO)) != DT_OK) return r;
    if ((r = dt_comm_allreduce(c, &maxwait, 1, DT_F64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    if ((r = dt_comm_allreduce(c, &err, 1, DT_F32, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    dt_log(DT_LOG_INFO, "rank %d: %s sent %.0f bytes per call, waited %.3f ms", me, dt_algo_name(a), (double)st.bytes_sent / (double)o->iters, wait * 1e3);
    if (me == 0)
        printf("%-7s %10.3f ms  %8.3f GB/s  busiest rank sends %10.0f B  all ranks %10.0f B  max wait %8.3f ms  %s\n",
               dt_algo_name(a), dt * 1e3, (double)o->count * 4.0 / dt / 1e9, busiest, sent, maxwait * 1e3,
               err == 0.0f ? "correct" : "WRONG");
    return err == 0.0f ? DT_OK : dt_set_error(DT_ERR_NUMERIC, "rank %d: %s all-reduce gave a wrong sum", me, dt_algo_name(a));
}

static dt_result rank_main(dt_comm *c, void *arg) {
    const opts *o = (const opts *)arg;
    const char *name = o->algos;
    float *x = (float *)malloc(sizeof(float) * (size_t)(o->count > 0 ? o->count : 1));
    dt_result r = DT_OK;
    if (!x) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "allreduce: no memory for %ld floats", o->count);
    if (dt_comm_rank(c) == 0)
        printf("%d ranks on the %s backend, %ld floats (%.2f MiB), %ld calls each\n", dt_comm_size(c), dt_comm_backend_name(c),
               o->count, (double)o->count * 4.0 / 1048576.0, o->iters);
    while (*name && r == DT_OK) {   /* the comma-separated list (strtok is not for threads) */
        char one[32];
        size_t len = strcspn(name, ",");
        dt_algo a = DT_ALGO_AUTO;
        snprintf(one, sizeof one, "%.*s", (int)(len < sizeof one ? len : sizeof one - 1), name);
        if ((r = dt_algo_parse(one, &a)) == DT_OK) r = run_algo(c, o, a, x);
        name += len + (name[len] == ',');
    }
    free(x);
    return r;
}

static const ex_example EXAMPLE = {usage, parse_args, NULL, rank_main};

int main(int argc, char **argv) {
    static opts o;   /* parse_args sets the defaults */
    return ex_main(argc, argv, &EXAMPLE, &o, NULL);   /* no data to load */
}
