/*
 * sampler.c - text from a language model (dpexec --sample, --sample-every):
 * the prompt read and checked, the sample program run once per new token,
 * the token drawn. The contract is in sampler.h.
 *
 * The draw. temperature 0: the first largest logit (greedy). Otherwise the
 * candidates are every token, or the k largest logits (ties: the lower id),
 * weighted exp((l - max) / T) in double, and the token is the first, in id
 * order, whose running sum of weights exceeds u * total, with u the Philox
 * draw of (seed, the new token's position in the sequence)
 * (dp_sample_uniform, runtime/dropout.h). Rank 0 draws; the others receive
 * its token, so a layout whose logits differ in the last bits on some rank
 * (tp's all-reduce) still continues one sequence.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dropout.h"
#include "sampler.h"

/* The prompt as token ids into sp->seq. */
static int read_prompt(Sampler *sp, RtErr *e)
{
	const char *p = sp->o.prompt ? sp->o.prompt : sp->bytes ? "\n" : "0"; /* sample_every's */
	size_t len = strlen(p);
	sp->seq = malloc((len + (size_t)sp->o.tokens + 1) * sizeof *sp->seq);
	if (!sp->seq)
		return RT_FAIL(e, "out of memory (--sample)");
	int64_t n = 0;
	if (sp->bytes) {
		for (size_t i = 0; i < len; i++) {
			unsigned char c = (unsigned char)p[i];
			if (c >= sp->vocab)
				return RT_FAIL(e, "--sample: byte 0x%02x at offset %zu of the prompt is not "
					       "in the model's vocabulary of %" PRId64 " bytes",
					       c, i, sp->vocab);
			sp->seq[n++] = c;
		}
	} else {
		for (const char *q = p; *q;) {
			if (isspace((unsigned char)*q) || *q == ',') {
				q++;
				continue;
			}
			char *end;
			errno = 0;
			long long v = strtoll(q, &end, 10);
			if (end == q || errno || v < 0 || v >= sp->vocab ||
			    (*end && !isspace((unsigned char)*end) && *end != ','))
				return RT_FAIL(e, "--sample: '%.*s' (token %" PRId64 " of the prompt) is not "
					       "a token id below the vocabulary of %" PRId64 " (this model's "
					       "prompt is token ids, separated by spaces or commas)",
					       (int)strcspn(q, " \t\n,"), q, n + 1, sp->vocab);
			sp->seq[n++] = (int32_t)v;
			q = end;
		}
	}
	if (n == 0)
		return RT_FAIL(e, "--sample: the prompt is empty: give at least one %s",
			       sp->bytes ? "character" : "token id");
	if (n > sp->ctx)
		return RT_FAIL(e, "--sample: the prompt has %" PRId64 " tokens, more than the model's "
			       "context of %" PRId64, n, sp->ctx);
	sp->nprompt = sp->nseq = n;
	return 0;
}

int sampler_init(Sampler *sp, const DpStep *s, const SampleOpts *o, RtErr *e)
{
	memset(sp, 0, sizeof *sp);
	sp->o = *o;
	sp->tokens = s->metrics.sample_tokens;
	sp->logits = s->metrics.sample_logits;
	if (sp->logits < 0)
		return RT_FAIL(e, "cannot sample: %s has no sample program: only a language model has "
			       "one (a cross_entropy loss over token labels from tokens(...)), "
			       "compiled with pp = 1 and cp = 1", dpstep_str(s, s->source)[0] ?
			       dpstep_str(s, s->source) : "the step file");
	const DpTensor *t = &s->tensors[sp->tokens], *l = &s->tensors[sp->logits];
	sp->ctx = t->dims[1]; /* [1, ctx]: the decoder checked the one row */
	sp->vocab = l->dims[l->ndim - 1];
	sp->ld = dp_ld(l); /* its rows' stride: vocab, or more (passes/padvocab.c) */
	sp->bytes = sp->vocab <= 256;
	RT_CHECK(read_prompt(sp, e));
	sp->win = malloc((size_t)sp->ctx * sizeof *sp->win);
	sp->lg = malloc((size_t)(sp->ctx * sp->ld) * sizeof *sp->lg);
	sp->p = malloc((size_t)sp->vocab * sizeof *sp->p);
	sp->order = malloc((size_t)sp->vocab * sizeof *sp->order);
	if (!sp->win || !sp->lg || !sp->p || !sp->order)
		return RT_FAIL(e, "out of memory (--sample)");
	return 0;
}

void sampler_free(Sampler *sp)
{
	free(sp->seq);
	free(sp->win);
	free(sp->lg);
	free(sp->p);
	free(sp->order);
	memset(sp, 0, sizeof *sp);
}

static const float *sort_logits; /* qsort's comparison reads them (one thread) */

static int by_logit(const void *a, const void *b)
{
	int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
	float x = sort_logits[i], y = sort_logits[j];
	return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

/* The token after the sequence, from its last position's logits l. */
static int32_t draw(Sampler *sp, const float *l)
{
	int64_t v = sp->vocab, best = 0;
	for (int64_t i = 1; i < v; i++)
		if (l[i] > l[best])
			best = i;
	if (sp->o.temperature <= 0)
		return (int32_t)best;
	double *p = sp->p;
	for (int64_t i = 0; i < v; i++)
		p[i] = 1;
	if (sp->o.top_k > 0 && sp->o.top_k < v) {
		for (int64_t i = 0; i < v; i++)
			sp->order[i] = (int32_t)i;
		sort_logits = l;
		qsort(sp->order, (size_t)v, sizeof *sp->order, by_logit);
		for (int64_t i = sp->o.top_k; i < v; i++)
			p[sp->order[i]] = 0;
	}
	double total = 0;
	for (int64_t i = 0; i < v; i++) {
		p[i] = p[i] > 0 ? exp(((double)l[i] - l[best]) / sp->o.temperature) : 0;
		total += p[i];
	}
	double u = dp_sample_uniform(sp->o.seed, (uint64_t)sp->nseq) * total, run = 0;
	int32_t last = (int32_t)best;
	for (int64_t i = 0; i < v; i++) {
		if (p[i] <= 0)
			continue;
		run += p[i];
		last = (int32_t)i;
		if (u < run)
			return (int32_t)i;
	}
	return last; /* u * total rounded up to the sum */
}

/* The prompt's logits, one line per position (%.9g), rank 0. */
static int write_logits(const Sampler *sp, RtErr *e)
{
	OutFile f;
	char err[1024];
	if (out_open(&f, sp->o.logits, err, sizeof err))
		return RT_FAIL(e, "--sample-logits: %s", err);
	char buf[32];
	for (int64_t t = 0; t < sp->nprompt; t++)
		for (int64_t i = 0; i < sp->vocab; i++) {
			int n = snprintf(buf, sizeof buf, "%.9g%c", sp->lg[t * sp->ld + i],
					 i + 1 < sp->vocab ? ' ' : '\n');
			out_write(&f, buf, (size_t)n);
		}
	if (out_commit(&f, err, sizeof err))
		return RT_FAIL(e, "--sample-logits: %s", err);
	return 0;
}

/* The sequence: text (bytes) or ids. */
static void print_seq(const Sampler *sp, FILE *out)
{
	for (int64_t i = 0; i < sp->nseq; i++) {
		if (sp->bytes)
			fputc(sp->seq[i], out);
		else
			fprintf(out, "%s%" PRId32, i ? " " : "", sp->seq[i]);
	}
	fputc('\n', out);
	fflush(out);
}

int sampler_generate(Sampler *sp, Exec *x, const World *w, int rank, FILE *out, RtErr *e)
{
	int64_t ctx = sp->ctx;
	sp->nseq = sp->nprompt;
	for (int64_t k = 0; k < sp->o.tokens; k++) {
		int64_t start = sp->nseq > ctx ? sp->nseq - ctx : 0, n = sp->nseq - start;
		for (int64_t j = 0; j < ctx; j++)
			sp->win[j] = sp->seq[start + (j < n ? j : n - 1)];
		RT_CHECK(exec_tensor_write(x, sp->tokens, sp->win, e));
		RT_CHECK(exec_run(x, DP_PROG_SAMPLE, 1, e));
		RT_CHECK(exec_tensor_read(x, sp->logits, sp->lg, e));
		unsigned dt = x->s->tensors[sp->logits].dtype;
		if (dp_is_half(dt)) /* bf16 or f16: widened in place, from the end */
			for (int64_t i = ctx * sp->ld - 1; i >= 0; i--)
				sp->lg[i] = rt_from_half(dt, ((const uint16_t *)sp->lg)[i]);
		if (k == 0 && rank == 0 && sp->o.logits)
			RT_CHECK(write_logits(sp, e));
		int32_t next = rank == 0 ? draw(sp, sp->lg + (n - 1) * sp->ld) : 0;
		RT_CHECK(world_bcast(w, &next, (int)sizeof next, e));
		sp->seq[sp->nseq++] = next;
	}
	if (rank == 0)
		print_seq(sp, out);
	return 0;
}
