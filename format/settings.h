/*
 * settings.h - the settings table (format/settings.def) as data, for the
 * compiler and the runtime alike: dp_settings[], one DpSetting per row, and
 * dp_kinds[], the kinds of the spec settings (optimizer, schedule). Part of
 * the step-file contract (format/): the codec serialises DpConfig, DpOptim
 * and DpSched by walking it, dpexec makes its settings-backed flags and their
 * help from it, and the checkpoints' state.json lists the optimizer and the
 * schedule from it.
 *
 * The compiler's own view (where a Graph keeps each value, the IR lines, the
 * DSL's checks) is ir/settings.c and compiler/settings.c.
 */
#ifndef DP_SETTINGS_H
#define DP_SETTINGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stepfile.h"

/* DP_SET_MESH, DP_SET_MICRO_BATCH, ...: ORDER SET (the rows of settings.def) */
typedef enum {
#define SET(id, ...) DP_SET_##id,
#define KIND(...)
#include "settings.def"
#undef SET
#undef KIND
	DP_NSETTINGS
} DpSetId;

/* Where a setting is written (the WHERE column). */
typedef enum {
	DP_SEC_INTERNAL, /* not in the DSL: the compiler derives it */
	DP_SEC_TRAIN,    /* a statement of the train section */
	DP_SEC_EVAL,     /* a statement of the eval section */
	DP_SEC_ARG,      /* a keyword argument of one kind of a spec setting */
} DpSection;

/* The value's type (the TYPE column). */
typedef enum {
	DP_ST_INT,      /* an integer */
	DP_ST_FLOAT,    /* a number that fits a finite f32 */
	DP_ST_BOOL,     /* true | false, stored 1 | 0 */
	DP_ST_WORDS,    /* one of .words, stored as its index */
	DP_ST_DTYPE,    /* f32 (fp32) | bf16, stored as a DpDtype */
	DP_ST_STRATEGY, /* a strategy name (dp_strategy_names), stored as a DpStrategy */
	DP_ST_SPEC,     /* a kind (dp_kinds of this setting), with its ARG rows as keyword
	                   arguments; stored as the kind */
	DP_ST_AXES,     /* the mesh: a size per DpAxis */
} DpSetType;

/* The record a value lives in (the FIELD column). */
typedef enum {
	DP_REC_NONE,  /* nowhere: the front end derives what it means */
	DP_REC_CFG,   /* DpConfig */
	DP_REC_OPT,   /* DpOptim */
	DP_REC_SCHED, /* DpSched */
	DP_REC_GRAPH, /* the compiler's Graph (ir/ir.h; offset in ir/settings.c) */
} DpRecord;

/* The C type of the field. */
typedef enum {
	DP_CT_NONE, /* no field */
	DP_CT_U32,  /* uint32_t */
	DP_CT_U64,  /* uint64_t */
	DP_CT_F32,  /* float */
	DP_CT_INT,  /* int */
	DP_CT_AXES, /* uint32_t[DP_MAX_AXES] */
} DpCType;

/* One end of the valid range (the LO and HI columns). */
typedef enum {
	DP_B_NONE, /* no bound (NOMAX) */
	DP_B_GE,   /* >= x */
	DP_B_GT,   /* > x */
	DP_B_LE,   /* <= x */
	DP_B_LT,   /* < x */
	DP_B_LESET, /* <= the value of setting x (a DP_SET_ id) */
} DpBound;

/* The IR line a setting prints on (ir/print.c), in the order they print. */
typedef enum {
	DP_IRL_NONE,
	DP_IRL_MESH,      /* mesh dp_replicate=1 dp_shard=2 cp=1 tp=1 */
	DP_IRL_CONFIG,    /* config micro_batch=32 grad_accum=2 ... */
	DP_IRL_OPTIMIZER, /* optimizer adamw lr=0.001 ... */
	DP_IRL_SCHEDULE,  /* schedule cosine key=value ... */
	DP_IRL_STRATEGY,  /* strategy ddp key=value ... */
	DP_IRL_PRECISION, /* precision param_dtype=bf16 ... (when not all f32) */
	DP_IRL_LOSS_SCALE, /* loss_scale dynamic scale=65536 ... (when not none) */
	DP_IRL_COMPRESS,  /* compress powersgd start_step=10 ... (when not none) */
	DP_NIRL
} DpIrLine;

typedef enum {
	DP_IRM_ALWAYS,  /* key=value */
	DP_IRM_NONZERO, /* key=value, only when the value is not 0 */
	DP_IRM_HEAD,    /* the line's first word (a strategy, a kind) */
} DpIrMode;

/* The program whose --flag sets a setting. */
typedef enum {
	DP_FLAG_NONE,
	DP_FLAG_DPC,    /* dpc --flag VALUE: as `--set SECTION.name=VALUE` */
	DP_FLAG_DPEXEC, /* dpexec --flag N: overrides the step file's value */
} DpFlagProg;

/* When a given value has an effect (the WHEN column). */
typedef enum {
	DP_WHEN_ALWAYS,
	DP_WHEN_APPLIES,  /* only where a predicate holds; dpc warns elsewhere */
	DP_WHEN_REQUIRES, /* true needs a predicate; an error elsewhere */
} DpWhen;

typedef struct {
	const char *name;          /* the DSL name (INTERNAL: the field's) */
	uint8_t section;           /* DpSection */
	int16_t spec, kind;        /* DP_SEC_ARG: the spec setting (a DP_SET_ id) and its kind */
	uint8_t type;              /* DpSetType */
	const char *const *words;  /* DP_ST_WORDS: the words, NULL-terminated */
	uint8_t rec, ctype;        /* DpRecord, DpCType */
	uint8_t alias;             /* 1: an earlier row owns the field (SAME) */
	uint16_t offset;           /* byte offset in its DpStep record (CFG, OPT, SCHED) */
	double dflt;               /* the default ... */
	int16_t dflt_set;          /* ... or the value of this setting (-1: dflt) */
	uint8_t lo_bound;          /* DpBound: DP_B_GE or DP_B_GT */
	double lo;
	uint8_t hi_bound;          /* DpBound: DP_B_NONE, LE, LT or LESET */
	double hi;                 /* DP_B_LESET: a DP_SET_ id */
	const char *zero;          /* what 0 means, or NULL */
	uint8_t ir_line, ir_mode;  /* DpIrLine, DpIrMode */
	const char *ir_key;        /* key=value on its IR line */
	uint8_t flag_prog;         /* DpFlagProg */
	const char *flag;          /* the flag's long name, or NULL */
	double flag_lo;            /* its smallest value (dpexec) */
	uint8_t when;              /* DpWhen */
	const char *when_doc;      /* where it applies / what it requires, for docs */
	const char *help;
} DpSetting;

typedef struct {
	int16_t spec;     /* the spec setting (a DP_SET_ id) */
	int16_t kind;     /* its value (DpOptKind, DpSchedKind) */
	const char *name; /* the DSL word */
	const char *help;
} DpKind;

extern const DpSetting dp_settings[DP_NSETTINGS]; /* ORDER SET */
extern const DpKind dp_kinds[];
extern const int dp_nkinds;

struct option; /* getopt_long's */
/* getopt_long's options: the n of fixed, then one per setting with a --flag
 * of program prog (DpFlagProg; required_argument, val = val0 + the setting's
 * id), then the terminator, into out (room for n + DP_NSETTINGS + 1). */
void dp_setting_options(struct option *out, const struct option *fixed, int n, int prog,
			int val0);

/* A help line: head, then text from column col (head's own line when it is
 * longer), wrapped at 84 columns with every line indented by col. */
void dp_help_line(FILE *f, const char *head, const char *text, int col);

/* The name of kind k of spec setting spec ("?" when there is none). */
const char *dp_kind_name(int spec, int k);
/* The kind of spec setting spec named word, or -1. */
int dp_kind_find(int spec, const char *word);
/* How many kinds spec setting spec has. */
int dp_kind_count(int spec);
/* How many values a BOOL, WORDS, STRATEGY, DTYPE or SPEC setting's field may
 * hold (its words, kinds, ...); 0 for the others. */
int dp_setting_nvalues(int id);

/* The row that owns the field row id writes (itself, or the row SAME names). */
int dp_setting_owner(int id);
/* Bytes of record rec (DP_REC_CFG, OPT, SCHED) in the step file. */
size_t dp_record_bytes(int rec);
/* The DpStep record a row's field lives in, or NULL (GRAPH, NONE). */
void *dp_step_record(DpStep *s, int rec);
/* The field of row id in s, or NULL when it is not in the step file. */
void *dp_setting_field(DpStep *s, int id);
static inline const void *dp_setting_cfield(const DpStep *s, int id)
{
	return dp_setting_field((DpStep *)s, id);
}

/* A field's value, by its C type (DP_CT_AXES: axis 0). */
double dp_field_get(const void *field, int ctype);
void dp_field_set(void *field, int ctype, double v);
/* The same for integers of any size (seeds, byte counts: beyond 2^53). */
int64_t dp_field_geti(const void *field, int ctype);
void dp_field_seti(void *field, int ctype, int64_t v);

/* "> 0", ">= 0 (0: no limit) and at most 1048576", "in [0, 1)": the valid
 * range of row id as the messages and docs say it; a LESET bound names the
 * other setting. Returns buf. */
char *dp_setting_range(int id, char *buf, size_t len);
/* The value v of row id as a user writes it: 25, 0.001, true, full_shard,
 * bf16. Returns buf. */
char *dp_setting_format(int id, double v, char *buf, size_t len);

#endif
