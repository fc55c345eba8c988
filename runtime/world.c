/*
 * world.c - host-side control traffic over MPI_COMM_WORLD and the polling
 * wait every MPI wait of the runtime goes through (world.h says why).
 * Every collective here is non-blocking plus world_waitall, so a stopped or
 * vanished rank becomes a timeout message instead of a hang.
 */
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "world.h"

#define WORLD_SLEEP_MIN_NS 10000L   /* shortest back-off sleep: 10 us */
#define WORLD_SLEEP_MAX_NS 1000000L /* longest: 1 ms */
#define WORLD_SLEEP_SHARE 100       /* sleep at most 1/100 of the wait so far */
/* A gap this long between two polls (whose sleeps are at most 1 ms) means
 * this process was not running: stopped (SIGSTOP, a debugger) or starved.
 * The gap does not count toward the timeout: the timeout is what this rank
 * saw of the others. Without this a rank stopped while waiting timed out
 * the moment it was continued - as the launcher continues it to deliver the
 * SIGTERM that ends the job - and printed the error a second time. */
#define WORLD_STALL_S 1.0
/* How long a wait polls at full speed before it backs off: WORLD_SPIN_MS,
 * or DP_WAIT_SPIN_MS from the environment (read by world_init; one value
 * per process, as the environment is). 0: back off at once, for ranks that
 * share their cores with busy neighbours (tests/lib.sh says what it saves). */
static double wait_spin_ms = WORLD_SPIN_MS;

int world_init(World *w, double timeout_s, RtErr *e)
{
	MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &w->size);
	w->timeout_s = timeout_s;
	const char *v = getenv("DP_WAIT_SPIN_MS");
	if (v) {
		char *end;
		double ms = strtod(v, &end);
		if (end == v || *end || !(ms >= 0 && ms <= 1000))
			return RT_FAIL(e, "DP_WAIT_SPIN_MS=%s: not a number of milliseconds in [0, 1000]", v);
		wait_spin_ms = ms;
	}
	return 0;
}

static int mpi_fail(int rc, const char *what, RtErr *e)
{
	char s[MPI_MAX_ERROR_STRING];
	int n = 0;
	MPI_Error_string(rc, s, &n);
	return RT_FAIL(e, "%s failed: %s", what, s);
}

int world_waitall(int n, MPI_Request *req, double timeout_s, const char *what,
		  double *blocked_s, RtErr *e)
{
	double t0 = MPI_Wtime(), el = 0, last = t0;
	long sleep_ns;
	int rc;
	for (;;) {
		int flag = 0;
		rc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
		double now = MPI_Wtime();
		if (now - last > WORLD_STALL_S)
			t0 += now - last; /* not running meanwhile: not waited */
		last = now;
		el = now - t0;
		if (rc != MPI_SUCCESS || flag)
			break;
		if (timeout_s > 0 && el > timeout_s) {
			if (blocked_s)
				*blocked_s += el;
			RT_FAIL(e, "%s did not complete within %.0f s (--timeout): a rank is stuck or "
				"gone", what, timeout_s);
			e->lost = 1;
			return -1;
		}
		if (el * 1e3 < wait_spin_ms) {
			sched_yield(); /* other ranks may share this core */
			continue;
		}
		/* Open MPI advances a collective only inside MPI calls: a sleep delays
		 * it by up to its length, so it stays a small share of the wait */
		sleep_ns = (long)(el * 1e9 / WORLD_SLEEP_SHARE);
		if (sleep_ns < WORLD_SLEEP_MIN_NS)
			sleep_ns = WORLD_SLEEP_MIN_NS;
		if (sleep_ns > WORLD_SLEEP_MAX_NS)
			sleep_ns = WORLD_SLEEP_MAX_NS;
		struct timespec ts = {0, sleep_ns};
		nanosleep(&ts, NULL);
	}
	if (blocked_s)
		*blocked_s += el;
	return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, what, e);
}

int world_sync_within(World *w, int rc, int sig, double seconds, RtErr *e)
{
	if (w->broken || e->lost) {
		/* a rank already did not answer: another meeting would only time out again */
		if (!w->broken)
			w->printer = w->rank;
		w->failed = w->broken = 1;
		return -1;
	}
	int v[2] = {sig, rc != 0 && !e->echo ? w->size - w->rank : 0}, r[2] = {0, 0};
	MPI_Request req;
	RtErr ae = {.rank = e->rank};
	int mrc = MPI_Iallreduce(v, r, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
	if (mrc != MPI_SUCCESS)
		mpi_fail(mrc, "MPI_Iallreduce", &ae);
	else
		mrc = world_waitall(1, &req, seconds, "agreeing with the other ranks", NULL, &ae);
	if (mrc) {
		w->failed = w->broken = 1;
		w->printer = w->rank;
		if (rc == 0)
			*e = ae;
		return -1;
	}
	if (r[0] > w->sig)
		w->sig = r[0];
	if (!r[1] && rc == 0)
		return 0;
	w->failed = 1;
	w->printer = r[1] ? w->size - r[1] : w->rank;
	if (rc == 0) {
		e->msg[0] = '\0';
		RT_FAIL(e, "stopped because rank %d failed", w->printer);
		e->echo = 1;
	}
	return -1;
}

int world_sync(World *w, int rc, int sig, RtErr *e)
{
	return world_sync_within(w, rc, sig, w->timeout_s, e);
}

int world_allgatherv(const World *w, const void *mine, int64_t nbytes, char **all, int64_t **offs,
		     RtErr *e)
{
	*all = NULL;
	*offs = NULL;
	if (nbytes < 0 || nbytes > INT_MAX)
		return RT_FAIL(e, "%lld bytes are too many for one gather", (long long)nbytes);
	int n = (int)nbytes;
	int *counts = calloc((size_t)w->size, sizeof *counts);
	int *displs = calloc((size_t)w->size, sizeof *displs);
	int64_t *o = calloc((size_t)w->size + 1, sizeof *o);
	char *buf = NULL;
	int rc = -1;
	MPI_Request req;
	if (!counts || !displs || !o) {
		RT_FAIL(e, "out of memory");
		goto out;
	}
	if ((rc = MPI_Iallgather(&n, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD, &req)) !=
	    MPI_SUCCESS) {
		rc = mpi_fail(rc, "MPI_Iallgather", e);
		goto out;
	}
	if ((rc = world_waitall(1, &req, w->timeout_s, "a gather of checkpoint tables", NULL, e)))
		goto out;
	for (int r = 0; r < w->size; r++)
		o[r + 1] = o[r] + counts[r];
	if (o[w->size] > INT_MAX) {
		rc = RT_FAIL(e, "%lld bytes are too many for one gather", (long long)o[w->size]);
		goto out;
	}
	for (int r = 0; r < w->size; r++)
		displs[r] = (int)o[r];
	buf = malloc(o[w->size] ? (size_t)o[w->size] : 1);
	if (!buf) {
		rc = RT_FAIL(e, "out of memory");
		goto out;
	}
	if ((rc = MPI_Iallgatherv(mine, n, MPI_BYTE, buf, counts, displs, MPI_BYTE, MPI_COMM_WORLD,
				  &req)) != MPI_SUCCESS) {
		rc = mpi_fail(rc, "MPI_Iallgatherv", e);
		goto out;
	}
	rc = world_waitall(1, &req, w->timeout_s, "a gather of checkpoint tables", NULL, e);
out:
	free(counts);
	free(displs);
	if (rc) {
		free(buf);
		free(o);
		return -1;
	}
	*all = buf;
	*offs = o;
	return 0;
}

int world_gatherv_f32(const World *w, const float *mine, int n, float *recv, const int *counts,
		      const int *displs, RtErr *e)
{
	MPI_Request req;
	int rc = MPI_Igatherv(mine, n, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, 0,
			      MPI_COMM_WORLD, &req);
	if (rc != MPI_SUCCESS)
		return mpi_fail(rc, "MPI_Igatherv", e);
	return world_waitall(1, &req, w->timeout_s, "a gather of checkpoint data", NULL, e);
}

int world_bcast(const World *w, void *buf, int n, RtErr *e)
{
	MPI_Request req;
	int rc = MPI_Ibcast(buf, n, MPI_BYTE, 0, MPI_COMM_WORLD, &req);
	if (rc != MPI_SUCCESS)
		return mpi_fail(rc, "MPI_Ibcast", e);
	return world_waitall(1, &req, w->timeout_s, "a broadcast from rank 0", NULL, e);
}
