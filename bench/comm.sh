#!/bin/sh
# bench/comm.sh BUILD - all-reduce of dtrain's algorithms on the local backend and, when MPICH is installed, on
# the MPI backend, side by side with MPICH's own MPI_Allreduce and PyTorch's gloo (when python3-torch is
# installed), for 2 and 4 ranks, 1 KiB .. 64 MiB. All figures come from this one run (the machine is noisy).
# Writes BUILD/bench/comm.csv and prints a table of medians and ratios. BENCH_MAX_BYTES and BENCH_WINDOW shorten it.
B=${1:-build}
MAX=${BENCH_MAX_BYTES:-67108864}
WIN=${BENCH_WINDOW:-0.2}
CSV="$B/bench/comm.csv"
mkdir -p "$B/bench"
echo "backend,ranks,algo,bytes,reps,time_us,algbw_GBps,correct" > "$CSV"
for n in 2 4; do
    echo "local backend, $n ranks ..." >&2
    "$B/bench/bench_comm" --ranks $n --max-bytes $MAX --window $WIN >> "$CSV" || exit 1
done
if command -v mpicc >/dev/null 2>&1 && [ -f dtrain_mpi.h ]; then
    mpicc -std=c11 -O3 -fopenmp -pthread -DDT_USE_MPI -DDTRAIN_IMPLEMENTATION bench/bench_comm.c -o "$B/bench/bench_comm_mpi" -lm || exit 1
    for n in 2 4; do
        echo "MPI backend and MPICH's MPI_Allreduce, $n processes ..." >&2
        mpiexec -n $n "$B/bench/bench_comm_mpi" --max-bytes $MAX --window $WIN >> "$CSV" || exit 1
    done
else
    echo "note: no MPI figures (install mpich libmpich-dev)" >&2
fi
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    for n in 2 4; do
        echo "PyTorch gloo, $n processes ..." >&2
        /usr/bin/python3 bench/gloo_allreduce.py --world $n --max-bytes $MAX --window $WIN >> "$CSV" || exit 1
    done
else
    echo "note: no gloo figures (install python3-torch)" >&2
fi
# the table: median time in microseconds per (ranks, size); ratios = peer time / dtrain's best local time
awk -F, 'NR > 1 {
    key = $2 "," $4; t[$1 "/" $3, key] = $6; keys[key] = 1; col[$1 "/" $3] = 1
    if ($8 != 1) bad = bad " " $1 "/" $3 "@" $4
    if ($1 == "local" && (!(key in best) || $6 < best[key])) { best[key] = $6; bestalgo[key] = $3 }
}
END {
    printf "%-6s %-9s", "ranks", "bytes"
    n = split("local/naive local/ring local/tree local/native mpi/naive mpi/ring mpi/tree mpi/native mpi/mpich gloo/gloo", cols, " ")
    for (i = 1; i <= n; i++) if (cols[i] in col) printf " %12s", cols[i]
    printf " %10s %10s\n", "mpich/best", "gloo/best"
    for (r = 2; r <= 4; r += 2) for (s = 1024; s <= 67108864; s *= 4) {
        key = r "," s; if (!(key in keys)) continue
        printf "%-6d %-9d", r, s
        for (i = 1; i <= n; i++) if (cols[i] in col) {
            v = t[cols[i], key]; if (v == "") printf " %12s", "-"; else printf " %12.1f", v }
        m = t["mpi/mpich", key]; g = t["gloo/gloo", key]
        if (m != "") printf " %9.2fx", m / best[key]; else printf " %10s", "-"
        if (g != "") printf " %9.2fx", g / best[key]; else printf " %10s", "-"
        printf "\n"
    }
    print "times: median microseconds per all-reduce (float32 sum, in place); ratios > 1: dtrain local is faster"
    if (bad != "") { print "WRONG RESULTS:" bad; exit 1 }
}' "$CSV"
