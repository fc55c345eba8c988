/*
 * ir.c - the graph's pool, values, nodes and small queries.
 *
 * Everything is allocated from the graph's pool (a list of large chunks) and
 * released at once by ir_free. Arrays of pointers (values, nodes) grow by
 * doubling inside the pool; the old array is simply abandoned.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

struct Pool {
	struct Pool *next;
	size_t used, cap;
	max_align_t data[];
};

const char *const ir_axis_names[DP_MAX_AXES] = {"pp", "dp_replicate", "dp_shard", "cp",
						    "tp"};
/* Text names shared by the printer and the reader; ORDER follows the enums. */
const char *const ir_phase_names[7] = {"data", "fwd", "bwd", "comm", "opt", "eval", "setup"}; /* Phase */
const char *const ir_init_names[7] = {"none", "zeros", "ones", "normal", "uniform", "rope_cos",
					"rope_sin"};     /* DpInit */
const char *const ir_src_kind_names[6] = {"idx", "npy", "synthetic", "tokens", "positions",
						"sample_keys"};        /* DpSourceKind */
const char *const ir_split_names[2] = {"train", "eval"};                               /* DpSplit */
const char *const ir_role_names[2] = {"features", "labels"};                           /* DpSource.role */
const char *const ir_kind_names[] = {
	"act", "data", "param", "grad", "optstate", "flat", "metric", "buffer",
};

static Pool *pool_chunk(size_t cap)
{
	Pool *p = malloc(sizeof(Pool) + cap);
	if (!p)
		die("out of memory (%zu bytes)", cap);
	p->next = NULL;
	p->used = 0;
	p->cap = cap;
	return p;
}

void *ir_alloc(Graph *g, size_t n)
{
	size_t align = sizeof(max_align_t);
	n = (n + align - 1) / align * align;
	Pool *p = g->pool;
	if (p->used + n > p->cap) {
		Pool *q = pool_chunk(n > (1u << 20) ? n : (1u << 20));
		q->next = p;
		g->pool = p = q;
	}
	void *r = (char *)p->data + p->used;
	p->used += n;
	memset(r, 0, n);
	return r;
}

char *ir_strdup(Graph *g, const char *s)
{
	size_t n = strlen(s) + 1;
	char *r = ir_alloc(g, n);
	memcpy(r, s, n);
	return r;
}

char *ir_fmt(Graph *g, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *r = ir_alloc(g, (size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(r, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return r;
}

Graph *ir_new(const char *file)
{
	Pool *p = pool_chunk(1u << 20);
	Graph tmp = {.pool = p};
	Graph *g = ir_alloc(&tmp, sizeof(Graph));
	g->pool = tmp.pool;
	g->file = file ? ir_strdup(g, file) : "";
	g->mesh_loc = (Loc){g->file, 0, 0};
	g->loss = g->logits = g->labels = -1;
	g->metrics = (DpMetrics){-1, -1, -1, -1, -1, -1};
	ir_settings_default(g); /* format/settings.def's defaults */
	return g;
}

void ir_free(Graph *g)
{
	if (!g)
		return;
	Pool *p = g->pool;
	while (p) {
		Pool *n = p->next;
		free(p);
		p = n;
	}
}

/* Grow a pool-allocated pointer array to hold at least need elements. */
static void *grow(Graph *g, void *arr, int *cap, int need, size_t elem)
{
	if (need <= *cap)
		return arr;
	int nc = *cap ? *cap * 2 : 16;
	while (nc < need)
		nc *= 2;
	void *na = ir_alloc(g, (size_t)nc * elem);
	if (arr)
		memcpy(na, arr, (size_t)*cap * elem);
	*cap = nc;
	return na;
}

/*
 * Values by name. Passes look values up by name all the time (a 175B
 * graph has ~10^5 of them), so ir_find_value reads an open-addressed table
 * of Value pointers keyed by the name each value was entered under: every
 * value on creation, again on a rename. Entries are never removed: a
 * renamed value's old entry and a dropped value (ir_drop_value) stay, and
 * a lookup keeps only the values that are still in the graph under that
 * name now, the lowest id first, which is what a scan of g->values in
 * order finds.
 */
static uint32_t name_hash(const char *s)
{
	uint32_t h = 2166136261u; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

static int in_graph(const Graph *g, const Value *v)
{
	return v->id >= 0 && v->id < g->nvalues && g->values[v->id] == v;
}

static void name_put(Value **tab, int cap, Value *v)
{
	uint32_t at = name_hash(v->name) & (uint32_t)(cap - 1);
	while (tab[at])
		at = (at + 1) & (uint32_t)(cap - 1);
	tab[at] = v;
}

static void name_enter(Graph *g, Value *v)
{
	if (2 * (g->by_name_used + 1) > g->by_name_cap) {
		/* anew: the values in the graph under their names now, a
		 * quarter full */
		int cap = 1024;
		while (cap < 4 * (g->nvalues + 1))
			cap *= 2;
		Value **tab = ir_alloc(g, sizeof *tab * (size_t)cap);
		memset(tab, 0, sizeof *tab * (size_t)cap);
		for (int i = 0; i < g->nvalues; i++)
			if (g->values[i] != v)
				name_put(tab, cap, g->values[i]);
		g->by_name = tab;
		g->by_name_cap = cap;
		g->by_name_used = g->nvalues - (in_graph(g, v) ? 1 : 0);
	}
	name_put(g->by_name, g->by_name_cap, v);
	g->by_name_used++;
}

Value *ir_find_value(Graph *g, const char *name)
{
	if (!g->by_name_cap)
		return NULL;
	Value *best = NULL;
	uint32_t mask = (uint32_t)(g->by_name_cap - 1);
	for (uint32_t at = name_hash(name) & mask; g->by_name[at]; at = (at + 1) & mask) {
		Value *v = g->by_name[at];
		if ((!best || v->id < best->id) && in_graph(g, v) && strcmp(v->name, name) == 0)
			best = v;
	}
	return best;
}

void ir_rename_value(Graph *g, Value *v, const char *name)
{
	v->name = name;
	name_enter(g, v);
}

const char *ir_fresh_name(Graph *g, const char *stem)
{
	if (!ir_find_value(g, stem))
		return ir_strdup(g, stem);
	for (int i = 1;; i++) {
		char buf[256];
		snprintf(buf, sizeof buf, "%s%d", stem, i);
		if (!ir_find_value(g, buf))
			return ir_strdup(g, buf);
	}
}

Value *ir_value(Graph *g, const char *name, DpDtype dt, int ndim, const int64_t *dims,
		DpTensorKind kind, Loc loc)
{
	assert(ndim >= 0 && ndim <= DP_MAX_DIMS);
	Value *v = ir_alloc(g, sizeof(Value));
	v->id = g->nvalues;
	v->name = ir_strdup(g, name);
	v->dtype = dt;
	v->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		v->dims[i] = dims[i];
	v->kind = kind;
	for (int a = 0; a < DP_MAX_AXES; a++)
		v->place[a] = (Place){DP_PL_REPLICATE, -1};
	v->view_of = v->grad = v->param = v->block = v->source = v->def = -1;
	v->offset = -1;
	v->batch_dim = v->seq_dim = -1;
	v->loc = loc;
	g->values = grow(g, g->values, &g->capvalues, g->nvalues + 1, sizeof(Value *));
	g->values[g->nvalues++] = v;
	name_enter(g, v);
	return v;
}

Node *ir_node(Graph *g, IrOp op, int out, int nin, const int *in, Phase ph, Loc loc)
{
	assert(nin >= 0 && nin <= DP_MAX_IN);
	Node *n = ir_alloc(g, sizeof(Node));
	n->id = g->next_node_id++;
	n->op = op;
	n->nin = nin;
	for (int i = 0; i < DP_MAX_IN; i++)
		n->in[i] = i < nin ? in[i] : -1;
	n->out = out;
	n->phase = ph;
	n->progs = IR_IN_STEP;
	n->stream = DP_STREAM_COMPUTE;
	n->bucket = -1;
	n->block = -1;
	n->offload = -1;
	n->stage = -1;
	n->chunk = -1;
	n->loc = loc;
	g->nodes = grow(g, g->nodes, &g->capnodes, g->nnodes + 1, sizeof(Node *));
	g->nodes[g->nnodes++] = n;
	return n;
}

Node *ir_node_like(Graph *g, const Node *n, int out, const int *in, int k)
{
	Node *x = ir_node(g, n->op, out, n->nin, in, n->phase, n->loc);
	memcpy(x->ia, n->ia, sizeof x->ia);
	memcpy(x->fa, n->fa, sizeof x->fa);
	x->progs = n->progs;
	x->flags = n->flags;
	x->stream = n->stream;
	x->block = n->block;
	x->bucket = n->bucket;
	x->stage = k;
	return x;
}

int ir_node_index(Graph *g, const Node *n)
{
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i] == n)
			return i;
	return -1;
}

void ir_move_node(Graph *g, Node *n, int pos)
{
	int i = ir_node_index(g, n);
	assert(i >= 0 && pos >= 0 && pos < g->nnodes);
	if (i < pos)
		memmove(&g->nodes[i], &g->nodes[i + 1], (size_t)(pos - i) * sizeof(Node *));
	else if (i > pos)
		memmove(&g->nodes[pos + 1], &g->nodes[pos], (size_t)(i - pos) * sizeof(Node *));
	g->nodes[pos] = n;
}

void ir_remove_node(Graph *g, Node *n)
{
	int i = ir_node_index(g, n);
	assert(i >= 0);
	memmove(&g->nodes[i], &g->nodes[i + 1], (size_t)(g->nnodes - i - 1) * sizeof(Node *));
	g->nnodes--;
}

int64_t ir_numel(const Value *v)
{
	int64_t n = 1;
	for (int i = 0; i < v->ndim; i++)
		n *= v->dims[i];
	return n;
}

int64_t ir_span(const Value *v)
{
	int64_t cols = v->ndim ? v->dims[v->ndim - 1] : 1;
	return v->ld > cols && cols > 0 ? ir_numel(v) / cols * v->ld : ir_numel(v);
}

size_t ir_dtype_size(DpDtype dt)
{
	size_t n = dp_dtype_size(dt);
	if (!n)
		die("bad dtype %d", (int)dt);
	return n;
}

const char *ir_dtype_name(DpDtype dt)
{
	return dp_name(dp_dtype_names, DP_NDTYPE, dt);
}

const Value *ir_root(const Graph *g, const Value *v)
{
	while (v->view_of >= 0)
		v = g->values[v->view_of];
	return v;
}

/* Element offset of v inside its root buffer. */
static int64_t root_offset(const Graph *g, const Value *v)
{
	int64_t off = 0;
	while (v->view_of >= 0) {
		off += v->view_offset;
		v = g->values[v->view_of];
	}
	return off;
}

int ir_overlaps(const Graph *g, const Value *a, const Value *b)
{
	if (ir_root(g, a) != ir_root(g, b))
		return 0;
	int64_t a0 = root_offset(g, a), b0 = root_offset(g, b);
	return a0 < b0 + ir_numel(b) && b0 < a0 + ir_numel(a);
}

int ir_node_touches(const Graph *g, const Node *n, const Value *v)
{
	if (n->out >= 0 && ir_overlaps(g, g->values[n->out], v))
		return 1;
	for (int k = 0; k < n->nin; k++)
		if (n->in[k] >= 0 && ir_overlaps(g, g->values[n->in[k]], v))
			return 1;
	return 0;
}

int ir_add_block(Graph *g, const char *name, Loc loc)
{
	g->blocks = grow(g, g->blocks, &g->capblocks, g->nblocks + 1, sizeof(Block));
	g->blocks[g->nblocks] = (Block){.name = ir_strdup(g, name), .loc = loc, .strategy = -1,
					.reshard = -1, .strategy_loc = loc,
					.param_dtype = -1, .buffer_dtype = -1, .precision_loc = loc,
					.stage = -1, .stage_loc = loc, .chunk = -1, .weight_decay = -1,
					.lr_scale = 1, .compress = -1, .compress_loc = loc,
					.offload = -1};
	return g->nblocks++;
}

DpStrategy ir_block_strategy(const Graph *g, int b)
{
	if (b >= 0 && b < g->nblocks && g->blocks[b].strategy >= 0)
		return (DpStrategy)g->blocks[b].strategy;
	return (DpStrategy)g->cfg.strategy;
}

int ir_block_compress(const Graph *g, int b)
{
	if (b >= 0 && b < g->nblocks && g->blocks[b].compress >= 0)
		return g->blocks[b].compress;
	return (int)g->cfg.compress;
}

int ir_block_offload(const Graph *g, int b)
{
	if (b >= 0 && b < g->nblocks && g->blocks[b].offload >= 0)
		return g->blocks[b].offload;
	return g->offload;
}

int ir_block_reshard(const Graph *g, int b)
{
	if (b >= 0 && b < g->nblocks && g->blocks[b].reshard >= 0)
		return g->blocks[b].reshard;
	return g->reshard_after_forward;
}

int ir_any_offload(const Graph *g)
{
	for (int b = 0; b < g->nblocks; b++)
		if (ir_block_offload(g, b))
			return 1;
	return g->offload != 0;
}

void ir_param_group(const Graph *g, const Value *p, float *weight_decay, float *lr_scale)
{
	const Block *bl = p->block >= 0 && p->block < g->nblocks ? &g->blocks[p->block] : NULL;
	*weight_decay = bl && bl->weight_decay >= 0 ? bl->weight_decay : g->opt.weight_decay;
	if (g->no_decay && p->ndim < 2)
		*weight_decay = 0;
	*lr_scale = bl ? bl->lr_scale : 1;
}

DpDtype ir_block_param_dtype(const Graph *g, int b)
{
	if (b >= 0 && b < g->nblocks && g->blocks[b].param_dtype >= 0)
		return (DpDtype)g->blocks[b].param_dtype;
	return (DpDtype)g->param_dtype;
}

DpDtype ir_block_buffer_dtype(const Graph *g, int b)
{
	if (b >= 0 && b < g->nblocks && g->blocks[b].buffer_dtype >= 0)
		return (DpDtype)g->blocks[b].buffer_dtype;
	return (DpDtype)g->buffer_dtype;
}

int ir_mixed_precision(const Graph *g)
{
	if (g->param_dtype != DP_F32 || g->reduce_dtype != DP_F32 || g->buffer_dtype != DP_F32)
		return 1;
	for (int b = 0; b < g->nblocks; b++)
		if (ir_block_param_dtype(g, b) != DP_F32 || ir_block_buffer_dtype(g, b) != DP_F32)
			return 1;
	return 0;
}

int ir_is_float(DpDtype dt)
{
	return dt == DP_F32 || dp_is_half(dt);
}

int ir_strategy_fits(const Graph *g, int strat, char *msg, size_t len)
{
	unsigned R = g->cfg.mesh[DP_AXIS_REPLICATE];
	if (strat != DP_STRAT_FULL_SHARD || R <= 1)
		return 1;
	snprintf(msg, len, "strategy full_shard shards over dp_shard only; with dp_replicate=%u use "
			   "hybrid_shard", R);
	return 0;
}

int ir_add_source(Graph *g, const Source *s)
{
	g->sources = grow(g, g->sources, &g->capsources, g->nsources + 1, sizeof(Source));
	g->sources[g->nsources] = *s;
	g->sources[g->nsources].path = ir_strdup(g, s->path ? s->path : "");
	/* data is per sample: dim 0 indexes the samples; a token window's dim 1
	 * is its sequence */
	if (s->value >= 0 && s->value < g->nvalues) {
		Value *v = g->values[s->value];
		v->batch_dim = 0;
		if (s->rec.kind == DP_SRC_TOKENS && v->ndim >= 2)
			v->seq_dim = 1;
	}
	return g->nsources++;
}

int ir_add_bucket(Graph *g, const Bucket *b)
{
	g->buckets = grow(g, g->buckets, &g->capbuckets, g->nbuckets + 1, sizeof(Bucket));
	Bucket *nb = &g->buckets[g->nbuckets];
	*nb = *b;
	nb->id = g->nbuckets;
	nb->members = ir_alloc(g, (size_t)(b->nmembers ? b->nmembers : 1) * sizeof(int));
	if (b->nmembers)
		memcpy(nb->members, b->members, (size_t)b->nmembers * sizeof(int));
	return g->nbuckets++;
}

const char *ir_language_model(const Graph *g, const Node **loss_node)
{
	const Node *loss = NULL;
	for (int i = 0; i < g->nnodes && !loss && g->loss >= 0; i++) {
		const Node *n = g->nodes[i];
		if ((n->op == DP_OP_XENT || n->op == DP_OP_XENT_FUSED) && n->out == g->loss &&
		    (n->progs & IR_IN_STEP))
			loss = n;
	}
	if (loss_node)
		*loss_node = loss;
	if (!loss)
		return "its loss is not a cross_entropy";
	const Value *logits = g->values[loss->in[0]], *labels = g->values[loss->in[1]];
	if (labels->kind != DP_T_DATA || labels->source < 0 ||
	    g->sources[labels->source].rec.kind != DP_SRC_TOKENS || !ir_is_float(logits->dtype))
		return "its cross_entropy's labels are not the next tokens of a tokens(...) source";
	if (g->cfg.mesh[DP_AXIS_PP] > 1)
		return "it is compiled with pp > 1";
	if (g->cfg.mesh[DP_AXIS_CP] > 1)
		return "it is compiled with cp > 1";
	return NULL;
}

void ir_program_io(const Graph *g, int p, int *in, int *out)
{
	int sample = p == DP_PROG_SAMPLE;
	*in = sample ? g->metrics.sample_tokens : -1;
	*out = sample ? g->metrics.sample_logits : -1;
}

int ir_world(const Graph *g)
{
	int w = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		w *= (int)g->cfg.mesh[a];
	return w;
}

int ir_chunks_per_rank(const Graph *g)
{
	return g->cfg.mesh[DP_AXIS_PP] > 1 && g->pipeline == IR_PIPE_INTERLEAVED &&
			       g->stages_per_rank > 1
		       ? g->stages_per_rank
		       : 1;
}

int64_t ir_global_batch(const Graph *g)
{
	return (int64_t)g->cfg.micro_batch * g->cfg.grad_accum * g->cfg.mesh[DP_AXIS_REPLICATE] *
	       g->cfg.mesh[DP_AXIS_SHARD];
}

unsigned ir_default_progs(Phase ph)
{
	switch (ph) {
	case PH_FWD:
		return IR_IN_STEP | IR_IN_EVAL;
	case PH_EVAL:
		return IR_IN_EVAL;
	case PH_SETUP:
		return IR_IN_INIT; /* EXPORT nodes print their program */
	default:
		return IR_IN_STEP;
	}
}
