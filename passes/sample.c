/*
 * sample.c - the inference program of a language model (pass "sample").
 *
 * Before: the planned graph (memplan's form): every value has its offset.
 *
 * After: when the model is a language model - its training loss is a
 * cross_entropy whose labels come from a tokens(...) source, at pp = 1 and
 * cp = 1 - every node of the step program before that loss, except the
 * loads and the DP_IF_LAST parts, is also in the sample program
 * (IR_IN_SAMPLE, printed `sample`), and metrics.sample_tokens names the
 * token input (the tokens source with shift 0) and metrics.sample_logits the
 * loss's logits. Otherwise nothing changes and the step file's sample
 * program is empty (dpexec --sample says why it cannot sample).
 *
 * Why a prefix of the step program, at the step's batch: the sample program
 * then needs no memory plan of its own. Every node in it has the same
 * writer, readers and order as in the step program, whose plan keeps each
 * value intact until its last reader there; the logits' last readers come
 * after the loss, so they are intact when the program ends and dpexec reads
 * them. The forward runs micro_batch rows of ctx tokens, as llm.c samples
 * with its training forward: dpexec fills every row with the context and
 * reads row 0 (a batch-1 program would need a second plan of the forward).
 * The whole window is run again per token (no KV cache: the attention
 * kernels take a whole causal window, and the cost at dp's model sizes is
 * the forward's, which is small). The runtime writes the dropout keys -1
 * (dropout off, as in eval) and the positions are those of training (cp = 1:
 * 0..ctx-1), so the logits at every position are the training forward's.
 */
#include "passes.h"

/* The data value read by the nodes before `end` whose source is `kind`
 * (tokens: with shift 0), -1 when none, -2 when some node reads a data value
 * that is neither the tokens nor dropout's keys. */
static int prefix_data(const Graph *g, int end, int *keys)
{
	int tokens = -1;
	*keys = -1;
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
			else if (s && s->rec.kind == DP_SRC_SAMPLE_KEYS)
				*keys = v->id;
			else
				return -2;
		}
	}
	return tokens;
}

int sample_run(Graph *g, Diag *d)
{
	(void)d;
	if (g->cfg.mesh[DP_AXIS_PP] > 1 || g->cfg.mesh[DP_AXIS_CP] > 1 || g->loss < 0)
		return 0;
	int end = -1;
	for (int i = 0; i < g->nnodes && end < 0; i++) {
		const Node *n = g->nodes[i];
		if (n->op == DP_OP_XENT && n->out == g->loss && (n->progs & IR_IN_STEP))
			end = i;
	}
	if (end < 0)
		return 0;
	const Node *loss = g->nodes[end];
	const Value *logits = g->values[loss->in[0]], *labels = g->values[loss->in[1]];
	if (labels->kind != DP_T_DATA || labels->source < 0 ||
	    g->sources[labels->source].rec.kind != DP_SRC_TOKENS || !ir_is_float(logits->dtype))
		return 0; /* a classifier: its labels are classes, not the next tokens */
	int keys, tokens = prefix_data(g, end, &keys);
	if (tokens < 0)
		return 0;
	const Value *t = g->values[tokens];
	if (t->dtype != DP_I32 || t->ndim != 2 || logits->ndim < 2 ||
	    ir_numel(logits) != ir_numel(t) * logits->dims[logits->ndim - 1])
		return 0;
	for (int i = 0; i < end; i++) {
		Node *n = g->nodes[i];
		if ((n->progs & IR_IN_STEP) && n->op != DP_OP_LOAD && !(n->flags & DP_IF_LAST))
			n->progs |= IR_IN_SAMPLE;
	}
	g->metrics.sample_tokens = tokens;
	g->metrics.sample_logits = logits->id;
	return 0;
}
