/*
 * collectives.c - placement and collective insertion (pass "collectives").
 *
 * Before: the optimizer form (GRAPH-FORMS.md "After optimizer"): every param
 * and its grad are views of flat.params / flat.grads at the same offset; the
 * backward accumulates into the grads; the DP_IF_LAST optimizer tail reads
 * flat.grads.
 *
 * After (strategy ddp): values are placed (parameters replicated on every
 * mesh axis), and each gradient gets an in-place ALL_REDUCE over the data
 * parallel axes (dp_replicate | dp_shard) on the comm stream, DP_IF_LAST,
 * PH_COMM, placed right after the gradient's last backward writer, in the
 * order those writers appear. The all_reduce is inserted even on a 1-rank
 * mesh: the IR shows where communication goes, the runtime skips groups of
 * one rank, and --stats reports 0 bytes. INIT program: INIT every param and
 * buffer where the step reads it; EXPORT: SAVE every param.
 *
 * Why after the last writer: the backward accumulates a gradient over every
 * use of its parameter; once the last contribution is in, the gradient is
 * complete for this micro-batch, and on the last micro-batch of the step it
 * is complete for the step (DP_IF_LAST), so it can be reduced while the rest
 * of the backward runs. The schedule pass adds the cross-stream events.
 *
 * Sharded strategies (S = dp_shard ranks, R = dp_replicate ranks). The
 * parameters are laid out in units (see "Units" below), each padded to a
 * multiple of S; rank s owns slice s of every unit. Persistent state:
 * flat.params.shard (fp32 master weights), flat.grads.shard, opt.* (all
 * 1/S of the padded model, place dp_shard: shard0).
 *   zero1   full params flat.params and full grads flat.grads persistent;
 *           per unit: all_reduce of the full grads over dp_replicate,dp_shard
 *           (last micro-batch), then SHARD cuts this rank's gradient slice;
 *           the update runs on the shards; all_gather of each unit's updated
 *           shard back into flat.params.
 *   zero2   as zero1, but the gradients are reduce_scattered over dp_shard
 *           per unit (once per step: grad_accum accumulates full grads);
 *           with R > 1 an all_reduce of the shard over dp_replicate.
 *   full_shard / hybrid_shard
 *           no persistent full params: per unit (block) the forward
 *           all_gathers into a temporary "B.gather" (step and eval) that the
 *           block's params are views of; with reshard_after_forward the
 *           backward reads "p.bwd" views of a second gather "B.gather.bwd"
 *           (not made for a block whose backward does not read its
 *           weights), so the first buffer dies after the forward. Gradients
 *           go to a temporary "B.grads" (FILL 0 before the block's backward),
 *           are reduce_scattered every micro-batch into "B.rs" and ACCUMed
 *           into the shard where the next unit's backward starts (the step
 *           waits for the reduce_scatter there, one unit of overlap).
 *           accumulate_grads unsharded instead keeps flat.grads persistent
 *           and reduce_scatters once per step (memory for traffic).
 *           hybrid_shard adds an all_reduce of each shard over dp_replicate
 *           (last micro-batch); full_shard refuses dp_replicate > 1.
 *   All:    the grad norm is the sqnorm of the local shard all_reduced over
 *           dp_shard (clipping by the global norm); INIT program: INIT each
 *           param into its full place, SHARD each unit into the shard (FILL
 *           0 first where a gathered temporary has padding); EXPORT:
 *           all_gather what is not held whole, SAVE each param. Buffers
 *           (nosync) get INIT only: never sharded, never communicated.
 * Placement annotations: shards place(dp_shard: shard0), unreduced grads
 * partial on the data-parallel axes, everything else replicated (the shard
 * buffers stay shard0 when they also hold ddp units; those units' views
 * are replicated).
 *
 * Tensor parallelism (tp > 1; passes/tp.c made split parameters per rank):
 * every strategy above treats a split parameter like any other (its
 * data-parallel collectives run among the ranks with the same tp
 * coordinate), and units never mix split and replicated parameters ("U.tp"
 * units). INIT of a split parameter initialises "p.whole" (INIT p.whole as
 * p) and SHARDs this rank's block along the split dim over tp; EXPORT
 * all_gathers it over tp, INTERLEAVEs it back to the whole layout and SAVEs
 * it as p. The gradient norm weights each split gradient (range) 1 and each
 * replicated one 1/tp and all_reduces the sum over tp as well
 * (weighted_norm).
 *
 * Per-block strategies. A block may set its own `strategy` (and
 * `reshard_after_forward`); train's applies to the others. When every
 * parameter follows ddp the graph takes the ddp path above. Otherwise
 * every parameter is laid out in units as for the sharded strategies, and
 * each unit follows its block's strategy: the zero1/zero2/full_shard/hybrid
 * treatment above per unit, and for a ddp unit (never padded or cut) its
 * params and grads live whole in the shard buffers, its grads accumulate
 * there and are all_reduced in place over dp_replicate,dp_shard once per
 * step. One optimizer tail updates the shard buffers; the norm then weights
 * each ddp unit's squared norm 1/dp_shard (every rank of the shard group
 * holds it) before the all_reduce over dp_shard. */
#include <stdint.h>
#include <string.h>

#include "passes.h"

/* Parameters (and everything else) replicated on every data-parallel axis:
 * the default of ir_value, restated here because this pass owns placement.
 * The tp placement of tensor-parallel parameters (passes/tp.c) stays, and
 * their gradients get it too. */
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

/* A setup node (INIT or EXPORT program). */
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

/* A collective on the comm stream over the mesh axes `axes` (PH_SETUP in
 * the EXPORT program, else PH_COMM). */
static Node *comm_node(Graph *g, IrOp op, int out, int nin, const int *in, unsigned axes,
		       unsigned flags, unsigned progs, int block)
{
	Node *n = ir_node(g, op, out, nin, in, progs == IR_IN_EXPORT ? PH_SETUP : PH_COMM,
			  (Loc){0});
	n->ia[0] = axes;
	n->stream = DP_STREAM_COMM;
	n->flags = flags;
	n->progs = progs;
	n->block = block;
	return n;
}

/* ---- tensor parallelism: whole-tensor setup and the gradient norm ---- */

#define TPBIT DP_AXIS_BIT(DP_AXIS_TP)

/* The dim a tensor-parallel parameter is split along over tp, or -1. */
static int tp_dim(const Graph *g, const Value *p)
{
	if (g->cfg.mesh[DP_AXIS_TP] <= 1 || p->place[DP_AXIS_TP].kind != DP_PL_SHARD)
		return -1;
	return p->place[DP_AXIS_TP].dim;
}

/* "p.whole": the whole (all tp ranks') value of split parameter p, a
 * temporary of the INIT and EXPORT programs, with p's initialiser. */
static int whole_of(Graph *g, const Value *p)
{
	const char *name = ir_fmt(g, "%s.whole", p->name);
	Value *w = ir_find_value(g, name);
	if (w)
		return w->id;
	int64_t dims[DP_MAX_DIMS];
	memcpy(dims, p->dims, sizeof dims);
	dims[tp_dim(g, p)] *= g->cfg.mesh[DP_AXIS_TP];
	w = ir_value(g, name, p->dtype, p->ndim, dims, DP_T_ACT, p->loc);
	w->init = p->init;
	w->init_a = p->init_a;
	w->init_b = p->init_b;
	w->block = p->block;
	return w->id;
}


/* INIT of parameter p where the step reads it. A tensor-parallel one is
 * initialised whole (INIT p.whole as p: the same values as on one rank) and
 * this rank's block cut out along its split dim. */
static void init_param(Graph *g, int p)
{
	int dim = tp_dim(g, g->values[p]);
	if (dim < 0) {
		setup_node(g, DPK_INIT, p, 0, NULL, IR_IN_INIT);
		return;
	}
	int w = whole_of(g, g->values[p]);
	setup_node(g, DPK_INIT, w, 1, &p, IR_IN_INIT);
	Node *s = setup_node(g, DPK_SHARD, p, 1, &w, IR_IN_INIT);
	s->ia[0] = TPBIT;
	s->ia[1] = dim;
}

/* SAVE of parameter p (whole on the data-parallel axes by now). A
 * tensor-parallel one is all_gathered over tp ([tp][block] order),
 * INTERLEAVEd back into its whole layout and saved under p's name. */
static void save_param(Graph *g, int p)
{
	const Value *v = g->values[p];
	int dim = tp_dim(g, v);
	if (dim < 0) {
		setup_node(g, DPK_SAVE, -1, 1, &p, IR_IN_EXPORT);
		return;
	}
	int T = (int)g->cfg.mesh[DP_AXIS_TP];
	int w = whole_of(g, v);
	Value *t = ir_value(g, ir_fmt(g, "%s.tp_gather", v->name), v->dtype, 1,
			    (int64_t[]){ir_numel(v) * T}, DP_T_ACT, v->loc);
	t->block = v->block;
	comm_node(g, DPK_ALL_GATHER, t->id, 1, &p, TPBIT, 0, IR_IN_EXPORT, v->block);
	Node *il = setup_node(g, DPK_INTERLEAVE, w, 1, &t->id, IR_IN_EXPORT);
	il->ia[0] = T;
	il->ia[1] = dim;
	setup_node(g, DPK_SAVE, -1, 2, (int[]){w, p}, IR_IN_EXPORT);
}

/* The global gradient norm as a weighted sum: the squared norm of each
 * gradient range (`ranges`, n values) counts weight[i], 1/k when k ranks of
 * the norm's all_reduce group hold the same values (a gradient replicated
 * over tp counts 1/tp, one replicated over dp_shard by a ddp block among
 * sharded ones 1/dp_shard), so the all_reduce over `axes` sums every
 * distinct gradient element once. The SQNORM node at index isq is reused
 * for the first range; the rest and the all_reduce are returned in
 * `after`, in order, for the caller to place after it. */
static int weighted_norm(Graph *g, int isq, const int *ranges, const float *weight, int n,
			 unsigned axes, Node **after)
{
	Node *sq = g->nodes[isq];
	int k = 0;
	for (int i = 0; i < n; i++) {
		Node *nd = sq;
		if (i > 0) {
			nd = ir_node(g, DPK_SQNORM, sq->out, 1, &ranges[i], PH_OPT, (Loc){0});
			nd->progs = IR_IN_STEP;
			nd->flags = DP_IF_LAST;
			nd->ia[2] = 1; /* accumulate */
			after[k++] = nd;
		}
		nd->in[0] = ranges[i];
		nd->fa[0] = weight[i];
	}
	after[k++] = comm_node(g, DPK_ALL_REDUCE, sq->out, 0, NULL, axes, DP_IF_LAST, IR_IN_STEP, -1);
	return k;
}

/* The weight of a gradient range over tp: 1 when split over tp (each tp
 * rank holds a different part), 1/tp when replicated. */
static float tp_weight(const Graph *g, const Value *range)
{
	return range->place[DP_AXIS_TP].kind == DP_PL_SHARD ? 1.0f
							     : (float)(1.0 / g->cfg.mesh[DP_AXIS_TP]);
}

/* Does node n write memory overlapping value v? */
static int writes(const Graph *g, const Node *n, const Value *v)
{
	return n->out >= 0 && ir_overlaps(g, g->values[n->out], v);
}

/* Mask of the data-parallel axes: the gradient is a sum over their ranks. */
static unsigned dp_axes(void)
{
	return DP_AXIS_BIT(DP_AXIS_REPLICATE) | DP_AXIS_BIT(DP_AXIS_SHARD);
}

/* Nodes to insert after one existing node, in order. */
typedef struct {
	Node **nodes;
	int n;
} NodeList;

/* Rebuilds program order: each of the first nold nodes followed by the nodes
 * queued after it. The queued nodes were made by ir_node, so they are the
 * nodes past nold; every node must land exactly once. */
static void splice_after(Graph *g, NodeList *queued, int nold)
{
	int total = g->nnodes;
	Node **order = ir_alloc(g, (size_t)total * sizeof(Node *));
	int k = 0;
	for (int i = 0; i < nold; i++) {
		order[k++] = g->nodes[i];
		for (int j = 0; j < queued[i].n; j++)
			order[k++] = queued[i].nodes[j];
	}
	if (k != total)
		die("collectives: spliced %d of %d nodes", k, total);
	memcpy(g->nodes, order, (size_t)total * sizeof(Node *));
}

/* INIT for every buffer (never sharded, never communicated). */
static void init_buffers(Graph *g)
{
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->kind == DP_T_BUFFER)
			setup_node(g, DPK_INIT, i, 0, NULL, IR_IN_INIT);
}

/* Replicated parameters: INIT writes each one where the step reads it, and
 * EXPORT saves it from there. */
static void setup_replicated(Graph *g)
{
	init_buffers(g);
	int nv = g->nvalues;
	for (int i = 0; i < nv; i++)
		if (g->values[i]->kind == DP_T_PARAM && g->values[i]->grad >= 0)
			init_param(g, i);
	for (int i = 0; i < nv; i++)
		if (g->values[i]->kind == DP_T_PARAM && g->values[i]->grad >= 0)
			save_param(g, i);
}

/* DDP: every gradient all-reduced (summed) over dp_replicate x dp_shard. The
 * XENT seed already divides by the global batch, so the sum is the mean. */
static int ddp_run(Graph *g, Diag *d)
{
	(void)d;
	place_replicated(g);
	int nold = g->nnodes;
	NodeList *queued = ir_alloc(g, (size_t)(nold ? nold : 1) * sizeof(NodeList));
	/* Find each grad's last backward writer; grads in value-id order so that
	 * ties (one node completing two grads) are deterministic. */
	int *last = ir_alloc(g, (size_t)(g->nvalues ? g->nvalues : 1) * sizeof(int));
	int *count = ir_alloc(g, (size_t)(nold ? nold : 1) * sizeof(int));
	for (int v = 0; v < g->nvalues; v++) {
		const Value *gv = g->values[v];
		last[v] = -1;
		if (gv->kind != DP_T_GRAD || gv->param < 0)
			continue;
		for (int i = nold - 1; i >= 0; i--) {
			const Node *n = g->nodes[i];
			if (n->phase == PH_BWD && (n->progs & IR_IN_STEP) && writes(g, n, gv)) {
				last[v] = i;
				count[i]++;
				break;
			}
		}
		/* No writer: the parameter does not reach the loss; its gradient
		 * stays zero everywhere and needs no communication. */
	}
	for (int i = 0; i < nold; i++)
		if (count[i])
			queued[i].nodes = ir_alloc(g, (size_t)count[i] * sizeof(Node *));
	for (int v = 0; v < g->nvalues; v++) {
		if (last[v] < 0)
			continue;
		const Value *gv = g->values[v];
		const Value *p = g->values[gv->param];
		Node *ar = ir_node(g, DPK_ALL_REDUCE, v, 0, NULL, PH_COMM, p->loc);
		ar->ia[0] = dp_axes();
		ar->stream = DP_STREAM_COMM;
		ar->flags = DP_IF_LAST;
		ar->progs = IR_IN_STEP;
		ar->block = p->block;
		NodeList *q = &queued[last[v]];
		q->nodes[q->n++] = ar;
	}
	if (g->cfg.mesh[DP_AXIS_TP] > 1) {
		/* the norm over the (all_reduced) gradients, one range per param */
		int isq = -1;
		for (int i = 0; i < nold && isq < 0; i++)
			if (g->nodes[i]->phase == PH_OPT && g->nodes[i]->op == DPK_SQNORM)
				isq = i;
		if (isq < 0)
			die("collectives: the optimizer tail has no sqnorm");
		int *grads = ir_alloc(g, (size_t)g->nvalues * sizeof(int)), ng = 0;
		float *w = ir_alloc(g, (size_t)g->nvalues * sizeof(float));
		for (int v = 0; v < g->nvalues; v++)
			if (g->values[v]->kind == DP_T_GRAD && g->values[v]->param >= 0) {
				w[ng] = tp_weight(g, g->values[v]);
				grads[ng++] = v;
			}
		Node **after = ir_alloc(g, (size_t)(ng + 1) * sizeof(Node *));
		int na = weighted_norm(g, isq, grads, w, ng, TPBIT, after);
		queued[isq].nodes = after;
		queued[isq].n = na;
	}
	splice_after(g, queued, nold);
	setup_replicated(g);
	return 0;
}

/* ==== sharded strategies: zero1, zero2, full_shard, hybrid_shard, and
 * ddp blocks among them ==== */

/*
 * Units. Parameters are sharded in units: a unit's parameters are
 * contiguous in the full (unsharded) space, the unit is padded to a
 * multiple of S = dp_shard ranks (FSDP's flat-parameter padding; a
 * parameter that does not divide is never rejected), and rank s holds
 * elements [s*c, (s+1)*c) of it, c = padded/S, at offset off/S of the
 * shard buffers. One unit is one collective call, so the unit IS the bucket:
 *   zero1, zero2, ddp    units are buckets of gradients in backward order,
 *                        greedy up to bucket_mb (as ddp's buckets), never
 *                        mixing strategies;
 *   full_shard, hybrid   units are blocks (the unit the user gathers and
 *                        frees together), ordered by backward completion.
 * Each unit follows the strategy of its parameters' block (a block's own
 * `strategy`, else train's). A ddp unit (a ddp block in a graph where others
 * shard) is not padded or cut: this rank holds and updates all of it, in the
 * same buffers as the shards, so one optimizer tail updates both.
 * A gradient collective over a fused range hands each rank a different slice
 * than per-parameter collectives would, which is why the layout and the
 * bucketing are decided together, here, and the bucket pass leaves sharded
 * graphs alone.
 */
typedef struct {
	const char *name;  /* block name, or "bucketK" */
	int block;         /* block index, -1 when it spans blocks */
	int *params;       /* parameter ids, layout order */
	int nparams;
	int strat;         /* DpStrategy of its parameters' block */
	int sharded;       /* cut over dp_shard (every strategy but ddp) */
	int full;          /* params stored sharded and gathered (full_shard, hybrid) */
	int full_grads;    /* full gradients persistent (zero1, zero2, full_shard with
	                      accumulate_grads unsharded); otherwise they are
	                      reduce_scattered every micro-batch into a temporary
	                      ".rs" and accumulated into the shard one unit later,
	                      also when grad_accum is 1: the accumulate is where the
	                      step waits for that reduce_scatter, which frees the
	                      unit's unsharded gradients while the next unit computes.
	                      ddp units accumulate in place in the shared buffers */
	int reshard;       /* full: gathered again for the backward */
	int64_t elems, padded, chunk; /* chunk = padded / (sharded ? S : 1) */
	int64_t loff;      /* element offset of this rank's part (shard buffers, opt.*) */
	int64_t foff, goff; /* element offsets in the full flat.params / flat.grads, -1 none */
	int last;          /* node index of the last backward writer of its grads, -1 none */
	int first;         /* node index of the first backward writer, -1 none */
	int gather, gather_bwd; /* full_shard: gathered roots (forward, backward) */
	int full_p, full_g;     /* views/roots of the unit's full params and grads */
	int shard_p, shard_g;   /* views of the shard buffers */
	int rs;                 /* reduce_scatter output when it is accumulated, or -1 */
	int tp;                 /* its params are split over tp (tp > 1): a unit never mixes
	                           split and replicated params, so the gradient norm can
	                           weight its shard as a whole (weighted_norm) */
} Unit;

typedef struct {
	Graph *g;
	int S, R;          /* dp_shard, dp_replicate sizes */
	int64_t ftot, gtot; /* elements of the full flat.params / flat.grads (0: none) */
	Unit *u;
	int nu;
	int nold;
	NodeList *before, *after; /* nodes queued around the original nodes */
	int *last;         /* per value: index of the last backward writer of a grad */
	int *first;        /* per value: index of the first backward writer of a grad */
	int *unit_of;      /* per value: the unit of a parameter, else -1 (set by layout) */
} Sh;

static unsigned axis_bit(DpAxis a)
{
	return DP_AXIS_BIT(a);
}

static void queue(Sh *sh, NodeList *l, int at, Node *n)
{
	NodeList *q = &l[at];
	Node **grown = ir_alloc(sh->g, (size_t)(q->n + 1) * sizeof(Node *));
	if (q->n)
		memcpy(grown, q->nodes, (size_t)q->n * sizeof(Node *));
	grown[q->n++] = n;
	q->nodes = grown;
}

/* Program order: for each original node, the nodes queued before it, the
 * node, the nodes queued after it. The queued nodes were made by ir_node
 * (they are the nodes past nold); every node must land exactly once. */
static void splice(Graph *g, NodeList *before, NodeList *after, int nold)
{
	int total = g->nnodes;
	Node **order = ir_alloc(g, (size_t)(total ? total : 1) * sizeof(Node *));
	int k = 0;
	for (int i = 0; i < nold; i++) {
		for (int j = 0; j < before[i].n; j++)
			order[k++] = before[i].nodes[j];
		order[k++] = g->nodes[i];
		for (int j = 0; j < after[i].n; j++)
			order[k++] = after[i].nodes[j];
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
	int *m = ir_alloc(g, (size_t)nmembers * sizeof(int));
	memcpy(m, members, (size_t)nmembers * sizeof(int));
	Bucket b = {
		.op = n->op,
		.axes = (unsigned)n->ia[0],
		.view = view,
		.elems = ir_numel(g->values[view]),
		.nmembers = nmembers,
		.members = m,
	};
	n->bucket = ir_add_bucket(g, &b);
}

static Value *flat1(Graph *g, const char *name, int64_t n, DpTensorKind kind)
{
	return ir_value(g, name, DP_F32, 1, (int64_t[]){n}, kind, (Loc){0});
}

/* A 1-D view of `of` at element offset off. */
static int view1(Graph *g, const char *name, int of, int64_t off, int64_t n, DpTensorKind kind,
		 int block)
{
	Value *v = flat1(g, name, n, kind);
	v->view_of = of;
	v->view_offset = off;
	v->block = block;
	return v->id;
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

/* Backward writers of every gradient: last[] and first[] per value. */
static void find_writers(Sh *sh)
{
	Graph *g = sh->g;
	int nv = g->nvalues;
	sh->last = ir_alloc(g, (size_t)nv * sizeof(int));
	sh->first = ir_alloc(g, (size_t)nv * sizeof(int));
	for (int v = 0; v < nv; v++) {
		const Value *gv = g->values[v];
		sh->last[v] = sh->first[v] = -1;
		if (gv->kind != DP_T_GRAD || gv->param < 0)
			continue;
		for (int i = 0; i < sh->nold; i++) {
			const Node *n = g->nodes[i];
			if (n->phase == PH_BWD && (n->progs & IR_IN_STEP) && writes(g, n, gv)) {
				if (sh->first[v] < 0)
					sh->first[v] = i;
				sh->last[v] = i;
			}
		}
	}
}

/* Parameters in backward completion order (last writer; none last, by id). */
static int *params_by_completion(Sh *sh, int *np)
{
	Graph *g = sh->g;
	int *ps = ir_alloc(g, (size_t)g->nvalues * sizeof(int));
	int n = 0;
	for (int v = 0; v < g->nvalues; v++)
		if (g->values[v]->kind == DP_T_PARAM && g->values[v]->grad >= 0)
			ps[n++] = v;
	/* insertion sort: stable, small n */
	for (int i = 1; i < n; i++) {
		int p = ps[i], j = i;
		int kp = sh->last[g->values[p]->grad];
		kp = kp < 0 ? INT32_MAX : kp;
		while (j > 0) {
			int kq = sh->last[g->values[ps[j - 1]]->grad];
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

static void unit_add(Sh *sh, Unit *u, int p)
{
	Graph *g = sh->g;
	int *grown = ir_alloc(g, (size_t)(u->nparams + 1) * sizeof(int));
	if (u->nparams)
		memcpy(grown, u->params, (size_t)u->nparams * sizeof(int));
	grown[u->nparams++] = p;
	u->params = grown;
	u->elems += ir_numel(g->values[p]);
	int gr = g->values[p]->grad;
	if (sh->last[gr] > u->last)
		u->last = sh->last[gr];
	if (sh->first[gr] >= 0 && (u->first < 0 || sh->first[gr] < u->first))
		u->first = sh->first[gr];
}

static int is_full(int strat)
{
	return strat == DP_STRAT_FULL_SHARD || strat == DP_STRAT_HYBRID_SHARD;
}

static Unit *new_unit(Sh *sh, const char *name, int block, int tp, int strat)
{
	Graph *g = sh->g;
	Unit *u = &sh->u[sh->nu++];
	memset(u, 0, sizeof *u);
	u->name = tp ? ir_fmt(g, "%s.tp", name) : name;
	u->block = block;
	u->tp = tp;
	u->strat = strat;
	u->sharded = strat != DP_STRAT_DDP;
	u->full = is_full(strat);
	u->full_grads = !u->full || g->accum_unsharded;
	int own = block >= 0 ? g->blocks[block].reshard : -1;
	u->reshard = u->full && (own >= 0 ? own : g->reshard_after_forward);
	u->last = u->first = -1;
	u->gather = u->gather_bwd = u->full_p = u->full_g = u->shard_p = u->shard_g = u->rs = -1;
	return u;
}

/* Units: blocks (full_shard, hybrid_shard) or buckets up to bucket_mb
 * (zero1, zero2, ddp), in the order their last gradient completes (units
 * whose gradients nothing writes go last). */
static void make_units(Sh *sh)
{
	Graph *g = sh->g;
	int np;
	int *ps = params_by_completion(sh, &np);
	sh->u = ir_alloc(g, (size_t)(np ? np : 1) * sizeof(Unit));
	int64_t limit = (int64_t)((double)g->bucket_mb * 1024.0 * 1024.0);
	Unit *bk = NULL; /* the open bucket */
	for (int i = 0; i < np; i++) {
		const Value *p = g->values[ps[i]];
		int tp = tp_dim(g, p) >= 0, strat = ir_block_strategy(g, p->block);
		if (is_full(strat)) {
			/* one unit per block (and per tp split) */
			bk = NULL;
			Unit *u = NULL;
			for (int k = 0; k < sh->nu && !u; k++)
				if (sh->u[k].full && sh->u[k].block == p->block && sh->u[k].tp == tp)
					u = &sh->u[k];
			if (!u)
				u = new_unit(sh, p->block >= 0 ? g->blocks[p->block].name : "model",
					     p->block, tp, strat);
			unit_add(sh, u, ps[i]);
			continue;
		}
		int has_writer = sh->last[p->grad] >= 0;
		int64_t bytes = (bk ? bk->elems : 0) + ir_numel(p);
		bytes *= (int64_t)ir_dtype_size(p->dtype);
		/* a new bucket when full, and one of its own for the grads that
		 * nothing writes (they need no collective), when the params switch
		 * between split over tp and replicated, or the strategy changes */
		if (!bk || (bk->nparams && bytes > limit) || (has_writer != (bk->last >= 0)) ||
		    tp != bk->tp || strat != bk->strat)
			bk = new_unit(sh, ir_fmt(g, "bucket%d", sh->nu), p->block, tp, strat);
		if (bk->block != p->block)
			bk->block = -1;
		unit_add(sh, bk, ps[i]);
	}
	/* block units were created at their first (earliest completing) param;
	 * order all units by their last completion (stable: buckets already are) */
	for (int i = 1; i < sh->nu; i++) {
		Unit t = sh->u[i];
		int kt = t.last < 0 ? INT32_MAX : t.last, j = i;
		while (j > 0 && (sh->u[j - 1].last < 0 ? INT32_MAX : sh->u[j - 1].last) > kt) {
			sh->u[j] = sh->u[j - 1];
			j--;
		}
		sh->u[j] = t;
	}
}

/* Element offsets and the values every unit needs.
 *
 * Buffers: "flat.params.shard" and "flat.grads.shard" (and opt.*) hold, per
 * unit, what this rank updates: its chunk of a sharded unit, the whole of a
 * ddp unit. "flat.params" holds the full params of the zero1/zero2 units
 * and "flat.grads" the full grads of the sharded units that keep them;
 * when no unit needs one, that value becomes the shard buffer instead
 * (keeping its id), so the graph never holds an empty buffer. */
static void layout(Sh *sh, int fp, int fg)
{
	Graph *g = sh->g;
	int64_t ltot = 0;
	sh->ftot = sh->gtot = 0;
	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		int parts = u->sharded ? sh->S : 1;
		u->chunk = (u->elems + parts - 1) / parts;
		u->padded = u->chunk * parts;
		u->loff = ltot;
		ltot += u->chunk;
		u->foff = u->goff = -1;
		if (u->sharded && !u->full) {
			u->foff = sh->ftot;
			sh->ftot += u->padded;
		}
		if (u->sharded && u->full_grads) {
			u->goff = sh->gtot;
			sh->gtot += u->padded;
		}
	}
	unsigned dp = dp_axes();

	Value *vfp = g->values[fp], *vfg = g->values[fg];
	int sp, sg;
	if (sh->ftot) {
		vfp->dims[0] = sh->ftot;
		Value *v = flat1(g, "flat.params.shard", ltot, DP_T_FLAT);
		place_shard(v);
		sp = v->id;
	} else {
		vfp->name = "flat.params.shard";
		vfp->dims[0] = ltot;
		place_shard(vfp);
		sp = fp;
	}
	if (sh->gtot) {
		vfg->dims[0] = sh->gtot;
		place_partial(vfg, dp);
		Value *v = flat1(g, "flat.grads.shard", ltot, DP_T_FLAT);
		place_shard(v);
		sg = v->id;
	} else {
		vfg->name = "flat.grads.shard";
		vfg->dims[0] = ltot;
		place_shard(vfg);
		sg = fg;
	}
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->kind == DP_T_OPTSTATE) {
			g->values[i]->dims[0] = ltot;
			place_shard(g->values[i]);
		}

	int nv = g->nvalues; /* the values below are views and temporaries, not params */
	sh->unit_of = ir_alloc(g, (size_t)nv * sizeof(int));
	for (int v = 0; v < nv; v++)
		sh->unit_of[v] = -1;
	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		if (u->sharded) {
			u->shard_p = view1(g, ir_fmt(g, "%s.shard", u->name), sp, u->loff, u->chunk,
					   DP_T_PARAM, u->block);
			u->shard_g = view1(g, ir_fmt(g, "%s.grad.shard", u->name), sg, u->loff,
					   u->chunk, DP_T_GRAD, u->block);
			place_shard(g->values[u->shard_p]);
			place_shard(g->values[u->shard_g]);
		} else {
			/* ddp: the whole unit, params and grads, in the shared buffers */
			u->shard_p = u->full_p = view1(g, ir_fmt(g, "%s.params", u->name), sp, u->loff,
						       u->chunk, DP_T_PARAM, u->block);
			u->shard_g = u->full_g = view1(g, ir_fmt(g, "%s.grads", u->name), sg, u->loff,
						       u->chunk, DP_T_GRAD, u->block);
		}
		if (u->tp) /* different values on every tp rank */
			g->values[u->shard_p]->place[DP_AXIS_TP] =
				g->values[u->shard_g]->place[DP_AXIS_TP] = (Place){DP_PL_SHARD, 0};
		if (u->full) {
			u->gather = flat1(g, ir_fmt(g, "%s.gather", u->name), u->padded, DP_T_ACT)->id;
			g->values[u->gather]->block = u->block;
			u->full_p = u->gather;
		} else if (u->sharded) {
			u->full_p = view1(g, ir_fmt(g, "%s.params", u->name), fp, u->foff, u->padded,
					  DP_T_PARAM, u->block);
		}
		if (u->goff >= 0) {
			u->full_g = view1(g, ir_fmt(g, "%s.grads", u->name), fg, u->goff, u->padded,
					  DP_T_GRAD, u->block);
		} else if (u->sharded) {
			u->full_g = flat1(g, ir_fmt(g, "%s.grads", u->name), u->padded, DP_T_ACT)->id;
			g->values[u->full_g]->block = u->block;
		}
		place_partial(g->values[u->full_g], dp);
		if (u->sharded && !u->full_grads) {
			u->rs = flat1(g, ir_fmt(g, "%s.rs", u->name), u->chunk, DP_T_ACT)->id;
			g->values[u->rs]->block = u->block;
			place_shard(g->values[u->rs]);
		}
		/* params and grads: views of the unit's full buffers */
		int64_t o = 0;
		for (int i = 0; i < u->nparams; i++) {
			Value *p = g->values[u->params[i]];
			sh->unit_of[p->id] = k;
			Value *gr = g->values[p->grad];
			p->view_of = u->full_p;
			p->view_offset = o;
			gr->view_of = u->full_g;
			gr->view_offset = o;
			place_partial(gr, dp);
			o += ir_numel(p);
		}
	}
}

/* full_shard: the forward all_gather of each full unit before the first
 * forward node that reads its parameters; with reshard_after_forward (the
 * block's, else train's) a second
 * gathered buffer for the backward (its nodes read "p.bwd" views of it) and
 * its all_gather before the first backward node reading them. */
static void gathers(Sh *sh)
{
	Graph *g = sh->g;
	int *fwd_at = ir_alloc(g, (size_t)sh->nu * sizeof(int));
	int *bwd_at = ir_alloc(g, (size_t)sh->nu * sizeof(int));
	int *bwd_view = ir_alloc(g, (size_t)g->nvalues * sizeof(int));
	for (int v = 0; v < g->nvalues; v++)
		bwd_view[v] = -1;
	for (int k = 0; k < sh->nu; k++)
		fwd_at[k] = bwd_at[k] = -1;
	/* where each full unit's parameters are first read, forward and backward */
	for (int i = 0; i < sh->nold; i++) {
		const Node *n = g->nodes[i];
		for (int j = 0; j < n->nin; j++) {
			int v = n->in[j];
			if (v < 0 || g->values[v]->kind != DP_T_PARAM || g->values[v]->grad < 0)
				continue;
			int k = sh->unit_of[v];
			if (k < 0 || !sh->u[k].full)
				continue;
			int *at = n->phase == PH_BWD ? &bwd_at[k] : &fwd_at[k];
			if (*at < 0)
				*at = i;
		}
	}
	/* resharding: a second gathered buffer for the units the backward
	 * reads (a first layer whose input needs no gradient is not re-gathered) */
	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		if (!u->reshard || bwd_at[k] < 0)
			continue;
		u->gather_bwd = flat1(g, ir_fmt(g, "%s.gather.bwd", u->name), u->padded, DP_T_ACT)->id;
		g->values[u->gather_bwd]->block = u->block;
		for (int i = 0; i < u->nparams; i++) {
			const Value *p = g->values[u->params[i]];
			Value *b = ir_value(g, ir_fmt(g, "%s.bwd", p->name), p->dtype, p->ndim, p->dims,
					    DP_T_PARAM, p->loc);
			b->block = p->block;
			b->view_of = u->gather_bwd;
			b->view_offset = p->view_offset;
			bwd_view[p->id] = b->id;
		}
	}
	for (int i = 0; i < sh->nold; i++) {
		Node *n = g->nodes[i];
		if (n->phase != PH_BWD)
			continue;
		for (int j = 0; j < n->nin; j++)
			if (n->in[j] >= 0 && bwd_view[n->in[j]] >= 0)
				n->in[j] = bwd_view[n->in[j]];
	}
	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		unsigned ax = axis_bit(DP_AXIS_SHARD);
		if (fwd_at[k] >= 0) {
			Node *ag = comm_node(g, DPK_ALL_GATHER, u->gather, 1, &u->shard_p, ax, 0,
					     IR_IN_STEP | IR_IN_EVAL, u->block);
			unit_bucket(g, ag, u->gather, u->params, u->nparams);
			queue(sh, sh->before, fwd_at[k], ag);
		}
		if (u->gather_bwd >= 0) {
			Node *ag = comm_node(g, DPK_ALL_GATHER, u->gather_bwd, 1, &u->shard_p, ax, 0,
					     IR_IN_STEP, u->block);
			int *mem = ir_alloc(g, (size_t)u->nparams * sizeof(int));
			for (int i = 0; i < u->nparams; i++)
				mem[i] = bwd_view[u->params[i]];
			unit_bucket(g, ag, u->gather_bwd, mem, u->nparams);
			queue(sh, sh->before, bwd_at[k], ag);
		}
	}
}

/* Index of the first node of phase ph at or after `from` (nold if none). */
static int first_of_phase(const Sh *sh, Phase ph)
{
	for (int i = 0; i < sh->nold; i++)
		if (sh->g->nodes[i]->phase == ph)
			return i;
	return sh->nold;
}

static int find_opt(const Sh *sh, IrOp op)
{
	for (int i = 0; i < sh->nold; i++)
		if (sh->g->nodes[i]->phase == PH_OPT && sh->g->nodes[i]->op == op)
			return i;
	return -1;
}

/* Gradient reduction per unit and the optimizer on the shards. */
static void reduce_and_update(Sh *sh, int fg, int sp, int sg)
{
	Graph *g = sh->g;
	unsigned shard = axis_bit(DP_AXIS_SHARD), repl = axis_bit(DP_AXIS_REPLICATE);
	int opt0 = first_of_phase(sh, PH_OPT);
	int isq = find_opt(sh, DPK_SQNORM), iclip = find_opt(sh, DPK_CLIP);
	int iupd = find_opt(sh, DPK_ADAMW) >= 0 ? find_opt(sh, DPK_ADAMW) : find_opt(sh, DPK_SGD);
	int ifill = find_opt(sh, DPK_FILL);
	if (opt0 >= sh->nold || isq < 0 || iupd < 0 || ifill < 0)
		die("collectives: the optimizer tail is missing");

	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		int *grads = ir_alloc(g, (size_t)u->nparams * sizeof(int));
		for (int i = 0; i < u->nparams; i++)
			grads[i] = g->values[u->params[i]]->grad;
		if (u->last < 0)
			continue; /* nothing writes these grads: they stay zero */
		if (!u->sharded) {
			/* ddp: the bucket all_reduced in place once per step */
			Node *ar = comm_node(g, DPK_ALL_REDUCE, u->full_g, 0, NULL, dp_axes(),
					     DP_IF_LAST, IR_IN_STEP, u->block);
			unit_bucket(g, ar, u->full_g, grads, u->nparams);
			queue(sh, sh->after, u->last, ar);
			continue;
		}
		if (!u->full_grads) {
			/* the unit's full grads are a temporary of this micro-batch */
			Node *f = step_node(g, DPK_FILL, u->full_g, 0, NULL, PH_BWD, 0, u->block);
			queue(sh, sh->before, u->first, f);
		}
		if (u->strat == DP_STRAT_ZERO1) {
			Node *ar = comm_node(g, DPK_ALL_REDUCE, u->full_g, 0, NULL, dp_axes(),
					     DP_IF_LAST, IR_IN_STEP, u->block);
			unit_bucket(g, ar, u->full_g, grads, u->nparams);
			queue(sh, sh->after, u->last, ar);
			Node *s = step_node(g, DPK_SHARD, u->shard_g, 1, &u->full_g, PH_OPT,
					    DP_IF_LAST, u->block);
			s->ia[0] = shard;
			queue(sh, sh->before, isq, s);
			continue;
		}
		/* reduce_scatter: once per step when full grads accumulate, else
		 * every micro-batch into .rs */
		unsigned flags = u->full_grads ? DP_IF_LAST : 0;
		int out = u->full_grads ? u->shard_g : u->rs;
		Node *rs = comm_node(g, DPK_REDUCE_SCATTER, out, 1, &u->full_g, shard, flags,
				     IR_IN_STEP, u->block);
		unit_bucket(g, rs, u->full_g, grads, u->nparams);
		queue(sh, sh->after, u->last, rs);
		/* hybrid_shard always reduces its shards over dp_replicate (a group
		 * of one on a 1-D mesh); zero2 and full_shard do when R > 1 */
		Node *ar = NULL;
		if (u->strat == DP_STRAT_HYBRID_SHARD || sh->R > 1) {
			ar = comm_node(g, DPK_ALL_REDUCE, u->shard_g, 0, NULL, repl, DP_IF_LAST,
				       IR_IN_STEP, u->block);
			unit_bucket(g, ar, u->shard_g, &u->shard_g, 1);
		}
		if (!u->full_grads) {
			/* accumulated where the next unit starts its backward (the end
			 * of the backward for the last unit): the reduce_scatter
			 * overlaps one unit of compute, and its input dies there */
			int at = opt0;
			for (int j = k + 1; j < sh->nu; j++)
				if (sh->u[j].first > u->last) { /* a tied weight's unit starts early */
					at = sh->u[j].first;
					break;
				}
			Node *acc = step_node(g, DPK_ACCUM, u->shard_g, 1, &u->rs, PH_BWD, 0, u->block);
			queue(sh, sh->before, at, acc);
			if (ar)
				queue(sh, sh->before, at, ar);
		} else if (ar) {
			queue(sh, sh->after, u->last, ar);
		}
	}

	/* the optimizer tail on the shards: the norm over the shard group; per
	 * unit and weighted when some gradients are replicated over the group
	 * (ddp units over dp_shard, with tp the unsplit ones over tp) */
	Node *nsq = g->nodes[isq];
	nsq->in[0] = sg;
	/* mixed: ddp units among sharded ones (the norm weights them);
	 * acc_shard: units accumulating into the shard buffer (zeroed per step) */
	int T = (int)g->cfg.mesh[DP_AXIS_TP], mixed = 0, acc_shard = 0;
	for (int k = 0; k < sh->nu; k++) {
		mixed |= !sh->u[k].sharded;
		acc_shard |= !sh->u[k].sharded || !sh->u[k].full_grads;
	}
	if (T > 1 || mixed) {
		int *ranges = ir_alloc(g, (size_t)sh->nu * sizeof(int));
		float *w = ir_alloc(g, (size_t)sh->nu * sizeof(float));
		for (int k = 0; k < sh->nu; k++) {
			const Unit *u = &sh->u[k];
			ranges[k] = u->shard_g;
			w[k] = (u->sharded ? 1.0f : (float)(1.0 / sh->S)) *
			       (T > 1 ? tp_weight(g, g->values[u->shard_g]) : 1.0f);
		}
		Node **after = ir_alloc(g, (size_t)(sh->nu + 1) * sizeof(Node *));
		int na = weighted_norm(g, isq, ranges, w, sh->nu, shard | (T > 1 ? TPBIT : 0), after);
		for (int i = 0; i < na; i++)
			queue(sh, sh->after, isq, after[i]);
	} else {
		Node *arn = comm_node(g, DPK_ALL_REDUCE, nsq->out, 0, NULL, shard, DP_IF_LAST,
				      IR_IN_STEP, -1);
		queue(sh, sh->after, isq, arn);
	}
	if (iclip >= 0)
		g->nodes[iclip]->out = sg;
	Node *upd = g->nodes[iupd];
	upd->out = sp;
	upd->in[0] = sg;
	/* zero1/zero2: the updated shards gathered back into the full params */
	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		if (!u->sharded || u->full)
			continue;
		Node *ag = comm_node(g, DPK_ALL_GATHER, u->full_p, 1, &u->shard_p, shard, DP_IF_LAST,
				     IR_IN_STEP, u->block);
		unit_bucket(g, ag, u->full_p, u->params, u->nparams);
		queue(sh, sh->after, iupd, ag);
	}
	/* zeroing: the full grads where they accumulate, and the shard buffer
	 * where micro-batches are accumulated into it (ddp units, and the
	 * reduce_scatters of full_shard units) */
	g->nodes[ifill]->out = sh->gtot ? fg : sg;
	if (sh->gtot && acc_shard) {
		Node *f = step_node(g, DPK_FILL, sg, 0, NULL, PH_OPT, DP_IF_LAST, -1);
		f->fa[0] = 0;
		queue(sh, sh->after, ifill, f);
	}
}

/* INIT and EXPORT programs of the sharded strategies. */
static void setup_sharded(Sh *sh)
{
	Graph *g = sh->g;
	init_buffers(g);
	unsigned shard = axis_bit(DP_AXIS_SHARD);
	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		if (u->full && u->padded > u->elems)
			setup_node(g, DPK_FILL, u->full_p, 0, NULL, IR_IN_INIT)->fa[0] = 0;
		for (int i = 0; i < u->nparams; i++)
			init_param(g, u->params[i]);
		if (u->sharded)
			setup_node(g, DPK_SHARD, u->shard_p, 1, &u->full_p, IR_IN_INIT)->ia[0] = shard;
	}
	for (int k = 0; k < sh->nu; k++) {
		Unit *u = &sh->u[k];
		if (u->full)
			comm_node(g, DPK_ALL_GATHER, u->full_p, 1, &u->shard_p, shard, 0, IR_IN_EXPORT,
				  u->block);
		for (int i = 0; i < u->nparams; i++)
			save_param(g, u->params[i]);
	}
}

static int sharded_run(Graph *g, Diag *d)
{
	Sh sh = {.g = g};
	sh.S = (int)g->cfg.mesh[DP_AXIS_SHARD];
	sh.R = (int)g->cfg.mesh[DP_AXIS_REPLICATE];
	place_replicated(g);
	int fp = -1, fg = -1;
	for (int i = 0; i < g->nvalues; i++) {
		if (g->values[i]->kind != DP_T_FLAT)
			continue;
		if (strcmp(g->values[i]->name, "flat.params") == 0)
			fp = i;
		else if (strcmp(g->values[i]->name, "flat.grads") == 0)
			fg = i;
	}
	if (fp < 0 || fg < 0)
		die("collectives: flat.params / flat.grads missing (optimizer pass not run?)");
	sh.nold = g->nnodes;
	sh.before = ir_alloc(g, (size_t)(sh.nold ? sh.nold : 1) * sizeof(NodeList));
	sh.after = ir_alloc(g, (size_t)(sh.nold ? sh.nold : 1) * sizeof(NodeList));
	find_writers(&sh);
	make_units(&sh);
	/* the front end reports a strategy that does not suit the mesh at the
	 * setting; hand-written IR meets it here */
	for (int k = 0; k < sh.nu; k++) {
		const Unit *u = &sh.u[k];
		char why[160];
		if (ir_strategy_fits(g, u->strat, why, sizeof why))
			continue;
		int own = u->block >= 0 && g->blocks[u->block].strategy >= 0;
		error_at(d, own ? g->blocks[u->block].strategy_loc : (Loc){g->file, 0, 0}, "%s", why);
		return -1;
	}
	layout(&sh, fp, fg);
	int sp = g->values[sh.u[0].shard_p]->view_of, sg = g->values[sh.u[0].shard_g]->view_of;
	gathers(&sh);
	reduce_and_update(&sh, fg, sp, sg);
	splice(g, sh.before, sh.after, sh.nold);
	setup_sharded(&sh);
	return 0;
}

/* The strategy of each block decides: when every parameter follows ddp, the
 * per-gradient all_reduces (fused later by the bucket pass); otherwise the
 * units above, each by its own strategy. */
int shard_run(Graph *g, Diag *d)
{
	if (g->cfg.strategy >= DP_NSTRAT)
		die("collectives: strategy %u out of range", g->cfg.strategy);
	return ir_any_sharded(g) ? sharded_run(g, d) : ddp_run(g, d);
}
