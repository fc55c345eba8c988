/*
 * exec.h - the CPU executor: one arena per rank, the tensor pointers into it,
 * and the walk over a program's instructions with two-stream semantics.
 *
 * Streams on the CPU. Compute-stream instructions run synchronously, in
 * order. Comm-stream collectives are started non-blocking and keep running
 * while later compute instructions execute. Cross-stream order comes only
 * from events, as on a GPU:
 *   EVENT_RECORD on comm    - the event covers every collective issued so far;
 *   EVENT_WAIT on compute   - blocks until those collectives have completed;
 *   EVENT_RECORD on compute - satisfied at once (compute is synchronous);
 *   EVENT_WAIT on comm      - an ordering point, satisfied once recorded.
 * A compute instruction that touches memory of a collective that no event has
 * made visible yet is a schedule bug (a race on a GPU): the run fails and
 * names both instructions. A collective placed on the compute stream runs
 * synchronously; a compute kernel placed on the comm stream first waits for
 * the collectives issued before it (stream order). At the end of a program
 * run everything is waited for.
 */
#ifndef DP_EXEC_H
#define DP_EXEC_H

#include "comm.h"
#include "cpu.h"
#include "rt.h"

typedef struct InFlight InFlight;

/*
 * Hooks for the kernels whose data crosses the executor's boundary. Each gets
 * the caller's ctx, `name` (the tensor whose name and kind identify the
 * parameter or buffer: x->s->tensors[name]), `tensor` (the tensor whose
 * memory dst/src is: its shape, init spec and init_base) and that memory
 * (exec_numel(&tensors[tensor]) f32 elements); 0, or -1 with e filled, which
 * ends the program run. name == tensor except for a tensor-parallel
 * parameter, initialised and saved whole through a temporary (INIT's in0,
 * SAVE's in1 name the parameter).
 *  init_tensor: INIT writes dst with the initial value of parameter/buffer
 *               `name`. NULL: the init spec (init_fill with cfg.seed,
 *               name's name and tensor's spec and init_base).
 *  save_tensor: SAVE hands over src, the whole value of parameter `name`;
 *               src is only valid during the call (copy what you keep).
 *               NULL: SAVE is an error.
 */
typedef int (*ExecInitHook)(void *ctx, int name, int tensor, float *dst, RtErr *e);
typedef int (*ExecSaveHook)(void *ctx, int name, int tensor, const float *src, RtErr *e);

typedef struct {
	const DpStep *s;
	Comm *comm;
	unsigned char *arena; /* one allocation, cfg.arena_bytes, 64-byte aligned, zeroed */
	size_t arena_len;
	void **ptr;           /* ptr[i] = arena + tensors[i].offset; NULL without storage */
	DataSet *train;       /* sources of DP_SPLIT_TRAIN (LOAD in the step program) */
	DataSet *eval;        /* sources of DP_SPLIT_EVAL (LOAD in the eval program) */
	int dp_rank, dp_size; /* data-parallel coordinates: r*S + s of R*S */

	/* where the next run is: set by the caller before exec_run */
	uint64_t step;        /* optimizer step, from 0 */
	int micro;            /* micro-batch in the step */
	int64_t eval_batch;   /* eval batch index (eval program) */
	CpuCtx cpu;           /* lr, t = step + 1, optimizer */
	int no_progress;      /* skip polling between instructions (dpexec --no-progress) */
	ExecInitHook init_tensor; /* INIT (init program); see above */
	ExecSaveHook save_tensor; /* SAVE (export program) */
	void *hook_ctx;           /* passed to both hooks */

	/* per-run stream state */
	int64_t *event_ticket; /* comm ticket recorded by the event, -1: recorded on compute */
	int8_t *event_set;     /* recorded in this run? */
	InFlight *fl;          /* collectives not yet made visible to compute */
	int nfl, capfl;
} Exec;

/* Load-time checks of instruction i of program p that the compute backend
 * does not make itself: LOAD against its source, collective and SHARD sizes
 * against the group of their axis mask (any executor, CPU or CUDA). */
int exec_check_instr(const DpStep *s, const Comm *comm, int p, uint32_t i, RtErr *e);
/* Learning rate of optimizer step k (from 0) under the step file's schedule. */
double exec_lr(const DpStep *s, uint64_t k);
/* Axis masks the step's collectives use (bit m for mask m), for comm init. */
uint32_t exec_comm_masks(const DpStep *s);
/* Check every instruction against the tensor table and the mesh, allocate
 * and zero the arena, point every tensor into it. */
int exec_init(Exec *x, const DpStep *s, Comm *comm, RtErr *e);
/* Run program p (any DpProgram); instructions flagged DP_IF_LAST only when
 * last != 0 (only the step program has them: pass 1 for the others). SHARD
 * copies block comm_group_rank(ia0) of numel(out) elements of in0 into out. */
int exec_run(Exec *x, DpProgram p, int last, RtErr *e);
/* Copy a whole tensor (nbytes of its dtype's elements) out of / into the
 * executor's memory, after the work issued so far. The only way code outside
 * the executor and its backends touches tensor data (checkpoints, metrics,
 * gradcheck), so it works whatever memory the backend computes in. */
int exec_tensor_read(Exec *x, int tensor, void *host, RtErr *e);
int exec_tensor_write(Exec *x, int tensor, const void *host, RtErr *e);
/* Bytes of a tensor's elements (numel * dtype size; not its padded nbytes). */
int64_t exec_tensor_bytes(const DpStep *s, int tensor);
/* Zero every DP_T_METRIC tensor. */
void exec_zero_metrics(Exec *x);
/* f32 view of a tensor, NULL for -1 or a tensor without storage. */
float *exec_f32(const Exec *x, int tensor);
int64_t exec_numel(const DpTensor *t);
void exec_free(Exec *x);

/* --check-grads (runtime/gradcheck.c): finite differences against the
 * step program's gradients on the first micro-batch. 0: every parameter
 * passed; 1: some failed; -1: error in e. */
int gradcheck_run(Exec *x, RtErr *e);

#endif
