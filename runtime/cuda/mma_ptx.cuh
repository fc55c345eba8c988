/*
 * mma_ptx.cuh - the tensor-core instructions of the attention kernels
 * (attention.cu), as inline PTX under nvcc (sm_80 and later) and, compiled
 * as host C++ by the CUDA emulator, as its warp-collective emulation with
 * the same register layouts (tests/cuda_emu/include/dpemu_mma_ptx.h):
 *
 *   cu_mma_bf16(d, a, b)   d += a b: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *   cu_mma_tf32(d, a, b)   d += a b: mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
 *   cu_tf32(x)             x rounded to tf32 (10 mantissa bits, to nearest with
 *                          ties away from zero): cvt.rna.tf32.f32, as a float
 *   cu_ldsm<N>(r, p)       ldmatrix.sync.aligned.m8n8.xN.shared.b16
 *   cu_ldsm_t<N>(r, p)     the same, .trans
 *   cu_cp_async16(d, s, n) cp.async.cg.shared.global [d], [s], 16, n: 16 bytes
 *                          from global s to shared d, asynchronously (n = 16,
 *                          or 0: 16 zero bytes, s not read)
 *   cu_cp_async_commit()   cp.async.commit_group: the thread's copies issued
 *                          since the last commit become one group
 *   cu_cp_async_wait<N>()  cp.async.wait_group N: every group but the N most
 *                          recently committed has landed (the thread's own
 *                          copies: other threads see them after a barrier)
 *
 * The layouts are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with
 * floating point type" and "ldmatrix"), g = lane / 4, q = lane % 4; each
 * .b32 register holds two bf16, the lower column (or row) in the low half:
 *   A (16 x 16): a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..], a[2] = A[g][2q+8..],
 *                a[3] = A[g+8][2q+8..]
 *   B (16 x 8, k x n): b[0] = B[2q..2q+1][g], b[1] = B[2q+8..2q+9][g]
 *   C, D (16 x 8, f32): d[0], d[1] = D[g][2q], D[g][2q+1]; d[2], d[3] the same of row g+8
 *   ldmatrix: lanes 8i..8i+7 give the 16-byte-aligned shared addresses of
 *   matrix i's 8 rows; r[i] = matrix i's (g, 2q..2q+1), .trans (2q..2q+1, g).
 * m16n8k8 .tf32 ("Matrix Fragments for mma.m16n8k8" with .tf32): one
 * tf32 (an f32 whose 13 low mantissa bits are 0) per .b32 register:
 *   A (16 x 8): a[0] = A[g][q], a[1] = A[g+8][q], a[2] = A[g][q+4], a[3] = A[g+8][q+4]
 *   B (8 x 8, k x n): b[0] = B[q][g], b[1] = B[q+4][g]
 *   C, D: as m16n8k16's.
 * So an 8 x 8 tile read by ldmatrix is an A or B register as it stands:
 * rows of K (keys, head dims contiguous) are B = K^T's registers, rows of V
 * through .trans are B = V's, and the C registers of one mma are, packed
 * to bf16 in pairs, the A registers of the next (FlashAttention-2's P).
 */
#ifndef DP_CU_MMA_PTX_CUH
#define DP_CU_MMA_PTX_CUH

#include <stdint.h>

#ifdef __CUDACC__

static __device__ __forceinline__ void cu_mma_tf32(float *d, const uint32_t *a, const uint32_t *b)
{
	asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
		     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ float cu_tf32(float x)
{
	uint32_t u;
	asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(u) : "f"(x));
	return __uint_as_float(u);
}

static __device__ __forceinline__ void cu_mma_bf16(float *d, const uint32_t *a, const uint32_t *b)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* cu_ldsm / cu_ldsm_t: ldmatrix of N (1, 2, 4) 8x8 b16 tiles from shared
 * memory, as stored / transposed (.trans); one body, the qualifier pasted
 * into the instruction's text */
#define CU_LDSM(NAME, TRANS)                                                                      \
	template <int N> static __device__ __forceinline__ void NAME(uint32_t *r, const void *p)    \
	{                                                                                         \
		uint32_t s = (uint32_t)__cvta_generic_to_shared(p);                                 \
		if constexpr (N == 1)                                                               \
			asm volatile("ldmatrix.sync.aligned.m8n8.x1" TRANS ".shared.b16 {%0}, [%1];\n" \
				     : "=r"(r[0]) : "r"(s) : "memory");                               \
		else if constexpr (N == 2)                                                          \
			asm volatile("ldmatrix.sync.aligned.m8n8.x2" TRANS                            \
				     ".shared.b16 {%0, %1}, [%2];\n"                                   \
				     : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");                   \
		else                                                                                \
			asm volatile("ldmatrix.sync.aligned.m8n8.x4" TRANS                            \
				     ".shared.b16 {%0, %1, %2, %3}, [%4];\n"                           \
				     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s)          \
				     : "memory");                                                     \
	}
CU_LDSM(cu_ldsm, "")
CU_LDSM(cu_ldsm_t, ".trans")
#undef CU_LDSM

/* cp.async (sm_80 and later; PTX ISA, "Data Movement and Conversion
 * Instructions: cp.async"): .cg (cached in L2 only: the tile is read once
 * per block), 16 bytes, src-size n (0: zero-fill, the source not read) */
static __device__ __forceinline__ void cu_cp_async16(void *dst, const void *src, int n)
{
	uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" : : "r"(s), "l"(src), "r"(n)
		     : "memory");
}

static __device__ __forceinline__ void cu_cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" : : : "memory");
}

template <int N> static __device__ __forceinline__ void cu_cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" : : "n"(N) : "memory");
}

#else /* the CUDA emulator: the same layouts, every lane's registers at once;
       * the call's place (GCC's __builtin_FILE/LINE at the caller) names it
       * in the emulator's diagnostics */

#include <dpemu_mma_ptx.h>

static inline void cu_mma_bf16(float *d, const uint32_t *a, const uint32_t *b,
			       const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	dpemu_mma_bf16(d, a, b, file, line);
}

static inline void cu_mma_tf32(float *d, const uint32_t *a, const uint32_t *b,
			       const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	dpemu_mma_tf32(d, a, b, file, line);
}

static inline float cu_tf32(float x)
{
	return dpemu_tf32(x);
}

template <int N>
static inline void cu_ldsm(uint32_t *r, const void *p, const char *file = __builtin_FILE(),
			   int line = __builtin_LINE())
{
	static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
	dpemu_ldmatrix(N, 0, r, p, file, line);
}

template <int N>
static inline void cu_ldsm_t(uint32_t *r, const void *p, const char *file = __builtin_FILE(),
			     int line = __builtin_LINE())
{
	static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
	dpemu_ldmatrix(N, 1, r, p, file, line);
}

/* cp.async: the copy lands in shared memory only at the wait_group that
 * covers its group (dpemu_mma_ptx.h) */
static inline void cu_cp_async16(void *dst, const void *src, int n, const char *file = __builtin_FILE(),
				 int line = __builtin_LINE())
{
	dpemu_cp_async(dst, src, n, file, line);
}

static inline void cu_cp_async_commit(void)
{
	dpemu_cp_async_commit();
}

template <int N>
static inline void cu_cp_async_wait(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	dpemu_cp_async_wait(N, file, line);
}

#endif

#endif
