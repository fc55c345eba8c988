/*
 * lossscale.c - fp16's loss scaling (PyTorch's GradScaler) as a rewrite of
 * the step (pass "lossscale"). The scale itself is training state the
 * executor keeps (runtime/exec.c: its value each step, backoff and growth,
 * the skipped steps; saved in checkpoints); the step file only says where
 * it enters and leaves.
 *
 * Before: the collectives form: the once-per-step tail SQNORM(s) of the
 * gradients (+ the ALL_REDUCE of the squared norm where gradients are
 * sharded or split), SQRT into the metric grad_norm, CLIP (clip > 0), the
 * updates (ADAMW/SGD) reading the gradients.
 *
 * After, when loss_scale is not none (else nothing changes):
 * - every CROSS_ENTROPY_GRAD has loss_scale: the loss gradient, the
 *   backward's seed, is multiplied by the step's scale before it is
 *   rounded to f16 (scaling after the rounding would lose what it is for);
 * - UNSCALE of each gradient buffer an update reads, right before the
 *   first SQNORM: the norm, the clip and the update see unscaled gradients
 *   (GradScaler.unscale_ before clip_grad_norm_);
 * - AMP_CHECK %grad_norm right after the SQRT: the norm is reduced over
 *   every rank that holds a distinct gradient (the collectives pass), and a
 *   sum of squares is inf or NaN when any term is, so the norm is the
 *   mesh-wide inf/NaN check (GradScaler's found_inf) with no collective of
 *   its own; every rank reads the same norm and skips the same steps.
 * Neither new node is a collective or changes a buffer's size: the
 * schedule and the memory plan see two in-place kernels and a host read.
 * The front end refuses loss scaling with offload (its optimizer tail is
 * moved to the host by a later pass). With pp > 1 stage_params copies each
 * UNSCALE per stage over the stage's own gradients, as it does the clip
 * and the update, and all_reduces the squared norm over pp: every stage
 * reads the same norm and skips the same steps (tests/fp16.sh,
 * overflow-pp2).
 */
#include "passes.h"

static Node *tail_node(Graph *g, IrOp op, int out, int nin, const int *in, int pos)
{
	Node *n = ir_node(g, op, out, nin, in, PH_OPT, (Loc){0});
	n->progs = IR_IN_STEP;
	n->flags = DP_IF_LAST;
	ir_move_node(g, n, pos);
	return n;
}

int lossscale_run(Graph *g, Diag *d)
{
	if (g->opt.loss_scale == DP_LS_NONE)
		return 0;
	int first_sq = -1, norm_at = -1, nupd = 0;
	int *grads = ir_alloc(g, (size_t)g->nnodes * sizeof *grads);
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (n->op == DP_OP_XENT_GRAD)
			DP_ATTR(n, XENT_GRAD, loss_scale) = 1;
		if (n->op == DP_OP_SQNORM && first_sq < 0)
			first_sq = i;
		if (n->op == DP_OP_SQRT && n->out == g->metrics.grad_norm)
			norm_at = i;
		if (n->op != DP_OP_ADAMW && n->op != DP_OP_SGD)
			continue;
		int seen = 0;
		for (int k = 0; k < nupd; k++)
			seen |= grads[k] == n->in[0];
		if (!seen)
			grads[nupd++] = n->in[0];
	}
	if (first_sq < 0 || norm_at < first_sq || nupd == 0)
		die("lossscale: the step has no gradient norm before its update (optimizer pass?)");
	for (int k = 0; k < nupd; k++)
		tail_node(g, DP_OP_UNSCALE, grads[k], 0, NULL, first_sq + k);
	norm_at += nupd;
	tail_node(g, DP_OP_AMP_CHECK, -1, 1, &g->metrics.grad_norm, norm_at + 1);
	return 0;
}
