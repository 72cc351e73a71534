# dtrain - build the examples and tests, run the tests.
#   make              build examples and tests (build/)
#   make MPI=1        the same with mpicc and -DDT_USE_MPI (build-mpi/), plus the MPI test
#                     (build-mpi/tests/mpi/test_comm_mpi: run it with mpiexec -n 2, 3 or 4)
#   make test         run every test (optimised build, no-OpenMP build, C++ and clang compile checks,
#                     ASan+UBSan build, fuzz targets for FUZZ_SECONDS each); ends with
#                     "N passed, N failed", non-zero exit on failure
#   make demo         the main job: SimpleCNN trained on Fashion-MNIST for one epoch by DDP on 4 local ranks
#   make scaling      DDP time per epoch on 1..4 local ranks, with a chart (build/bench/scaling.png)
#   make bench-comm   all-reduce time of every algorithm, local and MPI, next to MPICH and gloo (minutes)
#   make bench-slownet D-PSGD against DDP on 8 local ranks behind an emulated slow network, with a chart
#                     (build/bench/slownet.png; about 5 minutes)
#   make bench-buckets DDP time per epoch over bucket sizes, ranks and emulated networks (about 25 minutes)
#   make fixtures     regenerate tests/fixtures with PyTorch (/usr/bin/python3, python3-torch)
#   make clean

CC      ?= cc
CFLAGS  ?= -O3
WARN    := -std=c11 -Wall -Wextra -Wpedantic -Werror
# OpenMP when the compiler has it; the header works without it too
OPENMP  := $(shell printf 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
# optional features of dtrain.h the project's own programs use: gzip (zlib) and image decoding (stb_image)
DEFS    := -DDT_USE_ZLIB -DDT_USE_STB_IMAGE -pthread
LDLIBS  := -lstb -lz -lm

TESTS    := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
EXAMPLES := $(patsubst examples/%.c,%,$(wildcard examples/*.c))
FUZZ     := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
BENCHES  := $(patsubst bench/%.c,%,$(wildcard bench/*.c))
export DEFS LDLIBS
B        := build
# make MPI=1: the MPI backend (dtrain_mpi.h) in every program, in a build directory of its own
ifdef MPI
CC       := mpicc
DEFS     += -DDT_USE_MPI
B        := build-mpi
MPITESTS := $(B)/tests/mpi/test_comm_mpi
endif

all: $(addprefix $(B)/tests/,$(TESTS)) $(addprefix $(B)/examples/,$(EXAMPLES)) $(addprefix $(B)/bench/,$(BENCHES)) $(MPITESTS)

$(B)/tests/mpi/%: tests/mpi/%.c tests/dt_test.h dtrain.h dtrain_mpi.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $< -o $@ $(LDLIBS)

$(B)/tests/%: tests/%.c tests/dt_test.h tests/dt_test_alloc.h tests/dt_test_files.h tests/comm_checks.h dtrain.h dtrain_mpi.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $< -o $@ $(LDLIBS)

$(B)/examples/%: examples/%.c examples/common.h dtrain.h dtrain_mpi.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $< -o $@ $(LDLIBS)

$(B)/bench/%: bench/%.c dtrain.h dtrain_mpi.h
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(OPENMP) $(DEFS) $< -o $@ $(LDLIBS)

test: all
	@FUZZ="$(FUZZ)" sh tests/run.sh "$(CC)" "$(B)" $(TESTS)

demo: $(B)/examples/ddp
	$(B)/examples/ddp --ranks 4 --model simplecnn --epochs 1

scaling: $(B)/examples/ddp
	sh bench/scaling.sh $(B)

bench-comm: $(B)/bench/bench_comm
	sh bench/comm.sh $(B)

bench-slownet: $(B)/examples/ddp $(B)/examples/dpsgd
	sh bench/slownet.sh $(B)

bench-buckets: $(B)/examples/ddp
	sh bench/buckets.sh $(B)

fixtures:
	/usr/bin/python3 tests/gen_fixtures.py tests/fixtures
	/usr/bin/python3 tests/gen_optim_fixtures.py tests/fixtures

clean:
	rm -rf build build-mpi

.PHONY: all test demo scaling bench-comm bench-slownet bench-buckets fixtures clean
