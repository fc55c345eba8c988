/*
 * cpu/pool.c - the CPU backend's threads: one small pool per backend that
 * every kernel shares, the GEMMs included (OpenBLAS itself runs with one
 * thread, and gemm.c splits a product over the pool), so there is one set
 * of threads per rank and never two pools spinning against each other.
 *
 * Why a pool of our own and not OpenMP: Debian's OpenBLAS is the pthread
 * build, whose workers spin (with sched_yield) after every threaded GEMM;
 * OpenMP workers spin after every parallel region too (GOMP_SPINCOUNT), so
 * the two fight for the same cores between a GEMM and the kernel after it.
 * With OpenBLAS at one thread and every parallel loop here, nothing else
 * spins. The pool is a context struct (no global runtime state), and its
 * workers spin only briefly (SPIN_NS) before they sleep on a condition
 * variable, so a rank that shares its cores with a busy neighbour gives
 * them up at once.
 *
 * Work is split statically: cpu_parallel cuts [0, n) into one contiguous
 * piece per thread, at multiples of `grain`. Kernels make every item's
 * result independent of where the cuts fall (no reduction across items
 * whose order would depend on the thread count), so results are bitwise
 * the same at any thread count.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cpu.h"

/* How long an idle worker polls for the next job before it sleeps. The
 * kernels of a step follow one another within microseconds. */
#define SPIN_NS 50000

struct CpuPool {
	int n; /* threads, the caller included */
	pthread_t *tid;
	pthread_mutex_t mu;
	pthread_cond_t wake;
	atomic_uint gen;     /* bumped once per job */
	atomic_int pending;  /* workers that have not finished the current job */
	atomic_int stop;
	/* the current job (written before gen is bumped) */
	CpuTask fn;
	void *ctx;
	int64_t items, grain;
	int used; /* threads taking part in the job, <= n */
};

typedef struct {
	CpuPool *p;
	int k; /* worker index, 1..n-1 (0 is the caller) */
} Worker;

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Piece k of `used`: [lo, hi), cut at multiples of grain. */
static void piece(const CpuPool *p, int k, int64_t *lo, int64_t *hi)
{
	int64_t blocks = (p->items + p->grain - 1) / p->grain;
	int64_t b0 = blocks * k / p->used, b1 = blocks * (k + 1) / p->used;
	*lo = b0 * p->grain;
	*hi = b1 * p->grain < p->items ? b1 * p->grain : p->items;
}

static void run_piece(CpuPool *p, int k)
{
	int64_t lo, hi;
	piece(p, k, &lo, &hi);
	if (lo < hi)
		p->fn(p->ctx, lo, hi, k);
}

static void *worker(void *arg)
{
	Worker *w = arg;
	CpuPool *p = w->p;
	unsigned seen = 0; /* gen when the pool started: a job may come before this line runs */
	for (;;) {
		unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (g == seen && !atomic_load(&p->stop)) {
			int64_t t0 = now_ns();
			for (int i = 0; g == seen; i++) {
				relax();
				if ((i & 255) == 255 && now_ns() - t0 > SPIN_NS)
					break;
				g = atomic_load_explicit(&p->gen, memory_order_acquire);
			}
			if (g == seen) {
				pthread_mutex_lock(&p->mu);
				while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
					pthread_cond_wait(&p->wake, &p->mu);
				pthread_mutex_unlock(&p->mu);
			}
		}
		if (atomic_load(&p->stop))
			break;
		seen = g;
		if (w->k < p->used)
			run_piece(p, w->k);
		atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
	}
	free(w);
	return NULL;
}

int cpu_pool_new(CpuPool **out, int threads, RtErr *e)
{
	*out = NULL;
	CpuPool *p = calloc(1, sizeof *p);
	if (!p)
		return RT_FAIL(e, "out of memory (CPU thread pool)");
	p->n = threads < 1 ? 1 : threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	p->tid = calloc((size_t)p->n, sizeof *p->tid);
	if (!p->tid) {
		cpu_pool_free(p);
		return RT_FAIL(e, "out of memory (CPU thread pool)");
	}
	for (int k = 1; k < p->n; k++) {
		Worker *w = malloc(sizeof *w);
		if (w)
			*w = (Worker){p, k};
		if (!w || pthread_create(&p->tid[k], NULL, worker, w) != 0) {
			free(w);
			p->n = k; /* join the ones that started */
			cpu_pool_free(p);
			return RT_FAIL(e, "cannot start CPU thread %d of %d", k, threads);
		}
	}
	*out = p;
	return 0;
}

void cpu_pool_free(CpuPool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (int k = 1; k < p->n; k++)
		if (p->tid && p->tid[k])
			pthread_join(p->tid[k], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->wake);
	free(p->tid);
	free(p);
}

int cpu_pool_size(const CpuPool *p)
{
	return p ? p->n : 1;
}

void cpu_parallel(CpuPool *p, int64_t n, int64_t grain, CpuTask fn, void *ctx)
{
	if (n <= 0)
		return;
	if (grain < 1)
		grain = 1;
	int64_t blocks = (n + grain - 1) / grain;
	if (!p || p->n == 1 || blocks == 1) {
		fn(ctx, 0, n, 0);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->items = n;
	p->grain = grain;
	p->used = blocks < p->n ? (int)blocks : p->n;
	atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
	/* the bump publishes the job; a worker about to sleep re-checks gen
	 * under the mutex, so the broadcast cannot be missed */
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	run_piece(p, 0);
	for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++)
		if (i < 4096)
			relax();
		else
			sched_yield();
}
