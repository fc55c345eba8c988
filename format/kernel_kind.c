/*
 * kernel_kind.c - which of an op's CUDA kernels an instruction runs, where
 * runtime/cuda chooses between kernels of very different costs by a rule
 * on the step file alone. One definition, read by three programs:
 * runtime/cuda/gemm.cu pairs a bias_grad with its weight gradient's GEMM by
 * dp_bgrad_pair; runtime/calibrate.c keys each measured point of an op
 * line with dp_kernel_kind_name's name; passes/simulate.c applies the same
 * rule to the compiled program (ir_build_program: the graph as the step
 * file's tensors and instructions) and prices an instruction among the
 * points of its own kind (docs/SIMULATE.md, "Kernel kinds").
 *
 * Why: an op line's points are keyed by their bytes (or FLOPs), and two
 * kernels of one op at interleaved sizes made one curve through both. On
 * the H200 (docs/SIMULATE.md, "The held-out micro-batch 4") a paired
 * bias_grad (BGRADA's sums added: ~1.3-1.6 us whatever its input) and the
 * position embedding's column sum (37-48 us) alternated along bias_grad's
 * points, and micro-batch 4's paired ones were priced 19-48 us.
 *
 * The kinds (kind 0 an op's general kernel):
 *  - bias_grad: "colsum" (cu_colsum over the rows), "paired" (the column
 *    sums from the matmul's BGRADA epilogue, added into the output);
 *  - the norms with a warp-per-row form (layernorm, rmsnorm, add_layernorm,
 *    add_rmsnorm and their _grad and _grad_add gradients, norm.cu): "block"
 *    (a block per row), "warp" (a 16-bit row of c <= 1024, c a multiple of
 *    8, every operand 16-byte aligned: held in a warp's registers);
 *  - cross_entropy_grad and cross_entropy_fused (loss.cu): "rows" (a block
 *    per row, two passes), "rows16" (16-bit logits whose strides are
 *    multiples of 8, 16-byte aligned: k_xent_grad_rows16, the row in
 *    registers).
 * Alignment is the arena offset's (the arenas' bases are aligned to 256
 * bytes); a graph without a memory plan (nbytes 0: --plan's candidates)
 * counts as aligned, as memplan aligns every root.
 */
#include "stepfile.h"

/* Instruction k writes bytes of t (their arena ranges overlap; without a
 * memory plan, SSA: only t's own writer, out == t). */
static int writes(const DpStep *s, const DpInstr *k, int32_t t)
{
	if (k->out < 0)
		return 0;
	const DpTensor *o = &s->tensors[k->out], *v = &s->tensors[t];
	if (!o->nbytes || !v->nbytes)
		return k->out == t;
	return o->space == v->space && o->offset < v->offset + v->nbytes &&
	       v->offset < o->offset + o->nbytes;
}

int64_t dp_bgrad_pair(const DpStep *s, int prog, uint32_t i)
{
	const DpInstr *mm = &s->prog[prog][i];
	if (mm->op != DP_OP_MATMUL || !DP_ATTR(mm, MATMUL, transA) || DP_ATTR(mm, MATMUL, transB) ||
	    s->tensors[mm->out].dtype != DP_F32)
		return -1;
	int32_t dy = mm->in[1];
	for (uint32_t j = i + 1; j < s->nprog[prog]; j++) {
		const DpInstr *k = &s->prog[prog][j];
		if (k->op == DP_OP_BIAS_GRAD && k->in[0] == dy) {
			if (k->stream != mm->stream || (k->flags & DP_IF_LAST) != (mm->flags & DP_IF_LAST) ||
			    s->tensors[k->out].dtype != DP_F32 ||
			    dp_numel(&s->tensors[k->out]) != dp_cols(&s->tensors[dy]))
				return -1;
			return j;
		}
		if (writes(s, k, dy))
			return -1;
	}
	return -1;
}

static int aligned16(const DpStep *s, int32_t t)
{
	return t < 0 || !s->tensors[t].nbytes || s->tensors[t].offset % 16 == 0;
}

static int is_norm(unsigned op)
{
	return op == DP_OP_LAYERNORM || op == DP_OP_RMSNORM || op == DP_OP_ADD_LAYERNORM ||
	       op == DP_OP_ADD_RMSNORM || op == DP_OP_LAYERNORM_GRAD || op == DP_OP_RMSNORM_GRAD ||
	       op == DP_OP_LAYERNORM_GRAD_ADD || op == DP_OP_RMSNORM_GRAD_ADD;
}

int dp_kernel_kind(const DpStep *s, int prog, uint32_t i)
{
	const DpInstr *in = &s->prog[prog][i];
	if (in->op == DP_OP_BIAS_GRAD) { /* paired: the first matmul before it claims it */
		for (uint32_t j = 0; j < i; j++)
			if (s->prog[prog][j].op == DP_OP_MATMUL && s->prog[prog][j].in[1] == in->in[0] &&
			    dp_bgrad_pair(s, prog, j) == (int64_t)i)
				return 1;
		return 0;
	}
	if (is_norm(in->op)) { /* norm.cu's warp-per-row test: in[1] is the gradients' x */
		const DpTensor *x = &s->tensors[in->in[in->op == DP_OP_LAYERNORM_GRAD ||
						    in->op == DP_OP_RMSNORM_GRAD ||
						    in->op == DP_OP_LAYERNORM_GRAD_ADD ||
						    in->op == DP_OP_RMSNORM_GRAD_ADD]];
		int64_t c = dp_cols(x);
		int ok = dp_is_half(x->dtype) && c % 8 == 0 && c <= 1024 && aligned16(s, in->out);
		for (int k = 0; k < DP_MAX_IN && ok; k++)
			ok = aligned16(s, in->in[k]);
		return ok;
	}
	if (in->op == DP_OP_XENT_GRAD || in->op == DP_OP_XENT_FUSED) { /* xent_rows16_fits */
		const DpTensor *x = &s->tensors[in->in[0]];
		int32_t o = in->op == DP_OP_XENT_FUSED ? in->in[0] : in->out;
		return dp_is_half(x->dtype) && dp_ld(x) % 8 == 0 && dp_ld(&s->tensors[o]) % 8 == 0 &&
		       aligned16(s, in->in[0]) && aligned16(s, o);
	}
	return 0;
}

void dp_kernel_kinds(const DpStep *s, int prog, int *kind)
{
	for (uint32_t i = 0; i < s->nprog[prog]; i++)
		kind[i] = s->prog[prog][i].op == DP_OP_BIAS_GRAD ? 0 : dp_kernel_kind(s, prog, i);
	for (uint32_t i = 0; i < s->nprog[prog]; i++) {
		int64_t j = s->prog[prog][i].op == DP_OP_MATMUL ? dp_bgrad_pair(s, prog, i) : -1;
		if (j >= 0)
			kind[j] = 1;
	}
}

const char *dp_kernel_kind_name(unsigned op, int kind)
{
	static const char *const bias[DP_KIND_MAX] = {"colsum", "paired"};
	static const char *const norm[DP_KIND_MAX] = {"block", "warp"};
	static const char *const xent[DP_KIND_MAX] = {"rows", "rows16"};
	if (kind < 0 || kind >= DP_KIND_MAX)
		return NULL;
	return op == DP_OP_BIAS_GRAD ? bias[kind]
	       : is_norm(op)        ? norm[kind]
	       : op == DP_OP_XENT_GRAD || op == DP_OP_XENT_FUSED ? xent[kind]
								 : NULL;
}
