/*
 * cpu/vec.c - the CPU kernels' inner loops (the CpuVec table, cpu/cpu.h),
 * written once with GCC's vector extensions and built three times by the
 * Makefile, one object per instruction set:
 *   VEC_ISA=2  -mavx512f -mavx2 -mfma  cpu_vec_avx512  16 lanes, SLEEF avx512f
 *   VEC_ISA=1  -mavx2 -mfma            cpu_vec_avx2     8 lanes, SLEEF avx2
 *   VEC_ISA=0  (no flags)              cpu_vec_scalar   4 lanes, libm per lane
 * backend_cpu.c picks one at run time from the CPU's features (cpuid), so
 * one dpexec runs everywhere; DP_CPU_ISA=scalar|avx2|avx512 forces one.
 *
 * Accuracy: SLEEF's _u10 functions (expf, tanhf, and exp in double) are
 * within 1.0 ulp of the exact result (SLEEF's documented bound), like
 * glibc's expf/tanhf that the scalar table calls. Everything else is IEEE
 * arithmetic in the order the scalar kernels wrote it: the build uses
 * -std=c11, so nothing is contracted into FMAs, and +, *, /, sqrt round the
 * same in a vector lane as in a scalar. So the elementwise results differ
 * from the scalar table's only through exp/tanh (<= 2 ulp apart), and
 * sums only in their order (all sums are in double).
 *
 * Every loop handles its tail by padding one more vector, so an element's
 * result never depends on where it sits in the array or where a parallel
 * loop was cut.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

/* Wider-than-native vectors (W doubles) pass between static functions
 * only, inlined: no ABI is involved. */
#pragma GCC diagnostic ignored "-Wpsabi"

#if VEC_ISA == 2
#include <immintrin.h>
#include <sleef.h>
#define W 16 /* float lanes */
#define DW 8 /* double lanes of the native double vector */
typedef __m512 VF;
typedef __m512d VDN;
#define v_exp Sleef_expf16_u10avx512f
#define v_tanh Sleef_tanhf16_u10avx512f
#define v_expd Sleef_expd8_u10avx512f
#define v_sqrt _mm512_sqrt_ps
#define VEC_TABLE cpu_vec_avx512
#define VEC_NAME "avx512"
#elif VEC_ISA == 1
#include <immintrin.h>
#include <sleef.h>
#define W 8
#define DW 4
typedef __m256 VF;
typedef __m256d VDN;
#define v_exp Sleef_expf8_u10avx2
#define v_tanh Sleef_tanhf8_u10avx2
#define v_expd Sleef_expd4_u10avx2
#define v_sqrt _mm256_sqrt_ps
#define VEC_TABLE cpu_vec_avx2
#define VEC_NAME "avx2"
#else
#define W 4
#define DW 2
typedef float VF __attribute__((vector_size(W * 4)));
typedef double VDN __attribute__((vector_size(DW * 8)));
/* libm on each lane */
#define LANEWISE(name, T, lanes, f)                  \
	static inline T name(T x)                    \
	{                                            \
		for (int k = 0; k < (lanes); k++)    \
			x[k] = f(x[k]);              \
		return x;                            \
	}
LANEWISE(v_exp, VF, W, expf)
LANEWISE(v_tanh, VF, W, tanhf)
LANEWISE(v_expd, VDN, DW, exp)
LANEWISE(v_sqrt, VF, W, sqrtf)
#define VEC_TABLE cpu_vec_scalar
#define VEC_NAME "scalar"
#endif

typedef double VD __attribute__((vector_size(W * 8)));   /* W doubles */
typedef int VI __attribute__((vector_size(W * 4)));       /* W lanes of masks */
typedef float VFH __attribute__((vector_size(DW * 4)));   /* DW floats */

static inline VF ld(const float *p)
{
	VF v;
	memcpy(&v, p, sizeof v);
	return v;
}
static inline void st(float *p, VF v) { memcpy(p, &v, sizeof v); }
static inline VF splat(float s) { return (VF){0} + s; }
static inline VD widen(VF v) { return __builtin_convertvector(v, VD); }
static inline VF narrow(VD v) { return __builtin_convertvector(v, VF); }
static inline VF sel(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }
static inline double hsum(VD v)
{
	double s = 0;
	for (int k = 0; k < W; k++)
		s += v[k];
	return s;
}

/* The tail of n - i < W elements of p, padded with `pad`. */
static inline VF ld_tail(const float *p, int64_t rem, float pad)
{
	float t[W];
	for (int k = 0; k < W; k++)
		t[k] = k < rem ? p[k] : pad;
	return ld(t);
}
static inline void st_tail(float *p, int64_t rem, VF v)
{
	float t[W];
	st(t, v);
	memcpy(p, t, (size_t)rem * sizeof(float));
}

/* ---- elementwise maps ---- */

static const float gelu_s = 0.7978845608028654f; /* sqrt(2/pi) */

/*
 * GELU, tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 * evaluated as x * sigma(2u) = x / (1 + e), e = exp(-2u): the same function
 * (1 + tanh(u) = 2 sigma(2u)), with one exp (SLEEF's expf is 3x faster than
 * its 1-ulp tanhf) and without the cancellation in 1 + tanh(u) for negative
 * x that costs the tanh form its relative accuracy there. Measured against
 * the form in double over [-12, 12]: <= 3 ulp (bench/README: vec accuracy).
 * -2u is capped at 80 so that e stays finite (sigma is then 2e-35: 0 to
 * any purpose) and e * sigma in the gradient never becomes inf * 0.
 */
static inline VF gelu_e(VF x)
{
	VF t = splat(-2.0f * gelu_s) * (x + splat(0.044715f) * x * x * x);
	return v_exp(sel(t < splat(80.0f), t, splat(80.0f)));
}

static inline VF map_one(CpuMap op, VF a, VF b, float s)
{
	switch (op) {
	case MAP_ACCUM: /* o = a + o: map() passes o as b */
	case MAP_ADD:
		return a + b;
	case MAP_SCALE:
		return splat(s) * a;
	case MAP_MUL:
		return a * b;
	case MAP_RELU:
		return sel(a > splat(0), a, splat(0));
	case MAP_RELU_GRAD:
		return sel(b > splat(0), a, splat(0));
	case MAP_GELU: {
		VF e = gelu_e(a);
		return a / (splat(1.0f) + e);
	}
	case MAP_GELU_GRAD: {
		/* s = sigma(2u), 1 - s = e * s: gelu' = s * (1 + 2 x e s du) */
		VF x = b, e = gelu_e(x), sg = splat(1.0f) / (splat(1.0f) + e);
		VF du = splat(gelu_s) * (splat(1.0f) + splat(3.0f * 0.044715f) * x * x);
		return a * (sg * (splat(1.0f) + splat(2.0f) * x * e * sg * du));
	}
	case MAP_TANH:
		return v_tanh(a);
	case MAP_TANH_GRAD:
		return a * (splat(1.0f) - b * b);
	case MAP_SILU:
		return a / (splat(1.0f) + v_exp(-a));
	case MAP_SILU_GRAD: {
		VF sg = splat(1.0f) / (splat(1.0f) + v_exp(-b));
		return a * sg * (splat(1.0f) + b * (splat(1.0f) - sg));
	}
	default:
		return a;
	}
}

/* One loop per op, so that the switch is outside the loop. */
#define MAP_LOOP(OP)                                                                 \
	case OP: {                                                                   \
		int64_t i = 0;                                                       \
		for (; i + W <= n; i += W)                                           \
			st(o + i, map_one(OP, ld(a + i), ld(b + i), s));             \
		if (i < n)                                                           \
			st_tail(o + i, n - i,                                        \
				map_one(OP, ld_tail(a + i, n - i, 0), ld_tail(b + i, n - i, 0), s)); \
		break;                                                               \
	}

static void map(CpuMap op, float *o, const float *a, const float *b, float s, int64_t n)
{
	if (op == MAP_ACCUM)
		b = o;
	else if (!b)
		b = a;
	switch (op) {
		MAP_LOOP(MAP_ACCUM)
		MAP_LOOP(MAP_SCALE)
		MAP_LOOP(MAP_ADD)
		MAP_LOOP(MAP_MUL)
		MAP_LOOP(MAP_RELU)
		MAP_LOOP(MAP_RELU_GRAD)
		MAP_LOOP(MAP_GELU)
		MAP_LOOP(MAP_GELU_GRAD)
		MAP_LOOP(MAP_TANH)
		MAP_LOOP(MAP_TANH_GRAD)
		MAP_LOOP(MAP_SILU)
		MAP_LOOP(MAP_SILU_GRAD)
	default:
		break;
	}
}

/* ---- rows: softmax, cross entropy ---- */

static float vmax(const float *x, int64_t n)
{
	VF m = splat(x[0]);
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF v = ld(x + i);
		m = sel(v > m, v, m);
	}
	if (i < n) {
		VF v = ld_tail(x + i, n - i, x[0]);
		m = sel(v > m, v, m);
	}
	float best = m[0];
	for (int k = 1; k < W; k++)
		best = m[k] > best ? m[k] : best;
	return best;
}

static double exp_shift(float *y, const float *x, float shift, int64_t n)
{
	VD acc = {0};
	VF sh = splat(shift);
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF e = v_exp(ld(x + i) - sh);
		st(y + i, e);
		acc += widen(e);
	}
	if (i < n) {
		VF e = v_exp(ld_tail(x + i, n - i, -INFINITY) - sh); /* pads: exp(-inf) = 0 */
		st_tail(y + i, n - i, e);
		acc += widen(e);
	}
	return hsum(acc);
}

static double exp_sum_d(const float *x, double shift, int64_t n)
{
	VDN acc = {0}, sh = (VDN){0} + shift;
	int64_t i = 0;
	for (; i + DW <= n; i += DW) {
		VFH h;
		memcpy(&h, x + i, sizeof h);
		acc += v_expd(__builtin_convertvector(h, VDN) - sh);
	}
	if (i < n) {
		VDN t;
		for (int k = 0; k < DW; k++)
			t[k] = i + k < n ? (double)x[i + k] : -INFINITY;
		acc += v_expd(t - sh);
	}
	double s = 0;
	for (int k = 0; k < DW; k++)
		s += acc[k];
	return s;
}

static double dot(const float *a, const float *b, int64_t n)
{
	VD acc = {0};
	int64_t i = 0;
	for (; i + W <= n; i += W)
		acc += widen(ld(a + i)) * widen(ld(b + i));
	if (i < n)
		acc += widen(ld_tail(a + i, n - i, 0)) * widen(ld_tail(b + i, n - i, 0));
	return hsum(acc);
}

/* in double, rounded once: (float)(p * (d - c)) */
static void softmax_bwd(float *o, const float *p, const float *d, double c, int64_t n)
{
	VD cc = (VD){0} + c;
	int64_t i = 0;
	for (; i + W <= n; i += W)
		st(o + i, narrow(widen(ld(p + i)) * (widen(ld(d + i)) - cc)));
	if (i < n)
		st_tail(o + i, n - i,
			narrow(widen(ld_tail(p + i, n - i, 0)) * (widen(ld_tail(d + i, n - i, 0)) - cc)));
}

/* ---- layernorm / rmsnorm rows (double statistics, as the scalar kernels) ---- */

/* sum of (double)x^2 */
static double sqsum(const float *x, int64_t n)
{
	VD acc = {0};
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VD v = widen(ld(x + i));
		acc += v * v;
	}
	if (i < n) {
		VD v = widen(ld_tail(x + i, n - i, 0));
		acc += v * v;
	}
	return hsum(acc);
}

static void norm_stats(const float *x, int64_t n, int rms, double eps, double *mean, double *rstd)
{
	VD acc = {0};
	int64_t i = 0;
	if (rms) {
		*mean = 0;
		*rstd = 1.0 / sqrt(sqsum(x, n) / (double)n + eps);
		return;
	}
	/* two sweeps over a row that sits in L1: mean, then the centred squares */
	for (; i + W <= n; i += W)
		acc += widen(ld(x + i));
	if (i < n)
		acc += widen(ld_tail(x + i, n - i, 0));
	double m = hsum(acc) / (double)n;
	VD mv = (VD){0} + m, q = {0};
	for (i = 0; i + W <= n; i += W) {
		VD d = widen(ld(x + i)) - mv;
		q += d * d;
	}
	if (i < n) {
		VD d = widen(ld_tail(x + i, n - i, 0)) - mv;
		VD keep = {0};
		for (int k = 0; k < n - i; k++)
			keep[k] = 1;
		q += d * d * keep; /* pads are 0 - m: not part of the row */
	}
	*mean = m;
	*rstd = 1.0 / sqrt(hsum(q) / (double)n + eps);
}

static void norm_fwd(float *y, const float *x, const float *g, const float *b, int64_t n,
		     double mean, double rstd)
{
	VD mv = (VD){0} + mean, rv = (VD){0} + rstd;
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF xh = narrow((widen(ld(x + i)) - mv) * rv);
		st(y + i, b ? xh * ld(g + i) + ld(b + i) : xh * ld(g + i));
	}
	if (i < n) {
		int64_t r = n - i;
		VF xh = narrow((widen(ld_tail(x + i, r, 0)) - mv) * rv);
		VF gv = ld_tail(g + i, r, 0);
		st_tail(y + i, r, b ? xh * gv + ld_tail(b + i, r, 0) : xh * gv);
	}
}

/*
 * dx with xhat = (x - mean) * rstd and gd = dy * g (in double):
 *   layernorm: dx = rstd * (gd - mean(gd) - xhat * mean(gd * xhat))
 *   rmsnorm:   dx = rstd * (gd - xhat * mean(gd * xhat))
 */
static void norm_bwd(float *dx, const float *dy, const float *x, const float *g, int64_t n,
		     int rms, double mean, double rstd)
{
	VD mv = (VD){0} + mean, rv = (VD){0} + rstd, sgv = {0}, sgxv = {0};
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VD gd = widen(ld(dy + i)) * widen(ld(g + i));
		sgv += gd;
		sgxv += gd * (widen(ld(x + i)) - mv) * rv;
	}
	if (i < n) {
		int64_t r = n - i;
		VD gd = widen(ld_tail(dy + i, r, 0)) * widen(ld_tail(g + i, r, 0));
		sgv += gd;
		sgxv += gd * (widen(ld_tail(x + i, r, 0)) - mv) * rv; /* gd = 0 on pads */
	}
	double sg = rms ? 0 : hsum(sgv) / (double)n, sgx = hsum(sgxv) / (double)n;
	VD sgb = (VD){0} + sg, sgxb = (VD){0} + sgx;
	for (i = 0; i + W <= n; i += W) {
		VD xh = (widen(ld(x + i)) - mv) * rv;
		VD gd = widen(ld(dy + i)) * widen(ld(g + i));
		st(dx + i, narrow(rv * (gd - sgb - xh * sgxb)));
	}
	if (i < n) {
		int64_t r = n - i;
		VD xh = (widen(ld_tail(x + i, r, 0)) - mv) * rv;
		VD gd = widen(ld_tail(dy + i, r, 0)) * widen(ld_tail(g + i, r, 0));
		st_tail(dx + i, r, narrow(rv * (gd - sgb - xh * sgxb)));
	}
}

static inline VD ldd(const double *p)
{
	VD v;
	memcpy(&v, p, sizeof v);
	return v;
}
static inline void std_(double *p, VD v) { memcpy(p, &v, sizeof v); }

static void norm_gamma(double *acc, const float *dy, const float *x, int64_t n, double mean,
		       double rstd)
{
	VD mv = (VD){0} + mean, rv = (VD){0} + rstd;
	int64_t i = 0;
	for (; i + W <= n; i += W)
		std_(acc + i, ldd(acc + i) + widen(ld(dy + i)) * ((widen(ld(x + i)) - mv) * rv));
	for (; i < n; i++)
		acc[i] += (double)dy[i] * (((double)x[i] - mean) * rstd);
}

static void col_sum(double *acc, const float *x, int64_t n)
{
	int64_t i = 0;
	for (; i + W <= n; i += W)
		std_(acc + i, ldd(acc + i) + widen(ld(x + i)));
	for (; i < n; i++)
		acc[i] += x[i];
}

/* ---- optimizer ---- */

/* PyTorch 1.13's single-tensor AdamW, operation for operation (optim.c) */
static inline void adamw_v(VF *p, VF g, VF *m, VF *v, const CpuAdam *c)
{
	*p = *p * splat(c->decay);
	*m = *m * splat(c->beta1) + splat(c->one_b1) * g;
	*v = *v * splat(c->beta2) + splat(c->one_b2) * (g * g);
	VF denom = v_sqrt(*v) / splat(c->bc2_sqrt) + splat(c->eps);
	*p = *p + (splat(-c->step_size) * *m) / denom;
}

static void adamw(float *p, const float *g, float *m, float *v, int64_t n, const CpuAdam *c)
{
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF pv = ld(p + i), mv = ld(m + i), vv = ld(v + i);
		adamw_v(&pv, ld(g + i), &mv, &vv, c);
		st(p + i, pv);
		st(m + i, mv);
		st(v + i, vv);
	}
	if (i < n) {
		int64_t r = n - i;
		VF pv = ld_tail(p + i, r, 0), mv = ld_tail(m + i, r, 0), vv = ld_tail(v + i, r, 0);
		adamw_v(&pv, ld_tail(g + i, r, 0), &mv, &vv, c);
		st_tail(p + i, r, pv);
		st_tail(m + i, r, mv);
		st_tail(v + i, r, vv);
	}
}

const CpuVec VEC_TABLE = {
	.isa = VEC_NAME,
	.map = map,
	.max = vmax,
	.exp_shift = exp_shift,
	.exp_sum_d = exp_sum_d,
	.dot = dot,
	.softmax_bwd = softmax_bwd,
	.norm_stats = norm_stats,
	.norm_fwd = norm_fwd,
	.norm_bwd = norm_bwd,
	.norm_gamma = norm_gamma,
	.col_sum = col_sum,
	.sqsum = sqsum,
	.adamw = adamw,
};
