/*
 * dpc.c - the dp compiler driver: FILE.dp -> step file (and IR dumps, stats).
 *
 * Front end (lower_compile), then the pass pipeline (passes/pipeline.c) with the
 * verifier after every pass, then the outputs the options ask for. With
 * --from-ir the input is IR text instead (ir_read; errors at its
 * file:line:col), verified, then the passes --passes names (QBE's and
 * LLVM's one-pass tests: IR in, passes, IR out). Exit
 * status: 0 success; 1 user error (bad option, bad model, unwritable output)
 * or out of memory (ir/diag.c's die), reported as messages; 2 internal
 * error (the verifier rejected a pass's
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

#include "cliopt.h"
#include "frontend.h"
#include "outfile.h"
#include "passes.h" /* the Makefile gives compiler/ no -Ipasses */
#include "plan.h"


static void usage(FILE *out)
{
	fprintf(out,
		"usage: dpc FILE.dp [options]\n"
		"       dpc --from-ir FILE.ir [--passes PASS[,PASS...]|all] [options]\n"
		"\n"
		"Compiles a dp model to a step file that `dpexec` runs on every rank.\n"
		"\n"
		"      --from-ir FILE.ir  read IR text (a dump, or written by hand) instead\n"
		"                      of a model, run the passes --passes names on it with\n"
		"                      the verifier after each, and print the IR after the last\n"
		"                      to stdout; with -o, write the step file instead (the\n"
		"                      passes must then reach the end of the pipeline)\n"
		"      --passes LIST   with --from-ir: the passes to run, comma-separated, in\n"
		"                      pipeline order, each after the one the IR was printed\n"
		"                      after (its first line, \"; dp IR after PASS\"); \"all\"\n"
		"                      (the default): every pass after that one\n"
		"  -o FILE             write the step file to FILE (atomically; through a\n"
		"                      symbolic link; in place into a device or FIFO). Without -o the step file\n"
		"                      goes to BASENAME.bin in the current directory (models/mlp.dp\n"
		"                      -> ./mlp.bin), unless --emit=ir|stats|schedule, --stats,\n"
		"                      --dump-ir or --dump-after is given: those look at a model,\n"
		"                      and write a step file only with -o\n"
		"      --world-size N  number of ranks, for `mesh auto`\n"
		"      --tp N, --cp N, --dp-replicate N, --pp N\n"
		"                      the axes `mesh auto` fixes first (default 1 each);\n"
		"                      dp_shard takes the rest of the world size\n"
		"  -D NAME=VALUE       set the config constant NAME to VALUE (an integer or a\n"
		"                      number) instead of its expression in the config section;\n"
		"                      repeatable (the last one for a NAME wins). A NAME the\n"
		"                      config section does not define is an error\n"
		"      --set SECTION.NAME=VALUE\n"
		"                      set a setting whatever the file says, checked as the file's\n"
		"                      value would be: train.strategy=full_shard, eval.every=0,\n"
		"                      train.optimizer=sgd(lr=0.1), an argument of the optimizer\n"
		"                      or the schedule: train.optimizer.beta2=0.95 (or train.beta2:\n"
		"                      one spec has it); repeatable, the last one for a setting\n"
		"                      wins. VALUE is a DSL value; config constants work\n"
		"      --print-settings  print every setting as docs/DSL.md's table (markdown)\n"
		"      --emit=KIND     step: write the step file (default);\n"
		"                      ir: print the final IR to stdout;\n"
		"                      stats: print the --stats table to stdout;\n"
		"                      schedule: print the pipeline schedule dpc forecasts\n"
		"                      (pp > 1) as a timeline per stage\n"
		"      --dump-ir=DIR   write the IR after the front end and after every pass to\n"
		"                      DIR/00-frontend.ir, DIR/01-tp.ir, ... (DIR is created)\n"
		"      --dump-after=PASS  print the IR after PASS (or 'frontend') to stdout\n"
		"      --print-pipeline   list the passes in order, with what holds after each\n"
		"      --stats         print communication, flops and memory per rank to\n"
		"                      stdout (and with -o, write the step file too)\n"
		"      --device=h100   with --stats: the step's roofline time per kernel class\n"
		"                      on that GPU from its published peaks, the MFU, and the\n"
		"                      largest micro-batch whose memory plan fits its memory\n"
		"                      (80 GiB; --device-memory's budget when given)\n"
		"      --simulate[=MACHINE]\n"
		"                      replay the step one rank (each pp stage) runs on a\n"
		"                      machine model and print its predicted time, compute,\n"
		"                      communication, exposed communication, streams' use,\n"
		"                      the pipeline's bubble, peak memory and\n"
		"                      MFU (passes/simulate.c). MACHINE: a preset (h100-nvlink,\n"
		"                      the default; a100-nvlink) or a JSON machine file\n"
		"                      (util/machine.h)\n"
		"      --simulate-trace=FILE\n"
		"                      with --simulate: write the predicted timeline as a\n"
		"                      Perfetto trace, in dpexec --trace's format\n"
		"      --plan          with --world-size N: compile and simulate every mesh\n"
		"                      (pp, tp, cp, dp_replicate, dp_shard), pipeline schedule,\n"
		"                      strategy, gradient checkpointing and bucket_mb or\n"
		"                      prefetch, on --simulate's machine, less those the memory\n"
		"                      bound or dominance rule out; print the 10 fastest that\n"
		"                      fit --device-memory (compiler/plan.c); -o writes the\n"
		"                      fastest's step file\n"
		"      --jobs=N        with --plan (and strategy auto): compile the candidates\n"
		"                      on N worker processes (default: the online CPUs); the\n"
		"                      table, winner and step file are the same for any N\n"
		"      --plan-classes=N|all\n"
		"                      with --plan (and strategy auto): compile at most N\n"
		"                      classes' representatives (the fewest micro-batches\n"
		"                      first; default 128) and search\n"
		"                      no member of the other classes: the output says so and\n"
		"                      whether an unsearched plan could beat the winner; all:\n"
		"                      exhaustive\n"
		"      --device-memory=SIZE\n"
		"                      the device memory of one rank (80GiB, 512MiB, bytes): a\n"
		"                      plan whose device arena is larger is an error naming its\n"
		"                      largest items (nothing written); --stats says whether it\n"
		"                      fits; with --plan it bounds the search\n"
		"      --no-verify     do not run the IR verifier after each pass\n"
		"  -v, --time          print the compile time to stderr\n"
		"  -h, --help          this help\n"
		"      --version       version and step-file format version\n"
		"\n"
		"settings with a flag of their own (as --set train.NAME=VALUE):\n");
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->flag_prog != DP_FLAG_DPC)
			continue;
		char head[160];
		int n = snprintf(head, sizeof head, "      --%s=", st->flag);
		for (int k = 0; st->type == DP_ST_WORDS && st->words[k] && n < 120; k++)
			n += snprintf(head + n, sizeof head - (size_t)n, "%s%s", k ? "|" : "", st->words[k]);
		if (st->type != DP_ST_WORDS)
			snprintf(head + n, sizeof head - (size_t)n, "VALUE");
		dp_help_line(out, head, st->help, 22);
	}
	fprintf(out,
		"\n"
		"Exit status: 0 ok (warnings about settings that have no effect are not\n"
		"errors), 1 user error or out of memory (nothing written), 2 the IR verifier\n"
		"found a compiler bug; other internal errors print a message and abort.\n");
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

/* The pipeline's names, after "frontend" when with_frontend. */
static void pass_names(FILE *out, int with_frontend)
{
	if (with_frontend)
		fprintf(out, "frontend, ");
	for (int i = 0; i < npipeline; i++)
		fprintf(out, "%s%s", i ? ", " : "", pipeline[i].name);
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

/* ---- IR input (--from-ir) ---- */

/* The whole of path as a C string; NULL with errno set (a directory reads
 * as EISDIR). *len is its length (a NUL byte inside shows as strlen(text)
 * < len). */
static char *read_text(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *text = NULL;
	size_t n = 0;
	FILE *mem = open_memstream(&text, &n);
	if (!mem)
		die("out of memory");
	char chunk[1 << 16];
	size_t got;
	while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
		if (fwrite(chunk, 1, got, mem) != got)
			die("out of memory");
	int err = ferror(f) ? (errno ? errno : EIO) : 0;
	fclose(f);
	if (fclose(mem) != 0)
		die("out of memory");
	if (err) {
		free(text);
		errno = err;
		return NULL;
	}
	*len = n;
	return text;
}

/* The passes --passes names, as pipeline indices into out (npipeline
 * slots), in pipeline order, each after `at` (the pass the IR was printed
 * after; -1 the front end, -2 unknown); the count, or -1 after a message. */
static int select_passes(const char *list, int at, const char *at_name, const char *file, int *out)
{
	int n = 0;
	if (strcmp(list, "all") == 0) {
		if (at == -2) {
			fprintf(stderr, "dpc: %s does not say which pass it was printed after (a first "
					"line \"; dp IR after PASS\"), so --passes all has nowhere to start: "
					"name the passes\n", file);
			return -1;
		}
		for (int i = at + 1; i < npipeline; i++)
			out[n++] = i;
		return n;
	}
	const char *s = list;
	for (;;) {
		const char *e = strchr(s, ',');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		char name[64];
		int i = -1;
		if (len > 0 && len < sizeof name) {
			memcpy(name, s, len);
			name[len] = '\0';
			i = pipeline_find(name);
		}
		if (len == 0) {
			fprintf(stderr, "dpc: --passes: an empty name in '%s'\n", list);
			return -1;
		}
		if (i < 0) {
			fprintf(stderr, "dpc: --passes: unknown pass '%.*s'; passes: ", (int)len, s);
			pass_names(stderr, 0);
			return -1;
		}
		if (n > 0 && i <= out[n - 1]) {
			fprintf(stderr, "dpc: --passes: %s comes before %s in the pipeline (dpc "
					"--print-pipeline)\n", name, pipeline[out[n - 1]].name);
			return -1;
		}
		if (i == at) {
			fprintf(stderr, "dpc: --passes: %s is the IR after %s already\n", file, name);
			return -1;
		}
		if (i < at) {
			fprintf(stderr, "dpc: --passes: %s is the IR after %s, and %s comes before it in "
					"the pipeline (dpc --print-pipeline)\n", file, at_name, name);
			return -1;
		}
		out[n++] = i;
		if (!e)
			return n;
		s = e + 1;
	}
}

/* Reads the IR at path, verifies it, runs the passes `list` names, and
 * leaves the graph in *gp and the name of the pass it is now after in
 * *last. The text stays in *src for the diagnostics of later passes.
 * Returns as pipeline_run: 0, -1 after user errors, -2 when a pass's
 * output failed verification. */
static int run_from_ir(const char *path, const char *list, int write_step, const PipelineOpts *po,
		       Diag *d, char **src, Graph **gp, const char **last)
{
	size_t len = 0;
	errno = 0;
	char *text = read_text(path, &len);
	if (!text) {
		error_at(d, (Loc){path, 0, 0}, "cannot open '%s': %s", path, strerror(errno));
		return -1;
	}
	*src = text;
	d->src = text;
	if (strlen(text) < len) { /* the reader stops at a NUL: say where it is */
		int line = 1, col = 1;
		for (const char *p = text; *p; p++, col++)
			if (*p == '\n')
				line++, col = 0;
		error_at(d, (Loc){path, line, col}, "unexpected byte 0x00");
		return -1;
	}
	/* where the IR stands: the pass its first line names */
	char after[64];
	int at = -2;
	int col = ir_read_after(text, after, sizeof after);
	if (col > 0) {
		at = strcmp(after, "frontend") == 0 ? -1 : pipeline_find(after);
		if (at == -1 && strcmp(after, "frontend") != 0) {
			error_at(d, (Loc){path, 1, col}, "unknown pass '%s' (frontend, or one of dpc "
				 "--print-pipeline)", after);
			return -1;
		}
	}
	int which[64];
	if (npipeline > (int)(sizeof which / sizeof which[0]))
		die("dpc: more passes than --passes can hold");
	int n = select_passes(list, at, col > 0 ? after : NULL, path, which);
	if (n < 0)
		return -1;
	const char *stop = n > 0 ? pipeline[which[n - 1]].name : col > 0 ? after : NULL;
	int reaches_end = n > 0 ? which[n - 1] == npipeline - 1 : at == npipeline - 1;
	if (write_step && !reaches_end) {
		fprintf(stderr, "dpc: a step file needs the whole pipeline, up to %s; the passes "
				"stop after %s\n", pipeline[npipeline - 1].name,
			stop ? stop : "a pass the IR does not name");
		return -1;
	}
	Graph *g = ir_read(text, path, d);
	if (!g)
		return -1;
	*gp = g;
	*last = stop ? ir_strdup(g, stop) : NULL;
	return pipeline_run_some(g, d, po, which, n);
}

/* "80GiB", "512MiB", "40GB", "1e9": bytes, or -1. */
static int64_t parse_size(const char *s)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	static const struct {
		const char *unit;
		double scale;
	} units[] = {{"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
		     {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
	if (errno || end == s || !(v > 0))
		return -1;
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
		if (!strcmp(end, units[i].unit) && v * units[i].scale < 9e18)
			return (int64_t)(v * units[i].scale);
	return -1;
}

/* The front end's options of a plan the search chose: fo's own sets (the
 * user's, then the choice's) in *sets, which the caller frees. */
static void choice_options(FeOptions *fo, const PlanChoice *c, FeSet **sets)
{
	*sets = malloc(sizeof **sets * (size_t)(fo->nsets + c->nsets));
	if (!*sets)
		die("out of memory");
	if (fo->nsets)
		memcpy(*sets, fo->sets, sizeof **sets * (size_t)fo->nsets);
	memcpy(*sets + fo->nsets, c->sets, sizeof **sets * (size_t)c->nsets);
	fo->sets = *sets;
	fo->nsets += c->nsets;
	if (c->tp) { /* the search chose the mesh: `mesh auto` takes it */
		fo->tp = c->tp;
		fo->cp = c->cp;
		fo->dp_replicate = c->dp_replicate;
		fo->pp = c->pp;
	}
}

/* --plan: the search, then the winner's step file to output (or none). */
static int run_plan(const char *path, int world, const FeDefine *defines, int ndefines,
		    const FeSet *sets, int nsets, const Machine *mc, int64_t device_memory,
		    int jobs, int max_classes, const char *output)
{
	PlanOpts po = {.path = path, .world = world, .defines = defines, .ndefines = ndefines,
		       .sets = sets, .nsets = nsets, .machine = mc, .device_memory = device_memory,
		       .jobs = jobs, .max_classes = max_classes};
	/* a mesh the file writes out (not `mesh auto`) is searched alone, as
	 * under `strategy auto`: the file's front end once, for its mesh (its
	 * errors are the search's, printed there) */
	uint32_t mesh[DP_MAX_AXES];
	FeOptions f0 = {.world_size = world, .defines = defines, .ndefines = ndefines, .sets = sets,
			.nsets = nsets};
	Diag d0;
	FILE *quiet = fopen("/dev/null", "w");
	diag_init(&d0, quiet, path, NULL);
	char *src0 = NULL;
	Graph *g0 = lower_compile_opts(path, &f0, &d0, &src0);
	if (g0 && !d0.nerrors && !g0->mesh_auto) {
		memcpy(mesh, g0->cfg.mesh, sizeof mesh);
		po.mesh = mesh;
	}
	ir_free(g0);
	free(src0);
	if (quiet)
		fclose(quiet);
	PlanChoice c;
	if (plan_run(&po, stdout, &c) < 0)
		return 1;
	if (!output)
		return 0;
	FeOptions fo = {.world_size = world, .defines = defines, .ndefines = ndefines, .sets = sets,
			.nsets = nsets};
	FeSet *all;
	choice_options(&fo, &c, &all);
	Diag d;
	diag_init(&d, stderr, path, NULL);
	char *src = NULL, err[512];
	Graph *g = lower_compile_opts(path, &fo, &d, &src);
	PipelineOpts pl = {.verify = 1};
	int rc = 0;
	if (!g || d.nerrors || pipeline_run(g, &d, &pl) < 0) {
		fprintf(stderr, "dpc: --plan: the winner does not compile again\n");
		rc = 1;
	} else if (ir_write_step(g, output, err, sizeof err) < 0) {
		fprintf(stderr, "dpc: %s\n", err);
		rc = 1;
	} else {
		printf("wrote %s\n", output);
	}
	ir_free(g);
	free(src);
	free(all);
	return rc;
}

/* `strategy auto` in *g (the file's graph): the plan search on its mesh
 * (every mesh of the world under `mesh auto` without axis flags), the
 * choice printed to stderr, and *g compiled again as the choice (fo then
 * holds the choice's options: *own_sets its sets for the caller to free,
 * pointing into *c).
 * 0, or -1 (no plan fits, or a front-end error through d). */
static int strategy_auto(Graph **g, const char *path, FeOptions *fo, PlanChoice *c,
			 FeSet **own_sets, const char *simulate, const Machine *mc,
			 int64_t device_memory, int jobs, int max_classes, Diag *d, char **src)
{
	Machine preset = {0};
	char err[512];
	if (!simulate && machine_load(&preset, "h100-nvlink", err, sizeof err) < 0)
		die("strategy auto: %s", err);
	int world = 1;
	for (int a = DP_AXIS_PP; a <= DP_AXIS_TP; a++)
		world *= (int)(*g)->cfg.mesh[a];
	PlanOpts po = {.path = path, .world = world, .defines = fo->defines, .ndefines = fo->ndefines,
		       .sets = fo->sets, .nsets = fo->nsets, .machine = simulate ? mc : &preset,
		       .device_memory = device_memory, .brief = 1, .jobs = jobs,
		       .max_classes = max_classes};
	/* the mesh is searched under `mesh auto` without dpc's axis flags */
	if (!(*g)->mesh_auto || fo->tp || fo->cp || fo->dp_replicate || fo->pp)
		po.mesh = (*g)->cfg.mesh;
	int rc = plan_run(&po, stderr, c);
	machine_free(&preset);
	if (rc < 0)
		return -1;
	ir_free(*g);
	free(*src);
	choice_options(fo, c, own_sets);
	*g = lower_compile_opts(path, fo, d, src);
	if (!*g || d->nerrors)
		return -1;
	d->src = *src;
	return 0;
}

/* --simulate: the prediction on stdout, the timeline to trace_path (or
 * NULL). 0, or -1 after a message. */
static int simulate_graph(const Graph *g, const Machine *mc, const char *trace_path)
{
	SimReport rep;
	double t0 = now_ms();
	if (sim_graph(g, mc, &rep, trace_path != NULL) < 0) {
		fprintf(stderr, "dpc: --simulate: the pipeline stages' transfers did not pair up (a bug: "
				"please report it with the .dp file)\n");
		sim_report_free(&rep);
		return -1;
	}
	double took = now_ms() - t0;
	sim_print(stdout, g, mc, &rep);
	printf("%-16s %12.3f ms   (to simulate, after the compile)\n", "simulated in", took);
	int rc = 0;
	if (trace_path) {
		char *buf = NULL, err[1024];
		size_t len = 0;
		FILE *mem = open_memstream(&buf, &len);
		if (!mem)
			die("out of memory");
		sim_trace(mem, g, &rep);
		if (fclose(mem) != 0)
			die("out of memory");
		OutFile f;
		if (out_open(&f, trace_path, err, sizeof err) < 0 || (out_write(&f, buf, len),
								  out_commit(&f, err, sizeof err)) < 0) {
			fprintf(stderr, "dpc: --simulate-trace: %s\n", err);
			rc = -1;
		}
		free(buf);
	}
	sim_report_free(&rep);
	return rc;
}

enum {
	OPT_WORLD = 256,
	OPT_TP,
	OPT_CP,
	OPT_DP_REPLICATE,
	OPT_PP,
	OPT_EMIT,
	OPT_DUMP_IR,
	OPT_DUMP_AFTER,
	OPT_PRINT_PIPELINE,
	OPT_STATS,
	OPT_DEVICE,
	OPT_NO_VERIFY,
	OPT_VERSION,
	OPT_FROM_IR,
	OPT_PASSES,
	OPT_SET,
	OPT_PRINT_SETTINGS,
	OPT_SIMULATE,
	OPT_SIMULATE_TRACE,
	OPT_PLAN,
	OPT_DEVICE_MEMORY,
	OPT_JOBS,
	OPT_PLAN_CLASSES,
	OPT_SETTING, /* + a setting's id: its dpc flag */
};

enum { EMIT_DEFAULT, EMIT_STEP, EMIT_IR, EMIT_STATS, EMIT_SCHEDULE };

/* "train.precision": a settings-backed flag's key (malloc'd). */
static char *ir_fmt_key(const char *section, const char *name)
{
	size_t n = strlen(section) + strlen(name) + 2;
	char *k = malloc(n);
	if (!k)
		die("out of memory");
	snprintf(k, n, "%s.%s", section, name);
	return k;
}

/* --set and the settings-backed flags, in command-line order (file scope:
 * reachable until exit, whichever return ends main) */
static FeSet *sets;
static int nsets;

/* sets[n] = {key (malloc'd, owned), value, "FLAG ARG"} */
static FeSet *add_set(FeSet *sets, int n, char *key, const char *value, const char *flag,
		      const char *arg)
{
	FeSet *ns = realloc(sets, sizeof(FeSet) * (size_t)(n + 1));
	size_t wl = strlen(flag) + strlen(arg) + 2;
	char *what = malloc(wl);
	if (!ns || !what || !key)
		die("out of memory");
	snprintf(what, wl, "%s %s", flag, arg);
	ns[n] = (FeSet){key, value, what};
	return ns;
}

static void free_sets(FeSet *sets, int n)
{
	for (int i = 0; i < n; i++) {
		free((char *)sets[i].key);
		free((char *)sets[i].what);
	}
	free(sets);
}

int main(int argc, char **argv)
{
	static const struct option fixed[] = {
		{"output", required_argument, NULL, 'o'},
		{"world-size", required_argument, NULL, OPT_WORLD},
		{"tp", required_argument, NULL, OPT_TP},
		{"cp", required_argument, NULL, OPT_CP},
		{"dp-replicate", required_argument, NULL, OPT_DP_REPLICATE},
		{"pp", required_argument, NULL, OPT_PP},
		{"emit", required_argument, NULL, OPT_EMIT},
		{"dump-ir", required_argument, NULL, OPT_DUMP_IR},
		{"dump-after", required_argument, NULL, OPT_DUMP_AFTER},
		{"print-pipeline", no_argument, NULL, OPT_PRINT_PIPELINE},
		{"stats", no_argument, NULL, OPT_STATS},
		{"device", required_argument, NULL, OPT_DEVICE},
		{"no-verify", no_argument, NULL, OPT_NO_VERIFY},
		{"time", no_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, OPT_VERSION},
		{"from-ir", required_argument, NULL, OPT_FROM_IR},
		{"passes", required_argument, NULL, OPT_PASSES},
		{"set", required_argument, NULL, OPT_SET},
		{"print-settings", no_argument, NULL, OPT_PRINT_SETTINGS},
		{"simulate", optional_argument, NULL, OPT_SIMULATE},
		{"simulate-trace", required_argument, NULL, OPT_SIMULATE_TRACE},
		{"plan", no_argument, NULL, OPT_PLAN},
		{"device-memory", required_argument, NULL, OPT_DEVICE_MEMORY},
		{"jobs", required_argument, NULL, OPT_JOBS},
		{"plan-classes", required_argument, NULL, OPT_PLAN_CLASSES},
	};
	/* the fixed options, then a flag per setting that has a dpc flag */
	struct option longopts[sizeof fixed / sizeof fixed[0] + DP_NSETTINGS + 1];
	dp_setting_options(longopts, fixed, (int)(sizeof fixed / sizeof fixed[0]), DP_FLAG_DPC,
			   OPT_SETTING);
	const char *output = NULL, *dump_dir = NULL, *dump_after = NULL, *device = NULL;
	FeDefine *defines = NULL;
	int ndefines = 0;
	int world = 0, emit = EMIT_DEFAULT, stats = 0, verify = 1, timing = 0;
	int axis[4] = {0, 0, 0, 0}; /* --tp, --cp, --dp-replicate, --pp */
	const char *from_ir = NULL, *passes = NULL;
	const char *simulate = NULL, *sim_trace_path = NULL; /* --simulate's machine */
	int plan = 0, jobs = 0; /* jobs: --jobs, 0: the online CPUs */
	int max_classes = 0;    /* --plan-classes, 0: PLAN_CLASSES, -1: all */
	int64_t device_memory = 0; /* --device-memory, bytes; 0: none */
	static const char shortopts[] = "o:vhD:";
	int c;
	opterr = 0; /* cli_bad_option says what is wrong, in our words */
	while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		switch (c) {
		case 'D': {
			FeDefine *nd = realloc(defines, sizeof(FeDefine) * (size_t)(ndefines + 1));
			if (!nd)
				die("out of memory");
			defines = nd;
			if (const_parse_define(optarg, &defines[ndefines]) < 0) {
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
		case OPT_DP_REPLICATE:
		case OPT_PP: {
			static const char *const names[] = {"world-size", "tp", "cp", "dp-replicate",
							    "pp"};
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
			else if (strcmp(optarg, "schedule") == 0)
				emit = EMIT_SCHEDULE;
			else {
				fprintf(stderr, "dpc: unknown --emit kind '%s' (step, ir, stats, schedule)\n",
					optarg);
				return 1;
			}
			break;
		case OPT_SET: {
			const char *eq = strchr(optarg, '=');
			if (!eq || eq == optarg || !eq[1]) {
				fprintf(stderr, "dpc: --set wants SECTION.NAME=VALUE (train.lr=3e-4), not "
						"'%s'\n", optarg);
				free(defines);
				return 1;
			}
			sets = add_set(sets, nsets++, strndup(optarg, (size_t)(eq - optarg)), eq + 1,
				       "--set", optarg);
			break;
		}
		case OPT_PRINT_SETTINGS:
			settings_print(stdout);
			return 0;
		case OPT_DUMP_IR:
			dump_dir = optarg;
			break;
		case OPT_DUMP_AFTER:
			if (strcmp(optarg, "frontend") != 0 && pipeline_find(optarg) < 0) {
				fprintf(stderr, "dpc: unknown pass '%s'; passes: ", optarg);
				pass_names(stderr, 1);
				return 1;
			}
			dump_after = optarg;
			break;
		case OPT_FROM_IR:
			from_ir = optarg;
			break;
		case OPT_PASSES:
			passes = optarg;
			break;
		case OPT_PRINT_PIPELINE:
			print_pipeline(stdout);
			return 0;
		case OPT_STATS:
			stats = 1;
			break;
		case OPT_DEVICE:
			if (!roofline_known(optarg)) {
				fprintf(stderr, "dpc: unknown --device '%s' (%s)\n", optarg, roofline_devices());
				return 1;
			}
			device = optarg;
			break;
		case OPT_SIMULATE:
			simulate = optarg ? optarg : "h100-nvlink";
			break;
		case OPT_SIMULATE_TRACE:
			sim_trace_path = optarg;
			break;
		case OPT_PLAN:
			plan = 1;
			break;
		case OPT_DEVICE_MEMORY:
			if ((device_memory = parse_size(optarg)) <= 0) {
				fprintf(stderr, "dpc: --device-memory wants a size (80GiB, 512MiB, 40GB, bytes), "
						"not '%s'\n", optarg);
				return 1;
			}
			break;
		case OPT_JOBS: {
			char *end;
			long j = strtol(optarg, &end, 10);
			if (end == optarg || *end || j < 1 || j > 1024) {
				fprintf(stderr, "dpc: --jobs wants a number of worker processes from 1 to "
						"1024, not '%s'\n", optarg);
				return 1;
			}
			jobs = (int)j;
			break;
		}
		case OPT_PLAN_CLASSES: {
			char *end = optarg;
			long k = strcmp(optarg, "all") ? strtol(optarg, &end, 10) : -1;
			if (strcmp(optarg, "all") && (end == optarg || *end || k < 1 || k > 1000000)) {
				fprintf(stderr, "dpc: --plan-classes wants a number of classes from 1 to "
						"1000000, or all, not '%s'\n", optarg);
				return 1;
			}
			max_classes = (int)k;
			break;
		}
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
			printf("dpc %s (step file format %u)\n", DP_VERSION, DP_STEP_VERSION);
			return 0;
		default:
			if (c >= OPT_SETTING && c < OPT_SETTING + DP_NSETTINGS) {
				const DpSetting *st = &dp_settings[c - OPT_SETTING];
				char flag[96];
				snprintf(flag, sizeof flag, "--%s", st->flag);
				sets = add_set(sets, nsets++,
					       ir_fmt_key(st->section == DP_SEC_EVAL ? "eval" : "train",
							  st->name),
					       optarg, flag, optarg);
				break;
			}
			cli_bad_option(stderr, "dpc", c, argc, argv, shortopts, longopts);
			free(defines);
			return 1;
		}
	}
	if (from_ir && optind < argc) {
		fprintf(stderr, "dpc: --from-ir reads %s; no other input file\n", from_ir);
		return 1;
	}
	if (!from_ir && optind >= argc) {
		fprintf(stderr, "dpc: no input file\n");
		usage(stderr);
		return 1;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "dpc: one input file, not %d\n", argc - optind);
		return 1;
	}
	if (from_ir && (world || axis[0] || axis[1] || axis[2] || axis[3] || ndefines || nsets)) {
		fprintf(stderr, "dpc: --world-size, --tp, --cp, --dp-replicate, --pp, -D, --set and the "
				"settings' flags shape a model; IR (--from-ir) has them settled\n");
		free(defines);
		return 1;
	}
	if (passes && !from_ir) {
		fprintf(stderr, "dpc: --passes runs passes on IR text: give it --from-ir FILE.ir\n");
		return 1;
	}
	const char *path = from_ir ? from_ir : argv[optind];
	if (dump_dir && out_mkdirs(dump_dir) < 0) {
		fprintf(stderr, "dpc: cannot create %s: %s\n", dump_dir, strerror(errno));
		return 1;
	}

	/* Looking at a model (printing, dumping, stats) writes a step file only
	 * when -o asks for one, never a ./BASENAME.bin on the side; so does IR
	 * input, which prints its IR otherwise. */
	if (plan && (from_ir || !world || axis[0] || axis[1] || axis[2] || axis[3] || sim_trace_path ||
		     emit != EMIT_DEFAULT || stats)) {
		fprintf(stderr, "dpc: --plan searches the mesh of a model for --world-size N: give it a "
				".dp file and --world-size, without --tp, --cp, --dp-replicate, --pp, --emit, "
				"--stats or --simulate-trace\n");
		free(defines);
		return 1;
	}
	if (plan && !simulate)
		simulate = "h100-nvlink";
	if (sim_trace_path && !simulate) {
		fprintf(stderr, "dpc: --simulate-trace writes what --simulate predicts: give --simulate too\n");
		free(defines);
		return 1;
	}
	Machine machine = {0};
	if (simulate) { /* a bad machine file costs nothing */
		char err[512];
		if (machine_load(&machine, simulate, err, sizeof err) < 0) {
			fprintf(stderr, "dpc: --simulate: %s\n", err);
			free(defines);
			return 1;
		}
	}
	if (sim_trace_path) {
		char err[1024] = "";
		if (out_check(sim_trace_path, 0, err, sizeof err) < 0 ||
		    check_output_not_input(path, sim_trace_path)) {
			if (err[0])
				fprintf(stderr, "dpc: --simulate-trace: %s\n", err);
			machine_free(&machine);
			free(defines);
			return 1;
		}
	}
	int write_step = output || emit == EMIT_STEP ||
			 (emit == EMIT_DEFAULT && !dump_after && !dump_dir && !stats && !from_ir &&
			  !simulate);
	if (plan) { /* the search compiles; -o writes the winner */
		int prc = run_plan(path, world, defines, ndefines, sets, nsets, &machine, device_memory,
				   jobs, max_classes, output);
		machine_free(&machine);
		free(defines);
		free_sets(sets, nsets);
		return prc;
	}
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
	Graph *g = NULL;
	FeSet *auto_sets = NULL; /* strategy auto: the front end's sets, the choice's among them */
	PlanChoice auto_choice;
	int status = 0;
	PipelineOpts po = {
		.dump_dir = dump_dir,
		.dump_after = dump_after,
		.dump_out = stdout,
		.verify = verify,
	};
	const char *last = NULL; /* the pass the graph is after (IR input) */
	FeOptions fo = {0};      /* the front end's options (a .dp input) */
	int rc;
	if (from_ir) {
		rc = run_from_ir(path, passes ? passes : "all", write_step, &po, &diag, &src, &g, &last);
	} else {
		fo = (FeOptions){.world_size = world, .tp = axis[0], .cp = axis[1],
				 .dp_replicate = axis[2], .pp = axis[3], .defines = defines,
				 .ndefines = ndefines, .sets = sets, .nsets = nsets};
		g = lower_compile_opts(path, &fo, &diag, &src);
		if (!g || diag.nerrors) {
			status = 1;
			goto out;
		}
		diag.src = src;
		if (g->strategy_auto && strategy_auto(&g, path, &fo, &auto_choice, &auto_sets, simulate,
						      &machine, device_memory, jobs, max_classes, &diag,
						      &src) < 0) {
			status = 1;
			goto out;
		}
		rc = pipeline_run(g, &diag, &po);
	}
	if (rc < 0) {
		status = rc == -2 ? 2 : 1;
		goto out;
	}
	if (emit == EMIT_IR || (from_ir && !write_step && emit == EMIT_DEFAULT))
		ir_print_after(stdout, g, last);
	if (emit == EMIT_STATS || stats)
		stats_print(stdout, g, g->peak_bytes > 0 ? device_memory : 0);
	if ((emit == EMIT_STATS || stats) && device) {
		fprintf(stdout, "\n");
		roofline_print(stdout, g, device);
		if (!from_ir && g->peak_bytes > 0) { /* compiler/fit.c */
			char what[96], b[64];
			int64_t cap = device_memory ? device_memory : roofline_memory(device);
			snprintf(what, sizeof what, "in %s (%s)", stats_human_bytes(b, sizeof b, (double)cap),
				 device_memory ? "--device-memory" : device);
			fit_micro_batch(stdout, path, &fo, g, cap, what);
		}
	}
	if (emit == EMIT_SCHEDULE)
		stages_print_schedule(stdout, g, 96);
	if (device_memory && g->peak_bytes <= 0) {
		fprintf(stderr, "dpc: --device-memory checks the memory plan: run the passes through "
				"memplan\n");
		status = 1;
		goto out;
	}
	if (device_memory && stats_check_budget(&diag, g, device_memory) < 0) {
		status = 1;
		goto out;
	}
	if (simulate && simulate_graph(g, &machine, sim_trace_path) < 0) {
		status = 1;
		goto out;
	}
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
	machine_free(&machine);
	ir_free(g);
	free(auto_sets);
	free(src);
	free(default_out);
	free(defines);
	free_sets(sets, nsets);
	return status;
}
