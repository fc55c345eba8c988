/*
 * frontend.h - the DSL front end: source text to graph IR.
 *
 * fe_compile reads a .dp file, parses it (reentrant flex scanner, pure bison
 * parser), checks names and settings, and lowers it to a Graph (ir/ir.h) that
 * the pass pipeline takes. Every user error goes through error_at; the parser
 * recovers at statement boundaries, so one run reports several errors.
 */
#ifndef DP_FRONTEND_H
#define DP_FRONTEND_H

#include <stdint.h>

#include "ir.h"

/* dpc -D NAME=VALUE: overrides the config constant NAME (an unknown NAME is
 * an error at the config section). */
typedef struct {
	char name[129];  /* an identifier (at most 128 bytes, like the DSL's) */
	int is_float;    /* VALUE had a '.' or an exponent */
	int64_t i;
	double f;
} FeDefine;

typedef struct {
	int world_size;           /* dpc's --world-size (0 when not given) */
	/* dpc's --tp, --cp, --dp-replicate: the axes `mesh auto` fixes before
	 * dp_shard takes the rest (the seeds' order: tp, cp, dp_replicate); 0 when
	 * not given (1) */
	int tp, cp, dp_replicate;
	const FeDefine *defines;  /* -D overrides, in command-line order (a later one wins) */
	int ndefines;
	const char *precision;    /* dpc's --precision (f32, bf16): replaces train's `precision`
	                             setting; NULL: the file's */
} FeOptions;

/* Parse "NAME=VALUE" (VALUE an integer or a number, optionally negative) into
 * *out. Returns 0, or -1 when it is malformed. */
int fe_parse_define(const char *arg, FeDefine *out);

/* Parse, check and lower the file at path. Returns the graph, or NULL after
 * reporting errors through d (d->nerrors > 0). src_out, if not NULL, receives
 * the source text (malloc'd) for later diagnostics. opts may be NULL. */
Graph *fe_compile_opts(const char *path, const FeOptions *opts, Diag *d, char **src_out);

/* fe_compile_opts with only a world size (0 when not given; `mesh auto` then
 * is an error). */
Graph *fe_compile(const char *path, int world_size, Diag *d, char **src_out);

#endif
