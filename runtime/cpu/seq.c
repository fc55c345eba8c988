/*
 * cpu/seq.c - the CPU kernels that mix the positions of a sequence: softmax
 * over the last dim and its gradient, causal multi-head self-attention over
 * a packed qkv (a blocked, flash-style forward and backward: online softmax
 * over key tiles, cblas_sgemm for the tile products, no T x T matrix in
 * memory), and the rotary position encoding of q and k. Softmax sums and
 * the gradient's dot products accumulate in double. Rows, or (sample, head)
 * pairs, go to the rank's threads.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu.h"

/* ---- softmax ---- */

typedef struct {
	const CpuVec *vec;
	float *o;
	const float *a, *b;
	int64_t cols;
} Rows;

/* softmax of rows lo..hi: exp(x - max) / sum, the sum in double */
static void softmax_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Rows *j = ctx;
	int64_t c = j->cols;
	for (int64_t r = lo; r < hi; r++) {
		const float *x = j->a + r * c;
		float *o = j->o + r * c;
		double sum = j->vec->exp_shift(o, x, j->vec->max(x, c), c);
		j->vec->map(DP_OP_SCALE, o, o, NULL, (float)(1.0 / sum), c);
	}
}

static int run_softmax(const CpuArgs *k, RtErr *e)
{
	const DpTensor *t0 = cpu_t(k, k->in->in[0]);
	Rows j = {k->vec, cpu_f(k, k->in->out), cpu_f(k, k->in->in[0]), NULL, cpu_cols(t0)};
	if (j.cols > 0)
		cpu_parallel(k->pool, cpu_numel(t0) / j.cols, cpu_grain_rows(j.cols), softmax_rows, &j);
	return 0;
}

/* out = y * (dy - sum(dy * y)) per row; in {dy, y} */
static void softmax_grad_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Rows *j = ctx;
	int64_t c = j->cols;
	for (int64_t r = lo; r < hi; r++) {
		const float *dy = j->a + r * c, *y = j->b + r * c;
		j->vec->softmax_bwd(j->o + r * c, y, dy, j->vec->dot(dy, y, c), c);
	}
}

static int run_softmax_grad(const CpuArgs *k, RtErr *e)
{
	const DpTensor *t0 = cpu_t(k, k->in->in[0]);
	Rows j = {k->vec, cpu_f(k, k->in->out), cpu_f(k, k->in->in[0]), cpu_f(k, k->in->in[1]),
		  cpu_cols(t0)};
	if (j.cols > 0)
		cpu_parallel(k->pool, cpu_numel(t0) / j.cols, cpu_grain_rows(j.cols), softmax_grad_rows,
			     &j);
	return 0;
}

/* ---- attention ---- */

/* BLAS takes int sizes and strides. */
static int limit_attention(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	const DpTensor *qkv = &s->tensors[in->in[in->op == DP_OP_ATTENTION_GRAD ? 1 : 0]];
	CPU_NEED(qkv->dims[1] <= INT_MAX && qkv->dims[2] <= INT_MAX, "sequence too long for BLAS");
	return 0;
}

/*
 * Causal multi-head attention. qkv [B, T, 3C]: head h's q, k, v are the
 * columns [3hd*h, 3hd*h + hd), [+hd, +2hd), [+2hd, +3hd) of each row (row
 * stride 3C); out [B, T, C] has head h at columns [hd*h, hd*(h+1)).
 * Scores are scale * q k^T, scale = 1/sqrt(hd); key j is seen by query i
 * when j <= i.
 *
 * Flash-style, per (sample, head) on one thread: query blocks of ATT_BQ
 * rows against key tiles of bk rows, only the tiles that reach the
 * block's last row. All products are cblas_sgemm on strided views of qkv.
 *
 * Forward, per query block, with per-row running max m, sum l (double):
 *   S = scale Q K_t^T;  m' = max(m, rowmax S);  P = exp(S - m');
 *   l = l exp(m - m') + rowsum P;  O = O exp(m - m') + P V_t;  at the end O /= l.
 * O accumulates in the output itself.
 *
 * Backward (nothing is saved by the forward), per query block, two sweeps
 * over its key tiles. Sweep 1 recomputes m and l as above, and
 * D = rowsum(P * dP) with dP = dO V_t^T, rescaled the same way (D is
 * rowsum(dO * O), what FlashAttention-2 reads from the forward). Sweep 2,
 * with P = exp(S - m) / l final:
 *   dS = P * (dP - D);  dV_t += P^T dO;  dQ += scale dS K_t;  dK_t += scale dS^T Q.
 *
 * The tile width: when a query block's whole row panel (S, and dP in the
 * backward: ATT_BQ x T floats each) fits in ATT_PANEL bytes, bk = T and
 * each block has one tile: the online rescaling never happens, sweep 2
 * reuses sweep 1's S and dP (5 products per block in all, each as wide as
 * the causal range), and memory is O(ATT_BQ T). Longer sequences take
 * tiles of ATT_BK: memory O(ATT_BQ ATT_BK), and sweep 2 recomputes S and
 * dP (7 products per tile, FA2's trade). Never a T x T matrix.
 */
#define ATT_BQ 32
#define ATT_BK 64
#define ATT_PANEL (1 << 20)

typedef struct {
	const CpuVec *vec;
	const float *qkv, *dy;
	float *o;
	int64_t bsz, t, heads;
	int ld, c, hd, grad, bk;
	float scale;
	float *scratch; /* per thread: `per` floats */
	size_t per;
} Att;

/* Row i of a query block at q0 sees keys [k0, k0 + valid) of the tile at k0. */
static int tile_valid(int64_t q0, int i, int64_t k0, int nb)
{
	int64_t v = q0 + i + 1 - k0;
	return v < 0 ? 0 : v > nb ? nb : (int)v;
}

/* Masked entries of a row of S become -inf, so that exp makes them 0
 * through the same full-width loops (no ragged tails on the diagonal). */
static void mask_row(float *sr, int valid, int nb)
{
	for (int j = valid; j < nb; j++)
		sr[j] = -INFINITY;
}

/*
 * P = exp(S - m') of a tile row by row, with the online update of m and l
 * (and of the rescale factor of what was accumulated before: alpha[i]).
 * Masked entries of P are 0.
 */
static void online_tile(const Att *a, float *s, int mb, int nb, int64_t q0, int64_t k0,
			double *m, double *l, double *alpha)
{
	for (int i = 0; i < mb; i++) {
		float *sr = s + (int64_t)i * nb;
		int valid = tile_valid(q0, i, k0, nb);
		alpha[i] = 1;
		if (valid == 0) {
			memset(sr, 0, (size_t)nb * sizeof(float));
			continue;
		}
		mask_row(sr, valid, nb);
		double mt = a->vec->max(sr, nb), mn = m[i] > mt ? m[i] : mt;
		alpha[i] = m[i] == -INFINITY ? 0 : exp(m[i] - mn);
		l[i] = l[i] * alpha[i] + a->vec->exp_shift(sr, sr, (float)mn, nb);
		m[i] = mn;
	}
}

static void att_fwd_head(const Att *a, int64_t b, int64_t h, float *buf)
{
	int ld = a->ld, hd = a->hd;
	const float *q = a->qkv + b * a->t * ld + 3 * hd * h, *k = q + hd, *v = q + 2 * hd;
	float *s = buf;
	double *m = (double *)(s + (size_t)ATT_BQ * a->bk), *l = m + ATT_BQ, *alpha = l + ATT_BQ;
	for (int64_t q0 = 0; q0 < a->t; q0 += ATT_BQ) {
		int mb = (int)(a->t - q0 < ATT_BQ ? a->t - q0 : ATT_BQ);
		float *ob = a->o + (b * a->t + q0) * a->c + hd * h;
		for (int i = 0; i < mb; i++)
			m[i] = -INFINITY, l[i] = 0;
		for (int64_t k0 = 0; k0 < q0 + mb; k0 += a->bk) {
			int nb = (int)(q0 + mb - k0 < a->bk ? q0 + mb - k0 : a->bk);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, nb, hd, a->scale,
				    q + q0 * ld, ld, k + k0 * ld, ld, 0.0f, s, nb);
			online_tile(a, s, mb, nb, q0, k0, m, l, alpha);
			if (k0 > 0)
				for (int i = 0; i < mb; i++)
					if (alpha[i] != 1)
						a->vec->map(DP_OP_SCALE, ob + (int64_t)i * a->c,
							    ob + (int64_t)i * a->c, NULL, (float)alpha[i], hd);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, hd, nb, 1.0f, s, nb,
				    v + k0 * ld, ld, k0 > 0 ? 1.0f : 0.0f, ob, a->c);
		}
		for (int i = 0; i < mb; i++)
			a->vec->map(DP_OP_SCALE, ob + (int64_t)i * a->c, ob + (int64_t)i * a->c, NULL,
				    (float)(1.0 / l[i]), hd);
	}
}

static void att_bwd_head(const Att *a, int64_t b, int64_t h, float *buf)
{
	int ld = a->ld, hd = a->hd, c = a->c, bk = a->bk;
	int64_t t = a->t;
	const float *q = a->qkv + b * t * ld + 3 * hd * h, *k = q + hd, *v = q + 2 * hd;
	float *dq = a->o + b * t * ld + 3 * hd * h, *dk = dq + hd, *dv = dq + 2 * hd;
	float *s = buf, *dp = s + (size_t)ATT_BQ * bk;
	double *m = (double *)(dp + (size_t)ATT_BQ * bk), *l = m + ATT_BQ, *alpha = l + ATT_BQ,
	       *dd = alpha + ATT_BQ;
	for (int64_t r = 0; r < t; r++) /* dK, dV accumulate over the query blocks */
		memset(dk + r * ld, 0, 2 * (size_t)hd * sizeof(float));
	for (int64_t q0 = 0; q0 < t; q0 += ATT_BQ) {
		int mb = (int)(t - q0 < ATT_BQ ? t - q0 : ATT_BQ);
		const float *qb = q + q0 * ld, *dob = a->dy + (b * t + q0) * c + hd * h;
		int one = q0 + mb <= bk; /* one tile: sweep 2 reuses sweep 1's P and dP */
		for (int i = 0; i < mb; i++)
			m[i] = -INFINITY, l[i] = 0, dd[i] = 0;
		for (int sweep = 1; sweep <= 2; sweep++)
			for (int64_t k0 = 0; k0 < q0 + mb; k0 += bk) {
				int nb = (int)(q0 + mb - k0 < bk ? q0 + mb - k0 : bk);
				if (sweep == 1 || !one) {
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, nb, hd,
						    a->scale, qb, ld, k + k0 * ld, ld, 0.0f, s, nb);
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, nb, hd, 1.0f,
						    dob, c, v + k0 * ld, ld, 0.0f, dp, nb);
				}
				if (sweep == 1) { /* m, l; D = rowsum(P * dP), P = exp(S - m) */
					online_tile(a, s, mb, nb, q0, k0, m, l, alpha);
					for (int i = 0; i < mb; i++)
						dd[i] = dd[i] * alpha[i] + a->vec->dot(s + (int64_t)i * nb,
											dp + (int64_t)i * nb, nb);
					if (k0 + nb >= q0 + mb) /* the last tile */
						for (int i = 0; i < mb; i++)
							dd[i] /= l[i];
					continue;
				}
				for (int i = 0; i < mb; i++) { /* P in s, then dS in dp */
					float *sr = s + (int64_t)i * nb, *dr = dp + (int64_t)i * nb;
					int valid = tile_valid(q0, i, k0, nb);
					if (!one) { /* recomputed S: P = exp(S - m) */
						if (valid == 0) {
							memset(sr, 0, (size_t)nb * sizeof(float));
						} else {
							mask_row(sr, valid, nb);
							a->vec->exp_shift(sr, sr, (float)m[i], nb);
						}
					}
					a->vec->map(DP_OP_SCALE, sr, sr, NULL, (float)(1.0 / l[i]), nb);
					a->vec->softmax_bwd(dr, sr, dr, dd[i], nb);
				}
				cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nb, hd, mb, 1.0f, s, nb,
					    dob, c, 1.0f, dv + k0 * ld, ld);
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, hd, nb, a->scale,
					    dp, nb, k + k0 * ld, ld, k0 > 0 ? 1.0f : 0.0f, dq + q0 * ld, ld);
				cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nb, hd, mb, a->scale, dp,
					    nb, qb, ld, 1.0f, dk + k0 * ld, ld);
			}
	}
}

static void att_heads(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Att *a = ctx;
	float *buf = a->scratch + (size_t)thread * a->per;
	for (int64_t bh = lo; bh < hi; bh++) {
		if (a->grad)
			att_bwd_head(a, bh / a->heads, bh % a->heads, buf);
		else
			att_fwd_head(a, bh / a->heads, bh % a->heads, buf);
	}
}

static int attention(const CpuArgs *x, RtErr *e)
{
	const DpInstr *in = x->in;
	int grad = in->op == DP_OP_ATTENTION_GRAD;
	const DpTensor *tq = cpu_t(x, in->in[grad ? 1 : 0]);
	int64_t heads = DP_ATTR(in, ATTENTION, heads);
	int ld = (int)tq->dims[2], hd = ld / 3 / (int)heads;
	Att a = {.vec = x->vec, .qkv = cpu_f(x, in->in[grad ? 1 : 0]),
		 .dy = grad ? cpu_f(x, in->in[0]) : NULL, .o = cpu_f(x, in->out),
		 .bsz = tq->dims[0], .t = tq->dims[1], .heads = heads, .ld = ld, .c = ld / 3,
		 .hd = hd, .grad = grad, .scale = (float)(1.0 / sqrt((double)hd))};
	if (a.bsz == 0 || a.t == 0)
		return 0;
	/* per thread: S (and dP) tiles of ATT_BQ x bk, and 4 x ATT_BQ doubles */
	size_t tiles = (grad ? 2 : 1) * (size_t)ATT_BQ;
	a.bk = tiles * (size_t)a.t * sizeof(float) <= ATT_PANEL ? (int)a.t : ATT_BK;
	a.per = tiles * (size_t)a.bk + 8 * ATT_BQ;
	int threads = cpu_pool_size(x->pool);
	a.scratch = malloc(a.per * sizeof(float) * (size_t)threads);
	if (!a.scratch)
		return RT_FAIL(e, "out of memory (attention tiles of %lld positions)", (long long)a.t);
	cpu_parallel(x->pool, a.bsz * a.heads, 1, att_heads, &a);
	free(a.scratch);
	return 0;
}

/* ---- rope ---- */

/*
 * Rotary position encoding, rotate-half form: in each head's q and k (hd =
 * 2*half columns), element j < half pairs with j + half at position t:
 *   out[j]        = x[j] * cos[t, j] - x[j + half] * sin[t, j]
 *   out[j + half] = x[j + half] * cos[t, j] + x[j] * sin[t, j]
 * (HF Llama: x * cos + rotate_half(x) * sin). v is copied. inverse: sin
 * negated, the inverse rotation (its gradient).
 */
static int run_rope(const CpuArgs *a, RtErr *e)
{
	const DpInstr *in = a->in;
	const DpTensor *tq = cpu_t(a, in->in[0]), *tc = cpu_t(a, in->in[1]);
	int64_t bsz = tq->dims[0], t = tq->dims[1], ld = tq->dims[2], half = tc->dims[1];
	int64_t hd = 2 * half, heads = ld / (3 * hd);
	const float *x = cpu_f(a, in->in[0]), *cs = cpu_f(a, in->in[1]), *sn = cpu_f(a, in->in[2]);
	float *o = cpu_f(a, in->out);
	float sign = DP_ATTR(in, ROPE, inverse) ? -1.0f : 1.0f;
	for (int64_t b = 0; b < bsz; b++)
		for (int64_t p = 0; p < t; p++) {
			const float *xr = x + (b * t + p) * ld, *cr = cs + p * half, *sr = sn + p * half;
			float *orow = o + (b * t + p) * ld;
			for (int64_t h = 0; h < heads; h++)
				for (int part = 0; part < 3; part++) {
					int64_t base = 3 * hd * h + part * hd;
					const float *xi = xr + base;
					float *oi = orow + base;
					if (part == 2) {
						memcpy(oi, xi, (size_t)hd * sizeof(float));
						continue;
					}
					for (int64_t j = 0; j < half; j++) {
						float c = cr[j], sv = sign * sr[j], x1 = xi[j], x2 = xi[j + half];
						oi[j] = x1 * c - x2 * sv;
						oi[j + half] = x2 * c + x1 * sv;
					}
				}
		}
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
const KernelRow cpu_seq_rows[] = {
	{DP_OP_SOFTMAX, run_softmax, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_SOFTMAX_GRAD, run_softmax_grad, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION, attention, limit_attention, 0, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION_GRAD, attention, limit_attention, 0, NULL, NULL, 0, 0},
	{DP_OP_ROPE, run_rope, NULL, 0, NULL, NULL, 0, 0},
	{0},
};
