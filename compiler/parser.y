/*
 * parser.y - the DSL grammar (pure, reentrant bison parser).
 *
 * A file is a list of statements ended by newlines (or `;`); the scanner
 * drops newlines inside () and [] and puts one before a `}` that closes a
 * line, so every statement, block and section ends with NEWLINE:
 *
 *   body    := { NEWLINE | stmt NEWLINE | error NEWLINE }
 *   stmt    := IDENT '=' expr                       assignment (model, config)
 *            | IDENT ':' type 'from' expr           data declaration
 *            | IDENT 'from' expr                    eval source
 *            | 'param' IDENT ':' type ['init' expr] [annot]    parameter (block)
 *            | 'buffer' IDENT ':' type ['init' expr] [annot]   buffer (block)
 *            | IDENT expr                           setting: steps 100, mesh auto
 *            | IDENT IDENT '=' expr {',' IDENT '=' expr}   mesh dp_shard=2, tp=1
 *            | IDENT '{' body '}'                   section: config, data, eval, model, train
 *            | 'block' IDENT ['[' expr ']'] '{' body '}'   block (model): fc1, h[i]
 *            | 'repeat' expr IDENT IDENT '{' body '}'      repeat N as i { ... } (model)
 *   annot   := IDENT | IDENT '(' args ')'           nosync, split(tp, col)
 *   type    := IDENT ['[' expr {',' expr} ']']      f32[batch, 784]
 *   expr    := expr ('+' | '-' | '*' | '/') expr | '-' expr | '(' expr ')'
 *            | INT | FLOAT | STRING | IDENT | WORD | IDENT '.' IDENT
 *            | IDENT '(' [arg {',' arg}] ')'        arg := expr | (IDENT | init) '=' expr
 *
 * One expression grammar serves op calls, specs, dims and constant
 * arithmetic; which forms are allowed where (a tensor operand, a number, a
 * spec) and which statement is allowed where is checked by compiler/lower.c.
 * Error recovery: `error NEWLINE` in every statement list skips to the end of
 * the bad statement, so one run reports one error per bad statement.
 *
 * Syntax errors are reported by compiler/syntax.c (parse.error custom): from
 * the statement's tokens the scanner kept and the tokens expected here, it
 * says what is wrong in the DSL's words and how to write it. Recovery
 * discards every token up to the end of the line, so the scanner drops the
 * '}' of any '{' among them: no second message at the end of a bad block.
 */
%define api.pure full
%define api.prefix {fe_yy}
%define api.token.prefix {TK_}
%define parse.error custom
%define parse.lac full
%locations
%expect 0
%param {yyscan_t scanner} {ParseState *ps}

%code requires {
#include "ast.h"
#ifndef DP_YYSCAN_T
#define DP_YYSCAN_T
typedef void *yyscan_t;
#endif
typedef struct { Stmt *head, *tail; } StmtList;
typedef struct { Expr *head, *tail; int n; } ExprList;
}

%code provides {
int fe_yylex(FE_YYSTYPE *lval, FE_YYLTYPE *lloc, yyscan_t scanner, ParseState *ps);
}

%code {
#include <string.h>

static void fe_yyerror(FE_YYLTYPE *lloc, yyscan_t scanner, ParseState *ps, const char *msg)
{
	(void)scanner;
	/* The scanner gave up, or already reported a bad token in this
	 * statement: the parser's complaint would repeat it. */
	if (ps->stopped || ps->stmt_lex_errors)
		return;
	Loc l = {ps->file, lloc->first_line, lloc->first_column};
	error_at(ps->d, l, "%s", msg);
}

static Loc at(ParseState *ps, FE_YYLTYPE l)
{
	return (Loc){ps->file, l.first_line, l.first_column};
}

static Stmt *new_stmt(ParseState *ps, StmtKind kind, const char *name, FE_YYLTYPE l)
{
	Stmt *s = ast_alloc(ps, sizeof(Stmt));
	s->kind = kind;
	s->name = name;
	s->loc = s->name_loc = at(ps, l);
	if (++ps->nstmts == AST_MAX_STMTS)
		error_at(ps->d, s->loc, "too many statements (the limit is %d)", AST_MAX_STMTS);
	return s;
}

static ExprList expr_append(ExprList l, Expr *e)
{
	if (l.tail)
		l.tail->next = e;
	else
		l.head = e;
	l.tail = e;
	l.n++;
	return l;
}

/* Bound the height of expression trees (a long chain of operators) so that
 * the recursive lowering cannot run out of stack: reported once, at the node
 * that first passes the limit. */
static Expr *new_expr(ParseState *ps, ExprKind kind, Loc loc, int height)
{
	Expr *e = ast_alloc(ps, sizeof(Expr));
	e->kind = kind;
	e->loc = loc;
	e->height = height;
	if (height == AST_MAX_EXPR + 1)
		error_at(ps->d, loc, "expression is nested too deeply (more than %d levels)",
			 AST_MAX_EXPR);
	return e;
}

static Expr *binary(ParseState *ps, int op, Expr *l, Expr *r, Loc op_loc)
{
	int h = l->height > r->height ? l->height : r->height;
	Expr *e = new_expr(ps, E_BINARY, l->loc, h + 1);
	e->op = op;
	e->lhs = l;
	e->rhs = r;
	e->member_loc = op_loc; /* the operator, for errors about this operation */
	e->depth = l->depth > r->depth ? l->depth : r->depth;
	return e;
}

static Expr *call(ParseState *ps, const char *name, Loc loc, ExprList args)
{
	int h = 0, inner = 0;
	for (Expr *a = args.head; a; a = a->next) {
		if (a->height > h)
			h = a->height;
		if (a->depth > inner)
			inner = a->depth;
	}
	Expr *e = new_expr(ps, E_CALL, loc, h + 1);
	e->name = name;
	e->args = args.head;
	e->nargs = args.n;
	e->depth = inner + 1; /* the scanner bounds it */
	return e;
}
}

%union {
	char *str;
	int64_t inum;
	double fnum;
	Expr *expr;
	ExprList exprs;
	AstType type;
	Stmt *stmt;
	StmtList stmts;
}

%token NEWLINE "end of line"
%token <str> IDENT "identifier"
%token <str> WORD "word"
%token <str> STRING "string"
%token <inum> INT "integer"
%token <fnum> FLOAT "number"
%token BLOCK "block"
%token PARAM "param"
%token BUFFER "buffer"
%token FROM "from"
%token INIT "init"
%token REPEAT "repeat"

%left '+' '-'
%left '*' '/'
%precedence NEG

%type <stmts> body
%type <stmt> item stmt decl
%type <expr> expr primary arg annot opt_init
%type <exprs> args arglist kwlist dims
%type <type> type

%%

file:
	body			{ ps->top = $1.head; }
	;

body:
	%empty			{ $$ = (StmtList){NULL, NULL}; }
	| body item		{
					$$ = $1;
					if ($2) {
						if ($$.tail)
							$$.tail->next = $2;
						else
							$$.head = $2;
						$$.tail = $2;
					}
				}
	;

item:
	NEWLINE			{ $$ = NULL; }
	| stmt NEWLINE		{ $$ = $1; }
	| error NEWLINE		{ $$ = NULL; yyerrok; }
	;

stmt:
	IDENT '=' expr		{
					$$ = new_stmt(ps, S_ASSIGN, $1, @1);
					$$->expr = $3;
				}
	| IDENT ':' type FROM expr {
					$$ = new_stmt(ps, S_DECL, $1, @1);
					$$->type = $3;
					$$->val = $5;
				}
	| IDENT FROM expr	{
					$$ = new_stmt(ps, S_SOURCE, $1, @1);
					$$->val = $3;
				}
	| decl opt_init		{
					$$ = $1;
					$$->val = $2;
				}
	| decl opt_init annot	{
					$$ = $1;
					$$->val = $2;
					$$->annot = $3;
				}
	| IDENT expr		{
					$$ = new_stmt(ps, S_SETTING, $1, @1);
					$$->val = $2;
				}
	| IDENT kwlist		{
					$$ = new_stmt(ps, S_SETTING, $1, @1);
					$$->kw = $2.head;
				}
	| IDENT '{' body '}'	{
					$$ = new_stmt(ps, S_SECTION, $1, @1);
					$$->body = $3.head;
				}
	| BLOCK IDENT '{' body '}' {
					$$ = new_stmt(ps, S_BLOCK, $2, @2);
					$$->loc = at(ps, @1);
					$$->body = $4.head;
				}
	| BLOCK IDENT '[' expr ']' '{' body '}' {
					$$ = new_stmt(ps, S_BLOCK, $2, @2);
					$$->loc = at(ps, @1);
					$$->expr = $4;
					$$->body = $7.head;
				}
	| REPEAT expr IDENT IDENT '{' body '}' {
					$$ = new_stmt(ps, S_REPEAT, $4, @4);
					$$->loc = at(ps, @1);
					$$->expr = $2;
					$$->body = $6.head;
					if (strcmp($3, "as") != 0)
						error_at(ps->d, at(ps, @3),
							 "expected 'as' after the repeat count, like repeat 12 as i { ... }");
				}
	;

decl:
	PARAM IDENT ':' type	{
					$$ = new_stmt(ps, S_PARAM, $2, @2);
					$$->loc = at(ps, @1);
					$$->type = $4;
				}
	| BUFFER IDENT ':' type	{
					$$ = new_stmt(ps, S_BUFFER, $2, @2);
					$$->loc = at(ps, @1);
					$$->type = $4;
				}
	;

opt_init:
	%empty			{ $$ = NULL; }
	| INIT expr		{ $$ = $2; }
	;

annot:
	IDENT			{
					$$ = new_expr(ps, E_NAME, at(ps, @1), 1);
					$$->name = $1;
				}
	| IDENT '(' args ')'	{ $$ = call(ps, $1, at(ps, @1), $3); }
	;

kwlist:
	IDENT '=' expr		{
					$3->key = $1;
					$3->key_loc = at(ps, @1);
					$$ = expr_append((ExprList){0}, $3);
				}
	| kwlist ',' IDENT '=' expr {
					$5->key = $3;
					$5->key_loc = at(ps, @3);
					$$ = expr_append($1, $5);
				}
	;

type:
	IDENT			{ $$ = (AstType){.dtype = $1, .loc = at(ps, @1)}; }
	| IDENT '[' dims ']'	{
					$$ = (AstType){.dtype = $1, .loc = at(ps, @1), .bracketed = 1,
						       .dims = $3.head, .ndims = $3.n};
				}
	;

dims:
	expr			{ $$ = expr_append((ExprList){0}, $1); }
	| dims ',' expr		{ $$ = expr_append($1, $3); }
	;

expr:
	primary			{ $$ = $1; }
	| expr '+' expr		{ $$ = binary(ps, '+', $1, $3, at(ps, @2)); }
	| expr '-' expr		{ $$ = binary(ps, '-', $1, $3, at(ps, @2)); }
	| expr '*' expr		{ $$ = binary(ps, '*', $1, $3, at(ps, @2)); }
	| expr '/' expr		{ $$ = binary(ps, '/', $1, $3, at(ps, @2)); }
	| '-' expr %prec NEG	{
					$$ = new_expr(ps, E_NEG, at(ps, @1), $2->height + 1);
					$$->lhs = $2;
					$$->depth = $2->depth;
				}
	;

primary:
	INT			{
					$$ = new_expr(ps, E_INT, at(ps, @1), 1);
					$$->i = $1;
				}
	| FLOAT			{
					$$ = new_expr(ps, E_FLOAT, at(ps, @1), 1);
					$$->f = $1;
				}
	| STRING		{
					$$ = new_expr(ps, E_STRING, at(ps, @1), 1);
					$$->name = $1;
				}
	| IDENT			{
					$$ = new_expr(ps, E_NAME, at(ps, @1), 1);
					$$->name = $1;
				}
	| WORD			{
					$$ = new_expr(ps, E_NAME, at(ps, @1), 1);
					$$->name = $1;
				}
	| IDENT '.' IDENT	{
					$$ = new_expr(ps, E_MEMBER, at(ps, @1), 1);
					$$->name = $1;
					$$->member = $3;
					$$->member_loc = at(ps, @3);
				}
	| IDENT '(' args ')'	{ $$ = call(ps, $1, at(ps, @1), $3); }
	| '(' expr ')'		{ $$ = $2; }
	;

args:
	%empty			{ $$ = (ExprList){0}; }
	| arglist		{ $$ = $1; }
	;

arglist:
	arg			{ $$ = expr_append((ExprList){0}, $1); }
	| arglist ',' arg	{ $$ = expr_append($1, $3); }
	;

arg:
	expr			{ $$ = $1; }
	| IDENT '=' expr	{
					$$ = $3;
					$$->key = $1;
					$$->key_loc = at(ps, @1);
				}
	| INIT '=' expr		{ /* loss_scale dynamic(init=...): the keyword as a name */
					$$ = $3;
					$$->key = "init";
					$$->key_loc = at(ps, @1);
				}
	;

%%

/* A syntax error: compiler/syntax.c words it from the expected tokens. */
static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner, ParseState *ps)
{
	(void)scanner;
	yysymbol_kind_t kinds[YYNTOKENS];
	const char *names[YYNTOKENS];
	int n = yypcontext_expected_tokens(ctx, kinds, YYNTOKENS);
	for (int i = 0; i < n; i++)
		names[i] = yysymbol_name(kinds[i]);
	syntax_error(ps, names, n < 0 ? 0 : n);
	return 0;
}
