/*
 * p2p.c - the pipeline stages' programs (pp > 1), pass "p2p".
 *
 * Before (after collectives): every block has its stage (passes/stages.c);
 * the step and eval programs are one micro-batch's forward and backward over
 * every block, with the data-parallel collectives.
 *
 * After, at pp = P > 1: every node of the step and eval programs' forward,
 * backward and eval work has the stage that runs it (Node.stage, printed
 * `stage=N`): its block's; a node outside every block, the stage of the
 * latest of its operands' producers (the loss and its gradient: the last
 * stage's, where the logits are), else the stage of the node before it.
 * A load runs on the stage that reads its data, when one does (the tokens
 * on the first, the labels on the last). Everything else (the optimizer, the
 * gradient collectives, events, init and export) keeps stage -1: every rank
 * runs it. So the programs stay
 * rank-agnostic: dpexec runs the instructions of its own pp coordinate and
 * those of every rank.
 *
 * A temporary that a node of stage k reads (or updates in place) while its
 * current contents are on another stage h is sent there, one neighbouring
 * stage at a time (h -> h+1 -> ... -> k, or down for a gradient), right
 * before that node: `send %v peer=h+1 tag=N stage=h` then `%v.ppH+1 = recv
 * peer=h tag=N stage=h+1`, each a pair of adjacent nodes on the p2p stream
 * (DP_STREAM_P2P), numbered (tag) in program order. The p2p stream is the
 * transfers' own, beside the comm stream of the tp, cp and data-parallel
 * collectives: a send holds its stream until its receiver reaches the
 * matching recv (an interleaved pipeline's sends wait for a whole slot),
 * and on one serial stream every tp all_reduce behind it waited too (gpt2-
 * tiny pp=2 x tp=2 interleaved: the stages idled 19.5 % of a step where the
 * schedule's forecast is 11.4 %; docs/SIMULATE.md). Megatron-LM runs its
 * pipeline's batched isend/irecv on communicators and streams of their own
 * for the same reason. The schedule pass orders the two streams by events
 * where data flows between them (passes/schedule.c). So
 * every value live across a cut goes forward (a skip connection over two
 * cuts over both), and every gradient of one back, not only the residual
 * stream's. Stage k's copy of %v is the value %v.ppK, which stage k's nodes
 * read and write instead of %v (the stage that writes %v first keeps %v).
 *
 * Because each send is followed at once by its recv in the one program
 * order that every stage's program is a part of, the neighbours post their
 * transfers in the same order and no stage waits for one that waits for it
 * (ir/verify.c checks both for any IR, hand-written ones too).
 *
 * Parameters, gradients and optimizer state are not cut here (under every
 * strategy, offload and compression too, passes/stage_params.c cuts them
 * after unroll, and drops pp from a stage's own collectives): every stage keeps
 * every parameter and runs the update over all of them, and the gradients'
 * all_reduce spans pp as well as the data-parallel axes (passes/shard.c,
 * shard_dp_axes), where the stages that do not use a parameter add zeros:
 * a parameter used on two stages (GPT-2's wte: the embedding on the first,
 * the LM head on the last) gets the sum of both stages' parts. So the
 * update, the gradient norm and the checkpoints are those of one rank. The
 * loss is computed on the last stage; dpexec sums the loss over pp with the
 * data-parallel axes (zeros elsewhere). zero2's gradients are reduce_scattered
 * over dp_shard once per step, every rank's, and the slices all_reduced over
 * pp (and dp_replicate) as hybrid_shard's over dp_replicate. A gathered
 * block's (full_shard, hybrid_shard) per-micro-batch collectives, the
 * all_gathers before its forward and backward and its gradients'
 * reduce_scatter, run on its block's stage (`stage=N`), over that stage's
 * dp_shard group (the ranks of one pp coordinate); the slices are summed
 * over pp once per step as zero2's. A gathered block whose parameter another
 * stage reads (a tied one: GPT-2's wte in a full_shard embed) is gathered by
 * that stage too (tie_gathered, below), so no gathered parameter is sent.
 *
 * Under `pipeline interleaved` the stages above are the virtual stages
 * (passes/stages.c): a node's virtual stage is Node.chunk (printed
 * `chunk=N`) and Node.stage its rank, chunk mod P. A value read on a rank
 * that does not hold its current contents travels along the virtual
 * stages from the one that wrote it, w -> w+1 -> ... -> k (down for a
 * gradient), each hop between neighbouring ranks on the ring (the last
 * virtual stage of a round, on rank P-1, sends to rank 0), starting at the
 * virtual stage nearest k whose rank holds it (a skip between two virtual
 * stages of one rank sends nothing). A send/recv carries its virtual
 * stages too, so passes/unroll.c knows the slot it belongs to.
 *
 * This is one micro-batch's program: passes/unroll.c, next, copies it per
 * micro-batch in the pipeline schedule's order.
 */
#include <stdlib.h>
#include <string.h>

#include "shard.h"

/* Is this node pipeline work: a forward, backward or eval node of the step or
 * eval program that is no load? */
static int staged_work(const Node *n)
{
	return (n->progs & (IR_IN_STEP | IR_IN_EVAL)) && n->op != DP_OP_LOAD &&
	       (n->phase == PH_FWD || n->phase == PH_BWD || n->phase == PH_EVAL);
}

/* Is this a gathered unit's per-micro-batch collective (full_shard: the
 * all_gathers before its block's forward and backward, the reduce_scatter
 * of its gradients), which runs on its block's stage, over that stage's
 * dp_shard group? */
static int staged_comm(const Graph *g, const Node *n)
{
	return (n->progs & (IR_IN_STEP | IR_IN_EVAL)) && n->phase == PH_COMM &&
	       !(n->flags & DP_IF_LAST) && dp_is_collective(n->op) && n->block >= 0 &&
	       g->blocks[n->block].stage >= 0;
}

static int is_temp(const Graph *g, int v)
{
	return v >= 0 && g->values[v]->kind == DP_T_ACT;
}

/* A block's stage in the schedule: its virtual stage under interleaved. */
static int block_vstage(const Block *bl)
{
	return bl->chunk >= 0 ? bl->chunk : bl->stage;
}

/* Node.stage (and Node.chunk under interleaved) of every node (see the top
 * of the file): found over the schedule's stages, the virtual ones under
 * interleaved, whose rank is the virtual stage mod pp. */
static void assign_stages(Graph *g, int p, int v)
{
	int *def = malloc(((size_t)g->nvalues + 1) * sizeof *def); /* a temporary's producer's stage */
	if (!def)
		die("out of memory");
	for (int x = 0; x < g->nvalues; x++)
		def[x] = -1;
	int cur = 0;
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		n->stage = n->chunk = -1;
		int at = -1;
		if (staged_comm(g, n)) {
			at = block_vstage(&g->blocks[n->block]);
			if (is_temp(g, n->out) && def[n->out] < 0)
				def[n->out] = at;
		} else if (staged_work(n)) {
			if (n->block >= 0 && g->blocks[n->block].stage >= 0) {
				cur = block_vstage(&g->blocks[n->block]);
			} else {
				int latest = -1;
				for (int k = 0; k < n->nin; k++)
					if (is_temp(g, n->in[k]) && def[n->in[k]] > latest)
						latest = def[n->in[k]];
				if (latest >= 0)
					cur = latest;
			}
			at = cur;
			if (is_temp(g, n->out) && def[n->out] < 0)
				def[n->out] = cur;
		}
		if (at < 0)
			continue;
		n->stage = at % p;
		n->chunk = v > 1 ? at : -1;
	}
	free(def);
	/* a load runs on the one stage that reads its data (the tokens on the
	 * first, the labels on the last), else on every stage */
	for (int i = 0; i < g->nnodes; i++) {
		Node *ld = g->nodes[i];
		if (ld->op != DP_OP_LOAD || ld->out < 0)
			continue;
		int stage = -2, chunk = -1; /* -2: no reader yet; chunk: the first reader's */
		for (int j = 0; j < g->nnodes && stage != -1; j++) {
			const Node *n = g->nodes[j];
			if (!(n->progs & ld->progs) || n == ld)
				continue;
			for (int k = 0; k < n->nin; k++)
				if (n->in[k] >= 0 && ir_overlaps(g, g->values[n->in[k]], g->values[ld->out])) {
					stage = stage == -2 || stage == n->stage ? n->stage : -1;
					chunk = chunk < 0 ? n->chunk : chunk;
				}
		}
		ld->stage = stage < 0 ? -1 : stage;
		ld->chunk = stage < 0 ? -1 : chunk;
	}
}

/* One transfer: before node `at`, value v from stage `from` to `to`
 * (neighbours); under interleaved from and to are virtual stages, the
 * ranks from mod p and to mod p. */
typedef struct {
	int at, v, from, to;
	unsigned progs;
} Hop;

typedef struct {
	Graph *g;
	Diag *d;
	int p, v;         /* pp, and virtual stages per rank (1 but under interleaved) */
	int *wrote;       /* interleaved: per value, the virtual stage that wrote it last */
	int *home;    /* per value: the stage that writes it first, or -1 */
	int *copies;  /* per value, p entries: stage k's copy of it (value id), or -1 */
	Hop *hops;
	int nhops, caphops;
} Cut;

static void add_hop(Cut *c, int at, int v, int from, int to, unsigned progs)
{
	for (int i = 0; i < c->nhops; i++) {
		Hop *h = &c->hops[i];
		if (h->at == at && h->v == v && h->from == from && h->to == to) {
			h->progs |= progs; /* the same transfer in the step and eval programs */
			return;
		}
	}
	if (c->nhops == c->caphops) {
		c->caphops = c->caphops ? 2 * c->caphops : 64;
		c->hops = realloc(c->hops, (size_t)c->caphops * sizeof *c->hops);
		if (!c->hops)
			die("out of memory");
	}
	c->hops[c->nhops++] = (Hop){at, v, from, to, progs};
}

/* Does node n read temporary operand slot k (k = -1: its out, when it reads it)? */
static int reads_operand(const Node *n, int k)
{
	return k >= 0 || ir_reads_out(n);
}

/* Interleaved: node `at` on virtual stage k reads v, whose current contents
 * are not on its rank. They travel along the virtual stages from the one
 * that wrote them, w (the pipeline's ring: w -> w+1 -> ... -> k, rank r to
 * r+1 mod p, the last stage of a round on rank p-1 sending to rank 0; down
 * for a gradient), from the virtual stage nearest k on that path whose rank
 * holds them. */
static void route_virtual(Cut *c, int at, int v, int k, uint64_t *fresh, unsigned prog)
{
	int w = c->wrote[v], p = c->p;
	if (w < 0)
		die("p2p: %%%s, read on virtual stage %d, was written by every rank",
		    c->g->values[v]->name, k);
	int step = w < k ? 1 : -1, from = w;
	for (int j = k - step; j != w - step; j -= step)
		if (fresh[v] & (1ull << (j % p))) {
			from = j;
			break;
		}
	for (int j = from; j != k; j += step) {
		add_hop(c, at, v, j, j + step, prog);
		fresh[v] |= 1ull << ((j + step) % p);
	}
}

/* The transfers program `prog` needs: every temporary a staged node reads
 * where its contents are not, moved there from the nearest stage that holds
 * them. fresh[v]: the stages holding v's current contents (bit k). */
static int plan_program(Cut *c, unsigned prog)
{
	Graph *g = c->g;
	uint64_t *fresh = calloc((size_t)g->nvalues + 1, sizeof *fresh);
	if (!fresh)
		die("out of memory");
	uint64_t all = c->p >= 64 ? ~0ull : (1ull << c->p) - 1;
	int errs = 0;
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (!(n->progs & prog))
			continue;
		for (int k = -1; k < n->nin; k++) {
			int v = k < 0 ? n->out : n->in[k];
			if (!is_temp(g, v) || c->home[v] < 0)
				continue;
			if (n->stage < 0)
				die("p2p: node %d (%s) runs on every stage but touches %%%s, which stage %d "
				    "computes", n->id, dp_op_names[n->op], g->values[v]->name, c->home[v]);
			if (!reads_operand(n, k) || (fresh[v] & (1ull << n->stage)))
				continue;
			if (!fresh[v])
				die("p2p: %%%s is read before it is written", g->values[v]->name);
			const Value *val = g->values[v];
			if (!ir_is_float(val->dtype) || val->view_of >= 0) {
				error_at(c->d, n->loc, "%s reads '%s' on pipeline stage %d, computed on "
					 "another stage, and only whole float tensors are sent between "
					 "stages: put the two in one block, or the blocks on one stage",
					 dp_op_names[n->op], val->name, n->stage);
				errs++;
				fresh[v] |= 1ull << n->stage;
				continue;
			}
			if (c->v > 1) {
				route_virtual(c, i, v, n->chunk, fresh, prog);
				continue;
			}
			/* the nearest stage that holds it, then one neighbour at a time */
			int from = -1;
			for (int dist = 1; from < 0 && dist < c->p; dist++)
				for (int s = n->stage - dist; s <= n->stage + dist; s += 2 * dist)
					if (s >= 0 && s < c->p && (fresh[v] & (1ull << s))) {
						from = s;
						break;
					}
			int step = from < n->stage ? 1 : -1;
			for (int s = from; s != n->stage; s += step) {
				add_hop(c, i, v, s, s + step, prog);
				fresh[v] |= 1ull << (s + step);
			}
		}
		/* what it writes is current on its stage only (every stage's when it
		 * runs on all) */
		if (is_temp(g, n->out)) {
			fresh[n->out] = n->stage < 0 ? all : 1ull << n->stage;
			c->wrote[n->out] = n->chunk;
		}
		for (int k = 0; k < n->nin; k++)
			if (ir_writes_in(n, k) && is_temp(g, n->in[k])) {
				fresh[n->in[k]] = n->stage < 0 ? all : 1ull << n->stage;
				c->wrote[n->in[k]] = n->chunk;
			}
	}
	free(fresh);
	return errs ? -1 : 0;
}

/* Stage s's copy of v (v itself on its home stage). */
static int copy_of(Cut *c, int v, int s)
{
	Graph *g = c->g;
	if (s < 0 || s == c->home[v])
		return v;
	int *slot = &c->copies[(size_t)v * (size_t)c->p + (size_t)s];
	if (*slot < 0) {
		const Value *o = g->values[v];
		Value *x = ir_value(g, ir_fresh_name(g, ir_fmt(g, "%s.pp%d", o->name, s)), o->dtype,
				    o->ndim, o->dims, o->kind, o->loc);
		memcpy(x->place, o->place, sizeof x->place);
		x->block = o->block;
		x->batch_dim = o->batch_dim;
		x->seq_dim = o->seq_dim;
		*slot = x->id;
	}
	return *slot;
}

/* ---- a gathered unit read on other stages (a tied parameter) ----
 *
 * A gathered block's collectives run on its block's stage. When another
 * stage reads one of its parameters (GPT-2's wte, gathered with the
 * embedding on the first stage and read by the LM head on the last), that
 * stage gets its own copy of the unit's per-micro-batch work: its own
 * gathered buffer `U.gather.ppK` (and `U.gather.bwd.ppK`) filled by its own
 * all_gather of the unit's shard over its dp_shard group right before its
 * first reader, its own gradient buffer `U.grads.ppK` zeroed before its first
 * writer and reduce_scattered into `U.rs.ppK` after its last, and that slice
 * accumulated into the unit's shard gradient on the stage. The unit's shard,
 * its shard gradient and its optimizer state are then kept by every stage
 * that reads it (passes/stage_params.c: the tied range), and the shard
 * gradients, each stage's part, are summed by the once-per-step all_reduce
 * over pp (on the sub-group of those stages when they are not all of pp). */

typedef struct {
	Graph *g;
	int p, nv;
	int *copy; /* [v * p + k]: stage k's copy of a gathered unit's buffer or its view */
} Tie;

/* Stage k's copy of v (a unit's buffer or a view of one, whose root
 * `root` has copy `root_k`), made once. */
static int tie_copy(Tie *t, int v, int root, int root_k, int k)
{
	int *slot = &t->copy[(size_t)v * (size_t)t->p + (size_t)k];
	if (*slot >= 0)
		return *slot;
	Graph *g = t->g;
	const Value *o = g->values[v];
	Value *x = ir_value(g, ir_fresh_name(g, ir_fmt(g, "%s.pp%d", o->name, k)), o->dtype, o->ndim,
			    o->dims, o->kind, o->loc);
	int id = x->id;
	const char *name = x->name;
	*x = *g->values[v]; /* kind, place, block, init, links (fixed below) */
	x->id = id, x->name = name;
	x->def = -1, x->offset = -1, x->nbytes = 0;
	x->view_of = v == root ? -1 : root_k;
	*slot = id;
	return id;
}

/* Is v (a view of) buffer b? */
static int views(const Graph *g, int v, int b)
{
	return v >= 0 && (v == b || g->values[v]->view_of == b);
}

/* The staged nodes of program prog on stage k != home that touch buffer b
 * or a direct view of it: their number, the first and the last index. */
static int touches(const Graph *g, int b, int home, unsigned prog, int k, int *first, int *last)
{
	int n = 0;
	*first = *last = -1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *x = g->nodes[i];
		if (x->stage != k || k == home || !(x->progs & prog))
			continue;
		int hit = views(g, x->out, b);
		for (int j = 0; j < x->nin && !hit; j++)
			hit = views(g, x->in[j], b);
		if (!hit)
			continue;
		if (*first < 0)
			*first = i;
		*last = i;
		n++;
	}
	return n;
}

/* Stage k's copy of node n over its copies of the unit's values, at index pos. */
static Node *tie_node(Tie *t, const Node *n, int k, int chunk, int pos)
{
	Graph *g = t->g;
	int in[DP_MAX_IN], out = n->out;
	for (int j = 0; j < n->nin; j++) {
		int v = n->in[j], c = v >= 0 && v < t->nv ? t->copy[(size_t)v * (size_t)t->p + (size_t)k] : -1;
		in[j] = c >= 0 ? c : v;
	}
	if (out >= 0 && out < t->nv && t->copy[(size_t)out * (size_t)t->p + (size_t)k] >= 0)
		out = t->copy[(size_t)out * (size_t)t->p + (size_t)k];
	Node *x = ir_node_like(g, n, out, in, k);
	x->chunk = chunk;
	if (n->bucket >= 0) { /* its own bucket record over the copies */
		Bucket b = g->buckets[n->bucket];
		int *m = ir_alloc(g, (size_t)(b.nmembers ? b.nmembers : 1) * sizeof(int));
		for (int j = 0; j < b.nmembers; j++) {
			int c = t->copy[(size_t)b.members[j] * (size_t)t->p + (size_t)k];
			m[j] = c >= 0 ? c : b.members[j];
		}
		int c = t->copy[(size_t)b.view * (size_t)t->p + (size_t)k];
		b.view = c >= 0 ? c : b.view;
		b.members = m;
		x->bucket = ir_add_bucket(g, &b);
	}
	ir_move_node(g, x, pos);
	return x;
}

/* Stage k's copies of buffer b and its views; the stage's nodes that touch
 * them use the copies. */
static void tie_buffer(Tie *t, int b, int k)
{
	Graph *g = t->g;
	int bk = tie_copy(t, b, b, -1, k);
	for (int v = 0; v < t->nv; v++)
		if (g->values[v]->view_of == b)
			tie_copy(t, v, b, bk, k);
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (n->stage != k)
			continue;
		for (int j = -1; j < n->nin; j++) {
			int *v = j < 0 ? &n->out : &n->in[j];
			if (views(g, *v, b))
				*v = t->copy[(size_t)*v * (size_t)t->p + (size_t)k];
		}
	}
}

/* The node of the program that writes v by op (a FILL of the gradients),
 * or reads it as its first operand (the ACCUM of the slice). */
static Node *find_node(Graph *g, IrOp op, int v, int by_input)
{
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (n->op == op && n->stage >= 0 && (by_input ? n->nin > 0 && n->in[0] == v : n->out == v))
			return n;
	}
	return NULL;
}

/* Every gathered unit's per-micro-batch collectives copied to each other
 * stage that reads its parameters or writes their gradients (see above). */
static void tie_gathered(Graph *g, int p)
{
	Tie t = {.g = g, .p = p, .nv = g->nvalues};
	t.copy = malloc(((size_t)t.nv * (size_t)p + 1) * sizeof *t.copy);
	if (!t.copy)
		die("out of memory");
	for (size_t i = 0; i < (size_t)t.nv * (size_t)p; i++)
		t.copy[i] = -1;
	int made = 0;
	for (int i = 0; i < g->nnodes; i++) {
		Node *x = g->nodes[i];
		if (!staged_comm(g, x))
			continue;
		int home = x->stage;
		if (x->op == DP_OP_ALL_GATHER) {
			int b = x->out;
			for (int k = 0; k < p; k++) {
				int first, last;
				if (!touches(g, b, home, x->progs, k, &first, &last))
					continue;
				int chunk = g->nodes[first]->chunk;
				tie_buffer(&t, b, k);
				tie_node(&t, x, k, chunk, first);
				made = 1;
			}
		} else if (x->op == DP_OP_REDUCE_SCATTER) {
			int fg = x->in[0], rs = x->out;
			Node *fill = find_node(g, DP_OP_FILL, fg, 0), *acc = find_node(g, DP_OP_ACCUM, rs, 1);
			for (int k = 0; k < p; k++) {
				int first, last;
				if (!touches(g, fg, home, x->progs, k, &first, &last))
					continue;
				if (!fill || !acc)
					die("p2p: %%%s, reduce_scattered on stage %d, is written on stage %d "
					    "too, without its fill and accum", g->values[fg]->name, home, k);
				int c0 = g->nodes[first]->chunk, c1 = g->nodes[last]->chunk;
				tie_buffer(&t, fg, k);
				tie_copy(&t, rs, rs, -1, k);
				tie_node(&t, fill, k, c0, first);
				Node *r = tie_node(&t, x, k, c1, last + 2); /* after the last, the fill before */
				tie_node(&t, acc, k, c1, ir_node_index(g, r) + 1);
				made = 1;
			}
		}
		i = ir_node_index(g, x); /* nodes went in before it */
	}
	/* the copies' parameter and gradient views name each other */
	for (int v = 0; made && v < t.nv; v++)
		for (int k = 0; k < p; k++) {
			int c = t.copy[(size_t)v * (size_t)p + (size_t)k];
			if (c < 0)
				continue;
			Value *x = g->values[c], *o = g->values[v];
			int gc = o->grad >= 0 && o->grad < t.nv ? t.copy[(size_t)o->grad * (size_t)p + (size_t)k] : -1;
			int pc = o->param >= 0 && o->param < t.nv ? t.copy[(size_t)o->param * (size_t)p + (size_t)k] : -1;
			x->grad = o->grad >= 0 ? gc : -1;
			x->param = o->param >= 0 ? pc : -1;
		}
	free(t.copy);
}

int p2p_run(Graph *g, Diag *d)
{
	int p = (int)g->cfg.mesh[DP_AXIS_PP];
	if (p <= 1)
		return 0;
	if (p > 64)
		die("p2p: pp=%d stages (at most 64)", p);
	int vs = ir_chunks_per_rank(g);
	assign_stages(g, p, vs);
	tie_gathered(g, p);
	Cut c = {.g = g, .d = d, .p = p, .v = vs};
	int nv = g->nvalues;
	c.home = malloc(((size_t)nv + 1) * sizeof *c.home);
	c.wrote = malloc(((size_t)nv + 1) * sizeof *c.wrote);
	c.copies = malloc(((size_t)nv * (size_t)p + 1) * sizeof *c.copies);
	if (!c.home || !c.wrote || !c.copies)
		die("out of memory");
	for (int v = 0; v < nv; v++)
		c.home[v] = c.wrote[v] = -1;
	for (size_t i = 0; i < (size_t)nv * (size_t)p; i++)
		c.copies[i] = -1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (is_temp(g, n->out) && c.home[n->out] < 0 && (n->progs & (IR_IN_STEP | IR_IN_EVAL)))
			c.home[n->out] = n->stage;
	}
	int rc = 0;
	if (plan_program(&c, IR_IN_STEP) < 0 || plan_program(&c, IR_IN_EVAL) < 0)
		rc = -1;
	/* by the node they precede; the eval program's after the step's there */
	for (int i = 1; i < c.nhops; i++)
		for (int j = i; j > 0 && c.hops[j - 1].at > c.hops[j].at; j--) {
			Hop t = c.hops[j];
			c.hops[j] = c.hops[j - 1], c.hops[j - 1] = t;
		}
	/* each stage's nodes read and write that stage's copies */
	for (int i = 0; rc == 0 && i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (n->stage < 0)
			continue;
		for (int k = 0; k < n->nin; k++)
			if (is_temp(g, n->in[k]) && n->in[k] < nv && c.home[n->in[k]] >= 0)
				n->in[k] = copy_of(&c, n->in[k], n->stage);
		if (is_temp(g, n->out) && n->out < nv && c.home[n->out] >= 0)
			n->out = copy_of(&c, n->out, n->stage);
	}
	/* the transfers, in the order planned, before the nodes that need them */
	int n0 = g->nnodes;
	Node **old = malloc(((size_t)n0 + 1) * sizeof *old);
	if (!old)
		die("out of memory");
	memcpy(old, g->nodes, (size_t)n0 * sizeof *old);
	Node **order = malloc(((size_t)n0 + 2 * (size_t)c.nhops + 1) * sizeof *order);
	if (!order)
		die("out of memory");
	int k = 0, h = 0;
	for (int i = 0; rc == 0 && i < n0; i++) {
		for (; h < c.nhops && c.hops[h].at == i; h++) {
			const Hop *hp = &c.hops[h];
			const Node *user = old[i];
			/* ranks: the virtual stages' under interleaved */
			int from = hp->from % p, to = hp->to % p;
			int src = copy_of(&c, hp->v, from), dst = copy_of(&c, hp->v, to);
			Node *s = ir_node(g, DP_OP_SEND, -1, 1, &src, user->phase, user->loc);
			Node *r = ir_node(g, DP_OP_RECV, dst, 0, NULL, user->phase, user->loc);
			DP_AXES(s) = DP_AXES(r) = DP_AXIS_BIT(DP_AXIS_PP);
			DP_PEER(s) = to, DP_PEER(r) = from;
			DP_TAG(s) = DP_TAG(r) = h % 32768; /* the pair's number (a message tag) */
			s->stage = from, r->stage = to;
			if (vs > 1)
				s->chunk = hp->from, r->chunk = hp->to;
			s->progs = r->progs = hp->progs;
			s->stream = r->stream = DP_STREAM_P2P;
			s->block = r->block = user->block;
			order[k++] = s;
			order[k++] = r;
		}
		order[k++] = old[i];
	}
	if (rc == 0) {
		if (k != g->nnodes)
			die("p2p: placed %d of %d nodes", k, g->nnodes);
		memcpy(g->nodes, order, (size_t)k * sizeof *order);
	}
	free(old), free(order), free(c.home), free(c.wrote), free(c.copies), free(c.hops);
	return rc;
}
