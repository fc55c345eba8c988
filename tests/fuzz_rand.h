/*
 * fuzz_rand.h - the random numbers of the mutation fuzzers (tests/fe_fuzz.c,
 * tests/ckpt_fuzz.c): splitmix64, so that one seed gives the same mutants
 * and a failing round is reproduced from the printed seed.
 */
#ifndef DP_FUZZ_RAND_H
#define DP_FUZZ_RAND_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t next_rand(uint64_t *s) /* splitmix64 */
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform enough in [0, n) for a fuzzer; 0 when n is 0. */
static inline size_t below(uint64_t *s, size_t n)
{
	return n ? (size_t)(next_rand(s) % n) : 0;
}

#endif
