/*
 * kernels.cu - the CUDA backend's own kernels: one per DP_KERNELS compute
 * opcode that is not a GEMM (MATMUL and LINEAR go to cuBLAS in exec_cuda.c),
 * plus the per-step schedule kernel and the watchdog's progress mark.
 *
 * runtime/cpu.c is the reference; each kernel says where it differs in
 * rounding. Layout: a tensor [a, b, c] is a row-major [a*b, c] matrix.
 * Elementwise kernels are grid-stride loops over int64 indices. Reductions
 * have a fixed launch shape and a fixed combination tree, so results do not
 * depend on scheduling: two runs, or a graph replay and an eager run, are
 * bitwise equal. fp32 only (bf16 is not implemented yet).
 */
#include <math.h>

#include "kernels.h"

#define THREADS 256

static unsigned grid_for(int64_t n)
{
	int64_t b = (n + THREADS - 1) / THREADS;
	return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#define FOR_EACH(i, n) \
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (int64_t)gridDim.x * blockDim.x)

/* ---- per-step scalars ---- */

/* dpexec.c's schedule_lr for step k, then the constants AdamW derives from
 * lr and t exactly as cpu.c computes them (double, then rounded to float). */
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
	sc->adam_decay = (float)(1.0 - lrd * opt.weight_decay);
	sc->adam_step_size = (float)(lrd / (1.0 - pow((double)opt.beta1, t)));
	sc->adam_bc2_sqrt = (float)sqrt(1.0 - pow((double)opt.beta2, t));
}

__global__ void k_step_advance(CuScalars *sc)
{
	sc->step++;
}

extern "C" cudaError_t cu_k_sched(cudaStream_t st, CuScalars *sc, DpOptim opt, DpSched sched,
				  uint32_t cfg_steps)
{
	k_sched<<<1, 1, 0, st>>>(sc, opt, sched, cfg_steps);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_step_advance(cudaStream_t st, CuScalars *sc)
{
	k_step_advance<<<1, 1, 0, st>>>(sc);
	return cudaGetLastError();
}

/* ---- elementwise ---- */

template <typename T> __global__ void k_fill(T *o, int64_t n, T v)
{
	FOR_EACH(i, n)
		o[i] = v;
}

extern "C" cudaError_t cu_k_fill_f32(cudaStream_t st, float *o, int64_t n, float v)
{
	if (n <= 0)
		return cudaSuccess;
	k_fill<float><<<grid_for(n), THREADS, 0, st>>>(o, n, v);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_fill_i32(cudaStream_t st, int32_t *o, int64_t n, int32_t v)
{
	if (n <= 0)
		return cudaSuccess;
	k_fill<int32_t><<<grid_for(n), THREADS, 0, st>>>(o, n, v);
	return cudaGetLastError();
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

template <int OP> __global__ void k_elementwise(float *o, const float *a, const float *b,
						int64_t n, float fa0)
{
	FOR_EACH(i, n) {
		switch (OP) {
		case DPK_ACCUM:
			o[i] += a[i];
			break;
		case DPK_SCALE:
			o[i] = fa0 * a[i];
			break;
		case DPK_ADD:
			o[i] = a[i] + b[i];
			break;
		case DPK_MUL:
			o[i] = a[i] * b[i];
			break;
		case DPK_RELU:
			o[i] = a[i] > 0 ? a[i] : 0;
			break;
		case DPK_RELU_GRAD:
			o[i] = b[i] > 0 ? a[i] : 0;
			break;
		case DPK_GELU: {
			float x = a[i];
			o[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));
			break;
		}
		case DPK_GELU_GRAD: {
			float x = b[i];
			float th = tanhf(GELU_S * (x + 0.044715f * x * x * x));
			float du = GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
			o[i] = a[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
			break;
		}
		case DPK_TANH:
			o[i] = tanhf(a[i]);
			break;
		case DPK_TANH_GRAD:
			o[i] = a[i] * (1.0f - b[i] * b[i]);
			break;
		}
	}
}

extern "C" cudaError_t cu_k_elementwise(cudaStream_t st, int op, float *o, const float *a,
					const float *b, int64_t n, float fa0)
{
	if (n <= 0)
		return cudaSuccess;
	unsigned g = grid_for(n);
	switch (op) {
#define CASE(k)                                                           \
	case k:                                                           \
		k_elementwise<k><<<g, THREADS, 0, st>>>(o, a, b, n, fa0); \
		break;
	CASE(DPK_ACCUM)
	CASE(DPK_SCALE)
	CASE(DPK_ADD)
	CASE(DPK_MUL)
	CASE(DPK_RELU)
	CASE(DPK_RELU_GRAD)
	CASE(DPK_GELU)
	CASE(DPK_GELU_GRAD)
	CASE(DPK_TANH)
	CASE(DPK_TANH_GRAD)
#undef CASE
	default:
		return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}

__global__ void k_bias_add(float *o, const float *a, const float *bias, int64_t n, int64_t c)
{
	FOR_EACH(i, n)
		o[i] = a[i] + bias[i % c];
}

extern "C" cudaError_t cu_k_bias_add(cudaStream_t st, float *o, const float *a, const float *bias,
				     int64_t n, int64_t c)
{
	if (n <= 0)
		return cudaSuccess;
	k_bias_add<<<grid_for(n), THREADS, 0, st>>>(o, a, bias, n, c);
	return cudaGetLastError();
}

__global__ void k_bias_rows(float *o, const float *bias, int64_t n, int64_t cols)
{
	FOR_EACH(i, n)
		o[i] = bias[i % cols];
}

extern "C" cudaError_t cu_k_bias_rows(cudaStream_t st, float *o, const float *bias, int64_t rows,
				      int64_t cols)
{
	int64_t n = rows * cols;
	if (n <= 0)
		return cudaSuccess;
	k_bias_rows<<<grid_for(n), THREADS, 0, st>>>(o, bias, n, cols);
	return cudaGetLastError();
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

extern "C" cudaError_t cu_k_bias_grad(cudaStream_t st, float *o, const float *a, int64_t rows,
				      int64_t c, int accumulate)
{
	if (c <= 0)
		return cudaSuccess;
	k_bias_grad<<<grid_for(c), THREADS, 0, st>>>(o, a, rows, c, accumulate);
	return cudaGetLastError();
}

/* ---- block reductions with a fixed tree ---- */

template <typename T> __device__ T block_sum(T v, T *sh)
{
	sh[threadIdx.x] = v;
	__syncthreads();
	for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s)
			sh[threadIdx.x] += sh[threadIdx.x + s];
		__syncthreads();
	}
	T r = sh[0];
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
		label = -1; /* the step fails when the executor reads err */
	}
	if (op == DPK_CORRECT) {
		/* argmax, first maximum wins (cpu.c's `row[j] > row[best]`) */
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
			scratch[r] = log(sum) + mx - row[label]; /* -log softmax */
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

extern "C" cudaError_t cu_k_xent(cudaStream_t st, int op, float *o, const float *x,
				 const int32_t *y, int64_t rows, int64_t classes, float scale,
				 double *scratch, CuScalars *sc)
{
	if (rows <= 0) {
		if (op == DPK_XENT_GRAD)
			return cudaSuccess;
		k_xent_sum<<<1, THREADS, 0, st>>>(op, o, 0, scale, scratch);
		return cudaGetLastError();
	}
	k_xent_rows<<<(unsigned)rows, XENT_THREADS, 0, st>>>(op, o, x, y, rows, classes, scale,
							     scratch, sc);
	cudaError_t err = cudaGetLastError();
	if (err != cudaSuccess || op == DPK_XENT_GRAD)
		return err;
	k_xent_sum<<<1, THREADS, 0, st>>>(op, o, rows, scale, scratch);
	return cudaGetLastError();
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

extern "C" cudaError_t cu_k_sqnorm(cudaStream_t st, float *o, const float *a, int64_t n,
				   int accumulate, float w, double *scratch)
{
	/* always CU_REDUCE_BLOCKS blocks (idle ones write 0): a fixed tree */
	k_sqnorm_part<<<CU_REDUCE_BLOCKS, THREADS, 0, st>>>(a, n, scratch);
	cudaError_t err = cudaGetLastError();
	if (err != cudaSuccess)
		return err;
	k_sqnorm_sum<<<1, THREADS, 0, st>>>(o, scratch, accumulate, w);
	return cudaGetLastError();
}

__global__ void k_sqrt(float *o, const float *a)
{
	o[0] = sqrtf(a[0]);
}

extern "C" cudaError_t cu_k_sqrt(cudaStream_t st, float *o, const float *a)
{
	k_sqrt<<<1, 1, 0, st>>>(o, a);
	return cudaGetLastError();
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

extern "C" cudaError_t cu_k_clip(cudaStream_t st, float *o, int64_t n, const float *norm,
				 float max_norm)
{
	if (n <= 0)
		return cudaSuccess;
	k_clip<<<grid_for(n), THREADS, 0, st>>>(o, n, norm, max_norm);
	return cudaGetLastError();
}

/* ---- optimizers (cpu.c's PyTorch 1.13 formulas, operation for operation) ---- */

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

extern "C" cudaError_t cu_k_sgd(cudaStream_t st, float *p, const float *g, float *buf, int64_t n,
				float momentum, float weight_decay, const CuScalars *sc)
{
	if (n <= 0)
		return cudaSuccess;
	k_sgd<<<grid_for(n), THREADS, 0, st>>>(p, g, buf, n, momentum, weight_decay, sc);
	return cudaGetLastError();
}

__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float beta1,
			float beta2, float eps, const CuScalars *sc)
{
	float decay = sc->adam_decay, step_size = sc->adam_step_size, bc2_sqrt = sc->adam_bc2_sqrt;
	/* cpu.c: (float)(1.0 - b1) with b1 the double of the float beta1 */
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

extern "C" cudaError_t cu_k_adamw(cudaStream_t st, float *p, const float *g, float *m, float *v,
				  int64_t n, float beta1, float beta2, float eps,
				  const CuScalars *sc)
{
	if (n <= 0)
		return cudaSuccess;
	k_adamw<<<grid_for(n), THREADS, 0, st>>>(p, g, m, v, n, beta1, beta2, eps, sc);
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
	k_mark<<<1, 1, 0, st>>>(slot, value);
	return cudaGetLastError();
}
