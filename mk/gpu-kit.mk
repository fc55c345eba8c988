# mk/gpu-kit.mk - the GPU kit (included by the top-level Makefile): the first
# run on a GPU machine as one rehearsed command (docs/CUDA.md, "The GPU kit").
#
#   make gpu-kit         build/gpu-kit/: dpc, dpexec and a libdpcuda.so built
#                        with this machine's nvcc for sm_90a (H100) and sm_80,
#                        -lineinfo (objects in build/gpu-kit-cuda/), the
#                        shared libraries a bare CUDA machine lacks, Open MPI
#                        with its components, the models, a token shard, the
#                        PyTorch anchor and run.sh; at most 48 MiB (it prints
#                        its size). On the GPU machine: build/gpu-kit/run.sh OUTDIR
#   make gpu-kit EMU=1   the same kit around the CUDA emulator's libdpcuda.so
#                        (make cuda-emu): the rehearsal tests/gpu_kit.sh runs
#                        in a chroot that holds only bash and coreutils
#
# tools/gpu-kit/build.sh assembles it (what goes in and why: its header);
# it needs patchelf and a static busybox (busybox-static). EMU is this
# file's knob; mk/cuda-emu.mk's folder of the same name is passed to the
# make below by its value, build-emu.

KIT_DIR        := build/gpu-kit
KIT_STAGE      := build/gpu-kit.stage
KIT_CUDA_BUILD := build/gpu-kit-cuda
KIT_CUDA_ARCH  := -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80
KIT_HOST       := build/dpc build/dpexec build/text2shard
KIT_XZ         := -6 # the payload's xz preset (tests/gpu_kit.sh: -0 for its rehearsal kit)

.PHONY: gpu-kit
ifeq ($(EMU),1)
gpu-kit:
	@$(MAKE) --no-print-directory SAN=0 EMU=build-emu $(KIT_HOST) cuda-emu
	XZ_LEVEL=$(KIT_XZ) KIT=$(KIT_DIR) STAGE=$(KIT_STAGE) MODE=emu CUDA_SO=build-emu/libdpcuda.so DPC=build/dpc \
		DPEXEC=build/dpexec TEXT2SHARD=build/text2shard bash tools/gpu-kit/build.sh
else
gpu-kit:
	@test -x "$(NVCC)" || { echo "make gpu-kit: nvcc ($(NVCC)) is needed; make gpu-kit EMU=1 builds the emulator's kit"; exit 1; }
	@$(MAKE) --no-print-directory SAN=0 $(KIT_HOST)
	@# (CUDA_DEVICE_OPT=: the kit runs its code, so nvcc optimises it whatever CI asks)
	@$(MAKE) --no-print-directory SAN=0 BUILD=$(KIT_CUDA_BUILD) CUDA_ARCH="$(KIT_CUDA_ARCH)" CUDA_DEVICE_OPT= \
		$(KIT_CUDA_BUILD)/libdpcuda.so
	XZ_LEVEL=$(KIT_XZ) KIT=$(KIT_DIR) STAGE=$(KIT_STAGE) MODE=gpu CUDA_SO=$(KIT_CUDA_BUILD)/libdpcuda.so DPC=build/dpc \
		DPEXEC=build/dpexec TEXT2SHARD=build/text2shard bash tools/gpu-kit/build.sh
endif
