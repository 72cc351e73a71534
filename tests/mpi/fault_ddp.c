/* fault_ddp.c - a small DDP run that tests/run.sh starts with faults, under mpiexec (built with mpicc
   -DDT_USE_MPI) and on local ranks (--ranks N): tests/fault_ddp.h's MLP on synthetic data. The fault comes
   from DT_FAULT (dt_comm_desc.fault); --nan-pixel R:S puts one NaN pixel into rank R's batch at step S;
   --compress C compresses the gradients as ddp's --compress does. The exit status is 0 when every rank
   succeeded, 1 after a failure (logged by dt_launch), 2 for a bad flag: every fault must end with 1, a
   message naming the cause and the rank, in bounded time. */
#include <stdio.h>
#include <math.h>
#include "../../dtrain.h"
#include "../train_checks.h"
#include "../fault_ddp.h"

int main(int argc, char **argv) {
    dt_launch_desc d;
    fd_job j = {20, 0, 0, NULL, 0};
    memset(&d, 0, sizeof d);
    d.ranks = 3;
    if (dt_launch_parse(&argc, argv, &d) != DT_OK) { fprintf(stderr, "fault_ddp: %s\n", dt_last_error()); return 2; }
    for (; argc >= 3; argc -= 2, argv += 2) {
        if (strcmp(argv[1], "--nan-pixel") == 0 && sscanf(argv[2], "%d:%d", &j.nan_rank, &j.nan_step) == 2) continue;
        if (strcmp(argv[1], "--compress") == 0) { j.compress = argv[2]; continue; }
        break;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: fault_ddp [--ranks N] [--timeout S] [--algo A] [--nan-pixel RANK:STEP] [--compress C]   (DT_FAULT=rank=R,coll=N,kind=K)\n");
        return 2;
    }
    return dt_launch(&d, fd_rank, &j) == DT_OK ? 0 : 1;
}
