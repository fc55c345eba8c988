/*
 * op_shape.c - the shape rules and batch rules of the ops (the shape and
 * BATCH columns of format/ops.def), run by passes/shape.c on every node.
 *
 * Shape rules fill a scratch `out` (dtype, ndim, dims) from the node's inputs,
 * which the shape pass has already shaped, or report a user error at the node
 * and return -1. Messages name the op as the DSL does and the operands by role
 * ("linear: x is f32[32,784] but w is f32[700,256]: inner dimensions differ").
 *
 * Batch rules (ir_batch_rule, at the bottom) keep a program's result
 * independent of how the global batch is cut into ranks and micro-batches.
 * Every per-sample value knows its batch dimension (data: dim 0) and, for
 * token data, its sequence dimension (dim 1). An op that would mix samples -
 * contract over the batch dim, move it, reduce along it, or line it up with a
 * dimension of another operand that is not per-sample - is a user error at
 * every world size, instead of a result that changes with the micro-batch.
 * Gradients are not checked: the backward sums parameter gradients over the
 * batch by construction (the weight gradient of a linear contracts over the
 * rows on purpose), which is the one place samples meet, and the loss scales
 * by the global batch.
 */
#include <stdio.h>
#include <string.h>

#include "op_rules.h"

#define V(g, id) ((g)->values[(id)])

/* ---- helpers ---- */

static const char *op_name(const Node *n)
{
	return ir_ops[n->op].name;
}

static int is_float(DpDtype t)
{
	return t == DP_F32 || dp_is_half(t);
}

static void copy_type(Value *out, const Value *v)
{
	out->dtype = v->dtype;
	out->ndim = v->ndim;
	memcpy(out->dims, v->dims, sizeof out->dims);
}

static void set_type(Value *out, DpDtype t, int ndim, const int64_t *dims)
{
	out->dtype = t;
	out->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		out->dims[i] = dims[i];
}

static int same_type(const Value *a, const Value *b)
{
	if (a->dtype != b->dtype || a->ndim != b->ndim)
		return 0;
	for (int i = 0; i < a->ndim; i++)
		if (a->dims[i] != b->dims[i])
			return 0;
	return 1;
}

static int need_float(Node *n, const Value *v, const char *role, Diag *d)
{
	if (is_float(v->dtype) && v->ndim >= 1)
		return 0;
	error_at(d, n->loc, "%s: %s must be a float tensor, got %s", op_name(n), role, IR_TYPE(v));
	return -1;
}

/* ---- shape rules ---- */

/* out has in0's type (copies, activations, accumulation). */
int ir_shape_like0(Graph *g, Node *n, Value *out, Diag *d)
{
	copy_type(out, V(g, n->in[0]));
	return 0;
}

/* CAST: in0's shape in out's dtype (set by the pass that makes it; a float
 * in0 to a float out). */
int ir_shape_cast(Graph *g, Node *n, Value *out, Diag *d)
{
	DpDtype dt = out->dtype;
	if (need_float(n, V(g, n->in[0]), "x", d))
		return -1;
	copy_type(out, V(g, n->in[0]));
	if (is_float(dt))
		out->dtype = dt;
	return 0;
}

int ir_shape_unary_float(Graph *g, Node *n, Value *out, Diag *d)
{
	if (need_float(n, V(g, n->in[0]), "x", d))
		return -1;
	return ir_shape_like0(g, n, out, d);
}

/* Are b's dims a's trailing dims (b has fewer)? */
static int trails(const Value *a, const Value *b)
{
	if (b->ndim < 1 || b->ndim >= a->ndim || a->dtype != b->dtype)
		return 0;
	for (int i = 0; i < b->ndim; i++)
		if (b->dims[b->ndim - 1 - i] != a->dims[a->ndim - 1 - i])
			return 0;
	return 1;
}

/* Elementwise binary: same shape and dtype; add broadcasts a smaller operand
 * over the other's leading dims (it becomes a bias_add). */
int ir_shape_binary(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *a = V(g, n->in[0]), *b = V(g, n->in[1]);
	if (n->op == DP_OP_ADD && (trails(a, b) || trails(b, a))) {
		/* add broadcasts the smaller operand over the other's leading dims
		 * (a learned position embedding [T, d] onto [B, T, d]): that is a
		 * bias_add, whose gradient sums over the leading dims */
		if (trails(b, a)) {
			int t = n->in[0];
			n->in[0] = n->in[1];
			n->in[1] = t;
		}
		n->op = DP_OP_BIAS_ADD;
		return ir_shape_bias_add(g, n, out, d);
	}
	if (!same_type(a, b)) {
		error_at(d, n->loc, "%s: operands differ: a is %s but b is %s (elementwise ops need "
			 "the same shape and dtype)", op_name(n), IR_TYPE(a), IR_TYPE(b));
		return -1;
	}
	if (need_float(n, a, "a", d))
		return -1;
	copy_type(out, a);
	return 0;
}

/* *_GRAD(dy, x): dy and x same type; out like x. */
int ir_shape_act_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]), *x = V(g, n->in[1]);
	if (!same_type(dy, x)) {
		error_at(d, n->loc, "%s: dy is %s but x is %s", op_name(n), IR_TYPE(dy), IR_TYPE(x));
		return -1;
	}
	copy_type(out, x);
	return 0;
}

/*
 * MATMUL: each operand folded to 2-D [prod(leading dims), last dim], then
 * transposed when its flag (transA, transB) is set. Without a transpose of in0, the
 * result keeps in0's leading dims ([rows..., n]); otherwise it is 2-D.
 */
int ir_shape_matmul(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *a = V(g, n->in[0]), *b = V(g, n->in[1]);
	if (need_float(n, a, "a", d) || need_float(n, b, "b", d))
		return -1;
	if (a->dtype != b->dtype) {
		error_at(d, n->loc, "%s: a is %s but b is %s: dtypes differ", op_name(n), IR_TYPE(a),
			 IR_TYPE(b));
		return -1;
	}
	int64_t ta = DP_ATTR(n, MATMUL, transA), tb = DP_ATTR(n, MATMUL, transB);
	int64_t am = ta ? ir_fold_cols(a) : ir_fold_rows(a), ak = ta ? ir_fold_rows(a) : ir_fold_cols(a);
	int64_t bk = tb ? ir_fold_cols(b) : ir_fold_rows(b), bn = tb ? ir_fold_rows(b) : ir_fold_cols(b);
	if (ak != bk) {
		error_at(d, n->loc, "%s: a is %s%s but b is %s%s: inner dimensions differ (%lld vs %lld)",
			 op_name(n), IR_TYPE(a), ta ? " (transposed)" : "", IR_TYPE(b),
			 tb ? " (transposed)" : "", (long long)ak, (long long)bk);
		return -1;
	}
	if (!ta && a->ndim >= 2) {
		copy_type(out, a);
		out->dims[a->ndim - 1] = bn;
	} else {
		set_type(out, a->dtype, 2, (int64_t[]){am, bn});
	}
	return 0;
}

/* LINEAR: x [rows..., k] @ w [k, n] + b [n] -> [rows..., n]. */
int ir_shape_linear(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]), *w = V(g, n->in[1]);
	int bi = n->nin > 2 ? n->in[2] : -1;
	if (need_float(n, x, "x", d) || need_float(n, w, "w", d))
		return -1;
	if (w->ndim != 2) {
		error_at(d, n->loc, "%s: w must be 2-D [in, out], got %s", op_name(n), IR_TYPE(w));
		return -1;
	}
	if (x->dtype != w->dtype) {
		error_at(d, n->loc, "%s: x is %s but w is %s: dtypes differ", op_name(n), IR_TYPE(x),
			 IR_TYPE(w));
		return -1;
	}
	if (ir_fold_cols(x) != w->dims[0]) {
		error_at(d, n->loc, "%s: x is %s but w is %s: inner dimensions differ", op_name(n),
			 IR_TYPE(x), IR_TYPE(w));
		return -1;
	}
	if (bi >= 0) {
		const Value *b = V(g, bi);
		if (b->ndim != 1 || b->dims[0] != w->dims[1] || b->dtype != w->dtype) {
			error_at(d, n->loc, "%s: b is %s but w is %s: b must be %s[%lld]", op_name(n),
				 IR_TYPE(b), IR_TYPE(w), ir_dtype_name(w->dtype), (long long)w->dims[1]);
			return -1;
		}
	}
	copy_type(out, x);
	out->dims[x->ndim - 1] = w->dims[1];
	return 0;
}

/* LINEAR_GELU: linear's operands -> [2, rows, n]: the pre-activation's
 * rows, then gelu's (passes/fuse.c). */
int ir_shape_linear_gelu(Graph *g, Node *n, Value *out, Diag *d)
{
	if (ir_shape_linear(g, n, out, d))
		return -1;
	set_type(out, out->dtype, 3, (int64_t[]){2, ir_fold_rows(out), ir_fold_cols(out)});
	return 0;
}

/* MATMUL_GELU_GRAD: matmul's shape; in2 (the pre-activation) the same. */
int ir_shape_matmul_gelu_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	if (ir_shape_matmul(g, n, out, d))
		return -1;
	const Value *h = V(g, n->in[2]);
	if (h->dtype != out->dtype || ir_numel(h) != ir_numel(out)) {
		error_at(d, n->loc, "%s: the product is %s but the pre-activation is %s", op_name(n),
			 IR_TYPE(out), IR_TYPE(h));
		return -1;
	}
	return 0;
}

/* BIAS_ADD: x [rows..., c...] + b [c...] (b = x's trailing dims). */
int ir_shape_bias_add(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]), *b = V(g, n->in[1]);
	if (!trails(x, b)) {
		error_at(d, n->loc, "%s: x is %s but b is %s: b's dims must be x's last dims "
			 "(b %s[%lld])", op_name(n), IR_TYPE(x), IR_TYPE(b), ir_dtype_name(x->dtype),
			 (long long)ir_fold_cols(x));
		return -1;
	}
	copy_type(out, x);
	return 0;
}

/* BIAS_GRAD: dy [rows..., c] -> [c]. */
int ir_shape_bias_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]);
	if (need_float(n, dy, "dy", d))
		return -1;
	set_type(out, dy->dtype, 1, (int64_t[]){ir_fold_cols(dy)});
	return 0;
}

/* Logits f32 [rows..., classes] and labels i32 [rows...] (cross_entropy, its
 * gradient, correct). */
static int check_xent(Graph *g, Node *n, Diag *d)
{
	const Value *lg = V(g, n->in[0]), *lb = V(g, n->in[1]);
	if (!is_float(lg->dtype) || lg->ndim < 2) {
		error_at(d, n->loc, "%s: logits must be f32[rows, classes], got %s", op_name(n),
			 IR_TYPE(lg));
		return -1;
	}
	if (lb->dtype != DP_I32) {
		error_at(d, n->loc, "%s: labels must be i32 class indices, got %s", op_name(n), IR_TYPE(lb));
		return -1;
	}
	int ok = lb->ndim == lg->ndim - 1;
	for (int i = 0; ok && i < lb->ndim; i++)
		ok = lb->dims[i] == lg->dims[i];
	if (!ok) {
		error_at(d, n->loc, "%s: logits is %s but labels is %s: labels must have one entry per "
			 "row of logits", op_name(n), IR_TYPE(lg), IR_TYPE(lb));
		return -1;
	}
	return 0;
}

int ir_shape_xent(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_xent(g, n, d))
		return -1;
	set_type(out, DP_F32, 1, (int64_t[]){1});
	return 0;
}

int ir_shape_xent_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_xent(g, n, d))
		return -1;
	copy_type(out, V(g, n->in[0]));
	return 0;
}

/* CORRECT: [correct, counted], f32 so that metrics are all one dtype. */
int ir_shape_correct(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_xent(g, n, d))
		return -1;
	set_type(out, DP_F32, 1, (int64_t[]){2});
	return 0;
}

/* A scalar kept in a [1] tensor (sqnorm, sqrt). */
int ir_shape_scalar(Graph *g, Node *n, Value *out, Diag *d)
{
	if (need_float(n, V(g, n->in[0]), "x", d))
		return -1;
	set_type(out, DP_F32, 1, (int64_t[]){1});
	return 0;
}

/* ---- shape rules of the transformer ops ---- */

static int need_dims(Node *n, const Value *v, const char *role, int ndim, const char *form,
		     Diag *d)
{
	if (is_float(v->dtype) && v->ndim == ndim)
		return 0;
	error_at(d, n->loc, "%s: %s must be %s, got %s", op_name(n), role, form, IR_TYPE(v));
	return -1;
}

/* A per-channel vector of x's last dim (layernorm/rmsnorm gamma and beta). */
static int need_channel(Node *n, const Value *x, const Value *v, const char *role, Diag *d)
{
	if (v->ndim == 1 && v->dims[0] == ir_fold_cols(x) && v->dtype == x->dtype)
		return 0;
	error_at(d, n->loc, "%s: x is %s but %s is %s: %s must be %s[%lld]", op_name(n), IR_TYPE(x),
		 role, IR_TYPE(v), role, ir_dtype_name(x->dtype), (long long)ir_fold_cols(x));
	return -1;
}

/* ids: i32 token ids [rows...] (at most 3 dims). */
static int check_ids(Graph *g, Node *n, const Value *ids, Diag *d)
{
	(void)g;
	if (ids->dtype != DP_I32 || ids->ndim < 1 || ids->ndim >= DP_MAX_DIMS) {
		error_at(d, n->loc, "%s: ids must be i32 token ids with 1 to %d dims, got %s",
			 op_name(n), DP_MAX_DIMS - 1, IR_TYPE(ids));
		return -1;
	}
	return 0;
}

/* EMBEDDING: ids [rows...], table [V, d] -> [rows..., d]. */
int ir_shape_embedding(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *ids = V(g, n->in[0]), *tab = V(g, n->in[1]);
	if (check_ids(g, n, ids, d) || need_dims(n, tab, "table", 2, "a float [vocab, dim] matrix", d))
		return -1;
	set_type(out, tab->dtype, ids->ndim, ids->dims);
	out->ndim = ids->ndim + 1;
	out->dims[ids->ndim] = tab->dims[1];
	return 0;
}

/* EMBEDDING_GRAD {dy [rows..., d], ids [rows...]} vocab=V -> [V, d], dy's
 * dtype (the table's: the embedding wrote dy's shape from it). */
int ir_shape_embedding_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]), *ids = V(g, n->in[1]);
	int64_t vocab = DP_ATTR(n, EMBEDDING_GRAD, vocab);
	if (check_ids(g, n, ids, d))
		return -1;
	int ok = dy->ndim == ids->ndim + 1 && vocab > 0;
	for (int i = 0; ok && i < ids->ndim; i++)
		ok = dy->dims[i] == ids->dims[i];
	if (!ok) {
		error_at(d, n->loc, "%s: dy is %s, ids %s and vocab=%lld: give dy [ids..., dim] and "
			 "vocab >= 1", op_name(n), IR_TYPE(dy), IR_TYPE(ids), (long long)vocab);
		return -1;
	}
	set_type(out, dy->dtype, 2, (int64_t[]){vocab, dy->dims[ids->ndim]});
	return 0;
}

/* LAYERNORM {x, gamma [C], beta [C]}, RMSNORM {x, g [C]}: out like x. */
int ir_shape_norm(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	if (need_float(n, x, "x", d) || need_channel(n, x, V(g, n->in[1]), "gamma", d))
		return -1;
	if (n->nin > 2 && need_channel(n, x, V(g, n->in[2]), "beta", d))
		return -1;
	copy_type(out, x);
	return 0;
}

/* ADD_LAYERNORM {x, residual, gamma [C], beta [C]}, ADD_RMSNORM {x,
 * residual, g [C]} -> [2, rows, C]: the sum's rows, then the norm's
 * (passes/fuse.c). */
int ir_shape_add_layernorm(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]), *r = V(g, n->in[1]);
	if (!same_type(x, r)) {
		error_at(d, n->loc, "%s: x is %s but the residual is %s", op_name(n), IR_TYPE(x),
			 IR_TYPE(r));
		return -1;
	}
	if (need_float(n, x, "x", d) || need_channel(n, x, V(g, n->in[2]), "gamma", d) ||
	    (n->nin > 3 && need_channel(n, x, V(g, n->in[3]), "beta", d)))
		return -1;
	copy_type(out, x);
	set_type(out, x->dtype, 3, (int64_t[]){2, ir_fold_rows(x), ir_fold_cols(x)});
	return 0;
}

/* LAYERNORM_GRAD / RMSNORM_GRAD {dy, x, gamma}: out like x;
 * LAYERNORM_GRAD_ADD / RMSNORM_GRAD_ADD {dy, x, gamma, d residual}: the
 * same, d residual like x. */
int ir_shape_norm_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[1]);
	if (ir_shape_act_grad(g, n, out, d) || need_float(n, x, "x", d) ||
	    need_channel(n, x, V(g, n->in[2]), "gamma", d))
		return -1;
	if (n->nin > 3 && !same_type(V(g, n->in[3]), x)) {
		error_at(d, n->loc, "%s: x is %s but the residual's gradient is %s", op_name(n),
			 IR_TYPE(x), IR_TYPE(V(g, n->in[3])));
		return -1;
	}
	return 0;
}

/* LAYERNORM_GRAD_G / RMSNORM_GRAD_G {dy, x}: [C]. */
int ir_shape_norm_grad_g(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[1]);
	if (ir_shape_act_grad(g, n, out, d) || need_float(n, x, "x", d))
		return -1;
	set_type(out, x->dtype, 1, (int64_t[]){ir_fold_cols(x)});
	return 0;
}

/* LAYERNORM_GRAD_GB {dy, x}: [2, C] (gamma's gradient, then beta's). */
int ir_shape_norm_grad_gb(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[1]);
	if (ir_shape_act_grad(g, n, out, d) || need_float(n, x, "x", d))
		return -1;
	set_type(out, x->dtype, 2, (int64_t[]){2, ir_fold_cols(x)});
	return 0;
}

/* qkv [B, T, 3C] with 3C divisible by 3 * heads. */
static int check_qkv(Graph *g, Node *n, const Value *qkv, Diag *d)
{
	int64_t heads = DP_ATTR(n, ATTENTION, heads);
	if (need_dims(n, qkv, "qkv", 3, "a float [batch, T, 3*C] tensor", d))
		return -1;
	if (heads < 1 || qkv->dims[2] % (3 * heads) != 0) {
		error_at(d, n->loc, "%s: qkv is %s: its last dim must split into q, k and v of %lld "
			 "heads each", op_name(n), IR_TYPE(qkv), (long long)heads);
		return -1;
	}
	return 0;
}

int ir_shape_attention(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *qkv = V(g, n->in[0]);
	if (check_qkv(g, n, qkv, d))
		return -1;
	copy_type(out, qkv);
	out->dims[2] = qkv->dims[2] / 3;
	return 0;
}

/* ATTENTION_GRAD {dy [B, T, C], qkv [B, T, 3C]}: out like qkv. */
int ir_shape_attention_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]), *qkv = V(g, n->in[1]);
	if (check_qkv(g, n, qkv, d))
		return -1;
	if (dy->ndim != 3 || dy->dtype != qkv->dtype || dy->dims[0] != qkv->dims[0] ||
	    dy->dims[1] != qkv->dims[1] || 3 * dy->dims[2] != qkv->dims[2]) {
		error_at(d, n->loc, "%s: dy is %s but qkv is %s", op_name(n), IR_TYPE(dy), IR_TYPE(qkv));
		return -1;
	}
	copy_type(out, qkv);
	return 0;
}

/* PAD_ROWS {w [r, c]} -> [rows, c] (rows >= r; made by passes/padvocab.c). */
int ir_shape_pad_rows(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *w = V(g, n->in[0]);
	int64_t rows = DP_ATTR(n, PAD_ROWS, rows);
	if (w->ndim != 2 || rows < w->dims[0]) {
		error_at(d, n->loc, "%s: w is %s: give a 2-D w of at most rows=%lld rows", op_name(n),
			 IR_TYPE(w), (long long)rows);
		return -1;
	}
	set_type(out, w->dtype, 2, (int64_t[]){rows, w->dims[1]});
	return 0;
}

/* KV_PACK {qkv [B, T, 3C]} -> [B, T, 2C]; KV_UNPACK {kv [B, T, 2C]} -> [B, T, 3C]. */
int ir_shape_kv_pack(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *qkv = V(g, n->in[0]);
	if (check_qkv(g, n, qkv, d))
		return -1;
	copy_type(out, qkv);
	out->dims[2] = qkv->dims[2] / 3 * 2;
	return 0;
}

int ir_shape_kv_unpack(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *kv = V(g, n->in[0]);
	if (need_dims(n, kv, "kv", 3, "a float [batch, T, 2*C] tensor", d))
		return -1;
	int64_t heads = DP_ATTR(n, KV_UNPACK, heads);
	if (heads < 1 || kv->dims[2] % (2 * heads) != 0) {
		error_at(d, n->loc, "%s: kv is %s: its last dim must split into k and v of %lld heads",
			 op_name(n), IR_TYPE(kv), (long long)heads);
		return -1;
	}
	copy_type(out, kv);
	out->dims[2] = kv->dims[2] / 2 * 3;
	return 0;
}

/* The cp attention's {qkv [B, T, 3C], kv [cp, B, T, 2C], pos i32 [T]}
 * starting at input k, kv gathered from the cp ranks. */
static int check_cp_operands(Graph *g, Node *n, int k, Diag *d)
{
	const Value *qkv = V(g, n->in[k]), *kv = V(g, n->in[k + 1]), *pos = V(g, n->in[k + 2]);
	if (check_qkv(g, n, qkv, d))
		return -1;
	int64_t b = qkv->dims[0], t = qkv->dims[1], c = qkv->dims[2] / 3;
	int64_t cp = DP_ATTR(n, ATTENTION_CP, cp);
	if (cp < 1 || kv->ndim != 4 || kv->dtype != qkv->dtype || kv->dims[0] != cp ||
	    kv->dims[1] != b || kv->dims[2] != t || kv->dims[3] != 2 * c) {
		error_at(d, n->loc, "%s: kv is %s but qkv is %s: kv must be [cp=%lld, %lld, %lld, %lld]",
			 op_name(n), IR_TYPE(kv), IR_TYPE(qkv), (long long)cp, (long long)b,
			 (long long)t, (long long)(2 * c));
		return -1;
	}
	if (pos->dtype != DP_I32 || pos->ndim != 1 || pos->dims[0] != t) {
		error_at(d, n->loc, "%s: pos is %s: it must be i32[%lld], the positions of qkv's rows",
			 op_name(n), IR_TYPE(pos), (long long)t);
		return -1;
	}
	return 0;
}

/* ATTENTION_CP {qkv, kv, pos} -> [B, T, C]. */
int ir_shape_attention_cp(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_cp_operands(g, n, 0, d))
		return -1;
	return ir_shape_attention(g, n, out, d);
}

/* ATTENTION_CP_GRAD {dy, qkv, kv, pos} -> like qkv. */
int ir_shape_attention_cp_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_cp_operands(g, n, 1, d))
		return -1;
	return ir_shape_attention_grad(g, n, out, d);
}

/* ATTENTION_CP_GRAD_KV {dy, qkv, kv, pos} -> like kv. */
int ir_shape_attention_cp_grad_kv(Graph *g, Node *n, Value *out, Diag *d)
{
	if (ir_shape_attention_cp_grad(g, n, out, d))
		return -1;
	copy_type(out, V(g, n->in[2]));
	return 0;
}

/* ATTENTION_CP_GRAD_BOTH {dy, qkv, kv, pos} -> flat [numel(kv) + numel(qkv)]:
 * d kv, then d qkv (passes/fuse.c makes each a view of its part). */
int ir_shape_attention_cp_grad_both(Graph *g, Node *n, Value *out, Diag *d)
{
	if (ir_shape_attention_cp_grad(g, n, out, d))
		return -1;
	const Value *qkv = V(g, n->in[1]), *kv = V(g, n->in[2]);
	set_type(out, qkv->dtype, 1, (int64_t[]){ir_numel(kv) + ir_numel(qkv)});
	return 0;
}

/* ROPE {qkv [B, T, 3C], cos [Tc, hd/2], sin [Tc, hd/2]}: out like qkv; T <= Tc and
 * 3C a multiple of 3 * hd. */
int ir_shape_rope(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *qkv = V(g, n->in[0]), *cs = V(g, n->in[1]), *sn = V(g, n->in[2]);
	if (need_dims(n, qkv, "qkv", 3, "a float [batch, T, 3*C] tensor", d) ||
	    need_dims(n, cs, "cos", 2, "a float [T, head_dim / 2] table", d))
		return -1;
	if (!same_type(cs, sn)) {
		error_at(d, n->loc, "%s: cos is %s but sin is %s", op_name(n), IR_TYPE(cs), IR_TYPE(sn));
		return -1;
	}
	int64_t hd = 2 * cs->dims[1];
	if (cs->dims[1] < 1 || qkv->dims[2] % (3 * hd) != 0) {
		error_at(d, n->loc, "%s: qkv is %s but cos is %s: the last dim of qkv must be a "
			 "multiple of 3 * %lld (q, k, v of head_dim 2 * %lld)", op_name(n), IR_TYPE(qkv),
			 IR_TYPE(cs), (long long)hd, (long long)cs->dims[1]);
		return -1;
	}
	if (qkv->dims[1] > cs->dims[0]) {
		error_at(d, n->loc, "%s: qkv is %s but cos is %s: the tables cover %lld positions, "
			 "fewer than T = %lld", op_name(n), IR_TYPE(qkv), IR_TYPE(cs),
			 (long long)cs->dims[0], (long long)qkv->dims[1]);
		return -1;
	}
	copy_type(out, qkv);
	return 0;
}

/* TRANSPOSE: the last two dims swapped. */
int ir_shape_transpose(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	if (x->ndim < 2) {
		error_at(d, n->loc, "%s: x must have at least 2 dims, got %s", op_name(n), IR_TYPE(x));
		return -1;
	}
	copy_type(out, x);
	out->dims[x->ndim - 2] = x->dims[x->ndim - 1];
	out->dims[x->ndim - 1] = x->dims[x->ndim - 2];
	return 0;
}

/* RESHAPE: out = [x.dims[0], d1, .., d<ndims>]; one of them may be -1 (inferred). */
int ir_shape_reshape(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	int64_t nd = DP_ATTR(n, RESHAPE, ndims);
	if (x->ndim < 1 || nd < 0 || nd >= DP_MAX_DIMS) {
		error_at(d, n->loc, "%s: x is %s: give 0 to %d dims after the first", op_name(n),
			 IR_TYPE(x), DP_MAX_DIMS - 1);
		return -1;
	}
	int64_t rest = ir_numel(x) / (x->dims[0] ? x->dims[0] : 1), prod = 1;
	int infer = -1;
	set_type(out, x->dtype, 1, x->dims);
	out->ndim = 1 + (int)nd;
	for (int i = 0; i < nd; i++) {
		int64_t v = *ir_reshape_dim(n, i);
		if (v == -1 && infer < 0) {
			infer = i + 1;
			continue;
		}
		if (v < 1) {
			error_at(d, n->loc, "%s: dim %d is %lld: dims must be positive (or -1 once)",
				 op_name(n), i + 1, (long long)v);
			return -1;
		}
		if (prod > rest / v) {
			error_at(d, n->loc, "%s: x is %s: %lld elements after the first dim, fewer than "
				 "the new shape needs", op_name(n), IR_TYPE(x), (long long)rest);
			return -1;
		}
		out->dims[i + 1] = v;
		prod *= v;
	}
	if (infer > 0) {
		if (prod == 0 || rest % prod != 0) {
			error_at(d, n->loc, "%s: x is %s: %lld elements after the first dim do not "
				 "split into blocks of %lld", op_name(n), IR_TYPE(x), (long long)rest,
				 (long long)prod);
			return -1;
		}
		out->dims[infer] = rest / prod;
		prod = rest;
	}
	if (prod != rest) {
		error_at(d, n->loc, "%s: x is %s: %lld elements after the first dim, the new shape "
			 "has %lld", op_name(n), IR_TYPE(x), (long long)rest, (long long)prod);
		return -1;
	}
	return 0;
}

/* SPLIT: chunk index of `parts` equal chunks of the last dim (SPLIT_GRAD's
 * attributes in the same slots). */
static int check_split(Node *n, const Value *x, int64_t lastdim, Diag *d)
{
	int64_t parts = DP_ATTR(n, SPLIT, parts), index = DP_ATTR(n, SPLIT, index);
	if (parts < 1 || lastdim % parts != 0 || index < 0 || index >= parts) {
		error_at(d, n->loc, "%s: x is %s: cannot take part %lld of %lld equal parts of its "
			 "last dim", op_name(n), IR_TYPE(x), (long long)index, (long long)parts);
		return -1;
	}
	return 0;
}

int ir_shape_split(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	if (need_float(n, x, "x", d) || check_split(n, x, ir_fold_cols(x), d))
		return -1;
	copy_type(out, x);
	out->dims[x->ndim - 1] /= DP_ATTR(n, SPLIT, parts);
	return 0;
}

/* SPLIT_GRAD: dy is one chunk; out has `parts` times its last dim. */
int ir_shape_split_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]);
	int64_t parts = DP_ATTR(n, SPLIT_GRAD, parts);
	if (need_float(n, dy, "dy", d) || check_split(n, dy, ir_fold_cols(dy) * parts, d))
		return -1;
	copy_type(out, dy);
	out->dims[dy->ndim - 1] *= parts;
	return 0;
}

/* ---- batch rules ---- */

/* "argument 2 'h'": an operand as the user wrote it (the value's name). */
static const char *arg_str(Graph *g, const Node *n, int k, char *buf, size_t len)
{
	snprintf(buf, len, "argument %d '%s'", k + 1, V(g, n->in[k])->name);
	return buf;
}

#define ARG(k) arg_str(g, n, (k), (char[160]){0}, 160)

#define MIXES "; the result would depend on how the global batch is split over ranks " \
	      "and micro-batches"

/* A per-sample operand where the op needs one that is the same for every
 * sample (a weight, a table). */
static int per_sample(Graph *g, Node *n, int k, const Value *v, const char *why, Diag *d)
{
	error_at(d, n->loc, "%s: %s is %s with the batch in dim %d, but %s%s", op_name(n),
		 ARG(k), IR_TYPE(v), v->batch_dim, why, MIXES);
	return -1;
}

/* Inputs from k on must not be per-sample. */
static int shared_from(Graph *g, Node *n, int k, const char *why, Diag *d)
{
	for (int i = k; i < n->nin; i++)
		if (n->in[i] >= 0 && V(g, n->in[i])->batch_dim >= 0)
			return per_sample(g, n, i, V(g, n->in[i]), why, d);
	return 0;
}

/* The batch dim of x must not be dim `dim`, which the op works along. */
static int not_along(Graph *g, Node *n, int k, const Value *x, int dim, const char *what,
		     Diag *d)
{
	if (x->batch_dim < 0 || x->batch_dim != dim)
		return 0;
	error_at(d, n->loc, "%s: %s is %s with the batch in dim %d, which %s%s", op_name(n),
		 ARG(k), IR_TYPE(x), dim, what, MIXES);
	return -1;
}

/* Elementwise operands a (in0) and b (in1). Same rank: the batch dims must
 * line up (a value that is not per-sample lined up with a batch dim is the
 * same only while its size happens to equal the micro-batch). Ranks differ:
 * the smaller one is broadcast over the larger's leading dims, so it must not
 * be per-sample and must not cover the larger's batch dim. */
static int batch_elemwise(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *a = V(g, n->in[0]), *b = V(g, n->in[1]);
	int ka = 0, kb = 1;
	if (a->ndim < b->ndim) {
		const Value *t = a;
		a = b;
		b = t;
		ka = 1;
		kb = 0;
	}
	if (a->ndim == b->ndim) {
		if (a->batch_dim != b->batch_dim) {
			int k = a->batch_dim >= 0 ? ka : kb, o = a->batch_dim >= 0 ? kb : ka;
			const Value *x = a->batch_dim >= 0 ? a : b, *y = a->batch_dim >= 0 ? b : a;
			if (y->batch_dim >= 0)
				error_at(d, n->loc, "%s: %s is %s with the batch in dim %d but %s is %s with "
					 "the batch in dim %d%s", op_name(n), ARG(k), IR_TYPE(x),
					 x->batch_dim, ARG(o), IR_TYPE(y), y->batch_dim, MIXES);
			else
				error_at(d, n->loc, "%s: %s is %s with the batch in dim %d, but %s (%s) is "
					 "the same for every sample: its dim %d lines up with the batch only "
					 "while its size equals the micro-batch%s", op_name(n), ARG(k),
					 IR_TYPE(x), x->batch_dim, ARG(o), IR_TYPE(y), x->batch_dim,
					 MIXES);
			return -1;
		}
	} else {
		int lead_dims = a->ndim - b->ndim;
		if (b->batch_dim >= 0) {
			error_at(d, n->loc, "%s: %s is %s with the batch in dim %d; broadcast over the "
				 "leading dims of %s (%s), its batch would line up with dim %d of %s%s",
				 op_name(n), ARG(kb), IR_TYPE(b), b->batch_dim, ARG(ka),
				 IR_TYPE(a), b->batch_dim + lead_dims, ARG(ka), MIXES);
			return -1;
		}
		if (a->batch_dim >= lead_dims) {
			error_at(d, n->loc, "%s: %s is %s with the batch in dim %d, which %s (%s) would "
				 "cover: one value per sample position that is the same for every "
				 "sample%s", op_name(n), ARG(ka), IR_TYPE(a), a->batch_dim,
				 ARG(kb), IR_TYPE(b), MIXES);
			return -1;
		}
	}
	out->batch_dim = a->batch_dim >= 0 ? a->batch_dim : b->batch_dim;
	out->seq_dim = a->seq_dim >= 0 ? a->seq_dim : b->ndim == a->ndim ? b->seq_dim : -1;
	return 0;
}

static int batch_matmul(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *a = V(g, n->in[0]), *b = V(g, n->in[1]);
	for (int k = 0; k < 2; k++) {
		const Value *x = k ? b : a;
		if ((k ? DP_ATTR(n, MATMUL, transB) : DP_ATTR(n, MATMUL, transA)) && x->ndim > 2) {
			error_at(d, n->loc, "%s: transpose_%c needs a 2-D operand, but %s is %s (matmul "
				 "folds leading dims into rows; reshape or transpose it first)",
				 op_name(n), k ? 'b' : 'a', k ? "b" : "a", IR_TYPE(x));
			return -1;
		}
	}
	if (DP_ATTR(n, MATMUL, transA) && a->batch_dim >= 0)
		return per_sample(g, n, 0, a, "transpose_a contracts over the rows of a", d);
	if (b->batch_dim >= 0)
		return per_sample(g, n, 1, b, DP_ATTR(n, MATMUL, transB) ? "transpose_b makes its rows the result's "
					   "columns" : "matmul contracts over the rows of b", d);
	out->batch_dim = a->batch_dim;
	out->seq_dim = a->seq_dim;
	return 0;
}

int ir_batch_rule(Graph *g, Node *n, Diag *d)
{
	Value *out = n->out >= 0 ? V(g, n->out) : NULL;
	const Value *x = n->nin > 0 && n->in[0] >= 0 ? V(g, n->in[0]) : NULL;
	if (!out)
		return 0;
	int bd = -1, sd = -1;
	switch ((OpBatch)ir_ops[n->op].batch) {
	case OP_BATCH_NONE:
		break;
	case OP_BATCH_SAME:
		bd = x->batch_dim;
		sd = x->seq_dim;
		break;
	case OP_BATCH_ELEMWISE:
	case OP_BATCH_BIAS:
		return batch_elemwise(g, n, out, d);
	case OP_BATCH_ROWS:
		if (not_along(g, n, 0, x, x->ndim - 1, "it works along (the last dim)", d) ||
		    shared_from(g, n, 1, "it must be the same for every sample", d))
			return -1;
		bd = x->batch_dim;
		sd = x->seq_dim;
		break;
	case OP_BATCH_LINEAR:
		if (not_along(g, n, 0, x, x->ndim - 1, "linear contracts over (the last dim)", d) ||
		    shared_from(g, n, 1, "a weight or bias must be the same for every sample", d))
			return -1;
		bd = x->batch_dim;
		sd = x->seq_dim;
		break;
	case OP_BATCH_MATMUL:
		return batch_matmul(g, n, out, d);
	case OP_BATCH_EMBED:
		if (shared_from(g, n, 1, "the table must be the same for every sample", d))
			return -1;
		bd = x->batch_dim;
		sd = x->seq_dim;
		break;
	case OP_BATCH_SEQ:
		if (x->batch_dim > 0) {
			error_at(d, n->loc, "%s: %s is %s with the batch in dim %d, but %s mixes the "
				 "positions of dim 1 and needs the batch in dim 0%s", op_name(n),
				 ARG(0), IR_TYPE(x), x->batch_dim, op_name(n), MIXES);
			return -1;
		}
		if (shared_from(g, n, 1, "the tables must be the same for every sample", d))
			return -1;
		bd = x->batch_dim;
		sd = x->seq_dim;
		break;
	case OP_BATCH_TRANSPOSE:
		if (x->batch_dim >= x->ndim - 2) {
			error_at(d, n->loc, "%s: %s is %s with the batch in dim %d: swapping its last two "
				 "dims would move the batch dimension%s", op_name(n), ARG(0), IR_TYPE(x),
				 x->batch_dim, MIXES);
			return -1;
		}
		bd = x->batch_dim;
		sd = x->seq_dim < x->ndim - 2 ? x->seq_dim : 2 * x->ndim - 3 - x->seq_dim;
		break;
	case OP_BATCH_RESHAPE:
		if (x->batch_dim > 0) {
			error_at(d, n->loc, "%s: %s is %s with the batch in dim %d, but reshape keeps only "
				 "dim 0 and regroups the rest, so it would move the batch dimension%s",
				 op_name(n), ARG(0), IR_TYPE(x), x->batch_dim, MIXES);
			return -1;
		}
		bd = x->batch_dim;
		/* the sequence dim survives when dim 1 is kept as it is */
		sd = x->seq_dim == 1 && DP_ATTR(n, RESHAPE, ndims) >= 1 && x->ndim > 1 &&
			     DP_ATTR(n, RESHAPE, d1) == x->dims[1]
			 ? 1
			 : -1;
		break;
	case OP_BATCH_REDUCE:
		if (not_along(g, n, 0, x, x->ndim - 1, "holds the classes", d))
			return -1;
		break;
	}
	out->batch_dim = (int8_t)bd;
	out->seq_dim = (int8_t)sd;
	return 0;
}
