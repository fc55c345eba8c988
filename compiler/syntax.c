/*
 * syntax.c - syntax errors in the DSL's words: one message per mistake,
 * saying what is wrong and how to write it.
 *
 * The parser (compiler/parser.y, parse.error custom) calls syntax_error
 * with the tokens it expected; the scanner (compiler/lexer.l) has kept the
 * tokens of the statement, the open brackets and the open braces (ast.h).
 * From those, the mistakes people make writing a .dp file from docs/DSL.md
 * (often with Python or PyTorch habits) are recognised and named:
 *
 *   parm w: f32[3]              unknown statement 'parm'; did you mean 'param'?
 *   param w f32[3]              expected ':' between the param's name and its type
 *   x: f32[batch, 4] form ...   unknown word 'form'; did you mean 'from'?
 *   linear(x, w, b,)            remove the ',' before ')'
 *   linear(x, w, b  (EOL)       'linear(' is never closed: a ')' is missing
 *   micro_batch: 8              a setting is 'name value', without ':'
 *   F.relu(x)                   ops are called by their name alone
 *   model {  ...  (EOF)         'model {' is never closed: a '}' is missing ...
 *
 * Anything else is bison's "unexpected X, expected Y" with the token's text.
 * What the scanner repairs itself (a '{' on the next line, 'block fc1:',
 * mismatched or unmatched closers, comments of other languages) never gets
 * here. After a message about an unclosed bracket the scanner's bracket
 * depth is reset, so the end of the line ends the statement again and the
 * parser's recovery (skip to the end of the line) stops there.
 */
#include <string.h>

#include "ast.h"
#include "parser.h"
#include "suggest.h"

const AstTok *syntax_stmt_tok(const ParseState *ps, int i)
{
	int k = i >= 0 ? i : ps->ntoks + i;
	if (k < 0 || k >= ps->ntoks)
		return NULL;
	if (k >= ps->ntoks - AST_STMT_LAST)
		return &ps->last[k % AST_STMT_LAST];
	return k < AST_STMT_FIRST ? &ps->first[k] : NULL;
}

const char *syntax_text(const ParseState *ps, size_t off, size_t n, char *buf, size_t buflen)
{
	size_t k = 0, i;
	int blank = 0;
	if (buflen < 8) { /* callers pass room for a name */
		if (buflen)
			buf[0] = 0;
		return buf;
	}
	if (off > ps->srclen)
		off = ps->srclen;
	if (n > ps->srclen - off)
		n = ps->srclen - off;
	for (i = off; i < off + n && k + 5 < buflen; i++) {
		unsigned char c = (unsigned char)ps->src[i];
		if (c == '#') { /* a comment between a header and its '{' */
			while (i + 1 < off + n && ps->src[i + 1] != '\n')
				i++;
			blank = 1;
			continue;
		}
		if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
			blank = 1;
			continue;
		}
		if (blank && k > 0)
			buf[k++] = ' ';
		blank = 0;
		buf[k++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
	}
	if (i < off + n) { /* cut: room was kept for "..." */
		memcpy(buf + k, "...", 3);
		k += 3;
	}
	buf[k] = 0;
	return buf;
}

AstBrace *syntax_push_brace(ParseState *ps)
{
	if (ps->nbraces == ps->capbraces) {
		int cap = ps->capbraces ? 2 * ps->capbraces : 16;
		AstBrace *b = ast_alloc(ps, sizeof(AstBrace) * (size_t)cap);
		if (ps->nbraces)
			memcpy(b, ps->braces, sizeof(AstBrace) * (size_t)ps->nbraces);
		ps->braces = b;
		ps->capbraces = cap;
	}
	AstBrace *b = &ps->braces[ps->nbraces++];
	memset(b, 0, sizeof *b);
	return b;
}

static const char *const section_names[] = {"config", "data", "eval", "model", "train"};

int syntax_body_header(const ParseState *ps, int n)
{
	const AstTok *f = syntax_stmt_tok(ps, 0), *l = syntax_stmt_tok(ps, n - 1);
	if (n < 1 || n > ps->ntoks || !f || !l)
		return 0;
	if (f->tok == TK_BLOCK)
		return n >= 2 && syntax_stmt_tok(ps, 1)->tok == TK_IDENT && (n == 2 || l->tok == ']');
	if (f->tok == TK_REPEAT) {
		const AstTok *l2 = syntax_stmt_tok(ps, n - 2);
		return n >= 4 && l->tok == TK_IDENT && l2 && l2->tok == TK_IDENT;
	}
	char w[16];
	if (n != 1 || f->tok != TK_IDENT || f->len >= (int)sizeof w)
		return 0;
	memcpy(w, ps->src + f->off, (size_t)f->len);
	w[f->len] = 0;
	for (int i = 0; i < 5; i++)
		if (strcmp(w, section_names[i]) == 0)
			return 1;
	return suggest_among(w, section_names, 5) != NULL;
}

/* ---- tokens ---- */

static int is_word(const ParseState *ps, const AstTok *t, const char *w)
{
	return t && t->tok == TK_IDENT && (size_t)t->len == strlen(w) &&
	       memcmp(ps->src + t->off, w, (size_t)t->len) == 0;
}

/* An identifier's text into buf (at most 63 bytes). */
static const char *word(const ParseState *ps, const AstTok *t, char *buf)
{
	int n = t->len < 63 ? t->len : 63;
	memcpy(buf, ps->src + t->off, (size_t)n);
	buf[n] = 0;
	return buf;
}

/* How a message names a token: 'relu', '(', end of line. */
static const char *describe(const ParseState *ps, const AstTok *t, char *buf, size_t len)
{
	if (t->tok == TK_NEWLINE)
		return t->len ? "end of line" : "'}'"; /* the one before a '}' is made up */
	if (t->tok == TK_YYEOF)
		return "end of file";
	char text[48];
	snprintf(buf, len, "'%s'", syntax_text(ps, t->off, (size_t)t->len, text, sizeof text));
	return buf;
}

static int expr_start(int t)
{
	return t == TK_IDENT || t == TK_WORD || t == TK_INT || t == TK_FLOAT || t == TK_STRING ||
	       t == '(' || t == '-';
}

static int expr_end(int t)
{
	return t == TK_IDENT || t == TK_WORD || t == TK_INT || t == TK_FLOAT || t == TK_STRING ||
	       t == ')' || t == ']';
}

static int end_of_stmt(int t)
{
	return t == TK_NEWLINE || t == TK_YYEOF || t == '}';
}

/* The dtype words people write for a data or param type. */
static int dtype_like(const ParseState *ps, const AstTok *t)
{
	static const char *const words[] = {"f32", "i32", "bf16", "f16", "f64", "i64", "float",
					    "float32", "int", "int32", "int64", "float16", "bfloat16"};
	for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
		if (is_word(ps, t, words[i]))
			return 1;
	return 0;
}

/* Does the parser expect the token named name ("')'", "from")? */
static int expects(const char *const *exp, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(exp[i], name) == 0)
			return 1;
	return 0;
}

/* Does the line go on after the token (anything but blanks and a comment)? */
static int line_goes_on(const ParseState *ps, const AstTok *t)
{
	for (size_t i = t->off + (size_t)t->len; i < ps->srclen; i++) {
		char c = ps->src[i];
		if (c == '\n' || c == '#')
			return 0;
		if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v')
			return 1;
	}
	return 0;
}

/* ---- the diagnoses ---- */

typedef struct {
	ParseState *ps;
	const char *const *exp;
	int nexp;
	const AstTok *la, *prev, *first; /* the token not taken, the one before, the statement's first */
	Loc at;                          /* where the message points */
	char msg[512];
} Diagnosis;

#define SAY(dg, loc, ...) \
	do { \
		(dg)->at = (loc); \
		snprintf((dg)->msg, sizeof (dg)->msg, __VA_ARGS__); \
	} while (0)

/* The end of the file inside a '{': which one is unclosed, and where its '}'
 * likely belongs (before a '}' or a statement that does not line up). */
static int unclosed_brace(Diagnosis *dg)
{
	ParseState *ps = dg->ps;
	const AstBrace *open = NULL, *dedent = NULL;
	for (int i = ps->nbraces - 1; i >= 0; i--) {
		const AstBrace *b = &ps->braces[i];
		if (b->dropped)
			continue;
		if (!open)
			open = b;
		if (!dedent && b->dedent_line)
			dedent = b;
	}
	if (!open)
		return 0;
	if (ps->colon_bodies)
		return 2; /* said at each 'block fc1:' (a body in braces, closed by '}') */
	/* the '{' a misaligned '}' closed is the likeliest; its '}' belongs
	 * before the first statement inside it that starts left of it, else
	 * before that '}' */
	char head[80];
	const AstBrace *b = ps->misplaced_line ? &ps->misplaced : dedent ? dedent : open;
	int before = b->dedent_line ? b->dedent_line : ps->misplaced_line;
	syntax_text(ps, b->head_off, (size_t)b->head_len, head, sizeof head);
	if (before)
		SAY(dg, b->loc, "'%s%s{' is never closed: a '}' is missing before line %d", head,
		    *head ? " " : "", before);
	else
		SAY(dg, b->loc, "'%s%s{' is never closed: a '}' is missing at the end", head,
		    *head ? " " : "");
	return 1;
}

/* A block, repeat or section whose '{' is missing. The lines below are
 * likely its body: the '}' that ends them is dropped. */
static int missing_brace(Diagnosis *dg)
{
	ParseState *ps = dg->ps;
	if (dg->la->tok != TK_NEWLINE || !dg->la->len || !syntax_body_header(ps, ps->ntoks - 1))
		return 0;
	char head[80];
	const AstTok *f = dg->first;
	syntax_text(ps, f->off, dg->prev->off + (size_t)dg->prev->len - f->off, head, sizeof head);
	SAY(dg, dg->la->loc, "a '{' must end the line of '%s': %s { ... }", head, head);
	AstBrace *b = syntax_push_brace(ps);
	b->loc = dg->la->loc;
	b->dropped = 1;
	return 1;
}

/* A ',' with no argument after it or before it. */
static int stray_comma(Diagnosis *dg)
{
	const AstTok *la = dg->la, *p = dg->prev;
	if (!p)
		return 0;
	if ((la->tok == ')' || la->tok == ']') && p->tok == ',') {
		SAY(dg, p->loc, "remove the ',' before '%c': a ',' separates arguments, it does not "
				"end them", la->tok);
		return 1;
	}
	if (la->tok == ',' && (p->tok == ',' || p->tok == '(' || p->tok == '[')) {
		SAY(dg, la->loc, "an argument is missing before this ','");
		return 1;
	}
	return 0;
}

/* Inside ( or [: an unclosed bracket, a missing ',', name: value. */
static int in_brackets(Diagnosis *dg)
{
	ParseState *ps = dg->ps;
	if (ps->depth <= 0 || ps->depth > AST_MAX_DEPTH)
		return 0;
	const AstBracket *b = &ps->brackets[ps->depth - 1];
	const AstTok *la = dg->la, *p = dg->prev;
	char closer = b->kind == '(' ? ')' : ']', quoted[4] = {'\'', closer, '\'', 0};
	char name[64], what[96], shown[64];
	if (b->before.tok == TK_IDENT)
		snprintf(what, sizeof what, "'%s%c'", word(ps, &b->before, name), b->kind);
	else
		snprintf(what, sizeof what, "this '%c'", b->kind);

	if (la->tok == ':' && p && p->tok == TK_IDENT && b->kind == '(') {
		SAY(dg, la->loc, "a keyword argument is written %s=value, not %s: value",
		    word(ps, p, name), name);
		return 1;
	}
	if (!expects(dg->exp, dg->nexp, quoted))
		return 0;
	if (end_of_stmt(la->tok) || la->loc.line != b->loc.line) {
		SAY(dg, b->loc, "%s is never closed: a '%c' is missing", what, closer);
		ps->depth = 0;
		return 1;
	}
	if (expr_start(la->tok) && p && expr_end(p->tok) && expects(dg->exp, dg->nexp, "','")) {
		SAY(dg, la->loc, "a ',' is missing before %s",
		    describe(ps, la, shown, sizeof shown));
		return 1;
	}
	SAY(dg, la->loc, "a '%c' is missing before %s (to close %s at %d:%d)", closer,
	    describe(ps, la, shown, sizeof shown), what, b->loc.line, b->loc.col);
	ps->depth = 0;
	return 1;
}

/* A statement that starts with a misspelt keyword, or with Python's for. */
static int keyword_typo(Diagnosis *dg)
{
	static const char *const keywords[] = {"param", "buffer", "block", "repeat"};
	const AstTok *f = dg->first;
	char w[64];
	if (!f || f->tok != TK_IDENT || f == dg->la)
		return 0;
	word(dg->ps, f, w);
	if (strcmp(w, "for") == 0) {
		SAY(dg, f->loc, "dp has no 'for': repeat N as i { ... } repeats a body N times");
		return 1;
	}
	const char *guess = suggest_among(w, keywords, 4);
	if (!guess)
		return 0;
	SAY(dg, f->loc, "unknown statement '%s'; did you mean '%s'?", w, guess);
	return 1;
}

/* param/buffer NAME: TYPE [init SPEC] [ANNOT]. */
static int param_decl(Diagnosis *dg)
{
	ParseState *ps = dg->ps;
	const AstTok *f = dg->first, *la = dg->la, *p = dg->prev;
	if (!f || (f->tok != TK_PARAM && f->tok != TK_BUFFER))
		return 0;
	const char *kind = f->tok == TK_PARAM ? "param" : "buffer";
	const char *example = f->tok == TK_PARAM ? "param w: f32[784, 10] init normal(0, 0.02)"
						 : "buffer freqs: f32[64] nosync";
	char name[64], w[64];
	if (ps->ntoks == 3 && syntax_stmt_tok(ps, 1)->tok == TK_IDENT) {
		word(ps, syntax_stmt_tok(ps, 1), name);
		if (la->tok == '=')
			SAY(dg, la->loc, "a %s's type follows ':', not '=': %s %s: f32[...]", kind, kind,
			    name);
		else
			SAY(dg, la->loc, "expected ':' between the %s's name and its type, like %s", kind,
			    example);
		return 1;
	}
	if (la->tok == '=' && p && p->tok == TK_INIT) {
		SAY(dg, la->loc, "'init' is followed by the initialiser, without '=': init zeros");
		return 1;
	}
	if (ps->ntoks >= 6 && p && p->tok == TK_IDENT && expr_start(la->tok)) {
		const char *init[] = {"init"};
		if (suggest_among(word(ps, p, w), init, 1)) {
			SAY(dg, p->loc, "unknown word '%s'; did you mean 'init'?", w);
			return 1;
		}
	}
	if (ps->ntoks == 5 && la->tok == '(' && p && p->tok == TK_IDENT) {
		SAY(dg, la->loc, "a shape is written in [ ], like %s[784, 10]", word(ps, p, w));
		return 1;
	}
	return 0;
}

/* relu written as F.relu or torch.nn.functional.relu. */
static int member_call(Diagnosis *dg)
{
	ParseState *ps = dg->ps;
	const AstTok *la = dg->la, *p = dg->prev, *dot = syntax_stmt_tok(ps, -3);
	if ((la->tok != '(' && la->tok != '.') || !p || p->tok != TK_IDENT || !dot || dot->tok != '.')
		return 0;
	const AstTok *mod = syntax_stmt_tok(ps, -4);
	char w[64];
	SAY(dg, mod ? mod->loc : dot->loc,
	    "ops are called by their name alone, like %s(...), not through a module (F.relu, "
	    "torch.relu)", la->tok == '(' ? word(ps, p, w) : "relu");
	return 1;
}

/* Statements that start with a name: data declarations, settings. */
static int named_stmt(Diagnosis *dg)
{
	ParseState *ps = dg->ps;
	const AstTok *f = dg->first, *la = dg->la;
	if (!f || f->tok != TK_IDENT || f == la)
		return 0;
	const AstTok *t1 = syntax_stmt_tok(ps, 1), *t2 = syntax_stmt_tok(ps, 2);
	char name[64], w[64], shown[64];
	word(ps, f, name);
	if (t1 && t1->tok == ':' && (ps->ntoks == 3 || ps->ntoks == 4)) {
		int setting = ps->ntoks == 3 ? la->tok == TK_INT || la->tok == TK_FLOAT ||
						       la->tok == TK_STRING || la->tok == '-'
					     : (la->tok == '(' || la->tok == TK_NEWLINE) && t2 &&
						       t2->tok == TK_IDENT && !dtype_like(ps, t2);
		if (setting) {
			const AstTok *v = ps->ntoks == 3 ? la : t2;
			syntax_text(ps, v->off, (size_t)v->len, w, 40);
			SAY(dg, t1->loc, "a setting is 'name value', without ':': %s %s%s", name, w,
			    ps->ntoks == 4 && la->tok == '(' ? "(...)" : "");
			return 1;
		}
		if (ps->ntoks == 3 && la->tok == '[') {
			SAY(dg, la->loc, "a dtype comes before the shape: %s: f32[...]", name);
			return 1;
		}
	}
	if (t1 && t1->tok == ':' && expects(dg->exp, dg->nexp, "from")) {
		const char *from[] = {"from"};
		if (la->tok == TK_IDENT && suggest_among(word(ps, la, w), from, 1)) {
			SAY(dg, la->loc, "unknown word '%s'; did you mean 'from'?", w);
			return 1;
		}
		char type[64];
		const AstTok *p = dg->prev;
		syntax_text(ps, t2->off, p->off + (size_t)p->len - t2->off, type, sizeof type);
		if (la->tok == '=') {
			SAY(dg, la->loc, "data reads its source after 'from', not '=': %s: %s from "
					 "npy(\"%s.npy\")", name, type, name);
			return 1;
		}
		SAY(dg, la->loc, "expected 'from' and the data source before %s, like %s: %s from "
				 "npy(\"%s.npy\")", describe(ps, la, shown, sizeof shown), name, type, name);
		return 1;
	}
	if (ps->ntoks == 3 && la->tok == '[' && dtype_like(ps, t1)) {
		SAY(dg, t1->loc, "expected ':' between '%s' and its type, like %s: %s[...] from "
				 "npy(\"file\")", name, name, word(ps, t1, w));
		return 1;
	}
	if (ps->ntoks == 4 && la->tok == '[' && t1->tok == '=' && dtype_like(ps, t2)) {
		SAY(dg, t1->loc, "a data declaration has ':' before its type, not '=': %s: %s[...] "
				 "from npy(\"file\")", name, word(ps, t2, w));
		return 1;
	}
	return 0;
}

static void fallback(Diagnosis *dg)
{
	char shown[64];
	int n = snprintf(dg->msg, sizeof dg->msg, "unexpected %s",
			 describe(dg->ps, dg->la, shown, sizeof shown));
	if (expects(dg->exp, dg->nexp, "identifier") && expects(dg->exp, dg->nexp, "integer") &&
	    expects(dg->exp, dg->nexp, "'('"))
		snprintf(dg->msg + n, sizeof dg->msg - (size_t)n, "; expected a value (a name, a "
								  "number or a call)");
	else if (dg->nexp > 0 && dg->nexp <= 5) {
		n += snprintf(dg->msg + n, sizeof dg->msg - (size_t)n, "; expected ");
		for (int i = 0; i < dg->nexp && n < (int)sizeof dg->msg; i++)
			n += snprintf(dg->msg + n, sizeof dg->msg - (size_t)n, "%s%s",
				      i == 0 ? "" : i == dg->nexp - 1 ? " or " : ", ", dg->exp[i]);
	}
	dg->at = dg->la->loc;
}

void syntax_error(ParseState *ps, const char *const *expected, int nexpected)
{
	/* the parser now discards tokens up to the next end of line: a '{'
	 * among them, this one included, is not a body, and its '}' goes too */
	ps->recovering = ps->last_tok != TK_NEWLINE;
	if (ps->last_tok == '{' && ps->nbraces > 0)
		ps->braces[ps->nbraces - 1].dropped = 1;
	if (ps->stopped || ps->stmt_lex_errors)
		return; /* the scanner reported this statement */

	Diagnosis dg = {.ps = ps, .exp = expected, .nexp = nexpected,
			.la = syntax_stmt_tok(ps, -1), .prev = syntax_stmt_tok(ps, -2),
			.first = syntax_stmt_tok(ps, 0)};
	if (!dg.la) {
		error_at(ps->d, (Loc){ps->file, ps->line, ps->col}, "syntax error");
		return;
	}
	char shown[64];
	int said = dg.la->tok == TK_YYEOF ? unclosed_brace(&dg) : 0;
	if (said == 2)
		return;
	said = said || stray_comma(&dg) || in_brackets(&dg) || keyword_typo(&dg) ||
	       missing_brace(&dg) || param_decl(&dg) || member_call(&dg) || named_stmt(&dg);
	if (!said && dg.prev && dg.prev->tok == '*' && dg.la->tok == '*') {
		SAY(&dg, dg.prev->loc, "dp has no '**': write the number itself (2e-3) or use sqrt");
		said = 1;
	}
	if (!said && dg.prev && dg.prev->tok == '}' && !end_of_stmt(dg.la->tok)) {
		SAY(&dg, dg.la->loc, "a '}' ends its line: start %s on a new line",
		    describe(ps, dg.la, shown, sizeof shown));
		said = 1;
	}
	if (!said && dg.la->tok == ':' && !line_goes_on(ps, dg.la)) {
		SAY(&dg, dg.la->loc, "remove the ':': a statement ends with its line (dp is not "
				     "Python)");
		said = 1;
	}
	if (!said)
		fallback(&dg);
	error_at(ps->d, dg.at, "%s", dg.msg);
}
