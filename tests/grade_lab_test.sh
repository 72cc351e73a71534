#!/bin/sh
# tests/grade_lab_test.sh [BUILD] - tools/grade_lab.sh tells a right submission from wrong ones: each lab's key
# (--solve) passes; a CSV whose loss is not the run's, a CSV whose traffic is not the command's and wrong
# predictions fail, each named. Needs BUILD/examples (default build) and Fashion-MNIST. Ends with
# "N passed, N failed" (tests/run.sh section 5d and make docs-check-course run it).
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
for lab in 1 2 3 4; do
    check "grade_lab.sh: lab $lab's key passes" sh -c "
        sh tools/grade_lab.sh --solve $lab '$G/key$lab' '$B' >/dev/null && sh tools/grade_lab.sh $lab '$G/key$lab' '$B'"
done
# a CSV edited by hand: a loss that is not the run's, then traffic that is not the command's
cp -r "$G/key3" "$G/loss" && sed -i '2s/^\([^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,\)[0-9.]*/\11.5/' "$G/loss/lab3.csv"
check "grade_lab.sh: a CSV whose loss is not the run's fails, naming train_loss" sh -c "
    ! sh tools/grade_lab.sh 3 '$G/loss' '$B' > '$G/loss.out' && grep -q \"WRONG row 1's train_loss is '1.5'\" '$G/loss.out'"
cp -r "$G/key1" "$G/bytes" && sed -i '3s/,[0-9.]*$/,40.000/' "$G/bytes/lab1.csv"
check "grade_lab.sh: a CSV whose traffic is not the command's fails, naming the row" sh -c "
    ! sh tools/grade_lab.sh 1 '$G/bytes' '$B' > '$G/bytes.out' && grep -q \"WRONG row 2's busiest_rank_mb is '40.000'\" '$G/bytes.out'"
# predictions off by the usual slips (the whole vector where a ring sends 2 (p - 1) / p of it, ...)
cp -r "$G/key1" "$G/pred" && sed -i 's/= 7000000/= 8000000/; s/= 28000000/= 32000000/; s/= 12000000/= 16000000/' "$G/pred/answers.txt"
check "grade_lab.sh: wrong predictions fail below the pass mark, each named" sh -c "
    ! sh tools/grade_lab.sh 1 '$G/pred' '$B' > '$G/pred.out' && grep -q 'score 3/6' '$G/pred.out' &&
    grep -q 'WRONG prediction ring_bytes_per_rank = 8000000: the key says 7000000' '$G/pred.out'"
rm -rf "$G"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
