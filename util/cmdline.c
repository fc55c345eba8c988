/*
 * cmdline.c - shell-quoted command lines (util/cmdline.h).
 */
#include <stdlib.h>
#include <string.h>

#include "cmdline.h"

static int bare(const char *w)
{
	if (!*w)
		return 0;
	for (; *w; w++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%",
			    *w))
			return 0;
	return 1;
}

int cmd_append(char *buf, size_t len, const char *word)
{
	size_t n = strlen(buf), at = n;
	if (n && n + 1 < len)
		buf[at++] = ' ';
	if (bare(word)) {
		size_t k = strlen(word);
		if (at + k >= len)
			goto full;
		memcpy(buf + at, word, k + 1);
		return 0;
	}
	if (at + 2 >= len)
		goto full;
	buf[at++] = '\'';
	for (const char *p = word; *p; p++) {
		const char *piece = *p == '\'' ? "'\\''" : NULL;
		size_t k = piece ? 4 : 1;
		if (at + k + 1 >= len)
			goto full;
		if (piece)
			memcpy(buf + at, piece, k);
		else
			buf[at] = *p;
		at += k;
	}
	buf[at++] = '\'';
	buf[at] = '\0';
	return 0;
full:
	buf[n] = '\0';
	return -1;
}

int cmd_split_nul(char *buf, size_t n, int *argc, char ***argv)
{
	int count = 0;
	for (size_t i = 0; i < n; i++)
		count += buf[i] == '\0';
	if (n && buf[n - 1] != '\0')
		count++; /* a last word cut off by the caller's buffer: buf[n] ends it */
	char **v = malloc(((size_t)count + 1) * sizeof *v);
	if (!v)
		return -1;
	int k = 0;
	for (size_t i = 0; i < n && k < count; k++) {
		v[k] = buf + i;
		i += strnlen(buf + i, n - i) + 1;
	}
	v[k] = NULL;
	*argc = k;
	*argv = v;
	return 0;
}
