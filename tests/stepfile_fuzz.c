/*
 * stepfile_fuzz.c - the step-file decoder against broken input, in-process.
 *
 *   stepfile_fuzz [STEP.bin]     (no argument: a small built-in step file)
 *
 * Takes a valid step file and checks that dpstep_decode
 *  - round-trips it (decode, encode: the same bytes);
 *  - refuses every truncation (each length below 256, then strided) with a
 *    message, "truncated" once the magic is there;
 *  - refuses every single-byte flip when the checksum is left alone, with the
 *    message the header position calls for (magic, version, crc, size, body);
 *  - given flips and random multi-byte mutations with the checksum fixed up
 *    (so they reach the record parser and the semantic validators), either
 *    refuses with a message or returns a step whose invariants hold (every
 *    stored tensor inside the arena, every id in range) - never a crash;
 *  - names a newer and an older version, a non-step file, and survives lying
 *    counts;
 *  - enforces which kernels each program may hold (INIT in init, SHARD in
 *    init/step, SAVE in export, LOAD in step/eval, no collective in init) and the
 *    operands of INIT/SAVE/SHARD, and the strategy's range;
 * and that dpstep_write_file is atomic (no temp file left behind on failure
 * or success). Run it under ASan/UBSan with `make test SAN=1`.
 * Prints "stepfile_fuzz: N passed, M failed"; exit status 1 on any failure.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "settings.h"
#include "stepfile.h"

/* dp_replicate and dp_shard: the data-parallel axes' mask */
#define AXES_DP (DP_AXIS_BIT(DP_AXIS_REPLICATE) | DP_AXIS_BIT(DP_AXIS_SHARD))

static int npass, nfail;

static void check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int cond, const char *fmt, ...)
{
	if (cond) {
		npass++;
		return;
	}
	nfail++;
	if (nfail > 30)
		return; /* enough detail */
	va_list ap;
	va_start(ap, fmt);
	printf("  FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
}

/* ---- a small valid step file, when no file is given ---- */

static DpStep *builtin_step(void)
{
	static char strs[] = "x\0y\0w\0grad.w\0loss\0logits\0d.logits\0";
	static DpTensor t[7];
	static DpInstr prog[8];
	static DpInstr eprog[2];
	static DpInstr iprog[1], xprog[1];
	static DpSource src[2];
	static DpStep s;
	const uint32_t nm[7] = {0, 2, 4, 6, 13, 18, 25};
	const int kind[7] = {DP_T_DATA, DP_T_DATA, DP_T_PARAM, DP_T_GRAD, DP_T_METRIC, DP_T_ACT,
			     DP_T_ACT};
	const int64_t d0[7] = {4, 4, 3, 3, 1, 4, 4}, d1[7] = {3, 0, 2, 2, 0, 2, 2};
	uint64_t off = 0;
	for (int i = 0; i < 7; i++) {
		t[i].name = nm[i];
		t[i].dtype = i == 1 ? DP_I32 : DP_F32;
		t[i].kind = (uint8_t)kind[i];
		t[i].ndim = d1[i] ? 2 : 1;
		t[i].dims[0] = d0[i];
		t[i].dims[1] = d1[i];
		t[i].nbytes = (uint64_t)(d0[i] * (d1[i] ? d1[i] : 1) * 4);
		t[i].offset = off;
		off += (t[i].nbytes + 255) / 256 * 256;
		for (int a = 0; a < DP_MAX_AXES; a++)
			t[i].place_dim[a] = -1;
	}
	t[2].init = DP_INIT_NORMAL;
	t[2].init_b = 0.1f;
	src[0] = (DpSource){.path = 0, .kind = DP_SRC_SYNTHETIC, .tensor = 0, .sample_elems = 3,
			    .synth_n = 64, .src_line = 3};
	src[1] = (DpSource){.path = 0, .kind = DP_SRC_SYNTHETIC, .role = 1, .tensor = 1,
			    .sample_elems = 1, .synth_n = 64, .synth_classes = 2, .src_line = 4};
	DpInstr base = {.in = {-1, -1, -1, -1}, .out = -1};
	for (int i = 0; i < 8; i++)
		prog[i] = base;
	prog[0].op = DP_OP_LOAD, prog[0].out = 0, DP_ATTR(&prog[0], LOAD, source) = 0;
	prog[1].op = DP_OP_LOAD, prog[1].out = 1, DP_ATTR(&prog[1], LOAD, source) = 1;
	prog[2].op = DP_OP_LINEAR, prog[2].out = 5, prog[2].in[0] = 0, prog[2].in[1] = 2;
	prog[3].op = DP_OP_XENT, prog[3].out = 4, prog[3].in[0] = 5, prog[3].in[1] = 1;
	DP_FATTR(&prog[3], XENT, scale) = 0.25f;
	prog[4].op = DP_OP_XENT_GRAD, prog[4].out = 6, prog[4].in[0] = 5, prog[4].in[1] = 1;
	prog[5].op = DP_OP_MATMUL, prog[5].out = 3, prog[5].in[0] = 0, prog[5].in[1] = 6;
	DP_ATTR(&prog[5], MATMUL, transA) = 1, DP_ATTR(&prog[5], MATMUL, acc) = 1;
	prog[6].op = DP_OP_EVENT_RECORD, DP_ATTR(&prog[6], EVENT_RECORD, ev) = 0, prog[6].flags = DP_IF_LAST;
	prog[7].op = DP_OP_ALL_REDUCE, prog[7].out = 3, DP_ATTR(&prog[7], ALL_REDUCE, axes) = AXES_DP;
	prog[7].stream = DP_STREAM_COMM, prog[7].flags = DP_IF_LAST;
	eprog[0] = prog[2];
	eprog[1] = base;
	eprog[1].op = DP_OP_NOP;
	iprog[0] = base;
	iprog[0].op = DP_OP_INIT, iprog[0].out = 2;
	xprog[0] = base;
	xprog[0].op = DP_OP_SAVE, xprog[0].in[0] = 2;
	s.cfg = (DpConfig){.mesh = {1, 1, 1, 1, 1}, .micro_batch = 4, .grad_accum = 1, .eval_batch = 4,
			   .steps = 10, .log_every = 1, .seed = 7, .arena_bytes = off};
	s.opt = (DpOptim){.kind = DP_OPT_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
			  .eps = 1e-8f};
	s.sched = (DpSched){.kind = DP_SCHED_COSINE, .warmup = 2, .steps = 10};
	s.metrics = (DpMetrics){.loss = 4, .grad_norm = -1, .eval_loss = -1, .eval_correct = -1,
			       .sample_tokens = -1, .sample_logits = -1};
	s.strings = strs;
	s.nstrings = sizeof strs;
	s.tensors = t;
	s.ntensors = 7;
	s.sources = src;
	s.nsources = 2;
	s.prog[0] = prog;
	s.nprog[0] = 8;
	s.prog[1] = eprog;
	s.nprog[1] = 2;
	s.prog[DP_PROG_INIT] = iprog;
	s.nprog[DP_PROG_INIT] = 1;
	s.prog[DP_PROG_EXPORT] = xprog;
	s.nprog[DP_PROG_EXPORT] = 1;
	s.nevents = 1;
	return &s;
}

/* ---- helpers ---- */

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void fix_crc(unsigned char *b, size_t n)
{
	if (n < DP_STEP_HEADER_BYTES)
		return;
	uLong c = crc32(0L, Z_NULL, 0);
	c = crc32(c, b + DP_STEP_HEADER_BYTES, (uInt)(n - DP_STEP_HEADER_BYTES));
	put32(b + 12, (uint32_t)c);
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int numel_ok(const DpTensor *t, uint64_t *numel)
{
	uint64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= (uint64_t)t->dims[d];
	*numel = n;
	return 1;
}

/* What the runtime relies on after a successful decode. */
static int invariants(const DpStep *s)
{
	if (s->nstrings && s->strings[s->nstrings - 1])
		return 0;
	for (uint32_t i = 0; i < s->ntensors; i++) {
		const DpTensor *t = &s->tensors[i];
		if (t->name >= s->nstrings || t->dtype >= DP_NDTYPE || t->ndim > DP_MAX_DIMS)
			return 0;
		uint64_t n;
		numel_ok(t, &n);
		if (t->nbytes && (t->offset + t->nbytes > s->cfg.arena_bytes ||
				  t->offset + t->nbytes < t->offset || t->nbytes < n * 2))
			return 0;
	}
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->op >= DP_NOPS || in->stream >= DP_NSTREAM)
				return 0;
			for (int k = 0; k < DP_MAX_IN; k++)
				if (in->in[k] < -1 || in->in[k] >= (int32_t)s->ntensors ||
				    (in->in[k] >= 0 && !s->tensors[in->in[k]].nbytes))
					return 0;
			if (in->out < -1 || in->out >= (int32_t)s->ntensors)
				return 0;
			if ((in->op == DP_OP_EVENT_RECORD || in->op == DP_OP_EVENT_WAIT) &&
			    (DP_EVENT(in) < 0 || DP_EVENT(in) >= (int64_t)s->nevents))
				return 0;
			/* kernels only in the programs that can run them */
			int coll = in->op == DP_OP_ALL_REDUCE || in->op == DP_OP_REDUCE_SCATTER ||
				   in->op == DP_OP_ALL_GATHER;
			if ((coll && p == DP_PROG_INIT) ||
			    (in->op == DP_OP_LOAD && p != DP_PROG_STEP && p != DP_PROG_EVAL) ||
			    (in->op == DP_OP_INIT && p != DP_PROG_INIT) ||
			    (in->op == DP_OP_SHARD && p != DP_PROG_INIT && p != DP_PROG_STEP) ||
			    (in->op == DP_OP_SAVE && p != DP_PROG_EXPORT))
				return 0;
			if (in->op == DP_OP_INIT &&
			    (in->out < 0 || s->tensors[in->out].dtype != DP_F32 ||
			     (s->tensors[in->out].kind != DP_T_PARAM &&
			      s->tensors[in->out].kind != DP_T_BUFFER)))
				return 0;
			if (in->op == DP_OP_SAVE &&
			    (in->in[0] < 0 || s->tensors[in->in[0]].dtype != DP_F32 ||
			     s->tensors[in->in[0]].kind != DP_T_PARAM))
				return 0;
			/* a shard moves elements of one float dtype (bf16: a compute copy) */
			if (in->op == DP_OP_SHARD &&
			    (in->in[0] < 0 || in->out < 0 ||
			     (s->tensors[in->in[0]].dtype != DP_F32 &&
			      !dp_is_half(s->tensors[in->in[0]].dtype)) ||
			     s->tensors[in->out].dtype != s->tensors[in->in[0]].dtype ||
			     DP_ATTR(in, SHARD, axes) < 0 || DP_ATTR(in, SHARD, axes) >= (1 << DP_MAX_AXES)))
				return 0;
		}
	if (s->cfg.strategy >= DP_NSTRAT)
		return 0;
	for (uint32_t i = 0; i < s->nsources; i++)
		if (s->sources[i].tensor < 0 || s->sources[i].tensor >= (int32_t)s->ntensors ||
		    s->sources[i].path >= s->nstrings)
			return 0;
	for (uint32_t a = 0; a < DP_MAX_AXES; a++)
		if (s->cfg.mesh[a] < 1)
			return 0;
	return s->cfg.micro_batch >= 1 && s->cfg.grad_accum >= 1;
}

/* Decode; 0 ok, else -1 with a non-empty message (checked). */
static int dec(const unsigned char *b, size_t n, char *err, size_t errlen, int *ok_inv)
{
	DpStep s;
	err[0] = '\0';
	int rc = dpstep_decode(b, n, &s, err, errlen);
	if (rc == 0) {
		*ok_inv = invariants(&s);
		/* a decoded step re-encodes (its arrays are complete) */
		unsigned char *again;
		size_t alen;
		if (dpstep_encode(&s, &again, &alen) == 0)
			free(again);
		dpstep_free(&s);
	} else {
		*ok_inv = 1;
		/* the failed output is empty and freeing it again is harmless */
		if (s.tensors || s.strings || s.ntensors)
			*ok_inv = 0;
		dpstep_free(&s);
	}
	return rc;
}

/* Append instruction `in` to program p of the built-in step (strategy as
 * given; with bf16 set, one more tensor: 7 "h", bf16 [4,2], an
 * activation), encode, decode: accepted when want is NULL, else refused
 * with a message containing want. */
static uint32_t rule_pp = 1; /* the built-in step's pp while test_pipeline_rules runs */

/* Encode s and decode it: with want, one check that the decoder refuses it
 * with a message containing want (returns 0); without, one that it accepts
 * it, returning 1 with the decoded step in d for the caller's checks (the
 * caller frees it). */
static int decodes(const char *name, const DpStep *s, const char *want, DpStep *d)
{
	unsigned char *buf;
	size_t len;
	char err[512] = "out of memory encoding";
	int rc = -1;
	if (dpstep_encode(s, &buf, &len) == 0) {
		rc = dpstep_decode(buf, len, d, err, sizeof err);
		free(buf);
	}
	if (want) {
		check(rc != 0 && strstr(err, want), "%s: refused with '%s' (rc %d, '%s')", name, want,
		      rc, err);
		if (rc == 0)
			dpstep_free(d);
		return 0;
	}
	check(rc == 0, "%s: accepted (rc %d, '%s')", name, rc, err);
	return rc == 0;
}

static void rule_dt(const char *name, int p, DpInstr in, uint32_t strategy, int nhalf,
		    const char *want)
{
	DpStep s = *builtin_step();
	s.cfg.mesh[DP_AXIS_PP] = rule_pp;
	DpTensor tens[16];
	char strs[256];
	/* nhalf 16-bit tensors: h (7) bf16 [4,2], then k (8) f16 [4,2] */
	static const struct {
		char name[2];
		uint8_t dtype;
	} halves[] = {{"h", DP_BF16}, {"k", DP_F16}};
	if (nhalf) {
		memcpy(tens, s.tensors, s.ntensors * sizeof *tens);
		memcpy(strs, s.strings, s.nstrings);
		s.tensors = tens;
		s.strings = strs;
	}
	for (int h = 0; h < nhalf; h++) {
		memcpy(strs + s.nstrings, halves[h].name, 2);
		tens[s.ntensors] = tens[6];
		tens[s.ntensors].name = s.nstrings;
		tens[s.ntensors].dtype = halves[h].dtype;
		tens[s.ntensors].offset = s.cfg.arena_bytes;
		s.cfg.arena_bytes += 256;
		s.nstrings += 2;
		s.ntensors++;
	}
	DpInstr *prog = malloc((s.nprog[p] + 1) * sizeof *prog);
	if (s.nprog[p])
		memcpy(prog, s.prog[p], s.nprog[p] * sizeof *prog);
	prog[s.nprog[p]] = in;
	s.prog[p] = prog;
	s.nprog[p]++;
	s.cfg.strategy = strategy;
	DpStep d;
	if (decodes(name, &s, want, &d)) {
		check(d.cfg.strategy == strategy && d.nprog[p] == s.nprog[p], "%s: decoded as built",
		      name);
		dpstep_free(&d);
	}
	free(prog);
}

static void rule(const char *name, int p, DpInstr in, uint32_t strategy, const char *want)
{
	rule_dt(name, p, in, strategy, 0, want);
}

/* Which kernels each program may hold, and the operands of INIT/SAVE/SHARD.
 * Tensors of the built-in step: 0 x, 1 y (i32), 2 w (param), 3 grad.w,
 * 4 loss, 5 logits, 6 d.logits. */
static void test_program_rules(void)
{
	const DpInstr base = {.in = {-1, -1, -1, -1}, .out = -1};
	DpInstr init = base, save = base, shard = base, load = base, ar = base, ag = base;
	init.op = DP_OP_INIT, init.out = 2;
	save.op = DP_OP_SAVE, save.in[0] = 2;
	shard.op = DP_OP_SHARD, shard.in[0] = 2, shard.out = 3;
	DP_ATTR(&shard, SHARD, axes) = DP_AXIS_BIT(DP_AXIS_SHARD);
	load.op = DP_OP_LOAD, load.out = 0, DP_ATTR(&load, LOAD, source) = 0;
	ar.op = DP_OP_ALL_REDUCE, ar.out = 3, DP_ATTR(&ar, ALL_REDUCE, axes) = AXES_DP;
	ar.stream = DP_STREAM_COMM;
	ag.op = DP_OP_ALL_GATHER, ag.in[0] = 3, ag.out = 2, ag.stream = DP_STREAM_COMM;
	DP_ATTR(&ag, ALL_GATHER, axes) = DP_AXIS_BIT(DP_AXIS_SHARD);

	rule("strategy full_shard", DP_PROG_INIT, init, DP_STRAT_FULL_SHARD, NULL);
	rule("strategy hybrid_shard", DP_PROG_INIT, init, DP_STRAT_HYBRID_SHARD, NULL);
	rule("unknown strategy", DP_PROG_INIT, init, DP_NSTRAT, "unknown strategy 5");
	rule("init in the step program", DP_PROG_STEP, init, 0,
	     "step program, instruction 8 (init): allowed only in the init program");
	rule("init in the export program", DP_PROG_EXPORT, init, 0, "allowed only in the init program");
	DpInstr d = init;
	d.out = 5;
	rule("init of an activation", DP_PROG_INIT, d, 0,
	     "'logits' is not a parameter, a buffer or state with an init spec");
	d.out = 1;
	rule("init of an i32 tensor", DP_PROG_INIT, d, 0, "output 'y' is not f32");
	d.out = -1;
	rule("init without output", DP_PROG_INIT, d, 0, "missing output");
	rule("save in the init program", DP_PROG_INIT, save, 0, "allowed only in the export program");
	rule("save in the eval program", DP_PROG_EVAL, save, 0, "allowed only in the export program");
	d = save;
	d.in[0] = 3;
	rule("save of a gradient", DP_PROG_EXPORT, d, 0, "'grad.w' is not a parameter");
	rule("shard in the init program", DP_PROG_INIT, shard, DP_STRAT_FULL_SHARD, NULL);
	rule("shard in the step program (zero1)", DP_PROG_STEP, shard, DP_STRAT_ZERO1, NULL);
	rule("shard in the eval program", DP_PROG_EVAL, shard, 0,
	     "eval program, instruction 2 (shard): allowed only in the init and step programs");
	rule("shard in the export program", DP_PROG_EXPORT, shard, 0,
	     "allowed only in the init and step programs");
	d = shard;
	DP_ATTR(&d, SHARD, axes) = 1 << DP_MAX_AXES;
	rule("shard with a bad axis mask", DP_PROG_INIT, d, 0, "bad axis mask 32"); /* 1 << DP_MAX_AXES */
	d = shard;
	d.in[0] = 1;
	rule("shard of an i32 tensor", DP_PROG_INIT, d, 0, "'y' is not f32, bf16 or f16");
	d = shard;
	d.out = -1;
	rule("shard without output", DP_PROG_INIT, d, 0, "missing output");
	d = shard; /* the executor reads in0 (found by the random mutations) */
	d.in[0] = -1;
	rule("shard without input", DP_PROG_INIT, d, 0, "missing input 0");
	rule("load in the init program", DP_PROG_INIT, load, 0,
	     "init program, instruction 1 (load): allowed only in the step and eval programs");
	rule("load in the export program", DP_PROG_EXPORT, load, 0, "allowed only in the step and eval");
	rule("all_reduce in the init program", DP_PROG_INIT, ar, 0,
	     "allowed only in the step, eval and export programs");
	rule("all_gather in the init program", DP_PROG_INIT, ag, 0, "allowed only in the step, eval");
	rule("all_gather in the export program", DP_PROG_EXPORT, ag, DP_STRAT_FULL_SHARD, NULL);
	rule("all_gather in the eval program", DP_PROG_EVAL, ag, DP_STRAT_FULL_SHARD, NULL);
	/* the copy stream (version 19) carries host-device copies and events only,
	 * and from 23 the host step's kernels (a shard on it writes device memory) */
	d = ag;
	d.stream = DP_STREAM_COPY;
	rule("all_gather on the copy stream", DP_PROG_EVAL, d, DP_STRAT_FULL_SHARD,
	     "only host-device copies, host kernels and events run on the copy stream");
	d = shard;
	d.stream = DP_STREAM_COPY;
	rule("shard on the copy stream", DP_PROG_INIT, d, DP_STRAT_FULL_SHARD,
	     "only host-device copies, host kernels and events run on the copy stream");
}

/* The sample program (version 14; one row since 16) and its tokens and
 * logits, which come together: program p = DP_PROG_SAMPLE holding `in` (or
 * nothing), tokens and logits the metrics' ids, y (tensor 1) made i32
 * [rows, 4 / rows] beside the [4, 2] logits. */
static void sample_rule(const char *name, const DpInstr *in, int32_t tokens, int32_t logits,
			int64_t rows, const char *want)
{
	DpStep s = *builtin_step();
	DpTensor tens[7];
	memcpy(tens, s.tensors, sizeof tens);
	tens[1].ndim = 2, tens[1].dims[0] = rows, tens[1].dims[1] = 4 / rows;
	s.tensors = tens;
	s.metrics.sample_tokens = tokens, s.metrics.sample_logits = logits;
	DpInstr one[1];
	if (in) {
		one[0] = *in;
		s.prog[DP_PROG_SAMPLE] = one;
		s.nprog[DP_PROG_SAMPLE] = 1;
	}
	DpStep d;
	if (decodes(name, &s, want, &d)) {
		check(d.nprog[DP_PROG_SAMPLE] == s.nprog[DP_PROG_SAMPLE] &&
		      d.metrics.sample_tokens == tokens && d.metrics.sample_logits == logits,
		      "%s: decoded as built", name);
		dpstep_free(&d);
	}
}

static void test_sample_rules(void)
{
	const DpInstr base = {.in = {-1, -1, -1, -1}, .out = -1};
	DpInstr lin = base, load = base;
	lin.op = DP_OP_LINEAR, lin.out = 5, lin.in[0] = 0, lin.in[1] = 2;
	load.op = DP_OP_LOAD, load.out = 1, DP_ATTR(&load, LOAD, source) = 1;
	sample_rule("a sample program", &lin, 1, 5, 1, NULL);
	sample_rule("no sample program", NULL, -1, -1, 1, NULL);
	sample_rule("a sample program without its tensors", &lin, -1, -1, 1,
		    "the sample program (1 instructions) without its tokens and logits");
	sample_rule("sample tensors without a program", NULL, 1, 5, 1,
		    "the sample program (0 instructions) without");
	sample_rule("tokens without logits", &lin, 1, -1, 1, "without its tokens and logits");
	sample_rule("logits of another size", &lin, 1, 2, 1,
		    "tokens must be i32 [1, ctx] and its logits f32, bf16 or f16 [1, ctx, vocab]");
	sample_rule("two rows (a version 14 sample program)", &lin, 1, 5, 2,
		    "tokens must be i32 [1, ctx]");
	sample_rule("f32 tokens", &lin, 0, 5, 1, "tokens must be i32");
	sample_rule("tokens out of range", &lin, 7, 5, 1, "the sample program's tokens");
	sample_rule("a load in the sample program", &load, 1, 5, 1,
		    "sample program, instruction 0 (load): allowed only in the step and eval programs");
}

/* Pipeline stages (pp=2): an instruction's stage, and a send or recv between
 * neighbouring stages over pp, of a float tensor, with a tag MPI can carry. */
static void test_pipeline_rules(void)
{
	rule_pp = 2;
	const DpInstr base = {.in = {-1, -1, -1, -1}, .out = -1};
	DpInstr send = base, recv = base, relu = base, d;
	send.op = DP_OP_SEND, send.in[0] = 5, send.stream = DP_STREAM_COMM, send.stage1 = 1;
	DP_AXES(&send) = DP_AXIS_BIT(DP_AXIS_PP), DP_PEER(&send) = 1, DP_TAG(&send) = 7;
	recv.op = DP_OP_RECV, recv.out = 5, recv.stream = DP_STREAM_COMM, recv.stage1 = 2;
	DP_AXES(&recv) = DP_AXIS_BIT(DP_AXIS_PP), DP_PEER(&recv) = 0, DP_TAG(&recv) = 7;
	relu.op = DP_OP_RELU, relu.in[0] = 5, relu.out = 6;
	rule("send from stage 0 to 1", DP_PROG_STEP, send, 0, NULL);
	rule("recv on stage 1 from 0", DP_PROG_STEP, recv, 0, NULL);
	rule("send in the eval program", DP_PROG_EVAL, send, 0, NULL);
	d = relu, d.stage1 = 2;
	rule("a kernel on stage 1", DP_PROG_STEP, d, 0, NULL);
	/* each stage initialises and saves its own parameters (passes/stage_params.c) */
	rule("a kernel on stage 1 in the init program", DP_PROG_INIT, d, 0, NULL);
	d.stage1 = 3;
	rule("a kernel on stage 2 of 2", DP_PROG_STEP, d, 0, "stage 2 of a mesh with pp=2");
	d = send, d.stage1 = 0;
	rule("a send on every stage", DP_PROG_STEP, d, 0, "not a transfer over pp between neighbouring "
	     "stages (axes 1, stage -1, peer 1)");
	d = send, DP_PEER(&d) = 0;
	rule("a send to its own stage", DP_PROG_STEP, d, 0, "(axes 1, stage 0, peer 0)");
	d = recv, DP_PEER(&d) = 2;
	rule("a recv from stage 2 of 2", DP_PROG_STEP, d, 0, "(axes 1, stage 1, peer 2)");
	d = send, DP_AXES(&d) = AXES_DP;
	rule("a send over dp", DP_PROG_STEP, d, 0, "not a transfer over pp");
	d = send, DP_TAG(&d) = 32768;
	rule("a tag MPI may not carry", DP_PROG_STEP, d, 0, "tag 32768 out of range [0, 32767]");
	d = send, d.in[0] = 1;
	rule("a send of an i32 tensor", DP_PROG_STEP, d, 0, "input 'y' is not f32, bf16 or f16");
	d = recv, d.out = -1;
	rule("a recv without output", DP_PROG_STEP, d, 0, "missing output");
	/* the p2p stream (version 22) carries the transfers and events only */
	d = send, d.stream = DP_STREAM_P2P;
	rule("a send on the p2p stream", DP_PROG_STEP, d, 0, NULL);
	d = recv, d.stream = DP_STREAM_P2P;
	rule("a recv on the p2p stream", DP_PROG_STEP, d, 0, NULL);
	d = relu, d.stream = DP_STREAM_P2P;
	rule("a kernel on the p2p stream", DP_PROG_STEP, d, 0,
	     "only pipeline sends, receives and events run on the p2p stream");
	{ /* written at 22; stamped 21 (what the 21 format cannot say) it is refused */
		DpStep s = *builtin_step();
		s.cfg.mesh[DP_AXIS_PP] = 2;
		DpInstr prog[64];
		memcpy(prog, s.prog[DP_PROG_STEP], s.nprog[DP_PROG_STEP] * sizeof *prog);
		prog[s.nprog[DP_PROG_STEP]] = send;
		prog[s.nprog[DP_PROG_STEP]].stream = DP_STREAM_P2P;
		s.prog[DP_PROG_STEP] = prog;
		s.nprog[DP_PROG_STEP]++;
		unsigned char *b;
		size_t n;
		char err[256] = "";
		DpStep out;
		check(dp_step_version(&s) == 22 && dpstep_encode(&s, &b, &n) == 0,
		      "a send on the p2p stream is written at 22");
		put32(b + 8, 21);
		fix_crc(b, n);
		int rc = dpstep_decode(b, n, &out, err, sizeof err);
		check(rc != 0 && strstr(err, "format 21 has no p2p stream"),
		      "the p2p stream in a file stamped 21: '%s'", err);
		if (rc == 0)
			dpstep_free(&out);
		free(b);
		s.prog[DP_PROG_STEP][s.nprog[DP_PROG_STEP] - 1].stream = DP_STREAM_COMM;
		check(dp_step_version(&s) == 19, "a send on the comm stream is written at 19, as before");
	}
	/* an all_reduce over a sub-group of the stages (a tied parameter's
	 * gradient over the stages that keep it: pp=4, stages 0 and 3) */
	rule_pp = 4;
	DpInstr ar = base;
	ar.op = DP_OP_ALL_REDUCE, ar.out = 3, ar.stream = DP_STREAM_COMM, ar.stage1 = 1;
	DP_AXES(&ar) = DP_AXIS_BIT(DP_AXIS_PP) | AXES_DP, DP_ATTR(&ar, ALL_REDUCE, stages) = 9;
	rule("an all_reduce over stages 0 and 3, on stage 0", DP_PROG_STEP, ar, 0, NULL);
	d = ar, d.stage1 = 2;
	rule("an all_reduce over stages 0 and 3 on stage 1", DP_PROG_STEP, d, 0,
	     "stages 0x9 is not a group of two or more of the 4 pipeline stages over pp that holds "
	     "the instruction's stage 1");
	d = ar, DP_ATTR(&d, ALL_REDUCE, stages) = 1;
	rule("an all_reduce over a group of one stage", DP_PROG_STEP, d, 0, "stages 0x1 is not a group");
	d = ar, DP_ATTR(&d, ALL_REDUCE, stages) = 17;
	rule("an all_reduce over stage 4 of 4", DP_PROG_STEP, d, 0, "stages 0x11 is not a group");
	d = ar, DP_AXES(&d) = AXES_DP;
	rule("an all_reduce over stages without pp", DP_PROG_STEP, d, 0, "stages 0x9 is not a group");
	rule_pp = 1;
	rule("a send at pp=1", DP_PROG_STEP, send, 0, "(axes 1, stage 0, peer 1)");
}

/* The operand rules (format/stepfile_check.c): what every backend may trust.
 * Tensors as above: 0 x f32[4,3], 1 y i32[4], 2 w f32[3,2], 3 grad.w f32[3,2],
 * 4 loss f32[1], 5 logits f32[4,2], 6 d.logits f32[4,2]. */
static void test_operand_rules(void)
{
	const DpInstr base = {.in = {-1, -1, -1, -1}, .out = -1};
	DpInstr mm = base, relu = base, add = base, xg = base;
	mm.op = DP_OP_MATMUL, mm.in[0] = 0, mm.in[1] = 2, mm.out = 5;
	relu.op = DP_OP_RELU, relu.in[0] = 5, relu.out = 6;
	add.op = DP_OP_ADD, add.in[0] = 5, add.in[1] = 6, add.out = 6;
	xg.op = DP_OP_XENT_GRAD, xg.in[0] = 5, xg.in[1] = 1, xg.out = 6;
	rule("matmul [4,3] @ [3,2] -> [4,2]", DP_PROG_STEP, mm, 0, NULL);
	rule("relu", DP_PROG_STEP, relu, 0, NULL);
	rule("add in place", DP_PROG_STEP, add, 0, NULL);
	DpInstr d = mm;
	d.in[1] = 3, DP_ATTR(&d, MATMUL, transB) = 1; /* [4,3] @ [3,2]^T */
	rule("matmul with inner dims 3 vs 2", DP_PROG_STEP, d, 0, "inner dimensions differ (3 vs 2)");
	d = mm;
	d.out = 3;
	rule("matmul into a [3,2]", DP_PROG_STEP, d, 0, "the output is not [4, 2]");
	d = base;
	d.op = DP_OP_SOFTMAX, d.in[0] = 5, d.out = 5;
	rule("softmax in place", DP_PROG_STEP, d, 0, "the output overlaps an input");
	d = mm;
	d.in[1] = 1;
	rule("matmul of an i32 operand", DP_PROG_STEP, d, 0, "input 1 'y' is i32, not f32");
	d = mm;
	d.in[1] = -1;
	rule("matmul without its second operand", DP_PROG_STEP, d, 0, "missing input 1");
	d = relu;
	d.out = 3;
	rule("relu of [4,2] into [3,2]", DP_PROG_STEP, d, 0, "the operands differ in size");
	d = xg;
	d.in[1] = 4;
	rule("cross_entropy_grad with f32 labels", DP_PROG_STEP, d, 0, "input 1 'loss' is f32, not i32");
	d = xg;
	d.out = 4;
	rule("cross_entropy_grad into a [1]", DP_PROG_STEP, d, 0,
	     "the output and the logits differ in size");
	d = base;
	d.op = DP_OP_LAYERNORM, d.in[0] = 5, d.in[1] = 4, d.in[2] = 4, d.out = 6;
	rule("layernorm with a gamma of the wrong size", DP_PROG_STEP, d, 0,
	     "gamma's size does not match x's last dim");
	/* mixed precision (dp_rule_dtypes), with h (7) bf16 [4,2] */
	d = relu;
	d.in[0] = 7, d.out = 5;
	rule_dt("relu of bf16 into f32", DP_PROG_STEP, d, 0, 1,
		"the output 'logits' is f32, not the compute dtype bf16 (h's)");
	d.op = DP_OP_CAST;
	rule_dt("cast of bf16 into f32", DP_PROG_STEP, d, 0, 1, NULL);
	d = mm;
	d.in[0] = 5, DP_ATTR(&d, MATMUL, transA) = 1, d.in[1] = 7, d.out = 3;
	rule_dt("matmul mixing f32 and bf16", DP_PROG_STEP, d, 0, 1,
		"input 1 'h' is bf16, not the compute dtype f32 (logits's)");
	d = xg;
	d.out = 7;
	rule_dt("cross_entropy_grad of f32 logits into bf16", DP_PROG_STEP, d, 0, 1,
		"the output 'h' is bf16, not the compute dtype f32");
	d = base;
	d.op = DP_OP_ALL_GATHER, d.in[0] = 7, d.out = 5, d.stream = DP_STREAM_COMM;
	DP_ATTR(&d, ALL_GATHER, axes) = DP_AXIS_BIT(DP_AXIS_SHARD);
	rule_dt("all_gather from bf16 into f32", DP_PROG_STEP, d, 0, 1, "differ in dtype");
	d = base;
	d.op = DP_OP_SQNORM, d.in[0] = 7, d.out = 4;
	rule_dt("sqnorm of bf16 into f32", DP_PROG_STEP, d, 0, 1, NULL);
	d.out = 7, d.in[0] = 5;
	rule_dt("sqnorm into bf16", DP_PROG_STEP, d, 0, 1, "the output 'h' is bf16, not f32");
	/* with k (8) f16 [4,2] beside h: either 16-bit dtype, never both at once */
	d = relu;
	d.op = DP_OP_CAST, d.in[0] = 8, d.out = 5;
	rule_dt("cast of f16 into f32", DP_PROG_STEP, d, 0, 2, NULL);
	d.in[0] = 7, d.out = 8;
	rule_dt("cast of bf16 into f16", DP_PROG_STEP, d, 0, 2, "mixes bf16 and f16 operands");
	d = relu;
	d.in[0] = 8, d.out = 7;
	rule_dt("relu of f16 into bf16", DP_PROG_STEP, d, 0, 2,
		"the output 'h' is bf16, not the compute dtype f16 (k's)");
}

static void test_file_io(const DpStep *s)
{
	char dir[] = "/tmp/dpfuzz.XXXXXX";
	if (!mkdtemp(dir)) {
		check(0, "mkdtemp");
		return;
	}
	char path[256], err[512];
	snprintf(path, sizeof path, "%s/step.bin", dir);
	check(dpstep_write_file(s, path, err, sizeof err) == 0, "write_file: %s", err);
	DpStep back;
	check(dpstep_read_file(path, &back, err, sizeof err) == 0, "read_file: %s", err);
	dpstep_free(&back);
	snprintf(path, sizeof path, "%s/no/such/dir/step.bin", dir);
	check(dpstep_write_file(s, path, err, sizeof err) != 0 && strstr(err, "step.bin"),
	      "write into a missing directory fails naming the file (%s)", err);
	DIR *d = opendir(dir);
	int entries = 0;
	struct dirent *de;
	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.')
			entries++;
	if (d)
		closedir(d);
	check(entries == 1, "no temporary files left behind (%d entries)", entries);
	snprintf(path, sizeof path, "%s/missing.bin", dir);
	check(dpstep_read_file(path, &back, err, sizeof err) != 0 && strstr(err, "cannot open") &&
		      strstr(err, "missing.bin"),
	      "missing file: %s", err);
	snprintf(path, sizeof path, "%s/step.bin", dir);
	unlink(path);
	rmdir(dir);
}

/* --emit DIR N: write N checksum-fixed mutations of the built-in step that
 * the decoder accepts, for tests/stepfile_fuzz.sh to feed to dpexec. */
static int emit(const char *dir, int n)
{
	unsigned char *buf;
	size_t len;
	char err[512], path[512];
	if (dpstep_encode(builtin_step(), &buf, &len))
		return 1;
	snprintf(path, sizeof path, "%s/valid.bin", dir);
	FILE *f = fopen(path, "wb");
	if (!f)
		return 1;
	fwrite(buf, 1, len, f);
	fclose(f);
	int made = 0;
	for (long it = 0; made < n && it < 1000000; it++) {
		unsigned char *t = malloc(len);
		memcpy(t, buf, len);
		int k = 1 + (int)(rnd() % 3);
		for (int j = 0; j < k; j++) {
			size_t p = DP_STEP_HEADER_BYTES + rnd() % (len - DP_STEP_HEADER_BYTES);
			uint64_t r = rnd();
			if (r % 2 == 0 && p + 4 <= len)
				put32(t + p, (r >> 8) % 3 == 0 ? 0xffffffffu : (uint32_t)((r >> 16) % 16));
			else
				t[p] = (unsigned char)(r >> 8);
		}
		fix_crc(t, len);
		DpStep s;
		if (memcmp(t, buf, len) && dpstep_decode(t, len, &s, err, sizeof err) == 0) {
			dpstep_free(&s);
			snprintf(path, sizeof path, "%s/m%03d.bin", dir, made++);
			f = fopen(path, "wb");
			if (f) {
				fwrite(t, 1, len, f);
				fclose(f);
			}
		}
		free(t);
	}
	free(buf);
	return made == n ? 0 : 1;
}

int main(int argc, char **argv)
{
	unsigned char *buf;
	size_t len;
	char err[512];
	int inv;
	DpStep file;
	const DpStep *s;
	if (argc == 4 && !strcmp(argv[1], "--emit"))
		return emit(argv[2], atoi(argv[3]));
	if (argc > 1) {
		if (dpstep_read_file(argv[1], &file, err, sizeof err)) {
			printf("stepfile_fuzz: cannot use %s: %s\n", argv[1], err);
			return 1;
		}
		s = &file;
	} else {
		s = builtin_step();
	}
	if (dpstep_encode(s, &buf, &len)) {
		printf("stepfile_fuzz: encode failed\n");
		return 1;
	}

	/* round trip */
	DpStep d;
	int rc = dpstep_decode(buf, len, &d, err, sizeof err);
	check(rc == 0, "valid file decodes: %s", err);
	if (rc == 0) {
		unsigned char *b2;
		size_t l2;
		check(dpstep_encode(&d, &b2, &l2) == 0 && l2 == len && !memcmp(b2, buf, len),
		      "decode + encode gives the same bytes");
		if (l2 == len)
			free(b2);
		check(invariants(&d), "valid file satisfies the invariants");
		dpstep_free(&d);
	}

	/* truncation */
	int bad_trunc = 0;
	for (size_t n = 0; n < len; n += n < 256 ? 1 : 7) {
		unsigned char *t = malloc(n ? n : 1); /* exact size: ASan sees overreads */
		memcpy(t, buf, n);
		rc = dec(t, n, err, sizeof err, &inv);
		int good = rc != 0 && err[0] && inv &&
			   (n < 8 ? 1 : strstr(err, "truncated") != NULL);
		if (!good && bad_trunc++ < 5)
			check(0, "truncated at %zu: rc %d, '%s'", n, rc, err);
		else if (good)
			npass++;
		free(t);
	}

	/* single-byte flips, checksum untouched: always refused, with the right reason */
	int bad_flip = 0;
	for (size_t p = 0; p < len; p += p < 512 ? 1 : 3) {
		unsigned char *t = malloc(len);
		memcpy(t, buf, len);
		t[p] ^= (unsigned char)(1u << (p % 8));
		rc = dec(t, len, err, sizeof err, &inv);
		const char *want = p < 8 ? "not a dp step file"
			: p < 12 ? "version"
			: p < 16 ? "checksum mismatch"
			: p < 24 ? "" /* size: truncated or bad size */
			: "checksum mismatch";
		int good = rc != 0 && err[0] && inv && strstr(err, want);
		if (!good && bad_flip++ < 5)
			check(0, "flip at %zu: rc %d, '%s' (want '%s')", p, rc, err, want);
		else if (good)
			npass++;
		free(t);
	}

	/* flips and mutations with the checksum fixed up: reach the parser and validators */
	int crashes_would_be_here = 0, accepted = 0, refused = 0, bad_fix = 0;
	long iters = 0;
	for (size_t p = DP_STEP_HEADER_BYTES; p < len; p++) {
		for (int v = 0; v < 3; v++) {
			unsigned char *t = malloc(len);
			memcpy(t, buf, len);
			t[p] = v == 0 ? (unsigned char)(t[p] ^ 0xff)
			     : v == 1 ? (unsigned char)(t[p] + 1) : (unsigned char)rnd();
			fix_crc(t, len);
			rc = dec(t, len, err, sizeof err, &inv);
			iters++;
			if (rc == 0)
				accepted++;
			else
				refused++;
			int good = inv && (rc == 0 || (err[0] && !strstr(err, "checksum")));
			if (!good && bad_fix++ < 5)
				check(0, "fixed-crc mutation at %zu: rc %d inv %d '%s'", p, rc, inv, err);
			else if (good)
				npass++;
			free(t);
		}
	}
	for (int it = 0; it < 20000; it++) {
		unsigned char *t = malloc(len);
		memcpy(t, buf, len);
		int k = 1 + (int)(rnd() % 8);
		for (int j = 0; j < k; j++) {
			size_t p = DP_STEP_HEADER_BYTES + rnd() % (len - DP_STEP_HEADER_BYTES);
			uint64_t r = rnd();
			if (r % 4 == 0 && p + 4 <= len) /* a plausible small integer or -1 */
				put32(t + p, (r >> 8) % 3 == 0 ? 0xffffffffu : (uint32_t)((r >> 16) % 64));
			else
				t[p] = (unsigned char)(r >> 8);
		}
		fix_crc(t, len);
		rc = dec(t, len, err, sizeof err, &inv);
		iters++;
		if (rc == 0)
			accepted++;
		else
			refused++;
		int good = inv && (rc == 0 || err[0]);
		if (!good && bad_fix++ < 5)
			check(0, "random mutation %d: rc %d inv %d '%s'", it, rc, inv, err);
		else if (good)
			npass++;
		free(t);
	}
	(void)crashes_would_be_here;
	printf("  %ld checksum-fixed mutations: %d refused by the parser/validators, %d accepted "
	       "(all accepted ones satisfy the invariants)\n",
	       iters, refused, accepted);

	/* lying counts: the string table claims 4 GiB, the tensor count 2^32-1 */
	{
		unsigned char *t = malloc(len);
		memcpy(t, buf, len);
		/* the settings' records (format/settings.def), metrics 24 (6 ids),
		 * nevents 4, source 4: strings nbytes */
		size_t at = DP_STEP_HEADER_BYTES + dp_record_bytes(DP_REC_CFG) +
			    dp_record_bytes(DP_REC_OPT) + dp_record_bytes(DP_REC_SCHED) + 24 + 4 + 4;
		put32(t + at, 0xfffffff0u);
		fix_crc(t, len);
		rc = dec(t, len, err, sizeof err, &inv);
		check(rc != 0 && strstr(err, "string table"), "lying string count: '%s'", err);
		memcpy(t, buf, len);
		uint32_t ns = (uint32_t)t[at] | (uint32_t)t[at + 1] << 8 | (uint32_t)t[at + 2] << 16 |
			      (uint32_t)t[at + 3] << 24;
		put32(t + at + 4 + ns, 0xffffffffu);
		fix_crc(t, len);
		rc = dec(t, len, err, sizeof err, &inv);
		check(rc != 0 && strstr(err, "tensor table"), "lying tensor count: '%s'", err);
		free(t);
	}

	/* versions and foreign files */
	{
		unsigned char *t = malloc(len);
		memcpy(t, buf, len);
		char want[128];
		put32(t + 8, DP_STEP_VERSION + 1);
		rc = dec(t, len, err, sizeof err, &inv);
		snprintf(want, sizeof want, "step file format version %u is newer than this dpexec "
			 "supports (%u); rebuild dpexec", DP_STEP_VERSION + 1, DP_STEP_VERSION);
		check(rc != 0 && strstr(err, want), "newer version: '%s'", err);
		put32(t + 8, 0);
		rc = dec(t, len, err, sizeof err, &inv);
		check(rc != 0 && strstr(err, "not supported"), "older version: '%s'", err);
		put32(t + 8, DP_STEP_VERSION_MIN - 1); /* the one before the oldest read */
		rc = dec(t, len, err, sizeof err, &inv);
		snprintf(want, sizeof want, "step file format version %u is not supported (this "
			 "dpexec reads %u to %u); recompile with dpc", DP_STEP_VERSION_MIN - 1,
			 DP_STEP_VERSION_MIN, DP_STEP_VERSION);
		check(rc != 0 && strstr(err, want), "previous version: '%s'", err);
		put32(t + 8, DP_STEP_VERSION);
		t[len - 1] ^= 1;
		rc = dec(t, len, err, sizeof err, &inv);
		check(rc != 0 && !strcmp(err, "checksum mismatch: file is corrupted"),
		      "corrupted body: '%s'", err);
		free(t);
		static const char text[] = "mesh auto\ndata { x: f32[batch, 784] }\n# not a step file\n";
		rc = dec((const unsigned char *)text, sizeof text - 1, err, sizeof err, &inv);
		check(rc != 0 && !strcmp(err, "not a dp step file"), "text file: '%s'", err);
		rc = dec((const unsigned char *)"", 0, err, sizeof err, &inv);
		check(rc != 0 && !strcmp(err, "not a dp step file"), "empty file: '%s'", err);
		unsigned char *big = malloc(len + 5);
		memcpy(big, buf, len);
		memset(big + len, 0, 5);
		rc = dec(big, len + 5, err, sizeof err, &inv);
		check(rc != 0 && strstr(err, "expected"), "trailing bytes: '%s'", err);
		free(big);
	}

	test_file_io(s);
	if (argc <= 1)
		test_program_rules();
	test_pipeline_rules();
	test_sample_rules();
	test_operand_rules();
	free(buf);
	if (argc > 1)
		dpstep_free(&file);
	printf("stepfile_fuzz: %d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
