/*
 * dropout.h - dropout's mask (format/ops.def: DROPOUT), one definition for
 * the CPU backend (C) and the CUDA backend (nvcc's device code): an element
 * is kept when its Philox4x32-10 draw is at least p * 2^32.
 *
 * The draw is Random123's philox4x32 (Salmon et al., SC'11; Debian's
 * librandom123-dev, header-only, the same code in C and in CUDA device
 * code), keyed by what a sample's element is, never by where it runs:
 *   key     = {seed low 32 bits, seed high 32 bits}       (train's seed)
 *   counter = {e / 4, sample, step, site}                 (its 4 words: e % 4)
 * e is the element's index within its sample (row r of dim 0; with cp the
 * row along dim 1 at its global position), sample its dataset index, step
 * the optimizer step (both their low 32 bits), site the dropout's index in
 * the model. So a sample gets the same mask at any world size, strategy,
 * micro-batch split, tp or cp layout, on either backend, and recompute and
 * the gradient make the same mask again.
 */
#ifndef DP_DROPOUT_H
#define DP_DROPOUT_H

#include <stdint.h>

#include <Random123/philox.h>

#ifdef __CUDACC__
#define DROPOUT_FN static inline __host__ __device__
#else
#define DROPOUT_FN static inline
#endif

/* Kept when the draw is >= this: floor(p * 2^32) (p in [0, 1)). */
DROPOUT_FN uint32_t dp_dropout_threshold(float p)
{
	double t = (double)p * 4294967296.0;
	return t <= 0 ? 0u : t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
}

/* The factor of a kept element, 1 / (1 - p) rounded once to f32. */
DROPOUT_FN float dp_dropout_scale(float p)
{
	return (float)(1.0 / (1.0 - (double)p));
}

/* Is element e of the sample kept? */
DROPOUT_FN int dp_dropout_keep(uint64_t seed, uint32_t site, uint32_t sample, uint32_t step,
			       uint64_t e, uint32_t threshold)
{
	philox4x32_ctr_t c = {{(uint32_t)(e >> 2), sample, step, site}};
	philox4x32_key_t k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
	philox4x32_ctr_t r = philox4x32(c, k);
	return r.v[e & 3] >= threshold;
}

/* Sampling's draw (runtime/sampler.c): a uniform double in [0, 1) for the
 * token at position pos of a generated sequence, from the same Philox keyed
 * by the sampling seed; the counter's last three words are all ones, which no
 * dropout site of a model reaches. */
DROPOUT_FN double dp_sample_uniform(uint64_t seed, uint64_t pos)
{
	philox4x32_ctr_t c = {{(uint32_t)pos, (uint32_t)(pos >> 32), 0xffffffffu, 0xffffffffu}};
	philox4x32_key_t k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
	philox4x32_ctr_t r = philox4x32(c, k);
	uint64_t bits = ((uint64_t)r.v[0] << 21) ^ (r.v[1] >> 11); /* 53 bits */
	return (double)bits * (1.0 / 9007199254740992.0);
}

#endif
