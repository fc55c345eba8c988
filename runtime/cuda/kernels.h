/*
 * kernels.h - the CUDA kernels of the CUDA backend, as C-callable launchers
 * (kernels.cu, compiled by nvcc; called from exec_cuda.c, compiled by gcc).
 *
 * Every launcher enqueues on the given stream and returns the launch's
 * cudaError_t (cudaGetLastError after the launch), so the executor can wrap
 * each one like any other CUDA call. Nothing here synchronises, allocates or
 * reads host memory: every launcher is legal inside stream capture.
 *
 * Semantics follow runtime/cpu.c, kernel for kernel: the CPU backend is the
 * reference. Where the CPU accumulates in double (cross entropy, sqnorm,
 * bias_grad) so do these, and every reduction has a fixed shape (fixed grid,
 * fixed tree), so a run is bitwise reproducible and a graph replay equals an
 * eager run. Elementwise kernels are compiled with -fmad=false so a*b+c rounds
 * like the CPU's (gcc -O2 on x86-64 does not contract to FMA).
 */
#ifndef DP_CU_KERNELS_H
#define DP_CU_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "../../ir/stepfile.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Per-step scalars in device memory. The schedule kernel at the head of every
 * optimizer step derives lr and the optimizer's per-step constants from
 * `step`; the tail kernel increments `step`. A captured graph therefore bakes
 * no host value that changes between steps. The err_* fields are the one
 * thing kernels report back (a label out of range); the executor reads them
 * after a step.
 */
typedef struct {
	uint64_t step;          /* optimizer step k, from 0; incremented at the end of a step */
	int64_t t;              /* k + 1: bias correction, SGD's first-step rule */
	float lr;               /* schedule_lr(k) rounded to float, as dpexec hands the CPU */
	float adam_decay;       /* (float)(1 - lr * weight_decay) */
	float adam_step_size;   /* (float)(lr / (1 - beta1^t)) */
	float adam_bc2_sqrt;    /* (float)sqrt(1 - beta2^t) */
	int32_t err;            /* 0, or 1: a label out of range (first one wins) */
	int32_t err_label;      /* the offending label */
	int64_t err_row;        /* its row */
	int64_t err_classes;    /* the logits' columns */
} CuScalars;

/* Rows of the fixed-size reductions' first pass (sqnorm): partial sums. */
#define CU_REDUCE_BLOCKS 256

cudaError_t cu_k_sched(cudaStream_t st, CuScalars *sc, DpOptim opt, DpSched sched,
		       uint32_t cfg_steps);
cudaError_t cu_k_step_advance(cudaStream_t st, CuScalars *sc);

cudaError_t cu_k_fill_f32(cudaStream_t st, float *o, int64_t n, float v);
cudaError_t cu_k_fill_i32(cudaStream_t st, int32_t *o, int64_t n, int32_t v);
/* op: DPK_ACCUM, SCALE, ADD, MUL, RELU, RELU_GRAD, GELU, GELU_GRAD, TANH, TANH_GRAD */
cudaError_t cu_k_elementwise(cudaStream_t st, int op, float *o, const float *a, const float *b,
			     int64_t n, float fa0);
cudaError_t cu_k_bias_add(cudaStream_t st, float *o, const float *a, const float *bias,
			  int64_t n, int64_t c);
/* o[r, :] = bias for every row (LINEAR's beta = 1 start) */
cudaError_t cu_k_bias_rows(cudaStream_t st, float *o, const float *bias, int64_t rows,
			   int64_t cols);
cudaError_t cu_k_bias_grad(cudaStream_t st, float *o, const float *a, int64_t rows, int64_t c,
			   int accumulate);
/*
 * Cross entropy family (op DPK_XENT, XENT_GRAD, CORRECT). scratch holds
 * 2 * rows doubles (per-row values, then the single-block sum reads them).
 */
cudaError_t cu_k_xent(cudaStream_t st, int op, float *o, const float *x, const int32_t *y,
		      int64_t rows, int64_t classes, float scale, double *scratch, CuScalars *sc);
/* o[0] = w * sum a^2 (+ o[0] if accumulate); scratch: CU_REDUCE_BLOCKS doubles */
cudaError_t cu_k_sqnorm(cudaStream_t st, float *o, const float *a, int64_t n, int accumulate,
			float w, double *scratch);
cudaError_t cu_k_sqrt(cudaStream_t st, float *o, const float *a);
cudaError_t cu_k_clip(cudaStream_t st, float *o, int64_t n, const float *norm, float max_norm);
cudaError_t cu_k_sgd(cudaStream_t st, float *p, const float *g, float *buf, int64_t n,
		     float momentum, float weight_decay, const CuScalars *sc);
cudaError_t cu_k_adamw(cudaStream_t st, float *p, const float *g, float *m, float *v, int64_t n,
		       float beta1, float beta2, float eps, const CuScalars *sc);
/* The watchdog's progress mark: *slot = value once the stream gets here
 * (slot is mapped pinned host memory). */
cudaError_t cu_k_mark(cudaStream_t st, volatile int64_t *slot, int64_t value);

#ifdef __cplusplus
}
#endif

#endif
