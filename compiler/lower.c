/*
 * lower.c - semantic checks of the syntax tree and its lowering to the graph
 * IR (the sections other than model, which is compiler/model.c); fe_compile,
 * the front end's entry point.
 *
 * Before: a tree from compiler/parser.y that parsed without errors (a file
 * with syntax errors is not lowered: its half-statements would only produce
 * misleading follow-on errors).
 *
 * After (when no error was reported), the Graph holds:
 *   - cfg (mesh, micro_batch, grad_accum, eval_batch, steps, eval_every,
 *     log_every, seed, strategy, save_every, keep_last), opt, sched, strategy (its name), bucket_mb,
 *     reshard_after_forward, prefetch, gather_limit_mb, accum_unsharded;
 *   - per data declaration a DP_T_DATA value [micro_batch, ...], its train
 *     Source and a LOAD node (IR_IN_STEP); per eval source an eval Source for
 *     the same value and a LOAD node (IR_IN_EVAL); all LOAD nodes first;
 *   - the model (see compiler/model.c).
 *
 * Every data file the declarations name is checked here when this machine
 * can open it, headers only (util/datafile.h, as dpexec checks it): what it
 * holds against the declaration, and equal sample counts per split; a file
 * it cannot open is a warning, since the job may run elsewhere.
 *
 * Sections are checked in dependency order, not file order: config (every
 * number may use its constants), mesh, train (batch sizes need the mesh),
 * data (shapes need micro_batch), eval, model. Numbers are constant
 * expressions (compiler/consts.c), evaluated where they are used.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "datafile.h"
#include "lower.h"
#include "suggest.h"

#define MAX_AXIS (1 << 15)           /* size of one mesh axis (4 axes: the product fits int64) */
#define MAX_WORLD (1 << 24)          /* ranks */
#define MAX_FILE_BYTES (64u << 20)   /* source files larger than this are refused */

static int later(Loc a, Loc b)
{
	return a.line > b.line || (a.line == b.line && a.col > b.col);
}

/* A V_IDENT or V_CALL naming a spec (optimizer, schedule, source, init). */
static int is_spec(const AstVal *v)
{
	return v->kind == V_IDENT || v->kind == V_CALL;
}

/* ---- mesh ---- */

/* dpc --tp/--cp/--dp-replicate apply to `mesh auto` only: an explicit mesh
 * says its axes itself. 1 after reporting when one is given. */
static int mesh_flags_given(Lower *L, Loc loc)
{
	const FeOptions *o = L->opts;
	if (!o || (o->tp <= 1 && o->cp <= 1 && o->dp_replicate <= 1))
		return 0;
	ERR(loc, "dpc --tp, --cp and --dp-replicate size the axes of `mesh auto`; this mesh "
		 "statement sets its axes itself (write them there)");
	return 1;
}

/* `mesh auto` on `world` ranks: tp, cp and dp_replicate from dpc's flags (1
 * when not given), in the seeds' order, and dp_shard takes the rest. */
static void mesh_auto(Lower *L, Loc loc, int world)
{
	const FeOptions *o = L->opts;
	uint32_t *mesh = L->g->cfg.mesh;
	int64_t tp = o && o->tp > 1 ? o->tp : 1, cp = o && o->cp > 1 ? o->cp : 1;
	int64_t rep = o && o->dp_replicate > 1 ? o->dp_replicate : 1;
	int64_t fixed = tp * cp * rep; /* each flag is at most 2^20 */
	if (fixed > world || world % fixed != 0) {
		ERR(loc, "mesh auto: world size %d is not divisible by tp=%lld x cp=%lld x "
			 "dp_replicate=%lld", world, (long long)tp, (long long)cp, (long long)rep);
		return;
	}
	mesh[DP_AXIS_TP] = (uint32_t)tp;
	mesh[DP_AXIS_CP] = (uint32_t)cp;
	mesh[DP_AXIS_REPLICATE] = (uint32_t)rep;
	mesh[DP_AXIS_SHARD] = (uint32_t)(world / fixed);
	L->cp_loc = loc;
	L->mesh_ok = 1;
}

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
			mesh_auto(L, L->top, world);
		else
			L->mesh_ok = !mesh_flags_given(L, L->top);
		return;
	}
	if (s->val) {
		AstVal v;
		if (eval_value(L, s->val, &v))
			return;
		if (v.kind == V_IDENT && strcmp(v.s, "auto") == 0) {
			if (world == 0) {
				ERR(v.loc, "mesh auto needs --world-size N");
				return;
			}
			mesh_auto(L, v.loc, world);
			return;
		}
		ERR(v.loc, "expected 'mesh auto' or 'mesh dp_replicate=N, dp_shard=N, ...'");
		return;
	}
	if (mesh_flags_given(L, s->name_loc))
		return;
	int64_t size[DP_MAX_AXES] = {1, 1, 1, 1};
	const Expr *given[DP_MAX_AXES] = {NULL};
	AstVal gv[DP_MAX_AXES];
	int auto_axis = -1, ok = 1;
	for (const Expr *a = s->kw; a; a = a->next) {
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
		if (eval_value(L, a, &gv[ax])) {
			ok = 0;
			continue;
		}
		if (gv[ax].kind == V_IDENT && strcmp(gv[ax].s, "auto") == 0) {
			if (auto_axis >= 0) {
				ERR(gv[ax].loc, "only one mesh axis can be auto");
				ok = 0;
			}
			auto_axis = ax;
			continue;
		}
		if (want_int(L, &gv[ax], a->key, 1, MAX_AXIS, &size[ax]))
			ok = 0;
	}
	if (!ok)
		return;
	int64_t fixed = 1;
	for (int ax = 0; ax < DP_MAX_AXES; ax++)
		if (ax != auto_axis)
			fixed *= size[ax]; /* at most 2^60: each axis is at most 2^15 */
	if (auto_axis >= 0) {
		const AstVal *a = &gv[auto_axis];
		if (world == 0) {
			ERR(a->loc, "mesh axis '%s=auto' needs --world-size N", given[auto_axis]->key);
			return;
		}
		if (fixed > world || world % fixed != 0) {
			ERR(a->loc, "world size %d is not divisible by the fixed mesh axes (%lld)",
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
	/* tp > 1 is tensor parallelism (passes/tp.c), cp > 1 context parallelism
	 * (passes/cp.c); the global batch counts neither: the ranks of a tp or cp
	 * group share their samples */
	L->cp_loc = given[DP_AXIS_CP] ? gv[DP_AXIS_CP].loc : s->name_loc;
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
	T_GRADIENT_CHECKPOINTING,
	T_SAVE_EVERY,
	T_KEEP_LAST,
	T_PRECISION,
	T_PARAM_DTYPE,
	T_REDUCE_DTYPE,
	T_BUFFER_DTYPE,
	T_COUNT
};

static const char *const train_keys[T_COUNT] = { /* ORDER T_ */
	"strategy", "optimizer", "schedule", "micro_batch", "global_batch", "grad_accum",
	"clip_grad_norm", "bucket_mb", "seed", "steps", "log_every", "reshard_after_forward",
	"prefetch", "gather_limit_mb", "accumulate_grads", "gradient_checkpointing", "save_every",
	"keep_last", "precision", "param_dtype", "reduce_dtype", "buffer_dtype",
};

#define MAX_PREFETCH 64  /* blocks an all_gather may run ahead */
#define MAX_MB (1 << 20) /* bucket_mb and gather_limit_mb: 1 TiB */

/* A strategy name (dp_strategy_names) into g->strategy and cfg.strategy.
 * Whether the mesh suits it is checked with the mesh (lower_train). */
static void lower_strategy(Lower *L, const AstVal *v)
{
	int s = lower_strategy_word(L, v);
	if (s < 0)
		return;
	snprintf(L->g->strategy, sizeof L->g->strategy, "%s", dp_strategy_names[s]);
	L->g->cfg.strategy = (uint32_t)s;
}

/* The settings of the sharded strategies. They are accepted with every
 * strategy (a file can switch strategy by one word); which strategies read
 * them is documented in docs/DSL.md. */
static void lower_shard_settings(Lower *L, const AstVal *const *val)
{
	Graph *g = L->g;
	int64_t x;
	if (val[T_RESHARD]) {
		int w = want_word(L, val[T_RESHARD], "reshard_after_forward", "true", "false");
		if (w >= 0)
			g->reshard_after_forward = w == 0;
	}
	if (val[T_PREFETCH] &&
	    !want_int(L, val[T_PREFETCH], "prefetch", 0, MAX_PREFETCH, &x))
		g->prefetch = (int)x;
	if (val[T_GATHER_LIMIT_MB]) {
		const AstVal *v = val[T_GATHER_LIMIT_MB];
		float mb;
		if (!want_float(L, v, "gather_limit_mb", &mb)) {
			if (!(mb >= 0 && mb <= MAX_MB))
				ERR(v->loc, "gather_limit_mb must be >= 0 (0: no limit) and at most %d",
				    MAX_MB);
			else
				g->gather_limit_mb = mb;
		}
	}
	if (val[T_ACCUMULATE_GRADS]) {
		int w = want_word(L, val[T_ACCUMULATE_GRADS], "accumulate_grads", "sharded",
				  "unsharded");
		if (w >= 0)
			g->accum_unsharded = w;
	}
}

/* Mixed precision (passes/precision.c). `precision D` is the short form of
 * param_dtype D and buffer_dtype D; the gradients are reduced in f32 unless
 * reduce_dtype says bf16 (torchtitan's default, FSDP's MixedPrecision
 * names). Master weights and optimizer state are always f32. */
static void lower_precision(Lower *L, const AstVal *const *val)
{
	Graph *g = L->g;
	/* precision tf32: f32 dtypes, and a GPU may run the f32 GEMMs on TF32
	 * tensor cores (cfg.gemm_math); f32 and bf16 are dtypes */
	const AstVal *pv = val[T_PRECISION];
	int tf32 = pv && pv->kind == V_IDENT && strcmp(pv->s, "tf32") == 0;
	int prec = tf32 ? DP_F32 : -1;
	if (pv && !tf32) {
		int ok = pv->kind == V_IDENT && (strcmp(pv->s, "f32") == 0 ||
						 strcmp(pv->s, "fp32") == 0 || strcmp(pv->s, "bf16") == 0);
		if (ok)
			prec = lower_dtype_word(L, pv, "precision");
		else
			ERR(pv->loc, "precision must be f32, tf32 or bf16");
	}
	if (L->opts && L->opts->precision) { /* dpc --precision: as if the file said it */
		tf32 = strcmp(L->opts->precision, "tf32") == 0;
		prec = strcmp(L->opts->precision, "bf16") == 0 ? DP_BF16 : DP_F32;
	}
	g->cfg.gemm_math = tf32 ? DP_GEMM_TF32 : DP_GEMM_F32;
	int pd = val[T_PARAM_DTYPE] ? lower_dtype_word(L, val[T_PARAM_DTYPE], "param_dtype") : -1;
	int bd = val[T_BUFFER_DTYPE] ? lower_dtype_word(L, val[T_BUFFER_DTYPE], "buffer_dtype") : -1;
	int rd = val[T_REDUCE_DTYPE] ? lower_dtype_word(L, val[T_REDUCE_DTYPE], "reduce_dtype") : -1;
	if (prec >= 0 && pd >= 0 && pd != prec)
		ERR(val[T_PARAM_DTYPE]->loc, "param_dtype %s contradicts precision %s",
		    dp_dtype_names[pd], dp_dtype_names[prec]);
	g->param_dtype = pd >= 0 ? pd : prec >= 0 ? prec : DP_F32;
	g->buffer_dtype = bd >= 0 ? bd : prec >= 0 ? prec : DP_F32;
	if (rd == DP_BF16 && g->param_dtype == DP_F32) {
		ERR(val[T_REDUCE_DTYPE]->loc,
		    "reduce_dtype bf16 is narrower than param_dtype f32: the f32 gradients would be "
		    "rounded to bf16 (set precision bf16, or reduce in f32)");
		rd = DP_F32;
	}
	g->reduce_dtype = rd >= 0 ? rd : DP_F32;
	/* where the file asks for bf16, for a backend that cannot (cfg.bf16_line);
	 * dpc --precision bf16 is no place in the file */
	const AstVal *asks[] = {L->opts && L->opts->precision ? NULL : pv, val[T_PARAM_DTYPE],
				val[T_BUFFER_DTYPE], val[T_REDUCE_DTYPE]};
	for (int i = 0; i < 4; i++)
		if (asks[i] && asks[i]->kind == V_IDENT && strcmp(asks[i]->s, "bf16") == 0) {
			lower_note_bf16(L, asks[i]->loc);
			break;
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
	AstVal vals[T_COUNT];
	const AstVal *val[T_COUNT] = {NULL}; /* the evaluated values; NULL after an error */
	int64_t x;
	int ok = 1;

	/* unset settings keep ir_new's defaults */
	L->batch_ok = 0;
	L->global_batch = 1;
	if (!L->train) {
		ERR(L->top, "missing 'train' section (it must set micro_batch or global_batch)");
		return;
	}
	for (const Stmt *s = L->train->body; s; s = s->next) {
		if (s->kind != S_SETTING || !s->val) {
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
		else {
			set[k] = s;
			if (eval_value(L, s->val, &vals[k]) == 0)
				val[k] = &vals[k];
			else
				ok = 0;
		}
	}
	if (val[T_STEPS] && !want_int(L, val[T_STEPS], "steps", 1, INT32_MAX, &x))
		c->steps = (uint32_t)x;
	if (val[T_LOG_EVERY] && !want_int(L, val[T_LOG_EVERY], "log_every", 1, INT32_MAX, &x))
		c->log_every = (uint32_t)x;
	if (val[T_SEED] && !want_int(L, val[T_SEED], "seed", 0, INT64_MAX, &x))
		c->seed = (uint64_t)x;
	if (val[T_SAVE_EVERY] && !want_int(L, val[T_SAVE_EVERY], "save_every", 1, INT32_MAX, &x))
		c->save_every = (uint32_t)x;
	if (val[T_KEEP_LAST] && !want_int(L, val[T_KEEP_LAST], "keep_last", 1, INT32_MAX, &x))
		c->keep_last = (uint32_t)x;
	if (val[T_STRATEGY]) {
		lower_strategy(L, val[T_STRATEGY]);
		char why[160];
		if (L->mesh_ok && !ir_strategy_fits(g, (int)c->strategy, why, sizeof why))
			ERR(val[T_STRATEGY]->loc, "%s", why);
	}
	lower_shard_settings(L, val);
	lower_precision(L, val);
	if (val[T_GRADIENT_CHECKPOINTING]) {
		int w = want_word(L, val[T_GRADIENT_CHECKPOINTING], "gradient_checkpointing", "true",
				  "false");
		L->grad_ckpt = w == 0;
	}
	if (val[T_OPTIMIZER])
		lower_optimizer(L, val[T_OPTIMIZER]);
	if (val[T_CLIP_GRAD_NORM]) {
		const AstVal *v = val[T_CLIP_GRAD_NORM];
		if (!want_float(L, v, "clip_grad_norm", &g->opt.clip) && g->opt.clip < 0)
			ERR(v->loc, "clip_grad_norm must be >= 0 (0 turns clipping off)");
	}
	if (val[T_BUCKET_MB]) {
		const AstVal *v = val[T_BUCKET_MB];
		float mb;
		if (!want_float(L, v, "bucket_mb", &mb)) {
			if (!(mb > 0 && mb <= MAX_MB))
				ERR(v->loc, "bucket_mb must be > 0 and at most %d", MAX_MB);
			else
				g->bucket_mb = mb;
		}
	}
	g->sched = (DpSched){.kind = DP_SCHED_CONSTANT, .steps = c->steps};
	if (val[T_SCHEDULE])
		lower_schedule(L, val[T_SCHEDULE]);

	/* batch: micro_batch, or global_batch split over grad_accum and the dp axes */
	if (val[T_GRAD_ACCUM]) {
		if (want_int(L, val[T_GRAD_ACCUM], "grad_accum", 1, 1 << 20, &x))
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
		if (want_int(L, val[T_MICRO_BATCH], "micro_batch", 1, INT32_MAX, &x))
			return;
		if (__builtin_mul_overflow(x, dp, &L->global_batch) || L->global_batch > MAX_ELEMS) {
			ERR(val[T_MICRO_BATCH]->loc,
			    "the global batch (micro_batch * grad_accum * dp ranks) is too large");
			return;
		}
	} else {
		if (want_int(L, val[T_GLOBAL_BATCH], "global_batch", 1, MAX_ELEMS, &x))
			return;
		if (x % dp != 0) {
			ERR(val[T_GLOBAL_BATCH]->loc,
			    "global_batch %lld is not divisible by grad_accum * dp_replicate * dp_shard = %lld",
			    (long long)x, (long long)dp);
			return;
		}
		if (x / dp > INT32_MAX) {
			ERR(val[T_GLOBAL_BATCH]->loc,
			    "global_batch %lld gives a micro-batch that is too large", (long long)x);
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

/* Fill s->rec.kind, synth_n/classes, shift and s->path from the source
 * expression e of data `name`, declared dt with nd dims; *path_loc: where
 * the path is written. */
static int lower_source(Lower *L, const Expr *e, const char *name, DpDtype dt, int nd,
			Source *s, Loc *path_loc)
{
	AstVal val;
	const AstVal *v = &val;
	if (eval_value(L, e, &val))
		return -1;
	if (!is_spec(v)) {
		ERR(v->loc, "expected a data source: idx(\"file\"), npy(\"file\"), tokens(\"glob\") "
			    "or synthetic(n=N, classes=C)");
		return -1;
	}
	if (strcmp(v->s, "tokens") == 0) {
		const Arg *path = v->args, *shift = NULL;
		if (!path || path->key || path->val.kind != V_STRING) {
			ERR(v->loc, "tokens() takes a file path or glob string, like "
				    "tokens(\"data/*.bin\", shift=1)");
			return -1;
		}
		if (!path->val.s[0]) {
			ERR(path->val.loc, "empty file path");
			return -1;
		}
		for (const Arg *a = path->next; a; a = a->next) {
			if (!a->key || strcmp(a->key, "shift") != 0) {
				ERR(a->key_loc, "tokens() takes a path and shift=0|1 only");
				return -1;
			}
			if (shift) {
				ERR(a->key_loc, "duplicate argument 'shift'");
				return -1;
			}
			shift = a;
		}
		int64_t sh = 0;
		if (shift && want_int(L, &shift->val, "shift", 0, 1, &sh))
			return -1;
		/* windows of T tokens: a sample is one row of T ids (nd < 0: the
		 * declaration failed and was reported) */
		if (nd >= 0 && (dt != DP_I32 || nd != 2)) {
			ERR(v->loc, "tokens() fills i32[batch, T] data, but '%s' is %s with %d "
				    "dimension%s",
			    name, ir_dtype_name(dt), nd, nd == 1 ? "" : "s");
			return -1;
		}
		s->rec.kind = DP_SRC_TOKENS;
		s->rec.shift = (uint8_t)sh;
		s->path = path->val.s;
		*path_loc = path->val.loc;
		return 0;
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
		*path_loc = v->args->val.loc;
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
	static const char *const sources[] = {"idx", "npy", "tokens", "synthetic"};
	const char *guess = suggest_among(v->s, sources, 4);
	if (guess)
		ERR(v->loc, "unknown data source '%s'; did you mean '%s'? (sources: idx, npy, tokens, "
			    "synthetic)", v->s, guess);
	else
		ERR(v->loc, "unknown data source '%s' (sources: idx, npy, tokens, synthetic)", v->s);
	return -1;
}

/* ---- data files: what dpc can see of them ---- */

/* A file this machine cannot open is a warning: the job may run elsewhere,
 * and dpexec resolves a relative path against its own working directory. */
static void not_seen(Lower *L, Loc at, const char *what, const char *path, int err)
{
	const char *where = path[0] == '/' ? "dpexec reads it where the job runs"
					   : "dpexec resolves it against its working directory where "
					     "the job runs";
	if (err == ENOENT || err == 0)
		warning_at(L->d, at, "%s %s not found from here; %s", what, path, where);
	else
		warning_at(L->d, at, "%s %s cannot be read from here (%s); %s", what, path,
			   strerror(err), where);
}

/* Every data file dpc can see must hold what its declaration says, dtype
 * and elements per sample (util/datafile.h, the checks dpexec makes at
 * load; headers only, never the data): an error at the path otherwise.
 * Token sources: the glob must match, every shard's header and size must
 * be right and hold a window of `sample` tokens. The samples the source
 * holds, or -1 when that is not known here. */
static int64_t check_data_file(Lower *L, const Source *src, Loc at, DpDtype dt, int64_t sample)
{
	char msg[1024];
	int rc = 0;
	int64_t n = -1;
	if (src->rec.kind == DP_SRC_SYNTHETIC)
		return src->rec.synth_n;
	/* the same file read the same way by an earlier declaration (x and its
	 * shift=1 targets): said there already, only counted here */
	int quiet = 0;
	for (int i = 0; i < L->g->nsources && !quiet; i++) {
		const Source *o = &L->g->sources[i];
		quiet = o->rec.kind == src->rec.kind && strcmp(o->path, src->path) == 0 &&
			L->g->values[o->value]->dtype == dt && o->rec.sample_elems == sample;
	}
	if (src->rec.kind == DP_SRC_IDX || src->rec.kind == DP_SRC_NPY) {
		errno = 0;
		gzFile gz = gzopen(src->path, "rb");
		if (!gz) {
			if (!quiet)
				not_seen(L, at, "data file", src->path, errno);
			return -1;
		}
		gzbuffer(gz, 1024); /* a header's worth, not zlib's 8 KB (x2) of a large file */
		if (src->rec.kind == DP_SRC_IDX) {
			IdxHeader h;
			rc = idx_read_header(gz, src->path, &h, msg, sizeof msg) ||
			     df_check_samples(src->path, h.n, h.elems, sample, msg, sizeof msg);
			n = h.n;
		} else {
			NpyHeader h;
			int esize;
			rc = npy_read_header(gz, src->path, &h, msg, sizeof msg) ||
			     npy_check(src->path, &h, dt == DP_F32 ? DF_F32 : DF_I32, ir_dtype_name(dt),
				       dt == DP_I32, sample, &esize, &n, msg, sizeof msg);
		}
		gzclose(gz);
	} else if (src->rec.kind == DP_SRC_TOKENS) {
		glob_t g;
		rc = tok_glob(src->path, &g, msg, sizeof msg);
		if (rc == DF_NOT_FOUND) {
			if (!quiet)
				not_seen(L, at, strpbrk(src->path, "*?[") ? "token shard pattern"
									    : "token shard", src->path, 0);
			return -1;
		}
		if (rc == 0) {
			int unseen = 0;
			n = 0;
			for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++) {
				int fd;
				int64_t ntok = 0;
				errno = 0;
				rc = tok_open_shard(g.gl_pathv[i], sample, &fd, &ntok, msg, sizeof msg);
				if (rc == 0) {
					close(fd);
					n += (ntok - 1) / sample; /* as runtime/data_tokens.c counts */
				} else if (rc == DF_NOT_FOUND) {
					if (!quiet)
						not_seen(L, at, "token shard", g.gl_pathv[i], errno);
					rc = 0;
					unseen = 1;
				}
			}
			globfree(&g);
			if (unseen)
				n = -1;
		}
	}
	if (rc) {
		if (!quiet)
			ERR(at, "%s", msg);
		return -1;
	}
	return n;
}

/* The sources of a split must hold the same number of samples (dpexec
 * checks it again at load): the first one whose count is known, against
 * each later one. */
typedef struct {
	const char *split; /* "train", "eval" */
	int64_t n;         /* -1: none known yet */
	const char *path;
	int line;
} SampleCount;

static void same_count(Lower *L, SampleCount *c, const Source *src, Loc at, int64_t n)
{
	const char *path = src->rec.kind == DP_SRC_SYNTHETIC ? "synthetic" : src->path;
	if (n < 0)
		return;
	if (c->n < 0) {
		*c = (SampleCount){c->split, n, path, at.line};
		return;
	}
	if (n != c->n)
		ERR(at, "data sources of the %s split differ in sample count: %s has %lld (line %d), "
			"%s has %lld", c->split, c->path, (long long)c->n, c->line, path, (long long)n);
}

/* ---- data and eval ---- */

static void lower_data(Lower *L)
{
	Graph *g = L->g;
	SampleCount count = {"train", -1, NULL, 0};
	for (const Stmt *s = L->data->body; s; s = s->next) {
		if (s->kind != S_DECL) {
			ERR(s->loc, "expected a data declaration, like x: f32[batch, 784] from idx(\"file\")");
			continue;
		}
		if (lower_find_sym(L, s->name)) {
			ERR(s->name_loc, "duplicate data '%s'", s->name);
			continue;
		}
		DpDtype dt;
		int nd = 0;
		int64_t dims[DP_MAX_DIMS] = {0};
		Source src = {0};
		Loc path_loc = s->val->loc;
		if (lower_type(L, &s->type, "data", s->name, 1, &dt, &nd, dims) ||
		    lower_source(L, s->val, s->name, dt, nd, &src, &path_loc) || !L->batch_ok) {
			lower_add_sym(L, s->name, -1, 1);
			continue;
		}
		int64_t sample = 1, batch_elems;
		for (int i = 1; i < nd; i++)
			sample *= dims[i]; /* at most MAX_ELEMS: lower_type checked */
		same_count(L, &count, &src, path_loc, check_data_file(L, &src, path_loc, dt, sample));
		if (__builtin_mul_overflow(sample, (int64_t)g->cfg.micro_batch, &batch_elems) ||
		    batch_elems > MAX_ELEMS) {
			ERR(s->name_loc, "a micro-batch of data '%s' is too large", s->name);
			lower_add_sym(L, s->name, -1, 1);
			continue;
		}
		uint32_t cp = g->cfg.mesh[DP_AXIS_CP];
		if (cp > 1 && src.rec.kind == DP_SRC_TOKENS) {
			/* context parallelism gives each cp rank two of 2*cp chunks */
			if (nd < 2 || dims[1] % (2 * (int64_t)cp) != 0) {
				ERR(s->name_loc, "data '%s': a sequence of %lld tokens does not split into "
				    "2 x cp = %u equal chunks (each cp rank holds two, for causal load "
				    "balance)", s->name, nd < 2 ? 1LL : (long long)dims[1], 2 * cp);
				lower_add_sym(L, s->name, -1, 1);
				continue;
			}
			L->has_seq = 1;
		}
		dims[0] = g->cfg.micro_batch;
		Value *v = lower_value(L, s->name, dt, nd, dims, DP_T_DATA, lower_gloc(L, s->name_loc));
		src.rec.split = DP_SPLIT_TRAIN;
		src.rec.role = dt == DP_I32;
		src.rec.sample_elems = sample;
		src.rec.src_line = (uint32_t)s->val->loc.line;
		src.value = v->id;
		src.loc = lower_gloc(L, s->val->loc);
		v->source = ir_add_source(g, &src);
		Node *n = ir_node(g, DP_OP_LOAD, v->id, 0, NULL, PH_DATA, src.loc);
		n->ia[0] = v->source;
		n->progs = IR_IN_STEP;
		lower_add_sym(L, s->name, v->id, 1);
	}
	if (g->cfg.mesh[DP_AXIS_CP] > 1 && !L->has_seq && L->nerrs == 0)
		ERR(L->cp_loc, "cp=%u: context parallelism splits token data [batch, T] over its "
		    "sequence, and this model reads none", g->cfg.mesh[DP_AXIS_CP]);
}

static void lower_eval(Lower *L)
{
	Graph *g = L->g;
	SampleCount count = {"eval", -1, NULL, 0};
	const Stmt *every = NULL;
	const Stmt **given = ast_alloc(L->ps, sizeof(Stmt *) * (size_t)(L->nsyms + 1));
	for (const Stmt *s = L->eval->body; s; s = s->next) {
		if (s->kind == S_SETTING && strcmp(s->name, "every") == 0 && s->val) {
			int64_t x;
			AstVal v;
			if (every)
				ERR(s->name_loc, "duplicate eval setting 'every'");
			else if (!eval_value(L, s->val, &v) && !want_int(L, &v, "every", 0, INT32_MAX, &x))
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
		Sym *sym = lower_find_sym(L, s->name);
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
		Loc path_loc = s->val->loc;
		const Value *d = sym->value >= 0 ? g->values[sym->value] : NULL;
		/* a data declaration that failed: check the source's own arguments only */
		if (lower_source(L, s->val, s->name, d ? d->dtype : DP_I32, d ? d->ndim : -1, &src,
				 &path_loc) ||
		    !d)
			continue;
		Value *v = g->values[sym->value];
		same_count(L, &count, &src, path_loc,
			   check_data_file(L, &src, path_loc, v->dtype,
					   g->sources[v->source].rec.sample_elems));
		src.rec.split = DP_SPLIT_EVAL;
		src.rec.role = v->dtype == DP_I32;
		src.rec.sample_elems = g->sources[v->source].rec.sample_elems;
		src.rec.src_line = (uint32_t)s->val->loc.line;
		src.value = v->id;
		src.loc = lower_gloc(L, s->val->loc);
		int si = ir_add_source(g, &src);
		Node *n = ir_node(g, DP_OP_LOAD, v->id, 0, NULL, PH_DATA, src.loc);
		n->ia[0] = si;
		n->progs = IR_IN_EVAL;
	}
	for (int i = 0; i < L->nsyms; i++)
		if (L->syms[i].is_data && !given[i])
			ERR(L->eval->name_loc, "the eval section has no source for data '%s'",
			    L->syms[i].name);
}

/* ---- the file ---- */

/* A misspelt section (or mesh) is reported with the name it is closest to
 * and then taken as that section when the file has none, so the rest of it
 * is checked and no "missing section" error follows. */
static void find_sections(Lower *L)
{
	static const char *const names[] = {"config", "data", "eval", "model", "train"};
	static const char *const top_words[] = {"mesh", "config", "data", "eval", "model", "train"};
	const Stmt **slots[] = {&L->config, &L->data, &L->eval, &L->model, &L->train};
	const Stmt *typo[5] = {NULL}, *mesh_typo = NULL;
	for (const Stmt *s = L->ps->top; s; s = s->next) {
		const char *guess = s->kind == S_SETTING || s->kind == S_SECTION
					    ? suggest_among(s->name, top_words, 6) : NULL;
		if (s->kind == S_SETTING && guess && strcmp(guess, "mesh") == 0) {
			ERR(s->name_loc, "unknown top-level statement '%s'; did you mean 'mesh'?", s->name);
			if (!mesh_typo)
				mesh_typo = s;
			continue;
		}
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
				"unknown top-level statement (expected mesh, config, data, eval, model or "
				"train)",
				"",
				"a block belongs in the model section",
				"a buffer belongs in a block of the model section",
				"repeat belongs in the model section",
			};
			ERR(s->loc, "%s", where[s->kind]);
			continue;
		}
		size_t k = 0;
		while (k < 5 && strcmp(names[k], s->name) != 0)
			k++;
		if (k == 5 && guess && strcmp(guess, "mesh") != 0) {
			ERR(s->name_loc, "unknown section '%s'; did you mean '%s'?", s->name, guess);
			for (k = 0; strcmp(names[k], guess) != 0; k++)
				;
			if (!typo[k])
				typo[k] = s;
		} else if (k == 5) {
			ERR(s->name_loc,
			    "unknown section '%s' (sections: config, data, eval, model, train)", s->name);
		} else if (*slots[k]) {
			ERR(s->name_loc, "duplicate '%s' section", s->name);
		} else {
			*slots[k] = s;
		}
	}
	for (int k = 0; k < 5; k++)
		if (!*slots[k] && typo[k])
			*slots[k] = typo[k];
	if (!L->mesh && mesh_typo)
		L->mesh = mesh_typo;
}

Graph *ast_lower(ParseState *ps, const FeOptions *opts)
{
	Lower lw = {.ps = ps, .d = ps->d, .world_size = opts ? opts->world_size : 0,
		    .opts = opts, .top = {ps->file, 1, 1}};
	Lower *L = &lw;
	L->g = ir_new(ps->file);
	find_sections(L);
	lower_config(L);
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
	lower_report(L);
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
	FeOptions o = {.world_size = world_size};
	return fe_compile_opts(path, &o, d, src_out);
}

Graph *fe_compile_opts(const char *path, const FeOptions *opts, Diag *d, char **src_out)
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
		g = ast_lower(&ps, opts);
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
