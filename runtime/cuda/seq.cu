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
 *
 * bf16: the kernels are templated on the storage; f32 arithmetic as above
 * on the widened values, one rounding per stored element (rope's v is
 * moved, never converted). Rows whose length is a multiple of 8 with
 * 16-byte aligned operands are walked in chunks of eight (128-bit
 * accesses): rope is per element, so bitwise what staging gave; softmax's
 * double sums are regrouped among the threads (~1e-16 relative), which can
 * move an output by 1 bf16 ulp only where its f32 value lies that close to
 * a rounding boundary. f16 (precision fp16) the same, on __half.
 */
#include "device.cuh"

/* ---- softmax ---- */

template <int W, typename T> __global__ void k_softmax(T *o, const T *x, int64_t rows, int64_t c)
{
	__shared__ float shf[32];
	__shared__ double shd[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *xr = x + r * c;
		T *orow = o + r * c;
		float mx = -INFINITY;
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float xv[W];
			ldw<W>(xr + j, xv);
			for (int k = 0; k < W; k++)
				mx = max_nan(mx, xv[k]);
		}
		mx = block_max(mx, shf);
		double sum = 0;
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float xv[W];
			ldw<W>(xr + j, xv);
			for (int k = 0; k < W; k++)
				sum += expf(xv[k] - mx);
		}
		sum = block_sum<double>(sum, shd);
		float inv = (float)(1.0 / sum);
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float xv[W], ov[W];
			ldw<W>(xr + j, xv);
			for (int k = 0; k < W; k++) {
				ov[k] = expf(xv[k] - mx) * inv;
				if (MUTANT(bf16_round)) /* truncated */
					ov[k] = __uint_as_float(__float_as_uint(ov[k]) & 0xffff0000u);
			}
			stw<W>(orow + j, ov);
		}
	}
}

/* out = y * (dy - sum(dy * y)); in {dy, y} */
template <int W, typename T>
__global__ void k_softmax_grad(T *o, const T *dy, const T *y, int64_t rows, int64_t c)
{
	__shared__ double sh[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *dr = dy + r * c, *yr = y + r * c;
		double dot = 0;
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float dv[W], yv[W];
			ldw<W>(dr + j, dv);
			ldw<W>(yr + j, yv);
			for (int k = 0; k < W; k++)
				dot += (double)dv[k] * yv[k];
		}
		dot = block_sum<double>(dot, sh);
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float dv[W], yv[W], ov[W];
			ldw<W>(dr + j, dv);
			ldw<W>(yr + j, yv);
			for (int k = 0; k < W; k++)
				ov[k] = (float)(yv[k] * (dv[k] - dot));
			stw<W>(o + r * c + j, ov);
		}
	}
}

template <typename T> static int run_softmax_t(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t c = cu_cols(t0), rows = cu_rows(t0);
	T *o = (T *)cu_p(a, -1);
	const T *x = (const T *)cu_p(a, 0), *y = (const T *)cu_p(a, 1);
	if (rows <= 0 || c <= 0)
		return 0;
	unsigned grid = (unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID);
	int w = cu_vec8<T>(c, o, x, y) ? 8 : 1;
	if (a->in->op == DP_OP_SOFTMAX) {
		if (w == 8)
			CU_LAUNCH((k_softmax<8, T>), grid, cu_row_threads_w(c, 8), a->st, o, x, rows, c);
		else
			CU_LAUNCH((k_softmax<1, T>), grid, cu_row_threads(c), a->st, o, x, rows, c);
	} else {
		if (w == 8)
			CU_LAUNCH((k_softmax_grad<8, T>), grid, cu_row_threads_w(c, 8), a->st, o, x, y,
				  rows, c);
		else
			CU_LAUNCH((k_softmax_grad<1, T>), grid, cu_row_threads(c), a->st, o, x, y, rows,
				  c);
	}
	CU_LAUNCHED(a, e);
	return 0;
}

static int run_softmax(const CuArgs *a, RtErr *e)
{
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_F16 ? run_softmax_t<__half>(a, e)
	       : dt == DP_BF16 ? run_softmax_t<cu_bf16>(a, e) : run_softmax_t<float>(a, e);
}

/* ---- rope ----
 * qkv [B, T, 3C], heads of hd = 2*half: in q and k, element j < half pairs
 * with j + half at position t (the row's index along T):
 *   out[j] = x[j] c - x[j+half] s,  out[j+half] = x[j+half] c + x[j] s
 * with s negated for the inverse (the attribute inverse). v is copied. One thread per pair (or
 * per v element): rows * heads * (2 * half + hd) = rows * 3C / 2... indexed
 * as (row, column of the row's first 2/3 pairs or v). */
template <typename T>
__global__ void k_rope(T *o, const T *x, const T *cs, const T *sn, int64_t rows, int64_t t,
		       int64_t ld3, int64_t half, float sign)
{
	int64_t hd = 2 * half, per_row = ld3 / 3 * 2; /* per head: half + half pairs, hd v */
	CU_FOR_EACH(i, rows * per_row) {
		int64_t r = i / per_row, k = i - r * per_row;
		int64_t h = k / (2 * hd), w = k - h * 2 * hd; /* w < hd: a pair of q or k; else v */
		int64_t base = r * ld3 + 3 * hd * h;
		if (w < hd) {
			int64_t part = w / half, j = w - part * half; /* part 0: q, 1: k */
			const T *xi = x + base + part * hd;
			T *oi = o + base + part * hd;
			int64_t p = r % t;
			float c = ld(cs + p * half + j), sv = sign * ld(sn + p * half + j);
			float x1 = ld(xi + j), x2 = ld(xi + j + half);
			st(oi + j, x1 * c - x2 * sv);
			st(oi + j + half, x2 * c + x1 * sv);
		} else {
			int64_t v = base + 2 * hd + (w - hd);
			o[v] = x[v]; /* moved, not converted: bitwise in either storage */
		}
	}
}

/* The same in chunks of eight (half a multiple of 8, every operand 16-byte
 * aligned, ld3 a multiple of 8): one thread per eight pairs of q or k, or
 * eight v elements; 128-bit loads and stores of bf16. */
template <typename T>
__global__ void k_rope8(T *o, const T *x, const T *cs, const T *sn, int64_t rows, int64_t t,
			int64_t ld3, int64_t half, float sign)
{
	/* v's eight elements move as one uint4: 16 bytes, bf16 only */
	static_assert(sizeof(T) == 2, "k_rope8 copies v as eight 2-byte elements");
	int64_t hd = 2 * half, per_row = ld3 / 3 * 2 / 8; /* chunks of eight per row */
	CU_FOR_EACH(i, rows * per_row) {
		int64_t r = i / per_row, k = 8 * (i - r * per_row);
		int64_t h = k / (2 * hd), w = k - h * 2 * hd;
		int64_t base = r * ld3 + 3 * hd * h;
		if (w < hd) {
			int64_t part = w / half, j = w - part * half;
			const T *xi = x + base + part * hd;
			T *oi = o + base + part * hd;
			int64_t p = r % t;
			float c[8], sv[8], x1[8], x2[8], y1[8], y2[8];
			ld8(cs + p * half + j, c);
			ld8(sn + p * half + j, sv);
			ld8(xi + j, x1);
			ld8(xi + j + half, x2);
			for (int q = 0; q < 8; q++) {
				sv[q] = sign * sv[q];
				y1[q] = x1[q] * c[q] - x2[q] * sv[q];
				y2[q] = x2[q] * c[q] + x1[q] * sv[q];
			}
			st8(oi + j, y1);
			st8(oi + j + half, y2);
		} else {
			int64_t v = base + 2 * hd + (w - hd);
			*(uint4 *)(o + v) = *(const uint4 *)(x + v);
		}
	}
}

template <typename T> static int run_rope_t(const CuArgs *a, RtErr *e)
{
	const DpTensor *tq = cu_t(a, 0), *tc = cu_t(a, 1);
	int64_t rows = tq->dims[0] * tq->dims[1], half = tc->dims[1];
	T *o = (T *)cu_p(a, -1);
	const T *x = (const T *)cu_p(a, 0), *cs = (const T *)cu_p(a, 1), *sn = (const T *)cu_p(a, 2);
	if (rows <= 0 || half <= 0)
		return 0;
	float sign = DP_ATTR(a->in, ROPE, inverse) ? -1.0f : 1.0f;
	int64_t pairs = rows * tq->dims[2] / 3 * 2;
	int vec = 0; /* the 128-bit walk: bf16 only (k_rope8 moves v as 2-byte elements) */
	if constexpr (sizeof(T) == 2) {
		vec = half % 8 == 0 && tq->dims[2] % 8 == 0 && cu_vec8<T>(half, o, x, cs, sn);
		if (vec)
			CU_LAUNCH(k_rope8<T>, cu_grid(pairs / 8), CU_THREADS, a->st, o, x, cs, sn, rows,
				  tq->dims[1], tq->dims[2], half, sign);
	}
	if (!vec)
		CU_LAUNCH(k_rope<T>, cu_grid(pairs), CU_THREADS, a->st, o, x, cs, sn, rows,
			  tq->dims[1], tq->dims[2], half, sign);
	CU_LAUNCHED(a, e);
	return 0;
}

static int run_rope(const CuArgs *a, RtErr *e)
{
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_F16 ? run_rope_t<__half>(a, e)
	       : dt == DP_BF16 ? run_rope_t<cu_bf16>(a, e) : run_rope_t<float>(a, e);
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_seq_rows[] = {
	{DP_OP_SOFTMAX, run_softmax, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SOFTMAX_GRAD, run_softmax, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_ROPE, run_rope, NULL, 1, NULL, NULL, 0, 1},
	{},
};
