/*
 * ops.c - the op registry: ir_ops[], one OpInfo per row of format/ops.def, and
 * the cost rules those rows name.
 *
 * The facts of an op (name, executor class, DSL use, arity, the operand that
 * is i32, whether it reads its output, its rules, tp and batch behaviour, its
 * attributes with their IR names and DSL keywords) are stated once, in its
 * ops.def row; this file only expands the rows. The rules are code: shape and
 * batch rules in op_shape.c, gradient rules in op_grad.c, cost rules here.
 *
 * Cost rules count floating-point operations and bytes read + written, for
 * --stats and the accounting pass; rough but consistent (elementwise ops
 * cost_k flops per element: ~1 for arithmetic, a few for transcendentals).
 */
#include <stdio.h>
#include <string.h>

#include "op_rules.h"

/* ---- shared helpers ---- */

const char *ir_type_str(const Value *v, char *buf, size_t len)
{
	int k = snprintf(buf, len, "%s[", ir_dtype_name(v->dtype));
	for (int i = 0; i < v->ndim && k > 0 && (size_t)k < len; i++)
		k += snprintf(buf + k, len - (size_t)k, "%s%lld", i ? "," : "", (long long)v->dims[i]);
	if (k > 0 && (size_t)k < len)
		snprintf(buf + k, len - (size_t)k, "]");
	return buf;
}

int ir_reads_out(const Node *n)
{
	int ro = ir_ops[n->op].reads_out;
	return ro == OP_RO_YES || ro == OP_RO_UPD || (ro == OP_RO_ACC && DP_ACC(n) != 0);
}

int ir_writes_in(const Node *n, int k)
{
	int ro = ir_ops[n->op].reads_out;
	return ((ro == OP_RO_UPD && k >= 1) || (ro == OP_RO_IN0 && k == 0)) && k >= 0 &&
	       k < n->nin && n->in[k] >= 0;
}

const OpAttr *ir_op_attr(IrOp op, const char *name)
{
	for (const OpAttr *a = ir_ops[op].attrs; a->name; a++)
		if (strcmp(a->name, name) == 0)
			return a;
	return NULL;
}

int ir_dsl_op(const char *name)
{
	for (int op = 0; op < DP_NOPS; op++)
		if (ir_ops[op].dsl != OP_DSL_NO && strcmp(ir_ops[op].name, name) == 0)
			return op;
	return -1;
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
	b += vbytes(g, n->out) * (1 + ir_reads_out(n));
	return b;
}

void ir_cost_none(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = 0;
	*bytes = 0;
}

/* Memory-only ops (fill, copy, load, collectives: their wire bytes are for stats). */
void ir_cost_move(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = 0;
	*bytes = io_bytes(g, n);
}

/* cost_k flops per output element (elementwise ops, norms, optimizers). */
void ir_cost_per_out(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = ir_ops[n->op].cost_k * vnumel(g, n->out);
	*bytes = io_bytes(g, n);
}

/* cost_k flops per element of in0 (reductions: bias_grad, sqnorm, the loss). */
void ir_cost_per_in(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = ir_ops[n->op].cost_k * vnumel(g, n->in[0]);
	*bytes = io_bytes(g, n);
}

/* The fused classifier: cross_entropy's and its gradient's flops, the logits
 * read once and written once in place, the labels and the loss. */
void ir_cost_xent_fused(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = ir_ops[n->op].cost_k * vnumel(g, n->in[0]);
	*bytes = io_bytes(g, n) + vbytes(g, n->in[0]);
}

/* One flop (sqrt of a scalar). */
void ir_cost_one(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = 1;
	*bytes = io_bytes(g, n);
}

/* All-reduce: one add per element received (flops), bytes of the buffer. */
void ir_cost_reduce(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = vnumel(g, n->out);
	*bytes = io_bytes(g, n);
}

/* MATMUL: 2*m*n*k from the folded operands (+ the accumulation). */
void ir_cost_matmul(const Graph *g, const Node *n, double *flops, double *bytes)
{
	const Value *a = g->values[n->in[0]];
	double k = (double)(DP_ATTR(n, MATMUL, transA) ? ir_fold_rows(a) : ir_fold_cols(a));
	*flops = 2.0 * vnumel(g, n->out) * k + (DP_ATTR(n, MATMUL, acc) ? vnumel(g, n->out) : 0);
	*bytes = io_bytes(g, n);
}

/* LINEAR: 2*rows*k*n, plus the bias add. */
void ir_cost_linear(const Graph *g, const Node *n, double *flops, double *bytes)
{
	const Value *x = g->values[n->in[0]];
	double out = vnumel(g, n->out);
	*flops = 2.0 * out * (double)ir_fold_cols(x) + (n->nin > 2 && n->in[2] >= 0 ? out : 0);
	*bytes = io_bytes(g, n);
}

/* LINEAR_GELU: linear's flops and cost_k per element of gelu's half. */
void ir_cost_linear_gelu(const Graph *g, const Node *n, double *flops, double *bytes)
{
	const Value *x = g->values[n->in[0]];
	double half = vnumel(g, n->out) / 2;
	*flops = 2.0 * half * (double)ir_fold_cols(x) + (n->nin > 2 && n->in[2] >= 0 ? half : 0) +
		 ir_ops[n->op].cost_k * half;
	*bytes = io_bytes(g, n);
}

/* ADD_LAYERNORM, ADD_RMSNORM: cost_k flops per element of a half (the add's
 * one and layernorm's eight, rmsnorm's five); the two inputs read, the sum and the norm written (the sum's
 * re-reads for the statistics stay in cache: one pass over memory). */
void ir_cost_add_layernorm(const Graph *g, const Node *n, double *flops, double *bytes)
{
	*flops = ir_ops[n->op].cost_k * vnumel(g, n->out) / 2;
	*bytes = io_bytes(g, n);
}

/* MATMUL_GELU_GRAD: the product's flops and cost_k per output element. */
void ir_cost_matmul_gelu_grad(const Graph *g, const Node *n, double *flops, double *bytes)
{
	const Value *a = g->values[n->in[0]];
	double k = (double)(DP_ATTR(n, MATMUL, transA) ? ir_fold_rows(a) : ir_fold_cols(a));
	*flops = (2.0 * k + ir_ops[n->op].cost_k) * vnumel(g, n->out);
	*bytes = io_bytes(g, n);
}

/*
 * ATTENTION on qkv [B, T, 3C] with H heads of hd = C/H: per (batch, head) the
 * products Q K^T and P V are 2*T*T*hd flops each, 4*B*H*T*T*hd in all without
 * a mask; causal attention needs only the lower triangle, so count half of that
 * (2*B*H*T*T*hd) plus the softmax (~5 flops per kept score). The CPU kernel
 * computes row blocks against the keys up to the block's end, close to half.
 */
static void attn_dims(const Graph *g, const Node *n, int qkv_at, double *bh, double *t,
		      double *tk, double *hd)
{
	const Value *qkv = g->values[n->in[qkv_at]];
	int64_t h = DP_ATTR(n, ATTENTION, heads);
	double heads = h > 0 ? (double)h : 1;
	*bh = (double)qkv->dims[0] * heads;
	*t = (double)qkv->dims[1];
	/* context parallelism: the local queries see the keys of all cp ranks */
	int64_t cp = n->nin > 2 ? DP_ATTR(n, ATTENTION_CP, cp) : 1;
	*tk = *t * (cp > 1 ? (double)cp : 1);
	*hd = (double)qkv->dims[2] / 3 / heads;
}

/* The forward (attention, attention_cp: qkv is in0). */
void ir_cost_attention(const Graph *g, const Node *n, double *flops, double *bytes)
{
	double bh, t, tk, hd;
	attn_dims(g, n, 0, &bh, &t, &tk, &hd);
	*flops = 2 * bh * t * tk * hd + 5 * bh * t * tk / 2;
	*bytes = io_bytes(g, n);
}

/* The backward (in {dy, qkv, ...}): recompute S = Q K^T, then dV = P^T dO,
 * dP = dO V^T, dQ = dS K, dK = dS^T Q: five causal products (2.5 x the
 * forward's two) plus the softmax backward. */
void ir_cost_attention_grad(const Graph *g, const Node *n, double *flops, double *bytes)
{
	double bh, t, tk, hd;
	attn_dims(g, n, 1, &bh, &t, &tk, &hd);
	*flops = 5 * bh * t * tk * hd + 10 * bh * t * tk / 2;
	*bytes = io_bytes(g, n);
}

/* ORTHOGONALIZE of [rows, r]: per column a norm, a division and a
 * projection out of each later column (2 rows each for the dot and the update). */
void ir_cost_orthogonalize(const Graph *g, const Node *n, double *flops, double *bytes)
{
	const Value *o = g->values[n->out];
	double r = (double)ir_fold_cols(o), rows = (double)ir_fold_rows(o);
	*flops = rows * (3.0 * r + 2.0 * r * (r - 1.0));
	*bytes = io_bytes(g, n);
}

/* ---- the table: the rows of ops.def ---- */

#define ir_shape_none NULL
#define TAB_IN(min, max, ids) .min_in = (min), .max_in = (max), .ids_at = (ids)
#define TAB_GRAD(rule, op) .grad = ir_grad_##rule, .grad_op = DP_OP_##op
#define TAB_NOGRAD .grad = NULL, .grad_op = DP_OP_NOP
#define TAB_COST(rule, k) .cost = ir_cost_##rule, .cost_k = (k)
#define TAB_ATTRS(...) .attrs = (const OpAttr[]){__VA_ARGS__, {0}}
#define TAB_NOATTRS .attrs = (const OpAttr[]){{0}}
#define AFLAG(n, i, k) {.name = #n, .style = IR_ATTR_FLAG, .slot = (i), .key = (k), .below = -1}
#define AINT(n, i, k, req, lo)                                                              \
	{.name = #n, .style = IR_ATTR_INT, .slot = (i), .key = (k), .required = (req),     \
	 .min = (lo), .below = -1}
#define AKEEP(n, i, k, req, lo)                                                             \
	{.name = #n, .style = IR_ATTR_ALWAYS, .slot = (i), .key = (k), .required = (req),  \
	 .min = (lo), .below = -1}
#define AINDEX(n, i, k, req, lo, lim)                                                       \
	{.name = #n, .style = IR_ATTR_ALWAYS, .slot = (i), .key = (k), .required = (req),  \
	 .min = (lo), .below = (lim)}
#define AAXES(n, i) {.name = #n, .style = IR_ATTR_AXES, .slot = (i), .below = -1}
#define ASTAGES(n, i) {.name = #n, .style = IR_ATTR_STAGES, .slot = (i), .below = -1}
#define AFLOAT(n, i, k, dflt, above)                                                        \
	{.name = #n, .style = IR_ATTR_FLOAT, .slot = (i), .key = (k), .def = (dflt),       \
	 .min = (above), .below = -1}
#define ASCALAR(n, i, of)                                                                   \
	{.name = #n, .style = IR_ATTR_FLOAT, .slot = (i), .below = -1, .scalar_of = (of)}

const OpInfo ir_ops[DP_NOPS] = {
#define OP(id, nm, c, ds, in, ro, sh, gr, co, tpr, br, rule, attrs)                       \
	[DP_OP_##id] = {.name = (nm), .cls = DP_OPC_##c, .dsl = OP_DSL_##ds, TAB_##in,         \
		      .reads_out = OP_RO_##ro, .shape = ir_shape_##sh, TAB_##gr, TAB_##co,    \
		      .tp = OP_TP_##tpr, .batch = OP_BATCH_##br, TAB_##attrs},
#include "ops.def"
#undef OP
};
