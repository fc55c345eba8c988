/*
 * backend_cuda.c - the CUDA compute backend: the BackendOps `dp_cuda_backend`
 * that libdpcuda.so exports (backend.h; dpexec loads it with dlopen). Device
 * choice, one cudaMalloc'd arena (and a pinned host arena with offload),
 * four streams (the schedule's three, the batches') with events, NCCL
 * collectives, the step graph, batches staged on the device ahead of their
 * step, results reported through mapped host memory, the polling wait with
 * its watchdog, and teardown. The kernels and their table are the .cu files
 * (kernels.h); the communicators comm_nccl.c.
 *
 * The model (the executor's walk in exec.c drives it):
 *  - one arena per rank, every tensor a pointer at its offset (Backend.ptr);
 *  - three streams of the schedule (compute, comm, copy: offload's H2Ds of
 *    the updated shards), non-blocking; EVENT_RECORD/EVENT_WAIT are
 *    cudaEventRecord/cudaStreamWaitEvent on the instruction's stream, so
 *    the cross-stream order is exactly the schedule's. Each program run
 *    forks the comm and copy streams off the compute stream (run_begin)
 *    and joins them back (run_end): a run sees everything before it, and
 *    everything after it sees the whole run, on every stream. Another
 *    stream, copy_st, carries the staged batches;
 *  - kernels: the op's row of cu_kernel_table, with its plan entry (fusions
 *    decided at load by the planners; every GEMM's cuBLASLt algorithm is
 *    chosen there too, before any capture), a cuBLASLt handle and a 32 MiB
 *    workspace on each stream that has a GEMM, and a scratch buffer per
 *    stream;
 *  - collectives: NCCL on the instruction's stream, one communicator per
 *    (stream, axis mask) the step uses (two streams never share one: NCCL
 *    serialises a communicator's operations);
 *  - optimizer steps: the executor runs the first eagerly (NCCL connects,
 *    cuBLASLt and lazily loaded kernels initialise outside any capture), then
 *    captures one (schedule kernel, zeroed metrics, grad_accum runs of STEP,
 *    report and step-counter increment) into one CUDA Graph, instantiated
 *    once and replayed with one cudaGraphLaunch per step. lr, the step
 *    counter and fp16's loss-scaling state (the scale, its counters and the
 *    overflow flag the optimizer kernels read: amp.h) live in device memory
 *    (CuScalars), so the graph bakes in no host value that changes between
 *    steps and no host decides a skip; --no-graph enqueues the same
 *    sequence eagerly;
 *  - batches: stage_push copies step k's batches (pinned host memory) on
 *    the copy stream into device buffer k % 2 as soon as step k-2 is done
 *    with it; LOAD inside a step is a kernel that copies from buffer
 *    (device step counter) % 2, so the graph reads whichever step it is
 *    replayed as, and the host-to-device copy of step k+1 overlaps step k;
 *  - results: the step's last kernel writes the loss and grad-norm metrics,
 *    the device's lr and t, the loss-scaling state and any error a kernel met into mapped pinned
 *    memory (slot k % 2); step_wait(k) polls step k's event and reads them:
 *    no copy, no round trip inside the step, and step k+1 keeps running;
 *  - read/write (INIT, SAVE, checkpoints) go through one pinned bounce
 *    buffer per stream, on the compute stream after everything issued, and
 *    are waited for by polling: no synchronous copy races the non-blocking
 *    streams;
 *  - offload (docs/OFFLOAD.md): a second arena, pinned and not mapped (no
 *    kernel can address it), for the tensors whose space is the host's;
 *    D2H/H2D are cudaMemcpyAsync on their instruction's stream; each
 *    instruction of the host step (dp_runs_on_host) is a host function on
 *    its stream (a host node of the graph) that runs the CPU's kernel
 *    (BackendOpts.host), with lr and t from a host step counter that host
 *    functions set and advance in stream order, as the device's counter.
 *
 * Operand rules (presence, dtypes, element counts) are the step-file
 * decoder's: this backend relies on them and checks only its own limits at
 * load (the rows' limits; SHARD operands disjoint).
 *
 * Faults: every wait polls (cudaEventQuery, never a blocking sync) and
 * checks NCCL's async errors; with timeout_s > 0 a wait that exceeds it
 * destroys the graph, aborts every NCCL communicator and fails naming the
 * pending collective, known from progress marks each stream writes to
 * mapped host memory after every collective. NCCL init and every
 * ncclInProgress are settled under a deadline too. Teardown and abort
 * destroy the graph exec and the graph first (NCCL waits for graphs that
 * captured its communicators), then the communicators (an abort: all at
 * once, bounded; comm_nccl.c says why), then the GEMMs' cuBLASLt
 * descriptors, the cuBLASLt handles and their workspaces, then memory;
 * after an abort that outlived its bound, the host tables alone.
 *
 * Plain C compiled by gcc with -Wall -Wextra: the CUDA runtime, cuBLASLt and
 * NCCL C APIs only. It has run on an H200 (docs/CUDA.md, "Measured on
 * hardware", which also lists what only hardware shows).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "../backend.h"
#include "../lr_sched.h"
#include "gemm.h"
#include "kernels.h"
#include "mutant.h"
#include "nccl_int.h"

#define CU_BOUNCE_BYTES (16u << 20)    /* pinned bounce buffer per stream (read/write) */
#define CU_INIT_DEADLINE_S 300.0       /* NCCL init without --timeout */
#define CU_SETTLE_S 300.0              /* an ncclInProgress without --timeout */
#define MARK_SHIFT 24                  /* progress mark: step << 24 | sequence number */

#define CU(call)                                                                            \
	do {                                                                                \
		cudaError_t err_ = (call);                                                  \
		if (err_ != cudaSuccess)                                                    \
			return RT_FAIL(e, "%s: %s (%s)", #call, cudaGetErrorString(err_),   \
				       cudaGetErrorName(err_));                             \
	} while (0)
#define BLAS(call)                                                                          \
	do {                                                                                \
		cublasStatus_t st_ = (call);                                                \
		if (st_ != CUBLAS_STATUS_SUCCESS)                                           \
			return RT_FAIL(e, "%s: %s", #call, cublasLtGetStatusString(st_));   \
	} while (0)

/* Where a collective is, for the watchdog's message. */
typedef struct {
	int stream;
	int prog;
	uint32_t instr;
	int micro;
} Mark;

/* A host instruction's host function argument (offload): fixed at init, so
 * a captured graph's host node finds it at every replay. */
typedef struct CuHostCall {
	struct CuBackend *x;
	const DpStep *s;
	const DpInstr *in;
} CuHostCall;

/* Marks of one kind of run: 0 = the optimizer step, 1 = any other run. */
typedef struct {
	Mark *v;
	int n, cap;
} MarkTable;

/* A pinned host buffer from host_alloc and its two device copies (step
 * parities) that stage_push fills on the copy stream. */
typedef struct {
	unsigned char *host;
	size_t bytes;
	void *dev[2];        /* NULL until the first push */
	cudaEvent_t copied;  /* after the last copy out of host */
	int pushed;          /* a push happened: loads inside steps read dev[] */
} Region;

typedef struct CuBackend {
	BackendOpts o;
	int device;
	CuNccl *nccl;
	unsigned char *arena;
	cudaStream_t st[DP_NSTREAM];
	cudaStream_t copy_st;            /* staged batches */
	cublasLtHandle_t blas[DP_NSTREAM]; /* NULL on a stream without GEMMs */
	void *blas_ws[DP_NSTREAM];       /* its workspace, CU_BLAS_WS_BYTES */
	char tune_line[320];             /* --gemm-tune's account (gemm.h), for the device line */
	char adamw_line[96];             /* the multi-tensor AdamW's launches (optim.cu), for it too */
	int norm_pairs;                  /* norm dx instructions that make their gamma sums
	                                    (cu_plan_norm), for the device line */
	void *scratch[DP_NSTREAM];       /* per stream: kernels of two streams never share */
	int staging;                     /* some 16-bit instruction runs on f32 copies (bf16.cu) */
	void **shadow;                   /* staging: the tensors' addresses with the staged
	                                    operands' f32 copies in place of theirs */
	DpStep view;                     /* staging: the step as a staged kernel sees it, its
	                                    tensors view_t: the staged operands f32 during the
	                                    call (their sizes and dtypes are the copies') */
	DpTensor *view_t;
	unsigned char *bounce[DP_NSTREAM]; /* pinned, CU_BOUNCE_BYTES */
	int tf32;
	CuFuse *fuse[DP_NPROG];          /* the planners' entries, per instruction */
	void **aux;                      /* device memory the planners asked for */
	int naux;
	cudaEvent_t *ev;                 /* [nevents] */
	cudaEvent_t fork, join, done;
	cudaEvent_t step_done[2];        /* after step k (parity k % 2) on the compute stream */
	cudaEvent_t pushed[2];           /* after the batches of step k were copied */
	cudaEvent_t *tev;                /* dpexec --trace: one timing event per slot */
	uint32_t ntev;                   /* made so far (cu_time_mark) */
	CuScalars *sc;                   /* device */
	CuReport *rep;                   /* mapped pinned host memory, [3] */
	CuReport *rep_dev;
	Region *reg;
	int nreg, capreg;
	cudaGraph_t graph;
	cudaGraphExec_t gexec;
	int capturing;
	int in_step;                     /* between step_head and step_tail */
	int kind;                        /* mark table of the latest run */
	uint64_t next_step;              /* what the device counter holds */
	int counter_known;
	uint64_t cur_step;               /* the step set_step announced last */
	float want_lr[2];                /* the host's lr of step k, [k % 2] */
	/* watchdog: marks[k][stream] = last finished collective of run kind k */
	volatile int64_t *marks;         /* mapped pinned host memory, [2][DP_NSTREAM] */
	int64_t *marks_dev;
	MarkTable tab[2];
	int p2p_open;                    /* an ncclGroupStart of pipeline transfers is open */
	uint32_t p2p_first;              /* the instruction of its first transfer */
	int aborted;
	int abort_stuck;                 /* a NCCL abort outlived its bound (abort_all) */
	/* offload: the pinned host arena and the host step (docs/OFFLOAD.md) */
	unsigned char *host;             /* cudaHostAlloc'd, cfg.host_arena_bytes; NULL: none */
	size_t host_bytes;
	unsigned char *host_zeros;       /* pinned zeros: zero() of a host-arena metric */
	size_t host_zeros_bytes;
	HostKernels *hk;                 /* the CPU's kernels (BackendOpts.host) */
	CuHostCall *hcall[DP_NPROG];     /* [nprog]: each host instruction's argument */
	pthread_mutex_t host_mu;         /* the host functions (of two streams) one at a time */
	int host_mu_made;
	uint64_t host_k;                 /* the optimizer step the host functions are in:
	                                    set and advanced by host functions, in stream order */
	struct CuHostJump {
		struct CuBackend *x;
		uint64_t k;
	} host_jump[2];                  /* set_step's k for host_set_k, [k % 2] */
	int host_failed;                 /* a host kernel failed: host_err says how (host_mu) */
	RtErr host_err;
} CuBackend;

static const char *tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

static double settle_deadline(const CuBackend *x)
{
	return cu_nccl_now() + (x->o.timeout_s > 0 ? x->o.timeout_s : CU_SETTLE_S);
}

/* ---- before init ---- */

/* > 0 devices; 0: none (no driver, no device: --device auto runs on the
 * CPU); -1: a device this build cannot use (a driver older than the
 * runtime, or another driver error): a loud error, never a skip. */
static int cu_probe(char *why, size_t len)
{
	int drv = 0, rtv = 0, n = 0;
	if (cudaDriverGetVersion(&drv) != cudaSuccess)
		drv = 0; /* 0 also means: no driver installed */
	if (cudaRuntimeGetVersion(&rtv) != cudaSuccess)
		rtv = 0;
	cudaError_t err = cudaGetDeviceCount(&n);
	cudaGetLastError(); /* a driverless machine leaves an error behind */
	if (err == cudaSuccess && n > 0)
		return n;
	if (err == cudaSuccess || err == cudaErrorNoDevice) {
		const char *vis = getenv("CUDA_VISIBLE_DEVICES");
		snprintf(why, len, "no CUDA device is visible (driver %d.%d%s%s)", drv / 1000,
			 drv % 1000 / 10, vis ? ", CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "");
		return 0;
	}
	if (drv == 0) {
		snprintf(why, len, "no CUDA driver is installed (libcuda.so.1 not found; "
			 "cudaGetDeviceCount: %s)", cudaGetErrorString(err));
		return 0;
	}
	if (drv < rtv)
		snprintf(why, len, "the CUDA driver (%d.%d) is older than the CUDA runtime this "
			 "backend was built with (%d.%d): %s; install a newer driver", drv / 1000,
			 drv % 1000 / 10, rtv / 1000, rtv % 1000 / 10, cudaGetErrorString(err));
	else
		snprintf(why, len, "the CUDA driver %d.%d cannot be used: cudaGetDeviceCount: %s (%s)",
			 drv / 1000, drv % 1000 / 10, cudaGetErrorString(err), cudaGetErrorName(err));
	return -1;
}

static int cu_has_kernel(unsigned op)
{
	return kernel_row(&cu_kernel_table, op) != NULL;
}

/* Where instruction in's f32 copies of bf16 operands start in its stream's
 * scratch: after the row's own scratch bytes. */
static size_t stage_at(const DpStep *s, const DpInstr *in)
{
	const KernelRow *k = &cu_kernel_table.k[in->op];
	size_t own = k->scratch ? k->scratch(s, in) : CU_SCRATCH_MIN;
	return (own + 255) / 256 * 256;
}

/* Own limits only: the decoder guarantees the operands (see the top). */
static int cu_check(const DpStep *s, const DpInstr *in, RtErr *e)
{
	const KernelRow *k = &cu_kernel_table.k[in->op];
	return k->limits ? k->limits(s, in, e) : 0;
}

/* ---- waiting, with the watchdog ---- */

/* Graph objects destroyed on a thread of their own (abort_all): the
 * handles, whether the destroys returned, and two owners (the thread, the
 * waiter), the last of which frees it. */
typedef struct {
	cudaGraphExec_t gexec;
	cudaGraph_t graph;
	atomic_int done, owners;
} GraphDrop;

static void drop_release(GraphDrop *d)
{
	if (atomic_fetch_sub(&d->owners, 1) == 1)
		free(d);
}

static void *drop_graphs(void *arg)
{
	GraphDrop *d = arg;
	if (d->gexec)
		cudaGraphExecDestroy(d->gexec);
	if (d->graph)
		cudaGraphDestroy(d->graph);
	atomic_store(&d->done, 1);
	drop_release(d);
	return NULL;
}

/* Every communicator's abort flag first (cu_nccl_abort_start: one thread
 * each, at once), then the graph objects on a thread of their own, then the
 * wait for both, bounded. The order is forced: a launch stuck on a
 * collective ends only once its flag is up; cudaGraphExecDestroy of that
 * launch blocks until it ends (seen on the H200, driver 580: destroying
 * first, before any abort, hung the rank for good); and NCCL's abort
 * returns only when every graph that captured its communicator is gone
 * (comm_nccl.c's top). When something is still running after the bound,
 * kernels may still be running: cu_free then leaves the device alone and
 * the fatal path's exit ends the process. Idempotent. Memory is freed
 * later, by cu_free. */
static void abort_all(CuBackend *x)
{
	if (x->aborted)
		return;
	double deadline = cu_nccl_now() + CU_NCCL_ABORT_BOUND_S;
	if (MUTANT(graph_first)) { /* the graph destroyed before the abort flags */
		if (x->gexec)
			cudaGraphExecDestroy(x->gexec);
		if (x->graph)
			cudaGraphDestroy(x->graph);
		x->gexec = NULL;
		x->graph = NULL;
	}
	cu_nccl_abort_start(x->nccl);
	int graphs_stuck = 0;
	if (x->gexec || x->graph) {
		GraphDrop *d = calloc(1, sizeof *d);
		pthread_t t;
		pthread_attr_t at;
		int started = 0;
		if (d) {
			*d = (GraphDrop){.gexec = x->gexec, .graph = x->graph};
			atomic_store(&d->owners, 2);
			if (pthread_attr_init(&at) == 0) {
				pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
				started = pthread_create(&t, &at, drop_graphs, d) == 0;
				pthread_attr_destroy(&at);
			}
		}
		if (started) {
			while (!atomic_load(&d->done) && cu_nccl_now() < deadline) {
				struct timespec ts = {0, 1000000}; /* 1 ms */
				nanosleep(&ts, NULL);
			}
			graphs_stuck = !atomic_load(&d->done);
			drop_release(d);
		} else {
			free(d); /* not destroyed: NCCL's aborts wait for them, the bound ends it */
			graphs_stuck = 1;
		}
	}
	x->gexec = NULL;
	x->graph = NULL;
	double left = deadline - cu_nccl_now();
	x->abort_stuck = cu_nccl_abort(x->nccl, left > 0 ? left : 0) | graphs_stuck;
	x->aborted = 1;
	if (!x->abort_stuck)
		cudaGetLastError();
}

/* The first collective of each stream that has not finished, by the marks
 * (a step's marks carry the step number: marks of an earlier step mean
 * nothing of `step` has finished on that stream). */
static void pending_text(Backend *b, int kind, int64_t step, char *buf, size_t len)
{
	CuBackend *x = b->impl;
	const MarkTable *t = &x->tab[kind];
	size_t used = 0;
	buf[0] = 0;
	for (int st = 0; st < DP_NSTREAM; st++) {
		int64_t m = x->marks[kind * DP_NSTREAM + st], last = -1;
		if (kind == 1)
			last = m;
		else if (m >= 0 && m >> MARK_SHIFT == step)
			last = m & ((1 << MARK_SHIFT) - 1);
		else if (m >= 0 && m >> MARK_SHIFT > step)
			continue; /* this stream is past the step */
		for (int i = (int)(last + 1); i < t->n; i++) {
			const Mark *mk = &t->v[i];
			if (mk->stream != st)
				continue;
			const DpInstr *in = &b->s->prog[mk->prog][mk->instr];
			if (in->op == DP_OP_SEND || in->op == DP_OP_RECV) /* as comm_mpi.c names it */
				used += (size_t)snprintf(buf + used, used < len ? len - used : 0,
							 "%spipeline stage %d's %s stage %lld (tag %lld) on "
							 "the %s stream (%s program instruction %u)",
							 used ? "; " : "", dp_instr_stage(in),
							 in->op == DP_OP_SEND ? "send to" : "recv from",
							 (long long)DP_PEER(in), (long long)DP_TAG(in),
							 dp_stream_names[st], dp_prog_names[mk->prog], mk->instr);
			else
				used += (size_t)snprintf(buf + used, used < len ? len - used : 0,
							 "%s%s of '%s' over axis mask %lld on the %s stream "
							 "(%s program instruction %u, micro-batch %d)",
							 used ? "; " : "", dp_op_names[in->op],
							 tname(b->s, in->out), (long long)DP_AXES(in),
							 dp_stream_names[st], dp_prog_names[mk->prog], mk->instr,
							 mk->micro);
			break;
		}
	}
	if (!buf[0])
		snprintf(buf, len, "no collective outstanding (compute is what did not finish)");
}

/* Poll `ev` (recorded after the work) until it completes; `step` names the
 * optimizer step being waited for (-1: the latest run) in a timeout. */
static int wait_event(Backend *b, cudaEvent_t ev, const char *what, int64_t step, RtErr *e)
{
	CuBackend *x = b->impl;
	double t0 = cu_nccl_now(), last_check = t0;
	if (x->aborted)
		return RT_FAIL(e, "%s: the CUDA backend was aborted", what);
	for (long spins = 0;; spins++) {
		cudaError_t q = cudaEventQuery(ev);
		if (q == cudaSuccess)
			break;
		if (q != cudaErrorNotReady) {
			abort_all(x); /* a sticky device error: nothing more will complete */
			return RT_FAIL(e, "%s: %s (%s)", what, cudaGetErrorString(q), cudaGetErrorName(q));
		}
		double t = cu_nccl_now();
		if (t - last_check > 1e-3) { /* NCCL's own errors: a peer died, a timeout */
			last_check = t;
			if (cu_nccl_async_error(x->nccl, e)) {
				abort_all(x);
				return -1;
			}
		}
		if (x->o.timeout_s > 0 && t - t0 > x->o.timeout_s) {
			char pend[512];
			pending_text(b, step >= 0 ? 0 : x->kind, step, pend, sizeof pend);
			abort_all(x);
			RT_FAIL(e, "%s did not finish within --timeout %.3g s; pending: %s; %s", what,
				x->o.timeout_s, pend,
				x->abort_stuck ? "NCCL's abort did not return within its bound: the "
				"process ends without it" : "aborted every NCCL communicator");
			/* a rank stuck or gone, as the CPU's world wait finds it: no sync
			 * can follow, and the job exits 75 (a launcher may restart it) */
			e->lost = 1;
			return -1;
		}
		if (spins > 1000) { /* spin briefly, then let the core go */
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

/* The compute stream waits for everything issued on the comm, copy and
 * p2p streams (a wait takes the event's record at the call, so one event
 * serves each in turn). */
static int join_comm(CuBackend *x, RtErr *e)
{
	for (int k = 0; k < DP_NSTREAM; k++) {
		if (k == DP_STREAM_COMPUTE)
			continue;
		CU(cudaEventRecord(x->join, x->st[k]));
		CU(cudaStreamWaitEvent(x->st[DP_STREAM_COMPUTE], x->join, 0));
	}
	return 0;
}

/* A kernel's report of bad data, as the CPU's message for the same value. */
static int report_error(const CuReport *r, RtErr *e)
{
	switch (r->err) {
	case CU_ERR_NONE:
		return 0;
	case CU_ERR_LABEL:
		return RT_FAIL(e, "label %lld of row %lld is out of range for %lld classes",
			       (long long)r->err_value, (long long)r->err_index, (long long)r->err_limit);
	case CU_ERR_TOKEN:
		return RT_FAIL(e, "token id %lld at position %lld is outside the vocabulary [0, %lld)",
			       (long long)r->err_value, (long long)r->err_index, (long long)r->err_limit);
	case CU_ERR_POSITION:
		return RT_FAIL(e, "row %lld's position %lld is not the zigzag layout of a sequence of "
			       "%lld", (long long)r->err_index, (long long)r->err_value,
			       (long long)r->err_limit);
	default:
		return RT_FAIL(e, "a CUDA kernel reported error %d", r->err);
	}
}

/* ---- the host step (offload) ---- */

/* One host instruction, on the thread CUDA runs host functions on: the
 * CPU's kernel (BackendOpts.host) with the lr and t of the step its stream
 * is in, lr from the schedule as the CPU backend's (exec_lr). No CUDA call
 * here: a host function may make none. After a failure the rest do nothing
 * and the next wait reports it (host_error). */
static void host_instr(void *arg)
{
	CuHostCall *c = arg;
	CuBackend *x = c->x;
	pthread_mutex_lock(&x->host_mu);
	if (!x->host_failed) {
		RtErr e = {.rank = -1};
		uint64_t k = x->host_k;
		float lr = (float)sched_lr(&c->s->sched, c->s->opt.lr, c->s->cfg.steps, k);
		if (x->o.host->run(x->hk, c->in, lr, (int64_t)k + 1, &e)) {
			x->host_err = e;
			x->host_failed = 1;
		}
	}
	pthread_mutex_unlock(&x->host_mu);
}

/* The host step's counter, in stream order: set by set_step (a resume, a
 * jump) and advanced at every step's tail, as the device's (CuScalars.step). */
static void host_set_k(void *arg)
{
	struct CuHostJump *j = arg;
	pthread_mutex_lock(&j->x->host_mu);
	j->x->host_k = j->k;
	pthread_mutex_unlock(&j->x->host_mu);
}

static void host_advance(void *arg)
{
	CuBackend *x = arg;
	pthread_mutex_lock(&x->host_mu);
	x->host_k++;
	pthread_mutex_unlock(&x->host_mu);
}

/* A host instruction's failure, once the work it was in is waited for. */
static int host_error(CuBackend *x, RtErr *e)
{
	if (!x->hk)
		return 0;
	pthread_mutex_lock(&x->host_mu);
	int failed = x->host_failed;
	if (failed)
		RT_FAIL(e, "the host step (offload): %s", x->host_err.msg);
	pthread_mutex_unlock(&x->host_mu);
	return failed ? -1 : 0;
}

/* Does address p lie in the pinned host arena? */
static int in_host_arena(const CuBackend *x, const void *p)
{
	const unsigned char *q = p;
	return x->host && q >= x->host && q < x->host + x->host_bytes;
}

/* Wait for everything issued (both streams), then the report of any error a
 * kernel met. */
static int cu_sync(Backend *b, const char *what, RtErr *e)
{
	CuBackend *x = b->impl;
	if (x->aborted)
		return RT_FAIL(e, "%s: the CUDA backend was aborted", what);
	RT_CHECK(join_comm(x, e));
	CU(cu_k_report(x->st[DP_STREAM_COMPUTE], x->sc, x->rep_dev, 0, NULL, NULL));
	CU(cudaEventRecord(x->done, x->st[DP_STREAM_COMPUTE]));
	if (wait_event(b, x->done, what, -1, e)) {
		x->counter_known = 0;
		return -1;
	}
	RT_CHECK(host_error(x, e));
	return report_error(&x->rep[2], e);
}

/* ---- set-up and teardown ---- */

static int add_mark(CuBackend *x, int kind, int stream, const BackendAt *at, int64_t *seq,
		    RtErr *e)
{
	MarkTable *t = &x->tab[kind];
	if (t->n == t->cap) {
		int cap = t->cap ? 2 * t->cap : 64;
		Mark *v = realloc(t->v, (size_t)cap * sizeof *v);
		if (!v)
			return RT_FAIL(e, "out of memory (watchdog marks)");
		t->v = v;
		t->cap = cap;
	}
	if (t->n >= (1 << MARK_SHIFT) - 1)
		return RT_FAIL(e, "too many collectives in one run for the watchdog's marks");
	t->v[t->n] = (Mark){stream, at->prog, at->instr, at->micro};
	*seq = t->n++;
	return 0;
}

static void reset_marks(CuBackend *x, int kind)
{
	for (int st = 0; st < DP_NSTREAM; st++)
		x->marks[kind * DP_NSTREAM + st] = -1;
}

/* The planners' device memory: zeroed, freed with the backend. */
static void *plan_alloc(CuPlan *p, size_t bytes)
{
	CuBackend *x = p->impl;
	void *d = NULL, **v = realloc(x->aux, (size_t)(x->naux + 1) * sizeof *v);
	if (!v)
		return NULL;
	x->aux = v;
	if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	x->aux[x->naux++] = d;
	if (cudaMemsetAsync(d, 0, bytes ? bytes : 1, x->st[DP_STREAM_COMPUTE]) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	return d;
}

/* A planner's table into its device memory, on the compute stream after
 * plan_alloc's zeroing there, waited for: the host buffer may go. */
static cudaError_t plan_upload(CuPlan *p, void *dev, const void *host, size_t bytes)
{
	CuBackend *x = p->impl;
	cudaStream_t st = x->st[DP_STREAM_COMPUTE];
	cudaError_t err = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, st);
	return err != cudaSuccess ? err : cudaStreamSynchronize(st);
}

/* The GEMM tuner's agreement (gemm.h): over every rank of the job. */
static int tune_all_ok(void *ctx, int ok, int *all, RtErr *e)
{
	Comm *c = ((Backend *)ctx)->comm;
	return c->ops->all_ok(c, ok, all, e);
}

static int plan(Backend *b, CuBackend *x, RtErr *e)
{
	const DpStep *s = b->s;
	CuPlan p = {.s = s, .ptr = b->ptr, .stage = (int)b->comm->coord[DP_AXIS_PP], .alloc = plan_alloc,
		    .upload = plan_upload, .impl = x};
	memcpy(p.blas, x->blas, sizeof p.blas);
	for (int g = 0; g < DP_NPROG; g++) {
		x->fuse[g] = calloc(s->nprog[g] ? s->nprog[g] : 1, sizeof *x->fuse[g]);
		if (!x->fuse[g])
			return RT_FAIL(e, "out of memory (kernel plan)");
		p.fuse[g] = x->fuse[g];
	}
	RT_CHECK(cu_plan_clip(&p, e));
	RT_CHECK(cu_plan_adamw(&p, e)); /* (after the clip's fold, which its runs share) */
	cu_plan_adamw_line(&p, x->adamw_line, sizeof x->adamw_line);
	RT_CHECK(cu_plan_xent(&p, e));
	RT_CHECK(cu_plan_attn(&p, e));
	RT_CHECK(cu_plan_norm(&p, e));
	for (int g = 0; g < DP_NPROG; g++)
		for (uint32_t i = 0; i < s->nprog[g]; i++)
			x->norm_pairs += p.fuse[g][i].norm_gb != NULL;
	/* cuBLASLt's algorithms, chosen here, outside any capture (every GEMM
	 * reads its operands in their own dtype: f32, bf16 or f16), then
	 * (--gemm-tune) timed: every rank gets to the tuner, also one whose
	 * GEMM plan failed, since the tuner agrees with the other ranks */
	int rc = cu_plan_gemm(&p, e);
	CuTune t = {.mode = x->o.gemm_tune ? CU_TUNE_ON : CU_TUNE_OFF, .file = x->o.gemm_tune_file,
		    .rank = b->comm->rank, .world = b->comm->world, .all_ok = tune_all_ok, .ctx = b};
	memcpy(t.st, x->st, sizeof t.st);
	memcpy(t.ws, x->blas_ws, sizeof t.ws);
	rc = cu_tune_gemm(&p, &t, rc, e);
	memcpy(x->tune_line, t.summary, sizeof x->tune_line);
	return rc;
}

/* SHARD is a strided copy kernel: its operands must not overlap. */
static int check_shards(const DpStep *s, RtErr *e)
{
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->op != DP_OP_SHARD)
				continue;
			const DpTensor *a = &s->tensors[in->in[0]], *o = &s->tensors[in->out];
			uint64_t at = dp_tensor_addr(s, a), ot = dp_tensor_addr(s, o); /* (two arenas) */
			if (at < ot + o->nbytes && ot < at + a->nbytes)
				return RT_FAIL(e, "step file: %s program instruction %u: shard of '%s' into "
					       "'%s': overlapping operands are not supported on CUDA",
					       dp_prog_names[p], i, tname(s, in->in[0]), tname(s, in->out));
		}
	return 0;
}

/* Where the .dp file asked for a 16-bit dtype (cfg.half_line, dpc's record),
 * as a compile error would name it, or what dpc's flag asked for. */
static void half_where(const DpStep *s, const char *prec, char *where, size_t len)
{
	const char *file = s->source ? s->strings + s->source : "";
	if (s->cfg.half_line && *file)
		snprintf(where, len, "%.500s:%u:%u", file, s->cfg.half_line, s->cfg.half_col);
	else
		snprintf(where, len, "%.500s%sprecision %s (dpc --precision %s)", file,
			 *file ? ": " : "", prec, prec);
}

/* The device can run this step: this build has its kernels for the device
 * (CUDA_ARCH in mk/cuda.mk: by default compute capability 8.x, and 9.0 and
 * newer through PTX), and a step with bf16 tensors gets bf16 arithmetic:
 * compute capability 8.0 (A100) or newer. f16 (precision fp16) needs
 * nothing more than the build's kernels: it is stored as bits, converted in
 * integer arithmetic and computed in f32 (bf16.cu; no half-precision
 * instruction, which would need 5.3), and NCCL's ncclHalf has no rule of its
 * own. The errors name where the .dp file asked for the dtype. Both are told
 * at load, not as the first launch's "no kernel image". */
static int check_device(const DpStep *s, int dev, RtErr *e)
{
	struct cudaDeviceProp p;
	CU(cudaGetDeviceProperties(&p, dev));
	cudaError_t img = cu_kernel_image();
	int built = img == cudaSuccess;
	if (!built && img != cudaErrorNoKernelImageForDevice && img != cudaErrorInvalidDeviceFunction)
		return RT_FAIL(e, "cudaFuncGetAttributes (does this build run on CUDA device %d?): %s (%s)",
			       dev, cudaGetErrorString(img), cudaGetErrorName(img));
	(void)cudaGetLastError(); /* the probe's refusal is told here, not at a later launch */
	char where[600];
	if (dp_step_has_dtype(s, DP_BF16) && p.major < 8) {
		half_where(s, "bf16", where, sizeof where);
		return RT_FAIL(e,
			       "%s: bf16 needs a GPU of compute capability 8.0 or newer (A100, H100); "
			       "CUDA device %d, %s, is %d.%d: run on the CPU (--device cpu) or compile in "
			       "f32%s", where, dev, p.name, p.major, p.minor,
			       built ? "" : " with the CUDA backend built for this GPU (CUDA_ARCH in mk/cuda.mk)");
	}
	if (!built)
		return RT_FAIL(e,
			       "CUDA device %d, %s, is compute capability %d.%d, and this build of the "
			       "CUDA backend has no kernels for it (%s): rebuild it with make "
			       "CUDA_ARCH='-gencode arch=compute_%d%d,code=sm_%d%d' (mk/cuda.mk), or run "
			       "on the CPU (--device cpu)", dev, p.name, p.major, p.minor,
			       cudaGetErrorName(img), p.major, p.minor, p.major, p.minor);
	return 0;
}

/* The device, the communicators, memory, streams, handles, events. On
 * failure cu_init frees the partial set-up. */
static int init_body(Backend *b, CuBackend *x, RtErr *e)
{
	const DpStep *s = b->s;
	int ndev = 0;
	if (cu_kernel_table.err[0])
		return RT_FAIL(e, "internal error: the CUDA kernel table: %s", cu_kernel_table.err);
	RT_CHECK(check_shards(s, e));
	CU(cudaGetDeviceCount(&ndev));
	if (ndev < 1)
		return RT_FAIL(e, "no CUDA device is visible");
	x->device = x->o.local_rank % ndev;
	CU(cudaSetDevice(x->device));
	RT_CHECK(check_device(s, x->device, e));
	x->tf32 = s->cfg.gemm_math == DP_GEMM_TF32;

	/* what the kernel rows need, per stream; a communicator per collective */
	int gemm_on[DP_NSTREAM] = {0};
	size_t scratch[DP_NSTREAM];
	for (int k = 0; k < DP_NSTREAM; k++)
		scratch[k] = CU_SCRATCH_MIN;
	uint32_t masks[DP_NSTREAM];
	cu_nccl_masks(s, masks);
	CommGroup groups[COMM_MAX_GROUPS];
	int ngroups = comm_step_groups(s, groups, COMM_MAX_GROUPS);
	if (ngroups < 0)
		return RT_FAIL(e, "the step file's all_reduces use more than %d sub-groups of the "
			       "pipeline stages", COMM_MAX_GROUPS);
	RT_CHECK(cu_nccl_init(&x->nccl, b->comm, masks, groups, ngroups,
			      x->o.timeout_s > 0 ? x->o.timeout_s : CU_INIT_DEADLINE_S, e));
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->stream >= DP_NSTREAM)
				return RT_FAIL(e, "step file: %s program instruction %u: bad stream %u",
					       dp_prog_names[p], i, in->stream);
			uint64_t set = in->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(in, ALL_REDUCE, stages) : 0;
			int pp = b->comm->coord[DP_AXIS_PP];
			if (set && pp < 64 && set >> pp & 1 && dp_instr_stage(in) == pp &&
			    !cu_nccl_group_comm(x->nccl, (unsigned)DP_AXES(in), set))
				return RT_FAIL(e, "no NCCL communicator for axis mask %lld over pipeline "
					       "stages 0x%llx", (long long)DP_AXES(in), (unsigned long long)set);
			if (dp_is_collective(in->op) && !set &&
			    cu_nccl_group_size(b->comm, (unsigned)DP_AXES(in)) > 1 &&
			    !cu_nccl_comm(x->nccl, in->stream, (unsigned)DP_AXES(in)))
				return RT_FAIL(e, "no NCCL communicator for axis mask %lld on the %s "
					       "stream", (long long)DP_AXES(in), dp_stream_names[in->stream]);
			if (dp_op_class(in->op) != DP_OPC_KERNEL || in->op >= DP_NOPS) /* (decoded) */
				continue;
			if (dp_runs_on_host(s, in))
				continue; /* the host step's: host memory, the CPU's kernels */
			const KernelRow *k = &cu_kernel_table.k[in->op];
			int own = k->bf16 && rt_own_half_path(s, in, k->f16);
			gemm_on[in->stream] |= k->blas;
			size_t need = stage_at(s, in) + (own ? 0 : cu_stage_need(s, in));
			if (need > scratch[in->stream])
				scratch[in->stream] = need;
			x->staging |= !own && cu_stage_need(s, in) > 0;
		}

	/* the collectives' streams (comm, and p2p for the pipeline's transfers)
	 * at the device's greatest priority: an NCCL kernel's blocks are
	 * scheduled before compute blocks waiting for SMs, so the bucket it
	 * moves is not stuck behind a GEMM the backward issues after it (the
	 * captured graph keeps the priority:
	 * cudaGraphInstantiateFlagUseNodePriority) */
	int least = 0, greatest = 0;
	CU(cudaDeviceGetStreamPriorityRange(&least, &greatest));
	for (int k = 0; k < DP_NSTREAM; k++)
		CU(cudaStreamCreateWithPriority(&x->st[k], cudaStreamNonBlocking,
						k == DP_STREAM_COMM || k == DP_STREAM_P2P ? greatest
											   : least));
	CU(cudaStreamCreateWithFlags(&x->copy_st, cudaStreamNonBlocking));
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	size_t bytes = (size_t)((s->cfg.arena_bytes + 255) / 256 * 256);
	CU(cudaMalloc((void **)&x->arena, bytes ? bytes : 256));
	CU(cudaMemsetAsync(x->arena, 0, bytes ? bytes : 256, cs));
	b->ptr = calloc(s->ntensors ? s->ntensors : 1, sizeof *b->ptr);
	x->ev = calloc(s->nevents ? s->nevents : 1, sizeof *x->ev);
	x->shadow = x->staging ? calloc(s->ntensors ? s->ntensors : 1, sizeof *x->shadow) : NULL;
	x->view_t = x->staging ? calloc(s->ntensors ? s->ntensors : 1, sizeof *x->view_t) : NULL;
	if (!b->ptr || !x->ev || (x->staging && (!x->shadow || !x->view_t)))
		return RT_FAIL(e, "out of memory (CUDA backend tables)");
	if (x->view_t) {
		memcpy(x->view_t, s->tensors, s->ntensors * sizeof *x->view_t);
		x->view = *s;
		x->view.tensors = x->view_t;
	}
	/* offload: the host arena is pinned (the D2H/H2D copies are DMA, legal
	 * in a capture) and not mapped: no kernel can address it */
	if (s->cfg.host_arena_bytes) {
		x->host_bytes = (size_t)((s->cfg.host_arena_bytes + 255) / 256 * 256);
		CU(cudaHostAlloc((void **)&x->host, x->host_bytes, cudaHostAllocDefault));
		memset(x->host, 0, x->host_bytes);
		/* a metric's host copy (the grad norm's) is zeroed with the
		 * metrics before each run: a copy from pinned zeros, in stream order */
		x->host_zeros_bytes = 256;
		for (uint32_t i = 0; i < s->ntensors; i++)
			if (s->tensors[i].space == DP_SPACE_HOST && s->tensors[i].kind == DP_T_METRIC &&
			    s->tensors[i].nbytes > x->host_zeros_bytes)
				x->host_zeros_bytes = (size_t)s->tensors[i].nbytes;
		CU(cudaHostAlloc((void **)&x->host_zeros, x->host_zeros_bytes, cudaHostAllocDefault));
		memset(x->host_zeros, 0, x->host_zeros_bytes);
	}
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (s->tensors[i].nbytes)
			b->ptr[i] = (s->tensors[i].space == DP_SPACE_HOST ? x->host : x->arena) +
				    s->tensors[i].offset;
	if (x->host) {
		if (pthread_mutex_init(&x->host_mu, NULL))
			return RT_FAIL(e, "pthread_mutex_init failed (the host step)");
		x->host_mu_made = 1;
		for (int p = 0; p < DP_NPROG; p++) {
			x->hcall[p] = calloc(s->nprog[p] ? s->nprog[p] : 1, sizeof *x->hcall[p]);
			if (!x->hcall[p])
				return RT_FAIL(e, "out of memory (the host step's table)");
			for (uint32_t i = 0; i < s->nprog[p]; i++)
				x->hcall[p][i] = (CuHostCall){x, s, &s->prog[p][i]};
		}
		for (int k = 0; k < 2; k++)
			x->host_jump[k].x = x;
		RT_CHECK(x->o.host->open(&x->hk, s, b->ptr, e));
	}
	if (x->shadow)
		memcpy(x->shadow, b->ptr, s->ntensors * sizeof *x->shadow);

	for (int k = 0; k < DP_NSTREAM; k++) {
		CU(cudaMalloc(&x->scratch[k], scratch[k]));
		CU(cudaHostAlloc((void **)&x->bounce[k], CU_BOUNCE_BYTES, cudaHostAllocDefault));
		if (!gemm_on[k])
			continue;
		/* a handle has no stream, math mode or workspace of its own: each
		 * GEMM's plan carries its compute type (TF32 only with precision
		 * tf32), each call the stream and this workspace */
		BLAS(cublasLtCreate(&x->blas[k]));
		CU(cudaMalloc(&x->blas_ws[k], CU_BLAS_WS_BYTES));
	}
	for (uint32_t i = 0; i < s->nevents; i++)
		CU(cudaEventCreateWithFlags(&x->ev[i], cudaEventDisableTiming));
	CU(cudaEventCreateWithFlags(&x->fork, cudaEventDisableTiming));
	CU(cudaEventCreateWithFlags(&x->join, cudaEventDisableTiming));
	CU(cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming));
	for (int k = 0; k < 2; k++) {
		CU(cudaEventCreateWithFlags(&x->step_done[k], cudaEventDisableTiming));
		CU(cudaEventCreateWithFlags(&x->pushed[k], cudaEventDisableTiming));
	}
	CU(cudaMalloc((void **)&x->sc, sizeof *x->sc));
	CU(cudaMemsetAsync(x->sc, 0, sizeof *x->sc, cs));
	x->counter_known = 1; /* step 0 */
	CU(cudaHostAlloc((void **)&x->rep, 3 * sizeof *x->rep, cudaHostAllocMapped));
	CU(cudaHostGetDevicePointer((void **)&x->rep_dev, x->rep, 0));
	memset(x->rep, 0, 3 * sizeof *x->rep);
	x->rep[0].step = x->rep[1].step = -1;
	CU(cudaHostAlloc((void **)&x->marks, 2 * DP_NSTREAM * sizeof(int64_t), cudaHostAllocMapped));
	CU(cudaHostGetDevicePointer((void **)&x->marks_dev, (void *)x->marks, 0));
	reset_marks(x, 0);
	reset_marks(x, 1);
	RT_CHECK(plan(b, x, e));
	/* start-up: the set-up above has finished, waited for by polling */
	CU(cudaEventRecord(x->done, cs));
	return wait_event(b, x->done, "initialising the CUDA backend", -1, e);
}

/* The host tables alone: after an abort that outlived its bound (the
 * device may still run kernels and NCCL's threads may still use what the
 * backend made, and a CUDA call could block on them), the device's memory,
 * streams and handles are left to the process's exit. */
static void free_host_side(Backend *b, CuBackend *x)
{
	for (int k = 0; k < 2; k++)
		free(x->tab[k].v);
	for (int g = 0; g < DP_NPROG; g++)
		free(x->fuse[g]);
	free(x->aux);
	free(x->reg);
	free(x->ev);
	free(x->shadow);
	free(x->view_t);
	for (int p = 0; p < DP_NPROG; p++)
		free(x->hcall[p]);
	if (x->host_mu_made)
		pthread_mutex_destroy(&x->host_mu);
	free(b->ptr);
	free(x);
	b->ptr = NULL;
	b->impl = NULL;
}

static void cu_free(Backend *b)
{
	CuBackend *x = b->impl;
	if (!x)
		return;
	if (x->abort_stuck) {
		free_host_side(b, x);
		return;
	}
	if (!x->aborted && x->done && x->st[DP_STREAM_COMPUTE]) {
		/* let issued work finish, under the watchdog; also the copy stream */
		RtErr ignore = {.rank = -1};
		if (cu_sync(b, "teardown", &ignore) == 0 && x->copy_st &&
		    cudaEventRecord(x->done, x->copy_st) == cudaSuccess)
			wait_event(b, x->done, "teardown", -1, &ignore);
	}
	/* graphs, then communicators, then memory */
	if (x->gexec)
		cudaGraphExecDestroy(x->gexec);
	if (x->graph)
		cudaGraphDestroy(x->graph);
	cu_nccl_free(x->nccl); /* after abort_all: nothing left to finalize */
	for (uint32_t i = 0; x->ev && i < b->s->nevents; i++)
		if (x->ev[i])
			cudaEventDestroy(x->ev[i]);
	cudaEvent_t evs[] = {x->fork, x->join, x->done, x->step_done[0], x->step_done[1],
			     x->pushed[0], x->pushed[1]};
	for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
		if (evs[i])
			cudaEventDestroy(evs[i]);
	for (uint32_t i = 0; i < x->ntev; i++)
		cudaEventDestroy(x->tev[i]);
	free(x->tev);
	for (int i = 0; i < x->nreg; i++) {
		Region *r = &x->reg[i];
		if (r->copied)
			cudaEventDestroy(r->copied);
		for (int k = 0; k < 2; k++)
			if (r->dev[k])
				cudaFree(r->dev[k]);
		cudaFreeHost(r->host);
	}
	/* the GEMMs' cuBLASLt descriptors, then the handles, then their
	 * workspaces (nothing is in flight: synced above, graphs destroyed) */
	for (int g = 0; g < DP_NPROG; g++)
		for (uint32_t i = 0; x->fuse[g] && i < b->s->nprog[g]; i++)
			cu_gemm_free(&x->fuse[g][i]);
	for (int k = 0; k < DP_NSTREAM; k++) {
		if (x->blas[k])
			cublasLtDestroy(x->blas[k]);
		if (x->blas_ws[k])
			cudaFree(x->blas_ws[k]);
		if (x->scratch[k])
			cudaFree(x->scratch[k]);
		if (x->bounce[k])
			cudaFreeHost(x->bounce[k]);
		if (x->st[k])
			cudaStreamDestroy(x->st[k]);
	}
	if (x->copy_st)
		cudaStreamDestroy(x->copy_st);
	for (int i = 0; i < x->naux; i++)
		cudaFree(x->aux[i]);
	if (x->sc)
		cudaFree(x->sc);
	if (x->rep)
		cudaFreeHost(x->rep);
	if (x->marks)
		cudaFreeHost((void *)x->marks);
	if (x->arena)
		cudaFree(x->arena);
	/* the host step's kernels, then its arena (no host function is left:
	 * synced above, graphs destroyed) */
	if (x->hk)
		x->o.host->close(x->hk);
	if (x->host)
		cudaFreeHost(x->host);
	if (x->host_zeros)
		cudaFreeHost(x->host_zeros);
	cudaGetLastError();
	free_host_side(b, x);
}

static int cu_init(Backend *b, const BackendOpts *o, RtErr *e)
{
	/* offload: the host step runs the CPU's kernels (o->host), which read
	 * no device state; loss scaling's overflow flag is device state */
	if (b->s->cfg.host_arena_bytes && !o->host)
		return RT_FAIL(e, "internal error: a host arena (offload) and no host kernels");
	if (b->s->cfg.host_arena_bytes && b->s->opt.loss_scale != DP_LS_NONE)
		return RT_FAIL(e, "step file: the cuda backend does not run offload with loss scaling "
			       "(fp16): the host step would not see the device's overflow flag; use "
			       "--device cpu, or precision bf16");
	CuBackend *x = calloc(1, sizeof *x);
	if (!x)
		return RT_FAIL(e, "out of memory (CUDA backend)");
	b->impl = x;
	x->o = *o;
	if (init_body(b, x, e)) {
		abort_all(x); /* the other ranks may be stuck in an NCCL init: do not wait */
		cu_free(b);
		return -1;
	}
	return 0;
}

/* A GPU is always worth a line in the log. */
static int cu_describe(Backend *b, char *buf, size_t len)
{
	CuBackend *x = b->impl;
	struct cudaDeviceProp p;
	int drv = 0, rtv = 0, nv = cu_nccl_version();
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rtv);
	if (cudaGetDeviceProperties(&p, x->device) != cudaSuccess) {
		cudaGetLastError();
		snprintf(buf, len, "CUDA device %d (driver %d, runtime %d, NCCL %d)", x->device, drv,
			 rtv, nv);
		return 1;
	}
	int prio = 0, least = 0, greatest = 0;
	if (cudaStreamGetPriority(x->st[DP_STREAM_COMM], &prio) != cudaSuccess ||
	    cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess)
		cudaGetLastError();
	snprintf(buf, len,
		 "%s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d, runtime %d.%d, NCCL %d, %s%s, "
		 "collectives' stream priority %d (%d..%d)%s%s",
		 p.name, p.major, p.minor, p.multiProcessorCount,
		 (double)p.totalGlobalMem / (1u << 30), drv / 1000, drv % 1000 / 10, rtv / 1000,
		 rtv % 1000 / 10, nv, x->o.no_graph ? "eager (--no-graph)" : "CUDA Graph",
		 x->tf32 ? ", TF32 GEMMs" : "", prio, least, greatest,
		 cu_attn_dq_split() == 1 ? ", attention dQ split (DP_ATTN_DQ=split: an experiment)" : "",
		 cu_attn_bwd_pipe() == 1 ? ", attention backward one barrier per query tile (DP_ATTN_BWD=pipe: an experiment)"
					 : "");
	if (x->norm_pairs) {
		size_t l = strlen(buf);
		snprintf(buf + l, len - l, ", %d norm backward%s with %s gamma sums (DP_NORM_GB)",
			 x->norm_pairs, x->norm_pairs == 1 ? "" : "s", x->norm_pairs == 1 ? "its" : "their");
	}
	if (x->adamw_line[0]) {
		size_t l = strlen(buf);
		snprintf(buf + l, len - l, "; %s", x->adamw_line);
	}
	if (x->tune_line[0]) {
		size_t l = strlen(buf);
		snprintf(buf + l, len - l, "; %s", x->tune_line);
	}
	return 1;
}

static void cu_abort(Backend *b)
{
	if (b->impl)
		abort_all(b->impl);
}

/* ---- work ---- */

static int cu_kernel(Backend *b, const DpInstr *in, RtErr *e)
{
	CuBackend *x = b->impl;
	const KernelRow *k = &cu_kernel_table.k[in->op];
	/* the host step (offload): a host function in stream order, so it runs
	 * after what its stream waited for and before what follows it; inside
	 * a capture, a host node of the graph */
	if (x->hk && dp_runs_on_host(b->s, in) && !MUTANT(host_on_device)) {
		/* (an update without clipping is on the copy stream, after its
		 * gradient's D2H there and before its H2D: the mutant launches it
		 * on the compute stream, where it waits for neither) */
		int copy = in->stream == DP_STREAM_COPY;
		cudaStream_t st = x->st[MUTANT(host_stream) && copy ? DP_STREAM_COMPUTE : in->stream];
		CU(cudaLaunchHostFunc(st, host_instr, &x->hcall[b->at.prog][b->at.instr]));
		return 0;
	}
	CuArgs a = {b->s, in, b->ptr, x->st[in->stream], x->blas[in->stream], x->blas_ws[in->stream],
		    x->scratch[in->stream], x->sc, &x->fuse[b->at.prog][b->at.instr], x->tf32};
	if (!x->shadow || (k->bf16 && rt_own_half_path(b->s, in, k->f16)) || !cu_stage_need(b->s, in))
		return k->run(&a, e);
	/* a 16-bit instruction of a kernel without a path of its own for its
	 * dtype: on f32 copies after the row's own scratch (bf16.cu), which the
	 * kernel sees as the f32 tensors they are (x->view) */
	cudaStream_t st = a.st;
	CU(cu_stage_in(st, b->s, in, b->ptr, x->shadow, (char *)a.scratch + stage_at(b->s, in)));
	a.ptr = x->shadow;
	a.s = &x->view;
	for (int j = -1; j < DP_MAX_IN; j++)
		if (rt_half_staged(b->s, in, j))
			x->view_t[j < 0 ? in->out : in->in[j]].dtype = DP_F32;
	int rc = k->run(&a, e);
	for (int j = -1; j < DP_MAX_IN; j++)
		if (rt_half_staged(b->s, in, j)) {
			int id = j < 0 ? in->out : in->in[j];
			x->view_t[id].dtype = b->s->tensors[id].dtype;
		}
	cudaError_t err = cu_stage_out(st, b->s, in, b->ptr, x->shadow);
	if (rc)
		return rc;
	CU(err);
	return 0;
}

/* The staging region host lies in, or NULL. */
static Region *region_of(CuBackend *x, const void *host)
{
	const unsigned char *h = host;
	for (int i = 0; i < x->nreg; i++)
		if (h >= x->reg[i].host && h < x->reg[i].host + x->reg[i].bytes)
			return &x->reg[i];
	return NULL;
}

/* LOAD. Inside an optimizer step from a pushed region: the kernel that
 * copies from the device copy of the step the device counter says (what a
 * graph replays correctly); otherwise a copy from the pinned buffer, which
 * the executor leaves alone until the run's wait. */
static int cu_upload(Backend *b, unsigned stream, void *dst, const void *host, size_t bytes,
		     RtErr *e)
{
	CuBackend *x = b->impl;
	Region *r = region_of(x, host);
	if (!bytes)
		return 0;
	if (x->in_step && r && r->pushed) {
		size_t off = (size_t)((const unsigned char *)host - r->host);
		CU(cu_k_load(x->st[stream], dst, (unsigned char *)r->dev[0] + off,
			     (unsigned char *)r->dev[1] + off, bytes, x->sc));
		return 0;
	}
	CU(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, x->st[stream]));
	return 0;
}

/* SHARD: a kernel (no pitch limit; cudaMemcpy2DAsync refuses pitches above
 * cudaDeviceProp.memPitch, ~2 GiB); a contiguous block is one memcpy. */
static int cu_copy2d(Backend *b, unsigned stream, void *dst, size_t dpitch, const void *src,
		     size_t spitch, size_t width, size_t rows, RtErr *e)
{
	CuBackend *x = b->impl;
	if (!width || !rows || (dst == src && dpitch == spitch))
		return 0;
	if (in_host_arena(x, dst) || in_host_arena(x, src)) { /* offload: a DMA copy */
		enum cudaMemcpyKind kind = in_host_arena(x, src)
			? (in_host_arena(x, dst) ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
			: cudaMemcpyDeviceToHost;
		CU(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind, x->st[stream]));
		return 0;
	}
	if (rows == 1 || (dpitch == width && spitch == width))
		CU(cudaMemcpyAsync(dst, src, width * rows, cudaMemcpyDeviceToDevice, x->st[stream]));
	else
		CU(cu_k_copy2d(x->st[stream], dst, dpitch, src, spitch, width, rows));
	return 0;
}

static int cu_zero(Backend *b, unsigned stream, void *dst, size_t bytes, RtErr *e)
{
	CuBackend *x = b->impl;
	if (bytes && in_host_arena(x, dst)) { /* offload: a metric's host copy */
		if (bytes > x->host_zeros_bytes)
			return RT_FAIL(e, "internal error: zeroing %zu bytes of the host arena (%zu "
				       "of zeros)", bytes, x->host_zeros_bytes);
		CU(cudaMemcpyAsync(dst, x->host_zeros, bytes, cudaMemcpyHostToHost, x->st[stream]));
		return 0;
	}
	if (bytes)
		CU(cudaMemsetAsync(dst, 0, bytes, x->st[stream]));
	return 0;
}

/* Host copies go through the compute stream's pinned bounce buffer, after
 * everything issued, in chunks, each waited for by polling: no synchronous
 * copy races the non-blocking streams, no blocking wait escapes the
 * watchdog, and no copy touches pageable memory. */
static int cu_read(Backend *b, const void *src, void *host, size_t bytes, RtErr *e)
{
	CuBackend *x = b->impl;
	unsigned char *bb = x->bounce[DP_STREAM_COMPUTE];
	RT_CHECK(cu_sync(b, "reading a tensor", e));
	if (in_host_arena(x, src)) { /* offload: host memory, nothing in flight */
		memcpy(host, src, bytes);
		return 0;
	}
	for (size_t at = 0; at < bytes; at += CU_BOUNCE_BYTES) {
		size_t n = bytes - at < CU_BOUNCE_BYTES ? bytes - at : CU_BOUNCE_BYTES;
		CU(cudaMemcpyAsync(bb, (const unsigned char *)src + at, n, cudaMemcpyDeviceToHost,
				   x->st[DP_STREAM_COMPUTE]));
		RT_CHECK(cu_sync(b, "reading a tensor", e));
		memcpy((unsigned char *)host + at, bb, n);
	}
	return 0;
}

static int cu_write(Backend *b, void *dst, const void *host, size_t bytes, RtErr *e)
{
	CuBackend *x = b->impl;
	unsigned char *bb = x->bounce[DP_STREAM_COMPUTE];
	RT_CHECK(cu_sync(b, "writing a tensor", e)); /* the bounce buffer is free */
	if (in_host_arena(x, dst)) { /* offload: host memory, nothing in flight */
		memcpy(dst, host, bytes);
		return 0;
	}
	for (size_t at = 0; at < bytes; at += CU_BOUNCE_BYTES) {
		size_t n = bytes - at < CU_BOUNCE_BYTES ? bytes - at : CU_BOUNCE_BYTES;
		memcpy(bb, (const unsigned char *)host + at, n);
		CU(cudaMemcpyAsync((unsigned char *)dst + at, bb, n, cudaMemcpyHostToDevice,
				   x->st[DP_STREAM_COMPUTE]));
		RT_CHECK(cu_sync(b, "writing a tensor", e));
	}
	return 0;
}

/* Pinned, and a staging region (its device copies come with the first push). */
static void *cu_host_alloc(Backend *b, size_t bytes)
{
	CuBackend *x = b->impl;
	void *p = NULL;
	if (x->nreg == x->capreg) {
		int cap = x->capreg ? 2 * x->capreg : 8;
		Region *r = realloc(x->reg, (size_t)cap * sizeof *r);
		if (!r)
			return NULL;
		x->reg = r;
		x->capreg = cap;
	}
	if (cudaMallocHost(&p, bytes) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	x->reg[x->nreg++] = (Region){.host = p, .bytes = bytes};
	return p;
}

static void cu_host_free(Backend *b, void *p)
{
	CuBackend *x = b->impl;
	Region *r = region_of(x, p);
	if (!r) {
		cudaFreeHost(p);
		return;
	}
	/* the backend's teardown frees the region with its device copies */
}

/* ---- staged batches ---- */

static int cu_stage_wait(Backend *b, const void *host, RtErr *e)
{
	CuBackend *x = b->impl;
	Region *r = region_of(x, host);
	if (!r || !r->copied)
		return 0;
	return wait_event(b, r->copied, "staging a batch", -1, e);
}

static int cu_stage_push(Backend *b, const void *host, size_t bytes, uint64_t k, RtErr *e)
{
	CuBackend *x = b->impl;
	Region *r = region_of(x, host);
	int par = (int)(k & 1);
	if (!r || (const unsigned char *)host != r->host || bytes > r->bytes)
		return RT_FAIL(e, "internal error: stage_push of memory host_alloc did not give");
	if (!r->dev[0]) { /* the first push: before any capture (the first step is eager) */
		CU(cudaMalloc(&r->dev[0], r->bytes ? r->bytes : 1));
		CU(cudaMalloc(&r->dev[1], r->bytes ? r->bytes : 1));
		CU(cudaEventCreateWithFlags(&r->copied, cudaEventDisableTiming));
	}
	/* device copy k % 2 was read by step k-2 */
	if (!MUTANT(copy_wait))
		CU(cudaStreamWaitEvent(x->copy_st, x->step_done[par], 0));
	if (bytes)
		CU(cudaMemcpyAsync(r->dev[par], r->host, bytes, cudaMemcpyHostToDevice, x->copy_st));
	CU(cudaEventRecord(r->copied, x->copy_st));
	CU(cudaEventRecord(x->pushed[par], x->copy_st));
	r->pushed = 1;
	return 0;
}

/* ---- optimizer steps ---- */

static int cu_set_step(Backend *b, uint64_t k, double lr, RtErr *e)
{
	CuBackend *x = b->impl;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	if (x->aborted)
		return RT_FAIL(e, "the CUDA backend was aborted");
	if (!x->counter_known || k != x->next_step) { /* resume, or a jump: in stream order */
		CU(cu_k_set_step(cs, x->sc, k));
		if (x->hk) {
			x->host_jump[k & 1].k = k;
			CU(cudaLaunchHostFunc(cs, host_set_k, &x->host_jump[k & 1]));
		}
	}
	/* the step's batches are on the device before it starts (outside any capture) */
	CU(cudaStreamWaitEvent(cs, x->pushed[k & 1], 0));
	if (b->amp_set) { /* loss scaling's state: the first step, a resume */
		CU(cu_k_set_amp(cs, x->sc, b->amp));
		b->amp_set = 0;
	}
	x->next_step = k + 1;
	x->counter_known = 1;
	x->cur_step = k;
	x->want_lr[k & 1] = (float)lr;
	return 0;
}

static int cu_step_head(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	const DpStep *s = b->s;
	x->in_step = 1;
	x->kind = 0;
	x->tab[0].n = 0;
	CU(cu_k_sched(x->st[DP_STREAM_COMPUTE], x->sc, s->opt, s->sched, s->cfg.steps));
	return 0;
}

/* The report (metrics, lr, t, errors) into slot step % 2, then the counter;
 * an eager step also records its completion event here. */
static int cu_step_tail(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	const DpStep *s = b->s;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	const float *loss = s->metrics.loss >= 0 ? b->ptr[s->metrics.loss] : NULL;
	const float *gn = s->metrics.grad_norm >= 0 ? b->ptr[s->metrics.grad_norm] : NULL;
	x->in_step = 0;
	if (s->opt.loss_scale != DP_LS_NONE)
		CU(cu_k_amp_update(cs, x->sc, s->opt));
	CU(cu_k_report(cs, x->sc, x->rep_dev, 1, loss, gn));
	CU(cu_k_step_advance(cs, x->sc));
	if (x->hk)
		CU(cudaLaunchHostFunc(cs, host_advance, x));
	if (!x->capturing)
		CU(cudaEventRecord(x->step_done[x->cur_step & 1], cs));
	return 0;
}

/* Step k's results from its report; the device's lr and t against the
 * host's schedule (device cos/pow may differ from glibc's in the last bit
 * of a double; t is k + 1 less the steps loss scaling skipped before k). */
static int cu_step_wait(Backend *b, uint64_t k, BackendReport *rp, RtErr *e)
{
	CuBackend *x = b->impl;
	char what[64];
	snprintf(what, sizeof what, "step %llu", (unsigned long long)k + 1);
	if (wait_event(b, x->step_done[k & 1], what, (int64_t)k, e)) {
		x->counter_known = 0;
		return -1;
	}
	RT_CHECK(host_error(x, e));
	const CuReport *r = &x->rep[k & 1];
	if (r->step != (int64_t)k)
		return RT_FAIL(e, "step %llu: the device reported step %lld (lost track of the "
			       "steps in flight)", (unsigned long long)k + 1, (long long)r->step + 1);
	RT_CHECK(report_error(r, e));
	double want = x->want_lr[k & 1];
	int64_t t = (int64_t)k + 1 - (int64_t)(r->amp.skipped - (r->ls_found != 0));
	if (r->t != t || !(fabs((double)r->lr - want) <= 1e-6 * fabs(want) + 1e-12))
		return RT_FAIL(e, "step %llu: the device schedule says lr %.9g t %lld, the host "
			       "lr %.9g t %lld", (unsigned long long)k + 1, r->lr, (long long)r->t,
			       want, (long long)t);
	*rp = (BackendReport){r->loss, r->grad_norm, r->ls_ran, r->ls_found != 0, r->amp};
	return 0;
}

/* ---- streams ---- */

static int cu_run_begin(Backend *b, DpProgram p, RtErr *e)
{
	CuBackend *x = b->impl;
	x->kind = x->in_step ? 0 : 1;
	if (x->kind == 1) {
		x->tab[1].n = 0;
		reset_marks(x, 1);
	}
	CU(cudaEventRecord(x->fork, x->st[DP_STREAM_COMPUTE]));
	for (int k = 0; k < DP_NSTREAM; k++)
		if (k != DP_STREAM_COMPUTE)
			CU(cudaStreamWaitEvent(x->st[k], x->fork, 0));
	return 0;
}

static int cu_run_end(Backend *b, RtErr *e)
{
	return join_comm(b->impl, e);
}

static int cu_event_record(Backend *b, unsigned stream, unsigned event, RtErr *e)
{
	CuBackend *x = b->impl;
	if (!MUTANT(event_record))
		CU(cudaEventRecord(x->ev[event], x->st[stream]));
	return 0;
}

/* The stream program p records event ev on (the schedule records each
 * event once per program), or -1. */
static int record_stream(const DpStep *s, int p, unsigned ev)
{
	for (uint32_t i = 0; i < s->nprog[p]; i++)
		if (s->prog[p][i].op == DP_OP_EVENT_RECORD && DP_EVENT(&s->prog[p][i]) == (int64_t)ev)
			return s->prog[p][i].stream;
	return -1;
}

#ifdef DPEMU_MUTANTS
/* Is event ev recorded, in program p, right after a pipeline recv (on the
 * p2p stream: the recv's done event, which its consumer waits for)? The
 * recv_wait mutant's target. */
static int recorded_after_recv(const DpStep *s, int p, unsigned ev)
{
	for (uint32_t i = 1; i < s->nprog[p]; i++)
		if (s->prog[p][i].op == DP_OP_EVENT_RECORD && DP_EVENT(&s->prog[p][i]) == (int64_t)ev)
			return s->prog[p][i - 1].op == DP_OP_RECV;
	return 0;
}

/* The event of the copy-stream wait before instruction `at` of program p
 * that waits for a compute-stream record (an offloaded unit's update),
 * or -1: the h2d_unit mutant's wrong event, the unit before's. */
static int64_t copy_wait_before(const DpStep *s, int p, uint32_t at)
{
	for (uint32_t i = at; i-- > 0;) {
		const DpInstr *in = &s->prog[p][i];
		if (in->op == DP_OP_EVENT_WAIT && in->stream == DP_STREAM_COPY &&
		    record_stream(s, p, (unsigned)DP_EVENT(in)) == DP_STREAM_COMPUTE)
			return DP_EVENT(in);
	}
	return -1;
}
#endif

static int cu_event_wait(Backend *b, unsigned stream, unsigned event, RtErr *e)
{
	CuBackend *x = b->impl;
	/* the mutant makes an updated unit's H2D (offload, on the copy stream)
	 * wait for the unit before's host update, not its own: the copy may
	 * read the host copy before its own update wrote it */
#ifdef DPEMU_MUTANTS
	if (MUTANT(h2d_unit) && stream == DP_STREAM_COPY &&
	    record_stream(b->s, b->at.prog, event) == DP_STREAM_COMPUTE) {
		int64_t before = copy_wait_before(b->s, b->at.prog, b->at.instr);
		if (before < 0)
			return 0;
		event = (unsigned)before;
	}
#endif
	/* the mutant drops the comm stream's wait for an H2D of a shard on the
	 * copy stream (offload): its all_gather may read the shard before the
	 * copy lands */
	if (MUTANT(h2d_wait) && stream == DP_STREAM_COMM &&
	    record_stream(b->s, b->at.prog, event) == DP_STREAM_COPY)
		return 0;
	/* the mutant drops the copy stream's wait for a comm-stream event (a
	 * gradient's D2H waits there for its reduce_scatter or all_reduce,
	 * offload): the copy may read the shard before the collective wrote it */
	if (MUTANT(d2h_wait) && stream == DP_STREAM_COPY &&
	    record_stream(b->s, b->at.prog, event) == DP_STREAM_COMM)
		return 0;
	if (MUTANT(p2p_wait) && b->at.instr + 1 < b->s->nprog[b->at.prog] &&
	    b->s->prog[b->at.prog][b->at.instr + 1].op == DP_OP_SEND)
		return 0; /* (the wait right before a pipeline send) */
	/* the mutant drops the compute stream's wait for a pipeline recv's
	 * done event (recorded on the p2p stream): the recv's consumer reads
	 * the buffer before the transfer has filled it */
#ifdef DPEMU_MUTANTS
	if (MUTANT(recv_wait) && stream == DP_STREAM_COMPUTE &&
	    recorded_after_recv(b->s, b->at.prog, event))
		return 0;
#endif
	if (!MUTANT(event_wait))
		CU(cudaStreamWaitEvent(x->st[stream], x->ev[event], 0));
	return 0;
}

/* An NCCL call on a non-blocking communicator; ncclInProgress is settled
 * before anything else is issued on it. */
static int nccl_call(CuBackend *x, ncclResult_t r, ncclComm_t c, const char *what, RtErr *e)
{
	if (r == ncclInProgress)
		return cu_nccl_settle(c, what, settle_deadline(x), e);
	return r == ncclSuccess ? 0 : cu_nccl_fail(r, what, e, __FILE__, __LINE__);
}

/* The watchdog's progress mark of the collective at `at`, after it on its
 * stream. */
static int mark_after(Backend *b, const BackendAt *at, unsigned stream, RtErr *e)
{
	CuBackend *x = b->impl;
	int64_t seq = -1;
	if (x->o.timeout_s <= 0)
		return 0;
	RT_CHECK(add_mark(x, x->kind, (int)stream, at, &seq, e));
	CU(cu_k_mark(x->st[stream], x->marks_dev + x->kind * DP_NSTREAM + stream, seq,
		     x->kind == 0 ? x->sc : NULL));
	return 0;
}

/* Does this rank run instruction `nx` of the program being walked? The
 * executor skips the other pipeline stages' instructions (exec.c's walk). */
static int runs_here(const Backend *b, const DpInstr *nx)
{
	return !nx->stage1 || dp_instr_stage(nx) == b->comm->coord[DP_AXIS_PP];
}

/* NCCL's type of a tensor's dtype (the decoder allows f32, bf16, f16) */
static ncclDataType_t cu_nccl_dtype(unsigned dt)
{
	return dt == DP_BF16 ? ncclBfloat16 : dt == DP_F16 ? ncclHalf : ncclFloat32;
}

/* Is a pipeline transfer like `in` (same stream and axes) the next
 * instruction this rank runs after b->at? Any other instruction ends the
 * group, and so does one of the DP_IF_LAST tail (whether the walk runs it is
 * the executor's to say; ending a group early is always correct). */
static int p2p_continues(const Backend *b, const DpInstr *in)
{
	const DpStep *s = b->s;
	for (uint32_t i = b->at.instr + 1; i < s->nprog[b->at.prog]; i++) {
		const DpInstr *nx = &s->prog[b->at.prog][i];
		if (!runs_here(b, nx))
			continue;
		return (nx->op == DP_OP_SEND || nx->op == DP_OP_RECV) && !(nx->flags & DP_IF_LAST) &&
		       nx->stream == in->stream && DP_AXES(nx) == DP_AXES(in);
	}
	return 0;
}

/* A pipeline transfer (pp > 1): ncclSend or ncclRecv to the peer stage on
 * the stream's pp communicator, whose group ranks are the pp coordinates
 * (comm_nccl.c's split). A run of transfers this rank issues back to back
 * on one stream is one ncclGroupStart/ncclGroupEnd (NCCL runs a group's
 * sends and receives together, and a graph captures it as one launch); the
 * watchdog's marks follow the group's end, where its work is on the
 * stream. Each pair of stages posts its transfers in the one order the
 * compiler proved deadlock-free (ir/verify.c). */
static int cu_p2p(Backend *b, const DpInstr *in, RtErr *e)
{
	CuBackend *x = b->impl;
	const DpStep *s = b->s;
	cudaStream_t st = x->st[in->stream];
	unsigned mask = (unsigned)DP_AXES(in);
	ncclComm_t c = cu_nccl_comm(x->nccl, in->stream, mask);
	int send = in->op == DP_OP_SEND;
	int t = send ? in->in[0] : in->out;
	size_t n = (size_t)dp_numel(&s->tensors[t]);
	ncclDataType_t dt = cu_nccl_dtype(s->tensors[t].dtype);
	int peer = (int)DP_PEER(in);
	if (!c) /* the decoder put the peer on another stage: a group of one cannot be */
		return RT_FAIL(e, "no NCCL communicator for the pipeline's %s of '%s' (axis mask %u)",
			       dp_op_names[in->op], tname(s, t), mask);
	if (!x->p2p_open) {
		CU_NCCL(ncclGroupStart(), e);
		x->p2p_open = 1;
		x->p2p_first = b->at.instr;
	}
	ncclResult_t r = send ? ncclSend(b->ptr[t], n, dt, peer, c, st)
			      : ncclRecv(b->ptr[t], n, dt, peer, c, st);
	if (r != ncclSuccess) {
		x->p2p_open = 0;
		ncclGroupEnd(); /* closed; the error is the call's */
		return cu_nccl_fail(r, send ? "ncclSend" : "ncclRecv", e, __FILE__, __LINE__);
	}
	if (p2p_continues(b, in))
		return 0;
	x->p2p_open = 0;
	RT_CHECK(nccl_call(x, ncclGroupEnd(), c, "ncclGroupEnd (pipeline transfers)", e));
	for (uint32_t i = x->p2p_first; i <= b->at.instr; i++) {
		const DpInstr *g = &s->prog[b->at.prog][i];
		if ((g->op == DP_OP_SEND || g->op == DP_OP_RECV) && runs_here(b, g))
			RT_CHECK(mark_after(b, &(BackendAt){b->at.prog, i, b->at.micro}, in->stream, e));
	}
	return 0;
}

static int cu_collective(Backend *b, const DpInstr *in, RtErr *e)
{
#ifdef DPEMU_MUTANTS
	static const DpInstr *held; /* reorder: rank 1's first collective, held */
	static int reordered;
	if (MUTANT(reorder) && b->comm->rank == 1 && !reordered) {
		if (!held) {
			held = in;
			return 0;
		}
		reordered = 1; /* the second, then the first */
		if (cu_collective(b, in, e))
			return -1;
		return cu_collective(b, held, e);
	}
#endif
	CuBackend *x = b->impl;
	const DpStep *s = b->s;
	if (in->op == DP_OP_SEND || in->op == DP_OP_RECV)
		return cu_p2p(b, in, e);
	cudaStream_t st = x->st[in->stream];
	unsigned mask = (unsigned)DP_AXES(in);
	uint64_t stages = in->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(in, ALL_REDUCE, stages) : 0;
	/* a sub-group of pp stages (a tied parameter's gradient): its own
	 * communicator, which this rank, one of its stages, must have */
	if (stages && MUTANT(subgroup_skipped))
		return 0;
	ncclComm_t c = stages ? cu_nccl_group_comm(x->nccl, mask, stages)
			      : cu_nccl_comm(x->nccl, in->stream, mask);
	if (stages && !c)
		return RT_FAIL(e, "no NCCL communicator for the all_reduce of '%s' over pipeline "
			       "stages 0x%llx (axis mask %u)", tname(s, in->out),
			       (unsigned long long)stages, mask);
	void *out = b->ptr[in->out];
	const void *src = in->in[0] >= 0 ? b->ptr[in->in[0]] : out;
	size_t n = (size_t)dp_numel(&s->tensors[in->out]);
	/* bf16 and f16 move and sum as ncclBfloat16 and ncclHalf (NCCL adds in
	 * f32 and rounds) */
	ncclDataType_t dt = cu_nccl_dtype(s->tensors[in->out].dtype);
	if (!c) { /* a group of one: all_reduce is nothing, the others a copy */
		if (in->op != DP_OP_ALL_REDUCE && src != out && n)
			CU(cudaMemcpyAsync(out, src, n * dp_dtype_size(s->tensors[in->out].dtype),
					   cudaMemcpyDeviceToDevice, st));
		return 0;
	}
	switch (in->op) {
	case DP_OP_ALL_REDUCE:
	case DP_OP_TP_REDUCE: /* out of place when src != out */
		RT_CHECK(nccl_call(x, ncclAllReduce(src, out, n, dt, ncclSum, c, st), c,
				   "ncclAllReduce", e));
		break;
	case DP_OP_REDUCE_SCATTER:
		RT_CHECK(nccl_call(x, ncclReduceScatter(src, out, n, dt, ncclSum, c, st), c,
				   "ncclReduceScatter", e));
		break;
	default:
		RT_CHECK(nccl_call(x, ncclAllGather(src, out, (size_t)dp_numel(&s->tensors[in->in[0]]),
						    dt, c, st), c, "ncclAllGather", e));
		break;
	}
	return mark_after(b, &b->at, in->stream, e);
}

/* ---- the step graph ---- */

static int cu_capture_begin(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	/* a graph captured before (compression's other path, runtime/exec.c):
	 * nothing of it runs now (the executor waited for its steps) */
	if (x->gexec) {
		CU(cudaGraphExecDestroy(x->gexec));
		x->gexec = NULL;
	}
	if (x->graph) {
		CU(cudaGraphDestroy(x->graph));
		x->graph = NULL;
	}
	CU(cudaStreamBeginCapture(x->st[DP_STREAM_COMPUTE], cudaStreamCaptureModeThreadLocal));
	x->capturing = 1;
	return 0;
}

static int cu_capture_end(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	cudaGraph_t g = NULL;
	cudaError_t end = cudaStreamEndCapture(cs, &g);
	x->capturing = 0;
	x->in_step = 0;
	if (end != cudaSuccess) {
		if (g)
			cudaGraphDestroy(g);
		CU(end);
	}
	x->graph = g;
	CU(cudaGraphInstantiate(&x->gexec, g, cudaGraphInstantiateFlagUseNodePriority));
	CU(cudaGraphUpload(x->gexec, cs));
	return cu_sync(b, "uploading the step graph", e);
}

static int cu_replay(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	CU(cudaGraphLaunch(x->gexec, cs));
	CU(cudaEventRecord(x->step_done[x->cur_step & 1], cs));
	x->kind = 0; /* the watchdog reads the step's marks */
	return 0;
}

/* ---- device timing (dpexec --trace, runtime/trace.c) ---- */

/* Timing mark `slot` on `stream`: a timing event recorded in stream order.
 * Eager runs only (the trace implies --no-graph). The events are made on
 * first use, a slot's event reused by every later run, and destroyed in
 * cu_free before the streams. */
static int cu_time_mark(Backend *b, unsigned stream, uint32_t slot, RtErr *e)
{
	CuBackend *x = b->impl;
	if (x->capturing || stream >= DP_NSTREAM)
		return RT_FAIL(e, "internal error: a timing mark inside a capture or on stream %u",
			       stream);
	if (slot >= x->ntev) {
		uint32_t cap = slot < 128 ? 256 : 2 * slot;
		cudaEvent_t *p = realloc(x->tev, cap * sizeof *p);
		if (!p)
			return RT_FAIL(e, "out of memory (--trace's timing events)");
		x->tev = p;
		while (x->ntev < cap) { /* ntev counts the events made: cu_free destroys those */
			CU(cudaEventCreate(&x->tev[x->ntev]));
			x->ntev++;
		}
	}
	CU(cudaEventRecord(x->tev[slot], x->st[stream]));
	return 0;
}

/* Marks 0..n-1 completed (each waited for under the watchdog), then each
 * one's device time from mark 0 in ms. */
static int cu_time_read(Backend *b, uint32_t n, float *ms, RtErr *e)
{
	CuBackend *x = b->impl;
	if (n > x->ntev)
		return RT_FAIL(e, "internal error: %u timing marks read, %u made", n, x->ntev);
	for (uint32_t i = 0; i < n; i++) {
		RT_CHECK(wait_event(b, x->tev[i], "the trace's timing marks", -1, e));
		if (i == 0)
			ms[i] = 0;
		else
			CU(cudaEventElapsedTime(&ms[i], x->tev[0], x->tev[i]));
	}
	return 0;
}

/* What libdpcuda.so exports; dpexec finds it with dlsym (backend.c). */
__attribute__((visibility("default"))) const BackendOps dp_cuda_backend = {
	.name = "cuda",
	.abi = DP_BACKEND_ABI,
	.flags = 0,        /* streams: work runs after the call returns */
	.fallback = "cpu", /* a kernel missing here: the CPU has every one */
	.probe = cu_probe,
	.has_kernel = cu_has_kernel,
	.check = cu_check,
	.init = cu_init,
	.describe = cu_describe,
	.abort = cu_abort,
	.free = cu_free,
	.kernel = cu_kernel,
	.upload = cu_upload,
	.copy2d = cu_copy2d,
	.zero = cu_zero,
	.read = cu_read,
	.write = cu_write,
	.host_alloc = cu_host_alloc,
	.host_free = cu_host_free,
	.stage_wait = cu_stage_wait,
	.stage_push = cu_stage_push,
	.step_wait = cu_step_wait,
	.set_step = cu_set_step,
	.step_head = cu_step_head,
	.step_tail = cu_step_tail,
	.run_begin = cu_run_begin,
	.run_end = cu_run_end,
	.event_record = cu_event_record,
	.event_wait = cu_event_wait,
	.collective = cu_collective,
	.sync = cu_sync,
	.capture_begin = cu_capture_begin,
	.capture_end = cu_capture_end,
	.replay = cu_replay,
	.time_mark = cu_time_mark,
	.time_read = cu_time_read,
};
