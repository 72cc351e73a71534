#!/bin/sh
# tests/grade_lab_test.sh [BUILD] - tools/grade_lab.sh tells a right submission from wrong ones: each lab's key
# (--solve, for a student id) passes, also saved as an editor may save it (CR line ends, blank lines at the end,
# no final newline, blanks around values and separators); the same submission under another id fails, its CSV
# (another seed's run) and its predictions (other sizes); --params is the same on every call and differs
# between ids, and each lab sheet's graded command is the example id's; a student_id that is missing, empty, not
# one id or the sheets' "example" fails, naming the file; a CSV whose loss is not the run's in any row, whose
# traffic is not the command's or with a value that is not a number fails; wrong predictions, and predictions
# that are not one number ("none", "?", nothing, a hedge, "28 000 000", "0,5", two values), score 0, each named;
# a file that is not a whole PNG is no chart; results.json and the last line are valid JSON with the right
# totals. Needs BUILD/examples (default build) and Fashion-MNIST; python3 for the JSON tests (skipped without
# it). Ends with "N passed, N failed" (tests/run.sh section 5d and make docs-check-course run it).
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
passed=0; failed=0
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skipped: dataset-fashion-mnist is not installed (the labs train on it)"; echo "0 passed, 0 failed"; exit 0
fi
check() {   # check NAME COMMAND...: one test that passes when the command succeeds
    name=$1; shift
    if err=$("$@" 2>&1); then echo "ok   $name"; passed=$((passed + 1))
    else echo "FAIL $name"; printf '%s\n' "$err" | tail -n 30; failed=$((failed + 1)); fi
}
G=$B/grade-test; rm -rf "$G"
# grade LAB DIR: the grader's report on DIR in DIR.out, and its exit status
grade() { sh tools/grade_lab.sh "$1" "$2" "$B" > "$2.out" 2>&1; }
# has FILE TEXT...: FILE holds every TEXT (fixed strings), or says which it lacks and shows FILE
has() {
    f=$1; shift
    for t in "$@"; do grep -qF -- "$t" "$f" || { echo "no '$t' in $f:"; cat "$f"; return 1; }; done
}
# passes LAB DIR: DIR passes with every point and nothing WRONG
passes() { grade "$1" "$2" && ! grep -q '^WRONG' "$2.out" && grep -Eq '^score ([0-9]+)/\1 ' "$2.out" || { cat "$2.out"; return 1; }; }
# fails LAB DIR TEXT...: DIR fails and its report names each TEXT
fails() { l=$1; d=$2; shift 2; ! grade "$l" "$d" && has "$d.out" "$@"; }
# scores LAB DIR TEXT...: DIR's report names each TEXT (graded without a CSV: no re-run; the predictions and the
# chart are scored all the same)
scores() { l=$1; d=$2; shift 2; grade "$l" "$d"; has "$d.out" "$@"; }
# setcell FILE ROW COLUMN VALUE: a CSV edited by hand
setcell() {
    awk -F, -v OFS=, -v r="$2" -v c="$3" -v v="$4" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i }
                                                     NR == r + 1 { $k = v } 1' "$1" > "$1.new" && mv "$1.new" "$1"
}
# answers LAB NAME: a submission without a CSV whose student_id, answers.txt and chart are the key's
answers() { mkdir -p "$G/$2" && cp "$G/key$1/student_id" "$G/key$1/answers.txt" "$G/key$1/lab$1.png" "$G/$2/"; }
# val DIR NAME: the value of NAME in DIR/answers.txt
val() { sed -n "s/^$2 = //p" "$1/answers.txt"; }

# each lab's key for an id whose graded run is among the shortest (3 ranks); lab 3's asks a trimmed mean that
# drops nothing (what 'none' read as 0 would score); s19's lab 1 run differs from s12's in its seed alone
ids="1:s12 2:s17 3:s7 4:s16 5:s4"
# the keys' grading runs each command afresh (the solution's run against a fresh one: the run is seeded) and
# keeps it in GRADE_RERUN_DIR, where the cases below find it
GRADE_RERUN_DIR=$G/rerun; export GRADE_RERUN_DIR
for li in $ids; do
    lab=${li%:*}; id=${li#*:}
    check "grade_lab.sh: lab $lab's key for $id passes" sh -c "
        sh tools/grade_lab.sh --solve $lab '$G/key$lab' '$B' $id >/dev/null && sh tools/grade_lab.sh $lab '$G/key$lab' '$B' > '$G/key$lab.out'"
done

# the parameters: the same on every call, another id's differ; the sheets run the example id's command
params_differ() {
    a=$(sh tools/grade_lab.sh --params "$1" "$2") && b=$(sh tools/grade_lab.sh --params "$1" "$2") &&
        c=$(sh tools/grade_lab.sh --params "$1" "$3") || return 1
    [ "$a" = "$b" ] || { echo "--params $1 $2 printed two answers:"; echo "$a"; echo "$b"; return 1; }
    [ "$a" != "$c" ] || { echo "--params $1 gives $2 and $3 the same:"; echo "$a"; return 1; }
}
for lab in 1 2 3 4 5; do
    check "grade_lab.sh --params $lab: the same on every call, and not the same for two ids" params_differ $lab s12 s19
done
sheet_command() {   # the sheet of lab $1 runs its graded command as --params prints it for the id example
    c=$(sh tools/grade_lab.sh --params "$1" example | sed -n 3p | sed 's/^ *//') && md=$(ls docs/course/lab-"$1"-*.md) &&
        grep -qxF -- "$c" "$md" || { echo "$md has no line '$c'"; return 1; }
}
for lab in 1 2 3 4 5; do check "lab $lab's sheet runs the example id's graded command" sheet_command $lab; done

# the same submission under another id: its CSV is not that id's run (lab 1's s19 runs s12's command with
# another seed: the losses differ), and its predictions answer other sizes
cp -r "$G/key1" "$G/other" && echo s19 > "$G/other/student_id"
check "grade_lab.sh: a copied submission fails for another id, its rows not the id's run" fails 1 "$G/other" \
    "lab 1 for s19:" "WRONG row 1's train_loss is" "but a re-run of the command gives"
answers 1 otherpred && echo s19 > "$G/otherpred/student_id"
check "grade_lab.sh: copied predictions score what the two ids share (lab_mb_per_epoch and the chart)" scores 1 \
    "$G/otherpred" "WRONG prediction ring_bytes_per_rank = $(val "$G/key1" ring_bytes_per_rank): the key says" "score 2/6"
# a student_id that is missing, empty, not one id, or the sheets' example: refused, saying what to write; nothing
# is graded (no re-run)
idbad() {   # idbad NAME CONTENT TEXT: the key of lab 1 with student_id CONTENT ("-": none) fails, naming TEXT
    cp -r "$G/key1" "$G/$1" && if [ "$2" = - ]; then rm "$G/$1/student_id"; else printf '%b' "$2" > "$G/$1/student_id"; fi &&
        fails 1 "$G/$1" "$3" "FAIL: no student id" '{"scores": {"lab1": 0}}'
}
check "grade_lab.sh: a submission without student_id fails, naming the file" idbad noid - "WRONG there is no $G/noid/student_id: write your student id into it"
check "grade_lab.sh: an empty student_id fails" idbad blankid ' \n\n' "WRONG $G/blankid/student_id is empty: write your student id into it"
check "grade_lab.sh: a student_id of two words fails" idbad twowords 'Ada Lovelace' "WRONG $G/twowords/student_id holds 'Ada Lovelace': an id is letters"
check "grade_lab.sh: a student_id of two lines fails" idbad twolines 's12\ns19\n' "WRONG $G/twolines/student_id has more than one line"
check "grade_lab.sh: the sheets' id 'example' fails, telling to write one's own" idbad exampleid example \
    "WRONG $G/exampleid/student_id is 'example', the lab sheets' worked example, no student's: write your own id into it"

# the key's submission as editors save it: each is accepted and normalised, and scores every point (lab 1:
# its last column is the traffic, which a CR would follow)
cp -r "$G/key1" "$G/crlf" && sed -i 's/$/\r/' "$G/crlf/lab1.csv" "$G/crlf/answers.txt" "$G/crlf/student_id"
check "grade_lab.sh: a CSV, answers.txt and student_id with CR line ends pass" passes 1 "$G/crlf"
cp -r "$G/key1" "$G/blank" && printf '\n\n \n' >> "$G/blank/lab1.csv" && printf '\n\n' >> "$G/blank/answers.txt" &&
    printf '\n \n' >> "$G/blank/student_id"
check "grade_lab.sh: blank lines at the end of the CSV, answers.txt and student_id pass" passes 1 "$G/blank"
cp -r "$G/key1" "$G/eof" && printf '%s' "$(cat "$G/key1/lab1.csv")" > "$G/eof/lab1.csv" &&
    printf '%s' "$(cat "$G/key1/answers.txt")" > "$G/eof/answers.txt" && printf '%s' "$(cat "$G/key1/student_id")" > "$G/eof/student_id"
check "grade_lab.sh: a CSV, answers.txt and student_id without a final newline pass" passes 1 "$G/eof"
# ps_root_bytes written with commas between groups of three digits: 25000000 as 25,000,000
ps=$(val "$G/key1" ps_root_bytes); grouped=$(printf '%s\n' "$ps" | sed ':a; s/\([0-9]\)\([0-9]\{3\}\)\($\|,\)/\1,\2\3/; ta')
cp -r "$G/key1" "$G/blanks" && sed -i 's/,/ , /g; s/^/  /; s/$/ /' "$G/blanks/lab1.csv" &&
    sed -i "s/ = /  =   /; s/^/ /; s/\$/\t /; s/= $ps\b/= $grouped/" "$G/blanks/answers.txt" && sed -i 's/^/  /; s/$/ \t/' "$G/blanks/student_id"
check "grade_lab.sh: blanks around values, separators and the id, and $grouped, pass" passes 1 "$G/blanks"

# a CSV edited by hand: a loss that is not the run's in row 1, a faked row 2, traffic that is not the
# command's, a value that is not a number
cp -r "$G/key3" "$G/loss" && setcell "$G/loss/lab3.csv" 1 train_loss 1.5
check "grade_lab.sh: a CSV whose loss is not the run's fails, naming train_loss" fails 3 "$G/loss" "WRONG row 1's train_loss is '1.5'"
cp -r "$G/key1" "$G/row2" && setcell "$G/row2/lab1.csv" 2 train_loss 0.1 && setcell "$G/row2/lab1.csv" 2 test_acc 0.99
check "grade_lab.sh: a faked row 2 (loss 0.1, accuracy 0.99) fails, naming both" fails 1 "$G/row2" \
    "WRONG row 2's train_loss is '0.1', but a re-run" "WRONG row 2's test_acc is '0.99', but a re-run"
cp -r "$G/key1" "$G/bytes" && setcell "$G/bytes/lab1.csv" 2 busiest_rank_mb 40.000
check "grade_lab.sh: a CSV whose traffic is not the command's fails, naming the row" fails 1 "$G/bytes" "WRONG row 2's busiest_rank_mb is '40.000'"
cp -r "$G/key1" "$G/cell" && setcell "$G/cell/lab1.csv" 2 test_acc "0. 8"
check "grade_lab.sh: a CSV value that is not a number fails, naming row and column" fails 1 "$G/cell" \
    "WRONG row 2, column test_acc: '0. 8' is not a number: write the value as the command printed it"

# predictions off by the usual slips: the ring's 2 n (the whole vector twice, not 2 (p - 1) / p of it), the
# parameter server's and the tree's one n more (p n, as if the root sent to itself; a level too many)
ring=$(val "$G/key1" ring_bytes_per_rank); tree=$(val "$G/key1" tree_root_bytes)
n=$(sh tools/grade_lab.sh --params 1 "$(cat "$G/key1/student_id")" | sed -n 's/^ *ring_bytes_per_rank *n = \([0-9]*\) bytes.*/\1/p')
cp -r "$G/key1" "$G/pred" && sed -i "s/^ring_bytes_per_rank = .*/ring_bytes_per_rank = $((2 * n))/; s/^ps_root_bytes = .*/ps_root_bytes = $((ps + n))/
    s/^tree_root_bytes = .*/tree_root_bytes = $((tree + n))/" "$G/pred/answers.txt"
check "grade_lab.sh: wrong predictions fail below the pass mark, each named" fails 1 "$G/pred" 'score 3/6' \
    "WRONG prediction ring_bytes_per_rank = $((2 * n)): the key says $ring"
# predictions that are not one number: refused, naming the line, the name and what to write, never credited
# (lab 3's trimmed_dropped_per_side is 0, which a word read as a number would be)
# refused LAB DIR NAME VALUE TEXT: the key's answers.txt with NAME = VALUE, graded without a CSV, names TEXT and
# loses that point (every lab has 5 predictions and the chart)
refused() {
    answers "$1" "$2" && awk -v n="$3" -v v="$4" '$1 == n { $0 = n " = " v } 1' "$G/$2/answers.txt" > "$G/$2/a" &&
        mv "$G/$2/a" "$G/$2/answers.txt" && scores "$1" "$G/$2" "WRONG prediction answers.txt line $5" "score 5/6"
}
check "grade_lab.sh: lab 3's key for the refusals asks a trimmed mean that drops nothing" has "$G/key3/answers.txt" \
    "trimmed_dropped_per_side = 0"
check "grade_lab.sh: 'none' is refused, not read as 0" refused 3 none trimmed_dropped_per_side none \
    "4, trimmed_dropped_per_side: 'none' is not one number"
check "grade_lab.sh: '?' is refused, not read as 0" refused 3 quest trimmed_dropped_per_side '?' \
    "4, trimmed_dropped_per_side: '?' is not one number"
check "grade_lab.sh: an empty answer is refused, saying what to write" refused 3 empty trimmed_dropped_per_side '' \
    "4, trimmed_dropped_per_side: no value: write one number"
check "grade_lab.sh: a hedged '28000000 (or 7000000?)' is refused" refused 1 hedge ps_root_bytes '28000000 (or 7000000?)' \
    "2, ps_root_bytes: '28000000 (or 7000000?)' is not one number"
spaced=$(printf '%s\n' "$grouped" | tr , ' ')
check "grade_lab.sh: '$spaced' is refused, not read as ${spaced%% *}, and told to write $ps" refused 1 spaced ps_root_bytes \
    "$spaced" "2, ps_root_bytes: '$spaced' has spaces inside the number (read up to its first space it is ${spaced%% *}): write $ps"
check "grade_lab.sh: '0,5' is refused, not read as 5" refused 2 comma gap_exponential 0,5 \
    "3, gap_exponential: '0,5' has separators that read more than one way"
answers 1 twice && echo "ps_root_bytes = 7000000" >> "$G/twice/answers.txt"
check "grade_lab.sh: two lines giving two values are refused" scores 1 "$G/twice" \
    "WRONG prediction answers.txt line 2, ps_root_bytes: line 6 gives it again as '7000000'" "score 5/6"

# charts that are not a whole PNG: bytes 2-4 "PNG" alone, a signature with a 0 x 0 image, a PNG cut short
answers 1 fakepng && printf 'xPNG, not an image\n' > "$G/fakepng/lab1.png"
check "grade_lab.sh: a file whose bytes 2-4 are PNG is no chart" scores 1 "$G/fakepng" "WRONG no chart: lab1.png is not a PNG" "score 5/6"
answers 1 emptypng && printf '\211PNG\r\n\032\n\000\000\000\rIHDR\000\000\000\000\000\000\000\000\010\006\000\000\000\000\000\000\000\000IEND\256B`\202' > "$G/emptypng/lab1.png"
check "grade_lab.sh: a PNG of 0 x 0 pixels is no chart" scores 1 "$G/emptypng" "WRONG no chart: lab1.png is a PNG of width or height 0" "score 5/6"
answers 1 cutpng && head -c 300 "$G/key1/lab1.png" > "$G/cutpng/lab1.png"
check "grade_lab.sh: a PNG cut short is no chart" scores 1 "$G/cutpng" "WRONG no chart: lab1.png is cut short" "score 5/6"

# results.json (Gradescope) and the last line of the report (Autolab): valid JSON, the right totals
json_ok() {   # json_ok DIR SCORE MAX [TEXT]: DIR/results.json and the last line of DIR.out give SCORE of MAX
    python3 -c '
import json, sys
d, score, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = json.load(open(d + "/results.json"))
assert (r["score"], r["max_score"]) == (score, top), ("score, max_score", r["score"], r["max_score"])
assert sum(t["max_score"] for t in r["tests"]) == top, ("the tests max_score should add up to", top)
assert score == 0 or sum(t["score"] for t in r["tests"]) == score, ("the tests score should add up to", score)
assert all(set(t) >= {"name", "score", "max_score", "output"} for t in r["tests"]), "a test without name, score, max_score, output"
assert len(sys.argv) < 5 or any(sys.argv[4] in t["output"] for t in r["tests"]), ("no test output has", sys.argv[4])
last = json.loads(open(d + ".out").read().splitlines()[-1])
assert list(last["scores"].values()) == [score], ("the last line", last)' "$@"
}
if command -v python3 > /dev/null; then
    check "grade_lab.sh: a right submission's results.json and last line: valid JSON, 6 of 6" json_ok "$G/key1" 6 6
    check "grade_lab.sh: results.json of wrong predictions: 3 of 6, its tests adding up" json_ok "$G/pred" 3 6
    check "grade_lab.sh: results.json of a CSV that is not the run's: 0 of 6" json_ok "$G/bytes" 0 6
    check "grade_lab.sh: results.json without a student id: 0 of 6, saying so" json_ok "$G/noid" 0 6 "write your student id into it"
    answers 1 quoted && sed -i 's/^ps_root_bytes = .*/ps_root_bytes = "28000000" \\ (\tbytes)/' "$G/quoted/answers.txt"
    quoted() { grade 1 "$G/quoted"; json_ok "$G/quoted" 0 6 "'\"28000000\" \\ (?bytes)' is not one number"; }
    check "grade_lab.sh: results.json quotes an answer with quotes, a backslash and a tab (no CSV: 0 of 6)" quoted
else
    echo "skipped the results.json tests: python3 is not installed"
fi
rm -rf "$G"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
