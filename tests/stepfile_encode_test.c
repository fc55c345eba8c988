/*
 * stepfile_encode_test.c - the step-file writer never writes past the buffer
 * it computed the size of. dpstep_encode sizes its buffer from the record
 * sizes (TENSOR_BYTES, SOURCE_BYTES, INSTR_BYTES, ...) and then writes the
 * records; when a record's writer and its size disagree (a field added to
 * put_tensor and not to TENSOR_BYTES) the writes must stop at the buffer's
 * end and the encode fail, not overflow the heap. This includes
 * format/stepfile.c to reach its writer (encode_into) with a buffer sized
 * wrong on purpose: short by one byte, by a tensor, by an instruction, and
 * long by one. Run under ASan (`make tests SAN=1`), an overflow is a report.
 * Prints "stepfile_encode_test: N passed, M failed"; exit status 1 on any.
 */
#include "../format/stepfile.c"

static int npass, nfail;

static void check(int cond, const char *what)
{
	if (cond) {
		npass++;
	} else {
		nfail++;
		fprintf(stderr, "FAIL %s\n", what);
	}
}

/* A step with strings, tensors, a source and a program: every kind of record. */
static void small_step(DpStep *s, DpTensor *t, int nt, DpSource *src, DpInstr *prog, int ni)
{
	static char strs[] = "x\0w\0";
	memset(s, 0, sizeof *s);
	for (int i = 0; i < nt; i++) {
		t[i] = (DpTensor){.name = (uint32_t)(2 * (i % 2)), .dtype = DP_F32, .ndim = 1,
				  .kind = i ? DP_T_DATA : DP_T_METRIC,
				  .dims = {i ? 4 : 1}, .nbytes = i ? 16 : 4, .offset = 256 * (uint64_t)i};
		for (int a = 0; a < DP_MAX_AXES; a++)
			t[i].place_dim[a] = -1;
	}
	*src = (DpSource){.kind = DP_SRC_SYNTHETIC, .tensor = 1, .sample_elems = 4, .synth_n = 8};
	for (int i = 0; i < ni; i++)
		prog[i] = (DpInstr){.op = DP_OP_NOP, .in = {-1, -1, -1, -1}, .out = -1};
	s->strings = strs;
	s->nstrings = sizeof strs;
	s->tensors = t;
	s->ntensors = (uint32_t)nt;
	s->sources = src;
	s->nsources = 1;
	s->prog[DP_PROG_STEP] = prog;
	s->nprog[DP_PROG_STEP] = (uint32_t)ni;
	s->cfg = (DpConfig){.mesh = {1, 1, 1, 1, 1}, .micro_batch = 4, .grad_accum = 1, .eval_batch = 4,
			    .steps = 10, .log_every = 1, .arena_bytes = 256 * (uint64_t)nt};
	s->opt = (DpOptim){.kind = DP_OPT_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
	s->sched = (DpSched){.kind = DP_SCHED_COSINE, .warmup = 2, .steps = 10};
	s->metrics = (DpMetrics){.loss = 0, .grad_norm = -1, .eval_loss = -1, .eval_correct = -1,
				 .sample_tokens = -1, .sample_logits = -1};
}

/* encode_into with a buffer of exactly n bytes (malloc'd: ASan sees its end) */
static int encode_sized(const DpStep *s, size_t n)
{
	unsigned char *b = malloc(n ? n : 1);
	if (!b)
		return -2;
	int rc = encode_into(s, b, n);
	free(b);
	return rc;
}

int main(void)
{
	DpStep s;
	DpTensor t[3];
	DpSource src;
	DpInstr prog[2];
	small_step(&s, t, 3, &src, prog, 2);
	unsigned char *buf = NULL;
	size_t len = 0;
	check(dpstep_encode(&s, &buf, &len) == 0, "the step encodes");
	DpStep back;
	char err[256];
	int dec = buf ? dpstep_decode(buf, len, &back, err, sizeof err) : -1;
	if (dec)
		fprintf(stderr, "decode: %s\n", err);
	check(dec == 0 && back.ntensors == 3 && back.nprog[DP_PROG_STEP] == 2, "and decodes");
	if (dec == 0)
		dpstep_free(&back);
	free(buf);

	/* the sizes a wrong record size would compute */
	check(encode_sized(&s, len) == 0, "the right size encodes");
	check(encode_sized(&s, len - 1) == -1, "one byte short: refused, nothing written past the end");
	check(encode_sized(&s, len - TENSOR_BYTES) == -1, "a tensor short: refused");
	check(encode_sized(&s, len - INSTR_BYTES) == -1, "an instruction short: refused");
	check(encode_sized(&s, DP_STEP_HEADER_BYTES - 1) == -1, "shorter than the header: refused");
	check(encode_sized(&s, 0) == -1, "no room at all: refused");
	check(encode_sized(&s, len + 1) == -1, "one byte long: refused (a size mismatch either way)");
	printf("stepfile_encode_test: %d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
