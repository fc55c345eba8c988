/*
 * cliopt.h - the one-line message for a bad command-line option, shared by
 * dpc and dpexec (linked into both). Their getopt_long loops set opterr = 0,
 * so getopt prints nothing, and on '?' (or ':') call cli_bad_option, which
 * says what was wrong in the program's words, with "did you mean" for a
 * misspelt long option (util/suggest.h):
 *
 *   dpc: error: unknown option '--stpes'; did you mean '--steps'?
 *   dpexec: error: unknown option '-steps'; did you mean '--steps'?
 *   dpc: error: unknown option '--frobnicate' (see --help)
 *   dpc: error: option '--world-size' needs a value
 *   dpexec: error: option '--quiet' takes no value
 *   dpc: error: option '--d' is ambiguous: --dump-ir, --dump-after, --dp-replicate
 *
 * The exit status stays the caller's (dpc 1, dpexec 2).
 */
#ifndef DP_CLIOPT_H
#define DP_CLIOPT_H

#include <getopt.h>
#include <stdio.h>

/* c: what getopt_long returned ('?' or ':'); reads optind and optopt. */
void cli_bad_option(FILE *out, const char *prog, int c, int argc, char *const *argv,
		    const char *shortopts, const struct option *longopts);

#endif
