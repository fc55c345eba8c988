/*
 * plan.h - `dpc --plan` (compiler/plan.c): the mesh, strategy and knobs
 * that simulate fastest within the device memory.
 */
#ifndef DP_PLAN_H
#define DP_PLAN_H

#include <stdio.h>

#include "frontend.h"
#include "passes.h"

typedef struct {
	const char *path;          /* the model */
	int world;                 /* --world-size */
	const FeDefine *defines;   /* -D, for every candidate */
	int ndefines;
	const FeSet *sets;         /* --set and the settings' flags, before the candidate's own */
	int nsets;
	const Machine *machine;    /* --simulate's machine */
	int64_t device_memory;     /* --device-memory bytes per rank, 0: no bound */
} PlanOpts;

/* Searches, prints the ranking to out and progress to stderr; *winner: the
 * best plan's compiled graph (the caller frees it). 0, or -1 when no plan
 * fits (a message naming the smallest plan's memory printed). */
int plan_run(const PlanOpts *po, FILE *out, Graph **winner);

#endif
