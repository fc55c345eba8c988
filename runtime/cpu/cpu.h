/*
 * cpu/cpu.h - inside the CPU compute backend: the kernel-table row, the
 * arguments every kernel gets, and the operand-check helpers the kernel
 * files share. Nothing outside runtime/cpu/ includes it; the executor sees
 * the backend only through BackendOps (backend.h).
 *
 * One table, filled by the files that own the kernels. Each concept file
 * (layout.c, elementwise.c, gemm.c, loss.c, optim.c, norm.c, seq.c)
 * defines a partial table of DPK_COUNT rows with designated initialisers,
 * `[DPK_<OP>] = {check_<op>, NULL, run_<op>, 0}`, so an op's check, its run
 * and its row live in one file; backend_cpu.c merges the partial tables
 * into the backend's one table and refuses an op claimed twice. Adding a
 * CPU kernel is one row (and its functions) in the file of its concept.
 *
 * Layout: leading dims fold into rows, a tensor [a, b, c] is a [a*b, c]
 * matrix (cpu_rows / cpu_cols). Kernels trust their operands: the checks
 * ran once at load time (labels and token ids, known only at run time, are
 * checked where they are read).
 */
#ifndef DP_CPU_INT_H
#define DP_CPU_INT_H

#include "../rt.h"

/* Per optimizer step: what the optimizer kernels need beyond their operands. */
typedef struct {
	const DpOptim *opt; /* hyperparameters */
	float lr;           /* learning rate of this optimizer step */
	int64_t t;          /* optimizer step number, from 1 (bias correction, momentum) */
} CpuStep;

/* One kernel call: operands are the tensor ids of `in`, addresses in ptr. */
typedef struct {
	const DpStep *s;
	const DpInstr *in;
	void *const *ptr;
	const CpuStep *step;
} CpuArgs;

typedef int (*CpuCheckFn)(const DpStep *s, const DpInstr *in, RtErr *e);
typedef int (*CpuRunFn)(const CpuArgs *a, RtErr *e);

/* A row of the kernel table (ORDER KERNEL); run == NULL: not this file's. */
typedef struct {
	/* Operand rules (presence, dtype, element counts, no aliasing where the
	 * kernel forbids it), once at load time, so run never reads or writes
	 * outside a tensor. They are generic facts of the op, which the
	 * step-file decoder takes over from the op table; then delete them. */
	CpuCheckFn operands;
	/* This backend's own limits (BLAS takes int sizes); NULL: none. */
	CpuCheckFn limits;
	CpuRunFn run;
	/* 1: computes bf16 operands too (byte copies); else bf16 is refused */
	int bf16;
} CpuKernel;

/* The partial tables, one per concept file. */
extern const CpuKernel cpu_layout_kernels[DPK_COUNT];      /* layout.c */
extern const CpuKernel cpu_elementwise_kernels[DPK_COUNT]; /* elementwise.c */
extern const CpuKernel cpu_gemm_kernels[DPK_COUNT];        /* gemm.c */
extern const CpuKernel cpu_loss_kernels[DPK_COUNT];        /* loss.c */
extern const CpuKernel cpu_optim_kernels[DPK_COUNT];       /* optim.c */
extern const CpuKernel cpu_norm_kernels[DPK_COUNT];        /* norm.c */
extern const CpuKernel cpu_seq_kernels[DPK_COUNT];         /* seq.c */
extern const CpuKernel cpu_cp_kernels[DPK_COUNT];          /* attention_cp.c */

/* ---- shapes ---- */

static inline int64_t cpu_numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}
/* [rows, cols] view: the last dim is cols, the rest fold into rows. */
static inline int64_t cpu_cols(const DpTensor *t) { return t->ndim ? t->dims[t->ndim - 1] : 1; }
static inline int64_t cpu_rows(const DpTensor *t) { return cpu_numel(t) / cpu_cols(t); }

/* Tensor `id`'s table entry, or NULL for -1. */
static inline const DpTensor *cpu_t(const CpuArgs *a, int id)
{
	return id >= 0 ? &a->s->tensors[id] : NULL;
}
/* Its address as f32, or NULL for -1. */
static inline float *cpu_f(const CpuArgs *a, int id) { return id >= 0 ? a->ptr[id] : NULL; }

const char *cpu_tname(const DpStep *s, int id);

/* ---- operand checks (check.c) ---- */

typedef struct {
	const DpStep *s;
	const DpInstr *in;
	RtErr *e;
} CpuChk;

/* "step file: OP instruction (out X, in Y, Z): what"; returns -1. */
int cpu_bad(const CpuChk *c, const char *what);
/* Operand k (-1: out) is present and of dtype dt; NULL (error in c->e) if not. */
const DpTensor *cpu_opnd(const CpuChk *c, int k, DpDtype dt);
int cpu_disjoint(const DpTensor *a, const DpTensor *b);
/* The output is disjoint from every present input. */
int cpu_out_disjoint(const CpuChk *c);
/* Operands 0..nin-1 and the output are f32 and of one element count. */
int cpu_check_same_size(const DpStep *s, const DpInstr *in, int nin, RtErr *e);

#define CPU_NEED(cond, msg)                          \
	do {                                         \
		if (!(cond))                         \
			return cpu_bad(&c, (msg));   \
	} while (0)
#define CPU_OPND(var, k, dt)                           \
	const DpTensor *var = cpu_opnd(&c, (k), (dt)); \
	if (!var)                                      \
	return -1

#endif
