/*
 * norm.cu - the CUDA kernels of layernorm and rmsnorm over the last dim (the
 * CPU's runtime/cpu/norm.c): forward, dx, the gamma gradient, and gamma's
 * and beta's gradients in one pass (layernorm_grad_gb, below).
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
 *
 * bf16 (precision bf16): every kernel is templated on the storage of its
 * operands (the gamma gradient's output may be f32 beside bf16 inputs) and
 * computes exactly as the f32 kernel does on the widened values, each
 * stored element rounded once: what staging gave. When the row length is a
 * multiple of 8 and the operands 16-byte aligned, a thread walks its row in
 * chunks of eight (128-bit loads and stores, cu_row_threads_w threads);
 * that regroups the double partial sums of the statistics among threads
 * (~1e-16 relative), so a result may move by 1 bf16 ulp where its f32 value
 * straddles a rounding boundary by less than that (~2^-29 per element).
 * f16 (precision fp16) the same, on __half.
 *
 * A norm's dx and its gamma (and beta) gradient in one kernel when the
 * backend pairs the two instructions at load (cu_plan_norm, k_norm_bwd_gb:
 * below).
 *
 * The residual add fused into the layernorm or rmsnorm (passes/fuse.c):
 * add_layernorm (add_rmsnorm: the same kernel's rms row, no beta) stores
 * s = x + res (rounded to the storage type) into the first half of its
 * output and the norm of the stored s into the second, in one launch
 * (k_add_norm_fwd); layernorm_grad_add (rmsnorm_grad_add) is dx
 * (k_norm_bwd) rounded to the storage type, + the residual's gradient,
 * before the one store. Both are the unfused pair's arithmetic in its
 * order: the CPU's to within the norm kernels' own 1 ulp
 * (tests/cuda_emu.sh).
 */
#include <stdlib.h>
#include <string.h>

#include "device.cuh"

/* mean and rstd of one row (every thread gets them); rms: mean 0. Chunks of
 * W elements (W = 8: 128-bit loads of bf16). */
template <int W, typename T>
static __device__ void row_stats(int rms, const T *x, int64_t c, double eps, double *sh,
				 double *mean, double *rstd)
{
	double m = 0;
	if (!rms) {
		double s = 0;
		const int stride = MUTANT(bf16_stride) ? 1 : W;
		for (int64_t j = W * threadIdx.x; j < c; j += stride * blockDim.x) {
			float xv[W];
			ldw<W>(x + j, xv);
			for (int k = 0; k < W; k++)
				s += xv[k];
		}
		m = block_sum<double>(s, sh) / (double)c;
	}
	double q = 0;
	for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
		float xv[W];
		ldw<W>(x + j, xv);
		for (int k = 0; k < W; k++) {
			double d = (double)xv[k] - m;
			q += d * d;
		}
	}
	q = block_sum<double>(q, sh);
	*mean = m;
	*rstd = 1.0 / sqrt(q / (double)c + eps);
}

/* The forward of one row xr into orow (the block's threads): in {x, g, b}
 * (rms: no b). */
template <int W, typename T>
static __device__ void norm_row_fwd(int rms, T *orow, const T *xr, const T *g, const T *b,
				    int64_t c, double eps, double *sh)
{
	double mean, rstd;
	row_stats<W>(rms, xr, c, eps, sh, &mean, &rstd);
	for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
		float xv[W], gv[W], bv[W], ov[W];
		ldw<W>(xr + j, xv);
		ldw<W>(g + j, gv);
		if (!rms)
			ldw<W>(b + j, bv);
		for (int k = 0; k < W; k++) {
			float xh = (float)(((double)xv[k] - mean) * rstd);
			ov[k] = rms ? xh * gv[k] : xh * gv[k] + bv[k];
		}
		stw<W>(orow + j, ov);
	}
}

/* forward: in {x, g, b} (rms: no b) */
template <int W, typename T>
__global__ void k_norm_fwd(int rms, T *o, const T *x, const T *g, const T *b, int64_t rows,
			   int64_t c, double eps)
{
	__shared__ double sh[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		norm_row_fwd<W>(rms, o + r * c, x + r * c, g, b, c, eps, sh);
}

/* add_layernorm: in {x, res, g, b}; add_rmsnorm (rms): in {x, res, g}, no
 * b; out [2, rows, c]. Row r's sum s = x + res is stored (rounded to T) at
 * o + r c, and the norm of the stored s at o + (rows + r) c: the add
 * kernel's and the norm's arithmetic, one launch; the row is read back from
 * L1/L2, not from another kernel's output in HBM. */
template <int W, typename T>
__global__ void k_add_norm_fwd(int rms, T *o, const T *x, const T *res, const T *g, const T *b,
			       int64_t rows, int64_t c, double eps)
{
	__shared__ double sh[32];
	/* (a mutant per norm: each caught by a model with that norm) */
	const bool drop = rms ? MUTANT(add_rms_no_residual) : MUTANT(add_norm_no_residual);
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *xr = x + r * c, *rr = res + r * c;
		T *srow = o + r * c;
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float xv[W], rv[W];
			ldw<W>(xr + j, xv);
			ldw<W>(rr + j, rv);
			for (int k = 0; k < W; k++)
				xv[k] = drop ? xv[k] : xv[k] + rv[k];
			stw<W>(srow + j, xv);
		}
		__syncthreads(); /* the stored row, whichever thread wrote it */
		norm_row_fwd<W>(rms, o + (rows + r) * c, srow, g, b, c, eps, sh);
	}
}

/* v as stored in T and loaded again */
template <typename T> static __device__ __forceinline__ float as_stored(float v)
{
	T t;
	st(&t, v);
	return ld(&t);
}

/* dx: in {dy, x, g}; layernorm_grad_add and rmsnorm_grad_add: in {dy, x, g,
 * res}, dx as stored (rounded to T) + res, the accum's arithmetic */
template <int W, typename T>
__global__ void k_norm_bwd(int rms, T *o, const T *dy, const T *x, const T *g, const T *res,
			   int64_t rows, int64_t c, double eps)
{
	__shared__ double sh[32];
	const bool drop = rms ? MUTANT(rms_grad_no_residual) : MUTANT(norm_grad_no_residual);
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *xr = x + r * c, *dr = dy + r * c;
		T *orow = o + r * c;
		double mean, rstd, sg = 0, sgx = 0;
		row_stats<W>(rms, xr, c, eps, sh, &mean, &rstd);
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float xv[W], dv[W], gv[W];
			ldw<W>(xr + j, xv);
			ldw<W>(dr + j, dv);
			ldw<W>(g + j, gv);
			for (int k = 0; k < W; k++) {
				double gd = (double)dv[k] * gv[k];
				sg += gd;
				sgx += gd * ((double)xv[k] - mean) * rstd;
			}
		}
		sg = block_sum<double>(sg, sh);
		sgx = block_sum<double>(sgx, sh);
		sg = rms ? 0 : sg / (double)c;
		sgx /= (double)c;
		for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
			float xv[W], dv[W], gv[W], ov[W];
			ldw<W>(xr + j, xv);
			ldw<W>(dr + j, dv);
			ldw<W>(g + j, gv);
			for (int k = 0; k < W; k++) {
				double xh = ((double)xv[k] - mean) * rstd;
				ov[k] = (float)(rstd * ((double)dv[k] * gv[k] - sg - xh * sgx));
			}
			if (res && !drop) {
				float rv[W];
				ldw<W>(res + r * c + j, rv);
				for (int k = 0; k < W; k++)
					ov[k] = as_stored<T>(ov[k]) + rv[k];
			}
			stw<W>(orow + j, ov);
		}
	}
}

/*
 * A warp per row (16-bit rows of c <= NW_MAX elements, c a multiple of 8,
 * 16-byte aligned operands): layernorm, add_layernorm, layernorm_grad,
 * layernorm_grad_add and their rmsnorm forms. Lane l holds chunks l,
 * l + 32, ... of eight (16 bytes) in registers: the row is read from
 * memory once, every reduction is the warp's butterfly (in double, as
 * block_sum's), and no barrier is taken. The per-element expressions are
 * the block kernels' (above); only the double sums' tree differs (~1e-16
 * relative): the same 1 ulp of the CPU.
 *
 * Why (GPT-2 124M on the H200, 16384 rows of 768): the block kernels ran
 * 96 threads a row (a chunk each) with four block_sums of three barriers
 * and two or three walks of the row each: add_layernorm 43 us and
 * layernorm_grad_add 67 us a launch against 21 us of bytes (100 MB at 4.8
 * TB/s), latency-bound. A warp per row has 8 rows a block of 256 and 64
 * warps an SM in flight, each with its loads issued at once.
 */
#define NW_CHUNKS 4                  /* chunks of eight a lane holds, at most */
#define NW_MAX (32 * 8 * NW_CHUNKS) /* the longest row: 1024 */

/* The first element of a lane's chunk i (bf16_stride: the lane's chunk
 * number taken as an element offset, the scalar walk's stride: a wrong walk) */
static __device__ __forceinline__ int64_t wcol(int lane, int i)
{
	return MUTANT(bf16_stride) ? lane + 32 * i : (int64_t)(lane + 32 * i) * 8;
}

/* The row's mean and rstd from the lane's NC packed chunks w (those q < nq).
 * The row stays packed (16-bit) in registers and is widened at each use: 4
 * registers a chunk, not 8 (GPT-2's 768: NC = 3). */
template <typename T, int NC>
static __device__ __forceinline__ void warp_row_stats(int rms, const uint4 *w, int nq, int64_t c,
						      double eps, double *mean, double *rstd)
{
	int lane = threadIdx.x & 31;
	double m = 0, q = 0;
	if (!rms) {
		double s = 0;
CU_UNROLL
		for (int i = 0; i < NC; i++)
			if (lane + 32 * i < nq) {
				float v[8];
				unpack8<T>(w[i], v);
				for (int k = 0; k < 8; k++)
					s += v[k];
			}
		m = warp_sum(s) / (double)c;
	}
CU_UNROLL
	for (int i = 0; i < NC; i++)
		if (lane + 32 * i < nq) {
			float v[8];
			unpack8<T>(w[i], v);
			for (int k = 0; k < 8; k++) {
				double d = (double)v[k] - m;
				q += d * d;
			}
		}
	q = warp_sum(q);
	*mean = m;
	*rstd = 1.0 / sqrt(q / (double)c + eps);
}

/* forward: o = norm(s) with s = x (res NULL) or x + res rounded to T and
 * stored at so (add_layernorm's first half); NC chunks a lane */
template <typename T, int NC>
__global__ void __launch_bounds__(CU_THREADS)
k_norm_fwd_w(int rms, T *o, T *so, const T *x, const T *res, const T *g, const T *b, int64_t rows,
	     int64_t c, double eps)
{
	const bool drop = rms ? MUTANT(add_rms_no_residual) : MUTANT(add_norm_no_residual);
	int lane = threadIdx.x & 31, nw = blockDim.x >> 5, nq = (int)(c / 8);
	for (int64_t r = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5); r < rows;
	     r += (int64_t)gridDim.x * nw) {
		uint4 w[NC] = {};
CU_UNROLL
		for (int i = 0; i < NC; i++) {
			int q = lane + 32 * i;
			if (q >= nq)
				continue;
			w[i] = *(const uint4 *)(x + r * c + wcol(lane, i));
			if (res) {
				float v[8], rv[8];
				unpack8<T>(w[i], v);
				ld8(res + r * c + q * 8, rv);
				for (int k = 0; k < 8; k++)
					v[k] = drop ? v[k] : v[k] + rv[k];
				w[i] = pack8<T>(v); /* rounded once, as stored */
				*(uint4 *)(so + r * c + q * 8) = w[i];
			}
		}
		double mean, rstd;
		warp_row_stats<T, NC>(rms, w, nq, c, eps, &mean, &rstd);
CU_UNROLL
		for (int i = 0; i < NC; i++) {
			int q = lane + 32 * i;
			if (q >= nq)
				continue;
			float v[8], gv[8], bv[8], ov[8];
			unpack8<T>(w[i], v);
			ld8(g + q * 8, gv);
			if (!rms)
				ld8(b + q * 8, bv);
			for (int k = 0; k < 8; k++) {
				float xh = (float)(((double)v[k] - mean) * rstd);
				ov[k] = rms ? xh * gv[k] : xh * gv[k] + bv[k];
			}
			st8(o + r * c + q * 8, ov);
		}
	}
}

/* Where a warp's partial sum of column j lies in its shared slice (the
 * fused backward's gamma and beta sums, below): W = 8, a lane's chunk of
 * eight columns spread over eight runs of c / 8, so that the 32 lanes'
 * k-th columns are 32 consecutive doubles (no bank conflicts); W = 1 as is. */
template <int W> static __device__ __forceinline__ int64_t gb_slot(int64_t j, int64_t c)
{
	if constexpr (W == 8)
		return (j & 7) * (c >> 3) + (j >> 3);
	else
		return j;
}

/* The dx row functions' per-element steps (k_norm_bwd's expressions), for
 * W elements from column j: the dot products' terms dy g and dy g xh; dx
 * (rounded to float), and with GB the gamma terms dy xh (layernorm_grad_gb's
 * expression) and beta's dy added into gsh at gb_slot<W>; the residual
 * added to dx as stored */
template <int W>
static __device__ __forceinline__ void bwd_dots(const float *v, const float *dv, const float *gv,
						double mean, double rstd, double *sg, double *sgx)
{
	for (int k = 0; k < W; k++) {
		double gd = (double)dv[k] * gv[k];
		*sg += gd;
		*sgx += gd * ((double)v[k] - mean) * rstd;
	}
}
template <int W, bool GB>
static __device__ __forceinline__ void bwd_out(const float *v, const float *dv, const float *gv,
					       double mean, double rstd, double sg, double sgx,
					       float *ov, double *gsh, int64_t j, int64_t c, int beta)
{
	for (int k = 0; k < W; k++) {
		double xh = ((double)v[k] - mean) * rstd;
		ov[k] = (float)(rstd * ((double)dv[k] * gv[k] - sg - xh * sgx));
		if constexpr (GB) {
			int64_t sl = gb_slot<W>(j + k, c);
			gsh[sl] += (double)dv[k] * xh;
			if (beta)
				gsh[c + sl] += dv[k];
		}
	}
}
template <int W, typename T>
static __device__ __forceinline__ void bwd_res(float *ov, const float *rv)
{
	for (int k = 0; k < W; k++)
		ov[k] = as_stored<T>(ov[k]) + rv[k];
}

/* dx of row r (+ res as k_norm_bwd) with x and dy packed in registers; NC
 * chunks a lane. GB: the row's gamma terms dy * xh (and, beta, dy) are also
 * added into the warp's shared slice gsh (gb_slot<8>: gamma's at [0, c),
 * beta's at [c, 2c)), in double, the warp's rows one after another. */
template <typename T, int NC, bool GB>
static __device__ __forceinline__ void norm_bwd_row_w(int rms, T *o, const T *dy, const T *x,
						      const T *g, const T *res, int64_t r,
						      int64_t c, double eps, bool drop,
						      double *gsh, int beta)
{
	int lane = threadIdx.x & 31, nq = (int)(c / 8);
	uint4 xw[NC] = {}, dw[NC] = {};
CU_UNROLL
	for (int i = 0; i < NC; i++) {
		int q = lane + 32 * i;
		if (q >= nq)
			continue;
		xw[i] = *(const uint4 *)(x + r * c + wcol(lane, i));
		dw[i] = *(const uint4 *)(dy + r * c + q * 8);
	}
	double mean, rstd, sg = 0, sgx = 0;
	warp_row_stats<T, NC>(rms, xw, nq, c, eps, &mean, &rstd);
CU_UNROLL
	for (int i = 0; i < NC; i++) {
		int q = lane + 32 * i;
		if (q >= nq)
			continue;
		float v[8], dv[8], gv[8];
		unpack8<T>(xw[i], v);
		unpack8<T>(dw[i], dv);
		ld8(g + q * 8, gv);
		bwd_dots<8>(v, dv, gv, mean, rstd, &sg, &sgx);
	}
	sg = warp_sum(sg);
	sgx = warp_sum(sgx);
	sg = rms ? 0 : sg / (double)c;
	sgx /= (double)c;
CU_UNROLL
	for (int i = 0; i < NC; i++) {
		int q = lane + 32 * i;
		if (q >= nq)
			continue;
		float v[8], dv[8], gv[8], ov[8];
		unpack8<T>(xw[i], v);
		unpack8<T>(dw[i], dv);
		ld8(g + q * 8, gv);
		bwd_out<8, GB>(v, dv, gv, mean, rstd, sg, sgx, ov, gsh, (int64_t)q * 8, c, beta);
		if (res && !drop) {
			float rv[8];
			ld8(res + r * c + q * 8, rv);
			bwd_res<8, T>(ov, rv);
		}
		st8(o + r * c + q * 8, ov);
	}
}

/* dx (+ res as k_norm_bwd) with x and dy packed in registers; NC chunks a lane */
template <typename T, int NC>
__global__ void __launch_bounds__(CU_THREADS)
k_norm_bwd_w(int rms, T *o, const T *dy, const T *x, const T *g, const T *res, int64_t rows,
	     int64_t c, double eps)
{
	const bool drop = rms ? MUTANT(rms_grad_no_residual) : MUTANT(norm_grad_no_residual);
	int nw = blockDim.x >> 5;
	for (int64_t r = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5); r < rows;
	     r += (int64_t)gridDim.x * nw)
		norm_bwd_row_w<T, NC, false>(rms, o, dy, x, g, res, r, c, eps, drop, (double *)0, 0);
}

/* The warp-per-row kernels' launch: 8 rows a block of 256, the kernel
 * instantiated for the chunks a lane holds (NC = 1..4) */
static unsigned warp_row_grid(int64_t rows)
{
	int64_t b = (rows + 7) / 8;
	return (unsigned)(b < CU_MAX_GRID ? (b > 0 ? b : 1) : CU_MAX_GRID);
}

#define WARP_ROW_LAUNCH(K, T, rows, c, ...)                                                   \
	do {                                                                                  \
		int nc_ = (int)(((c) / 8 + 31) / 32);                                         \
		if (nc_ <= 1)                                                                 \
			CU_LAUNCH((K<T, 1>), warp_row_grid(rows), CU_THREADS, a->st, __VA_ARGS__); \
		else if (nc_ == 2)                                                            \
			CU_LAUNCH((K<T, 2>), warp_row_grid(rows), CU_THREADS, a->st, __VA_ARGS__); \
		else if (nc_ == 3)                                                            \
			CU_LAUNCH((K<T, 3>), warp_row_grid(rows), CU_THREADS, a->st, __VA_ARGS__); \
		else                                                                          \
			CU_LAUNCH((K<T, 4>), warp_row_grid(rows), CU_THREADS, a->st, __VA_ARGS__); \
	} while (0)

/* mean and rstd of the row xr by one warp walking it (lane's chunks of W at
 * W lane + 32 W t; rms: mean 0): row_stats' sums with warp butterflies.
 * (bf16_stride as in row_stats: this walk, not row_stats, is the gamma
 * gradient's statistics since layernorm_grad_gb, and the paired norm
 * backward's rows longer than NW_MAX) */
template <int W, typename T>
static __device__ __forceinline__ void warp_walk_stats(int rms, const T *xr, int64_t c, double eps,
						       double *mean, double *rstd)
{
	int lane = threadIdx.x & 31;
	const int stride = MUTANT(bf16_stride) ? 1 : W;
	double m = 0, q = 0;
	if (!rms) {
		double s = 0;
		for (int64_t j = W * lane; j < c; j += 32 * stride) {
			float xv[W];
			ldw<W>(xr + j, xv);
			for (int k = 0; k < W; k++)
				s += xv[k];
		}
		m = warp_sum(s) / (double)c;
	}
	for (int64_t j = W * lane; j < c; j += 32 * stride) {
		float xv[W];
		ldw<W>(xr + j, xv);
		for (int k = 0; k < W; k++) {
			double d = (double)xv[k] - m;
			q += d * d;
		}
	}
	q = warp_sum(q);
	*mean = m;
	*rstd = 1.0 / sqrt(q / (double)c + eps);
}

/* gamma gradient, stage 0: stats[2r] = mean, stats[2r + 1] = rstd */
template <int W, typename T>
__global__ void k_norm_stats(int rms, const T *x, int64_t rows, int64_t c, double eps,
			     double *stats)
{
	__shared__ double sh[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		double mean, rstd;
		row_stats<W>(rms, x + r * c, c, eps, sh, &mean, &rstd);
		if (threadIdx.x == 0) {
			stats[2 * r] = mean;
			stats[2 * r + 1] = rstd;
		}
	}
}

/* stage 1's term: dy * xh with the row's statistics from stage 0 */
template <typename T> struct NormGTerm {
	const T *dy, *x;
	const double *stats;
	int64_t c;
	__device__ double operator()(int64_t r, int64_t j) const
	{
		return (double)ld(dy + r * c + j) *
		       (((double)ld(x + r * c + j) - stats[2 * r]) * stats[2 * r + 1]);
	}
};

/*
 * layernorm_grad_gb: gamma's and beta's gradients in one pass over the rows
 * (both [c], out [2, c]). Stage 1 (k_norm_gb_part): block b takes chunk b
 * of the rows (gb_chunk_rows: at least 32, at most 1024 chunks); its 4
 * warps (GB_THREADS) compute the chunk's row statistics (a warp per row, row_stats' two
 * passes with warp butterflies in double) into scratch, then each thread
 * sums its W columns over the chunk's rows in row order, dy * xh and dy,
 * in double: part[b][0, c) gamma's, part[b][c, 2c) beta's. dy and x are
 * read once from memory (the statistics pass leaves the chunk in L1/L2
 * for the sums). Stage 2: cu_colsum's final stage over the 2c columns:
 * the chunks in order, + out when accumulating, rounded once. The
 * partition is the shape's alone, no atomics: deterministic; the CPU's
 * (row-order sums) to within layernorm_grad_g's and bias_grad's 1 ulp.
 */
template <int W, typename T>
__global__ void k_norm_gb_part(const T *dy, const T *x, int64_t rows, int64_t c, int64_t per,
			       double eps, double *stats, double *part)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	int64_t lo = blockIdx.x * per, hi = lo + per < rows ? lo + per : rows;
	for (int64_t r = lo + warp; r < hi; r += nw) {
		const T *xr = x + r * c;
		if constexpr (W == 8 && sizeof(T) == 2) if (c <= NW_MAX) { /* the row in registers, one read */
			uint4 w[NW_CHUNKS];
			int nq = (int)(c / 8);
CU_UNROLL
			for (int i = 0; i < NW_CHUNKS; i++)
				if (lane + 32 * i < nq)
					w[i] = *(const uint4 *)(xr + wcol(lane, i));
			double mean, rstd;
			warp_row_stats<T, NW_CHUNKS>(0, w, nq, c, eps, &mean, &rstd);
			if (lane == 0) {
				stats[2 * r] = mean;
				stats[2 * r + 1] = rstd;
			}
			continue;
		}
		double m, rs;
		warp_walk_stats<W>(0, xr, c, eps, &m, &rs);
		if (lane == 0) {
			stats[2 * r] = m;
			stats[2 * r + 1] = rs;
		}
	}
	__syncthreads(); /* the chunk's statistics, whichever warp wrote them */
	double *pg = part + blockIdx.x * 2 * c, *pb = pg + c;
	const bool drop = MUTANT(norm_gb_beta) && blockIdx.x == 1; /* a chunk's beta lost */
	for (int64_t j = W * threadIdx.x; j < c; j += W * blockDim.x) {
		double sg[W], sb[W];
		for (int k = 0; k < W; k++)
			sg[k] = sb[k] = 0;
CU_UNROLL4
		for (int64_t r = lo; r < hi; r++) {
			float dv[W], xv[W];
			ldw<W>(dy + r * c + j, dv);
			ldw<W>(x + r * c + j, xv);
			double m = stats[2 * r], rs = stats[2 * r + 1];
			for (int k = 0; k < W; k++) {
				sg[k] += (double)dv[k] * (((double)xv[k] - m) * rs);
				sb[k] += dv[k];
			}
		}
		for (int k = 0; k < W; k++) {
			pg[j + k] = sg[k];
			pb[j + k] = drop ? 0.0 : sb[k];
		}
	}
}

/* Stage 2: o[j] (+)= the sum of the chunks' partials of column j (2c
 * columns: gamma's, beta's). A block of 32 columns x 32 warps: warp w sums
 * chunks w, w + 32, ... in order, then warp 0 the 32 sums in warp order: a
 * fixed tree (the shape's alone), rounded once. (k_colsum_final, one thread
 * per column walking all 512 chunks of GPT-2's 16384 rows, took most of
 * the 77 us a launch on the H200: 1536 threads, 512 dependent loads each.) */
#define GB_FINAL_WARPS 32
template <typename TO>
__global__ void __launch_bounds__(32 * GB_FINAL_WARPS)
k_gb_final(TO *o, const double *part, int64_t c2, int64_t chunks, int accumulate)
{
	__shared__ double sh[GB_FINAL_WARPS][32];
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	int64_t j = (int64_t)blockIdx.x * 32 + lane;
	double s = 0;
	if (j < c2)
CU_UNROLL4
		for (int64_t ch = w; ch < chunks; ch += GB_FINAL_WARPS)
			s += part[ch * c2 + j];
	sh[w][lane] = s;
	__syncthreads();
	if (w == 0 && j < c2) {
		double t = 0;
		for (int k = 0; k < GB_FINAL_WARPS; k++)
			t += sh[k][lane];
		st(o + j, (float)(accumulate ? (double)ld(o + j) + t : t));
	}
}

/* k_norm_gb_part's block: 4 warps. Its column phase takes c / W threads
 * (96 at GPT-2's 768): with 256 threads 160 of them idled there, and at 80
 * registers 3 blocks an SM held GPT-2's 512 chunks in 1.3 waves (a tail
 * round of one block an SM). At 128 threads an SM holds 6 (registers): the
 * 512 chunks in one wave, twice the column phase's warps an SM. The
 * chunks, their rows and every sum's order are the shape's, as before:
 * bitwise the 256-thread launch. */
#define GB_THREADS 128

/* Rows per chunk of k_norm_gb_part: 32, or more so that there are at most
 * 1024 chunks (the partials' scratch). From the shape only. */
static int64_t gb_chunk_rows(int64_t rows)
{
	int64_t per = (rows + 1023) / 1024;
	return per < 32 ? 32 : per;
}

static unsigned row_grid(int64_t rows)
{
	return (unsigned)(rows < CU_MAX_GRID ? (rows > 0 ? rows : 1) : CU_MAX_GRID);
}

/* The launch of kernel K<W, T> for rows of c elements: the 128-bit walk
 * when cu_vec8 allows it for these operands, else the scalar one. */
#define NORM_LAUNCH(K, T, rows, c, vec, ...)                                                 \
	do {                                                                                 \
		if (vec)                                                                     \
			CU_LAUNCH((K<8, T>), row_grid(rows), cu_row_threads_w(c, 8), a->st,  \
				  __VA_ARGS__);                                              \
		else                                                                         \
			CU_LAUNCH((K<1, T>), row_grid(rows), cu_row_threads(c), a->st,       \
				  __VA_ARGS__);                                              \
	} while (0)

/*
 * A norm's backward in one pass (issue 24): dx and the gamma (and beta)
 * gradients from one read of dy and x. cu_plan_norm (below) pairs a dx
 * instruction (layernorm_grad[_add], rmsnorm_grad[_add]) with the
 * layernorm_grad_gb, layernorm_grad_g or rmsnorm_grad_g of the same dy and
 * x after it; the dx instruction runs k_norm_bwd_gb and k_gb_final, the
 * gradient instruction is skipped. Block b owns chunk b of the rows
 * (gb_chunk_rows, as layernorm_grad_gb's chunks), its nw warps (gb_warps:
 * at most 4) the chunk's rows lo + w, lo + w + nw, ...: each warp makes a
 * row's dx exactly as the unpaired kernels do (the register rows of
 * k_norm_bwd_w for 16-bit rows up to NW_MAX, else a walk of the row) and
 * adds the row's dy * xh (and dy) into its own slice of shared memory, nc
 * doubles (2c with beta, c without; GPT-2: 12 KB a warp, 48 KB a block).
 * Then the block's threads sum the warps' slices in warp order into
 * part[b][nc] (the stream's scratch), and k_gb_final sums the chunks in its
 * fixed tree into the gradient (+ itself when acc), rounded once. Every sum
 * is in double in an order fixed by the shape: deterministic, and the
 * CPU's row-order sums to within layernorm_grad_gb's 1 ulp. dx on the
 * register rows is k_norm_bwd_w's bits; the walk's row sums are a warp's
 * butterfly where k_norm_bwd's are a block's: the same 1 ulp of the CPU.
 * Why, and what it should take on the H200: docs/CUDA.md, "LayerNorm's
 * backward in one pass".
 */
#define GB_WARPS 4      /* warps a block of k_norm_bwd_gb, at most */
#define GB_SMEM 49152   /* their slices' bytes, at most (no opt-in needed) */
/* Warps a block must hold for cu_plan_norm to pair: at one (a layernorm
 * wider than 1536, an rmsnorm wider than 3072, e.g. Llama 7B's 4096: a
 * 32 KB slice) at most 7 warps an SM would run the rows, under half of
 * GPT-2's 16; those keep the unpaired kernels (not measured either way) */
#define GB_MIN_WARPS 2

/* Warps a block of k_norm_bwd_gb for nc columns of sums (0: too long a row
 * for one warp's slice: not paired) */
static int gb_warps(int64_t nc)
{
	int64_t w = nc > 0 ? GB_SMEM / (nc * (int64_t)sizeof(double)) : 0;
	return (int)(w > GB_WARPS ? GB_WARPS : w);
}

/* dx of row r with the warp walking it (lane's chunks of W at W lane +
 * 32 W t: read from memory once, the later sweeps from L1), k_norm_bwd's
 * arithmetic; the row's terms into gsh as norm_bwd_row_w's GB */
template <int W, typename T>
static __device__ void norm_bwd_row_walk(int rms, T *o, const T *dy, const T *x, const T *g,
					 const T *res, int64_t r, int64_t c, double eps, bool drop,
					 double *gsh, int beta)
{
	int lane = threadIdx.x & 31;
	const T *xr = x + r * c, *dr = dy + r * c;
	double m, rstd, sg = 0, sgx = 0;
	warp_walk_stats<W>(rms, xr, c, eps, &m, &rstd);
	for (int64_t j = W * lane; j < c; j += 32 * W) {
		float xv[W], dv[W], gv[W];
		ldw<W>(xr + j, xv);
		ldw<W>(dr + j, dv);
		ldw<W>(g + j, gv);
		bwd_dots<W>(xv, dv, gv, m, rstd, &sg, &sgx);
	}
	sg = warp_sum(sg);
	sgx = warp_sum(sgx);
	sg = rms ? 0 : sg / (double)c;
	sgx /= (double)c;
	for (int64_t j = W * lane; j < c; j += 32 * W) {
		float xv[W], dv[W], gv[W], ov[W];
		ldw<W>(xr + j, xv);
		ldw<W>(dr + j, dv);
		ldw<W>(g + j, gv);
		bwd_out<W, true>(xv, dv, gv, m, rstd, sg, sgx, ov, gsh, j, c, beta);
		if (res && !drop) {
			float rv[W];
			ldw<W>(res + r * c + j, rv);
			bwd_res<W, T>(ov, rv);
		}
		stw<W>(o + r * c + j, ov);
	}
}

/* dx of the chunk's rows and the chunk's partial sums part[b][nc] (gamma's
 * [0, c), beta's [c, 2c) when beta); NC > 0: the register rows (16-bit, W
 * 8), NC = 0: the walk. Dynamic shared memory: nw * nc doubles. */
template <int W, typename T, int NC>
__global__ void __launch_bounds__(32 * GB_WARPS)
k_norm_bwd_gb(int rms, T *o, const T *dy, const T *x, const T *g, const T *res, int64_t rows,
	      int64_t c, double eps, int64_t per, int beta, double *part)
{
	extern __shared__ __align__(16) unsigned char gb_raw[];
	double *sh = (double *)gb_raw;
	const bool drop = rms ? MUTANT(rms_grad_no_residual) : MUTANT(norm_grad_no_residual);
	int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	int64_t nc = beta ? 2 * c : c;
	for (int64_t k = threadIdx.x; k < nw * nc; k += blockDim.x)
		sh[k] = 0;
	__syncthreads();
	double *gsh = sh + warp * nc;
	int64_t lo = blockIdx.x * per, hi = lo + per < rows ? lo + per : rows;
	for (int64_t r = lo + warp; r < hi; r += nw) {
		if constexpr (NC > 0)
			norm_bwd_row_w<T, NC, true>(rms, o, dy, x, g, res, r, c, eps, drop, gsh, beta);
		else
			norm_bwd_row_walk<W>(rms, o, dy, x, g, res, r, c, eps, drop, gsh, beta);
	}
	__syncthreads(); /* every warp's slice, whichever thread sums a column */
	/* (norm_bwd_gb_warp: the last warp's partials lost, its rows' dx kept) */
	const int used = MUTANT(norm_bwd_gb_warp) ? nw - 1 : nw;
	for (int64_t col = threadIdx.x; col < nc; col += blockDim.x) {
		int64_t sl = col < c ? gb_slot<W>(col, c) : c + gb_slot<W>(col - c, c);
		double t = 0;
		for (int w = 0; w < used; w++)
			t += sh[w * nc + sl];
		part[blockIdx.x * nc + col] = t;
	}
}

/* The fused backward's launch, NC chunks a lane when the rows are 16-bit
 * registers' (rows of at most NW_MAX), else the walk */
#define GB_LAUNCH(NC)                                                                        \
	CU_LAUNCH_SMEM((k_norm_bwd_gb<8, T, NC>), (unsigned)chunks, 32 * nw, smem, a->st, rms, o, \
		       dy, x, g, res, rows, c, eps, per, beta, part)

/* dx and the paired instruction's sums (a->fuse->norm_gb); TO: its output */
template <typename T, typename TO>
static int run_bwd_gb_t(const CuArgs *a, int rms, T *o, const T *dy, const T *x, const T *g,
			const T *res, int64_t rows, int64_t c, double eps, int vec, RtErr *e)
{
	const DpInstr *gi = a->fuse->norm_gb;
	int beta = gi->op == DP_OP_LAYERNORM_GRAD_GB, acc = DP_ACC(gi) != 0;
	int64_t nc = beta ? 2 * c : c, per = gb_chunk_rows(rows), chunks = (rows + per - 1) / per;
	int nw = gb_warps(nc);
	size_t smem = (size_t)nw * (size_t)nc * sizeof(double);
	double *part = (double *)a->scratch;
	if (vec && c <= NW_MAX) {
		if constexpr (sizeof(T) == 2) {
			int ncq = (int)((c / 8 + 31) / 32);
			if (ncq <= 1)
				GB_LAUNCH(1);
			else if (ncq == 2)
				GB_LAUNCH(2);
			else if (ncq == 3)
				GB_LAUNCH(3);
			else
				GB_LAUNCH(4);
		}
	} else if (vec) {
		GB_LAUNCH(0);
	} else {
		CU_LAUNCH_SMEM((k_norm_bwd_gb<1, T, 0>), (unsigned)chunks, 32 * nw, smem, a->st, rms, o,
			       dy, x, g, res, rows, c, eps, per, beta, part);
	}
	CU_LAUNCHED(a, e);
	CU_LAUNCH(k_gb_final<TO>, (unsigned)((nc + 31) / 32), 32 * GB_FINAL_WARPS, a->st,
		  (TO *)a->ptr[gi->out], part, nc, chunks, acc);
	CU_LAUNCHED(a, e);
	return 0;
}

template <typename T>
static int run_bwd_gb(const CuArgs *a, int rms, T *o, const T *dy, const T *x, const T *g,
		      const T *res, int64_t rows, int64_t c, double eps, int vec, RtErr *e)
{
	if (dp_is_half(a->s->tensors[a->fuse->norm_gb->out].dtype)) {
		if constexpr (sizeof(T) == 2)
			return run_bwd_gb_t<T, T>(a, rms, o, dy, x, g, res, rows, c, eps, vec, e);
		return RT_FAIL(e, "%s: a 16-bit gamma gradient of f32 rows (norm.cu's pairing)",
			       dp_op_names[a->in->op]);
	}
	return run_bwd_gb_t<T, float>(a, rms, o, dy, x, g, res, rows, c, eps, vec, e);
}

template <typename T> static int run_fwd_t(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t c = cu_cols(t0), rows = cu_rows(t0);
	int rms = a->in->op == DP_OP_RMSNORM;
	T *o = (T *)cu_p(a, -1);
	const T *x = (const T *)cu_p(a, 0), *g = (const T *)cu_p(a, 1);
	const T *b = rms ? (const T *)0 : (const T *)cu_p(a, 2);
	if (rows <= 0 || c <= 0)
		return 0;
	if constexpr (sizeof(T) == 2) if (cu_vec8<T>(c, o, x, g, b) && c <= NW_MAX) {
		WARP_ROW_LAUNCH(k_norm_fwd_w, T, rows, c, rms, o, (T *)0, x, (const T *)0, g, b, rows,
				c, (double)DP_FATTR(a->in, LAYERNORM, eps));
		CU_LAUNCHED(a, e);
		return 0;
	}
	NORM_LAUNCH(k_norm_fwd, T, rows, c, cu_vec8<T>(c, o, x, g, b), rms, o, x, g, b, rows, c,
		    (double)DP_FATTR(a->in, LAYERNORM, eps));
	CU_LAUNCHED(a, e);
	return 0;
}

template <typename T> static int run_add_fwd_t(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t c = cu_cols(t0), rows = cu_rows(t0);
	int rms = a->in->op == DP_OP_ADD_RMSNORM;
	T *o = (T *)cu_p(a, -1);
	const T *x = (const T *)cu_p(a, 0), *res = (const T *)cu_p(a, 1);
	const T *g = (const T *)cu_p(a, 2), *b = rms ? (const T *)0 : (const T *)cu_p(a, 3);
	if (rows <= 0 || c <= 0)
		return 0;
	/* the second half starts rows * c after o: aligned when o and c are */
	int vec = cu_vec8<T>(c, o, x, res, g) && cu_vec8<T>(c, b);
	double eps = (double)DP_FATTR(a->in, ADD_LAYERNORM, eps);
	if constexpr (sizeof(T) == 2) if (vec && c <= NW_MAX) {
		WARP_ROW_LAUNCH(k_norm_fwd_w, T, rows, c, rms, o + rows * c, o, x, res, g, b, rows, c,
				eps);
		CU_LAUNCHED(a, e);
		return 0;
	}
	NORM_LAUNCH(k_add_norm_fwd, T, rows, c, vec, rms, o, x, res, g, b, rows, c, eps);
	CU_LAUNCHED(a, e);
	return 0;
}

/* layernorm_grad, rmsnorm_grad, layernorm_grad_add and rmsnorm_grad_add
 * (in3: the residual's gradient) */
template <typename T> static int run_bwd_t(const CuArgs *a, RtErr *e)
{
	const DpTensor *t1 = cu_t(a, 1);
	int64_t c = cu_cols(t1), rows = cu_rows(t1);
	T *o = (T *)cu_p(a, -1);
	const T *dy = (const T *)cu_p(a, 0), *x = (const T *)cu_p(a, 1), *g = (const T *)cu_p(a, 2);
	unsigned op = a->in->op;
	int rms = op == DP_OP_RMSNORM_GRAD || op == DP_OP_RMSNORM_GRAD_ADD;
	const T *res = op == DP_OP_LAYERNORM_GRAD_ADD || op == DP_OP_RMSNORM_GRAD_ADD
			       ? (const T *)cu_p(a, 3) : (const T *)0;
	if (rows <= 0 || c <= 0)
		return 0;
	int vec = cu_vec8<T>(c, o, dy, x, g) && cu_vec8<T>(c, res);
	double eps = (double)DP_FATTR(a->in, LAYERNORM_GRAD, eps);
	if (a->fuse && a->fuse->norm_gb) /* (cu_plan_norm: rows and c > 0) */
		return run_bwd_gb<T>(a, rms, o, dy, x, g, res, rows, c, eps, vec, e);
	if constexpr (sizeof(T) == 2) if (vec && c <= NW_MAX) {
		WARP_ROW_LAUNCH(k_norm_bwd_w, T, rows, c, rms, o, dy, x, g, res, rows, c, eps);
		CU_LAUNCHED(a, e);
		return 0;
	}
	NORM_LAUNCH(k_norm_bwd, T, rows, c, vec, rms, o, dy, x, g, res, rows, c, eps);
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

/* T: dy and x; TO: the output (f32 or T: operand rule NORM_GRAD_G) */
template <typename T, typename TO> static int run_grad_g_t(const CuArgs *a, RtErr *e)
{
	const DpTensor *t1 = cu_t(a, 1);
	int64_t c = cu_cols(t1), rows = cu_rows(t1);
	int rms = a->in->op == DP_OP_RMSNORM_GRAD_G;
	double *stats = (double *)a->scratch, *part = stats + 2 * rows;
	const T *dy = (const T *)cu_p(a, 0), *x = (const T *)cu_p(a, 1);
	if (c <= 0)
		return 0;
	if (rows > 0) {
		NORM_LAUNCH(k_norm_stats, T, rows, c, cu_vec8<T>(c, x), rms, x, rows, c,
			    (double)DP_FATTR(a->in, LAYERNORM_GRAD_G, eps), stats);
		CU_LAUNCHED(a, e);
	}
	NormGTerm<T> term = {dy, x, stats, c};
	CU_OK(a, cu_colsum(a->st, term, (TO *)cu_p(a, -1), rows, c,
			   DP_ATTR(a->in, LAYERNORM_GRAD_G, acc) != 0, part), e);
	return 0;
}

/* stats (2 per row), then the partials: 2c per chunk */
static size_t scratch_grad_gb(const DpStep *s, const DpInstr *in)
{
	const DpTensor *x = &s->tensors[in->in[1]];
	int64_t c = cu_cols(x), rows = cu_rows(x), per = gb_chunk_rows(rows);
	return (size_t)(2 * rows + (rows + per - 1) / per * 2 * c) * sizeof(double);
}

/* T: dy and x; TO: the output (f32 or T: operand rule NORM_GRAD_GB) */
template <typename T, typename TO> static int run_grad_gb_t(const CuArgs *a, RtErr *e)
{
	const DpTensor *t1 = cu_t(a, 1);
	int64_t c = cu_cols(t1), rows = cu_rows(t1), per = gb_chunk_rows(rows);
	int64_t chunks = (rows + per - 1) / per;
	double *stats = (double *)a->scratch, *part = stats + 2 * rows;
	const T *dy = (const T *)cu_p(a, 0), *x = (const T *)cu_p(a, 1);
	TO *o = (TO *)cu_p(a, -1);
	int acc = DP_ATTR(a->in, LAYERNORM_GRAD_GB, acc) != 0;
	double eps = (double)DP_FATTR(a->in, LAYERNORM_GRAD_GB, eps);
	if (c <= 0)
		return 0;
	if (rows <= 0) { /* no rows: zero sums (out as it is when accumulating) */
		if (!acc)
			CU_OK(a, cudaMemsetAsync(o, 0, (size_t)(2 * c) * sizeof(TO), a->st), e);
		return 0;
	}
	if (cu_vec8<T>(c, dy, x))
		CU_LAUNCH((k_norm_gb_part<8, T>), (unsigned)chunks, GB_THREADS, a->st, dy, x,
			  rows, c, per, eps, stats, part);
	else
		CU_LAUNCH((k_norm_gb_part<1, T>), (unsigned)chunks, GB_THREADS, a->st, dy, x,
			  rows, c, per, eps, stats, part);
	CU_LAUNCHED(a, e);
	CU_LAUNCH(k_gb_final<TO>, (unsigned)((2 * c + 31) / 32), 32 * GB_FINAL_WARPS, a->st, o, part,
		  2 * c, chunks, acc);
	CU_LAUNCHED(a, e);
	return 0;
}

static int run_fwd(const CuArgs *a, RtErr *e)
{
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_F16 ? run_fwd_t<__half>(a, e)
	       : dt == DP_BF16 ? run_fwd_t<cu_bf16>(a, e) : run_fwd_t<float>(a, e);
}

static int run_add_fwd(const CuArgs *a, RtErr *e)
{
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_F16 ? run_add_fwd_t<__half>(a, e)
	       : dt == DP_BF16 ? run_add_fwd_t<cu_bf16>(a, e) : run_add_fwd_t<float>(a, e);
}

static int run_bwd(const CuArgs *a, RtErr *e)
{
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_F16 ? run_bwd_t<__half>(a, e)
	       : dt == DP_BF16 ? run_bwd_t<cu_bf16>(a, e) : run_bwd_t<float>(a, e);
}

template <typename H> static int run_grad_g_half(const CuArgs *a, RtErr *e)
{
	if (dp_is_half(cu_t(a, -1)->dtype))
		return run_grad_g_t<H, H>(a, e);
	return run_grad_g_t<H, float>(a, e);
}

static int run_grad_g(const CuArgs *a, RtErr *e)
{
	if (a->fuse && a->fuse->skip) /* its dx's kernel made the sums (cu_plan_norm) */
		return 0;
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_F16 ? run_grad_g_half<__half>(a, e)
	       : dt == DP_BF16 ? run_grad_g_half<cu_bf16>(a, e) : run_grad_g_t<float, float>(a, e);
}

static int run_grad_gb(const CuArgs *a, RtErr *e)
{
	if (a->fuse && a->fuse->skip) /* its dx's kernel made the sums (cu_plan_norm) */
		return 0;
	unsigned dt = cu_t(a, 0)->dtype, half = dp_is_half(cu_t(a, -1)->dtype);
	if (dt == DP_F16)
		return half ? run_grad_gb_t<__half, __half>(a, e) : run_grad_gb_t<__half, float>(a, e);
	if (dt == DP_BF16)
		return half ? run_grad_gb_t<cu_bf16, cu_bf16>(a, e) : run_grad_gb_t<cu_bf16, float>(a, e);
	return run_grad_gb_t<float, float>(a, e);
}

/* dx's scratch: the fused backward's partial sums when paired (nc doubles
 * a chunk; 2c is the most any pairing needs) */
static size_t scratch_bwd(const DpStep *s, const DpInstr *in)
{
	const DpTensor *x = &s->tensors[in->in[1]];
	int64_t c = cu_cols(x), rows = cu_rows(x), per = gb_chunk_rows(rows);
	return (size_t)((rows + per - 1) / per * 2 * c) * sizeof(double);
}

/* ---- planning: a norm's gradient sums made by its dx's kernel ---- */

static int is_norm_dx(unsigned op)
{
	return op == DP_OP_LAYERNORM_GRAD || op == DP_OP_LAYERNORM_GRAD_ADD ||
	       op == DP_OP_RMSNORM_GRAD || op == DP_OP_RMSNORM_GRAD_ADD;
}

static int overlap(const DpTensor *a, const DpTensor *b)
{
	return a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes;
}

/* Does instruction k read or write any byte of t? */
static int touches(const DpStep *s, const DpInstr *k, const DpTensor *t)
{
	if (k->out >= 0 && overlap(&s->tensors[k->out], t))
		return 1;
	for (int q = 0; q < DP_MAX_IN; q++)
		if (k->in[q] >= 0 && overlap(&s->tensors[k->in[q]], t))
			return 1;
	return 0;
}

/* DP_NORM_GB, read once: unset, empty or "fused" 1 (pair), "apart" 0 (the
 * kit's A/B switch: the two instructions as before), else -1 (refused) */
static int norm_gb_mode = -2;
static int norm_gb_on(void)
{
	int c = cu_env_choice(&norm_gb_mode, "DP_NORM_GB", "fused", "apart");
	return c < 0 ? -1 : !c;
}

/*
 * For each dx instruction of a norm (layernorm_grad[_add] or
 * rmsnorm_grad[_add]) this rank runs: the first later instruction of the
 * program that computes the same norm's gamma gradient from the same dy and
 * x (layernorm_grad_gb or layernorm_grad_g after a layernorm's dx,
 * rmsnorm_grad_g after an rmsnorm's), on the same stream, under the same
 * conditions (DP_IF_*), with the same eps, two warps' slices of its sums
 * fitting a block (gb_warps, GB_MIN_WARPS), not paired already. Its work
 * moves up to the dx: so no instruction between them (of this rank) writes
 * dy or x,
 * reads or writes any byte of the gradient (an optimizer, a collective, a
 * fill; its acc reads it as it would at its place), and no event_wait on
 * their stream lies between (the wait may be for a reader of the
 * gradient's previous bytes on another stream). The dx instruction then
 * makes the sums (k_norm_bwd_gb) and the gradient instruction is skipped:
 * its --trace span stays, empty.
 */
extern "C" int cu_plan_norm(CuPlan *p, RtErr *e)
{
	const DpStep *s = p->s;
	int on = norm_gb_on();
	if (on < 0)
		return RT_FAIL(e, "DP_NORM_GB=%s: expected 'fused' (the default) or 'apart' "
			       "(docs/CUDA.md)", getenv("DP_NORM_GB"));
	if (!on)
		return 0;
	for (int pg = 0; pg < DP_NPROG; pg++)
		for (uint32_t i = 0; i < s->nprog[pg]; i++) {
			const DpInstr *d = &s->prog[pg][i];
			if (!is_norm_dx(d->op) || !cu_plan_runs(p, d))
				continue;
			int rms = d->op == DP_OP_RMSNORM_GRAD || d->op == DP_OP_RMSNORM_GRAD_ADD;
			const DpTensor *dy = &s->tensors[d->in[0]], *x = &s->tensors[d->in[1]];
			int64_t c = cu_cols(x), rows = cu_rows(x);
			if (c <= 0 || rows <= 0)
				continue;
			for (uint32_t j = i + 1; j < s->nprog[pg]; j++) {
				const DpInstr *k = &s->prog[pg][j];
				if (!cu_plan_runs(p, k))
					continue;
				int gop = rms ? k->op == DP_OP_RMSNORM_GRAD_G
					      : k->op == DP_OP_LAYERNORM_GRAD_GB || k->op == DP_OP_LAYERNORM_GRAD_G;
				if (gop && k->in[0] == d->in[0] && k->in[1] == d->in[1]) {
					int64_t nc = k->op == DP_OP_LAYERNORM_GRAD_GB ? 2 * c : c;
					const DpTensor *go = &s->tensors[k->out];
					if (k->stream == d->stream &&
					    (k->flags & DP_IF_ALL) == (d->flags & DP_IF_ALL) &&
					    DP_FATTR(k, LAYERNORM_GRAD_G, eps) == DP_FATTR(d, LAYERNORM_GRAD, eps) &&
					    cu_numel(go) == nc && gb_warps(nc) >= GB_MIN_WARPS &&
					    !p->fuse[pg][j].skip && !overlap(&s->tensors[d->out], go) &&
					    (dp_is_half(go->dtype) ? go->dtype == x->dtype : go->dtype == DP_F32)) {
						p->fuse[pg][i].norm_gb = k;
						p->fuse[pg][j].skip = 1;
					}
					break;
				}
				if (cu_writes(s, k, dy) || cu_writes(s, k, x) ||
				    (k->op == DP_OP_EVENT_WAIT && k->stream == d->stream) ||
				    (gop && (k->in[0] == d->in[0] || k->in[1] == d->in[1])))
					break;
			}
		}
	/* nothing between a pair may touch its gradient: checked once the pairs are known */
	for (int pg = 0; pg < DP_NPROG; pg++)
		for (uint32_t i = 0; i < s->nprog[pg]; i++) {
			const DpInstr *k = p->fuse[pg][i].norm_gb;
			if (!k)
				continue;
			const DpTensor *go = &s->tensors[k->out];
			for (const DpInstr *m = &s->prog[pg][i + 1]; m < k; m++)
				if (cu_plan_runs(p, m) && touches(s, m, go)) {
					p->fuse[pg][i].norm_gb = NULL;
					p->fuse[pg][k - s->prog[pg]].skip = 0;
					break;
				}
		}
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_norm_rows[] = {
	{DP_OP_LAYERNORM, run_fwd, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_LAYERNORM_GRAD, run_bwd, NULL, 1, NULL, scratch_bwd, 0, 1},
	{DP_OP_LAYERNORM_GRAD_G, run_grad_g, NULL, 1, NULL, scratch_grad_g, 0, 1},
	{DP_OP_RMSNORM, run_fwd, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_RMSNORM_GRAD, run_bwd, NULL, 1, NULL, scratch_bwd, 0, 1},
	{DP_OP_RMSNORM_GRAD_G, run_grad_g, NULL, 1, NULL, scratch_grad_g, 0, 1},
	{DP_OP_ADD_LAYERNORM, run_add_fwd, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_LAYERNORM_GRAD_ADD, run_bwd, NULL, 1, NULL, scratch_bwd, 0, 1},
	{DP_OP_ADD_RMSNORM, run_add_fwd, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_RMSNORM_GRAD_ADD, run_bwd, NULL, 1, NULL, scratch_bwd, 0, 1},
	{DP_OP_LAYERNORM_GRAD_GB, run_grad_gb, NULL, 1, NULL, scratch_grad_gb, 0, 1},
	{},
};
