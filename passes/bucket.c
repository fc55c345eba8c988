/*
 * bucket.c - the per-gradient all_reduces of each unit fused into one call
 * (pass "bucket").
 *
 * Before: the collectives form. In an all-ddp graph each gradient has its
 * own in-place ALL_REDUCE (out=grad, nin=0) right after its last backward
 * writer, and the layout pass put each unit's grads (and params) one after
 * another in flat.grads (flat.params) in the order those all_reduces run.
 * A sharded graph's collectives already cover one unit each.
 *
 * After (all-ddp graphs): each unit's all_reduces are one. The unit is a
 * view value "bucket.rN" (DP_T_GRAD, param -1, f32 1-D, view_of flat.grads
 * at its first member's offset), a Bucket record (members = grad ids in
 * program order), and ONE collective out=the view, bucket=N, at the
 * position of its last member's all_reduce (that node is reused; the other
 * members' nodes are removed). Sharded graphs pass through unchanged.
 *
 * Why: one call per bucket amortises the per-collective latency, and the
 * view makes the call zero-copy (no pack/unpack kernels). The units, and so
 * which gradients share a bucket (bucket_mb), are the layout pass's
 * decision; placing the bucket at its last member keeps every member
 * complete when it starts.
 */
#include "shard.h"

/* Letter of a bucket's name: r = reduce (all_reduce, reduce_scatter),
 * g = gather, as in the IR's bucket=r3 / bucket=g0. */
static char bucket_letter(IrOp op)
{
	return op == DP_OP_ALL_GATHER ? 'g' : 'r';
}

/* Fuses the collectives mem[0..nmem-1] (program order, contiguous in one
 * flat buffer) into one over a view of their range. */
static void make_bucket(Graph *g, Node **mem, int nmem)
{
	Node *tail = mem[nmem - 1];
	const Value *first = g->values[mem[0]->out];
	int *members = ir_alloc(g, (size_t)nmem * sizeof(int));
	int64_t elems = 0;
	int block = g->values[first->param]->block;
	for (int i = 0; i < nmem; i++) {
		const Value *gv = g->values[mem[i]->out];
		if (gv->view_of != first->view_of || gv->view_offset != first->view_offset + elems)
			die("bucket: %s is not next to the bucket's other gradients", gv->name);
		members[i] = gv->id;
		elems += ir_numel(gv);
		if (g->values[gv->param]->block != block)
			block = -1; /* spans blocks */
	}
	int id = g->nbuckets;
	int64_t dims[1] = {elems};
	Value *view = ir_value(g, ir_fmt(g, "bucket.%c%d", bucket_letter(tail->op), id), first->dtype,
			       1, dims, DP_T_GRAD, first->loc);
	view->view_of = first->view_of;
	view->view_offset = first->view_offset;
	view->block = block;
	for (int a = 0; a < DP_MAX_AXES; a++)
		view->place[a] = first->place[a];
	if (view->place[DP_AXIS_TP].kind == DP_PL_SHARD)
		view->place[DP_AXIS_TP].dim = 0; /* 1-D: this tp rank's part */
	Bucket b = {
		.op = tail->op,
		.axes = (unsigned)tail->ia[0],
		.view = view->id,
		.elems = elems,
		.nmembers = nmem,
		.members = members,
	};
	ir_add_bucket(g, &b);
	tail->out = view->id;
	tail->bucket = id;
	tail->block = block;
	for (int i = 0; i < nmem - 1; i++)
		ir_remove_node(g, mem[i]);
}

int bucket_run(Graph *g, Diag *d)
{
	(void)d;
	const ShardPlan *pl = shard_plan(g);
	if (pl->sharded)
		return 0;
	int nv = g->nvalues;
	int *unit_of = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int)); /* per grad */
	for (int v = 0; v < nv; v++)
		unit_of[v] = -1;
	for (int k = 0; k < pl->nu; k++)
		for (int i = 0; i < pl->u[k].nparams; i++)
			unit_of[g->values[pl->u[k].params[i]]->grad] = k;
	/* each unit's all_reduces in program order (snapshot: fusing removes nodes) */
	Node ***mem = ir_alloc(g, (size_t)(pl->nu ? pl->nu : 1) * sizeof(Node **));
	int *nmem = ir_alloc(g, (size_t)(pl->nu ? pl->nu : 1) * sizeof(int));
	for (int k = 0; k < pl->nu; k++)
		mem[k] = ir_alloc(g, (size_t)(pl->u[k].nparams ? pl->u[k].nparams : 1) * sizeof(Node *));
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (n->op != DP_OP_ALL_REDUCE || n->nin != 0 || n->out < 0 || n->bucket >= 0 ||
		    unit_of[n->out] < 0)
			continue;
		int k = unit_of[n->out];
		if (nmem[k] == pl->u[k].nparams)
			die("bucket: %s all_reduced twice", g->values[n->out]->name);
		mem[k][nmem[k]++] = n;
	}
	for (int k = 0; k < pl->nu; k++)
		if (nmem[k])
			make_bucket(g, mem[k], nmem[k]);
	return 0;
}
