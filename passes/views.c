/*
 * views.c - copies that only rename bytes become views (pass "views").
 *
 * Before: the schedule form. A RESHAPE (same elements, another shape) and a
 * TP_COPY (Megatron's f: the identity forward, a tp_reduce of its gradient
 * backward) each run a copy kernel into a temporary of their own.
 *
 * After: where the copy's result can share its input's bytes, it does: the
 * output becomes a view of the input (view_of = in0, view_offset 0, def -1;
 * printed view=%in0+0) and every node writing it is removed,
 * so neither a kernel nor a second buffer is left. The memory plan then
 * keeps the root alive until the view's last use (a use through a view
 * counts for its root), and the verifier counts reads of the view as reads
 * of the root.
 *
 * A copy is aliased only when that cannot change a result:
 *  - in and out have the same dtype and element count (a reshape always
 *    has; the check keeps the pass honest for hand-written IR);
 *  - out is a temporary (DP_T_ACT), not already a view, and every node that
 *    writes it is a copy of this kind from the same input (a recomputed
 *    forward repeats the copy; an accumulating writer or another input
 *    would need the bytes to differ);
 *  - the input's root is a temporary too: a persistent root (a parameter,
 *    a flat buffer) is updated in place by the optimizer and collectives;
 *  - nothing updates the input's bytes after it is complete: no node that
 *    reads its output (accumulation, in-place updates) writes the input's
 *    root, so both names always hold the same numbers.
 * SPLIT is not aliased: a chunk of the last dim of a value with more than
 * one row is strided, and the executor's tensors are dense.
 */
#include "passes.h"

static int is_copy(const Node *n)
{
	return n->op == DP_OP_RESHAPE || n->op == DP_OP_TP_COPY;
}

/* Can n's output be a view of its input? writers[v]: how many nodes write
 * value v; copies[v]: how many of them are copies of in0 (see the top). */
static int aliasable(const Graph *g, const Node *n, const int *writers, const int *copies,
		     const char *updated)
{
	if (n->nin != 1 || n->out < 0 || ir_reads_out(n))
		return 0;
	const Value *x = g->values[n->in[0]], *o = g->values[n->out];
	const Value *r = ir_root(g, x);
	return o->kind == DP_T_ACT && o->view_of < 0 && r->kind == DP_T_ACT &&
	       o->dtype == x->dtype && ir_numel(o) == ir_numel(x) &&
	       writers[o->id] == copies[o->id] && !updated[r->id] && o != r;
}

int views_run(Graph *g, Diag *d)
{
	(void)d;
	int nv = g->nvalues;
	int *writers = ir_alloc(g, (size_t)nv * sizeof(int) + 1);
	int *copies = ir_alloc(g, (size_t)nv * sizeof(int) + 1);
	int *src = ir_alloc(g, (size_t)nv * sizeof(int) + 1); /* in0 of o's first copy */
	char *updated = ir_alloc(g, (size_t)nv + 1);          /* roots written in place */
	for (int v = 0; v < nv; v++)
		src[v] = -1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->out < 0)
			continue;
		writers[n->out]++;
		if (ir_reads_out(n))
			updated[ir_root(g, g->values[n->out])->id] = 1;
		if (is_copy(n) && n->nin == 1 && (src[n->out] < 0 || src[n->out] == n->in[0])) {
			src[n->out] = n->in[0];
			copies[n->out]++;
		}
	}
	/* in program order, so a copy of a copy is decided after the copy it
	 * reads; decide[v]: 0 undecided, 1 view, 2 kept (copies of one out agree) */
	char *decide = ir_alloc(g, (size_t)nv + 1);
	int kept = 0;
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (is_copy(n) && n->out >= 0 && !decide[n->out])
			decide[n->out] = aliasable(g, n, writers, copies, updated) ? 1 : 2;
		if (!is_copy(n) || n->out < 0 || decide[n->out] != 1) {
			g->nodes[kept++] = n;
			continue;
		}
		Value *o = g->values[n->out];
		if (o->view_of < 0) {
			o->view_of = n->in[0];
			o->view_offset = 0;
			o->def = -1;
		}
	}
	g->nnodes = kept;
	return 0;
}
