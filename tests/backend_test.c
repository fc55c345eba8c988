/*
 * tests/backend_test.c - no silent gaps in the compute backends' kernel
 * tables.
 *
 *  - The one merge of kernel rows (runtime/kernel_table.h) takes rows in any
 *    order and refuses an op two rows claim, an opcode that does not exist
 *    and an executor-owned op (collectives, events, LOAD, INIT/SAVE, SHARD).
 *  - For every opcode of DP_KERNELS and each backend, a compute op
 *    (dp_op_class DP_OPC_KERNEL) is either in the backend's table or
 *    refused at load with a message naming it (and the backend's
 *    fallback device, when it has one), and no executor-owned op is
 *    in any table. Both backends must implement every compute op: one
 *    refused by either is a failure (issue 12: none is refused on CUDA;
 *    issue 14: nor cast, CUDA runs bf16 step files).
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

/* A step file of tensors t0, t1, t2 (4 f32 each, disjoint), one event and
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
	s->cfg.mesh[0] = s->cfg.mesh[1] = s->cfg.mesh[2] = s->cfg.mesh[3] = 1;
	s->cfg.micro_batch = s->cfg.grad_accum = 1;
	s->cfg.arena_bytes = 64 * NT;
	s->strings = strings;
	s->nstrings = sizeof strings;
	s->tensors = t;
	s->ntensors = NT;
	s->nevents = 1;
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
		/* not implemented: exec_init must refuse it, naming the op */
		DpStep s;
		DpTensor t[NT];
		DpInstr in = {.op = (uint16_t)op, .stream = DP_STREAM_COMPUTE, .in = {0, -1, -1, -1},
			      .out = 1};
		make_step(&s, t, &in, 1);
		Comm comm = {.rank = 0, .world = 1, .mesh = {1, 1, 1, 1}};
		Exec x;
		RtErr e = {.rank = -1};
		BackendOpts o = {0};
		int rc = exec_init(&x, &s, &comm, ops, &o, &e);
		if (rc == 0)
			exec_free(&x);
		check(rc != 0 && strstr(e.msg, name) != NULL,
		      "%s: op %s is neither implemented nor refused naming it", ops->name, name);
		refused++;
		printf("  %s refuses %s: %s\n", ops->name, name, e.msg);
	}
	printf("%s: %d compute ops implemented, %d refused at load by name\n", ops->name,
	       implemented, refused);
	check(refused == 0, "%s: refuses compute ops (above); every backend must run them all%s",
	      ops->name, "");
	return implemented;
}

/* ---- the one merge ---- */

static int fake_run(const KernelArgs *a, RtErr *e)
{
	return 0;
}

static void check_merge(void)
{
	KernelTable t;
	const KernelRow fwd[] = {{DP_OP_COPY, fake_run, NULL, 1, NULL, NULL, 0},
				 {DP_OP_RELU, fake_run, NULL, 0, NULL, NULL, 1},
				 {0}};
	const KernelRow rev[] = {fwd[1], fwd[0], {0}};
	const KernelRow *files[2] = {fwd, NULL};
	kernel_table_merge(&t, files, 1);
	check(!t.err[0] && kernel_row(&t, DP_OP_COPY) && kernel_row(&t, DP_OP_RELU) &&
		      t.k[DP_OP_COPY].bf16 == 1 && t.k[DP_OP_RELU].blas == 1 &&
		      !kernel_row(&t, DP_OP_ADD),
	      "merge: two rows give a table of those two ops%s%s", "", "");
	KernelTable u;
	files[0] = rev;
	kernel_table_merge(&u, files, 1);
	check(!memcmp(&t, &u, sizeof t), "merge: rows in another order give the same table%s%s", "",
	      "");
	const KernelRow twice[] = {{DP_OP_RELU, fake_run, NULL, 0, NULL, NULL, 0}, {0}};
	files[0] = fwd;
	files[1] = twice;
	kernel_table_merge(&t, files, 2);
	check(strstr(t.err, "two kernel rows for relu") != NULL, "merge: an op claimed twice: '%s'%s",
	      t.err, "");
	const KernelRow unknown[] = {{DP_NOPS, fake_run, NULL, 0, NULL, NULL, 0}, {0}};
	files[1] = unknown;
	kernel_table_merge(&t, files, 2);
	check(strstr(t.err, "does not exist") != NULL, "merge: an unknown opcode: '%s'%s", t.err, "");
	const KernelRow owned[] = {{DP_OP_ALL_REDUCE, fake_run, NULL, 0, NULL, NULL, 0}, {0}};
	files[1] = owned;
	kernel_table_merge(&t, files, 2);
	check(strstr(t.err, "all_reduce") && strstr(t.err, "executor"),
	      "merge: an executor-owned op: '%s'%s", t.err, "");
	check(cpu_kernel_table()->err[0] == 0, "cpu: its rows merge: '%s'%s",
	      cpu_kernel_table()->err, "");
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

	/* the CPU, the reference */
	const BackendOps *cpu = backend_cpu();
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
