/*
 * fit.c - `dpc --stats --device NAME` (or with --device-memory): the
 * largest micro-batch whose step fits the device's memory, found by
 * compiling the model again at other micro-batches and reading each memory
 * plan's arena (passes/memplan.c), the figure --device-memory checks.
 *
 * The arena grows with the micro-batch (activations, the data, the loss's
 * rows), but not exactly linearly: the memory plan packs temporaries
 * first-fit. So the search keeps two micro-batches it has compiled, the
 * largest that fits (lo) and the smallest that does not (hi). Until one
 * fails it probes one past where the line through the last two fits meets
 * the budget (the file's micro-batch, then twice it, first); then between
 * lo and hi where the line through their arenas meets it (when that lands
 * strictly between them), else in the middle, until they are adjacent. The
 * answer is exact for the plans it compiles: lo fits, lo + 1 does not.
 * The micro-batch is set as the file sets its batch: global_batch (the
 * micro-batch x grad_accum x the dp ranks) or micro_batch, whichever the
 * file's compile accepts again at its own micro-batch.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct {
	const char *path;
	const FeOptions *fo;
	const char *key; /* "train.global_batch" or "train.micro_batch" */
	int64_t per_mb;  /* the key's value per micro-batch element (global: grad_accum x dp) */
	FILE *quiet;
	int compiles;
} Fit;

/* The arena of the model at micro-batch m, through every pass; -1 when the
 * front end or a pass refuses it. */
static int64_t arena_at(Fit *f, int64_t m)
{
	char value[32];
	snprintf(value, sizeof value, "%" PRId64, m * f->per_mb);
	FeSet batch = {f->key, value, "--stats"};
	Graph *g = plan_compile_with(f->path, f->fo, &batch, 1, f->quiet, npipeline);
	int64_t a = g && g->peak_bytes > 0 ? g->peak_bytes : -1;
	f->compiles++;
	ir_free(g);
	return a;
}

int fit_micro_batch(FILE *out, const char *path, const FeOptions *fo, const Graph *g, int64_t cap,
		    const char *capwhat)
{
	if (g->peak_bytes <= 0 || cap <= 0)
		return -1;
	FILE *quiet = fopen("/dev/null", "w");
	if (!quiet)
		die("fit: /dev/null: cannot open");
	int64_t m0 = g->cfg.micro_batch, a0 = g->peak_bytes;
	int64_t dp = (int64_t)(g->cfg.grad_accum ? g->cfg.grad_accum : 1) *
		     g->cfg.mesh[DP_AXIS_REPLICATE] * g->cfg.mesh[DP_AXIS_SHARD];
	Fit f = {.path = path, .fo = fo, .key = "train.global_batch", .per_mb = dp, .quiet = quiet};
	/* the batch's key: the one the file's compile takes again at m0, with
	 * the file's own arena (a check that the search compiles the file) */
	int64_t a = arena_at(&f, m0);
	if (a < 0) {
		f.key = "train.micro_batch";
		f.per_mb = 1;
		a = arena_at(&f, m0);
	}
	char b0[64], b1[64], b2[64];
	if (a != a0) {
		fprintf(out, "micro-batch that fits %s: not found (the model compiled again at its "
			     "micro-batch %" PRId64 " gives %s, not its %s)\n",
			capwhat, m0, a < 0 ? "an error" : stats_human_bytes(b0, sizeof b0, (double)a),
			stats_human_bytes(b1, sizeof b1, (double)a0));
		fclose(quiet);
		return -1;
	}
	/* lo fits (alo), hi does not (ahi; hi 0: none known yet) */
	int64_t lo = 0, alo = 0, hi = 0, ahi = 0, plo = 0, aplo = 0; /* plo: the fit before lo */
	if (a0 <= cap) {
		lo = m0, alo = a0;
	} else {
		hi = m0, ahi = a0;
	}
	const int64_t top = (int64_t)1 << 24; /* micro-batches past it: not searched */
	while (!hi || hi - lo > 1) {
		int64_t m;
		if (!hi) { /* no failure yet: one past the secant through the last two
			      fits (the first failure, if the arena is a line), else double */
			m = lo * 2;
			if (plo > 0 && alo > aplo) {
				m = lo + (int64_t)((double)(cap - alo) * (double)(lo - plo) /
						   (double)(alo - aplo)) + 1;
				if (m <= lo)
					m = lo + 1;
			}
			if (m > top)
				m = top;
			if (m <= lo)
				break;
		} else if (!lo) { /* no fit yet: toward 1 */
			m = hi / 2 > 0 ? hi / 2 : 1;
			if (m == hi)
				break;
		} else { /* the secant through (lo, alo) and (hi, ahi) at cap */
			double slope = (double)(ahi - alo) / (double)(hi - lo);
			m = slope > 0 ? lo + (int64_t)((double)(cap - alo) / slope) : lo + (hi - lo) / 2;
			if (m <= lo || m >= hi)
				m = lo + (hi - lo) / 2;
		}
		int64_t am = arena_at(&f, m);
		if (am >= 0 && am <= cap) {
			if (!hi)
				plo = lo, aplo = alo;
			lo = m, alo = am;
		} else {
			hi = m, ahi = am < 0 ? INT64_MAX : am;
			if (am < 0 && !lo && m == 1)
				break;
		}
		if (lo == top)
			break;
	}
	if (!lo) {
		fprintf(out, "micro-batch that fits %s: none (1 needs %s)\n", capwhat,
			ahi == INT64_MAX ? "more than the front end allows"
					 : stats_human_bytes(b0, sizeof b0, (double)ahi));
	} else {
		fprintf(out, "micro-batch that fits %s: %" PRId64 " per rank (arena %s", capwhat, lo,
			stats_human_bytes(b0, sizeof b0, (double)alo));
		if (hi)
			fprintf(out, "; %" PRId64 ": %s", hi,
				ahi == INT64_MAX ? "refused by the front end"
						 : stats_human_bytes(b1, sizeof b1, (double)ahi));
		else
			fprintf(out, "; not searched past %" PRId64, top);
		fprintf(out, "), %s now at %" PRId64 "; %d compiles\n",
			stats_human_bytes(b2, sizeof b2, (double)a0), m0, f.compiles);
	}
	fclose(quiet);
	return lo;
}
