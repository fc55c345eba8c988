/*
 * signals.c - SIGINT and SIGTERM end a run cleanly: the handler only records
 * the signal; the training loop looks at it between steps (sig_pending),
 * the ranks agree on it (world_sync), finish the step, write a checkpoint
 * when saving is configured and exit with 128 + the signal. A second signal
 * ends the process at once (the default action, re-raised).
 *
 * SIGUSR1 and SIGUSR2 stand for SIGINT and SIGTERM: Open MPI's mpirun
 * keeps SIGINT and SIGTERM for itself (it answers them by killing the
 * ranks, SIGKILL one second later, and exits 1) but forwards SIGUSR1/2 to
 * every rank, as srun does, so dprun turns a Ctrl-C into SIGUSR1 to the
 * launcher and the run stops as it would on SIGINT (exit 130).
 *
 * The recorded signal is the one piece of process-global state in the
 * runtime: a signal handler cannot reach a context struct.
 */
#include <signal.h>
#include <string.h>

#include "rt.h"

static volatile sig_atomic_t sig_seen;

static void on_signal(int sig)
{
	if (sig_seen) { /* the second one: at once, as if there were no handler */
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	sig_seen = sig == SIGUSR1 ? SIGINT : sig == SIGUSR2 ? SIGTERM : sig;
}

void sig_install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART; /* I/O in progress completes; the loop looks later */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
}

int sig_pending(void)
{
	return sig_seen;
}

const char *sig_name(int sig)
{
	return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}
