/*
 * comm_nccl.c - NCCL communicators for the CUDA backend (nccl_int.h).
 *
 * Bootstrap: rank 0 calls ncclGetUniqueId, MPI_Bcast over MPI_COMM_WORLD
 * hands the id to every rank, ncclCommInitRank makes the world communicator.
 * Then ncclCommSplit makes one communicator per (stream, axis mask) the step
 * uses, in the same order on every rank (a split is collective over the
 * parent): colour = this rank's coordinates with the masked axes zeroed
 * (flattened), key = world rank, so NCCL group ranks are the row-major order
 * of the masked coordinates, the same order comm_mpi.c's MPI_Comm_split and
 * comm_group_rank use. A mask whose group is one rank gets no communicator:
 * the backend runs such a collective locally.
 *
 * Collectives of one communicator are serialised by NCCL, and two streams
 * issuing on one communicator could deadlock across ranks, so the compute
 * and the comm stream never share one.
 *
 * Several ranks on one GPU: NCCL 2.28 refuses two ranks of one communicator
 * on the same device unless they look like different hosts; run one process
 * per rank with a distinct NCCL_HOSTID each (docs/CUDA.md). Untested.
 */
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <nccl.h>

#include "nccl_int.h"

#define NMASK (1u << DP_MAX_AXES)

struct CuNccl {
	int rank, world;
	ncclComm_t world_comm;               /* NULL with one rank */
	ncclComm_t comm[DP_NSTREAM][NMASK];  /* NULL: group of one or unused */
	int aborted;
};

int cu_nccl_fail(ncclResult_t r, const char *what, RtErr *e, const char *file, int line)
{
	const char *last = ncclGetLastError(NULL);
	return rt_fail(e, file, line, "%s: %s%s%s", what, ncclGetErrorString(r),
		       last && *last ? ": " : "", last ? last : "");
}

void cu_nccl_masks(const DpStep *s, uint32_t masks[DP_NSTREAM])
{
	for (int st = 0; st < DP_NSTREAM; st++)
		masks[st] = 0;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (dp_is_collective(in->op))
				masks[in->stream < DP_NSTREAM ? in->stream : 0] |=
					1u << (in->ia[0] & (NMASK - 1));
		}
}

int cu_nccl_group_size(const Comm *c, unsigned mask)
{
	int n = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (mask & DP_AXIS_BIT(a))
			n *= (int)c->mesh[a];
	return n;
}

int cu_nccl_version(void)
{
	int v = 0;
	if (ncclGetVersion(&v) != ncclSuccess)
		v = 0;
	return v;
}

/* Colour of this rank's group for `mask`: its coordinates outside the mask. */
static int colour_of(const Comm *c, unsigned mask)
{
	int col = 0;
	for (int a = 0; a < DP_MAX_AXES; a++)
		col = col * (int)c->mesh[a] + ((mask & DP_AXIS_BIT(a)) ? 0 : c->coord[a]);
	return col;
}

static int init_body(CuNccl *nc, const Comm *comm, const uint32_t masks[DP_NSTREAM], RtErr *e)
{
	if (comm->world == 1)
		return 0;

	ncclUniqueId id;
	if (comm->rank == 0)
		CU_NCCL(ncclGetUniqueId(&id), e);
	int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
	if (rc != MPI_SUCCESS)
		return RT_FAIL(e, "MPI_Bcast of the NCCL unique id failed (MPI error %d)", rc);
	CU_NCCL(ncclCommInitRank(&nc->world_comm, comm->world, id, comm->rank), e);
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 1; m < NMASK; m++) {
			if (!(masks[st] & (1u << m)) || cu_nccl_group_size(comm, m) < 2)
				continue;
			CU_NCCL(ncclCommSplit(nc->world_comm, colour_of(comm, m), comm->rank,
					      &nc->comm[st][m], NULL), e);
		}
	return 0;
}

int cu_nccl_init(CuNccl **out, const Comm *comm, const uint32_t masks[DP_NSTREAM], RtErr *e)
{
	*out = NULL;
	CuNccl *nc = calloc(1, sizeof *nc);
	if (!nc)
		return RT_FAIL(e, "out of memory (NCCL state)");
	nc->rank = comm->rank;
	nc->world = comm->world;
	if (init_body(nc, comm, masks, e)) {
		cu_nccl_abort(nc); /* the other ranks may be stuck in an init: do not wait */
		cu_nccl_free(nc);
		return -1;
	}
	*out = nc;
	return 0;
}

ncclComm_t cu_nccl_comm(CuNccl *nc, int stream, unsigned mask)
{
	if (!nc || stream < 0 || stream >= DP_NSTREAM || mask >= NMASK)
		return NULL;
	return nc->comm[stream][mask];
}

int cu_nccl_async_error(CuNccl *nc, RtErr *e)
{
	if (!nc || nc->aborted)
		return 0;
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 0; m < NMASK; m++) {
			ncclResult_t async = ncclSuccess;
			if (!nc->comm[st][m])
				continue;
			CU_NCCL(ncclCommGetAsyncError(nc->comm[st][m], &async), e);
			if (async != ncclSuccess && async != ncclInProgress)
				return RT_FAIL(e, "NCCL asynchronous error on the communicator of axis "
					       "mask %u (%s stream): %s", m,
					       st == DP_STREAM_COMM ? "comm" : "compute",
					       ncclGetErrorString(async));
		}
	return 0;
}

void cu_nccl_abort(CuNccl *nc)
{
	if (!nc || nc->aborted)
		return;
	nc->aborted = 1;
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 0; m < NMASK; m++)
			if (nc->comm[st][m]) {
				ncclCommAbort(nc->comm[st][m]);
				nc->comm[st][m] = NULL;
			}
	if (nc->world_comm) {
		ncclCommAbort(nc->world_comm);
		nc->world_comm = NULL;
	}
}

void cu_nccl_free(CuNccl *nc)
{
	if (!nc)
		return;
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 0; m < NMASK; m++)
			if (nc->comm[st][m])
				ncclCommDestroy(nc->comm[st][m]);
	if (nc->world_comm)
		ncclCommDestroy(nc->world_comm);
	free(nc);
}
