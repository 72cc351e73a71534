#!/bin/sh
# tools/grade_lab.sh LAB SUBMISSION_DIR [BUILD] - grades a lab of docs/course (LAB: 1, 2, 3 or 4).
# A submission is a directory with
#   labN.csv      the CSV that the lab's graded command wrote (docs/course/lab-N-*.md, "Deliverables")
#   labN.png      the chart drawn from it (tools/plot.sh)
#   answers.txt   the predicted numbers, one "name = value" per line (names in the lab sheet)
#   answers.md    the written answers (graded by hand: only their presence is checked here)
# The CSV must be the run's: its columns and rows are the command's, its traffic column is the figure the
# cost model gives for that command (the library's counters are exact), and its first row matches a fresh,
# shortened run of the same command (BUILD/examples, default build; train_loss within 0.001, test_acc
# within 0.005, as the run is seeded). Any of these failing fails the submission. Each prediction within
# 1% of the key (or 0.001 absolute for numbers below 1) and the chart score one point each; the score is
# printed with what is wrong, and the exit status is 1 below GRADE_PASS percent (default 60), 2 for bad use.
# tools/grade_lab.sh --solve LAB DIR [BUILD] writes a correct submission into DIR (the instructor's key:
# runs the command, writes the key's numbers; the chart needs gnuplot).
solve=0
[ "$1" = --solve ] && { solve=1; shift; }
[ $# -ge 2 ] || { echo "usage: tools/grade_lab.sh [--solve] LAB SUBMISSION_DIR [BUILD]   (LAB: 1, 2, 3 or 4)" >&2; exit 2; }
LAB=$1; DIR=$2; B=${3:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PASS=${GRADE_PASS:-60}
TAB=$(printf '\t')
N=421642                      # SimpleCNN's parameters (ddp, dpsgd --model simplecnn, localsgd)
GRAD=$((4 * N + 8))           # DDP's first all-reduce carries the sample count and the has-data flag too

# Each lab sets: EX (the example), FLAGS (the graded command, whose --epochs/--rounds is RUNS), SHORT (the
# flag that shortens it to one row), COLS (columns that must be there), ROWS, OWN (an awk test over a row:
# the traffic columns against the cost model) and KEY (name TAB value lines: the predictions' answers).
case $LAB in
1)  EX=ddp; FLAGS="--ranks 4 --limit 2048 --epochs 2 --sync flat --algo ring"; SHORT="--epochs 1"; ROWS=2
    COLS="epoch train_loss test_acc comm_s busiest_rank_mb"
    # 2048 / 128 = 16 steps and dt_ddp_join's last round: 17 ring all-reduces of GRAD bytes, 2 (p - 1) / p each
    OWN="busiest_rank_mb $(awk -v g=$GRAD 'BEGIN { printf "%.3f", 17 * 2 * 3 / 4 * g / 1e6 }')"
    KEY="ring_bytes_per_rank${TAB}7000000
ps_root_bytes${TAB}28000000
tree_root_bytes${TAB}12000000
ring_tree_crossover_bytes${TAB}188235
lab_mb_per_epoch${TAB}$(awk -v g=$GRAD 'BEGIN { printf "%.3f", 17 * 1.5 * g / 1e6 }')" ;;
2)  EX=dpsgd; FLAGS="--ranks 4 --model simplecnn --pad-to 0 --limit 1024 --epochs 2 --lr 0.05 --wd 0 --topology ring"
    SHORT="--epochs 1"; ROWS=2
    COLS="epoch train_loss test_acc consensus busiest_rank_mb"
    # 1024 / (4 x 32) = 8 steps; each sends the replica to both ring neighbours
    OWN="busiest_rank_mb $(awk -v n=$N 'BEGIN { printf "%.3f", 8 * 2 * 4 * n / 1e6 }')"
    KEY="gap_ring_8${TAB}$(awk 'BEGIN { printf "%.4f", 2 / 3 * (1 - cos(2 * atan2(0, -1) / 8)) }')
gap_ring_16${TAB}$(awk 'BEGIN { printf "%.4f", 2 / 3 * (1 - cos(2 * atan2(0, -1) / 16)) }')
gap_exponential_16${TAB}0.5
lab_mb_per_epoch${TAB}$(awk -v n=$N 'BEGIN { printf "%.3f", 8 * 2 * 4 * n / 1e6 }')
exponential_mb_per_epoch_p8${TAB}$(awk -v n=$N 'BEGIN { printf "%.3f", 32 * 5 * 4 * n / 1e6 }')" ;;
3)  EX=fedavg; FLAGS="--ranks 3 --clients 10 --frac 0.5 --rounds 3 --local-epochs 1 --batch 10 --partition iid --limit 2000"
    SHORT="--rounds 1"; ROWS=3
    COLS="round selected train_loss test_acc"
    OWN="selected 5"
    KEY="clients_per_round${TAB}5
local_steps_per_round${TAB}20
server_bytes_per_round${TAB}$((2 * 5 * 4 * 199210))
trimmed_dropped_per_side${TAB}0
krum_max_f${TAB}1" ;;
4)  EX=localsgd; FLAGS="--ranks 4 --limit 2048 --epochs 2 --period 4"; SHORT="--epochs 1"; ROWS=2
    COLS="epoch train_loss test_acc averages busiest_rank_mb"
    # 16 steps: an average every 4 and one at the epoch's end, each a ring all-reduce of the parameters
    OWN="averages 5 busiest_rank_mb $(awk -v n=$N 'BEGIN { printf "%.3f", 5 * 1.5 * 4 * n / 1e6 }')"
    KEY="averages_per_epoch${TAB}5
lab_mb_per_epoch${TAB}$(awk -v n=$N 'BEGIN { printf "%.3f", 5 * 1.5 * 4 * n / 1e6 }')
averages_per_epoch_h8_8192${TAB}9
mb_per_epoch_h1_8192${TAB}$(awk -v n=$N 'BEGIN { printf "%.3f", 65 * 1.5 * 4 * n / 1e6 }')
hogwild_overlap_s100_d1e6${TAB}0.01" ;;
*)  echo "tools/grade_lab.sh: no lab '$LAB': the labs are 1, 2, 3 and 4 (docs/course)" >&2; exit 2 ;;
esac
case $B in /*) ;; *) B=$ROOT/$B ;; esac
[ -x "$B/examples/$EX" ] || { echo "tools/grade_lab.sh: $B/examples/$EX is not built: run make examples" >&2; exit 2; }

if [ $solve -eq 1 ]; then   # the key: the command's run, the predictions, the chart
    mkdir -p "$DIR" || exit 2
    "$B/examples/$EX" $FLAGS --csv "$DIR/lab$LAB.csv" > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log"; exit 1; }
    printf '%s\n' "$KEY" | sed "s/$TAB/ = /" > "$DIR/answers.txt"
    echo "(the written answers: docs/course/answer-key.md)" > "$DIR/answers.md"
    sh "$ROOT/tools/plot.sh" -o "$DIR/lab$LAB.png" -y train_loss -y test_acc "$DIR/lab$LAB.csv=lab $LAB" ||
        echo "tools/grade_lab.sh: no chart drawn (gnuplot?)" >&2
    exit 0
fi

[ -d "$DIR" ] || { echo "tools/grade_lab.sh: no submission directory $DIR" >&2; exit 2; }
CSV=$DIR/lab$LAB.csv
bad=0; score=0; total=0
wrong() { echo "WRONG $1"; }
right() { echo "ok    $1"; }
# column NAME of row ROW (1 = the first data row) of CSV FILE, or nothing
cell() { awk -F, -v c="$2" -v r="$3" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i; next }
                                      NR == r + 1 && k { print $k }' "$1"; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= t) }'; }

echo "lab $LAB: $CSV, the run of ./build/examples/$EX $FLAGS"
if [ ! -s "$CSV" ]; then
    wrong "$CSV is missing or empty: run the lab's graded command with --csv $CSV"; bad=1
else
    head=$(head -n 1 "$CSV" | tr -d '\r')
    for c in $COLS; do
        case ",$head," in *",$c,"*) ;; *) wrong "the CSV has no column $c (its header: $head): is it ./build/examples/$EX's?"; bad=1 ;; esac
    done
    rows=$(($(wc -l < "$CSV") - 1))
    if [ "$rows" -ne $ROWS ]; then wrong "the CSV has $rows rows; the graded command writes $ROWS"; bad=1
    else right "columns and $ROWS rows"; fi
fi
if [ $bad -eq 0 ]; then
    # the traffic each row reports is what the cost model gives for the command: exactly, up to the CSV's rounding
    set -- $OWN
    while [ $# -ge 2 ]; do
        r=1; ok=1
        while [ $r -le $ROWS ]; do
            v=$(cell "$CSV" "$1" $r)
            near "$v" "$2" 0.0015 || { wrong "row $r's $1 is '$v'; the command's run gives $2"; ok=0; bad=1; }
            r=$((r + 1))
        done
        [ $ok -eq 1 ] && right "$1 is $2 in every row, as the command gives"
        shift 2
    done
    # the first row against a fresh run of the command, shortened to that row
    T=$(mktemp -d) || exit 2
    short=$(printf '%s\n' "$FLAGS" | sed "s#${SHORT% *} [^ ]*#$SHORT#")
    if ! "$B/examples/$EX" $short --csv "$T/rerun.csv" > "$T/log" 2>&1; then
        cat "$T/log"; echo "tools/grade_lab.sh: the re-run failed" >&2; rm -rf "$T"; exit 2
    fi
    for ct in train_loss:0.001 test_acc:0.005; do
        c=${ct%:*}; t=${ct#*:}
        v=$(cell "$CSV" $c 1); w=$(cell "$T/rerun.csv" $c 1)
        if near "$v" "$w" "$t"; then right "row 1's $c $v: a re-run gives $w (tolerance $t)"
        else wrong "row 1's $c is '$v', but a re-run of the command gives $w (tolerance $t)"; bad=1; fi
    done
    rm -rf "$T"
fi

# the predictions: one point each
ANS=$DIR/answers.txt
[ -f "$ANS" ] || wrong "no $ANS: write the predictions as 'name = value' lines"
KEYF=$(printf '%s\n' "$KEY")
OLDIFS=$IFS; IFS=$TAB
while read -r name want; do
    IFS=$OLDIFS
    total=$((total + 1))
    got=$( [ -f "$ANS" ] && sed -n "s/^[ $TAB]*$name[ $TAB]*=[ $TAB]*\([^ $TAB]*\).*/\1/p" "$ANS" | tr -d ',_' | head -n 1)
    tol=$(awk -v w="$want" 'BEGIN { a = w < 0 ? -w : w; print a < 1 ? 0.001 : a / 100 }')
    if [ -z "$got" ]; then wrong "prediction $name: missing from answers.txt"
    elif near "$got" "$want" "$tol"; then right "prediction $name = $got"; score=$((score + 1))
    else wrong "prediction $name = $got: the key says $want (tolerance $tol; see the lab sheet's hint)"; fi
    IFS=$TAB
done <<EOF
$KEYF
EOF
IFS=$OLDIFS
total=$((total + 1))
if [ "$(head -c 4 "$DIR/lab$LAB.png" 2>/dev/null | tail -c 3)" = PNG ]; then right "the chart lab$LAB.png"; score=$((score + 1))
else wrong "no chart: lab$LAB.png is missing or not a PNG (tools/plot.sh -o $DIR/lab$LAB.png ...)"; fi
if [ -s "$DIR/answers.md" ]; then echo "note  answers.md is there: the written answers are graded by hand"
else echo "note  no answers.md: the written answers are missing"; fi

pct=$((100 * score / total))
echo "score $score/$total ($pct%), pass mark $PASS%"
if [ $bad -ne 0 ]; then echo "FAIL: the CSV is not the output of the lab's graded command (see WRONG above)"; exit 1; fi
if [ $pct -lt "$PASS" ]; then echo "FAIL: below the pass mark"; exit 1; fi
echo "PASS"
