/*
 * bf16.cu - bf16 on the CUDA backend (docs/PRECISION.md): storage in bf16,
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

__global__ void k_bf16_from_f32(cu_bf16 *d, const float *s, int64_t n)
{
	CU_FOR_EACH(i, n)
		d[i] = cu_to_bf16(s[i]);
}

__global__ void k_f32_from_bf16(float *d, const cu_bf16 *s, int64_t n)
{
	CU_FOR_EACH(i, n)
		d[i] = cu_from_bf16(s[i]);
}

/* n8 groups of eight: d and s 16-byte aligned */
__global__ void k_bf16_from_f32_8(cu_bf16 *d, const float *s, int64_t n8)
{
	CU_FOR_EACH(i, n8) {
		float4 a = ld4(s + 8 * i), b = ld4(s + 8 * i + 4);
		uint4 o;
		o.x = cu_to_bf16(a.x) | (uint32_t)cu_to_bf16(a.y) << 16;
		o.y = cu_to_bf16(a.z) | (uint32_t)cu_to_bf16(a.w) << 16;
		o.z = cu_to_bf16(b.x) | (uint32_t)cu_to_bf16(b.y) << 16;
		o.w = cu_to_bf16(b.z) | (uint32_t)cu_to_bf16(b.w) << 16;
		*(uint4 *)(d + 8 * i) = o;
	}
}

__global__ void k_f32_from_bf16_8(float *d, const cu_bf16 *s, int64_t n8)
{
	CU_FOR_EACH(i, n8) {
		uint4 w = *(const uint4 *)(s + 8 * i);
		st4(d + 8 * i, make_float4(cu_from_bf16((cu_bf16)w.x), cu_from_bf16((cu_bf16)(w.x >> 16)),
					   cu_from_bf16((cu_bf16)w.y), cu_from_bf16((cu_bf16)(w.y >> 16))));
		st4(d + 8 * i + 4,
		    make_float4(cu_from_bf16((cu_bf16)w.z), cu_from_bf16((cu_bf16)(w.z >> 16)),
				cu_from_bf16((cu_bf16)w.w), cu_from_bf16((cu_bf16)(w.w >> 16))));
	}
}

/* n elements f32 -> bf16 (to_bf16) or back, on st; the aligned multiple of
 * eight 128 bits at a time, the tail one at a time */
static cudaError_t convert(cudaStream_t st, void *dst, const void *src, int64_t n, int to_bf16)
{
	int64_t n8 = cu_aligned16(dst) && cu_aligned16(src) ? n / 8 : 0, done = 8 * n8;
	if (n8) {
		if (to_bf16)
			CU_LAUNCH(k_bf16_from_f32_8, cu_grid(n8), CU_THREADS, st, (cu_bf16 *)dst,
				  (const float *)src, n8);
		else
			CU_LAUNCH(k_f32_from_bf16_8, cu_grid(n8), CU_THREADS, st, (float *)dst,
				  (const cu_bf16 *)src, n8);
		cudaError_t err = cudaGetLastError();
		if (err != cudaSuccess)
			return err;
	}
	if (n > done) {
		if (to_bf16)
			CU_LAUNCH(k_bf16_from_f32, cu_grid(n - done), CU_THREADS, st,
				  (cu_bf16 *)dst + done, (const float *)src + done, n - done);
		else
			CU_LAUNCH(k_f32_from_bf16, cu_grid(n - done), CU_THREADS, st,
				  (float *)dst + done, (const cu_bf16 *)src + done, n - done);
		return cudaGetLastError();
	}
	return cudaSuccess;
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
	CU_OK(a, convert(a->st, cu_p(a, -1), cu_p(a, 0), n, o->dtype == DP_BF16), e);
	return 0;
}

/* ---- staging an instruction on f32 copies ---- */

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
			cudaError_t err = convert(st, w, ptr[id], cu_numel(&s->tensors[id]), 0);
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
			err = convert(st, ptr[id], shadow[id], cu_numel(&s->tensors[id]), 1);
		shadow[id] = ptr[id];
	}
	return err;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas}: kernel_table.h */
extern "C" const KernelRow cu_bf16_rows[] = {
	{DP_OP_CAST, run_cast, NULL, 1, NULL, NULL, 0},
	{},
};
