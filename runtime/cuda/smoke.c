/*
 * smoke.c - cuda_smoke, the CUDA backend's test driver until dpexec grows
 * --device cuda: loads a step file, trains N steps on the GPU, and writes the
 * same `step loss grad_norm lr` lines as `dpexec --losses` so the two can be
 * compared (tests/cuda.sh), plus optionally every parameter as safetensors
 * (like dpexec --save-full).
 *
 *   cuda_smoke [--steps N] [--no-graph] [--timeout SEC] [--losses FILE]
 *              [--save-full FILE] [--quiet] STEP.bin
 *   cuda_smoke --probe          prints the visible devices; exit 0
 *   mpirun -np N cuda_smoke ... one process per rank, NCCL between them
 *
 * Exit status: 0 ok, 1 error, 2 usage, 3 no CUDA device visible (nothing run).
 * Data sources, the sampler, the lr schedule and parameter init are the
 * CPU runtime's (data.c, init.c), so only the executor differs.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "cuda.h"

typedef struct {
	long steps;
	int no_graph, quiet, probe;
	double timeout;
	const char *losses, *save_full, *step_path;
} Opts;

typedef struct {
	Opts o;
	int rank, world, device;
	DpStep step;
	Comm *comm;
	CuNccl *nccl;
	CuExec *x;
	DataSet *train;
	FILE *losses;
	RtErr e;
} Smoke;

static void usage(FILE *f)
{
	fprintf(f, "usage: cuda_smoke [--steps N] [--no-graph] [--timeout SEC] [--losses FILE]\n"
		   "                  [--save-full FILE] [--quiet] STEP.bin\n"
		   "       cuda_smoke --probe\n"
		   "Train STEP.bin on the GPU (CUDA backend); --losses writes dpexec's format.\n"
		   "Exit status 3: no CUDA device visible, nothing was run.\n");
}

static int parse(int argc, char **argv, Opts *o)
{
	enum { O_STEPS = 256, O_NO_GRAPH, O_TIMEOUT, O_LOSSES, O_SAVE, O_QUIET, O_PROBE };
	static const struct option lo[] = {
		{"steps", required_argument, NULL, O_STEPS},
		{"no-graph", no_argument, NULL, O_NO_GRAPH},
		{"timeout", required_argument, NULL, O_TIMEOUT},
		{"losses", required_argument, NULL, O_LOSSES},
		{"save-full", required_argument, NULL, O_SAVE},
		{"quiet", no_argument, NULL, O_QUIET},
		{"probe", no_argument, NULL, O_PROBE},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	*o = (Opts){.steps = -1};
	int c;
	char *end;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_STEPS:
			o->steps = strtol(optarg, &end, 10);
			if (!*optarg || *end || o->steps < 0)
				goto bad;
			break;
		case O_NO_GRAPH:
			o->no_graph = 1;
			break;
		case O_TIMEOUT:
			o->timeout = strtod(optarg, &end);
			if (!*optarg || *end || !(o->timeout >= 0))
				goto bad;
			break;
		case O_LOSSES:
			o->losses = optarg;
			break;
		case O_SAVE:
			o->save_full = optarg;
			break;
		case O_QUIET:
			o->quiet = 1;
			break;
		case O_PROBE:
			o->probe = 1;
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			usage(stderr);
			return -1;
		}
		continue;
	bad:
		fprintf(stderr, "cuda_smoke: error: bad value '%s'\n", optarg);
		return -1;
	}
	if (o->probe)
		return 0;
	if (optind != argc - 1) {
		usage(stderr);
		return -1;
	}
	o->step_path = argv[optind];
	return 0;
}

/* Parameters and buffers: the init program, each tensor from its init spec
 * (the executor's default without an init hook). */
static int init_params(Smoke *m)
{
	return cuda_exec_run(m->x, DP_PROG_INIT, &m->e);
}

/* Every parameter to a safetensors file through the export program
 * (sharded strategies gather there); rank 0 writes. */
static int save_full(Smoke *m)
{
	RtErr *e = &m->e;
	StSaved sv;
	RT_CHECK(st_saved_init(&sv, &m->step, m->rank == 0, e));
	cuda_exec_set_hooks(m->x, NULL, st_saved_hook, &sv);
	int rc = cuda_exec_run(m->x, DP_PROG_EXPORT, e);
	cuda_exec_set_hooks(m->x, NULL, NULL, NULL);
	int n = 0;
	if (!rc && sv.keep)
		rc = st_saved_write(&sv, m->o.save_full, &n, e);
	st_saved_free(&sv);
	return rc;
}

static int run(Smoke *m)
{
	DpStep *s = &m->step;
	RtErr *e = &m->e;
	RT_CHECK(comm_mpi_init(&m->comm, s->cfg.mesh, exec_comm_masks(s), e));
	MPI_Comm local;
	int local_rank = 0;
	MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &local);
	MPI_Comm_rank(local, &local_rank);
	MPI_Comm_free(&local);
	RT_CHECK(cuda_select_device(local_rank, &m->device, e));
	if (m->rank == 0 && !m->o.quiet) {
		char d[256];
		cuda_describe(m->device, d, sizeof d);
		printf("cuda_smoke: %s; %s\n", d, m->o.no_graph ? "eager (--no-graph)" : "CUDA Graph");
	}
	uint32_t masks[DP_NSTREAM];
	cuda_comm_masks(s, masks);
	RT_CHECK(cuda_nccl_init(&m->nccl, m->comm, masks, e));
	CuOpts co = {.no_graph = m->o.no_graph, .timeout_s = m->o.timeout};
	RT_CHECK(cuda_exec_init(&m->x, s, m->comm, m->nccl, &co, e));
	for (uint32_t i = 0; i < s->nsources; i++)
		if (s->sources[i].split == DP_SPLIT_TRAIN && !m->train)
			RT_CHECK(data_open(s, DP_SPLIT_TRAIN, NULL, &m->train, e));
	cuda_exec_set_data(m->x, m->train, NULL);
	RT_CHECK(init_params(m));
	if (m->o.losses && m->rank == 0 && !(m->losses = fopen(m->o.losses, "w")))
		return RT_FAIL(e, "cannot write %s", m->o.losses);

	uint64_t steps = m->o.steps >= 0 ? (uint64_t)m->o.steps : s->cfg.steps;
	double t_first = 0, launch_s = 0;
	for (uint64_t k = 0; k < steps; k++) {
		if (k == 1)
			t_first = MPI_Wtime(); /* step 1 pays for first-touch and warm-up */
		double t0 = MPI_Wtime();
		RT_CHECK(cuda_exec_step_launch(m->x, k, e));
		if (k >= 1)
			launch_s += MPI_Wtime() - t0;
		if (k + 1 < steps)
			RT_CHECK(cuda_exec_prefetch(m->x, k + 1, e)); /* overlaps step k */
		RT_CHECK(cuda_exec_step_wait(m->x, e));
		float loss = 0, gn = NAN, lr_dev;
		int64_t t;
		if (s->metrics.loss >= 0)
			RT_CHECK(cuda_exec_read(m->x, s->metrics.loss, &loss, e));
		if (s->metrics.grad_norm >= 0)
			RT_CHECK(cuda_exec_read(m->x, s->metrics.grad_norm, &gn, e));
		RT_CHECK(cuda_exec_scalars(m->x, &lr_dev, &t, e));
		double lr = exec_lr(s, k), v[1] = {loss};
		/* device cos/pow may differ from glibc's in the last ulp of a double */
		if (fabs((double)lr_dev - lr) > 1e-6 * fabs(lr) + 1e-12 || t != (int64_t)k + 1)
			return RT_FAIL(e, "step %llu: the device schedule says lr %.9g t %lld, the host "
				       "%.9g t %llu", (unsigned long long)k + 1, lr_dev, (long long)t,
				       (double)(float)lr, (unsigned long long)k + 1);
		RT_CHECK(m->comm->ops->allreduce_f64(m->comm, COMM_DP_AXES, v, 1, e));
		if (!isfinite(v[0]))
			return RT_FAIL(e, "loss is %s at step %llu", isnan(v[0]) ? "NaN" : "infinite",
				       (unsigned long long)k + 1);
		if (m->losses)
			fprintf(m->losses, "%llu %.9g %.9g %.9g\n", (unsigned long long)k + 1, v[0],
				(double)gn, lr);
		if (m->rank == 0 && !m->o.quiet)
			printf("step %llu/%llu | loss %.6f | grad_norm %.4f | lr %.3e\n",
			       (unsigned long long)k + 1, (unsigned long long)steps, v[0], (double)gn, lr);
	}
	if (steps > 1 && m->rank == 0) {
		double n = (double)(steps - 1), total = MPI_Wtime() - t_first;
		printf("cuda_smoke: %.4f ms/step, %.1f us host launch per step (steps 2..%llu)\n",
		       total * 1e3 / n, launch_s * 1e6 / n, (unsigned long long)steps);
	}
	if (m->losses) {
		fclose(m->losses);
		m->losses = NULL;
	}
	if (m->o.save_full)
		RT_CHECK(save_full(m));
	return 0;
}

static void smoke_free(Smoke *m)
{
	if (m->losses)
		fclose(m->losses);
	cuda_exec_free(m->x); /* graphs before communicators */
	cuda_nccl_free(m->nccl);
	data_free(m->train);
	if (m->comm)
		m->comm->ops->free(m->comm);
	dpstep_free(&m->step);
}

int main(int argc, char **argv)
{
	static Smoke sm;
	Smoke *m = &sm;
	int pr = parse(argc, argv, &m->o);
	if (pr)
		return pr > 0 ? 0 : 2;
	int ndev = cuda_device_count();
	if (m->o.probe) {
		printf("cuda devices: %d\n", ndev);
		for (int d = 0; d < ndev; d++) {
			char buf[256];
			cuda_describe(d, buf, sizeof buf);
			printf("  %d: %s\n", d, buf);
		}
		return 0;
	}
	if (ndev == 0) {
		fprintf(stderr, "cuda_smoke: error: no CUDA device is visible (no GPU or no "
				"driver); nothing was run\n");
		return 3;
	}
	int provided;
	if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
		fprintf(stderr, "cuda_smoke: error: MPI_Init_thread failed\n");
		return 1;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &m->world);
	m->e.rank = m->rank;
	char err[1024];
	int status = 0;
	if (dpstep_read_file(m->o.step_path, &m->step, err, sizeof err)) {
		fprintf(stderr, "cuda_smoke: error: %s\n", err);
		status = 1;
	} else {
		uint64_t want = 1;
		for (int a = 0; a < DP_MAX_AXES; a++)
			want *= m->step.cfg.mesh[a];
		if (want != (uint64_t)m->world) {
			fprintf(stderr, "cuda_smoke: error: %s wants %llu ranks, this run has %d\n",
				m->o.step_path, (unsigned long long)want, m->world);
			status = 1;
		} else if (run(m)) {
			fprintf(stderr, "cuda_smoke: error: %s\n", m->e.msg);
			fflush(stderr);
			if (m->world > 1) {
				cuda_nccl_abort(m->nccl);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
			status = 1;
		}
	}
	fflush(stdout);
	smoke_free(m);
	MPI_Finalize();
	return status;
}
