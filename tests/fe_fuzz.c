/*
 * fe_fuzz.c - a deterministic mutation fuzzer for the front end.
 *
 *   fe_fuzz MODEL.dp [N [SEED]]
 *
 * Takes a valid model, applies N rounds of random mutations to it (byte
 * flips, deletions, duplicated or dropped lines, truncation, inserted
 * tokens), writes each mutant to a temp file and runs fe_compile on it with
 * diagnostics going to /dev/null. It passes when nothing crashes, aborts or
 * (under ASan/UBSan, see tests/errors.sh) trips a sanitizer. The same seed
 * gives the same mutants, so a crash is reproduced with the printed round.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend.h"
#include "fuzz_rand.h"

typedef struct {
	char *p;
	size_t n, cap;
} Buf;

static void reserve(Buf *b, size_t need)
{
	if (need <= b->cap)
		return;
	while (b->cap < need)
		b->cap = b->cap ? b->cap * 2 : 4096;
	b->p = realloc(b->p, b->cap);
	if (!b->p) {
		perror("fe_fuzz");
		exit(2);
	}
}

static void insert(Buf *b, size_t at, const char *s, size_t n)
{
	reserve(b, b->n + n);
	memmove(b->p + at + n, b->p + at, b->n - at);
	memcpy(b->p + at, s, n);
	b->n += n;
}

static void erase(Buf *b, size_t at, size_t n)
{
	if (at + n > b->n)
		n = b->n - at;
	memmove(b->p + at, b->p + at + n, b->n - at - n);
	b->n -= n;
}

/* Start and length of the line holding byte at. */
static void line_at(const Buf *b, size_t at, size_t *start, size_t *len)
{
	size_t s = at, e = at;
	while (s > 0 && b->p[s - 1] != '\n')
		s--;
	while (e < b->n && b->p[e] != '\n')
		e++;
	*start = s;
	*len = e < b->n ? e - s + 1 : e - s;
}

static const char *const tokens[] = {
	"(", ")", "[", "]", "{", "}", "\"", "=", ",", ":", ".", "-", ";", "\n", "#",
	"block b {\n", "param ", "from ", "init ", "relu(", "linear(", "cross_entropy(",
	"batch", "auto", "f32", "i32", "x", "y", "fc1.w", "99999999999999999999999",
	"1e999", "-1", "0", "3.5", "\\", "mesh auto\n", "mesh dp_shard=auto\n",
	"loss = cross_entropy(logits, y)\n", "relu(relu(relu(relu(relu(relu(relu(relu(",
	/* issue 4: config, constant expressions, repeat, keywords, annotations */
	"config {\n", "repeat 3 as i {\n", "repeat 65536 as j {\n", "block h[i] {\n", "*", "/",
	"+", "sqrt(", "9223372036854775807 * 2", "d / 3", "i", "d", " split(tp, col)",
	" split(tp, row)", "heads=", "transpose_b=true", "eps=", "x = add(x, relu(x))\n",
	"attention(", "reshape(x, -1, ", "tokens(\"t.bin\", shift=1)", "rope_cos(theta=10)",
	"embedding(", "h.0.w",
};

static void mutate(Buf *b, uint64_t *s)
{
	size_t at = below(s, b->n + 1);
	switch (below(s, 7)) {
	case 0: /* flip a byte to anything, NUL and non-UTF-8 included */
		if (b->n)
			b->p[below(s, b->n)] = (char)below(s, 256);
		break;
	case 1: /* delete a short range */
		erase(b, at, 1 + below(s, 16));
		break;
	case 2: { /* duplicate a line somewhere */
		if (!b->n)
			break;
		size_t ls, ll;
		line_at(b, below(s, b->n), &ls, &ll);
		char *copy = malloc(ll + 1);
		memcpy(copy, b->p + ls, ll);
		insert(b, at <= b->n ? at : b->n, copy, ll);
		free(copy);
		break;
	}
	case 3: { /* drop a line */
		if (!b->n)
			break;
		size_t ls, ll;
		line_at(b, below(s, b->n), &ls, &ll);
		erase(b, ls, ll);
		break;
	}
	case 4: /* truncate */
		b->n = at;
		break;
	default: { /* insert a token */
		const char *t = tokens[below(s, sizeof tokens / sizeof tokens[0])];
		insert(b, at, t, strlen(t));
		break;
	}
	}
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: fe_fuzz MODEL.dp [N [SEED]]\n");
		return 2;
	}
	long rounds = argc > 2 ? atol(argv[2]) : 2000;
	uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 1;
	FILE *f = fopen(argv[1], "rb");
	if (!f) {
		perror(argv[1]);
		return 2;
	}
	Buf orig = {0};
	for (;;) {
		reserve(&orig, orig.n + 4096);
		size_t got = fread(orig.p + orig.n, 1, 4096, f);
		orig.n += got;
		if (!got)
			break;
	}
	fclose(f);

	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	char path[4096];
	snprintf(path, sizeof path, "%s/fe_fuzz.XXXXXX", dir);
	int fd = mkstemp(path);
	if (fd < 0) {
		perror("mkstemp");
		return 2;
	}
	close(fd);
	FILE *devnull = fopen("/dev/null", "w");

	/* The unmutated model must compile (mesh auto: give it 2 ranks), or the
	 * fuzzer would only be exercising error paths. */
	Diag d0;
	diag_init(&d0, stderr, argv[1], NULL);
	Graph *g0 = fe_compile(argv[1], 2, &d0, NULL);
	if (!g0) {
		fprintf(stderr, "fe_fuzz: %s does not compile as given\n", argv[1]);
		return 1;
	}
	ir_free(g0);

	Buf b = {0};
	long compiled = 0;
	uint64_t s = seed;
	for (long r = 0; r < rounds; r++) {
		b.n = 0;
		reserve(&b, orig.n);
		memcpy(b.p, orig.p, orig.n);
		b.n = orig.n;
		int nmut = 1 + (int)below(&s, 4);
		for (int i = 0; i < nmut; i++)
			mutate(&b, &s);
		FILE *out = fopen(path, "wb");
		if (!out || fwrite(b.p, 1, b.n, out) != b.n || fclose(out) != 0) {
			perror(path);
			return 2;
		}
		Diag d;
		diag_init(&d, devnull, path, NULL);
		char *src = NULL;
		static const int worlds[] = {0, 1, 2, 3, 4, 8};
		Graph *g = fe_compile(path, worlds[below(&s, 6)], &d, &src);
		if (g) {
			compiled++;
			if (d.nerrors)
				die("fe_compile returned a graph after %d errors (round %ld)", d.nerrors, r);
		} else if (d.nerrors == 0) {
			die("fe_compile returned NULL without an error (round %ld)", r);
		}
		ir_free(g);
		free(src);
	}
	unlink(path);
	fclose(devnull);
	free(b.p);
	free(orig.p);
	printf("fe_fuzz: %ld mutants of %s (seed %llu), %ld compiled, no crash\n", rounds, argv[1],
	       (unsigned long long)seed, compiled);
	return 0;
}
