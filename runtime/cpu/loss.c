/*
 * cpu/loss.c - the CPU kernels of the classification loss: cross entropy
 * (its sum over rows, scaled by fa0), its gradient, and the count of
 * correct argmax predictions. Rows with a negative label are padding
 * (eval's last batch) and count for nothing. The sum of exponentials and the
 * loss sum are in double, so finite differences (--check-grads) and cross-rank
 * comparisons are not drowned in float32 summation noise.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

/* in0 = logits [rows, classes] f32, in1 = labels [rows] i32 */
static int check_xent(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(x, 0, DP_F32);
	CPU_OPND(y, 1, DP_I32);
	CPU_NEED(cpu_numel(y) == cpu_rows(x), "labels and logits rows differ");
	if (in->op == DPK_XENT_GRAD)
		CPU_NEED(cpu_numel(o) == cpu_numel(x), "output and logits differ in size");
	else
		CPU_NEED(cpu_numel(o) >= (in->op == DPK_CORRECT ? 2 : 1), "output too small");
	return 0;
}

/* The three kernels share the row walk; a label >= classes is a run-time
 * error (labels come from data). */
static int xent(const CpuArgs *k, RtErr *e)
{
	const DpStep *s = k->s;
	const DpInstr *in = k->in;
	const DpTensor *t0 = cpu_t(k, in->in[0]);
	const float *x = cpu_f(k, in->in[0]);
	const int32_t *y = k->ptr[in->in[1]];
	float *out = cpu_f(k, in->out);
	int64_t rows = cpu_rows(t0), classes = cpu_cols(t0);
	double total = 0;
	double scale = in->fa[0];
	if (in->op == DPK_CORRECT)
		out[0] = out[1] = 0;
	for (int64_t r = 0; r < rows; r++) {
		const float *row = x + r * classes;
		int32_t label = y[r];
		if (label >= classes)
			return RT_FAIL(e, "label %d of row %lld is out of range for %lld classes (%s)",
				       label, (long long)r, (long long)classes, cpu_tname(s, in->in[1]));
		if (in->op == DPK_CORRECT) {
			if (label < 0)
				continue;
			int64_t best = 0;
			for (int64_t j = 1; j < classes; j++)
				if (row[j] > row[best])
					best = j;
			out[0] += best == label;
			out[1] += 1;
			continue;
		}
		if (label < 0) {
			if (in->op == DPK_XENT_GRAD)
				memset(out + r * classes, 0, (size_t)classes * sizeof(float));
			continue;
		}
		float mx = row[0];
		for (int64_t j = 1; j < classes; j++)
			mx = row[j] > mx ? row[j] : mx;
		double sum = 0;
		for (int64_t j = 0; j < classes; j++)
			sum += exp((double)row[j] - mx);
		if (in->op == DPK_XENT) {
			total += log(sum) + mx - row[label]; /* -log p(label) */
		} else {
			float *d = out + r * classes;
			for (int64_t j = 0; j < classes; j++)
				d[j] = (float)(scale * (exp((double)row[j] - mx) / sum - (j == label)));
		}
	}
	if (in->op == DPK_XENT)
		out[0] = (float)(scale * total);
	return 0;
}

/* ORDER KERNEL (designated): operands, limits, run, bf16 */
const CpuKernel cpu_loss_kernels[DPK_COUNT] = {
	[DPK_XENT] = {check_xent, NULL, xent, 0},
	[DPK_XENT_GRAD] = {check_xent, NULL, xent, 0},
	[DPK_CORRECT] = {check_xent, NULL, xent, 0},
};
