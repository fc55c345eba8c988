/*
 * bench/bf16_gemm.c - the CPU bf16 GEMM choice, measured: for C = A @ B with
 * A [M,K] and B [K,N] stored in bf16 (C rounded to bf16),
 *   (a) convert A and B to f32, OpenBLAS sgemm, round C (what a CPU without
 *       bf16 instructions does),
 *   (b) oneDNN's matmul primitive on the bf16 operands, f32 accumulation
 *       (created once, executed R times; its implementation is printed:
 *       brg:avx512_core_bf16 where the CPU has avx512_bf16).
 * Built and run by bench/bf16.sh; also by hand:
 *   gcc -O2 bench/bf16_gemm.c -o /tmp/g -lopenblas -ldnnl && /tmp/g M K N R
 */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* round to nearest even, as PyTorch and dp's kernels */
static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 64); /* quiet NaN */
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

#define CK(x)                                                              \
	do {                                                               \
		dnnl_status_t s_ = (x);                                    \
		if (s_) {                                                  \
			fprintf(stderr, "oneDNN error %d at line %d\n", s_, __LINE__); \
			exit(1);                                           \
		}                                                          \
	} while (0)

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: bf16_gemm M K N REPEATS\n");
		return 1;
	}
	long M = atol(argv[1]), K = atol(argv[2]), N = atol(argv[3]);
	int R = atoi(argv[4]);
	uint16_t *A = malloc(2 * M * K), *B = malloc(2 * K * N), *C = malloc(2 * M * N);
	float *Af = malloc(4 * M * K), *Bf = malloc(4 * K * N), *Cf = malloc(4 * M * N);
	if (!A || !B || !C || !Af || !Bf || !Cf)
		return 1;
	srand(1);
	for (long i = 0; i < M * K; i++)
		A[i] = to_bf16((float)(rand() % 2000 - 1000) / 1000.f);
	for (long i = 0; i < K * N; i++)
		B[i] = to_bf16((float)(rand() % 2000 - 1000) / 1000.f);

	double t0 = now();
	for (int r = 0; r < R; r++) {
		for (long i = 0; i < M * K; i++)
			Af[i] = from_bf16(A[i]);
		for (long i = 0; i < K * N; i++)
			Bf[i] = from_bf16(B[i]);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1, Af,
			    (int)K, Bf, (int)N, 0, Cf, (int)N);
		for (long i = 0; i < M * N; i++)
			C[i] = to_bf16(Cf[i]);
	}
	double tb = (now() - t0) / R;
	uint16_t want = C[M * N / 2];

	dnnl_engine_t eng;
	dnnl_stream_t st;
	CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
	CK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
	dnnl_memory_desc_t ad, bd, cd;
	dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
	CK(dnnl_memory_desc_init_by_tag(&ad, 2, da, dnnl_bf16, dnnl_ab));
	CK(dnnl_memory_desc_init_by_tag(&bd, 2, db, dnnl_bf16, dnnl_ab));
	CK(dnnl_memory_desc_init_by_tag(&cd, 2, dc, dnnl_bf16, dnnl_ab));
	dnnl_matmul_desc_t md;
	CK(dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd));
	dnnl_primitive_desc_t pd;
	CK(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
	const char *impl = "?";
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
	dnnl_primitive_t p;
	CK(dnnl_primitive_create(&p, pd));
	dnnl_memory_t am, bm, cm;
	CK(dnnl_memory_create(&am, &ad, eng, A));
	CK(dnnl_memory_create(&bm, &bd, eng, B));
	CK(dnnl_memory_create(&cm, &cd, eng, C));
	dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
	CK(dnnl_primitive_execute(p, st, 3, args));
	CK(dnnl_stream_wait(st));
	t0 = now();
	for (int r = 0; r < R; r++) {
		CK(dnnl_primitive_execute(p, st, 3, args));
		CK(dnnl_stream_wait(st));
	}
	double td = (now() - t0) / R;
	double fl = 2.0 * M * N * K;
	printf("%5ld %5ld %6ld  convert+sgemm %9.3f ms %6.1f GFLOP/s   oneDNN %9.3f ms %6.1f GFLOP/s"
	       "  (%.2fx, %s; same result: %s)\n",
	       M, K, N, tb * 1e3, fl / tb * 1e-9, td * 1e3, fl / td * 1e-9, tb / td, impl,
	       from_bf16(C[M * N / 2]) == from_bf16(want) ? "yes" : "no (summation order)");
	return 0;
}
