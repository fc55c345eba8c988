/*
 * ast.h - the front end's syntax tree and parser state.
 *
 * The grammar (compiler/parser.y) is deliberately generic: a file is a list of
 * statements, a section (`data { ... }`), a block or a repeat is a statement
 * holding a list of statements, and a setting is `name value` or `name k=v,
 * k=v`. Every value, dim, argument and right-hand side is an Expr. Which
 * statement may appear where, and what each name means, is checked when the
 * tree is lowered (compiler/lower.c); that keeps syntax errors about syntax and
 * lets semantic errors point at the exact token.
 *
 * Memory. Every tree node and string comes from one arena owned by the
 * ParseState and freed at once by ast_free, so error recovery that drops half
 * a statement cannot leak.
 */
#ifndef DP_AST_H
#define DP_AST_H

#include <stddef.h>
#include <stdint.h>

#include "frontend.h"
#include "ir.h"

#define AST_MAX_DEPTH 64      /* nesting limit of ( and [ (so of calls in an expression) */
#define AST_MAX_EXPR 256      /* nesting limit of an expression tree (operators included) */
#define AST_MAX_IDENT 128     /* longest identifier, in bytes */
#define AST_MAX_STMTS 100000  /* statements in one file */
#define AST_ERROR_LIMIT 100   /* the scanner stops after this many errors (Diag.max_errors wins) */

typedef struct Arg Arg;
typedef struct Expr Expr;
typedef struct Stmt Stmt;

/*
 * Expressions. The parser has one expression grammar for everything: op
 * calls of the model (relu(linear(x, w, b))), specs (adamw(lr=3e-4)), data
 * sources, dims and constant arithmetic (4 * d, 0.02 / sqrt(2 * layers)).
 * What an expression may be depends on where it is, so lower.c decides:
 * a tensor operand must be a name, block.param or an op call; a number
 * position evaluates the arithmetic (config constants, repeat variables).
 */
typedef enum {
	E_INT,    /* 42 */
	E_FLOAT,  /* 3e-4 */
	E_STRING, /* "path" (escapes decoded) */
	E_NAME,   /* h1, x, d, zeros, auto, batch, true */
	E_MEMBER, /* fc1.w */
	E_CALL,   /* relu(...), normal(0, 0.02), sqrt(d) */
	E_BINARY, /* lhs op rhs, op one of + - * / */
	E_NEG,    /* -lhs */
} ExprKind;

struct Expr {
	ExprKind kind;
	int64_t i;          /* E_INT */
	double f;           /* E_FLOAT */
	const char *name;   /* E_NAME, E_CALL (the callee), E_MEMBER (the block), E_STRING text */
	const char *member; /* E_MEMBER: the param */
	Loc loc;            /* of the name, literal or operator */
	Loc member_loc;     /* E_MEMBER: of the param; E_BINARY: of the operator */
	const char *key;    /* a keyword argument of a call: key=expr (NULL: positional) */
	Loc key_loc;
	int op;             /* E_BINARY: '+', '-', '*' or '/' */
	Expr *lhs, *rhs;    /* E_BINARY operands; E_NEG: lhs */
	Expr *args;         /* E_CALL arguments, linked through next */
	int nargs;
	int depth;          /* calls nested in this expression, itself included */
	int height;         /* nodes on the longest path down (bounded by AST_MAX_EXPR) */
	Expr *next;
};

/* An evaluated value (lower.c): what a setting, spec, dim or argument
 * expression denotes after constant folding. */
typedef enum {
	V_INT,    /* 42, -3, 4 * d */
	V_FLOAT,  /* 3e-4, 0.5 */
	V_STRING, /* "path" */
	V_IDENT,  /* auto, zeros, ddp, batch (a name that is not a constant) */
	V_CALL,   /* adamw(lr=1e-3), normal(0, 0.02), idx("...") */
} AstValKind;

typedef struct {
	AstValKind kind;
	int64_t i;     /* V_INT */
	double f;      /* V_FLOAT */
	const char *s; /* V_STRING text; V_IDENT and V_CALL name */
	Arg *args;     /* V_CALL arguments */
	int nargs;
	Loc loc;
} AstVal;

/* An evaluated argument of a V_CALL (key NULL when positional). */
struct Arg {
	const char *key;
	Loc key_loc;
	AstVal val;
	Arg *next;
};

typedef struct {
	const char *dtype; /* f32, i32, ... as written */
	Loc loc;
	int bracketed;     /* a [dims] list was given */
	Expr *dims;        /* the dim expressions */
	int ndims;
} AstType;

typedef enum {
	S_ASSIGN,  /* name = expr                       (model, config) */
	S_DECL,    /* name: type from source            (data) */
	S_SOURCE,  /* name from source                  (eval) */
	S_PARAM,   /* param name: type [init spec] [split(tp, col|row)]   (block) */
	S_SETTING, /* name value | name k=v, ...        (mesh, train, eval) */
	S_SECTION, /* name { body }                     (config, data, eval, model, train) */
	S_BLOCK,   /* block name[index] { body }        (model) */
	S_BUFFER,  /* buffer name: type [init spec] [nosync] (block) */
	S_REPEAT,  /* repeat count as var { body }      (model) */
} StmtKind;

struct Stmt {
	StmtKind kind;
	const char *name; /* S_REPEAT: the loop variable */
	Loc loc;          /* of the statement's first token */
	Loc name_loc;     /* of name */
	Expr *expr;       /* S_ASSIGN right-hand side; S_REPEAT count; S_BLOCK index or NULL */
	AstType type;     /* S_DECL, S_PARAM, S_BUFFER */
	Expr *val;        /* S_DECL/S_SOURCE source, S_PARAM/S_BUFFER init, S_SETTING value; or NULL */
	Expr *annot;      /* S_PARAM/S_BUFFER: the word or call after the type/init
	                     (split(tp, col), nosync), or NULL */
	Expr *kw;         /* S_SETTING k=v list (val == NULL): Exprs with key set */
	Stmt *body;       /* S_SECTION, S_BLOCK, S_REPEAT */
	Stmt *next;
};

typedef struct AstChunk AstChunk;

/*
 * What the scanner remembers for syntax errors in the DSL's words
 * (compiler/syntax.c): the tokens of the statement being read, the open
 * brackets and the open braces. A statement's tokens start after an end of
 * line, a '{' or a '}'; when the parser finds an error, the last of them is
 * the token it could not take.
 */
typedef struct {
	int tok;       /* token kind: TK_IDENT, '(' ... */
	Loc loc;
	size_t off;    /* its text: src[off, off + len) */
	int len;
} AstTok;

#define AST_STMT_FIRST 8 /* the first tokens of a statement kept */
#define AST_STMT_LAST 4  /* and the last ones */

typedef struct {
	char kind;       /* '(' or '[' */
	Loc loc;
	AstTok before;   /* the token before it (the callee of a call), tok 0 if none */
} AstBracket;

typedef struct {
	Loc loc;         /* of the '{' (or of the ':' that stood for it) */
	int indent;      /* column of the first token of its statement */
	size_t head_off; /* the statement before it ("block fc1"): src[head_off, +head_len) */
	int head_len;
	int dropped;     /* error recovery discarded this '{': its '}' goes too */
	int dedent_line; /* the first statement inside that starts left of (or at) indent */
} AstBrace;

/* Everything the scanner and parser share; no globals. */
typedef struct {
	Diag *d;
	const char *file;   /* for Locs */
	const char *src;    /* the text being scanned, and its length */
	size_t srclen;
	AstChunk *arena;
	Stmt *top;          /* the parsed file */
	int line, col;      /* position of the next byte */
	size_t off;         /* its offset */
	size_t tok_off;     /* offset of the token being scanned */
	int depth;          /* open ( and [: newlines inside are ignored */
	int last_tok;       /* last token returned, 0 at start */
	int eof_newline;    /* the end-of-file newline was returned */
	int nstmts;
	int stmt_lex_errors; /* lexical errors since the statement began */
	int error_limit;    /* the scanner reports end of input past this many errors */
	int stopped;
	int recovering;     /* the parser discards tokens up to the next end of line */
	/* for syntax errors (above) */
	AstTok first[AST_STMT_FIRST]; /* the statement's first tokens */
	AstTok last[AST_STMT_LAST];   /* its last ones, the newest at [ntoks - 1 mod AST_STMT_LAST] */
	int ntoks;                    /* tokens of the statement so far */
	int last_line;                /* line of the last token (a token first on its line) */
	AstBracket brackets[AST_MAX_DEPTH]; /* open ( and [, innermost last (depth of them) */
	AstBrace *braces;             /* open {, innermost last */
	int nbraces, capbraces;
	AstBrace misplaced;           /* the first '{' closed by a '}' not lined up with it */
	int misplaced_line;           /* that '}''s line; 0: none */
	int colon_bodies;             /* 'block fc1:' taken as '{' (said once each) */
} ParseState;

void *ast_alloc(ParseState *ps, size_t n); /* zeroed */
char *ast_strndup(ParseState *ps, const char *s, size_t n);
void ast_free(ParseState *ps);

/* Parse buf[0..len) (may hold NUL bytes) into ps->top; errors go to ps->d.
 * Returns 0 when the parse succeeded without errors. (compiler/lexer.l) */
int ast_parse(ParseState *ps, const char *buf, size_t len);

/* ---- syntax.c: syntax errors in the DSL's words ---- */

/* Token i of the statement (0 first; negative: from its end, -1 the newest),
 * or NULL when it is not remembered. */
const AstTok *syntax_stmt_tok(const ParseState *ps, int i);
/* The parser's syntax error at the newest token: one message saying what is
 * wrong and how to write it (none when the scanner already reported this
 * statement). expected: the names of the tokens the grammar would take
 * there ("')'", "end of line", "from"). The parser then discards tokens up
 * to the end of the line: the scanner is told, to drop the '}' of a '{'
 * among them. */
void syntax_error(ParseState *ps, const char *const *expected, int nexpected);
/* A new open brace on ps->braces (zeroed). */
AstBrace *syntax_push_brace(ParseState *ps);
/* Are the statement's first n tokens a header that takes a body: block
 * NAME[, [index]], repeat N as i, or a section name (or a near miss)? */
int syntax_body_header(const ParseState *ps, int n);
/* Source text src[off, off + n) for a message: into buf, blanks and comments
 * collapsed to one space, cut with "..." past buflen. */
const char *syntax_text(const ParseState *ps, size_t off, size_t n, char *buf, size_t buflen);

/* Lower a parsed tree to a graph; NULL after reporting errors. (compiler/lower.c) */
Graph *lower_ast(ParseState *ps, const FeOptions *opts);

#endif
