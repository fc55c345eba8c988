/*
 * bucket.c - flat-buffer relayout and collective fusion (pass "bucket").
 *
 * Before: the collectives form: one in-place collective per gradient (ddp:
 * ALL_REDUCE out=grad, nin=0), each right after the gradient's last backward
 * writer; params and grads are views of flat.params / flat.grads at equal
 * offsets in declaration order.
 *
 * After:
 * - Params and grads are re-laid out in their flat buffers in the order
 *   their collectives appear (backward order), then the grads without a
 *   collective in their old order; a param keeps the same offset as its
 *   grad, and the flat buffers keep their size (no padding). Consecutive
 *   collectives therefore cover contiguous ranges.
 * - Consecutive collectives with the same op, axes, flags and flat buffer are
 *   fused greedily up to bucket_mb MiB (a bucket holds at least one grad, so
 *   a grad larger than the limit is a bucket of its own). Each bucket is a
 *   view value "bucket.rN" (DP_T_GRAD, param -1, f32 1-D, view_of the flat
 *   buffer at its first member's offset), a Bucket record (members = grad
 *   ids), and ONE collective out=the view, bucket=N, at the position of its
 *   last member's collective (that node is reused; the other members' nodes
 *   are removed).
 *
 * Sharded strategies (zero1, zero2, full_shard, hybrid_shard) arrive already
 * bucketed by the collectives pass and pass through unchanged.
 *
 * Why: one call per bucket amortises the per-collective latency, and the
 * view makes the call zero-copy (no pack/unpack kernels). Fusing only
 * consecutive collectives and placing the bucket at its last member keeps
 * every member complete when the bucket starts.
 */
#include <string.h>

#include "passes.h"

/* A gradient collective this pass may fuse: in-place on a grad view of a
 * flat buffer. Other collectives (later strategies) are left as they are. */
static int fusable(const Graph *g, const Node *n)
{
	if (n->op != DPK_ALL_REDUCE || n->out < 0 || n->nin != 0 || n->bucket >= 0)
		return 0;
	const Value *v = g->values[n->out];
	return v->kind == DP_T_GRAD && v->param >= 0 && v->view_of >= 0;
}

/* Offset of every grad (and its param) in the new layout. Each flat buffer
 * is laid out on its own: collective order first, then the rest. */
static void relayout(Graph *g)
{
	int nv = g->nvalues;
	int *order = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
	char *seen = ir_alloc(g, (size_t)(nv ? nv : 1));
	int k = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (fusable(g, n) && !seen[n->out]) {
			seen[n->out] = 1;
			order[k++] = n->out;
		}
	}
	/* The remaining grads, by their current offset (stable: value id). */
	int rest0 = k;
	for (int v = 0; v < nv; v++) {
		const Value *gv = g->values[v];
		if (gv->kind == DP_T_GRAD && gv->param >= 0 && gv->view_of >= 0 && !seen[v]) {
			int j = k++;
			while (j > rest0 && g->values[order[j - 1]]->view_offset > gv->view_offset) {
				order[j] = order[j - 1];
				j--;
			}
			order[j] = v;
		}
	}
	/* Assign offsets per flat buffer, in that order. */
	int64_t *next = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int64_t));
	for (int j = 0; j < k; j++) {
		Value *gv = g->values[order[j]];
		Value *p = g->values[gv->param];
		gv->view_offset = next[gv->view_of];
		next[gv->view_of] += ir_numel(gv);
		if (p->view_of >= 0)
			p->view_offset = gv->view_offset;
	}
	for (int f = 0; f < nv; f++)
		if (next[f] && next[f] != ir_numel(g->values[f]))
			die("bucket: grads cover %lld of %lld elements of %s", (long long)next[f],
			    (long long)ir_numel(g->values[f]), g->values[f]->name);
}

/* Letter of a bucket's name: r = reduce (all_reduce, reduce_scatter),
 * g = gather, as in the IR's bucket=r3 / bucket=g0. */
static char bucket_letter(IrOp op)
{
	return op == DPK_ALL_GATHER ? 'g' : 'r';
}

/* Closes the bucket made of the collectives mem[0..nmem-1] (program order,
 * all fusable, contiguous in one flat buffer). */
static void make_bucket(Graph *g, Node **mem, int nmem)
{
	Node *tail = mem[nmem - 1];
	const Value *first = g->values[mem[0]->out];
	int *members = ir_alloc(g, (size_t)nmem * sizeof(int));
	int64_t elems = 0;
	int block = g->values[first->param]->block;
	for (int i = 0; i < nmem; i++) {
		const Value *gv = g->values[mem[i]->out];
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

/* Can collective n join the open bucket (members mem[0..nmem-1])? */
static int joins(const Graph *g, Node **mem, int nmem, const Node *n, int64_t limit)
{
	const Node *t = mem[nmem - 1];
	const Value *tv = g->values[t->out], *nv = g->values[n->out];
	if (n->op != t->op || n->ia[0] != t->ia[0] || n->flags != t->flags ||
	    n->stream != t->stream || n->progs != t->progs || nv->view_of != tv->view_of ||
	    nv->dtype != tv->dtype || nv->view_offset != tv->view_offset + ir_numel(tv))
		return 0;
	int64_t bytes = 0;
	for (int i = 0; i < nmem; i++)
		bytes += ir_numel(g->values[mem[i]->out]);
	bytes = (bytes + ir_numel(nv)) * (int64_t)ir_dtype_size(nv->dtype);
	return bytes <= limit;
}

int bucket_run(Graph *g, Diag *d)
{
	(void)d;
	/* Sharded strategies (any block's) fix layout and buckets together in
	 * the collectives pass (a fused reduce_scatter changes which slice a
	 * rank holds), and their flat buffers are padded; nothing to do here. */
	if (ir_any_sharded(g))
		return 0;
	relayout(g);
	int64_t limit = (int64_t)((double)g->bucket_mb * 1024.0 * 1024.0);
	/* Snapshot the collectives in program order (the fusion removes nodes).
	 * A collective this pass does not fuse ends the open bucket: only
	 * consecutive collectives are fused. */
	Node **coll = ir_alloc(g, (size_t)(g->nnodes ? g->nnodes : 1) * sizeof(Node *));
	int nc = 0;
	for (int i = 0; i < g->nnodes; i++)
		if (dp_is_collective(g->nodes[i]->op))
			coll[nc++] = g->nodes[i];
	Node **mem = ir_alloc(g, (size_t)(nc ? nc : 1) * sizeof(Node *));
	int nmem = 0;
	for (int i = 0; i < nc; i++) {
		if (nmem && (!fusable(g, coll[i]) || !joins(g, mem, nmem, coll[i], limit))) {
			make_bucket(g, mem, nmem);
			nmem = 0;
		}
		if (fusable(g, coll[i]))
			mem[nmem++] = coll[i];
	}
	if (nmem)
		make_bucket(g, mem, nmem);
	return 0;
}
