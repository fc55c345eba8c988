/*
 * cpu/gemm_bf16.c - matmul and linear on bf16 operands: oneDNN's matmul
 * primitive (bf16 x bf16, f32 accumulation, the result rounded once to a
 * bf16 output or kept in an f32 one: a weight gradient accumulated in f32).
 *
 * Why oneDNN: OpenBLAS 0.3.21 as Debian packages it exports no bf16 GEMM,
 * so the alternative is converting both operands to f32 for sgemm and the
 * result back. bench/bf16_gemm.c measured both on this machine
 * (avx512_bf16, one thread): oneDNN's brgemm kernels are 1.8x to 3.9x
 * faster (1024x256x768: 4.1 vs 10.5 ms; 1024x768x50257: 0.69 vs 2.69 s)
 * and need no f32 copies. Where the CPU has no bf16 instructions (oneDNN's
 * effective ISA below avx512_core_bf16), or DP_CPU_BF16_GEMM=blas, this
 * declines and the backend runs the instruction on f32 copies with
 * OpenBLAS (bf16.c's staging): slower, the same rounding points.
 *
 * Threads: a product is split over the rank's pool in row blocks of the
 * output (cut at multiples of 64), each piece one single-threaded oneDNN
 * call: oneDNN's OpenMP workers spin after every parallel region and would
 * fight the pool's threads between one kernel and the next (pool.c). A
 * piece must be a dense block: a piece of a transposed A (weight
 * gradients) or a column block has gaps between its rows, for which
 * oneDNN falls back from its brgemm kernels to a gemm that packs its
 * operands into f32 buffers of its own (412 MB per thread for GPT-2's tied
 * head). So a large product with a transposed A (GEMM16_DENSE) is one
 * oneDNN call over the pool's number of OpenMP threads (the spinning after
 * it is a small part of its time). One primitive per instruction and
 * piece, made at its first run and kept, with its own memory objects and
 * its thread's stream; transposes are strides.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

void omp_set_num_threads(int n); /* libgomp, which oneDNN runs on */

#define MAX_THREADS 1024

#include "cpu.h"

typedef struct {
	const DpInstr *in;
	int64_t lo, hi; /* the piece: rows (by_rows) or columns of the output */
	dnnl_primitive_t prim;
	dnnl_memory_t mem[4]; /* src, weights, dst, bias */
} Prim;

struct CpuGemm16 {
	dnnl_engine_t eng;
	dnnl_stream_t stream[MAX_THREADS]; /* per pool thread, made at its first use */
	pthread_mutex_t mu;                /* the cache and the streams */
	Prim *p;
	int np, cap;
	int usable; /* bf16 instructions, and not turned off */
};

int cpu_gemm16_new(CpuGemm16 **out, RtErr *e)
{
	CpuGemm16 *g = calloc(1, sizeof *g);
	if (!g)
		return RT_FAIL(e, "out of memory (oneDNN)");
	const char *want = getenv("DP_CPU_BF16_GEMM");
	g->usable = dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core_bf16 &&
		    !(want && strcmp(want, "blas") == 0);
	if (g->usable && dnnl_engine_create(&g->eng, dnnl_cpu, 0) != dnnl_success) {
		free(g);
		return RT_FAIL(e, "oneDNN: cannot create a CPU engine");
	}
	pthread_mutex_init(&g->mu, NULL);
	*out = g;
	return 0;
}

void cpu_gemm16_free(CpuGemm16 *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->np; i++) {
		for (int k = 0; k < 4; k++)
			if (g->p[i].mem[k])
				dnnl_memory_destroy(g->p[i].mem[k]);
		dnnl_primitive_destroy(g->p[i].prim);
	}
	free(g->p);
	for (int t = 0; t < MAX_THREADS; t++)
		if (g->stream[t])
			dnnl_stream_destroy(g->stream[t]);
	pthread_mutex_destroy(&g->mu);
	if (g->eng)
		dnnl_engine_destroy(g->eng);
	free(g);
}

int cpu_gemm16_usable(const CpuGemm16 *g)
{
	return g && g->usable;
}

const char *cpu_gemm16_describe(const CpuGemm16 *g)
{
	return g && g->usable ? "bf16 GEMM oneDNN" : "bf16 GEMM via f32 (OpenBLAS)";
}

static dnnl_data_type_t dt_of(const DpTensor *t)
{
	return t->dtype == DP_BF16 ? dnnl_bf16 : dnnl_f32;
}

/* A 2-D [r, c] view with strides (rs, cs). */
static int desc(dnnl_memory_desc_t *d, int64_t r, int64_t c, int64_t rs, int64_t cs,
		dnnl_data_type_t dt)
{
	dnnl_dims_t dims = {r, c}, strides = {rs, cs};
	return dnnl_memory_desc_init_by_strides(d, 2, dims, dt, strides) != dnnl_success;
}

/* A matmul's transpose flags; a linear has none. */
static int trans_a(const DpInstr *in)
{
	return in->op == DP_OP_MATMUL && DP_ATTR(in, MATMUL, transA);
}

static int trans_b(const DpInstr *in)
{
	return in->op == DP_OP_MATMUL && DP_ATTR(in, MATMUL, transB);
}

/* The sizes of matmul/linear instruction in: op(A) [m, k] @ op(B) [k, n]. */
static void dims_of(const CpuArgs *k, int64_t *m, int64_t *kk, int64_t *n)
{
	const DpInstr *in = k->in;
	const DpTensor *a = cpu_t(k, in->in[0]), *b = cpu_t(k, in->in[1]);
	int ta = trans_a(in), tb = trans_b(in);
	*m = ta ? cpu_cols(a) : cpu_rows(a);
	*kk = ta ? cpu_rows(a) : cpu_cols(a);
	/* the output's columns: a pad_rows in1 (passes/padvocab.c) has zero
	 * rows past n (or past k, by kk), which the CPU leaves out */
	*n = tb ? cpu_cols(cpu_t(k, in->out)) : cpu_cols(b);
}

/* The primitive of piece [lo, hi) of matmul/linear instruction in (rows of
 * the output when by_rows, else columns), made on its first run. Called
 * with g->mu held. */
static Prim *prim_of(CpuGemm16 *g, const CpuArgs *k, int by_rows, int64_t lo, int64_t hi,
		     RtErr *e)
{
	const DpInstr *in = k->in;
	for (int i = 0; i < g->np; i++)
		if (g->p[i].in == in && g->p[i].lo == lo && g->p[i].hi == hi)
			return &g->p[i];
	const DpTensor *a = cpu_t(k, in->in[0]), *b = cpu_t(k, in->in[1]), *o = cpu_t(k, in->out);
	const DpTensor *bias = in->op == DP_OP_LINEAR && in->in[2] >= 0 ? cpu_t(k, in->in[2]) : NULL;
	int ta = trans_a(in), tb = trans_b(in);
	int acc = in->op == DP_OP_MATMUL && DP_ATTR(in, MATMUL, acc);
	int64_t ca = dp_ld(a), cb = dp_ld(b), co = dp_ld(o), m, kk, n; /* row strides */
	dims_of(k, &m, &kk, &n);
	int64_t pm = by_rows ? hi - lo : m, pn = by_rows ? n : hi - lo; /* the piece */
	dnnl_memory_desc_t ad, bd, od, biasd;
	/* op(A) [m, k]: A stored [ra, ca] row-major; transposed: strides swap.
	 * A piece keeps the whole tensors' strides (its pointers move). */
	int bad = desc(&ad, pm, kk, ta ? 1 : ca, ta ? ca : 1, dt_of(a)) ||
		  desc(&bd, kk, pn, tb ? 1 : cb, tb ? cb : 1, dt_of(b)) ||
		  desc(&od, pm, pn, co, 1, dt_of(o)) ||
		  (bias && desc(&biasd, 1, pn, n, 1, dt_of(bias)));
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_matmul_desc_t md;
	dnnl_primitive_desc_t pd = NULL;
	Prim p = {.in = in, .lo = lo, .hi = hi};
	if (!bad && acc) /* out += A @ B: oneDNN's sum post-op */
		bad = dnnl_primitive_attr_create(&attr) || dnnl_post_ops_create(&po) ||
		      dnnl_post_ops_append_sum(po, 1.0f) || dnnl_primitive_attr_set_post_ops(attr, po);
	if (!bad)
		bad = dnnl_matmul_desc_init(&md, &ad, &bd, bias ? &biasd : NULL, &od) ||
		      dnnl_primitive_desc_create(&pd, &md, attr, g->eng, NULL) ||
		      dnnl_primitive_create(&p.prim, pd);
	if (!bad)
		bad = dnnl_memory_create(&p.mem[0], &ad, g->eng, DNNL_MEMORY_NONE) ||
		      dnnl_memory_create(&p.mem[1], &bd, g->eng, DNNL_MEMORY_NONE) ||
		      dnnl_memory_create(&p.mem[2], &od, g->eng, DNNL_MEMORY_NONE) ||
		      (bias && dnnl_memory_create(&p.mem[3], &biasd, g->eng, DNNL_MEMORY_NONE));
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	if (po)
		dnnl_post_ops_destroy(po);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	if (bad) {
		for (int i = 0; i < 4; i++)
			if (p.mem[i])
				dnnl_memory_destroy(p.mem[i]);
		if (p.prim)
			dnnl_primitive_destroy(p.prim);
		RT_FAIL(e, "oneDNN: no bf16 matmul for %s (out %s: [%lld, %lld] x [%lld, %lld])",
			dp_op_names[in->op], cpu_tname(k->s, in->out), (long long)pm, (long long)kk,
			(long long)kk, (long long)pn);
		return NULL;
	}
	if (g->np == g->cap) {
		int cap = g->cap ? 2 * g->cap : 64;
		Prim *grown = realloc(g->p, (size_t)cap * sizeof *grown);
		if (!grown) {
			RT_FAIL(e, "out of memory (oneDNN primitives)");
			return NULL;
		}
		g->p = grown;
		g->cap = cap;
	}
	g->p[g->np] = p;
	return &g->p[g->np++];
}

typedef struct {
	CpuGemm16 *g;
	const CpuArgs *k;
	int by_rows;
	int threads; /* OpenMP threads of each call: 1 in a pool piece */
	int failed;
	RtErr err;
} Job;

/* One piece: its primitive on this thread's stream, pointers moved to it. */
static void piece(void *ctx, int64_t lo, int64_t hi, int thread)
{
	Job *j = ctx;
	CpuGemm16 *g = j->g;
	const CpuArgs *k = j->k;
	const DpInstr *in = k->in;
	RtErr e = {0};
	omp_set_num_threads(j->threads > 1 ? j->threads : 1); /* 1: the pool is the parallelism */
	pthread_mutex_lock(&g->mu);
	Prim *p = thread < MAX_THREADS ? prim_of(g, k, j->by_rows, lo, hi, &e) : NULL;
	if (p && !g->stream[thread] &&
	    dnnl_stream_create(&g->stream[thread], g->eng, dnnl_stream_default_flags) != dnnl_success)
		p = NULL, RT_FAIL(&e, "oneDNN: cannot create a stream");
	pthread_mutex_unlock(&g->mu);
	if (!p) {
		if (!j->failed)
			j->err = e;
		j->failed = 1;
		return;
	}
	const DpTensor *a = cpu_t(k, in->in[0]), *b = cpu_t(k, in->in[1]), *o = cpu_t(k, in->out);
	int ta = trans_a(in), tb = trans_b(in);
	/* element offsets of the piece in A, B, the output and the bias (rows
	 * by their strides: padded rows, passes/padvocab.c) */
	int64_t off[4] = {0, 0, 0, 0};
	if (j->by_rows) {
		off[0] = ta ? lo : lo * dp_ld(a);
		off[2] = lo * dp_ld(o);
	} else {
		off[1] = tb ? lo * dp_ld(b) : lo;
		off[2] = lo;
		off[3] = lo;
	}
	int ids[4] = {in->in[0], in->in[1], in->out, in->op == DP_OP_LINEAR ? in->in[2] : -1};
	static const int which[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
	dnnl_exec_arg_t args[4];
	int nargs = 0;
	for (int i = 0; i < 4; i++) {
		if (ids[i] < 0 || !p->mem[i])
			continue;
		size_t el = dp_dtype_size(k->s->tensors[ids[i]].dtype);
		dnnl_memory_set_data_handle(p->mem[i], (char *)k->ptr[ids[i]] + off[i] * el);
		args[nargs++] = (dnnl_exec_arg_t){which[i], p->mem[i]};
	}
	int bad = dnnl_primitive_execute(p->prim, g->stream[thread], nargs, args) != dnnl_success ||
		  dnnl_stream_wait(g->stream[thread]) != dnnl_success;
	if (j->threads > 1)
		omp_set_num_threads(1);
	if (bad) {
		if (!j->failed)
			RT_FAIL(&j->err, "oneDNN: the bf16 %s writing %s failed",
				dp_op_names[in->op], cpu_tname(k->s, in->out));
		j->failed = 1;
	}
	(void)a;
}

/* Below this many flops a product is one call (gemm.c's GEMM_SERIAL). */
#define GEMM16_SERIAL (1 << 21)
/* From this many flops a product with a transposed A is one dense call on
 * oneDNN's threads; below, its pieces' f32 packing buffers are small
 * (pieces x K x 4 bytes) and the pool splits it like the others. */
#define GEMM16_DENSE (1LL << 31)

int cpu_gemm16_run(CpuGemm16 *g, const CpuArgs *k, RtErr *e)
{
	if (!g || !g->usable)
		return 1; /* the backend stages it on f32 copies */
	int64_t m, kk, n;
	dims_of(k, &m, &kk, &n);
	Job j = {.g = g, .k = k, .by_rows = 1};
	double flops = 2.0 * (double)m * (double)n * (double)kk;
	if (trans_a(k->in) && flops >= GEMM16_DENSE) {
		/* a large transposed A: one dense call on oneDNN's threads (the top) */
		j.threads = cpu_pool_size(k->pool);
		piece(&j, 0, m, 0);
	} else {
		cpu_parallel(k->pool, m, flops < GEMM16_SERIAL ? m : 64, piece, &j);
	}
	if (j.failed) {
		*e = j.err;
		return -1;
	}
	return 0;
}
