/*
 * op_rules.h - declarations of the op registry's rules, internal to ir/: the
 * shape and batch rules (op_shape.c), gradient rules (op_grad.c) and cost
 * rules (ops.c) that the rows of ops.def name. The prototypes are generated
 * from ops.def itself, so a row naming a rule that does not exist fails to
 * link, and no list of rules is kept by hand.
 */
#ifndef DP_OP_RULES_H
#define DP_OP_RULES_H

#include "ir.h"

#define DECL_GRAD(rule, op) void ir_grad_##rule(GradCtx *c, Node *n, int dout);
#define DECL_NOGRAD
#define DECL_COST(rule, k) void ir_cost_##rule(const Graph *g, const Node *n, double *flops, double *bytes);
#define OP(id, name, cls, dsl, in, ro, shape, grad, cost, tp, batch, rule, attrs) \
	int ir_shape_##shape(Graph *g, Node *n, Value *out, Diag *d);                \
	DECL_##grad DECL_##cost
#include "ops.def"
#undef OP
#undef DECL_GRAD
#undef DECL_NOGRAD
#undef DECL_COST

/* Shared by the rule files. */

/* The [rows, cols] fold of a value: the product of all dims but the last,
 * and the last. */
static inline int64_t ir_fold_rows(const Value *v)
{
	int64_t r = 1;
	for (int i = 0; i + 1 < v->ndim; i++)
		r *= v->dims[i];
	return r;
}

static inline int64_t ir_fold_cols(const Value *v)
{
	return v->ndim ? v->dims[v->ndim - 1] : 1;
}

const char *ir_type_str(const Value *v, char *buf, size_t len); /* "f32[32,784]" */
#define IR_TYPE(v) ir_type_str((v), (char[64]){0}, 64)

#endif
