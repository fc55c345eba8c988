/*
 * tests/f16_test.c - f16 (IEEE binary16) rounding, runtime/rt.h's
 * rt_to_f16 / rt_from_f16 (precision fp16's one conversion, on the CPU
 * kernels, INIT and MPI's f16 sum), against:
 *  - a reference that rounds by comparing distances in double: to nearest,
 *    ties to even, subnormals in steps of 2^-24, 65520 and above to
 *    infinity; every 241st bit pattern of the 2^32 floats, and every float
 *    within 8 ulps of each f16 value's rounding boundaries (the ties);
 *  - F16C's vcvtps2ph / vcvtph2ps, where the CPU has them, on the same
 *    patterns (PyTorch's .half() on x86 rounds with them), and the CPU
 *    backend's bulk conversions (cpu_f16_store / load: F16C eight at a
 *    time) against rt_to_f16 / rt_from_f16;
 *  - known answers (below), subnormals, infinities and NaN included;
 *  - f16 -> f32 exact on all 2^16 patterns (a NaN comes out quiet, as
 *    F16C's), and back the identity but for signalling NaNs.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cpu/cpu.h"

static int npass, nfail;

static void check(int ok, const char *what, uint32_t u)
{
	if (ok) {
		npass++;
		return;
	}
	if (nfail++ < 20)
		printf("  FAIL %s (bits 0x%08x)\n", what, u);
}

/* The value of a non-NaN f16 pattern, exactly; infinity stands for 2^16
 * (where the next binade would start: the overflow boundary's far side). */
static double value_of(uint32_t h)
{
	double s = h & 0x8000u ? -1.0 : 1.0;
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
	if (e == 0x1f)
		return s * 65536.0;
	return s * (e ? ldexp(1024.0 + m, (int)e - 25) : ldexp((double)m, -24));
}

/* The nearest of the two f16 neighbours of x, ties to the even one. */
static uint16_t reference(float f)
{
	double x = f, a = fabs(x);
	uint32_t sign = signbit(f) ? 0x8000u : 0;
	uint32_t lo = 0; /* the largest magnitude pattern <= |x| */
	for (uint32_t step = 0x4000; step; step >>= 1)
		if (lo + step <= 0x7c00u && value_of(lo + step) <= a)
			lo += step;
	if (value_of(lo) == a || lo == 0x7c00u)
		return (uint16_t)(sign | lo);
	double dlo = a - value_of(lo), dhi = value_of(lo + 1) - a;
	uint32_t r = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo & 1) ? lo + 1 : lo;
	return (uint16_t)(sign | r);
}

__attribute__((target("f16c"))) static uint16_t f16c_to(float f)
{
	return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("f16c"))) static float f16c_from(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* the CPU backend's bulk conversions (F16C eight at a time where the CPU
 * has it) against rt_to_f16 / rt_from_f16, element for element: a batch of
 * the patterns one() saw */
static float batch[4096];
static int nbatch;

static void flush_batch(void)
{
	uint16_t h[4096], want;
	float back[4096];
	cpu_f16_store(h, batch, nbatch);
	cpu_f16_load(back, h, nbatch);
	for (int i = 0; i < nbatch; i++) {
		uint32_t bits;
		memcpy(&bits, &batch[i], 4);
		want = rt_to_f16(batch[i]);
		float wb = rt_from_f16(want);
		check(h[i] == want && memcmp(&back[i], &wb, 4) == 0,
		      "cpu_f16_store / cpu_f16_load: rt_to_f16's bits", bits);
	}
	nbatch = 0;
}

static void one(uint32_t bits, int f16c)
{
	float f;
	memcpy(&f, &bits, 4);
	batch[nbatch++] = f;
	if (nbatch == 4096)
		flush_batch();
	uint16_t got = rt_to_f16(f);
	if (isnan(f)) {
		check((got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) && (got & 0x200u),
		      "NaN stays a quiet NaN", bits);
		check((got & 0x8000u) == ((bits >> 16) & 0x8000u), "NaN keeps its sign", bits);
	} else {
		check(got == reference(f), "round to nearest even", bits);
	}
	if (f16c)
		check(got == f16c_to(f), "the same bits as F16C's vcvtps2ph", bits);
}

int main(void)
{
	__builtin_cpu_init();
	int f16c = __builtin_cpu_supports("f16c");
	for (uint64_t u = 0; u <= 0xffffffffu; u += 241)
		one((uint32_t)u, f16c);
	/* around every boundary between neighbouring f16 values (and the
	 * overflow boundary 65520), both signs: the ties and their neighbours */
	for (uint32_t h = 0; h < 0x7c00u; h++) {
		double mid = (value_of(h) + value_of(h + 1)) / 2;
		float m = (float)mid; /* exact: 12 significant bits */
		uint32_t mb;
		memcpy(&mb, &m, 4);
		for (int d = -8; d <= 8; d++) {
			one(mb + (uint32_t)d, f16c);
			one((mb + (uint32_t)d) | 0x80000000u, f16c);
		}
	}
	flush_batch();
	struct {
		uint32_t in;
		uint16_t out;
		const char *what;
	} cases[] = {
		{0x3f800000, 0x3c00, "1"},
		{0x3f801000, 0x3c00, "1 + 2^-11: a tie, to even (down)"},
		{0x3f803000, 0x3c02, "1 + 3*2^-11: a tie, to even (up)"},
		{0x3f801001, 0x3c01, "just above the tie: up"},
		{0x80000000, 0x8000, "-0"},
		{0x477fe000, 0x7bff, "65504, the largest f16"},
		{0x477fefff, 0x7bff, "just below 65520: 65504"},
		{0x477ff000, 0x7c00, "65520, a tie: to the even infinity"},
		{0xc7800000, 0xfc00, "-65536: -infinity"},
		{0x7f800000, 0x7c00, "infinity"},
		{0x38800000, 0x0400, "2^-14, the smallest normal"},
		{0x387fc000, 0x03ff, "2^-14 - 2^-24, the largest subnormal"},
		{0x33800000, 0x0001, "2^-24, the smallest subnormal"},
		{0x33000000, 0x0000, "2^-25, a tie: to even 0"},
		{0x33000001, 0x0001, "just above 2^-25: the smallest subnormal"},
		{0x33c00000, 0x0002, "1.5 * 2^-24, a tie: to even 2^-23"},
		{0x00000001, 0x0000, "the smallest f32 denormal: 0"},
		{0x7fc00000, 0x7e00, "the default NaN"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		float f;
		memcpy(&f, &cases[i].in, 4);
		check(rt_to_f16(f) == cases[i].out, cases[i].what, cases[i].in);
	}
	for (uint32_t h = 0; h < 0x10000u; h++) { /* f16 -> f32 exact, and back */
		float f = rt_from_f16((uint16_t)h);
		int nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
		int inf = (h & 0x7fffu) == 0x7c00u;
		check(nan ? isnan(f)
			  : (inf ? isinf(f) : (double)f == value_of(h)) && !signbit(f) == !(h & 0x8000u),
		      "f16 -> f32 exact", h);
		if (!nan || (h & 0x200u)) /* quiet NaNs come back as they were */
			check(rt_to_f16(f) == h, "f16 -> f32 -> f16", h);
		if (f16c) {
			float g = f16c_from((uint16_t)h);
			check(memcmp(&f, &g, 4) == 0, "the same bits as F16C's vcvtph2ps", h);
		}
	}
	printf("f16_test: %d passed, %d failed (F16C %s)\n", npass, nfail,
	       f16c ? "compared" : "absent: not compared");
	return nfail != 0;
}
