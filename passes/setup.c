/*
 * setup.c - the INIT and EXPORT programs (pass "setup").
 *
 * INIT runs once at start-up and writes every parameter and buffer where the
 * step reads it; EXPORT runs before a full checkpoint and gathers every
 * parameter back whole under its DSL name. Both follow the layout pass's
 * plan, so sharding stays invisible to the runtime.
 *
 * Before: the layout form (passes/layout.c): units laid out, params and
 * grads views of their buffers. No PH_SETUP nodes.
 *
 * After: PH_SETUP nodes appended after the step's nodes, in this order:
 *   INIT every buffer (nosync: never sharded, never communicated);
 *   every unit uncut (all ddp): INIT each trained param in declaration
 *     order, then (EXPORT) SAVE each;
 *   otherwise, per unit: FILL 0 of a gathered unit's temporary when it has
 *     padding, INIT each param into its full place, SHARD the unit's full
 *     params into this rank's slice (cut units); then per unit (EXPORT):
 *     all_gather a gathered unit's slices back into its temporary, SAVE
 *     each param.
 * Mixed precision: a bf16 unit's params are compute copies; INIT writes
 * their f32 masters ("p.master", initialised as p: the same values as in
 * f32) into the unit's master buffer (flat.params all ddp, its shard view
 * when uncut, a "U.master" temporary when cut) instead of the params, cuts
 * them into the shard like the params, then CASTs them (rounding to
 * nearest even) into the compute copies the step reads first: the copy of
 * the shard ("U.shard.bf16", which a gathered unit all_gathers), the full
 * params of zero1/zero2 and uncut units, flat.params.bf16 (all ddp).
 * EXPORT all_gathers a cut bf16 unit's f32 shards into U.master and SAVEs
 * the masters under the params' names: checkpoints hold f32 masters.
 * Tensor parallelism (tp > 1): INIT of a split parameter p initialises
 * "p.whole" (INIT p.whole as p: the same values as on one rank, a
 * temporary) and SHARDs this rank's block along the split dim over tp;
 * EXPORT all_gathers p over tp into "p.tp_gather" ([tp][block] order),
 * INTERLEAVEs it back into p.whole and SAVEs that as p.
 */
#include <string.h>

#include "shard.h"

#define TPBIT DP_AXIS_BIT(DP_AXIS_TP)

static Node *setup_node(Graph *g, IrOp op, int out, int nin, const int *in, unsigned progs)
{
	Node *n = ir_node(g, op, out, nin, in, PH_SETUP, (Loc){0});
	n->progs = progs;
	if (out >= 0)
		n->block = g->values[out]->block;
	else if (nin > 0)
		n->block = g->values[in[0]]->block;
	return n;
}

/* "p.whole": the whole (all tp ranks') value of split parameter p in the
 * dtype of its master m (f32), with p's initialiser. */
static int whole_of(Graph *g, const Value *p, const Value *m)
{
	const char *name = ir_fmt(g, "%s.whole", p->name);
	Value *w = ir_find_value(g, name);
	if (w)
		return w->id;
	int64_t dims[DP_MAX_DIMS];
	memcpy(dims, p->dims, sizeof dims);
	dims[shard_tp_dim(g, p)] *= g->cfg.mesh[DP_AXIS_TP];
	w = ir_value(g, name, m->dtype, p->ndim, dims, DP_T_ACT, p->loc);
	w->init = p->init;
	w->init_a = p->init_a;
	w->init_b = p->init_b;
	w->block = p->block;
	return w->id;
}

/* INIT of param p into its master m (p itself, or its f32 "p.master"
 * initialised as p). */
static void init_param(Graph *g, int p, int m)
{
	int dim = shard_tp_dim(g, g->values[p]);
	if (dim < 0) {
		setup_node(g, DP_OP_INIT, m, m != p, &p, IR_IN_INIT);
		return;
	}
	int w = whole_of(g, g->values[p], g->values[m]);
	setup_node(g, DP_OP_INIT, w, 1, &p, IR_IN_INIT);
	Node *s = setup_node(g, DP_OP_SHARD, m, 1, &w, IR_IN_INIT);
	DP_ATTR(s, SHARD, axes) = TPBIT;
	DP_ATTR(s, SHARD, dim) = dim;
}

/* SAVE of parameter p from its master m, whole on the data-parallel axes by
 * now, under p's name. */
static void save_param(Graph *g, int p, int m)
{
	const Value *v = g->values[p], *mv = g->values[m];
	int dim = shard_tp_dim(g, v);
	if (dim < 0) {
		setup_node(g, DP_OP_SAVE, -1, 1 + (m != p), (int[]){m, p}, IR_IN_EXPORT);
		return;
	}
	int T = (int)g->cfg.mesh[DP_AXIS_TP];
	int w = whole_of(g, v, mv);
	Value *t = ir_value(g, ir_fmt(g, "%s.tp_gather", v->name), mv->dtype, 1,
			    (int64_t[]){ir_numel(v) * T}, DP_T_ACT, v->loc);
	t->block = v->block;
	shard_comm_node(g, DP_OP_ALL_GATHER, t->id, 1, &m, TPBIT, 0, IR_IN_EXPORT, v->block);
	Node *il = setup_node(g, DP_OP_INTERLEAVE, w, 1, &t->id, IR_IN_EXPORT);
	DP_ATTR(il, INTERLEAVE, parts) = T;
	DP_ATTR(il, INTERLEAVE, dim) = dim;
	setup_node(g, DP_OP_SAVE, -1, 2, (int[]){w, p}, IR_IN_EXPORT);
}

static void cast_init(Graph *g, int to, int from)
{
	setup_node(g, DP_OP_CAST, to, 1, &from, IR_IN_INIT);
}

int setup_run(Graph *g, Diag *d)
{
	const ShardPlan *pl = shard_plan(g, d);
	if (!pl)
		return -1;
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->kind == DP_T_BUFFER)
			setup_node(g, DP_OP_INIT, i, 0, NULL, IR_IN_INIT);
	if (!pl->sharded) {
		int nv = g->nvalues; /* the p.whole values made below are not params */
		int *master = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
		for (int k = 0; k < pl->nu; k++)
			for (int i = 0; i < pl->u[k].nparams; i++)
				master[pl->u[k].params[i]] = pl->u[k].masters[i];
		for (int i = 0; i < nv; i++) /* declaration order */
			if (g->values[i]->kind == DP_T_PARAM && g->values[i]->grad >= 0)
				init_param(g, i, master[i]);
		if (pl->copy >= 0)
			cast_init(g, pl->copy, pl->flat_params);
		for (int i = 0; i < nv; i++)
			if (g->values[i]->kind == DP_T_PARAM && g->values[i]->grad >= 0)
				save_param(g, i, master[i]);
		return 0;
	}
	unsigned shard = shard_cut_axes(g);
	for (int k = 0; k < pl->nu; k++) {
		const Unit *u = &pl->u[k];
		/* where INIT writes the unit whole: its f32 masters, or the params */
		int whole = u->master >= 0 ? u->master : u->full_p;
		if (u->cut && g->values[whole]->kind == DP_T_ACT && u->padded > u->elems)
			DP_FATTR(setup_node(g, DP_OP_FILL, whole, 0, NULL, IR_IN_INIT), FILL, value) = 0;
		for (int i = 0; i < u->nparams; i++)
			init_param(g, u->params[i], u->masters[i]);
		if (u->cut)
			DP_ATTR(setup_node(g, DP_OP_SHARD, u->shard_p, 1, &whole, IR_IN_INIT), SHARD,
				axes) = shard;
		if (u->shard_c >= 0)
			cast_init(g, u->shard_c, u->shard_p);
		if (u->master >= 0 && !u->gathered)
			cast_init(g, u->full_p, u->master);
	}
	for (int k = 0; k < pl->nu; k++) {
		const Unit *u = &pl->u[k];
		int whole = u->master >= 0 ? u->master : u->full_p;
		if (u->gathered || (u->cut && u->master >= 0))
			shard_comm_node(g, DP_OP_ALL_GATHER, whole, 1, &u->shard_p, shard, 0,
					IR_IN_EXPORT, u->block);
		for (int i = 0; i < u->nparams; i++)
			save_param(g, u->params[i], u->masters[i]);
	}
	return 0;
}
