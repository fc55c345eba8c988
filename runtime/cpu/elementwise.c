/*
 * cpu/elementwise.c - CPU kernels that compute each output element from the
 * same element of their inputs: the one kernel of every op vec.c's map
 * computes (accum, scale, add, add_scalar, mul, the activations and their gradients:
 * the formulas are vec.c's, float, in the order the CUDA kernels repeat),
 * over pieces of the arrays on the rank's threads, the row broadcast
 * bias_add, and dropout (its mask from runtime/dropout.h).
 */

#include "cpu.h"
#include "dropout.h"

/* The operands of an elementwise kernel: out, in0, in1 (NULL if absent). */
typedef struct {
	float *o;
	const float *a, *b;
	int64_t n; /* elements of out */
} Ew;

static Ew ew(const CpuArgs *k)
{
	return (Ew){cpu_f(k, k->in->out), cpu_f(k, k->in->in[0]), cpu_f(k, k->in->in[1]),
		    cpu_numel(cpu_t(k, k->in->out))};
}

/* ---- the maps: vec->map over pieces of the arrays, in parallel ---- */

typedef struct {
	const CpuVec *vec;
	unsigned op;
	float *o;
	const float *a, *b;
	float s;
} MapJob;

static void map_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const MapJob *j = ctx;
	j->vec->map(j->op, j->o + lo, j->a + lo, j->b ? j->b + lo : NULL, j->s, hi - lo);
}

void cpu_map(const CpuArgs *k, unsigned op, float *o, const float *a, const float *b, float s,
	     int64_t n)
{
	MapJob j = {k->vec, op, o, a, b, s};
	cpu_parallel(k->pool, n, CPU_GRAIN, map_piece, &j);
}

/* ---- the maps on bf16 operands: a chunk at a time through f32 ---- */

#define CHUNK 512 /* floats per operand per chunk: on the stack, in L1 */

typedef struct {
	const CpuVec *vec;
	unsigned op; /* the opcode: vec.c's map */
	void *o;
	const void *a, *b;
	int o16, a16, b16; /* which are bf16 (each may be: accum's f32 sum of bf16) */
	float s;
} Map16;

static const float *widen(float *buf, const void *x, int is16, int64_t at, int64_t n)
{
	if (!is16)
		return (const float *)x + at;
	for (int64_t i = 0; i < n; i++)
		buf[i] = cpu_from_bf16(((const uint16_t *)x)[at + i]);
	return buf;
}

static void map16_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Map16 *j = ctx;
	float ob[CHUNK], ab[CHUNK], bb[CHUNK];
	(void)thread;
	for (int64_t at = lo; at < hi; at += CHUNK) {
		int64_t n = hi - at < CHUNK ? hi - at : CHUNK;
		float *o = j->o16 ? ob : (float *)j->o + at;
		if (j->o16 && j->op == DP_OP_ACCUM) /* the one map that reads out */
			widen(ob, j->o, 1, at, n);
		const float *a = widen(ab, j->a, j->a16, at, n);
		const float *b = j->b ? widen(bb, j->b, j->b16, at, n) : NULL;
		j->vec->map(j->op, o, a, b, j->s, n);
		if (j->o16)
			for (int64_t i = 0; i < n; i++)
				((uint16_t *)j->o)[at + i] = cpu_to_bf16(ob[i]);
	}
}

/* The op's map over its operands: out = f(in0[, in1]) (ACCUM: out += in0). */
static int run_map(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	/* the map's s: the scalar operand of scale and add_scalar */
	float s = in->op == DP_OP_SCALE || in->op == DP_OP_ADD_SCALAR ? DP_SCALAR(in) : 0.0f;
	int o16 = cpu_t(k, in->out)->dtype == DP_BF16, a16 = cpu_t(k, in->in[0])->dtype == DP_BF16;
	int b16 = in->in[1] >= 0 && cpu_t(k, in->in[1])->dtype == DP_BF16;
	if (o16 || a16 || b16) {
		Map16 j = {k->vec, in->op, k->ptr[in->out], k->ptr[in->in[0]],
			   in->in[1] >= 0 ? k->ptr[in->in[1]] : NULL, o16, a16, b16, s};
		cpu_parallel(k->pool, cpu_numel(cpu_t(k, in->out)), CPU_GRAIN, map16_piece, &j);
		return 0;
	}
	Ew v = ew(k);
	cpu_map(k, in->op, v.o, v.a, v.b, s, v.n);
	return 0;
}

void cpu_map_rows(KernelRow *rows)
{
	size_t n = 0;
	for (unsigned op = 0; op < DP_NOPS; op++) /* every CpuVec computes the same set */
		if (cpu_vec_scalar.is_map(op))
			rows[n++] = (KernelRow){.op = op, .run = run_map, .bf16 = 1}; /* bf16: a chunk at a time */
	rows[n] = (KernelRow){0};
}

/* ---- bias_add: out[r, c] = in0[r, c] + in1[c] ---- */

typedef struct {
	const CpuVec *vec;
	Ew v;
	int64_t c; /* bias elements: the row length */
} BiasJob;

static void bias_rows(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const BiasJob *j = ctx;
	for (int64_t r = lo; r < hi; r++)
		j->vec->map(DP_OP_ADD, j->v.o + r * j->c, j->v.a + r * j->c, j->v.b, 0, j->c);
}

static int run_bias_add(const CpuArgs *k, RtErr *e)
{
	BiasJob j = {k->vec, ew(k), cpu_numel(cpu_t(k, k->in->in[1]))};
	if (j.c > 0)
		cpu_parallel(k->pool, j.v.n / j.c, cpu_grain_rows(j.c), bias_rows, &j);
	return 0;
}

/* ---- dropout: out = x * keep * scale (format/ops.def, runtime/dropout.h) ---- */

typedef struct {
	void *o;
	const void *x;
	int o16, x16;
	const int32_t *keys, *pos; /* [B, 2]; [T] or NULL */
	int64_t per, inner;        /* elements per sample; per row of dim 1 (pos) */
	uint64_t seed;
	uint32_t site, threshold;
	float scale;
} DropJob;

static void drop_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const DropJob *j = ctx;
	(void)thread;
	for (int64_t i = lo; i < hi; i++) {
		int64_t b = i / j->per, w = i % j->per;
		int64_t el = j->pos ? (int64_t)j->pos[w / j->inner] * j->inner + w % j->inner : w;
		float x = j->x16 ? cpu_from_bf16(((const uint16_t *)j->x)[i]) : ((const float *)j->x)[i];
		int32_t sample = j->keys[2 * b], step = j->keys[2 * b + 1];
		float y = sample < 0 ? x
		        : dp_dropout_keep(j->seed, j->site, (uint32_t)sample, (uint32_t)step,
					  (uint64_t)el, j->threshold) ? x * j->scale : 0.0f;
		if (j->o16)
			((uint16_t *)j->o)[i] = cpu_to_bf16(y);
		else
			((float *)j->o)[i] = y;
	}
}

static int run_dropout(const CpuArgs *k, RtErr *e)
{
	const DpInstr *in = k->in;
	const DpTensor *x = cpu_t(k, in->in[0]);
	int64_t n = cpu_numel(x);
	if (n == 0)
		return 0;
	float p = DP_FATTR(in, DROPOUT, p);
	DropJob j = {k->ptr[in->out], k->ptr[in->in[0]], cpu_t(k, in->out)->dtype == DP_BF16,
		     x->dtype == DP_BF16, k->ptr[in->in[1]],
		     in->in[2] >= 0 ? k->ptr[in->in[2]] : NULL, n / x->dims[0], 1, k->s->cfg.seed,
		     (uint32_t)DP_ATTR(in, DROPOUT, site), dp_dropout_threshold(p),
		     dp_dropout_scale(p)};
	if (j.pos)
		j.inner = j.per / x->dims[1];
	cpu_parallel(k->pool, n, CPU_GRAIN, drop_piece, &j);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
const KernelRow cpu_elementwise_rows[] = {
	{DP_OP_BIAS_ADD, run_bias_add, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_DROPOUT, run_dropout, NULL, 1, NULL, NULL, 0, 0}, /* bf16: its own */
	{0},
};
