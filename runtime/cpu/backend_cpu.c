/*
 * cpu/backend_cpu.c - the CPU compute backend (BackendOps cpu_backend): the
 * readable reference for every kernel. Its memory is host memory (one
 * mmap'd arena), so the MPI comm backend reads the tensors in place, and
 * LOAD reads the staged batches where the executor filled them.
 *
 * It fills the whole interface but the optional graph members. Its two
 * streams run inline (BACKEND_INLINE; streams.c says how and why): each
 * call has done its work when it returns, except a collective on the comm
 * stream, which runs beside the compute until an event or the end of the
 * run waits for it. So a step runs inside its launch; step_tail keeps its
 * metrics in one of two slots (step k in slot k % 2, as the CUDA backend's
 * report), which step_wait(k) reads while step k + 1 is launched; staged
 * batches need no copy (stage_push, stage_wait: nothing to do).
 *
 * The kernel table is one opcode-indexed KernelTable (kernel_table.h),
 * merged once from the rows of the concept files with the merge every
 * backend uses; an op that two files claim stops init.
 *
 * Init also picks the inner loops for this CPU (cpu_vec_avx512 / avx2 /
 * scalar, vec.c; DP_CPU_ISA forces one) and starts the rank's threads
 * (pool.c): DP_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs this
 * process may run on (its affinity mask; an unbound rank of several on a
 * node takes its share). OpenBLAS always runs one thread: gemm.c splits
 * the products over the pool, so one set of threads serves every kernel.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cblas.h>

#include "../backend.h"
#include "cpu.h"

typedef struct {
	unsigned char *arena; /* cfg.arena_bytes, 64-byte aligned, zeroed */
	size_t arena_len;
	unsigned char *host;  /* cfg.host_arena_bytes (offload), the same; NULL: none */
	size_t host_len;
	const KernelTable *kern; /* cpu_kernel_table() */
	CpuStep step;
	CpuStreams *st;
	uint64_t cur_step; /* set_step's k */
	int64_t rep_step[2]; /* step_tail: the step whose report rep[k % 2] holds, -1: none */
	BackendReport rep[2];
	AmpState amp;        /* loss scaling's state before the next step (amp.h) */
	int amp_found;       /* the step's AMP_CHECK found the norm not finite */
	const CpuVec *vec;
	CpuPool *pool;
	/* bf16 instructions of kernels without a bf16 path run on f32 copies
	 * (bf16.c): the workspace they are converted into, and the tensor
	 * addresses with the staged ones pointing there */
	float *ws;
	size_t ws_floats;
	void **shadow;
	CpuBlas blas;      /* OpenBLAS's core and cuts */
	CpuGemm16 *gemm16; /* oneDNN's bf16 matmuls */
} CpuBackend;

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

static int cpu_probe(char *why, size_t len)
{
	return 1;
}

static int cpu_has_kernel(unsigned op)
{
	return kernel_row(cpu_kernel_table(), op) != NULL;
}

static int cpu_check(const DpStep *s, const DpInstr *in, RtErr *e)
{
	const KernelRow *k = &cpu_kernel_table()->k[in->op];
	/* the op's operand rules were the decoder's (format/stepfile_check.c): only
	 * this backend's own limits are left; a bf16 instruction of a kernel
	 * without a bf16 path runs on f32 copies (bf16.c) */
	return k->limits ? k->limits(s, in, e) : 0;
}

/* An arena of at least `bytes` (64-byte multiple), zeroed; NULL when the
 * mapping fails. */
static unsigned char *map_arena(uint64_t bytes, size_t *len)
{
	size_t n = (size_t)((bytes + 63) / 64 * 64);
	if (n == 0)
		n = 64;
	*len = n;
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void cpu_free(Backend *b)
{
	CpuBackend *c = b->impl;
	if (c && c->arena)
		munmap(c->arena, c->arena_len);
	if (c && c->host)
		munmap(c->host, c->host_len);
	if (c) {
		cpu_streams_free(c->st);
		cpu_pool_free(c->pool);
		free(c->ws);
		free(c->shadow);
		cpu_gemm16_free(c->gemm16);
	}
	free(c);
	free(b->ptr);
	b->impl = NULL;
	b->ptr = NULL;
}

static int cpu_init(Backend *b, const BackendOpts *o, RtErr *e)
{
	const DpStep *s = b->s;
	CpuBackend *c = calloc(1, sizeof *c);
	if (!c)
		return RT_FAIL(e, "out of memory (CPU backend)");
	b->impl = c;
	c->kern = cpu_kernel_table();
	c->rep_step[0] = c->rep_step[1] = -1;
	if (c->kern->err[0]) {
		cpu_free(b);
		return RT_FAIL(e, "internal error: the CPU kernel table: %s", cpu_kernel_table()->err);
	}
	if (cpu_streams_new(&c->st, s, b->comm, o->no_progress, e)) {
		cpu_free(b);
		return -1;
	}
	c->step.opt = &s->opt;
	c->step.loss_scale = 1; /* until set_step: a program run outside a step */
	c->step.amp_found = &c->amp_found;
	int threads = 1;
	cpu_blas_init(&c->blas);
	if (pick_vec(&c->vec, e) || pick_threads(&threads, e) || cpu_pool_new(&c->pool, threads, e) ||
	    cpu_gemm16_new(&c->gemm16, e)) {
		cpu_free(b);
		return -1;
	}

	/* mmap: page-aligned (so 64-byte aligned), zero-filled, and committed only
	 * as tensors touch it, so a bogus arena size fails here or costs nothing.
	 * The host arena (offload) is a second one: on the CPU both are host
	 * memory, and the D2H/H2D copies between them are memcpy */
	c->arena = map_arena(s->cfg.arena_bytes, &c->arena_len);
	if (s->cfg.host_arena_bytes)
		c->host = map_arena(s->cfg.host_arena_bytes, &c->host_len);
	b->ptr = calloc(s->ntensors ? s->ntensors : 1, sizeof *b->ptr);
	if (!c->arena || (s->cfg.host_arena_bytes && !c->host) || !b->ptr) {
		cpu_free(b);
		return RT_FAIL(e, "out of memory: cannot allocate the %.2f MiB arena%s",
			       (double)(s->cfg.arena_bytes + s->cfg.host_arena_bytes) / (1 << 20),
			       s->cfg.host_arena_bytes ? "s (device and host)" : "");
	}
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (s->tensors[i].nbytes)
			b->ptr[i] = (s->tensors[i].space == DP_SPACE_HOST ? c->host : c->arena) +
				    s->tensors[i].offset;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			/* oneDNN's matmuls need none; without it they are staged */
			const KernelRow *k = &c->kern->k[in->op];
			int own = rt_own_half_path(s, in, k->f16);
			if (dp_op_class(in->op) == DP_OPC_KERNEL && !(own && k->bf16) &&
			    !(own && k->run_bf16 && cpu_gemm16_usable(c->gemm16))) {
				size_t need = cpu_stage_need(s, in);
				c->ws_floats = need > c->ws_floats ? need : c->ws_floats;
			}
		}
	if (c->ws_floats) {
		c->ws = aligned_alloc(64, c->ws_floats * sizeof(float));
		c->shadow = malloc((s->ntensors ? s->ntensors : 1) * sizeof *c->shadow);
		if (!c->ws || !c->shadow) {
			cpu_free(b);
			return RT_FAIL(e, "out of memory: cannot allocate the %.2f MiB 16-bit workspace",
				       (double)(c->ws_floats * sizeof(float)) / (1 << 20));
		}
		memcpy(c->shadow, b->ptr, s->ntensors * sizeof *c->shadow);
	}
	return 0;
}

/* The plain f32 CPU is the default device: its line waits for --verbose;
 * a bf16 step's path and workspace are worth a line. */
static int cpu_describe(Backend *b, char *buf, size_t len)
{
	CpuBackend *c = b->impl;
	int k = snprintf(buf, len, "CPU (%s, %d threads; %s)", c->vec->isa,
			 cpu_pool_size(c->pool), openblas_get_config());
	if (c->ws_floats && k > 0 && (size_t)k < len)
		snprintf(buf + k, len - (size_t)k, "; %s, 16-bit workspace %.2f MiB",
			 dp_step_has_dtype(b->s, DP_F16) ? "f16 on f32 copies"
							 : cpu_gemm16_describe(c->gemm16),
			 (double)(c->ws_floats * sizeof(float)) / (1 << 20));
	return dp_step_has_dtype(b->s, DP_BF16) || dp_step_has_dtype(b->s, DP_F16);
}

/* MPI_Abort, which follows, ends the collectives in flight; nothing here
 * waits, and free() releases the memory. */
static void cpu_abort(Backend *b)
{
}

/* ---- work, inline (streams.c: each call starts with the streams' order) ---- */

static int cpu_kernel(Backend *b, const DpInstr *in, RtErr *e)
{
	CpuBackend *c = b->impl;
	const KernelRow *k = &c->kern->k[in->op];
	CpuArgs a = {b->s, in, b->ptr, &c->step, c->vec, c->pool, &c->blas, c->gemm16};
	RT_CHECK(cpu_streams_enter(c->st, &b->at, e));
	int own = rt_own_half_path(b->s, in, k->f16);
	if (!c->ws || (own && k->bf16) || !cpu_stage_need(b->s, in))
		return k->run(&a, e);
	if (own && k->run_bf16) {
		int rc = k->run_bf16(&a, e);
		if (rc <= 0)
			return rc;
	}
	/* a 16-bit instruction of a kernel without a path of its own: on f32 copies */
	cpu_stage_in(c->pool, b->s, in, b->ptr, c->shadow, c->ws);
	a.ptr = c->shadow;
	int rc = k->run(&a, e);
	cpu_stage_out(c->pool, b->s, in, b->ptr, c->shadow);
	return rc;
}

/* LOAD: straight from the host buffer the executor staged the batch in. */
static int cpu_upload(Backend *b, unsigned stream, void *dst, const void *host, size_t bytes,
		      RtErr *e)
{
	CpuBackend *c = b->impl;
	RT_CHECK(cpu_streams_enter(c->st, &b->at, e));
	memcpy(dst, host, bytes);
	return 0;
}

static int cpu_copy2d(Backend *b, unsigned stream, void *dst, size_t dpitch, const void *src,
		      size_t spitch, size_t width, size_t rows, RtErr *e)
{
	CpuBackend *c = b->impl;
	RT_CHECK(cpu_streams_enter(c->st, &b->at, e));
	for (size_t r = 0; r < rows; r++)
		memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
	return 0;
}

static int cpu_zero(Backend *b, unsigned stream, void *dst, size_t bytes, RtErr *e)
{
	memset(dst, 0, bytes); /* the metrics, before a run */
	return 0;
}

/* Inside a run, INIT and SAVE: their instruction's stream order first. */
static int cpu_read(Backend *b, const void *src, void *host, size_t bytes, RtErr *e)
{
	CpuBackend *c = b->impl;
	RT_CHECK(cpu_streams_enter(c->st, &b->at, e));
	memcpy(host, src, bytes);
	return 0;
}

static int cpu_write(Backend *b, void *dst, const void *host, size_t bytes, RtErr *e)
{
	CpuBackend *c = b->impl;
	RT_CHECK(cpu_streams_enter(c->st, &b->at, e));
	memcpy(dst, host, bytes);
	return 0;
}

static void *cpu_host_alloc(Backend *b, size_t bytes)
{
	return malloc(bytes);
}

static void cpu_host_free(Backend *b, void *p)
{
	free(p);
}

/* ---- staged batches and steps ---- */

/* Nothing copies out of a staging buffer behind the executor's back: a
 * step's LOADs read it while the step runs, inside its launch. */
static int cpu_stage_wait(Backend *b, const void *host, RtErr *e)
{
	return 0;
}

static int cpu_stage_push(Backend *b, const void *host, size_t bytes, uint64_t k, RtErr *e)
{
	return 0;
}

static int cpu_set_step(Backend *b, uint64_t k, double lr, RtErr *e)
{
	CpuBackend *c = b->impl;
	if (b->amp_set) {
		c->amp = b->amp;
		b->amp_set = 0;
	}
	c->step.lr = (float)lr;
	c->step.t = (int64_t)(k + 1 - c->amp.skipped);
	c->step.loss_scale = b->s->opt.loss_scale != DP_LS_NONE ? c->amp.scale : 1.0f;
	c->amp_found = 0;
	c->cur_step = k;
	return 0;
}

/* lr, t, the loss scale and the found-inf flag are host values the kernels
 * read (set_step). */
static int cpu_step_head(Backend *b, RtErr *e)
{
	return 0;
}

/* Loss scaling's update (amp.h), then the step's report into slot k % 2:
 * step k + 1 may run before it is read. */
static int cpu_step_tail(Backend *b, RtErr *e)
{
	CpuBackend *c = b->impl;
	const DpStep *s = b->s;
	int slot = (int)(c->cur_step & 1);
	BackendReport *r = &c->rep[slot];
	c->rep_step[slot] = (int64_t)c->cur_step;
	r->loss = s->metrics.loss >= 0 ? *(const float *)b->ptr[s->metrics.loss] : 0;
	r->grad_norm = s->metrics.grad_norm >= 0 ? *(const float *)b->ptr[s->metrics.grad_norm] : 0;
	r->amp_scale = c->amp.scale;
	r->amp_skip = c->amp_found;
	if (s->opt.loss_scale != DP_LS_NONE)
		amp_update(&c->amp, c->amp_found, &s->opt);
	r->amp = c->amp;
	return 0;
}

/* Step k ran inside its launch: its report is in its slot. */
static int cpu_step_wait(Backend *b, uint64_t k, BackendReport *r, RtErr *e)
{
	CpuBackend *c = b->impl;
	if (c->rep_step[k & 1] != (int64_t)k)
		return RT_FAIL(e, "internal error: step %llu's metrics were not kept (slot holds "
			       "step %lld)", (unsigned long long)k + 1, (long long)c->rep_step[k & 1] + 1);
	*r = c->rep[k & 1];
	return 0;
}

/* ---- streams (streams.c) ---- */

static int cpu_run_begin(Backend *b, DpProgram p, RtErr *e)
{
	CpuBackend *c = b->impl;
	cpu_streams_begin(c->st);
	return 0;
}

static int cpu_run_end(Backend *b, RtErr *e)
{
	CpuBackend *c = b->impl;
	return cpu_streams_end(c->st, e);
}

static int cpu_event_record(Backend *b, unsigned stream, unsigned event, RtErr *e)
{
	CpuBackend *c = b->impl;
	return cpu_streams_event_record(c->st, stream, event, e);
}

static int cpu_event_wait(Backend *b, unsigned stream, unsigned event, RtErr *e)
{
	CpuBackend *c = b->impl;
	return cpu_streams_event_wait(c->st, stream, event, e);
}

/* On the MPI comm backend (comm.h), through the streams. */
static int cpu_collective(Backend *b, const DpInstr *in, RtErr *e)
{
	CpuBackend *c = b->impl;
	return cpu_streams_collective(c->st, &b->at, b->ptr, in, e);
}

static int cpu_sync(Backend *b, const char *what, RtErr *e)
{
	CpuBackend *c = b->impl;
	return cpu_streams_sync(c->st, e);
}

/* No graphs: the executor walks every step (backend.h). */
const BackendOps cpu_backend = {
	.name = "cpu",
	.abi = DP_BACKEND_ABI,
	.flags = BACKEND_INLINE,
	.fallback = NULL, /* the reference: every op has a CPU kernel */
	.probe = cpu_probe,
	.has_kernel = cpu_has_kernel,
	.check = cpu_check,
	.init = cpu_init,
	.describe = cpu_describe,
	.abort = cpu_abort,
	.free = cpu_free,
	.kernel = cpu_kernel,
	.upload = cpu_upload,
	.copy2d = cpu_copy2d,
	.zero = cpu_zero,
	.read = cpu_read,
	.write = cpu_write,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
	.stage_wait = cpu_stage_wait,
	.stage_push = cpu_stage_push,
	.step_wait = cpu_step_wait,
	.set_step = cpu_set_step,
	.step_head = cpu_step_head,
	.step_tail = cpu_step_tail,
	.run_begin = cpu_run_begin,
	.run_end = cpu_run_end,
	.event_record = cpu_event_record,
	.event_wait = cpu_event_wait,
	.collective = cpu_collective,
	.sync = cpu_sync,
};
