#!/bin/sh
# tools/experiments.sh [WORKLOAD]... - the five workloads dtrain grew out of, each one command and one chart
# (make experiments; docs/experiments.md shows the charts and says how long each run was):
#   dpsgd      D-PSGD on a ring of 4 ranks, ResNet-20, the averaged model evaluated each epoch
#   fedavg     FedAvg with Adam and a cosine learning rate: no attack, one label-flipping client, and the
#              same client against a defence (coordinate median, class means)
#   scaling    DDP with the ring all-reduce on 1, 2, 3 and 4 workers: time per epoch and speed-up
#   localsgd   synchronous averaging once per epoch (local SGD) next to Hogwild, and plain SGD
#   vgg11      VGG-11 trained four ways from one seed: one process, DDP, local SGD averaging every step (the
#              synchronous ways: DDP and local SGD must log the same first-epoch loss, which is checked) and Hogwild
# Without a WORKLOAD: all five. Writes OUT/NAME.png (OUT default build/experiments), the CSVs and logs
# under OUT/NAME/. QUICK=1 shortens every run to seconds (CI); the default length is the committed charts'
# (docs/experiments/*.png, about 50 minutes in all on 2 heavily shared cores). B (default build) holds the examples.
# CIFAR-10 cannot be downloaded here: the CIFAR workloads (ResNet-20, VGG-11) train on Fashion-MNIST,
# zero-padded to 32x32 (dpsgd pads it itself; VGG-11 reads a CIFAR-10-format copy written by
# tools/experiments/cifar_from_fmnist.py, which the charts name). Exit status non-zero when a run fails.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
OUT=${OUT:-$B/experiments}
[ $# -gt 0 ] || set -- dpsgd fedavg scaling localsgd vgg11
X=$B/examples
Q=${QUICK:+1}
mkdir -p "$OUT" || exit 1

# q QUICK FULL: the value for this length
q() { if [ -n "$Q" ]; then echo "$1"; else echo "$2"; fi; }
# run NAME PROGRAM ARGS...: one run into OUT/W/NAME.csv and .log; says what it ran
run() {
    name=$1; prog=$2; shift 2
    echo "$W/$name: $prog $*"
    "$X/$prog" "$@" --csv "$OUT/$W/$name.csv" > "$OUT/$W/$name.log" 2>&1 || { tail -n 20 "$OUT/$W/$name.log"; return 1; }
}
plot() {
    command -v gnuplot >/dev/null 2>&1 || { echo "$W: no chart: gnuplot is not installed (tools/deps.sh gnuplot-nox)"; return 0; }
    sh "$ROOT/tools/plot.sh" -o "$OUT/$W.png" "$@" && echo "chart: $OUT/$W.png"
}

dpsgd() {
    lim=$(q 256 4096); ep=$(q 1 4)
    run ring dpsgd --ranks 4 --model resnet20 --topology ring --limit $lim --epochs $ep --lr 0.1 --wd 1e-4 --cosine &&
    plot -t "D-PSGD, ring of 4 ranks, ResNet-20: Fashion-MNIST padded to 32x32, $lim images, $ep epochs" \
        -y test_acc -y train_loss -y consensus "$OUT/$W/ring.csv=averaged model (ring, gap 0.667)"
}

fedavg() {
    c="--ranks 3 --clients 5 --frac 1 --rounds $(q 2 20) --limit $(q 1000 10000) --local-epochs $(q 1 2) --batch 10"
    c="$c --optim adam --lr 0.001 --cosine --seed 0 --flip 1:4"
    run clean fedavg $c --agg mean &&
    run flip-mean fedavg $c --attack labelflip --attackers 1 --agg mean &&
    run flip-median fedavg $c --attack labelflip --attackers 1 --agg median &&
    run flip-classmean fedavg $c --attack labelflip --attackers 1 --agg classmean &&
    plot -t "FedAvg, Adam + cosine lr: fedavg_2nn, 5 clients; client 0 calls trousers coats" -y test_acc -y class_acc -y flip_rate \
        "$OUT/$W/clean.csv=no attack, mean" "$OUT/$W/flip-mean.csv=1 flipper, mean" \
        "$OUT/$W/flip-median.csv=1 flipper, median" "$OUT/$W/flip-classmean.csv=1 flipper, class means"
}

scaling() {   # bench/scaling.sh with the ring all-reduce, into OUT/scaling/
    LIMIT=$(q 512 8192) DDP_FLAGS="--sync flat --algo ring" SCALING_OUT="$OUT/$W" sh "$ROOT/bench/scaling.sh" "$B" || return 1
    [ ! -f "$OUT/$W/scaling.png" ] || cp "$OUT/$W/scaling.png" "$OUT/$W.png"
}

localsgd() {
    c="--limit $(q 512 8192) --epochs $(q 1 4) --lr 0.01"
    run epoch localsgd --ranks 4 $c --period 0 &&
    run hogwild hogwild --threads 4 $c &&
    run sgd hogwild --threads 1 $c &&
    plot -t "SimpleCNN, $(q 512 8192) images, batch 32 per worker, lr 0.01: average each epoch against Hogwild" \
        -y test_acc -y train_loss "$OUT/$W/epoch.csv=local SGD, 4 ranks, average each epoch" \
        "$OUT/$W/hogwild.csv=Hogwild, 4 threads" "$OUT/$W/sgd.csv=SGD, 1 thread"
}

vgg11() {
    lim=$(q 64 1024); ep=$(q 1 3); bs=$(q 32 64); data=$OUT/$W/fmnist-cifar-format
    python3 "$ROOT/tools/experiments/cifar_from_fmnist.py" "$data" $lim $(q 100 1000) || return 1
    c="--model vgg11 --dataset cifar10 --data $data --limit $lim --epochs $ep --seed 1"
    r="--lr 0.01 --momentum 0.9 --wd 5e-4"   # lr 0.05 diverged in the first steps from scratch at batch 128
    # ddp's --batch is the global batch; localsgd's and hogwild's are per rank or thread
    run train train $c $r --batch $bs &&
    run ddp ddp --ranks 4 $c $r --batch $bs --sync flat --algo ring &&
    run localsgd localsgd --ranks 4 $c $r --batch $((bs / 4)) --period 1 --algo ring &&
    run hogwild hogwild --threads 4 $c --batch $((bs / 4)) --lr 0.01 || return 1
    # the synchronous ways on 4 ranks compute the same steps: their first epoch's training losses agree to
    # rounding (0.1%: DDP's own ring and tree differ by that much on VGG-11, whose rounding differences grow
    # from step to step, so later epochs drift apart as two DDP runs with different algorithms do)
    awk -F, 'FNR == 1 { for (i = 1; i <= NF; i++) if ($i == "train_loss") k = i; next }
             FNR != 2 { next }
             FILENAME ~ /ddp.csv$/ { a = $k; next }
             { d = a - $k; if (d < 0) d = -d; printf "epoch 1: DDP train_loss %s, local SGD every step %s\n", a, $k
               exit (d > 1e-3 * a) }' "$OUT/$W/ddp.csv" "$OUT/$W/localsgd.csv" ||
        { echo "vgg11: DDP and local SGD averaging every step logged different losses in epoch 1"; return 1; }
    echo "vgg11: DDP and local SGD averaging every step logged the same epoch-1 training loss (within 0.1%)"
    plot -t "VGG-11 four ways, seed 1: Fashion-MNIST in CIFAR-10 format (32x32), $lim images, batch $bs" \
        -y train_loss -y test_acc "$OUT/$W/train.csv=one process" "$OUT/$W/ddp.csv=DDP, 4 ranks, ring" \
        "$OUT/$W/localsgd.csv=local SGD every step, 4 ranks" "$OUT/$W/hogwild.csv=Hogwild, 4 threads (lr 0.01)"
}

for W in "$@"; do
    case $W in
    dpsgd|fedavg|scaling|localsgd|vgg11) ;;
    *) echo "tools/experiments.sh: no workload '$W': use dpsgd, fedavg, scaling, localsgd or vgg11" >&2; exit 2 ;;
    esac
    mkdir -p "$OUT/$W" || exit 1
    t0=$(date +%s)
    $W || { echo "tools/experiments.sh: $W failed" >&2; exit 1; }
    echo "$W: $(( $(date +%s) - t0 )) s"
done
