/*
 * cpu/optim.c - the CPU kernels of the optimizer step: the squared norm
 * (double accumulation; tp weight fa0), its square root, clipping
 * (torch.nn.utils.clip_grad_norm_) and the updates, which follow PyTorch
 * 1.13's single-tensor torch.optim.SGD / AdamW formulas operation for
 * operation; lr and t come from the step (CpuStep).
 */
#include <math.h>

#include "cpu.h"

static int check_reduce(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(a, 0, DP_F32);
	(void)o;
	(void)a;
	return 0;
}

/* out[0] = w * sum in0^2 (+ out[0] if ia2); w = fa0, 0 meaning 1 */
static int run_sqnorm(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	float *o = cpu_f(k, in->out);
	const float *a = cpu_f(k, in->in[0]);
	int64_t m = cpu_numel(cpu_t(k, in->in[0]));
	double sum = 0, w = in->fa[0] != 0 ? in->fa[0] : 1.0; /* tp weight, 0 = 1 */
	for (int64_t i = 0; i < m; i++)
		sum += (double)a[i] * a[i];
	o[0] = (float)((in->ia[2] ? o[0] : 0) + w * sum);
	return 0;
}

static int run_sqrt(const CpuArgs *k, RtErr *e)
{
	cpu_f(k, k->in->out)[0] = sqrtf(cpu_f(k, k->in->in[0])[0]);
	return 0;
}

static int check_clip(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(a, 0, DP_F32);
	CPU_NEED(cpu_disjoint(o, a), "the norm lies inside the clipped buffer");
	return 0;
}

/* torch.nn.utils.clip_grad_norm_: scale only when the coefficient is < 1 */
static int run_clip(const CpuArgs *k, RtErr *e)
{
	float *o = cpu_f(k, k->in->out);
	int64_t n = cpu_numel(cpu_t(k, k->in->out));
	float coef = k->in->fa[0] / (cpu_f(k, k->in->in[0])[0] + 1e-6f);
	if (coef < 1.0f)
		for (int64_t i = 0; i < n; i++)
			o[i] *= coef;
	return 0;
}

/* in0 = grads, out = params, in1 = momentum buffer (-1: none) */
static int check_sgd(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(p, -1, DP_F32);
	CPU_OPND(g, 0, DP_F32);
	CPU_NEED(cpu_numel(p) == cpu_numel(g), "params and grads differ in size");
	if (in->in[1] >= 0) {
		CPU_OPND(m, 1, DP_F32);
		CPU_NEED(cpu_numel(m) == cpu_numel(p), "momentum buffer differs in size");
	} else {
		CPU_NEED(in->fa[0] == 0, "momentum without a momentum buffer");
	}
	return 0;
}

/* torch.optim.SGD (1.13), dampening 0, nesterov off:
 * g += wd*p; buf = g (first step) or momentum*buf + g; p -= lr*buf */
static int run_sgd(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	float *o = cpu_f(k, in->out);
	const float *a = cpu_f(k, in->in[0]);
	int64_t n = cpu_numel(cpu_t(k, in->out));
	float lr = k->step->lr, mom = in->fa[0], wd = in->fa[1];
	float *buf = cpu_f(k, in->in[1]);
	for (int64_t i = 0; i < n; i++) {
		float g = a[i];
		if (wd != 0)
			g = g + wd * o[i];
		if (mom != 0) {
			buf[i] = k->step->t <= 1 ? g : mom * buf[i] + g;
			g = buf[i];
		}
		o[i] = o[i] - lr * g;
	}
	return 0;
}

/* in0 = grads, out = params, in1 = m, in2 = v */
static int check_adamw(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(p, -1, DP_F32);
	CPU_OPND(g, 0, DP_F32);
	CPU_OPND(m, 1, DP_F32);
	CPU_OPND(v, 2, DP_F32);
	CPU_NEED(cpu_numel(p) == cpu_numel(g) && cpu_numel(m) == cpu_numel(p) &&
		 cpu_numel(v) == cpu_numel(p), "params, grads and state differ in size");
	return 0;
}

/* torch.optim.AdamW (1.13, single tensor): scalars in double as Python
 * computes them, tensor arithmetic in float in the same order */
static int run_adamw(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpOptim *op = k->step->opt;
	float *o = cpu_f(k, in->out);
	const float *a = cpu_f(k, in->in[0]);
	int64_t n = cpu_numel(cpu_t(k, in->out));
	double lr = k->step->lr, b1 = op->beta1, b2 = op->beta2;
	float decay = (float)(1.0 - lr * op->weight_decay);
	float one_b1 = (float)(1.0 - b1), one_b2 = (float)(1.0 - b2);
	double bc1 = 1.0 - pow(b1, (double)k->step->t), bc2 = 1.0 - pow(b2, (double)k->step->t);
	float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
	float beta1 = op->beta1, beta2 = op->beta2, eps = op->eps;
	float *m = cpu_f(k, in->in[1]), *v = cpu_f(k, in->in[2]);
	for (int64_t i = 0; i < n; i++) {
		float g = a[i];
		o[i] *= decay;
		m[i] = m[i] * beta1 + one_b1 * g;
		v[i] = v[i] * beta2 + one_b2 * (g * g);
		float denom = sqrtf(v[i]) / bc2_sqrt + eps;
		o[i] += (-step_size * m[i]) / denom;
	}
	return 0;
}

/* ORDER KERNEL (designated): operands, limits, run, bf16 */
const CpuKernel cpu_optim_kernels[DPK_COUNT] = {
	[DPK_SQNORM] = {check_reduce, NULL, run_sqnorm, 0},
	[DPK_SQRT] = {check_reduce, NULL, run_sqrt, 0},
	[DPK_CLIP] = {check_clip, NULL, run_clip, 0},
	[DPK_SGD] = {check_sgd, NULL, run_sgd, 0},
	[DPK_ADAMW] = {check_adamw, NULL, run_adamw, 0},
};
