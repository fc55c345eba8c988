/*
 * plan.c - `dpc model.dp --plan --world-size N [--simulate=MACHINE]
 * [--device-memory SIZE]`: the mesh, strategy and knobs that run one step
 * fastest, found by compiling every candidate and simulating it
 * (passes/simulate.c) on the machine.
 *
 * The space, for the world size N: every mesh tp x cp x dp_replicate x
 * dp_shard = N (tp and cp up to the machine's ranks per node; pp is not
 * searched: the simulator does not model it yet); on each, every strategy
 * (ddp, zero1, zero2, full_shard; hybrid_shard where dp_replicate > 1;
 * only ddp where there is one data-parallel rank, where they are all the
 * same step), gradient_checkpointing off and on, and the knob of the
 * strategy: bucket_mb 25 or 100 (ddp, zero1, zero2), prefetch 1 or 2
 * (full_shard, hybrid_shard). A candidate the front end refuses (heads
 * that tp does not divide, a batch that the data-parallel ranks do not) is
 * counted and skipped. The user's -D and --set apply to every candidate.
 *
 * Pruning. The memory bound: on each mesh the candidate with the least
 * memory (the most sharded strategy the mesh allows, with gradient
 * checkpointing) is compiled first; when it does not fit the device memory
 * no other candidate of that mesh can, and they are not compiled. Nothing
 * else is pruned (no dominance rule yet): the space stays small (a few
 * hundred candidates at N = 512), and every candidate the memory bound
 * leaves is compiled and simulated.
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

#include "frontend.h"
#include "plan.h"

typedef struct {
	int tp, cp, rep, shard;
	int strategy;  /* DpStrategy */
	int gc;        /* gradient_checkpointing */
	int knob;      /* bucket_mb (ddp, zero1, zero2) or prefetch (sharded) */
	int state;     /* PL_* */
	double step_s, compute_s, exposed_s;
	int64_t mem;
} Plan;

enum {
	PL_TODO,
	PL_FITS,    /* simulated, within the device memory */
	PL_TOO_BIG, /* simulated, over it */
	PL_PRUNED,  /* not compiled: the memory bound */
	PL_REFUSED, /* the front end or a pass refused it */
	PL_SAME,    /* gradient checkpointing that recomputes nothing (no repeat):
	               the plan without it */
};

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

/* The candidate's settings as --set lines after the user's; sets[] must
 * hold nuser + 3. */
static int plan_sets(const Plan *p, const PlanOpts *po, FeSet *sets, char buf[3][64])
{
	int n = 0;
	for (int i = 0; i < po->nsets; i++)
		sets[n++] = po->sets[i];
	snprintf(buf[0], 64, "%s", dp_strategy_names[p->strategy]);
	sets[n++] = (FeSet){"train.strategy", buf[0], "--plan"};
	sets[n++] = (FeSet){"train.gradient_checkpointing", p->gc ? "true" : "false", "--plan"};
	snprintf(buf[1], 64, "%d", p->knob);
	sets[n++] = (FeSet){is_sharded(p->strategy) ? "train.prefetch" : "train.bucket_mb", buf[1], "--plan"};
	return n;
}

/* Compile p; its graph (NULL when the front end or a pass refused it). */
static Graph *plan_compile(const Plan *p, const PlanOpts *po, FILE *quiet)
{
	FeSet *sets = malloc(sizeof *sets * (size_t)(po->nsets + 3));
	if (!sets)
		die("out of memory");
	char buf[3][64];
	int nsets = plan_sets(p, po, sets, buf);
	FeOptions fo = {.world_size = po->world, .tp = p->tp, .cp = p->cp, .dp_replicate = p->rep,
			.pp = 1, .defines = po->defines, .ndefines = po->ndefines, .sets = sets,
			.nsets = nsets};
	Diag d;
	diag_init(&d, quiet, po->path, NULL);
	char *src = NULL;
	Graph *g = lower_compile_opts(po->path, &fo, &d, &src);
	PipelineOpts pl = {.verify = 0};
	if (g && (d.nerrors || pipeline_run(g, &d, &pl) < 0)) {
		ir_free(g);
		g = NULL;
	}
	free(src);
	free(sets);
	return g;
}

static void plan_eval(Plan *p, const PlanOpts *po, FILE *quiet)
{
	Graph *g = plan_compile(p, po, quiet);
	if (!g) {
		p->state = PL_REFUSED;
		return;
	}
	p->mem = g->peak_bytes;
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
		p->compute_s = rep.res.busy[DP_STREAM_COMPUTE];
		p->exposed_s = rep.res.exposed_s;
		p->state = po->device_memory > 0 && p->mem > po->device_memory ? PL_TOO_BIG : PL_FITS;
		sim_report_free(&rep);
	}
	ir_free(g);
}

static void plan_name(char *buf, size_t len, const Plan *p)
{
	snprintf(buf, len, "tp=%d cp=%d dp_replicate=%d dp_shard=%d %s%s %s=%d", p->tp, p->cp, p->rep,
		 p->shard, dp_strategy_names[p->strategy], p->gc ? " +ckpt" : "",
		 is_sharded(p->strategy) ? "prefetch" : "bucket_mb", p->knob);
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
 * sharded strategy, with checkpointing). */
static int mesh_plans(Plan *out, int tp, int cp, int rep, int shard)
{
	int n = 0, dp = rep * shard;
	static const int order[] = {DP_STRAT_FULL_SHARD, DP_STRAT_HYBRID_SHARD, DP_STRAT_ZERO2,
				    DP_STRAT_ZERO1, DP_STRAT_DDP};
	for (int gc = 1; gc >= 0; gc--)
		for (size_t s = 0; s < sizeof order / sizeof order[0]; s++) {
			int st = order[s];
			if (dp == 1 && st != DP_STRAT_DDP)
				continue; /* one data-parallel rank: every strategy is ddp */
			if (st == DP_STRAT_HYBRID_SHARD && (rep == 1 || shard == 1))
				continue;
			if (st == DP_STRAT_FULL_SHARD && shard == 1)
				continue;
			for (int k = 0; k < 2; k++) {
				int knob = is_sharded(st) ? 1 + k : k ? 100 : 25;
				out[n++] = (Plan){tp, cp, rep, shard, st, gc, knob, PL_TODO, 0, 0, 0, 0};
			}
		}
	return n;
}

int plan_run(const PlanOpts *po, FILE *out, Graph **winner)
{
	int N = po->world;
	*winner = NULL;
	int cap = 64, n = 0;
	Plan *plans = malloc(sizeof *plans * (size_t)cap);
	int *mesh_start = NULL, nmesh = 0;
	if (!plans)
		die("out of memory");
	for (int tp = 1; tp <= N; tp++) {
		if (N % tp || tp > po->machine->ranks_per_node)
			continue;
		for (int cp = 1; cp <= N / tp; cp++) {
			if ((N / tp) % cp || cp > po->machine->ranks_per_node)
				continue;
			int dp = N / tp / cp;
			for (int rep = 1; rep <= dp; rep++) {
				if (dp % rep)
					continue;
				if (n + 32 > cap) {
					cap *= 2;
					plans = realloc(plans, sizeof *plans * (size_t)cap);
				}
				int *ms = realloc(mesh_start, sizeof *ms * (size_t)(nmesh + 2));
				if (!plans || !ms)
					die("out of memory");
				mesh_start = ms;
				mesh_start[nmesh++] = n;
				n += mesh_plans(plans + n, tp, cp, rep, dp / rep);
			}
		}
	}
	if (!mesh_start)
		die("--plan: no mesh");
	mesh_start[nmesh] = n;
	FILE *quiet = fopen("/dev/null", "w");
	if (!quiet)
		die("--plan: cannot open /dev/null");
	double t0 = now_s(), last = t0;
	int done = 0, compiled = 0, same = 0;
	for (int m = 0; m < nmesh; m++) {
		for (int i = mesh_start[m]; i < mesh_start[m + 1]; i++) {
			Plan *p = &plans[i];
			if (p->state == PL_PRUNED)
				continue;
			plan_eval(p, po, quiet);
			compiled++;
			/* the memory bound: the mesh's first compiled candidate needs
			 * the least memory; when it does not fit, none of the mesh does */
			same += p->state == PL_SAME;
			if (p->state == PL_TOO_BIG && i == mesh_start[m])
				for (int k = i + 1; k < mesh_start[m + 1]; k++)
					plans[k].state = PL_PRUNED;
		}
		done = mesh_start[m + 1];
		if (now_s() - last > 1 || m == nmesh - 1) {
			fprintf(stderr, "dpc: --plan: %d of %d candidates (%d compiled), %.1f s\n", done, n,
				compiled, now_s() - t0);
			last = now_s();
		}
	}
	double took = now_s() - t0;
	Plan **fit = malloc(sizeof *fit * (size_t)(n + 1));
	if (!fit)
		die("out of memory");
	int nfit = 0, refused = 0, big = 0, pruned = 0;
	const Plan *smallest = NULL;
	for (int i = 0; i < n; i++) {
		Plan *p = &plans[i];
		refused += p->state == PL_REFUSED;
		pruned += p->state == PL_PRUNED;
		big += p->state == PL_TOO_BIG;
		if (p->state == PL_FITS)
			fit[nfit++] = p;
		if ((p->state == PL_FITS || p->state == PL_TOO_BIG) && (!smallest || p->mem < smallest->mem))
			smallest = p;
	}
	char name[160], h[64], h2[64];
	fprintf(out, "plan search on %s at %d ranks: %d candidates: %d compiled (%d refused by the "
		"front end, %d checkpointing nothing), %d simulated: %d fit, %d over the device "
		"memory; %d pruned by the memory bound; %.2f s (%.1f ms a compile)\n",
		po->machine->name, N, n, compiled, refused, same, compiled - refused - same, nfit, big,
		pruned, took, compiled ? 1e3 * took / compiled : 0.0);
	int rc = 0;
	if (!nfit) {
		if (smallest) {
			plan_name(name, sizeof name, smallest);
			fprintf(stderr, "dpc: --plan: no plan fits in %s per rank; the smallest needs %s (%s)\n",
				stats_human_bytes(h, sizeof h, (double)po->device_memory),
				stats_human_bytes(h2, sizeof h2, (double)smallest->mem), name);
		} else {
			fprintf(stderr, "dpc: --plan: the front end refused every candidate at %d ranks\n", N);
		}
		rc = -1;
		goto out;
	}
	qsort(fit, (size_t)nfit, sizeof *fit, by_time);
	fprintf(out, "%-4s %-62s %10s %10s %10s %12s  %s\n", "#", "plan", "step ms", "compute", "exposed",
		"memory", "against #1");
	for (int i = 0; i < nfit && i < 10; i++) {
		const Plan *p = fit[i], *b = fit[0];
		plan_name(name, sizeof name, p);
		char why[128] = "";
		if (i) {
			double dc = p->compute_s - b->compute_s, de = p->exposed_s - b->exposed_s;
			if (p->step_s - b->step_s <= 1e-4 * b->step_s && p->mem == b->mem)
				snprintf(why, sizeof why, "a tie");
			else if (p->step_s - b->step_s <= 1e-4 * b->step_s)
				snprintf(why, sizeof why, "as fast, %s more memory",
					 stats_human_bytes(h2, sizeof h2, (double)(p->mem - b->mem)));
			else if (dc >= de)
				snprintf(why, sizeof why, "+%.3f ms compute", 1e3 * dc);
			else
				snprintf(why, sizeof why, "+%.3f ms exposed comm", 1e3 * de);
		}
		fprintf(out, "%-4d %-62s %10.3f %10.3f %10.3f %12s  %s\n", i + 1, name, 1e3 * p->step_s,
			1e3 * p->compute_s, 1e3 * p->exposed_s,
			stats_human_bytes(h, sizeof h, (double)p->mem), why);
	}
	*winner = plan_compile(fit[0], po, quiet);
	plan_name(name, sizeof name, fit[0]);
	fprintf(out, "winner: %s\n", name);
out:
	fclose(quiet);
	free(fit);
	free(plans);
	free(mesh_start);
	return rc;
}
