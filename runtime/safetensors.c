/*
 * safetensors.c - checkpoints in the safetensors format: F32 tensors (and
 * I64 for the tables of a sharded checkpoint).
 *
 * Layout: u64 little-endian N, then N bytes of JSON
 *   {"__metadata__": {"format": "pt"},
 *    "fc1.w": {"dtype": "F32", "shape": [784, 256], "data_offsets": [0, 802816]}, ...}
 * padded with spaces so that 8 + N is a multiple of 8, then the tensor bytes
 * (offsets relative to the start of the data), in the order declared. Files
 * load in PyTorch with safetensors.torch.load_file and in tests/torch_ref.py.
 *
 * Writing streams: st_begin writes the header of declared tensors, st_put
 * appends their bytes in order (a checkpoint larger than memory is written
 * one tensor at a time), st_end checks the count and commits. The file goes
 * through util/outfile.h: atomic (PATH.dptmp, fsync, rename, directory fsync)
 * onto a regular file, through symbolic links, in place into a device; on
 * any failure nothing is left. The writer computes the CRC-32C of every
 * 1 MiB block as the bytes go (StSums), and a reader given them (a
 * checkpoint's state.json has them) verifies every block it reads, the
 * header's first. Reading: st_open parses and checks every
 * header field against the file size (a truncated or corrupt file is an
 * error naming the file, never a crash) and st_pread reads any byte range of
 * the data, so a loader reads only the parts it needs. Hosts are
 * little-endian (x86-64, aarch64): bytes are copied as they are.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../util/crc32c.h"
#include "../util/outfile.h"
#include "rt.h"

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */
#define ST_MAX_INT 9007199254740992.0 /* 2^53: JSON numbers are doubles */

static const char *const st_dtype_names[ST_NDTYPE] = {"F32", "I64"}; /* ORDER ST_ */
static const int st_dtype_bytes[ST_NDTYPE] = {4, 8};

static int64_t tensor_elems(int ndim, const int64_t *dims)
{
	int64_t n = 1;
	for (int k = 0; k < ndim; k++)
		n *= dims[k];
	return n;
}

static int64_t decl_bytes(const StDecl *d)
{
	return tensor_elems(d->ndim, d->dims) * st_dtype_bytes[d->dtype];
}

/* ---- checksums (StSums) ---- */

static void sums_push(StSums *s, uint32_t crc)
{
	if (s->n == s->cap) {
		int64_t cap = s->cap ? 2 * s->cap : 64;
		uint32_t *v = realloc(s->crc, (size_t)cap * sizeof *v);
		if (!v) {
			s->oom = 1;
			return;
		}
		s->crc = v;
		s->cap = cap;
	}
	s->crc[s->n++] = crc;
}

void st_sums_add(StSums *s, const void *buf, int64_t n)
{
	const unsigned char *p = buf;
	while (n > 0) {
		if (s->fill == 0 && n >= 3 * (int64_t)ST_SUM_BLOCK) { /* whole blocks, three at once */
			uint32_t crc[64];
			int64_t k = n / ST_SUM_BLOCK < 64 ? n / ST_SUM_BLOCK : 64;
			crc32c_blocks(p, (size_t)k, ST_SUM_BLOCK, crc);
			for (int64_t i = 0; i < k; i++)
				sums_push(s, crc[i]);
			p += k * ST_SUM_BLOCK;
			n -= k * ST_SUM_BLOCK;
			continue;
		}
		int64_t m = ST_SUM_BLOCK - s->fill < n ? ST_SUM_BLOCK - s->fill : n;
		s->cur = crc32c(s->cur, p, (size_t)m);
		s->fill += m;
		p += m;
		n -= m;
		if (s->fill == ST_SUM_BLOCK) {
			sums_push(s, s->cur);
			s->cur = 0;
			s->fill = 0;
		}
	}
}

int st_sums_end(StSums *s)
{
	if (s->fill)
		sums_push(s, s->cur);
	s->cur = 0;
	s->fill = 0;
	return s->oom ? -1 : 0;
}

void st_sums_free(StSums *s)
{
	free(s->crc);
	memset(s, 0, sizeof *s);
}

/* ---- writing ---- */

/* The JSON header, padded; malloc'd into *out. 0 or -1 (no memory). */
static int build_header(const StDecl *t, int n, char **out, size_t *len)
{
	cJSON *root = cJSON_CreateObject(), *meta = NULL;
	uint64_t offset = 0;
	char *json = NULL;

	*out = NULL;
	if (!root)
		return -1;
	meta = cJSON_AddObjectToObject(root, "__metadata__");
	if (!meta || !cJSON_AddStringToObject(meta, "format", "pt"))
		goto fail;
	for (int i = 0; i < n; i++) {
		cJSON *o = cJSON_AddObjectToObject(root, t[i].name);
		cJSON *shape, *offs;
		uint64_t bytes = (uint64_t)decl_bytes(&t[i]);
		if (!o || !cJSON_AddStringToObject(o, "dtype", st_dtype_names[t[i].dtype]))
			goto fail;
		if (!(shape = cJSON_AddArrayToObject(o, "shape")))
			goto fail;
		for (int k = 0; k < t[i].ndim; k++) {
			cJSON *d = cJSON_CreateNumber((double)t[i].dims[k]);
			if (!d || !cJSON_AddItemToArray(shape, d)) {
				cJSON_Delete(d);
				goto fail;
			}
		}
		if (!(offs = cJSON_AddArrayToObject(o, "data_offsets")))
			goto fail;
		for (int k = 0; k < 2; k++) {
			cJSON *d = cJSON_CreateNumber((double)(k ? offset + bytes : offset));
			if (!d || !cJSON_AddItemToArray(offs, d)) {
				cJSON_Delete(d);
				goto fail;
			}
		}
		offset += bytes;
	}
	json = cJSON_PrintUnformatted(root);
	if (!json)
		goto fail;
	size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
	*out = malloc(padded);
	if (!*out)
		goto fail;
	memcpy(*out, json, jl);
	memset(*out + jl, ' ', padded - jl);
	*len = padded;
	cJSON_free(json);
	cJSON_Delete(root);
	return 0;
fail:
	cJSON_free(json);
	cJSON_Delete(root);
	return -1;
}

static int check_decls(const char *path, const StDecl *t, int n, RtErr *e)
{
	for (int i = 0; i < n; i++) {
		if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
			return RT_FAIL(e, "cannot write %s: tensor %d has no usable name", path, i);
		if (t[i].dtype < 0 || t[i].dtype >= ST_NDTYPE)
			return RT_FAIL(e, "cannot write %s: tensor %s has dtype %d", path, t[i].name,
				       t[i].dtype);
		if (t[i].ndim < 0 || t[i].ndim > DP_MAX_DIMS)
			return RT_FAIL(e, "cannot write %s: tensor %s has %d dimensions", path,
				       t[i].name, t[i].ndim);
		for (int k = 0; k < t[i].ndim; k++)
			if (t[i].dims[k] < 0 || t[i].dims[k] > (1ll << 40))
				return RT_FAIL(e, "cannot write %s: tensor %s has dimension %lld", path,
					       t[i].name, (long long)t[i].dims[k]);
		for (int j = 0; j < i; j++)
			if (strcmp(t[i].name, t[j].name) == 0)
				return RT_FAIL(e, "cannot write %s: two tensors are named %s", path,
					       t[i].name);
	}
	return 0;
}

int st_begin(StWriter *w, const char *path, const StDecl *t, int n, RtErr *e)
{
	char *header = NULL, err[1024];
	size_t hlen = 0;

	memset(w, 0, sizeof *w);
	w->f.fd = -1;
	RT_CHECK(check_decls(path, t, n, e));
	if (build_header(t, n, &header, &hlen) != 0)
		return RT_FAIL(e, "cannot write %s: out of memory", path);
	for (int i = 0; i < n; i++)
		w->want += decl_bytes(&t[i]);
	if (out_open(&w->f, path, err, sizeof err)) {
		free(header);
		return RT_FAIL(e, "%s", err);
	}
	w->open = 1;
	unsigned char len8[8];
	for (int k = 0; k < 8; k++)
		len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));
	out_write(&w->f, len8, 8);
	out_write(&w->f, header, hlen);
	st_sums_add(&w->sums, len8, 8);
	st_sums_add(&w->sums, header, (int64_t)hlen);
	free(header);
	w->bytes = 8 + (int64_t)hlen;
	return 0;
}

int st_put(StWriter *w, const void *data, int64_t nbytes, RtErr *e)
{
	if (w->done + nbytes > w->want)
		return RT_FAIL(e, "writing %s: %lld bytes more than the header declares", w->f.path,
			       (long long)(w->done + nbytes - w->want));
	if (nbytes > 0) {
		out_write(&w->f, data, (size_t)nbytes);
		st_sums_add(&w->sums, data, nbytes);
	}
	w->done += nbytes;
	w->bytes += nbytes;
	return 0;
}

int st_end(StWriter *w, RtErr *e)
{
	char err[1024];
	if (!w->open)
		return RT_FAIL(e, "st_end without st_begin");
	w->open = 0;
	if (w->done != w->want) {
		RT_FAIL(e, "writing %s: %lld of %lld data bytes written", w->f.path,
			(long long)w->done, (long long)w->want);
		out_abort(&w->f);
		st_sums_free(&w->sums);
		return -1;
	}
	if (st_sums_end(&w->sums)) {
		RT_FAIL(e, "writing %s: out of memory for its checksums", w->f.path);
		out_abort(&w->f);
		st_sums_free(&w->sums);
		return -1;
	}
	if (out_commit(&w->f, err, sizeof err)) {
		st_sums_free(&w->sums);
		return RT_FAIL(e, "%s", err);
	}
	return 0;
}

void st_cancel(StWriter *w)
{
	if (w->open)
		out_abort(&w->f);
	w->open = 0;
	st_sums_free(&w->sums);
}

int st_write(const char *path, const StTensor *t, int n, RtErr *e)
{
	StDecl *d = calloc(n > 0 ? (size_t)n : 1, sizeof *d);
	if (!d)
		return RT_FAIL(e, "cannot write %s: out of memory", path);
	for (int i = 0; i < n; i++) {
		d[i] = (StDecl){.name = t[i].name, .dtype = ST_F32, .ndim = t[i].ndim};
		memcpy(d[i].dims, t[i].dims, sizeof d[i].dims);
		if (t[i].ndim >= 0 && t[i].ndim <= DP_MAX_DIMS && !t[i].data &&
		    tensor_elems(t[i].ndim, t[i].dims) > 0) {
			free(d);
			return RT_FAIL(e, "cannot write %s: tensor %s has no data", path,
				       t[i].name ? t[i].name : "?");
		}
	}
	StWriter w;
	int rc = st_begin(&w, path, d, n, e);
	for (int i = 0; rc == 0 && i < n; i++)
		rc = st_put(&w, t[i].data, decl_bytes(&d[i]), e);
	free(d);
	if (rc) {
		st_cancel(&w);
		return -1;
	}
	rc = st_end(&w, e);
	st_sums_free(&w.sums);
	return rc;
}

/* ---- reading ---- */

/* A JSON number that is a whole number in [0, 2^53]; 0 or -1. */
static int json_uint(const cJSON *j, int64_t *out)
{
	if (!cJSON_IsNumber(j))
		return -1;
	double v = j->valuedouble;
	if (!(v >= 0 && v <= ST_MAX_INT) || v != (double)(int64_t)v)
		return -1;
	*out = (int64_t)v;
	return 0;
}

typedef struct {
	int64_t begin, end;
	int index;
} Extent;

static int cmp_extent(const void *a, const void *b)
{
	const Extent *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* Fill t (name, dtype, shape, offsets) from one header entry. */
static int parse_entry(const char *path, const cJSON *o, int64_t data_len, StEntry *t, RtErr *e)
{
	const char *name = o->string;
	int64_t elems = 1;

	if (!cJSON_IsObject(o))
		return RT_FAIL(e, "%s: header entry %s is not an object", path, name);
	const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(o, "dtype");
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
	if (!cJSON_IsString(dtype))
		return RT_FAIL(e, "%s: tensor %s has no dtype", path, name);
	t->dtype = -1;
	for (int k = 0; k < ST_NDTYPE; k++)
		if (strcmp(dtype->valuestring, st_dtype_names[k]) == 0)
			t->dtype = k;
	if (t->dtype < 0)
		return RT_FAIL(e, "%s: tensor %s has dtype %.32s; dp reads F32 only", path, name,
			       dtype->valuestring);
	if (!cJSON_IsArray(shape))
		return RT_FAIL(e, "%s: tensor %s has no shape", path, name);
	int ndim = cJSON_GetArraySize(shape);
	if (ndim > DP_MAX_DIMS)
		return RT_FAIL(e, "%s: tensor %s has %d dimensions; dp handles up to %d", path, name,
			       ndim, DP_MAX_DIMS);
	t->ndim = ndim;
	int k = 0;
	for (const cJSON *d = shape->child; d; d = d->next, k++) {
		if (json_uint(d, &t->dims[k]) != 0)
			return RT_FAIL(e, "%s: tensor %s has a bad shape", path, name);
		if (t->dims[k] && elems > data_len / t->dims[k] + 1)
			return RT_FAIL(e, "%s: tensor %s has a shape larger than the file", path, name);
		elems *= t->dims[k];
	}
	if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
	    json_uint(offs->child, &t->begin) != 0 || json_uint(offs->child->next, &t->end) != 0)
		return RT_FAIL(e, "%s: tensor %s has bad data_offsets", path, name);
	if (t->begin > t->end || t->end > data_len)
		return RT_FAIL(e, "%s: tensor %s has data_offsets [%lld, %lld] outside the %lld data bytes",
			       path, name, (long long)t->begin, (long long)t->end,
			       (long long)data_len);
	if (t->end - t->begin != elems * st_dtype_bytes[t->dtype])
		return RT_FAIL(e, "%s: tensor %s has %lld data bytes but its shape needs %lld", path,
			       name, (long long)(t->end - t->begin),
			       (long long)(elems * st_dtype_bytes[t->dtype]));
	t->name = strdup(name);
	if (!t->name)
		return RT_FAIL(e, "%s: out of memory", path);
	return 0;
}

static int parse_header(StFile *f, const char *text, size_t hlen, RtErr *e)
{
	const char *end = NULL, *path = f->path;
	cJSON *root = cJSON_ParseWithLengthOpts(text, hlen, &end, 0);
	Extent *ext = NULL;
	int64_t data_len = f->size - f->data_start;

	if (!root)
		return RT_FAIL(e, "%s: the safetensors header is not valid JSON", path);
	for (const char *p = end; p && p < text + hlen; p++)
		if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
			cJSON_Delete(root);
			return RT_FAIL(e, "%s: the safetensors header has bytes after the JSON", path);
		}
	if (!cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return RT_FAIL(e, "%s: the safetensors header is not a JSON object", path);
	}
	int cap = cJSON_GetArraySize(root);
	f->t = calloc(cap ? cap : 1, sizeof *f->t);
	ext = calloc(cap ? cap : 1, sizeof *ext);
	if (!f->t || !ext) {
		RT_FAIL(e, "%s: out of memory", path);
		goto fail;
	}
	for (const cJSON *o = root->child; o; o = o->next) {
		if (!o->string) {
			RT_FAIL(e, "%s: header entry without a name", path);
			goto fail;
		}
		if (strcmp(o->string, "__metadata__") == 0)
			continue;
		if (st_find(f, o->string) >= 0) {
			RT_FAIL(e, "%s: tensor %s appears twice", path, o->string);
			goto fail;
		}
		if (parse_entry(path, o, data_len, &f->t[f->n], e) != 0)
			goto fail;
		ext[f->n] = (Extent){f->t[f->n].begin, f->t[f->n].end, f->n};
		f->n++;
	}
	qsort(ext, f->n, sizeof *ext, cmp_extent);
	for (int i = 1; i < f->n; i++)
		if (ext[i].begin < ext[i - 1].end) {
			RT_FAIL(e, "%s: tensors %s and %s overlap", path, f->t[ext[i - 1].index].name,
				f->t[ext[i].index].name);
			goto fail;
		}
	free(ext);
	cJSON_Delete(root);
	return 0;
fail:
	free(ext);
	cJSON_Delete(root);
	return -1;
}

int st_open(StFile *f, const char *path, RtErr *e)
{
	struct stat st;
	unsigned char len8[8];
	uint64_t hlen = 0;
	int rc;

	memset(f, 0, sizeof *f);
	f->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (f->fd < 0)
		return RT_FAIL(e, "cannot open %s: %s", path, strerror(errno));
	f->path = strdup(path);
	if (!f->path) {
		st_close(f);
		return RT_FAIL(e, "%s: out of memory", path);
	}
	if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		st_close(f);
		return RT_FAIL(e, "%s is not a regular file", path);
	}
	f->size = st.st_size;
	if (f->size < 8 || pread(f->fd, len8, 8, 0) != 8) {
		st_close(f);
		return RT_FAIL(e, "%s is too short for a safetensors file (%lld bytes)", path,
			       (long long)st.st_size);
	}
	for (int k = 0; k < 8; k++)
		hlen |= (uint64_t)len8[k] << (8 * k);
	if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > (uint64_t)f->size - 8) {
		st_close(f);
		return RT_FAIL(e, "%s: safetensors header length %llu does not fit the %lld-byte file",
			       path, (unsigned long long)hlen, (long long)st.st_size);
	}
	char *text = malloc(hlen);
	if (!text) {
		st_close(f);
		return RT_FAIL(e, "%s: out of memory", path);
	}
	f->data_start = 8 + (int64_t)hlen;
	if (pread(f->fd, text, hlen, 8) != (ssize_t)hlen)
		rc = RT_FAIL(e, "%s: cannot read the header", path);
	else
		rc = parse_header(f, text, hlen, e);
	free(text);
	if (rc)
		st_close(f);
	return rc;
}

/* ---- verified reads ---- */

struct StCheck {
	uint32_t *crc;
	int64_t n;
	unsigned char *blk; /* the last block read and verified, */
	int64_t at;         /* its index (-1: none) */
};

/* Block k of f, read whole and verified, in f->check->blk. */
static int load_block(const StFile *f, int64_t k, RtErr *e)
{
	StCheck *c = f->check;
	if (c->at == k)
		return 0;
	if (!c->blk && !(c->blk = malloc(ST_SUM_BLOCK)))
		return RT_FAIL(e, "%s: out of memory", f->path);
	c->at = -1;
	int64_t pos = k * ST_SUM_BLOCK, len = f->size - pos < ST_SUM_BLOCK ? f->size - pos : ST_SUM_BLOCK;
	for (int64_t got = 0; got < len;) {
		ssize_t r = pread(f->fd, c->blk + got, (size_t)(len - got), pos + got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return RT_FAIL(e, "%s: cannot read bytes [%lld, %lld): %s", f->path, (long long)pos,
				       (long long)(pos + len), r < 0 ? strerror(errno) : "the file is shorter");
		got += r;
	}
	uint32_t crc = crc32c(0, c->blk, (size_t)len);
	if (crc != c->crc[k])
		return RT_FAIL(e, "%s is damaged: bytes [%lld, %lld) do not match their checksum "
			       "(crc32c %08x, expected %08x)", f->path, (long long)pos,
			       (long long)(pos + len), crc, c->crc[k]);
	c->at = k;
	return 0;
}

/* nbytes of the file from byte pos, block by verified block. */
static int checked_pread(const StFile *f, int64_t pos, void *dst, int64_t nbytes, RtErr *e)
{
	char *p = dst;
	while (nbytes > 0) {
		int64_t k = pos / ST_SUM_BLOCK, in = pos - k * ST_SUM_BLOCK;
		RT_CHECK(load_block(f, k, e));
		int64_t m = ST_SUM_BLOCK - in < nbytes ? ST_SUM_BLOCK - in : nbytes;
		memcpy(p, f->check->blk + in, (size_t)m);
		p += m;
		pos += m;
		nbytes -= m;
	}
	return 0;
}

int st_verify_with(StFile *f, const uint32_t *crc, int64_t n, RtErr *e)
{
	int64_t want = (f->size + ST_SUM_BLOCK - 1) / ST_SUM_BLOCK;
	if (n != want)
		return RT_FAIL(e, "%s: %lld checksums for its %lld blocks", f->path, (long long)n,
			       (long long)want);
	StCheck *c = calloc(1, sizeof *c);
	if (!c || !(c->crc = malloc((size_t)(n ? n : 1) * sizeof *crc))) {
		free(c);
		return RT_FAIL(e, "%s: out of memory", f->path);
	}
	memcpy(c->crc, crc, (size_t)n * sizeof *crc);
	c->n = n;
	c->at = -1;
	f->check = c;
	for (int64_t k = 0; k * ST_SUM_BLOCK < f->data_start; k++) /* the header */
		RT_CHECK(load_block(f, k, e));
	return 0;
}

int st_find(const StFile *f, const char *name)
{
	for (int i = 0; i < f->n; i++)
		if (strcmp(f->t[i].name, name) == 0)
			return i;
	return -1;
}

int st_pread(const StFile *f, int i, int64_t off, void *dst, int64_t nbytes, RtErr *e)
{
	const StEntry *t = &f->t[i];
	if (off < 0 || nbytes < 0 || off + nbytes > t->end - t->begin)
		return RT_FAIL(e, "%s: bytes [%lld, %lld) are outside tensor %s", f->path,
			       (long long)off, (long long)(off + nbytes), t->name);
	char *p = dst;
	int64_t pos = f->data_start + t->begin + off;
	if (f->check)
		return checked_pread(f, pos, dst, nbytes, e);
	while (nbytes > 0) {
		ssize_t got = pread(f->fd, p, (size_t)(nbytes > (1 << 30) ? (1 << 30) : nbytes), pos);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return RT_FAIL(e, "%s: cannot read tensor %s: %s", f->path, t->name,
				       got < 0 ? strerror(errno) : "file shorter than its header says");
		p += got;
		pos += got;
		nbytes -= got;
	}
	return 0;
}

void st_close(StFile *f)
{
	if (f->check) {
		free(f->check->crc);
		free(f->check->blk);
		free(f->check);
	}
	if (f->fd >= 0)
		close(f->fd);
	for (int i = 0; i < f->n; i++)
		free(f->t[i].name);
	free(f->t);
	free(f->path);
	memset(f, 0, sizeof *f);
}

int st_read(const char *path, StTensor **out, int *nout, RtErr *e)
{
	StFile f;
	*out = NULL;
	*nout = 0;
	RT_CHECK(st_open(&f, path, e));
	StTensor *t = calloc(f.n ? (size_t)f.n : 1, sizeof *t);
	if (!t) {
		st_close(&f);
		return RT_FAIL(e, "%s: out of memory", path);
	}
	int n = 0, rc = 0;
	for (int i = 0; rc == 0 && i < f.n; i++) {
		const StEntry *s = &f.t[i];
		if (s->dtype != ST_F32) {
			rc = RT_FAIL(e, "%s: tensor %s has dtype %s; dp reads F32 only", path, s->name,
				     st_dtype_names[s->dtype]);
			break;
		}
		t[n].name = strdup(s->name);
		t[n].ndim = s->ndim;
		memcpy(t[n].dims, s->dims, sizeof t[n].dims);
		t[n].data = malloc(s->end > s->begin ? (size_t)(s->end - s->begin) : 1);
		n++;
		if (!t[n - 1].name || !t[n - 1].data)
			rc = RT_FAIL(e, "%s: out of memory for tensor %s", path, s->name);
		else
			rc = st_pread(&f, i, 0, t[n - 1].data, s->end - s->begin, e);
	}
	st_close(&f);
	if (rc) {
		st_free(t, n);
		return -1;
	}
	*out = t;
	*nout = n;
	return 0;
}

void st_free(StTensor *t, int n)
{
	if (!t)
		return;
	for (int i = 0; i < n; i++) {
		free(t[i].name);
		free(t[i].data);
	}
	free(t);
}

/* ---- collecting an EXPORT program's SAVEs ---- */

static int64_t numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}

int st_saved_init(StSaved *sv, const DpStep *s, int keep, RtErr *e)
{
	sv->s = s;
	sv->keep = keep;
	sv->data = calloc(s->ntensors ? s->ntensors : 1, sizeof *sv->data);
	sv->name = calloc(s->ntensors ? s->ntensors : 1, sizeof *sv->name);
	return sv->data && sv->name ? 0 : RT_FAIL(e, "out of memory");
}

int st_saved_hook(void *ctx, int name, int id, const float *src, RtErr *e)
{
	StSaved *sv = ctx;
	if (!sv->keep)
		return 0;
	size_t bytes = (size_t)numel(&sv->s->tensors[id]) * sizeof(float);
	float *copy = realloc(sv->data[id], bytes ? bytes : 1); /* saved twice: the last wins */
	if (!copy)
		return RT_FAIL(e, "--save-full: out of memory copying '%s'",
			       dpstep_str(sv->s, sv->s->tensors[name].name));
	memcpy(copy, src, bytes);
	sv->data[id] = copy;
	sv->name[id] = name;
	return 0;
}

int st_saved_write(const StSaved *sv, const char *path, int *n, RtErr *e)
{
	const DpStep *s = sv->s;
	int k = 0;
	for (uint32_t i = 0; i < s->ntensors; i++)
		k += sv->data[i] != NULL;
	StTensor *st = calloc(k ? (size_t)k : 1, sizeof *st);
	if (!st)
		return RT_FAIL(e, "out of memory");
	k = 0;
	for (uint32_t i = 0; i < s->ntensors; i++) {
		const DpTensor *t = &s->tensors[i];
		if (!sv->data[i])
			continue;
		st[k].name = (char *)dpstep_str(s, s->tensors[sv->name[i]].name);
		st[k].ndim = t->ndim;
		memcpy(st[k].dims, t->dims, sizeof st[k].dims);
		st[k].data = sv->data[i];
		k++;
	}
	int rc = st_write(path, st, k, e);
	free(st);
	*n = k;
	return rc;
}

void st_saved_free(StSaved *sv)
{
	if (sv->data && sv->s)
		for (uint32_t i = 0; i < sv->s->ntensors; i++)
			free(sv->data[i]);
	free(sv->data);
	free(sv->name);
	sv->data = NULL;
	sv->name = NULL;
}
