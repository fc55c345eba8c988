/*
 * kernels.cu - the CUDA backend's kernels and its kernel table: for every
 * compute opcode it implements, the device code, the launcher (CuArgs ->
 * launch, cuBLAS for the GEMMs) and the table row live here, and nowhere
 * else in runtime/cuda/. Plus the per-step schedule kernel and the
 * watchdog's progress mark.
 *
 * The CPU backend (runtime/cpu/) is the reference; each kernel says where it
 * differs in rounding. Layout: a tensor [a, b, c] is a row-major [a*b, c]
 * matrix. Elementwise kernels are grid-stride loops over int64 indices.
 * Reductions have a fixed launch shape and a fixed combination tree, so
 * results do not depend on scheduling: two runs, or a graph replay and an
 * eager run, are bitwise equal. fp32 only (bf16 is refused at load).
 *
 * The launchers trust their operands: the step-file decoder validates them
 * (presence, dtypes, element counts); only this backend's own limits (int
 * sizes for cuBLAS, partially overlapping copies) are the rows' `limits`.
 * Every launch goes through CU_LAUNCH (CU_LAUNCH_SMEM with dynamic shared
 * memory), `<<<>>>` under nvcc; the CUDA emulator (tests/cuda_emu,
 * docs/CUDA-EMU.md) defines both as its own launch. Each is followed by a
 * check of its error.
 */
#include <limits.h>
#include <math.h>

#include "kernels.h"

#ifndef CU_LAUNCH
#define CU_LAUNCH(kernel, grid, block, stream, ...) \
	kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif
/* A launch with smem bytes of dynamic shared memory (`extern __shared__`);
 * above 48 KiB the kernel needs cudaFuncSetAttribute(kernel,
 * cudaFuncAttributeMaxDynamicSharedMemorySize, smem) first. */
#ifndef CU_LAUNCH_SMEM
#define CU_LAUNCH_SMEM(kernel, grid, block, smem, stream, ...) \
	kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

#define THREADS 256

static unsigned grid_for(int64_t n)
{
	int64_t b = (n + THREADS - 1) / THREADS;
	return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#define FOR_EACH(i, n) \
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (int64_t)gridDim.x * blockDim.x)

/* The error of the last launch (or CUDA call) of instruction a, as an RtErr. */
#define LAUNCHED(a, e)                                                                    \
	do {                                                                              \
		cudaError_t err_ = cudaGetLastError();                                    \
		if (err_ != cudaSuccess)                                                  \
			return RT_FAIL((e), "%s: %s (%s)", dp_kernel_names[(a)->in->op],  \
				       cudaGetErrorString(err_), cudaGetErrorName(err_)); \
	} while (0)
#define CU_OK(a, call, e)                                                                 \
	do {                                                                              \
		cudaError_t err_ = (call);                                                \
		if (err_ != cudaSuccess)                                                  \
			return RT_FAIL((e), "%s: %s: %s (%s)", dp_kernel_names[(a)->in->op], \
				       #call, cudaGetErrorString(err_), cudaGetErrorName(err_)); \
	} while (0)

static int64_t numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}
static int64_t cols_of(const DpTensor *t) { return t->ndim ? t->dims[t->ndim - 1] : 1; }
static int64_t rows_of(const DpTensor *t) { return numel(t) / cols_of(t); }

/* Operand k (-1: out) of the call: its table entry and device address. */
static const DpTensor *tensor(const CuArgs *a, int k)
{
	int id = k < 0 ? a->in->out : a->in->in[k];
	return id >= 0 ? &a->s->tensors[id] : NULL;
}
static float *addr(const CuArgs *a, int k)
{
	int id = k < 0 ? a->in->out : a->in->in[k];
	return id >= 0 ? (float *)a->ptr[id] : NULL;
}

/* ---- per-step scalars ---- */

/* CuScalars.opt_k: AdamW's per-step constants */
enum { ADAM_DECAY, ADAM_STEP_SIZE, ADAM_BC2_SQRT };

/* exec.c's exec_lr for step k, then the constants AdamW derives from lr
 * and t exactly as the CPU's optim.c computes them (double, then rounded to
 * float). */
__global__ void k_sched(CuScalars *sc, DpOptim opt, DpSched sched, uint32_t cfg_steps)
{
	uint64_t k = sc->step;
	double lr = opt.lr;
	if (sched.kind == DP_SCHED_COSINE) {
		double warm = sched.warmup, total = sched.steps ? sched.steps : cfg_steps;
		double min_lr = sched.min_lr;
		if ((double)k < warm) {
			lr = lr * ((double)k + 1) / warm;
		} else {
			double q = total > warm ? ((double)k - warm) / (total - warm) : 1.0;
			if (q > 1)
				q = 1;
			lr = min_lr + 0.5 * (lr - min_lr) * (1 + cos(3.14159265358979323846 * q));
		}
	}
	float lrf = (float)lr;
	double lrd = lrf, t = (double)(k + 1);
	sc->lr = lrf;
	sc->t = (int64_t)k + 1;
	sc->opt_k[ADAM_DECAY] = (float)(1.0 - lrd * opt.weight_decay);
	sc->opt_k[ADAM_STEP_SIZE] = (float)(lrd / (1.0 - pow((double)opt.beta1, t)));
	sc->opt_k[ADAM_BC2_SQRT] = (float)sqrt(1.0 - pow((double)opt.beta2, t));
}

__global__ void k_step_advance(CuScalars *sc)
{
	sc->step++;
}

extern "C" cudaError_t cu_k_sched(cudaStream_t st, CuScalars *sc, DpOptim opt, DpSched sched,
				  uint32_t cfg_steps)
{
	CU_LAUNCH(k_sched, 1, 1, st, sc, opt, sched, cfg_steps);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_step_advance(cudaStream_t st, CuScalars *sc)
{
	CU_LAUNCH(k_step_advance, 1, 1, st, sc);
	return cudaGetLastError();
}

/* ---- watchdog ---- */

__global__ void k_mark(volatile int64_t *slot, int64_t value)
{
	*slot = value;
	__threadfence_system();
}

extern "C" cudaError_t cu_k_mark(cudaStream_t st, volatile int64_t *slot, int64_t value)
{
	CU_LAUNCH(k_mark, 1, 1, st, slot, value);
	return cudaGetLastError();
}

/* ---- nop, fill, copy ---- */

static int run_nop(const CuArgs *a, RtErr *e)
{
	return 0;
}

template <typename T> __global__ void k_fill(T *o, int64_t n, T v)
{
	FOR_EACH(i, n)
		o[i] = v;
}

static int run_fill(const CuArgs *a, RtErr *e)
{
	int64_t n = numel(tensor(a, -1));
	if (n <= 0)
		return 0;
	if (tensor(a, -1)->dtype == DP_I32)
		CU_LAUNCH(k_fill<int32_t>, grid_for(n), THREADS, a->st, (int32_t *)addr(a, -1), n,
			  (int32_t)a->in->fa[0]);
	else if (a->in->fa[0] == 0)
		CU_OK(a, cudaMemsetAsync(addr(a, -1), 0, (size_t)n * 4, a->st), e);
	else
		CU_LAUNCH(k_fill<float>, grid_for(n), THREADS, a->st, addr(a, -1), n, a->in->fa[0]);
	LAUNCHED(a, e);
	return 0;
}

/* A copy is one cudaMemcpyAsync: identical or disjoint operands only. */
static int limit_copy(const DpStep *s, const DpInstr *in, RtErr *e)
{
	const DpTensor *o = &s->tensors[in->out], *a = &s->tensors[in->in[0]];
	int disjoint = o->offset + o->nbytes <= a->offset || a->offset + a->nbytes <= o->offset;
	if (!disjoint && o->offset != a->offset)
		return RT_FAIL(e, "step file: copy '%s' -> '%s': partially overlapping operands are "
			       "not supported on CUDA", dpstep_str(s, a->name), dpstep_str(s, o->name));
	return 0;
}

static int run_copy(const CuArgs *a, RtErr *e)
{
	size_t n = (size_t)numel(tensor(a, -1));
	if (addr(a, -1) != addr(a, 0) && n)
		CU_OK(a, cudaMemcpyAsync(addr(a, -1), addr(a, 0), n * 4, cudaMemcpyDeviceToDevice, a->st),
		      e);
	return 0;
}

/* ---- elementwise: one functor per op, one kernel template ---- */

/* o[i] from a[i], b[i] (and o[i] for accum); fa0: scale's factor. */
#define ELEMENTWISE(name, body)                                                     \
	struct name {                                                               \
		__device__ void operator()(int64_t i, float *o, const float *a,     \
					   const float *b, float fa0) const         \
		{                                                                   \
			body;                                                       \
		}                                                                   \
	};

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

ELEMENTWISE(Accum, o[i] += a[i])
ELEMENTWISE(Scale, o[i] = fa0 * a[i])
ELEMENTWISE(Add, o[i] = a[i] + b[i])
ELEMENTWISE(Mul, o[i] = a[i] * b[i])
ELEMENTWISE(Relu, o[i] = a[i] > 0 ? a[i] : 0)
ELEMENTWISE(ReluGrad, o[i] = b[i] > 0 ? a[i] : 0)
ELEMENTWISE(Gelu, float x = a[i];
	    o[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x))))
ELEMENTWISE(GeluGrad, float x = b[i];
	    float th = tanhf(GELU_S * (x + 0.044715f * x * x * x));
	    float du = GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
	    o[i] = a[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du))
ELEMENTWISE(Tanh, o[i] = tanhf(a[i]))
ELEMENTWISE(TanhGrad, o[i] = a[i] * (1.0f - b[i] * b[i]))

template <class F> __global__ void k_elementwise(float *o, const float *a, const float *b,
						 int64_t n, float fa0)
{
	F f;
	FOR_EACH(i, n)
		f(i, o, a, b, fa0);
}

template <class F> static int run_elementwise(const CuArgs *a, RtErr *e)
{
	int64_t n = numel(tensor(a, -1));
	if (n <= 0)
		return 0;
	CU_LAUNCH(k_elementwise<F>, grid_for(n), THREADS, a->st, addr(a, -1), addr(a, 0), addr(a, 1), n,
		  a->in->fa[0]);
	LAUNCHED(a, e);
	return 0;
}

/* ---- bias add, bias gradient ---- */

__global__ void k_bias_add(float *o, const float *a, const float *bias, int64_t n, int64_t c)
{
	FOR_EACH(i, n)
		o[i] = a[i] + bias[i % c];
}

static int run_bias_add(const CuArgs *a, RtErr *e)
{
	int64_t n = numel(tensor(a, -1));
	if (n <= 0)
		return 0;
	CU_LAUNCH(k_bias_add, grid_for(n), THREADS, a->st, addr(a, -1), addr(a, 0), addr(a, 1), n,
		  numel(tensor(a, 1)));
	LAUNCHED(a, e);
	return 0;
}

/* One thread per column, rows in order, in double: the CPU's exact sum. */
__global__ void k_bias_grad(float *o, const float *a, int64_t rows, int64_t c, int accumulate)
{
	FOR_EACH(j, c) {
		double sum = accumulate ? o[j] : 0;
		for (int64_t r = 0; r < rows; r++)
			sum += a[r * c + j];
		o[j] = (float)sum;
	}
}

static int run_bias_grad(const CuArgs *a, RtErr *e)
{
	int64_t c = numel(tensor(a, -1));
	if (c <= 0)
		return 0;
	CU_LAUNCH(k_bias_grad, grid_for(c), THREADS, a->st, addr(a, -1), addr(a, 0), numel(tensor(a, 0)) / c,
		  c, a->in->ia[2] != 0);
	LAUNCHED(a, e);
	return 0;
}

/* ---- matmul, linear: cuBLAS ---- */

/* m, k, n of out = op(in0) @ op(in1) (ia0, ia1: transpose flags; linear: none). */
static void gemm_dims(const DpStep *s, const DpInstr *in, int64_t *m, int64_t *k, int64_t *n)
{
	const DpTensor *a = &s->tensors[in->in[0]], *b = &s->tensors[in->in[1]];
	int ta = in->op == DPK_MATMUL && in->ia[0], tb = in->op == DPK_MATMUL && in->ia[1];
	*m = ta ? cols_of(a) : rows_of(a);
	*k = ta ? rows_of(a) : cols_of(a);
	*n = tb ? rows_of(b) : cols_of(b);
}

/* cuBLAS takes int sizes and leading dimensions. */
static int limit_gemm(const DpStep *s, const DpInstr *in, RtErr *e)
{
	int64_t m, k, n;
	gemm_dims(s, in, &m, &k, &n);
	if (m > INT_MAX || k > INT_MAX || n > INT_MAX)
		return RT_FAIL(e, "step file: %s '%s': a %lld x %lld x %lld product is too large for "
			       "cuBLAS (int sizes)", dp_kernel_names[in->op],
			       dpstep_str(s, s->tensors[in->out].name), (long long)m, (long long)k,
			       (long long)n);
	return 0;
}

/* Row-major C[m,n] = op(A) op(B) (+ beta C) is column-major C^T = op(B)^T op(A)^T:
 * hand cuBLAS B first, with the same transpose flags. fp32 throughout (the
 * handle's math mode is CUBLAS_DEFAULT_MATH: no TF32). */
static int gemm(const CuArgs *a, float beta, RtErr *e)
{
	const DpTensor *ta_ = tensor(a, 0), *tb_ = tensor(a, 1);
	int ta = a->in->op == DPK_MATMUL && a->in->ia[0], tb = a->in->op == DPK_MATMUL && a->in->ia[1];
	int64_t m, k, n;
	gemm_dims(a->s, a->in, &m, &k, &n);
	int64_t ca = cols_of(ta_), cb = cols_of(tb_);
	const float one = 1.0f;
	if (m == 0 || n == 0)
		return 0;
	cublasStatus_t st = cublasSgemm(a->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
					ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &one,
					addr(a, 1), (int)(cb ? cb : 1), addr(a, 0), (int)(ca ? ca : 1),
					&beta, addr(a, -1), (int)n);
	if (st != CUBLAS_STATUS_SUCCESS)
		return RT_FAIL(e, "%s: cublasSgemm: %s", dp_kernel_names[a->in->op],
			       cublasGetStatusString(st));
	return 0;
}

static int run_matmul(const CuArgs *a, RtErr *e)
{
	return gemm(a, a->in->ia[2] ? 1.0f : 0.0f, e);
}

/* o[r, :] = bias for every row: LINEAR's start before beta = 1 */
__global__ void k_bias_rows(float *o, const float *bias, int64_t n, int64_t cols)
{
	FOR_EACH(i, n)
		o[i] = bias[i % cols];
}

static int run_linear(const CuArgs *a, RtErr *e)
{
	float beta = 0;
	int64_t rows = rows_of(tensor(a, 0)), cols = cols_of(tensor(a, -1));
	if (a->in->in[2] >= 0 && rows * cols > 0) {
		CU_LAUNCH(k_bias_rows, grid_for(rows * cols), THREADS, a->st, addr(a, -1), addr(a, 2),
			  rows * cols, cols);
		LAUNCHED(a, e);
		beta = 1;
	}
	return gemm(a, beta, e);
}

/* ---- block reductions with a fixed tree ---- */

template <typename V> __device__ V block_sum(V v, V *sh)
{
	sh[threadIdx.x] = v;
	__syncthreads();
	for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s)
			sh[threadIdx.x] += sh[threadIdx.x + s];
		__syncthreads();
	}
	V r = sh[0];
	__syncthreads();
	return r;
}

__device__ float block_max(float v, float *sh)
{
	sh[threadIdx.x] = v;
	__syncthreads();
	for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s)
			sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
		__syncthreads();
	}
	float r = sh[0];
	__syncthreads();
	return r;
}

/* ---- cross entropy family: one block per row ---- */

#define XENT_THREADS 128

__global__ void k_xent_rows(int op, float *o, const float *x, const int32_t *y, int64_t rows,
			    int64_t classes, float scale, double *scratch, CuScalars *sc)
{
	__shared__ double shd[XENT_THREADS];
	__shared__ float shf[XENT_THREADS];
	__shared__ int64_t shi[XENT_THREADS];
	int64_t r = blockIdx.x;
	const float *row = x + r * classes;
	int32_t label = y[r];
	if (label >= classes) {
		if (threadIdx.x == 0 && atomicCAS(&sc->err, 0, 1) == 0) {
			sc->err_label = label;
			sc->err_row = r;
			sc->err_classes = classes;
		}
		label = -1; /* the step fails when the backend reads err */
	}
	if (op == DPK_CORRECT) {
		/* argmax, first maximum wins (the CPU's `row[j] > row[best]`) */
		float bv = -INFINITY;
		int64_t bi = classes;
		for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
			if (bi == classes || row[j] > bv) {
				bv = row[j];
				bi = j;
			}
		shf[threadIdx.x] = bv;
		shi[threadIdx.x] = bi;
		__syncthreads();
		for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
			if (threadIdx.x < s) {
				float v2 = shf[threadIdx.x + s];
				int64_t i2 = shi[threadIdx.x + s];
				if (i2 < classes && (shi[threadIdx.x] == classes ||
						     v2 > shf[threadIdx.x] ||
						     (v2 == shf[threadIdx.x] && i2 < shi[threadIdx.x]))) {
					shf[threadIdx.x] = v2;
					shi[threadIdx.x] = i2;
				}
			}
			__syncthreads();
		}
		if (threadIdx.x == 0) {
			scratch[r] = label >= 0 && shi[0] == label;
			scratch[rows + r] = label >= 0;
		}
		return;
	}
	if (label < 0) {
		if (op == DPK_XENT_GRAD)
			for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
				o[r * classes + j] = 0;
		else if (threadIdx.x == 0)
			scratch[r] = 0;
		return;
	}
	float mx = -INFINITY;
	for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
		mx = fmaxf(mx, row[j]);
	mx = block_max(mx, shf);
	double sum = 0;
	for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
		sum += exp((double)row[j] - mx);
	sum = block_sum<double>(sum, shd);
	if (op == DPK_XENT) {
		if (threadIdx.x == 0)
			scratch[r] = log(sum) + mx - row[label]; /* -log p(label) */
		return;
	}
	double sc2 = scale;
	for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
		o[r * classes + j] = (float)(sc2 * (exp((double)row[j] - mx) / sum - (j == label)));
}

/* One block: the per-row values in a fixed order. */
__global__ void k_xent_sum(int op, float *o, int64_t rows, float scale, const double *scratch)
{
	__shared__ double sh[THREADS];
	double a = 0, b = 0;
	for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
		a += scratch[r];
		if (op == DPK_CORRECT)
			b += scratch[rows + r];
	}
	a = block_sum<double>(a, sh);
	b = block_sum<double>(b, sh);
	if (threadIdx.x == 0) {
		if (op == DPK_CORRECT) {
			o[0] = (float)a;
			o[1] = (float)b;
		} else {
			o[0] = (float)((double)scale * a);
		}
	}
}

/* scratch: 2 * rows doubles (per-row values, then the single-block sum reads them) */
static size_t xent_scratch(const DpStep *s, const DpInstr *in)
{
	return 2 * (size_t)rows_of(&s->tensors[in->in[0]]);
}

static int run_xent(const CuArgs *a, RtErr *e)
{
	int op = a->in->op;
	int64_t rows = rows_of(tensor(a, 0)), classes = cols_of(tensor(a, 0));
	if (rows > 0) {
		CU_LAUNCH(k_xent_rows, (unsigned)rows, XENT_THREADS, a->st, op, addr(a, -1), addr(a, 0),
			  (const int32_t *)addr(a, 1), rows, classes, a->in->fa[0], a->scratch, a->sc);
		LAUNCHED(a, e);
	}
	if (op == DPK_XENT_GRAD)
		return 0;
	CU_LAUNCH(k_xent_sum, 1, THREADS, a->st, op, addr(a, -1), rows, a->in->fa[0], a->scratch);
	LAUNCHED(a, e);
	return 0;
}

/* ---- norms, clipping ---- */

__global__ void k_sqnorm_part(const float *a, int64_t n, double *part)
{
	__shared__ double sh[THREADS];
	double s = 0;
	FOR_EACH(i, n)
		s += (double)a[i] * a[i];
	s = block_sum<double>(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void k_sqnorm_sum(float *o, const double *part, int accumulate, float w)
{
	__shared__ double sh[THREADS];
	double s = 0;
	for (int i = threadIdx.x; i < CU_REDUCE_BLOCKS; i += blockDim.x)
		s += part[i];
	s = block_sum<double>(s, sh);
	if (threadIdx.x == 0)
		o[0] = (float)(accumulate ? (double)o[0] + w * s : w * s);
}

/* o[0] = w * sum a^2 (+ o[0] if ia2): always CU_REDUCE_BLOCKS blocks (idle
 * ones write 0), a fixed tree */
static int run_sqnorm(const CuArgs *a, RtErr *e)
{
	CU_LAUNCH(k_sqnorm_part, CU_REDUCE_BLOCKS, THREADS, a->st, addr(a, 0), numel(tensor(a, 0)),
		  a->scratch);
	LAUNCHED(a, e);
	CU_LAUNCH(k_sqnorm_sum, 1, THREADS, a->st, addr(a, -1), a->scratch, a->in->ia[2] != 0,
		  a->in->fa[0] != 0 ? a->in->fa[0] : 1.0f);
	LAUNCHED(a, e);
	return 0;
}

__global__ void k_sqrt(float *o, const float *a)
{
	o[0] = sqrtf(a[0]);
}

static int run_sqrt(const CuArgs *a, RtErr *e)
{
	CU_LAUNCH(k_sqrt, 1, 1, a->st, addr(a, -1), addr(a, 0));
	LAUNCHED(a, e);
	return 0;
}

/* torch.nn.utils.clip_grad_norm_: scale only when the coefficient is < 1 */
__global__ void k_clip(float *o, int64_t n, const float *norm, float max_norm)
{
	float coef = max_norm / (norm[0] + 1e-6f);
	if (coef >= 1.0f)
		return;
	FOR_EACH(i, n)
		o[i] *= coef;
}

static int run_clip(const CuArgs *a, RtErr *e)
{
	int64_t n = numel(tensor(a, -1));
	if (n <= 0)
		return 0;
	CU_LAUNCH(k_clip, grid_for(n), THREADS, a->st, addr(a, -1), n, addr(a, 0), a->in->fa[0]);
	LAUNCHED(a, e);
	return 0;
}

/* ---- optimizers (the CPU's PyTorch 1.13 formulas, operation for operation) ---- */

__global__ void k_sgd(float *p, const float *g, float *buf, int64_t n, float mom, float wd,
		      const CuScalars *sc)
{
	float lr = sc->lr;
	int64_t t = sc->t;
	FOR_EACH(i, n) {
		float gi = g[i];
		if (wd != 0)
			gi = gi + wd * p[i];
		if (mom != 0) {
			buf[i] = t <= 1 ? gi : mom * buf[i] + gi;
			gi = buf[i];
		}
		p[i] = p[i] - lr * gi;
	}
}

static int run_sgd(const CuArgs *a, RtErr *e)
{
	int64_t n = numel(tensor(a, -1));
	if (n <= 0)
		return 0;
	CU_LAUNCH(k_sgd, grid_for(n), THREADS, a->st, addr(a, -1), addr(a, 0), addr(a, 1), n, a->in->fa[0],
		  a->in->fa[1], a->sc);
	LAUNCHED(a, e);
	return 0;
}

__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float beta1,
			float beta2, float eps, const CuScalars *sc)
{
	float decay = sc->opt_k[ADAM_DECAY], step_size = sc->opt_k[ADAM_STEP_SIZE];
	float bc2_sqrt = sc->opt_k[ADAM_BC2_SQRT];
	/* the CPU: (float)(1.0 - b1) with b1 the double of the float beta1 */
	float one_b1 = (float)(1.0 - (double)beta1), one_b2 = (float)(1.0 - (double)beta2);
	FOR_EACH(i, n) {
		float gi = g[i];
		p[i] *= decay;
		m[i] = m[i] * beta1 + one_b1 * gi;
		v[i] = v[i] * beta2 + one_b2 * (gi * gi);
		float denom = sqrtf(v[i]) / bc2_sqrt + eps;
		p[i] += (-step_size * m[i]) / denom;
	}
}

static int run_adamw(const CuArgs *a, RtErr *e)
{
	int64_t n = numel(tensor(a, -1));
	const DpOptim *o = &a->s->opt;
	if (n <= 0)
		return 0;
	CU_LAUNCH(k_adamw, grid_for(n), THREADS, a->st, addr(a, -1), addr(a, 0), addr(a, 1), addr(a, 2), n,
		  o->beta1, o->beta2, o->eps, a->sc);
	LAUNCHED(a, e);
	return 0;
}

/* ---- the table ---- */

static CuKernelTable make_table()
{
	CuKernelTable t = {};
	/* run, limits, scratch, blas */
	t.k[DPK_NOP] = {run_nop, NULL, NULL, 0};
	t.k[DPK_FILL] = {run_fill, NULL, NULL, 0};
	t.k[DPK_COPY] = {run_copy, limit_copy, NULL, 0};
	t.k[DPK_ACCUM] = {run_elementwise<Accum>, NULL, NULL, 0};
	t.k[DPK_SCALE] = {run_elementwise<Scale>, NULL, NULL, 0};
	t.k[DPK_MATMUL] = {run_matmul, limit_gemm, NULL, 1};
	t.k[DPK_LINEAR] = {run_linear, limit_gemm, NULL, 1};
	t.k[DPK_BIAS_ADD] = {run_bias_add, NULL, NULL, 0};
	t.k[DPK_BIAS_GRAD] = {run_bias_grad, NULL, NULL, 0};
	t.k[DPK_ADD] = {run_elementwise<Add>, NULL, NULL, 0};
	t.k[DPK_MUL] = {run_elementwise<Mul>, NULL, NULL, 0};
	t.k[DPK_RELU] = {run_elementwise<Relu>, NULL, NULL, 0};
	t.k[DPK_RELU_GRAD] = {run_elementwise<ReluGrad>, NULL, NULL, 0};
	t.k[DPK_GELU] = {run_elementwise<Gelu>, NULL, NULL, 0};
	t.k[DPK_GELU_GRAD] = {run_elementwise<GeluGrad>, NULL, NULL, 0};
	t.k[DPK_TANH] = {run_elementwise<Tanh>, NULL, NULL, 0};
	t.k[DPK_TANH_GRAD] = {run_elementwise<TanhGrad>, NULL, NULL, 0};
	t.k[DPK_XENT] = {run_xent, NULL, xent_scratch, 0};
	t.k[DPK_XENT_GRAD] = {run_xent, NULL, NULL, 0};
	t.k[DPK_CORRECT] = {run_xent, NULL, xent_scratch, 0};
	t.k[DPK_SQNORM] = {run_sqnorm, NULL, NULL, 0};
	t.k[DPK_SQRT] = {run_sqrt, NULL, NULL, 0};
	t.k[DPK_CLIP] = {run_clip, NULL, NULL, 0};
	t.k[DPK_SGD] = {run_sgd, NULL, NULL, 0};
	t.k[DPK_ADAMW] = {run_adamw, NULL, NULL, 0};
	return t;
}

extern "C" const CuKernelTable cu_kernel_table = make_table();
