/*
 * tests/backend_test.c - no silent gaps in the compute backends' kernel
 * tables: for every opcode of format/ops.def (DpOp) and each backend, a
 * compute op (dp_op_class DP_OPC_KERNEL) is either in the backend's table or
 * refused at load with a message naming it, and no executor-owned op
 * (collectives, events, LOAD, INIT/SAVE, SHARD) is in any table.
 *
 * The CPU backend is the reference: each op it implements is claimed by
 * exactly one of its concept files, and an op it lacks is listed loudly (an
 * op whose kernels are not written yet is refused by name on every backend,
 * which is the rule; the CPU should have them all). The CUDA
 * backend is inspected in the shared object the build made (its exported
 * BackendOps, loaded as dpexec loads it: $DPEXEC_CUDA_LIB), without a GPU:
 * the refusal runs exec_init on a one-instruction step file, which checks
 * the kernel table before it touches a device. Both backends must implement
 * every compute op: one refused by either is a failure (issue 12: none is
 * refused on CUDA; issue 14: nor cast, CUDA runs bf16 step files).
 *
 *   backend_test            CPU, and CUDA when $DPEXEC_CUDA_LIB loads
 * Prints one line per backend and "N passed, M failed[, K skipped]" last.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cpu/cpu.h"
#include "../runtime/exec.h"

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

/* A step file with two f32 tensors and op as the one step instruction. */
static void one_instr(DpStep *s, DpTensor t[2], DpInstr *in, unsigned op)
{
	static char strings[] = "t0\0t1";
	memset(s, 0, sizeof *s);
	memset(t, 0, 2 * sizeof *t);
	for (int i = 0; i < 2; i++) {
		t[i].name = (uint32_t)(3 * i);
		t[i].dtype = DP_F32;
		t[i].ndim = 1;
		t[i].dims[0] = 4;
		t[i].offset = (uint64_t)(64 * i);
		t[i].nbytes = 16;
	}
	*in = (DpInstr){.op = (uint16_t)op, .stream = DP_STREAM_COMPUTE, .in = {0, -1, -1, -1},
			.out = 1};
	s->cfg.mesh[0] = s->cfg.mesh[1] = s->cfg.mesh[2] = s->cfg.mesh[3] = 1;
	s->cfg.micro_batch = s->cfg.grad_accum = 1;
	s->cfg.arena_bytes = 128;
	s->strings = strings;
	s->nstrings = sizeof strings;
	s->tensors = t;
	s->ntensors = 2;
	s->prog[DP_PROG_STEP] = in;
	s->nprog[DP_PROG_STEP] = 1;
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
		DpTensor t[2];
		DpInstr in;
		one_instr(&s, t, &in, op);
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

int main(void)
{
	int ncompute = 0;
	for (unsigned op = 0; op < DP_NOPS; op++)
		ncompute += dp_op_class(op) == DP_OPC_KERNEL;

	/* the CPU: each op in exactly one concept file */
	int cpu = check_backend(&cpu_backend);
	if (cpu < ncompute)
		printf("NOTE: the CPU backend, the reference, lacks %d of %d compute ops (above)\n",
		       ncompute - cpu, ncompute);
	const CpuKernel *const parts[] = {cpu_layout_kernels, cpu_elementwise_kernels,
					  cpu_gemm_kernels,   cpu_loss_kernels,
					  cpu_optim_kernels,  cpu_norm_kernels,
					  cpu_seq_kernels,    cpu_cp_kernels};
	for (unsigned op = 0; op < DP_NOPS; op++) {
		int claims = 0;
		for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
			claims += parts[i][op].run != NULL;
		check(claims <= 1, "cpu: %s is claimed by several kernel files%s", dp_op_names[op],
		      "");
	}

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
