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
 * order, for all that it can observe: wait_conflicts).
 *
 * The copy stream (offload's D2H of a reduced gradient, its H2D of an
 * updated shard and, without clipping, the host update between them) is a
 * queue: the walk enqueues a copy (with the count of
 * the collectives issued before it: those of them in flight on its memory
 * it will wait for) and runs it when something needs it: a wait on compute or comm for
 * an event recorded on the copy stream after it, an instruction of another
 * stream that touches its memory (reads what it writes, writes what it
 * touches: what a GPU would race on, so a schedule has a wait there
 * anyway), and the run's end. In order, all the copies before it first. An
 * event recorded on the copy stream covers the copies enqueued so far. Why
 * a queue and not inline: a D2H sits right after its reduce_scatter, and
 * run there it would wait for that collective, so the rank would block on
 * its peers' skew where without offload the next GEMM runs first and the
 * wait comes later, overlapped (bench/offload.sh, docs/OFFLOAD.md). The
 * copies are memcpy, so when they run changes no bit.
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

/* What an event recorded covers. */
typedef struct {
	int64_t ticket; /* comm or p2p: the tickets issued before it (of that stream); -1: compute or copy */
	int64_t copies; /* copy: the copies enqueued before it; 0: other streams */
	int stream;     /* the stream that recorded it */
} Event;

/* A copy-stream instruction enqueued, not yet run. */
typedef struct {
	const DpInstr *in;
	BackendAt at;      /* where the walk enqueued it, for the kernel and messages */
	int64_t issued;    /* the collectives issued before it: those in flight on its memory complete before it runs */
} Copy;

struct CpuStreams {
	const DpStep *s;
	Comm *comm;
	int no_progress;       /* BackendOpts.no_progress */
	int in_run;            /* between run_begin and run_end: Backend.at is the walk's */
	Event *ev;             /* [nevents]: what each event covers */
	InFlight *fl;          /* collectives not yet made visible to compute */
	int nfl, capfl;
	Copy *cq;              /* the copy stream's queue: cq[0 .. ncq) enqueued this run */
	int ncq, capcq;
	int cq_done;           /* cq[0 .. cq_done) have run */
	CpuCopyRun run_copy;   /* runs one copy (the backend's kernel call) */
	void *run_ctx;
};

int cpu_streams_new(CpuStreams **out, const DpStep *s, Comm *comm, int no_progress,
		    CpuCopyRun run_copy, void *run_ctx, RtErr *e)
{
	CpuStreams *st = calloc(1, sizeof *st);
	size_t nev = s->nevents ? s->nevents : 1;
	if (!st || !(st->ev = calloc(nev, sizeof *st->ev))) {
		cpu_streams_free(st);
		return RT_FAIL(e, "out of memory (CPU streams)");
	}
	st->s = s;
	st->comm = comm;
	st->no_progress = no_progress;
	st->run_copy = run_copy;
	st->run_ctx = run_ctx;
	*out = st;
	return 0;
}

void cpu_streams_free(CpuStreams *st)
{
	if (!st)
		return;
	free(st->ev);
	free(st->fl);
	free(st->cq);
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

/* A kernel on the comm or copy stream (offload's D2H of a gradient) runs
 * after the collectives issued before it (tickets below `issued`). It need
 * only wait for those in flight whose memory it conflicts with: the others
 * touch none of its bytes, so running it before they finish is the same
 * (and compute keeps its overlap with, say, a prefetched all_gather). */
static int wait_conflicts(CpuStreams *st, const DpInstr *in, int64_t issued, RtErr *e)
{
	for (int f = 0; f < st->nfl; f++)
		if (st->fl[f].ticket < issued && conflict(st->s, in, &st->fl[f]) >= 0)
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

/* Room in array *a (capacity *cap elements of el bytes) for element n. */
static int room(void **a, int *cap, int n, size_t el, const char *what, RtErr *e)
{
	if (n < *cap)
		return 0;
	int c = *cap ? 2 * *cap : 32;
	void *p = realloc(*a, (size_t)c * el);
	if (!p)
		return RT_FAIL(e, "out of memory (%s)", what);
	*a = p;
	*cap = c;
	return 0;
}

/* Do tensors a and b share bytes (in the same arena)? */
static int touches(const DpStep *s, int a, int b)
{
	if (a < 0 || b < 0 || s->tensors[a].space != s->tensors[b].space)
		return 0;
	uint64_t alo, ahi, blo, bhi;
	range_of(s, a, &alo, &ahi);
	range_of(s, b, &blo, &bhi);
	return overlap(alo, ahi, blo, bhi);
}

/* Does instruction a write (its out, an input it updates) memory b touches? */
static int writes_into(const DpStep *s, const DpInstr *a, const DpInstr *b)
{
	for (int w = -1; w < DP_MAX_IN; w++) {
		int t = w < 0 ? a->out : dp_writes_in(a, w) ? a->in[w] : -1;
		if (t < 0)
			continue;
		if (touches(s, t, b->out))
			return 1;
		for (int k = 0; k < DP_MAX_IN; k++)
			if (touches(s, t, b->in[k]))
				return 1;
	}
	return 0;
}

/* Would instruction in race with queued c on a GPU: one writes what the
 * other touches? (A copy writes its out and reads its in0; a host update
 * on the copy stream, offload without clipping, also writes its state.) */
static int copy_conflict(const DpStep *s, const DpInstr *in, const Copy *c)
{
	return writes_into(s, c->in, in) || writes_into(s, in, c->in);
}

/* Run the queued copies cq[cq_done .. upto), in order, each after the
 * collectives it waits for. */
static int run_copies(CpuStreams *st, int upto, RtErr *e)
{
	for (; st->cq_done < upto; st->cq_done++) {
		const Copy *q = &st->cq[st->cq_done];
		RT_CHECK(wait_conflicts(st, q->in, q->issued, e));
		RT_CHECK(st->run_copy(st->run_ctx, &q->at, q->in, e));
	}
	return 0;
}

/* Before instruction in of another stream: the queued copies it races
 * with have run (and those before them). */
static int copies_before(CpuStreams *st, const DpInstr *in, RtErr *e)
{
	for (int k = st->ncq - 1; k >= st->cq_done; k--)
		if (copy_conflict(st->s, in, &st->cq[k]))
			return run_copies(st, k + 1, e);
	return 0;
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
	st->ncq = st->cq_done = 0;
	st->in_run = 1;
}

int cpu_streams_end(CpuStreams *st, RtErr *e)
{
	Comm *c = st->comm;
	RT_CHECK(run_copies(st, st->ncq, e)); /* compute joins copy */
	st->in_run = 0;
	st->nfl = 0;
	st->ncq = st->cq_done = 0;
	return c->ops->wait(c, c->issued, e); /* compute joins comm: the run is complete */
}

int cpu_streams_sync(CpuStreams *st, RtErr *e)
{
	Comm *c = st->comm;
	RT_CHECK(run_copies(st, st->ncq, e));
	return c->ops->wait(c, c->issued, e);
}

int cpu_streams_defer(CpuStreams *st, const BackendAt *at, const DpInstr *in, RtErr *e)
{
	if (!st->in_run || in->stream != DP_STREAM_COPY)
		return 0;
	RT_CHECK(poll(st, e));
	RT_CHECK(room((void **)&st->cq, &st->capcq, st->ncq, sizeof *st->cq,
		      "the copy stream's queue", e));
	/* the collectives in flight on its memory now: those issued later are
	 * after it in the schedule's order */
	st->cq[st->ncq++] = (Copy){.in = in, .at = *at, .issued = st->comm->issued};
	return 1;
}

int cpu_streams_enter(CpuStreams *st, const BackendAt *at, RtErr *e)
{
	if (!st->in_run)
		return 0; /* outside a run nothing is in flight */
	const DpInstr *in = &st->s->prog[at->prog][at->instr];
	RT_CHECK(poll(st, e));
	RT_CHECK(copies_before(st, in, e));
	if (in->stream != DP_STREAM_COMPUTE && dp_is_collective(in->op))
		return wait_stream(st, in->stream, e); /* stream order: after those before it */
	if (in->stream != DP_STREAM_COMPUTE) /* a copy on the comm stream */
		return wait_conflicts(st, in, st->comm->issued, e);
	return st->nfl ? check_hazard(st, at->prog, at->instr, e) : 0;
}

int cpu_streams_event_record(CpuStreams *st, unsigned stream, unsigned ev, RtErr *e)
{
	RT_CHECK(poll(st, e));
	/* comm, p2p: every collective issued so far (of that stream); compute:
	 * done now; copy: the copies enqueued so far */
	int async = stream == DP_STREAM_COMM || stream == DP_STREAM_P2P;
	st->ev[ev] = (Event){.ticket = async ? st->comm->issued : -1,
			     .copies = stream == DP_STREAM_COPY ? st->ncq : 0,
			     .stream = (int)stream};
	return 0;
}

int cpu_streams_event_wait(CpuStreams *st, unsigned stream, unsigned ev, RtErr *e)
{
	Comm *c = st->comm;
	RT_CHECK(poll(st, e));
	/* compute or comm waiting for copies: they run now (the copy stream
	 * waiting for anything needs nothing: its copies run later, and each
	 * waits for the collectives on its memory) */
	const Event *v = &st->ev[ev];
	if (stream != DP_STREAM_COPY && v->copies > st->cq_done)
		RT_CHECK(run_copies(st, (int)v->copies, e));
	/* a wait on the comm stream orders its work after what has already run
	 * (compute): nothing more to do */
	if (stream == DP_STREAM_COMPUTE && v->ticket >= 0) {
		for (int f = 0; f < st->nfl; f++)
			if (st->fl[f].stream == v->stream && st->fl[f].ticket < v->ticket)
				RT_CHECK(wait_one(c, st->fl[f].ticket, e));
		retire(st, v->ticket, v->stream);
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
	RT_CHECK(copies_before(st, in, e));
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
	RT_CHECK(room((void **)&st->fl, &st->capfl, st->nfl, sizeof *st->fl,
		      "in-flight collectives", e));
	st->fl[st->nfl++] = fl;
	return 0;
}
