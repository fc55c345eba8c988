/*
 * suggest.c - "did you mean": the closest name to a misspelt word
 * (util/suggest.h says how close is close enough).
 */
#include <ctype.h>
#include <string.h>

#include "suggest.h"

#define MAX_WORD 64

int suggest_distance(const char *a, const char *b)
{
	size_t n = strlen(a), m = strlen(b);
	if (n > MAX_WORD || m > MAX_WORD)
		return 1 << 20;
	/* d[i][j]: distance between the first i characters of a and j of b */
	int d[MAX_WORD + 1][MAX_WORD + 1];
	for (size_t i = 0; i <= n; i++)
		d[i][0] = (int)i;
	for (size_t j = 0; j <= m; j++)
		d[0][j] = (int)j;
	for (size_t i = 1; i <= n; i++)
		for (size_t j = 1; j <= m; j++) {
			int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
			int best = d[i - 1][j - 1] + (ca != cb);
			if (d[i - 1][j] + 1 < best)
				best = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < best)
				best = d[i][j - 1] + 1;
			if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
			    tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
				best = d[i - 2][j - 2] + 1;
			d[i][j] = best;
		}
	return d[n][m];
}

/* The most edits that still read as a typo of a word of n characters. */
static int limit(size_t n)
{
	return n <= 4 ? 1 : n <= 8 ? 2 : 3;
}

void suggest_init(Suggest *s, const char *word)
{
	s->word = word ? word : "";
	s->best = NULL;
	s->dist = 1 << 20;
}

void suggest_try(Suggest *s, const char *candidate)
{
	if (!candidate || !*candidate || strcmp(candidate, s->word) == 0)
		return;
	int d = suggest_distance(s->word, candidate);
	if (d < s->dist) {
		s->dist = d;
		s->best = candidate;
	}
}

const char *suggest_best(const Suggest *s)
{
	/* distance 0: the same word in other case (ReLU -> relu), a good guess */
	return s->best && s->dist <= limit(strlen(s->word)) ? s->best : NULL;
}

const char *suggest_among(const char *word, const char *const *names, int n)
{
	Suggest s;
	suggest_init(&s, word);
	for (int i = 0; i < n; i++)
		suggest_try(&s, names[i]);
	return suggest_best(&s);
}
