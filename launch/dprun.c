/*
 * dprun.c - dp's launcher (torchrun's place): compiles a model for the world
 * size, starts the ranks through the MPI launcher that is there (mpirun; srun
 * under Slurm), forwards Ctrl-C and SIGTERM, exits with the job's status,
 * and restarts a job that lost a rank at the world size that is left, from
 * its last checkpoint (docs/LAUNCH.md).
 *
 *   dprun -n 4 [--hosts h1:2,h2:2 | --hostfile F] model.dp -- [dpexec options]
 *
 * Why C and not a shell script: the signal forwarding (a Ctrl-C must reach
 * the ranks as SIGUSR1 through mpirun, whose process group is its own so
 * the terminal's SIGINT does not make it SIGTERM and exit 1), the restart
 * loop's bookkeeping and the resume command's quoting (util/cmdline.h) are
 * each a screen of C and would be three fragile idioms of sh.
 *
 * The job. dpc (beside dprun) writes the step file into a scratch directory
 * that is removed at exit; a .bin argument is used as it is. The launch line
 * is `mpirun -np N [--oversubscribe on one host] [--allow-run-as-root as
 * root] [--host L | --hostfile F] -x ... dpexec STEP.bin [dprun's words]
 * [the user's words]`, or `srun -n N dpexec ...` when SLURM_JOB_ID is set.
 * Every line of the job starts with the UTC time it was printed, as
 * dprun's own do: dpexec stamps its lines by default (a user's
 * --no-timestamps turns that off), and dprun passes the ranks' output
 * through untouched, so no line gets two.
 * The launcher runs in a process group of its own with stdin from
 * /dev/null; dprun turns SIGINT into SIGUSR1 and SIGTERM into SIGUSR2 for
 * it, which mpirun and srun forward to every rank and dpexec takes as SIGINT
 * and SIGTERM (runtime/signals.c): the ranks finish the step, save, and the
 * job exits 130 or 143.
 *
 * The resume command rank 0 prints (runtime/command.c) is dprun's: dprun
 * passes its own words in DPRUN_COMMAND and, in DPRUN_ARGS_FROM, where the
 * user's dpexec words start in dpexec's argv (the words before are dprun's:
 * the step file, the save directory, --resume of a restart).
 *
 * Restarts (--max-restarts K). A job that ended because a rank died (killed
 * by a signal: mpirun's status 128+N other than SIGINT/SIGTERM) or stalled
 * (dpexec's status 75, DPEXEC_EXIT_LOST: a wait for another rank passed
 * --timeout) is started again, from --save-dir's latest checkpoint, at the
 * largest world size from --ranks-after-failure (else the same) down to
 * --min-ranks that dpc compiles (the model's global batch and mesh decide;
 * the global batch stays, so the mathematics do not change). Any other
 * status (1: a user error such as bad data; 2: bad options) ends dprun with
 * it. Giving up (K restarts made, fewer than --min-ranks usable, no size
 * compiles) ends dprun with the last job's status and a line saying why.
 *
 * Hosts. With --hosts or --hostfile (mpirun), a restart first probes every
 * host still in the list: `mpirun --host H:1 -np 1 true`, all at once,
 * bounded by --probe-timeout. Through mpirun itself, not ping or a TCP
 * connect: a host answers when the launcher can start a process there (its
 * agent, ssh or another, its daemon's call back), which is what the next
 * job needs. A host that does not answer is left out of this and later
 * restarts (said); the restart's ranks are at most the slots of those that
 * answer (a hostfile of their lines, in the scratch directory, replaces
 * --hostfile). Under srun Slurm's allocation decides the nodes: no probe.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cliopt.h"
#include "cmdline.h"
#include "stamp.h"

#define DPRUN_VERSION "0.1"
#define DPEXEC_EXIT_LOST 75 /* dpexec: a rank did not answer within --timeout */
#define MAX_WORDS 4096

typedef struct {
	int np;                 /* -n */
	const char *hosts;      /* --hosts h1:2,h2:2 */
	const char *hostfile;   /* --hostfile F */
	const char *launcher;   /* auto, mpirun, srun */
	double probe_timeout;   /* --probe-timeout SEC: a host that does not run a probe in time is gone */
	int max_restarts;       /* --max-restarts K */
	int min_ranks;          /* --min-ranks M */
	int ranks_after;        /* --ranks-after-failure R (0: the same) */
	const char *save_dir;   /* --save-dir DIR */
	const char *save_every; /* --save-every N (forwarded) */
	int dry_run;            /* print the launch line, run nothing */
	const char *model;      /* model.dp or step.bin */
	int nuser;              /* the user's dpexec words */
	char **user;
} Opts;

/* A host of --hosts or --hostfile. */
typedef struct {
	char name[256];
	int slots;              /* its slots (1 when not said, as mpirun --host H) */
	char line[512];         /* its --hostfile line, as written */
	int gone;               /* it did not answer a probe: left out of restarts */
} Host;

typedef struct {
	Opts o;
	Host *hosts;            /* the hosts (NULL: this machine, or Slurm's) */
	int nhosts;
	char hostarg[1 << 14];  /* the launch line's --host value, or its --hostfile */
	char bindir[PATH_MAX / 2]; /* where dprun is: dpc and dpexec beside it */
	char work[PATH_MAX / 2]; /* scratch directory: step files, the losses file */
	char losses[PATH_MAX];  /* the losses file rank 0 writes (the user's or ours) */
	char command[1 << 15];  /* dprun's own words, quoted: the resume command's start */
	int compiled_np;        /* the world size of work's step file (0: none) */
	char step[PATH_MAX];    /* the step file run */
	char dpexec[PATH_MAX];  /* bindir/dpexec */
	char np[16], from[16];  /* the launch line's -np, DPRUN_ARGS_FROM's value */
} Dprun;

/* ---- signals: recorded, forwarded to the launcher's process group ---- */

static volatile sig_atomic_t got_signal; /* SIGINT or SIGTERM seen (the last) */
static volatile sig_atomic_t job_pid;    /* the launcher, while it runs */

static void on_signal(int sig)
{
	got_signal = sig;
	if (job_pid > 0) /* mpirun and srun forward SIGUSR1/2 to every rank */
		kill(job_pid, sig == SIGINT ? SIGUSR1 : SIGUSR2);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char ts[STAMP_LEN];
	stamp_now(ts, sizeof ts);
	fprintf(stderr, "%s dprun: ", ts);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dprun -n N [options] MODEL.dp|STEP.bin [-- DPEXEC-OPTIONS]\n"
		"\n"
		"Compiles MODEL.dp for N ranks (dpc, beside dprun; a step file is run as it is),\n"
		"starts dpexec on every rank through mpirun (srun when SLURM_JOB_ID is set), and\n"
		"exits with the job's status. Ctrl-C (SIGINT) and SIGTERM reach every rank as\n"
		"SIGINT and SIGTERM (sent as SIGUSR1/SIGUSR2 through the launcher): the ranks\n"
		"finish the step, save when a save directory is set, and the job exits 130 or\n"
		"143. The resume command rank 0 prints is dprun's. docs/LAUNCH.md.\n"
		"\n"
		"  -n, --np N                ranks (the world size)\n"
		"  --hosts H1:S1,H2:S2,...   hosts and their slots (mpirun --host); without hosts\n"
		"                            or a hostfile: this machine, N processes whatever\n"
		"                            its cores (--oversubscribe)\n"
		"  --hostfile F              an Open MPI hostfile (mpirun --hostfile)\n"
		"  --probe-timeout SEC       after a failure, each host of --hosts or --hostfile\n"
		"                            must run a probe (mpirun --host H:1 true) within SEC\n"
		"                            seconds (default 10; a failed probe is tried again\n"
		"                            until then); the restart leaves out those that do not\n"
		"  --launcher auto|mpirun|srun\n"
		"                            auto (default): srun when SLURM_JOB_ID is set, else\n"
		"                            mpirun; as root, mpirun gets --allow-run-as-root\n"
		"  --save-dir DIR            dpexec's --save-dir; needed by --max-restarts\n"
		"  --save-every N            dpexec's --save-every\n"
		"  --max-restarts K          restart a job that lost a rank (a rank killed, or a\n"
		"                            wait past dpexec's --timeout: exit 75) up to K times\n"
		"                            from the latest checkpoint in --save-dir (default 0).\n"
		"                            An error of the run itself (bad data, bad options:\n"
		"                            exit 1, 2) is never restarted. Across hosts a\n"
		"                            failed job first probes them (--probe-timeout): one\n"
		"                            that does not answer is left out, and a job it ended\n"
		"                            is restarted on the others\n"
		"  --ranks-after-failure R   the ranks usable after a failure (default: as many\n"
		"                            as before); the restart runs at the largest world\n"
		"                            size from R down to --min-ranks that the model's mesh\n"
		"                            and global batch allow (dpc decides; the global\n"
		"                            batch stays, so the mathematics do not change)\n"
		"  --min-ranks M             give up when fewer than M ranks would remain\n"
		"                            (default 1)\n"
		"  --dry-run                 compile (to check the model), print the launch\n"
		"                            command and exit\n"
		"  --version                 the version\n"
		"  -h, --help                this text\n"
		"\n"
		"Exit status: the job's: 0 done; 1 an error of the run; 2 bad options; 75 a rank\n"
		"stuck or gone (--timeout); 128+N a rank killed by signal N, or 130/143 stopped\n"
		"by SIGINT/SIGTERM after a checkpoint. When dprun gives up restarting, the last\n"
		"job's status (and a line saying why). 2 for dprun's own bad options; 1 when\n"
		"the model does not compile.\n");
}

static int parse_int(const char *s, int lo, const char *opt, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > INT_MAX) {
		fprintf(stderr, "dprun: error: %s wants an integer >= %d, not '%s'\n", opt, lo, s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* 0: run; 1: exit 0 (help, version); -1: usage error (message printed). */
static int parse_opts(int argc, char **argv, Opts *o)
{
	enum { O_HOSTS = 256, O_HOSTFILE, O_PROBE_TIMEOUT, O_LAUNCHER, O_MAXR, O_MINR, O_AFTER, O_SAVEDIR,
	       O_SAVEEVERY, O_DRY, O_VERSION };
	static const struct option longopts[] = {
		{"np", required_argument, NULL, 'n'},
		{"hosts", required_argument, NULL, O_HOSTS},
		{"hostfile", required_argument, NULL, O_HOSTFILE},
		{"probe-timeout", required_argument, NULL, O_PROBE_TIMEOUT},
		{"launcher", required_argument, NULL, O_LAUNCHER},
		{"max-restarts", required_argument, NULL, O_MAXR},
		{"min-ranks", required_argument, NULL, O_MINR},
		{"ranks-after-failure", required_argument, NULL, O_AFTER},
		{"save-dir", required_argument, NULL, O_SAVEDIR},
		{"save-every", required_argument, NULL, O_SAVEEVERY},
		{"dry-run", no_argument, NULL, O_DRY},
		{"version", no_argument, NULL, O_VERSION},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	static const char shortopts[] = "+:n:h";
	*o = (Opts){.launcher = "auto", .min_ranks = 1, .probe_timeout = 10};
	int c, unused;
	opterr = 0;
	while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			if (parse_int(optarg, 1, "-n", &o->np) < 0)
				return -1;
			break;
		case O_HOSTS: o->hosts = optarg; break;
		case O_HOSTFILE: o->hostfile = optarg; break;
		case O_PROBE_TIMEOUT: {
			char *end;
			errno = 0;
			o->probe_timeout = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(o->probe_timeout > 0) ||
			    o->probe_timeout > 86400) {
				fprintf(stderr, "dprun: error: --probe-timeout wants seconds > 0, not '%s'\n",
					optarg);
				return -1;
			}
			break;
		}
		case O_LAUNCHER:
			if (strcmp(optarg, "auto") && strcmp(optarg, "mpirun") && strcmp(optarg, "srun")) {
				fprintf(stderr, "dprun: error: --launcher is auto, mpirun or srun, not '%s'\n",
					optarg);
				return -1;
			}
			o->launcher = optarg;
			break;
		case O_MAXR:
			if (parse_int(optarg, 0, "--max-restarts", &o->max_restarts) < 0)
				return -1;
			break;
		case O_MINR:
			if (parse_int(optarg, 1, "--min-ranks", &o->min_ranks) < 0)
				return -1;
			break;
		case O_AFTER:
			if (parse_int(optarg, 1, "--ranks-after-failure", &o->ranks_after) < 0)
				return -1;
			break;
		case O_SAVEDIR: o->save_dir = optarg; break;
		case O_SAVEEVERY:
			if (parse_int(optarg, 1, "--save-every", &unused) < 0)
				return -1;
			o->save_every = optarg;
			break;
		case O_DRY: o->dry_run = 1; break;
		case O_VERSION: printf("dprun %s\n", DPRUN_VERSION); return 1;
		case 'h': usage(stdout); return 1;
		default:
			cli_bad_option(stderr, "dprun", c, argc, argv, shortopts, longopts);
			return -1;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "dprun: error: no model (usage: dprun -n N MODEL.dp -- [dpexec options]; --help)\n");
		return -1;
	}
	o->model = argv[optind++];
	if (optind < argc && !strcmp(argv[optind], "--"))
		optind++;
	else if (optind < argc) {
		fprintf(stderr, "dprun: error: '%s' after the model: dpexec's options go after '--'\n",
			argv[optind]);
		return -1;
	}
	o->nuser = argc - optind;
	o->user = argv + optind;
	if (o->np == 0) {
		fprintf(stderr, "dprun: error: how many ranks? give -n N\n");
		return -1;
	}
	if (o->hosts && o->hostfile) {
		fprintf(stderr, "dprun: error: --hosts and --hostfile exclude each other\n");
		return -1;
	}
	if (o->max_restarts > 0 && !o->save_dir) {
		fprintf(stderr, "dprun: error: --max-restarts resumes from checkpoints: give --save-dir DIR "
				"(and --save-every N)\n");
		return -1;
	}
	if (o->min_ranks > o->np) {
		fprintf(stderr, "dprun: error: --min-ranks %d is more than -n %d\n", o->min_ranks, o->np);
		return -1;
	}
	return 0;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

/* Whether word is the long option --name (with or without =value). */
static int is_opt(const char *word, const char *name)
{
	size_t k = strlen(name);
	return !strncmp(word, "--", 2) && !strncmp(word + 2, name, k) &&
	       (word[2 + k] == '\0' || word[2 + k] == '=');
}

/* Run argv (NULL-terminated) to its end with stdout/stderr to out (NULL:
 * dprun's). Returns its status as a shell reports it, -1 if it could not start. */
static int run_quiet(char **argv, const char *out)
{
	pid_t p = fork();
	if (p < 0)
		return -1;
	if (p == 0) {
		if (out) {
			FILE *f = freopen(out, "w", stdout);
			if (!f || dup2(STDOUT_FILENO, STDERR_FILENO) < 0)
				_exit(127);
		}
		execv(argv[0], argv);
		fprintf(stderr, "dprun: error: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	int st;
	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The first line of a file with "error" in it (dpc's reason), into buf. */
static void first_error(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	snprintf(buf, len, "(no message)");
	while (f && fgets(line, sizeof line, f))
		if (strstr(line, "error")) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(buf, len, "%s", line);
			break;
		}
	if (f)
		fclose(f);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Compile the model for np ranks into work/step-NP.bin. 0; 1 when dpc
 * refused this world size (its first error in why); -1 when dpc did not run. */
static int compile(Dprun *d, int np, int quiet, char *why, size_t len)
{
	char dpc[PATH_MAX], out[PATH_MAX], log[PATH_MAX], ws[16];
	snprintf(dpc, sizeof dpc, "%s/dpc", d->bindir);
	snprintf(out, sizeof out, "%s/step-%d.bin", d->work, np);
	snprintf(log, sizeof log, "%s/dpc-%d.log", d->work, np);
	snprintf(ws, sizeof ws, "%d", np);
	char *argv[] = {dpc, (char *)d->o.model, "--world-size", ws, "-o", out, NULL};
	double t0 = now_s();
	int rc = run_quiet(argv, quiet ? log : NULL);
	if (rc < 0 || rc == 127) {
		say("error: cannot run %s", dpc);
		return -1;
	}
	if (rc != 0) {
		if (quiet)
			first_error(log, why, len);
		return 1;
	}
	if (!quiet || d->compiled_np)
		say("compiled %s for %d ranks in %.0f ms", d->o.model, np, (now_s() - t0) * 1e3);
	snprintf(d->step, sizeof d->step, "%s", out);
	d->compiled_np = np;
	return 0;
}

static int use_srun(const Opts *o)
{
	return !strcmp(o->launcher, "srun") || (!strcmp(o->launcher, "auto") && getenv("SLURM_JOB_ID"));
}

/* The launch line for np ranks; resume: add --resume SAVE_DIR. Words point
 * into the options, d, or string constants. Sets DPRUN_ARGS_FROM. */
static int launch_words(Dprun *d, int np, int resume, char **w)
{
	const Opts *o = &d->o;
	char *num = d->np;
	int n = 0;
	snprintf(d->dpexec, sizeof d->dpexec, "%s/dpexec", d->bindir);
	snprintf(d->np, sizeof d->np, "%d", np);
	if (use_srun(o)) {
		w[n++] = "srun";
		w[n++] = "-n";
		w[n++] = num;
	} else {
		w[n++] = "mpirun";
		if (geteuid() == 0)
			w[n++] = "--allow-run-as-root";
		if (d->nhosts) { /* the hosts that answer: as given until a probe finds one gone */
			w[n++] = o->hosts ? "--host" : "--hostfile";
			w[n++] = d->hostarg;
		} else {
			w[n++] = "--oversubscribe"; /* one host: -n processes, as asked */
		}
		w[n++] = "-np";
		w[n++] = num;
		/* rank 0 may start on another host: these reach it there */
		w[n++] = "-x";
		w[n++] = "DPRUN_COMMAND";
		w[n++] = "-x";
		w[n++] = "DPRUN_ARGS_FROM";
	}
	int exec_at = n;
	w[n++] = d->dpexec;
	w[n++] = d->step;
	if (o->save_dir) {
		w[n++] = "--save-dir";
		w[n++] = (char *)o->save_dir;
	}
	if (o->save_every) {
		w[n++] = "--save-every";
		w[n++] = (char *)o->save_every;
	}
	if (d->losses[0] && !strncmp(d->losses, d->work, strlen(d->work))) {
		w[n++] = "--losses";
		w[n++] = d->losses;
	}
	if (resume) {
		w[n++] = "--resume";
		w[n++] = (char *)o->save_dir;
	}
	snprintf(d->from, sizeof d->from, "%d", n - exec_at);
	setenv("DPRUN_ARGS_FROM", d->from, 1);
	for (int i = 0; i < o->nuser && n < MAX_WORDS - 1; i++) {
		const char *a = o->user[i];
		/* a restart resumes: the user's own start (fresh, overwrite, resume) is past */
		if (resume && (is_opt(a, "resume") || is_opt(a, "overwrite") || is_opt(a, "auto-resume"))) {
			if (is_opt(a, "resume") && !strchr(a, '='))
				i++;
			continue;
		}
		w[n++] = o->user[i];
	}
	w[n] = NULL;
	return n;
}

/* Start the launch line; wait for it, forwarding signals. Its status as a
 * shell reports it (128+N for a signal), -1 if it could not start. */
static int run_job(char **w)
{
	sigset_t block, old;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &old);
	pid_t p = fork();
	if (p < 0) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		say("error: fork: %s", strerror(errno));
		return -1;
	}
	if (p == 0) {
		/* a process group of its own: a terminal's Ctrl-C reaches dprun, not
		 * mpirun (which would SIGTERM the ranks and exit 1); so no terminal
		 * input for it either */
		setpgid(0, 0);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		sigprocmask(SIG_SETMASK, &old, NULL);
		int fd = open("/dev/null", 0);
		if (fd >= 0) {
			dup2(fd, STDIN_FILENO);
			close(fd);
		}
		execvp(w[0], w);
		fprintf(stderr, "dprun: error: cannot run %s: %s\n", w[0], strerror(errno));
		_exit(127);
	}
	setpgid(p, p);
	job_pid = p;
	if (got_signal) /* one that came while it started */
		kill(p, got_signal == SIGINT ? SIGUSR1 : SIGUSR2);
	sigprocmask(SIG_SETMASK, &old, NULL);
	int st;
	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR) {
			job_pid = 0;
			return -1;
		}
	job_pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The step of save_dir's latest checkpoint, -1 if none. */
static long latest_step(const char *dir)
{
	char path[PATH_MAX + 16], line[64];
	snprintf(path, sizeof path, "%s/latest", dir);
	FILE *f = fopen(path, "r");
	long s = -1;
	if (f && fgets(line, sizeof line, f) && !strncmp(line, "step-", 5))
		s = strtol(line + 5, NULL, 10);
	if (f)
		fclose(f);
	return s;
}

/* The last step number in the losses file (its last line's first field), -1. */
static long last_logged(const char *path)
{
	FILE *f = path[0] ? fopen(path, "r") : NULL;
	char line[256];
	long s = -1;
	while (f && fgets(line, sizeof line, f))
		if (line[0] != '#')
			s = strtol(line, NULL, 10);
	if (f)
		fclose(f);
	return s;
}

/* Why the job ended, when it can be restarted; NULL when it cannot. */
static const char *restartable(int status, char *buf, size_t len)
{
	if (status == DPEXEC_EXIT_LOST)
		return "a rank stalled or was lost (a wait passed dpexec's --timeout)";
	if (status > 128 && status != 128 + SIGINT && status != 128 + SIGTERM) {
		snprintf(buf, len, "a rank died (%s, the launcher's status %d)",
			 strsignal(status - 128), status);
		return buf;
	}
	return NULL;
}

/* ---- hosts: which of --hosts / --hostfile still answer ---- */

/* Add a host; -1 (said why) when out of memory or its fields too long. */
static int add_host(Dprun *d, const char *name, size_t nlen, int slots, const char *line)
{
	if (nlen == 0 || nlen >= sizeof d->hosts[0].name || strlen(line) >= sizeof d->hosts[0].line) {
		say("error: a host name or hostfile line that is empty or too long: '%s'", line);
		return -1;
	}
	Host *h = realloc(d->hosts, (size_t)(d->nhosts + 1) * sizeof *h);
	if (!h) {
		say("error: out of memory");
		return -1;
	}
	d->hosts = h;
	h += d->nhosts++;
	memset(h, 0, sizeof *h);
	memcpy(h->name, name, nlen);
	h->slots = slots;
	snprintf(h->line, sizeof h->line, "%s", line);
	return 0;
}

/* The hosts of --hosts H[:S],... or of --hostfile F (lines `H [slots=S]
 * ...`, # comments), in d->hosts; the launch line's value in d->hostarg. */
static int read_hosts(Dprun *d)
{
	const Opts *o = &d->o;
	if (o->hosts) {
		for (const char *p = o->hosts; *p;) {
			size_t k = strcspn(p, ","), nlen = strcspn(p, ":,");
			char item[512];
			snprintf(item, sizeof item, "%.*s", (int)k, p);
			int slots = 1;
			if (nlen < k && (sscanf(p + nlen + 1, "%d", &slots) != 1 || slots < 1)) {
				say("error: --hosts: '%s' is not HOST or HOST:SLOTS", item);
				return -1;
			}
			if (add_host(d, p, nlen, slots, item) < 0)
				return -1;
			p += k + (p[k] == ',');
		}
		snprintf(d->hostarg, sizeof d->hostarg, "%s", o->hosts);
	} else if (o->hostfile) {
		FILE *f = fopen(o->hostfile, "r");
		char line[512];
		if (!f) {
			say("error: --hostfile %s: %s", o->hostfile, strerror(errno));
			return -1;
		}
		while (fgets(line, sizeof line, f)) {
			line[strcspn(line, "#\n")] = '\0';
			const char *p = line + strspn(line, " \t"), *s = strstr(p, "slots=");
			size_t nlen = strcspn(p, " \t");
			if (nlen && add_host(d, p, nlen, s ? atoi(s + 6) > 0 ? atoi(s + 6) : 1 : 1, p) < 0) {
				fclose(f);
				return -1;
			}
		}
		fclose(f);
		if (!d->nhosts) {
			say("error: --hostfile %s names no host", o->hostfile);
			return -1;
		}
		snprintf(d->hostarg, sizeof d->hostarg, "%s", o->hostfile);
	}
	return 0;
}

/* Start `mpirun --host H:1 -np 1 true` for host h: the launcher's own way
 * to a host (ssh, or the agent the environment names), so a host answers
 * when a rank could start there. Its output goes to work/probe-I.log. */
static pid_t start_probe(Dprun *d, int i)
{
	char host[300], log[PATH_MAX];
	snprintf(host, sizeof host, "%s:1", d->hosts[i].name);
	snprintf(log, sizeof log, "%s/probe-%d.log", d->work, i);
	char *w[] = {"mpirun", "--host", host, "-np", "1", "true", NULL, NULL};
	if (geteuid() == 0) { /* "mpirun --allow-run-as-root --host ..." */
		memmove(w + 2, w + 1, 6 * sizeof *w);
		w[1] = "--allow-run-as-root";
	}
	pid_t p = fork();
	if (p == 0) {
		setpgid(0, 0); /* its own group: a timed-out probe is killed whole */
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		int in = open("/dev/null", O_RDONLY), out = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (in < 0 || out < 0 || dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
		    dup2(out, STDERR_FILENO) < 0)
			_exit(127);
		execvp(w[0], w);
		_exit(127);
	}
	if (p > 0)
		setpgid(p, p);
	return p;
}

/* The hosts not gone, as --hosts lists them: H:S,... */
static void hosts_text(const Dprun *d, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (int i = 0; i < d->nhosts && used < len; i++)
		if (!d->hosts[i].gone)
			used += (size_t)snprintf(buf + used, len - used, "%s%s:%d", used ? "," : "",
						 d->hosts[i].name, d->hosts[i].slots);
}

static int hosts_gone(const Dprun *d)
{
	int n = 0;
	for (int i = 0; i < d->nhosts; i++)
		n += d->hosts[i].gone;
	return n;
}

/* After a failure: probe every host not yet gone, all at once, for at most
 * --probe-timeout seconds. A probe that fails is started again (after
 * PROBE_RETRY_S) while time is left: a host answers when one of its probes
 * succeeds in time, so one probe's transient failure (mpirun's start-up
 * racing the failed job's teardown on that host: seen on the hosts test's
 * surviving host under load) does not cost the job a healthy host. A host
 * none of whose probes succeeded in time is gone (said, once, with the last
 * probe's exit status and the tries). d->hostarg is then the hosts that
 * answer (--hosts' list, or a hostfile of their lines in work). Returns
 * their slots; -1 on an error (said). */
#define PROBE_RETRY_S 0.5
static int probe_hosts(Dprun *d)
{
	pid_t *pid = calloc((size_t)d->nhosts, sizeof *pid);
	int *rc = calloc((size_t)d->nhosts, sizeof *rc), *tries = calloc((size_t)d->nhosts, sizeof *tries);
	double *again = calloc((size_t)d->nhosts, sizeof *again); /* when to start it again; 0: not */
	int running = 0;
	if (!pid || !rc || !tries || !again) {
		free(pid);
		free(rc);
		free(tries);
		free(again);
		say("error: out of memory");
		return -1;
	}
	for (int i = 0; i < d->nhosts; i++)
		if (!d->hosts[i].gone && (pid[i] = start_probe(d, i)) > 0)
			running++, tries[i] = 1;
		else
			rc[i] = d->hosts[i].gone ? 0 : -1; /* could not fork: taken as gone */
	double deadline = now_s() + d->o.probe_timeout;
	int waiting = 0; /* failed probes to start again */
	while ((running > 0 || waiting > 0) && now_s() < deadline && !got_signal) {
		for (int i = 0; i < d->nhosts; i++) {
			int st;
			if (pid[i] > 0 && waitpid(pid[i], &st, WNOHANG) == pid[i]) {
				rc[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
				pid[i] = 0;
				running--;
				if (rc[i] != 0 && now_s() + PROBE_RETRY_S < deadline)
					again[i] = now_s() + PROBE_RETRY_S, waiting++;
			} else if (again[i] > 0 && now_s() >= again[i]) {
				again[i] = 0;
				waiting--;
				if ((pid[i] = start_probe(d, i)) > 0)
					running++, tries[i]++;
			}
		}
		usleep(20000);
	}
	for (int i = 0; i < d->nhosts; i++) {
		Host *h = &d->hosts[i];
		if (pid[i] > 0) { /* no answer in time: the probe (mpirun and its agent) ends */
			kill(-pid[i], SIGKILL);
			while (waitpid(pid[i], NULL, 0) < 0 && errno == EINTR)
				;
			if (!got_signal)
				say("host %s does not answer: the probe (mpirun --host %s:1 true) did not "
				    "end within --probe-timeout %g s (%d tries)", h->name, h->name,
				    d->o.probe_timeout, tries[i]);
			h->gone = !got_signal;
		} else if (rc[i] != 0 && !h->gone) {
			say("host %s does not answer: the probe (mpirun --host %s:1 true) exited %d "
			    "(%d tries in --probe-timeout %g s)", h->name, h->name, rc[i], tries[i],
			    d->o.probe_timeout);
			h->gone = 1;
		}
	}
	free(tries);
	free(again);
	free(pid);
	free(rc);
	/* the launch line's hosts: those that answer */
	int slots = 0;
	char file[PATH_MAX];
	FILE *f = NULL;
	if (!d->o.hosts) {
		snprintf(file, sizeof file, "%s/hostfile", d->work);
		if (!(f = fopen(file, "w"))) {
			say("error: cannot write %s: %s", file, strerror(errno));
			return -1;
		}
	}
	for (int i = 0; i < d->nhosts; i++)
		if (!d->hosts[i].gone) {
			slots += d->hosts[i].slots;
			if (f)
				fprintf(f, "%s\n", d->hosts[i].line);
		}
	if (f && fclose(f) != 0) {
		say("error: cannot write %s: %s", file, strerror(errno));
		return -1;
	}
	if (f)
		snprintf(d->hostarg, sizeof d->hostarg, "%s", file);
	else
		hosts_text(d, d->hostarg, sizeof d->hostarg);
	return slots;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path) < 0 ? -1 : 0;
}

/* The scratch directory and what is in it (step files, dpc's logs, losses). */
static void remove_work(Dprun *d)
{
	if (d->work[0] && nftw(d->work, remove_one, 16, FTW_DEPTH | FTW_PHYS) < 0)
		say("warning: cannot remove the scratch directory %s: %s", d->work, strerror(errno));
}

/* Set up: where dpc/dpexec are, the scratch directory, the losses file,
 * DPRUN_COMMAND. */
static int setup(Dprun *d, int argc, char **argv)
{
	ssize_t k = readlink("/proc/self/exe", d->bindir, sizeof d->bindir - 1);
	if (k <= 0) {
		say("error: cannot find dprun's own directory (/proc/self/exe): %s", strerror(errno));
		return -1;
	}
	d->bindir[k] = '\0';
	*strrchr(d->bindir, '/') = '\0';
	const char *tmp = getenv("TMPDIR");
	snprintf(d->work, sizeof d->work, "%s/dprun.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(d->work)) {
		say("error: cannot make a scratch directory %s: %s", d->work, strerror(errno));
		d->work[0] = '\0';
		return -1;
	}
	/* rank 0's --losses file: the user's, else one of ours (for the steps lost) */
	for (int i = 0; i < d->o.nuser; i++) {
		const char *a = d->o.user[i];
		if (is_opt(a, "losses"))
			snprintf(d->losses, sizeof d->losses, "%s",
				 strchr(a, '=') ? strchr(a, '=') + 1 : i + 1 < d->o.nuser ? d->o.user[i + 1] : "");
	}
	if (!d->losses[0])
		snprintf(d->losses, sizeof d->losses, "%s/losses", d->work);
	/* the resume command's start: dprun's words as typed, then "--" */
	int seen_dashes = 0, i;
	d->command[0] = '\0';
	for (i = 0; i < argc - d->o.nuser; i++) {
		seen_dashes |= !strcmp(argv[i], "--");
		if (cmd_append(d->command, sizeof d->command, argv[i]) < 0)
			break;
	}
	if (i < argc - d->o.nuser || (!seen_dashes && cmd_append(d->command, sizeof d->command, "--") < 0)) {
		say("error: the command line is too long");
		return -1;
	}
	setenv("DPRUN_COMMAND", d->command, 1);
	return read_hosts(d);
}

int main(int argc, char **argv)
{
	static Dprun dprun_state; /* zeroed; one per process */
	Dprun *d = &dprun_state;
	int pr = parse_opts(argc, argv, &d->o);
	if (pr)
		return pr > 0 ? 0 : 2;
	const Opts *o = &d->o;
	if (setup(d, argc, argv) < 0) {
		remove_work(d);
		return 1;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	int from_dp = ends_with(o->model, ".dp"), np = o->np, status = 1;
	char why[1024];
	if (from_dp) {
		int rc = compile(d, np, 0, why, sizeof why);
		if (rc != 0) { /* dpc said why */
			remove_work(d);
			return 1;
		}
	} else {
		snprintf(d->step, sizeof d->step, "%s", o->model);
	}
	char *w[MAX_WORDS], line[1 << 15];
	for (int restarts = 0;; restarts++) {
		if (got_signal) { /* while a restart was prepared: no new job to stop */
			say("stopped by %s before %s", got_signal == SIGINT ? "SIGINT" : "SIGTERM",
			    restarts ? "the restart" : "the job started");
			status = 128 + got_signal;
			break;
		}
		launch_words(d, np, restarts > 0 && latest_step(o->save_dir ? o->save_dir : "") >= 0, w);
		if (o->dry_run) {
			line[0] = '\0';
			for (int i = 0; w[i]; i++)
				cmd_append(line, sizeof line, w[i]);
			printf("%s\n", line);
			status = 0;
			break;
		}
		status = run_job(w);
		char buf[256];
		const char *cause = got_signal ? NULL : restartable(status, buf, sizeof buf);
		/* across hosts, a failed job that may be restarted probes them: mpirun
		 * ends a job whose host went away with a status of its own (9, 205,
		 * ...), which a host that no longer answers explains */
		int slots = -1;
		if (!got_signal && status != 0 && status != 2 && d->nhosts && !use_srun(o) &&
		    restarts < o->max_restarts) {
			int before = hosts_gone(d);
			if ((slots = probe_hosts(d)) < 0) /* said why */
				break;
			if (got_signal)
				continue; /* the loop's top says why it stops */
			if (!cause && hosts_gone(d) > before) {
				snprintf(buf, sizeof buf, "a host stopped answering (the launcher's status %d)",
					 status);
				cause = buf;
			} else if (!cause) {
				say("every host answers: the job's status %d is its own error; not restarted",
				    status);
			}
		}
		if (!cause)
			break;
		long logged = last_logged(d->losses), saved = latest_step(o->save_dir ? o->save_dir : "");
		if (restarts >= o->max_restarts) {
			if (o->max_restarts > 0)
				say("giving up: %s at %d ranks after %d restart%s (--max-restarts %d)", cause,
				    np, restarts, restarts == 1 ? "" : "s", o->max_restarts);
			else
				say("%s; not restarted (--max-restarts 0)", cause);
			break;
		}
		/* the largest world size from the usable ranks down that compiles */
		int want = o->ranks_after && o->ranks_after < np ? o->ranks_after : np, next = 0;
		if (slots >= 0 && slots < want) /* across hosts: the slots of those that answer */
			want = slots;
		if (want < o->min_ranks) {
			say("giving up: %s; %d usable ranks are fewer than --min-ranks %d", cause, want,
			    o->min_ranks);
			break;
		}
		if (!from_dp) {
			if (want != np) {
				say("giving up: %s; the step file %s is compiled for %d ranks and %d are "
				    "usable: give dprun the .dp file to restart at another size",
				    cause, o->model, np, want);
				break;
			}
			next = np;
		}
		for (int ws = want; from_dp && ws >= o->min_ranks && !next; ws--) {
			if (ws == d->compiled_np) {
				next = ws;
				break;
			}
			int rc = compile(d, ws, 1, why, sizeof why);
			if (rc < 0)
				break;
			if (rc == 0)
				next = ws;
			else
				say("%d ranks: not possible: %s", ws, why);
		}
		if (!next) {
			say("giving up: %s; no world size from %d down to --min-ranks %d compiles", cause,
			    want, o->min_ranks);
			break;
		}
		char on[sizeof d->hostarg] = "";
		if (d->nhosts && !use_srun(o)) {
			memcpy(on, " on ", 4);
			hosts_text(d, on + 4, sizeof on - 4);
		}
		if (saved >= 0)
			say("restart %d of %d: %s; world size %d -> %d%s; resuming from step %ld of %s "
			    "(%ld step%s lost since the last save)",
			    restarts + 1, o->max_restarts, cause, np, next, on, saved, o->save_dir,
			    logged > saved ? logged - saved : 0, logged - saved == 1 ? "" : "s");
		else
			say("restart %d of %d: %s; world size %d -> %d%s; no checkpoint yet: starting "
			    "again from step 0 (%ld steps lost)",
			    restarts + 1, o->max_restarts, cause, np, next, on, logged > 0 ? logged : 0);
		np = next;
	}
	remove_work(d);
	free(d->hosts);
	return status;
}
