#!/bin/sh
# bench/scaling.sh BUILD - DDP scaling on this machine: SimpleCNN on Fashion-MNIST, one epoch of LIMIT samples
# (default 16384) at global batch 128 (on 3 ranks 126: ddp refuses a batch that does not divide over the
# ranks), with 1, 2, ..., MAX_RANKS local ranks (default 4), each rank on
# THREADS OpenMP threads (default 1, so that N ranks use N cores' worth of threads). Writes BUILD/bench/scaling.csv (ranks, seconds per epoch,
# images/s, speed-up and efficiency against 1 rank) and, when gnuplot is installed, BUILD/bench/scaling.png.
# DDP_FLAGS are added to every run and named in the chart (tools/experiments.sh: --sync flat --algo ring);
# SCALING_OUT replaces BUILD/bench.
B=${1:-build}
LIMIT=${LIMIT:-16384}
MAX=${MAX_RANKS:-4}
THREADS=${THREADS:-1}
OUT=${SCALING_OUT:-$B/bench}
mkdir -p "$OUT"
echo "ranks,time_s,img_per_s,speedup,efficiency" > "$OUT/scaling.csv"
t1=
n=1
while [ "$n" -le "$MAX" ]; do
    "$B/examples/ddp" --ranks $n --batch $((128 / n * n)) --threads-per-rank $THREADS --epochs 1 --limit $LIMIT $DDP_FLAGS --csv "$OUT/scaling-$n.csv" > "$OUT/scaling-$n.log" 2>&1 ||
        { cat "$OUT/scaling-$n.log"; exit 1; }
    t=$(awk -F, 'NR == 2 { print $2 }' "$OUT/scaling-$n.csv")
    [ -z "$t1" ] && t1=$t
    awk -v n=$n -v t=$t -v t1=$t1 -v s=$LIMIT 'BEGIN { printf "%d,%.3f,%.1f,%.3f,%.3f\n", n, t, s / t, t1 / t, t1 / t / n }' >> "$OUT/scaling.csv"
    n=$((n + 1))
done
column -s, -t "$OUT/scaling.csv" 2>/dev/null || cat "$OUT/scaling.csv"
if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<GP
set terminal png size 640,400
set output "$OUT/scaling.png"
set datafile separator ","
set title "DDP, SimpleCNN, Fashion-MNIST: $LIMIT samples, $THREADS thread(s) per rank${DDP_FLAGS:+\n$DDP_FLAGS}"
set xlabel "local ranks"
set ylabel "seconds per epoch"
set y2label "speed-up"
set ytics nomirror
set y2tics
set xtics 1
set key bottom right
set yrange [0:*]
set y2range [0:*]
plot "$OUT/scaling.csv" skip 1 using 1:2 with linespoints lw 2 title "time per epoch", \
     "" skip 1 using 1:4 axes x1y2 with linespoints lw 2 dt 2 title "speed-up vs 1 rank"
GP
    echo "chart: $OUT/scaling.png"
else
    echo "note: no chart (install gnuplot-nox)"
fi
