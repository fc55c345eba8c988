/*
 * tests/backend_test.c - the compute-backend interface (runtime/backend.h)
 * has one shape, and the kernel tables have no silent gaps.
 *
 *  - Every backend fills every member of BackendOps, the graph members
 *    excepted (all three or none: the one optional group).
 *  - The one merge of kernel rows (runtime/kernel_table.h) takes rows in any
 *    order and refuses an op two rows claim, an opcode that does not exist
 *    and an executor-owned op (collectives, events, LOAD, INIT/SAVE, SHARD).
 *  - For every opcode of format/ops.def (DpOp) and each backend, a compute op
 *    (dp_op_class DP_OPC_KERNEL) is either in the backend's table or
 *    refused at load with a message naming it (and the backend's
 *    fallback device, when it has one), and no executor-owned op is
 *    in any table. Both backends must implement every compute op: one
 *    refused by either is a failure (issue 12: none is refused on CUDA;
 *    issue 14: nor cast, CUDA runs bf16 step files).
 *  - The CPU backend's streams (cpu/streams.c) over a comm backend that
 *    counts its calls: every collective goes executor -> backend -> comm;
 *    an event wait on compute waits for the collectives recorded before
 *    it; progress is polled while a collective is in flight (not with
 *    no_progress); a compute instruction touching memory of a collective
 *    in flight without an event is a schedule error naming both; a kernel
 *    on the comm stream runs after the collectives before it; a copy on the
 *    copy stream runs when compute waits for it or touches its memory, not
 *    where the walk meets it; a wait for an event not recorded is refused
 *    by the walk.
 *
 * The CUDA backend is inspected in the shared object the build made (its
 * exported BackendOps, loaded as dpexec loads it: $DPEXEC_CUDA_LIB),
 * without a GPU: the refusal runs exec_init on a one-instruction step file,
 * which checks the kernel table before it touches a device.
 *
 *   backend_test            CPU, and CUDA when $DPEXEC_CUDA_LIB loads
 * Prints one line per backend and "N passed, M failed[, K skipped]" last.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cpu/cpu.h"
#include "../runtime/exec.h"
#include "../runtime/kernel_table.h"

static int npass, nfail, nskip;

static void check(int ok, const char *fmt, const char *a, const char *b)
{
	if (ok) {
		npass++;
		return;
	}
	nfail++;
	printf("FAIL ");
	printf(fmt, a, b);
	printf("\n");
}

#define NT 3 /* tensors of a test step */

/* A step file of tensors t0, t1, t2 (4 f32 each, disjoint), two events and
 * the step program prog[0..n). */
static void make_step(DpStep *s, DpTensor t[NT], const DpInstr *prog, uint32_t n)
{
	static char strings[] = "t0\0t1\0t2";
	memset(s, 0, sizeof *s);
	memset(t, 0, NT * sizeof *t);
	for (int i = 0; i < NT; i++) {
		t[i].name = (uint32_t)(3 * i);
		t[i].dtype = DP_F32;
		t[i].ndim = 1;
		t[i].dims[0] = 4;
		t[i].offset = (uint64_t)(64 * i);
		t[i].nbytes = 16;
	}
	for (int a = 0; a < DP_MAX_AXES; a++)
		s->cfg.mesh[a] = 1;
	s->cfg.micro_batch = s->cfg.grad_accum = 1;
	s->cfg.arena_bytes = 64 * NT;
	s->strings = strings;
	s->nstrings = sizeof strings;
	s->tensors = t;
	s->ntensors = NT;
	s->nevents = 2;
	s->metrics.loss = s->metrics.grad_norm = s->metrics.eval_loss = s->metrics.eval_correct = -1;
	s->prog[DP_PROG_STEP] = (DpInstr *)prog;
	s->nprog[DP_PROG_STEP] = n;
}

/* Every opcode against one backend's table; returns how many it implements. */
static int check_backend(const BackendOps *ops)
{
	int implemented = 0, refused = 0;
	for (unsigned op = 0; op < DP_NOPS; op++) {
		const char *name = dp_op_names[op];
		if (dp_op_class(op) != DP_OPC_KERNEL) {
			check(!ops->has_kernel(op), "%s: executor-owned op %s is in the kernel table",
			      ops->name, name);
			continue;
		}
		if (ops->has_kernel(op)) {
			implemented++;
			continue;
		}
		/* fp16's loss scaling runs on an inline backend only (runtime/exec.c
		 * refuses it elsewhere as a whole, after the backend's own refusal
		 * of fp16): its compute op is the CPU's alone until the CUDA
		 * backend has fp16 */
		int feature = op == DP_OP_UNSCALE && !(ops->flags & BACKEND_INLINE);
		/* not implemented: exec_init must refuse it, naming the op */
		DpStep s;
		DpTensor t[NT];
		DpInstr in = {.op = (uint16_t)op, .stream = DP_STREAM_COMPUTE, .in = {0, -1, -1, -1},
			      .out = 1};
		make_step(&s, t, &in, 1);
		Comm comm = {.rank = 0, .world = 1, .mesh = {1, 1, 1, 1, 1}};
		Exec x;
		RtErr e = {.rank = -1};
		BackendOpts o = {0};
		int rc = exec_init(&x, &s, &comm, ops, &o, &e);
		if (rc == 0)
			exec_free(&x);
		check(rc != 0 && strstr(e.msg, name) != NULL,
		      "%s: op %s is neither implemented nor refused naming it", ops->name, name);
		refused += !feature;
		printf("  %s refuses %s: %s\n", ops->name, name, e.msg);
	}
	printf("%s: %d compute ops implemented, %d refused at load by name\n", ops->name,
	       implemented, refused);
	check(refused == 0, "%s: refuses compute ops (above); every backend must run them all%s",
	      ops->name, "");
	return implemented;
}

/* Every member but the optional graph group is set; the group is all or none. */
static void check_members(const BackendOps *o)
{
#define M(m) {#m, o->m != NULL}
	const struct {
		const char *name;
		int set;
	} need[] = {M(probe),        M(has_kernel), M(check),      M(init),       M(describe),
		    M(abort),        M(free),       M(kernel),     M(upload),     M(copy2d),
		    M(zero),         M(read),       M(write),      M(host_alloc), M(host_free),
		    M(stage_wait),   M(stage_push), M(step_wait),  M(set_step),   M(step_head),
		    M(step_tail),    M(run_begin),  M(run_end),    M(event_record),
		    M(event_wait),   M(collective), M(sync)};
#undef M
	int missing = 0;
	for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
		if (!need[i].set) {
			check(0, "%s: BackendOps.%s is not filled", o->name, need[i].name);
			missing++;
		}
	int graphs = (o->capture_begin != NULL) + (o->capture_end != NULL) + (o->replay != NULL);
	check(graphs == 0 || graphs == 3, "%s: %s of the graph members", o->name,
	      graphs == 1 ? "one" : "two");
	check(o->abi == DP_BACKEND_ABI, "%s: built for another backend ABI%s", o->name, "");
	printf("%s: %zu members filled%s\n", o->name, sizeof need / sizeof need[0] - (size_t)missing,
	       graphs ? ", and graphs" : ", no graphs");
}

/* ---- the one merge ---- */

static int fake_run(const KernelArgs *a, RtErr *e)
{
	return 0;
}

static void check_merge(void)
{
	KernelTable t;
	const KernelRow fwd[] = {{DP_OP_COPY, fake_run, NULL, 1, NULL, NULL, 0, 1},
				 {DP_OP_RELU, fake_run, NULL, 0, NULL, NULL, 1, 0},
				 {0}};
	const KernelRow rev[] = {fwd[1], fwd[0], {0}};
	const KernelRow *files[2] = {fwd, NULL};
	kernel_table_merge(&t, files, 1);
	check(!t.err[0] && kernel_row(&t, DP_OP_COPY) && kernel_row(&t, DP_OP_RELU) &&
		      t.k[DP_OP_COPY].bf16 == 1 && t.k[DP_OP_RELU].blas == 1 &&
		      t.k[DP_OP_COPY].f16 == 1 && t.k[DP_OP_RELU].f16 == 0 &&
		      !kernel_row(&t, DP_OP_ADD),
	      "merge: two rows give a table of those two ops%s%s", "", "");
	KernelTable u;
	files[0] = rev;
	kernel_table_merge(&u, files, 1);
	check(!memcmp(&t, &u, sizeof t), "merge: rows in another order give the same table%s%s", "",
	      "");
	const KernelRow twice[] = {{DP_OP_RELU, fake_run, NULL, 0, NULL, NULL, 0, 0}, {0}};
	files[0] = fwd;
	files[1] = twice;
	kernel_table_merge(&t, files, 2);
	check(strstr(t.err, "two kernel rows for relu") != NULL, "merge: an op claimed twice: '%s'%s",
	      t.err, "");
	const KernelRow unknown[] = {{DP_NOPS, fake_run, NULL, 0, NULL, NULL, 0, 0}, {0}};
	files[1] = unknown;
	kernel_table_merge(&t, files, 2);
	check(strstr(t.err, "does not exist") != NULL, "merge: an unknown opcode: '%s'%s", t.err, "");
	const KernelRow owned[] = {{DP_OP_ALL_REDUCE, fake_run, NULL, 0, NULL, NULL, 0, 0}, {0}};
	files[1] = owned;
	kernel_table_merge(&t, files, 2);
	check(strstr(t.err, "all_reduce") && strstr(t.err, "executor"),
	      "merge: an executor-owned op: '%s'%s", t.err, "");
	check(cpu_kernel_table()->err[0] == 0, "cpu: its rows merge: '%s'%s",
	      cpu_kernel_table()->err, "");
}

/* ---- the CPU's streams over a counting comm backend ---- */

static struct {
	int starts, progress, waits;
	int64_t last_wait; /* upto of the last wait */
	int first_wait;    /* 1 + the progress polls before the first wait; 0: none yet */
	void *buf;         /* the last all_reduce's buffer (it writes 1s there) */
	int64_t n;
	float t2[4];       /* t2 at the end of a run that succeeded */
} fc;

static int fake_all_reduce(Comm *c, unsigned axes, uint64_t stages, DpDtype dt, void *buf,
			   int64_t n, int64_t *ticket, RtErr *e)
{
	fc.starts++;
	fc.buf = buf;
	fc.n = n;
	for (int64_t i = 0; i < n; i++)
		((float *)buf)[i] = 1;
	*ticket = c->issued++;
	return 0;
}

static int fake_wait(Comm *c, int64_t upto, RtErr *e)
{
	fc.waits++;
	fc.last_wait = upto;
	if (!fc.first_wait)
		fc.first_wait = 1 + fc.progress;
	if (upto > c->completed)
		c->completed = upto;
	return 0;
}

static int fake_progress(Comm *c, RtErr *e)
{
	fc.progress++;
	return 0;
}

static const CommOps fake_comm = {.name = "fake",
				  .all_reduce_start = fake_all_reduce,
				  .wait = fake_wait,
				  .progress = fake_progress};

/* The step program prog[0..n) (make_step) run on the CPU backend. 0, or -1
 * with e. */
static int run_prog(const DpInstr *prog, uint32_t n, int no_progress, RtErr *e)
{
	DpTensor t[NT];
	DpStep s;
	make_step(&s, t, prog, n);
	Comm comm = {.ops = &fake_comm, .rank = 0, .world = 1, .mesh = {1, 1, 1, 1, 1}};
	BackendOpts o = {.no_progress = no_progress};
	Exec x;
	memset(&fc, 0, sizeof fc);
	e->msg[0] = 0;
	RT_CHECK(exec_init(&x, &s, &comm, backend_cpu(), &o, e));
	int rc = exec_run(&x, DP_PROG_STEP, 1, e);
	if (rc == 0 && fc.starts)
		rc = fc.buf == x.be.ptr[0] && fc.n == 4 ? 0 : RT_FAIL(e, "the collective's buffer");
	if (rc == 0)
		memcpy(fc.t2, x.be.ptr[2], sizeof fc.t2);
	exec_free(&x);
	return rc;
}

/* an instruction; IA: with its integer attribute name = v */
#define I(op_, st_, in0, out_) \
	{.op = DP_OP_##op_, .stream = DP_STREAM_##st_, .in = {in0, -1, -1, -1}, .out = out_}
#define IA(op_, st_, in0, out_, name, v)                                                  \
	{.op = DP_OP_##op_, .stream = DP_STREAM_##st_, .in = {in0, -1, -1, -1}, .out = out_, \
	 .ia = {[DP_ATTR_##op_##_##name] = (v)}}

static void check_streams(void)
{
	RtErr e = {.rank = -1};
	const unsigned dp = COMM_DP_AXES;
	/* all_reduce t0 on comm; the compute stream waits for it, then copies it */
	const DpInstr ok[] = {IA(ALL_REDUCE, COMM, -1, 0, axes, dp), IA(EVENT_RECORD, COMM, -1, -1, ev, 0),
			      IA(EVENT_WAIT, COMPUTE, -1, -1, ev, 0), I(COPY, COMPUTE, 0, 1)};
	int rc = run_prog(ok, 4, 0, &e);
	check(rc == 0 && fc.starts == 1, "cpu streams: a collective through the backend to the "
	      "comm backend, then an event wait (%s)%s", e.msg, "");
	check(rc == 0 && fc.last_wait >= 1 && fc.progress == 2,
	      "cpu streams: the event wait waits for the collective, progress polled while it "
	      "is in flight%s%s", "", "");
	/* the same without the event: a race on a GPU, an error here */
	const DpInstr race[] = {IA(ALL_REDUCE, COMM, -1, 0, axes, dp), I(COPY, COMPUTE, 0, 1)};
	rc = run_prog(race, 2, 0, &e);
	check(rc != 0 && strstr(e.msg, "schedule error in the step program: instruction 1 (copy) "
				 "touches 't0' while instruction 0 (all_reduce of 't0') is in flight"),
	      "cpu streams: compute reading a collective in flight is a schedule error: '%s'%s",
	      e.msg, "");
	/* writing what the collective reads is one too; other memory is not */
	const DpInstr write[] = {IA(ALL_REDUCE, COMM, -1, 0, axes, dp), I(FILL, COMPUTE, -1, 0)};
	rc = run_prog(write, 2, 0, &e);
	check(rc != 0 && strstr(e.msg, "instruction 1 (fill) touches 't0'"),
	      "cpu streams: compute writing a collective's buffer in flight: '%s'%s", e.msg, "");
	const DpInstr apart[] = {IA(ALL_REDUCE, COMM, -1, 0, axes, dp), I(COPY, COMPUTE, 2, 1)};
	rc = run_prog(apart, 2, 0, &e);
	check(rc == 0 && fc.progress == 1 && fc.last_wait == 1,
	      "cpu streams: compute on other memory overlaps it; the run's end waits (%s)%s",
	      e.msg, "");
	rc = run_prog(apart, 2, 1, &e);
	check(rc == 0 && fc.progress == 0, "cpu streams: no_progress polls nothing (%s)%s", e.msg,
	      "");
	/* a kernel on the comm stream comes after the collective before it */
	const DpInstr order[] = {IA(ALL_REDUCE, COMM, -1, 0, axes, dp), I(COPY, COMM, 0, 1)};
	rc = run_prog(order, 2, 0, &e);
	check(rc == 0 && fc.waits >= 2 && fc.last_wait == 1,
	      "cpu streams: a kernel on the comm stream waits for the collectives before it "
	      "(%s)%s", e.msg, "");
	/* a D2H on the copy stream after the all_reduce's event runs when
	 * compute waits for its own event, not where the walk meets it: the
	 * compute instruction between them (other memory) runs before any
	 * wait for the collective (progress polls count the instructions:
	 * the first wait comes after instruction 5's), and t2 reads the
	 * copied 1s. Run inline, the D2H would wait at its own poll, the
	 * third (bench/offload.sh's 2-rank skew: docs/OFFLOAD.md) */
	const DpInstr defer[] = {IA(ALL_REDUCE, COMM, -1, 0, axes, dp), IA(EVENT_RECORD, COMM, -1, -1, ev, 0),
				 IA(EVENT_WAIT, COPY, -1, -1, ev, 0), I(D2H, COPY, 0, 1),
				 IA(EVENT_RECORD, COPY, -1, -1, ev, 1), I(COPY, COMPUTE, 2, 2),
				 IA(EVENT_WAIT, COMPUTE, -1, -1, ev, 0), IA(EVENT_WAIT, COMPUTE, -1, -1, ev, 1),
				 I(COPY, COMPUTE, 1, 2)};
	rc = run_prog(defer, 9, 0, &e);
	check(rc == 0 && fc.first_wait > 5 && fc.t2[0] == 1 && fc.t2[3] == 1,
	      "cpu streams: a copy-stream D2H runs when compute waits for it, after the compute "
	      "walked past it (%s)%s", e.msg, "");
	/* compute reading the copy's destination with no wait (a GPU race) still
	 * reads the copy: the queued copy runs before it */
	const DpInstr racing[] = {defer[0], defer[1], defer[2], defer[3], I(COPY, COMPUTE, 1, 2)};
	rc = run_prog(racing, 5, 0, &e);
	check(rc == 0 && fc.t2[0] == 1,
	      "cpu streams: an instruction touching a queued copy's memory runs after it (%s)%s",
	      e.msg, "");
	const DpInstr unrecorded[] = {IA(EVENT_WAIT, COMPUTE, -1, -1, ev, 0)};
	rc = run_prog(unrecorded, 1, 0, &e);
	check(rc != 0 && strstr(e.msg, "waits for event 0, which was not recorded before it"),
	      "the walk refuses a wait for an event not recorded: '%s'%s", e.msg, "");
}

/* A backend without a kernel points at its fallback device, if it has one. */
static int no_kernel(unsigned op)
{
	return 0;
}

static void check_fallback(void)
{
	DpStep s;
	DpTensor t[NT];
	DpInstr in = {.op = DP_OP_RELU, .stream = DP_STREAM_COMPUTE, .in = {0, -1, -1, -1},
		      .out = 1};
	make_step(&s, t, &in, 1);
	BackendOps gpu = {.name = "gpu", .fallback = "cpu", .has_kernel = no_kernel};
	BackendOps ref = {.name = "ref", .has_kernel = no_kernel};
	RtErr e = {.rank = -1};
	int rc = exec_check_kernel(&s, &gpu, &in, &e);
	check(rc && strstr(e.msg, "the gpu backend has no kernel for relu (the instruction "
			   "writing 't1'); use --device cpu"),
	      "a missing kernel names the op and the backend's fallback: '%s'%s", e.msg, "");
	rc = exec_check_kernel(&s, &ref, &in, &e);
	check(rc && strstr(e.msg, "no kernel for relu") && !strstr(e.msg, "--device"),
	      "a backend without a fallback suggests none: '%s'%s", e.msg, "");
}

int main(void)
{
	int ncompute = 0;
	for (unsigned op = 0; op < DP_NOPS; op++)
		ncompute += dp_op_class(op) == DP_OPC_KERNEL;

	check_merge();
	check_fallback();
	check_streams();

	/* the CPU, the reference */
	const BackendOps *cpu = backend_cpu();
	check_members(cpu);
	int ncpu = check_backend(cpu);
	if (ncpu < ncompute)
		printf("NOTE: the CPU backend, the reference, lacks %d of %d compute ops (above)\n",
		       ncompute - ncpu, ncompute);

	/* CUDA: the shared object dpexec would load */
	const BackendOps *cuda;
	void *dl;
	char why[1024];
	if (backend_load_cuda(&cuda, &dl, why, sizeof why) == 0) {
		check(strcmp(cuda->name, "cuda") == 0, "cuda: the backend is named '%s'%s",
		      cuda->name, "");
		check_members(cuda);
		check_backend(cuda);
	} else {
		nskip++;
		printf("cuda: SKIPPED (%s)\n", why);
	}
	printf("%d passed, %d failed", npass, nfail);
	if (nskip)
		printf(", %d skipped", nskip);
	printf("\n");
	return nfail != 0;
}
