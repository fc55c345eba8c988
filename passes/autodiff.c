/*
 * autodiff.c - reverse-mode differentiation of the training loss.
 *
 * Before: shapes known (passes/shape.c). Params have no gradient yet; the
 * forward is the PH_FWD nodes of the step program, g->loss is the scalar loss.
 *
 * After (GRAPH-FORMS.md "After autodiff"):
 * - every param p has a DP_T_GRAD value "grad.<p>" (same dtype/dims), with
 *   p->grad and grad->param set. Gradients are persistent and ACCUMULATE over
 *   micro-batches: every backward write into them adds (the optimizer zeroes).
 * - backward nodes (PH_BWD, IR_IN_STEP, block and loc of the forward node) are
 *   appended in reverse order of the forward; temporaries are DP_T_ACT "d.<v>".
 * - the seed is the loss's cross_entropy: XENT_GRAD with the XENT's fa0.
 * - only values on a path from a param to the loss get gradient work; data
 *   values never do. A param the loss does not depend on keeps a zero gradient
 *   (a note says so).
 *
 * Summing. Each value that needs a gradient has at most one current gradient
 * value. A contribution either becomes it (first one), or is added: in place
 * with ACCUM when the current one is a temporary this value owns, else with an
 * ADD into a new temporary (a gradient passed through unchanged, e.g. by add,
 * is shared with another value and must not be written). Kernels that can
 * accumulate (MATMUL, BIAS_GRAD with ia2) add directly into the current one.
 * Params always accumulate into their persistent gradient.
 *
 * Why reverse program order works: every use of v comes after v's definition,
 * so all contributions to v are emitted before v's defining node is visited;
 * from then on v's gradient is final and may be shared read-only.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

struct GradCtx {
	Graph *g;
	Diag *d;
	Node *fwd;        /* forward node whose gradient rule is running */
	unsigned char *needs; /* per value: on a path param -> loss */
	int *grad;        /* per value: current gradient value id, or -1 */
	unsigned char *owned; /* per value: grad[v] is a temporary only v uses */
	int nvalues;      /* values before autodiff; the arrays cover these */
	int nerr;
};

/* Backward nodes are forward nodes' mirrors: the forward program is this. */
static int is_forward(const Node *n)
{
	return n->phase == PH_FWD && (n->progs & IR_IN_STEP);
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
		ad_emit(c, DPK_ACCUM, val->grad, 1, &t);
		return;
	}
	int cur = c->grad[v];
	if (cur < 0) {
		c->grad[v] = t;
		c->owned[v] = (unsigned char)owned;
	} else if (c->owned[v]) {
		ad_emit(c, DPK_ACCUM, cur, 1, &t);
	} else if (owned) {
		ad_emit(c, DPK_ACCUM, t, 1, &cur);
		c->grad[v] = t;
		c->owned[v] = 1;
	} else {
		int s = ad_temp(c, val, val->name);
		ad_emit(c, DPK_ADD, s, 2, (int[]){cur, t});
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
		ad_emit(c, DPK_COPY, out, 1, &c->grad[value]);
		c->grad[value] = out;
		c->owned[value] = 1;
		acc = 1;
	}
	Node *n = ad_emit(c, op, out, nin, in);
	n->ia[2] = acc;
	return n;
}

/* needs[v] = v depends on a param (forward reach) and the loss depends on v. */
static void mark_needs(Graph *g, unsigned char *needs)
{
	unsigned char *reach = calloc((size_t)g->nvalues + 1, 1);
	unsigned char *live = calloc((size_t)g->nvalues + 1, 1);
	if (!reach || !live)
		die("out of memory");
	for (int i = 0; i < g->nvalues; i++)
		reach[i] = g->values[i]->kind == DP_T_PARAM;
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (!is_forward(n) || n->out < 0)
			continue;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && reach[n->in[k]])
				reach[n->out] = 1;
	}
	live[g->loss] = 1;
	for (int i = g->nnodes - 1; i >= 0; i--) {
		Node *n = g->nodes[i];
		if (!is_forward(n) || n->out < 0 || !live[n->out])
			continue;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0)
				live[n->in[k]] = 1;
	}
	for (int i = 0; i < g->nvalues; i++)
		needs[i] = reach[i] && live[i];
	free(reach);
	free(live);
}

/* Every param gets its persistent gradient, in declaration order. */
static void make_grads(Graph *g)
{
	int nv = g->nvalues;
	for (int i = 0; i < nv; i++) {
		Value *p = g->values[i];
		if (p->kind != DP_T_PARAM || p->grad >= 0)
			continue;
		Value *gr = ir_value(g, ir_fmt(g, "grad.%s", p->name), p->dtype, p->ndim, p->dims,
				     DP_T_GRAD, p->loc);
		gr->param = p->id;
		gr->block = p->block;
		p->grad = gr->id;
	}
}

int ad_run(Graph *g, Diag *d)
{
	make_grads(g);
	if (g->loss < 0) {
		error_at(d, (Loc){g->file, 1, 1}, "the model has no loss to differentiate");
		return -1;
	}
	int nv0 = g->nvalues; /* values made below are temporaries with no entry */
	GradCtx c = {.g = g, .d = d, .nvalues = nv0};
	c.needs = calloc((size_t)nv0 + 1, 1);
	c.owned = calloc((size_t)nv0 + 1, 1);
	c.grad = malloc(((size_t)nv0 + 1) * sizeof(int));
	if (!c.needs || !c.owned || !c.grad)
		die("out of memory");
	for (int i = 0; i < nv0; i++)
		c.grad[i] = -1;
	mark_needs(g, c.needs);

	/* Forward nodes to visit: a snapshot, since rules append to g->nodes. */
	int nfwd = 0;
	Node **fwd = malloc(((size_t)g->nnodes + 1) * sizeof(Node *));
	if (!fwd)
		die("out of memory");
	for (int i = 0; i < g->nnodes; i++)
		if (is_forward(g->nodes[i]))
			fwd[nfwd++] = g->nodes[i];

	for (int i = nfwd - 1; i >= 0; i--) {
		Node *n = fwd[i];
		if (n->out < 0 || !c.needs[n->out])
			continue;
		c.fwd = n;
		int dout;
		if (n->out == g->loss) {
			dout = -1; /* seed */
			if (n->op != DPK_XENT) {
				/* A loss not straight from cross_entropy: an explicit 1. */
				dout = ad_temp(&c, g->values[n->out], g->values[n->out]->name);
				ad_emit(&c, DPK_FILL, dout, 0, NULL)->fa[0] = 1;
			}
		} else {
			dout = c.grad[n->out];
			if (dout < 0)
				continue; /* its consumer failed to differentiate (reported) */
		}
		if (!ir_ops[n->op].grad) {
			ad_error(&c, "%s: not differentiable, but the loss depends on a parameter "
				     "through it", ir_ops[n->op].name);
			continue;
		}
		ir_ops[n->op].grad(&c, n, dout);
	}

	/* Params the loss does not depend on: their gradient stays zero. */
	for (int i = 0; i < nv0; i++) {
		Value *p = g->values[i];
		if (p->kind == DP_T_PARAM && !c.needs[i] && d->out && c.nerr == 0)
			fprintf(d->out, "%s:%d:%d: note: param %s does not affect the loss; its gradient "
				"is zero\n", p->loc.file ? p->loc.file : g->file, p->loc.line, p->loc.col,
				p->name);
	}
	free(fwd);
	free(c.needs);
	free(c.owned);
	free(c.grad);
	return c.nerr ? -1 : 0;
}
