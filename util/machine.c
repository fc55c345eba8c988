/*
 * machine.c - machine files for `dpc --simulate` (util/machine.h says what
 * the fields mean), read with cJSON (Debian's libcjson, which dpexec
 * already links for state.json), and the presets.
 *
 * The presets are machine files like any other, kept here as text and read
 * by the same parser, each with its figures' sources in "source". Published
 * figures: the datasheets' dense peaks and memory bandwidths, the NVLink
 * bandwidth per GPU per direction (half the bidirectional figure), one
 * 400 Gb/s (H100) or 200 Gb/s (A100) InfiniBand NIC per GPU. Assumed, and
 * said so in "source": the GEMM efficiency at large and small shapes, the
 * attention kernels' share of the peak, the collectives' latencies and the
 * gap between kernels; `dpexec --calibrate` is what measures a machine.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "machine.h"

typedef struct {
	const char *name, *json;
} Preset;

static const Preset presets[] = {
	{"h100-nvlink",
	 "{\"name\": \"h100-nvlink\","
	 " \"source\": \"NVIDIA H100 SXM5 datasheet: 989.4 TFLOP/s dense bf16, 66.9 fp32, HBM3 "
	 "3.35 TB/s; NVLink 4: 900 GB/s per GPU (450 per direction), 8 GPUs per HGX node; "
	 "ConnectX-7 InfiniBand NDR 400 Gb/s (50 GB/s) per GPU. Assumed: GEMMs at 75 % of the "
	 "peak at 8192^3 and 45 % at 1024^3, attention at 50 %, 10 us per intra-node collective "
	 "and 20 us across nodes, 2 us between kernels\","
	 " \"executor\": \"gpu\","
	 " \"peak_flops\": {\"f32\": 66.9e12, \"bf16\": 989.4e12},"
	 " \"gemm\": ["
	 "  {\"dtype\": \"bf16\", \"m\": 8192, \"n\": 8192, \"k\": 8192, \"flops_per_s\": 742e12},"
	 "  {\"dtype\": \"bf16\", \"m\": 1024, \"n\": 1024, \"k\": 1024, \"flops_per_s\": 445e12},"
	 "  {\"dtype\": \"f32\", \"m\": 8192, \"n\": 8192, \"k\": 8192, \"flops_per_s\": 50.2e12},"
	 "  {\"dtype\": \"f32\", \"m\": 1024, \"n\": 1024, \"k\": 1024, \"flops_per_s\": 30.1e12}],"
	 " \"memory_bw\": 3.35e12, \"kernel_overhead_s\": 2e-6,"
	 " \"ops\": {\"attention\": {\"flops_per_s\": 494.7e12},"
	 "          \"attention_grad\": {\"flops_per_s\": 494.7e12}},"
	 " \"ranks_per_node\": 8,"
	 " \"intra\": {\"alpha_s\": 10e-6, \"busbw\": 450e9},"
	 " \"inter\": {\"alpha_s\": 20e-6, \"busbw\": 50e9},"
	 " \"p2p\": {\"alpha_s\": 10e-6, \"busbw\": 50e9}}"},
	{"a100-nvlink",
	 "{\"name\": \"a100-nvlink\","
	 " \"source\": \"NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s dense bf16, 19.5 fp32, HBM2e "
	 "2.039 TB/s; NVLink 3: 600 GB/s per GPU (300 per direction), 8 GPUs per HGX node; "
	 "InfiniBand HDR 200 Gb/s (25 GB/s) per GPU. Assumed: GEMMs at 75 % of the peak at 8192^3 "
	 "and 45 % at 1024^3, attention at 50 %, 10 us per intra-node collective and 20 us across "
	 "nodes, 2 us between kernels\","
	 " \"executor\": \"gpu\","
	 " \"peak_flops\": {\"f32\": 19.5e12, \"bf16\": 312e12},"
	 " \"gemm\": ["
	 "  {\"dtype\": \"bf16\", \"m\": 8192, \"n\": 8192, \"k\": 8192, \"flops_per_s\": 234e12},"
	 "  {\"dtype\": \"bf16\", \"m\": 1024, \"n\": 1024, \"k\": 1024, \"flops_per_s\": 140e12},"
	 "  {\"dtype\": \"f32\", \"m\": 8192, \"n\": 8192, \"k\": 8192, \"flops_per_s\": 14.6e12},"
	 "  {\"dtype\": \"f32\", \"m\": 1024, \"n\": 1024, \"k\": 1024, \"flops_per_s\": 8.8e12}],"
	 " \"memory_bw\": 2.039e12, \"kernel_overhead_s\": 2e-6,"
	 " \"ops\": {\"attention\": {\"flops_per_s\": 156e12},"
	 "          \"attention_grad\": {\"flops_per_s\": 156e12}},"
	 " \"ranks_per_node\": 8,"
	 " \"intra\": {\"alpha_s\": 10e-6, \"busbw\": 300e9},"
	 " \"inter\": {\"alpha_s\": 20e-6, \"busbw\": 25e9},"
	 " \"p2p\": {\"alpha_s\": 10e-6, \"busbw\": 25e9}}"},
};

const char *machine_presets(void)
{
	return "h100-nvlink, a100-nvlink";
}

static int fail(char *err, size_t errlen, const char *what, const char *fmt, const char *key)
{
	char msg[256];
	snprintf(msg, sizeof msg, fmt, key);
	snprintf(err, errlen, "%s: %s", what, msg);
	return -1;
}

/* A positive number at key of o (optional: absent leaves *v). */
static int num(const cJSON *o, const char *key, double *v, int required, const char *what, char *err,
	       size_t errlen)
{
	const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!x)
		return required ? fail(err, errlen, what, "no \"%s\"", key) : 0;
	if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || !isfinite(x->valuedouble))
		return fail(err, errlen, what, "\"%s\" is not a number >= 0", key);
	*v = x->valuedouble;
	return 0;
}

static int dtype_of(const char *s)
{
	return !strcmp(s, "f32") ? MACH_F32 : !strcmp(s, "bf16") ? MACH_BF16 : -1;
}


static int link_of(const cJSON *root, const char *key, MachLink *l, const char *what, char *err,
		   size_t errlen)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, key);
	if (!cJSON_IsObject(o))
		return fail(err, errlen, what, "no \"%s\" object {\"alpha_s\", \"busbw\"}", key);
	if (num(o, "alpha_s", &l->alpha_s, 1, what, err, errlen) < 0 ||
	    num(o, "busbw", &l->busbw, 1, what, err, errlen) < 0)
		return -1;
	if (l->busbw <= 0)
		return fail(err, errlen, what, "\"%s\" has a busbw of 0", key);
	return 0;
}

static const char *const dtype_names[MACH_NDTYPE] = {"f32", "bf16"};

/* (kind, x, input order, seconds) by kind, x, then input order */
static int by_point(const void *a, const void *b)
{
	const double *x = a, *y = b;
	for (int i = 0; i < 3; i++)
		if (x[i] != y[i])
			return (x[i] > y[i]) - (x[i] < y[i]);
	return 0;
}

int machine_line_kind(MachLine *l, const char *name)
{
	for (int i = 0; i < l->nkinds; i++)
		if (!strcmp(l->kinds[i], name))
			return i;
	if (l->nkinds == MACH_NKIND || !(l->kinds[l->nkinds] = strdup(name)))
		return -1;
	return l->nkinds++;
}

int machine_line_points(MachLine *l, const double *xt, const int *kind, int npts)
{
	double *p = malloc(sizeof *p * 2 * ((size_t)npts + 1));
	int *pk = malloc(sizeof *pk * ((size_t)npts + 1));
	/* stable for a repeated (kind, x): sort, then keep each one's last
	 * pair in the input order (qsort is not stable: mark the order first) */
	double *q = malloc(sizeof *q * 4 * ((size_t)npts + 1));
	if (!p || !pk || !q) {
		free(p);
		free(pk);
		free(q);
		return -1;
	}
	for (int i = 0; i < npts; i++) {
		q[4 * i] = kind ? kind[i] : -1;
		q[4 * i + 1] = xt[2 * i];
		q[4 * i + 2] = i;
		q[4 * i + 3] = xt[2 * i + 1];
	}
	qsort(q, (size_t)npts, 4 * sizeof *q, by_point);
	int n = 0;
	for (int i = 0; i < npts; i++) {
		if (n && pk[n - 1] == (int)q[4 * i] && p[2 * (n - 1)] == q[4 * i + 1])
			n--; /* the same kind and x again, later in the input: it replaces */
		pk[n] = (int)q[4 * i];
		p[2 * n] = q[4 * i + 1];
		p[2 * n + 1] = q[4 * i + 3];
		n++;
	}
	free(q);
	free(l->pts);
	free(l->kind);
	l->pts = p;
	l->kind = pk;
	l->npts = n;
	return 0;
}

/* An op's line (the one for every dtype: the op's object itself, dt "";
 * else its "f32" or "bf16" object) from o. */
static int line_of(const cJSON *o, const char *op, const char *dt, MachLine *l, const char *what,
		   char *err, size_t errlen)
{
	if (num(o, "flops_per_s", &l->flops_per_s, 0, what, err, errlen) < 0 ||
	    num(o, "bytes_per_s", &l->bytes_per_s, 0, what, err, errlen) < 0 ||
	    num(o, "overhead_s", &l->overhead_s, 0, what, err, errlen) < 0)
		return -1;
	char key[160];
	snprintf(key, sizeof key, "%s%s%s", op, *dt ? "\" \"" : "", dt);
	const cJSON *fit = cJSON_GetObjectItemCaseSensitive(o, "fit");
	if (fit && (!cJSON_IsString(fit) || (strcmp(fit->valuestring, "bytes") &&
					      strcmp(fit->valuestring, "flops"))))
		return fail(err, errlen, what, "op \"%s\": \"fit\" is not \"bytes\" or \"flops\"", key);
	l->by_flops = fit && !strcmp(fit->valuestring, "flops");
	l->given = *dt || l->flops_per_s > 0 || l->bytes_per_s > 0 || l->overhead_s > 0;
	const cJSON *pts = cJSON_GetObjectItemCaseSensitive(o, "points"), *p;
	if (!pts)
		return 0;
	if (!*dt)
		return fail(err, errlen, what, "op \"%s\": \"points\" belong in its \"f32\" or "
			    "\"bf16\" line", key);
	int n = cJSON_IsArray(pts) ? cJSON_GetArraySize(pts) : -1, i = 0, full = 0;
	double *xt = malloc(sizeof *xt * 2 * ((size_t)(n > 0 ? n : 0) + 1));
	int *kind = malloc(sizeof *kind * ((size_t)(n > 0 ? n : 0) + 1));
	if (!xt || !kind) {
		free(xt);
		free(kind);
		return fail(err, errlen, what, "%s", "out of memory");
	}
	const cJSON *list = n >= 0 ? pts : NULL;
	cJSON_ArrayForEach(p, list)
	{
		/* [x, seconds] or, a kernel's kind beside them, [x, seconds, "KIND"] */
		const cJSON *a = cJSON_GetArrayItem(p, 0), *b = cJSON_GetArrayItem(p, 1);
		const cJSON *k = cJSON_GetArrayItem(p, 2);
		int len = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
		if ((len != 2 && len != 3) || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
		    !(a->valuedouble > 0) || !(b->valuedouble > 0) || !isfinite(a->valuedouble) ||
		    !isfinite(b->valuedouble) || (len == 3 && (!cJSON_IsString(k) || !*k->valuestring))) {
			n = -1;
			break;
		}
		xt[2 * i] = a->valuedouble;
		xt[2 * i + 1] = b->valuedouble;
		kind[i] = len == 3 ? machine_line_kind(l, k->valuestring) : -1;
		if (len == 3 && kind[i] < 0) {
			full = 1;
			break;
		}
		i++;
	}
	int rc = full ? fail(err, errlen, what, "op \"%s\": \"points\" name more than 8 kinds (or out of "
			     "memory)", key)
	       : n < 0 ? fail(err, errlen, what, "op \"%s\": \"points\" is not an array of [x, seconds] "
			      "or [x, seconds, \"kind\"] with numbers > 0", key)
	       : machine_line_points(l, xt, kind, n) < 0 ? fail(err, errlen, what, "%s", "out of memory") : 0;
	free(xt);
	free(kind);
	return rc;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

int machine_parse(Machine *m, const char *text, const char *what, char *err, size_t errlen)
{
	memset(m, 0, sizeof *m);
	cJSON *root = cJSON_Parse(text);
	if (!root) {
		const char *at = cJSON_GetErrorPtr();
		int line = 1;
		for (const char *p = text; at && p < at && *p; p++)
			line += *p == '\n';
		snprintf(err, errlen, "%s:%d: not valid JSON", what, line);
		return -1;
	}
	int rc = -1;
	const cJSON *x;
	if (!cJSON_IsObject(root)) {
		fail(err, errlen, what, "%s", "not a JSON object");
		goto out;
	}
	x = cJSON_GetObjectItemCaseSensitive(root, "name");
	m->name = dup_or_null(cJSON_IsString(x) ? x->valuestring : what);
	x = cJSON_GetObjectItemCaseSensitive(root, "source");
	m->source = dup_or_null(cJSON_IsString(x) ? x->valuestring : "");
	x = cJSON_GetObjectItemCaseSensitive(root, "executor");
	if (!cJSON_IsString(x) || (strcmp(x->valuestring, "gpu") && strcmp(x->valuestring, "cpu"))) {
		fail(err, errlen, what, "%s", "\"executor\" is not \"gpu\" or \"cpu\"");
		goto out;
	}
	m->executor = strcmp(x->valuestring, "cpu") ? MACH_GPU : MACH_CPU;
	x = cJSON_GetObjectItemCaseSensitive(root, "peak_flops");
	if (!cJSON_IsObject(x) || num(x, "f32", &m->peak_flops[MACH_F32], 1, what, err, errlen) < 0 ||
	    num(x, "bf16", &m->peak_flops[MACH_BF16], 1, what, err, errlen) < 0) {
		if (!cJSON_IsObject(x))
			fail(err, errlen, what, "%s", "no \"peak_flops\" object {\"f32\", \"bf16\"}");
		goto out;
	}
	if (m->peak_flops[MACH_F32] <= 0 || m->peak_flops[MACH_BF16] <= 0) {
		fail(err, errlen, what, "%s", "a \"peak_flops\" of 0");
		goto out;
	}
	double rpn = 0;
	if (num(root, "memory_bw", &m->memory_bw, 1, what, err, errlen) < 0 ||
	    num(root, "kernel_overhead_s", &m->kernel_overhead_s, 0, what, err, errlen) < 0 ||
	    num(root, "node_overhead_s", &m->node_overhead_s, 0, what, err, errlen) < 0 ||
	    num(root, "node_overhead_n", &m->node_overhead_n, 0, what, err, errlen) < 0 ||
	    num(root, "ranks_per_node", &rpn, 1, what, err, errlen) < 0)
		goto out;
	if (m->memory_bw <= 0 || rpn < 1 || rpn != floor(rpn) || rpn > 1 << 20) {
		fail(err, errlen, what, "%s", "\"memory_bw\" is 0 or \"ranks_per_node\" not a positive integer");
		goto out;
	}
	m->ranks_per_node = (int)rpn;
	if (link_of(root, "intra", &m->link[MACH_INTRA], what, err, errlen) < 0 ||
	    link_of(root, "inter", &m->link[MACH_INTER], what, err, errlen) < 0 ||
	    link_of(root, "p2p", &m->link[MACH_P2P], what, err, errlen) < 0)
		goto out;
	x = cJSON_GetObjectItemCaseSensitive(root, "gemm");
	if (x && !cJSON_IsArray(x)) {
		fail(err, errlen, what, "%s", "\"gemm\" is not an array");
		goto out;
	}
	m->ngemm = x ? cJSON_GetArraySize(x) : 0;
	m->gemm = calloc(m->ngemm ? (size_t)m->ngemm : 1, sizeof *m->gemm);
	if (!m->gemm) {
		fail(err, errlen, what, "%s", "out of memory");
		goto out;
	}
	int i = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, x)
	{
		MachGemm *gm = &m->gemm[i++];
		const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
		if (!cJSON_IsString(dt) || (gm->dtype = dtype_of(dt->valuestring)) < 0) {
			fail(err, errlen, what, "%s", "a \"gemm\" point's \"dtype\" is not \"f32\" or \"bf16\"");
			goto out;
		}
		if (num(e, "m", &gm->m, 1, what, err, errlen) < 0 || num(e, "n", &gm->n, 1, what, err, errlen) < 0 ||
		    num(e, "k", &gm->k, 1, what, err, errlen) < 0 ||
		    num(e, "flops_per_s", &gm->flops_per_s, 1, what, err, errlen) < 0)
			goto out;
		if (gm->m < 1 || gm->n < 1 || gm->k < 1 || gm->flops_per_s <= 0) {
			fail(err, errlen, what, "%s", "a \"gemm\" point with a size or rate of 0");
			goto out;
		}
	}
	x = cJSON_GetObjectItemCaseSensitive(root, "ops");
	if (x && !cJSON_IsObject(x)) {
		fail(err, errlen, what, "%s", "\"ops\" is not an object");
		goto out;
	}
	m->nops = x ? cJSON_GetArraySize(x) : 0;
	m->ops = calloc(m->nops ? (size_t)m->nops : 1, sizeof *m->ops);
	if (!m->ops) {
		fail(err, errlen, what, "%s", "out of memory");
		goto out;
	}
	i = 0;
	cJSON_ArrayForEach(e, x)
	{
		MachOp *op = &m->ops[i++];
		if (!cJSON_IsObject(e)) {
			fail(err, errlen, what, "op \"%s\" is not an object", e->string);
			goto out;
		}
		op->op = strdup(e->string);
		if (!op->op) {
			fail(err, errlen, what, "%s", "out of memory");
			goto out;
		}
		if (line_of(e, e->string, "", &op->line[MACH_ANY], what, err, errlen) < 0)
			goto out;
		for (int d = 0; d < MACH_NDTYPE; d++) {
			const cJSON *dl = cJSON_GetObjectItemCaseSensitive(e, dtype_names[d]);
			if (dl && !cJSON_IsObject(dl)) {
				char key[160];
				snprintf(key, sizeof key, "%s\" \"%s", e->string, dtype_names[d]);
				fail(err, errlen, what, "op \"%s\" is not an object", key);
				goto out;
			}
			if (dl && line_of(dl, e->string, dtype_names[d], &op->line[d], what, err, errlen) < 0)
				goto out;
		}
	}
	rc = 0;
out:
	cJSON_Delete(root);
	if (rc < 0)
		machine_free(m);
	return rc;
}

int machine_load(Machine *m, const char *spec, char *err, size_t errlen)
{
	for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
		if (!strcmp(presets[i].name, spec))
			return machine_parse(m, presets[i].json, spec, err, errlen);
	FILE *f = fopen(spec, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: no such preset (%s) and cannot open it as a machine file",
			 spec, machine_presets());
		return -1;
	}
	size_t cap = 1 << 16, n = 0, k;
	char *text = malloc(cap);
	while (text && (k = fread(text + n, 1, cap - n - 1, f)) > 0) {
		n += k;
		if (n + 1 == cap) {
			char *t = realloc(text, cap *= 2);
			if (!t)
				free(text);
			text = t;
		}
	}
	int bad = ferror(f);
	fclose(f);
	if (!text || bad) {
		free(text);
		snprintf(err, errlen, "%s: cannot read it", spec);
		return -1;
	}
	text[n] = 0;
	int rc = machine_parse(m, text, spec, err, errlen);
	free(text);
	return rc;
}

void machine_free(Machine *m)
{
	for (int i = 0; m->ops && i < m->nops; i++) {
		free(m->ops[i].op);
		for (int d = 0; d <= MACH_NDTYPE; d++) {
			MachLine *l = &m->ops[i].line[d];
			free(l->pts);
			free(l->kind);
			for (int k = 0; k < l->nkinds; k++)
				free(l->kinds[k]);
		}
	}
	free(m->ops);
	free(m->gemm);
	free(m->name);
	free(m->source);
	memset(m, 0, sizeof *m);
}

static cJSON *link_json(const MachLink *l)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "alpha_s", l->alpha_s);
	cJSON_AddNumberToObject(o, "busbw", l->busbw);
	return o;
}

static void line_json(cJSON *p, const MachLine *l)
{
	if (l->flops_per_s > 0)
		cJSON_AddNumberToObject(p, "flops_per_s", l->flops_per_s);
	if (l->bytes_per_s > 0)
		cJSON_AddNumberToObject(p, "bytes_per_s", l->bytes_per_s);
	if (l->overhead_s > 0)
		cJSON_AddNumberToObject(p, "overhead_s", l->overhead_s);
	if (l->by_flops)
		cJSON_AddStringToObject(p, "fit", "flops");
	if (l->npts) {
		cJSON *a = cJSON_AddArrayToObject(p, "points");
		for (int j = 0; j < l->npts; j++) {
			cJSON *q = cJSON_CreateArray();
			cJSON_AddItemToArray(q, cJSON_CreateNumber(l->pts[2 * j]));
			cJSON_AddItemToArray(q, cJSON_CreateNumber(l->pts[2 * j + 1]));
			if (l->kind && l->kind[j] >= 0)
				cJSON_AddItemToArray(q, cJSON_CreateString(l->kinds[l->kind[j]]));
			cJSON_AddItemToArray(a, q);
		}
	}
}

char *machine_json(const Machine *m)
{
	const char *const *dt = dtype_names;
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "name", m->name ? m->name : "");
	cJSON_AddStringToObject(o, "source", m->source ? m->source : "");
	cJSON_AddStringToObject(o, "executor", m->executor == MACH_CPU ? "cpu" : "gpu");
	cJSON *pk = cJSON_AddObjectToObject(o, "peak_flops");
	for (int d = 0; d < MACH_NDTYPE; d++)
		cJSON_AddNumberToObject(pk, dt[d], m->peak_flops[d]);
	cJSON *ga = cJSON_AddArrayToObject(o, "gemm");
	for (int i = 0; i < m->ngemm; i++) {
		cJSON *p = cJSON_CreateObject();
		cJSON_AddStringToObject(p, "dtype", dt[m->gemm[i].dtype]);
		cJSON_AddNumberToObject(p, "m", m->gemm[i].m);
		cJSON_AddNumberToObject(p, "n", m->gemm[i].n);
		cJSON_AddNumberToObject(p, "k", m->gemm[i].k);
		cJSON_AddNumberToObject(p, "flops_per_s", m->gemm[i].flops_per_s);
		cJSON_AddItemToArray(ga, p);
	}
	cJSON_AddNumberToObject(o, "memory_bw", m->memory_bw);
	cJSON_AddNumberToObject(o, "kernel_overhead_s", m->kernel_overhead_s);
	if (m->node_overhead_s > 0 || m->node_overhead_n > 0) {
		cJSON_AddNumberToObject(o, "node_overhead_s", m->node_overhead_s);
		cJSON_AddNumberToObject(o, "node_overhead_n", m->node_overhead_n);
	}
	cJSON *ops = cJSON_AddObjectToObject(o, "ops");
	for (int i = 0; i < m->nops; i++) {
		cJSON *p = cJSON_AddObjectToObject(ops, m->ops[i].op);
		line_json(p, &m->ops[i].line[MACH_ANY]);
		for (int d = 0; d < MACH_NDTYPE; d++)
			if (m->ops[i].line[d].given)
				line_json(cJSON_AddObjectToObject(p, dt[d]), &m->ops[i].line[d]);
	}
	cJSON_AddNumberToObject(o, "ranks_per_node", m->ranks_per_node);
	cJSON_AddItemToObject(o, "intra", link_json(&m->link[MACH_INTRA]));
	cJSON_AddItemToObject(o, "inter", link_json(&m->link[MACH_INTER]));
	cJSON_AddItemToObject(o, "p2p", link_json(&m->link[MACH_P2P]));
	char *text = cJSON_Print(o);
	cJSON_Delete(o);
	return text;
}

/* The rate at q of the points of dtype that bracket q on one axis with the
 * other two the same (to 1 %: a fused GELU GEMM's k, derived from FLOPs that
 * count its GELU, is 0.7 % above the k its point was measured at), log rate
 * linear in the log of that axis between the nearest two; 0 where no axis
 * has such a pair. A model calibrated at two micro-batches holds each GEMM
 * at both, differing in the tokens only (m, or k for a weight gradient):
 * a size between them is that GEMM between its own two points, which the
 * inverse-distance rule below blends with every other shape of the table
 * (at GPT-2 124M's micro-batch 4 between 2 and 8, the 768 x 768 weight
 * gradients' 190-300 TFLOP/s pulled the 4096 x 768 x 3072 product from
 * its points' 677 to 519 TFLOP/s: docs/SIMULATE.md, "Validation on a
 * GPU"). */
static double gemm_bracketed(const Machine *m, int dtype, const double q[3])
{
	for (int a = 0; a < 3; a++) {
		const MachGemm *lo = NULL, *hi = NULL;
		double xlo = 0, xhi = 0;
		for (int i = 0; i < m->ngemm; i++) {
			const MachGemm *g = &m->gemm[i];
			double p[3] = {g->m, g->n, g->k};
			int same = g->dtype == dtype;
			for (int b = 0; b < 3 && same; b++)
				same = b == a || fabs(log(q[b] / p[b])) < 0.01;
			if (!same)
				continue;
			if (p[a] < q[a] && (!lo || p[a] > xlo)) {
				lo = g;
				xlo = p[a];
			} else if (p[a] > q[a] && (!hi || p[a] < xhi)) {
				hi = g;
				xhi = p[a];
			}
		}
		if (lo && hi) {
			double w = log(q[a] / xlo) / log(xhi / xlo);
			return exp(log(lo->flops_per_s) + w * (log(hi->flops_per_s) - log(lo->flops_per_s)));
		}
	}
	return 0;
}

double machine_gemm_rate(const Machine *m, int dtype, double mm, double nn, double kk)
{
	double wsum = 0, lsum = 0;
	for (int i = 0; i < m->ngemm; i++) { /* a point of its own shape (to 1 %): its rate */
		const MachGemm *g = &m->gemm[i];
		if (g->dtype == dtype && fabs(log(mm / g->m)) < 0.01 && fabs(log(nn / g->n)) < 0.01 &&
		    fabs(log(kk / g->k)) < 0.01)
			return g->flops_per_s;
	}
	const double q[3] = {mm, nn, kk};
	double r = gemm_bracketed(m, dtype, q);
	if (r > 0)
		return r;
	for (int i = 0; i < m->ngemm; i++) {
		const MachGemm *g = &m->gemm[i];
		if (g->dtype != dtype)
			continue;
		double a = log(mm / g->m), b = log(nn / g->n), c = log(kk / g->k);
		double d2 = a * a + b * b + c * c;
		if (d2 < 1e-12)
			return g->flops_per_s;
		wsum += 1 / d2;
		lsum += log(g->flops_per_s) / d2;
	}
	return wsum > 0 ? exp(lsum / wsum) : m->peak_flops[dtype];
}

const MachOp *machine_op(const Machine *m, const char *op)
{
	for (int i = 0; i < m->nops; i++)
		if (!strcmp(m->ops[i].op, op))
			return &m->ops[i];
	return NULL;
}

const MachLine *machine_op_line(const Machine *m, const char *op, int dtype, int *borrowed)
{
	const MachOp *o = machine_op(m, op);
	*borrowed = 0;
	if (!o)
		return NULL;
	if (o->line[dtype].given)
		return &o->line[dtype];
	if (o->line[MACH_ANY].given)
		return &o->line[MACH_ANY];
	*borrowed = o->line[!dtype].given;
	return *borrowed ? &o->line[!dtype] : NULL;
}

void machine_op_figures(const Machine *m, const char *op, int dtype, double *flops_per_s,
			double *bytes_per_s, double *overhead_s)
{
	const MachOp *o = machine_op(m, op);
	if (!o)
		return;
	/* the order of precedence: the dtype's line, the line for every
	 * dtype; the other dtype's only where the op has neither */
	const MachLine *l[3] = {&o->line[dtype], &o->line[MACH_ANY], NULL};
	if (!l[0]->given && !l[1]->given)
		l[2] = &o->line[!dtype];
	double *v[3] = {flops_per_s, bytes_per_s, overhead_s};
	for (int f = 0; f < 3; f++)
		for (int k = 0; k < 3; k++) {
			if (!l[k])
				continue;
			double x = f == 0 ? l[k]->flops_per_s : f == 1 ? l[k]->bytes_per_s : l[k]->overhead_s;
			if (x > 0) {
				*v[f] = x;
				break;
			}
		}
}

/* The points of l an instruction of kind (NULL: none) is priced among: its
 * kind's where the line has some, else those without a kind (a line
 * written before kinds has only those: priced as it was). [*lo, *hi): none
 * when *lo == *hi. The points are sorted by kind, so each kind's are a run. */
static void kind_points(const MachLine *l, const char *kind, int *lo, int *hi)
{
	int want = -1;
	for (int k = 0; kind && k < l->nkinds; k++)
		if (!strcmp(l->kinds[k], kind))
			want = k;
	for (int pass = 0; pass < 2; pass++, want = -1) {
		*lo = *hi = 0;
		while (*lo < l->npts && l->kind[*lo] != want)
			(*lo)++;
		*hi = *lo;
		while (*hi < l->npts && l->kind[*hi] == want)
			(*hi)++;
		if (*hi > *lo)
			return;
	}
}

/* The time at x of the n points p: their piecewise-linear interpolation,
 * outside them the line scaled to meet the nearest point. */
static double points_seconds(const double *p, int n, double x, double overhead, double rate)
{
	int lo = 0, hi = n - 1;
	if (x <= p[0] || x >= p[2 * hi]) { /* outside: the line through the nearest point */
		int e = x <= p[0] ? 0 : hi;
		double at = overhead + p[2 * e] / rate;
		return at > 0 ? p[2 * e + 1] * (overhead + x / rate) / at : p[2 * e + 1];
	}
	while (hi - lo > 1) { /* p[2 lo] < x < p[2 hi] */
		int mid = (lo + hi) / 2;
		if (p[2 * mid] <= x)
			lo = mid;
		else
			hi = mid;
	}
	double w = (x - p[2 * lo]) / (p[2 * hi] - p[2 * lo]);
	return p[2 * lo + 1] + w * (p[2 * hi + 1] - p[2 * lo + 1]);
}

double machine_points_seconds(const MachLine *l, double x, double overhead, double rate,
			      const char *kind)
{
	int lo, hi;
	kind_points(l, kind, &lo, &hi);
	return hi > lo ? points_seconds(l->pts + 2 * lo, hi - lo, x, overhead, rate) : overhead + x / rate;
}

int machine_has_kinds(const Machine *m)
{
	for (int i = 0; i < m->nops; i++)
		for (int d = 0; d <= MACH_NDTYPE; d++)
			for (int j = 0; j < m->ops[i].line[d].npts; j++)
				if (m->ops[i].line[d].kind[j] >= 0)
					return 1;
	return 0;
}

double machine_op_seconds(const Machine *m, const char *op, int dtype, int gemm, double flops,
			  double bytes, double rate, double bw, double overhead, const char *kind)
{
	machine_op_figures(m, op, dtype, &rate, &bw, &overhead);
	int borrowed;
	const MachLine *l = machine_op_line(m, op, dtype, &borrowed);
	if (gemm || !l || !l->npts) /* the line */
		return overhead + fmax(flops / rate, bytes / bw);
	/* the points give the fitted term (with its overhead), the other
	 * term stays a roofline bound beside it */
	if (l->by_flops)
		return fmax(machine_points_seconds(l, flops, overhead, rate, kind), overhead + bytes / bw);
	return fmax(machine_points_seconds(l, bytes, overhead, bw, kind), overhead + flops / rate);
}
