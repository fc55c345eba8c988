/*
 * parser.y - the DSL grammar (pure, reentrant bison parser).
 *
 * A file is a list of statements ended by newlines (or `;`); the scanner
 * drops newlines inside () and [] and puts one before a `}` that closes a
 * line, so every statement, block and section ends with NEWLINE:
 *
 *   body    := { NEWLINE | stmt NEWLINE | error NEWLINE }
 *   stmt    := IDENT '=' expr                       assignment (model)
 *            | IDENT ':' type 'from' value          data declaration
 *            | IDENT 'from' value                   eval source
 *            | 'param' IDENT ':' type ['init' value] parameter (block)
 *            | 'buffer' IDENT ':' type ['init' value] [IDENT]
 *                                                    buffer (block); IDENT: nosync
 *            | IDENT value                          setting: steps 100, mesh auto
 *            | IDENT IDENT '=' value {',' IDENT '=' value}   mesh dp_shard=2, tp=1
 *            | IDENT '{' body '}'                   section: data, eval, model, train
 *            | 'block' IDENT '{' body '}'           block (model)
 *   type    := IDENT ['[' value {',' value} ']']    f32[batch, 784]
 *   value   := INT | FLOAT | '-' INT | '-' FLOAT | STRING | IDENT
 *            | IDENT '(' [arg {',' arg}] ')'        arg := value | IDENT '=' value
 *   expr    := IDENT | IDENT '.' IDENT | IDENT '(' [expr {',' expr}] ')'
 *
 * Which statement is allowed where is checked by compiler/lower.c. Error
 * recovery: `error NEWLINE` in every statement list skips to the end of the
 * bad statement, so one run reports one error per bad statement.
 */
%define api.pure full
%define api.prefix {fe_yy}
%define api.token.prefix {TK_}
%define parse.error detailed
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
typedef struct { Arg *head, *tail; int n; } ArgList;
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
	s->index = -1;
	if (++ps->nstmts == AST_MAX_STMTS)
		error_at(ps->d, s->loc, "too many statements (the limit is %d)", AST_MAX_STMTS);
	return s;
}

static Arg *new_arg(ParseState *ps, const char *key, Loc key_loc, AstVal v)
{
	Arg *a = ast_alloc(ps, sizeof(Arg));
	a->key = key;
	a->key_loc = key_loc;
	a->val = v;
	return a;
}

static ArgList arg_append(ArgList l, Arg *a)
{
	if (l.tail)
		l.tail->next = a;
	else
		l.head = a;
	l.tail = a;
	l.n++;
	return l;
}

static AstVal num_val(AstValKind k, int64_t i, double f, Loc l)
{
	return (AstVal){.kind = k, .i = i, .f = f, .loc = l};
}
}

%union {
	char *str;
	int64_t inum;
	double fnum;
	AstVal val;
	Arg *arg;
	ArgList args;
	Expr *expr;
	ExprList exprs;
	AstType type;
	Stmt *stmt;
	StmtList stmts;
}

%token NEWLINE "end of line"
%token <str> IDENT "identifier"
%token <str> STRING "string"
%token <inum> INT "integer"
%token <fnum> FLOAT "number"
%token BLOCK "block"
%token PARAM "param"
%token BUFFER "buffer"
%token FROM "from"
%token INIT "init"

%type <stmts> body
%type <stmt> item stmt buffer
%type <val> value
%type <arg> arg
%type <args> args arglist kwlist dims
%type <type> type
%type <expr> expr
%type <exprs> exprs exprlist

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
	| IDENT ':' type FROM value {
					$$ = new_stmt(ps, S_DECL, $1, @1);
					$$->type = $3;
					$$->has_val = 1;
					$$->val = $5;
				}
	| IDENT FROM value	{
					$$ = new_stmt(ps, S_SOURCE, $1, @1);
					$$->has_val = 1;
					$$->val = $3;
				}
	| PARAM IDENT ':' type	{
					$$ = new_stmt(ps, S_PARAM, $2, @2);
					$$->loc = at(ps, @1);
					$$->type = $4;
				}
	| PARAM IDENT ':' type INIT value {
					$$ = new_stmt(ps, S_PARAM, $2, @2);
					$$->loc = at(ps, @1);
					$$->type = $4;
					$$->has_val = 1;
					$$->val = $6;
				}
	| buffer		{ $$ = $1; }
	| buffer IDENT		{
					$$ = $1;
					$$->flag = $2;
					$$->flag_loc = at(ps, @2);
				}
	| IDENT value		{
					$$ = new_stmt(ps, S_SETTING, $1, @1);
					$$->has_val = 1;
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
	;

buffer:
	BUFFER IDENT ':' type	{
					$$ = new_stmt(ps, S_BUFFER, $2, @2);
					$$->loc = at(ps, @1);
					$$->type = $4;
				}
	| BUFFER IDENT ':' type INIT value {
					$$ = new_stmt(ps, S_BUFFER, $2, @2);
					$$->loc = at(ps, @1);
					$$->type = $4;
					$$->has_val = 1;
					$$->val = $6;
				}
	;

kwlist:
	IDENT '=' value		{ $$ = arg_append((ArgList){0}, new_arg(ps, $1, at(ps, @1), $3)); }
	| kwlist ',' IDENT '=' value {
					$$ = arg_append($1, new_arg(ps, $3, at(ps, @3), $5));
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
	value			{ $$ = arg_append((ArgList){0}, new_arg(ps, NULL, $1.loc, $1)); }
	| dims ',' value	{ $$ = arg_append($1, new_arg(ps, NULL, $3.loc, $3)); }
	;

value:
	INT			{ $$ = num_val(V_INT, $1, (double)$1, at(ps, @1)); }
	| FLOAT			{ $$ = num_val(V_FLOAT, 0, $1, at(ps, @1)); }
	| '-' INT		{ $$ = num_val(V_INT, -$2, -(double)$2, at(ps, @1)); }
	| '-' FLOAT		{ $$ = num_val(V_FLOAT, 0, -$2, at(ps, @1)); }
	| STRING		{ $$ = (AstVal){.kind = V_STRING, .s = $1, .loc = at(ps, @1)}; }
	| IDENT			{ $$ = (AstVal){.kind = V_IDENT, .s = $1, .loc = at(ps, @1)}; }
	| IDENT '(' args ')'	{
					$$ = (AstVal){.kind = V_CALL, .s = $1, .args = $3.head,
						      .nargs = $3.n, .loc = at(ps, @1)};
				}
	;

args:
	%empty			{ $$ = (ArgList){0}; }
	| arglist		{ $$ = $1; }
	;

arglist:
	arg			{ $$ = arg_append((ArgList){0}, $1); }
	| arglist ',' arg	{ $$ = arg_append($1, $3); }
	;

arg:
	value			{ $$ = new_arg(ps, NULL, $1.loc, $1); }
	| IDENT '=' value	{ $$ = new_arg(ps, $1, at(ps, @1), $3); }
	;

expr:
	IDENT			{
					$$ = ast_alloc(ps, sizeof(Expr));
					$$->kind = E_NAME;
					$$->name = $1;
					$$->loc = at(ps, @1);
				}
	| IDENT '.' IDENT	{
					$$ = ast_alloc(ps, sizeof(Expr));
					$$->kind = E_MEMBER;
					$$->name = $1;
					$$->member = $3;
					$$->loc = at(ps, @1);
					$$->member_loc = at(ps, @3);
				}
	| IDENT '(' exprs ')'	{
					$$ = ast_alloc(ps, sizeof(Expr));
					$$->kind = E_CALL;
					$$->name = $1;
					$$->loc = at(ps, @1);
					$$->args = $3.head;
					$$->nargs = $3.n;
					int inner = 0;
					for (Expr *a = $3.head; a; a = a->next)
						if (a->depth > inner)
							inner = a->depth;
					$$->depth = inner + 1; /* the scanner bounds it */
				}
	;

exprs:
	%empty			{ $$ = (ExprList){0}; }
	| exprlist		{ $$ = $1; }
	;

exprlist:
	expr			{ $$ = (ExprList){$1, $1, 1}; }
	| exprlist ',' expr	{
					$$ = $1;
					$$.tail->next = $3;
					$$.tail = $3;
					$$.n++;
				}
	;

%%
