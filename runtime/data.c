/*
 * data.c - data sources (IDX, .npy, synthetic, llm.c token shards) and the sampler.
 *
 * data_open loads every IDX, .npy and synthetic source of one split into one
 * malloc'd array each (4-byte elements: float for f32 tensors, int32 for i32
 * tensors), checking what the .dp file declared against what the file holds,
 * and every label against the classes of the model (the last dim of the
 * logits its cross_entropy reads), so a bad label is found at load, not
 * hundreds of steps in. Token shards are different: they can be gigabytes
 * of uint16, so each stays an open file whose size is checked at load
 * against its header, and a sample's tokens are read with pread and widened
 * to int32 when a batch is filled (not mmap: a shard truncated while the run
 * reads it would be SIGBUS; with pread it is a short read, an error). Token
 * ids are checked against the model's vocabulary at load (one streaming
 * pass, data_scan.c) and again as they are read. Errors
 * name the data file and the .dp file and line; a malformed file is an
 * error, never a crash.
 *
 * Errors while filling a batch (a shard that shrank, a token out of range)
 * cannot be returned through the executor's LOAD: the batch gets zeros, the
 * first error is kept, and data_error reports it after the step (the
 * training loop checks it before it logs or saves anything of that step).
 *
 * Token shards (llm.c's format): a header of 256 little-endian int32 (magic
 * 20240520, version 1, token count n, the rest unused), then n little-endian
 * uint16 tokens; the file is exactly 1024 + 2n bytes. The source's path is a
 * glob(3) pattern; the matches, in glob's sorted order, are concatenated in
 * sample space: with T = sample_elems, a shard holds (n - 1) / T samples and
 * sample k of a shard is tokens [k*T + shift, k*T + shift + T), shift 0 for the
 * inputs and 1 for the next-token targets. Both shifts give the same count, a
 * window never crosses a shard, and the last token of a shard is only ever a
 * target.
 *
 * The sampler follows DistributedSampler semantics with drop_last: the train
 * split is reshuffled every epoch by a Fisher-Yates permutation whose random
 * numbers depend only on (seed, epoch), and a step's global batch is a
 * contiguous window of that permutation. Rank r of dp_size takes the
 * interleaved positions r, r + dp_size, ... of the window, so the union over
 * ranks and micro-batches is the global batch whatever the mesh.
 *
 * Exact formulas (GOLDEN = 0x9e3779b97f4a7c15, mix64/hash from init.c,
 * arithmetic mod 2^64; docs/DATA.md repeats them for tests/torch_ref.py):
 *   steps_per_epoch = n / global_batch          (n >= global_batch is checked)
 *   epoch = step / steps_per_epoch, window = (step % steps_per_epoch) * global_batch
 *   key   = mix64(seed ^ mix64(hash("dp.sampler") + epoch * GOLDEN))
 *   perm  = [0, n); for i = n-1 down to 1:
 *             j = mix64(key + i * GOLDEN) % (i + 1); swap perm[i], perm[j]
 *   dataset index of position p of the global batch = perm[window + p]
 *
 * Synthetic classification data (fixed seed 0x5eed, independent of the train
 * seed): x[i, k] = init normal(0, 1) of name "synthetic.x" ("synthetic.eval.x"
 * for the eval split) at element i*D + k, rounded to float;
 * W[c, k] = normal(0, 1) of "synthetic.w" at element c*D + k;
 * label[i] = argmax_c sum_k W[c,k] * x[i,k] (floats widened to double, summed
 * in k order, first maximum wins).
 */
#include <assert.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rt.h"

#define DATA_GOLDEN 0x9e3779b97f4a7c15ull
#define DATA_SYNTH_SEED 0x5eedull
#define DATA_MAX_BYTES (1ll << 40) /* refuse absurd sizes from corrupt headers */
#define NPY_MAX_HEADER (1u << 20)  /* numpy writes a few hundred bytes */
#define NPY_MAX_DIMS 32
#define TOK_MAGIC 20240520
#define TOK_VERSION 1
#define TOK_HEADER_BYTES 1024 /* 256 int32 */

/* One token shard: an open file. */
typedef struct {
	int fd;          /* -1 when not open */
	char *path;
	int64_t ntok;    /* tokens after the header */
	int64_t first;   /* index of its first sample in the concatenation */
} TokShard;

/* One loaded source: n samples of `elems` 4-byte elements. */
typedef struct {
	int loaded;    /* belongs to this split */
	int role;      /* 0 features, 1 labels */
	int64_t limit; /* labels and token ids must be < limit (0: no check) */
	char where[512]; /* "models/mlp.dp:8", for errors while filling */
	int64_t n;     /* samples */
	int64_t elems; /* elements per sample */
	void *data;    /* n * elems floats or int32s; NULL for tokens */
	/* tokens only: */
	int tokens;    /* 1: samples come from shards[], not data */
	int shift;     /* window offset (0 inputs, 1 targets) */
	int64_t window; /* tokens of a sample in the shard: elems, or elems * cp when the
	                   sequence is split over the cp ranks (seq_split) */
	/* positions: every "sample" is this rank's positions (no samples of its own) */
	int positions;
	int nshards;
	TokShard *shards; /* first ascending */
} DataSource;

/* What filling a batch changes, behind a const DataSet (the executor of
 * one rank is single-threaded): the permutation of the epoch last asked
 * for, the read buffer of token samples, and the first error. */
typedef struct {
	int valid;
	uint64_t seed, epoch;
	int64_t *perm;     /* n entries, allocated by data_open for the train split */
	unsigned char *tok; /* 2 * the longest token sample */
	int failed;
	RtErr err;
} DataState;

struct DataSet {
	DpSplit split;
	int cp, cp_rank;    /* context parallelism: the cp ranks, this rank's coordinate */
	int64_t n;          /* samples, the same for every source */
	uint32_t nsources;  /* = s->nsources; slots of other splits are unloaded */
	DataSource *src;
	DataState *st;
};

/* Context of one source load: for messages. */
typedef struct {
	const char *path;  /* file path, or "synthetic" */
	char where[512];   /* "models/mlp.dp:8" */
	RtErr *e;
	int cp, cp_rank;   /* the DataSet's */
} LoadCtx;

/* The position in the whole sequence of local row j of cp rank r, of a
 * sequence of `window` tokens split over cp ranks: two chunks of L =
 * window / (2 cp) tokens, r and 2cp-1-r (the zigzag layout of format/ops.def). */
static int64_t zigzag_pos(int64_t r, int64_t j, int64_t cp, int64_t window)
{
	int64_t l = window / (2 * cp);
	return j < l ? r * l + j : (2 * cp - 1 - r) * l + (j - l);
}

static const char *source_name(const DpStep *s, const DpSource *rec)
{
	return rec->kind == DP_SRC_SYNTHETIC ? "synthetic" : dpstep_str(s, rec->path);
}

static void format_where(char *buf, size_t len, const char *dp_file, uint32_t line)
{
	if (dp_file)
		snprintf(buf, len, "%s:%u", dp_file, line);
	else
		snprintf(buf, len, ".dp line %u", line);
}

static const char *dtype_name(int dtype)
{
	return dp_name(dp_dtype_names, DP_NDTYPE, (unsigned)dtype);
}

/* n * elems * 4 bytes, or -1 when that overflows or is absurd. */
static int64_t data_bytes(int64_t n, int64_t elems)
{
	if (n <= 0 || elems <= 0 || n > DATA_MAX_BYTES / 4 / elems)
		return -1;
	return n * elems * 4;
}

/* ---- reading through zlib (gzip or plain) ---- */

/* Read exactly len bytes; returns the bytes read (short at end of file) or -1. */
static int64_t gz_read_full(gzFile gz, void *buf, int64_t len)
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

static const char *gz_errmsg(gzFile gz)
{
	int errnum = 0;
	const char *m = gzerror(gz, &errnum);
	if (errnum == Z_ERRNO)
		return strerror(errno);
	return m && *m ? m : "read error";
}

static int open_source(LoadCtx *c, gzFile *out)
{
	errno = 0;
	*out = gzopen(c->path, "rb");
	if (!*out)
		return RT_FAIL(c->e, "cannot open data file %s: %s (%s)", c->path,
			       errno ? strerror(errno) : "out of memory", c->where);
	return 0;
}

/* Read exactly len bytes or fail with "truncated" naming what was being read. */
static int read_exact(LoadCtx *c, gzFile gz, void *buf, int64_t len, const char *what)
{
	int64_t got = gz_read_full(gz, buf, len);
	if (got < 0)
		return RT_FAIL(c->e, "cannot read data file %s: %s (%s)", c->path, gz_errmsg(gz),
			       c->where);
	if (got < len)
		return RT_FAIL(c->e, "data file %s is truncated: %s needs %lld bytes, found %lld (%s)",
			       c->path, what, (long long)len, (long long)got, c->where);
	return 0;
}

static int check_elems(LoadCtx *c, int64_t file_elems, int64_t declared)
{
	if (file_elems != declared)
		return RT_FAIL(c->e,
			       "data file %s has samples of %lld elements but the .dp file declares %lld (%s)",
			       c->path, (long long)file_elems, (long long)declared, c->where);
	return 0;
}

static int alloc_data(LoadCtx *c, DataSource *d, int64_t n, int64_t elems)
{
	int64_t bytes = data_bytes(n, elems);
	if (bytes < 0)
		return RT_FAIL(c->e, "data file %s: %lld samples of %lld elements is too large (%s)",
			       c->path, (long long)n, (long long)elems, c->where);
	d->data = malloc((size_t)bytes);
	if (!d->data)
		return RT_FAIL(c->e, "out of memory loading data file %s (%lld bytes)", c->path,
			       (long long)bytes);
	d->n = n;
	d->elems = elems;
	return 0;
}

/* ---- IDX (MNIST): big-endian magic 00 00 08 ndim, ndim u32 dims, u8 data ---- */

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int load_idx_body(LoadCtx *c, gzFile gz, const DpSource *rec, DataSource *d)
{
	unsigned char magic[4], dimbuf[4 * 8];
	int64_t n, elems = 1;

	RT_CHECK(read_exact(c, gz, magic, 4, "the IDX header"));
	if (magic[0] != 0 || magic[1] != 0)
		return RT_FAIL(c->e, "data file %s is not an IDX file (magic %02x%02x%02x%02x) (%s)",
			       c->path, magic[0], magic[1], magic[2], magic[3], c->where);
	if (magic[2] != 0x08)
		return RT_FAIL(c->e,
			       "data file %s: IDX element type 0x%02x is not supported, only unsigned bytes (0x08) (%s)",
			       c->path, magic[2], c->where);
	int ndim = magic[3];
	if (ndim < 1 || ndim > 8)
		return RT_FAIL(c->e, "data file %s: IDX header has %d dimensions (%s)", c->path, ndim,
			       c->where);
	RT_CHECK(read_exact(c, gz, dimbuf, 4 * ndim, "the IDX dimensions"));
	n = be32(dimbuf);
	for (int k = 1; k < ndim; k++) {
		int64_t dk = be32(dimbuf + 4 * k);
		if (dk == 0 || elems > DATA_MAX_BYTES / dk)
			return RT_FAIL(c->e, "data file %s: IDX dimension %d is %lld (%s)", c->path, k,
				       (long long)dk, c->where);
		elems *= dk;
	}
	RT_CHECK(check_elems(c, elems, rec->sample_elems));
	if (n == 0)
		return RT_FAIL(c->e, "data file %s holds no samples (%s)", c->path, c->where);
	RT_CHECK(alloc_data(c, d, n, elems));

	/* Convert in chunks: the bytes never need a second full-size buffer. */
	unsigned char buf[1 << 16];
	int64_t total = n * elems, done = 0;
	while (done < total) {
		int64_t chunk = total - done < (int64_t)sizeof buf ? total - done : (int64_t)sizeof buf;
		int64_t got = gz_read_full(gz, buf, chunk);
		if (got < 0)
			return RT_FAIL(c->e, "cannot read data file %s: %s (%s)", c->path,
				       gz_errmsg(gz), c->where);
		if (got < chunk)
			return RT_FAIL(c->e,
				       "data file %s is truncated: %lld samples of %lld bytes need %lld bytes of data, found %lld (%s)",
				       c->path, (long long)n, (long long)elems, (long long)total,
				       (long long)(done + got), c->where);
		if (rec->role == 0) {
			float *f = (float *)d->data + done;
			for (int64_t k = 0; k < chunk; k++)
				f[k] = (float)buf[k] / 255.0f;
		} else {
			int32_t *v = (int32_t *)d->data + done;
			for (int64_t k = 0; k < chunk; k++)
				v[k] = buf[k];
		}
		done += chunk;
	}
	return 0;
}

static int load_idx(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d)
{
	gzFile gz;

	if (rec->role == 0 && dtype != DP_F32)
		return RT_FAIL(c->e,
			       "data file %s holds images (read as f32 in [0, 1]) but the .dp file declares %s (%s)",
			       c->path, dtype_name(dtype), c->where);
	if (rec->role == 1 && dtype != DP_I32)
		return RT_FAIL(c->e, "data file %s holds labels (read as i32) but the .dp file declares %s (%s)",
			       c->path, dtype_name(dtype), c->where);
	RT_CHECK(open_source(c, &gz));
	int rc = load_idx_body(c, gz, rec, d);
	gzclose(gz);
	return rc;
}

/* ---- .npy: "\x93NUMPY" major minor, header length, a Python dict literal ---- */

typedef struct {
	char descr[16];
	int have_descr, have_fortran, have_shape;
	int fortran;
	int ndim;
	int64_t shape[NPY_MAX_DIMS];
} NpyHeader;

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
			if (v > (DATA_MAX_BYTES - 9) / 10)
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

	memset(h, 0, sizeof *h);
	if (!eat(&k, '{'))
		return -1;
	for (;;) {
		if (eat(&k, '}'))
			break;
		if (parse_str(&k, key, sizeof key) || !eat(&k, ':'))
			return -1;
		if (strcmp(key, "descr") == 0 && !h->have_descr) {
			if (parse_str(&k, h->descr, sizeof h->descr))
				return -1;
			h->have_descr = 1;
		} else if (strcmp(key, "fortran_order") == 0 && !h->have_fortran) {
			if (parse_word(&k, "True") == 0)
				h->fortran = 1;
			else if (parse_word(&k, "False") == 0)
				h->fortran = 0;
			else
				return -1;
			h->have_fortran = 1;
		} else if (strcmp(key, "shape") == 0 && !h->have_shape) {
			if (parse_shape(&k, h))
				return -1;
			h->have_shape = 1;
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
	return h->have_descr && h->have_fortran && h->have_shape ? 0 : -1;
}

static int read_npy_header(LoadCtx *c, gzFile gz, NpyHeader *h)
{
	unsigned char pre[10];
	uint32_t hlen;

	RT_CHECK(read_exact(c, gz, pre, 8, "the .npy preamble"));
	if (memcmp(pre, "\x93NUMPY", 6) != 0)
		return RT_FAIL(c->e, "data file %s is not a .npy file (bad magic) (%s)", c->path,
			       c->where);
	if (pre[6] == 1) {
		RT_CHECK(read_exact(c, gz, pre + 8, 2, "the .npy header length"));
		hlen = pre[8] | (uint32_t)pre[9] << 8;
	} else if (pre[6] == 2 || pre[6] == 3) {
		unsigned char l[4];
		RT_CHECK(read_exact(c, gz, l, 4, "the .npy header length"));
		hlen = l[0] | (uint32_t)l[1] << 8 | (uint32_t)l[2] << 16 | (uint32_t)l[3] << 24;
	} else {
		return RT_FAIL(c->e, "data file %s: .npy format version %d.%d is not supported (%s)",
			       c->path, pre[6], pre[7], c->where);
	}
	if (hlen == 0 || hlen > NPY_MAX_HEADER)
		return RT_FAIL(c->e, "data file %s: .npy header length %u is not plausible (%s)",
			       c->path, hlen, c->where);
	char *text = malloc(hlen);
	if (!text)
		return RT_FAIL(c->e, "out of memory reading %s", c->path);
	int rc = read_exact(c, gz, text, hlen, "the .npy header");
	if (rc == 0 && parse_npy_dict(text, hlen, h) != 0) {
		char shown[201]; /* the header's start, printable */
		size_t k;
		for (k = 0; k < hlen && k < 200; k++)
			shown[k] = text[k] >= ' ' && text[k] <= '~' ? text[k] : '?';
		while (k > 0 && shown[k - 1] == '?') /* numpy's '\n' and padding */
			k--;
		shown[k] = 0;
		rc = RT_FAIL(c->e, "data file %s: cannot parse the .npy header %s (%s)", c->path, shown,
			     c->where);
	}
	free(text);
	return rc;
}

static int load_npy_body(LoadCtx *c, gzFile gz, const DpSource *rec, int dtype, DataSource *d)
{
	NpyHeader h;
	int esize;

	RT_CHECK(read_npy_header(c, gz, &h));
	for (char *q = h.descr; *q; q++) /* printable in messages */
		if (*q < ' ' || *q > '~')
			*q = '?';
	if (h.fortran)
		return RT_FAIL(c->e, "data file %s is in Fortran order; dp reads C-order arrays (%s)",
			       c->path, c->where);
	if (strcmp(h.descr, "<f4") == 0)
		esize = 4;
	else if (strcmp(h.descr, "<i4") == 0)
		esize = 4;
	else if (strcmp(h.descr, "<i8") == 0)
		esize = 8;
	else
		return RT_FAIL(c->e,
			       "data file %s has dtype '%s'; dp reads little-endian '<f4', '<i4' and '<i8' (%s)",
			       c->path, h.descr, c->where);
	int is_float = h.descr[1] == 'f';
	if (dtype == DP_F32 && !is_float)
		return RT_FAIL(c->e, "data file %s holds integers ('%s') but the .dp file declares f32 (%s)",
			       c->path, h.descr, c->where);
	if (dtype == DP_I32 && is_float)
		return RT_FAIL(c->e, "data file %s holds floats ('%s') but the .dp file declares i32 (%s)",
			       c->path, h.descr, c->where);
	if (dtype != DP_F32 && dtype != DP_I32)
		return RT_FAIL(c->e, "data tensor of %s has dtype %s; dp loads f32 and i32 (%s)",
			       c->path, dtype_name(dtype), c->where);
	if (rec->role == 1 && dtype != DP_I32)
		return RT_FAIL(c->e, "labels from %s must be declared i32, not %s (%s)", c->path,
			       dtype_name(dtype), c->where);
	if (h.ndim < 1)
		return RT_FAIL(c->e, "data file %s holds a scalar; the first dimension must be the samples (%s)",
			       c->path, c->where);
	int64_t n = h.shape[0], elems = 1;
	for (int k = 1; k < h.ndim; k++) {
		if (h.shape[k] == 0 || elems > DATA_MAX_BYTES / h.shape[k])
			return RT_FAIL(c->e, "data file %s: dimension %d is %lld (%s)", c->path, k,
				       (long long)h.shape[k], c->where);
		elems *= h.shape[k];
	}
	RT_CHECK(check_elems(c, elems, rec->sample_elems));
	if (n == 0)
		return RT_FAIL(c->e, "data file %s holds no samples (%s)", c->path, c->where);
	RT_CHECK(alloc_data(c, d, n, elems));

	int64_t total = n * elems;
	if (esize == 4) {
		RT_CHECK(read_exact(c, gz, d->data, total * 4, "the array data"));
		if (rec->role == 1) {
			const int32_t *v = d->data;
			for (int64_t k = 0; k < total; k++)
				if (v[k] < 0)
					return RT_FAIL(c->e, "data file %s: label %d at element %lld is negative (%s)",
						       c->path, v[k], (long long)k, c->where);
		}
		return 0;
	}
	/* '<i8' into int32, in chunks, every value checked. */
	int64_t buf[4096], done = 0;
	int32_t *v = d->data;
	while (done < total) {
		int64_t chunk = total - done < 4096 ? total - done : 4096;
		RT_CHECK(read_exact(c, gz, buf, chunk * 8, "the array data"));
		for (int64_t k = 0; k < chunk; k++) {
			int64_t x = buf[k];
			if (x < INT32_MIN || x > INT32_MAX || (rec->role == 1 && x < 0))
				return RT_FAIL(c->e,
					       "data file %s: value %lld at element %lld does not fit %s (%s)",
					       c->path, (long long)x, (long long)(done + k),
					       rec->role == 1 ? "a label (0 .. 2^31-1)" : "int32", c->where);
			v[done + k] = (int32_t)x;
		}
		done += chunk;
	}
	return 0;
}

static int load_npy(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d)
{
	gzFile gz;

	RT_CHECK(open_source(c, &gz));
	int rc = load_npy_body(c, gz, rec, dtype, d);
	gzclose(gz);
	return rc;
}

/* ---- synthetic classification data ---- */

/* Samples per x row come from the features record of the same split. */
static const DpSource *synth_features(const DpStep *s, DpSplit split)
{
	for (uint32_t i = 0; i < s->nsources; i++) {
		const DpSource *r = &s->sources[i];
		if (r->split == split && r->kind == DP_SRC_SYNTHETIC && r->role == 0)
			return r;
	}
	return NULL;
}

static int load_synthetic(LoadCtx *c, const DpStep *s, const DpSource *rec, int dtype,
			  DataSource *d)
{
	const char *xname = rec->split == DP_SPLIT_EVAL ? "synthetic.eval.x" : "synthetic.x";
	int64_t n = rec->synth_n;

	if (n <= 0)
		return RT_FAIL(c->e, "synthetic data needs at least one sample, got %lld (%s)",
			       (long long)n, c->where);
	if (rec->role == 0) {
		if (dtype != DP_F32)
			return RT_FAIL(c->e, "synthetic features are f32, but the .dp file declares %s (%s)",
				       dtype_name(dtype), c->where);
		int64_t dim = rec->sample_elems;
		RT_CHECK(alloc_data(c, d, n, dim));
		init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, DATA_SYNTH_SEED, xname, 0, n * dim, d->data);
		return 0;
	}
	if (dtype != DP_I32)
		return RT_FAIL(c->e, "synthetic labels are i32, but the .dp file declares %s (%s)",
			       dtype_name(dtype), c->where);
	if (rec->sample_elems != 1)
		return RT_FAIL(c->e, "synthetic labels have one element per sample, the .dp file declares %lld (%s)",
			       (long long)rec->sample_elems, c->where);
	int classes = rec->synth_classes;
	if (classes < 1)
		return RT_FAIL(c->e, "synthetic data needs at least one class, got %d (%s)", classes,
			       c->where);
	const DpSource *feat = synth_features(s, (DpSplit)rec->split);
	if (!feat)
		return RT_FAIL(c->e,
			       "synthetic labels need synthetic features in the same split to compute them from (%s)",
			       c->where);
	int64_t dim = feat->sample_elems;
	if (dim <= 0 || data_bytes(classes, dim) < 0)
		return RT_FAIL(c->e, "synthetic features of %lld elements are not supported (%s)",
			       (long long)dim, c->where);
	RT_CHECK(alloc_data(c, d, n, 1));
	float *w = malloc((size_t)classes * dim * sizeof *w);
	float *x = malloc((size_t)dim * sizeof *x);
	if (!w || !x) {
		free(w);
		free(x);
		return RT_FAIL(c->e, "out of memory making synthetic labels");
	}
	init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, DATA_SYNTH_SEED, "synthetic.w", 0,
		  (int64_t)classes * dim, w);
	int32_t *labels = d->data;
	for (int64_t i = 0; i < n; i++) {
		init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, DATA_SYNTH_SEED, xname, i * dim, dim, x);
		double best = 0.0;
		int arg = 0;
		for (int cl = 0; cl < classes; cl++) {
			const float *wc = w + (int64_t)cl * dim;
			double acc = 0.0;
			for (int64_t k = 0; k < dim; k++)
				acc += (double)wc[k] * (double)x[k];
			if (cl == 0 || acc > best) {
				best = acc;
				arg = cl;
			}
		}
		labels[i] = arg;
	}
	free(w);
	free(x);
	return 0;
}

/* ---- llm.c token shards (see the top of the file) ---- */

static int32_t le32(const unsigned char *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

/* Open and check one shard of T-token windows; *sh filled on success. */
static int open_shard(LoadCtx *c, const char *path, int64_t T, TokShard *sh)
{
	unsigned char hdr[TOK_HEADER_BYTES];
	struct stat st;

	errno = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return RT_FAIL(c->e, "cannot open token shard %s: %s (%s)", path, strerror(errno),
			       c->where);
	if (fstat(fd, &st) != 0) {
		int err = errno;
		close(fd);
		return RT_FAIL(c->e, "cannot stat token shard %s: %s (%s)", path, strerror(err),
			       c->where);
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return RT_FAIL(c->e, "token shard %s is not a regular file (%s)", path, c->where);
	}
	int64_t size = st.st_size;
	if (size < TOK_HEADER_BYTES) {
		close(fd);
		return RT_FAIL(c->e,
			       "token shard %s is truncated: %lld bytes, shorter than the %d-byte header (%s)",
			       path, (long long)size, TOK_HEADER_BYTES, c->where);
	}
	ssize_t got = pread(fd, hdr, sizeof hdr, 0);
	if (got != (ssize_t)sizeof hdr) {
		int err = errno;
		close(fd);
		return RT_FAIL(c->e, "cannot read the header of token shard %s: %s (%s)", path,
			       got < 0 ? strerror(err) : "short read", c->where);
	}
	int32_t magic = le32(hdr), version = le32(hdr + 4), n = le32(hdr + 8);
	if (magic != TOK_MAGIC || version != TOK_VERSION) {
		close(fd);
		return RT_FAIL(c->e,
			       "token shard %s has a bad header: magic %d, version %d; llm.c shards have %d, %d (%s)",
			       path, magic, version, TOK_MAGIC, TOK_VERSION, c->where);
	}
	int64_t want = TOK_HEADER_BYTES + 2 * (int64_t)n;
	if (n < 0 || size != want) {
		close(fd);
		return RT_FAIL(c->e,
			       "token shard %s has the wrong size%s: its header says %d tokens (%lld bytes), the file has %lld bytes (%s)",
			       path, size < want ? " (truncated)" : "", n, (long long)want,
			       (long long)size, c->where);
	}
	if ((int64_t)n < T + 1) {
		close(fd);
		return RT_FAIL(c->e,
			       "token shard %s holds %d tokens, fewer than one window of %lld + 1 (%s)",
			       path, n, (long long)T, c->where);
	}
	sh->path = strdup(path);
	if (!sh->path) {
		close(fd);
		return RT_FAIL(c->e, "out of memory loading %s", path);
	}
	sh->fd = fd;
	sh->ntok = n;
	return 0;
}

static void close_shards(DataSource *d)
{
	for (int i = 0; i < d->nshards; i++) {
		if (d->shards[i].fd >= 0)
			close(d->shards[i].fd);
		free(d->shards[i].path);
	}
	free(d->shards);
	d->shards = NULL;
	d->nshards = 0;
}

static int load_tokens(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d)
{
	glob_t g;
	int64_t T = rec->sample_elems;

	if (dtype != DP_I32)
		return RT_FAIL(c->e, "tokens from %s must be declared i32, not %s (%s)", c->path,
			       dtype_name(dtype), c->where);
	if (rec->shift > 1)
		return RT_FAIL(c->e, "tokens from %s: shift %u, only 0 and 1 are supported (%s)",
			       c->path, rec->shift, c->where);
	d->tokens = 1;
	d->shift = rec->shift;
	d->elems = T;
	/* a split sequence: the shard's window is the whole sequence, of which this
	 * cp rank takes its two chunks (token_sample) */
	if (rec->seq_split)
		T *= c->cp;
	d->window = T;
	memset(&g, 0, sizeof g);
	int rc = glob(c->path, GLOB_ERR, NULL, &g); /* sorted (no GLOB_NOSORT) */
	if (rc == GLOB_NOMATCH) {
		globfree(&g);
		if (!strpbrk(c->path, "*?["))
			return RT_FAIL(c->e, "cannot open token shard %s: no such file (%s)", c->path,
				       c->where);
		return RT_FAIL(c->e, "token shard pattern %s matches no file (%s)", c->path, c->where);
	}
	if (rc != 0) {
		globfree(&g);
		return RT_FAIL(c->e, "cannot expand token shard pattern %s: %s (%s)", c->path,
			       rc == GLOB_NOSPACE ? "out of memory" : "read error", c->where);
	}
	d->shards = calloc(g.gl_pathc, sizeof *d->shards);
	if (!d->shards) {
		globfree(&g);
		return RT_FAIL(c->e, "out of memory loading %s", c->path);
	}
	int64_t total = 0;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		TokShard *sh = &d->shards[i];
		sh->fd = -1;
		if (open_shard(c, g.gl_pathv[i], T, sh) != 0) {
			globfree(&g);
			return -1; /* data_free closes what was opened */
		}
		d->nshards++;
		/* every id below the vocabulary now, not when its window is drawn */
		if (data_scan_tokens(sh->fd, sh->path, TOK_HEADER_BYTES, sh->ntok, d->limit, c->where,
				     c->e)) {
			globfree(&g);
			return -1;
		}
		sh->first = total;
		total += (sh->ntok - 1) / T;
	}
	globfree(&g);
	d->n = total;
	return 0;
}

/* Keep the first error of a batch fill (data_error reports it). */
static void fill_failed(const DataSet *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fill_failed(const DataSet *d, const char *fmt, ...)
{
	DataState *st = d->st;
	if (st->failed)
		return;
	char msg[900];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	st->err.rank = -1;
	RT_FAIL(&st->err, "%s", msg);
	st->failed = 1;
}

/* Sample idx of a token source into out[0..T), widened to int32 (zeros
 * after an error). */
static void token_sample(const DataSet *d, const DataSource *ds, int64_t idx, int32_t *out)
{
	int lo = 0, hi = ds->nshards - 1;

	assert(idx >= 0 && idx < ds->n && ds->nshards > 0);
	while (lo < hi) { /* the last shard with first <= idx */
		int mid = (lo + hi + 1) / 2;
		if (ds->shards[mid].first <= idx)
			lo = mid;
		else
			hi = mid - 1;
	}
	const TokShard *sh = &ds->shards[lo];
	int64_t start = (idx - sh->first) * ds->window + ds->shift;
	assert(start + ds->window <= sh->ntok);
	unsigned char *p = d->st->tok;
	size_t len = (size_t)ds->window * 2, got = 0;
	off_t at = TOK_HEADER_BYTES + 2 * start;
	while (got < len) {
		ssize_t r = pread(sh->fd, p + got, len - got, at + (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fill_failed(d, "cannot read token shard %s: %s: tokens [%lld, %lld) are past "
				    "its end, the file is shorter than when the run started (%s)",
				    sh->path, r < 0 ? strerror(errno) : "truncated", (long long)start,
				    (long long)(start + ds->window), ds->where);
			memset(out, 0, (size_t)ds->elems * 4);
			return;
		}
		got += (size_t)r;
	}
	int split = ds->window != ds->elems;
	for (int64_t j = 0; j < ds->elems; j++) {
		int64_t k = split ? zigzag_pos(d->cp_rank, j, d->cp, ds->window) : j;
		out[j] = (int32_t)((uint32_t)p[2 * k] | (uint32_t)p[2 * k + 1] << 8);
		if (ds->limit && out[j] >= ds->limit) {
			fill_failed(d, "token shard %s: token %d at index %lld is outside the model's "
				    "vocabulary of %lld (%s)", sh->path, out[j], (long long)(start + k),
				    (long long)ds->limit, ds->where);
			out[j] = 0;
		}
	}
}

/* Sample idx of any source into out (elems 4-byte elements). */
/* A positions source: this rank's global positions of the tokens of a
 * sample (the zigzag chunks when the sequence is split over cp). */
static void fill_positions(const DataSet *d, const DataSource *ds, int32_t *out)
{
	int split = ds->window != ds->elems;
	for (int64_t j = 0; j < ds->elems; j++)
		out[j] = (int32_t)(split ? zigzag_pos(d->cp_rank, j, d->cp, ds->window) : j);
}

static void copy_sample(const DataSet *d, const DataSource *ds, int64_t idx, void *out)
{
	if (ds->tokens) {
		token_sample(d, ds, idx, out);
		return;
	}
	size_t sample_bytes = (size_t)ds->elems * 4;
	memcpy(out, (const char *)ds->data + idx * sample_bytes, sample_bytes);
}

int data_error(const DataSet *d, RtErr *e)
{
	if (!d || !d->st->failed)
		return 0;
	int rank = e->rank;
	*e = d->st->err;
	e->rank = rank;
	return -1;
}

/* ---- the data set ---- */

/* The bound labels or token ids of data tensor `id` must stay below: the
 * classes of a cross_entropy/correct that reads them as labels (the last
 * dim of its logits) or the rows of an embedding table they index; the
 * smallest when several read them, 0 when none does. */
static int64_t id_limit(const DpStep *s, int32_t id)
{
	int64_t lim = 0;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			const DpTensor *t = NULL;
			int k = 0;
			if ((in->op == DP_OP_XENT || in->op == DP_OP_XENT_GRAD || in->op == DP_OP_CORRECT) &&
			    in->in[1] == id && in->in[0] >= 0) {
				t = &s->tensors[in->in[0]];
				k = t->ndim ? t->ndim - 1 : 0;
			} else if (in->op == DP_OP_EMBEDDING && in->in[0] == id && in->in[1] >= 0) {
				t = &s->tensors[in->in[1]];
			}
			if (!t || !t->ndim)
				continue;
			int64_t n = init_whole_dim(s, t, k);
			if (n > 0 && (lim == 0 || n < lim))
				lim = n;
		}
	return lim;
}

/* Every label of a loaded label source below its limit. */
static int check_labels(const LoadCtx *c, const DataSource *d)
{
	const int32_t *v = d->data;
	if (d->role != 1 || d->tokens || !d->limit || !v)
		return 0;
	for (int64_t k = 0; k < d->n * d->elems; k++)
		if (v[k] >= d->limit) {
			char at[64] = "";
			if (d->elems > 1)
				snprintf(at, sizeof at, ", element %lld", (long long)(k % d->elems));
			return RT_FAIL(c->e, "data file %s: label %d of sample %lld%s is outside the %lld "
				       "classes of the model (%s)", c->path, v[k], (long long)(k / d->elems),
				       at, (long long)d->limit, c->where);
		}
	return 0;
}

static int load_source(const DpStep *s, uint32_t idx, const char *dp_file, const DataSet *set,
		       DataSource *d, RtErr *e)
{
	const DpSource *rec = &s->sources[idx];
	LoadCtx c = {.path = source_name(s, rec), .e = e, .cp = set->cp, .cp_rank = set->cp_rank};

	format_where(c.where, sizeof c.where, dp_file, rec->src_line);
	if (rec->tensor < 0 || (uint32_t)rec->tensor >= s->ntensors)
		return RT_FAIL(e, "data source %u names tensor %d, out of range (%s)", idx,
			       rec->tensor, c.where);
	if (rec->role > 1)
		return RT_FAIL(e, "data source %u has role %u (%s)", idx, rec->role, c.where);
	if (rec->sample_elems <= 0)
		return RT_FAIL(e, "data source %u declares %lld elements per sample (%s)", idx,
			       (long long)rec->sample_elems, c.where);
	int dtype = s->tensors[rec->tensor].dtype;
	d->role = rec->role;
	d->loaded = 1;
	d->limit = dtype == DP_I32 ? id_limit(s, rec->tensor) : 0;
	snprintf(d->where, sizeof d->where, "%s", c.where);
	int rc;
	switch (rec->kind) {
	case DP_SRC_IDX:
		rc = load_idx(&c, rec, dtype, d);
		break;
	case DP_SRC_NPY:
		rc = load_npy(&c, rec, dtype, d);
		break;
	case DP_SRC_SYNTHETIC:
		rc = load_synthetic(&c, s, rec, dtype, d);
		break;
	case DP_SRC_TOKENS:
		rc = load_tokens(&c, rec, dtype, d);
		break;
	case DP_SRC_POSITIONS:
		if (dtype != DP_I32 || (rec->seq_split && rec->sample_elems % 2))
			return RT_FAIL(e, "data source %u: positions must be i32 and, split over cp, "
				       "an even count (%s)", idx, c.where);
		d->positions = 1;
		d->elems = rec->sample_elems;
		d->window = rec->seq_split ? rec->sample_elems * c.cp : rec->sample_elems;
		return 0;
	default:
		return RT_FAIL(e, "data source %u has unknown kind %u (%s)", idx, rec->kind, c.where);
	}
	return rc ? rc : check_labels(&c, d);
}

int data_open(const DpStep *s, DpSplit split, const char *dp_file, int cp_rank, DataSet **out,
	      RtErr *e)
{
	DataSet *d = calloc(1, sizeof *d);
	int first = -1;

	*out = NULL;
	if (!d)
		return RT_FAIL(e, "out of memory");
	if (!dp_file && *dpstep_str(s, s->source))
		dp_file = dpstep_str(s, s->source);
	d->split = split;
	d->cp = (int)s->cfg.mesh[DP_AXIS_CP];
	d->cp_rank = cp_rank;
	d->nsources = s->nsources;
	d->src = calloc(s->nsources ? s->nsources : 1, sizeof *d->src);
	d->st = calloc(1, sizeof *d->st);
	if (!d->src || !d->st) {
		data_free(d);
		return RT_FAIL(e, "out of memory");
	}
	int64_t longest = 1; /* token sample, for the read buffer */
	for (uint32_t i = 0; i < s->nsources; i++) {
		if (s->sources[i].split != split)
			continue;
		if (load_source(s, i, dp_file, d, &d->src[i], e) != 0) {
			data_free(d);
			return -1;
		}
		if (d->src[i].tokens && d->src[i].window > longest)
			longest = d->src[i].window;
		if (d->src[i].positions)
			continue; /* not samples: the same for every one */
		if (first < 0) {
			first = (int)i;
			d->n = d->src[i].n;
		} else if (d->src[i].n != d->n) {
			char w1[512], w2[512];
			format_where(w1, sizeof w1, dp_file, s->sources[first].src_line);
			format_where(w2, sizeof w2, dp_file, s->sources[i].src_line);
			RT_FAIL(e, "data sources of the %s split differ in sample count: %s has %lld (%s), %s has %lld (%s)",
				split == DP_SPLIT_TRAIN ? "train" : "eval",
				source_name(s, &s->sources[first]), (long long)d->n, w1,
				source_name(s, &s->sources[i]), (long long)d->src[i].n, w2);
			data_free(d);
			return -1;
		}
	}
	if (split == DP_SPLIT_TRAIN && d->n > 0) {
		d->st->perm = malloc((size_t)d->n * sizeof *d->st->perm);
		if (!d->st->perm) {
			data_free(d);
			return RT_FAIL(e, "out of memory for the sampler's permutation");
		}
	}
	d->st->tok = malloc((size_t)longest * 2);
	if (!d->st->tok) {
		data_free(d);
		return RT_FAIL(e, "out of memory");
	}
	*out = d;
	return 0;
}

void data_free(DataSet *d)
{
	if (!d)
		return;
	if (d->src)
		for (uint32_t i = 0; i < d->nsources; i++) {
			free(d->src[i].data);
			close_shards(&d->src[i]);
		}
	free(d->src);
	if (d->st) {
		free(d->st->perm);
		free(d->st->tok);
	}
	free(d->st);
	free(d);
}

int64_t data_count(const DataSet *d)
{
	return d->n;
}

int data_check_batch(const DataSet *d, int64_t global_batch, RtErr *e)
{
	if (global_batch <= 0)
		return RT_FAIL(e, "global batch %lld is not positive", (long long)global_batch);
	if (d->n < global_batch)
		return RT_FAIL(e, "the %s split has %lld samples, fewer than the global batch of %lld",
			       d->split == DP_SPLIT_TRAIN ? "train" : "eval", (long long)d->n,
			       (long long)global_batch);
	return 0;
}

/* ---- the sampler ---- */

static void epoch_permutation(uint64_t seed, uint64_t epoch, int64_t n, int64_t *perm)
{
	uint64_t key = init_mix64(seed ^ init_mix64(init_hash_name("dp.sampler") + epoch * DATA_GOLDEN));

	for (int64_t i = 0; i < n; i++)
		perm[i] = i;
	for (int64_t i = n - 1; i >= 1; i--) {
		uint64_t r = init_mix64(key + (uint64_t)i * DATA_GOLDEN);
		int64_t j = (int64_t)(r % (uint64_t)(i + 1));
		int64_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
}

/* The reference: recomputes the whole permutation on every call. */
int64_t data_sample_index(uint64_t seed, int64_t n, int64_t global_batch, uint64_t step, int64_t j)
{
	assert(global_batch > 0 && n >= global_batch && j >= 0 && j < global_batch);
	uint64_t per_epoch = (uint64_t)(n / global_batch);
	uint64_t epoch = step / per_epoch;
	int64_t pos = (int64_t)(step % per_epoch) * global_batch + j;
	int64_t *perm = malloc((size_t)n * sizeof *perm);
	assert(perm); /* a test-only path */
	epoch_permutation(seed, epoch, n, perm);
	int64_t idx = perm[pos];
	free(perm);
	return idx;
}

static const int64_t *cached_permutation(const DataSet *d, uint64_t seed, uint64_t epoch)
{
	DataState *c = d->st;

	if (!c->valid || c->seed != seed || c->epoch != epoch) {
		epoch_permutation(seed, epoch, d->n, c->perm);
		c->valid = 1;
		c->seed = seed;
		c->epoch = epoch;
	}
	return c->perm;
}

static const DataSource *source_of(const DataSet *d, const DpStep *s, int src)
{
	assert(src >= 0 && (uint32_t)src < d->nsources && d->nsources == s->nsources);
	assert(d->src[src].loaded); /* the LOAD names a source of this split */
	return &d->src[src];
}

void data_fill_train(const DataSet *d, const DpStep *s, int src, uint64_t step, int micro,
		     int dp_rank, int dp_size, void *dst)
{
	const DataSource *ds = source_of(d, s, src);
	int64_t mb = s->cfg.micro_batch;
	int64_t gb = mb * s->cfg.grad_accum * dp_size;
	size_t sample_bytes = (size_t)ds->elems * 4;
	if (ds->positions) {
		fill_positions(d, ds, dst);
		return;
	}

	assert(d->split == DP_SPLIT_TRAIN && gb > 0 && d->n >= gb); /* data_check_batch */
	assert(dp_rank >= 0 && dp_rank < dp_size && micro >= 0 && (uint32_t)micro < s->cfg.grad_accum);
	uint64_t per_epoch = (uint64_t)(d->n / gb);
	const int64_t *perm = cached_permutation(d, s->cfg.seed, step / per_epoch);
	int64_t window = (int64_t)(step % per_epoch) * gb;
	for (int64_t t = 0; t < mb; t++) {
		int64_t pos = dp_rank + (int64_t)dp_size * ((int64_t)micro * mb + t);
		int64_t idx = perm[window + pos];
		copy_sample(d, ds, idx, (char *)dst + t * sample_bytes);
	}
}

static int64_t eval_batch_size(const DpStep *s)
{
	return s->cfg.eval_batch ? s->cfg.eval_batch : s->cfg.micro_batch;
}

int64_t data_eval_batches(const DataSet *d, const DpStep *s, int dp_size)
{
	int64_t per_batch = eval_batch_size(s) * dp_size;
	assert(per_batch > 0);
	return (d->n + per_batch - 1) / per_batch;
}

void data_fill_eval(const DataSet *d, const DpStep *s, int src, int64_t batch, int dp_rank,
		    int dp_size, void *dst)
{
	const DataSource *ds = source_of(d, s, src);
	int64_t eb = eval_batch_size(s);
	size_t sample_bytes = (size_t)ds->elems * 4;
	if (ds->positions) {
		fill_positions(d, ds, dst);
		return;
	}

	assert(dp_rank >= 0 && dp_rank < dp_size && batch >= 0);
	for (int64_t t = 0; t < eb; t++) {
		int64_t idx = (batch * dp_size + dp_rank) * eb + t;
		char *out = (char *)dst + t * sample_bytes;
		if (idx < d->n) {
			copy_sample(d, ds, idx, out);
		} else if (ds->tokens ? ds->shift == 1 : ds->role == 1) {
			/* labels and token targets: -1 (skipped by the loss); token
			 * inputs: 0, a valid id, so the embedding stays in range */
			for (int64_t k = 0; k < ds->elems; k++)
				((int32_t *)out)[k] = -1;
		} else {
			memset(out, 0, sample_bytes); /* 0.0f and 0 are all-zero bits */
		}
	}
}
