/*
 * suggest_test.c - util/suggest.c, the "did you mean" of dpc and dpexec: the
 * distance (insertions, deletions, substitutions, adjacent transpositions,
 * case-insensitive), how close a candidate must be for a word of each length,
 * ties, the word itself and NULL entries never offered, words past the cap.
 *
 * Built by `make tests` (build/tests/suggest_test), run by tests/unit.sh.
 */
#include <stdio.h>
#include <string.h>

#include "suggest.h"

static int failures, checks;

#define CHECK(cond, ...)                                             \
	do {                                                         \
		checks++;                                            \
		if (!(cond)) {                                       \
			failures++;                                  \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);  \
			printf(__VA_ARGS__);                         \
			printf("\n");                                \
		}                                                    \
	} while (0)

static void distance(const char *a, const char *b, int want)
{
	int got = suggest_distance(a, b), back = suggest_distance(b, a);
	CHECK(got == want && back == want, "distance('%s', '%s') = %d (reversed %d), want %d", a, b,
	      got, back, want);
}

/* suggest_among(word, names) is want (NULL: nothing offered). */
static void among(const char *word, const char *const *names, int n, const char *want)
{
	const char *got = suggest_among(word, names, n);
	CHECK(want ? got && strcmp(got, want) == 0 : got == NULL, "'%s' -> '%s', want '%s'", word,
	      got ? got : "(none)", want ? want : "(none)");
}

int main(void)
{
	/* the distance itself */
	distance("", "", 0);
	distance("", "abc", 3);
	distance("relu", "relu", 0);
	distance("kitten", "sitting", 3);
	distance("rellu", "relu", 1);   /* an insertion */
	distance("gelu", "relu", 1);    /* a substitution */
	distance("stpes", "steps", 1);  /* a transposition is one edit, not two */
	distance("ab", "ba", 1);
	distance("abc", "ca", 3);       /* optimal string alignment: no edit of a moved pair */
	distance("ReLU", "relu", 0);    /* case-insensitive */
	distance("PARAM", "parm", 1);
	{
		char long_word[80];
		memset(long_word, 'a', sizeof long_word - 1);
		long_word[sizeof long_word - 1] = 0;
		CHECK(suggest_distance(long_word, "a") >= 1 << 20,
		      "a word past 64 characters gets the large distance");
		distance(long_word + 16, "a", 62); /* 63 characters: still computed */
	}

	/* how close is close enough: 1 edit up to 4 characters, 2 up to 8, 3 beyond */
	static const char *const ops[] = {"relu", "gelu", "silu", "linear", "matmul", "softmax",
					  "cross_entropy", "embedding", "layernorm", "attention"};
	int nops = (int)(sizeof ops / sizeof ops[0]);
	among("rellu", ops, nops, "relu");
	among("relu", ops, nops, "gelu");        /* never the word itself */
	among("ReLU", ops, nops, "relu");        /* the same word in other case is offered */
	among("lu", ops, nops, NULL);            /* 2 edits for a 2-character word: too far */
	among("rlu", ops, nops, "relu");         /* 1 edit, 3 characters */
	among("gel", ops, nops, "gelu");
	among("linr", ops, nops, NULL);          /* 2 edits, 4 characters: too far */
	among("lnear", ops, nops, "linear");     /* 1 edit, 5 characters */
	among("lnaer", ops, nops, "linear");     /* 2 edits (a deletion, a transposition) */
	among("lnr", ops, nops, NULL);
	among("softmx", ops, nops, "softmax");
	among("sotfmx", ops, nops, "softmax");   /* 2 edits, 6 characters */
	among("sfmx", ops, nops, NULL);          /* 3 edits: too far for 4 characters */
	among("crossentropy", ops, nops, "cross_entropy");
	among("cross_entrop", ops, nops, "cross_entropy");
	among("crss_entrpy", ops, nops, "cross_entropy"); /* 2 edits, 11 characters */
	among("crs_entrpy", ops, nops, "cross_entropy");  /* 3 edits, 10 characters */
	among("cr_entrpy", ops, nops, NULL);              /* 4 edits: too far */
	among("embeding", ops, nops, "embedding");
	among("layer_norm", ops, nops, "layernorm");
	among("atention", ops, nops, "attention");
	among("conv2d", ops, nops, NULL);
	among("", ops, nops, NULL);

	/* ties go to the first candidate seen */
	static const char *const tie[] = {"cat", "bat", "hat"};
	among("mat", tie, 3, "cat");
	static const char *const tie2[] = {"hat", "bat", "cat"};
	among("mat", tie2, 3, "hat");
	/* a closer candidate later wins */
	static const char *const later[] = {"steps", "step"};
	among("stepp", later, 2, "steps");
	among("stpe", later, 2, "step");

	/* NULL and empty candidates are skipped; a NULL word matches nothing */
	static const char *const holes[] = {NULL, "", "param", NULL, "buffer"};
	among("parm", holes, 5, "param");
	among("bufer", holes, 5, "buffer");
	among(NULL, holes, 5, NULL);
	among("param", holes, 0, NULL);

	/* the incremental form, as a caller walking a table uses it */
	Suggest s;
	suggest_init(&s, "--stpes");
	CHECK(suggest_best(&s) == NULL, "no candidate yet: nothing offered");
	suggest_try(&s, "--steps");
	suggest_try(&s, "--save-every");
	suggest_try(&s, NULL);
	CHECK(suggest_best(&s) && strcmp(suggest_best(&s), "--steps") == 0, "--stpes -> %s",
	      suggest_best(&s) ? suggest_best(&s) : "(none)");
	CHECK(s.dist == 1, "--stpes is 1 edit from --steps, got %d", s.dist);

	printf("suggest_test: %d checks, %d failed\n", checks, failures);
	return failures != 0;
}
