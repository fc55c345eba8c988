/*
 * trace.c - dpexec --trace FILE: a Chrome / Perfetto trace (the JSON "Trace
 * Event Format"; open it in ui.perfetto.dev or chrome://tracing) of every
 * program run after start-up: the optimizer steps, evaluation, the export.
 *
 * One process per rank (pid = rank) and lanes (tid) per stream:
 *   tid 0 "compute": a span per program run ("step 3 micro 0"), and inside
 *                    it a span per instruction, named by its IR value and op
 *                    ("%t6 = linear"); an EVENT_WAIT on the compute stream is
 *                    a span of category "wait" ("wait ev=1"): the time the
 *                    compute stream was blocked on communication;
 *   tid 1.. "comm":  a span per collective ("%bucket.r0 = all_reduce", with
 *                    its bytes, axes and bucket), from the call that started
 *                    it to the first mark after the CPU backend saw it
 *                    complete (a wait that covered it, a progress poll that
 *                    found every collective done, or the end of the run:
 *                    Comm.completed): so a long comm span over compute spans
 *                    and a short wait span is communication that overlapped. Collectives in flight
 *                    together that would not nest go to further comm lanes.
 * Times are microseconds from a barrier every rank passes when the trace
 * starts (ranks of one host share the clock).
 *
 * How: the executor calls trace_mark at each instruction it runs and once
 * after a run's final wait (exec.c's walk); a span is the time between two
 * marks, so it covers an instruction and the MPI progress poll before it.
 * Marks are two clock reads and an append to an array; the JSON is written
 * once, by rank 0 (the ranks' events gathered with MPI), in trace_close,
 * through util/outfile.h like every output (dpexec checks the path before
 * the first step).
 * With no trace the executor's cost is one NULL test per instruction.
 * Host time only: on a backend that does not run its work inline
 * (BACKEND_INLINE) a span would be the time to enqueue, so dpexec refuses
 * --trace there.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "exec.h"

enum { EV_RUN, EV_INSTR, EV_WAIT, EV_COLL };

typedef struct {
	double t0, t1; /* seconds from the origin; t1 < 0: collective not seen complete */
	int64_t ticket;  /* EV_COLL */
	uint64_t step;
	int32_t instr;   /* index in the program; EV_RUN: -1 */
	int32_t micro;   /* step program: micro-batch; eval: batch */
	uint8_t kind, prog, lane;
} TraceEv;

struct Trace {
	char *path;
	int rank;
	double origin;
	TraceEv *ev;
	size_t n, cap;
	int oom;
	/* the run in progress: the last mark */
	int open;
	int prog;
	uint32_t instr;
	double t, run_t0;
	int64_t issued; /* the comm backend's next ticket at the mark */
	/* collectives not yet seen complete: indices into ev */
	size_t *fly;
	int nfly, capfly;
};

static const char *const axis_names[DP_MAX_AXES] = {"pp", "dp_replicate", "dp_shard", "cp",
							     "tp"};

static double now(const Trace *t)
{
	return MPI_Wtime() - t->origin;
}

static TraceEv *push(Trace *t)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 4096;
		TraceEv *p = realloc(t->ev, cap * sizeof *p);
		if (!p) {
			t->oom = 1;
			return NULL;
		}
		t->ev = p;
		t->cap = cap;
	}
	TraceEv *e = &t->ev[t->n++];
	memset(e, 0, sizeof *e);
	return e;
}

int trace_open(Trace **out, const char *path, int rank, RtErr *e)
{
	Trace *t = calloc(1, sizeof *t);
	if (!t || !(t->path = strdup(path))) {
		free(t);
		return RT_FAIL(e, "out of memory (--trace)");
	}
	t->rank = rank;
	MPI_Barrier(MPI_COMM_WORLD);
	t->origin = MPI_Wtime();
	*out = t;
	return 0;
}

void trace_free(Trace *t)
{
	if (!t)
		return;
	free(t->path);
	free(t->ev);
	free(t->fly);
	free(t);
}

/* Every collective in flight with a ticket < upto completed by time `at`. */
static void complete(Trace *t, int64_t upto, double at)
{
	int k = 0;
	for (int f = 0; f < t->nfly; f++) {
		TraceEv *c = &t->ev[t->fly[f]];
		if (c->ticket < upto)
			c->t1 = at;
		else
			t->fly[k++] = t->fly[f];
	}
	t->nfly = k;
}

/* The span of the instruction marked last: [t->t, at). */
static void close_instr(Trace *t, const Exec *x, double at)
{
	const DpInstr *in = &x->s->prog[t->prog][t->instr];
	DpOpClass cls = dp_op_class(in->op);
	int issued = x->comm->issued > t->issued;
	complete(t, x->comm->completed, at); /* what a wait or a progress poll saw finish */
	TraceEv *v = push(t);
	if (!v)
		return;
	*v = (TraceEv){.t0 = t->t, .t1 = at, .step = x->step, .instr = (int32_t)t->instr,
		       .micro = t->prog == DP_PROG_EVAL ? (int32_t)x->eval_batch : x->micro,
		       .kind = EV_INSTR, .prog = (uint8_t)t->prog};
	if (cls == DP_OPC_COLLECTIVE && issued) {
		v->kind = EV_COLL;
		v->ticket = t->issued;
		if (in->stream == DP_STREAM_COMPUTE)
			return; /* run synchronously: complete at `at` */
		v->t1 = -1;
		if (t->nfly == t->capfly) {
			int cap = t->capfly ? 2 * t->capfly : 64;
			size_t *p = realloc(t->fly, (size_t)cap * sizeof *p);
			if (!p) {
				t->oom = 1;
				return;
			}
			t->fly = p;
			t->capfly = cap;
		}
		t->fly[t->nfly++] = t->n - 1;
		return;
	}
	if (in->op == DP_OP_EVENT_WAIT && in->stream == DP_STREAM_COMPUTE)
		v->kind = EV_WAIT;
}

void trace_mark(Trace *t, const Exec *x, int prog, uint32_t instr)
{
	double at = now(t);
	if (t->open)
		close_instr(t, x, at);
	else
		t->run_t0 = at;
	if (instr == TRACE_END) {
		complete(t, x->comm->completed, at); /* the run's final wait */
		TraceEv *v = push(t);
		if (v)
			*v = (TraceEv){.t0 = t->run_t0, .t1 = at, .step = x->step, .instr = -1,
				       .micro = prog == DP_PROG_EVAL ? (int32_t)x->eval_batch : x->micro,
				       .kind = EV_RUN, .prog = (uint8_t)prog};
		t->open = 0;
		return;
	}
	t->open = 1;
	t->prog = prog;
	t->instr = instr;
	t->t = at;
	t->issued = x->comm->issued;
}

/* ---- writing ---- */

typedef struct {
	char *s;
	size_t n, cap;
	int oom;
} Buf;

static void put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Buf *b, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0 || b->oom)
			return;
		if (b->s && b->n + (size_t)k < b->cap) {
			b->n += (size_t)k;
			return;
		}
		size_t cap = b->cap ? 2 * b->cap : 1 << 16;
		while (cap < b->n + (size_t)k + 1)
			cap *= 2;
		char *p = realloc(b->s, cap);
		if (!p) {
			b->oom = 1;
			return;
		}
		b->s = p;
		b->cap = cap;
	}
}

/* A tensor name as a JSON string body (names are identifiers; escape anyway). */
static void put_name(Buf *b, const char *s)
{
	for (; *s; s++)
		if (*s == '"' || *s == '\\')
			put(b, "\\%c", *s);
		else if ((unsigned char)*s >= 0x20)
			put(b, "%c", *s);
}

static int by_start(const void *a, const void *b)
{
	const TraceEv *x = *(const TraceEv *const *)a, *y = *(const TraceEv *const *)b;
	return x->t0 < y->t0 ? -1 : x->t0 > y->t0 ? 1 : (x->t1 > y->t1) - (x->t1 < y->t1);
}

/* Comm lanes: each collective on the first lane where it nests in or
 * follows what is there (a stack of open spans per lane). */
#define MAX_LANES 16
#define MAX_DEPTH 64
static int place(double stack[MAX_LANES][MAX_DEPTH], int depth[MAX_LANES], int *lanes, TraceEv *c)
{
	for (int l = 0; l < MAX_LANES; l++) {
		if (l == *lanes)
			(*lanes)++;
		while (depth[l] && stack[l][depth[l] - 1] <= c->t0)
			depth[l]--;
		if (depth[l] && stack[l][depth[l] - 1] < c->t1)
			continue; /* would cross the open span's end */
		if (depth[l] < MAX_DEPTH)
			stack[l][depth[l]++] = c->t1;
		return l;
	}
	return MAX_LANES - 1;
}

static void format(const Trace *t, const Exec *x, Buf *b)
{
	const DpStep *s = x->s;
	int lanes = 0, depth[MAX_LANES] = {0};
	double stack[MAX_LANES][MAX_DEPTH];
	TraceEv **comm = malloc((t->n + 1) * sizeof *comm);
	size_t nc = 0;
	if (!comm) {
		b->oom = 1;
		return;
	}
	for (size_t i = 0; i < t->n; i++)
		if (t->ev[i].kind == EV_COLL)
			comm[nc++] = &t->ev[i];
	qsort(comm, nc, sizeof *comm, by_start);
	for (size_t i = 0; i < nc; i++) {
		if (comm[i]->t1 < comm[i]->t0)
			comm[i]->t1 = comm[i]->t0;
		comm[i]->lane = (uint8_t)(1 + place(stack, depth, &lanes, comm[i]));
	}
	free(comm);
	put(b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n",
	    t->rank, t->rank);
	put(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n",
	    t->rank);
	for (int l = 0; l < lanes; l++) {
		put(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
		    "\"args\":{\"name\":\"comm", t->rank, l + 1);
		put(b, l ? " %d\"}},\n" : "\"}},\n", l + 1);
	}
	for (size_t i = 0; i < t->n; i++) {
		const TraceEv *v = &t->ev[i];
		static const char *const cats[] = {[DP_OPC_KERNEL] = "kernel",
						   [DP_OPC_COLLECTIVE] = "collective",
						   [DP_OPC_EVENT] = "event",
						   [DP_OPC_LOAD] = "load",
						   [DP_OPC_HOST] = "host",
						   [DP_OPC_SHARD] = "shard"};
		const char *cat = v->kind == EV_RUN    ? "run"
				  : v->kind == EV_WAIT ? "wait"
				  : v->kind == EV_COLL ? "collective"
						       : cats[dp_op_class(s->prog[v->prog][v->instr].op)];
		put(b, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"%s\",\"name\":\"",
		    t->rank, v->kind == EV_COLL ? v->lane : 0, v->t0 * 1e6, (v->t1 - v->t0) * 1e6, cat);
		if (v->kind == EV_RUN) {
			if (v->prog == DP_PROG_STEP)
				put(b, "step %llu micro %d", (unsigned long long)v->step + 1, v->micro);
			else if (v->prog == DP_PROG_EVAL)
				put(b, "eval batch %d", v->micro);
			else
				put(b, "%s program", dp_name(dp_prog_names, DP_NPROG, v->prog));
			put(b, "\",\"args\":{\"program\":\"%s\"}},\n",
			    dp_name(dp_prog_names, DP_NPROG, v->prog));
			continue;
		}
		const DpInstr *in = &s->prog[v->prog][v->instr];
		const char *op = dp_name(dp_op_names, DP_NOPS, in->op);
		if (v->kind == EV_WAIT || in->op == DP_OP_EVENT_RECORD)
			put(b, "%s ev=%lld", v->kind == EV_WAIT ? "wait" : op, (long long)DP_EVENT(in));
		else if (in->out >= 0) {
			put(b, "%%");
			put_name(b, dpstep_str(s, s->tensors[in->out].name));
			put(b, " = %s", op);
		} else {
			put(b, "%s", op);
		}
		put(b, "\",\"args\":{\"instr\":%d,\"stream\":\"%s\",\"step\":%llu,\"micro\":%d", v->instr,
		    dp_name(dp_stream_names, DP_NSTREAM, in->stream), (unsigned long long)v->step + 1,
		    v->micro);
		if (v->kind == EV_COLL) {
			int io = in->op == DP_OP_REDUCE_SCATTER || in->op == DP_OP_SEND ? in->in[0] : in->out;
			if (in->op == DP_OP_SEND || in->op == DP_OP_RECV)
				put(b, ",\"stage\":%d,\"peer\":%lld", dp_instr_stage(in), (long long)DP_PEER(in));
			put(b, ",\"bytes\":%lld,\"axes\":\"",
			    (long long)exec_numel(&s->tensors[io]) * (long long)dp_dtype_size(s->tensors[io].dtype));
			for (int a = 0, first = 1; a < DP_MAX_AXES; a++)
				if (DP_AXES(in) & DP_AXIS_BIT(a)) {
					put(b, "%s%s", first ? "" : ",", axis_names[a]);
					first = 0;
				}
			put(b, "\"");
		}
		put(b, "}},\n");
	}
}

int trace_close(Trace *t, const Exec *x, RtErr *e)
{
	Buf b = {0};
	int world = 1, rc = 0;
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	format(t, x, &b);
	if (b.oom || t->oom) {
		free(b.s);
		b = (Buf){0};
		rc = -1;
	}
	/* rank 0 gathers every rank's events (int counts: < 2 GiB of JSON) */
	long long len = b.s ? (long long)b.n : 0, *lens = NULL;
	if (t->rank == 0 && !(lens = calloc((size_t)world, sizeof *lens)))
		rc = -1;
	MPI_Gather(&len, 1, MPI_LONG_LONG, lens, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
	int *counts = NULL, *displs = NULL;
	char *all = NULL;
	long long total = 0;
	if (t->rank == 0 && lens) {
		counts = calloc((size_t)world, sizeof *counts);
		displs = calloc((size_t)world, sizeof *displs);
		for (int r = 0; r < world; r++)
			total += lens[r];
		all = total < (1LL << 31) ? malloc((size_t)total + 1) : NULL;
		if (counts && displs && all)
			for (int r = 0, off = 0; r < world; off += (int)lens[r], r++)
				counts[r] = (int)lens[r], displs[r] = off;
		else
			rc = -1;
	}
	MPI_Gatherv(b.s, (int)len, MPI_CHAR, all, counts, displs, MPI_CHAR, 0, MPI_COMM_WORLD);
	if (t->rank == 0 && rc == 0) {
		/* util/outfile.h: atomic onto a regular file, in place into a device or
		 * FIFO, through links; never over a planted temp file */
		static const char head[] = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", tail[] = "\n]}\n";
		char err[1024];
		OutFile f;
		if (total >= 2) /* the last event's ",\n" */
			total -= 2;
		if (out_open(&f, t->path, err, sizeof err) == 0) {
			out_write(&f, head, sizeof head - 1);
			out_write(&f, all, (size_t)total);
			out_write(&f, tail, sizeof tail - 1);
			if (out_commit(&f, err, sizeof err) == 0)
				err[0] = '\0';
		}
		if (err[0])
			rc = RT_FAIL(e, "--trace: %s", err);
	} else if (rc) {
		rc = RT_FAIL(e, "out of memory writing the trace %s", t->path);
	}
	free(all);
	free(counts);
	free(displs);
	free(lens);
	free(b.s);
	return rc;
}
