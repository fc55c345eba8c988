/*
 * nccl_int.h - what the CUDA executor needs from comm_nccl.c beyond cuda.h:
 * the communicator of a (stream, axis mask) and NCCL error reporting.
 * Internal to runtime/cuda/.
 */
#ifndef DP_CU_NCCL_INT_H
#define DP_CU_NCCL_INT_H

#include <nccl.h>

#include "cuda.h"

/* The communicator for collectives of `mask` issued on `stream`; NULL when
 * the group has one rank (the collective is then local) or nc is NULL. */
ncclComm_t cu_nccl_comm(CuNccl *nc, int stream, unsigned mask);
/* 0, or -1 with e naming the first communicator with an asynchronous error. */
int cu_nccl_async_error(CuNccl *nc, RtErr *e);
/* Has cuda_nccl_abort run? */
int cu_nccl_aborted(const CuNccl *nc);
/* 0 for ncclSuccess, else -1 with "what: NCCL's message (last error)". */
int cu_nccl_fail(ncclResult_t r, const char *what, RtErr *e, const char *file, int line);
#define CU_NCCL(call, e)                                                   \
	do {                                                               \
		ncclResult_t r_ = (call);                                  \
		if (r_ != ncclSuccess)                                     \
			return cu_nccl_fail(r_, #call, (e), __FILE__, __LINE__); \
	} while (0)

#endif
