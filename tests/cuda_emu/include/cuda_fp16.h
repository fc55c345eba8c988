/*
 * cuda_fp16.h - the CUDA emulator's half precision: __half (IEEE binary16:
 * 1 sign, 5 exponent, 10 mantissa bits) and __half2, with the toolkit's
 * names. Conversions from float round to nearest even, with subnormals
 * (steps of 2^-24), overflow to infinity from 65520, NaN kept quiet (the
 * bits of F16C's vcvtps2ph and of runtime/rt.h's rt_to_f16); arithmetic is
 * done in float and rounded once. The emulated NCCL sums ncclHalf with it;
 * dp's kernels store f16 as bits (runtime/cuda/device.cuh). In C only the
 * storage type exists.
 */
#ifndef DPEMU_CUDA_FP16_H
#define DPEMU_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

#ifndef __cplusplus
typedef struct { unsigned short x; } __half;
typedef struct __attribute__((aligned(4))) { __half x, y; } __half2;
#else

static inline unsigned short dpemu_f2h_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u) /* NaN: quiet, the top of its payload */
		return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u) /* >= 65520 rounds to infinity */
		return (unsigned short)(sign | 0x7c00u);
	if (a >= 0x38800000u) /* normal: rebias, round at bit 13 to nearest even */
		return (unsigned short)(sign | ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13));
	if (a < 0x33000000u) /* below 2^-25 (a tie at 2^-25 goes to even 0) */
		return sign;
	uint32_t m = (a & 0x7fffffu) | 0x800000u, sh = 126u - (a >> 23);
	uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
	q += rem > half || (rem == half && (q & 1u));
	return (unsigned short)(sign | q);
}
static inline float dpemu_h2f(unsigned short h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
	if (e == 0x1f)
		u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
	else if (e)
		u = sign | ((e + 112u) << 23) | (m << 13);
	else if (m == 0)
		u = sign;
	else { /* subnormal: normalise */
		int s = 0;
		while (!(m & 0x400u))
			m <<= 1, s++;
		u = sign | ((uint32_t)(113 - s) << 23) | ((m & 0x3ffu) << 13);
	}
	float f;
	memcpy(&f, &u, 4);
	return f;
}

struct __half {
	unsigned short __x;
	__half() = default;
	__half(float f) : __x(dpemu_f2h_bits(f)) {}
	operator float() const { return dpemu_h2f(__x); }
};
struct __attribute__((aligned(4))) __half2 {
	__half x, y;
};

static inline __half __ushort_as_half(unsigned short u) { __half r; r.__x = u; return r; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline float __half2float(__half h) { return (float)h; }
static inline __half __hadd(__half a, __half b) { return __half((float)a + (float)b); }
static inline __half __hmul(__half a, __half b) { return __half((float)a * (float)b); }
#endif

#endif
