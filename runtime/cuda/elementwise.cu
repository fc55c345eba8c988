/*
 * elementwise.cu - CUDA kernels that compute each output element from the
 * same element of their inputs (the CPU's runtime/cpu/elementwise.c): accum,
 * scale, add, add_scalar, mul, the activations (relu, gelu in its tanh form, tanh,
 * silu, sigmoid) with their gradients, the row broadcast bias_add, and
 * dropout (its mask from runtime/dropout.h, bitwise the CPU's).
 *
 * One functor per op, one kernel template: float arithmetic in the CPU's
 * order, operation for operation. Compiled with -fmad=false (mk/cuda.mk),
 * so nothing is contracted into an FMA the CPU does not do: accum, scale,
 * add, add_scalar, mul, relu, tanh_grad, sigmoid_grad and bias_add are bitwise equal to the CPU. gelu,
 * gelu_grad, tanh, silu, silu_grad and sigmoid call the device's tanhf / expf, which
 * differ from glibc's by at most 2 ulp (CUDA's documented bounds; glibc's
 * are within 1), so those agree to a few ulp per element. No reductions.
 *
 * Four elements at a time (float4) when the element count is a multiple of
 * four and every operand is 16-byte aligned (the planner aligns tensors to
 * 256 bytes, so that is the usual case); otherwise one at a time.
 *
 * bf16 (precision bf16): the maps read and write bf16 themselves, eight
 * elements per thread with 128-bit accesses when aligned, f32 arithmetic,
 * each stored element rounded once to nearest even: bitwise the CPU's bf16
 * maps. bias_add on bf16 likewise: eight elements per thread with 128-bit
 * accesses when the row length is a multiple of 8 and the operands are
 * aligned, else one at a time; one f32 add and one rounding per element,
 * so bitwise what staging gave (the CPU stages it). f16 (precision fp16)
 * takes the same paths on __half (device.cuh), the CPU's f16 bits: one
 * rounding per stored element, bitwise the CPU's staged f32 maps.
 */
#include "device.cuh"
#include "../dropout.h"

/* out = f(a, b, out, s): a = in0, b = in1 (unused when absent), out read
 * only by accum; s is the scalar operand of scale and add_scalar (map_s). */
#define ELEMENTWISE(name, reads_out_, expr)                                          \
	struct name {                                                                 \
		static constexpr int reads_out = reads_out_;                              \
		__device__ __forceinline__ float operator()(float a, float b, float o, \
							    float s) const             \
		{                                                                     \
			return expr;                                                  \
		}                                                                     \
	};

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

static __device__ __forceinline__ float gelu(float x)
{
	return 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));
}

/* in0 = dy, in1 = x */
static __device__ __forceinline__ float gelu_grad(float dy, float x)
{
	float th = tanhf(GELU_S * (x + 0.044715f * x * x * x));
	float du = GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
	return dy * ((MUTANT(gelu_map) ? 1.0f : 0.5f) * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
}

/* silu'(x) = sig(x) * (1 + x * (1 - sig(x))) */
static __device__ __forceinline__ float silu_grad(float dy, float x)
{
	float sg = 1.0f / (1.0f + expf(-x));
	return dy * sg * (1.0f + x * (1.0f - sg));
}

ELEMENTWISE(Accum, 1, o + a)
ELEMENTWISE(Scale, 0, s * a)
ELEMENTWISE(AddScalar, 0, a + s)
ELEMENTWISE(Add, 0, a + b)
ELEMENTWISE(Mul, 0, a * b)
ELEMENTWISE(Relu, 0, a > 0 ? a : 0)
ELEMENTWISE(ReluGrad, 0, b > 0 ? a : 0)
ELEMENTWISE(Gelu, 0, gelu(a))
ELEMENTWISE(GeluGrad, 0, gelu_grad(a, b))
ELEMENTWISE(Tanh, 0, tanhf(a))
ELEMENTWISE(TanhGrad, 0, a * (1.0f - b * b))
ELEMENTWISE(Silu, 0, a / (1.0f + expf(-a)))
ELEMENTWISE(SiluGrad, 0, silu_grad(a, b))
ELEMENTWISE(Sigmoid, 0, 1.0f / (1.0f + expf(-a)))
ELEMENTWISE(SigmoidGrad, 0, a * b * (1.0f - b)) /* dy * y * (1 - y), y the output */

template <class F>
__global__ void k_map(float *o, const float *a, const float *b, int64_t n, float s)
{
	F f;
	CU_FOR_EACH(i, n) {
		float bi = b ? ld(b + i) : 0.0f, oi = F::reads_out ? ld(o + i) : 0.0f;
		st(o + i, f(ld(a + i), bi, oi, s));
	}
}

/* n4 groups of four */
template <class F>
__global__ void k_map4(float *o, const float *a, const float *b, int64_t n4, float s)
{
	F f;
	CU_FOR_EACH(i, n4) {
		float4 x = ld4(a + 4 * i), y = b ? ld4(b + 4 * i) : make_float4(0, 0, 0, 0);
		float4 z = F::reads_out ? ld4(o + 4 * i) : make_float4(0, 0, 0, 0);
		st4(o + 4 * i, make_float4(f(x.x, y.x, z.x, s), f(x.y, y.y, z.y, s),
					   f(x.z, y.z, z.z, s), f(x.w, y.w, z.w, s)));
	}
}

/* 16-bit operands (TO: the output's type, TA: the inputs'; bf16 or f16):
 * f32 arithmetic, one rounding per stored element, so the same bits as the
 * CPU's chunked bf16 maps (and as staging, f16's on the CPU). One at a time, or eight per thread with
 * 128-bit accesses when n8 groups of eight are 16-byte aligned. */
template <class F, typename TO, typename TA>
__global__ void k_map_t(TO *o, const TA *a, const TA *b, int64_t n, float s)
{
	F f;
	CU_FOR_EACH(i, n) {
		float bi = b ? ld(b + i) : 0.0f, oi = F::reads_out ? ld(o + i) : 0.0f;
		st(o + i, f(ld(a + i), bi, oi, s));
	}
}

template <class F, typename TO, typename TA>
__global__ void k_map8(TO *o, const TA *a, const TA *b, int64_t n8, float s)
{
	F f;
	CU_FOR_EACH(i, n8) {
		float x[8], y[8] = {0, 0, 0, 0, 0, 0, 0, 0}, z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
		ld8(a + 8 * i, x);
		if (b)
			ld8(b + 8 * i, y);
		if (F::reads_out)
			ld8(o + 8 * i, z);
		for (int k = 0; k < 8; k++)
			z[k] = f(x[k], y[k], z[k], s);
		st8(o + 8 * i, z);
	}
}

/* The maps' s: the scalar operand of scale and add_scalar (the other maps
 * take none). */
static float map_s(const DpInstr *in)
{
	return in->op == DP_OP_SCALE || in->op == DP_OP_ADD_SCALAR ? DP_SCALAR(in) : 0.0f;
}

template <class F, typename TO, typename TA>
static void launch_map(const CuArgs *a, TO *o, const TA *x, const TA *y, int64_t n)
{
	if (n % 8 == 0 && cu_aligned16(o) && cu_aligned16(x) && (!y || cu_aligned16(y)))
		CU_LAUNCH((k_map8<F, TO, TA>), cu_grid(n / 8), CU_THREADS, a->st, o, x, y, n / 8,
			  map_s(a->in));
	else
		CU_LAUNCH((k_map_t<F, TO, TA>), cu_grid(n), CU_THREADS, a->st, o, x, y, n,
			  map_s(a->in));
}

/* The operand rules: every operand of a map has the output's dtype, except
 * accum's (f32 or 16-bit each: a sum kept in f32 of 16-bit terms, or
 * back). H: the 16-bit type, cu_bf16 or __half. */
template <class F, typename H> static int run_map_half(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	int o16 = dp_is_half(cu_t(a, -1)->dtype), x16 = dp_is_half(cu_t(a, 0)->dtype);
	void *o = cu_p(a, -1), *x = cu_p(a, 0), *y = cu_p(a, 1);
	if (o16 && x16) {
		launch_map<F>(a, (H *)o, (const H *)x, (const H *)y, n);
	} else {
		if constexpr (!F::reads_out)
			return RT_FAIL(e, "%s: mixed f32 and 16-bit operands (the decoder allows none)",
				       dp_op_names[a->in->op]);
		else if (o16)
			launch_map<F>(a, (H *)o, (const float *)x, (const float *)NULL, n);
		else
			launch_map<F>(a, (float *)o, (const H *)x, (const H *)NULL, n);
	}
	CU_LAUNCHED(a, e);
	return 0;
}

template <class F> static int run_map(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	float *o = cu_f(a, -1), *x = cu_f(a, 0), *y = cu_f(a, 1);
	if (n <= 0)
		return 0;
	if (cu_t(a, -1)->dtype == DP_F16 || cu_t(a, 0)->dtype == DP_F16)
		return run_map_half<F, __half>(a, e);
	if (cu_t(a, -1)->dtype == DP_BF16 || cu_t(a, 0)->dtype == DP_BF16)
		return run_map_half<F, cu_bf16>(a, e);
	if (n % 4 == 0 && cu_aligned16(o) && cu_aligned16(x) && (!y || cu_aligned16(y)))
		CU_LAUNCH(k_map4<F>, cu_grid(n / 4), CU_THREADS, a->st, o, x, y, n / 4, map_s(a->in));
	else
		CU_LAUNCH(k_map<F>, cu_grid(n), CU_THREADS, a->st, o, x, y, n, map_s(a->in));
	CU_LAUNCHED(a, e);
	return 0;
}

/* gelu (grad = 0: o = gelu(x)) or gelu_grad (o = x * gelu'(y)) over n
 * f32 elements: gemm.cu's fused f32 GEMMs where cuBLASLt's epilogue is not
 * used (the ops' own kernels) */
int cu_gelu_map(const CuArgs *a, int grad, float *o, const float *x, const float *y, int64_t n,
		RtErr *e)
{
	if (n <= 0)
		return 0;
	if (grad)
		CU_LAUNCH(k_map<GeluGrad>, cu_grid(n), CU_THREADS, a->st, o, x, y, n, 0.0f);
	else
		CU_LAUNCH(k_map<Gelu>, cu_grid(n), CU_THREADS, a->st, o, x, (const float *)NULL, n, 0.0f);
	CU_LAUNCHED(a, e);
	return 0;
}

/* The 16-bit ones (T: cu_bf16, or __half in fp16) from the f32 product v
 * [rows, c] (NULL: zeros): linear_gelu (bias: + bias[col]) h = T(v), g =
 * T(gelu(v)); matmul_gelu_grad (h read) g = T(v * gelu'(h)). cuBLASLt's
 * epilogues' arithmetic, one rounding. */
template <typename T>
__global__ void k_gelu_finish(T *g, T *h, const float *v, const T *bias, int grad, int64_t n,
			      int64_t c)
{
	CU_FOR_EACH(i, n) {
		float x = v ? v[i] : 0.0f; /* NULL: an empty sum */
		if (grad) {
			st(g + i, gelu_grad(x, ld(h + i)));
		} else {
			x += bias ? ld(bias + i % c) : 0.0f;
			st(h + i, x);
			st(g + i, gelu(x));
		}
	}
}

int cu_gelu_finish(const CuArgs *a, int grad, void *g, void *h, const float *v, const void *bias,
		   int64_t n, int64_t c, RtErr *e)
{
	if (n <= 0)
		return 0;
	if (cu_t(a, -1)->dtype == DP_F16)
		CU_LAUNCH(k_gelu_finish<__half>, cu_grid(n), CU_THREADS, a->st, (__half *)g,
			  (__half *)h, v, (const __half *)bias, grad, n, c);
	else
		CU_LAUNCH(k_gelu_finish<cu_bf16>, cu_grid(n), CU_THREADS, a->st, (cu_bf16 *)g,
			  (cu_bf16 *)h, v, (const cu_bf16 *)bias, grad, n, c);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- bias_add: out[r, c] = in0[r, c] + in1[c] ----
 * A block per tile: a row's segment of blockDim.x elements (or groups of
 * 4 or 8), tiles row after row, grid-stride; one group a thread, no
 * per-element division. Until issue 24 a block walked a whole row: GPT-2's
 * position embedding (wpe [1024, 768] added to [16, 1024, 768]: 16 rows of
 * 786,432) ran on 16 blocks, 192 us on the H200 for 52 MB (11 us of
 * bytes); now 6,144 tiles. The arithmetic is unchanged (bitwise). */

/* The block's tiles t = blockIdx.x, + gridDim.x, ...: row r = t / segs and
 * segment seg = t % segs (segs: a row's segments of blockDim.x groups),
 * kept by additions from two divisions a thread, not one per tile (a
 * 64-bit division is tens of integer instructions) */
struct BiasTiles {
	int64_t segs, r, seg, dr, dseg;
	__device__ explicit BiasTiles(int64_t segs_)
		: segs(segs_), r(blockIdx.x / segs_), seg(blockIdx.x % segs_),
		  dr(gridDim.x / segs_), dseg(gridDim.x % segs_)
	{
	}
	__device__ void next()
	{
		r += dr;
		seg += dseg;
		if (seg >= segs) {
			seg -= segs;
			r++;
		}
	}
	/* this thread's group of the tile */
	__device__ int64_t group() const
	{
		return (MUTANT(bias_seg) ? 0 : seg) * blockDim.x + threadIdx.x;
	}
};

template <typename T>
__global__ void k_bias_add(T *o, const T *x, const T *bias, int64_t rows, int64_t c)
{
	for (BiasTiles t((c + blockDim.x - 1) / blockDim.x); t.r < rows; t.next()) {
		int64_t r = t.r, j = t.group();
		if (j < c)
			st(o + r * c + j, ld(x + r * c + j) + ld(bias + j));
	}
}

/* c4 = c / 4 groups per row */
__global__ void k_bias_add4(float *o, const float *x, const float *bias, int64_t rows, int64_t c4)
{
	for (BiasTiles t((c4 + blockDim.x - 1) / blockDim.x); t.r < rows; t.next()) {
		int64_t r = t.r, j = t.group();
		if (j < c4) {
			float4 v = ld4(x + (r * c4 + j) * 4), w = ld4(bias + 4 * j);
			st4(o + (r * c4 + j) * 4, make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w));
		}
	}
}

/* bf16: c8 = c / 8 chunks of eight per row, 128-bit accesses (every
 * operand 16-byte aligned), or one element at a time (k_bias_add<cu_bf16>) */
template <typename T>
__global__ void k_bias_add8(T *o, const T *x, const T *bias, int64_t rows, int64_t c8)
{
	for (BiasTiles t((c8 + blockDim.x - 1) / blockDim.x); t.r < rows; t.next()) {
		int64_t r = t.r, j = t.group();
		if (j < c8) {
			float v[8], w[8];
			ld8(x + (r * c8 + j) * 8, v);
			ld8(bias + 8 * j, w);
			for (int k = 0; k < 8; k++)
				v[k] = v[k] + w[k];
			st8(o + (r * c8 + j) * 8, v);
		}
	}
}

/* The tiles' grid: rows x the segments of a row of `groups` groups in
 * blocks of `threads` (at most CU_MAX_GRID blocks, grid-stride) */
static unsigned bias_grid(int64_t rows, int64_t groups, unsigned threads)
{
	int64_t t = rows * ((groups + threads - 1) / threads);
	return (unsigned)(t < CU_MAX_GRID ? (t > 0 ? t : 1) : CU_MAX_GRID);
}

/* bias_add on 16-bit operands, all three alike (operand rule BIAS_ADD) */
template <typename H>
static int bias_add_half(const CuArgs *a, int64_t rows, int64_t c, RtErr *e)
{
	H *o = (H *)cu_p(a, -1);
	const H *x = (const H *)cu_p(a, 0), *b = (const H *)cu_p(a, 1);
	unsigned t8 = cu_row_threads_w(c, 8), t1 = cu_row_threads(c);
	if (cu_vec8<H>(c, o, x, b))
		CU_LAUNCH(k_bias_add8<H>, bias_grid(rows, c / 8, t8), t8, a->st, o, x, b, rows, c / 8);
	else
		CU_LAUNCH(k_bias_add<H>, bias_grid(rows, c, t1), t1, a->st, o, x, b, rows, c);
	CU_LAUNCHED(a, e);
	return 0;
}

static int run_bias_add(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1)), c = cu_numel(cu_t(a, 1));
	if (n <= 0 || c <= 0)
		return 0;
	int64_t rows = n / c;
	if (cu_t(a, -1)->dtype == DP_F16)
		return bias_add_half<__half>(a, rows, c, e);
	if (cu_t(a, -1)->dtype == DP_BF16)
		return bias_add_half<cu_bf16>(a, rows, c, e);
	float *o = cu_f(a, -1), *x = cu_f(a, 0), *b = cu_f(a, 1);
	unsigned t = cu_row_threads(c);
	if (c % 4 == 0 && cu_aligned16(o) && cu_aligned16(x) && cu_aligned16(b))
		CU_LAUNCH(k_bias_add4, bias_grid(rows, c / 4, t), t, a->st, o, x, b, rows, c / 4);
	else
		CU_LAUNCH(k_bias_add<float>, bias_grid(rows, c, t), t, a->st, o, x, b, rows, c);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- dropout: out = x * keep * scale, one element per thread ---- */

template <typename T>
__global__ void k_dropout(T *o, const T *x, const int32_t *keys, const int32_t *pos, int64_t n,
			  int64_t per, int64_t inner, uint64_t seed, uint32_t site,
			  uint32_t threshold, float scale)
{
	CU_FOR_EACH(i, n) {
		int64_t b = i / per, w = i % per;
		int64_t el = pos ? (int64_t)pos[w / inner] * inner + w % inner : w;
		float v = ld(x + i);
		int32_t sample = keys[2 * b], step = keys[2 * b + 1];
		float y = sample < 0 ? v
		        : dp_dropout_keep(seed, site, (uint32_t)sample, (uint32_t)step, (uint64_t)el,
					  threshold) ? v * scale : 0.0f;
		st(o + i, y);
	}
}

static int run_dropout(const CuArgs *a, RtErr *e)
{
	const DpTensor *x = cu_t(a, 0);
	int64_t n = cu_numel(x);
	if (n <= 0)
		return 0;
	float p = DP_FATTR(a->in, DROPOUT, p);
	int64_t per = n / x->dims[0], inner = cu_t(a, 2) ? per / x->dims[1] : 1;
	const int32_t *keys = (const int32_t *)cu_p(a, 1), *pos = (const int32_t *)cu_p(a, 2);
	uint32_t site = (uint32_t)DP_ATTR(a->in, DROPOUT, site), thr = dp_dropout_threshold(p);
	float scale = dp_dropout_scale(p);
	if (x->dtype == DP_F16)
		CU_LAUNCH(k_dropout<__half>, cu_grid(n), CU_THREADS, a->st, (__half *)cu_p(a, -1),
			  (const __half *)cu_p(a, 0), keys, pos, n, per, inner, a->s->cfg.seed, site,
			  thr, scale);
	else if (x->dtype == DP_BF16)
		CU_LAUNCH(k_dropout<cu_bf16>, cu_grid(n), CU_THREADS, a->st, (cu_bf16 *)cu_p(a, -1),
			  (const cu_bf16 *)cu_p(a, 0), keys, pos, n, per, inner, a->s->cfg.seed, site,
			  thr, scale);
	else
		CU_LAUNCH(k_dropout<float>, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), cu_f(a, 0),
			  keys, pos, n, per, inner, a->s->cfg.seed, site, thr, scale);
	CU_LAUNCHED(a, e);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_elementwise_rows[] = {
	{DP_OP_ACCUM, run_map<Accum>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SCALE, run_map<Scale>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_ADD_SCALAR, run_map<AddScalar>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_ADD, run_map<Add>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_MUL, run_map<Mul>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_RELU, run_map<Relu>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_RELU_GRAD, run_map<ReluGrad>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_GELU, run_map<Gelu>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_GELU_GRAD, run_map<GeluGrad>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_TANH, run_map<Tanh>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_TANH_GRAD, run_map<TanhGrad>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SILU, run_map<Silu>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SILU_GRAD, run_map<SiluGrad>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SIGMOID, run_map<Sigmoid>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SIGMOID_GRAD, run_map<SigmoidGrad>, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_BIAS_ADD, run_bias_add, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_DROPOUT, run_dropout, NULL, 1, NULL, NULL, 0, 1},
	{},
};
