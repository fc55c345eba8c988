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
 * one rank, and --stats reports 0 bytes.
 *
 * Why after the last writer: the backward accumulates a gradient over every
 * use of its parameter; once the last contribution is in, the gradient is
 * complete for this micro-batch, and on the last micro-batch of the step it
 * is complete for the step (DP_IF_LAST), so it can be reduced while the rest
 * of the backward runs. The schedule pass adds the cross-stream events.
 *
 * Strategies are rows of one table keyed by g->strategy, so zero1/zero2/
 * full_shard/hybrid_shard and tp slot in as new functions; a strategy the
 * table names without a function is reported as not supported yet.
 */
#include <string.h>

#include "passes.h"

typedef struct {
	const char *name;
	int (*run)(Graph *g, Diag *d); /* NULL: known to the DSL, not implemented yet */
} Strategy;

/* Parameters (and everything else) replicated on every axis: the default of
 * ir_value, restated here because this pass owns placement. */
static void place_replicated(Graph *g)
{
	for (int i = 0; i < g->nvalues; i++)
		for (int a = 0; a < DP_MAX_AXES; a++)
			g->values[i]->place[a] = (Place){DP_PL_REPLICATE, -1};
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
	splice_after(g, queued, nold);
	return 0;
}

static const Strategy strategies[] = {
	{"ddp", ddp_run},
	{"zero1", NULL},
	{"zero2", NULL},
	{"full_shard", NULL},
	{"hybrid_shard", NULL},
	{"tp", NULL},
};

int shard_run(Graph *g, Diag *d)
{
	Loc loc = {g->file, 0, 0}; /* the strategy has no location of its own */
	for (size_t i = 0; i < sizeof strategies / sizeof strategies[0]; i++) {
		if (strcmp(g->strategy, strategies[i].name) != 0)
			continue;
		if (!strategies[i].run) {
			error_at(d, loc, "strategy '%s' is not supported yet (supported: ddp)",
				 g->strategy);
			return -1;
		}
		return strategies[i].run(g, d);
	}
	error_at(d, loc, "unknown strategy '%s'", g->strategy);
	return -1;
}
