/*
 * data_synth.c - synthetic classification data: a linearly separable
 * problem with a fixed seed (0x5eed), independent of the train seed, so the
 * data is the same whatever the model seed (docs/DATA.md).
 *
 *   x[i, k] = init normal(0, 1) of name "synthetic.x" ("synthetic.eval.x"
 *             for the eval split) at element i*D + k, rounded to float
 *   W[c, k] = normal(0, 1) of "synthetic.w" at element c*D + k
 *   label[i] = argmax_c sum_k W[c,k] * x[i,k] (floats widened to double,
 *              summed in k order, first maximum wins)
 *
 * D is the elements per sample of the split's synthetic features source;
 * labels need one.
 */
#include <stdlib.h>

#include "data_int.h"

#define DATA_SYNTH_SEED 0x5eedull

/* Samples per x row come from the features record of the same split. */
static const DpSource *synth_features(const DpStep *s, DpSplit split)
{
	for (uint32_t i = 0; i < s->nsources; i++) {
		const DpSource *r = &s->sources[i];
		if (r->split == split && r->kind == DP_SRC_SYNTHETIC && r->role == 0)
			return r;
	}
	return NULL;
}

int data_load_synthetic(LoadCtx *c, const DpStep *s, const DpSource *rec, int dtype,
			DataSource *d)
{
	const char *xname = rec->split == DP_SPLIT_EVAL ? "synthetic.eval.x" : "synthetic.x";
	int64_t n = rec->synth_n;

	if (n <= 0)
		return RT_FAIL(c->e, "synthetic data needs at least one sample, got %lld (%s)",
			       (long long)n, c->where);
	if (rec->role == 0) {
		if (dtype != DP_F32)
			return RT_FAIL(c->e, "synthetic features are f32, but the .dp file declares %s (%s)",
				       data_dtype_name(dtype), c->where);
		int64_t dim = rec->sample_elems;
		RT_CHECK(data_alloc(c, d, n, dim, 4));
		init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, DATA_SYNTH_SEED, xname, 0, n * dim, d->data);
		return 0;
	}
	if (dtype != DP_I32)
		return RT_FAIL(c->e, "synthetic labels are i32, but the .dp file declares %s (%s)",
			       data_dtype_name(dtype), c->where);
	if (rec->sample_elems != 1)
		return RT_FAIL(c->e, "synthetic labels have one element per sample, the .dp file declares %lld (%s)",
			       (long long)rec->sample_elems, c->where);
	int classes = rec->synth_classes;
	if (classes < 1)
		return RT_FAIL(c->e, "synthetic data needs at least one class, got %d (%s)", classes,
			       c->where);
	const DpSource *feat = synth_features(s, (DpSplit)rec->split);
	if (!feat)
		return RT_FAIL(c->e,
			       "synthetic labels need synthetic features in the same split to compute them from (%s)",
			       c->where);
	int64_t dim = feat->sample_elems;
	if (dim <= 0 || data_bytes(classes, dim) < 0)
		return RT_FAIL(c->e, "synthetic features of %lld elements are not supported (%s)",
			       (long long)dim, c->where);
	RT_CHECK(data_alloc(c, d, n, 1, 4));
	float *w = malloc((size_t)classes * dim * sizeof *w);
	float *x = malloc((size_t)dim * sizeof *x);
	if (!w || !x) {
		free(w);
		free(x);
		return RT_FAIL(c->e, "out of memory making synthetic labels");
	}
	init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, DATA_SYNTH_SEED, "synthetic.w", 0,
		  (int64_t)classes * dim, w);
	int32_t *labels = d->data;
	for (int64_t i = 0; i < n; i++) {
		init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, DATA_SYNTH_SEED, xname, i * dim, dim, x);
		double best = 0.0;
		int arg = 0;
		for (int cl = 0; cl < classes; cl++) {
			const float *wc = w + (int64_t)cl * dim;
			double acc = 0.0;
			for (int64_t k = 0; k < dim; k++)
				acc += (double)wc[k] * (double)x[k];
			if (cl == 0 || acc > best) {
				best = acc;
				arg = cl;
			}
		}
		labels[i] = arg;
	}
	free(w);
	free(x);
	return 0;
}
