/*
 * device.cuh - what the CUDA kernel files (the .cu files of runtime/cuda) share: the
 * launch macros, launch-error checks, tensor shapes and addresses from a
 * CuArgs, element load/store helpers, and the deterministic block and warp
 * reductions. Only static inline functions and templates: every .cu file
 * gets its own copy (no definitions of globals here).
 *
 * Determinism. Every reduction here combines in a fixed tree that depends
 * only on blockDim (chosen from the tensor shapes, never from the device),
 * so a kernel gives the same bits on every run, eager or replayed, and on
 * every GPU model.
 *
 * Element types. Kernels read and write tensor elements through ld()/st()
 * (and ld4()/st4() for four at once, ld8()/st8() for eight, ldw/stw for a
 * chunk of 1 or 8), in float (or double), whatever the storage: float,
 * cu_bf16 (the bits) or __half (f16; both widened exactly on load, rounded
 * to nearest even on store). Kernels with a bf16 (f16) path are templated
 * on the storage type; the rest run a bf16 (f16) instruction on f32 copies
 * that bf16.cu converts (the CPU's scheme; docs/CUDA.md lists which).
 */
#ifndef DP_CU_DEVICE_CUH
#define DP_CU_DEVICE_CUH

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "kernels.h"
#include "mutant.h"

/* The only two launch forms (a test build may define them otherwise, e.g.
 * a CUDA emulator that runs the kernels on the host). 1-D grids and blocks
 * everywhere: kernels decompose blockIdx.x themselves. */
#ifndef CU_LAUNCH
#define CU_LAUNCH(kernel, grid, block, stream, ...) \
	kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif
#ifndef CU_LAUNCH_SMEM
#define CU_LAUNCH_SMEM(kernel, grid, block, smem, stream, ...) \
	kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

/* Unroll a loop with a constant trip count (nvcc; a host compiler of the
 * same source, e.g. the emulator's, ignores it). */
#ifdef __CUDACC__
#define CU_UNROLL _Pragma("unroll")
#define CU_UNROLL4 _Pragma("unroll 4") /* a variable trip count: 4 iterations' loads at once */
#else
#define CU_UNROLL
#define CU_UNROLL4
#endif

#define CU_THREADS 256     /* default block size */
#define CU_MAX_GRID 4096   /* grid-stride kernels: enough blocks to fill any GPU */
#define CU_FULL_MASK 0xffffffffu

/* Blocks for n elements at CU_THREADS per block, grid-stride beyond CU_MAX_GRID. */
static inline unsigned cu_grid(int64_t n)
{
	int64_t b = (n + CU_THREADS - 1) / CU_THREADS;
	return (unsigned)(b < CU_MAX_GRID ? (b > 0 ? b : 1) : CU_MAX_GRID);
}

#define CU_FOR_EACH(i, n) \
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (int64_t)gridDim.x * blockDim.x)

/* The error of the last launch of instruction a's kernel, as an RtErr. */
#define CU_LAUNCHED(a, e)                                                                   \
	do {                                                                                \
		cudaError_t err_ = cudaGetLastError();                                      \
		if (err_ != cudaSuccess)                                                    \
			return RT_FAIL((e), "%s: %s (%s)", dp_op_names[(a)->in->op],    \
				       cudaGetErrorString(err_), cudaGetErrorName(err_));   \
	} while (0)
/* A CUDA runtime call made for instruction a. */
#define CU_OK(a, call, e)                                                                   \
	do {                                                                                \
		cudaError_t err_ = (call);                                                  \
		if (err_ != cudaSuccess)                                                    \
			return RT_FAIL((e), "%s: %s: %s (%s)", dp_op_names[(a)->in->op], \
				       #call, cudaGetErrorString(err_), cudaGetErrorName(err_)); \
	} while (0)

/* ---- shapes and operands ---- */

static inline int64_t cu_numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}
/* [rows, cols]: the last dim is cols, the leading dims fold into rows. */
static inline int64_t cu_cols(const DpTensor *t) { return t->ndim ? t->dims[t->ndim - 1] : 1; }
static inline int64_t cu_rows(const DpTensor *t)
{
	int64_t c = cu_cols(t);
	return c ? cu_numel(t) / c : 0;
}

/* Operand k (-1: out) of the call: its table entry, NULL when absent. */
static inline const DpTensor *cu_t(const CuArgs *a, int k)
{
	int id = k < 0 ? a->in->out : a->in->in[k];
	return id >= 0 ? &a->s->tensors[id] : (const DpTensor *)0;
}
/* Its device address, NULL when absent. */
static inline void *cu_p(const CuArgs *a, int k)
{
	int id = k < 0 ? a->in->out : a->in->in[k];
	return id >= 0 ? a->ptr[id] : (void *)0;
}
static inline float *cu_f(const CuArgs *a, int k) { return (float *)cu_p(a, k); }

/* 16-byte aligned (a float4 load or store may use it). */
static inline int cu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The per-instruction plan entry (fusions) of the call. */
static inline const CuFuse *cu_fuse(const CuArgs *a) { return a->fuse; }

/* Does instruction k write memory of tensor t? (Every op writes only its
 * out.) For the load-time planners' pairings. */
static inline int cu_writes(const DpStep *s, const DpInstr *k, const DpTensor *t)
{
	const DpTensor *o = k->out >= 0 ? &s->tensors[k->out] : NULL;
	return o && o->offset < t->offset + t->nbytes && t->offset < o->offset + o->nbytes;
}

/* ---- element access: the one place that knows the storage type ---- */

static __device__ __forceinline__ float ld(const float *p) { return *p; }
static __device__ __forceinline__ void st(float *p, float v) { *p = v; }
static __device__ __forceinline__ float4 ld4(const float *p)
{
	return *(const float4 *)p; /* callers check 16-byte alignment */
}
static __device__ __forceinline__ void st4(float *p, float4 v) { *(float4 *)p = v; }

/* bf16 storage (docs/PRECISION.md): the bits of a bfloat16, converted with
 * the CPU's rounding (runtime/cpu/bf16.c, PyTorch's): to nearest even, a NaN
 * stays a quiet NaN with its sign, overflow rounds to infinity. Integer
 * operations only, so every device and the emulator give the CPU's bits. */
typedef uint16_t cu_bf16;
static __device__ __forceinline__ cu_bf16 cu_to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (cu_bf16)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (cu_bf16)(u >> 16);
}
static __device__ __forceinline__ float cu_from_bf16(cu_bf16 b)
{
	return __uint_as_float((uint32_t)b << 16);
}
static __device__ __forceinline__ float ld(const cu_bf16 *p) { return cu_from_bf16(*p); }
static __device__ __forceinline__ void st(cu_bf16 *p, float v) { *p = cu_to_bf16(v); }

/* f16 (precision fp16): runtime/rt.h's integer conversions (F16C's
 * vcvtps2ph / vcvtph2ps bits: nearest even, subnormals, NaN quiet), the
 * same code as the CPU's, so both backends round alike. cu_f16 is the
 * bits; a kernel with an f16 path of its own is instantiated on
 * cuda_fp16.h's __half (a type of its own, so ld/st overload on it: bf16
 * is bits too), read and written through the same conversions: no kernel
 * computes in f16. */
typedef uint16_t cu_f16;
static __device__ __forceinline__ cu_f16 cu_to_f16(float f)
{
	return rt_f16_bits(__float_as_uint(f));
}
static __device__ __forceinline__ float cu_from_f16(cu_f16 h)
{
	return __uint_as_float(rt_f16_f32_bits(h));
}
static __device__ __forceinline__ float ld(const __half *p)
{
	return cu_from_f16(__half_as_ushort(*p));
}
static __device__ __forceinline__ void st(__half *p, float v)
{
	*p = __ushort_as_half(cu_to_f16(v));
}
/* The 16-bit compute copy an optimizer writes: f16 or bf16 (f16 set) */
static __device__ __forceinline__ uint16_t cu_to_half(int f16, float f)
{
	return f16 ? cu_to_f16(f) : cu_to_bf16(f);
}

/* Eight elements at once, 16-byte aligned (callers check): one 128-bit
 * access of eight bf16 or f16, or two float4. */
static __device__ __forceinline__ void ld8(const float *p, float *v)
{
	float4 a = ld4(p), b = ld4(p + 4);
	v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
	v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
/* 16-bit storage H (cu_bf16 or __half): its bits to float and back */
template <typename H> struct CuHalf;
template <> struct CuHalf<cu_bf16> {
	static __device__ __forceinline__ float from(uint16_t b) { return cu_from_bf16(b); }
	static __device__ __forceinline__ uint16_t to(float f) { return cu_to_bf16(f); }
};
template <> struct CuHalf<__half> {
	static __device__ __forceinline__ float from(uint16_t b) { return cu_from_f16(b); }
	static __device__ __forceinline__ uint16_t to(float f) { return cu_to_f16(f); }
};
/* Eight 16-bit values held in a register, as floats (ld8's conversion) */
template <typename H> static __device__ __forceinline__ void unpack8(uint4 w, float *v)
{
	uint32_t u[4] = {w.x, w.y, w.z, w.w};
	for (int k = 0; k < 4; k++) {
		v[2 * k] = CuHalf<H>::from((uint16_t)u[k]);
		v[2 * k + 1] = CuHalf<H>::from((uint16_t)(u[k] >> 16));
	}
}
template <typename H> static __device__ __forceinline__ void ld8(const H *p, float *v)
{
	unpack8<H>(*(const uint4 *)p, v);
}
static __device__ __forceinline__ void st8(float *p, const float *v)
{
	st4(p, make_float4(v[0], v[1], v[2], v[3]));
	st4(p + 4, make_float4(v[4], v[5], v[6], v[7]));
}
/* Eight floats rounded to 16 bits each, packed as st8 stores them */
template <typename H> static __device__ __forceinline__ uint4 pack8(const float *v)
{
	uint32_t u[4];
	for (int k = 0; k < 4; k++)
		u[k] = CuHalf<H>::to(v[2 * k]) | (uint32_t)CuHalf<H>::to(v[2 * k + 1]) << 16;
	return make_uint4(u[0], u[1], u[2], u[3]);
}
template <typename H> static __device__ __forceinline__ void st8(H *p, const float *v)
{
	*(uint4 *)p = pack8<H>(v);
}


/* W elements from p (W = 1: one ld; W = 8: one ld8, p 16-byte aligned) into
 * v, and back: lets one loop body serve the scalar path and the 128-bit
 * one (a kernel templated on W walks a row in chunks of W). */
template <int W, typename T> static __device__ __forceinline__ void ldw(const T *p, float *v)
{
	if constexpr (W == 8)
		ld8(p, v);
	else
		v[0] = ld(p);
}
template <int W, typename T> static __device__ __forceinline__ void stw(T *p, const float *v)
{
	if constexpr (W == 8)
		st8(p, v);
	else
		st(p, v[0]);
}

/* The 128-bit path of a kernel over rows of c elements of T is allowed:
 * bf16 (f32 keeps its scalar order, the one staging and the CPU
 * comparisons were measured with), c a multiple of 8 (every row start
 * 16-byte aligned too) and each given base 16-byte aligned (views and
 * split outputs need not be). NULL pointers are ignored. */
template <typename T>
static inline int cu_vec8(int64_t c, const void *p0, const void *p1 = 0, const void *p2 = 0,
			  const void *p3 = 0)
{
	const void *p[4] = {p0, p1, p2, p3};
	int ok = sizeof(T) == 2 && c % 8 == 0;
	for (int k = 0; k < 4; k++)
		ok = ok && (!p[k] || cu_aligned16(p[k]));
	return ok;
}

/* ---- first error wins: a value from data (a label, a token id, a
 * position) that the CPU would refuse with an error; the backend reads the
 * report after the run and fails with the CPU's message ---- */
static __device__ __forceinline__ void cu_report_error(CuScalars *sc, int kind, int64_t value,
						      int64_t index, int64_t limit)
{
	if (atomicCAS(&sc->err, 0, kind) == 0) {
		sc->err_value = value;
		sc->err_index = index;
		sc->err_limit = limit;
	}
}

/* ---- reductions with a fixed tree ----
 *
 * warp_sum: butterfly over the 32 lanes (every lane gets the same value);
 * block_sum: each warp's butterfly, then warp 0 over the warp results in
 * order; every thread gets the result. blockDim.x must be a multiple of 32
 * (at most 1024); `sh` holds 32 values. */

static __device__ __forceinline__ float shfl_xor(float v, int o)
{
	return __shfl_xor_sync(CU_FULL_MASK, v, o);
}
static __device__ __forceinline__ double shfl_xor(double v, int o)
{
	return __shfl_xor_sync(CU_FULL_MASK, v, o);
}
static __device__ __forceinline__ int shfl_xor(int v, int o)
{
	return __shfl_xor_sync(CU_FULL_MASK, v, o);
}

template <typename V> static __device__ __forceinline__ V warp_sum(V v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += shfl_xor(v, o);
	return v;
}

/* NaN-propagating max (fmaxf would drop a NaN; the CPU's `a > b ? a : b`
 * chain keeps whatever the comparisons say, and a NaN anywhere makes the
 * result unusable either way). */
static __device__ __forceinline__ float max_nan(float a, float b)
{
	return (a != a || b != b) ? __int_as_float(0x7fc00000) : (a > b ? a : b);
}

static __device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = max_nan(v, shfl_xor(v, o));
	return v;
}

template <typename V> static __device__ V block_sum(V v, V *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_sum(v);
	/* One warp: warp 0's pass below would sum v and 31 zeros, which is v + 0
	 * in every lane (the butterfly gives all lanes the same bits); said
	 * directly, without sh and the three barriers. The + 0 keeps the long
	 * form's bits: -0 becomes +0. (A row of <= 32 columns: a fifth of the
	 * emulator's a16 case, issue 20; on hardware three barriers per row.) */
	if (nw == 1)
		return v + (V)0;
	__syncthreads(); /* sh may still be read by a previous call */
	if (lane == 0)
		sh[w] = v;
	if (!MUTANT(no_sync))
		__syncthreads();
	if (w == 0) {
		V x = lane < nw ? sh[lane] : (V)0;
		x = warp_sum(x);
		if (lane == 0)
			sh[0] = x;
	}
	__syncthreads();
	return sh[0];
}

static __device__ __forceinline__ float block_max(float v, float *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	if (w == 0) {
		float x = lane < nw ? sh[lane] : -INFINITY;
		x = warp_max(x);
		if (lane == 0)
			sh[0] = x;
	}
	__syncthreads();
	return sh[0];
}

/* Threads for a block that walks one row of `cols` elements: a multiple of
 * 32, at most CU_THREADS, about 4 elements per thread. From the shape only. */
static inline unsigned cu_row_threads(int64_t cols)
{
	int64_t t = (cols + 3) / 4;
	t = (t + 31) / 32 * 32;
	return (unsigned)(t < 32 ? 32 : t > CU_THREADS ? CU_THREADS : t);
}

/* Threads for a block that walks a row of c elements in chunks of w (1 or
 * 8): w = 1 is cu_row_threads (about four elements per thread); w = 8 about
 * c / 8 threads, one chunk of eight (one 128-bit access) each. From the
 * shape only. */
static inline unsigned cu_row_threads_w(int64_t c, int w)
{
	return cu_row_threads(w == 8 ? c / 2 : c);
}

/* Column sums in two stages (bias and norm gradients): out[j] = (out[j] if
 * accumulating) + sum_r term(r, j), in double, rounded once. Stage 1: a
 * block per (tile of COLSUM_COLS columns, chunk of rows), COLSUM_LANES row
 * lanes combined in order; stage 2: the chunks in order. The rows cut into
 * chunks of about 64, at most 1024 blocks in all. From the shape only. */
#define COLSUM_COLS 32 /* one warp reads 128 contiguous bytes of a row */
#define COLSUM_LANES (CU_THREADS / COLSUM_COLS)
static inline int64_t cu_col_chunks(int64_t rows, int64_t c)
{
	int64_t tiles = (c + COLSUM_COLS - 1) / COLSUM_COLS, most = 1024 / tiles;
	int64_t ch = (rows + 63) / 64;
	if (ch > most)
		ch = most;
	return ch < 1 ? 1 : ch;
}

/* part[ch * c + j] = sum of term(r, j) over chunk ch's rows */
template <class Term>
__global__ void k_colsum_part(Term term, int64_t rows, int64_t c, int64_t chunks, double *part)
{
	__shared__ double sh[COLSUM_LANES][COLSUM_COLS];
	int64_t tiles = (c + COLSUM_COLS - 1) / COLSUM_COLS;
	int64_t tile = blockIdx.x % tiles, ch = blockIdx.x / tiles;
	int64_t per = (rows + chunks - 1) / chunks, lo = ch * per, hi = lo + per < rows ? lo + per : rows;
	int tx = threadIdx.x % COLSUM_COLS, ty = threadIdx.x / COLSUM_COLS;
	int64_t j = tile * COLSUM_COLS + tx;
	double s = 0;
	if (j < c)
		for (int64_t r = lo + ty; r < hi; r += COLSUM_LANES)
			s += term(r, j);
	sh[ty][tx] = s;
	__syncthreads();
	if (ty == 0 && j < c) {
		double t = 0;
		for (int k = 0; k < COLSUM_LANES; k++)
			t += sh[k][tx];
		part[ch * c + j] = t;
	}
}

/* o[j] = (o[j] if accumulating) + the partials in chunk order, rounded once
 * to float, and (bf16 output) once more to bf16: what the f32 kernel on a
 * staged copy gives */
template <typename TO>
__global__ void k_colsum_final(TO *o, const double *part, int64_t c, int64_t chunks,
			       int accumulate)
{
	CU_FOR_EACH(j, c) {
		double s = 0;
		for (int64_t ch = 0; ch < chunks; ch++)
			s += part[ch * c + j];
		st(o + j, (float)(accumulate ? (double)ld(o + j) + s : s));
	}
}

/* Both stages on stream st; part: cu_col_chunks(rows, c) * c doubles. */
template <class Term, typename TO>
static cudaError_t cu_colsum(cudaStream_t st, Term term, TO *o, int64_t rows, int64_t c,
			     int accumulate, double *part)
{
	int64_t chunks = cu_col_chunks(rows, c), tiles = (c + COLSUM_COLS - 1) / COLSUM_COLS;
	if (c <= 0)
		return cudaSuccess;
	CU_LAUNCH(k_colsum_part<Term>, (unsigned)(tiles * chunks), CU_THREADS, st, term, rows, c,
		  chunks, part);
	cudaError_t err = cudaGetLastError();
	if (err != cudaSuccess)
		return err;
	CU_LAUNCH(k_colsum_final<TO>, cu_grid(c), CU_THREADS, st, o, part, c, chunks, accumulate);
	return cudaGetLastError();
}

#endif
