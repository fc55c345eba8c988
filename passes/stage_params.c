/*
 * stage_params.c - each pipeline stage keeps only its own parameters,
 * gradients and optimizer state (pass "stage_params", pp > 1).
 *
 * Before (after unroll), when stages_split_params holds (pp > 1, every
 * trained parameter in an uncut unit, no offload, no compression):
 * flat.params, flat.grads, the 16-bit compute copy and the optimizer state
 * hold every trained parameter on every rank; the layout pass ordered the
 * units by the stage that keeps them (stages_param_stage), the tied ones
 * (kept by several stages: GPT-2's wte, the embedding on the first stage
 * and the LM head on the last) first, so each stage's part of every flat
 * buffer is one range; the buckets' all_reduces span pp, where the stages
 * that do not use a parameter add zeros; one norm over the whole gradient.
 *
 * After: for every stage k that keeps parameters of its own, each flat
 * buffer NAME has a part NAME.ppK (flat.params.pp1, opt.m.pp1, ...) holding
 * its range, and NAME keeps only the tied range (NAME is dropped when there
 * is none). Every view into stage k's range is a view of NAME.ppK at the
 * same place in it. A node that touches a view of stage k's range runs on
 * stage k (`stage=k`: INIT, SAVE, tp's SHARD and all_gather, a bucket's
 * all_reduce, which no longer spans pp: the stage's gradients are its own
 * whole); a node over a whole flat buffer (CLIP, the update, FILL, bf16's
 * CAST) is copied per stage over NAME.ppK on that stage, the original left
 * over the tied range on every rank. The gradient norm: grad_norm.sq is
 * zeroed, then each range's SQNORM adds to it on the stage that keeps it (a
 * tied range, summed over pp and so whole on every stage, weighted 1/pp),
 * and it is all_reduced over pp (with tp when tp > 1, as before): the
 * global norm, so clipping and the logged norm are the 1-stage ones (up to
 * the order of the sum). memplan gives the stages' parts the same bytes
 * (never on one rank); dpexec runs only its stage's INIT, SAVE and update,
 * and its checkpoints find each stage's parameters where that stage's
 * ranks hold them (runtime/ckpt_layout.c).
 * When stages_split_params does not hold, nothing changes: every stage
 * keeps every parameter (passes/p2p.c).
 */
#include <stdlib.h>
#include <string.h>

#include "shard.h"

#define PPBIT DP_AXIS_BIT(DP_AXIS_PP)

typedef struct {
	Graph *g;
	int p;
	int64_t total;   /* elements of every flat buffer */
	int64_t *lo, *n; /* per class c (0: tied, 1 + k: stage k): its range */
	int *roots;      /* the flat buffers cut, value ids */
	int nroots;
	int *part;       /* [root index * p + k]: NAME.ppK, or -1 */
} Cut;

/* Element offset of v in its root (a chain of views). */
static int64_t root_offset(const Graph *g, const Value *v)
{
	int64_t off = 0;
	for (; v->view_of >= 0; v = g->values[v->view_of])
		off += v->view_offset;
	return off;
}

static int root_index(const Cut *c, int v)
{
	for (int r = 0; r < c->nroots; r++)
		if (c->roots[r] == v)
			return r;
	return -1;
}

/* The class (0: tied, 1 + k: stage k) of a range [off, off + len) of a
 * flat buffer, or -1 when it crosses classes. */
static int class_of(const Cut *c, int64_t off, int64_t len)
{
	for (int k = 0; k <= c->p; k++)
		if (c->n[k] && off >= c->lo[k] && off + len <= c->lo[k] + c->n[k])
			return k;
	return -1;
}

/* The ranges of the classes, from the trained parameters' places; every
 * class one range, the tied one at 0. */
static void find_ranges(Cut *c, const Value *flat)
{
	Graph *g = c->g;
	int64_t *hi = calloc((size_t)c->p + 1, sizeof *hi);
	if (!hi)
		die("out of memory");
	for (int k = 0; k <= c->p; k++)
		c->lo[k] = c->total;
	for (int v = 0; v < g->nvalues; v++) {
		const Value *pv = g->values[v];
		if (pv->kind != DP_T_PARAM || pv->grad < 0)
			continue;
		if (pv->view_of < 0)
			die("stage_params: param %s is in no flat buffer", pv->name);
		int k = 1 + stages_param_stage(g, v);
		int64_t off = root_offset(g, pv), len = ir_numel(pv);
		if (off < c->lo[k])
			c->lo[k] = off;
		if (off + len > hi[k])
			hi[k] = off + len;
		c->n[k] += len;
	}
	int64_t sum = 0;
	for (int k = 0; k <= c->p; k++) {
		if (c->n[k] && hi[k] - c->lo[k] != c->n[k])
			die("stage_params: %s's part of stage %d is not one range", flat->name, k - 1);
		sum += c->n[k];
	}
	if (sum != c->total || (c->n[0] && c->lo[0] != 0))
		die("stage_params: the stages' parts cover %lld of %lld elements of %s", (long long)sum,
		    (long long)c->total, flat->name);
	free(hi);
}

/* The flat buffers (every one as long as flat.params: the params, grads,
 * the 16-bit copy, the optimizer state) and their parts per stage. */
static void make_parts(Cut *c)
{
	Graph *g = c->g;
	int nv = g->nvalues;
	c->roots = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
	for (int v = 0; v < nv; v++) {
		const Value *x = g->values[v];
		if (x->view_of < 0 && (x->kind == DP_T_FLAT || x->kind == DP_T_OPTSTATE) &&
		    x->ndim == 1 && x->dims[0] == c->total)
			c->roots[c->nroots++] = v;
	}
	c->part = ir_alloc(g, (size_t)(c->nroots * c->p + 1) * sizeof(int));
	for (int r = 0; r < c->nroots; r++)
		for (int k = 0; k < c->p; k++) {
			int *slot = &c->part[r * c->p + k];
			*slot = -1;
			if (!c->n[1 + k])
				continue;
			const Value *o = g->values[c->roots[r]];
			Value *x = ir_value(g, ir_fmt(g, "%s.pp%d", o->name, k), o->dtype, 1,
					    (int64_t[]){c->n[1 + k]}, o->kind, o->loc);
			memcpy(x->place, o->place, sizeof x->place);
			x->space = o->space;
			*slot = x->id;
		}
}

/* Every direct view of a flat buffer inside a stage's range becomes a view
 * of that stage's part. */
static void move_views(Cut *c)
{
	Graph *g = c->g;
	for (int v = 0; v < g->nvalues; v++) {
		Value *x = g->values[v];
		int r = x->view_of >= 0 ? root_index(c, x->view_of) : -1;
		if (r < 0)
			continue;
		int k = class_of(c, x->view_offset, ir_numel(x));
		if (k < 0)
			die("stage_params: %%%s crosses the stages' parts of %%%s", x->name,
			    g->values[x->view_of]->name);
		if (k == 0)
			continue;
		x->view_of = c->part[r * c->p + k - 1];
		x->view_offset -= c->lo[k];
	}
}

/* The stage whose part node n touches through views (-1: none, only tied
 * ranges); whether it names a flat buffer itself (*whole). */
static int node_part(const Cut *c, const Node *n, int *whole)
{
	const Graph *g = c->g;
	int stage = -1;
	*whole = 0;
	for (int k = -1; k < n->nin; k++) {
		int v = k < 0 ? n->out : n->in[k];
		if (v < 0)
			continue;
		if (root_index(c, v) >= 0) {
			*whole = 1;
			continue;
		}
		const Value *root = ir_root(g, g->values[v]);
		for (int r = 0; r < c->nroots * c->p; r++)
			if (c->part[r] == root->id) {
				int s = r % c->p;
				if (stage >= 0 && stage != s)
					die("stage_params: node %d (%s) touches stages %d and %d's parameters",
					    n->id, dp_op_names[n->op], stage, s);
				stage = s;
			}
	}
	return stage;
}

/* A copy of node n over stage k's parts, on stage k. */
static Node *copy_for_stage(Cut *c, const Node *n, int k)
{
	int in[DP_MAX_IN];
	for (int j = 0; j < n->nin; j++) {
		int r = n->in[j] >= 0 ? root_index(c, n->in[j]) : -1;
		in[j] = r >= 0 ? c->part[r * c->p + k] : n->in[j];
	}
	int r = n->out >= 0 ? root_index(c, n->out) : -1;
	Node *x = ir_node(c->g, n->op, r >= 0 ? c->part[r * c->p + k] : n->out, n->nin, in, n->phase,
			  n->loc);
	memcpy(x->ia, n->ia, sizeof x->ia);
	memcpy(x->fa, n->fa, sizeof x->fa);
	x->progs = n->progs;
	x->flags = n->flags;
	x->stream = n->stream;
	x->block = n->block;
	x->bucket = n->bucket;
	x->stage = k;
	return x;
}

int stage_params_run(Graph *g, Diag *d)
{
	(void)d;
	if (!stages_split_params(g))
		return 0;
	Value *flat = ir_find_value(g, "flat.params");
	if (!flat)
		die("stage_params: flat.params missing (optimizer pass not run?)");
	Cut c = {.g = g, .p = (int)g->cfg.mesh[DP_AXIS_PP], .total = ir_numel(flat)};
	c.lo = ir_alloc(g, (size_t)(c.p + 1) * sizeof(int64_t));
	c.n = ir_alloc(g, (size_t)(c.p + 1) * sizeof(int64_t));
	memset(c.n, 0, (size_t)(c.p + 1) * sizeof(int64_t));
	find_ranges(&c, flat);
	make_parts(&c);
	move_views(&c);

	/* the nodes: staged, copied per stage, the norm gathered over pp */
	int n0 = g->nnodes, first_sq = -1, last_sq = -1, sq = -1;
	Node **old = malloc(((size_t)n0 + 1) * sizeof *old);
	char *drop = calloc((size_t)n0 + 1, 1);
	if (!old || !drop)
		die("out of memory");
	memcpy(old, g->nodes, (size_t)n0 * sizeof *old);
	Node ***after = calloc((size_t)n0 + 1, sizeof *after); /* per node: copies after it */
	int *nafter = calloc((size_t)n0 + 1, sizeof *nafter);
	if (!after || !nafter)
		die("out of memory");
	for (int i = 0; i < n0; i++) {
		Node *n = old[i];
		int whole, s = node_part(&c, n, &whole);
		float w = 0; /* a SQNORM's weight, 0 meaning 1 */
		if (n->op == DP_OP_SQNORM) {
			if (first_sq < 0)
				first_sq = i, sq = n->out;
			last_sq = i;
			DP_ATTR(n, SQNORM, acc) = 1;
			w = DP_FATTR(n, SQNORM, weight);
			/* a tied range is whole on every stage: each adds its share */
			if (s < 0)
				DP_FATTR(n, SQNORM, weight) = (w != 0 ? w : 1.0f) / (float)c.p;
		}
		if (whole) {
			if (s >= 0)
				die("stage_params: node %d (%s) touches a whole flat buffer and a stage's part",
				    n->id, dp_op_names[n->op]);
			after[i] = malloc((size_t)c.p * sizeof **after);
			if (!after[i])
				die("out of memory");
			for (int k = 0; k < c.p; k++)
				if (c.n[1 + k]) {
					Node *x = copy_for_stage(&c, n, k);
					if (x->op == DP_OP_SQNORM)
						DP_FATTR(x, SQNORM, weight) = w;
					after[i][nafter[i]++] = x;
				}
			drop[i] = !c.n[0];
		} else if (s >= 0) {
			if (n->stage >= 0 && n->stage != s)
				die("stage_params: node %d (%s) on stage %d touches stage %d's parameters",
				    n->id, dp_op_names[n->op], n->stage, s);
			n->stage = s;
			if (dp_is_collective(n->op)) {
				DP_AXES(n) &= ~(uint32_t)PPBIT;
				if (n->bucket >= 0 && n->bucket < g->nbuckets)
					g->buckets[n->bucket].axes &= ~PPBIT;
			}
		}
	}
	if (sq < 0)
		die("stage_params: the gradient norm is missing");
	/* grad_norm.sq zeroed before the first part adds to it, summed over pp
	 * after the last (the all_reduce over tp that follows, when there is
	 * one, spans pp too) */
	Node *zero = ir_node(g, DP_OP_FILL, sq, 0, NULL, PH_OPT, (Loc){0});
	DP_FATTR(zero, FILL, value) = 0;
	zero->progs = old[first_sq]->progs;
	zero->flags = old[first_sq]->flags;
	g->values[sq]->def = zero->id;
	Node *sum = NULL;
	for (int i = last_sq + 1; i < n0 && !sum; i++)
		if (old[i]->op == DP_OP_ALL_REDUCE && old[i]->out == sq)
			sum = old[i];
	if (sum) {
		DP_AXES(sum) |= PPBIT;
	} else {
		Node *ar = shard_comm_node(g, DP_OP_ALL_REDUCE, sq, 0, NULL, PPBIT,
					   old[last_sq]->flags, old[last_sq]->progs, -1);
		if (!after[last_sq]) {
			after[last_sq] = malloc(sizeof **after);
			if (!after[last_sq])
				die("out of memory");
		} else {
			Node **grown = realloc(after[last_sq], ((size_t)c.p + 1) * sizeof **after);
			if (!grown)
				die("out of memory");
			after[last_sq] = grown;
		}
		after[last_sq][nafter[last_sq]++] = ar;
	}
	int total = g->nnodes, k = 0;
	Node **order = malloc(((size_t)total + 1) * sizeof *order);
	if (!order)
		die("out of memory");
	for (int i = 0; i < n0; i++) {
		if (i == first_sq)
			order[k++] = zero;
		order[k++] = old[i];
		for (int j = 0; j < nafter[i]; j++)
			order[k++] = after[i][j];
		free(after[i]);
	}
	if (k != total)
		die("stage_params: placed %d of %d nodes", k, total);
	memcpy(g->nodes, order, (size_t)k * sizeof *order);
	for (int i = 0; i < n0; i++)
		if (drop[i])
			ir_remove_node(g, old[i]);

	/* the flat buffers keep the tied range, else go */
	for (int r = c.nroots - 1; r >= 0; r--) {
		Value *x = g->values[c.roots[r]];
		if (c.n[0])
			x->dims[0] = c.n[0];
		else
			ir_drop_value(g, c.roots[r]);
	}
	free(old), free(drop), free(after), free(nafter), free(order);
	return 0;
}
