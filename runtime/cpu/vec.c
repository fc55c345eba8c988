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

typedef int VI __attribute__((vector_size(W * 4)));       /* W lanes of masks */
typedef float VFH __attribute__((vector_size(DW * 4)));   /* DW floats */

static inline VF ld(const float *p)
{
	VF v;
	memcpy(&v, p, sizeof v);
	return v;
}
static inline void st(float *p, VF v) { memcpy(p, &v, sizeof v); }
static inline VF splat(float s)
{
	VF v;
	for (int k = 0; k < W; k++)
		v[k] = s;
	return v;
}
static inline VF sel(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }

/*
 * Double precision goes through native double vectors (VDN, DW = W/2
 * lanes): a float vector is widened as its low and high halves, and every
 * double accumulator is a pair. (GCC keeps a vector twice the native
 * width in memory, and its loops crawl.)
 */
static inline VDN splatd(double s)
{
	VDN v;
	for (int k = 0; k < DW; k++)
		v[k] = s;
	return v;
}
#if VEC_ISA == 2
/* lanes moved by intrinsics: GCC's generic half-vector copies go through the stack */
static inline VDN lo(VF v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline VDN hi(VF v)
{
	return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
/* float(a) in the low half, float(b) in the high half */
static inline VF join(VDN a, VDN b)
{
	__m512d x = _mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(a)));
	return _mm512_castpd_ps(_mm512_insertf64x4(x, _mm256_castps_pd(_mm512_cvtpd_ps(b)), 1));
}
#elif VEC_ISA == 1
static inline VDN lo(VF v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline VDN hi(VF v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
static inline VF join(VDN a, VDN b)
{
	return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(a)), _mm256_cvtpd_ps(b), 1);
}
#else
static inline VDN lo(VF v) { return (VDN){v[0], v[1]}; }
static inline VDN hi(VF v) { return (VDN){v[2], v[3]}; }
static inline VF join(VDN a, VDN b) { return (VF){(float)a[0], (float)a[1], (float)b[0], (float)b[1]}; }
#endif
static inline VDN ldd(const double *p)
{
	VDN v;
	memcpy(&v, p, sizeof v);
	return v;
}
static inline void std_(double *p, VDN v) { memcpy(p, &v, sizeof v); }
/* The lanes' sum of a pair of accumulators, as a tree (halves pairwise). */
static inline double hsum(VDN a, VDN b)
{
	VDN v = a + b;
#if VEC_ISA == 2
	__m256d h = _mm512_castpd512_pd256(v) + _mm512_extractf64x4_pd(v, 1);
#elif VEC_ISA == 1
	__m256d h = v;
#endif
#if VEC_ISA >= 1
	__m128d q = _mm256_castpd256_pd128(h) + _mm256_extractf128_pd(h, 1);
	return q[0] + q[1];
#else
	return v[0] + v[1];
#endif
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

/* The elementwise ops, the CPU backend's kernels for them (backend_cpu.c
 * asks is_map): adding one is its case in map_one and its line here. */
#define VEC_MAPS(X)                                                                      \
	X(DP_OP_ACCUM) X(DP_OP_SCALE) X(DP_OP_ADD) X(DP_OP_MUL) X(DP_OP_RELU) X(DP_OP_RELU_GRAD)      \
	X(DP_OP_GELU) X(DP_OP_GELU_GRAD) X(DP_OP_TANH) X(DP_OP_TANH_GRAD) X(DP_OP_SILU)              \
	X(DP_OP_SILU_GRAD) X(DP_OP_SIGMOID) X(DP_OP_SIGMOID_GRAD) X(DP_OP_ADD_SCALAR)

static inline VF map_one(unsigned op, VF a, VF b, float s)
{
	switch (op) {
	case DP_OP_ACCUM: /* o = a + o: map() passes o as b */
	case DP_OP_ADD:
		return a + b;
	case DP_OP_SCALE:
		return splat(s) * a;
	case DP_OP_ADD_SCALAR:
		return a + splat(s);
	case DP_OP_MUL:
		return a * b;
	case DP_OP_RELU:
		return sel(a > splat(0), a, splat(0));
	case DP_OP_RELU_GRAD:
		return sel(b > splat(0), a, splat(0));
	case DP_OP_GELU: {
		VF e = gelu_e(a);
		return a / (splat(1.0f) + e);
	}
	case DP_OP_GELU_GRAD: {
		/* s = sigma(2u), 1 - s = e * s: gelu' = s * (1 + 2 x e s du) */
		VF x = b, e = gelu_e(x), sg = splat(1.0f) / (splat(1.0f) + e);
		VF du = splat(gelu_s) * (splat(1.0f) + splat(3.0f * 0.044715f) * x * x);
		return a * (sg * (splat(1.0f) + splat(2.0f) * x * e * sg * du));
	}
	case DP_OP_TANH:
		return v_tanh(a);
	case DP_OP_TANH_GRAD:
		return a * (splat(1.0f) - b * b);
	case DP_OP_SILU:
		return a / (splat(1.0f) + v_exp(-a));
	case DP_OP_SIGMOID: /* torch.sigmoid: 1 / (1 + exp(-x)) */
		return splat(1.0f) / (splat(1.0f) + v_exp(-a));
	case DP_OP_SIGMOID_GRAD: /* dy * y * (1 - y), y the output */
		return a * b * (splat(1.0f) - b);
	case DP_OP_SILU_GRAD: {
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

static void map(unsigned op, float *o, const float *a, const float *b, float s, int64_t n)
{
	if (op == DP_OP_ACCUM)
		b = o;
	else if (!b)
		b = a;
	switch (op) {
		VEC_MAPS(MAP_LOOP)
	default:
		break;
	}
}

/* The ops map() computes: the CPU backend's elementwise kernels. */
static int is_map(unsigned op)
{
#define MAP_CASE(OP) case OP:
	switch (op) {
		VEC_MAPS(MAP_CASE)
		return 1;
	default:
		return 0;
	}
#undef MAP_CASE
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
	VDN a0 = {0}, a1 = {0};
	VF sh = splat(shift);
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF e = v_exp(ld(x + i) - sh);
		st(y + i, e);
		a0 += lo(e);
		a1 += hi(e);
	}
	if (i < n) {
		VF e = v_exp(ld_tail(x + i, n - i, -INFINITY) - sh); /* pads: exp(-inf) = 0 */
		st_tail(y + i, n - i, e);
		a0 += lo(e);
		a1 += hi(e);
	}
	return hsum(a0, a1);
}

static double exp_sum_d(const float *x, double shift, int64_t n)
{
	VDN a0 = {0}, a1 = {0}, sh = splatd(shift);
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF v = ld(x + i);
		a0 += v_expd(lo(v) - sh);
		a1 += v_expd(hi(v) - sh);
	}
	if (i < n) {
		VF v = ld_tail(x + i, n - i, -INFINITY);
		a0 += v_expd(lo(v) - sh);
		a1 += v_expd(hi(v) - sh);
	}
	return hsum(a0, a1);
}

static double dot(const float *a, const float *b, int64_t n)
{
	VDN a0 = {0}, a1 = {0};
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF u = ld(a + i), v = ld(b + i);
		a0 += lo(u) * lo(v);
		a1 += hi(u) * hi(v);
	}
	if (i < n) {
		VF u = ld_tail(a + i, n - i, 0), v = ld_tail(b + i, n - i, 0);
		a0 += lo(u) * lo(v);
		a1 += hi(u) * hi(v);
	}
	return hsum(a0, a1);
}

/* in double, rounded once: (float)(p * (d - c)) */
static inline VF softmax_bwd_v(VF p, VF d, VDN c)
{
	return join(lo(p) * (lo(d) - c), hi(p) * (hi(d) - c));
}

static void softmax_bwd(float *o, const float *p, const float *d, double c, int64_t n)
{
	VDN cc = splatd(c);
	int64_t i = 0;
	for (; i + W <= n; i += W)
		st(o + i, softmax_bwd_v(ld(p + i), ld(d + i), cc));
	if (i < n)
		st_tail(o + i, n - i, softmax_bwd_v(ld_tail(p + i, n - i, 0), ld_tail(d + i, n - i, 0), cc));
}

/* ---- layernorm / rmsnorm rows (double statistics, as the scalar kernels) ---- */

/* sum of (double)x^2 */
static double sqsum(const float *x, int64_t n)
{
	VDN a0 = {0}, a1 = {0};
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF v = ld(x + i);
		a0 += lo(v) * lo(v);
		a1 += hi(v) * hi(v);
	}
	if (i < n) {
		VF v = ld_tail(x + i, n - i, 0);
		a0 += lo(v) * lo(v);
		a1 += hi(v) * hi(v);
	}
	return hsum(a0, a1);
}

static void norm_stats(const float *x, int64_t n, int rms, double eps, double *mean, double *rstd)
{
	if (rms) {
		*mean = 0;
		*rstd = 1.0 / sqrt(sqsum(x, n) / (double)n + eps);
		return;
	}
	/* two sweeps over a row that sits in L1: mean, then the centred squares */
	VDN a0 = {0}, a1 = {0};
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF v = ld(x + i);
		a0 += lo(v);
		a1 += hi(v);
	}
	if (i < n) {
		VF v = ld_tail(x + i, n - i, 0);
		a0 += lo(v);
		a1 += hi(v);
	}
	double m = hsum(a0, a1) / (double)n;
	VDN mv = splatd(m), q0 = {0}, q1 = {0};
	for (i = 0; i + W <= n; i += W) {
		VF v = ld(x + i);
		VDN d0 = lo(v) - mv, d1 = hi(v) - mv;
		q0 += d0 * d0;
		q1 += d1 * d1;
	}
	if (i < n) { /* pads are 0 - m: weigh them 0 */
		VF v = ld_tail(x + i, n - i, 0), keep;
		for (int k = 0; k < W; k++)
			keep[k] = k < n - i;
		VDN d0 = lo(v) - mv, d1 = hi(v) - mv;
		q0 += d0 * d0 * lo(keep);
		q1 += d1 * d1 * hi(keep);
	}
	*mean = m;
	*rstd = 1.0 / sqrt(hsum(q0, q1) / (double)n + eps);
}

/* (float)((x - mean) * rstd) */
static inline VF xhat(VF x, VDN mv, VDN rv)
{
	return join((lo(x) - mv) * rv, (hi(x) - mv) * rv);
}

static void norm_fwd(float *y, const float *x, const float *g, const float *b, int64_t n,
		     double mean, double rstd)
{
	VDN mv = splatd(mean), rv = splatd(rstd);
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF xh = xhat(ld(x + i), mv, rv);
		st(y + i, b ? xh * ld(g + i) + ld(b + i) : xh * ld(g + i));
	}
	if (i < n) {
		int64_t r = n - i;
		VF xh = xhat(ld_tail(x + i, r, 0), mv, rv), gv = ld_tail(g + i, r, 0);
		st_tail(y + i, r, b ? xh * gv + ld_tail(b + i, r, 0) : xh * gv);
	}
}

/*
 * dx with xhat = (x - mean) * rstd and gd = dy * g (in double):
 *   layernorm: dx = rstd * (gd - mean(gd) - xhat * mean(gd * xhat))
 *   rmsnorm:   dx = rstd * (gd - xhat * mean(gd * xhat))
 */
static inline void norm_bwd_sums(VF dy, VF x, VF g, VDN mv, VDN rv, VDN *sg, VDN *sgx)
{
	VDN gd0 = lo(dy) * lo(g), gd1 = hi(dy) * hi(g);
	sg[0] += gd0;
	sg[1] += gd1;
	sgx[0] += gd0 * (lo(x) - mv) * rv;
	sgx[1] += gd1 * (hi(x) - mv) * rv;
}

static inline VF norm_bwd_out(VF dy, VF x, VF g, VDN mv, VDN rv, VDN sg, VDN sgx)
{
	VDN xh0 = (lo(x) - mv) * rv, xh1 = (hi(x) - mv) * rv;
	return join(rv * (lo(dy) * lo(g) - sg - xh0 * sgx), rv * (hi(dy) * hi(g) - sg - xh1 * sgx));
}

static void norm_bwd(float *dx, const float *dy, const float *x, const float *g, int64_t n,
		     int rms, double mean, double rstd)
{
	VDN mv = splatd(mean), rv = splatd(rstd), sg[2] = {{0}, {0}}, sgx[2] = {{0}, {0}};
	int64_t i = 0, r = n % W;
	for (; i + W <= n; i += W)
		norm_bwd_sums(ld(dy + i), ld(x + i), ld(g + i), mv, rv, sg, sgx);
	if (r) /* dy * g = 0 on the pads */
		norm_bwd_sums(ld_tail(dy + i, r, 0), ld_tail(x + i, r, 0), ld_tail(g + i, r, 0), mv, rv,
			      sg, sgx);
	VDN sgb = splatd(rms ? 0 : hsum(sg[0], sg[1]) / (double)n);
	VDN sgxb = splatd(hsum(sgx[0], sgx[1]) / (double)n);
	for (i = 0; i + W <= n; i += W)
		st(dx + i, norm_bwd_out(ld(dy + i), ld(x + i), ld(g + i), mv, rv, sgb, sgxb));
	if (r)
		st_tail(dx + i, r, norm_bwd_out(ld_tail(dy + i, r, 0), ld_tail(x + i, r, 0),
						ld_tail(g + i, r, 0), mv, rv, sgb, sgxb));
}

static void norm_gamma(double *acc, const float *dy, const float *x, int64_t n, double mean,
		       double rstd)
{
	VDN mv = splatd(mean), rv = splatd(rstd);
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF d = ld(dy + i), v = ld(x + i);
		std_(acc + i, ldd(acc + i) + lo(d) * ((lo(v) - mv) * rv));
		std_(acc + i + DW, ldd(acc + i + DW) + hi(d) * ((hi(v) - mv) * rv));
	}
	for (; i < n; i++)
		acc[i] += (double)dy[i] * (((double)x[i] - mean) * rstd);
}

static void col_sum(double *acc, const float *x, int64_t n)
{
	int64_t i = 0;
	for (; i + W <= n; i += W) {
		VF v = ld(x + i);
		std_(acc + i, ldd(acc + i) + lo(v));
		std_(acc + i + DW, ldd(acc + i + DW) + hi(v));
	}
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
	.is_map = is_map,
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
