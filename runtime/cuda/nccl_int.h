/*
 * nccl_int.h - the CUDA backend's NCCL communicators (comm_nccl.c), as
 * backend_cuda.c uses them: one per (stream, axis mask) the step's
 * collectives use, NCCL error reporting, and abort. Internal to
 * runtime/cuda/.
 */
#ifndef DP_CU_NCCL_INT_H
#define DP_CU_NCCL_INT_H

#include <nccl.h>

#include "../comm.h"

typedef struct CuNccl CuNccl;

/* How long a fatal path waits for the aborts of its communicators
 * (cu_nccl_abort): NCCL's abort takes milliseconds to a second on hardware;
 * dpexec's end of a failed job (its grace sync, 5 s at most) comes after it,
 * so every fatal path ends within --timeout + 10 s. */
#define CU_NCCL_ABORT_BOUND_S 3.0

/* Axis masks the step's collectives use, per stream (bit m: mask m). */
void cu_nccl_masks(const DpStep *s, uint32_t masks[DP_NSTREAM]);
/* Ranks in this rank's group for an axis mask (the product of the masked
 * mesh axes; comm.h's comm_group_size, which lives in the dpexec binary). */
int cu_nccl_group_size(const Comm *comm, unsigned mask);
/* Collective over MPI_COMM_WORLD (MPI initialised, device selected): rank 0
 * makes the NCCL unique id, MPI_Ibcast shares it, ncclCommInitRankConfig
 * builds the world communicator and ncclCommSplit one per (stream, mask) in
 * `masks` whose group has more than one rank (colour: the coordinates
 * outside the mask; key: the world rank, so NCCL ranks follow the mesh's
 * row-major order, the all_gather order). Every communicator is
 * non-blocking; the whole init must complete within deadline_s seconds, else
 * it fails (and aborts what it made). With one rank no NCCL call is made. */
int cu_nccl_init(CuNccl **out, const Comm *comm, const uint32_t masks[DP_NSTREAM],
		 const CommGroup *groups, int ngroups, double deadline_s, RtErr *e);
/* groups: the sub-groups of pp stages (comm_step_groups), each split on the
 * comm stream after the masks' (NCCL_SPLIT_NOCOLOR on a rank outside it). */
#define CU_NCCL_MAX_GROUPS COMM_MAX_GROUPS
/* The comm stream's communicator of a sub-group of pp stages; NULL on a
 * rank outside it. */
ncclComm_t cu_nccl_group_comm(CuNccl *nc, unsigned mask, uint64_t stages);
/* Poll a non-blocking communicator until it is ready (ncclSuccess), has an
 * error (-1 naming `what`), or the CLOCK_MONOTONIC time `deadline` passes
 * (-1). After any NCCL call on it that returned ncclInProgress. */
int cu_nccl_settle(ncclComm_t c, const char *what, double deadline, RtErr *e);
/* CLOCK_MONOTONIC in seconds (the deadlines' clock). */
double cu_nccl_now(void);
/* ncclCommAbort on every communicator at once, each on a thread of its
 * own, and return at once (comm_nccl.c's top says why): every abort flag is
 * raised, so captured collectives end and in-flight graph launches
 * complete; each abort then waits until every graph that captured its
 * communicator is destroyed, so destroy those next. Idempotent. */
void cu_nccl_abort_start(CuNccl *nc);
/* Start the aborts (if cu_nccl_abort_start has not) and wait at most
 * bound_s seconds for them all. 0: every abort returned; 1: some is still
 * inside ncclCommAbort, so kernels of its graphs may still run on the
 * device: free nothing the device may touch, leave it to the process's
 * exit. Idempotent (a second call returns the first's answer). */
int cu_nccl_abort(CuNccl *nc, double bound_s);
/* Finalize and destroy the communicators (after the graphs): each
 * ncclCommFinalize is settled within 60 s, else that communicator is
 * aborted; NULL is fine. After an abort that did not finish (1 above) it
 * frees nothing: the aborting threads still use the state. */
void cu_nccl_free(CuNccl *nc);
/* The communicator for collectives of `mask` issued on `stream`; NULL when
 * the group has one rank (the collective is then local) or nc is NULL. */
ncclComm_t cu_nccl_comm(CuNccl *nc, int stream, unsigned mask);
/* 0, or -1 with e naming the first communicator with an asynchronous error. */
int cu_nccl_async_error(CuNccl *nc, RtErr *e);
/* NCCL's version, for logs. */
int cu_nccl_version(void);
/* 0 for ncclSuccess, else -1 with "what: NCCL's message (last error)". */
int cu_nccl_fail(ncclResult_t r, const char *what, RtErr *e, const char *file, int line);
#define CU_NCCL(call, e)                                                   \
	do {                                                               \
		ncclResult_t r_ = (call);                                  \
		if (r_ != ncclSuccess)                                     \
			return cu_nccl_fail(r_, #call, (e), __FILE__, __LINE__); \
	} while (0)

#endif
