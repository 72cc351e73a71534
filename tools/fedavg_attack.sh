#!/bin/sh
# tools/fedavg_attack.sh [BUILD] [OUT] - label flipping against FedAvg's aggregators, as docs/accuracy.md
# reports it: fedavg_2nn on Fashion-MNIST, 5 IID clients of 2,000 images (--limit 10000), E 5, B 10, SGD
# lr 0.05, 20 rounds, seed 0, 3 local ranks; the flippers (client 0, or clients 0 and 1) train with their
# trousers (class 1) labelled as coats (class 4). Each run writes OUT/NAME.csv and OUT/NAME.log (about
# 1-2 minutes each on 2 cores); then OUT/table.md gets the final round's per-class figures and
# OUT/fedavg-attack-1.png, OUT/fedavg-attack-2.png the learning curves (tools/plot.sh, needs gnuplot).
# PLOT_ONLY=1 skips the runs: the table and the charts from the CSVs and logs already in OUT.
B=${1:-build}
OUT=${2:-$B/fedavg-attack}
COMMON="--ranks 3 --clients 5 --rounds 20 --limit 10000 --local-epochs 5 --batch 10 --lr 0.05 --seed 0 --flip 1:4 --per-class"
# NAME|LINE TITLE|FLAGS
RUNS="clean-mean|clean, mean|--agg mean
clean-krum|clean, Krum|--agg krum
clean-classmean|clean, class means|--agg classmean
flip1-mean|1 flipper, mean|--attack labelflip --attackers 1 --agg mean
flip1-median|1 flipper, median|--attack labelflip --attackers 1 --agg median
flip1-trimmed|1 flipper, trimmed 0.2|--attack labelflip --attackers 1 --agg trimmed --trim 0.2
flip1-krum|1 flipper, Krum|--attack labelflip --attackers 1 --agg krum
flip1-multikrum|1 flipper, multi-Krum|--attack labelflip --attackers 1 --agg multikrum
flip1-classmean|1 flipper, class means|--attack labelflip --attackers 1 --agg classmean
flip2-mean|2 flippers, mean|--attack labelflip --attackers 2 --agg mean
flip2-median|2 flippers, median|--attack labelflip --attackers 2 --agg median
flip2-trimmed|2 flippers, trimmed 0.2|--attack labelflip --attackers 2 --agg trimmed --trim 0.2
flip2-krum|2 flippers, Krum|--attack labelflip --attackers 2 --agg krum
flip2-multikrum|2 flippers, multi-Krum|--attack labelflip --attackers 2 --agg multikrum
flip2-classmean|2 flippers, class means|--attack labelflip --attackers 2 --agg classmean"
mkdir -p "$OUT" || exit 1
if [ -z "$PLOT_ONLY" ]; then
    printf '%s\n' "$RUNS" | while IFS='|' read -r name title flags; do
        echo "$name: $B/examples/fedavg $COMMON $flags"
        "$B/examples/fedavg" $COMMON $flags --csv "$OUT/$name.csv" > "$OUT/$name.log" 2>&1 || { cat "$OUT/$name.log"; exit 1; }
    done || exit 1
fi

# the table: the last round's line and the --per-class lines of each log, and from the CSV the figures of
# the last 10 rounds, as under attack they can swing by tens of points from round to round
{
    echo "| run | test accuracy: last round (rounds 11-20) | class 1 (trouser) | class 1, rounds 11-20: mean (lowest) | trousers predicted as coats, rounds 11-20 | class 4 (coat) | rounds left out, clients 0 1 2 3 4 |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "$RUNS" | while IFS='|' read -r name title flags; do
        late=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "test_acc") t = i; if ($i == "class_acc") c = i
                                                             if ($i == "flip_rate") f = i }; next }
                        { o[NR - 1] = $t; a[NR - 1] = $c; b[NR - 1] = $f }
                        END { lo = 1; for (i = NR - 10; i < NR; i++) { u += o[i]; s += a[i]; r += b[i]; if (a[i] < lo) lo = a[i] }
                              printf "%.2f%%|%.2f%% (%.2f%%)|%.2f%%", 10 * u, 10 * s, 100 * lo, 10 * r }' "$OUT/$name.csv")
        awk -v t="$title" -v late="$late" '
            /^round/ { for (i = 1; i <= NF; i++) if ($i == "test" && $(i + 1) == "acc") acc = $(i + 2) }
            /^per-class/ { for (i = 1; i <= NF; i++) { if ($i ~ /^1:/) c1 = substr($i, 3); if ($i ~ /^4:/) c4 = substr($i, 3) } }
            /^rounds left out/ { left = $NF; for (i = NF - 1; $i ~ /^[0-9]+$/; i--) left = $i " " left }
            END { split(late, l, "|"); printf "| %s | %s (%s) | %s | %s | %s | %s | %s |\n", t, acc, l[1], c1, l[2], l[3], c4, left }' "$OUT/$name.log"
    done
} > "$OUT/table.md"
cat "$OUT/table.md"

# the charts: overall and class-1 accuracy per round, one for each attack next to the clean mean
here=$(dirname "$0")
for k in 1 2; do
    set --
    while IFS='|' read -r name title flags; do
        case $name in clean-mean|flip$k-*) set -- "$@" "$OUT/$name.csv=$title" ;; esac
    done <<EOF
$RUNS
EOF
    s=s; [ $k -eq 1 ] && s=""
    sh "$here/plot.sh" -o "$OUT/fedavg-attack-$k.png" -y test_acc -y class_acc \
        -t "FedAvg, fedavg_2nn, 5 IID clients, $k of them label flipper$s (1 -> 4); class_acc = class 1" "$@" || exit 1
done
