/*
 * tests/cpu_kernels_test.c - the CPU backend's kernels where the PyTorch
 * and finite-difference suites cannot look closely:
 *
 *  1. flash attention (runtime/cpu/seq.c), forward and backward,
 *     against a plain attention in double (the T x T scores, softmax,
 *     products) at T from 1 to 8300: T = 1, below a block, not a multiple
 *     of the 32-row blocks, several blocks (one key tile per block: the
 *     row panel), T = 4200 where the backward takes 64-key tiles (online
 *     rescaling, recomputed S and dP) and T = 8300 where the forward does
 *     too. Tolerance: max |got - ref| <= 2e-5 * max |ref| per output.
 *     float32 products of at most hd (forward) or T (dV, dK) terms with
 *     online rescaling give ~1e-6 relative in practice (printed), and a
 *     wrong mask, scale or rescale is off by far more than 1e-3.
 *  2. thread-count invariance: every kernel that uses the pool, GEMMs
 *     included (OpenBLAS's kernels as dpexec picks them for this CPU:
 *     gemm.c), gives bitwise the same output with 1, 2 and 3 threads
 *     (static cuts, no cross-item reductions whose order moves: pool.c).
 *  3. the instruction sets (vec.c): each table the CPU has against the
 *     scalar one (libm per element): AdamW and the other maps without
 *     exp/tanh bitwise equal (IEEE operations in the same order, no FMA
 *     contraction), exp-based maps within 4 ulp (SLEEF and glibc are each
 *     within 1 ulp; GELU adds a division; for gelu' and silu' the unit is
 *     at least eps |dy| (1 + |x|): 1 + x (1 - s) cancels near their zeros),
 *     double sums within 1e-12
 *     relative (another order); and GELU against the exact function (long
 *     double) within 64 ulp on [-5, 12] (the float rounding of its inner
 *     polynomial; the old 1 + tanh form was off by millions of ulp there).
 *
 *  4. context-parallel attention (runtime/cpu/attention_cp.c): a sequence of
 *     cp*T tokens cut in the zigzag layout over cp ranks; every rank's
 *     attention_cp of its rows against all ranks' kv_packs equals those rows
 *     of the plain attention in double of the whole sequence, and so do the
 *     q gradient (attention_cp_grad) and, summed over ranks as the
 *     reduce_scatter sums them, the key/value gradients
 *     (attention_cp_grad_kv), unpacked by kv_unpack; tolerance as in 1.
 *  5. layernorm_grad_gb (passes/fuse.c's gamma and beta gradients in one
 *     walk) bitwise the layernorm_grad_g and bias_grad it replaces, with
 *     and without acc, at 768 columns and at 300.
 *
 * Prints "cpu_kernels: N passed, M failed" last.
 */
#include <float.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "../runtime/cpu/cpu.h"
#include "../runtime/dropout.h"

static int npass, nfail;
static CpuBlas blas; /* set in main, before any GEMM */

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...)
{
	va_list ap;
	if (ok) {
		npass++;
		return;
	}
	nfail++;
	printf("FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

/* ---- a step file of a few tensors and one instruction ---- */

#define MAXT 8

typedef struct {
	DpStep s;
	DpTensor t[MAXT];
	void *ptr[MAXT];
	int n;
	DpOptim opt;
	CpuStep step;
} Ctx;

static void ctx_init(Ctx *c)
{
	static char strings[] = "t";
	memset(c, 0, sizeof *c);
	c->s.strings = strings;
	c->s.nstrings = sizeof strings;
	c->s.tensors = c->t;
	c->opt = (DpOptim){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
			   .weight_decay = 0.1f};
	c->step = (CpuStep){.opt = &c->opt, .lr = 1e-3f, .t = 3, .loss_scale = 1};
}

static void ctx_free(Ctx *c)
{
	for (int i = 0; i < c->n; i++)
		free(c->ptr[i]);
}

/* A tensor [d0, d1, d2] (0: absent dim) of random values in [-amp, amp]. */
static int tensor(Ctx *c, DpDtype dt, int64_t d0, int64_t d1, int64_t d2, float amp)
{
	int id = c->n++;
	DpTensor *t = &c->t[id];
	int64_t dims[3] = {d0, d1, d2}, n = 1;
	for (int k = 0; k < 3 && dims[k]; k++) {
		t->dims[k] = dims[k];
		t->ndim = (uint8_t)(k + 1);
		n *= dims[k];
	}
	t->dtype = dt;
	t->nbytes = (uint64_t)n * 4;
	t->offset = (uint64_t)id << 40; /* disjoint, for the checks */
	c->ptr[id] = malloc((size_t)n * 4 + 64);
	for (int64_t i = 0; i < n; i++) {
		float r = (float)rand() / (float)RAND_MAX * 2 - 1;
		if (dt == DP_I32)
			((int32_t *)c->ptr[id])[i] = 0;
		else
			((float *)c->ptr[id])[i] = amp * r;
	}
	c->s.ntensors = (uint32_t)c->n;
	return id;
}

static float *F(Ctx *c, int id) { return c->ptr[id]; }

static int64_t numel(Ctx *c, int id)
{
	return (int64_t)(c->t[id].nbytes / 4);
}

static const KernelRow *find(unsigned op)
{
	return kernel_row(cpu_kernel_table(), op);
}

/* Check (the decoder's operand rule, the backend's limits) and run one
 * instruction; 0 on success. */
static int run(Ctx *c, const CpuVec *vec, CpuPool *pool, DpInstr in)
{
	RtErr e = {.rank = 0};
	const KernelRow *k = find(in.op);
	if (!k || dpstep_check_operands(&c->s, &in, "test", e.msg, sizeof e.msg) ||
	    (k->limits && k->limits(&c->s, &in, &e))) {
		printf("  %s: %s\n", dp_op_names[in.op], k ? e.msg : "no kernel");
		return -1;
	}
	CpuArgs a = {&c->s, &in, c->ptr, &c->step, vec, pool, &blas, NULL}; /* f32 kernels: no bf16 GEMMs */
	if (k->run(&a, &e)) {
		printf("  %s: %s\n", dp_op_names[in.op], e.msg);
		return -1;
	}
	return 0;
}

static DpInstr instr(unsigned op, int out, int i0, int i1, int i2)
{
	return (DpInstr){.op = (uint16_t)op, .in = {i0, i1, i2, -1}, .out = out};
}

/* ---- 1. flash attention against attention in double ---- */

/* out [B,T,C] and, with dy, dqkv [B,T,3C]; qkv head-major as seq.c
 * says. Row by row (O(T) memory: the long cases are long). */
static void ref_attention(const float *qkv, const float *dy, int64_t B, int64_t T, int H, int hd,
			  double *out, double *dqkv)
{
	int64_t C = (int64_t)H * hd, ld = 3 * C;
	double scale = 1.0 / sqrt((double)hd);
	double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
	if (dqkv)
		memset(dqkv, 0, (size_t)(B * T * ld) * sizeof(double));
	for (int64_t b = 0; b < B; b++)
		for (int h = 0; h < H; h++) {
			const float *q = qkv + b * T * ld + 3 * hd * h, *k = q + hd, *v = q + 2 * hd;
			double *dq = dqkv ? dqkv + b * T * ld + 3 * hd * h : NULL;
			for (int64_t i = 0; i < T; i++) {
				double mx = -INFINITY, sum = 0, dot = 0;
				for (int64_t j = 0; j <= i; j++) {
					double s = 0;
					for (int d = 0; d < hd; d++)
						s += (double)q[i * ld + d] * k[j * ld + d];
					p[j] = s * scale;
					mx = fmax(mx, p[j]);
				}
				for (int64_t j = 0; j <= i; j++)
					sum += p[j] = exp(p[j] - mx);
				for (int64_t j = 0; j <= i; j++)
					p[j] /= sum;
				for (int d = 0; d < hd; d++) {
					double o = 0;
					for (int64_t j = 0; j <= i; j++)
						o += p[j] * v[j * ld + d];
					out[(b * T + i) * C + h * hd + d] = o;
				}
				if (!dq)
					continue;
				/* dS = P (dP - rowsum(P dP)); dq += scale dS k, dk += scale dS q, dv += P dy */
				const float *g = dy + (b * T + i) * C + h * hd;
				for (int64_t j = 0; j <= i; j++) {
					dp[j] = 0;
					for (int d = 0; d < hd; d++) {
						dp[j] += (double)g[d] * v[j * ld + d];
						dq[j * ld + 2 * hd + d] += p[j] * g[d];
					}
					dot += p[j] * dp[j];
				}
				for (int64_t j = 0; j <= i; j++) {
					double ds = p[j] * (dp[j] - dot) * scale;
					for (int d = 0; d < hd; d++) {
						dq[i * ld + d] += ds * k[j * ld + d];
						dq[j * ld + hd + d] += ds * q[i * ld + d];
					}
				}
			}
		}
	free(p);
	free(dp);
}

static double rel_err(const float *got, const double *ref, int64_t n)
{
	double err = 0, mag = 0;
	for (int64_t i = 0; i < n; i++) {
		err = fmax(err, fabs(got[i] - ref[i]));
		mag = fmax(mag, fabs(ref[i]));
	}
	return err / (mag > 0 ? mag : 1);
}

static void test_attention(const CpuVec *vec)
{
	static const struct {
		int64_t B, T;
		int H, hd;
	} cases[] = {{2, 1, 1, 4}, {1, 5, 2, 4},    {2, 64, 2, 16}, {1, 100, 3, 8},
		     {2, 128, 4, 64}, {1, 200, 2, 32}, {1, 4200, 1, 4}, {1, 8300, 1, 2}};
	for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
		int64_t B = cases[ci].B, T = cases[ci].T;
		int H = cases[ci].H, hd = cases[ci].hd;
		int64_t C = (int64_t)H * hd;
		Ctx c;
		ctx_init(&c);
		int qkv = tensor(&c, DP_F32, B, T, 3 * C, 1.5f), out = tensor(&c, DP_F32, B, T, C, 0);
		int dy = tensor(&c, DP_F32, B, T, C, 1.0f), dqkv = tensor(&c, DP_F32, B, T, 3 * C, 0);
		double *ro = malloc((size_t)(B * T * C) * sizeof(double));
		double *rd = malloc((size_t)(B * T * 3 * C) * sizeof(double));
		ref_attention(F(&c, qkv), F(&c, dy), B, T, H, hd, ro, rd);
		DpInstr fwd = instr(DP_OP_ATTENTION, out, qkv, -1, -1),
			bwd = instr(DP_OP_ATTENTION_GRAD, dqkv, dy, qkv, -1);
		DP_ATTR(&fwd, ATTENTION, heads) = DP_ATTR(&bwd, ATTENTION_GRAD, heads) = H;
		int ok = run(&c, vec, NULL, fwd) == 0 && run(&c, vec, NULL, bwd) == 0;
		double ef = ok ? rel_err(F(&c, out), ro, numel(&c, out)) : 1;
		double eb = ok ? rel_err(F(&c, dqkv), rd, numel(&c, dqkv)) : 1;
		printf("  attention B=%lld T=%lld heads=%d hd=%d: forward %.1e, backward %.1e (relative)\n",
		       (long long)B, (long long)T, H, hd, ef, eb);
		check(ok && ef <= 2e-5, "attention forward T=%lld: %.2e", (long long)T, ef);
		check(ok && eb <= 2e-5, "attention backward T=%lld: %.2e", (long long)T, eb);
		free(ro);
		free(rd);
		ctx_free(&c);
	}
}

/* ---- 1b. the scalar operands: scale and add_scalar read DP_SCALAR ---- */

static void test_scalar_ops(const CpuVec *vec)
{
	static const unsigned ops[] = {DP_OP_SCALE, DP_OP_ADD_SCALAR};
	for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
		Ctx c;
		ctx_init(&c);
		int x = tensor(&c, DP_F32, 3, 37, 0, 4.0f), out = tensor(&c, DP_F32, 3, 37, 0, 0);
		DpInstr in = instr(ops[k], out, x, -1, -1);
		float s = -0.3f;
		DP_SCALAR(&in) = s;
		int ok = run(&c, vec, NULL, in) == 0;
		for (int64_t i = 0; ok && i < numel(&c, x); i++) {
			float a = F(&c, x)[i], want = ops[k] == DP_OP_SCALE ? s * a : a + s;
			ok = memcmp(&F(&c, out)[i], &want, sizeof want) == 0;
		}
		check(ok, "%s %s: not bitwise the closed form with the scalar %g", vec->isa,
		      dp_op_names[ops[k]], s);
		ctx_free(&c);
	}
}

/* fp16's loss scaling (passes/lossscale.c): cross_entropy_grad with its
 * loss_scale flag is the unscaled gradient times the step's scale, bitwise
 * for a power of two; unscale multiplies by the f32 reciprocal of the
 * scale (computed in double, as GradScaler's unscale_). */
static void test_loss_scale(const CpuVec *vec)
{
	Ctx c;
	ctx_init(&c);
	c.step.loss_scale = 32768.0f;
	int x = tensor(&c, DP_F32, 70, 50, 0, 4), y = tensor(&c, DP_I32, 70, 0, 0, 0);
	for (int r = 0; r < 70; r++)
		((int32_t *)c.ptr[y])[r] = r % 9 == 4 ? -1 : (r * 13) % 50;
	int plain = tensor(&c, DP_F32, 70, 50, 0, 0), scaled = tensor(&c, DP_F32, 70, 50, 0, 0);
	DpInstr in = instr(DP_OP_XENT_GRAD, plain, x, y, -1);
	DP_FATTR(&in, XENT_GRAD, scale) = 1.0f / 560;
	int ok = run(&c, vec, NULL, in) == 0;
	in.out = scaled;
	DP_ATTR(&in, XENT_GRAD, loss_scale) = 1;
	ok = ok && run(&c, vec, NULL, in) == 0;
	for (int64_t i = 0; ok && i < numel(&c, plain); i++) {
		float want = F(&c, plain)[i] * 32768.0f;
		ok = memcmp(&F(&c, scaled)[i], &want, sizeof want) == 0;
	}
	check(ok, "%s cross_entropy_grad loss_scale: not the unscaled gradient times 2^15", vec->isa);
	c.step.loss_scale = 3.0f; /* not a power of two: the f32 reciprocal, then a product */
	int g = tensor(&c, DP_F32, 1000, 0, 0, 8);
	float *copy = malloc(1000 * sizeof *copy), inv = (float)(1.0 / 3.0);
	memcpy(copy, F(&c, g), 1000 * sizeof *copy);
	ok = run(&c, vec, NULL, instr(DP_OP_UNSCALE, g, -1, -1, -1)) == 0;
	for (int i = 0; ok && i < 1000; i++) {
		float want = copy[i] * inv;
		ok = memcmp(&F(&c, g)[i], &want, sizeof want) == 0;
	}
	check(ok, "%s unscale: not g * (float)(1.0 / scale)", vec->isa);
	free(copy);
	ctx_free(&c);
}

static int64_t zigzag(int64_t r, int64_t j, int64_t cp, int64_t t);

/* ---- 1c. dropout: Philox4x32-10's known answers, the keep rate, the keys ---- */

static void test_dropout(const CpuVec *vec)
{
	/* Random123's kat_vectors, philox4x32 10: counter, key -> the 4 words */
	static const uint32_t kat[3][10] = {
		{0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
		{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
		 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
		{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
		 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
	for (int k = 0; k < 3; k++) {
		philox4x32_ctr_t c = {{kat[k][0], kat[k][1], kat[k][2], kat[k][3]}};
		philox4x32_key_t key = {{kat[k][4], kat[k][5]}};
		philox4x32_ctr_t r = philox4x32(c, key);
		check(!memcmp(r.v, kat[k] + 6, sizeof r.v), "philox4x32-10 known answer %d", k);
		/* dp_dropout_keep's counter {e / 4, sample, step, site}, key the seed,
		 * word e % 4: its threshold is that word's bound */
		uint64_t seed = (uint64_t)kat[k][5] << 32 | kat[k][4];
		for (int w = 0; w < 4; w++) {
			uint64_t e = (uint64_t)kat[k][0] * 4 + (uint64_t)w;
			int keep = dp_dropout_keep(seed, kat[k][3], kat[k][1], kat[k][2], e, kat[k][6 + w]);
			int drop = kat[k][6 + w] < 0xffffffffu &&
				   !dp_dropout_keep(seed, kat[k][3], kat[k][1], kat[k][2], e,
						    kat[k][6 + w] + 1);
			check(keep && (drop || kat[k][6 + w] == 0xffffffffu),
			      "dropout: element %llu's draw is word %d of the counter", (unsigned long long)e, w);
		}
	}
	/* the kernel: samples 7 and 8 of step 3 at p = 0.3, [2, 5, 4000]; the
	 * keep rate within 5 sigma of the binomial's mean; kept elements x / 0.7
	 * exactly; a sample whose keys are -1 (eval) unchanged; the same element
	 * of the same sample gets the same mask whatever row it is in */
	Ctx c;
	ctx_init(&c);
	int x = tensor(&c, DP_F32, 2, 5, 4000, 1.0f), out = tensor(&c, DP_F32, 2, 5, 4000, 0);
	int keys = tensor(&c, DP_I32, 2, 2, 0, 0);
	int32_t *kv = c.ptr[keys];
	kv[0] = 7, kv[1] = 3, kv[2] = 8, kv[3] = 3;
	DpInstr in = instr(DP_OP_DROPOUT, out, x, keys, -1);
	DP_FATTR(&in, DROPOUT, p) = 0.3f;
	DP_ATTR(&in, DROPOUT, site) = 2;
	c.s.cfg.seed = 1234;
	int ok = run(&c, vec, NULL, in) == 0;
	int64_t n = numel(&c, x), kept = 0, exact = 1;
	float scale = (float)(1.0 / 0.7);
	for (int64_t i = 0; ok && i < n; i++) {
		float a = F(&c, x)[i], o = F(&c, out)[i];
		kept += o != 0;
		exact &= o == 0 || o == a * scale;
	}
	double mean = 0.7 * (double)n, sd = sqrt((double)n * 0.7 * 0.3);
	printf("  dropout p=0.3: kept %lld of %lld (binomial mean %.0f, sd %.1f)\n", (long long)kept,
	       (long long)n, mean, sd);
	check(ok && fabs((double)kept - mean) <= 5 * sd, "dropout keep rate: %lld of %lld",
	      (long long)kept, (long long)n);
	check(ok && exact, "dropout: a kept element is x / (1 - p) rounded once");
	/* sample 8 moved to row 0: its mask moves with it */
	float first = F(&c, out)[n / 2 + 17];
	int same = 1;
	kv[0] = 8;
	memcpy(F(&c, x), F(&c, x) + n / 2, (size_t)(n / 2) * sizeof(float));
	ok = run(&c, vec, NULL, in) == 0;
	for (int64_t i = 0; ok && i < n / 2; i++)
		same &= F(&c, out)[i] == F(&c, out)[n / 2 + i];
	check(ok && same && F(&c, out)[17] == first, "dropout: the mask follows the sample, not the row");
	/* context parallelism: cp rank r's rows of dim 1 at their zigzag
	 * positions (pos) get the whole sequence's mask at those positions */
	int cpok = 1;
	for (int r = 0; r < 2 && cpok; r++) {
		Ctx h;
		ctx_init(&h);
		h.s.cfg.seed = 1234;
		int hx = tensor(&h, DP_F32, 2, 2, 4000, 0), ho = tensor(&h, DP_F32, 2, 2, 4000, 0);
		int hk = tensor(&h, DP_I32, 2, 2, 0, 0), hp = tensor(&h, DP_I32, 2, 0, 0, 0);
		memcpy(h.ptr[hk], kv, 4 * sizeof(int32_t));
		int32_t *pos = h.ptr[hp];
		for (int j = 0; j < 2; j++) /* T = 4 split over cp = 2 in 4 chunks of 1 */
			pos[j] = (int32_t)zigzag(r, j, 2, 2);
		for (int b = 0; b < 2; b++)
			for (int j = 0; j < 2; j++)
				memcpy(F(&h, hx) + (b * 2 + j) * 4000, F(&c, x) + (b * 5 + pos[j]) * 4000,
				       4000 * sizeof(float));
		DpInstr hin = instr(DP_OP_DROPOUT, ho, hx, hk, hp);
		DP_FATTR(&hin, DROPOUT, p) = DP_FATTR(&in, DROPOUT, p);
		DP_ATTR(&hin, DROPOUT, site) = DP_ATTR(&in, DROPOUT, site);
		cpok = run(&h, vec, NULL, hin) == 0;
		for (int b = 0; cpok && b < 2; b++)
			for (int j = 0; j < 2; j++)
				cpok &= !memcmp(F(&h, ho) + (b * 2 + j) * 4000,
						F(&c, out) + (b * 5 + pos[j]) * 4000, 4000 * sizeof(float));
		ctx_free(&h);
	}
	check(cpok, "dropout: a cp rank's rows at their positions get the whole sequence's mask");
	kv[0] = kv[1] = -1;
	ok = run(&c, vec, NULL, in) == 0;
	check(ok && !memcmp(F(&c, out), F(&c, x), (size_t)(n / 2) * sizeof(float)),
	      "dropout: a sample keyed -1 (eval) is unchanged");
	ctx_free(&c);
}

/* ---- 4. context-parallel attention against the whole sequence ---- */

/* Global position of local row j of cp rank r (T local rows): format/ops.def. */
static int64_t zigzag(int64_t r, int64_t j, int64_t cp, int64_t t)
{
	int64_t l = t / 2;
	return j < l ? r * l + j : (2 * cp - 1 - r) * l + (j - l);
}

static void test_attention_cp(const CpuVec *vec)
{
	static const struct {
		int64_t B, T; /* T: local rows per rank */
		int cp, H, hd;
	} cases[] = {{2, 8, 2, 2, 4}, {1, 6, 3, 1, 8}, {1, 130, 2, 2, 16}, {2, 4, 4, 3, 4}};
	for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
		int64_t B = cases[ci].B, T = cases[ci].T, cp = cases[ci].cp, TG = cp * T;
		int H = cases[ci].H, hd = cases[ci].hd;
		int64_t C = (int64_t)H * hd;
		Ctx w; /* the whole sequence, for the reference */
		ctx_init(&w);
		int qf = tensor(&w, DP_F32, B, TG, 3 * C, 1.5f), df = tensor(&w, DP_F32, B, TG, C, 1.0f);
		double *ro = malloc((size_t)(B * TG * C) * sizeof(double));
		double *rd = malloc((size_t)(B * TG * 3 * C) * sizeof(double));
		ref_attention(F(&w, qf), F(&w, df), B, TG, H, hd, ro, rd);
		Ctx c; /* one rank's tensors, the gathered kv shared by all */
		ctx_init(&c);
		int qkv = tensor(&c, DP_F32, B, T, 3 * C, 0), dy = tensor(&c, DP_F32, B, T, C, 0);
		int pos = tensor(&c, DP_I32, T, 0, 0, 0), kv = tensor(&c, DP_F32, B, T, 2 * C, 0);
		int all = tensor(&c, DP_F32, cp * B, T, 2 * C, 0), out = tensor(&c, DP_F32, B, T, C, 0);
		int dq = tensor(&c, DP_F32, B, T, 3 * C, 0), dkv = tensor(&c, DP_F32, cp * B, T, 2 * C, 0);
		double *sum = calloc((size_t)(cp * B * T * 2 * C), sizeof(double));
		double ef = 0, eq = 0;
		int ok = 1;
		/* this rank's rows of the whole sequence; kv_pack of each rank into its block */
		for (int pass = 0; pass < 2; pass++)
			for (int64_t r = 0; r < cp && ok; r++) {
				for (int64_t b = 0; b < B; b++)
					for (int64_t j = 0; j < T; j++) {
						int64_t p = zigzag(r, j, cp, T);
						memcpy(F(&c, qkv) + (b * T + j) * 3 * C, F(&w, qf) + (b * TG + p) * 3 * C,
						       (size_t)(3 * C) * sizeof(float));
						memcpy(F(&c, dy) + (b * T + j) * C, F(&w, df) + (b * TG + p) * C,
						       (size_t)C * sizeof(float));
						((int32_t *)c.ptr[pos])[j] = (int32_t)p;
					}
				DpInstr pk = instr(DP_OP_KV_PACK, kv, qkv, -1, -1);
				DP_ATTR(&pk, KV_PACK, heads) = H;
				ok = run(&c, vec, NULL, pk) == 0;
				if (pass == 0) { /* gather: block r is rank r's kv */
					memcpy(F(&c, all) + r * B * T * 2 * C, F(&c, kv),
					       (size_t)(B * T * 2 * C) * sizeof(float));
					continue;
				}
				DpInstr f = instr(DP_OP_ATTENTION_CP, out, qkv, all, pos);
				DpInstr g = {.op = DP_OP_ATTENTION_CP_GRAD, .in = {dy, qkv, all, pos}, .out = dq};
				DpInstr gk = {.op = DP_OP_ATTENTION_CP_GRAD_KV, .in = {dy, qkv, all, pos}, .out = dkv};
				DP_ATTR(&f, ATTENTION_CP, heads) = H, DP_ATTR(&f, ATTENTION_CP, cp) = cp;
				DP_ATTR(&g, ATTENTION_CP_GRAD, heads) = H, DP_ATTR(&g, ATTENTION_CP_GRAD, cp) = cp;
				DP_ATTR(&gk, ATTENTION_CP_GRAD_KV, heads) = H;
				DP_ATTR(&gk, ATTENTION_CP_GRAD_KV, cp) = cp;
				ok = ok && run(&c, vec, NULL, f) == 0 && run(&c, vec, NULL, g) == 0 &&
				     run(&c, vec, NULL, gk) == 0;
				for (int64_t b = 0; ok && b < B; b++)
					for (int64_t j = 0; j < T; j++) {
						int64_t p = zigzag(r, j, cp, T);
						for (int64_t k = 0; k < C; k++) {
							double want = ro[(b * TG + p) * C + k];
							ef = fmax(ef, fabs(F(&c, out)[(b * T + j) * C + k] - want));
						}
						for (int64_t k = 0; k < 3 * C; k++) { /* q columns only */
							if ((k % (3 * hd)) >= hd)
								continue;
							double want = rd[(b * TG + p) * 3 * C + k];
							eq = fmax(eq, fabs(F(&c, dq)[(b * T + j) * 3 * C + k] - want));
						}
					}
				for (int64_t i = 0; ok && i < cp * B * T * 2 * C; i++)
					sum[i] += F(&c, dkv)[i]; /* the reduce_scatter's sum */
			}
		/* rank r's keys and values: its block of the sum, unpacked */
		double ek = 0, mo = 0, md = 0;
		for (int64_t i = 0; i < B * TG * C; i++)
			mo = fmax(mo, fabs(ro[i]));
		for (int64_t i = 0; i < B * TG * 3 * C; i++)
			md = fmax(md, fabs(rd[i]));
		for (int64_t r = 0; ok && r < cp; r++) {
			for (int64_t i = 0; i < B * T * 2 * C; i++)
				F(&c, kv)[i] = (float)sum[r * B * T * 2 * C + i];
			DpInstr un = instr(DP_OP_KV_UNPACK, dq, kv, -1, -1);
			DP_ATTR(&un, KV_UNPACK, heads) = H;
			ok = run(&c, vec, NULL, un) == 0;
			for (int64_t b = 0; ok && b < B; b++)
				for (int64_t j = 0; j < T; j++)
					for (int64_t k = 0; k < 3 * C; k++) {
						int64_t p = zigzag(r, j, cp, T);
						double want = (k % (3 * hd)) < hd ? 0 : rd[(b * TG + p) * 3 * C + k];
						ek = fmax(ek, fabs(F(&c, dq)[(b * T + j) * 3 * C + k] - want));
					}
		}
		ef /= mo > 0 ? mo : 1;
		eq /= md > 0 ? md : 1;
		ek /= md > 0 ? md : 1;
		printf("  attention_cp B=%lld T=%lld x cp=%lld heads=%d hd=%d: forward %.1e, dq %.1e, "
		       "dk/dv %.1e (relative)\n", (long long)B, (long long)T, (long long)cp, H, hd, ef,
		       eq, ek);
		check(ok && ef <= 2e-5, "attention_cp forward cp=%lld T=%lld: %.2e", (long long)cp,
		      (long long)T, ef);
		check(ok && eq <= 2e-5, "attention_cp dq cp=%lld T=%lld: %.2e", (long long)cp,
		      (long long)T, eq);
		check(ok && ek <= 2e-5, "attention_cp dk/dv cp=%lld T=%lld: %.2e", (long long)cp,
		      (long long)T, ek);
		free(sum);
		free(ro);
		free(rd);
		ctx_free(&c);
		ctx_free(&w);
	}
}

/* ---- 2. the same bits at 1, 2 and 3 threads ---- */

typedef struct {
	const char *name;
	Ctx c;
	DpInstr in;
	int nout; /* outputs to compare: in.out, and in.in[1], in.in[2] for ADAMW */
} Case;

/* Build case k into c (fresh random inputs from a fixed seed); NULL past the end. */
static const char *build(int k, Ctx *c, DpInstr *in)
{
	srand(1000 + k);
	ctx_init(c);
	int a, b, o, g, x;
	switch (k) {
	case 0: /* rows >= cols: split by rows */
		a = tensor(c, DP_F32, 300, 200, 0, 1), b = tensor(c, DP_F32, 200, 130, 0, 1);
		o = tensor(c, DP_F32, 300, 130, 0, 0);
		*in = instr(DP_OP_MATMUL, o, a, b, -1);
		return "matmul (split by rows)";
	case 1: /* split by columns, transposed A, accumulate */
		a = tensor(c, DP_F32, 700, 96, 0, 1), b = tensor(c, DP_F32, 700, 450, 0, 1);
		o = tensor(c, DP_F32, 96, 450, 0, 1);
		*in = instr(DP_OP_MATMUL, o, a, b, -1);
		DP_ATTR(in, MATMUL, transA) = 1, DP_ATTR(in, MATMUL, acc) = 1;
		return "matmul^T acc (split by columns)";
	case 2:
		a = tensor(c, DP_F32, 5, 77, 64, 1), b = tensor(c, DP_F32, 64, 200, 0, 1);
		g = tensor(c, DP_F32, 200, 0, 0, 1), o = tensor(c, DP_F32, 5, 77, 200, 0);
		*in = instr(DP_OP_LINEAR, o, a, b, g);
		return "linear with bias";
	case 3:
		a = tensor(c, DP_F32, 3000, 70, 0, 1), o = tensor(c, DP_F32, 70, 0, 0, 1);
		*in = instr(DP_OP_BIAS_GRAD, o, a, -1, -1);
		DP_ATTR(in, BIAS_GRAD, acc) = 1;
		return "bias_grad";
	case 4:
		x = tensor(c, DP_F32, 900, 100, 0, 3), g = tensor(c, DP_F32, 100, 0, 0, 1);
		b = tensor(c, DP_F32, 100, 0, 0, 1), o = tensor(c, DP_F32, 900, 100, 0, 0);
		*in = instr(DP_OP_LAYERNORM, o, x, g, b);
		DP_FATTR(in, LAYERNORM, eps) = 1e-5f;
		return "layernorm";
	case 5:
		a = tensor(c, DP_F32, 900, 100, 0, 1), x = tensor(c, DP_F32, 900, 100, 0, 3);
		g = tensor(c, DP_F32, 100, 0, 0, 1), o = tensor(c, DP_F32, 900, 100, 0, 0);
		*in = instr(DP_OP_LAYERNORM_GRAD, o, a, x, g);
		DP_FATTR(in, LAYERNORM_GRAD, eps) = 1e-5f;
		return "layernorm_grad";
	case 6:
		a = tensor(c, DP_F32, 900, 100, 0, 1), x = tensor(c, DP_F32, 900, 100, 0, 3);
		o = tensor(c, DP_F32, 100, 0, 0, 1);
		*in = instr(DP_OP_RMSNORM_GRAD_G, o, a, x, -1);
		DP_FATTR(in, RMSNORM_GRAD_G, eps) = 1e-5f, DP_ATTR(in, RMSNORM_GRAD_G, acc) = 1;
		return "rmsnorm_grad_g";
	case 7:
	case 8:
		x = tensor(c, DP_F32, 1000, 300, 0, 4), b = tensor(c, DP_I32, 1000, 0, 0, 0);
		for (int r = 0; r < 1000; r++)
			((int32_t *)c->ptr[b])[r] = r % 7 == 3 ? -1 : (r * 37) % 300;
		o = k == 7 ? tensor(c, DP_F32, 1, 0, 0, 0) : tensor(c, DP_F32, 1000, 300, 0, 0);
		*in = instr(k == 7 ? DP_OP_XENT : DP_OP_XENT_GRAD, o, x, b, -1);
		if (k == 7)
			DP_FATTR(in, XENT, scale) = 1e-3f;
		else
			DP_FATTR(in, XENT_GRAD, scale) = 1e-3f;
		return k == 7 ? "cross_entropy" : "cross_entropy_grad";
	case 9:
		a = tensor(c, DP_F32, 1000003, 0, 0, 1), o = tensor(c, DP_F32, 1, 0, 0, 0);
		*in = instr(DP_OP_SQNORM, o, a, -1, -1);
		return "sqnorm";
	case 10:
		g = tensor(c, DP_F32, 100003, 0, 0, 1), a = tensor(c, DP_F32, 100003, 0, 0, 1);
		b = tensor(c, DP_F32, 100003, 0, 0, 1), o = tensor(c, DP_F32, 100003, 0, 0, 1);
		for (int64_t i = 0; i < 100003; i++)
			F(c, b)[i] = fabsf(F(c, b)[i]);
		*in = instr(DP_OP_ADAMW, o, g, a, b);
		return "adamw";
	case 11:
		a = tensor(c, DP_F32, 70001, 0, 0, 4), o = tensor(c, DP_F32, 70001, 0, 0, 0);
		*in = instr(DP_OP_GELU, o, a, -1, -1);
		return "gelu";
	case 12:
		a = tensor(c, DP_F32, 3000, 40, 0, 1), b = tensor(c, DP_I32, 3000, 0, 0, 0);
		o = tensor(c, DP_F32, 50, 40, 0, 1);
		for (int r = 0; r < 3000; r++)
			((int32_t *)c->ptr[b])[r] = (r * 7) % 50;
		*in = instr(DP_OP_EMBEDDING_GRAD, o, a, b, -1);
		DP_ATTR(in, EMBEDDING_GRAD, acc) = 1;
		return "embedding_grad";
	case 13:
		a = tensor(c, DP_F32, 800, 130, 0, 5), o = tensor(c, DP_F32, 800, 130, 0, 0);
		*in = instr(DP_OP_SOFTMAX, o, a, -1, -1);
		return "softmax";
	case 14:
	case 15:
		a = tensor(c, DP_F32, 3, 150, 3 * 64, 1.5f), b = tensor(c, DP_F32, 3, 150, 64, 1);
		if (k == 14) {
			o = tensor(c, DP_F32, 3, 150, 64, 0);
			*in = instr(DP_OP_ATTENTION, o, a, -1, -1);
			DP_ATTR(in, ATTENTION, heads) = 2;
		} else {
			o = tensor(c, DP_F32, 3, 150, 3 * 64, 0);
			*in = instr(DP_OP_ATTENTION_GRAD, o, b, a, -1);
			DP_ATTR(in, ATTENTION_GRAD, heads) = 2;
		}
		return k == 14 ? "attention" : "attention_grad";
	case 16: /* the four transposes with m < n: column cuts, or row cuts */
	case 17: /* where the core's kernels allow no column cut (gemm.c) */
	case 18:
	case 19: {
		int ta = (k - 16) & 1, tb = (k - 16) >> 1;
		a = ta ? tensor(c, DP_F32, 300, 200, 0, 1) : tensor(c, DP_F32, 200, 300, 0, 1);
		b = tb ? tensor(c, DP_F32, 700, 300, 0, 1) : tensor(c, DP_F32, 300, 700, 0, 1);
		o = tensor(c, DP_F32, 200, 700, 0, 0);
		*in = instr(DP_OP_MATMUL, o, a, b, -1);
		DP_ATTR(in, MATMUL, transA) = ta, DP_ATTR(in, MATMUL, transB) = tb;
		static const char *names[] = {"matmul NN, m < n", "matmul TN, m < n", "matmul NT, m < n",
					      "matmul TT, m < n"};
		return names[k - 16];
	}
	case 20: /* GPT-2's row length; columns cut by the pool */
		a = tensor(c, DP_F32, 300, 768, 0, 1), x = tensor(c, DP_F32, 300, 768, 0, 3);
		o = tensor(c, DP_F32, 2, 768, 0, 1);
		*in = instr(DP_OP_LAYERNORM_GRAD_GB, o, a, x, -1);
		DP_FATTR(in, LAYERNORM_GRAD_GB, eps) = 1e-5f, DP_ATTR(in, LAYERNORM_GRAD_GB, acc) = 1;
		return "layernorm_grad_gb";
	default:
		return NULL;
	}
}

static void test_threads(const CpuVec *vec)
{
	CpuPool *pools[3] = {NULL, NULL, NULL};
	RtErr e;
	for (int t = 0; t < 3; t++)
		if (cpu_pool_new(&pools[t], t + 1, &e)) {
			check(0, "thread pool of %d: %s", t + 1, e.msg);
			return;
		}
	for (int k = 0;; k++) {
		Ctx ref, c;
		DpInstr in;
		const char *name = build(k, &ref, &in);
		if (!name)
			break;
		int ok = run(&ref, vec, pools[0], in) == 0, same = ok;
		for (int t = 1; t < 3 && ok; t++) {
			build(k, &c, &in);
			ok = run(&c, vec, pools[t], in) == 0;
			int ids[3] = {in.out, in.op == DP_OP_ADAMW ? in.in[1] : -1,
				      in.op == DP_OP_ADAMW ? in.in[2] : -1};
			for (int j = 0; j < 3 && ok; j++)
				if (ids[j] >= 0 &&
				    memcmp(ref.ptr[ids[j]], c.ptr[ids[j]], ref.t[ids[j]].nbytes) != 0)
					same = 0;
			ctx_free(&c);
		}
		check(ok && same, "%s: not bitwise the same at 1, 2 and 3 threads", name);
		ctx_free(&ref);
	}
	for (int t = 0; t < 3; t++)
		cpu_pool_free(pools[t]);
}

/* ---- 3. the instruction sets against the scalar table ---- */

static double ulps(float got, double want)
{
	float w = fabsf((float)want);
	double u = (double)nextafterf(w, INFINITY) - w;
	return fabs((double)got - want) / u;
}

static long double gelu_ld(long double x)
{
	long double u = 0.797884560802865355879892119868763737L * (x + 0.044715L * x * x * x);
	return x / (1 + expl(-2 * u)); /* 0.5 x (1 + tanh u), without its cancellation */
}

static void test_isa(const CpuVec *v, int have)
{
	if (!have) {
		printf("  %s: not on this CPU, not checked\n", v->isa);
		return;
	}
	const CpuVec *s = &cpu_vec_scalar;
	enum { N = 20011 };
	static float a[N], b[N], o1[N], o2[N], m1[N], m2[N], v1[N], v2[N];
	srand(7);
	for (int i = 0; i < N; i++) {
		a[i] = ((float)rand() / (float)RAND_MAX * 2 - 1) * 12;
		b[i] = ((float)rand() / (float)RAND_MAX * 2 - 1) * 6;
	}
	for (unsigned op = 0; op < DP_NOPS; op++) {
		if (!s->is_map(op))
			continue;
		/* the maps with an exp or tanh: the rest are IEEE +-* in one order */
		int transcendental = op == DP_OP_GELU || op == DP_OP_GELU_GRAD || op == DP_OP_TANH ||
				     op == DP_OP_SILU || op == DP_OP_SILU_GRAD || op == DP_OP_SIGMOID;
		memcpy(o1, b, sizeof o1);
		memcpy(o2, b, sizeof o2);
		v->map(op, o1, a, b, 0.37f, N);
		s->map(op, o2, a, b, 0.37f, N);
		/* in ulp of the result; for the gradients at least eps |dy| (1 + |x|),
		 * the size of the terms of 1 + x (1 - s) that cancel near their zeros */
		double worst = 0;
		for (int i = 0; i < N; i++) {
			double unit = (double)nextafterf(fabsf(o2[i]), INFINITY) - fabsf(o2[i]);
			if (op == DP_OP_GELU_GRAD || op == DP_OP_SILU_GRAD)
				unit = fmax(unit, FLT_EPSILON * fabsf(a[i]) * (1 + fabsf(b[i])));
			worst = fmax(worst, fabs((double)o1[i] - o2[i]) / unit);
		}
		if (transcendental)
			check(worst <= 4, "%s map %d: %.1f ulp from the scalar table", v->isa, op, worst);
		else
			check(memcmp(o1, o2, sizeof o1) == 0, "%s map %d: not bitwise the scalar table's",
			      v->isa, op);
	}
	/* AdamW: bitwise */
	for (int i = 0; i < N; i++)
		m1[i] = m2[i] = b[i] * 0.1f, v1[i] = v2[i] = fabsf(b[i]) * 0.01f;
	memcpy(o1, a, sizeof o1);
	memcpy(o2, a, sizeof o2);
	CpuAdam ad = {0.9999f, 0.9f, 0.95f, 0.1f, 0.05f, 0.3f, 1e-3f, 1e-8f};
	v->adamw(o1, b, m1, v1, N, &ad);
	s->adamw(o2, b, m2, v2, N, &ad);
	check(!memcmp(o1, o2, sizeof o1) && !memcmp(m1, m2, sizeof m1) && !memcmp(v1, v2, sizeof v1),
	      "%s adamw: not bitwise the scalar table's", v->isa);
	/* double sums: another order only */
	double mv, rv, ms, rs;
	v->norm_stats(a, N, 0, 1e-5, &mv, &rv);
	s->norm_stats(a, N, 0, 1e-5, &ms, &rs);
	double d1 = v->exp_shift(o1, b, 6.0f, N), d2 = s->exp_shift(o2, b, 6.0f, N);
	double e1 = v->exp_sum_d(a, 12.0, N), e2 = s->exp_sum_d(a, 12.0, N);
	double t1 = v->dot(a, b, N), t2 = s->dot(a, b, N);
	check(fabs(mv - ms) <= 1e-12 * fabs(ms) && fabs(rv - rs) <= 1e-12 * rs,
	      "%s norm_stats: %g %g vs %g %g", v->isa, mv, rv, ms, rs);
	check(fabs(d1 - d2) <= 1e-6 * d2, "%s exp_shift sum: %.17g vs %.17g", v->isa, d1, d2);
	check(fabs(e1 - e2) <= 1e-12 * e2, "%s exp_sum_d: %.17g vs %.17g", v->isa, e1, e2);
	check(fabs(t1 - t2) <= 1e-12 * fabs(t2), "%s dot: %.17g vs %.17g", v->isa, t1, t2);
	check(v->max(a, N) == s->max(a, N), "%s max", v->isa);
	/* GELU against the exact function on [-5, 12] */
	double worst = 0, at = 0;
	for (int i = 0; i < N; i++)
		a[i] = -5.0f + 17.0f * (float)i / N;
	v->map(DP_OP_GELU, o1, a, NULL, 0, N);
	for (int i = 0; i < N; i++) {
		long double want = gelu_ld(a[i]);
		if (fabsl(want) > 1e-30L && ulps(o1[i], (double)want) > worst)
			worst = ulps(o1[i], (double)want), at = a[i];
	}
	printf("  %s: gelu within %.1f ulp of the exact function on [-5, 12] (worst at x = %g)\n",
	       v->isa, worst, at);
	check(worst <= 64, "%s gelu: %.1f ulp", v->isa, worst);
}

/* layernorm_grad_gb (passes/fuse.c: gamma's and beta's gradients in one
 * walk) bitwise the layernorm_grad_g and bias_grad it replaces, on the same
 * dy, x and prior output, accumulating and not, at GPT-2's row length and
 * at a ragged one (the kernels' 256-column blocks) */
static void test_norm_gb(const CpuVec *vec)
{
	static const int64_t shape[][2] = {{300, 768}, {77, 300}};
	for (int s = 0; s < 2; s++)
		for (int acc = 0; acc < 2; acc++) {
			int64_t rows = shape[s][0], cols = shape[s][1];
			Ctx c;
			srand(77 + s);
			ctx_init(&c);
			int dy = tensor(&c, DP_F32, rows, cols, 0, 1), x = tensor(&c, DP_F32, rows, cols, 0, 3);
			int gb = tensor(&c, DP_F32, 2, cols, 0, 1), g = tensor(&c, DP_F32, cols, 0, 0, 0);
			int b = tensor(&c, DP_F32, cols, 0, 0, 0);
			memcpy(F(&c, g), F(&c, gb), (size_t)cols * 4); /* the prior gradients */
			memcpy(F(&c, b), F(&c, gb) + cols, (size_t)cols * 4);
			DpInstr in = instr(DP_OP_LAYERNORM_GRAD_GB, gb, dy, x, -1);
			DP_FATTR(&in, LAYERNORM_GRAD_GB, eps) = 1e-5f, DP_ATTR(&in, LAYERNORM_GRAD_GB, acc) = acc;
			DpInstr ig = instr(DP_OP_LAYERNORM_GRAD_G, g, dy, x, -1);
			DP_FATTR(&ig, LAYERNORM_GRAD_G, eps) = 1e-5f, DP_ATTR(&ig, LAYERNORM_GRAD_G, acc) = acc;
			DpInstr ib = instr(DP_OP_BIAS_GRAD, b, dy, -1, -1);
			DP_ATTR(&ib, BIAS_GRAD, acc) = acc;
			int ran = !run(&c, vec, NULL, in) && !run(&c, vec, NULL, ig) && !run(&c, vec, NULL, ib);
			check(ran && !memcmp(F(&c, gb), F(&c, g), (size_t)cols * 4) &&
				      !memcmp(F(&c, gb) + cols, F(&c, b), (size_t)cols * 4),
			      "layernorm_grad_gb [%lld, %lld]%s bitwise layernorm_grad_g and bias_grad",
			      (long long)rows, (long long)cols, acc ? " acc" : "");
			ctx_free(&c);
		}
}

int main(void)
{
	int avx2 = 0, avx512 = 0;
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	avx512 = avx2 && __builtin_cpu_supports("avx512f");
#endif
	const CpuVec *best = avx512 ? &cpu_vec_avx512 : avx2 ? &cpu_vec_avx2 : &cpu_vec_scalar;
	cpu_blas_init(&blas); /* the GEMM kernels and cuts dpexec uses on this CPU */
	printf("inner loops: %s; %s\n", best->isa, openblas_get_config());
	test_attention(best);
	test_attention(&cpu_vec_scalar);
	test_attention_cp(best);
	test_scalar_ops(best);
	test_loss_scale(best);
	test_dropout(best);
	test_threads(best);
	test_norm_gb(best);
	test_isa(&cpu_vec_avx2, avx2);
	test_isa(&cpu_vec_avx512, avx512);
	test_isa(&cpu_vec_scalar, 1);
	printf("cpu_kernels: %d passed, %d failed\n", npass, nfail);
	return nfail != 0;
}
