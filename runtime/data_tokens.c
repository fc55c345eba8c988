/*
 * data_tokens.c - llm.c token shards: a header of 256 little-endian int32
 * (magic 20240520, version 1, token count n, the rest unused), then n
 * little-endian uint16 tokens; the file is exactly 1024 + 2n bytes (checked
 * by util/datafile.c, as dpc does).
 *
 * The source's path is a glob(3) pattern; the matches, in glob's sorted
 * order, are concatenated in sample space: with T = sample_elems, a shard
 * holds (n - 1) / T samples and sample k of a shard is tokens
 * [k*T + shift, k*T + shift + T), shift 0 for the inputs and 1 for the
 * next-token targets. Both shifts give the same count, a window never
 * crosses a shard, and the last token of a shard is only ever a target.
 *
 * Shards can be gigabytes of uint16, so each stays an open file whose size
 * is checked at load against its header, and a sample's tokens are read with
 * pread and widened to int32 when a batch is filled (not mmap: a shard
 * truncated while the run reads it would be SIGBUS; with pread it is a short
 * read, an error). Token ids are checked against the model's vocabulary at
 * load (one streaming pass, data_scan.c) and again as they are read. Such errors cannot be returned through the executor's LOAD:
 * the batch gets zeros and data_fill_failed keeps the first.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_int.h"

void data_close_shards(DataSource *d)
{
	for (int i = 0; i < d->nshards; i++) {
		if (d->shards[i].fd >= 0)
			close(d->shards[i].fd);
		free(d->shards[i].path);
	}
	free(d->shards);
	d->shards = NULL;
	d->nshards = 0;
}

int data_load_tokens(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d)
{
	glob_t g;
	char msg[DATA_MSG];
	int64_t T = rec->sample_elems;

	if (dtype != DP_I32)
		return RT_FAIL(c->e, "tokens from %s must be declared i32, not %s (%s)", c->path,
			       data_dtype_name(dtype), c->where);
	if (rec->shift > 1)
		return RT_FAIL(c->e, "tokens from %s: shift %u, only 0 and 1 are supported (%s)",
			       c->path, rec->shift, c->where);
	d->tokens = 1;
	d->shift = rec->shift;
	d->elems = T;
	/* a split sequence: the shard's window is the whole sequence, of which this
	 * cp rank takes its two chunks (data_token_sample) */
	if (rec->seq_split)
		T *= c->cp;
	d->window = T;
	if (tok_glob(c->path, &g, msg, sizeof msg) != 0)
		return data_df_fail(c, msg);
	d->shards = calloc(g.gl_pathc, sizeof *d->shards);
	if (!d->shards) {
		globfree(&g);
		return RT_FAIL(c->e, "out of memory loading %s", c->path);
	}
	int64_t total = 0;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		TokShard *sh = &d->shards[i];
		sh->fd = -1;
		if (tok_open_shard(g.gl_pathv[i], T, &sh->fd, &sh->ntok, msg, sizeof msg) != 0) {
			globfree(&g);
			return data_df_fail(c, msg); /* data_free closes what was opened */
		}
		sh->path = strdup(g.gl_pathv[i]);
		if (!sh->path) {
			close(sh->fd);
			sh->fd = -1;
			globfree(&g);
			return RT_FAIL(c->e, "out of memory loading %s", g.gl_pathv[i]);
		}
		d->nshards++;
		/* every id below the vocabulary now, not when its window is drawn */
		if (data_scan_tokens(sh->fd, sh->path, TOK_HEADER_BYTES, sh->ntok, d->limit, c->where,
				     c->e)) {
			globfree(&g);
			return -1;
		}
		sh->first = total;
		total += (sh->ntok - 1) / T;
	}
	globfree(&g);
	d->n = total;
	return 0;
}

void data_token_sample(const DataSet *d, const DataSource *ds, int64_t idx, int32_t *out)
{
	int lo = 0, hi = ds->nshards - 1;

	assert(idx >= 0 && idx < ds->n && ds->nshards > 0);
	while (lo < hi) { /* the last shard with first <= idx */
		int mid = (lo + hi + 1) / 2;
		if (ds->shards[mid].first <= idx)
			lo = mid;
		else
			hi = mid - 1;
	}
	const TokShard *sh = &ds->shards[lo];
	int64_t start = (idx - sh->first) * ds->window + ds->shift;
	assert(start + ds->window <= sh->ntok);
	unsigned char *p = d->st->tok;
	size_t len = (size_t)ds->window * 2, got = 0;
	off_t at = TOK_HEADER_BYTES + 2 * start;
	while (got < len) {
		ssize_t r = pread(sh->fd, p + got, len - got, at + (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			data_fill_failed(d, "cannot read token shard %s: %s: tokens [%lld, %lld) are past "
					 "its end, the file is shorter than when the run started (%s)",
					 sh->path, r < 0 ? strerror(errno) : "truncated", (long long)start,
					 (long long)(start + ds->window), ds->where);
			memset(out, 0, (size_t)ds->elems * 4);
			return;
		}
		got += (size_t)r;
	}
	int split = ds->window != ds->elems;
	for (int64_t j = 0; j < ds->elems; j++) {
		int64_t k = split ? data_zigzag_pos(d->cp_rank, j, d->cp, ds->window) : j;
		out[j] = (int32_t)((uint32_t)p[2 * k] | (uint32_t)p[2 * k + 1] << 8);
		if (ds->limit && out[j] >= ds->limit) {
			data_fill_failed(d, "token shard %s: token %d at index %lld is outside the model's "
					 "vocabulary of %lld (%s)", sh->path, out[j], (long long)(start + k),
					 (long long)ds->limit, ds->where);
			out[j] = 0;
		}
	}
}
