/*
 * optimizer.c - lowers the optimizer step: flat buffers, grad norm, clipping,
 * the update, and zeroing the gradients (pass "optimizer").
 *
 * Before: the autodiff form: every param has its persistent gradient value.
 *
 * After:
 * - DP_T_FLAT "flat.params" and "flat.grads", f32[total param elements]:
 *   the buffers the update runs over, one elementwise kernel for every
 *   parameter. Which element holds which parameter (and, for sharded
 *   strategies, their sizes) is the layout pass's decision: params and
 *   grads are not views of them yet.
 * - optimizer state, DP_T_OPTSTATE of the same length: adamw "opt.m", "opt.v";
 *   sgd "opt.momentum" only when momentum != 0.
 * - appended nodes, all PH_OPT, IR_IN_STEP, DP_IF_LAST (once per optimizer
 *   step, after the last micro-batch):
 *     SQNORM grad_norm.sq = |flat.grads|^2;  SQRT metric grad_norm
 *     CLIP flat.grads by grad_norm, max_norm            (only when clip > 0)
 *     ADAMW flat.params {flat.grads, opt.m, opt.v} weight_decay
 *       | SGD flat.params {flat.grads, opt.momentum or -1} momentum, weight_decay
 *     with the optimizer's weight_decay: one update over every parameter,
 *     which the layout pass splits where optimizer groups differ (per-block
 *     weight_decay and lr_scale, train's no_decay)
 *     FILL flat.grads = 0                               (next step accumulates)
 * Trained parameters must be f32 (user error at the param otherwise), and a
 * model without any is a user error.
 */
#include "passes.h"

static Node *opt_node(Graph *g, IrOp op, int out, int nin, const int *in)
{
	Node *n = ir_node(g, op, out, nin, in, PH_OPT, (Loc){0});
	n->progs = IR_IN_STEP;
	n->flags = DP_IF_LAST;
	return n;
}

static int flat_value(Graph *g, const char *name, int64_t len, DpTensorKind kind)
{
	return ir_value(g, name, DP_F32, 1, (int64_t[]){len}, kind, (Loc){0})->id;
}

int opt_run(Graph *g, Diag *d)
{
	int64_t total = 0;
	int nparams = 0, bad = 0;
	for (int i = 0; i < g->nvalues; i++) {
		Value *p = g->values[i];
		if (p->kind != DP_T_PARAM)
			continue;
		if (p->dtype != DP_F32) {
			error_at(d, p->loc, "param %s is %s: trained parameters must be f32", p->name,
				 ir_dtype_name(p->dtype));
			bad = 1;
		}
		if (p->grad < 0)
			die("optimizer: param %s has no gradient (autodiff did not run?)", p->name);
		total += ir_numel(p);
		nparams++;
	}
	if (bad)
		return -1;
	if (nparams == 0) {
		error_at(d, (Loc){g->file, 1, 1}, "the model has no parameters to train");
		return -1;
	}

	int fp = flat_value(g, "flat.params", total, DP_T_FLAT);
	int fg = flat_value(g, "flat.grads", total, DP_T_FLAT);

	int m = -1, v = -1;
	if (g->opt.kind == DP_OPT_ADAMW) {
		m = flat_value(g, "opt.m", total, DP_T_OPTSTATE);
		v = flat_value(g, "opt.v", total, DP_T_OPTSTATE);
	} else if (g->opt.momentum != 0) {
		m = flat_value(g, "opt.momentum", total, DP_T_OPTSTATE);
	}

	int sq = ir_value(g, "grad_norm.sq", DP_F32, 1, (int64_t[]){1}, DP_T_ACT, (Loc){0})->id;
	int norm = ir_value(g, "grad_norm", DP_F32, 1, (int64_t[]){1}, DP_T_METRIC, (Loc){0})->id;
	g->metrics.grad_norm = norm;
	g->values[sq]->def = opt_node(g, DP_OP_SQNORM, sq, 1, &fg)->id;
	opt_node(g, DP_OP_SQRT, norm, 1, &sq);
	if (g->opt.clip > 0)
		DP_FATTR(opt_node(g, DP_OP_CLIP, fg, 1, &norm), CLIP, max_norm) = g->opt.clip;
	if (g->opt.kind == DP_OPT_ADAMW) {
		Node *n = opt_node(g, DP_OP_ADAMW, fp, 3, (int[]){fg, m, v});
		DP_FATTR(n, ADAMW, weight_decay) = g->opt.weight_decay;
	} else {
		Node *n = opt_node(g, DP_OP_SGD, fp, 2, (int[]){fg, m});
		DP_FATTR(n, SGD, momentum) = g->opt.momentum;
		DP_FATTR(n, SGD, weight_decay) = g->opt.weight_decay;
	}
	DP_FATTR(opt_node(g, DP_OP_FILL, fg, 0, NULL), FILL, value) = 0;
	return 0;
}
