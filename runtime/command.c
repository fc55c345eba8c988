/*
 * command.c - this run's command line as the user typed it, for the
 * command rank 0 prints to resume an interrupted run: one that works when
 * pasted.
 *
 * dpexec sees only its own words. The launcher's (mpirun --oversubscribe
 * --allow-run-as-root -np 4 --hostfile F ...) are read from the parent
 * process when it is one (/proc/PPID/cmdline: rank 0 usually runs on the
 * launcher's node, as mpirun's child); they end where dpexec's own first
 * word is. Elsewhere: under Slurm (the parent is slurmstepd) `srun -n N`,
 * another parent with several ranks `mpirun -np N`, one rank nothing.
 *
 * The words are dpexec's argv as given (saved before getopt_long permutes
 * it), quoted for a shell (util/cmdline.h).
 *
 * Under dprun (launch/dprun.c) the command is dprun's: DPRUN_COMMAND holds
 * its words up to and including `--`, quoted, and DPRUN_ARGS_FROM the index
 * in dpexec's argv of the user's first word (those before are dprun's: the
 * step file in its scratch directory, the save directory, a restart's
 * --resume); the user's words follow DPRUN_COMMAND as above.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmdline.h"
#include "rt.h"

/* Program names of the launchers whose command line we repeat. */
static const char *const launchers[] = {"mpirun", "mpiexec", "orterun", "prterun",
					"mpirun.openmpi", "mpiexec.openmpi", "mpiexec.hydra"};

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/* The parent's words when it is a launcher; 0 with *argc = 0 otherwise. The
 * words point into *buf (malloc'd, like *argv). */
static int parent_launcher(char **buf, int *argc, char ***argv)
{
	char path[64];
	*buf = NULL;
	*argc = 0;
	*argv = NULL;
	snprintf(path, sizeof path, "/proc/%ld/cmdline", (long)getppid());
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap + 1);
	ssize_t k;
	while (b && n < cap && (k = read(fd, b + n, cap - n)) > 0)
		n += (size_t)k;
	close(fd);
	if (!b || n == 0) {
		free(b);
		return 0;
	}
	b[n] = '\0';
	int c;
	char **v;
	if (cmd_split_nul(b, n, &c, &v) < 0) {
		free(b);
		return -1;
	}
	int known = 0;
	for (size_t i = 0; c > 0 && i < sizeof launchers / sizeof launchers[0]; i++)
		known |= !strcmp(base_name(v[0]), launchers[i]);
	if (!known) {
		free(v);
		free(b);
		return 0;
	}
	*buf = b;
	*argc = c;
	*argv = v;
	return 0;
}

/* The launcher's words before dpexec's own, or what stands for them. */
static int launcher_words(int argc, char **argv, int world, char *out, size_t len)
{
	char *buf, **pv;
	int pc, rc = 0;
	out[0] = '\0';
	if (parent_launcher(&buf, &pc, &pv) < 0)
		return -1;
	int at = -1; /* where the parent names this program */
	for (int i = 1; i < pc && at < 0 && argc > 0; i++)
		if (!strcmp(pv[i], argv[0]))
			at = i;
	if (at > 0) {
		for (int i = 0; i < at && rc == 0; i++)
			rc = cmd_append(out, len, pv[i]);
	} else if (getenv("SLURM_STEP_ID") || getenv("SLURM_JOB_ID")) {
		snprintf(out, len, "srun -n %d", world);
	} else if (world > 1) {
		snprintf(out, len, "mpirun -np %d", world);
	}
	free(pv);
	free(buf);
	return rc;
}

/* Whether word is the option --name, in full or as the unambiguous prefix
 * getopt_long accepted, with or without its =value. */
static int is_option(const char *word, const char *name)
{
	if (strncmp(word, "--", 2) != 0)
		return 0;
	word += 2;
	size_t n = strcspn(word, "=");
	return n > 0 && n <= strlen(name) && !strncmp(word, name, n);
}

int cmd_resume(int argc, char **argv, int world, const char *save_dir, char *out, size_t len)
{
	const char *dprun = getenv("DPRUN_COMMAND"), *from = getenv("DPRUN_ARGS_FROM");
	int first = 0;
	if (dprun && from && atoi(from) > 0 && atoi(from) <= argc && strlen(dprun) < len) {
		strcpy(out, dprun);
		first = atoi(from);
	} else if (launcher_words(argc, argv, world, out, len) < 0) {
		return -1;
	}
	int automatic = 0;
	for (int i = first; i < argc; i++) {
		const char *a = argv[i];
		if (i > 0 && (is_option(a, "resume") || is_option(a, "init-from"))) {
			if (!strchr(a, '='))
				i++; /* and its value */
			continue;
		}
		if (i > 0 && is_option(a, "overwrite"))
			continue; /* a resumed run must not remove what it resumes */
		automatic |= i > 0 && is_option(a, "auto-resume");
		if (cmd_append(out, len, a) < 0)
			return -1;
	}
	if (!automatic && (cmd_append(out, len, "--resume") < 0 || cmd_append(out, len, save_dir) < 0))
		return -1;
	return 0;
}
