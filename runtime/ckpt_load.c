/*
 * ckpt_load.c - reading a checkpoint back (ckpt.h): which directory
 * --resume names, whether it is of this model and run (refused naming what
 * differs), and every rank reading exactly the pieces of the whole tensors
 * its own tensors hold, from whichever files they are in (pread), so a
 * checkpoint of any layout loads at any other.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ckpt_int.h"

/* The first line of a small file (malloc'd), NULL when it cannot be read. */
static char *read_line(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char buf[1024];
	char *line = fgets(buf, sizeof buf, f) ? strdup(buf) : NULL;
	fclose(f);
	if (line)
		line[strcspn(line, "\r\n")] = '\0';
	return line;
}

static int is_file(const char *path, int dir)
{
	struct stat st;
	return stat(path, &st) == 0 && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

int ckpt_resolve(const char *arg, char **dir, char **parent, RtErr *e)
{
	char p[4096];
	char *name = NULL, *base = NULL;
	*dir = *parent = NULL;
	snprintf(p, sizeof p, "%s/%s", arg, CKPT_LATEST);
	if (is_file(arg, 1) && is_file(p, 0)) { /* DIR: its latest */
		base = strdup(arg);
		name = read_line(p);
	} else if (!is_file(arg, 1) && is_file(arg, 0)) { /* DIR/latest */
		const char *slash = strrchr(arg, '/');
		if (strcmp(slash ? slash + 1 : arg, CKPT_LATEST) != 0)
			return RT_FAIL(e, "--resume %s: not a checkpoint directory or a '%s' file", arg,
				       CKPT_LATEST);
		base = out_dirname(arg);
		name = read_line(arg);
	} else if (is_file(arg, 1)) { /* a checkpoint itself, or an empty save directory */
		snprintf(p, sizeof p, "%s/%s", arg, CKPT_STATE);
		if (!is_file(p, 0))
			return RT_FAIL(e, "--resume %s: no checkpoint there (no '%s' file naming one, no %s)",
				       arg, CKPT_LATEST, CKPT_STATE);
		*dir = strdup(arg);
		*parent = out_dirname(arg);
		return *dir && *parent ? 0 : RT_FAIL(e, "out of memory");
	} else {
		return RT_FAIL(e, "--resume %s: %s", arg, strerror(errno ? errno : ENOENT));
	}
	if (!base || !name || !*name || strchr(name, '/') || !strcmp(name, "..")) {
		free(base);
		free(name);
		return RT_FAIL(e, "--resume %s: the '%s' file does not name a checkpoint", arg,
			       CKPT_LATEST);
	}
	snprintf(p, sizeof p, "%s/%s", base, name);
	free(name);
	*dir = strdup(p);
	*parent = base;
	snprintf(p, sizeof p, "%s/%s", *dir, CKPT_STATE);
	if (!is_file(p, 0)) {
		RT_FAIL(e, "--resume %s: the checkpoint %s that '%s' names is missing or incomplete",
			arg, *dir, CKPT_LATEST);
		free(*dir);
		free(*parent);
		*dir = *parent = NULL;
		return -1;
	}
	return 0;
}

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
static void addf(char **text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(char **text, const char *fmt, ...)
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
				addf(&diff, "\n  the checkpoint has a parameter '%s' [%s] that this model does not",
				     name, a);
			continue;
		}
		seen[k] = 1;
		int same = nd == c->ent[k].ndim;
		for (int q = 0; same && q < nd; q++)
			same = dims[q] == c->ent[k].dims[q];
		if (!same && ndiff++ < 4) {
			ckpt_dims_str(b, sizeof b, c->ent[k].ndim, c->ent[k].dims);
			addf(&diff, "\n  parameter '%s' is [%s] in the checkpoint, [%s] in this model",
			     name, a, b);
		}
		if (!same)
			(*ck_ent)[i] = -1;
	}
	for (int k = 0; k < c->nent; k++)
		if (!seen[k] && ndiff++ < 4) {
			char b[128];
			ckpt_dims_str(b, sizeof b, c->ent[k].ndim, c->ent[k].dims);
			addf(&diff, "\n  this model's parameter '%s' [%s] is not in the checkpoint",
			     ckpt_ent_name(c, k), b);
		}
	free(seen);
	const cJSON *opt = jget(js, "optimizer");
	const char *kind = jstr(opt, "kind");
	const char *mine = dp_kind_name(DP_SET_OPTIMIZER, (int)s->opt.kind);
	if (strcmp(kind, mine) && ndiff++ < 5)
		addf(&diff, "\n  its optimizer is %s, this model's %s", kind, mine);
	/* the run: the data order depends on the seed and the global batch */
	if ((uint64_t)jnum(js, "seed", -1) != s->cfg.seed && ndiff++ < 6)
		addf(&diff, "\n  its seed is %.0f, this step file's %llu", jnum(js, "seed", -1),
		     (unsigned long long)s->cfg.seed);
	if ((int64_t)jnum(js, "global_batch", -1) != ckpt_global_batch(s) && ndiff++ < 7)
		addf(&diff, "\n  its global batch is %.0f, this step file's %lld",
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
			addf(notes, "note: %s is %g in this step file, %g in the checkpoint\n", st->ir_key,
			     mine_v, v);
	}
	if (sched_differs)
		addf(notes, "note: the lr schedule differs from the checkpoint's\n");
	return 0;
}

/* Check the files state.json lists; open them; list their pieces. */
static int open_source(Ckpt *c, const char *dir, const cJSON *js, const int32_t *ck_ent, int nck,
		       Source *src, RtErr *e)
{
	const cJSON *files = jget(js, "files");
	int nf = cJSON_GetArraySize(files), full = !strcmp(jstr(js, "form"), "full");
	char p[4096];
	int64_t cap = 0;
	memset(src, 0, sizeof *src);
	if (!full && strcmp(jstr(js, "form"), "sharded"))
		return RT_FAIL(e, "%s/%s: unknown form '%s'", dir, CKPT_STATE, jstr(js, "form"));
	src->file = calloc((size_t)(nf ? nf : 1), sizeof *src->file);
	if (!src->file)
		return RT_FAIL(e, "out of memory");
	int i = 0;
	for (const cJSON *f = files ? files->child : NULL; f; f = f->next, i++) {
		const char *name = jstr(f, "name");
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, name);
		if (!*name || strchr(name, '/') || stat(p, &st) != 0)
			return RT_FAIL(e, "checkpoint %s is damaged: %s is missing", dir, p);
		if ((double)st.st_size != jnum(f, "bytes", -1))
			return RT_FAIL(e, "checkpoint %s is damaged: %s has %lld bytes, %s says %.0f",
				       dir, name, (long long)st.st_size, CKPT_STATE, jnum(f, "bytes", -1));
		RT_CHECK(st_open(&src->file[i], p, e));
		src->nfile = i + 1;
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

int ckpt_load(Ckpt *c, const char *dir, CkptRun *run, char **notes, RtErr *e)
{
	char p[4096];
	*notes = NULL;
	snprintf(p, sizeof p, "%s/%s", dir, CKPT_STATE);
	FILE *f = fopen(p, "rb");
	if (!f)
		return RT_FAIL(e, "cannot read %s: %s", p, strerror(errno));
	char *text = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len + 4096 > cap) {
			cap = cap ? 2 * cap : 65536;
			char *t = cap <= (64u << 20) ? realloc(text, cap) : NULL;
			if (!t) {
				free(text);
				fclose(f);
				return RT_FAIL(e, "%s is too large", p);
			}
			text = t;
		}
		size_t got = fread(text + len, 1, cap - len - 1, f);
		len += got;
		if (got == 0)
			break;
	}
	fclose(f);
	text[len] = '\0';
	cJSON *js = cJSON_Parse(text);
	free(text);
	if (!js || strcmp(jstr(js, "format"), CKPT_FORMAT)) {
		cJSON_Delete(js);
		return RT_FAIL(e, "%s is not a dp checkpoint's state", p);
	}
	if (jnum(js, "version", 0) != CKPT_VERSION) {
		RT_FAIL(e, "%s has checkpoint version %.0f; this dpexec reads version %d", p,
			jnum(js, "version", 0), CKPT_VERSION);
		cJSON_Delete(js);
		return -1;
	}
	int32_t *ck_ent = NULL;
	int nck = 0, rc = check_model(c, dir, js, &ck_ent, &nck, notes, e);
	Source src = {0};
	if (rc == 0)
		rc = open_source(c, dir, js, ck_ent, nck, &src, e);
	for (int cc = 0; rc == 0 && cc < c->ncomp; cc++) {
		/* root by root: read it (what no piece covers keeps its value), fill, write */
		const Seg *sg = c->fill[cc];
		int n = c->nfill[cc];
		Hosts h;
		if ((rc = ckpt_hosts_read(c, sg, n, &h, e)))
			break;
		for (int j = 0; rc == 0 && j < n; j++)
			rc = read_range(c, &src, sg[j].ent, cc, sg[j].full, sg[j].n,
					ckpt_host_of(&h, sg[j].root) + sg[j].at, dir, e);
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
			else
				rc = read_range(c, &src, sg->ent, 0, sg->full, sg->n, to, dir, e);
		}
		for (int r = 0; rc == 0 && r < h.n; r++)
			rc = exec_tensor_write(c->x, h.id[r], h.data[r], e);
		ckpt_hosts_free(&h);
	}
	for (int i = 0; rc == 0 && i < c->nrecast; i++)
		rc = exec_run_kernel(c->x, DP_PROG_INIT, c->recast[i], e);
	if (rc == 0) {
		run->step = (uint64_t)jnum(js, "step", 0);
		run->loss = jnum(js, "loss", 0);
		run->train_samples = (int64_t)jnum(js, "train_samples", 0);
	}
	source_free(&src);
	free(ck_ent);
	cJSON_Delete(js);
	if (rc) {
		free(*notes);
		*notes = NULL;
	}
	return rc;
}
