/*
 * ops.c - the op registry: one row per kernel opcode (DP_KERNELS in stepfile.h)
 * with its text name, arity, whether it reads its output, and its shape,
 * gradient and cost rules. Adding an op is one row here plus its kernels.
 *
 * Shape rules fill a scratch `out` (dtype, ndim, dims) from the node's inputs,
 * which the shape pass has already shaped, or report a user error at the node
 * and return -1. Messages name the op as the DSL does and the operands by role
 * ("linear: x is f32[32,784] but w is f32[700,256]: inner dimensions differ").
 *
 * Gradient rules emit backward nodes through the GradCtx API (ir.h, written in
 * passes/autodiff.c); they only say which kernel computes each contribution.
 *
 * Cost rules count floating-point operations and bytes read + written, for
 * --stats and the accounting pass; rough but consistent (elementwise ops ~1
 * flop per element, transcendental ones a few).
 */
#include <stdio.h>
#include <string.h>

#include "ir.h"

#define V(g, id) ((g)->values[(id)])

/* ---- helpers ---- */

/* "f32[32,784]" into buf. */
static const char *type_str(const Value *v, char *buf, size_t len)
{
	int k = snprintf(buf, len, "%s[", ir_dtype_name(v->dtype));
	for (int i = 0; i < v->ndim && k > 0 && (size_t)k < len; i++)
		k += snprintf(buf + k, len - (size_t)k, "%s%lld", i ? "," : "", (long long)v->dims[i]);
	if (k > 0 && (size_t)k < len)
		snprintf(buf + k, len - (size_t)k, "]");
	return buf;
}

#define TYPE(v) type_str((v), (char[64]){0}, 64)

static const char *op_name(const Node *n)
{
	return ir_ops[n->op].name;
}

static int is_float(DpDtype t)
{
	return t == DP_F32 || t == DP_BF16;
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

/* Product of all dims but the last (rows of the folded 2-D view), and the last. */
static int64_t lead(const Value *v)
{
	int64_t r = 1;
	for (int i = 0; i + 1 < v->ndim; i++)
		r *= v->dims[i];
	return r;
}

static int64_t last(const Value *v)
{
	return v->ndim ? v->dims[v->ndim - 1] : 1;
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
	error_at(d, n->loc, "%s: %s must be a float tensor, got %s", op_name(n), role, TYPE(v));
	return -1;
}

/* ---- shape rules ---- */

/* out has in0's type (copy, scale, accum, relu, gelu, tanh). */
static int shape_like0(Graph *g, Node *n, Value *out, Diag *d)
{
	copy_type(out, V(g, n->in[0]));
	return 0;
}

static int shape_unary_float(Graph *g, Node *n, Value *out, Diag *d)
{
	if (need_float(n, V(g, n->in[0]), "x", d))
		return -1;
	return shape_like0(g, n, out, d);
}

/* Elementwise binary: same shape and dtype, no broadcasting. */
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

static int shape_bias_add(Graph *g, Node *n, Value *out, Diag *d);

static int shape_binary(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *a = V(g, n->in[0]), *b = V(g, n->in[1]);
	if (n->op == DPK_ADD && (trails(a, b) || trails(b, a))) {
		/* add broadcasts the smaller operand over the other's leading dims
		 * (a learned position embedding [T, d] onto [B, T, d]): that is a
		 * bias_add, whose gradient sums over the leading dims */
		if (trails(b, a)) {
			int t = n->in[0];
			n->in[0] = n->in[1];
			n->in[1] = t;
		}
		n->op = DPK_BIAS_ADD;
		return shape_bias_add(g, n, out, d);
	}
	if (!same_type(a, b)) {
		error_at(d, n->loc, "%s: operands differ: a is %s but b is %s (elementwise ops need "
			 "the same shape and dtype)", op_name(n), TYPE(a), TYPE(b));
		return -1;
	}
	if (need_float(n, a, "a", d))
		return -1;
	copy_type(out, a);
	return 0;
}

/* *_GRAD(dy, x): dy and x same type; out like x. */
static int shape_act_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]), *x = V(g, n->in[1]);
	if (!same_type(dy, x)) {
		error_at(d, n->loc, "%s: dy is %s but x is %s", op_name(n), TYPE(dy), TYPE(x));
		return -1;
	}
	copy_type(out, x);
	return 0;
}

/*
 * MATMUL: each operand folded to 2-D [prod(leading dims), last dim], then
 * transposed when its flag (ia0, ia1) is set. Without a transpose of in0, the
 * result keeps in0's leading dims ([rows..., n]); otherwise it is 2-D.
 */
static int shape_matmul(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *a = V(g, n->in[0]), *b = V(g, n->in[1]);
	if (need_float(n, a, "a", d) || need_float(n, b, "b", d))
		return -1;
	if (a->dtype != b->dtype) {
		error_at(d, n->loc, "%s: a is %s but b is %s: dtypes differ", op_name(n), TYPE(a),
			 TYPE(b));
		return -1;
	}
	int64_t am = n->ia[0] ? last(a) : lead(a), ak = n->ia[0] ? lead(a) : last(a);
	int64_t bk = n->ia[1] ? last(b) : lead(b), bn = n->ia[1] ? lead(b) : last(b);
	if (ak != bk) {
		error_at(d, n->loc, "%s: a is %s%s but b is %s%s: inner dimensions differ (%lld vs %lld)",
			 op_name(n), TYPE(a), n->ia[0] ? " (transposed)" : "", TYPE(b),
			 n->ia[1] ? " (transposed)" : "", (long long)ak, (long long)bk);
		return -1;
	}
	if (!n->ia[0] && a->ndim >= 2) {
		copy_type(out, a);
		out->dims[a->ndim - 1] = bn;
	} else {
		set_type(out, a->dtype, 2, (int64_t[]){am, bn});
	}
	return 0;
}

/* LINEAR: x [rows..., k] @ w [k, n] + b [n] -> [rows..., n]. */
static int shape_linear(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]), *w = V(g, n->in[1]);
	int bi = n->nin > 2 ? n->in[2] : -1;
	if (need_float(n, x, "x", d) || need_float(n, w, "w", d))
		return -1;
	if (w->ndim != 2) {
		error_at(d, n->loc, "%s: w must be 2-D [in, out], got %s", op_name(n), TYPE(w));
		return -1;
	}
	if (x->dtype != w->dtype) {
		error_at(d, n->loc, "%s: x is %s but w is %s: dtypes differ", op_name(n), TYPE(x),
			 TYPE(w));
		return -1;
	}
	if (last(x) != w->dims[0]) {
		error_at(d, n->loc, "%s: x is %s but w is %s: inner dimensions differ", op_name(n),
			 TYPE(x), TYPE(w));
		return -1;
	}
	if (bi >= 0) {
		const Value *b = V(g, bi);
		if (b->ndim != 1 || b->dims[0] != w->dims[1] || b->dtype != w->dtype) {
			error_at(d, n->loc, "%s: b is %s but w is %s: b must be %s[%lld]", op_name(n),
				 TYPE(b), TYPE(w), ir_dtype_name(w->dtype), (long long)w->dims[1]);
			return -1;
		}
	}
	copy_type(out, x);
	out->dims[x->ndim - 1] = w->dims[1];
	return 0;
}

/* BIAS_ADD: x [rows..., c...] + b [c...] (b = x's trailing dims). */
static int shape_bias_add(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]), *b = V(g, n->in[1]);
	if (!trails(x, b)) {
		error_at(d, n->loc, "%s: x is %s but b is %s: b's dims must be x's last dims "
			 "(b %s[%lld])", op_name(n), TYPE(x), TYPE(b), ir_dtype_name(x->dtype),
			 (long long)last(x));
		return -1;
	}
	copy_type(out, x);
	return 0;
}

/* BIAS_GRAD: dy [rows..., c] -> [c]. */
static int shape_bias_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]);
	if (need_float(n, dy, "dy", d))
		return -1;
	set_type(out, dy->dtype, 1, (int64_t[]){last(dy)});
	return 0;
}

/* Logits f32 [rows..., classes] and labels i32 [rows...] (cross_entropy, its
 * gradient, correct). */
static int check_xent(Graph *g, Node *n, Diag *d)
{
	const Value *lg = V(g, n->in[0]), *lb = V(g, n->in[1]);
	if (lg->dtype != DP_F32 || lg->ndim < 2) {
		error_at(d, n->loc, "%s: logits must be f32[rows, classes], got %s", op_name(n),
			 TYPE(lg));
		return -1;
	}
	if (lb->dtype != DP_I32) {
		error_at(d, n->loc, "%s: labels must be i32 class indices, got %s", op_name(n), TYPE(lb));
		return -1;
	}
	int ok = lb->ndim == lg->ndim - 1;
	for (int i = 0; ok && i < lb->ndim; i++)
		ok = lb->dims[i] == lg->dims[i];
	if (!ok) {
		error_at(d, n->loc, "%s: logits is %s but labels is %s: labels must have one entry per "
			 "row of logits", op_name(n), TYPE(lg), TYPE(lb));
		return -1;
	}
	return 0;
}

static int shape_xent(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_xent(g, n, d))
		return -1;
	set_type(out, DP_F32, 1, (int64_t[]){1});
	return 0;
}

static int shape_xent_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_xent(g, n, d))
		return -1;
	copy_type(out, V(g, n->in[0]));
	return 0;
}

/* CORRECT: [correct, counted], f32 so that metrics are all one dtype. */
static int shape_correct(Graph *g, Node *n, Value *out, Diag *d)
{
	if (check_xent(g, n, d))
		return -1;
	set_type(out, DP_F32, 1, (int64_t[]){2});
	return 0;
}

/* A scalar kept in a [1] tensor (sqnorm, sqrt). */
static int shape_scalar(Graph *g, Node *n, Value *out, Diag *d)
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
	error_at(d, n->loc, "%s: %s must be %s, got %s", op_name(n), role, form, TYPE(v));
	return -1;
}

/* A per-channel vector of x's last dim (layernorm/rmsnorm gamma and beta). */
static int need_channel(Node *n, const Value *x, const Value *v, const char *role, Diag *d)
{
	if (v->ndim == 1 && v->dims[0] == last(x) && v->dtype == x->dtype)
		return 0;
	error_at(d, n->loc, "%s: x is %s but %s is %s: %s must be %s[%lld]", op_name(n), TYPE(x),
		 role, TYPE(v), role, ir_dtype_name(x->dtype), (long long)last(x));
	return -1;
}

/* EMBEDDING: ids i32 [rows...] (at most 3 dims), table [V, d] -> [rows..., d]. */
static int check_embedding(Graph *g, Node *n, const Value *ids, const Value *tab, Diag *d)
{
	if (ids->dtype != DP_I32 || ids->ndim < 1 || ids->ndim >= DP_MAX_DIMS) {
		error_at(d, n->loc, "%s: ids must be i32 token ids with 1 to %d dims, got %s",
			 op_name(n), DP_MAX_DIMS - 1, TYPE(ids));
		return -1;
	}
	return need_dims(n, tab, "table", 2, "a float [vocab, dim] matrix", d);
}

static int shape_embedding(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *ids = V(g, n->in[0]), *tab = V(g, n->in[1]);
	if (check_embedding(g, n, ids, tab, d))
		return -1;
	set_type(out, tab->dtype, ids->ndim, ids->dims);
	out->ndim = ids->ndim + 1;
	out->dims[ids->ndim] = tab->dims[1];
	return 0;
}

/* EMBEDDING_GRAD {dy [rows..., d], ids [rows...], table [V, d]} -> [V, d]. */
static int shape_embedding_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]), *ids = V(g, n->in[1]), *tab = V(g, n->in[2]);
	if (check_embedding(g, n, ids, tab, d))
		return -1;
	int ok = dy->ndim == ids->ndim + 1 && dy->dims[ids->ndim] == tab->dims[1] &&
		 dy->dtype == tab->dtype;
	for (int i = 0; ok && i < ids->ndim; i++)
		ok = dy->dims[i] == ids->dims[i];
	if (!ok) {
		error_at(d, n->loc, "%s: dy is %s but ids is %s and table %s", op_name(n), TYPE(dy),
			 TYPE(ids), TYPE(tab));
		return -1;
	}
	copy_type(out, tab);
	return 0;
}

/* LAYERNORM {x, gamma [C], beta [C]}, RMSNORM {x, g [C]}: out like x. */
static int shape_norm(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	if (need_float(n, x, "x", d) || need_channel(n, x, V(g, n->in[1]), "gamma", d))
		return -1;
	if (n->nin > 2 && need_channel(n, x, V(g, n->in[2]), "beta", d))
		return -1;
	copy_type(out, x);
	return 0;
}

/* LAYERNORM_GRAD / RMSNORM_GRAD {dy, x, gamma}: out like x. */
static int shape_norm_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[1]);
	if (shape_act_grad(g, n, out, d) || need_float(n, x, "x", d) ||
	    need_channel(n, x, V(g, n->in[2]), "gamma", d))
		return -1;
	return 0;
}

/* LAYERNORM_GRAD_G / RMSNORM_GRAD_G {dy, x}: [C]. */
static int shape_norm_grad_g(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[1]);
	if (shape_act_grad(g, n, out, d) || need_float(n, x, "x", d))
		return -1;
	set_type(out, x->dtype, 1, (int64_t[]){last(x)});
	return 0;
}

/* qkv [B, T, 3C] with 3C divisible by 3 * heads (ia0). */
static int check_qkv(Graph *g, Node *n, const Value *qkv, Diag *d)
{
	if (need_dims(n, qkv, "qkv", 3, "a float [batch, T, 3*C] tensor", d))
		return -1;
	if (n->ia[0] < 1 || qkv->dims[2] % (3 * n->ia[0]) != 0) {
		error_at(d, n->loc, "%s: qkv is %s: its last dim must split into q, k and v of %lld "
			 "heads each", op_name(n), TYPE(qkv), (long long)n->ia[0]);
		return -1;
	}
	return 0;
}

static int shape_attention(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *qkv = V(g, n->in[0]);
	if (check_qkv(g, n, qkv, d))
		return -1;
	copy_type(out, qkv);
	out->dims[2] = qkv->dims[2] / 3;
	return 0;
}

/* ATTENTION_GRAD {dy [B, T, C], qkv [B, T, 3C]}: out like qkv. */
static int shape_attention_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]), *qkv = V(g, n->in[1]);
	if (check_qkv(g, n, qkv, d))
		return -1;
	if (dy->ndim != 3 || dy->dtype != qkv->dtype || dy->dims[0] != qkv->dims[0] ||
	    dy->dims[1] != qkv->dims[1] || 3 * dy->dims[2] != qkv->dims[2]) {
		error_at(d, n->loc, "%s: dy is %s but qkv is %s", op_name(n), TYPE(dy), TYPE(qkv));
		return -1;
	}
	copy_type(out, qkv);
	return 0;
}

/* ROPE {qkv [B, T, 3C], cos [Tc, hd/2], sin [Tc, hd/2]}: out like qkv; T <= Tc and
 * 3C a multiple of 3 * hd. */
static int shape_rope(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *qkv = V(g, n->in[0]), *cs = V(g, n->in[1]), *sn = V(g, n->in[2]);
	if (need_dims(n, qkv, "qkv", 3, "a float [batch, T, 3*C] tensor", d) ||
	    need_dims(n, cs, "cos", 2, "a float [T, head_dim / 2] table", d))
		return -1;
	if (!same_type(cs, sn)) {
		error_at(d, n->loc, "%s: cos is %s but sin is %s", op_name(n), TYPE(cs), TYPE(sn));
		return -1;
	}
	int64_t hd = 2 * cs->dims[1];
	if (cs->dims[1] < 1 || qkv->dims[2] % (3 * hd) != 0) {
		error_at(d, n->loc, "%s: qkv is %s but cos is %s: the last dim of qkv must be a "
			 "multiple of 3 * %lld (q, k, v of head_dim 2 * %lld)", op_name(n), TYPE(qkv),
			 TYPE(cs), (long long)hd, (long long)cs->dims[1]);
		return -1;
	}
	if (qkv->dims[1] > cs->dims[0]) {
		error_at(d, n->loc, "%s: qkv is %s but cos is %s: the tables cover %lld positions, "
			 "fewer than T = %lld", op_name(n), TYPE(qkv), TYPE(cs),
			 (long long)cs->dims[0], (long long)qkv->dims[1]);
		return -1;
	}
	copy_type(out, qkv);
	return 0;
}

/* TRANSPOSE: the last two dims swapped. */
static int shape_transpose(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	if (x->ndim < 2) {
		error_at(d, n->loc, "%s: x must have at least 2 dims, got %s", op_name(n), TYPE(x));
		return -1;
	}
	copy_type(out, x);
	out->dims[x->ndim - 2] = x->dims[x->ndim - 1];
	out->dims[x->ndim - 1] = x->dims[x->ndim - 2];
	return 0;
}

/* RESHAPE: out = [x.dims[0], ia0, .., ia(ia4-1)]; one of them may be -1 (inferred). */
static int shape_reshape(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	int64_t nd = n->ia[4];
	if (x->ndim < 1 || nd < 0 || nd >= DP_MAX_DIMS) {
		error_at(d, n->loc, "%s: x is %s: give 0 to %d dims after the first", op_name(n),
			 TYPE(x), DP_MAX_DIMS - 1);
		return -1;
	}
	int64_t rest = ir_numel(x) / (x->dims[0] ? x->dims[0] : 1), prod = 1;
	int infer = -1;
	set_type(out, x->dtype, 1, x->dims);
	out->ndim = 1 + (int)nd;
	for (int i = 0; i < nd; i++) {
		int64_t v = n->ia[i];
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
				 "the new shape needs", op_name(n), TYPE(x), (long long)rest);
			return -1;
		}
		out->dims[i + 1] = v;
		prod *= v;
	}
	if (infer > 0) {
		if (prod == 0 || rest % prod != 0) {
			error_at(d, n->loc, "%s: x is %s: %lld elements after the first dim do not "
				 "split into blocks of %lld", op_name(n), TYPE(x), (long long)rest,
				 (long long)prod);
			return -1;
		}
		out->dims[infer] = rest / prod;
		prod = rest;
	}
	if (prod != rest) {
		error_at(d, n->loc, "%s: x is %s: %lld elements after the first dim, the new shape "
			 "has %lld", op_name(n), TYPE(x), (long long)rest, (long long)prod);
		return -1;
	}
	return 0;
}

/* SPLIT: chunk ia1 of ia0 equal chunks of the last dim. */
static int check_split(Node *n, const Value *x, int64_t lastdim, Diag *d)
{
	if (n->ia[0] < 1 || lastdim % n->ia[0] != 0 || n->ia[1] < 0 || n->ia[1] >= n->ia[0]) {
		error_at(d, n->loc, "%s: x is %s: cannot take part %lld of %lld equal parts of its "
			 "last dim", op_name(n), TYPE(x), (long long)n->ia[1], (long long)n->ia[0]);
		return -1;
	}
	return 0;
}

static int shape_split(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]);
	if (need_float(n, x, "x", d) || check_split(n, x, last(x), d))
		return -1;
	copy_type(out, x);
	out->dims[x->ndim - 1] /= n->ia[0];
	return 0;
}

/* SPLIT_GRAD: dy is one chunk; out has ia0 times its last dim. */
static int shape_split_grad(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *dy = V(g, n->in[0]);
	if (need_float(n, dy, "dy", d) || check_split(n, dy, last(dy) * n->ia[0], d))
		return -1;
	copy_type(out, dy);
	out->dims[dy->ndim - 1] *= n->ia[0];
	return 0;
}

/* ---- gradient rules ---- */

/* y = x @ w + b: d.x = d.y @ w^T; grad.w += x^T @ d.y; grad.b += sum_rows d.y. */
static void grad_linear(GradCtx *c, Node *n, int dy)
{
	Node *m;
	if ((m = ad_emit_acc(c, DPK_MATMUL, n->in[0], 2, (int[]){dy, n->in[1]})))
		m->ia[1] = 1;
	if ((m = ad_emit_acc(c, DPK_MATMUL, n->in[1], 2, (int[]){n->in[0], dy})))
		m->ia[0] = 1;
	if (n->nin > 2 && n->in[2] >= 0)
		ad_emit_acc(c, DPK_BIAS_GRAD, n->in[2], 1, (int[]){dy});
}

/*
 * C = op(A) @ op(B), op = transpose when ia0 / ia1. With dC:
 *   ta tb | dA                    | dB
 *   0  0  | dC @ B^T              | A^T @ dC
 *   0  1  | dC @ B                | dC^T @ A
 *   1  0  | B @ dC^T              | A @ dC
 *   1  1  | B^T @ dC^T            | dC^T @ A^T
 */
static void grad_matmul(GradCtx *c, Node *n, int dc)
{
	int a = n->in[0], b = n->in[1], ta = n->ia[0] != 0, tb = n->ia[1] != 0;
	Node *m;
	if (!ta)
		m = ad_emit_acc(c, DPK_MATMUL, a, 2, (int[]){dc, b});
	else
		m = ad_emit_acc(c, DPK_MATMUL, a, 2, (int[]){b, dc});
	if (m) {
		m->ia[0] = ta && tb;
		m->ia[1] = ta || !tb;
	}
	if (!tb)
		m = ad_emit_acc(c, DPK_MATMUL, b, 2, (int[]){a, dc});
	else
		m = ad_emit_acc(c, DPK_MATMUL, b, 2, (int[]){dc, a});
	if (m) {
		m->ia[0] = !ta || tb;
		m->ia[1] = ta && tb;
	}
}

/* y = a + b: both get dy. */
static void grad_add(GradCtx *c, Node *n, int dy)
{
	ad_pass_grad(c, n->in[0], dy);
	ad_pass_grad(c, n->in[1], dy);
}

/* y = a * b: d.a = dy * b, d.b = dy * a. */
static void grad_mul(GradCtx *c, Node *n, int dy)
{
	ad_emit_grad(c, DPK_MUL, n->in[0], 2, (int[]){dy, n->in[1]});
	ad_emit_grad(c, DPK_MUL, n->in[1], 2, (int[]){dy, n->in[0]});
}

/* y = x (copy): dy passes. */
static void grad_copy(GradCtx *c, Node *n, int dy)
{
	ad_pass_grad(c, n->in[0], dy);
}

/* y = s * x: d.x = s * dy. */
static void grad_scale(GradCtx *c, Node *n, int dy)
{
	Node *m = ad_emit_grad(c, DPK_SCALE, n->in[0], 1, (int[]){dy});
	if (m)
		m->fa[0] = n->fa[0];
}

/* y = x + b (broadcast over rows): d.x = dy; d.b = sum_rows dy. */
static void grad_bias_add(GradCtx *c, Node *n, int dy)
{
	ad_pass_grad(c, n->in[0], dy);
	ad_emit_acc(c, DPK_BIAS_GRAD, n->in[1], 1, (int[]){dy});
}

static void grad_relu(GradCtx *c, Node *n, int dy)
{
	ad_emit_grad(c, DPK_RELU_GRAD, n->in[0], 2, (int[]){dy, n->in[0]});
}

static void grad_gelu(GradCtx *c, Node *n, int dy)
{
	ad_emit_grad(c, DPK_GELU_GRAD, n->in[0], 2, (int[]){dy, n->in[0]});
}

/* TANH_GRAD uses the output y: dx = dy * (1 - y^2). */
static void grad_tanh(GradCtx *c, Node *n, int dy)
{
	ad_emit_grad(c, DPK_TANH_GRAD, n->in[0], 2, (int[]){dy, n->out});
}

/* The loss is the seed (dy = -1, an implicit 1): d.logits = fa0 * (softmax -
 * onehot). No gradient into the labels. The kernel cannot scale by a tensor,
 * so a cross_entropy that feeds further computation is not differentiable. */
static void grad_xent(GradCtx *c, Node *n, int dy)
{
	if (dy >= 0) {
		ad_error(c, "cross_entropy: only a cross_entropy that is the loss itself can be "
			    "differentiated");
		return;
	}
	Node *m = ad_emit_grad(c, DPK_XENT_GRAD, n->in[0], 2, (int[]){n->in[0], n->in[1]});
	if (m)
		m->fa[0] = n->fa[0];
}

/* ---- gradient rules of the transformer ops ---- */

/* out = table[ids]: the table's gradient is a scatter-add; ids get none. */
static void grad_embedding(GradCtx *c, Node *n, int dy)
{
	ad_emit_acc(c, DPK_EMBEDDING_GRAD, n->in[1], 3, (int[]){dy, n->in[0], n->in[1]});
}

static void grad_layernorm(GradCtx *c, Node *n, int dy)
{
	Node *m;
	if ((m = ad_emit_grad(c, DPK_LAYERNORM_GRAD, n->in[0], 3, (int[]){dy, n->in[0], n->in[1]})))
		m->fa[0] = n->fa[0];
	if ((m = ad_emit_acc(c, DPK_LAYERNORM_GRAD_G, n->in[1], 2, (int[]){dy, n->in[0]})))
		m->fa[0] = n->fa[0];
	ad_emit_acc(c, DPK_BIAS_GRAD, n->in[2], 1, (int[]){dy});
}

static void grad_rmsnorm(GradCtx *c, Node *n, int dy)
{
	Node *m;
	if ((m = ad_emit_grad(c, DPK_RMSNORM_GRAD, n->in[0], 3, (int[]){dy, n->in[0], n->in[1]})))
		m->fa[0] = n->fa[0];
	if ((m = ad_emit_acc(c, DPK_RMSNORM_GRAD_G, n->in[1], 2, (int[]){dy, n->in[0]})))
		m->fa[0] = n->fa[0];
}

static void grad_silu(GradCtx *c, Node *n, int dy)
{
	ad_emit_grad(c, DPK_SILU_GRAD, n->in[0], 2, (int[]){dy, n->in[0]});
}

/* SOFTMAX_GRAD uses the output y. */
static void grad_softmax(GradCtx *c, Node *n, int dy)
{
	ad_emit_grad(c, DPK_SOFTMAX_GRAD, n->in[0], 2, (int[]){dy, n->out});
}

/* The backward recomputes the probabilities from qkv (nothing saved). */
static void grad_attention(GradCtx *c, Node *n, int dy)
{
	Node *m = ad_emit_grad(c, DPK_ATTENTION_GRAD, n->in[0], 2, (int[]){dy, n->in[0]});
	if (m)
		m->ia[0] = n->ia[0];
}

/* A rotation's gradient is the opposite rotation; cos/sin (buffers) get none. */
static void grad_rope(GradCtx *c, Node *n, int dy)
{
	Node *m = ad_emit_grad(c, DPK_ROPE, n->in[0], 3, (int[]){dy, n->in[1], n->in[2]});
	if (m)
		m->ia[0] = !n->ia[0];
}

static void grad_transpose(GradCtx *c, Node *n, int dy)
{
	ad_emit_grad(c, DPK_TRANSPOSE, n->in[0], 1, (int[]){dy});
}

/* dy reshaped back to x's shape: the attributes name x's dims after the first. */
static void grad_reshape(GradCtx *c, Node *n, int dy)
{
	const Value *x = ad_value(c, n->in[0]);
	Node *m = ad_emit_grad(c, DPK_RESHAPE, n->in[0], 1, (int[]){dy});
	if (!m)
		return;
	for (int i = 1; i < x->ndim; i++)
		m->ia[i - 1] = x->dims[i];
	m->ia[4] = x->ndim - 1;
}

static void grad_split(GradCtx *c, Node *n, int dy)
{
	Node *m = ad_emit_grad(c, DPK_SPLIT_GRAD, n->in[0], 1, (int[]){dy});
	if (m) {
		m->ia[0] = n->ia[0];
		m->ia[1] = n->ia[1];
	}
}

/* Megatron's f: identity forward, all-reduce (tp_reduce) of the gradient. */
static void grad_tp_copy(GradCtx *c, Node *n, int dy)
{
	Node *m = ad_emit_grad(c, DPK_TP_REDUCE, n->in[0], 1, (int[]){dy});
	if (m) {
		m->ia[0] = n->ia[0];
		m->stream = DP_STREAM_COMM; /* a collective */
	}
}

/* Megatron's g: all-reduce forward, the gradient passes through. */
static void grad_tp_reduce(GradCtx *c, Node *n, int dy)
{
	ad_pass_grad(c, n->in[0], dy);
}

/* ---- cost rules ---- */

static double vbytes(const Graph *g, int id)
{
	if (id < 0)
		return 0;
	const Value *v = g->values[id];
	return (double)ir_numel(v) * (double)ir_dtype_size(v->dtype);
}

static double vnumel(const Graph *g, int id)
{
	return id < 0 ? 0 : (double)ir_numel(g->values[id]);
}

/* Bytes of every input, the output, and the output again when it is read. */
static double io_bytes(const Graph *g, const Node *n)
{
	double b = 0;
	for (int i = 0; i < n->nin; i++)
		b += vbytes(g, n->in[i]);
	int ro = ir_ops[n->op].reads_out;
	b += vbytes(g, n->out) * (1 + (ro == 1 || (ro == 2 && n->ia[2])));
	return b;
}

static void cost_none(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = 0;
	*bytes = 0;
}

/* Memory-only ops (fill, copy, load, collectives: their wire bytes are for stats). */
static void cost_move(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = 0;
	*bytes = io_bytes(g, n);
}

/* Per output element: k flops. */
#define COST_PER_OUT(fn, k)                                                           \
	static void fn(const Graph *g, const Node *n, double *flops, double *bytes)   \
	{                                                                             \
		*flops = (k) * vnumel(g, n->out);                                     \
		*bytes = io_bytes(g, n);                                              \
	}
/* Per element of in0: k flops. */
#define COST_PER_IN(fn, k)                                                            \
	static void fn(const Graph *g, const Node *n, double *flops, double *bytes)   \
	{                                                                             \
		*flops = (k) * vnumel(g, n->in[0]);                                   \
		*bytes = io_bytes(g, n);                                              \
	}
COST_PER_OUT(cost_elem1, 1)  /* add, mul, scale, accum, bias_add, relu */
COST_PER_OUT(cost_elem2, 2)  /* relu_grad */
COST_PER_OUT(cost_tanh, 4)   /* tanh, tanh_grad */
COST_PER_OUT(cost_gelu, 10)  /* gelu (tanh form) */
COST_PER_OUT(cost_gelu_grad, 16)
COST_PER_IN(cost_reduce1, 1) /* bias_grad, all_reduce-free reductions */
COST_PER_IN(cost_sqnorm, 2)
COST_PER_IN(cost_xent, 5)    /* exp, sum, log, max per logit */
COST_PER_IN(cost_correct, 1)
COST_PER_OUT(cost_sgd, 4)    /* weight decay, momentum, update */
COST_PER_OUT(cost_adamw, 12) /* moments, bias correction, sqrt, divide, update */
COST_PER_OUT(cost_clip, 1)

COST_PER_OUT(cost_norm, 8)        /* layernorm: mean, var, normalise, scale, shift */
COST_PER_OUT(cost_norm_grad, 12)
COST_PER_IN(cost_norm_grad_g, 4)  /* recomputes xhat, multiplies, sums */
COST_PER_OUT(cost_rms, 5)
COST_PER_OUT(cost_rms_grad, 9)
COST_PER_IN(cost_rms_grad_g, 3)
COST_PER_OUT(cost_silu, 5)        /* exp, add, divide, multiply */
COST_PER_OUT(cost_silu_grad, 8)
COST_PER_OUT(cost_softmax, 5)     /* max, exp, sum, divide */
COST_PER_OUT(cost_softmax_grad, 4)
COST_PER_OUT(cost_rope, 3)        /* two multiplies and an add per rotated element */
COST_PER_IN(cost_embedding_grad, 1)

/*
 * ATTENTION on qkv [B, T, 3C] with H heads of hd = C/H: per (batch, head) the
 * products Q K^T and P V are 2*T*T*hd flops each, 4*B*H*T*T*hd in all without
 * a mask; causal attention needs only the lower triangle, so count half of that
 * (2*B*H*T*T*hd) plus the softmax (~5 flops per kept score). The CPU kernel
 * computes row blocks against the keys up to the block's end, close to half.
 */
static void attn_dims(const Graph *g, const Node *n, double *bh, double *t, double *hd)
{
	const Value *qkv = g->values[n->in[n->op == DPK_ATTENTION ? 0 : 1]];
	double heads = n->ia[0] > 0 ? (double)n->ia[0] : 1;
	*bh = (double)qkv->dims[0] * heads;
	*t = (double)qkv->dims[1];
	*hd = (double)qkv->dims[2] / 3 / heads;
}

static void cost_attention(const Graph *g, const Node *n, double *flops, double *bytes)
{
	double bh, t, hd;
	attn_dims(g, n, &bh, &t, &hd);
	*flops = 2 * bh * t * t * hd + 5 * bh * t * t / 2;
	*bytes = io_bytes(g, n);
}

/* The backward: recompute S = Q K^T, then dV = P^T dO, dP = dO V^T, dQ = dS K,
 * dK = dS^T Q: five causal products (2.5 x the forward's two) plus the softmax
 * backward. */
static void cost_attention_grad(const Graph *g, const Node *n, double *flops, double *bytes)
{
	double bh, t, hd;
	attn_dims(g, n, &bh, &t, &hd);
	*flops = 5 * bh * t * t * hd + 10 * bh * t * t / 2;
	*bytes = io_bytes(g, n);
}

/* MATMUL: 2*m*n*k from the folded operands. */
static void cost_matmul(const Graph *g, const Node *n, double *flops, double *bytes)
{
	const Value *a = g->values[n->in[0]];
	double k = (double)(n->ia[0] ? lead(a) : last(a));
	*flops = 2.0 * vnumel(g, n->out) * k + (n->ia[2] ? vnumel(g, n->out) : 0);
	*bytes = io_bytes(g, n);
}

/* LINEAR: 2*rows*k*n, plus the bias add. */
static void cost_linear(const Graph *g, const Node *n, double *flops, double *bytes)
{
	const Value *x = g->values[n->in[0]];
	double out = vnumel(g, n->out);
	*flops = 2.0 * out * (double)last(x) + (n->nin > 2 && n->in[2] >= 0 ? out : 0);
	*bytes = io_bytes(g, n);
}

/* XENT_GRAD: softmax again, then subtract and scale. */
static void cost_xent_grad(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = 7 * vnumel(g, n->in[0]);
	*bytes = io_bytes(g, n);
}

/* SQRT of a scalar. */
static void cost_one(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = 1;
	*bytes = io_bytes(g, n);
}

/* All-reduce: one add per element received (flops), bytes of the buffer. */
static void cost_reduce(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = vnumel(g, n->out);
	*bytes = io_bytes(g, n);
}

/* ---- the table ---- */

/* Columns: name, arity, reads_out, shape, grad, cost. ORDER KERNEL */
const OpInfo ir_ops[DPK_COUNT] = {
	/* nothing */
	[DPK_NOP] = {"nop", 0, 0, NULL, NULL, cost_none},
	/* out[:] = fa0; writes existing state (zeroing grads) */
	[DPK_FILL] = {"fill", 0, 0, NULL, NULL, cost_move},
	/* out = in0 */
	[DPK_COPY] = {"copy", 1, 0, shape_like0, grad_copy, cost_move},
	/* out += in0: sums of gradients, metric sums */
	[DPK_ACCUM] = {"accum", 1, 1, shape_like0, NULL, cost_elem1},
	/* out = fa0 * in0 */
	[DPK_SCALE] = {"scale", 1, 0, shape_unary_float, grad_scale, cost_elem1},
	/* out = op(in0) @ op(in1) (+ out if ia2): flags ia0/ia1 transpose */
	[DPK_MATMUL] = {"matmul", 2, 2, shape_matmul, grad_matmul, cost_matmul},
	/* out = x @ w (+ b): in {x, w[, b]} */
	[DPK_LINEAR] = {"linear", -1, 0, shape_linear, grad_linear, cost_linear},
	/* out = x + b broadcast over rows */
	[DPK_BIAS_ADD] = {"bias_add", 2, 0, shape_bias_add, grad_bias_add, cost_elem1},
	/* out = column sums of in0 (+ out if ia2); the bias gradient */
	[DPK_BIAS_GRAD] = {"bias_grad", 1, 2, shape_bias_grad, NULL, cost_reduce1},
	/* out = a + b, same shape */
	[DPK_ADD] = {"add", 2, 0, shape_binary, grad_add, cost_elem1},
	/* out = a * b, same shape */
	[DPK_MUL] = {"mul", 2, 0, shape_binary, grad_mul, cost_elem1},
	/* out = max(x, 0) */
	[DPK_RELU] = {"relu", 1, 0, shape_unary_float, grad_relu, cost_elem1},
	/* out = dy * (x > 0): in {dy, x} */
	[DPK_RELU_GRAD] = {"relu_grad", 2, 0, shape_act_grad, NULL, cost_elem2},
	/* out = gelu(x), tanh form */
	[DPK_GELU] = {"gelu", 1, 0, shape_unary_float, grad_gelu, cost_gelu},
	/* out = dy * gelu'(x): in {dy, x} */
	[DPK_GELU_GRAD] = {"gelu_grad", 2, 0, shape_act_grad, NULL, cost_gelu_grad},
	/* out = tanh(x) */
	[DPK_TANH] = {"tanh", 1, 0, shape_unary_float, grad_tanh, cost_tanh},
	/* out = dy * (1 - y^2): in {dy, y} */
	[DPK_TANH_GRAD] = {"tanh_grad", 2, 0, shape_act_grad, NULL, cost_tanh},
	/* out[0] = fa0 * sum of row losses: in {logits f32[rows,classes], labels i32[rows]} */
	[DPK_XENT] = {"cross_entropy", 2, 0, shape_xent, grad_xent, cost_xent},
	/* out = fa0 * (softmax(logits) - onehot(labels)) */
	[DPK_XENT_GRAD] = {"cross_entropy_grad", 2, 0, shape_xent_grad, NULL, cost_xent_grad},
	/* out = [#correct, #counted] f32[2]; evaluation metric */
	[DPK_CORRECT] = {"correct", 2, 0, shape_correct, NULL, cost_correct},
	/* fills a declared data tensor from source ia0 */
	[DPK_LOAD] = {"load", 0, 0, NULL, NULL, cost_move},
	/* out[0] = sum in0^2 (+ out[0] if ia2) */
	[DPK_SQNORM] = {"sqnorm", 1, 2, shape_scalar, NULL, cost_sqnorm},
	/* out[0] = sqrt(in0[0]) */
	[DPK_SQRT] = {"sqrt", 1, 0, shape_scalar, NULL, cost_one},
	/* out *= min(1, fa0 / norm), in place: in {norm} */
	[DPK_CLIP] = {"clip", 1, 1, NULL, NULL, cost_clip},
	/* params (out) updated in place from {grads, momentum or -1} */
	[DPK_SGD] = {"sgd", 2, 1, NULL, NULL, cost_sgd},
	/* params (out) updated in place from {grads, m, v} */
	[DPK_ADAMW] = {"adamw", 3, 1, NULL, NULL, cost_adamw},
	/* sum out in place over the ia0 axes */
	[DPK_ALL_REDUCE] = {"all_reduce", 0, 1, NULL, NULL, cost_reduce},
	/* in0 whole -> out shard, summed; shapes set by the placement pass */
	[DPK_REDUCE_SCATTER] = {"reduce_scatter", 1, 0, NULL, NULL, cost_reduce},
	/* in0 shard -> out whole; shapes set by the placement pass */
	[DPK_ALL_GATHER] = {"all_gather", 1, 0, NULL, NULL, cost_move},
	/* marks event ia0 on this stream */
	[DPK_EVENT_RECORD] = {"event_record", 0, 0, NULL, NULL, cost_none},
	/* this stream waits for event ia0 */
	[DPK_EVENT_WAIT] = {"event_wait", 0, 0, NULL, NULL, cost_none},
	/* out = initial value of a parameter or buffer (init spec or checkpoint);
	 * in0, when given, is the tp-split param out is the whole of */
	[DPK_INIT] = {"init", -1, 0, NULL, NULL, cost_move},
	/* in0 (a whole parameter) goes to the checkpoint writer; saved under in1's
	 * name when given (a tp-split param gathered whole) */
	[DPK_SAVE] = {"save", -1, 0, NULL, NULL, cost_move},
	/* out = this rank's block of in0 over the ia0 axes (a local copy); ia1 = dim */
	[DPK_SHARD] = {"shard", 1, 0, NULL, NULL, cost_move},
	/* out = table[ids]: in {ids i32, table [V, d]} */
	[DPK_EMBEDDING] = {"embedding", 2, 0, shape_embedding, grad_embedding, cost_move},
	/* out[ids[r]] += dy[r] (zeroed first unless ia2): in {dy, ids, table (shape)} */
	[DPK_EMBEDDING_GRAD] = {"embedding_grad", 3, 2, shape_embedding_grad, NULL,
				cost_embedding_grad},
	/* layer norm over the last dim: in {x, gamma, beta}; fa0 = eps */
	[DPK_LAYERNORM] = {"layernorm", 3, 0, shape_norm, grad_layernorm, cost_norm},
	/* dx: in {dy, x, gamma}; fa0 = eps */
	[DPK_LAYERNORM_GRAD] = {"layernorm_grad", 3, 0, shape_norm_grad, NULL, cost_norm_grad},
	/* d gamma = column sums of dy * xhat (+ out if ia2): in {dy, x}; fa0 = eps */
	[DPK_LAYERNORM_GRAD_G] = {"layernorm_grad_g", 2, 2, shape_norm_grad_g, NULL,
				  cost_norm_grad_g},
	/* RMS norm over the last dim: in {x, g}; fa0 = eps */
	[DPK_RMSNORM] = {"rmsnorm", 2, 0, shape_norm, grad_rmsnorm, cost_rms},
	/* dx: in {dy, x, g}; fa0 = eps */
	[DPK_RMSNORM_GRAD] = {"rmsnorm_grad", 3, 0, shape_norm_grad, NULL, cost_rms_grad},
	/* d g = column sums of dy * x / rms (+ out if ia2): in {dy, x}; fa0 = eps */
	[DPK_RMSNORM_GRAD_G] = {"rmsnorm_grad_g", 2, 2, shape_norm_grad_g, NULL, cost_rms_grad_g},
	/* out = x * sigmoid(x) */
	[DPK_SILU] = {"silu", 1, 0, shape_unary_float, grad_silu, cost_silu},
	/* out = dy * silu'(x): in {dy, x} */
	[DPK_SILU_GRAD] = {"silu_grad", 2, 0, shape_act_grad, NULL, cost_silu_grad},
	/* softmax over the last dim */
	[DPK_SOFTMAX] = {"softmax", 1, 0, shape_unary_float, grad_softmax, cost_softmax},
	/* out = y * (dy - sum(dy * y)): in {dy, y} */
	[DPK_SOFTMAX_GRAD] = {"softmax_grad", 2, 0, shape_act_grad, NULL, cost_softmax_grad},
	/* causal multi-head self-attention of a packed qkv [B, T, 3C]; ia0 = heads */
	[DPK_ATTENTION] = {"attention", 1, 0, shape_attention, grad_attention, cost_attention},
	/* d qkv: in {dy, qkv}; ia0 = heads; recomputes the probabilities */
	[DPK_ATTENTION_GRAD] = {"attention_grad", 2, 0, shape_attention_grad, NULL,
				cost_attention_grad},
	/* rotary embedding of q and k: in {qkv, cos, sin}; ia0 = 1 rotates backwards */
	[DPK_ROPE] = {"rope", 3, 0, shape_rope, grad_rope, cost_rope},
	/* the last two dims swapped (a copy) */
	[DPK_TRANSPOSE] = {"transpose", 1, 0, shape_transpose, grad_transpose, cost_move},
	/* the same elements in [x.dims[0], ia0, ..] (ia4 dims given) */
	[DPK_RESHAPE] = {"reshape", 1, 0, shape_reshape, grad_reshape, cost_move},
	/* chunk ia1 of ia0 equal chunks of the last dim */
	[DPK_SPLIT] = {"split", 1, 0, shape_split, grad_split, cost_move},
	/* zeros with chunk ia1 of ia0 = dy */
	[DPK_SPLIT_GRAD] = {"split_grad", 1, 0, shape_split_grad, NULL, cost_move},
	/* identity forward; its gradient is a tp_reduce over the ia0 axes */
	[DPK_TP_COPY] = {"tp_copy", 1, 0, shape_like0, grad_tp_copy, cost_move},
	/* sum over the ia0 axes (an executor collective); the gradient passes through */
	[DPK_TP_REDUCE] = {"tp_reduce", 1, 0, shape_like0, grad_tp_reduce, cost_reduce},
	/* undo a dim-ia1 shard after an all_gather (EXPORT); shapes set by the tp pass */
	[DPK_INTERLEAVE] = {"interleave", 1, 0, NULL, NULL, cost_move},
};
