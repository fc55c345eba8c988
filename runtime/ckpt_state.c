/*
 * ckpt_state.c - a checkpoint's state.json read back (ckpt.c writes it,
 * ckpt_load.c loads what it describes): every field is checked for its
 * type and range, and the fields that follow from each other are checked
 * against each other, so that a damaged or hand-edited state.json is
 * refused naming the field instead of resuming at another step (the lr
 * schedule, Adam's bias correction and the data order all follow from
 * it), batch order or learning rate.
 *
 * Cross-checks (all of them hold for every state.json dpexec writes):
 *   samples_seen = step * global_batch; epoch and epoch_sample are the
 *   sampler's position at step (from train_samples and global_batch);
 *   model.hash is the hash of model.tensors; the mesh multiplies
 *   to written_by.world_size; the files are the form's (model and
 *   optimizer, or one shard per rank of world_size, named for it), each
 *   with one CRC-32C per block of its size (version 2). What this model
 *   and run must match (its tensors, optimizer, seed, global batch) is
 *   ckpt_load.c's check.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ckpt_int.h"

#define STATE_MAX_INT 9007199254740992.0 /* 2^53: JSON numbers are doubles */

/* What a check reports against: the state.json file, for messages. */
typedef struct {
	const char *dir;
	RtErr *e;
} Ctx;

static int bad(const Ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const Ctx *x, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return RT_FAIL(x->e, "cannot resume: %s/%s %s", x->dir, CKPT_STATE, msg);
}

static const cJSON *get(const cJSON *o, const char *k)
{
	return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

/* "a string", "missing", "1e+300": what a value is, for messages. */
static void shown(const cJSON *v, char *buf, size_t len)
{
	if (!v)
		snprintf(buf, len, "missing");
	else if (cJSON_IsNumber(v))
		snprintf(buf, len, "%.15g", v->valuedouble);
	else if (cJSON_IsString(v))
		snprintf(buf, len, "the string \"%.40s\"", v->valuestring);
	else
		snprintf(buf, len, "not a number");
}

/* A whole number in [lo, 2^53] at key k of o (path names it). */
static int whole(const Ctx *x, const cJSON *o, const char *k, const char *path, double lo,
		 double *out)
{
	const cJSON *v = get(o, k);
	double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
	if (!(d >= lo && d <= STATE_MAX_INT) || d != floor(d)) {
		char s[96];
		shown(v, s, sizeof s);
		return bad(x, "has \"%s\": %s, not a whole number in [%.0f, 2^53]", path, s, lo);
	}
	*out = d;
	return 0;
}

/* A finite number at key k of o. */
static int number(const Ctx *x, const cJSON *o, const char *k, const char *path, double *out)
{
	const cJSON *v = get(o, k);
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
		char s[96];
		shown(v, s, sizeof s);
		return bad(x, "has \"%s\": %s, not a finite number", path, s);
	}
	*out = v->valuedouble;
	return 0;
}

static const char *string(const Ctx *x, const cJSON *o, const char *k, const char *path)
{
	const cJSON *v = get(o, k);
	if (!cJSON_IsString(v)) {
		bad(x, "has no string \"%s\"", path);
		return NULL;
	}
	return v->valuestring;
}

/* model: its tensors' names and shapes, and their hash (with opt_kind,
 * the optimizer's DpOptKind; -1: another optimizer than this model's,
 * which ckpt_load.c reports: the hash is not checked). */
static int check_model(const Ctx *x, const cJSON *js, int opt_kind)
{
	const cJSON *m = get(js, "model"), *ts = get(m, "tensors");
	if (!cJSON_IsArray(ts) || cJSON_GetArraySize(ts) == 0)
		return bad(x, "has no list \"model.tensors\"");
	uint32_t h = 0;
	int i = 0;
	for (const cJSON *t = ts->child; t; t = t->next, i++) {
		char path[64];
		snprintf(path, sizeof path, "model.tensors[%d].name", i);
		const char *name = string(x, t, "name", path);
		const cJSON *shape = get(t, "shape");
		if (!name)
			return -1;
		if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > DP_MAX_DIMS)
			return bad(x, "has \"model.tensors[%d].shape\" that is not a list of up to %d "
				   "dimensions", i, DP_MAX_DIMS);
		int64_t dims[DP_MAX_DIMS];
		int nd = 0;
		for (const cJSON *d = shape->child; d; d = d->next, nd++) {
			if (!cJSON_IsNumber(d) || !(d->valuedouble >= 0 && d->valuedouble <= STATE_MAX_INT) ||
			    d->valuedouble != floor(d->valuedouble)) {
				char s[96];
				shown(d, s, sizeof s);
				return bad(x, "has \"model.tensors[%d].shape[%d]\": %s, not a whole number",
					   i, nd, s);
			}
			dims[nd] = (int64_t)d->valuedouble;
		}
		h = ckpt_hash_tensor(h, name, nd, dims);
	}
	const char *hash = string(x, m, "hash", "model.hash");
	if (!hash)
		return -1;
	char want[16];
	snprintf(want, sizeof want, "%08x", ckpt_hash_end(h, (unsigned)(opt_kind >= 0 ? opt_kind : 0)));
	if (opt_kind >= 0 && strcmp(hash, want))
		return bad(x, "has \"model.hash\" %.16s, but its model.tensors hash to %s", hash, want);
	return 0;
}

/* files: the form's, each of a plausible size and with its checksums. */
static int check_files(const Ctx *x, const cJSON *js, CkptState *st, int nfull)
{
	const cJSON *fl = get(js, "files");
	int n = cJSON_IsArray(fl) ? cJSON_GetArraySize(fl) : -1;
	int nform = st->sharded ? st->world_size : nfull, want = nform + st->rank_files;
	if (n != want)
		return bad(x, "lists %d files; a %s checkpoint %s%s has %d", n < 0 ? 0 : n,
			   st->sharded ? "sharded" : "full",
			   st->sharded ? "of written_by.world_size ranks" : "of this optimizer",
			   st->rank_files ? " with rank_state" : "", want);
	st->files = calloc((size_t)n, sizeof *st->files);
	if (!st->files)
		return RT_FAIL(x->e, "out of memory");
	st->nfiles = n;
	int i = 0;
	for (const cJSON *f = fl->child; f; f = f->next, i++) {
		CkptFile *cf = &st->files[i];
		char path[64], expect[64];
		snprintf(path, sizeof path, "files[%d].name", i);
		const char *name = string(x, f, "name", path);
		if (!name)
			return -1;
		if (i >= nform) /* the rank-local state's (ckpt_rank.c) */
			snprintf(expect, sizeof expect, "rank-%05d-of-%05d.safetensors", i - nform,
				 st->world_size);
		else if (st->sharded)
			snprintf(expect, sizeof expect, "shard-%05d-of-%05d.safetensors", i, st->world_size);
		else
			snprintf(expect, sizeof expect, "%s", i ? "optimizer.safetensors" : "model.safetensors");
		if (strcmp(name, expect))
			return bad(x, "has \"%s\": \"%.64s\"; file %d of this checkpoint is %s", path, name,
				   i, expect);
		snprintf(cf->name, sizeof cf->name, "%s", name);
		double bytes;
		snprintf(path, sizeof path, "files[%d].bytes", i);
		RT_CHECK(whole(x, f, "bytes", path, 16, &bytes));
		cf->bytes = (int64_t)bytes;
		if (st->version < 2)
			continue;
		snprintf(path, sizeof path, "files[%d].crc32c", i);
		const char *hex = string(x, f, "crc32c", path);
		if (!hex)
			return -1;
		int64_t nb = (cf->bytes + ST_SUM_BLOCK - 1) / ST_SUM_BLOCK;
		if ((int64_t)strlen(hex) != 8 * nb)
			return bad(x, "has \"%s\" of %zu hex digits; %lld bytes take %lld blocks of 8", path,
				   strlen(hex), (long long)cf->bytes, (long long)nb);
		cf->crc = malloc((size_t)(nb ? nb : 1) * sizeof *cf->crc);
		if (!cf->crc)
			return RT_FAIL(x->e, "out of memory");
		cf->ncrc = nb;
		for (int64_t k = 0; k < nb; k++) {
			uint32_t v = 0;
			for (int j = 0; j < 8; j++) {
				char ch = hex[8 * k + j];
				int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
				if (d < 0)
					return bad(x, "has \"%s\" with '%c', not a lowercase hex digit", path, ch);
				v = v << 4 | (uint32_t)d;
			}
			cf->crc[k] = v;
		}
	}
	return 0;
}

/* A spec setting's record (optimizer, schedule): its kind a string, every
 * other field but the optimizer's state list a finite number. The kind
 * string, or NULL after an error. */
static const char *check_spec(const Ctx *x, const cJSON *js, const char *key)
{
	const cJSON *o = get(js, key);
	char path[96];
	snprintf(path, sizeof path, "%s.kind", key);
	const char *kind = string(x, o, "kind", path);
	for (const cJSON *f = kind ? o->child : NULL; f; f = f->next) {
		if (!f->string || !strcmp(f->string, "kind") || !strcmp(f->string, "state"))
			continue;
		double v;
		snprintf(path, sizeof path, "%s.%.64s", key, f->string);
		if (number(x, o, f->string, path, &v))
			return NULL;
	}
	return kind;
}

int ckpt_state_check(const Ckpt *c, const char *dir, const cJSON *js, CkptState *st, RtErr *e)
{
	Ctx x = {dir, e};
	double v, gb, ts, epoch, epoch_sample, seen, ws;
	memset(st, 0, sizeof *st);
	RT_CHECK(whole(&x, js, "version", "version", 1, &v));
	if (v > CKPT_VERSION_RANK)
		return RT_FAIL(e, "%s/%s has checkpoint version %.0f; this dpexec reads versions up to %d",
			       dir, CKPT_STATE, v, CKPT_VERSION_RANK);
	st->version = (int)v;
	const char *form = string(&x, js, "form", "form");
	if (!form)
		return -1;
	if (strcmp(form, "full") && strcmp(form, "sharded"))
		return bad(&x, "has \"form\" \"%.32s\", not full or sharded", form);
	st->sharded = !strcmp(form, "sharded");
	if (st->version >= 2) {
		const cJSON *sum = get(js, "checksum");
		const char *alg = string(&x, sum, "algorithm", "checksum.algorithm");
		if (!alg)
			return -1;
		if (strcmp(alg, CKPT_SUM_ALGORITHM))
			return bad(&x, "has \"checksum.algorithm\" \"%.32s\"; this dpexec verifies %s", alg,
				   CKPT_SUM_ALGORITHM);
		RT_CHECK(whole(&x, sum, "block_bytes", "checksum.block_bytes", 1, &v));
		if (v != ST_SUM_BLOCK)
			return bad(&x, "has \"checksum.block_bytes\" %.0f; this dpexec's blocks are %d", v,
				   ST_SUM_BLOCK);
	}

	/* the position of the run */
	RT_CHECK(whole(&x, js, "step", "step", 0, &v));
	st->step = (uint64_t)v;
	RT_CHECK(number(&x, js, "loss", "loss", &st->loss));
	RT_CHECK(whole(&x, js, "seed", "seed", 0, &v));
	RT_CHECK(whole(&x, js, "global_batch", "global_batch", 1, &gb));
	RT_CHECK(whole(&x, js, "train_samples", "train_samples", 0, &ts));
	st->train_samples = (int64_t)ts;
	const cJSON *ls = get(js, "loss_scale");
	if (ls) { /* a run with loss scaling: its scale (f32, > 0) and counters */
		double clean, skipped;
		RT_CHECK(number(&x, ls, "scale", "loss_scale.scale", &v));
		if (!(v > 0) || (double)(float)v != v)
			return bad(&x, "has \"loss_scale.scale\" %g, not a positive f32", v);
		RT_CHECK(whole(&x, ls, "clean_steps", "loss_scale.clean_steps", 0, &clean));
		RT_CHECK(whole(&x, ls, "skipped_steps", "loss_scale.skipped_steps", 0, &skipped));
		if (skipped > (double)st->step || clean > (double)UINT32_MAX)
			return bad(&x, "has \"loss_scale\" counters that step %llu cannot have",
				   (unsigned long long)st->step);
		st->amp = (ExecAmp){(float)v, (uint32_t)clean, (uint64_t)skipped};
		st->have_amp = 1;
	}
	RT_CHECK(whole(&x, js, "epoch", "epoch", 0, &epoch));
	RT_CHECK(whole(&x, js, "epoch_sample", "epoch_sample", 0, &epoch_sample));
	RT_CHECK(whole(&x, js, "samples_seen", "samples_seen", 0, &seen));
	if (seen != (double)st->step * gb)
		return bad(&x, "has \"samples_seen\" %.0f, but step %llu of global batch %.0f is %.0f",
			   seen, (unsigned long long)st->step, gb, (double)st->step * gb);
	uint64_t per_epoch = ts >= gb ? (uint64_t)(ts / gb) : 0;
	double e_want = per_epoch ? (double)(st->step / per_epoch) : 0;
	double s_want = per_epoch ? (double)((st->step % per_epoch) * (uint64_t)gb) : 0;
	if (epoch != e_want || epoch_sample != s_want)
		return bad(&x, "has \"epoch\" %.0f, \"epoch_sample\" %.0f; step %llu of %.0f samples in "
			   "batches of %.0f is epoch %.0f, sample %.0f", epoch, epoch_sample,
			   (unsigned long long)st->step, ts, gb, e_want, s_want);

	/* the optimizer and its state's names; the schedule; the next lr */
	const cJSON *opt = get(js, "optimizer");
	const char *okind = check_spec(&x, js, "optimizer");
	if (!okind || !check_spec(&x, js, "schedule"))
		return -1;
	RT_CHECK(number(&x, js, "lr_next", "lr_next", &v));
	int mine = !strcmp(okind, ckpt_opt_name(c->s)); /* another: ckpt_load.c says so */
	const cJSON *names = get(opt, "state");
	if (!cJSON_IsArray(names))
		return bad(&x, "has no list \"optimizer.state\"");
	if (mine) {
		int n = cJSON_GetArraySize(names), i = 1;
		int same = n == c->ncomp - 1;
		for (const cJSON *q = names->child; same && q; q = q->next, i++)
			same = cJSON_IsString(q) && !strcmp(q->valuestring, c->comp[i]);
		if (!same)
			return bad(&x, "has \"optimizer.state\" that is not %s's state", okind);
	}
	RT_CHECK(check_model(&x, js, mine ? (int)c->s->opt.kind : -1));

	/* who wrote it, and its files */
	const cJSON *wb = get(js, "written_by"), *mesh = get(wb, "mesh");
	RT_CHECK(whole(&x, wb, "world_size", "written_by.world_size", 1, &ws));
	if (ws > 1 << 24)
		return bad(&x, "has \"written_by.world_size\" %.0f", ws);
	st->world_size = (int)ws;
	/* version 3: version 2 with each rank's own state in files of its own */
	const cJSON *rs = get(js, "rank_state");
	if ((st->version == CKPT_VERSION_RANK) != (rs != NULL))
		return bad(&x, "%s", rs ? "has \"rank_state\" but is not version 3"
					: "is version 3 but has no \"rank_state\"");
	if (rs && !string(&x, rs, "kind", "rank_state.kind"))
		return -1;
	st->rank_files = rs ? st->world_size : 0;
	double prod = 1;
	int na = 0;
	for (const cJSON *a = cJSON_IsArray(mesh) ? mesh->child : NULL; a; a = a->next, na++)
		prod *= cJSON_IsNumber(a) && a->valuedouble >= 1 && a->valuedouble == floor(a->valuedouble)
				? a->valuedouble : NAN;
	/* DP_MAX_AXES - 1: written before the pp axis (step file version 8), whose
	 * mesh had no pp; a checkpoint loads at any mesh, so nothing else differs */
	if ((na != DP_MAX_AXES && na != DP_MAX_AXES - 1) || prod != ws)
		return bad(&x, "has \"written_by.mesh\" that is not %d axes (%d before the pp axis) "
			   "multiplying to its world size %d", DP_MAX_AXES, DP_MAX_AXES - 1,
			   st->world_size);
	return check_files(&x, js, st, cJSON_GetArraySize(names) > 0 ? 2 : 1);
}

void ckpt_state_free(CkptState *st)
{
	for (int i = 0; st->files && i < st->nfiles; i++)
		free(st->files[i].crc);
	free(st->files);
	memset(st, 0, sizeof *st);
}
