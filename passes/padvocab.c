/*
 * padvocab.c - the classifier's rows padded to an aligned length (pass
 * "padvocab"): llm.c's padded vocabulary (50257 -> 50304), as a row stride.
 *
 * Before: the sample form: the final program order; no value has an offset.
 *
 * After: a temporary read as the logits of a cross_entropy,
 * cross_entropy_grad, cross_entropy_fused or correct, or written by a cross_entropy_grad (the
 * logits' gradient), whose rows are longer than pad_vocab and not a multiple
 * of it, has ld = its row length rounded up to that multiple (printed
 * `ld=N`): memplan reserves rows * ld elements, and the kernels walk its rows
 * by ld. Its shape, and so every op's arithmetic, is unchanged: the matrix
 * products take ld as their leading dimension and compute the real columns
 * only, the classifier's kernels never read a padding column. So the CPU's
 * results are bitwise those without the pass (tests/padvocab.sh; on CUDA
 * cuBLASLt may choose another algorithm for the aligned layout), and
 * nothing else changes: the parameters (the tied wte and its gradient keep
 * the user's shape; their leading dimension is d), the optimizer, the
 * collectives and the checkpoints never see the padding.
 *
 * Why a stride and not padded parameters (llm.c pads wte to 50304 rows): the
 * point of the padding is the leading dimensions of the LM head's GEMMs.
 * logits = x wte^T, dx = dlogits wte and dwte = dlogits^T x read or write
 * the logits' rows, which at 50257 elements are 2-byte aligned in bf16 and
 * keep Hopper's TMA kernels out; wte's rows are d long and aligned already.
 * A stride aligns all three without a padded parameter, which would have to
 * be kept out of the gradient norm, the optimizer, sharding's flat buffers
 * and the checkpoints, and would change the summation blocking of dx's
 * GEMM (its k would grow to 50304).
 *
 * A value is padded only when every node that reads or writes it takes a
 * stride (dp_op_takes_ld: matmul and the classifier's kernels) and it is a
 * plain temporary, neither a view nor viewed, except by views of all of it
 * (offset 0, its shape: the fused classifier's gradient, which
 * cross_entropy_fused writes over the logits, passes/fuse.c), which take the
 * same stride and whose readers must take strides too. The step file carries the
 * stride (DpTensor.ld); the decoder refuses it on any other op.
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

/* Does a node other than a stride-taking one touch value v? */
static int touched_dense(const Graph *g, int v)
{
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		int touches = n->out == v;
		for (int k = 0; k < n->nin; k++)
			touches |= n->in[k] == v;
		if (touches && !dp_op_takes_ld(n->op))
			return 1;
	}
	return 0;
}

/* Is value v a candidate: a plain temporary that only stride-taking ops
 * touch, directly or through a view of all of it? */
static int paddable(const Graph *g, int v, const char *viewed)
{
	const Value *x = g->values[v];
	if (x->kind != DP_T_ACT || x->view_of >= 0 || viewed[v] || x->ndim < 1 || x->ld ||
	    touched_dense(g, v))
		return 0;
	for (int a = 0; a < g->nvalues; a++)
		if (alias_of(g, g->values[a], v) && touched_dense(g, a))
			return 0;
	return 1;
}

int padvocab_run(Graph *g, Diag *d)
{
	(void)d;
	int64_t pad = g->pad_vocab;
	if (pad <= 0)
		return 0;
	char *viewed = calloc((size_t)g->nvalues + 1, 1);
	if (!viewed)
		die("out of memory");
	for (int v = 0; v < g->nvalues; v++)
		if (g->values[v]->view_of >= 0 && !alias_of(g, g->values[v], g->values[v]->view_of))
			viewed[g->values[v]->view_of] = 1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->op != DP_OP_XENT && n->op != DP_OP_XENT_GRAD && n->op != DP_OP_CORRECT &&
		    n->op != DP_OP_XENT_FUSED)
			continue;
		int cand[2] = {n->in[0], n->op == DP_OP_XENT_GRAD ? n->out : -1};
		for (int c = 0; c < 2; c++) {
			if (cand[c] < 0 || !paddable(g, cand[c], viewed))
				continue;
			Value *x = g->values[cand[c]];
			int64_t cols = x->dims[x->ndim - 1];
			if (!(cols > pad && cols % pad))
				continue;
			x->ld = (cols + pad - 1) / pad * pad;
			for (int a = 0; a < g->nvalues; a++) /* the fused classifier's gradient */
				if (alias_of(g, g->values[a], cand[c]))
					g->values[a]->ld = x->ld;
		}
	}
	free(viewed);
	return 0;
}
