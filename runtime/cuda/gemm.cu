/*
 * gemm.cu - the CUDA kernels of matrix products (the CPU's
 * runtime/cpu/gemm.c): matmul and linear through cuBLAS, and linear's bias
 * gradient as a two-stage column sum.
 *
 * matmul, linear: cublasGemmEx, fp32 in and out; or bf16 operands
 * (CUDA_R_16BF) with fp32 compute (CUBLAS_COMPUTE_32F) writing bf16 rounded
 * once to nearest even, or fp32 (a weight gradient accumulated with beta =
 * 1): the CPU's oneDNN matmul does the same (runtime/cpu/gemm_bf16.c), in
 * another summation order. A bf16 linear's bias rows are bf16 copies of the
 * bf16 bias (exact), then the product is added to them in fp32 and rounded
 * once. TF32 applies to fp32 operands only. Row-major C[m,n] = op(A)
 * op(B) (+ beta C) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first
 * with the same transpose flags. Compute type CUBLAS_COMPUTE_32F (full fp32
 * FMA), or CUBLAS_COMPUTE_32F_FAST_TF32 when the step file says `precision
 * tf32` (tensor cores with 10-bit mantissa inputs: ~1e-3 relative per
 * product, so a tf32 run agrees with the CPU only loosely). cuBLAS sums a
 * dot product in its own order (blocked, split differently per shape and
 * GPU), OpenBLAS in another: fp32 results differ from the CPU by ~1e-6
 * relative (a few ulp times sqrt(k)). cuBLAS is bitwise reproducible run to
 * run on one GPU model with a fixed workspace (set once per handle), so
 * graph == eager. linear first writes the bias into every output row, then
 * beta = 1, as the CPU does.
 *
 * bias_grad: out[c] = sum_r in0[r, c] (+ out) by cu_colsum (device.cuh):
 * chunks of rows summed in double per column, then the chunks in order,
 * added to the output (or 0), rounded once. The CPU sums the rows in order in
 * double: the two differ only in the double rounding of the partial sums
 * (~1e-16 relative), which the final float rounding almost always hides
 * (<= 1 ulp). Before, one thread per column walked every row: 24 blocks
 * for d = 768; now about 1024 blocks read the gradient once, coalesced.
 */
#include "device.cuh"

/* m, k, n of out = op(in0) @ op(in1) (ia0, ia1: transpose flags; linear: none). */
static void gemm_dims(const DpStep *s, const DpInstr *in, int64_t *m, int64_t *k, int64_t *n)
{
	const DpTensor *a = &s->tensors[in->in[0]], *b = &s->tensors[in->in[1]];
	int ta = in->op == DPK_MATMUL && in->ia[0], tb = in->op == DPK_MATMUL && in->ia[1];
	*m = ta ? cu_cols(a) : cu_rows(a);
	*k = ta ? cu_rows(a) : cu_cols(a);
	*n = tb ? cu_rows(b) : cu_cols(b);
}

/* cuBLAS takes int sizes and leading dimensions. */
static int limit_gemm(const DpStep *s, const DpInstr *in, RtErr *e)
{
	int64_t m, k, n;
	gemm_dims(s, in, &m, &k, &n);
	int64_t la = cu_cols(&s->tensors[in->in[0]]), lb = cu_cols(&s->tensors[in->in[1]]);
	if (m > INT_MAX || k > INT_MAX || n > INT_MAX || la > INT_MAX || lb > INT_MAX)
		return RT_FAIL(e, "step file: %s '%s': a %lld x %lld x %lld product is too large for "
			       "cuBLAS (int sizes)", dp_kernel_names[in->op],
			       dpstep_str(s, s->tensors[in->out].name), (long long)m, (long long)k,
			       (long long)n);
	return 0;
}

static int gemm(const CuArgs *a, float beta, RtErr *e)
{
	const DpTensor *ta_ = cu_t(a, 0), *tb_ = cu_t(a, 1);
	int ta = a->in->op == DPK_MATMUL && a->in->ia[0], tb = a->in->op == DPK_MATMUL && a->in->ia[1];
	int64_t m, k, n;
	gemm_dims(a->s, a->in, &m, &k, &n);
	int64_t ca = cu_cols(ta_), cb = cu_cols(tb_);
	const float one = 1.0f;
	/* bf16 operands (both alike: the decoder's rule) with f32 compute; the
	 * output bf16 (rounded once) or f32 (a weight gradient, `acc`) */
	cudaDataType_t ab = ta_->dtype == DP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
	cudaDataType_t c = cu_t(a, -1)->dtype == DP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
	if (m == 0 || n == 0)
		return 0;
	cublasStatus_t st = cublasGemmEx(
		a->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
		(int)k, &one, cu_p(a, 1), ab, (int)(cb ? cb : 1), cu_p(a, 0), ab, (int)(ca ? ca : 1),
		&beta, cu_p(a, -1), c, (int)n,
		a->tf32 && ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
		CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS)
		return RT_FAIL(e, "%s: cublasGemmEx (%lld x %lld x %lld%s): %s",
			       dp_kernel_names[a->in->op], (long long)m, (long long)k, (long long)n,
			       a->tf32 ? ", tf32" : "", cublasGetStatusString(st));
	return 0;
}

static int run_matmul(const CuArgs *a, RtErr *e)
{
	return gemm(a, a->in->ia[2] ? 1.0f : 0.0f, e);
}

/* o[r, :] = bias for every row: linear's start before beta = 1 (T: float,
 * or cu_bf16 when linear is bf16: bias and output alike, an exact copy) */
template <typename T>
__global__ void k_bias_rows(T *o, const T *bias, int64_t rows, int64_t cols)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
			o[r * cols + j] = bias[j];
}

static int run_linear(const CuArgs *a, RtErr *e)
{
	float beta = 0;
	int64_t rows = cu_rows(cu_t(a, 0)), cols = cu_cols(cu_t(a, -1));
	if (a->in->in[2] >= 0 && rows * cols > 0) {
		unsigned grid = (unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID);
		if (cu_t(a, -1)->dtype == DP_BF16)
			CU_LAUNCH(k_bias_rows<cu_bf16>, grid, cu_row_threads(cols), a->st,
				  (cu_bf16 *)cu_p(a, -1), (const cu_bf16 *)cu_p(a, 2), rows, cols);
		else
			CU_LAUNCH(k_bias_rows<float>, grid, cu_row_threads(cols), a->st, cu_f(a, -1),
				  cu_f(a, 2), rows, cols);
		CU_LAUNCHED(a, e);
		beta = 1;
	}
	return gemm(a, beta, e);
}

/* ---- bias_grad: two-stage column sums in double ---- */

/* term(r, j) = in0[r, j] */
struct BiasTerm {
	const float *x;
	int64_t c;
	__device__ double operator()(int64_t r, int64_t j) const { return ld(x + r * c + j); }
};

static size_t scratch_bias_grad(const DpStep *s, const DpInstr *in)
{
	int64_t c = cu_numel(&s->tensors[in->out]), rows = c ? cu_numel(&s->tensors[in->in[0]]) / c : 0;
	return (size_t)(cu_col_chunks(rows, c) * c) * sizeof(double);
}

static int run_bias_grad(const CuArgs *a, RtErr *e)
{
	int64_t c = cu_numel(cu_t(a, -1));
	if (c <= 0)
		return 0;
	BiasTerm term = {cu_f(a, 0), c};
	CU_OK(a, cu_colsum(a->st, term, cu_f(a, -1), cu_numel(cu_t(a, 0)) / c, c, a->in->ia[2] != 0,
			   (double *)a->scratch), e);
	return 0;
}

extern "C" void cu_gemm_rows(CuKernel *k)
{
	/* run, limits, scratch, blas, bf16 */
	k[DPK_MATMUL] = {run_matmul, limit_gemm, NULL, 1, 1};
	k[DPK_LINEAR] = {run_linear, limit_gemm, NULL, 1, 1};
	k[DPK_BIAS_GRAD] = {run_bias_grad, NULL, scratch_bias_grad, 0, 0};
}
