/*
 * ckpt_rank.c - the rank-local part of a checkpoint (docs/CHECKPOINTS.md,
 * "Rank-local state"): state that belongs to one rank and is no piece of a
 * whole tensor of the model, which the ownership model (every element of
 * a whole tensor saved once, by its lowest holder) cannot hold. Today that
 * is gradient compression's (passes/compress.c, docs/COMPRESS.md), as
 * PyTorch's PowerSGDState keeps it per process:
 *   NAME.powersgd_err  this rank's error feedback E [n, m] (its own: the
 *                      ranks' differ);
 *   NAME.powersgd_q    the warm-started Q [m, r] (the same on every rank:
 *                      the output of an all_reduce, or its seeded init).
 * P is not state: every compressed step computes it from M and Q first.
 *
 * Saving (both forms): every rank writes rank-RRRRR-of-WWWWW.safetensors,
 * its tensors by name and local shape; state.json lists these files after
 * the form's, has "rank_state" ({"kind": "powersgd"}) and version 3, which
 * an older dpexec refuses by its version instead of training on without
 * the state.
 *
 * Loading at the world size that wrote it: each rank reads its own file,
 * so the run continues bit for bit. At another world size W': Q from rank
 * 0's file on every rank, and every rank's E set to the sum of the
 * writers' E over W'. The compressed path sees E only through the sums of
 * its all_reduces (P = sum_r (M_r + E_r) Q, then Q = sum_r (M_r + E_r)^T P)
 * and keeps that sum (E_r' = M_r + E_r - P Q^T / W sums to sum(M + E) -
 * P Q^T), so this continues the same mathematics, up to rounding. A
 * checkpoint without rank state (its run did not compress), or whose
 * tensors are not this run's by name and shape (another rank, other
 * matrices compressed), leaves the initial state (E zero, Q from the seed)
 * with a note; rank state this run has no use for is noted too.
 *
 * At pp > 1 each stage's ranks hold their own matrices' state
 * (passes/stage_params.c; another stage's shares its arena bytes): a rank
 * writes and loads the tensors that its stage's instructions (or every
 * rank's) touch. At another world size Q comes from the first writer that
 * holds it and E is the holders' sum divided by the ranks that hold it now
 * (a stage's dp group; at pp = 1 every rank).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckpt_int.h"

/* The rank-local tensors, by the suffix of their name; summed: resharded
 * as the mean of the writers' sum (E), else taken from rank 0 (Q). */
static const struct {
	const char *suffix;
	int summed;
} rank_kinds[] = {
	{".powersgd_err", 1},
	{".powersgd_q", 0},
};

/* rank_kinds' entry of tensor t, -1 when it is not rank-local state. */
static int kind_of(const DpStep *s, const DpTensor *t)
{
	if (t->kind != DP_T_OPTSTATE || t->dtype != DP_F32)
		return -1;
	const char *name = dpstep_str(s, t->name);
	size_t n = strlen(name);
	for (int k = 0; k < (int)(sizeof rank_kinds / sizeof rank_kinds[0]); k++) {
		size_t l = strlen(rank_kinds[k].suffix);
		if (n > l && !strcmp(name + n - l, rank_kinds[k].suffix))
			return k;
	}
	return -1;
}

/* The stages whose instructions (in any program) read or write tensor id,
 * bit k for stage k; *every: one that every rank runs does. */
static uint64_t touched_by(const DpStep *s, int32_t id, int *every)
{
	uint64_t set = 0;
	*every = 0;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			int hit = in->out == id;
			for (int j = 0; j < DP_MAX_IN && !hit; j++)
				hit = in->in[j] == id;
			int st = dp_instr_stage(in);
			if (hit && (st < 0 || st >= 64))
				*every = 1;
			else if (hit)
				set |= (uint64_t)1 << st;
		}
	return set;
}

int ckpt_rank_find(Ckpt *c, RtErr *e)
{
	const DpStep *s = c->s;
	int pp = s->cfg.mesh[DP_AXIS_PP] > 1 ? (int)s->cfg.mesh[DP_AXIS_PP] : 1;
	for (uint32_t id = 0; id < s->ntensors; id++) {
		if (kind_of(s, &s->tensors[id]) < 0)
			continue;
		int32_t *t = realloc(c->rank_t, (size_t)(c->nrank + 1) * sizeof *t);
		if (t)
			c->rank_t = t;
		unsigned char *h = realloc(c->rank_here, (size_t)(c->nrank + 1) * sizeof *h);
		if (h)
			c->rank_here = h;
		int *n = realloc(c->rank_holders, (size_t)(c->nrank + 1) * sizeof *n);
		if (n)
			c->rank_holders = n;
		if (!t || !h || !n)
			return RT_FAIL(e, "out of memory");
		/* at pp > 1 a stage's own matrices' state is on its ranks alone
		 * (another stage's shares their arena bytes: never read or
		 * written here); a tied one's on the stages that read it */
		int every;
		uint64_t set = touched_by(s, (int32_t)id, &every);
		every |= !set;
		int here = every || (c->x->pp_stage >= 0 && c->x->pp_stage < 64 && set >> c->x->pp_stage & 1);
		c->rank_t[c->nrank] = (int32_t)id;
		c->rank_here[c->nrank] = (unsigned char)here;
		c->rank_holders[c->nrank] = every ? c->w->size : __builtin_popcountll(set) * (c->w->size / pp);
		c->nrank++;
		if (here)
			c->rank_elems += exec_numel(&s->tensors[id]);
	}
	return 0;
}

int ckpt_rank_save(Ckpt *c, const char *tmpdir, CkptFile *file, RtErr *e)
{
	const DpStep *s = c->s;
	World *w = c->w;
	StDecl *d = calloc((size_t)c->nrank + 1, sizeof *d);
	if (!d)
		return RT_FAIL(e, "out of memory");
	int nd = 0;
	for (int i = 0; i < c->nrank; i++) {
		const DpTensor *t = &s->tensors[c->rank_t[i]];
		if (!c->rank_here[i])
			continue;
		d[nd] = (StDecl){.name = dpstep_str(s, t->name), .dtype = ST_F32, .ndim = t->ndim};
		memcpy(d[nd++].dims, t->dims, sizeof d[0].dims);
	}
	char name[64], path[4200];
	snprintf(name, sizeof name, "rank-%05d-of-%05d.safetensors", w->rank, w->size);
	snprintf(path, sizeof path, "%s/%s", tmpdir, name);
	StWriter wr;
	int rc = st_begin(&wr, path, d, nd, e);
	free(d);
	RT_CHECK(rc);
	for (int i = 0; rc == 0 && i < c->nrank; i++) {
		if (!c->rank_here[i])
			continue;
		int64_t bytes = exec_tensor_bytes(s, c->rank_t[i]);
		float *v = malloc((size_t)(bytes ? bytes : 1));
		if (!v)
			rc = RT_FAIL(e, "out of memory");
		else if ((rc = exec_tensor_read(c->x, c->rank_t[i], v, e)) == 0)
			rc = st_put(&wr, v, exec_numel(&s->tensors[c->rank_t[i]]) * 4, e);
		free(v);
	}
	if (rc) {
		st_cancel(&wr);
		return -1;
	}
	RT_CHECK(st_end(&wr, e));
	snprintf(file->name, sizeof file->name, "%s", name);
	file->bytes = wr.bytes;
	file->crc = wr.sums.crc;
	file->ncrc = wr.sums.n;
	memset(&wr.sums, 0, sizeof wr.sums);
	return 0;
}

void ckpt_rank_json(const Ckpt *c, cJSON *o)
{
	cJSON *t = cJSON_AddObjectToObject(o, "rank_state");
	cJSON_AddStringToObject(t, "kind", dp_kind_name(DP_SET_COMPRESS, (int)c->s->cfg.compress));
}

/* Is tensor i of this run's rank tensors in f with its shape? */
static int has(const Ckpt *c, int i, const StFile *f)
{
	const DpTensor *t = &c->s->tensors[c->rank_t[i]];
	int k = st_find(f, dpstep_str(c->s, t->name));
	int same = k >= 0 && f->t[k].dtype == ST_F32 && f->t[k].ndim == t->ndim;
	for (int d = 0; same && d < t->ndim; d++)
		same = f->t[k].dims[d] == t->dims[d];
	return same;
}

/* The first of the rank tensors this rank holds that the writers' files (nf)
 * lack or hold in another shape (its name), or NULL when they have them all:
 * at the world size that wrote them this rank's own file, else any (at
 * pp > 1 a stage's own matrices are in its ranks' files alone). */
static const char *mismatch(const Ckpt *c, const StFile *f, int nf)
{
	for (int i = 0; i < c->nrank; i++) {
		int found = 0;
		if (!c->rank_here[i])
			continue;
		if (nf == c->w->size)
			found = has(c, i, &f[c->w->rank]);
		for (int r = 0; r < nf && nf != c->w->size && !found; r++)
			found = has(c, i, &f[r]);
		if (!found)
			return dpstep_str(c->s, c->s->tensors[c->rank_t[i]].name);
	}
	return NULL;
}

/* Read tensor `name` of f (n elements) into v; finite, or refused. */
static int read_values(const StFile *f, const char *name, float *v, int64_t n, const char *dir,
		       RtErr *e)
{
	RT_CHECK(st_pread(f, st_find(f, name), 0, v, n * 4, e));
	for (int64_t j = 0; j < n; j++)
		if (!isfinite(v[j]))
			return RT_FAIL(e, "checkpoint %s holds %s at element %lld of '%s' in %s: refusing "
				       "to resume from it", dir, isnan(v[j]) ? "NaN" : "an infinity",
				       (long long)j, name, f->path);
	return 0;
}

/* This rank's value of tensor i from the writers' files (nf of them): its
 * own at the world that wrote them; else Q from the first writer that holds
 * it, E the writers' sum divided by the ranks that hold it now. */
static int take(Ckpt *c, int i, const StFile *f, int nf, float *v, double *sum, const char *dir,
		RtErr *e)
{
	const DpTensor *t = &c->s->tensors[c->rank_t[i]];
	const char *name = dpstep_str(c->s, t->name);
	int64_t n = exec_numel(t);
	if (nf == c->w->size) /* the world that wrote it: this rank's own */
		return read_values(&f[c->w->rank], name, v, n, dir, e);
	int first = 0;
	while (first < nf - 1 && !has(c, i, &f[first]))
		first++;
	if (!rank_kinds[kind_of(c->s, t)].summed)
		return read_values(&f[first], name, v, n, dir, e);
	for (int64_t j = 0; j < n; j++)
		sum[j] = 0;
	for (int r = 0; r < nf; r++) {
		if (!has(c, i, &f[r]))
			continue;
		RT_CHECK(read_values(&f[r], name, v, n, dir, e));
		for (int64_t j = 0; j < n; j++)
			sum[j] += v[j];
	}
	for (int64_t j = 0; j < n; j++)
		v[j] = (float)(sum[j] / c->rank_holders[i]);
	return 0;
}

int ckpt_rank_load(Ckpt *c, const char *dir, const CkptState *st, char **notes, RtErr *e)
{
	int nf = st->rank_files, nform = st->nfiles - nf, rc = 0;
	const char *kind = c->nrank ? dp_kind_name(DP_SET_COMPRESS, (int)c->s->cfg.compress) : "";
	if (!nf && c->nrank) {
		ckpt_note(notes, "note: %s holds no %s state (its run did not compress): the error "
			  "feedback starts at zero and Q from its initialisation\n", dir, kind);
		return 0;
	}
	if (nf && !c->nrank) {
		ckpt_note(notes, "note: %s holds each rank's gradient compression state, which this "
			  "step file does not compress with: not loaded\n", dir);
		return 0;
	}
	if (!nf)
		return 0;
	StFile *f = calloc((size_t)nf, sizeof *f);
	if (!f)
		return RT_FAIL(e, "out of memory");
	int nopen = 0;
	const char *bad = NULL;
	for (int r = 0; rc == 0 && r < nf; r++) {
		const CkptFile *cf = &st->files[nform + r];
		char p[4200];
		snprintf(p, sizeof p, "%s/%s", dir, cf->name);
		if (access(p, F_OK) != 0) {
			rc = RT_FAIL(e, "checkpoint %s is damaged: %s is missing", dir, p);
			break;
		}
		if ((rc = st_open(&f[r], p, e)))
			break;
		nopen++;
		if (f[r].size != cf->bytes)
			rc = RT_FAIL(e, "checkpoint %s is damaged: %s has %lld bytes, %s says %lld", dir,
				     cf->name, (long long)f[r].size, CKPT_STATE, (long long)cf->bytes);
		else if (cf->crc)
			rc = st_verify_with(&f[r], cf->crc, cf->ncrc, e);
	}
	if (rc == 0)
		bad = mismatch(c, f, nf);
	if (rc == 0 && bad)
		ckpt_note(notes, "note: %s's %s state is not this run's ('%s' is missing or of "
			  "another shape): the error feedback starts at zero and Q from its "
			  "initialisation\n", dir, kind, bad);
	else if (rc == 0 && nf != c->w->size)
		ckpt_note(notes, "note: %s state written by %d ranks, loaded by %d: Q is the first "
			  "holder's (rank 0's at pp=1) and each rank's error feedback the sum of the "
			  "writers' that hold it divided by the ranks that hold it now "
			  "(docs/CHECKPOINTS.md)\n", kind, nf, c->w->size);
	int64_t most = 0;
	for (int i = 0; i < c->nrank; i++) {
		int64_t n = exec_numel(&c->s->tensors[c->rank_t[i]]);
		most = n > most ? n : most;
	}
	float *v = rc || bad ? NULL : malloc((size_t)(most ? most : 1) * sizeof *v);
	double *sum = rc || bad ? NULL : malloc((size_t)(most ? most : 1) * sizeof *sum);
	if (rc == 0 && !bad && (!v || !sum))
		rc = RT_FAIL(e, "out of memory");
	for (int i = 0; rc == 0 && !bad && i < c->nrank; i++)
		if (c->rank_here[i] && (rc = take(c, i, f, nf, v, sum, dir, e)) == 0)
			rc = exec_tensor_write(c->x, c->rank_t[i], v, e);
	free(v);
	free(sum);
	for (int r = 0; r < nopen; r++)
		st_close(&f[r]);
	free(f);
	return rc;
}
