/* mpi_test.h - the MPI tests' harness on top of dt_test.h: each test's failed checks are summed over the
   ranks, so every rank counts the same passes and failures; rank 0 prints one line per test and, at the
   end, "N passed, N failed". Include after dtrain.h (built with DT_USE_MPI) and dt_test.h, with
   _POSIX_C_SOURCE defined (nanosleep). main calls mt_main; on every rank the rank function calls mt_begin,
   then mt_run for each test, then mt_end. */
#ifndef MPI_TEST_H
#define MPI_TEST_H
#include <stdio.h>
#include <string.h>
#include <time.h>

static MPI_Comm mt_comm = MPI_COMM_NULL;   /* the harness's own, for its sums */
static int mt_rank, mt_passed, mt_failed;

static void mt_nap(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}
/* Sum over the ranks, polling politely (a blocking MPI call would spin and starve oversubscribed ranks,
   e.g. the local ranks rank 0 runs on threads while the others wait here). */
static int mt_sum_ranks(int x) {
    int all = 0, done = 0;
    MPI_Request rq;
    if (MPI_Iallreduce(&x, &all, 1, MPI_INT, MPI_SUM, mt_comm, &rq) != MPI_SUCCESS) return x + 1000;
    while (MPI_Test(&rq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) mt_nap(1e-4);
    return all;
}
/* Runs one test on every rank (all of them call it, in the same order; argv[1] in dt_t_only filters). */
static void mt_run(const char *name, void (*fn)(void)) {
    int all;
    double t0, t;
    if (!dt_t_selected(name)) return;
    dt_t_checks_failed = 0;
    t0 = dt_time_now();
    fn();
    t = dt_time_now() - t0;
    if (dt_t_checks_failed) printf("    rank %d: %d checks failed in %s\n", mt_rank, dt_t_checks_failed, name);
    fflush(stdout);
    all = mt_sum_ranks(dt_t_checks_failed);
    if (all) mt_failed++; else mt_passed++;
    if (mt_rank == 0) {   /* with its time on rank 0 from a second on, as dt_test.h prints it */
        if (t >= 1.0) printf("%s %s (%.1f s)\n", all ? "FAIL" : "ok  ", name, t);
        else printf("%s %s\n", all ? "FAIL" : "ok  ", name);
        fflush(stdout);
    }
}
static dt_result mt_begin(int rank) {
    mt_rank = rank;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &mt_comm) != MPI_SUCCESS) return dt_set_error(DT_ERR_COMM, "MPI_Comm_dup failed");
    return DT_OK;
}
/* Prints the summary on rank 0; DT_ERR_STATE when a test failed (the rank function's result). */
static dt_result mt_end(void) {
    if (mt_rank == 0) printf("%d passed, %d failed\n", mt_passed, mt_failed);
    fflush(stdout);
    MPI_Comm_free(&mt_comm);
    return mt_failed ? dt_set_error(DT_ERR_STATE, "%d of the MPI tests failed", mt_failed) : DT_OK;
}

/* main's part: takes the launcher's flags out of argv (argv[1] is then a filter on test names) and runs fn
   on every rank with ring segments of segment_bytes and, unless --timeout says otherwise, timeout; *desc
   receives the communicator options, for the tests' own communicators. */
static int mt_main(int argc, char **argv, size_t segment_bytes, double timeout, dt_comm_desc *desc, dt_rank_fn fn) {
    dt_launch_desc d;
    memset(&d, 0, sizeof d);
    if (dt_launch_parse(&argc, argv, &d) != DT_OK) { printf("%s\n", dt_last_error()); return 2; }
    if (argc > 1) dt_t_only = argv[1];
    d.comm.segment_bytes = segment_bytes;
    if (d.comm.timeout <= 0) d.comm.timeout = timeout;
    *desc = d.comm;
    return dt_launch(&d, fn, NULL) == DT_OK ? 0 : 1;
}
#endif
