/*
 * metrics.c - what rank 0 tells about a run: the progress line (with elapsed
 * time and ETA), --losses (one line per step after a header, flushed per
 * line so an interrupted run leaves whole lines) and --log-json (one JSON
 * object per logged step: JSON Lines, the form log shippers and pandas
 * read). Write errors (a full disk) are kept and reported at the next sync
 * point, so the run stops with a message and a non-zero exit instead of
 * ending "successfully" with an empty file.
 *
 * A resumed run continues the same files: lines for steps after the
 * checkpoint's (written before the interruption) are cut off first, so the
 * file of an interrupted and resumed run is the file of an uninterrupted
 * one (but for --log-json's resume record).
 *
 * --log-json is never overwritten: every run starts with a record of its
 * own, {"run": {...}} (the time, the command, the model, the mesh, the
 * versions: metrics_open's header, from dpexec), or {"resume": {"step": N,
 * ...}} for a resumed run; a fresh run appends after what the file holds
 * (its last whole line), and a resumed run cuts only within the file's last
 * run, from its "run" record on. Every record has "time" (UTC, ISO 8601,
 * milliseconds). --losses starts anew on a fresh run, as before.
 *
 * MFU (token models): model FLOPs per token = 6 N + 12 L T d (PaLM,
 * appendix B: N parameters, and per layer the attention scores and
 * values, T tokens of context, width d, forward and backward), times
 * tokens per second, over the peak of all ranks (--peak-tflops per rank).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"
#include "stamp.h"

static void keep_error(Metrics *m, const char *what, const char *path, int err)
{
	if (m->failed)
		return;
	m->err.rank = -1;
	RT_FAIL(&m->err, "cannot write the %s file %s: %s", what, path, strerror(err));
	m->failed = 1;
}

/* The step a line starts with ("12 ..." or {"step": 12, ...}); -1 if none. */
static long long line_step(const char *line)
{
	const char *p = line;
	if (*p == '{') {
		p = strstr(line, "\"step\":");
		if (!p)
			return -1;
		p += 7;
	}
	char *end;
	long long v = strtoll(p, &end, 10);
	return end == p ? -1 : v;
}

/* A run record of --log-json: a fresh run's, where a resumed run's cut may begin. */
static int is_run_record(const char *line)
{
	return !strncmp(line, "{\"run\":", 7);
}

/* Open a log for writing, in place (util/outfile.h: through links; a
 * FIFO without a reader is an error, not a hang). A resumed run (first >
 * 0) keeps the header and the lines of steps up to `first` of an existing
 * regular file and appends after them; otherwise the file starts anew with
 * the header. runs (--log-json): the file holds runs, each from its run
 * record: a fresh run appends after the last whole line, and a resumed one
 * keeps everything before the last run record and, after it, the lines of
 * steps up to `first`; the header is written in both cases. */
static FILE *open_log(const char *what, const char *path, const char *header, uint64_t first,
		      int runs, RtErr *e)
{
	char err[1024];
	int fd, regular;
	if (out_open_inplace(path, 1, &fd, &regular, err, sizeof err)) {
		RT_FAIL(e, "%s: %s", what, err);
		return NULL;
	}
	FILE *f = fdopen(fd, regular ? "r+" : "w");
	if (!f) {
		RT_FAIL(e, "cannot write the %s file %s: %s", what, path, strerror(errno));
		close(fd);
		return NULL;
	}
	long keep = 0, last_run = 0, whole = 0;
	char *line = NULL; /* whole lines, however long (a run record holds a command) */
	size_t cap = 0;
	if (runs && regular) { /* where the last run begins; the end of the last whole line */
		long at = 0;
		while (getline(&line, &cap, f) > 0) {
			if (is_run_record(line))
				last_run = at;
			at = ftell(f);
			if (strchr(line, '\n'))
				whole = at;
		}
		if (fseek(f, last_run, SEEK_SET) != 0)
			whole = last_run = 0;
		keep = first > 0 ? last_run : whole;
	}
	if (first > 0 && regular) {
		int at_run = runs; /* the first line read is the last run's record, if any */
		while (getline(&line, &cap, f) > 0) {
			int kept = line[0] == '#' || (at_run && is_run_record(line));
			at_run = 0;
			if (!kept && (line_step(line) < 0 || line_step(line) > (long long)first))
				break;
			if (!strchr(line, '\n'))
				break; /* a cut line: the run was killed while writing it */
			keep = ftell(f);
		}
	}
	free(line);
	if (regular && (ftruncate(fd, keep) != 0 || fseek(f, keep, SEEK_SET) != 0)) {
		RT_FAIL(e, "cannot %s the %s file %s: %s", keep ? "continue" : "write", what, path,
			strerror(errno));
		fclose(f);
		return NULL;
	}
	if (keep > 0 && !runs)
		return f;
	if (header && (fputs(header, f) == EOF || fflush(f) != 0)) {
		RT_FAIL(e, "cannot write the %s file %s: %s", what, path, strerror(errno));
		fclose(f);
		return NULL;
	}
	return f;
}

int metrics_open(Metrics *m, const char *losses, const char *log_json, const char *run_record,
		 RtErr *e)
{
	if (losses) {
		m->losses = open_log("--losses", losses, "# step loss grad_norm lr\n", m->first, 0, e);
		if (!m->losses)
			return -1;
		m->losses_path = losses;
	}
	if (log_json) {
		m->json = open_log("--log-json", log_json, run_record, m->first, 1, e);
		if (!m->json)
			return -1;
		m->json_path = log_json;
	}
	return 0;
}

void metrics_start(Metrics *m, double now)
{
	m->t0 = now;
}

static void put_line(Metrics *m, FILE *f, const char *what, const char *path, const char *line)
{
	if (!f || m->failed)
		return;
	errno = 0;
	if (fputs(line, f) == EOF || fflush(f) != 0)
		keep_error(m, what, path, errno ? errno : EIO);
}

void metrics_step(Metrics *m, uint64_t step, double loss, double grad_norm, double lr,
		  double step_s)
{
	char line[256];
	m->step_s += step_s;
	m->nsteps++;
	snprintf(line, sizeof line, "%llu %.9g %.9g %.9g\n", (unsigned long long)step, loss,
		 grad_norm, lr);
	put_line(m, m->losses, "--losses", m->losses_path, line);
}

/* "42s", "3m05s", "2h07m" */
static void duration(char *buf, size_t len, double s)
{
	if (!(s >= 0))
		s = 0;
	long v = (long)(s + 0.5);
	if (v < 60)
		snprintf(buf, len, "%lds", v);
	else if (v < 3600)
		snprintf(buf, len, "%ldm%02lds", v / 60, v % 60);
	else
		snprintf(buf, len, "%ldh%02ldm", v / 3600, v % 3600 / 60);
}

void metrics_log(Metrics *m, uint64_t step, double loss, double grad_norm, double lr,
		 double ms_per_step, const MetricsAmp *amp, const EvalResult *ev,
		 const char *extra, double now)
{
	double sps = ms_per_step > 0 ? m->global_batch / (ms_per_step / 1e3) : 0;
	double tps = sps * m->tokens;
	double mfu = m->flops_per_token > 0 && m->peak_flops > 0
			     ? tps * m->flops_per_token / (m->peak_flops * m->world) : -1;
	double elapsed = now - m->t0;
	double mean = m->nsteps ? m->step_s / (double)m->nsteps : 0;
	double eta = (double)(m->steps - step) * mean;
	if (!m->quiet) {
		char el[32], et[32];
		duration(el, sizeof el, elapsed);
		duration(et, sizeof et, eta);
		printf("step %llu/%llu | loss %.4f | lr %.2e", (unsigned long long)step,
		       (unsigned long long)m->steps, loss, lr);
		if (!isnan(grad_norm))
			printf(" | grad_norm %.3f", grad_norm);
		if (amp && amp->on)
			printf(" | scale %g, %llu skipped", amp->scale, (unsigned long long)amp->skipped);
		printf(" | %.2f ms/step", ms_per_step);
		if (m->tokens > 0)
			printf(" | %.0f tokens/s", tps);
		else
			printf(" | %.0f samples/s", sps);
		if (mfu >= 0)
			printf(" | MFU %.2f%%", 100 * mfu);
		printf(" | %s elapsed, ETA %s%s\n", el, et, extra ? extra : "");
	}
	if (ev && ev->have) /* a result, not progress: also with --quiet */
		printf("eval step %llu | test loss %.4f | test accuracy %.4f (%.0f/%.0f)\n",
		       (unsigned long long)step, ev->loss, ev->accuracy, ev->correct, ev->counted);
	fflush(stdout);
	if (!m->json)
		return;
	char line[1024], when[40];
	stamp_now(when, sizeof when);
	int n = snprintf(line, sizeof line,
			 "{\"step\": %llu, \"time\": \"%s\", \"loss\": %.9g, \"lr\": %.9g, "
			 "\"ms_per_step\": %.6g, \"samples_per_s\": %.6g, \"elapsed_s\": %.6g, "
			 "\"eta_s\": %.6g",
			 (unsigned long long)step, when, loss, lr, ms_per_step, sps, elapsed, eta);
	if (isfinite(grad_norm)) /* JSON has no inf or NaN: a skipped step's norm is left out */
		n += snprintf(line + n, sizeof line - (size_t)n, ", \"grad_norm\": %.9g", grad_norm);
	if (amp && amp->on)
		n += snprintf(line + n, sizeof line - (size_t)n,
			      ", \"loss_scale\": %.9g, \"skipped_steps\": %llu", amp->scale,
			      (unsigned long long)amp->skipped);
	if (m->tokens > 0)
		n += snprintf(line + n, sizeof line - (size_t)n, ", \"tokens_per_s\": %.6g", tps);
	if (mfu >= 0)
		n += snprintf(line + n, sizeof line - (size_t)n, ", \"mfu\": %.6g, \"peak_tflops\": %.6g",
			      mfu, m->peak_flops / 1e12);
	if (ev && ev->have)
		n += snprintf(line + n, sizeof line - (size_t)n,
			      ", \"eval_loss\": %.9g, \"eval_accuracy\": %.9g", ev->loss, ev->accuracy);
	snprintf(line + n, sizeof line - (size_t)n, "}\n");
	put_line(m, m->json, "--log-json", m->json_path, line);
}

int metrics_error(const Metrics *m, RtErr *e)
{
	if (!m->failed)
		return 0;
	int rank = e->rank;
	*e = m->err;
	e->rank = rank;
	return -1;
}

int metrics_close(Metrics *m, RtErr *e)
{
	FILE *f[2] = {m->losses, m->json};
	const char *what[2] = {"--losses", "--log-json"}, *path[2] = {m->losses_path, m->json_path};
	m->losses = m->json = NULL;
	for (int i = 0; i < 2; i++)
		if (f[i] && fclose(f[i]) != 0)
			keep_error(m, what[i], path[i], errno);
	return metrics_error(m, e);
}

double metrics_flops_per_token(const DpStep *s, int64_t nparams)
{
	/* each attention of the step program is one layer's, on this rank's heads:
	 * the tp ranks together do every head */
	double attn = 0;
	for (uint32_t i = 0; i < s->nprog[DP_PROG_STEP]; i++) {
		const DpInstr *in = &s->prog[DP_PROG_STEP][i];
		if (in->op != DP_OP_ATTENTION || in->in[0] < 0)
			continue;
		const DpTensor *qkv = &s->tensors[in->in[0]];
		if (qkv->ndim < 2)
			continue;
		double T = (double)qkv->dims[qkv->ndim - 2];
		double d = (double)init_whole_dim(s, qkv, qkv->ndim - 1) / 3;
		if (init_whole_dim(s, qkv, qkv->ndim - 1) == qkv->dims[qkv->ndim - 1])
			d *= s->cfg.mesh[DP_AXIS_TP]; /* not marked: per-rank heads */
		attn += 12 * T * d;
	}
	return 6 * (double)nparams + attn;
}
