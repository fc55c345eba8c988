/*
 * lower.c - semantic checks of the syntax tree and its lowering to the graph
 * IR; fe_compile, the front end's entry point.
 *
 * Before: a tree from compiler/parser.y that parsed without errors (a file
 * with syntax errors is not lowered: its half-statements would only produce
 * misleading follow-on errors).
 *
 * After (when no error was reported), the Graph holds:
 *   - cfg (mesh, micro_batch, grad_accum, eval_batch, steps, eval_every,
 *     log_every, seed, strategy), opt, sched, strategy (its name), bucket_mb,
 *     reshard_after_forward, prefetch, gather_limit_mb, accum_unsharded;
 *   - one Block per `block`, in order;
 *   - per data declaration a DP_T_DATA value [micro_batch, ...], its train
 *     Source and a LOAD node (IR_IN_STEP); per eval source an eval Source for
 *     the same value and a LOAD node (IR_IN_EVAL); all LOAD nodes first;
 *   - per param a DP_T_PARAM value "block.param" with its initialiser, per
 *     buffer a DP_T_BUFFER value "block.buffer" likewise (no gradient, never
 *     communicated: autodiff only differentiates DP_T_PARAM);
 *   - per op call a DP_T_ACT f32 value with ndim 0 (shapes are the shape
 *     pass's job) and a PH_FWD node in step and eval; nested calls produce
 *     temporaries t, t1, ...;
 *   - the cross_entropy assignment: an XENT node (step only, fa0 = 1/global
 *     batch), the metric loss.sum and its ACCUM node, and with an eval section
 *     the eval.loss (XENT, fa0 = 1) and eval.correct (CORRECT) metrics.
 *
 * Sections are checked in dependency order, not file order: mesh, train
 * (batch sizes need the mesh), data (shapes need micro_batch), eval, model.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ast.h"
#include "frontend.h"

#define MAX_ELEMS ((int64_t)1 << 40) /* elements of one tensor */
#define MAX_AXIS (1 << 15)           /* size of one mesh axis (4 axes: the product fits int64) */
#define MAX_WORLD (1 << 24)          /* ranks */
#define MAX_FILE_BYTES (64u << 20)   /* source files larger than this are refused */

/* A name the model can refer to: a data value or an assignment target. */
typedef struct {
	const char *name;
	int value;   /* value id, or -1 when its definition had an error */
	int is_data;
} Sym;

typedef struct {
	ParseState *ps;
	Diag *d;
	Graph *g;
	int world_size;
	Loc top; /* 1:1, for what is missing from the whole file */
	const Stmt *mesh, *data, *eval, *model, *train;
	int mesh_ok, batch_ok;
	int64_t global_batch;
	Sym *syms;
	int nsyms, capsyms;
	const char **targets; /* every assignment target of the model */
	int ntargets, captargets;
	int next_temp;
	int loss_seen;
	Loc loss_loc;
	struct Pending *errs; /* reported in source order at the end */
	int nerrs, caperrs;
} Lower;

/* Sections are checked in dependency order; their errors are collected and
 * reported sorted by position, so the user reads them top to bottom. */
typedef struct Pending {
	Loc loc;
	int seq;
	char *msg;
} Pending;

static void lerr(Lower *L, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define ERR(loc, ...) lerr(L, (loc), __VA_ARGS__)

/* ---- small helpers ---- */

static Loc gloc(Lower *L, Loc l)
{
	l.file = L->g->file; /* graph Locs must outlive the tree and the caller's path */
	return l;
}

static void *grow(Lower *L, void *arr, int *cap, int need, size_t elem)
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

static void lerr(Lower *L, Loc loc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *msg = ast_alloc(L->ps, (size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(msg, (size_t)n + 1, fmt, ap);
	va_end(ap);
	L->errs = grow(L, L->errs, &L->caperrs, L->nerrs + 1, sizeof(Pending));
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

static Sym *find_sym(Lower *L, const char *name)
{
	for (int i = 0; i < L->nsyms; i++)
		if (strcmp(L->syms[i].name, name) == 0)
			return &L->syms[i];
	return NULL;
}

static void add_sym(Lower *L, const char *name, int value, int is_data)
{
	L->syms = grow(L, L->syms, &L->capsyms, L->nsyms + 1, sizeof(Sym));
	L->syms[L->nsyms++] = (Sym){name, value, is_data};
}

static int is_target(Lower *L, const char *name)
{
	for (int i = 0; i < L->ntargets; i++)
		if (strcmp(L->targets[i], name) == 0)
			return 1;
	return 0;
}

static void add_target(Lower *L, const char *name)
{
	L->targets = grow(L, L->targets, &L->captargets, L->ntargets + 1, sizeof(char *));
	L->targets[L->ntargets++] = name;
}

/* A temporary's name: like ir_fresh_name(g, "t"), but never a name the user
 * assigns later in the file. */
static const char *fresh_temp(Lower *L)
{
	for (;; L->next_temp++) {
		char buf[32];
		if (L->next_temp == 0)
			snprintf(buf, sizeof buf, "t");
		else
			snprintf(buf, sizeof buf, "t%d", L->next_temp);
		if (!ir_find_value(L->g, buf) && !is_target(L, buf))
			return ir_strdup(L->g, buf);
	}
}

static int find_block(Lower *L, const char *name)
{
	for (int i = 0; i < L->g->nblocks; i++)
		if (strcmp(L->g->blocks[i].name, name) == 0)
			return i;
	return -1;
}

/* The param or buffer block.name; NULL if there is none. *poisoned is set
 * when its declaration failed (an error was reported for it already). */
static Value *find_param(Lower *L, int block, const char *name, int *poisoned)
{
	char buf[2 * AST_MAX_IDENT + 8];
	snprintf(buf, sizeof buf, "%s.%s", L->g->blocks[block].name, name);
	Value *v = ir_find_value(L->g, buf);
	if (poisoned)
		*poisoned = find_sym(L, buf) != NULL;
	return v && (v->kind == DP_T_PARAM || v->kind == DP_T_BUFFER) ? v : NULL;
}

/* "param" or "buffer", for messages. */
static const char *member_kind(const Value *v)
{
	return v->kind == DP_T_BUFFER ? "buffer" : "param";
}

static int later(Loc a, Loc b)
{
	return a.line > b.line || (a.line == b.line && a.col > b.col);
}

/* ---- values: numbers, keyword arguments ---- */

static int want_int(Lower *L, const AstVal *v, const char *what, int64_t lo, int64_t hi,
		    int64_t *out)
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
static int want_float(Lower *L, const AstVal *v, const char *what, float *out)
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
static int get_kwargs(Lower *L, const AstVal *call, const char *const *keys, int nkeys,
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

/* A V_IDENT or V_CALL naming a spec (optimizer, schedule, source, init). */
static int is_spec(const AstVal *v)
{
	return v->kind == V_IDENT || v->kind == V_CALL;
}

/* ---- mesh ---- */

static void lower_mesh(Lower *L)
{
	uint32_t *mesh = L->g->cfg.mesh;
	int world = L->world_size > 0 ? L->world_size : 0;
	const Stmt *s = L->mesh;
	L->mesh_ok = 0;
	if (world > MAX_WORLD) {
		ERR(s ? s->name_loc : L->top, "world size %d is too large (at most %d)", world,
		    MAX_WORLD);
		return;
	}
	if (!s) { /* no mesh statement: like `mesh auto` when a world size is given */
		if (world > 0)
			mesh[DP_AXIS_SHARD] = (uint32_t)world;
		L->mesh_ok = 1;
		return;
	}
	if (s->has_val) {
		if (s->val.kind == V_IDENT && strcmp(s->val.s, "auto") == 0) {
			if (world == 0) {
				ERR(s->val.loc, "mesh auto needs --world-size N");
				return;
			}
			/* tp, cp and dp_replicate stay 1; the rest goes to dp_shard */
			mesh[DP_AXIS_SHARD] = (uint32_t)world;
			L->mesh_ok = 1;
			return;
		}
		ERR(s->val.loc, "expected 'mesh auto' or 'mesh dp_replicate=N, dp_shard=N, ...'");
		return;
	}
	int64_t size[DP_MAX_AXES] = {1, 1, 1, 1};
	const Arg *given[DP_MAX_AXES] = {NULL};
	int auto_axis = -1, ok = 1;
	for (const Arg *a = s->kw; a; a = a->next) {
		int ax = 0;
		while (ax < DP_MAX_AXES && strcmp(ir_axis_names[ax], a->key) != 0)
			ax++;
		if (ax == DP_MAX_AXES) {
			ERR(a->key_loc, "unknown mesh axis '%s' (axes: dp_replicate, dp_shard, cp, tp)",
			    a->key);
			ok = 0;
			continue;
		}
		if (given[ax]) {
			ERR(a->key_loc, "duplicate mesh axis '%s'", a->key);
			ok = 0;
			continue;
		}
		given[ax] = a;
		if (a->val.kind == V_IDENT && strcmp(a->val.s, "auto") == 0) {
			if (auto_axis >= 0) {
				ERR(a->val.loc, "only one mesh axis can be auto");
				ok = 0;
			}
			auto_axis = ax;
			continue;
		}
		if (want_int(L, &a->val, a->key, 1, MAX_AXIS, &size[ax]))
			ok = 0;
	}
	if (!ok)
		return;
	int64_t fixed = 1;
	for (int ax = 0; ax < DP_MAX_AXES; ax++)
		if (ax != auto_axis)
			fixed *= size[ax]; /* at most 2^60: each axis is at most 2^15 */
	if (auto_axis >= 0) {
		const Arg *a = given[auto_axis];
		if (world == 0) {
			ERR(a->val.loc, "mesh axis '%s=auto' needs --world-size N", a->key);
			return;
		}
		if (fixed > world || world % fixed != 0) {
			ERR(a->val.loc, "world size %d is not divisible by the fixed mesh axes (%lld)",
			    world, (long long)fixed);
			return;
		}
		size[auto_axis] = world / fixed;
	} else if (world > 0 && fixed != world) {
		ERR(s->name_loc, "the mesh has %lld ranks but --world-size is %d", (long long)fixed,
		    world);
		return;
	} else if (fixed > MAX_WORLD) {
		ERR(s->name_loc, "the mesh has too many ranks (at most %d)", MAX_WORLD);
		return;
	}
	if (size[DP_AXIS_CP] != 1) {
		ERR(given[DP_AXIS_CP]->val.loc, "context parallelism (cp=%lld) is not implemented yet",
		    (long long)size[DP_AXIS_CP]);
		ok = 0;
	}
	if (size[DP_AXIS_TP] != 1) {
		ERR(given[DP_AXIS_TP]->val.loc, "tensor parallelism (tp=%lld) is not implemented yet",
		    (long long)size[DP_AXIS_TP]);
		ok = 0;
	}
	for (int ax = 0; ax < DP_MAX_AXES; ax++)
		mesh[ax] = (uint32_t)size[ax];
	L->mesh_ok = ok;
}

/* ---- train ---- */

enum {
	T_STRATEGY,
	T_OPTIMIZER,
	T_SCHEDULE,
	T_MICRO_BATCH,
	T_GLOBAL_BATCH,
	T_GRAD_ACCUM,
	T_CLIP_GRAD_NORM,
	T_BUCKET_MB,
	T_SEED,
	T_STEPS,
	T_LOG_EVERY,
	T_RESHARD,
	T_PREFETCH,
	T_GATHER_LIMIT_MB,
	T_ACCUMULATE_GRADS,
	T_COUNT
};

static const char *const train_keys[T_COUNT] = { /* ORDER T_ */
	"strategy", "optimizer", "schedule", "micro_batch", "global_batch", "grad_accum",
	"clip_grad_norm", "bucket_mb", "seed", "steps", "log_every", "reshard_after_forward",
	"prefetch", "gather_limit_mb", "accumulate_grads",
};

#define MAX_PREFETCH 64  /* blocks an all_gather may run ahead */
#define MAX_MB (1 << 20) /* bucket_mb and gather_limit_mb: 1 TiB */

/* A strategy name (ir_strategy_names) into g->strategy and cfg.strategy.
 * Whether the mesh suits it is checked with the mesh (lower_train). */
static void lower_strategy(Lower *L, const AstVal *v)
{
	if (v->kind != V_IDENT) {
		ERR(v->loc, "expected a strategy name (ddp, zero1, zero2, full_shard, hybrid_shard)");
		return;
	}
	for (int i = 0; i < DP_NSTRAT; i++) {
		if (strcmp(ir_strategy_names[i], v->s) != 0)
			continue;
		snprintf(L->g->strategy, sizeof L->g->strategy, "%s", v->s);
		L->g->cfg.strategy = (uint32_t)i;
		return;
	}
	ERR(v->loc, "unknown strategy '%s' (strategies: ddp, zero1, zero2, full_shard, hybrid_shard)",
	    v->s);
}

/* One of a fixed list of words (true/false, sharded/unsharded): its index,
 * or -1 after reporting "what must be a or b". */
static int want_word(Lower *L, const AstVal *v, const char *what, const char *a, const char *b)
{
	if (v->kind == V_IDENT && strcmp(v->s, a) == 0)
		return 0;
	if (v->kind == V_IDENT && strcmp(v->s, b) == 0)
		return 1;
	ERR(v->loc, "%s must be %s or %s", what, a, b);
	return -1;
}

/* The settings of the sharded strategies. They are accepted with every
 * strategy (a file can switch strategy by one word); which strategies read
 * them is documented in docs/DSL.md. */
static void lower_shard_settings(Lower *L, const Stmt *const *set)
{
	Graph *g = L->g;
	int64_t x;
	if (set[T_RESHARD]) {
		int w = want_word(L, &set[T_RESHARD]->val, "reshard_after_forward", "true", "false");
		if (w >= 0)
			g->reshard_after_forward = w == 0;
	}
	if (set[T_PREFETCH] &&
	    !want_int(L, &set[T_PREFETCH]->val, "prefetch", 0, MAX_PREFETCH, &x))
		g->prefetch = (int)x;
	if (set[T_GATHER_LIMIT_MB]) {
		const AstVal *v = &set[T_GATHER_LIMIT_MB]->val;
		float mb;
		if (!want_float(L, v, "gather_limit_mb", &mb)) {
			if (!(mb >= 0 && mb <= MAX_MB))
				ERR(v->loc, "gather_limit_mb must be >= 0 (0: no limit) and at most %d",
				    MAX_MB);
			else
				g->gather_limit_mb = mb;
		}
	}
	if (set[T_ACCUMULATE_GRADS]) {
		int w = want_word(L, &set[T_ACCUMULATE_GRADS]->val, "accumulate_grads", "sharded",
				  "unsharded");
		if (w >= 0)
			g->accum_unsharded = w;
	}
}

/* An optional float keyword argument; a missing one keeps *out. */
static int kw_float(Lower *L, const Arg *a, float *out)
{
	return a ? want_float(L, &a->val, a->key, out) : 0;
}

static void lower_optimizer(Lower *L, const AstVal *v)
{
	DpOptim *o = &L->g->opt;
	if (!is_spec(v)) {
		ERR(v->loc, "expected an optimizer: adamw(...) or sgd(...)");
		return;
	}
	const Arg *a[5];
	if (strcmp(v->s, "adamw") == 0) {
		static const char *const keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay"};
		if (get_kwargs(L, v, keys, 5, a))
			return;
		/* PyTorch's defaults */
		o->kind = DP_OPT_ADAMW;
		o->lr = 1e-3f, o->beta1 = 0.9f, o->beta2 = 0.999f, o->eps = 1e-8f;
		o->weight_decay = 0.01f, o->momentum = 0;
		if (kw_float(L, a[0], &o->lr) | kw_float(L, a[1], &o->beta1) |
		    kw_float(L, a[2], &o->beta2) | kw_float(L, a[3], &o->eps) |
		    kw_float(L, a[4], &o->weight_decay))
			return;
		if (a[1] && !(o->beta1 >= 0 && o->beta1 < 1))
			ERR(a[1]->val.loc, "beta1 must be in [0, 1)");
		if (a[2] && !(o->beta2 >= 0 && o->beta2 < 1))
			ERR(a[2]->val.loc, "beta2 must be in [0, 1)");
		if (a[3] && !(o->eps > 0))
			ERR(a[3]->val.loc, "eps must be > 0");
	} else if (strcmp(v->s, "sgd") == 0) {
		static const char *const keys[] = {"lr", "momentum", "weight_decay"};
		if (get_kwargs(L, v, keys, 3, a))
			return;
		o->kind = DP_OPT_SGD;
		o->lr = 0.01f, o->momentum = 0, o->weight_decay = 0;
		o->beta1 = o->beta2 = o->eps = 0;
		if (kw_float(L, a[0], &o->lr) | kw_float(L, a[1], &o->momentum) |
		    kw_float(L, a[2], &o->weight_decay))
			return;
		if (a[1] && !(o->momentum >= 0 && o->momentum < 1))
			ERR(a[1]->val.loc, "momentum must be in [0, 1)");
		a[4] = a[2];
	} else {
		ERR(v->loc, "unknown optimizer '%s' (optimizers: adamw, sgd)", v->s);
		return;
	}
	if (a[0] && !(o->lr > 0))
		ERR(a[0]->val.loc, "lr must be > 0");
	if (a[4] && !(o->weight_decay >= 0))
		ERR(a[4]->val.loc, "weight_decay must be >= 0");
}

/* After steps and the optimizer: cosine's steps default to the train steps. */
static void lower_schedule(Lower *L, const AstVal *v)
{
	DpSched *s = &L->g->sched;
	if (!is_spec(v)) {
		ERR(v->loc, "expected a schedule: constant or cosine(...)");
		return;
	}
	if (strcmp(v->s, "constant") == 0) {
		if (v->nargs > 0)
			ERR(v->loc, "schedule 'constant' takes no arguments");
		return;
	}
	if (strcmp(v->s, "cosine") != 0) {
		ERR(v->loc, "unknown schedule '%s' (schedules: constant, cosine)", v->s);
		return;
	}
	static const char *const keys[] = {"warmup", "steps", "min_lr"};
	const Arg *a[3];
	if (get_kwargs(L, v, keys, 3, a))
		return;
	int64_t warmup = 0, steps = s->steps;
	float min_lr = 0;
	if ((a[0] && want_int(L, &a[0]->val, "warmup", 0, INT32_MAX, &warmup)) ||
	    (a[1] && want_int(L, &a[1]->val, "steps", 1, INT32_MAX, &steps)) ||
	    kw_float(L, a[2], &min_lr))
		return;
	if (warmup > steps) {
		ERR(a[0]->val.loc, "warmup (%lld) must not exceed the schedule's steps (%lld)",
		    (long long)warmup, (long long)steps);
		return;
	}
	if (a[2] && !(min_lr >= 0 && min_lr <= L->g->opt.lr)) {
		ERR(a[2]->val.loc, "min_lr must be in [0, lr]");
		return;
	}
	s->kind = DP_SCHED_COSINE;
	s->warmup = (uint32_t)warmup;
	s->steps = (uint32_t)steps;
	s->min_lr = min_lr;
}

static void lower_train(Lower *L)
{
	Graph *g = L->g;
	DpConfig *c = &g->cfg;
	const Stmt *set[T_COUNT] = {NULL};
	int64_t x;

	c->steps = 100;
	c->log_every = 10;
	c->seed = 0;
	c->grad_accum = 1;
	c->micro_batch = 1;
	c->eval_every = 0;
	g->opt = (DpOptim){.kind = DP_OPT_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
			   .eps = 1e-8f, .weight_decay = 0.01f};
	g->bucket_mb = 25;
	snprintf(g->strategy, sizeof g->strategy, "%s", ir_strategy_names[DP_STRAT_DDP]);
	c->strategy = DP_STRAT_DDP;
	g->reshard_after_forward = 1;
	g->prefetch = 1;
	g->gather_limit_mb = 0;
	g->accum_unsharded = 0;
	L->batch_ok = 0;
	L->global_batch = 1;
	if (!L->train) {
		ERR(L->top, "missing 'train' section (it must set micro_batch or global_batch)");
		return;
	}
	for (const Stmt *s = L->train->body; s; s = s->next) {
		if (s->kind != S_SETTING || !s->has_val) {
			ERR(s->loc, "expected a setting like 'steps 100' in the train section");
			continue;
		}
		int k = 0;
		while (k < T_COUNT && strcmp(train_keys[k], s->name) != 0)
			k++;
		if (k == T_COUNT)
			ERR(s->name_loc, "unknown train setting '%s'", s->name);
		else if (set[k])
			ERR(s->name_loc, "duplicate train setting '%s'", s->name);
		else
			set[k] = s;
	}
	if (set[T_STEPS] && !want_int(L, &set[T_STEPS]->val, "steps", 1, INT32_MAX, &x))
		c->steps = (uint32_t)x;
	if (set[T_LOG_EVERY] && !want_int(L, &set[T_LOG_EVERY]->val, "log_every", 1, INT32_MAX, &x))
		c->log_every = (uint32_t)x;
	if (set[T_SEED] && !want_int(L, &set[T_SEED]->val, "seed", 0, INT64_MAX, &x))
		c->seed = (uint64_t)x;
	if (set[T_STRATEGY]) {
		lower_strategy(L, &set[T_STRATEGY]->val);
		/* full_shard shards over dp_shard and replicates nothing: a
		 * dp_replicate axis would hold copies it never synchronises */
		if (L->mesh_ok && c->strategy == DP_STRAT_FULL_SHARD && c->mesh[DP_AXIS_REPLICATE] > 1)
			ERR(set[T_STRATEGY]->val.loc,
			    "strategy full_shard shards over dp_shard only; with dp_replicate=%u use "
			    "hybrid_shard",
			    c->mesh[DP_AXIS_REPLICATE]);
	}
	lower_shard_settings(L, set);
	if (set[T_OPTIMIZER])
		lower_optimizer(L, &set[T_OPTIMIZER]->val);
	if (set[T_CLIP_GRAD_NORM]) {
		const AstVal *v = &set[T_CLIP_GRAD_NORM]->val;
		if (!want_float(L, v, "clip_grad_norm", &g->opt.clip) && g->opt.clip < 0)
			ERR(v->loc, "clip_grad_norm must be >= 0 (0 turns clipping off)");
	}
	if (set[T_BUCKET_MB]) {
		const AstVal *v = &set[T_BUCKET_MB]->val;
		float mb;
		if (!want_float(L, v, "bucket_mb", &mb)) {
			if (!(mb > 0 && mb <= MAX_MB))
				ERR(v->loc, "bucket_mb must be > 0 and at most %d", MAX_MB);
			else
				g->bucket_mb = mb;
		}
	}
	g->sched = (DpSched){.kind = DP_SCHED_CONSTANT, .steps = c->steps};
	if (set[T_SCHEDULE])
		lower_schedule(L, &set[T_SCHEDULE]->val);

	/* batch: micro_batch, or global_batch split over grad_accum and the dp axes */
	int ok = 1;
	if (set[T_GRAD_ACCUM]) {
		if (want_int(L, &set[T_GRAD_ACCUM]->val, "grad_accum", 1, 1 << 20, &x))
			ok = 0;
		else
			c->grad_accum = (uint32_t)x;
	}
	const Stmt *mb = set[T_MICRO_BATCH], *gb = set[T_GLOBAL_BATCH];
	if (mb && gb) {
		ERR((later(mb->name_loc, gb->name_loc) ? mb : gb)->name_loc,
		    "set micro_batch or global_batch, not both");
		return;
	}
	if (!mb && !gb) {
		ERR(L->train->name_loc, "the train section must set micro_batch or global_batch");
		return;
	}
	if (!ok || !L->mesh_ok)
		return; /* the batch arithmetic would only repeat an earlier error */
	int64_t dp = (int64_t)c->grad_accum * c->mesh[DP_AXIS_REPLICATE] * c->mesh[DP_AXIS_SHARD];
	if (mb) {
		if (want_int(L, &mb->val, "micro_batch", 1, INT32_MAX, &x))
			return;
		if (__builtin_mul_overflow(x, dp, &L->global_batch) || L->global_batch > MAX_ELEMS) {
			ERR(mb->val.loc, "the global batch (micro_batch * grad_accum * dp ranks) is too large");
			return;
		}
	} else {
		if (want_int(L, &gb->val, "global_batch", 1, MAX_ELEMS, &x))
			return;
		if (x % dp != 0) {
			ERR(gb->val.loc,
			    "global_batch %lld is not divisible by grad_accum * dp_replicate * dp_shard = %lld",
			    (long long)x, (long long)dp);
			return;
		}
		if (x / dp > INT32_MAX) {
			ERR(gb->val.loc, "global_batch %lld gives a micro-batch that is too large",
			    (long long)x);
			return;
		}
		L->global_batch = x;
		x /= dp;
	}
	c->micro_batch = (uint32_t)x;
	c->eval_batch = c->micro_batch;
	L->batch_ok = 1;
}

/* ---- types, data sources, initialisers ---- */

/* A declared type: dtype and dims. Data: the first dim is `batch` (dims[0] is
 * left 0 for the caller), the rest positive. Params: f32, all dims positive. */
static int lower_type(Lower *L, const AstType *t, const char *what, const char *name,
		      int is_data, DpDtype *dt, int *ndim, int64_t *dims)
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
	for (const Arg *a = t->dims; a; a = a->next, i++) {
		const AstVal *v = &a->val;
		int is_batch = v->kind == V_IDENT && strcmp(v->s, "batch") == 0;
		dims[i] = 0;
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
		} else if (want_int(L, v, "a dimension", 1, MAX_ELEMS, &dims[i])) {
			rc = -1;
		} else if (__builtin_mul_overflow(numel, dims[i], &numel) || numel > MAX_ELEMS) {
			ERR(v->loc, "%s '%s' is too large (more than 2^40 elements)", what, name);
			return -1;
		}
	}
	*ndim = t->ndims;
	return rc;
}

/* Fill s->rec.kind, synth_n/classes and s->path from a source spec. */
static int lower_source(Lower *L, const AstVal *v, Source *s)
{
	if (!is_spec(v)) {
		ERR(v->loc, "expected a data source: idx(\"file\"), npy(\"file\") or "
			    "synthetic(n=N, classes=C)");
		return -1;
	}
	int is_idx = strcmp(v->s, "idx") == 0;
	if (is_idx || strcmp(v->s, "npy") == 0) {
		if (v->nargs != 1 || v->args->key || v->args->val.kind != V_STRING) {
			ERR(v->loc, "%s() takes one file path string, like %s(\"file\")", v->s, v->s);
			return -1;
		}
		if (!v->args->val.s[0]) {
			ERR(v->args->val.loc, "empty file path");
			return -1;
		}
		s->rec.kind = is_idx ? DP_SRC_IDX : DP_SRC_NPY;
		s->path = v->args->val.s;
		return 0;
	}
	if (strcmp(v->s, "synthetic") == 0) {
		static const char *const keys[] = {"n", "classes"};
		const Arg *a[2];
		int64_t n = 1024, classes = 10;
		if (get_kwargs(L, v, keys, 2, a) ||
		    (a[0] && want_int(L, &a[0]->val, "n", 1, INT32_MAX, &n)) ||
		    (a[1] && want_int(L, &a[1]->val, "classes", 1, INT32_MAX, &classes)))
			return -1;
		s->rec.kind = DP_SRC_SYNTHETIC;
		s->rec.synth_n = n;
		s->rec.synth_classes = (int32_t)classes;
		s->path = "";
		return 0;
	}
	ERR(v->loc, "unknown data source '%s' (sources: idx, npy, synthetic)", v->s);
	return -1;
}

/* ---- data and eval ---- */

static void lower_data(Lower *L)
{
	Graph *g = L->g;
	for (const Stmt *s = L->data->body; s; s = s->next) {
		if (s->kind != S_DECL) {
			ERR(s->loc, "expected a data declaration, like x: f32[batch, 784] from idx(\"file\")");
			continue;
		}
		if (find_sym(L, s->name)) {
			ERR(s->name_loc, "duplicate data '%s'", s->name);
			continue;
		}
		DpDtype dt;
		int nd = 0;
		int64_t dims[DP_MAX_DIMS] = {0};
		Source src = {0};
		if (lower_type(L, &s->type, "data", s->name, 1, &dt, &nd, dims) ||
		    lower_source(L, &s->val, &src) || !L->batch_ok) {
			add_sym(L, s->name, -1, 1);
			continue;
		}
		int64_t sample = 1, batch_elems;
		for (int i = 1; i < nd; i++)
			sample *= dims[i]; /* at most MAX_ELEMS: lower_type checked */
		if (__builtin_mul_overflow(sample, (int64_t)g->cfg.micro_batch, &batch_elems) ||
		    batch_elems > MAX_ELEMS) {
			ERR(s->name_loc, "a micro-batch of data '%s' is too large", s->name);
			add_sym(L, s->name, -1, 1);
			continue;
		}
		dims[0] = g->cfg.micro_batch;
		Value *v = ir_value(g, s->name, dt, nd, dims, DP_T_DATA, gloc(L, s->name_loc));
		src.rec.split = DP_SPLIT_TRAIN;
		src.rec.role = dt == DP_I32;
		src.rec.sample_elems = sample;
		src.rec.src_line = (uint32_t)s->val.loc.line;
		src.value = v->id;
		src.loc = gloc(L, s->val.loc);
		v->source = ir_add_source(g, &src);
		Node *n = ir_node(g, DPK_LOAD, v->id, 0, NULL, PH_DATA, src.loc);
		n->ia[0] = v->source;
		n->progs = IR_IN_STEP;
		add_sym(L, s->name, v->id, 1);
	}
}

static void lower_eval(Lower *L)
{
	Graph *g = L->g;
	const Stmt *every = NULL;
	const Stmt **given = ast_alloc(L->ps, sizeof(Stmt *) * (size_t)(L->nsyms + 1));
	for (const Stmt *s = L->eval->body; s; s = s->next) {
		if (s->kind == S_SETTING && strcmp(s->name, "every") == 0 && s->has_val) {
			int64_t x;
			if (every)
				ERR(s->name_loc, "duplicate eval setting 'every'");
			else if (!want_int(L, &s->val, "every", 0, INT32_MAX, &x))
				g->cfg.eval_every = (uint32_t)x;
			every = s;
			continue;
		}
		if (s->kind == S_SETTING) {
			ERR(s->name_loc, "unknown eval setting '%s' (only 'every N')", s->name);
			continue;
		}
		if (s->kind != S_SOURCE) {
			ERR(s->loc, "expected 'name from source' or 'every N' in the eval section");
			continue;
		}
		Sym *sym = find_sym(L, s->name);
		if (!sym || !sym->is_data) {
			ERR(s->name_loc, "eval name '%s' is not declared in data", s->name);
			continue;
		}
		int i = (int)(sym - L->syms);
		if (given[i]) {
			ERR(s->name_loc, "duplicate eval source '%s'", s->name);
			continue;
		}
		given[i] = s;
		Source src = {0};
		if (lower_source(L, &s->val, &src) || sym->value < 0)
			continue;
		Value *v = g->values[sym->value];
		src.rec.split = DP_SPLIT_EVAL;
		src.rec.role = v->dtype == DP_I32;
		src.rec.sample_elems = g->sources[v->source].rec.sample_elems;
		src.rec.src_line = (uint32_t)s->val.loc.line;
		src.value = v->id;
		src.loc = gloc(L, s->val.loc);
		int si = ir_add_source(g, &src);
		Node *n = ir_node(g, DPK_LOAD, v->id, 0, NULL, PH_DATA, src.loc);
		n->ia[0] = si;
		n->progs = IR_IN_EVAL;
	}
	for (int i = 0; i < L->nsyms; i++)
		if (L->syms[i].is_data && !given[i])
			ERR(L->eval->name_loc, "the eval section has no source for data '%s'",
			    L->syms[i].name);
}

/* ---- model ---- */

static const struct {
	const char *name;
	IrOp op;
	int min_args, max_args;
} ops[] = {
	{"linear", DPK_LINEAR, 2, 3},
	{"matmul", DPK_MATMUL, 2, 2},
	{"add", DPK_ADD, 2, 2},
	{"mul", DPK_MUL, 2, 2},
	{"relu", DPK_RELU, 1, 1},
	{"gelu", DPK_GELU, 1, 1},
	{"tanh", DPK_TANH, 1, 1},
	{"cross_entropy", DPK_XENT, 2, 2},
};

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
	if (is_buffer && p->flag && strcmp(p->flag, "nosync") != 0) {
		ERR(p->flag_loc, "unexpected '%s' after buffer '%s' (only 'nosync' may follow)",
		    p->flag, p->name);
		add_sym(L, name, -1, 0);
		return;
	}
	if (lower_type(L, &p->type, what, p->name, 0, &dt, &nd, dims)) {
		add_sym(L, name, -1, 0);
		return;
	}
	DpInit init = DP_INIT_ZEROS;
	float a = 0, b = 0;
	if (p->has_val) {
		const AstVal *v = &p->val;
		if (!is_spec(v)) {
			ERR(v->loc, "expected an initialiser: normal(mean, std), uniform(low, high), "
				    "zeros or ones");
			goto poison;
		}
		int two = strcmp(v->s, "normal") == 0 || strcmp(v->s, "uniform") == 0;
		if (strcmp(v->s, "zeros") == 0 || strcmp(v->s, "ones") == 0) {
			if (v->nargs) {
				ERR(v->loc, "'%s' takes no arguments", v->s);
				goto poison;
			}
			init = v->s[0] == 'z' ? DP_INIT_ZEROS : DP_INIT_ONES;
		} else if (two) {
			int normal = v->s[0] == 'n';
			if (v->nargs != 2 || v->args->key || v->args->next->key) {
				ERR(v->loc, "'%s' takes two numbers: %s", v->s,
				    normal ? "normal(mean, std)" : "uniform(low, high)");
				goto poison;
			}
			if (want_float(L, &v->args->val, normal ? "mean" : "low", &a) ||
			    want_float(L, &v->args->next->val, normal ? "std" : "high", &b))
				goto poison;
			if (normal && b < 0) {
				ERR(v->args->next->val.loc, "std must be >= 0");
				goto poison;
			}
			if (!normal && b < a) {
				ERR(v->args->next->val.loc, "uniform's high must be >= low");
				goto poison;
			}
			init = normal ? DP_INIT_NORMAL : DP_INIT_UNIFORM;
		} else {
			ERR(v->loc, "unknown initialiser '%s' (normal, uniform, zeros, ones)", v->s);
			goto poison;
		}
	}
	Value *v = ir_value(g, name, dt, nd, dims, is_buffer ? DP_T_BUFFER : DP_T_PARAM,
			    gloc(L, p->name_loc));
	v->init = init;
	v->init_a = a;
	v->init_b = b;
	v->block = block;
	return;
poison:
	add_sym(L, name, -1, 0);
}

/* Blocks and params first, so `block.param` may be used anywhere. */
static void declare_model(Lower *L)
{
	Graph *g = L->g;
	for (Stmt *s = L->model->body; s; s = s->next) {
		switch (s->kind) {
		case S_ASSIGN:
			add_target(L, s->name);
			break;
		case S_BLOCK:
			if (find_block(L, s->name) >= 0) {
				ERR(s->name_loc, "duplicate block '%s'", s->name);
				break;
			}
			s->index = ir_add_block(g, s->name, gloc(L, s->name_loc));
			for (const Stmt *p = s->body; p; p = p->next) {
				if (p->kind == S_PARAM || p->kind == S_BUFFER)
					declare_param(L, p, s->index);
				else if (p->kind == S_ASSIGN)
					add_target(L, p->name);
				else if (p->kind == S_BLOCK)
					ERR(p->loc, "blocks cannot be nested");
				else
					ERR(p->loc, "expected a param, a buffer or an assignment in "
						    "block '%s'", s->name);
			}
			break;
		case S_PARAM:
		case S_BUFFER:
			ERR(s->loc, "%s '%s' must be inside a block",
			    s->kind == S_PARAM ? "param" : "buffer", s->name);
			break;
		default:
			ERR(s->loc, "expected an assignment or a block in the model section");
			break;
		}
	}
}

static int lower_call(Lower *L, const Expr *e, int block, const char *target);

/* The value an expression denotes, or -1 (after an error, or for a name whose
 * definition failed: that was reported already). */
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
		Sym *s = find_sym(L, e->name);
		if (s)
			return s->value;
		if (is_target(L, e->name))
			ERR(e->loc, "'%s' is used before it is assigned", e->name);
		else
			ERR(e->loc, "unknown identifier '%s'", e->name);
		return -1;
	}
	}
	die("bad expression kind %d", (int)e->kind);
}

/* Lower the arguments of a call into in[] (the first max_args, at most
 * DP_MAX_IN, are kept and type-checked: f32, but i32 at index labels_at).
 * Returns the number of failures. */
static int lower_args(Lower *L, const Expr *e, int block, int *in, int labels_at, int max_args)
{
	int bad = 0, i = 0;
	for (const Expr *a = e->args; a; a = a->next, i++) {
		int id = lower_expr(L, a, block);
		if (id < 0) {
			bad++;
			continue;
		}
		if (i >= max_args)
			continue; /* the arity error covers it */
		in[i] = id;
		const Value *v = L->g->values[id];
		DpDtype want = i == labels_at ? DP_I32 : DP_F32;
		if (v->dtype != want) {
			ERR(a->loc, "argument %d of '%s' must be %s, but '%s' is %s", i + 1, e->name,
			    ir_dtype_name(want), v->name, ir_dtype_name(v->dtype));
			bad++;
		}
	}
	return bad;
}

static int check_arity(Lower *L, const Expr *e, int min, int max)
{
	if (e->nargs >= min && e->nargs <= max)
		return 0;
	if (min == max)
		ERR(e->loc, "'%s' takes %d argument%s, got %d", e->name, min, min == 1 ? "" : "s",
		    e->nargs);
	else
		ERR(e->loc, "'%s' takes %d to %d arguments, got %d", e->name, min, max, e->nargs);
	return -1;
}

static int lower_call(Lower *L, const Expr *e, int block, const char *target)
{
	Graph *g = L->g;
	size_t k = 0;
	while (k < sizeof ops / sizeof ops[0] && strcmp(ops[k].name, e->name) != 0)
		k++;
	int in[DP_MAX_IN] = {0};
	if (k == sizeof ops / sizeof ops[0]) {
		ERR(e->loc, "unknown op '%s'", e->name);
		lower_args(L, e, block, in, -1, 0); /* report errors inside it too */
		return -1;
	}
	if (ops[k].op == DPK_XENT) {
		ERR(e->loc, "cross_entropy must be assigned directly, like loss = cross_entropy(logits, y)");
		return -1;
	}
	int bad = check_arity(L, e, ops[k].min_args, ops[k].max_args) != 0;
	bad += lower_args(L, e, block, in, -1, ops[k].max_args);
	if (bad)
		return -1;
	Loc loc = gloc(L, e->loc);
	Value *v = ir_value(g, target ? target : fresh_temp(L), DP_F32, 0, NULL, DP_T_ACT, loc);
	Node *n = ir_node(g, ops[k].op, v->id, e->nargs, in, PH_FWD, loc);
	n->progs = IR_IN_STEP | IR_IN_EVAL;
	n->block = block;
	v->def = n->id;
	return v->id;
}

static Value *metric(Lower *L, const char *stem, int64_t n, Loc loc)
{
	int64_t dims[1] = {n};
	return ir_value(L->g, ir_fresh_name(L->g, stem), DP_F32, 1, dims, DP_T_METRIC, loc);
}

/* target = cross_entropy(logits, labels): the training loss and its metrics. */
static int lower_loss(Lower *L, const Stmt *s, int block)
{
	Graph *g = L->g;
	const Expr *e = s->expr;
	if (L->loss_seen) {
		ERR(e->loc, "more than one cross_entropy loss (the first is on line %d)",
		    L->loss_loc.line);
		return -1;
	}
	L->loss_seen = 1;
	L->loss_loc = e->loc;
	int in[DP_MAX_IN] = {0};
	int bad = check_arity(L, e, 2, 2) != 0;
	bad += lower_args(L, e, block, in, 1, 2);
	if (bad || !L->batch_ok)
		return -1;
	Loc loc = gloc(L, e->loc);
	Value *loss = ir_value(g, s->name, DP_F32, 0, NULL, DP_T_ACT, loc);
	Node *n = ir_node(g, DPK_XENT, loss->id, 2, in, PH_FWD, loc);
	n->fa[0] = 1.0f / (float)L->global_batch; /* the loss is the global-batch mean */
	n->progs = IR_IN_STEP;
	n->block = block;
	loss->def = n->id;
	g->loss = loss->id;
	g->logits = in[0];
	g->labels = in[1];

	Value *sum = metric(L, "loss.sum", 1, loc);
	n = ir_node(g, DPK_ACCUM, sum->id, 1, &loss->id, PH_FWD, loc);
	n->progs = IR_IN_STEP;
	g->metrics.loss = sum->id;
	if (L->eval) {
		Value *el = metric(L, "eval.loss", 1, loc);
		n = ir_node(g, DPK_XENT, el->id, 2, in, PH_EVAL, loc);
		n->fa[0] = 1.0f; /* a sum: the runtime divides by the samples counted */
		n->progs = IR_IN_EVAL;
		Value *ec = metric(L, "eval.correct", 2, loc);
		n = ir_node(g, DPK_CORRECT, ec->id, 2, in, PH_EVAL, loc);
		n->progs = IR_IN_EVAL;
		g->metrics.eval_loss = el->id;
		g->metrics.eval_correct = ec->id;
	}
	return loss->id;
}

static void lower_assign(Lower *L, const Stmt *s, int block)
{
	if (find_sym(L, s->name)) {
		ERR(s->name_loc, "'%s' is already defined (a name is assigned once)", s->name);
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
		ERR(e->loc, "the right-hand side must be an op call, like relu(%s)", e->name);
	else if (e->depth <= AST_MAX_DEPTH) /* deeper ones were reported by the scanner */
		id = strcmp(e->name, "cross_entropy") == 0 ? lower_loss(L, s, block)
							   : lower_call(L, e, block, s->name);
	add_sym(L, s->name, id, 0);
}

static void lower_model(Lower *L)
{
	declare_model(L);
	for (const Stmt *s = L->model->body; s; s = s->next) {
		if (s->kind == S_ASSIGN)
			lower_assign(L, s, -1);
		else if (s->kind == S_BLOCK) {
			for (const Stmt *p = s->body; p; p = p->next) {
				if (p->kind == S_ASSIGN && s->index >= 0)
					lower_assign(L, p, s->index);
				else if (p->kind == S_ASSIGN && !find_sym(L, p->name))
					add_sym(L, p->name, -1, 0); /* a duplicate block: quiet */
			}
		}
	}
	if (!L->loss_seen)
		ERR(L->model->name_loc,
		    "the model has no loss: assign one, like loss = cross_entropy(logits, y)");
}

/* ---- the file ---- */

static void find_sections(Lower *L)
{
	static const char *const names[] = {"data", "eval", "model", "train"};
	const Stmt **slots[] = {&L->data, &L->eval, &L->model, &L->train};
	for (const Stmt *s = L->ps->top; s; s = s->next) {
		if (s->kind == S_SETTING && strcmp(s->name, "mesh") == 0) {
			if (L->mesh)
				ERR(s->name_loc, "duplicate mesh statement");
			else
				L->mesh = s;
			continue;
		}
		if (s->kind != S_SECTION) {
			static const char *const where[] = { /* ORDER S_ */
				"an assignment belongs in the model section",
				"a data declaration belongs in the data section",
				"'name from source' belongs in the eval section",
				"a param belongs in a block of the model section",
				"unknown top-level statement (expected mesh, data, eval, model or train)",
				"",
				"a block belongs in the model section",
				"a buffer belongs in a block of the model section",
			};
			ERR(s->loc, "%s", where[s->kind]);
			continue;
		}
		size_t k = 0;
		while (k < 4 && strcmp(names[k], s->name) != 0)
			k++;
		if (k == 4)
			ERR(s->name_loc, "unknown section '%s' (sections: data, eval, model, train)",
			    s->name);
		else if (*slots[k])
			ERR(s->name_loc, "duplicate '%s' section", s->name);
		else
			*slots[k] = s;
	}
}

Graph *ast_lower(ParseState *ps, int world_size)
{
	Lower lw = {.ps = ps, .d = ps->d, .world_size = world_size, .top = {ps->file, 1, 1}};
	Lower *L = &lw;
	L->g = ir_new(ps->file);
	find_sections(L);
	lower_mesh(L);
	lower_train(L);
	if (!L->data)
		ERR(L->top, "missing 'data' section");
	else
		lower_data(L);
	if (L->eval && L->data)
		lower_eval(L);
	if (!L->model)
		ERR(L->top, "missing 'model' section");
	else if (L->data)
		lower_model(L);
	if (L->nerrs == 0)
		return L->g;
	qsort(L->errs, (size_t)L->nerrs, sizeof(Pending), pending_cmp);
	for (int i = 0; i < L->nerrs; i++)
		error_at(L->d, L->errs[i].loc, "%s", L->errs[i].msg);
	ir_free(L->g);
	return NULL;
}

/* Read a whole file; NULL with errno set on failure. */
static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
		fclose(f);
		errno = EISDIR;
		return NULL;
	}
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	if (!buf)
		die("out of memory");
	for (;;) {
		if (n == cap) {
			if (cap >= MAX_FILE_BYTES) {
				free(buf);
				fclose(f);
				errno = EFBIG;
				return NULL;
			}
			cap *= 2;
			char *nb = realloc(buf, cap);
			if (!nb)
				die("out of memory");
			buf = nb;
		}
		size_t got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	int err = ferror(f) ? (errno ? errno : EIO) : 0;
	fclose(f);
	if (err) {
		free(buf);
		errno = err;
		return NULL;
	}
	*len = n;
	return buf;
}

Graph *fe_compile(const char *path, int world_size, Diag *d, char **src_out)
{
	if (src_out)
		*src_out = NULL;
	int errors0 = d->nerrors;
	size_t len = 0;
	errno = 0;
	char *raw = read_file(path, &len);
	if (!raw) {
		error_at(d, (Loc){path, 0, 0}, "cannot open '%s': %s", path, strerror(errno));
		return NULL;
	}
	/* The quoted text for diagnostics is a C string: NUL bytes become blanks
	 * there, while the scanner sees the bytes as they are. */
	char *text = malloc(len + 1);
	if (!text)
		die("out of memory");
	for (size_t i = 0; i < len; i++)
		text[i] = raw[i] ? raw[i] : ' ';
	text[len] = '\0';
	d->file = path;
	d->src = text;

	ParseState ps = {.d = d, .file = path};
	Graph *g = NULL;
	if (ast_parse(&ps, raw, len) == 0)
		g = ast_lower(&ps, world_size);
	ast_free(&ps);
	free(raw);
	if (d->nerrors > errors0) {
		ir_free(g);
		g = NULL;
	}
	if (src_out) {
		*src_out = text;
	} else {
		d->src = NULL;
		free(text);
	}
	return g;
}
