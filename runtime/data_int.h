/*
 * data_int.h - what the data files of the runtime share (not part of the
 * runtime's interface, which is the data_* section of rt.h).
 *
 * A split's data set (runtime/data.c) holds one DataSource per source of the
 * step file; it opens each by its kind, one file per kind:
 *   data_idx.c        gzip/plain reading and IDX (MNIST) files
 *   data_npy.c        .npy arrays
 *   data_tokens.c     llm.c token shards, read a window at a time
 *   data_synth.c      synthetic classification data
 *   data_positions.c  token positions (and the zigzag cut of context parallelism),
 *                     and the sample keys of dropout
 *   data_sampler.c    the DistributedSampler order and the batch fills
 *   data_share.c      IDX and .npy sources loaded once per node (data_share.h)
 * The formats' headers are parsed by util/datafile.c, which dpc uses too.
 */
#ifndef DP_DATA_INT_H
#define DP_DATA_INT_H

#include <zlib.h>

#include "datafile.h"
#include "rt.h"

#define DATA_GOLDEN 0x9e3779b97f4a7c15ull
#define DATA_MSG 1024 /* a util/datafile.h message (an RtErr holds as much) */

/* One token shard: an open file. */
typedef struct {
	int fd;          /* -1 when not open */
	char *path;
	int64_t ntok;    /* tokens after the header */
	int64_t first;   /* index of its first sample in the concatenation */
} TokShard;

/* One loaded source: n samples of `elems` elements, 4 bytes each (float or
 * int32) or, for IDX images (bytes), one byte each, made floats in [0, 1]
 * as a batch is filled: a rank holds the file's bytes, not 4x as much. */
typedef struct {
	int loaded;    /* belongs to this split */
	int role;      /* 0 features, 1 labels */
	int64_t limit; /* labels and token ids must be < limit (0: no check) */
	char where[512]; /* "models/mlp.dp:8", for errors while filling */
	int64_t n;     /* samples */
	int64_t elems; /* elements per sample */
	int bytes;     /* 1: data holds unsigned bytes, read as (float)byte / 255.0f */
	void *data;    /* n * elems floats, int32s or (bytes) unsigned chars; NULL for tokens */
	size_t mapped; /* bytes of data mapped from the node's shared copy (data_share.c;
	                  munmap), 0: malloc'd */
	int sharers;   /* on the node's first rank: the ranks that map its copy */
	/* tokens only: */
	int tokens;    /* 1: samples come from shards[], not data */
	int shift;     /* window offset (0 inputs, 1 targets) */
	int64_t window; /* tokens of a sample in the shard: elems, or elems * cp when the
	                   sequence is split over the cp ranks (seq_split) */
	/* positions: every "sample" is this rank's positions (no samples of its own) */
	int positions;
	/* sample keys: per sample of a batch its dataset index and the step (train),
	 * -1 and -1 (eval); no samples of its own (data_positions.c) */
	int keys;
	int nshards;
	TokShard *shards; /* first ascending */
} DataSource;

/* What filling a batch changes, behind a const DataSet (the executor of
 * one rank is single-threaded): the permutation of the epoch last asked
 * for, the read buffer of token samples, and the first error. */
typedef struct {
	int valid;
	uint64_t seed, epoch;
	int64_t *perm;     /* n entries, allocated by data_open for the train split */
	unsigned char *tok; /* 2 * the longest token sample */
	int failed;
	RtErr err;
} DataState;

struct DataSet {
	DpSplit split;
	int cp, cp_rank;    /* context parallelism: the cp ranks, this rank's coordinate */
	int64_t n;          /* samples, the same for every source */
	uint32_t nsources;  /* = s->nsources; slots of other splits are unloaded */
	DataSource *src;
	DataState *st;
};

/* The shared-memory file a node's leader loads a source into
 * (data_share.c). */
typedef struct {
	int fd;        /* memfd_create's, while made */
	int made;      /* data_alloc made it (else its memory is malloc'd) */
	int64_t size;  /* bytes */
} ShareSeg;

/* Context of one source load: for messages. */
typedef struct {
	const char *path;  /* file path, or "synthetic" */
	char where[512];   /* "models/mlp.dp:8" */
	RtErr *e;
	int cp, cp_rank;   /* the DataSet's */
	const DpSource *rec; /* the source */
	int dtype;         /* of its tensor */
	ShareSeg *seg;     /* non-NULL: data_alloc puts the data in a node-shared file */
} LoadCtx;

/* ---- data.c: the data set ---- */

const char *data_dtype_name(int dtype);
/* n * elems * 4 bytes, or -1 when that overflows or is absurd. */
int64_t data_bytes(int64_t n, int64_t elems);
/* d->data for n samples of elems elements of elem_bytes (4, or 1 for
 * d->bytes; sizes checked as 4-byte elements): in c->seg's shared object
 * when there is one and it can be made, else malloc'd. */
int data_alloc(LoadCtx *c, DataSource *d, int64_t n, int64_t elems, int elem_bytes);
/* An IDX or .npy source (c->rec) loaded into d, its labels checked. */
int data_load_file(LoadCtx *c, DataSource *d);
/* Sample idx of any source into out (elems 4-byte elements). */
void data_copy_sample(const DataSet *d, const DataSource *ds, int64_t idx, void *out);
/* Keep the first error of a batch fill (data_error reports it). */
void data_fill_failed(const DataSet *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- the kinds of source, each filling d (c names the file and line) ---- */

/* data_idx.c: open the file (gzip or plain); a util/datafile.h message as an RtErr */
int data_gzopen(LoadCtx *c, gzFile *out);
int data_read_exact(LoadCtx *c, gzFile gz, void *buf, int64_t len, const char *what);
int data_df_fail(LoadCtx *c, const char *msg);
int data_load_idx(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d);
int data_load_npy(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d);
int data_load_synthetic(LoadCtx *c, const DpStep *s, const DpSource *rec, int dtype,
			DataSource *d);
int data_load_tokens(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d);
void data_close_shards(DataSource *d);
/* Sample idx of a token source into out[0..elems), widened to int32 (zeros
 * after an error, kept by data_fill_failed). */
void data_token_sample(const DataSet *d, const DataSource *ds, int64_t idx, int32_t *out);
int data_load_positions(LoadCtx *c, uint32_t idx, const DpSource *rec, int dtype,
			DataSource *d);
int data_load_keys(LoadCtx *c, uint32_t idx, const DpSource *rec, int dtype, DataSource *d);
/* data_positions.c: this rank's positions of the tokens of a sample */
void data_fill_positions(const DataSet *d, const DataSource *ds, int32_t *out);
/* The position in the whole sequence of local row j of cp rank r (the
 * zigzag layout of format/ops.def). */
int64_t data_zigzag_pos(int64_t r, int64_t j, int64_t cp, int64_t window);

#endif
