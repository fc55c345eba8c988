/*
 * cpu/elementwise.c - CPU kernels that compute each output element from the
 * same element of their inputs: accum, scale, add, mul, the activations
 * (relu, gelu in its tanh form, tanh, silu) with their gradients, and the
 * row broadcast bias_add. Plain float arithmetic in the order written (the
 * CUDA kernels repeat it operation for operation).
 */
#include <math.h>

#include "cpu.h"

/* The operands of an elementwise kernel: out, in0, in1 (NULL if absent). */
typedef struct {
	float *o;
	const float *a, *b;
	int64_t n; /* elements of out */
} Ew;

static Ew ew(const CpuArgs *k)
{
	return (Ew){cpu_f(k, k->in->out), cpu_f(k, k->in->in[0]), cpu_f(k, k->in->in[1]),
		    cpu_numel(cpu_t(k, k->in->out))};
}

static int check_unary(const DpStep *s, const DpInstr *in, RtErr *e)
{
	return cpu_check_same_size(s, in, 1, e);
}

static int check_binary(const DpStep *s, const DpInstr *in, RtErr *e)
{
	return cpu_check_same_size(s, in, 2, e);
}

static int run_accum(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] += v.a[i];
	return 0;
}

static int run_scale(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = k->in->fa[0] * v.a[i];
	return 0;
}

static int run_add(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = v.a[i] + v.b[i];
	return 0;
}

static int run_mul(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = v.a[i] * v.b[i];
	return 0;
}

static int run_relu(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = v.a[i] > 0 ? v.a[i] : 0;
	return 0;
}

/* in0 = dy, in1 = x */
static int run_relu_grad(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = v.b[i] > 0 ? v.a[i] : 0;
	return 0;
}

static const float gelu_s = 0.7978845608028654f; /* sqrt(2/pi) */

static int run_gelu(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++) {
		float x = v.a[i];
		v.o[i] = 0.5f * x * (1.0f + tanhf(gelu_s * (x + 0.044715f * x * x * x)));
	}
	return 0;
}

/* in0 = dy, in1 = x */
static int run_gelu_grad(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++) {
		float x = v.b[i];
		float th = tanhf(gelu_s * (x + 0.044715f * x * x * x));
		float du = gelu_s * (1.0f + 3.0f * 0.044715f * x * x);
		v.o[i] = v.a[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
	}
	return 0;
}

static int run_tanh(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = tanhf(v.a[i]);
	return 0;
}

/* in0 = dy, in1 = y = tanh(x) */
static int run_tanh_grad(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = v.a[i] * (1.0f - v.b[i] * v.b[i]);
	return 0;
}

static int run_silu(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = v.a[i] / (1.0f + expf(-v.a[i]));
	return 0;
}

/* in0 = dy, in1 = x: silu'(x) = sig(x) * (1 + x * (1 - sig(x))) */
static int run_silu_grad(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	for (int64_t i = 0; i < v.n; i++) {
		float x = v.b[i], sg = 1.0f / (1.0f + expf(-x));
		v.o[i] = v.a[i] * sg * (1.0f + x * (1.0f - sg));
	}
	return 0;
}

/* ---- bias_add: out[r, c] = in0[r, c] + in1[c] ---- */

static int check_bias_add(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(a, 0, DP_F32);
	CPU_OPND(b, 1, DP_F32);
	CPU_NEED(cpu_numel(o) == cpu_numel(a) && cpu_numel(a) % cpu_numel(b) == 0,
		 "operand sizes do not match");
	return 0;
}

static int run_bias_add(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	int64_t c = cpu_numel(cpu_t(k, k->in->in[1]));
	for (int64_t i = 0; i < v.n; i++)
		v.o[i] = v.a[i] + v.b[i % c];
	return 0;
}

/* ORDER KERNEL (designated): operands, limits, run, bf16 */
const CpuKernel cpu_elementwise_kernels[DPK_COUNT] = {
	[DPK_ACCUM] = {check_unary, NULL, run_accum, 0},
	[DPK_SCALE] = {check_unary, NULL, run_scale, 0},
	[DPK_ADD] = {check_binary, NULL, run_add, 0},
	[DPK_MUL] = {check_binary, NULL, run_mul, 0},
	[DPK_RELU] = {check_unary, NULL, run_relu, 0},
	[DPK_RELU_GRAD] = {check_binary, NULL, run_relu_grad, 0},
	[DPK_GELU] = {check_unary, NULL, run_gelu, 0},
	[DPK_GELU_GRAD] = {check_binary, NULL, run_gelu_grad, 0},
	[DPK_TANH] = {check_unary, NULL, run_tanh, 0},
	[DPK_TANH_GRAD] = {check_binary, NULL, run_tanh_grad, 0},
	[DPK_SILU] = {check_unary, NULL, run_silu, 0},
	[DPK_SILU_GRAD] = {check_binary, NULL, run_silu_grad, 0},
	[DPK_BIAS_ADD] = {check_bias_add, NULL, run_bias_add, 0},
};
