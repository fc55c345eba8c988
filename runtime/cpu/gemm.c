/*
 * cpu/gemm.c - the CPU kernels of matrix products: matmul and linear (and
 * the fused linear_gelu and matmul_gelu_grad of passes/fuse.c, and PowerSGD's
 * orthogonalize of passes/compress.c)
 * (OpenBLAS cblas_sgemm, row-major, one OpenBLAS thread per call and the
 * product split over the rank's threads) and linear's bias gradient, a
 * column sum accumulated in double. BLAS takes int sizes: larger matrices
 * are refused at load (the rows' limits).
 */
#include <cpuid.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>

#include "../powersgd.h"
#include "cpu.h"

/*
 * OpenBLAS's kernels for this CPU. Its DYNAMIC_ARCH build (Debian's) picks
 * them by CPUID when it loads; 0.3.21 does not know AMD Zen 4 and, as the
 * CPU has avx512_bf16, takes Cooperlake's AVX-512 kernels. Zen 4 executes
 * a 512-bit operation as two 256-bit halves, and there OpenBLAS's Haswell
 * (AVX2) sgemm is the faster one: 101-107 against 88-101 GFLOP/s on the
 * GEMM shapes of bench/gpt_cpu.sh's model, 6% over all of them, one thread
 * (docs/PERF.md). So on Zen 4 (an AMD CPU of family 19h with AVX-512) dp
 * runs OpenBLAS's own core selection again with OPENBLAS_CORETYPE=Haswell,
 * through the two entry points DYNAMIC_ARCH builds export (weak: a BLAS
 * without them keeps its choice), before any BLAS call. A user's
 * OPENBLAS_CORETYPE, or DP_BLAS_CORE=keep, leaves OpenBLAS's choice alone;
 * DP_BLAS_CORE=NAME takes core NAME by the same path on any CPU (how the
 * tests walk Zen 4's path on other machines). The choice depends on the CPU
 * model only, never on a timing.
 *
 * A CPU newer than the library falls the other way: 0.3.21 matches Intel
 * CPUs by family and model, and one it does not know (Sapphire and Emerald
 * Rapids, family 6 model 143 and 207, AVX-512 with AMX) gets "Prescott",
 * its SSE3 fallback, at about a third of the CPU's sgemm rate. Later
 * OpenBLAS releases fall back by the CPU's features instead, and so does dp
 * here: when OpenBLAS took Prescott on a CPU with AVX-512 (F, CD, BW, DQ,
 * VL: SkylakeX's set) it takes SkylakeX, with AVX2 and FMA Haswell.
 * Measured on an Emerald Rapids Xeon (2 cores): a 20-step models/mlp.dp run
 * 1.0 -> 0.67 CPU-s. Results change in their last bits with the kernels,
 * as between any two machines; the cut points below follow the core.
 *
 * The choice is the process's, not the CPU backend's: OpenBLAS is one
 * library per process, and whatever else calls it in dpexec must sum as the
 * CPU backend does. dpexec makes it first thing in main (cpu_blas_choose),
 * so the CUDA emulator's cuBLAS (tests/cuda_emu/cublas.cc, OpenBLAS in the
 * same process) runs the very kernels the CPU reference runs. When only the
 * CPU backend re-chose, a Zen 4 ran its reference on Haswell's kernels and
 * the emulator on Cooperlake's, and the bf16 cases of tests/cuda_emu.sh
 * parted by 1.45e-2 (a GEMM result that rounds to the other bf16 under a
 * zero gradient becomes AdamW step of 2 lr).
 */
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));

static int zen4(void)
{
#if defined(__x86_64__)
	unsigned a, b, c, d;
	if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541 /* "Auth" enticAMD */)
		return 0;
	__get_cpuid(1, &a, &b, &c, &d);
	unsigned family = ((a >> 8) & 0xf) + ((a >> 8 & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
	__builtin_cpu_init();
	return family == 0x19 && __builtin_cpu_supports("avx512f");
#else
	return 0;
#endif
}

/* The core OpenBLAS's fallback should have been on this CPU, by its
 * features, or NULL (see above). */
static const char *feature_core(void)
{
#if defined(__x86_64__)
	const char *now = openblas_get_corename();
	if (!now || strcasecmp(now, "prescott") != 0)
		return NULL;
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
	    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
	    __builtin_cpu_supports("avx512vl"))
		return "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
#endif
	return NULL;
}

void cpu_blas_choose(void)
{
	static int chosen;
	if (chosen++)
		return;
	const char *keep = getenv("DP_BLAS_CORE");
	const char *user = getenv("OPENBLAS_CORETYPE");
	const char *core = NULL;
	if (keep && *keep)
		core = strcmp(keep, "keep") == 0 ? NULL : keep;
	else if (!(user && *user) && zen4())
		core = "Haswell";
	else if (!(user && *user))
		core = feature_core();
	if (core && gotoblas_dynamic_init && gotoblas_dynamic_quit) {
		char *saved = user ? strdup(user) : NULL;
		setenv("OPENBLAS_CORETYPE", core, 1);
		gotoblas_dynamic_quit();
		gotoblas_dynamic_init();
		if (saved)
			setenv("OPENBLAS_CORETYPE", saved, 1);
		else
			unsetenv("OPENBLAS_CORETYPE");
		free(saved);
	}
	openblas_set_num_threads(1); /* the pool's threads call it */
}

/*
 * Where a product may be cut so that every element of C is summed in the
 * same order as in one call (the pool's bitwise thread-count invariance):
 * measured per OpenBLAS core (tests/cpu_kernels_test checks the core this
 * machine runs). Cooperlake's and SkylakeX's AVX-512 kernels: rows or
 * columns of C at multiples of 64. Haswell's and Zen's: rows at multiples
 * of 24 only; a column cut changes the sums of the whole product (all 5
 * cuts of a 1000 x 1024 x 333 product moved bits, at any multiple), and row
 * cuts at multiples of 64 moved bits of transposed-A products. Another
 * core: rows or columns at 64, as before dp knew any of this.
 */
void cpu_blas_init(CpuBlas *b)
{
	cpu_blas_choose(); /* dpexec has already; a test program may not */
	const char *core = openblas_get_corename();
	int avx2_kernels = core && (strcasecmp(core, "haswell") == 0 || strcasecmp(core, "zen") == 0);
	b->grain = avx2_kernels ? 24 : 64;
	b->cols = !avx2_kernels;
}

/* m, k, n of out = op(in0) @ op(in1) (transA, transB). */
static void matmul_dims(const DpTensor *a, const DpTensor *b, const DpInstr *in, int64_t *m,
			int64_t *k, int64_t *k2, int64_t *n)
{
	int64_t ta = DP_ATTR(in, MATMUL, transA), tb = DP_ATTR(in, MATMUL, transB);
	*m = ta ? cpu_cols(a) : cpu_rows(a);
	*k = ta ? cpu_rows(a) : cpu_cols(a);
	*k2 = tb ? cpu_cols(b) : cpu_rows(b);
	*n = tb ? cpu_rows(b) : cpu_cols(b);
}

static int limit_matmul(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	int64_t m, k, k2, n;
	matmul_dims(&s->tensors[in->in[0]], &s->tensors[in->in[1]], in, &m, &k, &k2, &n);
	CPU_NEED(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "matrix too large for BLAS");
	CPU_NEED(dp_ld(&s->tensors[in->in[0]]) <= INT_MAX && dp_ld(&s->tensors[in->in[1]]) <= INT_MAX &&
		 dp_ld(&s->tensors[in->out]) <= INT_MAX, "row stride too large for BLAS");
	return 0;
}

/*
 * C [m, n] = beta * C + op(A) op(B), row-major, split over the pool: into
 * row blocks of C when m >= n (or the core's kernels allow no column cut),
 * else column blocks, cut at the core's multiples (CpuBlas, above: every
 * element of C is summed in the same order whatever the cut). Below
 * GEMM_SERIAL flops it is one call. With a bias, each piece first copies the bias into its own
 * part of C (beta = 1 then adds the product to it): no separate pass.
 */
#define GEMM_SERIAL (1 << 21)

typedef struct {
	const float *a, *b;
	float *c;
	const float *bias; /* [n] copied into every row first; NULL: none */
	int ta, tb, m, n, k, lda, ldb, ldc, by_rows;
	float beta;
} Gemm;

static void gemm_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Gemm *g = ctx;
	int m = g->m, n = g->n;
	const float *a = g->a, *b = g->b;
	float *c = g->c;
	const float *bias = g->bias;
	if (g->by_rows) { /* rows lo..hi of C: rows of op(A) */
		m = (int)(hi - lo);
		a += g->ta ? lo : lo * g->lda;
		c += lo * g->ldc;
	} else { /* columns lo..hi of C: columns of op(B) */
		n = (int)(hi - lo);
		b += g->tb ? lo * g->ldb : lo;
		c += lo;
		bias = bias ? bias + lo : NULL;
	}
	if (bias)
		for (int r = 0; r < m; r++)
			memcpy(c + (int64_t)r * g->ldc, bias, (size_t)n * sizeof(float));
	cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
		    m, n, g->k, 1.0f, a, g->lda, b, g->ldb, bias ? 1.0f : g->beta, c, g->ldc);
}

/* C = beta * C + op(A) op(B) (+ bias rows); A is [ra, ca], B [rb, cb] as stored;
 * ld: A's, B's and C's row strides (padded rows, passes/padvocab.c), or NULL:
 * dense. */
static void sgemm(const CpuArgs *x, const float *a, int64_t ra, int64_t ca, int ta, const float *b,
		  int64_t rb, int64_t cb, int tb, float *c, float beta, const float *bias,
		  const int64_t *ld)
{
	Gemm g = {a, b, c, bias, ta, tb, (int)(ta ? ca : ra), (int)(tb ? rb : cb), (int)(ta ? ra : ca),
		  (int)(ld ? ld[0] : ca), (int)(ld ? ld[1] : cb), (int)(ld ? ld[2] : tb ? rb : cb), 0,
		  beta};
	g.by_rows = g.m >= g.n || !x->blas->cols;
	double flops = 2.0 * g.m * g.n * g.k;
	int64_t items = g.by_rows ? g.m : g.n;
	cpu_parallel(x->pool, items, flops < GEMM_SERIAL ? items : x->blas->grain, gemm_piece, &g);
}

static int run_matmul(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpTensor *t0 = cpu_t(k, in->in[0]), *t1 = cpu_t(k, in->in[1]);
	int64_t ld[3] = {dp_ld(t0), dp_ld(t1), dp_ld(cpu_t(k, in->out))};
	int ta = DP_ATTR(in, MATMUL, transA) != 0, tb = DP_ATTR(in, MATMUL, transB) != 0;
	/* in1's rows the product uses: a pad_rows weight (passes/padvocab.c) has
	 * zero rows past them, which the CPU leaves out: its sums are those
	 * without the padding, bitwise */
	int64_t r1 = tb ? cpu_cols(cpu_t(k, in->out)) : ta ? cpu_rows(t0) : cpu_cols(t0);
	sgemm(k, cpu_f(k, in->in[0]), cpu_rows(t0), cpu_cols(t0), ta,
	      cpu_f(k, in->in[1]), r1, cpu_cols(t1), tb,
	      cpu_f(k, in->out), DP_ATTR(in, MATMUL, acc) ? 1.0f : 0.0f, NULL, ld);
	return 0;
}

static int limit_linear(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	const DpTensor *x = &s->tensors[in->in[0]], *w = &s->tensors[in->in[1]];
	CPU_NEED(cpu_rows(x) <= INT_MAX && cpu_cols(w) <= INT_MAX && cpu_cols(x) <= INT_MAX,
		 "matrix too large for BLAS");
	return 0;
}

/* The bias is copied into every row first, then sgemm adds (beta = 1). */
static int run_linear(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpTensor *t0 = cpu_t(k, in->in[0]), *t1 = cpu_t(k, in->in[1]);
	sgemm(k, cpu_f(k, in->in[0]), cpu_rows(t0), cpu_cols(t0), 0, cpu_f(k, in->in[1]),
	      cpu_rows(t1), cpu_cols(t1), 0, cpu_f(k, in->out), 0.0f,
	      in->in[2] >= 0 ? cpu_f(k, in->in[2]) : NULL, NULL);
	return 0;
}

/*
 * The fused GEMMs of passes/fuse.c: linear_gelu writes linear's result into
 * its first half and gelu of it into its second; matmul_gelu_grad writes the
 * product and multiplies it by gelu' of the pre-activation in place. In f32
 * that is bitwise the two kernels they replace. They have no bf16 path of
 * their own: a bf16 instruction runs on f32 copies (bf16.c's staging), so
 * the gelu sees the f32 result and each output is rounded once, as
 * cuBLASLt's GELU_AUX_BIAS and DGELU epilogues compute (the unfused graph
 * rounded the product to bf16 first: docs/PRECISION.md).
 */
static int run_linear_gelu(const CpuArgs *k, RtErr *e)
{
	RT_CHECK(run_linear(k, e));
	int64_t half = cpu_numel(cpu_t(k, k->in->out)) / 2;
	float *h = cpu_f(k, k->in->out);
	cpu_map(k, DP_OP_GELU, h + half, h, NULL, 0, half);
	return 0;
}

static int run_matmul_gelu_grad(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpTensor *t0 = cpu_t(k, in->in[0]), *t1 = cpu_t(k, in->in[1]);
	float *o = cpu_f(k, in->out);
	sgemm(k, cpu_f(k, in->in[0]), cpu_rows(t0), cpu_cols(t0), DP_ATTR(in, MATMUL_GELU_GRAD, transA) != 0,
	      cpu_f(k, in->in[1]), cpu_rows(t1), cpu_cols(t1), DP_ATTR(in, MATMUL_GELU_GRAD, transB) != 0,
	      o, 0.0f, NULL, NULL);
	cpu_map(k, DP_OP_GELU_GRAD, o, o, cpu_f(k, in->in[2]), 0, cpu_numel(cpu_t(k, in->out)));
	return 0;
}

/* Column sums, split by columns: every column is summed over the rows in
 * order (in double, vectorised across columns), whatever the split. */
typedef struct {
	const CpuVec *vec;
	const float *a;
	float *o;
	double *sum;
	int64_t rows, c;
	int acc;
} ColSum;

static void col_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const ColSum *j = ctx;
	double *sum = j->sum + lo;
	for (int64_t i = 0; i < hi - lo; i++)
		sum[i] = j->acc ? j->o[lo + i] : 0;
	for (int64_t r = 0; r < j->rows; r++)
		j->vec->col_sum(sum, j->a + r * j->c + lo, hi - lo);
	for (int64_t i = 0; i < hi - lo; i++)
		j->o[lo + i] = (float)sum[i];
}

static int run_bias_grad(const CpuArgs *k, RtErr *e)
{
	int64_t c = cpu_numel(cpu_t(k, k->in->out)), rows = cpu_numel(cpu_t(k, k->in->in[0])) / c;
	ColSum j = {k->vec, cpu_f(k, k->in->in[0]), cpu_f(k, k->in->out), malloc((size_t)c * sizeof(double)),
		    rows, c, DP_ATTR(k->in, BIAS_GRAD, acc) != 0};
	if (!j.sum)
		return RT_FAIL(e, "out of memory (bias gradient of %lld channels)", (long long)c);
	cpu_parallel(k->pool, c, rows * c < 2 * CPU_GRAIN ? c : 16, col_piece, &j);
	free(j.sum);
	return 0;
}

/*
 * PowerSGD's kernels (passes/compress.c). orthogonalize: Gram-Schmidt over
 * the columns of out [rows, r] (row-major: a column is strided by r) in f32,
 * left-looking: column i has every earlier column's projection taken out
 * (each dot product against its current value, the modified form: the
 * operations of PyTorch's _orthogonalize_gram_schmidt, which projects a
 * normalised column out of every later one), and a second time (Giraud et
 * al.'s "twice is enough"), then is divided by its norm. One pass loses
 * orthogonality when P is nearly rank-deficient (a gradient of rank below
 * r: a batch smaller than the matrix), where PyTorch's hook takes
 * torch.linalg.qr (Householder) for r > 2; the second pass gives columns
 * orthonormal to f32 rounding there too, and changes a well-conditioned P
 * by rounding only. A column of norm 0 stays 0 (PyTorch's own handler of
 * that case). OpenBLAS's level-1 calls do the strided columns.
 */
static int run_orthogonalize(const CpuArgs *k, RtErr *e)
{
	const DpTensor *t = cpu_t(k, k->in->out);
	int rows = (int)cpu_rows(t), r = (int)cpu_cols(t);
	float *a = cpu_f(k, k->in->out);
	if (DP_ATTR(k->in, ORTHOGONALIZE, fresh)) { /* warm_start=false: powersgd.h */
		uint64_t ks = dp_psgd_step_seed(k->s->cfg.seed, k->step->k),
			 h = dp_psgd_hash(k->s->strings + t->name);
		for (int64_t i = 0; i < (int64_t)rows * r; i++)
			a[i] = dp_psgd_normal(ks, h, (uint64_t)i);
	}
	for (int i = 0; i < r; i++) {
		float *col = a + i;
		for (int pass = 0; pass < 2; pass++)
			for (int j = 0; j < i; j++)
				cblas_saxpy(rows, -cblas_sdot(rows, a + j, r, col, r), a + j, r, col, r);
		float norm = cblas_snrm2(rows, col, r);
		for (int j = 0; j < rows; j++)
			col[(int64_t)j * r] = norm > 0 ? col[(int64_t)j * r] / norm : 0.0f;
	}
	return 0;
}

static int limit_orthogonalize(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	const DpTensor *t = &s->tensors[in->out];
	CPU_NEED(cpu_rows(t) <= INT_MAX && cpu_cols(t) <= INT_MAX, "matrix too large for BLAS");
	return 0;
}

static int run_gemm16(const CpuArgs *k, RtErr *e)
{
	return cpu_gemm16_run(k->gemm16, k, e);
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
const KernelRow cpu_gemm_rows[] = {
	{DP_OP_MATMUL, run_matmul, limit_matmul, 0, run_gemm16, NULL, 0, 0},
	{DP_OP_LINEAR, run_linear, limit_linear, 0, run_gemm16, NULL, 0, 0},
	{DP_OP_BIAS_GRAD, run_bias_grad, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_LINEAR_GELU, run_linear_gelu, limit_linear, 0, NULL, NULL, 0, 0},
	{DP_OP_MATMUL_GELU_GRAD, run_matmul_gelu_grad, limit_matmul, 0, NULL, NULL, 0, 0},
	{DP_OP_ORTHOGONALIZE, run_orthogonalize, limit_orthogonalize, 0, NULL, NULL, 0, 0},
	{0},
};
