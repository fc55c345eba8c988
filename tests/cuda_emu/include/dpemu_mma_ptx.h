/*
 * dpemu_mma_ptx.h - the CUDA emulator's side of runtime/cuda/mma_ptx.cuh:
 * the two PTX instructions the tensor-core attention uses, whose register
 * layouts the PTX ISA specifies (unlike WMMA's, mma.h), emulated with
 * exactly those layouts:
 *
 *  - mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c
 *    (PTX ISA, "Warp-level matrix multiply-accumulate instructions: mma",
 *    and "Matrix Fragments for mma.m16n8k16 with floating point type").
 *    With g = lane >> 2 (groupID) and q = lane % 4 (threadID_in_group),
 *    each lane holds
 *      A (16 x 16, row): 4 .b32 of two bf16 each, low half first:
 *        a[0] = A[g][2q, 2q+1]      a[1] = A[g+8][2q, 2q+1]
 *        a[2] = A[g][2q+8, 2q+9]    a[3] = A[g+8][2q+8, 2q+9]
 *      B (16 x 8, col): b[0] = B[2q, 2q+1][g], b[1] = B[2q+8, 2q+9][g]
 *      C, D (16 x 8, f32): c[0..1] = C[g][2q, 2q+1], c[2..3] = C[g+8][2q, 2q+1]
 *    The products of bf16 are exact in float; the sums are float, in k
 *    order (the hardware's order is its own: agreement is to float
 *    rounding, not bits).
 *  - mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 d, a, b, c
 *    ("Matrix Fragments for mma.m16n8k8", .tf32): one tf32 per register,
 *      a[0] = A[g][q]   a[1] = A[g+8][q]   a[2] = A[g][q+4]   a[3] = A[g+8][q+4]
 *      b[0] = B[q][g]   b[1] = B[q+4][g]   C, D as above.
 *    An operand of type .tf32 is meant to hold what cvt.rna.tf32.f32 gives
 *    (the kernels convert every one); the emulator refuses an operand with
 *    any of its 13 low mantissa bits set (naming the call, the lane and the
 *    register) rather than guess what a tensor core does with them, so a
 *    missed conversion fails loudly. Products of tf32 are exact in float;
 *    the sums are float, in k order.
 *  - cvt.rna.tf32.f32 (dpemu_tf32): to the nearest tf32, ties away from
 *    zero (add half of the 13 dropped bits' weight, then clear them); inf
 *    and NaN unchanged. The emulated cuBLAS rounds TF32 GEMM inputs with it.
 *  - ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 r, [p]
 *    (PTX ISA, "Data Movement and Conversion Instructions: ldmatrix"): N
 *    8 x 8 matrices of 16-bit elements; lanes 8i .. 8i+7 give the addresses
 *    of matrix i's rows 0..7 (the other lanes' addresses are not used), each
 *    row 16 contiguous bytes, 16-byte aligned, in shared memory. Lane l
 *    receives in r[i] the elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1) of
 *    matrix i, low half first; .trans: (2(l%4), l/4) and (2(l%4)+1, l/4).
 *
 *  - cp.async.cg.shared.global [dst], [src], 16, n; cp.async.commit_group;
 *    cp.async.wait_group N (PTX ISA, "cp.async", "cp.async.commit_group",
 *    "cp.async.wait_group"): per thread, not warp-collective. The 16 bytes
 *    (n = 16; n = 0: zeros, src not read) are read at the issue and held
 *    by the emulated thread; they land in shared memory only when that
 *    thread executes a wait_group that covers their group (committed, and
 *    not among the N most recent), never earlier: so a read of the
 *    destination before that wait sees the bytes that were there (the
 *    block's 0xff fill, or the previous tile), by this thread or, before
 *    the barrier after the wait, by any other. Refused (the kernel, block
 *    and thread named): dst not 16-byte aligned or not in shared memory,
 *    src not 16-byte aligned or in shared memory, n other than 0 or 16, and
 *    a thread that returns with copies it never waited for (on a GPU they
 *    would land at some unknown time: a tile never read, or a missing wait).
 *
 * ldmatrix and mma are warp-collective (.sync.aligned: every lane of the warp executes
 * the same instruction): the lanes meet in dpemu_warp_collective, a lane
 * elsewhere ends the process naming the kernel, block and lane, and so do a
 * row address that is not 16-byte aligned or not in shared memory. mma
 * reads and writes only registers; ldmatrix reads shared memory when the
 * last lane arrives, so a tile written by other warps must be ordered
 * before it by a barrier, as on the GPU (the emulator fills shared memory
 * with 0xff, NaN, before every block).
 */
#ifndef DPEMU_MMA_PTX_H
#define DPEMU_MMA_PTX_H

#include <stdint.h>
#include <string.h>

#include "cuda_bf16.h"

void dpemu_warp_collective(void (*done)(void *const *args), void *arg, const char *file, int line);
[[noreturn]] void dpemu_kfail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* [p, p + n) lies in the running block's shared memory (static or dynamic) */
int dpemu_is_shared(const void *p, size_t n);

namespace dpemu_ptx {

struct Call {
	const char *file;
	int line;
	int n, trans;       /* ldmatrix: matrices, .trans */
	const void *row;    /* ldmatrix: this lane's row address */
	uint32_t *r;        /* ldmatrix: this lane's destination registers */
	float *d;           /* mma: this lane's D (and C: d = a b + d) */
	const uint32_t *a, *b;
};

static inline float bf_lo(uint32_t v)
{
	uint32_t u = v << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline float bf_hi(uint32_t v)
{
	uint32_t u = v & 0xffff0000u;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline float f32_of(uint32_t v)
{
	float f;
	memcpy(&f, &v, 4);
	return f;
}

/* Each lane's D registers (the C layout) = A B + C, the sums in float in
 * k order, once every lane's operands are gathered (m16n8kK). A row of D
 * is summed as two vectors of 4 columns (GCC's vector extension: SSE, not
 * left to the auto-vectoriser, which keeps this loop scalar), k outer: each
 * element is still C + A[r][0] B[0][n] + A[r][1] B[1][n] + ... in that
 * order, every product rounded on its own (-ffp-contract=off), so the same
 * bits as one scalar sum per element. */
typedef float dpemu_f4 __attribute__((vector_size(16)));
template <int K>
static inline void mma_scatter(void *const *args, const float (*A)[K], const float (*B)[8],
			       const float (*C)[8])
{
	float D[16][8];
	for (int r = 0; r < 16; r++) {
		dpemu_f4 s0, s1, b0, b1;
		memcpy(&s0, &C[r][0], 16);
		memcpy(&s1, &C[r][4], 16);
		for (int k = 0; k < K; k++) {
			memcpy(&b0, &B[k][0], 16);
			memcpy(&b1, &B[k][4], 16);
			dpemu_f4 a = {A[r][k], A[r][k], A[r][k], A[r][k]};
			dpemu_f4 p0 = a * b0, p1 = a * b1;
			s0 = s0 + p0;
			s1 = s1 + p1;
		}
		memcpy(&D[r][0], &s0, 16);
		memcpy(&D[r][4], &s1, 16);
	}
	for (int l = 0; l < 32; l++) {
		const Call *c = (const Call *)args[l];
		int g = l >> 2, q = l % 4;
		for (int i = 0; i < 4; i++)
			c->d[i] = D[g + 8 * (i >> 1)][2 * q + (i & 1)];
	}
}

static inline void mma_tf32_all(void *const *args)
{
	float A[16][8], B[8][8], C[16][8];
	for (int l = 0; l < 32; l++) {
		const Call *c = (const Call *)args[l];
		int g = l >> 2, q = l % 4;
		for (int i = 0; i < 6; i++) {
			uint32_t v = i < 4 ? c->a[i] : c->b[i - 4];
			if ((v & 0x7f800000u) != 0x7f800000u && (v & 0x1fffu))
				dpemu_kfail("mma .tf32 at %s:%d: lane %d's %c[%d] = 0x%08x is not a tf32 "
					    "(its 13 low mantissa bits are set): convert it with "
					    "cvt.rna.tf32.f32 first", c->file, c->line, l,
					    i < 4 ? 'a' : 'b', i < 4 ? i : i - 4, v);
		}
		for (int i = 0; i < 4; i++) /* a[i]: row g (+8 for odd i), column q (+4 for i >= 2) */
			A[g + 8 * (i & 1)][q + 4 * (i >> 1)] = f32_of(c->a[i]);
		for (int i = 0; i < 2; i++)
			B[q + 4 * i][g] = f32_of(c->b[i]);
		for (int i = 0; i < 4; i++)
			C[g + 8 * (i >> 1)][2 * q + (i & 1)] = c->d[i];
	}
	mma_scatter<8>(args, A, B, C);
}

static inline void mma_all(void *const *args)
{
	float A[16][16], B[16][8], C[16][8];
	for (int l = 0; l < 32; l++) {
		const Call *c = (const Call *)args[l];
		int g = l >> 2, q = l % 4;
		for (int i = 0; i < 4; i++) { /* a[i]: rows g (+8 for odd i), columns 2q (+8 for i >= 2) */
			int r = g + 8 * (i & 1), k = 2 * q + 8 * (i >> 1);
			A[r][k] = bf_lo(c->a[i]);
			A[r][k + 1] = bf_hi(c->a[i]);
		}
		for (int i = 0; i < 2; i++) {
			B[2 * q + 8 * i][g] = bf_lo(c->b[i]);
			B[2 * q + 8 * i + 1][g] = bf_hi(c->b[i]);
		}
		for (int i = 0; i < 4; i++)
			C[g + 8 * (i >> 1)][2 * q + (i & 1)] = c->d[i];
	}
	mma_scatter<16>(args, A, B, C);
}

static inline void ldmatrix_all(void *const *args)
{
	const Call *l0 = (const Call *)args[0];
	uint16_t M[4][8][8];
	for (int l = 0; l < 8 * l0->n; l++) {
		const Call *c = (const Call *)args[l];
		if (c->n != l0->n || c->trans != l0->trans)
			dpemu_kfail("ldmatrix at %s:%d: lane %d asks .x%d%s, lane 0 .x%d%s: every lane must "
				    "execute the same instruction", l0->file, l0->line, l, c->n,
				    c->trans ? ".trans" : "", l0->n, l0->trans ? ".trans" : "");
		if ((uintptr_t)c->row % 16)
			dpemu_kfail("ldmatrix at %s:%d: lane %d's row address %p is not 16-byte aligned",
				    l0->file, l0->line, l, c->row);
		if (!dpemu_is_shared(c->row, 16))
			dpemu_kfail("ldmatrix at %s:%d: lane %d's row address %p is not in shared memory",
				    l0->file, l0->line, l, c->row);
		memcpy(M[l / 8][l % 8], c->row, 16);
	}
	for (int l = 0; l < 32; l++) {
		const Call *c = (const Call *)args[l];
		int r = l / 4, k = 2 * (l % 4);
		for (int i = 0; i < l0->n; i++) {
			uint16_t lo = l0->trans ? M[i][k][r] : M[i][r][k];
			uint16_t hi = l0->trans ? M[i][k + 1][r] : M[i][r][k + 1];
			c->r[i] = (uint32_t)lo | (uint32_t)hi << 16;
		}
	}
}

} // namespace dpemu_ptx

/* d = a b + d (m16n8k16, bf16 operands, f32 accumulators) */
static inline void dpemu_mma_bf16(float *d, const uint32_t *a, const uint32_t *b, const char *file,
				  int line)
{
	dpemu_ptx::Call c{file, line, 0, 0, nullptr, nullptr, d, a, b};
	dpemu_warp_collective(dpemu_ptx::mma_all, &c, file, line);
}

/* d = a b + d (m16n8k8, tf32 operands, f32 accumulators) */
static inline void dpemu_mma_tf32(float *d, const uint32_t *a, const uint32_t *b, const char *file,
				  int line)
{
	dpemu_ptx::Call c{file, line, 0, 0, nullptr, nullptr, d, a, b};
	dpemu_warp_collective(dpemu_ptx::mma_tf32_all, &c, file, line);
}

/* cvt.rna.tf32.f32, as a float */
static inline float dpemu_tf32(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	if ((u & 0x7f800000u) != 0x7f800000u) {
		u += 0x1000u; /* half of the 13 dropped bits: ties away from zero */
		u &= ~0x1fffu;
	}
	memcpy(&x, &u, 4);
	return x;
}

/* cp.async (tests/cuda_emu/kernel.cc): the running thread's copy of 16
 * bytes, its commit_group and its wait_group n */
void dpemu_cp_async(void *dst, const void *src, int n, const char *file, int line);
void dpemu_cp_async_commit(void);
void dpemu_cp_async_wait(int n, const char *file, int line);

/* r[0 .. n) = ldmatrix .xN (.trans) of the rows whose addresses lanes give */
static inline void dpemu_ldmatrix(int n, int trans, uint32_t *r, const void *row, const char *file,
				  int line)
{
	dpemu_ptx::Call c{file, line, n, trans, row, r, nullptr, nullptr, nullptr};
	dpemu_warp_collective(dpemu_ptx::ldmatrix_all, &c, file, line);
}

#endif
