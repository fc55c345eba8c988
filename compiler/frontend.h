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

#include "ir.h"

/* Parse, check and lower the file at path. world_size is dpc's --world-size
 * (0 when not given; `mesh auto` then is an error). Returns the graph, or NULL
 * after reporting errors through d (d->nerrors > 0). src_out, if not NULL,
 * receives the source text (malloc'd) for later diagnostics. */
Graph *fe_compile(const char *path, int world_size, Diag *d, char **src_out);

#endif
