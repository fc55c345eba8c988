/*
 * cpu/attention_cp.c - the context-parallel attention kernels (passes/cp.c):
 * kv_pack / kv_unpack, and causal attention of this cp rank's queries
 * against the keys and values all_gathered from every cp rank
 * (attention_cp, its q gradient attention_cp_grad and its key/value
 * gradient attention_cp_grad_kv; attention_cp_grad_both, the two as one
 * instruction (passes/fuse.c), runs them one after the other into its two
 * parts: bitwise the two ops' results).
 *
 * Layouts (format/ops.def). qkv [B, T, 3C], per head h [q|k|v] of hd = C/H;
 * kv [B, T, 2C], per head [k|v]; the gathered kv is [cp, B, T, 2C], block r
 * from cp rank r. A cp rank's T rows are two chunks of L = T/2 positions of
 * the whole sequence of cp*T: chunk r (rows 0..L-1) and chunk 2cp-1-r (rows
 * L..T-1) - the zigzag. The kernels put the gathered keys and values of
 * one (batch, head) back in sequence order, K[p] and V[p] for p in
 * [0, cp*T), so causal attention of a query at position p is over the
 * prefix K[0..p] - the ordinary kernel's structure: blocks of query rows
 * (within a chunk, so their positions are consecutive) against the prefix up
 * to the block's last position, S = scale * Q K^T and O = P V by
 * cblas_sgemm, softmax with the mask, sums in double. The backward recomputes
 * P per block; the q gradient and the key/value gradient are two kernels
 * (each recomputes P and dP = dO V^T), because an instruction writes one
 * tensor: dQ = scale * dS K and dK += scale * dS^T Q, dV += P^T dO, with
 * dS = P * (dP - rowsum(P * dP)); dK, dV are then scattered back into the
 * gathered layout, each rank's block for the reduce_scatter that returns it.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu.h"

#define CP_BLOCK 64 /* query rows per block */

/* The global position of local row j of cp rank r (T local rows). */
static int64_t zigzag_pos(int64_t r, int64_t j, int64_t cp, int64_t t)
{
	int64_t l = t / 2;
	return j < l ? r * l + j : (2 * cp - 1 - r) * l + (j - l);
}

/* ---- kv_pack / kv_unpack ---- */

static int run_kv_pack(const CpuArgs *a, RtErr *e)
{
	const DpInstr *in = a->in;
	int unpack = in->op == DP_OP_KV_UNPACK;
	const DpTensor *tq = cpu_t(a, unpack ? in->out : in->in[0]);
	int64_t heads = DP_ATTR(in, KV_PACK, heads);
	int64_t rows = tq->dims[0] * tq->dims[1], c = tq->dims[2] / 3, hd = c / heads;
	const float *src = cpu_f(a, in->in[0]);
	float *dst = cpu_f(a, in->out);
	for (int64_t r = 0; r < rows; r++)
		for (int64_t h = 0; h < heads; h++) {
			float *q3 = (unpack ? dst : (float *)src) + r * 3 * c + 3 * hd * h;
			float *k2 = (unpack ? (float *)src : dst) + r * 2 * c + 2 * hd * h;
			if (unpack) {
				memset(q3, 0, (size_t)hd * sizeof(float));
				memcpy(q3 + hd, k2, (size_t)(2 * hd) * sizeof(float));
			} else {
				memcpy(k2, q3 + hd, (size_t)(2 * hd) * sizeof(float));
			}
		}
	return 0;
}

/* ---- attention over the gathered keys ---- */

typedef struct {
	int64_t bsz, t, cp, heads, c, hd, tg; /* tg = cp * t, the whole sequence */
	float scale;
	const float *qkv, *kv, *dy;
	const int32_t *pos;
} CpAtt;

/* K and V of batch b, head h in sequence order: k[p*hd + i], v[p*hd + i]. */
static void gather_kv(const CpAtt *at, int64_t b, int64_t h, float *k, float *v)
{
	for (int64_t r = 0; r < at->cp; r++)
		for (int64_t j = 0; j < at->t; j++) {
			const float *row = at->kv + ((r * at->bsz + b) * at->t + j) * 2 * at->c +
					   2 * at->hd * h;
			int64_t p = zigzag_pos(r, j, at->cp, at->t);
			memcpy(k + p * at->hd, row, (size_t)at->hd * sizeof(float));
			memcpy(v + p * at->hd, row + at->hd, (size_t)at->hd * sizeof(float));
		}
}

/* The inverse of gather_kv for gradients: dk, dv in sequence order into the
 * gathered layout's block of every rank. */
static void scatter_dkv(const CpAtt *at, int64_t b, int64_t h, const float *dk,
			const float *dv, float *out)
{
	for (int64_t r = 0; r < at->cp; r++)
		for (int64_t j = 0; j < at->t; j++) {
			float *row = out + ((r * at->bsz + b) * at->t + j) * 2 * at->c + 2 * at->hd * h;
			int64_t p = zigzag_pos(r, j, at->cp, at->t);
			memcpy(row, dk + p * at->hd, (size_t)at->hd * sizeof(float));
			memcpy(row + at->hd, dv + p * at->hd, (size_t)at->hd * sizeof(float));
		}
}

/* Softmax of a row of n scores of which the first `valid` count; the rest
 * become 0. The sum is in double. */
static void softmax_prefix(float *o, int64_t n, int64_t valid)
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
	for (int64_t j = valid; j < n; j++)
		o[j] = 0;
}

enum { CP_FWD, CP_DQ, CP_DKV };

/* One block of mb query rows from row r0 (positions pos[r0] ... on, one
 * chunk): the forward, the q gradient or the k/v gradient of batch b, head h. */
static void cp_block(const CpAtt *at, int kind, int64_t b, int64_t h, int64_t r0, int mb,
		     const float *k, const float *v, float *p, float *dp, float *dk, float *dv,
		     float *out)
{
	int64_t ld = 3 * at->c, hd = at->hd;
	const float *qb = at->qkv + (b * at->t + r0) * ld + 3 * hd * h;
	int n = (int)(at->pos[r0] + mb); /* keys up to the block's last position */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, n, (int)hd, at->scale, qb,
		    (int)ld, k, (int)hd, 0.0f, p, n);
	for (int i = 0; i < mb; i++)
		softmax_prefix(p + (int64_t)i * n, n, at->pos[r0 + i] + 1);
	if (kind == CP_FWD) {
		float *ob = out + (b * at->t + r0) * at->c + hd * h;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, (int)hd, n, 1.0f, p, n, v,
			    (int)hd, 0.0f, ob, (int)at->c);
		return;
	}
	const float *dob = at->dy + (b * at->t + r0) * at->c + hd * h;
	/* dP = dO_blk V[0:n]^T; dS = P * (dP - rowsum(P * dP)) */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, n, (int)hd, 1.0f, dob, (int)at->c,
		    v, (int)hd, 0.0f, dp, n);
	for (int i = 0; i < mb; i++) {
		float *pr = p + (int64_t)i * n, *dr = dp + (int64_t)i * n;
		int64_t valid = at->pos[r0 + i] + 1;
		double dot = 0;
		for (int64_t j = 0; j < valid; j++)
			dot += (double)pr[j] * dr[j];
		for (int64_t j = 0; j < n; j++)
			dr[j] = pr[j] * (dr[j] - (float)dot);
	}
	if (kind == CP_DQ) {
		/* dQ_blk = scale * dS K[0:n] into the q columns */
		float *dq = out + (b * at->t + r0) * ld + 3 * hd * h;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, (int)hd, n, at->scale, dp, n,
			    k, (int)hd, 0.0f, dq, (int)ld);
		return;
	}
	/* dV[0:n] += P^T dO_blk; dK[0:n] += scale * dS^T Q_blk */
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, (int)hd, mb, 1.0f, p, n, dob,
		    (int)at->c, 1.0f, dv, (int)hd);
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, (int)hd, mb, at->scale, dp, n, qb,
		    (int)ld, 1.0f, dk, (int)hd);
}

/* The rows' positions: inside the sequence, and consecutive within each of
 * the two chunks (what the blocks rely on); the loader fills them. */
static int check_positions(const CpAtt *at, const char *op, RtErr *e)
{
	int64_t l = at->t / 2;
	for (int64_t j = 0; j < at->t; j++) {
		int64_t first = j < l ? 0 : l;
		if (at->pos[j] < 0 || at->pos[j] >= at->tg || at->pos[j] != at->pos[first] + j - first)
			return RT_FAIL(e, "%s: row %lld's position %d is not the zigzag layout of a "
				       "sequence of %lld (cp %lld)", op, (long long)j, at->pos[j],
				       (long long)at->tg, (long long)at->cp);
	}
	return 0;
}

/* One of the three kernels (kind) into out, n elements. */
static int cp_run(const CpuArgs *a, int kind, float *out, int64_t n, RtErr *e)
{
	const DpInstr *in = a->in;
	int q = kind == CP_FWD ? 0 : 1; /* where qkv is */
	const DpTensor *tq = cpu_t(a, in->in[q]);
	CpAtt at = {.bsz = tq->dims[0], .t = tq->dims[1], .cp = DP_ATTR(in, ATTENTION_CP, cp),
		    .heads = DP_ATTR(in, ATTENTION_CP, heads),
		    .c = tq->dims[2] / 3, .qkv = cpu_f(a, in->in[q]), .kv = cpu_f(a, in->in[q + 1]),
		    .pos = (const int32_t *)a->ptr[in->in[q + 2]],
		    .dy = kind == CP_FWD ? NULL : cpu_f(a, in->in[0])};
	at.hd = at.c / at.heads;
	at.tg = at.cp * at.t;
	at.scale = (float)(1.0 / sqrt((double)at.hd));
	RT_CHECK(check_positions(&at, dp_op_names[in->op], e));
	int64_t blk = at.t < CP_BLOCK ? at.t : CP_BLOCK;
	size_t kvn = (size_t)(at.tg * at.hd);
	size_t need = 2 * kvn + (size_t)(blk * at.tg) * (kind == CP_FWD ? 1 : 2) +
		      (kind == CP_DKV ? 2 * kvn : 0);
	float *buf = malloc(need * sizeof(float));
	if (!buf)
		return RT_FAIL(e, "out of memory (cp attention over %lld positions)", (long long)at.tg);
	float *k = buf, *v = k + kvn, *p = v + kvn, *dp = p + blk * at.tg;
	float *dk = dp + (kind == CP_FWD ? 0 : blk * at.tg), *dv = dk + kvn;
	if (kind != CP_FWD)
		memset(out, 0, (size_t)n * sizeof(float));
	for (int64_t b = 0; b < at.bsz; b++)
		for (int64_t h = 0; h < at.heads; h++) {
			gather_kv(&at, b, h, k, v);
			if (kind == CP_DKV)
				memset(dk, 0, 2 * kvn * sizeof(float));
			for (int64_t c0 = 0; c0 < at.t; c0 += at.t / 2) /* the two chunks */
				for (int64_t r0 = c0; r0 < c0 + at.t / 2; r0 += CP_BLOCK) {
					int64_t left = c0 + at.t / 2 - r0;
					cp_block(&at, kind, b, h, r0, (int)(left < CP_BLOCK ? left : CP_BLOCK),
						 k, v, p, dp, dk, dv, out);
				}
			if (kind == CP_DKV)
				scatter_dkv(&at, b, h, dk, dv, out);
		}
	free(buf);
	return 0;
}

static int run_attention_cp(const CpuArgs *a, RtErr *e)
{
	const DpInstr *in = a->in;
	float *out = cpu_f(a, in->out);
	int64_t n = cpu_numel(cpu_t(a, in->out));
	if (in->op == DP_OP_ATTENTION_CP_GRAD_BOTH) { /* d kv, then d qkv */
		int64_t nkv = cpu_numel(cpu_t(a, in->in[2]));
		RT_CHECK(cp_run(a, CP_DKV, out, nkv, e));
		return cp_run(a, CP_DQ, out + nkv, n - nkv, e);
	}
	return cp_run(a, in->op == DP_OP_ATTENTION_CP ? CP_FWD
			 : in->op == DP_OP_ATTENTION_CP_GRAD ? CP_DQ : CP_DKV, out, n, e);
}

/* BLAS takes int sizes: the whole sequence and the row strides. */
static int limit_attention_cp(const DpStep *s, const DpInstr *in, RtErr *e)
{
	const DpTensor *tq = &s->tensors[in->in[in->op == DP_OP_ATTENTION_CP ? 0 : 1]];
	if (tq->dims[1] * DP_ATTR(in, ATTENTION_CP, cp) > INT_MAX || tq->dims[2] > INT_MAX)
		return RT_FAIL(e, "%s: the sequence is too long for BLAS", dp_op_names[in->op]);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
const KernelRow cpu_cp_rows[] = {
	{DP_OP_KV_PACK, run_kv_pack, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_KV_UNPACK, run_kv_pack, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION_CP, run_attention_cp, limit_attention_cp, 0, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION_CP_GRAD, run_attention_cp, limit_attention_cp, 0, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION_CP_GRAD_KV, run_attention_cp, limit_attention_cp, 0, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION_CP_GRAD_BOTH, run_attention_cp, limit_attention_cp, 0, NULL, NULL, 0, 0},
	{0},
};
