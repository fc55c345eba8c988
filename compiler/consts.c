/*
 * consts.c - constant expressions and the config section.
 *
 * Wherever the DSL wants a number (dims, settings, initialiser arguments, op
 * keyword arguments, repeat counts) it takes a constant expression: numbers,
 * config constants, enclosing repeat variables, + - * /, unary minus,
 * parentheses and sqrt(x). Integers stay int64 and every overflow is an
 * error; integer / must divide exactly (a dim that silently rounds would be
 * a wrong model); an operation with a float operand is done in double.
 *
 * The config section (`config { NAME = EXPR }`) is evaluated first, in file
 * order: a constant can use the ones above it. dpc's -D NAME=VALUE replaces a
 * constant's value (its expression is then not evaluated, so the constants
 * below it see the new value); a -D for a name the section lacks is an error.
 */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"

/* Words with a meaning of their own in value positions: a constant with
 * such a name would change what `f32[batch, 4]` or `strategy ddp` mean. */
static const char *const reserved[] = {"batch", "auto", "true", "false"};

/* ---- the text of an expression, for messages ("d / heads") ---- */

typedef struct {
	char *p;
	size_t len, cap;
} Text;

static void put(Text *t, const char *s)
{
	size_t n = strlen(s);
	if (t->len + n >= t->cap)
		n = t->cap - 1 - t->len;
	memcpy(t->p + t->len, s, n);
	t->len += n;
	t->p[t->len] = '\0';
}

static int prec(int op)
{
	return op == '+' || op == '-' ? 1 : 2;
}

static void expr_text(Text *t, const Expr *e)
{
	char buf[64];
	if (t->len + 1 >= t->cap)
		return;
	switch (e->kind) {
	case E_INT:
		snprintf(buf, sizeof buf, "%lld", (long long)e->i);
		put(t, buf);
		break;
	case E_FLOAT:
		snprintf(buf, sizeof buf, "%g", e->f);
		put(t, buf);
		break;
	case E_STRING:
		put(t, "\"");
		put(t, e->name);
		put(t, "\"");
		break;
	case E_NAME:
		put(t, e->name);
		break;
	case E_MEMBER:
		put(t, e->name);
		put(t, ".");
		put(t, e->member);
		break;
	case E_CALL:
		put(t, e->name);
		put(t, "(");
		for (const Expr *a = e->args; a; a = a->next) {
			if (a != e->args)
				put(t, ", ");
			if (a->key) {
				put(t, a->key);
				put(t, "=");
			}
			expr_text(t, a);
		}
		put(t, ")");
		break;
	case E_NEG:
		put(t, "-");
		if (e->lhs->kind == E_BINARY)
			put(t, "(");
		expr_text(t, e->lhs);
		if (e->lhs->kind == E_BINARY)
			put(t, ")");
		break;
	case E_BINARY: {
		int pl = e->lhs->kind == E_BINARY && prec(e->lhs->op) < prec(e->op);
		int pr = e->rhs->kind == E_BINARY &&
			 (prec(e->rhs->op) < prec(e->op) ||
			  (prec(e->rhs->op) == prec(e->op) && (e->op == '-' || e->op == '/')));
		if (pl)
			put(t, "(");
		expr_text(t, e->lhs);
		if (pl)
			put(t, ")");
		snprintf(buf, sizeof buf, " %c ", e->op);
		put(t, buf);
		if (pr)
			put(t, "(");
		expr_text(t, e->rhs);
		if (pr)
			put(t, ")");
		break;
	}
	}
}

/* The expression's text, shortened to about 60 bytes; from the tree arena. */
static const char *text_of(Lower *L, const Expr *e)
{
	Text t = {ast_alloc(L->ps, 72), 0, 64};
	expr_text(&t, e);
	if (t.len >= t.cap - 1)
		memcpy(t.p + t.len, "...", 4);
	return t.p;
}

static const char *num_str(Num n, char *buf, size_t len)
{
	if (n.is_float)
		snprintf(buf, len, "%g", n.f);
	else
		snprintf(buf, len, "%lld", (long long)n.i);
	return buf;
}

/* ---- evaluation ---- */

static double as_double(Num n)
{
	return n.is_float ? n.f : (double)n.i;
}

/* The constant or repeat variable name, or NULL. */
static int lookup(Lower *L, const char *name, Num *out, int *ok)
{
	for (int k = L->nrep - 1; k >= 0; k--) {
		if (strcmp(L->rep_var[k], name) == 0) {
			*out = (Num){0, L->rep_val[k], (double)L->rep_val[k]};
			*ok = 1;
			return 1;
		}
	}
	int *c = scope_map_get(&L->constmap, name);
	if (!c)
		return 0;
	*out = L->consts[*c].val;
	*ok = L->consts[*c].ok;
	return 1;
}

int const_is_constant(Lower *L, const char *name)
{
	Num n;
	int ok;
	return lookup(L, name, &n, &ok);
}

static int binary(Lower *L, const Expr *e, Num a, Num b, Num *out)
{
	Loc op_loc = e->member_loc;
	char sa[32], sb[32];
	if (a.is_float || b.is_float) {
		double x = as_double(a), y = as_double(b), r;
		switch (e->op) {
		case '+':
			r = x + y;
			break;
		case '-':
			r = x - y;
			break;
		case '*':
			r = x * y;
			break;
		default:
			if (y == 0) {
				ERR(op_loc, "%s: division by zero", text_of(L, e));
				return -1;
			}
			r = x / y;
			break;
		}
		if (!isfinite(r)) {
			ERR(op_loc, "%s: the result %s %c %s is out of range", text_of(L, e),
			    num_str(a, sa, sizeof sa), e->op, num_str(b, sb, sizeof sb));
			return -1;
		}
		*out = (Num){1, 0, r};
		return 0;
	}
	int64_t r;
	int over = 0;
	switch (e->op) {
	case '+':
		over = __builtin_add_overflow(a.i, b.i, &r);
		break;
	case '-':
		over = __builtin_sub_overflow(a.i, b.i, &r);
		break;
	case '*':
		over = __builtin_mul_overflow(a.i, b.i, &r);
		break;
	default:
		if (b.i == 0) {
			ERR(op_loc, "%s: division by zero", text_of(L, e));
			return -1;
		}
		if (a.i == INT64_MIN && b.i == -1) {
			over = 1;
			break;
		}
		if (a.i % b.i != 0) {
			ERR(op_loc, "%s: %lld is not divisible by %lld (write a float, like %lld.0, "
				    "for a float division)",
			    text_of(L, e), (long long)a.i, (long long)b.i, (long long)a.i);
			return -1;
		}
		r = a.i / b.i;
		break;
	}
	if (over) {
		if (e->lhs->kind == E_INT && e->rhs->kind == E_INT)
			ERR(op_loc, "%s overflows a 64-bit integer", text_of(L, e));
		else
			ERR(op_loc, "%s: %lld %c %lld overflows a 64-bit integer", text_of(L, e),
			    (long long)a.i, e->op, (long long)b.i);
		return -1;
	}
	*out = (Num){0, r, (double)r};
	return 0;
}

int const_eval_num(Lower *L, const Expr *e, const char *what, Num *out)
{
	Num a, b;
	switch (e->kind) {
	case E_INT:
		*out = (Num){0, e->i, (double)e->i};
		return 0;
	case E_FLOAT:
		*out = (Num){1, 0, e->f};
		return 0;
	case E_NAME: {
		int ok;
		if (!lookup(L, e->name, out, &ok)) {
			ERR(e->loc, "unknown constant '%s' (%s must be a number)", e->name, what);
			return -1;
		}
		return ok ? 0 : -1; /* a constant whose definition failed: reported there */
	}
	case E_NEG:
		if (const_eval_num(L, e->lhs, what, &a))
			return -1;
		if (a.is_float) {
			*out = (Num){1, 0, -a.f};
			return 0;
		}
		if (a.i == INT64_MIN) {
			ERR(e->loc, "-%s overflows a 64-bit integer", text_of(L, e->lhs));
			return -1;
		}
		*out = (Num){0, -a.i, -(double)a.i};
		return 0;
	case E_BINARY:
		if (const_eval_num(L, e->lhs, what, &a) | const_eval_num(L, e->rhs, what, &b))
			return -1;
		return binary(L, e, a, b, out);
	case E_CALL:
		if (strcmp(e->name, "sqrt") != 0) {
			ERR(e->loc, "%s must be a number, not a call of '%s' (only sqrt(x) can be "
				    "used in numbers)",
			    what, e->name);
			return -1;
		}
		if (e->nargs != 1 || e->args->key) {
			ERR(e->loc, "sqrt takes one number");
			return -1;
		}
		if (const_eval_num(L, e->args, what, &a))
			return -1;
		if (as_double(a) < 0) {
			ERR(e->args->loc, "sqrt of a negative number (%s)", num_str(a, (char[32]){0}, 32));
			return -1;
		}
		*out = (Num){1, 0, sqrt(as_double(a))};
		return 0;
	case E_STRING:
	case E_MEMBER:
		ERR(e->loc, "%s must be a number", what);
		return -1;
	}
	die("bad expression kind %d", (int)e->kind);
}

static int num_val(Lower *L, const Expr *e, AstVal *out)
{
	Num n;
	if (const_eval_num(L, e, "the value", &n))
		return -1;
	*out = (AstVal){.kind = n.is_float ? V_FLOAT : V_INT, .i = n.i,
			.f = n.is_float ? n.f : (double)n.i, .loc = e->loc};
	return 0;
}

int const_eval_value(Lower *L, const Expr *e, AstVal *out)
{
	switch (e->kind) {
	case E_STRING:
		*out = (AstVal){.kind = V_STRING, .s = e->name, .loc = e->loc};
		return 0;
	case E_NAME:
		if (const_is_constant(L, e->name))
			return num_val(L, e, out);
		*out = (AstVal){.kind = V_IDENT, .s = e->name, .loc = e->loc};
		return 0;
	case E_MEMBER:
		ERR(e->loc, "expected a value here, not the tensor '%s.%s'", e->name, e->member);
		return -1;
	case E_CALL: {
		if (strcmp(e->name, "sqrt") == 0)
			return num_val(L, e, out);
		*out = (AstVal){.kind = V_CALL, .s = e->name, .nargs = e->nargs, .loc = e->loc};
		Arg **tail = &out->args;
		int rc = 0;
		for (const Expr *a = e->args; a; a = a->next) {
			Arg *arg = ast_alloc(L->ps, sizeof(Arg));
			arg->key = a->key;
			arg->key_loc = a->key ? a->key_loc : a->loc;
			if (const_eval_value(L, a, &arg->val))
				rc = -1;
			*tail = arg;
			tail = &arg->next;
		}
		return rc;
	}
	default:
		return num_val(L, e, out);
	}
}

/* ---- the config section and -D ---- */

static void add_const(Lower *L, const char *name, Num v, int ok)
{
	L->consts = scope_grow(L, L->consts, &L->capconsts, L->nconsts + 1, sizeof(Const));
	L->consts[L->nconsts] = (Const){name, v, ok};
	scope_map_put(L, &L->constmap, name, L->nconsts++);
}

void const_lower_config(Lower *L)
{
	const FeOptions *o = L->opts;
	int ndef = o ? o->ndefines : 0;
	char *used = ast_alloc(L->ps, (size_t)ndef + 1);
	if (L->config) {
		for (const Stmt *s = L->config->body; s; s = s->next) {
			if (s->kind != S_ASSIGN) {
				ERR(s->loc, "expected 'NAME = EXPR' in the config section");
				continue;
			}
			if (scope_map_get(&L->constmap, s->name)) {
				ERR(s->name_loc, "duplicate config constant '%s'", s->name);
				continue;
			}
			size_t r = 0;
			while (r < sizeof reserved / sizeof reserved[0] && strcmp(reserved[r], s->name))
				r++;
			if (r < sizeof reserved / sizeof reserved[0]) {
				ERR(s->name_loc, "'%s' cannot be a config constant (it is a word of the "
						 "language)",
				    s->name);
				continue;
			}
			/* the last -D for the name wins */
			int def = -1;
			for (int k = 0; k < ndef; k++)
				if (strcmp(o->defines[k].name, s->name) == 0) {
					used[k] = 1;
					def = k;
				}
			Num v = {0};
			int ok;
			if (def >= 0) {
				const FeDefine *dv = &o->defines[def];
				v = (Num){dv->is_float, dv->i, dv->is_float ? dv->f : (double)dv->i};
				ok = 1;
			} else {
				ok = const_eval_num(L, s->expr, "a config constant", &v) == 0;
			}
			add_const(L, s->name, v, ok);
		}
	}
	for (int k = 0; k < ndef; k++) {
		if (used[k])
			continue;
		if (L->config)
			ERR(L->config->name_loc, "-D %s: the config section has no constant '%s'",
			    o->defines[k].name, o->defines[k].name);
		else
			ERR(L->top, "-D %s: the file has no config section", o->defines[k].name);
	}
}

/* A declared type: dtype and dims. Data: the first dim is `batch` (dims[0] is
 * left 0 for the caller), the rest positive. Params: f32, all dims positive. */
int const_lower_type(Lower *L, const AstType *t, const char *what, const char *name, int is_data,
		     DpDtype *dt, int *ndim, int64_t *dims)
{
	if (strcmp(t->dtype, "f32") == 0)
		*dt = DP_F32;
	else if (strcmp(t->dtype, "i32") == 0 && is_data)
		*dt = DP_I32;
	else {
		ERR(t->loc, "unsupported dtype '%s' for %s '%s' (use %s)", t->dtype, what, name,
		    is_data ? "f32 or i32" : "f32");
		return -1;
	}
	if (!t->bracketed) {
		ERR(t->loc, "%s '%s' needs a shape, like %s", what, name,
		    is_data ? "f32[batch, 784]" : "f32[784, 256]");
		return -1;
	}
	if (t->ndims > DP_MAX_DIMS) {
		ERR(t->loc, "%s '%s' has %d dimensions (at most %d)", what, name, t->ndims,
		    DP_MAX_DIMS);
		return -1;
	}
	int rc = 0, i = 0;
	int64_t numel = 1;
	for (const Expr *e = t->dims; e; e = e->next, i++) {
		AstVal val;
		const AstVal *v = &val;
		dims[i] = 0;
		if (const_eval_value(L, e, &val)) {
			rc = -1;
			continue;
		}
		int is_batch = v->kind == V_IDENT && strcmp(v->s, "batch") == 0;
		if (is_data && i == 0) {
			if (!is_batch) {
				ERR(v->loc, "the first dimension of data '%s' must be 'batch'", name);
				rc = -1;
			}
			continue;
		}
		if (is_batch) {
			ERR(v->loc, "'batch' can only be the first dimension of a data declaration");
			rc = -1;
		} else if (v->kind == V_IDENT) {
			ERR(v->loc, "unknown constant '%s' (a dimension must be a number)", v->s);
			rc = -1;
		} else if (scope_want_int(L, v, "a dimension", 1, MAX_ELEMS, &dims[i])) {
			rc = -1;
		} else if (__builtin_mul_overflow(numel, dims[i], &numel) || numel > MAX_ELEMS) {
			ERR(v->loc, "%s '%s' is too large (more than 2^40 elements)", what, name);
			return -1;
		}
	}
	*ndim = t->ndims;
	return rc;
}


int const_parse_define(const char *arg, FeDefine *out)
{
	const char *eq = strchr(arg, '=');
	if (!eq || eq == arg)
		return -1;
	for (const char *p = arg; p < eq; p++)
		if (!(*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (p > arg && *p >= '0' && *p <= '9')))
			return -1;
	if (eq - arg >= (ptrdiff_t)sizeof out->name)
		return -1;
	const char *v = eq + 1;
	char *end;
	*out = (FeDefine){.is_float = 0};
	errno = 0;
	if (strpbrk(v, ".eE")) {
		out->f = strtod(v, &end);
		out->is_float = 1;
		if (errno || end == v || *end || !isfinite(out->f))
			return -1;
	} else {
		out->i = strtoll(v, &end, 10);
		if (errno || end == v || *end)
			return -1;
	}
	memcpy(out->name, arg, (size_t)(eq - arg));
	out->name[eq - arg] = '\0';
	return 0;
}
