/*
 * gradcheck.c - dpexec --check-grads: compare the gradients the step program
 * computes (autodiff's backward) with finite differences of the loss, on any
 * compute backend (tensors move only through exec_tensor_read/write).
 *
 * On one rank, for optimizer step 0, micro-batch 0: run the step program
 * without its DP_IF_LAST instructions (no gradient all-reduce, no optimizer
 * update), from zeroed gradients, so grad.<p> is exactly d(loss of this
 * micro-batch)/dp. Then perturb parameter elements, re-run the same program
 * and read the loss metric.
 *
 * A perturbed point needs the loss only, so it runs the loss's slice: the
 * step program's kernels the loss metric depends on (by arena bytes, from
 * the loss backwards), one at a time (exec_run_kernel), without the
 * backward, which is about two thirds of the step. The data tensors keep
 * micro-batch 0 from the whole run before (they are persistent), so the
 * LOADs are not repeated. Before it is used, the slice must give the whole
 * walk's loss bit for bit with every parameter moved (an instruction it
 * missed would leave the unmoved point's values behind); where it does not,
 * or where it would need a collective, every loss comes from the whole
 * step, as before (said on stderr; DP_GRADCHECK_VERBOSE=1 says which).
 *
 * What is compared, per parameter:
 *  - a direction over EVERY element: w_j = s_j * sign(ad_j) (a random sign
 *    where ad_j = 0), s_j = max(1, |p_j|). The analytic derivative along it,
 *    A = sum_j w_j ad_j, is compared with the finite difference along it.
 *    Aligned with the analytic gradient it sums |ad_j| over the whole
 *    tensor, the largest signal one loss difference can carry, and it
 *    catches a wrong scale (1 % off is 1 % off here), a wrong sign, or
 *    zeros (then the random signs give a sum near sqrt(n) times the typical
 *    true gradient). This is the precise test (below: a 1 % skew fails);
 *  - candidates: up to GC_CAND elements (all of a small tensor; else the
 *    first, the last and pseudo-random ones, a fixed function of the name);
 *  - elements one by one: the GC_ELEMS candidates with the largest |ad|
 *    (where the gradient is, not where the noise is), which localises a
 *    wrong element (a gradient written to the wrong index): a coarse test.
 *
 * Steps. An element's first step is h = GC_H (times s_j). The direction's
 * is GC_HDIR sqrt(GC_CAND / n) for n > GC_CAND elements, GC_HDIR for fewer:
 * the displacement |t w| is then that of GC_CAND elements moved by GC_HDIR
 * whatever the size of the tensor (a step chosen per tensor), so the loss
 * moves by about as much as the Taylor expansion allows while the signal
 * A grows with the tensor. What limited the old check (a direction over the
 * 64 candidates at h = 2^-5) was the signal: the loss is a float, and its
 * rounding noise (below) divided by h A was up to 1 % of A on the
 * transformers' 64-element gains and 0.2 % on the matrices.
 *
 * The finite difference. Along w, with D(t) = (L(+t) - L(-t)) / span (span:
 * the step actually applied in float, least squares over the perturbed
 * elements), from D(2h), D(h) and D(h/2) two Richardson extrapolations: R
 * from (2h, h) and R' from (h, h/2), the five-point stencil, whose
 * truncation error is O(h^4 L^(5)) instead of the central difference's
 * O(h^2 L^(3)). That allows a large first step, h = GC_H, so the rounding
 * noise below is small. On a smooth function R and R' agree to the noise;
 * where they do not (a kink such as max(x, 0) within reach, or curvature
 * too strong for h) the step shrinks by 4, GC_RETRIES times at most. The
 * estimate is R', its error bar R''s noise plus |R - R'|: what truncation,
 * kinks and rounding do to it, as far as they can be measured.
 *
 * Noise. Every computation is float32; the loss metric is a float rounded
 * from a double sum, and the forward pass rounds at every op, so loss
 * values at nearby points differ by rounding noise: delta = GC_NOISE float
 * ulps of |L| (differences of nearby losses come in whole ulps, one or
 * two). R''s noise is (8 + 8 + 1 + 1) delta / (12 h/2) = 3 delta / h per
 * unit of step (3 delta / (h s) per unit of gradient for one element).
 *
 * Verdicts. A quantity whose analytic and finite-difference values are
 * both within its error bar carries no information: it is not checked, and
 * a parameter with nothing checked is reported "not checked", never "ok"
 * (it does not fail the run: a parameter the loss does not depend on, such
 * as a dead relu layer's, has nothing to check). Otherwise:
 *  - the direction passes when |A - R'| <= GC_RTOL max(|A|, |R'|) +
 *    GC_KERR err. err is derived, per tensor, from the noise and the
 *    stencils' disagreement; GC_KERR = 2 because that disagreement
 *    estimates truncation, which a relu kink within the step can exceed
 *    (mlp8's fc7.b: 1.5x its bar). GC_RTOL = 1e-4 is what err does not
 *    see, the autodiff's own f32 rounding: a sum of K float terms is off by
 *    about sqrt(K) 2^-24 relative, 1.5e-5 for K = 6.6e4 (4 x 64 tokens times
 *    a 256-wide contraction), 1e-4 with room;
 *  - an element passes when |ad - R'| <= GC_RTOL_ELEM * S + err, S the
 *    largest |ad| or |R'| of the parameter's checked elements: a relative
 *    criterion against the sample's scale, since small elements are known
 *    only to the precision of the large ones. It is 10 %, not 5 %: one
 *    element's symmetric difference includes the kinks of every relu whose
 *    input crosses zero within the step, which the autodiff (one-sided at
 *    the kink) does not see, and in a deep relu MLP (models/mlp8.dp) that is
 *    up to 8 %; a wrong element is off by far more.
 * A parameter fails when its direction or a checked element fails. Each
 * verdict line prints the direction's relative difference and its error
 * bar (relative to |A|), and the largest share of a tolerance used.
 * Measured (tests/gradcheck.sh's sizes): on gpt2-tiny and llama the
 * direction's error bar is at most 2.3e-3 of |A| (a norm gain's; the
 * matrices' 1e-4 to 4e-4) and the actual difference at most 4.8e-4, so
 * correct gradients use at most 0.08 of the tolerance, and gradients 1 %
 * off either way fail every parameter by at least 2.06 times it (llama;
 * gpt2-tiny 5.6), 20 % off by 41 times; every model in tests/gradcheck/
 * and mlp8 passes (mlp8 at most 0.74 of it: kinks). The loss scale is
 * 1/global_batch (the program's own), which is fine: both sides carry it.
 *
 * Test hooks: DP_GRADCHECK_SKEW=s scales the analytic gradients by (1 + s)
 * (-1: all zero; 0.2 and -0.2: 20 % off; 0.01: 1 % off), so tests/gradcheck.sh
 * can show that a wrong gradient is caught. A list (up to GC_MAX_SKEWS),
 * DP_GRADCHECK_SKEW=0,0.2,-0.2,0.01,-0.01,
 * checks each skew against ONE set of finite differences (they are most of
 * the time): every skew of a list must be > -1, since a positive multiple
 * of the gradient has the same signs and order of |g|, hence the same
 * direction and elements; each verdict line and the summary then start
 * "skew S: ", and the exit status is the first skew's. DP_GRADCHECK_VERBOSE=1
 * prints every finite difference on stderr.
 *
 * Step files computing in bf16 or f16 (precision bf16, fp16, or a block's)
 * are refused in one line: the forward reads the 16-bit compute copies,
 * which the init program rounds from the f32 masters, so a perturbation of
 * a master never reaches it (what produced 1e32-sized "gradients" before),
 * and a perturbation of the copy itself is quantised to 2^-8 (bf16) or
 * 2^-11 (f16) relative steps, with every activation rounded as coarsely:
 * finite differences then measure rounding, not the derivative. The
 * gradients of a 16-bit step are the f32 graph's, rounded where values are
 * stored; the check is of that graph, compiled in f32.
 *
 * Sharded step files are refused: their step program re-gathers parameters
 * from shards (and the init program cut them with SHARD), so an in-place
 * perturbation would not reach the forward. The mathematics is the same as
 * ddp's; check that.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"

#define GC_CAND 64       /* candidate elements per parameter (element picks; the
                            direction's step, see the top) */
#define GC_ELEMS 4       /* of which checked one by one */
#define GC_H 0x1p-5      /* an element's first step (3.1e-2), relative to max(1, |p|) */
#define GC_HDIR 0x1p-3   /* the direction's first step (0.125) at GC_CAND elements or fewer */
#define GC_RETRIES 4     /* smaller steps, h / 4 each */
#define GC_RTOL 1e-4     /* the direction's tolerance beyond its error bar: autodiff's rounding */
#define GC_KERR 2.0      /* ... and its error bar counts this many times (kinks: see the top) */
#define GC_RTOL_ELEM 0.1 /* an element's, relative to the sample's largest */
#define GC_NOISE 2.0     /* rounding noise of one loss value, in float ulps of |L| */

/* The instructions of the step program the loss depends on (see the top). */
typedef struct {
	uint32_t *instr; /* kernel instructions, in program order */
	uint32_t n;
} Slice;

/* One parameter under test. */
typedef struct {
	Exec *x;
	int pt;          /* the parameter's tensor id */
	float *p;        /* host copy of the parameter (perturbed, then restored) */
	float *save;     /* the perturbed elements' values (as many as p) */
	int64_t *all;    /* 0, 1, ..., n - 1 (the direction's elements) */
	double *w;       /* the direction (as many as p) */
	double delta;    /* rounding noise of one loss value */
	int verbose;
	const char *name;
	const Slice *fwd; /* the loss's slice; NULL: the whole program every time */
} Gc;

/* A finite difference along a direction: value (per unit of step) and its
 * error bar. */
typedef struct {
	double value, err;
} Fd;

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

/* The loss of micro-batch 0 (and, in the gradient tensors, its gradient). */
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

/* Arena bytes [lo, hi) of space `space`: what the slice must keep right. */
typedef struct {
	uint64_t lo, hi;
	uint8_t space;
} Bytes;

static int touches(const Bytes *b, int nb, const DpTensor *t)
{
	for (int i = 0; i < nb; i++)
		if (b[i].space == t->space && t->offset < b[i].hi && b[i].lo < t->offset + t->nbytes)
			return 1;
	return 0;
}

/* Does the walk of micro-batch x->micro of step x->step (last = 0: no
 * DP_IF_LAST) run instruction in? exec.c's walk decides it the same way. */
static int walked(const Exec *x, const DpInstr *in)
{
	const DpStep *s = x->s;
	return !(in->flags & DP_IF_LAST) && !(in->stage1 && dp_instr_stage(in) != x->pp_stage) &&
	       !(in->flags & DP_IF_COMPRESSED && x->step < s->cfg.compress_start) &&
	       !(in->flags & DP_IF_PLAIN && x->step >= s->cfg.compress_start);
}

/* The loss's slice: walking the step program backwards from the loss
 * metric, every instruction that writes arena bytes a later slice member
 * (or the loss) reads, by bytes rather than tensor ids (a parameter is a
 * view into its flat buffer; temporaries share bytes). Returns 0 with
 * sl->n == 0 when there is none to take: the slice would need a collective,
 * SHARD or host instruction, which only the whole walk runs. LOADs and
 * events are left out: the data tensors are persistent (passes/memplan.c)
 * and still hold micro-batch 0 after the unperturbed run, and one kernel
 * at a time needs no events. */
static int loss_slice(const Exec *x, Slice *sl, RtErr *e)
{
	const DpStep *s = x->s;
	uint32_t np = s->nprog[DP_PROG_STEP];
	int cap = 1 + (int)np * (DP_MAX_IN + 1), nb = 0;
	Bytes *b = malloc((size_t)cap * sizeof *b);
	sl->instr = malloc((size_t)(np ? np : 1) * sizeof *sl->instr);
	sl->n = 0;
	if (!b || !sl->instr) {
		free(b);
		return RT_FAIL(e, "out of memory (--check-grads)");
	}
	const DpTensor *lt = &s->tensors[s->metrics.loss];
	b[nb++] = (Bytes){lt->offset, lt->offset + lt->nbytes, lt->space};
	uint32_t k = np;
	int whole = 0;
	for (uint32_t i = np; i-- > 0 && !whole;) {
		const DpInstr *in = &s->prog[DP_PROG_STEP][i];
		if (!walked(x, in))
			continue;
		int w = in->out >= 0 && touches(b, nb, &s->tensors[in->out]);
		for (int j = 0; j < DP_MAX_IN && !w; j++)
			w = dp_writes_in(in, j) && touches(b, nb, &s->tensors[in->in[j]]);
		if (!w)
			continue;
		switch (dp_op_class(in->op)) {
		case DP_OPC_KERNEL:
			break;
		case DP_OPC_LOAD:
		case DP_OPC_EVENT:
			continue;
		default:
			whole = 1;
			continue;
		}
		sl->instr[--k] = i;
		for (int j = 0; j < DP_MAX_IN; j++)
			if (in->in[j] >= 0) {
				const DpTensor *t = &s->tensors[in->in[j]];
				b[nb++] = (Bytes){t->offset, t->offset + t->nbytes, t->space};
			}
		if (dp_reads_out(in)) {
			const DpTensor *t = &s->tensors[in->out];
			b[nb++] = (Bytes){t->offset, t->offset + t->nbytes, t->space};
		}
	}
	free(b);
	if (!whole) {
		sl->n = np - k;
		memmove(sl->instr, sl->instr + k, sl->n * sizeof *sl->instr);
	}
	return 0;
}

/* The loss of micro-batch 0 by the slice alone (no gradients). */
static int loss_sliced(Exec *x, const Slice *sl, double *loss, RtErr *e)
{
	float l;
	RT_CHECK(exec_zero_metrics(x, e));
	for (uint32_t i = 0; i < sl->n; i++)
		RT_CHECK(exec_run_kernel(x, DP_PROG_STEP, sl->instr[i], e));
	RT_CHECK(exec_tensor_read(x, x->s->metrics.loss, &l, e));
	*loss = l;
	return 0;
}

/* Does the slice give the whole walk's loss, bit for bit, with every
 * parameter moved (by GC_H relative, alternating signs)? The whole walk runs
 * first, at the unmoved point: an instruction the slice missed would leave
 * that point's values where the moved ones belong. *ok is 0 when not. */
static int slice_agrees(Exec *x, const Slice *sl, int *ok, RtErr *e)
{
	const DpStep *s = x->s;
	float **keep = calloc(s->ntensors, sizeof *keep);
	double full = 0, part = 0;
	int rc = keep ? loss_at(x, &full, e) : RT_FAIL(e, "out of memory (--check-grads)");
	for (uint32_t i = 0; i < s->ntensors && !rc; i++) {
		const DpTensor *t = &s->tensors[i];
		if (t->kind != DP_T_PARAM || !t->nbytes)
			continue;
		int64_t n = exec_numel(t);
		float *v = malloc((size_t)n * sizeof *v + 1);
		if (!v || !(keep[i] = malloc((size_t)n * sizeof *v + 1))) {
			free(v);
			rc = RT_FAIL(e, "out of memory (--check-grads)");
			break;
		}
		if (!(rc = exec_tensor_read(x, (int)i, keep[i], e))) {
			for (int64_t j = 0; j < n; j++)
				v[j] = (float)(keep[i][j] + (j & 1 ? -GC_H : GC_H) * fmax(1.0, fabs(keep[i][j])));
			rc = exec_tensor_write(x, (int)i, v, e);
		}
		free(v);
	}
	if (!rc && !(rc = loss_sliced(x, sl, &part, e)))
		rc = loss_at(x, &full, e);
	*ok = !rc && part == full;
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (keep && keep[i]) {
			if (!rc)
				rc = exec_tensor_write(x, (int)i, keep[i], e);
			free(keep[i]);
		}
	free(keep);
	if (!rc && !*ok)
		fprintf(stderr, "gradcheck: the loss's %u instructions give %.9g where the whole step "
			"gives %.9g: every loss from the whole step\n", sl->n, part, full);
	return rc;
}

/* L at p + t * w on elements idx[0..m); *applied gets sum_j w_j * (the
 * shift of element j actually applied in float). p is restored on the host;
 * the next write (or the caller's final one) restores the backend's copy. */
static int loss_shifted(Gc *c, const int64_t *idx, const double *w, int64_t m, double t,
			double *loss, double *applied, RtErr *e)
{
	float *save = c->save;
	*applied = 0;
	for (int64_t j = 0; j < m; j++) {
		save[j] = c->p[idx[j]];
		c->p[idx[j]] = (float)((double)save[j] + t * w[j]);
		*applied += w[j] * ((double)c->p[idx[j]] - save[j]);
	}
	int rc = exec_tensor_write(c->x, c->pt, c->p, e);
	for (int64_t j = 0; j < m; j++)
		c->p[idx[j]] = save[j];
	if (rc)
		return rc;
	return c->fwd ? loss_sliced(c->x, c->fwd, loss, e) : loss_at(c->x, loss, e);
}

/* One central difference along w at step t: per unit of t. */
static int central(Gc *c, const int64_t *idx, const double *w, int64_t m, double ww, double t,
		   double *d, RtErr *e)
{
	double lp, lm, ap, am;
	RT_CHECK(loss_shifted(c, idx, w, m, t, &lp, &ap, e));
	RT_CHECK(loss_shifted(c, idx, w, m, -t, &lm, &am, e));
	*d = (lp - lm) / ((ap - am) / ww);
	return 0;
}

/* The derivative of L along w (elements idx[0..m)): R' and its error bar,
 * shrinking the step while R and R' disagree (see the top). The next 2h is
 * this h/2, so a smaller step costs two loss pairs, not three. */
static int derivative(Gc *c, const int64_t *idx, const double *w, int64_t m, double h, Fd *out,
		      RtErr *e)
{
	double ww = 0, dh, d2h, dhalf;
	for (int64_t j = 0; j < m; j++)
		ww += w[j] * w[j];
	RT_CHECK(central(c, idx, w, m, ww, 2 * h, &d2h, e));
	for (int r = 0;; r++, h /= 4, d2h = dhalf) {
		RT_CHECK(central(c, idx, w, m, ww, h, &dh, e));
		RT_CHECK(central(c, idx, w, m, ww, h / 2, &dhalf, e));
		double R = (4 * dh - d2h) / 3, Rf = (4 * dhalf - dh) / 3, disc = fabs(R - Rf);
		double noise = 3 * c->delta / h; /* of R': (8 + 8 + 1 + 1) delta / (12 h/2) */
		out->value = Rf;
		out->err = noise + disc;
		if (c->verbose)
			fprintf(stderr, "  %s: h %.2e D(2h) %.6e D(h) %.6e D(h/2) %.6e R %.6e R' %.6e "
				"err %.1e\n", c->name, h, d2h, dh, dhalf, R, Rf, out->err);
		if (disc <= 2 * noise || r == GC_RETRIES)
			return 0;
	}
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
		if (s->prog[DP_PROG_INIT][i].op == DP_OP_SHARD)
			return 1;
	for (uint32_t i = 0; i < s->nprog[DP_PROG_STEP]; i++) {
		unsigned op = s->prog[DP_PROG_STEP][i].op;
		if (op == DP_OP_REDUCE_SCATTER || op == DP_OP_ALL_GATHER)
			return 1;
	}
	return 0;
}

/* Up to GC_CAND distinct elements of n: all of a small tensor; else the
 * first, the last and pseudo-random ones (a function of the name only). */
static int candidates(const char *name, int64_t n, int64_t *idx)
{
	if (n <= GC_CAND) {
		for (int64_t i = 0; i < n; i++)
			idx[i] = i;
		return (int)n;
	}
	int m = 0;
	idx[m++] = 0;
	idx[m++] = n - 1;
	uint64_t h = init_hash_name(name);
	for (uint64_t k = 0; m < GC_CAND; k++) {
		int64_t i = (int64_t)(init_mix64(h + k) % (uint64_t)n);
		int dup = 0;
		for (int j = 0; j < m && !dup; j++)
			dup = idx[j] == i;
		if (!dup)
			idx[m++] = i;
	}
	return m;
}

/* Verdicts of one parameter. */
typedef enum { GC_OK, GC_FAILED, GC_UNCHECKED } GcVerdict;
static const char *const verdict_names[] = {"ok", "FAILED"};

#define GC_MAX_SKEWS 6

/* The verdict of one skew f (the analytic side scaled by f) from the
 * finite differences: the direction (a, dir) and k elements (ad, fd, eb). */
static GcVerdict verdict(const Gc *c, const char *tag, double f, double a, const Fd *dir, int64_t m,
			 const int64_t *pick, const double *ad0, const double *fd, const double *eb,
			 int k)
{
	int checked = 0, bad = 0;
	double worst = 0, share = 0, S = 0, ad[GC_ELEMS];
	fflush(stdout);
	a *= f;
	for (int i = 0; i < k; i++)
		ad[i] = ad0[i] * f;
	for (int i = 0; i < k; i++)
		if (fmax(fabs(ad[i]), fabs(fd[i])) > eb[i])
			S = fmax(S, fmax(fabs(ad[i]), fabs(fd[i])));
	for (int i = 0; i < k; i++) {
		if (fmax(fabs(ad[i]), fabs(fd[i])) <= eb[i])
			continue; /* both within the error bar: no information */
		double diff = fabs(ad[i] - fd[i]), tol = GC_RTOL_ELEM * S + eb[i];
		checked++;
		worst = fmax(worst, diff / S);
		share = fmax(share, diff / tol);
		if (diff > tol) {
			if (!bad)
				fprintf(stderr, "%sgradcheck %s[%lld]: autodiff %.6g, finite difference "
					"%.6g (+- %.1e)\n", tag, c->name, (long long)pick[i], ad[i], fd[i],
					eb[i]);
			bad++;
		}
	}
	double scale = fmax(fabs(a), fabs(dir->value)), drel = -1, dbar = -1;
	if (scale > dir->err) {
		double diff = fabs(a - dir->value), tol = GC_RTOL * scale + GC_KERR * dir->err;
		drel = diff / scale;
		dbar = dir->err / scale;
		checked++;
		worst = fmax(worst, diff / scale);
		share = fmax(share, diff / tol);
		if (diff > tol) {
			fprintf(stderr, "%sgradcheck %s: along %lld elements: autodiff %.6g, finite "
				"difference %.6g (+- %.1e)\n", tag, c->name, (long long)m, a, dir->value, dir->err);
			bad++;
		}
	}
	GcVerdict v = bad ? GC_FAILED : checked ? GC_OK : GC_UNCHECKED;
	fflush(stderr);
	if (v == GC_UNCHECKED)
		printf("%sgradcheck %s: %d elements and a direction over %lld, every value within the "
		       "error bar (%.1e) not checked\n", tag, c->name, k, (long long)m, dir->err);
	else
		printf("%sgradcheck %s: %d elements and a direction over %lld (%.1e off, error bar "
		       "%.1e), max rel err %.1e (%.2f of the tolerance) %s\n", tag, c->name, k,
		       (long long)m, drel, dbar, worst, share, verdict_names[v]);
	/* whole lines in order with stderr's (2>&1 into one file: a block-buffered
	 * stdout would be cut mid-line by the next parameter's stderr lines) */
	fflush(stdout);
	return v;
}

/* Check one parameter: its analytic gradient g, candidates, the direction,
 * then the elements with the largest |g|; a verdict per skew factor
 * fac[0..nf) (g scaled by each; tags[] prefix their lines). */
static int check_param(Gc *c, const float *g, int64_t n, const double *fac, char tags[][32],
		       int nf, GcVerdict *v, RtErr *e)
{
	int64_t idx[GC_CAND] = {0}, pick[GC_ELEMS];
	double ad[GC_ELEMS], fd[GC_ELEMS], eb[GC_ELEMS];
	int m = candidates(c->name, n, idx);
	uint64_t hn = init_hash_name(c->name);

	/* the direction over every element, at a step whose displacement is
	 * GC_CAND elements' at GC_H (see the top) */
	double a = 0, *w = c->w;
	for (int64_t j = 0; j < n; j++) {
		double s = fmax(1.0, fabs((double)c->p[j]));
		double sign = g[j] > 0 ? 1 : g[j] < 0 ? -1
			      : (init_mix64(hn ^ (uint64_t)j) & 1) ? 1 : -1;
		c->all[j] = j;
		w[j] = s * sign;
		a += w[j] * g[j];
	}
	Fd dir;
	RT_CHECK(derivative(c, c->all, w, n, GC_HDIR * sqrt(fmin(1.0, (double)GC_CAND / (double)n)),
			    &dir, e));

	/* the GC_ELEMS candidates with the largest |g| (ties: candidate order) */
	int k = m < GC_ELEMS ? m : GC_ELEMS;
	for (int i = 0; i < k; i++) {
		int best = -1;
		for (int j = 0; j < m; j++) {
			int taken = 0;
			for (int q = 0; q < i && !taken; q++)
				taken = pick[q] == idx[j];
			if (!taken && (best < 0 || fabsf(g[idx[j]]) > fabsf(g[idx[best]])))
				best = j;
		}
		pick[i] = idx[best];
		double s = fmax(1.0, fabs((double)c->p[pick[i]]));
		Fd f;
		RT_CHECK(derivative(c, &pick[i], &s, 1, GC_H, &f, e));
		ad[i] = g[pick[i]];
		fd[i] = f.value / s; /* back to d L / d p */
		eb[i] = f.err / s;
	}
	RT_CHECK(exec_tensor_write(c->x, c->pt, c->p, e)); /* the unperturbed parameter */
	for (int f = 0; f < nf; f++)
		v[f] = verdict(c, tags[f], fac[f], a, &dir, n, pick, ad, fd, eb, k);
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
	for (unsigned dt = DP_BF16; dt <= DP_F16; dt++)
		if (dp_step_has_dtype(s, dt))
			return RT_FAIL(e, "--check-grads needs an f32 step file: this one computes in "
				       "%s (finite differences through 16-bit roundings measure the "
				       "rounding; the gradients are the f32 graph's: compile without "
				       "precision %s and check that)",
				       dp_dtype_names[dt], dt == DP_F16 ? "fp16" : "bf16");
	if (x->comm->world != 1)
		return RT_FAIL(e, "--check-grads runs on one rank (this run has %d)", x->comm->world);
	if (s->metrics.loss < 0)
		return RT_FAIL(e, "--check-grads: the step file has no loss metric");
	x->step = 0;
	x->micro = 0;
	/* the skews: one (the gradient scaled before anything sees it) or a
	 * list of factors > 0 checked against one set of differences */
	const char *skew_env = getenv("DP_GRADCHECK_SKEW");
	double fac[GC_MAX_SKEWS] = {1.0};
	char tags[GC_MAX_SKEWS][32] = {""};
	int nf = 1;
	if (skew_env && *skew_env) {
		const char *p = skew_env;
		for (nf = 0;; p++) {
			char *end;
			double sk = strtod(p, &end);
			if (end == p || nf == GC_MAX_SKEWS || (*end && *end != ','))
				return RT_FAIL(e, "DP_GRADCHECK_SKEW='%s': at most %d numbers, comma-"
					       "separated", skew_env, GC_MAX_SKEWS);
			fac[nf] = 1.0 + sk;
			snprintf(tags[nf], sizeof tags[nf], "skew %.*s: ", (int)(end - p), p);
			nf++;
			p = end;
			if (!*p)
				break;
		}
		for (int f = 0; nf > 1 && f < nf; f++)
			if (fac[f] <= 0)
				return RT_FAIL(e, "DP_GRADCHECK_SKEW='%s': a list's skews must be > -1 "
					       "(they share the finite differences of one gradient's signs "
					       "and order); give -1 alone", skew_env);
		if (nf == 1)
			tags[0][0] = 0;
	}
	double pre = nf == 1 ? fac[0] : 1.0; /* a single skew scales g itself */
	if (nf == 1)
		fac[0] = 1.0;
	const char *verbose = getenv("DP_GRADCHECK_VERBOSE");

	int count[GC_MAX_SKEWS][3] = {{0}}, nparams = 0, rc = 0, agree = 0;
	float *g = NULL;
	Gc c = {.x = x, .verbose = verbose && *verbose && strcmp(verbose, "0")};
	Slice fwd = {0};
	rc = loss_slice(x, &fwd, e);
	if (!rc && fwd.n)
		rc = slice_agrees(x, &fwd, &agree, e);
	if (agree)
		c.fwd = &fwd;
	if (!rc && c.verbose)
		fprintf(stderr, "gradcheck: the loss from %s (%u of the step's %u instructions)\n",
			c.fwd ? "its own instructions" : "the whole step", c.fwd ? fwd.n : s->nprog[DP_PROG_STEP],
			s->nprog[DP_PROG_STEP]);
	for (uint32_t pi = 0; pi < s->ntensors && !rc; pi++) {
		const DpTensor *pt = &s->tensors[pi];
		if (pt->kind != DP_T_PARAM || !pt->nbytes)
			continue;
		c.name = dpstep_str(s, pt->name);
		c.pt = (int)pi;
		int gi = find_grad(s, c.name);
		if (gi < 0 || !s->tensors[gi].nbytes) {
			rc = RT_FAIL(e, "--check-grads: parameter '%s' has no gradient tensor 'grad.%s'",
				     c.name, c.name);
			break;
		}
		nparams++;
		int64_t n = exec_numel(pt);
		free(c.p);
		free(g);
		free(c.save);
		free(c.all);
		free(c.w);
		c.p = malloc((size_t)n * sizeof *c.p + 1);
		g = malloc((size_t)n * sizeof *g + 1);
		c.save = malloc((size_t)n * sizeof *c.save + 1);
		c.all = malloc((size_t)n * sizeof *c.all + 1);
		c.w = malloc((size_t)n * sizeof *c.w + 1);
		if (!c.p || !g || !c.save || !c.all || !c.w) {
			rc = RT_FAIL(e, "out of memory (--check-grads of '%s')", c.name);
			break;
		}
		/* the analytic gradient and the loss of the unperturbed point */
		double l0;
		if ((rc = loss_at(x, &l0, e)) || (rc = exec_tensor_read(x, gi, g, e)) ||
		    (rc = exec_tensor_read(x, (int)pi, c.p, e)))
			break;
		for (int64_t i = 0; i < n; i++)
			g[i] = (float)(g[i] * pre);
		int ex;
		frexp(l0, &ex); /* |l0| in [2^(ex-1), 2^ex): a float ulp is 2^(ex-24) */
		c.delta = GC_NOISE * ldexp(1.0, ex - 24);
		GcVerdict v[GC_MAX_SKEWS];
		if ((rc = check_param(&c, g, n, fac, tags, nf, v, e)))
			break;
		for (int f = 0; f < nf; f++)
			count[f][v[f]]++;
	}
	free(c.p);
	free(g);
	free(c.save);
	free(c.all);
	free(c.w);
	free(fwd.instr);
	RT_CHECK(rc);
	RT_CHECK(zero_grads(x, e));
	RT_CHECK(exec_zero_metrics(x, e));
	if (!nparams)
		return RT_FAIL(e, "--check-grads: the step file has no parameters");
	for (int f = 0; f < nf; f++) {
		printf("%sgradcheck: %d of %d parameters passed", tags[f], count[f][GC_OK], nparams);
		if (count[f][GC_FAILED])
			printf(", %d FAILED", count[f][GC_FAILED]);
		if (count[f][GC_UNCHECKED])
			printf(", %d not checked (every sampled value within the error bar)",
			       count[f][GC_UNCHECKED]);
		printf("\n");
	}
	fflush(stdout);
	return count[0][GC_FAILED] ? 1 : 0;
}
