#!/bin/sh
# tests/install.sh [BUILD] - the checks of using dtrain from another project: make install and uninstall,
# pkg-config, CMake's find_package and add_subdirectory, cmake --install. tests/run.sh sources it (section 8,
# its check function and counters); alone, `sh tests/install.sh` runs it with counters of its own.
#   - make single writes build/single/dtrain.h, on which alone README's quick start builds and runs (2 local
#     ranks; with mpicc, under mpiexec -n 2)
#   - make install PREFIX=P installs exactly the files of the install layout (README, "Using dtrain in your
#     project"), with the version of dtrain.h
#   - README's quick start, built with `pkg-config --cflags --libs dtrain` against P (not the source tree),
#     runs on 2 local ranks; dtrain-full adds DT_USE_ZLIB and DT_USE_STB_IMAGE, -lz and -lstb
#   - tests/cmake/consumer (two C files, one with the implementation) builds and runs with find_package(dtrain)
#     from P, and with add_subdirectory of the source tree; each time the package's version is dtrain.h's
#   - cmake --install of CMakeLists.txt and make install, both with DESTDIR and PREFIX /usr/local, write the
#     same files, byte for byte
#   - make uninstall PREFIX=P leaves no file under P
# Compiled without optimisation (-O0) to stay fast; needs cmake and pkg-config (tools/deps.sh).
if [ -z "${passed+set}" ]; then   # alone: the counting of tests/run.sh
    passed=0; failed=0
    check() {
        name=$1; shift
        if err=$("$@" 2>&1); then echo "ok   $name"; passed=$((passed + 1))
        else echo "FAIL $name"; printf '%s\n' "$err" | tail -n 30; failed=$((failed + 1)); fi
    }
    IT_ALONE=1
fi
IT=$(mktemp -d)
IT_SRC=$(pwd)
IT_VERSION=$(sed -n 's/^#define DT_VERSION_STRING "\(.*\)"$/\1/p' dtrain/core/base.h)
IT_FILES="include/dtrain.h $(ls dtrain/*/*.h | sed 's|^|include/|') include/dtrain_cuda.h include/dtrain_mpi.h lib/cmake/dtrain/dtrainConfig.cmake
lib/cmake/dtrain/dtrainConfigVersion.cmake lib/cmake/dtrain/dtrainFeatures.cmake lib/pkgconfig/dtrain-full.pc
lib/pkgconfig/dtrain.pc share/dtrain/dtrain_cuda.cu"

it_files() {   # it_files DIR: the files under DIR, relative, sorted, one a line
    (cd "$1" && find . ! -type d | sed 's|^\./||' | LC_ALL=C sort)
}
it_install() {
    MAKEFLAGS= make -s install PREFIX="$IT/p" >/dev/null || return 1
    want=$(printf '%s\n' $IT_FILES | LC_ALL=C sort); got=$(it_files "$IT/p")
    [ "$got" = "$want" ] || { printf 'installed:\n%s\nexpected:\n%s\n' "$got" "$want"; return 1; }
    for h in dtrain.h dtrain/*/*.h; do cmp "$h" "$IT/p/include/$h" || return 1; done
    [ -n "$IT_VERSION" ] &&
        grep -qx "Version: $IT_VERSION" "$IT/p/lib/pkgconfig/dtrain.pc" &&
        grep -q "^set(PACKAGE_VERSION \"$IT_VERSION\")" "$IT/p/lib/cmake/dtrain/dtrainConfigVersion.cmake"
}
it_pkgconfig() {   # README's quick start against the installed header only
    awk '/^```/ { if (inb && buf ~ /quickstart\.c/) { printf "%s", buf; exit } inb = ($0 == "```c"); buf = ""; next }
         inb { buf = buf $0 "\n" }' README.md > "$IT/quickstart.c"
    [ -s "$IT/quickstart.c" ] || { echo "README.md has no \`\`\`c block with quickstart.c"; return 1; }
    export PKG_CONFIG_PATH="$IT/p/lib/pkgconfig"
    [ "$(pkg-config --modversion dtrain)" = "$IT_VERSION" ] || { echo "pkg-config --modversion dtrain: not $IT_VERSION"; return 1; }
    cd "$IT" || return 1
    # shellcheck disable=SC2046
    cc -std=c11 -Wall -Wextra -Wpedantic -Werror -O0 $(pkg-config --cflags dtrain) quickstart.c -o quickstart \
        $(pkg-config --libs dtrain) || return 1
    ./quickstart --ranks 2 > quickstart.out || return 1
    cat quickstart.out; grep -q '^step 200 ' quickstart.out
}
it_pkgconfig_full() {
    export PKG_CONFIG_PATH="$IT/p/lib/pkgconfig"
    flags=" $(pkg-config --cflags --libs dtrain-full) "
    for f in -DDT_USE_ZLIB -DDT_USE_STB_IMAGE "-I$IT/p/include" -lz -lstb -lm; do
        case $flags in *" $f "*) ;; *) echo "pkg-config dtrain-full: no $f in:$flags"; return 1 ;; esac
    done
    printf '#define DTRAIN_IMPLEMENTATION\n#include "dtrain.h"\nint main(void) { dt_dataset d = {0}; return dt_dataset_load_idx(&d, "x.gz", "y.gz") == DT_ERR_IO ? 0 : 1; }\n' > "$IT/full.c"
    # shellcheck disable=SC2086
    cc -std=c11 -O0 "$IT/full.c" -o "$IT/full" $flags && "$IT/full"
}
it_single() {   # make single: README's quick start against build/single alone (C, and mpicc under mpiexec)
    MAKEFLAGS= make -s single >/dev/null || return 1
    mkdir -p "$IT/single" && cp build/single/dtrain.h build/single/dtrain_mpi.h build/single/dtrain_cuda.h "$IT/single/" || return 1
    awk '/^```/ { if (inb && buf ~ /quickstart\.c/) { printf "%s", buf; exit } inb = ($0 == "```c"); buf = ""; next }
         inb { buf = buf $0 "\n" }' README.md > "$IT/single/quickstart.c"
    [ -s "$IT/single/quickstart.c" ] || { echo "README.md has no \`\`\`c block with quickstart.c"; return 1; }
    ( cd "$IT/single" &&
      cc -std=c11 -Wall -Wextra -Wpedantic -Werror -O0 -I. quickstart.c -o quickstart -pthread -lm &&
      ./quickstart --ranks 2 > quickstart.out && grep -q '^step 200 ' quickstart.out ) || return 1
    if command -v mpicc >/dev/null 2>&1 && command -v mpiexec >/dev/null 2>&1; then
        ( cd "$IT/single" &&
          mpicc -std=c11 -Wall -Wextra -Wpedantic -Werror -O0 -DDT_USE_MPI -I. quickstart.c -o quickstart-mpi -lm &&
          timeout 120 mpiexec -n 2 ./quickstart-mpi > quickstart-mpi.out && grep -q '^step 200 ' quickstart-mpi.out ) || return 1
    fi
}
it_consumer() {   # it_consumer NAME CMAKE-ARGS...: configure, build and run tests/cmake/consumer
    name=$1; shift
    cmake -S tests/cmake/consumer -B "$IT/$name" "$@" > "$IT/$name.log" 2>&1 || { cat "$IT/$name.log"; return 1; }
    cmake --build "$IT/$name" > "$IT/$name-build.log" 2>&1 || { cat "$IT/$name-build.log"; return 1; }
    "$IT/$name/consumer"
}
it_cmake_install() {   # cmake --install and make install: the same files under DESTDIR
    MAKEFLAGS= make -s install DESTDIR="$IT/stage-make" PREFIX=/usr/local >/dev/null || return 1
    cmake -S . -B "$IT/top" -DCMAKE_INSTALL_PREFIX=/usr/local > "$IT/top.log" 2>&1 || { cat "$IT/top.log"; return 1; }
    DESTDIR="$IT/stage-cmake" cmake --install "$IT/top" > "$IT/top-install.log" 2>&1 || { cat "$IT/top-install.log"; return 1; }
    [ "$(it_files "$IT/stage-make")" = "$(printf '%s\n' $IT_FILES | sed 's|^|usr/local/|' | LC_ALL=C sort)" ] &&
        diff -r "$IT/stage-make" "$IT/stage-cmake"
}
it_uninstall() {
    MAKEFLAGS= make -s uninstall PREFIX="$IT/p" >/dev/null || return 1
    left=$(it_files "$IT/p")
    [ -z "$left" ] && [ ! -d "$IT/p/lib/cmake/dtrain" ] && [ ! -d "$IT/p/share/dtrain" ] && [ ! -d "$IT/p/include/dtrain" ] ||
        { echo "left under the prefix: $left"; find "$IT/p"; return 1; }
}

if command -v cmake >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1; then
    check "make single: README's quick start against build/single/dtrain.h alone, local ranks and mpiexec -n 2" it_single
    check "make install PREFIX=...: headers, dtrain_cuda.cu, pkg-config and CMake files, version $IT_VERSION" it_install
    check "pkg-config dtrain: README's quick start against the installed header, on 2 local ranks" it_pkgconfig
    check "pkg-config dtrain-full: DT_USE_ZLIB, DT_USE_STB_IMAGE, -lz, -lstb; a program links" it_pkgconfig_full
    check "CMake find_package(dtrain 0.1 COMPONENTS openmp zlib stb_image): tests/cmake/consumer runs" \
        it_consumer find -DCMAKE_PREFIX_PATH="$IT/p"
    check "CMake add_subdirectory(dtrain): tests/cmake/consumer runs" it_consumer subdir -DDTRAIN_SOURCE_DIR="$IT_SRC"
    check "cmake --install and make install (DESTDIR, PREFIX=/usr/local): the same files" it_cmake_install
    check "make uninstall PREFIX=...: no file left" it_uninstall
else
    echo "FAIL cmake or pkg-config is not installed (run tools/deps.sh)"; failed=$((failed + 1))
fi
rm -rf "$IT"
if [ -n "${IT_ALONE:-}" ]; then
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
fi
