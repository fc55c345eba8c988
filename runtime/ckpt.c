/*
 * ckpt.c - writing training-state checkpoints (full or sharded,
 * atomically), their state.json and the save directory (latest, the newest kept,
 * leftovers of killed saves). What a checkpoint holds and why it is laid out
 * so: ckpt.h and docs/CHECKPOINTS.md; the layout it writes from:
 * ckpt_layout.c; reading: ckpt_load.c.
 *
 * Full form: per component, per tensor, rank 0 gathers the owners' pieces
 * (world_gatherv_f32) into the whole tensor and appends it to its file; one
 * tensor is in memory at a time. Sharded form: every rank writes its owned
 * pieces and their table. Tensor data is read only through exec_tensor_read,
 * so any backend works.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zlib.h>

#include "ckpt_int.h"

/* ---- saving ---- */

/* Full form: component cc, whole tensor by whole tensor, gathered on rank
 * 0 and appended to wr there (wr NULL: rank 0 only takes part). */
static int gather_component(Ckpt *c, int cc, StWriter *wr, RtErr *e)
{
	World *w = c->w;
	int W = w->size, me = w->rank, rc = 0;
	const Range *mine = c->owned + c->owned_off[me];
	int64_t nmine = c->owned_off[me + 1] - c->owned_off[me];
	int *counts = calloc((size_t)W, sizeof *counts), *displs = calloc((size_t)W, sizeof *displs);
	Hosts h;
	if (!counts || !displs) {
		free(counts);
		free(displs);
		return RT_FAIL(e, "out of memory");
	}
	if (ckpt_hosts_read(c, c->save[cc], c->nsave, &h, e)) {
		free(counts);
		free(displs);
		return -1;
	}
	for (int k = 0; rc == 0 && k < c->nent; k++) {
		int64_t numel = c->ent[k].numel, have = c->ent_count[(size_t)k * W + me];
		if (numel > INT_MAX) {
			rc = RT_FAIL(e, "checkpoints: '%s' has more than 2^31 elements", ckpt_ent_name(c, k));
			break;
		}
		float *send = malloc((size_t)(have ? have : 1) * 4), *recv = NULL, *whole = NULL;
		if (me == 0) {
			recv = malloc((size_t)(numel ? numel : 1) * 4);
			whole = malloc((size_t)(numel ? numel : 1) * 4);
		}
		if (!send || (me == 0 && (!recv || !whole))) {
			rc = RT_FAIL(e, "out of memory gathering '%s'", ckpt_ent_name(c, k));
		} else {
			int64_t at = 0;
			for (int64_t i = 0; i < nmine; i++) {
				if (mine[i].ent != k)
					continue;
				const Seg *sg = &c->save[cc][c->owned_src[i]];
				memcpy(send + at, ckpt_host_of(&h, sg->root) + sg->at + (mine[i].full - sg->full),
				       (size_t)mine[i].n * 4);
				at += mine[i].n;
			}
			int64_t d = 0;
			for (int r = 0; r < W; r++) {
				counts[r] = (int)c->ent_count[(size_t)k * W + r];
				displs[r] = (int)d;
				d += counts[r];
			}
			rc = world_gatherv_f32(w, send, (int)have, recv, counts, displs, e);
			if (rc == 0 && me == 0) {
				for (int r = 0; r < W; r++) {
					int64_t pos = displs[r];
					for (int64_t i = c->owned_off[r]; i < c->owned_off[r + 1]; i++) {
						if (c->owned[i].ent != k)
							continue;
						memcpy(whole + c->owned[i].full, recv + pos, (size_t)c->owned[i].n * 4);
						pos += c->owned[i].n;
					}
				}
				if (wr)
					rc = st_put(wr, whole, numel * 4, e);
			}
		}
		free(send);
		free(recv);
		free(whole);
	}
	ckpt_hosts_free(&h);
	free(counts);
	free(displs);
	return rc;
}

/* Rank 0's files of the full form: model.safetensors, optimizer.safetensors. */
static int save_full(Ckpt *c, const char *tmpdir, int64_t *bytes, RtErr *e)
{
	int me = c->w->rank, rc = 0;
	size_t plen = strlen(tmpdir) + 32;
	for (int file = 0; file < (c->ncomp > 1 ? 2 : 1); file++) {
		int c0 = file == 0 ? 0 : 1, c1 = file == 0 ? 1 : c->ncomp;
		StWriter wr;
		int open = 0;
		if (me == 0 && rc == 0) {
			int nd = (c1 - c0) * c->nent;
			StDecl *d = calloc((size_t)(nd ? nd : 1), sizeof *d);
			char *names = malloc((size_t)(nd ? nd : 1) * 512), *path = malloc(plen);
			if (!d || !names || !path) {
				rc = RT_FAIL(e, "out of memory");
			} else {
				for (int cc = c0; cc < c1; cc++)
					for (int k = 0; k < c->nent; k++) {
						int i = (cc - c0) * c->nent + k;
						ckpt_comp_name(c, cc, k, names + (size_t)i * 512, 512);
						d[i] = (StDecl){.name = names + (size_t)i * 512, .dtype = ST_F32,
								.ndim = c->ent[k].ndim};
						memcpy(d[i].dims, c->ent[k].dims, sizeof d[i].dims);
					}
				snprintf(path, plen, "%s/%s", tmpdir,
					 file == 0 ? "model.safetensors" : "optimizer.safetensors");
				rc = st_begin(&wr, path, d, nd, e);
				open = rc == 0;
			}
			free(d);
			free(names);
			free(path);
		}
		/* every rank takes part in the gathers, whatever rank 0's file does */
		for (int cc = c0; cc < c1; cc++) {
			RtErr ge = {.rank = e->rank};
			if (gather_component(c, cc, open ? &wr : NULL, &ge)) {
				if (rc == 0)
					*e = ge;
				rc = -1;
				break;
			}
		}
		if (open) {
			if (rc == 0)
				rc = st_end(&wr, e);
			else
				st_cancel(&wr);
			if (rc == 0)
				*bytes += wr.bytes;
		}
	}
	return rc;
}

/* This rank's file of the sharded form: the pieces it owns, a table of
 * them ("segments": whole tensor index in state.json's list, first
 * element, count) and their values per component. */
static int save_shard(Ckpt *c, const char *tmpdir, int64_t *bytes, RtErr *e)
{
	World *w = c->w;
	const Range *mine = c->owned + c->owned_off[w->rank];
	int64_t n = c->owned_off[w->rank + 1] - c->owned_off[w->rank], total = 0;
	for (int64_t i = 0; i < n; i++)
		total += mine[i].n;
	StDecl d[1 + CKPT_MAX_COMP] = {{.name = "segments", .dtype = ST_I64, .ndim = 2,
					 .dims = {n, 3}}};
	for (int cc = 0; cc < c->ncomp; cc++)
		d[1 + cc] = (StDecl){.name = cc ? c->comp[cc] : "param", .dtype = ST_F32, .ndim = 1,
				     .dims = {total}};
	char path[4200];
	snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", tmpdir, w->rank, w->size);
	StWriter wr;
	RT_CHECK(st_begin(&wr, path, d, 1 + c->ncomp, e));
	int rc = 0;
	for (int64_t i = 0; rc == 0 && i < n; i++) {
		int64_t row[3] = {mine[i].ent, mine[i].full, mine[i].n};
		rc = st_put(&wr, row, sizeof row, e);
	}
	for (int cc = 0; rc == 0 && cc < c->ncomp; cc++) {
		Hosts h;
		if ((rc = ckpt_hosts_read(c, c->save[cc], c->nsave, &h, e)))
			break;
		for (int64_t i = 0; rc == 0 && i < n; i++) {
			const Seg *sg = &c->save[cc][c->owned_src[i]];
			rc = st_put(&wr, ckpt_host_of(&h, sg->root) + sg->at + (mine[i].full - sg->full),
				    mine[i].n * 4, e);
		}
		ckpt_hosts_free(&h);
	}
	if (rc) {
		st_cancel(&wr);
		return -1;
	}
	RT_CHECK(st_end(&wr, e));
	*bytes += wr.bytes;
	return 0;
}

/* ---- state.json ---- */

/* crc32 of what makes the model: every whole tensor's name and shape and
 * the optimizer's kind (its state's meaning). */
static uint32_t model_hash(const Ckpt *c)
{
	uLong h = crc32(0L, Z_NULL, 0);
	char buf[512];
	for (int k = 0; k < c->nent; k++) {
		char dims[128];
		ckpt_dims_str(dims, sizeof dims, c->ent[k].ndim, c->ent[k].dims);
		int n = snprintf(buf, sizeof buf, "%s[%s];", ckpt_ent_name(c, k), dims);
		h = crc32(h, (const Bytef *)buf, (uInt)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
	}
	int n = snprintf(buf, sizeof buf, "optimizer:%u", c->s->opt.kind);
	return (uint32_t)crc32(h, (const Bytef *)buf, (uInt)n);
}

static cJSON *hex32(uint32_t v)
{
	char b[16];
	snprintf(b, sizeof b, "%08x", v);
	return cJSON_CreateString(b);
}

/* A spec setting (the optimizer, the schedule) as state.json records it:
 * its kind, and every field of its record by its IR key (format/settings.def:
 * the same keys as the IR), a NONZERO one only when set. */
static cJSON *add_spec(cJSON *o, const char *key, const DpStep *s, int spec)
{
	cJSON *t = cJSON_AddObjectToObject(o, key);
	const void *f = dp_setting_cfield(s, spec);
	cJSON_AddStringToObject(t, "kind", dp_kind_name(spec, (int)dp_field_get(f, DP_CT_U32)));
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (i == spec || st->rec != dp_settings[spec].rec || st->alias || !st->ir_key)
			continue;
		double v = dp_field_get(dp_setting_cfield(s, i), st->ctype);
		if (st->ir_mode != DP_IRM_NONZERO || v != 0)
			cJSON_AddNumberToObject(t, st->ir_key, v);
	}
	return t;
}

/* The JSON text of state.json (malloc'd), or NULL when out of memory. */
static char *state_json(const Ckpt *c, CkptForm form, const CkptRun *run, char **files,
			const int64_t *sizes, int nfiles)
{
	const DpStep *s = c->s;
	int64_t gb = ckpt_global_batch(s), per_epoch = gb > 0 && run->train_samples >= gb ?
							  run->train_samples / gb : 0;
	cJSON *o = cJSON_CreateObject(), *t;
	cJSON_AddStringToObject(o, "format", CKPT_FORMAT);
	cJSON_AddNumberToObject(o, "version", CKPT_VERSION);
	cJSON_AddStringToObject(o, "form", form == CKPT_FULL ? "full" : "sharded");
	cJSON_AddNumberToObject(o, "step", (double)run->step);
	cJSON_AddNumberToObject(o, "loss", run->loss);
	cJSON_AddNumberToObject(o, "lr_next", exec_lr(s, run->step));
	/* the sampler's position: a function of (seed, step), written for people */
	cJSON_AddNumberToObject(o, "seed", (double)s->cfg.seed);
	cJSON_AddNumberToObject(o, "global_batch", (double)gb);
	cJSON_AddNumberToObject(o, "train_samples", (double)run->train_samples);
	cJSON_AddNumberToObject(o, "epoch", per_epoch ? (double)(run->step / (uint64_t)per_epoch) : 0);
	cJSON_AddNumberToObject(o, "epoch_sample",
				per_epoch ? (double)((run->step % (uint64_t)per_epoch) * (uint64_t)gb) : 0);
	cJSON_AddNumberToObject(o, "samples_seen", (double)run->step * (double)gb);
	t = add_spec(o, "optimizer", s, DP_SET_OPTIMIZER);
	cJSON *st = cJSON_AddArrayToObject(t, "state");
	for (int cc = 1; cc < c->ncomp; cc++)
		cJSON_AddItemToArray(st, cJSON_CreateString(c->comp[cc]));
	add_spec(o, "schedule", s, DP_SET_SCHEDULE);
	t = cJSON_AddObjectToObject(o, "model");
	cJSON_AddItemToObject(t, "hash", hex32(model_hash(c)));
	cJSON *ts = cJSON_AddArrayToObject(t, "tensors");
	for (int k = 0; k < c->nent; k++) {
		cJSON *x = cJSON_CreateObject();
		cJSON_AddStringToObject(x, "name", ckpt_ent_name(c, k));
		cJSON *shape = cJSON_AddArrayToObject(x, "shape");
		for (int d = 0; d < c->ent[k].ndim; d++)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)c->ent[k].dims[d]));
		cJSON_AddItemToArray(ts, x);
	}
	t = cJSON_AddObjectToObject(o, "written_by");
	cJSON_AddStringToObject(t, "step_file", c->step_path);
	cJSON_AddItemToObject(t, "step_file_crc32", hex32(c->step_crc));
	cJSON_AddStringToObject(t, "source", dpstep_str(s, s->source));
	cJSON_AddNumberToObject(t, "world_size", c->w->size);
	cJSON *mesh = cJSON_AddArrayToObject(t, "mesh");
	for (int a = 0; a < DP_MAX_AXES; a++)
		cJSON_AddItemToArray(mesh, cJSON_CreateNumber(s->cfg.mesh[a]));
	cJSON_AddStringToObject(t, "strategy", dp_name(dp_strategy_names, DP_NSTRAT, s->cfg.strategy));
	cJSON *fl = cJSON_AddArrayToObject(o, "files");
	for (int i = 0; i < nfiles; i++) {
		cJSON *x = cJSON_CreateObject();
		cJSON_AddStringToObject(x, "name", files[i]);
		cJSON_AddNumberToObject(x, "bytes", (double)sizes[i]);
		cJSON_AddItemToArray(fl, x);
	}
	char *text = cJSON_Print(o);
	cJSON_Delete(o);
	return text;
}

/* ---- directories ---- */

/* Remove a checkpoint directory (flat: files only) or a file. */
static int remove_tree(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
	struct dirent *de;
	char p[4096];
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", path, de->d_name);
		if (unlink(p) != 0 && errno == EISDIR)
			remove_tree(p);
	}
	closedir(d);
	return rmdir(path);
}

/* step-NNNNNN: the number, or -1 for any other name. */
static long long step_of(const char *name)
{
	if (strncmp(name, "step-", 5) || !name[5])
		return -1;
	char *end;
	long long v = strtoll(name + 5, &end, 10);
	return *end || v < 0 ? -1 : v;
}

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return x < y ? -1 : x > y;
}

/* Remove complete checkpoints beyond the newest keep (never `keep_step`). */
static void prune(const char *dir, int keep, long long keep_step)
{
	DIR *d = opendir(dir);
	if (!d || keep <= 0) {
		if (d)
			closedir(d);
		return;
	}
	long long *v = NULL;
	int n = 0, cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		long long k = step_of(de->d_name);
		if (k < 0)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			long long *nv = realloc(v, (size_t)cap * sizeof *v);
			if (!nv)
				break;
			v = nv;
		}
		v[n++] = k;
	}
	closedir(d);
	qsort(v, (size_t)n, sizeof *v, cmp_ll);
	char p[4096];
	for (int i = 0; i < n - keep; i++) {
		if (v[i] == keep_step)
			continue;
		snprintf(p, sizeof p, "%s/step-%06lld", dir, v[i]);
		remove_tree(p);
	}
	free(v);
	out_sync_dir(dir);
}

int ckpt_prepare_dir(const Ckpt *c, const char *dir, RtErr *e)
{
	if (out_mkdirs(dir) != 0)
		return RT_FAIL(e, errno == ENOTDIR ? "the save directory %s is not a directory"
						   : "cannot create the save directory %s: %s",
			       dir, strerror(errno));
	if (access(dir, W_OK) != 0)
		return RT_FAIL(e, "cannot write in the save directory %s: %s", dir, strerror(errno));
	/* what killed saves left: step-N.dptmp directories, latest.dptmp */
	DIR *d = opendir(dir);
	if (!d)
		return RT_FAIL(e, "cannot read the save directory %s: %s", dir, strerror(errno));
	struct dirent *de;
	char p[4096];
	size_t sl = strlen(OUT_TMP_SUFFIX);
	while ((de = readdir(d))) {
		size_t n = strlen(de->d_name);
		if (n > sl && !strcmp(de->d_name + n - sl, OUT_TMP_SUFFIX)) {
			snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
			remove_tree(p);
		}
	}
	closedir(d);
	struct statvfs vfs;
	int64_t need = ckpt_bytes(c);
	if (statvfs(dir, &vfs) == 0 && (int64_t)(vfs.f_bavail * vfs.f_frsize) < need)
		return RT_FAIL(e, "the save directory %s has %.1f MiB free; a checkpoint of this model "
			       "needs about %.1f MiB", dir,
			       (double)vfs.f_bavail * vfs.f_frsize / (1 << 20), (double)need / (1 << 20));
	return 0;
}

/* Rank 0: state.json into tmpdir, then tmpdir -> final, latest -> name. */
static int publish(Ckpt *c, const char *dir, const char *name, const char *tmpdir,
		   const char *final, CkptForm form, const CkptRun *run, char **files,
		   const int64_t *sizes, int nfiles, int64_t *bytes, int keep, RtErr *e)
{
	char err[1024], p[4096];
	char *text = state_json(c, form, run, files, sizes, nfiles);
	if (!text)
		return RT_FAIL(e, "out of memory");
	snprintf(p, sizeof p, "%s/%s", tmpdir, CKPT_STATE);
	OutFile f;
	int rc = out_open(&f, p, err, sizeof err);
	if (rc == 0) {
		out_write(&f, text, strlen(text));
		out_write(&f, "\n", 1);
		rc = out_commit(&f, err, sizeof err);
	}
	if (rc == 0)
		*bytes += (int64_t)strlen(text) + 1;
	free(text);
	if (rc)
		return RT_FAIL(e, "%s", err);
	out_sync_dir(tmpdir);
	/* the same step saved again (a resumed run interrupted at once): replace it */
	struct stat st;
	char old[4096];
	int replaced = 0;
	if (stat(final, &st) == 0) {
		snprintf(old, sizeof old, "%s/%s.old%s", dir, name, OUT_TMP_SUFFIX);
		remove_tree(old);
		if (rename(final, old) != 0)
			return RT_FAIL(e, "cannot replace the checkpoint %s: %s", final, strerror(errno));
		replaced = 1;
	}
	if (rename(tmpdir, final) != 0)
		return RT_FAIL(e, "cannot complete the checkpoint %s: %s", final, strerror(errno));
	if (replaced)
		remove_tree(old);
	out_sync_dir(dir);
	snprintf(p, sizeof p, "%s/%s", dir, CKPT_LATEST);
	rc = out_open(&f, p, err, sizeof err);
	if (rc == 0) {
		out_write(&f, name, strlen(name));
		out_write(&f, "\n", 1);
		rc = out_commit(&f, err, sizeof err);
	}
	if (rc)
		return RT_FAIL(e, "%s (the checkpoint %s is complete)", err, final);
	prune(dir, keep, (long long)run->step);
	return 0;
}

int ckpt_save(Ckpt *c, const char *dir, CkptForm form, const CkptRun *run, int keep,
	      char **path, int64_t *bytes, RtErr *e)
{
	World *w = c->w;
	int rc = 0;
	char name[64], tmpdir[4096], final[4096];
	*bytes = 0;
	if (path)
		*path = NULL;
	if (!c->planned)
		rc = ckpt_plan(c, e);
	RT_CHECK(world_sync(w, rc, 0, e));
	snprintf(name, sizeof name, "step-%06llu", (unsigned long long)run->step);
	snprintf(tmpdir, sizeof tmpdir, "%s/%s%s", dir, name, OUT_TMP_SUFFIX);
	snprintf(final, sizeof final, "%s/%s", dir, name);
	if (w->rank == 0) {
		remove_tree(tmpdir);
		if (mkdir(tmpdir, 0777) != 0)
			rc = RT_FAIL(e, "cannot create %s: %s", tmpdir, strerror(errno));
	}
	RT_CHECK(world_sync(w, rc, 0, e));

	int64_t mine = 0;
	rc = form == CKPT_FULL ? save_full(c, tmpdir, &mine, e) : save_shard(c, tmpdir, &mine, e);
	/* every rank's file size, for state.json */
	char *all = NULL;
	int64_t *offs = NULL;
	if (rc == 0)
		rc = world_allgatherv(w, &mine, sizeof mine, &all, &offs, e);
	if (world_sync(w, rc, 0, e)) {
		free(all);
		free(offs);
		if (w->rank == 0)
			remove_tree(tmpdir);
		return -1;
	}
	const int64_t *size = (const int64_t *)all;
	if (w->rank == 0) {
		int nfiles = form == CKPT_FULL ? (c->ncomp > 1 ? 2 : 1) : w->size;
		char **files = calloc((size_t)nfiles, sizeof *files);
		int64_t *sizes = calloc((size_t)nfiles, sizeof *sizes);
		int64_t total = 0;
		for (int i = 0; files && sizes && i < nfiles; i++) {
			files[i] = malloc(64);
			if (!files[i])
				break;
			if (form == CKPT_FULL) {
				snprintf(files[i], 64, "%s", i ? "optimizer.safetensors" : "model.safetensors");
				sizes[i] = -1; /* filled below from the files themselves */
				char p[4096];
				struct stat st;
				snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
				sizes[i] = stat(p, &st) == 0 ? (int64_t)st.st_size : -1;
			} else {
				snprintf(files[i], 64, "shard-%05d-of-%05d.safetensors", i, w->size);
				sizes[i] = size[i];
			}
			total += sizes[i];
		}
		int ok = files && sizes;
		for (int i = 0; ok && i < nfiles; i++)
			ok = files[i] != NULL;
		rc = ok ? publish(c, dir, name, tmpdir, final, form, run, files, sizes, nfiles, &total,
				  keep, e)
			: RT_FAIL(e, "out of memory");
		if (rc)
			remove_tree(tmpdir);
		for (int i = 0; files && i < nfiles; i++)
			free(files[i]);
		free(files);
		free(sizes);
		*bytes = total;
		if (rc == 0 && path)
			*path = strdup(final);
	}
	free(all);
	free(offs);
	return world_sync(w, rc, 0, e);
}

