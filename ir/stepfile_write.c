/*
 * stepfile_write.c - the planned graph as a step file (dpc's output).
 *
 * ir_build_step turns a memory-planned graph into the in-memory DpStep that
 * format/stepfile.c encodes; ir_write_step writes it atomically. The mapping
 * (format/stepfile.h describes the records):
 * - tensor id = value id, for every value (an unused temporary is a tensor
 *   with offset 0 and nbytes 0, so the ids never need renumbering);
 * - DpTensor from the value: per-rank dims, arena offset/nbytes, placement
 *   per axis, initialiser; init_base 0 (the INIT program initialises every
 *   parameter whole and SHARDs it afterwards, passes/setup.c: a per-rank
 *   base is something one rank-agnostic number cannot carry);
 * - sources with their path in the string table and tensor = value id;
 * - source = the .dp file's path (g->file) in the string table;
 * - program p = the nodes with IR_PROG_BIT(p) in progs, in order (STEP,
 *   EVAL, INIT, EXPORT); each instruction a copy of its node.
 * The string table starts with "" (offset 0) and stores each distinct name
 * once.
 */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* The string table being built, with an open-addressing hash of offsets
 * (slot value offset+1; 0 = empty) so interning stays linear. */
typedef struct {
	char *buf;
	uint32_t len, cap;
	uint32_t *slots;
	uint32_t nslots, nused;
} Strings;

static uint32_t str_hash(const char *s)
{
	uint32_t h = 2166136261u; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

static int str_rehash(Strings *t, uint32_t nslots)
{
	uint32_t *slots = calloc(nslots, sizeof(uint32_t));
	if (!slots)
		return -1;
	for (uint32_t i = 0; i < t->nslots; i++) {
		uint32_t v = t->slots[i];
		if (!v)
			continue;
		uint32_t h = str_hash(t->buf + v - 1) & (nslots - 1);
		while (slots[h])
			h = (h + 1) & (nslots - 1);
		slots[h] = v;
	}
	free(t->slots);
	t->slots = slots;
	t->nslots = nslots;
	return 0;
}

/* Offset of s in the table, adding it if new; UINT32_MAX when out of memory. */
static uint32_t str_intern(Strings *t, const char *s)
{
	if (2 * (t->nused + 1) > t->nslots && str_rehash(t, t->nslots ? 2 * t->nslots : 64) < 0)
		return UINT32_MAX;
	uint32_t h = str_hash(s) & (t->nslots - 1);
	for (; t->slots[h]; h = (h + 1) & (t->nslots - 1))
		if (strcmp(t->buf + t->slots[h] - 1, s) == 0)
			return t->slots[h] - 1;
	size_t n = strlen(s) + 1;
	if (t->len + n > t->cap) {
		uint32_t cap = t->cap ? t->cap : 256;
		while (t->len + n > cap)
			cap *= 2;
		char *nb = realloc(t->buf, cap);
		if (!nb)
			return UINT32_MAX;
		t->buf = nb;
		t->cap = cap;
	}
	memcpy(t->buf + t->len, s, n);
	uint32_t off = t->len;
	t->len += (uint32_t)n;
	t->slots[h] = off + 1;
	t->nused++;
	return off;
}

static void fill_tensor(const Graph *g, const Value *v, DpTensor *t, uint32_t name)
{
	memset(t, 0, sizeof *t);
	t->name = name;
	t->dtype = (uint8_t)v->dtype;
	t->kind = (uint8_t)v->kind;
	t->ndim = (uint8_t)v->ndim;
	t->init = (uint8_t)v->init;
	for (int i = 0; i < DP_MAX_DIMS; i++)
		t->dims[i] = i < v->ndim ? v->dims[i] : 0;
	t->space = (uint8_t)v->space;
	if (v->offset >= 0) {
		t->offset = (uint64_t)v->offset;
		t->nbytes = (uint64_t)v->nbytes;
	}
	for (int a = 0; a < DP_MAX_AXES; a++) {
		t->place[a] = v->place[a].kind;
		t->place_dim[a] = v->place[a].kind == DP_PL_SHARD ? v->place[a].dim : -1;
	}
	t->init_a = v->init_a;
	t->init_b = v->init_b;
	t->init_base = 0;
	t->ld = v->ld; /* 0: dense */
	(void)g;
}

static void fill_instr(const Node *n, DpInstr *in)
{
	memset(in, 0, sizeof *in);
	in->op = (uint16_t)n->op;
	in->stream = (uint8_t)n->stream;
	in->flags = (uint8_t)n->flags;
	in->stage1 = (uint16_t)(n->stage + 1);
	for (int i = 0; i < DP_MAX_IN; i++)
		in->in[i] = i < n->nin ? n->in[i] : -1;
	in->out = n->out;
	/* the attributes as they are: a node's slots are an instruction's */
	_Static_assert(sizeof in->ia == sizeof n->ia && sizeof in->fa == sizeof n->fa,
		       "Node and DpInstr carry the same attributes");
	memcpy(in->ia, n->ia, sizeof in->ia);
	memcpy(in->fa, n->fa, sizeof in->fa);
}

int ir_build_step(const Graph *g, DpStep *s, char *err, size_t errlen)
{
	memset(s, 0, sizeof *s);
	Strings t = {0};
	s->cfg = g->cfg;
	s->opt = g->opt;
	s->sched = g->sched;
	s->metrics = g->metrics;
	s->nevents = (uint32_t)g->nevents;
	if (g->peak_bytes <= 0 && g->nvalues > 0) {
		snprintf(err, errlen, "internal error: the graph has no memory plan");
		return -1;
	}
	if (str_intern(&t, "") == UINT32_MAX)
		goto oom;
	s->source = str_intern(&t, g->file ? g->file : "");
	if (s->source == UINT32_MAX)
		goto oom;

	s->ntensors = (uint32_t)g->nvalues;
	s->tensors = calloc(s->ntensors ? s->ntensors : 1, sizeof(DpTensor));
	if (!s->tensors)
		goto oom;
	for (int i = 0; i < g->nvalues; i++) {
		uint32_t name = str_intern(&t, g->values[i]->name);
		if (name == UINT32_MAX)
			goto oom;
		fill_tensor(g, g->values[i], &s->tensors[i], name);
	}

	s->nsources = (uint32_t)g->nsources;
	s->sources = calloc(s->nsources ? s->nsources : 1, sizeof(DpSource));
	if (!s->sources)
		goto oom;
	for (int i = 0; i < g->nsources; i++) {
		const Source *src = &g->sources[i];
		DpSource *r = &s->sources[i];
		*r = src->rec;
		r->path = str_intern(&t, src->path ? src->path : "");
		if (r->path == UINT32_MAX)
			goto oom;
		r->tensor = src->value;
		if (src->loc.line > 0)
			r->src_line = (uint32_t)src->loc.line;
	}

	for (int p = 0; p < DP_NPROG; p++) {
		unsigned bit = IR_PROG_BIT(p);
		uint32_t n = 0;
		for (int i = 0; i < g->nnodes; i++)
			n += (g->nodes[i]->progs & bit) != 0;
		s->prog[p] = calloc(n ? n : 1, sizeof(DpInstr));
		if (!s->prog[p])
			goto oom;
		s->nprog[p] = n;
		n = 0;
		for (int i = 0; i < g->nnodes; i++)
			if (g->nodes[i]->progs & bit)
				fill_instr(g->nodes[i], &s->prog[p][n++]);
	}
	s->strings = t.buf;
	s->nstrings = t.len;
	free(t.slots);
	return 0;
oom:
	free(t.buf);
	free(t.slots);
	dpstep_free(s);
	snprintf(err, errlen, "out of memory building the step file");
	return -1;
}

void ir_build_program(const Graph *g, int prog, DpStep *s)
{
	memset(s, 0, sizeof *s);
	s->cfg = g->cfg;
	s->ntensors = (uint32_t)g->nvalues;
	s->tensors = calloc(s->ntensors ? s->ntensors : 1, sizeof(DpTensor));
	uint32_t n = 0;
	for (int i = 0; i < g->nnodes; i++)
		n += (g->nodes[i]->progs & IR_PROG_BIT(prog)) != 0;
	s->prog[prog] = calloc(n ? n : 1, sizeof(DpInstr));
	if (!s->tensors || !s->prog[prog])
		die("out of memory");
	for (int i = 0; i < g->nvalues; i++) {
		fill_tensor(g, g->values[i], &s->tensors[i], 0);
		if (g->values[i]->offset < 0 || g->peak_bytes <= 0) /* no plan: no bytes */
			s->tensors[i].offset = s->tensors[i].nbytes = 0;
	}
	s->nprog[prog] = n;
	n = 0;
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->progs & IR_PROG_BIT(prog))
			fill_instr(g->nodes[i], &s->prog[prog][n++]);
}

int ir_write_step(const Graph *g, const char *path, char *err, size_t errlen)
{
	DpStep s;
	if (ir_build_step(g, &s, err, errlen) < 0)
		return -1;
	int rc = dpstep_write_file(&s, path, err, errlen);
	dpstep_free(&s);
	return rc;
}
