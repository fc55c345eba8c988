/*
 * metrics.h - the run's logs on rank 0 (runtime/metrics.c): the progress
 * line with elapsed time and ETA, --losses and --log-json.
 */
#ifndef DP_METRICS_H
#define DP_METRICS_H

#include <stdio.h>

#include "rt.h"

typedef struct {
	/* set by the caller before metrics_open */
	int quiet;
	int world;
	uint64_t first, steps;  /* this run trains steps first+1 .. steps (counting from 1) */
	double global_batch;    /* samples per step */
	double tokens;          /* tokens per sample; 0: not a token model */
	double flops_per_token; /* model FLOPs per token (metrics_flops_per_token); 0: no MFU */
	double peak_flops;      /* per rank, for MFU */
	/* state */
	FILE *losses, *json;
	const char *losses_path, *json_path;
	double t0;              /* when training started (MPI_Wtime) */
	double step_s;          /* time spent in steps so far (no evaluation) */
	uint64_t nsteps;        /* steps timed */
	int failed;             /* a write failed: err says which */
	RtErr err;
} Metrics;

typedef struct {
	int have;
	double loss, accuracy, correct, counted;
} EvalResult;

/* Open the logs (either may be NULL); a resumed run (first > 0) continues them.
 * run_record: --log-json's first line for this run (a JSON object and a
 * newline: {"run": ...} for a fresh run, {"resume": {"step": N, ...}} for a
 * resumed one; metrics.c says how runs share the file). */
int metrics_open(Metrics *m, const char *losses, const char *log_json, const char *run_record,
		 RtErr *e);
void metrics_start(Metrics *m, double now);
/* After step `step` (from 1): its --losses line; step_s is its duration. */
void metrics_step(Metrics *m, uint64_t step, double loss, double grad_norm, double lr,
		  double step_s);
/* fp16's loss scaling at a logged step: the scale the step ran with and
 * the steps skipped up to it (on: the step file scales its loss). */
typedef struct {
	int on;
	double scale;
	uint64_t skipped;
} MetricsAmp;

/* A logged step: the progress line (and the eval line when ev->have), and a
 * --log-json object. grad_norm NaN: the model has none. amp: the loss
 * scale and skipped steps (" | scale 65536, 1 skipped"; "loss_scale",
 * "skipped_steps"). extra: appended to the progress line (may be NULL).
 * now: when the step was seen done; its elapsed time is now minus
 * metrics_start's. */
void metrics_log(Metrics *m, uint64_t step, double loss, double grad_norm, double lr,
		 double ms_per_step, const MetricsAmp *amp, const EvalResult *ev,
		 const char *extra, double now);
/* The first write error since metrics_open: 0, or -1 with e. */
int metrics_error(const Metrics *m, RtErr *e);
int metrics_close(Metrics *m, RtErr *e);
/* Model FLOPs per token of a token model with nparams parameters. */
double metrics_flops_per_token(const DpStep *s, int64_t nparams);

#endif
