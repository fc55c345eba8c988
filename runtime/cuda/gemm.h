/*
 * gemm.h - choosing each GEMM's cuBLASLt algorithm by timing (dpexec
 * --gemm-tune): what the backend (backend_cuda.c) tells gemm.cu's tuner
 * and what it hears back. The rules (when, which memory, determinism
 * across runs and ranks, refusals, the cache file) are gemm.cu's, in its
 * header's section "Tuning"; docs/CUDA.md has the figures.
 */
#ifndef DP_CUDA_GEMM_H
#define DP_CUDA_GEMM_H

#include "kernels.h"

enum {
	CU_TUNE_OFF, /* the heuristic's first algorithm (the default) */
	CU_TUNE_ON,  /* the fastest of the heuristic's candidates, timed at load */
};

typedef struct {
	int mode;              /* CU_TUNE_* */
	const char *file;      /* NULL, or the cache file (read, and written by rank 0
	                          when it timed something new) */
	int rank, world;       /* rank 0 times; the others take its choices */
	cudaStream_t st[DP_NSTREAM]; /* each GEMM is timed on its own stream ... */
	void *ws[DP_NSTREAM];        /* ... with that stream's workspace */
	/* *all = 1 when ok on every rank of the job, else 0 (world > 1) */
	int (*all_ok)(void *ctx, int ok, int *all, RtErr *e);
	void *ctx;
	char summary[320];     /* out: one line for dpexec's device line ("" when off) */
} CuTune;

#ifdef __cplusplus
extern "C" {
#endif

/* After cu_plan_gemm (before any capture): each distinct GEMM's algorithm
 * chosen as t says, in every plan entry that has it. Collective over the
 * job when t->world > 1 and tuning is on: every rank calls it, also one
 * whose cu_plan_gemm failed (plan_rc, returned unchanged), so that no
 * rank waits alone. */
int cu_tune_gemm(CuPlan *p, CuTune *t, int plan_rc, RtErr *e);

#ifdef __cplusplus
}
#endif

#endif
