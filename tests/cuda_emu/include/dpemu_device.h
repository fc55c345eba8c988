/*
 * dpemu_device.h - the device side of the CUDA emulator: what nvcc provides
 * implicitly to a .cu file, for the same file compiled as host C++ (`make
 * cuda-emu` force-includes this header into runtime/cuda/kernels.cu).
 *
 *  - qualifiers: __global__/__device__/__host__ vanish; __shared__ is a
 *    static in the section "dpemu_shared", which the emulator fills with
 *    0xff bytes (NaN as floats) before every block, so a read before a
 *    write, or before the __syncthreads that should order it, shows.
 *    Blocks run one after another, so one static copy is per block.
 *    `extern __shared__ T name[];` (dynamic shared memory) is rewritten by
 *    the build into a pointer to the launch's dynamic region
 *    (dpemu_dyn_smem(), mk/cuda-emu.mk).
 *  - built-ins: threadIdx, blockIdx, blockDim, gridDim, warpSize; the
 *    emulator's registers for the thread running now.
 *  - __syncthreads and the warp primitives: the emulated thread is a fiber;
 *    these are where it yields (tests/cuda_emu/kernel.cc has the rules).
 *  - atomics: plain read-modify-write (a fiber never yields inside one).
 *  - math: libm. The results differ from the GPU's where CUDA's functions
 *    are not correctly rounded (docs/CUDA-EMU.md lists the ulps).
 *  - launches: CU_LAUNCH / CU_LAUNCH_SMEM, runtime/cuda/kernels.cu's hooks,
 *    queue the kernel on its stream with its arguments converted to the
 *    kernel's parameter types and copied, as a real launch does; pointer
 *    arguments must be device memory (or mapped pinned host memory).
 */
#ifndef DPEMU_DEVICE_H
#define DPEMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static __attribute__((section("dpemu_shared")))

/* ---- built-in registers of the running emulated thread ---- */
struct DpemuRegs {
	uint3 tid, bid;
	dim3 bdim, gdim;
};
extern DpemuRegs dpemu_regs;
#define threadIdx (static_cast<const uint3 &>(dpemu_regs.tid))
#define blockIdx (static_cast<const uint3 &>(dpemu_regs.bid))
#define blockDim (static_cast<const dim3 &>(dpemu_regs.bdim))
#define gridDim (static_cast<const dim3 &>(dpemu_regs.gdim))
#define warpSize 32

/* ---- synchronisation (tests/cuda_emu/kernel.cc) ---- */
enum DpemuBar { DPEMU_BAR_SYNC, DPEMU_BAR_COUNT, DPEMU_BAR_AND, DPEMU_BAR_OR };
int dpemu_barrier(int kind, int pred, const char *file, int line);
enum DpemuWarpOp {
	DPEMU_SHFL_IDX, DPEMU_SHFL_UP, DPEMU_SHFL_DOWN, DPEMU_SHFL_XOR,
	DPEMU_BALLOT, DPEMU_ANY, DPEMU_ALL, DPEMU_SYNCWARP,
	DPEMU_COLLECTIVE /* dpemu_warp_collective */
};
uint64_t dpemu_warp(int op, unsigned mask, uint64_t value, int arg, int width, const char *file,
		    int line);
unsigned dpemu_activemask(void);
/* A warp-collective operation (mma.h's wmma): all 32 lanes of the warp call
 * it at the same place, each with its own arg; the last to arrive runs
 * done(args), args[lane] being each lane's arg, while the others wait (so it
 * may read and write every lane's fragments), then all go on. */
void dpemu_warp_collective(void (*done)(void *const *args), void *arg, const char *file, int line);
/* Fail the running kernel (names the kernel, block and thread; exit 99). */
[[noreturn]] void dpemu_kfail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *dpemu_dyn_smem(void);

#define __syncthreads() ((void)dpemu_barrier(DPEMU_BAR_SYNC, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) dpemu_barrier(DPEMU_BAR_COUNT, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_and(p) dpemu_barrier(DPEMU_BAR_AND, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_or(p) dpemu_barrier(DPEMU_BAR_OR, (p) != 0, __FILE__, __LINE__)
#define __syncwarp(...) ((void)dpemu_warp(DPEMU_SYNCWARP, dpemu_mask_or_full(__VA_ARGS__), 0, 0, 32, __FILE__, __LINE__))
static inline unsigned dpemu_mask_or_full(unsigned m = 0xffffffffu) { return m; }
#define __activemask() dpemu_activemask()

template <class T> static inline uint64_t dpemu_bits(T v)
{
	static_assert(sizeof(T) <= 8, "warp shuffles move 4 or 8 bytes");
	uint64_t u = 0;
	memcpy(&u, &v, sizeof v);
	return u;
}
template <class T> static inline T dpemu_from_bits(uint64_t u)
{
	T v;
	memcpy(&v, &u, sizeof v);
	return v;
}
#define DPEMU_SHFL(name, op)                                                                    \
	template <class T> static inline T name##_at(unsigned mask, T v, int arg, int width,      \
						     const char *f, int l)                       \
	{                                                                                       \
		return dpemu_from_bits<T>(dpemu_warp(op, mask, dpemu_bits(v), arg, width, f, l)); \
	}
DPEMU_SHFL(dpemu_shfl, DPEMU_SHFL_IDX)
DPEMU_SHFL(dpemu_shfl_up, DPEMU_SHFL_UP)
DPEMU_SHFL(dpemu_shfl_down, DPEMU_SHFL_DOWN)
DPEMU_SHFL(dpemu_shfl_xor, DPEMU_SHFL_XOR)
static inline int dpemu_width(int w = 32) { return w; }
#define __shfl_sync(m, v, a, ...) dpemu_shfl_at((m), (v), (a), dpemu_width(__VA_ARGS__), __FILE__, __LINE__)
#define __shfl_up_sync(m, v, a, ...) dpemu_shfl_up_at((m), (v), (a), dpemu_width(__VA_ARGS__), __FILE__, __LINE__)
#define __shfl_down_sync(m, v, a, ...) dpemu_shfl_down_at((m), (v), (a), dpemu_width(__VA_ARGS__), __FILE__, __LINE__)
#define __shfl_xor_sync(m, v, a, ...) dpemu_shfl_xor_at((m), (v), (a), dpemu_width(__VA_ARGS__), __FILE__, __LINE__)
#define __ballot_sync(m, p) ((unsigned)dpemu_warp(DPEMU_BALLOT, (m), (p) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(m, p) ((int)dpemu_warp(DPEMU_ANY, (m), (p) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(m, p) ((int)dpemu_warp(DPEMU_ALL, (m), (p) != 0, 0, 32, __FILE__, __LINE__))

/* The emulator's memory model is sequentially consistent: fences are no-ops
 * (what they order on a GPU is not verified here; docs/CUDA-EMU.md). */
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
static inline void __threadfence_system(void) {}
static inline void __nanosleep(unsigned) {}
long long dpemu_clock(void);
static inline long long clock64(void) { return dpemu_clock(); }

/* ---- atomics: a fiber does not yield inside one ---- */
template <class T, class U> static inline T atomicAdd(T *p, U v) { T o = *p; *p = (T)(o + (T)v); return o; }
template <class T, class U> static inline T atomicSub(T *p, U v) { T o = *p; *p = (T)(o - (T)v); return o; }
template <class T, class U> static inline T atomicExch(T *p, U v) { T o = *p; *p = (T)v; return o; }
template <class T, class U> static inline T atomicMax(T *p, U v) { T o = *p; if ((T)v > o) *p = (T)v; return o; }
template <class T, class U> static inline T atomicMin(T *p, U v) { T o = *p; if ((T)v < o) *p = (T)v; return o; }
template <class T, class U> static inline T atomicAnd(T *p, U v) { T o = *p; *p = o & (T)v; return o; }
template <class T, class U> static inline T atomicOr(T *p, U v) { T o = *p; *p = o | (T)v; return o; }
template <class T, class U> static inline T atomicXor(T *p, U v) { T o = *p; *p = o ^ (T)v; return o; }
template <class T, class U, class V> static inline T atomicCAS(T *p, U cmp, V v)
{
	T o = *p;
	if (o == (T)cmp)
		*p = (T)v;
	return o;
}
static inline unsigned atomicInc(unsigned *p, unsigned v) { unsigned o = *p; *p = o >= v ? 0 : o + 1; return o; }
static inline unsigned atomicDec(unsigned *p, unsigned v) { unsigned o = *p; *p = (o == 0 || o > v) ? v : o - 1; return o; }
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
#define atomicCAS_block atomicCAS
#define atomicMax_block atomicMax

/* ---- loads and stores with cache hints: plain ---- */
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
template <class T> static inline T __ldca(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline T __ldlu(const T *p) { return *p; }
template <class T> static inline T __ldcv(const T *p) { return *p; }
template <class T> static inline void __stcg(T *p, T v) { *p = v; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }
template <class T> static inline void __stwb(T *p, T v) { *p = v; }
template <class T> static inline void __stwt(T *p, T v) { *p = v; }

/* ---- integer and bit intrinsics ---- */
template <class A, class B> static inline auto min(A a, B b) -> decltype(a + b) { return b < a ? b : a; }
template <class A, class B> static inline auto max(A a, B b) -> decltype(a + b) { return a < b ? b : a; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x)
{
	unsigned r = 0;
	for (int i = 0; i < 32; i++, x >>= 1)
		r = (r << 1) | (x & 1);
	return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __mul24(int a, int b) { return (int)((long long)(a << 8 >> 8) * (b << 8 >> 8)); }
static inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffff) * (b & 0xffffff); }

/* ---- float intrinsics (libm; the fast approximations are exact here) ---- */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
/* glibc declares __expf & co. itself: these are macros */
#define __expf(x) expf(x)
#define __exp10f(x) powf(10.0f, (x))
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __powf(a, b) powf((a), (b))
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __sincosf(x, s, c) sincosf((x), (s), (c))
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __saturatef(float x) { return x != x ? 0.0f : x < 0 ? 0.0f : x > 1 ? 1.0f : x; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned x) { return (float)x; }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
static inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
static inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }
static inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
static inline double __longlong_as_double(long long i) { double x; memcpy(&x, &i, 8); return x; }

/* ---- launches ---- */
namespace dpemu {
struct LaunchSite {
	const char *kernel, *file;
	int line;
};
/* Queue a launch (tests/cuda_emu/kernel.cc); the last error as a launch
 * leaves it. */
cudaError_t launch(const LaunchSite &at, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
		   const void *func, std::function<void()> body);
/* A pointer argument must be device-accessible (or NULL). */
void check_arg(const LaunchSite &at, int index, const volatile void *p);
template <class T> inline void check_one(const LaunchSite &at, int i, const T &v)
{
	if constexpr (std::is_pointer<T>::value)
		check_arg(at, i, (const volatile void *)v);
}
template <class... P, class... A>
inline cudaError_t launch_kernel(const LaunchSite &at, dim3 grid, dim3 block, size_t smem,
				 cudaStream_t st, void (*k)(P...), A &&...args)
{
	static_assert(sizeof...(P) == sizeof...(A), "CU_LAUNCH: wrong number of kernel arguments");
	auto tup = std::make_shared<std::tuple<typename std::decay<P>::type...>>(std::forward<A>(args)...);
	std::apply([&at](const auto &...v) { int i = 0; (check_one(at, i++, v), ...); }, *tup);
	return launch(at, grid, block, smem, st, (const void *)k, [k, tup]() { std::apply(k, *tup); });
}
} // namespace dpemu

#define CU_LAUNCH(kernel, grid, block, stream, ...)                                               \
	dpemu::launch_kernel(dpemu::LaunchSite{#kernel, __FILE__, __LINE__}, (grid), (block), 0, \
			     (stream), kernel, ##__VA_ARGS__)
#define CU_LAUNCH_SMEM(kernel, grid, block, smem, stream, ...)                                          \
	dpemu::launch_kernel(dpemu::LaunchSite{#kernel, __FILE__, __LINE__}, (grid), (block), (smem), \
			     (stream), kernel, ##__VA_ARGS__)

#endif
