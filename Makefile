# dp - top-level build. `make` builds dpc and dpexec; `make test` runs every suite,
# several at a time (tests/run.sh: SUITE=a,b picks suites, CASE=PATTERN cases,
# LIST=1 lists them, JOBS=N the slots they share); `make test SAN=1` does the same
# with ASan/UBSan; `make test-all` both in one queue (CI); `make demo` trains models/mlp.dp;
# `make demo-gpt` trains models/gpt2-tiny.dp on English text (the fortunes package);
# `make demo-gpt PRECISION=bf16` trains it in f32 and in bf16 and compares.
# `make deps` installs the Debian packages a fresh machine lacks.

SAN ?= 0
BUILD := build
ifeq ($(SAN),1)
BUILD := build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
# COV=1: gcc's arc counters (--coverage) in build-cov/, for `make san-scope`
# (tests/san_scope.py: which cases the SAN=1 variant runs); never with SAN=1
COV ?= 0
ifeq ($(COV),1)
BUILD := build-cov
SANFLAGS := --coverage
endif

CC      := gcc
MPICC   := mpicc
BISON   := bison
FLEX    := flex
NVCC    ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter $(SANFLAGS)
# every object also depends on the headers it includes (build/**/*.d)
DEPFLAGS = -MMD -MP
LDFLAGS += $(SANFLAGS)

IR_SRC     := $(wildcard ir/*.c)
# format/: the step-file contract (the one thing compiler and runtime share);
# util/: file utilities both use (safe outputs)
FORMAT_SRC := $(wildcard format/*.c)
UTIL_SRC   := $(wildcard util/*.c)
SHARED_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(FORMAT_SRC) $(UTIL_SRC))
FORMAT_HDRS := format/stepfile.h format/ops.def format/settings.h format/settings.def
PASS_SRC   := $(wildcard passes/*.c)
FE_SRC     := $(filter-out compiler/dpc.c,$(wildcard compiler/*.c))
RT_SRC     := $(filter-out runtime/dpexec.c runtime/cpu/vec.c,$(wildcard runtime/*.c runtime/cpu/*.c))
# runtime/cpu/vec.c is built once per instruction set; the CPU backend picks
# one at run time from the CPU's features (one binary runs everywhere)
VEC_OBJ    := $(BUILD)/runtime/cpu/vec_scalar.o $(BUILD)/runtime/cpu/vec_avx2.o \
              $(BUILD)/runtime/cpu/vec_avx512.o

GEN_PARSER := $(BUILD)/gen/parser.c
GEN_LEXER  := $(BUILD)/gen/lexer.c

COMPILER_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(IR_SRC) $(PASS_SRC) $(FE_SRC)) $(SHARED_OBJ) \
                $(BUILD)/gen/parser.o $(BUILD)/gen/lexer.o
RUNTIME_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(RT_SRC)) $(SHARED_OBJ) $(VEC_OBJ)
# SLEEF: vectorised expf/tanhf (1.0 ulp) for the CPU kernels, as PyTorch uses
RUNTIME_LIBS := -lopenblas -ldnnl -lgomp -lsleef -lcjson -lz -lm

DPC    := $(BUILD)/dpc
DPEXEC := $(BUILD)/dpexec
TEXT2SHARD := $(BUILD)/text2shard
DPRUN  := $(BUILD)/dprun

.PHONY: all host tests test test-all demo demo-gpt deps clean
all: host
# host: the programs without the CUDA backend (which `all` adds where nvcc
# is: mk/cuda.mk); .ci/run builds them first, the rest beside the suites
host: $(DPC) $(DPEXEC) $(DPRUN) $(TEXT2SHARD)

$(BUILD)/gen/parser.c $(BUILD)/gen/parser.h &: compiler/parser.y
	@mkdir -p $(dir $@)
	$(BISON) -Wall -Werror --defines=$(BUILD)/gen/parser.h -o $(BUILD)/gen/parser.c $<

$(BUILD)/gen/lexer.c $(BUILD)/gen/lexer.h &: compiler/lexer.l $(BUILD)/gen/parser.h
	@mkdir -p $(dir $@)
	$(FLEX) --header-file=$(BUILD)/gen/lexer.h -o $(BUILD)/gen/lexer.c $<

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(CC) $(CFLAGS) $(DEPFLAGS) -Wno-sign-compare -Wno-unused-function -Icompiler -Iir -Iformat -Iutil -I$(BUILD)/gen -c $< -o $@

$(BUILD)/compiler/%.o: compiler/%.c $(BUILD)/gen/parser.h $(BUILD)/gen/lexer.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -Icompiler -Iir -Iformat -Iutil -Ipasses -I$(BUILD)/gen -c $< -o $@

$(BUILD)/ir/%.o: ir/%.c ir/ir.h $(FORMAT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -Iir -Iformat -Iutil -c $< -o $@

$(BUILD)/format/%.o: format/%.c $(FORMAT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -Iformat -Iutil -c $< -o $@

$(BUILD)/util/%.o: util/%.c $(wildcard util/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -Iutil -c $< -o $@

$(BUILD)/passes/%.o: passes/%.c ir/ir.h $(FORMAT_HDRS) $(wildcard passes/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -Iir -Iformat -Iutil -Ipasses -c $< -o $@

# the runtime sees format/ and util/, never ir/ (the step file is its contract)
$(BUILD)/runtime/%.o: runtime/%.c runtime/rt.h $(FORMAT_HDRS) $(wildcard runtime/*.h runtime/cpu/*.h)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(DEPFLAGS) -Iruntime -Iformat -Iutil -c $< -o $@

$(BUILD)/runtime/cpu/vec_scalar.o: VEC_FLAGS := -DVEC_ISA=0
$(BUILD)/runtime/cpu/vec_avx2.o: VEC_FLAGS := -DVEC_ISA=1 -mavx2 -mfma
$(BUILD)/runtime/cpu/vec_avx512.o: VEC_FLAGS := -DVEC_ISA=2 -mavx512f -mavx2 -mfma
$(VEC_OBJ): $(BUILD)/runtime/cpu/vec_%.o: runtime/cpu/vec.c runtime/rt.h $(FORMAT_HDRS) runtime/cpu/cpu.h
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(VEC_FLAGS) $(DEPFLAGS) -Iruntime -Iformat -Iutil -c $< -o $@

# cJSON: util/machine.c reads `dpc --simulate`'s machine files
$(DPC): $(COMPILER_OBJ) $(BUILD)/compiler/dpc.o
	$(CC) $(LDFLAGS) -o $@ $^ -lcjson -lz -lm

$(DPEXEC): $(RUNTIME_OBJ) $(BUILD)/runtime/dpexec.o
	$(MPICC) $(LDFLAGS) -o $@ $^ $(RUNTIME_LIBS) -ldl

# the launcher (launch/dprun.c): runs dpc and dpexec from its own directory;
# links util/ only (its options' messages, shell quoting)
$(DPRUN): launch/dprun.c $(BUILD)/util/cliopt.o $(BUILD)/util/suggest.o $(BUILD)/util/cmdline.o \
          $(BUILD)/util/stamp.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -Iutil $(LDFLAGS) -o $@ $^

# text -> byte-level llm.c token shard (tools/text2shard.c; standalone)
$(TEXT2SHARD): tools/text2shard.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< -lm

# C test programs: compiler-side ones link the compiler objects, runtime-side
# ones the runtime objects (tests/unit.sh runs them).
COMPILER_TESTS := $(BUILD)/tests/ir_roundtrip $(BUILD)/tests/fe_fuzz $(BUILD)/tests/simulate_test
RUNTIME_TESTS  := $(BUILD)/tests/data_test $(BUILD)/tests/stepfile_fuzz $(BUILD)/tests/backend_test \
                  $(BUILD)/tests/cpu_kernels_test $(BUILD)/tests/bf16_test $(BUILD)/tests/f16_test \
                  $(BUILD)/tests/ckpt_fuzz
# util/ tests link util/ and format/ only
UTIL_TESTS     := $(BUILD)/tests/suggest_test
# a test that includes format/stepfile.c (its static writer) links the rest of format/ and util/
ENCODE_TEST    := $(BUILD)/tests/stepfile_encode_test
tests: $(COMPILER_TESTS) $(RUNTIME_TESTS) $(UTIL_TESTS) $(ENCODE_TEST)

$(COMPILER_TESTS): $(BUILD)/tests/%: tests/%.c $(COMPILER_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Icompiler -Iir -Iformat -Iutil -Ipasses -I$(BUILD)/gen $(LDFLAGS) -o $@ $^ -lcjson -lz -lm

$(UTIL_TESTS): $(BUILD)/tests/%: tests/%.c $(SHARED_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iutil $(LDFLAGS) -o $@ $^ -lcjson -lz -lm

$(ENCODE_TEST): tests/stepfile_encode_test.c format/stepfile.c $(filter-out $(BUILD)/format/stepfile.o,$(SHARED_OBJ))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iformat -Iutil $(LDFLAGS) -o $@ $< $(filter %.o,$^) -lcjson -lz -lm

$(RUNTIME_TESTS): $(BUILD)/tests/%: tests/%.c $(RUNTIME_OBJ)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -Iruntime -Iformat -Iutil $(LDFLAGS) -o $@ $^ $(RUNTIME_LIBS)

# SUITE, CASE, LIST and JOBS reach tests/run.sh from make's command line
# through the environment (its header says what each does)
test: all tests
	BUILD=$(BUILD) SAN=$(SAN) bash tests/run.sh

# both variants, plain (build/) and SAN=1 (build-san/), in one queue: what
# .ci/run runs; each keeps its own logs and summary (tests/run.sh's VARIANTS)
test-all: all tests
	$(MAKE) --no-print-directory SAN=1 all tests
	VARIANTS="plain san" bash tests/run.sh

# tests/san-scope.txt: which cases the SAN=1 variant runs, chosen by coverage
# (tests/san_scope.py says how): the plain suites once in the coverage build
# (build-cov/, COV=1), each case's gcc counters apart, then a set cover. The
# emulator's suites are not run: they are one SKIP under SAN=1. A suite that
# fails here still counts; its failed cases are kept in. (settings: a case of errors.)
SCOPE_SKIP := lib run demo demo_gpt cuda_emu cuda_emu_mutations gpu_kit settings
SCOPE_SUITES = $(subst $(eval) ,$(comma),$(filter-out $(SCOPE_SKIP),$(basename $(notdir $(wildcard tests/*.sh)))))
comma := ,
.PHONY: san-scope
san-scope:
	$(MAKE) --no-print-directory COV=1 all tests
	rm -rf build-cov/cov build-cov/test-logs
	-BUILD=build-cov SAN=0 CASE= DP_COV_DIR=$(CURDIR)/build-cov/cov SUITE=$(SCOPE_SUITES) bash tests/run.sh
	/usr/bin/python3 tests/san_scope.py choose build-cov -o tests/san-scope.txt

demo: deps all
	BUILD=$(BUILD) bash tests/demo.sh

# The tiny GPT on the fortunes text: shard (build/data/fortunes{,_val}.bin, the
# paths models/gpt2-tiny.dp reads), compile, train, loss vs unigram entropy.
# DEMO_GPT_STEPS overrides the step count.
demo-gpt: deps all
	BUILD=$(BUILD) DEMO_GPT_PRECISION=$(PRECISION) bash tests/demo_gpt.sh

# Debian packages dp needs; installs only what is missing (needs root or sudo).
DEB_PKGS := g++ flex bison libopenmpi-dev openmpi-bin libopenblas-dev libdnnl-dev libsleef-dev zlib1g-dev \
            librandom123-dev libcjson-dev strace iproute2 \
            dataset-fashion-mnist python3-torch python3-numpy fortunes
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

clean:
	rm -rf build build-san build-cov build-emu

include mk/cuda.mk
include mk/cuda-emu.mk
include mk/gpu-kit.mk

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
