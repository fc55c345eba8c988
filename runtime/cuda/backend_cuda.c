/*
 * backend_cuda.c - the CUDA compute backend: the BackendOps `dp_cuda_backend`
 * that libdpcuda.so exports (backend.h; dpexec loads it with dlopen). Device
 * choice, one cudaMalloc'd arena, two streams with events, NCCL collectives,
 * the step graph, the polling wait with its watchdog, and teardown. The
 * kernels and their table are kernels.cu; the communicators comm_nccl.c.
 *
 * The model (the executor's walk in exec.c drives it):
 *  - one arena per rank, every tensor a pointer at its offset (Backend.ptr);
 *  - two streams (compute, comm), non-blocking; EVENT_RECORD/EVENT_WAIT are
 *    cudaEventRecord/cudaStreamWaitEvent on the instruction's stream, so the
 *    cross-stream order is exactly the schedule's. Each program run forks the
 *    comm stream off the compute stream (run_begin) and joins it back
 *    (run_end): a run sees everything before it, and everything after it
 *    sees the whole run, on both streams;
 *  - kernels: the op's row of cu_kernel_table, with a cuBLAS handle
 *    (workspace set once, CUBLAS_DEFAULT_MATH: no TF32) on each stream that
 *    has a GEMM, and a reduction scratch buffer per stream;
 *  - collectives: NCCL on the instruction's stream, one communicator per
 *    (stream, axis mask) the step uses (two streams never share one: NCCL
 *    serialises a communicator's operations);
 *  - the executor captures one optimizer step (schedule kernel, zeroed
 *    metrics, grad_accum runs of STEP, the step-counter increment) into one
 *    CUDA Graph (capture_begin/capture_end), instantiated once and replayed
 *    with one cudaGraphLaunch per step. lr and the step counter live in
 *    device memory (CuScalars), so the graph bakes in no host value that
 *    changes between steps; --no-graph enqueues the same sequence eagerly;
 *  - LOAD uploads the executor's staged batch from pinned host memory
 *    (host_alloc); the captured copy reads the buffer the executor refreshes
 *    before each launch. read/write (INIT, SAVE, metrics) are copies on the
 *    compute stream after everything issued, waited for by polling.
 *
 * Operand rules (presence, dtypes, element counts) are the step-file
 * decoder's: this backend relies on them and checks only its own limits at
 * load (no bf16 yet; the rows' limits).
 *
 * Faults: every wait polls (cudaEventQuery, never a blocking sync) and
 * checks NCCL's async errors; with timeout_s > 0 a wait that exceeds it
 * destroys the graph, aborts every NCCL communicator and fails naming the
 * pending collective, known from progress marks each stream writes to
 * mapped host memory after every collective. Teardown and abort destroy the
 * graph exec and the graph first (NCCL waits for graphs that captured its
 * communicators), then the communicators, then memory.
 *
 * Plain C compiled by gcc with -Wall -Wextra: the CUDA runtime, cuBLAS and
 * NCCL C APIs only. Nothing here has run on a GPU yet: see docs/CUDA.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "../backend.h"
#include "kernels.h"
#include "nccl_int.h"

#define CU_WORKSPACE_BYTES (32u << 20) /* cuBLAS workspace per handle (Hopper's advice) */

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
			return RT_FAIL(e, "%s: %s", #call, cublasGetStatusString(st_));     \
	} while (0)

/* Where a collective is, for the watchdog's message. */
typedef struct {
	int stream;
	int prog;
	uint32_t instr;
	int micro;
} Mark;

/* Marks of one kind of run: 0 = the optimizer step, 1 = any other run. */
typedef struct {
	Mark *v;
	int n, cap;
} MarkTable;

typedef struct {
	BackendOpts o;
	int device;
	CuNccl *nccl;
	unsigned char *arena;
	cudaStream_t st[DP_NSTREAM];
	cublasHandle_t blas[DP_NSTREAM]; /* NULL on a stream without GEMMs */
	void *blas_ws[DP_NSTREAM];
	double *scratch[DP_NSTREAM];     /* per stream: reductions never share */
	cudaEvent_t *ev;                 /* [nevents] */
	cudaEvent_t fork, join, done;
	CuScalars *sc;                   /* device */
	cudaGraph_t graph;
	cudaGraphExec_t gexec;
	int capturing;
	int in_step;                     /* between step_head and step_tail */
	int kind;                        /* mark table of the latest run */
	uint64_t next_step;              /* what the device counter holds */
	int counter_known;
	int check_step;                  /* a step ran: after the next wait, device schedule vs host */
	uint64_t want_step;
	float want_lr;
	/* watchdog: marks[k][stream] = last finished collective of run kind k */
	volatile int64_t *marks;         /* mapped pinned host memory, [2][DP_NSTREAM] */
	int64_t *marks_dev;
	MarkTable tab[2];
	int aborted;
} CuBackend;

static const char *tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

static int64_t numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}

/* ---- before init ---- */

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
	} else if (drv == 0) {
		snprintf(why, len, "no CUDA driver is installed (libcuda.so.1 not found; "
			 "cudaGetDeviceCount: %s)", cudaGetErrorString(err));
	} else if (drv < rtv) {
		snprintf(why, len, "the CUDA driver (%d.%d) is older than the CUDA runtime this "
			 "backend was built with (%d.%d): %s", drv / 1000, drv % 1000 / 10,
			 rtv / 1000, rtv % 1000 / 10, cudaGetErrorString(err));
	} else {
		snprintf(why, len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
			 cudaGetErrorName(err));
	}
	return 0;
}

static int cu_has_kernel(unsigned op)
{
	return op < DPK_COUNT && cu_kernel_table.k[op].run != NULL;
}

/* Own limits only: the decoder guarantees the operands (see the top). */
static int cu_check(const DpStep *s, const DpInstr *in, RtErr *e)
{
	for (int k = -1; k < DP_MAX_IN; k++) {
		int id = k < 0 ? in->out : in->in[k];
		if (id >= 0 && s->tensors[id].dtype == DP_BF16)
			return RT_FAIL(e, "step file: %s of '%s': bf16 is not implemented in the CUDA "
				       "backend yet", dp_kernel_names[in->op], tname(s, id));
	}
	const CuKernel *k = &cu_kernel_table.k[in->op];
	return k->limits ? k->limits(s, in, e) : 0;
}

/* ---- waiting, with the watchdog ---- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Graphs first (NCCL waits for every graph that captured a communicator),
 * then the communicators. Idempotent. */
static void abort_all(CuBackend *x)
{
	if (x->gexec)
		cudaGraphExecDestroy(x->gexec); /* an in-flight launch is freed on completion */
	if (x->graph)
		cudaGraphDestroy(x->graph);
	x->gexec = NULL;
	x->graph = NULL;
	cu_nccl_abort(x->nccl);
	x->aborted = 1;
}

/* The first collective of each stream that has not finished, by the marks. */
static void pending_text(Backend *b, int kind, char *buf, size_t len)
{
	CuBackend *x = b->impl;
	const MarkTable *t = &x->tab[kind];
	size_t used = 0;
	buf[0] = 0;
	for (int st = 0; st < DP_NSTREAM; st++) {
		int64_t last = x->marks[kind * DP_NSTREAM + st];
		for (int i = (int)(last + 1); i < t->n; i++) {
			const Mark *m = &t->v[i];
			if (m->stream != st)
				continue;
			const DpInstr *in = &b->s->prog[m->prog][m->instr];
			used += (size_t)snprintf(buf + used, used < len ? len - used : 0,
						 "%s%s of '%s' over axis mask %lld on the %s stream (%s "
						 "program instruction %u, micro-batch %d)",
						 used ? "; " : "", dp_kernel_names[in->op],
						 tname(b->s, in->out), (long long)in->ia[0],
						 dp_stream_names[st], dp_prog_names[m->prog], m->instr, m->micro);
			break;
		}
	}
	if (!buf[0])
		snprintf(buf, len, "no collective outstanding (compute is what did not finish)");
}

/* Poll `ev` (recorded after the work) until it completes. */
static int wait_event(Backend *b, cudaEvent_t ev, const char *what, RtErr *e)
{
	CuBackend *x = b->impl;
	double t0 = now_s(), last_check = t0;
	for (long spins = 0;; spins++) {
		cudaError_t q = cudaEventQuery(ev);
		if (q == cudaSuccess)
			break;
		if (q != cudaErrorNotReady)
			return RT_FAIL(e, "%s: %s (%s)", what, cudaGetErrorString(q), cudaGetErrorName(q));
		double t = now_s();
		if (t - last_check > 1e-3) { /* NCCL's own errors: a peer died, a timeout */
			last_check = t;
			if (cu_nccl_async_error(x->nccl, e)) {
				abort_all(x);
				return -1;
			}
		}
		if (x->o.timeout_s > 0 && t - t0 > x->o.timeout_s) {
			char pend[512];
			pending_text(b, x->kind, pend, sizeof pend);
			abort_all(x);
			return RT_FAIL(e, "%s did not finish within --timeout %.3g s; pending: %s; "
				       "aborted every NCCL communicator", what, x->o.timeout_s, pend);
		}
		if (spins > 1000) { /* spin briefly, then let the core go */
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

/* The compute stream waits for everything issued on the comm stream. */
static int join_comm(CuBackend *x, RtErr *e)
{
	CU(cudaEventRecord(x->join, x->st[DP_STREAM_COMM]));
	CU(cudaStreamWaitEvent(x->st[DP_STREAM_COMPUTE], x->join, 0));
	return 0;
}

/* What the kernels report back: a label out of range; after a step, the
 * device's lr and t against the host's schedule (device cos/pow may differ
 * from glibc's in the last ulp of a double). */
static int check_scalars(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	CuScalars sc;
	CU(cudaMemcpy(&sc, x->sc, sizeof sc, cudaMemcpyDeviceToHost));
	if (sc.err)
		return RT_FAIL(e, "label %d of row %lld is out of range for %lld classes",
			       sc.err_label, (long long)sc.err_row, (long long)sc.err_classes);
	if (x->check_step) {
		x->check_step = 0;
		double want = x->want_lr;
		if (sc.t != (int64_t)x->want_step + 1 ||
		    !(fabs((double)sc.lr - want) <= 1e-6 * fabs(want) + 1e-12))
			return RT_FAIL(e, "step %llu: the device schedule says lr %.9g t %lld, the host "
				       "lr %.9g t %llu", (unsigned long long)x->want_step + 1, sc.lr,
				       (long long)sc.t, want, (unsigned long long)x->want_step + 1);
	}
	return 0;
}

static int cu_sync(Backend *b, const char *what, RtErr *e)
{
	CuBackend *x = b->impl;
	if (x->aborted)
		return RT_FAIL(e, "%s: the CUDA backend was aborted", what);
	RT_CHECK(join_comm(x, e));
	CU(cudaEventRecord(x->done, x->st[DP_STREAM_COMPUTE]));
	if (wait_event(b, x->done, what, e)) {
		x->counter_known = 0;
		return -1;
	}
	return check_scalars(b, e);
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
	t->v[t->n] = (Mark){stream, at->prog, at->instr, at->micro};
	*seq = t->n++;
	return 0;
}

static void reset_marks(CuBackend *x, int kind)
{
	for (int st = 0; st < DP_NSTREAM; st++)
		x->marks[kind * DP_NSTREAM + st] = -1;
}

/* The device, the communicators, memory, streams, handles, events. On
 * failure cu_init frees the partial set-up. */
static int init_body(Backend *b, CuBackend *x, RtErr *e)
{
	const DpStep *s = b->s;
	int ndev = 0;
	CU(cudaGetDeviceCount(&ndev));
	if (ndev < 1)
		return RT_FAIL(e, "no CUDA device is visible");
	x->device = x->o.local_rank % ndev;
	CU(cudaSetDevice(x->device));

	/* what the kernel rows need, per stream; a communicator per collective */
	int gemm_on[DP_NSTREAM] = {0, 0};
	size_t scratch[DP_NSTREAM] = {CU_REDUCE_BLOCKS, CU_REDUCE_BLOCKS};
	uint32_t masks[DP_NSTREAM];
	cu_nccl_masks(s, masks);
	RT_CHECK(cu_nccl_init(&x->nccl, b->comm, masks, e));
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->stream >= DP_NSTREAM)
				return RT_FAIL(e, "step file: %s program instruction %u: bad stream %u",
					       dp_prog_names[p], i, in->stream);
			if (dp_is_collective(in->op) &&
			    cu_nccl_group_size(b->comm, (unsigned)in->ia[0]) > 1 &&
			    !cu_nccl_comm(x->nccl, in->stream, (unsigned)in->ia[0]))
				return RT_FAIL(e, "no NCCL communicator for axis mask %lld on the %s "
					       "stream", (long long)in->ia[0], dp_stream_names[in->stream]);
			if (dp_op_class(in->op) != DP_OPC_KERNEL)
				continue;
			const CuKernel *k = &cu_kernel_table.k[in->op];
			gemm_on[in->stream] |= k->blas;
			if (k->scratch && k->scratch(s, in) > scratch[in->stream])
				scratch[in->stream] = k->scratch(s, in);
		}

	size_t bytes = (size_t)((s->cfg.arena_bytes + 255) / 256 * 256);
	CU(cudaMalloc((void **)&x->arena, bytes ? bytes : 256));
	CU(cudaMemset(x->arena, 0, bytes ? bytes : 256));
	b->ptr = calloc(s->ntensors ? s->ntensors : 1, sizeof *b->ptr);
	x->ev = calloc(s->nevents ? s->nevents : 1, sizeof *x->ev);
	if (!b->ptr || !x->ev)
		return RT_FAIL(e, "out of memory (CUDA backend tables)");
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (s->tensors[i].nbytes)
			b->ptr[i] = x->arena + s->tensors[i].offset;

	for (int k = 0; k < DP_NSTREAM; k++) {
		CU(cudaStreamCreateWithFlags(&x->st[k], cudaStreamNonBlocking));
		CU(cudaMalloc((void **)&x->scratch[k], scratch[k] * sizeof(double)));
		if (!gemm_on[k])
			continue;
		BLAS(cublasCreate(&x->blas[k]));
		BLAS(cublasSetStream(x->blas[k], x->st[k]));
		/* fp32 GEMMs stay fp32: no TF32 (CPU agreement; docs/CUDA.md) */
		BLAS(cublasSetMathMode(x->blas[k], CUBLAS_DEFAULT_MATH));
		CU(cudaMalloc(&x->blas_ws[k], CU_WORKSPACE_BYTES));
		BLAS(cublasSetWorkspace(x->blas[k], x->blas_ws[k], CU_WORKSPACE_BYTES));
	}
	for (uint32_t i = 0; i < s->nevents; i++)
		CU(cudaEventCreateWithFlags(&x->ev[i], cudaEventDisableTiming));
	CU(cudaEventCreateWithFlags(&x->fork, cudaEventDisableTiming));
	CU(cudaEventCreateWithFlags(&x->join, cudaEventDisableTiming));
	CU(cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming));
	CU(cudaMalloc((void **)&x->sc, sizeof *x->sc));
	CU(cudaMemset(x->sc, 0, sizeof *x->sc));
	x->counter_known = 1; /* step 0 */
	CU(cudaHostAlloc((void **)&x->marks, 2 * DP_NSTREAM * sizeof(int64_t), cudaHostAllocMapped));
	CU(cudaHostGetDevicePointer((void **)&x->marks_dev, (void *)x->marks, 0));
	reset_marks(x, 0);
	reset_marks(x, 1);
	CU(cudaDeviceSynchronize()); /* start-up: the set-up above has finished */
	return 0;
}

static void cu_free(Backend *b)
{
	CuBackend *x = b->impl;
	if (!x)
		return;
	if (!x->aborted && x->done) { /* let issued work finish, under the watchdog */
		RtErr ignore = {.rank = -1};
		cu_sync(b, "teardown", &ignore);
	}
	/* graphs, then communicators, then memory */
	if (x->gexec)
		cudaGraphExecDestroy(x->gexec);
	if (x->graph)
		cudaGraphDestroy(x->graph);
	cu_nccl_free(x->nccl);
	for (uint32_t i = 0; x->ev && i < b->s->nevents; i++)
		if (x->ev[i])
			cudaEventDestroy(x->ev[i]);
	if (x->fork)
		cudaEventDestroy(x->fork);
	if (x->join)
		cudaEventDestroy(x->join);
	if (x->done)
		cudaEventDestroy(x->done);
	for (int k = 0; k < DP_NSTREAM; k++) {
		if (x->blas[k])
			cublasDestroy(x->blas[k]);
		if (x->blas_ws[k])
			cudaFree(x->blas_ws[k]);
		if (x->scratch[k])
			cudaFree(x->scratch[k]);
		if (x->st[k])
			cudaStreamDestroy(x->st[k]);
	}
	if (x->sc)
		cudaFree(x->sc);
	if (x->marks)
		cudaFreeHost((void *)x->marks);
	if (x->arena)
		cudaFree(x->arena);
	cudaGetLastError();
	for (int k = 0; k < 2; k++)
		free(x->tab[k].v);
	free(x->ev);
	free(b->ptr);
	free(x);
	b->ptr = NULL;
	b->impl = NULL;
}

static int cu_init(Backend *b, const BackendOpts *o, RtErr *e)
{
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

static void cu_describe(Backend *b, char *buf, size_t len)
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
		return;
	}
	snprintf(buf, len, "%s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d, runtime %d.%d, NCCL %d, %s",
		 p.name, p.major, p.minor, p.multiProcessorCount,
		 (double)p.totalGlobalMem / (1u << 30), drv / 1000, drv % 1000 / 10, rtv / 1000,
		 rtv % 1000 / 10, nv, x->o.no_graph ? "eager (--no-graph)" : "CUDA Graph");
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
	CuArgs a = {b->s, in, b->ptr, x->st[in->stream], x->blas[in->stream],
		    x->scratch[in->stream], x->sc};
	return cu_kernel_table.k[in->op].run(&a, e);
}

static int cu_upload(Backend *b, unsigned stream, void *dst, const void *host, size_t bytes,
		     RtErr *e)
{
	CuBackend *x = b->impl;
	if (bytes)
		CU(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, x->st[stream]));
	return 0;
}

static int cu_copy2d(Backend *b, unsigned stream, void *dst, size_t dpitch, const void *src,
		     size_t spitch, size_t width, size_t rows, RtErr *e)
{
	CuBackend *x = b->impl;
	if (!width || !rows || (dst == src && dpitch == spitch))
		return 0;
	if (rows == 1 || (dpitch == width && spitch == width))
		CU(cudaMemcpyAsync(dst, src, width * rows, cudaMemcpyDeviceToDevice, x->st[stream]));
	else
		CU(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
				     x->st[stream]));
	return 0;
}

static int cu_zero(Backend *b, unsigned stream, void *dst, size_t bytes, RtErr *e)
{
	CuBackend *x = b->impl;
	if (bytes)
		CU(cudaMemsetAsync(dst, 0, bytes, x->st[stream]));
	return 0;
}

/* Host copies go on the compute stream after everything issued, and are
 * waited for by polling: no synchronous copy races the non-blocking streams,
 * and no blocking wait escapes the watchdog. A read waits first (a copy
 * into pageable memory returns only when done, i.e. after the stream's
 * earlier work), a write after (the host buffer is then free again). */
static int cu_read(Backend *b, const void *src, void *host, size_t bytes, RtErr *e)
{
	CuBackend *x = b->impl;
	RT_CHECK(cu_sync(b, "reading a tensor", e));
	CU(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, x->st[DP_STREAM_COMPUTE]));
	return cu_sync(b, "reading a tensor", e);
}

static int cu_write(Backend *b, void *dst, const void *host, size_t bytes, RtErr *e)
{
	CuBackend *x = b->impl;
	RT_CHECK(join_comm(x, e));
	CU(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, x->st[DP_STREAM_COMPUTE]));
	return cu_sync(b, "writing a tensor", e);
}

static void *cu_host_alloc(Backend *b, size_t bytes)
{
	void *p = NULL;
	if (cudaMallocHost(&p, bytes) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	return p;
}

static void cu_host_free(Backend *b, void *p)
{
	cudaFreeHost(p);
}

/* ---- optimizer steps ---- */

static int cu_set_step(Backend *b, uint64_t k, double lr, RtErr *e)
{
	CuBackend *x = b->impl;
	if (x->aborted)
		return RT_FAIL(e, "the CUDA backend was aborted");
	if (!x->counter_known || k != x->next_step) { /* resume, or a jump */
		uint64_t step = k;
		CU(cudaMemcpyAsync(&x->sc->step, &step, sizeof step, cudaMemcpyHostToDevice,
				   x->st[DP_STREAM_COMPUTE]));
		RT_CHECK(cu_sync(b, "setting the step counter", e));
	}
	reset_marks(x, 0);
	x->next_step = k + 1;
	x->counter_known = 1;
	x->want_step = k;
	x->want_lr = (float)lr;
	return 0;
}

static int cu_step_head(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	const DpStep *s = b->s;
	x->in_step = 1;
	x->tab[0].n = 0;
	CU(cu_k_sched(x->st[DP_STREAM_COMPUTE], x->sc, s->opt, s->sched, s->cfg.steps));
	return 0;
}

static int cu_step_tail(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	x->in_step = 0;
	CU(cu_k_step_advance(x->st[DP_STREAM_COMPUTE], x->sc));
	x->check_step = !x->capturing; /* an eager step: check it after its wait */
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
	CU(cudaStreamWaitEvent(x->st[DP_STREAM_COMM], x->fork, 0));
	return 0;
}

static int cu_run_end(Backend *b, RtErr *e)
{
	return join_comm(b->impl, e);
}

static int cu_event_record(Backend *b, unsigned stream, unsigned event, RtErr *e)
{
	CuBackend *x = b->impl;
	CU(cudaEventRecord(x->ev[event], x->st[stream]));
	return 0;
}

static int cu_event_wait(Backend *b, unsigned stream, unsigned event, RtErr *e)
{
	CuBackend *x = b->impl;
	CU(cudaStreamWaitEvent(x->st[stream], x->ev[event], 0));
	return 0;
}

static int cu_collective(Backend *b, const DpInstr *in, RtErr *e)
{
	CuBackend *x = b->impl;
	const DpStep *s = b->s;
	cudaStream_t st = x->st[in->stream];
	unsigned mask = (unsigned)in->ia[0];
	ncclComm_t c = cu_nccl_comm(x->nccl, in->stream, mask);
	float *out = b->ptr[in->out];
	const float *src = in->in[0] >= 0 ? b->ptr[in->in[0]] : out;
	size_t n = (size_t)numel(&s->tensors[in->out]);
	if (!c) { /* a group of one: all_reduce is nothing, the others a copy */
		if (in->op != DPK_ALL_REDUCE && src != out && n)
			CU(cudaMemcpyAsync(out, src, n * 4, cudaMemcpyDeviceToDevice, st));
		return 0;
	}
	switch (in->op) {
	case DPK_ALL_REDUCE:
	case DPK_TP_REDUCE: /* out of place when src != out */
		CU_NCCL(ncclAllReduce(src, out, n, ncclFloat32, ncclSum, c, st), e);
		break;
	case DPK_REDUCE_SCATTER:
		CU_NCCL(ncclReduceScatter(src, out, n, ncclFloat32, ncclSum, c, st), e);
		break;
	default:
		CU_NCCL(ncclAllGather(src, out, (size_t)numel(&s->tensors[in->in[0]]), ncclFloat32,
				      c, st), e);
		break;
	}
	if (x->o.timeout_s > 0) { /* the watchdog's progress mark */
		int64_t seq = -1;
		RT_CHECK(add_mark(x, x->kind, in->stream, &b->at, &seq, e));
		CU(cu_k_mark(st, x->marks_dev + x->kind * DP_NSTREAM + in->stream, seq));
	}
	return 0;
}

/* ---- the step graph ---- */

static int cu_capture_begin(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
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
	if (end != cudaSuccess) {
		if (g)
			cudaGraphDestroy(g);
		CU(end);
	}
	x->graph = g;
	CU(cudaGraphInstantiate(&x->gexec, g, 0));
	CU(cudaGraphUpload(x->gexec, cs));
	return cu_sync(b, "uploading the step graph", e);
}

static int cu_replay(Backend *b, RtErr *e)
{
	CuBackend *x = b->impl;
	CU(cudaGraphLaunch(x->gexec, x->st[DP_STREAM_COMPUTE]));
	x->kind = 0;         /* the watchdog reads the step's marks */
	x->check_step = 1;   /* ... and the device's lr after the wait */
	return 0;
}

/* What libdpcuda.so exports; dpexec finds it with dlsym (backend.c). */
__attribute__((visibility("default"))) const BackendOps dp_cuda_backend = {
	.name = "cuda",
	.abi = DP_BACKEND_ABI,
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
};
