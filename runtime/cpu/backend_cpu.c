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
 * run waits for it, and a copy on the copy stream (offload's D2H and H2D),
 * queued until an event, an instruction touching its memory or the end of
 * the run needs it. So a step runs inside its launch; step_tail keeps its
 * metrics in one of two slots (step k in slot k % 2, as the CUDA backend's
 * report), which step_wait(k) reads while step k + 1 is launched; staged
 * batches need no copy (stage_push, stage_wait: nothing to do).
 *
 * The kernel table is one opcode-indexed KernelTable (kernel_table.h),
 * merged once from the rows of the concept files with the merge every
 * backend uses; an op that two files claim stops init.
 *
 * Init also makes its CpuCore (core.c): the inner loops for this CPU, the
 * rank's threads, the 16-bit workspace; each kernel call is
 * cpu_core_run's, the one another backend's host step makes too.
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
	CpuCore k;            /* the kernel table, the step's scalars, loops, threads */
	CpuStreams *st;
	const DpStep *s;      /* the Backend's, for the copies the streams run */
	void *const *ptr;
	uint64_t cur_step; /* set_step's k */
	int64_t rep_step[2]; /* step_tail: the step whose report rep[k % 2] holds, -1: none */
	BackendReport rep[2];
	AmpState amp;        /* loss scaling's state before the next step (amp.h) */
	int amp_found;       /* the step's AMP_CHECK found the norm not finite */
} CpuBackend;

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
		cpu_core_free(&c->k);
	}
	free(c);
	free(b->ptr);
	b->impl = NULL;
	b->ptr = NULL;
}

/* A copy-stream instruction, run when the streams need it (streams.c). */
static int cpu_copy_run(void *ctx, const BackendAt *at, const DpInstr *in, RtErr *e)
{
	CpuBackend *c = ctx;
	return cpu_core_run(&c->k, c->s, in, c->ptr, e);
}

static int cpu_init(Backend *b, const BackendOpts *o, RtErr *e)
{
	const DpStep *s = b->s;
	CpuBackend *c = calloc(1, sizeof *c);
	if (!c)
		return RT_FAIL(e, "out of memory (CPU backend)");
	b->impl = c;
	c->rep_step[0] = c->rep_step[1] = -1;
	if (cpu_streams_new(&c->st, s, b->comm, o->no_progress, cpu_copy_run, c, e)) {
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
	c->s = s;
	c->ptr = b->ptr;
	if (cpu_core_init(&c->k, s, b->ptr, 0, e)) {
		cpu_free(b);
		return -1;
	}
	c->k.step.amp_found = &c->amp_found;
	return 0;
}

/* The plain f32 CPU is the default device: its line waits for --verbose;
 * a bf16 step's path and workspace are worth a line. */
static int cpu_describe(Backend *b, char *buf, size_t len)
{
	CpuBackend *c = b->impl;
	int k = snprintf(buf, len, "CPU (%s, %d threads; %s)", c->k.vec->isa,
			 cpu_pool_size(c->k.pool), openblas_get_config());
	if (c->k.ws_floats && k > 0 && (size_t)k < len)
		snprintf(buf + k, len - (size_t)k, "; %s, 16-bit workspace %.2f MiB",
			 dp_step_has_dtype(b->s, DP_F16) ? "f16 on f32 copies"
							 : cpu_gemm16_describe(c->k.gemm16),
			 (double)(c->k.ws_floats * sizeof(float)) / (1 << 20));
	return dp_step_has_dtype(b->s, DP_BF16) || dp_step_has_dtype(b->s, DP_F16);
}

/* MPI_Abort, which follows, ends the collectives in flight; nothing here
 * waits, and free() releases the memory. */
static void cpu_abort(Backend *b)
{
}

/* ---- work, inline (streams.c: each call starts with the streams' order) ---- */

/* A copy-stream instruction (offload's D2H, H2D) is queued (streams.c). */
static int cpu_kernel(Backend *b, const DpInstr *in, RtErr *e)
{
	CpuBackend *c = b->impl;
	int queued = cpu_streams_defer(c->st, &b->at, in, e);
	if (queued)
		return queued < 0 ? -1 : 0;
	RT_CHECK(cpu_streams_enter(c->st, &b->at, e));
	return cpu_core_run(&c->k, b->s, in, b->ptr, e);
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
	c->k.step.lr = (float)lr;
	c->k.step.t = (int64_t)(k + 1 - c->amp.skipped);
	c->k.step.k = k;
	c->k.step.loss_scale = b->s->opt.loss_scale != DP_LS_NONE ? c->amp.scale : 1.0f;
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
