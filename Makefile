# dtrain - build the examples and tests, run the tests.
#   make              build examples and tests (build/), which link the implementation compiled once (build/obj/dtrain.o),
#                     JOBS (default: the CPUs) at a time
#   make MPI=1        the same with mpicc and -DDT_USE_MPI (build-mpi/), plus the MPI tests
#                     (build-mpi/tests/mpi/test_comm_mpi, test_train_mpi: run them with mpiexec -n 2, 3 or 4;
#                     test_resume_mpi: one run of tests/resume_checks.h, which tests/run.sh kills and resumes)
#   make CUDA=1       the same with the GPU backend (build-cuda/): dtrain_cuda.cu compiled once by nvcc, linked
#                     into every program, which gcc builds with -DDT_USE_CUDA; models then run on the GPU.
#                     With MPI=1 too: build-mpi-cuda/. CUDA_HOME (default /usr/local/cuda), CUDA_ARCH
#   make STB_DIR=DIR  image folders (DT_USE_STB_IMAGE) from DIR's stb_image.h, stb_image_resize.h and stb_image_write.h
#                     (upstream's single files; the tests write images with the last), compiled once
#                     into build/obj/stb_image.o, where Debian's libstb-dev (found by make, and then used: -lstb) is
#                     missing. With neither, or with make STB=none, the programs are built without image folders
#                     (make says so; --dataset folder then fails, saying how to build with them)
#   make test-cuda    builds (CUDA=1) and runs tests/cuda/test_cuda.c: every GPU op against the CPU's, a training
#                     step of every zoo model, DDP on one GPU; on a machine without a GPU it reports its tests
#                     skipped. Then, with a GPU, the examples train briefly on it
#   make bench-cuda   the training step on the GPU next to PyTorch's on the same GPU (bench/cuda.sh; minutes)
#   make test-diff    the differential test at length: DIFF_GRAPHS (5000) random graphs from DIFF_SEED (today's
#                     date) through every fast path on every CPU tier, against the reference kernels, and
#                     DIFF_TORCH (1000) of them against float64 PyTorch
#   make test         run every test (optimised build, no-OpenMP build, C++ and clang compile checks: every program
#                     warning-free with gcc 12, clang 14 and clang 16 at -O0, -O2 and -O3,
#                     ASan+UBSan build, fuzz targets for FUZZ_SECONDS each); ends with
#                     "N passed, N failed", non-zero exit on failure
#   make check-docs   the docs' part of make test alone (under a minute): docs/api.md names every public
#                     declaration (tools/check_api.sh); every C block of README.md and docs/ compiles
#                     (tools/check_snippets.sh, into build/snippets)
#   make demo         the main job: SimpleCNN trained on Fashion-MNIST for one epoch by DDP on 4 local ranks
#   make scaling      DDP time per epoch on 1..4 local ranks, with a chart (build/bench/scaling.png)
#   make plots        the charts and the table in docs/fedavg-attack/ redrawn from the CSVs and logs there
#   make fedavg-attack  the label-flipping study of docs/accuracy.md run again (build/fedavg-attack/, ~30 min)
#   make bench        dtrain next to PyTorch (training step), OpenBLAS (GEMM) and the machine's limits (minutes)
#   make bench-comm   all-reduce time of every algorithm, local and MPI, next to MPICH and gloo (minutes)
#   make bench-busy   one rank's training with another program spinning on a core: the busy-machine watch
#                     against OpenMP's spinning and OMP_WAIT_POLICY=passive (bench/busy.sh; minutes)
#   make bench-slownet D-PSGD against DDP on 8 local ranks behind an emulated slow network, with a chart
#                     (build/bench/slownet.png; about 5 minutes)
#   make bench-buckets DDP time per epoch over bucket sizes, ranks and emulated networks (about 25 minutes)
#   make bench-ddp-mpi DDP under mpiexec -n 2 and 4: overlapped, after backward, PyTorch DDP (gloo) (minutes)
#   make docs-check   the tutorial's experiments (docs/tutorial), shortened, its quick runs' outputs against their
#                     quotations, and its quotations of the examples (tools/docs_check.sh; DOCS_CHECK_FULL=1: at
#                     full length, comparing every quoted output and redrawing docs/tutorial/img)
#   make assignment-test  the course's coding assignments (docs/course/assignments): each harness on the student's
#                     file (A=NAME: that one; SOLUTIONS=1: on the reference solution, tools/course_solutions)
#   make course-handout  what students get: build/course/handout.tar.gz, the repository without the solutions
#   make fixtures     regenerate tests/fixtures with PyTorch (/usr/bin/python3, python3-torch)
#   make examples     only the example programs (build/examples: what docs/course needs on a laptop), and the
#                     flag-free ones of examples/simple (build/examples/simple)
#   make experiments  the five workloads, one chart each (tools/experiments.sh, build/experiments; QUICK=1: seconds
#                     each, as CI runs them; the default length is docs/experiments.md's, about 50 minutes)
#   make windows      the examples and test_core, _layers, _models, _optim, _checkpoint and _comm for Windows
#                     (build-win/*.exe, static), cross-compiled with MinGW-w64 (WIN_CC, default
#                     x86_64-w64-mingw32-gcc-posix) without zlib and stb_image; run them from this directory
#                     (wine64 build-win/tests/test_core.exe, or on Windows)
#   make single       the library as one file to copy: build/single/dtrain.h (tools/amalgamate.sh)
#   make install      the headers, dtrain.pc / dtrain-full.pc (pkg-config) and the CMake package (find_package:
#                     dtrain::dtrain) into PREFIX (default /usr/local), under DESTDIR if set; make uninstall
#   make clean

CC      ?= cc
CFLAGS  ?= -O3
# as many programs built at once as the machine has CPUs (make -j1 or JOBS=1: one at a time); tests/run.sh's
# pool reads JOBS from the environment too
JOBS    ?= $(shell nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 1)
ifeq (,$(filter -j%,$(MAKEFLAGS)))
MAKEFLAGS += -j$(JOBS)
endif
# every warning; an error only in make test (which builds with WERROR=-Werror), so that a newer compiler's new
# warning never stops a user's make, while the project's own code stays warning-free
WERROR  ?=
WARN     = -std=c11 -Wall -Wextra -Wpedantic $(WERROR)
# OpenMP when the compiler has it; the header works without it too
OPENMP  := $(shell printf 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
# optional features of dtrain.h the project's own programs use: gzip (zlib) and image decoding (stb_image, below)
DEFS    := -DDT_USE_ZLIB -pthread
LDLIBS  := -lz -lm

TESTS    := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
EXAMPLES := $(patsubst examples/%.c,%,$(wildcard examples/*.c))
FUZZ     := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
BENCHES  := $(patsubst bench/%.c,%,$(wildcard bench/*.c))
export DEFS LDLIBS
# the library: dtrain.h, the one include, and its modules; the MPI and GPU backends
HEADERS  := dtrain.h $(wildcard dtrain/*/*.h) dtrain_mpi.h dtrain_cuda.h
B        := build
# make MPI=1: the MPI backend (dtrain_mpi.h) in every program, in a build directory of its own
ifdef MPI
CC       := mpicc
DEFS     += -DDT_USE_MPI
B        := build-mpi
MPITESTS := $(B)/tests/mpi/test_comm_mpi
MPITESTS += $(B)/tests/mpi/test_trace_mpi
MPITESTS += $(B)/tests/mpi/test_train_mpi
MPITESTS += $(B)/tests/mpi/test_resume_mpi
endif

# make CUDA=1 (and make test-cuda): the GPU backend (dtrain_cuda.h) in every program
ifneq ($(filter test-cuda bench-cuda,$(MAKECMDGOALS)),)
CUDA      := 1
endif
ifdef CUDA
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(wildcard $(NVCC)),)
$(error make CUDA=1 needs nvcc, which is not at $(NVCC): set CUDA_HOME or NVCC)
endif
# machine code for sm_80 (A100) and sm_90 (H100, H200), and compute_90 PTX that newer GPUs compile at load
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# -fmad=false: no fused multiply-adds in the kernels, so they round as the CPU ops do (cuBLAS is unaffected)
NVFLAGS   ?= -O3 -fmad=false
# override: also when DEFS or LDLIBS come from the command line (e.g. DEFS=-pthread LDLIBS=-lm where zlib is
# missing; stb_image is looked for below)
override DEFS   += -DDT_USE_CUDA
B         := $(B)-cuda
CUDA_OBJ  := $(B)/dtrain_cuda.o
override LDLIBS := $(CUDA_OBJ) -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++ $(LDLIBS)
CUDATESTS := $(B)/tests/cuda/test_cuda
MPITESTS  := $(MPITESTS:build-mpi/%=$(B)/%)
endif
# image folders (DT_USE_STB_IMAGE): stb_image and stb_image_resize, from the first of
#   STB=none          none: the programs are built without image folders (as where neither of the others is found)
#   STB_DIR=DIR       DIR's stb_image.h, stb_image_resize.h and stb_image_write.h (upstream's single files; the tests
#                     write their images with the last), included as <stb/...> through the link $(B)/stb/stb -> DIR
#                     and compiled once into $(B)/obj/stb_image.o (tests/stb_image.c), which every program links
#   Debian's libstb   its headers (<stb/stb_image.h>) and -lstb, when a program using them compiles and links
#                     (libstb-dev, which tools/deps.sh installs)
# override: added to DEFS and LDLIBS from the command line too. Without stb_image, make says so once, and loading
# an image folder fails with DT_ERR_UNSUPPORTED, saying how to build with it.
STB      ?=
STB_DIR  ?=
STB_OBJ  :=
ifeq ($(STB),none)
STB_FROM := none
else ifneq ($(STB_DIR),)
STB_HDRS := $(addprefix $(STB_DIR)/,stb_image.h stb_image_resize.h stb_image_write.h)
$(if $(filter-out $(wildcard $(STB_HDRS)),$(STB_HDRS)),$(error STB_DIR=$(STB_DIR) lacks $(filter-out $(wildcard $(STB_HDRS)),$(STB_HDRS))))
STB_FROM := dir
override DEFS   += -DDT_USE_STB_IMAGE -I$(CURDIR)/$(B)/stb
STB_OBJ  := $(CURDIR)/$(B)/obj/stb_image.o
override LDLIBS := $(STB_OBJ) $(LDLIBS)
else ifeq ($(shell printf '\043include <stb/stb_image.h>\nint main(void){ return stbi_failure_reason() != 0; }\n' | \
                   $(CC) -x c - -o /dev/null -lstb 2>/dev/null && echo found),found)
STB_FROM := libstb
override DEFS   += -DDT_USE_STB_IMAGE
override LDLIBS := -lstb $(LDLIBS)
else
STB_FROM := none
endif
ifeq ($(STB_FROM),none)
$(info make: building without image folders (no DT_USE_STB_IMAGE; STB=$(or $(STB),auto)): for them, install Debian's \
    libstb-dev (sh tools/deps.sh) or give STB_DIR=DIR, a folder of stb_image.h, stb_image_resize.h and stb_image_write.h)
endif

all: $(addprefix $(B)/tests/,$(TESTS)) $(addprefix $(B)/examples/,$(EXAMPLES)) $(addprefix $(B)/bench/,$(BENCHES)) $(MPITESTS)

# the implementation, compiled once: $(B)/obj/dtrain.o (tests/impl.c), linked into every benchmark and example whose
# source does not define DTRAIN_IMPLEMENTATION itself, and $(B)/obj/dtrain_test.o (below), linked into the tests. A
# program that uses more of what only the implementation defines (dt__ internals, DT__ macros) or sets a macro that
# changes it (DT_CONV_WORKSPACE, ...) keeps its #define DTRAIN_IMPLEMENTATION, with a comment saying why, and
# compiles the implementation itself. The examples, which users compile alone, define it
# too; here they are built with -DDTRAIN_IMPLEMENTATION_LINKED, which makes dtrain.h ignore that, and link the object
# (tests/run.sh section 7 compiles them alone with mpicc). tests/run.sh builds an object the same way for each of
# its other configurations (no OpenMP, sanitizers, MPI).
# The tests link their own object, $(B)/obj/dtrain_test.o (tests/impl_test.c): the same implementation with the
# counting allocator of tests/dt_test_alloc.h and the handles of tests/dt_test_hooks.h (DT__TEST_HOOKS).
IMPL_OBJ  := $(B)/obj/dtrain.o
TEST_OBJ  := $(B)/obj/dtrain_test.o
# $(B)/flags: the compiler and flags the programs are built with, rewritten only when they change (make after make
# test, which adds -Werror; another CFLAGS or CC), and a prerequisite of each of them: none is left built with
# other flags than a build now would use (make test's section 2 counts make's build as its gcc -O3 warning checks)
FLAGS_NOW  = $(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $(LDLIBS)
$(B)/flags: FORCE
	@mkdir -p $(B); [ "$$(cat $@ 2>/dev/null)" = '$(FLAGS_NOW)' ] || printf '%s\n' '$(FLAGS_NOW)' > $@
FORCE:
OWN_IMPL  := $(shell grep -l '^\#define DTRAIN_IMPLEMENTATION' tests/test_*.c tests/mpi/*.c bench/*.c)
LINKED_T  := $(filter-out $(patsubst %.c,$(B)/%,$(OWN_IMPL)),$(addprefix $(B)/tests/,$(TESTS)) $(MPITESTS))
LINKED    := $(filter-out $(patsubst %.c,$(B)/%,$(OWN_IMPL)),$(addprefix $(B)/bench/,$(BENCHES)))
$(IMPL_OBJ): tests/impl.c $(HEADERS) $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) -c $< -o $@
$(TEST_OBJ): tests/impl_test.c tests/dt_test_alloc.h tests/dt_test_hooks.h $(HEADERS) $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) -c $< -o $@
$(LINKED): $(IMPL_OBJ)
$(LINKED): OBJ := $(IMPL_OBJ)
$(LINKED_T): $(TEST_OBJ)
$(LINKED_T): OBJ := $(TEST_OBJ)

# STB_DIR=DIR: stb_image's implementation compiled once (another project's code: without this one's warnings), after
# the link that makes DIR's headers <stb/...>; the implementation's object and every program wait for it
ifneq ($(STB_OBJ),)
$(STB_OBJ): tests/stb_image.c $(STB_HDRS)
	@mkdir -p $(dir $@) $(B)/stb
	ln -sfn $(abspath $(STB_DIR)) $(B)/stb/stb
	$(CC) $(CFLAGS) -I$(B)/stb -c $< -o $@
$(IMPL_OBJ) $(TEST_OBJ) $(addprefix $(B)/tests/,$(TESTS)) $(addprefix $(B)/examples/,$(EXAMPLES)) $(addprefix $(B)/bench/,$(BENCHES)) \
    $(MPITESTS) $(CUDATESTS): $(STB_OBJ)
endif

$(B)/tests/mpi/%: tests/mpi/%.c tests/dt_test.h tests/dt_test_trace.h $(HEADERS) $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $< -o $@ $(LDLIBS)
$(MPITESTS): tests/mpi/mpi_test.h tests/comm_checks.h
$(B)/tests/test_ddp $(B)/tests/test_localsgd $(B)/tests/test_compress: tests/train_checks.h
$(B)/tests/test_faults: tests/train_checks.h tests/fault_ddp.h
$(B)/tests/mpi/test_train_mpi: tests/train_checks.h
$(B)/tests/test_resume $(B)/tests/mpi/test_resume_mpi: tests/resume_checks.h
$(B)/tests/test_examples: examples/common.h

$(B)/tests/%: tests/%.c tests/dt_test.h tests/dt_test_alloc.h tests/dt_test_hooks.h tests/dt_test_files.h tests/comm_checks.h \
             tests/dt_test_trace.h \
             $(HEADERS) $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $< $(OBJ) -o $@ $(LDLIBS)

$(B)/examples/%: examples/%.c examples/common.h $(HEADERS) $(IMPL_OBJ) $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) -DDTRAIN_IMPLEMENTATION_LINKED $< $(IMPL_OBJ) -o $@ $(LDLIBS)

$(B)/bench/%: bench/%.c $(HEADERS) $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $< $(OBJ) -o $@ $(LDLIBS)

test: WERROR := -Werror
test: all
	@JOBS="$(JOBS)" FUZZ="$(FUZZ)" MADE="$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS)" sh tests/run.sh "$(CC)" "$(B)" $(TESTS)

# the differential test at length (tests/test_diff.c): DIFF_GRAPHS random graphs (default 5000, a few minutes here)
# on every CPU tier against the reference kernels, from DIFF_SEED (default: today's date, so each day draws new
# graphs; a failure names its seed and graph); then DIFF_TORCH of them (default 1000) against float64 PyTorch
# (tests/diff_torch.py, where /usr/bin/python3 has torch)
DIFF_GRAPHS ?= 5000
DIFF_TORCH  ?= 1000
DIFF_SEED   ?= $(shell date +%Y%m%d)
test-diff: $(B)/tests/test_diff
	$(B)/tests/test_diff --graphs $(DIFF_GRAPHS) --seed $(DIFF_SEED)
	@if /usr/bin/python3 -c 'import torch' 2>/dev/null; then \
	    rm -rf $(B)/diff && mkdir -p $(B)/diff && \
	    $(B)/tests/test_diff --graphs $(DIFF_TORCH) --seed $(DIFF_SEED) --dump $(B)/diff > /dev/null && \
	    /usr/bin/python3 tests/diff_torch.py $(B)/diff; \
	else echo "skipped: tests/diff_torch.py (no /usr/bin/python3 with torch: sh tools/deps.sh installs it)"; fi

.PHONY: test-diff

demo: $(B)/examples/ddp
	$(B)/examples/ddp --ranks 4 --model simplecnn --epochs 1

scaling: $(B)/examples/ddp
	sh bench/scaling.sh $(B)

bench: $(B)/bench/bench_models $(B)/bench/bench_gemm $(B)/bench/bench_machine $(B)/bench/bench_comm
	sh bench/bench.sh $(B)

bench-comm: $(B)/bench/bench_comm
	sh bench/comm.sh $(B)

# learning curves: tools/plot.sh draws any of the examples' CSVs (needs gnuplot)
plots:
	PLOT_ONLY=1 sh tools/fedavg_attack.sh $(B) docs/fedavg-attack

fedavg-attack: $(B)/examples/fedavg
	sh tools/fedavg_attack.sh $(B) $(B)/fedavg-attack

.PHONY: plots fedavg-attack

# the tutorial's and the README's commands, shortened, and their quotations of the examples (DOCS_CHECK_FULL=1:
# at full length, their quoted outputs compared)
docs-check: $(addprefix $(B)/examples/,$(EXAMPLES))
	DOCS_CHECK_FULL=$(DOCS_CHECK_FULL) sh tools/docs_check.sh $(B) docs/tutorial/*.md README.md

.PHONY: docs-check

# the course kit's commands too (docs/course), shortened the same way, its grader on right and wrong
# submissions, and the five workloads of docs/experiments.md at QUICK length
docs-check: docs-check-course
docs-check-course: $(addprefix $(B)/examples/,$(EXAMPLES))
	DOCS_CHECK_FULL=$(DOCS_CHECK_FULL) sh tools/docs_check.sh $(B) docs/course/*.md
	sh tests/grade_lab_test.sh $(B)
	QUICK=1 B=$(B) OUT=$(B)/experiments-quick sh tools/experiments.sh

# the course's coding assignments (docs/course/assignments): each harness, test_A.c, linked with the student's
# A.c there ($(B)/course/student/test_A) and with the reference solution tools/course_solutions/A.c, which
# instructors keep and students are not given ($(B)/course/solution/test_A), and the implementation's object.
#   make assignment-test [A="ring_allreduce gossip aggregate"]   builds and runs the student's (default: all)
#   make assignment-test A=gossip SOLUTIONS=1                    the reference solution's
# tests/run.sh section 5d checks that each harness fails on the stub and passes on the solution.
ASSIGN_D := docs/course/assignments
ASSIGNS  := $(patsubst $(ASSIGN_D)/test_%.c,%,$(wildcard $(ASSIGN_D)/test_*.c))
ASSIGN_S := $(filter $(ASSIGNS),$(patsubst tools/course_solutions/%.c,%,$(wildcard tools/course_solutions/*.c)))
ASSIGN_H := $(ASSIGN_D)/assignments.h $(ASSIGN_D)/harness.h $(HEADERS)
all: $(addprefix $(B)/course/student/test_,$(ASSIGNS)) $(addprefix $(B)/course/solution/test_,$(ASSIGN_S))
$(B)/course/student/test_%: $(ASSIGN_D)/test_%.c $(ASSIGN_D)/%.c $(ASSIGN_H) $(IMPL_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) -I. -I$(ASSIGN_D) $< $(ASSIGN_D)/$*.c $(IMPL_OBJ) -o $@ $(LDLIBS)
$(B)/course/solution/test_%: $(ASSIGN_D)/test_%.c tools/course_solutions/%.c $(ASSIGN_H) $(IMPL_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) -I. -I$(ASSIGN_D) $< tools/course_solutions/$*.c $(IMPL_OBJ) -o $@ $(LDLIBS)
A ?= $(ASSIGNS)
ifneq ($(filter assignment-test,$(MAKECMDGOALS)),)
ifneq ($(filter-out $(ASSIGNS),$(A)),)
$(error make assignment-test: no assignment $(filter-out $(ASSIGNS),$(A)); the assignments are: $(ASSIGNS))
endif
ifneq ($(SOLUTIONS),)
ifneq ($(filter-out $(ASSIGN_S),$(A)),)
$(error make assignment-test SOLUTIONS=1: no reference solution of $(filter-out $(ASSIGN_S),$(A)) here \
    (tools/course_solutions/, which instructors keep and students are not given))
endif
endif
endif
ASSIGN_WHO := $(if $(SOLUTIONS),solution,student)
assignment-test: $(addprefix $(B)/course/$(ASSIGN_WHO)/test_,$(A))
	@st=0; for a in $(A); do \
	    echo "== assignment $$a: $(if $(SOLUTIONS),tools/course_solutions,$(ASSIGN_D))/$$a.c"; \
	    $(B)/course/$(ASSIGN_WHO)/test_$$a || st=1; \
	done; exit $$st

# what students are given: the repository at HEAD without the reference solutions, $(B)/course/handout.tar.gz (its
# make then builds the students' harnesses only)
course-handout:
	@mkdir -p $(B)/course
	git archive --format=tar.gz --prefix=dtrain/ -o $(B)/course/handout.tar.gz HEAD -- . ':(exclude)tools/course_solutions'
	@echo "$(B)/course/handout.tar.gz: the repository at HEAD (committed files) without tools/course_solutions"

.PHONY: assignment-test course-handout

# the example programs alone, and the five workloads' experiments (tools/experiments.sh)
examples: $(addprefix $(B)/examples/,$(EXAMPLES))
experiments: $(addprefix $(B)/examples/,$(EXAMPLES))
	B=$(B) QUICK=$(QUICK) sh tools/experiments.sh

.PHONY: docs-check-course examples experiments

# the flag-free programs, one per algorithm and the README's quick start (examples/simple): the library's public
# API alone, each including "dtrain.h" as a user's program does (-I.)
SIMPLE := $(patsubst examples/simple/%.c,$(B)/examples/simple/%,$(wildcard examples/simple/*.c))
all examples: $(SIMPLE)
$(SIMPLE): $(B)/examples/simple/%: examples/simple/%.c $(HEADERS) $(CUDA_OBJ) $(IMPL_OBJ) $(STB_OBJ) $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) -DDTRAIN_IMPLEMENTATION_LINKED -I. $< $(IMPL_OBJ) -o $@ $(LDLIBS)

bench-busy: $(B)/examples/train $(B)/examples/hogwild
	sh bench/busy.sh $(B)

bench-slownet: $(B)/examples/ddp $(B)/examples/dpsgd
	sh bench/slownet.sh $(B)

bench-buckets: $(B)/examples/ddp
	sh bench/buckets.sh $(B)

# DDP under mpiexec (2 and 4 processes): overlapped, after backward, and PyTorch DDP with gloo (a few minutes)
bench-ddp-mpi:
	$(MAKE) MPI=1 build-mpi/examples/ddp
	sh bench/ddp_mpi.sh build-mpi

# make windows: the examples and the six core tests for Windows, cross-compiled by MinGW-w64 (WIN_CC) into build-win/
# (.exe, linked statically: no DLL to ship), without zlib and stb_image; tests/run.sh section 2d runs the tests
# under wine64
WIN_CC    ?= x86_64-w64-mingw32-gcc-posix
WIN_B     := build-win
WIN_OBJ   := $(WIN_B)/obj/dtrain.o
WIN_TOBJ  := $(WIN_B)/obj/dtrain_test.o
WIN_TESTS := test_core test_layers test_models test_optim test_checkpoint test_comm
WIN_FLAGS  = $(WARN) $(CFLAGS) -fopenmp
windows: $(patsubst examples/%.c,$(WIN_B)/examples/%.exe,$(wildcard examples/*.c examples/simple/*.c)) \
         $(addprefix $(WIN_B)/tests/,$(addsuffix .exe,$(WIN_TESTS)))
$(WIN_OBJ): tests/impl.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(WIN_CC) $(WIN_FLAGS) -c $< -o $@
$(WIN_TOBJ): tests/impl_test.c tests/dt_test_alloc.h tests/dt_test_hooks.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(WIN_CC) $(WIN_FLAGS) -c $< -o $@
$(WIN_B)/examples/%.exe: examples/%.c examples/common.h $(HEADERS) $(WIN_OBJ)
	@mkdir -p $(dir $@)
	$(WIN_CC) $(WIN_FLAGS) -DDTRAIN_IMPLEMENTATION_LINKED -I. $< $(WIN_OBJ) -o $@ -static -lm
$(WIN_B)/tests/%.exe: tests/%.c tests/dt_test.h tests/dt_test_os.h tests/dt_test_hooks.h tests/comm_checks.h $(HEADERS) \
                      $(WIN_TOBJ)
	@mkdir -p $(dir $@)
	$(WIN_CC) $(WIN_FLAGS) $< $(if $(filter $<,$(OWN_IMPL)),,$(WIN_TOBJ)) -o $@ -static -lm

fixtures:
	/usr/bin/python3 tests/gen_fixtures.py tests/fixtures
	/usr/bin/python3 tests/gen_optim_fixtures.py tests/fixtures

clean:
	rm -rf build build-mpi build-win

.PHONY: FORCE all test demo scaling bench bench-comm bench-busy bench-slownet bench-buckets bench-ddp-mpi fixtures clean windows

# the GPU backend: one object from nvcc, a prerequisite of every program (the rules above link it: LDLIBS)
ifdef CUDA
all: $(CUDATESTS)
$(addprefix $(B)/tests/,$(TESTS)) $(addprefix $(B)/examples/,$(EXAMPLES)) $(addprefix $(B)/bench/,$(BENCHES)) \
    $(MPITESTS) $(CUDATESTS): $(CUDA_OBJ) dtrain_cuda.h
$(CUDA_OBJ): dtrain_cuda.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(CUDA_ARCH) -Xcompiler -Wall,-Wextra --Werror all-warnings -c $< -o $@
endif

# the op and model tests, then (with a GPU) every zoo model's training step, and a short run of train and of
# DDP on 2 ranks sharing the GPU when Fashion-MNIST is installed
# make bench-cuda: dtrain's training step on the GPU next to PyTorch's on the same GPU (bench/cuda.sh)
bench-cuda: $(B)/bench/bench_models
	sh bench/cuda.sh $(B)

test-cuda: $(CUDATESTS) $(B)/examples/zoo $(B)/examples/train $(B)/examples/ddp
	$(CUDATESTS)
	@if $(CUDATESTS) --probe; then \
	    set -e; $(B)/examples/zoo --model all --batch 64 --steps 3; \
	    if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then \
	        $(B)/examples/train --epochs 1 --limit 4096; $(B)/examples/ddp --ranks 2 --epochs 1 --limit 4096; \
	    else echo "test-cuda: dataset-fashion-mnist is not installed: train and ddp were not run"; fi; \
	else echo "test-cuda: no GPU: the examples were not run on one"; fi

clean: clean-cuda
clean-cuda:
	rm -rf build-cuda build-mpi-cuda

.PHONY: test-cuda bench-cuda clean-cuda

# make install PREFIX=/usr/local [DESTDIR=/staging]: the headers into PREFIX/include, dtrain_cuda.cu (the GPU
# backend's nvcc translation unit) into PREFIX/share/dtrain, dtrain.pc and dtrain-full.pc (pkg-config) into
# PREFIX/lib/pkgconfig, and the CMake package (find_package(dtrain): dtrain::dtrain) into PREFIX/lib/cmake/dtrain.
# The templates are cmake/*.in, which CMakeLists.txt (cmake --install) fills the same way. make uninstall
# removes those files. The version is DT_VERSION_STRING of dtrain/core/base.h (the module that defines it).
PREFIX      ?= /usr/local
DT_VERSION  := $(shell sed -n 's/^\#define DT_VERSION_STRING "\([0-9.]*\)"$$/\1/p' dtrain/core/base.h)
DT_MODULES  := $(sort $(wildcard dtrain/*/*.h))
DT_INSTALLED := include/dtrain.h $(addprefix include/,$(DT_MODULES)) include/dtrain_mpi.h include/dtrain_cuda.h \
               share/dtrain/dtrain_cuda.cu \
               lib/pkgconfig/dtrain.pc lib/pkgconfig/dtrain-full.pc lib/cmake/dtrain/dtrainConfig.cmake \
               lib/cmake/dtrain/dtrainConfigVersion.cmake lib/cmake/dtrain/dtrainFeatures.cmake
DT_FILL     = sed -e 's|@DTRAIN_VERSION@|$(DT_VERSION)|g' -e 's|@DTRAIN_PREFIX@|$(PREFIX)|g' \
                  -e 's|@DTRAIN_PC_INCLUDEDIR@|$${prefix}/include|g' \
                  -e 's|@DTRAIN_PC_CUDA_SOURCE@|$${prefix}/share/dtrain/dtrain_cuda.cu|g' \
                  -e 's|@DTRAIN_CONFIG_TO_INCLUDE@|../../../include|g' \
                  -e 's|@DTRAIN_CONFIG_TO_CUDA_SOURCE@|../../../share/dtrain/dtrain_cuda.cu|g'

install:
	@test -n "$(DT_VERSION)" || { echo "make install: dtrain/core/base.h has no #define DT_VERSION_STRING \"X.Y.Z\"" >&2; exit 1; }
	install -d $(DESTDIR)$(PREFIX)/include/dtrain $(DESTDIR)$(PREFIX)/share/dtrain $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	    $(DESTDIR)$(PREFIX)/lib/cmake/dtrain
	install -m 644 dtrain.h dtrain_mpi.h dtrain_cuda.h $(DESTDIR)$(PREFIX)/include
	for m in $(DT_MODULES); do install -D -m 644 $$m $(DESTDIR)$(PREFIX)/include/$$m || exit 1; done
	install -m 644 dtrain_cuda.cu $(DESTDIR)$(PREFIX)/share/dtrain
	install -m 644 cmake/dtrainFeatures.cmake $(DESTDIR)$(PREFIX)/lib/cmake/dtrain
	$(DT_FILL) cmake/dtrain.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dtrain.pc
	$(DT_FILL) cmake/dtrain-full.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dtrain-full.pc
	$(DT_FILL) cmake/dtrainConfig.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/dtrain/dtrainConfig.cmake
	$(DT_FILL) cmake/dtrainConfigVersion.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/dtrain/dtrainConfigVersion.cmake
	cd $(DESTDIR)$(PREFIX) && chmod 644 $(DT_INSTALLED) && ! grep -n '@DTRAIN_[A-Z_]*@' $(DT_INSTALLED)

uninstall:
	cd $(DESTDIR)$(PREFIX) && rm -f $(DT_INSTALLED)
	-rmdir $(addprefix $(DESTDIR)$(PREFIX)/include/,$(sort $(dir $(DT_MODULES)))) 2>/dev/null
	-rmdir $(DESTDIR)$(PREFIX)/include/dtrain $(DESTDIR)$(PREFIX)/share/dtrain $(DESTDIR)$(PREFIX)/lib/cmake/dtrain 2>/dev/null

.PHONY: install uninstall

# make single: the library as one file to copy, build/single/dtrain.h (dtrain.h with its modules written in), with
# dtrain_mpi.h, dtrain_cuda.h and dtrain_cuda.cu beside it (tools/amalgamate.sh; generated, never committed)
single:
	sh tools/amalgamate.sh build/single
.PHONY: single

# the API reference covers the headers, and every C code block of the docs compiles (also part of make test)
check-docs:
	sh tools/check_api.sh
	CC="$(CC)" sh tools/check_snippets.sh $(B)/snippets

.PHONY: check-docs
