/*
 * cpu/norm.c - the CPU kernels of layernorm and rmsnorm over the last dim:
 * forward, dx, and the gamma gradient (column sums). Row statistics,
 * the gradients' dot products and the column sums accumulate in double.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"

/* in {x, gamma [C], beta [C]} (rmsnorm: no beta); fa0 = eps */
static int check_norm(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(x, 0, DP_F32);
	CPU_OPND(g, 1, DP_F32);
	CPU_NEED(cpu_numel(o) == cpu_numel(x) && cpu_cols(o) == cpu_cols(x),
		 "output and x differ in shape");
	CPU_NEED(cpu_numel(g) == cpu_cols(x), "gamma size does not match x's last dim");
	if (in->op == DPK_LAYERNORM) {
		CPU_OPND(b, 2, DP_F32);
		CPU_NEED(cpu_numel(b) == cpu_cols(x), "beta size does not match x's last dim");
	}
	CPU_NEED(in->fa[0] >= 0, "negative eps");
	CPU_NEED(cpu_out_disjoint(&c), "output overlaps an input");
	return 0;
}

/* in {dy, x, gamma}; out = dx */
static int check_norm_grad(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(dy, 0, DP_F32);
	CPU_OPND(x, 1, DP_F32);
	CPU_OPND(g, 2, DP_F32);
	CPU_NEED(cpu_numel(o) == cpu_numel(x) && cpu_numel(dy) == cpu_numel(x) &&
		 cpu_cols(o) == cpu_cols(x) && cpu_cols(dy) == cpu_cols(x),
		 "dy, x and output differ in shape");
	CPU_NEED(cpu_numel(g) == cpu_cols(x), "gamma size does not match x's last dim");
	CPU_NEED(in->fa[0] >= 0, "negative eps");
	CPU_NEED(cpu_out_disjoint(&c), "output overlaps an input");
	return 0;
}

/* in {dy, x}; out [C] */
static int check_norm_grad_g(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(dy, 0, DP_F32);
	CPU_OPND(x, 1, DP_F32);
	CPU_NEED(cpu_numel(dy) == cpu_numel(x) && cpu_cols(dy) == cpu_cols(x),
		 "dy and x differ in shape");
	CPU_NEED(cpu_numel(o) == cpu_cols(x), "output size does not match x's last dim");
	CPU_NEED(in->fa[0] >= 0, "negative eps");
	CPU_NEED(cpu_out_disjoint(&c), "output overlaps an input");
	return 0;
}

/* Mean and 1/sqrt(var + eps) of one row, in double (two passes: no cancellation). */
static void row_stats(const float *x, int64_t c, double eps, double *mean, double *rstd)
{
	double m = 0, v = 0;
	for (int64_t j = 0; j < c; j++)
		m += x[j];
	m /= (double)c;
	for (int64_t j = 0; j < c; j++)
		v += ((double)x[j] - m) * ((double)x[j] - m);
	*mean = m;
	*rstd = 1.0 / sqrt(v / (double)c + eps);
}

/* 1/sqrt(mean(x^2) + eps) of one row. */
static double row_rrms(const float *x, int64_t c, double eps)
{
	double q = 0;
	for (int64_t j = 0; j < c; j++)
		q += (double)x[j] * x[j];
	return 1.0 / sqrt(q / (double)c + eps);
}

/* The statistics of row xr: mean 0 and 1/rms for rmsnorm. */
static void stats(int rms, const float *xr, int64_t c, double eps, double *mean, double *rstd)
{
	*mean = 0;
	if (rms)
		*rstd = row_rrms(xr, c, eps);
	else
		row_stats(xr, c, eps, mean, rstd);
}

/* The operands every norm kernel reads: in0, in1, in2, out, [rows, cols] of in0. */
typedef struct {
	const float *a, *b, *c;
	float *o;
	int64_t rows, cols;
	double eps;
} Nv;

static Nv nv(const CpuArgs *k)
{
	const DpTensor *t0 = cpu_t(k, k->in->in[0]);
	int64_t cols = cpu_cols(t0);
	return (Nv){cpu_f(k, k->in->in[0]), cpu_f(k, k->in->in[1]), cpu_f(k, k->in->in[2]),
		    cpu_f(k, k->in->out), cpu_numel(t0) / (cols ? cols : 1), cols, k->in->fa[0]};
}

/* forward (rms: no mean, no beta) */
static void norm_fwd(int rms, const Nv *v)
{
	const float *g = v->b, *b = v->c;
	int64_t c = v->cols;
	for (int64_t r = 0; r < v->rows; r++) {
		const float *xr = v->a + r * c;
		float *orow = v->o + r * c;
		double mean, rstd;
		stats(rms, xr, c, v->eps, &mean, &rstd);
		for (int64_t j = 0; j < c; j++) {
			float xh = (float)(((double)xr[j] - mean) * rstd);
			orow[j] = rms ? xh * g[j] : xh * g[j] + b[j];
		}
	}
}

/*
 * dx, per row with xhat = (x - mean) * rstd and gd = dy * g:
 *   layernorm: dx = rstd * (gd - mean(gd) - xhat * mean(gd * xhat))
 *   rmsnorm:   dx = rrms * (gd - xhat * mean(gd * xhat)),  xhat = x * rrms
 */
static void norm_bwd(int rms, const Nv *v)
{
	const float *dy = v->a, *x = v->b, *g = v->c;
	int64_t c = v->cols;
	for (int64_t r = 0; r < v->rows; r++) {
		const float *xr = x + r * c, *dr = dy + r * c;
		float *orow = v->o + r * c;
		double mean, rstd, sg = 0, sgx = 0;
		stats(rms, xr, c, v->eps, &mean, &rstd);
		for (int64_t j = 0; j < c; j++) {
			double gd = (double)dr[j] * g[j];
			sg += gd;
			sgx += gd * ((double)xr[j] - mean) * rstd;
		}
		sg = rms ? 0 : sg / (double)c;
		sgx /= (double)c;
		for (int64_t j = 0; j < c; j++) {
			double xh = ((double)xr[j] - mean) * rstd;
			orow[j] = (float)(rstd * ((double)dr[j] * g[j] - sg - xh * sgx));
		}
	}
}

/* d gamma: column sums of dy * xhat, in double; + out when ia2. */
static int norm_grad_g(int rms, const Nv *v, int acc, RtErr *e)
{
	const float *dy = v->a, *x = v->b;
	int64_t c = v->cols;
	double *sum = calloc((size_t)c, sizeof(double));
	if (!sum)
		return RT_FAIL(e, "out of memory (norm gradient of %lld channels)", (long long)c);
	for (int64_t r = 0; r < v->rows; r++) {
		const float *xr = x + r * c, *dr = dy + r * c;
		double mean, rstd;
		stats(rms, xr, c, v->eps, &mean, &rstd);
		for (int64_t j = 0; j < c; j++)
			sum[j] += (double)dr[j] * (((double)xr[j] - mean) * rstd);
	}
	for (int64_t j = 0; j < c; j++)
		v->o[j] = (float)(acc ? v->o[j] + sum[j] : sum[j]);
	free(sum);
	return 0;
}

/* Each pair of kernels shares its code: rmsnorm is layernorm without the
 * mean and beta. */
static int run_fwd(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k);
	norm_fwd(k->in->op == DPK_RMSNORM, &v);
	return 0;
}

static int run_bwd(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k);
	norm_bwd(k->in->op == DPK_RMSNORM_GRAD, &v);
	return 0;
}

static int run_grad_g(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k);
	return norm_grad_g(k->in->op == DPK_RMSNORM_GRAD_G, &v, k->in->ia[2] != 0, e);
}

/* ORDER KERNEL (designated): operands, limits, run, bf16 */
const CpuKernel cpu_norm_kernels[DPK_COUNT] = {
	[DPK_LAYERNORM] = {check_norm, NULL, run_fwd, 0},
	[DPK_LAYERNORM_GRAD] = {check_norm_grad, NULL, run_bwd, 0},
	[DPK_LAYERNORM_GRAD_G] = {check_norm_grad_g, NULL, run_grad_g, 0},
	[DPK_RMSNORM] = {check_norm, NULL, run_fwd, 0},
	[DPK_RMSNORM_GRAD] = {check_norm_grad, NULL, run_bwd, 0},
	[DPK_RMSNORM_GRAD_G] = {check_norm_grad_g, NULL, run_grad_g, 0},
};
