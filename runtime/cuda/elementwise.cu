/*
 * elementwise.cu - CUDA kernels that compute each output element from the
 * same element of their inputs (the CPU's runtime/cpu/elementwise.c): accum,
 * scale, add, mul, the activations (relu, gelu in its tanh form, tanh,
 * silu, sigmoid) with their gradients, and the row broadcast bias_add.
 *
 * One functor per op, one kernel template: float arithmetic in the CPU's
 * order, operation for operation. Compiled with -fmad=false (mk/cuda.mk),
 * so nothing is contracted into an FMA the CPU does not do: accum, scale,
 * add, mul, relu, tanh_grad, sigmoid_grad and bias_add are bitwise equal to the CPU. gelu,
 * gelu_grad, tanh, silu, silu_grad and sigmoid call the device's tanhf / expf, which
 * differ from glibc's by at most 2 ulp (CUDA's documented bounds; glibc's
 * are within 1), so those agree to a few ulp per element. No reductions.
 *
 * Four elements at a time (float4) when the element count is a multiple of
 * four and every operand is 16-byte aligned (the planner aligns tensors to
 * 256 bytes, so that is the usual case); otherwise one at a time.
 */
#include "device.cuh"

/* out = f(a, b, out, fa0): a = in0, b = in1 (unused when absent), out read
 * only by accum; fa0 is scale's factor. */
#define ELEMENTWISE(name, reads_out_, expr)                                          \
	struct name {                                                                 \
		static const int reads_out = reads_out_;                              \
		__device__ __forceinline__ float operator()(float a, float b, float o, \
							    float fa0) const           \
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
	return dy * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
}

/* silu'(x) = sig(x) * (1 + x * (1 - sig(x))) */
static __device__ __forceinline__ float silu_grad(float dy, float x)
{
	float sg = 1.0f / (1.0f + expf(-x));
	return dy * sg * (1.0f + x * (1.0f - sg));
}

ELEMENTWISE(Accum, 1, o + a)
ELEMENTWISE(Scale, 0, fa0 * a)
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
__global__ void k_map(float *o, const float *a, const float *b, int64_t n, float fa0)
{
	F f;
	CU_FOR_EACH(i, n) {
		float bi = b ? ld(b + i) : 0.0f, oi = F::reads_out ? ld(o + i) : 0.0f;
		st(o + i, f(ld(a + i), bi, oi, fa0));
	}
}

/* n4 groups of four */
template <class F>
__global__ void k_map4(float *o, const float *a, const float *b, int64_t n4, float fa0)
{
	F f;
	CU_FOR_EACH(i, n4) {
		float4 x = ld4(a + 4 * i), y = b ? ld4(b + 4 * i) : make_float4(0, 0, 0, 0);
		float4 z = F::reads_out ? ld4(o + 4 * i) : make_float4(0, 0, 0, 0);
		st4(o + 4 * i, make_float4(f(x.x, y.x, z.x, fa0), f(x.y, y.y, z.y, fa0),
					   f(x.z, y.z, z.z, fa0), f(x.w, y.w, z.w, fa0)));
	}
}

template <class F> static int run_map(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	float *o = cu_f(a, -1), *x = cu_f(a, 0), *y = cu_f(a, 1);
	if (n <= 0)
		return 0;
	if (n % 4 == 0 && cu_aligned16(o) && cu_aligned16(x) && (!y || cu_aligned16(y)))
		CU_LAUNCH(k_map4<F>, cu_grid(n / 4), CU_THREADS, a->st, o, x, y, n / 4, a->in->fa[0]);
	else
		CU_LAUNCH(k_map<F>, cu_grid(n), CU_THREADS, a->st, o, x, y, n, a->in->fa[0]);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- bias_add: out[r, c] = in0[r, c] + in1[c] ----
 * Rows over blocks, columns over threads: no per-element division. */

__global__ void k_bias_add(float *o, const float *x, const float *bias, int64_t rows, int64_t c)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
			st(o + r * c + j, ld(x + r * c + j) + ld(bias + j));
}

/* c4 = c / 4 groups per row */
__global__ void k_bias_add4(float *o, const float *x, const float *bias, int64_t rows, int64_t c4)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t j = threadIdx.x; j < c4; j += blockDim.x) {
			float4 v = ld4(x + (r * c4 + j) * 4), w = ld4(bias + 4 * j);
			st4(o + (r * c4 + j) * 4, make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w));
		}
}

static int run_bias_add(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1)), c = cu_numel(cu_t(a, 1));
	if (n <= 0 || c <= 0)
		return 0;
	int64_t rows = n / c;
	unsigned grid = (unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID);
	float *o = cu_f(a, -1), *x = cu_f(a, 0), *b = cu_f(a, 1);
	if (c % 4 == 0 && cu_aligned16(o) && cu_aligned16(x) && cu_aligned16(b))
		CU_LAUNCH(k_bias_add4, grid, cu_row_threads(c), a->st, o, x, b, rows, c / 4);
	else
		CU_LAUNCH(k_bias_add, grid, cu_row_threads(c), a->st, o, x, b, rows, c);
	CU_LAUNCHED(a, e);
	return 0;
}

extern "C" void cu_elementwise_rows(CuKernel *k)
{
	/* run, limits, scratch, blas, bf16 */
	k[DPK_ACCUM] = {run_map<Accum>, NULL, NULL, 0, 0};
	k[DPK_SCALE] = {run_map<Scale>, NULL, NULL, 0, 0};
	k[DPK_ADD] = {run_map<Add>, NULL, NULL, 0, 0};
	k[DPK_MUL] = {run_map<Mul>, NULL, NULL, 0, 0};
	k[DPK_RELU] = {run_map<Relu>, NULL, NULL, 0, 0};
	k[DPK_RELU_GRAD] = {run_map<ReluGrad>, NULL, NULL, 0, 0};
	k[DPK_GELU] = {run_map<Gelu>, NULL, NULL, 0, 0};
	k[DPK_GELU_GRAD] = {run_map<GeluGrad>, NULL, NULL, 0, 0};
	k[DPK_TANH] = {run_map<Tanh>, NULL, NULL, 0, 0};
	k[DPK_TANH_GRAD] = {run_map<TanhGrad>, NULL, NULL, 0, 0};
	k[DPK_SILU] = {run_map<Silu>, NULL, NULL, 0, 0};
	k[DPK_SILU_GRAD] = {run_map<SiluGrad>, NULL, NULL, 0, 0};
	k[DPK_SIGMOID] = {run_map<Sigmoid>, NULL, NULL, 0, 0};
	k[DPK_SIGMOID_GRAD] = {run_map<SigmoidGrad>, NULL, NULL, 0, 0};
	k[DPK_BIAS_ADD] = {run_bias_add, NULL, NULL, 0, 0};
}
