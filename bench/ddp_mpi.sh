#!/bin/sh
# bench/ddp_mpi.sh BUILD - DDP under mpiexec: one epoch of examples/ddp (BUILD built with MPI=1) on SimpleCNN and the
# first LIMIT (8192) Fashion-MNIST images, global batch 128, for each process count in RANKS (2 4): the buckets
# overlapped with backward (the default), reduced after backward (--no-overlap), and PyTorch DDP with gloo on as many
# processes (bench/torch_ddp.py). Every configuration runs REPEAT (3) times, interleaved. Rank 0 evaluates on the
# first 500 test images (not timed). Writes BUILD/bench/ddp-mpi-runs.csv (every run) and BUILD/bench/ddp-mpi.csv
# (medians), then prints, per process count, the medians and the ratios: epoch time after backward / overlapped,
# PyTorch / overlapped, and the communication backward did not hide (rank 0's comm_s) overlapped / after.
B=${1:-build-mpi}
RANKS=${RANKS:-"2 4"}
LIMIT=${LIMIT:-8192}
REPEAT=${REPEAT:-3}
OUT="$B/bench"
. "$(dirname "$0")/common.sh"
mkdir -p "$OUT"
small_fmnist "$OUT/fmnist-test500" 500
torch=1
/usr/bin/python3 -c "import torch" 2>/dev/null || { torch=0; echo "note: no PyTorch figures (install python3-torch)" >&2; }

echo "ranks,sync,epoch_s,comm_s" > "$OUT/ddp-mpi-runs.csv"
rep=1
while [ "$rep" -le "$REPEAT" ]; do
    for n in $RANKS; do
        for v in overlapped after torch; do
            log="$OUT/ddp-mpi.log" csv="$OUT/ddp-mpi-one.csv"
            case $v in
            torch) [ $torch = 1 ] && /usr/bin/python3 bench/torch_ddp.py --world "$n" --limit "$LIMIT" --data "$OUT/fmnist-test500" ;;
            *)  flags=; [ $v = after ] && flags=--no-overlap
                mpiexec -n "$n" "$B/examples/ddp" --model simplecnn --limit "$LIMIT" --data "$OUT/fmnist-test500" --epochs 1 \
                    --csv "$csv" $flags > "$log" 2>&1 || { cat "$log"; exit 1; }
                echo "$n,$v,$(csv_get "$csv" time_s),$(csv_get "$csv" comm_s)" ;;
            esac
        done
    done | tee -a "$OUT/ddp-mpi-runs.csv"
    rep=$((rep + 1))
done
medians 2 < "$OUT/ddp-mpi-runs.csv" > "$OUT/ddp-mpi.csv"
awk -F, 'NR > 1 { e[$1, $2] = $3; c[$1, $2] = $4; r[$1] = 1 }
END {
    printf "%-6s %-22s %-24s %-10s %-14s %-16s %s\n", "ranks", "overlapped s (comm)", "after backward s (comm)", "PyTorch s",
        "after/overlap", "PyTorch/overlap", "comm overlap/after"
    for (n in r) {
        t = e[n, "torch"] == "" ? "-" : sprintf("%.2f", e[n, "torch"] / e[n, "overlapped"])
        hid = c[n, "after"] > 0 ? sprintf("%.2f", c[n, "overlapped"] / c[n, "after"]) : "-"
        printf "%-6s %-22s %-24s %-10s %-14.2f %-16s %s\n", n, e[n, "overlapped"] " (" c[n, "overlapped"] ")",
            e[n, "after"] " (" c[n, "after"] ")", e[n, "torch"] == "" ? "-" : e[n, "torch"], e[n, "after"] / e[n, "overlapped"], t, hid
    }
}' "$OUT/ddp-mpi.csv" | sort -n
