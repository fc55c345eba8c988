/*
 * comm.h - the communication backend interface of dpexec.
 *
 * A Comm knows the device mesh and this rank's coordinates, owns one
 * communicator per axis mask the step uses (the ranks that share every
 * coordinate NOT in the mask form a group), and runs collectives on them.
 *
 * Collectives are started, not completed: each start returns a ticket (a
 * number that grows by one per started collective, in issue order), and
 * comm's wait(ticket) blocks until every collective started before that
 * ticket has finished. This is what a stream gives you: the CPU compute
 * backend's streams (cpu/streams.c) turn "EVENT_RECORD on the comm stream"
 * into "remember c->issued" and "EVENT_WAIT on the compute stream" into
 * "wait(remembered ticket)". A collective over a group of one rank is a
 * no-op (or a copy) and gets a ticket that is already complete.
 *
 * The MPI backend (comm_mpi.c) uses non-blocking MPI collectives; Open MPI
 * advances them only inside MPI calls, so the CPU backend calls progress()
 * between instructions. (The CUDA backend keeps its NCCL communicators to
 * itself, one per stream: backend.h says why.)
 *
 * Every function returns 0, or -1 with an RtErr. With timeout_s > 0 a wait
 * that takes longer fails with a message instead of hanging.
 */
#ifndef DP_COMM_H
#define DP_COMM_H

#include <stdint.h>

#include "rt.h"

typedef struct Comm Comm;

/* Accumulated since the last comm_stats_reset (seconds and bytes of this rank). */
typedef struct {
	double issue_s;   /* time spent inside start calls */
	double blocked_s; /* time spent blocked in waits (exposed communication) */
	int64_t ncoll;    /* collectives started over groups larger than one rank */
	int64_t bytes;    /* payload bytes of those collectives (this rank's buffer) */
} CommStats;

typedef struct {
	const char *name;
	/* Elements of dtype dt (f32 or bf16: a bf16 sum adds in f32 and rounds
	 * each partial sum to nearest even). */
	/* buf[0..n) summed in place over the group of `axes`; with stages != 0
	 * (ALL_REDUCE's `stages`, axes with pp) only over the ranks of those pp
	 * stages (bit k: stage k), a sub-group comm_mpi_init made. */
	int (*all_reduce_start)(Comm *c, unsigned axes, uint64_t stages, DpDtype dt, void *buf,
				int64_t n, int64_t *ticket, RtErr *e);
	/* in[0..nout*group) summed over the group; this rank gets its block of nout. */
	int (*reduce_scatter_start)(Comm *c, unsigned axes, DpDtype dt, const void *in, void *out,
				    int64_t nout, int64_t *ticket, RtErr *e);
	/* Blocks of nin from every rank of the group, in group-rank order, into out. */
	int (*all_gather_start)(Comm *c, unsigned axes, DpDtype dt, const void *in, void *out,
				int64_t nin, int64_t *ticket, RtErr *e);
	/* Point-to-point over the group of `axes` (the pp axis): n elements to or
	 * from the rank of group rank `peer`. Each pair of ranks matches its sends
	 * and receives by tag, in the order they are started (the step's order,
	 * which the compiler proved deadlock-free). */
	int (*send_start)(Comm *c, unsigned axes, int peer, int tag, DpDtype dt, const void *buf,
			  int64_t n, int64_t *ticket, RtErr *e);
	int (*recv_start)(Comm *c, unsigned axes, int peer, int tag, DpDtype dt, void *buf,
			  int64_t n, int64_t *ticket, RtErr *e);
	/* Wait until every collective with a ticket < upto has completed. */
	int (*wait)(Comm *c, int64_t upto, RtErr *e);
	/* Wait until the one collective `ticket` has completed, whatever the
	 * others do (a stream's own, beside another stream's transfer that
	 * waits for its peer: cpu/streams.c). NULL: wait(ticket + 1). */
	int (*wait_one)(Comm *c, int64_t ticket, RtErr *e);
	/* Let pending collectives advance; never blocks. */
	int (*progress)(Comm *c, RtErr *e);
	/* Blocking sum of n doubles over the group of `axes` (logging, metrics). */
	int (*allreduce_f64)(Comm *c, unsigned axes, double *v, int n, RtErr *e);
	/* Logical AND of ok over all ranks (for agreeing on errors). */
	int (*all_ok)(Comm *c, int ok, int *all, RtErr *e);
	void (*free)(Comm *c);
} CommOps;

struct Comm {
	const CommOps *ops;
	int rank, world;
	uint32_t mesh[DP_MAX_AXES];
	int coord[DP_MAX_AXES]; /* rank = ((r*S + s)*C + c)*T + t */
	int64_t issued;         /* tickets handed out so far: the next ticket */
	int64_t completed;      /* every ticket below it has completed (as the last wait or
	                           progress() saw; a trace reads it) */
	double timeout_s;       /* 0: waits never time out */
	CommStats stats;
	void *impl;             /* backend state */
};

/* Number of ranks in this rank's group for an axis mask (1 for mask 0). */
int comm_group_size(const Comm *c, unsigned axes);
/* A sub-group of the pp axis: the group of `axes` (which has pp) restricted
 * to the ranks of the pp stages in `stages` (bit k: stage k). */
typedef struct {
	unsigned axes;
	uint64_t stages;
} CommGroup;

/* At most this many sub-groups of pp stages per step (one per tied set). */
#define COMM_MAX_GROUPS 16

/* The sub-groups of pp stages the step's all_reduces use (`stages`), each
 * once, in program order, into groups[0..cap): their number, -1 when more
 * than cap. The same list on every rank: the MPI and NCCL splits match.
 * (Inline: dpexec and the CUDA backend's library both read it.) */
static inline int comm_step_groups(const DpStep *s, CommGroup *groups, int cap)
{
	int n = 0;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			uint64_t set = in->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(in, ALL_REDUCE, stages) : 0;
			if (!set)
				continue;
			CommGroup gr = {(unsigned)DP_AXES(in), set};
			int k = 0;
			while (k < n && !(groups[k].axes == gr.axes && groups[k].stages == gr.stages))
				k++;
			if (k < n)
				continue;
			if (n == cap)
				return -1;
			groups[n++] = gr;
		}
	return n;
}
/* This rank's index in its group for an axis mask, in [0, comm_group_size):
 * the row-major index of its coordinates on the masked axes (outermost axis
 * first), which is the order of the group's communicator (MPI_Comm_split with
 * key = world rank) and so the block order of all_gather and reduce_scatter.
 * 0 for mask 0. */
int comm_group_rank(const Comm *c, unsigned axes);
/* Coordinates of `rank` in mesh (row-major, last axis fastest). */
void comm_coords(const uint32_t mesh[DP_MAX_AXES], int rank, int coord[DP_MAX_AXES]);

/* MPI backend. MPI must be initialised. `masks` is a bit set over axis masks
 * (bit m set: the step uses a collective over axis mask m), and groups[0..ngroups)
 * the sub-groups of pp stages it uses (exec_comm_groups); every rank must
 * pass the same values (MPI_Comm_split is collective). The data-parallel
 * mask is always created. */
int comm_mpi_init(Comm **out, const uint32_t mesh[DP_MAX_AXES], uint32_t masks,
		  const CommGroup *groups, int ngroups, RtErr *e);

/* The data-parallel axes: gradients and losses are summed over these. */
#define COMM_DP_AXES (DP_AXIS_BIT(DP_AXIS_REPLICATE) | DP_AXIS_BIT(DP_AXIS_SHARD))
/* The axes a step's tokens are spread over: the data-parallel ones and cp
 * (each cp rank holds part of every sequence). Losses and eval counts are
 * summed over these. (A cp axis of size 1 is a group of one: no cost.) */
#define COMM_SAMPLE_AXES (COMM_DP_AXES | DP_AXIS_BIT(DP_AXIS_CP))
/* The axes the losses and eval counts are summed over: the sample axes and
 * pp, whose stages but the last hold zeros (the last computes the loss). */
#define COMM_METRIC_AXES (COMM_SAMPLE_AXES | DP_AXIS_BIT(DP_AXIS_PP))

#endif
