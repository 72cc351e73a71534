/* test_resume_mpi.c - one run of tests/resume_checks.h under mpiexec, each process one rank:
     mpicc -DDT_USE_MPI (make MPI=1), then
     mpiexec -n 4 build-mpi/tests/mpi/test_resume_mpi --trainer ddp --steps 14 --every 3 --ckpt C --out O
         [--kill-at K] [--resume --expect-from S]
   tests/run.sh (section 7) runs it three times for each trainer: uninterrupted, killed with SIGKILL after
   a random step K (one rank kills itself, which ends the job), and resumed from the last checkpoint; the
   resumed run must write the uninterrupted run's bytes. Exit status 0, 1 after a failure, 2 for bad flags. */
#define _POSIX_C_SOURCE 200809L
#include "../../dtrain.h"
#include "../resume_checks.h"
#ifndef DT_USE_MPI
#error "build this test with MPI: mpicc -DDT_USE_MPI (make MPI=1)"
#endif

int main(int argc, char **argv) { return rs_main(argc, argv); }
