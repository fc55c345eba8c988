/*
 * stages.c - pipeline stages (the pp mesh axis), pass "stages"; and the
 * per-stage accounting that `--stats` prints.
 *
 * Before (after shape and cp): every value is shaped; blocks carry the stage
 * their `stage N` gave them, or -1.
 *
 * After: at pp = 1 every block's stage is -1 (a `stage` is ignored: the same
 * file compiles at pp = 1 for comparison). At pp = P > 1 every block has a
 * stage in 0..P-1, non-decreasing in block order, and every stage has a
 * block. When some block says `stage N`, the blocks without one follow the
 * block before them (the first block: stage 0). When none does (`stages
 * auto`), the blocks are cut into P contiguous runs that minimise the
 * largest run's forward FLOPs per micro-batch (the registry's cost rules),
 * ties broken by the smallest largest parameter bytes: the pipeline is as
 * slow as its slowest stage. A node outside every block (the loss) belongs
 * to the stage of the block node before it.
 *
 * Under `pipeline interleaved` (Megatron's virtual stages, train's
 * stages_per_rank v) the same cut, explicit or auto, is into P x v virtual
 * stages (a block's `stage N` names one), and each block's virtual stage
 * (Block.chunk) runs on rank chunk mod P (Block.stage): rank r holds virtual
 * stages r, r + P, ..., r + (v-1)P. The accounting below is then per
 * virtual stage, and the schedule's slots per rank over its virtual stages.
 *
 * The stages' programs are passes/p2p.c's and passes/unroll.c's. This file
 * also forecasts the pipeline (`--stats`: FLOPs, parameters, activations
 * kept per micro-batch, the bytes each cut sends, the bubble of the
 * `pipeline` schedule; stages_account reads one micro-batch's share of an
 * unrolled step), and gives the schedule's slot order and start times that
 * passes/unroll.c merges the stages' programs by (stages_simulate).
 */
#include <stdlib.h>
#include <string.h>

#include "shard.h"

static double node_flops(const Graph *g, const Node *n)
{
	double flops = 0, bytes = 0;
	if (ir_ops[n->op].cost)
		ir_ops[n->op].cost(g, n, &flops, &bytes);
	return flops;
}

static int64_t value_bytes(const Value *v)
{
	return ir_numel(v) * (int64_t)ir_dtype_size(v->dtype);
}

/* A step-program forward or backward node: the work a pipeline slot runs. */
static int pipeline_work(const Node *n)
{
	return (n->progs & IR_IN_STEP) && (n->phase == PH_FWD || n->phase == PH_BWD);
}

/* Each block's forward FLOPs per micro-batch and the bytes of its params. */
static void block_costs(const Graph *g, double *flops, double *bytes)
{
	for (int b = 0; b < g->nblocks; b++)
		flops[b] = bytes[b] = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->phase == PH_FWD && (n->progs & IR_IN_STEP) && n->block >= 0 &&
		    n->block < g->nblocks)
			flops[n->block] += node_flops(g, n);
	}
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (v->kind == DP_T_PARAM && v->block >= 0 && v->block < g->nblocks)
			bytes[v->block] += (double)value_bytes(v);
	}
}

/* stages auto: the contiguous cut of the blocks into p runs whose largest
 * forward FLOPs (then largest parameter bytes) is smallest; exact, by dynamic
 * programming over (runs, blocks), O(p n^2) with the runs' sums from
 * prefix sums. */
static void balance(Graph *g, int p)
{
	int n = g->nblocks;
	/* flops[i], bytes[i]: the sums over blocks 0..i-1 (block_costs fills them
	 * per block from index 1, made prefix sums below) */
	double *flops = calloc((size_t)n + 1, sizeof *flops);
	double *bytes = calloc((size_t)n + 1, sizeof *bytes);
	/* best[k][i]: the best cut of blocks 0..i-1 into k runs; from[k][i]: where its
	 * last run starts */
	double *bf = calloc((size_t)(p + 1) * (size_t)(n + 1), sizeof *bf);
	double *bb = calloc((size_t)(p + 1) * (size_t)(n + 1), sizeof *bb);
	int *from = calloc((size_t)(p + 1) * (size_t)(n + 1), sizeof *from);
	if (!flops || !bytes || !bf || !bb || !from)
		die("out of memory");
	block_costs(g, flops + 1, bytes + 1);
	for (int i = 1; i <= n; i++)
		flops[i] += flops[i - 1], bytes[i] += bytes[i - 1];
#define AT(k, i) ((size_t)(k) * (size_t)(n + 1) + (size_t)(i))
	for (int k = 0; k <= p; k++)
		for (int i = 0; i <= n; i++)
			bf[AT(k, i)] = -1; /* unreachable */
	bf[AT(0, 0)] = bb[AT(0, 0)] = 0;
	for (int k = 1; k <= p; k++)
		for (int i = k; i <= n - (p - k); i++)
			for (int j = i - 1; j >= k - 1; j--) { /* the last run is blocks j..i-1 */
				if (bf[AT(k - 1, j)] < 0)
					continue;
				double rf = flops[i] - flops[j], rb = bytes[i] - bytes[j];
				double f = rf > bf[AT(k - 1, j)] ? rf : bf[AT(k - 1, j)];
				double m = rb > bb[AT(k - 1, j)] ? rb : bb[AT(k - 1, j)];
				double *cf = &bf[AT(k, i)], *cb = &bb[AT(k, i)];
				if (*cf < 0 || f < *cf || (f == *cf && m < *cb)) {
					*cf = f, *cb = m;
					from[AT(k, i)] = j;
				}
			}
	for (int k = p, i = n; k > 0; k--) {
		int j = from[AT(k, i)];
		for (int b = j; b < i; b++)
			g->blocks[b].stage = k - 1;
		i = j;
	}
#undef AT
	free(flops), free(bytes), free(bf), free(bb), free(from);
}

/* Explicit stages: fill the blocks without one, and check the order. */
static int check_explicit(Graph *g, Diag *d, int p)
{
	int prev = 0, errs = 0;
	for (int b = 0; b < g->nblocks; b++) {
		Block *bl = &g->blocks[b];
		if (bl->stage < 0) {
			bl->stage = prev;
			continue;
		}
		if (bl->stage >= p) {
			if (p == (int)g->cfg.mesh[DP_AXIS_PP])
				error_at(d, bl->stage_loc, "block '%s' is on stage %d but the mesh has "
					 "pp=%d (stages 0 to %d)", bl->name, bl->stage, p, p - 1);
			else
				error_at(d, bl->stage_loc, "block '%s' is on stage %d but the interleaved "
					 "pipeline has pp x stages_per_rank = %d virtual stages (0 to %d)",
					 bl->name, bl->stage, p, p - 1);
			errs++;
		} else if (bl->stage < prev) {
			error_at(d, bl->stage_loc, "block '%s' is on stage %d after block '%s' on "
				 "stage %d: stages follow the blocks' order (the forward's)",
				 bl->name, bl->stage, g->blocks[b - 1].name, prev);
			errs++;
		} else if (bl->stage > prev + 1 || (b == 0 && bl->stage > 0)) {
			error_at(d, bl->stage_loc, "block '%s' is on stage %d, so stage %d has no "
				 "block: every stage needs one", bl->name, bl->stage,
				 b == 0 ? 0 : prev + 1);
			errs++;
		}
		if (errs)
			return -1;
		prev = bl->stage;
	}
	if (prev != p - 1) {
		const Block *last = &g->blocks[g->nblocks - 1];
		error_at(d, last->stage_loc, "the last block '%s' is on stage %d, so stage %d has "
			 "no block: with %s=%d the last block is on stage %d", last->name, prev,
			 prev + 1, p == (int)g->cfg.mesh[DP_AXIS_PP] ? "pp" : "pp x stages_per_rank",
			 p, p - 1);
		return -1;
	}
	return 0;
}

/* Interleaved: the cut was into pp x v virtual stages (chunks); virtual stage
 * c runs on rank c mod pp. */
static void deal_chunks(Graph *g, int p)
{
	for (int b = 0; b < g->nblocks; b++) {
		Block *bl = &g->blocks[b];
		bl->chunk = bl->stage;
		bl->stage = bl->chunk % p;
	}
}

int stages_run(Graph *g, Diag *d)
{
	int p = (int)g->cfg.mesh[DP_AXIS_PP];
	for (int b = 0; b < g->nblocks; b++)
		g->blocks[b].chunk = -1;
	if (p <= 1) {
		for (int b = 0; b < g->nblocks; b++)
			g->blocks[b].stage = -1;
		return 0;
	}
	int v = ir_chunks_per_rank(g), n = p * v;
	if (p * v > STAGES_MAX_ACCOUNT) {
		error_at(d, g->mesh_loc, "pp=%d x stages_per_rank %d is %d virtual stages, more than "
			 "the %d the compiler accounts for: lower stages_per_rank to %d at most",
			 p, v, p * v, STAGES_MAX_ACCOUNT, STAGES_MAX_ACCOUNT / p);
		return -1;
	}
	if (g->nblocks < n) {
		Loc at = g->mesh_loc.line > 0 || !g->nblocks ? g->mesh_loc : g->blocks[0].loc;
		if (v > 1)
			error_at(d, at,
				 "the interleaved pipeline cuts the model into pp=%d x stages_per_rank %d "
				 "= %d virtual stages of whole blocks, but it has %d block%s: lower "
				 "stages_per_rank to %d at most, or use more blocks",
				 p, v, n, g->nblocks, g->nblocks == 1 ? "" : "s", g->nblocks / p);
		else
			error_at(d, at,
				 "pp=%d cuts the model into %d stages of whole blocks, but it has %d "
				 "block%s: use pp=%d at most, or more blocks",
				 p, p, g->nblocks, g->nblocks == 1 ? "" : "s", g->nblocks);
		return -1;
	}
	int given = 0;
	for (int b = 0; b < g->nblocks; b++)
		given |= g->blocks[b].stage >= 0;
	if (given) {
		if (check_explicit(g, d, n) < 0)
			return -1;
	} else {
		balance(g, n);
	}
	if (v > 1)
		deal_chunks(g, p);
	return 0;
}

int stages_count(const Graph *g)
{
	return (int)g->cfg.mesh[DP_AXIS_PP] * ir_chunks_per_rank(g);
}

/* ---- the accounting --stats prints ---- */

/* The stage of the schedule a block or node is on: its virtual stage under
 * interleaved, else its pipeline stage (-1: none yet). */
static int block_vstage(const Block *bl)
{
	return bl->chunk >= 0 ? bl->chunk : bl->stage;
}

static int node_vstage(const Node *n)
{
	return n->chunk >= 0 ? n->chunk : n->stage;
}

/* The stage (virtual stage under interleaved) of every node (by index): the
 * one p2p gave it, else its block's, else the stage of the last node before
 * it that has one (the loss: the last stage's); -1 for nodes that are no
 * pipeline work. */
static void node_stages(const Graph *g, int *stage)
{
	int cur = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		stage[i] = -1;
		if (!pipeline_work(n))
			continue;
		if (node_vstage(n) >= 0) /* passes/p2p.c placed it (the unrolled order mixes stages) */
			cur = node_vstage(n);
		else if (n->block >= 0 && n->block < g->nblocks && block_vstage(&g->blocks[n->block]) >= 0)
			cur = block_vstage(&g->blocks[n->block]);
		stage[i] = cur;
	}
}

/* The stage that reads what send node i sends: its recv's (the next recv of
 * its tag), else its peer. */
static int send_reader(const Graph *g, int i)
{
	const Node *s = g->nodes[i];
	for (int j = i + 1; j < g->nnodes; j++) {
		const Node *r = g->nodes[j];
		if (r->op == DP_OP_RECV && DP_TAG(r) == DP_TAG(s) && (r->progs & s->progs))
			return node_vstage(r);
	}
	return (int)DP_PEER(s);
}

int stages_wgrad(const Graph *g, const Node *n)
{
	return n->phase == PH_BWD && n->out >= 0 && n->out < g->nvalues &&
	       g->values[n->out]->kind == DP_T_GRAD;
}

void stages_param_stages(const Graph *g, int *stage)
{
	/* owner[v] - 1: the parameter whose gradient v is */
	int *owner = calloc((size_t)g->nvalues + 1, sizeof *owner);
	if (!owner)
		die("out of memory");
	for (int v = 0; v < g->nvalues; v++) {
		stage[v] = -2; /* -2: no user yet */
		if (g->values[v]->grad >= 0 && g->values[v]->grad < g->nvalues)
			owner[g->values[v]->grad] = v + 1;
	}
	/* one walk over the nodes: each value's users, and its gradient's for
	 * its parameter; the result does not depend on the order */
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & (IR_IN_STEP | IR_IN_EVAL)) ||
		    (n->phase != PH_FWD && n->phase != PH_BWD && n->phase != PH_EVAL))
			continue;
		int s = n->block >= 0 && n->block < g->nblocks ? g->blocks[n->block].stage : -1;
		for (int k = -1; k < n->nin; k++) {
			int v = k < 0 ? n->out : n->in[k];
			if (v < 0)
				continue;
			stage[v] = stage[v] == -2 || stage[v] == s ? s : -1;
			if (owner[v]) {
				int p = owner[v] - 1;
				stage[p] = stage[p] == -2 || stage[p] == s ? s : -1;
			}
		}
	}
	for (int v = 0; v < g->nvalues; v++)
		if (stage[v] < 0)
			stage[v] = -1;
	free(owner);
}

int stages_split_params(const Graph *g)
{
	int p = (int)g->cfg.mesh[DP_AXIS_PP];
	return p > 1 && p <= STAGES_MAX_ACCOUNT;
}

int stages_micro_copies(const Graph *g)
{
	int m = (int)(g->cfg.grad_accum ? g->cfg.grad_accum : 1);
	if (g->cfg.mesh[DP_AXIS_PP] <= 1 || m <= 1)
		return 1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->op == DP_OP_LOAD && (n->progs & IR_IN_STEP) && DP_ATTR(n, LOAD, micro) > 0)
			return m;
	}
	return 1;
}

int stages_account(const Graph *g, StageCost *sc)
{
	int p = stages_count(g);
	if (p <= 1 || p > STAGES_MAX_ACCOUNT)
		return 0;
	int *stage = malloc(((size_t)g->nnodes + 1) * sizeof *stage);
	/* per value: the first stage that writes it, and a mask of the stages that
	 * read it in the forward and in the backward (p <= 64) */
	int *def = malloc(((size_t)g->nvalues + 1) * sizeof *def);
	uint64_t *fwd_readers = calloc((size_t)g->nvalues + 1, sizeof *fwd_readers);
	uint64_t *bwd_readers = calloc((size_t)g->nvalues + 1, sizeof *bwd_readers);
	uint64_t *param_users = calloc((size_t)g->nvalues + 1, sizeof *param_users);
	if (!stage || !def || !fwd_readers || !bwd_readers || !param_users)
		die("out of memory");
	memset(sc, 0, (size_t)p * sizeof *sc);
	for (int s = 0; s < p; s++)
		sc[s].first_block = sc[s].last_block = -1;
	for (int b = 0; b < g->nblocks; b++) {
		int s = block_vstage(&g->blocks[b]);
		if (s < 0 || s >= p)
			continue;
		if (sc[s].first_block < 0)
			sc[s].first_block = b;
		sc[s].last_block = b;
	}
	node_stages(g, stage);
	for (int v = 0; v < g->nvalues; v++)
		def[v] = -1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		int s = stage[i];
		if (s < 0)
			continue;
		double f = node_flops(g, n);
		if (n->phase == PH_FWD)
			sc[s].fwd_flops += f;
		else
			sc[s].bwd_flops += f;
		if (stages_wgrad(g, n))
			sc[s].wgrad_flops += f;
		if (n->out >= 0 && def[n->out] < 0 && n->phase == PH_FWD)
			def[n->out] = s;
		/* a send reads for the stage it sends to */
		int rs = n->op == DP_OP_SEND ? send_reader(g, i) : s;
		rs = rs >= 0 && rs < p ? rs : s;
		for (int k = 0; k < n->nin; k++) {
			int v = n->in[k];
			if (v < 0 || v >= g->nvalues)
				continue;
			const Value *pv = g->values[v];
			/* a parameter is read whole (a view of a flat buffer reads its own
			 * range): the stages that use it keep it */
			if (pv->kind == DP_T_PARAM)
				param_users[v] |= 1ull << s;
			if (n->phase == PH_FWD)
				fwd_readers[v] |= 1ull << rs;
			else
				bwd_readers[v] |= 1ull << rs;
		}
	}
	for (int v = 0; v < g->nvalues; v++) {
		const Value *pv = g->values[v];
		int64_t bytes = value_bytes(pv);
		for (int s = 0; s < p; s++) {
			if (param_users[v] & (1ull << s)) {
				sc[s].param_bytes += bytes;
				if (pv->grad >= 0 && pv->grad < g->nvalues)
					sc[s].grad_bytes += value_bytes(g->values[pv->grad]);
			}
		}
		int s = def[v];
		if (s < 0 || pv->kind == DP_T_PARAM)
			continue;
		/* kept for the backward: a forward result the backward of a stage reads
		 * (that stage keeps it, its own or received) */
		for (int t = 0; t < p; t++)
			if (bwd_readers[v] & (1ull << t))
				sc[t].act_bytes += bytes;
		/* sent across every cut between its stage and the last stage that
		 * reads it (a skip over several cuts is sent over each) */
		uint64_t later = s + 1 < 64 ? (fwd_readers[v] | bwd_readers[v]) >> (s + 1) : 0;
		int last = s;
		for (int t = s + 1; later; t++, later >>= 1)
			if (later & 1)
				last = t;
		for (int c = s; c < last && c < p - 1; c++)
			sc[c].send_bytes += bytes;
	}
	/* an unrolled step holds every micro-batch's copy of the work */
	int copies = stages_micro_copies(g);
	for (int t = 0; t < p && copies > 1; t++) {
		sc[t].fwd_flops /= copies, sc[t].bwd_flops /= copies, sc[t].wgrad_flops /= copies;
		sc[t].act_bytes /= copies, sc[t].send_bytes /= copies;
	}
	free(stage), free(def), free(fwd_readers), free(bwd_readers), free(param_users);
	return p;
}

/* The schedule's slots in stage s's order, into o (2m of them): gpipe
 * F0..Fm-1, B0..Bm-1; 1f1b (pipedream_flush) min(p-s-1, m) forwards, then a
 * forward and a backward in turn, then the remaining backwards. */
static void slot_order(int p, int m, int s, int sched, StageSlot *o)
{
	int k = 0, f = 0, b = 0;
	int warm = sched == IR_PIPE_GPIPE ? m : (p - s - 1 < m ? p - s - 1 : m);
	for (; f < warm; f++)
		o[k++] = (StageSlot){STAGE_F, f, 0, 0, s};
	while (f < m || b < m) {
		if (f < m)
			o[k++] = (StageSlot){STAGE_F, f++, 0, 0, s};
		if (sched == IR_PIPE_GPIPE && f < m)
			continue;
		o[k++] = (StageSlot){STAGE_B, b++, 0, 0, s};
	}
}

/* Unit i of rank r's m*v forwards (or backwards) under interleaved: the units
 * go in groups of p micro-batches per virtual stage, the rank's virtual
 * stages in turn (the backwards from the last), so unit i is micro-batch
 * (i / pv) p + i mod p on the rank's virtual stage j = (i mod pv) / p (v-1-j
 * for a backward), which is stage r + j p. */
static StageSlot interleaved_unit(int p, int v, int r, int i, int kind)
{
	int j = (i % (p * v)) / p;
	if (kind == STAGE_B)
		j = v - 1 - j;
	return (StageSlot){kind, (i / (p * v)) * p + i % p, 0, 0, j * p + r};
}

/* interleaved (Megatron's interleaved 1F1B, Narayanan et al. 2021, section
 * 2.2; Megatron-LM's forward_backward_pipelining_with_interleaving): rank r
 * runs min(2(p-r-1) + (v-1)p, mv) forward units first (all of them when m =
 * p), then a forward and a backward in turn, then the backwards left; m is
 * a multiple of p (compiler/lower.c). */
static void interleaved_order(int p, int v, int m, int r, StageSlot *o)
{
	int total = m * v, warm = 2 * (p - r - 1) + (v - 1) * p, k = 0, f = 0, b = 0;
	if (m == p || warm > total)
		warm = total;
	for (; f < warm; f++)
		o[k++] = interleaved_unit(p, v, r, f, STAGE_F);
	for (; f < total; f++) {
		o[k++] = interleaved_unit(p, v, r, f, STAGE_F);
		o[k++] = interleaved_unit(p, v, r, b++, STAGE_B);
	}
	for (; b < total; b++)
		o[k++] = interleaved_unit(p, v, r, b, STAGE_B);
}

/* zero_bubble (ZB-H1, Qi et al. 2023): the backward cut into B (input
 * gradients, what the stage before waits for) and W (weight gradients). A
 * stage that is free runs, in this preference, its next B once its input is
 * there, its next F once its input is there while fewer than min(p-s, m)
 * micro-batches have their F done and their W not (1F1B's peak), else its
 * oldest pending W: the Ws fill the time 1F1B's stage would wait. Each kind
 * in micro-batch order. A discrete-event run: the stage free earliest
 * decides next (what it waits for is then known, or ends later). Fills
 * slots (p x 3m) and returns the makespan, -1 if the stages wait for each
 * other (never). */
static double simulate_zb(const StageCost *sc, int p, int m, StageSlot *slots, double *free_at)
{
	int n = 3 * m;
	double *fdone = malloc((size_t)p * (size_t)m * sizeof *fdone);
	double *bdone = malloc((size_t)p * (size_t)m * sizeof *bdone);
	int *nf = calloc((size_t)p, sizeof *nf), *nb = calloc((size_t)p, sizeof *nb);
	int *nw = calloc((size_t)p, sizeof *nw), *k = calloc((size_t)p, sizeof *k);
	char *waiting = calloc((size_t)p, 1); /* found nothing to do at its free_at */
	if (!fdone || !bdone || !nf || !nb || !nw || !k || !waiting)
		die("out of memory");
	for (size_t i = 0; i < (size_t)p * (size_t)m; i++)
		fdone[i] = bdone[i] = -1;
	for (int left = p * n; left > 0; left--) {
		int s = -1;
		for (int t = 0; t < p; t++)
			if (k[t] < n && (s < 0 || free_at[t] < free_at[s] ||
					 (free_at[t] == free_at[s] && waiting[s] && !waiting[t])))
				s = t;
		double now = free_at[s];
		size_t at = (size_t)s * (size_t)m;
		double bready = -1, fready = -1;
		if (nb[s] < m)
			bready = s == p - 1 ? fdone[at + (size_t)nb[s]] : bdone[at + (size_t)m + (size_t)nb[s]];
		int cap = p - s < m ? p - s : m;
		if (nf[s] < m && nf[s] - nw[s] < cap)
			fready = s == 0 ? 0 : fdone[at - (size_t)m + (size_t)nf[s]];
		StageSlot sl;
		if (bready >= 0 && bready <= now)
			sl = (StageSlot){STAGE_B, nb[s]++, now, now + sc[s].bwd_flops - sc[s].wgrad_flops, s};
		else if (fready >= 0 && fready <= now)
			sl = (StageSlot){STAGE_F, nf[s]++, now, now + sc[s].fwd_flops, s};
		else if (nw[s] < nb[s])
			sl = (StageSlot){STAGE_W, nw[s]++, now, now + sc[s].wgrad_flops, s};
		else {
			/* nothing to do yet: let a stage free as early decide first,
			 * else wait for the next thing that happens */
			left++;
			int other = 0;
			for (int t = 0; t < p; t++)
				other |= t != s && k[t] < n && free_at[t] <= now && !waiting[t];
			waiting[s] = 1;
			if (other)
				continue;
			double next = -1;
			if (bready > now)
				next = bready;
			if (fready > now && (next < 0 || fready < next))
				next = fready;
			for (int t = 0; t < p; t++)
				if (t != s && k[t] < n && free_at[t] > now && (next < 0 || free_at[t] < next))
					next = free_at[t];
			if (next < 0)
				break; /* every other stage waits too */
			free_at[s] = next;
			continue;
		}
		memset(waiting, 0, (size_t)p);
		if (sl.kind == STAGE_F)
			fdone[at + (size_t)sl.mb] = sl.end;
		if (sl.kind == STAGE_B)
			bdone[at + (size_t)sl.mb] = sl.end;
		slots[(size_t)s * (size_t)n + (size_t)k[s]++] = sl;
		free_at[s] = sl.end;
	}
	int done = 1;
	for (int t = 0; t < p; t++)
		done &= k[t] == n;
	free(fdone), free(bdone), free(nf), free(nb), free(nw), free(k), free(waiting);
	return done ? 0 : -1;
}

const char *stages_schedule_name(int sched)
{
	return sched == IR_PIPE_GPIPE		? "gpipe"
	       : sched == IR_PIPE_ZERO_BUBBLE ? "zero_bubble (zb-h1)"
	       : sched == IR_PIPE_INTERLEAVED ? "interleaved (virtual stages)"
					      : "1f1b (pipedream_flush)";
}

int stages_slots_per_stage(int m, int v, int sched)
{
	return (sched == IR_PIPE_ZERO_BUBBLE ? 3 : 2) * m * v;
}

/* The schedule's slots run on each stage (rank) in slot_order's order
 * (interleaved_order's), each as soon as its stage is free and its input
 * has arrived (F from the virtual stage before, B from the one after; p2p
 * taken as free); zero_bubble's as simulate_zb picks them, its B costing
 * the backward's FLOPs but its weight gradients', which its W costs. sc has
 * one entry per virtual stage (p x v; v = 1 but under interleaved).
 * The makespan, in FLOPs, from which bubble = 1 - work / (p x makespan). -1
 * if the order deadlocks (a slot waits for one that waits for it), which the
 * schedules never do. slots (or NULL): p x stages_slots_per_stage, each
 * stage's slots in its order. */
double stages_simulate(const StageCost *sc, int p, int v, int m, int sched, double *bubble,
		       StageSlot *slots)
{
	int n = stages_slots_per_stage(m, v, sched), nc = p * v;
	if (sched == IR_PIPE_ZERO_BUBBLE) {
		StageSlot *own = slots ? slots : malloc((size_t)p * (size_t)n * sizeof *own);
		double *free_at = calloc((size_t)p, sizeof *free_at);
		if (!own || !free_at)
			die("out of memory");
		double span = 0, work = 0;
		int rc = simulate_zb(sc, p, m, own, free_at);
		for (int s = 0; s < p; s++) {
			span = free_at[s] > span ? free_at[s] : span;
			work += (double)m * (sc[s].fwd_flops + sc[s].bwd_flops);
		}
		if (own != slots)
			free(own);
		free(free_at);
		if (rc < 0)
			return -1;
		*bubble = span > 0 ? 1 - work / ((double)p * span) : 0;
		return span;
	}
	StageSlot *order = malloc((size_t)p * (size_t)n * sizeof *order);
	/* per virtual stage and micro-batch: when its F and its B end */
	double *fdone = malloc((size_t)nc * (size_t)m * sizeof *fdone);
	double *bdone = malloc((size_t)nc * (size_t)m * sizeof *bdone);
	int *next = calloc((size_t)p, sizeof *next);
	double *free_at = calloc((size_t)p, sizeof *free_at);
	if (!order || !fdone || !bdone || !next || !free_at)
		die("out of memory");
	for (int s = 0; s < p; s++) {
		if (sched == IR_PIPE_INTERLEAVED)
			interleaved_order(p, v, m, s, order + (size_t)s * (size_t)n);
		else
			slot_order(p, m, s, sched, order + (size_t)s * (size_t)n);
	}
	for (size_t i = 0; i < (size_t)nc * (size_t)m; i++)
		fdone[i] = bdone[i] = -1;
	int left = p * n;
	for (int progress = 1; left && progress;) {
		progress = 0;
		for (int s = 0; s < p; s++) {
			while (next[s] < n) {
				StageSlot sl = order[(size_t)s * (size_t)n + (size_t)next[s]];
				int c = sl.chunk;
				size_t at = (size_t)c * (size_t)m + (size_t)sl.mb;
				double ready, cost;
				if (sl.kind == STAGE_F) {
					ready = c == 0 ? 0 : fdone[at - (size_t)m];
					cost = sc[c].fwd_flops;
				} else {
					ready = c == nc - 1 ? fdone[at] : bdone[at + (size_t)m];
					cost = sc[c].bwd_flops;
				}
				if (ready < 0)
					break;
				double start = ready > free_at[s] ? ready : free_at[s];
				double end = start + cost;
				if (sl.kind == STAGE_F)
					fdone[at] = end;
				else if (sl.kind == STAGE_B)
					bdone[at] = end;
				sl.start = start, sl.end = end;
				if (slots)
					slots[(size_t)s * (size_t)n + (size_t)next[s]] = sl;
				free_at[s] = end;
				next[s]++, left--, progress = 1;
			}
		}
	}
	double span = 0, work = 0;
	for (int s = 0; s < p; s++)
		span = free_at[s] > span ? free_at[s] : span;
	for (int c = 0; c < nc; c++)
		work += (double)m * (sc[c].fwd_flops + sc[c].bwd_flops);
	free(order), free(fdone), free(bdone), free(next), free(free_at);
	if (left)
		return -1;
	*bubble = span > 0 ? 1 - work / ((double)p * span) : 0;
	return span;
}

/* dpc --emit=schedule: the forecast as a timeline, one row per stage (the
 * seed's GPipe chart): each slot drawn over the columns its time covers,
 * F<micro-batch> or B<micro-batch> padded with '-' and ended by a space,
 * idle time '.'; under interleaved one row per rank and F<micro-batch>.<its
 * virtual stage>. Every slot gets at least its label's width and a space, so
 * a slot shorter than that pushes the rest of its row right rather than
 * vanish; the bubble line gives the exact idle fraction. */
void stages_print_schedule(FILE *out, const Graph *g, int width)
{
	int p = (int)g->cfg.mesh[DP_AXIS_PP], m = (int)(g->cfg.grad_accum ? g->cfg.grad_accum : 1);
	int v = ir_chunks_per_rank(g), sched = g->pipeline, n = stages_slots_per_stage(m, v, sched);
	if (p <= 1 || p * v > STAGES_MAX_ACCOUNT) {
		fprintf(out, "%s: pp=%d: %s\n", g->file, p,
			p <= 1 ? "one pipeline stage, nothing to schedule"
			       : "dpc forecasts pipelines of at most 64 stages");
		return;
	}
	StageCost *sc = calloc((size_t)(p * v), sizeof *sc);
	StageSlot *slots = calloc((size_t)p * (size_t)n, sizeof *slots);
	char *row = malloc((size_t)width * 4 + (size_t)n * 16 + 64);
	if (!sc || !slots || !row)
		die("out of memory");
	stages_account(g, sc);
	double bubble = 0, span = stages_simulate(sc, p, v, m, sched, &bubble, slots);
	if (v > 1)
		fprintf(out, "%s: pp=%d x %d virtual stages per rank, %s, %d micro-batch%s; "
			"Fm.c: micro-batch m on virtual stage c; one column = %.4g FLOP\n",
			g->file, p, v, stages_schedule_name(sched), m, m == 1 ? "" : "es", span / width);
	else
		fprintf(out, "%s: pp=%d, %s, %d micro-batch%s; one column = %.4g FLOP\n", g->file, p,
			stages_schedule_name(sched), m, m == 1 ? "" : "es", span / width);
	for (int s = 0; s < p && span > 0; s++) {
		int col = 0;
		for (int k = 0; k < n; k++) {
			const StageSlot *sl = &slots[(size_t)s * (size_t)n + (size_t)k];
			int from = (int)(sl->start / span * width + 0.5);
			int to = (int)(sl->end / span * width + 0.5);
			char label[24];
			int len = v > 1 ? snprintf(label, sizeof label, "%c%d.%d", "FBW"[sl->kind], sl->mb,
						   sl->chunk)
					: snprintf(label, sizeof label, "%c%d", "FBW"[sl->kind], sl->mb);
			while (col < from)
				row[col++] = '.';
			for (int i = 0; i < len; i++)
				row[col++] = label[i];
			while (col < to - 1)
				row[col++] = '-';
			row[col++] = ' '; /* the slot's last column, or one past a short one */
		}
		while (col > 0 && row[col - 1] == ' ')
			col--;
		row[col] = 0;
		fprintf(out, "%s %-2d |%s\n", v > 1 ? "rank" : "stage", s, row);
	}
	int zb = sched == IR_PIPE_ZERO_BUBBLE;
	if (v > 1)
		fprintf(out, "bubble %.4f of the ranks' time idle (closed form (p-1)/(v*m+p-1) = "
			"%.4f)\n", bubble, (double)(p - 1) / (v * m + p - 1));
	else
		fprintf(out, "bubble %.4f of the stages' time idle (closed form (p-1)/(%sm+p-1) = "
			"%.4f)\n", bubble, zb ? "3" : "", (double)(p - 1) / ((zb ? 3 : 1) * m + p - 1));
	free(sc), free(slots), free(row);
}
