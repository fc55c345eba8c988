/*
 * fuse.c - a linear and the gelu after it become one GEMM, forward and
 * backward (pass "fuse"): what cuBLASLt's GELU_AUX_BIAS and DGELU epilogues
 * compute in the GEMM's own epilogue, without a pass of the activation
 * through memory (docs/CUDA.md).
 *
 * Before: the schedule form. A linear h = linear(x, w[, b]) whose
 * pre-activation h is read by one gelu a = gelu(h) (and by the gelu_grad of
 * the backward); the backward's da = matmul(dy, w2) (no acc) read only by
 * dh = gelu_grad(da, h).
 *
 * After:
 *  - forward: the linear is `%h.gelu = linear_gelu(x, w[, b])`, a temporary
 *    [2, rows, n] whose first half is h and second half gelu(h); h and a
 *    are views of the two halves (view=%h.gelu+0 and +rows*n, def -1) and
 *    the gelu node is gone. Every reader of h or a reads the same numbers
 *    from the same place as before (the memory plan keeps the pair alive
 *    until the last use of either).
 *  - backward: the matmul is `dh = matmul_gelu_grad(dy, w2, h)` with the
 *    matmul's transposes, the gelu_grad node is gone and da with it.
 * A pair is fused only when nothing else can tell: both nodes in the same
 * programs, on the same stream, under the same DP_IF_LAST condition; the
 * linear's and gelu's results temporaries with one writer each, not views
 * already, of one dtype; the matmul's result read by nothing but the
 * gelu_grad, and h complete before the matmul runs. The CPU backend runs the
 * fused ops as the two kernels they replace (bitwise the same results); on
 * CUDA one cuBLASLt call does both (runtime/cuda/gemm.cu).
 */
#include "passes.h"

/* A temporary written by exactly one node and not a view: the only kind a
 * fused node may take over. */
static int plain_temp(const Graph *g, int v, const int *writers)
{
	const Value *x = g->values[v];
	return x->kind == DP_T_ACT && x->view_of < 0 && writers[v] == 1;
}

static int same_place(const Node *a, const Node *b)
{
	return a->progs == b->progs && a->stream == b->stream && a->flags == b->flags;
}

/* The one node after position i reading value v as operand k with op, or
 * NULL (none, or another node reads v too: then *others is set). */
static Node *sole_reader(const Graph *g, int i, int v, IrOp op, int k, int *others)
{
	Node *found = NULL;
	*others = 0;
	for (int j = 0; j < g->nnodes; j++) {
		Node *n = g->nodes[j];
		for (int q = 0; q < n->nin; q++) {
			if (n->in[q] != v)
				continue;
			if (j > i && n->op == op && q == k && !found)
				found = n;
			else if (n != found)
				*others = 1;
		}
	}
	return found;
}

/* linear -> gelu: the linear writes both halves, the two values view them. */
static void fuse_forward(Graph *g, Node *lin, const int *writers)
{
	int h = lin->out;
	if (h < 0 || !plain_temp(g, h, writers))
		return;
	Node *gelu = NULL;
	for (int j = ir_node_index(g, lin) + 1; j < g->nnodes && !gelu; j++)
		if (g->nodes[j]->op == DP_OP_GELU && g->nodes[j]->in[0] == h)
			gelu = g->nodes[j];
	if (!gelu || !same_place(lin, gelu) || gelu->out < 0 || !plain_temp(g, gelu->out, writers))
		return;
	Value *hv = g->values[h], *av = g->values[gelu->out];
	if (av->dtype != hv->dtype || ir_numel(av) != ir_numel(hv))
		return;
	int64_t cols = hv->dims[hv->ndim - 1], rows = ir_numel(hv) / cols;
	const char *name = ir_fmt(g, "%s.gelu", hv->name);
	if (ir_find_value(g, name))
		name = ir_fresh_name(g, name);
	Value *pack = ir_value(g, name, hv->dtype, 3, (int64_t[]){2, rows, cols}, DP_T_ACT, hv->loc);
	pack->block = hv->block;
	pack->def = lin->id;
	lin->op = DP_OP_LINEAR_GELU;
	lin->out = pack->id;
	hv->view_of = av->view_of = pack->id;
	hv->view_offset = 0;
	av->view_offset = rows * cols;
	hv->def = av->def = -1;
	ir_remove_node(g, gelu);
}

/* matmul -> gelu_grad: one matmul that multiplies by gelu'(h) as it stores.
 * Returns the matmul's old result, which nothing uses any more, or -1. */
static int fuse_backward(Graph *g, Node *mm, const int *writers)
{
	int da = mm->out, others;
	if (da < 0 || DP_ATTR(mm, MATMUL, acc) || !plain_temp(g, da, writers))
		return -1;
	int i = ir_node_index(g, mm);
	Node *gg = sole_reader(g, i, da, DP_OP_GELU_GRAD, 0, &others);
	if (!gg || others || gg->in[1] == da || !same_place(mm, gg) || gg->out < 0 ||
	    !plain_temp(g, gg->out, writers))
		return -1;
	const Value *dh = g->values[gg->out], *dav = g->values[da];
	if (dh->dtype != dav->dtype || ir_numel(dh) != ir_numel(dav))
		return -1;
	/* h is complete before the matmul: its root's writer comes first */
	const Value *root = ir_root(g, g->values[gg->in[1]]);
	int hw = -1;
	for (int j = 0; j < i && hw < 0; j++)
		if (g->nodes[j]->out == root->id)
			hw = j;
	if (hw < 0)
		return -1;
	mm->op = DP_OP_MATMUL_GELU_GRAD;
	mm->in[2] = gg->in[1];
	mm->nin = 3;
	mm->out = gg->out;
	g->values[gg->out]->def = mm->id;
	ir_remove_node(g, gg);
	return da;
}

int fuse_run(Graph *g, Diag *d)
{
	(void)d;
	int *writers = ir_alloc(g, (size_t)g->nvalues * sizeof(int) + 1);
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->out >= 0)
			writers[g->nodes[i]->out]++;
	/* forward first: the backward's h is then a view the matmul reads */
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->op == DP_OP_LINEAR)
			fuse_forward(g, g->nodes[i], writers);
	/* the matmuls' old results go last, all at once: ids stay valid */
	int *dead = ir_alloc(g, (size_t)g->nvalues * sizeof(int) + 1), ndead = 0;
	for (int i = 0; i < g->nnodes; i++) {
		int v = g->nodes[i]->op == DP_OP_MATMUL ? fuse_backward(g, g->nodes[i], writers) : -1;
		if (v >= 0)
			dead[ndead++] = v;
	}
	ir_drop_values(g, dead, ndead);
	return 0;
}
