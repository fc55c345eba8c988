/*
 * sample.c - the inference program of a language model (pass "sample").
 *
 * Before: the views form: the final program order with streams, events,
 * fused kernels and views; no value has an offset yet.
 *
 * After: when the model is a language model (ir_language_model: its
 * training loss is a cross_entropy whose labels come from a tokens(...)
 * source, at pp = 1 and cp = 1) the sample program (IR_IN_SAMPLE, printed `sample`) is the step
 * program's forward up to that loss at batch SAMPLE_ROWS (1), beside it:
 * - The forward is the step's nodes before the loss, without the loads and
 *   the DP_IF_LAST parts. A node that touches nothing per-sample (an
 *   all_gather of full_shard's parameters, the events, a parameter's cast)
 *   is the step's own node, in both programs; a node that reads or writes a
 *   per-sample value (one computed from the tokens) has a copy right after
 *   it, in the sample program only (`none sample`), over copies of its
 *   per-sample values (%NAME.sample) whose dim 0 - the batch dim of every
 *   per-sample value: the batch rules keep it there - is SAMPLE_ROWS
 *   instead of the micro-batch. Parameters, buffers and the gathered
 *   parameters are shared, never copied. A view of a per-sample temporary
 *   (passes/views.c's reshapes and tp_copies at offset 0, the halves of
 *   passes/fuse.c's linear_gelu) covers whole batches of it, so its offset
 *   scales as its size does.
 * - dropout is left out (its output is its input): sampling runs with
 *   dropout off, as eval does, and needs no keys.
 * - metrics.sample_tokens is a new i32 [SAMPLE_ROWS, ctx] temporary, read
 *   by the copies of the token readers and written by the runtime before
 *   the program runs; metrics.sample_logits the copy of the loss's logits,
 *   which the runtime reads after it. memplan keeps both live across the
 *   whole program (ir_program_io). Otherwise nothing changes and the step
 *   file's sample program is empty (dpexec --sample says why it cannot
 *   sample); so too when the forward writes a per-sample value into
 *   anything but a temporary.
 *
 * Why copies of the planned forward rather than lowering the model again at
 * batch 1: the forward dpc runs is the output of every pass before this
 * one (tp's splits and collectives, precision's casts, full_shard's
 * gathers, fusion, views). Lowering again would need that whole pipeline
 * run a second time and its result merged into this graph; re-batching the
 * finished forward keeps the kernels, their order and their attributes the
 * step's, so the logits at every position are the training forward's row
 * 0, and it gives the sample program temporaries of its own. memplan (the
 * next pass) plans them with the rest: they live only in the sample
 * program, so they share bytes with the step's temporaries (the two never
 * run at once) and never with parameters, optimizer state or data, which
 * are persistent; the verifier checks both.
 *
 * The window is run again per token (no KV cache: the attention kernels
 * take a whole causal window, and the cost at dp's model sizes is the
 * forward's, which is small). The positions are those of training (cp = 1:
 * 0..ctx-1), so the logits at every position are the training forward's.
 */
#include <stdlib.h>

#include "passes.h"

/* Rows of the sample program: one sequence. */
#define SAMPLE_ROWS 1

/* The token input the forward before `end` reads (a tokens source with
 * shift 0), -1 when none, -2 when some node reads a data value that is
 * neither it nor the keys a dropout reads (the sample program leaves
 * dropout out). */
static int prefix_data(const Graph *g, int end)
{
	int tokens = -1;
	for (int i = 0; i < end; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || n->op == DP_OP_LOAD)
			continue;
		for (int k = 0; k < n->nin; k++) {
			const Value *v = n->in[k] >= 0 ? g->values[n->in[k]] : NULL;
			if (!v || v->kind != DP_T_DATA)
				continue;
			const Source *s = v->source >= 0 ? &g->sources[v->source] : NULL;
			if (s && s->rec.kind == DP_SRC_TOKENS && s->rec.shift == 0 &&
			    (tokens < 0 || tokens == v->id))
				tokens = v->id;
			else if (!(s && s->rec.kind == DP_SRC_SAMPLE_KEYS && n->op == DP_OP_DROPOUT))
				return -2;
		}
	}
	return tokens;
}

/* Is node n (of the step, before the loss) in the forward the sample
 * program runs? */
static int in_forward(const Node *n)
{
	return (n->progs & IR_IN_STEP) && n->op != DP_OP_LOAD && !(n->flags & DP_IF_LAST);
}

typedef struct {
	Graph *g;
	char *batched;   /* per value id (roots and views): holds samples */
	int *copy;       /* per value id: its sample program's value, -1: not made yet */
	int64_t rows;    /* the step's micro-batch (dim 0 of its tokens) */
} Sampler;

static int batched(const Sampler *s, int v)
{
	return v >= 0 && s->batched[ir_root(s->g, s->g->values[v])->id];
}

/* Marks what the forward before `end` computes from the tokens, and says
 * whether the copies can be made: 0 when a node writes a per-sample value
 * into anything but a temporary, or with an op that has no shape rule, or
 * when a view of a per-sample value does not cover whole batches of it. */
static int mark(Sampler *s, int end)
{
	Graph *g = s->g;
	for (int i = 0; i < end; i++) {
		const Node *n = g->nodes[i];
		if (!in_forward(n) || n->out < 0)
			continue;
		int hit = 0;
		for (int k = 0; k < n->nin; k++)
			hit |= n->op != DP_OP_DROPOUT || k == 0 ? batched(s, n->in[k]) : 0;
		if (!hit)
			continue;
		const Value *r = ir_root(g, g->values[n->out]);
		if (r->kind != DP_T_ACT || !ir_ops[n->op].shape)
			return 0;
		s->batched[r->id] = 1;
	}
	for (int v = 0; v < g->nvalues; v++) {
		const Value *x = g->values[v];
		if (x->view_of >= 0 && batched(s, v) &&
		    (x->ndim < 1 || x->dims[0] % s->rows || x->view_offset % s->rows))
			return 0;
	}
	return 1;
}

/* v's value in the sample program: v itself when it holds no samples, else
 * its copy (made on first use). A view's copy has dim 0 (the batch) and
 * its offset at SAMPLE_ROWS; a root's copy gets its shape from the op table
 * when its writer is copied (copy_node). */
static int copy_of(Sampler *s, int v)
{
	if (v < 0 || !batched(s, v))
		return v;
	if (s->copy[v] >= 0)
		return s->copy[v];
	Graph *g = s->g;
	int view_of = g->values[v]->view_of >= 0 ? copy_of(s, g->values[v]->view_of) : -1;
	const Value *x = g->values[v]; /* after copy_of, which may grow the array */
	int64_t dims[DP_MAX_DIMS];
	for (int d = 0; d < x->ndim; d++)
		dims[d] = d == 0 && view_of >= 0 ? x->dims[0] / s->rows * SAMPLE_ROWS : x->dims[d];
	Value *c = ir_value(g, ir_fmt(g, "%s.sample", x->name), x->dtype, x->ndim, dims, x->kind,
			    x->loc);
	x = g->values[v];
	for (int a = 0; a < DP_MAX_AXES; a++)
		c->place[a] = x->place[a];
	c->block = x->block;
	c->space = x->space;
	c->batch_dim = x->batch_dim;
	c->seq_dim = x->seq_dim;
	c->view_of = view_of;
	c->view_offset = x->view_offset / s->rows * SAMPLE_ROWS;
	s->copy[v] = c->id;
	return c->id;
}

/* The copy of step node n, at position pos (right after n), in the sample
 * program only. */
static void copy_node(Sampler *s, const Node *n, int pos)
{
	Graph *g = s->g;
	int in[DP_MAX_IN];
	for (int k = 0; k < n->nin; k++)
		in[k] = copy_of(s, n->in[k]);
	int out = copy_of(s, n->out);
	Node *c = ir_node(g, n->op, out, n->nin, in, n->phase, n->loc);
	for (int k = 0; k < DP_NIATTR; k++)
		c->ia[k] = n->ia[k];
	for (int k = 0; k < DP_NFATTR; k++)
		c->fa[k] = n->fa[k];
	c->progs = IR_IN_SAMPLE;
	c->stream = n->stream;
	c->block = n->block;
	c->bucket = n->bucket;
	c->stage = n->stage;
	ir_move_node(g, c, pos);
	if (out < 0 || out == n->out)
		return;
	Value *o = g->values[out];
	const Value *orig = g->values[n->out];
	if (orig->def == n->id)
		o->def = c->id;
	if (o->view_of < 0) { /* the shape rule's dims at the copied operands, the dtype kept */
		Diag quiet;
		diag_init(&quiet, NULL, NULL, NULL);
		Value shaped = *o;
		if (ir_ops[c->op].shape(g, c, &shaped, &quiet))
			die("sample: %s's shape rule refuses its copy at batch %d", ir_ops[c->op].name,
			    SAMPLE_ROWS);
		o->ndim = shaped.ndim;
		for (int d = 0; d < DP_MAX_DIMS; d++)
			o->dims[d] = d < shaped.ndim ? shaped.dims[d] : 0;
	}
	if (ir_numel(o) * s->rows != ir_numel(orig) * SAMPLE_ROWS)
		die("sample: %%%s's copy has %lld elements, not %lld / %lld of its %lld", o->name,
		    (long long)ir_numel(o), (long long)SAMPLE_ROWS, (long long)s->rows,
		    (long long)ir_numel(orig));
}

int sample_run(Graph *g, Diag *d)
{
	(void)d;
	const Node *loss;
	if (ir_language_model(g, &loss))
		return 0;
	int end = ir_node_index(g, loss);
	const Value *logits = g->values[loss->in[0]];
	int tokens = prefix_data(g, end);
	if (tokens < 0)
		return 0;
	const Value *t = g->values[tokens];
	if (t->dtype != DP_I32 || t->ndim != 2 || t->dims[0] < 1 || logits->ndim < 2 ||
	    ir_numel(logits) != ir_numel(t) * logits->dims[logits->ndim - 1])
		return 0;

	int nv = g->nvalues;
	Sampler s = {g, calloc((size_t)nv, 1), malloc((size_t)nv * sizeof(int)), t->dims[0]};
	if (!s.batched || !s.copy)
		die("out of memory");
	for (int v = 0; v < nv; v++)
		s.copy[v] = -1;
	s.batched[tokens] = 1;
	int logits_id = logits->id;
	if (mark(&s, end) && s.batched[ir_root(g, logits)->id]) {
		int64_t dims[2] = {SAMPLE_ROWS, t->dims[1]};
		Value *in = ir_value(g, ir_fmt(g, "%s.sample", t->name), DP_I32, 2, dims, DP_T_ACT,
				     t->loc);
		in->batch_dim = 0;
		in->seq_dim = 1;
		s.copy[tokens] = in->id;
		for (int i = 0; i < end; i++) {
			Node *n = g->nodes[i];
			if (!in_forward(n))
				continue;
			int hit = batched(&s, n->out);
			for (int k = 0; k < n->nin; k++)
				hit |= batched(&s, n->in[k]);
			if (!hit) {
				n->progs |= IR_IN_SAMPLE;
			} else if (n->op == DP_OP_DROPOUT) {
				s.copy[n->out] = copy_of(&s, n->in[0]); /* dropout off */
			} else {
				copy_node(&s, n, i + 1);
				i++;
				end++;
			}
		}
		g->metrics.sample_tokens = in->id;
		g->metrics.sample_logits = copy_of(&s, logits_id);
	}
	free(s.batched);
	free(s.copy);
	return 0;
}
