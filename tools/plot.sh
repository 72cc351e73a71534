#!/bin/sh
# tools/plot.sh - learning curves from the examples' CSV files (--csv), drawn as one PNG with gnuplot.
# usage: tools/plot.sh [-o OUT.png] [-t TITLE] [-x COLUMN] [-y COLUMN]... CSV[=LINE_TITLE]...
#   One panel per -y column, side by side (default: -y test_loss -y test_acc); in each panel one line per
#   CSV, titled LINE_TITLE (default: the file's name without .csv). Columns are found by the names in each
#   file's header line, so CSVs of different examples (train, ddp, dpsgd, fedavg, localsgd, hogwild) can
#   share a chart. -x defaults to each file's first column (epoch, or round for fedavg). Columns named
#   *_acc, *_top5 or *_rate hold fractions and are drawn in percent. OUT defaults to curves.png.
#   e.g. tools/plot.sh -o ranks.png -t "DDP, SimpleCNN" ddp1.csv="1 rank" ddp4.csv="4 ranks"
#        tools/plot.sh -y test_acc -y class_acc clean.csv=clean flip.csv="1 label flipper"
# Exit status 2 (with a message) for a bad flag, a missing file, a file without an asked column or an OUT whose
# directory does not exist;
# 1 when gnuplot is missing (tools/deps.sh gnuplot-nox) or fails.
out=curves.png; title=""; x=""; ys=""
usage() { echo "usage: tools/plot.sh [-o OUT.png] [-t TITLE] [-x COLUMN] [-y COLUMN]... CSV[=LINE_TITLE]..." >&2; exit 2; }
while getopts o:t:x:y:h opt; do
    case $opt in
    o) out=$OPTARG ;;
    t) title=$OPTARG ;;
    x) x=$OPTARG ;;
    y) ys="$ys $OPTARG" ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
[ -n "$ys" ] || ys="test_loss test_acc"

# the 1-based position of column $2 in the header of file $1, or nothing
column_of() { head -n 1 "$1" | tr -d '\r' | awk -F, -v c="$2" '{ for (i = 1; i <= NF; i++) if ($i == c) { print i; exit } }'; }
# a gnuplot single-quoted string ('' is a quote inside one)
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/''/g")"; }
is_percent() { case $1 in *_acc|*_top5|*_rate) return 0 ;; esac; return 1; }
# an argument is FILE or FILE=TITLE (a file whose own name holds '=' is taken whole): sets f and name
split_arg() { f=$1; name=""; [ -f "$f" ] || { f=${1%%=*}; name=${1#*=}; }; [ -n "$name" ] || name=$(basename "$f" .csv); }

# every file must exist, have rows and every asked column: checked before anything is drawn
for arg in "$@"; do
    split_arg "$arg"
    [ -f "$f" ] || { echo "tools/plot.sh: no such file: $f" >&2; exit 2; }
    [ "$(wc -l < "$f")" -ge 2 ] || { echo "tools/plot.sh: $f has no rows below its header" >&2; exit 2; }
    for c in $x $ys; do
        [ -n "$(column_of "$f" "$c")" ] && continue
        echo "tools/plot.sh: $f has no column '$c' (its columns: $(head -n 1 "$f" | tr -d '\r' | sed 's/,/, /g'))" >&2
        exit 2
    done
done
# gnuplot writes the PNG to standard output when it cannot open OUT, so a missing directory is refused first
[ -d "$(dirname "$out")" ] || { echo "tools/plot.sh: cannot write $out: no directory $(dirname "$out")" >&2; exit 2; }
command -v gnuplot >/dev/null 2>&1 || { echo "tools/plot.sh: gnuplot is not installed (tools/deps.sh gnuplot-nox)" >&2; exit 1; }

# the line titles, and the widest, for the key right of the last panel
widest=0
for arg in "$@"; do
    split_arg "$arg"
    [ ${#name} -gt $widest ] && widest=${#name}
done
n=0; for c in $ys; do n=$((n + 1)); done
split_arg "$1"
xlabel=${x:-$(head -n 1 "$f" | tr -d '\r' | cut -d, -f1)}
pw=460; kw=$((widest * 6 + 70)); width=$((n * pw + kw))   # panels of pw pixels, the key kw wide
{
    echo "set terminal png noenhanced size $width,420"
    echo "set output $(quote "$out")"
    echo "set datafile separator ','"
    echo "set grid"
    echo "set multiplot title $(quote "$title")"
    i=0
    for c in $ys; do
        scale=1; label=$c
        is_percent "$c" && { scale=100; label="$c (%)"; }
        w=$pw; echo "unset key"
        [ $i -eq $((n - 1)) ] && { w=$((pw + kw)); echo "set key outside right top vertical"; }
        echo "set origin $((i * pw)).0 / $width, 0"
        echo "set size $w.0 / $width, 0.93"
        echo "set xlabel $(quote "$xlabel")"
        echo "set ylabel $(quote "$label")"
        printf 'plot'
        sep=""
        for arg in "$@"; do
            split_arg "$arg"
            xi=1; [ -n "$x" ] && xi=$(column_of "$f" "$x")
            printf '%s %s skip 1 using %s:($%s*%s) with linespoints lw 2 pt 7 ps 0.6 title %s' \
                "$sep" "$(quote "$f")" "$xi" "$(column_of "$f" "$c")" "$scale" "$(quote "$name")"
            sep=","
        done
        echo
        i=$((i + 1))
    done
    echo "unset multiplot"
} | gnuplot || { echo "tools/plot.sh: gnuplot failed" >&2; exit 1; }
echo "tools/plot.sh: wrote $out"
