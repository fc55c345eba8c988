/*
 * print.c - the text form of the IR (ir_print): the user's window into dp.
 *
 * The same text reads back with ir_read (ir/read.c), and
 * print(read(print(g))) == print(g) byte for byte. The form, top to bottom:
 *
 *   ; dp IR after schedule (models/mlp.dp)   header: restores g->file
 *   mesh dp_replicate=1 dp_shard=2 cp=1 tp=1   the settings lines: the IR column
 *   config micro_batch=32 grad_accum=2 ...    of format/settings.def (each line's
 *   optimizer adamw lr=0.001 ... clip=1        rows in row order; NONZERO keys only
 *   schedule cosine ...                        when set)
 *   strategy ddp ...
 *   precision param_dtype=bf16 ...             when not all f32
 *   memory peak=N persistent=N                 once planned
 *   roles loss=%loss logits=%logits labels=%y  the cross-entropy's values
 *   metrics loss=%loss.sum grad_norm=%grad_norm eval_loss=... eval_correct=...
 *   events 4
 *   block fc1 strategy=ddp                     strategy=, reshard_after_forward=, recompute=,
 *                                              param_dtype=, buffer_dtype=,
 *                                              weight_decay=, lr_scale=, compress=,
 *                                              offload=
 *                                              when the block overrides train's
 *   source train idx "PATH" -> %x features sample=784 line=8
 *   bucket r0 all_reduce axes=dp_replicate,dp_shard elems=1290 %bucket.r0 = %g1, %g2
 *
 *   %x     : f32[32,784] data source=0 @0              # 100 KB
 *   %fc1.w : f32[784,256] param block=fc1 init=normal(0,0.05) view=%flat.params+0
 *
 *   %t0 : f32[32,256] = linear %x, %fc1.w, %fc1.b      fwd fc1    # 12.8 MFLOP
 *   %grad.fc1.w = matmul %x, %d.t0 transA acc          bwd fc1    # 12.8 MFLOP
 *   all_reduce %bucket.r0 axes=dp_replicate,dp_shard   comm fc1 last stream=comm bucket=r0
 *
 * Declarations list every value not defined inline by its SSA node, in value
 * order: `%name : type kind attrs`. Value attributes: block=, init=kind(a,b),
 * ld=N (rows padded to N elements: passes/padvocab.c), view=%flat+ELEMS,
 * of=%param (a gradient), source=N, place(axis: shardD |
 * partial), @OFFSET (arena bytes) and nbytes=N when it differs from the
 * tensor's size. A node line is `[%out : type [place] [@off] =] op ins attrs`
 * for a new SSA temporary, `%out = op ...` when it writes a declared value,
 * `op ...` when it writes nothing; inputs are `%v` or `_` (-1, an absent
 * optional operand). Then the op's attributes (format/ops.def), then the phase,
 * the block name (quoted when it is not a plain word or is one of the words
 * below, like "eval"; block=NAME reads too), the programs when not the
 * phase's default (none, step, eval, both = step+eval, init, export; any
 * other mask as progs=N), sample (also in the sample program, passes/sample.c),
 * last (DP_IF_LAST), first (DP_IF_FIRST), compressed / plain (DP_IF_COMPRESSED / DP_IF_PLAIN: from
 * compress's start_step on / before it), recompute (a forward node re-run
 * before its block's backward), stage=N (the pipeline stage that runs it),
 * chunk=N (its virtual stage under `pipeline interleaved`), offload=W (an
 * update's offload where it is not train's: per-block offload),
 * stream=comm, stream=copy or stream=p2p (DpStream), bucket=rN.
 * Phases: data, fwd, bwd, comm, opt, eval, setup (the init and export
 * programs; their default program is init, so an export node says export).
 *
 * Types: f32[32,784]; `?` is an f32 value of unknown shape (the front end's
 * temporaries before the shape pass); i32[] another dtype with ndim 0.
 * Names that are not plain words ([A-Za-z0-9_.]) are quoted: %"h[0].w".
 * Floats print in the shortest form that reads back to the same float.
 * Everything after `#` or `;` is a comment: sizes of declarations, FLOPs of
 * compute nodes (ir_ops[op].cost), bytes per rank of collectives in the
 * nccl-tests bus convention (all_reduce 2(n-1)/n*S, all_gather and
 * reduce_scatter (n-1)/n*S, S = the whole buffer, n = ranks in the group).
 *
 * The printer never trusts the graph: a broken graph (bad ids) still prints,
 * with `%?N` for an id out of range, so a dump can show what went wrong.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* Column limits: a longer cell breaks the alignment of its own line only. */
#define DECL_NAME_CAP 28
#define DECL_TYPE_CAP 20
#define NODE_BODY_CAP 72
#define COMMENT_CAP 120

/* ---- a growable string ---- */

typedef struct {
	char *s;
	size_t len, cap;
} Buf;

static void bput(Buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t nc = b->cap ? b->cap * 2 : 64;
		while (nc < b->len + n + 1)
			nc *= 2;
		char *ns = realloc(b->s, nc);
		if (!ns)
			die("out of memory printing IR");
		b->s = ns;
		b->cap = nc;
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

static void bputs(Buf *b, const char *s)
{
	bput(b, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void bprintf(Buf *b, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof tmp) {
		bput(b, tmp, (size_t)n);
		return;
	}
	char *big = malloc((size_t)n + 1);
	if (!big)
		die("out of memory printing IR");
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	bput(b, big, (size_t)n);
	free(big);
}

static const char *bstr(const Buf *b)
{
	return b->s ? b->s : "";
}

static void pad(FILE *out, size_t n)
{
	while (n--)
		fputc(' ', out);
}

/* ---- atoms ---- */

/* A character that may appear in an unquoted name (must match read.c). */
static int plain_char(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.';
}

static int plain_word(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (!plain_char((unsigned char)*s))
			return 0;
	return 1;
}

/* A double-quoted string with C escapes (\\ \" \n \t \xHH). */
static void put_quoted(Buf *b, const char *s)
{
	bputs(b, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			bprintf(b, "\\%c", c);
		else if (c == '\n')
			bputs(b, "\\n");
		else if (c == '\t')
			bputs(b, "\\t");
		else if (c < 0x20 || c == 0x7f)
			bprintf(b, "\\x%02x", c);
		else
			bput(b, (const char *)&c, 1);
	}
	bputs(b, "\"");
}

static void put_word(Buf *b, const char *s)
{
	if (plain_word(s))
		bputs(b, s);
	else
		put_quoted(b, s);
}

/* %name, `_` for -1, %?N for an id out of range. */
static void put_ref(Buf *b, const Graph *g, int id)
{
	if (id == -1) {
		bputs(b, "_");
		return;
	}
	if (id < 0 || id >= g->nvalues || !g->values[id]) {
		bprintf(b, "%%?%d", id);
		return;
	}
	bputs(b, "%");
	put_word(b, g->values[id]->name ? g->values[id]->name : "");
}

/* The shortest %g form that reads back (strtof) to the same float; plain
 * notation for ordinary magnitudes (4000, not 4e+03). */
static void put_float(Buf *b, float f)
{
	char tmp[48];
	if (isnan(f)) {
		bputs(b, signbit(f) ? "-nan" : "nan");
		return;
	}
	float mag = fabsf(f);
	for (int p = 1; p <= 9; p++) {
		snprintf(tmp, sizeof tmp, "%.*g", p, (double)f);
		float back = strtof(tmp, NULL);
		if (memcmp(&back, &f, sizeof f) != 0)
			continue;
		if (strchr(tmp, 'e') && mag >= 1e-4f && mag < 1e7f)
			continue;
		bputs(b, tmp);
		return;
	}
	snprintf(tmp, sizeof tmp, "%.9g", (double)f);
	bputs(b, tmp);
}

static const char *name_of(const char *const *names, size_t n, unsigned i)
{
	return i < n ? names[i] : "?";
}

static void put_type(Buf *b, const Value *v)
{
	if (v->ndim == 0 && v->dtype == DP_F32) {
		bputs(b, "?");
		return;
	}
	bprintf(b, "%s[", ir_dtype_name(v->dtype));
	int nd = v->ndim < 0 ? 0 : v->ndim > DP_MAX_DIMS ? DP_MAX_DIMS : v->ndim;
	for (int i = 0; i < nd; i++)
		bprintf(b, "%s%" PRId64, i ? "," : "", v->dims[i]);
	bputs(b, "]");
}

static void put_axes(Buf *b, uint64_t mask)
{
	if (mask >> DP_MAX_AXES) {
		bprintf(b, "%" PRIu64, mask);
		return;
	}
	int first = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (mask & DP_AXIS_BIT(a)) {
			bprintf(b, "%s%s", first ? "" : ",", ir_axis_names[a]);
			first = 0;
		}
}

/* A set of pipeline stages: 0,3 (bit k: stage k). */
static void put_stages(Buf *b, uint64_t set)
{
	int first = 1;
	for (int k = 0; k < 64; k++)
		if (set >> k & 1) {
			bprintf(b, "%s%d", first ? "" : ",", k);
			first = 0;
		}
}

/* place(dp_shard: shard0, tp: partial), only for axes that are not replicated. */
static void put_place(Buf *b, const Value *v)
{
	int any = 0;
	for (int a = 0; a < DP_MAX_AXES; a++) {
		Place p = v->place[a];
		if (p.kind == DP_PL_REPLICATE && p.dim == -1)
			continue;
		bprintf(b, "%s%s: ", any ? ", " : " place(", ir_axis_names[a]);
		any = 1;
		if (p.kind == DP_PL_SHARD)
			bprintf(b, "shard%d", p.dim);
		else if (p.kind == DP_PL_PARTIAL)
			bputs(b, "partial");
		else if (p.kind == DP_PL_REPLICATE)
			bputs(b, "replicate");
		else
			bprintf(b, "?%d", p.kind);
	}
	if (any)
		bputs(b, ")");
}

static int64_t value_bytes(const Value *v)
{
	if ((unsigned)v->dtype >= DP_NDTYPE || v->ndim < 0 || v->ndim > DP_MAX_DIMS)
		return 0;
	return ir_span(v) * (int64_t)ir_dtype_size(v->dtype);
}

/* host (the host arena's: offload), @OFFSET, and nbytes=N unless it is what the reader implies: the tensor's
 * own size once planned (offset set), 0 before. */
static void put_memory(Buf *b, const Value *v)
{
	if (v->space == DP_SPACE_HOST)
		bprintf(b, " host");
	if (v->offset != -1)
		bprintf(b, " @%" PRId64, v->offset);
	if (v->nbytes != (v->offset != -1 ? value_bytes(v) : 0))
		bprintf(b, " nbytes=%" PRId64, v->nbytes);
}

/* 3 significant digits with an SI prefix: "803 KB", "12.8 MFLOP". */
static void put_si(Buf *b, double x, const char *unit)
{
	static const char *const prefix[] = {"", "K", "M", "G", "T", "P"};
	size_t k = 0;
	while (k + 1 < NELEMS(prefix) && x >= 999.5) {
		x /= 1000;
		k++;
	}
	if (k == 0)
		bprintf(b, "%.0f %s", x, unit);
	else
		bprintf(b, x < 99.95 ? "%.1f %s%s" : "%.0f %s%s", x, prefix[k], unit);
}

/* ---- header and directives ---- */

/* The value of setting id, as its IR line shows it. */
static void put_setting(Buf *b, const Graph *g, int id)
{
	const DpSetting *st = &dp_settings[id];
	const void *f = ir_setting_field((Graph *)g, id);
	if (st->type == DP_ST_DTYPE) {
		bputs(b, name_of(dp_dtype_names, DP_NDTYPE, (unsigned)*(const int *)f));
		return;
	}
	switch (st->ctype) {
	case DP_CT_U32:
		bprintf(b, "%u", *(const uint32_t *)f);
		break;
	case DP_CT_U64:
		bprintf(b, "%" PRIu64, *(const uint64_t *)f);
		break;
	case DP_CT_F32:
		put_float(b, *(const float *)f);
		break;
	case DP_CT_INT:
		bprintf(b, "%d", *(const int *)f);
		break;
	}
}

/* The settings lines, from the IR column of format/settings.def: each line's
 * rows in row order, key=value (or the line's head word); the precision
 * line only when something is not f32, the loss_scale line only when it is
 * not none. */
static void print_settings(Buf *b, const Graph *g)
{
	for (int line = DP_IRL_MESH; line < DP_NIRL; line++) {
		if ((line == DP_IRL_PRECISION && !ir_mixed_precision(g)) ||
		    (line == DP_IRL_LOSS_SCALE && g->opt.loss_scale == DP_LS_NONE) ||
		    (line == DP_IRL_COMPRESS && g->cfg.compress == DP_COMPRESS_NONE))
			continue;
		bputs(b, ir_line_names[line]);
		for (int i = 0; i < DP_NSETTINGS; i++) {
			const DpSetting *st = &dp_settings[i];
			const void *f = ir_setting_field((Graph *)g, i);
			if (st->ir_line != line || !f)
				continue;
			/* interleaved's alone: the other schedules print as before it */
			if (i == DP_SET_STAGES_PER_RANK && g->pipeline != IR_PIPE_INTERLEAVED)
				continue;
			if (st->ctype == DP_CT_AXES) {
				/* pp=1 is left out: a model without pipeline
				 * stages prints as it did before the axis */
				for (int a = 0; a < DP_MAX_AXES; a++)
					if (a != DP_AXIS_PP || ((const uint32_t *)f)[a] != 1)
						bprintf(b, " %s=%u", ir_axis_names[a],
							((const uint32_t *)f)[a]);
			} else if (st->ir_mode == DP_IRM_HEAD) {
				unsigned k = (unsigned)dp_field_geti(f, st->ctype);
				bputs(b, " ");
				put_word(b, st->type == DP_ST_SPEC ? dp_kind_name(i, (int)k)
								   : dp_name(dp_strategy_names, DP_NSTRAT, k));
			} else if (st->ir_mode == DP_IRM_ALWAYS || dp_field_get(f, st->ctype) != 0) {
				bprintf(b, " %s=", st->ir_key);
				put_setting(b, g, i);
			}
		}
		bputs(b, "\n");
	}
}

static void print_directives(FILE *out, const Graph *g)
{
	Buf b = {0};
	print_settings(&b, g);
	fputs(bstr(&b), out);
	b.len = 0;

	if (g->peak_bytes || g->persistent_bytes)
		fprintf(out, "memory peak=%" PRId64 " persistent=%" PRId64 "\n", g->peak_bytes,
			g->persistent_bytes);

	const char *const rkeys[] = {"loss", "logits", "labels"};
	const int rvals[] = {g->loss, g->logits, g->labels};
	const char *const mkeys[] = {"loss", "grad_norm", "eval_loss", "eval_correct",
				     "sample_tokens", "sample_logits"};
	const int mvals[] = {g->metrics.loss, g->metrics.grad_norm, g->metrics.eval_loss,
			     g->metrics.eval_correct, g->metrics.sample_tokens,
			     g->metrics.sample_logits};
	for (int pass = 0; pass < 2; pass++) {
		const char *const *keys = pass ? mkeys : rkeys;
		const int *vals = pass ? mvals : rvals;
		int n = pass ? 6 : 3;
		b.len = 0;
		for (int i = 0; i < n; i++) {
			if (vals[i] == -1)
				continue;
			bprintf(&b, " %s=", keys[i]);
			put_ref(&b, g, vals[i]);
		}
		if (b.len)
			fprintf(out, "%s%s\n", pass ? "metrics" : "roles", bstr(&b));
	}
	if (g->nevents)
		fprintf(out, "events %d\n", g->nevents);

	for (int i = 0; i < g->nblocks; i++) {
		b.len = 0;
		const Block *bl = &g->blocks[i];
		put_word(&b, bl->name ? bl->name : "");
		if (bl->strategy >= 0 && bl->strategy < DP_NSTRAT)
			bprintf(&b, " strategy=%s", dp_strategy_names[bl->strategy]);
		if (bl->reshard >= 0)
			bprintf(&b, " reshard_after_forward=%d", bl->reshard);
		if (bl->recompute)
			bprintf(&b, " recompute=%d", bl->recompute);
		if (bl->stage >= 0)
			bprintf(&b, " stage=%d", bl->stage);
		if (bl->chunk >= 0)
			bprintf(&b, " chunk=%d", bl->chunk);
		if (bl->param_dtype >= 0)
			bprintf(&b, " param_dtype=%s",
				name_of(dp_dtype_names, DP_NDTYPE, (unsigned)bl->param_dtype));
		if (bl->buffer_dtype >= 0)
			bprintf(&b, " buffer_dtype=%s",
				name_of(dp_dtype_names, DP_NDTYPE, (unsigned)bl->buffer_dtype));
		if (bl->weight_decay >= 0)
			bprintf(&b, " weight_decay=%.9g", bl->weight_decay);
		if (bl->lr_scale != 1)
			bprintf(&b, " lr_scale=%.9g", bl->lr_scale);
		if (bl->compress >= 0)
			bprintf(&b, " compress=%s", dp_kind_name(DP_SET_COMPRESS, bl->compress));
		if (bl->offload >= 0)
			bprintf(&b, " offload=%s", dp_settings[DP_SET_OFFLOAD].words[bl->offload]);
		fprintf(out, "block %s\n", bstr(&b));
	}
	for (int i = 0; i < g->nsources; i++) {
		const Source *src = &g->sources[i];
		b.len = 0;
		bprintf(&b, "source %s %s ", name_of(ir_split_names, NELEMS(ir_split_names), src->rec.split),
			name_of(ir_src_kind_names, NELEMS(ir_src_kind_names), src->rec.kind));
		put_quoted(&b, src->path ? src->path : "");
		bputs(&b, " -> ");
		put_ref(&b, g, src->value);
		bprintf(&b, " %s sample=%" PRId64, name_of(ir_role_names, NELEMS(ir_role_names), src->rec.role),
			src->rec.sample_elems);
		if (src->rec.shift)
			bprintf(&b, " shift=%u", (unsigned)src->rec.shift);
		if (src->rec.seq_split)
			bprintf(&b, " seq_split=%u", (unsigned)src->rec.seq_split);
		if (src->rec.synth_n || src->rec.synth_classes)
			bprintf(&b, " n=%" PRId64 " classes=%d", src->rec.synth_n, src->rec.synth_classes);
		if (src->rec.src_line)
			bprintf(&b, " line=%u", src->rec.src_line);
		fprintf(out, "%s\n", bstr(&b));
	}
	for (int i = 0; i < g->nbuckets; i++) {
		const Bucket *bk = &g->buckets[i];
		b.len = 0;
		bprintf(&b, "bucket r%d %s axes=", i,
			(unsigned)bk->op < DP_NOPS ? dp_op_names[bk->op] : "?");
		put_axes(&b, bk->axes);
		bprintf(&b, " elems=%" PRId64 " ", bk->elems);
		put_ref(&b, g, bk->view);
		bputs(&b, " =");
		for (int m = 0; m < bk->nmembers; m++) {
			bputs(&b, m ? ", " : " ");
			put_ref(&b, g, bk->members ? bk->members[m] : -2);
		}
		fprintf(out, "%s\n", bstr(&b));
	}
	free(b.s);
}

/* ---- declarations ---- */

/* The node a value is defined by inline (`%v : type = op ...`), or NULL: a
 * plain SSA temporary whose def names a node in the graph that writes it. */
static const Node *inline_def(const Value *v, const Node *const *byid, int nid)
{
	if (v->kind != DP_T_ACT || v->def < 0 || v->def >= nid || !byid[v->def])
		return NULL;
	const Node *n = byid[v->def];
	if (n->out != v->id || v->view_of != -1 || v->ld || v->grad != -1 || v->param != -1 ||
	    v->source != -1 || v->init != DP_INIT_NONE || v->init_a != 0 || v->init_b != 0)
		return NULL;
	if (v->block != -1 && v->block != n->block)
		return NULL;
	return n;
}

typedef struct {
	Buf name, type, rest, comment;
} DeclLine;

static void decl_line(DeclLine *l, const Graph *g, const Value *v)
{
	put_ref(&l->name, g, v->id);
	put_type(&l->type, v);
	bputs(&l->rest, (unsigned)v->kind <= DP_T_BUFFER ? ir_kind_names[v->kind] : "?");
	if (v->block != -1) {
		bputs(&l->rest, " block=");
		if (v->block >= 0 && v->block < g->nblocks)
			put_word(&l->rest, g->blocks[v->block].name);
		else
			bprintf(&l->rest, "?%d", v->block);
	}
	if (v->init != DP_INIT_NONE || v->init_a != 0 || v->init_b != 0) {
		bprintf(&l->rest, " init=%s", name_of(ir_init_names, NELEMS(ir_init_names), v->init));
		if (v->init == DP_INIT_NORMAL || v->init == DP_INIT_UNIFORM || v->init_a != 0 ||
		    v->init_b != 0) {
			bputs(&l->rest, "(");
			put_float(&l->rest, v->init_a);
			bputs(&l->rest, ",");
			put_float(&l->rest, v->init_b);
			bputs(&l->rest, ")");
		}
	}
	if (v->ld)
		bprintf(&l->rest, " ld=%" PRId64, v->ld);
	if (v->view_of != -1) {
		bputs(&l->rest, " view=");
		put_ref(&l->rest, g, v->view_of);
		bprintf(&l->rest, "+%" PRId64, v->view_offset);
	}
	if (v->param != -1) {
		bputs(&l->rest, " of=");
		put_ref(&l->rest, g, v->param);
	}
	if (v->source != -1)
		bprintf(&l->rest, " source=%d", v->source);
	put_place(&l->rest, v);
	put_memory(&l->rest, v);
	if (v->ndim > 0)
		put_si(&l->comment, (double)value_bytes(v), "B");
}

/* ---- nodes ---- */

typedef struct {
	Buf body, attrs, comment;
} NodeLine;

/* The word for a program mask (read.c's progs_words must match); NULL when
 * the mask has none (it prints as progs=N). */
static const char *progs_word(unsigned progs)
{
	switch (progs) {
	case 0: return "none";
	case IR_IN_STEP: return "step";
	case IR_IN_EVAL: return "eval";
	case IR_IN_STEP | IR_IN_EVAL: return "both";
	case IR_IN_INIT: return "init";
	case IR_IN_EXPORT: return "export";
	default: return NULL;
	}
}

const char *const ir_reserved_words[IR_NRESERVED] = {
	"data", "fwd", "bwd", "comm", "opt", "eval", "setup", "step", "both", "none", "init",
	"export", "last", "recompute", "sample", "compressed", "plain", "first"};

/* A block named like a reserved word prints quoted. */
static int reserved_word(const char *s)
{
	for (size_t i = 0; i < IR_NRESERVED; i++)
		if (strcmp(s, ir_reserved_words[i]) == 0)
			return 1;
	return 0;
}

static int value_ok(const Graph *g, int id)
{
	return id >= 0 && id < g->nvalues && g->values[id];
}

/* Can the op's cost function be trusted with this node? Operands in range,
 * the arity the table declares, shapes known. */
static int cost_safe(const Graph *g, const Node *n)
{
	const OpInfo *oi = &ir_ops[n->op];
	if (!oi->cost || n->nin < 0 || n->nin > DP_MAX_IN)
		return 0;
	if (n->nin < oi->min_in || n->nin > oi->max_in)
		return 0;
	for (int i = 0; i < n->nin; i++) {
		if (n->in[i] == -1)
			continue;
		if (!value_ok(g, n->in[i]) || g->values[n->in[i]]->ndim <= 0 ||
		    g->values[n->in[i]]->ndim > DP_MAX_DIMS)
			return 0;
	}
	if (n->out != -1 && (!value_ok(g, n->out) || g->values[n->out]->ndim <= 0 ||
			     g->values[n->out]->ndim > DP_MAX_DIMS))
		return 0;
	return 1;
}

/* Bytes per rank of a collective, nccl-tests' bus convention. */
static void collective_comment(Buf *b, const Graph *g, const Node *n)
{
	/* S is the whole buffer: all_reduce in place, reduce_scatter's input,
	 * all_gather's output. */
	int whole = (n->op == DP_OP_REDUCE_SCATTER || n->op == DP_OP_SEND) && n->nin > 0 ? n->in[0]
											 : n->out;
	if (n->op == DP_OP_ALL_REDUCE && n->out == -1 && n->nin > 0)
		whole = n->in[0];
	if (!value_ok(g, whole) || g->values[whole]->ndim == 0)
		return; /* not shaped yet (before the shape pass) */
	double size = (double)value_bytes(g->values[whole]);
	if (n->op == DP_OP_SEND || n->op == DP_OP_RECV) { /* one peer, the whole value */
		put_si(b, size, "B");
		bprintf(b, " %s stage %lld", n->op == DP_OP_SEND ? "to" : "from", (long long)DP_PEER(n));
		return;
	}
	double ranks = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if ((uint64_t)DP_AXES(n) & DP_AXIS_BIT(a))
			ranks *= g->cfg.mesh[a];
	uint64_t set = n->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(n, ALL_REDUCE, stages) : 0;
	if (set && g->cfg.mesh[DP_AXIS_PP] > 0) /* a sub-group of the pp stages */
		ranks = ranks / g->cfg.mesh[DP_AXIS_PP] * __builtin_popcountll(set);
	double factor = ranks <= 1 ? 0 : (ranks - 1) / ranks;
	if (n->op == DP_OP_ALL_REDUCE || n->op == DP_OP_TP_REDUCE)
		factor *= 2;
	put_si(b, size * factor, "B");
	bprintf(b, "/rank (bus, n=%.0f)", ranks);
}

static void op_attrs(Buf *b, const Node *n)
{
	unsigned named_i = 0, named_f = 0; /* attribute slots printed by name */
	for (const OpAttr *a = ir_ops[n->op].attrs; a->name; a++) {
		if (a->style == IR_ATTR_FLOAT) {
			named_f |= 1u << a->slot;
			float f = IR_FATTR(n, a);
			if (f != 0 || signbit(f) || isnan(f)) {
				bprintf(b, " %s=", a->name);
				put_float(b, f);
			}
			continue;
		}
		named_i |= 1u << a->slot;
		int64_t x = IR_ATTR(n, a);
		if (x == 0 && a->style != IR_ATTR_ALWAYS)
			continue;
		if (a->style == IR_ATTR_FLAG && x == 1)
			bprintf(b, " %s", a->name);
		else if (a->style == IR_ATTR_AXES) {
			bprintf(b, " %s=", a->name);
			if (x < 0)
				bprintf(b, "%" PRId64, x);
			else
				put_axes(b, (uint64_t)x);
		} else if (a->style == IR_ATTR_STAGES) {
			bprintf(b, " %s=", a->name);
			put_stages(b, (uint64_t)x);
		} else
			bprintf(b, " %s=%" PRId64, a->name, x);
	}
	for (int i = 0; i < DP_NIATTR; i++)
		if (!(named_i & (1u << i)) && n->ia[i] != 0)
			bprintf(b, " ia%d=%" PRId64, i, n->ia[i]);
	for (int i = 0; i < DP_NFATTR; i++) {
		float f = n->fa[i];
		if (!(named_f & (1u << i)) && (f != 0 || signbit(f) || isnan(f))) {
			bprintf(b, " fa%d=", i);
			put_float(b, f);
		}
	}
}

static void node_line(NodeLine *l, const Graph *g, const Node *n, const Node *const *byid, int nid)
{
	Buf *b = &l->body;
	int op_ok = (unsigned)n->op < DP_NOPS;
	if (n->out != -1) {
		put_ref(b, g, n->out);
		const Value *v = value_ok(g, n->out) ? g->values[n->out] : NULL;
		if (v && inline_def(v, byid, nid) == n) {
			bputs(b, " : ");
			put_type(b, v);
			put_place(b, v);
			put_memory(b, v);
		}
		bputs(b, " = ");
	}
	if (op_ok)
		bputs(b, dp_op_names[n->op]);
	else
		bprintf(b, "?op%d", (int)n->op);
	int nin = n->nin < 0 ? 0 : n->nin > DP_MAX_IN ? DP_MAX_IN : n->nin;
	for (int i = 0; i < nin; i++) {
		bputs(b, i ? ", " : " ");
		put_ref(b, g, n->in[i]);
	}
	if (op_ok)
		op_attrs(b, n);

	Buf *a = &l->attrs;
	bputs(a, name_of(ir_phase_names, NELEMS(ir_phase_names), n->phase));
	if (n->block != -1) {
		if (n->block < 0 || n->block >= g->nblocks)
			bprintf(a, " block=?%d", n->block);
		else if (plain_word(g->blocks[n->block].name) && !reserved_word(g->blocks[n->block].name))
			bprintf(a, " %s", g->blocks[n->block].name);
		else {
			bputs(a, " ");
			put_quoted(a, g->blocks[n->block].name);
		}
	}
	unsigned progs = n->progs & ~IR_IN_SAMPLE; /* `sample` is a word of its own */
	if (progs != ir_default_progs(n->phase)) {
		const char *word = progs_word(progs);
		if (word)
			bprintf(a, " %s", word);
		else
			bprintf(a, " progs=%u", progs);
	}
	if (n->progs & IR_IN_SAMPLE)
		bputs(a, " sample");
	if (n->flags & DP_IF_LAST)
		bputs(a, " last");
	if (n->flags & DP_IF_FIRST)
		bputs(a, " first");
	if (n->recompute)
		bputs(a, " recompute");
	if (n->flags & DP_IF_COMPRESSED)
		bputs(a, " compressed");
	if (n->flags & DP_IF_PLAIN)
		bputs(a, " plain");
	if (n->flags & ~DP_IF_ALL)
		bprintf(a, " flags=%u", n->flags & ~DP_IF_ALL);
	if (n->stage != -1)
		bprintf(a, " stage=%d", n->stage);
	if (n->chunk != -1)
		bprintf(a, " chunk=%d", n->chunk);
	if (n->offload >= 0 && n->offload != g->offload) /* an update's own (per-block offload) */
		bprintf(a, " offload=%s", dp_settings[DP_SET_OFFLOAD].words[n->offload]);
	if (n->stream == DP_STREAM_COMM)
		bputs(a, " stream=comm");
	else if (n->stream == DP_STREAM_COPY)
		bputs(a, " stream=copy");
	else if (n->stream == DP_STREAM_P2P)
		bputs(a, " stream=p2p");
	else if (n->stream != DP_STREAM_COMPUTE)
		bprintf(a, " stream=%d", n->stream);
	if (n->bucket != -1)
		bprintf(a, " bucket=r%d", n->bucket);

	if (!op_ok)
		return;
	if (dp_is_collective(n->op)) {
		collective_comment(&l->comment, g, n);
	} else if ((n->op == DP_OP_D2H || n->op == DP_OP_H2D) && value_ok(g, n->out)) {
		put_si(&l->comment, (double)value_bytes(g->values[n->out]), "B");
		bputs(&l->comment, n->op == DP_OP_D2H ? " to host" : " to device");
	} else if (cost_safe(g, n)) {
		double flops = 0, bytes = 0;
		ir_ops[n->op].cost(g, n, &flops, &bytes);
		if (flops > 0)
			put_si(&l->comment, flops, "FLOP");
	}
}

/* ---- the whole graph ---- */

/* Node id -> node (the first with that id), for inline definitions; *nid
 * is the table's length. Caller frees. */
static const Node **nodes_by_id(const Graph *g, int *nid)
{
	int n = 0;
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i] && g->nodes[i]->id >= n)
			n = g->nodes[i]->id + 1;
	const Node **byid = calloc((size_t)n + 1, sizeof *byid);
	if (!byid)
		die("out of memory printing IR");
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i] && g->nodes[i]->id >= 0 && !byid[g->nodes[i]->id])
			byid[g->nodes[i]->id] = g->nodes[i];
	*nid = n;
	return byid;
}

int ir_value_order(const Graph *g, int *order, int *ndecl)
{
	int nid, k = 0;
	const Node **byid = nodes_by_id(g, &nid);
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i] && !inline_def(g->values[i], byid, nid))
			order[k++] = i;
	*ndecl = k;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n && value_ok(g, n->out) && inline_def(g->values[n->out], byid, nid) == n)
			order[k++] = n->out;
	}
	free(byid);
	return k;
}

static size_t capped_max(size_t cur, size_t len, size_t cap)
{
	return len <= cap && len > cur ? len : cur;
}

static void put_comment(FILE *out, size_t col, size_t at, const Buf *comment)
{
	if (!comment->len)
		return;
	pad(out, col > at ? col - at : 0);
	fprintf(out, "  # %s", comment->s);
}

void ir_print_after(FILE *out, const Graph *g, const char *after)
{
	fprintf(out, "; dp IR");
	if (after)
		fprintf(out, " after %s", after);
	if (g->file && *g->file)
		fprintf(out, " (%s)", g->file);
	fputc('\n', out);
	print_directives(out, g);

	int nid;
	const Node **byid = nodes_by_id(g, &nid);

	/* declarations */
	DeclLine *dl = calloc((size_t)g->nvalues + 1, sizeof *dl);
	if (!dl)
		die("out of memory printing IR");
	int nd = 0;
	size_t wname = 0, wtype = 0, wdecl = 0;
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (!v || inline_def(v, byid, nid))
			continue;
		DeclLine *l = &dl[nd++];
		decl_line(l, g, v);
		wname = capped_max(wname, l->name.len, DECL_NAME_CAP);
		wtype = capped_max(wtype, l->type.len, DECL_TYPE_CAP);
	}
	for (int i = 0; i < nd; i++) {
		size_t len = (dl[i].name.len > wname ? dl[i].name.len : wname) + 3 +
			     (dl[i].type.len > wtype ? dl[i].type.len : wtype) + 1 + dl[i].rest.len;
		if (dl[i].comment.len)
			wdecl = capped_max(wdecl, len, COMMENT_CAP);
	}
	if (nd)
		fputc('\n', out);
	for (int i = 0; i < nd; i++) {
		DeclLine *l = &dl[i];
		fputs(bstr(&l->name), out);
		pad(out, wname > l->name.len ? wname - l->name.len : 0);
		fprintf(out, " : %s", bstr(&l->type));
		pad(out, wtype > l->type.len ? wtype - l->type.len : 0);
		fprintf(out, " %s", bstr(&l->rest));
		size_t at = (l->name.len > wname ? l->name.len : wname) + 3 +
			    (l->type.len > wtype ? l->type.len : wtype) + 1 + l->rest.len;
		put_comment(out, wdecl, at, &l->comment);
		fputc('\n', out);
		free(l->name.s);
		free(l->type.s);
		free(l->rest.s);
		free(l->comment.s);
	}
	free(dl);

	/* nodes */
	NodeLine *nl = calloc((size_t)g->nnodes + 1, sizeof *nl);
	if (!nl)
		die("out of memory printing IR");
	size_t wbody = 0, wnode = 0;
	for (int i = 0; i < g->nnodes; i++) {
		if (g->nodes[i])
			node_line(&nl[i], g, g->nodes[i], byid, nid);
		wbody = capped_max(wbody, nl[i].body.len, NODE_BODY_CAP);
	}
	for (int i = 0; i < g->nnodes; i++) {
		size_t len = (nl[i].body.len > wbody ? nl[i].body.len : wbody) + 2 + nl[i].attrs.len;
		if (nl[i].comment.len)
			wnode = capped_max(wnode, len, COMMENT_CAP);
	}
	if (g->nnodes)
		fputc('\n', out);
	for (int i = 0; i < g->nnodes; i++) {
		NodeLine *l = &nl[i];
		if (!g->nodes[i]) {
			fputs("?null-node\n", out);
			continue;
		}
		fputs(bstr(&l->body), out);
		pad(out, (wbody > l->body.len ? wbody - l->body.len : 0) + 2);
		fputs(bstr(&l->attrs), out);
		size_t at = (l->body.len > wbody ? l->body.len : wbody) + 2 + l->attrs.len;
		put_comment(out, wnode, at, &l->comment);
		fputc('\n', out);
		free(l->body.s);
		free(l->attrs.s);
		free(l->comment.s);
	}
	free(nl);
	free(byid);
}

void ir_print(FILE *out, const Graph *g)
{
	ir_print_after(out, g, NULL);
}
