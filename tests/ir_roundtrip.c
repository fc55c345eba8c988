/*
 * ir_roundtrip.c - tests of the IR text form, the verifier and the op table
 * (built by `make tests` from the compiler's objects; tests/unit.sh runs it):
 *
 *   build/tests/ir_roundtrip tests/ir [--dump]
 *
 * What it checks (tests/passes.sh checks the rest: every dump of every
 * model read back gives the same compile, and fuzzes the reader with
 * fe_fuzz --ir):
 *  - the rows of format/ops.def are consistent (arity, rules, attributes);
 *  - three graphs built by hand, the front end's form, the fully scheduled
 *    and planned form (views, buckets, events, offsets) and a sharded form
 *    (init/export programs: init, shard, all_gather, reduce_scatter, save,
 *    a buffer, the strategy settings), are valid (ir_verify), print, read
 *    back with every field equal, and print again byte for byte the same;
 *    once canonical (ir_canonicalize) they read back with the same ids;
 *  - the program words of node lines (none, step, eval, both, init, export,
 *    progs=N) read and print back;
 *  - every .ir file of the directory given (tests/ir: dumps and IR written
 *    by hand) reads, verifies, and round-trips; a file whose first line is
 *    the printer's header must already be in printed form;
 *  - broken graphs make ir_verify report the violation;
 *  - malformed texts make ir_read report file:line:col errors and return
 *    NULL.
 * Prints "ir_roundtrip: N passed, M failed"; exits 1 on any failure.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* dp_replicate and dp_shard: the data-parallel axes' mask */
#define AXES_DP (DP_AXIS_BIT(DP_AXIS_REPLICATE) | DP_AXIS_BIT(DP_AXIS_SHARD))

static int npass, nfail;

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (cond) {                                               \
			npass++;                                          \
		} else {                                                  \
			nfail++;                                          \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                     \
			fputc('\n', stderr);                              \
		}                                                         \
	} while (0)

/* ---- helpers ---- */

static char *print_str(const Graph *g)
{
	char *s = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);
	if (!f)
		die("open_memstream");
	ir_print(f, g);
	fclose(f);
	return s;
}

static int verify_str(const Graph *g, char **msgs)
{
	size_t n = 0;
	FILE *f = open_memstream(msgs, &n);
	if (!f)
		die("open_memstream");
	int k = ir_verify(g, "test", f);
	fclose(f);
	return k;
}

/* Read text quietly (errors into *errs when not NULL). */
static Graph *read_str(const char *text, const char *name, int *nerrors, char **errs)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = errs ? open_memstream(&buf, &n) : NULL;
	Diag d;
	diag_init(&d, f, name, text);
	Graph *g = ir_read(text, name, &d);
	if (f) {
		fclose(f);
		*errs = buf;
	}
	if (nerrors)
		*nerrors = d.nerrors;
	return g;
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *s = malloc((size_t)n + 1);
	if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		s = NULL;
	}
	if (s)
		s[n] = '\0';
	fclose(f);
	return s;
}

/* Index of the first line where a and b differ, for messages. */
static int diff_line(const char *a, const char *b)
{
	int line = 1;
	for (; *a && *a == *b; a++, b++)
		if (*a == '\n')
			line++;
	return line;
}

static const char *name_or(const Graph *g, int id)
{
	return id >= 0 && id < g->nvalues ? g->values[id]->name : "-";
}

/* Every field the text shows, compared by name (ids may differ). Returns
 * the number of differences, each printed. */
static int graph_diff(const Graph *a, const Graph *b)
{
	int nd = 0;
#define DIFF(cond, ...)                                      \
	do {                                                 \
		if (cond) {                                  \
			nd++;                                \
			fprintf(stderr, "  differs: " __VA_ARGS__); \
			fputc('\n', stderr);                 \
		}                                            \
	} while (0)
	DIFF(strcmp(a->file, b->file), "file %s vs %s", a->file, b->file);
	DIFF(memcmp(&a->cfg, &b->cfg, sizeof a->cfg), "cfg");
	DIFF(memcmp(&a->opt, &b->opt, sizeof a->opt), "opt");
	DIFF(memcmp(&a->sched, &b->sched, sizeof a->sched), "sched");
	DIFF(strcmp(a->strategy, b->strategy) || a->bucket_mb != b->bucket_mb ||
		     a->reshard_after_forward != b->reshard_after_forward ||
		     a->prefetch != b->prefetch || a->gather_limit_mb != b->gather_limit_mb ||
		     a->accum_unsharded != b->accum_unsharded,
	     "strategy");
	DIFF(a->peak_bytes != b->peak_bytes || a->persistent_bytes != b->persistent_bytes, "memory");
	DIFF(a->nevents != b->nevents, "nevents");
	const int ra[] = {a->loss, a->logits, a->labels, a->metrics.loss, a->metrics.grad_norm,
			  a->metrics.eval_loss, a->metrics.eval_correct};
	const int rb[] = {b->loss, b->logits, b->labels, b->metrics.loss, b->metrics.grad_norm,
			  b->metrics.eval_loss, b->metrics.eval_correct};
	for (int i = 0; i < 7; i++)
		DIFF(strcmp(name_or(a, ra[i]), name_or(b, rb[i])), "role %d", i);
	DIFF(a->nblocks != b->nblocks, "nblocks");
	for (int i = 0; i < a->nblocks && i < b->nblocks; i++)
		DIFF(strcmp(a->blocks[i].name, b->blocks[i].name) ||
			     a->blocks[i].strategy != b->blocks[i].strategy ||
			     a->blocks[i].reshard != b->blocks[i].reshard,
		     "block %d", i);
	DIFF(a->nsources != b->nsources, "nsources");
	for (int i = 0; i < a->nsources && i < b->nsources; i++) {
		const Source *x = &a->sources[i], *y = &b->sources[i];
		DIFF(strcmp(x->path, y->path) || strcmp(name_or(a, x->value), name_or(b, y->value)) ||
			     x->rec.kind != y->rec.kind || x->rec.split != y->rec.split ||
			     x->rec.role != y->rec.role || x->rec.sample_elems != y->rec.sample_elems ||
			     x->rec.synth_n != y->rec.synth_n ||
			     x->rec.synth_classes != y->rec.synth_classes ||
			     x->rec.src_line != y->rec.src_line,
		     "source %d", i);
	}
	DIFF(a->nbuckets != b->nbuckets, "nbuckets");
	for (int i = 0; i < a->nbuckets && i < b->nbuckets; i++) {
		const Bucket *x = &a->buckets[i], *y = &b->buckets[i];
		int same = x->op == y->op && x->axes == y->axes && x->elems == y->elems &&
			   x->nmembers == y->nmembers && !strcmp(name_or(a, x->view), name_or(b, y->view));
		for (int m = 0; same && m < x->nmembers; m++)
			same = !strcmp(name_or(a, x->members[m]), name_or(b, y->members[m]));
		DIFF(!same, "bucket %d", i);
	}
	DIFF(a->nvalues != b->nvalues, "nvalues %d vs %d", a->nvalues, b->nvalues);
	for (int i = 0; i < a->nvalues; i++) {
		const Value *x = a->values[i];
		const Value *y = ir_find_value((Graph *)b, x->name);
		if (!y) {
			DIFF(1, "value %s missing", x->name);
			continue;
		}
		int same = x->dtype == y->dtype && x->ndim == y->ndim && x->kind == y->kind &&
			   x->init == y->init && x->init_a == y->init_a && x->init_b == y->init_b &&
			   !strcmp(name_or(a, x->view_of), name_or(b, y->view_of)) &&
			   x->view_offset == y->view_offset &&
			   !strcmp(name_or(a, x->grad), name_or(b, y->grad)) &&
			   !strcmp(name_or(a, x->param), name_or(b, y->param)) &&
			   x->source == y->source && x->offset == y->offset && x->nbytes == y->nbytes &&
			   (x->def < 0) == (y->def < 0) &&
			   !memcmp(x->place, y->place, sizeof x->place) &&
			   !memcmp(x->dims, y->dims, sizeof x->dims);
		/* a temporary's block is its node's: not shown on the value */
		if (!(x->kind == DP_T_ACT && x->def >= 0))
			same = same && x->block == y->block;
		DIFF(!same, "value %s", x->name);
	}
	DIFF(a->nnodes != b->nnodes, "nnodes");
	for (int i = 0; i < a->nnodes && i < b->nnodes; i++) {
		const Node *x = a->nodes[i], *y = b->nodes[i];
		int same = x->op == y->op && x->nin == y->nin && x->phase == y->phase &&
			   x->progs == y->progs && x->flags == y->flags && x->stream == y->stream &&
			   x->bucket == y->bucket && x->block == y->block &&
			   !strcmp(name_or(a, x->out), name_or(b, y->out)) &&
			   !memcmp(x->ia, y->ia, sizeof x->ia) && !memcmp(x->fa, y->fa, sizeof x->fa);
		for (int k = 0; same && k < x->nin; k++)
			same = !strcmp(name_or(a, x->in[k]), name_or(b, y->in[k]));
		DIFF(!same, "node %d (op %d)", i, (int)x->op);
	}
#undef DIFF
	return nd;
}

/* print -> read -> print; the texts must match and the graphs agree. */
static void roundtrip(const Graph *g, const char *what)
{
	char *s1 = print_str(g);
	int nerr = 0;
	char *errs = NULL;
	Graph *g2 = read_str(s1, what, &nerr, &errs);
	CHECK(g2 != NULL, "%s: printed IR does not read back:\n%s", what, errs ? errs : "");
	if (g2) {
		char *s2 = print_str(g2);
		CHECK(strcmp(s1, s2) == 0, "%s: print(read(print(g))) differs at line %d", what,
		      diff_line(s1, s2));
		CHECK(graph_diff(g, g2) == 0, "%s: read graph differs from the original", what);
		char *msgs = NULL;
		int nv = verify_str(g2, &msgs);
		CHECK(nv == 0, "%s: read graph does not verify:\n%s", what, msgs);
		free(msgs);
		free(s2);
		ir_free(g2);
	}
	free(errs);
	free(s1);
}

/* ir_canonicalize changes no text, and the canonical graph reads back with
 * its own ids: value i and node i the same in both, every reference too. */
static void canonical_ids(Graph *g, const char *what)
{
	char *before = print_str(g);
	ir_canonicalize(g);
	char *s1 = print_str(g);
	CHECK(strcmp(before, s1) == 0, "%s: ir_canonicalize changed the text at line %d", what,
	      diff_line(before, s1));
	Graph *g2 = read_str(s1, what, NULL, NULL);
	CHECK(g2 && g2->nvalues == g->nvalues && g2->nnodes == g->nnodes,
	      "%s: the canonical graph does not read back whole", what);
	int bad = 0;
	for (int i = 0; g2 && i < g->nvalues && i < g2->nvalues; i++) {
		const Value *x = g->values[i], *y = g2->values[i];
		bad += strcmp(x->name, y->name) != 0 || x->id != y->id || x->def != y->def ||
		       x->view_of != y->view_of || x->grad != y->grad || x->param != y->param ||
		       x->block != y->block;
	}
	for (int i = 0; g2 && i < g->nnodes && i < g2->nnodes; i++) {
		const Node *x = g->nodes[i], *y = g2->nodes[i];
		bad += x->id != y->id || x->out != y->out || memcmp(x->in, y->in, sizeof x->in) != 0;
	}
	CHECK(bad == 0, "%s: %d values or nodes read back with other ids", what, bad);
	ir_free(g2);
	free(before);
	free(s1);
}

/* ---- graphs built by hand ---- */

static const Loc noloc = {"test.dp", 1, 1};

static Value *val(Graph *g, const char *name, DpDtype dt, int ndim, int64_t d0, int64_t d1,
		  DpTensorKind kind)
{
	int64_t dims[2] = {d0, d1};
	return ir_value(g, name, dt, ndim, dims, kind, noloc);
}

static Node *node(Graph *g, IrOp op, Value *out, Phase ph, int block, Value *i0, Value *i1,
		  Value *i2)
{
	int in[3], nin = 0;
	Value *ins[3] = {i0, i1, i2};
	for (int i = 0; i < 3 && ins[i]; i++)
		in[nin++] = ins[i]->id;
	Node *n = ir_node(g, op, out ? out->id : -1, nin, in, ph, noloc);
	n->block = block;
	if (ph == PH_FWD)
		n->progs = IR_IN_STEP | IR_IN_EVAL;
	if (ph == PH_EVAL)
		n->progs = IR_IN_EVAL;
	if (out && out->kind == DP_T_ACT && out->def < 0)
		out->def = n->id;
	return n;
}

static void settings(Graph *g)
{
	g->cfg = (DpConfig){.mesh = {[DP_AXIS_PP] = 1, [DP_AXIS_REPLICATE] = 1, [DP_AXIS_SHARD] = 2,
				     [DP_AXIS_CP] = 1, [DP_AXIS_TP] = 1},
			    .micro_batch = 32, .grad_accum = 2,
			    .eval_batch = 32, .steps = 4000, .eval_every = 1000, .log_every = 100,
			    .seed = 1234, .strategy = DP_STRAT_DDP};
	g->opt = (DpOptim){.kind = DP_OPT_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
			   .eps = 1e-8f, .weight_decay = 0.01f, .clip = 1.0f};
	g->sched = (DpSched){.kind = DP_SCHED_COSINE, .warmup = 100, .steps = 4000};
	g->bucket_mb = 0.25f;
}

static void add_sources(Graph *g, Value *x, Value *y)
{
	const char *dir = "/usr/share/datasets/fashion-mnist/";
	const char *files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
			       "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
	for (int i = 0; i < 4; i++) {
		char path[256];
		snprintf(path, sizeof path, "%s%s", dir, files[i]);
		Source s = {.path = path, .value = (i % 2 ? y : x)->id, .loc = noloc};
		s.rec.kind = DP_SRC_IDX;
		s.rec.split = i < 2 ? DP_SPLIT_TRAIN : DP_SPLIT_EVAL;
		s.rec.role = (uint8_t)(i % 2);
		s.rec.sample_elems = i % 2 ? 1 : 784;
		s.rec.src_line = (uint32_t)(8 + i);
		ir_add_source(g, &s);
	}
	x->source = 0;
	y->source = 1;
}

/* The front end's form: shapes of temporaries unknown, no gradients. */
static Graph *build_frontend(void)
{
	Graph *g = ir_new("models/mlp.dp");
	settings(g);
	int fc1 = ir_add_block(g, "fc1", noloc), head = ir_add_block(g, "head", noloc);
	Value *x = val(g, "x", DP_F32, 2, 32, 784, DP_T_DATA);
	Value *y = val(g, "y", DP_I32, 1, 32, 0, DP_T_DATA);
	add_sources(g, x, y);
	Value *w1 = val(g, "fc1.w", DP_F32, 2, 784, 256, DP_T_PARAM);
	Value *b1 = val(g, "fc1.b", DP_F32, 1, 256, 0, DP_T_PARAM);
	Value *w2 = val(g, "head.w", DP_F32, 2, 256, 10, DP_T_PARAM);
	Value *b2 = val(g, "head.b", DP_F32, 1, 10, 0, DP_T_PARAM);
	w1->init = DP_INIT_NORMAL, w1->init_b = 0.05f, w1->block = fc1;
	b1->init = DP_INIT_ZEROS, b1->block = fc1;
	w2->init = DP_INIT_NORMAL, w2->init_b = 0.1f, w2->block = head;
	b2->init = DP_INIT_ZEROS, b2->block = head;
	Value *lsum = val(g, "loss.sum", DP_F32, 1, 1, 0, DP_T_METRIC);
	Value *eloss = val(g, "eval.loss", DP_F32, 1, 1, 0, DP_T_METRIC);
	Value *ecorrect = val(g, "eval.correct", DP_F32, 1, 2, 0, DP_T_METRIC);

	DP_ATTR(node(g, DP_OP_LOAD, x, PH_DATA, -1, 0, 0, 0), LOAD, source) = 0;
	DP_ATTR(node(g, DP_OP_LOAD, y, PH_DATA, -1, 0, 0, 0), LOAD, source) = 1;
	Node *n = node(g, DP_OP_LOAD, x, PH_DATA, -1, 0, 0, 0);
	DP_ATTR(n, LOAD, source) = 2, n->progs = IR_IN_EVAL;
	n = node(g, DP_OP_LOAD, y, PH_DATA, -1, 0, 0, 0);
	DP_ATTR(n, LOAD, source) = 3, n->progs = IR_IN_EVAL;
	Value *t0 = val(g, "t0", DP_F32, 0, 0, 0, DP_T_ACT);
	node(g, DP_OP_LINEAR, t0, PH_FWD, fc1, x, w1, b1);
	Value *h1 = val(g, "h1", DP_F32, 0, 0, 0, DP_T_ACT);
	node(g, DP_OP_RELU, h1, PH_FWD, fc1, t0, 0, 0);
	Value *logits = val(g, "logits", DP_F32, 0, 0, 0, DP_T_ACT);
	node(g, DP_OP_LINEAR, logits, PH_FWD, head, h1, w2, b2);
	Value *loss = val(g, "loss", DP_F32, 0, 0, 0, DP_T_ACT);
	n = node(g, DP_OP_XENT, loss, PH_FWD, -1, logits, y, 0);
	n->progs = IR_IN_STEP, DP_FATTR(n, XENT, scale) = 1.0f / 128;
	node(g, DP_OP_ACCUM, lsum, PH_FWD, -1, loss, 0, 0)->progs = IR_IN_STEP;
	DP_FATTR(node(g, DP_OP_XENT, eloss, PH_EVAL, -1, logits, y, 0), XENT, scale) = 1;
	node(g, DP_OP_CORRECT, ecorrect, PH_EVAL, -1, logits, y, 0);
	g->loss = loss->id, g->logits = logits->id, g->labels = y->id;
	g->metrics = (DpMetrics){lsum->id, -1, eloss->id, ecorrect->id, -1, -1};
	return g;
}

/* Bump allocator for the hand-made memory plan. */
static int64_t place_at(Value *v, int64_t *top)
{
	v->offset = *top;
	v->nbytes = ir_numel(v) * (int64_t)ir_dtype_size(v->dtype);
	*top += (v->nbytes + 255) / 256 * 256;
	return v->offset;
}

static void view(Value *v, Value *flat, int64_t off)
{
	v->view_of = flat->id;
	v->view_offset = off;
	v->offset = flat->offset + off * 4;
	v->nbytes = ir_numel(v) * 4;
}

/* The planned form: after collectives, schedule and memplan. */
static Graph *build_planned(void)
{
	Graph *g = ir_new("models/mlp.dp");
	settings(g);
	int fc1 = ir_add_block(g, "fc1", noloc), head = ir_add_block(g, "head", noloc);
	int64_t top = 0;
	Value *x = val(g, "x", DP_F32, 2, 32, 784, DP_T_DATA);
	Value *y = val(g, "y", DP_I32, 1, 32, 0, DP_T_DATA);
	add_sources(g, x, y);
	place_at(x, &top), place_at(y, &top);
	/* params and grads in flat buffers, laid out in backward order (head first) */
	const int64_t nparam = 256 * 10 + 10 + 784 * 256 + 256;
	Value *fp = val(g, "flat.params", DP_F32, 1, nparam, 0, DP_T_FLAT);
	Value *fg = val(g, "flat.grads", DP_F32, 1, nparam, 0, DP_T_FLAT);
	place_at(fp, &top), place_at(fg, &top);
	struct { const char *name; int64_t d0, d1; int nd, block; DpInit init; float std; int64_t off; } ps[] = {
		{"fc1.w", 784, 256, 2, 0, DP_INIT_NORMAL, 0.05f, 2570},
		{"fc1.b", 256, 0, 1, 0, DP_INIT_ZEROS, 0, 2570 + 784 * 256},
		{"head.w", 256, 10, 2, 1, DP_INIT_NORMAL, 0.1f, 0},
		{"head.b", 10, 0, 1, 1, DP_INIT_ZEROS, 0, 2560},
	};
	Value *p[4], *gr[4];
	for (int i = 0; i < 4; i++) {
		p[i] = val(g, ps[i].name, DP_F32, ps[i].nd, ps[i].d0, ps[i].d1, DP_T_PARAM);
		p[i]->init = ps[i].init, p[i]->init_b = ps[i].std;
		p[i]->block = ps[i].block == 0 ? fc1 : head;
		view(p[i], fp, ps[i].off);
	}
	for (int i = 0; i < 4; i++) {
		char name[64];
		snprintf(name, sizeof name, "grad.%s", ps[i].name);
		gr[i] = val(g, name, DP_F32, ps[i].nd, ps[i].d0, ps[i].d1, DP_T_GRAD);
		gr[i]->block = p[i]->block;
		gr[i]->param = p[i]->id, p[i]->grad = gr[i]->id;
		view(gr[i], fg, ps[i].off);
	}
	Value *m = val(g, "opt.m", DP_F32, 1, nparam, 0, DP_T_OPTSTATE);
	Value *v = val(g, "opt.v", DP_F32, 1, nparam, 0, DP_T_OPTSTATE);
	Value *lsum = val(g, "loss.sum", DP_F32, 1, 1, 0, DP_T_METRIC);
	Value *gnorm = val(g, "grad_norm", DP_F32, 1, 1, 0, DP_T_METRIC);
	Value *eloss = val(g, "eval.loss", DP_F32, 1, 1, 0, DP_T_METRIC);
	Value *ecorrect = val(g, "eval.correct", DP_F32, 1, 2, 0, DP_T_METRIC);
	place_at(m, &top), place_at(v, &top), place_at(lsum, &top), place_at(gnorm, &top);
	place_at(eloss, &top), place_at(ecorrect, &top);
	Value *r0 = val(g, "bucket.r0", DP_F32, 1, 2570, 0, DP_T_GRAD);
	Value *r1 = val(g, "bucket.r1", DP_F32, 1, 784 * 256 + 256, 0, DP_T_GRAD);
	view(r0, fg, 0), view(r1, fg, 2570);
	Bucket b0 = {.op = DP_OP_ALL_REDUCE, .axes = AXES_DP, .view = r0->id, .elems = 2570, .nmembers = 2,
		     .members = (int[]){gr[2]->id, gr[3]->id}};
	Bucket b1 = {.op = DP_OP_ALL_REDUCE, .axes = AXES_DP, .view = r1->id, .elems = 784 * 256 + 256,
		     .nmembers = 2, .members = (int[]){gr[0]->id, gr[1]->id}};
	ir_add_bucket(g, &b0), ir_add_bucket(g, &b1);

	/* temporaries: each its own bytes except where lifetimes are disjoint */
	Value *t0 = val(g, "t0", DP_F32, 2, 32, 256, DP_T_ACT);
	Value *h1 = val(g, "h1", DP_F32, 2, 32, 256, DP_T_ACT);
	Value *logits = val(g, "logits", DP_F32, 2, 32, 10, DP_T_ACT);
	Value *loss = val(g, "loss", DP_F32, 1, 1, 0, DP_T_ACT);
	Value *dl = val(g, "d.logits", DP_F32, 2, 32, 10, DP_T_ACT);
	Value *dh1 = val(g, "d.h1", DP_F32, 2, 32, 256, DP_T_ACT);
	Value *dt0 = val(g, "d.t0", DP_F32, 2, 32, 256, DP_T_ACT);
	Value *gsq = val(g, "grad_norm.sq", DP_F32, 1, 1, 0, DP_T_ACT);
	int64_t act0 = top;
	place_at(t0, &top), place_at(h1, &top), place_at(logits, &top), place_at(loss, &top);
	place_at(dl, &top), place_at(dh1, &top);
	int64_t end = top;
	/* d.t0 lives after h1's last read (the head weight gradient): reuse h1's bytes?
	 * No: relu_grad reads t0 and writes d.t0 while d.h1 is live; reuse loss+logits
	 * region is too small, so d.t0 gets fresh bytes and grad_norm.sq reuses t0's. */
	place_at(dt0, &top);
	gsq->offset = act0, gsq->nbytes = 4;
	(void)end;
	g->cfg.arena_bytes = (uint64_t)top;
	g->peak_bytes = top;
	g->persistent_bytes = act0;

	Node *n;
	DP_ATTR(node(g, DP_OP_LOAD, x, PH_DATA, -1, 0, 0, 0), LOAD, source) = 0;
	DP_ATTR(node(g, DP_OP_LOAD, y, PH_DATA, -1, 0, 0, 0), LOAD, source) = 1;
	node(g, DP_OP_LINEAR, t0, PH_FWD, fc1, x, p[0], p[1]);
	node(g, DP_OP_RELU, h1, PH_FWD, fc1, t0, 0, 0);
	node(g, DP_OP_LINEAR, logits, PH_FWD, head, h1, p[2], p[3]);
	n = node(g, DP_OP_XENT, loss, PH_FWD, -1, logits, y, 0);
	n->progs = IR_IN_STEP, DP_FATTR(n, XENT, scale) = 1.0f / 128;
	node(g, DP_OP_ACCUM, lsum, PH_FWD, -1, loss, 0, 0)->progs = IR_IN_STEP;
	DP_FATTR(node(g, DP_OP_XENT_GRAD, dl, PH_BWD, head, logits, y, 0), XENT_GRAD, scale) = 1.0f / 128;
	n = node(g, DP_OP_MATMUL, gr[2], PH_BWD, head, h1, dl, 0);
	DP_ATTR(n, MATMUL, transA) = 1, DP_ATTR(n, MATMUL, acc) = 1;
	DP_ATTR(node(g, DP_OP_BIAS_GRAD, gr[3], PH_BWD, head, dl, 0, 0), BIAS_GRAD, acc) = 1;
	n = node(g, DP_OP_MATMUL, dh1, PH_BWD, head, dl, p[2], 0);
	DP_ATTR(n, MATMUL, transB) = 1;
	/* bucket r0 (head) goes out while fc1's backward runs */
	struct { IrOp op; int stream; int ev; } evs[] = {
		{DP_OP_EVENT_RECORD, DP_STREAM_COMPUTE, 0}, {DP_OP_EVENT_WAIT, DP_STREAM_COMM, 0}};
	for (int i = 0; i < 2; i++) {
		n = node(g, evs[i].op, NULL, PH_COMM, -1, 0, 0, 0);
		DP_EVENT(n) = evs[i].ev, n->stream = evs[i].stream, n->flags = DP_IF_LAST;
	}
	n = node(g, DP_OP_ALL_REDUCE, r0, PH_COMM, head, 0, 0, 0);
	DP_ATTR(n, ALL_REDUCE, axes) = AXES_DP, n->stream = DP_STREAM_COMM;
	n->flags = DP_IF_LAST, n->bucket = 0;
	n = node(g, DP_OP_EVENT_RECORD, NULL, PH_COMM, -1, 0, 0, 0);
	DP_ATTR(n, EVENT_RECORD, ev) = 1, n->stream = DP_STREAM_COMM, n->flags = DP_IF_LAST;
	node(g, DP_OP_RELU_GRAD, dt0, PH_BWD, fc1, dh1, t0, 0);
	n = node(g, DP_OP_MATMUL, gr[0], PH_BWD, fc1, x, dt0, 0);
	DP_ATTR(n, MATMUL, transA) = 1, DP_ATTR(n, MATMUL, acc) = 1;
	DP_ATTR(node(g, DP_OP_BIAS_GRAD, gr[1], PH_BWD, fc1, dt0, 0, 0), BIAS_GRAD, acc) = 1;
	n = node(g, DP_OP_EVENT_RECORD, NULL, PH_COMM, -1, 0, 0, 0);
	DP_ATTR(n, EVENT_RECORD, ev) = 2, n->flags = DP_IF_LAST;
	n = node(g, DP_OP_EVENT_WAIT, NULL, PH_COMM, -1, 0, 0, 0);
	DP_ATTR(n, EVENT_WAIT, ev) = 2, n->stream = DP_STREAM_COMM, n->flags = DP_IF_LAST;
	n = node(g, DP_OP_ALL_REDUCE, r1, PH_COMM, fc1, 0, 0, 0);
	DP_ATTR(n, ALL_REDUCE, axes) = AXES_DP, n->stream = DP_STREAM_COMM;
	n->flags = DP_IF_LAST, n->bucket = 1;
	n = node(g, DP_OP_EVENT_RECORD, NULL, PH_COMM, -1, 0, 0, 0);
	DP_ATTR(n, EVENT_RECORD, ev) = 3, n->stream = DP_STREAM_COMM, n->flags = DP_IF_LAST;
	for (int e = 1; e <= 3; e += 2) {
		n = node(g, DP_OP_EVENT_WAIT, NULL, PH_COMM, -1, 0, 0, 0);
		DP_ATTR(n, EVENT_WAIT, ev) = e, n->flags = DP_IF_LAST;
	}
	g->nevents = 4;
	node(g, DP_OP_SQNORM, gsq, PH_OPT, -1, fg, 0, 0)->flags = DP_IF_LAST;
	node(g, DP_OP_SQRT, gnorm, PH_OPT, -1, gsq, 0, 0)->flags = DP_IF_LAST;
	n = node(g, DP_OP_CLIP, fg, PH_OPT, -1, gnorm, 0, 0);
	n->flags = DP_IF_LAST, DP_FATTR(n, CLIP, max_norm) = 1;
	node(g, DP_OP_ADAMW, fp, PH_OPT, -1, fg, m, v)->flags = DP_IF_LAST;
	node(g, DP_OP_FILL, fg, PH_OPT, -1, 0, 0, 0)->flags = DP_IF_LAST;
	/* eval program */
	n = node(g, DP_OP_LOAD, x, PH_DATA, -1, 0, 0, 0);
	DP_ATTR(n, LOAD, source) = 2, n->progs = IR_IN_EVAL;
	n = node(g, DP_OP_LOAD, y, PH_DATA, -1, 0, 0, 0);
	DP_ATTR(n, LOAD, source) = 3, n->progs = IR_IN_EVAL;
	/* the forward nodes above are in both programs; eval reads logits */
	DP_FATTR(node(g, DP_OP_XENT, eloss, PH_EVAL, -1, logits, y, 0), XENT, scale) = 1;
	node(g, DP_OP_CORRECT, ecorrect, PH_EVAL, -1, logits, y, 0);
	g->loss = loss->id, g->logits = logits->id, g->labels = y->id;
	g->metrics = (DpMetrics){lsum->id, gnorm->id, eloss->id, ecorrect->id, -1, -1};
	return g;
}

/* A sharded form (hybrid_shard on 2x2) with the init and export programs:
 * the params are views of a gathered temporary, the persistent state is the
 * dp_shard block; a buffer sits beside them, never communicated. */
static Graph *build_sharded(void)
{
	Graph *g = ir_new("sharded.dp");
	settings(g);
	g->cfg.mesh[DP_AXIS_REPLICATE] = 2;
	g->cfg.micro_batch = 8;
	g->cfg.eval_batch = 8;
	g->cfg.strategy = DP_STRAT_HYBRID_SHARD;
	snprintf(g->strategy, sizeof g->strategy, "hybrid_shard");
	g->reshard_after_forward = 0;
	g->prefetch = 2;
	g->gather_limit_mb = 64.5f;
	g->accum_unsharded = 1;
	int b0 = ir_add_block(g, "b0", noloc);
	Value *x = val(g, "x", DP_F32, 2, 8, 16, DP_T_DATA);
	Value *gather = val(g, "b0.gather", DP_F32, 1, 68, 0, DP_T_ACT);
	Value *w = val(g, "b0.w", DP_F32, 2, 16, 4, DP_T_PARAM);
	Value *b = val(g, "b0.b", DP_F32, 1, 4, 0, DP_T_PARAM);
	Value *mask = val(g, "b0.mask", DP_F32, 2, 8, 4, DP_T_BUFFER);
	w->init = DP_INIT_NORMAL, w->init_b = 0.1f, w->block = b0;
	b->init = DP_INIT_ZEROS, b->block = b0;
	mask->init = DP_INIT_ONES, mask->block = b0;
	w->view_of = b->view_of = gather->id;
	w->view_offset = 0, b->view_offset = 64;
	Value *shard = val(g, "flat.params", DP_F32, 1, 34, 0, DP_T_FLAT);
	Value *grads = val(g, "flat.grads", DP_F32, 1, 68, 0, DP_T_FLAT);
	Value *gshard = val(g, "flat.grads.shard", DP_F32, 1, 34, 0, DP_T_FLAT);

	/* init program: every param and buffer, then this rank's block */
	node(g, DP_OP_INIT, w, PH_SETUP, b0, 0, 0, 0)->progs = IR_IN_INIT;
	node(g, DP_OP_INIT, b, PH_SETUP, b0, 0, 0, 0)->progs = IR_IN_INIT;
	node(g, DP_OP_INIT, mask, PH_SETUP, b0, 0, 0, 0)->progs = IR_IN_INIT;
	Node *n = node(g, DP_OP_SHARD, shard, PH_SETUP, -1, gather, 0, 0);
	n->progs = IR_IN_INIT, DP_ATTR(n, SHARD, axes) = DP_AXIS_BIT(DP_AXIS_SHARD);
	/* step and eval: gather, compute with the buffer */
	n = node(g, DP_OP_ALL_GATHER, gather, PH_COMM, b0, shard, 0, 0);
	n->progs = IR_IN_STEP | IR_IN_EVAL, n->stream = DP_STREAM_COMM;
	DP_ATTR(n, ALL_GATHER, axes) = DP_AXIS_BIT(DP_AXIS_SHARD);
	Value *h = val(g, "h", DP_F32, 2, 8, 4, DP_T_ACT);
	node(g, DP_OP_LINEAR, h, PH_FWD, b0, x, w, b);
	Value *hm = val(g, "hm", DP_F32, 2, 8, 4, DP_T_ACT);
	node(g, DP_OP_MUL, hm, PH_FWD, b0, h, mask, 0);
	/* gradients: reduce_scatter over dp_shard, all_reduce over dp_replicate */
	n = node(g, DP_OP_REDUCE_SCATTER, gshard, PH_COMM, b0, grads, 0, 0);
	n->stream = DP_STREAM_COMM, n->flags = DP_IF_LAST;
	DP_ATTR(n, REDUCE_SCATTER, axes) = DP_AXIS_BIT(DP_AXIS_SHARD);
	n = node(g, DP_OP_ALL_REDUCE, gshard, PH_COMM, b0, 0, 0, 0);
	n->stream = DP_STREAM_COMM, n->flags = DP_IF_LAST;
	DP_ATTR(n, ALL_REDUCE, axes) = DP_AXIS_BIT(DP_AXIS_REPLICATE);
	/* export program: gather again, save the params */
	n = node(g, DP_OP_ALL_GATHER, gather, PH_SETUP, b0, shard, 0, 0);
	n->progs = IR_IN_EXPORT, n->stream = DP_STREAM_COMM;
	DP_ATTR(n, ALL_GATHER, axes) = DP_AXIS_BIT(DP_AXIS_SHARD);
	node(g, DP_OP_SAVE, NULL, PH_SETUP, b0, w, 0, 0)->progs = IR_IN_EXPORT;
	node(g, DP_OP_SAVE, NULL, PH_SETUP, b0, b, 0, 0)->progs = IR_IN_EXPORT;
	/* a node in step and export (no word for that mask: progs=9) */
	node(g, DP_OP_FILL, grads, PH_OPT, -1, 0, 0, 0)->progs = IR_IN_STEP | IR_IN_EXPORT;
	return g;
}

/* The program words read as their masks and print back. */
static void test_prog_words(void)
{
	static const struct { const char *word; unsigned progs; } words[] = {
		{"none", 0}, {"step", IR_IN_STEP}, {"eval", IR_IN_EVAL},
		{"both", IR_IN_STEP | IR_IN_EVAL}, {"init", IR_IN_INIT}, {"export", IR_IN_EXPORT},
		{"progs=12", IR_IN_INIT | IR_IN_EXPORT}, {"progs=2", IR_IN_EVAL},
		/* sample adds the sample program to what the other words say */
		{"both sample", IR_IN_STEP | IR_IN_EVAL | IR_IN_SAMPLE},
		{"eval sample", IR_IN_EVAL | IR_IN_SAMPLE},
	};
	for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
		/* opt's default program is step, setup's is init */
		for (int setup = 0; setup < 2; setup++) {
			char text[160];
			snprintf(text, sizeof text, "%%f : f32[4] flat\n%%f = fill %s %s\n",
				 setup ? "setup" : "opt", words[i].word);
			char *errs = NULL;
			Graph *g = read_str(text, "words.ir", NULL, &errs);
			CHECK(g && g->nnodes == 1 && g->nodes[0]->progs == words[i].progs,
			      "program word '%s' after %s: %s", words[i].word, setup ? "setup" : "opt",
			      errs ? errs : "wrong mask");
			if (g) {
				char *s1 = print_str(g);
				/* the phase, then the word unless it is the phase's default */
				const char *ph = setup ? "setup" : "opt";
				const char *word = words[i].progs == IR_IN_EVAL ? "eval" : words[i].word;
				int dflt = words[i].progs == (setup ? IR_IN_INIT : IR_IN_STEP);
				char want[64];
				snprintf(want, sizeof want, "fill  %s%s%s\n", ph, dflt ? "" : " ",
					 dflt ? "" : word);
				CHECK(strstr(s1, want) != NULL, "program word '%s' after %s prints as:\n%s",
				      words[i].word, ph, s1);
				roundtrip(g, words[i].word);
				free(s1);
			}
			ir_free(g);
			free(errs);
		}
	}
	/* setup nodes default to init: an export node says so, an init one not */
	Graph *sh = build_sharded();
	char *s = print_str(sh);
	CHECK(strstr(s, "setup b0 init") == NULL && strstr(s, "setup b0\n"),
	      "init nodes should not print a program word:\n%s", s);
	CHECK(strstr(s, "save %b0.w") && strstr(strstr(s, "save %b0.w"), "setup b0 export"),
	      "save node does not say export:\n%s", s);
	CHECK(strstr(s, "strategy hybrid_shard bucket_mb=0.25 reshard_after_forward=0 prefetch=2 "
			"gather_limit_mb=64.5 accum_unsharded=1\n"),
	      "strategy line:\n%s", s);
	CHECK(strstr(s, "progs=9"), "a step+export node prints progs=9");
	Graph *g2 = read_str(s, "sharded.ir", NULL, NULL);
	CHECK(g2 && g2->cfg.strategy == DP_STRAT_HYBRID_SHARD,
	      "the reader sets cfg.strategy from the strategy name");
	ir_free(g2);
	/* a hand-written strategy line without the keys gets the DSL defaults */
	g2 = read_str("strategy full_shard\n", "s.ir", NULL, NULL);
	CHECK(g2 && g2->cfg.strategy == DP_STRAT_FULL_SHARD && g2->reshard_after_forward == 1 &&
		      g2->prefetch == 1 && g2->gather_limit_mb == 0 && g2->accum_unsharded == 0,
	      "strategy defaults");
	ir_free(g2);
	free(s);
	ir_free(sh);
}

/* ---- verifier: each broken graph must be reported ---- */

typedef void (*Breaker)(Graph *g);

static Node *find_node(Graph *g, IrOp op, int nth)
{
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->op == op && nth-- == 0)
			return g->nodes[i];
	die("no such node");
}

static void br_input(Graph *g) { find_node(g, DP_OP_RELU, 0)->in[0] = g->nvalues + 3; }
static void br_arity(Graph *g) { find_node(g, DP_OP_RELU, 0)->nin = 2; }
static void br_stream(Graph *g) { find_node(g, DP_OP_ALL_REDUCE, 0)->stream = DP_STREAM_COMPUTE; }
static void br_wait(Graph *g) { ir_remove_node(g, find_node(g, DP_OP_EVENT_RECORD, 0)); }
static void br_event(Graph *g) { DP_ATTR(find_node(g, DP_OP_EVENT_WAIT, 0), EVENT_WAIT, ev) = 9; }
static void br_view(Graph *g) { ir_find_value(g, "fc1.b")->view_offset = 1 << 30; }
static void br_link(Graph *g) { ir_find_value(g, "grad.fc1.b")->param = ir_find_value(g, "fc1.w")->id; }
static void br_id(Graph *g) { g->values[3]->id = 4; }
static void br_order(Graph *g) { ir_move_node(g, find_node(g, DP_OP_RELU, 0), 0); }
static void br_writer(Graph *g)
{
	Node *relu = find_node(g, DP_OP_RELU, 0);
	int in[1] = {relu->in[0]};
	Node *n = ir_node(g, DP_OP_RELU, relu->out, 1, in, PH_FWD, relu->loc);
	ir_move_node(g, n, ir_node_index(g, relu) + 1);
}
static void br_share(Graph *g) { ir_find_value(g, "h1")->offset = ir_find_value(g, "t0")->offset; }
static void br_arena(Graph *g) { g->cfg.arena_bytes = 1024; }
static void br_bucket(Graph *g) { g->buckets[0].members[0] = ir_find_value(g, "grad.fc1.w")->id; }
static void br_unplanned(Graph *g) { ir_find_value(g, "logits")->offset = -1; }
static void br_cycle(Graph *g)
{
	Value *f = ir_find_value(g, "flat.params");
	f->view_of = ir_find_value(g, "fc1.w")->id;
}
static void br_def(Graph *g) { ir_find_value(g, "h1")->def = 999; }

/* on the sharded form */
static void br_init_prog(Graph *g) { find_node(g, DP_OP_INIT, 0)->progs = IR_IN_STEP; }
static void br_init_out(Graph *g) { find_node(g, DP_OP_INIT, 0)->out = ir_find_value(g, "x")->id; }
static void br_save_prog(Graph *g) { find_node(g, DP_OP_SAVE, 0)->progs = IR_IN_INIT; }
static void br_save_in(Graph *g) { find_node(g, DP_OP_SAVE, 0)->in[0] = ir_find_value(g, "h")->id; }
static void br_shard_prog(Graph *g) { find_node(g, DP_OP_SHARD, 0)->progs = IR_IN_EXPORT; }
static void br_shard_group(Graph *g)
{
	DP_ATTR(find_node(g, DP_OP_SHARD, 0), SHARD, axes) = AXES_DP;
}
static void br_rs_size(Graph *g) { ir_find_value(g, "flat.grads.shard")->dims[0] = 30; }
static void br_ag_size(Graph *g)
{
	DP_ATTR(find_node(g, DP_OP_ALL_GATHER, 0), ALL_GATHER, axes) = DP_AXIS_BIT(DP_AXIS_CP);
}
static void br_ag_init(Graph *g) { find_node(g, DP_OP_ALL_GATHER, 1)->progs |= IR_IN_INIT; }
static void br_mask(Graph *g)
{
	DP_ATTR(find_node(g, DP_OP_ALL_GATHER, 0), ALL_GATHER, axes) = 1 << 9;
}
static void br_buffer(Graph *g)
{
	find_node(g, DP_OP_ALL_REDUCE, 0)->out = ir_find_value(g, "b0.mask")->id;
}
static void br_buffer_view(Graph *g)
{
	/* a buffer inside the gradient buffer: the reduce_scatter reads it */
	Value *m = ir_find_value(g, "b0.mask");
	m->view_of = ir_find_value(g, "flat.grads")->id;
	m->view_offset = 8;
}

typedef struct {
	const char *name;
	Breaker fn;
	const char *expect;
} BreakCase;

/* Each case breaks a fresh read of text; ir_verify must report it. */
static void break_each(const char *text, const BreakCase *cases, size_t ncases)
{
	for (size_t i = 0; i < ncases; i++) {
		Graph *g = read_str(text, "broken.ir", NULL, NULL);
		if (!g) {
			CHECK(0, "verifier %s: text does not read", cases[i].name);
			continue;
		}
		cases[i].fn(g);
		char *msgs = NULL;
		int k = verify_str(g, &msgs);
		CHECK(k > 0 && strstr(msgs, cases[i].expect), "verifier %s: expected '%s', got %d:\n%s",
		      cases[i].name, cases[i].expect, k, msgs);
		/* a broken graph still prints (dumps show what went wrong) */
		char *s = print_str(g);
		CHECK(s && *s, "verifier %s: broken graph does not print", cases[i].name);
		free(s);
		free(msgs);
		ir_free(g);
	}
}

static void test_verifier_sharded(const char *text)
{
	static const BreakCase cases[] = {
		{"init program", br_init_prog, "init outside the init program"},
		{"init output", br_init_out,
		 "init writes %x, which is not a param, a buffer or state with an init spec"},
		{"save program", br_save_prog, "save outside the export program"},
		{"save input", br_save_in, "saves %h, which is not a param or a buffer"},
		{"shard program", br_shard_prog, "shard outside the init and step programs"},
		{"shard group", br_shard_group, "%b0.gather has 68 elements, not 34 (%flat.params) x 4 ranks"},
		{"reduce_scatter size", br_rs_size, "%flat.grads has 68 elements, not 30"},
		{"all_gather size", br_ag_size, "not 34 (%flat.params) x 1 ranks"},
		{"collective in init", br_ag_init, "collective in the init program"},
		{"axis mask", br_mask, "bad axis mask 512"},
		{"buffer", br_buffer, "touches buffer %b0.mask"},
		{"buffer view", br_buffer_view, "collective on %flat.grads touches buffer %b0.mask"},
	};
	break_each(text, cases, sizeof cases / sizeof cases[0]);
}

static void test_verifier(const char *planned_text)
{
	static const BreakCase cases[] = {
		{"input", br_input, "input 0 out of range"},
		{"arity", br_arity, "inputs, relu takes 1"},
		{"stream", br_stream, "comm stream"},
		{"wait", br_wait, "no earlier record"},
		{"event", br_event, "event 9 out of range"},
		{"view", br_view, "outside %flat.params"},
		{"link", br_link, "grad"},
		{"id", br_id, "not its index"},
		{"order", br_order, "before it is written"},
		{"writer", br_writer, "second writer"},
		{"share", br_share, "share bytes"},
		{"arena", br_arena, "outside the arena"},
		{"bucket", br_bucket, "is not inside"},
		{"unplanned", br_unplanned, "no arena offset"},
		{"cycle", br_cycle, "cycle"},
		{"def", br_def, "def names node 999"},
	};
	break_each(planned_text, cases, sizeof cases / sizeof cases[0]);
}

/* ---- malformed texts ---- */

static void test_malformed(void)
{
	struct { const char *text, *expect; } cases[] = {
		{"mesh dp_replicate=1 dp_shard=x\n", "bad.ir:1:30: error: expected an integer"},
		{"mesh gpus=2\n", "bad.ir:1:6: error: unknown mesh axis"},
		{"config steps=-1\n", "out of range"},
		{"optimizer lion lr=1\n", "expected sgd or adamw"},
		{"%x : f32[2,3] data\n%x : f32[2] data\n", "bad.ir:2:1: error: value %x is already defined"},
		{"%x : f32[2,3 data\n", "expected ',' or ']'"},
		{"%x : f32[1,2,3,4,5] data\n", "more than 4 dimensions"},
		{"%x : f32[2] data\n%y : f32[2] = relu %z fwd\n", "bad.ir:2:20: error: unknown value %z"},
		{"%x : f32[2] data\n%y : f32[2] = relu %x\n", "missing phase"},
		{"%x : f32[2] data\n%y : f32[2] = relu %x fwd nosuchblock\n", "unknown block"},
		{"%x : f32[2] data\n%y : f32[2] = frobnicate %x fwd\n", "expected an op or a directive"},
		{"%x : f32[2] data\nrelu %x, %x, %x, %x, %x fwd\n", "more than 4 inputs"},
		{"source train idx \"unterminated -> %x features\n", "unterminated string"},
		{"source train idx \"a\\qb\" -> %x features\n", "unknown escape"},
		{"bucket r1 all_reduce axes=dp_shard %b = %g\n", "expected bucket name r0"},
		{"bucket r0 relu %b = %g\n", "must be a collective"},
		{"%x : f32[2] data\nall_reduce %x comm bucket=r0\n", "bucket r0 is not declared"},
		{"%x : f32[2] data view=%x+\n", "expected an integer"},
		/* sizes whose sums and products would overflow */
		{"%x : f32[16777216,16777216,2] data\n", "bad.ir:1:28: error: more than 2^48 elements"},
		{"%x : f32[9223372036854775807] data\n", "out of range"},
		{"%f : f32[4] flat\n%x : f32[2] data view=%f+-1\n", "out of range"},
		{"%x : f32[2] data @72057594037927937\n", "out of range"},
		{"%x : f32[2] data nbytes=-72057594037927937\n", "out of range"},
		{"%x : f32[2] data\n%y : f32[2] = relu %x transA fwd\n", "unknown attribute 'transA' for relu"},
		{"%x : f32[2] data\n%y : f32[2] = relu %x fwd fc9\n", "unknown block 'fc9'"},
		{"%x : f32[2] data\nmatmul %x, %x ia9=1 fwd\n", "unknown attribute 'ia9'"},
		{"%x : f32[2] data\n%y : f32[2] = relu %x fwd\n\x01\n", "bad.ir:3:1: error: unexpected byte"},
		{"%x : f32[2] data @\n", "expected an integer"},
		{"%x : f32[2] bogus\n", "expected a value kind or '= op'"},
		{"%", "expected a value name"},
		{"%x : f32[2] data place(tp: shard9)\n", "out of range"},
		{"events 99999999999\n", "out of range"},
		{"; dp IR (unterminated\nblock a\nblock a\n", "declared twice"},
		{"strategy zero9\n", "expected a strategy"},
		{"strategy ddp prefetch=x\n", "expected an integer"},
		{"strategy ddp reshard_after_forward=2\n", "out of range"},
		{"strategy ddp nope=1\n", "unknown strategy key 'nope'"},
		{"block fc1 strategy=zero9\n", "expected a strategy"},
		{"block fc1 reshard_after_forward=3\n", "out of range"},
		{"block fc1 colour=1\n", "unknown block key 'colour'"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int nerr = 0;
		char *errs = NULL;
		Graph *g = read_str(cases[i].text, "bad.ir", &nerr, &errs);
		CHECK(!g && nerr > 0 && errs && strstr(errs, cases[i].expect),
		      "malformed %zu: expected '%s', got %s (%d errors):\n%s", i, cases[i].expect,
		      g ? "a graph" : "NULL", nerr, errs ? errs : "");
		ir_free(g);
		free(errs);
	}
	/* several bad lines: each reported */
	int nerr = 0;
	Graph *g = read_str("mesh tp=x\nconfig nope=1\n%a : q[1] data\n", "bad.ir", &nerr, NULL);
	CHECK(!g && nerr == 3, "three bad lines gave %d errors", nerr);
	ir_free(g);
	/* empty and comment-only texts are an empty graph */
	g = read_str("", "empty.ir", &nerr, NULL);
	CHECK(g && g->nvalues == 0 && nerr == 0, "empty text does not read");
	ir_free(g);
	g = read_str(NULL, "null.ir", &nerr, NULL);
	CHECK(g && nerr == 0, "NULL text does not read as empty");
	ir_free(g);
}

/* The dump header names the pass and the source file; the file reads back. */
static void test_header(const Graph *g)
{
	char *s = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);
	ir_print_after(f, g, "memplan");
	fclose(f);
	CHECK(strncmp(s, "; dp IR after memplan (models/mlp.dp)\n", 38) == 0, "header: %.60s", s);
	Graph *g2 = read_str(s, "hdr.ir", NULL, NULL);
	CHECK(g2 && strcmp(g2->file, "models/mlp.dp") == 0, "header file not restored");
	ir_free(g2);
	free(s);
}

/* ---- files ---- */

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_files(const char *dir)
{
	DIR *dp = opendir(dir);
	CHECK(dp != NULL, "cannot open %s", dir);
	if (!dp)
		return;
	char *names[256];
	int nn = 0;
	struct dirent *de;
	while ((de = readdir(dp)) && nn < 256) {
		size_t l = strlen(de->d_name);
		if (l > 3 && strcmp(de->d_name + l - 3, ".ir") == 0)
			names[nn++] = strdup(de->d_name);
	}
	closedir(dp);
	qsort(names, (size_t)nn, sizeof names[0], by_name);
	CHECK(nn > 0, "no .ir files in %s", dir);
	for (int i = 0; i < nn; i++) {
		char path[1024];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		char *text = read_file(path);
		CHECK(text != NULL, "cannot read %s", path);
		if (!text)
			continue;
		char *errs = NULL;
		Graph *g = read_str(text, path, NULL, &errs);
		CHECK(g != NULL, "%s does not read:\n%s", path, errs ? errs : "");
		if (g) {
			char *msgs = NULL;
			int k = verify_str(g, &msgs);
			CHECK(k == 0, "%s does not verify:\n%s", path, msgs);
			free(msgs);
			char *s1 = print_str(g);
			/* past the header line: a dump's says "after PASS", ir_print's not */
			if (strncmp(text, "; dp IR", 7) == 0) {
				const char *t = strchr(text, '\n'), *p = strchr(s1, '\n');
				t = t ? t : "", p = p ? p : "";
				CHECK(strcmp(t, p) == 0, "%s is not in printed form (line %d differs)",
				      path, diff_line(text, s1));
			}
			roundtrip(g, path);
			free(s1);
			ir_free(g);
		}
		free(errs);
		free(text);
		free(names[i]);
	}
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "tests/ir";
	int dump = argc > 2 && strcmp(argv[2], "--dump") == 0;

	/* the rows of format/ops.def are consistent: what a new row can get wrong */
	for (int op = 0; op < DP_NOPS; op++) {
		const OpInfo *oi = &ir_ops[op];
		CHECK(oi->name && oi->name[0], "op %d has no name", op);
		CHECK(oi->min_in >= 0 && oi->min_in <= oi->max_in && oi->max_in <= DP_MAX_IN &&
			      oi->ids_at < oi->max_in,
		      "%s: bad IN(%d, %d, %d)", oi->name, oi->min_in, oi->max_in, oi->ids_at);
		CHECK(oi->cost != NULL, "%s has no cost rule", oi->name);
		CHECK(oi->dsl == OP_DSL_NO || (oi->shape && oi->batch != OP_BATCH_NONE),
		      "%s is in the DSL but has no shape or batch rule", oi->name);
		CHECK(oi->tp == OP_TP_NO || oi->shape, "%s is tp-local without a shape rule",
		      oi->name);
		CHECK((oi->cls == DP_OPC_KERNEL) == (dp_op_rules[op] != DP_OR_EXEC),
		      "%s: a kernel needs an operand rule (and only a kernel has one)", oi->name);
		/* the generic rules (act_x as relu's, act_y as tanh's) emit grad_op(dy, .) */
		if (oi->grad && (oi->grad == ir_ops[DP_OP_RELU].grad || oi->grad == ir_ops[DP_OP_TANH].grad))
			CHECK(oi->grad_op != DP_OP_NOP && ir_ops[oi->grad_op].min_in == 2,
			      "%s: a generic gradient rule needs a two-input kernel", oi->name);
		/* autodiff's nodes are shaped from their operands; a collective's output
		 * is shaped like the value it is the gradient of */
		if (oi->grad && oi->grad_op != DP_OP_NOP && ir_ops[oi->grad_op].cls == DP_OPC_KERNEL)
			CHECK(ir_ops[oi->grad_op].shape != NULL, "%s: its gradient kernel %s has no "
			      "shape rule", oi->name, ir_ops[oi->grad_op].name);
		unsigned seen_i = 0, seen_f = 0;
		for (const OpAttr *a = oi->attrs; a->name; a++) {
			int fl = a->style == IR_ATTR_FLOAT;
			CHECK(a->slot < (fl ? DP_NFATTR : DP_NIATTR), "%s.%s: slot %d out of range",
			      oi->name, a->name, a->slot);
			unsigned *seen = fl ? &seen_f : &seen_i;
			CHECK(!(*seen & (1u << a->slot)), "%s.%s: slot %d named twice", oi->name,
			      a->name, a->slot);
			*seen |= 1u << a->slot;
			CHECK(!a->key || oi->dsl != OP_DSL_NO, "%s.%s: a DSL keyword of an op users "
			      "cannot call", oi->name, a->name);
			CHECK(a->below < 0 || oi->attrs[a->below].name, "%s.%s: bad bound", oi->name,
			      a->name);
		}
		if (oi->dsl != OP_DSL_NO)
			CHECK(ir_dsl_op(oi->name) == op, "the DSL spelling %s is not unique", oi->name);
		/* what code serving several ops reads by a shared name (stepfile.h):
		 * each op that has it declares it, at the one slot */
		const OpAttr *axes = ir_op_attr((IrOp)op, "axes"), *ev = ir_op_attr((IrOp)op, "ev");
		const OpAttr *acc = ir_op_attr((IrOp)op, "acc"), *heads = ir_op_attr((IrOp)op, "heads");
		for (const OpAttr *a = oi->attrs; a->name; a++)
			CHECK(a->style != IR_ATTR_AXES || a == axes, "%s.%s: an axis mask is named axes",
			      oi->name, a->name);
		if (oi->cls == DP_OPC_COLLECTIVE || oi->cls == DP_OPC_SHARD)
			CHECK(axes, "%s: a collective or shard without axes", oi->name);
		if (axes)
			CHECK(axes->style == IR_ATTR_AXES && axes->slot == DP_ATTR_ALL_REDUCE_axes,
			      "%s.axes: not DP_AXES's mask", oi->name);
		CHECK((oi->cls == DP_OPC_EVENT) == (ev != NULL), "%s: ev is the events' own", oi->name);
		if (ev)
			CHECK(ev->slot == DP_ATTR_EVENT_RECORD_ev && ev->style == IR_ATTR_ALWAYS,
			      "%s.ev: not DP_EVENT's slot", oi->name);
		CHECK((oi->reads_out == OP_RO_ACC) == (acc != NULL),
		      "%s: acc is the flag of the ops whose RO column is ACC, and theirs", oi->name);
		if (acc)
			CHECK(acc->slot == DP_ATTR_MATMUL_acc && acc->style == IR_ATTR_FLAG,
			      "%s.acc: not DP_ACC's slot", oi->name);
		if (oi->tp == OP_TP_HEADS)
			CHECK(heads && heads->style != IR_ATTR_FLOAT, "%s: HEADS in the TP column without "
			      "an integer attribute heads", oi->name);
	}

	Graph *fe = build_frontend();
	Graph *planned = build_planned();
	Graph *sharded = build_sharded();
	if (dump) {
		ir_print(stdout, fe);
		ir_print(stdout, planned);
		ir_print(stdout, sharded);
	}
	char *msgs = NULL;
	int k = verify_str(fe, &msgs);
	CHECK(k == 0, "front-end graph does not verify:\n%s", msgs);
	free(msgs);
	k = verify_str(planned, &msgs);
	CHECK(k == 0, "planned graph does not verify:\n%s", msgs);
	free(msgs);
	k = verify_str(sharded, &msgs);
	CHECK(k == 0, "sharded graph does not verify:\n%s", msgs);
	free(msgs);
	roundtrip(fe, "frontend");
	roundtrip(planned, "planned");
	roundtrip(sharded, "sharded");
	canonical_ids(fe, "frontend");
	canonical_ids(planned, "planned");
	canonical_ids(sharded, "sharded");
	test_prog_words();
	char *shtext = print_str(sharded);
	test_verifier_sharded(shtext);
	free(shtext);

	char *text = print_str(planned);
	test_header(planned);
	test_verifier(text);
	test_malformed();
	free(text);
	test_files(dir);
	ir_free(fe);
	ir_free(planned);
	ir_free(sharded);

	printf("ir_roundtrip: %d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
