/*
 * schedule.c - streams, events and collective placement (pass "schedule").
 *
 * Before: the bucket form: compute nodes in a topological program order;
 * collectives on the comm stream (DP_STREAM_COMM) somewhere after the nodes
 * that produce their inputs; no events.
 *
 * After:
 * - Compute nodes keep their relative order (it is already topological and
 *   is the forward/backward order the user reads). Collectives keep their
 *   relative order (the comm stream is serial, and every rank must issue
 *   the same collectives in the same order) and each is moved as early as
 *   its dependencies allow: right after the last earlier STEP compute node
 *   that conflicts with it, and not before the previous collective.
 * - Cross-stream edges are explicit (events numbered from 0, g->nevents):
 *     EVENT_RECORD e  compute, right after the last compute node C depends on
 *     EVENT_WAIT   e  comm, right before C
 *     C               comm
 *     EVENT_RECORD f  comm, right after C
 *     EVENT_WAIT   f  compute, right before the first later compute node that
 *                     touches (reads or writes) memory overlapping C's buffers,
 *                     or at the end of the program when none does (so no
 *                     collective is still running when the step ends)
 *   Events carry C's flags (DP_IF_LAST) and progs, phase PH_COMM, out=-1,
 *   nin=0. A collective that depends on no compute node gets no e pair.
 * - Only the STEP program has collectives; nodes that are only in the EVAL
 *   program never constrain a collective, and the EVAL program's order (the
 *   forward order) is unchanged.
 *
 * Dependencies come from memory overlap (ir_overlaps), not SSA edges:
 * gradients and buckets are views of one flat buffer. A node touches its
 * ins and its out; two nodes conflict when one writes memory the other
 * touches. (Whether a node also reads its out, ir_ops[op].reads_out, does not
 * change conflicts: out is written either way.)
 *
 * Waits go as late as possible so the collective overlaps the compute
 * between; records go as early as possible so the collective can start.
 */
#include <string.h>

#include "passes.h"

static int is_collective(const Node *n)
{
	return n->op == DPK_ALL_REDUCE || n->op == DPK_REDUCE_SCATTER || n->op == DPK_ALL_GATHER;
}

static int is_event(const Node *n)
{
	return n->op == DPK_EVENT_RECORD || n->op == DPK_EVENT_WAIT;
}

/* Does n read or write memory overlapping v? */
static int touches(const Graph *g, const Node *n, const Value *v)
{
	for (int i = 0; i < n->nin; i++)
		if (n->in[i] >= 0 && ir_overlaps(g, g->values[n->in[i]], v))
			return 1;
	return n->out >= 0 && ir_overlaps(g, g->values[n->out], v);
}

/* Does n touch any memory collective c touches? */
static int touches_node(const Graph *g, const Node *n, const Node *c)
{
	for (int i = 0; i < c->nin; i++)
		if (c->in[i] >= 0 && touches(g, n, g->values[c->in[i]]))
			return 1;
	return c->out >= 0 && touches(g, n, g->values[c->out]);
}

/* One writes what the other touches. */
static int conflicts(const Graph *g, const Node *a, const Node *b)
{
	return (a->out >= 0 && touches(g, b, g->values[a->out])) ||
	       (b->out >= 0 && touches(g, a, g->values[b->out]));
}

static Node *event(Graph *g, IrOp op, int stream, int64_t id, const Node *c)
{
	Node *e = ir_node(g, op, -1, 0, NULL, PH_COMM, c->loc);
	e->ia[0] = id;
	e->stream = stream;
	e->flags = c->flags;
	e->progs = c->progs;
	e->block = c->block;
	return e;
}

/* Per collective: where it goes and where its events go, as indices into
 * the compute sequence (-1: before the first compute node). */
typedef struct {
	Node *node;
	int dep;   /* last compute node it depends on, or -1 */
	int after; /* placed after this compute node (>= dep, >= previous) */
	int wait;  /* compute node its completion wait precedes; ncomp: the end */
	int64_t ev_start, ev_done;
} Coll;

int sched_run(Graph *g, Diag *d)
{
	(void)d;
	int n0 = g->nnodes;
	Node **comp = ir_alloc(g, (size_t)(n0 ? n0 : 1) * sizeof(Node *));
	Coll *coll = ir_alloc(g, (size_t)(n0 ? n0 : 1) * sizeof(Coll));
	int ncomp = 0, ncoll = 0;
	for (int i = 0; i < n0; i++) {
		Node *n = g->nodes[i];
		if (is_event(n))
			die("schedule: the graph is already scheduled (event node %d)", n->id);
		if (is_collective(n)) {
			if (!(n->progs & IR_IN_STEP) || (n->progs & IR_IN_EVAL))
				die("schedule: collective %d outside the step program", n->id);
			/* Compute nodes seen so far are exactly comp[0..ncomp-1]. */
			int dep = -1;
			for (int j = ncomp - 1; j >= 0; j--)
				if ((comp[j]->progs & IR_IN_STEP) && conflicts(g, comp[j], n)) {
					dep = j;
					break;
				}
			int prev = ncoll ? coll[ncoll - 1].after : -1;
			coll[ncoll++] = (Coll){n, dep, dep > prev ? dep : prev, ncomp, -1, -1};
		} else {
			comp[ncomp++] = n;
		}
	}
	/* Completion waits: the first compute node after the collective's place
	 * that touches its memory. */
	for (int c = 0; c < ncoll; c++) {
		Coll *k = &coll[c];
		k->wait = ncomp;
		for (int j = k->after + 1; j < ncomp; j++)
			if ((comp[j]->progs & IR_IN_STEP) && touches_node(g, comp[j], k->node)) {
				k->wait = j;
				break;
			}
		if (k->dep >= 0)
			k->ev_start = g->nevents++;
		k->ev_done = g->nevents++;
	}
	/* Emit. Event nodes are appended by ir_node; the final order is built in
	 * a separate array and copied back over g->nodes. */
	int cap = n0 + 4 * ncoll;
	Node **order = ir_alloc(g, (size_t)(cap ? cap : 1) * sizeof(Node *));
	int k = 0;
	for (int j = -1; j <= ncomp; j++) {
		/* before compute node j (j == ncomp: the end): completion waits */
		if (j >= 0)
			for (int c = 0; c < ncoll; c++)
				if (coll[c].wait == j)
					order[k++] = event(g, DPK_EVENT_WAIT, DP_STREAM_COMPUTE,
							   coll[c].ev_done, coll[c].node);
		if (j == ncomp)
			break;
		if (j >= 0)
			order[k++] = comp[j];
		/* after compute node j: start records, then the collectives */
		for (int c = 0; c < ncoll; c++)
			if (coll[c].dep == j && coll[c].ev_start >= 0)
				order[k++] = event(g, DPK_EVENT_RECORD, DP_STREAM_COMPUTE,
						   coll[c].ev_start, coll[c].node);
		for (int c = 0; c < ncoll; c++) {
			if (coll[c].after != j)
				continue;
			if (coll[c].ev_start >= 0)
				order[k++] = event(g, DPK_EVENT_WAIT, DP_STREAM_COMM, coll[c].ev_start,
						   coll[c].node);
			order[k++] = coll[c].node;
			order[k++] = event(g, DPK_EVENT_RECORD, DP_STREAM_COMM, coll[c].ev_done,
					   coll[c].node);
		}
	}
	if (k != g->nnodes)
		die("schedule: emitted %d of %d nodes", k, g->nnodes);
	memcpy(g->nodes, order, (size_t)k * sizeof(Node *));
	return 0;
}
