#!/bin/sh
# tools/docs_check.sh [BUILD] [CHAPTER.md]... - runs the tutorial's experiments, shortened, and checks its
# quotations of the examples (make docs-check; tests/run.sh runs it too). Without CHAPTERs: every
# docs/tutorial/*.md. In a chapter:
#   <!-- docs-check: run [--FLAG VALUE]... -->   before a ```sh block: every command of the block (lines
#       ending in a backslash joined) runs, in order, from a scratch directory laid out like the repository
#       root (build/examples, tools, examples, dtrain.h and dtrain/ linked from the repository and BUILD;
#       build/tutorial and docs/tutorial/img empty, so the committed charts are not touched). Each --FLAG VALUE of the marker
#       replaces the value of that flag in every command that has the flag (--epochs 1, --limit 512, ...),
#       and +--FLAG VALUE adds it to the training examples' commands that lack it too: the commands run are
#       the ones the chapter shows, shorter. A command passes when it exits 0 within
#       $DOCS_CHECK_TIMEOUT seconds (default 600) and every file it names after --csv or -o exists and is not
#       empty (a .png must be a PNG).
#   <!-- docs-check: file NAME -->   before a fenced block: the block is written to NAME (under build/tutorial/)
#       for the commands after it (a program they compile).
#   <!-- docs-check: expect "LABEL" TOL ["LABEL" TOL]... -->   before a ```text block: the block quotes the standard
#       output of the run block before it (its commands' in order; a line "[...]" stands for lines left out), and
#       is compared with what they printed when they ran as shown (DOCS_CHECK_FULL=1, or a run marker with no
#       flags: a short run the chapter quotes, which CI then checks). Each quoted line is matched with the next
#       printed line that starts like it (its first word, and the next word too if it is a count such as 3/20);
#       their words without digits must be the same, and the number after each LABEL (before it, for "<LABEL")
#       must agree within TOL: e.g. expect "test acc" 0.5 "train loss" 0.005 "<MB sent" 0. Other figures
#       (times, images per second) are not compared. expect exact: the block is the output, line for line.
#   A ```text block right after a line that ends with a citation `FILE:A-B` (or `FILE:A`) quotes the
#       repository's FILE: it must be lines A to B of FILE, exactly. Every other citation FILE:A-B in the
#       chapters must lie within FILE.
# Commands that draw with tools/plot.sh are skipped when gnuplot is missing; the examples' training runs (and
# the charts drawn from them) when Fashion-MNIST is. Each command, file and quotation is one check; the last
# line is "N passed, N failed", and the exit status is non-zero when anything failed.
# DOCS_CHECK_QUIET=1 prints only what failed or was skipped, and the total.
# DOCS_CHECK_FULL=1 runs the commands as the chapters show them, from the repository root: the experiments
# at full length, which redraws the committed charts in docs/tutorial/img (BUILD must then be build).
B=${1:-build}
[ $# -gt 0 ] && shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
[ $# -gt 0 ] || set -- docs/tutorial/*.md
case $B in /*) BABS=$B ;; *) BABS=$ROOT/$B ;; esac
passed=0; failed=0; skipped=0
DATA=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
have_data=1; [ -f "$DATA" ] || have_data=0
have_gnuplot=1; command -v gnuplot >/dev/null 2>&1 || have_gnuplot=0
TIMEOUT=${DOCS_CHECK_TIMEOUT:-600}
ok() { [ -n "$DOCS_CHECK_QUIET" ] || echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; [ -n "$2" ] && printf '%s\n' "$2" | sed 's/^/     /'; failed=$((failed + 1)); }
skip() { echo "skip $1"; skipped=$((skipped + 1)); }
US=$(printf '\037')   # the field separator of items: not whitespace, so empty fields stay

# One chapter's items in document order, one per line, fields separated by $US: RUN LINE FLAGS COMMAND;
# FILE LINE NAME (the block written to SCRATCH/NAME); QUOTE LINE FILE A B BLOCKFILE (the quoted lines written to
# BLOCKFILE); CITE LINE FILE A B.
items() {   # items CHAPTER RUNDIR SCRATCH
    awk -v dir="$2" -v qdir="$3" -v US="$US" '
    function cites(s, line,   t, f, a, b) {   # every FILE:A or FILE:A-B in s
        while (match(s, /[A-Za-z0-9_.\/-]+\.(c|h|sh|md):[0-9]+(-[0-9]+)?/)) {
            t = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
            f = t; sub(/:.*/, "", f); a = t; sub(/^[^:]*:/, "", a); b = a
            if (a ~ /-/) { sub(/-.*/, "", a); sub(/^[^-]*-/, "", b) }
            if (f !~ /^(http|www)/) printf "CITE%s%d%s%s%s%d%s%d\n", US, line, US, f, US, a, US, b
        }
    }
    BEGIN { fence = 0; nq = 0 }
    fence == 0 && /^<!-- docs-check: / {
        m = $0; sub(/^<!-- docs-check: */, "", m); sub(/ *-->.*$/, "", m)
        kind = m; sub(/ .*/, "", kind); rest = m; if (rest ~ / /) sub(/^[^ ]* */, "", rest); else rest = ""
        pending = kind; pending_arg = rest; next
    }
    fence == 0 && /^```/ {
        fence = 1; info = substr($0, 4); start = NR
        mode = "none"
        if (pending == "run") { mode = "run"; printf "BLOCK%s%d%s%s\n", US, NR, US, pending_arg }
        else if (pending == "file") { mode = "file"; out = dir "/" pending_arg; printf "" > out }
        else if (pending == "expect") { mode = "expect"; out = qdir "/.expect" (++nq); printf "" > out }
        else if (info == "text" && prev ~ /`[A-Za-z0-9_.\/-]+\.(c|h|sh):[0-9]+(-[0-9]+)?`:?[ \t]*$/) {
            mode = "quote"; q = prev; sub(/`:?[ \t]*$/, "", q); sub(/.*`/, "", q)
            qf = q; sub(/:.*/, "", qf); qa = q; sub(/^[^:]*:/, "", qa); qb = qa
            if (qa ~ /-/) { sub(/-.*/, "", qa); sub(/^[^-]*-/, "", qb) }
            out = qdir "/.quote" (++nq); printf "" > out
        }
        pending = ""; cmd = ""; cmdline = 0; next
    }
    fence == 1 && /^```/ {
        fence = 0
        if (mode == "file" || mode == "quote" || mode == "expect") close(out)
        if (mode == "quote") printf "QUOTE%s%d%s%s%s%d%s%d%s%s\n", US, start - 1, US, qf, US, qa, US, qb, US, out
        if (mode == "expect") printf "EXPECT%s%d%s%s%s%s\n", US, start, US, pending_arg, US, out
        if (mode == "file") printf "FILE%s%d%s%s\n", US, start, US, pending_arg
        prev = $0; next
    }
    fence == 1 {
        if (mode == "file" || mode == "quote" || mode == "expect") print > out
        else if (mode == "run") {
            line = $0
            if (cmd == "") cmdline = NR
            if (line ~ /\\$/) { sub(/\\$/, "", line); cmd = cmd line; next }
            cmd = cmd line
            sub(/^[ \t]+/, "", cmd)
            if (cmd != "" && cmd !~ /^#/) printf "RUN%s%d%s%s%s%s\n", US, cmdline, US, pending_arg, US, cmd
            cmd = ""
        }
        next
    }
    { if (!($0 ~ /^[ \t]*$/)) prev = $0; cites($0, NR) }
    ' "$1"
}

# the command with each "--FLAG VALUE" of flags put in place of that flag's value where it has the flag; a
# "+--FLAG VALUE" also adds the flag to a training example's command that lacks it (build/examples/ train,
# ddp, dpsgd, fedavg, localsgd, hogwild: +--test-limit 500 on a short run, +--limit on the README's demo)
shorten() {   # shorten FLAGS COMMAND
    c=$2
    set -- $1
    while [ $# -ge 2 ]; do
        f=${1#+}
        if [ "$f" != "$1" ] && ! printf '%s\n' "$c" | grep -q -- " $f " &&
            printf '%s\n' "$c" | grep -Eq '^(\./)?build/examples/(train|ddp|dpsgd|fedavg|localsgd|hogwild) '; then
            case $c in   # before a pipe, if the command has one
            *' | '*) c="${c%% | *} $f $2 | ${c#* | }" ;;
            *) c="$c $f $2" ;;
            esac
        else c=$(printf '%s\n' "$c" | sed "s#\\(^\\| \\)$f [^ ]*#\\1$f $2#g")
        fi
        shift 2
    done
    printf '%s\n' "$c"
}

# the files a command writes: the word after --csv, and after -o
outputs() { printf '%s\n' "$1" | awk '{ for (i = 1; i < NF; i++) if ($i == "--csv" || $i == "-o") print $(i + 1) }' | tr -d "'\""; }

# Compares a quoted output (QUOTED, a file) with what the commands printed (ACTUAL) as SPEC says: "exact" (the same
# lines), or "LABEL" TOL ... (see the top). Prints what differs, one line each; exits non-zero when anything does.
compare_output() {   # compare_output SPEC QUOTED ACTUAL
    awk -v spec="$1" -v qfile="$2" '
    function key(s,   w, n) { n = split(s, w, " "); return w[1] (n > 1 && w[2] ~ /^[0-9]+\/[0-9]+$/ ? " " w[2] : "") }
    function words(s,   w, n, i, o) {   # the words without a digit: the text a figure may not change
        n = split(s, w, " "); o = ""
        for (i = 1; i <= n; i++) if (w[i] !~ /[0-9]/) o = o " " w[i]
        return o
    }
    function after(s, label,   i, t) {   # the number after label in s, or before it for "<label" ("": no label)
        if (label ~ /^</) {
            i = index(s, substr(label, 2)); if (!i) return ""
            t = substr(s, 1, i - 1); sub(/[ \t]+$/, "", t); sub(/^.*[ \t]/, "", t)
        } else {
            i = index(s, label); if (!i) return ""
            t = substr(s, i + length(label)); sub(/^[ \t:=]*/, "", t); sub(/[ \t,;].*$/, "", t)
        }
        sub(/[^0-9]+$/, "", t)   # 62.71% and 5), as numbers
        return t ~ /^-?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$/ ? t : "NaN"
    }
    function abs(x) { return x < 0 ? -x : x }
    BEGIN {
        exact = spec ~ /^ *exact *$/; nl = 0; rest = spec
        while (match(rest, /"[^"]*"[ \t]+[0-9.]+/)) {   # "LABEL" TOL pairs
            pair = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
            lab = pair; sub(/^"/, "", lab); sub(/".*$/, "", lab)
            tol = pair; sub(/^"[^"]*"[ \t]+/, "", tol)
            nl++; label[nl] = lab; tolerance[nl] = tol + 0
        }
        while ((getline l < qfile) > 0) if (l !~ /^[ \t]*(\[\.\.\.\])?[ \t]*$/) quoted[++nq] = l
        if (!exact && nl == 0) { print "the marker names no \"LABEL\" TOL and is not exact: " spec; bad = 1 }
    }
    { if ($0 !~ /^[ \t]*$/) actual[++na] = $0 }
    END {
        if (exact) {
            n = nq > na ? nq : na
            for (i = 1; i <= n; i++) if (quoted[i] != actual[i]) { printf "line %d is now:\n  %s\nquoted:\n  %s\n", i, actual[i], quoted[i]; exit 1 }
            exit bad
        }
        j = 1
        for (i = 1; i <= nq; i++) {
            q = quoted[i]; k = key(q)
            while (j <= na && key(actual[j]) != k) j++
            if (j > na) { printf "the quoted line is not in the output (after its lines before):\n  %s\n", q; bad = 1; break }
            a = actual[j]
            if (words(q) != words(a)) { printf "the quoted line\n  %s\nis now\n  %s\n", q, a; bad = 1 }
            for (m = 1; m <= nl; m++) {
                x = after(q, label[m]); if (x == "") continue
                y = after(a, label[m])
                if (y == "" || y == "NaN" || x == "NaN" || abs(x - y) > tolerance[m] + 1e-9) {
                    printf "%s: quoted %s, printed %s (tolerance %s), in\n  %s\n", label[m], x, y == "" ? "nothing" : y, tolerance[m], a; bad = 1
                }
            }
            j++
        }
        exit bad
    }' "$3"
}

for md in "$@"; do
    [ -f "$md" ] || { fail "$md: no such chapter"; continue; }
    name=$(printf '%s' "$md" | sed 's|^docs/||; s|\.md$||; s|/|-|g')   # tutorial-README, course-README: not one directory
    S=$BABS/docs-check/$name
    rm -rf "$S" && mkdir -p "$S/build" "$S/docs/tutorial/img" || { fail "$md: cannot make $S"; continue; }
    ln -s "$BABS/examples" "$S/build/examples"
    ln -s "$ROOT/tools" "$S/tools"; ln -s "$ROOT/examples" "$S/examples"; ln -s "$ROOT/dtrain.h" "$S/dtrain.h"
    ln -s "$ROOT/dtrain" "$S/dtrain"; ln -s "$ROOT/dtrain_mpi.h" "$S/dtrain_mpi.h"   # the modules dtrain.h includes
    R=$S
    if [ -n "$DOCS_CHECK_FULL" ]; then R=$ROOT; mkdir -p "$ROOT/build/tutorial" "$ROOT/docs/tutorial/img"; fi
    mkdir -p "$S/build/tutorial"
    [ -n "$DOCS_CHECK_QUIET" ] || echo "== $md (in $R)"
    training_skipped=0
    items "$md" "$R" "$S" > "$S/.items" || { fail "$md: cannot be read"; continue; }
    block_ran=0; block_short=0
    while IFS="$US" read -r kind line a b c d; do
        where="$md:$line"
        case $kind in
        FILE) ok "$where: $a written" ;;
        BLOCK)   # a run block: its commands' standard output is collected for an expect marker after it
            : > "$S/.block"; block_ran=1; block_short=0
            [ -n "$a" ] && [ -z "$DOCS_CHECK_FULL" ] && block_short=1 ;;
        EXPECT)
            if [ $block_short -eq 1 ]; then
                [ -n "$DOCS_CHECK_QUIET" ] || echo "note $where: the output of the full-length run: compared with DOCS_CHECK_FULL=1"
            elif [ $block_ran -ne 1 ]; then skip "$where: the output quoted (its commands did not all run)"
            elif diffs=$(compare_output "$a" "$b" "$S/.block"); then ok "$where: the quoted output is the run's (${a})"
            else fail "$where: the quoted output differs from what the run printed (${a})" "$diffs"
            fi ;;
        CITE)
            n=$(wc -l < "$a" 2>/dev/null)
            if [ ! -f "$a" ]; then fail "$where: cites $a, which does not exist"
            elif [ "$b" -lt 1 ] || [ "$c" -lt "$b" ] || [ "$c" -gt "$n" ]; then fail "$where: cites $a:$b-$c, but $a has $n lines"
            fi ;;
        QUOTE)
            if [ ! -f "$a" ]; then fail "$where: quotes $a, which does not exist"; continue; fi
            lines=$b; [ "$c" != "$b" ] && lines=$b-$c
            if sed -n "${b},${c}p" "$a" | cmp -s - "$d"; then ok "$where: quotes $a:$lines"; continue; fi
            first=$(head -n 1 "$d")
            now=$(grep -nxF -- "$first" "$a" | head -n 3 | cut -d: -f1 | tr '\n' ' ' | sed 's/ $//')
            fail "$where: the quotation of $a:$lines differs from the file" \
                "$(printf 'its first line is now at line(s) %s of %s; the quoted lines are:\n%s\nthe file has:\n%s' \
                    "${now:-none}" "$a" "$(cat "$d")" "$(sed -n "${b},${c}p" "$a")")"
            ;;
        RUN)
            cmd=$b
            [ -n "$DOCS_CHECK_FULL" ] || cmd=$(shorten "$a" "$b")
            case $cmd in
            *tools/plot.sh*)
                if [ $have_gnuplot -eq 0 ]; then skip "$where: $cmd (gnuplot is not installed)"; continue; fi
                if [ $training_skipped -eq 1 ]; then skip "$where: $cmd (its runs were skipped)"; continue; fi ;;
            *build/examples/allreduce*) ;;
            *build/examples/*)
                if [ $have_data -eq 0 ]; then
                    skip "$where: $cmd (Fashion-MNIST is not installed)"; training_skipped=1; block_ran=0; continue
                fi ;;
            esac
            for f in $(outputs "$cmd"); do rm -f "$R/$f"; done   # a file left by an earlier run proves nothing
            t0=$(date +%s)
            (cd "$R" && timeout "$TIMEOUT" sh -c "$cmd" < /dev/null) > "$S/.out" 2> "$S/.err"; rc=$?
            secs=$(( $(date +%s) - t0 ))
            cat "$S/.out" >> "$S/.block"   # standard output only: what the chapters quote
            [ -n "$DOCS_CHECK_FULL" ] && cat "$S/.out" "$S/.err" | sed 's/^/     | /'
            if [ $rc -ne 0 ]; then block_ran=0; fail "$where: $cmd (exit $rc after ${secs}s)" "$(cat "$S/.out" "$S/.err" | tail -n 15)"; continue; fi
            bad=""
            for f in $(outputs "$cmd"); do
                if [ ! -s "$R/$f" ]; then bad="$bad $f (missing or empty)"
                else case $f in *.png) [ "$(head -c 4 "$R/$f" | tail -c 3)" = PNG ] || bad="$bad $f (not a PNG)" ;; esac
                fi
            done
            if [ -n "$bad" ]; then block_ran=0; fail "$where: $cmd: no output:$bad"; else ok "$where: $cmd (${secs}s)"; fi
            ;;
        esac
    done < "$S/.items"
done
[ $skipped -gt 0 ] && echo "skipped $skipped commands (see above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
