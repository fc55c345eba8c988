/*
 * stage_params.c - each pipeline stage keeps only its own parameters,
 * gradients and optimizer state (pass "stage_params", pp > 1).
 *
 * Before (after unroll), when stages_split_params holds (pp > 1; any
 * strategy, offload and compression): the flat buffers (flat.params,
 * flat.grads, the 16-bit compute copy, the optimizer state, under a
 * sharded strategy their shards: flat.params.shard, flat.grads.shard,
 * flat.params.shard.bf16, and compression's powersgd.q, .p and .err, laid
 * out in the buckets' order) hold every trained parameter on every rank; the
 * layout pass ordered the units by the stage that keeps them
 * (stages_param_stages; a unit never mixes stages), the tied ones (kept by
 * several stages: GPT-2's wte, the embedding on the first stage and the LM
 * head on the last) first, so each stage's part of every flat buffer is one
 * range (a sharded unit's chunk of the shard buffers included); the
 * gradients' all_reduces (ddp buckets, zero2's and the gathered blocks'
 * slices) span pp, where the stages that do not use a parameter add zeros;
 * one norm over the whole gradient.
 *
 * Classes: every view of a flat buffer is the tied range's or one stage's.
 * A trained parameter, its gradient and its master (and what they are views
 * of) are its stage's; to a fixed point, a view nothing placed yet takes
 * the stage of a node that touches it (p2p's: a gathered block's
 * reduce_scatter and accumulation; a gathered block's shard that the nodes
 * of two stages touch is tied, tied_gathered), else the one class of the node's other
 * views (a sharded unit's slice beside its gathered params or its full
 * gradients), else the class of the range it lies in (an optimizer group's
 * run). A buffer that nothing views (the optimizer state under one group)
 * is cut as the buffer beside it in an element-wise node (the update).
 *
 * After: for every stage k that keeps parameters of its own, each flat
 * buffer NAME has a part NAME.ppK (flat.params.pp1, opt.m.pp1,
 * flat.grads.shard.pp1, ...) holding its range, and NAME keeps only the
 * tied range (NAME is dropped when there is none). Every view into stage
 * k's range is a view of NAME.ppK at the same place in it. A node that
 * touches a value of stage k runs on stage k (`stage=k`: INIT, SAVE, tp's
 * SHARD and all_gather, a sharded unit's all_gather after the update and
 * its EXPORT gather, a bucket's all_reduce and zero2's and the gathered
 * blocks' all_reduce of their slices, which no longer span pp: the stage's
 * gradients are its own whole); a node over a whole flat buffer (CLIP, the
 * update, FILL, bf16's CAST) is copied per stage over NAME.ppK on that
 * stage, the original left over the tied range on every rank. Each stage's
 * sharded units are sharded over its own dp group (the ranks of its pp
 * coordinate): a rank holds 1/S of its stage's parameters. The gradient
 * norm: grad_norm.sq is zeroed, then each range's SQNORM adds to it on the
 * stage that keeps it (a tied range, summed over pp and so whole on every
 * stage, weighted 1/pp), and it is all_reduced over pp (with the axes it
 * was summed over before: tp, a sharded graph's dp_shard): the global
 * norm, so clipping and the logged norm are the 1-stage ones (up to the
 * order of the sum). memplan gives the stages' parts the same bytes (never
 * on one rank); dpexec runs only its stage's INIT, SAVE and update, and its
 * checkpoints find each stage's parameters where that stage's ranks hold
 * them (runtime/ckpt_layout.c).
 * Under offload (passes/offload.c, next) the stages' parts of the optimizer
 * state and the host copies are cut the same way, each stage's host part
 * from the same host offset (memplan), but a tied range stays on every
 * stage (no sub-group: offload's copies of it follow the node they come
 * after, which the sub-group puts on one stage each).
 * Compression (passes/compress.c): a matrix's Q, P and error feedback are
 * its stage's (views that its nodes touch), its P and Q all_reduces its
 * stage's without pp, and its error share -1/W counts the ranks that now
 * sum it: W / pp for a stage's own, W / pp x the tied stages for a tied
 * one (every stage keeping it: W). The errors are then each rank's own
 * gradient's (the uncut program kept a share -M/W on the stages that add
 * zeros): the same sums up to rounding, not the same bits after the first
 * compressed step.
 * When stages_split_params does not hold (more stages than the forecast
 * accounts for) nothing changes: every stage keeps every parameter
 * (passes/p2p.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"

#define PPBIT DP_AXIS_BIT(DP_AXIS_PP)

/* A value's class: what keeps it. */
enum {
	CL_UNKNOWN = -1, /* not worked out (yet) */
	CL_TIED = 0,     /* every stage: a tied parameter's (GPT-2's wte) */
	/* 1 + k: stage k's own */
};

typedef struct {
	Graph *g;
	int p;
	int nv;          /* the values before the parts */
	int *cls;        /* per value: its class (views of the flat buffers; parameters,
			    gradients and masters and the temporaries they are views of) */
	int *roots;      /* the flat buffers cut, value ids */
	int nroots;
	int64_t *lo, *n; /* [root index * (p + 1) + class]: its range in that buffer */
	int *part;       /* [root index * p + k]: NAME.ppK, or -1 */
	int *flat;       /* per value: 1 + its index among the flat buffers, or 0 */
	int64_t *rlo, *rhi; /* [flat index * (p + 1) + class]: the range its views of
			        that class span so far (root_ranges), kept as classes are set */
	uint64_t tied;   /* the stages that read a tied parameter (bit k: stage k), whose
			    ranks alone keep the tied range; 0: every rank keeps it */
	int tied_lo;     /* the lowest of them */
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

/* Could v be cut: a persistent flat buffer (params, grads, the 16-bit
 * copy, their shards, the optimizer state)? */
static int flat_root(const Value *v)
{
	return v->view_of < 0 && v->ndim == 1 && (v->kind == DP_T_FLAT || v->kind == DP_T_OPTSTATE);
}

/* Is v a view (at any depth) of a flat buffer? */
static int in_flat(const Graph *g, const Value *v)
{
	return v->view_of >= 0 && flat_root(ir_root(g, v));
}

/* Give value v class k; 1 when that is news. Two classes for one value: a
 * view across the stages' parts, which the layout never makes. */
static int set_class(Cut *c, int v, int k)
{
	if (c->cls[v] == k)
		return 0;
	if (c->cls[v] != CL_UNKNOWN)
		die("stage_params: %%%s holds parameters of two classes (%d and %d)",
		    c->g->values[v]->name, c->cls[v], k);
	c->cls[v] = k;
	const Value *x = c->g->values[v];
	if (x->view_of >= 0) { /* the class's range in its root */
		const Value *r = ir_root(c->g, x);
		if (c->flat[r->id]) {
			int64_t off = root_offset(c->g, x), *lo = &c->rlo[(c->flat[r->id] - 1) * (c->p + 1)];
			int64_t *hi = &c->rhi[(c->flat[r->id] - 1) * (c->p + 1)];
			if (off < lo[k])
				lo[k] = off;
			if (off + ir_numel(x) > hi[k])
				hi[k] = off + ir_numel(x);
		}
	}
	return 1;
}

/* v and every value it is a view of (below its flat root) class k. */
static void class_chain(Cut *c, int v, int k)
{
	for (const Value *x = c->g->values[v]; x; x = x->view_of >= 0 ? c->g->values[x->view_of] : NULL)
		if (!flat_root(x))
			set_class(c, x->id, k);
}

/* class_chain up to the first value whose class is known already (a tied
 * gathered unit's setup form, tied_gathered). */
static void class_chain_soft(Cut *c, int v, int k)
{
	for (const Value *x = c->g->values[v]; x; x = x->view_of >= 0 ? c->g->values[x->view_of] : NULL)
		if (!flat_root(x)) {
			if (c->cls[x->id] != CL_UNKNOWN)
				return;
			set_class(c, x->id, k);
		}
}

/* Every class range of flat buffer root: the views of it whose class is
 * known (kept by set_class as they become known: a scan of every value per
 * call was quadratic, 9 % of a compile at GPT-3 175B's shape and pp=16). */
static void root_ranges(Cut *c, int root, int64_t *lo, int64_t *hi)
{
	int f = c->flat[root] - 1;
	if (f < 0)
		die("stage_params: %%%s is not a flat buffer", c->g->values[root]->name);
	memcpy(lo, &c->rlo[f * (c->p + 1)], ((size_t)c->p + 1) * sizeof *lo);
	memcpy(hi, &c->rhi[f * (c->p + 1)], ((size_t)c->p + 1) * sizeof *hi);
}

/* A gathered unit read on several stages (passes/p2p.c: each gathers it
 * itself): its shard and shard gradient, views of the flat buffers that
 * staged nodes of two stages touch, are tied; so are the temporaries that
 * the nodes every rank runs (the setup's SHARD, the export's all_gather)
 * touch beside them, and their views (the unit's parameters in its setup
 * form), so those nodes run on every stage that keeps the unit. */
static void tied_gathered(Cut *c)
{
	Graph *g = c->g;
	int *seen = malloc(((size_t)c->nv + 1) * sizeof *seen); /* 1 + the stage that touched it */
	if (!seen)
		die("out of memory");
	for (int v = 0; v < c->nv; v++)
		seen[v] = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		for (int j = -1; j < n->nin && n->stage >= 0; j++) {
			int v = j < 0 ? n->out : n->in[j];
			if (v < 0 || v >= c->nv || !in_flat(g, g->values[v]))
				continue;
			if (!seen[v])
				seen[v] = 1 + n->stage;
			else if (seen[v] != 1 + n->stage && c->cls[v] != CL_TIED)
				class_chain(c, v, CL_TIED);
		}
	}
	free(seen);
	for (int news = 1; news;) {
		news = 0;
		for (int i = 0; i < g->nnodes; i++) {
			const Node *n = g->nodes[i];
			int tied = 0;
			for (int j = -1; j < n->nin && n->stage < 0; j++) {
				int v = j < 0 ? n->out : n->in[j];
				tied |= v >= 0 && v < c->nv && c->cls[v] == CL_TIED && in_flat(g, g->values[v]);
			}
			tied &= !(n->progs & (IR_IN_STEP | IR_IN_EVAL)); /* setup and export */
			for (int j = -1; j < n->nin && tied; j++) {
				int v = j < 0 ? n->out : n->in[j];
				const Value *x = v >= 0 && v < c->nv ? g->values[v] : NULL;
				if (x && ((x->view_of < 0 && !flat_root(x) && x->kind == DP_T_ACT) ||
					  in_flat(g, x)) &&
				    c->cls[v] == CL_UNKNOWN) {
					set_class(c, v, CL_TIED);
					news = 1;
				}
			}
		}
		for (int v = 0; v < c->nv; v++) {
			const Value *x = g->values[v];
			if (x->view_of >= 0 && x->view_of < c->nv && c->cls[x->view_of] == CL_TIED &&
			    !flat_root(g->values[x->view_of]) && c->cls[v] == CL_UNKNOWN)
				news |= set_class(c, v, CL_TIED);
		}
	}
	/* a parameter whose master (bf16: "p.master", in the setup form) is
	 * tied: the INIT that writes one from the other runs where both are */
	for (int v = 0; v < c->nv; v++) {
		const Value *x = g->values[v];
		if (x->kind != DP_T_PARAM || c->cls[v] != CL_UNKNOWN)
			continue;
		const Value *m = ir_find_value(g, ir_fmt(g, "%s.master", x->name));
		if (m && m->id < c->nv && c->cls[m->id] == CL_TIED)
			set_class(c, v, CL_TIED);
	}
}

/* The classes of the views of the flat buffers (see the top of the file):
 * the trained parameters' own (stages_param_stages), their gradients' and
 * masters' and what those are views of; then, to a fixed point, a node's
 * views of unknown class take its stage, or the one class of its other
 * views (the unit's shard beside its gathered params, the reduce_scatter's
 * slice beside the full gradients), and a view inside the range of one
 * class takes it (an update's runs). */
static void find_classes(Cut *c)
{
	Graph *g = c->g;
	for (int v = 0; v < c->nv; v++)
		c->cls[v] = CL_UNKNOWN;
	int *stage = malloc(((size_t)g->nvalues + 1) * sizeof *stage);
	if (!stage)
		die("out of memory");
	stages_param_stages(g, stage);
	tied_gathered(c);
	for (int v = 0; v < c->nv; v++) {
		const Value *pv = g->values[v];
		if (pv->kind != DP_T_PARAM || pv->grad < 0 || pv->view_of < 0 || c->cls[v] >= 0)
			continue;
		/* a view of a gathered temporary read on no stage or several (a
		 * stage's copy of a tied unit's member it does not read): its
		 * nodes' stages say where it is */
		if (stage[v] < 0 && !in_flat(g, pv))
			continue;
		int k = 1 + stage[v];
		class_chain_soft(c, v, k);
		class_chain_soft(c, pv->grad, k);
		static const char *const suffix[] = {".master", ".bwd"};
		for (int i = 0; i < 2; i++) { /* "p.master", "p.bwd" (names are unique) */
			const char *nm = ir_fmt(g, "%s%s", pv->name, suffix[i]);
			const Value *x = ir_find_value(g, nm);
			if (x && x->id < c->nv && x->kind == DP_T_PARAM && x->view_of >= 0)
				class_chain_soft(c, x->id, k);
		}
	}
	free(stage);
	int64_t *lo = malloc(((size_t)c->p + 1) * sizeof *lo);
	int64_t *hi = malloc(((size_t)c->p + 1) * sizeof *hi);
	if (!lo || !hi)
		die("out of memory");
	for (int news = 1; news;) {
		news = 0;
		for (int i = 0; i < g->nnodes; i++) {
			const Node *n = g->nodes[i];
			int k = n->stage >= 0 ? 1 + n->stage : CL_UNKNOWN, many = 0;
			for (int j = -1; j < n->nin && n->stage < 0; j++) {
				int v = j < 0 ? n->out : n->in[j];
				if (v < 0 || v >= c->nv || c->cls[v] < 0)
					continue;
				if (k >= 0 && k != c->cls[v])
					many = 1;
				k = c->cls[v];
			}
			for (int j = -1; j < n->nin && k >= 0 && !many; j++) {
				int v = j < 0 ? n->out : n->in[j];
				if (v >= 0 && v < c->nv && c->cls[v] < 0 && in_flat(g, g->values[v]))
					news |= set_class(c, v, k);
			}
		}
		for (int v = 0; v < c->nv; v++) {
			const Value *x = g->values[v];
			if (c->cls[v] >= 0 || !in_flat(g, x))
				continue;
			root_ranges(c, ir_root(g, x)->id, lo, hi);
			int64_t off = root_offset(g, x);
			for (int k = 0; k <= c->p; k++)
				if (hi[k] >= 0 && off >= lo[k] && off + ir_numel(x) <= hi[k])
					news |= set_class(c, v, k);
		}
	}
	free(lo), free(hi);
}

/* The flat buffers with a stage's part and their ranges: from their views'
 * classes, else (the optimizer state of one optimizer group, which nothing
 * views) those of the buffer an element-wise node over both wholes reads
 * or writes beside it. A buffer's classes are one range each, the tied one
 * at 0 where the layout ordered its units so (compression's state follows
 * its buckets' order, the tied one wherever its gradient completes),
 * together the whole buffer. */
static void find_roots(Cut *c)
{
	Graph *g = c->g;
	int cap = c->nv ? c->nv : 1;
	c->roots = ir_alloc(g, (size_t)cap * sizeof(int));
	c->lo = ir_alloc(g, (size_t)cap * ((size_t)c->p + 1) * sizeof(int64_t));
	c->n = ir_alloc(g, (size_t)cap * ((size_t)c->p + 1) * sizeof(int64_t));
	int64_t *hi = malloc(((size_t)c->p + 1) * sizeof *hi);
	char *seen = calloc((size_t)cap, 1);
	if (!hi || !seen)
		die("out of memory");
	for (int v = 0; v < c->nv; v++) {
		const Value *x = g->values[v];
		if (!flat_root(x))
			continue;
		int r = c->nroots;
		int64_t *lo = &c->lo[r * (c->p + 1)], *n = &c->n[r * (c->p + 1)];
		root_ranges(c, v, lo, hi);
		int own = 0;
		for (int k = 0; k <= c->p; k++) {
			n[k] = hi[k] >= 0 ? hi[k] - lo[k] : 0;
			own |= k > 0 && n[k];
		}
		if (!own)
			continue;
		int64_t sum = 0;
		for (int k = 0; k <= c->p; k++)
			for (int j = 0; j <= c->p; j++)
				if (j != k && n[k] && n[j] && lo[k] < lo[j] + n[j] && lo[j] < lo[k] + n[k])
					die("stage_params: classes %d and %d of %%%s overlap", k, j, x->name);
		for (int k = 0; k <= c->p; k++)
			sum += n[k];
		if (sum != ir_numel(x))
			die("stage_params: the stages' parts cover %lld of %lld elements of %%%s",
			    (long long)sum, (long long)ir_numel(x), x->name);
		c->roots[c->nroots++] = v;
		seen[v] = 1;
	}
	/* whole buffers beside a cut one in an element-wise node */
	for (int news = 1; news;) {
		news = 0;
		for (int i = 0; i < g->nnodes; i++) {
			const Node *n = g->nodes[i];
			if (dp_is_collective(n->op))
				continue;
			int from = -1;
			for (int j = -1; j < n->nin && from < 0; j++) {
				int v = j < 0 ? n->out : n->in[j];
				if (v >= 0 && v < c->nv && seen[v])
					from = root_index(c, v);
			}
			for (int j = -1; j < n->nin && from >= 0; j++) {
				int v = j < 0 ? n->out : n->in[j];
				if (v < 0 || v >= c->nv || seen[v] || !flat_root(g->values[v]) ||
				    ir_numel(g->values[v]) != ir_numel(g->values[c->roots[from]]))
					continue;
				int r = c->nroots++;
				memcpy(&c->lo[r * (c->p + 1)], &c->lo[from * (c->p + 1)],
				       ((size_t)c->p + 1) * sizeof(int64_t));
				memcpy(&c->n[r * (c->p + 1)], &c->n[from * (c->p + 1)],
				       ((size_t)c->p + 1) * sizeof(int64_t));
				c->roots[r] = v;
				seen[v] = news = 1;
			}
		}
	}
	/* in value order, so the parts are made in it */
	size_t w = (size_t)c->p + 1;
	int64_t *t = malloc(2 * w * sizeof *t);
	if (!t)
		die("out of memory");
	for (int i = 1; i < c->nroots; i++) {
		int v = c->roots[i], j = i;
		memcpy(t, &c->lo[i * w], w * sizeof *t);
		memcpy(t + w, &c->n[i * w], w * sizeof *t);
		for (; j > 0 && c->roots[j - 1] > v; j--) {
			c->roots[j] = c->roots[j - 1];
			memcpy(&c->lo[j * w], &c->lo[(j - 1) * w], w * sizeof *t);
			memcpy(&c->n[j * w], &c->n[(j - 1) * w], w * sizeof *t);
		}
		c->roots[j] = v;
		memcpy(&c->lo[j * w], t, w * sizeof *t);
		memcpy(&c->n[j * w], t + w, w * sizeof *t);
	}
	free(t), free(hi), free(seen);
}

/* Each cut buffer's part per stage that has one. */
static void make_parts(Cut *c)
{
	Graph *g = c->g;
	c->part = ir_alloc(g, (size_t)(c->nroots * c->p + 1) * sizeof(int));
	for (int r = 0; r < c->nroots; r++)
		for (int k = 0; k < c->p; k++) {
			int *slot = &c->part[r * c->p + k];
			int64_t len = c->n[r * (c->p + 1) + 1 + k];
			*slot = -1;
			if (!len)
				continue;
			const Value *o = g->values[c->roots[r]];
			Value *x = ir_value(g, ir_fmt(g, "%s.pp%d", o->name, k), o->dtype, 1,
					    (int64_t[]){len}, o->kind, o->loc);
			memcpy(x->place, o->place, sizeof x->place);
			x->space = o->space;
			*slot = x->id;
		}
}

/* Every direct view of a cut buffer inside a stage's range becomes a view
 * of that stage's part. */
static void move_views(Cut *c)
{
	Graph *g = c->g;
	for (int v = 0; v < c->nv; v++) {
		Value *x = g->values[v];
		int r = x->view_of >= 0 ? root_index(c, x->view_of) : -1;
		if (r < 0)
			continue;
		int k = c->cls[v];
		if (k < 0)
			die("stage_params: %%%s, a view of %%%s, is of no stage's part", x->name,
			    g->values[x->view_of]->name);
		if (k == CL_TIED) { /* NAME keeps the tied range alone */
			x->view_offset -= c->lo[r * (c->p + 1)];
			continue;
		}
		x->view_of = c->part[r * c->p + k - 1];
		x->view_offset -= c->lo[r * (c->p + 1) + k];
	}
}

/* The stage whose values node n touches (-1: none, only tied or every
 * rank's); the first cut buffer it names whole (*whole: root index, or -1;
 * several named whole have the same parts); *tied: whether it touches the
 * tied range (a view of it, or a whole buffer that keeps one). */
static int node_part(const Cut *c, const Node *n, int *whole, int *tied)
{
	const Graph *g = c->g;
	int stage = -1;
	*whole = -1;
	*tied = 0;
	for (int k = -1; k < n->nin; k++) {
		int v = k < 0 ? n->out : n->in[k];
		if (v < 0)
			continue;
		int r = root_index(c, v);
		if (r >= 0) {
			*tied |= c->n[r * (c->p + 1)] > 0;
			if (*whole < 0)
				*whole = r;
			else if (memcmp(&c->n[r * (c->p + 1)], &c->n[*whole * (c->p + 1)],
					((size_t)c->p + 1) * sizeof(int64_t)))
				die("stage_params: node %d (%s) runs over %%%s and %%%s, cut differently",
				    n->id, dp_op_names[n->op], g->values[c->roots[*whole]]->name,
				    g->values[v]->name);
			continue;
		}
		int s = -1;
		for (const Value *x = g->values[v]; x && s < 0;
		     x = x->view_of >= 0 ? g->values[x->view_of] : NULL) {
			if (x->id < c->nv && c->cls[x->id] >= 0) {
				s = c->cls[x->id] - 1;
				*tied |= c->cls[x->id] == CL_TIED;
				break;
			}
			for (int q = 0; q < c->nroots * c->p; q++)
				if (c->part[q] == x->id)
					s = q % c->p;
		}
		if (s < 0)
			continue;
		if (stage >= 0 && stage != s)
			die("stage_params: node %d (%s) touches stages %d and %d's parameters", n->id,
			    dp_op_names[n->op], stage, s);
		stage = s;
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
	return ir_node_like(c->g, n, r >= 0 ? c->part[r * c->p + k] : n->out, in, k);
}

/* A copy of node n (over the same values) on stage k: the tied range's
 * nodes, one per stage that keeps it. */
static Node *copy_on_stage(Graph *g, const Node *n, int k)
{
	Node *x = ir_node_like(g, n, n->out, n->in, k);
	x->chunk = n->chunk;
	return x;
}

/* The stages that read a tied parameter: those of the staged nodes (the
 * forward, backward and eval slots p2p placed) that touch a view of the tied
 * class (several tied parameters: the union, where a stage that does not
 * read one adds zeros to its sum). 0 when fewer than two or every stage
 * (then every rank keeps the tied range and sums it over all of pp: at
 * pp=2 GPT-2's wte, and the step file is the one before sub-groups). */
static uint64_t tied_stages(const Cut *c)
{
	const Graph *g = c->g;
	uint64_t set = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->stage < 0 || n->stage >= 64)
			continue;
		for (int j = -1; j < n->nin; j++) {
			int v = j < 0 ? n->out : n->in[j];
			for (const Value *x = v >= 0 ? g->values[v] : NULL; x;
			     x = x->view_of >= 0 ? g->values[x->view_of] : NULL)
				if (x->id < c->nv && c->cls[x->id] == CL_TIED)
					set |= (uint64_t)1 << n->stage;
		}
	}
	uint64_t all = c->p >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << c->p) - 1;
	return set & (set - 1) && set != all ? set : 0;
}

int stage_params_run(Graph *g, Diag *d)
{
	(void)d;
	if (!stages_split_params(g))
		return 0;
	Cut c = {.g = g, .p = (int)g->cfg.mesh[DP_AXIS_PP], .nv = g->nvalues};
	c.cls = malloc(((size_t)c.nv + 1) * sizeof *c.cls);
	c.flat = calloc((size_t)c.nv + 1, sizeof *c.flat);
	if (!c.cls || !c.flat)
		die("out of memory");
	int nflat = 0;
	for (int v = 0; v < c.nv; v++)
		if (flat_root(g->values[v]))
			c.flat[v] = ++nflat;
	c.rlo = malloc(((size_t)nflat + 1) * ((size_t)c.p + 1) * sizeof *c.rlo);
	c.rhi = malloc(((size_t)nflat + 1) * ((size_t)c.p + 1) * sizeof *c.rhi);
	if (!c.rlo || !c.rhi)
		die("out of memory");
	for (int i = 0; i < nflat * (c.p + 1); i++)
		c.rlo[i] = INT64_MAX, c.rhi[i] = -1;
	find_classes(&c);
	/* under offload the tied range stays on every stage (its host copies
	 * and their D2H/H2D are not cut by stage yet: passes/offload.c places
	 * them after the sub-group's all_reduce copies on one stage only) */
	c.tied = ir_any_offload(g) ? 0 : tied_stages(&c);
	c.tied_lo = c.tied ? __builtin_ctzll(c.tied) : -1;
	find_roots(&c);
	if (!c.nroots) { /* every parameter tied: every stage keeps them all */
		free(c.cls), free(c.flat), free(c.rlo), free(c.rhi);
		return 0;
	}
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
		int whole, tied, s = node_part(&c, n, &whole, &tied);
		float w = 0; /* a SQNORM's weight, 0 meaning 1 */
		/* the tied range's node on the stages that keep it: on the lowest,
		 * copies on the others after it (a SAVE and the norm's SQNORM on the
		 * lowest alone: the range is whole and equal on each) */
		int on_tied = c.tied && tied && n->stage < 0 && s < 0;
		int copies = on_tied && n->op != DP_OP_SAVE && n->op != DP_OP_SQNORM;
		if (n->op == DP_OP_SQNORM) {
			if (first_sq < 0)
				first_sq = i, sq = n->out;
			last_sq = i;
			DP_ATTR(n, SQNORM, acc) = 1;
			w = DP_FATTR(n, SQNORM, weight);
			/* a tied range is whole on every stage: each adds its share */
			if (s < 0 && !on_tied)
				DP_FATTR(n, SQNORM, weight) = (w != 0 ? w : 1.0f) / (float)c.p;
		}
		/* compression's error share -1/W (passes/compress.c): W was every
		 * rank of the matrix's all_reduce, pp among its axes; a stage's own
		 * matrix is now summed over its stage's ranks alone (the all_reduce
		 * drops pp below), a tied one over the stages that keep it */
		if (n->op == DP_OP_SCALE && (n->flags & DP_IF_COMPRESSED) && n->stage < 0 &&
		    (s >= 0 || tied)) {
			long w = lrintf(-1.0f / DP_SCALAR(n));
			int keep = s >= 0 ? 1 : c.tied ? __builtin_popcountll(c.tied) : c.p;
			DP_SCALAR(n) = -1.0f / (float)(w / c.p * keep);
		}
		after[i] = malloc((2 * (size_t)c.p + 1) * sizeof **after);
		if (!after[i])
			die("out of memory");
		if (on_tied) {
			n->stage = c.tied_lo;
			if (n->op == DP_OP_ALL_REDUCE && (DP_AXES(n) & PPBIT))
				DP_ATTR(n, ALL_REDUCE, stages) = (int64_t)c.tied;
			else if (dp_is_collective(n->op) && (DP_AXES(n) & PPBIT))
				die("stage_params: node %d (%s) over pp touches the tied range", n->id,
				    dp_op_names[n->op]);
		}
		if (whole >= 0) {
			const int64_t *len = &c.n[whole * (c.p + 1)];
			if (s >= 0)
				die("stage_params: node %d (%s) touches a whole flat buffer and a stage's part",
				    n->id, dp_op_names[n->op]);
			for (int k = 0; k < c.p; k++) {
				if (copies && k != c.tied_lo && (c.tied >> k & 1))
					after[i][nafter[i]++] = copy_on_stage(g, n, k);
				if (len[1 + k]) {
					Node *x = copy_for_stage(&c, n, k);
					if (x->op == DP_OP_SQNORM)
						DP_FATTR(x, SQNORM, weight) = w;
					after[i][nafter[i]++] = x;
				}
			}
			drop[i] = !len[0];
		} else if (copies) {
			for (int k = c.tied_lo + 1; k < c.p; k++)
				if (c.tied >> k & 1)
					after[i][nafter[i]++] = copy_on_stage(g, n, k);
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
		Node **grown = realloc(after[last_sq], ((size_t)nafter[last_sq] + 1) * sizeof **after);
		if (!grown)
			die("out of memory");
		after[last_sq] = grown;
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
	int *gone = malloc(((size_t)c.nroots + 1) * sizeof *gone), ngone = 0;
	if (!gone)
		die("out of memory");
	for (int r = 0; r < c.nroots; r++) {
		Value *x = g->values[c.roots[r]];
		if (c.n[r * (c.p + 1)])
			x->dims[0] = c.n[r * (c.p + 1)];
		else
			gone[ngone++] = c.roots[r];
	}
	ir_drop_values(g, gone, ngone);
	free(old), free(drop), free(after), free(nafter), free(order), free(gone);
	free(c.cls), free(c.flat), free(c.rlo), free(c.rhi);
	return 0;
}
