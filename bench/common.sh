# bench/common.sh - what the training benchmarks (slownet.sh, buckets.sh) share; sourced, not run.

# be32 N: N as 4 bytes, big-endian (the integers of an IDX header)
be32() {
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)))"
}

# idx_cut SRC MAGIC DIMS... : the IDX file SRC (or SRC.gz) cut to its first DIMS[0] items (DIMS as in its header)
idx_cut() {
    idx_file=$1 idx_magic=$2
    shift 2
    idx_hdr=$((4 + 4 * $#)) idx_bytes=1
    be32 "$idx_magic"
    for d in "$@"; do be32 "$d"; idx_bytes=$((idx_bytes * d)); done
    { if [ -e "$idx_file" ]; then cat "$idx_file"; else gzip -dc "$idx_file.gz"; fi; } | tail -c +$((idx_hdr + 1)) | head -c $idx_bytes
}

# small_fmnist DIR N: DIR becomes Fashion-MNIST with the whole training set (linked) and the first N test
# images, so that examples/ddp, which evaluates the whole test set after each epoch, evaluates on the same
# N images that examples/dpsgd --limit N does, and the evaluation does not dominate a short run.
small_fmnist() {
    src=${FMNIST:-/usr/share/datasets/fashion-mnist}
    mkdir -p "$1"
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte; do
        if [ -e "$src/$f" ]; then ln -sf "$src/$f" "$1/$f"; else ln -sf "$src/$f.gz" "$1/$f.gz"; fi
    done
    idx_cut "$src/t10k-images-idx3-ubyte" 2051 "$2" 28 28 > "$1/t10k-images-idx3-ubyte"
    idx_cut "$src/t10k-labels-idx1-ubyte" 2049 "$2" > "$1/t10k-labels-idx1-ubyte"
}

# link_of X:LATENCY_S:BYTES_PER_S: sets first (X), lat, bw, and link: the launcher's flags for the link model
# (none for 0:0)
link_of() {
    first=${1%%:*} lat=${1#*:}
    bw=${lat#*:} lat=${lat%%:*}
    link=
    if [ "$lat" != 0 ]; then link="$link --link-latency $lat"; fi
    if [ "$bw" != 0 ]; then link="$link --link-bandwidth $bw"; fi
}

# csv_get FILE COLUMN: the first data row's value of the named column of a CSV the examples write
csv_get() {
    awk -F, -v k="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == k) c = i } NR == 2 && c { print $c }' "$1"
}

# params_of LOG: the parameter count an example's log states
params_of() {
    grep -o '[0-9]* parameters' "$1" | head -n 1 | cut -d' ' -f1
}

# medians K < RAW.csv: one row per distinct value of the first K columns (in order of first appearance), with
# the median of every later column over the rows that share them, then their count as column "runs"
medians() {
    awk -F, -v K="$1" '
        function med(s,   v, n, i, j, t) {
            n = split(s, v, " ")
            for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
            return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        }
        NR == 1 { print $0 ",runs"; nf = NF; next }
        {
            key = $1; for (i = 2; i <= K; i++) key = key "," $i
            if (!(key in cnt)) order[++nk] = key
            cnt[key]++
            for (i = K + 1; i <= NF; i++) vals[key, i] = vals[key, i] " " $i
        }
        END {
            for (k = 1; k <= nk; k++) {
                line = order[k]
                for (i = K + 1; i <= nf; i++) line = line "," med(vals[order[k], i])
                print line "," cnt[order[k]]
            }
        }'
}
