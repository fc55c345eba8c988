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
static int shape_binary(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *a = V(g, n->in[0]), *b = V(g, n->in[1]);
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

/* BIAS_ADD: x [rows..., c] + b [c]. */
static int shape_bias_add(Graph *g, Node *n, Value *out, Diag *d)
{
	const Value *x = V(g, n->in[0]), *b = V(g, n->in[1]);
	if (b->ndim != 1 || b->dims[0] != last(x) || b->dtype != x->dtype) {
		error_at(d, n->loc, "%s: x is %s but b is %s: b must be %s[%lld]", op_name(n), TYPE(x),
			 TYPE(b), ir_dtype_name(x->dtype), (long long)last(x));
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
	/* out = initial value of a parameter or buffer (init spec or checkpoint) */
	[DPK_INIT] = {"init", 0, 0, NULL, NULL, cost_move},
	/* in0 (a whole parameter) goes to the checkpoint writer */
	[DPK_SAVE] = {"save", 1, 0, NULL, NULL, cost_move},
	/* out = this rank's block of in0 over the ia0 axes (a local copy) */
	[DPK_SHARD] = {"shard", 1, 0, NULL, NULL, cost_move},
};
