/*
 * kernels.h - the CUDA backend's kernel table (kernels.cu, compiled by nvcc)
 * as the backend (backend_cuda.c, plain C) sees it: one row per opcode,
 * ORDER KERNEL, holding the op's launcher and what it needs from the
 * backend (a cuBLAS handle on its stream, reduction scratch, its own load
 * limits). An opcode whose row has no launcher is not implemented on CUDA
 * and is refused at load by the executor, naming the op.
 *
 * Every launcher enqueues on the instruction's stream and checks the launch
 * (cudaGetLastError) and every cuBLAS status; nothing here synchronises,
 * allocates or touches host memory, so every launcher is legal inside
 * stream capture.
 *
 * Semantics follow the CPU backend (runtime/cpu/), kernel for kernel: the
 * CPU is the reference. Where the CPU accumulates in double so does the
 * GPU, and every reduction has a fixed shape
 * (fixed grid, fixed tree), so a run is bitwise reproducible and a graph
 * replay equals an eager run. Elementwise kernels are compiled with
 * -fmad=false so a*b+c rounds like the CPU's (gcc -O2 on x86-64 does not
 * contract to FMA).
 */
#ifndef DP_CU_KERNELS_H
#define DP_CU_KERNELS_H

#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../rt.h"

/*
 * Per-step scalars in device memory. The schedule kernel at the head of every
 * optimizer step derives lr and the optimizer's per-step constants from
 * `step`; the tail kernel increments `step`. A captured graph therefore bakes
 * no host value that changes between steps. The err_* fields are the one
 * thing kernels report back (a label out of range); the backend reads them
 * after a step.
 */
typedef struct {
	uint64_t step;          /* optimizer step k, from 0; incremented at the end of a step */
	int64_t t;              /* k + 1: bias correction, momentum's first step */
	float lr;               /* exec_lr(k) rounded to float, as the CPU backend gets it */
	float opt_k[4];         /* the optimizer kernels' per-step constants, derived from
	                           lr and t by the schedule kernel (kernels.cu) */
	int32_t err;            /* 0, or 1: a label out of range (first one wins) */
	int32_t err_label;      /* the offending label */
	int64_t err_row;        /* its row */
	int64_t err_classes;    /* the logits' columns */
} CuScalars;

/* Doubles of the fixed-size reductions' first pass: partial sums. */
#define CU_REDUCE_BLOCKS 256

/* One kernel call: the instruction, device addresses, its stream's resources. */
typedef struct {
	const DpStep *s;
	const DpInstr *in;
	void *const *ptr;     /* device address of every tensor */
	cudaStream_t st;      /* the instruction's stream */
	cublasHandle_t blas;  /* that stream's cuBLAS handle (rows with blas = 1) */
	double *scratch;      /* that stream's reduction scratch */
	CuScalars *sc;        /* device per-step scalars */
} CuArgs;

typedef struct {
	int (*run)(const CuArgs *a, RtErr *e); /* NULL: not implemented on CUDA */
	/* This backend's own limits for the op at load (NULL: none). */
	int (*limits)(const DpStep *s, const DpInstr *in, RtErr *e);
	/* Doubles of scratch the op needs on its stream (NULL: CU_REDUCE_BLOCKS). */
	size_t (*scratch)(const DpStep *s, const DpInstr *in);
	int blas; /* 1: needs a cuBLAS handle on its stream */
} CuKernel;

typedef struct {
	CuKernel k[DPK_COUNT]; /* ORDER KERNEL */
} CuKernelTable;

/* The table (kernels.cu). */
extern const CuKernelTable cu_kernel_table;

/* The schedule kernel (lr and the optimizer's constants of step sc->step,
 * from the step file's schedule), the step counter's increment, and the
 * watchdog's progress mark (*slot = value once the stream gets there; slot
 * is mapped pinned host memory). Each returns the launch's error. */
cudaError_t cu_k_sched(cudaStream_t st, CuScalars *sc, DpOptim opt, DpSched sched,
		       uint32_t cfg_steps);
cudaError_t cu_k_step_advance(cudaStream_t st, CuScalars *sc);
cudaError_t cu_k_mark(cudaStream_t st, volatile int64_t *slot, int64_t value);

#ifdef __cplusplus
}
#endif

#endif
