#!/bin/sh
# tools/grade_lab.sh LAB SUBMISSION_DIR [BUILD] - grades a lab of docs/course (LAB: 1 to 5) for the student whose id
# is in SUBMISSION_DIR/student_id.
# Each student has parameters of their own, drawn from small sets by a hash of "labN:ID:NAME" (cksum's CRC: POSIX,
# the same on every machine): the graded command's ranks, size and seed, and the sizes, ranks and rates each
# prediction asks about. The key is computed for them: the predictions and the CSV's traffic from the cost
# formulas, the CSV's losses by re-running the command. So a submission copied from another student fails: its CSV
# is another command's run, and its predictions answer other questions.
#   tools/grade_lab.sh --params LAB ID                  the id's graded command and what each prediction asks
#   tools/grade_lab.sh --key LAB ID                     the id's answers.txt, as the key computes it (runs nothing)
#   tools/grade_lab.sh --solve LAB DIR [BUILD] [ID]      writes the id's correct submission into DIR (the instructor's
#       key: runs the command, writes the key's numbers; the chart needs gnuplot); ID defaults to DIR/student_id
# A submission is a directory with
#   student_id    the student's id, one line: letters, digits, '.', '_' and '-', at most 64 (not "example", the id
#                 of the lab sheets' worked example)
#   labN.csv      the CSV that the id's graded command wrote (--params prints the command)
#   labN.png      the chart drawn from it (tools/plot.sh)
#   answers.txt   the predicted numbers, one "name = value" per line (names in the lab sheet and --params)
#   answers.md    the written answers (graded by hand: only their presence is checked here)
# A student_id that is missing, empty or not one id fails the submission, saying what to write. The files are read
# as a student's editor may save them: CR line ends, a byte-order mark, blank lines, no final newline and blanks
# around values and separators are accepted. The CSV must be the run's: its columns and rows are the command's,
# every graded value in every row is a number, its traffic columns are the figures the cost model gives for that
# command (the library's counters are exact), and every row matches a fresh run of the same command
# (BUILD/examples, default build; train_loss within 0.001, test_acc within 0.005, as the run is seeded). Any of
# these failing fails the submission. Each prediction within 1% of the key (or 0.001 absolute for numbers below
# 1) and the chart (a whole PNG: its signature, a non-empty IHDR, IEND at the end) score one point each. A
# prediction that is not one number that reads one way ("none", "?", nothing, "28000000 (or 7000000?)",
# "28 000 000", "0,5", or two lines giving two values) scores 0, with a message naming its line and what to write;
# "28,000,000" (commas between groups of three digits) is read as 28000000.
# The score is printed with what is wrong; SUBMISSION_DIR/results.json (or GRADE_RESULTS=PATH, e.g.
# /autograder/results/results.json) gets it in Gradescope's format, a test per check (the CSV's and the id's worth
# 0 points: they gate; the score is 0 when either fails), and the last line of output is Autolab's
# {"scores": {"labN": SCORE}}. The exit status is 1 below GRADE_PASS percent (default 60), for a CSV that is not
# the run's or an id that is not one, 2 for bad use.
# GRADE_RERUN_DIR=DIR keeps each fresh run in DIR/labN-CRC.csv, CRC the cksum of its command's flags, and uses it
# again when it is there (the run is seeded: one run serves every submission of those parameters, and
# tests/grade_lab_test.sh's many cases).
mode=grade
case $1 in --solve) mode=solve; shift ;; --params) mode=params; shift ;; --key) mode=key; shift ;; esac
usage() {
    echo "usage: tools/grade_lab.sh LAB SUBMISSION_DIR [BUILD]          grade (the id: SUBMISSION_DIR/student_id)
       tools/grade_lab.sh --params LAB ID                    the id's graded command and predictions
       tools/grade_lab.sh --key LAB ID                       the id's predictions' answers
       tools/grade_lab.sh --solve LAB DIR [BUILD] [ID]       the id's correct submission   (LAB: 1 to 5)" >&2
    exit 2
}
[ $# -ge 2 ] || usage
LAB=$1
if [ $mode = params ] || [ $mode = key ]; then ID=$2; B=build; [ $# -eq 2 ] || usage
else DIR=$2; B=${3:-build}; ID=${4:-}; [ $# -le 3 ] || [ $mode = solve ] || usage; fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PASS=${GRADE_PASS:-60}
TAB=$(printf '\t')
N=421642                      # SimpleCNN's parameters (ddp, dpsgd --model simplecnn, localsgd)
GRAD=$((4 * N + 8))           # DDP's first all-reduce carries the sample count and the has-data flag too
# what a student wrote, fit to be quoted: printable ASCII, at most 60 characters
quote() { printf '%s' "$1" | LC_ALL=C tr -c ' -~' '?' | cut -c 1-60; }

NL='
'
# The id: from the command line (--params, --solve) or SUBMISSION_DIR/student_id, read as an editor may save it
# (CR, byte-order mark, blanks around it, blank lines). idwhy ID: nothing when ID is one, else what is wrong.
idwhy() {
    case $1 in
    '') echo "is empty" ;;
    *"$NL"*) echo "has more than one line" ;;
    *[!A-Za-z0-9._-]*|[._-]*) echo "holds '$(quote "$1")': an id is letters, digits, '.', '_' and '-', a letter or digit first" ;;
    *) [ ${#1} -le 64 ] || echo "holds an id of ${#1} characters: at most 64" ;;
    esac
}
idfile() { LC_ALL=C awk '{ gsub(/\r/, ""); if (NR == 1) sub(/^\357\273\277/, ""); sub(/^[ \t]+/, ""); sub(/[ \t]+$/, "") } $0 != ""' "$1"; }
IDBAD=""
if { [ $mode = grade ] || [ $mode = solve ]; } && [ -z "$ID" ]; then
    if [ -f "$DIR/student_id" ]; then ID=$(idfile "$DIR/student_id"); why=$(idwhy "$ID")
        [ -z "$why" ] || IDBAD="$DIR/student_id $why"
    else IDBAD="there is no $DIR/student_id"; fi
    [ -n "$IDBAD" ] && IDBAD="$IDBAD: write your student id into it, one line (echo YOUR_ID > $DIR/student_id)"
    [ $mode = grade ] && [ -z "$IDBAD" ] && [ "$ID" = example ] &&
        IDBAD="$DIR/student_id is 'example', the lab sheets' worked example, no student's: write your own id into it (echo YOUR_ID > $DIR/student_id), and run your parameters (tools/grade_lab.sh --params $LAB YOUR_ID)"
else
    why=$(idwhy "$ID"); [ -z "$why" ] || { echo "tools/grade_lab.sh: the id $why" >&2; exit 2; }
fi
[ $mode = solve ] && [ -n "$IDBAD" ] && { echo "tools/grade_lab.sh --solve: $IDBAD, or give the id after BUILD" >&2; exit 2; }
ID=${ID:-none}   # a refused id: the lab's parameters are drawn for no one, and nothing is run

# hnum NAME K: the student's number in 0 .. K-1 for NAME (the CRC of "labLAB:ID:NAME" modulo K)
hnum() { printf '%s' "lab$LAB:$ID:$1" | cksum | awk -v k="$2" '{ print $1 % k }'; }
# pick NAME EX VALUE...: the student's VALUE for NAME; the sheets' id, example, gets EX. The EXs make the tutorial's
# worked examples and graded runs of sizes no student gets (a batch or a rate may be a student's too, not the whole
# question): the sheets and the chapters may print their answers, which no student is asked, small counts such as
# Krum's f aside.
pick() {
    n=$1; ex=$2; shift 2
    if [ "$ID" = example ]; then printf '%s\n' "$ex"; return; fi
    i=$(($(hnum "$n" $#) + 1)); eval "printf '%s\n' \"\${$i}\""
}
SEED=$(pick seed 0 $(($(hnum seed 999) + 1)))

# Each lab sets: EX (the example), SHEET, FLAGS (the graded command), COLS (columns that must be there and hold
# numbers), ROWS (the rows it writes), OWN (column value pairs: the traffic columns against the cost model, in
# every row), KEY (name TAB value lines: the predictions' answers) and ASK (name TAB what it asks, for --params).
# The graded runs take 32 samples a rank a step and S steps an epoch: an even share for every rank and count.
case $LAB in
1)  EX=ddp; SHEET=lab-1-ddp.md; ROWS=2; COLS="epoch train_loss test_acc comm_s busiest_rank_mb"
    P=$(pick ranks 4 3 4 6); S=$(pick steps 8 12 14 16)
    FLAGS="--ranks $P --batch $((32 * P)) --limit $((32 * P * S)) --epochs 2 --sync flat --algo ring --seed $SEED"
    # S steps and dt_ddp_join's last round: S + 1 ring all-reduces of GRAD bytes, 2 (P - 1) / P of it from each rank
    MB=$(awk -v s=$S -v p=$P -v g=$GRAD 'BEGIN { printf "%.3f", (s + 1) * 2 * (p - 1) / p * g / 1e6 }')
    OWN="busiest_rank_mb $MB"
    n=$(pick n 4000000 2000000 5000000 6000000 9000000 10000000); p=$(pick p 8 5 6 7 10 12)
    a=$(pick alpha 0.001 0.0005 0.001 0.002); b=$(pick beta 1e-8 5e-9 1e-8 2e-8)
    KEY=$(awk -v n=$n -v p=$p -v a=$a -v b=$b -v mb=$MB 'BEGIN {
        c = 0; while (2 ^ c < p) c++   # the binomial tree: ceil(log2 p) rounds, the root sending n in each
        printf "ring_bytes_per_rank\t%.0f\nps_root_bytes\t%.0f\ntree_root_bytes\t%.0f\n", 2 * (p - 1) / p * n, (p - 1) * n, c * n
        # 2 (p - 1) (a + n b / p) = 2 c (a + n b)
        printf "ring_tree_crossover_bytes\t%.0f\nlab_mb_per_epoch\t%s\n", (p - 1 - c) * a / ((c - (p - 1) / p) * b), mb }')
    ASK="ring_bytes_per_rank${TAB}n = $n bytes, p = $p ranks
ps_root_bytes${TAB}n = $n bytes, p = $p ranks
tree_root_bytes${TAB}n = $n bytes, p = $p ranks
ring_tree_crossover_bytes${TAB}p = $p ranks, alpha = $a s, beta = $b s per byte
lab_mb_per_epoch${TAB}the graded run" ;;
2)  EX=dpsgd; SHEET=lab-2-dpsgd.md; ROWS=2; COLS="epoch train_loss test_acc consensus busiest_rank_mb"
    P=$(pick ranks 4 3 4 5 6); S=$(pick steps 4 6 8 10)
    FLAGS="--ranks $P --model simplecnn --pad-to 0 --limit $((32 * P * S)) --epochs 2 --lr 0.05 --wd 0 --topology ring --seed $SEED"
    # S steps; each sends the replica to both ring neighbours
    MB=$(awk -v s=$S -v n=$N 'BEGIN { printf "%.3f", s * 2 * 4 * n / 1e6 }')
    OWN="busiest_rank_mb $MB"
    p1=$(pick ring_small 8 5 6 7 9 10); p2=$(pick ring_large 16 12 20 24 40 48); q=$(pick exponential 16 32 128 512 1024)
    q2=$(pick exp_ranks 8 16 32); l2=$(pick exp_images 8192 8192 16384)
    KEY=$(awk -v p1=$p1 -v p2=$p2 -v q=$q -v q2=$q2 -v l2=$l2 -v n=$N -v mb=$MB 'BEGIN { pi = atan2(0, -1)
        printf "gap_ring_small\t%.4f\ngap_ring_large\t%.4f\n", 2 / 3 * (1 - cos(2 * pi / p1)), 2 / 3 * (1 - cos(2 * pi / p2))
        printf "gap_exponential\t%.4f\nlab_mb_per_epoch\t%s\n", 2 / (log(q) / log(2)), mb
        # l2 / (32 q2) steps, each sending the replica to the 2 log2 q2 - 1 neighbours
        printf "exponential_mb_per_epoch\t%.3f\n", l2 / (32 * q2) * (2 * log(q2) / log(2) - 1) * 4 * n / 1e6 }')
    ASK="gap_ring_small${TAB}a ring of $p1 ranks, uniform weights
gap_ring_large${TAB}a ring of $p2 ranks, uniform weights
gap_exponential${TAB}the exponential graph on $q ranks, uniform weights
lab_mb_per_epoch${TAB}the graded run
exponential_mb_per_epoch${TAB}$q2 ranks on the exponential graph, $l2 images, batch 32 a rank" ;;
3)  EX=fedavg; SHEET=lab-3-fedavg.md; ROWS=3; COLS="round selected train_loss test_acc"
    kc=$(pick clients 10:0.5 8:0.5 12:0.25 12:0.5 8:0.75 10:0.3 10:0.7 16:0.25); K=${kc%:*}; C=${kc#*:}
    nk=$(pick per_client 200 150 200 250); Bt=$(pick batch 10 10 25 50); E=$(pick local_epochs 1 1 2); t=$(pick trim 0.1 0.1 0.2 0.25 0.3)
    FLAGS="--ranks 3 --clients $K --frac $C --rounds 3 --local-epochs $E --batch $Bt --partition iid --limit $((K * nk)) --seed $SEED"
    m=$(awk -v k=$K -v c=$C 'BEGIN { printf "%d", int(c * k + 0.5) }')   # every pair's C K is a whole number
    OWN="selected $m"
    KEY=$(awk -v m=$m -v e=$E -v nk=$nk -v b=$Bt -v t=$t 'BEGIN {
        printf "clients_per_round\t%d\nlocal_steps_per_round\t%d\n", m, e * nk / b
        printf "server_bytes_per_round\t%d\n", 2 * m * 4 * 199210   # the model out to m clients, m updates in
        printf "trimmed_dropped_per_side\t%d\nkrum_max_f\t%d\n", int(t * m + 1e-9), int((m - 3) / 2) }')
    ASK="clients_per_round${TAB}the graded run
local_steps_per_round${TAB}the graded run: one sampled client
server_bytes_per_round${TAB}the graded run: models out, updates in (fedavg_2nn, 199,210 parameters)
trimmed_dropped_per_side${TAB}--trim $t, the graded run's reports in a round
krum_max_f${TAB}the graded run's reports in a round" ;;
4)  EX=localsgd; SHEET=lab-4-localsgd-hogwild.md; ROWS=2; COLS="epoch train_loss test_acc averages busiest_rank_mb"
    P=$(pick ranks 2 3 4 6); S=$(pick steps 16 12 14 16); H=$(pick period 4 3 4 5)
    FLAGS="--ranks $P --limit $((32 * P * S)) --epochs 2 --period $H --seed $SEED"
    # an average every H steps and one at the epoch's end, each a ring all-reduce of the parameters
    A=$((S / H + 1))
    MB=$(awk -v a=$A -v p=$P -v n=$N 'BEGIN { printf "%.3f", a * 2 * (p - 1) / p * 4 * n / 1e6 }')
    OWN="averages $A busiest_rank_mb $MB"
    l2=$(pick images 8192 4096 6144 12288 16384); h2=$(pick period_big 8 3 5 7 10); s=$(pick hog_s 100 200 500 1000 2000); d=$(pick hog_d 1000000 100000 1000000)
    KEY=$(awk -v a=$A -v mb=$MB -v l2=$l2 -v h2=$h2 -v s=$s -v d=$d -v n=$N 'BEGIN { st = l2 / 128
        printf "averages_per_epoch\t%d\nlab_mb_per_epoch\t%s\naverages_per_epoch_big\t%d\n", a, mb, int(st / h2) + 1
        printf "mb_per_epoch_every_step\t%.3f\nhogwild_overlap\t%g\n", (st + 1) * 1.5 * 4 * n / 1e6, s * s / d }')
    ASK="averages_per_epoch${TAB}the graded run
lab_mb_per_epoch${TAB}the graded run
averages_per_epoch_big${TAB}4 ranks, batch 32 a rank, $l2 images, --period $h2
mb_per_epoch_every_step${TAB}4 ranks, batch 32 a rank, $l2 images, --period 1
hogwild_overlap${TAB}two sparse updates of s = $s of d = $d coordinates" ;;
5)  EX=ddp; SHEET=lab-5-compression.md; ROWS=2; COLS="epoch train_loss test_acc comm_s busiest_rank_mb"
    P=$(pick ranks 4 3 4 6); S=$(pick steps 8 12 14 16); R=$(pick ratio 0.01 0.002 0.005 0.02 0.05)
    FLAGS="--ranks $P --batch $((32 * P)) --limit $((32 * P * S)) --epochs 2 --compress topk:$R --seed $SEED"
    # SimpleCNN's two buckets (fc2 and fc1, then the convolutions): k = ceil(R x floats) pairs of 8 bytes each, and
    # the two sample counts (8 bytes), all-gathered: P - 1 times each from every rank. A step sends both buckets,
    # dt_ddp_join's last round the first alone.
    KEY=$(awk -v p=$P -v s=$S -v r=$R -v n=$N 'BEGIN {
        k1 = r * 402826; if (k1 > int(k1)) k1 = int(k1) + 1; k2 = r * 18816; if (k2 > int(k2)) k2 = int(k2) + 1
        printf "topk_pairs_per_step\t%d\n", k1 + k2
        printf "lab_mb_per_epoch\t%.3f\n", (s * (p - 1) * (8 * (k1 + k2) + 16) + (p - 1) * (8 * k1 + 8)) / 1e6 }')
    MB=$(printf '%s\n' "$KEY" | awk -F "$TAB" '$1 == "lab_mb_per_epoch" { print $2 }')
    OWN="busiest_rank_mb $MB"
    r=$(pick powersgd_rank 2 1 3 5 8); c=$(pick topk_ratio 0.01 0.02 0.025 0.04 0.05); ps=$(pick hier 8:4 6:3 9:3 12:3 12:4 16:4 16:8)
    hc=$(pick hier_count 269722 100000 250000 500000); q=$(pick one_peer_ranks 8 4 16 32); l3=$(pick one_peer_images 4096 6144 12288)
    KEY="$KEY
$(awk -v r=$r -v c=$c -v hp=${ps%:*} -v hs=${ps#*:} -v hc=$hc -v q=$q -v l3=$l3 -v n=$N 'BEGIN {
        # sum of rows + cols over SimpleCNN'"'"'s 4 weight matrices, r floats each, and the 234 biases whole
        printf "powersgd_floats_per_step\t%d\n", 3795 * r + 234
        printf "topk_break_even_ranks\t%g\n", 1 / c   # (p - 1) 8 c n = 2 (p - 1) / p 4 n
        L = hp / hs; printf "hier_port_bytes\t%.0f\n", 2 * (L - 1) / L * 4 * hc   # the ring among the L leaders
        printf "one_peer_mb_per_epoch\t%.3f\n", l3 / (32 * q) * 4 * n / 1e6 }')"
    ASK="topk_pairs_per_step${TAB}the graded run: pairs a rank sends per step, both buckets
lab_mb_per_epoch${TAB}the graded run
powersgd_floats_per_step${TAB}--compress powersgd:$r, floats a rank contributes per step
topk_break_even_ranks${TAB}--compress topk:$c against fp32's ring
hier_port_bytes${TAB}${ps%:*} ranks in nodes of ${ps#*:}, --algo hier, $hc floats: bytes through a node's port
one_peer_mb_per_epoch${TAB}$q ranks, --topology one-peer-exp, $l3 images, batch 32 a rank" ;;
*)  echo "tools/grade_lab.sh: no lab '$LAB': the labs are 1, 2, 3, 4 and 5 (docs/course)" >&2; exit 2 ;;
esac
RUN="./build/examples/$EX $FLAGS --csv build/course/lab$LAB/lab$LAB.csv"

if [ $mode = params ]; then
    echo "lab $LAB for $ID (docs/course/$SHEET)"
    echo "graded run:"
    echo "  $RUN"
    echo "predictions, into build/course/lab$LAB/answers.txt:"
    printf '%s\n' "$ASK" | awk -F "$TAB" '{ printf "  %-26s %s\n", $1, $2 }'
    exit 0
fi
[ $mode = key ] && { printf '%s\n' "$KEY" | sed "s/$TAB/ = /"; exit 0; }
case $B in /*) ;; *) B=$ROOT/$B ;; esac
[ -x "$B/examples/$EX" ] || { echo "tools/grade_lab.sh: $B/examples/$EX is not built: run make examples" >&2; exit 2; }

if [ $mode = solve ]; then   # the key: the id, the command's run, the predictions, the chart
    mkdir -p "$DIR" || exit 2
    echo "$ID" > "$DIR/student_id"
    "$B/examples/$EX" $FLAGS --csv "$DIR/lab$LAB.csv" > "$DIR/run.log" 2>&1 || { cat "$DIR/run.log"; exit 1; }
    printf '%s\n' "$KEY" | sed "s/$TAB/ = /" > "$DIR/answers.txt"
    echo "(the written answers: docs/course/answer-key.md)" > "$DIR/answers.md"
    sh "$ROOT/tools/plot.sh" -o "$DIR/lab$LAB.png" -y train_loss -y test_acc "$DIR/lab$LAB.csv=lab $LAB" ||
        echo "tools/grade_lab.sh: no chart drawn (gnuplot?)" >&2
    exit 0
fi

[ -d "$DIR" ] || { echo "tools/grade_lab.sh: no submission directory $DIR" >&2; exit 2; }
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT
trap 'exit 2' INT TERM HUP
JSON=${GRADE_RESULTS:-$DIR/results.json}
CSV=$DIR/lab$LAB.csv
ANS=$DIR/answers.txt
# answers.txt as the grader reads it: without CR and byte-order mark, its lines where they were
[ -f "$ANS" ] && LC_ALL=C awk '{ gsub(/\r/, ""); if (NR == 1) sub(/^\357\273\277/, "") } 1' "$ANS" > "$T/answers.txt"
bad=0; score=0; total=0
: > "$T/tests"
# result STATUS POINTS MAX NAME MESSAGE: a line of the report ("ok" or "WRONG") and a test of results.json;
# the CSV's checks are worth 0 points (they gate the submission), a prediction and the chart 1 each; a sixth
# argument keeps the line out of the report (results.json only)
result() {
    if [ -n "$6" ]; then :; elif [ "$1" = passed ]; then echo "ok    $5"; else echo "WRONG $5"; fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$T/tests"
}
right() { result passed 0 0 "$1" "$2"; }
wrong() { result failed 0 0 "$1" "$2"; bad=1; }
# the submission's files as the grader reads them: no CR (a file saved on Windows), no UTF-8 byte-order mark,
# no blanks around a value or a separator, no blank lines, and a final newline whether or not the file had one
norm() { LC_ALL=C awk '{ gsub(/\r/, ""); if (NR == 1) sub(/^\357\273\277/, "")
                         gsub(/[ \t]*,[ \t]*/, ","); sub(/^[ \t]+/, ""); sub(/[ \t]+$/, "") } $0 != ""' "$1"; }
# column NAME of row ROW (1 = the first data row) of a normalised CSV FILE, or nothing
cell() { awk -F, -v c="$2" -v r="$3" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i; next }
                                      NR == r + 1 && k { print $k }' "$1"; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= t) }'; }
# a number as the examples write it, and as a prediction may be written: digits, a point, an exponent
NUM='^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'
isnum() { printf '%s\n' "$1" | LC_ALL=C grep -Eq "$NUM"; }

if [ -n "$IDBAD" ]; then   # whose parameters? nothing can be graded
    echo "lab $LAB: $DIR"
    wrong student_id "$IDBAD"
elif [ ! -s "$CSV" ]; then
    echo "lab $LAB for $ID: $CSV, the run of ./build/examples/$EX $FLAGS"
    wrong csv "$CSV is missing or empty: run the lab's graded command with --csv $CSV"
else
    echo "lab $LAB for $ID: $CSV, the run of ./build/examples/$EX $FLAGS"
    norm "$CSV" > "$T/lab.csv"
    head=$(head -n 1 "$T/lab.csv")
    for c in $COLS; do
        case ",$head," in *",$c,"*) ;; *) wrong "csv column $c" "the CSV has no column $c (its header: $(quote "$head")): is it ./build/examples/$EX's?" ;; esac
    done
    rows=$(($(wc -l < "$T/lab.csv") - 1))
    if [ "$rows" -ne $ROWS ]; then wrong "csv rows" "the CSV has $rows rows; the graded command writes $ROWS"
    else right "csv rows" "columns and $ROWS rows"; fi
fi
if [ $bad -eq 0 ]; then
    # every value the grader reads is a number as the program prints it, in every row: a cell edited into
    # "0. 5", "n/a" or "1,234" is refused, naming the row and column, and not read as some other number
    ok=1; r=1
    while [ $r -le $ROWS ]; do
        first=$(sed -n "$((r + 1))s/,.*//p" "$T/lab.csv")
        [ "$first" = $r ] || { wrong "csv row $r" "row $r's ${head%%,*} is '$(quote "$first")': the command numbers its rows 1 to $ROWS; write the CSV as it wrote it"; ok=0; }
        for c in $COLS; do
            v=$(cell "$T/lab.csv" $c $r)
            isnum "$v" || { wrong "csv row $r $c" "row $r, column $c: '$(quote "$v")' is not a number: write the value as the command printed it (digits and a point, no spaces, words or thousands separators), or re-run it with --csv"; ok=0; }
        done
        r=$((r + 1))
    done
    [ $ok -eq 1 ] && right "csv numbers" "every value of the graded columns is a number, rows numbered 1 to $ROWS"
fi
if [ $bad -eq 0 ]; then
    # the traffic each row reports is what the cost model gives for the command: exactly, up to the CSV's rounding
    set -- $OWN
    while [ $# -ge 2 ]; do
        r=1; ok=1
        while [ $r -le $ROWS ]; do
            v=$(cell "$T/lab.csv" "$1" $r)
            near "$v" "$2" 0.0015 || { wrong "csv row $r $1" "row $r's $1 is '$(quote "$v")'; the command's run gives $2"; ok=0; }
            r=$((r + 1))
        done
        [ $ok -eq 1 ] && right "csv $1" "$1 is $2 in every row, as the command gives"
        shift 2
    done
fi
if [ $bad -eq 0 ]; then
    # every row against a fresh run of the whole command (it is seeded: the losses repeat up to rounding), or
    # the one GRADE_RERUN_DIR keeps for these flags
    KEPT=${GRADE_RERUN_DIR:-}/lab$LAB-$(printf '%s' "$FLAGS" | cksum | cut -d ' ' -f 1).csv
    if [ -n "${GRADE_RERUN_DIR:-}" ] && [ -s "$KEPT" ]; then cp "$KEPT" "$T/rerun.csv"
    elif ! "$B/examples/$EX" $FLAGS --csv "$T/rerun.csv" > "$T/log" 2>&1; then
        cat "$T/log"; echo "tools/grade_lab.sh: the re-run failed" >&2; exit 2
    elif [ -n "${GRADE_RERUN_DIR:-}" ]; then mkdir -p "$GRADE_RERUN_DIR" && cp "$T/rerun.csv" "$KEPT"
    fi
    r=1
    while [ $r -le $ROWS ]; do
        for ct in train_loss:0.001 test_acc:0.005; do
            c=${ct%:*}; t=${ct#*:}
            v=$(cell "$T/lab.csv" $c $r); w=$(cell "$T/rerun.csv" $c $r)
            if near "$v" "$w" "$t"; then right "csv row $r $c" "row $r's $c $v: a re-run gives $w (tolerance $t)"
            else wrong "csv row $r $c" "row $r's $c is '$(quote "$v")', but a re-run of the command gives $w (tolerance $t)"; fi
        done
        r=$((r + 1))
    done
fi

# answer NAME: NAME's value in answers.txt as one line: "ok NUMBER", "missing", or "refused WHY" when it is
# not one number that reads one way ("none", "?", "28000000 (or 7000000?)", "28 000 000", "0,5", two lines)
answer() {
    [ -f "$T/answers.txt" ] || { echo missing; return; }
    LC_ALL=C awk -v name="$1" -v num="$NUM" -v sq="'" '
    function q(s) { gsub(/[^ -~]/, "?", s); return length(s) > 60 ? substr(s, 1, 57) "..." : s }
    (i = index($0, "=")) > 0 {
        k = substr($0, 1, i - 1); v = substr($0, i + 1)
        gsub(/^[ \t]+|[ \t]+$/, "", k); gsub(/^[ \t]+|[ \t]+$/, "", v)
        if (k != name) next
        if (++n == 1) { first = v; line = NR } else if (v != first && !again) { again = NR; second = v }
    }
    END {
        at = "answers.txt line " line ", " name
        what = "write one number, digits with a point for decimals, as in " name " = 1234.5"
        if (!n) { print "missing"; exit }
        if (again) { printf "refused %s: line %d gives it again as %s: give one value, once\n", at, again, sq q(second) sq; exit }
        v = first
        if (v == "") { printf "refused %s: no value: %s\n", at, what; exit }
        if (v ~ num) { print "ok " v; exit }
        # thousands separated by commas or underscores in groups of three read one way: 28,000,000
        if (v ~ /^[-+]?[0-9][0-9]?[0-9]?(,[0-9][0-9][0-9])+([.][0-9]+)?$/ || v ~ /^[-+]?[0-9][0-9]?[0-9]?(_[0-9][0-9][0-9])+([.][0-9]+)?$/) {
            gsub(/[,_]/, "", v); print "ok " v; exit
        }
        w = v; gsub(/[ \t]/, "", w)
        if (w ~ num) { printf "refused %s: %s%s%s has spaces inside the number (read up to its first space it is %s): write %s\n", at, sq, q(v), sq, q(substr(v, 1, index(v, " ") - 1)), q(w); exit }
        if (v ~ /^[-+]?[0-9][0-9.,_ ]*$/) { printf "refused %s: %s%s%s has separators that read more than one way: %s (a comma only between groups of three digits)\n", at, sq, q(v), sq, what; exit }
        printf "refused %s: %s%s%s is not one number (a word, a question mark, a unit or a second guess is not graded): %s\n", at, sq, q(v), sq, what
    }' "$T/answers.txt"
}

# the predictions: one point each
[ -f "$ANS" ] || echo "WRONG no $ANS: write the predictions as 'name = value' lines"
[ -n "$IDBAD" ] && echo "note  the predictions are not graded without a student id: they answer that id's questions"
KEYF=$(printf '%s\n' "$KEY")
OLDIFS=$IFS; IFS=$TAB
while read -r name want; do
    IFS=$OLDIFS
    total=$((total + 1))
    if [ -n "$IDBAD" ]; then result failed 0 1 "prediction $name" "prediction $name: not graded without a student id" quiet; IFS=$TAB; continue; fi
    got=$(answer "$name")
    tol=$(awk -v w="$want" 'BEGIN { a = w < 0 ? -w : w; print a < 1 ? 0.001 : a / 100 }')
    case $got in
    missing) result failed 0 1 "prediction $name" "prediction $name: missing from answers.txt (a line '$name = NUMBER')" ;;
    refused*) result failed 0 1 "prediction $name" "prediction ${got#refused }" ;;
    *)  got=${got#ok }
        if near "$got" "$want" "$tol"; then result passed 1 1 "prediction $name" "prediction $name = $got"; score=$((score + 1))
        else result failed 0 1 "prediction $name" "prediction $name = $got: the key says $want (tolerance $tol; see the lab sheet's hint)"; fi ;;
    esac
    IFS=$TAB
done <<EOF
$KEYF
EOF
IFS=$OLDIFS
# the names in answers.txt that are no prediction of this lab (a typo loses that prediction's point)
if [ -f "$ANS" ]; then
    sed -n "s/^[ $TAB]*\([^ $TAB=]*\)[ $TAB]*=.*/\1/p" "$T/answers.txt" | sort -u | while read -r n; do
        printf '%s\n' "$KEYF" | cut -f 1 | grep -qx -- "$n" || echo "note  answers.txt names '$(quote "$n")', which is no prediction of lab $LAB"
    done
fi

# png FILE: nothing when FILE is a PNG image, else what is wrong with it: the 8-byte signature, the IHDR chunk
# first with a width and a height above 0, and the IEND chunk last (a file cut short has none)
png() {
    [ -s "$1" ] || { echo "is missing or empty"; return; }
    h=$(od -A n -t x1 -N 24 "$1" | tr -d ' \n')
    case $h in
    89504e470d0a1a0a0000000d49484452*) ;;
    *) echo "is not a PNG (it does not begin with the 8 bytes of PNG's signature and an IHDR chunk)"; return ;;
    esac
    case $h in
    ????????????????????????????????00000000*|????????????????????????????????????????00000000) echo "is a PNG of width or height 0"; return ;;
    esac
    [ "$(tail -c 12 "$1" | od -A n -t x1 | tr -d ' \n')" = 0000000049454e44ae426082 ] || echo "is cut short (it does not end with PNG's IEND chunk)"
}
total=$((total + 1))
why=$(png "$DIR/lab$LAB.png")
if [ -z "$why" ]; then result passed 1 1 chart "the chart lab$LAB.png"; score=$((score + 1))
else result failed 0 1 chart "no chart: lab$LAB.png $why (tools/plot.sh -o $DIR/lab$LAB.png ...)"; fi
if [ -s "$DIR/answers.md" ]; then echo "note  answers.md is there: the written answers are graded by hand"
else echo "note  no answers.md: the written answers are missing"; fi

pct=$((100 * score / total))
echo "score $score/$total ($pct%), pass mark $PASS%"
if [ -n "$IDBAD" ]; then verdict="FAIL: no student id (see WRONG above)"; final=0
elif [ $bad -ne 0 ]; then verdict="FAIL: the CSV is not the output of the lab's graded command (see WRONG above)"; final=0
elif [ $pct -lt "$PASS" ]; then verdict="FAIL: below the pass mark"; final=$score
else verdict=PASS; final=$score; fi
echo "$verdict"
# Gradescope's results.json (score 0 when the CSV is not the run's: the submission fails), and Autolab's
# last line of output
awk -F "$TAB" -v score=$final -v max=$total -v out="lab $LAB: $score/$total predictions and chart; $verdict" '
function esc(s,   r, i, c) { r = ""; for (i = 1; i <= length(s); i++) { c = substr(s, i, 1); if (c == "\\" || c == "\"") r = r "\\"; r = r c }; return r }
{ t[++n] = sprintf("    {\"name\": \"%s\", \"score\": %d, \"max_score\": %d, \"status\": \"%s\", \"output\": \"%s\"}", esc($4), $2, $3, $1, esc($5)) }
END {
    printf "{\n  \"score\": %d,\n  \"max_score\": %d,\n  \"output\": \"%s\",\n  \"tests\": [\n", score, max, esc(out)
    for (i = 1; i <= n; i++) printf "%s%s\n", t[i], i < n ? "," : ""
    printf "  ]\n}\n"
}' "$T/tests" > "$JSON" || echo "tools/grade_lab.sh: cannot write $JSON" >&2
printf '{"scores": {"lab%s": %d}}\n' "$LAB" $final
[ "$verdict" = PASS ]
