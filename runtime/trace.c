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
 *
 * Device times. On a backend that does not run its work inline
 * (BACKEND_INLINE: the CUDA backend) a host span is only the time to
 * enqueue, so the trace also asks the backend for device times (its
 * time_mark / time_read: CUDA events): a timing mark on the compute stream
 * when a run starts, one on each instruction's stream before and after it
 * (trace_mark, trace_after), one on the compute stream after the run's
 * final join; at the run's end the trace waits for them and reads each as
 * the device's time since the run's first mark. Every instruction then also
 * has a span on a device lane of its stream (tid 100 + stream: "compute
 * (device)", "comm (device)", "copy (device)"), placed from the host time
 * of the run's start, and the run a span on the compute device lane. The
 * wait for the marks serialises the runs (no run overlaps the next), and
 * marks cannot be captured, so dpexec runs the trace eagerly (--no-graph).
 * A backend with neither BACKEND_INLINE nor timing marks is refused.
 *
 * The summary (trace_close, rank 0's own events): the step program's
 * instruction time (the device's where there is one, else the host's) per
 * op class and per opcode, the top 15, against the runs' wall time; the
 * difference between the wall and the compute stream's instructions is
 * the gap: launches and dependencies.
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
	double d0, d1; /* device times: the span on the device, seconds from the origin
	                  (the run's host start + the device's time from its first mark);
	                  d1 < d0: none */
	uint32_t slot;   /* device times: the timing mark before the instruction (after: +1) */
	int64_t ticket;  /* EV_COLL */
	uint64_t step;
	int32_t instr;   /* index in the program; EV_RUN: -1 */
	int32_t micro;   /* step program: micro-batch; eval: batch */
	uint8_t kind, prog, lane, stream;
} TraceEv;

/* device lanes: tid DEV_TID + stream */
#define DEV_TID 100

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
	/* device times: the backend's timing marks of the run in progress */
	int dev;
	uint32_t nmark;  /* marks issued in this run: 0 its start, 1 its end, then 2 per instruction */
	uint32_t slot;   /* the open instruction's mark before it */
	size_t run_first; /* the run's first event in ev */
	float *ms;       /* time_read's answer */
	uint32_t capms;
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

int trace_open(Trace **out, const char *path, int rank, int device, RtErr *e)
{
	Trace *t = calloc(1, sizeof *t);
	if (!t || !(t->path = strdup(path))) {
		free(t);
		return RT_FAIL(e, "out of memory (--trace)");
	}
	t->rank = rank;
	t->dev = device;
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
	free(t->ms);
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
	*v = (TraceEv){.t0 = t->t, .t1 = at, .d1 = -1, .slot = t->slot, .step = x->step,
		       .instr = (int32_t)t->instr,
		       .micro = t->prog == DP_PROG_EVAL ? (int32_t)x->eval_batch : x->micro,
		       .kind = EV_INSTR, .prog = (uint8_t)t->prog, .stream = (uint8_t)in->stream};
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

/* Device times: the run's end mark, then every mark of the run read and
 * its events given their device spans. */
static int read_run(Trace *t, const Exec *x, TraceEv *run, RtErr *e)
{
	const Backend *b = &x->be;
	RT_CHECK(b->ops->time_mark((Backend *)b, DP_STREAM_COMPUTE, 1, e));
	if (t->nmark > t->capms) {
		float *p = realloc(t->ms, t->nmark * sizeof *p);
		if (!p)
			return RT_FAIL(e, "out of memory (--trace's device times)");
		t->ms = p;
		t->capms = t->nmark;
	}
	RT_CHECK(b->ops->time_read((Backend *)b, t->nmark, t->ms, e));
	for (size_t i = t->run_first; i < t->n; i++) {
		TraceEv *v = &t->ev[i];
		if (v->kind == EV_RUN || v->slot < 2 || v->slot + 1 >= t->nmark)
			continue;
		v->d0 = t->run_t0 + 1e-3 * t->ms[v->slot];
		v->d1 = t->run_t0 + 1e-3 * t->ms[v->slot + 1];
	}
	if (run) {
		run->d0 = t->run_t0;
		run->d1 = t->run_t0 + 1e-3 * t->ms[1];
	}
	return 0;
}

int trace_mark(Trace *t, const Exec *x, int prog, uint32_t instr, RtErr *e)
{
	Backend *b = (Backend *)&x->be;
	double at = now(t);
	if (t->open) {
		close_instr(t, x, at);
	} else {
		t->run_t0 = at;
		t->run_first = t->n;
		t->nmark = 2;
		if (t->dev && instr != TRACE_END)
			RT_CHECK(b->ops->time_mark(b, DP_STREAM_COMPUTE, 0, e));
	}
	if (instr == TRACE_END) {
		complete(t, x->comm->completed, at); /* the run's final wait */
		TraceEv *v = push(t);
		if (v)
			*v = (TraceEv){.t0 = t->run_t0, .t1 = at, .d1 = -1, .step = x->step, .instr = -1,
				       .micro = prog == DP_PROG_EVAL ? (int32_t)x->eval_batch : x->micro,
				       .kind = EV_RUN, .prog = (uint8_t)prog};
		int was_open = t->open;
		t->open = 0;
		return t->dev && was_open ? read_run(t, x, v, e) : 0;
	}
	t->open = 1;
	t->prog = prog;
	t->instr = instr;
	t->t = at;
	t->issued = x->comm->issued;
	if (t->dev) {
		t->slot = t->nmark;
		t->nmark += 2;
		RT_CHECK(b->ops->time_mark(b, x->s->prog[prog][instr].stream, t->slot, e));
	}
	return 0;
}

int trace_after(Trace *t, const Exec *x, int prog, uint32_t instr, RtErr *e)
{
	if (!t->dev)
		return 0;
	Backend *b = (Backend *)&x->be;
	return b->ops->time_mark(b, x->s->prog[prog][instr].stream, t->slot + 1, e);
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

/* One span of event v on lane tid over [t0, t1) (seconds); device: a
 * device lane's span (args.device). */
static void put_span(Buf *b, const Trace *t, const DpStep *s, const TraceEv *v, int tid, double t0,
		     double t1, int device)
{
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
	    t->rank, tid, t0 * 1e6, (t1 - t0) * 1e6, cat);
	if (v->kind == EV_RUN) {
		if (v->prog == DP_PROG_STEP)
			put(b, "step %llu micro %d", (unsigned long long)v->step + 1, v->micro);
		else if (v->prog == DP_PROG_EVAL)
			put(b, "eval batch %d", v->micro);
		else
			put(b, "%s program", dp_name(dp_prog_names, DP_NPROG, v->prog));
		put(b, "\",\"args\":{\"program\":\"%s\"%s}},\n",
		    dp_name(dp_prog_names, DP_NPROG, v->prog), device ? ",\"device\":1" : "");
		return;
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
	put(b, "\",\"args\":{\"program\":\"%s\",\"instr\":%d,\"stream\":\"%s\",\"step\":%llu,"
	    "\"micro\":%d%s", dp_name(dp_prog_names, DP_NPROG, v->prog), v->instr,
	    dp_name(dp_stream_names, DP_NSTREAM, in->stream), (unsigned long long)v->step + 1,
	    v->micro, device ? ",\"device\":1" : "");
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
	put(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"%s\"}},\n",
	    t->rank, t->dev ? "compute (host: enqueued)" : "compute");
	for (int l = 0; l < lanes; l++) {
		put(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
		    "\"args\":{\"name\":\"comm", t->rank, l + 1);
		put(b, l ? " %d\"}},\n" : "\"}},\n", l + 1);
	}
	if (t->dev)
		for (int k = 0; k < DP_NSTREAM; k++)
			put(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
			    "\"args\":{\"name\":\"%s (device)\"}},\n", t->rank, DEV_TID + k,
			    dp_stream_names[k]);
	for (size_t i = 0; i < t->n; i++) {
		const TraceEv *v = &t->ev[i];
		put_span(b, t, s, v, v->kind == EV_COLL ? v->lane : 0, v->t0, v->t1, 0);
		if (v->d1 >= v->d0)
			put_span(b, t, s, v, DEV_TID + (v->kind == EV_RUN ? DP_STREAM_COMPUTE : v->stream),
				 v->d0, v->d1, 1);
	}
}

/* ---- the summary ---- */

/* Op classes of the summary: where a step's time goes. */
enum { K_GEMM, K_ATTN, K_NORM, K_LOSS, K_ELEM, K_OPTIM, K_COLL, K_COPY, K_EVENT, K_HOST, K_N };
static const char *const class_names[K_N] = {"gemm",      "attention",  "norm", "loss",  "elementwise",
					     "optimizer", "collective", "copy", "event", "host"};

static int class_of(unsigned op)
{
	switch (dp_op_class(op)) {
	case DP_OPC_COLLECTIVE:
		return K_COLL;
	case DP_OPC_EVENT:
		return K_EVENT; /* a wait: the time its stream was blocked */
	case DP_OPC_LOAD:
	case DP_OPC_SHARD:
		return K_COPY;
	case DP_OPC_HOST:
		return K_HOST;
	default:
		break;
	}
	if (dp_op_is_gemm(op) || op == DP_OP_ORTHOGONALIZE)
		return K_GEMM;
	if (dp_op_is_attention(op))
		return K_ATTN;
	switch (op) {
	case DP_OP_LAYERNORM:
	case DP_OP_LAYERNORM_GRAD:
	case DP_OP_LAYERNORM_GRAD_G:
	case DP_OP_LAYERNORM_GRAD_GB:
	case DP_OP_RMSNORM:
	case DP_OP_RMSNORM_GRAD:
	case DP_OP_RMSNORM_GRAD_G:
	case DP_OP_ADD_LAYERNORM:
	case DP_OP_LAYERNORM_GRAD_ADD:
	case DP_OP_ADD_RMSNORM:
	case DP_OP_RMSNORM_GRAD_ADD:
		return K_NORM;
	case DP_OP_XENT:
	case DP_OP_XENT_GRAD:
	case DP_OP_XENT_FUSED:
	case DP_OP_CORRECT:
		return K_LOSS;
	case DP_OP_SQNORM:
	case DP_OP_SQRT:
	case DP_OP_CLIP:
	case DP_OP_SGD:
	case DP_OP_ADAMW:
	case DP_OP_UNSCALE:
	case DP_OP_AMP_CHECK:
		return K_OPTIM;
	case DP_OP_COPY:
	case DP_OP_CAST:
	case DP_OP_TRANSPOSE:
	case DP_OP_RESHAPE:
	case DP_OP_SPLIT:
	case DP_OP_SPLIT_GRAD:
	case DP_OP_INTERLEAVE:
	case DP_OP_KV_PACK:
	case DP_OP_KV_UNPACK:
	case DP_OP_TP_COPY:
	case DP_OP_D2H:
	case DP_OP_H2D:
	case DP_OP_PAD_ROWS:
		return K_COPY; /* layout, dtype and memory-space copies (and the padded head's weight) */
	default:
		return K_ELEM;
	}
}

typedef struct {
	double ms;
	long n;
	int op;
} OpSum;

static int by_ms(const void *a, const void *b)
{
	const OpSum *x = a, *y = b;
	return x->ms < y->ms ? 1 : x->ms > y->ms ? -1 : x->op - y->op;
}

/* Rank 0's step-program time, by class and op, against the runs' wall
 * time, on stdout (every line starts "trace:"). */
static void summary(const Trace *t, const Exec *x)
{
	const DpStep *s = x->s;
	OpSum op[DP_NOPS];
	double cls[K_N] = {0}, stream[DP_NSTREAM] = {0}, wall = 0, sum = 0;
	long runs = 0, steps = 0;
	uint64_t last_step = UINT64_MAX;
	for (int i = 0; i < DP_NOPS; i++)
		op[i] = (OpSum){0, 0, i};
	for (size_t i = 0; i < t->n; i++) {
		const TraceEv *v = &t->ev[i];
		if (v->prog != DP_PROG_STEP)
			continue;
		double a = t->dev ? v->d0 : v->t0, b = t->dev ? v->d1 : v->t1;
		double ms = b > a ? 1e3 * (b - a) : 0;
		if (v->kind == EV_RUN) {
			wall += ms;
			runs++;
			if (v->step != last_step)
				steps++, last_step = v->step;
			continue;
		}
		const DpInstr *in = &s->prog[v->prog][v->instr];
		op[in->op].ms += ms;
		op[in->op].n++;
		cls[class_of(in->op)] += ms;
		stream[in->stream] += ms;
		sum += ms;
	}
	printf("trace: rank 0, %ld step(s), %ld step-program run(s), %s times: wall %.3f ms "
	       "(runs, first mark to last)\n", steps, runs, t->dev ? "device" : "host", wall);
	printf("trace: instructions %.3f ms: compute %.3f, comm %.3f, copy %.3f, p2p %.3f; gap "
	       "%.3f ms (%.1f%% of the wall): the wall less the compute stream's instructions "
	       "(launches, dependencies)\n", sum, stream[DP_STREAM_COMPUTE], stream[DP_STREAM_COMM],
	       stream[DP_STREAM_COPY], stream[DP_STREAM_P2P], wall - stream[DP_STREAM_COMPUTE],
	       wall > 0 ? 100 * (wall - stream[DP_STREAM_COMPUTE]) / wall : 0.0);
	printf("trace: by class (ms, %% of the instructions):");
	for (int k = 0; k < K_N; k++)
		if (cls[k] > 0)
			printf(" %s %.3f (%.1f%%)", class_names[k], cls[k], sum > 0 ? 100 * cls[k] / sum : 0);
	printf("\n");
	qsort(op, DP_NOPS, sizeof op[0], by_ms);
	printf("trace: top ops (ms, %% of the instructions, count):\n");
	for (int i = 0; i < 15 && op[i].n; i++)
		printf("trace: %3d %-24s %-12s %10.3f %5.1f%% %7ld\n", i + 1,
		       dp_name(dp_op_names, DP_NOPS, (unsigned)op[i].op), class_names[class_of((unsigned)op[i].op)],
		       op[i].ms, sum > 0 ? 100 * op[i].ms / sum : 0, op[i].n);
	fflush(stdout);
}

int trace_close(Trace *t, const Exec *x, RtErr *e)
{
	Buf b = {0};
	int world = 1, rc = 0;
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (t->rank == 0)
		summary(t, x);
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
