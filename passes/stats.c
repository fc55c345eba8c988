/*
 * stats.c - the --stats table: communication, compute and memory per rank
 * for one optimizer step, read off the final (memory-planned) graph.
 *
 * Collectives: one row per (kind, axis set): calls, buckets, buffer bytes S
 * and bus bytes, per rank, per optimizer step. DP_IF_LAST nodes run once per
 * optimizer step, the others once per micro-batch (x grad_accum; at pp the
 * step program holds each micro-batch's own copy, passes/unroll.c). Bus bytes
 * follow nccl-tests: all_reduce 2(n-1)/n * S, all_gather and reduce_scatter
 * (n-1)/n * S, where S is the whole (unsharded) buffer and n the number of
 * ranks in the axis group; a group of one rank moves nothing.
 *
 * FLOPs: the op registry's cost rule over the STEP program, with the same
 * multiplicities. Bytes follow each value's dtype (bf16 gathers move half of
 * f32's). Memory: the arena split by what the persistent ranges hold (with
 * mixed precision, "parameters" are the f32 masters, and f32 params a block
 * computes in, and the bf16 compute copies are a row of their own),
 * and the temporaries' region; the rows without indent add up to the arena
 * size. Under the region: the temporaries live at the step program's peak
 * (passes/memplan.c's lifetimes), split into activations, gathered
 * parameters (full_shard's all_gather buffers) and unsharded gradients
 * (reduce_scatter inputs); the region exceeds the live peak by whatever
 * fragmentation the placement left. At pp > 1 with each stage keeping its
 * own parameters (passes/stage_params.c) the persistent rows are the largest
 * stage's (the one that sets the arena), and the pipeline section prints
 * under each stage what its ranks hold (`held:`).
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* "1.50 MiB" */
const char *stats_human_bytes(char *buf, size_t len, double b)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;
	while (b >= 1024 && u < 4) {
		b /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", b, units[u]);
	return buf;
}

/* "12.3 MFLOP" */
const char *stats_human_flops(char *buf, size_t len, double f)
{
	static const char *const units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
	int u = 0;
	while (f >= 1000 && u < 5) {
		f /= 1000;
		u++;
	}
	snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", f, units[u]);
	return buf;
}

/* "991064 (967.84 KiB)": exact, then readable. */
static const char *bytes_cell(char *buf, size_t len, double b)
{
	char h[32];
	snprintf(buf, len, "%.0f (%s)", b, stats_human_bytes(h, sizeof h, b));
	return buf;
}

static const char *flops_cell(char *buf, size_t len, double f)
{
	char h[32];
	snprintf(buf, len, "%.0f (%s)", f, stats_human_flops(h, sizeof h, f));
	return buf;
}

static void axes_text(char *buf, size_t len, unsigned mask)
{
	buf[0] = 0;
	size_t k = 0;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (mask & DP_AXIS_BIT(a))
			k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%s%s", k ? "," : "",
					      ir_axis_names[a]);
	if (!k)
		snprintf(buf, len, "-");
}

int stats_group_ranks(const Graph *g, unsigned mask)
{
	int n = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (mask & DP_AXIS_BIT(a))
			n *= (int)g->cfg.mesh[a];
	return n;
}

double stats_coll_bytes(const Graph *g, const Node *n)
{
	const Value *v = g->values[n->op == DP_OP_REDUCE_SCATTER ? n->in[0] : n->out];
	return (double)ir_numel(v) * (double)ir_dtype_size(v->dtype);
}

int stats_node_ranks(const Graph *g, const Node *n)
{
	int ranks = stats_group_ranks(g, (unsigned)DP_AXES(n));
	uint64_t set = n->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(n, ALL_REDUCE, stages) : 0;
	if (set && g->cfg.mesh[DP_AXIS_PP] > 0) /* a sub-group of the stages */
		ranks = ranks / (int)g->cfg.mesh[DP_AXIS_PP] * __builtin_popcountll(set);
	return ranks;
}

double stats_bus_factor(IrOp op, int n)
{
	if (n <= 1)
		return 0;
	return op == DP_OP_ALL_REDUCE || op == DP_OP_TP_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

typedef struct {
	IrOp op;
	unsigned axes;
	uint64_t stages; /* an all_reduce over a sub-group of the pp stages, else 0 */
	int ranks;
	double calls, bytes, bus;
	int buckets;
} Row;

static void print_collectives(FILE *out, const Graph *g, double accum)
{
	Row rows[(4 << DP_MAX_AXES) + 16]; /* one per (collective op, axis mask), and per
					    sub-group of the stages */
	int nrows = 0;
	double plain = 0, plain_bus = 0;
	char *seen_bucket = calloc((size_t)g->nbuckets + 1, 1);
	if (!seen_bucket)
		die("out of memory");
	int unrolled = stages_micro_copies(g) > 1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		/* a pipeline's sends and receives are per stage: the pipeline
		 * section's bytes over each cut */
		if (!dp_is_collective(n->op) || !(n->progs & IR_IN_STEP) || n->op == DP_OP_SEND ||
		    n->op == DP_OP_RECV)
			continue;
		/* compression: the table is the compressed steps'; the plain
		 * all_reduces before start_step are a line of their own */
		if (n->flags & DP_IF_PLAIN) {
			double s = stats_coll_bytes(g, n);
			plain += s;
			plain_bus += s * stats_bus_factor(n->op, stats_group_ranks(g, (unsigned)DP_AXES(n)));
			continue;
		}
		unsigned axes = (unsigned)DP_AXES(n);
		uint64_t set = n->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(n, ALL_REDUCE, stages) : 0;
		int r = 0;
		while (r < nrows && !(rows[r].op == n->op && rows[r].axes == axes && rows[r].stages == set))
			r++;
		if (r == nrows) {
			if (nrows == (int)(sizeof rows / sizeof rows[0]))
				die("stats: too many collective kinds");
			rows[nrows++] = (Row){n->op, axes, set, stats_node_ranks(g, n), 0, 0, 0, 0};
		}
		/* at pp the step program holds every micro-batch's copy
		 * (passes/unroll.c): each node runs once */
		double mult = (n->flags & DP_IF_LAST) || unrolled ? 1 : accum;
		double s = stats_coll_bytes(g, n);
		rows[r].calls += mult;
		rows[r].bytes += mult * s;
		rows[r].bus += mult * s * stats_bus_factor(n->op, rows[r].ranks);
		if (n->bucket >= 0 && n->bucket < g->nbuckets && !seen_bucket[n->bucket]) {
			seen_bucket[n->bucket] = 1;
			rows[r].buckets++;
		}
	}
	free(seen_bucket);
	char ax[64], c1[64], c2[64];
	fprintf(out, "%-14s %-22s %5s %6s %7s %24s %24s\n", "collective", "axes", "ranks", "calls",
		"buckets", "bytes", "bus bytes");
	double tb = 0, tbus = 0, tcalls = 0;
	for (int r = 0; r < nrows; r++) {
		axes_text(ax, sizeof ax, rows[r].axes);
		for (int k = 0, first = 1; k < 64 && rows[r].stages; k++) /* pp's sub-group */
			if (rows[r].stages >> k & 1) {
				size_t at = strlen(ax);
				snprintf(ax + at, sizeof ax - at, "%s%d", first ? " stages=" : ",", k);
				first = 0;
			}
		fprintf(out, "%-14s %-22s %5d %6.0f %7d %24s %24s\n", ir_ops[rows[r].op].name, ax,
			rows[r].ranks, rows[r].calls, rows[r].buckets,
			bytes_cell(c1, sizeof c1, rows[r].bytes), bytes_cell(c2, sizeof c2, rows[r].bus));
		tb += rows[r].bytes;
		tbus += rows[r].bus;
		tcalls += rows[r].calls;
	}
	if (!nrows)
		fprintf(out, "(no collectives)\n");
	fprintf(out, "%-14s %-22s %5s %6.0f %7s %24s %24s\n", "total", "", "", tcalls, "",
		bytes_cell(c1, sizeof c1, tb), bytes_cell(c2, sizeof c2, tbus));
	if (g->cfg.compress != DP_COMPRESS_NONE)
		fprintf(out, "%-51s %24s %24s\n",
			ir_fmt((Graph *)g, "(%s from step %u; before it all_reduce)",
			       dp_kind_name(DP_SET_COMPRESS, (int)g->cfg.compress), g->cfg.compress_start),
			bytes_cell(c1, sizeof c1, plain), bytes_cell(c2, sizeof c2, plain_bus));
}

static void print_flops(FILE *out, const Graph *g, double accum)
{
	double micro = 0, last = 0, again = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || !ir_ops[n->op].cost || (n->flags & DP_IF_PLAIN))
			continue;
		double f = 0, b = 0;
		ir_ops[n->op].cost(g, n, &f, &b);
		if (n->flags & DP_IF_LAST)
			last += f;
		else
			micro += f;
		if (n->recompute)
			again += f;
	}
	int copies = stages_micro_copies(g); /* a pipelined step holds every micro-batch */
	micro /= copies, again /= copies;
	char c[64], label[64];
	fprintf(out, "%-36s %30s\n", "compute", "flops");
	fprintf(out, "%-36s %30s\n", "micro-batch (forward + backward)",
		flops_cell(c, sizeof c, micro));
	if (again > 0) /* only with recompute: the other tables stay as they were */
		fprintf(out, "%-36s %30s\n", "  of which recompute (forward again)",
			flops_cell(c, sizeof c, again));
	fprintf(out, "%-36s %30s\n", "once per step (clip + optimizer)",
		flops_cell(c, sizeof c, last));
	snprintf(label, sizeof label, "optimizer step (%g micro-batch%s)", accum,
		 accum == 1 ? "" : "es");
	fprintf(out, "%-36s %30s\n", label, flops_cell(c, sizeof c, micro * accum + last));
}

enum { M_PARAMS, M_COPIES, M_GRADS, M_OPT, M_COMPRESS, M_DATA, M_METRICS, M_NCAT };

/* What a persistent root holds. A flat buffer is named by its views; a
 * host copy (%NAME.host, passes/offload.c) by its device original's, unless
 * that is a temporary (a reduce_scatter's result staged on the host: a
 * gradient). */
static int category(const Graph *g, const Value *v)
{
	size_t len = strlen(v->name);
	if (v->space == DP_SPACE_HOST && len > 5 && strcmp(v->name + len - 5, ".host") == 0)
		for (int i = 0; i < g->nvalues; i++)
			if (g->values[i]->space != DP_SPACE_HOST && g->values[i]->kind != DP_T_ACT &&
			    strncmp(g->values[i]->name, v->name, len - 5) == 0 &&
			    g->values[i]->name[len - 5] == 0)
				return category(g, g->values[i]);
	switch (v->kind) {
	case DP_T_PARAM:
		return dp_is_half(v->dtype) ? M_COPIES : M_PARAMS;
	case DP_T_GRAD:
		return M_GRADS;
	case DP_T_OPTSTATE:
		return M_OPT;
	case DP_T_DATA:
		return M_DATA;
	case DP_T_FLAT:
		for (int i = 0; i < g->nvalues; i++) {
			if (g->values[i]->view_of == v->id && g->values[i]->kind == DP_T_PARAM)
				return dp_is_half(v->dtype) ? M_COPIES : M_PARAMS;
			if (g->values[i]->view_of == v->id && g->values[i]->kind == DP_T_OPTSTATE)
				return M_COMPRESS; /* passes/compress.c's P, Q and errors */
		}
		return M_GRADS;
	default:
		return M_METRICS;
	}
}

static const char *const memory_names[M_NCAT] = {"parameters", "parameters, 16-bit copies",
						  "gradients", "optimizer state", "compression state",
						  "data", "metrics"};

/* The persistent bytes a rank of stage s holds (s = -1: pp = 1, or the
 * ranks of every stage: the roots of every rank only), by category, in
 * the device arena (bytes) and the host arena (host). */
static void held_bytes(const Graph *g, const uint64_t *stage, int s, double *bytes, double *host)
{
	for (int c = 0; c < M_NCAT; c++)
		bytes[c] = host[c] = 0;
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (v->view_of < 0 && v->kind != DP_T_ACT && v->offset >= 0 &&
		    (!stage[i] || (s >= 0 && s < 64 && stage[i] >> s & 1)))
			(v->space == DP_SPACE_HOST ? host : bytes)[category(g, v)] += (double)v->nbytes;
	}
}

/* The stage whose own persistent roots (a tied range on each stage that
 * keeps it) are the largest (they set the arena), or -1 when no stage has
 * any (pp = 1, or every stage keeps every parameter). */
static int largest_stage(const Graph *g, const uint64_t *stage)
{
	int p = (int)g->cfg.mesh[DP_AXIS_PP], best = -1;
	double most = 0;
	for (int s = 0; s < p; s++) {
		double sum = 0;
		for (int i = 0; i < g->nvalues; i++)
			if (s < 64 && stage[i] >> s & 1 && g->values[i]->view_of < 0)
				sum += (double)g->values[i]->nbytes;
		if (sum > most)
			most = sum, best = s;
	}
	return best;
}

/* The persistent bytes of each arena by what they hold, on a rank of the
 * largest stage. */
static void memory_rows(const Graph *g, double bytes[M_NCAT], double host[M_NCAT])
{
	uint64_t *stage = mem_persistent_stages(g);
	held_bytes(g, stage, largest_stage(g, stage), bytes, host);
	free(stage);
}

/* --device-memory: does one rank's device arena (peak_bytes: the largest
 * stage's at pp > 1) fit the budget? */
static void print_budget(FILE *out, const Graph *g, int64_t budget)
{
	char c1[64], h[32];
	int fits = g->peak_bytes <= budget;
	snprintf(c1, sizeof c1, "%s: %s, %.0f%%", stats_human_bytes(h, sizeof h, (double)budget),
		 fits ? "fits" : "does not fit", 100.0 * (double)g->peak_bytes / (double)budget);
	fprintf(out, "%-36s %30s\n", "device memory (--device-memory)", c1);
}

static void print_memory(FILE *out, const Graph *g, int64_t budget)
{
	const char *const *names = memory_names;
	double bytes[M_NCAT], host[M_NCAT];
	memory_rows(g, bytes, host);
	char c1[64];
	fprintf(out, "%-36s %30s\n", "memory (arena)", "bytes");
	for (int c = 0; c < M_NCAT; c++)
		if ((c != M_COPIES && c != M_COMPRESS) || bytes[c] > 0) /* mixed precision,
									    compression only */
			fprintf(out, "%-36s %30s\n", names[c], bytes_cell(c1, sizeof c1, bytes[c]));
	double act = (double)(g->peak_bytes - g->persistent_bytes);
	fprintf(out, "%-36s %30s\n", "temporaries (arena region)", bytes_cell(c1, sizeof c1, act));
	int64_t split[MEM_NCLASS];
	int64_t live = mem_live_peak(g, DP_PROG_STEP, split);
	static const char *const cls[MEM_NCLASS] = {"  activations", "  gathered parameters",
						     "  unsharded gradients"};
	fprintf(out, "%-36s %30s\n", "  live at the step's peak", bytes_cell(c1, sizeof c1, (double)live));
	for (int c = 0; c < MEM_NCLASS; c++)
		fprintf(out, "%-36s %30s\n", cls[c], bytes_cell(c1, sizeof c1, (double)split[c]));
	if (g->metrics.sample_logits >= 0) { /* its own, in the same region (passes/sample.c) */
		int64_t sample = mem_live_peak(g, DP_PROG_SAMPLE, split);
		fprintf(out, "%-36s %30s\n", "  live at the sample program's peak",
			bytes_cell(c1, sizeof c1, (double)sample));
	}
	/* the region holds every program's own: its floor is the largest
	 * program's live peak (the init and export programs' whole parameters,
	 * full_shard's gathered units, can pass the step's) */
	int64_t most = 0;
	int most_prog = DP_PROG_STEP;
	for (int p = 0; p < DP_NPROG; p++) {
		int64_t at = mem_live_peak(g, p, split);
		if (at > most) {
			most = at;
			most_prog = p;
		}
	}
	char label[64];
	snprintf(label, sizeof label, "  live at any program's peak (%s)", dp_prog_names[most_prog]);
	fprintf(out, "%-36s %30s\n", label, bytes_cell(c1, sizeof c1, (double)most));
	fprintf(out, "%-36s %30s\n", "total (arena size)",
		bytes_cell(c1, sizeof c1, (double)g->peak_bytes));
	if (budget > 0)
		print_budget(out, g, budget);
	if (!g->cfg.host_arena_bytes)
		return;
	/* offload (passes/offload.c): the pinned host arena, persistent only */
	fprintf(out, "\n%-36s %30s\n", "memory (host arena, offload)", "bytes");
	for (int c = 0; c < M_NCAT; c++)
		if (host[c] > 0) {
			snprintf(label, sizeof label, "host %s", names[c]);
			fprintf(out, "%-36s %30s\n", label, bytes_cell(c1, sizeof c1, host[c]));
		}
	fprintf(out, "%-36s %30s\n", "total (host arena size)",
		bytes_cell(c1, sizeof c1, (double)g->cfg.host_arena_bytes));
	/* the copies between the arenas an optimizer step runs: a STEP node
	 * once per micro-batch, a DP_IF_LAST or DP_IF_FIRST one once */
	double d2h = 0, h2d = 0, accum = g->cfg.grad_accum ? g->cfg.grad_accum : 1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || (n->op != DP_OP_D2H && n->op != DP_OP_H2D))
			continue;
		const Value *v = g->values[n->out];
		double b = (double)ir_numel(v) * (double)ir_dtype_size(v->dtype) *
			   (n->flags & (DP_IF_LAST | DP_IF_FIRST) ? 1 : accum);
		*(n->op == DP_OP_D2H ? &d2h : &h2d) += b;
	}
	fprintf(out, "%-36s %30s\n", "copies per step, device to host", bytes_cell(c1, sizeof c1, d2h));
	fprintf(out, "%-36s %30s\n", "copies per step, host to device", bytes_cell(c1, sizeof c1, h2d));
	/* offload params: each reader's H2D of a host parameter into a device
	 * temporary (passes/offload.c's params_in), once per micro-batch the
	 * reader runs in; against copying each parameter once per step and
	 * keeping it on the device for the step (what `offload optimizer`
	 * does with the 16-bit copy), which costs its bytes of device memory
	 * for the whole step: the trade, said, not made (docs/OFFLOAD.md) */
	double pin = 0, held = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || n->op != DP_OP_H2D || n->stream != DP_STREAM_COPY ||
		    n->out < 0 || ir_root(g, g->values[n->out])->kind != DP_T_ACT ||
		    ir_root(g, g->values[n->out])->space == DP_SPACE_HOST)
			continue;
		const Value *v = g->values[n->out];
		double b = (double)ir_numel(v) * (double)ir_dtype_size(v->dtype);
		pin += b * (n->flags & (DP_IF_LAST | DP_IF_FIRST) ? 1 : accum);
		int seen = 0;
		for (int j = 0; j < i && !seen; j++) {
			const Node *q = g->nodes[j];
			seen = (q->progs & IR_IN_STEP) && q->op == DP_OP_H2D &&
			       q->stream == DP_STREAM_COPY && q->in[0] == n->in[0] &&
			       q->out >= 0 && ir_root(g, g->values[q->out])->kind == DP_T_ACT &&
			       ir_root(g, g->values[q->out])->space != DP_SPACE_HOST;
		}
		if (!seen)
			held += b;
	}
	if (pin > 0) {
		fprintf(out, "%-36s %30s\n", "  of which parameters, per reader",
			bytes_cell(c1, sizeof c1, pin));
		fprintf(out, "%-36s %30s\n", "  the same, once a step", bytes_cell(c1, sizeof c1, held));
		fprintf(out, "%-36s %30s\n", "  which keeps on the device", bytes_cell(c1, sizeof c1, held));
	}
}

/* The step program's temporaries live at its peak on each pipeline stage:
 * a temporary lives from its first use to its last in program order, on the
 * stage whose nodes use it (on every stage when nodes of several, or of
 * every rank, do). peak[0..p-1]. */
static void stage_temp_peaks(const Graph *g, int p, int64_t *peak)
{
	int nv = g->nvalues, n = g->nnodes;
	int *first = malloc(((size_t)nv + 1) * sizeof *first);
	int *last = malloc(((size_t)nv + 1) * sizeof *last);
	int *stage = malloc(((size_t)nv + 1) * sizeof *stage);
	int64_t *diff = calloc((size_t)p * ((size_t)n + 2), sizeof *diff);
	if (!first || !last || !stage || !diff)
		die("out of memory");
	for (int v = 0; v < nv; v++)
		first[v] = last[v] = -1, stage[v] = -2;
	int pos = 0;
	for (int i = 0; i < n; i++) {
		const Node *nd = g->nodes[i];
		if (!(nd->progs & IR_IN_STEP))
			continue;
		for (int k = -1; k < nd->nin; k++) {
			int v = k < 0 ? nd->out : nd->in[k];
			if (v < 0)
				continue;
			const Value *r = ir_root(g, g->values[v]);
			if (r->kind != DP_T_ACT)
				continue;
			if (first[r->id] < 0)
				first[r->id] = pos;
			last[r->id] = pos;
			stage[r->id] = stage[r->id] == -2 || stage[r->id] == nd->stage ? nd->stage : -1;
		}
		pos++;
	}
	for (int v = 0; v < nv; v++) {
		if (first[v] < 0)
			continue;
		int64_t b = ir_numel(g->values[v]) * (int64_t)ir_dtype_size(g->values[v]->dtype);
		for (int s = 0; s < p; s++)
			if (stage[v] < 0 || stage[v] == s) {
				diff[(size_t)s * ((size_t)n + 2) + (size_t)first[v]] += b;
				diff[(size_t)s * ((size_t)n + 2) + (size_t)last[v] + 1] -= b;
			}
	}
	for (int s = 0; s < p; s++) {
		int64_t live = 0;
		peak[s] = 0;
		for (int i = 0; i <= pos; i++) {
			live += diff[(size_t)s * ((size_t)n + 2) + (size_t)i];
			peak[s] = live > peak[s] ? live : peak[s];
		}
	}
	free(first), free(last), free(stage), free(diff);
}

/* What stage s's ranks hold (passes/stage_params.c): its own parameters and
 * the tied ones, their gradients and optimizer state (and compression's
 * state, on a line of its own). */
static void print_held(FILE *out, const Graph *g, const uint64_t *own, int split, int s)
{
	char h1[32], h2[32], h3[32];
	if (!split)
		return;
	double held[M_NCAT], host[M_NCAT];
	held_bytes(g, own, s, held, host);
	double all = 0;
	for (int c = 0; c < M_NCAT; c++)
		all += held[c] + host[c];
	fprintf(out, "  held: params %.0f B (%s), grads %.0f B, optimizer state %.0f B (%s); "
		"persistent in all %.0f B (%s), beside its temporaries (compiled: below)\n",
		held[M_PARAMS] + held[M_COPIES],
		stats_human_bytes(h1, sizeof h1, held[M_PARAMS] + held[M_COPIES]), held[M_GRADS],
		held[M_OPT], stats_human_bytes(h2, sizeof h2, held[M_OPT]), all,
		stats_human_bytes(h3, sizeof h3, all));
	if (held[M_COMPRESS] > 0) /* passes/compress.c's P, Q and errors, the stage's own */
		fprintf(out, "  held compression state: %.0f B (%s)\n", held[M_COMPRESS],
			stats_human_bytes(h1, sizeof h1, held[M_COMPRESS]));
	double in_host = 0;
	for (int c = 0; c < M_NCAT; c++)
		in_host += host[c];
	if (in_host > 0) /* offload: its own part of the host arena (and the tied range) */
		fprintf(out, "  held in host memory: params %.0f B, grads %.0f B, optimizer state "
			"%.0f B (%s); %.0f B (%s) in all\n", host[M_PARAMS] + host[M_COPIES],
			host[M_GRADS], host[M_OPT], stats_human_bytes(h2, sizeof h2, host[M_OPT]), in_host,
			stats_human_bytes(h3, sizeof h3, in_host));
}

/* What the step file runs (passes/unroll.c): the schedule's slots, every
 * micro-batch's temporaries apart while it is in flight. */
static void print_compiled_peaks(FILE *out, const Graph *g, int p, int split)
{
	char h1[32];
	int64_t *peak = malloc((size_t)p * sizeof *peak);
	if (!peak)
		die("out of memory");
	stage_temp_peaks(g, p, peak);
	fprintf(out, "compiled: every micro-batch in the step program, in the schedule's order; "
		"temporaries at the peak:");
	for (int s = 0; s < p; s++)
		fprintf(out, " stage %d %lld B (%s)%s", s, (long long)peak[s],
			stats_human_bytes(h1, sizeof h1, (double)peak[s]), s + 1 < p ? "," : "");
	fprintf(out, split ? "; each stage keeps its own parameters, the tied ones on the stages "
			     "that read them, summed over those\n"
			   : "; every stage keeps every parameter, gradients summed over pp\n");
	free(peak);
}

/* Interleaved: each virtual stage's blocks, work, memory and sends per
 * micro-batch, then each rank's activations at its peak: the virtual
 * stages' micro-batches its order (passes/stages.c) has forwarded and not
 * yet backwarded, at most min(2(p-r-1) + (v-1)p + 1, mv) of them (Megatron's
 * warm-up and one more; every one of them, mv, when m = p). */
static void print_interleaved(FILE *out, const Graph *g, const StageCost *sc, int p, int v, int m,
			      const uint64_t *own, int split)
{
	char h1[32], h2[32], h3[32];
	for (int c = 0; c < p * v; c++) {
		const StageCost *x = &sc[c];
		fprintf(out, "stage %d (rank %d): blocks %s..%s, %.0f FLOP forward + %.0f FLOP backward "
			"per micro-batch, params %lld B (%s), grads %lld B, activations %lld B (%s) per "
			"micro-batch, sends %lld B (%s) per micro-batch\n",
			c, c % p, x->first_block >= 0 ? g->blocks[x->first_block].name : "-",
			x->last_block >= 0 ? g->blocks[x->last_block].name : "-", x->fwd_flops,
			x->bwd_flops, (long long)x->param_bytes,
			stats_human_bytes(h1, sizeof h1, (double)x->param_bytes), (long long)x->grad_bytes,
			(long long)x->act_bytes, stats_human_bytes(h2, sizeof h2, (double)x->act_bytes),
			(long long)x->send_bytes, stats_human_bytes(h3, sizeof h3, (double)x->send_bytes));
	}
	int n = stages_slots_per_stage(m, v, g->pipeline);
	StageSlot *slots = calloc((size_t)p * (size_t)n, sizeof *slots);
	if (!slots)
		die("out of memory");
	double bubble;
	int ok = stages_simulate(sc, p, v, m, g->pipeline, &bubble, slots) >= 0;
	for (int r = 0; r < p && ok; r++) {
		int64_t live = 0, top = 0;
		int fly = 0, most = 0;
		for (int k = 0; k < n; k++) {
			const StageSlot *sl = &slots[(size_t)r * (size_t)n + (size_t)k];
			int sign = sl->kind == STAGE_F ? 1 : -1;
			live += sign * sc[sl->chunk].act_bytes, fly += sign;
			top = live > top ? live : top, most = fly > most ? fly : most;
		}
		int closed = m == p ? m * v : 2 * (p - r - 1) + (v - 1) * p + 1;
		closed = closed < m * v ? closed : m * v;
		fprintf(out, "rank %d: stages", r);
		for (int j = 0; j < v; j++)
			fprintf(out, "%s %d", j ? "," : "", j * p + r);
		fprintf(out, "; activations at the peak: %d stage-micro-batches in flight (closed form "
			"%d) = %lld B (%s)\n", most, closed, (long long)top,
			stats_human_bytes(h1, sizeof h1, (double)top));
		print_held(out, g, own, split, r);
	}
	free(slots);
}

/* pp > 1: each stage's blocks, work, memory and sends per micro-batch, the
 * activations the schedule keeps at its peak (gpipe: every micro-batch; 1f1b:
 * stage s at most p - s, zero_bubble too), and the bubble in closed form and from the stages'
 * FLOPs (passes/stages.c). */
static void print_pipeline(FILE *out, const Graph *g)
{
	int p = (int)g->cfg.mesh[DP_AXIS_PP], m = (int)(g->cfg.grad_accum ? g->cfg.grad_accum : 1);
	if (p <= 1)
		return;
	int v = ir_chunks_per_rank(g);
	StageCost *sc = calloc((size_t)(p * v), sizeof *sc);
	if (!sc)
		die("out of memory");
	if (!stages_account(g, sc)) {
		fprintf(out, "\npipeline pp=%d: dpc forecasts pipelines of at most %d stages\n", p,
			STAGES_MAX_ACCOUNT);
		free(sc);
		return;
	}
	int gpipe = g->pipeline == IR_PIPE_GPIPE;
	char h1[32], h2[32], h3[32];
	fprintf(out, "\npipeline pp=%d, schedule %s, %d micro-batch%s (grad_accum) per step; "
		"whole tensors, before dp sharding\n",
		p, stages_schedule_name(g->pipeline), m, m == 1 ? "" : "es");
	uint64_t *own = mem_persistent_stages(g);
	int split = largest_stage(g, own) >= 0;
	if (v > 1)
		print_interleaved(out, g, sc, p, v, m, own, split);
	for (int s = 0; s < p && v == 1; s++) {
		const StageCost *c = &sc[s];
		int fly = gpipe ? m : (p - s < m ? p - s : m);
		fprintf(out, "stage %d: blocks %s..%s, %.0f FLOP forward + %.0f FLOP backward per "
			"micro-batch, params %lld B (%s), grads %lld B, activations %lld B per "
			"micro-batch x %d in flight = %lld B (%s) at the peak, sends %lld B (%s) per "
			"micro-batch\n",
			s, c->first_block >= 0 ? g->blocks[c->first_block].name : "-",
			c->last_block >= 0 ? g->blocks[c->last_block].name : "-", c->fwd_flops,
			c->bwd_flops, (long long)c->param_bytes,
			stats_human_bytes(h1, sizeof h1, (double)c->param_bytes), (long long)c->grad_bytes,
			(long long)c->act_bytes, fly, (long long)c->act_bytes * fly,
			stats_human_bytes(h2, sizeof h2, (double)c->act_bytes * fly), (long long)c->send_bytes,
			stats_human_bytes(h3, sizeof h3, (double)c->send_bytes));
		print_held(out, g, own, split, s);
	}
	free(own);
	double bubble = 0;
	double span = stages_simulate(sc, p, v, m, g->pipeline, &bubble, NULL);
	/* zero_bubble's closed form: ZB-H1's (p-1)(F+B-W) idle per stage, F = B = W;
	 * interleaved's: 1F1B's idle divided by v */
	int zb = g->pipeline == IR_PIPE_ZERO_BUBBLE;
	if (v > 1)
		fprintf(out, "bubble: (p-1)/(v*m+p-1) = %.4f; from the stages' FLOPs %.4f (makespan "
			"%.0f FLOP per step)\n", (double)(p - 1) / (v * m + p - 1),
			span < 0 ? -1.0 : bubble, span);
	else
		fprintf(out, "bubble: (p-1)/(%sm+p-1) = %.4f; from the stages' FLOPs %.4f (makespan "
			"%.0f FLOP per step)\n", zb ? "3" : "", (double)(p - 1) / ((zb ? 3 : 1) * m + p - 1),
			span < 0 ? -1.0 : bubble, span);
	print_compiled_peaks(out, g, p, split);
	free(sc);
}

void stats_print(FILE *out, const Graph *g, int64_t budget)
{
	double accum = g->cfg.grad_accum ? g->cfg.grad_accum : 1;
	fprintf(out, "%s: strategy %s", g->file, g->strategy);
	int nown = 0; /* blocks with their own strategy */
	for (int b = 0; b < g->nblocks; b++)
		if (g->blocks[b].strategy >= 0 && g->blocks[b].strategy < DP_NSTRAT)
			fprintf(out, "%s%s %s", nown++ ? ", " : " (blocks: ", g->blocks[b].name,
				dp_strategy_names[g->blocks[b].strategy]);
	fprintf(out, "%s, mesh", nown ? ")" : "");
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (a != DP_AXIS_PP || g->cfg.mesh[a] != 1)
			fprintf(out, " %s=%u", ir_axis_names[a], g->cfg.mesh[a]);
	fprintf(out, " (world %d), micro_batch %u x grad_accum %u, global batch %lld", ir_world(g),
		g->cfg.micro_batch, g->cfg.grad_accum, (long long)ir_global_batch(g));
	if (ir_mixed_precision(g))
		fprintf(out, ", precision param_dtype %s reduce_dtype %s buffer_dtype %s",
			ir_dtype_name((DpDtype)g->param_dtype), ir_dtype_name((DpDtype)g->reduce_dtype),
			ir_dtype_name((DpDtype)g->buffer_dtype));
	fprintf(out, "\n");
	fprintf(out, "per rank, per optimizer step\n");
	if (g->cfg.mesh[DP_AXIS_PP] > 1)
		fprintf(out, "(pp=%u: the collectives and FLOPs are the whole model's, uncut, the "
			"memory the largest stage's; the pipeline section below splits them by stage)\n",
			g->cfg.mesh[DP_AXIS_PP]);
	fprintf(out, "\n");
	print_collectives(out, g, accum);
	fprintf(out, "\n");
	print_flops(out, g, accum);
	fprintf(out, "\n");
	print_memory(out, g, budget);
	print_pipeline(out, g);
}

/* The rows an over-budget message names: the arena's, largest first. */
typedef struct {
	const char *name;
	double bytes;
} BudgetRow;

static int by_bytes_desc(const void *a, const void *b)
{
	const BudgetRow *x = a, *y = b;
	return (x->bytes < y->bytes) - (x->bytes > y->bytes);
}

static int by_value_bytes_desc(const void *a, const void *b)
{
	const Value *x = *(const Value *const *)a, *y = *(const Value *const *)b;
	if (x->nbytes != y->nbytes)
		return (x->nbytes < y->nbytes) - (x->nbytes > y->nbytes);
	return (x->id > y->id) - (x->id < y->id);
}

int stats_check_budget(Diag *d, const Graph *g, int64_t budget)
{
	if (g->peak_bytes <= budget)
		return 0;
	char h1[32], h2[32], h3[32];
	const char *file = d->file ? d->file : "dpc";
	error_at(d, (Loc){0}, "the memory plan needs %s of device memory per rank, over --device-memory %s "
		 "by %s (nothing written)",
		 stats_human_bytes(h1, sizeof h1, (double)g->peak_bytes),
		 stats_human_bytes(h2, sizeof h2, (double)budget),
		 stats_human_bytes(h3, sizeof h3, (double)(g->peak_bytes - budget)));
	BudgetRow rows[M_NCAT + 1];
	double bytes[M_NCAT], host[M_NCAT];
	memory_rows(g, bytes, host);
	for (int c = 0; c < M_NCAT; c++)
		rows[c] = (BudgetRow){memory_names[c], bytes[c]};
	rows[M_NCAT] = (BudgetRow){"temporaries", (double)(g->peak_bytes - g->persistent_bytes)};
	qsort(rows, M_NCAT + 1, sizeof rows[0], by_bytes_desc);
	fprintf(d->out, "%s: note: the device arena's largest rows:", file);
	for (int c = 0; c < M_NCAT + 1 && c < 4 && rows[c].bytes > 0; c++)
		fprintf(d->out, "%s %s %s", c ? ";" : "", rows[c].name,
			stats_human_bytes(h1, sizeof h1, rows[c].bytes));
	fprintf(d->out, "\n");
	/* the largest values in it: roots, persistent or temporary */
	const Value **vs = malloc(((size_t)g->nvalues + 1) * sizeof *vs);
	if (!vs)
		die("out of memory");
	int n = 0;
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (v->view_of < 0 && v->offset >= 0 && v->space != DP_SPACE_HOST)
			vs[n++] = v;
	}
	qsort(vs, (size_t)n, sizeof *vs, by_value_bytes_desc);
	fprintf(d->out, "%s: note: its largest values:", file);
	for (int i = 0; i < n && i < 4; i++)
		fprintf(d->out, "%s %%%s %s", i ? ";" : "", vs[i]->name,
			stats_human_bytes(h1, sizeof h1, (double)vs[i]->nbytes));
	fprintf(d->out, "\n");
	free(vs);
	if (!ir_any_offload(g) && bytes[M_OPT] > 0)
		fprintf(d->out, "%s: note: train's `offload optimizer` keeps the optimizer state (and, "
			"in bf16, the f32 masters) in host memory\n", file);
	return -1;
}
