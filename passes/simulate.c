/*
 * simulate.c - `dpc --simulate[=MACHINE]`: the compiled step of one rank
 * replayed as a discrete-event simulation on a machine model
 * (util/machine.h), predicting its time before any machine runs it.
 *
 * Input: the final (memory-planned) graph, whose STEP program is the
 * instruction list every rank runs (ir/stepfile_write.c writes it in this
 * order): kernels and collectives on the compute and comm streams, and the
 * events between them (passes/schedule.c). One optimizer step is the
 * program run grad_accum times, DP_IF_LAST instructions on the last run
 * only, as runtime/exec.c's exec_step runs it; the streams carry over from
 * one run to the next. At pp > 1 the program holds every micro-batch
 * (passes/unroll.c) and runs once; a rank of stage s runs the instructions
 * of stage s and of every stage (Node.stage -1), and skips the rest.
 *
 * Two steps: sim_build turns each STEP instruction into a SimOp with its
 * cost on the machine (a kernel's seconds; a collective's latency, bus
 * bytes and link; a pipeline send or recv paired with its other end by
 * tag; the copies of a collective over a sub-group of the stages with one
 * another, in program order), sim_run replays the SimOps (sim_run_stages:
 * every stage's, paired up). They are the simulator's whole arithmetic, and
 * tests/simulate_test.c checks them on hand-built schedules.
 *
 * Pipelines (pp > 1). The stages' replays are coupled: a send and its recv
 * move once both are posted (MPI's and NCCL's rendezvous), taking the p2p
 * link's alpha plus their bytes over its bandwidth, full duplex (a stage's
 * sends and recvs do not share it); a collective whose group spans pp (the
 * gradients' all_reduce over pp) moves once its last stage posts it, and
 * one over a sub-group of the stages (`stages`: a tied parameter's
 * gradients on the stages that keep it, each stage running its own copy
 * over the sub-group's communicator) once the last of those stages posts
 * its copy; the other stages do not take part.
 * sim_run_stages finds the times by iterating the stages' replays to a
 * fixed point (its comment says why that is the co-simulation's answer).
 * The step is the slowest stage's end; each stage's compute stream idle
 * over the step is printed beside --stats' bubble from the FLOPs
 * (stages_simulate), which leaves out the transfers' time and the kernels'
 * overheads and the once-per-step part.
 *
 * Costs. A kernel: the machine's per-kernel overhead plus the larger of its
 * FLOPs over the rate it runs at and its bytes over the memory bandwidth
 * (the op registry's cost rule, as --stats counts them): a GEMM's rate is
 * the machine's GEMM table at its m, n, k and operand dtype, an op with an
 * entry of its own in the machine file (attention, norms) takes that
 * entry's rates (its points: the measured time at the kernel's size, among
 * the points of the kernel's own kind where the file keys them by kind:
 * sim_build then works out each instruction's kind by format/kernel_kind.c,
 * the CUDA backend's own rule), anything else the dtype's peak. A collective: alpha plus
 * its bus bytes (nccl-tests' factor of the whole buffer, as --stats) over
 * the link of its axis group: intra-node when the group's ranks lie in one
 * node (rank layout row-major, pp outermost, tp fastest), else inter-node;
 * pipeline transfers over the p2p link. Loads copy at memory bandwidth.
 *
 * How the streams run, as each backend issues them (Machine.executor):
 *  - gpu: each stream runs its instructions in order (CUDA streams; the
 *    whole step is one graph launch, so issuing costs nothing); an
 *    EVENT_RECORD marks the stream's time, an EVENT_WAIT holds its stream
 *    until then. The comm stream runs one collective at a time, and so
 *    does the p2p stream (the pipeline's transfers, step format 22: a
 *    send held until its receiver posts holds no collective of the comm
 *    stream); each has a fluid of its own (they use different links, and
 *    each stream's collectives start in its own time order); the copy
 *    stream (offload's H2Ds) runs its copies in order beside both, each
 *    costed like a kernel that moves its bytes.
 *  - cpu (runtime/cpu/streams.c): the host walks the program; a compute
 *    kernel runs when the walk reaches it and holds the host; a collective
 *    starts when reached and runs beside what follows, concurrently with
 *    the other collectives in flight; an EVENT_RECORD on comm (p2p) covers
 *    every collective (transfer) of that stream started so far and a wait
 *    for it on compute holds the host until they are done; a kernel on the
 *    comm or copy stream waits for
 *    every collective before it. Once per optimizer step, after the
 *    program, the host waits for dpexec's report of the step: the loss
 *    all_reduced over every axis but tp, then the sync point over every
 *    rank (sync_point_s), which the step program does not hold but every
 *    measured step pays (on a GPU the loop keeps the next step queued
 *    meanwhile, so they are not counted there).
 * Collectives in flight together share their link's bandwidth equally
 * (a fluid model: each one's bus bytes drain at busbw / the number moving
 * on that link, after its alpha); on the gpu executor only collectives of
 * other streams could meet, and the comm and p2p streams use different
 * links (the p2p link is the transfers' alone).
 *
 * Reported, per rank and optimizer step: the step time (the later stream's
 * end), compute (the compute stream's busy time), communication (the time
 * any collective is in flight), the exposed communication (the time the
 * compute stream waited on events: the part the schedule did not hide),
 * each stream's utilisation, the peak memory (the memory plan's arena, the
 * exact figure: one allocation per rank) and the MFU (roofline_model_flops
 * over the step time at the machine's bf16 peak; at pp > 1 a rank's share,
 * the step's model FLOPs over the stages).
 *
 * Not simulated: the host's own time on the gpu executor, contention
 * between compute and communication for memory bandwidth or SMs, and
 * stages sharing a node's links (each rank's p2p link is its own).
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* ---- the replay ---- */

typedef struct {
	double start, lat_end, left, end; /* end < 0: in flight */
	int link, op, micro;
	int stream; /* the stream that started it (the comm or the p2p stream) */
} Flow;

/* The fluid's lanes: the machine's links, and the p2p link's inbound
 * direction (a pipeline recv), full duplex beside its sends. */
enum { LANE_P2P_IN = MACH_NLINK, NLANE };

typedef struct {
	const SimOp *ops;
	int executor;
	double link_bw[NLANE];
	Flow *fl;
	int nfl, capfl;
	int first_open; /* flows below are all done */
	double done_end; /* the latest end among them */
	double clock;   /* the fluid's time */
	int mixed;      /* cpu: flows of both the comm and the p2p stream */
	SimResult *r;
} Sim;

static void add_span(SimResult *r, double t0, double t1, int op, int micro, int lane)
{
	if (!r->want_spans)
		return;
	if (r->nspans == r->capspans) {
		r->capspans = r->capspans ? 2 * r->capspans : 256;
		r->spans = realloc(r->spans, sizeof *r->spans * (size_t)r->capspans);
		if (!r->spans)
			die("out of memory");
	}
	r->spans[r->nspans++] = (SimSpan){t0, t1, op, micro, lane};
}

/* Advance the fluid to time t, or (t < 0) to its next completion. */
static void fluid_step(Sim *s, double t)
{
	if (t >= 0 && t <= s->clock)
		return;
	for (;;) {
		int moving[NLANE] = {0}, any = 0;
		double next = INFINITY;
		for (int i = s->first_open; i < s->nfl; i++) {
			Flow *f = &s->fl[i];
			if (f->end >= 0)
				continue;
			any = 1;
			if (f->lat_end > s->clock)
				next = fmin(next, f->lat_end);
			else
				moving[f->link]++;
		}
		if (!any) {
			if (t >= 0)
				s->clock = t;
			return;
		}
		for (int i = s->first_open; i < s->nfl; i++) {
			Flow *f = &s->fl[i];
			if (f->end < 0 && f->lat_end <= s->clock)
				next = fmin(next, s->clock + f->left * moving[f->link] / s->link_bw[f->link]);
		}
		double to = t >= 0 ? fmin(next, t) : next;
		for (int i = s->first_open; i < s->nfl; i++) {
			Flow *f = &s->fl[i];
			if (f->end >= 0 || f->lat_end > s->clock)
				continue;
			double share = s->link_bw[f->link] / moving[f->link];
			double fin = s->clock + f->left / share;
			if (fin <= to + 1e-15 * fabs(to)) {
				f->left = 0;
				f->end = fin;
				add_span(s->r, f->start, f->end, f->op, f->micro, 1);
			} else {
				f->left -= (to - s->clock) * share;
			}
		}
		s->clock = to;
		while (s->first_open < s->nfl && s->fl[s->first_open].end >= 0)
			s->done_end = fmax(s->done_end, s->fl[s->first_open++].end);
		if (t < 0 || to >= t)
			return;
	}
}

/* Wait for flows [0, upto): a time by which all of them have ended (the
 * last one's end, or a done flow's end <= the fluid's clock, which the
 * walk has passed already: either way the same time to wait until). */
static double fluid_wait(Sim *s, int upto)
{
	double end = s->done_end;
	for (int i = s->first_open; i < upto; i++) {
		while (s->fl[i].end < 0)
			fluid_step(s, -1);
		end = fmax(end, s->fl[i].end);
	}
	return end;
}

/* cpu: wait for the flows of `stream` among [0, upto) (an event recorded on
 * that stream covers its own collectives, not the other stream's): the
 * time by which they have ended, as fluid_wait. */
static double fluid_wait_stream(Sim *s, int upto, int stream)
{
	if (!s->mixed)
		return fluid_wait(s, upto);
	/* the flows below first_open are done, by the fluid's clock, which
	 * the host's time is not behind after a wait */
	double end = 0;
	for (int i = s->first_open; i < upto; i++) {
		if (s->fl[i].stream != stream)
			continue;
		while (s->fl[i].end < 0)
			fluid_step(s, -1);
		end = fmax(end, s->fl[i].end);
	}
	return end;
}

/* A collective posted at t that may not move before ready (its partners'
 * posting: a pipeline transfer's other end, a pp-spanning group's last
 * stage): it starts at the later. */
static void fluid_start(Sim *s, double t, double ready, const SimOp *op, int idx, int micro)
{
	fluid_step(s, t);
	double go = fmax(t, ready);
	int lane = op->link == MACH_P2P && op->recv ? LANE_P2P_IN : op->link;
	if (s->nfl == s->capfl) {
		s->capfl = s->capfl ? 2 * s->capfl : 64;
		s->fl = realloc(s->fl, sizeof *s->fl * (size_t)s->capfl);
		if (!s->fl)
			die("out of memory");
	}
	s->mixed |= s->nfl && s->fl[0].stream != op->stream;
	s->fl[s->nfl++] = (Flow){go, go + op->alpha, op->bytes, -1, lane, idx, micro, op->stream};
}

static int by_flow_start(const void *a, const void *b)
{
	const Flow *x = a, *y = b;
	return (x->start > y->start) - (x->start < y->start);
}

/* The length of the union of the flows' intervals (sorted by start first
 * when a flow waited for its partners past a later one's start). */
static double flows_union(Sim *s)
{
	for (int i = 1; i < s->nfl; i++)
		if (s->fl[i].start < s->fl[i - 1].start) {
			qsort(s->fl, (size_t)s->nfl, sizeof *s->fl, by_flow_start);
			break;
		}
	double total = 0, lo = 0, hi = -1;
	for (int i = 0; i < s->nfl; i++) {
		const Flow *f = &s->fl[i];
		if (f->start > hi) {
			if (hi > lo)
				total += hi - lo;
			lo = f->start;
			hi = f->end;
		} else {
			hi = fmax(hi, f->end);
		}
	}
	if (hi > lo)
		total += hi - lo;
	return total;
}

/* One rank's replay: ops of every stage and of stage (all of them when
 * stage < 0), which are own[0..nown) in order where own is not NULL (the
 * others are skipped either way: at pp = 16 a stage's replay visited 16
 * times the ops it runs); a collective moves from ready[i] on (NULL: when
 * posted), and when each is posted goes to posted[i] (NULL: nowhere;
 * accum 1). */
static void replay(const SimOp *ops, int n, const int *own, int nown, int accum, int executor,
		   const double *link_bw, int nevents, int stage, const double *ready, double *posted,
		   SimResult *r)
{
	/* cpu: one fluid for every collective in flight; gpu: one per stream
	 * (each stream moves one at a time, in its own time order, and the comm
	 * and p2p streams use different links, so they never share one) */
	Sim fs[DP_NSTREAM];
	for (int k = 0; k < DP_NSTREAM; k++) {
		fs[k] = (Sim){.ops = ops, .executor = executor, .r = r};
		for (int l = 0; l < MACH_NLINK; l++)
			fs[k].link_bw[l] = link_bw[l];
		fs[k].link_bw[LANE_P2P_IN] = link_bw[MACH_P2P];
	}
	Sim *cs = &fs[0]; /* cpu: the one fluid */
	double tail[DP_NSTREAM] = {0}, host = 0;
	double *ev_time = calloc((size_t)nevents + 1, sizeof *ev_time); /* gpu: when it is reached */
	int *ev_flows = calloc((size_t)nevents + 1, sizeof *ev_flows);  /* cpu: flows it covers */
	int *ev_rec = calloc((size_t)nevents + 1, sizeof *ev_rec);      /* the op recording it */
	if (!ev_time || !ev_flows || !ev_rec)
		die("out of memory");
	for (int i = 0; i < n; i++)
		if (ops[i].kind == SIM_RECORD && ops[i].event >= 0 && ops[i].event < nevents)
			ev_rec[ops[i].event] = i;
	for (int k = 0; k < DP_NSTREAM; k++)
		r->busy[k] = 0;
	r->exposed_s = 0;
	r->nspans = 0;
	for (int mb = 0; mb < accum; mb++) {
		for (int k = 0; k < (own ? nown : n); k++) {
			int i = own ? own[k] : k;
			const SimOp *o = &ops[i];
			/* compression: the steady state, the compressed path */
			if (((o->flags & DP_IF_LAST) && mb != accum - 1) || ((o->flags & DP_IF_FIRST) && mb != 0) ||
			    (o->flags & DP_IF_PLAIN))
				continue;
			if (stage >= 0 && o->stage >= 0 && o->stage != stage)
				continue; /* another stage's: skipped by this rank */
			double rd = ready ? ready[i] : 0;
			if (executor == MACH_CPU) {
				switch (o->kind) {
				case SIM_KERNEL: {
					double t0 = host;
					if (o->stream != DP_STREAM_COMPUTE) /* after the collectives before it */
						t0 = fmax(t0, fluid_wait(cs, cs->nfl));
					host = t0 + o->dur;
					r->busy[o->stream] += o->dur;
					add_span(r, t0, host, i, mb, 0);
					break;
				}
				case SIM_COLL:
					if (posted)
						posted[i] = host;
					fluid_start(cs, host, rd, o, i, mb);
					break;
				case SIM_RECORD: /* the comm or p2p stream's collectives so far */
					ev_flows[o->event] = o->stream == DP_STREAM_COMM || o->stream == DP_STREAM_P2P
								     ? cs->nfl : 0;
					break;
				case SIM_WAIT:
					if (o->stream == DP_STREAM_COMPUTE && ev_flows[o->event]) {
						double done = fluid_wait_stream(cs, ev_flows[o->event],
										ops[ev_rec[o->event]].stream);
						if (done > host) {
							add_span(r, host, done, i, mb, -1);
							r->exposed_s += done - host;
							host = done;
						}
					}
					break;
				}
				continue;
			}
			double *t = &tail[o->stream];
			Sim *sf = &fs[o->stream];
			switch (o->kind) {
			case SIM_KERNEL:
				add_span(r, *t, *t + o->dur, i, mb, o->stream == DP_STREAM_COMM ? 1 : 0);
				*t += o->dur;
				if (o->stream != DP_STREAM_COMM) /* (the copy stream's: offload's H2Ds) */
					r->busy[o->stream] += o->dur;
				break;
			case SIM_COLL: /* in order on its stream: it moves alone */
				if (posted)
					posted[i] = *t;
				fluid_start(sf, *t, rd, o, i, mb);
				*t = fluid_wait(sf, sf->nfl);
				break;
			case SIM_RECORD:
				ev_time[o->event] = *t;
				break;
			case SIM_WAIT:
				if (ev_time[o->event] > *t) {
					if (o->stream == DP_STREAM_COMPUTE) {
						add_span(r, *t, ev_time[o->event], i, mb, -1);
						r->exposed_s += ev_time[o->event] - *t;
					}
					*t = ev_time[o->event];
				}
				break;
			}
		}
	}
	double end = host;
	for (int k = 0; k < DP_NSTREAM && executor != MACH_CPU; k++)
		end = fmax(end, tail[k]);
	/* every flow, of every stream's fluid, in one list: their union is the
	 * time any collective is in flight */
	for (int k = 0; k < DP_NSTREAM; k++)
		end = fmax(end, fluid_wait(&fs[k], fs[k].nfl));
	for (int k = 1; k < DP_NSTREAM; k++) {
		if (!fs[k].nfl)
			continue;
		if (cs->nfl + fs[k].nfl > cs->capfl) {
			cs->capfl = cs->nfl + fs[k].nfl;
			if (!(cs->fl = realloc(cs->fl, sizeof *cs->fl * (size_t)cs->capfl)))
				die("out of memory");
		}
		memcpy(cs->fl + cs->nfl, fs[k].fl, sizeof *cs->fl * (size_t)fs[k].nfl);
		cs->nfl += fs[k].nfl;
		free(fs[k].fl);
	}
	r->step_s = end;
	r->comm_s = flows_union(cs);
	r->busy[DP_STREAM_COMM] += r->comm_s;
	free(cs->fl);
	free(ev_time);
	free(ev_flows);
	free(ev_rec);
}

int sim_run(const SimOp *ops, int n, int accum, int executor, const double *link_bw, int nevents,
	    SimResult *r)
{
	replay(ops, n, NULL, 0, accum, executor, link_bw, nevents, -1, NULL, NULL, r);
	return 0;
}

/*
 * The stages' replays paired up, by iteration to a fixed point. Each
 * stage's replay is a function of when its transfers and pp-spanning
 * collectives may move (ready), and gives when it posts each of them
 * (posted); a transfer may move once its other end is posted, a pp
 * collective once the last stage posts it. Starting from ready = 0 (a
 * lower bound of every time), every sweep replays the stages whose ready
 * times changed since their last replay, with the latest ones (forward and
 * backward sweeps in turn, so that a chain of transfers in either
 * direction settles in one), and the times only grow (every time is a max
 * and sum of the ready times); when no stage is left to replay, each was
 * replayed with the times its partners give: the co-simulation's answer.
 * Each sweep fixes at least one more transfer of the longest chain, so at
 * most one sweep per paired op are needed. The copies of a sub-group's
 * collective (each on its own stage, SimOp.ring) wait for the latest of
 * them as a pp collective waits for every stage.
 */
int sim_run_stages(const SimOp *ops, int n, int p, int executor, const double *link_bw,
		   int nevents, SimResult *r)
{
	double *ready = calloc((size_t)n + 1, sizeof *ready);
	double *posted = calloc((size_t)p * (size_t)n + 1, sizeof *posted);
	/* what each stage's replay feeds: the transfers whose other end it
	 * runs (from[st] .. from[st + 1] in feed), and the pp collectives */
	int *from = calloc((size_t)p + 2, sizeof *from), *feed = calloc((size_t)n + 1, sizeof *feed);
	int *sync = calloc((size_t)n + 1, sizeof *sync), nsync = 0;
	char *dirty = malloc((size_t)p);
	/* each stage's ops (own[at[st]] .. own[at[st + 1]]: those of every
	 * stage and its own, in order) */
	int *at = calloc((size_t)p + 1, sizeof *at), nshared = 0;
	if (!ready || !posted || !from || !feed || !sync || !dirty || !at)
		die("out of memory");
	for (int i = 0; i < n; i++)
		if (ops[i].stage < 0)
			nshared++;
		else if (ops[i].stage < p)
			at[ops[i].stage + 1]++;
	for (int st = 0; st < p; st++)
		at[st + 1] += at[st] + nshared;
	int *own = malloc(sizeof *own * ((size_t)at[p] + 1)), *fill = malloc(sizeof *fill * ((size_t)p + 1));
	if (!own || !fill)
		die("out of memory");
	memcpy(fill, at, sizeof *fill * (size_t)p);
	for (int i = 0; i < n; i++)
		if (ops[i].stage < 0)
			for (int st = 0; st < p; st++)
				own[fill[st]++] = i;
		else if (ops[i].stage < p)
			own[fill[ops[i].stage]++] = i;
	for (int i = 0; i < n; i++)
		if (ops[i].peer >= 0)
			from[ops[ops[i].peer].stage + 2]++;
		else if (ops[i].sync)
			sync[nsync++] = i;
	for (int st = 0; st < p; st++)
		from[st + 2] += from[st + 1];
	for (int i = 0; i < n; i++)
		if (ops[i].peer >= 0)
			feed[from[ops[ops[i].peer].stage + 1]++] = i;
	memset(dirty, 1, (size_t)p);
	int sweep, left = p, bound = n + 2;
	for (sweep = 1; left && sweep <= bound; sweep++) {
		for (int k = 0; k < p; k++) {
			int st = sweep & 1 ? k : p - 1 - k;
			if (!dirty[st]) /* its ready times are those it was replayed with */
				continue;
			dirty[st] = 0, left--;
			replay(ops, n, own + at[st], at[st + 1] - at[st], 1, executor, link_bw, nevents, st,
			       ready, posted + (size_t)st * (size_t)n, &r[st]);
			for (int f = from[st]; f < from[st + 1]; f++) {
				int i = feed[f];
				double want = posted[(size_t)st * (size_t)n + (size_t)ops[i].peer];
				if (want != ready[i]) {
					ready[i] = want;
					left += !dirty[ops[i].stage];
					dirty[ops[i].stage] = 1;
				}
			}
			for (int y = 0; y < nsync; y++) {
				int i = sync[y];
				double want = 0;
				if (ops[i].stage < 0) /* every stage runs it */
					for (int q = 0; q < p; q++)
						want = fmax(want, posted[(size_t)q * (size_t)n + (size_t)i]);
				else /* a sub-group's copy: the latest copy of its ring */
					for (int j = i, first = 1; first || j != i; j = ops[j].ring, first = 0)
						want = fmax(want, posted[(size_t)ops[j].stage * (size_t)n + (size_t)j]);
				if (want != ready[i]) {
					ready[i] = want;
					for (int q = 0; q < p; q++)
						if (ops[i].stage < 0 || q == ops[i].stage)
							left += !dirty[q], dirty[q] = 1;
				}
			}
		}
	}
	free(ready), free(posted), free(from), free(feed), free(sync), free(dirty);
	free(at), free(own), free(fill);
	return left ? -1 : sweep - 1;
}

/* ---- the graph's STEP program as SimOps ---- */

/* Does the axis group of mask lie inside one node? Ranks are row-major over
 * the axes in DpAxis order (pp outermost, tp fastest). */
int sim_group_in_node(const uint32_t mesh[DP_MAX_AXES], unsigned mask, int ranks_per_node)
{
	int64_t stride = 1;
	for (int a = DP_MAX_AXES - 1; a >= 0; a--) {
		stride *= mesh[a] ? mesh[a] : 1;
		if ((mask & DP_AXIS_BIT(a)) && stride > ranks_per_node)
			return 0;
	}
	return 1;
}

static int group_in_node(const Graph *g, unsigned mask, int ranks_per_node)
{
	return sim_group_in_node(g->cfg.mesh, mask, ranks_per_node);
}

static int gemm_dims(const Graph *g, const Node *n, double f, double *m, double *nn, double *k)
{
	const Value *out = g->values[n->out];
	const Value *in0 = g->values[n->in[0]];
	double cols = (double)out->dims[out->ndim - 1], rows = (double)ir_numel(out) / cols;
	if (n->op == DP_OP_LINEAR_GELU) /* [2, rows, n]: the pre-activation and the gelu */
		rows /= 2;
	*m = rows;
	*nn = cols;
	*k = rows * cols > 0 ? fmax(1, f / (2 * rows * cols)) : 1;
	return in0->dtype == DP_BF16 ? MACH_BF16 : MACH_F32;
}

/* The dtype of n's op lines in a machine file: "bf16" when any operand is a
 * 16-bit float (bf16 or f16), else "f32" (util/machine.h;
 * runtime/calibrate.c's line_dtype is the same rule on a step file). */
static int line_dtype(const Graph *g, const Node *n)
{
	int half = n->out >= 0 && dp_is_half(g->values[n->out]->dtype);
	for (int k = 0; k < n->nin; k++)
		half |= n->in[k] >= 0 && dp_is_half(g->values[n->in[k]]->dtype);
	return half ? MACH_BF16 : MACH_F32;
}

/* kind: the CUDA kernel n runs where its op has several (format/kernel_kind.c's
 * name, NULL: not worked out, the machine file naming no kinds) */
static double kernel_seconds(const Graph *g, const Node *n, const Machine *mc, const char *kind)
{
	double f = 0, b = 0;
	if (ir_ops[n->op].cost)
		ir_ops[n->op].cost(g, n, &f, &b);
	int dt = n->out >= 0 && g->values[n->out]->dtype == DP_BF16 ? MACH_BF16 : MACH_F32;
	double rate = mc->peak_flops[dt];
	int gemm = dp_op_is_gemm(n->op);
	if (gemm) {
		double m, nn, k;
		int gd = gemm_dims(g, n, f, &m, &nn, &k);
		rate = machine_gemm_rate(mc, gd, m, nn, k);
	}
	return mc->node_overhead_s + machine_op_seconds(mc, ir_ops[n->op].name, line_dtype(g, n), gemm,
							  f, b, rate, mc->memory_bw,
							  mc->kernel_overhead_s, kind);
}

double sim_gemm_rate_cap(const Machine *mc, int dtype)
{
	double r = 0;
	int table = 0;
	for (int i = 0; i < mc->ngemm; i++)
		if (mc->gemm[i].dtype == dtype) {
			r = fmax(r, mc->gemm[i].flops_per_s);
			table = 1;
		}
	if (!table) /* machine_gemm_rate's fallback */
		r = mc->peak_flops[dtype];
	for (unsigned op = 0; op < DP_NOPS; op++) {
		const MachOp *own = dp_op_is_gemm(op) ? machine_op(mc, ir_ops[op].name) : NULL;
		for (int d = 0; own && d <= MACH_NDTYPE; d++) /* any line may price a GEMM */
			r = fmax(r, own->line[d].flops_per_s);
	}
	return r;
}

/* The transfers seen so far by tag: the first end of each waits here for
 * its other end (p2p.c numbers each send/recv pair by its tag). */
typedef struct {
	int *first; /* [tag]: the op index + 1 of the end seen, 0: none */
	int64_t cap;
} TagIndex;

static void pair_transfer(SimOp *o, int k, int64_t tag, TagIndex *t)
{
	if (tag >= t->cap) {
		int64_t cap = t->cap ? t->cap : 64;
		while (cap <= tag)
			cap *= 2;
		t->first = realloc(t->first, sizeof *t->first * (size_t)cap);
		if (!t->first)
			die("out of memory");
		memset(t->first + t->cap, 0, sizeof *t->first * (size_t)(cap - t->cap));
		t->cap = cap;
	}
	if (!t->first[tag]) {
		t->first[tag] = k + 1;
		return;
	}
	int other = t->first[tag] - 1;
	assert(o[other].recv != o[k].recv);
	o[other].peer = k;
	o[k].peer = other;
	t->first[tag] = 0;
}

/* The sub-group of pp stages an all_reduce spans (bit k: stage k), else 0. */
static uint64_t sub_group(const Node *n)
{
	return n->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(n, ALL_REDUCE, stages) : 0;
}

/* The copies of sub-group collectives seen so far, not yet in a full ring:
 * each stage's copies of one sub-group pair with the other stages' in
 * program order (as their communicator matches them, and the verifier's
 * check_pipeline_order): the j-th copy of set S on stage s with the j-th
 * on every other stage of S. */
typedef struct {
	uint64_t set;
	int stage, op; /* the copy's stage and op index */
	int taken;     /* in a ring already */
} Copy;
typedef struct {
	Copy *c;
	int n, cap;
} CopyList;

static void pair_copy(SimOp *o, int k, uint64_t set, CopyList *l)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 16;
		l->c = realloc(l->c, sizeof *l->c * (size_t)l->cap);
		if (!l->c)
			die("out of memory");
	}
	l->c[l->n++] = (Copy){set, o[k].stage, k, 0};
	/* the first untaken copy of set on each of its stages: a full ring? */
	int first[64], need = __builtin_popcountll(set), have = 0;
	for (int st = 0; st < 64; st++)
		first[st] = -1;
	for (int i = 0; i < l->n && have < need; i++) {
		Copy *c = &l->c[i];
		if (c->set == set && !c->taken && c->stage < 64 && first[c->stage] < 0)
			first[c->stage] = i, have++;
	}
	if (have < need)
		return;
	int prev = -1, head = -1;
	for (int st = 0; st < 64; st++) {
		if (first[st] < 0)
			continue;
		Copy *c = &l->c[first[st]];
		c->taken = 1;
		if (prev >= 0)
			o[prev].ring = c->op;
		else
			head = c->op;
		prev = c->op;
	}
	o[prev].ring = head;
}

int sim_build(const Graph *g, const Machine *mc, SimOp **ops, int *nops, int **nodes)
{
	TagIndex tags = {0};
	CopyList copies = {0};
	int n = 0;
	for (int i = 0; i < g->nnodes; i++)
		n += (g->nodes[i]->progs & IR_IN_STEP) != 0;
	SimOp *o = calloc((size_t)n + 1, sizeof *o);
	int *which = calloc((size_t)n + 1, sizeof *which);
	if (!o || !which)
		die("out of memory");
	/* a machine file whose op points name their kernels' kinds: each
	 * kernel's kind by the CUDA backend's own rule on the program as the
	 * step file holds it (the STEP program is these nodes in this order) */
	int *kind = NULL;
	if (machine_has_kinds(mc)) {
		DpStep view;
		ir_build_program(g, DP_PROG_STEP, &view);
		kind = calloc((size_t)n + 1, sizeof *kind);
		if (!kind)
			die("out of memory");
		dp_kernel_kinds(&view, DP_PROG_STEP, kind);
		dpstep_free(&view);
	}
	int k = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *nd = g->nodes[i];
		if (!(nd->progs & IR_IN_STEP))
			continue;
		SimOp *s = &o[k];
		which[k++] = i;
		s->stream = nd->stream;
		s->flags = nd->flags;
		s->stage = g->cfg.mesh[DP_AXIS_PP] > 1 ? nd->stage : -1;
		s->peer = -1;
		switch (dp_op_class(nd->op)) {
		case DP_OPC_EVENT:
			s->kind = nd->op == DP_OP_EVENT_RECORD ? SIM_RECORD : SIM_WAIT;
			s->event = (int)DP_EVENT(nd);
			break;
		case DP_OPC_COLLECTIVE: {
			s->kind = SIM_COLL;
			if (nd->op == DP_OP_SEND || nd->op == DP_OP_RECV) {
				const Value *v = g->values[nd->op == DP_OP_SEND ? nd->in[0] : nd->out];
				s->link = MACH_P2P;
				s->recv = nd->op == DP_OP_RECV;
				s->bytes = (double)ir_numel(v) * (double)ir_dtype_size(v->dtype);
				pair_transfer(o, k - 1, DP_TAG(nd), &tags);
			} else {
				unsigned axes = (unsigned)DP_AXES(nd);
				int ranks = stats_node_ranks(g, nd);
				s->link = group_in_node(g, axes, mc->ranks_per_node) ? MACH_INTRA : MACH_INTER;
				s->bytes = stats_coll_bytes(g, nd) * stats_bus_factor(nd->op, ranks);
				if (ranks <= 1) /* a group of one moves nothing and waits for no one */
					break;
				/* over pp: every stage's (stage -1), or a sub-group of the
				 * stages, each of them running its own copy (the tied range's
				 * gradients), paired with the others' in program order */
				s->sync = (axes & DP_AXIS_BIT(DP_AXIS_PP)) && g->cfg.mesh[DP_AXIS_PP] > 1 &&
					  (nd->stage < 0 || sub_group(nd));
				if (s->sync && nd->stage >= 0)
					pair_copy(o, k - 1, sub_group(nd), &copies);
			}
			s->alpha = mc->link[s->link].alpha_s;
			break;
		}
		case DP_OPC_LOAD:
		case DP_OPC_SHARD: {
			const Value *v = g->values[nd->out];
			s->kind = SIM_KERNEL;
			s->dur = mc->node_overhead_s + mc->kernel_overhead_s +
				 (double)ir_numel(v) * (double)ir_dtype_size(v->dtype) / mc->memory_bw;
			break;
		}
		case DP_OPC_HOST:
			s->kind = SIM_KERNEL; /* init and save run outside steps; amp_check is
						* a 4-byte read, not modelled */
			break;
		default:
			s->kind = SIM_KERNEL;
			s->dur = kernel_seconds(g, nd, mc, kind ? dp_kernel_kind_name(nd->op, kind[k - 1]) : NULL);
		}
	}
	free(tags.first);
	free(kind);
	for (int i = 0; i < copies.n; i++) /* the verifier pairs every copy */
		assert(copies.c[i].taken);
	free(copies.c);
	*ops = o;
	*nops = k;
	*nodes = which;
	return 0;
}

/* ---- the report and the trace ---- */

/* An 8-byte all_reduce over the axes of mask (0 for a group of one). */
static double small_allreduce_s(const Graph *g, const Machine *mc, unsigned mask)
{
	int ranks = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if ((mask & DP_AXIS_BIT(a)) && g->cfg.mesh[a] > 1)
			ranks *= (int)g->cfg.mesh[a];
	if (ranks <= 1)
		return 0;
	const MachLink *l = &mc->link[group_in_node(g, mask, mc->ranks_per_node) ? MACH_INTRA : MACH_INTER];
	return l->alpha_s + 8.0 * 2 * (ranks - 1) / ranks / l->busbw;
}

/* cpu executor: the host's waits, once per optimizer step, in dpexec's
 * report of the step (runtime/dpexec.c's report_step), which the step
 * program does not hold: the loss all_reduced over every axis but tp (the
 * ranks that hold samples, and pp), then the sync point over every rank
 * (runtime/world.c's world_sync), each a few bytes completed by
 * world_waitall, one after the other and all of them exposed (the loop
 * does nothing else meanwhile). 0 at one rank, and on the gpu executor,
 * where the loop keeps the next step queued on the device while it waits. */
static double sync_point_s(const Graph *g, const Machine *mc)
{
	if (mc->executor != MACH_CPU)
		return 0;
	unsigned all = 0;
	for (int a = 0; a < DP_MAX_AXES; a++)
		all |= DP_AXIS_BIT(a);
	return small_allreduce_s(g, mc, all & ~DP_AXIS_BIT(DP_AXIS_TP)) + small_allreduce_s(g, mc, all);
}

int sim_graph(const Graph *g, const Machine *mc, SimReport *rep, int want_spans)
{
	memset(rep, 0, sizeof *rep);
	int p = g->cfg.mesh[DP_AXIS_PP] > 1 ? (int)g->cfg.mesh[DP_AXIS_PP] : 1;
	double bw[MACH_NLINK];
	for (int l = 0; l < MACH_NLINK; l++)
		bw[l] = mc->link[l].busbw;
	sim_build(g, mc, &rep->ops, &rep->nops, &rep->nodes);
	rep->nstages = p;
	rep->stage = calloc((size_t)p, sizeof *rep->stage);
	if (!rep->stage)
		die("out of memory");
	for (int s = 0; s < p; s++)
		rep->stage[s].want_spans = want_spans;
	/* the step program runs grad_accum times; at pp > 1 once, holding
	 * every micro-batch (passes/unroll.c) */
	int copies = stages_micro_copies(g);
	int accum = g->cfg.grad_accum ? (int)g->cfg.grad_accum : 1;
	rep->forecast_bubble = -1;
	if (p == 1) {
		sim_run(rep->ops, rep->nops, accum, mc->executor, bw, g->nevents, &rep->stage[0]);
	} else {
		assert(copies == accum);
		rep->sweeps = sim_run_stages(rep->ops, rep->nops, p, mc->executor, bw, g->nevents, rep->stage);
		if (rep->sweeps < 0)
			return -1;
		StageCost *sc = calloc((size_t)stages_count(g), sizeof *sc);
		if (!sc)
			die("out of memory");
		double bubble;
		if (stages_account(g, sc) &&
		    stages_simulate(sc, p, ir_chunks_per_rank(g), accum, g->pipeline, &bubble, NULL) >= 0)
			rep->forecast_bubble = bubble;
		free(sc);
	}
	rep->sync_s = sync_point_s(g, mc);
	for (int s = 0; s < p; s++) { /* the host waits for it: exposed communication */
		rep->stage[s].step_s += rep->sync_s;
		rep->stage[s].comm_s += rep->sync_s;
		rep->stage[s].exposed_s += rep->sync_s;
	}
	for (int s = 1; s < p; s++)
		if (rep->stage[s].step_s > rep->stage[rep->slowest].step_s)
			rep->slowest = s;
	rep->res = rep->stage[rep->slowest];
	rep->res.spans = NULL, rep->res.nspans = rep->res.capspans = 0;
	double tokens, epi;
	/* per rank: at pp > 1 the unrolled program's every stage and copy,
	 * which roofline counts grad_accum times, shared by the p stages */
	rep->model_flops = roofline_model_flops(g, &tokens, &epi) / copies / p;
	rep->tokens = tokens;
	return 0;
}

/*
 * --plan's class bound (compiler/plan.c): the step of g with only what a
 * micro-batch's path needs on every data-parallel strategy, bucket size,
 * prefetch depth and split of the data-parallel ranks between
 * dp_replicate and dp_shard. From sim_build's ops:
 *
 *  - kept: the kernels that write a per-sample value (a batch dim: the
 *    forward, recomputation and input gradients, the loads), at their
 *    duration; every GEMM (the weight gradients write parameter-shaped
 *    values) at its overhead and FLOPs alone (its bytes term, and an
 *    accumulating GEMM's add, depend on where the strategy puts the
 *    gradient); the pipeline transfers; the collectives over tp and cp
 *    alone that move a per-sample value (tp_reduce, cp's K/V gathers);
 *  - removed (a kernel of no time on the compute stream, waiting for
 *    nothing): every other collective (the gradients' reductions, the
 *    parameters' gathers, the update's, the loss and norm all_reduces, at
 *    any bucket size); a comm-stream wait whose next collective on the
 *    stream is removed (it guards that collective); a wait for an event
 *    recorded on a comm stream whose last collective before it is removed
 *    (or none); every other kernel (fills, gradient accumulation, casts of
 *    parameters, the optimizer's update on its shard).
 *
 * The replay's times are maxima and sums of op durations and of the times
 * the ops wait for (the gpu executor's streams are serial; the cpu
 * executor's collectives share links, and fewer of them only move faster),
 * so removing ops and waits, and shortening kernels, never makes an op
 * end later: the answer is at most g's simulated step. What is kept is
 * the same ops in the same order for every strategy, knob and split of
 * the same mesh axes pp, tp, cp, schedule, stages_per_rank, grad_accum and
 * checkpointing (the passes place the model's kernels, transfers and tp
 * collectives without looking at the data-parallel strategy), so one
 * compile's answer bounds the steps of all of them; plan.c checks that
 * against every candidate it simulates, and tests/simulate.sh against
 * every candidate of four models (DPC_PLAN_CHECK). -1: g offloads (the
 * copy stream's ops are the strategy's), else 0 and *step_s.
 */
static double core_kernel_s(const Graph *g, const Node *n, const Machine *mc)
{
	double f = 0, b = 0;
	ir_ops[n->op].cost(g, n, &f, &b);
	if (n->op == DP_OP_MATMUL && DP_ATTR(n, MATMUL, acc))
		f -= (double)ir_numel(g->values[n->out]); /* the accumulation's add */
	double m, nn, k;
	int gd = gemm_dims(g, n, f, &m, &nn, &k);
	double rate = machine_gemm_rate(mc, gd, m, nn, k), over = mc->kernel_overhead_s, bw = 0;
	machine_op_figures(mc, ir_ops[n->op].name, line_dtype(g, n), &rate, &bw, &over);
	return over + f / rate;
}

static int per_sample(const Graph *g, int v)
{
	return v >= 0 && g->values[v]->batch_dim >= 0 && g->values[v]->batch_dim < g->values[v]->ndim;
}

int sim_core_step(const Graph *g, const Machine *mc, double *step_s)
{
	if (ir_any_offload(g))
		return -1;
	SimOp *o;
	int n, *which;
	sim_build(g, mc, &o, &n, &which);
	const unsigned path_axes = DP_AXIS_BIT(DP_AXIS_TP) | DP_AXIS_BIT(DP_AXIS_CP);
	char *drop = calloc((size_t)n + 1, 1), *dp_event = calloc((size_t)g->nevents + 1, 1);
	int *pending = malloc(sizeof *pending * ((size_t)n + 1)), npending = 0;
	/* per stream and stage (slot st + 1; slot 0 at pp = 1): is the last
	 * collective before here removed (or is there none)? */
	int p = g->cfg.mesh[DP_AXIS_PP] > 1 ? (int)g->cfg.mesh[DP_AXIS_PP] : 1;
	char *last_drop = malloc((size_t)DP_NSTREAM * ((size_t)p + 1));
	if (!drop || !dp_event || !pending || !last_drop)
		die("out of memory");
	memset(last_drop, 1, (size_t)DP_NSTREAM * ((size_t)p + 1));
	for (int k = 0; k < n; k++) {
		const Node *nd = g->nodes[which[k]];
		SimOp *s = &o[k];
		switch (s->kind) {
		case SIM_KERNEL:
			if (dp_op_is_gemm(nd->op) && ir_ops[nd->op].cost)
				s->dur = core_kernel_s(g, nd, mc);
			else
				drop[k] = !per_sample(g, nd->out);
			break;
		case SIM_COLL: {
			int v = nd->out >= 0 ? nd->out : nd->nin ? nd->in[0] : -1;
			drop[k] = !(nd->op == DP_OP_SEND || nd->op == DP_OP_RECV ||
				    (!((unsigned)DP_AXES(nd) & ~path_axes) && per_sample(g, v)));
			/* the waits before it on its stream guard it */
			int keep = 0;
			for (int i = 0; i < npending; i++) {
				const SimOp *w = &o[pending[i]];
				if (w->stream == s->stream && (w->stage < 0 || s->stage < 0 || w->stage == s->stage))
					drop[pending[i]] |= drop[k];
				else
					pending[keep++] = pending[i];
			}
			npending = keep;
			for (int st = 0; st <= p; st++) /* a collective of every stage: each slot */
				if (s->stage < 0 || st == s->stage + 1)
					last_drop[s->stream * (p + 1) + st] = drop[k];
			break;
		}
		case SIM_RECORD: /* of every stage: removed where any stage's is */
			for (int st = 0; st <= p && s->stream != DP_STREAM_COMPUTE; st++)
				if (s->stage < 0 ? st > 0 || p == 1 : st == s->stage + 1)
					dp_event[s->event] |= last_drop[s->stream * (p + 1) + st];
			break;
		case SIM_WAIT:
			if (s->stream == DP_STREAM_COMPUTE)
				drop[k] = dp_event[s->event];
			else
				pending[npending++] = k;
			break;
		}
	}
	for (int i = 0; i < npending; i++) /* guarding nothing */
		drop[pending[i]] = 1;
	for (int k = 0; k < n; k++)
		if (drop[k])
			o[k] = (SimOp){.kind = SIM_KERNEL, .stream = DP_STREAM_COMPUTE, .flags = o[k].flags,
				       .stage = o[k].stage, .peer = -1};
	double bw[MACH_NLINK];
	for (int l = 0; l < MACH_NLINK; l++)
		bw[l] = mc->link[l].busbw;
	SimResult *r = calloc((size_t)p, sizeof *r);
	if (!r)
		die("out of memory");
	int rc = 0;
	if (p == 1)
		sim_run(o, n, g->cfg.grad_accum ? (int)g->cfg.grad_accum : 1, mc->executor, bw, g->nevents, r);
	else
		rc = sim_run_stages(o, n, p, mc->executor, bw, g->nevents, r) < 0 ? -1 : 0;
	*step_s = 0;
	for (int s = 0; s < p; s++)
		*step_s = fmax(*step_s, r[s].step_s);
	free(r), free(o), free(which), free(drop), free(dp_event), free(pending), free(last_drop);
	return rc;
}

void sim_report_free(SimReport *rep)
{
	free(rep->ops);
	free(rep->nodes);
	for (int s = 0; s < rep->nstages; s++)
		free(rep->stage[s].spans);
	free(rep->stage);
	memset(rep, 0, sizeof *rep);
}

/* The ops whose kernels take another dtype's line (util/machine.h: the
 * op has no line of their dtype, nor one for every dtype), each once. */
static void print_borrowed(FILE *out, const Graph *g, const Machine *mc)
{
	static const char *const dt[MACH_NDTYPE] = {"f32", "bf16"};
	char seen[DP_NOPS][MACH_NDTYPE] = {{0}};
	int any = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		int d = line_dtype(g, n), borrowed;
		if (dp_op_class(n->op) != DP_OPC_KERNEL || seen[n->op][d])
			continue;
		seen[n->op][d] = 1;
		machine_op_line(mc, ir_ops[n->op].name, d, &borrowed);
		if (!borrowed)
			continue;
		fprintf(out, "%s %s (%s) on its %s line", any ? "," : "machine file: no line of their dtype for",
			ir_ops[n->op].name, dt[d], dt[!d]);
		any = 1;
	}
	if (any)
		fprintf(out, "\n");
}

void sim_print(FILE *out, const Graph *g, const Machine *mc, const SimReport *rep)
{
	const SimResult *r = &rep->res;
	char h[64];
	int accum = g->cfg.grad_accum ? (int)g->cfg.grad_accum : 1;
	double ms = 1e3, step = r->step_s > 0 ? r->step_s : 1e-30;
	fprintf(out, "simulated on %s (%s executor), per rank, per optimizer step (%d micro-batch%s)",
		mc->name, mc->executor == MACH_CPU ? "cpu" : "gpu", accum, accum == 1 ? "" : "es");
	if (rep->nstages > 1)
		fprintf(out, ", pp=%d: the slowest stage's (%d)", rep->nstages, rep->slowest);
	fprintf(out, "\n");
	if (mc->source && *mc->source)
		fprintf(out, "machine: %s\n", mc->source);
	print_borrowed(out, g, mc);
	fprintf(out, "%-16s %12.4f ms\n", "step time", r->step_s * ms);
	fprintf(out, "%-16s %12.4f ms   compute stream busy %.1f %%\n", "compute",
		r->busy[DP_STREAM_COMPUTE] * ms, 100 * r->busy[DP_STREAM_COMPUTE] / step);
	fprintf(out, "%-16s %12.4f ms   comm stream busy %.1f %%\n", "communication", r->comm_s * ms,
		100 * r->busy[DP_STREAM_COMM] / step);
	if (rep->nstages > 1) /* a stage also waits for its neighbours' work */
		fprintf(out, "%-16s %12.4f ms   (the compute stream's waits: communication and the "
			"pipeline's bubble)\n", "exposed comm", r->exposed_s * ms);
	else
		fprintf(out, "%-16s %12.4f ms   (%.1f %% of the communication hidden behind compute)\n",
			"exposed comm", r->exposed_s * ms,
			r->comm_s > 0 ? 100 * (1 - fmin(1, r->exposed_s / r->comm_s)) : 100.0);
	if (rep->sync_s > 0)
		fprintf(out, "%-16s %12.4f ms   (dpexec's per-step loss all_reduce and sync point, in "
			"the exposed comm)\n", "sync point", rep->sync_s * ms);
	fprintf(out, "%-16s %12lld B  (%s: the memory plan's arena)\n", "peak memory",
		(long long)g->peak_bytes, stats_human_bytes(h, sizeof h, (double)g->peak_bytes));
	if (rep->nstages > 1) {
		/* each stage's compute stream idle over the step: the pipeline's
		 * bubble (with the waits for the once-per-step collectives) */
		double idle = 0;
		for (int s = 0; s < rep->nstages; s++) {
			const SimResult *q = &rep->stage[s];
			double f = 1 - q->busy[DP_STREAM_COMPUTE] / step;
			idle += f / rep->nstages;
			fprintf(out, "%-16s %12.4f ms   compute %.4f ms, exposed comm %.4f ms, idle %.1f %% "
				"of the step\n", s ? "" : "stages", q->step_s * ms,
				q->busy[DP_STREAM_COMPUTE] * ms, q->exposed_s * ms, 100 * f);
		}
		fprintf(out, "%-16s %12.1f %%    (the stages' idle mean; --stats' forecast from the "
			"FLOPs ", "bubble", 100 * idle);
		if (rep->forecast_bubble >= 0)
			fprintf(out, "%.1f %%", 100 * rep->forecast_bubble);
		else
			fprintf(out, "none");
		fprintf(out, "; pairing settled in %d sweeps)\n", rep->sweeps);
	}
	fprintf(out, "%-16s %12.1f %%    (model flops %s over the step at %.1f TFLOP/s bf16", "MFU",
		100 * rep->model_flops / (step * mc->peak_flops[MACH_BF16]),
		stats_human_flops(h, sizeof h, rep->model_flops), mc->peak_flops[MACH_BF16] / 1e12);
	if (rep->tokens > 0)
		fprintf(out, "; %.0f tokens/s", rep->tokens / step);
	fprintf(out, ")\n");
}

static void json_name(FILE *f, const char *s)
{
	for (; *s; s++)
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
}

/* One free comm lane for [t0, t1): collectives that overlap without
 * nesting take further lanes, as runtime/trace.c places them. */
static int comm_lane(double *lane_end, int *nlanes, double t0, double t1)
{
	for (int l = 0; l < *nlanes; l++)
		if (lane_end[l] <= t0) {
			lane_end[l] = t1;
			return l + 1;
		}
	if (*nlanes < 64)
		lane_end[(*nlanes)++] = t1;
	return *nlanes;
}

/* Seconds as the file's microseconds, rounded to its 3 decimals first, so
 * that a span that ends where the next begins is printed so. */
static double us(double t)
{
	return nearbyint(t * 1e9) / 1e3;
}

static int by_start(const void *a, const void *b)
{
	const SimSpan *x = a, *y = b;
	return (x->t0 > y->t0) - (x->t0 < y->t0);
}

/* Stage st's timeline as process pid (its first rank, as dpexec's pid). */
static void trace_stage(FILE *f, const Graph *g, const SimReport *rep, int st, int pid)
{
	SimResult *r = &rep->stage[st];
	qsort(r->spans, (size_t)r->nspans, sizeof *r->spans, by_start);
	double lane_end[64];
	int nlanes = 0;
	for (int i = 0; i < r->nspans; i++)
		if (r->spans[i].lane > 0)
			r->spans[i].lane = comm_lane(lane_end, &nlanes, r->spans[i].t0, r->spans[i].t1);
	/* a span per micro-batch's run around its compute-lane spans, as
	 * dpexec's "step 1 micro N" (at pp > 1 one run holds them all) */
	int runs = rep->nstages > 1 ? 1 : g->cfg.grad_accum ? (int)g->cfg.grad_accum : 1;
	for (int mb = 0; mb < runs; mb++) {
		double t0 = INFINITY, t1 = -INFINITY;
		for (int i = 0; i < r->nspans; i++)
			if (r->spans[i].micro == mb && r->spans[i].lane <= 0) {
				t0 = fmin(t0, r->spans[i].t0);
				t1 = fmax(t1, r->spans[i].t1);
			}
		if (t0 <= t1)
			fprintf(f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"run\","
				   "\"name\":\"step 1 micro %d\",\"args\":{\"program\":\"step\"}},\n",
				pid, us(t0), us(t1) - us(t0), mb);
	}
	for (int i = 0; i < r->nspans; i++) {
		const SimSpan *sp = &r->spans[i];
		const Node *n = g->nodes[rep->nodes[sp->op]];
		int coll = dp_is_collective(n->op), wait = sp->lane < 0;
		const char *cat = wait ? "wait" : coll ? "collective" : dp_op_class(n->op) == DP_OPC_LOAD ? "load"
							: dp_op_class(n->op) == DP_OPC_SHARD ? "shard" : "kernel";
		fprintf(f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"%s\","
			   "\"name\":\"", pid, wait ? 0 : sp->lane, us(sp->t0), us(sp->t1) - us(sp->t0), cat);
		if (wait)
			fprintf(f, "wait ev=%lld", (long long)DP_EVENT(n));
		else if (n->out >= 0) {
			fprintf(f, "%%");
			json_name(f, g->values[n->out]->name);
			fprintf(f, " = %s", ir_ops[n->op].name);
		} else
			fprintf(f, "%s", ir_ops[n->op].name);
		fprintf(f, "\",\"args\":{\"instr\":%d,\"stream\":\"%s\",\"step\":1,\"micro\":%d", sp->op,
			dp_stream_names[n->stream], sp->micro);
		if (coll && !wait) {
			int io = n->op == DP_OP_REDUCE_SCATTER || n->op == DP_OP_SEND ? n->in[0] : n->out;
			const Value *v = g->values[io];
			fprintf(f, ",\"bytes\":%lld,\"axes\":\"",
				(long long)ir_numel(v) * (long long)ir_dtype_size(v->dtype));
			for (int a = 0, first = 1; a < DP_MAX_AXES; a++)
				if (DP_AXES(n) & DP_AXIS_BIT(a)) {
					fprintf(f, "%s%s", first ? "" : ",", ir_axis_names[a]);
					first = 0;
				}
			fprintf(f, "\"");
		}
		fprintf(f, "}},\n");
	}
	fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
		   "\"compute\"}},\n", pid);
	for (int l = 0; l < nlanes; l++) {
		fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{"
			   "\"name\":\"comm", pid, l + 1);
		fprintf(f, l ? " %d\"}},\n" : "\"}},\n", l + 1);
	}
}

void sim_trace(FILE *f, const Graph *g, const SimReport *rep)
{
	int64_t per_stage = 1; /* ranks per stage: pp is the outermost axis */
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (a != DP_AXIS_PP && g->cfg.mesh[a] > 0)
			per_stage *= g->cfg.mesh[a];
	fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
	for (int s = 0; s < rep->nstages; s++)
		trace_stage(f, g, rep, s, (int)(s * per_stage));
	/* the names last: the last one closes the list without a comma */
	for (int s = 0; s < rep->nstages; s++) {
		fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
			   "\"rank %lld", (int)(s * per_stage), (long long)(s * per_stage));
		if (rep->nstages > 1)
			fprintf(f, ", stage %d", s);
		fprintf(f, " (predicted)\"}}%s\n", s + 1 < rep->nstages ? "," : "");
	}
	fprintf(f, "]}\n");
}
