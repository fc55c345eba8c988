/*
 * gradcheck.c - dpexec --check-grads: compare the gradients the step program
 * computes (autodiff's backward) with central finite differences of the loss.
 *
 * On one rank, for optimizer step 0, micro-batch 0: run the step program
 * without its DP_IF_LAST instructions (no all-reduce, clipping or update),
 * from zeroed gradients, so grad.<p> is exactly d(loss of this micro-batch)/dp.
 * Then, for up to GC_MAX_ELEMS elements of every parameter (evenly spaced,
 * always the first and the last), perturb the element by +-h, re-run the same
 * program and read the loss metric:  fd = (L(p+h) - L(p-h)) / (2h).
 *
 * Choice of h and tolerance (float32 everywhere except the loss sum):
 *  - The loss is summed in double inside cross_entropy but stored as a f32
 *    metric, so each L carries a rounding error of about |L| * 2^-24. The
 *    difference quotient therefore has a noise floor near |L| * 2^-23 / (2h);
 *    h must not be tiny. Truncation error is O(h^2 * L''') for smooth ops,
 *    and a relu kink crossed inside [p-h, p+h] adds O(h) error for a few
 *    elements. h = 1e-3 * max(1, |p|) balances these for O(1) activations,
 *    and the h actually applied is re-measured in float ((p+h) - p).
 *  - Pass when |ad - fd| <= 5e-2 * max(|ad|, |fd|) + atol, with
 *    atol = 1e-5 + 16 * |L| * FLT_EPSILON / h: the absolute term is a few
 *    times the rounding floor above, so tiny gradients (pure noise in fd)
 *    cannot fail the check while any real mistake in a backward rule (a
 *    wrong sign, a missing factor, a transposed operand) is far outside it.
 * The loss scale is 1/global_batch (the program's own), which is fine: both
 * sides carry it.
 *
 * Sharded step files are refused: their step program re-gathers parameters
 * from shards (and the init program cut them with SHARD), so an in-place
 * perturbation would not reach the forward. The mathematics is the same as
 * ddp's; check that.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"

#define GC_MAX_ELEMS 20
#define GC_H 1e-3f
#define GC_RTOL 5e-2

/* Zero every gradient tensor (through the backend: any memory). */
static int zero_grads(Exec *x, RtErr *e)
{
	const DpStep *s = x->s;
	size_t most = 0;
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (s->tensors[i].kind == DP_T_GRAD && (size_t)exec_tensor_bytes(s, (int)i) > most)
			most = (size_t)exec_tensor_bytes(s, (int)i);
	void *zeros = calloc(most ? most : 1, 1);
	if (!zeros)
		return RT_FAIL(e, "out of memory (--check-grads)");
	int rc = 0;
	for (uint32_t i = 0; i < s->ntensors && !rc; i++)
		if (s->tensors[i].kind == DP_T_GRAD && s->tensors[i].nbytes)
			rc = exec_tensor_write(x, (int)i, zeros, e);
	free(zeros);
	return rc;
}

static int loss_at(Exec *x, double *loss, RtErr *e)
{
	float l;
	RT_CHECK(zero_grads(x, e));
	RT_CHECK(exec_zero_metrics(x, e));
	RT_CHECK(exec_run(x, DP_PROG_STEP, 0, e));
	RT_CHECK(exec_tensor_read(x, x->s->metrics.loss, &l, e));
	*loss = l;
	return 0;
}

static int find_grad(const DpStep *s, const char *pname)
{
	for (uint32_t i = 0; i < s->ntensors; i++) {
		const char *n = dpstep_str(s, s->tensors[i].name);
		if (s->tensors[i].kind == DP_T_GRAD && strncmp(n, "grad.", 5) == 0 &&
		    strcmp(n + 5, pname) == 0)
			return (int)i;
	}
	return -1;
}

/* Does the step program rebuild parameters from shards? Then perturbing a
 * parameter in place would be overwritten by the next gather. */
static int shards_params(const DpStep *s)
{
	for (uint32_t i = 0; i < s->nprog[DP_PROG_INIT]; i++)
		if (s->prog[DP_PROG_INIT][i].op == DPK_SHARD)
			return 1;
	for (uint32_t i = 0; i < s->nprog[DP_PROG_STEP]; i++) {
		unsigned op = s->prog[DP_PROG_STEP][i].op;
		if (op == DPK_REDUCE_SCATTER || op == DPK_ALL_GATHER)
			return 1;
	}
	return 0;
}

int gradcheck_run(Exec *x, RtErr *e)
{
	const DpStep *s = x->s;
	if (shards_params(s))
		return RT_FAIL(e, "--check-grads needs a ddp step file: this one shards parameters "
			       "(strategy %s, or a block's own; gradients are the same mathematics: "
			       "compile with strategy ddp and no block strategies)",
			       dp_name(dp_strategy_names, DP_NSTRAT, s->cfg.strategy));
	if (x->comm->world != 1)
		return RT_FAIL(e, "--check-grads runs on one rank (this run has %d)", x->comm->world);
	if (s->metrics.loss < 0)
		return RT_FAIL(e, "--check-grads: the step file has no loss metric");
	x->step = 0;
	x->micro = 0;

	/* Test hook: DP_GRADCHECK_SKEW=s scales the analytic gradients by (1+s),
	 * so tests/gradcheck.sh can show that a wrong gradient is caught. */
	const char *skew_env = getenv("DP_GRADCHECK_SKEW");
	float skew = skew_env ? 1.0f + strtof(skew_env, NULL) : 1.0f;

	double l0;
	RT_CHECK(loss_at(x, &l0, e));
	int failed = 0, nparams = 0;
	float *p = NULL, *g = NULL;
	int rc = 0;
	for (uint32_t pi = 0; pi < s->ntensors && !rc; pi++) {
		const DpTensor *pt = &s->tensors[pi];
		if (pt->kind != DP_T_PARAM || !pt->nbytes)
			continue;
		const char *name = dpstep_str(s, pt->name);
		int gi = find_grad(s, name);
		if (gi < 0 || !s->tensors[gi].nbytes) {
			rc = RT_FAIL(e, "--check-grads: parameter '%s' has no gradient tensor 'grad.%s'",
				     name, name);
			break;
		}
		nparams++;
		int64_t n = exec_numel(pt);
		int m = n < GC_MAX_ELEMS ? (int)n : GC_MAX_ELEMS;
		int64_t idx[GC_MAX_ELEMS];
		float ad[GC_MAX_ELEMS];
		free(p);
		free(g);
		p = malloc((size_t)n * sizeof *p + 1);
		g = malloc((size_t)n * sizeof *g + 1);
		if (!p || !g) {
			rc = RT_FAIL(e, "out of memory (--check-grads of '%s')", name);
			break;
		}
		/* the analytic gradient of the unperturbed point (loss_at ran the backward) */
		if ((rc = loss_at(x, &l0, e)) || (rc = exec_tensor_read(x, gi, g, e)) ||
		    (rc = exec_tensor_read(x, (int)pi, p, e)))
			break;
		for (int k = 0; k < m; k++) {
			idx[k] = m == 1 ? 0 : (int64_t)((double)k * (double)(n - 1) / (m - 1) + 0.5);
			ad[k] = g[idx[k]] * skew;
		}
		double max_rel = 0;
		int bad = 0;
		for (int k = 0; k < m && !rc; k++) {
			float orig = p[idx[k]];
			float h = GC_H * fmaxf(1.0f, fabsf(orig));
			float up = orig + h, down = orig - h;
			double lp, lm;
			p[idx[k]] = up;
			if ((rc = exec_tensor_write(x, (int)pi, p, e)) || (rc = loss_at(x, &lp, e)))
				break;
			p[idx[k]] = down;
			if ((rc = exec_tensor_write(x, (int)pi, p, e)) || (rc = loss_at(x, &lm, e)))
				break;
			p[idx[k]] = orig;
			if ((rc = exec_tensor_write(x, (int)pi, p, e)))
				break;
			double span = (double)up - (double)down; /* the h actually applied, twice */
			double fd = (lp - lm) / span;
			double a = ad[k], diff = fabs(a - fd), scale = fmax(fabs(a), fabs(fd));
			double atol = 1e-5 + 16.0 * fabs(l0) * FLT_EPSILON / (span / 2);
			double rel = scale > 0 ? diff / scale : 0;
			if (scale > atol && rel > max_rel) /* fd is noise below atol */
				max_rel = rel;
			if (diff > GC_RTOL * scale + atol) {
				if (!bad)
					fprintf(stderr,
						"gradcheck %s[%lld]: autodiff %.6g, finite difference %.6g\n",
						name, (long long)idx[k], a, fd);
				bad++;
			}
		}
		if (rc)
			break;
		printf("gradcheck %s: %d elements, max rel err %.1e %s\n", name, m, max_rel,
		       bad ? "FAILED" : "ok");
		failed += bad != 0;
	}
	free(p);
	free(g);
	RT_CHECK(rc);
	RT_CHECK(zero_grads(x, e));
	RT_CHECK(exec_zero_metrics(x, e));
	if (!nparams)
		return RT_FAIL(e, "--check-grads: the step file has no parameters");
	printf("gradcheck: %d of %d parameters %s\n", nparams - failed, nparams,
	       failed ? "passed; FAILED" : "passed");
	fflush(stdout);
	return failed ? 1 : 0;
}
