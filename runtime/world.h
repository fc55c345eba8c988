/*
 * world.h - host-side control traffic between all ranks (runtime/world.c):
 * agreeing on errors and signals, gathering checkpoint pieces, and the one
 * way every MPI wait of the runtime is done.
 *
 * These are not the step's collectives (those go through a comm backend,
 * comm.h, on the device): they move small host buffers over
 * MPI_COMM_WORLD, which every run has since MPI is the bootstrap (mpirun,
 * srun or a singleton), whatever the compute and comm backends.
 *
 * Waiting. Open MPI's blocking waits spin at 100% CPU, forever if a peer is
 * stopped or gone. world_waitall polls instead: MPI_Testall with
 * sched_yield for the first WORLD_SPIN_MS milliseconds (a normal wait ends
 * there, at full speed; DP_WAIT_SPIN_MS in the environment says another
 * length, 0 none: on cores shared with busy neighbours the spinning rank
 * takes the CPU the rank it waits for needs), then with a sleep between
 * tests of 1/100 of the time waited so far, from 10 us up to 1 ms (Open MPI advances a collective
 * only inside MPI calls, so a long collective is slowed by about 1%, while
 * a stuck peer costs about a thousand cheap tests a second, not a core),
 * and fails after timeout_s seconds (0: never) with a message naming what
 * was waited for.
 */
#ifndef DP_WORLD_H
#define DP_WORLD_H

#include <mpi.h>

#include "rt.h"

#define WORLD_SPIN_MS 20.0         /* polling at full speed before backing off */
#define WORLD_DEFAULT_TIMEOUT 600.0 /* seconds: PyTorch's process-group default */

typedef struct {
	int rank, size;
	double timeout_s; /* 0: waits never time out */
	/* what the sync points have agreed on (world_sync) */
	int sig;          /* the largest signal any rank has seen, 0: none */
	int failed;       /* some rank failed: the run ends */
	int printer;      /* the lowest rank that found an error itself: it prints */
	int broken;       /* a sync point itself failed (a rank is stuck or gone) */
} World;

/* MPI is initialised; rank and size of MPI_COMM_WORLD. */
/* 0, or -1 with e: DP_WAIT_SPIN_MS is not a number of milliseconds in [0, 1000] */
int world_init(World *w, double timeout_s, RtErr *e);
/* Complete n requests (see the top of the file). *blocked_s (may be NULL)
 * gets the seconds spent waiting. what: "a collective", ... for messages. */
int world_waitall(int n, MPI_Request *req, double timeout_s, const char *what,
		  double *blocked_s, RtErr *e);
/* A sync point of the whole run: every rank passes its result so far (rc,
 * e) and a signal it has seen (0: none). 0 when no rank has failed (w->sig
 * may have been raised). Else -1 on every rank with w->failed, w->printer
 * set; a rank without an error of its own gets one that only echoes it
 * (e->echo: not printed). If the sync itself fails (a rank is stuck or gone,
 * after timeout_s), w->broken is set and this rank's own error kept; once
 * broken, or when e->lost says a collective already timed out, it returns
 * -1 at once instead of waiting out the timeout a second time.
 * world_sync_within waits at most `seconds` (an error mid-step: the other
 * ranks may be stuck in a collective the failed rank never joins). */
int world_sync(World *w, int rc, int sig, RtErr *e);
int world_sync_within(World *w, int rc, int sig, double seconds, RtErr *e);
/* Every rank's nbytes (any size, also 0) to every rank: *all (malloc'd)
 * holds them in rank order; offs[r] (malloc'd, size+1 entries) is where
 * rank r's bytes start, offs[size] the total. */
int world_allgatherv(const World *w, const void *mine, int64_t nbytes, char **all, int64_t **offs,
		     RtErr *e);
/* Rank 0 gets counts[r] floats from every rank r at displs[r] of recv
 * (both only read on rank 0); the others send n floats. */
int world_gatherv_f32(const World *w, const float *mine, int n, float *recv, const int *counts,
		      const int *displs, RtErr *e);
/* Broadcast n bytes from rank 0. */
int world_bcast(const World *w, void *buf, int n, RtErr *e);

#endif
