/*
 * grad.c - the gradient builder: the GradCtx API (ir.h) through which the
 * gradient rules (ir/op_grad.c) emit backward nodes, and which sums several
 * contributions to one value. passes/autodiff.c drives it: it decides which
 * values need a gradient, walks the forward in reverse and calls each op's
 * rule with the context pointed at the forward node.
 *
 * Summing. Each value that needs a gradient has at most one current gradient
 * value. A contribution either becomes it (first one), or is added: in place
 * with ACCUM when the current one is a temporary this value owns, else with an
 * ADD into a new temporary (a gradient passed through unchanged, e.g. by add,
 * is shared with another value and must not be written). Kernels that can
 * accumulate (MATMUL, BIAS_GRAD with acc) add directly into the current one.
 * Params always accumulate into their persistent gradient.
 */
#include <stdarg.h>
#include <stdlib.h>

#include "ir.h"

void ir_grad_ctx_init(GradCtx *c, Graph *g, Diag *d, int nvalues)
{
	*c = (GradCtx){.g = g, .d = d, .nvalues = nvalues};
	c->needs = calloc((size_t)nvalues + 1, 1);
	c->owned = calloc((size_t)nvalues + 1, 1);
	c->grad = malloc(((size_t)nvalues + 1) * sizeof(int));
	if (!c->needs || !c->owned || !c->grad)
		die("out of memory");
	for (int i = 0; i < nvalues; i++)
		c->grad[i] = -1;
}

void ir_grad_ctx_free(GradCtx *c)
{
	free(c->needs);
	free(c->owned);
	free(c->grad);
	c->needs = c->owned = NULL;
	c->grad = NULL;
}

int ir_ad_grad_of(GradCtx *c, int value)
{
	return value >= 0 && value < c->nvalues ? c->grad[value] : -1;
}

int ir_ad_needs(GradCtx *c, int value)
{
	return value >= 0 && value < c->nvalues && c->needs[value];
}

Value *ir_ad_value(GradCtx *c, int value)
{
	return c->g->values[value];
}

void ir_ad_error(GradCtx *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror_at(c->d, c->fwd->loc, fmt, ap);
	va_end(ap);
	c->nerr++;
}

/* "d.<stem>", then "d.<stem>.1", ... */
int ir_ad_temp(GradCtx *c, const Value *like, const char *stem)
{
	Graph *g = c->g;
	char *name = ir_fmt(g, "d.%s", stem);
	for (int i = 1; ir_find_value(g, name); i++)
		name = ir_fmt(g, "d.%s.%d", stem, i);
	Value *t = ir_value(g, name, like->dtype, like->ndim, like->dims, DP_T_ACT, like->loc);
	t->block = c->fwd ? c->fwd->block : -1;
	t->batch_dim = like->batch_dim;
	t->seq_dim = like->seq_dim;
	return t->id;
}

Node *ir_ad_emit(GradCtx *c, IrOp op, int out, int nin, const int *in)
{
	Node *n = ir_node(c->g, op, out, nin, in, PH_BWD, c->fwd->loc);
	n->progs = IR_IN_STEP;
	n->block = c->fwd->block;
	if (out >= 0 && c->g->values[out]->kind == DP_T_ACT && c->g->values[out]->def < 0)
		c->g->values[out]->def = n->id;
	return n;
}

/* Add gradient t into value v's gradient; owned: t is a fresh temporary the
 * caller hands over (it may be written). */
static void add_grad(GradCtx *c, int v, int t, int owned)
{
	Graph *g = c->g;
	if (!ir_ad_needs(c, v))
		return;
	Value *val = g->values[v];
	if (val->kind == DP_T_PARAM) {
		ir_ad_emit(c, DP_OP_ACCUM, val->grad, 1, &t);
		return;
	}
	int cur = c->grad[v];
	if (cur < 0) {
		c->grad[v] = t;
		c->owned[v] = (unsigned char)owned;
	} else if (c->owned[v]) {
		ir_ad_emit(c, DP_OP_ACCUM, cur, 1, &t);
	} else if (owned) {
		ir_ad_emit(c, DP_OP_ACCUM, t, 1, &cur);
		c->grad[v] = t;
		c->owned[v] = 1;
	} else {
		int s = ir_ad_temp(c, val, val->name);
		ir_ad_emit(c, DP_OP_ADD, s, 2, (int[]){cur, t});
		c->grad[v] = s;
		c->owned[v] = 1;
	}
}

void ir_ad_add_grad(GradCtx *c, int value, int contribution)
{
	add_grad(c, value, contribution, 1);
}

void ir_ad_pass_grad(GradCtx *c, int value, int g)
{
	add_grad(c, value, g, 0);
}

Node *ir_ad_emit_grad(GradCtx *c, IrOp op, int value, int nin, const int *in)
{
	if (!ir_ad_needs(c, value))
		return NULL;
	Value *v = c->g->values[value];
	int t = ir_ad_temp(c, v, v->name);
	Node *n = ir_ad_emit(c, op, t, nin, in);
	ir_ad_add_grad(c, value, t);
	return n;
}

Node *ir_ad_emit_acc(GradCtx *c, IrOp op, int value, int nin, const int *in)
{
	if (!ir_ad_needs(c, value))
		return NULL;
	Graph *g = c->g;
	Value *v = g->values[value];
	int out, acc;
	if (v->kind == DP_T_PARAM) {
		out = v->grad;
		acc = 1;
	} else if (c->grad[value] < 0) {
		out = c->grad[value] = ir_ad_temp(c, v, v->name);
		c->owned[value] = 1;
		acc = 0;
	} else if (c->owned[value]) {
		out = c->grad[value];
		acc = 1;
	} else {
		/* Shared gradient: copy it into a temporary of our own first. */
		out = ir_ad_temp(c, v, v->name);
		ir_ad_emit(c, DP_OP_COPY, out, 1, &c->grad[value]);
		c->grad[value] = out;
		c->owned[value] = 1;
		acc = 1;
	}
	Node *n = ir_ad_emit(c, op, out, nin, in);
	DP_ACC(n) = acc;
	return n;
}

