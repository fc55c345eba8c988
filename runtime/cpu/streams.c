/*
 * cpu/streams.c - the CPU backend's streams (exec.h says what they
 * mean), its events and its collectives: the members of BackendOps that a
 * GPU gets from CUDA streams, done on the host.
 *
 * The streams run inline, on the thread that walks the program: a compute
 * instruction runs when the walk reaches it (its kernel on the rank's
 * pool), and a collective on the comm stream is started non-blocking on
 * the MPI comm backend (comm.h) and keeps running while the compute after
 * it executes. Why inline and not a second thread for the comm stream:
 * Open MPI advances a non-blocking collective only inside MPI calls, and
 * the MPI_Testall that this file makes before every instruction of a run
 * (progress, while any collective is in flight) is what moves the
 * collectives forward beside the compute; bench/overlap.sh measures that
 * overlap (docs/PERF.md). A thread would need MPI_THREAD_MULTIPLE and would
 * take a core from the kernels' pool.
 *
 * Events are comm tickets: EVENT_RECORD on comm remembers the ticket after
 * every collective issued so far, EVENT_WAIT on compute waits for those of
 * the comm stream among them (and they are then visible to compute). The
 * p2p stream (the pipeline's sends and receives, DP_STREAM_P2P) is a queue
 * of its own beside the comm stream, as on a GPU: an event recorded on it
 * covers its own transfers only, a transfer waits for the transfers before
 * it and a collective for the collectives before it (each stream's order),
 * so a send that waits for its receiver holds no tp all_reduce issued after
 * it (MPI's nonblocking sends never did; the walk's waits on every earlier
 * ticket did). An event recorded on
 * compute marks work that is already done, and a wait on the comm stream
 * needs nothing (compute before it has run). A kernel on the comm stream
 * runs after the collectives issued before it that touch its memory (stream
 * order, for all that it can observe: conflict_ticket). The copy stream
 * (offload's H2D of an updated shard) runs inline too, as the walk reaches
 * it, after the collectives in flight on its memory; an event recorded on
 * it is done when recorded.
 *
 * Hazards. What a GPU would race on is an error here: a compute-stream
 * instruction that touches memory of a collective no event has made
 * visible yet (reads against its writes; writes against its reads and
 * writes) fails the run naming both instructions; collectives move device
 * memory, so an operand in the host arena (offload) is never one. Two collectives on
 * overlapping memory are serialised (two MPI requests on one buffer would
 * race).
 */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* A collective on the comm stream that compute may not see yet. */
typedef struct {
	int64_t ticket;    /* its comm ticket */
	uint64_t rlo, rhi; /* arena bytes it reads */
	uint64_t wlo, whi; /* arena bytes it writes */
	uint32_t instr;    /* its index in the program, for messages */
	int stream;        /* the stream it runs on (comm or p2p) */
} InFlight;

struct CpuStreams {
	const DpStep *s;
	Comm *comm;
	int no_progress;       /* BackendOpts.no_progress */
	int in_run;            /* between run_begin and run_end: Backend.at is the walk's */
	int64_t *event_ticket; /* [nevents]: comm ticket the event covers; -1: on compute */
	unsigned char *event_stream; /* [nevents]: the stream that recorded it */
	InFlight *fl;          /* collectives not yet made visible to compute */
	int nfl, capfl;
};

int cpu_streams_new(CpuStreams **out, const DpStep *s, Comm *comm, int no_progress, RtErr *e)
{
	CpuStreams *st = calloc(1, sizeof *st);
	if (!st || !(st->event_ticket = calloc(s->nevents ? s->nevents : 1, sizeof(int64_t))) ||
	    !(st->event_stream = calloc(s->nevents ? s->nevents : 1, 1))) {
		if (st)
			free(st->event_ticket);
		free(st);
		return RT_FAIL(e, "out of memory (CPU streams)");
	}
	st->s = s;
	st->comm = comm;
	st->no_progress = no_progress;
	*out = st;
	return 0;
}

void cpu_streams_free(CpuStreams *st)
{
	if (!st)
		return;
	free(st->event_ticket);
	free(st->event_stream);
	free(st->fl);
	free(st);
}

static void range_of(const DpStep *s, int id, uint64_t *lo, uint64_t *hi)
{
	if (id < 0) {
		*lo = *hi = 0;
		return;
	}
	*lo = s->tensors[id].offset;
	*hi = *lo + s->tensors[id].nbytes;
}

static int overlap(uint64_t alo, uint64_t ahi, uint64_t blo, uint64_t bhi)
{
	return alo < bhi && blo < ahi;
}

/* The operand of instruction in (-1 for out, else in[k]) that conflicts
 * with collective fl in flight: it reads what fl writes, or writes what fl
 * touches; -1 if none. Collectives move device memory: an operand in the
 * host arena (offload) never conflicts, whatever its offset. */
static int conflict(const DpStep *s, const DpInstr *in, const InFlight *fl)
{
	for (int k = -1; k < DP_MAX_IN; k++) {
		int id = k < 0 ? in->out : in->in[k];
		if (id < 0 || s->tensors[id].space != DP_SPACE_DEVICE)
			continue;
		uint64_t lo, hi;
		range_of(s, id, &lo, &hi);
		if (overlap(lo, hi, fl->wlo, fl->whi) || (k < 0 && overlap(lo, hi, fl->rlo, fl->rhi)))
			return id;
	}
	return -1;
}

/* Does instruction idx of program p (on the compute stream) touch memory of
 * a collective in flight? */
static int check_hazard(CpuStreams *st, int p, uint32_t idx, RtErr *e)
{
	const DpStep *s = st->s;
	const DpInstr *in = &s->prog[p][idx];
	for (int f = 0; f < st->nfl; f++) {
		InFlight *fl = &st->fl[f];
		int id = conflict(s, in, fl);
		if (id >= 0) {
			const DpInstr *c = &s->prog[p][fl->instr];
			return RT_FAIL(e,
				       "schedule error in the %s program: instruction %u (%s) "
				       "touches '%s' while instruction %u (%s of '%s') is in "
				       "flight with no event_wait before it",
				       dp_prog_names[p], idx, dp_op_names[in->op],
				       cpu_tname(s, id), fl->instr, dp_op_names[c->op],
				       cpu_tname(s, c->out));
		}
	}
	return 0;
}

/* Until the one collective `ticket` has completed (the comm backend's
 * wait_one, else every ticket up to it). */
static int wait_one(Comm *c, int64_t ticket, RtErr *e)
{
	return c->ops->wait_one ? c->ops->wait_one(c, ticket, e) : c->ops->wait(c, ticket + 1, e);
}

/* A kernel on the comm stream (offload's D2H of a gradient) runs after
 * the collectives before it. Inline, it need only wait for those in flight
 * whose memory it conflicts with: the others touch none of its bytes, so
 * running it before they finish is the same (and compute keeps its overlap
 * with, say, a prefetched all_gather). */
static int wait_conflicts(CpuStreams *st, const DpInstr *in, RtErr *e)
{
	for (int f = 0; f < st->nfl; f++)
		if (conflict(st->s, in, &st->fl[f]) >= 0)
			RT_CHECK(wait_one(st->comm, st->fl[f].ticket, e));
	return 0;
}

/* Stream order: the collectives in flight on `stream`, each done. */
static int wait_stream(CpuStreams *st, int stream, RtErr *e)
{
	for (int f = 0; f < st->nfl; f++)
		if (st->fl[f].stream == stream)
			RT_CHECK(wait_one(st->comm, st->fl[f].ticket, e));
	return 0;
}

/* The compute stream has waited for every ticket < upto of `stream`:
 * forget those. */
static void retire(CpuStreams *st, int64_t upto, int stream)
{
	int k = 0;
	for (int f = 0; f < st->nfl; f++)
		if (st->fl[f].ticket >= upto || st->fl[f].stream != stream)
			st->fl[k++] = st->fl[f];
	st->nfl = k;
}

/* Between instructions: let the collectives in flight advance. */
static int poll(CpuStreams *st, RtErr *e)
{
	Comm *c = st->comm;
	return st->nfl && !st->no_progress ? c->ops->progress(c, e) : 0;
}

void cpu_streams_begin(CpuStreams *st)
{
	st->nfl = 0;
	st->in_run = 1;
}

int cpu_streams_end(CpuStreams *st, RtErr *e)
{
	Comm *c = st->comm;
	st->in_run = 0;
	st->nfl = 0;
	return c->ops->wait(c, c->issued, e); /* compute joins comm: the run is complete */
}

int cpu_streams_sync(CpuStreams *st, RtErr *e)
{
	Comm *c = st->comm;
	return c->ops->wait(c, c->issued, e);
}

int cpu_streams_enter(CpuStreams *st, const BackendAt *at, RtErr *e)
{
	if (!st->in_run)
		return 0; /* outside a run nothing is in flight */
	const DpInstr *in = &st->s->prog[at->prog][at->instr];
	RT_CHECK(poll(st, e));
	if (in->stream != DP_STREAM_COMPUTE && dp_is_collective(in->op))
		return wait_stream(st, in->stream, e); /* stream order: after those before it */
	if (in->stream != DP_STREAM_COMPUTE) /* a copy on the comm or copy stream */
		return wait_conflicts(st, in, e);
	return st->nfl ? check_hazard(st, at->prog, at->instr, e) : 0;
}

int cpu_streams_event_record(CpuStreams *st, unsigned stream, unsigned ev, RtErr *e)
{
	RT_CHECK(poll(st, e));
	/* comm, p2p: every collective issued so far (of that stream); compute,
	 * copy: done now */
	int async = stream == DP_STREAM_COMM || stream == DP_STREAM_P2P;
	st->event_ticket[ev] = async ? st->comm->issued : -1;
	st->event_stream[ev] = (unsigned char)stream;
	return 0;
}

int cpu_streams_event_wait(CpuStreams *st, unsigned stream, unsigned ev, RtErr *e)
{
	Comm *c = st->comm;
	RT_CHECK(poll(st, e));
	/* a wait on the comm or copy stream orders its work after what has
	 * already run (compute, the copy stream's inline copies): nothing to do */
	if (stream == DP_STREAM_COMPUTE && st->event_ticket[ev] >= 0) {
		int from = st->event_stream[ev];
		for (int f = 0; f < st->nfl; f++)
			if (st->fl[f].stream == from && st->fl[f].ticket < st->event_ticket[ev])
				RT_CHECK(wait_one(c, st->fl[f].ticket, e));
		retire(st, st->event_ticket[ev], from);
	}
	return 0;
}

int cpu_streams_collective(CpuStreams *st, const BackendAt *at, void *const *ptr,
			   const DpInstr *in, RtErr *e)
{
	const DpStep *s = st->s;
	Comm *c = st->comm;
	unsigned axes = (unsigned)DP_AXES(in);
	InFlight fl = {.instr = at->instr, .stream = in->stream};
	RT_CHECK(poll(st, e));
	if (in->stream == DP_STREAM_COMPUTE)
		RT_CHECK(check_hazard(st, at->prog, at->instr, e));
	range_of(s, in->in[0] >= 0 ? in->in[0] : in->out, &fl.rlo, &fl.rhi);
	range_of(s, in->out, &fl.wlo, &fl.whi);
	/* Stream order: a collective may not start while an earlier one on
	 * overlapping memory is still running (two outstanding MPI requests on
	 * the same buffer would race). */
	for (int f = 0; f < st->nfl; f++)
		if (overlap(fl.rlo, fl.rhi, st->fl[f].wlo, st->fl[f].whi) ||
		    overlap(fl.wlo, fl.whi, st->fl[f].rlo, st->fl[f].rhi) ||
		    overlap(fl.wlo, fl.whi, st->fl[f].wlo, st->fl[f].whi))
			RT_CHECK(wait_one(c, st->fl[f].ticket, e));
	/* the tensor it moves: out, or a send's in0 */
	int whole = in->out >= 0 ? in->out : in->in[0];
	void *out = ptr[whole];
	int64_t n = dp_numel(&s->tensors[whole]);
	DpDtype dt = (DpDtype)s->tensors[whole].dtype; /* in0's too (the decoder) */
	switch (in->op) {
	case DP_OP_SEND:
		RT_CHECK(c->ops->send_start(c, axes, (int)DP_PEER(in), (int)DP_TAG(in), dt, out, n, &fl.ticket, e));
		break;
	case DP_OP_RECV:
		RT_CHECK(c->ops->recv_start(c, axes, (int)DP_PEER(in), (int)DP_TAG(in), dt, out, n, &fl.ticket, e));
		break;
	case DP_OP_TP_REDUCE:
		/* out-of-place: the input is complete when the collective is issued
		 * (the schedule's events say so), so copy it and reduce in place */
		if (ptr[in->in[0]] != out)
			memmove(out, ptr[in->in[0]], (size_t)n * dp_dtype_size(dt));
		RT_CHECK(c->ops->all_reduce_start(c, axes, 0, dt, out, n, &fl.ticket, e));
		break;
	case DP_OP_ALL_REDUCE:
		RT_CHECK(c->ops->all_reduce_start(c, axes, (uint64_t)DP_ATTR(in, ALL_REDUCE, stages), dt,
						  out, n, &fl.ticket, e));
		break;
	case DP_OP_REDUCE_SCATTER:
		RT_CHECK(c->ops->reduce_scatter_start(c, axes, dt, ptr[in->in[0]], out, n,
						      &fl.ticket, e));
		break;
	default:
		RT_CHECK(c->ops->all_gather_start(c, axes, dt, ptr[in->in[0]], out,
						  dp_numel(&s->tensors[in->in[0]]), &fl.ticket, e));
		break;
	}
	if (in->stream == DP_STREAM_COMPUTE)
		return wait_one(c, fl.ticket, e); /* synchronous on the compute stream */
	if (st->nfl == st->capfl) {
		int cap = st->capfl ? 2 * st->capfl : 32;
		InFlight *p2 = realloc(st->fl, (size_t)cap * sizeof *p2);
		if (!p2)
			return RT_FAIL(e, "out of memory (in-flight collectives)");
		st->fl = p2;
		st->capfl = cap;
	}
	st->fl[st->nfl++] = fl;
	return 0;
}
