/*
 * err.c - rt_fail: fill an RtErr with "rank R (host H) file:line: message".
 *
 * The runtime never exits below main(): a failing call records what went
 * wrong here and returns -1; main() prints the message and, on a multi-rank
 * run, aborts the MPI job so no rank is left waiting in a collective.
 * e->rank is set by the bootstrap; before that (rank -1) the rank is omitted.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

int rt_fail(RtErr *e, const char *file, int line, const char *fmt, ...)
{
	char host[64] = "?";
	if (gethostname(host, sizeof host) != 0)
		strcpy(host, "?");
	host[sizeof host - 1] = '\0';
	int n;
	if (e->rank >= 0)
		n = snprintf(e->msg, sizeof e->msg, "rank %d (host %s) %s:%d: ", e->rank, host, file,
			     line);
	else
		n = snprintf(e->msg, sizeof e->msg, "%s:%d: ", file, line);
	if (n < 0 || (size_t)n >= sizeof e->msg)
		n = 0;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg + n, sizeof e->msg - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}
