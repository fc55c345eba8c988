/*
 * bf16.cu - bf16 and f16 on the CUDA backend (docs/PRECISION.md). f16
 * (precision fp16): the kernels whose row says f16 (all of bf16's but the
 * attention's: the GEMMs through cuBLASLt's CUDA_R_16F, the rest on
 * __half) read and write f16 themselves, CAST here; every other
 * instruction with an f16 operand runs on f32 copies (rt_own_half_path),
 * with the CPU's bits (cu_to_f16). bf16: storage in bf16,
 * arithmetic in f32, every store rounded to nearest even with the CPU's
 * bits (cu_to_bf16, device.cuh). This file holds the conversions, the CAST
 * kernel, and the staging of bf16 instructions whose kernel has no bf16 path
 * (kernels.h, cu_stage_*), the scheme of the CPU's runtime/cpu/bf16.c:
 * widen what the kernel reads into f32 copies, run the f32 kernel there,
 * round what it wrote back. A staged op therefore computes exactly what the
 * CPU's staged op computes (the same f32 inputs, the same f32 kernel up to
 * the f32 tolerances of docs/CUDA.md, one rounding per output element).
 *
 * Kernels with their own bf16 path (row bf16 = 1): CAST here, matmul,
 * linear and bias_grad (gemm.cu: cuBLASLt with bf16 operands and f32
 * compute), the maps and bias_add (elementwise.cu), the norms (norm.cu),
 * softmax and rope (seq.cu), the losses (loss.cu), attention
 * (attention.cu), fill and the layout ops (layout.cu), sqnorm, clip, SGD
 * and AdamW (optim.cu; the optimizers also write the compute copy). No op
 * is staged today (docs/CUDA.md's bf16 table); the staging remains for a
 * kernel row with bf16 = 0 that meets a bf16 operand.
 *
 * The conversions move 128 bits per thread and access when the pointers
 * allow it: eight bf16 (one uint4) against two float4.
 */
#include "device.cuh"

/* ---- conversions ---- */

/* F16: 1 f16, 0 bf16 (device.cuh's cu_to_f16 / cu_to_bf16: the CPU's bits) */
template <int F16> static __device__ __forceinline__ uint16_t to16(float f)
{
	return F16 ? cu_to_f16(f) : cu_to_bf16(f);
}
template <int F16> static __device__ __forceinline__ float from16(uint16_t h)
{
	return F16 ? cu_from_f16(h) : cu_from_bf16(h);
}

template <int F16> __global__ void k_half_from_f32(uint16_t *d, const float *s, int64_t n)
{
	CU_FOR_EACH(i, n)
		d[i] = to16<F16>(s[i]);
}

template <int F16> __global__ void k_f32_from_half(float *d, const uint16_t *s, int64_t n)
{
	CU_FOR_EACH(i, n)
		d[i] = from16<F16>(s[i]);
}

/* n8 groups of eight: d and s 16-byte aligned */
template <int F16> __global__ void k_half_from_f32_8(uint16_t *d, const float *s, int64_t n8)
{
	CU_FOR_EACH(i, n8) {
		float4 a = ld4(s + 8 * i), b = ld4(s + 8 * i + 4);
		uint4 o;
		o.x = to16<F16>(a.x) | (uint32_t)to16<F16>(a.y) << 16;
		o.y = to16<F16>(a.z) | (uint32_t)to16<F16>(a.w) << 16;
		o.z = to16<F16>(b.x) | (uint32_t)to16<F16>(b.y) << 16;
		o.w = to16<F16>(b.z) | (uint32_t)to16<F16>(b.w) << 16;
		*(uint4 *)(d + 8 * i) = o;
	}
}

template <int F16> __global__ void k_f32_from_half_8(float *d, const uint16_t *s, int64_t n8)
{
	CU_FOR_EACH(i, n8) {
		uint4 w = *(const uint4 *)(s + 8 * i);
		st4(d + 8 * i, make_float4(from16<F16>((uint16_t)w.x), from16<F16>((uint16_t)(w.x >> 16)),
					   from16<F16>((uint16_t)w.y), from16<F16>((uint16_t)(w.y >> 16))));
		st4(d + 8 * i + 4,
		    make_float4(from16<F16>((uint16_t)w.z), from16<F16>((uint16_t)(w.z >> 16)),
				from16<F16>((uint16_t)w.w), from16<F16>((uint16_t)(w.w >> 16))));
	}
}

/* n elements f32 -> the 16-bit dtype (to_half) or back, on st; the aligned
 * multiple of eight 128 bits at a time, the tail one at a time */
template <int F16>
static cudaError_t convert_t(cudaStream_t st, void *dst, const void *src, int64_t n, int to_half)
{
	int64_t n8 = cu_aligned16(dst) && cu_aligned16(src) ? n / 8 : 0, done = 8 * n8;
	if (n8) {
		if (to_half)
			CU_LAUNCH(k_half_from_f32_8<F16>, cu_grid(n8), CU_THREADS, st, (uint16_t *)dst,
				  (const float *)src, n8);
		else
			CU_LAUNCH(k_f32_from_half_8<F16>, cu_grid(n8), CU_THREADS, st, (float *)dst,
				  (const uint16_t *)src, n8);
		cudaError_t err = cudaGetLastError();
		if (err != cudaSuccess)
			return err;
	}
	if (n > done) {
		if (to_half)
			CU_LAUNCH(k_half_from_f32<F16>, cu_grid(n - done), CU_THREADS, st,
				  (uint16_t *)dst + done, (const float *)src + done, n - done);
		else
			CU_LAUNCH(k_f32_from_half<F16>, cu_grid(n - done), CU_THREADS, st,
				  (float *)dst + done, (const uint16_t *)src + done, n - done);
		return cudaGetLastError();
	}
	return cudaSuccess;
}

/* half: the 16-bit side's dtype (DP_BF16 or DP_F16) */
static cudaError_t convert(cudaStream_t st, void *dst, const void *src, int64_t n, int to_half,
			   unsigned half)
{
	return half == DP_F16 ? convert_t<1>(st, dst, src, n, to_half)
			      : convert_t<0>(st, dst, src, n, to_half);
}

/* ---- CAST: out = in0 in out's dtype ---- */

static int run_cast(const CuArgs *a, RtErr *e)
{
	const DpTensor *o = cu_t(a, -1), *x = cu_t(a, 0);
	int64_t n = cu_numel(o);
	if (n <= 0)
		return 0;
	if (o->dtype == x->dtype) {
		if (cu_p(a, -1) != cu_p(a, 0))
			CU_OK(a, cudaMemcpyAsync(cu_p(a, -1), cu_p(a, 0),
						 (size_t)n * dp_dtype_size(o->dtype),
						 cudaMemcpyDeviceToDevice, a->st), e);
		return 0;
	}
	if (dp_is_half(o->dtype) && dp_is_half(x->dtype))
		return RT_FAIL(e, "cast from %s to %s: no kernel converts between the 16-bit dtypes",
			       dp_dtype_names[x->dtype], dp_dtype_names[o->dtype]);
	int to_half = dp_is_half(o->dtype);
	CU_OK(a, convert(a->st, cu_p(a, -1), cu_p(a, 0), n, to_half, to_half ? o->dtype : x->dtype), e);
	return 0;
}

/* ---- staging an instruction on f32 copies (rt_own_half_path decides) ---- */

/* bytes of one f32 copy, 256-byte pieces (every copy float4- and uint4-aligned) */
static size_t stage_bytes(const DpTensor *t)
{
	return ((size_t)cu_numel(t) * sizeof(float) + 255) / 256 * 256;
}

extern "C" size_t cu_stage_need(const DpStep *s, const DpInstr *in)
{
	size_t n = 0;
	for (int j = -1; j < DP_MAX_IN; j++)
		if (rt_half_staged(s, in, j))
			n += stage_bytes(&s->tensors[j < 0 ? in->out : in->in[j]]);
	return n;
}

extern "C" cudaError_t cu_stage_in(cudaStream_t st, const DpStep *s, const DpInstr *in,
				   void *const *ptr, void **shadow, void *ws)
{
	char *w = (char *)ws;
	for (int j = -1; j < DP_MAX_IN; j++) {
		if (!rt_half_staged(s, in, j))
			continue;
		int id = j < 0 ? in->out : in->in[j];
		shadow[id] = w;
		/* the output is read only when the op updates it in place */
		if (j >= 0 || dp_reads_out(in)) {
			cudaError_t err = convert(st, w, ptr[id], cu_numel(&s->tensors[id]), 0,
						  s->tensors[id].dtype);
			if (err != cudaSuccess)
				return err;
		}
		w += stage_bytes(&s->tensors[id]);
	}
	return cudaSuccess;
}

extern "C" cudaError_t cu_stage_out(cudaStream_t st, const DpStep *s, const DpInstr *in,
				    void *const *ptr, void **shadow)
{
	cudaError_t err = cudaSuccess;
	for (int j = -1; j < DP_MAX_IN; j++) {
		if (!rt_half_staged(s, in, j))
			continue;
		int id = j < 0 ? in->out : in->in[j];
		if (err == cudaSuccess && (j < 0 || dp_writes_in(in, j)))
			err = convert(st, ptr[id], shadow[id], cu_numel(&s->tensors[id]), 1,
				      s->tensors[id].dtype);
		shadow[id] = ptr[id];
	}
	return err;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_bf16_rows[] = {
	{DP_OP_CAST, run_cast, NULL, 1, NULL, NULL, 0, 1},
	{},
};
