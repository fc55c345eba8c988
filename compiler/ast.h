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

/* Everything the scanner and parser share; no globals. */
typedef struct {
	Diag *d;
	const char *file;   /* for Locs */
	AstChunk *arena;
	Stmt *top;          /* the parsed file */
	int line, col;      /* position of the next byte */
	int depth;          /* open ( and [: newlines inside are ignored */
	int last_tok;       /* last token returned, 0 at start */
	int eof_newline;    /* the end-of-file newline was returned */
	int nstmts;
	int stmt_lex_errors; /* lexical errors since the statement began */
	int error_limit;    /* the scanner reports end of input past this many errors */
	int stopped;
} ParseState;

void *ast_alloc(ParseState *ps, size_t n); /* zeroed */
char *ast_strndup(ParseState *ps, const char *s, size_t n);
void ast_free(ParseState *ps);

/* Parse buf[0..len) (may hold NUL bytes) into ps->top; errors go to ps->d.
 * Returns 0 when the parse succeeded without errors. (compiler/lexer.l) */
int ast_parse(ParseState *ps, const char *buf, size_t len);

/* Lower a parsed tree to a graph; NULL after reporting errors. (compiler/lower.c) */
Graph *ast_lower(ParseState *ps, const FeOptions *opts);

#endif
