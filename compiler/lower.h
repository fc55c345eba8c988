/*
 * lower.h - the lowering context shared by the front end's semantic files:
 * lower.c (sections, settings, data; the driver), consts.c (constant
 * expressions, the config section, declared types), model.c (the model
 * section: blocks, repeat, ops), settings.c (the settings of
 * format/settings.def) and scope.c (errors, names, values, setting checks).
 * Dependencies go one way: lower.c -> settings.c, model.c -> consts.c ->
 * scope.c.
 *
 * Internal to compiler/; nothing outside the front end includes it.
 */
#ifndef DP_LOWER_H
#define DP_LOWER_H

#include "ast.h"

/* A string -> int hash map (open addressing) for the name lookups, so that
 * lowering stays linear in the size of the unrolled model. Keys are not
 * copied: they must outlive the map (tree or graph strings). */
typedef struct {
	const char *key;
	int val;
} MapSlot;

typedef struct {
	MapSlot *slots;
	int cap, n;
} NameMap;

/* A name the model can refer to: a data value or an assignment target. */
typedef struct {
	const char *name;
	int value;   /* latest binding's value id, or -1 when its definition had an error */
	int is_data;
} Sym;

/* A config constant or a -D value. */
typedef struct {
	int is_float;
	int64_t i;
	double f;
} Num;

typedef struct {
	const char *name;
	Num val;
	int ok;      /* evaluated without error (uses of a failed one stay quiet) */
} Const;

#define MAX_REPEAT_NEST 8 /* repeat inside repeat */
#define MAX_ELEMS ((int64_t)1 << 40) /* elements of one tensor */

typedef struct Pending Pending;

/* A setting of format/settings.def as the file (or dpc --set) gives it. */
typedef struct {
	AstVal val;     /* the value, evaluated (a spec's call with its arguments) */
	Loc name_loc;   /* its name in the file, or the --set (line 0) */
	int given;      /* written in the file or set by a flag */
	int bad;        /* its value did not evaluate (reported) */
	int ok;         /* checked against its row and stored */
	double num;     /* the checked value (a word's index, a kind, a dtype) */
	int64_t i;      /* ... exactly, for integers */
	const char *why; /* the warning that it has no effect, when it has none */
} SetVal;

typedef struct {
	ParseState *ps;
	Diag *d;
	Graph *g;
	int world_size;
	const FeOptions *opts;
	Loc top; /* 1:1, for what is missing from the whole file */
	const Stmt *config, *mesh, *data, *eval, *model, *train;
	int mesh_ok, batch_ok;
	int64_t global_batch;
	Sym *syms;
	int nsyms, capsyms;
	NameMap symmap;   /* name -> index into syms */
	NameMap values;   /* value name -> id, for every value the front end made;
	                     -1 for a param or buffer whose declaration failed */
	NameMap targets;  /* every assignment target of the model (val unused) */
	NameMap blocks;   /* block name -> index into Graph.blocks */
	Const *consts;
	int nconsts, capconsts;
	NameMap constmap; /* name -> index into consts */
	const char *rep_var[MAX_REPEAT_NEST]; /* enclosing repeat variables, outermost first */
	int64_t rep_val[MAX_REPEAT_NEST];
	int nrep;
	int *inst_block;  /* per block instance in program order: its block index, or -1 */
	int ninst, capinst;
	int64_t unrolled; /* statements instantiated by repeat */
	int next_temp;
	Loc cp_loc;       /* where the mesh sets cp (messages) */
	int has_seq;      /* token data read (what context parallelism splits) */
	int grad_ckpt;    /* train's gradient_checkpointing: recompute every block
	                     made by repeat (unless the block says otherwise) */
	int loss_seen;
	Loc loss_loc;
	int half_dtype;   /* the 16-bit dtype the file asked for (DP_BF16, DP_F16), else 0 */
	Loc half_at;      /* ... where first */
	Pending *errs; /* reported in source order at the end */
	int nerrs, caperrs;
	SetVal set[DP_NSETTINGS]; /* the settings given (settings.c), ORDER SET */
	ParseState **setps;       /* the parses of --set values (their trees' strings) */
	int nsetps, capsetps;
} Lower;

void scope_error(Lower *L, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define ERR(loc, ...) scope_error(L, (loc), __VA_ARGS__)

/* ---- scope.c: helpers shared by the files (the bottom layer) ---- */

Loc scope_gloc(Lower *L, Loc l); /* the Loc with the graph's copy of the file name */
void *scope_grow(Lower *L, void *arr, int *cap, int need, size_t elem);
int *scope_map_get(const NameMap *m, const char *key);
void scope_map_put(Lower *L, NameMap *m, const char *key, int val);
Sym *scope_find_sym(Lower *L, const char *name);
void scope_add_sym(Lower *L, const char *name, int value, int is_data);
/* ir_value, registered in L->values (name must be unused). */
Value *scope_value(Lower *L, const char *name, DpDtype dt, int ndim, const int64_t *dims,
		   DpTensorKind kind, Loc loc);
/* A name not used by any value nor assigned by the user: stem, stem1, ... */
const char *scope_fresh_name(Lower *L, const char *stem);
int scope_want_int(Lower *L, const AstVal *v, const char *what, int64_t lo, int64_t hi, int64_t *out);
int scope_want_float(Lower *L, const AstVal *v, const char *what, float *out);
/* One of two words (true/false, sharded/unsharded): 0 for a, 1 for b, or -1
 * after reporting "what must be a or b". */
int scope_want_word(Lower *L, const AstVal *v, const char *what, const char *a, const char *b);
/* A floating-point dtype for the precision settings: DP_F32 (f32, fp32),
 * DP_BF16 (bf16) or DP_F16 (f16, fp16), or -1 after reporting "what must be
 * f32, bf16 or f16". */
int scope_dtype_word(Lower *L, const AstVal *v, const char *what);
/* cfg.half_line/col: the first request for a 16-bit dtype dt; a request for
 * the other one is an error */
void scope_note_half(Lower *L, Loc at, int dt);
/* A strategy name: its DpStrategy, or -1 after reporting. */
int scope_strategy_word(Lower *L, const AstVal *v);
int scope_kwargs(Lower *L, const AstVal *call, const char *const *keys, int nkeys,
		 const Arg **found);
/* Report the collected errors through L->d, sorted by position. */
void scope_report(Lower *L);

/* ---- consts.c: constant expressions and the config section ---- */

/* Evaluate e as a number (config constants and repeat variables resolved).
 * what names the position for messages ("a dimension"). -1 after an error. */
int const_eval_num(Lower *L, const Expr *e, const char *what, Num *out);
/* Evaluate e as a setting value or spec: numbers fold to V_INT/V_FLOAT, a
 * name that is not a constant stays V_IDENT, calls become V_CALL with their
 * arguments evaluated. Tensor expressions (block.param) are errors. */
int const_eval_value(Lower *L, const Expr *e, AstVal *out);
/* Is name a config constant or a repeat variable in scope? */
int const_is_constant(Lower *L, const char *name);
void const_lower_config(Lower *L);
/* A declared type: dtype and dims. Data: the first dim is `batch` (dims[0] is
 * left 0 for the caller), the rest positive. Params: f32, all dims positive. */
int const_lower_type(Lower *L, const AstType *t, const char *what, const char *name, int is_data,
		     DpDtype *dt, int *ndim, int64_t *dims);

/* ---- settings.c: the rows of format/settings.def ---- */

/* The section's (DP_SEC_TRAIN, DP_SEC_EVAL) statements into L->set:
 * unknown names ("did you mean"), duplicates, values evaluated. */
void settings_collect(Lower *L, int sec, const Stmt *section);
/* dpc's --set and settings-backed flags over what the file says. */
void settings_apply_sets(Lower *L);
/* Check the section's given values against their rows and store them in
 * their fields (spec settings: the kind, then its arguments). */
void settings_store(Lower *L, int sec);
/* Bounds by another setting and requirements, once the values are in. */
void settings_check_bounds(Lower *L);
/* Warn about every given setting that has no effect in this program. */
void settings_warn(Lower *L);
/* The given value of setting id, NULL when not given (or it did not evaluate). */
const AstVal *settings_val(Lower *L, int id);
/* Its checked value (a word's index, a kind), or its default. */
double settings_num(Lower *L, int id);

/* ---- model.c ---- */

void model_lower(Lower *L);

#endif
