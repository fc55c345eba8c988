/*
 * pipeline.c - the ordered list of passes, and the loop that runs them.
 *
 * The whole compiler after the front end is this list (QBE's main loop):
 * each pass transforms the graph in place; after each one the graph is made
 * canonical (the graph its dump reads back as), the verifier runs (dpc
 * always does; --no-verify turns it off) and the graph can be dumped.
 * pipeline_run_some resumes the list on IR read from text (dpc --from-ir).
 * The form the graph takes before and after each pass is at the top of the
 * pass's file.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

const Pass pipeline[] = {
	{"tp", "tp-split params have per-rank shapes; tp_copy/tp_reduce around split linears",
	 tp_run},
	{"shape", "every value has a dtype and a per-rank shape", shape_run},
	{"cp", "sequences split over cp: tables read at true positions, attention over gathered K/V",
	 cp_run},
	{"stages", "every block on a pipeline stage (pp > 1): its own `stage`, else cut by FLOPs",
	 stages_run},
	{"autodiff", "every param has a grad; backward nodes accumulate into it", ad_run},
	{"recompute", "recompute blocks re-run their forward before their backward", recompute_run},
	{"optimizer", "flat param/grad buffers, optimizer state, clip + update (once per step)",
	 opt_run},
	{"precision", "params computed, activations stored, grads reduced in their dtypes; casts",
	 precision_run},
	{"layout", "params in units (buckets up to bucket_mb, or blocks) in flat buffers; "
		   "sharded units cut over dp_shard",
	 layout_run},
	{"setup", "INIT writes every param and buffer where the step reads it; EXPORT saves them",
	 setup_run},
	{"collectives", "each unit's collectives per its strategy: one call each, over a zero-copy "
			"view of the unit",
	 collectives_run},
	{"lossscale", "fp16: the loss gradient scaled by the step's loss scale, the gradients "
		      "unscaled before the norm, the step skipped when the norm is not finite",
	 lossscale_run},
	{"compress", "compress powersgd: each bucket's all_reduce also as P and Q all_reduces "
		     "of low-rank factors with error feedback, the step choosing the path",
	 compress_run},
	{"p2p", "each node on its pipeline stage (pp > 1); values live across a cut sent and "
		"received between neighbouring stages",
	 p2p_run},
	{"unroll", "the step's micro-batches unrolled in the pipeline schedule's order, each "
		   "with its own temporaries (pp > 1)", unroll_run},
	{"stage_params", "each pipeline stage keeps only its own parameters, gradients and "
			 "optimizer state and compression state (pp > 1)",
	 stage_params_run},
	{"offload", "offload optimizer: optimizer state, masters and update in host memory; "
		    "D2H/H2D copies around the host kernels; offload params: the updated "
		    "parameters there too, each reader's H2D into a device temporary",
	 offload_run},
	{"schedule", "collectives as early as legal on the comm stream, with events", sched_run},
	{"fuse", "a linear and its gelu are one linear_gelu, a matmul and its gelu_grad one "
		 "matmul_gelu_grad (cuBLASLt's epilogues), the loss and its gradient one "
		 "cross_entropy_fused (the gradient over the logits), a residual add and the "
		 "layernorm after it one add_layernorm (backward: layernorm_grad_add), and "
		 "the rmsnorm after it one add_rmsnorm (backward: rmsnorm_grad_add), and cp's "
		 "attention_cp_grad and attention_cp_grad_kv one attention_cp_grad_both",
	 fuse_run},
	{"views", "reshape and tp_copy of a temporary are views of it: no copy kernel", views_run},
	{"sample", "a language model's sample program: the step's forward up to the logits "
		   "at batch 1, its per-sample values its own, without loads or dropout",
	 sample_run},
	{"padvocab", "the classifier's logits and their gradient have rows padded to a "
		     "multiple of pad_vocab (a stride), and the LM head's GEMMs read a pad_rows "
		     "copy of its weight of that many rows: the same results", padvocab_run},
	{"memplan", "every tensor has an arena offset; arena size = peak per rank", mem_run},
};
const int npipeline = sizeof pipeline / sizeof pipeline[0];

int pipeline_find(const char *name)
{
	for (int i = 0; i < npipeline; i++)
		if (strcmp(pipeline[i].name, name) == 0)
			return i;
	return -1;
}

/* DIR/NN-name.ir; NN = 0 is the front end's graph, NN = i + 1 pass i. */
static int dump_file(const Graph *g, const char *dir, int nn, const char *name)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%02d-%s.ir", dir, nn, name);
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "dpc: cannot write %s: %s\n", path, strerror(errno));
		return -1;
	}
	ir_print_after(f, g, name);
	if (fclose(f) != 0) {
		fprintf(stderr, "dpc: cannot write %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* ir_verify's report on g as a string (caller frees); *bad: how many
 * violations it found. */
static char *verify_text(const Graph *g, const char *after, int *bad)
{
	char *text = NULL;
	size_t len = 0;
	FILE *buf = open_memstream(&text, &len);
	if (!buf)
		die("out of memory");
	*bad = ir_verify(g, after, buf);
	fclose(buf);
	return text;
}

/* Canonicalize, dump, print, verify: what happens after the front end and
 * after each pass. The graph becomes the one its text reads back as
 * (ir_canonicalize: ids included), so a pass sees the same graph whether
 * the one before it ran in this process or its dump was read (dpc
 * --from-ir); the sharding plan, whose ids that makes stale, is found
 * again in the graph by the passes that need it (shard_plan). The dumps
 * come first so that a graph the verifier rejects can be read. */
static int after(Graph *g, const PipelineOpts *o, int nn, const char *name)
{
	ir_canonicalize(g);
	g->shard = NULL;
	if (o->dump_dir && dump_file(g, o->dump_dir, nn, name) < 0)
		return -1;
	if (o->dump_after && strcmp(o->dump_after, name) == 0)
		ir_print_after(o->dump_out ? o->dump_out : stdout, g, name);
	if (!o->verify)
		return 0;
	/* Collect the violations first, so the header precedes them. */
	int bad;
	char *text = verify_text(g, name, &bad);
	if (bad) {
		fflush(o->dump_out ? o->dump_out : stdout);
		fprintf(stderr, "dpc: internal error: IR verification failed after %s\n", name);
		fputs(text, stderr);
	}
	free(text);
	return bad ? -2 : 0;
}

int pipeline_run_part(Graph *g, Diag *d, const PipelineOpts *o, int from, int to)
{
	int rc = from == 0 ? after(g, o, 0, "frontend") : 0;
	for (int i = from; rc == 0 && i < to; i++) {
		if (pipeline[i].run(g, d) < 0 || d->nerrors > 0)
			return -1;
		rc = after(g, o, i + 1, pipeline[i].name);
	}
	return rc;
}

int pipeline_run(Graph *g, Diag *d, const PipelineOpts *o)
{
	return pipeline_run_part(g, d, o, 0, npipeline);
}

int pipeline_run_some(Graph *g, Diag *d, const PipelineOpts *o, const int *passes, int n)
{
	/* read IR must hold what every pass relies on: its violations are
	 * mistakes in the text, not compiler bugs */
	int bad;
	char *text = verify_text(g, NULL, &bad);
	if (bad) {
		error_at(d, (Loc){0}, "the IR is not valid (%d problem%s):", bad,
			 bad == 1 ? "" : "s");
		fputs(text, d->out ? d->out : stderr);
	}
	free(text);
	if (bad)
		return -1;
	int rc = 0;
	for (int k = 0; rc == 0 && k < n; k++) {
		int i = passes[k];
		if (i < 0 || i >= npipeline)
			die("pipeline: pass %d out of range", i);
		if (pipeline[i].run(g, d) < 0 || d->nerrors > 0)
			return -1;
		rc = after(g, o, i + 1, pipeline[i].name);
	}
	return rc;
}
