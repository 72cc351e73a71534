#!/bin/sh
# tools/grade_lab.sh LAB SUBMISSION_DIR [BUILD] - grades a lab of docs/course (LAB: 1, 2, 3 or 4).
# A submission is a directory with
#   labN.csv      the CSV that the lab's graded command wrote (docs/course/lab-N-*.md, "Deliverables")
#   labN.png      the chart drawn from it (tools/plot.sh)
#   answers.txt   the predicted numbers, one "name = value" per line (names in the lab sheet)
#   answers.md    the written answers (graded by hand: only their presence is checked here)
# The files are read as a student's editor may save them: CR line ends, a byte-order mark, blank lines, no
# final newline and blanks around values and separators are accepted. The CSV must be the run's: its columns
# and rows are the command's, every graded value in every row is a number, its traffic column is the figure
# the cost model gives for that command (the library's counters are exact), and every row matches a fresh run
# of the same command (BUILD/examples, default build; train_loss within 0.001, test_acc within 0.005, as the
# run is seeded). Any of these failing fails the submission. Each prediction within 1% of the key (or 0.001
# absolute for numbers below 1) and the chart (a whole PNG: its signature, a non-empty IHDR, IEND at the end)
# score one point each. A prediction that is not one number that reads one way ("none", "?", nothing,
# "28000000 (or 7000000?)", "28 000 000", "0,5", or two lines giving two values) scores 0, with a message
# naming its line and what to write; "28,000,000" (commas between groups of three digits) is read as 28000000.
# The score is printed with what is wrong; SUBMISSION_DIR/results.json (or GRADE_RESULTS=PATH, e.g.
# /autograder/results/results.json) gets it in Gradescope's format, a test per check (the CSV's worth 0 points:
# they gate; the score is 0 when the CSV is not the run's), and the last line of output is Autolab's
# {"scores": {"labN": SCORE}}. The exit status is 1 below GRADE_PASS percent (default 60) or for a CSV that
# is not the run's, 2 for bad use.
# tools/grade_lab.sh --solve LAB DIR [BUILD] writes a correct submission into DIR (the instructor's key:
# runs the command, writes the key's numbers; the chart needs gnuplot).
# GRADE_RERUN_DIR=DIR keeps each lab's fresh run in DIR/labN.csv and uses it again when it is there (grading a
# class: the run is seeded, so one run serves every submission; tests/grade_lab_test.sh's many cases).
solve=0
[ "$1" = --solve ] && { solve=1; shift; }
[ $# -ge 2 ] || { echo "usage: tools/grade_lab.sh [--solve] LAB SUBMISSION_DIR [BUILD]   (LAB: 1, 2, 3 or 4)" >&2; exit 2; }
LAB=$1; DIR=$2; B=${3:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PASS=${GRADE_PASS:-60}
TAB=$(printf '\t')
N=421642                      # SimpleCNN's parameters (ddp, dpsgd --model simplecnn, localsgd)
GRAD=$((4 * N + 8))           # DDP's first all-reduce carries the sample count and the has-data flag too

# Each lab sets: EX (the example), FLAGS (the graded command), COLS (columns that must be there and hold numbers),
# ROWS (the rows it writes), OWN (column value pairs: the traffic columns against the cost model, in every row)
# and KEY (name TAB value lines: the predictions' answers).
case $LAB in
1)  EX=ddp; FLAGS="--ranks 4 --limit 2048 --epochs 2 --sync flat --algo ring"; ROWS=2
    COLS="epoch train_loss test_acc comm_s busiest_rank_mb"
    # 2048 / 128 = 16 steps and dt_ddp_join's last round: 17 ring all-reduces of GRAD bytes, 2 (p - 1) / p each
    OWN="busiest_rank_mb $(awk -v g=$GRAD 'BEGIN { printf "%.3f", 17 * 2 * 3 / 4 * g / 1e6 }')"
    KEY="ring_bytes_per_rank${TAB}7000000
ps_root_bytes${TAB}28000000
tree_root_bytes${TAB}12000000
ring_tree_crossover_bytes${TAB}188235
lab_mb_per_epoch${TAB}$(awk -v g=$GRAD 'BEGIN { printf "%.3f", 17 * 1.5 * g / 1e6 }')" ;;
2)  EX=dpsgd; FLAGS="--ranks 4 --model simplecnn --pad-to 0 --limit 1024 --epochs 2 --lr 0.05 --wd 0 --topology ring"
    ROWS=2
    COLS="epoch train_loss test_acc consensus busiest_rank_mb"
    # 1024 / (4 x 32) = 8 steps; each sends the replica to both ring neighbours
    OWN="busiest_rank_mb $(awk -v n=$N 'BEGIN { printf "%.3f", 8 * 2 * 4 * n / 1e6 }')"
    KEY="gap_ring_8${TAB}$(awk 'BEGIN { printf "%.4f", 2 / 3 * (1 - cos(2 * atan2(0, -1) / 8)) }')
gap_ring_16${TAB}$(awk 'BEGIN { printf "%.4f", 2 / 3 * (1 - cos(2 * atan2(0, -1) / 16)) }')
gap_exponential_16${TAB}0.5
lab_mb_per_epoch${TAB}$(awk -v n=$N 'BEGIN { printf "%.3f", 8 * 2 * 4 * n / 1e6 }')
exponential_mb_per_epoch_p8${TAB}$(awk -v n=$N 'BEGIN { printf "%.3f", 32 * 5 * 4 * n / 1e6 }')" ;;
3)  EX=fedavg; FLAGS="--ranks 3 --clients 10 --frac 0.5 --rounds 3 --local-epochs 1 --batch 10 --partition iid --limit 2000"
    ROWS=3
    COLS="round selected train_loss test_acc"
    OWN="selected 5"
    KEY="clients_per_round${TAB}5
local_steps_per_round${TAB}20
server_bytes_per_round${TAB}$((2 * 5 * 4 * 199210))
trimmed_dropped_per_side${TAB}0
krum_max_f${TAB}1" ;;
4)  EX=localsgd; FLAGS="--ranks 4 --limit 2048 --epochs 2 --period 4"; ROWS=2
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
# the CSV's checks are worth 0 points (they gate the submission), a prediction and the chart 1 each
result() {
    if [ "$1" = passed ]; then echo "ok    $5"; else echo "WRONG $5"; fi
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
# what a student wrote, fit to be quoted: printable ASCII, at most 60 characters
quote() { printf '%s' "$1" | LC_ALL=C tr -c ' -~' '?' | cut -c 1-60; }

echo "lab $LAB: $CSV, the run of ./build/examples/$EX $FLAGS"
if [ ! -s "$CSV" ]; then
    wrong csv "$CSV is missing or empty: run the lab's graded command with --csv $CSV"
else
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
    # the one kept in GRADE_RERUN_DIR
    if [ -n "${GRADE_RERUN_DIR:-}" ] && [ -s "$GRADE_RERUN_DIR/lab$LAB.csv" ]; then cp "$GRADE_RERUN_DIR/lab$LAB.csv" "$T/rerun.csv"
    elif ! "$B/examples/$EX" $FLAGS --csv "$T/rerun.csv" > "$T/log" 2>&1; then
        cat "$T/log"; echo "tools/grade_lab.sh: the re-run failed" >&2; exit 2
    elif [ -n "${GRADE_RERUN_DIR:-}" ]; then mkdir -p "$GRADE_RERUN_DIR" && cp "$T/rerun.csv" "$GRADE_RERUN_DIR/lab$LAB.csv"
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
KEYF=$(printf '%s\n' "$KEY")
OLDIFS=$IFS; IFS=$TAB
while read -r name want; do
    IFS=$OLDIFS
    total=$((total + 1))
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
if [ $bad -ne 0 ]; then verdict="FAIL: the CSV is not the output of the lab's graded command (see WRONG above)"; final=0
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
