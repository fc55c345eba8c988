/*
 * safetensors.c - full checkpoints in the safetensors format (F32 tensors).
 *
 * Layout: u64 little-endian N, then N bytes of JSON
 *   {"__metadata__": {"format": "pt"},
 *    "fc1.w": {"dtype": "F32", "shape": [784, 256], "data_offsets": [0, 802816]}, ...}
 * padded with spaces so that 8 + N is a multiple of 8, then the tensor bytes
 * (offsets relative to the start of the data). Files load in PyTorch with
 * safetensors.torch.load_file and in tests/torch_ref.py.
 *
 * st_write is atomic: a temp file beside the target, fsync, rename; on any
 * failure the temp is removed and nothing is left. st_read checks every field
 * against the file size before reading, so a truncated or corrupt file is an
 * error naming the file, never a crash. Hosts are little-endian (x86-64,
 * aarch64): F32 bytes are copied as they are.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "rt.h"

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */
#define ST_MAX_INT 9007199254740992.0 /* 2^53: JSON numbers are doubles */

static int64_t tensor_elems(int ndim, const int64_t *dims)
{
	int64_t n = 1;
	for (int k = 0; k < ndim; k++)
		n *= dims[k];
	return n;
}

/* ---- writing ---- */

/* The JSON header, padded; malloc'd into *out. 0 or -1 (no memory). */
static int build_header(const StTensor *t, int n, char **out, size_t *len)
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
		uint64_t bytes = (uint64_t)tensor_elems(t[i].ndim, t[i].dims) * 4;
		if (!o || !cJSON_AddStringToObject(o, "dtype", "F32"))
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

static int check_tensors(const char *path, const StTensor *t, int n, RtErr *e)
{
	for (int i = 0; i < n; i++) {
		if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
			return RT_FAIL(e, "cannot write %s: tensor %d has no usable name", path, i);
		if (t[i].ndim < 0 || t[i].ndim > DP_MAX_DIMS)
			return RT_FAIL(e, "cannot write %s: tensor %s has %d dimensions", path,
				       t[i].name, t[i].ndim);
		for (int k = 0; k < t[i].ndim; k++)
			if (t[i].dims[k] < 0 || t[i].dims[k] > (1ll << 40))
				return RT_FAIL(e, "cannot write %s: tensor %s has dimension %lld", path,
					       t[i].name, (long long)t[i].dims[k]);
		if (tensor_elems(t[i].ndim, t[i].dims) > 0 && !t[i].data)
			return RT_FAIL(e, "cannot write %s: tensor %s has no data", path, t[i].name);
		for (int j = 0; j < i; j++)
			if (strcmp(t[i].name, t[j].name) == 0)
				return RT_FAIL(e, "cannot write %s: two tensors are named %s", path,
					       t[i].name);
	}
	return 0;
}

/* "<dir>/.<base>.XXXXXX" beside path, so rename() stays on one file system. */
static char *temp_name(const char *path)
{
	const char *slash = strrchr(path, '/');
	size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
	const char *base = slash ? slash + 1 : path;
	size_t len = dirlen + 1 + strlen(base) + 8;
	char *tmp = malloc(len);

	if (tmp)
		snprintf(tmp, len, "%.*s.%s.XXXXXX", (int)dirlen, path, base);
	return tmp;
}

static void sync_dir(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir = slash ? strndup(path, (size_t)(slash - path) + 1) : strdup(".");
	FILE *f = dir ? fopen(dir, "r") : NULL;

	if (f) { /* best effort: makes the rename itself durable */
		fsync(fileno(f));
		fclose(f);
	}
	free(dir);
}

int st_write(const char *path, const StTensor *t, int n, RtErr *e)
{
	char *header = NULL, *tmp = NULL;
	size_t hlen = 0;
	FILE *f = NULL;
	int fd = -1;

	RT_CHECK(check_tensors(path, t, n, e));
	if (build_header(t, n, &header, &hlen) != 0)
		return RT_FAIL(e, "cannot write %s: out of memory", path);
	tmp = temp_name(path);
	if (!tmp) {
		free(header);
		return RT_FAIL(e, "cannot write %s: out of memory", path);
	}
	fd = mkstemp(tmp);
	if (fd < 0) {
		RT_FAIL(e, "cannot write %s: %s", path, strerror(errno));
		free(tmp);
		free(header);
		return -1;
	}
	fchmod(fd, 0644); /* mkstemp makes 0600; checkpoints are shared */
	f = fdopen(fd, "wb");
	if (!f) {
		RT_FAIL(e, "cannot write %s: %s", path, strerror(errno));
		close(fd);
		goto fail;
	}
	unsigned char len8[8];
	for (int k = 0; k < 8; k++)
		len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));
	errno = 0;
	int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
	for (int i = 0; ok && i < n; i++) {
		size_t cnt = (size_t)tensor_elems(t[i].ndim, t[i].dims);
		ok = fwrite(t[i].data, sizeof(float), cnt, f) == cnt;
	}
	ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
	if (!ok) {
		RT_FAIL(e, "cannot write %s: %s", path, errno ? strerror(errno) : "write failed");
		fclose(f);
		goto fail;
	}
	if (fclose(f) != 0) {
		RT_FAIL(e, "cannot write %s: %s", path, strerror(errno));
		goto fail;
	}
	if (rename(tmp, path) != 0) {
		RT_FAIL(e, "cannot write %s: rename: %s", path, strerror(errno));
		goto fail;
	}
	sync_dir(path);
	free(tmp);
	free(header);
	return 0;
fail:
	unlink(tmp);
	free(tmp);
	free(header);
	return -1;
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

/* Fill t (name, shape, offsets in ext) from one header entry. */
static int parse_entry(const char *path, const cJSON *o, int64_t data_len, StTensor *t,
		       Extent *ext, RtErr *e)
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
	if (strcmp(dtype->valuestring, "F32") != 0)
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
	    json_uint(offs->child, &ext->begin) != 0 || json_uint(offs->child->next, &ext->end) != 0)
		return RT_FAIL(e, "%s: tensor %s has bad data_offsets", path, name);
	if (ext->begin > ext->end || ext->end > data_len)
		return RT_FAIL(e, "%s: tensor %s has data_offsets [%lld, %lld] outside the %lld data bytes",
			       path, name, (long long)ext->begin, (long long)ext->end,
			       (long long)data_len);
	if (ext->end - ext->begin != elems * 4)
		return RT_FAIL(e, "%s: tensor %s has %lld data bytes but its shape needs %lld", path,
			       name, (long long)(ext->end - ext->begin), (long long)(elems * 4));
	t->name = strdup(name);
	if (!t->name)
		return RT_FAIL(e, "%s: out of memory", path);
	return 0;
}

static int read_at(FILE *f, int64_t off, void *buf, size_t len)
{
	if (fseeko(f, (off_t)off, SEEK_SET) != 0)
		return -1;
	return fread(buf, 1, len, f) == len ? 0 : -1;
}

static int parse_header(const char *path, FILE *f, const char *text, size_t hlen,
			int64_t data_start, int64_t data_len, StTensor **out, int *nout, RtErr *e)
{
	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts(text, hlen, &end, 0);
	StTensor *t = NULL;
	Extent *ext = NULL;
	int n = 0, cap;

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
	cap = cJSON_GetArraySize(root);
	t = calloc(cap ? cap : 1, sizeof *t);
	ext = calloc(cap ? cap : 1, sizeof *ext);
	if (!t || !ext) {
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
		for (int i = 0; i < n; i++)
			if (strcmp(t[i].name, o->string) == 0) {
				RT_FAIL(e, "%s: tensor %s appears twice", path, o->string);
				goto fail;
			}
		if (parse_entry(path, o, data_len, &t[n], &ext[n], e) != 0)
			goto fail;
		ext[n].index = n;
		n++;
	}
	qsort(ext, n, sizeof *ext, cmp_extent);
	for (int i = 1; i < n; i++)
		if (ext[i].begin < ext[i - 1].end) {
			RT_FAIL(e, "%s: tensors %s and %s overlap", path, t[ext[i - 1].index].name,
				t[ext[i].index].name);
			goto fail;
		}
	/* Read in file order (sorted extents): one forward pass over the file. */
	for (int k = 0; k < n; k++) {
		StTensor *ti = &t[ext[k].index];
		size_t bytes = (size_t)(ext[k].end - ext[k].begin);
		ti->data = malloc(bytes ? bytes : 1);
		if (!ti->data) {
			RT_FAIL(e, "%s: out of memory for tensor %s", path, ti->name);
			goto fail;
		}
		if (bytes && read_at(f, data_start + ext[k].begin, ti->data, bytes) != 0) {
			RT_FAIL(e, "%s: cannot read tensor %s: %s", path, ti->name,
				ferror(f) ? strerror(errno) : "file shorter than its header says");
			goto fail;
		}
	}
	free(ext);
	cJSON_Delete(root);
	*out = t;
	*nout = n;
	return 0;
fail:
	st_free(t, n);
	free(ext);
	cJSON_Delete(root);
	return -1;
}

int st_read(const char *path, StTensor **out, int *nout, RtErr *e)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	unsigned char len8[8];
	uint64_t hlen = 0;
	char *text = NULL;
	int rc;

	*out = NULL;
	*nout = 0;
	if (!f)
		return RT_FAIL(e, "cannot open %s: %s", path, strerror(errno));
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
		fclose(f);
		return RT_FAIL(e, "%s is not a regular file", path);
	}
	if (st.st_size < 8 || fread(len8, 1, 8, f) != 8) {
		fclose(f);
		return RT_FAIL(e, "%s is too short for a safetensors file (%lld bytes)", path,
			       (long long)st.st_size);
	}
	for (int k = 0; k < 8; k++)
		hlen |= (uint64_t)len8[k] << (8 * k);
	if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > (uint64_t)st.st_size - 8) {
		fclose(f);
		return RT_FAIL(e, "%s: safetensors header length %llu does not fit the %lld-byte file",
			       path, (unsigned long long)hlen, (long long)st.st_size);
	}
	text = malloc(hlen);
	if (!text) {
		fclose(f);
		return RT_FAIL(e, "%s: out of memory", path);
	}
	if (fread(text, 1, hlen, f) != hlen) {
		rc = RT_FAIL(e, "%s: cannot read the header", path);
	} else {
		int64_t start = 8 + (int64_t)hlen;
		rc = parse_header(path, f, text, hlen, start, (int64_t)st.st_size - start, out, nout, e);
	}
	free(text);
	fclose(f);
	return rc;
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
