/*
 * dpexec.c - the executor's main: options, MPI bootstrap, the compute device
 * (--device: the CPU backend, or the CUDA backend loaded with dlopen;
 * runtime/backend.c), parameter init (the step file's init program), the
 * training loop, evaluation, full checkpoints (the export program) and
 * logging.
 *
 *   mpirun -np N dpexec step.bin     (or plain `dpexec step.bin`: one rank)
 *
 * Every rank reads the same step file and derives its mesh coordinates from
 * its rank (rank = ((r*S + s)*C + c)*T + t). Nothing below main() exits: a
 * failure travels up as an RtErr; main prints `dpexec: error: <msg>` and, on a
 * multi-rank run, calls MPI_Abort so no rank is left waiting in a collective.
 * Errors every rank sees identically (a bad step file, a world size that does
 * not match the mesh, --device cuda without a GPU) are agreed on first and
 * reported once by rank 0, and every rank exits with status 1.
 *
 * Learning-rate schedule (tests replicate it in PyTorch), for optimizer step
 * k counted from 0:
 *   constant:  lr
 *   cosine:    k < warmup:  lr * (k + 1) / warmup
 *              else:        min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * q)),
 *                           q = min(1, (k - warmup) / (T - warmup)),
 *              T = sched.steps (cfg.steps when 0); q = 1 when T <= warmup.
 * Logged step numbers (console and --losses) count from 1: the line for step
 * k+1 carries the loss of optimizer step k and the lr it used.
 */
#include <dlfcn.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm.h"
#include "exec.h"
#include "rt.h"

typedef struct {
	const char *step_path;
	long steps;          /* -1: cfg.steps */
	const char *device;
	const char *save_full;
	const char *init_from;
	const char *losses;
	long eval_every;     /* -1: cfg.eval_every */
	long log_every;      /* -1: cfg.log_every */
	int quiet, verbose, check_grads, no_progress, no_graph;
	double timeout;      /* seconds, 0: none */
} Opts;

/* Everything a run holds; freed by run_free. */
typedef struct {
	Opts o;
	int rank, world;
	DpStep step;
	Comm *comm;
	const BackendOps *ops; /* the compute backend (--device) */
	void *dl;              /* dlopen handle of a loaded backend */
	Exec x;
	int have_exec;
	DataSet *train, *eval;
	FILE *losses;
	RtErr e;
} Run;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dpexec [options] STEP.bin\n"
		"Run a training step file compiled by dpc, on every rank:\n"
		"  mpirun -np N dpexec step.bin      (plain `dpexec step.bin` is one rank)\n"
		"The world size must equal the mesh the step file was compiled for.\n"
		"\n"
		"options:\n"
		"  --steps N             optimizer steps to run (default: the step file's)\n"
		"  --device auto|cpu|cuda\n"
		"                        compute device (default auto: the GPU when the CUDA\n"
		"                        driver reports one on every rank and the CUDA backend\n"
		"                        loads, else the CPU with a one-line notice saying why).\n"
		"                        cuda without a usable GPU is an error naming the cause.\n"
		"                        The CUDA backend is libdpcuda.so beside this dpexec, or\n"
		"                        the file $" BACKEND_CUDA_ENV " names; dpexec itself needs\n"
		"                        no CUDA library\n"
		"  --no-graph            (cuda) enqueue every step instead of replaying the step\n"
		"                        captured once as a CUDA Graph (same kernels; debugging)\n"
		"  --eval-every N        evaluate every N steps, 0 = only at the end\n"
		"                        (default: the step file's); needs an eval block\n"
		"  --log-every N         log every N steps (default: the step file's)\n"
		"  --quiet               no per-step log lines\n"
		"  --verbose             also log communication and host time per log line\n"
		"  --losses FILE         rank 0 writes `step loss grad_norm lr` per step (%%.9g)\n"
		"  --init-from FILE      take initial parameters from a safetensors file (by name)\n"
		"  --save-full FILE      after training, write every parameter to a safetensors\n"
		"                        file (rank 0; DSL names)\n"
		"  --check-grads         compare gradients with finite differences on the first\n"
		"                        micro-batch (1 rank) and exit; non-zero if any fails\n"
		"  --timeout SEC         fail (instead of hanging) when a collective takes longer\n"
		"                        than SEC seconds (default: no limit)\n"
		"  --no-progress         do not poll pending collectives between instructions;\n"
		"                        they then advance only when waited for (to measure\n"
		"                        what the polling buys: bench/overlap.sh)\n"
		"  -h, --help            this text\n"
		"\n"
		"OpenBLAS uses one thread per rank when the world has more than one rank.\n");
}

static int parse_long(const char *s, long lo, long *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (!*s || *end || v < lo)
		return -1;
	*out = v;
	return 0;
}

/* 0: run; 1: exit 0 (help); -1: usage error (message printed). */
static int parse_opts(int argc, char **argv, Opts *o)
{
	enum { O_STEPS = 256, O_DEVICE, O_SAVE_FULL, O_INIT_FROM, O_EVAL_EVERY, O_LOG_EVERY,
	       O_QUIET, O_VERBOSE, O_CHECK_GRADS, O_LOSSES, O_TIMEOUT, O_NO_PROGRESS, O_NO_GRAPH };
	static const struct option longopts[] = {
		{"steps", required_argument, NULL, O_STEPS},
		{"device", required_argument, NULL, O_DEVICE},
		{"save-full", required_argument, NULL, O_SAVE_FULL},
		{"init-from", required_argument, NULL, O_INIT_FROM},
		{"eval-every", required_argument, NULL, O_EVAL_EVERY},
		{"log-every", required_argument, NULL, O_LOG_EVERY},
		{"quiet", no_argument, NULL, O_QUIET},
		{"verbose", no_argument, NULL, O_VERBOSE},
		{"check-grads", no_argument, NULL, O_CHECK_GRADS},
		{"losses", required_argument, NULL, O_LOSSES},
		{"timeout", required_argument, NULL, O_TIMEOUT},
		{"no-progress", no_argument, NULL, O_NO_PROGRESS},
		{"no-graph", no_argument, NULL, O_NO_GRAPH},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	*o = (Opts){.steps = -1, .device = "auto", .eval_every = -1, .log_every = -1};
	opterr = 0;
	int c, li = -1;
	while ((li = -1, c = getopt_long(argc, argv, ":h", longopts, &li)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout);
			return 1;
		case O_STEPS:
			if (parse_long(optarg, 0, &o->steps))
				goto badnum;
			break;
		case O_DEVICE:
			if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
				fprintf(stderr, "dpexec: error: --device must be auto, cpu or cuda, not '%s'\n",
					optarg);
				return -1;
			}
			o->device = optarg;
			break;
		case O_SAVE_FULL:
			o->save_full = optarg;
			break;
		case O_INIT_FROM:
			o->init_from = optarg;
			break;
		case O_EVAL_EVERY:
			if (parse_long(optarg, 0, &o->eval_every))
				goto badnum;
			break;
		case O_LOG_EVERY:
			if (parse_long(optarg, 1, &o->log_every))
				goto badnum;
			break;
		case O_QUIET:
			o->quiet = 1;
			break;
		case O_VERBOSE:
			o->verbose = 1;
			break;
		case O_CHECK_GRADS:
			o->check_grads = 1;
			break;
		case O_NO_PROGRESS:
			o->no_progress = 1;
			break;
		case O_NO_GRAPH:
			o->no_graph = 1;
			break;
		case O_LOSSES:
			o->losses = optarg;
			break;
		case O_TIMEOUT: {
			char *end;
			o->timeout = strtod(optarg, &end);
			if (!*optarg || *end || !(o->timeout >= 0))
				goto badnum;
			break;
		}
		case ':':
			fprintf(stderr, "dpexec: error: option '%s' needs a value (see --help)\n",
				argv[optind - 1]);
			return -1;
		default:
			fprintf(stderr, "dpexec: error: unknown option '%s' (see --help)\n",
				argv[optind - 1]);
			return -1;
		}
		continue;
	badnum:
		fprintf(stderr, "dpexec: error: bad value '%s' for --%s\n", optarg,
			li >= 0 ? longopts[li].name : "?");
		return -1;
	}
	if (optind != argc - 1) {
		fprintf(stderr, "dpexec: error: %s (see --help)\n",
			optind >= argc ? "no step file given" : "more than one step file given");
		return -1;
	}
	o->step_path = argv[optind];
	return 0;
}

/* ---- parameters: the init and export programs ---- */

/* Where INIT takes values from: the --init-from checkpoint when given. */
typedef struct {
	const DpStep *s;
	const char *path; /* --init-from, NULL: every tensor from its init spec */
	StTensor *st;
	int n;
} InitSource;

static void shape_str(char *buf, size_t len, int ndim, const int64_t *dims)
{
	buf[0] = '\0';
	for (int d = 0; d < ndim && d < DP_MAX_DIMS; d++)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%lld", d ? "," : "",
			 (long long)dims[d]);
}

/* INIT hook. A parameter must be in the checkpoint (by name, same shape); a
 * buffer is taken from it when there (--save-full checkpoints hold only
 * parameters) and else from its init spec. Checkpoint tensors the model does
 * not have are ignored. */
static int init_tensor(void *ctx, int name_id, int id, float *dst, RtErr *e)
{
	InitSource *src = ctx;
	const DpStep *s = src->s;
	const DpTensor *t = &s->tensors[id];
	const char *name = dpstep_str(s, s->tensors[name_id].name);
	if (src->path) {
		int k = 0;
		while (k < src->n && strcmp(src->st[k].name, name))
			k++;
		if (k == src->n && s->tensors[name_id].kind == DP_T_PARAM)
			return RT_FAIL(e, "--init-from %s: no tensor named '%s'", src->path, name);
		if (k < src->n) {
			const StTensor *c = &src->st[k];
			int same = c->ndim == t->ndim;
			for (int d = 0; same && d < t->ndim; d++)
				same = c->dims[d] == t->dims[d];
			if (!same) {
				char want[96], got[96];
				shape_str(want, sizeof want, t->ndim, t->dims);
				shape_str(got, sizeof got, c->ndim, c->dims);
				return RT_FAIL(e, "--init-from %s: tensor '%s' has shape [%s], the model "
					       "wants [%s]", src->path, name, got, want);
			}
			memcpy(dst, c->data, (size_t)exec_numel(t) * sizeof(float));
			return 0;
		}
	}
	init_fill(t->init, t->init_a, t->init_b, s->cfg.seed, name, t->init_base, exec_numel(t),
		  dst);
	return 0;
}

/* Run the init program once: every parameter and buffer gets its initial
 * value, then (sharded strategies) the persistent shards are cut from them. */
static int run_init(Run *r)
{
	InitSource src = {.s = &r->step, .path = r->o.init_from};
	if (src.path)
		RT_CHECK(st_read(src.path, &src.st, &src.n, &r->e));
	r->x.init_tensor = init_tensor;
	r->x.hook_ctx = &src;
	int rc = exec_run(&r->x, DP_PROG_INIT, 1, &r->e);
	r->x.init_tensor = NULL;
	r->x.hook_ctx = NULL;
	if (src.path)
		st_free(src.st, src.n);
	return rc;
}

/* --save-full: every rank runs the export program (under sharded strategies
 * it gathers the parameters, a collective); then rank 0 writes the SAVE'd
 * tensors, in tensor-table order, atomically. */
static int save_full(Run *r)
{
	RtErr *e = &r->e;
	StSaved sv;
	RT_CHECK(st_saved_init(&sv, &r->step, r->rank == 0, e));
	r->x.save_tensor = st_saved_hook;
	r->x.hook_ctx = &sv;
	int rc = exec_run(&r->x, DP_PROG_EXPORT, 1, e);
	r->x.save_tensor = NULL;
	r->x.hook_ctx = NULL;
	int n = 0;
	if (rc == 0 && sv.keep) {
		rc = st_saved_write(&sv, r->o.save_full, &n, e);
		if (rc == 0 && !r->o.quiet)
			printf("saved %d parameters to %s\n", n, r->o.save_full);
	}
	st_saved_free(&sv);
	return rc;
}

/* ---- evaluation ---- */

/* A metric tensor's first n values (at most 2: loss, or correct and counted). */
static int metric(Exec *x, int id, double *v, int n, RtErr *e)
{
	float f[2] = {0, 0};
	if (id < 0)
		return 0;
	if (exec_tensor_bytes(x->s, id) > (int64_t)sizeof f)
		return RT_FAIL(e, "metric '%s' has more than %d elements",
			       dpstep_str(x->s, x->s->tensors[id].name), (int)(sizeof f / sizeof f[0]));
	RT_CHECK(exec_tensor_read(x, id, f, e));
	for (int i = 0; i < n; i++)
		v[i] += f[i];
	return 0;
}

static int evaluate(Run *r, uint64_t step)
{
	const DpStep *s = &r->step;
	RtErr *e = &r->e;
	Exec *x = &r->x;
	if (!r->eval || s->nprog[DP_PROG_EVAL] == 0)
		return 0;
	int64_t nb = data_eval_batches(r->eval, s, x->dp_size);
	double sum[3] = {0, 0, 0}; /* loss, correct, counted */
	for (int64_t b = 0; b < nb; b++) {
		x->eval_batch = b;
		RT_CHECK(exec_zero_metrics(x, e));
		RT_CHECK(exec_run(x, DP_PROG_EVAL, 1, e));
		RT_CHECK(metric(x, s->metrics.eval_loss, sum, 1, e));
		RT_CHECK(metric(x, s->metrics.eval_correct, sum + 1, 2, e));
	}
	RT_CHECK(r->comm->ops->allreduce_f64(r->comm, COMM_DP_AXES, sum, 3, e));
	if (r->rank == 0) {
		double n = sum[2] > 0 ? sum[2] : 1;
		printf("eval step %llu | test loss %.4f | test accuracy %.4f (%.0f/%.0f)\n",
		       (unsigned long long)step, sum[0] / n, sum[1] / n, sum[1], sum[2]);
		fflush(stdout);
	}
	return 0;
}

/* ---- the run ---- */

static int setup(Run *r)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	RT_CHECK(comm_mpi_init(&r->comm, s->cfg.mesh, exec_comm_masks(s), e));
	r->comm->timeout_s = r->o.timeout;
	BackendOpts bo = {.no_graph = r->o.no_graph, .timeout_s = r->o.timeout};
	MPI_Comm node; /* the ranks of this node pick devices by their index in it */
	if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL,
				&node) != MPI_SUCCESS)
		return RT_FAIL(e, "MPI_Comm_split_type failed");
	MPI_Comm_rank(node, &bo.local_rank);
	MPI_Comm_free(&node);
	RT_CHECK(exec_init(&r->x, s, r->comm, r->ops, &bo, e));
	r->x.no_progress = r->o.no_progress;
	r->have_exec = 1;
	if (r->rank == 0 && !r->o.quiet) {
		const uint32_t *m = s->cfg.mesh;
		printf("mesh: dp_replicate=%u dp_shard=%u", m[DP_AXIS_REPLICATE], m[DP_AXIS_SHARD]);
		if (m[DP_AXIS_CP] > 1)
			printf(" cp=%u", m[DP_AXIS_CP]);
		if (m[DP_AXIS_TP] > 1)
			printf(" tp=%u", m[DP_AXIS_TP]);
		printf(" (%d rank%s), strategy %s\n", r->world, r->world == 1 ? "" : "s",
		       dp_name(dp_strategy_names, DP_NSTRAT, s->cfg.strategy));
		printf("arena: %.2f MiB per rank\n", (double)s->cfg.arena_bytes / (1 << 20));
		if (r->ops != &cpu_backend) {
			char d[512];
			exec_describe(&r->x, d, sizeof d);
			printf("device: %s\n", d);
		}
	}
	RT_CHECK(run_init(r));
	int has_train = 0, has_eval = 0;
	for (uint32_t i = 0; i < s->nsources; i++) {
		has_train |= s->sources[i].split == DP_SPLIT_TRAIN;
		has_eval |= s->sources[i].split == DP_SPLIT_EVAL;
	}
	if (has_train)
		RT_CHECK(data_open(s, DP_SPLIT_TRAIN, NULL, &r->train, e));
	if (has_eval && s->nprog[DP_PROG_EVAL])
		RT_CHECK(data_open(s, DP_SPLIT_EVAL, NULL, &r->eval, e));
	int64_t global_batch = (int64_t)s->cfg.micro_batch * s->cfg.grad_accum * r->x.dp_size;
	if (r->train && data_count(r->train) < global_batch)
		return RT_FAIL(e, "the training data has %lld samples, fewer than one global batch "
			       "of %lld", (long long)data_count(r->train), (long long)global_batch);
	r->x.train = r->train;
	r->x.eval = r->eval;
	if (r->o.losses && r->rank == 0) {
		r->losses = fopen(r->o.losses, "w");
		if (!r->losses)
			return RT_FAIL(e, "cannot write --losses file %s", r->o.losses);
	}
	return 0;
}

/* What the step lines need between steps. */
typedef struct {
	uint64_t steps, log_every;
	double global_batch, tokens; /* tokens of one sample; 0: not a token model */
	double t_log;                /* when the last line was written */
	double host_s;               /* host time in launches and prefetches since then */
	uint64_t since_log;
	CommStats at_log;
} Log;

/* The line of step k (its metrics, the loss reduced over the data-parallel
 * ranks, the NaN check, --losses, the console). On a backend with streams
 * this runs while the next step is already on the device. */
static int report_step(Run *r, Log *lg, uint64_t k)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	Comm *c = r->comm;
	double loss = 0, gn = NAN, lr = exec_lr(s, k);
	RT_CHECK(exec_step_metrics(&r->x, k, &loss, &gn, e));
	RT_CHECK(c->ops->allreduce_f64(c, COMM_DP_AXES, &loss, 1, e));
	if (!isfinite(loss))
		return RT_FAIL(e, "loss is %s at step %llu", isnan(loss) ? "NaN" : "infinite",
			       (unsigned long long)k + 1);
	if (r->losses)
		fprintf(r->losses, "%llu %.9g %.9g %.9g\n", (unsigned long long)k + 1, loss, gn, lr);
	lg->since_log++;
	int last = k + 1 == lg->steps;
	if (k == 0 || (k + 1) % lg->log_every == 0 || last) {
		double now = MPI_Wtime(), dt = (now - lg->t_log) / (double)lg->since_log;
		if (r->rank == 0 && !r->o.quiet) {
			printf("step %llu/%llu | loss %.4f | lr %.2e", (unsigned long long)k + 1,
			       (unsigned long long)lg->steps, loss, lr);
			if (s->metrics.grad_norm >= 0)
				printf(" | grad_norm %.3f", gn);
			if (lg->tokens > 0)
				printf(" | %.2f ms/step | %.0f tokens/s", dt * 1e3,
				       lg->global_batch * lg->tokens / dt);
			else
				printf(" | %.2f ms/step | %.0f samples/s", dt * 1e3, lg->global_batch / dt);
			if (r->o.verbose)
				printf(" | comm %.2f ms issued, %.2f ms blocked | host %.1f us/step",
				       (c->stats.issue_s - lg->at_log.issue_s) * 1e3 / (double)lg->since_log,
				       (c->stats.blocked_s - lg->at_log.blocked_s) * 1e3 /
					       (double)lg->since_log,
				       lg->host_s * 1e6 / (double)lg->since_log);
			printf("\n");
			fflush(stdout);
		}
		lg->t_log = now;
		lg->since_log = 0;
		lg->host_s = 0;
		lg->at_log = c->stats;
	}
	return 0;
}

/* The training loop. Step k is launched, step k+1's batches are staged (and
 * on a GPU copied) while it runs, then the line of step k-1 is written from
 * the metrics step k-1 left behind: on a GPU the host never waits for the
 * step it just launched, so the device always has the next step queued.
 * Before an evaluation and after the last step every launched step is
 * reported, so an evaluation sees the parameters of exactly the steps before it. */
static int train(Run *r)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	Exec *x = &r->x;
	Comm *c = r->comm;
	uint64_t steps = r->o.steps >= 0 ? (uint64_t)r->o.steps : s->cfg.steps;
	uint64_t eval_every = r->o.eval_every >= 0 ? (uint64_t)r->o.eval_every : s->cfg.eval_every;
	Log lg = {.steps = steps};
	lg.log_every = r->o.log_every >= 1 ? (uint64_t)r->o.log_every
					   : (s->cfg.log_every ? s->cfg.log_every : 1);
	lg.global_batch = (double)s->cfg.micro_batch * s->cfg.grad_accum * x->dp_size;
	/* a token model reports tokens/s: the tokens of one training sample */
	for (uint32_t i = 0; i < s->nsources; i++)
		if (s->sources[i].kind == DP_SRC_TOKENS && s->sources[i].split == DP_SPLIT_TRAIN &&
		    s->sources[i].shift == 0)
			lg.tokens = (double)s->sources[i].sample_elems;
	lg.t_log = MPI_Wtime();
	double t_all = lg.t_log;
	c->stats = (CommStats){0};
	lg.at_log = c->stats;
	int64_t pending = -1; /* launched, its line not written yet */

	for (uint64_t k = 0; k < steps; k++) {
		double h0 = MPI_Wtime();
		RT_CHECK(exec_step_launch(x, k, e));
		if (k + 1 < steps)
			RT_CHECK(exec_prefetch(x, k + 1, e)); /* overlaps the running steps on a GPU */
		lg.host_s += MPI_Wtime() - h0;
		if (pending >= 0)
			RT_CHECK(report_step(r, &lg, (uint64_t)pending));
		pending = (int64_t)k;
		int last = k + 1 == steps;
		int eval_now = eval_every && (k + 1) % eval_every == 0 && !last;
		if (eval_now || last) {
			RT_CHECK(report_step(r, &lg, k));
			pending = -1;
		}
		if (eval_now) {
			double t0 = MPI_Wtime();
			RT_CHECK(evaluate(r, k + 1));
			/* evaluation time is not step time */
			lg.t_log += MPI_Wtime() - t0;
			t_all += MPI_Wtime() - t0;
		}
	}
	RT_CHECK(exec_step_wait(x, e));
	double total = MPI_Wtime() - t_all;
	if (r->losses) {
		fclose(r->losses);
		r->losses = NULL;
	}
	if (steps > 0 && r->rank == 0 && !r->o.quiet) {
		double n = (double)steps;
		printf("comm: %.3f ms issued, %.3f ms blocked per step (of %.3f ms/step; %.1f "
		       "collectives, %.2f MiB per rank per step)\n",
		       c->stats.issue_s * 1e3 / n, c->stats.blocked_s * 1e3 / n, total * 1e3 / n,
		       (double)c->stats.ncoll / n, (double)c->stats.bytes / n / (1 << 20));
		fflush(stdout);
	}
	return evaluate(r, steps);
}

static void run_free(Run *r)
{
	if (r->losses)
		fclose(r->losses);
	data_free(r->train);
	data_free(r->eval);
	if (r->have_exec)
		exec_free(&r->x);
	if (r->dl)
		dlclose(r->dl);
	if (r->comm)
		r->comm->ops->free(r->comm);
	dpstep_free(&r->step);
}

/* How many ranks failed (every rank passes its own verdict). */
static int count_failed(int failed)
{
	int n = 0;
	MPI_Allreduce(&failed, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	return n;
}

/* Every rank passes its own verdict; a failure is reported once by rank 0
 * when every rank failed (the same input everywhere), else by each failing
 * rank, and then the job is aborted. 1: go on; 0: every rank exits 1. */
static int agree(Run *r, int ok, const char *msg)
{
	int nfailed = count_failed(!ok);
	if (!nfailed)
		return 1;
	if (!ok && (nfailed < r->world || r->rank == 0))
		fprintf(stderr, "dpexec: error: %s\n", msg);
	fflush(stderr);
	if (nfailed < r->world)
		MPI_Abort(MPI_COMM_WORLD, 1);
	return 0;
}

/* --device: this rank's compute backend in r->ops. cuda: the CUDA backend
 * or an error naming the cause (msg). auto: the CUDA backend only when every
 * rank can use one (NCCL and MPI collectives do not mix); otherwise the CPU,
 * and notice says why; but a GPU the backend cannot use (a driver older than
 * its CUDA runtime) is an error for auto too. */
static int choose_device(Run *r, char *msg, size_t len, char *notice, size_t nlen)
{
	const char *dev = r->o.device;
	const BackendOps *cuda = NULL;
	char why[512] = "";
	r->ops = &cpu_backend;
	notice[0] = '\0';
	if (!strcmp(dev, "cpu"))
		return 0;
	int gpu = strcmp(dev, "auto") || backend_gpu_present(why, sizeof why), probe = 0;
	gpu = gpu && backend_load_cuda(&cuda, &r->dl, why, sizeof why) == 0 &&
	      (probe = cuda->probe(why, sizeof why)) > 0;
	if (probe < 0) { /* a GPU this build cannot use (an old driver): never a silent CPU run */
		snprintf(msg, len, "--device %s: %s", dev, why);
		return -1;
	}
	if (!strcmp(dev, "cuda")) {
		if (!gpu) {
			snprintf(msg, len, "--device cuda: %s", why);
			return -1;
		}
		r->ops = cuda;
		return 0;
	}
	int all = 0;
	MPI_Allreduce(&gpu, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (all) {
		r->ops = cuda;
		return 0;
	}
	if (gpu)
		snprintf(why, sizeof why, "another rank has none");
	if (r->dl)
		dlclose(r->dl);
	r->dl = NULL;
	snprintf(notice, nlen, "no usable GPU (%s); running on the CPU", why);
	return 0;
}

static int fail_rank(Run *r)
{
	fprintf(stderr, "dpexec: error: %s\n", r->e.msg);
	fflush(stderr);
	if (r->world > 1) {
		if (r->have_exec)
			exec_abort(&r->x); /* e.g. NCCL: stop before MPI kills the ranks */
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	return 1;
}

int main(int argc, char **argv)
{
	static Run run; /* zeroed; one per process, not shared state */
	Run *r = &run;
	int pr = parse_opts(argc, argv, &r->o);
	if (pr)
		return pr > 0 ? 0 : 2;
	int provided;
	if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
		fprintf(stderr, "dpexec: error: MPI_Init_thread failed\n");
		return 1;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &r->world);
	r->e.rank = -1;

	/* the step file: every rank reads it; agree before anything collective */
	char err[1024];
	int ok = dpstep_read_file(r->o.step_path, &r->step, err, sizeof err) == 0;
	if (!agree(r, ok, err)) {
		dpstep_free(&r->step);
		MPI_Finalize();
		return 1;
	}
	uint64_t want = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		want *= r->step.cfg.mesh[a];
	if (want != (uint64_t)r->world) {
		if (r->rank == 0) {
			const uint32_t *m = r->step.cfg.mesh;
			char axes[128];
			int n = snprintf(axes, sizeof axes, "dp_replicate=%u dp_shard=%u", m[0], m[1]);
			if (m[DP_AXIS_CP] > 1)
				n += snprintf(axes + n, sizeof axes - (size_t)n, " cp=%u", m[DP_AXIS_CP]);
			if (m[DP_AXIS_TP] > 1)
				snprintf(axes + n, sizeof axes - (size_t)n, " tp=%u", m[DP_AXIS_TP]);
			fprintf(stderr,
				"dpexec: error: %s was compiled for a mesh of %llu rank%s (%s) but this "
				"run has %d; recompile with dpc --world-size %d or run mpirun -np %llu\n",
				r->o.step_path, (unsigned long long)want, want == 1 ? "" : "s", axes,
				r->world, r->world, (unsigned long long)want);
		}
		dpstep_free(&r->step);
		MPI_Finalize();
		return 1;
	}
	r->e.rank = r->rank;
	char notice[640];
	ok = choose_device(r, err, sizeof err, notice, sizeof notice) == 0;
	if (!agree(r, ok, err)) {
		run_free(r);
		MPI_Finalize();
		return 1;
	}
	if (r->rank == 0 && !r->o.quiet && notice[0])
		printf("dpexec: %s\n", notice);

	if (setup(r))
		return fail_rank(r);
	int status = 0;
	if (r->o.check_grads) {
		int g = gradcheck_run(&r->x, &r->e);
		if (g < 0)
			return fail_rank(r);
		status = g;
	} else {
		if (train(r))
			return fail_rank(r);
		if (r->o.save_full && save_full(r))
			return fail_rank(r);
	}
	fflush(stdout);
	run_free(r);
	MPI_Finalize();
	return status;
}
