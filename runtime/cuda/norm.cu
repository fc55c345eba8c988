/*
 * norm.cu - the CUDA kernels of layernorm and rmsnorm over the last dim (the
 * CPU's runtime/cpu/norm.c): forward, dx, and the gamma gradient.
 *
 * One block per row (grid-stride over rows), cu_row_threads(C) threads; the
 * row statistics and the gradient's two dot products are block reductions
 * (warp butterflies, then the warps in order) in double, two passes for the
 * variance as on the CPU:
 *   mean = sum x / C, rstd = 1 / sqrt(sum (x - mean)^2 / C + eps)
 *   (rmsnorm: mean 0, rstd = 1 / sqrt(sum x^2 / C + eps));
 *   forward: xh = (float)((x - mean) * rstd), out = xh * g (+ b) in float;
 *   dx: rstd * (dy*g - mean(dy*g) - xh * mean(dy*g*xh)) in double, rounded once
 *   (rmsnorm without the mean(dy*g) term).
 * Every per-element expression is the CPU's, in the CPU's order (no FMA:
 * -fmad=false). The double sums are in tree order instead of the CPU's
 * sequence: ~1e-16 relative, so outputs are the CPU's to within 1 ulp (and
 * usually bitwise).
 *
 * gamma gradient: out[c] = sum_r dy * xh (+ out): the rows' statistics into
 * scratch, then cu_colsum (device.cuh): column sums in two stages in double
 * (chunks of rows, then the chunks in order), rounded once: within 1 ulp of
 * the CPU's row-order sum.
 */
#include "device.cuh"

/* mean and rstd of one row (every thread gets them); rms: mean 0. */
static __device__ void row_stats(int rms, const float *x, int64_t c, double eps, double *sh,
				 double *mean, double *rstd)
{
	double m = 0;
	if (!rms) {
		double s = 0;
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
			s += ld(x + j);
		m = block_sum<double>(s, sh) / (double)c;
	}
	double q = 0;
	for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
		double d = (double)ld(x + j) - m;
		q += d * d;
	}
	q = block_sum<double>(q, sh);
	*mean = m;
	*rstd = 1.0 / sqrt(q / (double)c + eps);
}

/* forward: in {x, g, b} (rms: no b) */
__global__ void k_norm_fwd(int rms, float *o, const float *x, const float *g, const float *b,
			   int64_t rows, int64_t c, double eps)
{
	__shared__ double sh[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *xr = x + r * c;
		float *orow = o + r * c;
		double mean, rstd;
		row_stats(rms, xr, c, eps, sh, &mean, &rstd);
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
			float xh = (float)(((double)ld(xr + j) - mean) * rstd);
			st(orow + j, rms ? xh * ld(g + j) : xh * ld(g + j) + ld(b + j));
		}
	}
}

/* dx: in {dy, x, g} */
__global__ void k_norm_bwd(int rms, float *o, const float *dy, const float *x, const float *g,
			   int64_t rows, int64_t c, double eps)
{
	__shared__ double sh[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *xr = x + r * c, *dr = dy + r * c;
		float *orow = o + r * c;
		double mean, rstd, sg = 0, sgx = 0;
		row_stats(rms, xr, c, eps, sh, &mean, &rstd);
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
			double gd = (double)ld(dr + j) * ld(g + j);
			sg += gd;
			sgx += gd * ((double)ld(xr + j) - mean) * rstd;
		}
		sg = block_sum<double>(sg, sh);
		sgx = block_sum<double>(sgx, sh);
		sg = rms ? 0 : sg / (double)c;
		sgx /= (double)c;
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
			double xh = ((double)ld(xr + j) - mean) * rstd;
			st(orow + j, (float)(rstd * ((double)ld(dr + j) * ld(g + j) - sg - xh * sgx)));
		}
	}
}

/* gamma gradient, stage 0: stats[2r] = mean, stats[2r + 1] = rstd */
__global__ void k_norm_stats(int rms, const float *x, int64_t rows, int64_t c, double eps,
			     double *stats)
{
	__shared__ double sh[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		double mean, rstd;
		row_stats(rms, x + r * c, c, eps, sh, &mean, &rstd);
		if (threadIdx.x == 0) {
			stats[2 * r] = mean;
			stats[2 * r + 1] = rstd;
		}
	}
}

/* stage 1's term: dy * xh with the row's statistics from stage 0 */
struct NormGTerm {
	const float *dy, *x;
	const double *stats;
	int64_t c;
	__device__ double operator()(int64_t r, int64_t j) const
	{
		return (double)ld(dy + r * c + j) *
		       (((double)ld(x + r * c + j) - stats[2 * r]) * stats[2 * r + 1]);
	}
};

static unsigned row_grid(int64_t rows)
{
	return (unsigned)(rows < CU_MAX_GRID ? (rows > 0 ? rows : 1) : CU_MAX_GRID);
}

static int run_fwd(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t c = cu_cols(t0), rows = cu_rows(t0);
	if (rows <= 0 || c <= 0)
		return 0;
	CU_LAUNCH(k_norm_fwd, row_grid(rows), cu_row_threads(c), a->st, a->in->op == DPK_RMSNORM,
		  cu_f(a, -1), cu_f(a, 0), cu_f(a, 1), cu_f(a, 2), rows, c, (double)a->in->fa[0]);
	CU_LAUNCHED(a, e);
	return 0;
}

static int run_bwd(const CuArgs *a, RtErr *e)
{
	const DpTensor *t1 = cu_t(a, 1);
	int64_t c = cu_cols(t1), rows = cu_rows(t1);
	if (rows <= 0 || c <= 0)
		return 0;
	CU_LAUNCH(k_norm_bwd, row_grid(rows), cu_row_threads(c), a->st,
		  a->in->op == DPK_RMSNORM_GRAD, cu_f(a, -1), cu_f(a, 0), cu_f(a, 1), cu_f(a, 2), rows,
		  c, (double)a->in->fa[0]);
	CU_LAUNCHED(a, e);
	return 0;
}

/* stats (2 per row), then the partials */
static size_t scratch_grad_g(const DpStep *s, const DpInstr *in)
{
	const DpTensor *x = &s->tensors[in->in[1]];
	int64_t c = cu_cols(x), rows = cu_rows(x);
	return (size_t)(2 * rows + cu_col_chunks(rows, c) * c) * sizeof(double);
}

static int run_grad_g(const CuArgs *a, RtErr *e)
{
	const DpTensor *t1 = cu_t(a, 1);
	int64_t c = cu_cols(t1), rows = cu_rows(t1);
	int rms = a->in->op == DPK_RMSNORM_GRAD_G;
	double *stats = (double *)a->scratch, *part = stats + 2 * rows;
	if (c <= 0)
		return 0;
	if (rows > 0) {
		CU_LAUNCH(k_norm_stats, row_grid(rows), cu_row_threads(c), a->st, rms, cu_f(a, 1), rows,
			  c, (double)a->in->fa[0], stats);
		CU_LAUNCHED(a, e);
	}
	NormGTerm term = {cu_f(a, 0), cu_f(a, 1), stats, c};
	CU_OK(a, cu_colsum(a->st, term, cu_f(a, -1), rows, c, a->in->ia[2] != 0, part), e);
	return 0;
}

extern "C" void cu_norm_rows(CuKernel *k)
{
	/* run, limits, scratch, blas, bf16 */
	k[DPK_LAYERNORM] = {run_fwd, NULL, NULL, 0, 0};
	k[DPK_LAYERNORM_GRAD] = {run_bwd, NULL, NULL, 0, 0};
	k[DPK_LAYERNORM_GRAD_G] = {run_grad_g, NULL, scratch_grad_g, 0, 0};
	k[DPK_RMSNORM] = {run_fwd, NULL, NULL, 0, 0};
	k[DPK_RMSNORM_GRAD] = {run_bwd, NULL, NULL, 0, 0};
	k[DPK_RMSNORM_GRAD_G] = {run_grad_g, NULL, scratch_grad_g, 0, 0};
}
