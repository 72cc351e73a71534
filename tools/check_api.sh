#!/bin/sh
# tools/check_api.sh [--list] [API_MD] - the API reference documents every public name of the headers.
#
# The public names are read from the declaration parts of the headers: dtrain.h's modules (the files it
# includes from dtrain/, each up to the line that closes its include guard, e.g. dtrain/comm/comm.h up to
# "#endif /* DTRAIN_COMM_H */"), dtrain_mpi.h up to "#endif /* DTRAIN_MPI_H */" and dtrain_cuda.h up to
# "#endif /* DTRAIN_CUDA_H */", comments left out:
#   function  an identifier dt_... followed by "(" (not "(*": that is a return type of a function pointer)
#   type      a typedef name: "} dt_x;", "typedef struct s dt_x;", "typedef R (*dt_x)(...);"
#   constant  an enum constant DT_...
#   macro     a #define of DT_... or DTRAIN_... (include guards left out)
# and, from the whole of each header, the loop bodies for backends (static inline dt_body_... functions,
# which are defined after the declarations);
# and from the whole of each header (implementation parts too), what a user sets from outside:
#   config    a macro tested by #ifdef, #ifndef or defined() (DT_... or DTRAIN_..., guards left out)
#   env       an environment variable read by getenv("DT_...")
# Internal names (dt__, DT__) are never public.
#
# Checks that
#   1. every name is documented in API_MD (default docs/api.md): it begins a code span (`name` or
#      `name(...)`) in the text outside fenced code blocks; a declaration inside a code block alone does
#      not count, so every name has its sentence; and (but configuration macros and environment
#      variables, which have their own section) it does so in the section of the header that declares it,
#      the one headed "## dtrain/comm/comm.h: ..." for a name of dtrain/comm/comm.h;
#   2. every config macro and environment variable is named in the top comment (the manual) of a header
#      that reads it; dtrain.h's manual counts for every module.
#   3. the contents line at the top of API_MD links every "## " section, in order, with its GitHub anchor.
# Prints each name missing, then "N public names, N missing"; the exit status is 1 when any is missing, a
# header's declaration part cannot be found or the contents line is out of date. --list prints the names
# with their kinds and exits.
# POSIX sh, awk, grep, sed, sort. Run from the repository root (or anywhere: it changes to it).
cd "$(dirname "$0")/.." || exit 1
list=0
if [ "${1:-}" = "--list" ]; then list=1; shift; fi
API=${1:-docs/api.md}
MODULES=$(sed -n 's/^#include "\(dtrain\/[a-z0-9_/]*\.h\)".*/\1/p' dtrain.h)
HEADERS="dtrain.h $MODULES dtrain_mpi.h dtrain_cuda.h"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
for h in $MODULES; do mkdir -p "$T/${h%/*}"; done
if [ -z "$MODULES" ]; then echo "FAIL dtrain.h includes no module dtrain/*/*.h"; exit 1; fi

# the C text of a file without comments (strings kept, a comment becomes a space)
strip_comments() {
    awk '{
        s = $0; n = length(s); out = ""; i = 1
        while (i <= n) {
            if (inc) {
                j = index(substr(s, i), "*/")
                if (j == 0) { i = n + 1; continue }
                i += j + 1; inc = 0; out = out " "; continue
            }
            two = substr(s, i, 2); c = substr(s, i, 1)
            if (two == "/*") { inc = 1; i += 2; continue }
            if (two == "//") break
            if (c == "\"") {
                j = i + 1
                while (j <= n && substr(s, j, 1) != "\"") { if (substr(s, j, 1) == "\\") j++; j++ }
                out = out substr(s, i, j - i + 1); i = j + 1; continue
            }
            out = out c; i++
        }
        print out
    }' "$1"
}

status=0
for h in $HEADERS; do
    guard=$(echo "$h" | sed 's|^dtrain/.*/|dtrain_|' | tr 'a-z.' 'A-Z_')
    # the declaration part: up to the line that closes the include guard
    if ! awk -v end="#endif /* $guard */" '{ print } index($0, end) == 1 { found = 1; exit } END { exit !found }' \
            "$h" > "$T/$h.decl"; then
        echo "FAIL $h: no line '#endif /* $guard */' closing its declarations"; status=1; continue
    fi
    strip_comments "$T/$h.decl" > "$T/$h.code"
    strip_comments "$h" > "$T/$h.all"
    tr '\n' ' ' < "$T/$h.code" > "$T/$h.line"
    {
        grep -oE '(^|[^A-Za-z0-9_])dt_[a-z0-9_]+[[:space:]]*\([^*]' "$T/$h.line" |
            sed -E 's/.*(dt_[a-z0-9_]+).*/\1 function/'
        grep -oE '\}[[:space:]]*dt_[a-z0-9_]+[[:space:]]*;' "$T/$h.line" | sed -E 's/.*(dt_[a-z0-9_]+).*/\1 type/'
        grep -oE 'typedef[[:space:]]+(struct|enum|union)[[:space:]]+[A-Za-z0-9_]+[[:space:]]+dt_[a-z0-9_]+[[:space:]]*;' \
            "$T/$h.line" | sed -E 's/.*[[:space:]](dt_[a-z0-9_]+).*/\1 type/'
        grep -oE 'typedef[^;]*\([[:space:]]*\*[[:space:]]*dt_[a-z0-9_]+[[:space:]]*\)' "$T/$h.line" |
            sed -E 's/.*\*[[:space:]]*(dt_[a-z0-9_]+).*/\1 type/'
        grep -oE 'enum[[:space:]]*[A-Za-z0-9_]*[[:space:]]*\{[^}]*\}' "$T/$h.line" |
            grep -oE '[{,][[:space:]]*DT_[A-Z0-9_]+' | sed -E 's/.*(DT_[A-Z0-9_]+).*/\1 constant/'
        grep -oE '^[[:space:]]*#[[:space:]]*define[[:space:]]+(DT|DTRAIN)_[A-Z0-9_]+' "$T/$h.code" |
            sed -E 's/.*define[[:space:]]+//; s/$/ macro/'
    } > "$T/$h.decls"
    # the loop bodies for backends (dt_body_*: static inline, defined after a module's declarations)
    grep -oE '^static inline[^(]*[[:space:]*]dt_body_[a-z0-9_]+[[:space:]]*\(' "$T/$h.all" |
        sed -E 's/.*(dt_body_[a-z0-9_]+).*/\1 function/' >> "$T/$h.decls"
    {
        grep -oE '#[[:space:]]*ifn?def[[:space:]]+(DT|DTRAIN)_[A-Z0-9_]+' "$T/$h.all" | sed -E 's/.*[[:space:]]//'
        grep -oE 'defined[[:space:]]*\(?[[:space:]]*(DT|DTRAIN)_[A-Z0-9_]+' "$T/$h.all" | sed -E 's/.*[[:space:](]//'
    } | sed 's/$/ config/' > "$T/$h.config"
    grep -oE 'getenv[[:space:]]*\([[:space:]]*"DT_[A-Z0-9_]+"' "$T/$h.all" | sed -E 's/.*"(DT_[A-Z0-9_]+)"/\1 env/' >> "$T/$h.config"
    # internal names and include guards are not public
    cat "$T/$h.decls" "$T/$h.config" | grep -vE '^(dt__|DT__)' | grep -vE '^DTRAIN(_[A-Z0-9_]*)?(_H|_DECLARED|_DONE) ' |
        awk -v h="$h" '!seen[$1]++ { print $1, $2, h }' > "$T/$h.names"
done
# one line per name: NAME KIND HEADER (the first header that declares it; a config macro may be read by several)
cat "$T"/*.names "$T"/dtrain/*/*.names | awk '!seen[$1]++' | sort > "$T/names"
if [ "$list" -eq 1 ]; then cat "$T/names"; exit "$status"; fi

if [ ! -f "$API" ]; then echo "FAIL $API does not exist"; exit 1; fi
# 1. names that begin a code span in the text (fenced blocks left out)
awk '/^[[:space:]]*(```|~~~)/ { fence = !fence; next } !fence' "$API" |
    grep -oE '`[A-Za-z_][A-Za-z0-9_]*' | sed 's/^`//' | sort -u > "$T/documented"
# and the headers whose sections they are named in: "HEADER NAME" for each code span under a heading
# "## HEADER: ..." (a module of dtrain/, dtrain_mpi.h or dtrain_cuda.h)
awk '/^[[:space:]]*(```|~~~)/ { fence = !fence; next }
     !fence && /^## / { h = $2; sub(/:$/, "", h); next }
     !fence && h != "" { s = $0; while (match(s, /`[A-Za-z_][A-Za-z0-9_]*/)) { print h, substr(s, RSTART + 1, RLENGTH - 1); s = substr(s, RSTART + RLENGTH) } }' \
    "$API" | sort -u > "$T/sections"
missing=0
while read -r name kind header; do
    if ! grep -qxF "$name" "$T/documented"; then
        echo "missing from $API: $name ($kind, $header)"; missing=$((missing + 1))
    elif [ "$kind" != config ] && [ "$kind" != env ] && [ "$header" != dtrain.h ] && ! grep -qxF "$header $name" "$T/sections"; then
        echo "in $API but not in the section of the header that declares it (## $header: ...): $name ($kind)"; missing=$((missing + 1))
    fi
done < "$T/names"
# 2. configuration macros and environment variables in the manual of a header that reads them
for h in $HEADERS; do
    awk '{ print } /\*\// { exit }' "$h" > "$T/$h.manual"
done
for h in $MODULES; do cat "$T/dtrain.h.manual" >> "$T/$h.manual"; done
for name in $(cat "$T"/*.config "$T"/dtrain/*/*.config | grep -vE '^(dt__|DT__)' | grep -vE '^DTRAIN(_[A-Z0-9_]*)?(_H|_DECLARED|_DONE) ' |
              awk '{ print $1 }' | sort -u); do
    found=0
    for h in $HEADERS; do
        if grep -qE "(^|[^A-Za-z0-9_])$name([^A-Za-z0-9_]|\$)" "$T/$h.config" 2>/dev/null &&
           grep -qE "(^|[^A-Za-z0-9_])$name([^A-Za-z0-9_]|\$)" "$T/$h.manual"; then found=1; fi
    done
    if [ "$found" -eq 0 ]; then
        echo "missing from the top comment of the header that reads it: $name"; missing=$((missing + 1))
    fi
done
# 3. the contents line at the top of API_MD links every "## " section, in order, with the anchor GitHub gives
#    its heading (lower case; what is not a letter, digit, space, "-" or "_" dropped; spaces as "-")
awk '/^Contents: / { inc = 1 } inc && /^$/ { inc = 0 }
     inc { s = $0; while (match(s, /\(#[^)]*\)/)) { print substr(s, RSTART + 2, RLENGTH - 3) > "/dev/stderr"; s = substr(s, RSTART + RLENGTH) } }
     /^```/ { code = !code }
     !code && /^## / { h = tolower(substr($0, 4)); gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); print h }' \
    "$API" > "$T/contents.heads" 2> "$T/contents.links"
if ! cmp -s "$T/contents.links" "$T/contents.heads"; then
    echo "FAIL $API: the contents line does not link each \"## \" section in order (links < >, headings):"
    diff "$T/contents.links" "$T/contents.heads" | sed 's/^/    /'
    status=1
fi
echo "$(wc -l < "$T/names" | tr -d ' ') public names, $missing missing"
[ "$missing" -eq 0 ] && [ "$status" -eq 0 ]
