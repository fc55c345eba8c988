/*
 * selftest.cu - the CUDA emulator's own tests: each case is a small CUDA
 * program (kernels, streams, capture, cuBLAS, NCCL) that either must work
 * (prints "ok") or must be caught (the emulator prints its diagnosis and
 * exits non-zero, or the call returns the error CUDA documents). Built like
 * runtime/cuda/kernels.cu (mk/cuda-emu.mk); tests/cuda_emu.sh runs every
 * case and checks the outcome and the message.
 *
 *   build-emu/selftest CASE        (the nccl_* cases under mpirun -np 2)
 *   build-emu/selftest --list
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <dpemu_mma_ptx.h>
#include <mma.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                               \
	do {                                                                                   \
		cudaError_t e_ = (call);                                                       \
		if (e_ != cudaSuccess) {                                                       \
			printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
			       cudaGetErrorName(e_));                                          \
			exit(1);                                                               \
		}                                                                              \
	} while (0)
#define EXPECT(cond)                                                                           \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                 \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

static float *dev_floats(size_t n)
{
	float *p;
	CK(cudaMalloc((void **)&p, n * sizeof(float)));
	return p;
}

static void to_dev(float *d, const float *h, size_t n)
{
	CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
}

static void from_dev(float *h, const float *d, size_t n)
{
	CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
}

/* ---- kernels ---- */

/* sum of n floats per block, shared-memory tree; `sync_first` 0 drops the
 * barrier between the stores and the first reads (the mutation) */
__global__ void k_block_sum(const float *x, float *out, int n, int sync_first)
{
	__shared__ float sh[256];
	float v = 0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		v += x[blockIdx.x * n + i];
	sh[threadIdx.x] = v;
	if (sync_first)
		__syncthreads();
	for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s)
			sh[threadIdx.x] += sh[threadIdx.x + s];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		out[blockIdx.x] = sh[0];
}

__global__ void k_warp_sum(const float *x, float *out, unsigned *ballot, int *count)
{
	float v = x[threadIdx.x];
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	float d = x[threadIdx.x];
	for (int o = 16; o > 0; o >>= 1)
		d += __shfl_down_sync(0xffffffffu, d, o);
	unsigned b = __ballot_sync(0xffffffffu, x[threadIdx.x] > 0);
	int c = __syncthreads_count(x[threadIdx.x] > 0);
	if (threadIdx.x % 32 == 0) {
		out[2 * (threadIdx.x / 32)] = v;
		out[2 * (threadIdx.x / 32) + 1] = d;
		ballot[threadIdx.x / 32] = b;
	}
	if (threadIdx.x == 0)
		*count = c;
}

__global__ void k_atomic(float *acc, int *iacc, unsigned long long *cas)
{
	atomicAdd(acc, 1.0f);
	atomicAdd(iacc, 2);
	atomicMax(iacc + 1, (int)(threadIdx.x + blockIdx.x * blockDim.x));
	unsigned long long old = *cas, seen;
	do {
		seen = old;
		old = atomicCAS(cas, seen, seen + 1);
	} while (old != seen);
}

__global__ void k_vec4(const float *x, float *y, int n4)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
		float4 v = reinterpret_cast<const float4 *>(x)[i];
		v.x *= 2; v.y *= 2; v.z *= 2; v.w *= 2;
		reinterpret_cast<float4 *>(y)[i] = v;
	}
}

__global__ void k_dyn(float *out, int n)
{
	extern __shared__ float tile[];
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		tile[i] = (float)i;
	__syncthreads();
	if (threadIdx.x == 0) {
		float s = 0;
		for (int i = 0; i < n; i++)
			s += tile[i];
		out[0] = s;
	}
}

__global__ void k_dims(int *out)
{
	int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
	int b = blockIdx.x + gridDim.x * blockIdx.y;
	out[b * blockDim.x * blockDim.y * blockDim.z + t] = t * 1000 + b;
}

__global__ void k_add(float *x, float v, int n)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
		x[i] += v;
}

__global__ void k_copy(const float *a, float *b, int n)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
		b[i] = a[i];
}

__global__ void k_mark(volatile long long *slot, long long v)
{
	*slot = v;
}

__global__ void k_bf16(const float *x, __nv_bfloat16 *y, float *back, int n)
{
	int i = threadIdx.x;
	if (i < n) {
		y[i] = __float2bfloat16(x[i]);
		back[i] = __bfloat162float(y[i]);
	}
}

/* errors */
__global__ void k_exit_early(float *x)
{
	if (threadIdx.x == 5)
		return;
	__syncthreads();
	x[threadIdx.x] = 1;
}

__global__ void k_shfl_exited(float *x)
{
	if (threadIdx.x == 7)
		return;
	x[threadIdx.x] = __shfl_sync(0xffffffffu, x[threadIdx.x], 0);
}

__global__ void k_shfl_not_me(float *x)
{
	x[threadIdx.x] = __shfl_sync(0x0000ffffu, x[threadIdx.x], 0);
}

__global__ void k_warp_vs_bar(float *x)
{
	if (threadIdx.x < 16)
		x[threadIdx.x] = __shfl_sync(0xffffffffu, x[threadIdx.x], 0);
	else
		__syncthreads();
}

__global__ void k_touch(const float *x, float *y)
{
	y[threadIdx.x] = x[threadIdx.x];
}

__global__ void k_oob(float *x, int n)
{
	x[n + 4096] = 1; /* a page past the end */
}

static void cpu_sum_ref(const float *x, int blocks, int n, float *ref)
{
	for (int b = 0; b < blocks; b++) {
		double s = 0;
		for (int i = 0; i < n; i++)
			s += x[b * n + i];
		ref[b] = (float)s;
	}
}

/* ---- positive cases ---- */

static int c_reduce(void)
{
	const int B = 8, N = 1000;
	float h[B * N], r[B], ref[B];
	for (int i = 0; i < B * N; i++)
		h[i] = (float)((i * 37) % 101) / 7.0f;
	float *x = dev_floats(B * N), *o = dev_floats(B);
	to_dev(x, h, B * N);
	CU_LAUNCH(k_block_sum, B, 256, 0, x, o, N, 1);
	CK(cudaGetLastError());
	from_dev(r, o, B);
	cpu_sum_ref(h, B, N, ref);
	for (int b = 0; b < B; b++)
		EXPECT(fabsf(r[b] - ref[b]) <= 1e-3f * fabsf(ref[b]));
	return 0;
}

static int c_reduce_nosync(void)
{
	/* the dropped barrier: wrong for the ascending thread order */
	const int B = 8, N = 1000;
	float h[B * N], r[B], ref[B];
	for (int i = 0; i < B * N; i++)
		h[i] = 1.0f;
	float *x = dev_floats(B * N), *o = dev_floats(B);
	to_dev(x, h, B * N);
	CU_LAUNCH(k_block_sum, B, 256, 0, x, o, N, 0);
	CK(cudaGetLastError());
	from_dev(r, o, B);
	cpu_sum_ref(h, B, N, ref);
	int wrong = 0;
	for (int b = 0; b < B; b++)
		wrong += !(r[b] == ref[b]);
	printf("%d of %d block sums wrong without the barrier\n", wrong, B);
	return wrong ? 3 : 0; /* 3: the race showed */
}

static int c_warp(void)
{
	float h[64];
	for (int i = 0; i < 64; i++)
		h[i] = (float)(i % 5) - 1.0f;
	float *x = dev_floats(64), *o = dev_floats(4);
	unsigned *b;
	int *c;
	CK(cudaMalloc((void **)&b, 8));
	CK(cudaMalloc((void **)&c, 4));
	to_dev(x, h, 64);
	CU_LAUNCH(k_warp_sum, 1, 64, 0, x, o, b, c);
	CK(cudaGetLastError());
	float r[4];
	unsigned hb[2];
	int hc;
	from_dev(r, o, 4);
	CK(cudaMemcpy(hb, b, 8, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(&hc, c, 4, cudaMemcpyDeviceToHost));
	for (int w = 0; w < 2; w++) {
		float s = 0;
		unsigned bal = 0;
		for (int i = 0; i < 32; i++) {
			s += h[32 * w + i];
			bal |= (unsigned)(h[32 * w + i] > 0) << i;
		}
		EXPECT(r[2 * w] == s && r[2 * w + 1] == s && hb[w] == bal);
	}
	int pos = 0;
	for (int i = 0; i < 64; i++)
		pos += h[i] > 0;
	EXPECT(hc == pos);
	return 0;
}

static int c_atomic(void)
{
	float *acc = dev_floats(1);
	int *iacc;
	unsigned long long *cas;
	CK(cudaMalloc((void **)&iacc, 8));
	CK(cudaMalloc((void **)&cas, 8));
	CK(cudaMemset(acc, 0, 4));
	CK(cudaMemset(iacc, 0, 8));
	CK(cudaMemset(cas, 0, 8));
	CU_LAUNCH(k_atomic, 4, 128, 0, acc, iacc, cas);
	CK(cudaGetLastError());
	float a;
	int ints[2]; /* the integer atomics: add, max */
	unsigned long long c;
	from_dev(&a, acc, 1);
	CK(cudaMemcpy(ints, iacc, 8, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(&c, cas, 8, cudaMemcpyDeviceToHost));
	EXPECT(a == 512 && ints[0] == 1024 && ints[1] == 511 && c == 512);
	return 0;
}

static int c_vec4(void)
{
	const int n = 4096;
	static float h[n], r[n];
	for (int i = 0; i < n; i++)
		h[i] = (float)i;
	float *x = dev_floats(n), *y = dev_floats(n);
	to_dev(x, h, n);
	CU_LAUNCH(k_vec4, 4, 128, 0, x, y, n / 4);
	CK(cudaGetLastError());
	from_dev(r, y, n);
	for (int i = 0; i < n; i++)
		EXPECT(r[i] == 2 * h[i]);
	return 0;
}

static int c_dyn_smem(void)
{
	const int n = 20000; /* 80 000 bytes: above 48 KiB */
	float *o = dev_floats(1), r;
	EXPECT(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4) == cudaSuccess);
	CU_LAUNCH_SMEM(k_dyn, 2, 256, n * 4, 0, o, n);
	CK(cudaGetLastError());
	from_dev(&r, o, 1);
	float want = 0;
	for (int i = 0; i < n; i++)
		want += (float)i;
	EXPECT(r == want);
	return 0;
}

static int c_dyn_smem_limit(void)
{
	float *o = dev_floats(1);
	CU_LAUNCH_SMEM(k_dyn, 1, 64, 64 * 1024, 0, o, 16 * 1024);
	cudaError_t e = cudaGetLastError();
	EXPECT(e == cudaErrorInvalidValue);
	CU_LAUNCH(k_dims, 1, 2048, 0, (int *)o); /* too many threads */
	EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration);
	return 0;
}

static int c_dims(void)
{
	int *o, h[2 * 3 * 4 * 2 * 3];
	CK(cudaMalloc((void **)&o, sizeof h));
	CU_LAUNCH(k_dims, dim3(2, 3), dim3(4, 2, 3), 0, o);
	CK(cudaGetLastError());
	CK(cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost));
	for (int b = 0; b < 6; b++)
		for (int t = 0; t < 24; t++)
			EXPECT(h[b * 24 + t] == t * 1000 + b);
	return 0;
}

static int c_bf16(void)
{
	/* round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1;
	 * 1 + 3*2^-8 is a tie -> 1 + 2^-6; NaN stays NaN */
	float h[5] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 256 + 1.0f / 65536, -2.5f, NAN};
	float want[5] = {1.0f, 1.0f + 4.0f / 256, 1.0f + 2.0f / 256, -2.5f, NAN};
	float *x = dev_floats(5), *back = dev_floats(5);
	__nv_bfloat16 *y;
	CK(cudaMalloc((void **)&y, 10));
	to_dev(x, h, 5);
	CU_LAUNCH(k_bf16, 1, 32, 0, x, y, back, 5);
	CK(cudaGetLastError());
	float r[5];
	from_dev(r, back, 5);
	for (int i = 0; i < 4; i++)
		EXPECT(r[i] == want[i]);
	EXPECT(r[4] != r[4]);
	return 0;
}

/* ---- wmma (mma.h): D = A B + C of 16 x 16 tiles, B read as col_major
 * (B^T stored row by row) or row_major; shift moves lane 5's pointer (a
 * misuse), ldm is the leading dimension of A ---- */
__global__ void k_wmma(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *c, int b_col,
		       int ldm, int shift)
{
	using namespace nvcuda;
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
	wmma::load_matrix_sync(fa, a + (threadIdx.x == 5 ? shift : 0), ldm);
	wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
	if (b_col) {
		wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
		wmma::load_matrix_sync(fb, b, 16);
		wmma::mma_sync(acc, fa, fb, acc);
	} else {
		wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
		wmma::load_matrix_sync(fb, b, 16);
		wmma::mma_sync(acc, fa, fb, acc);
	}
	for (int e = 0; e < acc.num_elements; e++)
		acc.x[e] *= 2.0f; /* elementwise: any layout */
	wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

static int wmma_case(int ldm, int shift)
{
	/* small integers: every product and sum is exact in float */
	__nv_bfloat16 ha[16 * 32], hb[256];
	float hc[256], r[256];
	for (int i = 0; i < 16 * 32; i++)
		ha[i] = __nv_bfloat16((float)(i * 7 % 11 - 5));
	for (int i = 0; i < 256; i++) {
		hb[i] = __nv_bfloat16((float)(i * 5 % 13 - 6));
		hc[i] = (float)(i % 9 - 4);
	}
	__nv_bfloat16 *a, *b;
	float *c = dev_floats(256);
	CK(cudaMalloc((void **)&a, sizeof ha));
	CK(cudaMalloc((void **)&b, sizeof hb));
	CK(cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice));
	for (int bcol = 0; bcol < 2; bcol++) {
		to_dev(c, hc, 256);
		CU_LAUNCH(k_wmma, 1, 32, 0, a, b, c, bcol, ldm, shift);
		CK(cudaDeviceSynchronize());
		from_dev(r, c, 256);
		for (int i = 0; i < 16; i++)
			for (int j = 0; j < 16; j++) {
				float s = hc[16 * i + j];
				for (int k = 0; k < 16; k++)
					s += (float)ha[ldm * i + k] *
					     (float)(bcol ? hb[16 * j + k] : hb[16 * k + j]);
				EXPECT(r[16 * i + j] == 2 * s);
			}
	}
	return 0;
}

static int c_wmma(void) { return wmma_case(32, 0); }
static int c_wmma_ldm(void) { return wmma_case(12, 0); }
static int c_wmma_diverge(void) { return wmma_case(16, 16); }

/* ---- mma.sync m16n8k16 and ldmatrix (dpemu_mma_ptx.h): the PTX ISA's
 * register layouts, pinned per element. g = lane / 4, q = lane % 4. ---- */

/* The PTX ISA's A layout: register i of lane l holds A[row][col], A[row][col + 1] */
static void a_place(int l, int i, int *row, int *col)
{
	*row = l / 4 + 8 * (i & 1);
	*col = 2 * (l % 4) + 8 * (i >> 1);
}

static uint32_t bits2(const __nv_bfloat16 *p)
{
	uint16_t lo, hi;
	memcpy(&lo, p, 2);
	memcpy(&hi, p + 1, 2);
	return (uint32_t)lo | (uint32_t)hi << 16;
}

/* ldmatrix .x4 of a 16 x 16 bf16 tile (row stride 24) and .x4.trans of
 * the same tile: each lane's registers out to regs[2][32][4]. Misuses:
 * lane 9's row shifted by `shift` elements, lane 3 at another call
 * (diverge), the rows given in global memory (global) */
__global__ void k_ldsm_pin(const __nv_bfloat16 *src, uint32_t *regs, int shift, int diverge,
			   int global)
{
	__shared__ __align__(16) __nv_bfloat16 t[16 * 24];
	for (int i = threadIdx.x; i < 16 * 24; i += 32)
		t[i] = src[i];
	__syncwarp();
	int l = threadIdx.x, mi = l / 8, mr = l % 8;
	/* lanes 8 mi .. 8 mi + 7: matrix mi = rows 8 (mi & 1) .., columns 8 (mi >> 1) .. */
	const __nv_bfloat16 *row = (global ? src : t) + (8 * (mi & 1) + mr) * 24 + 8 * (mi >> 1) +
				   (l == 9 ? shift : 0);
	if (diverge && l == 3)
		dpemu_ldmatrix(4, 0, regs + 4 * l, row, __FILE__, __LINE__);
	else
		dpemu_ldmatrix(4, 0, regs + 4 * l, row, __FILE__, __LINE__);
	dpemu_ldmatrix(4, 1, regs + 128 + 4 * l, row, __FILE__, __LINE__);
}

static int ldsm_case(int shift, int diverge, int global)
{
	__nv_bfloat16 h[16 * 24];
	for (int i = 0; i < 16 * 24; i++)
		h[i] = __nv_bfloat16((float)(i / 24 * 16 + i % 24)); /* (r, c) -> 16 r + c, exact */
	__nv_bfloat16 *src;
	uint32_t *regs, r[256];
	CK(cudaMalloc((void **)&src, sizeof h));
	CK(cudaMalloc((void **)&regs, sizeof r));
	CK(cudaMemcpy(src, h, sizeof h, cudaMemcpyHostToDevice));
	CU_LAUNCH(k_ldsm_pin, 1, 32, 0, src, regs, shift, diverge, global);
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(r, regs, sizeof r, cudaMemcpyDeviceToHost));
	for (int l = 0; l < 32; l++)
		for (int i = 0; i < 4; i++) {
			int row, col;
			a_place(l, i, &row, &col); /* x4 in matrix order is the A layout */
			EXPECT(r[4 * l + i] == bits2(h + row * 24 + col));
			/* .trans: matrix i's (2q, g) and (2q + 1, g) */
			int m0 = 8 * (i & 1), c0 = 8 * (i >> 1), g = l / 4, q = l % 4;
			uint16_t lo, hi;
			memcpy(&lo, h + (m0 + 2 * q) * 24 + c0 + g, 2);
			memcpy(&hi, h + (m0 + 2 * q + 1) * 24 + c0 + g, 2);
			EXPECT(r[128 + 4 * l + i] == ((uint32_t)lo | (uint32_t)hi << 16));
		}
	return 0;
}

static int c_ldsm(void) { return ldsm_case(0, 0, 0); }
static int c_ldsm_misaligned(void) { return ldsm_case(4, 0, 0); }
static int c_ldsm_diverge(void) { return ldsm_case(0, 1, 0); }
static int c_ldsm_global(void) { return ldsm_case(0, 0, 1); }

/* D = A B + C (16 x 16 by 16 x 8): operands from global memory in the
 * PTX layouts (how = 0), A by ldmatrix .x4 and B by .x2 from B^T's rows
 * (1), B by .x1 twice from B's rows with .trans (2); wrong = 1 assumes
 * a[1] is A[g][2q + 8..] (a guessed layout, not the PTX ISA's) */
__global__ void k_mma_ptx(const __nv_bfloat16 *a, const __nv_bfloat16 *b, const __nv_bfloat16 *bt,
			  float *c, int how, int wrong)
{
	__shared__ __align__(16) __nv_bfloat16 sa[16 * 16], sb[16 * 8], sbt[8 * 16];
	int l = threadIdx.x, g = l / 4, q = l % 4, mi = l / 8, mr = l % 8;
	for (int i = l; i < 256; i += 32)
		sa[i] = a[i];
	for (int i = l; i < 128; i += 32) {
		sb[i] = b[i];
		sbt[i] = bt[i];
	}
	__syncwarp();
	uint32_t ra[4], rb[2];
	float d[4];
	for (int i = 0; i < 4; i++)
		d[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)];
	if (how == 0) {
		for (int i = 0; i < 4; i++) {
			int row, col;
			a_place(l, i, &row, &col);
			if (wrong && (i == 1 || i == 2))
				a_place(l, 3 - i, &row, &col);
			ra[i] = bits2(a + 16 * row + col);
		}
		for (int i = 0; i < 2; i++) /* b[i] = B[2q + 8 i ..+1][g] */
			rb[i] = bits2(bt + 16 * g + 2 * q + 8 * i);
	} else {
		dpemu_ldmatrix(4, 0, ra, sa + (8 * (mi & 1) + mr) * 16 + 8 * (mi >> 1), __FILE__, __LINE__);
		if (how == 1) {
			dpemu_ldmatrix(2, 0, rb, sbt + mr * 16 + 8 * (mi & 1), __FILE__, __LINE__);
		} else {
			dpemu_ldmatrix(1, 1, rb, sb + mr * 8, __FILE__, __LINE__);
			dpemu_ldmatrix(1, 1, rb + 1, sb + (8 + mr) * 8, __FILE__, __LINE__);
		}
	}
	dpemu_mma_bf16(d, ra, rb, __FILE__, __LINE__);
	for (int i = 0; i < 4; i++)
		c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)] = d[i];
}

static int mma_ptx_case(int wrong)
{
	/* small integers: every product and sum is exact in float */
	__nv_bfloat16 ha[256], hb[128], hbt[128];
	float hc[128], r[128];
	for (int i = 0; i < 256; i++)
		ha[i] = __nv_bfloat16((float)(i * 7 % 11 - 5));
	for (int k = 0; k < 16; k++)
		for (int n = 0; n < 8; n++) {
			hb[8 * k + n] = __nv_bfloat16((float)((8 * k + n) * 5 % 13 - 6));
			hbt[16 * n + k] = hb[8 * k + n];
		}
	for (int i = 0; i < 128; i++)
		hc[i] = (float)(i % 9 - 4);
	__nv_bfloat16 *a, *b, *bt;
	float *c = dev_floats(128);
	CK(cudaMalloc((void **)&a, sizeof ha));
	CK(cudaMalloc((void **)&b, sizeof hb));
	CK(cudaMalloc((void **)&bt, sizeof hbt));
	CK(cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(bt, hbt, sizeof hbt, cudaMemcpyHostToDevice));
	for (int how = 0; how < (wrong ? 1 : 3); how++) {
		to_dev(c, hc, 128);
		CU_LAUNCH(k_mma_ptx, 1, 32, 0, a, b, bt, c, how, wrong);
		CK(cudaDeviceSynchronize());
		from_dev(r, c, 128);
		int bad = 0;
		for (int i = 0; i < 16; i++)
			for (int n = 0; n < 8; n++) {
				float s = hc[8 * i + n];
				for (int k = 0; k < 16; k++)
					s += (float)ha[16 * i + k] * (float)hb[8 * k + n];
				bad += r[8 * i + n] != s;
			}
		if (wrong)
			EXPECT(bad > 0); /* a kernel on a guessed layout computes wrong numbers */
		else
			EXPECT(bad == 0);
	}
	return 0;
}

static int c_mma_ptx(void) { return mma_ptx_case(0); }
static int c_mma_ptx_wrong(void) { return mma_ptx_case(1); }

/* ---- mma.sync m16n8k8 .tf32 and cvt.rna.tf32.f32 (dpemu_mma_ptx.h):
 * a[0] = A[g][q], a[1] = A[g+8][q], a[2] = A[g][q+4], a[3] = A[g+8][q+4];
 * b[0] = B[q][g], b[1] = B[q+4][g]; C as m16n8k16's. ---- */

/* D = A B + C (16 x 8 by 8 x 8), operands from global memory in those
 * layouts, each converted by dpemu_tf32; wrong = 1 takes a[1] and a[2]
 * swapped (the bf16 layout's row-then-column order: a guessed layout);
 * raw = 1 hands lane 5's a[2] over unconverted */
__global__ void k_mma_tf32(const float *a, const float *b, float *c, int wrong, int raw)
{
	int l = threadIdx.x, g = l / 4, q = l % 4;
	uint32_t ra[4], rb[2];
	float d[4];
	for (int i = 0; i < 4; i++) {
		int r = g + 8 * (i & 1), k = q + 4 * (i >> 1);
		if (wrong && (i == 1 || i == 2))
			r = g + 8 * (i >> 1), k = q + 4 * (i & 1);
		float x = a[8 * r + k];
		ra[i] = __float_as_uint(raw && l == 5 && i == 2 ? x : dpemu_tf32(x));
	}
	for (int i = 0; i < 2; i++)
		rb[i] = __float_as_uint(dpemu_tf32(b[8 * (q + 4 * i) + g]));
	for (int i = 0; i < 4; i++)
		d[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)];
	dpemu_mma_tf32(d, ra, rb, __FILE__, __LINE__);
	for (int i = 0; i < 4; i++)
		c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)] = d[i];
}

static int mma_tf32_case(int wrong, int raw)
{
	/* A's elements 1 + 2^-12 + small integers: tf32 keeps the integer and
	 * rounds the 2^-12 away (a product of unrounded operands differs); B
	 * small integers; every product and sum of the rounded values is exact */
	float ha[128], hb[64], hc[128], r[128];
	for (int i = 0; i < 128; i++)
		ha[i] = (float)(i * 7 % 11 - 5) + (i % 2 ? 0x1p-12f : 0.0f);
	for (int i = 0; i < 64; i++)
		hb[i] = (float)(i * 5 % 13 - 6);
	for (int i = 0; i < 128; i++)
		hc[i] = (float)(i % 9 - 4);
	float *a = dev_floats(128), *b = dev_floats(64), *c = dev_floats(128);
	to_dev(a, ha, 128);
	to_dev(b, hb, 64);
	to_dev(c, hc, 128);
	CU_LAUNCH(k_mma_tf32, 1, 32, 0, a, b, c, wrong, raw);
	CK(cudaDeviceSynchronize());
	from_dev(r, c, 128);
	int bad = 0;
	for (int i = 0; i < 16; i++)
		for (int n = 0; n < 8; n++) {
			float s = hc[8 * i + n];
			for (int k = 0; k < 8; k++)
				s += dpemu_tf32(ha[8 * i + k]) * hb[8 * k + n];
			bad += r[8 * i + n] != s;
		}
	EXPECT(wrong ? bad > 0 : bad == 0);
	return 0;
}

/* cvt.rna: to nearest, ties away from zero, at 10 mantissa bits */
static int c_tf32_round(void)
{
	EXPECT(dpemu_tf32(1.0f + 0x1p-12f) == 1.0f);              /* below half: down */
	EXPECT(dpemu_tf32(1.0f + 0x1p-11f) == 1.0f + 0x1p-10f);   /* a tie: away from zero */
	EXPECT(dpemu_tf32(-1.0f - 0x1p-11f) == -1.0f - 0x1p-10f); /* ... on both sides */
	EXPECT(dpemu_tf32(1.0f + 0x1p-10f + 0x1p-11f) == 1.0f + 0x1p-9f); /* not to even */
	EXPECT(dpemu_tf32(1.0f + 0x1p-11f + 0x1p-20f) == 1.0f + 0x1p-10f);
	EXPECT(isinf(dpemu_tf32(INFINITY)) && isnan(dpemu_tf32(NAN)));
	return 0;
}

static int c_mma_tf32(void) { return mma_tf32_case(0, 0); }
static int c_mma_tf32_wrong(void) { return mma_tf32_case(1, 0); }
static int c_mma_tf32_raw(void) { return mma_tf32_case(0, 1); }

/* ---- cp.async (dpemu_mma_ptx.h): a copy lands at the wait_group that
 * covers its group, not before ---- */

static int all_ff(const float *p)
{
	uint32_t u[4];
	memcpy(u, p, 16);
	return u[0] == ~0u && u[1] == ~0u && u[2] == ~0u && u[3] == ~0u;
}

/* 64 threads, each its 16 bytes of src into a[tid] (group 1), 16 zeros
 * (src-size 0) into z[tid] and src2's 16 into b[tid] (group 2); flags[tid]
 * bit i = check i held: 0 a stale before its group's wait, 1 a landed and
 * b still stale after wait_group 1, 2 b and z landed after wait_group 0,
 * 3 the neighbour's a seen after the barrier. Misuses: nowait (no wait at
 * all: the thread returns with its copies in flight), global (the
 * destination in global memory) */
__global__ void k_cp_async(const float *src, const float *src2, int *flags, float *gdst, int nowait,
			   int global)
{
	__shared__ __align__(16) float a[64][4], b[64][4], z[64][4];
	const int t = threadIdx.x;
	int f = 0;
	dpemu_cp_async(global ? gdst + 4 * t : a[t], src + 4 * t, 16, __FILE__, __LINE__);
	dpemu_cp_async_commit();
	f |= all_ff(a[t]) << 0;
	dpemu_cp_async(z[t], src, 0, __FILE__, __LINE__);
	dpemu_cp_async(b[t], src2 + 4 * t, 16, __FILE__, __LINE__);
	dpemu_cp_async_commit();
	if (nowait)
		return;
	dpemu_cp_async_wait(1, __FILE__, __LINE__);
	f |= (!memcmp(a[t], src + 4 * t, 16) && all_ff(b[t])) << 1;
	dpemu_cp_async_wait(0, __FILE__, __LINE__);
	f |= (!memcmp(b[t], src2 + 4 * t, 16) && z[t][0] == 0 && z[t][1] == 0 && z[t][2] == 0 &&
	      z[t][3] == 0) << 2;
	__syncthreads();
	f |= !memcmp(a[(t + 1) % 64], src + 4 * ((t + 1) % 64), 16) << 3;
	flags[t] = f;
}

static int cp_async_case(int nowait, int global)
{
	float h[256], h2[256];
	int fl[64];
	for (int i = 0; i < 256; i++) {
		h[i] = (float)i;
		h2[i] = (float)(1000 + i);
	}
	float *src = dev_floats(256), *src2 = dev_floats(256), *gdst = dev_floats(256);
	int *flags;
	CK(cudaMalloc((void **)&flags, sizeof fl));
	to_dev(src, h, 256);
	to_dev(src2, h2, 256);
	CU_LAUNCH(k_cp_async, 1, 64, 0, src, src2, flags, gdst, nowait, global);
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(fl, flags, sizeof fl, cudaMemcpyDeviceToHost));
	for (int t = 0; t < 64; t++)
		EXPECT(fl[t] == 15);
	return 0;
}

static int c_cp_async(void) { return cp_async_case(0, 0); }
static int c_cp_async_nowait(void) { return cp_async_case(1, 0); }
static int c_cp_async_global(void) { return cp_async_case(0, 1); }

static void naive_gemm(int m, int n, int k, const float *A, int lda, bool ta, const float *B, int ldb,
		       bool tb, float *C)
{
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = 0;
			for (int p = 0; p < k; p++)
				s += (double)(ta ? A[i * lda + p] : A[p * lda + i]) *
				     (tb ? B[p * ldb + j] : B[j * ldb + p]);
			C[j * m + i] = (float)s;
		}
}

static int c_gemm(void)
{
	const int m = 5, n = 7, k = 3;
	float A[m * k], B[k * n], C[m * n], R[m * n];
	for (int i = 0; i < m * k; i++)
		A[i] = (float)(i % 7) - 3;
	for (int i = 0; i < k * n; i++)
		B[i] = (float)(i % 5) * 0.5f;
	float *dA = dev_floats(m * k), *dB = dev_floats(k * n), *dC = dev_floats(m * n);
	to_dev(dA, A, m * k);
	to_dev(dB, B, k * n);
	cublasHandle_t h;
	EXPECT(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
	float one = 1, zero = 0;
	/* op(A) = A^T stored k x m (lda k), op(B) = B stored k x n (ldb k) */
	EXPECT(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, k, dB, k, &zero, dC, m) ==
	       CUBLAS_STATUS_SUCCESS);
	from_dev(C, dC, m * n);
	naive_gemm(m, n, k, A, k, true, B, k, false, R);
	for (int i = 0; i < m * n; i++)
		EXPECT(C[i] == R[i]);
	/* the documented argument checks: lda below the stored rows */
	EXPECT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m - 1, dB, k, &zero, dC, m) ==
	       CUBLAS_STATUS_INVALID_VALUE);
	EXPECT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m, dB, k, &zero, dC, m - 1) ==
	       CUBLAS_STATUS_INVALID_VALUE);
	EXPECT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, n, k, &one, dA, m, dB, k, &zero, dC, m) ==
	       CUBLAS_STATUS_INVALID_VALUE);
	/* TF32: 1 + 2^-12 rounds to 1 (10 mantissa bits); fp32 keeps it */
	float a1 = 1.0f + 1.0f / 4096, b1 = 1.0f, c1;
	to_dev(dA, &a1, 1);
	to_dev(dB, &b1, 1);
	EXPECT(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dA, CUDA_R_32F, 1, dB, CUDA_R_32F, 1,
			    &zero, dC, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT) ==
	       CUBLAS_STATUS_SUCCESS);
	from_dev(&c1, dC, 1);
	EXPECT(c1 == 1.0f);
	EXPECT(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dA, CUDA_R_32F, 1, dB, CUDA_R_32F, 1,
			    &zero, dC, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
	       CUBLAS_STATUS_SUCCESS);
	from_dev(&c1, dC, 1);
	EXPECT(c1 == a1);
	/* bf16 in, fp32 out; an unsupported combination */
	__nv_bfloat16 hb[2] = {__float2bfloat16(1.5f), __float2bfloat16(-2.0f)};
	__nv_bfloat16 *db;
	CK(cudaMalloc((void **)&db, 4));
	CK(cudaMemcpy(db, hb, 4, cudaMemcpyHostToDevice));
	EXPECT(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, db, CUDA_R_16BF, 1, db + 1,
			    CUDA_R_16BF, 1, &zero, dC, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
			    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
	from_dev(&c1, dC, 1);
	EXPECT(c1 == -3.0f);
	/* bf16 out: 1.5 * -2 + 0.0078125 * 0 = -3, exactly; then rounded once */
	EXPECT(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, db, CUDA_R_16BF, 1, db + 1,
			    CUDA_R_16BF, 1, &zero, db, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
			    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
	CK(cudaMemcpy(hb, db, 2, cudaMemcpyDeviceToHost));
	EXPECT(__bfloat162float(hb[0]) == -3.0f);
	EXPECT(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, db, CUDA_R_16BF, 1, dB, CUDA_R_32F,
			    1, &zero, dC, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
	       CUBLAS_STATUS_NOT_SUPPORTED);
	cublasDestroy(h);

	/* cuBLASLt: the same product (A^T stored k x m) plus a bias per row of
	 * C through the epilogue; exact in fp32 */
	to_dev(dA, A, m * k);
	to_dev(dB, B, k * n);
	float bias[m];
	for (int i = 0; i < m; i++)
		bias[i] = 0.25f * (float)i - 0.5f;
	float *dbias = dev_floats(m);
	to_dev(dbias, bias, m);
	void *ws;
	const size_t ws_bytes = 1u << 20;
	CK(cudaMalloc(&ws, ws_bytes));
	cublasLtHandle_t lt;
	EXPECT(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
	cublasLtMatmulDesc_t op;
	EXPECT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
	int32_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
	uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
	EXPECT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt) ==
	       CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opt, 2) ==
	       CUBLAS_STATUS_INVALID_VALUE); /* the attribute's size */
	EXPECT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ==
	       CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias,
					      sizeof dbias) == CUBLAS_STATUS_SUCCESS);
	cublasLtMatrixLayout_t la, lb, lc, lc_short;
	EXPECT(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, m, k) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutCreate(&lc_short, CUDA_R_32F, m, n, m - 1) == CUBLAS_STATUS_SUCCESS);
	cublasLtMatmulPreference_t pref;
	EXPECT(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
	uint64_t max_ws = ws_bytes;
	EXPECT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
						    sizeof max_ws) == CUBLAS_STATUS_SUCCESS);
	cublasLtMatmulHeuristicResult_t res;
	int count = 0;
	EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &count) ==
	       CUBLAS_STATUS_SUCCESS && count == 1 && res.state == CUBLAS_STATUS_SUCCESS &&
	       res.workspaceSize <= ws_bytes);
	EXPECT(cublasLtMatmul(lt, op, &one, dA, la, dB, lb, &zero, dC, lc, dC, lc, &res.algo, ws, ws_bytes,
			      0) == CUBLAS_STATUS_SUCCESS);
	from_dev(C, dC, m * n);
	for (int i = 0; i < m * n; i++)
		EXPECT(C[i] == R[i] + bias[i % m]);
	/* the documented checks: ld below rows; transposes that disagree with
	 * the layouts; a workspace below the algorithm's; an operand less
	 * aligned than the heuristic was told (256 bytes by default) */
	EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc_short, lc_short, pref, 1, &res, &count) ==
	       CUBLAS_STATUS_INVALID_VALUE);
	EXPECT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opn, sizeof opn) ==
	       CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &count) ==
	       CUBLAS_STATUS_INVALID_VALUE);
	EXPECT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt) ==
	       CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &count) ==
	       CUBLAS_STATUS_SUCCESS);
	if (res.workspaceSize)
		EXPECT(cublasLtMatmul(lt, op, &one, dA, la, dB, lb, &zero, dC, lc, dC, lc, &res.algo, ws, 0,
				      0) == CUBLAS_STATUS_INVALID_VALUE);
	EXPECT(cublasLtMatmul(lt, op, &one, dA + 1, la, dB, lb, &zero, dC, lc, dC, lc, &res.algo, ws,
			      ws_bytes, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
	/* bf16 inputs with a TF32 compute type: not a supported combination */
	cublasLtMatmulDesc_t op_tf;
	cublasLtMatrixLayout_t lbf;
	EXPECT(cublasLtMatmulDescCreate(&op_tf, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F) ==
	       CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutCreate(&lbf, CUDA_R_16BF, 1, 1, 1) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, op_tf, lbf, lbf, lbf, lbf, pref, 1, &res, &count) ==
	       CUBLAS_STATUS_NOT_SUPPORTED);
	/* fp16 (CUDA_R_16F) A and B with 32F compute, as bf16: (1 + 2^-10)^2 +
	 * 2^-11 = 1 + 5 2^-11 + 2^-20, rounded once to a 16F D is 1 + 3 2^-10
	 * (the product rounded first leaves the tie 1 + 5 2^-11, which goes to
	 * even, 1 + 2^-9), exact in an fp32 D; 16F with 16BF is no combination */
	{
		__half hv[4] = {__float2half(1.0f + 0x1p-10f), __float2half(0x1p-11f),
				__float2half(1.0f + 0x1p-10f), __float2half(1.0f)}, h16;
		__half *da, *db, *dd;
		float *df, f32;
		CK(cudaMalloc((void **)&da, 2 * sizeof(__half)));
		CK(cudaMalloc((void **)&db, 2 * sizeof(__half)));
		CK(cudaMalloc((void **)&dd, sizeof(__half)));
		CK(cudaMalloc((void **)&df, sizeof(float)));
		CK(cudaMemcpy(da, hv, 2 * sizeof(__half), cudaMemcpyHostToDevice));
		CK(cudaMemcpy(db, hv + 2, 2 * sizeof(__half), cudaMemcpyHostToDevice));
		cublasLtMatmulDesc_t oph;
		cublasLtMatrixLayout_t ha, hb, hd, hf;
		EXPECT(cublasLtMatmulDescCreate(&oph, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatrixLayoutCreate(&ha, CUDA_R_16F, 1, 2, 1) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatrixLayoutCreate(&hb, CUDA_R_16F, 2, 1, 2) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatrixLayoutCreate(&hd, CUDA_R_16F, 1, 1, 1) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatrixLayoutCreate(&hf, CUDA_R_32F, 1, 1, 1) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, oph, ha, hb, hd, hd, pref, 1, &res, &count) ==
		       CUBLAS_STATUS_SUCCESS && count == 1);
		EXPECT(cublasLtMatmul(lt, oph, &one, da, ha, db, hb, &zero, dd, hd, dd, hd, &res.algo, ws,
				      ws_bytes, 0) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, oph, ha, hb, hf, hf, pref, 1, &res, &count) ==
		       CUBLAS_STATUS_SUCCESS && count == 1);
		EXPECT(cublasLtMatmul(lt, oph, &one, da, ha, db, hb, &zero, df, hf, df, hf, &res.algo, ws,
				      ws_bytes, 0) == CUBLAS_STATUS_SUCCESS);
		CK(cudaMemcpy(&h16, dd, sizeof h16, cudaMemcpyDeviceToHost));
		CK(cudaMemcpy(&f32, df, sizeof f32, cudaMemcpyDeviceToHost));
		EXPECT(__half2float(h16) == 1.0f + 3 * 0x1p-10f);
		EXPECT(f32 == 1.0f + 0x1p-9f + 0x1p-11f + 0x1p-20f);
		EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, oph, ha, lbf, hd, hd, pref, 1, &res, &count) ==
		       CUBLAS_STATUS_NOT_SUPPORTED);
		EXPECT(cublasLtMatrixLayoutDestroy(hf) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatrixLayoutDestroy(hd) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatrixLayoutDestroy(hb) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatrixLayoutDestroy(ha) == CUBLAS_STATUS_SUCCESS);
		EXPECT(cublasLtMatmulDescDestroy(oph) == CUBLAS_STATUS_SUCCESS);
		CK(cudaFree(df));
		CK(cudaFree(dd));
		CK(cudaFree(db));
		CK(cudaFree(da));
	}
	/* a heuristic query during capture invalidates it (dp chooses at load) */
	cudaStream_t s;
	cudaGraph_t g;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &count) ==
	       CUBLAS_STATUS_NOT_SUPPORTED);
	EXPECT(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == NULL);
	cudaGetLastError();
	CK(cudaStreamDestroy(s));
	EXPECT(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutDestroy(lbf) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutDestroy(lc_short) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutDestroy(lc) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutDestroy(lb) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatrixLayoutDestroy(la) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatmulDescDestroy(op_tf) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtMatmulDescDestroy(op) == CUBLAS_STATUS_SUCCESS);
	EXPECT(cublasLtDestroy(lt) == CUBLAS_STATUS_SUCCESS);
	CK(cudaFree(ws));
	return 0;
}

static int c_gemm_ld_past(void)
{
	/* a leading dimension cuBLAS accepts but that runs past the buffer */
	float *dA = dev_floats(16), *dB = dev_floats(16), *dC = dev_floats(16);
	cublasHandle_t h;
	cublasCreate(&h);
	float one = 1, zero = 0;
	cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dA, 64, dB, 4, &zero, dC, 4);
	return 0;
}

/* streams: a producer on s1, a consumer on s2; with `event` the consumer
 * waits for the producer */
static int streams_case(int event)
{
	const int n = 1024;
	float *a = dev_floats(n), *b = dev_floats(n);
	CK(cudaMemset(a, 0, n * 4));
	CK(cudaDeviceSynchronize());
	cudaStream_t s1, s2;
	cudaEvent_t ev;
	CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	CU_LAUNCH(k_add, 4, 256, s1, a, 1.0f, n);
	CK(cudaEventRecord(ev, s1));
	if (event)
		CK(cudaStreamWaitEvent(s2, ev, 0));
	CU_LAUNCH(k_copy, 4, 256, s2, a, b, n);
	CK(cudaStreamSynchronize(s2));
	CK(cudaDeviceSynchronize());
	static float h[n];
	from_dev(h, b, n);
	int wrong = 0;
	for (int i = 0; i < n; i++)
		wrong += h[i] != 1.0f;
	printf("%d of %d elements wrong\n", wrong, n);
	return wrong ? 3 : 0;
}

static int c_streams(void) { return streams_case(1); }
static int c_streams_race(void) { return streams_case(0); }

/* capture a fork/join of two streams; replay re-executes; --no-graph path equal */
static int c_graph(void)
{
	const int n = 256;
	float *a = dev_floats(n), *b = dev_floats(n);
	CK(cudaMemset(a, 0, n * 4));
	CK(cudaMemset(b, 0, n * 4));
	cudaStream_t s1, s2;
	cudaEvent_t fork, join;
	CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
	CK(cudaDeviceSynchronize());
	CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
	cudaStreamCaptureStatus st;
	CK(cudaStreamIsCapturing(s1, &st));
	EXPECT(st == cudaStreamCaptureStatusActive);
	CU_LAUNCH(k_add, 1, 256, s1, a, 1.0f, n);
	CK(cudaEventRecord(fork, s1));
	CK(cudaStreamWaitEvent(s2, fork, 0));
	CU_LAUNCH(k_copy, 1, 256, s2, a, b, n);
	CK(cudaEventRecord(join, s2));
	CK(cudaStreamWaitEvent(s1, join, 0));
	CU_LAUNCH(k_add, 1, 256, s1, b, 10.0f, n);
	cudaGraph_t g;
	CK(cudaStreamEndCapture(s1, &g));
	EXPECT(cudaEventQuery(join) == cudaErrorCapturedEvent);
	cudaGraphExec_t x;
	CK(cudaGraphInstantiate(&x, g, 0));
	CK(cudaGraphUpload(x, s1));
	for (int r = 0; r < 3; r++)
		CK(cudaGraphLaunch(x, s1));
	CK(cudaStreamSynchronize(s1));
	float ha[n], hb[n];
	from_dev(ha, a, n);
	from_dev(hb, b, n);
	EXPECT(ha[0] == 3 && hb[n - 1] == 13); /* the third replay: a = 3, b = a + 10 */
	CK(cudaGraphExecDestroy(x));
	CK(cudaGraphDestroy(g));
	return 0;
}

static int c_capture_illegal(void)
{
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *a = dev_floats(4), h[4] = {0};
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	CU_LAUNCH(k_add, 1, 32, s, a, 1.0f, 4);
	EXPECT(cudaMemcpy(h, a, 16, cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureUnsupported);
	EXPECT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
	void *p;
	EXPECT(cudaMalloc(&p, 64) == cudaErrorStreamCaptureUnsupported);
	EXPECT(cudaMemcpyAsync(a, h, 16, cudaMemcpyHostToDevice, s) == cudaErrorStreamCaptureInvalidated ||
	       cudaGetLastError() != cudaSuccess);
	cudaGraph_t g;
	EXPECT(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == NULL);
	cudaGetLastError();
	return 0;
}

static int c_capture_unjoined(void)
{
	cudaStream_t s1, s2;
	cudaEvent_t fork;
	CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
	float *a = dev_floats(4);
	CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
	CK(cudaEventRecord(fork, s1));
	CK(cudaStreamWaitEvent(s2, fork, 0));
	CU_LAUNCH(k_add, 1, 32, s2, a, 1.0f, 4); /* never joined back */
	cudaGraph_t g;
	EXPECT(cudaStreamEndCapture(s1, &g) == cudaErrorStreamCaptureUnjoined && g == NULL);
	return 0;
}

static int c_memcpy_checks(void)
{
	float *d = dev_floats(64), h[64] = {0};
	EXPECT(cudaMemcpy(d, d + 32, 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue); /* wrong kind */
	EXPECT(cudaMemcpy(h, d, 64 * 4 + 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue); /* past the end */
	cudaGetLastError();
	/* pitch above memPitch (2 GiB - 1) */
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	EXPECT(cudaMemcpy2DAsync(d, 8, d + 32, (size_t)3 << 30, 8, 2, cudaMemcpyDeviceToDevice, s) ==
	       cudaErrorInvalidPitchValue);
	EXPECT(cudaGetLastError() == cudaErrorInvalidPitchValue && cudaGetLastError() == cudaSuccess);
	/* 2-D copy: rows of 2 floats from a pitch of 4 */
	float src[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out[4];
	to_dev(d, src, 8);
	CK(cudaMemcpy2DAsync(d + 16, 8, d + 1, 16, 8, 2, cudaMemcpyDeviceToDevice, s));
	CK(cudaStreamSynchronize(s));
	from_dev(out, d + 16, 4);
	EXPECT(out[0] == 1 && out[1] == 2 && out[2] == 5 && out[3] == 6);
	/* mapped pinned memory written by a kernel */
	long long *hostp, *devp;
	CK(cudaHostAlloc((void **)&hostp, 8, cudaHostAllocMapped));
	CK(cudaHostGetDevicePointer((void **)&devp, hostp, 0));
	CU_LAUNCH(k_mark, 1, 1, s, devp, 42LL);
	CK(cudaStreamSynchronize(s));
	EXPECT(*(volatile long long *)hostp == 42);
	cudaPointerAttributes at;
	CK(cudaPointerGetAttributes(&at, d));
	EXPECT(at.type == cudaMemoryTypeDevice);
	CK(cudaPointerGetAttributes(&at, h));
	EXPECT(at.type == cudaMemoryTypeUnregistered);
	size_t fr, tot;
	CK(cudaMemGetInfo(&fr, &tot));
	EXPECT(fr < tot);
	return 0;
}

static void host_fn(void *p)
{
	*(int *)p += 1;
}

static void host_fn_calls_cuda(void *p)
{
	cudaDeviceSynchronize(); /* forbidden in a host function */
}

/* cudaLaunchHostFunc runs in stream order; a legacy-stream copy waits for a
 * blocking stream's work; events without timing refuse elapsed time */
static int c_host_fn(void)
{
	cudaStream_t s, sb;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamCreate(&sb)); /* blocking: the legacy stream waits for it */
	float *a = dev_floats(256), h[256];
	CK(cudaMemset(a, 0, 1024));
	CK(cudaDeviceSynchronize());
	static int count;
	CU_LAUNCH(k_add, 1, 256, s, a, 1.0f, 256);
	CK(cudaLaunchHostFunc(s, host_fn, &count));
	CK(cudaStreamSynchronize(s));
	EXPECT(count == 1);
	CU_LAUNCH(k_add, 1, 256, sb, a, 2.0f, 256);
	CK(cudaMemcpy(h, a, 1024, cudaMemcpyDeviceToHost)); /* legacy stream: after sb's kernel */
	EXPECT(h[0] == 3 && h[255] == 3);
	cudaEvent_t e1, e2;
	CK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
	CK(cudaEventCreate(&e2));
	CK(cudaEventRecord(e1, s));
	CK(cudaEventRecord(e2, s));
	CK(cudaEventSynchronize(e2));
	float ms;
	EXPECT(cudaEventElapsedTime(&ms, e1, e2) == cudaErrorInvalidResourceHandle);
	cudaGetLastError();
	return 0;
}

static int c_host_fn_cuda(void)
{
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaLaunchHostFunc(s, host_fn_calls_cuda, NULL));
	CK(cudaStreamSynchronize(s));
	return 0;
}

static int c_capture_pageable(void)
{
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *a = dev_floats(4), h[4] = {0};
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	EXPECT(cudaMemcpyAsync(a, h, 16, cudaMemcpyHostToDevice, s) == cudaErrorStreamCaptureUnsupported);
	cudaGraph_t g;
	EXPECT(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
	cudaGetLastError();
	return 0;
}

/* each of these must be stopped by the emulator (a FATAL line, exit 99) */
static int c_barrier_exit(void)
{
	float *a = dev_floats(64);
	CU_LAUNCH(k_exit_early, 1, 64, 0, a);
	CK(cudaDeviceSynchronize());
	return 0;
}

static int c_shfl_exited(void)
{
	float *a = dev_floats(32);
	CU_LAUNCH(k_shfl_exited, 1, 32, 0, a);
	CK(cudaDeviceSynchronize());
	return 0;
}

static int c_shfl_mask(void)
{
	float *a = dev_floats(32);
	CU_LAUNCH(k_shfl_not_me, 1, 32, 0, a);
	CK(cudaDeviceSynchronize());
	return 0;
}

static int c_deadlock(void)
{
	float *a = dev_floats(32);
	CU_LAUNCH(k_warp_vs_bar, 1, 32, 0, a);
	CK(cudaDeviceSynchronize());
	return 0;
}

static int c_misaligned(void)
{
	float *x = dev_floats(64), *y = dev_floats(64);
	CU_LAUNCH(k_vec4, 1, 4, 0, x + 1, y, 4);
	CK(cudaDeviceSynchronize());
	return 0;
}

static int c_host_touch(void)
{
	float *x = dev_floats(64);
	CK(cudaMemset(x, 0, 256));
	CK(cudaDeviceSynchronize());
	printf("read %f\n", x[3]); /* host code reading device memory */
	return 0;
}

static int c_kernel_host_ptr(void)
{
	float *h = (float *)malloc(256), *y = dev_floats(64);
	CU_LAUNCH(k_touch, 1, 32, 0, h, y);
	CK(cudaDeviceSynchronize());
	return 0;
}

static int c_out_of_bounds(void)
{
	float *x = dev_floats(64);
	CU_LAUNCH(k_oob, 1, 1, 0, x, 64);
	CK(cudaDeviceSynchronize());
	return 0;
}

static int c_versions(void)
{
	int n = -1, drv = -1, rt = -1;
	cudaError_t e = cudaGetDeviceCount(&n);
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	printf("count %d (%s) driver %d runtime %d\n", n, cudaGetErrorName(e), drv, rt);
	return 0;
}

/* ---- NCCL (mpirun -np 2) ---- */

static ncclComm_t world(void)
{
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	ncclUniqueId id;
	if (rank == 0)
		ncclGetUniqueId(&id);
	MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
	ncclComm_t c;
	ncclConfig_t cf = NCCL_CONFIG_INITIALIZER;
	cf.blocking = 0;
	ncclResult_t r = ncclCommInitRankConfig(&c, size, id, rank, &cf);
	EXPECT(r == ncclSuccess || r == ncclInProgress);
	ncclResult_t st;
	do
		EXPECT(ncclCommGetAsyncError(c, &st) == ncclSuccess);
	while (st == ncclInProgress);
	EXPECT(st == ncclSuccess);
	return c;
}

/* A call on a non-blocking communicator: ncclInProgress settled by polling
 * (the collective is enqueued by the poll that reports ncclSuccess). */
static void settle(ncclComm_t c, ncclResult_t r)
{
	EXPECT(r == ncclSuccess || r == ncclInProgress);
	ncclResult_t st = r;
	while (st == ncclInProgress)
		EXPECT(ncclCommGetAsyncError(c, &st) == ncclSuccess);
	EXPECT(st == ncclSuccess);
}

static int c_nccl(void)
{
	ncclComm_t c = world();
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float h[8], r[16];
	for (int i = 0; i < 8; i++)
		h[i] = (float)(rank * 8 + i);
	float *x = dev_floats(8), *y = dev_floats(16);
	to_dev(x, h, 8);
	settle(c, ncclAllReduce(x, x, 8, ncclFloat32, ncclSum, c, s));
	settle(c, ncclAllGather(x, y, 8, ncclFloat32, c, s));
	CK(cudaStreamSynchronize(s));
	from_dev(r, y, 16);
	for (int i = 0; i < 16; i++) {
		float want = 0;
		for (int q = 0; q < size; q++)
			want += (float)(q * 8 + i % 8);
		EXPECT(r[i] == want);
	}
	/* reduce-scatter of bf16, summed in fp32 and rounded once */
	__nv_bfloat16 hb[4], rb[2];
	for (int i = 0; i < 4; i++)
		hb[i] = __float2bfloat16(1.0f + i + rank);
	__nv_bfloat16 *db, *dr;
	CK(cudaMalloc((void **)&db, 8));
	CK(cudaMalloc((void **)&dr, 4));
	CK(cudaMemcpy(db, hb, 8, cudaMemcpyHostToDevice));
	settle(c, ncclReduceScatter(db, dr, 2, ncclBfloat16, ncclSum, c, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(rb, dr, 4, cudaMemcpyDeviceToHost));
	for (int i = 0; i < 2; i++) {
		float want = 0;
		for (int q = 0; q < size; q++)
			want += 1.0f + (2 * rank + i) + q;
		EXPECT(__bfloat162float(rb[i]) == want);
	}
	int hi[3] = {rank, 2 * rank, -rank}, ri[3];
	int *di;
	CK(cudaMalloc((void **)&di, 12));
	CK(cudaMemcpy(di, hi, 12, cudaMemcpyHostToDevice));
	settle(c, ncclAllReduce(di, di, 3, ncclInt32, ncclSum, c, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(ri, di, 12, cudaMemcpyDeviceToHost));
	EXPECT(ri[0] == size * (size - 1) / 2 && ri[1] == size * (size - 1) && ri[2] == -ri[0]);
	/* a split of a non-blocking parent fills newcomm only when the parent
	 * settles (NCCL 2.23 on): NULL before, a communicator after */
	ncclComm_t half;
	ncclResult_t sr = ncclCommSplit(c, rank % 2, rank, &half, NULL);
	EXPECT(sr != ncclInProgress || half == NULL);
	settle(c, sr);
	EXPECT(half != NULL);
	settle(half, ncclInProgress);
	int hn;
	ncclCommCount(half, &hn);
	EXPECT(hn == (size + 1 - rank % 2) / 2);
	ncclCommDestroy(half);
	ncclCommDestroy(c);
	return 0;
}

static int c_nccl_mismatch(void)
{
	/* rank 1 issues its two all-reduces in the other order */
	ncclComm_t c = world();
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *a = dev_floats(100), *b = dev_floats(100);
	CK(cudaMemset(a, 0, 400));
	CK(cudaMemset(b, 0, 400));
	float *first = rank == 1 ? b : a, *second = rank == 1 ? a : b;
	settle(c, ncclAllReduce(first, first, 100, ncclFloat32, ncclSum, c, s));
	settle(c, ncclAllReduce(second, second, 100, ncclFloat32, ncclSum, c, s));
	CK(cudaStreamSynchronize(s));
	return 0;
}

/* The point-to-point cases' start: the world communicator, this rank, a
 * stream and 100 zeroed floats on the device. */
typedef struct {
	ncclComm_t c;
	int rank;
	cudaStream_t s;
	float *a;
} P2P;

static P2P p2p_setup(void)
{
	P2P p;
	p.c = world();
	MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
	CK(cudaStreamCreateWithFlags(&p.s, cudaStreamNonBlocking));
	p.a = dev_floats(100);
	CK(cudaMemset(p.a, 0, 400));
	return p;
}

/* point-to-point: rank 0 sends 100 floats and receives 50 back in one
 * group, rank 1 receives and sends in another order of calls (the pair's
 * order: 0's send meets 1's recv first), values checked */
static int c_nccl_p2p(void)
{
	P2P p = p2p_setup();
	ncclComm_t c = p.c;
	int rank = p.rank;
	cudaStream_t s = p.s;
	float *a = p.a, *b = dev_floats(50), h[100];
	for (int i = 0; i < 100; i++)
		h[i] = (float)(i + 1000 * rank);
	to_dev(a, h, 100);
	to_dev(b, h, 50);
	EXPECT(ncclGroupStart() == ncclSuccess);
	if (rank == 0) {
		EXPECT(ncclSend(a, 100, ncclFloat32, 1, c, s) == ncclSuccess);
		EXPECT(ncclRecv(b, 50, ncclFloat32, 1, c, s) == ncclSuccess);
	} else {
		EXPECT(ncclRecv(a, 100, ncclFloat32, 0, c, s) == ncclSuccess);
		EXPECT(ncclSend(b, 50, ncclFloat32, 0, c, s) == ncclSuccess);
	}
	settle(c, ncclGroupEnd());
	CK(cudaStreamSynchronize(s));
	from_dev(h, rank == 0 ? b : a, rank == 0 ? 50 : 100);
	for (int i = 0; i < (rank == 0 ? 50 : 100); i++)
		EXPECT(h[i] == (float)(i + 1000 * (1 - rank)));
	return 0;
}

/* both ranks send first: neither send meets a recv */
static int c_nccl_p2p_mismatch(void)
{
	P2P p = p2p_setup();
	settle(p.c, ncclSend(p.a, 100, ncclFloat32, 1 - p.rank, p.c, p.s));
	settle(p.c, ncclRecv(p.a, 100, ncclFloat32, 1 - p.rank, p.c, p.s));
	CK(cudaStreamSynchronize(p.s));
	return 0;
}

/* a send of 100 floats met by a recv of 99 */
static int c_nccl_p2p_count(void)
{
	P2P p = p2p_setup();
	if (p.rank == 0)
		settle(p.c, ncclSend(p.a, 100, ncclFloat32, 1, p.c, p.s));
	else
		settle(p.c, ncclRecv(p.a, 99, ncclFloat32, 0, p.c, p.s));
	CK(cudaStreamSynchronize(p.s));
	return 0;
}

static int c_nccl_abort_graph(void)
{
	/* ncclCommAbort while a graph that captured the communicator exists */
	ncclComm_t c = world();
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *a = dev_floats(16);
	CK(cudaMemset(a, 0, 64));
	CK(cudaDeviceSynchronize());
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	settle(c, ncclAllReduce(a, a, 16, ncclFloat32, ncclSum, c, s));
	cudaGraph_t g;
	CK(cudaStreamEndCapture(s, &g));
	ncclCommAbort(c);
	return 0;
}

/* DPEMU_NCCL_INPROGRESS=always: every collective returns ncclInProgress;
 * settled, it runs, in stream order, and captured too */
static int c_nccl_inprogress(void)
{
	ncclComm_t c = world();
	int size;
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float one[4] = {1, 1, 1, 1}, r[4];
	float *x = dev_floats(4);
	to_dev(x, one, 4);
	ncclResult_t rc = ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c, s);
	EXPECT(rc == ncclInProgress);
	settle(c, rc);
	CK(cudaStreamSynchronize(s));
	from_dev(r, x, 4);
	EXPECT(r[0] == (float)size);
	/* inside a capture: enqueued into the graph when settled */
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	settle(c, ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c, s));
	CK(cudaStreamEndCapture(s, &g));
	CK(cudaGraphInstantiate(&ge, g, 0));
	CK(cudaGraphLaunch(ge, s));
	CK(cudaStreamSynchronize(s));
	from_dev(r, x, 4);
	EXPECT(r[3] == (float)(size * size));
	CK(cudaGraphExecDestroy(ge));
	CK(cudaGraphDestroy(g));
	ncclCommDestroy(c);
	return 0;
}

/* work issued on NCCL's stream before an ncclInProgress collective settled */
static int c_nccl_inprogress_early(void)
{
	ncclComm_t c = world();
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *x = dev_floats(4);
	CK(cudaMemset(x, 0, 16));
	EXPECT(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c, s) == ncclInProgress);
	CK(cudaMemsetAsync(x, 0, 16, s)); /* FATAL: before ncclCommGetAsyncError said ncclSuccess */
	return 0;
}

/* Two communicators captured in one graph, launched, and rank 1 never
 * joins: the launch is stuck on the first collective. NCCL's abort waits
 * until the graph is destroyed and the launch has completed, and
 * destroying the exec waits for the launch (the H200 did), so: aborting
 * both at once on threads, then destroying the graph beside them, ends
 * everything (concurrent); aborting one, destroying, then the other hangs
 * (the launch waits on the second's collective: serial); destroying the
 * graph before any abort hangs (destroy_first, what dp did before the H200
 * showed it). */
enum { ABORT_SERIAL, ABORT_CONCURRENT, ABORT_DESTROY_FIRST };
static ncclComm_t dup(ncclComm_t c, int rank)
{
	ncclComm_t d;
	settle(c, ncclCommSplit(c, 0, rank, &d, NULL));
	settle(d, ncclInProgress);
	return d;
}

static void *abort_thread(void *c)
{
	ncclCommAbort((ncclComm_t)c);
	return NULL;
}

static int nccl_abort_case(int mode)
{
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	ncclComm_t c = world(), a = dup(c, rank), b = dup(c, rank);
	if (rank == 1) {
		MPI_Barrier(MPI_COMM_WORLD); /* never issues anything */
		return 0;
	}
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *x = dev_floats(16);
	CK(cudaMemset(x, 0, 64));
	CK(cudaDeviceSynchronize());
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	settle(a, ncclAllReduce(x, x, 16, ncclFloat32, ncclSum, a, s));
	settle(b, ncclAllReduce(x, x, 16, ncclFloat32, ncclSum, b, s));
	CK(cudaStreamEndCapture(s, &g));
	CK(cudaGraphInstantiate(&ge, g, 0));
	CK(cudaGraphLaunch(ge, s));
	pthread_t ta, tb;
	switch (mode) {
	case ABORT_CONCURRENT: /* every flag first, then the graph beside them */
		EXPECT(pthread_create(&ta, NULL, abort_thread, a) == 0);
		EXPECT(pthread_create(&tb, NULL, abort_thread, b) == 0);
		CK(cudaGraphExecDestroy(ge));
		CK(cudaGraphDestroy(g));
		pthread_join(ta, NULL);
		pthread_join(tb, NULL);
		break;
	case ABORT_SERIAL: /* hangs: the launch waits on b's collective */
		EXPECT(pthread_create(&ta, NULL, abort_thread, a) == 0);
		CK(cudaGraphExecDestroy(ge));
		CK(cudaGraphDestroy(g));
		pthread_join(ta, NULL);
		ncclCommAbort(b);
		break;
	case ABORT_DESTROY_FIRST: /* hangs: the launch waits on a's collective */
		CK(cudaGraphExecDestroy(ge));
		CK(cudaGraphDestroy(g));
		ncclCommAbort(a);
		ncclCommAbort(b);
		break;
	}
	CK(cudaStreamSynchronize(s)); /* the launch has completed */
	ncclCommAbort(c);
	MPI_Barrier(MPI_COMM_WORLD);
	return 0;
}

static int c_nccl_abort_serial(void)
{
	return nccl_abort_case(ABORT_SERIAL);
}

static int c_nccl_abort_concurrent(void)
{
	return nccl_abort_case(ABORT_CONCURRENT);
}

static int c_nccl_destroy_first(void)
{
	return nccl_abort_case(ABORT_DESTROY_FIRST);
}

static const struct {
	const char *name;
	int (*fn)(void);
} cases[] = {
	{"reduce", c_reduce},
	{"reduce_nosync", c_reduce_nosync},
	{"warp", c_warp},
	{"atomic", c_atomic},
	{"vec4", c_vec4},
	{"dyn_smem", c_dyn_smem},
	{"dyn_smem_limit", c_dyn_smem_limit},
	{"dims", c_dims},
	{"bf16", c_bf16},
	{"wmma", c_wmma},
	{"wmma_ldm", c_wmma_ldm},
	{"wmma_diverge", c_wmma_diverge},
	{"ldsm", c_ldsm},
	{"ldsm_misaligned", c_ldsm_misaligned},
	{"ldsm_diverge", c_ldsm_diverge},
	{"ldsm_global", c_ldsm_global},
	{"mma_ptx", c_mma_ptx},
	{"mma_ptx_wrong", c_mma_ptx_wrong},
	{"mma_tf32", c_mma_tf32},
	{"mma_tf32_wrong", c_mma_tf32_wrong},
	{"mma_tf32_raw", c_mma_tf32_raw},
	{"tf32_round", c_tf32_round},
	{"cp_async", c_cp_async},
	{"cp_async_nowait", c_cp_async_nowait},
	{"cp_async_global", c_cp_async_global},
	{"gemm", c_gemm},
	{"gemm_ld_past", c_gemm_ld_past},
	{"streams", c_streams},
	{"streams_race", c_streams_race},
	{"graph", c_graph},
	{"capture_illegal", c_capture_illegal},
	{"capture_unjoined", c_capture_unjoined},
	{"memcpy_checks", c_memcpy_checks},
	{"host_fn", c_host_fn},
	{"host_fn_cuda", c_host_fn_cuda},
	{"capture_pageable", c_capture_pageable},
	{"barrier_exit", c_barrier_exit},
	{"shfl_exited", c_shfl_exited},
	{"shfl_mask", c_shfl_mask},
	{"deadlock", c_deadlock},
	{"misaligned", c_misaligned},
	{"host_touch", c_host_touch},
	{"kernel_host_ptr", c_kernel_host_ptr},
	{"out_of_bounds", c_out_of_bounds},
	{"versions", c_versions},
	{"nccl", c_nccl},
	{"nccl_mismatch", c_nccl_mismatch},
	{"nccl_p2p", c_nccl_p2p},
	{"nccl_p2p_mismatch", c_nccl_p2p_mismatch},
	{"nccl_p2p_count", c_nccl_p2p_count},
	{"nccl_abort_graph", c_nccl_abort_graph},
	{"nccl_inprogress", c_nccl_inprogress},
	{"nccl_inprogress_early", c_nccl_inprogress_early},
	{"nccl_abort_serial", c_nccl_abort_serial},
	{"nccl_abort_concurrent", c_nccl_abort_concurrent},
	{"nccl_destroy_first", c_nccl_destroy_first},
};

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: selftest CASE | --list\n");
		return 2;
	}
	if (!strcmp(argv[1], "--list")) {
		for (auto &c : cases)
			printf("%s\n", c.name);
		return 0;
	}
	for (auto &c : cases)
		if (!strcmp(argv[1], c.name)) {
			int mpi = !strncmp(c.name, "nccl", 4), rc;
			if (mpi)
				MPI_Init(&argc, &argv);
			rc = c.fn();
			if (!rc)
				printf("ok %s\n", c.name);
			fflush(stdout);
			if (mpi)
				MPI_Finalize();
			return rc;
		}
	fprintf(stderr, "selftest: no case %s\n", argv[1]);
	return 2;
}
