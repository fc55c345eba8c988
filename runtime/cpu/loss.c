/*
 * cpu/loss.c - the CPU kernels of the classification loss: cross entropy
 * (its sum over rows, scaled by fa0), its gradient, and the count of
 * correct argmax predictions. Rows with a negative label are padding
 * (eval's last batch) and count for nothing. The sum of exponentials and the
 * loss sum are in double, so finite differences (--check-grads) and cross-rank
 * comparisons are not drowned in float32 summation noise.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/*
 * The three kernels share the row walk, one pass over the logits: a row is
 * read from memory once and its sweeps (max, exp and sum, the scaled
 * gradient) run while it sits in L1. The loss uses exp in double (as
 * before: --check-grads differences the loss); the gradient exp(x - max)
 * in float, its sum in double, and the label's entry p - 1 in double (no
 * cancellation against 1). Rows go to the threads in blocks of XENT_BLOCK
 * whose partial sums are added in block order: the same loss at any thread
 * count.
 */
#define XENT_BLOCK 64

typedef struct {
	const CpuVec *vec;
	unsigned op;
	const float *x;
	const int32_t *y;
	float *out;
	int64_t rows, classes;
	double scale;
	double *part; /* per block: loss sum, or correct and counted (CORRECT) */
} Xent;

static void xent_blocks(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Xent *j = ctx;
	const CpuVec *v = j->vec;
	int64_t nc = j->classes;
	for (int64_t blk = lo; blk < hi; blk++) {
		int64_t r1 = (blk + 1) * XENT_BLOCK < j->rows ? (blk + 1) * XENT_BLOCK : j->rows;
		double total = 0, right = 0, counted = 0;
		for (int64_t r = blk * XENT_BLOCK; r < r1; r++) {
			const float *row = j->x + r * nc;
			int32_t label = j->y[r];
			if (j->op == DPK_XENT_GRAD) {
				float *d = j->out + r * nc;
				if (label < 0) {
					memset(d, 0, (size_t)nc * sizeof(float));
					continue;
				}
				double sum = v->exp_shift(d, row, v->max(row, nc), nc);
				double el = d[label];
				v->map(DPK_SCALE, d, d, NULL, (float)(j->scale / sum), nc);
				d[label] = (float)(j->scale * (el / sum - 1.0));
				continue;
			}
			if (label < 0)
				continue;
			float mx = v->max(row, nc);
			if (j->op == DPK_CORRECT) {
				int64_t best = 0;
				while (best < nc - 1 && !(row[best] == mx))
					best++;
				right += best == label;
				counted += 1;
				continue;
			}
			total += log(v->exp_sum_d(row, mx, nc)) + mx - row[label]; /* -log p(label) */
		}
		j->part[2 * blk] = j->op == DPK_CORRECT ? right : total;
		j->part[2 * blk + 1] = counted;
	}
}

/* A label >= classes is a run-time error (labels come from data). */
static int xent(const CpuArgs *k, RtErr *e)
{
	const DpStep *s = k->s;
	const DpInstr *in = k->in;
	const DpTensor *t0 = cpu_t(k, in->in[0]);
	Xent j = {k->vec, in->op, cpu_f(k, in->in[0]), k->ptr[in->in[1]], cpu_f(k, in->out),
		  cpu_rows(t0), cpu_cols(t0), in->fa[0], NULL};
	for (int64_t r = 0; r < j.rows; r++)
		if (j.y[r] >= j.classes)
			return RT_FAIL(e, "label %d of row %lld is out of range for %lld classes (%s)",
				       j.y[r], (long long)r, (long long)j.classes, cpu_tname(s, in->in[1]));
	int64_t blocks = (j.rows + XENT_BLOCK - 1) / XENT_BLOCK;
	j.part = malloc((size_t)(2 * blocks + 1) * sizeof(double));
	if (!j.part)
		return RT_FAIL(e, "out of memory (cross entropy of %lld rows)", (long long)j.rows);
	cpu_parallel(k->pool, blocks, (CPU_GRAIN + XENT_BLOCK * j.classes - 1) / (XENT_BLOCK * j.classes),
		     xent_blocks, &j);
	double total = 0, counted = 0;
	for (int64_t b = 0; b < blocks; b++) {
		total += j.part[2 * b];
		counted += j.part[2 * b + 1];
	}
	free(j.part);
	if (in->op == DPK_XENT)
		j.out[0] = (float)(j.scale * total);
	else if (in->op == DPK_CORRECT)
		j.out[0] = (float)total, j.out[1] = (float)counted;
	return 0;
}

/* ORDER KERNEL (designated): limits, run, bf16 */
const CpuKernel cpu_loss_kernels[DPK_COUNT] = {
	[DPK_XENT] = {NULL, xent, 0},
	[DPK_XENT_GRAD] = {NULL, xent, 0},
	[DPK_CORRECT] = {NULL, xent, 0},
};
