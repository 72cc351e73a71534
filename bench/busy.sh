#!/bin/sh
# bench/busy.sh BUILD - one rank's training on a busy machine: the CPU backend's busy-machine watch
# (dtrain/cpu/cpu.h, dt_cpu_adapt_count) against OpenMP's own default (DT_CPU_ADAPT=0, its threads spinning
# while they wait) and against OMP_WAIT_POLICY=passive, with one other program spinning on a core ("busy"),
# and on the machine as it is ("quiet"). Each workload is one epoch of LIMIT samples (default 6000) of
# Fashion-MNIST, evaluated on 1000 test images: examples/train (SimpleCNN, 2 threads) and examples/hogwild
# --threads 1. The settings run alternately, ROUNDS times (default 3); the medians and their ratios are printed:
#   busy: watch / passive    the goal is at most 1.3
#   quiet: watch / spinning  the goal is at most 1.05 (what the watch costs where nobody else runs)
# Timings mean something only on a machine with no other work. Minutes.
B=${1:-build}
LIMIT=${LIMIT:-6000}
ROUNDS=${ROUNDS:-3}
. bench/common.sh
D=$(mktemp -d)
trap 'kill $HOG 2>/dev/null; rm -rf "$D"' EXIT INT TERM
small_fmnist "$D/data" 1000
HOG=
secs() {   # secs CMD...: the wall time of CMD in seconds
    s0=$(date +%s.%N)
    "$@" > "$D/log" 2>&1 || { cat "$D/log" >&2; echo "bench/busy.sh: $* failed" >&2; kill $HOG 2>/dev/null; exit 1; }
    awk -v a="$s0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
}
med() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for w in train hogwild; do
    case $w in
        train) cmd="$B/examples/train --data $D/data --limit $LIMIT --epochs 1" ;;
        hogwild) cmd="$B/examples/hogwild --threads 1 --data $D/data --limit $LIMIT --epochs 1" ;;
    esac
    qw=""; qs=""; bw=""; bp=""; bs=""
    r=0
    while [ "$r" -lt "$ROUNDS" ]; do
        qw="$qw $(secs env -u DT_CPU_ADAPT -u OMP_WAIT_POLICY $cmd)"
        qs="$qs $(secs env -u OMP_WAIT_POLICY DT_CPU_ADAPT=0 $cmd)"
        sh -c 'while :; do :; done' & HOG=$!
        sleep 0.5
        bw="$bw $(secs env -u DT_CPU_ADAPT -u OMP_WAIT_POLICY $cmd)"
        bp="$bp $(secs env DT_CPU_ADAPT=0 OMP_WAIT_POLICY=passive $cmd)"
        bs="$bs $(secs env -u OMP_WAIT_POLICY DT_CPU_ADAPT=0 $cmd)"
        kill $HOG; wait $HOG 2>/dev/null; HOG=
        r=$((r + 1))
    done
    echo "$w ($LIMIT samples, 1 epoch; seconds, medians of $ROUNDS)"
    echo "  quiet: watch$qw -> $(echo $qw | med); spinning$qs -> $(echo $qs | med)"
    echo "  busy:  watch$bw -> $(echo $bw | med); passive$bp -> $(echo $bp | med); spinning$bs -> $(echo $bs | med)"
    awk -v a="$(echo $bw | med)" -v b="$(echo $bp | med)" -v c="$(echo $bs | med)" -v d="$(echo $qw | med)" -v e="$(echo $qs | med)" 'BEGIN {
        printf "  busy: watch / passive %.2f (goal <= 1.3), spinning / passive %.2f;  quiet: watch / spinning %.3f (goal <= 1.05)\n", a / b, c / b, d / e }'
done
