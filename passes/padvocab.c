/*
 * padvocab.c - the classifier's rows padded to an aligned length (pass
 * "padvocab"): llm.c's padded vocabulary (50257 -> 50304), as a row stride
 * of the logits and a zero-padded copy of the LM head's weight.
 *
 * Before: the sample form: the final program order; no value has an offset.
 *
 * After: (1) a temporary read as the logits of a cross_entropy,
 * cross_entropy_grad, cross_entropy_fused or correct, or written by a
 * cross_entropy_grad (the logits' gradient), whose rows are longer than
 * pad_vocab and not a multiple of it, has ld = its row length rounded up to
 * that multiple (printed `ld=N`): memplan reserves rows * ld elements, and
 * the kernels walk its rows by ld. Its shape is unchanged; the classifier's
 * kernels never read a padding column of the logits (they are masked out of
 * the softmax, the loss and correct) and write the gradient's padding
 * columns zero.
 * (2) The LM head's GEMMs that have the vocabulary as n or k, logits = x
 * w^T (`matmul transB`, the output padded) and dx = dlogits w (`matmul`,
 * in0 padded), for a weight w [V, d] (tied or not, any model), read a
 * `pad_rows` copy of w [ld, d] made just before each: w's rows, then zero
 * rows. On CUDA cuBLASLt then sees n (forward) and k (input gradient) as
 * 50304, sizes its aligned kernels take (measured on an H200 at 50257:
 * 96 and 132 TFLOP/s where the layers' GEMMs ran 400-600); the output's
 * padding columns take the products with the zero rows (masked), and the
 * gradient's zero padding columns meet the zero rows in k. The CPU computes
 * the real extent (n = the output's columns, k = in0's), reading w's first
 * V rows: its sums are those without the pass, bitwise (tests/padvocab.sh).
 * The weight gradient (dw = dlogits^T x, its m the vocabulary) is left
 * alone here: it writes the parameter's gradient, dense. (On CUDA it ran on
 * an sm80 kernel at 516 TFLOP/s at m = 50257; runtime/cuda/gemm.cu's
 * vocab_split makes it two calls, 50176 rows and 81, with no padding row.)
 *
 * Why a copy and not a padded parameter (llm.c pads wte itself): the
 * parameter, its gradient, the optimizer's state, the gradient norm,
 * sharding's flat buffers, pp's stage sub-groups, offload and the
 * checkpoints all keep the user's shape and never see a padding row, so no
 * padded row can take a gradient or an update; the copy costs one read and
 * one write of w per head GEMM (GPT-2 bf16: 2 x 77 MB, ~0.03 ms each on an
 * H100 at 3.35 TB/s, against the ~20 ms the odd sizes cost), and a
 * temporary of w's size that lives from the copy to its GEMM.
 *
 * A value is padded only when every node that reads or writes it takes a
 * stride (dp_op_takes_ld: matmul and the classifier's kernels) and it is a
 * plain temporary, neither a view nor viewed, except by views of all of it
 * (offset 0, its shape: the fused classifier's gradient, which
 * cross_entropy_fused writes over the logits, passes/fuse.c), which take the
 * same stride and whose readers must take strides too. The step file carries the
 * stride (DpTensor.ld); the decoder refuses it on any other op, and a
 * matmul whose in1 has more rows than its k or n unless in0's or the
 * output's stride covers them (format/stepfile_check.c).
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* Is value a a view of all of value v, offset 0 and the same shape (the fused
 * classifier's gradient over its logits)? */
static int alias_of(const Graph *g, const Value *a, int v)
{
	const Value *x = g->values[v];
	return a->view_of == v && a->view_offset == 0 && a->ndim == x->ndim &&
	       !memcmp(a->dims, x->dims, (size_t)x->ndim * sizeof x->dims[0]);
}

/* dense[v]: a node other than a stride-taking one touches value v (one
 * walk over the nodes: a scan per candidate, one candidate per
 * micro-batch's loss, was 0.44 CPU-s of a 32-micro-batch compile at GPT-3
 * 175B's shape); the pass changes no node before it reads these. */
static char *touched_dense(const Graph *g)
{
	char *dense = calloc((size_t)g->nvalues + 1, 1);
	if (!dense)
		die("out of memory");
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (dp_op_takes_ld(n->op))
			continue;
		if (n->out >= 0)
			dense[n->out] = 1;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0)
				dense[n->in[k]] = 1;
	}
	return dense;
}

/* Is value v a candidate: a plain temporary that only stride-taking ops
 * touch, directly or through a view of all of it (whole: a's index in
 * whole[], -1 ended, the values that are views of all of their root)? */
static int paddable(const Graph *g, int v, const char *viewed, const char *dense, const int *whole)
{
	const Value *x = g->values[v];
	if (x->kind != DP_T_ACT || x->view_of >= 0 || viewed[v] || x->ndim < 1 || x->ld || dense[v])
		return 0;
	for (int k = 0; whole[k] >= 0; k++)
		if (alias_of(g, g->values[whole[k]], v) && dense[whole[k]])
			return 0;
	return 1;
}

/* The rows the padded head's GEMM n (its weight in1 read transposed, its
 * output padded) or k (in0 padded, in1 plain) could have: the padded
 * stride, or 0 when matmul n is no LM-head GEMM over a [V, d] weight. The
 * weight gradient (in0 transposed) keeps m = V: its output is the
 * parameter's gradient, dense, and its odd m costs nothing on Hopper
 * (measured: 518 TFLOP/s for GPT-2's). */
static int64_t head_rows(const Graph *g, const Node *n)
{
	if (n->op != DP_OP_MATMUL || DP_ATTR(n, MATMUL, transA))
		return 0;
	const Value *a = g->values[n->in[0]], *w = g->values[n->in[1]], *o = g->values[n->out];
	if (w->ndim != 2 || w->ld || a->ndim < 1 || o->ndim < 1)
		return 0;
	if (DP_ATTR(n, MATMUL, transB)) /* logits = x w^T: n */
		return o->ld > o->dims[o->ndim - 1] && w->dims[0] == o->dims[o->ndim - 1] ? o->ld : 0;
	return a->ld > a->dims[a->ndim - 1] && w->dims[0] == a->dims[a->ndim - 1] ? a->ld : 0; /* dx */
}

/* Give the LM head's GEMM n a pad_rows copy of its weight, inserted just
 * before it, with the same programs, stream, stage and conditions. */
static void pad_weight(Graph *g, Node *n, int64_t rows)
{
	const Value *w = g->values[n->in[1]];
	int64_t dims[2] = {rows, w->dims[1]};
	Value *p = ir_value(g, ir_fresh_name(g, ir_fmt(g, "%s.pad", w->name)), w->dtype, 2, dims,
			    DP_T_ACT, n->loc);
	w = g->values[n->in[1]];
	for (int a = 0; a < DP_MAX_AXES; a++)
		p->place[a] = w->place[a];
	p->block = n->block;
	Node *c = ir_node(g, DP_OP_PAD_ROWS, p->id, 1, &n->in[1], n->phase, n->loc);
	DP_ATTR(c, PAD_ROWS, rows) = rows;
	c->progs = n->progs;
	c->flags = n->flags;
	c->stream = n->stream;
	c->recompute = n->recompute;
	c->block = n->block;
	c->stage = n->stage;
	c->chunk = n->chunk;
	p->def = c->id;
	ir_move_node(g, c, ir_node_index(g, n));
	n->in[1] = p->id;
}

int padvocab_run(Graph *g, Diag *d)
{
	(void)d;
	int64_t pad = g->pad_vocab;
	if (pad <= 0)
		return 0;
	char *viewed = calloc((size_t)g->nvalues + 1, 1), *dense = touched_dense(g);
	int *whole = malloc(sizeof *whole * ((size_t)g->nvalues + 1)), nwhole = 0;
	if (!viewed || !whole)
		die("out of memory");
	for (int v = 0; v < g->nvalues; v++) {
		if (g->values[v]->view_of < 0)
			continue;
		if (!alias_of(g, g->values[v], g->values[v]->view_of))
			viewed[g->values[v]->view_of] = 1;
		else
			whole[nwhole++] = v;
	}
	whole[nwhole] = -1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->op != DP_OP_XENT && n->op != DP_OP_XENT_GRAD && n->op != DP_OP_CORRECT &&
		    n->op != DP_OP_XENT_FUSED)
			continue;
		int cand[2] = {n->in[0], n->op == DP_OP_XENT_GRAD ? n->out : -1};
		for (int c = 0; c < 2; c++) {
			if (cand[c] < 0 || !paddable(g, cand[c], viewed, dense, whole))
				continue;
			Value *x = g->values[cand[c]];
			int64_t cols = x->dims[x->ndim - 1];
			if (!(cols > pad && cols % pad))
				continue;
			x->ld = (cols + pad - 1) / pad * pad;
			for (int k = 0; k < nwhole; k++) /* the fused classifier's gradient */
				if (alias_of(g, g->values[whole[k]], cand[c]))
					g->values[whole[k]]->ld = x->ld;
		}
	}
	free(viewed);
	free(dense);
	free(whole);
	for (int i = 0; i < g->nnodes; i++) {
		int64_t rows = head_rows(g, g->nodes[i]);
		if (rows) {
			pad_weight(g, g->nodes[i], rows);
			i++; /* past the matmul, which moved up one */
		}
	}
	return 0;
}
