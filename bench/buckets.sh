#!/bin/sh
# bench/buckets.sh BUILD - DDP's bucket size: one epoch of examples/ddp on Fashion-MNIST for every model of
# MODELS (NAME:SAMPLES, default SimpleCNN on 2048 samples and ResNet-20 on 512) and every case of CASES
# (RANKS:LATENCY_S:BYTES_PER_S, 0:0 = no link model), with the gradients averaged by
#   buckets of each size in KBS (KiB, default 16 64 256 1024 4096), overlapped with backward,
#   buckets of the default size (DT_DDP_BUCKET_BYTES) reduced after backward (--no-overlap),
#   one all-reduce of the whole buffer after backward (flat),
# all with the default all-reduce (native; the ring under the link model) at global batch BATCH (128).
# Every configuration runs REPEAT times (default 3), interleaved. Rank 0 evaluates on the first TEST (500)
# test images. Writes BUILD/bench/buckets-runs.csv (every run) and BUILD/bench/buckets.csv (medians:
# seconds per epoch, and the seconds the ranks waited for communication that backward did not hide).
B=${1:-build}
MODELS=${MODELS:-"simplecnn:2048 resnet20:512"}
CASES=${CASES:-"2:0:0 4:0:0 8:0.0001:125M 8:0.001:12.5M"}
KBS=${KBS:-"16 64 256 1024 4096"}
BATCH=${BATCH:-128}
REPEAT=${REPEAT:-3}
TEST=${TEST:-500}
OUT="$B/bench"
. "$(dirname "$0")/common.sh"
mkdir -p "$OUT"
small_fmnist "$OUT/fmnist-test$TEST" "$TEST"

echo "model,ranks,latency_s,bandwidth_Bps,sync,bucket_kb,buckets,epoch_s,comm_s,test_acc" > "$OUT/buckets-runs.csv"
rep=1
while [ "$rep" -le "$REPEAT" ]; do
    for m in $MODELS; do
        for c in $CASES; do
            link_of "$c"
            for v in $KBS default-after flat; do
                case $v in
                flat) sync=flat flags="--sync flat" ;;
                default-after) sync=buckets-after flags="--sync buckets --no-overlap" ;;
                *) sync=buckets flags="--sync buckets --bucket-kb $v" ;;
                esac
                log="$OUT/buckets.log" csv="$OUT/buckets-one.csv"
                # shellcheck disable=SC2086  # $flags and $link are lists of flags
                "$B/examples/ddp" --model "${m%%:*}" --limit "${m#*:}" --data "$OUT/fmnist-test$TEST" --ranks $first \
                    --batch $BATCH --epochs 1 --csv "$csv" $flags $link > "$log" 2>&1 || { cat "$log"; exit 1; }
                nb=$(grep -o '([0-9]* buckets:' "$log" | tr -d '(:' | cut -d' ' -f1)   # the log's "(N buckets: sizes"
                case $v in flat) kb=all nb=1 ;; default-after) kb=256 ;; *) kb=$v ;; esac   # 256: DT_DDP_BUCKET_BYTES
                echo "${m%%:*},$first,$lat,$bw,$sync,$kb,$nb,$(csv_get "$csv" time_s),$(csv_get "$csv" comm_s),$(csv_get "$csv" test_acc)"
            done
        done
    done | tee -a "$OUT/buckets-runs.csv"
    rep=$((rep + 1))
done
medians 7 < "$OUT/buckets-runs.csv" > "$OUT/buckets.csv"
column -s, -t "$OUT/buckets.csv" 2>/dev/null || cat "$OUT/buckets.csv"
