/*
 * ckpt_dir.c - the save directory of checkpoints (docs/CHECKPOINTS.md,
 * "Atomicity"): publishing a written checkpoint, keep_last, what killed
 * saves leave behind, which checkpoint --resume and --auto-resume name, and
 * the checks before a run: a fresh run does not write over another run's
 * checkpoints, and the disk has room for as many checkpoints as keep_last
 * holds at once.
 *
 * A checkpoint is written into DIR/step-N.dptmp/ (ckpt.c); publishing it:
 *   1. state.json into it (temp file, fsync, rename), the directory fsync'ed:
 *      from here the .dptmp directory is complete;
 *   2. swapped in: rename to DIR/step-N, or, when step-N exists (the same
 *      step saved again), renameat2(RENAME_EXCHANGE) of the two, which
 *      leaves the old copy at step-N.dptmp; DIR fsync'ed;
 *   3. DIR/latest := "step-N" (temp file, fsync, rename, DIR fsync'ed);
 *   4. the replaced copy removed, then what keep_last (and --overwrite)
 *      drop.
 * A kill anywhere leaves every checkpoint that was complete before the
 * save complete under its own name or under NAME.dptmp, and `latest`
 * naming a complete one or, after a kill in 2 or 3 on a first save, a
 * missing one. ckpt_clean_dir, run by the next run once its checkpoint is
 * loaded, renames a complete NAME.dptmp whose NAME is missing back to NAME
 * (the newest copy first), removes every other leftover and points a
 * missing or dangling `latest` at the newest complete checkpoint; until
 * then ckpt_resolve reads a dangling `latest` through the complete .dptmp
 * copy. A file system without RENAME_EXCHANGE gets two renames (step-N to
 * step-N.old.dptmp, then step-N.dptmp to step-N), whose window the same
 * recovery closes.
 *
 * "Complete" is checked cheaply: state.json of a dp checkpoint, and every
 * file it lists there with its size (state.json is written last, after
 * every data file was fsync'ed). The checksums are verified when the
 * checkpoint is loaded (ckpt_load.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckpt_int.h"

#define OLD_SUFFIX ".old" OUT_TMP_SUFFIX /* the replaced copy, without RENAME_EXCHANGE */

/* ---- what is in a save directory ---- */

/* A name of the directory that is a checkpoint or a leftover of one. */
typedef enum {
	ENT_FINAL, /* step-N */
	ENT_TMP,   /* step-N.dptmp: being written, or the copy a swap replaced */
	ENT_OLD,   /* step-N.old.dptmp: the copy two renames replaced */
} EntKind;

typedef struct {
	long long step;
	EntKind kind;
	int complete;
	int keep; /* a complete copy beside an incomplete checkpoint: not removed */
	char name[64];
} DirEnt;

typedef struct {
	DirEnt *v;
	int n;
} Listing;

/* step-N, step-N.dptmp, step-N.old.dptmp: the step and kind, or -1. */
static long long parse_name(const char *name, EntKind *kind)
{
	if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9')
		return -1;
	char *end;
	errno = 0;
	long long v = strtoll(name + 5, &end, 10);
	if (errno || v < 0)
		return -1;
	if (!*end)
		*kind = ENT_FINAL;
	else if (!strcmp(end, OUT_TMP_SUFFIX))
		*kind = ENT_TMP;
	else if (!strcmp(end, OLD_SUFFIX))
		*kind = ENT_OLD;
	else
		return -1;
	return v;
}

cJSON *ckpt_state_parse(const char *dir, char *err, size_t errlen)
{
	char p[4096];
	snprintf(p, sizeof p, "%s/%s", dir, CKPT_STATE);
	FILE *f = fopen(p, "rb");
	if (!f) {
		snprintf(err, errlen, "cannot read %s: %s", p, strerror(errno));
		return NULL;
	}
	char *text = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len + 4096 > cap) {
			cap = cap ? 2 * cap : 65536;
			char *t = cap <= (64u << 20) ? realloc(text, cap) : NULL;
			if (!t) {
				free(text);
				fclose(f);
				snprintf(err, errlen, "%s is too large", p);
				return NULL;
			}
			text = t;
		}
		size_t got = fread(text + len, 1, cap - len - 1, f);
		len += got;
		if (got == 0)
			break;
	}
	int bad = ferror(f);
	fclose(f);
	text[len] = '\0';
	cJSON *js = bad || strlen(text) != len ? NULL : cJSON_Parse(text);
	free(text);
	if (!js || !cJSON_IsObject(js) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(js, "format")) ||
	    strcmp(cJSON_GetObjectItemCaseSensitive(js, "format")->valuestring, CKPT_FORMAT)) {
		cJSON_Delete(js);
		snprintf(err, errlen, "%s is not a dp checkpoint's state (not the JSON dpexec writes)", p);
		return NULL;
	}
	return js;
}

int ckpt_dir_complete(const char *path)
{
	char err[1024], p[4096];
	struct stat st;
	if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		return 0;
	cJSON *js = ckpt_state_parse(path, err, sizeof err);
	const cJSON *files = js ? cJSON_GetObjectItemCaseSensitive(js, "files") : NULL;
	int ok = cJSON_IsArray(files) && cJSON_GetArraySize(files) > 0;
	for (const cJSON *f = ok ? files->child : NULL; ok && f; f = f->next) {
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
		const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(f, "bytes");
		ok = cJSON_IsString(name) && cJSON_IsNumber(bytes) && !strchr(name->valuestring, '/');
		if (ok) {
			snprintf(p, sizeof p, "%s/%s", path, name->valuestring);
			ok = stat(p, &st) == 0 && S_ISREG(st.st_mode) && (double)st.st_size == bytes->valuedouble;
		}
	}
	cJSON_Delete(js);
	return ok;
}

static int cmp_ent(const void *a, const void *b)
{
	const DirEnt *x = a, *y = b;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return (int)x->kind - (int)y->kind; /* final, then the newer copy, then the older */
}

/* Every checkpoint and leftover of dir, by step then kind; -1 when dir
 * cannot be read (errno). Completeness is looked at when check is set. */
static int list_dir(const char *dir, int check, Listing *l)
{
	memset(l, 0, sizeof *l);
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	int cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		EntKind kind;
		long long step = parse_name(de->d_name, &kind);
		if (step < 0 || strlen(de->d_name) >= sizeof l->v->name)
			continue;
		if (l->n == cap) {
			cap = cap ? 2 * cap : 16;
			DirEnt *v = realloc(l->v, (size_t)cap * sizeof *v);
			if (!v) {
				closedir(d);
				free(l->v);
				l->v = NULL;
				errno = ENOMEM;
				return -1;
			}
			l->v = v;
		}
		DirEnt *x = &l->v[l->n++];
		x->step = step;
		x->kind = kind;
		snprintf(x->name, sizeof x->name, "%s", de->d_name);
		x->complete = 0;
		x->keep = 0;
		if (check) {
			char p[4096];
			snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
			x->complete = ckpt_dir_complete(p);
		}
	}
	closedir(d);
	if (l->n)
		qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_ent);
	return 0;
}

/* The newest complete checkpoint of a listing (its final name or, when
 * that is missing, the complete copy recovery would rename): index or -1. */
static int newest(const Listing *l)
{
	for (int i = l->n - 1; i >= 0; i--) {
		if (!l->v[i].complete)
			continue;
		int j = i; /* the first complete one of this step: final before copies */
		while (j > 0 && l->v[j - 1].step == l->v[i].step)
			j--;
		while (!l->v[j].complete)
			j++;
		return j;
	}
	return -1;
}

int ckpt_remove_tree(const char *path)
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
			ckpt_remove_tree(p);
	}
	closedir(d);
	return rmdir(path);
}

/* ---- which checkpoint to load ---- */

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

static int is_kind(const char *path, int dir)
{
	struct stat st;
	return stat(path, &st) == 0 && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

/* What a save directory holds to resume from: the checkpoint `latest`
 * names (or its complete copy, when a killed save left `latest` dangling),
 * else the newest complete one. 1 found (*dir malloc'd, *note says how
 * when not through latest), 0 none, -1 when latest names something that is
 * not a checkpoint name (*why). */
static int find_in(const char *base, char **dir, char **note, char *why, size_t wlen)
{
	char p[4096];
	Listing l;
	*dir = NULL;
	snprintf(p, sizeof p, "%s/%s", base, CKPT_LATEST);
	char *name = is_kind(p, 0) ? read_line(p) : NULL;
	EntKind kind;
	if (name && (parse_name(name, &kind) < 0 || kind != ENT_FINAL)) {
		snprintf(why, wlen, "the '%s' file names '%s', not a checkpoint", CKPT_LATEST, name);
		free(name);
		return -1;
	}
	if (list_dir(base, 1, &l) != 0) {
		free(name);
		snprintf(why, wlen, "cannot read %s: %s", base, strerror(errno));
		return -1;
	}
	int pick = -1;
	for (int i = 0; name && i < l.n && pick < 0; i++) /* latest's, or a copy of it */
		if (l.v[i].complete && !strncmp(l.v[i].name, name, strlen(name)) &&
		    (l.v[i].name[strlen(name)] == '\0' || l.v[i].name[strlen(name)] == '.'))
			pick = i;
	char buf[512] = "";
	if (pick >= 0 && l.v[pick].kind != ENT_FINAL)
		snprintf(buf, sizeof buf, "'%s' names %s, which a killed save left as %s: loading that",
			 CKPT_LATEST, name, l.v[pick].name);
	if (pick < 0 && (pick = newest(&l)) >= 0)
		snprintf(buf, sizeof buf, "%s; the newest complete checkpoint is %s",
			 name ? "the checkpoint 'latest' names is missing or incomplete" : "there is no 'latest'",
			 l.v[pick].name);
	free(name);
	if (pick < 0) {
		free(l.v);
		return 0;
	}
	snprintf(p, sizeof p, "%s/%s", base, l.v[pick].name);
	free(l.v);
	*dir = strdup(p);
	if (buf[0] && note)
		*note = strdup(buf);
	return *dir ? 1 : -1;
}

int ckpt_find(const char *savedir, char **dir, char **note, RtErr *e)
{
	char why[1024];
	*dir = NULL;
	if (note)
		*note = NULL;
	if (!is_kind(savedir, 1))
		return 0;
	int rc = find_in(savedir, dir, note, why, sizeof why);
	if (rc < 0)
		return RT_FAIL(e, "%s: %s", savedir, why);
	return rc;
}

int ckpt_resolve(const char *arg, char **dir, char **parent, char **note, RtErr *e)
{
	char p[4096], why[1024];
	*dir = *parent = NULL;
	*note = NULL;
	const char *slash = strrchr(arg, '/');
	char *base;
	if (is_kind(arg, 1)) {
		snprintf(p, sizeof p, "%s/%s", arg, CKPT_STATE);
		if (is_kind(p, 0)) { /* a checkpoint itself, named as the user wants it */
			*dir = strdup(arg);
			*parent = out_dirname(arg);
			return *dir && *parent ? 0 : RT_FAIL(e, "out of memory");
		}
		base = strdup(arg); /* a save directory */
	} else if (is_kind(arg, 0) && !strcmp(slash ? slash + 1 : arg, CKPT_LATEST)) {
		base = out_dirname(arg);
	} else if (is_kind(arg, 0)) {
		return RT_FAIL(e, "--resume %s: not a checkpoint directory or a '%s' file", arg,
			       CKPT_LATEST);
	} else {
		return RT_FAIL(e, "--resume %s: %s", arg, strerror(errno ? errno : ENOENT));
	}
	if (!base)
		return RT_FAIL(e, "out of memory");
	int rc = find_in(base, dir, note, why, sizeof why);
	if (rc <= 0) {
		if (rc < 0)
			RT_FAIL(e, "--resume %s: %s", arg, why);
		else
			RT_FAIL(e, "--resume %s: no checkpoint there (no '%s' naming one, no complete "
				"step-N directory, no %s)", arg, CKPT_LATEST, CKPT_STATE);
		free(base);
		return -1;
	}
	*parent = base;
	return 0;
}

/* ---- before and after the load ---- */

int ckpt_prepare_dir(Ckpt *c, const char *dir, const CkptDirPlan *plan, RtErr *e)
{
	if (out_mkdirs(dir) != 0)
		return RT_FAIL(e, errno == ENOTDIR ? "the save directory %s is not a directory"
						   : "cannot create the save directory %s: %s",
			       dir, strerror(errno));
	if (access(dir, W_OK) != 0)
		return RT_FAIL(e, "cannot write in the save directory %s: %s", dir, strerror(errno));
	c->overwrite = plan->fresh && plan->overwrite;
	if (!plan->fresh || plan->overwrite)
		return 0;
	Listing l;
	if (list_dir(dir, 1, &l) != 0)
		return RT_FAIL(e, "cannot read the save directory %s: %s", dir, strerror(errno));
	int k = newest(&l);
	char name[64] = "";
	if (k >= 0)
		snprintf(name, sizeof name, "%s", l.v[k].name);
	free(l.v);
	if (k >= 0)
		return RT_FAIL(e, "the save directory %s holds checkpoints (the newest: %s) and this run "
			       "does not resume: --resume %s continues from it, --auto-resume continues "
			       "when there is one, --overwrite starts anew (its checkpoints are removed "
			       "once this run has saved one)", dir, name, dir);
	return 0;
}

/* Point DIR/latest at name (atomically). */
static int write_latest(const char *dir, const char *name, char *err, size_t errlen)
{
	char p[4096];
	OutFile f;
	snprintf(p, sizeof p, "%s/%s", dir, CKPT_LATEST);
	if (out_open(&f, p, err, errlen))
		return -1;
	out_write(&f, name, strlen(name));
	out_write(&f, "\n", 1);
	return out_commit(&f, err, errlen);
}

int ckpt_clean_dir(Ckpt *c, const char *dir, const CkptDirPlan *plan, RtErr *e)
{
	char p[4096], q[4096], err[1024];
	Listing l;
	if (list_dir(dir, 1, &l) != 0)
		return RT_FAIL(e, "cannot read the save directory %s: %s", dir, strerror(errno));
	/* a complete copy whose checkpoint is missing takes its name, the newest
	 * copy first (the listing has final, .dptmp, .old.dptmp per step) */
	for (int i = 0; i < l.n; i++) {
		DirEnt *x = &l.v[i];
		if (x->kind == ENT_FINAL || !x->complete)
			continue;
		int have = 0; /* 1: the checkpoint is there; 2: there, but incomplete */
		for (int j = 0; j < l.n; j++)
			if (l.v[j].step == x->step && l.v[j].kind == ENT_FINAL)
				have = l.v[j].complete ? 1 : 2;
		if (have == 2) { /* damaged by hand? keep the complete copy for the user */
			x->keep = 1;
			continue;
		}
		if (have)
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, x->name);
		snprintf(q, sizeof q, "%s/step-%06lld", dir, x->step);
		if (rename(p, q) == 0) {
			x->kind = ENT_FINAL;
			snprintf(x->name, sizeof x->name, "step-%06lld", x->step);
		}
	}
	/* every other leftover: incomplete copies, replaced copies, temp files */
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t sl = strlen(OUT_TMP_SUFFIX);
	while (d && (de = readdir(d))) {
		size_t n = strlen(de->d_name);
		int keep = 0;
		for (int i = 0; i < l.n; i++)
			keep |= l.v[i].keep && !strcmp(l.v[i].name, de->d_name);
		if (!keep && n > sl && !strcmp(de->d_name + n - sl, OUT_TMP_SUFFIX)) {
			snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
			ckpt_remove_tree(p);
		}
	}
	if (d)
		closedir(d);
	/* `latest` naming nothing complete (or missing beside checkpoints) */
	if (l.n)
		qsort(l.v, (size_t)l.n, sizeof *l.v, cmp_ent);
	int k = newest(&l), rc = 0;
	snprintf(p, sizeof p, "%s/%s", dir, CKPT_LATEST);
	char *name = read_line(p);
	if (name && !strchr(name, '/')) {
		snprintf(q, sizeof q, "%s/%s", dir, name);
		if (!ckpt_dir_complete(q)) {
			free(name);
			name = NULL;
		}
	}
	if (!name && k >= 0 && l.v[k].kind == ENT_FINAL && write_latest(dir, l.v[k].name, err, sizeof err))
		rc = RT_FAIL(e, "%s", err);
	free(name);
	out_sync_dir(dir);
	/* --overwrite: another run's checkpoints go once this one has saved */
	int nfinal = 0;
	for (int i = 0; i < l.n; i++)
		nfinal += l.v[i].kind == ENT_FINAL && l.v[i].complete;
	if (rc == 0 && c->overwrite && nfinal) {
		c->stale = malloc((size_t)nfinal * sizeof *c->stale);
		if (!c->stale)
			rc = RT_FAIL(e, "out of memory");
		for (int i = 0; c->stale && i < l.n; i++)
			if (l.v[i].kind == ENT_FINAL && l.v[i].complete)
				c->stale[c->nstale++] = l.v[i].step;
	}
	free(l.v);
	if (rc)
		return rc;
	/* room for the checkpoints that exist at once: a save is written before
	 * keep_last removes the oldest, so keep_last K needs K + 1 (fewer when
	 * the run saves fewer times or the directory already holds some) */
	int64_t K = plan->keep, S = plan->saves > 0 ? plan->saves : 1, more;
	if (c->overwrite) { /* this run's own once the old ones go; the first beside them */
		int64_t peak = K > 0 && K + 1 < S ? K + 1 : S;
		more = peak - nfinal > 1 ? peak - nfinal : 1;
	} else {
		int64_t peak = K > 0 && K + 1 < S + nfinal ? K + 1 : S + nfinal;
		more = peak - nfinal > 1 ? peak - nfinal : 1;
	}
	struct statvfs vfs;
	int64_t one = ckpt_bytes(c), need = more * one;
	if (statvfs(dir, &vfs) == 0 && (int64_t)(vfs.f_bavail * vfs.f_frsize) < need) {
		double freemb = (double)vfs.f_bavail * vfs.f_frsize / (1 << 20);
		if (more == 1)
			return RT_FAIL(e, "the save directory %s has %.1f MiB free; a checkpoint of this model "
				       "needs about %.1f MiB", dir, freemb, (double)one / (1 << 20));
		return RT_FAIL(e, "the save directory %s has %.1f MiB free; this run needs about %.1f MiB: "
			       "%lld more checkpoints of about %.1f MiB on disk at once (keep_last %d: a "
			       "checkpoint is written before the oldest is removed)", dir, freemb,
			       (double)need / (1 << 20), (long long)more, (double)one / (1 << 20),
			       plan->keep);
	}
	return 0;
}

/* ---- publishing ---- */

/* Remove complete checkpoints beyond the newest keep (never `keep_step`),
 * and with stale steps (--overwrite) every one of them but keep_step. */
static void prune(Ckpt *c, const char *dir, int keep, long long keep_step)
{
	char p[4096];
	Listing l;
	for (int i = 0; i < c->nstale; i++)
		if (c->stale[i] != keep_step) {
			snprintf(p, sizeof p, "%s/step-%06lld", dir, c->stale[i]);
			ckpt_remove_tree(p);
		}
	free(c->stale);
	c->stale = NULL;
	c->nstale = 0;
	if (keep <= 0 || list_dir(dir, 0, &l) != 0)
		return;
	int n = 0;
	for (int i = 0; i < l.n; i++)
		if (l.v[i].kind == ENT_FINAL)
			l.v[n++] = l.v[i];
	for (int i = 0; i < n - keep; i++) {
		if (l.v[i].step == keep_step)
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, l.v[i].name);
		ckpt_remove_tree(p);
	}
	free(l.v);
	out_sync_dir(dir);
}

int ckpt_publish(Ckpt *c, const char *dir, const char *name, const char *tmpdir, const char *state,
		 int keep, uint64_t step, RtErr *e)
{
	char err[1024], p[4096], final[4096], old[4096];
	snprintf(p, sizeof p, "%s/%s", tmpdir, CKPT_STATE);
	OutFile f;
	if (out_open(&f, p, err, sizeof err))
		return RT_FAIL(e, "%s", err);
	out_write(&f, state, strlen(state));
	out_write(&f, "\n", 1);
	if (out_commit(&f, err, sizeof err))
		return RT_FAIL(e, "%s", err);
	out_sync_dir(tmpdir);
	/* swap it in: the same step saved again (a resumed run stopped at once,
	 * a run repeated) exchanges the two, so one complete copy always has the
	 * name */
	snprintf(final, sizeof final, "%s/%s", dir, name);
	const char *replaced = NULL;
	struct stat st;
	if (stat(final, &st) != 0) {
		if (rename(tmpdir, final) != 0)
			return RT_FAIL(e, "cannot complete the checkpoint %s: %s", final, strerror(errno));
	} else if (renameat2(AT_FDCWD, tmpdir, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
		replaced = tmpdir;
	} else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
		/* a file system without the exchange: two renames, recovered from if
		 * killed between them (ckpt_clean_dir) */
		snprintf(old, sizeof old, "%s/%s%s", dir, name, OLD_SUFFIX);
		ckpt_remove_tree(old);
		if (rename(final, old) != 0)
			return RT_FAIL(e, "cannot replace the checkpoint %s: %s", final, strerror(errno));
		if (rename(tmpdir, final) != 0)
			return RT_FAIL(e, "cannot complete the checkpoint %s: %s (the previous one is %s)",
				       final, strerror(errno), old);
		replaced = old;
	} else {
		return RT_FAIL(e, "cannot replace the checkpoint %s: %s", final, strerror(errno));
	}
	out_sync_dir(dir);
	if (write_latest(dir, name, err, sizeof err))
		return RT_FAIL(e, "%s (the checkpoint %s is complete)", err, final);
	if (replaced)
		ckpt_remove_tree(replaced);
	prune(c, dir, keep, (long long)step);
	return 0;
}
