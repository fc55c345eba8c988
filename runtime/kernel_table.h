/*
 * kernel_table.h - the one row layout of every compute backend's kernel
 * table, and the one merge that builds a table from the rows of a backend's
 * kernel files (TVM's per-target op registry, QBE's one table per target).
 *
 * Each kernel file of a backend owns the ops of one concept and lists their
 * rows, in any order, ended by a row whose run is NULL:
 *     const KernelRow cpu_norm_rows[] = {{DP_OP_LAYERNORM, run_fwd}, ..., {0}};
 * and the backend merges its files into an opcode-indexed KernelTable with
 * kernel_table_merge, which refuses an opcode that is not a compute op
 * (unknown, or the executor's own: collectives, events, LOAD, INIT/SAVE,
 * SHARD) and an op two rows claim. The backend refuses to start when its
 * table says so (KernelTable.err); an op without a row is refused at load by
 * the executor, naming it (exec_check_kernel).
 *
 * A row's functions get the backend's own arguments: `struct KernelArgs` is
 * defined once per backend (CpuArgs in cpu/cpu.h, CuArgs in cuda/kernels.h);
 * no translation unit sees both. The fields that one backend alone reads say
 * so; the other leaves them 0.
 *
 * Header-only (a static inline merge) because the CUDA backend's table is
 * built by C++ (cuda/kernels.cu, nvcc) and the CPU's by C: both compile this
 * same code, and neither build links the other's objects.
 */
#ifndef DP_KERNEL_TABLE_H
#define DP_KERNEL_TABLE_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rt.h"

typedef struct KernelArgs KernelArgs; /* one kernel call: each backend's own */

typedef int (*KernelRunFn)(const KernelArgs *a, RtErr *e);
/* The backend's own limits for one instruction at load (the operand rules
 * are the step-file decoder's). */
typedef int (*KernelLimitsFn)(const DpStep *s, const DpInstr *in, RtErr *e);
typedef size_t (*KernelScratchFn)(const DpStep *s, const DpInstr *in);

typedef struct {
	unsigned op;             /* DP_OP_*, a compute op (DP_OPC_KERNEL) */
	KernelRunFn run;         /* NULL: ends a file's rows; in a table: no kernel */
	KernelLimitsFn limits;   /* NULL: none */
	int bf16;                /* 1: reads and writes bf16 operands itself; 0: a bf16
	                            instruction runs on f32 copies of its operands */
	KernelRunFn run_bf16;    /* CPU: a bf16 instruction's own path, tried first: 0 done,
	                            -1 error, 1 declined (then f32 copies); NULL: none */
	KernelScratchFn scratch; /* CUDA: bytes of its stream's scratch it needs; NULL: the
	                            minimum */
	int blas;                /* CUDA: 1 needs a cuBLASLt handle and workspace on its stream */
	int f16;                 /* 1: reads and writes f16 operands itself (rt_own_half_path);
	                            0: an f16 instruction runs on f32 copies of its operands */
} KernelRow;

typedef struct {
	KernelRow k[DP_NOPS]; /* ORDER OP: k[op].run == NULL: no kernel for op */
	char err[160];        /* "": merged; else why the rows do not make a table */
} KernelTable;

/* t = the rows of files[0..nfiles) (each ended by a row whose run is NULL),
 * indexed by opcode; t->err says what was refused (the first problem). */
static inline void kernel_table_merge(KernelTable *t, const KernelRow *const *files,
				      size_t nfiles)
{
	memset(t, 0, sizeof *t);
	for (size_t f = 0; f < nfiles; f++)
		for (const KernelRow *r = files[f]; r->run; r++) {
			if (r->op >= DP_NOPS) {
				snprintf(t->err, sizeof t->err, "a kernel row for opcode %u, which "
					 "does not exist", r->op);
				return;
			}
			if (dp_op_class(r->op) != DP_OPC_KERNEL) {
				snprintf(t->err, sizeof t->err, "a kernel row for %s, which the "
					 "executor runs itself", dp_op_names[r->op]);
				return;
			}
			if (t->k[r->op].run) {
				snprintf(t->err, sizeof t->err, "two kernel rows for %s",
					 dp_op_names[r->op]);
				return;
			}
			t->k[r->op] = *r;
		}
}

/* The row of op, or NULL when the table has no kernel for it. */
static inline const KernelRow *kernel_row(const KernelTable *t, unsigned op)
{
	return op < DP_NOPS && t->k[op].run ? &t->k[op] : NULL;
}

#endif
