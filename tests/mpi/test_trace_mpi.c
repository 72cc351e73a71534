/* test_trace_mpi.c - the timeline under MPI, started by mpiexec (tests/run.sh runs it with -n 2):
     mpicc -DDT_USE_MPI (make MPI=1), then mpiexec -n 2 build-mpi/tests/mpi/test_trace_mpi
   dt_launch with a trace path: rank 0 gathers every rank's events and writes one file holding each rank's
   process, its forward, backward, all-reduce and own spans, nested on every lane (tests/dt_test_trace.h
   trains and reads). Then a run in which rank 1 fails: the exchange cannot happen, so each rank writes
   PATH.rank<r> with its own events.
   The program initialises MPI itself, so dt_launch leaves it initialised and can run twice; rank 0 reads
   the files and prints one line per test and "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L   /* mkdtemp */
#include "../../dtrain.h"
#include "../dt_test.h"
#include "../dt_test_files.h"
#include "../dt_test_trace.h"
#ifndef DT_USE_MPI
#error "build this test with MPI: mpicc -DDT_USE_MPI (make MPI=1)"
#endif

static int np;
static char dir[256] = "/tmp/dt_test_trace_mpi_XXXXXX";
static trace_job job;

static dt_result rank_main(dt_comm *c, void *arg) {
    np = dt_comm_size(c);
    return trace_train_rank(c, arg);
}

static char path_ok[512], path_failed[512];
static dt_result rc_ok = DT_RESULT_COUNT, rc_failed = DT_RESULT_COUNT;   /* dt_launch's, on rank 0 */

static void check_one_file(void) {
    trace t;
    char rank_file[600];
    int r;
    CHECK(rc_ok == DT_OK);
    snprintf(rank_file, sizeof rank_file, "%s.rank0", path_ok);
    CHECK(!file_exists(rank_file));
    if (trace_load(path_ok, &t) != 0) { CHECK(0); return; }
    CHECK(t.ranks == np && t.dropped == 0);
    for (r = 0; r < np; r++) {
        char name[16];
        snprintf(name, sizeof name, "rank %d", r);
        CHECK(has_meta(&t, "process_name", r, 0, name));
        CHECK(count(&t, "X", r, 0, "forward") == 2 && count(&t, "X", r, 0, "backward") == 2);
        CHECK(count(&t, "X", r, 0, "optimizer step") == 2 && count(&t, "X", r, 0, "all-reduce") >= 4);
        CHECK(count(&t, "X", r, 0, TRACE_ODD_NAME) == 1 && count(&t, "X", r, 0, "step") == 2);
        CHECK(count(&t, "X", r, 1, "bucket") == 0);   /* main initialised MPI FUNNELED: DDP reduces after backward */
    }
    CHECK(check_lanes(&t, 0) == 0);
    trace_free(&t);
}

static void check_rank_files(void) {
    trace t;
    char rank_file[600];
    int r, i, others;
    CHECK(rc_failed == DT_ERR_PEER);   /* rank 1 failed; rank 0 because of it */
    CHECK(!file_exists(path_failed));
    for (r = 0; r < np; r++) {
        char name[16];
        snprintf(rank_file, sizeof rank_file, "%s.rank%d", path_failed, r);
        snprintf(name, sizeof name, "rank %d", r);
        if (trace_load(rank_file, &t) != 0) { CHECK(0); continue; }
        for (i = 0, others = 0; i < t.n; i++) others += t.e[i].pid != r;
        CHECK(others == 0 && t.ranks == 1 && has_meta(&t, "process_name", r, 0, name));
        CHECK(count(&t, "X", r, 0, TRACE_ODD_NAME) == 1 && count(&t, "X", r, 0, "step") == (r == 1 ? 0 : 1));
        trace_free(&t);
    }
}

int main(int argc, char **argv) {
    dt_launch_desc ld;
    int provided = 0, world = -1, status = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) { printf("MPI_Init_thread failed\n"); return 1; }
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    if (world == 0 && !mkdtemp(dir)) dir[0] = 0;
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(path_ok, sizeof path_ok, "%s/run.json", dir);
    snprintf(path_failed, sizeof path_failed, "%s/failed.json", dir);
    memset(&ld, 0, sizeof ld);
    ld.comm.timeout = 60;
    ld.trace_path = path_ok;
    job.steps = 2; job.batch = 8; job.in = 16; job.fail_rank = -1;
    rc_ok = dt_launch(&ld, rank_main, &job);
    job.fail_rank = 1;            /* before its first step: rank 0 fails in that step's all-reduce */
    ld.trace_path = path_failed;
    rc_failed = dt_launch(&ld, rank_main, &job);
    MPI_Barrier(MPI_COMM_WORLD);   /* every rank has written its files */
    if (world == 0) {
        if (argc > 1) dt_t_only = argv[1];
        RUN(check_one_file);
        RUN(check_rank_files);
        dt_t_rm_rf(dir);
        status = dt_t_summary();
    }
    MPI_Finalize();
    return status;
}
