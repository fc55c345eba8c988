/*
 * cp.c - context parallelism on the cp mesh axis (pass "cp").
 *
 * Before (after shape): values are shaped with the whole sequence; token
 * data and what is computed from it carry seq_dim (ir_batch_rule).
 *
 * After (C = cp ranks > 1): every sample's sequence of T tokens is split
 * over the cp ranks, load-balanced for causal attention: rank r holds
 * chunks r and 2C-1-r of 2C (the zigzag layout of format/ops.def), so every
 * rank does the same attention work.
 * - every value with a sequence dim has T/C there; the token sources are
 *   marked seq_split (the loader gives each rank its two chunks), and a data
 *   value "cp.pos" (i32 [T/C], a positions source) holds the global
 *   positions of the rank's tokens;
 * - a table added along the sequence (a learned position embedding [T, d]:
 *   bias_add) is read at the true positions: bias_add(x, embedding(cp.pos,
 *   table)); rope reads its cos/sin tables the same way, and dropout its
 *   elements' indices within the sample (in2 = cp.pos);
 * - attention: each rank's queries attend to every earlier key of the
 *   sequence. The keys and values are gathered (kv_pack: each head's k and
 *   v, then all_gather over cp), and attention_cp masks by global position.
 *   Its gradient returns the keys' and values' gradients with a
 *   reduce_scatter over cp (the all_gather's gradient), added into qkv's
 *   through kv_unpack. Why gather and not a ring: the same bytes on the wire
 *   ((C-1)/C of the sequence's K and V per layer, each way), one collective
 *   per layer and direction that the schedule issues as early as it can, no
 *   online-softmax merge kernel to get right; it costs the gathered K and V
 *   of the whole sequence in memory until the backward (2/3 of a layer's
 *   qkv times C), which recompute (passes/recompute.c) re-gathers instead of
 *   keeping.
 * - ops that would mix tokens along the split dim - anything working along a
 *   last dim that is the sequence (a transpose may put it there), a matmul
 *   contracting over it, a reshape that merges it - are errors naming the op.
 * The loss needs nothing: each rank sums its tokens' losses scaled by the
 * whole global batch, the runtime sums the metric over cp like over the
 * data-parallel axes, and the parameters' gradients are reduced over cp with
 * the data-parallel ones (passes/shard.c).
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define CPBIT DP_AXIS_BIT(DP_AXIS_CP)

typedef struct {
	Graph *g;
	Diag *d;
	int C;    /* cp ranks */
	int T;    /* the whole sequence */
	int pos;  /* cp.pos */
	int bad;
} Cp;

/* A new node computing for `like`, placed right before it. */
static Node *cp_node(Cp *c, IrOp op, int out, int nin, const int *in, Node *like)
{
	Graph *g = c->g;
	Node *n = ir_node(g, op, out, nin, in, like->phase, like->loc);
	n->progs = like->progs;
	n->block = like->block;
	if (out >= 0 && g->values[out]->kind == DP_T_ACT)
		g->values[out]->def = n->id;
	ir_move_node(g, n, ir_node_index(g, like));
	return n;
}

static Value *cp_value(Cp *c, const char *stem, DpDtype dt, int ndim, const int64_t *dims,
		       const Node *like)
{
	Graph *g = c->g;
	Value *v = ir_value(g, ir_fresh_name(g, stem), dt, ndim, dims, DP_T_ACT, like->loc);
	v->block = like->block;
	return v;
}

/* The token data: its sources split, T found (one T for all of them). */
static void split_data(Cp *c)
{
	Graph *g = c->g;
	for (int i = 0; i < g->nsources; i++) {
		Source *s = &g->sources[i];
		Value *v = g->values[s->value];
		if (s->rec.kind != DP_SRC_TOKENS || v->seq_dim != 1)
			continue;
		int t = (int)v->dims[1];
		if (c->T && t != c->T) {
			error_at(c->d, s->loc, "cp=%d: token data '%s' has sequences of %d tokens, "
				 "others %d: context parallelism splits one sequence length", c->C,
				 v->name, t, c->T);
			c->bad = 1;
		}
		c->T = t;
		s->rec.seq_split = 1;
		s->rec.sample_elems /= c->C;
	}
}

/* cp.pos, with a positions source and a LOAD per program that loads data. */
static void make_positions(Cp *c)
{
	Graph *g = c->g;
	int64_t t = c->T / c->C;
	Value *p = ir_value(g, ir_fresh_name(g, "cp.pos"), DP_I32, 1, &t, DP_T_DATA,
			    (Loc){g->file, 0, 0});
	p->seq_dim = 0;
	c->pos = p->id;
	int last_load = -1, have[2] = {0, 0};
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->op == DP_OP_LOAD) {
			last_load = i;
			have[(g->nodes[i]->progs & IR_IN_STEP) ? 0 : 1] = 1;
		}
	for (int split = 0; split < 2; split++) {
		if (!have[split])
			continue;
		Source s = {.rec = {.kind = DP_SRC_POSITIONS, .split = (uint8_t)split, .role = 1,
				    .seq_split = 1, .sample_elems = t},
			    .path = "", .value = p->id, .loc = p->loc};
		int si = ir_add_source(g, &s);
		p->batch_dim = -1; /* the same for every sample (ir_add_source marked it) */
		p->source = split == 0 ? si : p->source;
		Node *n = ir_node(g, DP_OP_LOAD, p->id, 0, NULL, PH_DATA, p->loc);
		DP_ATTR(n, LOAD, source) = si;
		n->progs = split == 0 ? IR_IN_STEP : IR_IN_EVAL;
		ir_move_node(g, n, ++last_load);
	}
}

/* Every value with a sequence dim holds the rank's T/C tokens of it. */
static void split_values(Cp *c)
{
	Graph *g = c->g;
	for (int i = 0; i < g->nvalues; i++) {
		Value *v = g->values[i];
		if (v->seq_dim < 0 || i == c->pos)
			continue;
		if (v->dims[v->seq_dim] != c->T)
			die("cp: %s's sequence dim is %lld, not %d", v->name,
			    (long long)v->dims[v->seq_dim], c->T);
		v->dims[v->seq_dim] /= c->C;
	}
}

/* rows = embedding(cp.pos, table): the table's rows at the rank's positions. */
static int rows_at_positions(Cp *c, int table, Node *like)
{
	Graph *g = c->g;
	const Value *tv = g->values[table];
	int64_t dims[2] = {c->T / c->C, tv->dims[1]};
	Value *r = cp_value(c, ir_fmt(g, "%s.cp", tv->name), tv->dtype, 2, dims, like);
	r->seq_dim = 0;
	cp_node(c, DP_OP_EMBEDDING, r->id, 2, (int[]){c->pos, table}, like);
	return r->id;
}

__attribute__((format(printf, 3, 4))) static void cp_error(Cp *c, const Node *n, const char *fmt,
							   ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror_at(c->d, n->loc, fmt, ap);
	va_end(ap);
	c->bad = 1;
}

/* A table added along the sequence (x [.., T, ..] + b whose dims cover T). */
static void bias_along(Cp *c, Node *n)
{
	Graph *g = c->g;
	const Value *x = g->values[n->in[0]], *b = g->values[n->in[1]];
	int k = x->seq_dim - (x->ndim - b->ndim); /* b's dim on the sequence */
	if (x->seq_dim < 0 || k < 0)
		return;
	if (k != 0 || b->ndim != 2 || b->dims[0] != c->T || b->batch_dim >= 0) {
		cp_error(c, n, "add: %s is added along the sequence split over cp=%d; only a [T, d] "
			 "table (a position embedding) can be, read at each token's position", b->name,
			 c->C);
		return;
	}
	n->in[1] = rows_at_positions(c, n->in[1], n);
}

/* rope's cos/sin tables read at the true positions. */
static void rope_at_positions(Cp *c, Node *n)
{
	n->in[1] = rows_at_positions(c, n->in[1], n);
	n->in[2] = rows_at_positions(c, n->in[2], n);
}

/* dropout's mask is keyed by each element's index within its sample: with
 * the sequence in dim 1, the row's global position is cp.pos's. */
static void dropout_at_positions(Cp *c, Node *n)
{
	const Value *x = c->g->values[n->in[0]];
	if (x->seq_dim < 0)
		return;
	if (x->seq_dim != 1) {
		cp_error(c, n, "dropout: %s's sequence, split over cp=%d, is dim %d; dropout keys "
			 "its mask by the position along dim 1", x->name, c->C, x->seq_dim);
		return;
	}
	n->in[2] = c->pos;
	n->nin = 3;
}

/* attention(qkv) -> attention_cp(qkv, all_gather(kv_pack(qkv)), cp.pos). */
static void attention_over_ranks(Cp *c, Node *n)
{
	Graph *g = c->g;
	const Value *qkv = g->values[n->in[0]];
	int64_t heads = DP_ATTR(n, ATTENTION, heads);
	int64_t b = qkv->dims[0], t = qkv->dims[1], two_c = qkv->dims[2] / 3 * 2;
	Value *kv = cp_value(c, ir_fmt(g, "%s.kv", qkv->name), qkv->dtype, 3,
			     (int64_t[]){b, t, two_c}, n);
	kv->batch_dim = 0;
	kv->seq_dim = 1;
	Node *pk = cp_node(c, DP_OP_KV_PACK, kv->id, 1, &qkv->id, n);
	DP_ATTR(pk, KV_PACK, heads) = heads;
	Value *all = cp_value(c, ir_fmt(g, "%s.kv.all", qkv->name), qkv->dtype, 4,
			      (int64_t[]){c->C, b, t, two_c}, n);
	Node *ag = cp_node(c, DP_OP_ALL_GATHER, all->id, 1, &kv->id, n);
	DP_ATTR(ag, ALL_GATHER, axes) = CPBIT;
	ag->stream = DP_STREAM_COMM;
	n->op = DP_OP_ATTENTION_CP;
	n->nin = 3;
	n->in[1] = all->id;
	n->in[2] = c->pos;
	DP_ATTR(n, ATTENTION_CP, heads) = heads;
	DP_ATTR(n, ATTENTION_CP, cp) = c->C;
}

/* Uses that would mix the tokens of the split sequence. */
static void check_mixing(Cp *c, Node *n)
{
	Graph *g = c->g;
	const OpInfo *oi = &ir_ops[n->op];
	const Value *x = n->nin > 0 && n->in[0] >= 0 ? g->values[n->in[0]] : NULL;
	const Value *out = n->out >= 0 ? g->values[n->out] : NULL;
	if (!x)
		return;
	switch ((OpBatch)oi->batch) {
	case OP_BATCH_ROWS:
	case OP_BATCH_LINEAR:
	case OP_BATCH_REDUCE:
		if (x->seq_dim >= 0 && x->seq_dim == x->ndim - 1)
			cp_error(c, n, "%s: %s's last dim is the sequence split over cp=%d, which %s "
				 "works along", oi->name, x->name, c->C, oi->name);
		break;
	case OP_BATCH_MATMUL: {
		const Value *b = g->values[n->in[1]];
		if ((DP_ATTR(n, MATMUL, transA) && x->seq_dim >= 0) || b->seq_dim >= 0)
			cp_error(c, n, "matmul: it would contract over the sequence split over cp=%d",
				 c->C);
		break;
	}
	case OP_BATCH_RESHAPE:
		if (x->seq_dim >= 0 && out && out->seq_dim < 0)
			cp_error(c, n, "reshape: it merges the sequence dim of %s, which cp=%d splits",
				 x->name, c->C);
		break;
	case OP_BATCH_ELEMWISE:
		if (n->nin > 1 && g->values[n->in[1]]->ndim == x->ndim &&
		    g->values[n->in[1]]->seq_dim != x->seq_dim)
			cp_error(c, n, "%s: one operand's sequence dim lines up with another dim of "
				 "the other, and cp=%d splits it", oi->name, c->C);
		break;
	default:
		break;
	}
}

/* The rewritten graph must still satisfy every shape rule (internal check). */
static void recheck_shapes(Cp *c)
{
	Graph *g = c->g;
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (!ir_ops[n->op].shape || n->out < 0)
			continue;
		Value *out = g->values[n->out], tmp = *out;
		tmp.ndim = 0;
		if (ir_ops[n->op].shape(g, n, &tmp, c->d) < 0)
			die("cp: node %d (%s) no longer shapes", n->id, ir_ops[n->op].name);
		if (out->kind == DP_T_ACT &&
		    (tmp.ndim != out->ndim || memcmp(tmp.dims, out->dims, sizeof tmp.dims)))
			die("cp: node %d (%s) shapes %%%s differently", n->id, ir_ops[n->op].name,
			    out->name);
	}
}

int cp_run(Graph *g, Diag *d)
{
	Cp c = {.g = g, .d = d, .C = (int)g->cfg.mesh[DP_AXIS_CP], .pos = -1};
	if (c.C <= 1)
		return 0;
	split_data(&c);
	if (!c.T || c.bad)
		return -1; /* the front end reported a model without token data */
	make_positions(&c);
	split_values(&c);
	int n0 = g->nnodes;
	Node **fwd = malloc((size_t)n0 * sizeof *fwd);
	if (!fwd)
		die("out of memory");
	memcpy(fwd, g->nodes, (size_t)n0 * sizeof *fwd);
	for (int i = 0; i < n0; i++) {
		Node *n = fwd[i];
		if (n->phase != PH_FWD && n->phase != PH_EVAL)
			continue;
		check_mixing(&c, n);
		if (n->op == DP_OP_BIAS_ADD)
			bias_along(&c, n);
		else if (n->op == DP_OP_ROPE)
			rope_at_positions(&c, n);
		else if (n->op == DP_OP_ATTENTION)
			attention_over_ranks(&c, n);
		else if (n->op == DP_OP_DROPOUT)
			dropout_at_positions(&c, n);
	}
	free(fwd);
	if (c.bad)
		return -1;
	recheck_shapes(&c);
	return 0;
}
