/*
 * ckpt_int.h - what the checkpoint files share (ckpt_layout.c: this rank's
 * layout and the ownership; ckpt.c: saving; ckpt_load.c: loading). Not a
 * public interface: ckpt.h is.
 */
#ifndef DP_CKPT_INT_H
#define DP_CKPT_INT_H

#include "ckpt.h"
#include "settings.h"

struct cJSON;

#define CKPT_FORMAT "dp-checkpoint"
#define CKPT_VERSION 2         /* 2: checksums in state.json; 1 (none) still loads */
#define CKPT_VERSION_RANK 3    /* 3: a version-2 checkpoint with rank files (ckpt_rank.c) */
#define CKPT_SUM_ALGORITHM "crc32c"
#define CKPT_MAX_COMP 3       /* the parameter + up to two optimizer states */
#define CKPT_STATE "state.json"
#define CKPT_LATEST "latest"

/* A run of n elements of whole tensor ent, from element full, held in
 * this rank's tensor root from element at. */
typedef struct {
	int32_t ent, root;
	int64_t at, full, n;
} Seg;

/* What the ranks exchange: a master segment without this rank's places. */
typedef struct {
	int32_t ent, pad;
	int64_t full, n;
} Range;

typedef struct {
	int32_t name;              /* tensor id whose name it has */
	int ndim;
	int64_t dims[DP_MAX_DIMS]; /* whole shape */
	int64_t numel;
} Entry;

struct Ckpt {
	Exec *x;
	const DpStep *s;
	World *w;
	char *step_path;
	uint32_t step_crc;
	Entry *ent;
	int nent;
	int ncomp;                     /* 1 + optimizer states */
	const char *comp[CKPT_MAX_COMP]; /* "", "exp_avg", "exp_avg_sq" / "momentum_buffer" */
	Seg *fill[CKPT_MAX_COMP];      /* every place of this rank, per component */
	int nfill[CKPT_MAX_COMP];
	Seg *save[CKPT_MAX_COMP];      /* masters; save[c][i] is save[0][i]'s state c */
	int nsave;
	uint32_t *recast;              /* the init program's CASTs (instruction indices): */
	int nrecast;                   /* the compute copies a load derives again, */
	Seg *cast_in;                  /* from these places of their inputs outside */
	int ncast_in;                  /* the roots (root: the input tensor) */
	/* ownership, after the first save: */
	int planned;
	Range *owned;                  /* every rank's owned pieces, rank by rank */
	int *owned_src;                /* for this rank's: the save segment it lies in */
	int64_t *owned_off;            /* owned[] of rank r start at owned_off[r] */
	int64_t *ent_count;            /* [nent * size]: elements rank r owns of entry e */
	/* rank-local state (ckpt_rank.c): */
	int32_t *rank_t;               /* its tensors, in step-file order (every rank's
	                                  list: pp > 1 included) */
	int nrank;
	unsigned char *rank_here;      /* per rank_t: this rank holds it (at pp > 1 a
	                                  stage's own, passes/stage_params.c) */
	int *rank_holders;             /* per rank_t: how many ranks of the world hold it */
	int64_t rank_elems;            /* their elements on this rank */
	/* the save directory (ckpt_dir.c): */
	int overwrite;                 /* --overwrite of another run's checkpoints */
	long long *stale;              /* their steps, removed at the first save */
	int nstale;
};


/* ckpt_layout.c */
/* The optimizer's kind as state.json names it ("adamw"). */
const char *ckpt_opt_name(const DpStep *s);
const char *ckpt_ent_name(const Ckpt *c, int e);
void ckpt_dims_str(char *buf, size_t len, int ndim, const int64_t *dims);
/* "fc1.w", "fc1.w.exp_avg", ...: component cc of entry k. */
void ckpt_comp_name(const Ckpt *c, int cc, int k, char *buf, size_t len);
/* state.json's model.hash: crc32 of "NAME[D0,D1];" per whole tensor, in
 * order, then "optimizer:KIND" (DpOptKind); h starts at 0. */
uint32_t ckpt_hash_tensor(uint32_t h, const char *name, int ndim, const int64_t *dims);
uint32_t ckpt_hash_end(uint32_t h, unsigned opt_kind);
/* Samples per optimizer step. */
int64_t ckpt_global_batch(const DpStep *s);
/* Exchange the masters; fill owned, owned_src, owned_off, ent_count. A
 * collective. */
int ckpt_plan(Ckpt *c, RtErr *e);

/* A file of a checkpoint, as state.json lists it. */
typedef struct {
	char name[64];
	int64_t bytes;
	uint32_t *crc; /* CRC-32C per ST_SUM_BLOCK bytes (malloc'd) */
	int64_t ncrc;
} CkptFile;

/* state.json as ckpt_state_check read it. */
typedef struct {
	int version;
	int sharded;         /* the form: 0 full, 1 sharded */
	uint64_t step;
	double loss;
	int64_t train_samples;
	ExecAmp amp;         /* loss_scale: fp16's loss scaling state, when have_amp */
	int have_amp;
	int world_size;      /* written_by.world_size */
	int rank_files;      /* rank_state: its files (written_by.world_size), else 0 */
	CkptFile *files;     /* crc NULL in version 1 */
	int nfiles;
} CkptState;

/* ckpt_state.c */
/* Every field of state.json (js, of the checkpoint in dir) of its type and
 * range, and the fields that depend on each other against each other:
 * 0 with *st filled, or -1 naming the field. */
int ckpt_state_check(const Ckpt *c, const char *dir, const struct cJSON *js, CkptState *st,
		     RtErr *e);
void ckpt_state_free(CkptState *st);

/* ckpt_rank.c */
/* Find this rank's rank-local state tensors (c->rank_t). */
int ckpt_rank_find(Ckpt *c, RtErr *e);
/* Write this rank's file of rank-local state into tmpdir (every rank,
 * when c->nrank); *file gets its name, size and checksums. */
int ckpt_rank_save(Ckpt *c, const char *tmpdir, CkptFile *file, RtErr *e);
/* state.json's "rank_state" (when c->nrank). */
void ckpt_rank_json(const Ckpt *c, struct cJSON *o);
/* Load the rank-local state of the checkpoint in dir (st: its state.json;
 * its rank files are the last st->rank_files of st->files); what this run
 * cannot take from it is noted in *notes. Local. */
int ckpt_rank_load(Ckpt *c, const char *dir, const CkptState *st, char **notes, RtErr *e);

/* ckpt_load.c */
/* Append a formatted line to *notes (malloc'd text). */
void ckpt_note(char **notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ckpt_dir.c */
/* Remove a checkpoint directory (flat: files only) or a file. */
int ckpt_remove_tree(const char *path);
/* state.json of the checkpoint in dir, parsed (a JSON object with this
 * format's name), or NULL with err. */
struct cJSON *ckpt_state_parse(const char *dir, char *err, size_t errlen);
/* 1 when path is a checkpoint whose state.json lists files that are all
 * there with their sizes. */
int ckpt_dir_complete(const char *path);
/* Rank 0: the checkpoint written into tmpdir gets state (state.json's
 * text) and is published as dir/name: swapped in, latest, keep_last. */
int ckpt_publish(Ckpt *c, const char *dir, const char *name, const char *tmpdir, const char *state,
		 int keep, uint64_t step, RtErr *e);

/* Host copies of the tensors a list of segments lives in (exec_tensor_read). */
typedef struct {
	int32_t *id;
	float **data;
	int n;
} Hosts;

int ckpt_hosts_read(Ckpt *c, const Seg *seg, int nseg, Hosts *h, RtErr *e);
float *ckpt_host_of(const Hosts *h, int32_t id);
void ckpt_hosts_free(Hosts *h);

#endif
