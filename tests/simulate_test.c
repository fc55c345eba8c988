/*
 * simulate_test.c - the simulator's arithmetic (passes/simulate.c's
 * sim_run, sim_run_stages) on hand-built schedules whose times are known by
 * hand, on both executors (a pipeline's stages paired by their transfers
 * among them, and a sub-group of the stages by its copies), and the machine files' reader (util/machine.c): the presets
 * parse, a GEMM rate at a table point is that point's and between two
 * points lies between them, a GPU calibration's node_overhead_s and _n
 * are read and written back (0 where a file has none), an op's lines per
 * dtype (a file's line for every dtype, a dtype's line and its points, the
 * other dtype's borrowed) price a kernel as util/machine.h says and are
 * written back as read, a bad file is one message naming it; points keyed
 * by their kernel's kind (the H200's bias_grad, paired and column sums)
 * price an instruction among its own kind's, the same points without kinds
 * as before; the CUDA backend's pairing rule, its norms' warp rows and its
 * classifier's rows16 (format/kernel_kind.c) on a
 * hand-built program.
 *
 * Times are in seconds, bandwidths in bytes/s, all small integers, so every
 * expected figure is exact.
 *
 * Built by `make tests` (build/tests/simulate_test), run by tests/simulate.sh.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int failures, checks;

#define CHECK(cond, ...)                                             \
	do {                                                         \
		checks++;                                            \
		if (!(cond)) {                                       \
			failures++;                                  \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);  \
			printf(__VA_ARGS__);                         \
			printf("\n");                                \
		}                                                    \
	} while (0)

#define NEAR(a, b) (fabs((a) - (b)) < 1e-9)

static const double bw[MACH_NLINK] = {1, 1, 1}; /* a byte a second on every link */

static SimOp K(int stream, double dur)
{
	return (SimOp){.kind = SIM_KERNEL, .stream = stream, .dur = dur};
}

static SimOp C(double bytes, double alpha, int link)
{
	return (SimOp){.kind = SIM_COLL, .stream = DP_STREAM_COMM, .bytes = bytes, .alpha = alpha,
		       .link = link};
}

static SimOp REC(int stream, int ev)
{
	return (SimOp){.kind = SIM_RECORD, .stream = stream, .event = ev};
}

static SimOp WAIT(int stream, int ev)
{
	return (SimOp){.kind = SIM_WAIT, .stream = stream, .event = ev};
}

enum { CO = DP_STREAM_COMPUTE, CM = DP_STREAM_COMM };

static SimResult run(const SimOp *ops, int n, int accum, int executor)
{
	SimResult r = {.want_spans = 1};
	sim_run(ops, n, accum, executor, bw, 8, &r);
	return r;
}

/* The span of op i (micro-batch mb) on a comm lane or the compute lane. */
static const SimSpan *span_of(const SimResult *r, int i, int mb, int wait)
{
	for (int k = 0; k < r->nspans; k++)
		if (r->spans[k].op == i && r->spans[k].micro == mb && (r->spans[k].lane < 0) == wait)
			return &r->spans[k];
	return NULL;
}

static const char *const ex_names[] = {"gpu", "cpu"};

/* A 2 s collective that depends on nothing, then a 3 s kernel: they
 * overlap, the step is the longer (3 s), nothing is exposed. (The other way
 * round the CPU's walk starts the collective after the kernel: 5 s.) */
static void two_streams(int ex)
{
	SimOp ops[] = {C(2, 0, MACH_INTRA), K(CO, 3)};
	SimResult r = run(ops, 2, 1, ex);
	CHECK(NEAR(r.step_s, 3) && NEAR(r.exposed_s, 0) && NEAR(r.comm_s, 2) &&
	      NEAR(r.busy[CO], 3), "%s: two streams: step %g exposed %g comm %g, want 3 0 2",
	      ex_names[ex], r.step_s, r.exposed_s, r.comm_s);
	free(r.spans);
	SimOp late[] = {K(CO, 3), C(2, 0, MACH_INTRA)};
	r = run(late, 2, 1, ex);
	CHECK(NEAR(r.step_s, ex == MACH_CPU ? 5 : 3), "%s: kernel first: step %g", ex_names[ex],
	      r.step_s);
	free(r.spans);
}

/*
 * A collective behind a compute kernel, and a wait on its event:
 *   K1 1 s; record e0; (comm) wait e0; C 4 s (alpha 1 + 3 bytes); record e1;
 *   K2 2 s; wait e1; K3 1 s.
 * C starts when K1 ends (1) and ends at 5; K2 runs 1..3, the wait holds the
 * compute stream 3..5 (2 s exposed), K3 5..6.
 */
static void wait_on_event(int ex)
{
	SimOp ops[] = {K(CO, 1), REC(CO, 0), WAIT(CM, 0), C(3, 1, MACH_INTER), REC(CM, 1),
		       K(CO, 2), WAIT(CO, 1), K(CO, 1)};
	SimResult r = run(ops, 8, 1, ex);
	const SimSpan *c = span_of(&r, 3, 0, 0), *w = span_of(&r, 6, 0, 1), *k3 = span_of(&r, 7, 0, 0);
	CHECK(NEAR(r.step_s, 6) && NEAR(r.exposed_s, 2) && NEAR(r.busy[CO], 4) && NEAR(r.comm_s, 4),
	      "%s: wait: step %g exposed %g compute %g comm %g, want 6 2 4 4", ex_names[ex], r.step_s,
	      r.exposed_s, r.busy[CO], r.comm_s);
	CHECK(c && NEAR(c->t0, 1) && NEAR(c->t1, 5), "%s: the collective runs 1..5, not %g..%g",
	      ex_names[ex], c ? c->t0 : -1, c ? c->t1 : -1);
	CHECK(w && NEAR(w->t0, 3) && NEAR(w->t1, 5) && k3 && NEAR(k3->t0, 5),
	      "%s: the wait spans 3..5 and K3 starts at 5", ex_names[ex]);
	free(r.spans);
}

/*
 * Two collectives issued together on one link. The GPU's comm stream runs
 * them one after the other (2 bytes each at 1 B/s: ends 2 and 4); the CPU
 * starts both and they share the link (each at 1/2 B/s: both end at 4).
 * On two links the CPU's move at full speed (both end at 2).
 */
static void contention(void)
{
	SimOp same[] = {C(2, 0, MACH_INTRA), C(2, 0, MACH_INTRA)};
	SimResult g = run(same, 2, 1, MACH_GPU), c = run(same, 2, 1, MACH_CPU);
	const SimSpan *g0 = span_of(&g, 0, 0, 0), *g1 = span_of(&g, 1, 0, 0);
	const SimSpan *c0 = span_of(&c, 0, 0, 0), *c1 = span_of(&c, 1, 0, 0);
	CHECK(g0 && g1 && NEAR(g0->t1, 2) && NEAR(g1->t0, 2) && NEAR(g1->t1, 4),
	      "gpu: one collective after the other on the comm stream");
	CHECK(c0 && c1 && NEAR(c0->t1, 4) && NEAR(c1->t1, 4) && NEAR(c.step_s, 4),
	      "cpu: two collectives on one link share it: end %g and %g, want 4 and 4",
	      c0 ? c0->t1 : -1, c1 ? c1->t1 : -1);
	SimOp apart[] = {C(2, 0, MACH_INTRA), C(2, 0, MACH_INTER)};
	SimResult a = run(apart, 2, 1, MACH_CPU);
	CHECK(NEAR(a.step_s, 2), "cpu: two links: step %g, want 2", a.step_s);
	/* staggered: 4 bytes from 0, 1 byte from 1: alone 0..1 (3 left), shared
	 * at 1/2 B/s each 1..3 (the second done at 3, 2 left), alone 3..5 */
	SimOp stag[] = {C(4, 0, MACH_INTRA), K(CO, 1), C(1, 0, MACH_INTRA)};
	SimResult s = run(stag, 3, 1, MACH_CPU);
	const SimSpan *s0 = span_of(&s, 0, 0, 0), *s2 = span_of(&s, 2, 0, 0);
	CHECK(s0 && s2 && NEAR(s2->t1, 3) && NEAR(s0->t1, 5),
	      "cpu: staggered sharing ends at %g and %g, want 3 and 5", s2 ? s2->t1 : -1,
	      s0 ? s0->t1 : -1);
	free(g.spans);
	free(c.spans);
	free(a.spans);
	free(s.spans);
}

/* A kernel on the CPU's comm stream runs after every collective before it,
 * on the host: C 3 bytes, then a 1 s comm kernel: the host waits until 3. */
static void cpu_comm_kernel(void)
{
	SimOp ops[] = {C(3, 0, MACH_INTRA), K(CM, 1), K(CO, 1)};
	SimResult r = run(ops, 3, 1, MACH_CPU);
	CHECK(NEAR(r.step_s, 5), "cpu: a comm-stream kernel after a collective: step %g, want 5",
	      r.step_s);
	free(r.spans);
}

/* grad_accum 3: a DP_IF_LAST kernel runs once, the others three times; the
 * IF_LAST collective of the last micro-batch overlaps nothing after it. */
static void accumulation(int ex)
{
	SimOp ops[] = {K(CO, 1), REC(CO, 0), WAIT(CM, 0), C(2, 0, MACH_INTRA), REC(CM, 1),
		       WAIT(CO, 1), K(CO, 5)};
	for (int i = 1; i < 7; i++)
		ops[i].flags = DP_IF_LAST;
	SimResult r = run(ops, 7, 3, ex);
	/* 1 + 1 + 1, then the collective 3..5, then 5 s: 10 */
	CHECK(NEAR(r.step_s, 10) && NEAR(r.exposed_s, 2) && NEAR(r.busy[CO], 8),
	      "%s: grad_accum 3: step %g exposed %g compute %g, want 10 2 8", ex_names[ex], r.step_s,
	      r.exposed_s, r.busy[CO]);
	free(r.spans);
}

/* One stage's op: op on stage st (and not a partner of anything yet). */
static SimOp ST(int st, SimOp op)
{
	op.stage = st;
	op.peer = -1;
	return op;
}

/* A pipeline send on stage `from` (ops[i]) and its recv on stage `to`
 * (ops[i + 1]), 1 byte on the p2p link. */
static void transfer(SimOp *ops, int i, int from, int to)
{
	ops[i] = ST(from, C(1, 0, MACH_P2P));
	ops[i + 1] = ST(to, C(1, 0, MACH_P2P));
	ops[i + 1].recv = 1;
	ops[i].peer = i + 1;
	ops[i + 1].peer = i;
}

/*
 * A pipeline of two stages, GPipe over two micro-batches, in the order
 * passes/unroll.c merges the stages' programs: F 1 s, B 2 s, each transfer
 * 1 byte at 1 B/s moving once both ends are posted, then a 2-byte
 * collective spanning pp. By hand, on both executors:
 *   stage 0: F0 0..1, F1 1..2; a0 moves 1..2, a1 2..3 (stage 1's recvs
 *            are posted at 0 and 2);
 *   stage 1: waits for a0 until 2, F0' 2..3, B0' 3..5, sends g0 at 5
 *            (moves 5..6), F1' 5..6, B1' 6..8, sends g1 at 8 (8..9);
 *   stage 0: waits 2..6 for g0, B0 6..8, waits 8..9 for g1, B1 9..11;
 *   the pp collective moves once stage 0 posts it (11): 11..13.
 * Step 13; each stage computes 6 s, so 7 s of each is exposed: stage 0
 * 4 + 1 + 2, stage 1 2 + 5. Posted recvs that moved at once (no pairing)
 * would give stage 0 its gradients at 1 and 2: a step of 9.
 */
static void pp_stages(int ex)
{
	SimOp ops[40];
	int n = 0;
	ops[n++] = ST(0, K(CO, 1)); /* F0 */
	ops[n++] = ST(0, REC(CO, 0));
	ops[n++] = ST(0, WAIT(CM, 0));
	transfer(ops, n, 0, 1), n += 2; /* a0 */
	ops[n++] = ST(1, REC(CM, 1));
	ops[n++] = ST(0, K(CO, 1)); /* F1 */
	ops[n++] = ST(0, REC(CO, 2));
	ops[n++] = ST(0, WAIT(CM, 2));
	transfer(ops, n, 0, 1), n += 2; /* a1 */
	ops[n++] = ST(1, REC(CM, 3));
	ops[n++] = ST(1, WAIT(CO, 1));
	ops[n++] = ST(1, K(CO, 1)); /* F0' */
	ops[n++] = ST(1, K(CO, 2)); /* B0' */
	ops[n++] = ST(1, REC(CO, 4));
	ops[n++] = ST(1, WAIT(CM, 4));
	int g0 = n + 1;
	transfer(ops, n, 1, 0), n += 2;
	ops[n++] = ST(0, REC(CM, 5));
	ops[n++] = ST(1, WAIT(CO, 3));
	ops[n++] = ST(1, K(CO, 1)); /* F1' */
	ops[n++] = ST(1, K(CO, 2)); /* B1' */
	ops[n++] = ST(1, REC(CO, 6));
	ops[n++] = ST(1, WAIT(CM, 6));
	transfer(ops, n, 1, 0), n += 2; /* g1 */
	ops[n++] = ST(0, REC(CM, 7));
	ops[n++] = ST(0, WAIT(CO, 5));
	ops[n++] = ST(0, K(CO, 2)); /* B0 */
	ops[n++] = ST(0, WAIT(CO, 7));
	ops[n++] = ST(0, K(CO, 2)); /* B1 */
	ops[n++] = ST(-1, REC(CO, 8));
	ops[n++] = ST(-1, WAIT(CM, 8));
	int ar = n;
	ops[n++] = ST(-1, C(2, 0, MACH_INTER)); /* over pp */
	ops[ar].sync = 1;
	ops[n++] = ST(-1, REC(CM, 9));
	ops[n++] = ST(-1, WAIT(CO, 9));
	SimResult r[2];
	memset(r, 0, sizeof r);
	r[0].want_spans = r[1].want_spans = 1;
	int sweeps = sim_run_stages(ops, n, 2, ex, bw, 10, r);
	CHECK(sweeps > 0, "%s: pipeline: the pairing settles (%d sweeps)", ex_names[ex], sweeps);
	for (int s = 0; s < 2; s++)
		CHECK(NEAR(r[s].step_s, 13) && NEAR(r[s].busy[CO], 6) && NEAR(r[s].exposed_s, 7),
		      "%s: pipeline stage %d: step %g compute %g exposed %g, want 13 6 7", ex_names[ex],
		      s, r[s].step_s, r[s].busy[CO], r[s].exposed_s);
	const SimSpan *t = span_of(&r[0], g0, 0, 0), *a = span_of(&r[1], ar, 0, 0);
	CHECK(t && NEAR(t->t0, 5) && NEAR(t->t1, 6), "%s: g0 reaches stage 0 over 5..6, not %g..%g",
	      ex_names[ex], t ? t->t0 : -1, t ? t->t1 : -1);
	CHECK(a && NEAR(a->t0, 11) && NEAR(a->t1, 13),
	      "%s: the pp collective moves 11..13 on stage 1 too, not %g..%g", ex_names[ex],
	      a ? a->t0 : -1, a ? a->t1 : -1);
	free(r[0].spans);
	free(r[1].spans);
	/* the transfers unpaired (each moving once posted): the step the
	 * pairing prevents */
	for (int i = 0; i < n; i++)
		ops[i].peer = -1, ops[i].sync = 0;
	SimResult u[2];
	memset(u, 0, sizeof u);
	sim_run_stages(ops, n, 2, ex, bw, 10, u);
	CHECK(!NEAR(u[0].step_s, 13), "%s: unpaired transfers change the step (%g)", ex_names[ex],
	      u[0].step_s);
}

/*
 * A send that waits for its receiver, and a tp collective after it (issue
 * 30's third cause). Stage 1 posts its recv after a 5 s kernel; stage 0
 * sends at 0, then computes 1 s and all_reduces 2 bytes (1..3 at 1 B/s)
 * whose result its compute stream waits for. On the p2p stream the send
 * holds nothing else: the collective runs 1..3, 2 s exposed, on both
 * executors. On the comm stream (the format before 22) the GPU's serial
 * stream runs the collective after the send moves (5..6): 6..8, 7 s
 * exposed; the CPU's comm event covered the send too: 1..6, 5 s exposed.
 * Each stage's step ends with its transfer at 6 (stage 0's gpu: 8).
 */
static void held_send(int ex)
{
	for (int p2p = 1; p2p >= 0; p2p--) {
		int ps = p2p ? DP_STREAM_P2P : CM;
		SimOp ops[16];
		int n = 0;
		ops[n++] = ST(1, K(CO, 5));
		ops[n++] = ST(1, REC(CO, 0));
		ops[n++] = ST(1, WAIT(ps, 0));
		transfer(ops, n, 0, 1);
		ops[n].stream = ops[n + 1].stream = ps;
		n += 2;
		ops[n++] = ST(1, REC(ps, 1));
		ops[n++] = ST(1, WAIT(CO, 1));
		ops[n++] = ST(0, K(CO, 1));
		ops[n++] = ST(0, REC(CO, 2));
		ops[n++] = ST(0, WAIT(CM, 2));
		int ar = n;
		ops[n++] = ST(0, C(2, 0, MACH_INTRA));
		ops[n++] = ST(0, REC(CM, 3));
		ops[n++] = ST(0, WAIT(CO, 3));
		SimResult r[2];
		memset(r, 0, sizeof r);
		r[0].want_spans = r[1].want_spans = 1;
		sim_run_stages(ops, n, 2, ex, bw, 4, r);
		double want = p2p ? 2 : ex == MACH_CPU ? 5 : 7;
		const SimSpan *a = span_of(&r[0], ar, 0, 0);
		double a0 = p2p || ex == MACH_CPU ? 1 : 6;
		CHECK(NEAR(r[0].exposed_s, want) && a && NEAR(a->t0, a0) && NEAR(a->t1, a0 + 2) &&
		      NEAR(r[1].step_s, 6) && NEAR(r[0].step_s, !p2p && ex == MACH_GPU ? 8 : 6),
		      "%s: a held send on the %s stream: stage 0 exposed %g (want %g), its all_reduce "
		      "%g..%g (want %g..%g), steps %g and %g", ex_names[ex], p2p ? "p2p" : "comm",
		      r[0].exposed_s, want, a ? a->t0 : -1, a ? a->t1 : -1, a0, a0 + 2, r[0].step_s,
		      r[1].step_s);
		free(r[0].spans);
		free(r[1].spans);
	}
}

/*
 * A collective over a sub-group of the stages (a tied parameter's
 * gradients on stages 0 and 2 of three, each running its own copy over
 * their communicator), 2 bytes at 1 B/s, each copy after its stage's
 * kernel (stage 0: 1 s, stage 2: 3 s; stage 1, outside the group: 1 s).
 * By hand, on both executors: the copies move together once the later is
 * posted, 3..5, so stages 0 and 2 end at 5 (stage 0 waiting 1..5, stage 2
 * 3..5) and stage 1, which does not take part, at 1. Unpaired, stage 0's
 * copy would move 1..3 alone: a step of 3 there.
 */
static void sub_group(int ex)
{
	SimOp ops[16];
	int n = 0, copy[3] = {-1, -1, -1};
	ops[n++] = ST(0, K(CO, 1));
	ops[n++] = ST(1, K(CO, 1));
	ops[n++] = ST(2, K(CO, 3));
	for (int st = 0; st <= 2; st += 2) {
		ops[n++] = ST(st, REC(CO, st));
		ops[n++] = ST(st, WAIT(CM, st));
		copy[st] = n;
		ops[n] = ST(st, C(2, 0, MACH_INTER));
		ops[n++].sync = 1;
		ops[n++] = ST(st, REC(CM, st + 1));
		ops[n++] = ST(st, WAIT(CO, st + 1));
	}
	ops[copy[0]].ring = copy[2];
	ops[copy[2]].ring = copy[0];
	SimResult r[3];
	memset(r, 0, sizeof r);
	for (int st = 0; st < 3; st++)
		r[st].want_spans = 1;
	CHECK(sim_run_stages(ops, n, 3, ex, bw, 10, r) > 0, "%s: sub-group: the pairing settles",
	      ex_names[ex]);
	static const double step[3] = {5, 1, 5}, exposed[3] = {4, 0, 2};
	for (int st = 0; st < 3; st++)
		CHECK(NEAR(r[st].step_s, step[st]) && NEAR(r[st].exposed_s, exposed[st]),
		      "%s: sub-group: stage %d step %g exposed %g, want %g %g", ex_names[ex], st,
		      r[st].step_s, r[st].exposed_s, step[st], exposed[st]);
	for (int st = 0; st <= 2; st += 2) {
		const SimSpan *a = span_of(&r[st], copy[st], 0, 0);
		CHECK(a && NEAR(a->t0, 3) && NEAR(a->t1, 5), "%s: sub-group: stage %d's copy moves 3..5, "
		      "not %g..%g", ex_names[ex], st, a ? a->t0 : -1, a ? a->t1 : -1);
	}
	CHECK(!span_of(&r[1], copy[0], 0, 0) && !span_of(&r[1], copy[2], 0, 0),
	      "%s: sub-group: stage 1 runs no copy", ex_names[ex]);
	for (int st = 0; st < 3; st++)
		free(r[st].spans);
}

#define LINKS                                                                                       \
	"\"ranks_per_node\": 1, \"intra\": {\"alpha_s\": 0, \"busbw\": 1}, \"inter\": {\"alpha_s\": 0, " \
	"\"busbw\": 1}, \"p2p\": {\"alpha_s\": 0, \"busbw\": 1}"

/* An op's lines per dtype (util/machine.h): "old" has the one line for
 * every dtype of a file written before them; "norm" that and an f32 line
 * with points (given out of order, x = 8 twice: the later one counts);
 * "soft" a bf16 line only; "attn" a bf16 line fitted by FLOPs. Each kernel
 * below: machine defaults rate 1, bw 1, overhead 1. */
static void op_lines(void)
{
	Machine m, back;
	char err[512];
	CHECK(machine_parse(&m, "{\"executor\": \"cpu\", \"peak_flops\": {\"f32\": 1, \"bf16\": 2},"
				"\"memory_bw\": 1, \"kernel_overhead_s\": 1, " LINKS ", \"ops\": {"
				"\"old\": {\"bytes_per_s\": 2, \"overhead_s\": 3},"
				"\"norm\": {\"bytes_per_s\": 2, \"f32\": {\"bytes_per_s\": 4, \"overhead_s\": 1,"
				"  \"points\": [[8, 5], [4, 2], [16, 7], [8, 6]]}},"
				"\"soft\": {\"bf16\": {\"bytes_per_s\": 10, \"overhead_s\": 2}},"
				"\"attn\": {\"bf16\": {\"flops_per_s\": 1, \"fit\": \"flops\","
				"  \"points\": [[2, 3], [4, 5]]}}}}", "m.json", err, sizeof err) == 0,
	      "per-dtype op lines read: %s", err);
	for (int pass = 0; pass < 2; pass++) { /* as read, then written and read back */
		const Machine *x = pass ? &back : &m;
		const char *when = pass ? "written back" : "read";
		int b;
#define T(op, d, f, by) machine_op_seconds(x, op, d, 0, f, by, 1, 1, 1, NULL)
		CHECK(NEAR(T("old", MACH_F32, 0, 10), 8) && NEAR(T("old", MACH_BF16, 0, 10), 8) &&
		      machine_op_line(x, "old", MACH_BF16, &b) && !b,
		      "%s: a file's line for every dtype prices both: %g", when, T("old", MACH_F32, 0, 10));
		CHECK(NEAR(T("norm", MACH_F32, 0, 8), 6) && NEAR(T("norm", MACH_F32, 0, 4), 2) &&
		      NEAR(T("norm", MACH_F32, 0, 12), 6.5),
		      "%s: the f32 line's points: %g %g %g", when, T("norm", MACH_F32, 0, 8),
		      T("norm", MACH_F32, 0, 4), T("norm", MACH_F32, 0, 12));
		/* beyond the points: the line 1 + x / 4 through the nearest point
		 * (16, 7): 7 * 9 / 5 at 32; below (4, 2): 2 * 1.5 / 2 at 2 */
		CHECK(NEAR(T("norm", MACH_F32, 0, 32), 12.6) && NEAR(T("norm", MACH_F32, 0, 2), 1.5),
		      "%s: outside the points: %g %g", when, T("norm", MACH_F32, 0, 32), T("norm", MACH_F32, 0, 2));
		CHECK(NEAR(T("norm", MACH_F32, 100, 8), 101), "%s: the FLOPs term still bounds the points", when);
		CHECK(NEAR(T("norm", MACH_BF16, 0, 10), 6) && machine_op_line(x, "norm", MACH_BF16, &b) && !b,
		      "%s: no bf16 line: the line for every dtype, the default overhead: %g", when,
		      T("norm", MACH_BF16, 0, 10));
		CHECK(NEAR(T("soft", MACH_BF16, 0, 10), 3) && NEAR(T("soft", MACH_F32, 0, 10), 3) &&
		      machine_op_line(x, "soft", MACH_F32, &b) && b,
		      "%s: an op with the other dtype's line only borrows it, said: %g", when,
		      T("soft", MACH_F32, 0, 10));
		CHECK(NEAR(T("attn", MACH_BF16, 3, 1), 4) && NEAR(T("attn", MACH_BF16, 3, 100), 101),
		      "%s: a line fitted by FLOPs: its points at the FLOPs, the bytes bound beside: %g", when,
		      T("attn", MACH_BF16, 3, 1));
		CHECK(NEAR(machine_op_seconds(x, "norm", MACH_F32, 1, 0, 8, 1, 1, 1, NULL), 3),
		      "%s: a GEMM's op line takes no points", when);
#undef T
		if (pass)
			break;
		char *text = machine_json(&m);
		CHECK(text && machine_parse(&back, text, "back", err, sizeof err) == 0, "written back: %s", err);
		const MachOp *o = machine_op(&back, "norm");
		CHECK(o && o->line[MACH_F32].npts == 3 && !o->line[MACH_BF16].given && o->line[MACH_ANY].given &&
		      machine_op(&back, "attn")->line[MACH_BF16].by_flops &&
		      !machine_op(&back, "old")->line[MACH_F32].given,
		      "the lines written back as read");
		free(text);
	}
	machine_free(&back);
	machine_free(&m);
	CHECK(machine_parse(&m, "{\"executor\": \"cpu\", \"peak_flops\": {\"f32\": 1, \"bf16\": 2},"
				"\"memory_bw\": 1, " LINKS ", \"ops\": {\"relu\": {\"points\": [[1, 1]]}}}",
				"m.json", err, sizeof err) < 0 && strstr(err, "m.json") && strstr(err, "\"relu\""),
	      "points outside a dtype's line refused: '%s'", err);
	CHECK(machine_parse(&m, "{\"executor\": \"cpu\", \"peak_flops\": {\"f32\": 1, \"bf16\": 2},"
				"\"memory_bw\": 1, " LINKS ", \"ops\": {\"relu\": {\"bf16\": {\"points\": [[1, -1]]}}}}",
				"m.json", err, sizeof err) < 0 && strstr(err, "\"relu\" \"bf16\"") &&
	      strstr(err, "points"), "bad points named by op and dtype: '%s'", err);
}

/* The GEMM table between two micro-batches' points (GPT-2 124M's
 * micro-batch 4 between 2 and 8 on the H200): the shape between its own
 * two points, which differ from it in m only, takes their log-midpoint
 * (4 and 16 at m 2048 and 8192: 8 at 4096), where the inverse squared
 * distance in log m, n, k let a far slow shape (768 x 768 x 2048 at 1)
 * pull it to 6.8 */
static void gemm_table(void)
{
	Machine m;
	char err[512];
	CHECK(machine_parse(&m, "{\"executor\": \"gpu\", \"peak_flops\": {\"f32\": 1, \"bf16\": 2},"
				"\"memory_bw\": 1, " LINKS ", \"gemm\": ["
				"{\"dtype\": \"bf16\", \"m\": 2048, \"n\": 768, \"k\": 3072, \"flops_per_s\": 4},"
				"{\"dtype\": \"bf16\", \"m\": 8192, \"n\": 768, \"k\": 3072, \"flops_per_s\": 16},"
				"{\"dtype\": \"bf16\", \"m\": 768, \"n\": 768, \"k\": 2048, \"flops_per_s\": 1},"
				"{\"dtype\": \"f32\", \"m\": 4096, \"n\": 768, \"k\": 3072, \"flops_per_s\": 3}]}",
				"m.json", err, sizeof err) == 0, "a GEMM table read: %s", err);
	double mid = machine_gemm_rate(&m, MACH_BF16, 4096, 768, 3072);
	CHECK(NEAR(mid, 8), "between its own two points in m: their log-midpoint, 8: %g", mid);
	double q = machine_gemm_rate(&m, MACH_BF16, 2896.3, 768, 3072), w = log(2896.3 / 2048) / log(4);
	CHECK(NEAR(q, exp(log(4) + w * log(4))), "log rate linear in log m: %g", q);
	CHECK(NEAR(machine_gemm_rate(&m, MACH_BF16, 4096, 768, 3093.5), 8) &&
	      NEAR(machine_gemm_rate(&m, MACH_BF16, 8192, 768, 3093.5), 16),
	      "the other axes the same to 1 %% (a fused GELU GEMM's k from its FLOPs): %g %g",
	      machine_gemm_rate(&m, MACH_BF16, 4096, 768, 3093.5),
	      machine_gemm_rate(&m, MACH_BF16, 8192, 768, 3093.5));
	double off = machine_gemm_rate(&m, MACH_BF16, 4096, 1024, 3072);
	CHECK(off > 1 && off < 8, "off the points on two axes: the inverse-distance blend: %g", off);
	CHECK(NEAR(machine_gemm_rate(&m, MACH_F32, 4096, 768, 3072), 3), "each dtype its own points");
	machine_free(&m);
}

/* Kernel kinds (format/kernel_kind.c, util/machine.h): the H200's bias_grad
 * points of GPT-2 124M bf16 at micro-batches 2 and 8 (x bytes, times in us;
 * docs/SIMULATE.md, "The held-out micro-batch 4"), the paired ones (BGRADA,
 * ~1.3-1.6 us at any size) and the position embedding's column sums (37.5
 * and 48.5 us) interleaved by bytes. Micro-batch 4's paired bias_grads
 * (6,297,600, 18,892,800 and 25,190,400 bytes) keyed by their kind take
 * their own kind's points; the same points without kinds (a file written
 * before them, and the old rule) are read as they were: between a paired
 * and a column-sum point (19.4, 48.4 and 32.8 us, the H200's misprice):
 * the last check, which the first two of the loop's fail. */
#define BIAS_POINTS(P, C)                                                                    \
	"[[3151872, 1.29" P "], [9437184, 37.5" C "], [9455616, 1.29" P "], [12589056, 1.34" P \
	"], [12607488, 1.40" P "], [18874368, 48.5" C "], [37767168, 1.46" P "], [50356224, 1.57" P "]]"
static void op_kinds(void)
{
	Machine m, old, back;
	char err[512];
	const char *head = "{\"executor\": \"gpu\", \"peak_flops\": {\"f32\": 1, \"bf16\": 2}, \"memory_bw\": 1e12, "
			   LINKS ", \"ops\": {\"bias_grad\": {\"bf16\": {\"bytes_per_s\": 1e12, \"points\": ";
	char text[2048];
	snprintf(text, sizeof text, "%s%s}}}}", head, BIAS_POINTS(", \"paired\"", ", \"colsum\""));
	CHECK(machine_parse(&m, text, "m.json", err, sizeof err) == 0 && machine_has_kinds(&m),
	      "points with kinds read: %s", err);
	snprintf(text, sizeof text, "%s%s}}}}", head, BIAS_POINTS("", ""));
	CHECK(machine_parse(&old, text, "old.json", err, sizeof err) == 0 && !machine_has_kinds(&old),
	      "the same points without kinds read: %s", err);
	char *json = machine_json(&m);
	CHECK(json && machine_parse(&back, json, "back", err, sizeof err) == 0 && strstr(json, "\"paired\"") &&
	      machine_op(&back, "bias_grad")->line[MACH_BF16].npts == 8, "kinds written back: %s", err);
	free(json);
#define B(x, mc, k) machine_op_seconds(mc, "bias_grad", MACH_BF16, 0, 0, x, 1e18, 1e12, 0, k)
#define REL(a, b) (fabs((a) - (b)) < 1e-6 * fabs(b))
	for (int pass = 0; pass < 2; pass++) {
		const Machine *x = pass ? &back : &m;
		const char *when = pass ? "written back" : "read";
		double p768 = B(6297600, x, "paired"), p2304 = B(18892800, x, "paired");
		double p3072 = B(25190400, x, "paired");
		CHECK(REL(p768, 1.29), "%s: b4's paired 768 between its kind's 1.29 and 1.29: %g", when, p768);
		CHECK(REL(p2304, 1.40 + 0.06 * (18892800.0 - 12607488) / (37767168 - 12607488)),
		      "%s: b4's paired 2304 between its kind's 1.40 and 1.46: %g", when, p2304);
		CHECK(p3072 > 1.40 && p3072 < 1.46, "%s: b4's paired 3072: %g", when, p3072);
		double col = B(12582912, x, "colsum");
		CHECK(REL(col, 37.5 + 11.0 / 3), "%s: b4's column sum between 37.5 and 48.5, a third: %g", when, col);
		CHECK(REL(B(9437184, x, "colsum"), 37.5) && REL(B(9455616, x, "paired"), 1.29),
		      "%s: a measured size and kind takes its point", when);
		/* outside its kind's points: the line scaled to meet the nearest */
		CHECK(REL(B(100663296, x, "colsum"), 48.5 * 100663296 / 18874368),
		      "%s: beyond the column sums: %g", when, B(100663296, x, "colsum"));
		/* a kind the line has no point of, or none worked out: the line */
		CHECK(REL(B(1e6, x, "rows16"), 1e-6) && REL(B(1e6, x, NULL), 1e-6),
		      "%s: no point of its kind: the line: %g", when, B(1e6, x, NULL));
	}
	/* the file before kinds: priced as it was, whatever the kind */
	double o768 = B(6297600, &old, "paired"), o2304 = B(18892800, &old, "paired");
	double o3072 = B(25190400, &old, NULL), ocol = B(12582912, &old, "colsum");
	CHECK(fabs(o768 - 19.41) < 0.01 && fabs(o2304 - 48.45) < 0.01 && fabs(o3072 - 32.77) < 0.01 &&
	      ocol > 1.29 && ocol < 1.34,
	      "without kinds as before: 19.41 48.45 32.77 and the column sum ~1.3: %g %g %g %g", o768,
	      o2304, o3072, ocol);
#undef B
#undef REL
	machine_free(&back);
	machine_free(&old);
	machine_free(&m);
	snprintf(text, sizeof text, "%s[[1, 1, 7]]}}}}", head);
	CHECK(machine_parse(&m, text, "m.json", err, sizeof err) < 0 && strstr(err, "\"bias_grad\" \"bf16\"") &&
	      strstr(err, "kind"), "a kind that is not a string refused: '%s'", err);
	snprintf(text, sizeof text, "%s[[1, 1, \"a\"], [1, 2, \"b\"], [1, 3, \"c\"], [1, 4, \"d\"], "
		 "[1, 5, \"e\"], [1, 6, \"f\"], [1, 7, \"g\"], [1, 8, \"h\"], [1, 9, \"i\"]]}}}}", head);
	CHECK(machine_parse(&m, text, "m.json", err, sizeof err) < 0 && strstr(err, "more than 8 kinds"),
	      "more than 8 kinds refused: '%s'", err);
}

/* The CUDA backend's pairing rule on a step program (format/kernel_kind.c,
 * which runtime/cuda/gemm.cu pairs by): a weight gradient `matmul X, dY
 * transA` and the first bias_grad of dY after it on its stream, f32 out,
 * pair; a bias_grad of another dY, on another stream, or after dY is
 * written again, or into bf16, sums its columns. */
/* n tensors of dtype, [4, cols] each, planned apart (stride bytes each) */
static void tensors(DpTensor *t, int n, unsigned dtype, int64_t cols, uint64_t stride)
{
	memset(t, 0, sizeof *t * (size_t)n);
	for (int i = 0; i < n; i++) {
		t[i].dtype = (uint8_t)dtype;
		t[i].ndim = 2;
		t[i].dims[0] = 4;
		t[i].dims[1] = cols;
		t[i].offset = stride * (uint64_t)i;
		t[i].nbytes = 4 * (uint64_t)cols * dp_dtype_size(dtype);
	}
}

static void kernel_kinds(void)
{
	DpTensor t[8];
	tensors(t, 8, DP_F32, 3, 64);
	t[2].dims[0] = 1; /* the bias gradients [1, 3]: dY's columns */
	t[3].dims[0] = 1;
	t[7].dims[0] = 1;
	t[7].dtype = DP_BF16;
	t[7].nbytes = 6;
	DpInstr p[7];
	memset(p, 0, sizeof p);
	for (int i = 0; i < 7; i++)
		for (int k = 0; k < DP_MAX_IN; k++)
			p[i].in[k] = -1;
	/* 0: dW = X^T dY (X t0, dY t1, dW t4); 1: relu into t5; 2: bias_grad t1 -> t2
	 * (paired); 3: bias_grad t1 -> t3 (a second one: colsum); 4: dW' = X^T t5
	 * (t6) on the comm stream, 5: bias_grad t5 -> t7 bf16 (colsum); 6: a
	 * bias_grad of t0 (no matmul: colsum) */
	p[0].op = DP_OP_MATMUL, p[0].in[0] = 0, p[0].in[1] = 1, p[0].out = 4;
	DP_ATTR(&p[0], MATMUL, transA) = 1;
	p[1].op = DP_OP_RELU, p[1].in[0] = 0, p[1].out = 5;
	p[2].op = DP_OP_BIAS_GRAD, p[2].in[0] = 1, p[2].out = 2;
	p[3].op = DP_OP_BIAS_GRAD, p[3].in[0] = 1, p[3].out = 3;
	p[4] = p[0], p[4].in[1] = 5, p[4].out = 6;
	p[5].op = DP_OP_BIAS_GRAD, p[5].in[0] = 5, p[5].out = 7;
	p[6].op = DP_OP_BIAS_GRAD, p[6].in[0] = 0, p[6].out = 3;
	DpStep s = {0};
	s.tensors = t;
	s.ntensors = 8;
	s.prog[DP_PROG_STEP] = p;
	s.nprog[DP_PROG_STEP] = 7;
	int kind[7];
	dp_kernel_kinds(&s, DP_PROG_STEP, kind);
	CHECK(dp_bgrad_pair(&s, DP_PROG_STEP, 0) == 2 && kind[2] == 1 && kind[3] == 0 && kind[5] == 0 &&
	      kind[6] == 0 && dp_bgrad_pair(&s, DP_PROG_STEP, 4) == -1,
	      "pairing: %lld %d %d %d %d", (long long)dp_bgrad_pair(&s, DP_PROG_STEP, 0), kind[2], kind[3],
	      kind[5], kind[6]);
	for (int i = 0; i < 7; i++)
		CHECK(kind[i] == dp_kernel_kind(&s, DP_PROG_STEP, (uint32_t)i), "instruction %d: one rule", i);
	CHECK(!strcmp(dp_kernel_kind_name(DP_OP_BIAS_GRAD, kind[2]), "paired") &&
	      !strcmp(dp_kernel_kind_name(DP_OP_BIAS_GRAD, 0), "colsum") && !dp_kernel_kind_name(DP_OP_RELU, 0),
	      "the kinds' names");
	t[7].dtype = DP_F32; /* t5 -> f32 t7 but on another stream: colsum */
	p[5].stream = DP_STREAM_COMM;
	CHECK(dp_bgrad_pair(&s, DP_PROG_STEP, 4) == -1, "another stream: no pair");
	p[5].stream = p[4].stream;
	CHECK(dp_bgrad_pair(&s, DP_PROG_STEP, 4) == 5, "the same stream, f32: paired");
	p[1].out = 1; /* dY written between the matmul and its bias_grad */
	CHECK(dp_bgrad_pair(&s, DP_PROG_STEP, 0) == -1, "dY written between: no pair");

	/* the norms' warp rows (16-bit, c <= 1024 and a multiple of 8, every
	 * operand 16-byte aligned) and the classifier's rows16 (16-bit logits,
	 * strides of a multiple of 8, aligned) */
	DpTensor u[4];
	tensors(u, 4, DP_BF16, 768, 16384);
	u[3].dtype = DP_I32;
	u[3].dims[1] = 1;
	DpInstr q = {0};
	for (int k = 0; k < DP_MAX_IN; k++)
		q.in[k] = -1;
	q.op = DP_OP_LAYERNORM, q.in[0] = 0, q.in[1] = 1, q.in[2] = 2, q.out = 1;
	DpStep v = {0};
	v.tensors = u;
	v.ntensors = 4;
	v.prog[DP_PROG_STEP] = &q;
	v.nprog[DP_PROG_STEP] = 1;
#define K() dp_kernel_kind(&v, DP_PROG_STEP, 0)
	int w768 = K();
	u[0].dims[1] = 4096; /* a row too long for a warp */
	int w4096 = K();
	u[0].dims[1] = 1004; /* not a multiple of 8 */
	int w1004 = K();
	u[0].dims[1] = 768;
	u[2].offset += 8; /* beta misaligned */
	int wmis = K();
	u[2].offset -= 8;
	u[0].dtype = DP_F32;
	int wf32 = K();
	u[0].dtype = DP_BF16;
	CHECK(w768 == 1 && !w4096 && !w1004 && !wmis && !wf32 &&
	      !strcmp(dp_kernel_kind_name(DP_OP_LAYERNORM, 1), "warp"),
	      "norms: warp at 768 bf16 (%d), block at 4096, 1004, misaligned, f32 (%d %d %d %d)", w768,
	      w4096, w1004, wmis, wf32);
	q.op = DP_OP_XENT_GRAD, q.in[0] = 0, q.in[1] = 3, q.in[2] = -1, q.out = 1;
	int r16 = K();
	u[0].dims[1] = u[1].dims[1] = 300; /* a vocabulary of 300, unpadded */
	int r300 = K();
	u[0].ld = u[1].ld = 384; /* padded to 384 (passes/padvocab.c) */
	int r384 = K();
	u[0].dtype = u[1].dtype = DP_F32;
	int rf32 = K();
#undef K
	CHECK(r16 == 1 && !r300 && r384 == 1 && !rf32 &&
	      !strcmp(dp_kernel_kind_name(DP_OP_XENT_GRAD, 1), "rows16"),
	      "classifier: rows16 at 768 and padded 384, rows at 300 and in f32 (%d %d %d %d)", r16, r300,
	      r384, rf32);
}

static void machines(void)
{
	Machine m;
	char err[512];
	CHECK(machine_load(&m, "h100-nvlink", err, sizeof err) == 0, "h100-nvlink: %s", err);
	CHECK(m.executor == MACH_GPU && NEAR(m.peak_flops[MACH_BF16], 989.4e12) &&
	      NEAR(m.memory_bw, 3.35e12) && m.ranks_per_node == 8 && strstr(m.source, "datasheet"),
	      "h100-nvlink's figures");
	CHECK(NEAR(machine_gemm_rate(&m, MACH_BF16, 8192, 8192, 8192), 742e12),
	      "a GEMM at a table point runs at the point's rate");
	double mid = machine_gemm_rate(&m, MACH_BF16, 2896, 2896, 2896);
	CHECK(mid > 445e12 && mid < 742e12, "a GEMM between two points: %g", mid);
	CHECK(machine_op(&m, "attention") && !machine_op(&m, "relu"), "the ops' own entries");
	machine_free(&m);
	CHECK(machine_load(&m, "a100-nvlink", err, sizeof err) == 0, "a100-nvlink: %s", err);
	machine_free(&m);
	CHECK(machine_parse(&m, "{\"executor\": \"gpu\",\n \"peak_flops\": {\"f32\": 1, \"bf16\": 2},\n"
				"\"memory_bw\": 1, \"ranks_per_node\": 1, \"intra\": {\"alpha_s\": 0, "
				"\"busbw\": 1}, \"inter\": {\"alpha_s\": 0, \"busbw\": 1}, \"p2p\": "
				"{\"alpha_s\": 0, \"busbw\": 1}}", "m.json", err, sizeof err) == 0,
	      "the least machine file: %s", err);
	CHECK(NEAR(machine_gemm_rate(&m, MACH_F32, 10, 10, 10), 1), "no table: the peak");
	CHECK(m.node_overhead_s == 0 && m.node_overhead_n == 0, "no graph overhead unless given");
	machine_free(&m);
	/* a GPU's calibration: the graph's overhead per instruction, and the
	 * instructions it was measured over, written back as read */
	CHECK(machine_parse(&m, "{\"executor\": \"gpu\", \"peak_flops\": {\"f32\": 1, \"bf16\": 2},"
				"\"memory_bw\": 1, \"node_overhead_s\": 2e-6, \"node_overhead_n\": 300,"
				"\"ranks_per_node\": 1, \"intra\": {\"alpha_s\": 0, \"busbw\": 1}, \"inter\": "
				"{\"alpha_s\": 0, \"busbw\": 1}, \"p2p\": {\"alpha_s\": 0, \"busbw\": 1}}",
				"m.json", err, sizeof err) == 0 && NEAR(m.node_overhead_s, 2e-6) &&
	      NEAR(m.node_overhead_n, 300), "node_overhead_s and _n read: %s", err);
	char *text = machine_json(&m);
	Machine back;
	CHECK(text && machine_parse(&back, text, "back", err, sizeof err) == 0 &&
	      NEAR(back.node_overhead_s, 2e-6) && NEAR(back.node_overhead_n, 300),
	      "node_overhead_s and _n written back: %s", err);
	machine_free(&back);
	free(text);
	machine_free(&m);
	op_lines();
	op_kinds();
	kernel_kinds();
	gemm_table();
	CHECK(machine_parse(&m, "{\"executor\": \"tpu\"}", "m.json", err, sizeof err) < 0 &&
	      strstr(err, "m.json") && strstr(err, "executor"), "a bad executor: '%s'", err);
	CHECK(machine_parse(&m, "{\n\"executor\": \"gpu\",,\n}", "m.json", err, sizeof err) < 0 &&
	      strstr(err, "m.json:2"), "bad JSON names its line: '%s'", err);
	CHECK(machine_load(&m, "no-such-machine", err, sizeof err) < 0 && strstr(err, "h100-nvlink"),
	      "an unknown name lists the presets: '%s'", err);
}

int main(void)
{
	for (int ex = MACH_GPU; ex <= MACH_CPU; ex++) {
		two_streams(ex);
		wait_on_event(ex);
		accumulation(ex);
		pp_stages(ex);
		held_send(ex);
		sub_group(ex);
	}
	contention();
	cpu_comm_kernel();
	machines();
	printf("%d checks, %d failed\n", checks, failures);
	return failures != 0;
}
