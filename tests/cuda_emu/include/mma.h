/*
 * mma.h - the CUDA emulator's warp matrix functions (nvcuda::wmma), the
 * subset runtime/cuda uses: the m16n16k16 shape with __nv_bfloat16 operands
 * and float accumulators (sm_80 and later), fill_fragment,
 * load_matrix_sync, mma_sync and store_matrix_sync, under the contract of
 * the CUDA C++ Programming Guide ("Warp Matrix Functions"):
 *
 *  - every call is warp-collective: all 32 lanes of the warp call it, at the
 *    same place, with the same pointer, ldm and layout (the guide: "the same
 *    values ... for all threads in the warp", else undefined). Here the lanes
 *    meet (tests/cuda_emu/kernel.cc's dpemu_warp_collective) and a lane that
 *    is elsewhere, has returned, or passes another pointer, ldm or layout
 *    ends the process naming the kernel, block and lane;
 *  - mptr is 256-bit (32-byte) aligned and ldm a multiple of 16 bytes (8
 *    bf16, 4 floats): anything else is refused the same way;
 *  - the mapping of a fragment's elements (x[0 .. num_elements)) to rows and
 *    columns is unspecified by NVIDIA. Code may only apply one operation to
 *    every element alike (scale, convert, fill), so the emulator uses a
 *    scrambled mapping of its own, different for each kind of fragment: code
 *    that assumes one (or that an accumulator's element i and an operand's
 *    element i are the same row and column) computes wrong numbers here;
 *  - mma_sync: d = a b + c with the bf16 products exact and the sums in
 *    float (in k order here; the hardware's order is its own, and the
 *    products are exact on both).
 * Memory is read and written at the call, by the last lane to arrive, while
 * the others wait: a tile another warp writes must be ordered before the
 * load by a barrier, as on the GPU (shared memory is 0xff-filled before each
 * block, so a load before the barrier reads NaN for some thread order).
 */
#ifndef DPEMU_MMA_H
#define DPEMU_MMA_H

#include <stdint.h>

#include "cuda_bf16.h"

void dpemu_warp_collective(void (*done)(void *const *args), void *arg, const char *file, int line);
[[noreturn]] void dpemu_kfail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class L> struct layout_of;
template <> struct layout_of<row_major> { static const int v = mem_row_major; };
template <> struct layout_of<col_major> { static const int v = mem_col_major; };
template <class U> struct use_id;
template <> struct use_id<matrix_a> { static const int v = 0; };
template <> struct use_id<matrix_b> { static const int v = 1; };
template <> struct use_id<accumulator> { static const int v = 2; };

/* Element e of lane l holds entry perm(use, 8 l + e) of the 16 x 16 tile
 * (row-major index): an odd multiplier mod 256 is a bijection; each use gets
 * its own, so no two kinds of fragment line up. */
static inline int entry(int use, int lane, int e)
{
	static const int mul[3] = {37, 101, 173}, add[3] = {11, 58, 203};
	return ((8 * lane + e) * mul[use] + add[use]) & 255;
}
} // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
	static_assert(M == 16 && N == 16 && K == 16, "the emulator has the m16n16k16 shape only");
	static const int use = detail::use_id<Use>::v;
	typedef T element_type;
	enum { num_elements = 8 };
	T x[8];
};

namespace detail {
static inline float widen(float v) { return v; }
static inline float widen(__nv_bfloat16 v) { return (float)v; }

struct Call {
	const char *what, *file;
	int line, use, layout, ldm, elem_bytes;
	const void *mem; /* the matrix in memory (load, store) */
	void *frag;      /* this lane's fragment: T x[8] */
	const void *a, *b, *c; /* mma_sync's operands (this lane's) */
	float value;     /* fill_fragment */
};

static inline void check_same(void *const *args)
{
	const Call *l0 = (const Call *)args[0];
	for (int i = 1; i < 32; i++) {
		const Call *o = (const Call *)args[i];
		if (o->mem != l0->mem || o->ldm != l0->ldm || o->layout != l0->layout)
			dpemu_kfail("%s at %s:%d: lane %d passes (%p, ldm %d, layout %d), lane 0 (%p, ldm "
				    "%d, layout %d): every lane must pass the same", l0->what, l0->file,
				    l0->line, i, o->mem, o->ldm, o->layout, l0->mem, l0->ldm, l0->layout);
	}
	if ((uintptr_t)l0->mem % 32)
		dpemu_kfail("%s at %s:%d: mptr %p is not 256-bit aligned", l0->what, l0->file, l0->line,
			    l0->mem);
	if (l0->ldm <= 0 || l0->ldm * l0->elem_bytes % 16)
		dpemu_kfail("%s at %s:%d: ldm %d is not a multiple of 16 bytes (%d %d-byte elements)",
			    l0->what, l0->file, l0->line, l0->ldm, 16 / l0->elem_bytes, l0->elem_bytes);
}

/* Entry (r, c) of a 16 x 16 tile at p, in memory layout lay with ldm. */
template <class T> static inline T *at(T *p, int lay, int ldm, int r, int c)
{
	return lay == mem_row_major ? p + (int64_t)r * ldm + c : p + (int64_t)c * ldm + r;
}

template <class T> static void load_all(void *const *args)
{
	check_same(args);
	const Call *l0 = (const Call *)args[0];
	const T *p = (const T *)l0->mem;
	for (int l = 0; l < 32; l++) {
		T *x = (T *)((const Call *)args[l])->frag;
		for (int e = 0; e < 8; e++) {
			int i = entry(l0->use, l, e);
			x[e] = *at(p, l0->layout, l0->ldm, i / 16, i % 16);
		}
	}
}

template <class T> static void store_all(void *const *args)
{
	check_same(args);
	const Call *l0 = (const Call *)args[0];
	T *p = (T *)l0->mem;
	for (int l = 0; l < 32; l++) {
		const T *x = (const T *)((const Call *)args[l])->frag;
		for (int e = 0; e < 8; e++) {
			int i = entry(l0->use, l, e);
			*at(p, l0->layout, l0->ldm, i / 16, i % 16) = x[e];
		}
	}
}

template <class TA, class TB, class TC> static void mma_all(void *const *args)
{
	float A[16][16], B[16][16], C[16][16];
	for (int l = 0; l < 32; l++) {
		const Call *cl = (const Call *)args[l];
		for (int e = 0; e < 8; e++) {
			int ia = entry(0, l, e), ib = entry(1, l, e), ic = entry(2, l, e);
			A[ia / 16][ia % 16] = widen(((const TA *)cl->a)[e]);
			B[ib / 16][ib % 16] = widen(((const TB *)cl->b)[e]);
			C[ic / 16][ic % 16] = widen(((const TC *)cl->c)[e]);
		}
	}
	for (int l = 0; l < 32; l++) {
		float *d = (float *)((const Call *)args[l])->frag;
		for (int e = 0; e < 8; e++) {
			int i = entry(2, l, e), r = i / 16, c = i % 16;
			float s = C[r][c];
			for (int k = 0; k < 16; k++)
				s += A[r][k] * B[k][c];
			d[e] = s;
		}
	}
}
} // namespace detail

#define DPEMU_WMMA_CALL(what_, use_, layout_, ldm_, bytes_, mem_, frag_)                        \
	detail::Call{what_, file, line, use_, layout_, (int)(ldm_), bytes_, mem_, frag_, 0, 0, 0, 0}

template <class Use, class T, class L>
static inline void load_matrix_sync_at(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm,
				       const char *file, int line)
{
	detail::Call c = DPEMU_WMMA_CALL("wmma::load_matrix_sync", f.use, detail::layout_of<L>::v,
					 ldm, (int)sizeof(T), p, f.x);
	dpemu_warp_collective(detail::load_all<T>, &c, file, line);
}
static inline void load_matrix_sync_at(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
				       unsigned ldm, layout_t lay, const char *file, int line)
{
	detail::Call c = DPEMU_WMMA_CALL("wmma::load_matrix_sync", f.use, (int)lay, ldm, 4, p, f.x);
	dpemu_warp_collective(detail::load_all<float>, &c, file, line);
}
static inline void store_matrix_sync_at(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
					unsigned ldm, layout_t lay, const char *file, int line)
{
	detail::Call c = DPEMU_WMMA_CALL("wmma::store_matrix_sync", f.use, (int)lay, ldm, 4, p,
					 (void *)f.x);
	dpemu_warp_collective(detail::store_all<float>, &c, file, line);
}
template <class LA, class LB>
static inline void mma_sync_at(fragment<accumulator, 16, 16, 16, float> &d,
			       const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
			       const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
			       const fragment<accumulator, 16, 16, 16, float> &c, const char *file,
			       int line)
{
	detail::Call k = DPEMU_WMMA_CALL("wmma::mma_sync", 2, 0, 0, 1, nullptr, d.x);
	k.a = a.x;
	k.b = b.x;
	k.c = c.x;
	dpemu_warp_collective(detail::mma_all<__nv_bfloat16, __nv_bfloat16, float>, &k, file, line);
}
/* fill_fragment: every element alike; no other lane is involved */
template <class Use, class T, class L, class V>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, const V &v)
{
	for (int e = 0; e < 8; e++)
		f.x[e] = (T)v;
}
#undef DPEMU_WMMA_CALL

} // namespace wmma
} // namespace nvcuda

#define load_matrix_sync(f, p, ...) load_matrix_sync_at(f, p, __VA_ARGS__, __FILE__, __LINE__)
#define store_matrix_sync(p, f, ...) store_matrix_sync_at(p, f, __VA_ARGS__, __FILE__, __LINE__)
#define mma_sync(d, a, b, c) mma_sync_at(d, a, b, c, __FILE__, __LINE__)

#endif
