/*
 * exec.h - the executor: checks a step file against the mesh and a compute
 * backend (backend.h), stages the data batches, and walks a program's
 * instructions with the schedule's stream semantics, whatever the backend.
 *
 * Streams. Cross-stream order comes only from events, as on a GPU:
 *   EVENT_RECORD on comm    - the event covers every collective issued so far;
 *   EVENT_WAIT on compute   - compute waits until those collectives have completed;
 *   on the p2p stream (the pipeline's sends and recvs, step format 22) the
 *   same, for its transfers alone: a comm event covers no transfer and a p2p
 *   event no collective, so a send waiting for its peer holds no collective;
 *   EVENT_RECORD on compute - marks the compute done so far;
 *   EVENT_WAIT on comm      - later collectives start after that compute;
 *   on the copy stream (offload's H2Ds, in order among themselves), a record
 *   marks the copies issued so far, and a wait on comm or compute for it
 *   orders what follows after them.
 * A wait for an event that was not recorded earlier in the run is a schedule
 * error (the executor's check). Each backend implements the streams
 * (backend.h): CUDA with its own streams and events; the CPU inline, with
 * comm-stream collectives started non-blocking on the MPI comm backend and
 * progressed between instructions while later compute runs, and the copy
 * stream's copies queued until something waits for them (cpu/streams.c).
 * There a compute instruction that touches memory of a collective no event
 * has made visible yet is a schedule bug (a race on a GPU): the run fails
 * and names both instructions. A collective placed on the compute stream
 * runs in compute order (synchronously on the CPU); a compute kernel placed
 * on the comm stream runs after the collectives issued before it (stream
 * order). At the end of a program run everything is waited for.
 *
 * Data. LOAD copies a batch the executor staged in host memory (from the
 * backend's host_alloc: pinned on a GPU) into the data tensor: for the step
 * program one batch per micro-batch of the optimizer step, staged before
 * the step starts; for the eval program the batch of eval_batch. A staged
 * step is pushed to the backend at once (stage_push: CUDA copies it to the
 * device, the CPU reads it where it is), so on a GPU exec_prefetch(k+1)
 * fills and copies step k+1's batches while step k runs, and step k+1's
 * loads read the device copy.
 *
 * Optimizer steps. exec_step runs grad_accum runs of the step program (the
 * DP_IF_LAST parts on the last) after zeroing the metrics; on a backend with
 * graphs the first step runs eagerly (it warms up NCCL's connections,
 * cuBLAS and lazily loaded kernels outside any capture), the second is
 * captured once, and every step from then on is one replay. At most two
 * steps are in flight: launching step k waits for step k-2, and the
 * metrics of step k are read (exec_step_metrics, the backend's step_wait)
 * from where the step itself left them, while the steps after it run (on
 * the CPU, whose steps run inside their launch, nothing runs meanwhile).
 */
#ifndef DP_EXEC_H
#define DP_EXEC_H

#include "backend.h"
#include "comm.h"
#include "rt.h"

/*
 * Hooks for the kernels whose data crosses the executor's boundary. Each gets
 * the caller's ctx, `name` (the tensor whose name and kind identify the
 * parameter or buffer: x->s->tensors[name]), `tensor` (the tensor whose
 * memory dst/src is: its shape, init spec and init_base) and a host copy
 * of that memory (exec_numel(&tensors[tensor]) f32 elements, valid during
 * the call; the executor moves it to or from the backend); 0, or -1 with e
 * filled, which
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

/* fp16's loss scaling (passes/lossscale.c), GradScaler's state (amp.h). */
typedef AmpState ExecAmp;

/* What one step did: the scale it ran with, whether it was skipped, and
 * the skipped steps after it. */
typedef struct {
	float scale;
	int skip;
	uint64_t skipped;
} ExecAmpStep;

typedef struct Stage Stage;
typedef struct Trace Trace; /* runtime/trace.c */

typedef struct {
	const DpStep *s;
	Comm *comm;
	Backend be;           /* the compute backend; be.ptr: tensor addresses in its memory */
	int have_be;          /* be.ops->init succeeded: free it */
	DataSet *train;       /* sources of DP_SPLIT_TRAIN (LOAD in the step program) */
	DataSet *eval;        /* sources of DP_SPLIT_EVAL (LOAD in the eval program) */
	int dp_rank, dp_size; /* data-parallel coordinates: r*S + s of R*S */
	int pp_stage;         /* pipeline stage (pp coordinate): the instructions of another
	                         stage are skipped (DpInstr.stage1) */

	/* where the next run is: set by the caller before exec_run (exec_step
	 * sets step and micro itself) */
	uint64_t step;        /* optimizer step, from 0 */
	int micro;            /* micro-batch in the step */
	int64_t eval_batch;   /* eval batch index (eval program) */
	Trace *trace;         /* dpexec --trace: marks every instruction run; NULL: none */
	ExecInitHook init_tensor; /* INIT (init program); see above */
	ExecSaveHook save_tensor; /* SAVE (export program) */
	void *hook_ctx;           /* passed to both hooks */

	/* staged batches: stage[i] for source i (NULL: no LOAD reads it) */
	Stage **stage;
	int64_t staged_step;  /* the step whose batches stage holds, -1: none */
	float *bounce;        /* host copy of one tensor for INIT and SAVE */
	size_t bounce_bytes;

	/* optimizer steps */
	int no_graph;         /* BackendOpts.no_graph: enqueue each step instead of replaying */
	int warm;             /* a step ran eagerly: the next one is captured */
	int captured;         /* the step graph exists */
	int captured_path;    /* ... of the compressed path (1) or the plain one (0) */
	uint64_t inflight[2]; /* launched steps not waited for, oldest first (streams) */
	int ninflight;
	int64_t mstep[2];     /* the step whose metrics mval[k & 1] holds, -1: none */
	float mval[2][2];     /* its loss and grad norm */

	int8_t *event_set;    /* per run: event recorded in this run? */

	/* loss scaling (cfg's loss_scale not none): the backend keeps the state
	 * (amp.h); this is its mirror from the reports of the steps waited for */
	ExecAmp amp;          /* the state after the last step waited for: what a
	                         checkpoint saves, or what --resume restored */
	int amp_push;         /* 1: give amp to the backend with the next step (start,
	                         resume: exec_set_amp) */
	ExecAmpStep mamp[2];  /* step k's in mamp[k & 1], beside its metrics */
} Exec;

/* Load-time checks of instruction i of program p that no backend makes:
 * LOAD against its source, collective and SHARD sizes against the group of
 * their axis mask. */
int exec_check_instr(const DpStep *s, const Comm *comm, int p, uint32_t i, RtErr *e);
/* Load-time check of a compute instruction against a backend: its kernel
 * table has the op (else an error naming the op and the backend), then the
 * backend's own limits. Needs no device (tests call it). */
int exec_check_kernel(const DpStep *s, const BackendOps *ops, const DpInstr *in, RtErr *e);
/* Learning rate of optimizer step k (from 0) under the step file's schedule. */
double exec_lr(const DpStep *s, uint64_t k);
/* Axis masks the step's collectives use (bit m for mask m), for comm init. */
uint32_t exec_comm_masks(const DpStep *s);

/* Check every instruction against the tensor table, the mesh and the
 * backend `ops`, then initialise the backend (its arena, zeroed, with every
 * tensor pointed into it). */
int exec_init(Exec *x, const DpStep *s, Comm *comm, const BackendOps *ops,
	      const BackendOpts *o, RtErr *e);
/* Run program p (any DpProgram) and wait for it; instructions flagged
 * DP_IF_LAST only when last != 0 (only the step program has them: pass 1
 * for the others). The step program runs micro-batch x->micro of step
 * x->step (whose batches are staged first if they are not). SHARD copies
 * block comm_group_rank(axes) of numel(out) elements of in0 into out. */
int exec_run(Exec *x, DpProgram p, int last, RtErr *e);
/* Run kernel instruction i of program p alone and wait for it (a checkpoint
 * load derives the bf16 copies of the masters it wrote again this way). */
int exec_run_kernel(Exec *x, DpProgram p, uint32_t i, RtErr *e);
/* The device times of instructions idx[0..n) of program p (kernels and
 * collectives), issued in one run in that order with nothing between them
 * (no events, loads or waits: each reads whatever its inputs hold), after
 * `replays` replays of the captured step graph (0: none; else the step must
 * be captured) that put the device ahead of the host, so that a short
 * instruction is not timed with the host's launch of it; a timing mark
 * before and after each on its stream (the backend's time_mark /
 * time_read: a backend without them is refused), then waited for. ms[j]:
 * instruction idx[j]'s device time in ms; gap_ms[j] (NULL: not wanted): the
 * device's time from the previous one's end mark to its start mark (a gap:
 * the device waited for the host). dpexec --calibrate on a device
 * (runtime/calibrate.c). Every rank issues the same collectives, and the
 * same replays (the graph holds the step's). An idx entry EXEC_TIME_EMPTY
 * is an empty span: its two marks with no instruction between them, on the
 * previous entry's stream (the compute stream's first): what the marks
 * themselves cost a span, which the calibration subtracts. */
#define EXEC_TIME_EMPTY UINT32_MAX
int exec_time_instrs(Exec *x, DpProgram p, const uint32_t *idx, uint32_t n, uint32_t replays,
		     float *ms, float *gap_ms, RtErr *e);
/* Optimizer step k (from 0): stage its batches, zero the metrics, run the
 * step program once per micro-batch (DP_IF_LAST parts on the last; once at
 * pp > 1, where it holds every micro-batch: dp_step_unrolled) with
 * lr = exec_lr(k) and t = k + 1. exec_step_launch returns without waiting
 * for the step (on a GPU it replays the captured step, or enqueues it with
 * --no-graph), after waiting for step k-2 if that still runs;
 * exec_prefetch(k + 1) then stages the next batches while it runs;
 * exec_step_metrics(k) waits for step k alone and gives its loss metric
 * (this rank's sum) and grad norm (NAN when the step file has none);
 * exec_step_wait waits for everything. exec_step is launch + wait. */
int exec_step_launch(Exec *x, uint64_t k, RtErr *e);
int exec_prefetch(Exec *x, uint64_t k, RtErr *e);
int exec_step_metrics(Exec *x, uint64_t k, double *loss, double *grad_norm, RtErr *e);
/* The loss scaling of step k (its metrics read; {1, 0, 0} without loss
 * scaling). */
ExecAmpStep exec_step_amp(const Exec *x, uint64_t k);
/* The loss-scaling state the next step starts from (--resume's). */
void exec_set_amp(Exec *x, ExecAmp a);
/* 1: the backend runs a step inside exec_step_launch (BACKEND_INLINE) */
int exec_synchronous(const Exec *x);
int exec_step_wait(Exec *x, RtErr *e);
int exec_step(Exec *x, uint64_t k, RtErr *e);
/* Copy a whole tensor (nbytes of its dtype's elements) out of / into the
 * executor's memory, after the work issued so far. The only way code outside
 * the executor and its backends touches tensor data (checkpoints, metrics,
 * gradcheck), so it works whatever memory the backend computes in. */
int exec_tensor_read(Exec *x, int tensor, void *host, RtErr *e);
int exec_tensor_write(Exec *x, int tensor, const void *host, RtErr *e);
/* Bytes of a tensor's elements (numel * dtype size; not its padded nbytes). */
int64_t exec_tensor_bytes(const DpStep *s, int tensor);
/* Zero every DP_T_METRIC tensor. */
int exec_zero_metrics(Exec *x, RtErr *e);
int64_t exec_numel(const DpTensor *t);
/* One line about the compute device (logs); 1 when every run's log should
 * show it, 0 when only --verbose asks (the backend says). */
int exec_describe(Exec *x, char *buf, size_t len);
/* A failing rank, before MPI_Abort: the backend stops its collectives. */
void exec_abort(Exec *x);
void exec_free(Exec *x);

/* ---- dpexec --calibrate (runtime/calibrate.c) ---- */

/* Measure this machine into the machine file at path (rank 0 writes it);
 * every rank calls it after set-up. */
int calibrate_run(Exec *x, const char *path, const char *step_path, int rank, int world, RtErr *e);

/* ---- dpexec --trace (runtime/trace.c): a Chrome/Perfetto trace ---- */

#define TRACE_END UINT32_MAX
/* Every rank, after exec_init (a barrier sets the common time origin).
 * device: also the device's times, from the backend's timing marks (a
 * backend that is not BACKEND_INLINE; runs must then be eager). */
int trace_open(Trace **t, const char *path, int rank, int device, RtErr *e);
/* The walk is at instruction `instr` of program `prog`, or (TRACE_END) past
 * the run's final wait: closes the span of the previous mark (device: at
 * TRACE_END, waits for the run and reads its device times). */
int trace_mark(Trace *t, const Exec *x, int prog, uint32_t instr, RtErr *e);
/* The walk has issued instruction `instr` (device: its mark after it). */
int trace_after(Trace *t, const Exec *x, int prog, uint32_t instr, RtErr *e);
/* Every rank: rank 0 gathers the events and writes the file. */
int trace_close(Trace *t, const Exec *x, RtErr *e);
void trace_free(Trace *t);

/* --check-grads (runtime/gradcheck.c): finite differences against the
 * step program's gradients on the first micro-batch. 0: every parameter
 * passed; 1: some failed; -1: error in e. */
int gradcheck_run(Exec *x, RtErr *e);

#endif
