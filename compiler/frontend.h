/*
 * frontend.h - the DSL front end: source text to graph IR.
 *
 * lower_compile reads a .dp file, parses it (reentrant flex scanner, pure bison
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

/* A setting of format/settings.def set from the command line: dpc --set
 * KEY=VALUE, or a settings-backed flag (--precision P is train.precision).
 * Checked as the file's value would be; it replaces the file's. */
typedef struct {
	const char *key;   /* "train.lr", "train.optimizer.beta2", "eval.every" */
	const char *value; /* "3e-4", "adamw(lr=1e-3)", "true": a DSL value */
	const char *what;  /* the flag as written, for messages: "--set train.lr=3e-4" */
} FeSet;

typedef struct {
	int world_size;           /* dpc's --world-size (0 when not given) */
	/* dpc's --tp, --cp, --dp-replicate, --pp: the axes `mesh auto` fixes
	 * before dp_shard takes the rest (the seeds' order: tp, cp, dp_replicate;
	 * pp outermost); 0 when not given (1) */
	int tp, cp, dp_replicate, pp;
	const FeDefine *defines;  /* -D overrides, in command-line order (a later one wins) */
	int ndefines;
	const FeSet *sets;        /* --set and settings-backed flags, in command-line order
	                             (a later one wins) */
	int nsets;
} FeOptions;

/* Parse "NAME=VALUE" (VALUE an integer or a number, optionally negative) into
 * *out. Returns 0, or -1 when it is malformed. */
int const_parse_define(const char *arg, FeDefine *out);

/* Parse, check and lower the file at path. Returns the graph, or NULL after
 * reporting errors through d (d->nerrors > 0). src_out, if not NULL, receives
 * the source text (malloc'd) for later diagnostics. opts may be NULL. */
Graph *lower_compile_opts(const char *path, const FeOptions *opts, Diag *d, char **src_out);

/* The settings of format/settings.def as docs/DSL.md's markdown table
 * (compiler/settings.c; dpc --print-settings). */
void settings_print(FILE *out);

/* lower_compile_opts with only a world size (0 when not given; `mesh auto` then
 * is an error). */
Graph *lower_compile(const char *path, int world_size, Diag *d, char **src_out);

#endif
