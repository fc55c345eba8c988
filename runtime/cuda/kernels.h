/*
 * kernels.h - the CUDA backend's kernel table as the backend
 * (backend_cuda.c, plain C) and the kernel files (the .cu files of runtime/cuda, nvcc)
 * see it: rows of every backend's layout (KernelRow, runtime/kernel_table.h)
 * holding the op's launcher and what it needs from the backend (a cuBLASLt
 * handle and workspace on its stream, scratch memory, its own load limits),
 * plus the load-time planners that fuse neighbouring instructions or, for
 * the GEMMs, choose cuBLASLt's algorithm before anything is captured.
 *
 * Each kernel file owns the ops of one concept and lists their rows
 * (cu_<concept>_rows, any order, ended by {}); kernels.cu merges them into
 * cu_kernel_table with kernel_table_merge (the CPU backend's merge too), so
 * an op's device code, launcher and row live in exactly one file:
 *   layout.cu       fill, copies, transposes, splits, interleave, embedding,
 *                   the context-parallel kv packing, and the strided copy of
 *                   SHARD (cu_k_copy2d)
 *   elementwise.cu  activations and their gradients, add, mul, scale, accum,
 *                   bias_add
 *   gemm.cu         matmul, linear (cuBLASLt), bias_grad
 *   loss.cu         cross entropy, its gradient, correct
 *   optim.cu        squared norm, sqrt, clip, SGD, AdamW
 *   norm.cu         layernorm and rmsnorm with their gradients
 *   seq.cu          softmax and its gradient, rope
 *   attention.cu    causal attention (flash style) and the context-parallel
 *                   attention kernels
 *   kernels.cu      the table, the per-step schedule and report kernels, the
 *                   watchdog's progress mark
 *
 * Every launcher enqueues on the instruction's stream and checks the launch
 * (cudaGetLastError) and every cuBLASLt status; nothing here synchronises,
 * allocates or touches host memory, so every launcher is legal inside
 * stream capture.
 *
 * Semantics follow the CPU backend (runtime/cpu/), kernel for kernel: the
 * CPU is the reference. Each kernel file states, per op, the accumulation
 * order and how far its results may differ from the CPU's (docs/CUDA.md
 * collects them). Every reduction has a fixed shape (grid and tree derived
 * from the tensor shapes only), so a run is bitwise reproducible and a
 * graph replay equals an eager run.
 */
#ifndef DP_CU_KERNELS_H
#define DP_CU_KERNELS_H

#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../amp.h"
#include "../kernel_table.h"
#include "../rt.h"

/* CuScalars.opt_k: the optimizer's per-step constants (AdamW's), computed by
 * the schedule kernel (kernels.cu) as the CPU computes them, read by optim.cu
 * (the decay and step size depend on the update's group: optim.cu derives
 * them from lr and bc1) */
enum { CU_OPT_BC2_SQRT };

/* What a kernel can find wrong in data (sc->err): the CPU fails with an
 * error for the same value. */
enum {
	CU_ERR_NONE,
	CU_ERR_LABEL,    /* a label >= classes (value, row, classes) */
	CU_ERR_TOKEN,    /* a token id outside [0, V) (value, position, V) */
	CU_ERR_POSITION, /* a cp position not in the zigzag layout (value, row, sequence) */
};

/*
 * Per-step scalars in device memory. The schedule kernel at the head of every
 * optimizer step derives lr and the optimizer's per-step constants from
 * `step`; the tail kernel reports and increments `step`. A captured graph
 * therefore bakes no host value that changes between steps. err* is the one
 * thing kernels report back (first error wins).
 */
typedef struct {
	uint64_t step;          /* optimizer step k, from 0; incremented at the end of a step */
	int64_t t;              /* k + 1: bias correction, momentum's first step */
	float lr;               /* exec_lr(k) rounded to float, as the CPU backend gets it */
	float opt_k[4];         /* the optimizer kernels' per-step constants, derived from
	                           lr and t by the schedule kernel (kernels.cu) */
	int32_t err;            /* CU_ERR_*: 0, or the first bad value a kernel met */
	int32_t pad;
	int64_t err_value;      /* the offending value */
	int64_t err_index;      /* its row / position */
	int64_t err_limit;      /* the bound it broke */
	double bc1;             /* AdamW's bias correction 1 - beta1^t, in double as the CPU's */
	/* fp16's loss scaling (amp.h): the state, set from the host at the first
	 * step and on resume (cu_k_set_amp), then the device's own: t counts the
	 * steps not skipped, AMP_CHECK sets ls_found, the optimizer kernels do
	 * nothing on a step that has it, and the step's tail updates the state */
	AmpState amp;
	float ls_ran;           /* the scale the step ran with (the report's) */
	int32_t ls_found;       /* this step's gradients overflowed: no update */
} CuScalars;

/*
 * What the device tells the host without a copy: written by a kernel into
 * mapped pinned host memory (one slot per step parity, and one for other
 * runs), read by the host after the event that follows it completed.
 */
typedef struct {
	int64_t step;           /* the optimizer step these are from (k), -1: a non-step run */
	int64_t t;              /* the device's t of that step */
	float lr;               /* the device's lr of that step */
	float loss;             /* the loss metric at the end of the step (0 when absent) */
	float grad_norm;        /* the grad-norm metric (0 when absent) */
	int32_t err;            /* CuScalars.err and its details */
	int64_t err_value, err_index, err_limit;
	AmpState amp;           /* loss scaling's state after the step */
	float ls_ran;           /* ... the scale the step ran with */
	int32_t ls_found;       /* ... and whether it was skipped */
} CuReport;

/* Fusions the planners decide at load, one entry per instruction of every
 * program (all zero: the instruction runs as written). Device addresses. */
typedef struct {
	int skip;               /* 1: another instruction does this one's work */
	const float *clip_norm; /* optimizer: scale the gradients by torch's clip coefficient
	                           from this norm first (the folded clip); NULL: none */
	float clip_max;         /* ... and this max_norm */
	double *rowstats;       /* cross entropy: per row (max, sum of exp) that the loss
	                           kernel writes and its gradient reads; NULL: none */
	int rowstats_in;        /* 1: the gradient reads rowstats (its loss wrote them) */
	struct CuGemm *gemm;    /* matmul, linear: the cuBLASLt descriptors and algorithm
	                           chosen at load (host memory, gemm.cu); NULL: none */
	const float *bgrad;     /* bias_grad: the column sums of its input that a weight
	                           gradient's matmul wrote by cuBLASLt's BGRADA epilogue
	                           (gemm.cu), added to the output; NULL: none */
	float *lse;             /* attention on tensor cores: each query row's log-sum-exp,
	                           which the forward writes and its gradient reads
	                           (attention.cu); NULL: none */
	const void *lse_o;      /* attention_grad reading lse: its forward's output O,
	                           intact until the gradient (D = dO . O from it) */
	const struct CuMtTensor *mt; /* adamw: the first of a run of updates that one
	                           multi-tensor launch does (optim.cu's cu_plan_adamw): the
	                           run's table of tensors; the others of the run have skip;
	                           NULL: none */
	const uint32_t *mt_chunk; /* ... per block of that launch, (update, chunk) */
	uint32_t mt_nchunk;     /* ... the blocks: chunks of every update of the run */
	uint32_t mt_n;          /* ... the updates of the run */
	const DpInstr *norm_gb; /* a norm's dx (layernorm_grad[_add], rmsnorm_grad[_add]):
	                           the layernorm_grad_gb, layernorm_grad_g or rmsnorm_grad_g
	                           of the same dy and x whose sums its kernel also makes
	                           (that instruction skipped; norm.cu); NULL: none */
} CuFuse;

/* One kernel call: the instruction, device addresses, its stream's
 * resources. The CUDA backend's struct KernelArgs (kernel_table.h): its
 * rows' functions take it. */
typedef struct KernelArgs {
	const DpStep *s;
	const DpInstr *in;
	void *const *ptr;       /* device address of every tensor */
	cudaStream_t st;        /* the instruction's stream */
	cublasLtHandle_t blas;  /* that stream's cuBLASLt handle (rows with blas = 1) */
	void *blas_ws;          /* ... and its workspace, CU_BLAS_WS_BYTES */
	void *scratch;          /* that stream's scratch (at least the row's scratch bytes,
	                           256-byte aligned) */
	CuScalars *sc;          /* device per-step scalars */
	const CuFuse *fuse;     /* the instruction's plan entry */
	int tf32;               /* GEMMs may use TF32 tensor cores (precision tf32) */
} CuArgs;

/* cuBLASLt workspace per stream with GEMMs (Hopper's advice: 32 MiB); every
 * algorithm chosen needs at most this much. */
#define CU_BLAS_WS_BYTES ((size_t)32 << 20)

/* Scratch bytes every stream has (the two-stage reductions' partial sums). */
#define CU_REDUCE_BLOCKS 256
#define CU_SCRATCH_MIN (CU_REDUCE_BLOCKS * sizeof(double) * 2)

/*
 * bf16 instructions of kernels without a bf16 path (bf16.cu), the CPU's
 * scheme (runtime/cpu/bf16.c): every bf16 operand the kernel reads is
 * widened into f32 copies in the stream's scratch (after the row's own
 * scratch bytes), the f32 kernel runs on them, and what it wrote is rounded
 * back to nearest even. An optimizer's compute copy (dp_writes_in) is never
 * staged: the optimizer writes it itself.
 */
/* Bytes of f32 copies instruction `in` needs (0: nothing is bf16). */
size_t cu_stage_need(const DpStep *s, const DpInstr *in);
/* Widen in's bf16 operands into ws (cu_stage_need bytes, 256-byte aligned)
 * on stream st and point shadow[id] at their copies; shadow starts as a copy
 * of the tensors' addresses. */
cudaError_t cu_stage_in(cudaStream_t st, const DpStep *s, const DpInstr *in,
			void *const *ptr, void **shadow, void *ws);
/* Round what in wrote back into its bf16 tensors; shadow is restored. */
cudaError_t cu_stage_out(cudaStream_t st, const DpStep *s, const DpInstr *in,
			 void *const *ptr, void **shadow);

/* The table (kernels.cu): rows' scratch, blas and bf16 as kernel_table.h
 * says; a non-empty err stops init. */
extern const KernelTable cu_kernel_table;
/* cudaSuccess when this build has an image (cubin or PTX) of its kernels
 * that runs on the current device, else the runtime's refusal
 * (cudaErrorNoKernelImageForDevice, or cudaErrorInvalidDeviceFunction from
 * older runtimes). Every kernel is built for the same CUDA_ARCH
 * (mk/cuda.mk), so one kernel answers for all (kernels.cu). */
cudaError_t cu_kernel_image(void);

/* gemm.cu's fused GEMMs where cuBLASLt's GELU epilogue is not used
 * (elementwise.cu), on a's stream: f32, gelu (grad = 0: o = gelu(x)) or
 * gelu_grad (o = x * gelu'(y)) over n elements; bf16 or fp16 (a's output's
 * dtype: h and g in it), from the product v in f32 [n / c, c]: linear_gelu
 * (grad = 0) h = half(v + bias), g = half(gelu(v + bias)) (bias: NULL or
 * [c] in h's dtype); matmul_gelu_grad g = half(v * gelu'(h)). */
int cu_gelu_map(const CuArgs *a, int grad, float *o, const float *x, const float *y, int64_t n,
		RtErr *e);
int cu_gelu_finish(const CuArgs *a, int grad, void *g, void *h, const float *v, const void *bias,
		   int64_t n, int64_t c, RtErr *e);

/* The rows of each kernel file, ended by {}. */
extern const KernelRow cu_layout_rows[];
extern const KernelRow cu_elementwise_rows[];
extern const KernelRow cu_gemm_rows[];
extern const KernelRow cu_loss_rows[];
extern const KernelRow cu_optim_rows[];
extern const KernelRow cu_norm_rows[];
extern const KernelRow cu_seq_rows[];
extern const KernelRow cu_attention_rows[];
extern const KernelRow cu_bf16_rows[];

/*
 * Load-time planning. A planner reads every program and fills the CuFuse
 * entries of the instructions it fuses, with device memory from alloc
 * (persistent, zeroed, freed by the backend). fuse[p][i] belongs to
 * instruction i of program p; ptr are the tensors' device addresses.
 * stage is this rank's pipeline stage: the executor skips the other
 * stages' instructions (cu_plan_runs), whose tensors may share this
 * stage's bytes (passes/stage_params.c's parts), so a planner that reasons
 * about what runs between two instructions reads only this rank's.
 */
typedef struct CuPlan {
	const DpStep *s;
	void *const *ptr;
	int stage;
	CuFuse *fuse[DP_NPROG];
	cublasLtHandle_t blas[DP_NSTREAM]; /* per stream, NULL on one without GEMMs */
	void *(*alloc)(struct CuPlan *p, size_t bytes); /* NULL when out of memory */
	/* host bytes into device memory from alloc, complete on return (the
	 * host buffer may go); a CUDA error, else cudaSuccess */
	cudaError_t (*upload)(struct CuPlan *p, void *dev, const void *host, size_t bytes);
	void *impl;
} CuPlan;

/* Does this rank run `in` (its stage's, or every rank's)? */
static inline int cu_plan_runs(const CuPlan *p, const DpInstr *in)
{
	return !in->stage1 || dp_instr_stage(in) == p->stage;
}

/* The clip folded into the optimizers that read its gradients (optim.cu). */
int cu_plan_clip(CuPlan *p, RtErr *e);
/* Runs of consecutive AdamW updates as one multi-tensor launch each
 * (optim.cu; DP_MULTI_TENSOR=off keeps one launch per update). */
int cu_plan_adamw(CuPlan *p, RtErr *e);
/* What cu_plan_adamw made of this rank's updates, for the device line:
 * "AdamW: N updates in M launches (multi-tensor)", or "" when there is no
 * AdamW update. */
void cu_plan_adamw_line(const CuPlan *p, char *buf, size_t len);
/* Cross entropy's row statistics shared with its gradient (loss.cu). */
int cu_plan_xent(CuPlan *p, RtErr *e);
/* A norm's gamma (and beta) gradient made by its dx's kernel (norm.cu). */
int cu_plan_norm(CuPlan *p, RtErr *e);
/* Attention's row log-sum-exp and output shared with its gradient
 * (attention.cu). */
int cu_plan_attn(CuPlan *p, RtErr *e);
/* An A/B switch of the environment (the kit's experiments: DP_ATTN_DQ,
 * DP_ATTN_BWD, DP_NORM_GB, DP_MULTI_TENSOR), read once into *seen (-2
 * before; each switch its own static): unset, empty or one of dflt's names
 * 0, one of variant's names 1, else -1 (its planner refuses it at load).
 * dflt and variant are names separated by '|' ("off|0"). (kernels.cu) */
int cu_env_choice(int *seen, const char *name, const char *dflt, const char *variant);
/* The tensor-core backward's dQ variant, DP_ATTN_DQ read once (attention.cu,
 * docs/CUDA.md's experiment): 0 the runs (the default), 1 "split" (a dQ pass
 * of its own), -1 a value that is neither (cu_plan_attn refuses it). */
int cu_attn_dq_split(void);
/* The tensor-core backward's barriers, DP_ATTN_BWD read once (attention.cu,
 * docs/CUDA.md's experiment): 0 two per query tile (the default), 1 "pipe"
 * (one: a tile's dQ after the next tile's barrier), -1 neither (refused by
 * cu_plan_attn). */
int cu_attn_bwd_pipe(void);
/* Every GEMM's cuBLASLt descriptors and algorithm (heuristic query with the
 * operands' real addresses), before any capture (gemm.cu). */
int cu_plan_gemm(CuPlan *p, RtErr *e);
/* Destroy what cu_plan_gemm made for one entry (idempotent); before the
 * cuBLASLt handles are destroyed. */
void cu_gemm_free(CuFuse *f);

/* ---- kernels of the backend itself (not ops) ---- */

/* The schedule kernel (lr and the optimizer's constants of step sc->step,
 * from the step file's schedule), the step counter's set and increment, the
 * report of the scalars and metrics into mapped memory, and the watchdog's
 * progress mark (*slot = value once the stream gets there; slot is mapped
 * pinned host memory). Each returns the launch's error. */
cudaError_t cu_k_sched(cudaStream_t st, CuScalars *sc, DpOptim opt, DpSched sched,
		       uint32_t cfg_steps);
cudaError_t cu_k_set_step(cudaStream_t st, CuScalars *sc, uint64_t step);
/* Loss scaling's state from the host (the first step, a resume), and its
 * update at a step's tail (amp.h's rule on the device). */
cudaError_t cu_k_set_amp(cudaStream_t st, CuScalars *sc, AmpState amp);
cudaError_t cu_k_amp_update(cudaStream_t st, CuScalars *sc, DpOptim opt);
cudaError_t cu_k_step_advance(cudaStream_t st, CuScalars *sc);
/* rep[parity of sc->step] (in_step) or rep[2] (otherwise) = the scalars and the
 * metrics (loss, grad_norm: device addresses, NULL when absent). */
cudaError_t cu_k_report(cudaStream_t st, const CuScalars *sc, CuReport *rep, int in_step,
			const float *loss, const float *grad_norm);
/* The watchdog's mark: *slot = seq, or (sc->step << 24) | seq when sc is
 * given (inside an optimizer step: the mark says which step got there). */
cudaError_t cu_k_mark(cudaStream_t st, volatile int64_t *slot, int64_t seq, const CuScalars *sc);
/* Rows of width bytes from src + r*spitch to dst + r*dpitch, r < rows: a
 * kernel (no pitch limit; the regions must not overlap unless identical). */
cudaError_t cu_k_copy2d(cudaStream_t st, void *dst, size_t dpitch, const void *src,
			size_t spitch, size_t width, size_t rows);
/* A staged batch into the arena: dst = (sc->step odd ? src1 : src0)[0..bytes):
 * the graph's load, which picks the device copy of the step being run. */
cudaError_t cu_k_load(cudaStream_t st, void *dst, const void *src0, const void *src1,
		      size_t bytes, const CuScalars *sc);

#ifdef __cplusplus
}
#endif

#endif
