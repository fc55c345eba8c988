/*
 * model.c - the model section: blocks, params and buffers, repeat, op calls
 * and the loss.
 *
 * Before: config, mesh, train and data are lowered (data names are symbols).
 *
 * After (when no error was reported), the Graph holds:
 *   - one Block per block instance, in program order: `block fc1` is fc1,
 *     `block h[i]` inside `repeat N as i` is h.0 ... h.<N-1>; with the
 *     block's own `strategy`, `reshard_after_forward`, `weight_decay` and
 *     `lr_scale` when it sets them;
 *   - per param a DP_T_PARAM value "block.param" (h.0.wqkv) with its
 *     initialiser, dims global, and place[DP_AXIS_TP] = shard(dim) when it
 *     is annotated split(tp, col|row); per buffer a DP_T_BUFFER value likewise
 *     (no gradient, never communicated);
 *   - per op call a DP_T_ACT value (dtype f32, ndim 0: shapes are the shape
 *     pass's job) and a PH_FWD node in step and eval, with the op's keyword
 *     arguments in its attributes; nested calls produce temporaries t, t1, ...;
 *     a call with a number operand (mul(x, 0.5), add(x, 1), scale(x, c)) is
 *     the op whose ASCALAR attribute (format/ops.def) serves it, the number
 *     in that attribute;
 *   - the cross_entropy assignment: an XENT node (step only, scale = 1/global
 *     batch), the metric loss.sum and its ACCUM node, and with an eval section
 *     the eval.loss (XENT, scale = 1) and eval.correct (CORRECT) metrics.
 *
 * Two walks over the tree, in program order, unroll repeat the same way: the
 * first declares blocks, params, buffers and the names the model assigns
 * (so `block.param` may be used anywhere, and a use before any assignment
 * is told apart from an unknown name); the second lowers the assignments.
 * Both are linear in the unrolled size: every lookup is a hash map.
 *
 * Names. A use sees the latest binding before it in program order. The
 * first binding of a name keeps it as the value's name; a later one made in
 * a block is named <block>.<name> (h.3.x), else (or if that is taken) the
 * next free <name>N.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"
#include "suggest.h"

#define MAX_REPEAT (1 << 16)        /* count of one repeat */
#define MAX_UNROLLED ((int64_t)1 << 20) /* statements instantiated by repeat in all */

/* ---- lookups ---- */

static int find_block(Lower *L, const char *name)
{
	int *b = scope_map_get(&L->blocks, name);
	return b ? *b : -1;
}

/* The param or buffer block.name; NULL if there is none. *poisoned is set
 * when its declaration failed (an error was reported for it already). */
static Value *find_param(Lower *L, int block, const char *name, int *poisoned)
{
	char buf[2 * AST_MAX_IDENT + 64];
	snprintf(buf, sizeof buf, "%s.%s", L->g->blocks[block].name, name);
	int *id = scope_map_get(&L->values, buf);
	if (poisoned)
		*poisoned = id && *id < 0;
	if (!id || *id < 0)
		return NULL;
	Value *v = L->g->values[*id];
	return v->kind == DP_T_PARAM || v->kind == DP_T_BUFFER ? v : NULL;
}

/* "param" or "buffer", for messages. */
static const char *member_kind(const Value *v)
{
	return v->kind == DP_T_BUFFER ? "buffer" : "param";
}

/* A temporary's name: t, t1, ... never a name the user assigns. */
static const char *fresh_temp(Lower *L)
{
	for (;; L->next_temp++) {
		char buf[32];
		if (L->next_temp == 0)
			snprintf(buf, sizeof buf, "t");
		else
			snprintf(buf, sizeof buf, "t%d", L->next_temp);
		if (!scope_map_get(&L->values, buf) && !scope_map_get(&L->targets, buf))
			return ir_strdup(L->g, buf);
	}
}

/* ---- repeat ---- */

/* The count of `repeat N as i`, after checking the variable; -1 after an
 * error (quiet: the second walk evaluates again what the first reported). */
static int64_t repeat_count(Lower *L, const Stmt *s, int quiet)
{
	int nerrs = L->nerrs;
	Num n;
	int64_t count = -1;
	if (L->nrep == MAX_REPEAT_NEST) {
		ERR(s->loc, "repeat is nested too deeply (at most %d levels)", MAX_REPEAT_NEST);
	} else if (const_is_constant(L, s->name)) {
		ERR(s->name_loc, "repeat variable '%s' is already a %s", s->name,
		    scope_map_get(&L->constmap, s->name) ? "config constant" : "repeat variable");
	} else if (const_eval_num(L, s->expr, "the repeat count", &n) == 0) {
		if (n.is_float)
			ERR(s->expr->loc, "the repeat count must be a positive integer, got the float %g",
			    n.f);
		else if (n.i < 1)
			ERR(s->expr->loc, "the repeat count must be a positive integer, got %lld",
			    (long long)n.i);
		else if (n.i > MAX_REPEAT)
			ERR(s->expr->loc, "the repeat count is too large (at most %d)", MAX_REPEAT);
		else
			count = n.i;
	}
	if (quiet)
		L->nerrs = nerrs; /* drop the messages: the first walk has them */
	return count;
}

/* ---- declarations: blocks, params, buffers ---- */

/* split(tp, col|row) after a param: the tp placement of v (global dims). */
static int lower_split(Lower *L, const Expr *a, const char *name, Value *v)
{
	const Expr *axis = a->args, *dir = axis ? axis->next : NULL;
	if (a->kind != E_CALL || strcmp(a->name, "split") != 0) {
		ERR(a->loc, "unexpected '%s' after param '%s' (only split(tp, col|row) may follow)",
		    a->kind == E_CALL || a->kind == E_NAME ? a->name : "?", name);
		return -1;
	}
	if (a->nargs != 2 || axis->key || dir->key || axis->kind != E_NAME || dir->kind != E_NAME) {
		ERR(a->loc, "split takes a mesh axis and a direction, like split(tp, col)");
		return -1;
	}
	if (strcmp(axis->name, "tp") != 0) {
		int known = 0;
		for (int ax = 0; ax < DP_MAX_AXES; ax++)
			known |= strcmp(ir_axis_names[ax], axis->name) == 0;
		if (known)
			ERR(axis->loc, "only the tp axis can split a param (the strategy decides how "
				       "'%s' shards it)",
			    axis->name);
		else
			ERR(axis->loc, "unknown mesh axis '%s' in split (only tp)", axis->name);
		return -1;
	}
	int row = strcmp(dir->name, "row") == 0;
	if (!row && strcmp(dir->name, "col") != 0) {
		ERR(dir->loc, "split direction must be col or row, not '%s'", dir->name);
		return -1;
	}
	if (row && v->ndim != 2) {
		ERR(dir->loc, "split(tp, row) needs a 2-D param, but '%s' has %d dimension%s", name,
		    v->ndim, v->ndim == 1 ? "" : "s");
		return -1;
	}
	/* col: the output features (the last dim); row: the input features */
	v->place[DP_AXIS_TP] = (Place){DP_PL_SHARD, (int8_t)(row ? 0 : v->ndim - 1)};
	return 0;
}

/* The initialiser spec of a param or buffer into init, a, b. */
static int lower_init(Lower *L, const Stmt *p, int is_buffer, const int64_t *dims, int nd,
		      DpInit *init, float *a, float *b)
{
	AstVal val;
	const AstVal *v = &val;
	if (const_eval_value(L, p->val, &val))
		return -1;
	if (v->kind != V_IDENT && v->kind != V_CALL) {
		ERR(v->loc, "expected an initialiser: normal(mean, std), uniform(low, high), "
			    "zeros or ones");
		return -1;
	}
	int two = strcmp(v->s, "normal") == 0 || strcmp(v->s, "uniform") == 0;
	int rope = strcmp(v->s, "rope_cos") == 0 || strcmp(v->s, "rope_sin") == 0;
	if (strcmp(v->s, "zeros") == 0 || strcmp(v->s, "ones") == 0) {
		if (v->nargs) {
			ERR(v->loc, "'%s' takes no arguments", v->s);
			return -1;
		}
		*init = v->s[0] == 'z' ? DP_INIT_ZEROS : DP_INIT_ONES;
	} else if (two) {
		int normal = v->s[0] == 'n';
		if (v->nargs != 2 || v->args->key || v->args->next->key) {
			ERR(v->loc, "'%s' takes two numbers: %s", v->s,
			    normal ? "normal(mean, std)" : "uniform(low, high)");
			return -1;
		}
		if (scope_want_float(L, &v->args->val, normal ? "mean" : "low", a) ||
		    scope_want_float(L, &v->args->next->val, normal ? "std" : "high", b))
			return -1;
		if (normal && *b < 0) {
			ERR(v->args->next->val.loc, "std must be >= 0");
			return -1;
		}
		if (!normal && *b < *a) {
			ERR(v->args->next->val.loc, "uniform's high must be >= low");
			return -1;
		}
		*init = normal ? DP_INIT_NORMAL : DP_INIT_UNIFORM;
	} else if (rope) {
		if (!is_buffer) {
			ERR(v->loc, "%s is for buffers only (a rotary table is not trained): "
				    "declare '%s' as a buffer",
			    v->s, p->name);
			return -1;
		}
		static const char *const keys[] = {"theta"};
		const Arg *th;
		float theta = 10000.0f;
		if (scope_kwargs(L, v, keys, 1, &th) || (th && scope_want_float(L, &th->val, "theta", &theta)))
			return -1;
		if (!(theta > 0)) {
			ERR(th->val.loc, "theta must be > 0");
			return -1;
		}
		*init = v->s[5] == 'c' ? DP_INIT_ROPE_COS : DP_INIT_ROPE_SIN;
		*a = theta;
		*b = (float)dims[nd - 1]; /* half the head dim: the table's last dim */
	} else {
		ERR(v->loc, "unknown initialiser '%s' (normal, uniform, zeros, ones, rope_cos, "
			    "rope_sin)",
		    v->s);
		return -1;
	}
	return 0;
}

/* A param (S_PARAM) or a buffer (S_BUFFER) of a block: same types and
 * initialisers; a buffer is not trained and never communicated. */
static void declare_param(Lower *L, const Stmt *p, int block)
{
	Graph *g = L->g;
	int is_buffer = p->kind == S_BUFFER;
	const char *what = is_buffer ? "buffer" : "param";
	const Value *old = find_param(L, block, p->name, NULL);
	if (old) {
		if ((old->kind == DP_T_BUFFER) == is_buffer)
			ERR(p->name_loc, "duplicate %s '%s' in block '%s'", what, p->name,
			    g->blocks[block].name);
		else
			ERR(p->name_loc, "duplicate name '%s' in block '%s': it is already a %s",
			    p->name, g->blocks[block].name, member_kind(old));
		return;
	}
	DpDtype dt;
	int nd = 0;
	int64_t dims[DP_MAX_DIMS] = {0};
	/* a param whose declaration fails is poisoned: uses of it stay quiet */
	const char *name = ir_fmt(g, "%s.%s", g->blocks[block].name, p->name);
	const Expr *an = p->annot;
	if (is_buffer && an && (an->kind != E_NAME || strcmp(an->name, "nosync") != 0)) {
		if (an->kind == E_CALL && strcmp(an->name, "split") == 0)
			ERR(an->loc, "a buffer cannot be split (only params are)");
		else
			ERR(an->loc, "unexpected '%s' after buffer '%s' (only 'nosync' may follow)",
			    an->name, p->name);
		goto poison;
	}
	if (const_lower_type(L, &p->type, what, p->name, 0, &dt, &nd, dims))
		goto poison;
	DpInit init = DP_INIT_ZEROS;
	float a = 0, b = 0;
	if (p->val && lower_init(L, p, is_buffer, dims, nd, &init, &a, &b))
		goto poison;
	Value *v = scope_value(L, name, dt, nd, dims, is_buffer ? DP_T_BUFFER : DP_T_PARAM,
			       scope_gloc(L, p->name_loc));
	v->init = init;
	v->init_a = a;
	v->init_b = b;
	v->block = block;
	if (!is_buffer && an && lower_split(L, an, p->name, v))
		scope_map_put(L, &L->values, v->name, -1); /* quiet from now on, like a failed one */
	return;
poison:
	scope_map_put(L, &L->values, name, -1);
}

static void record_instance(Lower *L, int block)
{
	L->inst_block = scope_grow(L, L->inst_block, &L->capinst, L->ninst + 1, sizeof(int));
	L->inst_block[L->ninst++] = block;
}

/* Count unrolled statements; 0 once the limit is passed (reported once). */
static int count_unrolled(Lower *L, const Stmt *s)
{
	if (L->unrolled > MAX_UNROLLED)
		return 0;
	if (++L->unrolled > MAX_UNROLLED) {
		ERR(s->loc, "the model unrolls to more than %lld statements", (long long)MAX_UNROLLED);
		return 0;
	}
	return 1;
}

/* A block's own settings (each at most once). */
enum {
	BS_STRATEGY,
	BS_RESHARD,
	BS_RECOMPUTE,
	BS_STAGE,
	BS_PRECISION,
	BS_PARAM_DTYPE,
	BS_BUFFER_DTYPE,
	BS_REDUCE_DTYPE,
	BS_WEIGHT_DECAY,
	BS_LR_SCALE,
	BS_COMPRESS,
	BS_OFFLOAD,
	BS_COUNT
};
static const char *const block_settings[BS_COUNT] = {
	"strategy",     "reshard_after_forward", "recompute",    "stage",   "precision",
	"param_dtype",  "buffer_dtype",          "reduce_dtype", "weight_decay", "lr_scale",
	"compress",     "offload"}; /* ORDER BS_ */
#define BLOCK_SETTINGS                                                                     \
	"strategy, reshard_after_forward, recompute, stage, precision, param_dtype, "          \
	"buffer_dtype, weight_decay, lr_scale, compress, offload"

/* A block's optimizer group: `weight_decay X` (>= 0) replaces the
 * optimizer's weight_decay for the block's parameters (train's no_decay
 * vectors still exempts its 1-D ones); `lr_scale X` (> 0) updates them with the
 * schedule's lr times X. */
static void block_group(Lower *L, int k, const AstVal *v, Block *bl)
{
	double x = v->kind == V_INT ? (double)v->i : v->f;
	if (v->kind != V_INT && v->kind != V_FLOAT) {
		ERR(v->loc, "%s takes a number", block_settings[k]);
		return;
	}
	if (!(x >= 0) || x > 1e30 || (k == BS_LR_SCALE && x == 0)) {
		ERR(v->loc, "%s must be %s", block_settings[k], k == BS_LR_SCALE ? "> 0" : ">= 0");
		return;
	}
	*(k == BS_LR_SCALE ? &bl->lr_scale : &bl->weight_decay) = (float)x;
}

/* A block's precision settings: `precision D` sets its param_dtype and
 * buffer_dtype, which `param_dtype` / `buffer_dtype` may state instead (not
 * contradict). The gradients of every block share the flat gradient buffer
 * the optimizer runs over, so reduce_dtype is train's only; and a block
 * computing in f32 cannot have its gradients reduced in bf16. */
static void block_precision(Lower *L, const Stmt *p, int k, const AstVal *v, Block *bl)
{
	if (k == BS_REDUCE_DTYPE) {
		ERR(p->name_loc, "reduce_dtype is a train setting: the gradients of every block share "
				 "one flat buffer and one reduction dtype");
		return;
	}
	int dt = scope_dtype_word(L, v, block_settings[k]);
	if (dt < 0)
		return;
	if (dp_is_half((unsigned)dt))
		scope_note_half(L, v->loc, dt);
	int pd = k == BS_BUFFER_DTYPE ? -1 : dt;
	if (pd >= 0 && bl->param_dtype >= 0 && bl->param_dtype != pd) {
		ERR(v->loc, "param_dtype %s contradicts the block's precision %s",
		    dp_dtype_names[pd], dp_dtype_names[bl->param_dtype]);
		return;
	}
	if (pd >= 0 && pd != L->g->reduce_dtype && L->g->reduce_dtype != DP_F32) {
		ERR(v->loc, "block '%s' computes in %s but the gradients are reduced in %s "
			    "(train's reduce_dtype): reduce in f32, or compute the block in %s",
		    bl->name, dp_dtype_names[pd], dp_dtype_names[L->g->reduce_dtype],
		    dp_dtype_names[L->g->reduce_dtype]);
		return;
	}
	if (pd >= 0)
		bl->param_dtype = pd;
	if (k != BS_PARAM_DTYPE)
		bl->buffer_dtype = dt;
	bl->precision_loc = scope_gloc(L, p->name_loc);
}

/* A block's own setting: `strategy NAME` overrides train's strategy for the
 * block's parameters; `reshard_after_forward true|false` overrides train's
 * for the block (read only when the block is full_shard or hybrid_shard,
 * like train's: a file can switch strategy by one word); `recompute
 * true|false` overrides train's gradient_checkpointing for the block; `stage
 * N` puts the block on pipeline stage N (the blocks after it follow it until
 * one says otherwise; passes/stages.c). */
static void block_setting(Lower *L, const Stmt *p, int b, unsigned *seen)
{
	Block *bl = &L->g->blocks[b];
	int k = 0;
	while (k < BS_COUNT && strcmp(p->name, block_settings[k]) != 0)
		k++;
	if (k == BS_COUNT) {
		const char *near = suggest_among(p->name, block_settings, BS_COUNT);
		ERR(p->name_loc, "unknown block setting '%s' (block settings: " BLOCK_SETTINGS ")%s%s%s",
		    p->name, near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
		return;
	}
	if (*seen & (1u << k)) {
		ERR(p->name_loc, "duplicate block setting '%s'", p->name);
		return;
	}
	*seen |= 1u << k;
	AstVal v;
	if (const_eval_value(L, p->val, &v))
		return;
	if (k == BS_COMPRESS) { /* its arguments are train's (compiler/lower.c) */
		int w = scope_want_word(L, &v, "a block's compress", "none", "powersgd");
		if (w >= 0) {
			bl->compress = w == 0 ? DP_COMPRESS_NONE : DP_COMPRESS_POWERSGD;
			bl->compress_loc = scope_gloc(L, p->name_loc);
		}
		return;
	}
	if (k == BS_OFFLOAD) { /* train's words (format/settings.def's OFFLOAD) */
		const char *const *w = dp_settings[DP_SET_OFFLOAD].words;
		int n = 0, i = -1;
		while (w[n])
			n++;
		for (int j = 0; j < n && v.kind == V_IDENT; j++)
			if (strcmp(v.s, w[j]) == 0)
				i = j;
		const char *near = v.kind == V_IDENT ? suggest_among(v.s, w, n) : NULL;
		if (i < 0)
			ERR(v.loc, "a block's offload must be none, optimizer or params%s%s%s",
			    near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
		else
			bl->offload = i;
		return;
	}
	if (k >= BS_WEIGHT_DECAY) {
		block_group(L, k, &v, bl);
		return;
	}
	if (k >= BS_PRECISION) {
		block_precision(L, p, k, &v, bl);
		return;
	}
	if (k == BS_STAGE) {
		/* its range against pp and the other blocks' stages: passes/stages.c */
		int64_t n;
		if (scope_want_int(L, &v, "stage", 0, 1 << 15, &n) == 0) {
			bl->stage = (int)n;
			bl->stage_loc = scope_gloc(L, v.loc);
		}
		return;
	}
	if (k != BS_STRATEGY) {
		int w = scope_want_word(L, &v, block_settings[k], "true", "false");
		if (w >= 0 && k == BS_RESHARD)
			bl->reshard = w == 0;
		else if (w >= 0)
			bl->recompute = w == 0;
		return;
	}
	int s = scope_strategy_word(L, &v);
	if (s < 0)
		return;
	char why[160];
	if (L->mesh_ok && !ir_strategy_fits(L->g, s, why, sizeof why)) {
		ERR(v.loc, "%s", why);
		return;
	}
	bl->strategy = s;
	bl->strategy_loc = scope_gloc(L, p->name_loc);
}

static void declare_block(Lower *L, const Stmt *s)
{
	const char *name = s->name;
	if (s->expr) {
		Num n;
		if (const_eval_num(L, s->expr, "a block index", &n)) {
			record_instance(L, -1);
			return;
		}
		if (n.is_float || n.i < 0) {
			ERR(s->expr->loc, "a block index must be an integer >= 0");
			record_instance(L, -1);
			return;
		}
		name = ir_fmt(L->g, "%s.%lld", s->name, (long long)n.i);
	}
	if (find_block(L, name) >= 0) {
		ERR(s->name_loc, "duplicate block '%s'", name);
		record_instance(L, -1);
		return;
	}
	int b = ir_add_block(L->g, name, scope_gloc(L, s->name_loc));
	scope_map_put(L, &L->blocks, L->g->blocks[b].name, b);
	/* gradient_checkpointing recomputes the blocks a repeat makes */
	L->g->blocks[b].recompute = L->grad_ckpt && L->nrep > 0;
	record_instance(L, b);
	unsigned seen = 0; /* block settings given */
	const Stmt *setting = NULL, *param = NULL;
	for (const Stmt *p = s->body; p; p = p->next) {
		if (!count_unrolled(L, p))
			return;
		if (p->kind == S_PARAM)
			param = p;
		if (p->kind == S_SETTING && p->val && !setting)
			setting = p;
		if (p->kind == S_PARAM || p->kind == S_BUFFER)
			declare_param(L, p, b);
		else if (p->kind == S_ASSIGN)
			scope_map_put(L, &L->targets, p->name, 0);
		else if (p->kind == S_SETTING && p->val)
			block_setting(L, p, b, &seen);
		else if (p->kind == S_BLOCK)
			ERR(p->loc, "blocks cannot be nested");
		else if (p->kind == S_REPEAT)
			ERR(p->loc, "repeat cannot be inside a block (put the block inside the repeat)");
		else
			ERR(p->loc, "expected a param, a buffer, an assignment or a setting "
				    "(" BLOCK_SETTINGS ") in block '%s'", name);
	}
	/* a setting places the params declared here; a tied weight read here
	 * follows the block that declares it */
	if (setting && !param)
		ERR(setting->name_loc, "block '%s' declares no params: its %s has nothing to act on "
				       "(a param follows the block that declares it)", name, setting->name);
}

static void declare_list(Lower *L, const Stmt *list)
{
	for (const Stmt *s = list; s; s = s->next) {
		if (!count_unrolled(L, s))
			return;
		switch (s->kind) {
		case S_ASSIGN:
			scope_map_put(L, &L->targets, s->name, 0);
			break;
		case S_BLOCK:
			declare_block(L, s);
			break;
		case S_REPEAT: {
			int64_t n = repeat_count(L, s, 0);
			/* an iteration counts too: nested empty repeats are no cheaper */
			for (int64_t i = 0; i < n && count_unrolled(L, s); i++) {
				L->rep_var[L->nrep] = s->name;
				L->rep_val[L->nrep++] = i;
				declare_list(L, s->body);
				L->nrep--;
			}
			break;
		}
		case S_PARAM:
		case S_BUFFER:
			ERR(s->loc, "%s '%s' must be inside a block",
			    s->kind == S_PARAM ? "param" : "buffer", s->name);
			break;
		default:
			ERR(s->loc, "expected an assignment, a block or a repeat in the model section");
			break;
		}
	}
}

/* ---- expressions ---- */

static int lower_call(Lower *L, const Expr *e, int block, const char *target);

/* The value a tensor expression denotes, or -1 (after an error, or for a
 * name whose definition failed: that was reported already). */
static int lower_expr(Lower *L, const Expr *e, int block)
{
	switch (e->kind) {
	case E_CALL:
		return lower_call(L, e, block, NULL);
	case E_MEMBER: {
		int b = find_block(L, e->name);
		if (b < 0) {
			ERR(e->loc, "unknown block '%s'", e->name);
			return -1;
		}
		int poisoned;
		Value *p = find_param(L, b, e->member, &poisoned);
		if (!p && poisoned)
			return -1;
		if (!p) {
			ERR(e->member_loc, "block '%s' has no param or buffer '%s'", e->name,
			    e->member);
			return -1;
		}
		return p->id;
	}
	case E_NAME: {
		if (block >= 0) {
			int poisoned;
			Value *p = find_param(L, block, e->name, &poisoned);
			if (p)
				return p->id;
			if (poisoned)
				return -1;
		}
		Sym *s = scope_find_sym(L, e->name);
		if (s)
			return s->value;
		if (scope_map_get(&L->targets, e->name))
			ERR(e->loc, "'%s' is used before it is assigned", e->name);
		else if (const_is_constant(L, e->name))
			ERR(e->loc, "'%s' is a constant, not a tensor", e->name);
		else
			ERR(e->loc, "unknown identifier '%s'", e->name);
		return -1;
	}
	default:
		ERR(e->loc, "expected a tensor here (a name, block.param or an op call), not a "
			    "number or a string");
		return -1;
	}
}

/* One keyword argument's value into n's attribute k (its DSL rules in
 * format/ops.def). */
static int lower_keyword(Lower *L, const OpAttr *k, const Expr *a, Node *n)
{
	if (k->style == IR_ATTR_FLAG) {
		int t = a->kind == E_NAME && strcmp(a->name, "true") == 0;
		if (!t && !(a->kind == E_NAME && strcmp(a->name, "false") == 0)) {
			static const char *const words[] = {"true", "false"};
			const char *guess = a->kind == E_NAME ? suggest_among(a->name, words, 2) : NULL;
			if (guess)
				ERR(a->loc, "%s must be true or false; did you mean '%s'?", k->key, guess);
			else
				ERR(a->loc, "%s must be true or false", k->key);
			return -1;
		}
		IR_ATTR(n, k) = t;
		return 0;
	}
	Num v;
	if (const_eval_num(L, a, k->key, &v))
		return -1;
	if (k->style != IR_ATTR_FLOAT) {
		if (v.is_float) {
			ERR(a->loc, "%s must be an integer, got %g", k->key, v.f);
			return -1;
		}
		if (v.i < k->min || v.i > INT32_MAX) {
			ERR(a->loc, "%s must be %s %lld, got %lld", k->key,
			    v.i < k->min ? "at least" : "at most",
			    (long long)(v.i < k->min ? k->min : INT32_MAX), (long long)v.i);
			return -1;
		}
		IR_ATTR(n, k) = v.i;
		return 0;
	}
	double x = v.is_float ? v.f : (double)v.i;
	if (!(x > (double)k->min) || !(x < 3.4e38)) {
		ERR(a->loc, "%s must be > %lld and fit f32, got %g", k->key, (long long)k->min, x);
		return -1;
	}
	IR_FATTR(n, k) = (float)x;
	return 0;
}

/* reshape(x, d1, ...): the dims after x into d1.. and their count into ndims. */
static int lower_reshape_dims(Lower *L, const Expr *e, const Expr *first, Node *n)
{
	int rc = 0, k = 0, infer = 0;
	for (const Expr *a = first; a && !a->key; a = a->next, k++) {
		Num v;
		if (const_eval_num(L, a, "a reshape dimension", &v)) {
			rc = -1;
			continue;
		}
		if (k >= DP_MAX_DIMS - 1) {
			ERR(a->loc, "reshape gives at most %d dims after x (the result has at most %d)",
			    DP_MAX_DIMS - 1, DP_MAX_DIMS);
			return -1;
		}
		if (v.is_float || (v.i < 1 && v.i != -1) || v.i > MAX_ELEMS) {
			ERR(a->loc, "a reshape dimension must be a positive integer or -1");
			rc = -1;
		} else if (v.i == -1 && infer++) {
			ERR(a->loc, "only one reshape dimension can be -1");
			rc = -1;
		}
		*ir_reshape_dim(n, k) = v.i;
	}
	if (k == 0) {
		ERR(e->loc, "reshape needs the new dims after x (the first dim is kept), like "
			    "reshape(x, T, heads, hd)");
		return -1;
	}
	DP_ATTR(n, RESHAPE, ndims) = k;
	return rc;
}

/* The DSL keywords of op (attributes with a key), at most DP_NIATTR + DP_NFATTR. */
static int op_keys(const OpInfo *op, const OpAttr **keys)
{
	int n = 0;
	for (const OpAttr *a = op->attrs; a->name; a++)
		if (a->key)
			keys[n++] = a;
	return n;
}

/* The operands of a call of op: positional tensors (lowered into in[],
 * their count into *ntensor), then keywords into attrs->ia/fa (defaults
 * included); reshape's dims too. -1 after errors. */
static int call_operands(Lower *L, const Expr *e, const OpInfo *op, int block, int *in,
			 int *ntensor, Node *attrs)
{
	Graph *g = L->g;
	int bad = 0, npos = 0, dims_after = op->dsl == OP_DSL_DIMS;
	const Expr *dims = NULL;
	for (const Expr *a = e->args; a; a = a->next)
		npos += !a->key;
	/* tensor operands: every positional one, or reshape's first */
	*ntensor = dims_after ? (npos > 0) : npos;
	if (*ntensor < op->min_in || *ntensor > op->max_in) {
		if (op->min_in == op->max_in)
			ERR(e->loc, "'%s' takes %d argument%s, got %d", e->name, op->min_in,
			    op->min_in == 1 ? "" : "s", *ntensor);
		else
			ERR(e->loc, "'%s' takes %d to %d arguments, got %d", e->name,
			    op->min_in, op->max_in, *ntensor);
		bad++;
	}
	int i = 0, seen_key = 0;
	for (const Expr *a = e->args; a; a = a->next) {
		if (a->key) {
			seen_key = 1;
			continue;
		}
		if (seen_key) {
			ERR(a->loc, "positional argument after a keyword argument");
			bad++;
			continue;
		}
		if (dims_after && i == 1) {
			dims = a;
			break;
		}
		int id = lower_expr(L, a, block);
		if (id < 0) {
			bad++;
		} else if (i < op->max_in) {
			in[i] = id;
			const Value *v = g->values[id];
			DpDtype want = i == op->ids_at ? DP_I32 : DP_F32;
			if (v->dtype != want) {
				ERR(a->loc, "argument %d of '%s' must be %s, but '%s' is %s", i + 1,
				    e->name, ir_dtype_name(want), v->name, ir_dtype_name(v->dtype));
				bad++;
			}
		}
		i++;
	}
	const OpAttr *keys[DP_NIATTR + DP_NFATTR];
	const Expr *given[DP_NIATTR + DP_NFATTR] = {NULL};
	int misspelt[DP_NIATTR + DP_NFATTR] = {0}; /* a keyword written close to this one */
	int nkeys = op_keys(op, keys);
	for (int k = 0; k < nkeys; k++)
		if (keys[k]->style == IR_ATTR_FLOAT)
			IR_FATTR(attrs, keys[k]) = keys[k]->def;
	for (const Expr *a = e->args; a; a = a->next) {
		if (!a->key)
			continue;
		int k = 0;
		while (k < nkeys && strcmp(keys[k]->key, a->key) != 0)
			k++;
		const char *guess = NULL;
		if (k == nkeys) {
			Suggest sg;
			suggest_init(&sg, a->key);
			for (int j = 0; j < nkeys; j++)
				suggest_try(&sg, keys[j]->key);
			guess = suggest_best(&sg);
		}
		if (k == nkeys && guess) {
			ERR(a->key_loc, "unknown keyword '%s' for '%s'; did you mean '%s'?", a->key,
			    e->name, guess);
			for (int j = 0; j < nkeys; j++)
				misspelt[j] |= keys[j]->key == guess;
			bad++;
		} else if (k == nkeys) {
			if (nkeys == 0)
				ERR(a->key_loc, "unknown keyword '%s': '%s' takes no keywords", a->key,
				    e->name);
			else if (nkeys == 1)
				ERR(a->key_loc, "unknown keyword '%s' for '%s' (it takes %s)", a->key,
				    e->name, keys[0]->key);
			else
				ERR(a->key_loc, "unknown keyword '%s' for '%s' (it takes %s and %s)",
				    a->key, e->name, keys[0]->key, keys[1]->key);
			bad++;
		} else if (given[k]) {
			ERR(a->key_loc, "duplicate keyword '%s'", a->key);
			bad++;
		} else {
			given[k] = a;
			if (lower_keyword(L, keys[k], a, attrs))
				bad++;
		}
	}
	for (int k = 0; k < nkeys; k++) {
		if (keys[k]->required && !given[k] && !misspelt[k]) {
			ERR(e->loc, "'%s' needs %s=N", e->name, keys[k]->key);
			bad++;
		}
	}
	/* an index below another attribute (split's index < parts) */
	for (int k = 0; k < nkeys && !bad; k++) {
		const OpAttr *lim = keys[k]->below >= 0 ? &op->attrs[keys[k]->below] : NULL;
		if (lim && given[k] && IR_ATTR(attrs, keys[k]) >= IR_ATTR(attrs, lim)) {
			ERR(given[k]->loc, "%s %s %lld is out of range for %lld %s", e->name,
			    keys[k]->key, (long long)IR_ATTR(attrs, keys[k]),
			    (long long)IR_ATTR(attrs, lim), lim->key);
			bad++;
		}
	}
	if (dims_after && npos > 0 && lower_reshape_dims(L, e, dims, attrs))
		bad++;
	return bad ? -1 : 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* An op the registry does not have: the closest DSL op, and every one. */
static void unknown_op(Lower *L, const Expr *e)
{
	const char *names[DP_NOPS];
	int n = 0;
	for (int op = 0; op < DP_NOPS; op++)
		if (ir_ops[op].dsl != OP_DSL_NO)
			names[n++] = ir_ops[op].name;
	qsort(names, (size_t)n, sizeof names[0], name_cmp);
	char list[512];
	size_t k = 0;
	list[0] = 0;
	for (int i = 0; i < n && k < sizeof list; i++)
		k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", names[i]);
	const char *guess = suggest_among(e->name, names, n);
	if (guess)
		ERR(e->loc, "unknown op '%s'; did you mean '%s'? (ops: %s)", e->name, guess, list);
	else
		ERR(e->loc, "unknown op '%s' (ops: %s)", e->name, list);
}

/* ---- scalar operands (ASCALAR in format/ops.def) ---- */

/* Is e a number rather than a tensor? Tensors have no arithmetic operators,
 * so + - * / and negation are numbers; a name is one when it is a constant
 * that no tensor of this block or scope hides; sqrt(...) is the one numeric
 * call (const_eval_num). */
static int is_number(Lower *L, const Expr *e, int block)
{
	switch (e->kind) {
	case E_INT:
	case E_FLOAT:
	case E_NEG:
	case E_BINARY:
		return 1;
	case E_NAME: {
		int poisoned;
		return const_is_constant(L, e->name) && !scope_find_sym(L, e->name) &&
		       !(block >= 0 && find_param(L, block, e->name, &poisoned));
	}
	case E_CALL:
		return strcmp(e->name, "sqrt") == 0 && ir_dsl_op(e->name) < 0;
	default:
		return 0;
	}
}

/* The op that a call of the DSL op opc with a number operand is, and its
 * scalar attribute in *attr: opc itself when its row has an ASCALAR
 * attribute (scale), else the op whose ASCALAR names opc (mul -> scale,
 * add -> add_scalar); -1 when there is none. */
static int scalar_op(int opc, const OpAttr **attr)
{
	for (int op = 0; op < DP_NOPS; op++)
		for (const OpAttr *a = ir_ops[op].attrs; a->name; a++)
			if (a->scalar_of && (op == opc || strcmp(a->scalar_of, ir_ops[opc].name) == 0)) {
				*attr = a;
				return op;
			}
	return -1;
}

/* A call with a scalar operand, op(x, c) or op(c, x) (each of these ops is
 * commutative in its two operands): x into in[0], c (a constant expression,
 * any finite f32) into the attribute. *is_scalar = 0 when the call has no
 * number operand and opc may be called without one (mul(a, b)). */
static int scalar_operands(Lower *L, const Expr *e, int opc, int block, int *in, Node *attrs,
			   int *sop, int *is_scalar)
{
	const OpAttr *sa = NULL;
	*sop = scalar_op(opc, &sa);
	*is_scalar = 0;
	if (*sop < 0)
		return 0;
	const Expr *num = NULL, *ten = NULL;
	int npos = 0, nnum = 0;
	for (const Expr *a = e->args; a; a = a->next) {
		if (a->key)
			continue;
		npos++;
		if (is_number(L, a, block)) {
			num = a;
			nnum++;
		} else {
			ten = a;
		}
	}
	if (nnum == 0 && *sop != opc)
		return 0; /* mul(a, b): the tensor op */
	*is_scalar = 1;
	for (const Expr *a = e->args; a; a = a->next) {
		if (a->key) {
			ERR(a->key_loc, "unknown keyword '%s': '%s' of a tensor and a number takes no "
					"keywords", a->key, e->name);
			return -1;
		}
	}
	if (npos != 2 || nnum != 1) {
		ERR(e->loc, "'%s' %s a tensor and a number, like %s(x, 0.5)%s", e->name,
		    *sop == opc ? "takes" : "with a number operand takes", e->name,
		    npos == 2 && nnum == 2 ? " (both operands are numbers: write the number)" : "");
		return -1;
	}
	Num v;
	int id = lower_expr(L, ten, block);
	if (const_eval_num(L, num, "the scalar operand", &v) | (id < 0))
		return -1;
	double x = v.is_float ? v.f : (double)v.i;
	if (!(fabs(x) < 3.4e38)) {
		ERR(num->loc, "the scalar operand of '%s' must be a finite f32, got %g", e->name, x);
		return -1;
	}
	const Value *t = L->g->values[id];
	if (t->dtype != DP_F32) {
		ERR(ten->loc, "the tensor operand of '%s' must be f32, but '%s' is %s", e->name,
		    t->name, ir_dtype_name(t->dtype));
		return -1;
	}
	in[0] = id;
	IR_FATTR(attrs, sa) = (float)x;
	return 0;
}

/* ---- dropout ---- */

/* The keys dropout's mask is drawn from (DP_SRC_SAMPLE_KEYS): one data
 * value i32 [batch, 2], loaded in the step program and, with an eval
 * section, in eval (where the runtime fills -1: no dropout), its LOADs
 * after the data's (before any computation, as a pass that adds a LOAD
 * expects). Made by the first dropout. */
static int dropout_keys(Lower *L)
{
	Graph *g = L->g;
	Loc loc = {g->file, 0, 0}; /* made, not written (as cp.pos): no line of its own */
	for (int i = 0; i < g->nsources; i++)
		if (g->sources[i].rec.kind == DP_SRC_SAMPLE_KEYS)
			return g->sources[i].value;
	int64_t dims[2] = {g->cfg.micro_batch, 2};
	Value *v = ir_value(g, ir_fresh_name(g, "dropout.keys"), DP_I32, 2, dims, DP_T_DATA, loc);
	int last_load = -1;
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->op == DP_OP_LOAD)
			last_load = i;
	for (int split = 0; split < (L->eval ? 2 : 1); split++) {
		Source s = {.rec = {.kind = DP_SRC_SAMPLE_KEYS, .split = (uint8_t)split, .role = 1,
				    .sample_elems = 2},
			    .path = "", .value = v->id, .loc = loc};
		int si = ir_add_source(g, &s);
		if (split == 0)
			v->source = si;
		Node *n = ir_node(g, DP_OP_LOAD, v->id, 0, NULL, PH_DATA, loc);
		DP_ATTR(n, LOAD, source) = si;
		n->progs = split == 0 ? IR_IN_STEP : IR_IN_EVAL;
		ir_move_node(g, n, ++last_load);
	}
	return v->id;
}

/* dropout(x, p=P): x's operand checked, p in [0, 1), the keys as in1 and the
 * site (the dropouts before it) in the attributes. */
static int dropout_operands(Lower *L, const Expr *e, int nin, int *in, Node *attrs)
{
	Graph *g = L->g;
	if (nin != 1) {
		ERR(e->loc, "'dropout' takes 1 argument, got %d (the rate is p=P)", nin);
		return -1;
	}
	float p = DP_FATTR(attrs, DROPOUT, p);
	if (!(p >= 0 && p < 1)) {
		const Expr *a = e->args;
		while (a && !(a->key && strcmp(a->key, "p") == 0))
			a = a->next;
		ERR(a ? a->loc : e->loc, "dropout's p must be in [0, 1), got %g", p);
		return -1;
	}
	int site = 0;
	for (int i = 0; i < g->nnodes; i++)
		site += g->nodes[i]->op == DP_OP_DROPOUT;
	DP_ATTR(attrs, DROPOUT, site) = site;
	in[1] = dropout_keys(L);
	return 0;
}

/* A call of an op (not the loss): a new value named target (a fresh
 * temporary when NULL) and its node. */
static int lower_call(Lower *L, const Expr *e, int block, const char *target)
{
	Graph *g = L->g;
	int opc = ir_dsl_op(e->name);
	if (opc < 0) {
		unknown_op(L, e);
		for (const Expr *a = e->args; a; a = a->next)
			if (!a->key)
				lower_expr(L, a, block); /* report errors inside it too */
		return -1;
	}
	const OpInfo *op = &ir_ops[opc];
	if (op->dsl == OP_DSL_LOSS) {
		ERR(e->loc, "%s must be assigned directly, like loss = %s(logits, y)", e->name,
		    e->name);
		return -1;
	}
	int in[DP_MAX_IN] = {0}, nin = 1, sop, is_scalar;
	Node attrs = {0};
	if (scalar_operands(L, e, opc, block, in, &attrs, &sop, &is_scalar))
		return -1;
	if (is_scalar)
		opc = sop;
	else if (call_operands(L, e, op, block, in, &nin, &attrs))
		return -1;
	if (opc == DP_OP_DROPOUT) {
		if (dropout_operands(L, e, nin, in, &attrs))
			return -1;
		nin = 2;
	}
	Loc loc = scope_gloc(L, e->loc);
	Value *v = scope_value(L, target ? target : fresh_temp(L), DP_F32, 0, NULL, DP_T_ACT, loc);
	Node *n = ir_node(g, (IrOp)opc, v->id, nin, in, PH_FWD, loc);
	memcpy(n->ia, attrs.ia, sizeof n->ia);
	memcpy(n->fa, attrs.fa, sizeof n->fa);
	n->progs = IR_IN_STEP | IR_IN_EVAL;
	n->block = block;
	v->def = n->id;
	return v->id;
}

static Value *metric(Lower *L, const char *stem, int64_t n, Loc loc)
{
	int64_t dims[1] = {n};
	return scope_value(L, scope_fresh_name(L, stem), DP_F32, 1, dims, DP_T_METRIC, loc);
}

/* name = cross_entropy(logits, labels): the training loss and its metrics. */
static int lower_loss(Lower *L, const Expr *e, const char *name, int block)
{
	Graph *g = L->g;
	if (L->loss_seen) {
		ERR(e->loc, "more than one cross_entropy loss (the first is on line %d)",
		    L->loss_loc.line);
		return -1;
	}
	L->loss_seen = 1;
	L->loss_loc = e->loc;
	int in[DP_MAX_IN] = {0}, nin;
	Node attrs = {0};
	if (call_operands(L, e, &ir_ops[DP_OP_XENT], block, in, &nin, &attrs) ||
	    !L->batch_ok)
		return -1;
	Loc loc = scope_gloc(L, e->loc);
	Value *loss = scope_value(L, name, DP_F32, 0, NULL, DP_T_ACT, loc);
	Node *n = ir_node(g, DP_OP_XENT, loss->id, 2, in, PH_FWD, loc);
	/* the loss is the mean over every labelled row of the global batch: a
	 * sample of labels i32[batch, T] (next-token targets) has T rows */
	const Value *lab = g->values[in[1]];
	double rows = 1;
	for (int k = 1; k < lab->ndim; k++)
		rows *= (double)lab->dims[k];
	DP_FATTR(n, XENT, scale) = (float)(1.0 / ((double)L->global_batch * rows));
	n->progs = IR_IN_STEP;
	n->block = block;
	loss->def = n->id;
	g->loss = loss->id;
	g->logits = in[0];
	g->labels = in[1];

	Value *sum = metric(L, "loss.sum", 1, loc);
	n = ir_node(g, DP_OP_ACCUM, sum->id, 1, &loss->id, PH_FWD, loc);
	n->progs = IR_IN_STEP;
	g->metrics.loss = sum->id;
	if (L->eval) {
		Value *el = metric(L, "eval.loss", 1, loc);
		n = ir_node(g, DP_OP_XENT, el->id, 2, in, PH_EVAL, loc);
		DP_FATTR(n, XENT, scale) = 1.0f; /* a sum: the runtime divides by the samples counted */
		n->progs = IR_IN_EVAL;
		Value *ec = metric(L, "eval.correct", 2, loc);
		n = ir_node(g, DP_OP_CORRECT, ec->id, 2, in, PH_EVAL, loc);
		n->progs = IR_IN_EVAL;
		g->metrics.eval_loss = el->id;
		g->metrics.eval_correct = ec->id;
	}
	return loss->id;
}

/* The value name of a binding of s->name (see the file comment). */
static const char *binding_name(Lower *L, const Stmt *s, int block, int first)
{
	if (first && !scope_map_get(&L->values, s->name))
		return s->name;
	if (block >= 0) {
		const char *qual = ir_fmt(L->g, "%s.%s", L->g->blocks[block].name, s->name);
		if (!scope_map_get(&L->values, qual))
			return qual;
		return scope_fresh_name(L, qual);
	}
	return scope_fresh_name(L, s->name);
}

static void lower_assign(Lower *L, const Stmt *s, int block)
{
	Sym *sym = scope_find_sym(L, s->name);
	if (sym && sym->is_data) {
		ERR(s->name_loc, "'%s' is data: it cannot be assigned (pick another name)", s->name);
		return;
	}
	const Value *m = block >= 0 ? find_param(L, block, s->name, NULL) : NULL;
	if (m) {
		ERR(s->name_loc, "'%s' is a %s of block '%s'", s->name, member_kind(m),
		    L->g->blocks[block].name);
		return;
	}
	const Expr *e = s->expr;
	int id = -1;
	if (e->kind != E_CALL)
		ERR(e->loc, "the right-hand side must be an op call, like relu(%s)",
		    e->kind == E_NAME ? e->name : "x");
	else if (e->depth <= AST_MAX_DEPTH) { /* deeper ones were reported by the scanner */
		const char *name = binding_name(L, s, block, sym == NULL);
		int op = ir_dsl_op(e->name);
		id = op >= 0 && ir_ops[op].dsl == OP_DSL_LOSS ? lower_loss(L, e, name, block)
							       : lower_call(L, e, block, name);
	}
	/* the new binding is seen from the next statement on (x = add(x, ...)) */
	sym = scope_find_sym(L, s->name);
	if (sym)
		sym->value = id;
	else
		scope_add_sym(L, s->name, id, 0);
}

static void lower_list(Lower *L, const Stmt *list, int *inst)
{
	for (const Stmt *s = list; s; s = s->next) {
		if (s->kind == S_ASSIGN) {
			lower_assign(L, s, -1);
		} else if (s->kind == S_BLOCK) {
			int b = *inst < L->ninst ? L->inst_block[*inst] : -1;
			++*inst;
			for (const Stmt *p = s->body; p; p = p->next) {
				if (p->kind != S_ASSIGN)
					continue;
				if (b >= 0)
					lower_assign(L, p, b);
				else if (!scope_find_sym(L, p->name))
					scope_add_sym(L, p->name, -1, 0); /* a failed block: quiet */
			}
		} else if (s->kind == S_REPEAT) {
			int64_t n = repeat_count(L, s, 1);
			for (int64_t i = 0; i < n; i++) {
				L->rep_var[L->nrep] = s->name;
				L->rep_val[L->nrep++] = i;
				lower_list(L, s->body, inst);
				L->nrep--;
			}
		}
	}
}

void model_lower(Lower *L)
{
	declare_list(L, L->model->body);
	if (L->unrolled > MAX_UNROLLED)
		return;
	int inst = 0;
	lower_list(L, L->model->body, &inst);
	if (!L->loss_seen)
		ERR(L->model->name_loc,
		    "the model has no loss: assign one, like loss = cross_entropy(logits, y)");
}
