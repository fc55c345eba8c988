/*
 * settings.c - the front end's settings, all from the rows of
 * format/settings.def: the train and eval statements collected (unknown
 * names with "did you mean"), dpc's --set and settings-backed flags merged
 * over them, every value checked against its row (type, range, words, kinds
 * and keyword arguments, bounds by another setting) and stored in its field
 * (ir/settings.c), the requirements and the warnings of settings that have no
 * effect (the WHEN column), and the docs table (`dpc --print-settings`).
 *
 * What is not a row's business stays with the section that owns it:
 * lower.c checks the batch arithmetic, the precision group, the strategy
 * against the mesh and gradient_checkpointing's use; model.c the blocks' own
 * settings.
 *
 * Uses consts.c (const_eval_value), scope.c (errors, value checks), ir/ and the
 * strategies' table (passes/shard.h: which ones gather per block).
 */
#include <stdlib.h>
#include <string.h>

#include "lower.h"
#include "shard.h"
#include "suggest.h"

static const char *section_name(int sec)
{
	return sec == DP_SEC_EVAL ? "eval" : "train";
}

/* The row of section sec (TRAIN, EVAL) named name, or -1. */
static int find_row(int sec, const char *name)
{
	for (int i = 0; i < DP_NSETTINGS; i++)
		if (dp_settings[i].section == sec && strcmp(dp_settings[i].name, name) == 0)
			return i;
	return -1;
}

/* The ARG row of kind `kind` of spec setting spec named name, or -1; any
 * kind when kind < 0. */
static int find_arg(int spec, int kind, const char *name)
{
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->section == DP_SEC_ARG && st->spec == spec && (kind < 0 || st->kind == kind) &&
		    strcmp(st->name, name) == 0)
			return i;
	}
	return -1;
}

/* The first ARG row of kind `kind` of spec setting spec, or -1 (it takes none). */
static int find_any_arg(int spec, int kind)
{
	for (int i = 0; i < DP_NSETTINGS; i++)
		if (dp_settings[i].section == DP_SEC_ARG && dp_settings[i].spec == spec &&
		    dp_settings[i].kind == kind)
			return i;
	return -1;
}

/* "; did you mean 'x'?" when a name of section sec (its statements, or the
 * arguments of spec setting spec when spec >= 0, of kind `kind` or any) is
 * close to word; "" otherwise. */
static const char *did_you_mean(Lower *L, const char *word, int sec, int spec, int kind)
{
	Suggest s;
	suggest_init(&s, word);
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (spec >= 0 ? st->section == DP_SEC_ARG && st->spec == spec &&
					(kind < 0 || st->kind == kind)
			      : st->section == sec)
			suggest_try(&s, st->name);
	}
	const char *best = suggest_best(&s);
	return best ? ir_fmt(L->g, "; did you mean '%s'?", best) : "";
}

/* ---- collecting: the file's statements, then dpc's --set ---- */

void settings_collect(Lower *L, int sec, const Stmt *section)
{
	for (const Stmt *s = section ? section->body : NULL; s; s = s->next) {
		if (sec == DP_SEC_EVAL && s->kind != S_SETTING)
			continue; /* sources: lower_eval's */
		if (s->kind != S_SETTING || !s->val) {
			ERR(s->loc, "expected a setting like '%s' in the %s section",
			    sec == DP_SEC_EVAL ? "every 100" : "steps 100", section_name(sec));
			continue;
		}
		int id = find_row(sec, s->name);
		if (id < 0) {
			int arg = -1; /* `lr 0.1`: an argument written as a setting */
			for (int i = 0; arg < 0 && i < DP_NSETTINGS; i++)
				if (dp_settings[i].section == DP_SEC_ARG &&
				    dp_settings[dp_settings[i].spec].section == sec &&
				    strcmp(dp_settings[i].name, s->name) == 0)
					arg = i;
			if (arg >= 0)
				ERR(s->name_loc, "unknown %s setting '%s' (an argument of the %s: %s "
						 "%s(%s=...))",
				    section_name(sec), s->name, dp_settings[dp_settings[arg].spec].name,
				    dp_settings[dp_settings[arg].spec].name,
				    dp_kind_name(dp_settings[arg].spec, dp_settings[arg].kind), s->name);
			else
				ERR(s->name_loc, "unknown %s setting '%s'%s", section_name(sec), s->name,
				    did_you_mean(L, s->name, sec, -1, -1));
			continue;
		}
		SetVal *v = &L->set[id];
		if (v->given) {
			ERR(s->name_loc, "duplicate %s setting '%s'", section_name(sec), s->name);
			continue;
		}
		v->given = 1;
		v->name_loc = s->name_loc;
		v->bad = const_eval_value(L, s->val, &v->val) != 0;
	}
}

/* The locations of an expression a --set parsed: the flag, not a line. */
static void relocate(Expr *e, Loc at)
{
	for (; e; e = e->next) {
		e->loc = e->key_loc = e->member_loc = at;
		relocate(e->lhs, at);
		relocate(e->rhs, at);
		relocate(e->args, at);
	}
}

/* Parse a --set's VALUE with the DSL's own grammar (as `NAME = VALUE`) into
 * an expression; NULL after reporting. The parse state stays with L (the
 * tree's strings are in it) until the lowering ends. */
static Expr *parse_value(Lower *L, const FeSet *fs, Loc at)
{
	ParseState *ps = ast_alloc(L->ps, sizeof(ParseState));
	Diag *quiet = ast_alloc(L->ps, sizeof(Diag));
	diag_init(quiet, NULL, fs->what, NULL); /* counts, prints nothing */
	*ps = (ParseState){.d = quiet, .file = fs->what};
	L->setps = scope_grow(L, L->setps, &L->capsetps, L->nsetps + 1, sizeof(ParseState *));
	L->setps[L->nsetps++] = ps;
	size_t n = strlen(fs->value);
	char *text = ast_alloc(L->ps, n + 3);
	memcpy(text, "v=", 2);
	memcpy(text + 2, fs->value, n);
	if (ast_parse(ps, text, n + 2) || !ps->top || ps->top->next || ps->top->kind != S_ASSIGN) {
		ERR(at, "expected a value: a number, a word, or a spec like adamw(lr=1e-3)");
		return NULL;
	}
	relocate(ps->top->expr, at);
	return ps->top->expr;
}

/* `--set SECTION.NAME=VALUE`, `--set train.SPEC.ARG=VALUE` (an argument of
 * the optimizer or the schedule; `train.ARG` when only one spec has it), or
 * a settings-backed flag: the value replaces the file's, or the argument is
 * added to (replaces one of) the spec's call. */
static void apply_set(Lower *L, const FeSet *fs)
{
	Loc at = {fs->what, 0, 0};
	char key[256];
	snprintf(key, sizeof key, "%s", fs->key);
	char *part[4] = {key};
	int np = 1;
	for (char *p = key; *p && np < 4; p++)
		if (*p == '.') {
			*p = '\0';
			part[np++] = p + 1;
		}
	int sec = strcmp(part[0], "train") == 0 ? DP_SEC_TRAIN : strcmp(part[0], "eval") == 0 ? DP_SEC_EVAL : -1;
	if (strcmp(part[0], "mesh") == 0) {
		ERR(at, "the mesh is the file's mesh statement, or --world-size with --tp, --cp and "
			"--dp-replicate for `mesh auto`");
		return;
	}
	if (sec < 0 || np < 2 || np > 3) {
		const char *near = suggest_among(part[0], (const char *const[]){"train", "eval"}, 2);
		ERR(at, "%s: a setting is SECTION.NAME (train.lr, eval.every) or train.SPEC.ARG "
			"(train.optimizer.beta2)%s%s%s",
		    sec < 0 ? ir_fmt(L->g, "unknown section '%s'", part[0]) : "expected SECTION.NAME",
		    near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
		return;
	}
	if (sec == DP_SEC_EVAL && !L->eval) {
		ERR(at, "this model has no eval section");
		return;
	}
	int id = np == 2 ? find_row(sec, part[1]) : -1, spec = -1;
	const char *arg = NULL;
	if (np == 3) {
		spec = find_row(sec, part[1]);
		if (spec < 0 || dp_settings[spec].type != DP_ST_SPEC) {
			ERR(at, "'%s' is not a setting with arguments (the optimizer, the schedule)%s",
			    part[1], did_you_mean(L, part[1], sec, -1, -1));
			return;
		}
		arg = part[2];
		if (find_arg(spec, -1, arg) < 0) {
			ERR(at, "unknown argument '%s' of %s%s", arg, part[1],
			    did_you_mean(L, arg, sec, spec, -1));
			return;
		}
	} else if (id < 0) { /* train.lr: the one spec that has an argument lr */
		for (int i = 0; i < DP_NSETTINGS; i++) {
			const DpSetting *st = &dp_settings[i];
			if (st->section != DP_SEC_ARG || strcmp(st->name, part[1]) != 0 ||
			    dp_settings[st->spec].section != sec || st->spec == spec)
				continue;
			if (spec >= 0) {
				ERR(at, "'%s' is an argument of %s and of %s: write %s.SPEC.%s", part[1],
				    dp_settings[spec].name, dp_settings[st->spec].name, part[0], part[1]);
				return;
			}
			spec = st->spec;
		}
		if (spec < 0) {
			ERR(at, "unknown %s setting '%s'%s", section_name(sec), part[1],
			    did_you_mean(L, part[1], sec, -1, -1));
			return;
		}
		arg = part[1];
	}
	Expr *e = parse_value(L, fs, at);
	AstVal val;
	if (!e || const_eval_value(L, e, &val))
		return;
	if (!arg) {
		SetVal *v = &L->set[id];
		*v = (SetVal){.val = val, .name_loc = at, .given = 1};
		return;
	}
	/* an argument of the spec's call: the file's (or an earlier --set's), or
	 * the default kind's */
	SetVal *v = &L->set[spec];
	if (!v->given || v->bad) {
		*v = (SetVal){.name_loc = at, .given = 1};
		v->val = (AstVal){.kind = V_IDENT, .s = dp_kind_name(spec, (int)dp_settings[spec].dflt),
				  .loc = at};
	}
	if (v->val.kind != V_IDENT && v->val.kind != V_CALL)
		return; /* not a spec: its check reports it */
	AstVal call = v->val;
	call.kind = V_CALL;
	call.args = NULL;
	call.nargs = 0;
	Arg **tail = &call.args;
	for (const Arg *a = v->val.kind == V_CALL ? v->val.args : NULL; a; a = a->next) {
		if (a->key && strcmp(a->key, arg) == 0)
			continue;
		Arg *c = ast_alloc(L->ps, sizeof(Arg));
		*c = *a;
		c->next = NULL;
		*tail = c;
		tail = &c->next;
		call.nargs++;
	}
	Arg *na = ast_alloc(L->ps, sizeof(Arg));
	*na = (Arg){.key = ir_strdup(L->g, arg), .key_loc = at, .val = val};
	*tail = na;
	call.nargs++;
	v->val = call;
}

void settings_apply_sets(Lower *L)
{
	const FeOptions *o = L->opts;
	for (int i = 0; o && i < o->nsets; i++)
		apply_set(L, &o->sets[i]);
}

/* ---- checking and storing ---- */

const AstVal *settings_val(Lower *L, int id)
{
	return L->set[id].given && !L->set[id].bad ? &L->set[id].val : NULL;
}

/* The checked value of setting id (its default when not given). */
double settings_num(Lower *L, int id)
{
	const SetVal *v = &L->set[id];
	if (v->given && v->ok)
		return v->num;
	const DpSetting *st = &dp_settings[id];
	return st->dflt_set >= 0 ? ir_setting_get(L->g, st->dflt_set) : st->dflt;
}

/* "a or b", "a, b or c" (last: " or "), or "a, b, c" (last: ", ") */
static const char *word_list(Lower *L, const char *const *w, int n, const char *last)
{
	char buf[256] = "";
	size_t len = 0;
	for (int i = 0; i < n && len < sizeof buf; i++)
		len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s",
					i == 0 ? "" : i == n - 1 ? last : ", ", w[i]);
	return ir_strdup(L->g, buf);
}

/* Check v against row id; its number (an index for words) in *out. 0, or -1
 * after reporting at the value. */
static int check_value(Lower *L, int id, const AstVal *v, double *out)
{
	const DpSetting *st = &dp_settings[id];
	char range[160];
	switch (st->type) {
	case DP_ST_INT: {
		int64_t lo = (int64_t)st->lo + (st->lo_bound == DP_B_GT);
		int64_t hi = st->hi_bound == DP_B_LE || st->hi_bound == DP_B_LT
				     ? (st->hi >= 9.2e18 ? INT64_MAX : (int64_t)st->hi) - (st->hi_bound == DP_B_LT)
				     : INT32_MAX;
		int64_t x;
		if (scope_want_int(L, v, st->name, lo, hi, &x))
			return -1;
		*out = (double)x;
		L->set[id].i = x;
		return 0;
	}
	case DP_ST_FLOAT: {
		float f;
		if (scope_want_float(L, v, st->name, &f))
			return -1;
		int bad = st->lo_bound == DP_B_GT ? !(f > st->lo) : !(f >= st->lo);
		bad |= st->hi_bound == DP_B_LE ? !(f <= st->hi) : st->hi_bound == DP_B_LT && !(f < st->hi);
		if (bad) {
			ERR(v->loc, "%s must be %s", st->name, dp_setting_range(id, range, sizeof range));
			return -1;
		}
		*out = f;
		return 0;
	}
	case DP_ST_BOOL: {
		int w = scope_want_word(L, v, st->name, "true", "false");
		*out = w == 0;
		return w < 0 ? -1 : 0;
	}
	case DP_ST_DTYPE: {
		int dt = scope_dtype_word(L, v, st->name);
		*out = dt;
		return dt < 0 ? -1 : 0;
	}
	case DP_ST_STRATEGY: {
		if (id == DP_SET_STRATEGY && v->kind == V_IDENT && strcmp(v->s, "auto") == 0) {
			*out = DP_STRAT_DDP; /* lower_strategy: dpc plans (g->strategy_auto) */
			return 0;
		}
		int s = scope_strategy_word(L, v);
		*out = s;
		return s < 0 ? -1 : 0;
	}
	case DP_ST_WORDS: {
		int n = dp_setting_nvalues(id);
		const char *w = v->kind == V_IDENT ? v->s : "";
		if (strcmp(w, "fp32") == 0)
			w = "f32"; /* the spelling fp32 is f32 wherever f32 is */
		if (id == DP_SET_PIPELINE && strcmp(w, "pipedream_flush") == 0)
			w = "1f1b"; /* its paper's name (Narayanan et al. 2021), as before 1f1b lexed */
		for (int k = 0; k < n; k++)
			if (strcmp(st->words[k], w) == 0) {
				*out = k;
				return 0;
			}
		const char *near = *w ? suggest_among(w, st->words, n) : NULL;
		ERR(v->loc, "%s must be %s%s%s%s", st->name, word_list(L, st->words, n, " or "),
		    near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
		return -1;
	}
	default:
		return -1;
	}
}

/* Store row id's value (checked) into its field, and remember it. */
static void store(Lower *L, int id, const AstVal *v)
{
	SetVal *sv = &L->set[id];
	double x;
	if (check_value(L, id, v, &x))
		return;
	sv->ok = 1;
	sv->num = x;
	void *f = ir_setting_field(L->g, id);
	if (!f)
		return;
	if (dp_settings[id].type == DP_ST_INT)
		dp_field_seti(f, dp_settings[id].ctype, sv->i);
	else
		dp_field_set(f, dp_settings[id].ctype, x);
}

/* A spec setting (`optimizer adamw(lr=1e-3)`): its kind, then its keyword
 * arguments, each against its ARG row. */
static void store_spec(Lower *L, int spec)
{
	const DpSetting *st = &dp_settings[spec];
	const AstVal *v = settings_val(L, spec);
	int kind = (int)st->dflt;
	if (v) {
		int n = dp_kind_count(spec);
		const char *names[16];
		for (int k = 0; k < n && k < 16; k++)
			names[k] = dp_kind_name(spec, k);
		if (v->kind != V_IDENT && v->kind != V_CALL) {
			char forms[256] = "";
			size_t len = 0;
			for (int k = 0; k < n && k < 16 && len < sizeof forms; k++) {
				int args = 0;
				for (int i = 0; i < DP_NSETTINGS; i++)
					args |= dp_settings[i].section == DP_SEC_ARG &&
						dp_settings[i].spec == spec && dp_settings[i].kind == k;
				len += (size_t)snprintf(forms + len, sizeof forms - len, "%s%s%s",
							k == 0 ? "" : k == n - 1 ? " or " : ", ",
							names[k], args ? "(...)" : "");
			}
			ERR(v->loc, "expected %s %s: %s", strchr("aeiou", st->name[0]) ? "an" : "a",
			    st->name, forms);
			return;
		}
		kind = dp_kind_find(spec, v->s);
		if (kind < 0) {
			const char *near = suggest_among(v->s, names, n < 16 ? n : 16);
			ERR(v->loc, "unknown %s '%s' (%ss: %s)%s%s%s", st->name, v->s, st->name,
			    word_list(L, names, n < 16 ? n : 16, ", "), near ? "; did you mean '" : "",
			    near ? near : "", near ? "'?" : "");
			return;
		}
		L->set[spec].ok = 1;
		L->set[spec].num = kind;
	}
	ir_settings_kind(L->g, spec, kind);
	if (!v || v->kind != V_CALL)
		return;
	if (v->nargs > 0 && find_any_arg(spec, kind) < 0) {
		ERR(v->loc, "%s '%s' takes no arguments", st->name, v->s);
		return;
	}
	for (const Arg *a = v->args; a; a = a->next) {
		if (!a->key) {
			int first = find_any_arg(spec, kind);
			ERR(a->val.loc, "arguments of '%s' must be named, like %s=...", v->s,
			    dp_settings[first].name);
			continue;
		}
		int id = find_arg(spec, kind, a->key);
		if (id < 0) {
			/* the kinds that take it: "(it is sgd's)", "(cosine, linear and wsd take it)" */
			const char *takers[16];
			int nt = 0;
			for (int i = 0; i < DP_NSETTINGS && nt < 16; i++)
				if (dp_settings[i].section == DP_SEC_ARG && dp_settings[i].spec == spec &&
				    strcmp(dp_settings[i].name, a->key) == 0)
					takers[nt++] = dp_kind_name(spec, dp_settings[i].kind);
			if (nt == 1)
				ERR(a->key_loc, "unknown argument '%s' for '%s' (it is %s's)", a->key, v->s,
				    takers[0]);
			else if (nt > 1)
				ERR(a->key_loc, "unknown argument '%s' for '%s' (%s take it)", a->key, v->s,
				    word_list(L, takers, nt, " and "));
			else
				ERR(a->key_loc, "unknown argument '%s' for '%s'%s", a->key, v->s,
				    did_you_mean(L, a->key, 0, spec, kind));
			continue;
		}
		SetVal *sv = &L->set[id];
		if (sv->given) {
			ERR(a->key_loc, "duplicate argument '%s'", a->key);
			continue;
		}
		*sv = (SetVal){.val = a->val, .name_loc = a->key_loc, .given = 1};
		store(L, id, &a->val);
	}
}

void settings_store(Lower *L, int sec)
{
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->section != sec)
			continue;
		if (st->type == DP_ST_SPEC)
			store_spec(L, i);
		else if (settings_val(L, i))
			store(L, i, settings_val(L, i));
	}
}

/* ---- when a setting has an effect (the WHEN column) ---- */

/* Does some parameter's block follow a strategy that gathers per block
 * (full_shard, hybrid_shard: gathered == 1) or one that buckets (0)? */
static int some_block(Lower *L, int gathered)
{
	const Graph *g = L->g;
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->kind == DP_T_PARAM &&
		    shard_strategies[ir_block_strategy(g, g->values[i]->block)].gathered == gathered)
			return 1;
	return 0;
}

static const char *applies_gathered(Lower *L)
{
	if (some_block(L, 1))
		return NULL;
	return ir_fmt(L->g, "no block is full_shard or hybrid_shard (the strategy is %s)",
		      dp_name(dp_strategy_names, DP_NSTRAT, L->g->cfg.strategy));
}

static const char *applies_bucketed(Lower *L)
{
	return some_block(L, 0) ? NULL
				: "every block is full_shard or hybrid_shard: their gradients are "
				  "reduced block by block, not in buckets";
}

/* train's reshard_after_forward: some gathered block without its own */
static const char *applies_reshard(Lower *L)
{
	const Graph *g = L->g;
	const char *why = applies_gathered(L);
	for (int i = 0; why == NULL && i < g->nvalues; i++) {
		const Value *p = g->values[i];
		if (p->kind == DP_T_PARAM && shard_strategies[ir_block_strategy(g, p->block)].gathered &&
		    (p->block < 0 || g->blocks[p->block].reshard < 0))
			return NULL;
	}
	return why ? why
		   : "every full_shard or hybrid_shard block sets its own reshard_after_forward";
}

static const char *applies_accum(Lower *L)
{
	const char *why = applies_gathered(L);
	return why ? why : L->g->cfg.grad_accum > 1 ? NULL : "grad_accum is 1";
}

/* Is there a block inside a repeat among these statements? */
static int repeat_block(const Stmt *s, int in_repeat)
{
	for (; s; s = s->next)
		if ((s->kind == S_BLOCK && in_repeat) ||
		    ((s->kind == S_REPEAT || s->kind == S_BLOCK) &&
		     repeat_block(s->body, in_repeat || s->kind == S_REPEAT)))
			return 1;
	return 0;
}

static const char *applies_repeat(Lower *L)
{
	return L->model && repeat_block(L->model->body, 0) ? NULL
							    : "this model has no repeat block";
}

static const char *applies_buffers(Lower *L)
{
	for (int i = 0; i < L->g->nvalues; i++)
		if (L->g->values[i]->kind == DP_T_BUFFER)
			return NULL;
	return "this model has no buffer";
}

static const char *applies_pipelined(Lower *L)
{
	return L->g->cfg.mesh[DP_AXIS_PP] > 1 ? NULL : "the mesh has no pp axis (pp=1)";
}

static const char *applies_interleaved(Lower *L)
{
	if (L->g->cfg.mesh[DP_AXIS_PP] <= 1)
		return "the mesh has no pp axis (pp=1)";
	return L->g->pipeline == IR_PIPE_INTERLEAVED ? NULL : "the pipeline is not interleaved";
}

static const char *applies_language_model(Lower *L)
{
	const char *why = ir_language_model(L->g, NULL);
	return why ? ir_fmt(L->g, "this model is not a language model: %s", why) : NULL;
}

static const char *applies_momentum(Lower *L)
{
	return L->g->opt.momentum > 0 ? NULL : "momentum is 0";
}

#define DP_PRED_ALWAYS NULL
#define DP_PRED_APPLIES(pred, doc) applies_##pred
#define DP_PRED_REQUIRES(pred, doc) applies_##pred
/* Each row's predicate: NULL when it holds, else why not. ORDER SET */
static const char *(*const applies[DP_NSETTINGS])(Lower *L) = {
#define SET(id, where, name, type, field, dflt, lo, hi, zero, ir, flag, when, help)    \
	[DP_SET_##id] = DP_PRED_##when,
#define KIND(...)
#include "settings.def"
#undef SET
#undef KIND
};

/* A given value as the user wrote it: true, 25, adamw(...). */
static const char *value_text(Lower *L, const AstVal *v)
{
	switch (v->kind) {
	case V_INT:
		return ir_fmt(L->g, "%lld", (long long)v->i);
	case V_FLOAT:
		return ir_fmt(L->g, "%g", v->f);
	case V_CALL:
		return ir_fmt(L->g, "%s(...)", v->s);
	default:
		return v->s ? v->s : "";
	}
}

static int by_loc(const void *a, const void *b)
{
	const SetVal *x = *(const SetVal *const *)a, *y = *(const SetVal *const *)b;
	if (x->name_loc.line != y->name_loc.line)
		return x->name_loc.line < y->name_loc.line ? -1 : 1;
	if (x->name_loc.col != y->name_loc.col)
		return x->name_loc.col < y->name_loc.col ? -1 : 1;
	return (x > y) - (x < y); /* flags (line 0): in the table's order */
}

void settings_warn(Lower *L)
{
	SetVal *w[DP_NSETTINGS];
	int n = 0;
	for (int i = 0; i < DP_NSETTINGS; i++) {
		SetVal *v = &L->set[i];
		if (!v->given || !v->ok || dp_settings[i].when != DP_WHEN_APPLIES)
			continue;
		/* the planner's own choices (compiler/plan.c: --plan, strategy
		 * auto) are not the user's to be told of: it sets every knob it
		 * searches, gradient_checkpointing false on a model without a
		 * repeat block too */
		if (v->name_loc.line == 0 && v->name_loc.file &&
		    (!strcmp(v->name_loc.file, "--plan") || !strcmp(v->name_loc.file, "strategy auto")))
			continue;
		const char *why = applies[i](L);
		if (!why)
			continue;
		v->why = ir_fmt(L->g, "%s %s has no effect: %s", dp_settings[i].name,
				value_text(L, &v->val), why);
		w[n++] = v;
	}
	qsort(w, (size_t)n, sizeof w[0], by_loc);
	for (int i = 0; i < n; i++)
		warning_at(L->d, w[i]->name_loc, "%s", w[i]->why);
}

/* The bounds by another setting (LESET: warmup <= the schedule's steps,
 * the cosine's floor <= lr) and the requirements (nesterov needs momentum), once every value of
 * the section is in. */
void settings_check_bounds(Lower *L)
{
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const SetVal *v = &L->set[i];
		const char *why;
		if (dp_settings[i].when == DP_WHEN_REQUIRES && v->given && v->ok && v->num != 0 &&
		    (why = applies[i](L)))
			ERR(v->val.loc, "%s %s needs %s: %s", dp_settings[i].name,
			    value_text(L, &v->val), dp_settings[i].when_doc, why);
	}
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		const SetVal *v = &L->set[i];
		if (st->hi_bound != DP_B_LESET || !v->given || !v->ok)
			continue;
		int other = dp_setting_owner((int)st->hi), ospec = dp_settings[other].spec;
		if (dp_settings[other].section == DP_SEC_ARG && L->set[ospec].given && !L->set[ospec].ok)
			continue; /* its spec is wrong (reported): its value is not the user's */
		double mine = ir_setting_get(L->g, i), lim = ir_setting_get(L->g, other);
		if (mine > lim) {
			char a[64], b[64];
			ERR(v->val.loc, "%s (%s) must not exceed %s (%s)", st->name,
			    dp_setting_format(i, mine, a, sizeof a), dp_settings[other].name,
			    dp_setting_format(other, lim, b, sizeof b));
		}
	}
}

/* ---- the docs table (dpc --print-settings; docs/DSL.md) ---- */

/* The value form of a row: N, X, true|false, f32|bf16, NAME, KIND(...). */
static void put_form(FILE *out, int id)
{
	static const char *const form[] = {
		[DP_ST_INT] = "N",
		[DP_ST_FLOAT] = "X",
		[DP_ST_BOOL] = "true\\|false",
		[DP_ST_WORDS] = "", /* its words */
		[DP_ST_DTYPE] = "f32\\|bf16\\|f16",
		[DP_ST_STRATEGY] = "NAME",
		[DP_ST_SPEC] = "KIND(...)",
		[DP_ST_AXES] = "",
	}; /* ORDER DpSetType */
	const DpSetting *st = &dp_settings[id];
	fputs(form[st->type], out);
	for (int k = 0; st->type == DP_ST_WORDS && st->words[k]; k++)
		fprintf(out, "%s%s", k ? "\\|" : "", st->words[k]);
}

static void put_default(FILE *out, int id)
{
	const DpSetting *st = &dp_settings[id];
	char buf[64];
	if (st->dflt_set >= 0)
		fprintf(out, "%s's `%s`", section_name(dp_settings[st->dflt_set].section),
			dp_settings[st->dflt_set].name);
	else if (st->dflt == 0 && st->zero && st->lo > 0)
		fprintf(out, "%s", st->zero); /* 0 is no value of its range: it means this */
	else if (st->dflt == 0 && st->zero)
		fprintf(out, "0 (%s)", st->zero);
	else if (st->dflt < st->lo && (st->type == DP_ST_INT || st->type == DP_ST_FLOAT))
		fputs("none", out);
	else if (st->type == DP_ST_INT || st->type == DP_ST_FLOAT)
		fprintf(out, "%s", dp_setting_format(id, st->dflt, buf, sizeof buf));
	else
		fprintf(out, "`%s`", dp_setting_format(id, st->dflt, buf, sizeof buf));
}

static void put_valid(FILE *out, int id)
{
	const DpSetting *st = &dp_settings[id];
	char buf[160];
	int n = dp_setting_nvalues(id);
	if (st->type == DP_ST_INT || st->type == DP_ST_FLOAT) {
		fputs(dp_setting_range(id, buf, sizeof buf), out);
		return;
	}
	for (int k = 0; k < n; k++) {
		if (st->type == DP_ST_DTYPE && k == DP_I32)
			continue;
		int v = st->type == DP_ST_BOOL ? 1 - k : k; /* true, false */
		fprintf(out, "%s`%s`", k ? ", " : "", dp_setting_format(id, v, buf, sizeof buf));
	}
}

static void put_row(FILE *out, int id, const char *setting)
{
	const DpSetting *st = &dp_settings[id];
	fprintf(out, "| %s | `%s", section_name(st->section == DP_SEC_ARG
						       ? dp_settings[st->spec].section
						       : st->section), setting);
	put_form(out, id);
	fputs(st->section == DP_SEC_ARG ? ")` | " : "` | ", out);
	put_default(out, id);
	fputs(" | ", out);
	put_valid(out, id);
	fprintf(out, " | %s%s | ", st->when == DP_WHEN_REQUIRES ? "needs " : "",
		st->when_doc ? st->when_doc : "");
	if (st->flag)
		fprintf(out, "`%s --%s`", st->flag_prog == DP_FLAG_DPC ? "dpc" : "dpexec", st->flag);
	fprintf(out, " | %s |\n", st->help);
}

void settings_print(FILE *out)
{
	fputs("| section | setting | default | valid | has an effect for | flag | meaning |\n"
	      "|---|---|---|---|---|---|---|\n",
	      out);
	for (int sec = DP_SEC_TRAIN; sec <= DP_SEC_EVAL; sec++)
		for (int i = 0; i < DP_NSETTINGS; i++) {
			const DpSetting *st = &dp_settings[i];
			if (st->section != sec)
				continue;
			char form[160];
			snprintf(form, sizeof form, "%s ", st->name);
			put_row(out, i, form);
			for (int k = 0; st->type == DP_ST_SPEC && k < dp_nkinds; k++) {
				const DpKind *kd = &dp_kinds[k];
				if (kd->spec != i)
					continue;
				fprintf(out, "| %s | `%s %s%s` | | | | | %s |\n", section_name(sec), st->name,
					kd->name, find_any_arg(i, kd->kind) >= 0 ? "(...)" : "", kd->help);
				for (int a = 0; a < DP_NSETTINGS; a++) {
					if (dp_settings[a].section != DP_SEC_ARG || dp_settings[a].spec != i ||
					    dp_settings[a].kind != kd->kind)
						continue;
					snprintf(form, sizeof form, "%s %s(%s=", st->name, kd->name,
						 dp_settings[a].name);
					put_row(out, a, form);
				}
			}
		}
}
