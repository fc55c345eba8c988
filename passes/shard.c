/*
 * shard.c - what each data-parallel strategy does, and the small queries
 * the sharding passes (layout, setup, collectives) share.
 *
 * The table below is the whole difference between the strategies; the
 * passes read it instead of testing strategy names, so a new strategy is a
 * row here (and, if it needs a new kind of collective, a case in
 * passes/collectives.c). S = dp_shard ranks, R = dp_replicate ranks.
 *
 *   ddp           units are buckets; every gradient all_reduced (summed)
 *                 over dp_replicate x dp_shard once per step; params,
 *                 grads and optimizer state whole on every rank.
 *   zero1         as ddp, then each rank keeps 1/S of the reduced gradient
 *                 (SHARD) and of the optimizer state, updates its slice of
 *                 the fp32 master weights, and all_gathers the updated
 *                 slices back into the full params.
 *   zero2         the gradients are reduce_scattered over dp_shard instead
 *                 (full gradients still accumulate over micro-batches), and
 *                 with R > 1 or pp > 1 each slice is all_reduced over
 *                 dp_replicate and pp (shard_repl_axes: a pipeline stage's
 *                 slice holds its own blocks' part, zeros elsewhere).
 *   full_shard    no persistent full params: each block (the unit) is
 *                 all_gathered before its forward and, with
 *                 reshard_after_forward, again before its backward; its
 *                 gradients reduce_scattered every micro-batch. Refuses
 *                 R > 1 (ir_strategy_fits): nothing would synchronise the
 *                 copies.
 *   hybrid_shard  full_shard within dp_shard, and every slice all_reduced
 *                 over dp_replicate (a group of one on a 1-D mesh).
 */
#include "shard.h"

/* ORDER DpStrategy */
const ShardStrategy shard_strategies[DP_NSTRAT] = {
	/*                        cut gathered reduce                repl */
	[DP_STRAT_DDP]          = {0, 0, SHARD_ALL_REDUCE,     SHARD_REPL_IF_MESH},
	[DP_STRAT_ZERO1]        = {1, 0, SHARD_ALL_REDUCE_CUT, SHARD_REPL_IF_MESH},
	[DP_STRAT_ZERO2]        = {1, 0, SHARD_REDUCE_SCATTER, SHARD_REPL_IF_MESH},
	[DP_STRAT_FULL_SHARD]   = {1, 1, SHARD_REDUCE_SCATTER, SHARD_REPL_IF_MESH},
	[DP_STRAT_HYBRID_SHARD] = {1, 1, SHARD_REDUCE_SCATTER, SHARD_REPL_ALWAYS},
};

ShardPlan *shard_plan(Graph *g, Diag *d)
{
	return g->shard ? g->shard : layout_plan(g, d);
}

/* Context parallelism: the cp ranks of a group hold different tokens of the
 * same samples, so a parameter's gradient is partial over cp too. It is
 * summed with the data-parallel gradients, and the sharded strategies cut
 * over dp_shard x cp (torchtitan's FSDP over dp_shard x cp: the cp ranks'
 * memory shards too, and one reduce_scatter sums and cuts at once). cp = 1
 * adds nothing, so the masks stay as they were. */
static unsigned cp_bit(const Graph *g)
{
	return g->cfg.mesh[DP_AXIS_CP] > 1 ? DP_AXIS_BIT(DP_AXIS_CP) : 0;
}

/* Pipeline parallelism: every stage keeps every parameter and computes the
 * gradients of its own blocks' uses (zero elsewhere), so the gradients are
 * partial over pp too and summed with the data-parallel ones (passes/p2p.c),
 * or, where they are cut over dp_shard (zero2), the slices are summed over
 * pp with dp_replicate's; passes/stage_params.c then drops pp from a stage's
 * own buckets and slices (only a tied parameter's keep it). pp = 1 adds
 * nothing. */
static unsigned pp_bit(const Graph *g)
{
	return g->cfg.mesh[DP_AXIS_PP] > 1 ? DP_AXIS_BIT(DP_AXIS_PP) : 0;
}

unsigned shard_dp_axes(const Graph *g)
{
	return DP_AXIS_BIT(DP_AXIS_REPLICATE) | DP_AXIS_BIT(DP_AXIS_SHARD) | cp_bit(g) | pp_bit(g);
}

unsigned shard_repl_axes(const Graph *g)
{
	return DP_AXIS_BIT(DP_AXIS_REPLICATE) | pp_bit(g);
}

int64_t shard_row(const Graph *g, const Unit *u)
{
	if (g->cfg.compress == DP_COMPRESS_NONE || u->strat != DP_STRAT_HYBRID_SHARD || !u->cut ||
	    u->block < 0 || ir_block_compress(g, u->block) == DP_COMPRESS_NONE)
		return 0;
	for (int i = 0; i < u->nparams; i++) {
		const Value *p = g->values[u->params[i]];
		if (p->ndim >= 2)
			return ir_numel(p) / p->dims[0];
	}
	return 0;
}

unsigned shard_cut_axes(const Graph *g)
{
	return DP_AXIS_BIT(DP_AXIS_SHARD) | cp_bit(g);
}

int shard_tp_dim(const Graph *g, const Value *p)
{
	if (g->cfg.mesh[DP_AXIS_TP] <= 1 || p->place[DP_AXIS_TP].kind != DP_PL_SHARD)
		return -1;
	return p->place[DP_AXIS_TP].dim;
}

void shard_writers(Graph *g, int n, int **first, int **last)
{
	int nv = g->nvalues;
	int *f = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
	int *l = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
	/* the gradients by their root value (only values of one root overlap):
	 * each backward node is checked against its output root's gradients */
	int *head = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
	int *next = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
	for (int v = 0; v < nv; v++)
		f[v] = l[v] = head[v] = -1;
	for (int v = nv - 1; v >= 0; v--) {
		const Value *gv = g->values[v];
		if (gv->kind != DP_T_GRAD || gv->param < 0)
			continue;
		int r = ir_root(g, gv)->id;
		next[v] = head[r];
		head[r] = v;
	}
	for (int i = 0; i < n; i++) {
		const Node *nd = g->nodes[i];
		if (nd->phase != PH_BWD || !(nd->progs & IR_IN_STEP) || nd->out < 0)
			continue;
		const Value *o = g->values[nd->out];
		for (int v = head[ir_root(g, o)->id]; v >= 0; v = next[v])
			if (ir_overlaps(g, o, g->values[v])) {
				if (f[v] < 0)
					f[v] = i;
				l[v] = i;
			}
	}
	*first = f;
	*last = l;
}

void shard_unit_spans(ShardPlan *pl, const Graph *g, const int *first, const int *last)
{
	for (int k = 0; k < pl->nu; k++) {
		Unit *u = &pl->u[k];
		u->first = u->last = -1;
		for (int i = 0; i < u->nparams; i++) {
			int gr = g->values[u->params[i]]->grad;
			if (last[gr] > u->last)
				u->last = last[gr];
			if (first[gr] >= 0 && (u->first < 0 || first[gr] < u->first))
				u->first = first[gr];
		}
	}
}

Node *shard_comm_node(Graph *g, IrOp op, int out, int nin, const int *in, unsigned axes,
		      unsigned flags, unsigned progs, int block)
{
	Node *n = ir_node(g, op, out, nin, in, progs == IR_IN_EXPORT ? PH_SETUP : PH_COMM,
			  (Loc){0});
	DP_AXES(n) = axes;
	n->stream = DP_STREAM_COMM;
	n->flags = flags;
	n->progs = progs;
	n->block = block;
	return n;
}
