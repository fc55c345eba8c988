/*
 * blas_env.c - OpenBLAS starts with one thread in dpexec.
 *
 * The CPU backend calls OpenBLAS with one thread from each of its own
 * threads (cpu/gemm.c), so OpenBLAS's worker threads are never used; but a
 * pthreads OpenBLAS starts them when the library loads, before main, sized
 * by the cores, and each allocates a 128 MiB buffer. Under an address-space
 * limit (ulimit -v of a few hundred MB) a worker's allocation fails and
 * OpenBLAS retries it forever; the singleton MPI_Init forks (to start its
 * daemon), the fork runs OpenBLAS's atfork handler, which joins the workers:
 * dpexec hung in MPI_Init, before --timeout could act. The thread count is
 * read from OPENBLAS_NUM_THREADS when the library loads, so the only place
 * to set it is the environment of the process image: when OpenBLAS started
 * workers, dpexec sets OPENBLAS_NUM_THREADS=1 and executes itself again
 * (same pid, arguments and environment otherwise), once, first thing in
 * main. Setting OPENBLAS_NUM_THREADS=1 beforehand avoids the second start.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "rt.h"

void rt_blas_one_thread(char **argv)
{
	const char *v = getenv("OPENBLAS_NUM_THREADS");
	if ((v && !strcmp(v, "1")) || openblas_get_num_threads() <= 1)
		return;
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return; /* no /proc: go on with the idle workers */
	exe[n] = '\0';
	if (setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0)
		execv(exe, argv);
	/* the exec failed: go on as before */
}
