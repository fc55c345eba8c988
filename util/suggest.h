/*
 * suggest.h - "did you mean": the closest of a set of names to a word a
 * user misspelt (an op, a setting, a section, a command-line option).
 * Linked into dpc and dpexec (util/suggest.c).
 *
 * The distance is Damerau-Levenshtein's (insertions, deletions,
 * substitutions and transpositions of adjacent characters each cost 1),
 * case-insensitive. A candidate is offered only when it is close enough to
 * be the likely intent: at most 1 edit for words of up to 4 characters, 2
 * up to 8, 3 beyond (`rellu` -> relu, `stratgy` -> strategy, `--stpes` ->
 * steps), and never the word itself. Ties go to the first candidate seen,
 * so callers offer candidates in a stable order.
 *
 *   Suggest s;
 *   suggest_init(&s, word);
 *   for (each name) suggest_try(&s, name);
 *   if (suggest_best(&s)) ... "did you mean '%s'?"
 */
#ifndef DP_SUGGEST_H
#define DP_SUGGEST_H

typedef struct {
	const char *word; /* what the user wrote */
	const char *best; /* the closest candidate so far, or NULL */
	int dist;         /* its distance */
} Suggest;

void suggest_init(Suggest *s, const char *word);
void suggest_try(Suggest *s, const char *candidate);
/* The closest candidate within the word's limit, or NULL. */
const char *suggest_best(const Suggest *s);
/* The same over an array of n names (NULL entries skipped). */
const char *suggest_among(const char *word, const char *const *names, int n);
/* Damerau-Levenshtein distance (optimal string alignment), case-insensitive;
 * capped: words longer than 64 characters give a large distance. */
int suggest_distance(const char *a, const char *b);

#endif
