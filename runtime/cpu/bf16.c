/*
 * cpu/bf16.c - bf16 and f16 on the CPU (docs/PRECISION.md): storage in 16
 * bits, arithmetic in f32. Conversions round to nearest even on every
 * store, as PyTorch's .bfloat16() and .half() do (NaN stays a quiet NaN,
 * overflow rounds to infinity; f16 has subnormals below 2^-14), so a user
 * gets the 16-bit dtype's numerics and half the memory.
 *
 * A kernel with a bf16 path of its own (a row of the table with bf16 set:
 * copies, CAST, the GEMMs) reads and writes bf16 itself; of those only CAST
 * knows f16. Every other instruction with 16-bit operands runs on f32
 * copies (cpu_stage_*, called by backend_cpu.c): the 16-bit operands it
 * reads are converted into the backend's workspace, the kernel runs there,
 * and what it wrote is rounded back. The workspace is sized at init for
 * the largest such instruction and printed with the arena.
 */
#include <immintrin.h>
#include <string.h>

#include "cpu.h"

uint16_t cpu_to_bf16(float f)
{
	return rt_to_bf16(f);
}

float cpu_from_bf16(uint16_t b)
{
	return rt_from_bf16(b);
}

/* f16 eight at a time with F16C (every AVX2 CPU has it): vcvtps2ph with
 * rounding to nearest even in its immediate (not MXCSR's mode) and
 * vcvtph2ps, the bits rt_to_f16 / rt_from_f16 compute one at a time
 * (tests/f16_test.c compares both, element for element). */
__attribute__((target("avx,f16c"))) static void f16c_store(uint16_t *d, const float *s, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(d + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		d[i] = rt_to_f16(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16c_load(float *d, const uint16_t *s, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
	for (; i < n; i++)
		d[i] = rt_from_f16(s[i]);
}

static int has_f16c(void)
{
	static int known = -1; /* the same answer for every thread: a benign race */
	if (known < 0) {
		__builtin_cpu_init();
		known = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
	}
	return known;
}

void cpu_f16_store(uint16_t *dst, const float *src, int64_t n)
{
	if (has_f16c()) {
		f16c_store(dst, src, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		dst[i] = rt_to_f16(src[i]);
}

void cpu_f16_load(float *dst, const uint16_t *src, int64_t n)
{
	if (has_f16c()) {
		f16c_load(dst, src, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		dst[i] = rt_from_f16(src[i]);
}

typedef struct {
	void *dst;
	const void *src;
	int to_half;
	unsigned dt; /* DP_BF16 or DP_F16 */
} Conv;

static void conv_piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const Conv *c = ctx;
	(void)thread;
	if (c->to_half && c->dt == DP_F16) {
		cpu_f16_store((uint16_t *)c->dst + lo, (const float *)c->src + lo, hi - lo);
	} else if (c->to_half) {
		uint16_t *d = (uint16_t *)c->dst + lo;
		const float *s = (const float *)c->src + lo;
		for (int64_t i = 0; i < hi - lo; i++)
			d[i] = cpu_to_bf16(s[i]);
	} else if (c->dt == DP_F16) {
		cpu_f16_load((float *)c->dst + lo, (const uint16_t *)c->src + lo, hi - lo);
	} else {
		float *d = (float *)c->dst + lo;
		const uint16_t *s = (const uint16_t *)c->src + lo;
		for (int64_t i = 0; i < hi - lo; i++)
			d[i] = cpu_from_bf16(s[i]);
	}
}

void cpu_half_store(CpuPool *pool, unsigned dt, uint16_t *dst, const float *src, int64_t n)
{
	Conv c = {dst, src, 1, dt};
	cpu_parallel(pool, n, CPU_GRAIN, conv_piece, &c);
}

void cpu_half_load(CpuPool *pool, unsigned dt, float *dst, const uint16_t *src, int64_t n)
{
	Conv c = {dst, src, 0, dt};
	cpu_parallel(pool, n, CPU_GRAIN, conv_piece, &c);
}

/* ---- staging an instruction on f32 copies (rt_own_half_path decides) ---- */

static size_t stage_len(const DpTensor *t)
{
	return (size_t)((dp_span(t) + 15) / 16 * 16); /* floats, 64-byte pieces */
}

size_t cpu_stage_need(const DpStep *s, const DpInstr *in)
{
	size_t n = 0;
	for (int j = -1; j < DP_MAX_IN; j++)
		if (rt_half_staged(s, in, j))
			n += stage_len(&s->tensors[j < 0 ? in->out : in->in[j]]);
	return n;
}

void cpu_stage_in(CpuPool *pool, const DpStep *s, const DpInstr *in, void *const *ptr,
		  void **shadow, float *ws)
{
	for (int j = -1; j < DP_MAX_IN; j++) {
		if (!rt_half_staged(s, in, j))
			continue;
		int id = j < 0 ? in->out : in->in[j];
		shadow[id] = ws;
		/* the output is read only when the op updates it in place */
		if (j >= 0 || dp_reads_out(in))
			cpu_half_load(pool, s->tensors[id].dtype, ws, ptr[id],
				      dp_span(&s->tensors[id]));
		ws += stage_len(&s->tensors[id]);
	}
}

void cpu_stage_out(CpuPool *pool, const DpStep *s, const DpInstr *in, void *const *ptr,
		   void **shadow)
{
	for (int j = -1; j < DP_MAX_IN; j++) {
		if (!rt_half_staged(s, in, j))
			continue;
		int id = j < 0 ? in->out : in->in[j];
		if (j < 0 || dp_writes_in(in, j))
			cpu_half_store(pool, s->tensors[id].dtype, ptr[id], shadow[id],
				       dp_span(&s->tensors[id]));
		shadow[id] = ptr[id];
	}
}

/* ---- CAST: out = in0 in out's dtype ---- */

static int run_cast(const CpuArgs *k, RtErr *e)
{
	const DpTensor *o = cpu_t(k, k->in->out), *a = cpu_t(k, k->in->in[0]);
	void *dst = k->ptr[k->in->out];
	const void *src = k->ptr[k->in->in[0]];
	int64_t n = cpu_numel(o);
	(void)e;
	if (o->dtype == a->dtype)
		memmove(dst, src, (size_t)n * dp_dtype_size(o->dtype));
	else if (dp_is_half(o->dtype))
		cpu_half_store(k->pool, o->dtype, dst, src, n);
	else
		cpu_half_load(k->pool, a->dtype, dst, src, n);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas}: kernel_table.h (the
 * decoder checks CAST's operands: f32 or bf16, the same size, disjoint) */
const KernelRow cpu_bf16_rows[] = {
	{DP_OP_CAST, run_cast, NULL, 1, NULL, NULL, 0, 0},
	{0},
};
