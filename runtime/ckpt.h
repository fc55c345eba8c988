/*
 * ckpt.h - training-state checkpoints (runtime/ckpt.c; docs/CHECKPOINTS.md).
 *
 * A checkpoint is a directory DIR/step-NNNNNN holding the whole training
 * state after NNNNNN optimizer steps: every parameter (the master copy the
 * optimizer updates) and its optimizer state (AdamW's exp_avg and
 * exp_avg_sq, SGD's momentum_buffer), by the DSL's names and whole shapes,
 * plus state.json: the step (which fixes the lr schedule position, the
 * sampler's epoch and position and every random number: the sampler and the
 * initialisers are counter-based on (seed, step), there is no other random
 * state), the loss, and what identifies the model and the run. Two forms,
 * as PyTorch FSDP's state_dict_type:
 *   full:    model.safetensors (parameters by DSL name: loads in PyTorch
 *            and with --init-from) and optimizer.safetensors (NAME.exp_avg,
 *            ...), gathered to rank 0 one tensor at a time and written there;
 *   sharded: shard-RRRRR-of-WWWWW.safetensors, written by every rank in
 *            parallel: the elements it owns (a replicated element is owned
 *            by the lowest rank holding it) and a table saying which
 *            elements of which whole tensor they are.
 * State that is each rank's own (gradient compression's error feedback and
 * Q) is no piece of a whole tensor: every rank writes it to a file of its
 * own beside either form (ckpt_rank.c).
 * Either form loads at any world size, strategy or tp: every rank reads
 * the pieces of the whole tensors its own tensors hold ("loading
 * reshards"); at the same layout that is an exact copy, so a resumed run
 * continues bitwise.
 *
 * Where each element of each whole tensor lives on this rank is found by
 * reading the step file's init program (INIT writes a whole parameter,
 * SHARD cuts this rank's block, ...) over the arena, keeping what lands in
 * persistent tensors, and pairing the parameters the optimizer updates
 * with its state tensors (ADAMW's m and v, SGD's momentum): no compiler
 * support is needed and any strategy's layout is covered.
 *
 * Atomicity (ckpt_dir.c): files go to DIR/step-NNNNNN.dptmp/, state.json
 * is written last, the directory is fsync'ed and renamed to
 * DIR/step-NNNNNN (exchanged with it when that step exists), then
 * DIR/latest (a file naming it, written atomically) is updated and older
 * checkpoints beyond the newest `keep` are removed. A kill at any point loses no
 * checkpoint that was complete: the next run renames a complete .dptmp
 * back and removes the rest. Every file carries CRC-32C checksums per
 * 1 MiB block in state.json, verified as it is loaded, and the loaded
 * state must be finite (ckpt_load.c).
 */
#ifndef DP_CKPT_H
#define DP_CKPT_H

#include "exec.h"
#include "world.h"

typedef enum {
	CKPT_FULL,    /* consolidated on rank 0 (FULL_STATE_DICT) */
	CKPT_SHARDED, /* one file per rank (SHARDED_STATE_DICT) */
} CkptForm;

typedef struct Ckpt Ckpt;

/* What a checkpoint's state.json records about the run besides tensors. */
typedef struct {
	uint64_t step;        /* optimizer steps done (the next one is step) */
	double loss;          /* the loss of the last of them */
	int64_t train_samples; /* samples of the train split, for the sampler position */
	ExecAmp amp;          /* loss scaling's state after step (with loss scaling) */
	int have_amp;         /* the checkpoint holds amp (ckpt_load; a run without loss
	                         scaling saves none) */
} CkptRun;

/* This rank's layout of the training state (local: no communication).
 * step_path names the step file in state.json. */
int ckpt_new(Ckpt **out, Exec *x, World *w, const char *step_path, RtErr *e);
void ckpt_free(Ckpt *c);
/* Bytes of one checkpoint on disk, all ranks together (about). */
int64_t ckpt_bytes(const Ckpt *c);
/* Parameters of the model (the sum of their whole sizes), for MFU. */
int64_t ckpt_params(const Ckpt *c);

/* What a run will do with its save directory. */
typedef struct {
	int64_t saves;  /* checkpoints it writes at most (save_every and the end) */
	int keep;       /* the newest kept (keep_last); 0: all */
	int fresh;      /* it does not resume */
	int overwrite;  /* --overwrite: a fresh run may replace another run's checkpoints */
} CkptDirPlan;

/* Rank 0, before the load: create DIR if needed and check it is writable;
 * a fresh run into a directory that holds checkpoints is refused unless
 * plan->overwrite (docs/CHECKPOINTS.md). */
int ckpt_prepare_dir(Ckpt *c, const char *dir, const CkptDirPlan *plan, RtErr *e);
/* Rank 0, after the load, before training: what killed saves left (a
 * complete copy whose checkpoint is missing takes its name, the rest is
 * removed, a dangling `latest` is repaired) and room for the checkpoints
 * the plan keeps at once. */
int ckpt_clean_dir(Ckpt *c, const char *dir, const CkptDirPlan *plan, RtErr *e);
/* Every rank: save the state after run->step steps as DIR/step-NNNNNN, then
 * point DIR/latest at it and keep the newest `keep` (0: all). A
 * collective; agreed: 0 on every rank or -1 on every rank. *path (rank 0,
 * malloc'd, may be NULL) gets the checkpoint's path, *bytes its size. */
int ckpt_save(Ckpt *c, const char *dir, CkptForm form, const CkptRun *run, int keep,
	      char **path, int64_t *bytes, RtErr *e);

/* The checkpoint directory --resume ARG names: a checkpoint itself (a
 * directory with state.json), or for a save directory (ARG, or ARG/latest)
 * the checkpoint `latest` names (through the complete copy a killed save
 * left when that is missing), else its newest complete one. *dir and
 * *parent (the save directory it lives in) malloc'd; *note (malloc'd or
 * NULL) says how when not through `latest`. Reads only. */
int ckpt_resolve(const char *arg, char **dir, char **parent, char **note, RtErr *e);
/* --auto-resume: the checkpoint the save directory dir holds, as
 * ckpt_resolve finds it: 1 found (*dir, *note malloc'd), 0 none (or no
 * directory), -1 error. */
int ckpt_find(const char *savedir, char **dir, char **note, RtErr *e);
/* Load the checkpoint in dir into this rank's tensors (after the init
 * program ran) and fill *run. Refused, naming what differs, when it is of
 * another model (parameters, optimizer), seed or global batch; changed
 * hyperparameters are only noted in *notes (malloc'd text, or NULL).
 * Local: every rank reads what it needs. */
int ckpt_load(Ckpt *c, const char *dir, CkptRun *run, char **notes, RtErr *e);

#endif
