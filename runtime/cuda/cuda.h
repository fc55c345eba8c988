/*
 * cuda.h - the CUDA backend of dpexec: device discovery, NCCL communicators
 * and the CUDA executor. Plain C; no CUDA header is needed to include it, so
 * dpexec.c can use it (and link libdpcuda.a) only when the build has CUDA.
 *
 * The executor mirrors runtime/exec.h on a GPU:
 *  - one cudaMalloc'd arena per rank, every tensor a pointer at its offset;
 *  - two streams (compute, comm); EVENT_RECORD/EVENT_WAIT become
 *    cudaEventRecord/cudaStreamWaitEvent on the instruction's stream, so the
 *    cross-stream order is exactly the schedule's, as on the CPU. Each program
 *    run forks the comm stream from the compute stream at its start and joins
 *    it back at its end ("at the end of a run everything is waited for");
 *  - kernels: cuBLAS sgemm for MATMUL/LINEAR (row-major by the transpose
 *    trick, one workspace per handle set once), own kernels for the rest
 *    (kernels.cu), fp32 only: bf16 is NOT implemented yet;
 *  - collectives: NCCL on the instruction's stream, one communicator per
 *    (stream, axis mask) that the step uses (two streams never share one:
 *    NCCL serialises the operations of a communicator);
 *  - one optimizer step (the schedule kernel, zeroed metrics, all grad_accum
 *    micro-batch runs of STEP with the DP_IF_LAST parts on the last, the
 *    step-counter increment) is captured at start-up into one CUDA Graph,
 *    instantiated once and replayed with one cudaGraphLaunch per step.
 *    lr and the step counter live in device memory (CuScalars in kernels.h):
 *    the graph bakes in no host value that changes between steps. no_graph
 *    enqueues the same sequence eagerly (the same code path), for debugging;
 *  - LOAD copies from a fixed device staging buffer (one slot per micro-batch)
 *    that step_launch fills from pinned host memory before the launch; the
 *    host fills the pinned buffers (double-buffered) while the previous step
 *    runs: launch(k); prefetch(k + 1); wait();
 *  - INIT/SAVE run on the host through the same hooks as the CPU executor
 *    (exec.h's ExecInitHook/ExecSaveHook), through a pinned bounce buffer;
 *    SHARD is a device-to-device copy of this rank's block. The INIT and
 *    EXPORT programs, and EVAL, always run eagerly.
 *
 * Faults: every wait polls (never a blocking sync) and checks NCCL's async
 * errors; with timeout_s > 0 a wait that exceeds it aborts every NCCL
 * communicator (ncclCommAbort) and fails with the step and the pending
 * collective, known from progress marks each stream writes to mapped host
 * memory after every collective. Teardown destroys the graph before the
 * communicators: cuda_exec_free first, then cuda_nccl_free.
 *
 * Every function returns 0, or -1 with an RtErr (never exits, never prints).
 * Nothing here has run on a GPU yet: see docs/CUDA.md.
 */
#ifndef DP_CUDA_H
#define DP_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../comm.h"
#include "../exec.h" /* ExecInitHook, ExecSaveHook */
#include "../rt.h"

typedef struct CuNccl CuNccl;
typedef struct CuExec CuExec;

/* ---- devices (exec_cuda.c) ---- */

/* Visible CUDA devices; 0 when there is no GPU, no driver, or any error. */
int cuda_device_count(void);
/* One line: device name, compute capability, memory, driver and runtime
 * versions, NCCL version (for logs and the closing figures). */
void cuda_describe(int device, char *buf, size_t len);
/* cudaSetDevice(local_rank % count); *device gets the ordinal. */
int cuda_select_device(int local_rank, int *device, RtErr *e);

/* ---- NCCL (comm_nccl.c) ---- */

/* Axis masks the step's collectives use, per stream (bit m: mask m). */
void cuda_comm_masks(const DpStep *s, uint32_t masks[DP_NSTREAM]);
/* Collective over MPI_COMM_WORLD (MPI initialised, device selected): rank 0
 * makes the NCCL unique id, MPI_Bcast shares it, ncclCommInitRank builds the
 * world communicator and ncclCommSplit one per (stream, mask) in `masks`
 * whose group has more than one rank (colour: the coordinates outside the
 * mask; key: the world rank, so NCCL ranks follow the mesh's row-major order,
 * the all_gather order). With one rank no NCCL call is made. */
int cuda_nccl_init(CuNccl **out, const Comm *comm, const uint32_t masks[DP_NSTREAM],
		   RtErr *e);
/* ncclCommAbort on every communicator; idempotent; for the watchdog and for
 * a failing rank before MPI_Abort. */
void cuda_nccl_abort(CuNccl *nc);
/* Destroy the communicators; call after cuda_exec_free of every executor
 * using them (graphs that captured NCCL calls go first). NULL is fine. */
void cuda_nccl_free(CuNccl *nc);

/* ---- the executor (exec_cuda.c) ---- */

typedef struct {
	int no_graph;     /* 1: enqueue each step eagerly instead of replaying a graph */
	double timeout_s; /* > 0: a wait longer than this aborts NCCL and fails */
} CuOpts;

/* Check every instruction (cpu_check's operand rules plus the executor's
 * own), allocate the arena, streams, events, cuBLAS handles, staging
 * buffers, and (unless no_graph) capture and instantiate the step graph.
 * comm gives the mesh coordinates; nccl may be NULL for a one-rank run. */
int cuda_exec_init(CuExec **out, const DpStep *s, const Comm *comm, CuNccl *nccl,
		   const CuOpts *o, RtErr *e);
/* Data for LOAD (train: step program, eval: eval program); NULL if absent. */
void cuda_exec_set_data(CuExec *x, DataSet *train, DataSet *eval);
/* Hooks for INIT/SAVE, as in exec.h; dst/src are host memory valid during
 * the call. init NULL: the tensor's init spec. save NULL: SAVE fails. */
void cuda_exec_set_hooks(CuExec *x, ExecInitHook init, ExecSaveHook save, void *ctx);

/* Fill the pinned host batch buffers for optimizer step `step` (host work
 * only; overlaps a running step). Called by step_launch if not done. */
int cuda_exec_prefetch(CuExec *x, uint64_t step, RtErr *e);
/* Start optimizer step `step` (from 0): copy its batches to the device and
 * launch the graph (or enqueue eagerly); returns without waiting. */
int cuda_exec_step_launch(CuExec *x, uint64_t step, RtErr *e);
/* Wait for the launched step (watchdog, NCCL async errors, label errors). */
int cuda_exec_step_wait(CuExec *x, RtErr *e);
/* launch + wait. */
int cuda_exec_step(CuExec *x, uint64_t step, RtErr *e);
/* Eval batch `batch`: load it, run the eval program eagerly, wait. The eval
 * metric tensors are not zeroed here (cuda_exec_zero_metrics). */
int cuda_exec_eval(CuExec *x, int64_t batch, RtErr *e);
/* Run DP_PROG_INIT or DP_PROG_EXPORT eagerly and wait. */
int cuda_exec_run(CuExec *x, DpProgram p, RtErr *e);

/* Whole tensor, device <-> host (synchronous, after pending work). */
int cuda_exec_read(CuExec *x, int tensor, void *host, RtErr *e);
int cuda_exec_write(CuExec *x, int tensor, const void *host, RtErr *e);
/* Zero every DP_T_METRIC tensor (the step graph does this itself). */
int cuda_exec_zero_metrics(CuExec *x, RtErr *e);
/* lr and t the last step used (read from device memory). */
int cuda_exec_scalars(CuExec *x, float *lr, int64_t *t, RtErr *e);
/* Waits for pending work (unless aborted), then destroys the graph, events,
 * cuBLAS handles, streams and memory. NULL is fine. */
void cuda_exec_free(CuExec *x);

#endif
