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
#include "machine.h"

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
/* The passes pipeline[from..to-1] of pipeline_run, returning as it does
 * (from = 0: the front end's graph first); a later call with from = the
 * earlier to goes on where it stopped (dpc --plan: the memory plan only of
 * candidates that need it). */
int pipeline_run_part(Graph *g, Diag *d, const PipelineOpts *o, int from, int to);
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
int lossscale_run(Graph *g, Diag *d); /* passes/lossscale.c: fp16's loss scaling */
int compress_run(Graph *g, Diag *d);  /* passes/compress.c: PowerSGD gradient compression */
int p2p_run(Graph *g, Diag *d);       /* passes/p2p.c: the stages' nodes and their sends/recvs */
int unroll_run(Graph *g, Diag *d);    /* passes/unroll.c: micro-batches in the schedule's order */
int stage_params_run(Graph *g, Diag *d); /* passes/stage_params.c: each stage's own parameters */
int offload_run(Graph *g, Diag *d);  /* passes/offload.c: optimizer state and step on the host */
int sched_run(Graph *g, Diag *d);     /* passes/schedule.c: streams, events, order */
int fuse_run(Graph *g, Diag *d);      /* passes/fuse.c: linear + gelu as one GEMM */
int views_run(Graph *g, Diag *d);     /* passes/views.c: copies that only rename bytes */
int mem_run(Graph *g, Diag *d);       /* passes/memplan.c: arena offsets */
int sample_run(Graph *g, Diag *d);    /* passes/sample.c: a language model's sample program */
int padvocab_run(Graph *g, Diag *d);  /* passes/padvocab.c: the logits' rows padded */
int stages_run(Graph *g, Diag *d);    /* passes/stages.c: pipeline stages of the blocks */

/* passes/stages.c: what each pipeline stage holds and does per micro-batch
 * (whole tensors, before any dp sharding), for --stats. */
typedef struct {
	int first_block, last_block; /* the stage's blocks, in order */
	double fwd_flops, bwd_flops; /* per micro-batch (the backward with its recompute) */
	double wgrad_flops;          /* of bwd_flops, the weight gradients' (stages_wgrad) */
	int64_t param_bytes;         /* the parameters its nodes read (a tied one on each) */
	int64_t grad_bytes;          /* their gradients */
	int64_t act_bytes;           /* forward results its backward reads: kept per
	                                micro-batch in flight */
	int64_t send_bytes;          /* forward values live across the cut after it (sent
	                                forward; their gradients come back) */
} StageCost;
/* Fills sc[0..n-1] and returns n = stages_count (one entry per virtual stage
 * under interleaved); 0 at pp = 1 and above STAGES_MAX_ACCOUNT (a stage set
 * is a 64-bit mask). */
#define STAGES_MAX_ACCOUNT 64
int stages_account(const Graph *g, StageCost *sc);
/* How many copies of a micro-batch's work the step program holds: grad_accum
 * once passes/unroll.c has run at pp > 1, else 1. */
int stages_micro_copies(const Graph *g);
/* Does each pipeline stage keep only its own parameters (passes/stage_params.c)?
 * pp > 1 (up to STAGES_MAX_ACCOUNT stages), under every strategy (the sharded
 * ones shard a stage's own over its dp group), offload and compression too
 * (compress powersgd: a stage keeps its own matrices' P, Q and error
 * feedback); otherwise every stage keeps every parameter. */
int stages_split_params(const Graph *g);
/* stage[p], for every parameter p (every value: stage[0..nvalues-1]): the
 * one stage whose forward, backward and eval nodes read p and touch its
 * gradient (by their blocks' stages), or -1: several stages (a tied
 * parameter), a node outside every block, or none. One walk over the nodes
 * for all of them (a walk per parameter was 68 % of a compile at GPT-3
 * 175B's shape and pp=16). The layout pass lays the flat buffers out by it
 * and passes/stage_params.c cuts them by it. */
void stages_param_stages(const Graph *g, int *stage);
/* Is n weight-gradient work (it writes a gradient: zero_bubble's W)? */
int stages_wgrad(const Graph *g, const Node *n);
/* One slot of a stage's schedule: the forward (F), backward (B; under
 * zero_bubble its input-gradient part) or weight-gradient part (W) of a
 * micro-batch, and when it runs (in FLOPs from the step's start). */
enum { STAGE_F, STAGE_B, STAGE_W };
typedef struct {
	int kind, mb;
	double start, end;
	int chunk; /* the virtual stage it runs (interleaved), else its stage */
} StageSlot;
/* The slots of each stage (rank) under schedule sched (IrPipeline) with v
 * virtual stages per rank (ir_chunks_per_rank): 2mv, 3m for zero_bubble. */
int stages_slots_per_stage(int m, int v, int sched);
/* The stages of the schedule: pp, times stages_per_rank under interleaved
 * (the virtual stages, StageCost's entries). */
int stages_count(const Graph *g);
/* How --stats and --emit=schedule name schedule sched. */
const char *stages_schedule_name(int sched);
/* The makespan (in FLOPs) of m micro-batches under schedule sched
 * (g->pipeline) over p ranks with v virtual stages each from the (virtual)
 * stages' costs (p x v of them), and its bubble fraction; -1 if the order
 * deadlocks. slots: NULL, or p x stages_slots_per_stage filled with each
 * rank's slots in order. */
double stages_simulate(const StageCost *sc, int p, int v, int m, int sched, double *bubble,
		       StageSlot *slots);
/* dpc --emit=schedule: that forecast as a per-stage timeline, width columns. */
void stages_print_schedule(FILE *out, const Graph *g, int width);

/* passes/memplan.c: the temporaries live at program prog's peak (a
 * DpProgram: DP_PROG_STEP, or DP_PROG_SAMPLE's own), by what they hold;
 * returns their total (<= the arena's temporaries region, which also holds
 * fragmentation). */
enum { MEM_ACTIVATIONS, MEM_GATHERED, MEM_UNSHARDED_GRADS, MEM_NCLASS };
/* passes/memplan.c: per value, the set of pipeline stages (bit k: stage k)
 * whose own persistent root it is (a stage's part, or the tied range on the
 * stages that read it: memplan lets stages' own share bytes), else 0 (every
 * rank); malloc'd. */
uint64_t *mem_persistent_stages(const Graph *g);
int64_t mem_live_peak(const Graph *g, int prog, int64_t split[MEM_NCLASS]);

/* passes/stats.c: the --stats table (collectives, flops, memory per rank);
 * budget (dpc --device-memory, bytes per rank; 0: none) adds whether the
 * device arena fits it. stats_check_budget makes an over-budget plan a
 * compile error naming the arena's largest rows and values (-1; 0 fits). */
void stats_print(FILE *out, const Graph *g, int64_t budget);
int stats_check_budget(Diag *d, const Graph *g, int64_t budget);
/* "1.50 MiB", "12.3 MFLOP": the tables' readable figures. */
const char *stats_human_bytes(char *buf, size_t len, double b);
const char *stats_human_flops(char *buf, size_t len, double f);
/* The ranks of the axis group of mask; the bytes of the whole buffer a
 * collective moves (nccl-tests' S); the bus bytes' factor of S over n ranks
 * (nccl-tests: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n). */
int stats_group_ranks(const Graph *g, unsigned mask);
/* The ranks of collective n's group: its axes', over pp only the stages of
 * an all_reduce's sub-group (`stages`). */
int stats_node_ranks(const Graph *g, const Node *n);
double stats_coll_bytes(const Graph *g, const Node *n);
double stats_bus_factor(IrOp op, int n);
/* passes/roofline.c: `--stats --device NAME`, the step's roofline time per
 * kernel class on a GPU from its published peaks, and the MFU it implies. */
int roofline_known(const char *name);
const char *roofline_devices(void);
void roofline_print(FILE *out, const Graph *g, const char *device);
/* The device's memory in bytes (H100 SXM: 80 GiB); 0 for an unknown name. */
int64_t roofline_memory(const char *name);
/* The model FLOPs of one optimizer step, as the MFU counts them: the GEMMs'
 * (without a fused epilogue's, which go to *epilogue) and 12 T d per token
 * and layer of attention, recomputed forwards left out; *tokens: the
 * tokens a layer's attention sees per optimizer step (0: no attention). */
double roofline_model_flops(const Graph *g, double *tokens, double *epilogue);

/* passes/simulate.c: `dpc --simulate`, the STEP program replayed on a
 * machine model. A SimOp is one instruction with its cost on the machine. */
typedef enum {
	SIM_KERNEL, /* runs dur seconds on its stream */
	SIM_COLL,   /* a collective: alpha, then bytes over link_bw[link] shared
	               with the collectives moving on that link */
	SIM_RECORD, /* EVENT_RECORD event on its stream */
	SIM_WAIT,   /* EVENT_WAIT event on its stream */
} SimKind;
typedef struct {
	SimKind kind;
	int stream;        /* DP_STREAM_COMPUTE / DP_STREAM_COMM */
	unsigned flags;    /* DP_IF_LAST: the last micro-batch only */
	double dur;        /* SIM_KERNEL: seconds */
	double alpha;      /* SIM_COLL: seconds before its bytes move */
	double bytes;      /* SIM_COLL: bus bytes */
	int link;          /* SIM_COLL: MACH_INTRA, MACH_INTER, MACH_P2P */
	int event;         /* SIM_RECORD, SIM_WAIT */
	int stage;         /* pp > 1: the stage that runs it; -1: every stage */
	int peer;          /* a pipeline send or recv: its partner's index; else -1 */
	int recv;          /* a pipeline recv (the p2p link's inbound direction) */
	int sync;          /* a collective whose group spans pp: it moves once every
	                      stage has reached it (stage -1: each runs this op), or
	                      every stage of its sub-group has reached its own copy
	                      (stage >= 0: the copies' ring) */
	int ring;          /* sync at stage >= 0: the next copy of the same collective
	                      (ops[ring].stage another stage of the sub-group; the
	                      copies form a ring), else unused */
} SimOp;
/* A span of the predicted timeline: lane 0 the compute stream (the host on
 * the cpu executor), -1 a wait on it, 1.. the comm lanes. */
typedef struct {
	double t0, t1;
	int op, micro, lane;
} SimSpan;
typedef struct {
	double step_s;                /* the optimizer step's time */
	double busy[DP_NSTREAM];      /* each stream's busy seconds */
	double comm_s;                /* seconds with a collective in flight */
	double exposed_s;             /* seconds the compute stream waited on events */
	int want_spans;               /* fill spans (the trace) */
	SimSpan *spans;
	int nspans, capspans;
} SimResult;
/* Replays ops[0..n-1] accum times (DP_IF_LAST ops on the last only) on the
 * executor (MACH_GPU, MACH_CPU) with the links' bandwidths (bytes/s); every
 * op on the one rank (stage and peer ignored). */
int sim_run(const SimOp *ops, int n, int accum, int executor, const double *link_bw, int nevents,
	    SimResult *r);
/* pp > 1: the stages 0..p-1 of one unrolled step program (every
 * micro-batch in it), each running its own ops and the ops of every stage,
 * a pipeline transfer moving once both its send and its recv are posted, a
 * collective spanning pp once every stage has posted it, one over a
 * sub-group of the stages once every copy of its ring is posted. r[0..p-1]: each
 * stage's result. Returns the number of sweeps the pairing took to settle,
 * or -1 when it did not (a bug: the verifier refuses deadlocking orders). */
int sim_run_stages(const SimOp *ops, int n, int p, int executor, const double *link_bw,
		   int nevents, SimResult *r);
/* The STEP program's SimOps on machine mc; nodes[k]: ops[k]'s node index. */
int sim_build(const Graph *g, const Machine *mc, SimOp **ops, int *nops, int **nodes);
typedef struct {
	SimOp *ops;
	int *nodes;
	int nops;
	int nstages;                /* pp (1 at pp = 1) */
	SimResult *stage;           /* [nstages]: each stage's replay */
	SimResult res;              /* the step: the slowest stage's figures (its spans
	                               stay in stage[]) */
	int slowest;                /* that stage */
	double forecast_bubble;     /* pp > 1: stages_simulate's bubble from the FLOPs
	                               (--stats'), -1 when it has none */
	int sweeps;                 /* pp > 1: sim_run_stages' sweeps */
	double sync_s;              /* cpu executor: dpexec's per-step loss all_reduce
	                               and sync point, in every stage's step, comm and
	                               exposed comm */
	double model_flops, tokens; /* per optimizer step (roofline_model_flops) */
} SimReport;
/* The fastest a GEMM (matmul, linear and their fused forms) of dtype
 * MACH_F32 / MACH_BF16 (its first operand's) runs on mc: no rate
 * kernel_seconds gives one is above it (the GEMM table's largest of the
 * dtype, else the dtype's peak, and the ops' own rates). --plan's time
 * bound. */
double sim_gemm_rate_cap(const Machine *mc, int dtype);
/* Does the group over the axes of mask of a mesh (ranks row-major in
 * DpAxis order, tp fastest; a size 0 counts as 1) lie in one node of
 * ranks_per_node ranks? The simulator's link of a collective, and --plan's. */
int sim_group_in_node(const uint32_t mesh[DP_MAX_AXES], unsigned mask, int ranks_per_node);
/* Simulates g on mc: 0, or -1 when it cannot (the pairing did not settle). */
int sim_graph(const Graph *g, const Machine *mc, SimReport *rep, int want_spans);
/* --plan's class bound: g's step with only the kernels, transfers and tp
 * and cp collectives of a micro-batch's path, which every data-parallel
 * strategy, knob and dp_replicate x dp_shard split of g's other settings
 * runs alike (simulate.c): at most g's simulated step and theirs. 0 and
 * *step_s, or -1 (offload, or the pairing did not settle). */
int sim_core_step(const Graph *g, const Machine *mc, double *step_s);
void sim_report_free(SimReport *rep);
void sim_print(FILE *out, const Graph *g, const Machine *mc, const SimReport *rep);
/* The predicted timeline as runtime/trace.c's Perfetto JSON: rank 0, at
 * pp > 1 the first rank of every stage (one process each). */
void sim_trace(FILE *f, const Graph *g, const SimReport *rep);

#endif
