/*
 * tests/bf16_test.c - the CPU backend's bf16 rounding (runtime/cpu/bf16.c)
 * against a reference that rounds by comparing distances in double: round
 * to nearest, ties to even, overflow to infinity, NaN kept NaN (what
 * PyTorch's .bfloat16() does). Every 61st bit pattern of the 2^32 floats,
 * and the hand-picked cases below; bf16 -> f32 is exact.
 */
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

static double value_of(uint32_t hi16) /* a bf16 pattern's value; 2^128 past the largest */
{
	uint32_t u = hi16 << 16;
	if ((u & 0x7fffffffu) == 0x7f800000u)
		return (u >> 31 ? -1.0 : 1.0) * ldexp(1.0, 128);
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* The nearest of the two bf16 neighbours of x, ties to the even one. */
static uint16_t reference(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	if (isnan(f))
		return 0x7fc0; /* any quiet NaN: compared as "is NaN" */
	uint32_t lo = u >> 16, hi = lo + 1; /* toward zero, and away from it */
	if ((u & 0xffffu) == 0)
		return (uint16_t)lo;
	double dlo = fabs((double)f - value_of(lo)), dhi = fabs(value_of(hi) - (double)f);
	uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
	return (uint16_t)r; /* 2^128 is the infinity pattern: overflow */
}

int main(void)
{
	for (uint64_t u = 0; u <= 0xffffffffu; u += 61) {
		float f;
		uint32_t bits = (uint32_t)u;
		memcpy(&f, &bits, 4);
		uint16_t got = cpu_to_bf16(f), want = reference(bits);
		if (isnan(f))
			check(isnan(cpu_from_bf16(got)), "NaN stays NaN", bits);
		else
			check(got == want, "round to nearest even", bits);
	}
	struct {
		uint32_t in;
		uint16_t out;
		const char *what;
	} cases[] = {
		{0x3f800000, 0x3f80, "1"},
		{0x3f808000, 0x3f80, "1 + 2^-8: a tie, to even (down)"},
		{0x3f818000, 0x3f82, "1 + 3*2^-8: a tie, to even (up)"},
		{0x3f808001, 0x3f81, "just above the tie: up"},
		{0x80000000, 0x8000, "-0"},
		{0x7f7fffff, 0x7f80, "the largest float: infinity"},
		{0x7f800000, 0x7f80, "infinity"},
		{0xff800000, 0xff80, "-infinity"},
		{0x00000001, 0x0000, "the smallest denormal: 0"},
		{0x00018000, 0x0002, "a denormal tie, to even"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		float f;
		memcpy(&f, &cases[i].in, 4);
		check(cpu_to_bf16(f) == cases[i].out, cases[i].what, cases[i].in);
	}
	for (uint32_t b = 0; b < 0x10000; b++) { /* bf16 -> f32 -> bf16 is the identity */
		float f = cpu_from_bf16((uint16_t)b);
		check(isnan(f) || cpu_to_bf16(f) == b, "bf16 -> f32 -> bf16", b);
	}
	printf("bf16_test: %d passed, %d failed\n", npass, nfail);
	return nfail != 0;
}
