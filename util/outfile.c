/*
 * outfile.c - safe output files (the rules are at the top of outfile.h):
 * symbolic links followed, devices and FIFOs written through, regular files
 * replaced atomically through TARGET.dptmp, every write error reported.
 * Shared by dpc and dpexec; no allocation outlives an OutFile.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "outfile.h"

#define OUT_MAX_LINKS 40 /* the kernel's own limit on a chain of links */

static int fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

char *out_dirname(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return strdup(".");
	if (slash == path)
		return strdup("/");
	return strndup(path, (size_t)(slash - path));
}

/* "PATH" or "PATH (a link to TARGET)", for messages. */
static void describe(char *buf, size_t len, const char *path, const char *target)
{
	if (!target || strcmp(path, target) == 0)
		snprintf(buf, len, "%s", path);
	else
		snprintf(buf, len, "%s (a link to %s)", path, target);
}

int out_resolve(const char *path, char **target, int *kind, char *err, size_t errlen)
{
	char *cur = strdup(path);
	char what[1024];
	*target = NULL;
	*kind = -1;
	if (!cur)
		return fail(err, errlen, "%s: out of memory", path);
	for (int hops = 0;; hops++) {
		struct stat st;
		describe(what, sizeof what, path, cur);
		if (lstat(cur, &st) != 0) {
			if (errno != ENOENT) {
				fail(err, errlen, "cannot write %s: %s", what, strerror(errno));
				break;
			}
			/* a new file: its directory must be there */
			char *dir = out_dirname(cur);
			struct stat ds;
			int bad = !dir || stat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode);
			if (bad)
				fail(err, errlen, "cannot write %s: directory %s does not exist", what,
				     dir ? dir : "?");
			free(dir);
			if (bad)
				break;
			*kind = 0;
			*target = cur;
			return 0;
		}
		if (S_ISLNK(st.st_mode)) {
			if (hops >= OUT_MAX_LINKS) {
				fail(err, errlen, "cannot write %s: too many levels of symbolic links",
				     path);
				break;
			}
			char link[4096];
			ssize_t n = readlink(cur, link, sizeof link - 1);
			if (n < 0) {
				fail(err, errlen, "cannot read the link %s: %s", cur, strerror(errno));
				break;
			}
			link[n] = '\0';
			char *next;
			if (link[0] == '/') {
				next = strdup(link);
			} else {
				char *dir = out_dirname(cur);
				size_t len = (dir ? strlen(dir) : 0) + (size_t)n + 2;
				next = dir ? malloc(len) : NULL;
				if (next)
					snprintf(next, len, "%s/%s", dir, link);
				free(dir);
			}
			if (!next) {
				fail(err, errlen, "%s: out of memory", path);
				break;
			}
			free(cur);
			cur = next;
			continue;
		}
		if (S_ISREG(st.st_mode)) {
			*kind = 'f';
		} else if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
			*kind = 'c';
		} else {
			fail(err, errlen, "refusing to write %s: it is %s", what,
			     S_ISDIR(st.st_mode)   ? "a directory"
			     : S_ISBLK(st.st_mode) ? "a block device"
						   : "not a regular file, character device or FIFO");
			break;
		}
		*target = cur;
		return 0;
	}
	free(cur);
	return -1;
}

int out_check(const char *path, uint64_t need_bytes, char *err, size_t errlen)
{
	char *target, what[1024];
	int kind;
	if (out_resolve(path, &target, &kind, err, errlen))
		return -1;
	describe(what, sizeof what, path, target);
	int rc = 0;
	if (kind == 'c') {
		struct stat st;
		if (stat(target, &st) == 0 && S_ISCHR(st.st_mode)) {
			int fd = open(target, O_WRONLY | O_NOCTTY | O_CLOEXEC);
			if (fd < 0)
				rc = fail(err, errlen, "cannot write %s: %s", what, strerror(errno));
			else
				close(fd);
		}
		free(target);
		return rc; /* a FIFO is checked when it is opened: its reader may come later */
	}
	char *dir = out_dirname(target);
	struct statvfs vfs;
	if (!dir) {
		rc = fail(err, errlen, "%s: out of memory", path);
	} else if (access(dir, W_OK) != 0) {
		rc = fail(err, errlen, "cannot write %s: directory %s: %s", what, dir, strerror(errno));
	} else if (need_bytes && statvfs(dir, &vfs) == 0 &&
		   (uint64_t)vfs.f_bavail * vfs.f_frsize < need_bytes) {
		rc = fail(err, errlen,
			  "cannot write %s: %s has %.1f MiB free, the file needs about %.1f MiB", what,
			  dir, (double)vfs.f_bavail * vfs.f_frsize / (1 << 20),
			  (double)need_bytes / (1 << 20));
	}
	free(dir);
	free(target);
	return rc;
}

int out_open(OutFile *f, const char *path, char *err, size_t errlen)
{
	int kind;
	memset(f, 0, sizeof *f);
	f->fd = -1;
	if (out_resolve(path, &f->target, &kind, err, errlen))
		return -1;
	f->path = strdup(path);
	if (!f->path) {
		out_abort(f);
		return fail(err, errlen, "%s: out of memory", path);
	}
	char what[1024];
	describe(what, sizeof what, path, f->target);
	if (kind == 'c') {
		/* O_NONBLOCK: a FIFO without a reader is an error, not a hang */
		f->fd = open(f->target, O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
		if (f->fd < 0) {
			int e = errno;
			out_abort(f);
			return fail(err, errlen, "cannot write %s: %s", what,
				    e == ENXIO ? "a FIFO with no reader" : strerror(e));
		}
		fcntl(f->fd, F_SETFL, fcntl(f->fd, F_GETFL) & ~O_NONBLOCK);
		return 0;
	}
	size_t n = strlen(f->target) + sizeof OUT_TMP_SUFFIX;
	f->tmp = malloc(n);
	if (!f->tmp) {
		out_abort(f);
		return fail(err, errlen, "%s: out of memory", path);
	}
	snprintf(f->tmp, n, "%s%s", f->target, OUT_TMP_SUFFIX);
	unlink(f->tmp); /* a stale one from a killed run */
	f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	if (f->fd < 0) {
		int e = errno;
		free(f->tmp);
		f->tmp = NULL; /* not ours: leave it */
		out_abort(f);
		return fail(err, errlen, "cannot write %s: %s", what, strerror(e));
	}
	return 0;
}

int out_write(OutFile *f, const void *buf, size_t n)
{
	const unsigned char *p = buf;
	if (f->err)
		return -1;
	while (n) {
		ssize_t w = write(f->fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			f->err = errno;
			return -1;
		}
		if (w == 0) {
			f->err = ENOSPC;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int out_sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int rc = fsync(fd);
	close(fd);
	return rc;
}

int out_commit(OutFile *f, char *err, size_t errlen)
{
	char what[1024];
	describe(what, sizeof what, f->path ? f->path : "?", f->target);
	int e = f->err;
	/* devices and FIFOs cannot always be synced (EINVAL): not an error */
	if (!e && fsync(f->fd) != 0 && (f->tmp || (errno != EINVAL && errno != EROFS)))
		e = errno;
	if (close(f->fd) != 0 && !e)
		e = errno;
	f->fd = -1;
	if (!e && f->tmp && rename(f->tmp, f->target) != 0)
		e = errno;
	if (e) {
		out_abort(f);
		return fail(err, errlen, "cannot write %s: %s", what, strerror(e));
	}
	if (f->tmp) {
		char *dir = out_dirname(f->target);
		if (dir)
			out_sync_dir(dir); /* best effort: the data itself is already durable */
		free(dir);
		free(f->tmp);
		f->tmp = NULL;
	}
	out_abort(f); /* frees the rest */
	return 0;
}

void out_abort(OutFile *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	if (f->tmp)
		unlink(f->tmp);
	free(f->tmp);
	free(f->target);
	free(f->path);
	f->tmp = f->target = f->path = NULL;
}

int out_open_inplace(const char *path, int rdwr, int *fd, int *regular, char *err, size_t errlen)
{
	char *target, what[1024];
	int kind;
	*fd = -1;
	*regular = 0;
	if (out_resolve(path, &target, &kind, err, errlen))
		return -1;
	describe(what, sizeof what, path, target);
	/* a device or FIFO is only written (a FIFO opened for reading too would
	 * be its own reader); O_NONBLOCK: a FIFO without a reader is ENXIO, not
	 * a hang */
	int flags = O_NOCTTY | O_CLOEXEC;
	flags |= kind == 'c' ? O_WRONLY | O_NONBLOCK : (rdwr ? O_RDWR : O_WRONLY) | O_CREAT;
	int f = open(target, flags, 0666);
	if (f < 0) {
		int e = errno;
		free(target);
		return fail(err, errlen, "cannot write %s: %s", what,
			    e == ENXIO ? "a FIFO with no reader" : strerror(e));
	}
	if (kind == 'c')
		fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK);
	struct stat st;
	*regular = fstat(f, &st) == 0 && S_ISREG(st.st_mode);
	*fd = f;
	free(target);
	return 0;
}

/* What a path names, for comparing two: an existing file's device and
 * inode (links followed), or for a file not there yet its directory's and
 * its name. kind: 0 missing, 'f' a file, 'c' a character device, -1 unknown. */
typedef struct {
	int kind;
	dev_t dev;
	ino_t ino;
	const char *name; /* new files: the last part of the target */
	char *target;
} Ident;

static void identify(const char *path, Ident *id)
{
	struct stat st;
	char err[8];
	int kind;
	memset(id, 0, sizeof *id);
	id->kind = -1;
	if (stat(path, &st) == 0) { /* an input may be a directory too */
		id->kind = S_ISCHR(st.st_mode) ? 'c' : 'f';
		id->dev = st.st_dev;
		id->ino = st.st_ino;
		return;
	}
	if (out_resolve(path, &id->target, &kind, err, sizeof err) || kind != 0)
		return;
	char *dir = out_dirname(id->target);
	const char *slash = strrchr(id->target, '/');
	id->name = slash ? slash + 1 : id->target;
	if (dir && stat(dir, &st) == 0) {
		id->kind = 0;
		id->dev = st.st_dev;
		id->ino = st.st_ino;
	}
	free(dir);
}

int out_check_distinct(const OutPath *p, int n, char *err, size_t errlen)
{
	Ident *id = calloc(n > 0 ? (size_t)n : 1, sizeof *id);
	int rc = 0;
	if (!id)
		return fail(err, errlen, "out of memory");
	for (int i = 0; i < n; i++)
		if (p[i].path)
			identify(p[i].path, &id[i]);
	for (int j = 0; j < n && rc == 0; j++) {
		if (!p[j].path || !p[j].output || id[j].kind < 0 || id[j].kind == 'c')
			continue;
		for (int i = 0; i < n && rc == 0; i++) {
			if (i == j || !p[i].path || (p[i].output && i > j) || id[i].kind != id[j].kind ||
			    id[i].dev != id[j].dev || id[i].ino != id[j].ino ||
			    (id[j].kind == 0 && strcmp(id[i].name, id[j].name)))
				continue;
			if (p[i].output)
				rc = fail(err, errlen, "%s %s and %s %s are the same file: each output needs "
					  "a file of its own", p[i].what, p[i].path, p[j].what, p[j].path);
			else
				rc = fail(err, errlen, "%s %s is %s%s%s: refusing to overwrite an input",
					  p[j].what, p[j].path, p[i].what, strcmp(p[i].path, p[j].path) ? " " : "",
					  strcmp(p[i].path, p[j].path) ? p[i].path : "");
		}
	}
	for (int i = 0; i < n; i++)
		free(id[i].target);
	free(id);
	return rc;
}

int out_mkdirs(const char *dir)
{
	char *p = strdup(dir);
	if (!p)
		return -1;
	for (char *q = p + 1;; q++) {
		if (*q == '/' || !*q) {
			char ch = *q;
			*q = '\0';
			if (mkdir(p, 0777) != 0 && errno != EEXIST) {
				int err = errno;
				free(p);
				errno = err;
				return -1;
			}
			*q = ch;
			if (!ch)
				break;
		}
	}
	free(p);
	struct stat st;
	if (stat(dir, &st) != 0)
		return -1;
	if (!S_ISDIR(st.st_mode)) {
		errno = ENOTDIR;
		return -1;
	}
	return 0;
}
