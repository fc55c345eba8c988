/*
 * precision.c - mixed precision: the dtype every value is computed and
 * stored in (pass "precision").
 *
 * Before: the optimizer form; every float value is f32 (the front end and
 * the shape pass know no other float dtype), parameters are declared f32.
 *
 * After (a graph whose settings are all f32 is left as it was):
 * - a trained parameter has the dtype its block computes in (param_dtype:
 *   the block's own, else train's). This is the value the forward and the
 *   backward read: with bf16 a compute copy, which the layout pass puts
 *   beside an f32 master (the optimizer updates the masters and writes the
 *   copies in the same pass over the weights);
 * - gradients and flat.grads have train's reduce_dtype: the accumulating
 *   kernels write them from bf16 operands, the collectives reduce them and
 *   the optimizer reads them in it;
 * - buffers (`buffer ... nosync`) have their block's buffer_dtype;
 * - every float temporary a forward, backward or eval node defines has the
 *   dtype its op's operand rule gives its output (dp_rule_dtypes, the table
 *   the step-file decoder enforces): the node's compute dtype (its block's
 *   param_dtype; train's outside blocks) for CD and CDF outputs, f32 for the
 *   loss and the eval count; copies, reshapes, transposes and collectives
 *   keep their input's dtype. The numerically sensitive parts never leave
 *   f32: the kernels compute in f32 whatever they store (softmax, cross
 *   entropy and norm statistics inside one kernel), and the loss, the
 *   gradient norm, clipping and the optimizer state are f32;
 * - a CAST "V.DT" before the first node that needs operand V in another
 *   dtype (a CD operand of another compute dtype, an f32 or bf16 one that
 *   is not), reused by later nodes until V is written again; a COPY into a
 *   value of another dtype becomes a CAST. In a model computed in one dtype
 *   the only casts are of f32 data features entering the first layer.
 * The optimizer tail (PH_OPT) is untouched: it runs on f32 masters.
 */
#include <string.h>

#include "passes.h"

typedef struct {
	int src, dtype, cast; /* value src in dtype: the cast temporary */
} Cached;

typedef struct {
	Graph *g;
	Node **order; /* the new program order */
	int norder, caporder;
	Cached *cache;
	int ncache, capcache;
} Prec;

static void push(Prec *p, Node *n)
{
	if (p->norder == p->caporder) {
		int cap = p->caporder ? 2 * p->caporder : 64;
		Node **grown = ir_alloc(p->g, (size_t)cap * sizeof(Node *));
		if (p->norder)
			memcpy(grown, p->order, (size_t)p->norder * sizeof(Node *));
		p->order = grown;
		p->caporder = cap;
	}
	p->order[p->norder++] = n;
}

/* The dtype operand class od asks for in a node computing in cd; -1: any. */
static int wanted(unsigned od, int cd)
{
	switch ((DpOperandDtype)od) {
	case DP_OD_CD:
		return cd;
	case DP_OD_F32:
		return DP_F32;
	case DP_OD_HALF:
		return dp_is_half((unsigned)cd) ? cd : -1;
	default:
		return -1; /* NONE, CDF (outputs only), FLOAT, I32 */
	}
}

/* Node n writes value w: casts made of memory w overlaps are stale. */
static void forget(Prec *p, int w)
{
	const Value *wv = p->g->values[w];
	int k = 0;
	for (int i = 0; i < p->ncache; i++)
		if (!ir_overlaps(p->g, p->g->values[p->cache[i].src], wv))
			p->cache[k++] = p->cache[i];
	p->ncache = k;
}

/* Value v in dtype dt for node user: a cast made earlier, or a new CAST
 * placed before user. */
static int cast_of(Prec *p, int v, int dt, const Node *user)
{
	Graph *g = p->g;
	for (int i = 0; i < p->ncache; i++)
		if (p->cache[i].src == v && p->cache[i].dtype == dt)
			return p->cache[i].cast;
	const Value *src = g->values[v];
	Value *c = ir_value(g, ir_fresh_name(g, ir_fmt(g, "%s.%s", src->name,
							 ir_dtype_name((DpDtype)dt))),
			    (DpDtype)dt, src->ndim, src->dims, DP_T_ACT, src->loc);
	memcpy(c->place, src->place, sizeof c->place);
	c->batch_dim = src->batch_dim;
	c->seq_dim = src->seq_dim;
	c->block = user->block;
	Node *n = ir_node(g, DP_OP_CAST, c->id, 1, &v, user->phase, user->loc);
	n->progs = user->progs;
	n->flags = user->flags;
	n->block = user->block;
	n->recompute = user->recompute;
	c->def = n->id;
	push(p, n);
	if (p->ncache == p->capcache) {
		int cap = p->capcache ? 2 * p->capcache : 16;
		Cached *grown = ir_alloc(g, (size_t)cap * sizeof(Cached));
		if (p->ncache)
			memcpy(grown, p->cache, (size_t)p->ncache * sizeof(Cached));
		p->cache = grown;
		p->capcache = cap;
	}
	p->cache[p->ncache++] = (Cached){v, dt, c->id};
	return c->id;
}

/* A node of the forward, backward or eval: its operands' dtypes. */
static void retype_node(Prec *p, Node *n)
{
	Graph *g = p->g;
	unsigned rule = dp_op_rules[n->op];
	int cd = ir_block_param_dtype(g, n->block);
	const unsigned char *od = rule < DP_NOR ? dp_rule_dtypes[rule] : NULL;
	for (int k = 0; od && k < n->nin; k++) {
		int v = n->in[k], want = wanted(od[k + 1], cd);
		if (v < 0 || want < 0 || !ir_is_float(g->values[v]->dtype) ||
		    g->values[v]->dtype == (DpDtype)want)
			continue;
		n->in[k] = cast_of(p, v, want, n);
	}
	if (n->out < 0)
		return;
	Value *out = g->values[n->out];
	if (out->def == n->id && ir_is_float(out->dtype)) {
		int dt = od ? wanted(od[0], cd) : -1;
		if (od && od[0] == DP_OD_CDF)
			dt = cd;
		if (rule == DP_OR_FILL)
			dt = cd;
		if (dt < 0 && n->nin > 0 && n->in[0] >= 0 && ir_is_float(g->values[n->in[0]]->dtype))
			dt = g->values[n->in[0]]->dtype; /* copies, reshapes, collectives */
		if (dt >= 0)
			out->dtype = (DpDtype)dt;
	} else if (n->op == DP_OP_COPY && n->in[0] >= 0 &&
		   g->values[n->in[0]]->dtype != out->dtype) {
		n->op = DP_OP_CAST; /* into a value of another dtype (a gradient) */
	}
	forget(p, n->out);
	for (int k = 0; k < n->nin; k++)
		if (ir_writes_in(n, k))
			forget(p, n->in[k]);
}

int precision_run(Graph *g, Diag *d)
{
	(void)d;
	if (!ir_mixed_precision(g))
		return 0;
	for (int i = 0; i < g->nvalues; i++) {
		Value *v = g->values[i];
		if (v->kind == DP_T_PARAM && v->grad >= 0)
			v->dtype = ir_block_param_dtype(g, v->block);
		else if (v->kind == DP_T_BUFFER && ir_is_float(v->dtype))
			v->dtype = ir_block_buffer_dtype(g, v->block);
		else if (v->kind == DP_T_GRAD ||
			 (v->kind == DP_T_FLAT && strcmp(v->name, "flat.grads") == 0))
			v->dtype = (DpDtype)g->reduce_dtype;
	}
	Prec p = {.g = g};
	int nold = g->nnodes;
	Node **old = ir_alloc(g, (size_t)(nold ? nold : 1) * sizeof(Node *));
	memcpy(old, g->nodes, (size_t)nold * sizeof(Node *));
	for (int i = 0; i < nold; i++) {
		Node *n = old[i];
		if (n->phase != PH_FWD && n->phase != PH_BWD && n->phase != PH_EVAL &&
		    n->phase != PH_DATA) {
			push(&p, n);
			continue;
		}
		retype_node(&p, n);
		push(&p, n);
	}
	if (p.norder != g->nnodes)
		die("precision: ordered %d of %d nodes", p.norder, g->nnodes);
	memcpy(g->nodes, p.order, (size_t)p.norder * sizeof(Node *));
	return 0;
}
