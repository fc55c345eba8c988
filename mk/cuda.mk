# mk/cuda.mk - the CUDA backend's build (included by the top-level Makefile).
#
#   make cuda        build/libdpcuda.so: the CUDA backend (kernels, the backend,
#                    NCCL communicators) that `dpexec --device cuda|auto` loads
#                    with dlopen from beside the dpexec binary
#   make cuda-check  the same, then tests/cuda.sh
#
# `make` (all) builds it too when nvcc exists (CI: /usr/local/cuda), so CI
# proves the CUDA code compiles and links even where nothing can run it;
# without nvcc `all` is unchanged. dpexec never links a CUDA library: the
# shared object carries them (cudart static; cuBLASLt and NCCL shared, found by
# rpath), is linked with --no-undefined (self-contained: it takes its own
# PIC copies of runtime/err.c and the step-file codec) and exports one symbol,
# dp_cuda_backend. Host code is C11 built with the same CFLAGS as the rest
# (-Wall -Wextra); kernels are nvcc with -Xcompiler=-Wall,-Wextra. Both must
# stay warning-free.
#
# Knobs: NVCC (the Makefile's), CUDA_ARCH (default: sm_80 + sm_90 cubins and
# compute_90 PTX for newer GPUs), CUDA_DEVICE_OPT (flags added to every nvcc
# line, default none; .ci/run's "-Xcicc -O0 -Xptxas -O0" builds device code
# that is only compiled, never run, for a fifth of the CPU: .ci/run says
# what that keeps and what it does not).

HAVE_NVCC  := $(shell test -x "$(NVCC)" && echo 1)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
NVCCFLAGS  ?= -O2 -lineinfo
NVCCFLAGS  += -std=c++17 $(CUDA_ARCH) -Xcompiler=-fPIC,-fvisibility=hidden \
              -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter $(CUDA_DEVICE_OPT)
# FMA contraction: -fmad=false wherever a kernel repeats the CPU's float
# expressions operation for operation (a*b+c then rounds twice, as gcc's
# uncontracted code does, and elementwise ops, the optimizers, rope and the
# norms agree with the CPU bitwise or to 1 ulp); the attention kernels cannot
# match the CPU's sgemm bit for bit anyway and are mostly FMAs, so they keep
# nvcc's default (-fmad=true). docs/CUDA.md lists each file's choice.
CUDA_FMAD_FILES := attention
cuda_fmad = $(if $(filter $(1),$(CUDA_FMAD_FILES)),-fmad=true,-fmad=false)
CUDA_INC   := -I$(CUDA_HOME)/include
CUDA_CFLAGS = $(CFLAGS) -fPIC -fvisibility=hidden
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lnccl \
              -lcudart_static -lstdc++ -ldl -lrt -lpthread -lz -lm

# the step-file codec's name tables and op classes (and what it links in)
CUDA_PIC_SRC := format/stepfile.c format/stepfile_check.c format/settings.c format/kernel_kind.c \
                util/outfile.c
CUDA_CU    := $(wildcard runtime/cuda/*.cu)
CUDA_OBJ   := $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_CU)) $(BUILD)/runtime/cuda/backend_cuda.o \
              $(BUILD)/runtime/cuda/comm_nccl.o $(BUILD)/runtime/cuda/pic/err.o \
              $(patsubst %.c,$(BUILD)/runtime/cuda/pic/%.o,$(notdir $(CUDA_PIC_SRC)))
CUDA_SO    := $(BUILD)/libdpcuda.so
CUDA_HDRS  := $(wildcard runtime/cuda/*.h runtime/cuda/*.cuh) runtime/rt.h runtime/comm.h \
              runtime/backend.h format/stepfile.h format/ops.def format/settings.def

.PHONY: cuda cuda-check
cuda: $(CUDA_SO)

ifeq ($(HAVE_NVCC),1)
# (not in the sanitized build, nor the coverage build: their suites never load it)
ifneq ($(SAN),1)
ifneq ($(COV),1)
all: cuda
endif
endif
endif

$(BUILD)/runtime/cuda/%.o: runtime/cuda/%.cu $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(call cuda_fmad,$*) $(CUDA_INC) -Iruntime -Iformat -Iutil -MMD -MP -c $< -o $@

$(BUILD)/runtime/cuda/%.o: runtime/cuda/%.c $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(MPICC) $(CUDA_CFLAGS) $(DEPFLAGS) $(CUDA_INC) -Iruntime -Iformat -Iutil -c $< -o $@

# position-independent copies of the runtime pieces the shared object needs
$(BUILD)/runtime/cuda/pic/err.o: runtime/err.c runtime/rt.h format/stepfile.h
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) $(DEPFLAGS) -Iruntime -Iformat -Iutil -c $< -o $@
$(BUILD)/runtime/cuda/pic/%.o: format/%.c format/stepfile.h
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) $(DEPFLAGS) -Iformat -Iutil -c $< -o $@
$(BUILD)/runtime/cuda/pic/%.o: util/%.c util/outfile.h
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) $(DEPFLAGS) -Iutil -c $< -o $@

$(CUDA_SO): $(CUDA_OBJ)
	$(MPICC) -shared -Wl,--no-undefined -Wl,-soname,libdpcuda.so -o $@ $^ $(CUDA_LIBS)

cuda-check: cuda
	BUILD=$(BUILD) bash tests/cuda.sh
