#!/bin/sh
# tests/run.sh CC BUILD TEST... - runs the test suite in its configurations and prints the total.
#   1. the optimised build (from make): every test program; test_layers and test_models again on each other
#      CPU tier this machine runs (DT_CPU=avx2, portable); test_diff runs every tier in one binary: seeded random
#      graphs with every fast path and fusion on against the reference kernels with fusion off
#   1a. dtrain against PyTorch: test_diff --dump writes 60 of its graphs with the default tier's results, and
#       tests/diff_torch.py runs each in float64 PyTorch from every step's state (forward, loss, gradients,
#       torch.optim's SGD and Adam steps, eval-mode logits) and compares them, within float32 PyTorch's own
#       difference (skipped without /usr/bin/python3 and its torch)
#   2. compile checks: dtrain.h warning-free as C11 with gcc and clang, with and without OpenMP, and as C++;
#      every program warning-free with gcc 12, clang 14 and clang 16 at -O0, -O2 and -O3 (the implementation,
#      tests/impl_test.c, compiled once per compiler and level, each program's own translation unit with -c at each;
#      those that compile the implementation themselves once per compiler; a missing compiler fails: tools/deps.sh);
#      each module of dtrain/ alone after the modules it includes; x86 intrinsics only in dtrain/cpu/cpu_x86.h, ARM
#      ones only in dtrain/cpu/cpu_arm.h;
#      a dt_request with too few reserved words for the request state stops the build
#   2a. the docs: every public name of the three headers is in docs/api.md (tools/check_api.sh, one
#       test); every C code block of README.md, docs/**/*.md and the headers' quick starts compiles, and
#       the ones marked snippet-run run (tools/check_snippets.sh, one test per block)
#   2b. the GPU backend (dtrain_cuda.h): its kernels emulated on the host (tests/cuda/cuda_emu.h, any C++
#       compiler) and run by tests/cuda/test_cuda.c against the CPU ops, under ASan and UBSan; its public
#       declarations as C11 and C++; and, where nvcc is installed, dtrain_cuda.cu compiled for the GPU and
#       linked into examples/train.c and test_cuda, which without a GPU must report its tests skipped
#       (they count neither as passed nor as failed; make test-cuda runs them on a GPU)
#   2c. ARM64: test_core, test_layers, test_models, test_comm and test_diff (the neon tier's fast paths against the
#       reference on random graphs) cross-compiled for aarch64 with Debian's gcc-aarch64-linux-gnu and run under
#       qemu-user (their results count; qemu's timings mean nothing)
#   2d. Windows: test_core, test_layers, test_models, test_optim, test_checkpoint and test_comm (DT_TEST_QUICK=1; the
#       local backend, threads as ranks) cross-compiled with MinGW-w64 (x86_64-w64-mingw32-gcc-posix, OpenMP, -static,
#       without zlib and stb_image) and run under wine64, one wineserver kept for the section; examples/*.c and
#       examples/simple/*.c built for Windows (the prefix: $B/win/wineprefix, kept for the next run)
#   2e. big-endian: s390x under qemu: test_checkpoint, test_optim, test_layers, test_models' PyTorch SimpleCNN and
#       parameter names, test_datasets and test_core's non-arithmetic tests cross-compiled for s390x (gcc-s390x-linux-gnu,
#       ISO C: float evaluated in double) and run under qemu-s390x, every file little-endian there too; and
#       tests/test_endian.c built for both hosts with the same arithmetic (DT_NO_SIMD, -ffp-contract=off): a checkpoint
#       saved on x86-64 resumes on s390x and the reverse with the saved state's bits, the same bytes when saved again,
#       and the uninterrupted run's losses; both hosts write the same checkpoint bytes
#   2f. musl (static): the implementation and test_core, test_layers, test_models, test_optim, test_checkpoint,
#       test_comm, test_ddp and test_resume built by Debian's musl-gcc (no OpenMP, no optional features), linked
#       statically and run
#   2g. the POSIX subset of macOS: test_core, test_comm, test_faults, test_ddp and test_resume built with
#       DT_POSIX_MINIMAL, without OpenMP, against tests/posix_minimal.h (forced in by -include), which poisons
#       what macOS lacks (barriers, spin locks, timers, sem_timedwait, clock_nanosleep, ...), and run; the poison
#       stops a use; DT_POSIX_MINIMAL is defined by itself under __APPLE__
#   3. the test programs built without OpenMP, run (the header must work without it)
#   3b. the dataset tests without the optional features (gzip, images): clear DT_ERR_UNSUPPORTED; and built by the
#       Makefile with stb_image from a folder of its headers (make STB_DIR=DIR: its own object, no -lstb) and with
#       none (make STB=none: make says so; image folders refused, saying how to build with them)
#   4. the test programs built with AddressSanitizer + UndefinedBehaviorSanitizer (clang), run;
#   4b. the loader's prefetch thread, the communicator's local ranks, DDP's helper thread and the collective
#       checkpoints (test_resume) under ThreadSanitizer
# Sections 3, 4 and 4b set DT_TEST_QUICK=1: test_comm leaves out its million-element cases there, test_ddp
# most all-reduce algorithms.
#   5. the examples: bad flags are refused (the optimizer and schedule flags they share, in each, and the
#      checkpoint flags, an empty path, a --batch no data set fills); each training example killed with SIGKILL and resumed ends as an uninterrupted run
#      (CSV rows and the last checkpoint's bytes), and refuses damaged, foreign or mismatched checkpoints (another --period
#      named with both values); a CSV on a full disk (/dev/full) stops the run at once; fedavg says a round where every
#      client dropped out had none; --trace writes a timeline; ddp refuses a batch that does not
#      split over the ranks, runs VGG-11 on Fashion-MNIST padded to 32x32, and --wd and --milestones change its
#      run; every header line states the whole recipe; ddp --compress says what travels, bf16 and top-k 1%
#      send half and under a twentieth of fp32's bytes, and top-k killed and resumed ends as never stopped;
#      the flag-free programs of examples/simple run and end above 50% test accuracy
#   5b. the tutorial (docs/tutorial) and README.md: their experiments, shortened, and their quotations of the examples
#       (tools/docs_check.sh, as make docs-check)
#   5c. faults (DT_FAULT) on 2, 3 and 4 local ranks: tests/mpi/fault_ddp.c with each kind (fail, return,
#       stall, hang, nan) and a NaN pixel ends with exit status 1 within 15 s, naming the cause and the rank,
#       the NaN loss once; the ddp example the same with a NaN gradient and a rank stalled for good
#   5d. the course kit (docs/course): its commands, shortened (tools/docs_check.sh); tools/grade_lab.sh passes
#       each lab's key (--solve, for a student id) and fails a submission with a CSV value that is not the run's,
#       with wrong predictions, copied from another id or without an id, naming what is wrong
#       (tests/grade_lab_test.sh); the five workloads (tools/experiments.sh)
#       at QUICK length; each coding assignment's harness fails on its stub and passes on its reference solution
#   6. each libFuzzer target in fuzz/ ($FUZZ) for FUZZ_SECONDS (default 20) from its seed corpus
#   7. MPI: tests/mpi/test_comm_mpi.c built with mpicc -DDT_USE_MPI, run under mpiexec -n 2, 3 and 4;
#      tests/mpi/test_trace_mpi.c (the timeline gathered on rank 0) under mpiexec -n 2;
#      a program built without MPI and started by mpiexec fails, saying to rebuild it (needs mpich);
#      tests/mpi/test_train_mpi.c under mpiexec -n 2, 3 and 4: DDP, local SGD, D-PSGD and FedAvg end with
#      the bits of the same run on local ranks (within a tolerance where MPI_Allreduce does the sums);
#      tests/mpi/test_resume_mpi.c: DDP under mpiexec -n 2, 3 and 4, local SGD, D-PSGD and FedAvg under -n 3,
#      D-PSGD over the one-peer exponential schedule under -n 4 resumed in the middle of its period,
#      killed with SIGKILL at a random step and resumed, end with the bytes of an uninterrupted run; a checkpoint
#      of another world size, a damaged one and another trainer's are refused, naming the cause;
#      section 5c's faults under mpiexec -n 2, 3 and 4 (a stalled rank ends the job with MPI_Abort);
#      examples/ddp, localsgd, dpsgd and fedavg built with mpicc log under mpiexec the losses and accuracy
#      they log on as many local ranks (with the Fashion-MNIST dataset); examples/simple/ddp built with mpicc
#      ends above 50% under mpiexec -n 2; examples/ddp under mpiexec -n 3 with
#      --checkpoint, a rank killed with SIGKILL and the job resumed, ends as a job never stopped
#      examples/ddp under mpiexec -f HOSTS -n 4, HOSTS naming this machine twice (docs/multi-machine.md)
#   8. tests/install.sh: make install PREFIX, pkg-config, CMake find_package and add_subdirectory, cmake --install,
#      make uninstall
# DEFS and LDLIBS (from the Makefile) are the optional features' flags and libraries.
# JOBS (default: the CPUs) programs at a time where a section's cases are independent (the test programs, the compiles,
# the sanitizer, qemu, wine, musl, POSIX-subset and no-OpenMP runs, the fuzz targets, the docs' chapters; the pool
# below), one or two more where they mostly wait (timeouts, stalled ranks, MPI's waiting ranks, short runs that
# load data: pool_widen); most of the examples' checks run one at a time, as they share files.
# Each section's time and CPU time are in the table at the end: CPU time below twice the time on two cores is a
# core left idle.
# DT_SECTIONS="3 4 7" runs only those sections (their numbers as above: 1 1a 2 2a 2b 2c 2d 2e 2f 2g 3 4 5 5b 5c 5d 6 7
# 8); the programs the Makefile builds must be there (make all).
# Each configuration's programs share one object of the implementation (tests/impl_test.c: the implementation with
# the tests' counting allocator and hooks, tests/dt_test_alloc.h and tests/dt_test_hooks.h, compiled with its flags,
# e.g. $B/asan/dtrain.o); a program whose source defines DTRAIN_IMPLEMENTATION itself (it uses more of the library's
# internals, or a macro that changes the implementation) is compiled alone (build, below).
# Each test program ends with "N passed, N failed"; each compile check counts as one test.
# The last line is the sum, "N passed, N failed"; the exit status is non-zero when anything failed.
CC=$1; B=$2; shift 2
DEFS=${DEFS:-}; LDLIBS=${LDLIBS:--lm}
passed=0; failed=0
WARN="-std=c11 -Wall -Wextra -Wpedantic -Werror"
# the examples' short runs in sections 5, 5c and 7 evaluate the first 1000 test images, not all 10,000 (--test-limit;
# dpsgd's --limit cuts its test set already): no document quotes them, and the evaluation would take most of their time
TL="--test-limit 1000"
# the fuzz targets' compiler (section 6)
FUZZ_CC="clang -std=c11 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all $DEFS"
fuzz_impl() {   # the plain implementation (tests/impl.c), with fuzz_image.c's DT_IMAGE_MAX_PIXELS
    rm -f "$B/fuzz/dtrain.o"
    $FUZZ_CC -fsanitize=fuzzer-no-link "-DDT_IMAGE_MAX_PIXELS=(1 << 20)" -c tests/impl.c -o "$B/fuzz/dtrain.o" && return 0
    echo "FAIL build of the implementation (tests/impl.c) for the fuzz targets"; failed=$((failed + 1)); return 1
}

# runs one test program, adds its counts; a crash or a missing summary line counts as a failure
run() {
    label=$1; shift
    r_t=$(date +%s); out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | sed "s/^/[$label] /"
    echo "[$label] ($(($(date +%s) - r_t)) s)"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        echo "[$label] FAIL: exited with status $rc without a summary line"; failed=$((failed + 1)); return
    fi
    p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "[$label] FAIL: exit status $rc"; failed=$((failed + 1)); fi
}

# section "N. TITLE": says the section's title and keeps the time the one before it took (the table at the end)
# and the CPU time (user and system) of the programs it ran: the share of the two cores it kept busy
cpu_now() {   # cpu: the CPU seconds of this shell's finished children so far (`times`, run in this shell, not in $(...))
    times > "$PJ/times"
    cpu=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] } printf "%d", n }' "$PJ/times")
}
sec_name=""; sec_t=$(date +%s); sec_cpu=0; sec_times=""
section() {
    now=$(date +%s); cpu_now
    [ -n "$sec_name" ] && want && sec_times="$sec_times $sec_name $((now - sec_t)) s (CPU $((cpu - sec_cpu)) s),"
    sec_name=${1%%.*}; sec_t=$now; sec_cpu=$cpu
    if want; then echo "== $1"; else echo "== $1: not run (DT_SECTIONS=$DT_SECTIONS)"; fi
}
will_run() {   # will_run N: whether section N runs
    [ -z "${DT_SECTIONS:-}" ] && return 0
    case " $DT_SECTIONS " in *" $1 "*) return 0 ;; esac
    return 1
}
want() {    # want: whether the current section runs (DT_SECTIONS unset or naming it)
    [ -z "${DT_SECTIONS:-}" ] && return 0
    [ "$sec_name" = end ] && return 0
    case " $DT_SECTIONS " in *" $sec_name "*) return 0 ;; esac
    return 1
}

# build OBJ SOURCE OUT LIBS COMPILER FLAGS...: SOURCE into the program OUT, linked with OBJ (the configuration's
# object of the implementation, compiled by the same COMPILER FLAGS from tests/impl_test.c); a SOURCE that defines
# DTRAIN_IMPLEMENTATION itself is compiled alone, and so is any SOURCE where OBJ is "" (-DDTRAIN_IMPLEMENTATION)
build() {
    b_obj=$1; b_src=$2; b_out=$3; b_libs=$4; shift 4
    if grep -q '^#define DTRAIN_IMPLEMENTATION' "$b_src"; then b_obj=""
    elif [ -z "$b_obj" ]; then set -- "$@" -DDTRAIN_IMPLEMENTATION; fi
    "$@" "$b_src" $b_obj -o "$b_out" $b_libs
}
# impl OBJ COMPILER FLAGS...: the configuration's object of the implementation; a failure counts once
impl() {
    i_obj=$1; shift
    rm -f "$i_obj"   # never a stale one from an earlier run
    "$@" -c tests/impl_test.c -o "$i_obj" && return 0
    echo "FAIL build of the implementation (tests/impl_test.c) into $i_obj"; failed=$((failed + 1)); return 1
}

# The pool: `job COMMAND...` runs COMMAND (a program, or check, run or a section's own function) in the background,
# JOBS at a time (default: the CPUs, e.g. JOBS=1 for one at a time), its output kept apart; `jobs_done` waits for
# them all and prints each one's output in the order they were started, adding their counts. For the cases that
# use files of their own only (listed at the top), most of which run on one core each. A job that ends without its counts counts as a failure. Its OpenMP threads wait passively
# (OMP_WAIT_POLICY=passive, unless set): two programs' threads spinning on two cores would slow both manyfold.
JOBS=${JOBS:-$(nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)}
PJ=$(mktemp -d); mkfifo "$PJ/tokens"; exec 9<>"$PJ/tokens"   # JOBS tokens: a job takes one to start, returns it
i=0; while [ "$i" -lt "$JOBS" ]; do echo >&9; i=$((i + 1)); done
# pool_widen N / pool_narrow N: N more tokens for cases that mostly wait (a timeout, a stalled rank, a fixed time),
# and back (pool_narrow after jobs_done, when every token has been returned)
pool_widen() { w_i=0; while [ "$w_i" -lt "$1" ]; do echo >&9; w_i=$((w_i + 1)); done; }
pool_narrow() { w_i=0; while [ "$w_i" -lt "$1" ]; do read -r _ <&9; w_i=$((w_i + 1)); done; }
pn=0; pdone=0
job() {
    pn=$((pn + 1)); read -r _ <&9
    ( passed=0; failed=0; OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}; export OMP_WAIT_POLICY
      j_t=$(date +%s); "$@" > "$PJ/$pn.out" 2>&1
      times > "$PJ/$pn.t"
      echo "  (job $pn: $(($(date +%s) - j_t)) s; CPU, user and system: $(tail -n 1 "$PJ/$pn.t"))" >> "$PJ/$pn.out"; rm -f "$PJ/$pn.t"
      echo "$passed $failed" > "$PJ/$pn.count"; echo >&9 ) &
}
jobs_done() {
    wait
    while [ "$pdone" -lt "$pn" ]; do
        pdone=$((pdone + 1)); cat "$PJ/$pdone.out"
        if read -r jp jf < "$PJ/$pdone.count"; then passed=$((passed + jp)); failed=$((failed + jf))
        else echo "FAIL a job of the pool ended without its counts"; failed=$((failed + 1)); fi
        rm -f "$PJ/$pdone.out" "$PJ/$pdone.count"
    done
}

check() {   # check NAME COMMAND...: one test that passes when the command succeeds
    name=$1; shift
    c_t=$(date +%s)
    if err=$("$@" 2>&1); then c_t=$(($(date +%s) - c_t)); passed=$((passed + 1))
        if [ "$c_t" -ge 3 ]; then echo "ok   $name ($c_t s)"; else echo "ok   $name"; fi
    else   # the end of its output, where the cause is
        echo "FAIL $name"; n=$(printf '%s\n' "$err" | wc -l)
        [ "$n" -gt 30 ] && echo "  ($((n - 30)) lines before these left out)"
        printf '%s\n' "$err" | tail -n 30; failed=$((failed + 1))
    fi
}

section "1. optimised build ($CC)"
if want; then
# through the pool, widened by one, the longest first: test_comm and test_faults wait out timeouts while test_diff
# computes
pool_widen 1
for t in test_diff test_comm test_faults; do case " $* " in *" $t "*) job run "$t" "$B/tests/$t" ;; esac; done
for t in "$@"; do case " test_diff test_comm test_faults " in *" $t "*) ;; *) job run "$t" "$B/tests/$t" ;; esac; done

# the layer and model tests once more on every other CPU tier this machine runs (dtrain/cpu/cpu.h: DT_CPU), so each
# tier's kernels train the zoo; a tier the CPU lacks is said to be skipped
default_tier=$(env -u DT_CPU "$B/examples/zoo" --model mlp --steps 1 | sed -n 's/.*, CPU tier \([a-z0-9]*\)$/\1/p')
for tier in avx512 avx2 portable; do
    [ "$tier" = "$default_tier" ] && continue
    if ! "$B/examples/zoo" --tier "$tier" --model mlp --steps 1 >/dev/null 2>&1; then
        echo "skipped: test_layers and test_models on the $tier tier (this CPU or build lacks it)"; continue
    fi
    for t in test_layers test_models; do job run "$t DT_CPU=$tier" env DT_CPU=$tier "$B/tests/$t"; done
done
jobs_done
pool_narrow 1
fi

section "1a. dtrain against float64 PyTorch (tests/diff_torch.py)"
if want; then
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
    DD=$(mktemp -d)
    run "test_diff --dump" "$B/tests/test_diff" --graphs 60 --dump "$DD"
    run "diff_torch" /usr/bin/python3 tests/diff_torch.py "$DD"
    rm -rf "$DD"
else
    echo "skipped: tests/diff_torch.py (dtrain against float64 PyTorch): /usr/bin/python3 with torch is not installed"
fi
fi

section "2. compile checks"
if want; then
mkdir -p "$B/check"
printf '#define DTRAIN_IMPLEMENTATION\n#include "../../dtrain.h"\nint main(void){ return dt_cpu_ops() == 0; }\n' > "$B/check/impl.c"
# every program warning-free under gcc 12, clang 14 and clang 16 at -O0, -O2 and -O3 (gcc with -Wmaybe-uninitialized,
# whose flow analysis the optimisation levels change), with OpenMP and the optional features: the implementation
# (tests/impl_test.c) once per compiler and level, the first jobs (the longest); each program's own translation unit
# (-c: tests, examples as the Makefile builds them, examples/simple, bench, fuzz, and tests/mpi with mpicc, i.e. gcc)
# at each level with gcc, at -O0 with clang: clang warns from its front end, the same at every level, save for the
# optimiser's few (a loop pragma it could not honour), which only the implementation's kernels could draw and which
# its three levels check. A program that compiles the implementation itself (it defines DTRAIN_IMPLEMENTATION) is
# checked once per compiler, at -O0 (gcc; make builds it at -O3, with -Werror under make test) or -fsyntax-only
# (clang): at each level, those 15 compiles of the implementation would cost minutes. clang 16 without OpenMP (its
# libomp is not installed), so that is checked too. About 150 s of CPU, 75 s on two cores.
W_LEVELS="-O0 -O2 -O3"
W_TUS=""; W_OWN=""
for f in tests/test_*.c examples/*.c examples/simple/*.c bench/*.c fuzz/*.c; do
    case $f in
        examples/*) W_TUS="$W_TUS $f" ;;
        fuzz/make_corpus.c) case " $LDLIBS " in *" -lstb "*) W_TUS="$W_TUS $f" ;; esac ;;   # its images: stb_image_write
        *) if grep -q '^#define DTRAIN_IMPLEMENTATION' "$f"; then W_OWN="$W_OWN $f"; else W_TUS="$W_TUS $f"; fi ;;
    esac
done
warn_flags() {   # warn_flags CC: the flags of the compiler's checks (gcc's -Wall has -Wmaybe-uninitialized)
    case $1 in
        gcc) echo "$WARN -fopenmp $DEFS" ;;
        clang-16) echo "$WARN $DEFS" ;;
        *) echo "$WARN -fopenmp $DEFS" ;;
    esac
}
# make test's build (MADE: its compiler and flags, -Werror among them) compiled the implementation and every test,
# example and benchmark at one level: where those are a compiler's checks at that level (gcc -O3 here), the checks
# count that build, and compile only what make did not (fuzz/, tests/mpi with mpicc): the same compiles, done once
made_as() {   # made_as CC LEVEL: whether make's build was CC's checks at LEVEL
    [ -n "${MADE:-}" ] || return 1
    set -- "$1" "$2" $MADE
    [ "$(readlink -f "$(command -v "$3")")" = "$(readlink -f "$(command -v "$1")")" ] || return 1
    m_cc=$1; m_lv=$2; shift 3
    [ "$(printf '%s\n' "$@" | sort)" = "$(printf '%s\n' $(warn_flags "$m_cc") "$m_lv" | sort)" ]
}
warn_tus() {   # warn_tus CC LEVEL [made]: each program's own translation unit (-c); the MPI tests too with gcc (mpicc);
    # "made": only those make's build did not compile (made_as)
    w_dir="$B/check/$1$2"; mkdir -p "$w_dir"; w_bad=""
    for f in $W_TUS; do
        case "$3:$f" in made:fuzz/*) ;; made:*) continue ;; esac
        w_l=""; case $f in examples/*) w_l="-DDTRAIN_IMPLEMENTATION_LINKED -I." ;; esac
        $1 $(warn_flags $1) $2 $w_l -c "$f" -o "$w_dir/$(echo "$f" | tr / _).o" || w_bad="$w_bad $f"
    done
    if [ "$1" = gcc ] && command -v mpicc >/dev/null 2>&1; then
        for f in tests/mpi/*.c; do
            MPICH_CC=gcc mpicc $(warn_flags gcc) $2 -DDT_USE_MPI -c "$f" -o "$w_dir/$(echo "$f" | tr / _).o" || w_bad="$w_bad $f"
        done
    fi
    [ -z "$w_bad" ] || { echo "warnings or errors in:$w_bad"; return 1; }
}
warn_own() {   # warn_own CC FLAGS...: the programs that compile the implementation themselves
    w_cc=$1; shift; w_bad=""
    for f in $W_OWN; do $w_cc $(warn_flags $w_cc) "$@" "$f" || w_bad="$w_bad $f"; done
    [ -z "$w_bad" ] || { echo "warnings or errors in:$w_bad"; return 1; }
}
W_CCS=""
for cc in gcc clang clang-16 mpicc; do
    if command -v $cc >/dev/null 2>&1; then W_CCS="$W_CCS $cc"
    else echo "FAIL $cc is not installed (run tools/deps.sh)"; failed=$((failed + 1)); fi
done
for cc in $W_CCS; do
    [ $cc = mpicc ] && continue
    for lv in $W_LEVELS; do
        if made_as $cc $lv; then
            echo "ok   $cc $lv: the implementation (tests/impl_test.c: with the tests' hooks) warning-free (make's build: these flags)"
            passed=$((passed + 1)); continue
        fi
        job check "$cc $lv: the implementation (tests/impl_test.c: with the tests' hooks) warning-free" $cc $(warn_flags $cc) $lv \
            -c tests/impl_test.c -o "$B/check/impl-$cc$lv.o"
    done
done
for cc in $W_CCS; do
    case $cc in
        gcc) job check "gcc -O0: the $(echo $W_OWN | wc -w) programs that compile the implementation themselves" warn_own gcc -O0 -c -o /dev/null ;;
        clang*) job check "$cc: the $(echo $W_OWN | wc -w) programs that compile the implementation themselves (-fsyntax-only)" \
                    warn_own $cc -fsyntax-only ;;
    esac
done
for cc in $W_CCS; do
    [ $cc = mpicc ] && continue
    w_what="$(echo $W_TUS | wc -w) programs"; [ $cc = gcc ] && case " $W_CCS " in *" mpicc "*) w_what="$w_what and tests/mpi (mpicc)" ;; esac
    w_levels=$W_LEVELS; [ $cc = gcc ] || w_levels=-O0   # clang's warnings on them do not depend on the level
    for lv in $w_levels; do
        if made_as $cc $lv; then
            job check "$cc $lv: the own translation unit (-c) of $w_what (make's build: these flags; fuzz/ and tests/mpi here)" \
                warn_tus $cc $lv made
        else job check "$cc $lv: the own translation unit (-c) of $w_what" warn_tus $cc $lv; fi
    done
done
for cc in gcc clang; do
    case " $W_CCS " in *" $cc "*)   # (a missing one was said above)
        job check "$cc C11 without OpenMP" $cc $WARN -c "$B/check/impl.c" -o "$B/check/$cc.o"
        job check "$cc C11 portable kernels (DT_NO_SIMD)" $cc $WARN -DDT_NO_SIMD -c "$B/check/impl.c" -o "$B/check/$cc-nosimd.o" ;;
    esac
done
job check "gcc C11 without threads (DT_NO_THREADS)" gcc $WARN -DDT_NO_THREADS -c "$B/check/impl.c" -o "$B/check/nothreads.o"
job check "g++ as C++" g++ -x c++ -Wall -Wextra -Wpedantic -Werror -fopenmp $DEFS -c "$B/check/impl.c" -o "$B/check/cxx.o"
# the modules: each compiles alone, with the implementation, after the modules it includes (so none uses one
# that comes after it; their static helpers for later modules are unused there); only dtrain/cpu/cpu_x86.h has x86
# intrinsics and only dtrain/cpu/cpu_arm.h ARM ones
for m in $(sed -n 's/^#include "dtrain\/\([a-z0-9_/]*\)\.h".*/\1/p' dtrain.h); do
    f=$(echo "$m" | tr / _)
    printf '#define DTRAIN_IMPLEMENTATION\n#include "../../dtrain/%s.h"\n' "$m" > "$B/check/module_$f.c"
    job check "dtrain/$m.h alone, with what it includes: gcc C11 and g++" sh -c "gcc $WARN -Wno-unused-function -fopenmp $DEFS \
        -c '$B/check/module_$f.c' -o '$B/check/module_$f.o' && g++ -x c++ -Wall -Wextra -Wpedantic -Werror -Wno-unused-function \
        -fopenmp $DEFS -c '$B/check/module_$f.c' -o '$B/check/module_$f-cxx.o'"
done
check "SIMD intrinsics in dtrain/cpu/cpu_x86.h only" sh -c "[ \"\$(grep -lE '_mm(256|512)?_[a-z]|__m(128|256|512)|immintrin' dtrain.h dtrain/*/*.h)\" = dtrain/cpu/cpu_x86.h ]"
check "ARM intrinsics in dtrain/cpu/cpu_arm.h only" sh -c "[ \"\$(grep -lE 'arm_neon|float(32|64)x[0-9]+_t|v(ld|st)1q?_|vfmaq?_' dtrain.h dtrain/*/*.h)\" = dtrain/cpu/cpu_arm.h ]"
check "module lines: a module uses of the others only their declarations and the internal headers (tools/check_modules.py)" python3 tools/check_modules.py
# ... and it sees a crossing: a read of the model's view (pass.h's alone) planted in optim.h, in a copy of the tree
check "module lines: tools/check_modules.py fails on a planted read of struct dt_model outside pass.h" sh -c "
    rm -rf '$B/check/modtree' && mkdir -p '$B/check/modtree' && cp -R dtrain dtrain.h dtrain_mpi.h dtrain_cuda.h '$B/check/modtree/' &&
    sed -i 's/^#include \"internal.h\"/&\nstatic int dt__probe(const dt_model *m) { return m->nnodes; }/' '$B/check/modtree/dtrain/core/optim.h' &&
    ! DT_ROOT='$B/check/modtree' python3 tools/check_modules.py > '$B/check/modtree.out' &&
    grep -q 'optim.h: reads field nnodes of dtrain/core/nn.h' '$B/check/modtree.out'"
check "declarations alone (no implementation)" sh -c "printf '#include \"../../dtrain.h\"\nint f(void){ return DT_OK; }\n' > '$B/check/decl.c' && $CC $WARN -c '$B/check/decl.c' -o '$B/check/decl.o'"
# dt_request's reserved words must hold the library's request state: with too few the build stops, saying so
job check "a dt_request too small for the request state does not compile" sh -c "! gcc $WARN -DDT__REQUEST_WORDS=8 -c '$B/check/impl.c' \
    -o '$B/check/small-request.o' 2> '$B/check/small-request.err' && grep -q 'too few reserved words' '$B/check/small-request.err'"
jobs_done
fi

section "2a. the docs: API reference and code blocks"
if want; then
job check "docs/api.md documents every public name of the headers (tools/check_api.sh)" sh tools/check_api.sh
job run "snippets" env CC="$CC" sh tools/check_snippets.sh "$B/snippets"
jobs_done
fi

section "2b. the GPU backend (dtrain_cuda.h)"
if want; then
mkdir -p "$B/cuda"
cuda_emulated() {   # under ASan and UBSan
    if clang++ -x c++ -std=c++17 -Wall -Wextra -Wpedantic -Werror -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
            -c tests/cuda/emulate.cc -o "$B/cuda/emulate.o" &&
       clang $WARN -O1 -g -fopenmp -fsanitize=address,undefined -fno-sanitize-recover=all -DDT_USE_CUDA $DEFS \
            tests/cuda/test_cuda.c "$B/cuda/emulate.o" -o "$B/cuda/test_cuda_emulated" -lstdc++ $LDLIBS; then
        run "cuda kernels emulated on the host" env DT_TEST_QUICK=1 "$B/cuda/test_cuda_emulated"
    else echo "FAIL build of tests/cuda/test_cuda.c on the host emulation of the kernels"; failed=$((failed + 1)); fi
}
cuda_emulated64() {   # the kernels' 64-bit index path, which a GPU takes only beyond 2^30 elements: forced here (no sanitizers)
    if clang++ -x c++ -std=c++17 -Wall -Wextra -Wpedantic -Werror -O1 -DDT__CU_FITS_32=0 -c tests/cuda/emulate.cc \
            -o "$B/cuda/emulate64.o" &&
       clang $WARN -O1 -fopenmp -DDT_USE_CUDA $DEFS tests/cuda/test_cuda.c "$B/cuda/emulate64.o" -o "$B/cuda/test_cuda_emulated64" \
            -lstdc++ $LDLIBS; then
        run "cuda kernels emulated on the host, 64-bit indices" env DT_TEST_QUICK=1 "$B/cuda/test_cuda_emulated64"
    else echo "FAIL build of tests/cuda/test_cuda.c on the host emulation with 64-bit indices"; failed=$((failed + 1)); fi
}
job cuda_emulated
job cuda_emulated64
printf '#include "dtrain_cuda.h"\nint f(void){ return dt_cuda_device_count(); }\n' > "$B/cuda/decl.c"
job check "dtrain_cuda.h's declarations: C11 (gcc) and C++ (g++)" sh -c "gcc $WARN -I. -c '$B/cuda/decl.c' -o '$B/cuda/decl.o' &&
    g++ -x c++ -Wall -Wextra -Wpedantic -Werror -I. -c '$B/cuda/decl.c' -o '$B/cuda/decl-cxx.o'"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cuda_nvcc() {
    # once: nvcc is slow; the flags are the Makefile's (make CUDA=1)
    check "nvcc: dtrain_cuda.cu for sm_80 and sm_90, warning-free" "$CUDA_HOME/bin/nvcc" -O3 -fmad=false \
        -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
        -Xcompiler -Wall,-Wextra --Werror all-warnings -c dtrain_cuda.cu -o "$B/cuda/dtrain_cuda.o"
    CUDA_LIBS="$B/cuda/dtrain_cuda.o -L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcublas -lcudart -lstdc++"
    check "examples/train.c with DT_USE_CUDA, linked with the GPU backend" $CC $WARN -O2 -fopenmp -DDT_USE_CUDA $DEFS \
        examples/train.c -o "$B/cuda/train" $CUDA_LIBS $LDLIBS
    if $CC $WARN -O2 -fopenmp -DDT_USE_CUDA $DEFS tests/cuda/test_cuda.c -o "$B/cuda/test_cuda" $CUDA_LIBS $LDLIBS; then
        if "$B/cuda/test_cuda" --probe >/dev/null 2>&1; then run "cuda on the GPU" "$B/cuda/test_cuda"
        else   # no GPU: every test must say it was skipped, and nothing passed or failed
            out=$("$B/cuda/test_cuda" 2>&1); rc=$?
            n=$(printf '%s\n' "$out" | sed -n 's/^\([0-9][0-9]*\) skipped$/\1/p')
            if [ "$rc" -eq 0 ] && [ -n "$n" ] && [ "$n" -gt 0 ] && printf '%s\n' "$out" | grep -q '^0 passed, 0 failed$'; then
                echo "skipped: $n GPU tests of tests/cuda/test_cuda.c (no GPU here; make test-cuda on a GPU runs them)"
            else printf '%s\n' "$out"; echo "FAIL tests/cuda/test_cuda without a GPU: it must report its tests skipped"; failed=$((failed + 1)); fi
        fi
    else echo "FAIL build of tests/cuda/test_cuda.c with the GPU backend"; failed=$((failed + 1)); fi
}
if [ -x "$CUDA_HOME/bin/nvcc" ]; then job cuda_nvcc
else
    echo "skipped: nvcc not installed (at $CUDA_HOME/bin/nvcc): the GPU backend was not compiled for the GPU"
fi
jobs_done
fi

section "2c. ARM64 (aarch64, cross-compiled, run under qemu-user)"
if want; then
if command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
    mkdir -p "$B/aarch64"
    aarch64_build() {
        build "$B/aarch64/dtrain.o" "tests/$1.c" "$B/aarch64/$1" -lm $AA ||
            { echo "FAIL build of $1 for aarch64"; failed=$((failed + 1)); }
    }
    aarch64_run() {   # aarch64_run TEST [ARGS...]: e.g. TESTS as dt_test.h's argv[1] selects them
        a_t=$1; shift
        [ -x "$B/aarch64/$a_t" ] || return 0   # its build failed, said above
        run "aarch64 $a_t${1:+ $*}" env DT_TEST_QUICK=1 qemu-aarch64 -L /usr/aarch64-linux-gnu "$B/aarch64/$a_t" "$@"
    }
    # test_diff, test_comm and test_core compile the implementation themselves; test_models and test_layers link the object
    AA="aarch64-linux-gnu-gcc $WARN -O2 -fopenmp -pthread"
    job impl "$B/aarch64/dtrain.o" $AA
    for t in test_diff test_comm test_core test_models test_layers; do rm -f "$B/aarch64/$t"; done
    for t in test_diff test_comm test_core; do job aarch64_build $t; done
    jobs_done
    for t in test_models test_layers; do [ -f "$B/aarch64/dtrain.o" ] && job aarch64_build $t; done
    jobs_done
    # the longest first; test_models in three parts, of about a minute each here; three at a time (the pool, widened
    # by one: test_comm waits out its faults' timeouts, about half of its time)
    pool_widen 1
    job aarch64_run test_models threads_same_bits
    job aarch64_run test_models planned_passes
    # the neon tier's fast paths (the portable tier's C is section 1's, natively, on 500 graphs)
    job aarch64_run test_diff --tiers neon
    job aarch64_run test_models "~threads_same_bits,planned_passes"
    for t in test_comm test_core test_layers; do job aarch64_run $t; done
    jobs_done
    pool_narrow 1
else
    echo "FAIL aarch64-linux-gnu-gcc or qemu-aarch64 is not installed (run tools/deps.sh: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user)"
    failed=$((failed + 1))
fi
fi

section "2d. Windows: MinGW-w64, run under wine64"
if want; then
WCC=x86_64-w64-mingw32-gcc-posix; WINE=/usr/lib/wine/wine64; WSERVER=/usr/lib/wine/wineserver
if command -v $WCC >/dev/null 2>&1 && [ -x "$WINE" ] && [ -x "$WSERVER" ]; then
    W="$B/win"; mkdir -p "$W/examples/simple"
    # without DEFS: no zlib or stb_image for Windows here (the six tests need neither); linked statically (libgomp,
    # winpthreads), so that no DLL has to be found
    WIN="$WCC $WARN -O2 -fopenmp"
    # wine's prefix (about 700 MB, 10-20 s to create) stays in the build directory for the next run; one wineserver
    # serves the section (each program started without one pays about 2 s), ended at the section's end
    case $W in /*) WINEPREFIX=$W/wineprefix ;; *) WINEPREFIX=$(pwd)/$W/wineprefix ;; esac
    WINEDEBUG=-all; export WINEPREFIX WINEDEBUG
    win_init() {   # the server and wine's own services (wineboot; creates the prefix the first time), their output
        # in a file: a service started by a test's first run would hold its output pipe open as long as it lives
        mkdir -p "$WINEPREFIX" && "$WSERVER" -p 60 </dev/null >/dev/null 2>&1 &&
            "$WINE" wineboot </dev/null > "$W/wineboot.log" 2>&1 ||
            { echo "FAIL wine64 cannot start in $WINEPREFIX (see $W/wineboot.log)"; failed=$((failed + 1)); }
    }
    win_exec() {   # win_exec PROGRAM [ARGS]: under wine64 from the repository's root, CR LF as LF, its exit status kept
        DT_TEST_QUICK=1 "$WINE" "$@" </dev/null > "$1.log" 2>&1; w_rc=$?
        tr -d '\r' < "$1.log"; return $w_rc
    }
    win_case() {   # win_case TEST: built (once, for every run of it) and run
        rm -f "$W/$1.exe"
        if build "$W/dtrain.o" "tests/$1.c" "$W/$1.exe" "-static -lm" $WIN; then run "windows $1" win_exec "$W/$1.exe"
        else echo "FAIL build of $1 for Windows"; failed=$((failed + 1)); fi
    }
    win_example() {   # the examples link the implementation (-DDTRAIN_IMPLEMENTATION_LINKED), as the Makefile builds them
        o=$W/examples/${1#examples/}; o=${o%.c}.exe
        check "$1 for Windows" $WIN -DDTRAIN_IMPLEMENTATION_LINKED -I. "$1" "$W/dtrain.o" -o "$o" -static -lm
    }
    job win_init
    job impl "$W/dtrain.o" $WIN
    jobs_done
    # the longest first (test_comm: its compile of the implementation and about 25 s of wine)
    for t in test_comm test_core test_models test_layers test_checkpoint; do job win_case $t; done
    if [ -f "$W/dtrain.o" ]; then
        job win_case test_optim
        for e in examples/*.c examples/simple/*.c; do job win_example "$e"; done
    fi
    jobs_done
    "$WSERVER" -k >/dev/null 2>&1   # this prefix's server, and the services it keeps
else
    echo "FAIL $WCC or $WINE is not installed (run tools/deps.sh: mingw-w64, wine64)"
    failed=$((failed + 1))
fi
fi

section "2e. big-endian: s390x under qemu"
if want; then
if command -v s390x-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-s390x >/dev/null 2>&1; then
    S="$B/s390x"; mkdir -p "$S"
    SCC="s390x-linux-gnu-gcc $WARN -O2 -fopenmp -pthread"   # ISO C as users build it: float evaluated in double
    # the cross-endian pair, built alone with the arithmetic both hosts share: portable kernels, no FMA, float as float
    SPORT="$WARN -O2 -DDT_NO_SIMD -ffp-contract=off -pthread"
    s390x_build() {   # s390x_build TEST: linked with the object of the implementation, or alone (its own)
        rm -f "$S/$1"
        build "$S/dtrain.o" "tests/$1.c" "$S/$1" -lm $SCC || { echo "FAIL build of $1 for s390x"; failed=$((failed + 1)); }
    }
    s390x_run() {   # s390x_run TEST [TESTS]: TESTS as dt_test.h's argv[1] selects them
        [ -x "$S/$1" ] || return 0   # its build failed, said above
        run "s390x $1${2:+ $2}" env DT_TEST_QUICK=1 qemu-s390x -L /usr/s390x-linux-gnu "$S/$1" ${2:+"$2"}
    }
    s390x_case() { s390x_build "$1" && s390x_run "$@"; }
    endian_build() {   # endian_build OUT COMPILER...: tests/test_endian.c alone
        b_out=$1; shift; rm -f "$b_out"
        build "" tests/test_endian.c "$b_out" -lm "$@" || { echo "FAIL build of tests/test_endian.c ($b_out)"; failed=$((failed + 1)); }
    }
    endian_on() {   # endian_on HOST ARGS...: test_endian on x86-64 (this machine) or s390x (qemu)
        e_host=$1; shift
        if [ "$e_host" = s390x ]; then qemu-s390x -L /usr/s390x-linux-gnu "$S/test_endian" "$@"; else "$S/test_endian-x86-64" "$@"; fi
    }
    endian_pair() {   # endian_pair FROM TO: FROM's test_endian --save, then TO's --resume of FROM's checkpoint
        d="$S/endian-$1"; rm -rf "$d"; mkdir -p "$d"
        run "test_endian --save on $1" endian_on "$1" --save "$d"
        run "test_endian --resume on $2 of $1's checkpoint" endian_on "$2" --resume "$d"
    }
    job impl "$S/dtrain.o" $SCC
    job s390x_build test_core   # its own implementation
    job endian_build "$S/test_endian" s390x-linux-gnu-gcc $SPORT -fexcess-precision=fast
    job endian_build "$S/test_endian-x86-64" $CC $SPORT
    jobs_done
    # the files: checkpoints, the PyTorch fixtures (test_optim, test_layers, test_models' SimpleCNN), the data sets; and
    # of test_core what is not arithmetic (the RNG's streams, the tensors)
    job s390x_case test_layers
    job s390x_case test_models "param,torch_simplecnn"
    job s390x_case test_checkpoint
    job endian_pair x86-64 s390x
    job endian_pair s390x x86-64
    job s390x_run test_endian
    job s390x_case test_optim
    job s390x_case test_datasets
    job s390x_run test_core "~gemm,conv"
    jobs_done
    check "s390x and x86-64 write the same checkpoint (tests/test_endian.c --save)" \
        cmp "$S/endian-x86-64/endian.ckpt" "$S/endian-s390x/endian.ckpt"
else
    echo "FAIL s390x-linux-gnu-gcc or qemu-s390x is not installed (run tools/deps.sh: gcc-s390x-linux-gnu, libc6-dev-s390x-cross, qemu-user)"
    failed=$((failed + 1))
fi
fi

# sections 2f and 2g: a configuration in $cfg (its directory; dtrain.o, the implementation), named $cfg_name, compiled
# by $cfg_cc (the compiler and its flags; -O1: the programs run for seconds and compile in half the time of -O2).
# cfg_build TEST: a program that compiles the implementation itself; cfg_run TEST [TESTS] runs it (TESTS as
# dt_test.h's argv[1] selects them); cfg_case TEST: a program linked with $cfg/dtrain.o, built and run
cfg_build() {
    build "$cfg/dtrain.o" "tests/$1.c" "$cfg/$1" -lm $cfg_cc || { echo "FAIL build of $1 ($cfg_name)"; failed=$((failed + 1)); }
}
cfg_run() {
    [ -x "$cfg/$1" ] || return 0   # its build failed, said above
    run "$cfg_name $1${2:+ $2}" env DT_TEST_QUICK=1 "$cfg/$1" ${2:+"$2"}
}
cfg_case() { cfg_build "$1" && [ -x "$cfg/$1" ] && cfg_run "$1"; }

section "2f. musl (static)"
if want; then
if command -v musl-gcc >/dev/null 2>&1; then
    # Debian's musl-gcc: musl's headers and libc instead of glibc's, no OpenMP, zlib or stb (the optional features
    # off); a use of what glibc declares and musl does not stops the build, and the programs run linked statically
    cfg=$B/musl; cfg_name=musl; cfg_cc="musl-gcc $WARN -O1 -pthread -static"
    rm -rf "$cfg"; mkdir -p "$cfg"
    job impl "$cfg/dtrain.o" $cfg_cc
    for t in test_comm test_core; do job cfg_build $t; done   # their own implementation
    jobs_done
    job cfg_run test_comm "fault,hier"   # test_comm in two parts: most of its time is ranks waiting out timeouts
    job cfg_run test_comm "~fault,hier"
    for t in test_optim test_ddp test_resume test_layers test_models test_checkpoint; do job cfg_case $t; done
    job cfg_run test_core
    jobs_done
else
    echo "FAIL musl-gcc is not installed (run tools/deps.sh: musl-tools)"; failed=$((failed + 1))
fi
fi

section "2g. the POSIX subset of macOS (DT_POSIX_MINIMAL)"
if want; then
# what macOS lacks (barriers, spin locks, timers, sem_timedwait, clock_nanosleep, ...) poisoned by tests/posix_minimal.h,
# forced into every file, and declared by glibc (_GNU_SOURCE), so only the poison stops a use; no OpenMP, as Apple's
# clang has none. Timeouts, faults and the threads of DDP and the collective checkpoints run on what is left.
cfg=$B/posix_minimal; cfg_name=posix-minimal
cfg_cc="$CC $WARN -O1 -pthread -D_GNU_SOURCE -DDT_POSIX_MINIMAL -include tests/posix_minimal.h"
rm -rf "$cfg"; mkdir -p "$cfg"
job impl "$cfg/dtrain.o" $cfg_cc
for t in test_comm test_core; do job cfg_build $t; done
printf '#include <pthread.h>\nint main(void){ pthread_barrier_t b; return pthread_barrier_init(&b, 0, 1); }\n' > "$cfg/barrier.c"
job check "tests/posix_minimal.h stops a use of pthread_barrier_init, naming it" sh -c "! $cfg_cc -fsyntax-only '$cfg/barrier.c' \
    2> '$cfg/barrier.err' && grep -q 'poisoned \"pthread_barrier_init\"' '$cfg/barrier.err'"
printf '#define DTRAIN_IMPLEMENTATION\n#include "../../dtrain.h"\n#ifndef DT_POSIX_MINIMAL\n#error DT_POSIX_MINIMAL undefined\n#endif\n' \
    > "$cfg/apple.c"
job check "DT_POSIX_MINIMAL is defined by itself on macOS (__APPLE__)" $CC -std=c11 -D__APPLE__ -E "$cfg/apple.c" -o "$cfg/apple.i"
jobs_done
pool_widen 1   # one thread a rank and no OpenMP here, and test_comm's faults and test_faults wait out timeouts
job cfg_run test_comm "fault,hier"
job cfg_run test_comm "~fault,hier"
for t in test_faults test_ddp test_resume; do job cfg_case $t; done
job cfg_run test_core
jobs_done
pool_narrow 1
fi

section "3. without OpenMP, portable kernels"
if want; then
mkdir -p "$B/noomp"
noomp_case() {
    if build "$B/noomp/dtrain.o" "tests/$1.c" "$B/noomp/$1" "$LDLIBS" $CC $WARN -O2 -DDT_NO_SIMD $DEFS; then
        run "noomp $1" env DT_TEST_QUICK=1 "$B/noomp/$1"
    else echo "FAIL build of $1 without OpenMP"; failed=$((failed + 1)); fi
}

# the dataset tests once more without gzip and image support: the loaders must say which macro to build with
plain_case() {
    if build "" "tests/test_datasets.c" "$B/noomp/test_datasets_plain" -lm $CC $WARN -O2 -pthread; then
        run "without DT_USE_ZLIB, DT_USE_STB_IMAGE: test_datasets" "$B/noomp/test_datasets_plain"
    else echo "FAIL build of test_datasets without the optional features"; failed=$((failed + 1)); fi
}

# the Makefile's two other ways with image folders (STB_DIR, STB): stb_image from a folder of its headers (a copy of
# Debian's), compiled into the build's own object and linked without -lstb; and no stb_image at all (STB=none, as
# where neither is found), which make says and the loader explains (DT_ERR_UNSUPPORTED). Each builds test_datasets
# (at -O0: the build is what is tested) into a build directory of its own and runs it
stb_build() {   # stb_build NAME MAKEARGS...: test_datasets made into $B/stb/NAME, make's output in $B/stb/NAME.out
    s_b="$B/stb/$1"; shift; rm -rf "$s_b"
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory JOBS=1 CC="$CC" CFLAGS=-O0 WERROR=-Werror B="$s_b" \
        "$@" "$s_b/tests/test_datasets" > "$s_b.out" 2>&1 || { cat "$s_b.out"; return 1; }
}
stb_dir_built() {   # with the copy's headers (the link $B/stb/dir/stb/stb) and its object, not Debian's -lstb
    stb_build dir STB_DIR="$B/stb/headers" || return 1
    [ "$(readlink "$B/stb/dir/stb/stb")" = "$(cd "$B/stb/headers" && pwd)" ] || { echo "$B/stb/dir/stb/stb is not a link to STB_DIR"; return 1; }
    [ -f "$B/stb/dir/obj/stb_image.o" ] || { echo "no $B/stb/dir/obj/stb_image.o"; return 1; }
    grep -q -- '-DDT_USE_STB_IMAGE' "$B/stb/dir.out" || { cat "$B/stb/dir.out"; echo "built without -DDT_USE_STB_IMAGE"; return 1; }
    if grep -q -- '-lstb' "$B/stb/dir.out" || readelf -d "$B/stb/dir/tests/test_datasets" | grep -q libstb; then
        cat "$B/stb/dir.out"; echo "linked with Debian's -lstb"; return 1
    fi
}
stb_none_built() {   # make says it builds without image folders, and does
    stb_build none STB=none || return 1
    grep -q 'building without image folders' "$B/stb/none.out" || { cat "$B/stb/none.out"; echo "make did not say it builds without image folders"; return 1; }
    ! grep -- '-DDT_USE_STB_IMAGE\|-lstb' "$B/stb/none.out" || { echo "built with stb_image"; return 1; }
}
stb_dir_case() {
    rm -rf "$B/stb/headers"; mkdir -p "$B/stb/headers"
    if ! cp /usr/include/stb/stb_image.h /usr/include/stb/stb_image_resize.h /usr/include/stb/stb_image_write.h "$B/stb/headers/"; then
        echo "FAIL Debian's stb headers are not in /usr/include/stb (run tools/deps.sh: libstb-dev)"; failed=$((failed + 1)); return
    fi
    check "make STB_DIR=DIR: stb_image compiled from DIR's headers into the build's object, no -lstb" stb_dir_built
    [ -x "$B/stb/dir/tests/test_datasets" ] && run "image folders from STB_DIR: test_datasets" "$B/stb/dir/tests/test_datasets"
}
stb_none_case() {
    check "make STB=none: built without image folders, saying so" stb_none_built
    [ -x "$B/stb/none/tests/test_datasets" ] && run "without image folders (STB=none): test_datasets" "$B/stb/none/tests/test_datasets"
}
# the object beside the three builds that do not need it; then the tests, three at a time (one thread each: the
# waits of test_comm and test_faults leave a core idle)
mkdir -p "$B/stb"
job impl "$B/noomp/dtrain.o" $CC $WARN -O2 -DDT_NO_SIMD $DEFS
job plain_case
job stb_dir_case
job stb_none_case
jobs_done
pool_widen 1
for t in "$@"; do job noomp_case "$t"; done
jobs_done
pool_narrow 1
fi

section "4. AddressSanitizer + UndefinedBehaviorSanitizer (clang)"
if want; then
mkdir -p "$B/asan"
ASAN="clang $WARN -O1 -g -fopenmp -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer $DEFS"
# a program that compiles the implementation itself does so at -O0 (5 s of clang here instead of 25), unless it
# runs the kernels at length: test_diff and test_core run 41-76 s at -O0 and 10-15 s at -O1 (test_comm: 38 s at
# -O0, 18 s at -O1, no gain); the sanitizers check the same at every level
ASAN0="clang $WARN -O0 -g -fopenmp -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer $DEFS"
ASAN_LONG=" test_diff test_core "
TSAN="clang $WARN -O1 -g -fsanitize=thread -pthread $DEFS"
job impl "$B/asan/dtrain.o" $ASAN
job impl "$B/asan/dtrain_tsan.o" $TSAN
jobs_done
# LeakSanitizer's tracer itself sometimes crashes at exit ("LeakSanitizer has encountered a fatal error", its own
# signal 11 under ptrace, once in five runs of make test here, after every test had passed): the program runs again
asan_exec() {   # asan_exec NAME COMMAND...: its output kept in $B/asan/NAME.out
    a_out=$B/asan/$1.out; shift
    "$@" > "$a_out" 2>&1; a_rc=$?
    cat "$a_out"
    if grep -q 'LeakSanitizer has encountered a fatal error' "$a_out"; then
        echo "(LeakSanitizer's tracer failed, not the program: run again)"; "$@"; a_rc=$?
    fi
    return $a_rc
}
asan_case() {
    a_cc=$ASAN
    case "$ASAN_LONG" in *" $1 "*) ;; *) grep -q '^#define DTRAIN_IMPLEMENTATION' "tests/$1.c" && a_cc=$ASAN0 ;; esac
    if build "$B/asan/dtrain.o" "tests/$1.c" "$B/asan/$1" "$LDLIBS" $a_cc; then
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 run "asan $1" asan_exec "$1" env DT_TEST_QUICK=1 "$B/asan/$1"
    else echo "FAIL build of $1 with sanitizers"; failed=$((failed + 1)); fi
}
pool_widen 1   # three at a time: test_comm and test_faults wait out timeouts
for t in "$@"; do job asan_case "$t"; done

# the loader's prefetch thread, the local ranks and DDP's helper thread (which reduces buckets while the
# rank's thread runs backward, recording into its own trace lane) under ThreadSanitizer (no OpenMP, whose
# runtime TSan cannot see into); and the launcher's count of ended ranks, which leaves a stalled one behind
tsan_case() {
    if build "$B/asan/dtrain_tsan.o" "tests/$1.c" "$B/asan/${1}_tsan" "$LDLIBS" $TSAN; then
        TSAN_OPTIONS=halt_on_error=1 run "tsan $1" env DT_TEST_QUICK=1 "$B/asan/${1}_tsan"
    else echo "FAIL build of $1 with ThreadSanitizer"; failed=$((failed + 1)); fi
}
for t in test_partition test_comm test_ddp test_dpsgd test_trace test_resume test_faults test_compress; do job tsan_case "$t"; done
# section 6's object of the implementation, here where the pool is full
if [ -n "${FUZZ:-}" ] && will_run 6; then mkdir -p "$B/fuzz"; job fuzz_impl; fuzz_obj=1; fi
jobs_done
pool_narrow 1
fi

section "5. examples"
if want; then
T=$(mktemp -d)
# examples/simple: each flag-free program exits 0 and its last epoch (or round) is above 50% test accuracy; one job
# of the pool, one program after another, beside the checks below (which use less than a core on average: their
# programs are short and start by loading data); its files are $T/simple-*
simple_checks() {
    if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
        for ex in ddp dpsgd fedavg localsgd hogwild; do
            check "examples/simple/$ex: exit 0, last test accuracy above 50%" sh -c "
                '$B/examples/simple/$ex' > '$T/simple-$ex.out' 2>&1 &&
                sed -n 's/.*test acc *\\([0-9.]*\\)%.*/\\1/p' '$T/simple-$ex.out' | awk '{ a = \$1 } END { exit !(NR > 0 && a > 50) }' ||
                    { cat '$T/simple-$ex.out'; exit 1; }"
        done
    else
        echo "skipped examples/simple: dataset-fashion-mnist is not installed"
    fi
}
job simple_checks
# --precision bf16 (issue #37): SimpleCNN trained in bf16 mixed precision ends its epoch within 0.5 points of the
# same seeded run in fp32 (12 steps of 128 at lr 0.05, momentum 0.9: about 58% on 1000 test images; 2 x 3 s)
bf16_check() {
    if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
        check "train --precision bf16: SimpleCNN's test accuracy within 0.5 points of fp32's, same seed" sh -c "
            for p in fp32 bf16; do
                '$B/examples/train' --model simplecnn --limit 1536 --test-limit 1000 --epochs 1 --seed 1 --lr 0.05 --momentum 0.9 \
                    --precision \$p > '$T/prec-'\$p.out 2>&1 || exit 1
            done
            grep -q 'parameters (bf16)' '$T/prec-bf16.out' &&
            a=\$(sed -n 's/.*test acc *\\([0-9.]*\\)%.*/\\1/p' '$T/prec-fp32.out') &&
            b=\$(sed -n 's/.*test acc *\\([0-9.]*\\)%.*/\\1/p' '$T/prec-bf16.out') &&
            awk -v a=\"\$a\" -v b=\"\$b\" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 40 && b > 40 && d <= 0.5) }' ||
                { cat '$T/prec-fp32.out' '$T/prec-bf16.out'; exit 1; }"
    else
        echo "skipped train --precision bf16: dataset-fashion-mnist is not installed"
    fi
}
job bf16_check
expect_status() {   # expect_status CODE COMMAND...: the command exits with CODE and says why on stderr
    want=$1; shift
    "$@" >/dev/null 2>"$T/err"; got=$?
    [ "$got" -eq "$want" ] && [ -s "$T/err" ]
}
for args in "--bogus 1" "--model resnet56" "--optim rmsprop" "--epochs 0" "--lr -1" "--milestones 5,x" "--test-limit 0" "--batch"; do
    check "train $args: exit 2 with a message" expect_status 2 "$B/examples/train" $args
done
for args in "--sync allgather" "--bucket-kb 0" "--bucket-kb 9007199254740993" "--bucket-kb 99999999999999999999" "--accum" \
            "--dataset folder" "--ranks 0"; do
    check "ddp $args: exit 2 with a message" expect_status 2 "$B/examples/ddp" $args
done
for args in "--compress int8" "--compress bf16:0.5" "--compress topk:0" "--compress topk:1.5" "--compress powersgd:0" "--no-feedback" \
            "--compress topk --sync ps" "--powersgd-warmup 5" "--compress powersgd --powersgd-warmup -1"; do
    check "ddp $args: exit 2 with a message" expect_status 2 "$B/examples/ddp" $args
done
# data that cannot serve a run is refused when it is loaded, not at the first evaluation after an epoch of training:
# test images of another size than the training images (IDX files written here: 8 of 28x28, 4 of 20x20), and an
# image folder of one image (a 90/10 split leaves no test image)
mkdir -p "$T/odd" "$T/one/cls"
{ printf '\000\000\010\003\000\000\000\010\000\000\000\034\000\000\000\034'; head -c 6272 /dev/zero; } > "$T/odd/train-images-idx3-ubyte"
printf '\000\000\010\001\000\000\000\010\000\001\002\003\004\005\006\007' > "$T/odd/train-labels-idx1-ubyte"
{ printf '\000\000\010\003\000\000\000\004\000\000\000\024\000\000\000\024'; head -c 1600 /dev/zero; } > "$T/odd/t10k-images-idx3-ubyte"
printf '\000\000\010\001\000\000\000\004\000\001\002\003' > "$T/odd/t10k-labels-idx1-ubyte"
{ printf 'P6\n2 2\n255\n'; head -c 12 /dev/zero; } > "$T/one/cls/a.ppm"
check "train on test images of another size than the training images: exit 1 before training, naming both" sh -c "
    '$B/examples/train' --data '$T/odd' --epochs 1 > '$T/odd.out' 2>&1; [ \$? -eq 1 ] && grep -q '1x20x20' '$T/odd.out' &&
    grep -q '1x28x28' '$T/odd.out' && ! grep -q '^epoch' '$T/odd.out'"
check "ddp on test images of another size: exit 1 naming both" sh -c "
    '$B/examples/ddp' --ranks 2 --data '$T/odd' > '$T/odd.out' 2>&1; [ \$? -eq 1 ] && grep -q 'are not of the training images' '$T/odd.out'"
case " $DEFS " in *" -DDT_USE_STB_IMAGE "*)
    check "train on an image folder of one image: exit 1 before training, saying it is too few" sh -c "
        '$B/examples/train' --dataset folder --data '$T/one' --epochs 1 > '$T/one.out' 2>&1; [ \$? -eq 1 ] &&
        grep -q 'holds 1 images: too few' '$T/one.out' && ! grep -q '^epoch' '$T/one.out'" ;;
esac
check "dpsgd --topology star: exit 2 naming one-peer-exp among the topologies" sh -c "
    '$B/examples/dpsgd' --topology star > /dev/null 2> '$T/t.err'; [ \$? -eq 2 ] && grep -q 'full or one-peer-exp' '$T/t.err'"
check "dpsgd --topology directed-ring without --push-sum: exit 2 saying to add --push-sum" sh -c "
    '$B/examples/dpsgd' --topology directed-ring > /dev/null 2> '$T/t.err'; [ \$? -eq 2 ] && grep -q 'is directed.*add --push-sum' '$T/t.err'"
for args in "--partition shardz" "--alpha 0"; do
    check "fedavg $args: exit 2 with a message" expect_status 2 "$B/examples/fedavg" $args
done
# the optimizer and schedule flags every SGD example shares (examples/common.h): each wrong value refused, saying why
for ex in train ddp dpsgd localsgd fedavg hogwild; do
    for args in "--optim rmsprop" "--momentum -1" "--wd x" "--milestones 5,3" "--milestones 5," "--cosine --milestones 5" \
                "--warmup 1000" "--min-lr 0.001" "--nesterov --momentum 0" "--optim adam --momentum 0.9" "--optim adamw --wd 0" \
                "--pad-to -1" "--lr inf" "--lr" "--precision fp16"; do
        check "$ex $args: exit 2 with a message" expect_status 2 "$B/examples/$ex" $args
    done
done
for ex in train ddp dpsgd localsgd hogwild; do   # fedavg takes --lr 0: its honest clients then send no change
    check "$ex --lr 0: exit 2 with a message" expect_status 2 "$B/examples/$ex" --lr 0
done
for args in "--momentum 0.9" "--wd 5e-4" "--nesterov" "--optim adam"; do   # Hogwild's lock-free step is plain SGD
    check "hogwild $args: exit 2 with a message" expect_status 2 "$B/examples/hogwild" $args
done
# the checkpoint flags every training example shares: refused before any data is loaded, naming the fix
: > "$T/old.ckpt"
for ex in train ddp dpsgd localsgd fedavg; do
    check "$ex --checkpoint-every 2 without --checkpoint: exit 2 naming it" sh -c "
        '$B/examples/$ex' --checkpoint-every 2 > '$T/c.out' 2>&1; [ \$? -eq 2 ] && grep -q 'needs --checkpoint PATH' '$T/c.out'"
    check "$ex --resume without --checkpoint: exit 2" expect_status 2 "$B/examples/$ex" --resume
    check "$ex --resume PATH (a value): exit 2 naming --checkpoint PATH --resume" sh -c "
        '$B/examples/$ex' --resume '$T/old.ckpt' > '$T/c.out' 2>&1; [ \$? -eq 2 ] && grep -q -- '--checkpoint $T/old.ckpt --resume' '$T/c.out'"
    check "$ex --checkpoint of an existing file, without --resume: exit 2 naming --resume" sh -c "
        '$B/examples/$ex' --checkpoint '$T/old.ckpt' > '$T/c.out' 2>&1; [ \$? -eq 2 ] && grep -q 'with --resume, or remove' '$T/c.out'"
    check "$ex --checkpoint in a missing directory: exit 2 before training" sh -c "
        '$B/examples/$ex' --checkpoint '$T/none/x.ckpt' > '$T/c.out' 2>&1; [ \$? -eq 2 ] && grep -q 'cannot create $T/none/x.ckpt.tmp' '$T/c.out'"
done
check "train, ddp, dpsgd, localsgd, fedavg --checkpoint '' and --csv '': exit 2 naming a file name" sh -c "
    for ex in train ddp dpsgd localsgd fedavg; do
        for flag in --checkpoint --csv; do
            '$B/examples/'\$ex \$flag '' > '$T/c.out' 2>&1; [ \$? -eq 2 ] && grep -q -- \"\$flag needs a file name\" '$T/c.out' || exit 1
        done
    done"
check "hogwild --checkpoint: exit 2 saying why it cannot resume exactly" sh -c "
    '$B/examples/hogwild' --checkpoint '$T/h.ckpt' > '$T/c.out' 2>&1; [ \$? -eq 2 ] && grep -q 'cannot resume exactly' '$T/c.out'"
check "train --sched multistep (the old spelling): exit 2 naming --milestones" sh -c "
    '$B/examples/train' --sched multistep > '$T/s.out' 2>&1; [ \$? -eq 2 ] && grep -q -- '--milestones' '$T/s.out'"
check "train on a missing directory: exit 1 naming it" sh -c "'$B/examples/train' --data '$T/none' 2>&1 >/dev/null | grep -q '$T/none'"
# --link-bandwidth with units (examples/common.h, tests/test_examples): garbage refused naming the forms; a unit read
# as bits or bytes per second, as the log line shows in Mbit/s and Gbit/s
for v in 100Mb fast 0; do
    check "allreduce --link-bandwidth $v: exit 2 naming the forms" sh -c "
        '$B/examples/allreduce' --ranks 2 --count 10 --iters 1 --link-bandwidth $v > '$T/lb.out' 2>&1; [ \$? -eq 2 ] &&
        grep -q 'bits per second (100Mbit, 1Gbit, 10Gbit)' '$T/lb.out'"
done
check "allreduce --link-bandwidth 100Mbit and 125MB: the link model's line says 100 Mbit/s and 1 Gbit/s" sh -c "
    '$B/examples/allreduce' --ranks 2 --count 10 --iters 1 --link-bandwidth 100Mbit | grep -q 'port of 100 Mbit/s' &&
    '$B/examples/allreduce' --ranks 2 --count 10 --iters 1 --link-bandwidth 125MB | grep -q 'port of 1 Gbit/s'"
# and the rate reaches the link model: 2 ranks' ring sends 100000 bytes a rank, 100 ms at 8 Mbit/s (12.5 ms if the
# unit were read as bytes); waits only add to it, so the lower bound holds on a loaded machine
check "allreduce --link-bandwidth 8Mbit: the ring of 100 kB takes at least the 100 ms the rate gives" sh -c "
    '$B/examples/allreduce' --ranks 2 --count 25000 --iters 1 --algos ring --link-bandwidth 8Mbit 2>/dev/null |
    awk '\$1 == \"ring\" { found = 1; if (\$2 < 95) short = 1 } END { exit short || !found }'"
# --dataset and --data mean the same in every example: a missing directory or a dataset without a default one is
# refused before training, naming the files expected and where to get them
for ex in train ddp dpsgd localsgd fedavg hogwild; do
    check "$ex --dataset cifar10 --data MISSING: exit 1 naming the files and the URL" sh -c "
        '$B/examples/$ex' --dataset cifar10 --data '$T/none' > '$T/d.out' 2>&1; [ \$? -eq 1 ] && grep -q 'data_batch_1.bin' '$T/d.out' &&
        grep -q 'cifar-10-binary.tar.gz' '$T/d.out' && ! grep -q '^epoch' '$T/d.out'"
    check "$ex --dataset fashion-mnist --data MISSING: exit 1 naming the files and the Debian package" sh -c "
        '$B/examples/$ex' --dataset fashion-mnist --data '$T/none' > '$T/d.out' 2>&1; [ \$? -eq 1 ] &&
        grep -q 't10k-labels-idx1-ubyte' '$T/d.out' && grep -q 'dataset-fashion-mnist' '$T/d.out'"
    check "$ex --dataset mnist without --data: exit 1 (not Fashion-MNIST's files)" sh -c "
        '$B/examples/$ex' --dataset mnist > '$T/d.out' 2>&1; [ \$? -eq 1 ] && grep -q 'needs --data DIR' '$T/d.out'"
done
check "fedavg --attack labelflip without --flip (its attackers would train honestly): exit 2 naming --flip" sh -c "
    '$B/examples/fedavg' --attack labelflip --attackers 1 > '$T/t.out' 2>&1; [ \$? -eq 2 ] && grep -q 'needs --flip A:B' '$T/t.out'"
check "fedavg --trim 0 (a trimmed mean that cuts nothing): exit 2 naming --agg mean" sh -c "
    '$B/examples/fedavg' --agg trimmed --trim 0 > '$T/t.out' 2>&1; [ \$? -eq 2 ] && grep -q 'agg mean' '$T/t.out'"
pool_widen 1   # the kill-and-resume cases below run as jobs
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    # stopped after epoch 1 and resumed = never stopped: the CSV rows agree to the last digit
    check "train: resumed run ends as the uninterrupted one" sh -c "
        set -e
        '$B/examples/train' --epochs 2 --limit 1024 $TL --csv '$T/a.csv' >/dev/null
        '$B/examples/train' --epochs 1 --limit 1024 $TL --csv '$T/b.csv' --checkpoint '$T/b.ckpt' >/dev/null
        '$B/examples/train' --epochs 2 --limit 1024 $TL --csv '$T/b.csv' --checkpoint '$T/b.ckpt' --resume >/dev/null
        [ \$(wc -l < '$T/a.csv') -eq 3 ]
        cut -d, -f1,3-7 '$T/a.csv' > '$T/a.cut'; cut -d, -f1,3-7 '$T/b.csv' > '$T/b.cut'
        cmp '$T/a.cut' '$T/b.cut'"
    # --checkpoint, killed with SIGKILL a random time (up to 0.3 s) after its first checkpoint, and --resume: the
    # CSV rows (COLUMNS: the time columns left out) and the last checkpoint's bytes of a run never stopped
    # Its files are $T/NAME.a.*, .b.*, or $T/$kr_as.* when kr_as is set (a second case of one example, whose
    # checkpoint must not replace the first's: the refusals below read $T/ddp.a.ckpt of 3 ranks).
    kill_resume() {   # kill_resume NAME COLUMNS ARGS...
        kr_ex=$1; name=${kr_as:-$1}; cols=$2; shift 2
        rm -f "$T/$name".*   # an earlier run's files (a fresh run refuses to write over a checkpoint)
        "$B/examples/$kr_ex" "$@" --csv "$T/$name.a.csv" --checkpoint "$T/$name.a.ckpt" >/dev/null || return 1
        "$B/examples/$kr_ex" "$@" --csv "$T/$name.b.csv" --checkpoint "$T/$name.b.ckpt" >/dev/null & pid=$!
        while [ ! -e "$T/$name.b.ckpt" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done   # polled: a spin would take a core from the run
        delay=$(awk 'BEGIN { srand(); printf "%.2f", rand() * 0.3 }'); sleep "$delay"
        kill -9 $pid 2>/dev/null; wait $pid; st=$?
        [ $st -eq 137 ] || { echo "the run ended with status $st before the kill"; return 1; }
        "$B/examples/$kr_ex" "$@" --csv "$T/$name.b.csv" --checkpoint "$T/$name.b.ckpt" --resume > "$T/$name.b.out" || return 1
        echo "killed $delay s after the first checkpoint; $(head -n 1 "$T/$name.b.out")"
        cut -d, -f"$cols" "$T/$name.a.csv" > "$T/$name.a.cut"; cut -d, -f"$cols" "$T/$name.b.csv" > "$T/$name.b.cut"
        [ "$(wc -l < "$T/$name.a.cut")" -ge 3 ] && cmp "$T/$name.a.cut" "$T/$name.b.cut" && cmp "$T/$name.a.ckpt" "$T/$name.b.ckpt"
    }
    # as jobs of the pool (widened by one, above), beside the checks that follow, but for ddp's and localsgd's,
    # whose checkpoints the refusals below read
    job check "train: killed mid-epoch (--checkpoint-every 5) and resumed, ends as the unstopped run" \
        kill_resume train 1,3-7 --epochs 2 --limit 512 $TL --batch 16 --checkpoint-every 5
    # the header line shows the defaults that shape training: ddp's momentum 0.5 and accum, fedavg's trim and Krum's f
    check "ddp's header line shows momentum 0.5 and accum 1" sh -c "
        '$B/examples/ddp' --ranks 2 --limit 128 $TL --epochs 1 | head -n 1 | grep -q 'sgd lr 0.01 momentum 0.5 wd 0, .*accum 1'"
    check "--test-limit: train, ddp and dpsgd evaluate the first N test samples, as their header lines say" sh -c "
        '$B/examples/train' --limit 128 --test-limit 500 --epochs 1 | head -n 1 | grep -q ' 128 training and 500 test samples' &&
        '$B/examples/ddp' --ranks 2 --limit 128 --test-limit 700 --epochs 1 | head -n 1 | grep -q ' 128 training and 700 test samples' &&
        '$B/examples/dpsgd' --ranks 2 --limit 128 --model simplecnn --epochs 1 | head -n 1 | grep -q ' 128 training and 128 test samples' &&
        '$B/examples/dpsgd' --ranks 2 --limit 128 --test-limit 300 --model simplecnn --epochs 1 | head -n 1 | grep -q ' 128 training and 300 test samples'"
    check "fedavg's header line shows the trim and Krum's f" sh -c "
        '$B/examples/fedavg' --ranks 2 --clients 5 --rounds 1 --limit 100 $TL --agg trimmed | head -n 1 | grep -q 'aggregator trimmed (trim 0.1)' &&
        '$B/examples/fedavg' --ranks 2 --clients 5 --rounds 1 --limit 100 $TL --agg krum --krum-f 0 | head -n 1 | grep -q 'aggregator krum (f 0)'"
    check "fedavg --server yogi: the header states its settings, the rounds differ from FedAvg's; --server-beta2 1: exit 2" sh -c "
        '$B/examples/fedavg' --ranks 2 --clients 4 --rounds 2 --limit 400 $TL --server yogi > '$T/srv.out' &&
        head -n 1 '$T/srv.out' | grep -q '; server yogi (lr 0.01, momentum 0.9, beta2 0.99, tau 0.001)' &&
        '$B/examples/fedavg' --ranks 2 --clients 4 --rounds 2 --limit 400 $TL > '$T/avg.out' &&
        ! grep -q server '$T/avg.out' && [ \"\$(grep '^round   2' '$T/srv.out' | sed 's/.*test loss//')\" != \"\$(grep '^round   2' '$T/avg.out' | sed 's/.*test loss//')\" ] &&
        { '$B/examples/fedavg' --server-beta2 1 > /dev/null 2>&1; [ \$? -eq 2 ]; }"
    check "fedavg --dp-clip 1 --dp-noise 1: the header and every round state the privacy spent, growing; noise without a clip: exit 2" sh -c "
        '$B/examples/fedavg' --ranks 2 --clients 20 --frac 0.25 --rounds 3 --limit 400 $TL --dp-clip 1 --dp-noise 1 > '$T/dp.out' &&
        head -n 1 '$T/dp.out' | grep -q 'DP-FedAvg: updates clipped to 1, noise multiplier 1, epsilon for delta 1e-05' &&
        sed -n 's/^round .*epsilon \\([0-9.]*\\)$/\\1/p' '$T/dp.out' | awk '{ if (NR > 1 && \$1 <= p) bad = 1; p = \$1 } END { exit !(NR == 3 && !bad) }' &&
        { '$B/examples/fedavg' --dp-noise 1 > /dev/null 2>&1; [ \$? -eq 2 ]; }"
    check "ddp: killed and resumed on 3 ranks (--checkpoint-every 3), ends as the unstopped run" \
        kill_resume ddp 1,3-6,9 --ranks 3 --batch 48 --epochs 2 --limit 512 $TL --checkpoint-every 3
    kr_as=ddp-topk
    job check "ddp --compress topk:0.01: killed and resumed, ends as the unstopped run (the residuals in the checkpoint)" \
        kill_resume ddp 1,3-6,9 --ranks 2 --epochs 2 --limit 512 $TL --compress topk:0.01 --checkpoint-every 2
    # PowerSGD's warm-up: syncs of the plain gradient first; a warm-up longer than the run gives fp32's losses and bytes
    check "ddp --compress powersgd:2 --powersgd-warmup: the header says so; a warm-up of the whole run is fp32's run" sh -c "
        a=\$('$B/examples/ddp' --ranks 2 --limit 512 $TL | grep '^epoch' | sed 's/  *[0-9.]*s  train/ train/; s/ [0-9]* img\\/s  comm [0-9.]*s//')
        b=\$('$B/examples/ddp' --ranks 2 --limit 512 $TL --compress powersgd:2 --powersgd-warmup 100 | tee '$T/warm.log' | grep '^epoch' |
           sed 's/  *[0-9.]*s  train/ train/; s/ [0-9]* img\\/s  comm [0-9.]*s//')
        grep -q 'compress powersgd rank 2 with error feedback after 100 plain syncs' '$T/warm.log' && [ -n \"\$a\" ] && [ \"\$a\" = \"\$b\" ]"
    kr_as=
    check "localsgd: killed and resumed between averages, ends as the unstopped run" \
        kill_resume localsgd 1,3-6,9,10 --ranks 3 --epochs 2 --limit 512 $TL --batch 16 --period 4 --checkpoint-every 3
    job check "dpsgd: killed and resumed on 3 ranks, ends as the unstopped run" \
        kill_resume dpsgd 1,3-8 --ranks 3 --epochs 2 --limit 256 --model simplecnn --batch 16 --checkpoint-every 2
    check "dpsgd --topology one-peer-exp on 4 ranks: the header names the schedule, the run ends" sh -c "
        '$B/examples/dpsgd' --ranks 4 --topology one-peer-exp --limit 128 --model simplecnn --batch 16 > '$T/op.out' &&
        grep -qF 'one-peer-exp topology (one peer a step, i xor 2^(t mod 2), weights 1/2; a period' '$T/op.out' &&
        grep -q '^average of the 4 replicas' '$T/op.out'"
    check "dpsgd --push-sum --topology directed-one-peer-exp on 4 ranks: the header names push-sum and the schedule, the run ends" sh -c "
        '$B/examples/dpsgd' --ranks 4 --push-sum --topology directed-one-peer-exp --limit 128 --model simplecnn --batch 16 > '$T/op.out' &&
        grep -qF 'D-PSGD (cta, push-sum) on 4 ranks, directed-one-peer-exp topology (one peer a step, i -> i + 2^(t mod 2)' '$T/op.out' &&
        grep -q '^average of the 4 replicas' '$T/op.out'"
    kr_as=dpsgd-push-sum
    job check "dpsgd --push-sum on a directed ring: killed and resumed on 3 ranks, ends as the unstopped run" \
        kill_resume dpsgd 1,3-8 --ranks 3 --epochs 2 --limit 256 --model simplecnn --batch 16 --checkpoint-every 2 \
        --topology directed-ring --push-sum --order atc
    kr_as=
    job check "fedavg: killed between rounds and resumed, ends as the unstopped run" \
        kill_resume fedavg 1,3-12 --ranks 3 --clients 7 --rounds 20 --frac 0.9 --dropout-prob 0.3 --agg median \
        --attack signflip --attackers 1 --limit 700 $TL --batch 20
    # FedAvg resumes on another number of ranks (its state is rank 0's): killed on 3 ranks after a checkpoint and
    # resumed on 2, and on 4, it writes the CSV rows of the run never stopped (a model without dropout layers, whose
    # masks follow each rank's own counter)
    fed_other_world() {
        A="--model fedavg_2nn --clients 5 --rounds 6 --limit 500 $TL"
        rm -f "$T"/fw.*
        "$B/examples/fedavg" --ranks 3 $A --csv "$T/fw.a.csv" > /dev/null || return 1
        for fw_m in 2 4; do
            rm -f "$T/fw.ckpt" "$T/fw.b.csv"
            "$B/examples/fedavg" --ranks 3 $A --csv "$T/fw.b.csv" --checkpoint "$T/fw.ckpt" --checkpoint-every 1 > /dev/null & pid=$!
            while [ ! -e "$T/fw.ckpt" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done   # polled: a spin would take a core from the run
            kill -9 $pid 2>/dev/null; wait $pid
            "$B/examples/fedavg" --ranks $fw_m $A --csv "$T/fw.b.csv" --checkpoint "$T/fw.ckpt" --resume > "$T/fw.out" || return 1
            echo "on $fw_m ranks: $(head -n 1 "$T/fw.out")"
            cut -d, -f1,3-12 "$T/fw.a.csv" > "$T/fw.a.cut"; cut -d, -f1,3-12 "$T/fw.b.csv" > "$T/fw.b.cut"
            [ "$(wc -l < "$T/fw.a.cut")" -eq 7 ] && cmp "$T/fw.a.cut" "$T/fw.b.cut" || return 1
        done
    }
    job check "fedavg: killed on 3 ranks, resumed on 2 and on 4 (FedAvg's state is rank 0's), ends as the unstopped run" fed_other_world
    # DDP resumes on another number of ranks from the mean of the saved ranks' states (equal replicas): killed on 3
    # ranks mid-epoch and resumed on 2 with the same global batch, an MLP (no dropout) ends with the unstopped run's
    # losses and accuracy but for rounding (the loader's position is the global batch's: no sample skipped or repeated)
    ddp_other_world() {
        A="--model mlp --batch 48 --epochs 2 --limit 960 $TL"
        rm -f "$T"/dw.*
        "$B/examples/ddp" --ranks 3 $A --csv "$T/dw.a.csv" > /dev/null || return 1
        "$B/examples/ddp" --ranks 3 $A --csv "$T/dw.b.csv" --checkpoint "$T/dw.ckpt" --checkpoint-every 7 > /dev/null & pid=$!
        while [ ! -e "$T/dw.ckpt" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done   # polled: a spin would take a core from the run
        kill -9 $pid 2>/dev/null; wait $pid
        "$B/examples/ddp" --ranks 2 $A --csv "$T/dw.b.csv" --checkpoint "$T/dw.ckpt" --resume > "$T/dw.out" 2> "$T/dw.err" ||
            { cat "$T/dw.err"; return 1; }
        echo "$(head -n 1 "$T/dw.out")"
        grep -q 'was saved by 3 ranks; this run has 2, and each starts from the mean of theirs' "$T/dw.err" &&
        paste -d, "$T/dw.a.csv" "$T/dw.b.csv" | awk -F, 'NR > 1 { n++; d = $3 - $12; e = $5 - $14; if (d < 0) d = -d; if (e < 0) e = -e
            if (d > 1e-3 || e > 0.005) bad++ } END { exit !(n == 2 && !bad) }'
    }
    job check "ddp: killed on 3 ranks mid-epoch, resumed on 2 (the ranks' mean), ends with the unstopped run's losses" ddp_other_world
    # the library's refusals of a checkpoint that cannot resume the run, named in the example's message
    check "localsgd --resume with another --period: exit 1 naming both values" sh -c "
        '$B/examples/localsgd' --ranks 3 --epochs 2 --limit 512 $TL --batch 16 --period 5 --checkpoint '$T/localsgd.a.ckpt' --resume \
            > '$T/c.out' 2>&1; [ \$? -eq 1 ] && grep -q 'with --period 4; this run has --period 5' '$T/c.out'"
    check "ddp --resume of a missing checkpoint: exit 1 naming it" sh -c "
        '$B/examples/ddp' --ranks 2 --limit 64 $TL --checkpoint '$T/none.ckpt' --resume > '$T/c.out' 2>&1; [ \$? -eq 1 ] && grep -q '$T/none.ckpt' '$T/c.out'"
    check "ddp --resume of a damaged checkpoint: exit 1 naming the checksum" sh -c "
        cp '$T/ddp.a.ckpt' '$T/bad.ckpt' && printf 'xx' | dd of='$T/bad.ckpt' bs=1 seek=5000 conv=notrunc 2>/dev/null &&
        '$B/examples/ddp' --ranks 3 --batch 48 --limit 512 $TL --checkpoint '$T/bad.ckpt' --resume > '$T/c.out' 2>&1; [ \$? -eq 1 ] && grep -q checksum '$T/c.out'"
    check "ddp --resume of a checkpoint of 3 ranks on 2: resumed from the ranks' mean, naming both world sizes" sh -c "
        cp '$T/ddp.a.ckpt' '$T/el.ckpt' &&
        '$B/examples/ddp' --ranks 2 --batch 48 --epochs 2 --limit 512 $TL --checkpoint '$T/el.ckpt' --resume > '$T/c.out' 2>&1 &&
        grep -q 'was saved by 3 ranks; this run has 2, and each starts from the mean of theirs' '$T/c.out'"
    check "localsgd --resume of a DDP checkpoint: exit 1 naming its writer" sh -c "
        '$B/examples/localsgd' --ranks 3 --limit 512 $TL --checkpoint '$T/ddp.a.ckpt' --resume > '$T/c.out' 2>&1; [ \$? -eq 1 ] && grep -q dt_ddp_save '$T/c.out'"
    check "ddp --resume with another model: exit 1 naming the model" sh -c "
        '$B/examples/ddp' --ranks 3 --batch 48 --limit 512 $TL --model fedavg_2nn --checkpoint '$T/ddp.a.ckpt' --resume > '$T/c.out' 2>&1
        [ \$? -eq 1 ] && grep -q 'another model' '$T/c.out'"
    # a model that diverged (noise of 1e38 from the attackers) is not saved: the run stops, saying why
    check "fedavg: a model with NaN is not checkpointed: exit 1 naming it" sh -c "
        '$B/examples/fedavg' --ranks 2 --clients 3 --rounds 2 --attack noise --attackers 2 --noise-std 1e38 --limit 300 $TL \
            --checkpoint '$T/nan.ckpt' > '$T/c.out' 2>&1; [ \$? -eq 1 ] && grep -q 'NaN or infinite' '$T/c.out' && [ ! -e '$T/nan.ckpt' ]"
    # the same 4 local ranks twice: the same bits (fixed-order reductions); and a batch no rank can share
    check "ddp: two runs on 4 ranks log the same losses and accuracy" sh -c "
        set -e
        '$B/examples/ddp' --ranks 4 --limit 1024 $TL --csv '$T/d1.csv' >/dev/null
        '$B/examples/ddp' --ranks 4 --limit 1024 $TL --csv '$T/d2.csv' >/dev/null
        cut -d, -f1,3-6 '$T/d1.csv' > '$T/d1.cut'; cut -d, -f1,3-6 '$T/d2.csv' > '$T/d2.cut'
        [ \$(wc -l < '$T/d1.cut') -eq 2 ] && cmp '$T/d1.cut' '$T/d2.cut'"
    check "ddp --trace: one Chrome-trace file with every rank" sh -c "
        '$B/examples/ddp' --ranks 2 --limit 256 $TL --trace '$T/t.json' >/dev/null 2>&1 &&
        head -c 16 '$T/t.json' | grep -q '^{\"traceEvents\":\[' && grep -q '\"rank 1\"' '$T/t.json'"
    # a run that diverges stops, exit 1, before the checkpoint of the epoch whose loss is not finite (its weights
    # may still be finite, but so large that the forward pass overflows): a checkpoint left is of an epoch whose
    # losses were finite, before the one that diverged
    check "train --lr 0.8: stops at the diverged epoch, keeping the last good checkpoint" sh -c "
        rm -f '$T/div.ckpt'; '$B/examples/train' --limit 2000 $TL --epochs 3 --lr 0.8 --checkpoint '$T/div.ckpt' > '$T/div.out' 2>&1
        [ \$? -eq 1 ] && grep -q 'diverged' '$T/div.out' || exit 1
        [ -e '$T/div.ckpt' ] || exit 0
        bad=\$(sed -n 's/.*: epoch \\([0-9]*\\)[:,].*diverged.*/\\1/p' '$T/div.out' | head -n 1)
        '$B/examples/train' --limit 2000 $TL --epochs 3 --lr 0.8 --checkpoint '$T/div.ckpt' --resume > '$T/div2.out' 2>&1
        got=\$(sed -n 's/^resumed from .* after epoch \\([0-9]*\\).*/\\1/p' '$T/div2.out')
        [ -n \"\$bad\" ] && [ -n \"\$got\" ] && [ \"\$got\" -lt \"\$bad\" ] &&
            grep -E \"^epoch +\$got/\" '$T/div.out' | grep -q 'test loss' && ! grep -E \"^epoch +\$got/\" '$T/div.out' | grep -q nan"
    # a run at chance with finite losses is a result, not a fault: it goes on, and every such epoch says so
    check "train at chance with finite losses (--lr 0.8 --momentum 0.9): exit 0, a warning after epoch 2; by default none" sh -c "
        '$B/examples/train' --limit 4000 $TL --epochs 2 --lr 0.8 --momentum 0.9 > '$T/chance.out' 2>&1 &&
        grep 'learns nothing' '$T/chance.out' | grep -q '^dtrain warning: epoch 2: test accuracy .* is chance (1/10) ' &&
        '$B/examples/train' --limit 4000 $TL --epochs 1 > '$T/chance.out' 2>&1 && ! grep -q 'learns nothing' '$T/chance.out'"
    # an unwritable --trace is found before the run, not after the training it was to record (no epoch line)
    check "ddp --trace into a missing directory: exit 1 before training, naming the path" sh -c "
        '$B/examples/ddp' --ranks 2 --limit 256 $TL --trace '$T/no-such-dir/t.json' > '$T/tr.out' 2>&1; [ \$? -eq 1 ] &&
        grep -q 'no-such-dir/t.json' '$T/tr.out' && ! grep -q '^epoch' '$T/tr.out'"
    # a CSV that cannot be written (a full disk) stops the run at its first write, before the first step, naming the cause
    check "train, ddp and fedavg --csv /dev/full: exit 1 before training, naming the file and the cause" sh -c "
        for ex in train ddp fedavg; do
            '$B/examples/'\$ex --limit 128 --test-limit 100 --csv /dev/full > '$T/full.out' 2>&1; [ \$? -eq 1 ] || exit 1
            grep -q 'cannot write /dev/full: No space left on device' '$T/full.out' && ! grep -qE '^(epoch|round) ' '$T/full.out' || exit 1
        done"
    check "ddp --batch 100000000000000: exit 2 naming the training samples" sh -c "
        '$B/examples/ddp' --ranks 4 --batch 100000000000000 --limit 64 > '$T/b.out' 2>&1; [ \$? -eq 2 ] &&
        grep -q 'more than the 60000 training samples' '$T/b.out'"
    check "fedavg, every client dropped out: the round says so, no training loss of 0" sh -c "
        '$B/examples/fedavg' --ranks 2 --clients 2 --rounds 1 --dropout-prob 0.99 --limit 100 --test-limit 100 --csv '$T/drop.csv' \
            > '$T/drop.out' 2>&1 && grep -q 'dropped 2, kept 0)  no client reported' '$T/drop.out' &&
        ! grep -q 'train loss' '$T/drop.out' && grep -q '^1,[^,]*,[^,]*,2,2,0,,' '$T/drop.csv'"
    check "ddp --batch 2 on 4 ranks: exit 1 naming the cause" sh -c "'$B/examples/ddp' --ranks 4 --batch 2 --limit 64 $TL 2>&1 >/dev/null | grep -q 'smaller than the 4 ranks'"
    # a global batch that does not split evenly is refused, not trained with fewer samples than the log says
    check "ddp --batch 128 on 3 ranks: exit 1 naming a batch divisible by 3" sh -c "
        '$B/examples/ddp' --ranks 3 --batch 128 --limit 64 $TL > '$T/b.out' 2>&1; [ \$? -eq 1 ] && grep -q 'divisible by 3' '$T/b.out'"
    check "ddp --accum 3 with 32 samples per rank: exit 1 naming the cause" sh -c "
        '$B/examples/ddp' --ranks 4 --batch 128 --accum 3 --limit 64 $TL > '$T/b.out' 2>&1; [ \$? -eq 1 ] && grep -q 'accum 3 does not divide' '$T/b.out'"
    check "ddp --pad-to 20 on 28x28 images: exit 2 naming the size" sh -c "
        '$B/examples/ddp' --pad-to 20 --limit 64 $TL > '$T/b.out' 2>&1; [ \$? -eq 2 ] && grep -q 'at least 28' '$T/b.out'"
    # VGG-11 needs 32x32: on Fashion-MNIST it is refused naming --pad-to, and runs with it
    check "ddp --model vgg11 on 28x28: exit 1 naming --pad-to 32" sh -c "
        '$B/examples/ddp' --model vgg11 --ranks 2 --limit 64 $TL > '$T/v.out' 2>&1; [ \$? -eq 1 ] && grep -q 'pad-to 32' '$T/v.out'"
    check "ddp --model vgg11 --pad-to 32 on Fashion-MNIST: runs" sh -c "
        '$B/examples/ddp' --model vgg11 --pad-to 32 --limit 256 $TL --epochs 1 --ranks 2 > '$T/v.out' 2>&1 &&
        grep -q '^vgg11 on fashion-mnist 28x28 zero-padded to 32x32: ' '$T/v.out' && grep -q '^epoch   1/1 ' '$T/v.out'"
    # --wd changes the first epoch; --milestones 1 leaves it and changes the second (lr x0.1 from epoch 1 on)
    check "ddp: --wd and --milestones change the run where they should" sh -c "
        set -e
        '$B/examples/ddp' --ranks 2 --epochs 2 --limit 512 $TL --csv '$T/r0.csv' >/dev/null
        '$B/examples/ddp' --ranks 2 --epochs 2 --limit 512 $TL --wd 5e-3 --csv '$T/rw.csv' >/dev/null
        '$B/examples/ddp' --ranks 2 --epochs 2 --limit 512 $TL --milestones 1 --csv '$T/rm.csv' >/dev/null
        for f in r0 rw rm; do cut -d, -f3-5 '$T/'\$f.csv | sed -n 2p > '$T/'\$f.1; cut -d, -f3-5 '$T/'\$f.csv | sed -n 3p > '$T/'\$f.2; done
        ! cmp -s '$T/r0.1' '$T/rw.1'
        cmp '$T/r0.1' '$T/rm.1'
        ! cmp -s '$T/r0.2' '$T/rm.2'"
    # --compress: the header says what travels, and the busiest rank's megabytes (the CSV's last column) are
    # half of fp32's with bf16 and under a twentieth with top-k 1%
    check "ddp --compress bf16 and topk:0.01: the header says so; 1/2 and < 1/20 of fp32's bytes" sh -c "
        set -e
        for c in fp32 bf16 topk:0.01; do '$B/examples/ddp' --ranks 2 --limit 512 $TL --compress \$c --csv \"$T/c-\$c.csv\" > \"$T/c-\$c.out\"; done
        grep -q 'all-reduce ring, compress bf16,' '$T/c-bf16.out'
        grep -q 'all-gather of pairs, compress topk 0.01 with error feedback,' '$T/c-topk:0.01.out'
        f=\$(sed -n 2p '$T/c-fp32.csv' | cut -d, -f9); b=\$(sed -n 2p '$T/c-bf16.csv' | cut -d, -f9); k=\$(sed -n 2p '$T/c-topk:0.01.csv' | cut -d, -f9)
        awk -v f=\$f -v b=\$b -v k=\$k 'BEGIN { exit !(b > 0.49 * f && b < 0.51 * f && k > 0 && k < f / 20) }'"
    # the header line states the whole recipe, in every example
    check "every SGD example's header states the whole recipe" sh -c "
        set -e
        R='--lr 0.05 --momentum 0.9 --nesterov --wd 0.0005 --milestones 3,5 --warmup 1 --clip-grad 0.5'
        S='sgd lr 0.05 momentum 0.9 nesterov wd 0.0005, lr x0.1 at epochs 3,5 after 1 warm-up epochs, gradient norm clipped to 0.5'
        '$B/examples/train' \$R --epochs 2 --limit 128 $TL | grep -qF \"\$S\"
        '$B/examples/ddp' \$R --epochs 2 --ranks 2 --limit 128 $TL | grep -qF \"\$S\"
        '$B/examples/localsgd' \$R --epochs 2 --ranks 2 --limit 128 $TL | grep -qF \"\$S\"
        '$B/examples/dpsgd' \$R --epochs 2 --ranks 2 --limit 128 --model simplecnn | grep -qF \"\$S\"
        '$B/examples/fedavg' \$R --rounds 2 --ranks 2 --clients 2 --limit 128 $TL | grep -qF 'sgd lr 0.05 momentum 0.9 nesterov wd 0.0005, lr x0.1 at rounds 3,5 after 1 warm-up rounds, gradient norm clipped to 0.5'
        '$B/examples/hogwild' --lr 0.05 --cosine --min-lr 0.001 --warmup 1 --epochs 2 --threads 2 --limit 128 $TL --clip-grad 0.5 |
            grep -qF 'sgd lr 0.05 momentum 0 wd 0, cosine to 0.001 over 1 epochs after 1 warm-up epochs, gradient norm clipped to 0.5'"
    # --clip-grad trains otherwise: a norm of 0.01 (below SimpleCNN's early gradients') slows every step
    check "--clip-grad 0.01 changes ddp's and hogwild's training loss; --clip-grad 0: exit 2" sh -c "
        loss() { \"\$@\" | sed -n 's/^epoch .*train loss \\([0-9.]*\\) .*/\\1/p'; }
        a=\$(loss '$B/examples/ddp' --ranks 2 --limit 256 $TL); b=\$(loss '$B/examples/ddp' --ranks 2 --limit 256 $TL --clip-grad 0.01)
        c=\$(loss '$B/examples/hogwild' --threads 1 --limit 256 $TL); d=\$(loss '$B/examples/hogwild' --threads 1 --limit 256 $TL --clip-grad 0.01)
        echo \"ddp \$a / \$b, hogwild \$c / \$d\"
        [ -n \"\$a\" ] && [ -n \"\$b\" ] && [ \"\$a\" != \"\$b\" ] && [ -n \"\$c\" ] && [ -n \"\$d\" ] && [ \"\$c\" != \"\$d\" ] &&
        { '$B/examples/train' --clip-grad 0 > /dev/null 2>&1; [ \$? -eq 2 ]; }"
    # the last line says what DDP did: 4 syncs of 2 buckets (512 images, global batch 128), the overlap, no joined rounds
    check "ddp: the last line counts rank 0's syncs, its buckets begun during backward and the ranks' joined rounds" sh -c "
        '$B/examples/ddp' --ranks 2 --limit 512 $TL | tail -1 |
            grep -E '^ddp: rank 0 synced 4 times, [0-9] of its 8 buckets began while backward ran; the most rounds a rank took part in after it ran out of batches: 0\$'"
    # --sync-bn: ResNet-20 (19 batch norms) on 4 ranks of 4 images follows one rank with the global batch of 16 (the
    # same losses but for rounding, which 12 steps grow to about 0.002 here); without it, the ranks' own statistics
    # of 4 images move the loss by 0.05
    check "ddp --sync-bn: ResNet-20 on 4 ranks x 4 images ends with one rank's training loss (batch 16), without it not" sh -c "
        loss() { \"\$@\" | sed -n 's/^epoch .*train loss \\([0-9.]*\\) .*/\\1/p'; }
        R='--model resnet20 --batch 16 --limit 192 --test-limit 100'
        one=\$(loss '$B/examples/ddp' \$R --ranks 1); s=\$(loss '$B/examples/ddp' \$R --ranks 4 --sync-bn)
        p=\$(loss '$B/examples/ddp' \$R --ranks 4)
        '$B/examples/ddp' \$R --ranks 2 --sync-bn | grep -q 'batch norm synchronised'
        echo \"one rank \$one, 4 ranks with --sync-bn \$s, without \$p\"
        awk -v a=\"\$one\" -v b=\"\$s\" -v c=\"\$p\" 'BEGIN { d = a - b; e = a - c; if (d < 0) d = -d; if (e < 0) e = -e;
            exit !(a != \"\" && d < 0.01 && e > 0.03) }'"
else
    echo "skipped train resume check: dataset-fashion-mnist is not installed"
fi
# examples/simple: started with the section (simple_checks, in the pool); its results are printed here, with the
# kill-and-resume jobs'
jobs_done
pool_narrow 1
check "examples/simple/quickstart --ranks 2: exit 0 after 200 steps" sh -c "'$B/examples/simple/quickstart' --ranks 2 | grep -q '^step 200 '"
# tools/plot.sh: a chart from a small CSV, and a CSV without the asked column refused before drawing
printf 'round,train_loss,test_loss,test_acc\n1,0.9,0.8,0.70\n2,0.6,0.5,0.80\n' > "$T/p.csv"
check "tools/plot.sh -y class_acc on a CSV without it: exit 2 naming the column" sh -c "
    sh tools/plot.sh -o '$T/none.png' -y class_acc '$T/p.csv' 2> '$T/p.err'
    [ \$? -eq 2 ] && grep -q \"no column 'class_acc'\" '$T/p.err' && [ ! -e '$T/none.png' ]"
if command -v gnuplot >/dev/null 2>&1; then
    check "tools/plot.sh: a PNG from a small CSV" sh -c "
        sh tools/plot.sh -o '$T/p.png' -t 'two rounds' '$T/p.csv=one run' >/dev/null && [ -s '$T/p.png' ] &&
        [ \"\$(head -c 4 '$T/p.png' | tail -c 3)\" = PNG ]"
else
    echo "skipped tools/plot.sh chart check: gnuplot is not installed (tools/deps.sh gnuplot-nox)"
fi
rm -rf "$T"
fi

section "5b. the tutorial and the README: their experiments, shortened, and their quotations of the examples"
if want; then
# each chapter in a scratch directory of its own (tools/docs_check.sh), three at a time (the pool, widened by one:
# a chapter's short runs leave a core idle a third of the time, loading and writing)
pool_widen 1
for md in docs/tutorial/*.md README.md; do
    job check "$md: its commands run and its quotations are current" env DOCS_CHECK_QUIET=1 sh tools/docs_check.sh "$B" "$md"
done
jobs_done
pool_narrow 1
fi

section "5c. faults on local ranks (DT_FAULT, tests/mpi/fault_ddp.c)"
# fault_ends PATTERN COMMAND...: the run ends with exit status 1 within 15 s, its output matches PATTERN
# (grep -E) and says "the loss is nan" at most once (every rank's NaN loss is one report)
fault_ends() {
    pat=$1; shift
    start=$(date +%s)
    out=$(timeout 60 "$@" 2>&1); rc=$?
    secs=$(( $(date +%s) - start ))
    printf '%s\n' "$out" | grep -v 'UCX  WARN'
    [ "$rc" -eq 1 ] && [ "$secs" -le 15 ] && printf '%s\n' "$out" | grep -Eq "$pat" &&
        [ "$(printf '%s\n' "$out" | grep -c 'the loss is nan')" -le 1 ] || { echo "exit status $rc after $secs s"; return 1; }
}
# fault_cases RUNNER...: each fault on the last rank at its 5th collective (a DDP step), and one NaN pixel
# in its batch at step 3, run by RUNNER (mpiexec -n N prog, or prog --ranks N) with a 0.5 s timeout; jobs of the
# pool, which the caller widens (the cases mostly wait out timeouts) and waits for
fault_cases() {
    r=$1; shift
    job check "$* DT_FAULT kind=fail on rank $r: exit 1 naming the injected failure and rank $r" \
        fault_ends "DT_ERR_STATE: rank $r: all-reduce #5 .*injected failure" env DT_FAULT="rank=$r,coll=5,kind=fail" "$@" --timeout 0.5
    job check "$* DT_FAULT kind=return on rank $r: exit 1 naming rank $r as gone" \
        fault_ends "rank $r has finished|ranks not in it: ([0-9]+ \([a-z0-9# ]*\), )*$r \((at #4|finished)\)" env DT_FAULT="rank=$r,coll=5,kind=return" "$@" --timeout 0.5
    job check "$* DT_FAULT kind=stall:3 on rank $r: exit 1 within 15 s naming rank $r" \
        fault_ends "rank $r has not (returned|ended)" env DT_FAULT="rank=$r,coll=5,kind=stall:3" "$@" --timeout 0.5
    job check "$* DT_FAULT kind=hang on rank $r: exit 1 within 15 s naming rank $r" \
        fault_ends "rank $r has not (returned|ended)" env DT_FAULT="rank=$r,coll=5,kind=hang" "$@" --timeout 0.5
    # (under MPI, with MPI's native all-reduce: its collectives left with MPI by the failure once wrote into
    # gradients freed as the ranks ended, and corrupted the heap in about 1 run of 14; dtrain_mpi.h stages them)
    job check "$* DT_FAULT kind=nan on rank $r (the gradient): exit 1, DT_ERR_NUMERIC with rank, epoch and step, once" \
        fault_ends "DT_ERR_NUMERIC: rank [0-9]+: epoch 1, step [0-9]+: .*the loss is nan" env DT_FAULT="rank=$r,coll=5,kind=nan" "$@" --timeout 0.5
    job check "$* one NaN pixel in rank $r's batch at step 3: exit 1, DT_ERR_NUMERIC naming rank $r, epoch 1, step 3, once" \
        fault_ends "DT_ERR_NUMERIC: rank $r: epoch 1, step 3: .*the loss is nan" "$@" --timeout 0.5 --nan-pixel "$r:3"
    # fp16 sends the sample counts alone, in f32, first in each sync: #5 is step 2's (a NaN there once trained on
    # with the undivided gradient sum and exit 0)
    job check "$* --compress fp16, DT_FAULT kind=nan on rank $r in the sample counts: exit 1, DT_ERR_NUMERIC naming them" \
        fault_ends "DT_ERR_NUMERIC: .*the samples of all ranks \(all-reduced\) is nan" env DT_FAULT="rank=$r,coll=5,kind=nan" "$@" --timeout 0.5 --compress fp16
}
if want; then
mkdir -p "$B/faults"
# four cases at a time (the pool, widened: most of their time is a timeout's wait)
pool_widen 2
if build "" tests/mpi/fault_ddp.c "$B/faults/fault_ddp" "$LDLIBS" $CC $WARN -O2 -pthread $DEFS; then
    for n in 2 3 4; do fault_cases $((n - 1)) "$B/faults/fault_ddp" --ranks $n; done
    job check "DT_FAULT that is not a fault: exit 1 naming the form" sh -c "
        DT_FAULT='rank=1,coll=0,kind=fail' '$B/faults/fault_ddp' 2>&1 | grep -q 'is not rank=R,coll=N,kind=K'"
else echo "FAIL build of tests/mpi/fault_ddp.c"; failed=$((failed + 1)); fi
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then   # the same through an example
    job check "ddp: a NaN in rank 2's gradient (DT_FAULT) ends the run: exit 1, DT_ERR_NUMERIC naming rank, epoch and step, once" \
        fault_ends "DT_ERR_NUMERIC: rank [0-9]+: epoch 1, step [0-9]+: .*the loss is nan" \
        env DT_FAULT="rank=2,coll=6,kind=nan" "$B/examples/ddp" --ranks 3 --limit 600 $TL --batch 60 --timeout 2
    job check "ddp: rank 1 stalled for good (DT_FAULT) ends the run: exit 1 within 15 s, naming it" \
        fault_ends "rank 1 has not returned" env DT_FAULT="rank=1,coll=6,kind=hang" "$B/examples/ddp" --ranks 3 --limit 600 $TL --batch 60 --timeout 1
fi
jobs_done
pool_narrow 2
fi

section "5d. the course kit: docs/course, tools/grade_lab.sh, the experiments, the coding assignments"
if want; then
# the chapters, the grader's tests and the experiments, each in directories of its own, two at a time (the pool)
for md in docs/course/*.md; do
    job check "$md: its commands run" env DOCS_CHECK_QUIET=1 sh tools/docs_check.sh "$B" "$md"
done
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    job run "grade_lab" sh tests/grade_lab_test.sh "$B"
    # the five workloads, seconds each; vgg11 checks that DDP and local SGD every step log the same losses
    job check "tools/experiments.sh: the five workloads at QUICK length" env QUICK=1 B="$B" OUT="$B/experiments-quick" sh tools/experiments.sh
else
    echo "skipped tools/grade_lab.sh's tests and the experiments: dataset-fashion-mnist is not installed"
fi
# the coding assignments (docs/course/assignments, built by make): each harness fails on the student's stub, naming
# a rank or case and the expected and actual values, and passes on the reference solution (tools/course_solutions)
for a in $(cd docs/course/assignments && ls test_*.c | sed 's/^test_//; s/\.c$//'); do
    job check "assignment $a: the harness fails on the stub, saying what it expected" sh -c \
        "! '$B/course/student/test_$a' > '$B/course/$a.stub.out' 2>&1 && grep -q '^FAIL .*expected' '$B/course/$a.stub.out'"
    if [ -f "tools/course_solutions/$a.c" ]; then
        job check "assignment $a: the harness passes on the reference solution" "$B/course/solution/test_$a"
    else echo "skipped assignment $a's reference solution: tools/course_solutions/$a.c is not here (a students' copy)"; fi
done
jobs_done
fi

section "6. fuzz targets (libFuzzer, ${FUZZ_SECONDS:-20} s each)"
if want; then
mkdir -p "$B/fuzz"
# the targets share one object of the implementation (built in section 4's pool when it runs), compiled with
# libFuzzer's coverage and fuzz_image's small DT_IMAGE_MAX_PIXELS (a limit only the image-folder loader reads)
if [ -z "${fuzz_obj:-}" ] && [ -n "${FUZZ:-}" ]; then job fuzz_impl; jobs_done; fi
fuzz_case() {
    f=$1
    if [ -f "$B/fuzz/dtrain.o" ] && $FUZZ_CC -fsanitize=fuzzer -DDTRAIN_IMPLEMENTATION_LINKED "fuzz/$f.c" "$B/fuzz/dtrain.o" \
        -o "$B/fuzz/$f" $LDLIBS; then
        mkdir -p "$B/fuzz/$f.corpus"
        seeds=""; [ -d "fuzz/corpus/$f" ] && seeds="fuzz/corpus/$f"
        check "fuzz $f" env TMPDIR="$FZ_TMP" "$B/fuzz/$f" -max_total_time="${FUZZ_SECONDS:-20}" -rss_limit_mb=2048 \
            "$B/fuzz/$f.corpus" $seeds
    else echo "FAIL build of fuzz target $f"; failed=$((failed + 1)); fi
}
# the files a target writes for each input go to memory (/dev/shm, where there is one): on this machine's disk
# each input waited ~3 ms on the file system (3,000 inputs in 10 s instead of 340,000). A target fuzzes for a time,
# not an amount of work, so all of them run at once: the pool gets a token for each target beyond JOBS, returned after
FZ_TMP=${TMPDIR:-/tmp}; [ -d /dev/shm ] && [ -w /dev/shm ] && FZ_TMP=/dev/shm
fz_extra=0; for f in ${FUZZ:-}; do fz_extra=$((fz_extra + 1)); done; fz_extra=$((fz_extra - JOBS))
pool_widen "$fz_extra"
for f in ${FUZZ:-}; do job fuzz_case "$f"; done
jobs_done
pool_narrow "$fz_extra"
fi

section "7. MPI (mpiexec -n 2, 3, 4)"
if want; then
mkdir -p "$B/mpi"
if command -v mpicc >/dev/null 2>&1 && command -v mpiexec >/dev/null 2>&1; then
    MPICC="mpicc $WARN -O2 -fopenmp -DDT_USE_MPI $DEFS"
    # the object, and beside it examples/simple/ddp compiled alone with mpicc, as a user's one file (run below)
    rm -f "$B/mpi/simple_ddp"
    job impl "$B/mpi/dtrain.o" $MPICC
    job check "examples/simple/ddp.c built alone with mpicc" $MPICC -I. examples/simple/ddp.c -o "$B/mpi/simple_ddp" $LDLIBS
    jobs_done
    # the test programs, and the examples built with mpicc (below), linked with the object, two at a time
    mpi_build() {
        build "$B/mpi/dtrain.o" "tests/mpi/$1.c" "$B/mpi/$1" "$LDLIBS" $MPICC ||
            { echo "FAIL build of tests/mpi/$1.c with mpicc"; failed=$((failed + 1)); }
    }
    # the examples built with mpicc link this section's object (as make builds them, DTRAIN_IMPLEMENTATION_LINKED);
    # examples/simple/ddp above is compiled alone, as a user's one file
    mpi_example_build() {
        check "examples/$1.c built with mpicc, -DDT_USE_MPI" $MPICC -DDTRAIN_IMPLEMENTATION_LINKED "examples/$1.c" "$B/mpi/dtrain.o" \
            -o "$B/mpi/$1" $LDLIBS
    }
    for t in test_comm_mpi test_trace_mpi test_train_mpi test_resume_mpi fault_ddp; do rm -f "$B/mpi/$t"; job mpi_build $t; done
    for ex in ddp localsgd dpsgd fedavg; do rm -f "$B/mpi/$ex"; job mpi_example_build $ex; done
    # C11 is this section's object, built above with $WARN (-Werror); C++ here
    job check "mpicc C11 and g++ with DT_USE_MPI: warning-free" sh -c "[ -f '$B/mpi/dtrain.o' ] &&
        mpicxx -x c++ -Wall -Wextra -Wpedantic -Werror -fopenmp -DDT_USE_MPI $DEFS -c tests/impl.c -o '$B/mpi/impl-cxx.o'"
    jobs_done
    # the runs: three jobs at a time (the pool, widened by one): a rank that waits backs off (dtrain_mpi.h), and
    # test_comm_mpi waits out barriers and stalls by design (-n 2, 3 and 4 together: 29 s here, one by one 48 s)
    pool_widen 1
    MT=$(mktemp -d)
    # examples/simple/ddp built with mpicc: under mpiexec -n 2 each process is a rank (RANKS is for local ranks);
    # the longest job, first
    [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] &&
        job check "examples/simple/ddp under mpiexec -n 2: exit 0, last test accuracy above 50%" sh -c "
            [ -x '$B/mpi/simple_ddp' ] && timeout 300 mpiexec -n 2 '$B/mpi/simple_ddp' > '$MT/simple.out' 2>&1 &&
            sed -n 's/.*test acc *\\([0-9.]*\\)%.*/\\1/p' '$MT/simple.out' | awk '{ a = \$1 } END { exit !(NR > 0 && a > 50) }' ||
                { cat '$MT/simple.out'; exit 1; }"
    if [ -x "$B/mpi/test_comm_mpi" ]; then
        for n in 2 3 4; do job run "mpi -n $n" timeout 600 mpiexec -n $n "$B/mpi/test_comm_mpi"; done
    fi
    # --trace under MPI: rank 0 gathers every rank's events into one file; after a failure, a file per rank
    [ -x "$B/mpi/test_trace_mpi" ] && job run "mpi trace -n 2" timeout 300 mpiexec -n 2 "$B/mpi/test_trace_mpi"
    if [ -x "$B/mpi/test_train_mpi" ]; then
        for n in 2 3 4; do job run "mpi train -n $n" timeout 600 mpiexec -n $n "$B/mpi/test_train_mpi"; done
    fi
    # resume under mpiexec (tests/mpi/test_resume_mpi.c): a run killed with SIGKILL after a random step K (one
    # rank kills itself, which ends the job) and resumed from its last checkpoint writes the bytes of an
    # uninterrupted run; K is printed with a failure, and DT_TEST_KILL_AT=K replays it
    if [ -x "$B/mpi/test_resume_mpi" ]; then
        RT=$(mktemp -d)
        mpi_resume() {   # mpi_resume TRAINER N [K]: K, when given, fixes the step of the kill; files RT/TRAINER-N.*
            k=${DT_TEST_KILL_AT:-${3:-$((3 + $(od -An -N2 -tu2 /dev/urandom) % 11))}}; f=$RT/$1-$2
            echo "$1 under mpiexec -n $2: killed after step $k (DT_TEST_KILL_AT=$k replays it)"
            rm -f "$f.ckpt"
            timeout 120 mpiexec -n "$2" "$B/mpi/test_resume_mpi" --trainer "$1" --steps 14 --every 3 --ckpt "$f.ckpt" \
                --out "$f.ref" || return 1
            rm -f "$f.ckpt"
            timeout 120 mpiexec -n "$2" "$B/mpi/test_resume_mpi" --trainer "$1" --steps 14 --every 3 --ckpt "$f.ckpt" \
                --out "$f.out" --kill-at "$k" >/dev/null 2>&1 && { echo "the run was not killed"; return 1; }
            timeout 120 mpiexec -n "$2" "$B/mpi/test_resume_mpi" --trainer "$1" --steps 14 --every 3 --ckpt "$f.ckpt" \
                --out "$f.out" --resume --expect-from $((k / 3 * 3)) || return 1
            cmp "$f.ref" "$f.out"
        }
        for n in 2 3 4; do job check "ddp under mpiexec -n $n: killed and resumed, ends as the uninterrupted run" mpi_resume ddp $n; done
        for t in localsgd dpsgd fedavg; do
            job check "$t under mpiexec -n 3: killed and resumed, ends as the uninterrupted run" mpi_resume $t 3
        done
        job check "dpsgd-exp (one-peer exponential, period 2) under mpiexec -n 4: killed after step 4, resumed from 3, mid-period, ends as the uninterrupted run" \
            mpi_resume dpsgd-exp 4 4
        job check "sgp (push-sum on a directed graph) under mpiexec -n 3: killed and resumed, ends as the uninterrupted run" mpi_resume sgp 3
    fi
    # faults under mpiexec: each kind ends the job (a stalled rank with MPI_Abort) with exit status 1 and a message
    # naming the cause and the rank (fault_cases, section 5c)
    [ -x "$B/mpi/fault_ddp" ] && for n in 2 3 4; do fault_cases $((n - 1)) mpiexec -n $n "$B/mpi/fault_ddp"; done
    printf '#define DTRAIN_IMPLEMENTATION\n#include "../../dtrain.h"\nstatic dt_result fn(dt_comm *c, void *a) { (void)c; (void)a; return DT_OK; }\nint main(void) { return dt_launch(NULL, fn, NULL) == DT_OK ? 0 : 1; }\n' > "$B/mpi/nompi.c"
    job check "built without MPI, under mpiexec -n 2: exit 1, saying to rebuild with MPI" sh -c "
        $CC $WARN -pthread '$B/mpi/nompi.c' -o '$B/mpi/nompi' -lm || exit 1
        timeout 60 mpiexec -n 2 '$B/mpi/nompi' > '$B/mpi/nompi.out' 2>&1; rc=\$?
        cat '$B/mpi/nompi.out'; [ \$rc -eq 1 ] && grep -q 'built without MPI: rebuild it with MPI' '$B/mpi/nompi.out'"
    # the examples built with mpicc, under mpiexec, log what they log on as many local ranks: the same bits
    # with the library's algorithms (--algo ring) and messages (gossip, FedAvg's reports)
    if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
        mpi_example() {   # mpi_example NAME COLUMNS N ARGS...: the CSV's COLUMNS agree, mpiexec -n N and --ranks N
            name=$1; cols=$2; n=$3; shift 3
            [ -x "$B/mpi/$name" ] || { echo "not built (above)"; return 1; }
            f=$MT/$name-$(printf '%s' "$*" | cksum | cut -d ' ' -f 1)   # the files of this case (the jobs run together)
            timeout 300 mpiexec -n "$n" "$B/mpi/$name" "$@" --csv "$f-mpi.csv" >/dev/null || return 1
            timeout 300 "$B/examples/$name" --ranks "$n" "$@" --csv "$f-local.csv" >/dev/null || return 1
            cut -d, -f"$cols" "$f-mpi.csv" > "$f-mpi.cut"; cut -d, -f"$cols" "$f-local.csv" > "$f-local.cut"
            [ "$(wc -l < "$f-mpi.cut")" -ge 2 ] && cmp "$f-mpi.cut" "$f-local.cut" ||
                { echo "mpiexec:"; cat "$f-mpi.cut"; echo "local ranks:"; cat "$f-local.cut"; return 1; }
        }
        job check "ddp: mpiexec -n 2 logs the losses, accuracy and traffic of 2 local ranks" \
            mpi_example ddp 1,3-6,9 2 --limit 512 $TL --algo ring
        job check "localsgd: mpiexec -n 2 logs the losses, accuracy and traffic of 2 local ranks" \
            mpi_example localsgd 1,3-6,9,10 2 --limit 512 $TL --period 4 --algo ring --model fedavg_2nn
        job check "dpsgd: mpiexec -n 3 logs the losses, accuracy and consensus of 3 local ranks" \
            mpi_example dpsgd 1,3-8 3 --limit 256 --model simplecnn --algo ring
        job check "fedavg: mpiexec -n 3 logs the rounds, losses and accuracy of 3 local ranks" \
            mpi_example fedavg 1,3-10 3 --clients 7 --rounds 2 --frac 0.9 --dropout-prob 0.3 --agg median --attack signflip \
            --attackers 1 --model fedavg_2nn --limit 700 $TL
        job check "fedavg --dp-clip 0.5 --dp-noise 0.3: mpiexec -n 3 logs the rounds, losses and accuracy (the noise too) of 3 local ranks" \
            mpi_example fedavg 1,3-10 3 --clients 6 --frac 0.5 --rounds 2 --dp-clip 0.5 --dp-noise 0.3 --model fedavg_2nn --limit 500 $TL
        job check "fedavg --server adam: mpiexec -n 3 logs the rounds, losses and accuracy of 3 local ranks" \
            mpi_example fedavg 1,3-10 3 --clients 5 --rounds 2 --server adam --model fedavg_2nn --limit 500 $TL
        # FedAvg saved under mpiexec -n 3 after round 3 and resumed under mpiexec -n 2: the rows of the run never stopped
        job check "fedavg: saved under mpiexec -n 3, resumed under mpiexec -n 2, ends as the unstopped run" sh -c "
            A='--model fedavg_2nn --clients 5 --limit 500 $TL'
            rm -f '$MT/fw.ckpt' '$MT/fw.a.csv' '$MT/fw.b.csv'
            timeout 300 mpiexec -n 3 '$B/mpi/fedavg' \$A --rounds 6 --csv '$MT/fw.a.csv' > /dev/null &&
            timeout 300 mpiexec -n 3 '$B/mpi/fedavg' \$A --rounds 3 --csv '$MT/fw.b.csv' --checkpoint '$MT/fw.ckpt' > /dev/null &&
            timeout 300 mpiexec -n 2 '$B/mpi/fedavg' \$A --rounds 6 --csv '$MT/fw.b.csv' --checkpoint '$MT/fw.ckpt' --resume > /dev/null &&
            cut -d, -f1,3-12 '$MT/fw.a.csv' > '$MT/fw.a.cut' && cut -d, -f1,3-12 '$MT/fw.b.csv' > '$MT/fw.b.cut' &&
            [ \$(wc -l < '$MT/fw.a.cut') -eq 7 ] && cmp '$MT/fw.a.cut' '$MT/fw.b.cut'"
        # ddp under mpiexec -n 3 with --checkpoint-every, one rank killed with SIGKILL a random time after the first
        # checkpoint (the job ends with it), then resumed: the CSV rows and checkpoint bytes of a job never stopped.
        # It runs a copy of the program, MT/kill/ddp, so that the rank it kills is its own, not another job's
        mpi_kill_resume() {
            set -- --batch 48 --epochs 2 --limit 512 $TL --checkpoint-every 3 --algo ring
            mkdir -p "$MT/kill" && cp "$B/mpi/ddp" "$MT/kill/ddp" || return 1
            timeout 300 mpiexec -n 3 "$MT/kill/ddp" "$@" --csv "$MT/k.a.csv" --checkpoint "$MT/k.a.ckpt" >/dev/null || return 1
            timeout 300 mpiexec -n 3 "$MT/kill/ddp" "$@" --csv "$MT/k.b.csv" --checkpoint "$MT/k.b.ckpt" >/dev/null 2>&1 & pid=$!
            while [ ! -e "$MT/k.b.ckpt" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done   # polled: a spin would take a core from the run
            delay=$(awk 'BEGIN { srand(); printf "%.2f", rand() * 0.3 }'); sleep "$delay"
            rank=$(pgrep -f "^$MT/kill/ddp " | head -n 1); [ -n "$rank" ] && kill -9 "$rank"; wait $pid
            [ $? -ne 0 ] || { echo "the job ended before a rank was killed"; return 1; }
            timeout 300 mpiexec -n 3 "$MT/kill/ddp" "$@" --csv "$MT/k.b.csv" --checkpoint "$MT/k.b.ckpt" --resume > "$MT/k.out" || return 1
            echo "a rank killed $delay s after the first checkpoint; $(head -n 1 "$MT/k.out")"
            cut -d, -f1,3-6,9 "$MT/k.a.csv" > "$MT/k.a.cut"; cut -d, -f1,3-6,9 "$MT/k.b.csv" > "$MT/k.b.cut"
            [ "$(wc -l < "$MT/k.a.cut")" -eq 3 ] && cmp "$MT/k.a.cut" "$MT/k.b.cut" && cmp "$MT/k.a.ckpt" "$MT/k.b.ckpt"
        }
        job check "ddp under mpiexec -n 3: a rank killed, the job resumed, ends as the unstopped job" mpi_kill_resume
        # rank 0 writes the trace; every rank learns before the run that it cannot, and the job ends naming the path
        job check "ddp --trace into a missing directory under mpiexec -n 2: exit 1 before training, naming the path" sh -c "
            timeout 120 mpiexec -n 2 '$B/mpi/ddp' --limit 256 $TL --trace '$MT/no-such-dir/t.json' > '$MT/tr.out' 2>&1;
            [ \$? -eq 1 ] && grep -q 'no-such-dir/t.json' '$MT/tr.out' && ! grep -q '^epoch' '$MT/tr.out'"
        # docs/multi-machine.md's launch with a hostfile, here naming this machine twice (localhost and its
        # hostname, 2 slots each): the job logs what 4 local ranks log
        job check "ddp under mpiexec -f HOSTS -n 4 (this machine named twice): the losses, accuracy and traffic of 4 local ranks" sh -c "
            printf 'localhost:2\\n%s:2\\n' \"\$(hostname)\" > '$MT/hosts' &&
            timeout 300 mpiexec -f '$MT/hosts' -n 4 '$B/mpi/ddp' --limit 512 $TL --sync flat --algo ring --csv '$MT/h-mpi.csv' > /dev/null &&
            timeout 300 '$B/examples/ddp' --ranks 4 --limit 512 $TL --sync flat --algo ring --csv '$MT/h-local.csv' > /dev/null &&
            [ \"\$(cut -d, -f3,4,5,9 '$MT/h-mpi.csv')\" = \"\$(cut -d, -f3,4,5,9 '$MT/h-local.csv')\" ]"
    else
        echo "skipped the examples under mpiexec: dataset-fashion-mnist is not installed"
    fi
    jobs_done
    # checkpoints written above, read again
    if [ -x "$B/mpi/test_resume_mpi" ]; then
        # the last DDP checkpoint (4 ranks) resumes under -n 3 from the mean of the ranks' states, saying so; refusals
        # under mpiexec, on every rank, naming the cause: damaged (a byte flipped), and read by another trainer
        mpi_refused() {   # mpi_refused FILE N TRAINER CAUSE: exit 1, CAUSE in the output
            e=$RT/refused-$3-$2-${1##*/}
            timeout 120 mpiexec -n "$2" "$B/mpi/test_resume_mpi" --trainer "$3" --steps 14 --every 3 --ckpt "$1" \
                --out "$e.x" --resume > "$e" 2>&1 && { echo "the run resumed from $1"; return 1; }
            grep -q "$4" "$e" || { cat "$e"; return 1; }
        }
        cp "$RT/ddp-4.ckpt" "$RT/bad.ckpt" && printf 'X' | dd of="$RT/bad.ckpt" bs=1 seek=200 conv=notrunc 2>/dev/null
        job check "a DDP checkpoint of 4 ranks under mpiexec -n 3: resumed from the mean of the 4 ranks' states, said in the log" sh -c "
            cp '$RT/ddp-4.ckpt' '$RT/el.ckpt' &&
            timeout 120 mpiexec -n 3 '$B/mpi/test_resume_mpi' --trainer ddp --steps 14 --every 3 --ckpt '$RT/el.ckpt' \
                --out '$RT/el.x' --resume --expect-from 12 > '$RT/el.err' 2>&1 &&
            grep -q 'was saved by 4 ranks; this run has 3, and each starts from the mean of theirs' '$RT/el.err' || { cat '$RT/el.err'; exit 1; }"
        job check "a damaged DDP checkpoint under mpiexec -n 4: refused, naming the checksum" mpi_refused "$RT/bad.ckpt" 4 ddp checksum
        job check "a DDP checkpoint read by D-PSGD under mpiexec -n 4: refused, naming its writer" \
            mpi_refused "$RT/ddp-4.ckpt" 4 dpsgd "written by dt_ddp_save"
        job check "a D-PSGD checkpoint read by push-sum under mpiexec -n 3: refused, naming push-sum" \
            mpi_refused "$RT/dpsgd-3.ckpt" 3 sgp "D-PSGD: push-sum or not"
        jobs_done
    fi
    pool_narrow 1
    rm -rf "$RT" "$MT"
else
    echo "FAIL mpicc or mpiexec is not installed (run tools/deps.sh: mpich, libmpich-dev)"; failed=$((failed + 1))
fi
fi

section "8. install: make install and uninstall, pkg-config, CMake (tests/install.sh)"
if want; then
. tests/install.sh
fi

section "end"
rm -rf "$PJ"
echo "time by section:${sec_times%,}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
