/*
 * lower.c - semantic checks of the syntax tree and its lowering to the graph
 * IR (the sections other than model, which is compiler/model.c); lower_compile,
 * the front end's entry point.
 *
 * Before: a tree from compiler/parser.y that parsed without errors (a file
 * with syntax errors is not lowered: its half-statements would only produce
 * misleading follow-on errors).
 *
 * After (when no error was reported), the Graph holds:
 *   - every setting of format/settings.def in its field (cfg, opt, sched and
 *     the Graph's own: compiler/settings.c checks and stores the train and
 *     eval sections' values, dpc's --set over them), the mesh, the batch
 *     sizes, the strategy's name and the precision group (here);
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
 * expressions (compiler/consts.c), evaluated where they are used. A file
 * that lowers without errors is then told which of its settings have no
 * effect (warnings, compiler/settings.c).
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
	if (!o || (o->pp <= 1 && o->tp <= 1 && o->cp <= 1 && o->dp_replicate <= 1))
		return 0;
	ERR(loc, "dpc --pp, --tp, --cp and --dp-replicate size the axes of `mesh auto`; this "
		 "mesh statement sets its axes itself (write them there)");
	return 1;
}

/* `mesh auto` on `world` ranks: tp, cp, dp_replicate and pp from dpc's flags
 * (1 when not given), in the seeds' order (pp outermost), and dp_shard takes
 * the rest. */
static void mesh_auto(Lower *L, Loc loc, int world)
{
	const FeOptions *o = L->opts;
	uint32_t *mesh = L->g->cfg.mesh;
	int64_t tp = o && o->tp > 1 ? o->tp : 1, cp = o && o->cp > 1 ? o->cp : 1;
	int64_t rep = o && o->dp_replicate > 1 ? o->dp_replicate : 1;
	int64_t pp = o && o->pp > 1 ? o->pp : 1;
	int64_t fixed = tp * cp * rep * pp; /* each flag is at most 2^20: no overflow */
	if (fixed > world || world % fixed != 0) {
		char pps[32] = "";
		if (pp > 1)
			snprintf(pps, sizeof pps, " x pp=%lld", (long long)pp);
		ERR(loc, "mesh auto: world size %d is not divisible by tp=%lld x cp=%lld x "
			 "dp_replicate=%lld%s", world, (long long)tp, (long long)cp, (long long)rep, pps);
		return;
	}
	mesh[DP_AXIS_PP] = (uint32_t)pp;
	mesh[DP_AXIS_TP] = (uint32_t)tp;
	mesh[DP_AXIS_CP] = (uint32_t)cp;
	mesh[DP_AXIS_REPLICATE] = (uint32_t)rep;
	mesh[DP_AXIS_SHARD] = (uint32_t)(world / fixed);
	L->cp_loc = loc;
	L->g->mesh_loc = scope_gloc(L, loc);
	L->g->mesh_auto = 1;
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
		if (const_eval_value(L, s->val, &v))
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
	int64_t size[DP_MAX_AXES] = {1, 1, 1, 1, 1};
	const Expr *given[DP_MAX_AXES] = {NULL};
	AstVal gv[DP_MAX_AXES];
	int auto_axis = -1, ok = 1;
	for (const Expr *a = s->kw; a; a = a->next) {
		int ax = 0;
		while (ax < DP_MAX_AXES && strcmp(ir_axis_names[ax], a->key) != 0)
			ax++;
		if (ax == DP_MAX_AXES) {
			const char *near = suggest_among(a->key, ir_axis_names, DP_MAX_AXES);
			ERR(a->key_loc, "unknown mesh axis '%s' (axes: pp, dp_replicate, dp_shard, cp, tp)%s%s%s",
			    a->key, near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
			ok = 0;
			continue;
		}
		if (given[ax]) {
			ERR(a->key_loc, "duplicate mesh axis '%s'", a->key);
			ok = 0;
			continue;
		}
		given[ax] = a;
		if (const_eval_value(L, a, &gv[ax])) {
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
		if (scope_want_int(L, &gv[ax], a->key, 1, MAX_AXIS, &size[ax]))
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
	L->g->mesh_loc = scope_gloc(L, given[DP_AXIS_PP] ? gv[DP_AXIS_PP].loc : s->name_loc);
	for (int ax = 0; ax < DP_MAX_AXES; ax++)
		mesh[ax] = (uint32_t)size[ax];
	L->mesh_ok = ok;
}

/* ---- train ---- */

/* train's settings are the rows of format/settings.def (compiler/settings.c
 * checks and stores them); what follows is what they mean together. */

/* The strategy: a name in g->strategy, and whether the mesh suits it. */
static void lower_strategy(Lower *L)
{
	Graph *g = L->g;
	snprintf(g->strategy, sizeof g->strategy, "%s",
		 dp_name(dp_strategy_names, DP_NSTRAT, g->cfg.strategy));
	const AstVal *v = settings_val(L, DP_SET_STRATEGY);
	char why[160];
	g->strategy_auto = v && v->kind == V_IDENT && strcmp(v->s, "auto") == 0;
	if (g->strategy_auto && !L->mesh_ok)
		ERR(v->loc, "strategy auto searches plans on the mesh: give the mesh, or `mesh auto` "
			    "and --world-size N");
	if (v && L->set[DP_SET_STRATEGY].ok && L->mesh_ok && !g->strategy_auto &&
	    !ir_strategy_fits(g, (int)g->cfg.strategy, why, sizeof why))
		ERR(v->loc, "%s", why);
}

/* Mixed precision (passes/precision.c). `precision D` is the short form of
 * param_dtype D and buffer_dtype D (fp16: f16); the gradients are reduced in
 * f32 unless reduce_dtype says bf16 or f16, the compute dtype (torchtitan's
 * default, FSDP's MixedPrecision names). Master weights and optimizer state are always f32. `precision
 * tf32`: f32 dtypes, and a GPU may run the f32 GEMMs on TF32 tensor cores
 * (cfg.gemm_math). */
static void lower_precision(Lower *L)
{
	Graph *g = L->g;
	enum { P_F32, P_TF32, P_BF16, P_FP16 }; /* ORDER: the precision row's words */
	const AstVal *pv = settings_val(L, DP_SET_PRECISION);
	int given = pv && L->set[DP_SET_PRECISION].ok, p = (int)settings_num(L, DP_SET_PRECISION);
	int prec = !given ? -1 : p == P_BF16 ? DP_BF16 : p == P_FP16 ? DP_F16 : DP_F32;
	g->cfg.gemm_math = given && p == P_TF32 ? DP_GEMM_TF32 : DP_GEMM_F32;
	const AstVal *pdv = settings_val(L, DP_SET_PARAM_DTYPE), *bdv = settings_val(L, DP_SET_BUFFER_DTYPE);
	const AstVal *rdv = settings_val(L, DP_SET_REDUCE_DTYPE);
	int pd = pdv && L->set[DP_SET_PARAM_DTYPE].ok ? g->param_dtype : -1;
	int bd = bdv && L->set[DP_SET_BUFFER_DTYPE].ok ? g->buffer_dtype : -1;
	if (prec >= 0 && pd >= 0 && pd != prec)
		ERR(pdv->loc, "param_dtype %s contradicts precision %s", dp_dtype_names[pd],
		    dp_dtype_names[prec]);
	g->param_dtype = pd >= 0 ? pd : prec >= 0 ? prec : DP_F32;
	g->buffer_dtype = bd >= 0 ? bd : prec >= 0 ? prec : DP_F32;
	if (rdv && L->set[DP_SET_REDUCE_DTYPE].ok && dp_is_half((unsigned)g->reduce_dtype) &&
	    g->reduce_dtype != g->param_dtype) {
		const char *r = dp_dtype_names[g->reduce_dtype];
		ERR(rdv->loc, "reduce_dtype %s is not param_dtype %s: the gradients would be rounded "
			      "to %s (set precision %s, or reduce in f32)",
		    r, dp_dtype_names[g->param_dtype], r, g->reduce_dtype == DP_F16 ? "fp16" : r);
		g->reduce_dtype = DP_F32;
	}
	/* where the file asks for a 16-bit dtype, for a backend that cannot
	 * (cfg.half_line; a flag is no place in the file: its line is 0) */
	const AstVal *asks[] = {pv, pdv, bdv, rdv};
	const int dts[] = {prec, pd, bd, rdv && L->set[DP_SET_REDUCE_DTYPE].ok ? g->reduce_dtype : -1};
	for (int i = 0; i < 4; i++)
		if (asks[i] && asks[i]->kind == V_IDENT && dts[i] >= 0 && dp_is_half((unsigned)dts[i]))
			scope_note_half(L, asks[i]->loc, dts[i]);
}

/* Loss scaling (passes/lossscale.c) is fp16's: a model that computes in f16
 * anywhere (train's precision or a block's) scales dynamically unless
 * loss_scale says otherwise, as PyTorch's AMP recipe (autocast + GradScaler)
 * does; bf16 and f32 keep f32's exponent range and need none, so asking
 * for it there is an error rather than a silent no-op. */
static void lower_loss_scale(Lower *L)
{
	Graph *g = L->g;
	const SetVal *ls = &L->set[DP_SET_LOSS_SCALE];
	int f16 = g->param_dtype == DP_F16 || L->half_dtype == DP_F16;
	if (!ls->given && f16)
		ir_settings_kind(g, DP_SET_LOSS_SCALE, DP_LS_DYNAMIC);
	if (g->opt.loss_scale == DP_LS_NONE || (ls->given && !ls->ok))
		return;
	Loc at = ls->given ? ls->val.loc : L->half_at;
	if (!f16)
		ERR(at, "loss_scale needs precision fp16: %s has f32's exponent range, and its "
			"gradients need no scaling (remove loss_scale)",
		    L->half_dtype == DP_BF16 || g->param_dtype == DP_BF16 ? "bf16" : "f32");
	else if (ir_any_offload(g)) {
		int o = g->offload;
		for (int b = 0; b < g->nblocks && !o; b++)
			o = ir_block_offload(g, b);
		ERR(at, "fp16's loss scaling is not implemented with offload %s yet: train "
			"in bf16, or without loss scaling (loss_scale none)",
		    o == 2 ? "params" : "optimizer");
	}
}

static void lower_train(Lower *L)
{
	Graph *g = L->g;
	DpConfig *c = &g->cfg;
	int64_t x;

	/* unset settings keep ir_new's defaults */
	L->batch_ok = 0;
	L->global_batch = 1;
	if (!L->train)
		ERR(L->top, "missing 'train' section (it must set micro_batch or global_batch)");
	settings_store(L, DP_SEC_TRAIN);
	settings_check_bounds(L);
	if (!L->train)
		return;
	lower_strategy(L);
	lower_precision(L);
	L->grad_ckpt = settings_num(L, DP_SET_GRADIENT_CHECKPOINTING) != 0;

	/* batch: micro_batch, or global_batch split over grad_accum and the dp axes */
	const SetVal *mb = &L->set[DP_SET_MICRO_BATCH], *gb = &L->set[DP_SET_GLOBAL_BATCH];
	if (mb->given && gb->given) {
		ERR((later(mb->name_loc, gb->name_loc) ? mb : gb)->name_loc,
		    "set micro_batch or global_batch, not both");
		return;
	}
	if (!mb->given && !gb->given) {
		ERR(L->train->name_loc, "the train section must set micro_batch or global_batch");
		return;
	}
	const SetVal *ga = &L->set[DP_SET_GRAD_ACCUM];
	/* interleaved's micro-batches go round the ranks in groups of pp
	 * (passes/stages.c's interleaved_order, as Megatron-LM requires) */
	const SetVal *pl = &L->set[DP_SET_PIPELINE];
	if (L->mesh_ok && (!ga->given || ga->ok) && ir_chunks_per_rank(g) > 1 &&
	    c->grad_accum % c->mesh[DP_AXIS_PP] != 0)
		ERR(ga->given ? ga->val.loc : pl->val.loc,
		    "the interleaved pipeline runs its micro-batches in groups of pp=%u, and "
		    "grad_accum %u is not a multiple of it: set grad_accum to %u (or a multiple)",
		    c->mesh[DP_AXIS_PP], c->grad_accum,
		    c->grad_accum < c->mesh[DP_AXIS_PP]
			    ? c->mesh[DP_AXIS_PP]
			    : (c->grad_accum + c->mesh[DP_AXIS_PP] - 1) / c->mesh[DP_AXIS_PP] *
				      c->mesh[DP_AXIS_PP]);
	if ((ga->given && !ga->ok) || !(mb->given ? mb : gb)->ok || !L->mesh_ok)
		return; /* the batch arithmetic would only repeat an earlier error */
	int64_t dp = (int64_t)c->grad_accum * c->mesh[DP_AXIS_REPLICATE] * c->mesh[DP_AXIS_SHARD];
	if (mb->given) {
		x = mb->i;
		if (__builtin_mul_overflow(x, dp, &L->global_batch) || L->global_batch > MAX_ELEMS) {
			ERR(mb->val.loc,
			    "the global batch (micro_batch * grad_accum * dp ranks) is too large");
			return;
		}
	} else {
		x = gb->i;
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

/* Fill s->rec.kind, synth_n/classes, shift and s->path from the source
 * expression e of data `name`, declared dt with nd dims; *path_loc: where
 * the path is written. */
static int lower_source(Lower *L, const Expr *e, const char *name, DpDtype dt, int nd,
			Source *s, Loc *path_loc)
{
	AstVal val;
	const AstVal *v = &val;
	if (const_eval_value(L, e, &val))
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
		if (shift && scope_want_int(L, &shift->val, "shift", 0, 1, &sh))
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
		if (scope_kwargs(L, v, keys, 2, a) ||
		    (a[0] && scope_want_int(L, &a[0]->val, "n", 1, INT32_MAX, &n)) ||
		    (a[1] && scope_want_int(L, &a[1]->val, "classes", 1, INT32_MAX, &classes)))
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
		if (scope_find_sym(L, s->name)) {
			ERR(s->name_loc, "duplicate data '%s'", s->name);
			continue;
		}
		DpDtype dt;
		int nd = 0;
		int64_t dims[DP_MAX_DIMS] = {0};
		Source src = {0};
		Loc path_loc = s->val->loc;
		if (const_lower_type(L, &s->type, "data", s->name, 1, &dt, &nd, dims) ||
		    lower_source(L, s->val, s->name, dt, nd, &src, &path_loc) || !L->batch_ok) {
			scope_add_sym(L, s->name, -1, 1);
			continue;
		}
		int64_t sample = 1, batch_elems;
		for (int i = 1; i < nd; i++)
			sample *= dims[i]; /* at most MAX_ELEMS: const_lower_type checked */
		same_count(L, &count, &src, path_loc, check_data_file(L, &src, path_loc, dt, sample));
		if (__builtin_mul_overflow(sample, (int64_t)g->cfg.micro_batch, &batch_elems) ||
		    batch_elems > MAX_ELEMS) {
			ERR(s->name_loc, "a micro-batch of data '%s' is too large", s->name);
			scope_add_sym(L, s->name, -1, 1);
			continue;
		}
		uint32_t cp = g->cfg.mesh[DP_AXIS_CP];
		if (cp > 1 && src.rec.kind == DP_SRC_TOKENS) {
			/* context parallelism gives each cp rank two of 2*cp chunks */
			if (nd < 2 || dims[1] % (2 * (int64_t)cp) != 0) {
				ERR(s->name_loc, "data '%s': a sequence of %lld tokens does not split into "
				    "2 x cp = %u equal chunks (each cp rank holds two, for causal load "
				    "balance)", s->name, nd < 2 ? 1LL : (long long)dims[1], 2 * cp);
				scope_add_sym(L, s->name, -1, 1);
				continue;
			}
			L->has_seq = 1;
		}
		dims[0] = g->cfg.micro_batch;
		Value *v = scope_value(L, s->name, dt, nd, dims, DP_T_DATA, scope_gloc(L, s->name_loc));
		src.rec.split = DP_SPLIT_TRAIN;
		src.rec.role = dt == DP_I32;
		src.rec.sample_elems = sample;
		src.rec.src_line = (uint32_t)s->val->loc.line;
		src.value = v->id;
		src.loc = scope_gloc(L, s->val->loc);
		v->source = ir_add_source(g, &src);
		Node *n = ir_node(g, DP_OP_LOAD, v->id, 0, NULL, PH_DATA, src.loc);
		DP_ATTR(n, LOAD, source) = v->source;
		n->progs = IR_IN_STEP;
		scope_add_sym(L, s->name, v->id, 1);
	}
	if (g->cfg.mesh[DP_AXIS_CP] > 1 && !L->has_seq && L->nerrs == 0)
		ERR(L->cp_loc, "cp=%u: context parallelism splits token data [batch, T] over its "
		    "sequence, and this model reads none", g->cfg.mesh[DP_AXIS_CP]);
}

static void lower_eval(Lower *L)
{
	Graph *g = L->g;
	SampleCount count = {"eval", -1, NULL, 0};
	const Stmt **given = ast_alloc(L->ps, sizeof(Stmt *) * (size_t)(L->nsyms + 1));
	for (const Stmt *s = L->eval->body; s; s = s->next) {
		if (s->kind == S_SETTING)
			continue; /* `every N`: a setting (compiler/settings.c) */
		if (s->kind != S_SOURCE) {
			ERR(s->loc, "expected 'name from source' or 'every N' in the eval section");
			continue;
		}
		Sym *sym = scope_find_sym(L, s->name);
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
		src.loc = scope_gloc(L, s->val->loc);
		int si = ir_add_source(g, &src);
		Node *n = ir_node(g, DP_OP_LOAD, v->id, 0, NULL, PH_DATA, src.loc);
		DP_ATTR(n, LOAD, source) = si;
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

/* compress powersgd: what the compression pass (passes/compress.c) can
 * rewrite: all-ddp graphs (their bucketed all_reduce) and all-hybrid_shard
 * ones (the dp_replicate all_reduce of each unit's chunk, a matrix of whole
 * rows: passes/layout.c), without tp or cp (a gradient split or summed
 * over them would be approximated per part; at pp each stage's gradients
 * are its own whole matrices, passes/stage_params.c, a tied one's parts
 * summed through the factors' all_reduces as the ranks' are), with
 * f32 gradients (the factors are f32, as PyTorch's hook computes in the
 * gradients' dtype). Every other layout is an error at the setting. */
static void lower_compress(Lower *L)
{
	const Graph *g = L->g;
	const SetVal *v = &L->set[DP_SET_COMPRESS];
	/* a block's `compress powersgd` takes train's arguments (start_step is
	 * one for the run): train must say them; its `compress none` then
	 * changes nothing */
	for (int b = 0; g->cfg.compress == DP_COMPRESS_NONE && b < g->nblocks; b++)
		if (g->blocks[b].compress == DP_COMPRESS_NONE)
			warning_at(L->d, g->blocks[b].compress_loc, "compress none in block %s has no "
				   "effect: train does not compress", g->blocks[b].name);
		else if (g->blocks[b].compress == DP_COMPRESS_POWERSGD) {
			ERR(g->blocks[b].compress_loc, "block %s compresses with powersgd but train does "
			    "not: its arguments (rank, start_step, min_compression_rate) are train's "
			    "compress powersgd(...); the blocks to leave out say compress none",
			    g->blocks[b].name);
			return;
		}
	if (!v->given || !v->ok || g->cfg.compress == DP_COMPRESS_NONE)
		return;
	const char *kind = dp_kind_name(DP_SET_COMPRESS, (int)g->cfg.compress);
	int first = -1; /* the first parameter's strategy: every one must have it */
	for (int i = 0; i < g->nvalues; i++) {
		const Value *p = g->values[i];
		if (p->kind != DP_T_PARAM)
			continue;
		int st = ir_block_strategy(g, p->block);
		if (first < 0)
			first = st;
		if ((st != DP_STRAT_DDP && st != DP_STRAT_HYBRID_SHARD) || (first >= 0 && st != first)) {
			ERR(v->val.loc, "compress %s needs every block ddp, or every block hybrid_shard "
			    "(its dp_replicate all_reduce): %s is %s (%s)", kind,
			    p->block >= 0 ? ir_fmt(L->g, "block %s", g->blocks[p->block].name)
					  : ir_fmt(L->g, "parameter %s", p->name),
			    dp_name(dp_strategy_names, DP_NSTRAT, (unsigned)st),
			    st == DP_STRAT_DDP || st == DP_STRAT_HYBRID_SHARD
				    ? "the blocks mix the two"
				    : "its gradients are reduce-scattered over every data-parallel rank, "
				      "whose shards a low-rank factor of the whole matrix cannot be "
				      "summed into");
			return;
		}
	}
	if (g->cfg.mesh[DP_AXIS_TP] > 1 ||
	    (first == DP_STRAT_HYBRID_SHARD && g->cfg.mesh[DP_AXIS_CP] > 1)) {
		ERR(v->val.loc, "compress %s needs tp=1%s (the mesh has tp=%u, cp=%u): "
		    "the gradients are compressed whole, over the data-parallel ranks only", kind,
		    first == DP_STRAT_HYBRID_SHARD ? " and, with hybrid_shard, cp=1" : "",
		    g->cfg.mesh[DP_AXIS_TP], g->cfg.mesh[DP_AXIS_CP]);
		return;
	}
	if (g->reduce_dtype != DP_F32)
		ERR(v->val.loc, "compress %s needs f32 gradients: reduce_dtype is %s (set "
		    "reduce_dtype f32)", kind, dp_name(dp_dtype_names, DP_NDTYPE,
							(unsigned)g->reduce_dtype));
}

Graph *lower_ast(ParseState *ps, const FeOptions *opts)
{
	Lower lw = {.ps = ps, .d = ps->d, .world_size = opts ? opts->world_size : 0,
		    .opts = opts, .top = {ps->file, 1, 1}};
	Lower *L = &lw;
	L->g = ir_new(ps->file);
	find_sections(L);
	const_lower_config(L);
	lower_mesh(L);
	settings_collect(L, DP_SEC_TRAIN, L->train);
	settings_collect(L, DP_SEC_EVAL, L->eval);
	settings_apply_sets(L);
	lower_train(L);
	settings_store(L, DP_SEC_EVAL);
	if (!L->data)
		ERR(L->top, "missing 'data' section");
	else
		lower_data(L);
	if (L->eval && L->data)
		lower_eval(L);
	if (!L->model)
		ERR(L->top, "missing 'model' section");
	else if (L->data)
		model_lower(L);
	if (L->model && L->data)
		lower_loss_scale(L);
	if (L->nerrs == 0)
		lower_compress(L);
	if (L->nerrs == 0)
		settings_warn(L); /* of a program that lowered: what its settings do */
	else
		scope_report(L);
	for (int i = 0; i < L->nsetps; i++) /* the --set values' trees, read until here */
		ast_free(L->setps[i]);
	if (L->nerrs == 0)
		return L->g;
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

Graph *lower_compile(const char *path, int world_size, Diag *d, char **src_out)
{
	FeOptions o = {.world_size = world_size};
	return lower_compile_opts(path, &o, d, src_out);
}

Graph *lower_compile_opts(const char *path, const FeOptions *opts, Diag *d, char **src_out)
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
		g = lower_ast(&ps, opts);
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
