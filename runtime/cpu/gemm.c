/*
 * cpu/gemm.c - the CPU kernels of matrix products: matmul and linear
 * (OpenBLAS cblas_sgemm, row-major) and linear's bias gradient, a column
 * sum accumulated in double. BLAS takes int sizes: larger matrices are
 * refused at load (the rows' limits).
 */
#include <limits.h>
#include <string.h>

#include <cblas.h>

#include "cpu.h"

/* m, k, n of out = op(in0) @ op(in1) (ia0, ia1: transpose flags). */
static void matmul_dims(const DpTensor *a, const DpTensor *b, const DpInstr *in, int64_t *m,
			int64_t *k, int64_t *k2, int64_t *n)
{
	*m = in->ia[0] ? cpu_cols(a) : cpu_rows(a);
	*k = in->ia[0] ? cpu_rows(a) : cpu_cols(a);
	*k2 = in->ia[1] ? cpu_cols(b) : cpu_rows(b);
	*n = in->ia[1] ? cpu_rows(b) : cpu_cols(b);
}

static int check_matmul(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(a, 0, DP_F32);
	CPU_OPND(b, 1, DP_F32);
	int64_t m, k, k2, n;
	matmul_dims(a, b, in, &m, &k, &k2, &n);
	CPU_NEED(k == k2, "inner dimensions differ");
	CPU_NEED(cpu_numel(o) == m * n && cpu_cols(o) == n, "output shape does not match");
	CPU_NEED(cpu_disjoint(o, a) && cpu_disjoint(o, b), "output overlaps an input");
	return 0;
}

static int limit_matmul(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	int64_t m, k, k2, n;
	matmul_dims(&s->tensors[in->in[0]], &s->tensors[in->in[1]], in, &m, &k, &k2, &n);
	CPU_NEED(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "matrix too large for BLAS");
	return 0;
}

static void sgemm(const float *a, int64_t ra, int64_t ca, int ta, const float *b, int64_t rb,
		  int64_t cb, int tb, float *c, float beta)
{
	int m = (int)(ta ? ca : ra), k = (int)(ta ? ra : ca), n = (int)(tb ? rb : cb);
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
		    n, k, 1.0f, a, (int)ca, b, (int)cb, beta, c, n);
}

static int run_matmul(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpTensor *t0 = cpu_t(k, in->in[0]), *t1 = cpu_t(k, in->in[1]);
	sgemm(cpu_f(k, in->in[0]), cpu_rows(t0), cpu_cols(t0), in->ia[0] != 0, cpu_f(k, in->in[1]),
	      cpu_rows(t1), cpu_cols(t1), in->ia[1] != 0, cpu_f(k, in->out), in->ia[2] ? 1.0f : 0.0f);
	return 0;
}

/* out = in0 [rows, k] @ in1 [k, n] + in2 [n] (in2 -1: no bias) */
static int check_linear(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(x, 0, DP_F32);
	CPU_OPND(w, 1, DP_F32);
	int64_t k = cpu_cols(x), n = cpu_cols(w);
	CPU_NEED(cpu_rows(w) == k, "x and w inner dimensions differ");
	CPU_NEED(cpu_numel(o) == cpu_rows(x) * n && cpu_cols(o) == n, "output shape does not match");
	if (in->in[2] >= 0) {
		CPU_OPND(b, 2, DP_F32);
		CPU_NEED(cpu_numel(b) == n, "bias size does not match");
		CPU_NEED(cpu_disjoint(o, b), "output overlaps the bias");
	}
	CPU_NEED(cpu_disjoint(o, x) && cpu_disjoint(o, w), "output overlaps an input");
	return 0;
}

static int limit_linear(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	const DpTensor *x = &s->tensors[in->in[0]], *w = &s->tensors[in->in[1]];
	CPU_NEED(cpu_rows(x) <= INT_MAX && cpu_cols(w) <= INT_MAX && cpu_cols(x) <= INT_MAX,
		 "matrix too large for BLAS");
	return 0;
}

/* The bias is copied into every row first, then sgemm adds (beta = 1). */
static int run_linear(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpTensor *t0 = cpu_t(k, in->in[0]), *t1 = cpu_t(k, in->in[1]);
	float *o = cpu_f(k, in->out);
	int64_t rows = cpu_rows(t0), cols = cpu_cols(cpu_t(k, in->out));
	float beta = 0;
	if (in->in[2] >= 0) {
		const float *bias = cpu_f(k, in->in[2]);
		for (int64_t r = 0; r < rows; r++)
			memcpy(o + r * cols, bias, (size_t)cols * sizeof(float));
		beta = 1;
	}
	sgemm(cpu_f(k, in->in[0]), rows, cpu_cols(t0), 0, cpu_f(k, in->in[1]), cpu_rows(t1),
	      cpu_cols(t1), 0, o, beta);
	return 0;
}

/* out[c] = sum_r in0[r, c] (+ out if ia2), in double */
static int check_bias_grad(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(a, 0, DP_F32);
	CPU_NEED(cpu_numel(a) % cpu_numel(o) == 0, "operand sizes do not match");
	CPU_NEED(cpu_disjoint(o, a), "output overlaps the input");
	return 0;
}

static int run_bias_grad(const CpuArgs *k, RtErr *e)
{
	float *o = cpu_f(k, k->in->out);
	const float *a = cpu_f(k, k->in->in[0]);
	int64_t c = cpu_numel(cpu_t(k, k->in->out)), rows = cpu_numel(cpu_t(k, k->in->in[0])) / c;
	for (int64_t j = 0; j < c; j++) {
		double sum = k->in->ia[2] ? o[j] : 0;
		for (int64_t r = 0; r < rows; r++)
			sum += a[r * c + j];
		o[j] = (float)sum;
	}
	return 0;
}

/* ORDER KERNEL (designated): operands, limits, run, bf16 */
const CpuKernel cpu_gemm_kernels[DPK_COUNT] = {
	[DPK_MATMUL] = {check_matmul, limit_matmul, run_matmul, 0},
	[DPK_LINEAR] = {check_linear, limit_linear, run_linear, 0},
	[DPK_BIAS_GRAD] = {check_bias_grad, NULL, run_bias_grad, 0},
};
