/*
 * ast.h - the front end's syntax tree and parser state.
 *
 * The grammar (compiler/parser.y) is deliberately generic: a file is a list of
 * statements, a section (`data { ... }`) or a block is a statement holding a
 * list of statements, and a setting is `name value` or `name k=v, k=v`. Which
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

#include "ir.h"

#define AST_MAX_DEPTH 64      /* nesting limit of ( and [ (so of calls in an expression) */
#define AST_MAX_IDENT 128     /* longest identifier, in bytes */
#define AST_MAX_STMTS 100000  /* statements in one file */
#define AST_ERROR_LIMIT 100   /* the scanner stops after this many errors (Diag.max_errors wins) */

typedef struct Arg Arg;
typedef struct Expr Expr;
typedef struct Stmt Stmt;

/* A literal or a spec in a setting, a data source, an initialiser, a dim. */
typedef enum {
	V_INT,    /* 42, -3 */
	V_FLOAT,  /* 3e-4, 0.5 */
	V_STRING, /* "path" (escapes decoded) */
	V_IDENT,  /* auto, zeros, ddp, batch */
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

/* An argument of a V_CALL (key NULL when positional), a dim, or a mesh k=v. */
struct Arg {
	const char *key;
	Loc key_loc;
	AstVal val;
	Arg *next;
};

typedef enum {
	E_NAME,   /* h1, x, w (a param of the enclosing block) */
	E_MEMBER, /* fc1.w */
	E_CALL,   /* relu(...) */
} ExprKind;

struct Expr {
	ExprKind kind;
	const char *name;   /* name, block name, or op name */
	const char *member; /* E_MEMBER: the param */
	Loc loc;            /* of name */
	Loc member_loc;
	Expr *args;         /* E_CALL arguments, linked through next */
	int nargs;
	int depth;          /* calls nested in this expression, itself included */
	Expr *next;
};

typedef struct {
	const char *dtype; /* f32, i32, ... as written */
	Loc loc;
	int bracketed;     /* a [dims] list was given */
	Arg *dims;         /* positional values */
	int ndims;
} AstType;

typedef enum {
	S_ASSIGN,  /* name = expr */
	S_DECL,    /* name: type from source            (data) */
	S_SOURCE,  /* name from source                  (eval) */
	S_PARAM,   /* param name: type [init spec]      (block) */
	S_SETTING, /* name value | name k=v, ...        (mesh, train, eval) */
	S_SECTION, /* name { body }                     (data, eval, model, train) */
	S_BLOCK,   /* block name { body }               (model) */
	S_BUFFER,  /* buffer name: type [init spec] [nosync] (block) */
} StmtKind;

struct Stmt {
	StmtKind kind;
	const char *name;
	Loc loc;          /* of the statement's first token */
	Loc name_loc;     /* of name */
	Expr *expr;       /* S_ASSIGN */
	AstType type;     /* S_DECL, S_PARAM, S_BUFFER */
	int has_val;
	AstVal val;       /* S_DECL/S_SOURCE source, S_PARAM/S_BUFFER init, S_SETTING single value */
	const char *flag; /* S_BUFFER: the word after it (nosync), or NULL */
	Loc flag_loc;
	Arg *kw;          /* S_SETTING k=v list (has_val == 0) */
	Stmt *body;       /* S_SECTION, S_BLOCK */
	int index;        /* S_BLOCK: its Graph.blocks index after lowering, or -1 */
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
Graph *ast_lower(ParseState *ps, int world_size);

#endif
