/*
 * padvocab.c - the classifier's rows padded to an aligned length (pass
 * "padvocab"): llm.c's padded vocabulary (50257 -> 50304), as a row stride.
 *
 * Before: the sample form: the final program order; no value has an offset.
 *
 * After: a temporary read as the logits of a cross_entropy,
 * cross_entropy_grad or correct, or written by a cross_entropy_grad (the
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
 * plain temporary, neither a view nor viewed. The step file carries the
 * stride (DpTensor.ld); the decoder refuses it on any other op.
 */
#include <stdlib.h>

#include "passes.h"

/* Is value v a candidate: a plain temporary that only stride-taking ops touch? */
static int paddable(const Graph *g, int v, const char *viewed)
{
	const Value *x = g->values[v];
	if (x->kind != DP_T_ACT || x->view_of >= 0 || viewed[v] || x->ndim < 1 || x->ld)
		return 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		int touches = n->out == v;
		for (int k = 0; k < n->nin; k++)
			touches |= n->in[k] == v;
		if (touches && !dp_op_takes_ld(n->op))
			return 0;
	}
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
		if (g->values[v]->view_of >= 0)
			viewed[g->values[v]->view_of] = 1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->op != DP_OP_XENT && n->op != DP_OP_XENT_GRAD && n->op != DP_OP_CORRECT)
			continue;
		int cand[2] = {n->in[0], n->op == DP_OP_XENT_GRAD ? n->out : -1};
		for (int c = 0; c < 2; c++) {
			if (cand[c] < 0 || !paddable(g, cand[c], viewed))
				continue;
			Value *x = g->values[cand[c]];
			int64_t cols = x->dims[x->ndim - 1];
			if (cols > pad && cols % pad)
				x->ld = (cols + pad - 1) / pad * pad;
		}
	}
	free(viewed);
	return 0;
}
