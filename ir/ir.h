/*
 * ir.h - the graph IR shared by the front end, the passes and the step-file writer.
 *
 * One header, divided into sections per source file (chibicc style).
 *
 * Model. A Graph holds Values (tensors) and Nodes (ops) in program order. Each
 * node reads its `in` values and writes its `out` value. Values produced by a
 * node are SSA temporaries; persistent state (parameters, gradients, optimizer
 * state, flat buffers, data batches, metrics) is declared, not produced, and
 * may be written by several nodes (accumulating matmuls, in-place collectives,
 * the optimizer). A value may be a view into a flat buffer (view_of /
 * view_offset): gradients are views of the flat gradient buffer and a bucket
 * is a view covering several of them, so a bucket's collective is zero-copy.
 * Dependencies between nodes are therefore computed from what memory they read
 * and write (ir_overlaps), not from SSA edges alone.
 *
 * Ops are the opcodes of stepfile.h: one row per op in format/ops.def gives its
 * name, arity, shape, gradient, cost, tp and batch rules (ir_ops, ir/ops.c).
 *
 * Memory. Everything the compiler allocates comes from the graph's pool and is
 * freed at once by ir_free (QBE/chibicc style).
 */
#ifndef DP_IR_H
#define DP_IR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "settings.h"
#include "stepfile.h"

/* ---- source locations and diagnostics (ir/diag.c) ---- */

typedef struct {
	const char *file; /* NULL when the node was made by a pass with no user origin */
	int line, col;    /* 1-based */
} Loc;

typedef struct Diag Diag;

/* Collects user errors: file:line:col: error: message, source line, caret. */
struct Diag {
	FILE *out;         /* where messages go (stderr) */
	const char *file;  /* file name shown */
	const char *src;   /* whole source text, for the quoted line; may be NULL */
	int nerrors;
	int max_errors;    /* stop reporting after this many (0: unlimited) */
};

void diag_init(Diag *d, FILE *out, const char *file, const char *src);
void error_at(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void verror_at(Diag *d, Loc loc, const char *fmt, va_list ap);
/* file:line:col: warning: message, with the line and caret: not an error
 * (nerrors and max_errors are not touched). */
void warning_at(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Internal bug: message and abort. Never for user errors. */
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- pool, values, nodes, graph (ir/ir.c) ---- */

typedef struct Pool Pool;

typedef DpOp IrOp; /* ops are the step file's opcodes: format/ops.def */

/* Phase of a node, for printing and scheduling. */
typedef enum {
	PH_DATA,  /* loads the batch */
	PH_FWD,   /* forward */
	PH_BWD,   /* backward */
	PH_COMM,  /* collectives and their events */
	PH_OPT,   /* clipping and optimizer update */
	PH_EVAL,  /* evaluation-only (loss sum, correct count) */
	PH_SETUP, /* the INIT and EXPORT programs (init, shard, gather, save) */
} Phase;

/* Which programs a node belongs to (bit mask). */
#define IR_IN_STEP 1u /* DP_PROG_STEP */
#define IR_IN_EVAL 2u /* DP_PROG_EVAL */
#define IR_IN_INIT 4u /* DP_PROG_INIT */
#define IR_IN_EXPORT 8u /* DP_PROG_EXPORT */
#define IR_IN_SAMPLE 16u /* DP_PROG_SAMPLE (passes/sample.c; printed `sample`) */
#define IR_ALL_PROGS 31u
/* The program bit of DpProgram p. */
#define IR_PROG_BIT(p) (1u << (p))

typedef struct {
	uint8_t kind; /* DpPlace */
	int8_t dim;   /* sharded dim when kind == DP_PL_SHARD, else -1 */
} Place;

/* Graph.pipeline: format/settings.def's PIPELINE words, in order. */
typedef enum {
	IR_PIPE_1F1B,        /* pipedream_flush */
	IR_PIPE_GPIPE,       /* gpipe */
	IR_PIPE_ZERO_BUBBLE, /* zero_bubble (ZB-H1) */
	IR_PIPE_INTERLEAVED, /* interleaved (Megatron's virtual stages, stages_per_rank) */
} IrPipeline;

typedef struct Value {
	int id;                    /* index in Graph.values */
	const char *name;          /* unique; printed as %name */
	DpDtype dtype;
	int ndim;
	int64_t dims[DP_MAX_DIMS]; /* per-rank shape */
	DpTensorKind kind;
	Place place[DP_MAX_AXES];  /* per mesh axis */
	DpInit init;               /* parameters only */
	float init_a, init_b;
	int view_of;               /* value id of the flat buffer this views, or -1 */
	int64_t view_offset;       /* element offset inside view_of */
	int grad;                  /* parameter: its gradient value; else -1 */
	int param;                 /* gradient: its parameter value; else -1 */
	int block;                 /* index into Graph.blocks, or -1 */
	int source;                /* data tensors: index into Graph.sources (train), or -1 */
	int def;                   /* node that produces it (SSA temporaries), or -1 */
	int space;                 /* DpSpace: the arena it lives in (offload: host) */
	int64_t offset;            /* byte offset in its space's arena; -1 until memory planning */
	int64_t nbytes;            /* bytes reserved in the arena (>= ir_span * size) */
	int64_t ld;                /* row stride in elements when its rows are padded (> the
	                              last dim: passes/padvocab.c, printed ld=N); 0: dense */
	int8_t batch_dim;          /* per-sample values: the dim that indexes samples; -1:
	                              none (parameters, reductions). Data has it at 0; ops
	                              carry it (ir_batch_rule). Not printed: the shape pass
	                              derives it. */
	int8_t seq_dim;            /* token data and what follows it: the sequence dim, or -1 */
	Loc loc;
} Value;

typedef struct Node {
	int id;                   /* unique, stable across passes */
	IrOp op;
	int nin;
	int in[DP_MAX_IN];        /* value ids read */
	int out;                  /* value id written, or -1 */
	int64_t ia[DP_NIATTR];    /* integer attributes: DP_ATTR(n, OP, name) (stepfile.h) */
	float fa[DP_NFATTR];      /* float attributes: DP_FATTR(n, OP, name) */
	Phase phase;
	unsigned progs;           /* IR_IN_STEP | IR_IN_EVAL */
	unsigned flags;           /* DP_IF_LAST */
	int stream;               /* DpStream */
	int recompute;            /* 1: a copy of a forward node, re-run before its block's
	                             backward (passes/recompute.c); printed `recompute` */
	int bucket;               /* bucket index for collectives, or -1 */
	int offload;              /* an update (ADAMW, SGD): the offload of the blocks it
	                             updates (the layout pass splits updates where it
	                             changes); -1: Graph.offload (train's). Printed
	                             `offload=W` where it is not train's */
	int block;                /* block it computes for, or -1 */
	int stage;                /* the pipeline stage that runs it (pp > 1, from passes/p2p.c
	                             on), or -1: every rank; printed `stage=N` */
	int chunk;                /* under `pipeline interleaved`: the virtual stage (0 to
	                             pp x stages_per_rank - 1) whose slot it belongs to, stage
	                             = chunk mod pp (passes/p2p.c); else -1. Printed `chunk=N` */
	Loc loc;
} Node;

/* A block: the unit full_shard gathers and frees together, and the unit a
 * strategy can be overridden for (`strategy ddp` inside the block). */
typedef struct {
	const char *name;         /* as written in the DSL: fc1 */
	Loc loc;
	int strategy;             /* DpStrategy overriding train's, or -1: train's */
	int reshard;              /* reshard_after_forward for this block: 0, 1, or -1: train's */
	int recompute;            /* 1: keep only the block's inputs after its forward and
	                             run the forward again before its backward (activation
	                             recompute, passes/recompute.c); 0: keep activations */
	Loc strategy_loc;         /* where the override is written (messages) */
	int param_dtype;          /* DpDtype the block's parameters are computed in (its
	                             activations too), or -1: train's (passes/precision.c) */
	int buffer_dtype;         /* DpDtype of the block's buffers, or -1: train's */
	Loc precision_loc;        /* where a precision override is written (messages) */
	int stage;                /* pipeline stage (pp axis) of the block: the block's own
	                             `stage N`, else -1 until passes/stages.c places it
	                             (-1 again at pp=1) */
	Loc stage_loc;            /* where `stage N` is written, else the block (messages) */
	int chunk;                /* under `pipeline interleaved`: the block's virtual stage
	                             (its `stage N` there, else stages auto's cut into pp x
	                             stages_per_rank), stage = chunk mod pp; else -1 */
	float weight_decay;       /* the weight decay of the block's parameters, or -1: the
	                             optimizer's (no_decay vectors still exempts its 1-D ones) */
	float lr_scale;           /* the block's parameters are updated with lr * lr_scale
	                             (1: the schedule's lr) */
	int offload;              /* the block's own `offload`: 0 none, 1 optimizer, 2 params
	                             (Graph.offload's words), or -1: train's (per-block
	                             offload, passes/offload.c) */
	int compress;             /* DpCompressKind of the block's gradients overriding
	                             train's (`compress none` in a block), or -1: train's */
	Loc compress_loc;         /* where the override is written (messages) */
} Block;

/* A data source of the DSL (the step file's DpSource plus its path text). */
typedef struct {
	DpSource rec;             /* rec.path and rec.tensor are filled by the writer */
	const char *path;         /* file path, "" for synthetic */
	int value;                /* the data value it fills */
	Loc loc;
} Source;

/* A fused collective: one call over a contiguous view of a flat buffer. */
typedef struct {
	int id;
	IrOp op;                  /* DP_OP_ALL_REDUCE, DP_OP_REDUCE_SCATTER, DP_OP_ALL_GATHER */
	unsigned axes;            /* DP_AXIS_BIT mask */
	int view;                 /* the bucket's view value */
	int64_t elems;            /* elements in the bucket */
	int nmembers;
	int *members;             /* value ids of the gradients (or params) it covers */
} Bucket;

typedef struct Graph {
	Pool *pool;
	const char *file;          /* the .dp file it came from */
	Value **values;
	int nvalues, capvalues;
	Node **nodes;              /* program order */
	int nnodes, capnodes;
	int next_node_id;
	Block *blocks;
	int nblocks, capblocks;
	Source *sources;
	int nsources, capsources;
	Bucket *buckets;
	int nbuckets, capbuckets;
	DpConfig cfg;              /* mesh, batch, steps, seed, arena size */
	DpOptim opt;
	DpSched sched;
	int no_decay;              /* optimizer groups: 1 (no_decay vectors): 1-D parameters
	                              (biases, norm gains) get no weight decay; 0: all do */
	char strategy[16];         /* "ddp", "zero1", "zero2", "full_shard", "hybrid_shard" */
	float bucket_mb;           /* bucket size limit in MiB */
	/* sharded strategies (DSL train settings, defaults in ir_new; passes/layout.c) */
	int reshard_after_forward; /* full_shard: free gathered params after forward (1) */
	int prefetch;              /* all_gathers issued this many blocks ahead (1) */
	float gather_limit_mb;     /* bound on gathered bytes in flight; 0 = none */
	int export_prefetch;       /* the EXPORT program's gathers: 0 `prefetch` ahead (the
	                              step's), 1 none: each just before its consumer */
	Loc mesh_loc;              /* where the mesh statement (or `mesh auto`) is: messages */
	int mesh_auto;             /* the mesh is `mesh auto`'s (or none, with a world size) */
	int strategy_auto;         /* train's `strategy auto`: dpc compiles the plan search's
	                              winner instead (compiler/plan.c); never a pass's input */
	int pipeline;              /* the pipeline schedule over pp stages (train's
	                              `pipeline`): an IrPipeline (passes/stages.c) */
	int stages_per_rank;       /* train's `stages_per_rank`: interleaved's virtual stages
	                              per rank (ir_chunks_per_rank) */
	int offload;               /* train's `offload`: 0 none, 1 optimizer, 2 params
	                              (passes/offload.c) */
	int pad_vocab;             /* train's `pad_vocab`: the logits' rows padded to a
	                              multiple of it (passes/padvocab.c); 0: not padded */
	int accum_unsharded;       /* full_shard + grad_accum: accumulate unsharded grads
	                              and reduce_scatter once per step (1), or
	                              reduce_scatter every micro-batch (0, default) */
	int compress_rank;         /* compress powersgd's rank (passes/collectives.c) */
	float compress_min_rate;   /* ... and its min_compression_rate */
	int compress_warm_start;   /* ... and its warm_start (0: a fresh Q every step) */
	/* mixed precision (DSL precision / param_dtype / reduce_dtype / buffer_dtype,
	 * passes/precision.c): master weights and optimizer state are always f32 */
	int param_dtype;           /* DpDtype compute reads parameters in, and activations
	                              are stored in (DP_F32 or DP_BF16; blocks may override) */
	int reduce_dtype;          /* DpDtype of the gradients: accumulated and reduced in it */
	int buffer_dtype;          /* DpDtype of `buffer` tensors (blocks may override) */
	int loss;                  /* value id of the training loss (scalar), -1 */
	int logits;                /* value id of the logits fed to cross_entropy, -1 */
	int labels;                /* value id of the labels fed to cross_entropy, -1 */
	DpMetrics metrics;         /* value ids (not tensor ids until written) */
	int nevents;
	/* filled by passes */
	struct ShardPlan *shard;   /* units and flat buffers (passes/layout.c), for the
	                              passes after it; not printed: those passes find
	                              it again in the graph (layout_plan) */
	int64_t peak_bytes;        /* arena size after memory planning */
	int64_t persistent_bytes;  /* of which params, grads, optimizer state, data, metrics */
	/* ir_find_value's index (ir.c): values by the names they were entered
	 * under, open-addressed, pool memory */
	Value **by_name;
	int by_name_cap, by_name_used;
} Graph;

Graph *ir_new(const char *file);
void ir_free(Graph *g);
void *ir_alloc(Graph *g, size_t n);            /* zeroed, from the pool */
char *ir_strdup(Graph *g, const char *s);
char *ir_fmt(Graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* New value, replicated on every axis, not a view, unplanned. name is copied. */
Value *ir_value(Graph *g, const char *name, DpDtype dt, int ndim, const int64_t *dims,
		DpTensorKind kind, Loc loc);
/* A name not used yet, from a stem: "t" -> "t3". */
const char *ir_fresh_name(Graph *g, const char *stem);
Value *ir_find_value(Graph *g, const char *name);
/* Gives v a new name (ir_find_value finds it by it from then on). */
void ir_rename_value(Graph *g, Value *v, const char *name);

/* New node appended at the end of the program; out may be -1. */
Node *ir_node(Graph *g, IrOp op, int out, int nin, const int *in, Phase ph, Loc loc);
/* New node like n (its op, phase, location, attributes, programs, flags,
 * stream, block and bucket) over values out and in[] (n->nin of them), on
 * stage k, appended as ir_node does (chunk and offload not copied). */
Node *ir_node_like(Graph *g, const Node *n, int out, const int *in, int k);
/* Insert an existing node (made by ir_node, which appended it) at position pos. */
void ir_move_node(Graph *g, Node *n, int pos);
int ir_node_index(Graph *g, const Node *n);
void ir_remove_node(Graph *g, Node *n);

int64_t ir_numel(const Value *v);
int64_t ir_span(const Value *v); /* elements it spans: ir_numel, or rows * ld when padded */
size_t ir_dtype_size(DpDtype dt);
const char *ir_dtype_name(DpDtype dt);
/* The value whose memory v lives in (follows view_of to the root). */
const Value *ir_root(const Graph *g, const Value *v);
/* Do the memory ranges of a and b overlap (same root, intersecting element ranges)? */
int ir_overlaps(const Graph *g, const Value *a, const Value *b);
/* Does node n touch any byte of v (its out or an operand overlaps it)? */
int ir_node_touches(const Graph *g, const Node *n, const Value *v);

int ir_add_block(Graph *g, const char *name, Loc loc);
/* The strategy block b's parameters follow: its override, else train's
 * (b < 0: train's). */
DpStrategy ir_block_strategy(const Graph *g, int b);
/* The gradient compression of block b's parameters (DpCompressKind): its
 * own `compress`, else train's. */
int ir_block_compress(const Graph *g, int b);
/* The offload of block b's parameters (0 none, 1 optimizer, 2 params): its
 * own, else train's; and whether anything of g is offloaded (train's or a
 * block's offload). */
int ir_block_offload(const Graph *g, int b);
int ir_any_offload(const Graph *g);
/* reshard_after_forward for block b's gathered parameters (0 or 1): its
 * own, else train's. */
int ir_block_reshard(const Graph *g, int b);
/* The optimizer group of trained parameter p: its weight decay (the
 * optimizer's, its block's own, 0 for a 1-D parameter under no_decay vectors) and
 * its lr scale (its block's). Parameters with equal pairs update together. */
void ir_param_group(const Graph *g, const Value *p, float *weight_decay, float *lr_scale);
/* The dtype block b computes in and stores its buffers in: its override,
 * else train's (b < 0: train's). */
DpDtype ir_block_param_dtype(const Graph *g, int b);
DpDtype ir_block_buffer_dtype(const Graph *g, int b);
/* Does any block compute in, or store a buffer in, a dtype other than f32? */
int ir_mixed_precision(const Graph *g);
/* Is dt a floating-point dtype (f32, bf16)? */
int ir_is_float(DpDtype dt);
/* Does strategy strat suit g's mesh? 1, or 0 with the reason in msg (the
 * front end reports it at the setting, the layout pass for IR input).
 * full_shard shards over dp_shard and replicates nothing: a dp_replicate
 * axis would hold copies nothing synchronises. */
int ir_strategy_fits(const Graph *g, int strat, char *msg, size_t len);
int ir_add_source(Graph *g, const Source *s);
int ir_add_bucket(Graph *g, const Bucket *b);

/* The programs a node of this phase belongs to unless said otherwise: forward
 * nodes run in both the step and the eval program, eval nodes only in eval,
 * setup nodes only in init, the rest only in the step. The printer omits it;
 * the reader restores it. */
unsigned ir_default_progs(Phase ph);
/* Why g is not a language model, or NULL when it is: its training loss is
 * a cross_entropy (the step's node *loss_node, when not NULL) whose labels
 * come from a tokens(...) source (the next tokens) and whose logits are
 * float, at pp = 1 and cp = 1. Only a language model gets a sample program
 * (passes/sample.c) and sample_every has an effect (compiler/settings.c). */
const char *ir_language_model(const Graph *g, const Node **loss_node);
/* The value the runtime writes before program p (a DpProgram) runs (*in)
 * and the one it reads after it ends (*out), -1 when none: the sample
 * program's tokens and logits (passes/sample.c). A temporary among them
 * lives across the whole program (passes/memplan.c, ir/verify.c). */
void ir_program_io(const Graph *g, int p, int *in, int *out);
/* World size = product of the mesh axes. */
int ir_world(const Graph *g);
/* The virtual stages each pp rank holds: train's stages_per_rank under
 * `pipeline interleaved` at pp > 1, else 1. */
int ir_chunks_per_rank(const Graph *g);
/* Global batch = micro_batch * grad_accum * dp_replicate * dp_shard. */
int64_t ir_global_batch(const Graph *g);

extern const char *const ir_axis_names[DP_MAX_AXES]; /* "dp_replicate", ... */

/* ---- settings (ir/settings.c, from the rows of format/settings.def) ---- */

/* The field setting id (a DP_SET_ id) lives in: in g->cfg, g->opt, g->sched
 * or g's own member (bucket_mb, ...); NULL when it has none. */
void *ir_setting_field(Graph *g, int id);
/* Its value (0 without a field). */
double ir_setting_get(const Graph *g, int id);
/* Every setting at its default (ir_new): the DSL's defaults, also those of
 * hand-written IR without the directive or key. */
void ir_settings_default(Graph *g);
/* Kind `kind` of spec setting spec (the optimizer, the schedule): the fields
 * of its arguments at its defaults, those of other kinds 0. */
void ir_settings_kind(Graph *g, int spec, int kind);
extern const char *const ir_line_names[DP_NIRL]; /* DpIrLine: "mesh", "config", ... */
extern const char *const ir_kind_names[];            /* DpTensorKind: "act", "param", ... */
extern const char *const ir_phase_names[7];          /* Phase: "data", "fwd", ... */
extern const char *const ir_init_names[7];           /* DpInit */
extern const char *const ir_src_kind_names[6];       /* DpSourceKind */
extern const char *const ir_split_names[2];          /* DpSplit */
extern const char *const ir_role_names[2];           /* DpSource.role: features, labels */

/* ---- the op registry (ir/ops.c, from the rows of format/ops.def) ---- */

/* How users reach an op in the DSL (the DSL column). */
typedef enum {
	OP_DSL_NO,   /* made by passes only */
	OP_DSL_CALL, /* name(tensors..., key=value...) */
	OP_DSL_DIMS, /* name(x, d1, d2, ...): positional dims after the tensor (reshape) */
	OP_DSL_LOSS, /* only as `loss = name(...)` */
} OpDsl;

/* Does a node read its output (the RO column)? */
typedef enum {
	OP_RO_NO,  /* out is only written */
	OP_RO_YES, /* out is read too (in place: accum, clip, optimizers, all_reduce) */
	OP_RO_ACC, /* read only when the attribute acc != 0 (accumulating kernels) */
	OP_RO_UPD, /* YES, and the inputs from in[1] on are written too (an optimizer's
	              state, the compute copy it writes): ir_writes_in */
	OP_RO_IN0, /* out is only written, and in[0] is written too, in place (the fused
	              classifier's gradient over its logits): ir_writes_in */
} OpReadsOut;

/* Tensor parallelism (the TP column; passes/tp.c). */
typedef enum {
	OP_TP_NO,    /* reading a tp-local (column-split) value is an error */
	OP_TP_LOCAL, /* tp-local values flow through: each output column block
	                depends only on the same block of the inputs */
	OP_TP_HEADS, /* LOCAL, with the attribute heads: each rank computes heads / tp */
} OpTp;

/*
 * Batch rules (the BATCH column): how the batch dimension of per-sample
 * values flows through an op, and which uses would mix samples, so that a
 * program's result would depend on how the global batch is split over ranks
 * and micro-batches. passes/shape.c applies them to every node it shapes
 * (the forward); each value's batch_dim/seq_dim follows. See ir_batch_rule.
 */
typedef enum {
	OP_BATCH_NONE,      /* not checked: output has no batch dim (passes' own ops) */
	OP_BATCH_SAME,      /* out = in0, dim for dim */
	OP_BATCH_ELEMWISE,  /* same-rank operands must agree on the batch dim; a smaller
	                       operand broadcast over leading dims must not be per-sample
	                       nor cover the other's batch dim */
	OP_BATCH_BIAS,      /* x + b over x's trailing dims: as ELEMWISE's broadcast */
	OP_BATCH_ROWS,      /* works along the last dim: it must not be the batch dim;
	                       other operands (gamma, beta) not per-sample */
	OP_BATCH_LINEAR,    /* x's last dim is contracted: not the batch; w, b not per-sample */
	OP_BATCH_MATMUL,    /* b not per-sample; a per-sample a not transposed; the DSL
	                       transposes 2-D operands only */
	OP_BATCH_EMBED,     /* out takes the ids' batch and sequence dims; table not per-sample */
	OP_BATCH_SEQ,       /* [B, T, C] mixing along T (attention, rope): batch dim 0 */
	OP_BATCH_TRANSPOSE, /* the batch dim must not be one of the last two */
	OP_BATCH_RESHAPE,   /* keeps dim 0 only: the batch must be dim 0 */
	OP_BATCH_REDUCE,    /* sums over rows (the loss): fine, but the last (class) dim
	                       must not be the batch; out has no batch dim */
} OpBatch;

/* The text names of IR attributes. Any non-zero attribute without a name
 * prints as iaN=V / faN=V. */
typedef enum {
	IR_ATTR_FLAG,   /* integer: bare name when 1, name=V otherwise, absent when 0 */
	IR_ATTR_INT,    /* integer: name=V when non-zero */
	IR_ATTR_ALWAYS, /* integer: name=V always (event ids, source index: 0 is meaningful) */
	IR_ATTR_AXES,   /* integer axis mask, name=dp_replicate,dp_shard when non-zero */
	IR_ATTR_STAGES, /* integer set of pipeline stages (bit k), name=0,3 when non-zero */
	IR_ATTR_FLOAT,  /* float: name=V when non-zero */
} IrAttrStyle;

/* One meaningful attribute of an op: its IR name and, when users write it,
 * its DSL keyword. */
typedef struct {
	const char *name;  /* IR text name; NULL ends an op's list */
	uint8_t style;     /* IrAttrStyle */
	uint8_t slot;      /* its integer slot (float for IR_ATTR_FLOAT): IR_ATTR, IR_FATTR */
	const char *key;   /* DSL keyword, or NULL: passes set it */
	uint8_t required;  /* DSL: must be given */
	float def;         /* DSL float: the value when not given */
	int64_t min;       /* DSL int: the least value; float: must be > min */
	int8_t below;      /* DSL int: must be < the attribute at this index of the
	                      op's list (split's index < parts); -1: no bound */
	const char *scalar_of; /* a scalar operand (ASCALAR): the DSL op whose calls
	                          with one tensor and one number are this op */
} OpAttr;

typedef struct GradCtx GradCtx; /* ir/grad.c */

typedef struct {
	const char *name;   /* text form, step-file name and DSL spelling */
	uint8_t cls;        /* DpOpClass */
	uint8_t dsl;        /* OpDsl */
	int8_t min_in, max_in; /* tensor inputs (nin) */
	int8_t ids_at;      /* the input that is i32 (ids, labels), or -1 */
	uint8_t reads_out;  /* OpReadsOut */
	/* Shape rule: fill out's dtype/ndim/dims from the inputs of n, or report a
	 * user error through d (at n->loc) and return -1. NULL: the op has no SSA
	 * output (writes existing state). */
	int (*shape)(Graph *g, Node *n, Value *out, Diag *d);
	/* Gradient rule: given the forward node and the gradient of its output,
	 * emit the gradient contributions to its inputs (GradCtx API below),
	 * typically with grad_op. NULL: not differentiable. */
	void (*grad)(GradCtx *c, Node *n, int dout);
	IrOp grad_op;
	/* Cost: floating-point operations and bytes moved (read + written);
	 * cost_k flops per element for the per-element rules. */
	void (*cost)(const Graph *g, const Node *n, double *flops, double *bytes);
	float cost_k;
	uint8_t tp;         /* OpTp */
	uint8_t batch;      /* OpBatch */
	const OpAttr *attrs; /* meaningful attributes, ended by name == NULL */
} OpInfo;

extern const OpInfo ir_ops[DP_NOPS]; /* ORDER OP */

/* Does n read its output (reads_out, with the attribute acc for OP_RO_ACC)? */
int ir_reads_out(const Node *n);
/* Does n write its input k (besides its out)? Passes that order nodes by
 * the memory they write (schedule) ask. */
int ir_writes_in(const Node *n, int k);
/* The attribute of op named name (IR text), or NULL. */
const OpAttr *ir_op_attr(IrOp op, const char *name);
/* The attribute a (one of ir_ops[n->op].attrs) of node n, an lvalue, for code
 * that walks an op's attribute list (the printer, the reader, the DSL's
 * keywords); code that knows its op names the attribute (DP_ATTR, DP_FATTR). */
#define IR_ATTR(n, a) ((n)->ia[(a)->slot])
#define IR_FATTR(n, a) ((n)->fa[(a)->slot])
/* RESHAPE's result dim i + 1 (its attribute d1, d2 or d3; i < DP_MAX_DIMS - 1):
 * the front end, the shape rule and the gradient walk them by position. */
static inline int64_t *ir_reshape_dim(Node *n, int i)
{
	_Static_assert(DP_MAX_DIMS == 4, "RESHAPE names one attribute per dim after the first");
	return i == 0 ? &DP_ATTR(n, RESHAPE, d1) : i == 1 ? &DP_ATTR(n, RESHAPE, d2)
							   : &DP_ATTR(n, RESHAPE, d3);
}
/* The op a DSL call spells name, or -1. */
int ir_dsl_op(const char *name);
/* Apply n's batch rule: check that n does not mix samples, and set the
 * batch_dim/seq_dim of its SSA output. 0, or -1 after reporting a user error
 * at n->loc through d. */
int ir_batch_rule(Graph *g, Node *n, Diag *d);

/* ---- the gradient builder (ir/grad.c), used by gradient rules ---- */

/*
 * A rule gets the forward node n and dout, the gradient of n->out (-1 when
 * n->out is the loss itself: the seed, an implicit 1). For each input x it
 * emits x's gradient contribution with one call; inputs that need no gradient
 * (not on a path from a parameter to the loss) are skipped by these helpers
 * (they return NULL), so rules need not check. Several contributions to one
 * value are summed; a parameter's contributions go into its persistent
 * gradient. Emitted nodes are PH_BWD, IR_IN_STEP, with the forward node's
 * block and loc. passes/autodiff.c drives it (grad_ctx_new, grad_ctx_set_node).
 */
struct GradCtx {
	Graph *g;
	Diag *d;
	Node *fwd;            /* forward node whose gradient rule is running */
	unsigned char *needs; /* per value: on a path param -> loss */
	int *grad;            /* per value: current gradient value id, or -1 */
	unsigned char *owned; /* per value: grad[v] is a temporary only v uses */
	int nvalues;          /* values before autodiff; the arrays cover these */
	int nerr;             /* user errors reported by rules */
};

/* Arrays for the first nvalues values, no gradient yet; ir_grad_ctx_free frees them. */
void ir_grad_ctx_init(GradCtx *c, Graph *g, Diag *d, int nvalues);
void ir_grad_ctx_free(GradCtx *c);
/* The gradient value of v so far, or -1. */
int ir_ad_grad_of(GradCtx *c, int value);
/* Does value need a gradient? */
int ir_ad_needs(GradCtx *c, int value);
Value *ir_ad_value(GradCtx *c, int value);
/* A kernel that can accumulate into its output (acc = 1: MATMUL, BIAS_GRAD)
 * writes value's gradient directly: into the parameter's gradient, or the
 * value's gradient temporary. acc is set; the rule sets the other attributes
 * on the returned node. */
Node *ir_ad_emit_acc(GradCtx *c, IrOp op, int value, int nin, const int *in);
/* A kernel that only overwrites writes a fresh temporary shaped like value,
 * which is then summed into value's gradient (ACCUM, or it becomes it). */
Node *ir_ad_emit_grad(GradCtx *c, IrOp op, int value, int nin, const int *in);
/* g (an existing gradient, e.g. dout) is value's contribution as it is. */
void ir_ad_pass_grad(GradCtx *c, int value, int g);
/* Lower level: a new temporary "d.<stem>" with like's dtype, dims and batch
 * dims; a backward node writing out; add a fresh temporary as value's
 * contribution. */
int ir_ad_temp(GradCtx *c, const Value *like, const char *stem);
Node *ir_ad_emit(GradCtx *c, IrOp op, int out, int nin, const int *in);
void ir_ad_add_grad(GradCtx *c, int value, int contribution);
/* Report a user error at the forward node's location. */
void ir_ad_error(GradCtx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- printer and reader (ir/print.c, ir/read.c) ---- */

/* The text form: declarations of persistent values, then one line per node in
 * program order, with types, attributes and cost comments. ir_read parses the
 * same text back into a graph (round trip: print(read(print(g))) == print(g)). */
void ir_print(FILE *out, const Graph *g);
Graph *ir_read(const char *text, const char *name, Diag *d);
/* ir_print with the pass name in the header comment ("; dp IR after PASS
 * (file)"); after may be NULL. For dumps after each pass. */
void ir_print_after(FILE *out, const Graph *g, const char *after);
/* The value ids in the order the text lists them (ir_print): the *ndecl
 * declarations in id order, then the SSA temporaries defined inline, in
 * program order. order has room for nvalues; returns how many it wrote
 * (nvalues unless the graph is broken). */
int ir_value_order(const Graph *g, int *order, int *ndecl);
/* Makes g the graph its text reads back as: values get the ids ir_read
 * gives them (ir_value_order), nodes their program position, every
 * reference follows; a temporary defined inline without a block takes its
 * node's (the text shows one block for both). ir_read ends with it, and
 * dpc runs it after the front end and after every pass, so a dump read
 * back (dpc --from-ir) is the graph the next pass would have seen, ids
 * included. */
void ir_canonicalize(Graph *g);
/* Removes value id, which nothing may reference any more (no node reads or
 * writes it, nothing views it); the values after it move down one id and
 * every reference follows. */
void ir_drop_value(Graph *g, int id);
/* Removes the n distinct values ids[] at once: the ids, graph and
 * references ir_drop_value gives one at a time, in one pass over the
 * graph (dropping many one by one is quadratic). */
void ir_drop_values(Graph *g, const int *ids, int n);
/* The pass a dump names on its first line, "; dp IR after PASS (FILE)":
 * PASS copied into after (at most len bytes with the NUL), and its 1-based
 * column returned; 0 when the first line names no pass. */
int ir_read_after(const char *text, char *after, size_t len);

/* Words with a meaning after a node's phase (program words, last, recompute):
 * never read as a block name; the printer quotes a block named like one. */
#define IR_NRESERVED 18
extern const char *const ir_reserved_words[IR_NRESERVED];

/* ---- verifier (ir/verify.c) ---- */

/* Checks the invariants every pass must keep; prints each violation to out and
 * returns the number found (0 = valid). after names the pass, for messages. */
int ir_verify(const Graph *g, const char *after, FILE *out);

/* ---- step-file writer (ir/stepfile_write.c) ---- */

/* Writes g to path atomically (temp file + rename): a failure leaves nothing
 * behind. Returns 0, or -1 with a message in err. */
int ir_write_step(const Graph *g, const char *path, char *err, size_t errlen);
/* Builds the in-memory DpStep (tensor ids = value ids); caller frees with dpstep_free. */
int ir_build_step(const Graph *g, DpStep *out, char *err, size_t errlen);
/* Program prog of g as a DpStep holding only what the rules of
 * format/kernel_kind.c read: every tensor (no names; offsets where memory
 * is planned, else 0 bytes) and that program's instructions (the nodes in
 * prog, in order: ir_build_step's); the rest empty. Free with dpstep_free.
 * The simulator's view of the kernels' kinds, a plan or none. */
void ir_build_program(const Graph *g, int prog, DpStep *out);

#endif
