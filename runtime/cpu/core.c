/*
 * cpu/core.c - what running a CPU kernel needs beyond its operands
 * (CpuCore): the one kernel table, the optimizer step's scalars, the inner
 * loops for this CPU, the rank's threads, OpenBLAS's cuts, oneDNN's bf16
 * matmuls and the 16-bit workspace; and the one function that runs an
 * instruction with them (cpu_core_run: its kernel row, or its 16-bit path,
 * or on f32 copies). The CPU backend (backend_cpu.c) holds one for every
 * instruction; another backend's host step (offload: the instructions of
 * the host arena, dp_runs_on_host) holds one for those alone, through
 * cpu_host_kernels (backend.h's HostKernelOps), so a CUDA rank's host
 * AdamW is the CPU backend's kernel, threads and all, bit for bit.
 *
 * The inner loops: cpu_vec_avx512 / avx2 / scalar (vec.c; DP_CPU_ISA
 * forces one). The threads (pool.c): DP_NUM_THREADS, else OMP_NUM_THREADS,
 * else the CPUs this process may run on (its affinity mask; an unbound rank
 * of several on a node takes its share). OpenBLAS always runs one thread:
 * gemm.c splits the products over the pool, so one set of threads serves
 * every kernel.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend.h"
#include "cpu.h"

/* The inner loops for this CPU, or the ones DP_CPU_ISA names. */
static int pick_vec(const CpuVec **out, RtErr *e)
{
	const CpuVec *all[] = {&cpu_vec_avx512, &cpu_vec_avx2, &cpu_vec_scalar};
	int ok[3] = {0, 0, 1};
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	ok[1] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	ok[0] = ok[1] && __builtin_cpu_supports("avx512f");
#endif
	const char *want = getenv("DP_CPU_ISA");
	for (int i = 0; i < 3; i++) {
		if (want && *want && strcmp(want, all[i]->isa) != 0)
			continue;
		if (!ok[i])
			return RT_FAIL(e, "DP_CPU_ISA=%s: this CPU does not have it", want);
		*out = all[i];
		return 0;
	}
	return RT_FAIL(e, "DP_CPU_ISA=%s: not one of avx512, avx2, scalar", want);
}

/* Threads for this rank (see the top of the file). */
static int pick_threads(int *out, RtErr *e)
{
	const char *names[] = {"DP_NUM_THREADS", "OMP_NUM_THREADS"};
	for (int i = 0; i < 2; i++) {
		const char *v = getenv(names[i]);
		if (!v || !*v)
			continue;
		char *end;
		long n = strtol(v, &end, 10);
		if (*end || n < 1 || n > 1024)
			return RT_FAIL(e, "%s=%s: not a thread count in [1, 1024]", names[i], v);
		*out = (int)n;
		return 0;
	}
	cpu_set_t set;
	int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
	int local = ls ? atoi(ls) : 1;
	if (local > 1 && n >= online) /* not bound: the node's ranks share its cores */
		n /= local;
	*out = n < 1 ? 1 : n;
	return 0;
}

/* Merged on first use (has_kernel is asked before any init), once per
 * process, as the CUDA backend's table is built when its object loads. */
const KernelTable *cpu_kernel_table(void)
{
	static KernelTable t;
	static int merged;
	if (!merged) {
		static KernelRow maps[DP_NOPS + 1];
		cpu_map_rows(maps);
		const KernelRow *const files[] = {
			cpu_layout_rows, cpu_elementwise_rows, maps,          cpu_gemm_rows,
			cpu_loss_rows,   cpu_optim_rows,       cpu_norm_rows, cpu_seq_rows,
			cpu_cp_rows,     cpu_bf16_rows,
		};
		kernel_table_merge(&t, files, sizeof files / sizeof files[0]);
		merged = 1;
	}
	return &t;
}

int cpu_core_init(CpuCore *k, const DpStep *s, void *const *ptr, int host_only, RtErr *e)
{
	memset(k, 0, sizeof *k);
	k->kern = cpu_kernel_table();
	if (k->kern->err[0])
		return RT_FAIL(e, "internal error: the CPU kernel table: %s", k->kern->err);
	k->step.opt = &s->opt;
	k->step.loss_scale = 1; /* until set_step: a program run outside a step */
	int threads = 1;
	cpu_blas_init(&k->blas);
	if (pick_vec(&k->vec, e) || pick_threads(&threads, e) || cpu_pool_new(&k->pool, threads, e) ||
	    cpu_gemm16_new(&k->gemm16, e))
		return -1;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (dp_op_class(in->op) != DP_OPC_KERNEL || in->op >= DP_NOPS || (host_only && !dp_runs_on_host(s, in)))
				continue;
			/* oneDNN's matmuls need none; without it they are staged */
			const KernelRow *r = &k->kern->k[in->op];
			int own = rt_own_half_path(s, in, r->f16);
			if (!(own && r->bf16) && !(own && r->run_bf16 && cpu_gemm16_usable(k->gemm16))) {
				size_t need = cpu_stage_need(s, in);
				k->ws_floats = need > k->ws_floats ? need : k->ws_floats;
			}
		}
	if (k->ws_floats) {
		k->ws = aligned_alloc(64, k->ws_floats * sizeof(float));
		k->shadow = malloc((s->ntensors ? s->ntensors : 1) * sizeof *k->shadow);
		if (!k->ws || !k->shadow)
			return RT_FAIL(e, "out of memory: cannot allocate the %.2f MiB 16-bit workspace",
				       (double)(k->ws_floats * sizeof(float)) / (1 << 20));
		memcpy(k->shadow, ptr, s->ntensors * sizeof *k->shadow);
	}
	return 0;
}

void cpu_core_free(CpuCore *k)
{
	cpu_pool_free(k->pool);
	free(k->ws);
	free(k->shadow);
	cpu_gemm16_free(k->gemm16);
	memset(k, 0, sizeof *k);
}

int cpu_core_run(CpuCore *k, const DpStep *s, const DpInstr *in, void *const *ptr, RtErr *e)
{
	const KernelRow *r = &k->kern->k[in->op];
	CpuArgs a = {s, in, ptr, &k->step, k->vec, k->pool, &k->blas, k->gemm16};
	int own = rt_own_half_path(s, in, r->f16);
	if (!k->ws || (own && r->bf16) || !cpu_stage_need(s, in))
		return r->run(&a, e);
	if (own && r->run_bf16) {
		int rc = r->run_bf16(&a, e);
		if (rc <= 0)
			return rc;
	}
	/* a 16-bit instruction of a kernel without a path of its own: on f32 copies */
	cpu_stage_in(k->pool, s, in, ptr, k->shadow, k->ws);
	a.ptr = k->shadow;
	int rc = r->run(&a, e);
	cpu_stage_out(k->pool, s, in, ptr, k->shadow);
	return rc;
}

/* ---- the host step of another backend (BackendOpts.host) ---- */

struct HostKernels {
	const DpStep *s;
	void *const *ptr;
	CpuCore k;
};

static void host_close(HostKernels *h)
{
	if (!h)
		return;
	cpu_core_free(&h->k);
	free(h);
}

static int host_open(HostKernels **out, const DpStep *s, void *const *ptr, RtErr *e)
{
	HostKernels *h = calloc(1, sizeof *h);
	*out = NULL;
	if (!h)
		return RT_FAIL(e, "out of memory (the host step's kernels)");
	h->s = s;
	h->ptr = ptr;
	if (cpu_core_init(&h->k, s, ptr, 1, e)) {
		host_close(h);
		return -1;
	}
	*out = h;
	return 0;
}

/* Loss scaling's found-inf flag is the device's: a step file with both is
 * refused by the backend that calls this (amp_found stays NULL). */
static int host_run(HostKernels *h, const DpInstr *in, float lr, int64_t t, RtErr *e)
{
	h->k.step.lr = lr;
	h->k.step.t = t;
	return cpu_core_run(&h->k, h->s, in, h->ptr, e);
}

const HostKernelOps cpu_host_kernels = {host_open, host_run, host_close};
