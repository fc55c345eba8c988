/*
 * cpu/elementwise.c - CPU kernels that compute each output element from the
 * same element of their inputs: the one kernel of every op vec.c's map
 * computes (accum, scale, add, mul, the activations and their gradients:
 * the formulas are vec.c's, float, in the order the CUDA kernels repeat),
 * over pieces of the arrays on the rank's threads, and the row broadcast
 * bias_add.
 */

#include "cpu.h"

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

/* The op's map over its operands: out = f(in0[, in1]) (ACCUM: out += in0). */
static int run_map(const CpuArgs *k, RtErr *e)
{
	Ew v = ew(k);
	cpu_map(k, k->in->op, v.o, v.a, v.b, k->in->fa[0], v.n);
	return 0;
}

const CpuKernel cpu_map_kernel = {NULL, run_map, 0};

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
		j->vec->map(DPK_ADD, j->v.o + r * j->c, j->v.a + r * j->c, j->v.b, 0, j->c);
}

static int run_bias_add(const CpuArgs *k, RtErr *e)
{
	BiasJob j = {k->vec, ew(k), cpu_numel(cpu_t(k, k->in->in[1]))};
	if (j.c > 0)
		cpu_parallel(k->pool, j.v.n / j.c, cpu_grain_rows(j.c), bias_rows, &j);
	return 0;
}

/* ORDER KERNEL (designated): limits, run, bf16 */
const CpuKernel cpu_elementwise_kernels[DPK_COUNT] = {
	[DPK_BIAS_ADD] = {NULL, run_bias_add, 0},
};
