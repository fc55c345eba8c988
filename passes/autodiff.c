/*
 * autodiff.c - reverse-mode differentiation of the training loss.
 *
 * Before: shapes known (passes/shape.c). Params have no gradient yet; the
 * forward is the PH_FWD nodes of the step program, g->loss is the scalar loss.
 *
 * After:
 * - every param p has a DP_T_GRAD value "grad.<p>" (same dtype/dims), with
 *   p->grad and grad->param set. Gradients are persistent and ACCUMULATE over
 *   micro-batches: every backward write into them adds (the optimizer zeroes).
 * - backward nodes (PH_BWD, IR_IN_STEP, block and loc of the forward node) are
 *   appended in reverse order of the forward; temporaries are DP_T_ACT "d.<v>".
 * - the seed is the loss's cross_entropy: XENT_GRAD with the XENT's scale.
 * - only values on a path from a param to the loss get gradient work; data
 *   values never do. A param the loss does not depend on keeps a zero gradient
 *   (a note says so).
 *
 * The gradient builder (ir/grad.c) emits the nodes and sums the
 * contributions; each op's gradient rule is in its ops.def row (ir/op_grad.c).
 *
 * Why reverse program order works: every use of v comes after v's definition,
 * so all contributions to v are emitted before v's defining node is visited;
 * from then on v's gradient is final and may be shared read-only.
 */
#include <stdlib.h>

#include "passes.h"

/* Backward nodes are forward nodes' mirrors: the forward program is this. */
static int is_forward(const Node *n)
{
	return n->phase == PH_FWD && (n->progs & IR_IN_STEP);
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
	GradCtx c;
	ir_grad_ctx_init(&c, g, d, nv0);
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
			if (n->op != DP_OP_XENT) {
				/* A loss not straight from cross_entropy: an explicit 1. */
				dout = ir_ad_temp(&c, g->values[n->out], g->values[n->out]->name);
				DP_FATTR(ir_ad_emit(&c, DP_OP_FILL, dout, 0, NULL), FILL, value) = 1;
			}
		} else {
			dout = ir_ad_grad_of(&c, n->out);
			if (dout < 0)
				continue; /* its consumer failed to differentiate (reported) */
		}
		if (!ir_ops[n->op].grad) {
			ir_ad_error(&c, "%s: not differentiable, but the loss depends on a parameter "
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
	int nerr = c.nerr;
	ir_grad_ctx_free(&c);
	return nerr ? -1 : 0;
}
