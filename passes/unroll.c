/*
 * unroll.c - the pipeline's micro-batches unrolled in the schedule's order,
 * pass "unroll" (pp > 1).
 *
 * Before (after p2p): the step program is one micro-batch's work, every
 * forward and backward node on its stage (Node.stage), the sends and recvs
 * between neighbouring stages as adjacent pairs right before their readers,
 * and the once-per-step part (DP_IF_LAST: gradient collectives, clipping,
 * the optimizer) on every stage. dpexec would run it grad_accum times, one
 * micro-batch through every stage at a time.
 *
 * After, at pp = P > 1 with M = grad_accum micro-batches: the step program
 * holds every micro-batch. Its per-micro-batch work is cut into slots: F(s)
 * is stage s's forward (every staged node before the step's first backward
 * node, recompute copies excepted: they sit in the backward), B(s) its
 * backward; a load on every stage (stage -1) goes before its micro-batch's
 * first slot. Slot X of micro-batch k is a copy of X's nodes (printed
 * `mb=k` on their temporaries: `%h4.mb1`, loads `micro=k`) reading and
 * writing micro-batch k's own copies of every temporary and data value they
 * touch, so micro-batches in flight keep their activations apart; gradients
 * and metrics are shared and accumulate. A view of a copied temporary is
 * copied with it whatever its kind (full_shard's parameters and gradients,
 * views of the gathered and reduced buffers: `%h.0.wqkv.mb1` in
 * `%h.0.gather.mb1`), linked param to grad copy, and a collective over a
 * copied bucket gets its micro-batch's own bucket record: a gathered block
 * is gathered per micro-batch, before its forward and (with
 * reshard_after_forward) again before its backward. Without
 * reshard_after_forward a gathered block is gathered once per step
 * instead (gathered_once): one
 * "U.gather" that every micro-batch reads, its all_gather micro-batch 0's,
 * before the stage's first forward, live until its last backward (memplan
 * keeps it so: the memory trade --stats shows). A send/recv pair belongs to the
 * slot that produces what it moves (a forward hop to F(from), a gradient's
 * to B(from)), where it ends the slot, else to the slot that reads it. Tags
 * number the pairs over the micro-batches, so a pair's tag is unique in the
 * step.
 *
 * Under zero_bubble a backward slot is cut in two: B, the input gradients
 * that the stage before waits for, and W, the nodes that write a parameter's
 * gradient (stages_wgrad: autodiff's dW matmuls and bias sums), which only
 * the optimizer waits for, and what reads their results on the stage (a
 * gathered block's reduce_scatter of its gradients and its accumulation).
 *
 * Each stage's slots follow the schedule (`pipeline` in train, g->pipeline:
 * gpipe F0..FM-1 B0..BM-1; pipedream_flush, 1F1B, min(P-s-1, M) forwards,
 * then a forward and a backward in turn, then the remaining backwards;
 * zero_bubble, 1F1B with each W deferred by P-1-s backwards), as
 * passes/stages.c's slot_order gives them. The stages' sequences are
 * merged into the one program by the forecast's times (stages_simulate):
 * a slot's body (its nodes but the transfers it owns as their producer)
 * at its start, those transfers at its end (before a body starting at the
 * same time), a slot only after the transfers of those it needs (F(s,k)
 * after F(s-1,k), B(s,k) after B(s+1,k) and F(s,k)), so the program is one
 * sequential run of every stage's work in which each send meets its recv at
 * once: no stage waits in a cycle (ir/verify.c checks it again). Why the
 * transfers at the end: a recv waits on its stage's serial comm stream
 * (NCCL's, runtime/cuda) until its sender posts it, and so does every
 * collective behind it there; placed with its producer's slot at that
 * slot's start it came before the tp all_reduces of the slot the
 * receiving stage runs meanwhile (1F1B's B(s+1,j) beside F(s,k)), which
 * then waited for F(s,k) to end: at tp > 1 the stages idled above the
 * forecast (gpt2-tiny at pp=4 x tp=2, 8 micro-batches, on a machine where
 * only FLOPs cost: 50.3 % against 43.8 %; 43.7 % since). The
 * DP_IF_LAST part follows, once, in its order. On each stage the backward
 * (and W) slots run in micro-batch order under every schedule, so every
 * gradient accumulates its micro-batches in the order pp = 1 does.
 *
 * Under interleaved a slot is a virtual stage's (Node.chunk) F or B of a
 * micro-batch, the readiness above over the virtual stages (F(c,k) after
 * F(c-1,k), B(c,k) after B(c+1,k)), and each rank's slots in
 * passes/stages.c's interleaved_order: on each virtual stage the backwards
 * still run in micro-batch order.
 *
 * Eval is not unrolled: a node that both programs shared stays the eval
 * program's, with the original values.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* The slot a per-micro-batch node belongs to: 3 * stage + STAGE_F, STAGE_B
 * or STAGE_W (zero_bubble's weight gradients); SLOT_PRE: a load every stage
 * runs. */
#define SLOT_PRE -1

static int per_micro(const Node *n)
{
	return (n->progs & IR_IN_STEP) && !(n->flags & DP_IF_LAST) &&
	       (n->stage >= 0 || n->op == DP_OP_LOAD);
}

static int value_root(const Graph *g, int v)
{
	while (g->values[v]->view_of >= 0)
		v = g->values[v]->view_of;
	return v;
}

static int copied_kind(const Value *v)
{
	return v->kind == DP_T_ACT || v->kind == DP_T_DATA;
}

typedef struct {
	Graph *g;
	int m, nv;
	int *copy; /* (mb, value) -> the micro-batch's copy, or -1 */
	char *once; /* per value: a gathered copy kept for the whole step (gathered_once) */
} Copies;

/* The gathered copies kept for the whole step: under reshard_after_forward
 * false a gathered block's "U.gather", which its stage's forward reads (and
 * its backward, unless the backward does not read its parameters: an
 * embedding's, whose gradient is a scatter of dy), is one temporary that
 * every micro-batch reads, all_gathered once per step before the stage's
 * first forward (micro-batch 0's), instead of once per micro-batch: the
 * setting's trade, less traffic for more memory, taken for the whole step
 * (an embedding's table is the largest block, so the most traffic saved).
 * With reshard_after_forward the backward reads its own "U.gather.bwd" and
 * both stay per micro-batch. */
static char *gathered_once(const Graph *g, int m)
{
	char *once = calloc((size_t)g->nvalues + 1, 1), *fwd = calloc((size_t)g->nvalues + 1, 1);
	if (!once || !fwd)
		die("out of memory");
	for (int i = 0; i < g->nnodes && m > 1; i++) {
		const Node *n = g->nodes[i];
		if (!per_micro(n) || n->phase != PH_FWD)
			continue;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0)
				fwd[value_root(g, n->in[k])] = 1;
	}
	for (int i = 0; i < g->nnodes && m > 1; i++) {
		const Node *n = g->nodes[i];
		if (per_micro(n) && n->op == DP_OP_ALL_GATHER && n->out >= 0) {
			int r = value_root(g, n->out);
			once[r] = g->values[r]->kind == DP_T_ACT && fwd[r] && !ir_block_reshard(g, n->block);
		}
	}
	free(fwd);
	return once;
}

/* Micro-batch mb's copy of value v (v itself when it is not copied). */
static int mb_value(Copies *c, int mb, int v)
{
	if (v < 0 || v >= c->nv)
		return v;
	int *slot = &c->copy[(size_t)mb * (size_t)c->nv + (size_t)v];
	if (*slot == -2)
		return v;
	if (*slot < 0) {
		Graph *g = c->g;
		const Value *o = g->values[v];
		int root = o->view_of >= 0 ? mb_value(c, mb, o->view_of) : -1;
		o = g->values[v]; /* the copy above may have grown the array */
		Value *x = ir_value(g, ir_fresh_name(g, ir_fmt(g, "%s.mb%d", o->name, mb)), o->dtype,
				    o->ndim, o->dims, o->kind, o->loc);
		int id = x->id;
		const char *name = x->name;
		*x = *o;
		x->id = id, x->name = name;
		x->view_of = o->view_of >= 0 ? root : -1;
		x->def = -1, x->offset = -1, x->nbytes = 0;
		*slot = id;
		/* a copied parameter view and its gradient's (full_shard's) name
		 * each other's copies */
		int pv = o->param, gv = o->grad;
		x->param = x->grad = -1;
		if (pv >= 0 && c->copy[(size_t)mb * (size_t)c->nv + (size_t)pv] != -2)
			g->values[id]->param = mb_value(c, mb, pv);
		if (gv >= 0 && c->copy[(size_t)mb * (size_t)c->nv + (size_t)gv] != -2)
			g->values[id]->grad = mb_value(c, mb, gv);
	}
	return *slot;
}

static Node *clone_node(Copies *c, const Node *o, int mb, int tag_base)
{
	Graph *g = c->g;
	int in[DP_MAX_IN];
	for (int k = 0; k < o->nin; k++)
		in[k] = mb_value(c, mb, o->in[k]);
	Node *n = ir_node(g, o->op, mb_value(c, mb, o->out), o->nin, in, o->phase, o->loc);
	memcpy(n->ia, o->ia, sizeof n->ia);
	memcpy(n->fa, o->fa, sizeof n->fa);
	n->progs = IR_IN_STEP;
	n->flags = o->flags, n->stream = o->stream, n->recompute = o->recompute;
	n->bucket = o->bucket, n->block = o->block, n->stage = o->stage, n->chunk = o->chunk;
	if (o->bucket >= 0 && mb_value(c, mb, g->buckets[o->bucket].view) != g->buckets[o->bucket].view) {
		/* a gathered unit's collective: its micro-batch's own bucket */
		Bucket b = g->buckets[o->bucket];
		int *members = ir_alloc(g, (size_t)(b.nmembers ? b.nmembers : 1) * sizeof(int));
		for (int k = 0; k < b.nmembers; k++)
			members[k] = mb_value(c, mb, b.members[k]);
		b.view = mb_value(c, mb, b.view);
		b.members = members;
		n->bucket = ir_add_bucket(g, &b);
	}
	if (o->op == DP_OP_LOAD)
		DP_ATTR(n, LOAD, micro) = mb;
	if (o->op == DP_OP_SEND || o->op == DP_OP_RECV)
		DP_TAG(n) = (tag_base + DP_TAG(o)) % 32768;
	return n;
}

/* Which values the per-micro-batch nodes keep apart: every temporary and
 * data value they touch (-1 in copy), the rest shared (-2). */
static void mark_copied(Copies *c)
{
	Graph *g = c->g;
	char *used = calloc((size_t)c->nv + 1, 1);
	if (!used)
		die("out of memory");
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!per_micro(n))
			continue;
		for (int k = -1; k < n->nin; k++) {
			int v = k < 0 ? n->out : n->in[k], copied = 0;
			if (v >= 0 && c->once[value_root(g, v)])
				continue; /* one copy for the step */
			for (int r = v; r >= 0; r = g->values[r]->view_of)
				copied |= copied_kind(g->values[r]);
			/* a view of a copied root is copied with it, whatever its
			 * kind (full_shard's parameters and gradients are views of
			 * the gathered and reduced temporaries) */
			for (; copied && v >= 0; v = g->values[v]->view_of)
				used[v] = 1;
		}
	}
	/* and every view of a copied root (a gathered unit's members that no
	 * node reads, a bias's backward view) */
	for (int grown = 1; grown;) {
		grown = 0;
		for (int v = 0; v < c->nv; v++)
			if (!used[v] && g->values[v]->view_of >= 0 && used[g->values[v]->view_of])
				used[v] = grown = 1;
	}
	/* the once-per-step part must not read a micro-batch's temporary */
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || per_micro(n))
			continue;
		if (!(n->flags & DP_IF_LAST))
			die("unroll: node %d (%s) runs on every stage once per micro-batch", n->id,
			    dp_op_names[n->op]);
		for (int k = -1; k < n->nin; k++) {
			int v = k < 0 ? n->out : n->in[k];
			if (v >= 0 && used[v])
				die("unroll: node %d (%s) runs once per step but touches %%%s, a "
				    "micro-batch's", n->id, dp_op_names[n->op], g->values[v]->name);
		}
	}
	for (int mb = 0; mb < c->m; mb++)
		for (int v = 0; v < c->nv; v++)
			c->copy[(size_t)mb * (size_t)c->nv + (size_t)v] = used[v] ? -1 : -2;
	free(used);
}

/* The stage of the schedule a node runs on: its virtual stage under
 * interleaved (Node.chunk), else its stage. */
static int vstage(const Node *n)
{
	return n->chunk >= 0 ? n->chunk : n->stage;
}

/* The slot of per-micro-batch node i (first_bwd: the first backward node's index). */
static int slot_of(const Graph *g, int i, int first_bwd)
{
	const Node *n = g->nodes[i];
	int bwd = i >= first_bwd ? STAGE_B : STAGE_F;
	if (n->stage < 0)
		return SLOT_PRE;
	if (bwd && g->pipeline == IR_PIPE_ZERO_BUBBLE && stages_wgrad(g, n))
		return 3 * vstage(n) + STAGE_W;
	if (n->op == DP_OP_SEND || n->op == DP_OP_RECV) {
		const Node *s = n->op == DP_OP_SEND ? n : g->nodes[i - 1];
		const Node *r = n->op == DP_OP_SEND ? g->nodes[i + 1] : n;
		if (s->op != DP_OP_SEND || r->op != DP_OP_RECV || DP_TAG(s) != DP_TAG(r))
			die("unroll: send/recv pair at node %d is not adjacent", n->id);
		int with_producer = bwd ? vstage(r) < vstage(s) : vstage(r) > vstage(s);
		return 3 * (with_producer ? vstage(s) : vstage(r)) + bwd;
	}
	return 3 * vstage(n) + bwd;
}

int unroll_run(Graph *g, Diag *d)
{
	int p = (int)g->cfg.mesh[DP_AXIS_PP];
	if (p <= 1)
		return 0;
	if (p > STAGES_MAX_ACCOUNT)
		die("unroll: pp=%d stages (at most %d)", p, STAGES_MAX_ACCOUNT);
	int m = (int)(g->cfg.grad_accum ? g->cfg.grad_accum : 1);
	int n0 = g->nnodes, ntags = 0;
	int first_bwd = n0;
	for (int i = 0; i < n0; i++) {
		const Node *n = g->nodes[i];
		if (!per_micro(n))
			continue;
		if (n->phase == PH_BWD && !n->recompute && first_bwd == n0)
			first_bwd = i;
		if (n->op == DP_OP_SEND && DP_TAG(n) + 1 > ntags)
			ntags = (int)DP_TAG(n) + 1;
	}
	Copies c = {.g = g, .m = m, .nv = g->nvalues};
	c.copy = malloc((size_t)m * (size_t)c.nv * sizeof *c.copy + 1);
	/* per node: its slot, or -2: not per micro-batch */
	int *slot = malloc(((size_t)n0 + 1) * sizeof *slot);
	Node **old = malloc(((size_t)n0 + 1) * sizeof *old);
	if (!c.copy || !slot || !old)
		die("out of memory");
	memcpy(old, g->nodes, (size_t)n0 * sizeof *old);
	c.once = gathered_once(g, m);
	mark_copied(&c);
	/* per node: 1 for an all_gather of a copy kept for the step, 2 once placed */
	char *gather_once = calloc((size_t)n0 + 1, 1);
	if (!gather_once)
		die("out of memory");
	for (int i = 0; i < n0; i++)
		gather_once[i] = old[i]->op == DP_OP_ALL_GATHER && old[i]->out >= 0 &&
				 per_micro(old[i]) && c.once[value_root(g, old[i]->out)];
	/* zero_bubble: what reads a W node's result on its stage is W's too (a
	 * gathered unit's reduce_scatter of the gradients its W nodes write) */
	char *w_wrote = calloc((size_t)c.nv + 1, 1);
	if (!w_wrote)
		die("out of memory");
	for (int i = 0; i < n0; i++) {
		const Node *n = old[i];
		slot[i] = per_micro(n) ? slot_of(g, i, first_bwd) : -2;
		if (slot[i] < 0 || n->op == DP_OP_SEND || n->op == DP_OP_RECV)
			continue;
		for (int k = 0; slot[i] % 3 == STAGE_B && k < n->nin; k++)
			if (n->in[k] >= 0 && w_wrote[value_root(g, n->in[k])])
				slot[i] = 3 * vstage(n) + STAGE_W;
		if (slot[i] % 3 == STAGE_W && n->out >= 0)
			w_wrote[value_root(g, n->out)] = 1;
	}
	free(w_wrote);

	/* each stage's slots in the schedule's order, merged by the forecast's
	 * starts; fdone, bdone per (virtual) stage and micro-batch */
	int v = ir_chunks_per_rank(g), nc = p * v;
	StageCost *sc = calloc((size_t)nc, sizeof *sc);
	int per = stages_slots_per_stage(m, v, g->pipeline);
	StageSlot *sl = calloc((size_t)p * (size_t)per, sizeof *sl);
	int *next = calloc((size_t)p, sizeof *next);
	char *fdone = calloc((size_t)nc * (size_t)m, 1), *bdone = calloc((size_t)nc * (size_t)m, 1);
	char *pre_done = calloc((size_t)m, 1);
	size_t cap = (size_t)n0 + (size_t)m * (size_t)n0 + 1;
	Node **order = malloc(cap * sizeof *order);
	if (!sc || !sl || !next || !fdone || !bdone || !pre_done || !order)
		die("out of memory");
	stages_account(g, sc);
	double bubble;
	if (stages_simulate(sc, p, v, m, g->pipeline, &bubble, sl) < 0) {
		/* a user's choice (zero_bubble at grad_accum 1), not a bug */
		error_at(d, g->mesh_loc,
			 "the %s pipeline schedule cannot order %d micro-batch%s over pp=%d stages "
			 "without a deadlock: raise train's grad_accum (its micro-batches), or use "
			 "another schedule",
			 stages_schedule_name(g->pipeline), m, m == 1 ? "" : "es", p);
		free(order), free(pre_done), free(fdone), free(bdone), free(next);
		free(sl), free(sc), free(old), free(slot), free(c.copy), free(c.once), free(gather_once);
		return -1;
	}
	/* a slot's transfers out (the pairs it owns as their producer) and the
	 * rest, its body: tail[i] for those nodes, has_tail per slot */
	char *tail = calloc((size_t)n0 + 1, 1), *has_tail = calloc(3 * (size_t)nc + 1, 1);
	char *body_done = calloc((size_t)p, 1);
	if (!tail || !has_tail || !body_done)
		die("out of memory");
	for (int i = 0; i < n0; i++)
		if (slot[i] >= 0 && (old[i]->op == DP_OP_SEND || old[i]->op == DP_OP_RECV)) {
			const Node *snd = old[i]->op == DP_OP_SEND ? old[i] : old[i - 1];
			if (slot[i] / 3 == vstage(snd))
				tail[i] = 1, has_tail[slot[i]] = 1;
		}
	size_t k = 0;
	for (int left = per * p; left > 0;) {
		/* the earliest item: a stage's next slot's body at its start, once
		 * the slots it needs have sent (ready), or the transfers of the slot
		 * whose body it ran last at that slot's end (first at a tie) */
		int best = -1;
		double best_t = 0;
		for (int s = 0; s < p; s++) {
			if (next[s] >= per)
				continue;
			const StageSlot *x = &sl[(size_t)s * (size_t)per + (size_t)next[s]];
			int ch = x->chunk;
			size_t at = (size_t)ch * (size_t)m + (size_t)x->mb;
			int ready = body_done[s] || (x->kind == STAGE_F   ? ch == 0 || fdone[at - (size_t)m]
						     : x->kind == STAGE_B ? fdone[at] && (ch == nc - 1 || bdone[at + (size_t)m])
									  : bdone[at]);
			double t = body_done[s] ? x->end : x->start;
			if (ready && (best < 0 || t < best_t || (t == best_t && body_done[s] && !body_done[best])))
				best = s, best_t = t;
		}
		if (best < 0)
			die("unroll: the schedule's slots wait for each other");
		const StageSlot *x = &sl[(size_t)best * (size_t)per + (size_t)next[best]];
		int want = 3 * x->chunk + x->kind, part = body_done[best]; /* 0: body, 1: transfers */
		if (!part && !pre_done[x->mb]) { /* the loads every stage runs, before the micro-batch */
			pre_done[x->mb] = 1;
			for (int i = 0; i < n0; i++)
				if (slot[i] == SLOT_PRE)
					order[k++] = clone_node(&c, old[i], x->mb, x->mb * ntags);
		}
		for (int i = 0; i < n0; i++)
			if (slot[i] == want && tail[i] == part && gather_once[i] != 2) {
				order[k++] = clone_node(&c, old[i], x->mb, x->mb * ntags);
				gather_once[i] *= 2;
			}
		if (!part && has_tail[want]) {
			body_done[best] = 1;
			continue;
		}
		body_done[best] = 0;
		if (x->kind != STAGE_W)
			(x->kind == STAGE_F ? fdone : bdone)[(size_t)x->chunk * (size_t)m + (size_t)x->mb] = 1;
		next[best]++, left--;
	}
	free(tail), free(has_tail), free(body_done);
	/* the eval program's share of the per-micro-batch nodes stays as it was;
	 * everything else (other programs, the once-per-step part) in its order */
	Node **rest = malloc(((size_t)n0 + 1) * sizeof *rest);
	if (!rest)
		die("out of memory");
	size_t nrest = 0, nfirst = 0;
	for (int i = 0; i < n0; i++) {
		Node *n = old[i];
		if (slot[i] >= -1) {
			n->progs &= ~IR_IN_STEP;
			if (!n->progs)
				continue;
		}
		rest[nrest++] = n;
	}
	/* the step's unrolled part where its first node was (no node before it
	 * is dropped) */
	for (int i = 0; i < n0 && slot[i] < -1; i++)
		nfirst++;
	/* the dropped originals: the step's nodes that no other program shares */
	if (k + nrest > (size_t)g->nnodes)
		die("unroll: placed %zu of %d nodes", k + nrest, g->nnodes);
	g->nnodes = (int)(k + nrest);
	Node **all = malloc(((size_t)g->nnodes + 1) * sizeof *all);
	if (!all)
		die("out of memory");
	memcpy(all, rest, nfirst * sizeof *all);
	memcpy(all + nfirst, order, k * sizeof *all);
	memcpy(all + nfirst + k, rest + nfirst, (nrest - nfirst) * sizeof *all);
	memcpy(g->nodes, all, (size_t)g->nnodes * sizeof *all);
	free(all), free(rest), free(order), free(pre_done), free(fdone), free(bdone), free(next);
	free(sl), free(sc), free(old), free(slot), free(c.copy), free(c.once), free(gather_once);
	return 0;
}
