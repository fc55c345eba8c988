/*
 * comm_mpi.c - the MPI communication backend (CPU ranks), plus the
 * backend-independent mesh helpers declared in comm.h.
 *
 * One communicator per axis mask, made with MPI_Comm_split at start-up
 * (colour = this rank's coordinates with the masked axes zeroed, key = world
 * rank, so group ranks follow the mesh's row-major order). Collectives are
 * MPI_Iallreduce (MPI_IN_PLACE) / MPI_Ireduce_scatter_block / MPI_Iallgather,
 * and the pipeline's MPI_Isend / MPI_Irecv;
 * their requests sit in an array indexed by ticket. Open MPI has no progress
 * thread by default, so the CPU backend calls progress() (MPI_Testall on
 * the open requests) between instructions; without that, "overlap" would
 * only happen inside the final wait.
 *
 * Every wait goes through world_waitall (world.h): full-speed polling for
 * the first milliseconds, then sleeps that back off, so a stopped or lost
 * peer costs no CPU; it fails after c->timeout_s (dpexec's --timeout,
 * default 10 minutes, 0 = never) with a message instead of hanging.
 *
 * MPI errors are returned, not fatal (MPI_ERRORS_RETURN), and become RtErrs.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm.h"
#include "world.h"

#define NMASK (1u << DP_MAX_AXES)

/* What a request is, for the message when it does not complete. */
typedef struct {
	int16_t p2p;          /* 0: a collective; DP_OP_SEND or DP_OP_RECV */
	int16_t peer;         /* the p2p's other stage */
	int32_t tag;
} ReqInfo;

/* A communicator over a sub-group of the pp stages (comm.h's CommGroup). */
typedef struct {
	CommGroup g;
	MPI_Comm comm; /* MPI_COMM_NULL on a rank outside the group */
} SubComm;

typedef struct {
	MPI_Comm comm[NMASK]; /* MPI_COMM_NULL: mask not created or group of one */
	SubComm *sub;         /* the sub-groups of pp stages */
	int nsub;
	MPI_Request *req;     /* req[i] is ticket base + i */
	ReqInfo *info;        /* info[i]: what req[i] is */
	int64_t nreq, cap;
	int64_t base;         /* ticket of req[0] */
	int64_t first_open;   /* req[0..first_open) are known complete */
} Mpi;

void comm_coords(const uint32_t mesh[DP_MAX_AXES], int rank, int coord[DP_MAX_AXES])
{
	for (int a = DP_MAX_AXES - 1; a >= 0; a--) {
		coord[a] = rank % (int)mesh[a];
		rank /= (int)mesh[a];
	}
}

int comm_group_size(const Comm *c, unsigned axes)
{
	int n = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (axes & DP_AXIS_BIT(a))
			n *= (int)c->mesh[a];
	return n;
}

/* Members of a group differ only in the masked coordinates; sorted by world
 * rank (MPI_Comm_split's key) they are in row-major order of those. */
int comm_group_rank(const Comm *c, unsigned axes)
{
	int k = 0;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (axes & DP_AXIS_BIT(a))
			k = k * (int)c->mesh[a] + c->coord[a];
	return k;
}

static int mpi_check(int rc, const char *what, RtErr *e)
{
	if (rc == MPI_SUCCESS)
		return 0;
	char s[MPI_MAX_ERROR_STRING];
	int n = 0;
	MPI_Error_string(rc, s, &n);
	return RT_FAIL(e, "%s failed: %s", what, s);
}

static MPI_Comm group_comm(Comm *c, unsigned axes, uint64_t stages)
{
	Mpi *m = c->impl;
	if (stages) {
		for (int i = 0; i < m->nsub; i++)
			if (m->sub[i].g.axes == axes && m->sub[i].g.stages == stages)
				return m->sub[i].comm;
		return MPI_COMM_NULL;
	}
	return axes < NMASK ? m->comm[axes] : MPI_COMM_NULL;
}

/* Reserve a slot for a new request; returns its ticket. */
static int new_request(Comm *c, MPI_Request **slot, int64_t *ticket, RtErr *e)
{
	Mpi *m = c->impl;
	if (m->nreq == m->cap) {
		int64_t cap = m->cap ? 2 * m->cap : 64;
		MPI_Request *r = realloc(m->req, (size_t)cap * sizeof *r);
		if (r)
			m->req = r;
		ReqInfo *in = r ? realloc(m->info, (size_t)cap * sizeof *in) : NULL;
		if (!in)
			return RT_FAIL(e, "out of memory (comm requests)");
		m->info = in;
		m->cap = cap;
	}
	m->info[m->nreq] = (ReqInfo){0, 0, 0};
	m->req[m->nreq] = MPI_REQUEST_NULL;
	*slot = &m->req[m->nreq++];
	*ticket = c->issued++;
	return 0;
}

/* A ticket for a collective that needed no communication (group of one). */
static int done_ticket(Comm *c, int64_t *ticket, RtErr *e)
{
	MPI_Request *slot;
	return new_request(c, &slot, ticket, e);
}

static int check_count(int64_t n, RtErr *e)
{
	if (n < 0 || n > INT_MAX)
		return RT_FAIL(e, "collective of %lld elements exceeds MPI's int count",
			       (long long)n);
	return 0;
}

/* MPI has no bf16 or f16 type or sum: they move as 16-bit words and sum
 * with these ops, in f32, each partial sum rounded to nearest even (NCCL's
 * ncclBfloat16 and ncclHalf sums do the same on GPUs). The order of the
 * partial sums is MPI's: another world size rounds at other points. */
static void half_sum(unsigned dt, const uint16_t *a, uint16_t *b, int n)
{
	for (int i = 0; i < n; i++)
		b[i] = rt_to_half(dt, rt_from_half(dt, a[i]) + rt_from_half(dt, b[i]));
}

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	(void)dt;
	half_sum(DP_BF16, in, inout, *len);
}

static void f16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	(void)dt;
	half_sum(DP_F16, in, inout, *len);
}

static MPI_Op bf16_op = MPI_OP_NULL, f16_op = MPI_OP_NULL;

/* The MPI type and sum of dtype dt. */
static int mpi_type(DpDtype dt, MPI_Datatype *type, MPI_Op *sum, RtErr *e)
{
	if (dt == DP_F32) {
		*type = MPI_FLOAT;
		*sum = MPI_SUM;
		return 0;
	}
	if (!dp_is_half(dt))
		return RT_FAIL(e, "collective of dtype %s", dp_name(dp_dtype_names, DP_NDTYPE, dt));
	MPI_Op *op = dt == DP_F16 ? &f16_op : &bf16_op;
	if (*op == MPI_OP_NULL &&
	    MPI_Op_create(dt == DP_F16 ? f16_sum : bf16_sum, 1, op) != MPI_SUCCESS)
		return RT_FAIL(e, "MPI_Op_create (the %s sum) failed", dp_dtype_names[dt]);
	*type = MPI_UINT16_T;
	*sum = *op;
	return 0;
}

static int mpi_all_reduce_start(Comm *c, unsigned axes, uint64_t stages, DpDtype dt, void *buf,
				int64_t n, int64_t *ticket, RtErr *e)
{
	MPI_Datatype type;
	MPI_Op sum;
	RT_CHECK(mpi_type(dt, &type, &sum, e));
	MPI_Comm g = group_comm(c, axes, stages);
	if (g == MPI_COMM_NULL || n == 0) {
		if ((stages || comm_group_size(c, axes) > 1) && n > 0)
			return RT_FAIL(e, "no communicator for axis mask %u over pipeline stages 0x%llx",
				       axes, (unsigned long long)stages);
		return done_ticket(c, ticket, e);
	}
	RT_CHECK(check_count(n, e));
	MPI_Request *slot;
	RT_CHECK(new_request(c, &slot, ticket, e));
	double t0 = MPI_Wtime();
	int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, type, sum, g, slot);
	c->stats.issue_s += MPI_Wtime() - t0;
	c->stats.ncoll++;
	c->stats.bytes += n * (int64_t)dp_dtype_size(dt);
	return mpi_check(rc, "MPI_Iallreduce", e);
}

static int mpi_reduce_scatter_start(Comm *c, unsigned axes, DpDtype dt, const void *in,
				    void *out, int64_t nout, int64_t *ticket, RtErr *e)
{
	MPI_Datatype type;
	MPI_Op sum;
	RT_CHECK(mpi_type(dt, &type, &sum, e));
	MPI_Comm g = group_comm(c, axes, 0);
	if (g == MPI_COMM_NULL || nout == 0) {
		if (comm_group_size(c, axes) > 1 && nout > 0)
			return RT_FAIL(e, "no communicator for axis mask %u", axes);
		if (in != out)
			memmove(out, in, (size_t)nout * dp_dtype_size(dt));
		return done_ticket(c, ticket, e);
	}
	RT_CHECK(check_count(nout, e));
	MPI_Request *slot;
	RT_CHECK(new_request(c, &slot, ticket, e));
	double t0 = MPI_Wtime();
	int rc = MPI_Ireduce_scatter_block(in, out, (int)nout, type, sum, g, slot);
	c->stats.issue_s += MPI_Wtime() - t0;
	c->stats.ncoll++;
	c->stats.bytes += nout * (int64_t)dp_dtype_size(dt) * comm_group_size(c, axes);
	return mpi_check(rc, "MPI_Ireduce_scatter_block", e);
}

static int mpi_all_gather_start(Comm *c, unsigned axes, DpDtype dt, const void *in, void *out,
				int64_t nin, int64_t *ticket, RtErr *e)
{
	MPI_Datatype type;
	MPI_Op sum;
	RT_CHECK(mpi_type(dt, &type, &sum, e));
	MPI_Comm g = group_comm(c, axes, 0);
	if (g == MPI_COMM_NULL || nin == 0) {
		if (comm_group_size(c, axes) > 1 && nin > 0)
			return RT_FAIL(e, "no communicator for axis mask %u", axes);
		if (in != out)
			memmove(out, in, (size_t)nin * dp_dtype_size(dt));
		return done_ticket(c, ticket, e);
	}
	RT_CHECK(check_count(nin, e));
	MPI_Request *slot;
	RT_CHECK(new_request(c, &slot, ticket, e));
	double t0 = MPI_Wtime();
	int rc = MPI_Iallgather(in, (int)nin, type, out, (int)nin, type, g, slot);
	c->stats.issue_s += MPI_Wtime() - t0;
	c->stats.ncoll++;
	c->stats.bytes += nin * (int64_t)dp_dtype_size(dt) * comm_group_size(c, axes);
	return mpi_check(rc, "MPI_Iallgather", e);
}

/* MPI_Isend / MPI_Irecv to group rank `peer` of the axes' communicator:
 * MPI matches a pair's messages of one tag in the order they were posted. */
static int mpi_p2p_start(Comm *c, int send, unsigned axes, int peer, int tag, DpDtype dt,
			 void *buf, int64_t n, int64_t *ticket, RtErr *e)
{
	MPI_Datatype type;
	MPI_Op sum;
	RT_CHECK(mpi_type(dt, &type, &sum, e));
	MPI_Comm g = group_comm(c, axes, 0);
	if (g == MPI_COMM_NULL || peer < 0 || peer >= comm_group_size(c, axes) ||
	    peer == comm_group_rank(c, axes))
		return RT_FAIL(e, "no peer %d to %s over axis mask %u", peer, send ? "send to" :
			       "receive from", axes);
	RT_CHECK(check_count(n, e));
	MPI_Request *slot;
	RT_CHECK(new_request(c, &slot, ticket, e));
	double t0 = MPI_Wtime();
	Mpi *m = c->impl;
	m->info[slot - m->req] = (ReqInfo){(int16_t)(send ? DP_OP_SEND : DP_OP_RECV), (int16_t)peer,
					   tag};
	int rc = send ? MPI_Isend(buf, (int)n, type, peer, tag, g, slot)
		      : MPI_Irecv(buf, (int)n, type, peer, tag, g, slot);
	c->stats.issue_s += MPI_Wtime() - t0;
	c->stats.ncoll++;
	c->stats.bytes += n * (int64_t)dp_dtype_size(dt);
	return mpi_check(rc, send ? "MPI_Isend" : "MPI_Irecv", e);
}

static int mpi_send_start(Comm *c, unsigned axes, int peer, int tag, DpDtype dt,
			  const void *buf, int64_t n, int64_t *ticket, RtErr *e)
{
	return mpi_p2p_start(c, 1, axes, peer, tag, dt, (void *)buf, n, ticket, e);
}

static int mpi_recv_start(Comm *c, unsigned axes, int peer, int tag, DpDtype dt, void *buf,
			  int64_t n, int64_t *ticket, RtErr *e)
{
	return mpi_p2p_start(c, 0, axes, peer, tag, dt, buf, n, ticket, e);
}

/* Complete req[from, to): world_waitall polls with back-off, so a hung
 * peer costs no CPU and becomes an error after the timeout. */
static int complete(Comm *c, int64_t from, int64_t to, RtErr *e)
{
	Mpi *m = c->impl;
	if (to <= from)
		return 0;
	if (to - from > INT_MAX)
		return RT_FAIL(e, "too many pending collectives");
	/* a pipeline's transfer among them: the first one still open names the
	 * stage and what it waits for, should it never complete */
	char what[96] = "a collective";
	if (c->mesh[DP_AXIS_PP] > 1)
		snprintf(what, sizeof what, "pipeline stage %d's collective", c->coord[DP_AXIS_PP]);
	for (int64_t i = from; i < to; i++) {
		int done = 0;
		if (!m->info[i].p2p || MPI_Test(&m->req[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done)
			continue;
		int send = m->info[i].p2p == DP_OP_SEND;
		snprintf(what, sizeof what, "pipeline stage %d's %s stage %d (tag %d)",
			 c->coord[DP_AXIS_PP], send ? "send to" : "recv from", m->info[i].peer,
			 (int)m->info[i].tag);
		break;
	}
	return world_waitall((int)(to - from), m->req + from, c->timeout_s, what,
			     &c->stats.blocked_s, e);
}

static int mpi_wait(Comm *c, int64_t upto, RtErr *e)
{
	Mpi *m = c->impl;
	int64_t to = upto - m->base;
	if (to > m->nreq)
		to = m->nreq;
	if (to > m->first_open) {
		RT_CHECK(complete(c, m->first_open, to, e));
		m->first_open = to;
	}
	c->completed = m->base + m->first_open;
	if (m->first_open == m->nreq) {
		/* everything issued is complete: recycle the array */
		m->base += m->nreq;
		m->nreq = m->first_open = 0;
	}
	return 0;
}

static int mpi_wait_one(Comm *c, int64_t ticket, RtErr *e)
{
	Mpi *m = c->impl;
	int64_t i = ticket - m->base;
	if (i < m->first_open || i >= m->nreq)
		return 0; /* complete (or recycled with every ticket before it) */
	RT_CHECK(complete(c, i, i + 1, e)); /* a completed request becomes MPI_REQUEST_NULL */
	while (m->first_open < m->nreq && m->req[m->first_open] == MPI_REQUEST_NULL)
		m->first_open++;
	return mpi_wait(c, m->base + m->first_open, e);
}

static int mpi_progress(Comm *c, RtErr *e)
{
	Mpi *m = c->impl;
	int64_t n = m->nreq - m->first_open;
	if (n <= 0)
		return 0;
	int flag = 0;
	int rc = MPI_Testall((int)(n > INT_MAX ? INT_MAX : n), m->req + m->first_open, &flag,
			     MPI_STATUSES_IGNORE);
	if (rc == MPI_SUCCESS && flag && n <= INT_MAX) {
		m->first_open = m->nreq;
		return mpi_wait(c, c->issued, e);
	}
	return mpi_check(rc, "MPI_Testall", e);
}

/* Blocking collectives go through a request too, so --timeout covers them. */
static int mpi_allreduce_f64(Comm *c, unsigned axes, double *v, int n, RtErr *e)
{
	MPI_Comm g = group_comm(c, axes, 0);
	if (g == MPI_COMM_NULL)
		return 0;
	RT_CHECK(mpi_wait(c, c->issued, e)); /* keep tickets in order */
	MPI_Request *slot;
	int64_t ticket;
	RT_CHECK(new_request(c, &slot, &ticket, e));
	RT_CHECK(mpi_check(MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, g, slot),
			   "MPI_Iallreduce", e));
	CommStats keep = c->stats; /* bookkeeping reductions are not step communication */
	int rc = mpi_wait(c, c->issued, e);
	c->stats = keep;
	return rc;
}

static int mpi_all_ok(Comm *c, int ok, int *all, RtErr *e)
{
	int v = ok ? 1 : 0, r = 0;
	MPI_Request req;
	RT_CHECK(mpi_check(MPI_Iallreduce(&v, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req),
			   "MPI_Iallreduce", e));
	RT_CHECK(world_waitall(1, &req, c->timeout_s, "agreeing with the other ranks", NULL, e));
	*all = r;
	return 0;
}

static void mpi_free(Comm *c)
{
	if (!c)
		return;
	Mpi *m = c->impl;
	if (m) {
		for (unsigned k = 0; k < NMASK; k++)
			if (m->comm[k] != MPI_COMM_NULL)
				MPI_Comm_free(&m->comm[k]);
		for (int i = 0; i < m->nsub; i++)
			if (m->sub[i].comm != MPI_COMM_NULL)
				MPI_Comm_free(&m->sub[i].comm);
		free(m->sub);
		free(m->req);
		free(m->info);
		free(m);
	}
	free(c);
}

static const CommOps mpi_ops = {
	.name = "mpi",
	.all_reduce_start = mpi_all_reduce_start,
	.reduce_scatter_start = mpi_reduce_scatter_start,
	.all_gather_start = mpi_all_gather_start,
	.send_start = mpi_send_start,
	.recv_start = mpi_recv_start,
	.wait = mpi_wait,
	.wait_one = mpi_wait_one,
	.progress = mpi_progress,
	.allreduce_f64 = mpi_allreduce_f64,
	.all_ok = mpi_all_ok,
	.free = mpi_free,
};

int comm_mpi_init(Comm **out, const uint32_t mesh[DP_MAX_AXES], uint32_t masks,
		  const CommGroup *groups, int ngroups, RtErr *e)
{
	*out = NULL;
	Comm *c = calloc(1, sizeof *c);
	Mpi *m = calloc(1, sizeof *m);
	if (!c || !m) {
		free(c);
		free(m);
		return RT_FAIL(e, "out of memory (comm)");
	}
	c->ops = &mpi_ops;
	c->impl = m;
	for (unsigned k = 0; k < NMASK; k++)
		m->comm[k] = MPI_COMM_NULL;
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &c->world);
	memcpy(c->mesh, mesh, sizeof c->mesh);
	comm_coords(mesh, c->rank, c->coord);
	masks |= 1u << COMM_DP_AXES | 1u << COMM_SAMPLE_AXES | 1u << COMM_METRIC_AXES;
	/* every rank walks the same masks in the same order: the splits match */
	for (unsigned k = 1; k < NMASK; k++) {
		if (!(masks & (1u << k)) || comm_group_size(c, k) == 1)
			continue;
		int color = 0;
		for (int a = 0; a < DP_MAX_AXES; a++)
			color = color * (int)mesh[a] + ((k & DP_AXIS_BIT(a)) ? 0 : c->coord[a]);
		if (mpi_check(MPI_Comm_split(MPI_COMM_WORLD, color, c->rank, &m->comm[k]),
			      "MPI_Comm_split", e)) {
			mpi_free(c);
			return -1;
		}
	}
	/* the sub-groups of pp stages, in the list's order on every rank: a rank
	 * outside a group passes MPI_UNDEFINED and gets MPI_COMM_NULL */
	m->sub = calloc((size_t)ngroups + 1, sizeof *m->sub);
	if (!m->sub) {
		mpi_free(c);
		return RT_FAIL(e, "out of memory (comm)");
	}
	for (int i = 0; i < ngroups; i++) {
		m->sub[i] = (SubComm){groups[i], MPI_COMM_NULL};
		m->nsub = i + 1;
		int in = c->coord[DP_AXIS_PP] < 64 && groups[i].stages >> c->coord[DP_AXIS_PP] & 1;
		int color = 0;
		for (int a = 0; a < DP_MAX_AXES; a++)
			color = color * (int)mesh[a] + ((groups[i].axes & DP_AXIS_BIT(a)) ? 0 : c->coord[a]);
		if (mpi_check(MPI_Comm_split(MPI_COMM_WORLD, in ? color : MPI_UNDEFINED, c->rank,
					     &m->sub[i].comm),
			      "MPI_Comm_split (a sub-group of the pipeline stages)", e)) {
			mpi_free(c);
			return -1;
		}
	}
	*out = c;
	return 0;
}
