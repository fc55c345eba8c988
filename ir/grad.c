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

void grad_ctx_init(GradCtx *c, Graph *g, Diag *d, int nvalues)
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

void grad_ctx_free(GradCtx *c)
{
	free(c->needs);
	free(c->owned);
	free(c->grad);
	c->needs = c->owned = NULL;
	c->grad = NULL;
}

int ad_grad_of(GradCtx *c, int value)
{
	return value >= 0 && value < c->nvalues ? c->grad[value] : -1;
}

int ad_needs(GradCtx *c, int value)
{
	return value >= 0 && value < c->nvalues && c->needs[value];
}

Value *ad_value(GradCtx *c, int value)
{
	return c->g->values[value];
}

void ad_error(GradCtx *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror_at(c->d, c->fwd->loc, fmt, ap);
	va_end(ap);
	c->nerr++;
}

/* "d.<stem>", then "d.<stem>.1", ... */
int ad_temp(GradCtx *c, const Value *like, const char *stem)
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

Node *ad_emit(GradCtx *c, IrOp op, int out, int nin, const int *in)
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
	if (!ad_needs(c, v))
		return;
	Value *val = g->values[v];
	if (val->kind == DP_T_PARAM) {
		ad_emit(c, DP_OP_ACCUM, val->grad, 1, &t);
		return;
	}
	int cur = c->grad[v];
	if (cur < 0) {
		c->grad[v] = t;
		c->owned[v] = (unsigned char)owned;
	} else if (c->owned[v]) {
		ad_emit(c, DP_OP_ACCUM, cur, 1, &t);
	} else if (owned) {
		ad_emit(c, DP_OP_ACCUM, t, 1, &cur);
		c->grad[v] = t;
		c->owned[v] = 1;
	} else {
		int s = ad_temp(c, val, val->name);
		ad_emit(c, DP_OP_ADD, s, 2, (int[]){cur, t});
		c->grad[v] = s;
		c->owned[v] = 1;
	}
}

void ad_add_grad(GradCtx *c, int value, int contribution)
{
	add_grad(c, value, contribution, 1);
}

void ad_pass_grad(GradCtx *c, int value, int g)
{
	add_grad(c, value, g, 0);
}

Node *ad_emit_grad(GradCtx *c, IrOp op, int value, int nin, const int *in)
{
	if (!ad_needs(c, value))
		return NULL;
	Value *v = c->g->values[value];
	int t = ad_temp(c, v, v->name);
	Node *n = ad_emit(c, op, t, nin, in);
	ad_add_grad(c, value, t);
	return n;
}

Node *ad_emit_acc(GradCtx *c, IrOp op, int value, int nin, const int *in)
{
	if (!ad_needs(c, value))
		return NULL;
	Graph *g = c->g;
	Value *v = g->values[value];
	int out, acc;
	if (v->kind == DP_T_PARAM) {
		out = v->grad;
		acc = 1;
	} else if (c->grad[value] < 0) {
		out = c->grad[value] = ad_temp(c, v, v->name);
		c->owned[value] = 1;
		acc = 0;
	} else if (c->owned[value]) {
		out = c->grad[value];
		acc = 1;
	} else {
		/* Shared gradient: copy it into a temporary of our own first. */
		out = ad_temp(c, v, v->name);
		ad_emit(c, DP_OP_COPY, out, 1, &c->grad[value]);
		c->grad[value] = out;
		c->owned[value] = 1;
		acc = 1;
	}
	Node *n = ad_emit(c, op, out, nin, in);
	DP_ACC(n) = acc;
	return n;
}

