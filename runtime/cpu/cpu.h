/*
 * cpu/cpu.h - inside the CPU compute backend: the arguments every kernel
 * gets, the kernel files' rows, the two streams, and the operand-check
 * helpers the kernel files share. Nothing outside runtime/cpu/ includes it;
 * the executor sees the backend only through BackendOps (backend.h).
 *
 * One table, filled by the files that own the kernels. Each concept file
 * (layout.c, elementwise.c, gemm.c, loss.c, optim.c, norm.c, seq.c,
 * attention_cp.c, bf16.c) lists the rows of its ops (KernelRow, the one
 * row layout of every backend: runtime/kernel_table.h), `{DP_OP_<OP>,
 * run_<op>, limit_<op> or NULL, bf16}`, so an op's limits, its run and its
 * row live in one file; backend_cpu.c merges them (kernel_table_merge, the
 * CUDA backend's merge too) into the backend's one table, which refuses an
 * op claimed twice. Adding a CPU kernel is one row (and its functions) in
 * the file of its concept; an elementwise map is a line of vec.c's list.
 *
 * Layout: leading dims fold into rows, a tensor [a, b, c] is a [a*b, c]
 * matrix (cpu_rows / cpu_cols). Kernels trust their operands: the step-file
 * decoder checked the op's operand rules (format/stepfile_check.c) and the
 * backend its own limits once at load time (labels, token ids and positions,
 * known only at run time, are checked where they are read).
 */
#ifndef DP_CPU_INT_H
#define DP_CPU_INT_H

#include "../backend.h"
#include "../kernel_table.h"
#include "../rt.h"

/* Per optimizer step: what the optimizer kernels need beyond their operands. */
typedef struct {
	const DpOptim *opt; /* hyperparameters */
	float lr;           /* learning rate of this optimizer step */
	int64_t t;          /* optimizer step number, from 1 (bias correction, momentum);
	                       steps loss scaling skipped do not count */
	uint64_t k;         /* optimizer step k, from 0 (PowerSGD's fresh Q) */
	float loss_scale;   /* the step's loss scale (fp16's; 1 without loss scaling) */
	int *amp_found;     /* the step's found-inf flag (AMP_CHECK writes it; CLIP, ADAMW
	                       and SGD do nothing when it is set) */
} CpuStep;

/* ---- threads (pool.c) ---- */

typedef struct CpuPool CpuPool;
/* A piece [lo, hi) of a parallel loop, run by thread `thread` (0: the caller). */
typedef void (*CpuTask)(void *ctx, int64_t lo, int64_t hi, int thread);

/* A pool of `threads` threads in all (the caller is one of them). */
int cpu_pool_new(CpuPool **p, int threads, RtErr *e);
void cpu_pool_free(CpuPool *p);
int cpu_pool_size(const CpuPool *p);
/* fn over [0, n), one contiguous piece per thread cut at multiples of
 * grain (fewer threads when there are fewer grains); returns when every
 * piece is done. Serial (one call, thread 0) without a pool. Called by the
 * backend's thread only: a task must not call it (one job at a time). */
void cpu_parallel(CpuPool *p, int64_t n, int64_t grain, CpuTask fn, void *ctx);

/* Elements per piece of a parallel loop: below about two of these a loop
 * runs on one thread (a wake-up costs microseconds, 16 K floats of
 * elementwise work about as much). */
#define CPU_GRAIN 16384
/* Rows of `cols` elements per piece: about CPU_GRAIN elements. */
static inline int64_t cpu_grain_rows(int64_t cols)
{
	return cols >= CPU_GRAIN ? 1 : CPU_GRAIN / (cols > 0 ? cols : 1);
}

/* ---- vectorised loops (vec.c, built once per instruction set) ---- */


/* AdamW's per-step scalars (optim.c computes them as PyTorch does). */
typedef struct {
	float decay, beta1, beta2, one_b1, one_b2, bc2_sqrt, step_size, eps;
} CpuAdam;

/*
 * The inner loops of the kernels, one table per instruction set: "avx512"
 * and "avx2" call SLEEF's vector exp/tanh (max error 1.0 ulp, the _u10
 * functions; float exp in double lanes is SLEEF's double exp, also 1.0
 * ulp), "scalar" calls libm per element (any CPU; the reference). Every
 * element's result is independent of its position in the array (tails go
 * through the same vector code, padded), so a loop cut into pieces
 * anywhere gives bitwise the results of the whole. Reductions accumulate
 * in double, in a fixed order for a given table.
 */
typedef struct {
	const char *isa;
	/* o[i] = f(a[i], b[i]) for the elementwise op `op` (an opcode: ACCUM o += a,
	 * SCALE o = s * a, ADD, MUL, the activations and their gradients with a =
	 * dy and b = the input or output their ops.def row says), n elements */
	void (*map)(unsigned op, float *o, const float *a, const float *b, float s, int64_t n);
	/* Does map() compute op? (the same answer in every table) */
	int (*is_map)(unsigned op);
	/* max of x[0..n), n >= 1 */
	float (*max)(const float *x, int64_t n);
	/* y = exp(x - shift) (y may be x); returns the sum of y in double */
	double (*exp_shift)(float *y, const float *x, float shift, int64_t n);
	/* sum of exp((double)x - shift), exp in double */
	double (*exp_sum_d)(const float *x, double shift, int64_t n);
	/* sum of (double)a * b */
	double (*dot)(const float *a, const float *b, int64_t n);
	/* o = (float)(p * (d - c)) in double (softmax backward: c = rowsum(p * d)) */
	void (*softmax_bwd)(float *o, const float *p, const float *d, double c, int64_t n);
	/* mean (0 when rms) and 1/sqrt(var + eps) (rms: 1/sqrt(mean(x^2) + eps)) */
	void (*norm_stats)(const float *x, int64_t n, int rms, double eps, double *mean,
			   double *rstd);
	/* y = (float)((x - mean) * rstd) * g (+ b when b != NULL) */
	void (*norm_fwd)(float *y, const float *x, const float *g, const float *b, int64_t n,
			 double mean, double rstd);
	/* dx of one row (layernorm; rms: no mean term) */
	void (*norm_bwd)(float *dx, const float *dy, const float *x, const float *g, int64_t n,
			 int rms, double mean, double rstd);
	/* acc[j] += dy[j] * (x[j] - mean) * rstd, in double */
	void (*norm_gamma)(double *acc, const float *dy, const float *x, int64_t n, double mean,
			   double rstd);
	/* acc[j] += x[j], in double */
	void (*col_sum)(double *acc, const float *x, int64_t n);
	/* sum of (double)x^2 */
	double (*sqsum)(const float *x, int64_t n);
	/* torch.optim.AdamW's single-tensor update of n elements */
	void (*adamw)(float *p, const float *g, float *m, float *v, int64_t n, const CpuAdam *c);
} CpuVec;

extern const CpuVec cpu_vec_scalar, cpu_vec_avx2, cpu_vec_avx512;

typedef struct CpuGemm16 CpuGemm16; /* gemm_bf16.c */

/* OpenBLAS as gemm.c uses it: the kernels' core is picked for this CPU
 * once per process by cpu_blas_choose (before any BLAS call, whatever the
 * backend), and cpu_blas_init cuts products for the pool's threads at
 * multiples of `grain` rows, or columns where `cols`. */
typedef struct {
	int grain, cols;
} CpuBlas;
void cpu_blas_choose(void);
void cpu_blas_init(CpuBlas *b);

/* One kernel call: operands are the tensor ids of `in`, addresses in ptr.
 * The CPU's struct KernelArgs (kernel_table.h): its rows' functions take it. */
typedef struct KernelArgs {
	const DpStep *s;
	const DpInstr *in;
	void *const *ptr;
	const CpuStep *step;
	const CpuVec *vec; /* the inner loops for this CPU */
	CpuPool *pool;     /* the rank's threads (size 1: serial) */
	const CpuBlas *blas; /* OpenBLAS's cuts (gemm.c) */
	CpuGemm16 *gemm16; /* oneDNN's bf16 matmuls (gemm_bf16.c) */
} CpuArgs;

/* What running a kernel needs beyond its operands (core.c): the CPU
 * backend's, and another backend's host step's (cpu_host_kernels). */
typedef struct {
	const KernelTable *kern; /* cpu_kernel_table() */
	CpuStep step;            /* the optimizer step's scalars (set by the owner) */
	const CpuVec *vec;
	CpuPool *pool;
	CpuBlas blas;            /* OpenBLAS's core and cuts */
	CpuGemm16 *gemm16;       /* oneDNN's bf16 matmuls */
	/* 16-bit instructions of kernels without a path of their own run on f32
	 * copies (bf16.c): the workspace they are converted into, and the tensor
	 * addresses with the staged ones pointing there */
	float *ws;
	size_t ws_floats;
	void **shadow;
} CpuCore;
/* For the instructions of s (host_only: those dp_runs_on_host) over the
 * tensor addresses ptr; on failure cpu_core_free releases what was made. */
int cpu_core_init(CpuCore *k, const DpStep *s, void *const *ptr, int host_only, RtErr *e);
void cpu_core_free(CpuCore *k);
/* Instruction in over ptr: its row, its 16-bit path, or on f32 copies. */
int cpu_core_run(CpuCore *k, const DpStep *s, const DpInstr *in, void *const *ptr, RtErr *e);

/* vec->map over n elements on the rank's threads (elementwise.c). */
void cpu_map(const CpuArgs *k, unsigned op, float *o, const float *a, const float *b, float s,
	     int64_t n);
/* The row of every op vec->map computes, ended by {0}, into rows (room for
 * DP_NOPS + 1 rows) (elementwise.c). */
void cpu_map_rows(KernelRow *rows);

/* The rows of each concept file, ended by {0}. */
extern const KernelRow cpu_layout_rows[];      /* layout.c */
extern const KernelRow cpu_elementwise_rows[]; /* elementwise.c (and cpu_map_rows) */
extern const KernelRow cpu_gemm_rows[];        /* gemm.c */
extern const KernelRow cpu_loss_rows[];        /* loss.c */
extern const KernelRow cpu_optim_rows[];       /* optim.c */
extern const KernelRow cpu_norm_rows[];        /* norm.c */
extern const KernelRow cpu_seq_rows[];         /* seq.c */
extern const KernelRow cpu_cp_rows[];          /* attention_cp.c */
extern const KernelRow cpu_bf16_rows[];        /* bf16.c */
/* The CPU's kernel table, merged from them once (core.c); its err
 * says why it cannot be used. */
const KernelTable *cpu_kernel_table(void);

/* ---- the two streams, run inline (streams.c) ---- */

/* Events, collectives on the MPI comm backend, the collectives in flight
 * and the hazard check against them. Each int function returns 0 or -1
 * with e filled. */
typedef struct CpuStreams CpuStreams;
/* Runs copy-stream instruction in (enqueued at `at`) when it is needed. */
typedef int (*CpuCopyRun)(void *ctx, const BackendAt *at, const DpInstr *in, RtErr *e);
int cpu_streams_new(CpuStreams **out, const DpStep *s, Comm *comm, int no_progress,
		    CpuCopyRun run_copy, void *run_ctx, RtErr *e);
void cpu_streams_free(CpuStreams *st);
/* run_begin, run_end (compute waits for every collective), sync */
void cpu_streams_begin(CpuStreams *st);
int cpu_streams_end(CpuStreams *st, RtErr *e);
int cpu_streams_sync(CpuStreams *st, RtErr *e);
/* Before the work of instruction `at` (inside a run; nothing outside one):
 * MPI progress, the queued copies it would race with, then its stream's
 * order: on comm after every collective issued before it, on compute the
 * hazard check. */
int cpu_streams_enter(CpuStreams *st, const BackendAt *at, RtErr *e);
/* A copy-stream instruction inside a run: enqueued, to run when compute or
 * comm waits for it, touches its memory, or the run ends (1); else 0: the
 * caller runs it now (after cpu_streams_enter); -1 with e filled. */
int cpu_streams_defer(CpuStreams *st, const BackendAt *at, const DpInstr *in, RtErr *e);
int cpu_streams_event_record(CpuStreams *st, unsigned stream, unsigned ev, RtErr *e);
int cpu_streams_event_wait(CpuStreams *st, unsigned stream, unsigned ev, RtErr *e);
/* Collective `in` (instruction `at`) over tensors at ptr: started on the
 * comm stream, run to completion on compute. */
int cpu_streams_collective(CpuStreams *st, const BackendAt *at, void *const *ptr,
			   const DpInstr *in, RtErr *e);

/* ---- bf16 and f16 (bf16.c, gemm_bf16.c) ---- */

int cpu_gemm16_new(CpuGemm16 **out, RtErr *e);
void cpu_gemm16_free(CpuGemm16 *g);
const char *cpu_gemm16_describe(const CpuGemm16 *g);
/* Does this CPU run bf16 matmuls through oneDNN (else they are staged)? */
int cpu_gemm16_usable(const CpuGemm16 *g);
/* matmul / linear with bf16 operands through oneDNN: 0, -1, or 1 when this
 * CPU has no bf16 instructions (the caller stages it on f32 copies) */
int cpu_gemm16_run(CpuGemm16 *g, const CpuArgs *k, RtErr *e);

/* f32 -> bf16 rounding to nearest even (NaN stays NaN), and back. */
uint16_t cpu_to_bf16(float f);
float cpu_from_bf16(uint16_t b);
/* n f16 elements from f32 and back on this thread, F16C where the CPU has
 * it (rt_to_f16's bits either way). */
void cpu_f16_store(uint16_t *dst, const float *src, int64_t n);
void cpu_f16_load(float *dst, const uint16_t *src, int64_t n);
/* n elements of 16-bit dtype dt (DP_BF16, DP_F16) converted on the rank's
 * threads. */
void cpu_half_store(CpuPool *pool, unsigned dt, uint16_t *dst, const float *src, int64_t n);
void cpu_half_load(CpuPool *pool, unsigned dt, float *dst, const uint16_t *src, int64_t n);
/* Running a 16-bit instruction on f32 copies (a kernel without a path of
 * its own): the workspace floats it needs; its 16-bit operands converted into ws and
 * pointed to by shadow (ptr's copy); what it wrote rounded back and shadow
 * restored. */
size_t cpu_stage_need(const DpStep *s, const DpInstr *in);
void cpu_stage_in(CpuPool *pool, const DpStep *s, const DpInstr *in, void *const *ptr,
		  void **shadow, float *ws);
void cpu_stage_out(CpuPool *pool, const DpStep *s, const DpInstr *in, void *const *ptr,
		   void **shadow);

/* ---- shapes ---- */

static inline int64_t cpu_numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}
/* [rows, cols] view: the last dim is cols, the rest fold into rows. */
static inline int64_t cpu_cols(const DpTensor *t) { return t->ndim ? t->dims[t->ndim - 1] : 1; }
static inline int64_t cpu_rows(const DpTensor *t) { return cpu_numel(t) / cpu_cols(t); }

/* Tensor `id`'s table entry, or NULL for -1. */
static inline const DpTensor *cpu_t(const CpuArgs *a, int id)
{
	return id >= 0 ? &a->s->tensors[id] : NULL;
}
/* Its address as f32, or NULL for -1. */
static inline float *cpu_f(const CpuArgs *a, int id) { return id >= 0 ? a->ptr[id] : NULL; }

const char *cpu_tname(const DpStep *s, int id);

/* ---- load-time limits (check.c) ---- */

typedef struct {
	const DpStep *s;
	const DpInstr *in;
	RtErr *e;
} CpuChk;

/* "step file: OP instruction (out X, in Y, Z): what"; returns -1. */
int cpu_bad(const CpuChk *c, const char *what);
#define CPU_NEED(cond, msg)                          \
	do {                                         \
		if (!(cond))                         \
			return cpu_bad(&c, (msg));   \
	} while (0)
#endif
