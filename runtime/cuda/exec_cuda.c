/*
 * exec_cuda.c - the CUDA executor (see cuda.h for the model): device
 * discovery, arena and tensor pointers, the walk over a program enqueued on
 * two streams, cuBLAS GEMMs, NCCL collectives, the step graph, batch staging,
 * the polling wait with its watchdog, and teardown.
 *
 * One code path enqueues a program run (enqueue_run) and one an optimizer
 * step (enqueue_step); the step graph is enqueue_step under stream capture,
 * and --no-graph is enqueue_step without it, so the two execute the same
 * kernels with the same arguments in the same stream order.
 *
 * Plain C compiled by gcc with -Wall -Wextra: the CUDA runtime, cuBLAS and
 * NCCL C APIs only; the kernels are behind kernels.h.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

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

/* Device staging of one data source: `slots` batches (one per micro-batch). */
typedef struct {
	int used;
	size_t bytes;           /* one batch */
	int slots;
	void *host[2];          /* pinned, slots * bytes; double-buffered for train */
	void *dev;              /* slots * bytes */
	cudaEvent_t h2d[2];     /* the copy out of host[i] has finished */
	int filled[2];
	uint64_t filled_step[2];
} Staging;

struct CuExec {
	const DpStep *s;
	const Comm *comm;
	CuNccl *nccl;
	CuOpts o;
	unsigned char *arena;
	void **ptr;
	cudaStream_t st[DP_NSTREAM];
	cublasHandle_t blas[DP_NSTREAM]; /* NULL on a stream without GEMMs */
	void *blas_ws[DP_NSTREAM];
	double *scratch[DP_NSTREAM];     /* per stream: reductions never share */
	cudaEvent_t *ev;
	int8_t *ev_set;
	cudaEvent_t fork, join, done;
	CuScalars *sc;                   /* device */
	Staging *stg;                    /* [nsources] */
	DataSet *train, *eval;
	int dp_rank, dp_size;
	ExecInitHook init_hook;
	ExecSaveHook save_hook;
	void *hook_ctx;
	float *bounce;                   /* pinned, for INIT/SAVE */
	size_t bounce_bytes;
	cudaGraph_t graph;
	cudaGraphExec_t gexec;
	int capturing;
	uint64_t next_step;              /* what the device counter holds */
	int counter_known;
	int running;                     /* a step is launched and not waited for */
	uint64_t running_step;
	/* watchdog: marks[k][stream] = last finished collective of run kind k */
	volatile int64_t *marks;         /* mapped pinned host memory, [2][DP_NSTREAM] */
	int64_t *marks_dev;
	MarkTable tab[2];
	int aborted;
};

static const char *tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

static int64_t cols_of(const DpTensor *t) { return t->ndim ? t->dims[t->ndim - 1] : 1; }
static int64_t rows_of(const DpTensor *t) { return exec_numel(t) / cols_of(t); }

/* ---- devices ---- */

int cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess)
		n = 0;
	cudaGetLastError(); /* clear the sticky-free error a driverless machine leaves */
	return n;
}

void cuda_describe(int device, char *buf, size_t len)
{
	struct cudaDeviceProp p;
	int drv = 0, rtv = 0;
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rtv);
	int nv = 0;
	ncclGetVersion(&nv);
	if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
		cudaGetLastError();
		snprintf(buf, len, "no CUDA device %d (driver %d, runtime %d, NCCL %d)", device, drv,
			 rtv, nv);
		return;
	}
	snprintf(buf, len, "%s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d, runtime %d.%d, NCCL %d",
		 p.name, p.major, p.minor, p.multiProcessorCount,
		 (double)p.totalGlobalMem / (1u << 30), drv / 1000, drv % 1000 / 10, rtv / 1000,
		 rtv % 1000 / 10, nv);
}

int cuda_select_device(int local_rank, int *device, RtErr *e)
{
	int n = cuda_device_count();
	if (n == 0)
		return RT_FAIL(e, "no CUDA device is visible");
	*device = local_rank % n;
	CU(cudaSetDevice(*device));
	return 0;
}

/* ---- load-time checks ---- */

/* The executor's own instructions: the shared load-time checks
 * (runtime/exec.c), plus a communicator for every collective's stream and
 * mask. The decoder keeps INIT/SAVE in init/export and LOAD in step/eval. */
static int check_own(CuExec *x, int p, uint32_t i, RtErr *e)
{
	const DpInstr *in = &x->s->prog[p][i];
	RT_CHECK(exec_check_instr(x->s, x->comm, p, i, e));
	if (dp_is_collective(in->op) && comm_group_size(x->comm, (unsigned)in->ia[0]) > 1 &&
	    !cu_nccl_comm(x->nccl, in->stream, (unsigned)in->ia[0]))
		return RT_FAIL(e, "no NCCL communicator for axis mask %lld on the %s stream "
			       "(cuda_nccl_init was given other masks)", (long long)in->ia[0],
			       dp_stream_names[in->stream]);
	return 0;
}

/* GPU-only rules on top of cpu_check. */
static int check_gpu(const DpStep *s, const DpInstr *in, RtErr *e)
{
	for (int k = -1; k < DP_MAX_IN; k++) {
		int id = k < 0 ? in->out : in->in[k];
		if (id >= 0 && s->tensors[id].dtype == DP_BF16)
			return RT_FAIL(e, "step file: %s of '%s': bf16 is not implemented in the CUDA "
				       "backend yet", dp_kernel_names[in->op], tname(s, id));
	}
	/* the transformer kernels (issue 4) have CPU kernels only so far */
	if (in->op >= DPK_EMBEDDING && in->op != DPK_TP_REDUCE)
		return RT_FAIL(e, "step file: %s is not implemented in the CUDA backend yet (run "
			       "with the CPU executor)", dp_kernel_names[in->op]);
	if (in->op == DPK_COPY) {
		const DpTensor *o = &s->tensors[in->out], *a = &s->tensors[in->in[0]];
		int disjoint = o->offset + o->nbytes <= a->offset || a->offset + a->nbytes <= o->offset;
		if (!disjoint && o->offset != a->offset)
			return RT_FAIL(e, "step file: copy '%s' -> '%s': partially overlapping operands "
				       "are not supported on CUDA", tname(s, in->in[0]),
				       tname(s, in->out));
	}
	return 0;
}

/* ---- set-up ---- */

static size_t scratch_doubles(const DpStep *s, int stream)
{
	size_t n = CU_REDUCE_BLOCKS;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->stream == stream &&
			    (in->op == DPK_XENT || in->op == DPK_CORRECT) && in->in[0] >= 0) {
				size_t r = 2 * (size_t)rows_of(&s->tensors[in->in[0]]);
				n = r > n ? r : n;
			}
		}
	return n;
}

static int setup_staging(CuExec *x, RtErr *e)
{
	const DpStep *s = x->s;
	x->stg = calloc(s->nsources ? s->nsources : 1, sizeof *x->stg);
	if (!x->stg)
		return RT_FAIL(e, "out of memory (staging)");
	for (int p = DP_PROG_STEP; p <= DP_PROG_EVAL; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->op != DPK_LOAD)
				continue;
			Staging *g = &x->stg[in->ia[0]];
			if (g->used)
				continue;
			g->used = 1;
			g->bytes = (size_t)exec_numel(&s->tensors[in->out]) * 4;
			g->slots = p == DP_PROG_STEP ? (int)s->cfg.grad_accum : 1;
			size_t all = g->bytes * (size_t)g->slots;
			int nhost = p == DP_PROG_STEP ? 2 : 1;
			CU(cudaMalloc(&g->dev, all ? all : 4));
			for (int h = 0; h < nhost; h++) {
				CU(cudaMallocHost(&g->host[h], all ? all : 4));
				CU(cudaEventCreateWithFlags(&g->h2d[h], cudaEventDisableTiming));
			}
		}
	return 0;
}

static int add_mark(CuExec *x, int kind, int stream, int p, uint32_t i, int micro, int64_t *seq,
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
	t->v[t->n] = (Mark){stream, p, i, micro};
	*seq = t->n++;
	return 0;
}

/* ---- one instruction ---- */

static int gemm(CuExec *x, int stream, const float *a, const DpTensor *ta_, int ta,
		const float *b, const DpTensor *tb_, int tb, float *c, float beta, RtErr *e)
{
	/* Row-major C[m,n] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
	 * hand cuBLAS B first, with the same transpose flags. */
	int64_t ra = rows_of(ta_), ca = cols_of(ta_), rb = rows_of(tb_), cb = cols_of(tb_);
	int m = (int)(ta ? ca : ra), k = (int)(ta ? ra : ca), n = (int)(tb ? rb : cb);
	const float one = 1.0f;
	if (m == 0 || n == 0)
		return 0;
	BLAS(cublasSgemm(x->blas[stream], tb ? CUBLAS_OP_T : CUBLAS_OP_N,
			 ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, b, (int)(cb ? cb : 1), a,
			 (int)(ca ? ca : 1), &beta, c, n));
	return 0;
}

static int run_kernel(CuExec *x, const DpInstr *in, RtErr *e)
{
	const DpStep *s = x->s;
	cudaStream_t st = x->st[in->stream];
	const DpTensor *to = in->out >= 0 ? &s->tensors[in->out] : NULL;
	const DpTensor *t0 = in->in[0] >= 0 ? &s->tensors[in->in[0]] : NULL;
	const DpTensor *t1 = in->in[1] >= 0 ? &s->tensors[in->in[1]] : NULL;
	float *o = in->out >= 0 ? x->ptr[in->out] : NULL;
	const float *a = in->in[0] >= 0 ? x->ptr[in->in[0]] : NULL;
	const float *b = in->in[1] >= 0 ? x->ptr[in->in[1]] : NULL;
	int64_t n = to ? exec_numel(to) : 0;

	switch (in->op) {
	case DPK_NOP:
		return 0;
	case DPK_FILL:
		if (to->dtype == DP_I32)
			CU(cu_k_fill_i32(st, x->ptr[in->out], n, (int32_t)in->fa[0]));
		else if (in->fa[0] == 0)
			CU(cudaMemsetAsync(o, 0, (size_t)n * 4, st));
		else
			CU(cu_k_fill_f32(st, o, n, in->fa[0]));
		return 0;
	case DPK_COPY:
		if (o != a && n)
			CU(cudaMemcpyAsync(o, a, (size_t)n * 4, cudaMemcpyDeviceToDevice, st));
		return 0;
	case DPK_ACCUM:
	case DPK_SCALE:
	case DPK_ADD:
	case DPK_MUL:
	case DPK_RELU:
	case DPK_RELU_GRAD:
	case DPK_GELU:
	case DPK_GELU_GRAD:
	case DPK_TANH:
	case DPK_TANH_GRAD:
		CU(cu_k_elementwise(st, in->op, o, a, b, n, in->fa[0]));
		return 0;
	case DPK_MATMUL:
		return gemm(x, in->stream, a, t0, in->ia[0] != 0, b, t1, in->ia[1] != 0, o,
			    in->ia[2] ? 1.0f : 0.0f, e);
	case DPK_LINEAR: {
		float beta = 0;
		if (in->in[2] >= 0) {
			CU(cu_k_bias_rows(st, o, x->ptr[in->in[2]], rows_of(t0), cols_of(to)));
			beta = 1;
		}
		return gemm(x, in->stream, a, t0, 0, b, t1, 0, o, beta, e);
	}
	case DPK_BIAS_ADD:
		CU(cu_k_bias_add(st, o, a, b, n, exec_numel(t1)));
		return 0;
	case DPK_BIAS_GRAD:
		CU(cu_k_bias_grad(st, o, a, exec_numel(t0) / (n ? n : 1), n, in->ia[2] != 0));
		return 0;
	case DPK_XENT:
	case DPK_XENT_GRAD:
	case DPK_CORRECT:
		CU(cu_k_xent(st, in->op, o, a, x->ptr[in->in[1]], rows_of(t0), cols_of(t0), in->fa[0],
			     x->scratch[in->stream], x->sc));
		return 0;
	case DPK_SQNORM:
		CU(cu_k_sqnorm(st, o, a, exec_numel(t0), in->ia[2] != 0,
			       in->fa[0] != 0 ? in->fa[0] : 1.0f, x->scratch[in->stream]));
		return 0;
	case DPK_SQRT:
		CU(cu_k_sqrt(st, o, a));
		return 0;
	case DPK_CLIP:
		CU(cu_k_clip(st, o, n, a, in->fa[0]));
		return 0;
	case DPK_SGD:
		CU(cu_k_sgd(st, o, a, in->in[1] >= 0 ? x->ptr[in->in[1]] : NULL, n, in->fa[0],
			    in->fa[1], x->sc));
		return 0;
	case DPK_ADAMW:
		CU(cu_k_adamw(st, o, a, x->ptr[in->in[1]], x->ptr[in->in[2]], n, s->opt.beta1,
			      s->opt.beta2, s->opt.eps, x->sc));
		return 0;
	default:
		return RT_FAIL(e, "%s is not a CUDA compute kernel", dp_kernel_names[in->op]);
	}
}

static int run_collective(CuExec *x, const DpInstr *in, RtErr *e)
{
	const DpStep *s = x->s;
	cudaStream_t st = x->st[in->stream];
	unsigned mask = (unsigned)in->ia[0];
	ncclComm_t c = cu_nccl_comm(x->nccl, in->stream, mask);
	float *out = x->ptr[in->out];
	const float *src = in->in[0] >= 0 ? x->ptr[in->in[0]] : out;
	size_t n = (size_t)exec_numel(&s->tensors[in->out]);
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
		CU_NCCL(ncclAllGather(src, out, (size_t)exec_numel(&s->tensors[in->in[0]]),
				      ncclFloat32, c, st), e);
		break;
	}
	return 0;
}

/* INIT and SAVE: host-side through the hooks and the pinned bounce buffer
 * (never under capture: check_own keeps them out of step and eval). */
static int run_host(CuExec *x, const DpInstr *in, RtErr *e)
{
	const DpStep *s = x->s;
	cudaStream_t st = x->st[in->stream];
	int id = in->op == DPK_INIT ? in->out : in->in[0];
	/* the tensor whose name is the parameter's (INIT in0 / SAVE in1 for a
	 * tensor-parallel parameter handled whole) */
	int name = in->op == DPK_INIT ? (in->in[0] >= 0 ? in->in[0] : id)
				      : (in->in[1] >= 0 ? in->in[1] : id);
	const DpTensor *t = &s->tensors[id];
	size_t bytes = (size_t)exec_numel(t) * 4;
	CU(cudaStreamSynchronize(st)); /* the bounce buffer may still feed a copy */
	if (in->op == DPK_INIT) {
		if (x->init_hook)
			RT_CHECK(x->init_hook(x->hook_ctx, name, id, x->bounce, e));
		else
			init_fill(t->init, t->init_a, t->init_b, s->cfg.seed,
				  dpstep_str(s, s->tensors[name].name), t->init_base, exec_numel(t),
				  x->bounce);
		if (bytes)
			CU(cudaMemcpyAsync(x->ptr[id], x->bounce, bytes, cudaMemcpyHostToDevice, st));
		return 0;
	}
	if (!x->save_hook)
		return RT_FAIL(e, "save of '%s': no checkpoint writer is set", tname(s, id));
	if (bytes)
		CU(cudaMemcpyAsync(x->bounce, x->ptr[id], bytes, cudaMemcpyDeviceToHost, st));
	CU(cudaStreamSynchronize(st));
	return x->save_hook(x->hook_ctx, name, id, x->bounce, e);
}

/* ---- a program run ---- */

/* Enqueue one run of program p (micro: the micro-batch, i.e. the staging
 * slot; kind: which mark table). Forks the comm stream off the compute
 * stream first and joins it back last, so a run sees everything before it
 * and everything after it sees the whole run, on both streams. */
static int enqueue_run(CuExec *x, DpProgram p, int micro, int last, int kind, RtErr *e)
{
	const DpStep *s = x->s;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE], ms = x->st[DP_STREAM_COMM];
	CU(cudaEventRecord(x->fork, cs));
	CU(cudaStreamWaitEvent(ms, x->fork, 0));
	memset(x->ev_set, 0, s->nevents ? s->nevents : 1);
	for (uint32_t i = 0; i < s->nprog[p]; i++) {
		const DpInstr *in = &s->prog[p][i];
		cudaStream_t st = x->st[in->stream];
		if ((in->flags & DP_IF_LAST) && !last)
			continue;
		switch (in->op) {
		case DPK_EVENT_RECORD:
			CU(cudaEventRecord(x->ev[in->ia[0]], st));
			x->ev_set[in->ia[0]] = 1;
			break;
		case DPK_EVENT_WAIT:
			if (!x->ev_set[in->ia[0]])
				return RT_FAIL(e, "schedule error in the %s program: instruction %u waits "
					       "for event %lld, which was not recorded before it",
					       dp_prog_names[p], i, (long long)in->ia[0]);
			CU(cudaStreamWaitEvent(st, x->ev[in->ia[0]], 0));
			break;
		case DPK_ALL_REDUCE:
		case DPK_REDUCE_SCATTER:
		case DPK_ALL_GATHER:
		case DPK_TP_REDUCE:
			RT_CHECK(run_collective(x, in, e));
			if (x->o.timeout_s > 0) {
				int64_t seq = -1;
				RT_CHECK(add_mark(x, kind, in->stream, p, i, micro, &seq, e));
				CU(cu_k_mark(st, x->marks_dev + kind * DP_NSTREAM + in->stream, seq));
			}
			break;
		case DPK_LOAD: {
			Staging *g = &x->stg[in->ia[0]];
			CU(cudaMemcpyAsync(x->ptr[in->out], (char *)g->dev + (size_t)micro * g->bytes,
					   g->bytes, cudaMemcpyDeviceToDevice, st));
			break;
		}
		case DPK_SHARD: { /* block k along dim ia1: outer rows of n elements */
			const DpTensor *ti = &s->tensors[in->in[0]];
			size_t outer = 1, row = 1;
			for (int d = 0; d < ti->ndim; d++)
				*(d < in->ia[1] ? &outer : &row) *= (size_t)ti->dims[d];
			size_t n = (size_t)exec_numel(&s->tensors[in->out]) / outer;
			int k = comm_group_rank(x->comm, (unsigned)in->ia[0]);
			const float *src = (const float *)x->ptr[in->in[0]] + (size_t)k * n;
			if (n && src != x->ptr[in->out])
				CU(cudaMemcpy2DAsync(x->ptr[in->out], n * 4, src, row * 4, n * 4, outer,
						     cudaMemcpyDeviceToDevice, st));
			break;
		}
		case DPK_INIT:
		case DPK_SAVE:
			RT_CHECK(run_host(x, in, e));
			break;
		default:
			RT_CHECK(run_kernel(x, in, e));
			break;
		}
	}
	CU(cudaEventRecord(x->join, ms));
	CU(cudaStreamWaitEvent(cs, x->join, 0));
	return 0;
}

static int zero_metrics(CuExec *x, cudaStream_t st, RtErr *e)
{
	for (uint32_t i = 0; i < x->s->ntensors; i++)
		if (x->s->tensors[i].kind == DP_T_METRIC && x->ptr[i] && x->s->tensors[i].nbytes)
			CU(cudaMemsetAsync(x->ptr[i], 0, x->s->tensors[i].nbytes, st));
	return 0;
}

/* One optimizer step on the compute stream: what the graph holds. */
static int enqueue_step(CuExec *x, RtErr *e)
{
	const DpStep *s = x->s;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	x->tab[0].n = 0;
	CU(cu_k_sched(cs, x->sc, s->opt, s->sched, s->cfg.steps));
	RT_CHECK(zero_metrics(x, cs, e));
	for (uint32_t m = 0; m < s->cfg.grad_accum; m++)
		RT_CHECK(enqueue_run(x, DP_PROG_STEP, (int)m, m + 1 == s->cfg.grad_accum, 0, e));
	CU(cu_k_step_advance(cs, x->sc));
	return 0;
}

static int capture_step(CuExec *x, RtErr *e)
{
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	CU(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
	x->capturing = 1;
	int rc = enqueue_step(x, e);
	cudaGraph_t g = NULL;
	cudaError_t end = cudaStreamEndCapture(cs, &g); /* always end it, even after a failure */
	x->capturing = 0;
	if (rc) {
		if (g)
			cudaGraphDestroy(g);
		return -1;
	}
	CU(end);
	x->graph = g;
	CU(cudaGraphInstantiate(&x->gexec, g, 0));
	CU(cudaGraphUpload(x->gexec, cs));
	CU(cudaStreamSynchronize(cs));
	return 0;
}

/* Everything of cuda_exec_init after the struct exists; on failure the
 * caller frees the partial set-up with cuda_exec_free. */
static int init_body(CuExec *x, RtErr *e)
{
	const DpStep *s = x->s;
	int gemm_on[DP_NSTREAM] = {0, 0};
	size_t bounce = 4;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->stream >= DP_NSTREAM)
				return RT_FAIL(e, "step file: %s program instruction %u: bad stream %u",
					       dp_prog_names[p], i, in->stream);
			if (dp_op_class(in->op) == DP_OPC_KERNEL) {
				RT_CHECK(check_gpu(s, in, e));
			} else {
				RT_CHECK(check_own(x, p, i, e));
			}
			if (in->op == DPK_MATMUL || in->op == DPK_LINEAR)
				gemm_on[in->stream] = 1;
			if (in->op == DPK_INIT || in->op == DPK_SAVE) {
				int id = in->op == DPK_INIT ? in->out : in->in[0];
				size_t b = (size_t)exec_numel(&s->tensors[id]) * 4;
				bounce = b > bounce ? b : bounce;
			}
		}

	size_t bytes = (size_t)((s->cfg.arena_bytes + 255) / 256 * 256);
	CU(cudaMalloc((void **)&x->arena, bytes ? bytes : 256));
	CU(cudaMemset(x->arena, 0, bytes ? bytes : 256));
	x->ptr = calloc(s->ntensors ? s->ntensors : 1, sizeof *x->ptr);
	x->ev = calloc(s->nevents ? s->nevents : 1, sizeof *x->ev);
	x->ev_set = calloc(s->nevents ? s->nevents : 1, 1);
	if (!x->ptr || !x->ev || !x->ev_set)
		return RT_FAIL(e, "out of memory (CUDA executor tables)");
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (s->tensors[i].nbytes)
			x->ptr[i] = x->arena + s->tensors[i].offset;

	for (int k = 0; k < DP_NSTREAM; k++) {
		CU(cudaStreamCreateWithFlags(&x->st[k], cudaStreamNonBlocking));
		CU(cudaMalloc((void **)&x->scratch[k], scratch_doubles(s, k) * sizeof(double)));
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
	CU(cudaMallocHost((void **)&x->bounce, bounce));
	x->bounce_bytes = bounce;
	RT_CHECK(setup_staging(x, e));
	CU(cudaDeviceSynchronize());
	if (!x->o.no_graph && s->nprog[DP_PROG_STEP])
		RT_CHECK(capture_step(x, e));
	return 0;
}

int cuda_exec_init(CuExec **out, const DpStep *s, const Comm *comm, CuNccl *nccl,
		   const CuOpts *o, RtErr *e)
{
	*out = NULL;
	CuExec *x = calloc(1, sizeof *x);
	if (!x)
		return RT_FAIL(e, "out of memory (CUDA executor)");
	x->s = s;
	x->comm = comm;
	x->nccl = nccl;
	if (o)
		x->o = *o;
	x->dp_size = (int)(s->cfg.mesh[DP_AXIS_REPLICATE] * s->cfg.mesh[DP_AXIS_SHARD]);
	x->dp_rank = comm->coord[DP_AXIS_REPLICATE] * (int)s->cfg.mesh[DP_AXIS_SHARD] +
		     comm->coord[DP_AXIS_SHARD];
	if (init_body(x, e)) {
		x->aborted = 1; /* nothing was launched that teardown must wait for */
		cuda_exec_free(x);
		return -1;
	}
	*out = x;
	return 0;
}

void cuda_exec_set_data(CuExec *x, DataSet *train, DataSet *eval)
{
	x->train = train;
	x->eval = eval;
}

void cuda_exec_set_hooks(CuExec *x, ExecInitHook init, ExecSaveHook save, void *ctx)
{
	x->init_hook = init;
	x->save_hook = save;
	x->hook_ctx = ctx;
}

/* ---- waiting, with the watchdog ---- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The first collective of each stream that has not finished, by the marks. */
static void pending_text(CuExec *x, int kind, char *buf, size_t len)
{
	const MarkTable *t = &x->tab[kind];
	size_t used = 0;
	buf[0] = 0;
	for (int st = 0; st < DP_NSTREAM; st++) {
		int64_t last = x->marks[kind * DP_NSTREAM + st];
		for (int i = (int)(last + 1); i < t->n; i++) {
			const Mark *m = &t->v[i];
			if (m->stream != st)
				continue;
			const DpInstr *in = &x->s->prog[m->prog][m->instr];
			used += (size_t)snprintf(buf + used, used < len ? len - used : 0,
						 "%s%s of '%s' over axis mask %lld on the %s stream (%s "
						 "program instruction %u, micro-batch %d)",
						 used ? "; " : "", dp_kernel_names[in->op],
						 tname(x->s, in->out), (long long)in->ia[0],
						 dp_stream_names[st], dp_prog_names[m->prog], m->instr, m->micro);
			break;
		}
	}
	if (!buf[0])
		snprintf(buf, len, "no collective outstanding (compute is what did not finish)");
}

/* Poll `ev` (recorded after the work) until it completes. */
static int wait_event(CuExec *x, cudaEvent_t ev, int kind, const char *what, RtErr *e)
{
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
				cuda_nccl_abort(x->nccl);
				x->aborted = 1;
				return -1;
			}
		}
		if (x->o.timeout_s > 0 && t - t0 > x->o.timeout_s) {
			char pend[512];
			pending_text(x, kind, pend, sizeof pend);
			cuda_nccl_abort(x->nccl);
			x->aborted = 1;
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

static int check_scalars(CuExec *x, RtErr *e)
{
	CuScalars sc;
	CU(cudaMemcpy(&sc, x->sc, sizeof sc, cudaMemcpyDeviceToHost));
	if (sc.err)
		return RT_FAIL(e, "label %d of row %lld is out of range for %lld classes",
			       sc.err_label, (long long)sc.err_row, (long long)sc.err_classes);
	return 0;
}

static void reset_marks(CuExec *x, int kind)
{
	for (int st = 0; st < DP_NSTREAM; st++)
		x->marks[kind * DP_NSTREAM + st] = -1;
}

/* ---- steps ---- */

int cuda_exec_prefetch(CuExec *x, uint64_t step, RtErr *e)
{
	const DpStep *s = x->s;
	int set = (int)(step & 1);
	for (uint32_t src = 0; src < s->nsources; src++) {
		Staging *g = &x->stg[src];
		if (!g->used || s->sources[src].split != DP_SPLIT_TRAIN)
			continue;
		if (g->filled[set] && g->filled_step[set] == step)
			continue;
		if (!x->train)
			return RT_FAIL(e, "no training data is loaded for source %u", src);
		/* host[set] fed the copy of step - 2: it must be done before we refill */
		CU(cudaEventSynchronize(g->h2d[set]));
		for (int m = 0; m < g->slots; m++)
			data_fill_train(x->train, s, (int)src, step, m, x->dp_rank, x->dp_size,
					(char *)g->host[set] + (size_t)m * g->bytes);
		g->filled[set] = 1;
		g->filled_step[set] = step;
	}
	return 0;
}

int cuda_exec_step_launch(CuExec *x, uint64_t step, RtErr *e)
{
	const DpStep *s = x->s;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	if (x->aborted)
		return RT_FAIL(e, "the CUDA executor was aborted");
	if (x->running)
		return RT_FAIL(e, "step %llu launched while step %llu is running",
			       (unsigned long long)step, (unsigned long long)x->running_step);
	if (!x->counter_known || step != x->next_step) { /* resume, or a jump */
		CU(cudaStreamSynchronize(cs));
		CU(cudaMemcpy(&x->sc->step, &step, sizeof step, cudaMemcpyHostToDevice));
	}
	RT_CHECK(cuda_exec_prefetch(x, step, e));
	int set = (int)(step & 1);
	for (uint32_t src = 0; src < s->nsources; src++) {
		Staging *g = &x->stg[src];
		if (!g->used || s->sources[src].split != DP_SPLIT_TRAIN)
			continue;
		CU(cudaMemcpyAsync(g->dev, g->host[set], g->bytes * (size_t)g->slots,
				   cudaMemcpyHostToDevice, cs));
		CU(cudaEventRecord(g->h2d[set], cs));
		g->filled[set] = 0; /* consumed: the next fill of this set is a new step */
	}
	reset_marks(x, 0);
	if (x->gexec)
		CU(cudaGraphLaunch(x->gexec, cs));
	else
		RT_CHECK(enqueue_step(x, e));
	CU(cudaEventRecord(x->done, cs));
	x->running = 1;
	x->running_step = step;
	x->next_step = step + 1;
	x->counter_known = 1;
	return 0;
}

int cuda_exec_step_wait(CuExec *x, RtErr *e)
{
	if (!x->running)
		return 0;
	char what[64];
	snprintf(what, sizeof what, "step %llu", (unsigned long long)x->running_step + 1);
	x->running = 0;
	if (wait_event(x, x->done, 0, what, e)) {
		x->counter_known = 0;
		return -1;
	}
	return check_scalars(x, e);
}

int cuda_exec_step(CuExec *x, uint64_t step, RtErr *e)
{
	RT_CHECK(cuda_exec_step_launch(x, step, e));
	return cuda_exec_step_wait(x, e);
}

/* An eager run of a program that is not the step, and its wait. */
static int run_other(CuExec *x, DpProgram p, int micro, const char *what, RtErr *e)
{
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	if (x->aborted)
		return RT_FAIL(e, "the CUDA executor was aborted");
	RT_CHECK(cuda_exec_step_wait(x, e));
	x->tab[1].n = 0;
	reset_marks(x, 1);
	RT_CHECK(enqueue_run(x, p, micro, 1, 1, e));
	CU(cudaEventRecord(x->done, cs));
	RT_CHECK(wait_event(x, x->done, 1, what, e));
	return check_scalars(x, e);
}

int cuda_exec_eval(CuExec *x, int64_t batch, RtErr *e)
{
	const DpStep *s = x->s;
	cudaStream_t cs = x->st[DP_STREAM_COMPUTE];
	RT_CHECK(cuda_exec_step_wait(x, e));
	for (uint32_t src = 0; src < s->nsources; src++) {
		Staging *g = &x->stg[src];
		if (!g->used || s->sources[src].split != DP_SPLIT_EVAL)
			continue;
		if (!x->eval)
			return RT_FAIL(e, "no eval data is loaded for source %u", src);
		CU(cudaEventSynchronize(g->h2d[0]));
		data_fill_eval(x->eval, s, (int)src, batch, x->dp_rank, x->dp_size, g->host[0]);
		CU(cudaMemcpyAsync(g->dev, g->host[0], g->bytes, cudaMemcpyHostToDevice, cs));
		CU(cudaEventRecord(g->h2d[0], cs));
	}
	char what[64];
	snprintf(what, sizeof what, "eval batch %lld", (long long)batch);
	return run_other(x, DP_PROG_EVAL, 0, what, e);
}

int cuda_exec_run(CuExec *x, DpProgram p, RtErr *e)
{
	if (p != DP_PROG_INIT && p != DP_PROG_EXPORT)
		return RT_FAIL(e, "cuda_exec_run runs the init and export programs only");
	return run_other(x, p, 0, p == DP_PROG_INIT ? "the init program" : "the export program", e);
}

/* ---- host access ---- */

static int tensor_bytes(CuExec *x, int tensor, size_t *bytes, RtErr *e)
{
	if (tensor < 0 || (uint32_t)tensor >= x->s->ntensors || !x->ptr[tensor])
		return RT_FAIL(e, "tensor %d has no device storage", tensor);
	const DpTensor *t = &x->s->tensors[tensor];
	*bytes = (size_t)exec_numel(t) * (t->dtype == DP_BF16 ? 2 : 4);
	return 0;
}

int cuda_exec_read(CuExec *x, int tensor, void *host, RtErr *e)
{
	size_t bytes;
	RT_CHECK(tensor_bytes(x, tensor, &bytes, e));
	RT_CHECK(cuda_exec_step_wait(x, e));
	CU(cudaStreamSynchronize(x->st[DP_STREAM_COMPUTE]));
	CU(cudaMemcpy(host, x->ptr[tensor], bytes, cudaMemcpyDeviceToHost));
	return 0;
}

int cuda_exec_write(CuExec *x, int tensor, const void *host, RtErr *e)
{
	size_t bytes;
	RT_CHECK(tensor_bytes(x, tensor, &bytes, e));
	RT_CHECK(cuda_exec_step_wait(x, e));
	CU(cudaStreamSynchronize(x->st[DP_STREAM_COMPUTE]));
	CU(cudaMemcpy(x->ptr[tensor], host, bytes, cudaMemcpyHostToDevice));
	return 0;
}

int cuda_exec_zero_metrics(CuExec *x, RtErr *e)
{
	RT_CHECK(cuda_exec_step_wait(x, e));
	RT_CHECK(zero_metrics(x, x->st[DP_STREAM_COMPUTE], e));
	CU(cudaStreamSynchronize(x->st[DP_STREAM_COMPUTE]));
	return 0;
}

int cuda_exec_scalars(CuExec *x, float *lr, int64_t *t, RtErr *e)
{
	CuScalars sc;
	RT_CHECK(cuda_exec_step_wait(x, e));
	CU(cudaMemcpy(&sc, x->sc, sizeof sc, cudaMemcpyDeviceToHost));
	*lr = sc.lr;
	*t = sc.t;
	return 0;
}

/* ---- teardown: graph first, NCCL is the caller's and goes after ---- */

void cuda_exec_free(CuExec *x)
{
	if (!x)
		return;
	if (!x->aborted)
		cudaDeviceSynchronize();
	if (x->gexec)
		cudaGraphExecDestroy(x->gexec);
	if (x->graph)
		cudaGraphDestroy(x->graph);
	for (uint32_t i = 0; x->ev && i < x->s->nevents; i++)
		if (x->ev[i])
			cudaEventDestroy(x->ev[i]);
	if (x->fork)
		cudaEventDestroy(x->fork);
	if (x->join)
		cudaEventDestroy(x->join);
	if (x->done)
		cudaEventDestroy(x->done);
	for (uint32_t i = 0; x->stg && i < x->s->nsources; i++) {
		Staging *g = &x->stg[i];
		for (int h = 0; h < 2; h++) {
			if (g->host[h])
				cudaFreeHost(g->host[h]);
			if (g->h2d[h])
				cudaEventDestroy(g->h2d[h]);
		}
		if (g->dev)
			cudaFree(g->dev);
	}
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
	if (x->bounce)
		cudaFreeHost(x->bounce);
	if (x->arena)
		cudaFree(x->arena);
	cudaGetLastError();
	for (int k = 0; k < 2; k++)
		free(x->tab[k].v);
	free(x->stg);
	free(x->ptr);
	free(x->ev);
	free(x->ev_set);
	free(x);
}
