/*
 * cpu/loss.c - the CPU kernels of the classification loss: cross entropy
 * (its sum over rows, times its scale), its gradient, both at once with the
 * gradient written over the logits (cross_entropy_fused, passes/fuse.c), and
 * the count of correct argmax predictions. Rows with a negative label are padding
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
 * count. The fused kernel runs the loss's sweeps and then the gradient's on
 * the row it holds, in the same order, and writes the gradient over it:
 * bitwise the two kernels' results.
 */
#define XENT_BLOCK 64

typedef struct {
	const CpuVec *vec;
	unsigned op;
	const float *x;
	const int32_t *y;
	float *out; /* the gradient (cross_entropy_grad; the logits, cross_entropy_fused) */
	int64_t rows, classes;
	double scale, gscale; /* the loss's and the gradient's (times fp16's loss scale) */
	double *part; /* per block: loss sum, or correct and counted (CORRECT) */
	/* bf16 logits (x16) and gradient (out16), NULL when f32: each row goes
	 * through this thread's two f32 rows of `row` (2 * classes floats per
	 * thread), so no f32 copy of the logits exists (GPT-2's are 0.8 GB) */
	const uint16_t *x16;
	uint16_t *out16;
	float *row;
	int64_t ldx, ldo; /* row strides of the logits and the gradient: classes, or more
	                     (padded rows, passes/padvocab.c: the logits' padding is never
	                     read; the gradient's is written zero, which a GEMM over the
	                     padded k reads on CUDA) */
} Xent;

static void xent_blocks(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Xent *j = ctx;
	const CpuVec *v = j->vec;
	int64_t nc = j->classes;
	for (int64_t blk = lo; blk < hi; blk++) {
		int64_t r1 = (blk + 1) * XENT_BLOCK < j->rows ? (blk + 1) * XENT_BLOCK : j->rows;
		double total = 0, right = 0, counted = 0;
		float *buf = j->row ? j->row + (int64_t)thread * 2 * nc : NULL;
		for (int64_t r = blk * XENT_BLOCK; r < r1; r++) {
			const float *row = j->x ? j->x + r * j->ldx : buf;
			int32_t label = j->y[r];
			if (j->x16)
				for (int64_t c = 0; c < nc; c++)
					buf[c] = cpu_from_bf16(j->x16[r * j->ldx + c]);
			if (j->op == DP_OP_XENT_FUSED && label >= 0) {
				float mx = v->max(row, nc);
				total += log(v->exp_sum_d(row, mx, nc)) + mx - row[label];
			}
			if (j->op == DP_OP_XENT_GRAD || j->op == DP_OP_XENT_FUSED) {
				float *d = j->out16 ? buf + nc : j->out + r * j->ldo; /* row itself: fused f32 */
				if (label < 0) {
					memset(d, 0, (size_t)nc * sizeof(float));
				} else {
					double sum = v->exp_shift(d, row, v->max(row, nc), nc);
					double el = d[label];
					v->map(DP_OP_SCALE, d, d, NULL, (float)(j->gscale / sum), nc);
					d[label] = (float)(j->gscale * (el / sum - 1.0));
				}
				if (j->out16)
					for (int64_t c = 0; c < nc; c++)
						j->out16[r * j->ldo + c] = cpu_to_bf16(d[c]);
				if (j->ldo > nc) /* padding columns: zero, for a padded k (pad_rows) */
					memset(j->out16 ? (void *)(j->out16 + r * j->ldo + nc)
							: (void *)(j->out + r * j->ldo + nc),
					       0, (size_t)(j->ldo - nc) * (j->out16 ? 2 : 4));
				continue;
			}
			if (label < 0)
				continue;
			float mx = v->max(row, nc);
			if (j->op == DP_OP_CORRECT) {
				int64_t best = 0;
				while (best < nc - 1 && !(row[best] == mx))
					best++;
				right += best == label;
				counted += 1;
				continue;
			}
			total += log(v->exp_sum_d(row, mx, nc)) + mx - row[label]; /* -log p(label) */
		}
		j->part[2 * blk] = j->op == DP_OP_CORRECT ? right : total;
		j->part[2 * blk + 1] = counted;
	}
}

/* A label >= classes is a run-time error (labels come from data). */
static int xent(const CpuArgs *k, RtErr *e)
{
	const DpStep *s = k->s;
	const DpInstr *in = k->in;
	double scale = in->op == DP_OP_CORRECT ? 0.0 : DP_FATTR(in, XENT, scale), gscale = scale;
	if ((in->op == DP_OP_XENT_GRAD || in->op == DP_OP_XENT_FUSED) &&
	    DP_ATTR(in, XENT_GRAD, loss_scale))
		gscale *= k->step->loss_scale; /* a power of 2 here: exact */
	/* the gradient's tensor: the out of cross_entropy_grad, the logits
	 * themselves (in place) for cross_entropy_fused */
	int gid = in->op == DP_OP_XENT_FUSED ? in->in[0] : in->out;
	const DpTensor *t0 = cpu_t(k, in->in[0]), *to = cpu_t(k, gid);
	int b16 = t0->dtype == DP_BF16, o16 = to->dtype == DP_BF16;
	Xent j = {k->vec, in->op, b16 ? NULL : cpu_f(k, in->in[0]), k->ptr[in->in[1]],
		  o16 ? NULL : cpu_f(k, gid), cpu_rows(t0), cpu_cols(t0), scale, gscale, NULL,
		  b16 ? k->ptr[in->in[0]] : NULL, o16 ? k->ptr[gid] : NULL, NULL, dp_ld(t0),
		  dp_ld(to)};
	for (int64_t r = 0; r < j.rows; r++)
		if (j.y[r] >= j.classes)
			return RT_FAIL(e, "label %d of row %lld is out of range for %lld classes (%s)",
				       j.y[r], (long long)r, (long long)j.classes, cpu_tname(s, in->in[1]));
	int64_t blocks = (j.rows + XENT_BLOCK - 1) / XENT_BLOCK;
	j.part = malloc((size_t)(2 * blocks + 1) * sizeof(double));
	if (b16 || o16)
		j.row = malloc((size_t)cpu_pool_size(k->pool) * 2 * (size_t)j.classes * sizeof(float));
	if (!j.part || ((b16 || o16) && !j.row)) {
		free(j.part);
		return RT_FAIL(e, "out of memory (cross entropy of %lld rows)", (long long)j.rows);
	}
	cpu_parallel(k->pool, blocks, (CPU_GRAIN + XENT_BLOCK * j.classes - 1) / (XENT_BLOCK * j.classes),
		     xent_blocks, &j);
	double total = 0, counted = 0;
	for (int64_t b = 0; b < blocks; b++) {
		total += j.part[2 * b];
		counted += j.part[2 * b + 1];
	}
	free(j.part);
	free(j.row);
	float *o = cpu_f(k, in->out);
	if (in->op == DP_OP_XENT || in->op == DP_OP_XENT_FUSED)
		o[0] = (float)(j.scale * total);
	else if (in->op == DP_OP_CORRECT)
		o[0] = (float)total, o[1] = (float)counted;
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas}: kernel_table.h (bf16
 * logits and their gradient row by row: no f32 copy of the logits) */
const KernelRow cpu_loss_rows[] = {
	{DP_OP_XENT, xent, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_XENT_GRAD, xent, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_CORRECT, xent, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_XENT_FUSED, xent, NULL, 1, NULL, NULL, 0, 0},
	{0},
};
