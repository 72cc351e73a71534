#!/bin/sh
# tools/amalgamate.sh [DIR] - make single: the library as one file to copy, DIR/dtrain.h (default build/single),
# generated from dtrain.h and its modules, never committed.
#   DIR/dtrain.h        dtrain.h with each module of dtrain/ written in where dtrain.h includes it, in that order
#                       (a module's includes of the modules before it are already above it, so they are dropped)
#   DIR/dtrain_mpi.h    dtrain_mpi.h and dtrain_cuda.h, including "dtrain.h" where they include a module (unless
#   DIR/dtrain_cuda.h   dtrain.h is what includes them: it does at the end, with DT_USE_MPI and DT_USE_CUDA)
#   DIR/dtrain_cuda.cu  the GPU backend's nvcc translation unit, unchanged
# The internal headers (dtrain/core/internal.h, the calls between modules, and dtrain/cpu/kernel.h, the CPU kernel
# seam) are written in a group at a time: where a module includes one, its own group (its types, macros and
# prototypes), and nothing else: in one file every other group's calls are defined above their uses.
# The result compiles as the tree does: the same declarations, the same implementation under
# DTRAIN_IMPLEMENTATION, the same macros. POSIX sh and awk; run from anywhere.
cd "$(dirname "$0")/.." || exit 1
OUT=${1:-build/single}
mkdir -p "$OUT" || exit 1
# one module: its text, with its includes of other modules dropped (they precede it in the file)
module() {
    awk -v m="$1" '
        # the group of module m in internal header h: from its heading "/* ==== m: ..." to the next heading
        function group(h,    line, on) {
            while ((getline line < h) > 0) {
                if (line ~ /^\/\* =+ /) on = index(line, "/* ==== " m ":") == 1
                if (on) print line
            }
            close(h)
        }
        /^#include "/ { inc = $0; sub(/[ \t]*\/\*.*$/, "", inc) }   # the line without its comment
        /^#include "(\.\.\/core\/)?internal\.h"/ { print "/* " inc "   (its group for this module: make single) */"; group("dtrain/core/internal.h"); next }
        /^#include "(\.\.\/cpu\/)?kernel\.h"/ { print "/* " inc "   (its group for this module: make single) */"; group("dtrain/cpu/kernel.h"); next }
        /^#include "(\.\.\/[a-z]+\/)?[a-z0-9_]+\.h"/ { print "/* " inc "   (above, in this file) */"; next }
        { print }' "$1"
}
{
    while IFS= read -r line; do
        case $line in
            '#include "dtrain/'*'.h"')
                f=${line#\#include \"}; f=${f%\"}
                [ -f "$f" ] || { echo "tools/amalgamate.sh: dtrain.h includes $f, which is missing" >&2; exit 1; }
                printf '/* ============================================================================================== */\n'
                printf '/* %-92s */\n' "$f (make single wrote it in here)"
                printf '/* ============================================================================================== */\n'
                module "$f" ;;
            *) printf '%s\n' "$line" ;;
        esac
    done < dtrain.h
} > "$OUT/dtrain.h.tmp" || exit 1
mv "$OUT/dtrain.h.tmp" "$OUT/dtrain.h"
for h in dtrain_mpi.h dtrain_cuda.h; do
    awk '/^#include "dtrain\/core\/internal\.h"/ { print "/* " $0 "   (make single: not needed, the calls are defined above) */"; next }
         /^#include "dtrain\/[a-z0-9_\/]+\.h"/ {
             print "#ifndef DTRAIN_H   /* make single: the whole library, unless it is what includes this file */"
             print "#include \"dtrain.h\""; print "#endif"; next }
         { print }' "$h" > "$OUT/$h" || exit 1
done
cp dtrain_cuda.cu "$OUT/dtrain_cuda.cu" || exit 1
if grep -n '^#include "dtrain/' "$OUT"/*.h; then echo "tools/amalgamate.sh: a module include is left above" >&2; exit 1; fi
echo "make single: $OUT/dtrain.h ($(wc -l < "$OUT/dtrain.h") lines), dtrain_mpi.h, dtrain_cuda.h, dtrain_cuda.cu"
