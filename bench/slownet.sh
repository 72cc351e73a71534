#!/bin/sh
# bench/slownet.sh BUILD - D-PSGD against DDP on an emulated slow network: RANKS (default 8) local ranks
# train SimpleCNN on Fashion-MNIST for one epoch of LIMIT samples (default 2048) at a global batch of BATCH
# (default 128: D-PSGD takes BATCH / RANKS per rank), under each network of SETTINGS (the local backend's
# link model, one full-duplex port per rank), with three trainers:
#   dpsgd         D-PSGD on a ring (each step, every rank sends its replica to its 2 neighbours), on the
#                 28x28 images (--pad-to 0) so that its SimpleCNN is DDP's
#   ddp-flat      DDP, one ring all-reduce of the whole gradient after backward
#   ddp-buckets   DDP, ring all-reduces of buckets (DT_DDP_BUCKET_BYTES), overlapped with backward
# Every configuration runs REPEAT times (default 3), interleaved. Writes BUILD/bench/slownet-runs.csv (every
# run), BUILD/bench/slownet.csv (medians: setting, trainer, seconds per epoch, MB sent by the busiest rank,
# test accuracy on the first LIMIT test images) and, with gnuplot, BUILD/bench/slownet.png.
# SETTINGS is a list of NAME:LATENCY_S:BYTES_PER_S (0:0 = no link model).
B=${1:-build}
LIMIT=${LIMIT:-2048}
RANKS=${RANKS:-8}
BATCH=${BATCH:-128}
REPEAT=${REPEAT:-3}
SETTINGS=${SETTINGS:-"none:0:0 1Gbit/s-10ms:0.01:125M 100Mbit/s-1ms:0.001:12.5M"}
TRAINERS="dpsgd ddp-flat ddp-buckets"
OUT="$B/bench"
. "$(dirname "$0")/common.sh"
mkdir -p "$OUT"
small_fmnist "$OUT/fmnist-test$LIMIT" "$LIMIT"   # ddp.c evaluates on the first LIMIT test images, as dpsgd.c --limit does

echo "setting,latency_s,bandwidth_Bps,trainer,params,epoch_s,busiest_mb,test_acc" > "$OUT/slownet-runs.csv"
rep=1
while [ "$rep" -le "$REPEAT" ]; do
    for s in $SETTINGS; do
        link_of "$s"
        for t in $TRAINERS; do
            log="$OUT/slownet-$t.log" csv="$OUT/slownet-$t.csv"
            case $t in
            dpsgd) set -- "$B/examples/dpsgd" --pad-to 0 --model simplecnn --batch $((BATCH / RANKS)) --lr 0.01 --momentum 0.5 --wd 0 --milestones 100 ;;
            ddp-flat) set -- "$B/examples/ddp" --data "$OUT/fmnist-test$LIMIT" --batch $BATCH --sync flat ;;
            ddp-buckets) set -- "$B/examples/ddp" --data "$OUT/fmnist-test$LIMIT" --batch $BATCH --sync buckets ;;
            esac
            # shellcheck disable=SC2086  # $link is a list of flags
            "$@" --ranks $RANKS --algo ring --limit $LIMIT --epochs 1 --csv "$csv" $link > "$log" 2>&1 || { cat "$log"; exit 1; }
            echo "$first,$lat,$bw,$t,$(params_of "$log"),$(csv_get "$csv" time_s),$(csv_get "$csv" busiest_rank_mb),$(csv_get "$csv" test_acc)" |
                tee -a "$OUT/slownet-runs.csv"
        done
    done
    rep=$((rep + 1))
done
medians 5 < "$OUT/slownet-runs.csv" > "$OUT/slownet.csv"
column -s, -t "$OUT/slownet.csv" 2>/dev/null || cat "$OUT/slownet.csv"

if command -v gnuplot >/dev/null 2>&1; then
    # one row per setting (labelled "100 Mbit/s, 1 ms"), one column per trainer: gnuplot's clustered histograms
    awk -F, -v tr="$TRAINERS" -v ft="$OUT/slownet-time.dat" -v fm="$OUT/slownet-mb.dat" '
        function num(x) { return x ~ /[kK]$/ ? x * 1e3 : x ~ /[mM]$/ ? x * 1e6 : x ~ /[gG]$/ ? x * 1e9 : x + 0 }
        function net(lat, bw) {
            if (num(lat) == 0 && num(bw) == 0) return "none"
            bw = num(bw) * 8
            return (bw == 0 ? "unlimited" : bw >= 1e9 ? bw / 1e9 " Gbit/s" : bw / 1e6 " Mbit/s") " " num(lat) * 1e3 " ms"
        }
        BEGIN { n = split(tr, T, " ") }
        NR > 1 { if (!($1 in seen)) { seen[$1] = 1; S[++ns] = $1; L[$1] = net($2, $3) } v[$1, $4] = $6; mb[$4] = $7 }
        END { for (i = 1; i <= ns; i++) { l = "\"" L[S[i]] "\""; for (j = 1; j <= n; j++) l = l " " v[S[i], T[j]]; print l > ft }
              for (j = 1; j <= n; j++) print T[j], mb[T[j]] > fm }' "$OUT/slownet.csv"
    ymax=$(awk '{ for (i = NF - 2; i <= NF; i++) if ($i > m) m = $i } END { print m * 1.35 }' "$OUT/slownet-time.dat")
    gnuplot <<GP
set terminal png size 1040,440
set output "$OUT/slownet.png"
set multiplot layout 1,2 title "SimpleCNN, Fashion-MNIST, $RANKS local ranks, one epoch of $LIMIT samples at batch $BATCH"
set style fill solid 0.8 border -1
set yrange [0:$ymax]
set grid ytics
set key top left
set title "seconds per epoch (median of $REPEAT)"
set xlabel "network: bandwidth and latency of each rank's link"
set style data histograms
set style histogram clustered gap 1
plot "$OUT/slownet-time.dat" using 2:xtic(1) title "dpsgd (ring)", "" using 3 title "ddp-flat (ring)", \
     "" using 4 title "ddp-buckets (ring, overlapped)"
set title "MB sent by the busiest rank per epoch"
set xlabel "trainer"
set boxwidth 0.6
set xrange [-0.6:2.6]
set yrange [0:*]
unset key
plot "$OUT/slownet-mb.dat" using 0:2:(\$0 + 1):xtic(1) with boxes lc variable, "" using 0:2:(sprintf("%.1f", \$2)) with labels offset 0,0.8
unset multiplot
GP
    echo "chart: $OUT/slownet.png"
else
    echo "note: no chart (install gnuplot-nox)"
fi
