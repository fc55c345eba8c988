/*
 * cpu/optim.c - the CPU kernels of the optimizer step: the squared norm
 * (double accumulation; its tp weight), its square root, clipping
 * (torch.nn.utils.clip_grad_norm_), fp16's unscaling of the gradients
 * (GradScaler.unscale_) and the updates, which follow PyTorch
 * 1.13's single-tensor torch.optim.SGD / AdamW formulas operation for
 * operation; lr and t come from the step (CpuStep).
 */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "../lr_sched.h"

/* The 16-bit compute copy (bf16 or f16: dt) of updated masters, in the
 * same pass (while the piece is in cache): precision bf16 or fp16 reads no
 * weight twice. */
static void write_copy(unsigned dt, uint16_t *copy, const float *p, int64_t n)
{
	if (dt == DP_F16)
		cpu_f16_store(copy, p, n);
	else
		for (int64_t i = 0; i < n; i++)
			copy[i] = cpu_to_bf16(p[i]);
}

/* out[0] = w * sum in0^2 (+ out[0] if acc); w = weight, 0 meaning 1. The sum
 * is in double over blocks of SQ_BLOCK elements added in block order: the
 * same at any thread count. */
#define SQ_BLOCK 65536

typedef struct {
	const CpuVec *vec;
	const float *a;
	int64_t n;
	double *part;
} SqJob;

static void sq_blocks(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const SqJob *j = ctx;
	for (int64_t b = lo; b < hi; b++) {
		int64_t i0 = b * SQ_BLOCK, len = j->n - i0 < SQ_BLOCK ? j->n - i0 : SQ_BLOCK;
		j->part[b] = j->vec->sqsum(j->a + i0, len);
	}
}

static int run_sqnorm(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	float *o = cpu_f(k, in->out);
	SqJob j = {k->vec, cpu_f(k, in->in[0]), cpu_numel(cpu_t(k, in->in[0])), NULL};
	int64_t blocks = (j.n + SQ_BLOCK - 1) / SQ_BLOCK;
	j.part = malloc((size_t)(blocks + 1) * sizeof(double));
	if (!j.part)
		return RT_FAIL(e, "out of memory (norm of %lld elements)", (long long)j.n);
	cpu_parallel(k->pool, blocks, 1, sq_blocks, &j);
	float weight = DP_FATTR(in, SQNORM, weight); /* tp weight, 0 = 1 */
	double sum = 0, w = weight != 0 ? weight : 1.0;
	for (int64_t b = 0; b < blocks; b++)
		sum += j.part[b];
	free(j.part);
	o[0] = (float)((DP_ATTR(in, SQNORM, acc) ? o[0] : 0) + w * sum);
	return 0;
}

static int run_sqrt(const CpuArgs *k, RtErr *e)
{
	cpu_f(k, k->in->out)[0] = sqrtf(cpu_f(k, k->in->in[0])[0]);
	return 0;
}

/* GradScaler.unscale_: grads *= the f32 reciprocal of the scale (computed
 * in double, as PyTorch's scale.double().reciprocal().float()) */
static int run_unscale(const CpuArgs *k, RtErr *e)
{
	float *o = cpu_f(k, k->in->out);
	float inv = (float)(1.0 / (double)k->step->loss_scale);
	cpu_map(k, DP_OP_SCALE, o, o, NULL, inv, cpu_numel(cpu_t(k, k->in->out)));
	return 0;
}

/* This step's AMP_CHECK found an overflow (amp_found NULL: a kernel run
 * outside a backend, as the kernel tests do) */
static int amp_skipped(const CpuArgs *k)
{
	return k->step->amp_found && *k->step->amp_found;
}

/* GradScaler's found_inf: the global norm of the unscaled gradients, the
 * same on every rank, is inf or NaN when any gradient anywhere is (a
 * squared norm above f32's range counts too); the step's CLIP, ADAMW and
 * SGD then do nothing (amp.h) */
static int run_amp_check(const CpuArgs *k, RtErr *e)
{
	*k->step->amp_found = !isfinite(cpu_f(k, k->in->in[0])[0]);
	return 0;
}

/* torch.nn.utils.clip_grad_norm_: scale only when the coefficient is < 1 */
static int run_clip(const CpuArgs *k, RtErr *e)
{
	if (amp_skipped(k))
		return 0;
	float *o = cpu_f(k, k->in->out);
	int64_t n = cpu_numel(cpu_t(k, k->in->out));
	float coef = DP_FATTR(k->in, CLIP, max_norm) / (cpu_f(k, k->in->in[0])[0] + 1e-6f);
	if (coef < 1.0f)
		cpu_map(k, DP_OP_SCALE, o, o, NULL, coef, n);
	return 0;
}

/* torch.optim.SGD (1.13), dampening 0: g += wd*p; buf = g (first step) or
 * momentum*buf + g; p -= lr*buf, or with nesterov (DpOptim's, a setting
 * that needs momentum) p -= lr*(g + momentum*buf) */
static int run_sgd(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	if (amp_skipped(k))
		return 0;
	float *o = cpu_f(k, in->out);
	const float *a = cpu_f(k, in->in[0]);
	int64_t n = cpu_numel(cpu_t(k, in->out));
	float lr = dp_group_lr(k->step->lr, DP_FATTR(in, SGD, lr_scale));
	float mom = DP_FATTR(in, SGD, momentum), wd = DP_FATTR(in, SGD, weight_decay);
	int nesterov = k->step->opt->nesterov != 0;
	float *buf = cpu_f(k, in->in[1]);
	for (int64_t i = 0; i < n; i++) {
		float g = a[i];
		if (wd != 0)
			g = g + wd * o[i];
		if (mom != 0) {
			buf[i] = k->step->t <= 1 ? g : mom * buf[i] + g;
			g = nesterov ? g + mom * buf[i] : buf[i];
		}
		o[i] = o[i] - lr * g;
	}
	if (in->in[2] >= 0) /* the 16-bit compute copy */
		write_copy(cpu_t(k, in->in[2])->dtype, k->ptr[in->in[2]], o, n);
	return 0;
}

/* torch.optim.AdamW (1.13, single tensor): scalars in double as Python
 * computes them, tensor arithmetic in float in the same order (vec.c's
 * adamw), over pieces of the flat buffer on the rank's threads */
typedef struct {
	const CpuVec *vec;
	float *p, *m, *v;
	const float *g;
	uint16_t *copy; /* the 16-bit compute copy (in3), or NULL */
	unsigned copy_dt; /* its dtype */
	CpuAdam c;
} AdamJob;

static void adam_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const AdamJob *j = ctx;
	j->vec->adamw(j->p + lo, j->g + lo, j->m + lo, j->v + lo, hi - lo, &j->c);
	if (j->copy)
		write_copy(j->copy_dt, j->copy + lo, j->p + lo, hi - lo);
}

static int run_adamw(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpOptim *op = k->step->opt;
	if (amp_skipped(k))
		return 0;
	double lr = dp_group_lr(k->step->lr, DP_FATTR(in, ADAMW, lr_scale));
	double b1 = op->beta1, b2 = op->beta2;
	double bc1 = 1.0 - pow(b1, (double)k->step->t), bc2 = 1.0 - pow(b2, (double)k->step->t);
	AdamJob j = {.vec = k->vec, .p = cpu_f(k, in->out), .m = cpu_f(k, in->in[1]),
		     .v = cpu_f(k, in->in[2]), .g = cpu_f(k, in->in[0]),
		     .copy = in->in[3] >= 0 ? k->ptr[in->in[3]] : NULL,
		     .copy_dt = in->in[3] >= 0 ? cpu_t(k, in->in[3])->dtype : 0};
	j.c = (CpuAdam){.decay = (float)(1.0 - lr * DP_FATTR(in, ADAMW, weight_decay)),
			.beta1 = op->beta1,
			.beta2 = op->beta2,
			.one_b1 = (float)(1.0 - b1),
			.one_b2 = (float)(1.0 - b2),
			.bc2_sqrt = (float)sqrt(bc2),
			.step_size = (float)(lr / bc1),
			.eps = op->eps};
	cpu_parallel(k->pool, cpu_numel(cpu_t(k, in->out)), CPU_GRAIN, adam_piece, &j);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
const KernelRow cpu_optim_rows[] = {
	{DP_OP_SQNORM, run_sqnorm, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_SQRT, run_sqrt, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_CLIP, run_clip, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_UNSCALE, run_unscale, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_AMP_CHECK, run_amp_check, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_SGD, run_sgd, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_ADAMW, run_adamw, NULL, 0, NULL, NULL, 0, 0},
	{0},
};
