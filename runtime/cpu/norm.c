/*
 * cpu/norm.c - the CPU kernels of layernorm and rmsnorm over the last dim:
 * forward, dx, the gamma gradient (column sums), and gamma's and beta's
 * gradients in one walk (layernorm_grad_gb). Row statistics,
 * the gradients' dot products and the column sums accumulate in double
 * (vec.c's norm_* loops). Each kernel makes one pass over memory: a row
 * is read once from memory and its sweeps (mean, centred squares, the
 * output) run while it sits in L1. Rows go to the rank's threads.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* The operands every norm kernel reads: in0, in1, in2, out, [rows, cols] of in0. */
typedef struct {
	const float *a, *b, *c, *d; /* d: in3 (the fused ops' fourth operand; NULL
	                               where there is none) */
	float *o;
	int64_t rows, cols;
	double eps;
	int rms;
	const CpuVec *vec;
	double *stats; /* grad_g: [rows][2] mean, rstd */
	int acc;       /* grad_g: add to out */
	unsigned half; /* the fused ops: the storage dtype when 16-bit (f32 copies
	                  here), else 0 */
} Nv;

static Nv nv(const CpuArgs *k, int rms)
{
	const DpTensor *t0 = cpu_t(k, k->in->in[0]);
	int64_t cols = cpu_cols(t0);
	unsigned dt = cpu_t(k, k->in->out)->dtype;
	return (Nv){cpu_f(k, k->in->in[0]), cpu_f(k, k->in->in[1]), cpu_f(k, k->in->in[2]),
		    cpu_f(k, k->in->in[3]), cpu_f(k, k->in->out), cpu_numel(t0) / (cols ? cols : 1),
		    cols, DP_FATTR(k->in, LAYERNORM, eps), rms, k->vec, NULL,
		    DP_ATTR(k->in, LAYERNORM_GRAD_G, acc) != 0, dp_is_half(dt) ? dt : 0};
}

/* What storing x[0..n) in dtype half and loading it again gives (half 0: x). */
static void round_to(unsigned half, float *x, int64_t n)
{
	if (half)
		for (int64_t j = 0; j < n; j++)
			x[j] = rt_from_half(half, rt_to_half(half, x[j]));
}

/* forward, rows lo..hi (rms: no mean, no beta) */
static void fwd_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Nv *v = ctx;
	int64_t c = v->cols;
	for (int64_t r = lo; r < hi; r++) {
		double mean, rstd;
		v->vec->norm_stats(v->a + r * c, c, v->rms, v->eps, &mean, &rstd);
		v->vec->norm_fwd(v->o + r * c, v->a + r * c, v->b, v->rms ? NULL : v->c, c, mean, rstd);
	}
}

/* dx, rows lo..hi: in {dy, x, gamma} (the formulas: vec.c's norm_bwd) */
static void bwd_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Nv *v = ctx;
	int64_t c = v->cols;
	for (int64_t r = lo; r < hi; r++) {
		const float *xr = v->b + r * c;
		double mean, rstd;
		v->vec->norm_stats(xr, c, v->rms, v->eps, &mean, &rstd);
		v->vec->norm_bwd(v->o + r * c, v->a + r * c, xr, v->c, c, v->rms, mean, rstd);
	}
}

/* add_layernorm, rows lo..hi: in {x, r, gamma, beta} (add_rmsnorm: {x, r,
 * g}, d NULL); the sum's row r at out + r c, the norm's at out + (rows + r)
 * c. The add is the add kernel's map (x + r), the norm the forward's loops
 * on the stored sum. */
static void add_fwd_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Nv *v = ctx;
	int64_t c = v->cols;
	for (int64_t r = lo; r < hi; r++) {
		float *sr = v->o + r * c;
		double mean, rstd;
		v->vec->map(DP_OP_ADD, sr, v->a + r * c, v->b + r * c, 0, c);
		round_to(v->half, sr, c);
		v->vec->norm_stats(sr, c, v->rms, v->eps, &mean, &rstd);
		v->vec->norm_fwd(v->o + (v->rows + r) * c, sr, v->c, v->rms ? NULL : v->d, c, mean,
				 rstd);
	}
}

/* layernorm_grad_add (rmsnorm_grad_add: rms), rows lo..hi: in {dy, x,
 * gamma, d residual}: dx as bwd_rows, stored, then the accum's map (dx + d
 * residual) over it. */
static void bwd_add_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Nv *v = ctx;
	int64_t c = v->cols;
	for (int64_t r = lo; r < hi; r++) {
		const float *xr = v->b + r * c;
		float *orow = v->o + r * c;
		double mean, rstd;
		v->vec->norm_stats(xr, c, v->rms, v->eps, &mean, &rstd);
		v->vec->norm_bwd(orow, v->a + r * c, xr, v->c, c, v->rms, mean, rstd);
		round_to(v->half, orow, c);
		v->vec->map(DP_OP_ACCUM, orow, v->d + r * c, NULL, 0, c);
	}
}

/* d gamma in two parallel loops: the statistics of every row (by rows),
 * then the column sums of dy * xhat in double (by columns: each column is
 * summed over the rows in order, whatever the split). */
static void stats_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Nv *v = ctx;
	for (int64_t r = lo; r < hi; r++)
		v->vec->norm_stats(v->b + r * v->cols, v->cols, v->rms, v->eps, &v->stats[2 * r],
				   &v->stats[2 * r + 1]);
}

static void gamma_cols(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Nv *v = ctx;
	int64_t c = v->cols, w = hi - lo;
	double sum[256];
	for (int64_t j0 = lo; j0 < hi; j0 += 256) {
		w = hi - j0 < 256 ? hi - j0 : 256;
		memset(sum, 0, sizeof sum);
		for (int64_t r = 0; r < v->rows; r++)
			v->vec->norm_gamma(sum, v->a + r * c + j0, v->b + r * c + j0, w, v->stats[2 * r],
					   v->stats[2 * r + 1]);
		for (int64_t j = 0; j < w; j++)
			v->o[j0 + j] = (float)(v->acc ? v->o[j0 + j] + sum[j] : sum[j]);
	}
}

/* layernorm_grad_gb, columns lo..hi: gamma's sums as gamma_cols and beta's
 * as bias_grad's (gemm.c's col_piece: vec.c's col_sum, from the output when
 * accumulating), in one walk over the rows: each row of dy is read once for
 * both, and each sum is the separate kernel's sequence of additions. out
 * [2, cols]: gamma's gradient, then beta's. */
static void gamma_beta_cols(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Nv *v = ctx;
	int64_t c = v->cols;
	float *ob = v->o + c;
	double sg[256], sb[256];
	for (int64_t j0 = lo; j0 < hi; j0 += 256) {
		int64_t w = hi - j0 < 256 ? hi - j0 : 256;
		memset(sg, 0, sizeof sg);
		for (int64_t j = 0; j < w; j++)
			sb[j] = v->acc ? ob[j0 + j] : 0;
		for (int64_t r = 0; r < v->rows; r++) {
			v->vec->norm_gamma(sg, v->a + r * c + j0, v->b + r * c + j0, w, v->stats[2 * r],
					   v->stats[2 * r + 1]);
			v->vec->col_sum(sb, v->a + r * c + j0, w);
		}
		for (int64_t j = 0; j < w; j++) {
			v->o[j0 + j] = (float)(v->acc ? v->o[j0 + j] + sg[j] : sg[j]);
			ob[j0 + j] = (float)sb[j];
		}
	}
}

/* Each pair of kernels shares its code: rmsnorm is layernorm without the
 * mean and beta. */
static int run_fwd(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k, k->in->op == DP_OP_RMSNORM);
	cpu_parallel(k->pool, v.rows, cpu_grain_rows(v.cols), fwd_rows, &v);
	return 0;
}

static int run_bwd(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k, k->in->op == DP_OP_RMSNORM_GRAD);
	cpu_parallel(k->pool, v.rows, cpu_grain_rows(v.cols), bwd_rows, &v);
	return 0;
}

static int run_add_fwd(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k, k->in->op == DP_OP_ADD_RMSNORM);
	cpu_parallel(k->pool, v.rows, cpu_grain_rows(v.cols), add_fwd_rows, &v);
	return 0;
}

static int run_bwd_add(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k, k->in->op == DP_OP_RMSNORM_GRAD_ADD);
	cpu_parallel(k->pool, v.rows, cpu_grain_rows(v.cols), bwd_add_rows, &v);
	return 0;
}

static int run_grad_g(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k, k->in->op == DP_OP_RMSNORM_GRAD_G);
	v.stats = malloc((size_t)(2 * v.rows + 1) * sizeof(double));
	if (!v.stats)
		return RT_FAIL(e, "out of memory (norm gradient of %lld rows)", (long long)v.rows);
	cpu_parallel(k->pool, v.rows, cpu_grain_rows(v.cols), stats_rows, &v);
	cpu_parallel(k->pool, v.cols, v.rows * v.cols < 2 * CPU_GRAIN ? v.cols : 16, gamma_cols, &v);
	free(v.stats);
	return 0;
}

static int run_grad_gb(const CpuArgs *k, RtErr *e)
{
	Nv v = nv(k, 0);
	v.stats = malloc((size_t)(2 * v.rows + 1) * sizeof(double));
	if (!v.stats)
		return RT_FAIL(e, "out of memory (norm gradient of %lld rows)", (long long)v.rows);
	cpu_parallel(k->pool, v.rows, cpu_grain_rows(v.cols), stats_rows, &v);
	cpu_parallel(k->pool, v.cols, v.rows * v.cols < 2 * CPU_GRAIN ? v.cols : 16, gamma_beta_cols,
		     &v);
	free(v.stats);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
const KernelRow cpu_norm_rows[] = {
	{DP_OP_LAYERNORM, run_fwd, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_LAYERNORM_GRAD, run_bwd, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_LAYERNORM_GRAD_G, run_grad_g, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_RMSNORM, run_fwd, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_RMSNORM_GRAD, run_bwd, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_RMSNORM_GRAD_G, run_grad_g, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_ADD_LAYERNORM, run_add_fwd, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_LAYERNORM_GRAD_ADD, run_bwd_add, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_ADD_RMSNORM, run_add_fwd, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_RMSNORM_GRAD_ADD, run_bwd_add, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_LAYERNORM_GRAD_GB, run_grad_gb, NULL, 0, NULL, NULL, 0, 0},
	{0},
};
