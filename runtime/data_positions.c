/*
 * data_positions.c - the sources that read no file. Positions: every
 * "sample" is this rank's positions of the tokens of a sequence (0 .. T-1),
 * which position tables are read at. Sample keys (dropout's, format/ops.def):
 * per sample its dataset index and the step, which the sampler writes
 * (data_sampler.c); -1 in eval. Under context parallelism (cp > 1) a sequence of `window`
 * tokens is split over the cp ranks in 2 cp chunks of L = window / (2 cp),
 * rank r holding chunks r and 2cp-1-r (the zigzag layout of format/ops.def,
 * which balances causal attention); token shards are cut the same way.
 */
#include "data_int.h"

int64_t data_zigzag_pos(int64_t r, int64_t j, int64_t cp, int64_t window)
{
	int64_t l = window / (2 * cp);
	return j < l ? r * l + j : (2 * cp - 1 - r) * l + (j - l);
}

int data_load_positions(LoadCtx *c, uint32_t idx, const DpSource *rec, int dtype,
			DataSource *d)
{
	if (dtype != DP_I32 || (rec->seq_split && rec->sample_elems % 2))
		return RT_FAIL(c->e, "data source %u: positions must be i32 and, split over cp, "
			       "an even count (%s)", idx, c->where);
	d->positions = 1;
	d->elems = rec->sample_elems;
	d->window = rec->seq_split ? rec->sample_elems * c->cp : rec->sample_elems;
	return 0;
}

int data_load_keys(LoadCtx *c, uint32_t idx, const DpSource *rec, int dtype, DataSource *d)
{
	if (dtype != DP_I32 || rec->sample_elems != 2 || rec->seq_split)
		return RT_FAIL(c->e, "data source %u: sample keys must be i32, 2 per sample (%s)", idx,
			       c->where);
	d->keys = 1;
	d->elems = 2;
	return 0;
}

void data_fill_positions(const DataSet *d, const DataSource *ds, int32_t *out)
{
	int split = ds->window != ds->elems;
	for (int64_t j = 0; j < ds->elems; j++)
		out[j] = (int32_t)(split ? data_zigzag_pos(d->cp_rank, j, d->cp, ds->window) : j);
}
