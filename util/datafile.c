/*
 * datafile.c - the headers of the data files dp reads: IDX, .npy and llm.c
 * token shards (util/datafile.h), for dpc's compile-time checks and
 * dpexec's loaders alike. Headers only: nothing here reads the data.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datafile.h"

/* Every function's message goes to its (msg, msglen): -1 with it. */
#define FAIL(...) (snprintf(msg, msglen, __VA_ARGS__), -1)

/* ---- reading through zlib ---- */

int64_t df_gz_read(gzFile gz, void *buf, int64_t len)
{
	int64_t got = 0;

	while (got < len) {
		int64_t chunk = len - got;
		if (chunk > (1 << 30))
			chunk = 1 << 30;
		int r = gzread(gz, (char *)buf + got, (unsigned)chunk);
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += r;
	}
	return got;
}

const char *df_gz_error(gzFile gz)
{
	int errnum = 0;
	const char *m = gzerror(gz, &errnum);
	if (errnum == Z_ERRNO)
		return strerror(errno);
	return m && *m ? m : "read error";
}

int df_read_exact(gzFile gz, const char *path, void *buf, int64_t len, const char *what,
		  char *msg, size_t msglen)
{
	int64_t got = df_gz_read(gz, buf, len);
	if (got < 0)
		return FAIL("cannot read data file %s: %s", path, df_gz_error(gz));
	if (got < len)
		return FAIL("data file %s is truncated: %s needs %lld bytes, found %lld",
			    path, what, (long long)len, (long long)got);
	return 0;
}

int df_check_samples(const char *path, int64_t n, int64_t elems, int64_t declared, char *msg,
		     size_t msglen)
{
	if (elems != declared)
		return FAIL("data file %s has samples of %lld elements but the .dp file declares %lld",
			    path, (long long)elems, (long long)declared);
	if (n == 0)
		return FAIL("data file %s holds no samples", path);
	return 0;
}

/* ---- IDX ---- */

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int idx_read_header(gzFile gz, const char *path, IdxHeader *h, char *msg, size_t msglen)
{
	unsigned char magic[4], dims[4 * 8];

	if (df_read_exact(gz, path, magic, 4, "the IDX header", msg, msglen))
		return -1;
	if (magic[0] != 0 || magic[1] != 0)
		return FAIL("data file %s is not an IDX file (magic %02x%02x%02x%02x)",
			    path, magic[0], magic[1], magic[2], magic[3]);
	if (magic[2] != 0x08)
		return FAIL("data file %s: IDX element type 0x%02x is not supported, only unsigned bytes (0x08)",
			    path, magic[2]);
	int ndim = magic[3];
	if (ndim < 1 || ndim > 8)
		return FAIL("data file %s: IDX header has %d dimensions", path, ndim);
	if (df_read_exact(gz, path, dims, 4 * ndim, "the IDX dimensions", msg, msglen))
		return -1;
	h->n = be32(dims);
	h->elems = 1;
	for (int k = 1; k < ndim; k++) {
		int64_t dk = be32(dims + 4 * k);
		if (dk == 0 || h->elems > DF_MAX_BYTES / dk)
			return FAIL("data file %s: IDX dimension %d is %lld", path, k,
				    (long long)dk);
		h->elems *= dk;
	}
	return 0;
}

/* ---- .npy ---- */

typedef struct {
	const char *p, *end;
} Cursor;

static void skip_ws(Cursor *k)
{
	while (k->p < k->end && (*k->p == ' ' || *k->p == '\t' || *k->p == '\n' || *k->p == '\r'))
		k->p++;
}

static int eat(Cursor *k, char ch)
{
	skip_ws(k);
	if (k->p < k->end && *k->p == ch) {
		k->p++;
		return 1;
	}
	return 0;
}

/* A quoted Python string without escapes into buf; 0 or -1. */
static int parse_str(Cursor *k, char *buf, size_t len)
{
	skip_ws(k);
	if (k->p >= k->end || (*k->p != '\'' && *k->p != '"'))
		return -1;
	char q = *k->p++;
	size_t n = 0;
	while (k->p < k->end && *k->p != q) {
		if (*k->p == '\\' || n + 1 >= len)
			return -1;
		buf[n++] = *k->p++;
	}
	if (k->p >= k->end)
		return -1;
	k->p++;
	buf[n] = 0;
	return 0;
}

static int parse_word(Cursor *k, const char *w)
{
	size_t n = strlen(w);
	skip_ws(k);
	if ((size_t)(k->end - k->p) >= n && memcmp(k->p, w, n) == 0) {
		k->p += n;
		return 0;
	}
	return -1;
}

/* A shape tuple: "(", ints separated by commas, optional trailing comma, ")". */
static int parse_shape(Cursor *k, NpyHeader *h)
{
	if (!eat(k, '('))
		return -1;
	h->ndim = 0;
	for (;;) {
		if (eat(k, ')'))
			return 0;
		skip_ws(k);
		if (k->p >= k->end || *k->p < '0' || *k->p > '9' || h->ndim == NPY_MAX_DIMS)
			return -1;
		int64_t v = 0;
		while (k->p < k->end && *k->p >= '0' && *k->p <= '9') {
			if (v > (DF_MAX_BYTES - 9) / 10)
				return -1;
			v = v * 10 + (*k->p++ - '0');
		}
		if (k->p < k->end && *k->p == 'L') /* Python 2 long */
			k->p++;
		h->shape[h->ndim++] = v;
		if (!eat(k, ',')) {
			if (eat(k, ')'))
				return 0;
			return -1;
		}
	}
}

static int parse_npy_dict(const char *text, size_t len, NpyHeader *h)
{
	Cursor k = {text, text + len};
	char key[32];
	int have_descr = 0, have_fortran = 0, have_shape = 0;

	memset(h, 0, sizeof *h);
	if (!eat(&k, '{'))
		return -1;
	for (;;) {
		if (eat(&k, '}'))
			break;
		if (parse_str(&k, key, sizeof key) || !eat(&k, ':'))
			return -1;
		if (strcmp(key, "descr") == 0 && !have_descr) {
			if (parse_str(&k, h->descr, sizeof h->descr))
				return -1;
			have_descr = 1;
		} else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
			if (parse_word(&k, "True") == 0)
				h->fortran = 1;
			else if (parse_word(&k, "False") == 0)
				h->fortran = 0;
			else
				return -1;
			have_fortran = 1;
		} else if (strcmp(key, "shape") == 0 && !have_shape) {
			if (parse_shape(&k, h))
				return -1;
			have_shape = 1;
		} else {
			return -1;
		}
		if (!eat(&k, ',')) {
			if (!eat(&k, '}'))
				return -1;
			break;
		}
	}
	skip_ws(&k); /* numpy pads with spaces and ends with '\n' */
	if (k.p != k.end)
		return -1;
	return have_descr && have_fortran && have_shape ? 0 : -1;
}

int npy_read_header(gzFile gz, const char *path, NpyHeader *h, char *msg, size_t msglen)
{
	unsigned char pre[10];
	uint32_t hlen;

	if (df_read_exact(gz, path, pre, 8, "the .npy preamble", msg, msglen))
		return -1;
	if (memcmp(pre, "\x93NUMPY", 6) != 0)
		return FAIL("data file %s is not a .npy file (bad magic)", path);
	if (pre[6] == 1) {
		if (df_read_exact(gz, path, pre + 8, 2, "the .npy header length", msg, msglen))
			return -1;
		hlen = pre[8] | (uint32_t)pre[9] << 8;
	} else if (pre[6] == 2 || pre[6] == 3) {
		unsigned char l[4];
		if (df_read_exact(gz, path, l, 4, "the .npy header length", msg, msglen))
			return -1;
		hlen = l[0] | (uint32_t)l[1] << 8 | (uint32_t)l[2] << 16 | (uint32_t)l[3] << 24;
	} else {
		return FAIL("data file %s: .npy format version %d.%d is not supported",
			    path, pre[6], pre[7]);
	}
	if (hlen == 0 || hlen > NPY_MAX_HEADER)
		return FAIL("data file %s: .npy header length %u is not plausible", path,
			    hlen);
	char *text = malloc(hlen);
	if (!text)
		return FAIL("out of memory reading %s", path);
	int rc = df_read_exact(gz, path, text, hlen, "the .npy header", msg, msglen);
	if (rc == 0 && parse_npy_dict(text, hlen, h) != 0) {
		char shown[201]; /* the header's start, printable */
		size_t k;
		for (k = 0; k < hlen && k < 200; k++)
			shown[k] = text[k] >= ' ' && text[k] <= '~' ? text[k] : '?';
		while (k > 0 && shown[k - 1] == '?') /* numpy's '\n' and padding */
			k--;
		shown[k] = 0;
		rc = FAIL("data file %s: cannot parse the .npy header %s", path, shown);
	}
	free(text);
	for (char *q = h->descr; rc == 0 && *q; q++) /* printable in messages */
		if (*q < ' ' || *q > '~')
			*q = '?';
	return rc;
}

int npy_check(const char *path, const NpyHeader *h, DfDtype dtype, const char *dtype_name,
	      int labels, int64_t declared, int *esize, int64_t *n, char *msg, size_t msglen)
{
	if (h->fortran)
		return FAIL("data file %s is in Fortran order; dp reads C-order arrays",
			    path);
	if (strcmp(h->descr, "<f4") == 0 || strcmp(h->descr, "<i4") == 0)
		*esize = 4;
	else if (strcmp(h->descr, "<i8") == 0)
		*esize = 8;
	else
		return FAIL("data file %s has dtype '%s'; dp reads little-endian '<f4', '<i4' and '<i8'",
			    path, h->descr);
	int is_float = h->descr[1] == 'f';
	if (dtype == DF_F32 && !is_float)
		return FAIL("data file %s holds integers ('%s') but the .dp file declares f32",
			    path, h->descr);
	if (dtype == DF_I32 && is_float)
		return FAIL("data file %s holds floats ('%s') but the .dp file declares i32",
			    path, h->descr);
	if (dtype == DF_OTHER)
		return FAIL("data tensor of %s has dtype %s; dp loads f32 and i32", path,
			    dtype_name);
	if (labels && dtype != DF_I32)
		return FAIL("labels from %s must be declared i32, not %s", path,
			    dtype_name);
	if (h->ndim < 1)
		return FAIL("data file %s holds a scalar; the first dimension must be the samples", path);
	int64_t elems = 1;
	for (int k = 1; k < h->ndim; k++) {
		if (h->shape[k] == 0 || elems > DF_MAX_BYTES / h->shape[k])
			return FAIL("data file %s: dimension %d is %lld", path, k,
				    (long long)h->shape[k]);
		elems *= h->shape[k];
	}
	*n = h->shape[0];
	return df_check_samples(path, *n, elems, declared, msg, msglen);
}

/* ---- llm.c token shards ---- */

/* Does the directory of a pattern exist (when it has no pattern characters
 * itself)? glob(3) with GLOB_ERR fails to read a missing one. */
static int dir_exists(const char *pattern)
{
	const char *slash = strrchr(pattern, '/');
	if (!slash || slash == pattern)
		return 1;
	size_t n = (size_t)(slash - pattern);
	char *dir = strndup(pattern, n);
	struct stat st;
	int there = !dir || strpbrk(dir, "*?[") || stat(dir, &st) == 0 ||
		    (errno != ENOENT && errno != ENOTDIR);
	free(dir);
	return there;
}

int tok_glob(const char *pattern, glob_t *g, char *msg, size_t msglen)
{
	memset(g, 0, sizeof *g);
	int rc = glob(pattern, GLOB_ERR, NULL, g); /* sorted (no GLOB_NOSORT) */
	if (rc == 0)
		return 0;
	globfree(g);
	if (rc == GLOB_NOMATCH) {
		if (!strpbrk(pattern, "*?["))
			snprintf(msg, msglen, "cannot open token shard %s: no such file", pattern);
		else
			snprintf(msg, msglen, "token shard pattern %s matches no file", pattern);
		return DF_NOT_FOUND;
	}
	snprintf(msg, msglen, "cannot expand token shard pattern %s: %s", pattern,
		 rc == GLOB_NOSPACE ? "out of memory" : "read error");
	return rc == GLOB_ABORTED && !dir_exists(pattern) ? DF_NOT_FOUND : -1;
}

static int32_t le32(const unsigned char *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

/* The checks of an open shard; 0 or -1 (the caller closes fd). */
static int check_shard(int fd, const char *path, int64_t T, int64_t *ntok, char *msg,
		       size_t msglen)
{
	unsigned char hdr[TOK_HEADER_BYTES];
	struct stat st;

	if (fstat(fd, &st) != 0)
		return FAIL("cannot stat token shard %s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return FAIL("token shard %s is not a regular file", path);
	int64_t size = st.st_size;
	if (size < TOK_HEADER_BYTES)
		return FAIL("token shard %s is truncated: %lld bytes, shorter than the %d-byte header",
			    path, (long long)size, TOK_HEADER_BYTES);
	ssize_t got = pread(fd, hdr, sizeof hdr, 0);
	if (got != (ssize_t)sizeof hdr)
		return FAIL("cannot read the header of token shard %s: %s", path,
			    got < 0 ? strerror(errno) : "short read");
	int32_t magic = le32(hdr), version = le32(hdr + 4), n = le32(hdr + 8);
	if (magic != TOK_MAGIC || version != TOK_VERSION)
		return FAIL("token shard %s has a bad header: magic %d, version %d; llm.c shards have %d, %d",
			    path, magic, version, TOK_MAGIC, TOK_VERSION);
	int64_t want = TOK_HEADER_BYTES + 2 * (int64_t)n;
	if (n < 0 || size != want)
		return FAIL("token shard %s has the wrong size%s: its header says %d tokens (%lld bytes), the file has %lld bytes",
			    path, size < want ? " (truncated)" : "", n, (long long)want, (long long)size);
	if ((int64_t)n < T + 1)
		return FAIL("token shard %s holds %d tokens, fewer than one window of %lld + 1",
			    path, n, (long long)T);
	*ntok = n;
	return 0;
}

int tok_open_shard(const char *path, int64_t T, int *fd, int64_t *ntok, char *msg,
		   size_t msglen)
{
	errno = 0;
	*fd = open(path, O_RDONLY | O_CLOEXEC);
	if (*fd < 0) {
		snprintf(msg, msglen, "cannot open token shard %s: %s", path, strerror(errno));
		return DF_NOT_FOUND;
	}
	if (check_shard(*fd, path, T, ntok, msg, msglen) != 0) {
		close(*fd);
		*fd = -1;
		return -1;
	}
	return 0;
}
