/*
 * shard.h - the sharding plan shared by the passes layout, setup and
 * collectives (internal to passes/).
 *
 * What each data-parallel strategy does is one row of shard_strategies
 * (passes/shard.c). The layout pass reads it to group the parameters into
 * units and lay out the flat buffers, and leaves the result, a ShardPlan, on
 * the graph (Graph.shard); setup writes the INIT and EXPORT programs from
 * the plan, and collectives inserts each unit's collectives as its
 * strategy's row says. The plan is not printed, but everything it holds is
 * in the IR: the passes after layout find it again in the graph
 * (layout_plan), so they run the same on a dump read back (dpc --from-ir)
 * as in the run that made it.
 */
#ifndef DP_SHARD_H
#define DP_SHARD_H

#include "passes.h"

/* How a unit's gradients are reduced over the data-parallel axes. */
typedef enum {
	SHARD_ALL_REDUCE,     /* all_reduce in place over dp_replicate,dp_shard (ddp) */
	SHARD_ALL_REDUCE_CUT, /* the same, then SHARD cuts this rank's slice (zero1) */
	SHARD_REDUCE_SCATTER, /* reduce_scatter over dp_shard into this rank's slice,
	                         then the replicate all_reduce below */
} ShardReduce;

/* When a reduce_scattered shard is also all_reduced over dp_replicate. */
typedef enum {
	SHARD_REPL_IF_MESH, /* when dp_replicate > 1 */
	SHARD_REPL_ALWAYS,  /* always: a group of one on a 1-D mesh (hybrid_shard) */
} ShardRepl;

/* One data-parallel strategy (a row per DpStrategy). */
typedef struct {
	uint8_t cut;      /* params, grads and optimizer state padded and cut over
	                     dp_shard: rank s updates slice s of each unit */
	uint8_t gathered; /* no persistent full params: each block's params are
	                     all_gathered into a temporary before the forward (and
	                     again before the backward when resharding); the unit
	                     is the block. Otherwise units are buckets and a cut
	                     unit's updated shards are all_gathered back into the
	                     persistent full params after the update */
	uint8_t reduce;   /* ShardReduce */
	uint8_t repl;     /* ShardRepl, for SHARD_REDUCE_SCATTER */
} ShardStrategy;

extern const ShardStrategy shard_strategies[DP_NSTRAT]; /* ORDER DpStrategy */

/*
 * A unit: parameters contiguous in the full (unsharded) space, reduced and
 * gathered by one collective call each (the unit is the bucket). Every
 * trained parameter is in exactly one unit; units are in the order their
 * last gradient completes in the backward.
 */
typedef struct {
	const char *name;  /* block name, or "bucketK"; ".tp" appended for tp-split params */
	int block;         /* block index, -1 when it spans blocks */
	int *params;       /* parameter ids, layout order */
	int nparams;
	int strat;         /* DpStrategy of its parameters' block */
	int cut;           /* cut over dp_shard (shard_strategies[strat].cut) */
	int gathered;      /* params gathered for compute (shard_strategies[strat].gathered) */
	int full_grads;    /* full gradients persistent (zero1, zero2, gathered units
	                      with accumulate_grads unsharded); otherwise they are a
	                      temporary of each micro-batch, reduce_scattered into
	                      ".rs" and accumulated into the shard one unit later,
	                      also when grad_accum is 1: the accumulate is where the
	                      step waits for that reduce_scatter, which frees the
	                      unit's unsharded gradients while the next unit computes.
	                      Uncut units accumulate in place */
	int reshard;       /* gathered: gathered again for the backward */
	int group;         /* the optimizer group of its params (ShardPlan.group_of) when it
	                      is cut: a cut unit never mixes groups, so every rank's chunk
	                      of it updates with one group's hyperparameters; 0 when uncut */
	int stage;         /* the pipeline stage that keeps its params when each stage keeps
	                      its own (stages_split_params; a unit never mixes stages), -1:
	                      every stage (a tied parameter's unit; every unit otherwise) */
	int tp;            /* its params are split over tp (tp > 1): a unit of a sharded
	                      graph never mixes split and replicated params, so the
	                      gradient norm can weight its shard as a whole */
	int64_t elems, padded, chunk; /* chunk = padded / (cut ? S : 1) */
	int64_t row;       /* compressed hybrid_shard unit: the chunk is a whole number of
	                      rows this long (shard_row), which passes/compress.c views it
	                      as a matrix of; 0 otherwise */
	int64_t loff;      /* element offset of this rank's part (shard buffers, opt.*) */
	int64_t foff, goff; /* element offsets in the full flat.params / flat.grads, -1 none */
	int first, last;   /* node indices of the first and last backward writer of
	                      its grads (shard_unit_spans), -1: nothing writes them
	                      (they stay zero and need no collective) */
	/* Value ids, -1 where the unit has none. In a graph where every unit is
	 * uncut (all ddp) a unit has no values of its own: its params and grads
	 * are views of flat.params / flat.grads and the collectives pass makes
	 * the view its all_reduce runs on. */
	int full_p, full_g;     /* the unit's full params and grads (views or temporaries) */
	int shard_p, shard_g;   /* this rank's part: views of the shard buffers */
	int gather, gather_bwd; /* gathered: the gathered temporaries (forward, backward) */
	int *bwd_params;        /* gather_bwd: per param, its "p.bwd" view the backward reads */
	int rs;                 /* reduce_scatter output when it is accumulated, or -1 */
	/* Mixed precision (passes/precision.c gave each param the dtype its block
	 * computes in): a bf16 unit's params are compute copies; its f32
	 * masters are what the optimizer updates, INIT writes and EXPORT saves. */
	int dtype;              /* DpDtype its params are computed in */
	int shard_c;            /* bf16, cut: the compute copy of this rank's part (a view of
	                           ShardPlan.copy the optimizer writes and the all_gathers
	                           read); -1 otherwise */
	int master;             /* bf16: the unit's f32 masters whole, where INIT writes and
	                           EXPORT gathers them: a temporary "U.master" (cut), its
	                           shard view (uncut, sharded graph), flat.params (all
	                           ddp); -1 when the params are their own masters (f32) */
	int *masters;           /* per param: the f32 value INIT writes and SAVE reads (the
	                           param itself, or its "p.master" view of master) */
} Unit;

typedef struct ShardPlan {
	int S, R;          /* ranks in the cut axes (dp_shard), in dp_replicate */
	int sharded;       /* some unit is cut: shard buffers, unit values */
	int flat_params, flat_grads;   /* "flat.params", "flat.grads" */
	int shard_params, shard_grads; /* the shard buffers (sharded only, else -1) */
	int64_t ftot, gtot; /* elements of the full flat.params / flat.grads (sharded; 0: none) */
	int half;          /* the 16-bit dtype parameters are computed in (DP_BF16 or
	                      DP_F16; one per model), or -1: every param is f32 */
	int copy;          /* the 16-bit compute copy beside the f32 masters the optimizer
	                      updates ("flat.params.bf16" all ddp, "flat.params.shard.bf16"
	                      sharded, ".f16" for f16; the same elements), or -1 */
	int full16;        /* sharded: "flat.params.bf16" (f16), the full 16-bit params of
	                      cut, not gathered 16-bit units (zero1, zero2), or -1 */
	int64_t ftot16;    /* its elements */
	/* Optimizer groups (ir_param_group): group 0 is the optimizer's own
	 * (its weight_decay, lr scale 1), the others numbered by their first
	 * parameter in value order. */
	int *group_of;     /* per value id: its group (trained params), else -1 */
	float *group_wd, *group_lr_scale;
	int *group_offload; /* the group's offload (ir_block_offload): per-block offload
			       makes a group of its own, so each update has one */
	int ngroups;
	Unit *u;
	int nu;
} ShardPlan;

/* The plan of g's layout: the one the layout pass left on g, else the one
 * layout_plan finds in the graph; NULL after reporting a graph the layout
 * pass cannot have made. */
ShardPlan *shard_plan(Graph *g, Diag *d);
/* passes/layout.c: the plan of a laid-out graph, found in the graph
 * itself (its units decided again, their values found by name); it is left
 * on g. NULL after reporting (through d) what does not fit. */
ShardPlan *layout_plan(Graph *g, Diag *d);

/* The axes a gradient is summed over (dp_replicate x dp_shard, cp: its
 * ranks hold other tokens of the same samples, and pp: each stage holds the
 * part of its own blocks, passes/p2p.c), and the group a cut unit is
 * sliced over (dp_shard, and cp: FSDP over dp_shard x cp; rank s of it holds
 * slice s), and the axes a reduced slice is then summed over (dp_replicate,
 * and pp: a stage's slice of a zero2 unit holds its own blocks' part). With
 * cp = 1 none names cp, with pp = 1 none names pp. */
unsigned shard_dp_axes(const Graph *g);
unsigned shard_cut_axes(const Graph *g);
unsigned shard_repl_axes(const Graph *g);
/* The row length of unit u's chunk when its dp_replicate all_reduce is
 * compressed (passes/compress.c), else 0 (passes/layout.c pads to it). */
int64_t shard_row(const Graph *g, const Unit *u);

/* The dim a tensor-parallel parameter is split along over tp, or -1. */
int shard_tp_dim(const Graph *g, const Value *p);

/* Backward writers of every gradient among the first n nodes: per value id,
 * the index of its first and last PH_BWD step writer (-1: none). Arrays from
 * the graph's pool. */
void shard_writers(Graph *g, int n, int **first, int **last);

/* Sets every unit's first and last from the per-value writers. */
void shard_unit_spans(ShardPlan *pl, const Graph *g, const int *first, const int *last);

/* A collective on the comm stream over the mesh axes `axes` (PH_SETUP in
 * the EXPORT program, else PH_COMM). */
Node *shard_comm_node(Graph *g, IrOp op, int out, int nin, const int *in, unsigned axes,
		      unsigned flags, unsigned progs, int block);

#endif
