/*
 * sampler.h - text from a language model: dpexec --sample (runtime/sampler.c).
 *
 * The step file's sample program (passes/sample.c) is the training forward
 * up to the logits at batch 1, with dropout off, reading its tokens from
 * metrics.sample_tokens (a temporary of its own: it shares bytes with the
 * step's temporaries, so the sampler writes it before every run). For each
 * new token the sampler writes the window (the last ctx tokens of the
 * sequence so far, the positions after it filled with its last token: the
 * model is causal, so they change nothing before them), runs the program,
 * reads the logits at the window's last position and draws the next token.
 * Rank 0 draws and broadcasts it, so every rank of every layout continues
 * the same sequence; the draw is the Philox of runtime/dropout.h keyed by
 * (seed, position), so the same logits give the same token on every
 * backend.
 *
 * Tokens: a model of at most 256 tokens is byte-level (tools/text2shard's
 * shards: token = byte): the prompt is text, a byte at or above the
 * vocabulary is an error, and the sample prints as text. A larger
 * vocabulary reads the prompt as token ids (separated by spaces or commas)
 * and prints ids.
 */
#ifndef DP_SAMPLER_H
#define DP_SAMPLER_H

#include <stdio.h>

#include "exec.h"
#include "world.h"

typedef struct {
	const char *prompt;   /* --sample; NULL (sample_every without it): a newline, or
	                         token 0 for a model of token ids */
	int64_t tokens;       /* --tokens: how many to generate */
	double temperature;   /* --temperature: 0 greedy (the first largest logit) */
	int64_t top_k;        /* --top-k: draw among the k largest logits; 0 all */
	uint64_t seed;        /* --seed, else the step file's seed */
	const char *logits;   /* --sample-logits FILE: the prompt's logits, rank 0 */
} SampleOpts;

typedef struct {
	SampleOpts o;
	int32_t tokens, logits;       /* tensor ids */
	int64_t ctx, vocab, ld; /* ld: the logits' row stride (padded rows) */
	int bytes;                    /* byte-level: text in, text out */
	int32_t *seq;                 /* prompt, then the generated tokens */
	int64_t nprompt, nseq;
	int32_t *win;                 /* ctx: the tokens tensor */
	float *lg;                    /* ctx * vocab: the logits tensor */
	double *p;                    /* vocab: the draw's weights */
	int32_t *order;               /* vocab: ids by logit (top-k) */
} Sampler;

/* The step file's sample program and the prompt checked (every rank, before
 * any work); sp is ready for sampler_generate. */
int sampler_init(Sampler *sp, const DpStep *s, const SampleOpts *o, RtErr *e);
/* Generate o.tokens tokens after the prompt on every rank (collectives: all
 * ranks call it); rank 0 writes the sequence to out (text, or ids), and with
 * o.logits the prompt's logits. */
int sampler_generate(Sampler *sp, Exec *x, const World *w, int rank, FILE *out, RtErr *e);
void sampler_free(Sampler *sp);

#endif
