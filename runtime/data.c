/*
 * data.c - the data set of a split: its sources opened by kind, checked
 * against each other and against the model, and the samples they give.
 *
 * data_open loads every IDX, .npy and synthetic source of one split into one
 * malloc'd array each (4-byte elements: float for f32 tensors, int32 for i32
 * tensors), checking what the .dp file declared against what the file holds,
 * and every label against the classes of the model (the last dim of the
 * logits its cross_entropy reads), so a bad label is found at load, not
 * hundreds of steps in. Token shards stay open files read a window at a
 * time (data_tokens.c). Every source of a split must hold the same number of
 * samples. Errors name the data file and the .dp file and line; a malformed
 * file is an error, never a crash.
 *
 * Errors while filling a batch (a shard that shrank, a token out of range)
 * cannot be returned through the executor's LOAD: the batch gets zeros, the
 * first error is kept, and data_error reports it after the step (the
 * training loop checks it before it logs or saves anything of that step).
 *
 * The kinds of source, one file each (data_int.h): data_idx.c, data_npy.c,
 * data_tokens.c, data_synth.c, data_positions.c; the order of the samples is
 * data_sampler.c's. The file formats' headers are util/datafile.c's, which
 * dpc checks at compile time too.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>

#include "data_share.h"

static const char *source_name(const DpStep *s, const DpSource *rec)
{
	return rec->kind == DP_SRC_SYNTHETIC ? "synthetic" : dpstep_str(s, rec->path);
}

static void format_where(char *buf, size_t len, const char *dp_file, uint32_t line)
{
	if (dp_file)
		snprintf(buf, len, "%s:%u", dp_file, line);
	else
		snprintf(buf, len, ".dp line %u", line);
}

const char *data_dtype_name(int dtype)
{
	return dp_name(dp_dtype_names, DP_NDTYPE, (unsigned)dtype);
}

int64_t data_bytes(int64_t n, int64_t elems)
{
	if (n <= 0 || elems <= 0 || n > DF_MAX_BYTES / 4 / elems)
		return -1;
	return n * elems * 4;
}

int data_alloc(LoadCtx *c, DataSource *d, int64_t n, int64_t elems, int elem_bytes)
{
	int64_t bytes = data_bytes(n, elems);
	if (bytes < 0)
		return RT_FAIL(c->e, "data file %s: %lld samples of %lld elements is too large (%s)",
			       c->path, (long long)n, (long long)elems, c->where);
	bytes = bytes / 4 * elem_bytes;
	d->data = c->seg ? data_share_create(c->seg, bytes) : NULL;
	if (d->data)
		d->mapped = (size_t)bytes;
	else
		d->data = malloc((size_t)bytes);
	if (!d->data)
		return RT_FAIL(c->e, "out of memory loading data file %s (%lld bytes)", c->path,
			       (long long)bytes);
	d->n = n;
	d->elems = elems;
	return 0;
}

/* ---- samples ---- */

void data_fill_failed(const DataSet *d, const char *fmt, ...)
{
	DataState *st = d->st;
	if (st->failed)
		return;
	char msg[900];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	st->err.rank = -1;
	RT_FAIL(&st->err, "%s", msg);
	st->failed = 1;
}

void data_copy_sample(const DataSet *d, const DataSource *ds, int64_t idx, void *out)
{
	if (ds->tokens) {
		data_token_sample(d, ds, idx, out);
		return;
	}
	if (ds->bytes) { /* IDX images: the conversion data_idx.c describes */
		const unsigned char *b = (const unsigned char *)ds->data + idx * ds->elems;
		float *f = out;
		for (int64_t k = 0; k < ds->elems; k++)
			f[k] = (float)b[k] / 255.0f;
		return;
	}
	size_t sample_bytes = (size_t)ds->elems * 4;
	memcpy(out, (const char *)ds->data + idx * sample_bytes, sample_bytes);
}

int data_error(const DataSet *d, RtErr *e)
{
	if (!d || !d->st->failed)
		return 0;
	int rank = e->rank;
	*e = d->st->err;
	e->rank = rank;
	return -1;
}

/* ---- the data set ---- */

/* The bound labels or token ids of data tensor `id` must stay below: the
 * classes of a cross_entropy/correct that reads them as labels (the last
 * dim of its logits) or the rows of an embedding table they index; the
 * smallest when several read them, 0 when none does. */
/* Is tensor t what source src's tensor holds: that tensor, or one a LOAD of it
 * writes (a pipelined step keeps each micro-batch's data apart)? */
static int holds_source(const DpStep *s, uint32_t src, int32_t t)
{
	if (t == s->sources[src].tensor)
		return 1;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->op == DP_OP_LOAD && in->out == t && DP_ATTR(in, LOAD, source) == src)
				return 1;
		}
	return 0;
}

static int64_t id_limit(const DpStep *s, uint32_t src)
{
	int64_t lim = 0;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			const DpTensor *t = NULL;
			int k = 0;
			if ((in->op == DP_OP_XENT || in->op == DP_OP_XENT_GRAD || in->op == DP_OP_CORRECT ||
			     in->op == DP_OP_XENT_FUSED) &&
			    in->in[0] >= 0 && holds_source(s, src, in->in[1])) {
				t = &s->tensors[in->in[0]];
				k = t->ndim ? t->ndim - 1 : 0;
			} else if (in->op == DP_OP_EMBEDDING && in->in[1] >= 0 &&
				   holds_source(s, src, in->in[0])) {
				t = &s->tensors[in->in[1]];
			}
			if (!t || !t->ndim)
				continue;
			int64_t n = init_whole_dim(s, t, k);
			if (n > 0 && (lim == 0 || n < lim))
				lim = n;
		}
	return lim;
}

/* Every label of a loaded label source below its limit. */
static int check_labels(const LoadCtx *c, const DataSource *d)
{
	const int32_t *v = d->data;
	if (d->role != 1 || d->tokens || !d->limit || !v)
		return 0;
	for (int64_t k = 0; k < d->n * d->elems; k++)
		if (v[k] >= d->limit) {
			char at[64] = "";
			if (d->elems > 1)
				snprintf(at, sizeof at, ", element %lld", (long long)(k % d->elems));
			return RT_FAIL(c->e, "data file %s: label %d of sample %lld%s is outside the %lld "
				       "classes of the model (%s)", c->path, v[k], (long long)(k / d->elems),
				       at, (long long)d->limit, c->where);
		}
	return 0;
}

/* An IDX or .npy file: the kinds a node loads once (data_share.c). */
static int is_file(const DpSource *rec)
{
	return rec->kind == DP_SRC_IDX || rec->kind == DP_SRC_NPY;
}

int data_load_file(LoadCtx *c, DataSource *d)
{
	int rc = c->rec->kind == DP_SRC_IDX ? data_load_idx(c, c->rec, c->dtype, d)
					    : data_load_npy(c, c->rec, c->dtype, d);
	return rc ? rc : check_labels(c, d);
}

/* Source idx into d: a file through the node's leader when share is given
 * (every node rank calls it, skip set on a rank that has failed before). */
static int load_source(const DpStep *s, uint32_t idx, const char *dp_file, const DataSet *set,
		       const DataShare *share, int skip, DataSource *d, RtErr *e)
{
	const DpSource *rec = &s->sources[idx];
	LoadCtx c = {.path = source_name(s, rec), .e = e, .cp = set->cp, .cp_rank = set->cp_rank,
		     .rec = rec};

	format_where(c.where, sizeof c.where, dp_file, rec->src_line);
	if (rec->tensor < 0 || (uint32_t)rec->tensor >= s->ntensors)
		return RT_FAIL(e, "data source %u names tensor %d, out of range (%s)", idx,
			       rec->tensor, c.where);
	if (rec->role > 1)
		return RT_FAIL(e, "data source %u has role %u (%s)", idx, rec->role, c.where);
	if (rec->sample_elems <= 0)
		return RT_FAIL(e, "data source %u declares %lld elements per sample (%s)", idx,
			       (long long)rec->sample_elems, c.where);
	int dtype = s->tensors[rec->tensor].dtype;
	c.dtype = dtype;
	d->role = rec->role;
	d->loaded = 1;
	d->limit = dtype == DP_I32 ? id_limit(s, idx) : 0;
	snprintf(d->where, sizeof d->where, "%s", c.where);
	if (share)
		return data_share_load(&c, share, skip, d);
	switch (rec->kind) {
	case DP_SRC_IDX:
	case DP_SRC_NPY:
		return data_load_file(&c, d);
	case DP_SRC_SYNTHETIC: {
		int rc = data_load_synthetic(&c, s, rec, dtype, d);
		return rc ? rc : check_labels(&c, d);
	}
	case DP_SRC_TOKENS:
		return data_load_tokens(&c, rec, dtype, d);
	case DP_SRC_POSITIONS:
		return data_load_positions(&c, idx, rec, dtype, d);
	case DP_SRC_SAMPLE_KEYS:
		return data_load_keys(&c, idx, rec, dtype, d);
	default:
		return RT_FAIL(e, "data source %u has unknown kind %u (%s)", idx, rec->kind, c.where);
	}
}

int data_open(const DpStep *s, DpSplit split, const char *dp_file, int cp_rank, DataSet **out,
	      RtErr *e)
{
	return data_open_node(s, split, dp_file, cp_rank, NULL, out, e);
}

int data_open_node(const DpStep *s, DpSplit split, const char *dp_file, int cp_rank,
		   const DataShare *share, DataSet **out, RtErr *e)
{
	/* A rank that cannot allocate d still takes part in the node's
	 * exchanges, with `none` for d and a slot of its own */
	DataSet *d = calloc(1, sizeof *d), none = {.split = split};
	DataSource slot;
	int first = -1, rc = 0;

	*out = NULL;
	if (!dp_file && *dpstep_str(s, s->source))
		dp_file = dpstep_str(s, s->source);
	if (d) {
		d->split = split;
		d->nsources = s->nsources;
		d->src = calloc(s->nsources ? s->nsources : 1, sizeof *d->src);
		d->st = calloc(1, sizeof *d->st);
	}
	if (!d || !d->src || !d->st) {
		rc = RT_FAIL(e, "out of memory");
		data_free(d);
		d = NULL;
	}
	DataSet *set = d ? d : &none;
	set->cp = (int)s->cfg.mesh[DP_AXIS_CP];
	set->cp_rank = cp_rank;
	/* With a node to share with, its files first: every node rank takes part
	 * in each one's exchange, also after an error of its own (skip). */
	for (int pass = share ? 0 : 1; pass < 2; pass++)
		for (uint32_t i = 0; i < s->nsources; i++) {
			int shared = share && is_file(&s->sources[i]);
			if (s->sources[i].split != split || shared != (pass == 0) || (rc && !shared))
				continue;
			DataSource *to = d ? &d->src[i] : memset(&slot, 0, sizeof slot);
			if (load_source(s, i, dp_file, set, shared ? share : NULL, rc != 0, to, e))
				rc = -1;
		}
	if (rc) {
		data_free(d);
		return -1;
	}
	int64_t longest = 1; /* token sample, for the read buffer */
	for (uint32_t i = 0; i < s->nsources; i++) {
		if (s->sources[i].split != split)
			continue;
		if (d->src[i].tokens && d->src[i].window > longest)
			longest = d->src[i].window;
		if (d->src[i].positions || d->src[i].keys)
			continue; /* not samples: made by the sampler */
		if (first < 0) {
			first = (int)i;
			d->n = d->src[i].n;
		} else if (d->src[i].n != d->n) {
			char w1[512], w2[512];
			format_where(w1, sizeof w1, dp_file, s->sources[first].src_line);
			format_where(w2, sizeof w2, dp_file, s->sources[i].src_line);
			RT_FAIL(e, "data sources of the %s split differ in sample count: %s has %lld (%s), %s has %lld (%s)",
				split == DP_SPLIT_TRAIN ? "train" : "eval",
				source_name(s, &s->sources[first]), (long long)d->n, w1,
				source_name(s, &s->sources[i]), (long long)d->src[i].n, w2);
			data_free(d);
			return -1;
		}
	}
	if (split == DP_SPLIT_TRAIN && d->n > 0) {
		d->st->perm = malloc((size_t)d->n * sizeof *d->st->perm);
		if (!d->st->perm) {
			data_free(d);
			return RT_FAIL(e, "out of memory for the sampler's permutation");
		}
	}
	d->st->tok = malloc((size_t)longest * 2);
	if (!d->st->tok) {
		data_free(d);
		return RT_FAIL(e, "out of memory");
	}
	*out = d;
	return 0;
}

int64_t data_node_bytes(const DataSet *d, int *sharers)
{
	int64_t b = 0;
	*sharers = 0;
	for (uint32_t i = 0; d && i < d->nsources; i++) {
		const DataSource *ds = &d->src[i];
		if (!ds->mapped)
			continue;
		b += (int64_t)ds->mapped;
		if (!*sharers || ds->sharers < *sharers)
			*sharers = ds->sharers;
	}
	return b;
}

void data_free(DataSet *d)
{
	if (!d)
		return;
	if (d->src)
		for (uint32_t i = 0; i < d->nsources; i++) {
			if (d->src[i].mapped)
				munmap(d->src[i].data, d->src[i].mapped);
			else
				free(d->src[i].data);
			data_close_shards(&d->src[i]);
		}
	free(d->src);
	if (d->st) {
		free(d->st->perm);
		free(d->st->tok);
	}
	free(d->st);
	free(d);
}

int64_t data_count(const DataSet *d)
{
	return d->n;
}

int data_check_batch(const DataSet *d, int64_t global_batch, RtErr *e)
{
	if (global_batch <= 0)
		return RT_FAIL(e, "global batch %lld is not positive", (long long)global_batch);
	if (d->n < global_batch)
		return RT_FAIL(e, "the %s split has %lld samples, fewer than the global batch of %lld",
			       d->split == DP_SPLIT_TRAIN ? "train" : "eval", (long long)d->n,
			       (long long)global_batch);
	return 0;
}
