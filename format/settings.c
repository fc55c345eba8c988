/*
 * settings.c - format/settings.def as data (dp_settings[], dp_kinds[]) and
 * the small queries every reader of it shares: fields by C type, kinds by
 * name, the valid range and a value as a user writes them. Linked into dpc,
 * dpexec and the CUDA backend (it is part of the step-file codec).
 */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "settings.h"

/* ---- the table: each column's macro, pasted onto its value ---- */

#define DP_W_TRAIN DP_SEC_TRAIN, -1, -1
#define DP_W_EVAL DP_SEC_EVAL, -1, -1
#define DP_W_INTERNAL DP_SEC_INTERNAL, -1, -1
#define DP_W_ARG(spec, k) DP_SEC_ARG, DP_SET_##spec, DP_KIND_OF_##spec(k)

#define DP_T_INT DP_ST_INT, NULL
#define DP_T_FLOAT DP_ST_FLOAT, NULL
#define DP_T_BOOL DP_ST_BOOL, NULL
#define DP_T_WORDS(...) DP_ST_WORDS, (const char *const[]){__VA_ARGS__, NULL}
#define DP_T_DTYPE DP_ST_DTYPE, NULL
#define DP_T_STRATEGY DP_ST_STRATEGY, NULL
#define DP_T_SPEC DP_ST_SPEC, NULL
#define DP_T_AXES DP_ST_AXES, NULL

#define DP_OFF_CFG(m) offsetof(DpConfig, m)
#define DP_OFF_OPT(m) offsetof(DpOptim, m)
#define DP_OFF_SCHED(m) offsetof(DpSched, m)
#define DP_OFF_GRAPH(m) 0 /* ir/settings.c knows the Graph */
#define DP_F_F(rec, ct, m) DP_REC_##rec, DP_CT_##ct, 0, DP_OFF_##rec(m)
#define DP_F_SAME(rec, ct, m) DP_REC_##rec, DP_CT_##ct, 1, DP_OFF_##rec(m)
#define DP_F_NOFIELD DP_REC_NONE, DP_CT_NONE, 0, 0

#define DP_D_D(x) (double)(x), -1
#define DP_D_DSET(id) 0, DP_SET_##id

#define DP_LO_GE(x) DP_B_GE, (double)(x)
#define DP_LO_GT(x) DP_B_GT, (double)(x)
#define DP_HI_LE(x) DP_B_LE, (double)(x)
#define DP_HI_LT(x) DP_B_LT, (double)(x)
#define DP_HI_NOMAX DP_B_NONE, 0
#define DP_HI_LESET(id) DP_B_LESET, DP_SET_##id

#define DP_Z_Z(s) s
#define DP_Z_NOZERO NULL

#define DP_IR_IR(line, key, mode) DP_IRL_##line, DP_IRM_##mode, key
#define DP_IR_NOIR DP_IRL_NONE, DP_IRM_ALWAYS, NULL

#define DP_FL_FLAG(prog, name, lo) DP_FLAG_##prog, name, (double)(lo)
#define DP_FL_NOFLAG DP_FLAG_NONE, NULL, 0

#define DP_WH_ALWAYS DP_WHEN_ALWAYS, NULL
#define DP_WH_APPLIES(pred, doc) DP_WHEN_APPLIES, doc
#define DP_WH_REQUIRES(pred, doc) DP_WHEN_REQUIRES, doc

const DpSetting dp_settings[DP_NSETTINGS] = {
#define SET(id, where, name, type, field, dflt, lo, hi, zero, ir, flag, when, help)    \
	[DP_SET_##id] = {name,          DP_W_##where, DP_T_##type, DP_F_##field,          \
			 DP_D_##dflt,   DP_LO_##lo,   DP_HI_##hi,  DP_Z_##zero,           \
			 DP_IR_##ir,    DP_FL_##flag, DP_WH_##when, help},
#define KIND(...)
#include "settings.def"
#undef SET
#undef KIND
};

const DpKind dp_kinds[] = {
#define SET(...)
#define KIND(spec, id, name, help) {DP_SET_##spec, DP_KIND_OF_##spec(id), name, help},
#include "settings.def"
#undef SET
#undef KIND
};
const int dp_nkinds = (int)(sizeof dp_kinds / sizeof dp_kinds[0]);

void dp_setting_options(struct option *out, const struct option *fixed, int n, int prog,
			int val0)
{
	memcpy(out, fixed, sizeof *out * (size_t)n);
	for (int i = 0; i < DP_NSETTINGS; i++)
		if (dp_settings[i].flag_prog == prog)
			out[n++] = (struct option){dp_settings[i].flag, required_argument, NULL, val0 + i};
	out[n] = (struct option){NULL, 0, NULL, 0};
}

void dp_help_line(FILE *f, const char *head, const char *text, int col)
{
	const int width = 84;
	if ((int)strlen(head) < col)
		fprintf(f, "%-*s", col, head);
	else
		fprintf(f, "%s\n%*s", head, col, "");
	while (*text) {
		int n = (int)strlen(text), cut = n;
		if (col + n > width) {
			cut = width - col;
			while (cut > 0 && text[cut] != ' ')
				cut--;
			if (cut <= 0)
				cut = (int)strcspn(text, " ");
		}
		fprintf(f, "%.*s\n", cut, text);
		text += cut;
		while (*text == ' ')
			text++;
		if (*text)
			fprintf(f, "%*s", col, "");
	}
}

/* ---- kinds ---- */

const char *dp_kind_name(int spec, int k)
{
	for (int i = 0; i < dp_nkinds; i++)
		if (dp_kinds[i].spec == spec && dp_kinds[i].kind == k)
			return dp_kinds[i].name;
	return "?";
}

int dp_kind_find(int spec, const char *word)
{
	for (int i = 0; i < dp_nkinds; i++)
		if (dp_kinds[i].spec == spec && strcmp(dp_kinds[i].name, word) == 0)
			return dp_kinds[i].kind;
	return -1;
}

int dp_kind_count(int spec)
{
	int n = 0;
	for (int i = 0; i < dp_nkinds; i++)
		n += dp_kinds[i].spec == spec;
	return n;
}

int dp_setting_nvalues(int id)
{
	const DpSetting *st = &dp_settings[id];
	switch (st->type) {
	case DP_ST_BOOL:
		return 2;
	case DP_ST_WORDS: {
		int n = 0;
		while (st->words[n])
			n++;
		return n;
	}
	case DP_ST_DTYPE:
		return DP_NDTYPE;
	case DP_ST_STRATEGY:
		return DP_NSTRAT;
	case DP_ST_SPEC:
		return dp_kind_count(id);
	default:
		return 0;
	}
}

/* ---- fields ---- */

int dp_setting_owner(int id)
{
	const DpSetting *st = &dp_settings[id];
	if (!st->alias)
		return id;
	for (int i = 0; i < id; i++)
		if (dp_settings[i].rec == st->rec && dp_settings[i].offset == st->offset &&
		    !dp_settings[i].alias)
			return i;
	return id;
}

static size_t ctype_bytes(int ct)
{
	switch (ct) {
	case DP_CT_U32:
	case DP_CT_F32:
	case DP_CT_INT:
		return 4;
	case DP_CT_U64:
		return 8;
	case DP_CT_AXES:
		return 4 * DP_MAX_AXES;
	default:
		return 0;
	}
}

size_t dp_record_bytes(int rec)
{
	size_t n = 0;
	for (int i = 0; i < DP_NSETTINGS; i++)
		if (dp_settings[i].rec == rec && !dp_settings[i].alias)
			n += ctype_bytes(dp_settings[i].ctype);
	return n;
}

void *dp_step_record(DpStep *s, int rec)
{
	switch (rec) {
	case DP_REC_CFG:
		return &s->cfg;
	case DP_REC_OPT:
		return &s->opt;
	case DP_REC_SCHED:
		return &s->sched;
	default:
		return NULL;
	}
}

void *dp_setting_field(DpStep *s, int id)
{
	char *r = dp_step_record(s, dp_settings[id].rec);
	return r ? r + dp_settings[id].offset : NULL;
}

double dp_field_get(const void *f, int ct)
{
	switch (ct) {
	case DP_CT_U32:
	case DP_CT_AXES:
		return *(const uint32_t *)f;
	case DP_CT_U64:
		return (double)*(const uint64_t *)f;
	case DP_CT_F32:
		return *(const float *)f;
	case DP_CT_INT:
		return *(const int *)f;
	default:
		return 0;
	}
}

void dp_field_set(void *f, int ct, double v)
{
	switch (ct) {
	case DP_CT_U32:
		*(uint32_t *)f = (uint32_t)v;
		break;
	case DP_CT_AXES:
		for (int a = 0; a < DP_MAX_AXES; a++)
			((uint32_t *)f)[a] = (uint32_t)v;
		break;
	case DP_CT_U64:
		*(uint64_t *)f = (uint64_t)v;
		break;
	case DP_CT_F32:
		*(float *)f = (float)v;
		break;
	case DP_CT_INT:
		*(int *)f = (int)v;
		break;
	}
}

int64_t dp_field_geti(const void *f, int ct)
{
	if (ct == DP_CT_U64)
		return (int64_t)*(const uint64_t *)f;
	return (int64_t)dp_field_get(f, ct);
}

void dp_field_seti(void *f, int ct, int64_t v)
{
	if (ct == DP_CT_U64)
		*(uint64_t *)f = (uint64_t)v;
	else
		dp_field_set(f, ct, (double)v);
}

/* ---- words ---- */

/* A bound as people write it: 2^31-1 rather than 2147483647. */
static void put_bound(char *buf, size_t len, int type, double x)
{
	if (type != DP_ST_FLOAT && x == (double)INT32_MAX)
		snprintf(buf, len, "2^31-1");
	else if (type != DP_ST_FLOAT && x >= (double)INT64_MAX)
		snprintf(buf, len, "2^63-1");
	else if (type != DP_ST_FLOAT && x >= 1024 && x == (double)((int64_t)1 << (int)log2(x)))
		snprintf(buf, len, "2^%d", (int)log2(x));
	else
		snprintf(buf, len, "%.10g", x);
}

char *dp_setting_range(int id, char *buf, size_t len)
{
	const DpSetting *st = &dp_settings[id];
	char lo[32], hi[64], z[96] = "";
	put_bound(lo, sizeof lo, st->type, st->lo);
	if (st->hi_bound == DP_B_LESET)
		snprintf(hi, sizeof hi, "%s", dp_settings[(int)st->hi].name);
	else
		put_bound(hi, sizeof hi, st->type, st->hi);
	if (st->zero && st->lo == 0 && st->lo_bound == DP_B_GE)
		snprintf(z, sizeof z, " (0: %s)", st->zero);
	if (st->type == DP_ST_INT) {
		snprintf(buf, len, "%s ... %s", lo, st->hi_bound == DP_B_NONE ? "" : hi);
		return buf;
	}
	const char *lop = st->lo_bound == DP_B_GT ? ">" : ">=";
	switch (st->hi_bound) {
	case DP_B_NONE:
		snprintf(buf, len, "%s %s%s", lop, lo, z);
		break;
	case DP_B_LE:
		snprintf(buf, len, "%s %s%s and at most %s", lop, lo, z, hi);
		break;
	default: /* LT, LESET: an interval */
		snprintf(buf, len, "in %c%s, %s%c%s", st->lo_bound == DP_B_GT ? '(' : '[', lo, hi,
			 st->hi_bound == DP_B_LT ? ')' : ']', z);
		break;
	}
	return buf;
}

char *dp_setting_format(int id, double v, char *buf, size_t len)
{
	const DpSetting *st = &dp_settings[id];
	int k = (int)v, n = dp_setting_nvalues(id);
	const char *w = NULL;
	switch (st->type) {
	case DP_ST_BOOL:
		w = v != 0 ? "true" : "false";
		break;
	case DP_ST_WORDS:
		w = k >= 0 && k < n ? st->words[k] : "?";
		break;
	case DP_ST_DTYPE:
		w = dp_name(dp_dtype_names, DP_NDTYPE, (unsigned)k);
		break;
	case DP_ST_STRATEGY:
		w = dp_name(dp_strategy_names, DP_NSTRAT, (unsigned)k);
		break;
	case DP_ST_SPEC:
		w = dp_kind_name(id, k);
		break;
	case DP_ST_FLOAT:
		snprintf(buf, len, "%g", v);
		return buf;
	default:
		snprintf(buf, len, "%.0f", v);
		return buf;
	}
	snprintf(buf, len, "%s", w);
	return buf;
}
