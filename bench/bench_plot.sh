#!/bin/sh
# bench/bench_plot.sh CSV PNG - the chart of make bench: every dtrain / peer ratio of CSV (bench/bench.sh's
# bench.csv: the training steps against PyTorch, the GEMMs against OpenBLAS) as a bar, with the parity line.
# bench.sh draws it after a run; `sh bench/bench_plot.sh docs/bench.csv docs/bench.png` redraws the committed one.
# The y range is set from the largest ratio (gnuplot's autoscale stopped at a tic below a tall bar and cut it),
# and the labels slant down to the left of their bars, so the last one stays inside the picture.
CSV=${1:?usage: bench_plot.sh CSV PNG}; PNG=${2:?usage: bench_plot.sh CSV PNG}
command -v gnuplot >/dev/null 2>&1 || { echo "bench_plot.sh: gnuplot is not installed (tools/deps.sh: gnuplot-nox)" >&2; exit 2; }
DAT=$(mktemp) || exit 1
trap 'rm -f "$DAT"' EXIT
grep -E '^(train_step|gemm),' "$CSV" | awk -F, '$5 != "" { print $1 == "train_step" ? $2 ".train-step" : "gemm." $2, $5 }' > "$DAT"
[ -s "$DAT" ] || { echo "bench_plot.sh: $CSV has no train_step or gemm row with a ratio" >&2; exit 2; }
ymax=$(awk '$2 > m { m = $2 } END { printf "%.2f", (m > 1 ? m : 1) * 1.12 }' "$DAT")
threads=$(awk -F, '$1 == "machine" && $2 == "threads" { print $3 }' "$CSV")
gnuplot <<GP
set terminal png size 1000,500
set output "$PNG"
set title "dtrain / peer, same machine, same run${threads:+, $threads threads} (training step: PyTorch; GEMM: OpenBLAS)"
set style fill solid 0.6
set boxwidth 0.7
set yrange [0:$ymax]
set ylabel "ratio (> 1: dtrain is faster)"
set xtics rotate by 40 right font ",8"
set bmargin 9
set lmargin 10
set grid ytics
plot "$DAT" using 0:2:xtic(1) with boxes notitle, \
     "$DAT" using 0:2:(sprintf("%.2f", \$2)) with labels offset 0,0.6 font ",8" notitle, \
     1 with lines dt 2 lw 2 title "parity"
GP
