/*
 * dpexec.c - the executor's main: options, MPI bootstrap, the compute device
 * (--device: the CPU backend, or the CUDA backend loaded with dlopen;
 * runtime/backend.c), parameter init (the step file's init program), the
 * training loop, evaluation, full parameter exports (the export program),
 * training-state checkpoints and resume (runtime/ckpt.c), logs
 * (runtime/metrics.c), traces (runtime/trace.c) and signals.
 *
 *   mpirun -np N dpexec step.bin     (or plain `dpexec step.bin`: one rank)
 *
 * Every rank reads the same step file and derives its mesh coordinates from
 * its rank (rank = ((r*S + s)*C + c)*T + t). Nothing below main() exits: a
 * failure travels up as an RtErr.
 *
 * Errors are printed once. The ranks meet at sync points (world_sync):
 * after each set-up phase and after every step. A rank's error there is
 * known to all; the lowest rank that found an error itself prints it and
 * ends the job (MPI_Abort, with Open MPI's help text turned off), the
 * others wait to be ended. An error between sync points (inside a step)
 * gets a short sync: if the other ranks are stuck in a collective the
 * failed rank never joins, it prints its own error and aborts the job.
 * Checks come before work: output paths, the save directory's space, the
 * checkpoint to resume from and the data are checked before the first step.
 *
 * Signals: SIGINT/SIGTERM are recorded (runtime/signals.c); at the next
 * step's sync every rank learns of them, the step is finished, a
 * checkpoint is written when saving is configured, rank 0 says how to
 * resume, and the job exits with 128 + the signal.
 *
 * Sampling (runtime/sampler.c): --sample with --init-from or --resume
 * generates from those weights and exits, before any data is opened,
 * printing the text alone on stdout (as --quiet, without the mesh, arena
 * and resumed lines; a checkpoint's notes, errors and warnings on stderr);
 * sample_every (--sample-every) prints a sample during training, after the
 * steps it names, as eval runs.
 *
 * The learning-rate schedule is exec_lr's (runtime/exec.c).
 * Logged step numbers (console and --losses) count from 1: the line for step
 * k+1 carries the loss of optimizer step k and the lr it used.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <mpi.h>

#include "ckpt.h"
#include "cliopt.h"
#include "cmdline.h"
#include "comm.h"
#include "settings.h"
#include "exec.h"
#include "metrics.h"
#include "rt.h"
#include "sampler.h"
#include "stamp.h"
#include "data_share.h"
#include "world.h"

/* MFU on the CPU is measured against this per-rank peak unless
 * --peak-tflops says otherwise: a round number, not a measurement. */
#define DPEXEC_CPU_PEAK_TFLOPS 1.0
/* How long a failed rank waits for the others to agree before it ends the
 * job alone (they may be stuck in a collective it never joins). */
#define DPEXEC_GRACE_S 5.0
/* the exit status of a job ended because a rank did not answer within
 * --timeout (stuck or gone): a launcher may restart it;
 * EX_TEMPFAIL of sysexits.h */
#define DPEXEC_EXIT_LOST 75

typedef struct {
	const char *step_path;
	const char *device;
	const char *save_full;
	const char *init_from;
	const char *losses;
	const char *trace;   /* --trace FILE */
	unsigned long long trace_from, trace_to; /* --trace-steps A:B (from 1); 0: every program */
	const char *log_json;
	const char *save_dir;
	const char *resume;
	int auto_resume;     /* --auto-resume: continue from save_dir's checkpoint if any */
	int overwrite;       /* --overwrite: a fresh run may replace save_dir's checkpoints */
	CkptForm save_form;
	SampleOpts sample;   /* --sample, --tokens, --temperature, --top-k, --seed,
	                        --sample-logits */
	int sample_opts;     /* one of the options after --sample was given */
	int have_seed;       /* --seed: else the step file's */
	int sample_only;     /* --sample with --init-from or --resume: sample and exit */
	/* the settings-backed flags (format/settings.def's dpexec flags: --steps,
	 * --save-every, ...): given[id] when one overrides setting id's value in
	 * the step file (applied as it is read) */
	unsigned char given[DP_NSETTINGS];
	int64_t value[DP_NSETTINGS];
	int quiet, verbose, check_grads, no_progress, no_graph;
	int no_eval;         /* --no-eval: no evaluation, its data never loaded */
	const char *calibrate; /* --calibrate FILE: measure the machine into FILE and exit */
	int gemm_tune;       /* --gemm-tune: 0 off, 1 on (the CUDA backend's CU_TUNE_*) */
	const char *gemm_tune_file; /* --gemm-tune FILE: the cache of its choices */
	int timestamps;      /* every console line starts with its time (the default;
	                        --no-timestamps: 0) */
	double timeout;      /* seconds, 0: none; default WORLD_DEFAULT_TIMEOUT */
	double peak_tflops;  /* per rank, for MFU; 0: the device's default */
	int argc;
	char **argv;         /* as given (getopt_long permutes main's): the resume command */
} Opts;

/* Everything a run holds; freed by run_free. */
typedef struct {
	Opts o;
	int rank, world;
	World w;
	DpStep step;
	int have_step;
	Comm *comm;
	const BackendOps *ops; /* the compute backend (--device) */
	void *dl;              /* dlopen handle of a loaded backend */
	Exec x;
	int have_exec;
	MPI_Comm node;       /* the ranks of this node (MPI_COMM_TYPE_SHARED), with have_node */
	int have_node;
	DataSet *train, *eval;
	Sampler sp;          /* --sample or sample_every: ready after load_step */
	FILE *text;          /* --sample's text alone (no timestamps): the process's own stdout */
	int sampling;
	Ckpt *ck;
	Metrics m;
	char *save_dir;      /* NULL: no checkpoints */
	char *resume_dir;    /* the checkpoint --resume names */
	Trace *trace;        /* --trace: open from before the first step to the end (x.trace: where marks go now) */
	uint64_t start;      /* steps done before this run (resume) */
	uint64_t saved;      /* step of the last checkpoint written or loaded, with have_saved */
	int have_saved;
	char *saved_path;
	RtErr e;
} Run;

/* The settings-backed flags' help, from their rows. */
static void setting_flags_help(FILE *f)
{
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->flag_prog != DP_FLAG_DPEXEC)
			continue;
		char head[64], text[512];
		snprintf(head, sizeof head, "  --%s N", st->flag);
		snprintf(text, sizeof text, "%s (%s's %s%s%s)", st->help,
			 st->section == DP_SEC_EVAL ? "eval" : "train", st->name,
			 st->flag_lo == 0 ? "; 0: " : "", st->flag_lo == 0 ? (st->zero ? st->zero : "none") : "");
		dp_help_line(f, head, text, 24);
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dpexec [options] STEP.bin\n"
		"Run a training step file compiled by dpc, on every rank:\n"
		"  mpirun -np N dpexec step.bin      (plain `dpexec step.bin` is one rank)\n"
		"The world size must equal the mesh the step file was compiled for.\n"
		"\n"
		"options:\n"
		"  --device auto|cpu|cuda\n"
		"                        compute device (default auto: cuda when a GPU is found)\n"
		"  --quiet               no per-step log lines\n"
		"  --no-eval             no evaluation, not even after the last step, and the\n"
		"                        eval data is never loaded (a run for its losses or\n"
		"                        parameters alone: a benchmark, a smoke test)\n"
		"  --verbose             also log communication time per log line, and show the\n"
		"                        rank, host and source location of an error, and the\n"
		"                        data each node loads once for its ranks\n"
		"  --no-timestamps       do not start every line printed during the run (stdout\n"
		"                        and stderr, every rank's) with the UTC time it was\n"
		"                        printed (2026-11-27T04:21:52.123Z, the default;\n"
		"                        --timestamps turns it back on). The text of --sample\n"
		"                        with --init-from or --resume is printed unstamped\n"
		"  --losses FILE         rank 0 writes `step loss grad_norm lr` per step (%%.9g),\n"
		"                        after a `# ...` header line, a line at a time\n"
		"  --log-json FILE       rank 0 writes one JSON object per logged step: step, time,\n"
		"                        loss, lr, grad_norm, ms_per_step, samples_per_s,\n"
		"                        tokens_per_s and mfu (token models), eval_loss and\n"
		"                        eval_accuracy (when evaluated), elapsed_s, eta_s; after a\n"
		"                        {\"run\": ...} record (command, model, mesh, versions).\n"
		"                        An existing file is appended to, never overwritten\n"
		"  --peak-tflops X       peak TFLOP/s of one rank, for MFU (default on the CPU: %g)\n"
		"  --init-from FILE      take initial parameters from a safetensors file (by name)\n"
		"  --save-full FILE      after training, write every parameter to a safetensors\n"
		"                        file (rank 0; DSL names)\n"
		"  --check-grads         compare gradients with finite differences on the first\n"
		"                        micro-batch (1 rank) and exit; non-zero if any fails\n"
		"  --calibrate FILE      measure this machine at this world size for `dpc\n"
		"                        --simulate=FILE`: the step file's kernels at their\n"
		"                        shapes and MPI's collectives (runtime/calibrate.c;\n"
		"                        --device cuda: device times from CUDA events, the\n"
		"                        graph's overhead, the step's NCCL collectives);\n"
		"                        a FILE calibrated at this world size before keeps\n"
		"                        what this step file does not measure\n"
		"  --timeout SEC         fail (instead of hanging) when a collective or any wait\n"
		"                        for another rank takes longer than SEC seconds\n"
		"                        (default 600, as PyTorch's process groups; 0: no limit)\n"
		"  --no-progress         do not poll pending collectives between instructions;\n"
		"                        they then advance only when waited for (to measure\n"
		"                        what the polling buys: bench/overlap.sh)\n"
		"  --trace FILE          write a Chrome/Perfetto JSON trace of the run (every\n"
		"                        step, eval and export): a lane per stream, a span per\n"
		"                        instruction, collectives with bytes and axes, waits;\n"
		"                        rank 0 writes one file for all ranks and prints a\n"
		"                        summary: time per op class and the top 15 ops of\n"
		"                        the step program against the steps' wall time.\n"
		"                        --device cuda: device times (CUDA events around each\n"
		"                        instruction on its stream) on lanes of their own;\n"
		"                        implies --no-graph, and runs one at a time\n"
		"  --trace-steps A:B     trace only steps A to B (counting from 1, as logged),\n"
		"                        no eval or export: a window of a long run\n"
		"  --gemm-tune off|on|FILE\n"
		"                        --device cuda: each distinct GEMM's cuBLASLt algorithm\n"
		"                        (default off: the heuristic's first, the same every\n"
		"                        run) or the fastest of up to 9 candidates timed at\n"
		"                        load on scratch operands (on: may differ run to run\n"
		"                        where two time alike), or on with FILE as a cache:\n"
		"                        read, what it lacks timed and written back, so runs\n"
		"                        reproduce bit for bit. Rank 0 times; every rank takes\n"
		"                        its choices. The device line says what it cost\n"
		"\nsampling from a language model (its step file's sample program):\n"
		"  --sample PROMPT       with --init-from or --resume: print PROMPT and the tokens\n"
		"                        the model continues it with, then exit; otherwise the\n"
		"                        prompt of sample_every's samples (default: a newline).\n"
		"                        Text for a byte-level model (vocab <= 256), else token\n"
		"                        ids (separated by spaces or commas)\n"
		"  --tokens N            tokens to generate (default 64)\n"
		"  --temperature T       softmax temperature (default 1; 0: greedy)\n"
		"  --top-k K             draw among the K most likely tokens (default 0: all)\n"
		"  --seed S              the draws' Philox key (default: the step file's seed)\n"
		"  --sample-logits FILE  rank 0 writes the prompt's logits, a line per position\n"
		"\ncheckpoints (docs/CHECKPOINTS.md):\n"
		"  --save-dir DIR        write training-state checkpoints to DIR/step-N: at the end,\n"
		"                        on SIGINT/SIGTERM and every --save-every steps; DIR/latest\n"
		"                        names the newest complete one (default DIR: checkpoints,\n"
		"                        when the model sets save_every; with --resume, its DIR)\n"
		"  --save-form full|sharded\n"
		"                        full (default): rank 0 writes model.safetensors (loads in\n"
		"                        PyTorch) and optimizer.safetensors; sharded: every rank\n"
		"                        writes its own part in parallel. Both load at any world\n"
		"                        size and strategy\n"
		"  --resume PATH         continue from a checkpoint: DIR (its latest), DIR/latest or\n"
		"                        DIR/step-N; the steps after it repeat the uninterrupted\n"
		"                        run's exactly at the same layout\n"
		"  --auto-resume         continue from the newest complete checkpoint in the save\n"
		"                        directory if there is one, else start fresh (for jobs\n"
		"                        that are requeued or restarted)\n"
		"  --overwrite           start a fresh run in a save directory that holds\n"
		"                        checkpoints (refused without it); they are removed once\n"
		"                        this run has written its first\n"
		"\nthe model's settings (each overrides the step file's value):\n",
		DPEXEC_CPU_PEAK_TFLOPS);
	setting_flags_help(f);
	fprintf(f,
		"\n"
		"  --version             the version, the step-file format it reads, the MPI library\n"
		"  -h, --help            this text\n"
		"\n"
		"The CPU backend uses DP_NUM_THREADS threads per rank (else OMP_NUM_THREADS, else\n"
		"the cores the rank may run on); OpenBLAS runs one thread inside each of them,\n"
		"with its Haswell kernels on AMD Zen 4, and by the CPU's features (SkylakeX, Haswell)\n"
		"where OpenBLAS does not know the CPU (set OPENBLAS_CORETYPE or DP_BLAS_CORE=NAME to\n"
		"choose, DP_BLAS_CORE=keep for OpenBLAS's own; --verbose shows the kernels).\n"
		"Exit status: 0 done; 1 error (printed once); 2 bad options; 75 a rank did not\n"
		"answer within --timeout (stuck or gone: a launcher may restart); 128+N stopped by\n"
		"signal N (130 SIGINT, 143 SIGTERM; SIGUSR1 and SIGUSR2, which mpirun forwards to\n"
		"the ranks, count as SIGINT and SIGTERM), after writing a checkpoint when saving.\n"
		"Ctrl-C on mpirun makes it SIGTERM the ranks and exit 1 (docs/CHECKPOINTS.md).\n");
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

/* dpexec --version: its release, the step-file format it reads and the MPI
 * library's first words (MPI_Get_library_version works before MPI_Init). */
static void print_version(FILE *f)
{
	char lib[MPI_MAX_LIBRARY_VERSION_STRING];
	int n = 0;
	lib[0] = '\0';
	MPI_Get_library_version(lib, &n);
	fprintf(f, "dpexec %s (step file format %u; %.*s)\n", DP_VERSION, DP_STEP_VERSION,
		(int)strcspn(lib, ",\n"), lib);
}

/* --log-json's first record of this run (metrics_open): {"run": {...}} for a
 * fresh run, {"resume": {"step": N, "from": DIR, ...}} for a resumed one,
 * with the time, the command as given, the model, the step file, the mesh,
 * the device and the versions. NULL when out of memory (malloc'd). */
static char *run_record(const Run *r, const char *device)
{
	const DpStep *s = &r->step;
	const uint32_t *mesh = s->cfg.mesh;
	char when[40], lib[MPI_MAX_LIBRARY_VERSION_STRING], cmd[8192] = "";
	int n = 0;
	stamp_now(when, sizeof when);
	MPI_Get_library_version(lib, &n);
	lib[strcspn(lib, ",\n")] = '\0';
	for (int i = 0; i < r->o.argc && cmd_append(cmd, sizeof cmd, r->o.argv[i]) == 0; i++)
		;
	cJSON *top = cJSON_CreateObject(), *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
	cJSON_AddItemToObject(top, r->resume_dir ? "resume" : "run", o);
	if (r->resume_dir) {
		cJSON_AddNumberToObject(o, "step", (double)r->start);
		cJSON_AddStringToObject(o, "from", r->resume_dir);
	}
	cJSON_AddStringToObject(o, "time", when);
	cJSON_AddStringToObject(o, "command", cmd);
	cJSON_AddStringToObject(o, "model", dpstep_str(s, s->source));
	cJSON_AddStringToObject(o, "step_file", r->o.step_path);
	cJSON_AddNumberToObject(o, "world", r->world);
	cJSON_AddNumberToObject(m, "dp_replicate", mesh[DP_AXIS_REPLICATE]);
	cJSON_AddNumberToObject(m, "dp_shard", mesh[DP_AXIS_SHARD]);
	cJSON_AddNumberToObject(m, "cp", mesh[DP_AXIS_CP]);
	cJSON_AddNumberToObject(m, "tp", mesh[DP_AXIS_TP]);
	cJSON_AddItemToObject(o, "mesh", m);
	cJSON_AddStringToObject(o, "strategy", dp_name(dp_strategy_names, DP_NSTRAT, s->cfg.strategy));
	cJSON_AddStringToObject(o, "device", device);
	cJSON_AddStringToObject(o, "dpexec", DP_VERSION);
	cJSON_AddNumberToObject(o, "step_format", DP_STEP_VERSION);
	cJSON_AddStringToObject(o, "mpi", lib);
	char *text = cJSON_PrintUnformatted(top), *line = NULL;
	cJSON_Delete(top);
	if (text && (line = malloc(strlen(text) + 2)))
		sprintf(line, "%s\n", text);
	free(text);
	return line;
}

/* 0: run; 1: exit 0 (help, version); -1: usage error (message printed). */
static int parse_opts(int argc, char **argv, Opts *o)
{
	enum { O_DEVICE = 256, O_SAVE_FULL, O_INIT_FROM,
	       O_QUIET, O_VERBOSE, O_CHECK_GRADS, O_LOSSES, O_TIMEOUT, O_NO_PROGRESS, O_NO_GRAPH, O_NO_EVAL,
	       O_TRACE, O_TRACE_STEPS, O_LOG_JSON, O_PEAK, O_SAVE_DIR, O_SAVE_FORM,
	       O_RESUME, O_AUTO_RESUME, O_OVERWRITE, O_VERSION, O_TIMESTAMPS, O_NO_TIMESTAMPS, O_CALIBRATE,
	       O_SAMPLE, O_TOKENS, O_TEMPERATURE, O_TOP_K, O_SEED, O_SAMPLE_LOGITS, O_GEMM_TUNE,
	       O_SETTING /* + the setting's id: its dpexec flag */ };
	static const struct option fixed[] = {
		{"device", required_argument, NULL, O_DEVICE},
		{"save-full", required_argument, NULL, O_SAVE_FULL},
		{"init-from", required_argument, NULL, O_INIT_FROM},
		{"quiet", no_argument, NULL, O_QUIET},
		{"verbose", no_argument, NULL, O_VERBOSE},
		{"timestamps", no_argument, NULL, O_TIMESTAMPS},
		{"no-timestamps", no_argument, NULL, O_NO_TIMESTAMPS},
		{"check-grads", no_argument, NULL, O_CHECK_GRADS},
		{"calibrate", required_argument, NULL, O_CALIBRATE},
		{"losses", required_argument, NULL, O_LOSSES},
		{"timeout", required_argument, NULL, O_TIMEOUT},
		{"no-progress", no_argument, NULL, O_NO_PROGRESS},
		{"no-eval", no_argument, NULL, O_NO_EVAL},
		{"no-graph", no_argument, NULL, O_NO_GRAPH},
		{"gemm-tune", required_argument, NULL, O_GEMM_TUNE},
		{"trace", required_argument, NULL, O_TRACE},
		{"trace-steps", required_argument, NULL, O_TRACE_STEPS},
		{"log-json", required_argument, NULL, O_LOG_JSON},
		{"peak-tflops", required_argument, NULL, O_PEAK},
		{"save-dir", required_argument, NULL, O_SAVE_DIR},
		{"save-form", required_argument, NULL, O_SAVE_FORM},
		{"resume", required_argument, NULL, O_RESUME},
		{"auto-resume", no_argument, NULL, O_AUTO_RESUME},
		{"overwrite", no_argument, NULL, O_OVERWRITE},
		{"sample", required_argument, NULL, O_SAMPLE},
		{"tokens", required_argument, NULL, O_TOKENS},
		{"temperature", required_argument, NULL, O_TEMPERATURE},
		{"top-k", required_argument, NULL, O_TOP_K},
		{"seed", required_argument, NULL, O_SEED},
		{"sample-logits", required_argument, NULL, O_SAMPLE_LOGITS},
		{"version", no_argument, NULL, O_VERSION},
		{"help", no_argument, NULL, 'h'},
	};
	/* the fixed options, then a flag per setting that has a dpexec flag */
	struct option longopts[sizeof fixed / sizeof fixed[0] + DP_NSETTINGS + 1];
	dp_setting_options(longopts, fixed, (int)(sizeof fixed / sizeof fixed[0]), DP_FLAG_DPEXEC,
			   O_SETTING);
	/* the words as given, before getopt_long permutes them */
	char **given = malloc(((size_t)argc + 1) * sizeof *given);
	if (!given) {
		fprintf(stderr, "dpexec: error: out of memory\n");
		return -1;
	}
	memcpy(given, argv, ((size_t)argc + 1) * sizeof *given);
	*o = (Opts){.device = "auto", .timeout = WORLD_DEFAULT_TIMEOUT, .save_form = CKPT_FULL,
		    .timestamps = 1,
		    .argc = argc, .argv = given,
		    .sample = {.tokens = 64, .temperature = 1.0}};
	opterr = 0;
	int c, li = -1;
	while ((li = -1, c = getopt_long(argc, argv, ":h", longopts, &li)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout);
			return 1;
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
		case O_QUIET:
			o->quiet = 1;
			break;
		case O_VERBOSE:
			o->verbose = 1;
			break;
		case O_TIMESTAMPS:
			o->timestamps = 1;
			break;
		case O_NO_TIMESTAMPS:
			o->timestamps = 0;
			break;
		case O_CHECK_GRADS:
			o->check_grads = 1;
			break;
		case O_CALIBRATE:
			o->calibrate = optarg;
			break;
		case O_NO_PROGRESS:
			o->no_progress = 1;
			break;
		case O_NO_EVAL:
			o->no_eval = 1;
			break;
		case O_NO_GRAPH:
			o->no_graph = 1;
			break;
		case O_GEMM_TUNE: /* off, on, or a file (./on for a file named on) */
			o->gemm_tune = strcmp(optarg, "off") != 0;
			o->gemm_tune_file = strcmp(optarg, "off") && strcmp(optarg, "on") ? optarg : NULL;
			if (!*optarg) {
				fprintf(stderr, "dpexec: --gemm-tune: expected off, on or a file name\n");
				return -1;
			}
			break;
		case O_LOSSES:
			o->losses = optarg;
			break;
		case O_TRACE:
			o->trace = optarg;
			break;
		case O_TRACE_STEPS: {
			int end = 0;
			if (sscanf(optarg, "%llu:%llu%n", &o->trace_from, &o->trace_to, &end) != 2 ||
			    optarg[end] || !isdigit((unsigned char)optarg[0]) || o->trace_from < 1 ||
			    o->trace_to < o->trace_from) {
				fprintf(stderr, "dpexec: error: --trace-steps wants A:B, the first and last "
						"step to trace (from 1, A <= B), not '%s'\n", optarg);
				return -1;
			}
			break;
		}
		case O_TIMEOUT: {
			char *end;
			o->timeout = strtod(optarg, &end);
			if (!*optarg || *end || !(o->timeout >= 0))
				goto badnum;
			break;
		}
		case O_PEAK: {
			char *end;
			o->peak_tflops = strtod(optarg, &end);
			if (!*optarg || *end || !(o->peak_tflops > 0))
				goto badnum;
			break;
		}
		case O_LOG_JSON:
			o->log_json = optarg;
			break;
		case O_SAVE_DIR:
			o->save_dir = optarg;
			break;
		case O_RESUME:
			o->resume = optarg;
			break;
		case O_VERSION:
			print_version(stdout);
			return 1;
		case O_AUTO_RESUME:
			o->auto_resume = 1;
			break;
		case O_OVERWRITE:
			o->overwrite = 1;
			break;
		case O_SAMPLE:
			o->sample.prompt = optarg;
			break;
		case O_TOKENS: {
			long v;
			if (parse_long(optarg, 1, &v) || v > INT32_MAX) {
				fprintf(stderr, "dpexec: error: --tokens wants how many tokens to generate, "
						"1 or more, not '%s'\n", optarg);
				return -1;
			}
			o->sample.tokens = v;
			o->sample_opts = 1;
			break;
		}
		case O_TEMPERATURE: {
			char *end;
			o->sample.temperature = strtod(optarg, &end);
			if (!*optarg || *end || !(o->sample.temperature >= 0) ||
			    !isfinite(o->sample.temperature))
				goto badnum;
			o->sample_opts = 1;
			break;
		}
		case O_TOP_K: {
			long v;
			if (parse_long(optarg, 0, &v))
				goto badnum;
			o->sample.top_k = v;
			o->sample_opts = 1;
			break;
		}
		case O_SEED: {
			char *end;
			errno = 0;
			unsigned long long v = strtoull(optarg, &end, 10);
			if (!isdigit((unsigned char)optarg[0]) || *end || errno)
				goto badnum;
			o->sample.seed = v;
			o->have_seed = o->sample_opts = 1;
			break;
		}
		case O_SAMPLE_LOGITS:
			o->sample.logits = optarg;
			o->sample_opts = 1;
			break;
		case O_SAVE_FORM:
			if (!strcmp(optarg, "full") || !strcmp(optarg, "sharded")) {
				o->save_form = !strcmp(optarg, "full") ? CKPT_FULL : CKPT_SHARDED;
				break;
			}
			fprintf(stderr, "dpexec: error: --save-form must be full or sharded, not '%s'\n",
				optarg);
			return -1;
		case ':':
		default:
			if (c >= O_SETTING && c < O_SETTING + DP_NSETTINGS) {
				/* the setting's range, with the flag's own floor (0: off) */
				const DpSetting *st = &dp_settings[c - O_SETTING];
				long v;
				if (parse_long(optarg, (long)st->flag_lo, &v) ||
				    (st->hi_bound == DP_B_LE && (double)v > st->hi))
					goto badnum;
				o->given[c - O_SETTING] = 1;
				o->value[c - O_SETTING] = v;
				break;
			}
			cli_bad_option(stderr, "dpexec", c, argc, argv, ":h", longopts);
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
	if ((o->resume != NULL) + o->auto_resume + o->overwrite > 1) {
		fprintf(stderr, "dpexec: error: --resume, --auto-resume and --overwrite exclude each "
				"other\n");
		return -1;
	}
	if (o->no_eval && o->given[DP_SET_EVAL_EVERY]) {
		fprintf(stderr, "dpexec: error: --no-eval and --eval-every exclude each other: "
				"--no-eval evaluates never, --eval-every 0 after the last step\n");
		return -1;
	}
	if (o->trace_to && !o->trace) {
		fprintf(stderr, "dpexec: error: --trace-steps chooses the steps of --trace FILE: give "
				"--trace\n");
		return -1;
	}
	if (o->sample_opts && !o->sample.prompt && !o->given[DP_SET_SAMPLE_EVERY]) {
		fprintf(stderr, "dpexec: error: --tokens, --temperature, --top-k, --seed and "
				"--sample-logits say how to sample: give --sample PROMPT (or "
				"--sample-every N)\n");
		return -1;
	}
	o->sample_only = o->sample.prompt && !o->given[DP_SET_SAMPLE_EVERY] &&
			 (o->init_from || o->resume);
	if (o->sample_only) /* a sampling user wants the text: no mesh or arena lines */
		o->quiet = 1;
	if ((o->resume || o->auto_resume) && o->init_from) {
		fprintf(stderr, "dpexec: error: --%s and --init-from exclude each other: a resumed "
				"run takes its parameters from the checkpoint\n",
			o->resume ? "resume" : "auto-resume");
		return -1;
	}
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

/* A pipeline stage's SAVEs run on its ranks only (pp > 1: each stage keeps
 * its own parameters, passes/stage_params.c): the lowest rank of each stage
 * but the first hands rank 0 its tensors, SAVE by SAVE (pp outermost: stage
 * k's lowest rank is k * world / pp). */
static int gather_stage_saves(Run *r, StSaved *sv, RtErr *e)
{
	const DpStep *s = &r->step;
	int W = r->w.size, per = W / (int)s->cfg.mesh[DP_AXIS_PP], rc = 0;
	int *counts = calloc((size_t)W, sizeof *counts), *displs = calloc((size_t)W, sizeof *displs);
	if (!counts || !displs)
		rc = RT_FAIL(e, "out of memory");
	for (uint32_t i = 0; rc == 0 && i < s->nprog[DP_PROG_EXPORT]; i++) {
		const DpInstr *in = &s->prog[DP_PROG_EXPORT][i];
		int stage = dp_instr_stage(in);
		if (in->op != DP_OP_SAVE || stage <= 0)
			continue;
		int id = in->in[0], from = stage * per;
		int64_t n = exec_numel(&s->tensors[id]);
		if (n > INT32_MAX) {
			rc = RT_FAIL(e, "--save-full: '%s' has more than 2^31 elements",
				     dpstep_str(s, s->tensors[id].name));
			break;
		}
		float *recv = r->rank == 0 ? malloc((size_t)(n ? n : 1) * sizeof(float)) : NULL;
		if (r->rank == 0 && !recv) {
			rc = RT_FAIL(e, "out of memory");
			break;
		}
		counts[from] = (int)n;
		rc = world_gatherv_f32(&r->w, r->rank == from ? sv->data[id] : NULL,
				       r->rank == from ? (int)n : 0, recv, counts, displs, e);
		counts[from] = 0;
		if (r->rank == 0 && rc == 0) {
			free(sv->data[id]);
			sv->data[id] = recv;
			sv->name[id] = in->in[1] >= 0 ? in->in[1] : in->in[0];
		} else {
			free(recv);
		}
	}
	free(counts);
	free(displs);
	return rc;
}

/* --save-full: every rank runs the export program (under sharded strategies
 * it gathers the parameters, a collective; a pipeline stage's run on its own
 * ranks, gathered on rank 0 after); then rank 0 writes the SAVE'd tensors,
 * in tensor-table order, atomically. */
static int save_full(Run *r)
{
	RtErr *e = &r->e;
	StSaved sv;
	int pp = (int)r->step.cfg.mesh[DP_AXIS_PP], per = r->w.size / (pp > 0 ? pp : 1);
	RT_CHECK(st_saved_init(&sv, &r->step, r->rank == 0 || (pp > 1 && r->rank % per == 0), e));
	r->x.save_tensor = st_saved_hook;
	r->x.hook_ctx = &sv;
	int rc = exec_run(&r->x, DP_PROG_EXPORT, 1, e);
	r->x.save_tensor = NULL;
	r->x.hook_ctx = NULL;
	if (rc == 0 && pp > 1)
		rc = gather_stage_saves(r, &sv, e);
	if (r->rank != 0)
		sv.keep = 0;
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

/* Every eval batch; the sums over ranks in *ev (a collective). */
static int evaluate(Run *r, EvalResult *ev)
{
	const DpStep *s = &r->step;
	RtErr *e = &r->e;
	Exec *x = &r->x;
	memset(ev, 0, sizeof *ev);
	if (!r->eval || s->nprog[DP_PROG_EVAL] == 0)
		return 0;
	int64_t nb = data_eval_batches(r->eval, s, x->dp_size);
	double sum[3] = {0, 0, 0}; /* loss, correct, counted */
	float lo[1], co[2];
	for (int64_t b = 0; b < nb; b++) {
		x->eval_batch = b;
		RT_CHECK(exec_zero_metrics(x, e));
		RT_CHECK(exec_run(x, DP_PROG_EVAL, 1, e));
		if (s->metrics.eval_loss >= 0) {
			RT_CHECK(exec_tensor_read(x, s->metrics.eval_loss, lo, e));
			sum[0] += lo[0];
		}
		if (s->metrics.eval_correct >= 0) {
			RT_CHECK(exec_tensor_read(x, s->metrics.eval_correct, co, e));
			sum[1] += co[0];
			sum[2] += co[1];
		}
	}
	RT_CHECK(data_error(r->eval, e));
	RT_CHECK(r->comm->ops->allreduce_f64(r->comm, COMM_METRIC_AXES, sum, 3, e));
	double n = sum[2] > 0 ? sum[2] : 1;
	*ev = (EvalResult){1, sum[0] / n, sum[1] / n, sum[1], sum[2]};
	return 0;
}

/* ---- checkpoints ---- */

/* Write a training-state checkpoint after r->start + done steps. */
static int save_state(Run *r, uint64_t step, double loss)
{
	CkptRun run = {step, loss, r->train ? data_count(r->train) : 0, r->x.amp, 1};
	int64_t keep = r->step.cfg.keep_last;
	char *path = NULL;
	int64_t bytes = 0;
	double t0 = MPI_Wtime();
	RT_CHECK(ckpt_save(r->ck, r->save_dir, r->o.save_form, &run, (int)keep, &path, &bytes,
			   &r->e));
	if (r->rank == 0) {
		if (!r->o.quiet)
			printf("checkpoint %s: %s, %.2f MiB in %.2f s\n", path,
			       r->o.save_form == CKPT_FULL ? "full" : "sharded",
			       (double)bytes / (1 << 20), MPI_Wtime() - t0);
		fflush(stdout);
		free(r->saved_path);
		r->saved_path = path;
	} else {
		free(path);
	}
	r->saved = step;
	r->have_saved = 1;
	return 0;
}

/* ---- the run ---- */

/* Before any work: the output paths (rank 0 checks them). Each can be
 * written (util/outfile.h), and none is an input (the step file,
 * --init-from, the data files) or another output. */
static int check_outputs(Run *r)
{
	char err[1024];
	const char *paths[] = {r->o.losses, r->o.log_json, r->o.save_full, r->o.trace,
			       r->o.calibrate, r->o.sample.logits};
	const char *what[] = {"--losses", "--log-json", "--save-full", "--trace", "--calibrate",
			      "--sample-logits"};
	enum { NOUT = sizeof paths / sizeof paths[0] };
	if (r->rank != 0)
		return 0;
	for (int i = 0; i < NOUT; i++)
		if (paths[i] && out_check(paths[i], 0, err, sizeof err))
			return RT_FAIL(&r->e, "%s: %s", what[i], err);
	const DpStep *s = &r->step;
	glob_t *g = calloc(s->nsources ? s->nsources : 1, sizeof *g);
	size_t nin = 2;
	for (uint32_t i = 0; g && i < s->nsources; i++) { /* a token source: every shard */
		const DpSource *src = &s->sources[i];
		if (src->kind == DP_SRC_TOKENS && glob(dpstep_str(s, src->path), 0, NULL, &g[i]) == 0)
			nin += g[i].gl_pathc;
		nin += src->kind == DP_SRC_IDX || src->kind == DP_SRC_NPY;
	}
	OutPath *p = g ? calloc(NOUT + nin, sizeof *p) : NULL;
	int n = 0, rc = 0;
	if (!p) {
		free(p);
		free(g);
		return RT_FAIL(&r->e, "out of memory");
	}
	for (int i = 0; i < NOUT; i++)
		p[n++] = (OutPath){paths[i], what[i], 1};
	p[n++] = (OutPath){r->o.step_path, "the step file", 0};
	p[n++] = (OutPath){r->o.init_from, "--init-from", 0};
	for (uint32_t i = 0; i < s->nsources; i++) {
		const DpSource *src = &s->sources[i];
		if (src->kind == DP_SRC_IDX || src->kind == DP_SRC_NPY)
			p[n++] = (OutPath){dpstep_str(s, src->path), "a data file of the model", 0};
		for (size_t k = 0; k < g[i].gl_pathc; k++)
			p[n++] = (OutPath){g[i].gl_pathv[k], "a token shard of the model", 0};
	}
	if (out_check_distinct(p, n, err, sizeof err))
		rc = RT_FAIL(&r->e, "%s", err);
	for (uint32_t i = 0; i < s->nsources; i++)
		globfree(&g[i]);
	free(g);
	free(p);
	return rc;
}

/* Set-up every rank does alone; agreed on by the caller. */
static int setup_local(Run *r)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	/* --trace on a backend with streams of its own times the device with
	 * timing marks, which a captured graph cannot hold: eager steps */
	BackendOpts bo = {.no_graph = r->o.no_graph || (r->o.trace && !(r->ops->flags & BACKEND_INLINE)),
			  .timeout_s = r->o.timeout,
			  .no_progress = r->o.no_progress, .host = &cpu_host_kernels,
			  .gemm_tune = r->o.gemm_tune, .gemm_tune_file = r->o.gemm_tune_file};
	if (r->o.gemm_tune && (r->ops->flags & BACKEND_INLINE) && r->rank == 0)
		fprintf(stderr, "dpexec: note: --gemm-tune chooses cuBLASLt's algorithms (--device "
				"cuda); this backend's GEMMs have no choice to time: ignored\n");
	/* the ranks of this node pick devices by their index in it, and share
	 * the data (setup_data) */
	if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL,
				&r->node) != MPI_SUCCESS)
		return RT_FAIL(e, "MPI_Comm_split_type failed");
	r->have_node = 1;
	MPI_Comm_rank(r->node, &bo.local_rank);
	RT_CHECK(exec_init(&r->x, s, r->comm, r->ops, &bo, e));
	r->have_exec = 1;
	if (r->rank == 0 && !r->o.quiet) {
		const uint32_t *m = s->cfg.mesh;
		printf("mesh: ");
		if (m[DP_AXIS_PP] > 1)
			printf("pp=%u ", m[DP_AXIS_PP]);
		printf("dp_replicate=%u dp_shard=%u", m[DP_AXIS_REPLICATE], m[DP_AXIS_SHARD]);
		if (m[DP_AXIS_CP] > 1)
			printf(" cp=%u", m[DP_AXIS_CP]);
		if (m[DP_AXIS_TP] > 1)
			printf(" tp=%u", m[DP_AXIS_TP]);
		printf(" (%d rank%s), strategy %s\n", r->world, r->world == 1 ? "" : "s",
		       dp_name(dp_strategy_names, DP_NSTRAT, s->cfg.strategy));
		printf("arena: %.2f MiB per rank\n", (double)s->cfg.arena_bytes / (1 << 20));
		char d[512]; /* the backend says whether its line is worth printing */
		if (exec_describe(&r->x, d, sizeof d) || r->o.verbose)
			printf("device: %s\n", d);
	}
	return run_init(r);
}

/* The data of one split, once every rank has set up (setup_local): the
 * ranks of a node load each IDX and .npy file once between them
 * (runtime/data_share.c), which takes every one of them, so each split is
 * a phase between two sync points (a rank that failed on the train split
 * does not leave the others waiting in the eval split's exchanges). */
static int setup_data(Run *r, DpSplit split)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	DataShare share = {.node = r->node, .timeout_s = r->o.timeout};
	MPI_Comm_rank(r->node, &share.rank);
	MPI_Comm_size(r->node, &share.size);
	const DataShare *sh = share.size > 1 && data_share_wanted() ? &share : NULL;
	int has = 0;
	for (uint32_t i = 0; i < s->nsources; i++)
		has |= s->sources[i].split == split;
	if (r->o.sample_only) /* the prompt is the data */
		has = 0;
	if (split == DP_SPLIT_EVAL && (!s->nprog[DP_PROG_EVAL] || r->o.no_eval))
		has = 0;
	if (!has)
		return 0;
	DataSet **d = split == DP_SPLIT_TRAIN ? &r->train : &r->eval;
	RT_CHECK(data_open_node(s, split, NULL, r->comm->coord[DP_AXIS_CP], sh, d, e));
	if (sh && r->o.verbose && share.rank == 0) {
		int k;
		int64_t b = data_node_bytes(*d, &k);
		printf("data: the %s split's %.1f MB (%lld bytes) loaded once, mapped by %d of the %d "
		       "ranks of rank %d's node\n", split == DP_SPLIT_TRAIN ? "train" : "eval",
		       b / 1e6, (long long)b, k, share.size, r->rank);
	}
	int64_t global_batch = (int64_t)s->cfg.micro_batch * s->cfg.grad_accum * r->x.dp_size;
	if (split == DP_SPLIT_TRAIN && data_count(r->train) < global_batch)
		return RT_FAIL(e, "the training data has %lld samples, fewer than one global batch "
			       "of %lld", (long long)data_count(r->train), (long long)global_batch);
	r->x.train = r->train;
	r->x.eval = r->eval;
	return 0;
}

/* What follows the data: checkpoints, resume, then the run itself. */
static int setup_run(Run *r)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	if (r->o.check_grads || r->o.calibrate)
		return 0;

	RT_CHECK(ckpt_new(&r->ck, &r->x, &r->w, r->o.step_path, e));
	uint64_t save_every = s->cfg.save_every;
	char *parent = NULL, *note = NULL;
	if (r->o.resume)
		RT_CHECK(ckpt_resolve(r->o.resume, &r->resume_dir, &parent, &note, e));
	const char *dir = r->o.sample_only ? NULL : r->o.save_dir ? r->o.save_dir : parent ? parent
				     : save_every ? "checkpoints" : NULL;
	if (dir && !(r->save_dir = strdup(dir))) {
		free(parent);
		free(note);
		return RT_FAIL(e, "out of memory");
	}
	free(parent);
	if (r->o.auto_resume && !r->save_dir)
		return RT_FAIL(e, "--auto-resume continues from the save directory: give --save-dir "
			       "(or save_every in the model)");
	if (r->o.auto_resume && ckpt_find(r->save_dir, &r->resume_dir, &note, e) < 0)
		return -1;
	if (note && r->rank == 0)
		printf("dpexec: %s\n", note);
	free(note);
	CkptDirPlan plan = {.fresh = !r->resume_dir, .overwrite = r->o.overwrite};
	if (r->rank == 0 && r->save_dir)
		RT_CHECK(ckpt_prepare_dir(r->ck, r->save_dir, &plan, e));
	if (r->rank == 0 && r->o.save_full) {
		char err[1024];
		if (out_check(r->o.save_full, (uint64_t)ckpt_params(r->ck) * 4, err, sizeof err))
			return RT_FAIL(e, "--save-full: %s", err);
	}
	if (r->resume_dir) {
		CkptRun run;
		char *notes = NULL;
		double t0 = MPI_Wtime();
		RT_CHECK(ckpt_load(r->ck, r->resume_dir, &run, &notes, e));
		if (r->rank == 0 && r->o.sample_only) { /* the text alone on stdout */
			if (notes)
				fprintf(stderr, "%s", notes);
		} else if (r->rank == 0) { /* also with --quiet: it says what this run is */
			printf("resumed from %s: step %llu, loss %.4f (loaded in %.2f s)\n", r->resume_dir,
			       (unsigned long long)run.step, run.loss, MPI_Wtime() - t0);
			if (notes)
				printf("%s", notes);
			if (r->train && run.train_samples != data_count(r->train))
				printf("note: the training data has %lld samples, the checkpoint's run had "
				       "%lld: the data order differs from the interrupted run's\n",
				       (long long)data_count(r->train), (long long)run.train_samples);
		}
		free(notes);
		if (s->opt.loss_scale != DP_LS_NONE && run.have_amp)
			exec_set_amp(&r->x, run.amp);
		else if (s->opt.loss_scale != DP_LS_NONE && r->rank == 0)
			printf("note: the checkpoint has no loss scale (its run had no loss scaling): "
			       "the scale starts at %g\n", r->x.amp.scale);
		r->start = run.step;
		r->saved = run.step;
		r->have_saved = 1;
		r->saved_path = strdup(r->resume_dir);
	}
	return 0;
}

static int setup(Run *r)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	int rc = check_outputs(r);
	RT_CHECK(world_sync(&r->w, rc, 0, e));
	CommGroup groups[COMM_MAX_GROUPS];
	int ngroups = comm_step_groups(s, groups, COMM_MAX_GROUPS);
	rc = ngroups < 0 ? RT_FAIL(e, "the step file's all_reduces use more than %d sub-groups of "
				   "the pipeline stages", COMM_MAX_GROUPS)
			 : comm_mpi_init(&r->comm, s->cfg.mesh, exec_comm_masks(s), groups, ngroups, e);
	if (r->comm)
		r->comm->timeout_s = r->o.timeout;
	RT_CHECK(world_sync(&r->w, rc, 0, e));
	rc = setup_local(r);
	RT_CHECK(world_sync(&r->w, rc, 0, e));
	rc = setup_data(r, DP_SPLIT_TRAIN);
	RT_CHECK(world_sync(&r->w, rc, 0, e));
	rc = setup_data(r, DP_SPLIT_EVAL);
	RT_CHECK(world_sync(&r->w, rc, 0, e));
	rc = setup_run(r);
	RT_CHECK(world_sync(&r->w, rc, 0, e));
	/* the save directory, once every rank has loaded what it resumes from
	 * (which may be what a killed save left): leftovers, and room */
	if (r->rank == 0 && r->save_dir && r->ck) {
		uint64_t steps = s->cfg.steps, every = s->cfg.save_every; /* the flags' values */
		CkptDirPlan plan = {.keep = (int)s->cfg.keep_last, .fresh = !r->resume_dir,
				    .overwrite = r->o.overwrite,
				    .saves = 1 + (every && steps > r->start ? (int64_t)(steps / every - r->start / every) : 0)};
		rc = ckpt_clean_dir(r->ck, r->save_dir, &plan, e);
	}
	RT_CHECK(world_sync(&r->w, rc, 0, e));
	/* the logs (rank 0), once everything else is known to be right */
	uint64_t steps = s->cfg.steps;
	Metrics *m = &r->m;
	m->quiet = r->o.quiet;
	m->world = r->world;
	m->first = r->start;
	m->steps = steps;
	m->global_batch = (double)s->cfg.micro_batch * s->cfg.grad_accum * r->x.dp_size;
	for (uint32_t i = 0; i < s->nsources; i++) /* a token model: the tokens of a sample */
		if (s->sources[i].kind == DP_SRC_TOKENS && s->sources[i].split == DP_SPLIT_TRAIN &&
		    s->sources[i].shift == 0)
			m->tokens = (double)s->sources[i].sample_elems;
	if (m->tokens > 0 && r->ck) {
		m->flops_per_token = metrics_flops_per_token(s, ckpt_params(r->ck));
		m->peak_flops = (r->o.peak_tflops > 0 ? r->o.peak_tflops : DPEXEC_CPU_PEAK_TFLOPS) * 1e12;
	}
	rc = 0;
	if (r->rank == 0) {
		char *record = r->o.log_json ? run_record(r, r->ops->name) : NULL;
		rc = r->o.log_json && !record ? RT_FAIL(e, "out of memory (--log-json's run record)")
					      : metrics_open(m, r->o.losses, r->o.log_json, record, e);
		free(record);
	}
	/* a schedule that decays to a floor, ended early: said when the run
	 * starts, not again on each resume (a restart, a requeued job) */
	const DpSched *sc = &s->sched;
	uint64_t total = sc->kind == DP_SCHED_WSD ? (uint64_t)sc->warmup + sc->stable + sc->decay
		       : sc->steps ? sc->steps : s->cfg.steps;
	int floored = sc->kind == DP_SCHED_COSINE || sc->kind == DP_SCHED_LINEAR ||
		      sc->kind == DP_SCHED_WSD;
	if (rc == 0 && r->rank == 0 && !r->resume_dir && r->o.given[DP_SET_STEPS] && floored &&
	    steps < total)
		fprintf(stderr, "dpexec: warning: --steps %llu ends the run before its %s schedule "
				"does (%llu steps): the last lr is %.3g, not %s %.3g\n",
			(unsigned long long)steps, dp_kind_name(DP_SET_SCHEDULE, (int)sc->kind),
			(unsigned long long)total, exec_lr(s, steps ? steps - 1 : 0),
			dp_settings[DP_SET_COSINE_MIN_LR].name, exec_lr(s, total));
	return world_sync(&r->w, rc, sig_pending(), e);
}

/* Where the training loop is between its steps' reports. */
typedef struct {
	uint64_t steps, eval_every, log_every, save_every, sample_every;
	double t_log;     /* when the last line was written */
	double t_report;  /* when the last reported step was seen done */
	double done[2];   /* synchronous backend: when step k finished, in done[k & 1] */
	double t_all;     /* the loop's start, moved on by eval and save time */
	double host_s;    /* host time in launches and prefetches since the last line */
	uint64_t since_log, ran;
	CommStats at_log;
} Loop;

/* Step k's report: its metrics (on a backend with streams, from the report
 * step k left behind), the loss reduced over the ranks that hold samples,
 * the data and NaN checks, --losses, and the sync point of step k. With
 * final set (no step is in flight after k) also what must see the
 * parameters after exactly k + 1 steps: eval, a checkpoint, the stop on a
 * signal. Returns 0, -1 on error, or 128 + N after a signal N stopped the
 * run (only with final). */
static int report_step(Run *r, Loop *lp, uint64_t k, int final)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	Comm *c = r->comm;
	Metrics *m = &r->m;
	double lr = exec_lr(s, k), loss = 0, gn = NAN;
	RT_CHECK(exec_step_metrics(&r->x, k, &loss, &gn, e));
	double v[1] = {loss};
	RT_CHECK(c->ops->allreduce_f64(c, COMM_METRIC_AXES, v, 1, e));
	loss = v[0];
	int rc = data_error(r->train, e);
	ExecAmpStep amp = exec_step_amp(&r->x, k); /* a skipped step's norm is not finite */
	if (rc == 0 && (!isfinite(loss) || (s->metrics.grad_norm >= 0 && !isfinite(gn) && !amp.skip))) {
		const char *what = !isfinite(loss) ? "loss" : "gradient norm";
		double bad = !isfinite(loss) ? loss : gn;
		char last[1200] = "no checkpoint was written";
		if (r->have_saved)
			snprintf(last, sizeof last, "the last checkpoint, from step %llu, is %s",
				 (unsigned long long)r->saved, r->saved_path ? r->saved_path : "?");
		rc = RT_FAIL(e, "%s is %s at step %llu; nothing was saved from it (%s)", what,
			     isnan(bad) ? "NaN" : "infinite", (unsigned long long)k + 1, last);
	}
	/* when step k was seen done: on a synchronous backend at the end of
	 * its launch (its report may come after step k + 1 ran), else now that
	 * its metrics arrived */
	double now = MPI_Wtime(), done = exec_synchronous(&r->x) ? lp->done[k & 1] : now;
	if (rc == 0 && r->rank == 0) {
		metrics_step(m, k + 1, loss, gn, lr, done - lp->t_report);
		rc = metrics_error(m, e);
	}
	lp->t_report = done;
	RT_CHECK(world_sync(&r->w, rc, sig_pending(), e));
	lp->since_log++;
	lp->ran++;
	int last = k + 1 == lp->steps, stop = final && r->w.sig != 0;
	EvalResult ev = {0};
	double paused = 0; /* evaluation time, which is not step time */
	if (final && !stop && r->eval && ((lp->eval_every && (k + 1) % lp->eval_every == 0) || last)) {
		double t0 = MPI_Wtime();
		RT_CHECK(evaluate(r, &ev));
		paused = MPI_Wtime() - t0;
		lp->t_all += paused;
	}
	if (final && !stop && r->sampling && ((k + 1) % lp->sample_every == 0 || last)) {
		double t0 = MPI_Wtime();
		if (r->rank == 0) {
			printf("sample at step %llu: ", (unsigned long long)k + 1);
			fflush(stdout);
		}
		RT_CHECK(sampler_generate(&r->sp, &r->x, &r->w, r->rank, stdout, e));
		paused += MPI_Wtime() - t0;
		lp->t_all += MPI_Wtime() - t0;
	}
	if (k == r->start || (k + 1) % lp->log_every == 0 || last || stop || ev.have) {
		double n = (double)lp->since_log, dt = (done - lp->t_log) / n;
		if (r->rank == 0) {
			char extra[160] = "";
			if (r->o.verbose)
				snprintf(extra, sizeof extra,
					 " | comm %.2f ms issued, %.2f ms blocked | host %.1f us/step",
					 (c->stats.issue_s - lp->at_log.issue_s) * 1e3 / n,
					 (c->stats.blocked_s - lp->at_log.blocked_s) * 1e3 / n,
					 lp->host_s * 1e6 / n);
			/* elapsed at `done` too: on a synchronous backend step k + 1
			 * has already run by now, and is no part of step k's time */
			MetricsAmp ma = {s->opt.loss_scale != DP_LS_NONE, amp.scale, amp.skipped};
			metrics_log(m, k + 1, loss, s->metrics.grad_norm >= 0 ? gn : NAN, lr, dt * 1e3,
				    &ma, &ev, extra, done);
		}
		lp->t_log = done;
		lp->since_log = 0;
		lp->host_s = 0;
		lp->at_log = c->stats;
	}
	/* from step k's end on: its log line's time ends at `done` */
	lp->t_log += paused;
	lp->t_report += paused;
	if (final && r->save_dir &&
	    ((lp->save_every && (k + 1) % lp->save_every == 0) || last || stop)) {
		double t0 = MPI_Wtime();
		RT_CHECK(save_state(r, k + 1, loss));
		lp->t_log += MPI_Wtime() - t0; /* nor is saving */
		lp->t_report += MPI_Wtime() - t0;
		lp->t_all += MPI_Wtime() - t0;
	}
	if (stop) {
		char cmd[8192];
		if (r->rank == 0) {
			printf("interrupted at step %llu by %s; ", (unsigned long long)k + 1,
			       sig_name(r->w.sig));
			if (!r->save_dir)
				printf("no checkpoint was written (no --save-dir or save_every)\n");
			else if (cmd_resume(r->o.argc, r->o.argv, r->world, r->save_dir, cmd, sizeof cmd))
				printf("resume with --resume %s\n", r->save_dir);
			else
				printf("resume with: %s\n", cmd);
			fflush(stdout);
		}
		return 128 + r->w.sig;
	}
	return 0;
}

/* The training loop: 0 done, -1 error, 128 + N stopped by signal N.
 * Step k is launched, step k+1's batches are staged (and on a GPU copied)
 * while it runs, then step k-1 is reported from the metrics it left behind:
 * on a GPU the host never waits for the step it just launched, so the
 * device always has the next step queued. A step after which something
 * must see the parameters (eval, a checkpoint, the last step, a signal
 * seen at the previous step's sync point) is reported at once, with
 * nothing in flight behind it. */
static int train(Run *r)
{
	DpStep *s = &r->step;
	RtErr *e = &r->e;
	Exec *x = &r->x;
	Comm *c = r->comm;
	Metrics *m = &r->m;
	Loop lp = {.steps = m->steps};
	lp.eval_every = s->cfg.eval_every;
	lp.log_every = s->cfg.log_every ? s->cfg.log_every : 1;
	lp.save_every = s->cfg.save_every;
	lp.sample_every = s->cfg.sample_every;
	lp.t_log = lp.t_report = lp.t_all = MPI_Wtime();
	c->stats = (CommStats){0};
	lp.at_log = c->stats;
	metrics_start(m, lp.t_log);

	if (r->start >= lp.steps && r->resume_dir && r->rank == 0)
		printf("nothing to do: the checkpoint is at step %llu of %llu\n",
		       (unsigned long long)r->start, (unsigned long long)lp.steps);
	int64_t pending = -1; /* launched, not reported yet */
	for (uint64_t k = r->start; k < lp.steps; k++) {
		double h0 = MPI_Wtime();
		/* --trace-steps: marks only inside the window (the step runs within the
		 * launch: --trace wants a backend that works inline) */
		if (r->o.trace_to)
			x->trace = k + 1 >= r->o.trace_from && k + 1 <= r->o.trace_to ? r->trace : NULL;
		int rc = exec_step_launch(x, k, e);
		if (r->o.trace_to)
			x->trace = NULL;
		RT_CHECK(rc);
		lp.done[k & 1] = MPI_Wtime();
		if (k + 1 < lp.steps)
			RT_CHECK(exec_prefetch(x, k + 1, e)); /* overlaps the running steps on a GPU */
		lp.host_s += MPI_Wtime() - h0;
		if (pending >= 0)
			RT_CHECK(report_step(r, &lp, (uint64_t)pending, 0));
		pending = (int64_t)k;
		int now = k + 1 == lp.steps || r->w.sig != 0 ||
			  (r->eval && lp.eval_every && (k + 1) % lp.eval_every == 0) ||
			  (r->sampling && (k + 1) % lp.sample_every == 0) ||
			  (r->save_dir && lp.save_every && (k + 1) % lp.save_every == 0);
		if (now) {
			int rc = report_step(r, &lp, k, 1);
			if (rc != 0)
				return rc;
			pending = -1;
		}
	}
	RT_CHECK(exec_step_wait(x, e));
	double total = MPI_Wtime() - lp.t_all;
	if (lp.ran > 0 && r->rank == 0 && !r->o.quiet) {
		double n = (double)lp.ran;
		printf("comm: %.3f ms issued, %.3f ms blocked per step (of %.3f ms/step; %.1f "
		       "collectives, %.2f MiB per rank per step)\n",
		       c->stats.issue_s * 1e3 / n, c->stats.blocked_s * 1e3 / n, total * 1e3 / n,
		       (double)c->stats.ncoll / n, (double)c->stats.bytes / n / (1 << 20));
		fflush(stdout);
	}
	if (lp.ran == 0 && r->eval) { /* --steps 0 (or nothing left to resume): evaluate what is there */
		EvalResult ev;
		RT_CHECK(evaluate(r, &ev));
		if (r->rank == 0 && ev.have)
			printf("eval step %llu | test loss %.4f | test accuracy %.4f (%.0f/%.0f)\n",
			       (unsigned long long)r->start, ev.loss, ev.accuracy, ev.correct, ev.counted);
	}
	int rc = r->rank == 0 ? metrics_close(m, e) : 0;
	return world_sync(&r->w, rc, 0, e);
}

static void run_free(Run *r)
{
	RtErr ignore = {.rank = -1};
	metrics_close(&r->m, &ignore);
	ckpt_free(r->ck);
	free(r->save_dir);
	free(r->resume_dir);
	free(r->o.argv);
	r->o.argv = NULL;
	free(r->saved_path);
	trace_free(r->trace);
	r->trace = r->x.trace = NULL;
	data_free(r->train);
	data_free(r->eval);
	sampler_free(&r->sp);
	if (r->have_exec)
		exec_free(&r->x);
	if (r->dl)
		dlclose(r->dl);
	if (r->comm)
		r->comm->ops->free(r->comm);
	if (r->have_node)
		MPI_Comm_free(&r->node);
	if (r->have_step)
		dpstep_free(&r->step);
}

/* The step file, read by every rank, and the world size against its mesh. */
static int load_step(Run *r)
{
	char err[1024];
	int rc = 0;
	if (dpstep_read_file(r->o.step_path, &r->step, err, sizeof err) == 0) {
		r->have_step = 1;
		for (int i = 0; i < DP_NSETTINGS; i++) /* dpexec's flags win */
			if (r->o.given[i])
				dp_field_seti(dp_setting_field(&r->step, i), dp_settings[i].ctype,
					      r->o.value[i]);
	} else {
		rc = RT_FAIL(&r->e, "%s", err);
	}
	RT_CHECK(world_sync(&r->w, rc, 0, &r->e));
	uint64_t want = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		want *= r->step.cfg.mesh[a];
	if (want != (uint64_t)r->world) {
		const uint32_t *m = r->step.cfg.mesh;
		char axes[128];
		int n = m[DP_AXIS_PP] > 1 ? snprintf(axes, sizeof axes, "pp=%u ", m[DP_AXIS_PP]) : 0;
		n += snprintf(axes + n, sizeof axes - (size_t)n, "dp_replicate=%u dp_shard=%u",
			      m[DP_AXIS_REPLICATE], m[DP_AXIS_SHARD]);
		if (m[DP_AXIS_CP] > 1)
			n += snprintf(axes + n, sizeof axes - (size_t)n, " cp=%u", m[DP_AXIS_CP]);
		if (m[DP_AXIS_TP] > 1)
			snprintf(axes + n, sizeof axes - (size_t)n, " tp=%u", m[DP_AXIS_TP]);
		rc = RT_FAIL(&r->e,
			     "%s was compiled for a mesh of %llu rank%s (%s) but this run has %d; "
			     "recompile with dpc --world-size %d or run mpirun -np %llu",
			     r->o.step_path, (unsigned long long)want, want == 1 ? "" : "s", axes, r->world,
			     r->world, (unsigned long long)want);
	}
	return world_sync(&r->w, rc, 0, &r->e);
}

/* --device: this rank's compute backend in r->ops. cuda: the CUDA backend
 * or an error naming the cause. auto: the CUDA backend only when every rank
 * can use one (NCCL and MPI collectives do not mix); otherwise the CPU, and
 * notice says why, unless no rank has a CUDA driver at all (a machine
 * without CUDA running on its CPU is not news; --verbose says it); but a
 * GPU the backend cannot use (a driver older than its CUDA runtime) is an
 * error for auto too. A collective: every rank calls it. */
static int choose_device(Run *r, char *notice, size_t nlen, RtErr *e)
{
	const char *dev = r->o.device;
	const BackendOps *cuda = NULL;
	char why[512] = "";
	r->ops = backend_cpu();
	notice[0] = '\0';
	if (!strcmp(dev, "cpu"))
		return 0;
	int driver = 1;
	int gpu = strcmp(dev, "auto") || backend_gpu_present(why, sizeof why, &driver), probe = 0;
	gpu = gpu && backend_load_cuda(&cuda, &r->dl, why, sizeof why) == 0 &&
	      (probe = cuda->probe(why, sizeof why)) > 0;
	if (probe < 0) /* a GPU this build cannot use (an old driver): never a silent CPU run */
		return RT_FAIL(e, "--device %s: %s", dev, why);
	if (!strcmp(dev, "cuda")) {
		if (!gpu)
			return RT_FAIL(e, "--device cuda: %s", why);
		r->ops = cuda;
		return 0;
	}
	int v[2] = {gpu, -driver}, all[2] = {0, 0}; /* every rank a GPU; any rank a driver */
	MPI_Allreduce(v, all, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (all[0]) {
		r->ops = cuda;
		return 0;
	}
	if (gpu)
		snprintf(why, sizeof why, "another rank has none");
	if (r->dl)
		dlclose(r->dl);
	r->dl = NULL;
	if (all[1] < 0 || r->o.verbose)
		snprintf(notice, nlen, "no usable GPU (%s); running on the CPU", why);
	return 0;
}

/* --sample or the model's sample_every: the sampler, its prompt checked,
 * before any work. */
static int prepare_sampling(Run *r)
{
	Opts *o = &r->o;
	if (!o->sample.prompt && !r->step.cfg.sample_every)
		return 0;
	if (o->sample.prompt && !o->sample_only && !r->step.cfg.sample_every)
		return RT_FAIL(&r->e, "--sample samples the weights of --init-from or --resume and "
			       "exits; to sample a run as it trains, give --sample-every N");
	if (!o->have_seed)
		o->sample.seed = r->step.cfg.seed;
	RT_CHECK(sampler_init(&r->sp, &r->step, &o->sample, &r->e));
	r->sampling = !o->sample_only;
	return 0;
}

/* The trained run and what follows it, with --trace around them. */
static int train_and_export(Run *r)
{
	int device = !(r->ops->flags & BACKEND_INLINE);
	if (r->o.trace && device && !r->ops->time_mark)
		return RT_FAIL(&r->e, "--trace: the %s backend has no device timing: use --device cpu",
			       r->ops->name);
	if (r->o.trace && device && r->rank == 0 && !r->o.quiet)
		printf("trace: device times from the %s backend's timing marks; steps run eagerly "
		       "(--no-graph) and one run at a time\n", r->ops->name);
	if (r->o.trace && trace_open(&r->trace, r->o.trace, r->rank, device, &r->e))
		return -1;
	r->x.trace = r->o.trace_to ? NULL : r->trace; /* --trace-steps: set per step */
	int rc = train(r);
	if (rc != 0)
		return rc;
	rc = r->o.save_full ? save_full(r) : 0;
	if (rc == 0 && r->trace)
		rc = trace_close(r->trace, &r->x, &r->e);
	return rc;
}

static int run(Run *r)
{
	RT_CHECK(load_step(r));
	r->e.rank = r->rank;
	RT_CHECK(world_sync(&r->w, prepare_sampling(r), 0, &r->e));
	char notice[640];
	int dev = choose_device(r, notice, sizeof notice, &r->e);
	RT_CHECK(world_sync(&r->w, dev, 0, &r->e));
	if (r->rank == 0 && !r->o.quiet && notice[0])
		printf("dpexec: %s\n", notice);
	RT_CHECK(setup(r));
	if (r->w.sig) { /* a signal during set-up: nothing trained, nothing to save */
		if (r->rank == 0)
			printf("interrupted by %s before the first step; nothing was saved\n",
			       sig_name(r->w.sig));
		return 128 + r->w.sig;
	}
	if (r->o.calibrate) {
		int c = calibrate_run(&r->x, r->o.calibrate, r->o.step_path, r->rank, r->world, &r->e);
		return world_sync(&r->w, c, 0, &r->e);
	}
	if (r->o.check_grads) {
		int g = gradcheck_run(&r->x, &r->e);
		RT_CHECK(world_sync(&r->w, g < 0 ? -1 : 0, 0, &r->e));
		return g;
	}
	if (r->o.sample_only) { /* the text is the output: unstamped, after the lines before it */
		fflush(stdout);
		int rc = sampler_generate(&r->sp, &r->x, &r->w, r->rank, r->text, &r->e);
		return world_sync(&r->w, rc, 0, &r->e);
	}
	int rc = train_and_export(r);
	if (rc > 0)
		return rc; /* stopped by a signal */
	return world_sync(&r->w, rc, 0, &r->e);
}

/* End the job with status: print the error once, and with several ranks
 * end them all quietly. Returns the exit status (a single rank) or does
 * not return. */
static int finish(Run *r, int rc)
{
	World *w = &r->w;
	if (rc < 0 && !w->failed && r->world > 1) {
		if (r->e.lost) { /* a rank did not answer: no sync can succeed */
			w->failed = w->broken = 1;
			w->printer = r->rank;
		} else { /* an error between sync points: the others may be in a collective */
			double grace = r->o.timeout > 0 && r->o.timeout < DPEXEC_GRACE_S
					       ? r->o.timeout : DPEXEC_GRACE_S;
			world_sync_within(w, rc, 0, grace, &r->e);
		}
	}
	int errored = rc < 0 || w->failed;
	int status = !errored ? rc : r->e.lost ? DPEXEC_EXIT_LOST : 1;
	/* a rank that cannot reach the others and was signalled is being ended by
	 * the launcher because another rank ended the job: that rank has spoken */
	int ended = w->broken && sig_pending();
	if (errored && !ended && (r->world == 1 || w->printer == r->rank || w->broken))
		rt_err_print("dpexec", &r->e, r->o.verbose);
	fflush(stdout);
	fflush(stderr);
	if (r->world > 1 && status != 0) {
		if (r->have_exec)
			exec_abort(&r->x); /* e.g. NCCL: stop before MPI kills the ranks */
		/* one rank ends the job: quietly (OMPI_MCA_orte_execute_quiet, set in main) and
		 * with the status as mpirun's exit code; the others wait to be ended */
		int ender = w->broken ? r->rank : w->failed ? w->printer : 0;
		if (ender == r->rank)
			MPI_Abort(MPI_COMM_WORLD, status);
		for (int i = 0; i < 600; i++)
			usleep(100000);
	}
	run_free(r);
	MPI_Finalize();
	return status;
}

/* launched: a launcher started this process (Open MPI's mpirun or its
 * daemons set OMPI_COMM_WORLD_SIZE; srun sets PMIX_RANK or PMI_RANK), so it
 * is one rank of a job and not MPI's singleton start */
static int launched(void)
{
	return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

int main(int argc, char **argv)
{
	static Run run_state; /* zeroed; one per process, not shared state */
	Run *r = &run_state;
	rt_blas_one_thread(argv); /* may execute dpexec again, once */
	int pr = parse_opts(argc, argv, &r->o);
	if (pr)
		return pr > 0 ? 0 : 2;
	r->text = stdout;
	if (r->o.timestamps) { /* from here on every line starts with its time */
		FILE *out = stamp_stream(STDOUT_FILENO), *err = stamp_stream(STDERR_FILENO);
		if (!out || !err) {
			fprintf(stderr, "dpexec: error: timestamps (--no-timestamps turns them off): %s\n",
				strerror(errno));
			return 1;
		}
		stdout = out;
		stderr = err;
	}
	backend_process_init(); /* OpenBLAS's kernels, for whichever backend runs */
	/* MPI_Abort without Open MPI's help text (the user's setting wins) */
	setenv("OMPI_MCA_orte_execute_quiet", "1", 0);
	/* dpexec started alone (one rank, no mpirun) spawns no processes, so it
	 * needs no Open MPI daemon: without this its MPI_Init forks and waits
	 * for one, half the CPU of a small 1-rank run (130 -> 60 ms for
	 * tests/faults/tiny.dp). Under a launcher the setting is never read; a
	 * user's value wins.
	 * An isolated singleton is always job [0,1], so every one on the host
	 * shares the session directory $TMPDIR/ompi.HOST.UID/jf.0/1, which each
	 * creates at MPI_Init and removes at exit: two started together fail
	 * MPI_Init ("mkdir ... jf.0/1: File exists"; 13 of 1,200 starts, six at
	 * a time, measured with Open MPI 4.1.4). It needs no session directory
	 * (shared memory lives in /dev/shm), so it makes none. That setting is
	 * read under a launcher too, where the ranks need theirs: only alone. */
	if (!launched()) {
		setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
		setenv("OMPI_MCA_orte_create_session_dirs", "0", 0);
	}
	int provided;
	if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
		fprintf(stderr, "dpexec: error: MPI_Init_thread failed\n");
		return 1;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &r->world);
	int rc = world_init(&r->w, r->o.timeout, &r->e);
	r->e.rank = -1;
	sig_install();
	return finish(r, rc ? rc : run(r));
}
