/*
 * gemm.cu - the CUDA kernels of matrix products (the CPU's
 * runtime/cpu/gemm.c): matmul and linear through cuBLASLt (and the fused
 * linear_gelu and matmul_gelu_grad, through its GELU epilogues), and
 * linear's bias gradient as a two-stage column sum.
 *
 * matmul, linear: cublasLtMatmul, one path for every dtype: fp32 operands
 * writing fp32, or bf16 operands (CUDA_R_16BF) or fp16 ones (CUDA_R_16F:
 * precision fp16) writing their own dtype rounded once to nearest even, or
 * fp32 (a weight gradient accumulated with beta = 1). A 16-bit product is
 * exact in fp32 (8 + 8 or 11 + 11 significant bits), so a 16-bit GEMM
 * computes what the fp32 GEMM on widened copies computes, in the library's
 * order, without the copies (f16 ran staged on such copies before).
 * Compute type CUBLAS_COMPUTE_32F (fp32 accumulation; for fp32 operands full
 * fp32 FMA), or CUBLAS_COMPUTE_32F_FAST_TF32 for fp32 operands when the step
 * file says `precision tf32` (tensor cores with 10-bit mantissa inputs: ~1e-3
 * relative per product); scale type fp32. The CPU's oneDNN (bf16) and
 * OpenBLAS (fp32) do the same in another summation order. Row-major C[m,n]
 * = op(A) op(B) (+ beta C) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's
 * A is our in1 and its B our in0, with the same transpose flags; a row-major
 * [r, c] tensor is a column-major c x r matrix with leading dimension c.
 *
 * Everything about a call is decided at load, before any capture
 * (cu_plan_gemm, from the backend's planning step): the descriptors, and the
 * algorithm from cublasLtMatmulAlgoGetHeuristic told the operands' real
 * alignment (MIN_ALIGNMENT_*: cuBLASLt assumes 256 bytes otherwise, and views
 * into flat buffers are often less aligned) and the stream's workspace size.
 * A run only enqueues cublasLtMatmul with that algorithm, the stream's
 * workspace and the operands' addresses (checked to be as aligned as
 * planned). One algorithm per instruction and a fixed workspace: cuBLASLt is
 * bitwise reproducible run to run on one GPU model, so graph == eager.
 *
 * One rounding. A 16-bit output must be the fp32 result rounded once: the
 * heuristic may pick only split-K schemes that reduce in the compute type
 * (REDUCTION_SCHEME_MASK = COMPUTE_TYPE; INPLACE and OUTPUT_TYPE add
 * partial sums in the output type, bf16 or fp16). fp32 outputs allow every scheme
 * (every partial sum is fp32 anyway).
 *
 * linear's bias: CUBLASLT_EPILOGUE_BIAS, in fp32, bf16 and fp16 alike, when the
 * bias is 16-byte aligned. The bias has D's type (cuBLASLt's rule for
 * CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) and is "added before applying final
 * postprocessing" (cublasLt.h): to the finished fp32 accumulator, before the
 * one rounding to D's type. That is the arithmetic of the bias rows below
 * with beta = 1 (C converted to fp32, added to the product, rounded once),
 * so the numerics are unchanged, without the kernel that writes the rows
 * and without reading C. cuBLASLt's heuristic sees the bias pointer, but
 * kernels have faulted on an under-aligned bias anyway (PyTorch falls back
 * below 16 bytes too): a less aligned bias, a product with k = 0, or a
 * heuristic with no algorithm for the epilogue on this GPU copies the bias
 * into every output row (exact) and adds the product with beta = 1.
 *
 * linear_gelu, matmul_gelu_grad (passes/fuse.c): the same call with
 * cuBLASLt's GELU epilogues. linear_gelu's output is [2, rows, n]: D is its
 * second half, gelu(product + bias), and the aux its first, the
 * pre-activation (CUBLASLT_EPILOGUE_GELU_AUX_BIAS, GELU_AUX without a bias);
 * matmul_gelu_grad's D is product * gelu'(aux) with in2 the aux
 * (CUBLASLT_EPILOGUE_DGELU). cublasLt.h: the aux has D's type (the default
 * of EPILOGUE_AUX_DATA_TYPE), its leading dimension (n) a multiple of 8 and
 * at least D's rows; like the bias it is read 16 bytes at a time. Where that
 * does not hold, or the heuristic has no algorithm with the epilogue, the
 * product runs alone and a kernel of elementwise.cu applies the gelu
 * (plain_gelu): in f32 the unfused kernels' arithmetic, in bf16 and fp16
 * from the product kept in f32 (a buffer of the plan), rounded once, as the
 * epilogue. DGELU_BGRAD is not used: its bias gradient has D's type (16-bit
 * in a bf16 or fp16 step, rounded twice); the BGRADA pairing below sums dh
 * in f32.
 *
 * bias_grad from the weight gradient's matmul: autodiff gives a linear's
 * weight gradient as `matmul X, dY transA` and its bias gradient as
 * `bias_grad dY`, the column sums of the same dY. In cuBLASLt's column-major
 * form dY is A (out x rows, op N) and the reduction over k = rows is
 * CUBLASLT_EPILOGUE_BGRADA ("bias size = rows of D, reduced over k": what
 * row-major writers such as PyTorch call BGRADB): the matmul writes the sums
 * while it reads dY anyway, and the bias_grad only adds them into its
 * output. cu_plan_gemm pairs them at load: the first bias_grad after the
 * matmul in its program reading the same dY, on the same stream (stream
 * order makes the sums visible), under the same DP_IF_LAST condition, with
 * nothing between writing dY, both outputs f32 (the bias gradient has C's
 * type, cuBLASLt's rule; a bf16 one would be rounded twice, so it keeps the
 * column sum). The epilogue overwrites its vector, a gradient accumulates:
 * the sums go to a vector of their own (device memory from the planner) and
 * the bias_grad adds it to its output, or stores it (no acc). A heuristic
 * with no algorithm for the epilogue unpairs them. Numerics: cuBLASLt sums
 * in fp32 (in its own order) where cu_colsum sums in double: ~sqrt(rows)
 * ulp of f32 apart, within every tolerance of the CUDA cases (a few 1e-7
 * relative at 1024 rows).
 *
 * Tuning (dpexec --gemm-tune on|FILE; gemm.h; docs/CUDA.md "Choosing
 * cuBLASLt's algorithm by timing"): after the plan above and before any
 * capture, each distinct GEMM problem (tune_key: types, compute type,
 * transposes, layouts, epilogue, beta, the planned alignments, the
 * reduction-scheme rule) asks the heuristic for up to TUNE_CANDIDATES
 * algorithms under the same preference (alignments, the 32 MiB workspace,
 * COMPUTE_TYPE split-K for a 16-bit D), and rank 0 times the plan's own
 * first and each other one: a warm-up call, then TUNE_REPS calls between
 * two CUDA events, on the GEMM's stream and workspace, on scratch operands
 * (one cudaMalloc per problem, freed after it; the arena is never touched:
 * a weight gradient's beta = 1 would change it) of the planned extents
 * with each address's offset within 256 bytes kept (so the alignments the
 * algorithms assume hold), filled with a finite non-zero pattern. The
 * epilogue's vector and aux are pointed at the scratch for the timing and
 * back after. A candidate cuBLASLt refuses is skipped; another replaces
 * the first only when TUNE_MARGIN (2 %) faster, so noise does not move a
 * GEMM off the heuristic's choice; no scratch memory: the first stays.
 * GPT-2's 12 identical layers share their problems: each is timed once.
 * Determinism: an algorithm is chosen once per run, so every replay is
 * the same; across runs two candidates within noise may swap, which
 * --gemm-tune FILE pins (the algorithm's 64 bytes per problem, which
 * cuBLASLt documents as serialisable for the same library version; the
 * header names the library and the device, and a file of another is
 * refused naming FILE:1; a loaded algorithm must pass
 * cublasLtMatmulAlgoCheck). Ranks: rank 0 times and every rank takes its
 * choice (one all_ok bit at a time over the job): replicated compute
 * (tp, or a parameter's gradient computed alike on every replica) keeps
 * the same bits on every rank. Off is the default: the heuristic's first,
 * as before, the same bits every run without a file.
 *
 * bias_grad: out[c] = sum_r in0[r, c] (+ out) by cu_colsum (device.cuh):
 * chunks of rows summed in double per column, then the chunks in order,
 * added to the output (or 0), rounded once (to f32, or to bf16 for a bf16
 * output; a bf16 or f16 in0 is widened as it is read: no staging). The CPU sums the rows in order in
 * double: the two differ only in the double rounding of the partial sums
 * (~1e-16 relative), which the final float rounding almost always hides
 * (<= 1 ulp). Before, one thread per column walked every row: 24 blocks
 * for d = 768; now about 1024 blocks read the gradient once, coalesced.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../powersgd.h"
#include "device.cuh"
#include "gemm.h"

/* the tuner's name of a GEMM problem (tune_key), at most this long */
#define TUNE_KEY 240

/* One matmul or linear instruction's cuBLASLt call, made at load. */
struct CuGemm {
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t a, b, c; /* cuBLASLt's A (our in1), B (our in0), C = D (out) */
	cublasLtMatmulAlgo_t algo;
	float beta;                     /* 1: add to the output (acc, or the bias rows) */
	int bias_rows;                  /* linear: copy the bias into the rows first */
	int gelu_map;                   /* linear_gelu, matmul_gelu_grad without cuBLASLt's
	                                   GELU epilogue: the gelu kernel after the GEMM */
	float *tmp;                     /* ... in bf16, fp16: the f32 product it reads (D) */
	size_t d_off;                   /* bytes from the output to D: linear_gelu's second
	                                   half under GELU_AUX(_BIAS), else 0 */
	float *bgrad;                   /* matmul: BGRADA's column sums of cuBLASLt's A
	                                   (our in1) for a paired bias_grad; NULL: none */
	uint32_t align[5];              /* alignment planned for: A, B, C = D, bias, the
	                                   GELU epilogue's aux (bytes; 0: none) */
	int64_t row0, rows;             /* the output's rows (our m) this call writes: all, or
	                                   a part of a split weight gradient (vocab_split) */
	struct CuGemm *tail;            /* the split's last rows (a second call), or NULL */
	/* for the tuner (--gemm-tune): */
	char key[TUNE_KEY];             /* the problem, as the tuner tells GEMMs apart */
	int half_out;                   /* the heuristic's reduction-scheme rule (16-bit D) */
	uint32_t epi;                   /* the epilogue planned (CUBLASLT_EPILOGUE_*) */
	const void *at[5];              /* the addresses planned with: A, B, D, the epilogue's
	                                   vector, the GELU aux (NULL: none) ... */
	size_t bytes[5];                /* ... and the bytes from each that a call may touch */
};

/* The ops whose instruction is one cuBLASLt call (or vocab_split's two). */
static int is_gemm(unsigned op)
{
	return op == DP_OP_MATMUL || op == DP_OP_LINEAR || op == DP_OP_LINEAR_GELU ||
	       op == DP_OP_MATMUL_GELU_GRAD;
}

/* A matmul's transpose flags (matmul_gelu_grad's alike) and accumulate
 * flag; a linear (linear_gelu) has none. */
static int is_matmul(const DpInstr *in)
{
	return in->op == DP_OP_MATMUL || in->op == DP_OP_MATMUL_GELU_GRAD;
}

static int trans_a(const DpInstr *in)
{
	return is_matmul(in) && DP_ATTR(in, MATMUL, transA);
}

static int trans_b(const DpInstr *in)
{
	return is_matmul(in) && DP_ATTR(in, MATMUL, transB);
}

/* linear's (linear_gelu's) bias operand, or -1 */
static int bias_of(const DpInstr *in)
{
	return in->op == DP_OP_LINEAR || in->op == DP_OP_LINEAR_GELU ? in->in[2] : -1;
}

static int accumulates(const DpInstr *in)
{
	return in->op == DP_OP_MATMUL && DP_ATTR(in, MATMUL, acc);
}

/* m, k, n of out = op(in0) @ op(in1) (transA, transB; linear: none). */
static void gemm_dims(const DpStep *s, const DpInstr *in, int64_t *m, int64_t *k, int64_t *n)
{
	const DpTensor *a = &s->tensors[in->in[0]], *b = &s->tensors[in->in[1]];
	int ta = trans_a(in), tb = trans_b(in);
	*m = ta ? cu_cols(a) : cu_rows(a);
	*k = ta ? cu_rows(a) : cu_cols(a);
	*n = tb ? cu_rows(b) : cu_cols(b);
	/* the padded vocabulary (passes/padvocab.c): a pad_rows in1 has more rows
	 * than in0's columns, which in0's padding columns (zero) cover: k is the
	 * padded length (50304, not 50257). n is already in1's padded rows, the
	 * output's padding columns taking the products with its zero rows */
	int64_t k2 = tb ? cu_cols(b) : cu_rows(b);
	if (!ta && !tb && k2 > *k)
		*k = k2;
}

/* cuBLASLt supports sizes and leading dimensions that fit an int32. */
static int limit_gemm(const DpStep *s, const DpInstr *in, RtErr *e)
{
	int64_t m, k, n;
	gemm_dims(s, in, &m, &k, &n);
	int64_t la = dp_ld(&s->tensors[in->in[0]]), lb = dp_ld(&s->tensors[in->in[1]]);
	if (m > INT_MAX || k > INT_MAX || n > INT_MAX || la > INT_MAX || lb > INT_MAX ||
	    dp_ld(&s->tensors[in->out]) > INT_MAX)
		return RT_FAIL(e, "step file: %s '%s': a %lld x %lld x %lld product is too large for "
			       "cuBLASLt (int sizes)", dp_op_names[in->op],
			       dpstep_str(s, s->tensors[in->out].name), (long long)m, (long long)k,
			       (long long)n);
	return 0;
}

/* cuBLASLt's type of a GEMM operand of dtype dt */
static cudaDataType_t lt_type(unsigned dt)
{
	if (dt == DP_F16)
		return MUTANT(gemm_f16_type) ? CUDA_R_16BF : CUDA_R_16F;
	return dt == DP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* The largest power of two up to 256 that divides the address. */
static uint32_t align_of(const void *p)
{
	uint32_t r = 256;
	while (r > 1 && (uintptr_t)p % r)
		r /= 2;
	return r;
}

/* A cuBLASLt call made for instruction `in` of step s. */
#define LT(call)                                                                            \
	do {                                                                                \
		cublasStatus_t st_ = (call);                                                \
		if (st_ != CUBLAS_STATUS_SUCCESS)                                           \
			return RT_FAIL(e, "%s '%s': %s: %s", dp_op_names[in->op],        \
				       dpstep_str(s, s->tensors[in->out].name), #call,      \
				       cublasLtGetStatusString(st_));                       \
	} while (0)

static int set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t at,
		    uint32_t v)
{
	return cublasLtMatmulPreferenceSetAttribute(pref, at, &v, sizeof v) != CUBLAS_STATUS_SUCCESS;
}

/* The best algorithm for g's problem with these alignments, within the
 * stream's workspace (res and count are cleared first). */
static cublasStatus_t heuristic(cublasLtHandle_t lt, CuGemm *g, int half_out,
				cublasLtMatmulHeuristicResult_t *res, int want, int *count)
{
	memset(res, 0, (size_t)want * sizeof *res);
	*count = 0;
	cublasLtMatmulPreference_t pref = NULL;
	cublasStatus_t st = cublasLtMatmulPreferenceCreate(&pref);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st;
	uint64_t ws = CU_BLAS_WS_BYTES;
	st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
						  sizeof ws);
	if (st == CUBLAS_STATUS_SUCCESS &&
	    (set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
		      MUTANT(lt_align) ? 256 : g->align[0]) ||
	     set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g->align[1]) ||
	     set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g->align[2]) ||
	     set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g->align[2]) ||
	     (half_out && set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
				   CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE))))
		st = CUBLAS_STATUS_INVALID_VALUE;
	if (st == CUBLAS_STATUS_SUCCESS)
		st = cublasLtMatmulAlgoGetHeuristic(lt, g->op, g->a, g->b, g->c, g->c, pref, want, res,
						    count);
	cublasStatus_t st2 = cublasLtMatmulPreferenceDestroy(pref);
	return st != CUBLAS_STATUS_SUCCESS ? st : st2;
}

/* Set the epilogue (cuBLASLt's enum) with its vector and the vector's type. */
static cublasStatus_t set_epilogue(cublasLtMatmulDesc_t op, uint32_t epi, const void *vec,
				   int32_t type)
{
	cublasStatus_t st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
							   sizeof epi);
	if (st == CUBLAS_STATUS_SUCCESS && vec)
		st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
						    sizeof vec);
	if (st == CUBLAS_STATUS_SUCCESS && vec)
		st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type,
						    sizeof type);
	return st;
}

/* The GELU epilogues' aux matrix: the pre-activation, column-major with
 * leading dimension ld, of D's type (the default cublasLt.h gives
 * CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE). */
static cublasStatus_t set_aux(cublasLtMatmulDesc_t op, const void *aux, int64_t ld)
{
	cublasStatus_t st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
							   &aux, sizeof aux);
	if (st == CUBLAS_STATUS_SUCCESS)
		st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
						    sizeof ld);
	return st;
}

/* A fused GEMM (linear_gelu, matmul_gelu_grad) without cuBLASLt's GELU
 * epilogue: the product, then a kernel of elementwise.cu. f32: the product
 * (after linear_gelu's bias rows) into the output, then gelu or gelu_grad,
 * the unfused kernels' arithmetic. bf16, fp16: the product in f32 into a buffer of
 * the plan (D), then k_gelu_finish adds the bias, applies the gelu and
 * rounds each output once: the epilogues' arithmetic, which the CPU's
 * staged f32 kernels also compute (runtime/cpu/gemm.c). */
static int plain_gelu(CuPlan *p, const DpInstr *in, CuGemm *g, int64_t m, int64_t n,
		      const void *po, const void *pbias, RtErr *e)
{
	const DpStep *s = p->s;
	g->gelu_map = 1;
	g->d_off = 0;
	g->align[3] = g->align[4] = 0;
	if (!dp_is_half(s->tensors[in->out].dtype)) {
		g->bias_rows = pbias != NULL;
		g->beta = pbias ? 1.0f : 0.0f;
		g->align[2] = align_of(po);
		return 0;
	}
	g->bias_rows = 0;
	g->beta = 0.0f;
	if (!g->tmp)
		g->tmp = (float *)p->alloc(p, (size_t)(m * n) * sizeof(float));
	if (!g->tmp)
		return RT_FAIL(e, "out of device memory (the f32 product of '%s')",
			       dpstep_str(s, s->tensors[in->out].name));
	g->align[2] = align_of(g->tmp);
	if (g->c)
		LT(cublasLtMatrixLayoutDestroy(g->c));
	g->c = NULL;
	LT(cublasLtMatrixLayoutCreate(&g->c, CUDA_R_32F, (uint64_t)n, (uint64_t)m, n));
	return 0;
}

/*
 * The LM head's weight gradient split in two calls: dw = dlogits^T x, with
 * m the vocabulary (GPT-2: 50257, odd) read from the padded logits
 * (passes/padvocab.c: in0's stride above its columns). cuBLASLt's heuristic
 * gave it an sm80 CUTLASS kernel on the H200 (2.46 ms, 516 TFLOP/s) where
 * the head's other two GEMMs, whose vocabulary size is the padded 50304,
 * ran sm90 kernels at 725-843 TFLOP/s. The parameter's gradient has the
 * user's rows and nothing past them (padvocab's reasons), so the rows are
 * not padded: the first m rounded down to a multiple of VOCAB_SPLIT rows
 * (50176) are one call with aligned sizes, the last m % VOCAB_SPLIT (81) a
 * second, small one (2 GFLOP of the 1265). Each output element is still one
 * dot product over k, computed by one call: only the kernel differs. The
 * result: the rows of the first part (0: no split).
 */
#define VOCAB_SPLIT 128

static int64_t vocab_split(const DpStep *s, const DpInstr *in, const CuFuse *fb)
{
	int64_t m, k, n;
	gemm_dims(s, in, &m, &k, &n);
	const DpTensor *tx = &s->tensors[in->in[0]];
	if (in->op != DP_OP_MATMUL || !trans_a(in) || trans_b(in) || fb || !k || !n ||
	    dp_ld(tx) == cu_cols(tx) || m % VOCAB_SPLIT == 0 || m < VOCAB_SPLIT)
		return 0;
	return m / VOCAB_SPLIT * VOCAB_SPLIT;
}

/* The operands of part g of instruction in's GEMM: in1 (A), in0 (B) and the
 * output (C = D) from their bases, moved to the part's first row. */
static void part_ptrs(const DpStep *s, const DpInstr *in, const CuGemm *g, const void *pa,
		      const void *pb, const void *pc, const void **a, const void **b, void **c)
{
	size_t eb = dp_dtype_size(s->tensors[in->in[0]].dtype);
	size_t ec = dp_dtype_size(s->tensors[in->out].dtype);
	*a = pa;
	/* a split is transA's: the output's rows are in0's columns */
	*b = (const char *)pb + (size_t)(MUTANT(vocab_split) ? 0 : g->row0) * eb;
	*c = (char *)pc + (size_t)(g->row0 * dp_ld(&s->tensors[in->out])) * ec;
}

/* Rows [row0, row0 + rows) of instruction in's output into g: its
 * descriptors and algorithm (freed by cu_gemm_free, also when this fails
 * half-way). fb: the fusion entry of the bias_grad paired with this matmul
 * (its column sums by BGRADA), or NULL; its bgrad is set when the epilogue
 * has an algorithm. */
static int plan_part(CuPlan *p, const DpInstr *in, CuGemm *g, CuFuse *fb, int64_t row0,
		     int64_t rows, RtErr *e)
{
	const DpStep *s = p->s;
	int64_t m, k, n;
	gemm_dims(s, in, &m, &k, &n);
	m = rows;
	g->row0 = row0;
	g->rows = rows;
	cublasLtHandle_t lt = p->blas[in->stream];
	if (!lt)
		return RT_FAIL(e, "internal error: %s '%s' on a stream without a cuBLASLt handle",
			       dp_op_names[in->op], dpstep_str(s, s->tensors[in->out].name));
	const DpTensor *tx = &s->tensors[in->in[0]], *tw = &s->tensors[in->in[1]];
	const void *px, *pw;
	void *po;
	part_ptrs(s, in, g, p->ptr[in->in[1]], p->ptr[in->in[0]], p->ptr[in->out], &pw, &px, &po);
	const void *pbias = bias_of(in) >= 0 ? p->ptr[bias_of(in)] : NULL;
	/* the GELU epilogues' aux: linear_gelu's first half (written), or
	 * matmul_gelu_grad's pre-activation in2 (read); NULL: a plain GEMM */
	int fwd_gelu = in->op == DP_OP_LINEAR_GELU, bwd_gelu = in->op == DP_OP_MATMUL_GELU_GRAD;
	const void *paux = fwd_gelu ? po : bwd_gelu ? p->ptr[in->in[2]] : NULL;
	int ta = trans_a(in), tb = trans_b(in);
	/* 16-bit operands (both alike: the decoder's rule) with f32 compute; the
	 * output theirs (rounded once) or f32 (a weight gradient, `acc`) */
	cudaDataType_t ab = lt_type(tx->dtype);
	cudaDataType_t c = lt_type(s->tensors[in->out].dtype);
	int tf32 = s->cfg.gemm_math == DP_GEMM_TF32 && ab == CUDA_R_32F;
	/* cublasLt.h: the aux's leading dimension a multiple of 8 (and >= D's
	 * rows, n: it is n); its pointer accessed 16 bytes at a time, as the
	 * bias's (the emulator faults below that) */
	int gelu_epi = paux && n % 8 == 0 && align_of(paux) >= 16 && (!pbias || align_of(pbias) >= 16);
	int epilogue = pbias && align_of(pbias) >= 16 && !paux;
	g->bias_rows = pbias && !epilogue && !paux; /* a fused one's: plain_gelu */
	g->gelu_map = paux && !gelu_epi;
	g->d_off = fwd_gelu && gelu_epi && !MUTANT(gelu_half)
			   ? (size_t)(m * n) * dp_dtype_size(s->tensors[in->out].dtype)
			   : 0;
	g->beta = g->bias_rows || accumulates(in) ? 1.0f : 0.0f;
	g->align[0] = align_of(pw);
	g->align[1] = align_of(px);
	g->align[2] = align_of((const char *)po + g->d_off);
	g->align[3] = epilogue ? align_of(pbias) : 0;
	g->align[4] = gelu_epi ? align_of(paux) : 0;

	LT(cublasLtMatmulDescCreate(&g->op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
				    CUDA_R_32F));
	int32_t opa = tb != MUTANT(gemm_trans) ? CUBLAS_OP_T : CUBLAS_OP_N;
	int32_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	LT(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
	LT(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
	if (gelu_epi) { /* D = gelu(product + bias), aux = product + bias; or D = product * gelu'(aux) */
		cublasLtEpilogue_t dgelu = MUTANT(gelu_deriv) ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_DGELU;
		uint32_t epi = bwd_gelu ? dgelu
			       : pbias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
		LT(set_epilogue(g->op, epi, pbias, c));
		const void *aux_at = MUTANT(gelu_aux) ? po : paux;
		LT(set_aux(g->op, aux_at, n));
		g->at[4] = aux_at;
		epilogue = 1;
		g->epi = epi;
	} else if (epilogue) {
		uint32_t epi = MUTANT(lt_bias) ? CUBLASLT_EPILOGUE_DEFAULT : CUBLASLT_EPILOGUE_BIAS;
		LT(set_epilogue(g->op, epi, pbias, c)); /* D's type: cuBLASLt's rule for a bias */
		g->epi = epi;
	}
	if (fb && c == CUDA_R_32F) { /* the paired bias_grad's sums, C's type */
		g->bgrad = (float *)p->alloc(p, (size_t)n * sizeof(float));
		if (!g->bgrad)
			return RT_FAIL(e, "out of device memory (the bias gradient of '%s')",
				       dpstep_str(s, s->tensors[in->out].name));
		uint32_t epi = MUTANT(lt_bgrad) ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
		LT(set_epilogue(g->op, epi, g->bgrad, CUDA_R_32F));
		epilogue = 1;
		g->epi = epi;
	}
	/* row-major [r, c] = column-major c x r, leading dimension the row
	 * stride: c, or more for padded rows (passes/padvocab.c: the logits) */
	int64_t cw = cu_cols(tw), rw = cu_rows(tw), cx = cu_cols(tx), rx = cu_rows(tx);
	int64_t lw = dp_ld(tw), lx = dp_ld(tx), lo = dp_ld(&s->tensors[in->out]);
	LT(cublasLtMatrixLayoutCreate(&g->a, ab, (uint64_t)cw, (uint64_t)rw, lw + MUTANT(gemm_ld)));
	LT(cublasLtMatrixLayoutCreate(&g->b, ab, (uint64_t)(ta ? m : MUTANT(vocab_k) ? cx : k),
				      (uint64_t)rx, lx)); /* ta: the part's rows; !ta: k rows, a
							     padded in0's padded k (gemm_dims) */
	LT(cublasLtMatrixLayoutCreate(&g->c, c, (uint64_t)n, (uint64_t)m, lo));
	if (paux && !gelu_epi)
		RT_CHECK(plain_gelu(p, in, g, m, n, po, pbias, e));

	/* "No algorithm" comes back as a status of the query (NOT_SUPPORTED) as
	 * well as a count of 0 or a result's state. With the bias epilogue the
	 * query is made once more without it (the bias rows and beta = 1, the
	 * path an under-aligned bias takes) before the load fails. */
	cublasLtMatmulHeuristicResult_t res;
	int count, found = 0;
	cublasStatus_t hs;
	for (;;) {
		g->half_out = c != CUDA_R_32F && !g->tmp;
		hs = heuristic(lt, g, g->half_out, &res, 1, &count);
		found = hs == CUBLAS_STATUS_SUCCESS && count >= 1 && res.state == CUBLAS_STATUS_SUCCESS;
		if (found || !epilogue || (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED))
			break;
		uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT; /* once more, as an under-aligned bias goes */
		LT(set_epilogue(g->op, epi, NULL, 0));
		g->epi = epi;
		epilogue = 0;
		if (paux) {
			RT_CHECK(plain_gelu(p, in, g, m, n, po, pbias, e));
		} else if (pbias) {
			g->bias_rows = 1;
			g->beta = 1.0f;
			g->align[3] = 0;
		}
		g->bgrad = NULL; /* the bias_grad sums its columns itself */
	}
	if (!found)
		return RT_FAIL(e, "%s '%s': cuBLASLt has no algorithm for %lld x %lld x %lld (row-major "
			       "m x k x n; %s%s, transposes %c%c, leading dimensions %lld/%lld/%lld, "
			       "alignments %u/%u/%u bytes of in1/in0/out, %s, at most %zu bytes of "
			       "workspace): %s", dp_op_names[in->op],
			       dpstep_str(s, s->tensors[in->out].name), (long long)m, (long long)k,
			       (long long)n, dp_dtype_names[tx->dtype], tf32 ? ", tf32" : "",
			       ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)lw, (long long)lx, (long long)lo,
			       g->align[0], g->align[1], g->align[2],
			       pbias ? "bias rows, no epilogue" : "no bias", (size_t)CU_BLAS_WS_BYTES,
			       hs != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(hs)
			       : count < 1 ? "no result" : cublasLtGetStatusString(res.state));
	if (res.workspaceSize > CU_BLAS_WS_BYTES)
		return RT_FAIL(e, "%s '%s': cuBLASLt's algorithm needs %zu bytes of workspace, more than "
			       "the %zu asked for", dp_op_names[in->op],
			       dpstep_str(s, s->tensors[in->out].name), res.workspaceSize,
			       (size_t)CU_BLAS_WS_BYTES);
	g->algo = res.algo;
	if (fb && g->bgrad)
		fb->bgrad = g->bgrad;
	/* what the tuner needs: the addresses and extents a call touches (a
	 * column-major r x c with leading dimension ld: ld * c elements at
	 * most), and the problem's name */
	size_t eab = dp_dtype_size(tx->dtype), ed = g->tmp ? sizeof(float) : dp_dtype_size(s->tensors[in->out].dtype);
	int64_t ldd = g->tmp ? n : lo;
	g->at[0] = pw;
	g->bytes[0] = (size_t)(lw * rw) * eab;
	g->at[1] = px;
	g->bytes[1] = (size_t)(lx * rx) * eab;
	g->at[2] = g->tmp ? (const void *)g->tmp : (const char *)po + g->d_off;
	g->bytes[2] = (size_t)(ldd * m) * ed;
	int vec = g->epi == CUBLASLT_EPILOGUE_BIAS || g->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
	g->at[3] = g->bgrad ? (const void *)g->bgrad : vec ? pbias : NULL;
	g->bytes[3] = g->bgrad ? (size_t)n * sizeof(float) : vec ? (size_t)n * ed : 0;
	int aux = g->epi == CUBLASLT_EPILOGUE_GELU_AUX || g->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
		  g->epi == CUBLASLT_EPILOGUE_DGELU;
	g->at[4] = aux ? g->at[4] : NULL;
	g->bytes[4] = aux ? (size_t)(n * m) * ed : 0;
	static const char *tn[] = {"f32", "bf16", "f16"};
	int ti = ab == CUDA_R_16BF ? 1 : ab == CUDA_R_16F ? 2 : 0;
	int to = g->tmp ? 0 : c == CUDA_R_16BF ? 1 : c == CUDA_R_16F ? 2 : 0;
	snprintf(g->key, sizeof g->key,
		 "%s%s>%s %c%c A%lldx%lld/%lld B%lldx%lld/%lld D%lldx%lld/%lld epi%u beta%d "
		 "align%u.%u.%u.%u.%u red%d", tn[ti], tf32 ? "(tf32)" : "", tn[to],
		 tb != MUTANT(gemm_trans) ? 'T' : 'N', ta ? 'T' : 'N', (long long)cw, (long long)rw,
		 (long long)lw, (long long)(ta ? m : k), (long long)rx, (long long)lx, (long long)n,
		 (long long)m, (long long)ldd, g->epi, g->beta != 0.0f, g->align[0], g->align[1],
		 g->align[2], g->align[3], g->align[4], g->half_out);
	return 0;
}

/* Instruction in's GEMM into f->gemm: one call, or the two of vocab_split. */
static int plan_one(CuPlan *p, const DpInstr *in, CuFuse *f, CuFuse *fb, RtErr *e)
{
	int64_t m, k, n;
	gemm_dims(p->s, in, &m, &k, &n);
	if (!m || !n || !k)
		return 0; /* no product: run_gemm writes zeros or the bias itself */
	int64_t head = vocab_split(p->s, in, fb);
	CuGemm *g = (CuGemm *)calloc(1, sizeof *g);
	if (!g)
		return RT_FAIL(e, "out of memory (GEMM plan)");
	f->gemm = g;
	RT_CHECK(plan_part(p, in, g, fb, 0, head ? head : m, e));
	if (!head)
		return 0;
	g->tail = (CuGemm *)calloc(1, sizeof *g);
	if (!g->tail)
		return RT_FAIL(e, "out of memory (GEMM plan)");
	return plan_part(p, in, g->tail, NULL, head, m - head, e);
}

/* The bias_grad whose column sums matmul i of program g can give by BGRADA
 * (the pairing rule in the header: format/kernel_kind.c's dp_bgrad_pair, the
 * rule the calibration and the simulator key bias_grad's points by), or -1
 * when another matmul's epilogue gives them already. */
static int64_t bgrad_pair(const CuPlan *p, int g, uint32_t i)
{
	int64_t j = dp_bgrad_pair(p->s, g, i);
	return j >= 0 && !p->fuse[g][j].bgrad ? j : -1;
}

extern "C" int cu_plan_gemm(CuPlan *p, RtErr *e)
{
	for (int g = 0; g < DP_NPROG; g++)
		for (uint32_t i = 0; i < p->s->nprog[g]; i++) {
			const DpInstr *in = &p->s->prog[g][i];
			if (!is_gemm(in->op))
				continue;
			int64_t j = bgrad_pair(p, g, i);
			RT_CHECK(plan_one(p, in, &p->fuse[g][i], j >= 0 ? &p->fuse[g][j] : NULL, e));
		}
	return 0;
}

static void gemm_free(CuGemm *g)
{
	if (!g)
		return;
	gemm_free(g->tail);
	/* teardown: a failure here changes nothing that follows */
	if (g->c)
		cublasLtMatrixLayoutDestroy(g->c);
	if (g->b)
		cublasLtMatrixLayoutDestroy(g->b);
	if (g->a)
		cublasLtMatrixLayoutDestroy(g->a);
	if (g->op)
		cublasLtMatmulDescDestroy(g->op);
	free(g);
}

extern "C" void cu_gemm_free(CuFuse *f)
{
	gemm_free(f->gemm);
	f->gemm = NULL;
}

/* ---- Tuning: the heuristic's candidates timed at load (--gemm-tune) ---- */

#define TUNE_CANDIDATES 8  /* asked of the heuristic, beside the plan's own first */
#define TUNE_REPS 5        /* timed calls per candidate (their mean), after one warm-up */
#define TUNE_MARGIN 0.02f  /* another candidate replaces the first only when >= 2 % faster */
#define TUNE_FORMAT 1      /* the cache file's format */

/* One distinct GEMM problem: its candidates, its choice. */
typedef struct {
	char key[TUNE_KEY];
	CuGemm *g;                 /* the first plan entry with this key (its descriptors) */
	int line;                  /* the cache file's line it came from, 0: none */
	cublasLtMatmulAlgo_t algo; /* the choice (the file's, or the timed one) */
	cublasLtMatmulAlgo_t cand[TUNE_CANDIDATES + 1];
	int ncand;                 /* cand[0]: the plan's (the heuristic's first) */
	int choice;                /* index in cand, -1: the file's algorithm */
	int timed;                 /* this rank timed it */
	float ms_first, ms;        /* per call: the first's and the choice's (0: not timed) */
	int uses;                  /* calls with this key in the plan */
} TuneEntry;

typedef struct {
	TuneEntry *e;
	int n, cap;
	char head[512]; /* this run's header line: the library and the device */
} TuneCache;

static double tune_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static TuneEntry *tune_add(TuneCache *c, const char *key, RtErr *e)
{
	if (c->n == c->cap) {
		int cap = c->cap ? 2 * c->cap : 32;
		TuneEntry *v = (TuneEntry *)realloc(c->e, (size_t)cap * sizeof *v);
		if (!v) {
			RT_FAIL(e, "out of memory (GEMM tuning)");
			return NULL;
		}
		c->e = v;
		c->cap = cap;
	}
	TuneEntry *t = &c->e[c->n++];
	memset(t, 0, sizeof *t);
	snprintf(t->key, sizeof t->key, "%s", key);
	t->choice = -1;
	return t;
}

static int tune_find(const TuneCache *c, const char *key)
{
	for (int i = 0; i < c->n; i++)
		if (!strcmp(c->e[i].key, key))
			return i;
	return -1;
}

/* The cache file: a header naming cuBLASLt's version and the device (an
 * algorithm is only meaningful to the library and GPU that chose it;
 * cublasLtMatmulAlgo_t "can be trivially serialized and later restored
 * for use with the same version of cuBLAS"), then one line per GEMM
 * problem: KEY <tab> the algorithm's 64 bytes as 8 hex words <tab> the
 * timing (a comment). A file that does not exist is an empty cache. */
static int tune_load(TuneCache *c, const char *path, RtErr *e)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		if (errno == ENOENT)
			return 0;
		return RT_FAIL(e, "%s: cannot read the GEMM tuning file: %s", path, strerror(errno));
	}
	char buf[1024];
	int line = 0, rc = 0;
	while (!rc && fgets(buf, sizeof buf, f)) {
		line++;
		size_t len = strlen(buf);
		if (len && buf[len - 1] == '\n')
			buf[--len] = 0;
		else if (!feof(f)) {
			rc = RT_FAIL(e, "%s:%d: error: line too long for a GEMM tuning file", path, line);
			break;
		}
		if (line == 1) {
			if (strcmp(buf, c->head))
				rc = RT_FAIL(e, "%s:1: error: %s '%s', this run is '%s' (an algorithm belongs to "
					     "the cuBLASLt and GPU that chose it: tune again into another file)",
					     path, strncmp(buf, "# dp gemm-tune ", 15) ? "not a GEMM tuning file:"
					     : "tuned under", buf, c->head);
			continue;
		}
		if (!len || buf[0] == '#')
			continue;
		char *tab = strchr(buf, '\t'), *hex = tab ? tab + 1 : NULL;
		cublasLtMatmulAlgo_t a;
		int ok = tab && (size_t)(tab - buf) < TUNE_KEY && strlen(hex) >= 128 &&
			 (hex[128] == 0 || hex[128] == '\t');
		for (int w = 0; ok && w < 8; w++) {
			uint64_t v = 0;
			for (int d = 0; d < 16; d++) {
				char ch = hex[16 * w + d];
				int x = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
				if (x < 0)
					ok = 0;
				v = v << 4 | (uint64_t)(x & 15);
			}
			a.data[w] = v;
		}
		if (!ok) {
			rc = RT_FAIL(e, "%s:%d: error: expected a GEMM's key, a tab and its algorithm as 128 "
				     "hex digits", path, line);
			break;
		}
		*tab = 0;
		if (tune_find(c, buf) >= 0) {
			rc = RT_FAIL(e, "%s:%d: error: a second line for GEMM '%s'", path, line, buf);
			break;
		}
		TuneEntry *t = tune_add(c, buf, e);
		if (!t) {
			rc = -1;
			break;
		}
		t->line = line;
		t->algo = a;
	}
	if (!rc && ferror(f))
		rc = RT_FAIL(e, "%s: read error", path);
	fclose(f);
	return rc;
}

/* Every entry, the file's first and then this run's, into path (whole:
 * a temporary file renamed over it, so a failure leaves the old one). */
static int tune_save(const TuneCache *c, const char *path, RtErr *e)
{
	size_t n = strlen(path) + 32;
	char *tmp = (char *)malloc(n);
	if (!tmp)
		return RT_FAIL(e, "out of memory (GEMM tuning)");
	snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
	FILE *f = fopen(tmp, "w");
	int bad = !f;
	if (f) {
		fprintf(f, "%s\n# KEY<tab>cublasLtMatmulAlgo_t (8 hex words)<tab>timing, per call "
			"(dpexec --gemm-tune; runtime/cuda/gemm.cu)\n", c->head);
		for (int i = 0; i < c->n; i++) {
			const TuneEntry *t = &c->e[i];
			fprintf(f, "%s\t", t->key);
			for (int w = 0; w < 8; w++)
				fprintf(f, "%016llx", (unsigned long long)t->algo.data[w]);
			if (t->timed)
				fprintf(f, "\tcandidate %d of %d, %.4f ms (the heuristic's first %.4f ms)",
					t->choice, t->ncand, t->ms, t->ms_first);
			fputc('\n', f);
		}
		bad = ferror(f) != 0;
		bad |= fclose(f) != 0;
	}
	if (bad || rename(tmp, path)) {
		int err = errno;
		remove(tmp);
		free(tmp);
		return RT_FAIL(e, "%s: cannot write the GEMM tuning file: %s", path, strerror(err));
	}
	free(tmp);
	return 0;
}

/* Fills buf (bytes) with a finite, non-zero pattern: 0x3c3c is 0.0115 in
 * bf16, 0x3c3c3c3c 0.0115 in f32 (fp16's 1.06; zeros would let the tensor
 * cores idle in a way real operands do not). */
#define TUNE_FILL 0x3c

/* The candidates of entry t: the plan's algorithm first, then the
 * heuristic's others (state SUCCESS, within the workspace, each once). */
static int tune_candidates(cublasLtHandle_t lt, TuneEntry *t, RtErr *e)
{
	CuGemm *g = t->g;
	cublasLtMatmulHeuristicResult_t res[TUNE_CANDIDATES];
	int count = 0;
	t->cand[0] = g->algo;
	t->ncand = 1;
	cublasStatus_t st = heuristic(lt, g, g->half_out, res, TUNE_CANDIDATES, &count);
	if (st == CUBLAS_STATUS_NOT_SUPPORTED)
		return 0; /* (it answered before, for one; the plan's stays) */
	if (st != CUBLAS_STATUS_SUCCESS)
		return RT_FAIL(e, "GEMM tuning: cublasLtMatmulAlgoGetHeuristic for '%s': %s", t->key,
			       cublasLtGetStatusString(st));
	for (int i = 0; i < count && i < TUNE_CANDIDATES; i++) {
		if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > CU_BLAS_WS_BYTES)
			continue;
		int seen = 0;
		for (int j = 0; j < t->ncand; j++)
			seen |= !memcmp(&t->cand[j], &res[i].algo, sizeof res[i].algo);
		if (!seen)
			t->cand[t->ncand++] = res[i].algo;
	}
	return 0;
}

/* Times t's candidates on scratch operands of the planned sizes and
 * alignments (each address's offset within 256 bytes kept), on the GEMM's
 * stream with its workspace. A candidate the library refuses is skipped;
 * the fastest wins if it beats the first by TUNE_MARGIN. *skipped: no
 * scratch memory (the first stays). A CUDA error fails the load. */
static int tune_time(cublasLtHandle_t lt, cudaStream_t st, void *ws,
		     TuneEntry *t, int *skipped, RtErr *e)
{
	CuGemm *g = t->g;
	size_t off[5], total = 0;
	for (int i = 0; i < 5; i++) {
		off[i] = (total + 255) / 256 * 256 + (g->at[i] ? (uintptr_t)g->at[i] % 256 : 0);
		total = off[i] + g->bytes[i];
	}
	char *base = NULL;
	if (cudaMalloc((void **)&base, total ? total : 1) != cudaSuccess) {
		cudaGetLastError(); /* (out of memory: not sticky) */
		*skipped = 1;
		return 0;
	}
	void *at[5];
	for (int i = 0; i < 5; i++)
		at[i] = g->at[i] ? base + off[i] : NULL;
	cudaEvent_t ev[2] = {NULL, NULL};
	int rc = 0;
	float best = 0.0f;
	cublasStatus_t ls = CUBLAS_STATUS_SUCCESS;
#define TUNE_CU(call)                                                                            \
	do {                                                                                     \
		cudaError_t ce_ = (call);                                                        \
		if (ce_ != cudaSuccess && !rc)                                                   \
			rc = RT_FAIL(e, "GEMM tuning of '%s': %s: %s", t->key, #call,            \
				     cudaGetErrorString(ce_));                                   \
	} while (0)
	TUNE_CU(cudaMemsetAsync(base, TUNE_FILL, total, st));
	TUNE_CU(cudaEventCreate(&ev[0]));
	TUNE_CU(cudaEventCreate(&ev[1]));
	if (!rc && at[3])
		ls = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &at[3],
						    sizeof at[3]);
	if (!rc && ls == CUBLAS_STATUS_SUCCESS && at[4])
		ls = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
						    &at[4], sizeof at[4]);
	if (!rc && ls != CUBLAS_STATUS_SUCCESS)
		rc = RT_FAIL(e, "GEMM tuning of '%s': cublasLtMatmulDescSetAttribute: %s", t->key,
			     cublasLtGetStatusString(ls));
	const float one = 1.0f;
	for (int c = 0; !rc && c < t->ncand; c++) {
		/* the warm-up call: a refusal (NOT_SUPPORTED for these operands,
		 * say) skips the candidate */
		if (cublasLtMatmul(lt, g->op, &one, at[0], g->a, at[1], g->b, &g->beta, at[2], g->c,
				   at[2], g->c, &t->cand[c], ws, CU_BLAS_WS_BYTES, st) != CUBLAS_STATUS_SUCCESS)
			continue;
		TUNE_CU(cudaEventRecord(ev[0], st));
		int ok = 1;
		for (int r = 0; ok && r < TUNE_REPS; r++)
			ok = cublasLtMatmul(lt, g->op, &one, at[0], g->a, at[1], g->b, &g->beta, at[2], g->c,
					    at[2], g->c, &t->cand[c], ws, CU_BLAS_WS_BYTES, st) ==
			     CUBLAS_STATUS_SUCCESS;
		TUNE_CU(cudaEventRecord(ev[1], st));
		TUNE_CU(cudaEventSynchronize(ev[1]));
		TUNE_CU(cudaGetLastError());
		float ms = 0.0f;
		TUNE_CU(cudaEventElapsedTime(&ms, ev[0], ev[1]));
		if (rc || !ok)
			continue;
		ms /= TUNE_REPS;
		if (c == 0) {
			t->ms_first = ms;
			t->choice = 0;
			best = ms;
		} else if (t->choice < 0 || (ms < best && (t->choice > 0 || ms < best * (1.0f - TUNE_MARGIN)))) {
			t->choice = c;
			best = ms;
		}
	}
	t->ms = best;
	/* the planned vector and aux back into the descriptor */
	if (at[3] && cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->at[3],
						    sizeof g->at[3]) != CUBLAS_STATUS_SUCCESS && !rc)
		rc = RT_FAIL(e, "GEMM tuning of '%s': restoring the epilogue's vector", t->key);
	if (at[4] && cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
						    &g->at[4], sizeof g->at[4]) != CUBLAS_STATUS_SUCCESS && !rc)
		rc = RT_FAIL(e, "GEMM tuning of '%s': restoring the GELU aux", t->key);
	TUNE_CU(cudaStreamSynchronize(st));
	for (int i = 0; i < 2; i++)
		if (ev[i])
			TUNE_CU(cudaEventDestroy(ev[i]));
	TUNE_CU(cudaFree(base));
#undef TUNE_CU
	if (!rc && t->choice < 0)
		t->choice = 0; /* every candidate refused: the plan's stays (the run will say why) */
	t->timed = !rc;
	return rc;
}

/* The GEMM plan entries in a fixed order (programs, instructions, head and
 * tail): the same slots on every rank, whatever its plan did. */
static int tune_slots(const DpStep *s)
{
	int n = 0;
	for (int g = 0; g < DP_NPROG; g++)
		for (uint32_t i = 0; i < s->nprog[g]; i++)
			n += 2 * is_gemm(s->prog[g][i].op);
	return n;
}

/* slot k's plan entry (NULL: none, or a plan that failed before it) */
static CuGemm *tune_slot(const CuPlan *p, int k)
{
	int n = 0;
	for (int g = 0; g < DP_NPROG; g++)
		for (uint32_t i = 0; i < p->s->nprog[g]; i++) {
			if (!is_gemm(p->s->prog[g][i].op))
				continue;
			if (n == k || n + 1 == k) {
				CuGemm *h = p->fuse[g] ? p->fuse[g][i].gemm : NULL;
				return h && n + 1 == k ? h->tail : h;
			}
			n += 2;
		}
	return NULL;
}

static int tune_run(CuPlan *p, CuTune *tn, TuneCache *c, int *timed, int *skipped, RtErr *e)
{
	int rc = 0;
	int nslot = tune_slots(p->s);
	/* the distinct problems, with the plan entry that describes each */
	for (int k = 0; !rc && k < nslot; k++) {
		CuGemm *g = tune_slot(p, k);
		if (!g)
			continue;
		int i = tune_find(c, g->key);
		TuneEntry *t = i >= 0 ? &c->e[i] : tune_add(c, g->key, e);
		if (!t)
			return -1;
		if (!t->g)
			t->g = g;
		t->uses++;
	}
	for (int i = 0; !rc && i < c->n; i++) {
		TuneEntry *t = &c->e[i];
		if (!t->g)
			continue; /* another step's GEMM: kept for the file */
		const DpInstr *in = NULL;
		int stream = 0;
		for (int g = 0; g < DP_NPROG && !in; g++) /* the first instruction with this entry */
			for (uint32_t j = 0; j < p->s->nprog[g] && !in; j++)
				if (p->fuse[g] && (p->fuse[g][j].gemm == t->g ||
						   (p->fuse[g][j].gemm && p->fuse[g][j].gemm->tail == t->g)))
					in = &p->s->prog[g][j];
		stream = in ? in->stream : 0;
		cublasLtHandle_t lt = p->blas[stream];
		if (t->line) { /* the file's: cuBLASLt must take it for this problem */
			cublasLtMatmulHeuristicResult_t r;
			memset(&r, 0, sizeof r);
			cublasStatus_t st = cublasLtMatmulAlgoCheck(lt, t->g->op, t->g->a, t->g->b, t->g->c,
								    t->g->c, &t->algo, &r);
			if (st != CUBLAS_STATUS_SUCCESS || r.workspaceSize > CU_BLAS_WS_BYTES)
				rc = RT_FAIL(e, "%s:%d: error: cuBLASLt refuses the algorithm for GEMM '%s' "
					     "(%s): the file does not belong to this step's operands",
					     tn->file, t->line, t->key,
					     st != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(st)
					     : "it needs more than the 32 MiB workspace");
			continue;
		}
		rc = tune_candidates(lt, t, e);
		if (!rc && tn->rank == 0) {
			int sk = 0;
			rc = tune_time(lt, tn->st[stream], tn->ws[stream], t, &sk, e);
			*timed += !rc && !sk;
			*skipped += sk;
		}
		if (!rc)
			t->algo = t->cand[t->choice > 0 ? t->choice : 0];
	}
	return rc;
}

/* *out = rank 0's v (bits low bits of it) on every rank: one all_ok (a
 * minimum over the ranks) per bit, the other ranks giving 1. */
static int tune_bcast(const CuTune *tn, int v, int bits, int *out, RtErr *e)
{
	*out = 0;
	for (int b = 0; b < bits; b++) {
		int all = 0;
		RT_CHECK(tn->all_ok(tn->ctx, tn->rank == 0 ? (v >> b) & 1 : 1, &all, e));
		*out |= (all != 0) << b;
	}
	return 0;
}

extern "C" int cu_tune_gemm(CuPlan *p, CuTune *tn, int plan_rc, RtErr *e)
{
	tn->summary[0] = 0;
	if (tn->mode == CU_TUNE_OFF)
		return plan_rc;
	double t0 = tune_now();
	TuneCache c;
	memset(&c, 0, sizeof c);
	int dev = 0;
	struct cudaDeviceProp prop;
	int rc = plan_rc;
	if (!rc && (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)) {
		cudaGetLastError();
		rc = RT_FAIL(e, "GEMM tuning: the device's properties");
	}
	if (!rc)
		snprintf(c.head, sizeof c.head, "# dp gemm-tune %d: cuBLASLt %zu, %s, sm_%d%d", TUNE_FORMAT,
			 cublasLtGetVersion(), prop.name, prop.major, prop.minor);
	if (!rc && tn->file)
		rc = tune_load(&c, tn->file, e);
	int timed = 0, skipped = 0;
	if (!rc)
		rc = tune_run(p, tn, &c, &timed, &skipped, e);
	/* rank 0's choices to every rank, after agreeing that every rank's
	 * plan and tuning succeeded and that they have the same problems */
	if (tn->world > 1 && tn->all_ok) {
		int all = 0;
		int src = tn->all_ok(tn->ctx, rc == 0, &all, e);
		if (!rc && src)
			rc = src;
		if (!rc && !all)
			rc = RT_FAIL(e, "GEMM tuning: another rank's GEMM plan or tuning failed");
		int n0 = 0;
		if (!rc)
			rc = tune_bcast(tn, c.n, 24, &n0, e);
		if (!rc && (src = tn->all_ok(tn->ctx, n0 == c.n, &all, e)) != 0)
			rc = src;
		if (!rc && !all)
			rc = RT_FAIL(e, "GEMM tuning: the ranks have different GEMM problems (%d here, %d on "
				     "rank 0: a --gemm-tune file that differs between nodes?)", c.n, n0);
		for (int i = 0; !rc && i < c.n; i++) {
			TuneEntry *t = &c.e[i];
			int want = 0; /* rank 0's candidate + 1; 0: each keeps its own (the file's) */
			rc = tune_bcast(tn, t->g && !t->line ? 1 + (t->choice > 0 ? t->choice : 0) : 0, 4,
					&want, e);
			if (rc || tn->rank == 0 || want == 0)
				continue;
			if (want > t->ncand)
				rc = RT_FAIL(e, "GEMM tuning of '%s': rank 0 chose candidate %d, this rank's "
					     "heuristic gave %d", t->key, want - 1, t->ncand);
			else
				t->algo = t->cand[want - 1];
		}
	}
	if (rc) {
		free(c.e);
		return rc;
	}
	int nslot = tune_slots(p->s);
	/* every plan entry takes its problem's choice */
	int changed = 0;
	double first_ms = 0, tuned_ms = 0;
	for (int k = 0; !rc && k < nslot; k++) {
		CuGemm *g = tune_slot(p, k);
		if (!g)
			continue;
		int i = tune_find(&c, g->key);
		if (MUTANT(tune_key) && c.n > 1) /* another problem's algorithm */
			i = (i + 1) % c.n;
		changed += memcmp(&g->algo, &c.e[i].algo, sizeof g->algo) != 0;
		g->algo = c.e[i].algo;
		first_ms += c.e[i].ms_first;
		tuned_ms += c.e[i].timed ? c.e[i].ms : c.e[i].ms_first;
	}
	if (!rc && tn->file && tn->rank == 0 && timed)
		rc = tune_save(&c, tn->file, e);
	if (!rc) {
		int from_file = 0, distinct = 0;
		for (int i = 0; i < c.n; i++) {
			from_file += c.e[i].line && c.e[i].uses;
			distinct += c.e[i].uses > 0;
		}
		snprintf(tn->summary, sizeof tn->summary,
			 "GEMM tuning: %d distinct GEMMs, %d timed (up to %d candidates each)%s, %d from %s; "
			 "%d of the plan's calls changed algorithm; %.2f s", distinct, timed,
			 TUNE_CANDIDATES + 1, skipped ? " (some skipped: no scratch memory)" : "", from_file,
			 tn->file ? tn->file : "no file", changed, tune_now() - t0);
		if (tn->rank == 0 && timed) {
			size_t l = strlen(tn->summary);
			snprintf(tn->summary + l, sizeof tn->summary - l,
				 "; one call of each planned GEMM: %.3f ms with the heuristic's first, "
				 "%.3f ms tuned", first_ms, tuned_ms);
		}
	}
	free(c.e);
	return rc;
}

/* o[r, :] = bias for every row: linear's start before beta = 1 (T: float,
 * or the bits of a bf16 or fp16 linear: bias and output alike, an exact copy) */
template <typename T>
__global__ void k_bias_rows(T *o, const T *bias, int64_t rows, int64_t cols)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
			o[r * cols + j] = bias[j];
}

static int bias_rows(const CuArgs *a, int64_t rows, int64_t cols, RtErr *e)
{
	unsigned grid = (unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID);
	if (dp_is_half(cu_t(a, -1)->dtype))
		CU_LAUNCH(k_bias_rows<uint16_t>, grid, cu_row_threads(cols), a->st,
			  (uint16_t *)cu_p(a, -1), (const uint16_t *)cu_p(a, 2), rows, cols);
	else
		CU_LAUNCH(k_bias_rows<float>, grid, cu_row_threads(cols), a->st, cu_f(a, -1),
			  cu_f(a, 2), rows, cols);
	CU_LAUNCHED(a, e);
	return 0;
}

/* The gelu a fused GEMM without cuBLASLt's epilogue runs after its product
 * (plain_gelu): linear_gelu's second half from its first, or
 * matmul_gelu_grad's output times gelu' of the pre-activation; in bf16, fp16 from
 * the f32 product v (NULL: an empty sum, 0) plus linear_gelu's bias. */
static int gelu_after(const CuArgs *a, const float *v, int64_t mn, int64_t n, RtErr *e)
{
	char *o = (char *)cu_p(a, -1);
	int fwd = a->in->op == DP_OP_LINEAR_GELU;
	char *second = o + (size_t)mn * dp_dtype_size(cu_t(a, -1)->dtype);
	if (dp_is_half(cu_t(a, -1)->dtype))
		return cu_gelu_finish(a, !fwd, fwd ? second : o, fwd ? o : cu_p(a, 2), v,
				      fwd && bias_of(a->in) >= 0 ? cu_p(a, 2) : NULL, mn, n, e);
	if (fwd)
		return cu_gelu_map(a, 0, (float *)second, (const float *)o, NULL, mn, e);
	return cu_gelu_map(a, 1, (float *)o, (const float *)o, cu_f(a, 2), mn, e);
}

static int run_gemm(const CuArgs *a, RtErr *e)
{
	int64_t m, k, n;
	gemm_dims(a->s, a->in, &m, &k, &n);
	if (!m || !n)
		return 0;
	int has_bias = bias_of(a->in) >= 0;
	if (!k) { /* an empty sum: the bias, zeros, or (acc) the output as it is; then
		     linear_gelu's gelu (matmul_gelu_grad's zeros stay zeros) */
		int half_gelu = a->in->op == DP_OP_LINEAR_GELU && dp_is_half(cu_t(a, -1)->dtype);
		if (has_bias && !half_gelu)
			RT_CHECK(bias_rows(a, m, n, e));
		else if (accumulates(a->in))
			return 0;
		else if (!half_gelu)
			CU_OK(a, cudaMemsetAsync(cu_p(a, -1), 0,
						 (size_t)(m * n) * dp_dtype_size(cu_t(a, -1)->dtype), a->st), e);
		return a->in->op == DP_OP_LINEAR_GELU ? gelu_after(a, NULL, m * n, n, e) : 0;
	}
	const CuGemm *g0 = a->fuse->gemm;
	if (!g0)
		return RT_FAIL(e, "internal error: %s '%s': no cuBLASLt plan", dp_op_names[a->in->op],
			       dpstep_str(a->s, cu_t(a, -1)->name));
	for (const CuGemm *g = g0; g; g = g->tail) { /* one call, or vocab_split's two */
		const void *pa, *pb;
		void *pc;
		part_ptrs(a->s, a->in, g, cu_p(a, 1), cu_p(a, 0), cu_p(a, -1), &pa, &pb, &pc);
		void *pd = g->tmp ? (void *)g->tmp : (char *)pc + g->d_off; /* D */
		if (align_of(pa) < g->align[0] || align_of(pb) < g->align[1] ||
		    align_of(pd) < g->align[2] || (g->align[3] && align_of(cu_p(a, 2)) < g->align[3]) ||
		    (g->align[4] &&
		     align_of(a->in->op == DP_OP_LINEAR_GELU ? pc : cu_p(a, 2)) < g->align[4]))
			return RT_FAIL(e, "internal error: %s '%s': the operands are less aligned than "
				       "when its cuBLASLt algorithm was chosen", dp_op_names[a->in->op],
				       dpstep_str(a->s, cu_t(a, -1)->name));
		if (g->bias_rows)
			RT_CHECK(bias_rows(a, m, n, e));
		const float one = 1.0f;
		cublasStatus_t st = cublasLtMatmul(a->blas, g->op, &one, pa, g->a, pb, g->b, &g->beta,
						   pd, g->c, pd, g->c, &g->algo, a->blas_ws,
						   CU_BLAS_WS_BYTES, a->st);
		if (st != CUBLAS_STATUS_SUCCESS)
			return RT_FAIL(e, "%s '%s': cublasLtMatmul (%lld x %lld x %lld%s): %s",
				       dp_op_names[a->in->op], dpstep_str(a->s, cu_t(a, -1)->name),
				       (long long)g->rows, (long long)k, (long long)n,
				       a->tf32 && cu_t(a, 0)->dtype == DP_F32 ? ", tf32" : "",
				       cublasLtGetStatusString(st));
	}
	return g0->gelu_map ? gelu_after(a, g0->tmp, m * n, n, e) : 0;
}

/* ---- bias_grad: two-stage column sums in double ---- */

/* term(r, j) = in0[r, j]; T: in0's dtype (f32, or bf16 widened exactly) */
template <typename T> struct BiasTerm {
	const T *x;
	int64_t c;
	__device__ double operator()(int64_t r, int64_t j) const { return ld(x + r * c + j); }
};

static size_t scratch_bias_grad(const DpStep *s, const DpInstr *in)
{
	int64_t c = cu_numel(&s->tensors[in->out]), rows = c ? cu_numel(&s->tensors[in->in[0]]) / c : 0;
	return (size_t)(cu_col_chunks(rows, c) * c) * sizeof(double);
}

/* T: in0; TO: the output (the compute dtype, or f32 where the gradient
 * accumulates in f32: operand rule BIAS_GRAD), rounded once */
template <typename T, typename TO> static int run_bias_grad_t(const CuArgs *a, RtErr *e)
{
	int64_t c = cu_numel(cu_t(a, -1));
	if (c <= 0)
		return 0;
	BiasTerm<T> term = {(const T *)cu_p(a, 0), c};
	CU_OK(a, cu_colsum(a->st, term, (TO *)cu_p(a, -1), cu_numel(cu_t(a, 0)) / c, c,
			   DP_ATTR(a->in, BIAS_GRAD, acc) != 0, (double *)a->scratch), e);
	return 0;
}

/* o[j] = v[j] (+ o[j]): a bias gradient from its matmul's BGRADA sums */
__global__ void k_bgrad_add(float *o, const float *v, int64_t c, int accumulate)
{
	CU_FOR_EACH(j, c)
		if (!MUTANT(bgrad_add))
			o[j] = accumulate ? o[j] + v[j] : v[j];
}

static int run_bias_grad(const CuArgs *a, RtErr *e)
{
	if (a->fuse->bgrad) { /* f32 output: the pairing's rule */
		int64_t c = cu_numel(cu_t(a, -1));
		CU_LAUNCH(k_bgrad_add, cu_grid(c), CU_THREADS, a->st, cu_f(a, -1), a->fuse->bgrad, c,
			  DP_ATTR(a->in, BIAS_GRAD, acc) != 0);
		CU_LAUNCHED(a, e);
		return 0;
	}
	if (cu_t(a, 0)->dtype == DP_F16) /* the output f32 or f16 */
		return cu_t(a, -1)->dtype == DP_F16 ? run_bias_grad_t<__half, __half>(a, e)
						    : run_bias_grad_t<__half, float>(a, e);
	int in16 = cu_t(a, 0)->dtype == DP_BF16, out16 = cu_t(a, -1)->dtype == DP_BF16;
	if (in16)
		return out16 ? run_bias_grad_t<cu_bf16, cu_bf16>(a, e) : run_bias_grad_t<cu_bf16, float>(a, e);
	return out16 ? run_bias_grad_t<float, cu_bf16>(a, e) : run_bias_grad_t<float, float>(a, e);
}

/*
 * orthogonalize (PowerSGD, passes/compress.c): the CPU's Gram-Schmidt
 * (runtime/cpu/gemm.c: each column has every earlier one's projection taken
 * out twice, then is divided by its norm; a zero column stays zero), in one
 * block: r is the compression rank, and each dot product and norm is a
 * block_sum over the rows in f32. A thread updates only its own rows, so
 * block_sum's barriers are all the ordering it needs.
 */
__global__ void k_orthogonalize(float *a, int64_t rows, int64_t r)
{
	__shared__ float sh[32];
	for (int64_t i = 0; i < r; i++) {
		for (int pass = 0; pass < 2; pass++)
			for (int64_t j = 0; j < i; j++) {
				float d = 0;
				for (int64_t x = threadIdx.x; x < rows; x += blockDim.x)
					d += a[x * r + j] * a[x * r + i];
				if (!MUTANT(ortho_dot))
					d = block_sum(d, sh);
				for (int64_t x = threadIdx.x; x < rows; x += blockDim.x)
					a[x * r + i] -= d * a[x * r + j];
			}
		float s = 0;
		for (int64_t x = threadIdx.x; x < rows; x += blockDim.x)
			s += a[x * r + i] * a[x * r + i];
		float norm = sqrtf(block_sum(s, sh));
		for (int64_t x = threadIdx.x; x < rows; x += blockDim.x)
			a[x * r + i] = norm > 0 ? a[x * r + i] / norm : 0.0f;
	}
}

/* warm_start=false: Q drawn afresh for the step the device is at
 * (runtime/powersgd.h), as the CPU draws it */
__global__ void k_psgd_draw(float *q, int64_t n, uint64_t seed, uint64_t h, const CuScalars *sc)
{
	uint64_t ks = dp_psgd_step_seed(seed, MUTANT(psgd_step) ? 0 : sc->step);
	CU_FOR_EACH(i, n)
		q[i] = dp_psgd_normal(ks, h, (uint64_t)i);
}

static int run_orthogonalize(const CuArgs *a, RtErr *e)
{
	const DpTensor *t = cu_t(a, -1);
	if (DP_ATTR(a->in, ORTHOGONALIZE, fresh)) {
		int64_t n = cu_numel(t);
		CU_LAUNCH(k_psgd_draw, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), n,
			  a->s->cfg.seed, dp_psgd_hash(a->s->strings + t->name), a->sc);
		CU_LAUNCHED(a, e);
	}
	CU_LAUNCH(k_orthogonalize, 1, CU_THREADS, a->st, cu_f(a, -1), cu_rows(t), cu_cols(t));
	CU_LAUNCHED(a, e);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_gemm_rows[] = {
	{DP_OP_MATMUL, run_gemm, limit_gemm, 1, NULL, NULL, 1, 1},
	{DP_OP_LINEAR, run_gemm, limit_gemm, 1, NULL, NULL, 1, 1},
	{DP_OP_BIAS_GRAD, run_bias_grad, NULL, 1, NULL, scratch_bias_grad, 0, 1},
	{DP_OP_LINEAR_GELU, run_gemm, limit_gemm, 1, NULL, NULL, 1, 1},
	{DP_OP_MATMUL_GELU_GRAD, run_gemm, limit_gemm, 1, NULL, NULL, 1, 1},
	{DP_OP_ORTHOGONALIZE, run_orthogonalize, NULL, 0, NULL, NULL, 0, 0},
	{},
};
