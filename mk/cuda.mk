# mk/cuda.mk - the CUDA backend's build (included by the top-level Makefile).
#
#   make cuda        build/libdpcuda.a (kernels, executor, NCCL comm) and the
#                    GPU test driver build/tests/cuda_smoke
#   make cuda-check  the same, then a no-GPU sanity run (tests/cuda.sh)
#
# `make` (all) builds these too when nvcc exists (CI: /usr/local/cuda), so CI
# proves the CUDA code compiles even where nothing can run it; without nvcc
# `all` is unchanged and dpexec never depends on CUDA. Host code is C11 built
# with the same CFLAGS as the rest (-Wall -Wextra); kernels are nvcc with
# -Xcompiler=-Wall,-Wextra. Both must stay warning-free.
#
# Knobs: NVCC (the Makefile's), CUDA_ARCH (default: sm_80 + sm_90 cubins and
# compute_90 PTX for newer GPUs).

HAVE_NVCC  := $(shell test -x "$(NVCC)" && echo 1)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
# -fmad=false: a*b+c rounds like the CPU reference (no FMA contraction)
NVCCFLAGS  ?= -O2 -lineinfo
NVCCFLAGS  += -std=c++17 -fmad=false $(CUDA_ARCH) -Xcompiler=-Wall,-Wextra
CUDA_INC   := -I$(CUDA_HOME)/include
# cudart static (the nvcc default); cuBLAS and NCCL shared, found by rpath
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lnccl \
              -lcudart_static -lstdc++ -ldl -lrt -lpthread

CUDA_OBJ   := $(BUILD)/runtime/cuda/kernels.o $(BUILD)/runtime/cuda/exec_cuda.o \
              $(BUILD)/runtime/cuda/comm_nccl.o
CUDA_LIB   := $(BUILD)/libdpcuda.a
CUDA_SMOKE := $(BUILD)/tests/cuda_smoke
CUDA_HDRS  := $(wildcard runtime/cuda/*.h) runtime/rt.h runtime/comm.h runtime/exec.h \
              ir/stepfile.h

.PHONY: cuda cuda-check
cuda: $(CUDA_LIB) $(CUDA_SMOKE)

ifeq ($(HAVE_NVCC),1)
ifneq ($(SAN),1)
all: cuda
endif
endif

$(BUILD)/runtime/cuda/%.o: runtime/cuda/%.cu $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iruntime -Iir -MMD -MP -c $< -o $@

$(BUILD)/runtime/cuda/%.o: runtime/cuda/%.c $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(DEPFLAGS) $(CUDA_INC) -Iruntime -Iir -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJ)
	rm -f $@
	ar rcs $@ $^

$(CUDA_SMOKE): $(BUILD)/runtime/cuda/smoke.o $(CUDA_LIB) $(RUNTIME_OBJ)
	@mkdir -p $(dir $@)
	$(MPICC) $(LDFLAGS) -o $@ $^ $(CUDA_LIBS) -lopenblas -lcjson -lz -lm

cuda-check: cuda
	BUILD=$(BUILD) bash tests/cuda.sh
