/*
 * plan.c - `dpc model.dp --plan --world-size N [--simulate=MACHINE]
 * [--device-memory SIZE]`: the mesh, strategy and knobs that run one step
 * fastest, found by compiling every candidate and simulating it
 * (passes/simulate.c) on the machine.
 *
 * The space, for the world size N: every mesh pp x tp x cp x dp_replicate
 * x dp_shard = N (tp and cp up to the machine's ranks per node; pp any
 * divisor of N, the front end refusing more stages than blocks), under
 * the pipeline schedules 1F1B (pipedream_flush) and zero_bubble where pp
 * > 1 (zero_bubble refused uncompiled when its order deadlocks at the
 * model's micro-batches, which its 1F1B sibling's stages tell), and
 * interleaved at stages_per_rank v = 2 .. VPR_MAX where the blocks fill
 * pp x v virtual stages (the front end refusing micro-batches that are not
 * a multiple of pp: counted as refused), and at pp > 1 grad_accum (the
 * file's, and pp, 2 pp, ... ACCUM_MAX pp micro-batches, at most
 * ACCUM_CAP, at the file's global batch, each a group of candidates of
 * its own, searched as a mesh); on each mesh every strategy
 * (ddp, zero1, zero2, full_shard where dp_replicate = 1; hybrid_shard where dp_replicate > 1;
 * only ddp where there is one data-parallel rank, where they are all the
 * same step), gradient_checkpointing off and on, and the knob of the
 * strategy: bucket_mb 25 or 100 (ddp, zero1, zero2), prefetch 1 or 2
 * (full_shard, hybrid_shard). A candidate the front end refuses (heads
 * that tp does not divide, a batch that the data-parallel ranks do not) is
 * counted and skipped. The user's -D and --set apply to every candidate.
 *
 * Pruning. The closed-form bound (mem_bound, below): before any compile,
 * a lower bound of every candidate's memory plan from its mesh, strategy,
 * the model's parameters at its tp, the dtypes and the optimizer, plus the
 * activations a micro-batch's forward saves for its backward; a
 * candidate whose bound alone is over the device memory is not compiled
 * (PL_BOUND), and plan_eval checks the bound against every memory plan it
 * makes. The time bound (time_bound): a lower bound of every candidate's
 * simulated step from its GEMMs' FLOPs at the machine's fastest GEMM rate
 * (and at pp > 1 the path of a micro-batch through the stages and back,
 * and the pipeline's term, stage_bound: each stage's work between the
 * paths to and from it, over the cuts the stages pass can make),
 * or from the bytes its strategy and tp must move over its links
 * (comm_bound), the larger; a
 * candidate whose bound is no faster than a plan that fits is not compiled
 * (PL_TIME), and plan_eval checks it against every step it simulates. The memory bound: on each mesh the candidate with the least
 * memory (the most sharded strategy the mesh allows, with gradient
 * checkpointing, 1F1B) is compiled first; when it does not fit the device
 * memory no other candidate of that mesh can, and they are not compiled.
 * Dominance (compute_bound): a candidate's step is at least the compute of
 * a simulated candidate of its mesh and strategy whose kernels are a
 * subset of its own (the same or no checkpointing; any knob or schedule);
 * when a plan that fits is already no slower than that, the candidate
 * cannot win and is not compiled. The winner is the one an exhaustive
 * search finds; the table below it lists compiled plans only (a dominated
 * one can be slower than #1 and faster than #10). On mlp, mlp8, gpt2-tiny
 * and llama at 4 ranks (h100-nvlink and a calibrated CPU file) the top 10
 * are those of the exhaustive search, with 5 to 71 compiles saved.
 * The class rule (same_class, below): candidates that differ only in the
 * data-parallel strategy, its knob and the split of the data-parallel
 * ranks run the same path (the model's kernels, the transfers, the tp and
 * cp collectives); one compile's step with only that path
 * (sim_core_step) bounds all of their steps, and a candidate whose class
 * bound is no faster than the tenth fastest plan that fits is not
 * compiled (PL_CLASS), which leaves the table as it was.
 * The memory plan, the last pass and the costliest at scale, runs only
 * for a candidate simulated no slower than the tenth fastest plan known to
 * fit (plan_eval): a slower one cannot rank in the table.
 * Beyond a bound the search is not exhaustive, and says so (limit_classes,
 * --plan-classes): when the class phase would compile more classes than
 * the bound, the members of the classes past it (the most micro-batches a
 * step first) are not searched (PL_UNSEARCHED), and a line after the
 * winner says how many, where, and whether one could beat the winner.
 *
 * Order and workers. A seed, the classes, then three phases, each over
 * every mesh on forked workers (po->jobs, --jobs; one per online CPU by
 * default). The seed: on the meshes of
 * tp alone with the rest in dp_shard (pick_seeds), the candidate with the
 * least time bound, so that the first phases have a plan that fits to
 * hold the time bound against. The classes: each class's candidate of
 * least time bound (unless the time bound rules the class out), so that
 * its bound holds in every later phase. Then each mesh's least-memory candidate (the memory
 * bound), then its probe (no checkpointing, the least sharded strategy: likely
 * the fastest, so the last phase's dominance and memory-plan thresholds
 * start low), then the rest, each mesh deciding from what the earlier
 * phases and it itself found only (phases 1 and 2 hold the time bound
 * against the phases before them only): the result does not depend on the
 * number of workers or their timing.
 *
 * When no plan fits, the candidates the closed-form bound ruled out are
 * compiled after all, each mesh's least-memory one (phase 0), so that the
 * message names the smallest plan's memory as an exhaustive search would.
 * DPC_PLAN_CHECK=1 (tests) compiles and memory-plans every candidate,
 * pruning nothing, and prints the bound's range against the plans.
 *
 * Ranked by simulated step time among those that fit; the top 10 printed
 * with their step time, memory, exposed communication and what each loses
 * to the first by (the larger of its extra compute and its extra exposed
 * communication); -o writes the winner's step file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "frontend.h"
#include "plan.h"

typedef struct {
	int pp, tp, cp, rep, shard;
	int strategy;  /* DpStrategy */
	int gc;        /* gradient_checkpointing */
	int knob;      /* bucket_mb (ddp, zero1, zero2) or prefetch (sharded) */
	int sched;     /* pp > 1: the pipeline schedule (IrPipeline), else -1 */
	int vpr;       /* interleaved: stages_per_rank (virtual stages per rank), else 0 */
	int accum;     /* pp > 1: grad_accum, the micro-batches a step (the file's global
			  batch cut into smaller micro-batches), else 0: the file's */
	int state;     /* PL_* */
	int compiled;  /* plan_eval ran on it */
	int zb_stuck;  /* pp > 1, 1F1B: zero_bubble's order deadlocks on these
	                  stages (passes/unroll.c would stop), so its sibling
	                  is refused uncompiled */
	double step_s, compute_s, exposed_s; /* compute_s: the busiest stage's */
	double mfu;    /* simulated: the model's FLOPs over the step at the machine's bf16
			  peak, as --simulate prints it */
	int64_t mem;
	int64_t bound; /* mem_bound: a lower bound of mem, without a compile (0: none) */
	double time_bound; /* time_bound: a lower bound of step_s, without a compile (0: none) */
	double comm_bound; /* its communication term (comm_bound), 0: none */
	double pipe_bound; /* pp > 1: its pipeline term (stage_bound), 0: none */
	double core_s;     /* compiled: sim_core_step, its class's bound (0: none) */
	double class_bound; /* the largest core_s of a compiled candidate of its class
			       (same_class), a lower bound of step_s (0: none) */
	int cls;           /* its class's index (same_class) */
	int class_rep;     /* the class phase compiles it (its class's least time bound) */
} Plan;

enum {
	PL_TODO,
	PL_FITS,    /* simulated, within the device memory */
	PL_TOO_BIG, /* simulated, over it */
	PL_PRUNED,  /* not compiled: the memory bound */
	PL_REFUSED, /* the front end or a pass refused it */
	PL_SAME,    /* gradient checkpointing that recomputes nothing (no repeat):
	               the plan without it */
	PL_DOMINATED, /* not compiled: a plan that fits is no slower than its
	                 compute alone can be (the dominance rule) */
	PL_SLOWER,  /* simulated, slower than ten plans that fit: its memory
	               not planned (plan_eval) */
	PL_BOUND,   /* not compiled: its memory bound (mem_bound) alone is over
	               the device memory */
	PL_TIME,    /* not compiled: its time bound (time_bound) is no faster than a
	               plan that fits */
	PL_CLASS,   /* not compiled: its class bound is no faster than the tenth
	               fastest plan that fits (the class rule) */
	PL_UNSEARCHED, /* not compiled: its class is past --plan-classes (limit_classes);
	                  the search is not exhaustive and says so */
};

/* The schedules searched at pp > 1 (IrPipeline, settings.def's words). */
static const char *const sched_names[] = {"1f1b", "gpipe", "zero_bubble", "interleaved"};

/* The most virtual stages per rank searched under interleaved: the bubble
 * is (p-1)/(vm+p-1), so past 4 it gains little (a fifth of 1F1B's) while
 * every v adds a candidate per strategy and knob to each pp mesh, and the
 * p2p transfers grow with v. */
#define VPR_MAX 4

/* At pp > 1 grad_accum is searched at pp, 2 pp, ... ACCUM_MAX pp micro-batches
 * (where they divide a data-parallel rank's samples), beside the file's: the
 * bubble is (p-1)/(m+p-1) under 1F1B, a fifth at 4 pp, while the step
 * program unrolls every micro-batch, so the compile grows with m. */
#ifndef ACCUM_MAX
#define ACCUM_MAX 4
#endif

/* ... and at most ACCUM_CAP micro-batches: a compile unrolls the whole
 * model's step program m times (at GPT-3 175B's shape pp=64 would take
 * 256; Megatron-LM's 96 at pp=8 compile in 59 CPU-s against 6.8 for 32 at
 * pp=16, docs/SIMULATE.md), and 32 leave 1F1B's bubble under a third at
 * pp = 16. */
#define ACCUM_CAP 32

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int is_sharded(int strategy)
{
	return strategy == DP_STRAT_FULL_SHARD || strategy == DP_STRAT_HYBRID_SHARD;
}

/* The candidate's settings as --set lines (at most 6). */
static int plan_sets(const Plan *p, FeSet *sets, char buf[4][64])
{
	int n = 0;
	snprintf(buf[0], 64, "%s", dp_strategy_names[p->strategy]);
	sets[n++] = (FeSet){"train.strategy", buf[0], "--plan"};
	sets[n++] = (FeSet){"train.gradient_checkpointing", p->gc ? "true" : "false", "--plan"};
	snprintf(buf[1], 64, "%d", p->knob);
	sets[n++] = (FeSet){is_sharded(p->strategy) ? "train.prefetch" : "train.bucket_mb", buf[1], "--plan"};
	if (p->pp > 1)
		sets[n++] = (FeSet){"train.pipeline", sched_names[p->sched], "--plan"};
	if (p->vpr) {
		snprintf(buf[2], 64, "%d", p->vpr);
		sets[n++] = (FeSet){"train.stages_per_rank", buf[2], "--plan"};
	}
	if (p->accum) {
		snprintf(buf[3], 64, "%d", p->accum);
		sets[n++] = (FeSet){"train.grad_accum", buf[3], "--plan"};
	}
	return n;
}

Graph *plan_compile_with(const char *path, const FeOptions *fo, const FeSet *extra, int nextra,
			 FILE *quiet, int to)
{
	FeSet *sets = malloc(sizeof *sets * (size_t)(fo->nsets + nextra + 1));
	if (!sets)
		die("out of memory");
	if (fo->nsets)
		memcpy(sets, fo->sets, sizeof *sets * (size_t)fo->nsets);
	if (nextra)
		memcpy(sets + fo->nsets, extra, sizeof *sets * (size_t)nextra);
	FeOptions o = *fo;
	o.sets = sets;
	o.nsets = fo->nsets + nextra;
	Diag d;
	diag_init(&d, quiet, path, NULL);
	char *src = NULL;
	Graph *g = lower_compile_opts(path, &o, &d, &src);
	PipelineOpts pl = {.verify = 0};
	if (g && (d.nerrors || pipeline_run_part(g, &d, &pl, 0, to) < 0)) {
		ir_free(g);
		g = NULL;
	}
	free(src);
	free(sets);
	return g;
}

/* Compile p through the passes before pipeline[to] (npipeline: all); its
 * graph (NULL when the front end or a pass refused it). */
static Graph *plan_compile(const Plan *p, const PlanOpts *po, FILE *quiet, int to)
{
	FeSet own[6];
	char buf[4][64];
	int nown = plan_sets(p, own, buf);
	FeOptions fo = {.world_size = po->world, .defines = po->defines, .ndefines = po->ndefines,
			.sets = po->sets, .nsets = po->nsets};
	if (!po->mesh) { /* `mesh auto` takes the candidate's axes */
		fo.tp = p->tp;
		fo.cp = p->cp;
		fo.dp_replicate = p->rep;
		fo.pp = p->pp;
	}
	return plan_compile_with(po->path, &fo, own, nown, quiet, to);
}

/*
 * The memory bound: a lower bound of a candidate's memory plan (its arena,
 * peak_bytes), in closed form, without compiling it.
 *
 * The memory plan gives every persistent value (parameters and their
 * 16-bit copies, gradients, optimizer state) a range of its own for the
 * whole step, so the arena is at least their sum; at pp > 1 the arena is
 * the largest stage's, whose persistent part is what every stage keeps plus
 * its own share (passes/stage_params.c), at least 1/pp of the whole. From
 * P, the parameter elements one rank of the candidate's tp holds (the
 * front end and the tp and shape passes, once per tp), D = dp_replicate x
 * dp_shard x cp (no strategy cuts a tensor among more ranks than those: the
 * sharded ones cut over dp_shard x cp, as torchtitan's FSDP does), the
 * dtype sizes and the optimizer's state slots, per element of P / pp:
 *
 *   ddp          params  4 (+ the 16-bit copy's size when computing in 16 bits)
 *                grads   reduce dtype's size;  state 4 x slots
 *   zero1, zero2 params  compute dtype's size (the full copy every rank
 *                        computes with) + 4 / D (the f32 master shard, 16 bits)
 *                grads   reduce size / D;  state 4 x slots / D
 *   full_shard,  params  (compute size + 4 (16 bits)) / D
 *   hybrid_shard grads   reduce size / D;  state 4 x slots / D
 *
 * Plus the activation term (saved_bytes): the temporaries a micro-batch's
 * forward leaves for its backward, all live at once when that backward
 * begins, per sample from the model at the candidate's tp and
 * checkpointing (on one data-parallel rank), times the candidate's
 * micro-batch (at least that compile's batch over its data-parallel
 * ranks), over cp (the sequences are cut) and over pp (the largest stage
 * holds at least the mean; it keeps its persistent and temporary bytes
 * apart, so the two terms add). Gathered parameters, buckets and the other
 * temporaries are left out: how the memory plan packs them is known only
 * after a compile. The bound is 0 (no pruning) where one of its premises does not hold: a
 * block's strategy or precision of its own, `offload` (the state in host
 * memory), or a front end that refuses the tp. plan_eval checks the bound
 * against the memory plan of every candidate it plans (a bound above it
 * stops the search: a bug, not a plan), and tests/simulate.sh over a
 * spread of models, strategies, precisions, checkpointing and meshes.
 */
static void plan_name(char *buf, size_t len, const Plan *p);
static int by_time(const void *a, const void *b);

/* A block's GEMMs by their place in a micro-batch's pipeline path
 * (block_seconds). */
enum {
	BK_FWD,  /* forward, not a recomputation */
	BK_RC,   /* recomputation (gradient checkpointing) */
	BK_BIN,  /* backward, not a weight gradient: the input gradients */
	BK_W,    /* weight gradients (stages_wgrad) */
	BK_N
};

typedef struct StageMemo {
	int gc, pp, v, balanced;
	double m, s; /* stage_bound(gc, pp, v, balanced, m) = s */
} StageMemo;

typedef struct {
	int tp;
	int ok;              /* the premises hold: the bound applies */
	int64_t params;      /* P: parameter elements per rank at this tp */
	int compute, reduce; /* the dtypes' sizes in bytes */
	int slots;           /* optimizer state values per parameter element */
	int nblocks;         /* the model's blocks (0: the front end refused it) */
	int64_t micro_batch; /* at one data-parallel rank (model_mem's compile) */
	double saved[2];     /* the saved activations' bytes per sample, without and
			        with gradient checkpointing (saved_bytes), 0: none */
	double chain_s[2], all_s[2]; /* per sample, the GEMMs' least seconds (gemm_seconds):
					the forward's and input gradients', and all of
					them (recomputations, weight gradients) */
	int grad_accum;      /* micro-batches a step */
	int plain_comm;      /* no gradient compression: the collectives move what the
				strategy says (comm_bound) */
	double tp_bytes[2];  /* per sample, the bytes the step's tp_reduces move (their
				outputs, before the bus factor), without and with
				gradient checkpointing */
	/* The pipeline term (stage_bound), per block b < nb, per sample: */
	int nb;              /* blocks with costs below (0: no pipeline term) */
	int balanced;        /* `stages auto` cuts the blocks (no block has a `stage`):
				the cut's largest run is the least (fwd_flops) */
	double *fwd_flops;   /* [b]: forward FLOPs, as stages.c's balance sums them */
	double *blk_s[2][BK_N]; /* [gc][kind][b]: GEMM seconds (gemm_seconds' rates) */
	struct StageMemo *memo; /* stage_bound's answers, per (gc, pp, v, balanced, m) */
	int nmemo;
} ModelMem;

/*
 * The activation term: bytes per sample of the temporaries the step's
 * forward leaves for its backward, on g after the precision pass (stored
 * dtypes known). A value counts when it is a per-sample temporary (DP_T_ACT
 * with a batch dim: its size is its elements per sample times the
 * micro-batch), written by a forward node that is not a recomputation and
 * read by a backward or recomputing node of the step; values that may
 * share bytes later (views, and the copies the views pass aliases) count
 * once, as their root. At the moment the forward of a micro-batch ends and
 * its backward (or the recomputation before it) begins, every such value
 * is live at once (1F1B and zero_bubble included: each stage ends a
 * micro-batch's forward before that micro-batch's backward), so the memory
 * plan, which gives temporaries bytes of their own apart from the
 * persistent values, reserves at least their sum. Later passes keep them:
 * fusion packs a value and its partner into one buffer of both their
 * sizes, padvocab only widens rows. Parameter-derived values (16-bit
 * copies, gathers) have no batch dim and are left out.
 */
static double saved_bytes(const Graph *g)
{
	/* fwd[v]: a forward node of the step (not a recomputation) writes v;
	 * copy_of[v] - 1: the input of a reshape or tp_copy writing v, which
	 * the views pass may make v a view of (passes/views.c) */
	char *fwd = calloc((size_t)g->nvalues + 1, 1), *saved = calloc((size_t)g->nvalues + 1, 1);
	int *copy_of = calloc((size_t)g->nvalues + 1, sizeof *copy_of);
	if (!fwd || !saved || !copy_of)
		die("out of memory");
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->out < 0 || !(n->progs & IR_IN_STEP))
			continue;
		if (n->phase == PH_FWD && !n->recompute)
			fwd[n->out] = 1;
		if (n->op == DP_OP_RESHAPE || n->op == DP_OP_TP_COPY)
			copy_of[n->out] = n->in[0] + 1;
	}
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || (n->phase != PH_BWD && !n->recompute))
			continue;
		for (int k = 0; k < n->nin; k++) {
			int r = ir_root(g, g->values[n->in[k]])->id;
			if (fwd[n->in[k]] || fwd[r])
				saved[fwd[r] ? r : n->in[k]] = 1;
		}
	}
	double bytes = 0;
	char *seen = fwd; /* reused: the roots counted */
	memset(seen, 0, (size_t)g->nvalues);
	for (int i = 0; i < g->nvalues; i++) {
		if (!saved[i])
			continue;
		const Value *v = g->values[i];
		for (;;) { /* the value it may share bytes with */
			v = ir_root(g, v);
			if (!copy_of[v->id])
				break;
			v = g->values[copy_of[v->id] - 1];
		}
		if (seen[v->id] || v->kind != DP_T_ACT || v->batch_dim < 0 || v->ndim <= v->batch_dim)
			continue;
		seen[v->id] = 1;
		bytes += (double)ir_span(v) / (double)v->dims[v->batch_dim] *
			 (double)ir_dtype_size(v->dtype);
	}
	free(fwd);
	free(saved);
	free(copy_of);
	return bytes;
}

/* The least seconds per sample of g's GEMMs (matmul, linear) in the step,
 * on mc, after the precision pass (their dtypes known): each one's FLOPs
 * (its cost rule, the simulator's) over sim_gemm_rate_cap, the fastest
 * rate the simulator gives a GEMM of its dtype. Into chain: the forward's
 * and the backward's that are not weight gradients (the path a
 * micro-batch takes through the stages and back; a recomputation may run
 * while its stage waits for the gradient, so it is left out); into all:
 * every one, recomputations and weight gradients too. The other kernels are left out (fusion
 * may merge them into fewer FLOPs); a GEMM's FLOPs scale with its rows,
 * the micro-batch's tokens. */
static void gemm_seconds(const Graph *g, const Machine *mc, double *chain, double *all)
{
	*chain = *all = 0;
	double cap[MACH_NDTYPE];
	for (int i = 0; i < MACH_NDTYPE; i++)
		cap[i] = sim_gemm_rate_cap(mc, i);
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		double f = 0, b = 0;
		if (!(n->progs & IR_IN_STEP) || (n->phase != PH_FWD && n->phase != PH_BWD) ||
		    (n->op != DP_OP_MATMUL && n->op != DP_OP_LINEAR) || !ir_ops[n->op].cost)
			continue;
		ir_ops[n->op].cost(g, n, &f, &b);
		double r = cap[g->values[n->in[0]]->dtype == DP_BF16 ? MACH_BF16 : MACH_F32];
		if (r <= 0)
			continue;
		*all += f / r;
		if (!stages_wgrad(g, n) && !n->recompute)
			*chain += f / r;
	}
	double mb = g->cfg.micro_batch ? (double)g->cfg.micro_batch : 1;
	*chain /= mb;
	*all /= mb;
}

/* Per block of g (mm->nb of them), the GEMM seconds per sample of each
 * kind (BK_*) into mm->blk_s[gc], at gemm_seconds' rates; the GEMMs outside
 * every block are left out (a lower bound still: stage_bound only adds). */
static void block_seconds(const Graph *g, const Machine *mc, ModelMem *mm, int gc)
{
	double cap[MACH_NDTYPE];
	for (int i = 0; i < MACH_NDTYPE; i++)
		cap[i] = sim_gemm_rate_cap(mc, i);
	for (int k = 0; k < BK_N; k++) {
		mm->blk_s[gc][k] = calloc((size_t)mm->nb, sizeof(double));
		if (!mm->blk_s[gc][k])
			die("out of memory");
	}
	double mb = g->cfg.micro_batch ? (double)g->cfg.micro_batch : 1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		double f = 0, b = 0;
		if (!(n->progs & IR_IN_STEP) || (n->phase != PH_FWD && n->phase != PH_BWD) ||
		    (n->op != DP_OP_MATMUL && n->op != DP_OP_LINEAR) || !ir_ops[n->op].cost ||
		    n->block < 0 || n->block >= mm->nb)
			continue;
		ir_ops[n->op].cost(g, n, &f, &b);
		double r = cap[g->values[n->in[0]]->dtype == DP_BF16 ? MACH_BF16 : MACH_F32];
		if (r <= 0)
			continue;
		int k = n->recompute ? BK_RC : n->phase == PH_FWD ? BK_FWD : stages_wgrad(g, n) ? BK_W : BK_BIN;
		mm->blk_s[gc][k][n->block] += f / r / mb;
	}
}

/* Bytes per sample of g's step tp_reduces (the forward's, the backward's of
 * every tp_copy, a recomputation's): each an all_reduce over tp of its
 * output (passes/tp.c), on the comm stream, every micro-batch. */
static double tp_reduce_bytes(const Graph *g)
{
	double bytes = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if ((n->progs & IR_IN_STEP) && n->op == DP_OP_TP_REDUCE)
			bytes += stats_coll_bytes(g, n);
	}
	return bytes / (g->cfg.micro_batch ? (double)g->cfg.micro_batch : 1);
}

/* The model's parameters and dtypes at tp (see above): the front end and
 * the passes up to shape, on tp ranks of tp alone (po->mesh: its mesh). */
static ModelMem model_mem(const PlanOpts *po, FILE *quiet, int tp)
{
	ModelMem mm = {.tp = tp};
	FeSet *sets = malloc(sizeof *sets * (size_t)(po->nsets + 2));
	if (!sets)
		die("out of memory");
	if (po->nsets)
		memcpy(sets, po->sets, sizeof *sets * (size_t)po->nsets);
	sets[po->nsets] = (FeSet){"train.strategy", "ddp", "--plan"}; /* not `auto` */
	int shape = pipeline_find("shape") + 1, precision = pipeline_find("precision") + 1;
	for (int gc = 0; gc < 2; gc++) {
		sets[po->nsets + 1] = (FeSet){"train.gradient_checkpointing", gc ? "true" : "false",
					      "--plan"};
		FeOptions fo = {.world_size = po->mesh ? po->world : tp, .defines = po->defines,
				.ndefines = po->ndefines, .sets = sets, .nsets = po->nsets + 2};
		if (!po->mesh)
			fo.tp = tp;
		Diag d;
		diag_init(&d, quiet, po->path, NULL);
		char *src = NULL;
		Graph *g = lower_compile_opts(po->path, &fo, &d, &src);
		PipelineOpts pl = {.verify = 0};
		if (gc == 0 && g && !d.nerrors)
			mm.nblocks = g->nblocks;
		int ok = g && !d.nerrors && pipeline_run_part(g, &d, &pl, 0, shape) >= 0 && !ir_any_offload(g);
		if (gc == 0 && ok && g->nblocks > 0 && !po->mesh) {
			/* the stages pass's costs (its balance): at pp = 1, cp = 1, before
			 * the stages pass, the forward FLOPs of the candidate's blocks over
			 * its micro-batch (all scale with the samples) */
			mm.nb = g->nblocks;
			mm.balanced = 1;
			mm.fwd_flops = calloc((size_t)mm.nb, sizeof *mm.fwd_flops);
			if (!mm.fwd_flops)
				die("out of memory");
			for (int b = 0; b < g->nblocks; b++)
				mm.balanced &= g->blocks[b].stage < 0;
			for (int i = 0; i < g->nnodes; i++) {
				const Node *n = g->nodes[i];
				double f = 0, by = 0;
				if (n->phase == PH_FWD && (n->progs & IR_IN_STEP) && n->block >= 0 &&
				    n->block < g->nblocks && ir_ops[n->op].cost) {
					ir_ops[n->op].cost(g, n, &f, &by);
					mm.fwd_flops[n->block] += f;
				}
			}
		}
		if (gc == 0 && ok) {
			mm.ok = 1;
			for (int b = 0; b < g->nblocks; b++)
				if (g->blocks[b].strategy >= 0 || g->blocks[b].param_dtype >= 0)
					mm.ok = 0;
			for (int i = 0; i < g->nvalues; i++)
				if (g->values[i]->kind == DP_T_PARAM && g->values[i]->view_of < 0)
					mm.params += ir_span(g->values[i]);
			mm.compute = (int)ir_dtype_size((DpDtype)g->param_dtype);
			mm.reduce = (int)ir_dtype_size((DpDtype)g->reduce_dtype);
			mm.slots = g->opt.kind == DP_OPT_ADAMW ? 2 : g->opt.momentum != 0;
			mm.micro_batch = (int64_t)g->cfg.micro_batch * g->cfg.mesh[DP_AXIS_REPLICATE] *
					 g->cfg.mesh[DP_AXIS_SHARD];
		}
		if (ok && mm.ok && pipeline_run_part(g, &d, &pl, shape, precision) >= 0) {
			mm.saved[gc] = saved_bytes(g);
			gemm_seconds(g, po->machine, &mm.chain_s[gc], &mm.all_s[gc]);
			if (mm.nb == g->nblocks)
				block_seconds(g, po->machine, &mm, gc);
			mm.tp_bytes[gc] = tp_reduce_bytes(g);
			mm.plain_comm = 1;
			for (int b = -1; b < g->nblocks; b++) /* -1: train's */
				mm.plain_comm &= ir_block_compress(g, b) == DP_COMPRESS_NONE;
			mm.grad_accum = g->cfg.grad_accum ? (int)g->cfg.grad_accum : 1;
		}
		if (g)
			ir_free(g);
		free(src);
	}
	free(sets);
	return mm;
}

static void model_mem_free(ModelMem *mm)
{
	free(mm->fwd_flops);
	free(mm->memo);
	for (int gc = 0; gc < 2; gc++)
		for (int k = 0; k < BK_N; k++)
			free(mm->blk_s[gc][k]);
}

/* p's micro-batches a step, and its micro-batch's samples at one
 * data-parallel rank (the file's global batch over them). */
static int plan_accum(const Plan *p, const ModelMem *mm)
{
	int m = p->accum ? p->accum : mm->grad_accum;
	return m > 0 ? m : 1;
}

static double plan_micro_batch(const Plan *p, const ModelMem *mm)
{
	return (double)mm->micro_batch * (mm->grad_accum ? mm->grad_accum : 1) / plan_accum(p, mm);
}

/* p's memory bound in bytes (see above), 0 when mm's premises fail. */
static int64_t mem_bound(const Plan *p, const ModelMem *mm)
{
	if (!mm->ok)
		return 0;
	double P = (double)mm->params / p->pp, D = (double)p->rep * p->shard * p->cp;
	double master = mm->compute < 4 ? 4 : 0; /* the f32 masters beside a 16-bit copy */
	double per; /* bytes per element of P */
	if (p->strategy == DP_STRAT_DDP)
		per = 4 + (master ? mm->compute : 0) + mm->reduce + 4.0 * mm->slots;
	else if (!is_sharded(p->strategy))
		per = mm->compute + master / D + (mm->reduce + 4.0 * mm->slots) / D;
	else
		per = (mm->compute + master + mm->reduce + 4.0 * mm->slots) / D;
	/* the activation term: a micro-batch's saved activations, over cp (the
	 * sequence cut) and pp (the largest stage's at least the mean) */
	double act = mm->saved[p->gc] * plan_micro_batch(p, mm) / ((double)p->rep * p->shard) /
		     ((double)p->cp * p->pp);
	return (int64_t)floor(P * per + act);
}

/* Does the group of p's mesh over the axes of mask lie in one node? The
 * simulator's rule (sim_group_in_node) on p's mesh. */
static int plan_in_node(const Plan *p, unsigned mask, int ranks_per_node)
{
	const uint32_t dims[DP_MAX_AXES] = {[DP_AXIS_PP] = p->pp, [DP_AXIS_REPLICATE] = p->rep,
					    [DP_AXIS_SHARD] = p->shard, [DP_AXIS_CP] = p->cp,
					    [DP_AXIS_TP] = p->tp};
	return sim_group_in_node(dims, mask, ranks_per_node);
}

/* Adds to link[] the least seconds of `calls` collectives op over the
 * axes of mask, each on bytes (the whole buffer, as stats_coll_bytes): their
 * bus bytes over the busbw of the link the simulator puts that group on.
 * At pp > 1 the stage's own groups leave pp out (passes/stage_params.c) but
 * a tied parameter's keep it, which may move them off the node: ranks are
 * row-major with pp outermost, so adding pp to a group only ever moves it
 * from the node's link to the inter-node one and adds ranks (bus bytes),
 * and the link of the group without pp bounds both. (Until 2026-11-28 the
 * faster link's bandwidth at every pp > 1: 9 times below the inter-node
 * groups' time on h100-nvlink, so the term ruled out no pipelined mesh.) */
static void comm_add(double *link, const Plan *p, const Machine *mc, IrOp op, unsigned mask,
		     double bytes, double calls)
{
	const int dims[DP_MAX_AXES] = {[DP_AXIS_PP] = 1, [DP_AXIS_REPLICATE] = p->rep,
				       [DP_AXIS_SHARD] = p->shard, [DP_AXIS_CP] = p->cp,
				       [DP_AXIS_TP] = p->tp};
	int ranks = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (mask & DP_AXIS_BIT(a))
			ranks *= dims[a];
	int l = plan_in_node(p, mask, mc->ranks_per_node) ? MACH_INTRA : MACH_INTER;
	double bw = mc->link[l].busbw;
	if (bw > 0)
		link[l] += calls * bytes * stats_bus_factor(op, ranks) / bw;
}

/*
 * The communication bound: the least seconds a rank's collectives keep
 * their links busy in a step, from what the strategy must move
 * (passes/collectives.c, shard.c's table) on P / pp parameter elements (at
 * pp > 1 the busiest stage's at least the mean; its own units), m
 * micro-batches, the reduce (r) and compute (c) dtypes' sizes, cut = the
 * dp_shard x cp group, dp = dp_replicate x cut:
 *
 *   ddp           all_reduce over dp of P r, once a step
 *   zero1         the same, and all_gather over cut of P c (the update's)
 *   zero2         reduce_scatter over cut of P r, all_reduce over
 *                 dp_replicate of P r / cut (when > 1), all_gather of P c
 *   full_shard,   m all_gathers over cut of P c (each micro-batch's
 *   hybrid_shard  forward; the backward's again with reshard_after_forward
 *                 left out), one reduce_scatter over cut of P r (every
 *                 micro-batch unless accumulated unsharded: once at least),
 *                 and hybrid_shard's all_reduce over dp_replicate of P r / cut
 *
 * and at tp > 1 every micro-batch's tp_reduces (tp_bytes per sample) over
 * tp. Each collective takes at least its bus bytes (nccl-tests' factor, as
 * the simulator) over its link's bus bandwidth (the fluid model never
 * gives one more), and the ones on one link share it: the link is busy at
 * least the sum. The gpu executor runs one collective at a time on its
 * comm stream, where all of these are: the sum over the links. The cpu
 * executor runs them concurrently, each link apart: the busiest link.
 * Padding, buckets' latency and the norm's all_reduces only add to it.
 * Every collective sits in the step, so the step is at least this.
 */
static double comm_bound(const Plan *p, const ModelMem *mm, const Machine *mc)
{
	if (!mm->ok || !mm->plain_comm)
		return 0;
	const unsigned R = DP_AXIS_BIT(DP_AXIS_REPLICATE), S = DP_AXIS_BIT(DP_AXIS_SHARD),
		       CP = DP_AXIS_BIT(DP_AXIS_CP), T = DP_AXIS_BIT(DP_AXIS_TP);
	double link[MACH_NLINK] = {0};
	double P = (double)mm->params / p->pp, r = mm->reduce, c = mm->compute;
	double cut = (double)p->shard * p->cp, m = plan_accum(p, mm);
	switch (p->strategy) {
	case DP_STRAT_DDP:
	case DP_STRAT_ZERO1: /* the gradients as ddp's, then zero1's gather */
		comm_add(link, p, mc, DP_OP_ALL_REDUCE, R | S | CP, P * r, 1);
		if (p->strategy == DP_STRAT_ZERO1)
			comm_add(link, p, mc, DP_OP_ALL_GATHER, S | CP, P * c, 1);
		break;
	case DP_STRAT_ZERO2:
		comm_add(link, p, mc, DP_OP_ALL_GATHER, S | CP, P * c, 1);
		comm_add(link, p, mc, DP_OP_REDUCE_SCATTER, S | CP, P * r, 1);
		comm_add(link, p, mc, DP_OP_ALL_REDUCE, R, P * r / cut, 1);
		break;
	default: /* full_shard, hybrid_shard */
		comm_add(link, p, mc, DP_OP_ALL_GATHER, S | CP, P * c, m);
		comm_add(link, p, mc, DP_OP_REDUCE_SCATTER, S | CP, P * r, 1);
		comm_add(link, p, mc, DP_OP_ALL_REDUCE, R, P * r / cut, 1);
	}
	double samples = plan_micro_batch(p, mm) / ((double)p->rep * p->shard) / p->cp;
	if (p->tp > 1)
		comm_add(link, p, mc, DP_OP_TP_REDUCE, T, mm->tp_bytes[p->gc] * samples / p->pp, m);
	double t = 0;
	for (int l = 0; l < MACH_NLINK; l++)
		t = mc->executor == MACH_GPU ? t + link[l] : fmax(t, link[l]);
	return t;
}

/* The least over contiguous cuts of fl[0..n) into k non-empty runs of the
 * largest run's sum (stages.c's balance, without its tie-break). */
static double least_largest_run(const double *fl, int n, int k)
{
	double *pre = calloc((size_t)n + 1, sizeof *pre), *best = malloc(sizeof *best * (size_t)(n + 1)),
	       *next = malloc(sizeof *next * (size_t)(n + 1));
	if (!pre || !best || !next)
		die("out of memory");
	for (int i = 0; i < n; i++)
		pre[i + 1] = pre[i] + fl[i];
	for (int i = 0; i <= n; i++)
		best[i] = i ? pre[i] : 0; /* one run: blocks 0..i-1 */
	for (int r = 2; r <= k; r++) {
		for (int i = 0; i <= n; i++) {
			next[i] = INFINITY;
			for (int j = r - 1; j < i; j++)
				next[i] = fmin(next[i], fmax(best[j], pre[i] - pre[j]));
		}
		memcpy(best, next, sizeof *best * (size_t)(n + 1));
	}
	double f = best[n];
	free(pre), free(best), free(next);
	return f;
}

/*
 * The pipeline term: a lower bound, in seconds per sample of a rank's
 * micro-batch, of a pipelined step of m micro-batches on pp ranks of v
 * virtual stages each (v = 1: 1F1B, zero_bubble; interleaved: v > 1),
 * from the blocks' GEMM seconds at gemm_seconds' rates. Per block: F (the
 * forward), R (recomputation), B (input gradients), W (weight gradients).
 *
 * Rank r's compute stream runs its kernels one after another. It cannot
 * start before the first micro-batch's forward has crossed the virtual
 * stages before its first, 0..r-1 (their F, every GEMM of a forward being
 * on the path to the activation it sends). Its last input gradient (of
 * whichever micro-batch is last) comes after every forward, recomputation
 * and input gradient it runs (each micro-batch's backward follows its own
 * forward, and that one is the last backward), and after it that
 * micro-batch's gradient still crosses the virtual stages before, their B
 * each (every input-gradient GEMM being on the path to the gradient it
 * sends; the weight gradients, which zero_bubble defers, are not). So
 *
 *   step >= F(<r) + B(<r) + m (F + R + B)(rank r)   and
 *   step >= F(<r) + m (F + R + B + W)(rank r),
 *
 * for any schedule: 1F1B's (m + p - 1) (F + B) for equal stages, and the
 * bubble over v under interleaved, whose virtual stages are v times
 * smaller. The p2p transfers and the other kernels only add and are left
 * out. The cut is not compiled, so it is bounded: at v = 1 the least over
 * every contiguous cut of the blocks into pp non-empty stages of the
 * largest stage's terms (dynamic programming, O(pp n^2)); when the stages
 * pass cuts by itself (balanced: no `stage` in the file, and cp = 1, where
 * the blocks' forward FLOPs at the candidate's micro-batch are those of
 * model_mem's compile times one factor), only cuts whose largest run of
 * forward FLOPs is balance's least. At v > 1 rank r holds virtual stages
 * r, r + pp, ...: its prefix is at least the first s_r blocks, s_r >= r
 * (non-empty virtual stages) and, balanced, s_r so large that the n - r
 * virtual stages after it (n = pp v) hold at most (n - r) times the least
 * largest run of the forward FLOPs; the ranks' own work sums to the whole
 * model's, so the step is at least the level L where the ranks filled from
 * their prefixes up to L hold it (water filling): sum_r max(0, L - X_r) =
 * m x total. 0: no term (no blocks, more stages than blocks).
 */
static double stage_bound(ModelMem *mm, int gc, int pp, int v, int balanced, double m)
{
	int nb = mm->nb, n = pp * v;
	if (!nb || !mm->blk_s[gc][0] || n > nb || pp < 2)
		return 0;
	balanced = balanced && mm->balanced;
	for (int i = 0; i < mm->nmemo; i++) {
		const StageMemo *q = &mm->memo[i];
		if (q->gc == gc && q->pp == pp && q->v == v && q->balanced == balanced && q->m == m)
			return q->s;
	}
	double *const *bk = mm->blk_s[gc];
	/* prefix sums over blocks 0..i-1: pb (F + B, the path), pf (F), own (F + R + B),
	 * all (F + R + B + W), fl (forward FLOPs) */
	double *pre = calloc(5 * ((size_t)nb + 1), sizeof *pre);
	if (!pre)
		die("out of memory");
	double *pb = pre, *pf = pb + nb + 1, *own = pf + nb + 1, *all = own + nb + 1, *fl = all + nb + 1;
	for (int b = 0; b < nb; b++) {
		pf[b + 1] = pf[b] + bk[BK_FWD][b];
		pb[b + 1] = pb[b] + bk[BK_FWD][b] + bk[BK_BIN][b];
		own[b + 1] = own[b] + bk[BK_FWD][b] + bk[BK_RC][b] + bk[BK_BIN][b];
		all[b + 1] = own[b + 1] - own[b] + bk[BK_W][b] + all[b];
		fl[b + 1] = fl[b] + mm->fwd_flops[b];
	}
	/* the largest run balance can leave, with room for rounding (the
	 * candidate's FLOPs are these times its samples) */
	double cap = balanced ? least_largest_run(mm->fwd_flops, nb, n) * (1 + 1e-9) : INFINITY;
	double s;
	if (v == 1) {
		/* best[i]: over cuts of blocks 0..i-1 into k stages, the least largest term */
		double *best = malloc(sizeof *best * (size_t)(nb + 1)),
		       *next = malloc(sizeof *next * (size_t)(nb + 1));
		if (!best || !next)
			die("out of memory");
		for (int i = 0; i <= nb; i++)
			best[i] = i ? INFINITY : 0;
		for (int k = 1; k <= pp; k++) {
			for (int i = 0; i <= nb; i++) {
				next[i] = INFINITY;
				for (int j = i - 1; j >= k - 1; j--) { /* the last stage: blocks j..i-1 */
					if (fl[i] - fl[j] > cap)
						break; /* longer runs only grow */
					if (best[j] == INFINITY)
						continue;
					double bwd = pb[i] - pb[j] - (pf[i] - pf[j]); /* B */
					double first = pf[nb] + (pb[nb] - pf[nb]) - (pb[i] - pf[i]); /* its first backward */
					double t = fmax(fmax(pb[j] + m * (own[i] - own[j]), pf[j] + m * (all[i] - all[j])),
							fmax(first + m * bwd + pb[j] - pf[j],
							     first + m * (bwd + all[i] - all[j] - (own[i] - own[j]))));
					next[i] = fmin(next[i], fmax(best[j], t));
				}
			}
			memcpy(best, next, sizeof *best * (size_t)(nb + 1));
		}
		s = best[nb] == INFINITY ? 0 : best[nb];
		free(best), free(next);
	} else {
		/* rank r's prefix: at least blocks 0..at[r]-1 */
		int *at = malloc(sizeof *at * (size_t)pp);
		if (!at)
			die("out of memory");
		for (int r = 0; r < pp; r++) {
			int a = r;
			if (balanced) /* runs r..n-1 hold at most (n - r) cap */
				while (a < nb && fl[a] < fl[nb] - (n - r) * cap)
					a++;
			at[r] = a;
		}
		s = 0;
		/* the rank's work after the path to it (own), after the forward to it
		 * (all), its backward after its first backward (rb) and with the tail */
		double *tail = malloc(sizeof *tail * (size_t)(nb + 1));
		if (!tail)
			die("out of memory");
		for (int b = 0; b <= nb; b++) /* the first backward's time, then B(<r) */
			tail[b] = pf[nb] + pb[b] - pf[b];
		for (int term = 0; term < 4; term++) {
			const double *x = term == 0 ? pb : term == 1 ? pf : tail;
			double total = m * (term == 0 ? own[nb] : term == 1 ? all[nb] : pb[nb] - pf[nb]);
			if (term == 3) /* B and W after the first backward, no tail */
				total = m * (pb[nb] - pf[nb] + all[nb] - own[nb]), x = NULL;
			/* water filling over the ascending prefixes x[at[r]] */
			double level = x ? x[at[0]] : pf[nb], below = 0; /* below: sum of level - x over ranks under it */
			int r = 1;
			for (;;) {
				double next_x = r < pp ? (x ? x[at[r]] : pf[nb]) : INFINITY;
				double need = total - below; /* what is left to fill above `level` over r ranks */
				if (level + need / r <= next_x) {
					level += need / r;
					break;
				}
				below += (next_x - level) * r;
				level = next_x;
				r++;
			}
			s = fmax(s, level);
		}
		free(tail);
		free(at);
	}
	free(pre);
	StageMemo *nm = realloc(mm->memo, sizeof *nm * (size_t)(mm->nmemo + 1));
	if (!nm)
		die("out of memory");
	mm->memo = nm;
	mm->memo[mm->nmemo++] = (StageMemo){gc, pp, v, balanced, m, s};
	return s;
}

/*
 * The time bound: a lower bound of a candidate's simulated step, in closed
 * form. The simulator charges a GEMM at least its FLOPs over
 * sim_gemm_rate_cap (gemm_seconds), and a rank's compute stream runs its
 * kernels one after another. Per micro-batch of one rank (samples: the
 * micro-batch, at least the model_mem compile's over the data-parallel
 * ranks; over cp, the sequence cut), the whole model's GEMMs take A
 * (all_s) and those on a micro-batch's path C (chain_s: forward and input
 * gradients). At pp = 1 the rank runs all of its m
 * micro-batches: m A. At pp > 1 the busiest stage runs at least the mean,
 * m A / pp; and stage s cannot start before the first micro-batch's
 * forward has crossed the stages before it, nor end its work before the
 * last micro-batch's backward has gone back through them after its own,
 * so with s the last stage the step is at least C (every stage's forward
 * and input gradients once, whatever the cut; the last stage's own m
 * micro-batches cover its share). So the step is at least
 * max(m A / pp, C) at pp > 1, m A at pp = 1. Other kernels are left
 * out (fusion). The bound is the larger of that and comm_bound (above):
 * compute and communication may overlap, so they are not added. Where
 * the memory bound's premises fail, comm_bound's only (0 too without
 * them).
 */
static double time_bound(Plan *p, ModelMem *mm, const Machine *mc)
{
	p->comm_bound = comm_bound(p, mm, mc);
	if (!mm->ok || mm->all_s[p->gc] <= 0)
		return p->comm_bound;
	double samples = plan_micro_batch(p, mm) / ((double)p->rep * p->shard) / p->cp;
	double A = mm->all_s[p->gc] * samples, C = mm->chain_s[p->gc] * samples;
	int m = plan_accum(p, mm);
	double compute = fmax(m * A / p->pp, p->pp > 1 ? C : 0);
	if (p->pp > 1) {
		p->pipe_bound = samples * stage_bound(mm, p->gc, p->pp, p->vpr ? p->vpr : 1, p->cp == 1, m);
		compute = fmax(compute, p->pipe_bound);
	}
	return fmax(compute, p->comm_bound);
}

/*
 * Compile and simulate p. The memory plan, the last pass (and the most
 * costly one: 45 % of a compile at GPT-3 175B's shape), runs only when
 * p's memory matters: when p is simulated no slower than keep_below (the
 * tenth fastest plan known to fit, so p may rank in the top 10 or win),
 * else p is PL_SLOWER. Nothing before it depends on it and the simulation
 * reads only its arena size, which PL_SLOWER leaves unknown.
 */
static void plan_eval(Plan *p, const PlanOpts *po, FILE *quiet, double keep_below)
{
	int memplan = pipeline_find("memplan");
	if (memplan != npipeline - 1)
		die("--plan: the memory plan is not the last pass");
	p->compiled = 1;
	Graph *g = plan_compile(p, po, quiet, memplan);
	if (!g) {
		p->state = PL_REFUSED;
		return;
	}
	if (p->pp > 1 && p->sched == IR_PIPE_1F1B) {
		StageCost *sc = calloc((size_t)p->pp, sizeof *sc);
		double bubble;
		int m = g->cfg.grad_accum ? (int)g->cfg.grad_accum : 1;
		if (!sc)
			die("out of memory");
		p->zb_stuck = stages_account(g, sc) &&
			      stages_simulate(sc, p->pp, 1, m, IR_PIPE_ZERO_BUBBLE, &bubble, NULL) < 0;
		free(sc);
	}
	int recomputes = 0;
	for (int i = 0; i < g->nnodes && !recomputes; i++)
		recomputes = g->nodes[i]->recompute;
	if (p->gc && !recomputes) {
		p->state = PL_SAME;
		ir_free(g);
		return;
	}
	SimReport rep;
	if (sim_graph(g, po->machine, &rep, 0) < 0) {
		p->state = PL_REFUSED;
	} else {
		p->step_s = rep.res.step_s;
		p->exposed_s = rep.res.exposed_s;
		p->mfu = p->step_s > 0 ? rep.model_flops / (p->step_s * po->machine->peak_flops[MACH_BF16]) : 0;
		if (p->time_bound > p->step_s * (1 + 1e-9)) {
			char name[160];
			plan_name(name, sizeof name, p);
			die("--plan: the time bound %.6g s is above the simulated step's %.6g s (%s): "
			    "the bound is wrong", p->time_bound, p->step_s, name);
		}
		p->compute_s = 0;
		for (int s = 0; s < rep.nstages; s++)
			p->compute_s = fmax(p->compute_s, rep.stage[s].busy[DP_STREAM_COMPUTE]);
		sim_report_free(&rep);
		if (sim_core_step(g, po->machine, &p->core_s) < 0)
			p->core_s = 0;
		if (fmax(p->core_s, p->class_bound) > p->step_s * (1 + 1e-9)) {
			char name[160];
			plan_name(name, sizeof name, p);
			die("--plan: the class bound %.6g s (this plan's own %.6g s) is above the simulated "
			    "step's %.6g s (%s): the bound is wrong", p->class_bound, p->core_s, p->step_s, name);
		}
		p->state = PL_SLOWER;
		if (p->step_s <= keep_below) {
			Diag d;
			diag_init(&d, quiet, po->path, NULL);
			PipelineOpts pl = {.verify = 0};
			if (pipeline_run_part(g, &d, &pl, memplan, npipeline) < 0) {
				p->state = PL_REFUSED;
			} else {
				p->mem = g->peak_bytes;
				if (p->bound > p->mem) {
					char name[160];
					plan_name(name, sizeof name, p);
					die("--plan: the memory bound %lld B is above the memory plan's "
					    "%lld B (%s): the bound is wrong", (long long)p->bound,
					    (long long)p->mem, name);
				}
				p->state = po->device_memory > 0 && p->mem > po->device_memory ? PL_TOO_BIG
												 : PL_FITS;
			}
		}
	}
	ir_free(g);
}

static void plan_name(char *buf, size_t len, const Plan *p)
{
	char pp[64] = "";
	if (p->pp > 1)
		snprintf(pp, sizeof pp, "pp=%d %s ", p->pp, sched_names[p->sched]);
	if (p->vpr)
		snprintf(pp + strlen(pp), sizeof pp - strlen(pp), "v=%d ", p->vpr);
	if (p->accum)
		snprintf(pp + strlen(pp), sizeof pp - strlen(pp), "grad_accum=%d ", p->accum);
	snprintf(buf, len, "%stp=%d cp=%d dp_replicate=%d dp_shard=%d %s%s %s=%d", pp, p->tp, p->cp,
		 p->rep, p->shard, dp_strategy_names[p->strategy], p->gc ? " +ckpt" : "",
		 is_sharded(p->strategy) ? "prefetch" : "bucket_mb", p->knob);
}

/*
 * The dominance rule: a lower bound of p's step from the candidates of its
 * mesh already simulated, without compiling p. A candidate q of the same
 * mesh and strategy runs a subset of p's kernels when q has no gradient
 * checkpointing or p has it too (the knob and the pipeline schedule only
 * group and order the same collectives and kernels; checkpointing adds
 * the recomputed forwards): every stage's compute stream runs at least q's
 * busiest stage's kernels, one after another, so p's step is at least
 * q.compute_s. That needs the same stages: interleaved cuts the blocks
 * into pp x v virtual stages, another cut whose busiest rank may do less
 * than 1F1B's busiest stage, so only a q of the same v (0 for the other
 * schedules, which share the stages auto cut) bounds p. When a plan that fits is simulated no slower than that
 * bound, p cannot be faster: it is dominated and not compiled. 0: no bound.
 */
static double compute_bound(const Plan *p, const Plan *mesh, int n)
{
	double lb = 0;
	for (int i = 0; i < n; i++) {
		const Plan *q = &mesh[i];
		if (q == p || q->strategy != p->strategy || (q->gc && !p->gc) || q->vpr != p->vpr)
			continue;
		if (q->state == PL_FITS || q->state == PL_TOO_BIG || q->state == PL_SLOWER)
			lb = fmax(lb, q->compute_s);
	}
	return lb;
}

/*
 * The class rule: candidates of the same pp, tp, cp, schedule,
 * stages_per_rank, grad_accum and checkpointing (same_class) run the same
 * kernels, transfers and tp and cp collectives on a micro-batch's path,
 * in the same order, whatever their data-parallel strategy, knob and
 * split of the data-parallel ranks (dp_replicate x dp_shard, their
 * product the same): those only add the gradients' and parameters'
 * collectives, their waits, and kernels outside the path (accumulation,
 * casts, the update). sim_core_step replays one compiled candidate with
 * those left out, which no op of the others can make faster, so its
 * answer is at most every member's simulated step. A member whose class
 * bound is no faster than the tenth fastest plan that fits cannot enter
 * the table: it is not compiled (PL_CLASS). Each class's member of least
 * time bound is compiled first (the class phase), so that its bound is
 * known before the other phases. plan_eval checks every simulated step
 * against its class bound, and DPC_PLAN_CHECK every class's bounds
 * against every member's step.
 */
static int same_class(const Plan *a, const Plan *b)
{
	return a->pp == b->pp && a->tp == b->tp && a->cp == b->cp && a->sched == b->sched &&
	       a->vpr == b->vpr && a->accum == b->accum && a->gc == b->gc;
}

static int by_class(const void *x, const void *y)
{
	const Plan *a = *(const Plan *const *)x, *b = *(const Plan *const *)y;
	int ka[] = {a->pp, a->tp, a->cp, a->sched, a->vpr, a->accum, a->gc};
	int kb[] = {b->pp, b->tp, b->cp, b->sched, b->vpr, b->accum, b->gc};
	for (int i = 0; i < 7; i++)
		if (ka[i] != kb[i])
			return (ka[i] > kb[i]) - (ka[i] < kb[i]);
	return (a > b) - (a < b);
}

/* Every candidate's class index (Plan.cls); returns the number of classes. */
static int classify(Plan *plans, int n)
{
	Plan **by = malloc(sizeof *by * ((size_t)n + 1));
	if (!by)
		die("out of memory");
	for (int i = 0; i < n; i++)
		by[i] = &plans[i];
	qsort(by, (size_t)n, sizeof *by, by_class);
	int ncls = 0;
	for (int i = 0; i < n; i++) {
		if (i && !same_class(by[i - 1], by[i]))
			ncls++;
		by[i]->cls = ncls;
	}
	free(by);
	return n ? ncls + 1 : 0;
}

/* Each class's bound: the largest core_s of its compiled members, onto
 * every member (cb: scratch of ncls). */
static void class_bounds(Plan *plans, int n, double *cb, int ncls)
{
	for (int c = 0; c < ncls; c++)
		cb[c] = 0;
	for (int i = 0; i < n; i++)
		cb[plans[i].cls] = fmax(cb[plans[i].cls], plans[i].core_s);
	for (int i = 0; i < n; i++)
		plans[i].class_bound = cb[plans[i].cls];
}

/*
 * --plan-classes: a search that is not exhaustive beyond a bound, and says
 * so. At GPT-3 175B's shape on 512 ranks the class phase alone would
 * compile ~1,550 representatives, ~1,000 of them pipelined at 1 to 7 CPU-s
 * each (the unrolled micro-batches): the search does not finish on a
 * loaded 2-core machine. When the class phase would compile more than
 * max classes (those with a representative the seed's plan does not rule
 * out by its time bound), it compiles the max whose compiles are cheapest,
 * the fewest micro-batches a step (what a compile unrolls; the time bound
 * cannot order them: at that shape it is 8.7 to 16 s against plans of 17
 * s, and pp = 1's classes rank 505th and after by it), then of least time
 * bound, then in class order, and no member of the others is searched in
 * any phase (PL_UNSEARCHED). The output names how many were left out, where (by
 * pp), and their least time bound: when that is no faster than the
 * winner's step, no left-out candidate can beat the winner, which is then
 * the exhaustive search's (and the table's, when no faster than its
 * tenth). Below the bound (every search of tests/simulate.sh) the search
 * is exhaustive and its output as before.
 */
typedef struct {
	int max;        /* the limit (0: not applied, every class searched) */
	int wanted;     /* the classes the class phase would have compiled */
	int left_out;   /* those not searched */
	int candidates; /* their members, PL_UNSEARCHED */
	int by_pp[3];   /* of those, at pp = 1, 2 and >= 4 */
	double least;   /* their least time bound (0: one has none) */
} ClassLimit;

typedef struct {
	int m;     /* micro-batches a step: what a compile unrolls */
	double tb; /* the representative's time bound */
	int cls;
} ClassKey;

static int by_key(const void *x, const void *y)
{
	const ClassKey *a = x, *b = y;
	if (a->m != b->m)
		return (a->m > b->m) - (a->m < b->m);
	if (a->tb != b->tb)
		return (a->tb > b->tb) - (a->tb < b->tb);
	return (a->cls > b->cls) - (a->cls < b->cls);
}

/* rep[c]: class c's representative (-1: none); max: --plan-classes. */
static ClassLimit limit_classes(Plan *plans, int n, const int *rep, int ncls, int max, int file_accum)
{
	ClassLimit cl = {0};
	if (max < 0)
		return cl;
	if (!max)
		max = PLAN_CLASSES;
	double best = INFINITY; /* the seed's plan: what the class phase holds time bounds against */
	for (int i = 0; i < n; i++)
		if (plans[i].state == PL_FITS)
			best = fmin(best, plans[i].step_s);
	ClassKey *k = malloc(sizeof *k * ((size_t)ncls + 1));
	char *out = calloc((size_t)ncls + 1, 1);
	if (!k || !out)
		die("out of memory");
	int nk = 0;
	for (int c = 0; c < ncls; c++) {
		const Plan *r = rep[c] >= 0 ? &plans[rep[c]] : NULL;
		if (r && !(r->time_bound > 0 && best <= r->time_bound))
			k[nk++] = (ClassKey){r->accum ? r->accum : file_accum, r->time_bound, c};
	}
	if (nk > max) {
		qsort(k, (size_t)nk, sizeof *k, by_key);
		cl.max = max;
		cl.wanted = nk;
		cl.left_out = nk - max;
		for (int j = max; j < nk; j++)
			out[k[j].cls] = 1;
		cl.least = INFINITY;
		for (int i = 0; i < n; i++) {
			Plan *p = &plans[i];
			if (!out[p->cls] || p->state != PL_TODO)
				continue;
			p->state = PL_UNSEARCHED;
			p->class_rep = 0;
			cl.candidates++;
			cl.by_pp[p->pp >= 4 ? 2 : p->pp - 1]++;
			cl.least = p->time_bound > 0 ? fmin(cl.least, p->time_bound) : 0;
		}
	}
	free(k);
	free(out);
	return cl;
}

/* The line that says a search was not exhaustive, and what that can
 * change: best, the winner's step (INFINITY: none fits), tenth the
 * table's tenth (INFINITY: fewer). A left-out candidate can beat a plan
 * only when its time bound is below that plan's step (or it has none).
 * Nothing when every class was searched. */
static void limit_note(FILE *out, const ClassLimit *cl, const Plan *plans, int n, double best,
		       double tenth)
{
	if (!cl->max)
		return;
	int below_best = 0, below_tenth = 0;
	for (int i = 0; i < n; i++)
		if (plans[i].state == PL_UNSEARCHED) {
			below_best += plans[i].time_bound < best;
			below_tenth += plans[i].time_bound < tenth;
		}
	fprintf(out, "not exhaustive (--plan-classes=%d): the class phase compiled the %d of %d classes "
		"with the fewest micro-batches, then least time bound; %d candidates of the other %d not "
		"searched (%d at pp=1, %d at pp=2, %d at pp>=4), their least time bound %.3f ms: ",
		cl->max, cl->max, cl->wanted, cl->candidates, cl->left_out, cl->by_pp[0], cl->by_pp[1],
		cl->by_pp[2], 1e3 * cl->least);
	if (best == INFINITY)
		fprintf(out, "one of them may fit (--plan-classes=all searches them)\n");
	else if (!below_tenth)
		fprintf(out, "none can beat the tenth plan, the table is the exhaustive search's\n");
	else if (!below_best)
		fprintf(out, "none can beat the winner, which is the exhaustive search's (%d may rank "
			"below it)\n", below_tenth);
	else
		fprintf(out, "%d have a time bound below the winner's step and may be faster "
			"(--plan-classes=all searches them)\n", below_best);
}

/* The table's length. */
#define TOP 10

/* The search's state: the candidates, grouped by mesh, and what the
 * workers need. */
typedef struct {
	Plan *plans;
	const int *mesh_start; /* mesh m's candidates: [mesh_start[m], mesh_start[m + 1]) */
	int nmesh, n;
	const PlanOpts *po;
	FILE *quiet;
	int check;             /* DPC_PLAN_CHECK=1: every candidate compiled and planned */
	const char *seed;      /* [mesh]: 1 for the seed phase's meshes */
	double prior_best;     /* the fastest plan that fits, of the phases before this one */
	double prior_tenth;    /* the tenth fastest of them (INFINITY: fewer than ten) */
	double prior_fits[TOP]; /* the ten fastest of them, ascending (keep_fastest) */
	int prior_nfits;
	int use_class;         /* the class rule (not under DPC_PLAN_CHECK or DPC_PLAN_NO_CLASS) */
	int64_t batch;         /* samples a step at one data-parallel rank (ModelMem's
				  micro_batch), 0: unknown */
	double t0, last;       /* progress */
	int workers;           /* the most that ran at once */
} Search;

/* The seed phase (before phase 1): on a few meshes, the candidate with the
 * least time bound (then memory bound), so that phases 1 and 2 start with
 * a plan that fits to hold the time bounds against. */
#define PHASE_SEED 4

/* The class phase (after the seed): each class's representative, the
 * candidate of least time bound, so that phases 1 to 3 hold the class
 * bound against every member. */
#define PHASE_CLASS 5

/* fits[0..n-1]: the fastest step times of plans that fit, ascending, at
 * most TOP; p's added when it fits. Returns the new count. */
static int keep_fastest(double *fits, int n, const Plan *p)
{
	if (p->state != PL_FITS || (n == TOP && fits[TOP - 1] <= p->step_s))
		return n;
	int i = n < TOP ? n++ : TOP - 1; /* the slot it takes, then moved up */
	for (; i > 0 && fits[i - 1] > p->step_s; i--)
		fits[i] = fits[i - 1];
	fits[i] = p->step_s;
	return n;
}

/* The mesh's probe: the candidate likely fastest (no checkpointing, the
 * least sharded strategy, its first knob and schedule), or 0. */
static int mesh_probe(const Plan *mp, int nm)
{
	int i = nm - 1;
	while (i > 0 && !mp[i - 1].gc && mp[i - 1].strategy == mp[nm - 1].strategy)
		i--;
	return mp[i].gc ? 0 : i;
}

/*
 * Mesh m's part of a phase. Phase 1: its first candidate, the one with the
 * least memory (the memory bound's anchor). Phase 2: its probe, so that
 * phase 3 starts from a fast plan that fits. Phase 3: the rest, unless the
 * memory bound pruned them, each compiled unless the dominance rule rules
 * it out against the fastest plan that fits among the earlier phases' and
 * the mesh's own. Only what the mesh itself and the earlier phases found
 * decides (never another mesh's phase 3), so the search is the same
 * whichever worker runs which mesh, and in whichever order.
 */
static void search_mesh(const Search *se, int phase, int m)
{
	Plan *mp = se->plans + se->mesh_start[m];
	int nm = se->mesh_start[m + 1] - se->mesh_start[m], probe = mesh_probe(mp, nm);
	if (phase == 0) { /* no plan fits: for the message, the mesh's least-memory plan
			     among those the bound ruled out (the first with a memory plan) */
		for (int i = 0; i < nm && mp[i].state != PL_FITS && mp[i].state != PL_TOO_BIG; i++)
			if (mp[i].state == PL_BOUND) {
				plan_eval(&mp[i], se->po, se->quiet, INFINITY);
				if (mp[i].state == PL_TOO_BIG)
					break;
			}
		return;
	}
	if (phase == PHASE_SEED) { /* the mesh's candidate with the least time bound, then memory */
		int k = -1;
		for (int i = 0; i < nm && se->seed[m]; i++)
			if (mp[i].state == PL_TODO &&
			    (k < 0 || mp[i].time_bound < mp[k].time_bound ||
			     (mp[i].time_bound == mp[k].time_bound && mp[i].bound < mp[k].bound)))
				k = i;
		if (k >= 0)
			plan_eval(&mp[k], se->po, se->quiet, INFINITY);
		return;
	}
	if (phase == PHASE_CLASS) { /* the classes' representatives on this mesh */
		for (int i = 0; i < nm; i++) {
			Plan *p = &mp[i];
			if (!p->class_rep || p->state != PL_TODO ||
			    (p->time_bound > 0 && se->prior_best <= p->time_bound))
				continue; /* the time bound rules out its whole class: later */
			if (p->class_bound > 0 && se->prior_tenth <= p->class_bound)
				p->state = PL_CLASS;
			else /* its memory planned when it beats the seed's best, else
				later if it may rank (plan_late_memory) */
				plan_eval(p, se->po, se->quiet, se->prior_best);
		}
		return;
	}
	if ((phase == 1 && mp[0].state == PL_TODO) || (phase == 2 && probe && mp[probe].state == PL_TODO)) {
		Plan *p = &mp[phase == 1 ? 0 : probe];
		if (!se->check && p->time_bound > 0 && se->prior_best <= p->time_bound)
			p->state = PL_TIME; /* a plan of the phases before is no slower */
		else if (se->use_class && p->class_bound > 0 && se->prior_tenth <= p->class_bound)
			p->state = PL_CLASS; /* nor can it rank among the ten */
		else
			plan_eval(p, se->po, se->quiet, INFINITY);
		return;
	}
	if (phase != 3)
		return;
	/* the ten fastest that fit, known here: the earlier phases' and this
	 * mesh's own (not the other meshes' of this phase that this process
	 * happened to run before, which would make the work depend on the
	 * workers) */
	double best = se->prior_best, fits[TOP];
	int nfits = se->prior_nfits;
	memcpy(fits, se->prior_fits, sizeof fits);
	for (int i = 1; i < nm; i++) {
		Plan *p = &mp[i];
		if (p->state == PL_PRUNED)
			break; /* the whole mesh is */
		if (p->state != PL_TODO) /* the probe, the seed's, or ruled out by a bound */
			continue;
		if (p->sched == IR_PIPE_ZERO_BUBBLE && mp[i - 1].zb_stuck) {
			p->state = PL_REFUSED; /* its 1F1B sibling (the one before) found it */
			continue;
		}
		if (se->check) { /* every candidate's memory plan, against its bound */
			plan_eval(p, se->po, se->quiet, INFINITY);
			continue;
		}
		double lb = compute_bound(p, mp, nm);
		if (lb > 0 && best <= lb) {
			p->state = PL_DOMINATED;
			continue;
		}
		if (p->time_bound > 0 && best <= p->time_bound) {
			p->state = PL_TIME;
			continue;
		}
		double tenth = nfits < TOP ? INFINITY : fits[TOP - 1], cb = p->class_bound;
		for (int k = 0; k < nm && se->use_class; k++) /* and this mesh's own */
			if (mp[k].cls == p->cls)
				cb = fmax(cb, mp[k].core_s);
		if (se->use_class && cb > 0 && tenth <= cb) {
			p->state = PL_CLASS;
			continue;
		}
		plan_eval(p, se->po, se->quiet, tenth);
		nfits = keep_fastest(fits, nfits, p);
		if (p->state == PL_FITS)
			best = fmin(best, p->step_s);
	}
}

/*
 * The memory plans the class phase put off (it plans a representative's
 * memory only when it is faster than the seed's plan, since at scale the
 * memory plan is half to 70 % of a compile): after the class phase (so
 * that the later phases have ten plans that fit to hold the class bound
 * against) and after the last, each simulated plan whose memory is not
 * planned (PL_SLOWER) and that may rank among the ten fastest that fit,
 * fastest first, compiled again with it. A phase's own PL_SLOWER plans
 * are slower than ten that fit already.
 */
static void plan_late_memory(Search *se)
{
	Plan **slow = malloc(sizeof *slow * ((size_t)se->n + 1));
	double fits[TOP];
	int nslow = 0, nfits = 0;
	if (!slow)
		die("out of memory");
	for (int i = 0; i < se->n; i++) {
		if (se->plans[i].state == PL_SLOWER)
			slow[nslow++] = &se->plans[i];
		nfits = keep_fastest(fits, nfits, &se->plans[i]);
	}
	qsort(slow, (size_t)nslow, sizeof *slow, by_time);
	for (int i = 0; i < nslow && (nfits < TOP || slow[i]->step_s < fits[TOP - 1]); i++) {
		plan_eval(slow[i], se->po, se->quiet, INFINITY);
		nfits = keep_fastest(fits, nfits, slow[i]);
	}
	free(slow);
}

/* The seed phase's meshes: for each tp, the mesh without pipeline stages
 * (whose bound leaves out the bubble) or cp, every data-parallel rank in
 * dp_shard (Megatron-LM's tp with ZeRO or FSDP over the rest), unless the
 * data-parallel ranks do not divide the batch (the front end refuses it
 * when the file sets global_batch). Its candidate with the least time
 * bound, then memory bound, among those no bound ruled out, is compiled
 * (search_mesh). */
static void pick_seeds(Search *se)
{
	for (int m = 0; m < se->nmesh; m++) {
		const Plan *first = &se->plans[se->mesh_start[m]];
		((char *)se->seed)[m] = first->pp == 1 && first->cp == 1 && first->rep == 1 &&
					(!se->batch || se->batch % first->shard == 0);
	}
}

static void progress(Search *se, int phase, int meshes_done, int force)
{
	double t = now_s();
	if ((!force && t - se->last < 1) || (se->po->brief && t - se->t0 < 1))
		return; /* strategy auto: quiet when the search is quick */
	int compiled = 0;
	for (int i = 0; i < se->n; i++)
		compiled += se->plans[i].compiled;
	char label[32];
	snprintf(label, sizeof label, phase == PHASE_SEED    ? "seed"
				      : phase == PHASE_CLASS ? "classes"
							     : "phase %d", phase);
	fprintf(stderr, "dpc: --plan: %s: %d of %d meshes, %d of %d candidates compiled, %.1f s\n",
		label, meshes_done, se->nmesh, compiled, se->n, t - se->t0);
	se->last = t;
}

static void write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t k = write(fd, p, len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			_exit(2);
		p += k;
		len -= (size_t)k;
	}
}

/* Reads len bytes; 0, or -1 at the end of the pipe or an error. */
static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len) {
		ssize_t k = read(fd, p, len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

/*
 * One phase over every mesh, on up to `jobs` forked workers (the compiles
 * are independent: each worker has the parent's memory as it was at the
 * fork). The workers take the meshes in order from a counter they share
 * (a page mapped shared before the fork), each the next one not taken, so
 * that a worker given costly meshes (the pipelined ones, the unrolled
 * micro-batches) or less of a loaded machine's CPU holds up no other;
 * after each mesh a worker writes its index and its candidates to its
 * pipe, which the parent copies into se->plans. Which worker runs which
 * mesh changes nothing: a mesh decides from the earlier phases and itself
 * only (search_mesh). One worker, or one mesh: in this process.
 */
static void search_phase(Search *se, int phase, int jobs)
{
	se->prior_best = INFINITY; /* what the time bound holds against in phases 1 and 2 */
	double fits[TOP];
	int nfits = 0;
	for (int i = 0; i < se->n; i++) {
		if (se->plans[i].state == PL_FITS)
			se->prior_best = fmin(se->prior_best, se->plans[i].step_s);
		nfits = keep_fastest(fits, nfits, &se->plans[i]);
	}
	se->prior_tenth = se->use_class && nfits == TOP ? fits[TOP - 1] : INFINITY;
	memcpy(se->prior_fits, fits, sizeof fits);
	se->prior_nfits = nfits;
	int W = jobs < se->nmesh ? jobs : se->nmesh;
	if (W < 1)
		W = 1;
	if (W > se->workers)
		se->workers = W;
	if (W == 1) {
		for (int m = 0; m < se->nmesh; m++) {
			search_mesh(se, phase, m);
			progress(se, phase, m + 1, 0);
		}
		progress(se, phase, se->nmesh, 1);
		return;
	}
	fflush(NULL);
	int *next = mmap(NULL, sizeof *next, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (next == MAP_FAILED)
		die("--plan: mmap: %s", strerror(errno));
	*next = 0;
	pid_t *pid = malloc(sizeof *pid * (size_t)W);
	struct pollfd *fds = malloc(sizeof *fds * (size_t)W);
	if (!pid || !fds)
		die("out of memory");
	for (int w = 0; w < W; w++) {
		int fd[2];
		if (pipe(fd) < 0)
			die("--plan: pipe: %s", strerror(errno));
		pid[w] = fork();
		if (pid[w] < 0)
			die("--plan: fork: %s", strerror(errno));
		if (pid[w] == 0) {
			close(fd[0]);
			for (int k = 0; k < w; k++)
				close(fds[k].fd);
			for (int m; (m = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < se->nmesh;) {
				search_mesh(se, phase, m);
				int lo = se->mesh_start[m], nm = se->mesh_start[m + 1] - lo;
				write_all(fd[1], &m, sizeof m);
				write_all(fd[1], se->plans + lo, sizeof *se->plans * (size_t)nm);
			}
			_exit(0);
		}
		close(fd[1]);
		fds[w] = (struct pollfd){.fd = fd[0], .events = POLLIN};
	}
	int open_fds = W, done = 0;
	while (open_fds) {
		if (poll(fds, (nfds_t)W, 1000) < 0 && errno != EINTR)
			die("--plan: poll: %s", strerror(errno));
		for (int w = 0; w < W; w++) {
			if (fds[w].fd < 0 || !(fds[w].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			int m;
			if (read_all(fds[w].fd, &m, sizeof m) < 0) { /* the worker is done */
				close(fds[w].fd);
				fds[w].fd = -1;
				open_fds--;
				continue;
			}
			if (m < 0 || m >= se->nmesh)
				die("--plan: worker %d sent mesh %d", w, m);
			int lo = se->mesh_start[m], nm = se->mesh_start[m + 1] - lo;
			if (read_all(fds[w].fd, se->plans + lo, sizeof *se->plans * (size_t)nm) < 0)
				die("--plan: worker %d stopped in mesh %d", w, m);
			done++;
		}
		progress(se, phase, done, 0);
	}
	int failed = 0;
	for (int w = 0; w < W; w++) {
		int st;
		while (waitpid(pid[w], &st, 0) < 0 && errno == EINTR)
			;
		failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	if (failed || done != se->nmesh)
		die("--plan: a worker failed (%d of %d meshes searched)", done, se->nmesh);
	progress(se, phase, done, 1);
	munmap(next, sizeof *next);
	free(pid);
	free(fds);
}

/* Does the file fix the global batch (global_batch), so that another
 * grad_accum only cuts it into other micro-batches? The front end at
 * twice the file's grad_accum on one rank: the same global batch. */
static int global_batch_fixed(const PlanOpts *po, FILE *quiet, int accum)
{
	FeSet *sets = malloc(sizeof *sets * (size_t)(po->nsets + 2));
	char buf[32];
	if (!sets)
		die("out of memory");
	if (po->nsets)
		memcpy(sets, po->sets, sizeof *sets * (size_t)po->nsets);
	snprintf(buf, sizeof buf, "%d", 2 * accum);
	sets[po->nsets] = (FeSet){"train.strategy", "ddp", "--plan"};
	sets[po->nsets + 1] = (FeSet){"train.grad_accum", buf, "--plan"};
	int64_t gb[2] = {-1, -2};
	for (int k = 0; k < 2; k++) {
		FeOptions fo = {.world_size = po->mesh ? po->world : 1, .defines = po->defines,
				.ndefines = po->ndefines,
				.sets = sets, .nsets = po->nsets + 1 + k};
		Diag d;
		diag_init(&d, quiet, po->path, NULL);
		char *src = NULL;
		Graph *g = lower_compile_opts(po->path, &fo, &d, &src);
		if (g && !d.nerrors)
			gb[k] = ir_global_batch(g);
		if (g)
			ir_free(g);
		free(src);
	}
	free(sets);
	return gb[0] == gb[1];
}

/* Faster first; of equal time, less memory. */
static int by_time(const void *a, const void *b)
{
	const Plan *x = *(const Plan *const *)a, *y = *(const Plan *const *)b;
	if (x->step_s != y->step_s)
		return (x->step_s > y->step_s) - (x->step_s < y->step_s);
	return (x->mem > y->mem) - (x->mem < y->mem); /* a tie: the smaller first */
}

/* Append the candidates of one mesh, the least memory first (the most
 * sharded strategy, with checkpointing; at pp > 1 under 1F1B, which keeps
 * fewest micro-batches in flight, then zero_bubble, then interleaved at v
 * = 2 .. vmax, which keeps more). */
static int mesh_plans(Plan *out, int pp, int tp, int cp, int rep, int shard, int vmax, int accum)
{
	int n = 0, dp = rep * shard;
	static const int scheds[] = {IR_PIPE_1F1B, IR_PIPE_ZERO_BUBBLE};
	static const int order[] = {DP_STRAT_FULL_SHARD, DP_STRAT_HYBRID_SHARD, DP_STRAT_ZERO2,
				    DP_STRAT_ZERO1, DP_STRAT_DDP};
	for (int gc = 1; gc >= 0; gc--)
		for (size_t s = 0; s < sizeof order / sizeof order[0]; s++) {
			int st = order[s];
			if (dp == 1 && st != DP_STRAT_DDP)
				continue; /* one data-parallel rank: every strategy is ddp */
			if (st == DP_STRAT_HYBRID_SHARD && (rep == 1 || shard == 1))
				continue;
			/* full_shard shards over dp_shard only: the front end refuses
			 * it at dp_replicate > 1 (ir_strategy_fits: hybrid_shard's
			 * mesh). Not a candidate there: as one it was refused in
			 * 2 ms, but it came first in its mesh and its class, so it
			 * was the mesh's least-memory anchor (a refused anchor
			 * prunes nothing) and, its time bound tying hybrid_shard's,
			 * often its class's representative (a refused one bounds
			 * nothing): at GPT-3 175B's shape on 512 ranks 113 of the
			 * class phase's first 177 compiles. */
			if (st == DP_STRAT_FULL_SHARD && (shard == 1 || rep > 1))
				continue;
			for (int k = 0; k < 2; k++) /* zero_bubble right after its 1F1B sibling */
				for (int q = 0; q < (pp > 1 ? 2 + (vmax > 1 ? vmax - 1 : 0) : 1); q++) {
					int knob = is_sharded(st) ? 1 + k : k ? 100 : 25;
					out[n++] = (Plan){.pp = pp, .tp = tp, .cp = cp, .rep = rep,
							  .shard = shard, .strategy = st, .gc = gc,
							  .knob = knob, .state = PL_TODO,
							  .sched = pp == 1 ? -1 : q < 2 ? scheds[q]
									    : IR_PIPE_INTERLEAVED,
							  .vpr = pp > 1 && q >= 2 ? q : 0,
							  .accum = accum};
				}
		}
	return n;
}

/* What p loses to b by: the larger of its extra compute and its extra
 * exposed communication (at pp > 1 its waits: transfers and the bubble). */
static void why_slower(char *why, size_t len, const Plan *p, const Plan *b)
{
	char h[64];
	double dc = p->compute_s - b->compute_s, de = p->exposed_s - b->exposed_s;
	if (p->step_s - b->step_s <= 1e-4 * b->step_s && p->mem == b->mem)
		snprintf(why, len, "a tie");
	else if (p->step_s - b->step_s <= 1e-4 * b->step_s)
		snprintf(why, len, "as fast, %s more memory",
			 stats_human_bytes(h, sizeof h, (double)(p->mem - b->mem)));
	else if (dc >= de)
		snprintf(why, len, "+%.3f ms compute", 1e3 * dc);
	else if (p->pp > 1)
		snprintf(why, len, "+%.3f ms waiting (bubble, comm)", 1e3 * de);
	else
		snprintf(why, len, "+%.3f ms exposed comm", 1e3 * de);
}

int plan_run(const PlanOpts *po, FILE *out, PlanChoice *choice)
{
	int N = po->world;
	int cap = 64, n = 0;
	Plan *plans = malloc(sizeof *plans * (size_t)cap);
	int *mesh_start = NULL, nmesh = 0;
	if (!plans)
		die("out of memory");
	FILE *quiet = fopen("/dev/null", "w");
	if (!quiet)
		die("--plan: cannot open /dev/null");
	/* the blocks, which bound interleaved's virtual stages */
	ModelMem first = model_mem(po, quiet, po->mesh ? (int)po->mesh[DP_AXIS_TP] : 1);
	int nblocks = first.nblocks;
	/* grad_accum is searched at pp > 1 where the file fixes the global batch
	 * (global_batch, not micro_batch): 0 where not */
	int file_accum = first.grad_accum;
	int64_t global = first.ok && file_accum && global_batch_fixed(po, quiet, file_accum)
				 ? first.micro_batch * file_accum : 0;
	model_mem_free(&first);
	/* pp where it divides the world (the front end refuses more stages
	 * than blocks: counted as refused) */
	for (int pp = 1; pp <= N; pp++) {
		if (N % pp || (po->mesh && (uint32_t)pp != po->mesh[DP_AXIS_PP]))
			continue;
		int M = N / pp;
		for (int tp = 1; tp <= M; tp++) {
			if (M % tp || (po->mesh ? (uint32_t)tp != po->mesh[DP_AXIS_TP]
						: tp > po->machine->ranks_per_node))
				continue;
			for (int cp = 1; cp <= M / tp; cp++) {
				if ((M / tp) % cp || (po->mesh ? (uint32_t)cp != po->mesh[DP_AXIS_CP]
							    : cp > po->machine->ranks_per_node))
					continue;
				int dp = M / tp / cp;
				for (int rep = 1; rep <= dp; rep++) {
					if (dp % rep || (po->mesh && (uint32_t)rep != po->mesh[DP_AXIS_REPLICATE]))
						continue;
					int vmax = pp > 1 ? nblocks / pp : 0;
					vmax = vmax > VPR_MAX ? VPR_MAX : vmax;
					int accums[ACCUM_MAX + 1], naccum = 0;
					accums[naccum++] = 0; /* the file's */
					for (int k = 1; pp > 1 && global && k <= ACCUM_MAX; k *= 2)
						if (global % ((int64_t)dp * pp * k) == 0 && pp * k != file_accum &&
						    pp * k <= ACCUM_CAP)
							accums[naccum++] = pp * k;
					for (int a = 0; a < naccum; a++) { /* a group of its own each */
						if (n + 32 * (vmax + 2) > cap) { /* a group's at most */
							cap = 2 * cap + 32 * (vmax + 2);
							plans = realloc(plans, sizeof *plans * (size_t)cap);
						}
						int *ms = realloc(mesh_start, sizeof *ms * (size_t)(nmesh + 2));
						if (!plans || !ms)
							die("out of memory");
						mesh_start = ms;
						mesh_start[nmesh++] = n;
						n += mesh_plans(plans + n, pp, tp, cp, rep, dp / rep, vmax, accums[a]);
					}
				}
			}
		}
	}
	if (!mesh_start)
		die("--plan: no mesh");
	mesh_start[nmesh] = n;
	double t0 = now_s();
	/* the memory bound, per tp once: candidates over the device memory by
	 * it alone are not compiled */
	ModelMem *mms = malloc(sizeof *mms * (size_t)n);
	int nmm = 0;
	if (!mms)
		die("out of memory");
	for (int i = 0; i < n; i++) {
		int k = 0;
		while (k < nmm && mms[k].tp != plans[i].tp)
			k++;
		if (k == nmm)
			mms[nmm++] = model_mem(po, quiet, plans[i].tp);
		plans[i].bound = mem_bound(&plans[i], &mms[k]);
		plans[i].time_bound = time_bound(&plans[i], &mms[k], po->machine);
		if (po->device_memory > 0 && plans[i].bound > po->device_memory)
			plans[i].state = PL_BOUND;
	}
	int64_t batch = nmm && mms[0].ok ? mms[0].micro_batch : 0;
	for (int k = 0; k < nmm; k++)
		model_mem_free(&mms[k]);
	free(mms);
	if (!po->brief || now_s() - t0 >= 1) {
		int over = 0;
		for (int i = 0; i < n; i++)
			over += plans[i].state == PL_BOUND;
		fprintf(stderr, "dpc: --plan: memory bound: %d of %d candidates over the device memory "
			"without a compile, %.1f s\n", over, n, now_s() - t0);
	}
	const char *against = getenv("DPC_PLAN_AGAINST");
	if (against) { /* a diagnostic (docs/SIMULATE.md): how many candidates the bounds
			  leave below a step of that many seconds, without a compile */
		double best = atof(against);
		int left[3] = {0}, ppn[3] = {1, 2, 4}; /* pp = 1, 2, 4 and more */
		int other = 0, least = -1;
		for (int i = 0; i < n; i++)
			if (plans[i].state == PL_TODO && plans[i].time_bound < best) {
				if (least < 0 || plans[i].time_bound < plans[least].time_bound)
					least = i;
				int k = plans[i].pp >= 4 ? 2 : plans[i].pp - 1;
				left[k]++;
				other += plans[i].pp > 4;
			}
		fprintf(out, "against %.4g s: %d candidates fit the memory bound with a time bound below it: "
			"%d at pp=%d, %d at pp=%d, %d at pp>=%d (%d above pp=4)\n", best,
			left[0] + left[1] + left[2], left[0], ppn[0], left[1], ppn[1], left[2], ppn[2], other);
		/* the classes with such a candidate: the class phase's compiles */
		int ncls = classify(plans, n), nleft = 0, cls_pp[3] = {0};
		char *has = calloc((size_t)ncls + 1, 1);
		if (!has)
			die("out of memory");
		for (int i = 0; i < n; i++)
			if (plans[i].state == PL_TODO && plans[i].time_bound < best && !has[plans[i].cls]) {
				has[plans[i].cls] = 1;
				nleft++;
				cls_pp[plans[i].pp >= 4 ? 2 : plans[i].pp - 1]++;
			}
		free(has);
		fprintf(out, "against %.4g s: %d of %d classes have one (%d at pp=1, %d at pp=2, %d at pp>=4)\n",
			best, nleft, ncls, cls_pp[0], cls_pp[1], cls_pp[2]);
		if (least >= 0) {
			char nm[160];
			plan_name(nm, sizeof nm, &plans[least]);
			fprintf(out, "the least time bound: %.4g s (%s)\n", plans[least].time_bound, nm);
		}
		fprintf(stderr, "dpc: --plan: DPC_PLAN_AGAINST: the bounds counted, nothing searched\n");
		fclose(quiet);
		free(plans);
		free(mesh_start);
		return -1;
	}
	const char *check = getenv("DPC_PLAN_CHECK");
	char *seed = calloc((size_t)nmesh, 1);
	if (!seed)
		die("out of memory");
	const char *no_class = getenv("DPC_PLAN_NO_CLASS");
	Search se = {.plans = plans, .mesh_start = mesh_start, .nmesh = nmesh, .n = n, .po = po,
		     .quiet = quiet, .check = check && strcmp(check, "1") == 0, .seed = seed,
		     .prior_best = INFINITY, .prior_tenth = INFINITY, .batch = batch, .t0 = t0,
		     .last = t0};
	se.use_class = !se.check && !(no_class && strcmp(no_class, "1") == 0);
	int ncls = classify(plans, n);
	double *cb = malloc(sizeof *cb * ((size_t)ncls + 1));
	if (!cb)
		die("out of memory");
	if (se.check) { /* nothing pruned: every bound is checked by plan_eval */
		for (int i = 0; i < n; i++)
			if (plans[i].state == PL_BOUND)
				plans[i].state = PL_TODO;
	}
	int jobs = po->jobs > 0 ? po->jobs : (int)sysconf(_SC_NPROCESSORS_ONLN);
	ClassLimit limit = {0};
	pick_seeds(&se);
	search_phase(&se, PHASE_SEED, jobs);
	if (se.use_class) { /* each class's member of least time bound (then index) */
		int *rep = malloc(sizeof *rep * ((size_t)ncls + 1));
		if (!rep)
			die("out of memory");
		for (int c = 0; c < ncls; c++)
			rep[c] = -1;
		for (int i = 0; i < n; i++) {
			int c = plans[i].cls;
			if (plans[i].state == PL_TODO &&
			    (rep[c] < 0 || plans[i].time_bound < plans[rep[c]].time_bound))
				rep[c] = i;
		}
		for (int c = 0; c < ncls; c++)
			if (rep[c] >= 0)
				plans[rep[c]].class_rep = 1;
		limit = limit_classes(plans, n, rep, ncls, po->max_classes, file_accum > 0 ? file_accum : 1);
		if (limit.max)
			fprintf(stderr, "dpc: --plan: %d classes to compile, more than --plan-classes=%d: "
				"the %d with the fewest micro-batches searched, %d candidates of the others not\n",
				limit.wanted, limit.max, limit.max, limit.candidates);
		free(rep);
		class_bounds(plans, n, cb, ncls);
		search_phase(&se, PHASE_CLASS, jobs);
		plan_late_memory(&se); /* the ten fastest that fit, for the rule's threshold */
	}
	class_bounds(plans, n, cb, ncls);
	search_phase(&se, 1, jobs);
	class_bounds(plans, n, cb, ncls);
	/* the memory bound: a mesh's first candidate needs the least memory;
	 * when it does not fit, none of the mesh does */
	for (int m = 0; m < nmesh && !se.check; m++)
		if (plans[mesh_start[m]].state == PL_TOO_BIG)
			for (int k = mesh_start[m] + 1; k < mesh_start[m + 1]; k++)
				plans[k].state = PL_PRUNED;
	search_phase(&se, 2, jobs);
	class_bounds(plans, n, cb, ncls);
	search_phase(&se, 3, jobs);
	plan_late_memory(&se);
	int any_fit = 0;
	for (int i = 0; i < n && !any_fit; i++)
		any_fit = plans[i].state == PL_FITS;
	if (!any_fit)
		search_phase(&se, 0, jobs);
	if (se.check) { /* the bound against every memory plan (all are below it) */
		double lo = INFINITY, hi = 0;
		int planned = 0;
		for (int i = 0; i < n; i++)
			if (plans[i].mem > 0 && plans[i].bound > 0) {
				double r = (double)plans[i].bound / (double)plans[i].mem;
				lo = fmin(lo, r);
				hi = fmax(hi, r);
				planned++;
			}
		fprintf(out, "memory bound: %d memory plans, bound / plan from %.3f to %.3f\n", planned,
			planned ? lo : 0.0, hi);
		lo = INFINITY, hi = 0;
		planned = 0;
		int by_comm = 0; /* plans whose bound is the communication term */
		double comm_hi = 0;
		for (int i = 0; i < n; i++)
			if (plans[i].step_s > 0 && plans[i].time_bound > 0) {
				double r = plans[i].time_bound / plans[i].step_s;
				lo = fmin(lo, r);
				hi = fmax(hi, r);
				planned++;
				by_comm += plans[i].comm_bound >= plans[i].time_bound;
				comm_hi = fmax(comm_hi, plans[i].comm_bound / plans[i].step_s);
			}
		fprintf(out, "time bound: %d simulated plans, bound / step from %.3f to %.3f\n", planned,
			planned ? lo : 0.0, hi);
		fprintf(out, "communication bound: the bound of %d, up to %.3f of the step\n", by_comm,
			comm_hi);
		int piped = 0, by_pipe = 0; /* pipelined plans; those whose bound is the pipeline term */
		double pipe_lo = INFINITY, pipe_hi = 0;
		for (int i = 0; i < n; i++)
			if (plans[i].step_s > 0 && plans[i].pipe_bound > 0) {
				double r = plans[i].pipe_bound / plans[i].step_s;
				piped++;
				by_pipe += plans[i].pipe_bound >= plans[i].time_bound;
				pipe_lo = fmin(pipe_lo, r);
				pipe_hi = fmax(pipe_hi, r);
			}
		fprintf(out, "pipeline bound: %d pipelined plans, term / step from %.3f to %.3f, the "
			"bound of %d\n", piped, piped ? pipe_lo : 0.0, pipe_hi, by_pipe);
		/* the class rule's premise: each class's bound (its members' largest
		 * core step) below every member's simulated step */
		class_bounds(plans, n, cb, ncls);
		lo = INFINITY, hi = 0;
		planned = 0;
		for (int i = 0; i < n; i++)
			if (plans[i].step_s > 0 && plans[i].class_bound > 0) {
				double r = plans[i].class_bound / plans[i].step_s;
				if (r > 1 + 1e-9) {
					char nm[160];
					plan_name(nm, sizeof nm, &plans[i]);
					die("--plan: the class bound %.6g s is above the simulated step's "
					    "%.6g s (%s): the bound is wrong", plans[i].class_bound,
					    plans[i].step_s, nm);
				}
				lo = fmin(lo, r);
				hi = fmax(hi, r);
				planned++;
			}
		fprintf(out, "class bound: %d classes, %d simulated plans, bound / step from %.3f to "
			"%.3f\n", ncls, planned, planned ? lo : 0.0, hi);
	}
	int compiled = 0, same = 0;
	for (int i = 0; i < n; i++) {
		compiled += plans[i].compiled;
		same += plans[i].state == PL_SAME;
	}
	double took = now_s() - t0;
	Plan **fit = malloc(sizeof *fit * (size_t)(n + 1));
	if (!fit)
		die("out of memory");
	int nfit = 0, refused = 0, big = 0, pruned = 0, dominated = 0, uncompiled_refused = 0;
	int slower = 0, bounded = 0, timed = 0, classed = 0;
	const Plan *smallest = NULL;
	for (int i = 0; i < n; i++) {
		Plan *p = &plans[i];
		refused += p->state == PL_REFUSED;
		uncompiled_refused += p->state == PL_REFUSED && !p->compiled;
		pruned += p->state == PL_PRUNED;
		dominated += p->state == PL_DOMINATED;
		slower += p->state == PL_SLOWER;
		bounded += p->state == PL_BOUND;
		timed += p->state == PL_TIME;
		classed += p->state == PL_CLASS;
		big += p->state == PL_TOO_BIG;
		if (p->state == PL_FITS)
			fit[nfit++] = p;
		if ((p->state == PL_FITS || p->state == PL_TOO_BIG) && (!smallest || p->mem < smallest->mem))
			smallest = p;
	}
	char name[160], h[64], h2[64];
	if (!po->brief)
		fprintf(out, "plan search on %s at %d ranks: %d candidates: %d compiled (%d refused by the "
		"front end, %d checkpointing nothing), %d simulated: %d fit, %d over the device "
		"memory, %d slower than ten that fit (memory not planned); %d refused uncompiled "
		"(zero_bubble's order deadlocks), %d over the device memory by the closed-form "
		"bound, %d pruned by the memory bound, %d by dominance, %d by the time bound, "
		"%d by the class bound (%d classes); %.2f s (%.1f ms a compile, %d workers)\n",
		po->machine->name, N, n, compiled, refused - uncompiled_refused, same,
		nfit + big + slower, nfit, big, slower, uncompiled_refused, bounded, pruned, dominated,
		timed, classed, ncls, took,
		compiled ? 1e3 * took / compiled : 0.0, se.workers);
	int rc = 0;
	if (!nfit) {
		if (smallest) {
			plan_name(name, sizeof name, smallest);
			fprintf(stderr, "dpc: %s: no plan fits in %s per rank; the smallest needs %s (%s)\n",
				po->brief ? "strategy auto" : "--plan",
				stats_human_bytes(h, sizeof h, (double)po->device_memory),
				stats_human_bytes(h2, sizeof h2, (double)smallest->mem), name);
		} else {
			fprintf(stderr, "dpc: --plan: the front end refused every candidate at %d ranks\n", N);
		}
		limit_note(stderr, &limit, plans, n, INFINITY, INFINITY);
		rc = -1;
		goto out;
	}
	qsort(fit, (size_t)nfit, sizeof *fit, by_time);
	const Plan *w = fit[0];
	*choice = (PlanChoice){0};
	choice->nsets = plan_sets(w, choice->sets, choice->buf);
	for (int i = 0; i < choice->nsets && po->brief; i++)
		choice->sets[i].what = "strategy auto"; /* for the compile's warnings */
	if (!po->mesh) {
		choice->tp = w->tp;
		choice->cp = w->cp;
		choice->dp_replicate = w->rep;
		choice->pp = w->pp;
	}
	if (po->brief) { /* `strategy auto`: the choice, and why not the next */
		plan_name(name, sizeof name, w);
		fprintf(out, "dpc: strategy auto: %s: %.3f ms a step, %s per rank, on %s (%d of %d "
			"candidates compiled, %.2f s)\n", name, 1e3 * w->step_s,
			stats_human_bytes(h, sizeof h, (double)w->mem), po->machine->name, compiled, n,
			took);
		if (nfit > 1) {
			char why[128];
			why_slower(why, sizeof why, fit[1], w);
			plan_name(name, sizeof name, fit[1]);
			fprintf(out, "dpc: strategy auto: runner-up %s: %.3f ms (%s)\n", name,
				1e3 * fit[1]->step_s, why);
		}
		limit_note(out, &limit, plans, n, w->step_s, nfit >= TOP ? fit[TOP - 1]->step_s : INFINITY);
		goto out;
	}
	fprintf(out, "%-4s %-84s %10s %10s %10s %12s  %s\n", "#", "plan", "step ms", "compute", "exposed",
		"memory", "against #1");
	for (int i = 0; i < nfit && i < TOP; i++) {
		const Plan *p = fit[i], *b = fit[0];
		plan_name(name, sizeof name, p);
		char why[128] = "";
		if (i)
			why_slower(why, sizeof why, p, b);
		fprintf(out, "%-4d %-84s %10.3f %10.3f %10.3f %12s  %s\n", i + 1, name, 1e3 * p->step_s,
			1e3 * p->compute_s, 1e3 * p->exposed_s,
			stats_human_bytes(h, sizeof h, (double)p->mem), why);
	}
	plan_name(name, sizeof name, fit[0]);
	fprintf(out, "winner: %s\n", name);
	fprintf(out, "winner's MFU: %.1f %% (the model's FLOPs over its simulated step at %.1f TFLOP/s "
		"bf16 a rank)\n", 100 * fit[0]->mfu, po->machine->peak_flops[MACH_BF16] / 1e12);
	limit_note(out, &limit, plans, n, fit[0]->step_s, nfit >= TOP ? fit[TOP - 1]->step_s : INFINITY);
out:
	fclose(quiet);
	free(fit);
	free(seed);
	free(cb);
	free(plans);
	free(mesh_start);
	return rc;
}
