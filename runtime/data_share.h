/*
 * data_share.h - IDX and .npy sources loaded once per node
 * (runtime/data_share.c says how and why). dpexec makes a DataShare for
 * data_open; data.c and data_share.c use the rest.
 */
#ifndef DP_DATA_SHARE_H
#define DP_DATA_SHARE_H

#include <mpi.h>

#include "data_int.h"

/* The ranks of this node that share the data. */
typedef struct {
	MPI_Comm node;    /* MPI_COMM_TYPE_SHARED's communicator */
	int rank, size;   /* this rank's index in it, and its ranks (> 1) */
	double timeout_s; /* the run's --timeout (0: none) */
} DataShare;

/* data_open (rt.h) with the node's ranks sharing one copy of each IDX and
 * .npy source; share NULL: this rank alone, no MPI call (data_open). Every
 * rank of share->node calls it for the same split. */
int data_open_node(const DpStep *s, DpSplit split, const char *dp_file, int cp_rank,
		   const DataShare *share, DataSet **out, RtErr *e);
/* Bytes of the split this rank maps from its node's one copy (0: none);
 * on the node's first rank *sharers gets the fewest ranks that map one of
 * its files (itself included; 0 elsewhere, or when there are none). */
int64_t data_node_bytes(const DataSet *d, int *sharers);
/* 0 when DP_DATA_SHARE=0 in the environment: every rank loads its own. */
int data_share_wanted(void);
/* The leader's shared-memory file of size bytes, mapped read-write (seg
 * made, its descriptor in seg->fd), or NULL (nothing made; the caller
 * allocates privately). */
void *data_share_create(ShareSeg *seg, int64_t size);
/* A source (IDX or .npy: data_load_file) of every rank of the node, one
 * copy: every node rank calls it for the same sources in the same order,
 * skip set on a rank that has already failed (it still takes part). 0, or
 * -1 with c->e (the leader's error on every rank). */
int data_share_load(LoadCtx *c, const DataShare *sh, int skip, DataSource *d);

#endif
