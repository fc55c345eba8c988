/*
 * scope.c - the lowering context's bottom layer, shared by the section files
 * (lower.c: sections and the driver; consts.c: constant expressions, config,
 * declared types; model.c: the model): errors collected and reported in
 * source order, the name maps, symbols and values, and the checks of setting
 * values (integers, floats, words, keyword arguments, strategy names).
 *
 * It calls nothing in the other front-end files: lower.c uses consts.c and
 * model.c, model.c uses consts.c, and all of them use this file.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"
#include "suggest.h"

/* Sections are checked in dependency order; their errors are collected and
 * reported sorted by position, so the user reads them top to bottom. */
struct Pending {
	Loc loc;
	int seq;
	char *msg;
};

/* ---- small helpers ---- */

Loc scope_gloc(Lower *L, Loc l)
{
	l.file = L->g->file; /* graph Locs must outlive the tree and the caller's path */
	return l;
}

void *scope_grow(Lower *L, void *arr, int *cap, int need, size_t elem)
{
	if (need <= *cap)
		return arr;
	int nc = *cap ? *cap * 2 : 16;
	void *na = ast_alloc(L->ps, (size_t)nc * elem);
	if (arr)
		memcpy(na, arr, (size_t)*cap * elem);
	*cap = nc;
	return na;
}

void scope_error(Lower *L, Loc loc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *msg = ast_alloc(L->ps, (size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(msg, (size_t)n + 1, fmt, ap);
	va_end(ap);
	L->errs = scope_grow(L, L->errs, &L->caperrs, L->nerrs + 1, sizeof(Pending));
	L->errs[L->nerrs] = (Pending){loc, L->nerrs, msg};
	L->nerrs++;
}

static int pending_cmp(const void *a, const void *b)
{
	const Pending *x = a, *y = b;
	if (x->loc.line != y->loc.line)
		return x->loc.line < y->loc.line ? -1 : 1;
	if (x->loc.col != y->loc.col)
		return x->loc.col < y->loc.col ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* ---- hash maps ---- */

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

int *scope_map_get(const NameMap *m, const char *key)
{
	if (!m->cap)
		return NULL;
	for (size_t i = hash_str(key) & (size_t)(m->cap - 1);; i = (i + 1) & (size_t)(m->cap - 1)) {
		if (!m->slots[i].key)
			return NULL;
		if (strcmp(m->slots[i].key, key) == 0)
			return &m->slots[i].val;
	}
}

void scope_map_put(Lower *L, NameMap *m, const char *key, int val)
{
	int *v = scope_map_get(m, key);
	if (v) {
		*v = val;
		return;
	}
	if (2 * (m->n + 1) > m->cap) { /* at most half full: probes stay short */
		NameMap nm = {NULL, m->cap ? 2 * m->cap : 64, 0};
		nm.slots = ast_alloc(L->ps, sizeof(MapSlot) * (size_t)nm.cap);
		for (int i = 0; i < m->cap; i++)
			if (m->slots[i].key)
				scope_map_put(L, &nm, m->slots[i].key, m->slots[i].val);
		*m = nm;
	}
	size_t i = hash_str(key) & (size_t)(m->cap - 1);
	while (m->slots[i].key)
		i = (i + 1) & (size_t)(m->cap - 1);
	m->slots[i] = (MapSlot){key, val};
	m->n++;
}

Sym *scope_find_sym(Lower *L, const char *name)
{
	int *i = scope_map_get(&L->symmap, name);
	return i ? &L->syms[*i] : NULL;
}

void scope_add_sym(Lower *L, const char *name, int value, int is_data)
{
	L->syms = scope_grow(L, L->syms, &L->capsyms, L->nsyms + 1, sizeof(Sym));
	L->syms[L->nsyms] = (Sym){name, value, is_data};
	scope_map_put(L, &L->symmap, name, L->nsyms++);
}

Value *scope_value(Lower *L, const char *name, DpDtype dt, int ndim, const int64_t *dims,
		   DpTensorKind kind, Loc loc)
{
	Value *v = ir_value(L->g, name, dt, ndim, dims, kind, loc);
	scope_map_put(L, &L->values, v->name, v->id);
	return v;
}

const char *scope_fresh_name(Lower *L, const char *stem)
{
	if (!scope_map_get(&L->values, stem) && !scope_map_get(&L->targets, stem))
		return ir_strdup(L->g, stem);
	for (int i = 1;; i++) {
		const char *s = ir_fmt(L->g, "%s%d", stem, i);
		if (!scope_map_get(&L->values, s) && !scope_map_get(&L->targets, s))
			return s;
	}
}

/* ---- values: numbers, keyword arguments ---- */

int scope_want_int(Lower *L, const AstVal *v, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
	if (v->kind != V_INT) {
		ERR(v->loc, "%s must be an integer", what);
		return -1;
	}
	if (v->i < lo) {
		if (lo == 1)
			ERR(v->loc, "%s must be a positive integer, got %lld", what, (long long)v->i);
		else
			ERR(v->loc, "%s must be at least %lld, got %lld", what, (long long)lo,
			    (long long)v->i);
		return -1;
	}
	if (v->i > hi) {
		ERR(v->loc, "%s is too large (at most %lld)", what, (long long)hi);
		return -1;
	}
	*out = v->i;
	return 0;
}

/* A number that fits a finite f32. */
int scope_want_float(Lower *L, const AstVal *v, const char *what, float *out)
{
	double x;
	if (v->kind == V_INT)
		x = (double)v->i;
	else if (v->kind == V_FLOAT)
		x = v->f;
	else {
		ERR(v->loc, "%s must be a number", what);
		return -1;
	}
	if (!isfinite((float)x)) {
		ERR(v->loc, "%s is out of range for f32", what);
		return -1;
	}
	*out = (float)x;
	return 0;
}

/* Match the keyword arguments of a call against keys; found[i] gets the
 * argument for keys[i] or NULL. V_IDENT (no parentheses) has none. */
int scope_kwargs(Lower *L, const AstVal *call, const char *const *keys, int nkeys,
		 const Arg **found)
{
	int rc = 0;
	for (int i = 0; i < nkeys; i++)
		found[i] = NULL;
	if (call->kind != V_CALL)
		return 0;
	for (const Arg *a = call->args; a; a = a->next) {
		if (!a->key) {
			ERR(a->val.loc, "arguments of '%s' must be named, like %s=...", call->s,
			    nkeys ? keys[0] : "name");
			rc = -1;
			continue;
		}
		int k = 0;
		while (k < nkeys && strcmp(keys[k], a->key) != 0)
			k++;
		if (k == nkeys) {
			ERR(a->key_loc, "unknown argument '%s' for '%s'", a->key, call->s);
			rc = -1;
		} else if (found[k]) {
			ERR(a->key_loc, "duplicate argument '%s'", a->key);
			rc = -1;
		} else {
			found[k] = a;
		}
	}
	return rc;
}

int scope_strategy_word(Lower *L, const AstVal *v)
{
	if (v->kind != V_IDENT) {
		ERR(v->loc, "expected a strategy name (ddp, zero1, zero2, full_shard, hybrid_shard)");
		return -1;
	}
	for (int i = 0; i < DP_NSTRAT; i++)
		if (strcmp(dp_strategy_names[i], v->s) == 0)
			return i;
	ERR(v->loc, "unknown strategy '%s' (strategies: ddp, zero1, zero2, full_shard, hybrid_shard)",
	    v->s);
	return -1;
}

int scope_dtype_word(Lower *L, const AstVal *v, const char *what)
{
	if (v->kind == V_IDENT && (strcmp(v->s, "f32") == 0 || strcmp(v->s, "fp32") == 0))
		return DP_F32;
	if (v->kind == V_IDENT && strcmp(v->s, "bf16") == 0)
		return DP_BF16;
	if (v->kind == V_IDENT && (strcmp(v->s, "f16") == 0 || strcmp(v->s, "fp16") == 0))
		return DP_F16;
	ERR(v->loc, "%s must be f32, bf16 or f16", what);
	return -1;
}

/* A request for 16-bit dtype dt (train's setting or a block's) at `at`.
 * The first place is kept in the step file for a backend that cannot run
 * it to name. A model computes in one 16-bit dtype: its compute copies
 * share one flat buffer, and no kernel converts bf16 to f16. */
void scope_note_half(Lower *L, Loc at, int dt)
{
	if (L->half_dtype && L->half_dtype != dt) {
		ERR(at, "%s here, but line %d asked for %s: a model computes in one 16-bit dtype",
		    dp_dtype_names[dt], L->half_at.line, dp_dtype_names[L->half_dtype]);
		return;
	}
	if (!L->half_dtype) {
		L->half_dtype = dt;
		L->half_at = at;
	}
	if (L->g->cfg.half_line == 0 && at.line > 0) {
		L->g->cfg.half_line = (uint32_t)at.line;
		L->g->cfg.half_col = (uint32_t)at.col;
	}
}

int scope_want_word(Lower *L, const AstVal *v, const char *what, const char *a, const char *b)
{
	if (v->kind == V_IDENT && strcmp(v->s, a) == 0)
		return 0;
	if (v->kind == V_IDENT && strcmp(v->s, b) == 0)
		return 1;
	const char *const words[] = {a, b};
	const char *guess = v->kind == V_IDENT ? suggest_among(v->s, words, 2) : NULL;
	if (guess) /* True (Python), ture */
		ERR(v->loc, "%s must be %s or %s; did you mean '%s'?", what, a, b, guess);
	else
		ERR(v->loc, "%s must be %s or %s", what, a, b);
	return -1;
}

/* Report the collected errors sorted by position, each message once per
 * position (a repeat body lowers its statements N times). */
void scope_report(Lower *L)
{
	qsort(L->errs, (size_t)L->nerrs, sizeof(Pending), pending_cmp);
	int first_here = 0; /* the first message at this position */
	for (int i = 0; i < L->nerrs; i++) {
		const Pending *e = &L->errs[i];
		if (e->loc.line != L->errs[first_here].loc.line ||
		    e->loc.col != L->errs[first_here].loc.col)
			first_here = i;
		/* a repeat body lowers its statements N times: say each thing once */
		int dup = 0;
		for (int j = i - 64 > first_here ? i - 64 : first_here; j < i && !dup; j++)
			dup = strcmp(L->errs[j].msg, e->msg) == 0;
		if (!dup)
			error_at(L->d, e->loc, "%s", e->msg);
	}
}
