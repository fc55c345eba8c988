/*
 * ast.c - the syntax tree's arena.
 *
 * The parser allocates every node and string here; ast_free releases the
 * whole tree at once after lowering (or after a failed parse), so nodes that
 * error recovery discards need no destructors.
 */
#include <stdlib.h>
#include <string.h>

#include "ast.h"

struct AstChunk {
	AstChunk *next;
	size_t used, cap;
	max_align_t data[];
};

void *ast_alloc(ParseState *ps, size_t n)
{
	size_t align = sizeof(max_align_t);
	n = (n + align - 1) / align * align;
	AstChunk *c = ps->arena;
	if (!c || c->used + n > c->cap) {
		size_t cap = n > (64u << 10) ? n : (64u << 10);
		AstChunk *nc = malloc(sizeof(AstChunk) + cap);
		if (!nc)
			die("out of memory (%zu bytes)", cap);
		nc->next = c;
		nc->used = 0;
		nc->cap = cap;
		ps->arena = c = nc;
	}
	void *r = (char *)c->data + c->used;
	c->used += n;
	memset(r, 0, n);
	return r;
}

char *ast_strndup(ParseState *ps, const char *s, size_t n)
{
	char *r = ast_alloc(ps, n + 1);
	memcpy(r, s, n);
	r[n] = '\0';
	return r;
}

void ast_free(ParseState *ps)
{
	AstChunk *c = ps->arena;
	while (c) {
		AstChunk *next = c->next;
		free(c);
		c = next;
	}
	ps->arena = NULL;
	ps->top = NULL;
}
