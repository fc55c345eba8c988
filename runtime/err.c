/*
 * err.c - RtErr: what went wrong (for the user) and where it was raised
 * (the C source file and line, for the developer).
 *
 * The runtime never exits below main(): a failing call records the message
 * here and returns -1; main() decides which rank prints it (once, the
 * first rank that failed) and how the other ranks are told. The message
 * names user-facing things (files, .dp lines, steps); the C location, rank
 * and host are printed only with --verbose (rt_err_print).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

int rt_fail(RtErr *e, const char *file, int line, const char *fmt, ...)
{
	e->file = file;
	e->line = line;
	e->echo = 0;
	e->lost = 0;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	return -1;
}

void rt_err_print(const char *prog, const RtErr *e, int verbose)
{
	if (verbose && e->file) {
		char host[64] = "?";
		if (gethostname(host, sizeof host) != 0)
			strcpy(host, "?");
		host[sizeof host - 1] = '\0';
		if (e->rank >= 0)
			fprintf(stderr, "%s: error: rank %d (host %s) %s:%d: %s\n", prog, e->rank, host,
				e->file, e->line, e->msg);
		else
			fprintf(stderr, "%s: error: %s:%d: %s\n", prog, e->file, e->line, e->msg);
	} else {
		fprintf(stderr, "%s: error: %s\n", prog, e->msg);
	}
	fflush(stderr);
}
