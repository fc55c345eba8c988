/*
 * tp.c - tensor parallelism on the tp mesh axis, Megatron style (pass "tp").
 *
 * Before: the front end's graph: shapes of declared values are global (the
 * whole model), parameters annotated `split(tp, col|row)` carry
 * place[tp] = shard(dim) (col: the last dim, row: dim 0), SSA temporaries are
 * unshaped, only forward nodes exist.
 *
 * After (T = tp ranks > 1):
 * - every split parameter has its per-rank shape: dims[dim] / T (an uneven
 *   split is a user error at the parameter);
 * - a column-parallel linear (weight split on its output dim) reads its
 *   input through TP_COPY (Megatron's f: the identity forward, a tp_reduce of
 *   the input's gradient backward), one per distinct input, placed before
 *   the first such linear; its bias must be split the same way; its output
 *   is split over tp ("tp-local");
 * - a row-parallel linear (weight split on its input dim) reads a tp-local
 *   input and produces a partial sum: its output becomes "NAME.partial",
 *   followed by TP_REDUCE (Megatron's g: an all-reduce over tp on the comm
 *   stream; the gradient passes through) and, when it has a bias, a BIAS_ADD
 *   of the (replicated) bias after the reduction;
 * - tp-local values flow only through ops that work per column block (the
 *   TP column of format/ops.def: elementwise ops and activations, attention, whose
 *   head count is divided by T: heads are split over tp, rope), and into a
 *   row-parallel linear. Anything
 *   else that reads a tp-local value (a reduction over the split dim, a
 *   reshape, the loss) is a user error naming the value and the op.
 *
 * With T = 1 the annotations change nothing and the pass does nothing: a
 * tp=1 graph is the plain data-parallel graph. Shapes of temporaries are
 * inferred afterwards by the shape pass, so they come out per rank.
 *
 * Gradients: autodiff differentiates TP_COPY and TP_REDUCE like any op (their
 * rules are in ir/ops.c), so the backward gets the tp_reduce of each
 * column-parallel input gradient with no special case here. Gradients of
 * split parameters are per rank; those of replicated parameters are equal on
 * every tp rank (their inputs are), which the optimizer pass relies on for
 * the global gradient norm.
 */
#include <string.h>

#include "passes.h"

#define TPBIT DP_AXIS_BIT(DP_AXIS_TP)

static int split_dim(const Value *v)
{
	return v->place[DP_AXIS_TP].kind == DP_PL_SHARD ? v->place[DP_AXIS_TP].dim : -1;
}

/* Ops through which a tp-local (column-split) value may flow (the TP column
 * of format/ops.def): each output column block depends only on the same block of
 * the inputs. */
static int local_ok(const Node *n)
{
	return ir_ops[n->op].tp != OP_TP_NO;
}

static const char *dsl_name(const Node *n)
{
	return ir_ops[n->op].name ? ir_ops[n->op].name : "?";
}

/* A fresh unshaped temporary named after v with a suffix. */
static Value *derived(Graph *g, const Value *v, const char *suffix, Loc loc)
{
	const char *name = ir_fmt(g, "%s.%s", v->name, suffix);
	if (ir_find_value(g, name))
		name = ir_fresh_name(g, name);
	return ir_value(g, name, v->dtype, 0, NULL, DP_T_ACT, loc);
}

static Node *tp_node(Graph *g, IrOp op, int out, int nin, const int *in, const Node *like)
{
	Node *n = ir_node(g, op, out, nin, in, like->phase, like->loc);
	n->progs = like->progs;
	n->block = like->block;
	g->values[out]->def = n->id;
	return n;
}

int tp_run(Graph *g, Diag *d)
{
	int T = (int)g->cfg.mesh[DP_AXIS_TP];
	int bad = 0;
	if (T <= 1) {
		for (int i = 0; i < g->nvalues; i++)
			g->values[i]->place[DP_AXIS_TP] = (Place){DP_PL_REPLICATE, -1};
		return 0;
	}
	int nv0 = g->nvalues;
	for (int i = 0; i < nv0; i++) {
		Value *v = g->values[i];
		int dim = split_dim(v);
		if (dim < 0)
			continue;
		if (v->kind != DP_T_PARAM || dim >= v->ndim)
			die("tp: %s: bad split placement", v->name);
		if (v->dims[dim] % T) {
			error_at(d, v->loc, "param %s: dim %d (%lld) is not divisible by tp=%d", v->name,
				 dim, (long long)v->dims[dim], T);
			bad = 1;
			continue;
		}
		v->dims[dim] /= T;
	}
	if (bad)
		return -1;

	/* values grow while nodes are added: size the per-value tables for the
	 * worst case (each node adds at most two values) */
	int cap = nv0 + 2 * g->nnodes + 1;
	char *local = ir_alloc(g, (size_t)cap);
	int *copy_of = ir_alloc(g, (size_t)cap * sizeof(int));
	for (int i = 0; i < cap; i++)
		copy_of[i] = -1;

	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		int w = n->nin > 1 ? n->in[1] : -1;
		int wdim = n->op == DP_OP_LINEAR && w >= 0 ? split_dim(g->values[w]) : -1;
		if (wdim >= 0) {
			int x = n->in[0], b = n->nin > 2 ? n->in[2] : -1;
			int bdim = b >= 0 ? split_dim(g->values[b]) : -1;
			if (wdim == 1) { /* column-parallel */
				if (b >= 0 && bdim != 0) {
					error_at(d, n->loc, "linear: the bias %s of a column-parallel "
						 "linear must be split(tp, col) like its weight %s",
						 g->values[b]->name, g->values[w]->name);
					bad = 1;
					continue;
				}
				if (local[x]) {
					error_at(d, n->loc, "linear: the input %s of column-parallel %s "
						 "is already split over tp (end the tensor-parallel region "
						 "with a split(tp, row) linear first)", g->values[x]->name,
						 g->values[w]->name);
					bad = 1;
					continue;
				}
				if (copy_of[x] < 0) {
					Value *c = derived(g, g->values[x], "tp", n->loc);
					Node *cn = tp_node(g, DP_OP_TP_COPY, c->id, 1, &x, n);
					DP_ATTR(cn, TP_COPY, axes) = TPBIT;
					ir_move_node(g, cn, i);
					copy_of[x] = c->id;
					i++; /* n moved one place down */
				}
				n->in[0] = copy_of[x];
				local[n->out] = 1;
				continue;
			}
			/* row-parallel */
			if (!local[x]) {
				error_at(d, n->loc, "linear: the input %s of row-parallel %s is not split "
					 "over tp (feed it from a split(tp, col) linear)",
					 g->values[x]->name, g->values[w]->name);
				bad = 1;
				continue;
			}
			if (bdim >= 0) {
				error_at(d, n->loc, "linear: the bias %s of a row-parallel linear is "
					 "added after the tp reduction and must not be split",
					 g->values[b]->name);
				bad = 1;
				continue;
			}
			Value *o = g->values[n->out];
			Value *part = derived(g, o, "partial", n->loc);
			n->out = part->id;
			part->def = n->id;
			n->nin = 2;
			n->in[2] = -1;
			int red = o->id;
			if (b >= 0)
				red = derived(g, o, "sum", n->loc)->id;
			Node *rn = tp_node(g, DP_OP_TP_REDUCE, red, 1, &part->id, n);
			DP_ATTR(rn, TP_REDUCE, axes) = TPBIT;
			rn->stream = DP_STREAM_COMM;
			ir_move_node(g, rn, i + 1);
			i++;
			if (b >= 0) {
				Node *bn = tp_node(g, DP_OP_BIAS_ADD, o->id, 2, (int[]){red, b}, n);
				ir_move_node(g, bn, i + 1);
				i++;
			}
			continue;
		}
		/* any other use of a split parameter, and the flow of tp-local values */
		int any = 0, all = 1;
		for (int k = 0; k < n->nin; k++) {
			int v = n->in[k];
			if (v < 0)
				continue;
			if (split_dim(g->values[v]) >= 0) {
				error_at(d, n->loc, "%s: %s is split over tp; only linear can use a split "
					 "param (as its weight or bias)", dsl_name(n), g->values[v]->name);
				bad = 1;
			}
			if (local[v])
				any = 1;
			else if (g->values[v]->kind != DP_T_BUFFER)
				all = 0;
		}
		if (!any || n->out < 0)
			continue;
		if (!local_ok(n)) {
			int v = -1;
			for (int k = 0; k < n->nin && v < 0; k++)
				if (n->in[k] >= 0 && local[n->in[k]])
					v = n->in[k];
			error_at(d, n->loc, "%s: %s is split over tp and %s needs the whole tensor "
				 "(end the tensor-parallel region with a split(tp, row) linear)",
				 dsl_name(n), g->values[v]->name, dsl_name(n));
			bad = 1;
			continue;
		}
		if (!all) {
			error_at(d, n->loc, "%s: mixes a tensor split over tp with a whole one",
				 dsl_name(n));
			bad = 1;
			continue;
		}
		if (ir_ops[n->op].tp == OP_TP_HEADS) {
			int64_t *heads = &IR_ATTR(n, ir_op_attr(n->op, "heads"));
			if (*heads % T) {
				error_at(d, n->loc, "%s: %lld heads cannot be split over tp=%d",
					 dsl_name(n), (long long)*heads, T);
				bad = 1;
				continue;
			}
			*heads /= T; /* the TP column's HEADS: every op has `heads` */
		}
		local[n->out] = 1;
	}
	return bad ? -1 : 0;
}
