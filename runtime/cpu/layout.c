/*
 * cpu/layout.c - CPU kernels that set or move memory without arithmetic:
 * nop, fill, copy, reshape, tp_copy, transpose, split and its gradient,
 * interleave, and the embedding gather with its scatter-add gradient.
 * Copies are byte copies (bf16 operands are fine where the row says so);
 * a copy onto itself (a view the memory planner made) is free. Fill and
 * the embeddings use the rank's threads.
 */
#include <string.h>

#include "cpu.h"

/* ---- nop, fill, copy ---- */

static int run_nop(const CpuArgs *a, RtErr *e)
{
	return 0;
}

typedef struct {
	void *o;
	float v;
	int i32;
} Fill;

static void fill_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Fill *f = ctx;
	if (f->i32) {
		for (int64_t i = lo; i < hi; i++)
			((int32_t *)f->o)[i] = (int32_t)f->v;
	} else if (f->v == 0) {
		memset((float *)f->o + lo, 0, (size_t)(hi - lo) * sizeof(float));
	} else {
		for (int64_t i = lo; i < hi; i++)
			((float *)f->o)[i] = f->v;
	}
}

static int run_fill(const CpuArgs *a, RtErr *e)
{
	const DpInstr *in = a->in;
	Fill f = {a->ptr[in->out], DP_FATTR(in, FILL, value), cpu_t(a, in->out)->dtype == DP_I32};
	cpu_parallel(a->pool, cpu_numel(cpu_t(a, in->out)), 4 * CPU_GRAIN, fill_piece, &f);
	return 0;
}

/* Nothing to do when the memory planner gave out and in0 one address (a
 * reshape or tp_copy whose input dies there can be a view). */
static int run_copy(const CpuArgs *a, RtErr *e)
{
	const DpTensor *to = cpu_t(a, a->in->out);
	if (a->ptr[a->in->out] != a->ptr[a->in->in[0]])
		memmove(a->ptr[a->in->out], a->ptr[a->in->in[0]],
			(size_t)cpu_numel(to) * (to->dtype == DP_BF16 ? 2 : 4));
	return 0;
}

/* pad_rows: in0's rows, then zero rows up to out's (passes/padvocab.c) */
static int run_pad_rows(const CpuArgs *a, RtErr *e)
{
	const DpTensor *to = cpu_t(a, a->in->out), *ti = cpu_t(a, a->in->in[0]);
	size_t el = to->dtype == DP_F32 ? 4 : 2, real = (size_t)cpu_numel(ti) * el;
	memcpy(a->ptr[a->in->out], a->ptr[a->in->in[0]], real);
	memset((char *)a->ptr[a->in->out] + real, 0, (size_t)cpu_numel(to) * el - real);
	return 0;
}

/* ---- transpose ---- */

/* [.., r, c] -> [.., c, r] for 4-byte elements, in tiles for the cache. */
static void transpose(const uint32_t *x, int64_t batch, int64_t r, int64_t c, uint32_t *o)
{
	enum { TILE = 32 };
	for (int64_t b = 0; b < batch; b++, x += r * c, o += r * c)
		for (int64_t i0 = 0; i0 < r; i0 += TILE)
			for (int64_t j0 = 0; j0 < c; j0 += TILE) {
				int64_t i1 = i0 + TILE < r ? i0 + TILE : r, j1 = j0 + TILE < c ? j0 + TILE : c;
				for (int64_t i = i0; i < i1; i++)
					for (int64_t j = j0; j < j1; j++)
						o[j * r + i] = x[i * c + j];
			}
}

static int run_transpose(const CpuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cpu_t(a, a->in->in[0]);
	int64_t n = cpu_numel(cpu_t(a, a->in->out));
	int64_t r = t0->dims[t0->ndim - 2], c = t0->dims[t0->ndim - 1], rc = r * c;
	transpose(a->ptr[a->in->in[0]], rc ? n / rc : 0, r, c, a->ptr[a->in->out]);
	return 0;
}

/* ---- split and its gradient ---- */

static int run_split(const CpuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cpu_t(a, a->in->in[0]);
	int64_t cols = cpu_cols(t0), rows = cpu_numel(t0) / (cols ? cols : 1);
	int64_t cs = cols / DP_ATTR(a->in, SPLIT, parts);
	float *o = cpu_f(a, a->in->out);
	const float *x = cpu_f(a, a->in->in[0]);
	for (int64_t r = 0; r < rows; r++)
		memcpy(o + r * cs, x + r * cols + DP_ATTR(a->in, SPLIT, index) * cs, (size_t)cs * sizeof(float));
	return 0;
}

static int run_split_grad(const CpuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cpu_t(a, a->in->in[0]);
	int64_t cols = cpu_cols(t0), rows = cpu_numel(t0) / (cols ? cols : 1);
	int64_t cw = cols * DP_ATTR(a->in, SPLIT_GRAD, parts);
	float *o = cpu_f(a, a->in->out);
	const float *dy = cpu_f(a, a->in->in[0]);
	memset(o, 0, (size_t)cpu_numel(cpu_t(a, a->in->out)) * sizeof(float));
	for (int64_t r = 0; r < rows; r++)
		memcpy(o + r * cw + DP_ATTR(a->in, SPLIT_GRAD, index) * cols, dy + r * cols,
		       (size_t)cols * sizeof(float));
	return 0;
}

/* ---- interleave ---- */

/* in0 [parts][outer][s][inner] -> out [outer][parts*s][inner] (4-byte elements). */
static int run_interleave(const CpuArgs *a, RtErr *e)
{
	const DpTensor *to = cpu_t(a, a->in->out);
	int64_t parts = DP_ATTR(a->in, INTERLEAVE, parts), dim = DP_ATTR(a->in, INTERLEAVE, dim);
	int64_t outer = 1, inner = 1;
	for (int64_t i = 0; i < dim; i++)
		outer *= to->dims[i];
	for (int64_t i = dim + 1; i < to->ndim; i++)
		inner *= to->dims[i];
	int64_t sp = to->dims[dim] / parts, blk = sp * inner;
	const uint32_t *x = a->ptr[a->in->in[0]];
	uint32_t *o = a->ptr[a->in->out];
	for (int64_t p = 0; p < parts; p++)
		for (int64_t u = 0; u < outer; u++)
			memcpy(o + (u * parts + p) * blk, x + (p * outer + u) * blk,
			       (size_t)blk * sizeof(uint32_t));
	return 0;
}

/* ---- embedding ---- */

/* The gather (grad = 0) or the scatter-add into the table [V, d] (grad =
 * 1). An id outside [0, V) is a run-time error (the ids come from data),
 * checked before any thread starts. The gather goes to the threads by
 * rows; the scatter-add by columns, so that two rows with one id never
 * race and every table entry adds its rows in order. */
typedef struct {
	const int32_t *ids;
	const float *src;
	float *o;
	int64_t rows, d;
} Emb;

static void gather_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Emb *j = ctx;
	for (int64_t r = lo; r < hi; r++)
		memcpy(j->o + r * j->d, j->src + (int64_t)j->ids[r] * j->d, (size_t)j->d * sizeof(float));
}

static void scatter_cols(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Emb *j = ctx;
	for (int64_t r = 0; r < j->rows; r++) {
		float *row = j->o + (int64_t)j->ids[r] * j->d;
		const float *g = j->src + r * j->d;
		for (int64_t c = lo; c < hi; c++)
			row[c] += g[c];
	}
}

static int embedding(const CpuArgs *a, int grad, RtErr *e)
{
	const DpStep *s = a->s;
	const DpInstr *in = a->in;
	int ids_k = grad ? 1 : 0;
	const DpTensor *tt = &s->tensors[grad ? in->out : in->in[1]];
	const DpTensor *ti = &s->tensors[in->in[ids_k]];
	Emb j = {a->ptr[in->in[ids_k]], a->ptr[in->in[grad ? 0 : 1]], a->ptr[in->out], cpu_numel(ti),
		 tt->dims[1]};
	int64_t v = tt->dims[0];
	for (int64_t r = 0; r < j.rows; r++)
		if (j.ids[r] < 0 || j.ids[r] >= v)
			return RT_FAIL(e, "token id %d at position %lld of %s is outside the vocabulary "
				       "[0, %lld) of %s", j.ids[r], (long long)r, cpu_tname(s, in->in[ids_k]),
				       (long long)v, cpu_tname(s, grad ? in->out : in->in[1]));
	if (!grad && tt->dtype == DP_BF16) { /* bf16 table and output: rows of 2-byte words */
		const uint16_t *tab = a->ptr[in->in[1]];
		uint16_t *o = a->ptr[in->out];
		for (int64_t r = 0; r < j.rows; r++)
			memcpy(o + r * j.d, tab + (int64_t)j.ids[r] * j.d, (size_t)j.d * sizeof *o);
		return 0;
	}
	if (!grad) {
		cpu_parallel(a->pool, j.rows, cpu_grain_rows(j.d), gather_rows, &j);
		return 0;
	}
	if (!DP_ATTR(in, EMBEDDING_GRAD, acc))
		memset(j.o, 0, (size_t)(v * j.d) * sizeof(float));
	cpu_parallel(a->pool, j.d, j.rows * j.d < 2 * CPU_GRAIN ? j.d : 16, scatter_cols, &j);
	return 0;
}

static int run_embedding(const CpuArgs *a, RtErr *e) { return embedding(a, 0, e); }
static int run_embedding_grad(const CpuArgs *a, RtErr *e) { return embedding(a, 1, e); }

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
const KernelRow cpu_layout_rows[] = {
	{DP_OP_NOP, run_nop, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_FILL, run_fill, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_COPY, run_copy, NULL, 1, NULL, NULL, 0, 0},
	/* offload: the host arena is memory like the device arena here */
	{DP_OP_D2H, run_copy, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_H2D, run_copy, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_RESHAPE, run_copy, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_TP_COPY, run_copy, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_TRANSPOSE, run_transpose, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_PAD_ROWS, run_pad_rows, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_SPLIT, run_split, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_SPLIT_GRAD, run_split_grad, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_INTERLEAVE, run_interleave, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_EMBEDDING, run_embedding, NULL, 1, NULL, NULL, 0, 0},
	{DP_OP_EMBEDDING_GRAD, run_embedding_grad, NULL, 0, NULL, NULL, 0, 0},
	{0},
};
