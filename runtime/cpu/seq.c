/*
 * cpu/seq.c - the CPU kernels that mix the positions of a sequence: softmax
 * over the last dim and its gradient, causal multi-head self-attention over
 * a packed qkv (forward and a backward that recomputes the probabilities;
 * both products are cblas_sgemm on strided views), and the rotary position
 * encoding of q and k. Softmax sums and the gradient's dot products
 * accumulate in double.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu.h"

/* ---- softmax ---- */

static int check_softmax(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(a, 0, DP_F32);
	CPU_NEED(cpu_numel(o) == cpu_numel(a) && cpu_cols(o) == cpu_cols(a),
		 "operands differ in shape");
	if (in->op == DPK_SOFTMAX_GRAD) {
		CPU_OPND(y, 1, DP_F32);
		CPU_NEED(cpu_numel(y) == cpu_numel(a) && cpu_cols(y) == cpu_cols(a),
			 "dy and y differ in shape");
	}
	CPU_NEED(cpu_out_disjoint(&c), "output overlaps an input");
	return 0;
}

/* softmax over rows of c, in place in o (o already holds the scores): masked
 * entries j >= valid become 0. The sum is in double. */
static void softmax_row(float *o, int64_t c, int64_t valid)
{
	float mx = o[0];
	for (int64_t j = 1; j < valid; j++)
		mx = o[j] > mx ? o[j] : mx;
	double sum = 0;
	for (int64_t j = 0; j < valid; j++) {
		o[j] = expf(o[j] - mx);
		sum += o[j];
	}
	float inv = (float)(1.0 / sum);
	for (int64_t j = 0; j < valid; j++)
		o[j] *= inv;
	for (int64_t j = valid; j < c; j++)
		o[j] = 0;
}

static int run_softmax(const CpuArgs *k, RtErr *e)
{
	const DpTensor *t0 = cpu_t(k, k->in->in[0]);
	int64_t cols = cpu_cols(t0), rows = cpu_numel(t0) / (cols ? cols : 1);
	float *o = cpu_f(k, k->in->out);
	const float *a = cpu_f(k, k->in->in[0]);
	for (int64_t r = 0; r < rows; r++) {
		memcpy(o + r * cols, a + r * cols, (size_t)cols * sizeof(float));
		softmax_row(o + r * cols, cols, cols);
	}
	return 0;
}

/* out = y * (dy - sum(dy * y)); in {dy, y} */
static int run_softmax_grad(const CpuArgs *k, RtErr *e)
{
	const DpTensor *t0 = cpu_t(k, k->in->in[0]);
	int64_t cols = cpu_cols(t0), rows = cpu_numel(t0) / (cols ? cols : 1);
	float *o = cpu_f(k, k->in->out);
	const float *a = cpu_f(k, k->in->in[0]), *b = cpu_f(k, k->in->in[1]);
	for (int64_t r = 0; r < rows; r++) {
		const float *dr = a + r * cols, *yr = b + r * cols;
		double dot = 0;
		for (int64_t j = 0; j < cols; j++)
			dot += (double)dr[j] * yr[j];
		for (int64_t j = 0; j < cols; j++)
			o[r * cols + j] = (float)(yr[j] * (dr[j] - dot));
	}
	return 0;
}

/* ---- attention ---- */

/* qkv [B, T, 3C] with heads ia0: C and the head dim must split evenly. */
static int qkv_ok(CpuChk *c, const DpTensor *qkv)
{
	int64_t h = c->in->ia[0];
	if (qkv->ndim != 3)
		return cpu_bad(c, "qkv must be [batch, T, 3*C]");
	if (h < 1 || qkv->dims[2] < 3 * h || qkv->dims[2] % (3 * h) != 0)
		return cpu_bad(c, "qkv's last dim does not split into 3 * heads");
	return 0;
}

static int check_attention(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(qkv, 0, DP_F32);
	RT_CHECK(qkv_ok(&c, qkv));
	int64_t ch = qkv->dims[2] / 3;
	CPU_NEED(cpu_numel(o) == qkv->dims[0] * qkv->dims[1] * ch && cpu_cols(o) == ch,
		 "output is not [batch, T, C]");
	CPU_NEED(cpu_out_disjoint(&c), "output overlaps an input");
	return 0;
}

static int check_attention_grad(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(dy, 0, DP_F32);
	CPU_OPND(qkv, 1, DP_F32);
	RT_CHECK(qkv_ok(&c, qkv));
	int64_t ch = qkv->dims[2] / 3;
	CPU_NEED(cpu_numel(dy) == qkv->dims[0] * qkv->dims[1] * ch && cpu_cols(dy) == ch,
		 "dy is not [batch, T, C]");
	CPU_NEED(cpu_numel(o) == cpu_numel(qkv) && cpu_cols(o) == 3 * ch,
		 "output is not shaped like qkv");
	CPU_NEED(cpu_out_disjoint(&c), "output overlaps an input");
	return 0;
}

/* BLAS takes int sizes and strides. */
static int limit_attention(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	const DpTensor *qkv = &s->tensors[in->in[in->op == DPK_ATTENTION_GRAD ? 1 : 0]];
	CPU_NEED(qkv->dims[1] <= INT_MAX && qkv->dims[2] <= INT_MAX, "sequence too long for BLAS");
	return 0;
}

/*
 * Causal multi-head attention. qkv [B, T, 3C]: head h's q, k, v are the
 * columns [3hd*h, 3hd*h + hd), [+hd, +2hd), [+2hd, +3hd) of each row (row
 * stride 3C); out [B, T, C] has head h at columns [hd*h, hd*(h+1)).
 * Per (b, h), query rows go in blocks of ATT_BLOCK: S = scale * Q_blk K^T
 * against the keys up to the block's last row (causal: the rest are masked
 * anyway, so about half of the T x T work is skipped), softmax with the mask,
 * O_blk = P V. Both products are cblas_sgemm on strided views.
 *
 * The backward recomputes P per block (nothing is saved) and, with
 * dS = P * (dP - rowsum(P * dP)):  dV += P^T dO,  dP = dO V^T,
 * dQ = scale * dS K,  dK += scale * dS^T Q.
 */
#define ATT_BLOCK 64

static void att_scores(const float *q, const float *k, int ld, int mb, int n, int hd,
		       float scale, int64_t r0, float *p)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, n, hd, scale, q, ld, k, ld, 0.0f,
		    p, n);
	for (int i = 0; i < mb; i++)
		softmax_row(p + (int64_t)i * n, n, r0 + i + 1);
}

static int attention(const CpuArgs *a, RtErr *e)
{
	const DpInstr *in = a->in;
	int grad = in->op == DPK_ATTENTION_GRAD;
	const DpTensor *tq = cpu_t(a, in->in[grad ? 1 : 0]);
	int64_t bsz = tq->dims[0], t = tq->dims[1], heads = in->ia[0];
	int ld = (int)tq->dims[2], c = ld / 3, hd = c / (int)heads;
	float scale = (float)(1.0 / sqrt((double)hd));
	const float *qkv = cpu_f(a, in->in[grad ? 1 : 0]);
	const float *dy = grad ? cpu_f(a, in->in[0]) : NULL;
	float *o = cpu_f(a, in->out);
	int64_t bl = t < ATT_BLOCK ? t : ATT_BLOCK;
	if (bsz == 0 || t == 0)
		return 0;
	float *p = malloc((size_t)(bl * t) * sizeof(float) * (grad ? 2 : 1));
	if (!p)
		return RT_FAIL(e, "out of memory (attention scores of %lld positions)", (long long)t);
	float *dp = grad ? p + bl * t : NULL;
	if (grad)
		memset(o, 0, (size_t)(bsz * t * ld) * sizeof(float));
	for (int64_t b = 0; b < bsz; b++)
		for (int64_t h = 0; h < heads; h++) {
			const float *q = qkv + b * t * ld + 3 * hd * h, *k = q + hd, *v = q + 2 * hd;
			for (int64_t r0 = 0; r0 < t; r0 += bl) {
				int mb = (int)(t - r0 < bl ? t - r0 : bl), n = (int)(r0 + mb);
				const float *qb = q + r0 * ld;
				att_scores(qb, k, ld, mb, n, hd, scale, r0, p);
				if (!grad) {
					float *ob = o + b * t * c + hd * h + r0 * c;
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, hd, n,
						    1.0f, p, n, v, ld, 0.0f, ob, c);
					continue;
				}
				const float *dob = dy + b * t * c + hd * h + r0 * c;
				float *dq = o + b * t * ld + 3 * hd * h, *dk = dq + hd, *dv = dq + 2 * hd;
				/* dV[0:n] += P^T dO_blk */
				cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, mb, 1.0f, p, n,
					    dob, c, 1.0f, dv, ld);
				/* dP = dO_blk V[0:n]^T */
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, n, hd, 1.0f, dob,
					    c, v, ld, 0.0f, dp, n);
				/* dS = P * (dP - rowsum(P * dP)); masked P are 0, so dS is too */
				for (int i = 0; i < mb; i++) {
					float *pr = p + (int64_t)i * n, *dr = dp + (int64_t)i * n;
					int64_t valid = r0 + i + 1;
					double dot = 0;
					for (int64_t j = 0; j < valid; j++)
						dot += (double)pr[j] * dr[j];
					for (int64_t j = 0; j < n; j++)
						dr[j] = pr[j] * (dr[j] - (float)dot);
				}
				/* dQ_blk = scale * dS K[0:n]; dK[0:n] += scale * dS^T Q_blk */
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, hd, n, scale, dp,
					    n, k, ld, 0.0f, dq + r0 * ld, ld);
				cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, mb, scale, dp,
					    n, qb, ld, 1.0f, dk, ld);
			}
		}
	free(p);
	return 0;
}

/* ---- rope ---- */

/* in {qkv [B, T, 3C], cos [Tc, hd/2], sin [Tc, hd/2]}, T <= Tc */
static int check_rope(const DpStep *s, const DpInstr *in, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	CPU_OPND(qkv, 0, DP_F32);
	CPU_OPND(cs, 1, DP_F32);
	CPU_OPND(sn, 2, DP_F32);
	CPU_NEED(qkv->ndim == 3, "qkv must be [batch, T, 3*C]");
	CPU_NEED(cs->ndim == 2 && sn->ndim == 2 && cs->dims[0] == sn->dims[0] &&
		 cs->dims[1] == sn->dims[1] && cs->dims[1] >= 1, "cos and sin must be [T, head_dim/2]");
	CPU_NEED(qkv->dims[2] % (6 * cs->dims[1]) == 0,
		 "qkv's last dim is not a multiple of 3 * head_dim");
	CPU_NEED(qkv->dims[1] <= cs->dims[0], "the rope tables are shorter than T");
	CPU_NEED(cpu_numel(o) == cpu_numel(qkv) && cpu_cols(o) == cpu_cols(qkv),
		 "output is not shaped like qkv");
	CPU_NEED(cpu_out_disjoint(&c), "output overlaps an input");
	return 0;
}

/*
 * Rotary position encoding, rotate-half form: in each head's q and k (hd =
 * 2*half columns), element j < half pairs with j + half at position t:
 *   out[j]        = x[j] * cos[t, j] - x[j + half] * sin[t, j]
 *   out[j + half] = x[j + half] * cos[t, j] + x[j] * sin[t, j]
 * (HF Llama: x * cos + rotate_half(x) * sin). v is copied. ia0 = 1: sin
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
	float sign = in->ia[0] ? -1.0f : 1.0f;
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

/* ORDER KERNEL (designated): operands, limits, run, bf16 */
const CpuKernel cpu_seq_kernels[DPK_COUNT] = {
	[DPK_SOFTMAX] = {check_softmax, NULL, run_softmax, 0},
	[DPK_SOFTMAX_GRAD] = {check_softmax, NULL, run_softmax_grad, 0},
	[DPK_ATTENTION] = {check_attention, limit_attention, attention, 0},
	[DPK_ATTENTION_GRAD] = {check_attention_grad, limit_attention, attention, 0},
	[DPK_ROPE] = {check_rope, NULL, run_rope, 0},
};
