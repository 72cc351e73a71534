#!/bin/sh
# tools/check_snippets.sh [DIR] - compiles every C code block of the documentation, so no snippet rots.
#
# Blocks: every fenced block whose info string is "c" (```c ... ```) in README.md and in every docs/**/*.md,
# and the code of each "QUICK START" section in the top comments of dtrain.h, dtrain_mpi.h and dtrain_cuda.h
# (the first run of lines indented by 9 spaces after the heading). Each block is one test, written to DIR (default
# build/snippets) as NNN.c with a #line directive, so the compiler's messages name the .md file and line.
#
# A block is compiled in one of three ways, its KIND:
#   program  it has a main(): compiled and linked as a whole program
#   file     it has file-scope code (a #-line, a function declared or defined at column 0, a static,
#            typedef, struct, enum, union or extern at column 0): compiled as a translation unit
#   body     anything else: statements, compiled as the body of a function (in a block of its own)
#            that has these placeholders as parameters, for the names the docs use for the usual things:
#                dt_model *m, dt_optim *o, dt_comm *c, dt_dataset *ds, dt_loader *loader,
#                float *images, int32_t *labels, int64_t batch, int argc, char **argv
#            (a declaration in the block hides the placeholder of the same name)
# A block that does not #include "dtrain.h" itself gets <stdio.h>, <stdlib.h>, <string.h>, <stdint.h> and
# "dtrain.h" (a block from dtrain_mpi.h or dtrain_cuda.h: that header too) in front; a program is linked with the
# implementation, compiled once; one that defines DTRAIN_IMPLEMENTATION itself (as a user's one-file program
# does) gets -DDTRAIN_IMPLEMENTATION_LINKED, unless it sets a DT_ or DTRAIN_ macro or is compiled by mpicc: then
# it is compiled alone.
# Warnings are errors: $CC -std=c11 -Wall -Wextra -Wpedantic -Werror, with OpenMP when $CC has it, and
# $DEFS / $LDLIBS (the Makefile's optional features; defaults -pthread / -lm). In file and body blocks,
# which are parts of a larger program, unused variables, parameters and static functions are allowed.
# Blocks from dtrain_mpi.h, and blocks that name it (e.g. in a preamble that includes it), are compiled
# with mpicc and -DDT_USE_MPI, and skipped where mpicc is not installed.
#
# Directives: HTML comments (invisible on the rendered page) in the text between the previous fenced
# block and a ```c block apply to that block, one per line:
#   <!-- snippet: program -->          (or file, body) the kind, where the guess above is wrong
#   <!-- snippet: skip REASON -->      not compiled (say why; e.g. a deliberate error); counted as skipped
#   <!-- snippet-preamble: CODE -->    C code put at file scope in front of the block (declarations the
#                                      block uses; several lines add up)
#   <!-- snippet-run: ARGS -->         a program is also run with ARGS in DIR (within 120 s) and must
#                                      exit with status 0
#   <!-- snippet-file: PATH -->        the block is the text of the file PATH (from the repository's root,
#                                      e.g. examples/simple/quickstart.c) and must equal it, byte for byte
# Prints "ok" or "FAIL" (with the compiler's messages) per block, then "N passed, N failed"; the exit
# status is 1 when a block failed. POSIX sh and awk.
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
OUT=${1:-build/snippets}
CC=${CC:-gcc}
DEFS=${DEFS--pthread}
LDLIBS=${LDLIBS--lm}
mkdir -p "$OUT" || exit 1
rm -f "$OUT"/[0-9][0-9][0-9]*
OPENMP=$(printf 'int main(void){return 0;}' | $CC -fopenmp -x c - -o "$OUT/omp-probe" 2>/dev/null && echo -fopenmp)
WARN="-std=c11 -Wall -Wextra -Wpedantic -Werror"
FLAGS="$WARN -O1 $OPENMP -I$ROOT $DEFS"
PART="-Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-parameter -Wno-unused-function"
PLACEHOLDERS="dt_model *m, dt_optim *o, dt_comm *c, dt_dataset *ds, dt_loader *loader, float *images, int32_t *labels, int64_t batch, int argc, char **argv"

# ---- extract: OUT/NNN.c (the block), NNN.pre (preamble), NNN.run (arguments); OUT/blocks: NNN SOURCE LINE KIND RUN
DOCS=$(ls README.md 2>/dev/null; find docs -name '*.md' 2>/dev/null | LC_ALL=C sort)
: > "$OUT/blocks"
if [ -n "$DOCS" ]; then
    # shellcheck disable=SC2086
    awk -v out="$OUT" '
        function reset() { kind = ""; run = 0; pre = ""; runargs = ""; fileref = "" }
        function directive(s, name) {   # the text of <!-- name: TEXT -->
            sub("^.*<!--[ \t]*" name ":[ \t]*", "", s); sub("[ \t]*-->.*$", "", s); return s
        }
        function unclosed() {
            if (infence && isc) { close(file); printf "%s %s %d unclosed 0\n", id, src, start >> (out "/blocks") }
        }
        FNR == 1 { unclosed(); infence = 0; reset() }
        {
            line = $0
            if (!infence) {
                if (match(line, /^ ? ? ?```/)) {
                    indent = RLENGTH - 3
                    info = substr(line, RLENGTH + 1); sub(/^[ \t]+/, "", info); split(info, w, /[ \t{]/)
                    infence = 1; isc = (w[1] == "c")
                    if (isc) {
                        n++; id = sprintf("%03d", n); file = out "/" id ".c"; src = FILENAME; start = FNR
                        printf "" > file
                        if (pre != "") { printf "%s", pre > (out "/" id ".pre"); close(out "/" id ".pre") }
                        if (run) { print runargs > (out "/" id ".run"); close(out "/" id ".run") }
                        if (fileref != "") { print fileref > (out "/" id ".file"); close(out "/" id ".file") }
                        k = kind == "" ? "auto" : kind
                        if (k ~ /^skip/) { r = k; sub(/^skip[ \t]*/, "", r); print r > (out "/" id ".skip"); close(out "/" id ".skip"); k = "skip" }
                        else if (k !~ /^(auto|program|file|body)$/) k = "bad:" k
                        pending = sprintf("%s %s %d %s %d", id, src, start, k, run)   # listed when it closes
                    }
                    reset(); next
                }
                if (line ~ /<!--[ \t]*snippet:/) kind = directive(line, "snippet")
                if (line ~ /<!--[ \t]*snippet-preamble:/) pre = pre directive(line, "snippet-preamble") "\n"
                if (line ~ /<!--[ \t]*snippet-run:/) { run = 1; runargs = directive(line, "snippet-run") }
                if (line ~ /<!--[ \t]*snippet-file:/) fileref = directive(line, "snippet-file")
                next
            }
            if (line ~ /^ ? ? ?```[ \t]*$/) {
                if (isc) { close(file); print pending >> (out "/blocks") }
                infence = 0; next
            }
            if (isc) {
                for (i = 0; i < indent && substr(line, 1, 1) == " "; i++) line = substr(line, 2)
                print line > file
            }
        }
        END { unclosed() }
    ' $DOCS
fi
# the QUICK START sections of the headers' manuals
last=$(tail -n 1 "$OUT/blocks" | cut -d' ' -f1)
awk -v out="$OUT" -v n="${last:-0}" '
    FNR == 1 { top = 1; sec = ""; code = 0 }
    !top { next }
    /\*\// { top = 0 }
    /^   [A-Z][A-Z0-9 ,\/()-]*$/ { sec = $0; code = 0; next }
    sec ~ /QUICK START/ && /^         / {
        if (!code) {
            n++; id = sprintf("%03d", n); file = out "/" id ".c"; code = 1
            printf "%s %s %d auto 0\n", id, FILENAME, FNR - 1 >> (out "/blocks")
        }
        print substr($0, 10) > file; next
    }
    code { close(file); code = 0; sec = "" }
' dtrain.h dtrain_mpi.h dtrain_cuda.h

# ---- compile
passed=0; failed=0; skipped=0
fail() { echo "FAIL $where ($kind): $1"; [ -s "$OUT/$id.err" ] && head -n 30 "$OUT/$id.err"; failed=$((failed + 1)); }
impl_ok=""
impl() {   # the implementation, compiled once, for programs that do not define it
    if [ -z "$impl_ok" ]; then
        printf '#define DTRAIN_IMPLEMENTATION\n#include "dtrain.h"\n' > "$OUT/impl.c"
        # shellcheck disable=SC2086
        if $CC $FLAGS -c "$OUT/impl.c" -o "$OUT/impl.o" 2> "$OUT/impl.err"; then impl_ok=1; else impl_ok=0; fi
    fi
    [ "$impl_ok" = 1 ]
}
while read -r id src line kind run; do
    where="$src:$line"
    block="$OUT/$id.c"
    case "$kind" in
        unclosed) fail "the code block is never closed (no line with \`\`\` after it)"; continue ;;
        skip) echo "skip $where: $(cat "$OUT/$id.skip")"; skipped=$((skipped + 1)); continue ;;
        bad:*) fail "unknown kind '${kind#bad:}' in <!-- snippet: ... --> (program, file, body or skip REASON)"; continue ;;
    esac
    if [ -f "$OUT/$id.file" ]; then   # <!-- snippet-file: PATH -->: the block and the file are one text
        ref=$(cat "$OUT/$id.file")
        if ! cmp -s "$block" "$ref"; then
            diff "$ref" "$block" > "$OUT/$id.err" 2>&1; fail "is not the text of $ref (<!-- snippet-file -->): make them the same"; continue
        fi
    fi
    # blocks of dtrain.h's own top comment do not include it (it is the file they are in)
    header=dtrain.h
    case "$src" in *.h) header=$src ;; esac
    cc=$CC; flags=$FLAGS
    if [ "$src" = dtrain_mpi.h ] || cat "$block" "$OUT/$id.pre" 2>/dev/null | grep -q 'dtrain_mpi\.h'; then
        if ! command -v mpicc >/dev/null 2>&1; then echo "skip $where: mpicc is not installed"; skipped=$((skipped + 1)); continue; fi
        cc=mpicc; flags="$FLAGS -DDT_USE_MPI"
    fi
    if [ "$kind" = auto ]; then
        if grep -qE '(^|[^A-Za-z0-9_])main[[:space:]]*\(' "$block"; then kind=program
        elif grep -qE '^(#|static[[:space:]]|typedef[[:space:]]|struct[[:space:]]|enum[[:space:]]|union[[:space:]]|extern[[:space:]])' "$block" ||
             grep -vE '^(return|if|else|for|while|do|switch|case|goto|sizeof)([^A-Za-z0-9_]|$)' "$block" |
                 grep -qE '^[A-Za-z_][A-Za-z0-9_ *]*[ *][A-Za-z_][A-Za-z0-9_]*[[:space:]]*\('; then kind=file
        else kind=body; fi
    fi
    s="$OUT/$id.src.c"
    {
        if ! grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"dtrain(_mpi|_cuda)?\.h"' "$block"; then
            printf '#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <stdint.h>\n#include "dtrain.h"\n'
            [ "$header" != dtrain.h ] && printf '#include "%s"\n' "$header"
        fi
        [ -f "$OUT/$id.pre" ] && cat "$OUT/$id.pre"
        case "$kind" in
            body) printf 'int dt_snippet_body(%s);\nint dt_snippet_body(%s) { {\n' "$PLACEHOLDERS" "$PLACEHOLDERS" ;;
        esac
        printf '#line %d "%s"\n' $((line + 1)) "$src"
        cat "$block"
        [ "$kind" = body ] && printf '} return 0; }\n'
    } > "$s"
    # shellcheck disable=SC2086
    case "$kind" in
        program)
            # a program that defines DTRAIN_IMPLEMENTATION, as a user's one file does, links the object too
            # (-DDTRAIN_IMPLEMENTATION_LINKED), unless it sets a macro of the library's (DT_..., DTRAIN_...) or is MPI's
            objs="$OUT/impl.o"; linked=""
            if grep -qE '^[[:space:]]*#[[:space:]]*define[[:space:]]+DTRAIN_IMPLEMENTATION' "$block"; then
                if [ "$cc" = "$CC" ] && ! cat "$block" "$OUT/$id.pre" 2>/dev/null |
                        grep -E '^[[:space:]]*#[[:space:]]*define[[:space:]]+(DT_|DT__|DTRAIN_)' | grep -qv 'DTRAIN_IMPLEMENTATION[[:space:]]*$'; then
                    linked=-DDTRAIN_IMPLEMENTATION_LINKED
                else objs=""; fi
            fi
            if [ -n "$objs" ] && ! impl; then cp "$OUT/impl.err" "$OUT/$id.err"; fail "the implementation does not compile"; continue; fi
            if ! $cc $flags $linked "$s" $objs -o "$OUT/$id" $LDLIBS 2> "$OUT/$id.err"; then fail "does not compile"; continue; fi
            if [ "$run" = 1 ]; then
                args=$(cat "$OUT/$id.run")
                if ! (cd "$OUT" && timeout 120 "./$id" $args > "$id.out" 2>&1); then
                    cp "$OUT/$id.out" "$OUT/$id.err"; fail "ran ./$id${args:+ $args}: exit status not 0"; continue
                fi
                last=$(tail -n 1 "$OUT/$id.out")
                echo "ok   $where ($kind, ran${args:+ with $args}${last:+: $last})"; passed=$((passed + 1)); continue
            fi ;;
        file|body)
            if ! $cc $flags $PART -c "$s" -o "$OUT/$id.o" 2> "$OUT/$id.err"; then fail "does not compile"; continue; fi ;;
    esac
    echo "ok   $where ($kind)"; passed=$((passed + 1))
done < "$OUT/blocks"
[ "$skipped" -gt 0 ] && echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
