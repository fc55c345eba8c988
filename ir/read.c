/*
 * read.c - parses the text form of the IR (ir_read) back into a Graph.
 *
 * The form is the one ir/print.c writes and documents; the reader restores
 * every field the printer shows, so print(read(print(g))) == print(g). It
 * is dpc's input with --from-ir: a dump after any pass reads back as the
 * graph the next pass would have seen in the same run, so the rest of the
 * pipeline gives the same IR and the same step file. It also takes
 * hand-written IR (pass tests: IR in, one pass, IR out): the directives are
 * optional (ir_new's defaults), their keys come in any order, spacing is
 * free, and `#` or `;` starts a comment. A first line
 * "; dp IR [after PASS] (FILE)" restores g->file (ir_read_after gives
 * PASS: where the pipeline resumes).
 *
 * Names may be used before their declaration (declarations list values in id
 * order, and a parameter's view names the flat buffer declared after it), so
 * value references are recorded as fixups and resolved at the end. Then the
 * graph is made canonical (ir_canonicalize, which dpc also applies after
 * every pass): values get the ids the printer's order gives them
 * (declarations in id order, then inline SSA temporaries in program order),
 * nodes their program position. What the text leaves out is restored the
 * way the compiler made it: every value's batch and sequence dims through
 * the batch rules (the shape pass's way), a source's location from its
 * line= (the .dp line the step file carries). Locations of values and nodes
 * point into the IR text, so a pass run on read IR reports errors at the IR
 * line.
 *
 * Malformed text is a user error through error_at (file:line:col), one per
 * bad line, and ir_read returns NULL; it never crashes and never aborts.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"



/* Program words of node lines (must match print.c's progs_word); any other
 * mask reads as progs=N. */
static const struct {
	const char *word;
	unsigned progs;
} progs_words[] = {
	{"none", 0},
	{"step", IR_IN_STEP},
	{"eval", IR_IN_EVAL},
	{"both", IR_IN_STEP | IR_IN_EVAL},
	{"init", IR_IN_INIT},
	{"export", IR_IN_EXPORT},
};

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_NEVENTS (1 << 24) /* far beyond any schedule; bounds the verifier's tables */
/* Far beyond any arena, and small enough that sums and products of sizes,
 * offsets and dtype sizes never overflow an int64_t (the verifier, the
 * printer and the passes add and multiply them unchecked). */
#define MAX_ELEMS ((int64_t)1 << 48) /* a tensor's elements, a view's offset */
#define MAX_BYTES ((int64_t)1 << 56) /* an arena offset, nbytes */

typedef enum {
	TK_END,    /* end of line (or a comment) */
	TK_WORD,   /* a-z A-Z 0-9 _ . + - run: keywords, numbers, names */
	TK_VALUE,  /* %name or %"quoted", text without the % */
	TK_STRING, /* "..." decoded */
	TK_PUNCT,  /* , = : ( ) [ ] @ ? -> */
} TokKind;

typedef struct {
	TokKind kind;
	const char *text;
	int col; /* 1-based byte column */
} Tok;

/* A value reference to resolve once every name is known. */
typedef struct {
	int *slot;
	const char *name;
	Loc loc;
} Fixup;

typedef struct {
	Graph *g;
	Diag *d;
	const char *file; /* Loc.file of everything read */
	int errors;
	int line;
	int nbytes_given; /* the current line had nbytes= */
	/* the current line's tokens; texts live in tbuf */
	Tok *toks;
	int ntoks, captoks, pos;
	char *tbuf;
	size_t tbufcap, tbuflen;
	/* deferred name resolution */
	Fixup *fix;
	int nfix, capfix;
	/* name -> value id + 1, open addressing */
	int *hash;
	size_t hcap;
	/* sources and buckets, added to the graph after resolution (pool objects) */
	Source **srcs;
	int nsrcs, capsrcs;
	Bucket **bks;
	int nbks, capbks;
} Reader;

/* ---- errors ---- */

static Loc loc_at(Reader *r, int col)
{
	return (Loc){r->file, r->line, col};
}

__attribute__((format(printf, 3, 4))) static int fail_at(Reader *r, int col, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	error_at(r->d, loc_at(r, col), "%s", msg);
	r->errors++;
	return -1;
}

/* An error at a token, quoting it. */
static int fail_tok(Reader *r, const Tok *t, const char *what)
{
	if (t->kind == TK_END)
		return fail_at(r, t->col, "%s, found end of line", what);
	return fail_at(r, t->col, "%s, found '%s%.40s'", what, t->kind == TK_VALUE ? "%" : "",
		       t->text);
}

static void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	if (!q)
		die("out of memory reading IR");
	return q;
}

/* ---- lexer: one line at a time ---- */

static int plain_char(int c) /* must match print.c */
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.';
}

static int word_char(int c)
{
	return plain_char(c) || c == '+' || c == '-';
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static void push_tok(Reader *r, TokKind kind, const char *text, size_t n, int col)
{
	if (r->ntoks == r->captoks) {
		r->captoks = r->captoks ? r->captoks * 2 : 32;
		r->toks = xrealloc(r->toks, (size_t)r->captoks * sizeof(Tok));
	}
	char *dst = r->tbuf + r->tbuflen;
	memcpy(dst, text, n);
	dst[n] = '\0';
	r->tbuflen += n + 1;
	r->toks[r->ntoks++] = (Tok){kind, dst, col};
}

/* Decodes the string starting at s (on the opening quote) into the token
 * buffer; returns the position after the closing quote, or NULL. */
static const char *lex_string(Reader *r, const char *s, const char *end, TokKind kind, int col)
{
	const char *start = s;
	char *dst = r->tbuf + r->tbuflen;
	size_t n = 0;
	for (s++; s < end && *s != '"'; s++) {
		if (*s != '\\') {
			dst[n++] = *s;
			continue;
		}
		if (++s >= end)
			break;
		switch (*s) {
		case '\\': dst[n++] = '\\'; break;
		case '"': dst[n++] = '"'; break;
		case 'n': dst[n++] = '\n'; break;
		case 't': dst[n++] = '\t'; break;
		case 'x': {
			int h = s + 1 < end ? hexval((unsigned char)s[1]) : -1;
			int l = s + 2 < end ? hexval((unsigned char)s[2]) : -1;
			if (h < 0 || l < 0 || (h == 0 && l == 0)) {
				fail_at(r, col + (int)(s - start), "bad \\x escape in string");
				return NULL;
			}
			dst[n++] = (char)(h * 16 + l);
			s += 2;
			break;
		}
		default:
			fail_at(r, col + (int)(s - start), "unknown escape '\\%c' in string",
				(unsigned char)*s >= 0x20 ? *s : '?');
			return NULL;
		}
	}
	if (s >= end) {
		fail_at(r, col, "unterminated string");
		return NULL;
	}
	/* push_tok copies; copy onto itself is fine with memmove semantics, so
	 * lay the token down directly instead. */
	dst[n] = '\0';
	if (r->ntoks == r->captoks) {
		r->captoks = r->captoks ? r->captoks * 2 : 32;
		r->toks = xrealloc(r->toks, (size_t)r->captoks * sizeof(Tok));
	}
	r->toks[r->ntoks++] = (Tok){kind, dst, col};
	r->tbuflen += n + 1;
	return s + 1;
}

/* Splits [s, end) into tokens; 0, or -1 after reporting. */
static int lex_line(Reader *r, const char *s, const char *end)
{
	const char *line0 = s;
	size_t need = 2 * (size_t)(end - s) + 2;
	if (need > r->tbufcap) {
		r->tbufcap = need;
		r->tbuf = xrealloc(r->tbuf, need);
	}
	r->tbuflen = 0;
	r->ntoks = 0;
	r->pos = 0;
	while (s < end) {
		int c = (unsigned char)*s;
		int col = (int)(s - line0) + 1;
		if (c == ' ' || c == '\t' || c == '\r') {
			s++;
		} else if (c == '#' || c == ';') {
			break;
		} else if (c == '%') {
			if (s + 1 < end && s[1] == '"') {
				s = lex_string(r, s + 1, end, TK_VALUE, col);
				if (!s)
					return -1;
				continue;
			}
			const char *p = s + 1;
			while (p < end && plain_char((unsigned char)*p))
				p++;
			if (p == s + 1)
				return fail_at(r, col, "expected a value name after '%%'");
			push_tok(r, TK_VALUE, s + 1, (size_t)(p - s - 1), col);
			s = p;
		} else if (c == '"') {
			s = lex_string(r, s, end, TK_STRING, col);
			if (!s)
				return -1;
		} else if (c == '-' && s + 1 < end && s[1] == '>') {
			push_tok(r, TK_PUNCT, s, 2, col);
			s += 2;
		} else if (strchr(",=:()[]@?", c)) {
			push_tok(r, TK_PUNCT, s, 1, col);
			s++;
		} else if (word_char(c)) {
			const char *p = s;
			while (p < end && word_char((unsigned char)*p))
				p++;
			push_tok(r, TK_WORD, s, (size_t)(p - s), col);
			s = p;
		} else {
			return fail_at(r, col, c >= 0x20 && c < 0x7f ? "unexpected character '%c'"
								    : "unexpected byte 0x%02x", c);
		}
	}
	int col = (int)(s - line0) + 1;
	if (r->ntoks == r->captoks) {
		r->captoks = r->captoks ? r->captoks * 2 : 32;
		r->toks = xrealloc(r->toks, (size_t)r->captoks * sizeof(Tok));
	}
	r->toks[r->ntoks++] = (Tok){TK_END, "", col};
	return 0;
}

/* ---- token helpers ---- */

static const Tok *peek(Reader *r)
{
	return &r->toks[r->pos];
}

static const Tok *peek2(Reader *r)
{
	return r->pos + 1 < r->ntoks ? &r->toks[r->pos + 1] : &r->toks[r->ntoks - 1];
}

static const Tok *next(Reader *r)
{
	const Tok *t = &r->toks[r->pos];
	if (t->kind != TK_END)
		r->pos++;
	return t;
}

static int is_punct(const Tok *t, const char *p)
{
	return t->kind == TK_PUNCT && strcmp(t->text, p) == 0;
}

static int is_word(const Tok *t, const char *w)
{
	return t->kind == TK_WORD && strcmp(t->text, w) == 0;
}

static int expect_punct(Reader *r, const char *p)
{
	const Tok *t = next(r);
	if (is_punct(t, p))
		return 0;
	char what[32];
	snprintf(what, sizeof what, "expected '%s'", p);
	return fail_tok(r, t, what);
}

static int expect_end(Reader *r)
{
	const Tok *t = peek(r);
	return t->kind == TK_END ? 0 : fail_tok(r, t, "expected end of line");
}

static int lookup(const char *const *names, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(names[i], s) == 0)
			return (int)i;
	return -1;
}

/* A word from a fixed list; its index, or -1 after reporting. */
static int expect_enum(Reader *r, const char *const *names, size_t n, const char *what)
{
	const Tok *t = next(r);
	int i = t->kind == TK_WORD ? lookup(names, n, t->text) : -1;
	if (i < 0) {
		char msg[96];
		snprintf(msg, sizeof msg, "expected %s", what);
		fail_tok(r, t, msg);
	}
	return i;
}

/* ---- numbers ---- */

static int parse_i64(Reader *r, const Tok *t, int64_t *out)
{
	if (t->kind != TK_WORD)
		return fail_tok(r, t, "expected an integer");
	const char *s = t->text[0] == '+' ? t->text + 1 : t->text;
	char *e;
	errno = 0;
	long long v = strtoll(s, &e, 10);
	if (e == s || *e || errno == ERANGE || *s == '+' || *s == ' ')
		return fail_tok(r, t, "expected an integer");
	*out = v;
	return 0;
}

static int parse_range(Reader *r, const Tok *t, int64_t lo, int64_t hi, int64_t *out)
{
	if (parse_i64(r, t, out) < 0)
		return -1;
	if (*out < lo || *out > hi)
		return fail_at(r, t->col, "%s is out of range (%" PRId64 "..%" PRId64 ")", t->text, lo,
			       hi);
	return 0;
}

static int parse_u32(Reader *r, const Tok *t, uint32_t *out)
{
	int64_t v;
	if (parse_range(r, t, 0, UINT32_MAX, &v) < 0)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_int(Reader *r, const Tok *t, int *out)
{
	int64_t v;
	if (parse_range(r, t, INT32_MIN, INT32_MAX, &v) < 0)
		return -1;
	*out = (int)v;
	return 0;
}

static int parse_u64(Reader *r, const Tok *t, uint64_t *out)
{
	if (t->kind != TK_WORD || t->text[0] == '-' || t->text[0] == '+')
		return fail_tok(r, t, "expected an unsigned integer");
	char *e;
	errno = 0;
	unsigned long long v = strtoull(t->text, &e, 10);
	if (e == t->text || *e || errno == ERANGE)
		return fail_tok(r, t, "expected an unsigned integer");
	*out = v;
	return 0;
}

static int parse_float(Reader *r, const Tok *t, float *out)
{
	if (t->kind != TK_WORD)
		return fail_tok(r, t, "expected a number");
	char *e;
	errno = 0;
	float v = strtof(t->text, &e);
	/* ERANGE on underflow still gives the nearest float: keep it */
	if (e == t->text || *e || (errno == ERANGE && isinf(v)))
		return fail_tok(r, t, "expected a number");
	*out = v;
	return 0;
}

/* key=: the key word; NULL after reporting. */
static const char *parse_key(Reader *r)
{
	const Tok *t = next(r);
	if (t->kind != TK_WORD) {
		fail_tok(r, t, "expected key=value");
		return NULL;
	}
	if (expect_punct(r, "=") < 0)
		return NULL;
	return t->text;
}

/* ---- names and fixups ---- */

static uint64_t hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static int find_value(Reader *r, const char *name)
{
	if (!r->hcap)
		return -1;
	for (size_t i = hash_name(name) & (r->hcap - 1);; i = (i + 1) & (r->hcap - 1)) {
		int id = r->hash[i] - 1;
		if (id < 0)
			return -1;
		if (strcmp(r->g->values[id]->name, name) == 0)
			return id;
	}
}

static void hash_insert(Reader *r, int id)
{
	if ((size_t)(r->g->nvalues + 1) * 2 > r->hcap) {
		size_t nc = r->hcap ? r->hcap * 2 : 256;
		while ((size_t)(r->g->nvalues + 1) * 2 > nc)
			nc *= 2;
		free(r->hash);
		r->hash = calloc(nc, sizeof(int));
		if (!r->hash)
			die("out of memory reading IR");
		r->hcap = nc;
		for (int v = 0; v < r->g->nvalues; v++)
			if (v != id)
				hash_insert(r, v);
	}
	size_t i = hash_name(r->g->values[id]->name) & (r->hcap - 1);
	while (r->hash[i])
		i = (i + 1) & (r->hcap - 1);
	r->hash[i] = id + 1;
}

/* A new value named by token t, or NULL when the name is taken. */
static Value *new_value(Reader *r, const Tok *t)
{
	int old = find_value(r, t->text);
	if (old >= 0) {
		fail_at(r, t->col, "value %%%s is already defined (line %d)", t->text,
			r->g->values[old]->loc.line);
		return NULL;
	}
	Value *v = ir_value(r->g, t->text, DP_F32, 0, NULL, DP_T_ACT, loc_at(r, t->col));
	hash_insert(r, v->id);
	return v;
}

/* Records that *slot gets the id of the value token t names. */
static void add_fixup(Reader *r, int *slot, const Tok *t)
{
	if (r->nfix == r->capfix) {
		r->capfix = r->capfix ? r->capfix * 2 : 64;
		r->fix = xrealloc(r->fix, (size_t)r->capfix * sizeof(Fixup));
	}
	r->fix[r->nfix++] = (Fixup){slot, ir_strdup(r->g, t->text), loc_at(r, t->col)};
}

/* %value into *slot (later), or `_` (-1) when allow_none. */
static int parse_ref(Reader *r, int *slot, int allow_none)
{
	const Tok *t = next(r);
	if (allow_none && is_word(t, "_")) {
		*slot = -1;
		return 0;
	}
	if (t->kind != TK_VALUE)
		return fail_tok(r, t, allow_none ? "expected %value or _" : "expected %value");
	add_fixup(r, slot, t);
	return 0;
}

static int find_block(const Graph *g, const char *name)
{
	for (int i = 0; i < g->nblocks; i++)
		if (strcmp(g->blocks[i].name, name) == 0)
			return i;
	return -1;
}

/* A block name (word or string) that must be declared. */
static int parse_block_ref(Reader *r, int *out)
{
	const Tok *t = next(r);
	if (t->kind != TK_WORD && t->kind != TK_STRING)
		return fail_tok(r, t, "expected a block name");
	*out = find_block(r->g, t->text);
	if (*out < 0)
		return fail_at(r, t->col, "unknown block '%s'", t->text);
	return 0;
}

/* ---- types, placement, memory ---- */

static int parse_type(Reader *r, Value *v)
{
	const Tok *t = next(r);
	if (is_punct(t, "?")) {
		v->dtype = DP_F32;
		v->ndim = 0;
		return 0;
	}
	int dt = t->kind == TK_WORD ? lookup(dp_dtype_names, DP_NDTYPE, t->text) : -1;
	if (dt < 0)
		return fail_tok(r, t, "expected a type (f32[...], i32[...], bf16[...], f16[...] or ?)");
	v->dtype = (DpDtype)dt;
	v->ndim = 0;
	if (expect_punct(r, "[") < 0)
		return -1;
	if (is_punct(peek(r), "]")) {
		next(r);
		return 0;
	}
	int64_t elems = 1;
	for (;;) {
		const Tok *dt_tok = next(r);
		if (v->ndim == DP_MAX_DIMS)
			return fail_at(r, dt_tok->col, "more than %d dimensions", DP_MAX_DIMS);
		if (parse_range(r, dt_tok, 0, MAX_ELEMS, &v->dims[v->ndim]) < 0)
			return -1;
		if (v->dims[v->ndim] && elems > MAX_ELEMS / v->dims[v->ndim])
			return fail_at(r, dt_tok->col, "more than 2^48 elements");
		elems *= v->dims[v->ndim];
		v->ndim++;
		const Tok *sep = next(r);
		if (is_punct(sep, "]"))
			return 0;
		if (!is_punct(sep, ","))
			return fail_tok(r, sep, "expected ',' or ']'");
	}
}

/* place(dp_shard: shard0, tp: partial); the word place is consumed. */
static int parse_place(Reader *r, Value *v)
{
	if (expect_punct(r, "(") < 0)
		return -1;
	for (;;) {
		int a = expect_enum(r, ir_axis_names, DP_MAX_AXES, "a mesh axis");
		if (a < 0 || expect_punct(r, ":") < 0)
			return -1;
		const Tok *t = next(r);
		if (is_word(t, "replicate"))
			v->place[a] = (Place){DP_PL_REPLICATE, -1};
		else if (is_word(t, "partial"))
			v->place[a] = (Place){DP_PL_PARTIAL, -1};
		else if (t->kind == TK_WORD && strncmp(t->text, "shard", 5) == 0) {
			Tok dim = *t;
			dim.text += 5;
			int64_t d;
			if (parse_range(r, &dim, 0, DP_MAX_DIMS - 1, &d) < 0)
				return -1;
			v->place[a] = (Place){DP_PL_SHARD, (int8_t)d};
		} else
			return fail_tok(r, t, "expected replicate, partial or shardN");
		const Tok *sep = next(r);
		if (is_punct(sep, ")"))
			return 0;
		if (!is_punct(sep, ","))
			return fail_tok(r, sep, "expected ',' or ')'");
	}
}

/* Value attributes shared by declarations and inline temporaries:
 * place(...), host, @OFFSET, nbytes=N. 1 if one was parsed, 0 if the next token is
 * none of them, -1 on error. */
static int parse_value_memory(Reader *r, Value *v)
{
	const Tok *t = peek(r);
	if (is_word(t, "place") && is_punct(peek2(r), "(")) {
		next(r);
		return parse_place(r, v) < 0 ? -1 : 1;
	}
	if (is_word(t, "host")) {
		next(r);
		v->space = DP_SPACE_HOST;
		return 1;
	}
	if (is_punct(t, "@")) {
		next(r);
		return parse_range(r, next(r), -1, MAX_BYTES, &v->offset) < 0 ? -1 : 1;
	}
	if (is_word(t, "nbytes") && is_punct(peek2(r), "=")) {
		next(r);
		next(r);
		r->nbytes_given = 1;
		return parse_range(r, next(r), -MAX_BYTES, MAX_BYTES, &v->nbytes) < 0 ? -1 : 1;
	}
	return 0;
}

/* Without nbytes=, a planned value reserves exactly its size (print.c). */
static void imply_nbytes(Reader *r, Value *v)
{
	if (r->nbytes_given || v->offset == -1)
		return;
	v->nbytes = ir_span(v) * (int64_t)ir_dtype_size(v->dtype);
}

/* Axis mask: dp_replicate,dp_shard or a number. */
static int parse_axes(Reader *r, int64_t *mask)
{
	const Tok *t = peek(r);
	if (t->kind == TK_WORD && ((t->text[0] >= '0' && t->text[0] <= '9') || t->text[0] == '-'))
		return parse_i64(r, next(r), mask);
	*mask = 0;
	for (;;) {
		int a = expect_enum(r, ir_axis_names, DP_MAX_AXES, "a mesh axis");
		if (a < 0)
			return -1;
		*mask |= (int64_t)DP_AXIS_BIT(a);
		if (!is_punct(peek(r), ","))
			return 0;
		next(r);
	}
}

/* A set of pipeline stages: 0,3 (bit k: stage k), each below 64. */
static int parse_stages(Reader *r, int64_t *set)
{
	uint64_t m = 0;
	for (;;) {
		const Tok *t = next(r);
		int64_t k;
		if (parse_i64(r, t, &k) < 0)
			return -1;
		if (k < 0 || k > 63)
			return fail_tok(r, t, "a pipeline stage is 0 to 63");
		m |= (uint64_t)1 << k;
		if (!is_punct(peek(r), ","))
			break;
		next(r);
	}
	*set = (int64_t)m;
	return 0;
}

/* ---- directives ---- */

/* The value of a precision key: f32, bf16 or f16, or -1 after reporting. */
static int expect_float_dtype(Reader *r, const Tok *key)
{
	int dt = expect_enum(r, dp_dtype_names, DP_NDTYPE, "a dtype (f32, bf16, f16)");
	if (dt == DP_I32)
		return fail_at(r, key->col, "%s must be f32, bf16 or f16", key->text);
	return dt;
}

/* The value of setting id (after its key) into its field in r->g. */
static int parse_setting_value(Reader *r, int id, const Tok *key)
{
	const DpSetting *st = &dp_settings[id];
	void *f = ir_setting_field(r->g, id);
	int64_t x;
	if (st->type == DP_ST_DTYPE) {
		int dt = expect_float_dtype(r, key);
		if (dt < 0)
			return -1;
		*(int *)f = dt;
		return 0;
	}
	const Tok *t = next(r);
	switch (st->ctype) {
	case DP_CT_U32:
		return parse_u32(r, t, f);
	case DP_CT_U64:
		return parse_u64(r, t, f);
	case DP_CT_F32:
		return parse_float(r, t, f);
	case DP_CT_INT: { /* a boolean or a word's index, or a count */
		int n = dp_setting_nvalues(id);
		if (parse_range(r, t, 0, n ? n - 1 : INT32_MAX, &x) < 0)
			return -1;
		*(int *)f = (int)x;
		return 0;
	}
	}
	return fail_tok(r, t, "expected a value");
}

/* A settings line (the keyword consumed): `mesh AXIS=N ...`, or `WORD
 * [HEAD] key=value ...` with the rows of format/settings.def printed on it;
 * keys optional and in any order. */
static int parse_settings(Reader *r, int line)
{
	Graph *g = r->g;
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->ir_line != line || st->ir_mode != DP_IRM_HEAD)
			continue;
		if (st->type == DP_ST_SPEC) {
			int n = dp_kind_count(i);
			const char *names[16];
			char what[160] = "";
			size_t len = 0;
			for (int k = 0; k < n && k < 16; k++) {
				names[k] = dp_kind_name(i, k);
				len += (size_t)snprintf(what + len, sizeof what - len, "%s%s",
							k == 0 ? "" : k == n - 1 ? " or " : ", ",
							names[k]);
				if (len >= sizeof what)
					len = sizeof what - 1;
			}
			int k = expect_enum(r, names, (size_t)(n < 16 ? n : 16), what);
			if (k < 0)
				return -1;
			ir_settings_kind(g, i, k);
		} else {
			int s = expect_enum(r, dp_strategy_names, DP_NSTRAT,
					    "a strategy (ddp, zero1, zero2, full_shard, hybrid_shard)");
			if (s < 0)
				return -1;
			dp_field_set(ir_setting_field(g, i), dp_settings[i].ctype, s);
			memset(g->strategy, 0, sizeof g->strategy);
			snprintf(g->strategy, sizeof g->strategy, "%s", dp_strategy_names[s]);
		}
	}
	while (peek(r)->kind != TK_END) {
		const Tok *k = peek(r);
		const char *key = parse_key(r);
		if (!key)
			return -1;
		int id = -1, axis = -1;
		for (int i = 0; i < DP_NSETTINGS && id < 0; i++) {
			const DpSetting *st = &dp_settings[i];
			if (st->ir_line != line || st->ir_mode == DP_IRM_HEAD)
				continue;
			if (st->ctype == DP_CT_AXES) {
				axis = lookup(ir_axis_names, DP_MAX_AXES, key);
				id = axis >= 0 ? i : -1;
			} else if (strcmp(st->ir_key, key) == 0) {
				id = i;
			}
		}
		if (id < 0 && line == DP_IRL_MESH)
			return fail_at(r, k->col, "unknown mesh axis '%s'", key);
		if (id < 0)
			return fail_at(r, k->col, "unknown %s key '%s'", ir_line_names[line], key);
		if (axis >= 0 ? parse_u32(r, next(r), (uint32_t *)ir_setting_field(g, id) + axis)
			      : parse_setting_value(r, id, k))
			return -1;
	}
	return 0;
}

static int parse_memory(Reader *r)
{
	while (peek(r)->kind != TK_END) {
		const Tok *k = peek(r);
		const char *key = parse_key(r);
		if (!key)
			return -1;
		int64_t *dst = strcmp(key, "peak") == 0 ? &r->g->peak_bytes
			       : strcmp(key, "persistent") == 0 ? &r->g->persistent_bytes : NULL;
		if (!dst)
			return fail_at(r, k->col, "unknown memory key '%s'", key);
		if (parse_i64(r, next(r), dst) < 0)
			return -1;
	}
	return 0;
}

/* roles / metrics: key=%value pairs into the graph's fields. */
static int parse_refs(Reader *r, const char *const *keys, int *const *slots, int n, const char *what)
{
	while (peek(r)->kind != TK_END) {
		const Tok *k = peek(r);
		const char *key = parse_key(r);
		if (!key)
			return -1;
		int i = lookup(keys, (size_t)n, key);
		if (i < 0)
			return fail_at(r, k->col, "unknown %s '%s'", what, key);
		if (parse_ref(r, slots[i], 0) < 0)
			return -1;
	}
	return 0;
}

static int parse_events(Reader *r)
{
	int64_t n;
	if (parse_range(r, next(r), 0, MAX_NEVENTS, &n) < 0)
		return -1;
	r->g->nevents = (int)n;
	return expect_end(r);
}

/* block NAME [strategy=S] [reshard_after_forward=0|1] [recompute=0|1] [stage=N]
 * [chunk=N] [param_dtype=D] [buffer_dtype=D] [weight_decay=X] [lr_scale=X] [compress=K]
 * [offload=none|optimizer|params] */
static int parse_block_decl(Reader *r)
{
	const Tok *t = next(r);
	if (t->kind != TK_WORD && t->kind != TK_STRING)
		return fail_tok(r, t, "expected a block name");
	if (find_block(r->g, t->text) >= 0)
		return fail_at(r, t->col, "block '%s' is declared twice", t->text);
	int bi = ir_add_block(r->g, t->text, loc_at(r, t->col)); /* may move blocks[] */
	Block *b = &r->g->blocks[bi];
	while (peek(r)->kind != TK_END) {
		const Tok *k = peek(r);
		const char *key = parse_key(r);
		if (!key)
			return -1;
		if (strcmp(key, "strategy") == 0) {
			b->strategy_loc = loc_at(r, k->col);
			b->strategy = expect_enum(r, dp_strategy_names, DP_NSTRAT,
						  "a strategy (ddp, zero1, zero2, full_shard, hybrid_shard)");
			if (b->strategy < 0)
				return -1;
		} else if (strcmp(key, "reshard_after_forward") == 0) {
			int64_t x;
			if (parse_range(r, next(r), 0, 1, &x) < 0)
				return -1;
			b->reshard = (int)x;
		} else if (strcmp(key, "recompute") == 0) {
			int64_t x;
			if (parse_range(r, next(r), 0, 1, &x) < 0)
				return -1;
			b->recompute = (int)x;
		} else if (strcmp(key, "stage") == 0) {
			int64_t x;
			b->stage_loc = loc_at(r, k->col);
			if (parse_range(r, next(r), 0, 1 << 15, &x) < 0)
				return -1;
			b->stage = (int)x;
		} else if (strcmp(key, "chunk") == 0) {
			int64_t x;
			if (parse_range(r, next(r), 0, 1 << 15, &x) < 0)
				return -1;
			b->chunk = (int)x;
		} else if (strcmp(key, "param_dtype") == 0 || strcmp(key, "buffer_dtype") == 0) {
			int dt = expect_float_dtype(r, k);
			if (dt < 0)
				return -1;
			*(key[0] == 'p' ? &b->param_dtype : &b->buffer_dtype) = dt;
		} else if (strcmp(key, "weight_decay") == 0 || strcmp(key, "lr_scale") == 0) {
			const Tok *x = next(r);
			float *f = key[0] == 'w' ? &b->weight_decay : &b->lr_scale;
			if (parse_float(r, x, f) < 0)
				return -1;
			if (!(*f >= 0) || isinf(*f) || (key[0] == 'l' && *f == 0))
				return fail_at(r, x->col, "%s must be %s", key,
					       key[0] == 'w' ? ">= 0" : "> 0");
		} else if (strcmp(key, "compress") == 0) {
			const Tok *x = next(r);
			b->compress_loc = loc_at(r, k->col);
			b->compress = x->kind == TK_WORD ? dp_kind_find(DP_SET_COMPRESS, x->text) : -1;
			if (b->compress < 0)
				return fail_tok(r, x, "expected a compression (none, powersgd)");
		} else if (strcmp(key, "offload") == 0) {
			b->offload = expect_enum(r, dp_settings[DP_SET_OFFLOAD].words, 3,
						 "an offload (none, optimizer, params)");
			if (b->offload < 0)
				return -1;
		} else {
			return fail_at(r, k->col, "unknown block key '%s'", key);
		}
	}
	return 0;
}

/* source SPLIT KIND "PATH" -> %v ROLE sample=N [shift=1] [seq_split=1] [n=N classes=N]
 * [line=N] */
static int parse_source(Reader *r)
{
	Source *s = ir_alloc(r->g, sizeof(Source));
	s->loc = loc_at(r, r->toks[r->pos - 1].col);
	int split = expect_enum(r, ir_split_names, NELEMS(ir_split_names), "train or eval");
	if (split < 0)
		return -1;
	int kind = expect_enum(r, ir_src_kind_names, NELEMS(ir_src_kind_names), "idx, npy, synthetic, tokens, positions or sample_keys");
	if (kind < 0)
		return -1;
	const Tok *path = next(r);
	if (path->kind != TK_STRING)
		return fail_tok(r, path, "expected a quoted path");
	s->path = ir_strdup(r->g, path->text);
	if (expect_punct(r, "->") < 0 || parse_ref(r, &s->value, 0) < 0)
		return -1;
	int role = expect_enum(r, ir_role_names, NELEMS(ir_role_names), "features or labels");
	if (role < 0)
		return -1;
	s->rec.split = (uint8_t)split;
	s->rec.kind = (uint8_t)kind;
	s->rec.role = (uint8_t)role;
	while (peek(r)->kind != TK_END) {
		const Tok *k = peek(r);
		const char *key = parse_key(r);
		if (!key)
			return -1;
		int rc;
		if (strcmp(key, "sample") == 0)
			rc = parse_i64(r, next(r), &s->rec.sample_elems);
		else if (strcmp(key, "n") == 0)
			rc = parse_i64(r, next(r), &s->rec.synth_n);
		else if (strcmp(key, "classes") == 0) {
			int c = 0;
			rc = parse_int(r, next(r), &c);
			s->rec.synth_classes = c;
		} else if (strcmp(key, "line") == 0) {
			rc = parse_u32(r, next(r), &s->rec.src_line);
		} else if (strcmp(key, "seq_split") == 0) {
			int64_t x;
			if (parse_range(r, next(r), 0, 1, &x) < 0)
				return -1;
			s->rec.seq_split = (uint8_t)x;
		} else if (strcmp(key, "shift") == 0) {
			int sh = 0;
			rc = parse_int(r, next(r), &sh);
			if (rc == 0 && (sh < 0 || sh > 1))
				return fail_at(r, k->col, "shift must be 0 or 1");
			s->rec.shift = (uint8_t)sh;
		} else
			return fail_at(r, k->col, "unknown source key '%s'", key);
		if (rc < 0)
			return -1;
	}
	/* line=N is where the .dp file declares the source (none: a pass made
	 * it): the step file carries loc's line (ir/stepfile_write.c), and
	 * errors about the source point there */
	int line = (int)s->rec.src_line;
	s->loc = (Loc){r->g->file ? r->g->file : r->file, line, line ? 1 : 0};
	if (r->nsrcs == r->capsrcs) {
		r->capsrcs = r->capsrcs ? r->capsrcs * 2 : 8;
		r->srcs = xrealloc(r->srcs, (size_t)r->capsrcs * sizeof(Source *));
	}
	r->srcs[r->nsrcs++] = s;
	return 0;
}

/* bucket rN OP axes=LIST elems=N %view = %m1, %m2, ... */
static int parse_bucket(Reader *r)
{
	const Tok *t = next(r);
	char want[32];
	snprintf(want, sizeof want, "r%d", r->nbks);
	if (!is_word(t, want))
		return fail_tok(r, t, r->nbks == 0 ? "expected bucket name r0"
						   : "expected the next bucket name rN (in order)");
	Bucket *b = ir_alloc(r->g, sizeof(Bucket));
	b->view = -1;
	int op = expect_enum(r, dp_op_names, DP_NOPS, "a collective op");
	if (op < 0)
		return -1;
	if (!dp_is_collective((unsigned)op))
		return fail_at(r, r->toks[r->pos - 1].col, "a bucket's op must be a collective");
	b->op = (IrOp)op;
	while (peek(r)->kind == TK_WORD) {
		const Tok *k = peek(r);
		const char *key = parse_key(r);
		if (!key)
			return -1;
		int64_t x;
		if (strcmp(key, "axes") == 0) {
			if (parse_axes(r, &x) < 0)
				return -1;
			if (x < 0 || x > UINT32_MAX)
				return fail_at(r, k->col, "axis mask out of range");
			b->axes = (unsigned)x;
		} else if (strcmp(key, "elems") == 0) {
			if (parse_i64(r, next(r), &b->elems) < 0)
				return -1;
		} else
			return fail_at(r, k->col, "unknown bucket key '%s'", key);
	}
	if (parse_ref(r, &b->view, 0) < 0 || expect_punct(r, "=") < 0)
		return -1;
	/* members: count them first, then record fixups into a pool array */
	int start = r->pos, n = 0;
	for (;;) {
		const Tok *m = next(r);
		if (m->kind != TK_VALUE)
			return fail_tok(r, m, "expected a member %value");
		n++;
		if (peek(r)->kind == TK_END)
			break;
		if (expect_punct(r, ",") < 0)
			return -1;
	}
	b->nmembers = n;
	b->members = ir_alloc(r->g, (size_t)n * sizeof(int));
	r->pos = start;
	for (int i = 0; i < n; i++) {
		parse_ref(r, &b->members[i], 0);
		if (i + 1 < n)
			next(r);
	}
	if (r->nbks == r->capbks) {
		r->capbks = r->capbks ? r->capbks * 2 : 8;
		r->bks = xrealloc(r->bks, (size_t)r->capbks * sizeof(Bucket *));
	}
	r->bks[r->nbks++] = b;
	return 0;
}

/* ---- declarations ---- */

/* After `%name : type`, a kind word and value attributes. */
static int parse_decl(Reader *r, Value *v)
{
	int kind = expect_enum(r, ir_kind_names, DP_T_BUFFER + 1, "a value kind (act, data, param, ...)");
	if (kind < 0)
		return -1;
	v->kind = (DpTensorKind)kind;
	while (peek(r)->kind != TK_END) {
		int m = parse_value_memory(r, v);
		if (m < 0)
			return -1;
		if (m)
			continue;
		const Tok *k = peek(r);
		const char *key = parse_key(r);
		if (!key)
			return -1;
		if (strcmp(key, "block") == 0) {
			if (parse_block_ref(r, &v->block) < 0)
				return -1;
		} else if (strcmp(key, "init") == 0) {
			int init = expect_enum(r, ir_init_names, NELEMS(ir_init_names), "an initialiser");
			if (init < 0)
				return -1;
			v->init = (DpInit)init;
			if (is_punct(peek(r), "(")) {
				next(r);
				if (parse_float(r, next(r), &v->init_a) < 0 || expect_punct(r, ",") < 0 ||
				    parse_float(r, next(r), &v->init_b) < 0 || expect_punct(r, ")") < 0)
					return -1;
			}
		} else if (strcmp(key, "view") == 0) {
			if (parse_ref(r, &v->view_of, 0) < 0)
				return -1;
			const Tok *off = next(r);
			if (off->kind != TK_WORD || off->text[0] != '+')
				return fail_tok(r, off, "expected +OFFSET after the viewed value");
			if (parse_range(r, off, 0, MAX_ELEMS, &v->view_offset) < 0)
				return -1;
		} else if (strcmp(key, "ld") == 0) {
			if (parse_range(r, next(r), 1, MAX_ELEMS, &v->ld) < 0)
				return -1;
		} else if (strcmp(key, "of") == 0) {
			if (parse_ref(r, &v->param, 0) < 0)
				return -1;
		} else if (strcmp(key, "source") == 0) {
			if (parse_int(r, next(r), &v->source) < 0)
				return -1;
		} else
			return fail_at(r, k->col, "unknown value attribute '%s'", key);
	}
	imply_nbytes(r, v);
	return 0;
}

/* ---- nodes ---- */

/* iaN / faN: the index, or -1. */
static int generic_attr(const char *key, const char *prefix, int n)
{
	if (strncmp(key, prefix, 2) != 0 || key[2] < '0' || key[2] >= '0' + n || key[3])
		return -1;
	return key[2] - '0';
}

/* The attributes after a node's inputs, into n. */
static int parse_node_attrs(Reader *r, Node *n)
{
	int have_phase = 0, have_progs = 0, sample = 0;
	while (peek(r)->kind != TK_END) {
		const Tok *t = next(r);
		if (t->kind != TK_WORD)
			return fail_tok(r, t, "expected an attribute");
		int has_value = is_punct(peek(r), "=");
		const OpAttr *an = ir_op_attr(n->op, t->text);
		int ph = lookup(ir_phase_names, NELEMS(ir_phase_names), t->text);
		if (!has_value && ph >= 0 && !have_phase) {
			n->phase = (Phase)ph;
			have_phase = 1;
			/* a bare word or a string right after the phase is the block */
			const Tok *b = peek(r);
			if (b->kind == TK_STRING ||
			    (b->kind == TK_WORD && !is_punct(peek2(r), "=") &&
			     lookup(ir_reserved_words, IR_NRESERVED, b->text) < 0 && !ir_op_attr(n->op, b->text))) {
				if (parse_block_ref(r, &n->block) < 0)
					return -1;
			}
			continue;
		}
		if (!has_value) {
			size_t p = 0;
			while (p < NELEMS(progs_words) && strcmp(progs_words[p].word, t->text) != 0)
				p++;
			if (p < NELEMS(progs_words)) {
				n->progs = progs_words[p].progs;
				have_progs = 1;
			} else if (strcmp(t->text, "sample") == 0) {
				sample = 1; /* added to the programs the other words give */
			} else if (strcmp(t->text, "last") == 0) {
				n->flags |= DP_IF_LAST;
			} else if (strcmp(t->text, "first") == 0) {
				n->flags |= DP_IF_FIRST;
			} else if (strcmp(t->text, "compressed") == 0) {
				n->flags |= DP_IF_COMPRESSED;
			} else if (strcmp(t->text, "plain") == 0) {
				n->flags |= DP_IF_PLAIN;
			} else if (strcmp(t->text, "recompute") == 0) {
				n->recompute = 1;
			} else if (an && an->style == IR_ATTR_FLAG) {
				IR_ATTR(n, an) = 1;
			} else {
				return fail_at(r, t->col, "unknown attribute '%s' for %s", t->text,
					       dp_op_names[n->op]);
			}
			continue;
		}
		next(r); /* = */
		const Tok *val = peek(r);
		int rc = 0, gi;
		if (an && an->style == IR_ATTR_FLOAT) {
			rc = parse_float(r, next(r), &IR_FATTR(n, an));
		} else if (an && an->style == IR_ATTR_AXES) {
			rc = parse_axes(r, &IR_ATTR(n, an));
		} else if (an && an->style == IR_ATTR_STAGES) {
			rc = parse_stages(r, &IR_ATTR(n, an));
		} else if (an) {
			rc = parse_i64(r, next(r), &IR_ATTR(n, an));
		} else if ((gi = generic_attr(t->text, "ia", DP_NIATTR)) >= 0) {
			rc = parse_i64(r, next(r), &n->ia[gi]);
		} else if ((gi = generic_attr(t->text, "fa", DP_NFATTR)) >= 0) {
			rc = parse_float(r, next(r), &n->fa[gi]);
		} else if (strcmp(t->text, "block") == 0) {
			rc = parse_block_ref(r, &n->block);
		} else if (strcmp(t->text, "stream") == 0) {
			if (is_word(val, "comm") || is_word(val, "compute") || is_word(val, "copy") ||
			    is_word(val, "p2p")) {
				n->stream = is_word(val, "comm")   ? DP_STREAM_COMM
					    : is_word(val, "copy") ? DP_STREAM_COPY
					    : is_word(val, "p2p")  ? DP_STREAM_P2P
								   : DP_STREAM_COMPUTE;
				next(r);
			} else
				rc = parse_int(r, next(r), &n->stream);
		} else if (strcmp(t->text, "bucket") == 0) {
			Tok num = *next(r);
			if (num.kind != TK_WORD || num.text[0] != 'r')
				return fail_tok(r, &num, "expected a bucket name rN");
			num.text++;
			int64_t b;
			rc = parse_range(r, &num, 0, INT32_MAX, &b);
			n->bucket = (int)b;
		} else if (strcmp(t->text, "stage") == 0) {
			int64_t st;
			rc = parse_range(r, next(r), 0, INT16_MAX, &st);
			n->stage = (int)st;
		} else if (strcmp(t->text, "chunk") == 0) {
			int64_t ch;
			rc = parse_range(r, next(r), 0, INT16_MAX, &ch);
			n->chunk = (int)ch;
		} else if (strcmp(t->text, "offload") == 0) {
			n->offload = expect_enum(r, dp_settings[DP_SET_OFFLOAD].words, 3,
						 "an offload (none, optimizer, params)");
			rc = n->offload < 0 ? -1 : 0;
		} else if (strcmp(t->text, "progs") == 0) {
			int64_t p;
			rc = parse_range(r, next(r), 0, UINT32_MAX, &p);
			n->progs = (unsigned)p;
			have_progs = 1;
		} else if (strcmp(t->text, "flags") == 0) {
			int64_t f;
			rc = parse_range(r, next(r), 0, UINT32_MAX, &f);
			n->flags |= (unsigned)f;
		} else {
			return fail_at(r, t->col, "unknown attribute '%s' for %s", t->text,
				       dp_op_names[n->op]);
		}
		if (rc < 0)
			return -1;
	}
	if (!have_phase)
		return fail_at(r, peek(r)->col,
			       "missing phase (data, fwd, bwd, comm, opt, eval or setup)");
	if (!have_progs)
		n->progs = ir_default_progs(n->phase);
	if (sample)
		n->progs |= IR_IN_SAMPLE;
	return 0;
}

/* A node line from the op word on; out_tok names a declared value written
 * (`%v = op`), temp is a new SSA temporary (`%v : type = op`), or neither. */
static int parse_node(Reader *r, const Tok *out_tok, Value *temp)
{
	const Tok *optok = next(r);
	int op = optok->kind == TK_WORD ? lookup(dp_op_names, DP_NOPS, optok->text) : -1;
	if (op < 0)
		return fail_tok(r, optok, "expected an op or a directive");
	const Tok *ins[DP_MAX_IN];
	int nin = 0;
	const Tok *t = peek(r);
	if (t->kind == TK_VALUE || is_word(t, "_")) {
		for (;;) {
			t = next(r);
			if (t->kind != TK_VALUE && !is_word(t, "_"))
				return fail_tok(r, t, "expected an input %value or _");
			if (nin == DP_MAX_IN)
				return fail_at(r, t->col, "more than %d inputs", DP_MAX_IN);
			ins[nin++] = t;
			if (!is_punct(peek(r), ","))
				break;
			next(r);
		}
	}
	Node *n = ir_node(r->g, (IrOp)op, -1, 0, NULL, PH_FWD, loc_at(r, optok->col));
	n->nin = nin;
	for (int i = 0; i < nin; i++) {
		if (ins[i]->kind == TK_VALUE)
			add_fixup(r, &n->in[i], ins[i]);
		else
			n->in[i] = -1;
	}
	if (parse_node_attrs(r, n) < 0)
		return -1;
	if (temp) {
		n->out = temp->id;
		temp->def = n->id;
		temp->block = n->block;
		temp->loc = n->loc;
	} else if (out_tok) {
		add_fixup(r, &n->out, out_tok);
	}
	return 0;
}

/* A line starting with %name: a declaration or a node writing a value. */
static int parse_value_line(Reader *r)
{
	const Tok *name = next(r);
	if (is_punct(peek(r), "=")) {
		next(r);
		return parse_node(r, name, NULL);
	}
	if (expect_punct(r, ":") < 0)
		return -1;
	Value *v = new_value(r, name);
	if (!v || parse_type(r, v) < 0)
		return -1;
	const Tok *t = peek(r);
	if (t->kind == TK_WORD && lookup(ir_kind_names, DP_T_BUFFER + 1, t->text) >= 0)
		return parse_decl(r, v);
	/* an inline SSA temporary: value attributes, then = op ... */
	for (;;) {
		int m = parse_value_memory(r, v);
		if (m < 0)
			return -1;
		if (!m)
			break;
	}
	t = next(r);
	if (!is_punct(t, "="))
		return fail_tok(r, t, "expected a value kind or '= op'");
	imply_nbytes(r, v);
	return parse_node(r, NULL, v);
}

static int parse_roles(Reader *r)
{
	static const char *const keys[] = {"loss", "logits", "labels"};
	int *const slots[] = {&r->g->loss, &r->g->logits, &r->g->labels};
	return parse_refs(r, keys, slots, 3, "role");
}

static int parse_metrics(Reader *r)
{
	static const char *const keys[] = {"loss", "grad_norm", "eval_loss", "eval_correct",
					   "sample_tokens", "sample_logits"};
	DpMetrics *m = &r->g->metrics;
	int *const slots[] = {&m->loss, &m->grad_norm, &m->eval_loss, &m->eval_correct,
			      &m->sample_tokens, &m->sample_logits};
	return parse_refs(r, keys, slots, 6, "metric");
}

/* Directive lines: keyword, then its parser (the keyword is consumed). */
static const struct {
	const char *word;
	int (*parse)(Reader *r);
} directives[] = {
	{"memory", parse_memory},
	{"roles", parse_roles},       {"metrics", parse_metrics}, {"events", parse_events},
	{"block", parse_block_decl},  {"source", parse_source},   {"bucket", parse_bucket},
};

static int parse_line(Reader *r)
{
	const Tok *t = peek(r);
	r->nbytes_given = 0;
	if (t->kind == TK_END)
		return 0;
	if (t->kind == TK_VALUE)
		return parse_value_line(r);
	if (t->kind != TK_WORD)
		return fail_tok(r, t, "expected a directive, a declaration or a node");
	for (int line = DP_IRL_MESH; line < DP_NIRL; line++)
		if (strcmp(t->text, ir_line_names[line]) == 0) {
			next(r);
			return parse_settings(r, line);
		}
	for (size_t i = 0; i < NELEMS(directives); i++)
		if (strcmp(t->text, directives[i].word) == 0) {
			next(r);
			return directives[i].parse(r);
		}
	return parse_node(r, NULL, NULL);
}

/* ---- the whole text ---- */

/* "; dp IR [after PASS] (FILE)" on the first line names the source file. */
static void parse_header(Reader *r, const char *s, const char *end)
{
	static const char tag[] = "; dp IR";
	if ((size_t)(end - s) < sizeof tag - 1 || memcmp(s, tag, sizeof tag - 1) != 0)
		return;
	const char *open = memchr(s, '(', (size_t)(end - s));
	const char *close = end;
	while (close > s && (close[-1] == '\r' || close[-1] == ' '))
		close--;
	if (!open || close <= open + 1 || close[-1] != ')')
		return;
	size_t n = (size_t)(close - 1 - (open + 1));
	char *f = ir_alloc(r->g, n + 1);
	memcpy(f, open + 1, n);
	r->g->file = f;
}

/* ---- ids ---- */

static void remap(int *id, const int *to, int n)
{
	if (*id >= 0 && *id < n)
		*id = to[*id];
}

/* Every reference to a value, id i becoming to[i] (i < nv). */
static void remap_values(Graph *g, const int *to, int nv)
{
	for (int i = 0; i < g->nvalues; i++) {
		Value *v = g->values[i];
		remap(&v->view_of, to, nv);
		remap(&v->grad, to, nv);
		remap(&v->param, to, nv);
	}
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		for (int k = 0; k < n->nin && k < DP_MAX_IN; k++)
			remap(&n->in[k], to, nv);
		remap(&n->out, to, nv);
	}
	for (int i = 0; i < g->nsources; i++)
		remap(&g->sources[i].value, to, nv);
	for (int i = 0; i < g->nbuckets; i++) {
		Bucket *b = &g->buckets[i];
		remap(&b->view, to, nv);
		for (int m = 0; m < b->nmembers; m++)
			remap(&b->members[m], to, nv);
	}
	int *ids[] = {&g->loss, &g->logits, &g->labels, &g->metrics.loss,
		      &g->metrics.grad_norm, &g->metrics.eval_loss, &g->metrics.eval_correct,
		      &g->metrics.sample_tokens, &g->metrics.sample_logits};
	for (size_t i = 0; i < NELEMS(ids); i++)
		remap(ids[i], to, nv);
}

void ir_drop_value(Graph *g, int id)
{
	ir_drop_values(g, &id, 1);
}

void ir_drop_values(Graph *g, const int *ids, int n)
{
	int nv = g->nvalues, k = 0;
	int *to = malloc(((size_t)nv + 1) * sizeof(int));
	if (!to)
		die("out of memory");
	for (int i = 0; i < nv; i++)
		to[i] = 0;
	for (int i = 0; i < n; i++)
		to[ids[i]] = -1;
	for (int i = 0; i < nv; i++) {
		if (to[i] < 0)
			continue;
		to[i] = k;
		g->values[k] = g->values[i];
		g->values[k]->id = k;
		k++;
	}
	g->nvalues = k;
	remap_values(g, to, nv);
	free(to);
}

void ir_canonicalize(Graph *g)
{
	int nv = g->nvalues, nn = g->nnodes, maxid = g->next_node_id;
	for (int i = 0; i < nn; i++)
		if (g->nodes[i]->id >= maxid)
			maxid = g->nodes[i]->id + 1;
	int *order = malloc(((size_t)nv + 1) * sizeof(int));
	int *to = malloc(((size_t)nv + 1) * sizeof(int));
	int *node_to = malloc(((size_t)maxid + 1) * sizeof(int));
	Value **values = malloc(((size_t)nv + 1) * sizeof(Value *));
	if (!order || !to || !node_to || !values)
		die("out of memory");
	int ndecl;
	if (ir_value_order(g, order, &ndecl) == nv) { /* else a broken graph: leave it as it is */
		for (int i = 0; i < maxid; i++)
			node_to[i] = -1;
		for (int i = 0; i < nn; i++)
			if (g->nodes[i]->id >= 0)
				node_to[g->nodes[i]->id] = i;
		for (int i = ndecl; i < nv; i++) {
			Value *v = g->values[order[i]];
			if (v->block == -1)
				v->block = g->nodes[node_to[v->def]]->block;
		}
		for (int i = 0; i < nv; i++) {
			to[order[i]] = i;
			values[i] = g->values[order[i]];
		}
		for (int i = 0; i < nv; i++)
			g->values[i] = values[i];
		for (int i = 0; i < nv; i++) {
			g->values[i]->id = i;
			remap(&g->values[i]->def, node_to, maxid);
		}
		for (int i = 0; i < nn; i++)
			g->nodes[i]->id = i;
		g->next_node_id = nn;
		remap_values(g, to, nv);
	}
	free(order);
	free(to);
	free(node_to);
	free(values);
}

/* ---- what the text leaves out ---- */

/* Can n's batch rule run on it: the arity of its op, its required operands
 * given, every operand and its output shaped? */
static int batch_rule_applies(const Graph *g, const Node *n)
{
	const OpInfo *op = &ir_ops[n->op];
	if (!op->shape || n->out < 0 || n->nin < op->min_in || n->nin > op->max_in)
		return 0;
	for (int k = -1; k < n->nin; k++) {
		int v = k < 0 ? n->out : n->in[k];
		if (v < 0 && k < op->min_in)
			return 0;
		if (v >= 0 && (g->values[v]->ndim < 1 || g->values[v]->ndim > DP_MAX_DIMS))
			return 0;
	}
	return 1;
}

/* batch_dim and seq_dim are not in the text: the shape pass derives them
 * from the data (ir_add_source) through every node's batch rule in program
 * order, and so does this, for every node whose operands have shapes (none
 * before the shape pass). The rules' errors were the shape pass's to report:
 * here they are quiet. */
static void derive_batch_dims(Graph *g)
{
	Diag quiet;
	diag_init(&quiet, NULL, NULL, NULL);
	for (int i = 0; i < g->nnodes; i++)
		if (batch_rule_applies(g, g->nodes[i]))
			ir_batch_rule(g, g->nodes[i], &quiet);
}

int ir_read_after(const char *text, char *after, size_t len)
{
	static const char tag[] = "; dp IR after ";
	if (!text || strncmp(text, tag, sizeof tag - 1) != 0 || len == 0)
		return 0;
	const char *s = text + sizeof tag - 1, *e = s;
	while (plain_char((unsigned char)*e))
		e++;
	if (e == s || (size_t)(e - s) >= len || (*e != ' ' && *e != '\n' && *e != '\r' && *e))
		return 0;
	memcpy(after, s, (size_t)(e - s));
	after[e - s] = '\0';
	return (int)(s - text) + 1;
}

static void resolve(Reader *r)
{
	Graph *g = r->g;
	for (int i = 0; i < r->nfix; i++) {
		int id = find_value(r, r->fix[i].name);
		if (id < 0) {
			error_at(r->d, r->fix[i].loc, "unknown value %%%s", r->fix[i].name);
			r->errors++;
		}
		*r->fix[i].slot = id;
	}
	if (r->errors)
		return;
	/* of= on a gradient links both ways */
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->param >= 0)
			g->values[g->values[i]->param]->grad = i;
	for (int i = 0; i < r->nsrcs; i++)
		ir_add_source(g, r->srcs[i]);
	for (int i = 0; i < r->nbks; i++)
		ir_add_bucket(g, r->bks[i]);
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->bucket >= g->nbuckets) {
			error_at(r->d, n->loc, "bucket r%d is not declared", n->bucket);
			r->errors++;
		}
	}
}

Graph *ir_read(const char *text, const char *name, Diag *d)
{
	Diag quiet;
	if (!d) {
		diag_init(&quiet, NULL, name, text);
		d = &quiet;
	}
	Reader r = {0};
	r.g = ir_new(NULL); /* the DSL's defaults, for hand-written IR that omits settings */
	r.d = d;
	r.file = ir_strdup(r.g, name ? name : "<ir>");
	const char *s = text ? text : "";
	for (r.line = 1; *s; r.line++) {
		const char *end = strchr(s, '\n');
		if (!end)
			end = s + strlen(s);
		if (r.line == 1)
			parse_header(&r, s, end);
		if (lex_line(&r, s, end) == 0 && parse_line(&r) == 0)
			expect_end(&r);
		s = *end ? end + 1 : end;
	}
	if (!r.errors)
		resolve(&r);
	Graph *g = r.g;
	if (!r.errors) {
		ir_canonicalize(g);
		derive_batch_dims(g);
	}
	if (r.errors) {
		ir_free(g);
		g = NULL;
	}
	free(r.toks);
	free(r.tbuf);
	free(r.fix);
	free(r.hash);
	free(r.srcs);
	free(r.bks);
	return g;
}
