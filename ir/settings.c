/*
 * settings.c - where a Graph keeps each setting of format/settings.def (its
 * step-file records cfg, opt, sched, or a member of its own for the
 * compiler-only settings), and the defaults every graph starts from:
 * ir_new's, which are also those of hand-written IR without a directive or
 * key, and the front end's for what a file does not set. The IR's settings lines (ir/print.c,
 * ir/read.c) and the front end's checks (compiler/settings.c) go through
 * ir_setting_field.
 */
#include <stddef.h>

#include "ir.h"

#define DP_GREC_CFG(m) (int)offsetof(Graph, cfg.m)
#define DP_GREC_OPT(m) (int)offsetof(Graph, opt.m)
#define DP_GREC_SCHED(m) (int)offsetof(Graph, sched.m)
#define DP_GREC_GRAPH(m) (int)offsetof(Graph, m)
#define DP_GOFF_F(rec, ct, m) DP_GREC_##rec(m)
#define DP_GOFF_SAME(rec, ct, m) DP_GREC_##rec(m)
#define DP_GOFF_NOFIELD -1

/* Byte offset of each setting's field in a Graph, -1: none. ORDER SET */
static const int graph_offset[DP_NSETTINGS] = {
#define SET(id, where, name, type, field, ...) [DP_SET_##id] = DP_GOFF_##field,
#define KIND(...)
#include "settings.def"
#undef SET
#undef KIND
};

/* ORDER DpIrLine */
const char *const ir_line_names[DP_NIRL] = {"",         "mesh",     "config",   "optimizer",
					    "schedule", "strategy", "precision", "loss_scale", "compress"};

void *ir_setting_field(Graph *g, int id)
{
	if (id < 0 || id >= DP_NSETTINGS || graph_offset[id] < 0)
		return NULL;
	return (char *)g + graph_offset[id];
}

double ir_setting_get(const Graph *g, int id)
{
	const void *f = ir_setting_field((Graph *)g, id);
	return f ? dp_field_get(f, dp_settings[id].ctype) : 0;
}

/* The default of row id: its number, or the value of the setting it names. */
static double default_of(const Graph *g, int id)
{
	const DpSetting *st = &dp_settings[id];
	return st->dflt_set >= 0 ? ir_setting_get(g, st->dflt_set) : st->dflt;
}

void ir_settings_kind(Graph *g, int spec, int kind)
{
	void *f = ir_setting_field(g, spec);
	if (f)
		dp_field_set(f, dp_settings[spec].ctype, kind);
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->section == DP_SEC_ARG && st->spec == spec && (f = ir_setting_field(g, i)))
			dp_field_set(f, st->ctype, 0);
	}
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->section == DP_SEC_ARG && st->spec == spec && st->kind == kind &&
		    (f = ir_setting_field(g, i)))
			dp_field_set(f, st->ctype, default_of(g, i));
	}
}

void ir_settings_default(Graph *g)
{
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		void *f = ir_setting_field(g, i);
		if (!f || st->alias || st->section == DP_SEC_ARG)
			continue;
		if (st->type == DP_ST_SPEC)
			ir_settings_kind(g, i, (int)st->dflt);
		else
			dp_field_set(f, st->ctype, default_of(g, i));
	}
	snprintf(g->strategy, sizeof g->strategy, "%s",
		 dp_name(dp_strategy_names, DP_NSTRAT, g->cfg.strategy));
}
