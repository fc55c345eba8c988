/*
 * recompute.c - activation recompute (gradient checkpointing), pass
 * "recompute".
 *
 * Before (after autodiff): the forward nodes (PH_FWD, step and eval), then
 * the backward nodes (PH_BWD) in reverse order; a block's backward reads the
 * activations its forward produced, so they live from the forward to the
 * backward.
 *
 * After: for every block with recompute = 1, the forward nodes whose outputs
 * the block's backward needs are copied, in forward order, right before the
 * block's first backward node: the copies are PH_BWD, step program only,
 * marked `recompute`, and write fresh temporaries "<v>.rc"; every node from
 * there on reads the copy instead of the original. The originals are then
 * read only by the rest of the forward, so their lifetimes (and the memory
 * plan) end there: after its forward the block keeps only what it reads from
 * outside (its input, parameters, buffers), which the forward of the next
 * block or this block's copy reads. The copies compute the same kernels on
 * the same operands, so every value - and so every loss and parameter - is
 * bitwise the one without recompute.
 *
 * Only what the backward needs is copied (transitively within the block): a
 * value no backward node reads (the block's output, read by the next block's
 * forward and backward, which run before this block's backward) is not
 * recomputed. Nodes that write declared state (a metric) are never copied.
 *
 * Composes with the later passes: the copies are backward nodes, so under
 * full_shard they read the parameters the backward all_gather brings in (no
 * extra gather; the schedule prefetches that gather for the copies, the
 * block's first readers); a tp_reduce among them is recomputed like any node
 * (Megatron's recompute repeats its all-reduce), on the comm stream.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* Recompute block b: copy the forward nodes its backward needs before its
 * first backward node. */
static void recompute_block(Graph *g, int b)
{
	int first_bwd = -1;
	for (int i = 0; i < g->nnodes && first_bwd < 0; i++)
		if (g->nodes[i]->block == b && g->nodes[i]->phase == PH_BWD)
			first_bwd = i;
	if (first_bwd < 0)
		return; /* nothing of this block is differentiated */

	/* made[v]: the forward node (index) of this block that produced SSA value v */
	int nv = g->nvalues;
	int *made = malloc((size_t)nv * sizeof(int));
	unsigned char *need = calloc((size_t)nv, 1);
	int *copy = malloc((size_t)nv * sizeof(int));
	if (!made || !need || !copy)
		die("out of memory");
	for (int v = 0; v < nv; v++)
		made[v] = copy[v] = -1;
	for (int i = 0; i < first_bwd; i++) {
		const Node *n = g->nodes[i];
		if (n->block == b && n->phase == PH_FWD && (n->progs & IR_IN_STEP) && n->out >= 0 &&
		    g->values[n->out]->kind == DP_T_ACT && g->values[n->out]->def == n->id)
			made[n->out] = i;
	}
	/* what the backward reads, then what those need within the block */
	for (int i = first_bwd; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && made[n->in[k]] >= 0)
				need[n->in[k]] = 1;
	}
	for (int i = first_bwd - 1; i >= 0; i--) {
		const Node *n = g->nodes[i];
		if (n->out < 0 || made[n->out] != i || !need[n->out])
			continue;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && made[n->in[k]] >= 0)
				need[n->in[k]] = 1;
	}

	/* the copies, in forward order, each inserted before the first backward node */
	int at = first_bwd;
	for (int i = 0; i < first_bwd; i++) {
		const Node *f = g->nodes[i];
		if (f->out < 0 || made[f->out] != i || !need[f->out])
			continue;
		const Value *v = g->values[f->out];
		Value *c = ir_value(g, ir_fresh_name(g, ir_fmt(g, "%s.rc", v->name)), v->dtype,
				    v->ndim, v->dims, DP_T_ACT, v->loc);
		c->block = v->block;
		c->batch_dim = v->batch_dim;
		c->seq_dim = v->seq_dim;
		int in[DP_MAX_IN];
		for (int k = 0; k < f->nin; k++)
			in[k] = f->in[k] >= 0 && f->in[k] < nv && copy[f->in[k]] >= 0 ? copy[f->in[k]]
										  : f->in[k];
		Node *n = ir_node(g, f->op, c->id, f->nin, in, PH_BWD, f->loc);
		memcpy(n->ia, f->ia, sizeof n->ia);
		memcpy(n->fa, f->fa, sizeof n->fa);
		n->progs = IR_IN_STEP;
		n->stream = f->stream;
		n->block = f->block;
		n->recompute = 1;
		c->def = n->id;
		ir_move_node(g, n, at++);
		copy[f->out] = c->id;
	}
	/* the backward reads the copies */
	for (int i = at; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && n->in[k] < nv && copy[n->in[k]] >= 0)
				n->in[k] = copy[n->in[k]];
	}
	free(made);
	free(need);
	free(copy);
}

int recompute_run(Graph *g, Diag *d)
{
	for (int b = 0; b < g->nblocks; b++)
		if (g->blocks[b].recompute)
			recompute_block(g, b);
	return 0;
}
