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
	const uint32_t *mesh;      /* the file's mesh (DpAxis order), searched alone; NULL:
	                              every mesh of world (the file's is `mesh auto`) */
	int brief;                 /* print the winner and the runner-up, not the table */
	int jobs;                  /* worker processes (--jobs), 0: the online CPUs; the
	                              result is the same for any number */
	int max_classes;           /* --plan-classes: the class phase compiles at most this
	                              many classes' representatives, the fewest micro-
	                              batches a step first, and the members of the others are not searched
	                              (the output says so); 0: PLAN_CLASSES, -1: all */
} PlanOpts;

/* --plan-classes' default: a search whose class phase would compile more
 * classes than this is not exhaustive (docs/SIMULATE.md). */
#define PLAN_CLASSES 128

/* The winner, as the front end's options: the mesh axes for `mesh auto`
 * (0 when po->mesh fixed it) and --set lines (sets[i].value points into
 * the struct: keep it in place while they are used). */
typedef struct {
	int tp, cp, dp_replicate, pp;
	FeSet sets[6];
	int nsets;
	char buf[4][64];
} PlanChoice;

/* Searches, prints the ranking (po->brief: the choice) to out and progress
 * to stderr; *choice: the best plan. 0, or -1 when no plan fits (a message
 * naming the smallest plan's memory printed). */
int plan_run(const PlanOpts *po, FILE *out, PlanChoice *choice);

/* The model at path compiled with fo and the settings extra after its own
 * (a later one wins), through the passes before pipeline[to] (npipeline:
 * all), diagnostics to quiet; NULL when the front end or a pass refused it. */
Graph *plan_compile_with(const char *path, const FeOptions *fo, const FeSet *extra, int nextra,
			 FILE *quiet, int to);

/* compiler/fit.c: the largest micro-batch per rank whose memory plan
 * (arena) is at most cap bytes, the model at path compiled again with fo
 * at other micro-batches (g: its graph as compiled, through memplan); one
 * line to out, capwhat naming the budget ("in 80.00 GiB (h100)"). The
 * micro-batch, or -1 when none fits or g has no memory plan. */
int fit_micro_batch(FILE *out, const char *path, const FeOptions *fo, const Graph *g, int64_t cap,
		    const char *capwhat);

#endif
