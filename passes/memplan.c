/*
 * memplan.c - static memory planning: a device arena per rank, and a host
 * arena when something is offloaded (pass "memplan").
 *
 * Before: the schedule form: final program order with streams and events.
 * No value has an offset yet (offset -1).
 *
 * After:
 * - Persistent values get their own ranges, first, in this order: flat
 *   buffers (flat.params, then flat.grads: value order), non-view params and
 *   grads, optimizer state, data, metrics, buffers. A parameter, gradient,
 *   flat or optimizer-state root that only one pipeline stage's nodes touch
 *   (pp > 1: passes/stage_params.c's parts) comes after those, in the same
 *   order, every stage's from the same offset (never on one rank): the
 *   persistent part is the rest plus the largest stage's. Those in host memory
 *   (passes/offload.c) get theirs in the same order in the host arena (a
 *   stage's own there too from one offset for every stage)
 *   (cfg.host_arena_bytes; 0 when nothing is offloaded); temporaries are
 *   never there. A view gets its root's offset + view_offset * element
 *   size (params, grads, buckets), in its root's arena.
 * - Temporaries (DP_T_ACT roots) share the rest by lifetime: a value lives
 *   from its first use to its last use, in each program separately (STEP
 *   order with the DP_IF_LAST parts included; EVAL; INIT; EXPORT; SAMPLE). A use
 *   through a view counts for its root (full_shard's parameters are views
 *   of gathered temporaries). What the runtime writes before a program
 *   and reads after it (ir_program_io: the sample program's tokens and
 *   logits) lives from its start to its end. Two temporaries may share
 *   bytes only when their lifetimes are disjoint in every program (so the
 *   sample program's own share the step's), or when the nodes of
 *   each run on one pipeline stage, a different one (pp > 1: never on one
 *   rank; the arena is the largest stage's peak).
 *   Placement: by size, largest first (ties: value id), at the lowest
 *   256-aligned offset that overlaps no already placed temporary whose
 *   lifetime intersects (best fit by offset, deterministic).
 * - offset and nbytes (root: size rounded up to 256; view: exact) are set
 *   for every value a node uses and every persistent value; an unused
 *   temporary keeps offset -1, nbytes 0. cfg.arena_bytes = peak_bytes = the
 *   arena size; persistent_bytes = the persistent part.
 *
 * Asynchronous collectives: a collective runs on the comm stream between the
 * compute point its start event was recorded at and the compute point that
 * waits for its done event, not at its place in the list. So every value a
 * collective touches lives, in each program's order, over that whole window:
 * from the record it waits on (or, with no wait, from where the previous
 * collective may start; the comm stream is serial) to the first compute
 * EVENT_WAIT that proves it done: a wait for any event recorded on the comm
 * stream after it, its own or a later collective's (the stream is serial),
 * that runs whenever it runs (or the end of the program when there is none).
 * Persistent gradients make this moot for ddp; gathered parameters and
 * reduce-scatter inputs of later strategies need it. A later record counts
 * because compute never waits for a collective whose result only another
 * collective reads (the export program's gather of a unit's f32 masters over
 * dp_shard, read by the gathers over tp): ending its window at the
 * program's end kept every unit's masters live at once, an arena 6.6x the
 * step's live peak at GPT-3 175B's shape (tp=8 x dp_shard=64, full_shard,
 * checkpointing: 96.8 GiB of temporaries, 17.4 GiB now; docs/SIMULATE.md). At pp > 1 a stage's comm stream runs only its own nodes and
 * every rank's, so the window follows the stage's own events: a recv may
 * fill its buffer as soon as that stage's stream reaches it, before other
 * stages' nodes that come earlier in the one program order (the emulated
 * CUDA backend did, over a temporary still in use, at pp=2 x dp_shard=2).
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define MEM_ALIGN 256

static int64_t align_up(int64_t x)
{
	return (x + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
}

static int64_t value_bytes(const Value *v)
{
	return ir_span(v) * (int64_t)ir_dtype_size(v->dtype);
}

/* Persistent ranks, in arena order; -1: a temporary. */
static int persistent_rank(const Value *v)
{
	switch (v->kind) {
	case DP_T_FLAT:
		return 0;
	case DP_T_PARAM:
		return 1;
	case DP_T_GRAD:
		return 2;
	case DP_T_OPTSTATE:
		return 3;
	case DP_T_DATA:
		return 4;
	case DP_T_METRIC:
		return 5;
	case DP_T_BUFFER:
		return 6;
	case DP_T_ACT:
		return -1;
	}
	return -1;
}

/* Lifetime of a temporary in one program: [first, last] positions, or
 * first > last when the program does not use it. */
typedef struct {
	int first, last;
} Span;

typedef struct {
	int value;
	int64_t bytes;
	Span span[DP_NPROG];
	int stage; /* the one pipeline stage whose nodes use it, -1: several or every
	              rank's, -2: unused so far */
} Temp;

static void extend(Span *s, int lo, int hi)
{
	if (s->first > s->last) {
		s->first = lo;
		s->last = hi;
		return;
	}
	if (lo < s->first)
		s->first = lo;
	if (hi > s->last)
		s->last = hi;
}

static int spans_meet(const Span *a, const Span *b)
{
	return a->first <= a->last && b->first <= b->last && a->first <= b->last &&
	       b->first <= a->last;
}

static int temps_meet(const Temp *a, const Temp *b)
{
	if (a->stage >= 0 && b->stage >= 0 && a->stage != b->stage)
		return 0; /* never on one rank */
	for (int p = 0; p < DP_NPROG; p++)
		if (spans_meet(&a->span[p], &b->span[p]))
			return 1;
	return 0;
}

static int cmp_size_desc(const void *pa, const void *pb)
{
	const Temp *a = pa, *b = pb;
	if (a->bytes != b->bytes)
		return a->bytes > b->bytes ? -1 : 1;
	return a->value - b->value;
}

typedef struct {
	int64_t lo, hi;
} Range;

static int cmp_range(const void *pa, const void *pb)
{
	const Range *a = pa, *b = pb;
	return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Uses of node n: its ins and out, over the positions [lo, hi]. span_of
 * maps a value id to its Temp (or NULL for non-temporaries). */
static void use_node(const Graph *g, const Node *n, int prog, int lo, int hi, Temp **temp_of)
{
	for (int i = -1; i < n->nin; i++) {
		int v = i < 0 ? n->out : n->in[i];
		if (v < 0)
			continue;
		const Value *r = ir_root(g, g->values[v]);
		Temp *t = temp_of[r->id];
		if (!t)
			continue;
		extend(&t->span[prog], lo, hi);
		t->stage = t->stage == -2 || t->stage == n->stage ? n->stage : -1;
	}
}

/* The window [lo, hi] in which each node of the serial async stream `sm`
 * (the comm stream, or the p2p stream of the pipeline's transfers) may run,
 * from the events of the nodes that run on `stage` (-1: every node; else
 * that stage's and every rank's), widened into lo/hi: positions index the
 * program. */
static void stage_windows(const Graph *g, Node **step, int nstep, int stage, int sm, int *rec,
			  int *wait, int *lo, int *hi)
{
	int64_t nev = g->nevents;
	for (int64_t e = 0; e < nev; e++)
		rec[e] = wait[e] = -1;
	for (int i = 0; i < nstep; i++) {
		const Node *n = step[i];
		if (n->op != DP_OP_EVENT_RECORD && n->op != DP_OP_EVENT_WAIT)
			continue;
		if (stage >= 0 && n->stage >= 0 && n->stage != stage)
			continue;
		if (DP_EVENT(n) < 0 || DP_EVENT(n) >= nev)
			die("memplan: event %lld out of range", (long long)DP_EVENT(n));
		if (n->op == DP_OP_EVENT_RECORD && n->stream == DP_STREAM_COMPUTE)
			rec[DP_EVENT(n)] = i;
		if (n->op == DP_OP_EVENT_WAIT && n->stream == DP_STREAM_COMPUTE)
			wait[DP_EVENT(n)] = i;
	}
	/* The end of each node's window, from the back: the comm stream is
	 * serial, so compute waiting for any event recorded on it after a
	 * collective has seen that collective done too (on a GPU by stream
	 * order; on the CPU an event is a comm ticket covering every collective
	 * issued before it). done[f] is the earliest compute wait of an event
	 * recorded on the comm stream at or after position i that runs whenever
	 * a node with flags f does (its conditional flags a subset of f: a wait
	 * that only the last micro-batch runs proves nothing in the others), or
	 * nstep - 1 when there is none (the program's end waits for all). */
	int done[DP_IF_ALL + 1];
	for (unsigned f = 0; f <= DP_IF_ALL; f++)
		done[f] = nstep - 1;
	for (int i = nstep - 1; i >= 0; i--) {
		const Node *n = step[i];
		if (stage >= 0 && n->stage >= 0 && n->stage != stage)
			continue;
		if (n->stream != sm)
			continue;
		if (n->op == DP_OP_EVENT_RECORD) {
			int w = wait[DP_EVENT(n)];
			unsigned rf = n->flags & DP_IF_ALL;
			for (unsigned f = 0; f <= DP_IF_ALL && w >= 0; f++)
				if ((rf & ~f) == 0 && w < done[f])
					done[f] = w;
			continue;
		}
		if (n->op == DP_OP_EVENT_WAIT)
			continue;
		/* the collective: until compute has waited for it */
		int end = done[n->flags & DP_IF_ALL];
		if (end > hi[i])
			hi[i] = end;
	}
	int comm_start = 0; /* the comm stream is serial: a collective starts no
	                       earlier than the one before it */
	int64_t waited = -1; /* record position the comm stream last waited on */
	for (int i = 0; i < nstep; i++) {
		const Node *n = step[i];
		if (stage >= 0 && n->stage >= 0 && n->stage != stage)
			continue;
		if (n->stream != sm)
			continue;
		if (n->op == DP_OP_EVENT_WAIT) {
			int r = rec[DP_EVENT(n)];
			if (r > waited)
				waited = r;
			continue;
		}
		if (waited > comm_start)
			comm_start = (int)waited;
		if (comm_start < lo[i])
			lo[i] = comm_start;
	}
}

/* The STEP-order window [lo, hi] in which each collective may run, from
 * its events (see the top comment). Positions index the STEP program. At
 * pp > 1 each stage's comm stream runs only its own nodes and every rank's,
 * so the windows follow each stage's sequence: a transfer may start as soon
 * as the stage's own comm stream reaches it, however late the other stages'
 * events are in the one program order (the CUDA backend's streams do; the
 * CPU's post it inline). A node every rank runs gets the widest window.
 * The p2p stream (the transfers, passes/p2p.c) is a serial stream of its
 * own: its windows follow its own events the same way. */
static void collective_windows(const Graph *g, Node **step, int nstep, int *lo, int *hi)
{
	int64_t nev = g->nevents;
	int *rec = malloc((size_t)(nev ? nev : 1) * sizeof(int));
	int *wait = malloc((size_t)(nev ? nev : 1) * sizeof(int));
	if (!rec || !wait)
		die("out of memory");
	for (int i = 0; i < nstep; i++)
		lo[i] = hi[i] = i;
	int pp = (int)g->cfg.mesh[DP_AXIS_PP];
	if (pp <= 1)
		stage_windows(g, step, nstep, -1, DP_STREAM_COMM, rec, wait, lo, hi);
	/* the p2p stream's transfers: serial among themselves, beside the comm
	 * stream (a wait of one on the other's event only narrows the window,
	 * so leaving it out is safe) */
	static const int serial[] = {DP_STREAM_COMM, DP_STREAM_P2P};
	for (int s = 0; pp > 1 && s < pp; s++)
		for (int k = 0; k < 2; k++)
			stage_windows(g, step, nstep, s, serial[k], rec, wait, lo, hi);
	free(rec);
	free(wait);
}

/* Every temporary root and its lifetime in each program (see the top
 * comment); temp_of maps a value id to its Temp or NULL. Caller frees both. */
static Temp *temp_spans(const Graph *g, int *ntemps, Temp ***temp_of_out)
{
	int nv = g->nvalues;
	Temp *temps = calloc((size_t)(nv ? nv : 1), sizeof(Temp));
	Temp **temp_of = calloc((size_t)(nv ? nv : 1), sizeof(Temp *));
	Node **prog = malloc((size_t)(g->nnodes ? g->nnodes : 1) * sizeof(Node *));
	int *lo = malloc((size_t)(g->nnodes ? g->nnodes : 1) * sizeof(int));
	int *hi = malloc((size_t)(g->nnodes ? g->nnodes : 1) * sizeof(int));
	if (!temps || !temp_of || !prog || !lo || !hi)
		die("out of memory");
	int nt = 0;
	for (int i = 0; i < nv; i++) {
		const Value *v = g->values[i];
		if (v->view_of < 0 && persistent_rank(v) < 0) {
			temps[nt] = (Temp){.value = i, .bytes = align_up(value_bytes(v)), .stage = -2};
			for (int p = 0; p < DP_NPROG; p++)
				temps[nt].span[p] = (Span){1, 0};
			nt++;
		}
	}
	for (int t = 0; t < nt; t++)
		temp_of[temps[t].value] = &temps[t];
	for (int p = 0; p < DP_NPROG; p++) {
		int np = 0;
		for (int i = 0; i < g->nnodes; i++)
			if (g->nodes[i]->progs & IR_PROG_BIT(p))
				prog[np++] = g->nodes[i];
		collective_windows(g, prog, np, lo, hi);
		for (int i = 0; i < np; i++)
			use_node(g, prog[i], p, lo[i], hi[i], temp_of);
		int io[2];
		ir_program_io(g, p, &io[0], &io[1]);
		for (int k = 0; k < 2; k++) {
			Temp *t = io[k] >= 0 && np ? temp_of[ir_root(g, g->values[io[k]])->id] : NULL;
			if (t)
				extend(&t->span[p], k ? np - 1 : 0, k ? np - 1 : 0);
		}
	}
	free(prog);
	free(lo);
	free(hi);
	*ntemps = nt;
	*temp_of_out = temp_of;
	return temps;
}

/* Per value: the set of pipeline stages (bit k: stage k) whose nodes touch
 * the persistent parameter, gradient, flat or optimizer-state root: one
 * stage for passes/stage_params.c's parts, the stages that read a tied
 * parameter for the tied range; else 0 (every rank: touched by a node of
 * every rank, by none, or another kind; pp > 64). */
uint64_t *mem_persistent_stages(const Graph *g)
{
	uint64_t *set = malloc(((size_t)g->nvalues + 1) * sizeof *set);
	char *every = calloc((size_t)g->nvalues + 1, 1);
	if (!set || !every)
		die("out of memory");
	for (int v = 0; v < g->nvalues; v++)
		set[v] = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		for (int k = -1; k < n->nin; k++) {
			int v = k < 0 ? n->out : n->in[k];
			if (v < 0)
				continue;
			int r = ir_root(g, g->values[v])->id;
			if (n->stage < 0 || n->stage >= 64)
				every[r] = 1;
			else
				set[r] |= (uint64_t)1 << n->stage;
		}
	}
	for (int v = 0; v < g->nvalues; v++) {
		int rank = persistent_rank(g->values[v]);
		if (every[v] || rank < 0 || rank > 3)
			set[v] = 0;
	}
	free(every);
	return set;
}

int mem_run(Graph *g, Diag *d)
{
	(void)d;
	int nv = g->nvalues, p = (int)g->cfg.mesh[DP_AXIS_PP];
	int64_t off = 0, host = 0;
	uint64_t *stage = mem_persistent_stages(g);
	int64_t *at_stage = calloc(2 * ((size_t)p + 1), sizeof *at_stage); /* device, host */
	if (!at_stage)
		die("out of memory");
	/* Persistent roots, by rank then value id; host ones in the host arena;
	 * then those of a set of pipeline stages, each stage's from the same
	 * offset (never on one rank): a root of several stages (the tied range)
	 * where it is free on each of them */
	for (int rank = 0; rank <= 6; rank++)
		for (int i = 0; i < nv; i++) {
			Value *v = g->values[i];
			if (v->view_of < 0 && persistent_rank(v) == rank && !stage[i]) {
				int64_t *at = v->space == DP_SPACE_HOST ? &host : &off;
				v->offset = *at;
				v->nbytes = align_up(value_bytes(v));
				*at += v->nbytes;
			} else if (v->view_of < 0 && persistent_rank(v) < 0 && v->space == DP_SPACE_HOST) {
				die("memplan: %%%s is a temporary in host memory", v->name);
			}
		}
	/* the same per arena: a stage's offloaded optimizer state and host
	 * copies share the host arena's bytes with the other stages' too */
	int64_t staged[2] = {0, 0}, base[2] = {off, host};
	for (int rank = 0; rank <= 6; rank++)
		for (int i = 0; i < nv; i++) {
			Value *v = g->values[i];
			if (v->view_of < 0 && persistent_rank(v) == rank && stage[i]) {
				int h = v->space == DP_SPACE_HOST;
				int64_t *ats = &at_stage[h * (p + 1)];
				if (p < 64 && stage[i] >> p)
					die("memplan: %%%s of stages 0x%llx at pp=%d", v->name,
					    (unsigned long long)stage[i], p);
				int64_t at = 0;
				for (int k = 0; k < p; k++)
					if (stage[i] >> k & 1 && ats[k] > at)
						at = ats[k];
				v->offset = base[h] + at;
				v->nbytes = align_up(value_bytes(v));
				for (int k = 0; k < p; k++)
					if (stage[i] >> k & 1)
						ats[k] = at + v->nbytes;
				if (at + v->nbytes > staged[h])
					staged[h] = at + v->nbytes;
			}
		}
	off += staged[0];
	host += staged[1];
	free(stage);
	free(at_stage);
	g->persistent_bytes = off;
	g->cfg.host_arena_bytes = (uint64_t)host;

	int nt;
	Temp **temp_of;
	Temp *temps = temp_spans(g, &nt, &temp_of);

	/* Place the used temporaries, largest first. */
	qsort(temps, (size_t)nt, sizeof(Temp), cmp_size_desc);
	Range *busy = malloc((size_t)(nt ? nt : 1) * sizeof(Range));
	/* at[u]: temps[u]'s value's offset in the region, -1: none (its
	 * value's, kept beside the temps: the loop below over every earlier
	 * temporary is quadratic, and reading each value through g->values
	 * was most of a compile at GPT-3 175B's shape with cp and pp) */
	int64_t *at_of = malloc((size_t)(nt ? nt : 1) * sizeof *at_of);
	/* lo_of[u], hi_of[u]: the extent of temps[u]'s spans with the programs
	 * laid end to end (program p's position i at p (nnodes + 1) + i): two
	 * temporaries whose extents miss each other meet in no program, a
	 * test that spares temps_meet most pairs */
	int64_t *lo_of = malloc((size_t)(nt ? nt : 1) * sizeof *lo_of);
	int64_t *hi_of = malloc((size_t)(nt ? nt : 1) * sizeof *hi_of);
	if (!busy || !at_of || !lo_of || !hi_of)
		die("out of memory");
	for (int t = 0; t < nt; t++) {
		const Value *w = g->values[temps[t].value];
		at_of[t] = w->offset >= 0 ? w->offset - off : -1;
		lo_of[t] = INT64_MAX, hi_of[t] = INT64_MIN;
		for (int p = 0; p < DP_NPROG; p++) {
			const Span *sp = &temps[t].span[p];
			if (sp->first > sp->last)
				continue;
			if (sp->first < 0 || sp->last > g->nnodes) { /* not a node's place: no filter */
				lo_of[t] = INT64_MIN, hi_of[t] = INT64_MAX;
				break;
			}
			int64_t base = (int64_t)p * ((int64_t)g->nnodes + 1);
			if (base + sp->first < lo_of[t])
				lo_of[t] = base + sp->first;
			if (base + sp->last > hi_of[t])
				hi_of[t] = base + sp->last;
		}
	}
	int64_t top = 0; /* end of the temporaries' region, relative */
	for (int t = 0; t < nt; t++) {
		Temp *a = &temps[t];
		Value *v = g->values[a->value];
		int used = 0;
		for (int p = 0; p < DP_NPROG; p++)
			used |= a->span[p].first <= a->span[p].last;
		if (!used)
			continue;
		int nb = 0;
		for (int u = 0; u < t; u++)
			if (at_of[u] >= 0 && lo_of[u] <= hi_of[t] && lo_of[t] <= hi_of[u] &&
			    temps_meet(a, &temps[u]))
				busy[nb++] = (Range){at_of[u], at_of[u] + temps[u].bytes};
		qsort(busy, (size_t)nb, sizeof(Range), cmp_range);
		int64_t at = 0;
		for (int b = 0; b < nb; b++) {
			if (busy[b].lo >= at + a->bytes)
				break; /* fits in the gap before this range */
			if (busy[b].hi > at)
				at = busy[b].hi;
		}
		v->offset = off + at;
		at_of[t] = at;
		v->nbytes = a->bytes;
		if (at + a->bytes > top)
			top = at + a->bytes;
	}
	free(busy);
	free(at_of);
	free(lo_of);
	free(hi_of);
	free(temps);
	free(temp_of);

	/* Views: root offset + element offset. */
	for (int i = 0; i < nv; i++) {
		Value *v = g->values[i];
		if (v->view_of < 0)
			continue;
		const Value *r = ir_root(g, v);
		int64_t eoff = 0;
		for (const Value *w = v; w->view_of >= 0; w = g->values[w->view_of])
			eoff += w->view_offset;
		if (r->offset < 0)
			continue; /* view of an unused temporary */
		v->offset = r->offset + eoff * (int64_t)ir_dtype_size(v->dtype);
		v->nbytes = value_bytes(v);
	}
	g->peak_bytes = off + top;
	g->cfg.arena_bytes = (uint64_t)g->peak_bytes;
	return 0;
}

/* What a temporary root holds: parameters gathered by an all_gather,
 * unsharded gradients (a reduce_scatter's input), or activations. */
static int temp_class(const Graph *g, int v)
{
	int cls = MEM_ACTIVATIONS;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->op == DP_OP_ALL_GATHER && n->out >= 0 && ir_root(g, g->values[n->out])->id == v)
			return MEM_GATHERED;
		if (n->op == DP_OP_REDUCE_SCATTER && n->nin > 0 && n->in[0] >= 0 &&
		    ir_root(g, g->values[n->in[0]])->id == v)
			cls = MEM_UNSHARDED_GRADS;
	}
	return cls;
}

int64_t mem_live_peak(const Graph *g, int prog, int64_t split[MEM_NCLASS])
{
	int nt;
	Temp **temp_of;
	Temp *temps = temp_spans(g, &nt, &temp_of);
	int np = 0;
	for (int i = 0; i < g->nnodes; i++)
		np += (g->nodes[i]->progs & IR_PROG_BIT(prog)) != 0;
	int *cls = malloc((size_t)(nt ? nt : 1) * sizeof(int));
	if (!cls)
		die("out of memory");
	for (int t = 0; t < nt; t++)
		cls[t] = temp_class(g, temps[t].value);
	int64_t best = -1;
	for (int c = 0; c < MEM_NCLASS; c++)
		split[c] = 0;
	for (int pos = 0; pos < np; pos++) {
		int64_t now[MEM_NCLASS] = {0}, sum = 0;
		for (int t = 0; t < nt; t++) {
			const Span *sp = &temps[t].span[prog];
			if (sp->first <= pos && pos <= sp->last) {
				now[cls[t]] += temps[t].bytes;
				sum += temps[t].bytes;
			}
		}
		if (sum > best) {
			best = sum;
			memcpy(split, now, sizeof now);
		}
	}
	free(cls);
	free(temps);
	free(temp_of);
	return best < 0 ? 0 : best;
}
