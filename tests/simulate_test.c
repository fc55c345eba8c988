/*
 * simulate_test.c - the simulator's arithmetic (passes/simulate.c's
 * sim_run) on hand-built schedules whose times are known by hand, on both
 * executors, and the machine files' reader (util/machine.c): the presets
 * parse, a GEMM rate at a table point is that point's and between two
 * points lies between them, a bad file is one message naming it.
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
	machine_free(&m);
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
	}
	contention();
	cpu_comm_kernel();
	machines();
	printf("%d checks, %d failed\n", checks, failures);
	return failures != 0;
}
