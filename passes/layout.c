/*
 * layout.c - units and the flat-buffer layout (pass "layout").
 *
 * The one place that decides which parameters are reduced and gathered
 * together (units: the buckets) and where every parameter, gradient and
 * optimizer-state element lives. The passes after it (setup, collectives)
 * follow its plan (passes/shard.h), which they find again in the laid-out
 * graph (layout_plan, at the bottom): the units decided again the same
 * way, every value the layout made named after its unit.
 *
 * Before: the optimizer form: "flat.params" and "flat.grads" f32[total
 * trained elements] and the optimizer state of the same length; the
 * DP_IF_LAST optimizer tail (SQNORM, CLIP, ADAMW/SGD, FILL) runs over them;
 * params and grads are not views yet.
 *
 * Placement: every value replicated on every mesh axis (passes/tp.c's tp
 * placement of split parameters stays, and their gradients get it too).
 *
 * Units. Every trained parameter is in one unit; a unit follows the
 * strategy of its parameters' block (its own `strategy`, else train's) and
 * is one collective call, so the unit is the bucket:
 *   gathered strategies (full_shard, hybrid_shard): one unit per block
 *     (and per tp split), the unit the user gathers and frees together;
 *   the others (ddp, zero1, zero2): parameters in backward completion
 *     order (last gradient writer; parameters nothing writes last),
 *     greedily up to bucket_mb (a parameter larger than the limit is a
 *     bucket of its own). A new bucket starts where the strategy changes
 *     or at the first parameter whose gradient nothing writes (those need
 *     no collective); in a sharded graph where parameters switch between
 *     tp-split and replicated (the gradient norm weights a shard as a
 *     whole); in an all-ddp graph where another collective (a tp_reduce)
 *     runs between two gradients' completions (a ddp bucket is a run of
 *     gradient all_reduces that follow each other on the comm stream).
 * A cut unit (zero1, zero2, full_shard, hybrid_shard) holds the params of
 * one optimizer group (ir_param_group: weight decay and lr scale; and the
 * block's offload, ir_block_offload, so each update has one), so every
 * rank's chunk of it updates with one group's values: a gathered block
 * whose params are in two groups is two units ("h.0" and "h.0.g1": the
 * group's number), and zero1/zero2 keep an open bucket per group. Uncut
 * (ddp) units mix groups: each rank holds them whole.
 * Units are ordered by the completion of their last gradient; when each
 * pipeline stage keeps only its own parameters (stages_split_params, under
 * every strategy), a bucket also ends where the stage that keeps its
 * parameters changes (stages_param_stages: a tied parameter's is every
 * stage's), a gathered block's unit is its block's stage's, and the units
 * are then ordered by that stage, every stage's (tied) first, so each
 * stage's part of every flat buffer is one range (a sharded graph's shard
 * buffers, its full params and grads alike: their offsets follow the unit
 * order), which the update's group runs do not cross either
 * (passes/stage_params.c cuts the buffers there).
 *
 * After, when every unit is ddp (uncut): params and grads are views of
 * flat.params / flat.grads at equal offsets, unit after unit in that order
 * (so a unit is a contiguous range: its all_reduce is zero-copy). Nothing
 * else changes.
 *
 * After, otherwise (S = dp_shard ranks): a cut unit is padded to a
 * multiple of S (FSDP's flat-parameter padding; a parameter that does not
 * divide is never rejected) and rank s holds elements [s*c, (s+1)*c) of it,
 * c = padded/S; an uncut (ddp) unit is held whole. A hybrid_shard unit whose
 * dp_replicate all_reduce is compressed (shard_row: its first 2-D
 * parameter's row length m) is padded to a multiple of S m instead, so each
 * rank's chunk is a whole number of rows of length m, the matrix
 * [c/m, m] passes/compress.c compresses. Buffers:
 *   "flat.params.shard", "flat.grads.shard" and opt.* (place dp_shard:
 *     shard0): per unit, what this rank updates, at loff: "U.shard" and
 *     "U.grad.shard" views of a cut unit's chunk; "U.params" and "U.grads"
 *     views of an uncut unit (its params and grads live there);
 *   "flat.params": the full params of cut, not gathered units (zero1,
 *     zero2), "U.params" views; "flat.grads": the full grads of cut units
 *     with full_grads, "U.grads" views (partial on the data-parallel axes).
 *     When no unit needs one, that value becomes the shard buffer instead
 *     (keeping its id), so the graph never holds an empty buffer;
 *   gathered units: "U.gather" (f32[padded], a temporary of the step and
 *     eval programs) that its params are views of, and with
 *     reshard_after_forward a second one "U.gather.bwd" whose "p.bwd"
 *     views the backward nodes now read (not made for a unit the backward
 *     does not read, e.g. a first layer whose input needs no gradient);
 *     the unit's full grads "U.grads" are a temporary unless full_grads,
 *     and "U.rs" (f32[chunk], shard0) takes their reduce_scatter.
 *   Params and grads are views of their unit's full buffers in unit order;
 *   grads are partial on the data-parallel axes; a tp-split unit's shard
 *   views are shard0 on tp. The optimizer tail runs on the shard buffers
 *   (SQNORM of, CLIP and update into flat.grads.shard / flat.params.shard);
 *   its FILL zeroes the buffer the backward accumulates into (flat.grads
 *   when some unit keeps full grads, else the shard buffer).
 * Mixed precision (passes/precision.c gave each trained param the dtype its
 * block computes in; grads have reduce_dtype): the optimizer updates f32
 * masters and writes a bf16 compute copy in the same pass ("flat.params.bf16"
 * all ddp, "flat.params.shard.bf16" sharded, element for element beside
 * flat.params / flat.params.shard: the update's copy operand). A bf16 param
 * is a view of the compute copy (all ddp, uncut units), of
 * "flat.params.bf16" (the full bf16 params of cut, not gathered units; f32
 * units keep theirs in flat.params) or of its unit's bf16 "U.gather"; its
 * f32 master is a view "p.master" of flat.params (all ddp), of the unit's
 * shard view (uncut), or of a temporary "U.master" (cut: INIT and EXPORT
 * only, the masters live as shards), and the gathers read "U.shard.bf16",
 * the copy of the shard. Sharded buckets do not mix dtypes.
 * Optimizer groups: the one update node becomes one per run of a group in
 * the buffers it runs over (a cut unit's chunk, an uncut unit's params;
 * a group with offload: one per unit, the host step's units),
 * over views "B.runK" of each of its buffers at the same range on every
 * rank, with the group's weight_decay and lr_scale (0 meaning 1) and offload
 * (Node.offload, for passes/offload.c); with one group it stays the one
 * node, with that group's attributes.
 * Hand-written IR with a strategy that does not suit the mesh is reported
 * here (the front end reports it at the DSL setting).
 */
#include <stdint.h>
#include <string.h>

#include "shard.h"

static void place_replicated(Graph *g)
{
	for (int i = 0; i < g->nvalues; i++) {
		Value *v = g->values[i];
		Place tp = v->kind == DP_T_PARAM ? v->place[DP_AXIS_TP] : (Place){DP_PL_REPLICATE, -1};
		for (int a = 0; a < DP_MAX_AXES; a++)
			v->place[a] = (Place){DP_PL_REPLICATE, -1};
		v->place[DP_AXIS_TP] = tp;
	}
	for (int i = 0; i < g->nvalues; i++) {
		Value *v = g->values[i];
		if (v->kind == DP_T_GRAD && v->param >= 0)
			v->place[DP_AXIS_TP] = g->values[v->param]->place[DP_AXIS_TP];
	}
}

static void place_shard(Value *v)
{
	v->place[DP_AXIS_SHARD] = (Place){DP_PL_SHARD, 0};
}

static void place_partial(Value *v, unsigned axes)
{
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (axes & DP_AXIS_BIT(a))
			v->place[a] = (Place){DP_PL_PARTIAL, -1};
}

static int trained(const Value *v)
{
	return v->kind == DP_T_PARAM && v->grad >= 0;
}

/* ---- units ---- */

/* Trained parameters in backward completion order (last writer of the
 * gradient; none last; ties by id). */
static int *params_by_completion(Graph *g, const int *last, int *np)
{
	int *ps = ir_alloc(g, (size_t)(g->nvalues ? g->nvalues : 1) * sizeof(int));
	int n = 0;
	for (int v = 0; v < g->nvalues; v++)
		if (trained(g->values[v]))
			ps[n++] = v;
	/* insertion sort: stable, small n */
	for (int i = 1; i < n; i++) {
		int p = ps[i], j = i;
		int kp = last[g->values[p]->grad];
		kp = kp < 0 ? INT32_MAX : kp;
		while (j > 0) {
			int kq = last[g->values[ps[j - 1]]->grad];
			kq = kq < 0 ? INT32_MAX : kq;
			if (kq <= kp)
				break;
			ps[j] = ps[j - 1];
			j--;
		}
		ps[j] = p;
	}
	*np = n;
	return ps;
}

static Unit *new_unit(Graph *g, ShardPlan *pl, const char *name, int block, int tp, int strat,
		     int group)
{
	Unit *u = &pl->u[pl->nu++];
	memset(u, 0, sizeof *u);
	u->name = tp ? ir_fmt(g, "%s.tp", name) : name;
	if (group > 0)
		u->name = ir_fmt(g, "%s.g%d", u->name, group);
	u->group = group;
	u->block = block;
	u->tp = tp;
	u->strat = strat;
	u->cut = shard_strategies[strat].cut;
	u->gathered = shard_strategies[strat].gathered;
	u->full_grads = !u->gathered || g->accum_unsharded;
	u->reshard = u->gathered && ir_block_reshard(g, block);
	u->first = u->last = -1;
	u->stage = -1;
	u->foff = u->goff = -1;
	u->full_p = u->full_g = u->shard_p = u->shard_g = -1;
	u->gather = u->gather_bwd = u->rs = -1;
	u->shard_c = u->master = -1;
	u->dtype = DP_F32;
	return u;
}

static void unit_add(Graph *g, Unit *u, int p)
{
	int *grown = ir_alloc(g, (size_t)(u->nparams + 1) * sizeof(int));
	int *masters = ir_alloc(g, (size_t)(u->nparams + 1) * sizeof(int));
	if (u->nparams)
		memcpy(grown, u->params, (size_t)u->nparams * sizeof(int));
	grown[u->nparams++] = p;
	u->params = grown;
	u->masters = masters; /* filled by place_in */
	u->elems += ir_numel(g->values[p]);
	if (dp_is_half(g->values[p]->dtype))
		u->dtype = g->values[p]->dtype;
}

/* Does a bucket end between parameters a and b (completion order)? See
 * "Units" above. coll[i] counts the collectives among the first i nodes. */
static int bucket_ends(const Graph *g, const ShardPlan *pl, const int *last, const int *coll,
		       const int *stage, int a, int b)
{
	int la = last[g->values[a]->grad], lb = last[g->values[b]->grad];
	if ((la >= 0) != (lb >= 0) || stage[a] != stage[b])
		return 1;
	if (pl->sharded)
		return (shard_tp_dim(g, g->values[a]) >= 0) != (shard_tp_dim(g, g->values[b]) >= 0) ||
		       g->values[a]->dtype != g->values[b]->dtype;
	return la >= 0 && coll[lb] - coll[la + 1] > 0;
}

static void make_units(Graph *g, ShardPlan *pl, const int *first, const int *last)
{
	int np;
	int *ps = params_by_completion(g, last, &np);
	int *coll = ir_alloc(g, (size_t)(g->nnodes + 1) * sizeof(int));
	for (int i = 0; i < g->nnodes; i++)
		coll[i + 1] = coll[i] + dp_is_collective(g->nodes[i]->op);
	pl->u = ir_alloc(g, (size_t)(np ? np : 1) * sizeof(Unit));
	int64_t limit = (int64_t)((double)g->bucket_mb * 1024.0 * 1024.0);
	/* the open bucket of each optimizer group (uncut buckets: all in [0]) */
	Unit **open = ir_alloc(g, (size_t)pl->ngroups * sizeof(Unit *));
	/* per param: the pipeline stage that keeps it when each keeps its own */
	int *stage = ir_alloc(g, (size_t)(g->nvalues ? g->nvalues : 1) * sizeof(int));
	int split = stages_split_params(g);
	if (split)
		stages_param_stages(g, stage);
	else
		for (int i = 0; i < np; i++)
			stage[ps[i]] = -1;
	for (int i = 0; i < np; i++) {
		const Value *p = g->values[ps[i]];
		int tp = pl->sharded && shard_tp_dim(g, p) >= 0;
		int strat = ir_block_strategy(g, p->block);
		int group = shard_strategies[strat].cut ? pl->group_of[ps[i]] : 0;
		if (shard_strategies[strat].gathered) {
			/* one unit per block (and per tp split, and optimizer group) */
			memset(open, 0, (size_t)pl->ngroups * sizeof(Unit *));
			Unit *u = NULL;
			for (int k = 0; k < pl->nu && !u; k++)
				if (pl->u[k].gathered && pl->u[k].block == p->block && pl->u[k].tp == tp &&
				    pl->u[k].group == group)
					u = &pl->u[k];
			if (!u) {
				u = new_unit(g, pl, p->block >= 0 ? g->blocks[p->block].name : "model",
					     p->block, tp, strat, group);
				u->stage = stage[ps[i]];
			}
			/* a block's params on two stages (a tied one: each of
			 * them gathers the block, passes/p2p.c) keep it whole */
			if (u->stage != stage[ps[i]])
				u->stage = -1;
			unit_add(g, u, ps[i]);
			continue;
		}
		Unit *bk = open[group];
		int64_t bytes = ((bk ? bk->elems : 0) + ir_numel(p)) * (int64_t)ir_dtype_size(p->dtype);
		if (!bk || bytes > limit || strat != bk->strat ||
		    bucket_ends(g, pl, last, coll, stage, bk->params[bk->nparams - 1], ps[i]))
			bk = open[group] = new_unit(g, pl, ir_fmt(g, "bucket%d", pl->nu), p->block, tp,
						    strat, 0);
		bk->group = group;
		bk->stage = stage[ps[i]];
		if (bk->block != p->block)
			bk->block = -1;
		unit_add(g, bk, ps[i]);
	}
	/* block units were created at their first (earliest completing) param;
	 * order all units by their last completion (stable: buckets already are) */
	shard_unit_spans(pl, g, first, last);
	for (int i = 1; i < pl->nu; i++) {
		Unit t = pl->u[i];
		int kt = t.last < 0 ? INT32_MAX : t.last, j = i;
		while (j > 0 && (pl->u[j - 1].last < 0 ? INT32_MAX : pl->u[j - 1].last) > kt) {
			pl->u[j] = pl->u[j - 1];
			j--;
		}
		pl->u[j] = t;
	}
	/* each stage keeping its own: the units of every stage (the tied ones)
	 * first, then stage by stage, so that each stage's part of every flat
	 * buffer is one range (passes/stage_params.c cuts them there) */
	for (int i = 1; split && i < pl->nu; i++) {
		Unit t = pl->u[i];
		int j = i;
		while (j > 0 && pl->u[j - 1].stage > t.stage) {
			pl->u[j] = pl->u[j - 1];
			j--;
		}
		pl->u[j] = t;
	}
}

/* ---- the flat layout ---- */

static Value *flat1(Graph *g, const char *name, int dt, int64_t n, DpTensorKind kind)
{
	return ir_value(g, name, (DpDtype)dt, 1, (int64_t[]){n}, kind, (Loc){0});
}

/* A 1-D view of `of` (in its dtype) at element offset off. */
static int view1(Graph *g, const char *name, int of, int64_t off, int64_t n, DpTensorKind kind,
		 int block)
{
	Value *v = flat1(g, name, g->values[of]->dtype, n, kind);
	v->view_of = of;
	v->view_offset = off;
	v->block = block;
	return v->id;
}

/* Param i of unit u and its grad: views at element offset *off of the
 * buffers its compute values (fc), f32 masters (fm; -1 when the param is
 * its own master) and grads (fg) live in; *off moves past them. A master
 * "p.master" carries p's initialiser: INIT writes it as p. */
static void place_in(Graph *g, Unit *u, int i, int fc, int fm, int fg, int64_t *off)
{
	Value *pv = g->values[u->params[i]], *gv = g->values[pv->grad];
	pv->view_of = fc;
	gv->view_of = fg;
	pv->view_offset = gv->view_offset = *off;
	u->masters[i] = pv->id;
	if (fm >= 0) {
		Value *m = ir_value(g, ir_fmt(g, "%s.master", pv->name), g->values[fm]->dtype,
				    pv->ndim, pv->dims, DP_T_PARAM, pv->loc);
		m->block = pv->block;
		m->view_of = fm;
		m->view_offset = *off;
		m->place[DP_AXIS_TP] = pv->place[DP_AXIS_TP];
		m->init = pv->init;
		m->init_a = pv->init_a;
		m->init_b = pv->init_b;
		u->masters[i] = m->id;
	}
	*off += ir_numel(pv);
}

/* Every unit uncut: the units one after another in the flat buffers; a
 * bf16 param's compute copy in pl->copy at its master's offset. */
static void lay_out_whole(Graph *g, ShardPlan *pl)
{
	int64_t off = 0;
	for (int k = 0; k < pl->nu; k++) {
		Unit *u = &pl->u[k];
		for (int i = 0; i < u->nparams; i++) {
			int bf16 = dp_is_half(g->values[u->params[i]]->dtype);
			place_in(g, u, i, bf16 ? pl->copy : pl->flat_params,
				 bf16 ? pl->flat_params : -1, pl->flat_grads, &off);
			if (bf16)
				u->master = pl->flat_params;
		}
	}
	if (off != ir_numel(g->values[pl->flat_params]))
		die("layout: units cover %lld of %lld elements", (long long)off,
		    (long long)ir_numel(g->values[pl->flat_params]));
}

/* The shard buffer "F.shard" (ltot elements) beside flat buffer f, which
 * keeps `full` elements (placed partial on `partial`); with full = 0 f
 * itself becomes the shard buffer. */
static int shard_buffer(Graph *g, int f, int64_t full, int64_t ltot, unsigned partial)
{
	Value *v = g->values[f];
	const char *name = ir_fmt(g, "%s.shard", v->name);
	if (!full) {
		ir_rename_value(g, v, name);
		v->dims[0] = ltot;
		place_shard(v);
		return f;
	}
	v->dims[0] = full;
	place_partial(v, partial);
	Value *s = flat1(g, name, v->dtype, ltot, DP_T_FLAT);
	place_shard(s);
	return s->id;
}

/* The sizes and offsets of every unit of a sharded graph, and of the
 * buffers they add up to; returns the elements of the shard buffers. */
static int64_t unit_offsets(const Graph *g, ShardPlan *pl)
{
	int64_t ltot = 0;
	for (int k = 0; k < pl->nu; k++) {
		Unit *u = &pl->u[k];
		int parts = u->cut ? pl->S : 1;
		u->chunk = (u->elems + parts - 1) / parts;
		if ((u->row = shard_row(g, u)))
			u->chunk = (u->chunk + u->row - 1) / u->row * u->row;
		u->padded = u->chunk * parts;
		u->loff = ltot;
		ltot += u->chunk;
		if (u->cut && !u->gathered && dp_is_half(u->dtype)) {
			u->foff = pl->ftot16;
			pl->ftot16 += u->padded;
		} else if (u->cut && !u->gathered) {
			u->foff = pl->ftot;
			pl->ftot += u->padded;
		}
		if (u->cut && u->full_grads) {
			u->goff = pl->gtot;
			pl->gtot += u->padded;
		}
	}
	return ltot;
}

/* Offsets, sizes and the buffers and views of every unit of a sharded
 * graph (see "After, otherwise" above). */
static void lay_out_shards(Graph *g, ShardPlan *pl)
{
	int fp = pl->flat_params, fg = pl->flat_grads;
	int64_t ltot = unit_offsets(g, pl);
	unsigned dp = shard_dp_axes(g);

	int sp = pl->shard_params = shard_buffer(g, fp, pl->ftot, ltot, 0);
	int sg = pl->shard_grads = shard_buffer(g, fg, pl->gtot, ltot, dp);
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->kind == DP_T_OPTSTATE) {
			g->values[i]->dims[0] = ltot;
			place_shard(g->values[i]);
		}
	if (pl->copy >= 0) {
		Value *c = g->values[pl->copy];
		ir_rename_value(g, c, ir_fmt(g, "%s.%s", g->values[sp]->name, ir_dtype_name(pl->half)));
		c->dims[0] = ltot;
		place_shard(c);
	}
	if (pl->ftot16)
		pl->full16 = flat1(g, ir_fmt(g, "flat.params.%s", ir_dtype_name(pl->half)), pl->half,
				   pl->ftot16, DP_T_FLAT)->id;

	for (int k = 0; k < pl->nu; k++) {
		Unit *u = &pl->u[k];
		int bf16 = dp_is_half(u->dtype);
		if (u->cut) {
			u->shard_p = view1(g, ir_fmt(g, "%s.shard", u->name), sp, u->loff, u->chunk,
					   DP_T_PARAM, u->block);
			u->shard_g = view1(g, ir_fmt(g, "%s.grad.shard", u->name), sg, u->loff,
					   u->chunk, DP_T_GRAD, u->block);
			place_shard(g->values[u->shard_p]);
			place_shard(g->values[u->shard_g]);
			if (bf16) {
				u->shard_c = view1(g, ir_fmt(g, "%s.shard.%s", u->name,
							     ir_dtype_name(u->dtype)), pl->copy,
						   u->loff, u->chunk, DP_T_PARAM, u->block);
				place_shard(g->values[u->shard_c]);
			}
		} else {
			/* ddp: the whole unit, params and grads, in the shared buffers
			 * (a bf16 unit's compute copy beside its masters) */
			u->shard_p = u->full_p = view1(g, ir_fmt(g, "%s.params", u->name), sp, u->loff,
						       u->chunk, DP_T_PARAM, u->block);
			u->shard_g = u->full_g = view1(g, ir_fmt(g, "%s.grads", u->name), sg, u->loff,
						       u->chunk, DP_T_GRAD, u->block);
			if (bf16) {
				u->master = u->shard_p;
				u->full_p = view1(g, ir_fmt(g, "%s.params.%s", u->name,
							    ir_dtype_name(u->dtype)), pl->copy,
						  u->loff, u->chunk, DP_T_PARAM, u->block);
			}
		}
		if (u->tp) { /* different values on every tp rank */
			g->values[u->shard_p]->place[DP_AXIS_TP] =
				g->values[u->shard_g]->place[DP_AXIS_TP] = (Place){DP_PL_SHARD, 0};
			if (u->shard_c >= 0)
				g->values[u->shard_c]->place[DP_AXIS_TP] = (Place){DP_PL_SHARD, 0};
			if (!u->cut && bf16)
				g->values[u->full_p]->place[DP_AXIS_TP] = (Place){DP_PL_SHARD, 0};
		}
		if (u->gathered) {
			u->gather = flat1(g, ir_fmt(g, "%s.gather", u->name), u->dtype, u->padded,
					  DP_T_ACT)->id;
			g->values[u->gather]->block = u->block;
			u->full_p = u->gather;
		} else if (u->cut) {
			u->full_p = view1(g, ir_fmt(g, "%s.params", u->name), bf16 ? pl->full16 : fp,
					  u->foff, u->padded, DP_T_PARAM, u->block);
		}
		if (u->cut && bf16) {
			u->master = flat1(g, ir_fmt(g, "%s.master", u->name), DP_F32, u->padded,
					  DP_T_ACT)->id;
			g->values[u->master]->block = u->block;
		}
		if (u->goff >= 0) {
			u->full_g = view1(g, ir_fmt(g, "%s.grads", u->name), fg, u->goff, u->padded,
					  DP_T_GRAD, u->block);
		} else if (u->cut) {
			u->full_g = flat1(g, ir_fmt(g, "%s.grads", u->name), g->reduce_dtype, u->padded,
					  DP_T_ACT)->id;
			g->values[u->full_g]->block = u->block;
		}
		place_partial(g->values[u->full_g], dp);
		if (u->cut && !u->full_grads) {
			u->rs = flat1(g, ir_fmt(g, "%s.rs", u->name), g->reduce_dtype, u->chunk,
				      DP_T_ACT)->id;
			g->values[u->rs]->block = u->block;
			place_shard(g->values[u->rs]);
		}
		int64_t off = 0;
		for (int i = 0; i < u->nparams; i++) {
			place_in(g, u, i, u->full_p, u->master, u->full_g, &off);
			place_partial(g->values[g->values[u->params[i]]->grad], dp);
		}
	}
}

/* Resharding: a second gathered buffer for each gathered unit the
 * backward reads, and the backward reads its "p.bwd" views. */
static void lay_out_backward_gathers(Graph *g, ShardPlan *pl)
{
	int nv = g->nvalues;
	int *unit_of = ir_alloc(g, (size_t)nv * sizeof(int));
	int *bwd_view = ir_alloc(g, (size_t)nv * sizeof(int));
	for (int v = 0; v < nv; v++)
		unit_of[v] = bwd_view[v] = -1;
	for (int k = 0; k < pl->nu; k++)
		for (int i = 0; i < pl->u[k].nparams; i++)
			unit_of[pl->u[k].params[i]] = k;
	char *read = ir_alloc(g, (size_t)(pl->nu ? pl->nu : 1));
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->phase != PH_BWD)
			continue;
		for (int j = 0; j < n->nin; j++)
			if (n->in[j] >= 0 && n->in[j] < nv && unit_of[n->in[j]] >= 0)
				read[unit_of[n->in[j]]] = 1;
	}
	for (int k = 0; k < pl->nu; k++) {
		Unit *u = &pl->u[k];
		if (!u->reshard || !read[k])
			continue;
		u->gather_bwd = flat1(g, ir_fmt(g, "%s.gather.bwd", u->name), u->dtype, u->padded,
				      DP_T_ACT)->id;
		g->values[u->gather_bwd]->block = u->block;
		u->bwd_params = ir_alloc(g, (size_t)u->nparams * sizeof(int));
		for (int i = 0; i < u->nparams; i++) {
			const Value *p = g->values[u->params[i]];
			Value *b = ir_value(g, ir_fmt(g, "%s.bwd", p->name), p->dtype, p->ndim, p->dims,
					    DP_T_PARAM, p->loc);
			b->block = p->block;
			b->view_of = u->gather_bwd;
			b->view_offset = p->view_offset;
			u->bwd_params[i] = bwd_view[p->id] = b->id;
		}
	}
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (n->phase != PH_BWD)
			continue;
		for (int j = 0; j < n->nin; j++)
			if (n->in[j] >= 0 && n->in[j] < nv && bwd_view[n->in[j]] >= 0)
				n->in[j] = bwd_view[n->in[j]];
	}
}

static Node *find_opt(const Graph *g, IrOp op)
{
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->phase == PH_OPT && g->nodes[i]->op == op)
			return g->nodes[i];
	return NULL;
}

/* The update writes the bf16 compute copy beside the masters (ADAMW's in3,
 * SGD's in2), when there is one. */
static void attach_copy(Graph *g, const ShardPlan *pl)
{
	Node *upd = find_opt(g, DP_OP_ADAMW) ? find_opt(g, DP_OP_ADAMW) : find_opt(g, DP_OP_SGD);
	if (!upd)
		die("layout: the optimizer tail is missing");
	if (pl->copy < 0)
		return;
	int at = upd->op == DP_OP_ADAMW ? 3 : 2;
	for (int k = upd->nin; k < at; k++)
		upd->in[k] = -1;
	upd->in[at] = pl->copy;
	upd->nin = at + 1;
}

/* A range of the update's buffers and the optimizer group it updates with;
 * unit: the unit it lies in when its group offloads (one host update per
 * unit, below), else -1. */
typedef struct {
	int64_t off, n;
	int group, stage, unit;
} GroupRange;

static int push_range(Graph *g, GroupRange **r, int n, int64_t off, int64_t len, int group,
		      int stage, int unit)
{
	if (n > 0 && (*r)[n - 1].group == group && (*r)[n - 1].stage == stage &&
	    (*r)[n - 1].unit == unit && (*r)[n - 1].off + (*r)[n - 1].n == off) {
		(*r)[n - 1].n += len;
		return n;
	}
	GroupRange *grown = ir_alloc(g, (size_t)(n + 1) * sizeof *grown);
	if (n)
		memcpy(grown, *r, (size_t)n * sizeof *grown);
	grown[n] = (GroupRange){off, len, group, stage, unit};
	*r = grown;
	return n + 1;
}

/* The runs of one optimizer group in what the update runs over, in buffer
 * order: a cut unit's chunk is of its one group; an uncut unit's (and every
 * unit's in an all-ddp graph) params are whole on every rank, each of its
 * own group. The same ranges on every rank. A group that offloads (its
 * update runs on the host, passes/offload.c) is cut at every unit's edge
 * too: one host update per unit, so each unit's updated 16-bit copy goes
 * back to the device as soon as its own update is done, beside the next
 * unit's update (docs/OFFLOAD.md). */
static int group_ranges(Graph *g, const ShardPlan *pl, GroupRange **r)
{
	int n = 0;
	int64_t off = 0;
	*r = NULL;
	for (int k = 0; k < pl->nu; k++) {
		const Unit *u = &pl->u[k];
		if (pl->sharded && u->cut) {
			n = push_range(g, r, n, u->loff, u->chunk, u->group, u->stage,
				       pl->group_offload[u->group] ? k : -1);
			continue;
		}
		if (pl->sharded)
			off = u->loff;
		for (int i = 0; i < u->nparams; i++) {
			int64_t len = ir_numel(g->values[u->params[i]]);
			int group = pl->group_of[u->params[i]];
			n = push_range(g, r, n, off, len, group, u->stage,
				       pl->group_offload[group] ? k : -1);
			off += len;
		}
	}
	return n;
}

/* A view of buffer `of` for range r of the update ("NAME.runK": its K-th):
 * a flat view of the params and the bf16 copy (not a parameter of the
 * model: nothing initialises, saves or differentiates it), a grad view of
 * the grads, optimizer state of the moments. */
static int range_view(Graph *g, int of, const GroupRange *r, int k, DpTensorKind kind)
{
	const Value *b = g->values[of];
	int v = view1(g, ir_fmt(g, "%s.run%d", b->name, k), of, r->off, r->n, kind, -1);
	memcpy(g->values[v]->place, b->place, sizeof b->place);
	return v;
}

/* The update split where the optimizer group changes: one update per run of
 * a group, over views of its buffers (params, grads, optimizer state, the
 * bf16 copy), with the group's weight_decay and lr_scale. One group: the
 * one update over everything, as the optimizer pass made it. */
static void split_update(Graph *g, const ShardPlan *pl)
{
	Node *upd = find_opt(g, DP_OP_ADAMW) ? find_opt(g, DP_OP_ADAMW) : find_opt(g, DP_OP_SGD);
	GroupRange *r;
	int nr = group_ranges(g, pl, &r), adam = upd->op == DP_OP_ADAMW;
	int64_t covered = 0;
	for (int k = 0; k < nr; k++)
		covered += r[k].n;
	if (covered != ir_numel(g->values[upd->out]))
		die("layout: the optimizer groups cover %lld of %lld elements", (long long)covered,
		    (long long)ir_numel(g->values[upd->out]));
	int pos = 0, offload = 0;
	while (g->nodes[pos] != upd)
		pos++;
	for (int k = 0; k < nr; k++)
		offload |= r[k].unit >= 0;
	for (int k = 0; k < nr; k++) {
		Node *n = upd;
		float wd = pl->group_wd[r[k].group], ls = pl->group_lr_scale[r[k].group];
		upd->offload = pl->group_offload[r[k].group];
		if (nr > 1) {
			int in[DP_MAX_IN];
			for (int j = 0; j < upd->nin; j++) {
				DpTensorKind kind = j == 0 ? DP_T_GRAD : j == (adam ? 3 : 2) ? DP_T_FLAT
											      : DP_T_OPTSTATE;
				in[j] = upd->in[j] < 0 ? -1 : range_view(g, upd->in[j], &r[k], k, kind);
			}
			n = ir_node(g, upd->op, range_view(g, upd->out, &r[k], k, DP_T_FLAT), upd->nin,
				    in, PH_OPT, upd->loc);
			n->progs = upd->progs;
			n->flags = upd->flags;
			n->offload = upd->offload;
			memcpy(n->fa, upd->fa, sizeof n->fa);
			/* with offload the host updates run in the forward's order
			 * (the buffer's reversed): the unit the next step gathers
			 * last is updated last, so its copy back is the one the
			 * step's end waits for, and the others run beside the
			 * updates after theirs */
			ir_move_node(g, n, offload ? pos : pos + k);
		}
		if (adam) {
			DP_FATTR(n, ADAMW, weight_decay) = wd;
			DP_FATTR(n, ADAMW, lr_scale) = ls == 1 ? 0 : ls;
		} else {
			DP_FATTR(n, SGD, weight_decay) = wd;
			DP_FATTR(n, SGD, lr_scale) = ls == 1 ? 0 : ls;
		}
	}
	if (nr > 1)
		ir_remove_node(g, upd);
}

/* The optimizer tail on what this rank updates: the shard buffers. */
static void retarget_optimizer(Graph *g, const ShardPlan *pl)
{
	Node *sq = find_opt(g, DP_OP_SQNORM), *clip = find_opt(g, DP_OP_CLIP);
	Node *upd = find_opt(g, DP_OP_ADAMW) ? find_opt(g, DP_OP_ADAMW) : find_opt(g, DP_OP_SGD);
	Node *fill = find_opt(g, DP_OP_FILL);
	if (!sq || !upd || !fill)
		die("layout: the optimizer tail is missing");
	sq->in[0] = pl->shard_grads;
	if (clip)
		clip->out = pl->shard_grads;
	upd->out = pl->shard_params;
	upd->in[0] = pl->shard_grads;
	fill->out = pl->gtot ? pl->flat_grads : pl->shard_grads;
}

static int flat_buffer(const Graph *g, const char *name)
{
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->kind == DP_T_FLAT && strcmp(g->values[i]->name, name) == 0)
			return i;
	die("layout: %s missing (optimizer pass not run?)", name);
}

/* The optimizer groups of the trained parameters (ShardPlan.group_of). */
static void param_groups(Graph *g, ShardPlan *pl)
{
	int cap = 1;
	for (int v = 0; v < g->nvalues; v++)
		cap += trained(g->values[v]);
	pl->group_of = ir_alloc(g, (size_t)(g->nvalues ? g->nvalues : 1) * sizeof(int));
	pl->group_wd = ir_alloc(g, (size_t)cap * sizeof(float));
	pl->group_lr_scale = ir_alloc(g, (size_t)cap * sizeof(float));
	pl->group_offload = ir_alloc(g, (size_t)cap * sizeof(int));
	pl->group_wd[0] = g->opt.weight_decay;
	pl->group_lr_scale[0] = 1;
	pl->group_offload[0] = g->offload;
	pl->ngroups = 1;
	for (int v = 0; v < g->nvalues; v++) {
		pl->group_of[v] = -1;
		if (!trained(g->values[v]))
			continue;
		float wd, ls;
		ir_param_group(g, g->values[v], &wd, &ls);
		int off = ir_block_offload(g, g->values[v]->block), k = 0;
		while (k < pl->ngroups && (pl->group_wd[k] != wd || pl->group_lr_scale[k] != ls ||
					   pl->group_offload[k] != off))
			k++;
		if (k == pl->ngroups) {
			pl->group_wd[k] = wd;
			pl->group_lr_scale[k] = ls;
			pl->group_offload[k] = off;
			pl->ngroups++;
		}
		pl->group_of[v] = k;
	}
}

/* A plan with the mesh's numbers and no units or buffers yet; pl->half:
 * the 16-bit dtype some trained parameter is computed in (there is a
 * compute copy; the front end allows one such dtype per model), else -1. */
static ShardPlan *new_plan(Graph *g)
{
	if (g->cfg.strategy >= DP_NSTRAT)
		die("layout: strategy %u out of range", g->cfg.strategy);
	ShardPlan *pl = ir_alloc(g, sizeof *pl);
	pl->S = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (shard_cut_axes(g) & DP_AXIS_BIT(a))
			pl->S *= (int)g->cfg.mesh[a];
	pl->R = (int)g->cfg.mesh[DP_AXIS_REPLICATE];
	pl->flat_params = pl->flat_grads = -1;
	pl->shard_params = pl->shard_grads = pl->copy = pl->full16 = -1;
	pl->half = -1;
	param_groups(g, pl);
	for (int v = 0; v < g->nvalues; v++) {
		if (!trained(g->values[v]))
			continue;
		if (shard_strategies[ir_block_strategy(g, g->values[v]->block)].cut)
			pl->sharded = 1;
		if (dp_is_half(g->values[v]->dtype))
			pl->half = g->values[v]->dtype;
	}
	return pl;
}

int layout_run(Graph *g, Diag *d)
{
	ShardPlan *pl = new_plan(g);
	pl->flat_params = flat_buffer(g, "flat.params");
	pl->flat_grads = flat_buffer(g, "flat.grads");
	if (pl->half >= 0)
		pl->copy = flat1(g, ir_fmt(g, "flat.params.%s", ir_dtype_name(pl->half)), pl->half,
				 ir_numel(g->values[pl->flat_params]), DP_T_FLAT)->id;
	place_replicated(g);
	int *first, *last;
	shard_writers(g, g->nnodes, &first, &last);
	make_units(g, pl, first, last);
	for (int k = 0; k < pl->nu; k++) {
		const Unit *u = &pl->u[k];
		char why[160];
		if (ir_strategy_fits(g, u->strat, why, sizeof why))
			continue;
		int own = u->block >= 0 && g->blocks[u->block].strategy >= 0;
		error_at(d, own ? g->blocks[u->block].strategy_loc : (Loc){g->file, 0, 0}, "%s", why);
		return -1;
	}
	if (pl->sharded) {
		lay_out_shards(g, pl);
		lay_out_backward_gathers(g, pl);
		retarget_optimizer(g, pl);
	} else {
		lay_out_whole(g, pl);
	}
	attach_copy(g, pl);
	split_update(g, pl);
	g->shard = pl;
	return 0;
}

/* ---- the plan, again, from a laid-out graph ----
 *
 * The passes after this one find the plan in the IR: the units are what
 * make_units decides on the laid-out graph (the parameters, their
 * gradients' writers, the strategies, dtypes and bucket_mb are all still
 * there), and every buffer and view the layout made has a name made from
 * its unit's. layout_plan looks them up and checks that each parameter,
 * master and gradient is where the layout puts it, so hand-written IR that
 * the layout cannot have made is an error here, not a broken program
 * later. */

typedef struct {
	Graph *g;
	Diag *d;
	Loc at;   /* where to point: the unit's first parameter */
	int bad;
} Finder;

/* The value named name, or -1 after reporting it missing. */
static int find(Finder *f, const char *name)
{
	Value *v = ir_find_value(f->g, name);
	if (v)
		return v->id;
	if (!f->bad++)
		error_at(f->d, f->at, "the IR is after layout, but %%%s, which the layout makes, "
			 "is missing", name);
	return -1;
}

/* "UNIT.suffix" */
static int find_unit(Finder *f, const Unit *u, const char *suffix)
{
	return find(f, ir_fmt(f->g, "%s.%s", u->name, suffix));
}

/* Does gradient gr have its parameter p's elements? Reports when not: the
 * layout gives both one range. */
static void check_grad(Finder *f, const Value *p, int gr)
{
	if (f->bad || ir_numel(f->g->values[gr]) == ir_numel(p))
		return;
	f->bad++;
	error_at(f->d, f->g->values[gr]->loc, "%%%s has %lld elements and its parameter %%%s %lld",
		 f->g->values[gr]->name, (long long)ir_numel(f->g->values[gr]), p->name,
		 (long long)ir_numel(p));
}

/* Is value id v a view of `of` at element offset off? Reports when not. */
static void check_view(Finder *f, int v, int of, int64_t off)
{
	if (v < 0 || of < 0 || f->bad)
		return;
	const Value *x = f->g->values[v];
	if (x->view_of == of && x->view_offset == off)
		return;
	f->bad++;
	error_at(f->d, x->loc, "%%%s should be a view of %%%s at +%lld, where the layout puts it",
		 x->name, f->g->values[of]->name, (long long)off);
}

/* Unit k of an all-ddp graph: its params and grads in the flat buffers at
 * *off, a bf16 param's f32 master "p.master" beside it in flat.params. */
static void find_whole(Finder *f, ShardPlan *pl, Unit *u, int64_t *off)
{
	for (int i = 0; i < u->nparams; i++) {
		const Value *p = f->g->values[u->params[i]];
		int bf16 = dp_is_half(p->dtype);
		u->masters[i] = bf16 ? find(f, ir_fmt(f->g, "%s.master", p->name)) : p->id;
		if (bf16)
			u->master = pl->flat_params;
		check_grad(f, p, p->grad);
		check_view(f, p->id, bf16 ? pl->copy : pl->flat_params, *off);
		check_view(f, p->grad, pl->flat_grads, *off);
		if (bf16)
			check_view(f, u->masters[i], pl->flat_params, *off);
		*off += ir_numel(p);
	}
}

/* Unit u of a sharded graph: the values lay_out_shards and
 * lay_out_backward_gathers made for it. */
static void find_shards(Finder *f, Unit *u)
{
	int bf16 = dp_is_half(u->dtype);
	if (u->cut) {
		u->shard_p = find_unit(f, u, "shard");
		u->shard_g = find_unit(f, u, "grad.shard");
		if (bf16)
			u->shard_c = find_unit(f, u, ir_fmt(f->g, "shard.%s", ir_dtype_name(u->dtype)));
	} else {
		u->shard_p = u->full_p = find_unit(f, u, "params");
		u->shard_g = u->full_g = find_unit(f, u, "grads");
		if (bf16) {
			u->master = u->shard_p;
			u->full_p = find_unit(f, u, ir_fmt(f->g, "params.%s", ir_dtype_name(u->dtype)));
		}
	}
	if (u->gathered)
		u->full_p = u->gather = find_unit(f, u, "gather");
	else if (u->cut)
		u->full_p = find_unit(f, u, "params");
	if (u->cut && bf16)
		u->master = find_unit(f, u, "master");
	if (u->cut)
		u->full_g = find_unit(f, u, "grads");
	if (u->cut && !u->full_grads)
		u->rs = find_unit(f, u, "rs");
	const Value *gb = u->reshard ? ir_find_value(f->g, ir_fmt(f->g, "%s.gather.bwd", u->name))
				     : NULL;
	if (gb) { /* made only when the backward reads the unit */
		u->gather_bwd = gb->id;
		u->bwd_params = ir_alloc(f->g, (size_t)u->nparams * sizeof(int));
	}
	int64_t off = 0;
	for (int i = 0; i < u->nparams; i++) {
		const Value *p = f->g->values[u->params[i]];
		u->masters[i] = u->master >= 0 ? find(f, ir_fmt(f->g, "%s.master", p->name)) : p->id;
		if (gb)
			u->bwd_params[i] = find(f, ir_fmt(f->g, "%s.bwd", p->name));
		check_grad(f, p, p->grad);
		check_view(f, p->id, u->full_p, off);
		check_view(f, p->grad, u->full_g, off);
		if (u->master >= 0)
			check_view(f, u->masters[i], u->master, off);
		if (gb)
			check_view(f, u->bwd_params[i], u->gather_bwd, off);
		off += ir_numel(p);
	}
}

/* A flat buffer by name, else its name once it became the shard buffer. */
static int find_flat(Finder *f, const char *name)
{
	const Value *v = ir_find_value(f->g, name);
	if (v && v->kind == DP_T_FLAT)
		return v->id;
	return find(f, ir_fmt(f->g, "%s.shard", name));
}

ShardPlan *layout_plan(Graph *g, Diag *d)
{
	ShardPlan *pl = new_plan(g);
	Finder f = {g, d, {g->file, 0, 0}, 0};
	for (int v = 0; v < g->nvalues && !f.at.line; v++)
		if (trained(g->values[v]))
			f.at = g->values[v]->loc;
	pl->flat_params = find_flat(&f, "flat.params");
	pl->flat_grads = find_flat(&f, "flat.grads");
	if (pl->sharded) {
		pl->shard_params = find(&f, "flat.params.shard");
		pl->shard_grads = find(&f, "flat.grads.shard");
	}
	if (pl->half >= 0)
		pl->copy = find(&f, ir_fmt(g, pl->sharded ? "flat.params.shard.%s" : "flat.params.%s",
					   ir_dtype_name(pl->half)));
	if (f.bad)
		return NULL;
	int *first, *last;
	shard_writers(g, g->nnodes, &first, &last);
	make_units(g, pl, first, last);
	int64_t off = 0;
	if (pl->sharded && (unit_offsets(g, pl), pl->ftot16))
		pl->full16 = find(&f, ir_fmt(g, "flat.params.%s", ir_dtype_name(pl->half)));
	for (int k = 0; k < pl->nu && !f.bad; k++) {
		Unit *u = &pl->u[k];
		f.at = g->values[u->params[0]]->loc;
		if (pl->sharded)
			find_shards(&f, u);
		else
			find_whole(&f, pl, u, &off);
	}
	if (f.bad)
		return NULL;
	g->shard = pl;
	return pl;
}
