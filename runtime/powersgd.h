/*
 * powersgd.h - PowerSGD's fresh Q (compress powersgd(warm_start=false),
 * docs/COMPRESS.md), one definition for the CPU backend (C) and the CUDA
 * backend (nvcc's device code), as dropout.h is for dropout's mask.
 *
 * With warm_start=false every compressed step k starts from a new Q (PyTorch's
 * powerSGD_hook draws one from its generator every step): element i of the Q
 * of a matrix, the tensor NAME.powersgd_q [m, r], is the normal draw of the
 * parameters' initialiser (runtime/init.c: Box-Muller in double over
 * splitmix64, stored as float) keyed by (step seed, hash(NAME.powersgd_q), i)
 * with
 *   step seed = mix64(seed ^ mix64(k + 1))                  (k from 0)
 * so every rank draws the same Q, a resumed run draws step k's again without
 * any stored state, and tests/torch_powersgd.py reproduces it in numpy.
 * The hash is FNV-1a 64 of the name (init_hash_name's), taken on the host.
 */
#ifndef DP_POWERSGD_H
#define DP_POWERSGD_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PSGD_FN static inline __host__ __device__
#else
#define PSGD_FN static inline
#endif

/* splitmix64's finaliser (init_mix64's) */
PSGD_FN uint64_t dp_psgd_mix64(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* FNV-1a 64 of a name (init_hash_name's) */
PSGD_FN uint64_t dp_psgd_hash(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 offset basis */
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull; /* FNV-1a 64 prime */
	return h;
}

/* The seed of optimizer step k's draws. */
PSGD_FN uint64_t dp_psgd_step_seed(uint64_t seed, uint64_t k)
{
	return dp_psgd_mix64(seed ^ dp_psgd_mix64(k + 1));
}

/* Element i of the Q whose name hashes to h, drawn with step seed ks:
 * init_fill's DP_INIT_NORMAL(0, 1) with seed ks (M_PI's digits: nvcc's
 * device code has no M_PI). */
PSGD_FN float dp_psgd_normal(uint64_t ks, uint64_t h, uint64_t i)
{
	const double scale = 1.0 / 4294967296.0; /* 2^-32 */
	uint64_t u = dp_psgd_mix64(ks ^ dp_psgd_mix64(h + i * 0x9e3779b97f4a7c15ull));
	double u1 = ((double)(u >> 32) + 0.5) * scale, u2 = ((double)(u & 0xffffffffull) + 0.5) * scale;
	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
}

#endif
