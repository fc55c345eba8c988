/*
 * passes.h - the pass pipeline: each pass is one file in passes/, listed in
 * order in passes/pipeline.c. A pass takes the graph, transforms it in place,
 * and returns 0, or reports user errors through the Diag and returns -1.
 * After every pass the graph is made canonical (ir_canonicalize), the
 * verifier runs (always in dpc; it is cheap), and the graph can be dumped
 * (dpc --dump-ir=DIR, --dump-after=PASS) and read back (dpc --from-ir).
 */
#ifndef DP_PASSES_H
#define DP_PASSES_H

#include "ir.h"

typedef struct {
	const char *name; /* as used by --dump-after and printed by --print-pipeline */
	const char *doc;  /* one line: what holds after it */
	int (*run)(Graph *g, Diag *d);
} Pass;

extern const Pass pipeline[];
extern const int npipeline;

typedef struct {
	const char *dump_dir;   /* write DIR/NN-pass.ir after each pass, or NULL */
	const char *dump_after; /* print the IR after this pass to dump_out, or NULL */
	FILE *dump_out;
	int verify;             /* run ir_verify after each pass (1 in dpc) */
} PipelineOpts;

/* Runs every pass in order; stops at the first failing pass. 0; -1 after user
 * errors (reported through d) or a dump that could not be written; -2 when the
 * verifier found violations (an internal error, already printed to stderr).
 * The front end's graph is verified (and dumped as 00-frontend) first. */
int pipeline_run(Graph *g, Diag *d, const PipelineOpts *o);
/* Runs the passes pipeline[passes[0..n-1]] in that order on a graph read
 * from IR text (dpc --from-ir), with the same verification and dumps after
 * each; returns as pipeline_run. The graph is verified first: violations
 * are user errors there (reported through d, -1). */
int pipeline_run_some(Graph *g, Diag *d, const PipelineOpts *o, const int *passes, int n);
/* Index of a pass by name, -1 if unknown. */
int pipeline_find(const char *name);

/* The passes (one file each). */
int tp_run(Graph *g, Diag *d);        /* passes/tp.c: tensor parallelism (Megatron) */
int shape_run(Graph *g, Diag *d);     /* passes/shape.c: shapes and dtypes of every value */
int cp_run(Graph *g, Diag *d);        /* passes/cp.c: context parallelism */
int ad_run(Graph *g, Diag *d);        /* passes/autodiff.c: reverse-mode gradients */
int recompute_run(Graph *g, Diag *d); /* passes/recompute.c: activation recompute */
int opt_run(Graph *g, Diag *d);       /* passes/optimizer.c: clip + optimizer update */
int precision_run(Graph *g, Diag *d); /* passes/precision.c: mixed precision dtypes */
int layout_run(Graph *g, Diag *d);    /* passes/layout.c: placement, units, flat layout */
int setup_run(Graph *g, Diag *d);     /* passes/setup.c: the INIT and EXPORT programs */
int collectives_run(Graph *g, Diag *d); /* passes/collectives.c: places each unit's collectives */
int p2p_run(Graph *g, Diag *d);       /* passes/p2p.c: the stages' nodes and their sends/recvs */
int sched_run(Graph *g, Diag *d);     /* passes/schedule.c: streams, events, order */
int fuse_run(Graph *g, Diag *d);      /* passes/fuse.c: linear + gelu as one GEMM */
int views_run(Graph *g, Diag *d);     /* passes/views.c: copies that only rename bytes */
int mem_run(Graph *g, Diag *d);       /* passes/memplan.c: arena offsets */
int sample_run(Graph *g, Diag *d);    /* passes/sample.c: a language model's sample program */
int stages_run(Graph *g, Diag *d);    /* passes/stages.c: pipeline stages of the blocks */

/* passes/stages.c: what each pipeline stage holds and does per micro-batch
 * (whole tensors, before any dp sharding), for --stats. */
typedef struct {
	int first_block, last_block; /* the stage's blocks, in order */
	double fwd_flops, bwd_flops; /* per micro-batch (the backward with its recompute) */
	int64_t param_bytes;         /* the parameters its nodes read (a tied one on each) */
	int64_t grad_bytes;          /* their gradients */
	int64_t act_bytes;           /* forward results its backward reads: kept per
	                                micro-batch in flight */
	int64_t send_bytes;          /* forward values live across the cut after it (sent
	                                forward; their gradients come back) */
} StageCost;
/* Fills sc[0..pp-1] and returns pp; 0 at pp = 1 and above
 * STAGES_MAX_ACCOUNT (a stage set is a 64-bit mask). */
#define STAGES_MAX_ACCOUNT 64
int stages_account(const Graph *g, StageCost *sc);
/* One slot of a stage's schedule: the forward or backward of a micro-batch,
 * and when it runs (in FLOPs from the step's start). */
typedef struct {
	int fwd, mb;
	double start, end;
} StageSlot;
/* The makespan (in FLOPs) of m micro-batches under 1f1b (gpipe = 0) or gpipe
 * from the stages' costs, and its bubble fraction; -1 if the order deadlocks.
 * slots: NULL, or p x 2m filled with each stage's slots in order. */
double stages_simulate(const StageCost *sc, int p, int m, int gpipe, double *bubble,
		       StageSlot *slots);
/* dpc --emit=schedule: that forecast as a per-stage timeline, width columns. */
void stages_print_schedule(FILE *out, const Graph *g, int width);

/* passes/memplan.c: the temporaries live at the step program's peak, by
 * what they hold; returns their total (<= the arena's temporaries region,
 * which also holds fragmentation). */
enum { MEM_ACTIVATIONS, MEM_GATHERED, MEM_UNSHARDED_GRADS, MEM_NCLASS };
int64_t mem_live_peak(const Graph *g, int64_t split[MEM_NCLASS]);

/* passes/stats.c: the --stats table (collectives, flops, memory per rank). */
void stats_print(FILE *out, const Graph *g);
/* "1.50 MiB", "12.3 MFLOP": the tables' readable figures. */
const char *stats_human_bytes(char *buf, size_t len, double b);
const char *stats_human_flops(char *buf, size_t len, double f);
/* passes/roofline.c: `--stats --device NAME`, the step's roofline time per
 * kernel class on a GPU from its published peaks, and the MFU it implies. */
int roofline_known(const char *name);
const char *roofline_devices(void);
void roofline_print(FILE *out, const Graph *g, const char *device);

#endif
