/*
 * cuda_bf16.h - the CUDA emulator's bfloat16: __nv_bfloat16 (1 sign, 8
 * exponent, 7 mantissa bits) and __nv_bfloat162, with the toolkit's names.
 * Conversions from float round to nearest even (NaN stays a quiet NaN);
 * arithmetic is done in float and rounded once, as sm_80+ does for
 * __hadd/__hmul; __hfma rounds a*b+c computed in double (exact for bf16
 * operands unless the exponents differ by more than ~37) once to bf16.
 * In C only the storage type exists (the host code moves bf16 bits).
 */
#ifndef DPEMU_CUDA_BF16_H
#define DPEMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#ifndef __cplusplus
typedef struct { unsigned short x; } __nv_bfloat16;
typedef struct __attribute__((aligned(4))) { __nv_bfloat16 x, y; } __nv_bfloat162;
#else

#include "vector_types.h"

static inline unsigned short dpemu_f2bf_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet, keep the sign */
		return (unsigned short)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
	return (unsigned short)(u >> 16);
}
static inline unsigned short dpemu_d2bf_bits(double d)
{
	/* round the double to float with the bits below bf16 kept sticky, so
	 * the float -> bf16 rounding that follows is a single rounding */
	float f = (float)d;
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) < 0x7f800000u && (double)f != d && (u & 0xffffu) == 0x8000u)
		u += ((double)f < d) == (f > 0) ? 1 : -1; /* break a false tie */
	memcpy(&f, &u, 4);
	return dpemu_f2bf_bits(f);
}
static inline float dpemu_bf2f(unsigned short b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

struct __nv_bfloat16 {
	unsigned short __x;
	__nv_bfloat16() = default;
	__nv_bfloat16(float f) : __x(dpemu_f2bf_bits(f)) {}
	__nv_bfloat16(double d) : __x(dpemu_d2bf_bits(d)) {}
	__nv_bfloat16(int i) : __x(dpemu_d2bf_bits((double)i)) {}
	operator float() const { return dpemu_bf2f(__x); }
	__nv_bfloat16 &operator+=(__nv_bfloat16 o) { return *this = __nv_bfloat16((float)*this + (float)o); }
	__nv_bfloat16 &operator-=(__nv_bfloat16 o) { return *this = __nv_bfloat16((float)*this - (float)o); }
	__nv_bfloat16 &operator*=(__nv_bfloat16 o) { return *this = __nv_bfloat16((float)*this * (float)o); }
	__nv_bfloat16 &operator/=(__nv_bfloat16 o) { return *this = __nv_bfloat16((float)*this / (float)o); }
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
	__nv_bfloat16 x, y;
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

static inline __nv_bfloat16 operator+(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a + (float)b); }
static inline __nv_bfloat16 operator-(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a - (float)b); }
static inline __nv_bfloat16 operator*(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a * (float)b); }
static inline __nv_bfloat16 operator/(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a / (float)b); }
static inline __nv_bfloat16 operator-(__nv_bfloat16 a) { __nv_bfloat16 r = a; r.__x ^= 0x8000; return r; }

static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 r; r.__x = u; return r; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return __ushort_as_bfloat16((unsigned short)(u >> 16));
}
static inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
static inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
static inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return a - b; }
static inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
static inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return a / b; }
static inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return -a; }
static inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c)
{
	return __nv_bfloat16((double)(float)a * (double)(float)b + (double)(float)c);
}
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)}; }
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
static inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162{a, a}; }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{(float)h.x, (float)h.y}; }
static inline float __low2float(__nv_bfloat162 h) { return (float)h.x; }
static inline float __high2float(__nv_bfloat162 h) { return (float)h.y; }
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
static inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162{a.x + b.x, a.y + b.y}; }
static inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162{a.x * b.x, a.y * b.y}; }
static inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c)
{
	return __nv_bfloat162{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
#endif

#endif
