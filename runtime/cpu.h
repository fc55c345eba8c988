/*
 * cpu.h - the CPU compute backend: every compute kernel of DP_KERNELS on
 * host memory (OpenBLAS sgemm for MATMUL, LINEAR and ATTENTION, plain C elsewhere).
 *
 * The executor owns memory and streams; this backend only computes. LOAD,
 * collectives (TP_REDUCE included), events, INIT, SAVE and SHARD are the
 * executor's (cpu_run refuses them).
 */
#ifndef DP_CPU_H
#define DP_CPU_H

#include "rt.h"

/* What an instruction needs from the executor beyond its operands. */
typedef struct {
	const DpOptim *opt; /* optimizer hyperparameters (ADAMW) */
	float lr;           /* learning rate of this optimizer step */
	int64_t t;          /* optimizer step number, counted from 1 (bias correction, momentum) */
} CpuCtx;

/* Is op a kernel this backend runs (not one of the executor's, above)? */
int cpu_is_compute(unsigned op);
/* Check the operands of a compute instruction against the tensor table
 * (presence, dtype, element counts, no aliasing where a kernel forbids it),
 * once at load time, so cpu_run never reads or writes outside a tensor. */
int cpu_check(const DpStep *s, const DpInstr *in, RtErr *e);
/* Run one checked compute instruction; ptr[i] is the address of tensor i. */
int cpu_run(const DpStep *s, const DpInstr *in, void *const *ptr, const CpuCtx *ctx, RtErr *e);
/* OpenBLAS threads; 1 when several ranks share a node (avoids oversubscription). */
void cpu_set_threads(int n);

#endif
