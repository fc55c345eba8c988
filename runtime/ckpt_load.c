/*
 * ckpt_load.c - reading a checkpoint back (ckpt.h): whether it is of this
 * model and run (refused naming what differs; state.json itself is
 * validated by ckpt_state.c, and which directory --resume names is
 * ckpt_dir.c's), and every rank reading exactly the pieces of the whole
 * tensors its own tensors hold, from whichever files they are in (pread,
 * every block verified against its CRC-32C), so a checkpoint of any layout
 * loads at any other. What is loaded must be finite. The rank-local state
 * last (ckpt_rank.c).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ckpt_int.h"

/* Where the values of a piece of a whole tensor are in the checkpoint. */
typedef struct {
	int32_t file[CKPT_MAX_COMP];   /* per component: the file */
	int32_t tensor[CKPT_MAX_COMP]; /* and the tensor in it */
	int64_t full, n;               /* elements of the whole tensor */
	int64_t flat;                  /* element of the file's tensor where they start */
} Piece;

typedef struct {
	StFile *file;
	int nfile;
	Piece *p;   /* sorted by (entry, full) */
	int32_t *ent;
	int64_t n;
	int64_t *first; /* [nent + 1]: pieces of entry k are p[first[k] .. first[k+1]) */
} Source;

static void source_free(Source *src)
{
	for (int i = 0; i < src->nfile; i++)
		st_close(&src->file[i]);
	free(src->file);
	free(src->p);
	free(src->ent);
	free(src->first);
	memset(src, 0, sizeof *src);
}

static int push_piece(Source *src, int64_t *cap, int32_t ent, Piece p, RtErr *e)
{
	if (src->n == *cap) {
		int64_t c2 = *cap ? 2 * *cap : 64;
		Piece *np = realloc(src->p, (size_t)c2 * sizeof *np);
		int32_t *ne = np ? realloc(src->ent, (size_t)c2 * sizeof *ne) : NULL;
		if (np)
			src->p = np;
		if (ne)
			src->ent = ne;
		if (!np || !ne)
			return RT_FAIL(e, "out of memory");
		*cap = c2;
	}
	src->p[src->n] = p;
	src->ent[src->n++] = ent;
	return 0;
}

/* Sort the pieces by (entry, full) and index them by entry. */
static int source_index(Source *src, int nent, RtErr *e)
{
	/* counting sort by entry, then insertion order by full within (files list them sorted) */
	src->first = calloc((size_t)nent + 2, sizeof *src->first);
	Piece *p = malloc((size_t)(src->n ? src->n : 1) * sizeof *p);
	if (!src->first || !p) {
		free(p);
		return RT_FAIL(e, "out of memory");
	}
	for (int64_t i = 0; i < src->n; i++)
		src->first[src->ent[i] + 1]++;
	for (int k = 0; k < nent; k++)
		src->first[k + 1] += src->first[k];
	int64_t *at = calloc((size_t)nent + 1, sizeof *at);
	if (!at) {
		free(p);
		return RT_FAIL(e, "out of memory");
	}
	for (int64_t i = 0; i < src->n; i++)
		p[src->first[src->ent[i]] + at[src->ent[i]]++] = src->p[i];
	free(at);
	free(src->p);
	src->p = p;
	for (int k = 0; k < nent; k++) { /* insertion sort by full: pieces come nearly sorted */
		for (int64_t i = src->first[k] + 1; i < src->first[k + 1]; i++) {
			Piece x = p[i];
			int64_t j = i - 1;
			while (j >= src->first[k] && p[j].full > x.full) {
				p[j + 1] = p[j];
				j--;
			}
			p[j + 1] = x;
		}
	}
	return 0;
}

static const cJSON *jget(const cJSON *o, const char *k)
{
	return cJSON_GetObjectItemCaseSensitive(o, k);
}

static double jnum(const cJSON *o, const char *k, double dflt)
{
	const cJSON *v = jget(o, k);
	return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static const char *jstr(const cJSON *o, const char *k)
{
	const cJSON *v = jget(o, k);
	return cJSON_IsString(v) ? v->valuestring : "";
}

/* Append a line to a growing text (notes, differences). */
void ckpt_note(char **text, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	size_t old = *text ? strlen(*text) : 0;
	char *t = realloc(*text, old + strlen(line) + 1);
	if (!t)
		return;
	memcpy(t + old, line, strlen(line) + 1);
	*text = t;
}

/* The checkpoint's model against this step file's: 0, or -1 with every
 * difference named. ck_ent[i]: this file's entry of checkpoint tensor i. */
static int check_model(Ckpt *c, const char *dir, const cJSON *js, int32_t **ck_ent, int *nck,
		       char **notes, RtErr *e)
{
	const DpStep *s = c->s;
	char *diff = NULL;
	int ndiff = 0;
	const cJSON *ts = jget(jget(js, "model"), "tensors");
	int n = cJSON_GetArraySize(ts);
	*ck_ent = calloc((size_t)(n ? n : 1), sizeof **ck_ent);
	int *seen = calloc((size_t)(c->nent ? c->nent : 1), sizeof *seen);
	if (!*ck_ent || !seen) {
		free(seen);
		return RT_FAIL(e, "out of memory");
	}
	*nck = n;
	int i = 0;
	for (const cJSON *t = ts ? ts->child : NULL; t; t = t->next, i++) {
		const char *name = jstr(t, "name");
		int64_t dims[DP_MAX_DIMS] = {0};
		int nd = cJSON_GetArraySize(jget(t, "shape"));
		int d = 0;
		for (const cJSON *x = jget(t, "shape") ? jget(t, "shape")->child : NULL;
		     x && d < DP_MAX_DIMS; x = x->next)
			dims[d++] = (int64_t)x->valuedouble;
		int k = 0;
		while (k < c->nent && strcmp(ckpt_ent_name(c, k), name))
			k++;
		(*ck_ent)[i] = k < c->nent ? k : -1;
		char a[128], b[128];
		ckpt_dims_str(a, sizeof a, nd, dims);
		if (k == c->nent) {
			if (ndiff++ < 4)
				ckpt_note(&diff, "\n  the checkpoint has a parameter '%s' [%s] that this model does not",
				     name, a);
			continue;
		}
		seen[k] = 1;
		int same = nd == c->ent[k].ndim;
		for (int q = 0; same && q < nd; q++)
			same = dims[q] == c->ent[k].dims[q];
		if (!same && ndiff++ < 4) {
			ckpt_dims_str(b, sizeof b, c->ent[k].ndim, c->ent[k].dims);
			ckpt_note(&diff, "\n  parameter '%s' is [%s] in the checkpoint, [%s] in this model",
			     name, a, b);
		}
		if (!same)
			(*ck_ent)[i] = -1;
	}
	for (int k = 0; k < c->nent; k++)
		if (!seen[k] && ndiff++ < 4) {
			char b[128];
			ckpt_dims_str(b, sizeof b, c->ent[k].ndim, c->ent[k].dims);
			ckpt_note(&diff, "\n  this model's parameter '%s' [%s] is not in the checkpoint",
			     ckpt_ent_name(c, k), b);
		}
	free(seen);
	const cJSON *opt = jget(js, "optimizer");
	const char *kind = jstr(opt, "kind");
	const char *mine = dp_kind_name(DP_SET_OPTIMIZER, (int)s->opt.kind);
	if (strcmp(kind, mine) && ndiff++ < 5)
		ckpt_note(&diff, "\n  its optimizer is %s, this model's %s", kind, mine);
	/* the run: the data order depends on the seed and the global batch */
	if ((uint64_t)jnum(js, "seed", -1) != s->cfg.seed && ndiff++ < 6)
		ckpt_note(&diff, "\n  its seed is %.0f, this step file's %llu", jnum(js, "seed", -1),
		     (unsigned long long)s->cfg.seed);
	if ((int64_t)jnum(js, "global_batch", -1) != ckpt_global_batch(s) && ndiff++ < 7)
		ckpt_note(&diff, "\n  its global batch is %.0f, this step file's %lld",
		     jnum(js, "global_batch", -1), (long long)ckpt_global_batch(s));
	if (ndiff) {
		RT_FAIL(e, "cannot resume from %s: it was written for another model or run%s%s%s", dir,
			diff ? diff : "", ndiff > 7 ? "\n  ..." : "",
			"\n  (to start a new run from its parameters: --init-from DIR/model.safetensors "
			"of a full checkpoint)");
		free(diff);
		return -1;
	}
	/* hyperparameters may change on resume: say so (the optimizer's fields
	 * one by one, the schedule as a whole) */
	const cJSON *sc = jget(js, "schedule");
	int sched_differs = strcmp(jstr(sc, "kind"), dp_kind_name(DP_SET_SCHEDULE, (int)s->sched.kind));
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		int in_opt = st->rec == DP_REC_OPT, in_sched = st->rec == DP_REC_SCHED;
		if ((!in_opt && !in_sched) || st->alias || !st->ir_key || st->ir_mode == DP_IRM_HEAD)
			continue;
		double mine_v = dp_field_get(dp_setting_cfield(s, i), st->ctype);
		/* a key the checkpoint lacks: a NONZERO one was 0; an optimizer's is not
		 * worth a note */
		double v = jnum(in_opt ? opt : sc, st->ir_key,
				st->ir_mode == DP_IRM_NONZERO || in_sched ? 0 : mine_v);
		if ((float)v == (float)mine_v)
			continue;
		if (in_sched)
			sched_differs = 1;
		else
			ckpt_note(notes, "note: %s is %g in this step file, %g in the checkpoint\n", st->ir_key,
			     mine_v, v);
	}
	if (sched_differs)
		ckpt_note(notes, "note: the lr schedule differs from the checkpoint's\n");
	return 0;
}

/* Check the files state.json lists (their sizes; their checksums, which
 * every read verifies from then on); open them; list their pieces. */
static int open_source(Ckpt *c, const char *dir, const CkptState *st, const int32_t *ck_ent,
		       int nck, Source *src, RtErr *e)
{
	int nf = st->nfiles - st->rank_files, full = !st->sharded; /* the form's files */
	char p[4096];
	int64_t cap = 0;
	memset(src, 0, sizeof *src);
	src->file = calloc((size_t)(nf ? nf : 1), sizeof *src->file);
	if (!src->file)
		return RT_FAIL(e, "out of memory");
	for (int i = 0; i < nf; i++) {
		const CkptFile *f = &st->files[i];
		struct stat sb;
		snprintf(p, sizeof p, "%s/%s", dir, f->name);
		if (stat(p, &sb) != 0)
			return RT_FAIL(e, "checkpoint %s is damaged: %s is missing", dir, p);
		if (sb.st_size != f->bytes)
			return RT_FAIL(e, "checkpoint %s is damaged: %s has %lld bytes, %s says %lld",
				       dir, f->name, (long long)sb.st_size, CKPT_STATE, (long long)f->bytes);
		RT_CHECK(st_open(&src->file[i], p, e));
		src->nfile = i + 1;
		if (f->crc)
			RT_CHECK(st_verify_with(&src->file[i], f->crc, f->ncrc, e));
	}
	if (full) {
		/* model.safetensors and optimizer.safetensors: a piece per whole tensor */
		for (int k = 0; k < c->nent; k++) {
			Piece pc = {.full = 0, .n = c->ent[k].numel, .flat = 0};
			for (int cc = 0; cc < c->ncomp; cc++) {
				char tn[600];
				ckpt_comp_name(c, cc, k, tn, sizeof tn);
				int fi = cc ? 1 : 0, t = fi < src->nfile ? st_find(&src->file[fi], tn) : -1;
				if (t < 0 || src->file[fi].t[t].dtype != ST_F32 ||
				    (src->file[fi].t[t].end - src->file[fi].t[t].begin) / 4 != c->ent[k].numel)
					return RT_FAIL(e, "checkpoint %s lacks the tensor '%s' (or it has the "
						       "wrong size)", dir, tn);
				pc.file[cc] = fi;
				pc.tensor[cc] = t;
			}
			RT_CHECK(push_piece(src, &cap, k, pc, e));
		}
		return source_index(src, c->nent, e);
	}
	for (int f = 0; f < src->nfile; f++) {
		StFile *sf = &src->file[f];
		int ts = st_find(sf, "segments");
		Piece pc = {.file = {f, f, f}};
		if (ts < 0 || sf->t[ts].dtype != ST_I64 || sf->t[ts].ndim != 2 || sf->t[ts].dims[1] != 3)
			return RT_FAIL(e, "checkpoint %s: %s has no segments table", dir, sf->path);
		int64_t total = 0;
		for (int cc = 0; cc < c->ncomp; cc++) {
			pc.tensor[cc] = st_find(sf, cc ? c->comp[cc] : "param");
			if (pc.tensor[cc] < 0)
				return RT_FAIL(e, "checkpoint %s: %s has no '%s' values", dir, sf->path,
					       cc ? c->comp[cc] : "param");
		}
		int64_t nrow = sf->t[ts].dims[0];
		int64_t *rows = malloc((size_t)(nrow ? nrow : 1) * 24);
		if (!rows)
			return RT_FAIL(e, "out of memory");
		if (st_pread(sf, ts, 0, rows, nrow * 24, e)) {
			free(rows);
			return -1;
		}
		for (int64_t r = 0; r < nrow; r++) {
			int64_t ce = rows[3 * r], full = rows[3 * r + 1], n = rows[3 * r + 2];
			int k = ce >= 0 && ce < nck ? ck_ent[ce] : -1;
			if (k < 0 || full < 0 || n < 0 || full + n > c->ent[k].numel) {
				free(rows);
				return RT_FAIL(e, "checkpoint %s: %s has a bad segment %lld", dir, sf->path,
					       (long long)r);
			}
			pc.full = full;
			pc.n = n;
			pc.flat = total;
			total += n;
			if (push_piece(src, &cap, k, pc, e)) {
				free(rows);
				return -1;
			}
		}
		free(rows);
		for (int cc = 0; cc < c->ncomp; cc++)
			if ((sf->t[pc.tensor[cc]].end - sf->t[pc.tensor[cc]].begin) / 4 != total)
				return RT_FAIL(e, "checkpoint %s: the values in %s do not match its segments",
					       dir, sf->path);
	}
	return source_index(src, c->nent, e);
}

/* Fill elements [full, full + n) of entry k, component cc, into dst. */
static int read_range(const Ckpt *c, const Source *src, int k, int cc, int64_t full, int64_t n,
		      float *dst, const char *dir, RtErr *e)
{
	int64_t at = full, end = full + n, lo = src->first[k], hi = src->first[k + 1];
	while (lo < hi) { /* the first piece that ends after `at` */
		int64_t mid = (lo + hi) / 2;
		if (src->p[mid].full + src->p[mid].n <= at)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (int64_t i = lo; at < end && i < src->first[k + 1]; i++) {
		const Piece *p = &src->p[i];
		if (p->full + p->n <= at || p->full > at)
			continue; /* sorted by full: a gap shows as no piece starting at or before at */
		int64_t hi = p->full + p->n < end ? p->full + p->n : end;
		RT_CHECK(st_pread(&src->file[p->file[cc]], p->tensor[cc], (p->flat + (at - p->full)) * 4,
				  dst + (at - full), (hi - at) * 4, e));
		at = hi;
	}
	if (at < end)
		return RT_FAIL(e, "checkpoint %s lacks elements [%lld, %lld) of '%s'", dir,
			       (long long)at, (long long)end, ckpt_ent_name(c, k));
	return 0;
}

/* Loaded values of component cc must be finite (and a second moment not
 * negative): a NaN or infinity in a master or optimizer state would train
 * on silently, or surface steps later as a NaN loss blamed on the step. */
static int check_values(const Ckpt *c, int k, int cc, int64_t full, const float *v, int64_t n,
			const char *dir, RtErr *e)
{
	int nonneg = cc > 0 && !strcmp(c->comp[cc], "exp_avg_sq");
	for (int64_t i = 0; i < n; i++)
		if (!isfinite(v[i]) || (nonneg && v[i] < 0)) {
			char name[600];
			ckpt_comp_name(c, cc, k, name, sizeof name);
			return RT_FAIL(e, "checkpoint %s holds %s at element %lld of '%s': refusing to resume "
				       "from it", dir, isnan(v[i]) ? "NaN" : isinf(v[i]) ? "an infinity"
				       : "a negative second moment", (long long)(full + i), name);
		}
	return 0;
}

int ckpt_load(Ckpt *c, const char *dir, CkptRun *run, char **notes, RtErr *e)
{
	char err[1024];
	*notes = NULL;
	cJSON *js = ckpt_state_parse(dir, err, sizeof err);
	if (!js)
		return RT_FAIL(e, "%s", err);
	CkptState st;
	int32_t *ck_ent = NULL;
	int nck = 0, rc = ckpt_state_check(c, dir, js, &st, e);
	if (rc == 0)
		rc = check_model(c, dir, js, &ck_ent, &nck, notes, e);
	if (rc == 0 && st.version < 2)
		ckpt_note(notes, "note: %s was written by an older dpexec: it has no checksums to verify\n",
		     dir);
	Source src = {0};
	if (rc == 0)
		rc = open_source(c, dir, &st, ck_ent, nck, &src, e);
	for (int cc = 0; rc == 0 && cc < c->ncomp; cc++) {
		/* root by root: read it (what no piece covers keeps its value), fill, write */
		const Seg *sg = c->fill[cc];
		int n = c->nfill[cc];
		Hosts h;
		if ((rc = ckpt_hosts_read(c, sg, n, &h, e)))
			break;
		for (int j = 0; rc == 0 && j < n; j++) {
			float *to = ckpt_host_of(&h, sg[j].root) + sg[j].at;
			rc = read_range(c, &src, sg[j].ent, cc, sg[j].full, sg[j].n, to, dir, e);
			if (rc == 0)
				rc = check_values(c, sg[j].ent, cc, sg[j].full, to, sg[j].n, dir, e);
		}
		for (int r = 0; rc == 0 && r < h.n; r++)
			rc = exec_tensor_write(c->x, h.id[r], h.data[r], e);
		ckpt_hosts_free(&h);
	}
	/* the compute copies of what was loaded (ckpt_layout.c): the casts'
	 * inputs outside the roots first */
	if (rc == 0 && c->ncast_in) {
		Hosts h;
		rc = ckpt_hosts_read(c, c->cast_in, c->ncast_in, &h, e);
		for (int j = 0; rc == 0 && j < c->ncast_in; j++) {
			const Seg *sg = &c->cast_in[j];
			float *to = ckpt_host_of(&h, sg->root) + sg->at;
			if (sg->ent < 0) /* padding: the init program's zeros */
				memset(to, 0, (size_t)sg->n * sizeof *to);
			else if ((rc = read_range(c, &src, sg->ent, 0, sg->full, sg->n, to, dir, e)) == 0)
				rc = check_values(c, sg->ent, 0, sg->full, to, sg->n, dir, e);
		}
		for (int r = 0; rc == 0 && r < h.n; r++)
			rc = exec_tensor_write(c->x, h.id[r], h.data[r], e);
		ckpt_hosts_free(&h);
	}
	for (int i = 0; rc == 0 && i < c->nrecast; i++)
		rc = exec_run_kernel(c->x, DP_PROG_INIT, c->recast[i], e);
	if (rc == 0)
		rc = ckpt_rank_load(c, dir, &st, notes, e);
	if (rc == 0) {
		run->step = st.step;
		run->loss = st.loss;
		run->train_samples = st.train_samples;
		run->amp = st.amp;
		run->have_amp = st.have_amp;
	}
	source_free(&src);
	free(ck_ent);
	ckpt_state_free(&st);
	cJSON_Delete(js);
	if (rc) {
		free(*notes);
		*notes = NULL;
	}
	return rc;
}
