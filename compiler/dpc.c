/*
 * dpc.c - the dp compiler driver: FILE.dp -> step file (and IR dumps, stats).
 *
 * Front end (fe_compile), then the pass pipeline (passes/pipeline.c) with the
 * verifier after every pass, then the outputs the options ask for. Exit
 * status: 0 success; 1 user error (bad option, bad model, unwritable output)
 * or out of memory (ir/diag.c's die), reported as messages; 2 internal error (the verifier rejected a pass's
 * output). On any error no step file is written: the output path is
 * checked before compiling (util/outfile.h: its directory exists and is
 * writable; a device or FIFO is written through, a link's target written;
 * it is not the input) and the writer is atomic and runs last.
 */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "frontend.h"
#include "outfile.h"
#include "passes.h" /* the Makefile gives compiler/ no -Ipasses */

#define DPC_VERSION "0.1.0"

static void usage(FILE *out)
{
	fprintf(out,
		"usage: dpc FILE.dp [options]\n"
		"\n"
		"Compiles a dp model to a step file that `dpexec` runs on every rank.\n"
		"\n"
		"  -o FILE             write the step file to FILE (atomically; through a\n"
		"                      symbolic link; in place into a device or FIFO). Without -o the step file\n"
		"                      goes to BASENAME.bin in the current directory (models/mlp.dp\n"
		"                      -> ./mlp.bin), unless --emit=ir|stats or --dump-after is given:\n"
		"                      those print instead, and write a step file only with -o\n"
		"      --world-size N  number of ranks, for `mesh auto`\n"
		"      --tp N, --cp N, --dp-replicate N\n"
		"                      the axes `mesh auto` fixes first (default 1 each);\n"
		"                      dp_shard takes the rest of the world size\n"
		"  -D NAME=VALUE       set the config constant NAME to VALUE (an integer or a\n"
		"                      number) instead of its expression in the config section;\n"
		"                      repeatable (the last one for a NAME wins). A NAME the\n"
		"                      config section does not define is an error\n"
		"      --precision=P   f32, tf32 or bf16: train's precision setting, whatever the file\n"
		"                      says (param_dtype and buffer_dtype; docs/DSL.md)\n"
		"      --emit=KIND     step: write the step file (default);\n"
		"                      ir: print the final IR to stdout;\n"
		"                      stats: print the --stats table to stdout\n"
		"      --dump-ir=DIR   write the IR after the front end and after every pass to\n"
		"                      DIR/00-frontend.ir, DIR/01-tp.ir, ... (DIR is created)\n"
		"      --dump-after=PASS  print the IR after PASS (or 'frontend') to stdout\n"
		"      --print-pipeline   list the passes in order, with what holds after each\n"
		"      --stats         also print communication, flops and memory per rank\n"
		"                      to stdout\n"
		"      --no-verify     do not run the IR verifier after each pass\n"
		"  -v, --time          print the compile time to stderr\n"
		"  -h, --help          this help\n"
		"      --version       version and step-file format version\n"
		"\n"
		"Exit status: 0 ok, 1 user error or out of memory (nothing written), 2 the IR\n"
		"verifier found a compiler bug; other internal errors print a message and abort.\n");
}

static void print_pipeline(FILE *out)
{
	int w = 0;
	for (int i = 0; i < npipeline; i++)
		if ((int)strlen(pipeline[i].name) > w)
			w = (int)strlen(pipeline[i].name);
	for (int i = 0; i < npipeline; i++)
		fprintf(out, "%2d  %-*s  %s\n", i + 1, w, pipeline[i].name, pipeline[i].doc);
}

static void pass_names(FILE *out)
{
	fprintf(out, "frontend");
	for (int i = 0; i < npipeline; i++)
		fprintf(out, ", %s", pipeline[i].name);
	fprintf(out, "\n");
}

/* BASENAME.bin in the current directory. */
static char *default_output(const char *path)
{
	char *copy = strdup(path);
	if (!copy)
		return NULL;
	const char *base = basename(copy);
	size_t n = strlen(base);
	if (n > 3 && strcmp(base + n - 3, ".dp") == 0)
		n -= 3;
	char *out = malloc(n + 5);
	if (out) {
		memcpy(out, base, n);
		memcpy(out + n, ".bin", 5);
	}
	free(copy);
	return out;
}

/* The step file must not be the model it is compiled from (util/outfile.h:
 * the same file through any link or spelling): 0, or -1 after a message. */
static int check_output_not_input(const char *input, const char *output)
{
	char err[1024];
	const OutPath p[] = {{input, "the input", 0}, {output, "-o", 1}};
	if (out_check_distinct(p, 2, err, sizeof err) == 0)
		return 0;
	fprintf(stderr, "dpc: %s\n", err);
	return -1;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

enum {
	OPT_WORLD = 256,
	OPT_TP,
	OPT_CP,
	OPT_DP_REPLICATE,
	OPT_EMIT,
	OPT_DUMP_IR,
	OPT_DUMP_AFTER,
	OPT_PRINT_PIPELINE,
	OPT_STATS,
	OPT_NO_VERIFY,
	OPT_VERSION,
	OPT_PRECISION,
};

enum { EMIT_DEFAULT, EMIT_STEP, EMIT_IR, EMIT_STATS };

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"output", required_argument, NULL, 'o'},
		{"world-size", required_argument, NULL, OPT_WORLD},
		{"tp", required_argument, NULL, OPT_TP},
		{"cp", required_argument, NULL, OPT_CP},
		{"dp-replicate", required_argument, NULL, OPT_DP_REPLICATE},
		{"emit", required_argument, NULL, OPT_EMIT},
		{"dump-ir", required_argument, NULL, OPT_DUMP_IR},
		{"dump-after", required_argument, NULL, OPT_DUMP_AFTER},
		{"print-pipeline", no_argument, NULL, OPT_PRINT_PIPELINE},
		{"stats", no_argument, NULL, OPT_STATS},
		{"no-verify", no_argument, NULL, OPT_NO_VERIFY},
		{"time", no_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, OPT_VERSION},
		{"precision", required_argument, NULL, OPT_PRECISION},
		{NULL, 0, NULL, 0},
	};
	const char *output = NULL, *dump_dir = NULL, *dump_after = NULL;
	FeDefine *defines = NULL;
	int ndefines = 0;
	int world = 0, emit = EMIT_DEFAULT, stats = 0, verify = 1, timing = 0;
	int axis[3] = {0, 0, 0}; /* --tp, --cp, --dp-replicate */
	const char *precision = NULL;
	int c;
	while ((c = getopt_long(argc, argv, "o:vhD:", longopts, NULL)) != -1) {
		switch (c) {
		case 'D': {
			FeDefine *nd = realloc(defines, sizeof(FeDefine) * (size_t)(ndefines + 1));
			if (!nd)
				die("out of memory");
			defines = nd;
			if (fe_parse_define(optarg, &defines[ndefines]) < 0) {
				fprintf(stderr, "dpc: -D wants NAME=VALUE with a number VALUE, not '%s'\n",
					optarg);
				free(defines);
				return 1;
			}
			ndefines++;
			break;
		}
		case 'o':
			output = optarg;
			break;
		case OPT_WORLD:
		case OPT_TP:
		case OPT_CP:
		case OPT_DP_REPLICATE: {
			static const char *const names[] = {"world-size", "tp", "cp", "dp-replicate"};
			char *end;
			errno = 0;
			long n = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || n < 1 || n > 1 << 20) {
				fprintf(stderr, "dpc: --%s wants a positive integer, not '%s'\n",
					names[c - OPT_WORLD], optarg);
				return 1;
			}
			if (c == OPT_WORLD)
				world = (int)n;
			else
				axis[c - OPT_TP] = (int)n;
			break;
		}
		case OPT_EMIT:
			if (strcmp(optarg, "step") == 0)
				emit = EMIT_STEP;
			else if (strcmp(optarg, "ir") == 0)
				emit = EMIT_IR;
			else if (strcmp(optarg, "stats") == 0)
				emit = EMIT_STATS;
			else {
				fprintf(stderr, "dpc: unknown --emit kind '%s' (step, ir, stats)\n", optarg);
				return 1;
			}
			break;
		case OPT_PRECISION:
			if (strcmp(optarg, "f32") == 0 || strcmp(optarg, "fp32") == 0 ||
			    strcmp(optarg, "tf32") == 0 || strcmp(optarg, "bf16") == 0)
				precision = optarg;
			else {
				fprintf(stderr, "dpc: --precision wants f32, tf32 or bf16, not '%s'\n",
					optarg);
				return 1;
			}
			break;
		case OPT_DUMP_IR:
			dump_dir = optarg;
			break;
		case OPT_DUMP_AFTER:
			if (strcmp(optarg, "frontend") != 0 && pipeline_find(optarg) < 0) {
				fprintf(stderr, "dpc: unknown pass '%s'; passes: ", optarg);
				pass_names(stderr);
				return 1;
			}
			dump_after = optarg;
			break;
		case OPT_PRINT_PIPELINE:
			print_pipeline(stdout);
			return 0;
		case OPT_STATS:
			stats = 1;
			break;
		case OPT_NO_VERIFY:
			verify = 0;
			break;
		case 'v':
			timing = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case OPT_VERSION:
			printf("dpc %s (step file format %u)\n", DPC_VERSION, DP_STEP_VERSION);
			return 0;
		default:
			fprintf(stderr, "Try 'dpc --help'.\n");
			return 1;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "dpc: no input file\n");
		usage(stderr);
		return 1;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "dpc: one input file, not %d\n", argc - optind);
		return 1;
	}
	const char *path = argv[optind];
	if (dump_dir && out_mkdirs(dump_dir) < 0) {
		fprintf(stderr, "dpc: cannot create %s: %s\n", dump_dir, strerror(errno));
		return 1;
	}

	/* Printing modes write a step file only when -o asks for one. */
	int write_step = output || emit == EMIT_STEP || (emit == EMIT_DEFAULT && !dump_after);
	char *default_out = NULL;
	if (write_step && !output) {
		default_out = default_output(path);
		if (!default_out)
			die("out of memory");
		output = default_out;
	}

	/* a step file that cannot be written is found before the work, not after */
	if (write_step) {
		char err[1024];
		int bad = out_check(output, 0, err, sizeof err) < 0;
		if (bad)
			fprintf(stderr, "dpc: %s\n", err);
		if (bad || check_output_not_input(path, output)) {
			free(default_out);
			free(defines);
			return 1;
		}
	}
	double t0 = now_ms();
	Diag diag;
	diag_init(&diag, stderr, path, NULL);
	char *src = NULL;
	FeOptions fo = {.world_size = world, .tp = axis[0], .cp = axis[1], .dp_replicate = axis[2],
			.defines = defines, .ndefines = ndefines, .precision = precision};
	Graph *g = fe_compile_opts(path, &fo, &diag, &src);
	int status = 0;
	if (!g || diag.nerrors) {
		status = 1;
		goto out;
	}
	diag.src = src;
	PipelineOpts po = {
		.dump_dir = dump_dir,
		.dump_after = dump_after,
		.dump_out = stdout,
		.verify = verify,
	};
	int rc = pipeline_run(g, &diag, &po);
	if (rc < 0) {
		status = rc == -2 ? 2 : 1;
		goto out;
	}
	if (emit == EMIT_IR)
		ir_print(stdout, g);
	if (emit == EMIT_STATS || stats)
		stats_print(stdout, g);
	if (write_step) {
		char err[512];
		if (ir_write_step(g, output, err, sizeof err) < 0) {
			fprintf(stderr, "dpc: %s\n", err);
			status = 1;
			goto out;
		}
	}
	if (fflush(stdout) != 0) {
		fprintf(stderr, "dpc: cannot write to stdout: %s\n", strerror(errno));
		status = 1;
		goto out;
	}
	if (timing)
		fprintf(stderr, "dpc: compiled %s in %.1f ms\n", path, now_ms() - t0);
out:
	ir_free(g);
	free(src);
	free(default_out);
	free(defines);
	return status;
}
