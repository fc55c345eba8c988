/*
 * op_grad.c - the gradient rules of the ops (the GRAD column of format/ops.def).
 *
 * A rule gets the forward node and the gradient of its output and emits the
 * gradient contributions to its inputs through the gradient builder (ir.h,
 * ir/grad.c); it only says which kernel computes each contribution. Most
 * activations share act_x / act_y with their gradient kernel in the table's
 * GRAD column; the rules here that name kernels are the ops whose backward is
 * more than one kernel or permutes operands.
 */
#include "op_rules.h"

/* The kernel the GRAD column names for n's op. A rule that sets attributes of
 * what it emits names them by that op (DP_ATTR(m, ATTENTION_GRAD, heads)). */
#define GRAD_OP(n) (ir_ops[(n)->op].grad_op)

/* ---- gradient rules ---- */

/* ---- generic rules ---- */

/* y = x (copy, tp_reduce's forward-to-backward identity): dy passes. */
void ir_grad_pass(GradCtx *c, Node *n, int dy)
{
	ir_ad_pass_grad(c, n->in[0], dy);
}

/* An activation whose gradient kernel (grad_op) reads dy and the input x. */
void ir_grad_act_x(GradCtx *c, Node *n, int dy)
{
	ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 2, (int[]){dy, n->in[0]});
}

/* An activation whose gradient kernel (grad_op) reads dy and the output y
 * (tanh: dx = dy * (1 - y^2), softmax). */
void ir_grad_act_y(GradCtx *c, Node *n, int dy)
{
	ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 2, (int[]){dy, n->out});
}


/* y = x @ w + b: d.x = d.y @ w^T; grad.w += x^T @ d.y; grad.b += sum_rows d.y. */
void ir_grad_linear(GradCtx *c, Node *n, int dy)
{
	Node *m;
	if ((m = ir_ad_emit_acc(c, DP_OP_MATMUL, n->in[0], 2, (int[]){dy, n->in[1]})))
		DP_ATTR(m, MATMUL, transB) = 1;
	if ((m = ir_ad_emit_acc(c, DP_OP_MATMUL, n->in[1], 2, (int[]){n->in[0], dy})))
		DP_ATTR(m, MATMUL, transA) = 1;
	if (n->nin > 2 && n->in[2] >= 0)
		ir_ad_emit_acc(c, DP_OP_BIAS_GRAD, n->in[2], 1, (int[]){dy});
}

/*
 * C = op(A) @ op(B), op = transpose when transA / transB. With dC:
 *   ta tb | dA                    | dB
 *   0  0  | dC @ B^T              | A^T @ dC
 *   0  1  | dC @ B                | dC^T @ A
 *   1  0  | B @ dC^T              | A @ dC
 *   1  1  | B^T @ dC^T            | dC^T @ A^T
 */
void ir_grad_matmul(GradCtx *c, Node *n, int dc)
{
	int a = n->in[0], b = n->in[1];
	int ta = DP_ATTR(n, MATMUL, transA) != 0, tb = DP_ATTR(n, MATMUL, transB) != 0;
	Node *m;
	if (!ta)
		m = ir_ad_emit_acc(c, DP_OP_MATMUL, a, 2, (int[]){dc, b});
	else
		m = ir_ad_emit_acc(c, DP_OP_MATMUL, a, 2, (int[]){b, dc});
	if (m) {
		DP_ATTR(m, MATMUL, transA) = ta && tb;
		DP_ATTR(m, MATMUL, transB) = ta || !tb;
	}
	if (!tb)
		m = ir_ad_emit_acc(c, DP_OP_MATMUL, b, 2, (int[]){a, dc});
	else
		m = ir_ad_emit_acc(c, DP_OP_MATMUL, b, 2, (int[]){dc, a});
	if (m) {
		DP_ATTR(m, MATMUL, transA) = !ta || tb;
		DP_ATTR(m, MATMUL, transB) = ta && tb;
	}
}

/* y = a + b: both get dy. */
void ir_grad_add(GradCtx *c, Node *n, int dy)
{
	ir_ad_pass_grad(c, n->in[0], dy);
	ir_ad_pass_grad(c, n->in[1], dy);
}

/* y = a * b: d.a = dy * b, d.b = dy * a. */
void ir_grad_mul(GradCtx *c, Node *n, int dy)
{
	ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 2, (int[]){dy, n->in[1]});
	ir_ad_emit_grad(c, GRAD_OP(n), n->in[1], 2, (int[]){dy, n->in[0]});
}


/* y = s * x: d.x = s * dy. */
void ir_grad_scale(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 1, (int[]){dy});
	if (m)
		DP_FATTR(m, SCALE, scale) = DP_FATTR(n, SCALE, scale);
}

/* y = dropout(x): d.x = dropout(dy) with the same keys, positions, site and
 * p, so the same mask (a function of them, never stored). */
void ir_grad_dropout(GradCtx *c, Node *n, int dy)
{
	int in[DP_MAX_IN] = {dy, n->in[1], n->nin > 2 ? n->in[2] : -1};
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], n->nin, in);
	if (m) {
		DP_FATTR(m, DROPOUT, p) = DP_FATTR(n, DROPOUT, p);
		DP_ATTR(m, DROPOUT, site) = DP_ATTR(n, DROPOUT, site);
	}
}

/* y = x + b (broadcast over rows): d.x = dy; d.b = sum_rows dy. */
void ir_grad_bias_add(GradCtx *c, Node *n, int dy)
{
	ir_ad_pass_grad(c, n->in[0], dy);
	ir_ad_emit_acc(c, DP_OP_BIAS_GRAD, n->in[1], 1, (int[]){dy});
}




/* The loss is the seed (dy = -1, an implicit 1): d.logits = scale * (softmax -
 * onehot). No gradient into the labels. The kernel cannot scale by a tensor,
 * so a cross_entropy that feeds further computation is not differentiable. */
void ir_grad_xent(GradCtx *c, Node *n, int dy)
{
	if (dy >= 0) {
		ir_ad_error(c, "cross_entropy: only a cross_entropy that is the loss itself can be "
			    "differentiated");
		return;
	}
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 2, (int[]){n->in[0], n->in[1]});
	if (m)
		DP_FATTR(m, XENT_GRAD, scale) = DP_FATTR(n, XENT, scale);
}

/* ---- gradient rules of the transformer ops ---- */

/* out = table[ids]: the table's gradient is a scatter-add of dy's rows into
 * [vocab, d] (the table's shape, an attribute: not the table, which the
 * scatter never reads); ids get none. */
void ir_grad_embedding(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_acc(c, GRAD_OP(n), n->in[1], 2, (int[]){dy, n->in[0]});
	if (m)
		DP_ATTR(m, EMBEDDING_GRAD, vocab) = c->g->values[n->in[1]]->dims[0];
}

void ir_grad_layernorm(GradCtx *c, Node *n, int dy)
{
	Node *m;
	float eps = DP_FATTR(n, LAYERNORM, eps);
	if ((m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 3, (int[]){dy, n->in[0], n->in[1]})))
		DP_FATTR(m, LAYERNORM_GRAD, eps) = eps;
	if ((m = ir_ad_emit_acc(c, DP_OP_LAYERNORM_GRAD_G, n->in[1], 2, (int[]){dy, n->in[0]})))
		DP_FATTR(m, LAYERNORM_GRAD_G, eps) = eps;
	ir_ad_emit_acc(c, DP_OP_BIAS_GRAD, n->in[2], 1, (int[]){dy});
}

void ir_grad_rmsnorm(GradCtx *c, Node *n, int dy)
{
	Node *m;
	float eps = DP_FATTR(n, RMSNORM, eps);
	if ((m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 3, (int[]){dy, n->in[0], n->in[1]})))
		DP_FATTR(m, RMSNORM_GRAD, eps) = eps;
	if ((m = ir_ad_emit_acc(c, DP_OP_RMSNORM_GRAD_G, n->in[1], 2, (int[]){dy, n->in[0]})))
		DP_FATTR(m, RMSNORM_GRAD_G, eps) = eps;
}



/* The backward recomputes the probabilities from qkv (nothing saved). */
void ir_grad_attention(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 2, (int[]){dy, n->in[0]});
	if (m)
		DP_ATTR(m, ATTENTION_GRAD, heads) = DP_ATTR(n, ATTENTION, heads);
}

/* Context-parallel attention: d qkv's q columns from the local queries; the
 * gathered kv's gradient (every key seen from these queries), which the
 * all_gather's gradient reduce_scatters back to the key's owner. */
void ir_grad_attention_cp(GradCtx *c, Node *n, int dy)
{
	const int in[4] = {dy, n->in[0], n->in[1], n->in[2]};
	int64_t heads = DP_ATTR(n, ATTENTION_CP, heads), cp = DP_ATTR(n, ATTENTION_CP, cp);
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 4, in);
	if (m) {
		DP_ATTR(m, ATTENTION_CP_GRAD, heads) = heads;
		DP_ATTR(m, ATTENTION_CP_GRAD, cp) = cp;
	}
	if ((m = ir_ad_emit_grad(c, DP_OP_ATTENTION_CP_GRAD_KV, n->in[1], 4, in))) {
		DP_ATTR(m, ATTENTION_CP_GRAD_KV, heads) = heads;
		DP_ATTR(m, ATTENTION_CP_GRAD_KV, cp) = cp;
	}
}

/* kv_pack's gradient scatters d kv back into the k and v columns. */
void ir_grad_kv_pack(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 1, (int[]){dy});
	if (m)
		DP_ATTR(m, KV_UNPACK, heads) = DP_ATTR(n, KV_PACK, heads);
}

/* A forward all_gather (cp's keys and values): each rank's block of the
 * gradient, summed over the group, is its input's gradient. */
void ir_grad_all_gather(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 1, (int[]){dy});
	if (m) {
		DP_ATTR(m, REDUCE_SCATTER, axes) = DP_ATTR(n, ALL_GATHER, axes);
		m->stream = DP_STREAM_COMM;
	}
}

/* A rotation's gradient is the opposite rotation; cos/sin (buffers) get none. */
void ir_grad_rope(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 3, (int[]){dy, n->in[1], n->in[2]});
	if (m)
		DP_ATTR(m, ROPE, inverse) = !DP_ATTR(n, ROPE, inverse);
}

void ir_grad_transpose(GradCtx *c, Node *n, int dy)
{
	ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 1, (int[]){dy});
}

/* dy reshaped back to x's shape: the attributes name x's dims after the first. */
void ir_grad_reshape(GradCtx *c, Node *n, int dy)
{
	const Value *x = ir_ad_value(c, n->in[0]);
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 1, (int[]){dy});
	if (!m)
		return;
	for (int i = 1; i < x->ndim; i++)
		*ir_reshape_dim(m, i - 1) = x->dims[i];
	DP_ATTR(m, RESHAPE, ndims) = x->ndim - 1;
}

void ir_grad_split(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 1, (int[]){dy});
	if (m) {
		DP_ATTR(m, SPLIT_GRAD, parts) = DP_ATTR(n, SPLIT, parts);
		DP_ATTR(m, SPLIT_GRAD, index) = DP_ATTR(n, SPLIT, index);
	}
}

/* Megatron's f: identity forward, all-reduce (tp_reduce) of the gradient. */
void ir_grad_tp_copy(GradCtx *c, Node *n, int dy)
{
	Node *m = ir_ad_emit_grad(c, GRAD_OP(n), n->in[0], 1, (int[]){dy});
	if (m) {
		DP_ATTR(m, TP_REDUCE, axes) = DP_ATTR(n, TP_COPY, axes);
		m->stream = DP_STREAM_COMM; /* a collective */
	}
}


