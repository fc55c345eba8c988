/*
 * comm_nccl.c - NCCL communicators for the CUDA backend (nccl_int.h).
 *
 * Bootstrap: rank 0 calls ncclGetUniqueId, MPI_Ibcast over MPI_COMM_WORLD
 * hands the id to every rank, ncclCommInitRankConfig makes the world
 * communicator. Then ncclCommSplit makes one communicator per (stream, axis
 * mask) the step uses, in the same order on every rank (a split is
 * collective over the parent): colour = this rank's coordinates with the
 * masked axes zeroed (flattened), key = world rank, so NCCL group ranks are
 * the row-major order of the masked coordinates, the same order comm_mpi.c's
 * MPI_Comm_split and comm_group_rank use. A mask whose group is one rank gets
 * no communicator: the backend runs such a collective locally. After them,
 * on the comm stream, one per sub-group of pp stages an all_reduce names
 * (ALL_REDUCE's `stages`: a tied parameter's gradient over the stages that
 * keep it; comm.h's comm_step_groups, the list comm_mpi.c splits too): a
 * rank of those stages splits with its colour, the others with
 * NCCL_SPLIT_NOCOLOR (the split is collective over the world communicator)
 * and get none.
 *
 * Deadlines. Every communicator is non-blocking (ncclConfig_t.blocking = 0):
 * init and split return at once (ncclInProgress) and cu_nccl_settle polls
 * ncclCommGetAsyncError until ncclSuccess, an error, or the deadline, so a
 * rank that never arrives ends the init with an error naming the step
 * instead of a hang (the caller then aborts every communicator). Any later
 * NCCL call may also return ncclInProgress; the caller settles the
 * communicator before it issues anything else on it (NCCL's rule for
 * non-blocking communicators). Teardown is ncclCommFinalize, settled under
 * a deadline, then ncclCommDestroy; a communicator that does not finalize in
 * time is aborted.
 *
 * Abort. NCCL 2.28's ncclCommAbort raises the communicator's abort flag
 * (its kernels, queued or inside graphs, then end without results) and
 * then waits until every CUDA graph that captured the communicator has been
 * freed (commDestroySync polls localPersistentRefs); it blocks even on a
 * non-blocking communicator ("all NCCL calls (except ncclCommDestroy/Abort)
 * become nonblocking", NCCL's fault-tolerance guide). A launched graph is
 * freed only when it completes; and on the H200 (driver 580)
 * cudaGraphExecDestroy of a launch whose NCCL kernel waited on a stopped
 * peer did not return at all (the runtime API says an in-flight exec "will
 * be freed asynchronously on completion"; the rank's main thread sat in
 * cuGraphExecDestroy 21 s later: docs/CUDA.md). So the graph can be
 * destroyed only after the flags are up, and the aborts return only after
 * the graph is destroyed. And with two communicators captured in one step
 * graph (hybrid_shard, tp x dp) and a collective stuck on the second,
 * aborting the first waits for a launch that waits on the second, whose
 * flag nobody raises: aborting them one after the other hangs.
 * cu_nccl_abort_start therefore calls ncclCommAbort on every communicator
 * at once, one thread each (each raises its flag at once; independent
 * communicators may be driven from different threads, as PyTorch's
 * process groups abort theirs), and returns; the caller destroys its
 * graphs beside them (backend_cuda.c's abort_all, itself bounded), every
 * captured collective ends, the launches complete and every abort returns;
 * cu_nccl_abort waits for them at most a bound. An abort still running
 * after it (a kernel that never looks at a flag, a driver hang) is left to
 * the process's exit, which the fatal path reaches next (MPI_Abort): every
 * fatal path ends within --timeout plus the bound plus dpexec's grace.
 *
 * Collectives of one communicator are serialised by NCCL, and two streams
 * issuing on one communicator could deadlock across ranks, so the compute
 * and the comm stream never share one. The pipeline's sends and receives
 * (the p2p stream, step format 22) get communicators of their own over the
 * pp axis (comm[DP_STREAM_P2P][pp mask]), not the comm stream's: a send
 * waiting for its peer then holds neither that communicator nor that
 * stream, and the tp and data-parallel collectives' kernels run beside it.
 * Each communicator's calls come in one order on every rank (the step
 * file's, filtered to the rank's stage: its transfers in the pipeline's
 * order, its collectives in the schedule's). NCCL does not promise that
 * kernels of two communicators running at once make progress when they are
 * not all resident on the GPU at the same time (docs/CUDA.md, "Two NCCL
 * streams"); dp's collectives on the two streams are of different
 * communicators over different ranks' groups, one NCCL kernel each at a
 * time per stream, well below an H100's SMs.
 *
 * Several ranks on one GPU: NCCL 2.28 refuses two ranks of one communicator
 * on the same device unless they look like different hosts; run one process
 * per rank with a distinct NCCL_HOSTID each (docs/CUDA.md): shown at 2
 * ranks on one H200 with NCCL 2.28.3 (sockets over lo).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>
#include <nccl.h>

#include "mutant.h"
#include "nccl_int.h"

#define FINALIZE_DEADLINE_S 60.0 /* teardown: finalize or abort */

#define NMASK (1u << DP_MAX_AXES)
/* comm[st][NMASK + i]: the sub-group of pp stages groups[i] (comm stream) */
#define NSLOT (NMASK + CU_NCCL_MAX_GROUPS)

struct CuNccl {
	int rank, world;
	ncclComm_t world_comm;               /* NULL with one rank */
	ncclComm_t comm[DP_NSTREAM][NSLOT];  /* NULL: group of one, unused, or (a sub-group
						of pp stages) a rank outside it */
	CommGroup groups[CU_NCCL_MAX_GROUPS]; /* the sub-groups of pp stages */
	int ngroups;
	int aborted;                         /* the aborts are started */
	int abort_n, abort_started;          /* communicators aborted; threads started */
	int abort_waited;                    /* cu_nccl_abort has waited (its answer stands) */
	int abort_stuck;                     /* an abort thread is still running */
	ncclComm_t aborting[DP_NSTREAM * NSLOT + 1]; /* what the threads abort */
	atomic_int aborts_done;
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
			/* (a sub-group of pp stages has its own: cu_nccl_init's groups) */
			if (dp_is_collective(in->op) &&
			    !(in->op == DP_OP_ALL_REDUCE && DP_ATTR(in, ALL_REDUCE, stages)))
				masks[in->stream < DP_NSTREAM ? in->stream : 0] |=
					1u << (DP_AXES(in) & (NMASK - 1));
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

double cu_nccl_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(void)
{
	struct timespec ts = {0, 200000}; /* 0.2 ms */
	nanosleep(&ts, NULL);
}

int cu_nccl_settle(ncclComm_t c, const char *what, double deadline, RtErr *e)
{
	if (!c)
		return RT_FAIL(e, "%s: NCCL gave no communicator to wait for", what);
	for (;;) {
		ncclResult_t st = ncclInProgress;
		ncclResult_t r = ncclCommGetAsyncError(c, &st);
		if (r != ncclSuccess)
			return cu_nccl_fail(r, "ncclCommGetAsyncError", e, __FILE__, __LINE__);
		if (st == ncclSuccess)
			return 0;
		if (st != ncclInProgress)
			return cu_nccl_fail(st, what, e, __FILE__, __LINE__);
		if (cu_nccl_now() > deadline)
			return RT_FAIL(e, "%s did not complete within its deadline (a rank that never "
				       "arrived?)", what);
		nap();
	}
}

/* A call on a non-blocking communicator: ncclInProgress is settled. */
#define NB(call, comm, e)                                                                \
	do {                                                                             \
		ncclResult_t r_ = (call);                                                \
		if (r_ == ncclInProgress)                                                \
			RT_CHECK(cu_nccl_settle((comm), #call, deadline, (e)));          \
		else if (r_ != ncclSuccess)                                              \
			return cu_nccl_fail(r_, #call, (e), __FILE__, __LINE__);         \
	} while (0)

/* The unique id from rank 0, polled so that a rank that never arrives ends
 * the wait at the deadline. */
static int share_id(ncclUniqueId *id, double deadline, RtErr *e)
{
	MPI_Request rq;
	int rc = MPI_Ibcast(id, (int)sizeof *id, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
	if (rc != MPI_SUCCESS)
		return RT_FAIL(e, "MPI_Ibcast of the NCCL unique id failed (MPI error %d)", rc);
	for (;;) {
		int done = 0;
		rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
		if (rc != MPI_SUCCESS)
			return RT_FAIL(e, "MPI_Test of the NCCL unique id failed (MPI error %d)", rc);
		if (done)
			return 0;
		if (cu_nccl_now() > deadline)
			return RT_FAIL(e, "the NCCL unique id did not arrive from rank 0 within the "
				       "deadline");
		nap();
	}
}

/* One non-blocking split of parent. NCCL (2.23 on) fills *child only when
 * the parent's split completes, that is when the parent stops reporting
 * ncclInProgress (NVIDIA/nccl #1472; PyTorch's ProcessGroupNCCL settles the
 * parent for this reason), whatever the call returned: settle the parent
 * first, then wait under the deadline for the pointer (filled by NCCL's
 * thread: read atomically), then settle the child. (The first GPU run, an
 * H200 with NCCL 2.28.3, met a NULL communicator in a settle of the init or
 * split at 2 ranks.) */
static int split(ncclComm_t parent, int colour, int key, ncclComm_t *child, double deadline,
		 RtErr *e)
{
	ncclConfig_t sc = NCCL_CONFIG_INITIALIZER;
	sc.blocking = 0;
	*child = NULL;
	ncclResult_t r = ncclCommSplit(parent, colour, key, child, &sc);
	if (r != ncclSuccess && r != ncclInProgress)
		return cu_nccl_fail(r, "ncclCommSplit", e, __FILE__, __LINE__);
	RT_CHECK(cu_nccl_settle(parent, "ncclCommSplit (the parent communicator)", deadline, e));
	while (!__atomic_load_n(child, __ATOMIC_ACQUIRE)) {
		if (cu_nccl_now() > deadline)
			return RT_FAIL(e, "ncclCommSplit completed on the parent communicator but gave "
				       "no communicator within the deadline (colour %d)", colour);
		nap();
	}
	return cu_nccl_settle(*child, "ncclCommSplit", deadline, e);
}

/* A split of parent that this rank does not join (NCCL_SPLIT_NOCOLOR: it
 * gets no communicator): the parent settled, nothing to wait for. */
static int split_out(ncclComm_t parent, int key, double deadline, RtErr *e)
{
	ncclConfig_t sc = NCCL_CONFIG_INITIALIZER;
	sc.blocking = 0;
	ncclComm_t none = NULL;
	ncclResult_t r = ncclCommSplit(parent, NCCL_SPLIT_NOCOLOR, key, &none, &sc);
	if (r != ncclSuccess && r != ncclInProgress)
		return cu_nccl_fail(r, "ncclCommSplit (NCCL_SPLIT_NOCOLOR)", e, __FILE__, __LINE__);
	return cu_nccl_settle(parent, "ncclCommSplit (the parent communicator)", deadline, e);
}

static int init_body(CuNccl *nc, const Comm *comm, const uint32_t masks[DP_NSTREAM],
		     double deadline, RtErr *e)
{
	if (comm->world == 1)
		return 0;

	ncclUniqueId id;
	memset(&id, 0, sizeof id);
	if (comm->rank == 0)
		CU_NCCL(ncclGetUniqueId(&id), e);
	RT_CHECK(share_id(&id, deadline, e));
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	NB(ncclCommInitRankConfig(&nc->world_comm, comm->world, id, comm->rank, &cfg),
	   nc->world_comm, e);
	RT_CHECK(cu_nccl_settle(nc->world_comm, "ncclCommInitRankConfig", deadline, e));
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 1; m < NMASK; m++) {
			if (!(masks[st] & (1u << m)) || cu_nccl_group_size(comm, m) < 2)
				continue;
			RT_CHECK(split(nc->world_comm, colour_of(comm, m), comm->rank,
				       &nc->comm[st][m], deadline, e));
		}
	/* the sub-groups of pp stages, on the comm stream, in the list's order on
	 * every rank (each split is collective over the world communicator) */
	int pp = comm->coord[DP_AXIS_PP];
	for (int i = 0; i < nc->ngroups; i++) {
		const CommGroup *g = &nc->groups[i];
		if (pp < 64 && g->stages >> pp & 1)
			RT_CHECK(split(nc->world_comm, colour_of(comm, g->axes), comm->rank,
				       &nc->comm[DP_STREAM_COMM][NMASK + i], deadline, e));
		else
			RT_CHECK(split_out(nc->world_comm, comm->rank, deadline, e));
	}
	return 0;
}

int cu_nccl_init(CuNccl **out, const Comm *comm, const uint32_t masks[DP_NSTREAM],
		 const CommGroup *groups, int ngroups, double deadline_s, RtErr *e)
{
	*out = NULL;
	if (ngroups < 0 || ngroups > CU_NCCL_MAX_GROUPS)
		return RT_FAIL(e, "%d sub-groups of the pipeline stages: at most %d", ngroups,
			       CU_NCCL_MAX_GROUPS);
	CuNccl *nc = calloc(1, sizeof *nc);
	if (!nc)
		return RT_FAIL(e, "out of memory (NCCL state)");
	for (int i = 0; i < ngroups; i++)
		nc->groups[i] = groups[i];
	nc->ngroups = ngroups;
	nc->rank = comm->rank;
	nc->world = comm->world;
	if (init_body(nc, comm, masks, cu_nccl_now() + deadline_s, e)) {
		/* the other ranks may be stuck in an init: do not wait long */
		cu_nccl_abort(nc, CU_NCCL_ABORT_BOUND_S);
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

ncclComm_t cu_nccl_group_comm(CuNccl *nc, unsigned mask, uint64_t stages)
{
	for (int i = 0; nc && i < nc->ngroups; i++)
		if (nc->groups[i].axes == mask && nc->groups[i].stages == stages)
			return nc->comm[DP_STREAM_COMM][NMASK + i];
	return NULL;
}

int cu_nccl_async_error(CuNccl *nc, RtErr *e)
{
	if (!nc || nc->aborted)
		return 0;
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 0; m < NSLOT; m++) {
			ncclResult_t async = ncclSuccess;
			if (!nc->comm[st][m])
				continue;
			CU_NCCL(ncclCommGetAsyncError(nc->comm[st][m], &async), e);
			if (async != ncclSuccess && async != ncclInProgress)
				return RT_FAIL(e, "NCCL asynchronous error on the communicator of axis "
					       "mask %u%s (%s stream): %s",
					       m < NMASK ? m : nc->groups[m - NMASK].axes,
					       m < NMASK ? "" : " over a sub-group of the pipeline stages",
					       dp_name(dp_stream_names, DP_NSTREAM, (unsigned)st),
					       ncclGetErrorString(async));
		}
	return 0;
}

/* One abort thread: its communicator, and the counter of finished ones. */
typedef struct {
	ncclComm_t comm;
	atomic_int *done;
} AbortJob;

static void *abort_one(void *arg)
{
	AbortJob job = *(AbortJob *)arg;
	free(arg);
	ncclCommAbort(job.comm);
	atomic_fetch_add(job.done, 1);
	return NULL;
}

void cu_nccl_abort_start(CuNccl *nc)
{
	if (MUTANT(abort_serial) && nc && !nc->aborted) { /* one after the other, on this thread */
		nc->aborted = 1;
		for (int st = 0; st < DP_NSTREAM; st++)
			for (unsigned m = 0; m < NSLOT; m++)
				if (nc->comm[st][m]) {
					ncclCommAbort(nc->comm[st][m]);
					nc->comm[st][m] = NULL;
				}
		if (nc->world_comm)
			ncclCommAbort(nc->world_comm);
		nc->world_comm = NULL;
		return;
	}
	if (!nc || nc->aborted)
		return;
	nc->aborted = 1;
	int n = 0;
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 0; m < NSLOT; m++)
			if (nc->comm[st][m]) {
				nc->aborting[n++] = nc->comm[st][m];
				nc->comm[st][m] = NULL;
			}
	if (nc->world_comm)
		nc->aborting[n++] = nc->world_comm;
	nc->world_comm = NULL;
	nc->abort_n = n;
	atomic_store(&nc->aborts_done, 0);
	for (int i = 0; i < n; i++) {
		AbortJob *job = malloc(sizeof *job);
		pthread_t t;
		pthread_attr_t at;
		if (!job)
			continue;
		*job = (AbortJob){nc->aborting[i], &nc->aborts_done};
		if (pthread_attr_init(&at) == 0) {
			pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
			if (pthread_create(&t, &at, abort_one, job) == 0)
				nc->abort_started++;
			else
				free(job); /* not aborted: left to the process's exit */
			pthread_attr_destroy(&at);
		} else {
			free(job);
		}
	}
}

int cu_nccl_abort(CuNccl *nc, double bound_s)
{
	if (!nc)
		return 0;
	cu_nccl_abort_start(nc);
	if (nc->abort_waited)
		return nc->abort_stuck;
	nc->abort_waited = 1;
	double deadline = cu_nccl_now() + bound_s;
	while (atomic_load(&nc->aborts_done) < nc->abort_started && cu_nccl_now() < deadline) {
		struct timespec ts = {0, 1000000}; /* 1 ms */
		nanosleep(&ts, NULL);
	}
	nc->abort_stuck = atomic_load(&nc->aborts_done) < nc->abort_n;
	return nc->abort_stuck;
}

/* Finalize (settled under a deadline), then destroy; abort what does not
 * finalize. */
static void close_comm(ncclComm_t c, double deadline)
{
	RtErr ignore = {.rank = -1};
	ncclResult_t r = ncclCommFinalize(c);
	if ((r != ncclSuccess && r != ncclInProgress) ||
	    cu_nccl_settle(c, "ncclCommFinalize", deadline, &ignore)) {
		ncclCommAbort(c);
		return;
	}
	ncclCommDestroy(c);
}

void cu_nccl_free(CuNccl *nc)
{
	if (!nc || nc->abort_stuck)
		return; /* the abort threads still count in it */
	double deadline = cu_nccl_now() + FINALIZE_DEADLINE_S;
	for (int st = 0; st < DP_NSTREAM; st++)
		for (unsigned m = 0; m < NSLOT; m++)
			if (nc->comm[st][m])
				close_comm(nc->comm[st][m], deadline);
	if (nc->world_comm)
		close_comm(nc->world_comm, deadline);
	free(nc);
}
