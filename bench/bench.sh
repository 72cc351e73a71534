#!/bin/sh
# bench/bench.sh BUILD - dtrain next to PyTorch and the machine's limits, measured side by side in this one run:
#   1. the machine: FP32 FMA peak and memory copy bandwidth (bench_machine);
#   2. training step (forward, loss, backward, SGD) of SimpleCNN, ResNet-20 and VGG-11 at batch 128, dtrain
#      (bench_models) and PyTorch (bench/torch_models.py, when python3-torch is installed) taking turns, each in
#      its own process, ROUNDS times (default 3) of WINDOWS windows (default 3) after warm-up: the median of the
#      rounds' median img/s, and the memory a step takes. Turns, not one long run each, because a spell of other
#      load on a shared machine then slows both sides instead of one (single runs of PyTorch moved by 75% here);
#      for every CPU tier the machine runs (DT_CPU=avx512, avx2, portable), dtrain's against PyTorch held to the
#      same instructions (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA), with GFLOP/s and the share of the FMA peak;
#      then a bf16 row per model (BF16=0 leaves it out): dtrain with --precision bf16 on the first of TIERS next to
#      PyTorch's CPU autocast in bfloat16 (torch_models.py --bf16, oneDNN allowed AVX512_CORE_BF16 on the avx512
#      tier), with dtrain's speed-up over its own fp32 row and the share of the bf16 peak (bench_machine's
#      peak_bf16, where the CPU has AVX512_BF16; else of the FMA peak);
#   3. GEMM at the models' shapes, dtrain against OpenBLAS (when libopenblas-dev is installed), window by window;
#   4. all-reduce: bench/comm.sh up to 1 MiB (local backend, MPICH, gloo).
# Every program runs on THREADS threads (default: the number of cores). MODELS (default
# "simplecnn resnet20 vgg11"), TIERS (default: every tier this CPU runs), ROUNDS, WINDOWS and COMM=0 (no
# all-reduce part) shorten it. PYTHON: the Python with torch (default /usr/bin/python3, else python3).
# Writes BUILD/bench/bench.csv (section,name,dtrain,peer,ratio,unit) and, with gnuplot, BUILD/bench/bench.png.
B=${1:-build}
THREADS=${THREADS:-$(nproc)}
MODELS=${MODELS:-simplecnn resnet20 vgg11}
WINDOWS=${WINDOWS:-3}
ROUNDS=${ROUNDS:-3}
OUT="$B/bench"
CSV="$OUT/bench.csv"
mkdir -p "$OUT"
export OMP_NUM_THREADS=$THREADS
# PyTorch's Python: PYTHON, else Debian's (python3-torch), else the python3 on PATH
if [ -z "$PYTHON" ]; then PYTHON=/usr/bin/python3; "$PYTHON" -c "import torch" 2>/dev/null || PYTHON=python3; fi
torch=0; "$PYTHON" -c "import torch" 2>/dev/null && torch=1
echo "section,name,dtrain,peer,ratio,unit" > "$CSV"

echo "== the machine ($THREADS threads)"
"$B/bench/bench_machine" > "$OUT/machine.csv" || exit 1
grep '^#' "$OUT/machine.csv" | sed 's/^# //'
grep -v '^#' "$OUT/machine.csv" | awk -F, '{ printf "  %-10s %8.1f %s\n", $1, $2, $3; printf "machine,%s,%s,,,%s\n", $1, $2, $3 >> "'"$CSV"'" }'
peak=$(awk -F, '$1 == "peak_fma" { print $2 }' "$OUT/machine.csv")
peak_bf16=$(awk -F, '$1 == "peak_bf16" { print $2 }' "$OUT/machine.csv")

# the CPU tiers this machine runs (bench_machine names its widest FMA), each next to PyTorch held to the same
# instruction set; TIERS="avx2" (or any list) measures fewer
isa=$(sed -n 's/^# FMA peak with \([a-z0-9]*\) on .*/\1/p' "$OUT/machine.csv")
case $isa in avx512) all_tiers="avx512 avx2 portable" ;; avx2) all_tiers="avx2 portable" ;; *) all_tiers="portable" ;; esac
TIERS=${TIERS:-$all_tiers}
# one line from the rounds' lines of bench_models or torch_models.py (name,batch,threads,params,median,min,max,
# MB before,MB after): the median of the rounds' medians, the least minimum, the largest maximum, the first memory
rounds() {
    [ -n "$1" ] || return 0
    echo "$1" | tr ' ' '\n' | awk -F, 'NF >= 9 { m[n++] = $5; if (n == 1 || $6 < lo) lo = $6; if ($7 > hi) hi = $7
                                        if (n == 1) { head = $1 "," $2 "," $3 "," $4; mem = $8 "," $9 } }
        END { for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (m[j] < m[i]) { t = m[i]; m[i] = m[j]; m[j] = t }
              med = n % 2 ? m[(n - 1) / 2] : (m[n / 2 - 1] + m[n / 2]) / 2
              printf "%s,%.1f,%.1f,%.1f,%s\n", head, med, lo, hi, mem }'
}
torch_tier() {   # the environment that holds PyTorch to tier $1's instructions
    case $1 in
    avx512) echo "ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE" ;;
    avx2) echo "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" ;;
    *) echo "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41" ;;
    esac
}
echo "== training step, batch 128, $THREADS threads: images per second (median of $ROUNDS rounds of $WINDOWS windows), per CPU tier"
echo "   (dtrain with DT_CPU=tier; PyTorch held to the same instructions: avx512, avx2 and for portable SSE4.1;"
echo "    GFLOP/s from the useful FLOPs of a step: 25.4, 243 and 917 MFLOP per image; share of the FMA peak above)"
[ $torch = 1 ] || echo "  note: python3-torch is not installed: dtrain's figures alone (apt-get install python3-torch)"
printf "  %-10s %-11s %10s %10s %7s %6s %8s %7s %10s %10s\n" model tier dtrain PyTorch ratio goal GFLOP/s "of peak" "dtrain MB" "PyTorch MB"
for m in $MODELS; do
    for t in $TIERS; do
        d=""; p=""; r=0
        while [ $r -lt "$ROUNDS" ]; do   # dtrain and PyTorch take turns, so a spell of load falls on both
            d="$d$(DT_CPU=$t "$B/bench/bench_models" --model $m --windows $WINDOWS) " || exit 1
            # shellcheck disable=SC2046
            [ $torch = 1 ] && { p="$p$(env $(torch_tier $t) "$PYTHON" bench/torch_models.py --model $m --threads $THREADS \
                                        --windows $WINDOWS) " || exit 1; }
            r=$((r + 1))
        done
        d=$(rounds "$d"); p=$(rounds "$p")
        [ "$t" = "${TIERS%% *}" ] && fp32=$(echo "$d" | cut -d, -f5)   # the bf16 row's baseline
        echo "$d|$p" | awk -F'[,|]' -v csv="$CSV" -v tier=$t -v peak="$peak" '{
            goal = tier == "avx512" ? ($1 == "simplecnn" ? 1.5 : 1.2) : 1.0
            mflop = $1 == "simplecnn" ? 25.4 : $1 == "resnet20" ? 243 : $1 == "vgg11" ? 917 : 0
            gf = $5 * mflop / 1000; share = peak > 0 ? 100 * gf / peak : 0
            dm = $9 - $8; pm = $18 - $17; name = $1 "/" tier
            if ($10 == "") { printf "  %-10s %-11s %10.1f %10s %7s %6s %8.1f %6.0f%% %10.1f %10s\n", $1, tier, $5, "-", "-", goal "x", gf, share, dm, "-"
                             printf "train_step,%s,%s,,,img/s\ntrain_step_memory,%s,%.1f,,,MB\n", name, $5, name, dm >> csv }
            else { printf "  %-10s %-11s %10.1f %10.1f %6.2fx %6s %8.1f %6.0f%% %10.1f %10.1f\n", $1, tier, $5, $14, $5 / $14, goal "x", gf, share, dm, pm
                   printf "train_step,%s,%s,%s,%.3f,img/s\ntrain_step_memory,%s,%.1f,%.1f,%.3f,MB\n", name, $5, $14, $5 / $14, name, dm, pm, dm / pm >> csv }
            if (mflop > 0) printf "train_step_gflops,%s,%.1f,,%.3f,GFLOP/s (ratio: share of the FMA peak)\n", name, gf, share / 100 >> csv
        }'
    done
    [ "${BF16:-1}" = 0 ] && continue
    t=${TIERS%% *}; d=""; p=""; r=0
    tenv=$(torch_tier $t); [ "$t" = avx512 ] && tenv="ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"
    while [ $r -lt "$ROUNDS" ]; do
        d="$d$(DT_CPU=$t "$B/bench/bench_models" --model $m --windows $WINDOWS --precision bf16) " || exit 1
        # shellcheck disable=SC2086
        [ $torch = 1 ] && { p="$p$(env $tenv "$PYTHON" bench/torch_models.py --model $m --threads $THREADS --windows $WINDOWS --bf16) " || exit 1; }
        r=$((r + 1))
    done
    d=$(rounds "$d"); p=$(rounds "$p")
    echo "$d|$p" | awk -F'[,|]' -v csv="$CSV" -v tier=$t/bf16 -v peak="${peak_bf16:-$peak}" -v fp32="$fp32" '{
        goal = $1 == "simplecnn" ? 1.0 : 1.3
        mflop = $1 == "simplecnn" ? 25.4 : $1 == "resnet20" ? 243 : $1 == "vgg11" ? 917 : 0
        gf = $5 * mflop / 1000; share = peak > 0 ? 100 * gf / peak : 0
        dm = $9 - $8; pm = $18 - $17; name = $1 "/" tier
        if ($10 == "") printf "  %-10s %-11s %10.1f %10s %7s %6s %8.1f %6.0f%% %10.1f %10s\n", $1, tier, $5, "-", "-", goal "x", gf, share, dm, "-"
        else printf "  %-10s %-11s %10.1f %10.1f %6.2fx %6s %8.1f %6.0f%% %10.1f %10.1f\n", $1, tier, $5, $14, $5 / $14, goal "x", gf, share, dm, pm
        printf "train_step,%s,%s,%s,%s,img/s\n", name, $5, $14, $10 == "" ? "" : sprintf("%.3f", $5 / $14) >> csv
        if (fp32 > 0) {
            printf "  %-10s %-11s %10s bf16 / fp32 of dtrain: %.2fx (goal %s)\n", "", "", "", $5 / fp32, $1 == "simplecnn" ? "-" : "1.6x"
            printf "train_step_bf16_vs_fp32,%s,%s,%s,%.3f,img/s\n", name, $5, fp32, $5 / fp32 >> csv
        }
        if (mflop > 0) printf "train_step_gflops,%s,%.1f,,%.3f,GFLOP/s (ratio: share of the bf16 peak)\n", name, gf, share / 100 >> csv
    }'
done
echo "  memory: peak resident memory of the process minus what it held before the model was built"

echo "== GEMM GFLOP/s (median of $((ROUNDS * WINDOWS)) windows)"
gemm="$B/bench/bench_gemm"
if pkg-config --exists openblas 2>/dev/null; then
    ${CC:-cc} -std=c11 -O3 -fopenmp -DDTRAIN_IMPLEMENTATION -DBENCH_OPENBLAS $(pkg-config --cflags openblas) bench/bench_gemm.c -o "$OUT/bench_gemm_openblas" \
        $(pkg-config --libs openblas) -lm || exit 1
    gemm="$OUT/bench_gemm_openblas"
else
    echo "  note: libopenblas-dev is not installed: dtrain's figures alone (apt-get install libopenblas-dev)"
fi
printf "  %-20s %6s %7s %6s %9s %9s %7s %8s\n" shape M N K dtrain OpenBLAS ratio "of peak"
"$gemm" --windows $((ROUNDS * WINDOWS)) | awk -F, -v csv="$CSV" -v peak="$peak" '{
    printf "  %-20s %6d %7d %6d %9.1f %9s %7s %7.0f%%\n", $1, $2, $3, $4, $6, $7 == "" ? "-" : $7, $8 == "" ? "-" : sprintf("%.2fx", $8), 100 * $6 / peak
    printf "gemm,%s,%s,%s,%s,GFLOP/s\n", $1, $6, $7, $8 >> csv
}' || exit 1

if [ "${COMM:-1}" != 0 ]; then
    echo "== all-reduce (bench/comm.sh, up to 1 MiB)"
    BENCH_MAX_BYTES=1048576 sh bench/comm.sh "$B" 2>/dev/null | sed 's/^/  /'
    awk -F, 'NR > 1 && $1 == "local" && $3 == "native" { printf "allreduce,local native %s ranks %s B,%s,,,us\n", $2, $4, $6 }' \
        "$OUT/comm.csv" >> "$CSV"
fi
echo "results: $CSV"

if command -v gnuplot >/dev/null 2>&1 && [ $torch = 1 ]; then
    sh bench/bench_plot.sh "$CSV" "$OUT/bench.png" && echo "chart: $OUT/bench.png"
fi
