/*
 * ckpt.c - writing training-state checkpoints (full or sharded,
 * atomically) and their state.json; the save directory (publishing,
 * latest, the newest kept, leftovers of killed saves) is ckpt_dir.c's.
 * What a checkpoint holds and why it is laid out so: ckpt.h and
 * docs/CHECKPOINTS.md; the layout it writes from:
 * ckpt_layout.c; reading: ckpt_load.c.
 *
 * Full form: per component, per tensor, rank 0 gathers the owners' pieces
 * (world_gatherv_f32) into the whole tensor and appends it to its file; one
 * tensor is in memory at a time. Sharded form: every rank writes its owned
 * pieces and their table. Tensor data is read only through exec_tensor_read,
 * so any backend works. Every file's CRC-32C per 1 MiB block is computed
 * as it is written (safetensors.c) and goes into state.json, which
 * ckpt_dir.c writes last when it publishes the checkpoint.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
			int over = 0; /* a segment past the counts the buffers were sized by */
			for (int64_t i = 0; i < nmine; i++) {
				if (mine[i].ent != k)
					continue;
				if (mine[i].n > have - at) {
					over = 1;
					break;
				}
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
			if (d > numel) /* the counts are every rank's: all of them skip the gather */
				over = 1;
			else
				rc = world_gatherv_f32(w, send, (int)have, recv, counts, displs, e);
			if (rc == 0 && me == 0 && !over) {
				for (int r = 0; r < W; r++) {
					int64_t pos = displs[r];
					for (int64_t i = c->owned_off[r]; i < c->owned_off[r + 1] && !over; i++) {
						if (c->owned[i].ent != k)
							continue;
						if (c->owned[i].full < 0 || c->owned[i].n > numel - c->owned[i].full ||
						    c->owned[i].n > displs[r] + counts[r] - pos) {
							over = 1;
							break;
						}
						memcpy(whole + c->owned[i].full, recv + pos, (size_t)c->owned[i].n * 4);
						pos += c->owned[i].n;
					}
				}
				if (wr && !over)
					rc = st_put(wr, whole, numel * 4, e);
			}
			if (rc == 0 && over) /* checked before each copy: nothing was written out of bounds */
				rc = RT_FAIL(e, "internal error: the checkpoint layout of '%s' disagrees with "
					     "its counts", ckpt_ent_name(c, k));
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

/* The file wr wrote, for state.json: its name, size and checksums (moved
 * out of wr). */
static void take_file(CkptFile *f, const char *name, StWriter *wr)
{
	snprintf(f->name, sizeof f->name, "%s", name);
	f->bytes = wr->bytes;
	f->crc = wr->sums.crc;
	f->ncrc = wr->sums.n;
	memset(&wr->sums, 0, sizeof wr->sums);
}

/* Rank 0's files of the full form: model.safetensors, optimizer.safetensors
 * (into files[0..1] on rank 0). */
static int save_full(Ckpt *c, const char *tmpdir, CkptFile *files, RtErr *e)
{
	int me = c->w->rank, rc = 0;
	size_t plen = strlen(tmpdir) + 32;
	for (int file = 0; file < (c->ncomp > 1 ? 2 : 1); file++) {
		const char *fname = file == 0 ? "model.safetensors" : "optimizer.safetensors";
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
				snprintf(path, plen, "%s/%s", tmpdir, fname);
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
				take_file(&files[file], fname, &wr);
		}
	}
	return rc;
}

/* This rank's file of the sharded form: the pieces it owns, a table of
 * them ("segments": whole tensor index in state.json's list, first
 * element, count) and their values per component. */
static int save_shard(Ckpt *c, const char *tmpdir, CkptFile *file, RtErr *e)
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
	char name[64], path[4200];
	snprintf(name, sizeof name, "shard-%05d-of-%05d.safetensors", w->rank, w->size);
	snprintf(path, sizeof path, "%s/%s", tmpdir, name);
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
	take_file(file, name, &wr);
	return 0;
}

/* ---- state.json ---- */

/* crc32 of what makes the model: every whole tensor's name and shape and
 * the optimizer's kind (its state's meaning). */
static uint32_t model_hash(const Ckpt *c)
{
	uint32_t h = 0;
	for (int k = 0; k < c->nent; k++)
		h = ckpt_hash_tensor(h, ckpt_ent_name(c, k), c->ent[k].ndim, c->ent[k].dims);
	return ckpt_hash_end(h, c->s->opt.kind);
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
		if (i == spec || st->rec != dp_settings[spec].rec || st->alias || !st->ir_key ||
		    st->ir_mode == DP_IRM_HEAD) /* another spec of the record (loss_scale) */
			continue;
		double v = dp_field_get(dp_setting_cfield(s, i), st->ctype);
		if (st->ir_mode != DP_IRM_NONZERO || v != 0)
			cJSON_AddNumberToObject(t, st->ir_key, v);
	}
	return t;
}

/* The JSON text of state.json (malloc'd), or NULL when out of memory. */
static char *state_json(const Ckpt *c, CkptForm form, const CkptRun *run, const CkptFile *files,
			int nfiles)
{
	const DpStep *s = c->s;
	int64_t gb = ckpt_global_batch(s), per_epoch = gb > 0 && run->train_samples >= gb ?
							  run->train_samples / gb : 0;
	cJSON *o = cJSON_CreateObject(), *t;
	cJSON_AddStringToObject(o, "format", CKPT_FORMAT);
	cJSON_AddNumberToObject(o, "version", c->nrank ? CKPT_VERSION_RANK : CKPT_VERSION);
	cJSON_AddStringToObject(o, "form", form == CKPT_FULL ? "full" : "sharded");
	t = cJSON_AddObjectToObject(o, "checksum");
	cJSON_AddStringToObject(t, "algorithm", CKPT_SUM_ALGORITHM);
	cJSON_AddNumberToObject(t, "block_bytes", ST_SUM_BLOCK);
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
	if (s->opt.loss_scale != DP_LS_NONE) { /* training state, as the step */
		t = cJSON_AddObjectToObject(o, "loss_scale");
		cJSON_AddStringToObject(t, "kind", dp_kind_name(DP_SET_LOSS_SCALE, (int)s->opt.loss_scale));
		cJSON_AddNumberToObject(t, "scale", run->amp.scale);
		cJSON_AddNumberToObject(t, "clean_steps", run->amp.clean);
		cJSON_AddNumberToObject(t, "skipped_steps", (double)run->amp.skipped);
	}
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
	if (c->nrank)
		ckpt_rank_json(c, o);
	cJSON *fl = cJSON_AddArrayToObject(o, "files");
	char *hex = NULL;
	for (int i = 0; i < nfiles; i++) {
		cJSON *x = cJSON_CreateObject();
		cJSON_AddStringToObject(x, "name", files[i].name);
		cJSON_AddNumberToObject(x, "bytes", (double)files[i].bytes);
		/* the blocks' CRC-32C, 8 hex digits each, in file order */
		char *h = realloc(hex, (size_t)files[i].ncrc * 8 + 1);
		if (!h) {
			cJSON_Delete(x);
			break;
		}
		hex = h;
		for (int64_t k = 0; k < files[i].ncrc; k++)
			snprintf(hex + 8 * k, 9, "%08x", files[i].crc[k]);
		hex[8 * files[i].ncrc] = '\0';
		cJSON_AddStringToObject(x, "crc32c", hex);
		cJSON_AddItemToArray(fl, x);
	}
	free(hex);
	char *text = cJSON_GetArraySize(fl) == nfiles ? cJSON_Print(o) : NULL;
	cJSON_Delete(o);
	return text;
}

/* ---- saving a checkpoint ---- */

/* Every rank's file PREFIX-RRRRR-of-WWWWW.safetensors (name, size,
 * checksums) to rank 0, into files[0..size): the sharded form's shards, the
 * rank-local state's files. A collective. */
static int gather_files(Ckpt *c, const char *prefix, const CkptFile *mine, CkptFile *files,
			RtErr *e)
{
	World *w = c->w;
	size_t len = 3 * sizeof(int64_t) + (size_t)mine->ncrc * 4;
	char *blob = malloc(len), *all = NULL;
	int64_t *offs = NULL;
	if (!blob)
		return RT_FAIL(e, "out of memory");
	int64_t head[3] = {w->rank, mine->bytes, mine->ncrc};
	memcpy(blob, head, sizeof head);
	if (mine->ncrc)
		memcpy(blob + sizeof head, mine->crc, (size_t)mine->ncrc * 4);
	int rc = world_allgatherv(w, blob, (int64_t)len, &all, &offs, e);
	free(blob);
	for (int r = 0; rc == 0 && w->rank == 0 && r < w->size; r++) {
		int64_t got = offs[r + 1] - offs[r];
		if (got >= (int64_t)sizeof head)
			memcpy(head, all + offs[r], sizeof head);
		/* a rank's blob is its rank, its file's size and exactly its
		 * CRC count's checksums: anything else is not trusted */
		if (got < (int64_t)sizeof head || head[0] != r || head[1] < 0 || head[2] < 0 ||
		    head[2] != (got - (int64_t)sizeof head) / 4 || (got - (int64_t)sizeof head) % 4) {
			rc = RT_FAIL(e, "rank %d sent a malformed file record (%lld bytes) for the checkpoint",
				     r, (long long)got);
			break;
		}
		CkptFile *f = &files[r];
		snprintf(f->name, sizeof f->name, "%s-%05d-of-%05d.safetensors", prefix, r, w->size);
		f->bytes = head[1];
		f->ncrc = head[2];
		f->crc = malloc((size_t)(f->ncrc ? f->ncrc : 1) * 4);
		if (!f->crc)
			rc = RT_FAIL(e, "out of memory");
		else if (f->ncrc)
			memcpy(f->crc, all + offs[r] + sizeof head, (size_t)f->ncrc * 4);
	}
	free(all);
	free(offs);
	return rc;
}

int ckpt_save(Ckpt *c, const char *dir, CkptForm form, const CkptRun *run, int keep,
	      char **path, int64_t *bytes, RtErr *e)
{
	World *w = c->w;
	int rc = 0;
	char name[64], tmpdir[4096];
	*bytes = 0;
	if (path)
		*path = NULL;
	if (!c->planned)
		rc = ckpt_plan(c, e);
	RT_CHECK(world_sync(w, rc, 0, e));
	snprintf(name, sizeof name, "step-%06llu", (unsigned long long)run->step);
	snprintf(tmpdir, sizeof tmpdir, "%s/%s%s", dir, name, OUT_TMP_SUFFIX);
	if (w->rank == 0) {
		ckpt_remove_tree(tmpdir);
		if (mkdir(tmpdir, 0777) != 0)
			rc = RT_FAIL(e, "cannot create %s: %s", tmpdir, strerror(errno));
	}
	RT_CHECK(world_sync(w, rc, 0, e));

	/* the form's files, then the rank-local state's (ckpt_rank.c) */
	int nform = form == CKPT_FULL ? (c->ncomp > 1 ? 2 : 1) : w->size;
	int nfiles = nform + (c->nrank ? w->size : 0);
	CkptFile *files = calloc((size_t)nfiles, sizeof *files), mine = {0}, rank = {0};
	if (!files)
		rc = RT_FAIL(e, "out of memory");
	/* every rank enters the form's collectives (save_full's gathers, the
	 * file records' allgather) or none does: a rank that failed alone
	 * would leave the others waiting in them until --timeout */
	rc = world_sync(w, rc, 0, e);
	if (rc == 0 && form == CKPT_FULL)
		rc = save_full(c, tmpdir, files, e);
	else if (rc == 0 && (rc = world_sync(w, save_shard(c, tmpdir, &mine, e), 0, e)) == 0)
		rc = gather_files(c, "shard", &mine, files, e);
	if (c->nrank) { /* every rank takes part in the syncs, whatever its files did */
		int ok = world_sync(w, rc, 0, e) == 0 && ckpt_rank_save(c, tmpdir, &rank, e) == 0;
		if ((rc = world_sync(w, ok ? 0 : -1, 0, e)) == 0)
			rc = gather_files(c, "rank", &rank, files + nform, e);
	}
	free(mine.crc);
	free(rank.crc);
	if (world_sync(w, rc, 0, e)) {
		if (w->rank == 0)
			ckpt_remove_tree(tmpdir);
		for (int i = 0; files && i < nfiles; i++)
			free(files[i].crc);
		free(files);
		return -1;
	}
	if (w->rank == 0) {
		char *text = state_json(c, form, run, files, nfiles);
		rc = text ? ckpt_publish(c, dir, name, tmpdir, text, keep, run->step, e)
			  : RT_FAIL(e, "out of memory");
		for (int i = 0; i < nfiles; i++)
			*bytes += files[i].bytes;
		*bytes += text ? (int64_t)strlen(text) + 1 : 0;
		free(text);
		if (rc == 0 && path && !(*path = malloc(strlen(dir) + strlen(name) + 2)))
			rc = RT_FAIL(e, "out of memory");
		else if (rc == 0 && path)
			sprintf(*path, "%s/%s", dir, name);
		if (rc)
			ckpt_remove_tree(tmpdir);
	}
	for (int i = 0; files && i < nfiles; i++)
		free(files[i].crc);
	free(files);
	return world_sync(w, rc, 0, e);
}
