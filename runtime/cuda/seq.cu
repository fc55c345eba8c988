/*
 * seq.cu - CUDA kernels that work along a row of a sequence (the CPU's
 * runtime/cpu/seq.c, without attention, which is attention.cu): softmax over
 * the last dim and its gradient, and the rotary position encoding of the q
 * and k of a packed qkv.
 *
 * softmax: one block per row: the float max (exact), e = expf(x - max) in
 * float, their sum in double (block tree; the CPU sums in order), inv =
 * (float)(1 / sum), out = e * inv. Device expf is within 2 ulp of glibc's:
 * outputs within a few ulp of the CPU.
 * softmax_grad: dot = sum dy * y in double (tree), out = (float)(y * (dy -
 * dot)) in double: within 1 ulp of the CPU.
 * rope: per element x1 * c - x2 * s and x2 * c + x1 * s in float, v copied,
 * -fmad=false: bitwise equal to the CPU.
 */
#include "device.cuh"

/* ---- softmax ---- */

__global__ void k_softmax(float *o, const float *x, int64_t rows, int64_t c)
{
	__shared__ float shf[32];
	__shared__ double shd[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *xr = x + r * c;
		float *orow = o + r * c;
		float mx = -INFINITY;
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
			mx = max_nan(mx, ld(xr + j));
		mx = block_max(mx, shf);
		double sum = 0;
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
			sum += expf(ld(xr + j) - mx);
		sum = block_sum<double>(sum, shd);
		float inv = (float)(1.0 / sum);
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
			st(orow + j, expf(ld(xr + j) - mx) * inv);
	}
}

/* out = y * (dy - sum(dy * y)); in {dy, y} */
__global__ void k_softmax_grad(float *o, const float *dy, const float *y, int64_t rows, int64_t c)
{
	__shared__ double sh[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *dr = dy + r * c, *yr = y + r * c;
		double dot = 0;
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
			dot += (double)ld(dr + j) * ld(yr + j);
		dot = block_sum<double>(dot, sh);
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
			st(o + r * c + j, (float)(ld(yr + j) * (ld(dr + j) - dot)));
	}
}

static int run_softmax(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t c = cu_cols(t0), rows = cu_rows(t0);
	if (rows <= 0 || c <= 0)
		return 0;
	unsigned grid = (unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID);
	if (a->in->op == DPK_SOFTMAX)
		CU_LAUNCH(k_softmax, grid, cu_row_threads(c), a->st, cu_f(a, -1), cu_f(a, 0), rows, c);
	else
		CU_LAUNCH(k_softmax_grad, grid, cu_row_threads(c), a->st, cu_f(a, -1), cu_f(a, 0),
			  cu_f(a, 1), rows, c);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- rope ----
 * qkv [B, T, 3C], heads of hd = 2*half: in q and k, element j < half pairs
 * with j + half at position t (the row's index along T):
 *   out[j] = x[j] c - x[j+half] s,  out[j+half] = x[j+half] c + x[j] s
 * with s negated for the inverse (ia0). v is copied. One thread per pair (or
 * per v element): rows * heads * (2 * half + hd) = rows * 3C / 2... indexed
 * as (row, column of the row's first 2/3 pairs or v). */
__global__ void k_rope(float *o, const float *x, const float *cs, const float *sn, int64_t rows,
		       int64_t t, int64_t ld3, int64_t half, float sign)
{
	int64_t hd = 2 * half, per_row = ld3 / 3 * 2; /* per head: half + half pairs, hd v */
	CU_FOR_EACH(i, rows * per_row) {
		int64_t r = i / per_row, k = i - r * per_row;
		int64_t h = k / (2 * hd), w = k - h * 2 * hd; /* w < hd: a pair of q or k; else v */
		int64_t base = r * ld3 + 3 * hd * h;
		if (w < hd) {
			int64_t part = w / half, j = w - part * half; /* part 0: q, 1: k */
			const float *xi = x + base + part * hd;
			float *oi = o + base + part * hd;
			int64_t p = r % t;
			float c = ld(cs + p * half + j), sv = sign * ld(sn + p * half + j);
			float x1 = ld(xi + j), x2 = ld(xi + j + half);
			st(oi + j, x1 * c - x2 * sv);
			st(oi + j + half, x2 * c + x1 * sv);
		} else {
			int64_t v = base + 2 * hd + (w - hd);
			st(o + v, ld(x + v));
		}
	}
}

static int run_rope(const CuArgs *a, RtErr *e)
{
	const DpTensor *tq = cu_t(a, 0), *tc = cu_t(a, 1);
	int64_t rows = tq->dims[0] * tq->dims[1], half = tc->dims[1];
	if (rows <= 0 || half <= 0)
		return 0;
	CU_LAUNCH(k_rope, cu_grid(rows * tq->dims[2] / 3 * 2), CU_THREADS, a->st, cu_f(a, -1),
		  cu_f(a, 0), cu_f(a, 1), cu_f(a, 2), rows, tq->dims[1], tq->dims[2], half,
		  a->in->ia[0] ? -1.0f : 1.0f);
	CU_LAUNCHED(a, e);
	return 0;
}

extern "C" void cu_seq_rows(CuKernel *k)
{
	/* run, limits, scratch, blas, bf16 */
	k[DPK_SOFTMAX] = {run_softmax, NULL, NULL, 0, 0};
	k[DPK_SOFTMAX_GRAD] = {run_softmax, NULL, NULL, 0, 0};
	k[DPK_ROPE] = {run_rope, NULL, NULL, 0, 0};
}
