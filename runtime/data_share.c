/*
 * data_share.c - IDX and .npy sources loaded once per node.
 *
 * Every rank of a job holds the same IDX and .npy arrays (the sampler, not
 * the load, picks its samples), so the ranks of a node (DataShare: the
 * communicator of MPI_COMM_TYPE_SHARED that dpexec makes) share one copy.
 * Node rank 0, the leader, reads and decodes the file with the code a rank
 * alone runs (data_idx.c, data_npy.c, then the labels' check) into a
 * shared-memory file (memfd_create) instead of malloc'd memory; it
 * broadcasts the outcome (the sample count and size, its pid and the
 * file's descriptor, or its error message) to the node's ranks, which open
 * the file as /proc/PID/fd/FD and map it read-only; after a barrier (every
 * rank has it open) the leader closes its descriptor, and the memory goes
 * with the last mapping. The leader's error is every node rank's error,
 * with the same message naming the file and the .dp line; each rank returns
 * it and the run's next sync point ends them all (dpexec's setup: each
 * split's data is a phase of its own between two sync points, which every
 * rank reaches, so no rank waits here for one that failed before).
 *
 * Fashion-MNIST's train and test sets are 55 MB in memory (IDX images stay
 * bytes; data_idx.c): 8 ranks of a node held 441 MB of them, now 55 MB; and
 * one rank inflates the 26 MB gzip file instead of every rank (~0.26 CPU-s
 * each, most of a short mlp run's CPU).
 *
 * Why an unnamed shared-memory file and not MPI_Win_allocate_shared:
 *  - MPI_Win_allocate_shared and MPI_Win_free are blocking collectives with
 *    no non-blocking form; every wait of the runtime is a polled
 *    non-blocking call under --timeout (world.h), so that a rank stopped or
 *    gone is a message, not a hang. Here the only collectives are an
 *    MPI_Ibcast and an MPI_Ibarrier, waited for by world_waitall.
 *  - A window is sized collectively before the leader could know the size
 *    (it reads the header first); the file is sized by the leader alone.
 *  - A window must be freed by every rank together before MPI_Finalize,
 *    also on the paths where one rank leaves early; a mapping is unmapped by
 *    each rank alone (data_free).
 * And not POSIX shm_open: a named object outlives a rank killed between
 * making it and unlinking it (while it loads, or waits for the others to
 * map it), and stays in /dev/shm until the machine reboots; a memfd has no
 * name, and a killed rank's memory is freed with its last mapping.
 * posix_fallocate reserves the file's pages when it is made: no room for
 * them is an error there (ENOSPC, ENOMEM), and then every rank loads its
 * own copy as before (SHARE_OWN), where writing into pages that cannot be
 * had would be a SIGBUS mid-load. A rank that cannot open the
 * leader's file (a /proc it may not read) loads its own too.
 *
 * A rank whose path is another file than the leader's (another working
 * directory: paths are resolved per rank, docs/DATA.md) loads its own: the
 * leader sends its file's device, inode, size and mtime. DP_DATA_SHARE=0 in
 * the environment makes every rank load its own copy (tests compare the
 * two).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_share.h"
#include "world.h"

/* The other ranks wait this long at least for the leader's load (and it
 * for their mapping): loading is one rank's work, not a collective, and a
 * --timeout of seconds (the tests') must not cut a 26 MB inflate short on a
 * loaded machine. A leader stopped or gone while it loads ends the others
 * after this, not after a shorter --timeout. */
#define DATA_SHARE_MIN_WAIT_S 120.0

enum {
	SHARE_MAPPED, /* the data is in the leader's file: pid, fd */
	SHARE_FAILED, /* the leader's load failed: msg */
	SHARE_OWN,    /* no file (shared memory unavailable): every rank loads its own */
	SHARE_SKIP,   /* the leader failed before this source: nothing loaded */
};

/* What the leader broadcasts for one source. */
typedef struct {
	int32_t status;
	int32_t bytes;     /* DataSource.bytes */
	int64_t n, elems;  /* DataSource.n, .elems */
	int64_t size;      /* bytes of the shared file */
	uint64_t dev, ino, fsize; /* the leader's data file (stat) */
	int64_t mtime_ns;
	int64_t pid;       /* the leader, and its descriptor of the shared file */
	int32_t fd;
	char msg[sizeof(((RtErr *)0)->msg)];
} ShareHead;

int data_share_wanted(void)
{
	const char *v = getenv("DP_DATA_SHARE");
	return !v || strcmp(v, "0") != 0;
}

static void file_id(const char *path, ShareHead *h)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return; /* all zeros: the load names the error */
	h->dev = st.st_dev;
	h->ino = st.st_ino;
	h->fsize = (uint64_t)st.st_size;
	h->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

void *data_share_create(ShareSeg *seg, int64_t size)
{
	seg->made = 0;
	int fd = memfd_create("dp-data", MFD_CLOEXEC);
	if (fd < 0)
		return NULL;
	void *p = MAP_FAILED;
	if (ftruncate(fd, (off_t)size) == 0 && posix_fallocate(fd, 0, (off_t)size) == 0)
		p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	seg->fd = fd;
	seg->made = 1;
	seg->size = size;
	return p;
}

/* Wait for one request on the node: the run's timeout, but at least
 * DATA_SHARE_MIN_WAIT_S. */
static int share_wait(const DataShare *sh, MPI_Request *req, int rc, const char *what, RtErr *e)
{
	if (rc != MPI_SUCCESS)
		return RT_FAIL(e, "%s failed (MPI error %d)", what, rc);
	double t = sh->timeout_s;
	if (t > 0 && t < DATA_SHARE_MIN_WAIT_S)
		t = DATA_SHARE_MIN_WAIT_S;
	return world_waitall(1, req, t, what, NULL, e);
}

/* The leader's part: load into a shared file, or fail, or fall back. */
static void lead(LoadCtx *c, DataSource *d, ShareHead *h)
{
	ShareSeg seg = {.fd = -1};
	file_id(c->path, h);
	c->seg = &seg;
	int rc = data_load_file(c, d);
	c->seg = NULL;
	if (rc) {
		if (seg.made)
			close(seg.fd);
		h->status = SHARE_FAILED;
		snprintf(h->msg, sizeof h->msg, "%s", c->e->msg);
		return;
	}
	if (!seg.made) {
		h->status = SHARE_OWN;
		return;
	}
	h->status = SHARE_MAPPED;
	h->bytes = d->bytes;
	h->n = d->n;
	h->elems = d->elems;
	h->size = seg.size;
	h->pid = (int64_t)getpid();
	h->fd = seg.fd;
}

/* A follower's part: map the leader's file read-only (0), or say that this
 * rank must load its own (1). */
static int follow(LoadCtx *c, const ShareHead *h, DataSource *d)
{
	ShareHead mine = {0};
	file_id(c->path, &mine);
	if (mine.dev != h->dev || mine.ino != h->ino || mine.fsize != h->fsize ||
	    mine.mtime_ns != h->mtime_ns)
		return 1; /* another file at this rank's path */
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/%lld/fd/%d", (long long)h->pid, (int)h->fd);
	int fd = open(proc, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 1;
	struct stat st;
	void *p = MAP_FAILED;
	if (fstat(fd, &st) == 0 && st.st_size == h->size)
		p = mmap(NULL, (size_t)h->size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return 1;
	d->data = p;
	d->mapped = (size_t)h->size;
	d->bytes = h->bytes;
	d->n = h->n;
	d->elems = h->elems;
	return 0;
}

int data_share_load(LoadCtx *c, const DataShare *sh, int skip, DataSource *d)
{
	ShareHead *h = calloc(1, sizeof *h);
	if (!h)
		return RT_FAIL(c->e, "out of memory");
	if (sh->rank == 0) {
		if (skip)
			h->status = SHARE_SKIP;
		else
			lead(c, d, h);
	}
	int leader = sh->rank == 0, mapped;
	MPI_Request req;
	RtErr we = {.rank = c->e->rank};
	char what[700];
	snprintf(what, sizeof what, "loading data file %s on the node's first rank", c->path);
	if (share_wait(sh, &req, MPI_Ibcast(h, (int)sizeof *h, MPI_BYTE, 0, sh->node, &req), what,
		       &we)) {
		if (leader && h->status == SHARE_MAPPED)
			close(h->fd);
		*c->e = we;
		free(h);
		return -1;
	}
	int rc = 0, mine = 0; /* mine: this rank maps the leader's copy */
	mapped = h->status == SHARE_MAPPED;
	if (leader)
		rc = h->status == SHARE_FAILED || h->status == SHARE_SKIP ? -1 : 0;
	else if (skip || h->status == SHARE_SKIP)
		rc = -1; /* this rank's error, or the leader's, is already reported */
	else if (h->status == SHARE_FAILED)
		rc = RT_FAIL(c->e, "%s", h->msg);
	else if (h->status == SHARE_OWN || !(mine = !follow(c, h, d)))
		rc = data_load_file(c, d);
	if (mapped) {
		/* every rank has the file mapped (or has given up on it) when the
		 * leader has their count: the descriptor can go, and the memory
		 * with the last mapping */
		snprintf(what, sizeof what, "the node's ranks mapping data file %s", c->path);
		int count = 0;
		mine |= leader;
		if (share_wait(sh, &req, MPI_Ireduce(&mine, &count, 1, MPI_INT, MPI_SUM, 0, sh->node, &req),
			       what, &we) && rc == 0) {
			*c->e = we;
			rc = -1;
		}
		if (leader) {
			close(h->fd);
			d->sharers = count;
		}
	}
	free(h);
	return rc;
}
