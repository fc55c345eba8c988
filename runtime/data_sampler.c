/*
 * data_sampler.c - which samples a batch holds: DistributedSampler semantics
 * with drop_last for the train split, reshuffled every epoch, and the eval
 * split read in order.
 *
 * The train split is reshuffled every epoch by a Fisher-Yates permutation
 * whose random numbers depend only on (seed, epoch), and a step's global
 * batch is a contiguous window of that permutation. Rank r of dp_size takes
 * the interleaved positions r, r + dp_size, ... of the window, so the union
 * over ranks and micro-batches is the global batch whatever the mesh.
 *
 * Exact formulas (GOLDEN = 0x9e3779b97f4a7c15, mix64/hash from init.c,
 * arithmetic mod 2^64; docs/DATA.md repeats them for tests/torch_ref.py):
 *   steps_per_epoch = n / global_batch          (n >= global_batch is checked)
 *   epoch = step / steps_per_epoch, window = (step % steps_per_epoch) * global_batch
 *   key   = mix64(seed ^ mix64(hash("dp.sampler") + epoch * GOLDEN))
 *   perm  = [0, n); for i = n-1 down to 1:
 *             j = mix64(key + i * GOLDEN) % (i + 1); swap perm[i], perm[j]
 *   dataset index of position p of the global batch = perm[window + p]
 * The permutation of the current epoch is cached in the DataSet's state.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "data_int.h"

static void epoch_permutation(uint64_t seed, uint64_t epoch, int64_t n, int64_t *perm)
{
	uint64_t key = init_mix64(seed ^ init_mix64(init_hash_name("dp.sampler") + epoch * DATA_GOLDEN));

	for (int64_t i = 0; i < n; i++)
		perm[i] = i;
	for (int64_t i = n - 1; i >= 1; i--) {
		uint64_t r = init_mix64(key + (uint64_t)i * DATA_GOLDEN);
		int64_t j = (int64_t)(r % (uint64_t)(i + 1));
		int64_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
}

/* The reference: recomputes the whole permutation on every call. */
int64_t data_sample_index(uint64_t seed, int64_t n, int64_t global_batch, uint64_t step, int64_t j)
{
	assert(global_batch > 0 && n >= global_batch && j >= 0 && j < global_batch);
	uint64_t per_epoch = (uint64_t)(n / global_batch);
	uint64_t epoch = step / per_epoch;
	int64_t pos = (int64_t)(step % per_epoch) * global_batch + j;
	int64_t *perm = malloc((size_t)n * sizeof *perm);
	assert(perm); /* a test-only path */
	epoch_permutation(seed, epoch, n, perm);
	int64_t idx = perm[pos];
	free(perm);
	return idx;
}

static const int64_t *cached_permutation(const DataSet *d, uint64_t seed, uint64_t epoch)
{
	DataState *c = d->st;

	if (!c->valid || c->seed != seed || c->epoch != epoch) {
		epoch_permutation(seed, epoch, d->n, c->perm);
		c->valid = 1;
		c->seed = seed;
		c->epoch = epoch;
	}
	return c->perm;
}

static const DataSource *source_of(const DataSet *d, const DpStep *s, int src)
{
	assert(src >= 0 && (uint32_t)src < d->nsources && d->nsources == s->nsources);
	assert(d->src[src].loaded); /* the LOAD names a source of this split */
	return &d->src[src];
}

void data_fill_train(const DataSet *d, const DpStep *s, int src, uint64_t step, int micro,
		     int dp_rank, int dp_size, void *dst)
{
	const DataSource *ds = source_of(d, s, src);
	int64_t mb = s->cfg.micro_batch;
	int64_t gb = mb * s->cfg.grad_accum * dp_size;
	size_t sample_bytes = (size_t)ds->elems * 4;
	if (ds->positions) {
		data_fill_positions(d, ds, dst);
		return;
	}

	assert(d->split == DP_SPLIT_TRAIN && gb > 0 && d->n >= gb); /* data_check_batch */
	assert(dp_rank >= 0 && dp_rank < dp_size && micro >= 0 && (uint32_t)micro < s->cfg.grad_accum);
	uint64_t per_epoch = (uint64_t)(d->n / gb);
	const int64_t *perm = cached_permutation(d, s->cfg.seed, step / per_epoch);
	int64_t window = (int64_t)(step % per_epoch) * gb;
	for (int64_t t = 0; t < mb; t++) {
		int64_t pos = dp_rank + (int64_t)dp_size * ((int64_t)micro * mb + t);
		int64_t idx = perm[window + pos];
		if (ds->keys) { /* dropout's: the sample and the step (their low 32 bits) */
			((int32_t *)dst)[2 * t] = (int32_t)idx;
			((int32_t *)dst)[2 * t + 1] = (int32_t)step;
			continue;
		}
		data_copy_sample(d, ds, idx, (char *)dst + t * sample_bytes);
	}
}

static int64_t eval_batch_size(const DpStep *s)
{
	return s->cfg.eval_batch ? s->cfg.eval_batch : s->cfg.micro_batch;
}

int64_t data_eval_batches(const DataSet *d, const DpStep *s, int dp_size)
{
	int64_t per_batch = eval_batch_size(s) * dp_size;
	assert(per_batch > 0);
	return (d->n + per_batch - 1) / per_batch;
}

void data_fill_eval(const DataSet *d, const DpStep *s, int src, int64_t batch, int dp_rank,
		    int dp_size, void *dst)
{
	const DataSource *ds = source_of(d, s, src);
	int64_t eb = eval_batch_size(s);
	size_t sample_bytes = (size_t)ds->elems * 4;
	if (ds->positions) {
		data_fill_positions(d, ds, dst);
		return;
	}

	assert(dp_rank >= 0 && dp_rank < dp_size && batch >= 0);
	for (int64_t t = 0; t < eb; t++) {
		int64_t idx = (batch * dp_size + dp_rank) * eb + t;
		char *out = (char *)dst + t * sample_bytes;
		if (ds->keys) { /* no dropout in eval */
			((int32_t *)out)[0] = ((int32_t *)out)[1] = -1;
		} else if (idx < d->n) {
			data_copy_sample(d, ds, idx, out);
		} else if (ds->tokens ? ds->shift == 1 : ds->role == 1) {
			/* labels and token targets: -1 (skipped by the loss); token
			 * inputs: 0, a valid id, so the embedding stays in range */
			for (int64_t k = 0; k < ds->elems; k++)
				((int32_t *)out)[k] = -1;
		} else {
			memset(out, 0, sample_bytes); /* 0.0f and 0 are all-zero bits */
		}
	}
}
