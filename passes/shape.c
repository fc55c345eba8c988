/*
 * shape.c - shapes and dtypes of every value, checked against each op's rule.
 *
 * Before (after the front end): declared values (data, params, metrics) have
 * dtype and dims; SSA temporaries (DP_T_ACT made by a node) have ndim 0,
 * shape unknown.
 *
 * After: every value has dtype and dims (XENT's output is f32[1]), and every
 * SSA temporary its batch_dim / seq_dim. For each node in program order, its
 * op's batch rule (ir_batch_rule) checks that the node does not mix samples
 * (a result that would depend on the world size is an error at every world
 * size), then its shape rule (ir/op_shape.c) computes the output
 * type from the inputs: an SSA temporary takes it; a declared output (a metric
 * written by ACCUM/XENT/CORRECT/SQRT, a gradient written by an accumulating
 * kernel) must already match it.
 *
 * Errors. A failing rule reports a user error at the node's location; the
 * pass goes on, marking that node's output unknown, and skips (silently)
 * every node that reads an unknown value, so one mistake is reported once.
 * The evaluation metrics repeat the loss's cross_entropy on the same operands
 * at the same place: a node with the location and inputs of a node that
 * already failed fails quietly. It returns -1 if anything failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* Declared (not SSA) outputs must agree with the rule: dtype and element
 * count (flat views are 1-D); metrics are sized by the front end, so only
 * their element count is checked. */
static int declared_ok(const Value *have, const Value *want)
{
	if (ir_numel(have) != ir_numel(want))
		return 0;
	return have->kind == DP_T_METRIC || have->dtype == want->dtype;
}

/* Did an earlier failed node have n's location and inputs? */
static int repeats(Node **failed, int nfailed, const Node *n)
{
	for (int i = 0; i < nfailed; i++) {
		const Node *f = failed[i];
		if (f->loc.line == n->loc.line && f->loc.col == n->loc.col && f->nin == n->nin &&
		    memcmp(f->in, n->in, sizeof f->in) == 0)
			return 1;
	}
	return 0;
}

/* The batch rule, then the shape rule (ir/op_shape.c); a repeat of an
 * earlier failure reports nothing. The batch rule goes first: an operand
 * whose batch would line up with another dim is the error to report, even
 * when the sizes happen not to match at this micro-batch. */
static int apply_rule(Graph *g, Node *n, Value *out, Diag *d, int quiet)
{
	Diag mute = *d;
	char *text = NULL;
	size_t len = 0;
	if (quiet) {
		mute.out = open_memstream(&text, &len);
		if (!mute.out)
			die("out of memory");
	}
	Diag *to = quiet ? &mute : d;
	int r = ir_batch_rule(g, n, to);
	if (r == 0)
		r = ir_ops[n->op].shape(g, n, out, to);
	if (quiet) {
		fclose(mute.out);
		free(text);
	}
	return r;
}

int shape_run(Graph *g, Diag *d)
{
	/* known[v]: 1 known, 0 not yet produced, 2 unknown after an error. */
	unsigned char *known = calloc((size_t)g->nvalues + 1, 1);
	if (!known)
		die("out of memory");
	for (int i = 0; i < g->nvalues; i++)
		known[i] = g->values[i]->kind != DP_T_ACT || g->values[i]->ndim > 0;
	/* SSA temporaries are recomputed even if a front end guessed a shape. */
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (n->out >= 0 && ir_ops[n->op].shape && g->values[n->out]->kind == DP_T_ACT)
			known[n->out] = 0;
	}

	int failed = 0, nfailed = 0;
	Node **failed_nodes = malloc(((size_t)g->nnodes + 1) * sizeof(Node *));
	if (!failed_nodes)
		die("out of memory");
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		const OpInfo *op = &ir_ops[n->op];
		if (!op->shape || n->out < 0)
			continue;
		int skip = 0;
		for (int k = 0; k < n->nin; k++) {
			int v = n->in[k];
			if (v < 0)
				continue;
			if (known[v] == 2)
				skip = 1;
			else if (!known[v])
				die("shape: %s reads %%%s before any node writes it", op->name,
				    g->values[v]->name);
		}
		Value *out = g->values[n->out];
		Value tmp = *out;
		tmp.ndim = 0;
		memset(tmp.dims, 0, sizeof tmp.dims);
		if (skip || apply_rule(g, n, &tmp, d, repeats(failed_nodes, nfailed, n)) < 0) {
			if (!skip) {
				failed = 1;
				failed_nodes[nfailed++] = n;
			}
			if (out->kind == DP_T_ACT)
				known[n->out] = 2;
			continue;
		}
		if (out->kind == DP_T_ACT) {
			out->dtype = tmp.dtype;
			out->ndim = tmp.ndim;
			memcpy(out->dims, tmp.dims, sizeof out->dims);
			known[n->out] = 1;
		} else if (!declared_ok(out, &tmp)) {
			error_at(d, n->loc, "%s: result would be %s[%lld elements] but %s is declared "
				 "%s[%lld elements]", op->name, ir_dtype_name(tmp.dtype),
				 (long long)ir_numel(&tmp), out->name, ir_dtype_name(out->dtype),
				 (long long)ir_numel(out));
			failed = 1;
		}
	}
	free(known);
	free(failed_nodes);
	return failed ? -1 : 0;
}
