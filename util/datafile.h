/*
 * datafile.h - the headers of the data files dp reads, one parser per
 * format, shared by dpc (which checks at compile time every data file it
 * can see, reading headers only) and dpexec (runtime/data_*.c, which reads
 * the data after them), so both accept and refuse the same files with the
 * same words.
 *
 *   IDX (MNIST)   magic 00 00 08 ndim, ndim big-endian u32 dims, then u8 data;
 *                 gzip or plain (read through zlib)
 *   .npy          "\x93NUMPY" major minor, a header length, a Python dict
 *                 literal {'descr': '<f4', 'fortran_order': False, 'shape': (n, d)},
 *                 then the array; gzip or plain
 *   token shards  llm.c's: 256 little-endian int32 (magic 20240520, version 1,
 *                 token count n, zeros), then n little-endian uint16 tokens;
 *                 exactly 1024 + 2n bytes; a source is a glob(3) of them
 *
 * Every function returns 0, or -1 with a message in msg that names the file
 * ("data file x.npy has dtype '<f8'; ..."): the runtime adds the .dp line,
 * dpc prints it at the declaration. DF_NOT_FOUND (-2) is a file or pattern
 * that is not there (or cannot be opened): an error for dpexec, a warning
 * for dpc, whose machine may not be the job's. No function keeps state.
 */
#ifndef DP_DATAFILE_H
#define DP_DATAFILE_H

#include <glob.h>
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#define DF_NOT_FOUND -2
#define DF_MAX_BYTES (1ll << 40)  /* refuse absurd sizes from corrupt headers */
#define NPY_MAX_HEADER (1u << 20) /* numpy writes a few hundred bytes */
#define NPY_MAX_DIMS 32
#define TOK_MAGIC 20240520
#define TOK_VERSION 1
#define TOK_HEADER_BYTES 1024 /* 256 int32 */

/* ---- reading through zlib (gzip or plain) ---- */

/* Read exactly len bytes; the bytes read (short at end of file) or -1. */
int64_t df_gz_read(gzFile gz, void *buf, int64_t len);
/* zlib's or the system's words for the last error on gz. */
const char *df_gz_error(gzFile gz);
/* Exactly len bytes, or a message: "cannot read data file P: ..." or
 * "data file P is truncated: WHAT needs N bytes, found M". */
int df_read_exact(gzFile gz, const char *path, void *buf, int64_t len, const char *what,
		  char *msg, size_t msglen);
/* The samples a file holds against the declaration: n > 0 samples of
 * declared elements each. */
int df_check_samples(const char *path, int64_t n, int64_t elems, int64_t declared, char *msg,
		     size_t msglen);

/* ---- IDX ---- */

typedef struct {
	int64_t n;     /* samples: the first dimension */
	int64_t elems; /* elements (bytes) per sample: the product of the others */
} IdxHeader;

/* The header at the start of gz (u8 elements, 1 to 8 dims, none 0). */
int idx_read_header(gzFile gz, const char *path, IdxHeader *h, char *msg, size_t msglen);

/* ---- .npy ---- */

typedef struct {
	char descr[16]; /* '<f4', printable */
	int fortran;
	int ndim;
	int64_t shape[NPY_MAX_DIMS];
} NpyHeader;

/* What a data tensor is declared as, for npy_check. */
typedef enum {
	DF_F32,   /* features */
	DF_I32,   /* labels, ids */
	DF_OTHER, /* anything else (refused) */
} DfDtype;

/* The header at the start of gz (format 1.0, 2.0, 3.0). */
int npy_read_header(gzFile gz, const char *path, NpyHeader *h, char *msg, size_t msglen);
/* The header against a tensor declared dtype (its name for messages) of
 * `declared` elements per sample (labels: role 1): C order, '<f4' for f32,
 * '<i4' or '<i8' for i32, samples first. Sets the element size of the file
 * (4 or 8) and the sample count. */
int npy_check(const char *path, const NpyHeader *h, DfDtype dtype, const char *dtype_name,
	      int labels, int64_t declared, int *esize, int64_t *n, char *msg, size_t msglen);

/* ---- llm.c token shards ---- */

/* The shards of a glob pattern, sorted by name (globfree after success);
 * DF_NOT_FOUND when nothing matches or its directory does not exist. */
int tok_glob(const char *pattern, glob_t *g, char *msg, size_t msglen);
/* Open one shard and check it for windows of T tokens: a regular file, the
 * header's magic and version, a size of exactly 1024 + 2n bytes, n >= T + 1.
 * *fd (close it) and *ntok on success; DF_NOT_FOUND when it cannot be opened. */
int tok_open_shard(const char *path, int64_t T, int *fd, int64_t *ntok, char *msg,
		   size_t msglen);

#endif
