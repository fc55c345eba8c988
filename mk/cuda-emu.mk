# mk/cuda-emu.mk - the CUDA emulator build (included by the top-level Makefile).
#
#   make cuda-emu    build-emu/dpexec and build-emu/libdpcuda.so: the REAL
#                    runtime/cuda sources (every .cu compiled as host C++,
#                    backend_cuda.c, comm_nccl.c) built against the emulator's
#                    headers and linked with its implementation
#                    (tests/cuda_emu/), so `build-emu/dpexec --device cuda`
#                    runs the CUDA backend on the CPU. Test code: never
#                    shipped, never installed. docs/CUDA-EMU.md.
#
# build-emu/dpexec is a copy of the ordinary (non-sanitized) build/dpexec:
# dpexec loads the libdpcuda.so beside it, so the copy picks the emulated
# backend. The emulator needs no nvcc. Only the source rewrite below touches
# runtime/cuda code on its way in: `extern __shared__ T name[];` (dynamic
# shared memory) becomes a pointer to the launch's dynamic region, because
# C++ has no declaration that means "this launch's shared memory"; a #line
# keeps every message pointing at the real runtime/cuda/*.cu file.
#
# The .cu files are compiled with -fsanitize=alignment (the emulator's handler
# reports a misaligned float4 access with the emulated thread) and
# -ffp-contract=off (nvcc's -fmad=false: no fused multiply-adds).

EMU        := build-emu
EMU_INC    := -Itests/cuda_emu/include
MPICXX     ?= mpicxx
# EMU_OPT: the optimisation and debug flags. No -g by default: nothing reads
# the emulated build's debug information (its FATAL backtraces use the
# dynamic symbols, -fsanitize=alignment its own source locations), and it
# is ~15% of the compile (attention.cu: 26.2 CPU-s with -g, 22.4 without);
# EMU_OPT='-O2 -g' for gdb
EMU_OPT    ?= -O2
# DPEMU_MUTANTS: runtime/cuda/mutant.h's mutation points, chosen at run time by
# DPEMU_MUTANT (tests/cuda_emu_mutations.sh); the real build compiles none
EMU_CXXFLAGS := -std=c++17 $(EMU_OPT) -fPIC -fvisibility=hidden -D_GNU_SOURCE -DDPEMU_MUTANTS -Wall -Wextra \
                -Wno-unused-parameter -ffp-contract=off -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1
EMU_CFLAGS := $(EMU_OPT) -std=c11 -D_GNU_SOURCE -DDPEMU_MUTANTS -Wall -Wextra -Wno-unused-parameter -fPIC \
              -fvisibility=hidden
EMU_HDRS   := $(wildcard tests/cuda_emu/*.h tests/cuda_emu/include/*.h)
EMU_LIB_OBJ := $(patsubst tests/cuda_emu/%.cc,$(EMU)/emu/%.o,$(wildcard tests/cuda_emu/*.cc)) \
               $(EMU)/emu/switch.o
EMU_CU     := $(notdir $(basename $(wildcard runtime/cuda/*.cu)))
EMU_CUDA_OBJ := $(patsubst %,$(EMU)/runtime/cuda/%.o,$(EMU_CU)) $(EMU)/runtime/cuda/backend_cuda.o \
                $(EMU)/runtime/cuda/comm_nccl.o $(EMU)/pic/err.o \
                $(patsubst %.c,$(EMU)/pic/%.o,$(notdir $(CUDA_PIC_SRC))) # mk/cuda.mk's list
EMU_RT_HDRS := $(wildcard runtime/cuda/*.h) runtime/rt.h runtime/comm.h runtime/backend.h \
               $(FORMAT_HDRS)

.PHONY: cuda-emu
cuda-emu: $(EMU)/libdpcuda.so $(EMU)/dpexec

# the ordinary dpexec, built without sanitizers whatever SAN says
$(EMU)/dpexec: FORCE
	@$(MAKE) --no-print-directory SAN=0 build/dpexec
	@mkdir -p $(EMU)
	@cmp -s build/dpexec $@ || cp build/dpexec $@
.PHONY: FORCE
FORCE:

# extern __shared__ [__align__(N)] TYPE NAME[];  ->  static TYPE *const NAME = (TYPE *)dpemu_dyn_smem();
EMU_DYN_SMEM := s/extern[[:space:]]+__shared__[[:space:]]+(__align__\([0-9]+\)[[:space:]]+)?([A-Za-z_][A-Za-z_0-9:]*([[:space:]]+[A-Za-z_][A-Za-z_0-9:]*)*)[[:space:]]+([A-Za-z_][A-Za-z_0-9]*)[[:space:]]*\[\][[:space:]]*;/static \2 *const \4 = (\2 *)dpemu_dyn_smem();/

# every runtime/cuda/*.cu, as host C++
$(EMU)/gen/%.cu: runtime/cuda/%.cu mk/cuda-emu.mk
	@mkdir -p $(dir $@)
	{ echo '#line 1 "runtime/cuda/$*.cu"'; \
	  sed -E "$(EMU_DYN_SMEM)" $<; \
	} >$@

$(EMU)/runtime/cuda/%.o: $(EMU)/gen/%.cu $(EMU_RT_HDRS) $(EMU_HDRS) $(wildcard runtime/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(MPICXX) -x c++ $(EMU_CXXFLAGS) -fsanitize=alignment -fno-sanitize-recover=alignment \
		-include tests/cuda_emu/include/dpemu_device.h $(EMU_INC) -Iruntime/cuda -Iruntime -Iformat -Iutil \
		-c $< -o $@

$(EMU)/runtime/cuda/%.o: runtime/cuda/%.c $(EMU_RT_HDRS) $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(MPICC) $(EMU_CFLAGS) $(EMU_INC) -Iruntime -Iformat -Iutil -c $< -o $@

# (the step-file structs are expanded from the tables FORMAT_HDRS lists: a
# copy built before a settings.def row was added reads DpStep wrongly)
$(EMU)/pic/err.o: runtime/err.c runtime/rt.h $(FORMAT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -Iruntime -Iformat -Iutil -c $< -o $@
$(EMU)/pic/%.o: format/%.c $(FORMAT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -Iformat -Iutil -c $< -o $@
$(EMU)/pic/%.o: util/%.c util/outfile.h
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -Iutil -c $< -o $@

$(EMU)/emu/%.o: tests/cuda_emu/%.cc $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(MPICXX) $(EMU_CXXFLAGS) -c $< -o $@
$(EMU)/emu/switch.o: tests/cuda_emu/switch.S
	@mkdir -p $(dir $@)
	$(CC) -c $< -o $@

$(EMU)/libdpcuda.so: $(EMU_CUDA_OBJ) $(EMU_LIB_OBJ)
	$(MPICXX) -shared -Wl,--no-undefined -Wl,-soname,libdpcuda.so -o $@ $^ -lopenblas -lz -lm -ldl

# the emulator's own tests (tests/cuda_emu/selftest.cu), built like runtime/cuda/*.cu
cuda-emu: $(EMU)/selftest
$(EMU)/gen/selftest.cu: tests/cuda_emu/selftest.cu mk/cuda-emu.mk
	@mkdir -p $(dir $@)
	{ echo '#line 1 "tests/cuda_emu/selftest.cu"'; sed -E "$(EMU_DYN_SMEM)" $<; } >$@
$(EMU)/selftest.o: $(EMU)/gen/selftest.cu $(EMU_HDRS)
	$(MPICXX) -x c++ $(EMU_CXXFLAGS) -fsanitize=alignment -fno-sanitize-recover=alignment \
		-include tests/cuda_emu/include/dpemu_device.h $(EMU_INC) -c $< -o $@
$(EMU)/selftest: $(EMU)/selftest.o $(EMU_LIB_OBJ)
	$(MPICXX) -o $@ $^ -lopenblas -lm -ldl
