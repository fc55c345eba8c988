/*
 * outfile.h - safe output files, shared by dpc (the step file) and dpexec
 * (checkpoints, safetensors, logs). Linked into both programs (util/outfile.c).
 *
 * Rules every output follows:
 *  - A path is resolved first: a symbolic link is followed to the file it
 *    names (the link stays a link; its target is written), so nothing is
 *    ever renamed over a link.
 *  - A regular file (or a new one) is replaced atomically: the data goes to
 *    a temp file beside the target named TARGET.dptmp, is fsync'ed and
 *    renamed onto the target, and the directory is fsync'ed. A stale
 *    TARGET.dptmp from a killed run is removed by the next write to the
 *    same target. On failure the temp file is removed.
 *  - A character device or a FIFO is written through in place (never
 *    renamed over: `dpc -o /dev/null` leaves /dev/null a device). A
 *    directory, block device or socket is refused.
 *  - out_check tells, before any work starts, whether a path can be
 *    written (its directory exists and is writable; enough free space when
 *    the size is known), so a bad path costs nothing.
 *  - Every write error is reported (a full disk is an error, not an empty
 *    file).
 *  - No output is an input or another output: out_check_distinct compares
 *    the files (device and inode, links followed; for a file not there
 *    yet, its directory's and its name) before any work, as compilers
 *    refuse `-o` onto their input. Character devices (/dev/null, a
 *    terminal) are shared freely.
 *  - A log written a line at a time (out_open_inplace) is not replaced: it
 *    is opened where it is (a regular file, device or FIFO, through links),
 *    and a FIFO without a reader is an error at once, never a blocked
 *    open().
 * Functions return 0, or -1 with a one-line message in err that names the
 * path.
 */
#ifndef DP_OUTFILE_H
#define DP_OUTFILE_H

#include <stddef.h>
#include <stdint.h>

#define OUT_TMP_SUFFIX ".dptmp" /* every temp file and directory dp writes ends so */

typedef struct {
	char *path;   /* as given (messages) */
	char *target; /* the file written: path, or where its symbolic links lead */
	char *tmp;    /* target + OUT_TMP_SUFFIX; NULL when writing through */
	int fd;
	int err;      /* errno of the first failed write, 0 if none */
} OutFile;

/* Where path leads (a malloc'd path: symbolic links followed, up to 40) and
 * what is there: *kind is 0 (nothing yet), 'f' regular file, 'c' character
 * device or FIFO (written through), or -1 with err set for something that
 * cannot be an output (a directory, block device, socket, a link loop). */
int out_resolve(const char *path, char **target, int *kind, char *err, size_t errlen);
/* Can path be written? need_bytes > 0: also that its file system has that
 * much free space. */
int out_check(const char *path, uint64_t need_bytes, char *err, size_t errlen);
/* Start writing path (see the rules above). */
int out_open(OutFile *f, const char *path, char *err, size_t errlen);
/* Append n bytes; the first error is kept in f->err and makes commit fail. */
int out_write(OutFile *f, const void *buf, size_t n);
/* Finish: fsync, rename onto the target, fsync the directory. The OutFile
 * is closed whatever the result. */
int out_commit(OutFile *f, char *err, size_t errlen);
/* Give up: close and remove the temp file. Safe on a closed OutFile. */
void out_abort(OutFile *f);
/* Open path (through links) to write in place: a regular file (created
 * when missing, not truncated; read and write when rdwr), a character
 * device, or a FIFO that has a reader (opened non-blocking: without one it
 * is an error, not a hang; the descriptor is blocking afterwards). *fd, or
 * -1 with err. *regular tells whether it is a regular file. */
int out_open_inplace(const char *path, int rdwr, int *fd, int *regular, char *err, size_t errlen);

/* A file a program reads or writes, for out_check_distinct. */
typedef struct {
	const char *path; /* NULL: not given, skipped */
	const char *what; /* how the user named it: "--losses", "the step file" */
	int output;       /* 1: written; 0: read */
} OutPath;
/* 0 when no output among p[0..n) is the same file as an input or as
 * another output; else -1 and err names both. */
int out_check_distinct(const OutPath *p, int n, char *err, size_t errlen);

/* fsync a directory (what makes a rename in it durable); 0 or -1. */
int out_sync_dir(const char *dir);
/* The directory part of path ("." when it has none); malloc'd. */
char *out_dirname(const char *path);
/* mkdir -p: 0 when dir is (now) a directory, else -1 with errno set. */
int out_mkdirs(const char *dir);

#endif
