/*
 * collectives.c - each unit's collectives, as its strategy says (pass
 * "collectives").
 *
 * Before: the setup form: units laid out (passes/layout.c, plan in
 * g->shard), INIT/EXPORT programs written; no collective on the
 * data-parallel axes in the step.
 *
 * After: for each unit, by its strategy's row of shard_strategies
 * (passes/shard.c), on the comm stream (PH_COMM, IR_IN_STEP unless said),
 * each collective with a Bucket record covering the unit's members:
 *   gathered units (full_shard, hybrid_shard): an all_gather of the shard
 *     into "U.gather" before the first forward node reading the unit's
 *     params (step and eval), and into "U.gather.bwd" before the first
 *     backward node reading its "p.bwd" views when the layout made one;
 *   SHARD_ALL_REDUCE (ddp): the unit's gradients all_reduced in place
 *     over dp_replicate,dp_shard by one call after the unit's last
 *     backward writer, DP_IF_LAST (once per step: grad_accum accumulates,
 *     as DDP's no_sync). In a sharded graph the call runs on the unit's
 *     "U.grads" view the layout made; in an all-ddp graph the unit has no
 *     value of its own, and the call runs on a new zero-copy view
 *     "bucket.rN" of flat.grads over its gradients (N = its bucket number;
 *     the layout put a unit's gradients next to each other in the order
 *     the backward completes them);
 *   SHARD_ALL_REDUCE_CUT (zero1): the unit's all_reduce, then SHARD of this
 *     rank's slice into "U.grad.shard" before the norm (PH_OPT);
 *   SHARD_REDUCE_SCATTER: with full_grads (zero2, accumulate_grads
 *     unsharded) one reduce_scatter into "U.grad.shard" after the last
 *     writer, DP_IF_LAST; otherwise "U.grads" is zeroed (FILL) before the
 *     unit's first backward writer, reduce_scattered every micro-batch into
 *     "U.rs" and ACCUMed into the shard where the next unit's backward
 *     starts (the step waits for the reduce_scatter there, one unit of
 *     overlap; the end of the backward for the last unit). Then, when the
 *     strategy says so (hybrid_shard always, the others when dp_replicate
 *     > 1 or pp > 1), an all_reduce of the shard over dp_replicate and pp
 *     (shard_repl_axes), DP_IF_LAST;
 *   cut units that are not gathered (zero1, zero2): after the update, an
 *     all_gather of the updated shard back into "U.params", DP_IF_LAST.
 * A bf16 unit's all_gathers read the compute copy of its shard
 * ("U.shard.bf16", which the update writes) into bf16 buffers: half the
 * bytes of f32. Gradients are reduced in reduce_dtype, their own dtype.
 * The all_reduces run even on a 1-rank mesh: the IR shows where
 * communication goes, the runtime skips groups of one rank, and --stats
 * reports 0 bytes. The XENT seed already divides by the global batch, so
 * the sum is the mean.
 *
 * The gradient norm: in a sharded graph the local SQNORM covers this rank's
 * shard and is all_reduced over dp_shard (clipping by the global norm).
 * When some ranges are replicated over that group (ddp units among cut ones
 * over dp_shard, unsplit parameters over tp when tp > 1) the norm is a
 * weighted sum of per-range SQNORMs (weighted_norm) all_reduced over
 * dp_shard and tp; an all-ddp graph needs that only over tp. When some unit
 * accumulates micro-batches into the shard buffer while the full grads are
 * elsewhere, a FILL zeroes the shard buffer after the optimizer's.
 *
 * Why after the last writer: the backward accumulates a gradient over every
 * use of its parameter; once the last contribution is in, the gradient is
 * complete for this micro-batch, and on the last micro-batch of the step
 * for the step, so it can be reduced while the rest of the backward runs.
 * The schedule pass moves each collective as early as legal and adds the
 * cross-stream events.
 */
#include <string.h>

#include "shard.h"

#define TPBIT DP_AXIS_BIT(DP_AXIS_TP)

/* Nodes queued before and after the original nodes, spliced in at the end. */
typedef struct {
	Node **nodes;
	int n;
} NodeList;

typedef struct {
	Graph *g;
	const ShardPlan *pl;
	int nold;                 /* nodes before this pass */
	NodeList *before, *after; /* per original node */
	int isq, iupd, ifill, opt0; /* the optimizer tail's nodes, its first node */
} Ins;

static void queue(Ins *in, NodeList *l, int at, Node *n)
{
	NodeList *q = &l[at];
	Node **grown = ir_alloc(in->g, (size_t)(q->n + 1) * sizeof(Node *));
	if (q->n)
		memcpy(grown, q->nodes, (size_t)q->n * sizeof(Node *));
	grown[q->n++] = n;
	q->nodes = grown;
}

/* Program order: for each original node, the nodes queued before it, the
 * node, the nodes queued after it. The queued nodes were made by ir_node
 * (they are the nodes past nold); every node must land exactly once. */
static void splice(Ins *in)
{
	Graph *g = in->g;
	int total = g->nnodes;
	Node **order = ir_alloc(g, (size_t)(total ? total : 1) * sizeof(Node *));
	int k = 0;
	for (int i = 0; i < in->nold; i++) {
		for (int j = 0; j < in->before[i].n; j++)
			order[k++] = in->before[i].nodes[j];
		order[k++] = g->nodes[i];
		for (int j = 0; j < in->after[i].n; j++)
			order[k++] = in->after[i].nodes[j];
	}
	if (k != total)
		die("collectives: spliced %d of %d nodes", k, total);
	memcpy(g->nodes, order, (size_t)total * sizeof(Node *));
}

static Node *step_node(Graph *g, IrOp op, int out, int nin, const int *in, Phase ph,
		       unsigned flags, int block)
{
	Node *n = ir_node(g, op, out, nin, in, ph, (Loc){0});
	n->progs = IR_IN_STEP;
	n->flags = flags;
	n->block = block;
	return n;
}

/* A bucket record for a unit's collective n over `view`, covering members. */
static void unit_bucket(Graph *g, Node *n, int view, const int *members, int nmembers)
{
	Bucket b = {
		.op = n->op,
		.axes = (unsigned)DP_AXES(n),
		.view = view,
		.elems = ir_numel(g->values[view]),
		.nmembers = nmembers,
		.members = (int *)members,
	};
	n->bucket = ir_add_bucket(g, &b);
}

/* A step collective of unit u from src (-1: in place on out), with the
 * bucket record of the unit's full range: its grads (reductions) or params
 * (gathers). */
static Node *unit_comm(Ins *in, const Unit *u, IrOp op, int out, int src, unsigned axes,
		       unsigned flags, const int *members)
{
	Node *n = shard_comm_node(in->g, op, out, src >= 0, &src, axes, flags, IR_IN_STEP, u->block);
	unit_bucket(in->g, n, op == DP_OP_ALL_GATHER ? u->full_p : u->full_g, members, u->nparams);
	return n;
}

static int *unit_grads(Graph *g, const Unit *u)
{
	int *grads = ir_alloc(g, (size_t)u->nparams * sizeof(int));
	for (int i = 0; i < u->nparams; i++)
		grads[i] = g->values[u->params[i]]->grad;
	return grads;
}

/* ---- gathered units: the all_gathers before compute ---- */

static void gathers(Ins *in)
{
	Graph *g = in->g;
	const ShardPlan *pl = in->pl;
	int nv = g->nvalues;
	int *unit_of = ir_alloc(g, (size_t)nv * sizeof(int)); /* params and p.bwd views */
	for (int v = 0; v < nv; v++)
		unit_of[v] = -1;
	for (int k = 0; k < pl->nu; k++) {
		const Unit *u = &pl->u[k];
		for (int i = 0; u->gathered && i < u->nparams; i++) {
			unit_of[u->params[i]] = k;
			if (u->gather_bwd >= 0)
				unit_of[u->bwd_params[i]] = k;
		}
	}
	/* where each unit's params are first read in the forward (or eval), and
	 * its p.bwd views in the backward */
	int *fwd_at = ir_alloc(g, (size_t)(pl->nu ? pl->nu : 1) * sizeof(int));
	int *bwd_at = ir_alloc(g, (size_t)(pl->nu ? pl->nu : 1) * sizeof(int));
	for (int k = 0; k < pl->nu; k++)
		fwd_at[k] = bwd_at[k] = -1;
	for (int i = 0; i < in->nold; i++) {
		const Node *n = g->nodes[i];
		if (n->phase == PH_SETUP)
			continue;
		for (int j = 0; j < n->nin; j++) {
			int v = n->in[j];
			if (v < 0 || v >= nv || unit_of[v] < 0)
				continue;
			int bwd = g->values[v]->grad < 0; /* a p.bwd view */
			if (bwd != (n->phase == PH_BWD))
				continue;
			int *at = bwd ? &bwd_at[unit_of[v]] : &fwd_at[unit_of[v]];
			if (*at < 0)
				*at = i;
		}
	}
	unsigned shard = shard_cut_axes(g);
	for (int k = 0; k < pl->nu; k++) {
		const Unit *u = &pl->u[k];
		int src = u->shard_c >= 0 ? u->shard_c : u->shard_p; /* bf16: the compute copy */
		if (fwd_at[k] >= 0) {
			Node *ag = shard_comm_node(g, DP_OP_ALL_GATHER, u->gather, 1, &src, shard, 0,
						   IR_IN_STEP | IR_IN_EVAL, u->block);
			unit_bucket(g, ag, u->gather, u->params, u->nparams);
			queue(in, in->before, fwd_at[k], ag);
		}
		if (u->gather_bwd >= 0 && bwd_at[k] >= 0) {
			Node *ag = shard_comm_node(g, DP_OP_ALL_GATHER, u->gather_bwd, 1, &src, shard,
						   0, IR_IN_STEP, u->block);
			unit_bucket(g, ag, u->gather_bwd, u->bwd_params, u->nparams);
			queue(in, in->before, bwd_at[k], ag);
		}
	}
}

/* ---- gradient reduction ---- */

/* All-ddp graphs: the unit's gradients as one view "bucket.rN" of
 * flat.grads, N the number of the bucket record its all_reduce gets. Its
 * block is the parameters' block when they share one, else -1; a tp-split
 * unit's view is this tp rank's part, flat. */
static int unit_grad_view(Graph *g, const Unit *u, const int *grads)
{
	const Value *first = g->values[grads[0]];
	int64_t elems = 0;
	int block = g->values[u->params[0]]->block;
	for (int i = 0; i < u->nparams; i++) {
		const Value *gv = g->values[grads[i]];
		if (gv->view_of != first->view_of || gv->view_offset != first->view_offset + elems)
			die("collectives: %s is not next to its unit's other gradients", gv->name);
		elems += ir_numel(gv);
		if (g->values[u->params[i]]->block != block)
			block = -1;
	}
	Value *view = ir_value(g, ir_fmt(g, "bucket.r%d", g->nbuckets), first->dtype, 1,
			       (int64_t[]){elems}, DP_T_GRAD, first->loc);
	view->view_of = first->view_of;
	view->view_offset = first->view_offset;
	view->block = block;
	for (int a = 0; a < DP_MAX_AXES; a++)
		view->place[a] = first->place[a];
	if (view->place[DP_AXIS_TP].kind == DP_PL_SHARD)
		view->place[DP_AXIS_TP].dim = 0;
	return view->id;
}

/* Where the reduce_scatter of unit k is accumulated into its shard: where
 * the next unit's backward starts (a tied weight's unit starts early), or
 * the end of the backward. */
static int accum_at(const Ins *in, int k)
{
	const ShardPlan *pl = in->pl;
	for (int j = k + 1; j < pl->nu; j++)
		if (pl->u[j].first > pl->u[k].last)
			return pl->u[j].first;
	return in->opt0;
}

static void reduce_unit(Ins *in, int k)
{
	Graph *g = in->g;
	const Unit *u = &in->pl->u[k];
	const ShardStrategy *st = &shard_strategies[u->strat];
	unsigned shard = shard_cut_axes(g), repl = shard_repl_axes(g);
	if (u->last < 0)
		return; /* nothing writes these grads: they stay zero */
	int *grads = unit_grads(g, u);
	if (u->cut && !u->full_grads) {
		/* the unit's full grads are a temporary of this micro-batch */
		Node *f = step_node(g, DP_OP_FILL, u->full_g, 0, NULL, PH_BWD, 0, u->block);
		queue(in, in->before, u->first, f);
	}
	switch ((ShardReduce)st->reduce) {
	case SHARD_ALL_REDUCE:
	case SHARD_ALL_REDUCE_CUT:
		if (u->full_g < 0) { /* an all-ddp graph: no unit view yet */
			int view = unit_grad_view(g, u, grads);
			Node *ar = shard_comm_node(g, DP_OP_ALL_REDUCE, view, 0, NULL, shard_dp_axes(g),
						   DP_IF_LAST, IR_IN_STEP, g->values[view]->block);
			ar->loc = g->values[u->params[u->nparams - 1]]->loc;
			unit_bucket(g, ar, view, grads, u->nparams);
			queue(in, in->after, u->last, ar);
			return;
		}
		queue(in, in->after, u->last,
		      unit_comm(in, u, DP_OP_ALL_REDUCE, u->full_g, -1, shard_dp_axes(g), DP_IF_LAST,
				grads));
		if (st->reduce == SHARD_ALL_REDUCE_CUT) {
			Node *s = step_node(g, DP_OP_SHARD, u->shard_g, 1, &u->full_g, PH_OPT, DP_IF_LAST,
					    u->block);
			DP_ATTR(s, SHARD, axes) = shard;
			queue(in, in->before, in->isq, s);
		}
		return;
	case SHARD_REDUCE_SCATTER:
		break;
	}
	/* reduce_scatter: once per step when full grads accumulate, else every
	 * micro-batch into .rs */
	Node *rs = unit_comm(in, u, DP_OP_REDUCE_SCATTER, u->full_grads ? u->shard_g : u->rs,
			     u->full_g, shard, u->full_grads ? DP_IF_LAST : 0, grads);
	queue(in, in->after, u->last, rs);
	Node *ar = NULL;
	if (st->repl == SHARD_REPL_ALWAYS || in->pl->R > 1 || g->cfg.mesh[DP_AXIS_PP] > 1) {
		ar = shard_comm_node(g, DP_OP_ALL_REDUCE, u->shard_g, 0, NULL, repl, DP_IF_LAST,
				     IR_IN_STEP, u->block);
		unit_bucket(g, ar, u->shard_g, &u->shard_g, 1);
	}
	if (!u->full_grads) {
		int at = accum_at(in, k);
		queue(in, in->before, at,
		      step_node(g, DP_OP_ACCUM, u->shard_g, 1, &u->rs, PH_BWD, 0, u->block));
		if (ar)
			queue(in, in->before, at, ar);
	} else if (ar) {
		queue(in, in->after, u->last, ar);
	}
}

/* ---- the gradient norm ---- */

/* The weight of a gradient range over tp: 1 when split over tp (each tp
 * rank holds a different part), 1/tp when replicated. */
static float tp_weight(const Graph *g, const Value *range)
{
	int T = (int)g->cfg.mesh[DP_AXIS_TP];
	if (T <= 1 || range->place[DP_AXIS_TP].kind == DP_PL_SHARD)
		return 1.0f;
	return (float)(1.0 / T);
}

/* The global gradient norm as a weighted sum: the squared norm of each
 * gradient range counts weight[i], 1/k when k ranks of the norm's
 * all_reduce group hold the same values, so the all_reduce over `axes` sums
 * every distinct gradient element once. The optimizer's SQNORM is reused
 * for the first range; the others accumulate into its output. */
static void weighted_norm(Ins *in, const int *ranges, const float *weight, int n, unsigned axes)
{
	Graph *g = in->g;
	Node *sq = g->nodes[in->isq];
	for (int i = 0; i < n; i++) {
		Node *nd = sq;
		if (i > 0) {
			nd = step_node(g, DP_OP_SQNORM, sq->out, 1, &ranges[i], PH_OPT, DP_IF_LAST, -1);
			DP_ATTR(nd, SQNORM, acc) = 1;
			queue(in, in->after, in->isq, nd);
		}
		nd->in[0] = ranges[i];
		DP_FATTR(nd, SQNORM, weight) = weight[i];
	}
	queue(in, in->after, in->isq,
	      shard_comm_node(g, DP_OP_ALL_REDUCE, sq->out, 0, NULL, axes, DP_IF_LAST, IR_IN_STEP, -1));
}

static void norm(Ins *in)
{
	Graph *g = in->g;
	const ShardPlan *pl = in->pl;
	int T = (int)g->cfg.mesh[DP_AXIS_TP], mixed = 0;
	unsigned axes = (pl->sharded ? shard_cut_axes(g) : 0) | (T > 1 ? TPBIT : 0);
	if (!axes)
		return; /* every rank holds the whole reduced gradient */
	for (int k = 0; k < pl->nu; k++)
		mixed |= pl->sharded && !pl->u[k].cut;
	if (T <= 1 && !mixed) {
		Node *sq = g->nodes[in->isq];
		queue(in, in->after, in->isq,
		      shard_comm_node(g, DP_OP_ALL_REDUCE, sq->out, 0, NULL, axes, DP_IF_LAST,
				      IR_IN_STEP, -1));
		return;
	}
	int *ranges = ir_alloc(g, (size_t)(g->nvalues + pl->nu) * sizeof(int)), n = 0;
	float *w = ir_alloc(g, (size_t)(g->nvalues + pl->nu) * sizeof(float));
	if (pl->sharded) {
		/* one range per unit: its shard (a unit never mixes tp-split and
		 * replicated params); a ddp unit is held by every dp_shard rank */
		for (int k = 0; k < pl->nu; k++) {
			const Unit *u = &pl->u[k];
			ranges[n] = u->shard_g;
			w[n++] = (u->cut ? 1.0f : (float)(1.0 / pl->S)) *
				 tp_weight(g, g->values[u->shard_g]);
		}
	} else {
		/* one range per gradient, in declaration order */
		for (int v = 0; v < g->nvalues; v++)
			if (g->values[v]->kind == DP_T_GRAD && g->values[v]->param >= 0) {
				ranges[n] = v;
				w[n++] = tp_weight(g, g->values[v]);
			}
	}
	weighted_norm(in, ranges, w, n, axes);
}

static int find_opt(const Ins *in, IrOp op)
{
	for (int i = 0; i < in->nold; i++)
		if (in->g->nodes[i]->phase == PH_OPT && in->g->nodes[i]->op == op)
			return i;
	return -1;
}

/* The last update node: the layout splits the update by optimizer group,
 * and the gathers of the updated params follow every part of it. */
static int last_update(const Ins *in)
{
	int at = -1;
	for (int i = 0; i < in->nold; i++)
		if (in->g->nodes[i]->phase == PH_OPT &&
		    (in->g->nodes[i]->op == DP_OP_ADAMW || in->g->nodes[i]->op == DP_OP_SGD))
			at = i;
	return at;
}

int collectives_run(Graph *g, Diag *d)
{
	ShardPlan *pl = shard_plan(g, d);
	if (!pl)
		return -1;
	Ins in = {.g = g, .pl = pl, .nold = g->nnodes};
	in.before = ir_alloc(g, (size_t)(in.nold ? in.nold : 1) * sizeof(NodeList));
	in.after = ir_alloc(g, (size_t)(in.nold ? in.nold : 1) * sizeof(NodeList));
	in.isq = find_opt(&in, DP_OP_SQNORM);
	in.iupd = last_update(&in);
	in.ifill = find_opt(&in, DP_OP_FILL);
	in.opt0 = in.nold;
	for (int i = in.nold - 1; i >= 0; i--)
		if (g->nodes[i]->phase == PH_OPT)
			in.opt0 = i;
	if (in.isq < 0 || in.iupd < 0 || in.ifill < 0)
		die("collectives: the optimizer tail is missing");
	int *first, *last;
	shard_writers(g, in.nold, &first, &last);
	shard_unit_spans(pl, g, first, last);

	gathers(&in);
	for (int k = 0; k < pl->nu; k++)
		reduce_unit(&in, k);
	norm(&in);
	/* the updated shards gathered back into the full params */
	int acc_shard = 0; /* some unit accumulates micro-batches into the shard buffer */
	for (int k = 0; k < pl->nu; k++) {
		const Unit *u = &pl->u[k];
		acc_shard |= !u->cut || !u->full_grads;
		if (u->cut && !u->gathered)
			queue(&in, in.after, in.iupd,
			      unit_comm(&in, u, DP_OP_ALL_GATHER, u->full_p,
					u->shard_c >= 0 ? u->shard_c : u->shard_p, shard_cut_axes(g),
					DP_IF_LAST, u->params));
	}
	if (pl->gtot && acc_shard) {
		Node *f = step_node(g, DP_OP_FILL, pl->shard_grads, 0, NULL, PH_OPT, DP_IF_LAST, -1);
		DP_FATTR(f, FILL, value) = 0;
		queue(&in, in.after, in.ifill, f);
	}
	splice(&in);
	return 0;
}
