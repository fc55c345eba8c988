/*
 * schedule.c - streams, events and collective placement (pass "schedule").
 *
 * Before: the bucket form: compute nodes in a topological program order;
 * collectives on the comm stream (DP_STREAM_COMM) somewhere after the nodes
 * that produce their inputs; no events.
 *
 * After:
 * - Compute nodes keep their relative order (it is already topological and
 *   is the forward/backward order the user reads). Each collective is moved
 *   as early as its dependencies allow: right after the last earlier compute
 *   node that conflicts with it (in a program both run in), and not before
 *   an earlier collective it conflicts with. Non-conflicting collectives may
 *   pass each other; the order is fixed here, so every rank issues the same
 *   collectives in the same order on the serial comm stream.
 * - Pipeline sends and receives (passes/p2p.c) stay where they are, after
 *   the compute node before them: their order is what keeps the stages'
 *   programs free of deadlock. They run on the p2p stream (DP_STREAM_P2P),
 *   fenced like the collectives: a start event after their producer, a
 *   done event before their first reader (or writer, for a send's
 *   buffer); a transfer and a comm-stream collective that conflict (a
 *   send of an all_reduce's result) are ordered by an event between the
 *   two streams (depends_across), so the comm stream's tp all_reduces no
 *   longer queue behind a send that waits for its receiver. A once-per-step collective (DP_IF_LAST:
 *   the gradients' all_reduce or reduce_scatter after the last
 *   micro-batch) goes after its stage's last transfer (every stage's,
 *   for one every stage runs): on the serial comm stream a transfer
 *   behind them waits for them all, and stage s's last send is the
 *   gradient stage s-1's last backward waits for, so each stage's
 *   data-parallel reduction would add to the pipeline's drain in turn
 *   (GPT-3 175B's shape at pp=8 x tp=8 x dp=16, ddp: 0.44 s a stage).
 * - Gathering all_gathers (full_shard: they fill a temporary with a block's
 *   parameters) are not hoisted to the top: each is issued `prefetch` block
 *   segments before its consumer, within its consumer's phase, and fewer
 *   when the gathered bytes in flight would pass gather_limit_mb. Its start
 *   event is recorded there, which also bounds its buffer's lifetime for the
 *   memory planner (and orders it on a GPU).
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
 * - A kernel a pass put on the comm or copy stream (passes/offload.c's D2H
 *   of a gradient shard, on the copy stream) is placed and fenced like a
 *   collective. Its completion wait precedes the first compute node that
 *   conflicts with it (a reader of the shard it copies, the sqnorm, runs
 *   beside the copy), and a collective whose result it reads is waited
 *   for no later. On the copy stream it waits for the collective's done
 *   event there (depends_across, below), right before it:
 *     reduce_scatter  comm
 *     EVENT_RECORD f  comm
 *     EVENT_WAIT f    copy
 *     D2H             copy
 *   so the next collective on the comm stream does not queue behind it.
 * - A kernel on the copy stream (DP_STREAM_COPY: offload's H2D of a
 *   unit's updated 16-bit shard, right after the unit's host update) is
 *   placed and fenced like a collective on a stream of its own: it waits
 *   on the copy stream for the event the compute stream records after the
 *   update it follows (and for the comm events of the gathers that read
 *   what it overwrites), and a node of the comm stream that conflicts
 *   with an earlier node of the copy stream (zero1/zero2's all_gather
 *   that reads the shard) is placed no earlier and waits for its done
 *   event on the comm stream, right before it:
 *     update         compute (on the host)
 *     EVENT_RECORD e compute
 *     EVENT_WAIT e   copy
 *     H2D            copy
 *     EVENT_RECORD f copy
 *     EVENT_WAIT f   comm, right before the all_gather
 *     all_gather     comm
 *   so the copy and the gather of unit i run beside the update of unit
 *   i+1. Without clipping the update is on the copy stream too
 *   (passes/offload.c's updates_beside_backward) and placed the same way:
 *   right after the last node it conflicts with (its gradient's D2H, in
 *   stream order, or the host accumulation, by its event), inside the
 *   backward; its H2D follows it in stream order.
 *   The comm stream's wait for a copy flagged DP_IF_FIRST (run in the first
 *   micro-batch only) is flagged so too.
 *   A copy-stream H2D into a temporary (offload params: a parameter's
 *   transient device copy for one reader) is issued like a gathering
 *   all_gather, `prefetch` block segments before its consumer, so
 *   its temporary does not live from the top of the program.
 * - Collectives run in the STEP program, in STEP and EVAL (full_shard's
 *   forward all_gathers) and in EXPORT; a compute node constrains a
 *   collective only when they share a program.
 *
 * Dependencies come from memory overlap (ir_overlaps), not SSA edges:
 * gradients and buckets are views of one flat buffer. A node touches its
 * ins and its out; two nodes conflict when one writes memory the other
 * touches (a node writes its out and the inputs ir_writes_in names: an
 * optimizer's state and the bf16 compute copy it writes, which the
 * all_gathers after the update read). (Whether a node also reads its out, ir_ops[op].reads_out, does not
 * change conflicts: out is written either way.)
 *
 * Waits go as late as possible so the collective overlaps the compute
 * between; records go as early as possible so the collective can start.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int is_collective(const Node *n)
{
	return dp_is_collective(n->op);
}

/* A pipeline transfer: it keeps its place (passes/p2p.c). */
static int is_p2p(const Node *n)
{
	return n->op == DP_OP_SEND || n->op == DP_OP_RECV;
}

static int is_event(const Node *n)
{
	return n->op == DP_OP_EVENT_RECORD || n->op == DP_OP_EVENT_WAIT;
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

/* Does a write memory b touches (its out, or an input it updates)? */
static int writes_into(const Graph *g, const Node *a, const Node *b)
{
	if (a->out >= 0 && touches(g, b, g->values[a->out]))
		return 1;
	for (int i = 0; i < a->nin; i++)
		if (ir_writes_in(a, i) && touches(g, b, g->values[a->in[i]]))
			return 1;
	return 0;
}

/* One writes what the other touches. */
static int conflicts(const Graph *g, const Node *a, const Node *b)
{
	return writes_into(g, a, b) || writes_into(g, b, a);
}

static Node *event(Graph *g, IrOp op, int stream, int64_t id, const Node *c)
{
	Node *e = ir_node(g, op, -1, 0, NULL, PH_COMM, c->loc);
	DP_EVENT(e) = id;
	e->stream = stream;
	e->flags = c->flags;
	e->progs = c->progs;
	e->block = c->block;
	e->stage = c->stage;
	return e;
}

/* Per collective: where it goes and where its events go, as indices into
 * the compute sequence (-1: before the first compute node). */
typedef struct {
	Node *node;
	int start; /* compute node its start event follows (dependency or prefetch floor), or -1 */
	int after; /* placed after this compute node (>= start) */
	int wait;  /* compute node its completion wait precedes; ncomp: the end */
	int64_t ev_start, ev_done;
} Coll;

/* Do a and b run in a common program? */
static int share(const Node *a, const Node *b)
{
	return (a->progs & b->progs) != 0;
}

/* Must async node c (on the comm or copy stream) wait for the earlier q
 * of the other one: they share a program and one writes what the other
 * touches (offload's H2D of a shard, on the copy stream, and the
 * all_gather of it on the comm stream)? Placement already puts c no
 * earlier than q; this is the event between the two streams. */
static int depends_across(const Graph *g, const Coll *q, const Coll *c)
{
	return q->node->stream != c->node->stream && share(q->node, c->node) &&
	       conflicts(g, q->node, c->node);
}

/* Is c a gathering all_gather: one that fills a temporary (full_shard's
 * gathered parameters), or a copy-stream H2D that fills one (offload
 * params)? Those are issued just in time, `prefetch` blocks ahead, so
 * gathered memory stays bounded; the others go as early as legal. */
static int gathering(const Graph *g, const Node *c)
{
	return (c->op == DP_OP_ALL_GATHER || (c->op == DP_OP_H2D && c->stream == DP_STREAM_COPY)) &&
	       c->out >= 0 && ir_root(g, g->values[c->out])->kind == DP_T_ACT;
}

static int64_t out_bytes(const Graph *g, const Node *c)
{
	const Value *v = g->values[c->out];
	return ir_numel(v) * (int64_t)ir_dtype_size(v->dtype);
}

/*
 * The earliest compute position (issue after comp[floor]) of gathering
 * all_gather c, whose consumer is comp[q], the first compute node after it
 * in its programs. Walking back from the consumer over compute nodes of the
 * consumer's phase and programs, the gather may pass g->prefetch block
 * segments (a segment: consecutive nodes of one block), and only while the
 * bytes gathered for the blocks it passes plus its own stay within
 * gather_limit_mb (0: no limit). prefetch 0 issues it right before its
 * consumer; the comm stream still runs it while earlier compute finishes.
 * The EXPORT program's gathers take train's export_prefetch: prefetch (as
 * above) or none (as prefetch 0).
 */
/* The bytes the gathering all_gathers fill, summed by block, phase and
 * programs (gather_floor's sums, in one pass over the collectives rather
 * than one per block boundary passed: quadratic in the collectives). */
#define GB_PHASES 8
#define GB_PROGS 32
static int64_t *gather_bytes(Graph *g, const Coll *coll, int ncoll)
{
	size_t n = ((size_t)g->nblocks + 1) * GB_PHASES * GB_PROGS;
	int64_t *sum = ir_alloc(g, n * sizeof *sum);
	memset(sum, 0, n * sizeof *sum);
	for (int k = 0; k < ncoll; k++) {
		const Node *x = coll[k].node;
		if (!gathering(g, x))
			continue;
		if (x->block < -1 || x->block >= g->nblocks || (unsigned)x->phase >= GB_PHASES ||
		    x->progs >= GB_PROGS)
			die("schedule: all_gather %d: block %d, phase %d, programs %u out of range", x->id,
			    x->block, (int)x->phase, x->progs);
		sum[((size_t)(x->block + 1) * GB_PHASES + x->phase) * GB_PROGS + x->progs] +=
			out_bytes(g, x);
	}
	return sum;
}

/* What the gathering all_gathers of block b in c's phase and a program of
 * c's fill, c's own left out. */
static int64_t block_gather_bytes(const Graph *g, const int64_t *sum, int b, const Node *c)
{
	int64_t add = 0;
	if (b < -1 || b >= g->nblocks)
		return 0;
	for (unsigned pr = 1; pr < GB_PROGS; pr++)
		if (pr & c->progs)
			add += sum[((size_t)(b + 1) * GB_PHASES + c->phase) * GB_PROGS + pr];
	return c->block == b ? add - out_bytes(g, c) : add;
}

static int gather_floor(const Graph *g, Node **comp, int q, const Node *c, const int64_t *sum)
{
	if (q <= 0)
		return -1;
	Phase ph = comp[q]->phase;
	int64_t limit = (int64_t)((double)g->gather_limit_mb * 1024.0 * 1024.0);
	int64_t bytes = out_bytes(g, c);
	int passed = 0, seg_block = comp[q]->block;
	/* train's export_prefetch none: the checkpoint's gathers one at a time */
	int ahead = c->progs == IR_IN_EXPORT && g->export_prefetch ? 0 : g->prefetch;
	int j = q - 1;
	for (; j >= 0; j--) {
		const Node *n = comp[j];
		if (!share(n, c))
			continue;
		if (n->phase != ph)
			break;
		if (n->block != seg_block) {
			/* entering the segment of block n->block */
			if (passed == ahead)
				break;
			int64_t add = block_gather_bytes(g, sum, n->block, c);
			if (limit > 0 && bytes + add > limit)
				break;
			bytes += add;
			passed++;
			seg_block = n->block;
		}
	}
	/* j is the last node not passed: issue right after it */
	return j;
}

/*
 * The compute nodes by the memory they touch: for each root value, the
 * compute positions (ascending) of the nodes reading or writing a value of
 * that root. Memory that overlaps has one root (ir_overlaps), so a compute
 * node that conflicts with or touches a collective is in the list of a
 * root of one of the collective's values: the searches below look there
 * instead of at every compute node.
 */
typedef struct {
	int *start; /* [nvalues + 1]: the list of root r is at[start[r] .. start[r + 1]) */
	int *at;
} RootIndex;

static int node_roots(const Graph *g, const Node *n, int *roots)
{
	int k = 0;
	for (int i = 0; i < n->nin; i++)
		if (n->in[i] >= 0)
			roots[k++] = ir_root(g, g->values[n->in[i]])->id;
	if (n->out >= 0)
		roots[k++] = ir_root(g, g->values[n->out])->id;
	return k;
}

static void root_index(Graph *g, Node **comp, int ncomp, RootIndex *ix)
{
	int nv = g->nvalues, roots[DP_MAX_IN + 1];
	ix->start = ir_alloc(g, ((size_t)nv + 2) * sizeof(int));
	memset(ix->start, 0, ((size_t)nv + 2) * sizeof(int));
	for (int j = 0; j < ncomp; j++) {
		int k = node_roots(g, comp[j], roots);
		for (int i = 0; i < k; i++)
			ix->start[roots[i] + 2]++;
	}
	for (int r = 0; r < nv; r++)
		ix->start[r + 2] += ix->start[r + 1];
	ix->at = ir_alloc(g, ((size_t)ix->start[nv + 1] + 1) * sizeof(int));
	for (int j = 0; j < ncomp; j++) {
		int k = node_roots(g, comp[j], roots);
		for (int i = 0; i < k; i++)
			ix->at[ix->start[roots[i] + 1]++] = j;
	}
	/* start[r + 1] is now the end of r's list, start[r] its beginning */
}

/* The last compute position before `before` in c's programs that conflicts
 * with c, or -1. */
static int last_conflict(Graph *g, Node **comp, const RootIndex *ix, const Node *c, int before)
{
	int roots[DP_MAX_IN + 1], k = node_roots(g, c, roots), best = -1;
	for (int i = 0; i < k; i++) {
		const int *lo = ix->at + ix->start[roots[i]], *hi = ix->at + ix->start[roots[i] + 1];
		while (lo < hi) { /* the first entry >= before */
			const int *mid = lo + (hi - lo) / 2;
			if (*mid < before)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (const int *p = lo - 1; p >= ix->at + ix->start[roots[i]] && *p > best; p--)
			if (share(comp[*p], c) && conflicts(g, comp[*p], c)) {
				best = *p;
				break;
			}
	}
	return best;
}

/* The first compute position after `after` in c's programs that touches
 * c's memory (a collective) or conflicts with it (a comm-stream kernel:
 * offload's D2H), or ncomp. */
static int first_toucher(Graph *g, Node **comp, int ncomp, const RootIndex *ix, const Node *c,
			 int after)
{
	int roots[DP_MAX_IN + 1], k = node_roots(g, c, roots), best = ncomp;
	for (int i = 0; i < k; i++) {
		const int *lo = ix->at + ix->start[roots[i]], *hi = ix->at + ix->start[roots[i] + 1];
		const int *end = hi;
		while (lo < hi) { /* the first entry > after */
			const int *mid = lo + (hi - lo) / 2;
			if (*mid <= after)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (const int *p = lo; p < end && *p < best; p++)
			if (share(comp[*p], c) &&
			    (is_collective(c) ? touches_node(g, comp[*p], c) : conflicts(g, comp[*p], c))) {
				best = *p;
				break;
			}
	}
	return best;
}

/*
 * For each async node c, the earlier ones of another stream it depends on
 * (depends_across), ascending: dep[dstart[c] .. dstart[c + 1]). Found
 * through the memory roots the nodes touch (a conflict needs a common
 * root), per stream, so the cost follows the pairs that share memory, not
 * every pair: at pp > 1 the p2p stream's transfers and the comm stream's
 * collectives are both many (tens of thousands at GPT-3 175B's shape),
 * where scanning every earlier node for every node was quadratic.
 */
static void cross_deps(Graph *g, const Coll *coll, int ncoll, int **dstart_out, int **dep_out)
{
	int nv = g->nvalues, roots[DP_MAX_IN + 1];
	size_t nkey = (size_t)nv * DP_NSTREAM;
	int *start = ir_alloc(g, (nkey + 2) * sizeof(int));
	memset(start, 0, (nkey + 2) * sizeof(int));
	for (int c = 0; c < ncoll; c++) {
		int k = node_roots(g, coll[c].node, roots);
		for (int i = 0; i < k; i++)
			start[(size_t)roots[i] * DP_NSTREAM + coll[c].node->stream + 2]++;
	}
	for (size_t r = 0; r < nkey; r++)
		start[r + 2] += start[r + 1];
	int *at = ir_alloc(g, ((size_t)start[nkey + 1] + 1) * sizeof(int));
	for (int c = 0; c < ncoll; c++) {
		int k = node_roots(g, coll[c].node, roots);
		for (int i = 0; i < k; i++)
			at[start[(size_t)roots[i] * DP_NSTREAM + coll[c].node->stream + 1]++] = c;
	}
	/* start[key + 1] is now the end of key's list, start[key] its beginning */
	int *seen = ir_alloc(g, ((size_t)ncoll + 1) * sizeof(int));
	for (int c = 0; c < ncoll; c++)
		seen[c] = -1;
	int *dstart = ir_alloc(g, ((size_t)ncoll + 1) * sizeof(int));
	int cap = 64, n = 0;
	int *dep = malloc((size_t)cap * sizeof(int));
	if (!dep)
		die("out of memory");
	for (int c = 0; c < ncoll; c++) {
		dstart[c] = n;
		int k = node_roots(g, coll[c].node, roots);
		for (int i = 0; i < k; i++)
			for (int st = 0; st < DP_NSTREAM; st++) {
				if (st == coll[c].node->stream)
					continue;
				size_t key = (size_t)roots[i] * DP_NSTREAM + st;
				for (int j = start[key]; j < start[key + 1] && at[j] < c; j++) {
					int q = at[j];
					if (seen[q] == c || !depends_across(g, &coll[q], &coll[c]))
						continue;
					seen[q] = c;
					if (n == cap) {
						cap *= 2;
						if (!(dep = realloc(dep, (size_t)cap * sizeof(int))))
							die("out of memory");
					}
					dep[n++] = q;
				}
			}
		/* ascending, as the scan over every earlier node found them */
		for (int a = dstart[c] + 1; a < n; a++)
			for (int b = a; b > dstart[c] && dep[b - 1] > dep[b]; b--) {
				int t = dep[b];
				dep[b] = dep[b - 1];
				dep[b - 1] = t;
			}
	}
	dstart[ncoll] = n;
	int *keep = ir_alloc(g, ((size_t)n + 1) * sizeof(int));
	memcpy(keep, dep, (size_t)n * sizeof(int));
	free(dep);
	*dstart_out = dstart;
	*dep_out = keep;
}

int sched_run(Graph *g, Diag *d)
{
	(void)d;
	int n0 = g->nnodes;
	Node **comp = ir_alloc(g, (size_t)(n0 ? n0 : 1) * sizeof(Node *));
	Coll *coll = ir_alloc(g, (size_t)(n0 ? n0 : 1) * sizeof(Coll));
	int *at = ir_alloc(g, (size_t)(n0 ? n0 : 1) * sizeof(int)); /* ncomp when seen */
	int ncomp = 0, ncoll = 0;
	for (int i = 0; i < n0; i++) {
		Node *n = g->nodes[i];
		if (is_event(n))
			die("schedule: the graph is already scheduled (event node %d)", n->id);
		if (is_collective(n) && n->stream != DP_STREAM_COMM &&
		    !(is_p2p(n) && n->stream == DP_STREAM_P2P))
			die("schedule: collective %d is not on the comm stream", n->id);
		if (n->stream != DP_STREAM_COMPUTE) {
			at[ncoll] = ncomp;
			coll[ncoll++] = (Coll){n, -1, -1, ncomp, -1, -1};
		} else {
			comp[ncomp++] = n;
		}
	}
	/* Start: after the last earlier compute node (in a common program) it
	 * conflicts with, and for gathering all_gathers not before the prefetch
	 * floor. Place: not before an earlier collective it conflicts with (the
	 * comm stream keeps their order); otherwise collectives may pass each
	 * other (a prefetched all_gather overtakes a reduce_scatter), and the
	 * order is the same on every rank because it is fixed here. */
	RootIndex ix;
	root_index(g, comp, ncomp, &ix);
	const int64_t *gsum = gather_bytes(g, coll, ncoll);
	/* pp > 1: the place of each stage's last transfer (last_p2p[pp]: of
	 * any stage's), which its once-per-step collectives follow */
	int pp = g->cfg.mesh[DP_AXIS_PP] > 1 ? (int)g->cfg.mesh[DP_AXIS_PP] : 0;
	int *last_p2p = ir_alloc(g, ((size_t)pp + 1) * sizeof(int));
	for (int s = 0; s <= pp; s++)
		last_p2p[s] = -1;
	for (int c = 0; c < ncoll && pp; c++) {
		const Node *n = coll[c].node;
		if (is_p2p(n) && (n->progs & IR_IN_STEP) && n->stage >= 0 && n->stage < pp) {
			last_p2p[n->stage] = at[c] - 1 > last_p2p[n->stage] ? at[c] - 1 : last_p2p[n->stage];
			last_p2p[pp] = at[c] - 1 > last_p2p[pp] ? at[c] - 1 : last_p2p[pp];
		}
	}
	for (int c = 0; c < ncoll; c++) {
		Node *n = coll[c].node;
		int dep = last_conflict(g, comp, &ix, n, at[c]);
		if (gathering(g, n)) {
			int q = at[c];
			while (q < ncomp && !share(comp[q], n))
				q++;
			if (q < ncomp) {
				int f = gather_floor(g, comp, q, n, gsum);
				if (f > dep)
					dep = f;
			}
		}
		int after = dep;
		if (is_p2p(n)) {
			/* where passes/p2p.c put it: a send and its recv stay adjacent in
			 * the one order the stages' programs share (no deadlock) */
			after = at[c] - 1;
		} else if (after < 0) {
			/* nothing to wait for: right before the first compute node of
			 * its programs (the same point as the top, in those programs,
			 * and where a reader looks for it) */
			int q = 0;
			while (q < ncomp && !share(comp[q], n))
				q++;
			after = q - 1;
		}
		if (pp && !is_p2p(n) && (n->flags & DP_IF_LAST) && (n->progs & IR_IN_STEP)) {
			int last = last_p2p[n->stage >= 0 && n->stage < pp ? n->stage : pp];
			after = last > after ? last : after;
		}
		/* the latest place of an earlier one it conflicts with: the cheap
		 * test first (quadratic in the collectives: at pp > 1 with cp or
		 * many micro-batches most of a compile when conflicts() ran first) */
		for (int k = 0; k < c; k++)
			if (coll[k].after > after && share(coll[k].node, n) && conflicts(g, coll[k].node, n))
				after = coll[k].after;
		coll[c].start = dep;
		coll[c].after = after;
	}
	/* Completion waits: the first compute node after the collective's place
	 * that touches its memory in a common program. */
	for (int c = 0; c < ncoll; c++) {
		Coll *k = &coll[c];
		k->wait = first_toucher(g, comp, ncomp, &ix, k->node, k->after);
	}
	/* A collective whose result a comm- or copy-stream kernel reads
	 * (offload's D2H of a reduce_scatter's result) is done when that
	 * kernel is (in stream order, or by the copy's wait for its event):
	 * compute waits for it no later, so its buffers' lifetime ends there
	 * too. */
	/* Both loops over pairs below only find something where the async
	 * nodes are not all collectives on one stream (offload's copies): skip
	 * them otherwise (quadratic in the collectives, 30 % of a compile at GPT-3
	 * 175B's shape and pp=16, for nothing) */
	int kernels = 0, streams = 0;
	for (int c = 0; c < ncoll; c++) {
		kernels |= !is_collective(coll[c].node);
		streams |= c && coll[c].node->stream != coll[0].node->stream;
	}
	for (int c = 0; c < ncoll && kernels; c++)
		for (int q = c + 1; q < ncoll; q++)
			if (!is_collective(coll[q].node) && is_collective(coll[c].node) &&
			    share(coll[c].node, coll[q].node) && conflicts(g, coll[c].node, coll[q].node) &&
			    coll[q].wait < coll[c].wait && coll[q].after >= coll[c].after)
				coll[c].wait = coll[q].wait;
	for (int c = 0; c < ncoll; c++) {
		Coll *k = &coll[c];
		if (k->start >= 0)
			k->ev_start = g->nevents++;
		k->ev_done = g->nevents++;
	}
	/* Emit. Event nodes are appended by ir_node; the final order is built in
	 * a separate array and copied back over g->nodes. Collectives placed
	 * after the same compute node go in program order. */
	int *dstart = NULL, *dep = NULL;
	if (streams)
		cross_deps(g, coll, ncoll, &dstart, &dep);
	int cap = n0 + 4 * ncoll + (streams ? dstart[ncoll] : 0);
	Node **order = ir_alloc(g, (size_t)(cap ? cap : 1) * sizeof(Node *));
	/* the collectives by their wait, start and after indices, each list in
	 * program order (linear, where scanning every collective at every
	 * compute node was quadratic) */
	int *head = ir_alloc(g, 3 * ((size_t)ncomp + 2) * sizeof(int));
	int *next = ir_alloc(g, 3 * ((size_t)ncoll + 1) * sizeof(int));
	for (int i = 0; i < 3 * (ncomp + 2); i++)
		head[i] = -1;
	for (int c = ncoll - 1; c >= 0; c--) {
		int key[3] = {coll[c].wait, coll[c].ev_start >= 0 ? coll[c].start : -2, coll[c].after};
		for (int f = 0; f < 3; f++) {
			if (key[f] < -1)
				continue;
			int *h = &head[f * (ncomp + 2) + key[f] + 1];
			next[f * ncoll + c] = *h;
			*h = c;
		}
	}
#define COLLS_AT(f, j, c) \
	for (int c = head[(f) * (ncomp + 2) + (j) + 1]; c >= 0; c = next[(f) * ncoll + c])
	int k = 0;
	for (int j = -1; j <= ncomp; j++) {
		/* before compute node j (j == ncomp: the end): completion waits */
		if (j >= 0)
			COLLS_AT(0, j, c)
				order[k++] = event(g, DP_OP_EVENT_WAIT, DP_STREAM_COMPUTE,
						   coll[c].ev_done, coll[c].node);
		if (j == ncomp)
			break;
		if (j >= 0)
			order[k++] = comp[j];
		/* after compute node j: start records, then the collectives */
		COLLS_AT(1, j, c)
			order[k++] = event(g, DP_OP_EVENT_RECORD, DP_STREAM_COMPUTE,
					   coll[c].ev_start, coll[c].node);
		COLLS_AT(2, j, c) {
			int st = coll[c].node->stream;
			if (coll[c].ev_start >= 0)
				order[k++] = event(g, DP_OP_EVENT_WAIT, st, coll[c].ev_start,
						   coll[c].node);
			/* the earlier nodes of another async stream it depends on */
			/* (a wait for a first-micro-batch copy is first-only too:
			 * later micro-batches record no event for it) */
			for (int d = streams ? dstart[c] : 0; streams && d < dstart[c + 1]; d++) {
				int q = dep[d];
				Node *w = event(g, DP_OP_EVENT_WAIT, st, coll[q].ev_done, coll[c].node);
				w->flags |= coll[q].node->flags & DP_IF_FIRST;
				order[k++] = w;
			}
			order[k++] = coll[c].node;
			order[k++] = event(g, DP_OP_EVENT_RECORD, st, coll[c].ev_done,
					   coll[c].node);
		}
	}
#undef COLLS_AT
	if (k != g->nnodes)
		die("schedule: emitted %d of %d nodes", k, g->nnodes);
	memcpy(g->nodes, order, (size_t)k * sizeof(Node *));
	return 0;
}
