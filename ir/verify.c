/*
 * verify.c - the invariants every pass must keep (ir_verify).
 *
 * Runs after every pass (dpc always; it is cheap: linear in values + nodes,
 * except the memory-overlap check, which sorts the temporaries). Prints one
 * line per violation,
 *
 *   verify after schedule: node 12 (linear %t0): input 3 out of range
 *
 * and returns how many it found. Checks, in order:
 *  - values: values[i]->id == i; dtype, kind, ndim, dims, block, source,
 *    placement in range; def names a node that writes the value.
 *  - views: view_of in range, no cycles, view_offset + numel <= numel of the
 *    viewed buffer.
 *  - param <-> grad links symmetric.
 *  - nodes: unique ids below next_node_id; op, operands, phase, stream,
 *    block, bucket, program mask in range; nin == ir_ops[op].arity when the
 *    op table has the row; collectives on the comm stream (sends and
 *    receives on the comm or the p2p stream, nothing else on p2p); events below
 *    g->nevents.
 *  - programs of the setup kernels and collectives: INIT only in the init
 *    program, writing a param or a buffer (a view of kind param counts);
 *    SAVE only in the export program, of a param or buffer; SHARD only in
 *    init or step (zero1 cuts its gradient shard), with numel(in0) == numel(out) * group; collectives never in init
 *    (step, eval, export); REDUCE_SCATTER numel(in0) == numel(out) * group
 *    and ALL_GATHER numel(out) == numel(in0) * group when both operands are
 *    given. group = the product of cfg.mesh over the axis mask (axes).
 *  - buffers (DP_T_BUFFER, never synchronised): no collective operand is,
 *    views or overlaps one.
 *  - SSA temporaries (DP_T_ACT): at most one defining writer per program (a writer that
 *    does not read its output; accumulating writers such as ACCUM or a
 *    matmul with acc update it), and in each program (step, eval, init,
 *    export, sample) every read, accumulating write included, comes after a write
 *    (or is of what the runtime writes before the program: ir_program_io),
 *    except in init: there INIT nodes write parameters through views and
 *    SHARD reads their root, so a read needs no earlier write. A view of a
 *    temporary (passes/views.c) is its root here: reading it is reading
 *    the root.
 *  - events: each EVENT_WAIT follows an EVENT_RECORD of the same event on
 *    another stream, in the same program.
 *  - pipeline stages (pp > 1): a node's stage in range, in any program but
 *    the sample one (INIT and EXPORT: a stage's own parameters,
 *    passes/stage_params.c); a send or recv on a stage with a neighbouring peer
 *    over axes=pp; an all_reduce over a sub-group of the stages (`stages`)
 *    over pp, on one of them; and each program's transfers run to the end
 *    when every stage runs its own in order, each send waiting for its recv
 *    and a collective over pp for every stage (over a sub-group: for each of
 *    its stages at its own copy, of the same group and size): a send meets
 *    the recv of its tag and size,
 *    and a deadlock is an error naming the two nodes that wait for each
 *    other (check_pipeline_order).
 *  - buckets: view and members in range, every member inside the view,
 *    elems == numel(view), the bucket's node uses the bucket's op and view.
 *  - once memory is planned (cfg.arena_bytes > 0 or any value has an
 *    offset): every value a node uses has offset >= 0 and
 *    offset + nbytes <= arena; nbytes >= its size; two temporaries whose
 *    lifetimes (first write .. last read, per program; what the runtime
 *    writes before a program and reads after it, ir_program_io, over the
 *    whole program) overlap do not share bytes; no temporary shares bytes
 *    with a persistent value.
 * The verifier never trusts the graph: every id is range-checked before it
 * is followed, so a broken graph gives messages, not a crash.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

#define MAX_REPORTED 200 /* lines printed; the count returned is exact */

typedef struct {
	const Graph *g;
	const char *after;
	FILE *out;
	int count;
} Verifier;

static int vok(const Graph *g, int id)
{
	return id >= 0 && id < g->nvalues && g->values[id];
}

static const char *vname(const Graph *g, int id)
{
	return vok(g, id) && g->values[id]->name ? g->values[id]->name : "?";
}

static void prefix(Verifier *vf)
{
	fprintf(vf->out, "verify%s%s: ", vf->after ? " after " : "", vf->after ? vf->after : "");
}

__attribute__((format(printf, 2, 3))) static void report(Verifier *vf, const char *fmt, ...)
{
	if (vf->count++ >= MAX_REPORTED || !vf->out)
		return;
	va_list ap;
	prefix(vf);
	va_start(ap, fmt);
	vfprintf(vf->out, fmt, ap);
	va_end(ap);
	fputc('\n', vf->out);
}

__attribute__((format(printf, 3, 4))) static void node_error(Verifier *vf, const Node *n,
							      const char *fmt, ...)
{
	if (vf->count++ >= MAX_REPORTED || !vf->out)
		return;
	va_list ap;
	prefix(vf);
	fprintf(vf->out, "node %d (%s", n->id, (unsigned)n->op < DP_NOPS ? dp_op_names[n->op] : "?");
	if (vok(vf->g, n->out))
		fprintf(vf->out, " %%%s", vname(vf->g, n->out));
	fputs("): ", vf->out);
	va_start(ap, fmt);
	vfprintf(vf->out, fmt, ap);
	va_end(ap);
	fputc('\n', vf->out);
}

__attribute__((format(printf, 3, 4))) static void value_error(Verifier *vf, int id,
							       const char *fmt, ...)
{
	if (vf->count++ >= MAX_REPORTED || !vf->out)
		return;
	va_list ap;
	prefix(vf);
	fprintf(vf->out, "value %d (%%%s): ", id, vname(vf->g, id));
	va_start(ap, fmt);
	vfprintf(vf->out, fmt, ap);
	va_end(ap);
	fputc('\n', vf->out);
}

static int64_t vbytes(const Value *v)
{
	return ir_span(v) * (int64_t)ir_dtype_size(v->dtype);
}

/* ---- values ---- */

/* Returns 1 when v's scalar fields are sane enough to compute its size. */
static int check_value(Verifier *vf, int i, const Node *const *byid, int nid)
{
	const Graph *g = vf->g;
	const Value *v = g->values[i];
	int sane = 1;
	if (v->id != i)
		value_error(vf, i, "id is %d, not its index", v->id);
	if (!v->name)
		value_error(vf, i, "has no name");
	if ((unsigned)v->dtype >= DP_NDTYPE)
		value_error(vf, i, "bad dtype %d", (int)v->dtype), sane = 0;
	if ((unsigned)v->kind > DP_T_BUFFER)
		value_error(vf, i, "bad kind %d", (int)v->kind);
	if (v->ndim < 0 || v->ndim > DP_MAX_DIMS) {
		value_error(vf, i, "bad ndim %d", v->ndim);
		sane = 0;
	} else
		for (int k = 0; k < v->ndim; k++)
			if (v->dims[k] < 0)
				value_error(vf, i, "negative dim %d", k), sane = 0;
	/* a view of all of a padded temporary (the fused classifier's gradient
	 * over its logits, passes/padvocab.c) has the root's stride */
	int alias = v->view_of >= 0 && v->view_of < g->nvalues && v->view_offset == 0 &&
		    g->values[v->view_of]->ld == v->ld && g->values[v->view_of]->ndim == v->ndim &&
		    sane && !memcmp(g->values[v->view_of]->dims, v->dims, (size_t)v->ndim * sizeof v->dims[0]);
	if (v->ld && ((sane && (v->ndim < 1 || v->ld <= v->dims[v->ndim - 1])) ||
		      v->kind != DP_T_ACT || (v->view_of != -1 && !alias)))
		value_error(vf, i, "ld=%" PRId64 " on a value that is not a temporary with shorter rows",
			    v->ld);
	if (v->block < -1 || v->block >= g->nblocks)
		value_error(vf, i, "block %d out of range", v->block);
	if (v->source < -1 || v->source >= g->nsources)
		value_error(vf, i, "source %d out of range", v->source);
	for (int a = 0; a < DP_MAX_AXES; a++) {
		Place p = v->place[a];
		if (p.kind > DP_PL_PARTIAL)
			value_error(vf, i, "bad placement on %s", ir_axis_names[a]);
		else if (p.kind == DP_PL_SHARD && (p.dim < 0 || p.dim >= v->ndim))
			value_error(vf, i, "sharded on %s along dim %d of %d", ir_axis_names[a], p.dim,
				    v->ndim);
	}
	if (v->def != -1) {
		const Node *n = v->def >= 0 && v->def < nid ? byid[v->def] : NULL;
		if (!n)
			value_error(vf, i, "def names node %d, which is not in the graph", v->def);
		else if (n->out != i)
			value_error(vf, i, "def names node %d, which does not write it", v->def);
	}
	/* param <-> grad */
	if (v->grad != -1) {
		if (!vok(g, v->grad))
			value_error(vf, i, "grad %d out of range", v->grad);
		else if (g->values[v->grad]->param != i)
			value_error(vf, i, "its grad %%%s names param %d", vname(g, v->grad),
				    g->values[v->grad]->param);
	}
	if (v->param != -1) {
		if (!vok(g, v->param))
			value_error(vf, i, "param %d out of range", v->param);
		else if (g->values[v->param]->grad != i)
			value_error(vf, i, "its param %%%s does not name it as its grad",
				    vname(g, v->param));
	}
	return sane;
}

/* Views: no cycles, inside the viewed buffer. Fills sane[] (0 for values on
 * a broken chain) so later checks may follow view_of safely. */
static void check_views(Verifier *vf, char *sane)
{
	const Graph *g = vf->g;
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (v->view_of == -1)
			continue;
		if (!vok(g, v->view_of) || v->view_of == i) {
			value_error(vf, i, "view_of %d out of range", v->view_of);
			sane[i] = 0;
			continue;
		}
		/* a chain longer than the number of values has a cycle */
		int id = i, steps = 0;
		while (id >= 0 && steps <= g->nvalues) {
			int up = g->values[id]->view_of;
			id = vok(g, up) ? up : -1;
			steps++;
		}
		if (steps > g->nvalues) {
			value_error(vf, i, "views form a cycle");
			sane[i] = 0;
			continue;
		}
		const Value *base = g->values[v->view_of];
		if (!sane[i] || !sane[v->view_of])
			continue;
		if (v->view_offset < 0 || v->view_offset + ir_numel(v) > ir_numel(base))
			value_error(vf, i, "view [%" PRId64 ", %" PRId64 ") outside %%%s (%" PRId64
					   " elements)",
				    v->view_offset, v->view_offset + ir_numel(v), vname(g, v->view_of),
				    ir_numel(base));
	}
	/* a value is usable for overlap queries only if its whole chain is */
	for (int i = 0; i < g->nvalues; i++) {
		int id = i, steps = 0;
		while (sane[i] && id >= 0 && steps++ <= g->nvalues) {
			if (!sane[id])
				sane[i] = 0;
			int up = g->values[id]->view_of;
			id = vok(g, up) ? up : -1;
		}
	}
}

/* Root value and element offset inside it (chain known to be sane). */
static const Value *root_of(const Graph *g, const Value *v, int64_t *off)
{
	*off = 0;
	while (v->view_of >= 0) {
		*off += v->view_offset;
		v = g->values[v->view_of];
	}
	return v;
}

/* ---- nodes ---- */

/* The dtypes of a compute kernel's operands against its rule
 * (dp_rule_dtypes, what the step-file decoder enforces): every CD operand
 * alike and float, CDF the compute dtype or f32, and so on. Skipped while an
 * operand has no type yet (the front end's `?` temporaries). */
static void check_dtypes(Verifier *vf, const Node *n)
{
	const Graph *g = vf->g;
	unsigned rule = dp_op_rules[n->op];
	if (rule == DP_OR_EXEC || rule >= DP_NOR)
		return;
	const unsigned char *od = dp_rule_dtypes[rule];
	int ids[1 + DP_MAX_IN] = {n->out, -1, -1, -1, -1};
	for (int k = 0; k < n->nin; k++)
		ids[k + 1] = n->in[k];
	int cd = -1;
	for (int j = 0; j < 1 + DP_MAX_IN; j++) {
		int id = ids[j];
		if (id < 0)
			continue;
		if (!vok(g, id))
			return;
		const Value *v = g->values[id];
		if (v->ndim == 0 && v->kind == DP_T_ACT)
			return; /* not shaped yet */
		if (cd < 0 && od[j] == DP_OD_CD && j > 0)
			cd = v->dtype;
	}
	if (cd < 0 && ids[0] >= 0 && od[0] == DP_OD_CD)
		cd = g->values[ids[0]]->dtype;
	for (int j = 0; j < 1 + DP_MAX_IN; j++) {
		if (ids[j] < 0)
			continue;
		int dt = g->values[ids[j]]->dtype, fl = ir_is_float((DpDtype)dt), ok = 1;
		switch ((DpOperandDtype)od[j]) {
		case DP_OD_NONE:
			break;
		case DP_OD_CD:
			ok = fl && dt == cd;
			break;
		case DP_OD_CDF:
			ok = dt == DP_F32 || (fl && dt == cd);
			break;
		case DP_OD_FLOAT:
			ok = fl;
			break;
		case DP_OD_F32:
			ok = dt == DP_F32;
			break;
		case DP_OD_HALF:
			ok = dp_is_half(dt);
			break;
		case DP_OD_I32:
			ok = dt == DP_I32;
			break;
		}
		if (!ok)
			node_error(vf, n, "%s %%%s is %s: not a dtype %s computes with%s%s",
				   j ? "input" : "output", vname(g, ids[j]), ir_dtype_name((DpDtype)dt),
				   ir_ops[n->op].name, cd >= 0 ? " in " : "",
				   cd >= 0 ? ir_dtype_name((DpDtype)cd) : "");
	}
}

static void check_node(Verifier *vf, const Node *n)
{
	const Graph *g = vf->g;
	if ((unsigned)n->op >= DP_NOPS) {
		node_error(vf, n, "bad op %d", (int)n->op);
		return;
	}
	if (n->nin < 0 || n->nin > DP_MAX_IN) {
		node_error(vf, n, "bad input count %d", n->nin);
		return;
	}
	const OpInfo *oi = &ir_ops[n->op];
	if (n->nin < oi->min_in || n->nin > oi->max_in) {
		if (oi->min_in == oi->max_in)
			node_error(vf, n, "%d inputs, %s takes %d", n->nin, oi->name, oi->min_in);
		else
			node_error(vf, n, "%d inputs, %s takes %d to %d", n->nin, oi->name,
				   oi->min_in, oi->max_in);
	}
	for (int k = 0; k < n->nin; k++)
		if (n->in[k] != -1 && !vok(g, n->in[k]))
			node_error(vf, n, "input %d out of range (%d)", k, n->in[k]);
	if (n->out != -1 && !vok(g, n->out))
		node_error(vf, n, "output out of range (%d)", n->out);
	for (int k = -1; k < n->nin && !dp_op_takes_ld(n->op); k++) {
		int v = k < 0 ? n->out : n->in[k];
		if (vok(g, v) && g->values[v]->ld)
			node_error(vf, n, "%s cannot take %%%s: its rows are padded (ld=%" PRId64 ")",
				   oi->name, vname(g, v), g->values[v]->ld);
	}
	if ((unsigned)n->phase > PH_SETUP)
		node_error(vf, n, "bad phase %d", (int)n->phase);
	check_dtypes(vf, n);
	if (n->stream < 0 || n->stream >= DP_NSTREAM)
		node_error(vf, n, "bad stream %d", n->stream);
	if (n->block < -1 || n->block >= g->nblocks)
		node_error(vf, n, "block %d out of range", n->block);
	if (n->progs & ~IR_ALL_PROGS)
		node_error(vf, n, "bad program mask %u", n->progs);
	int p2p = n->op == DP_OP_SEND || n->op == DP_OP_RECV;
	if (dp_is_collective(n->op) && n->stream != DP_STREAM_COMM &&
	    !(p2p && n->stream == DP_STREAM_P2P))
		node_error(vf, n, "%s not on the comm stream%s", p2p ? "transfer" : "collective",
			   p2p ? " or the p2p stream" : "");
	if (n->stream == DP_STREAM_P2P && !p2p && n->op != DP_OP_EVENT_RECORD &&
	    n->op != DP_OP_EVENT_WAIT)
		node_error(vf, n, "only sends, receives and events run on the p2p stream");
	int pp = (int)g->cfg.mesh[DP_AXIS_PP], nv = ir_chunks_per_rank(g);
	if (n->stage < -1 || n->stage >= pp || (n->stage >= 0 && (n->progs & IR_IN_SAMPLE)))
		node_error(vf, n, "stage %d: stages are 0 to %d, outside the sample program", n->stage,
			   pp - 1);
	uint64_t set = n->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(n, ALL_REDUCE, stages) : 0;
	if (set && (pp > 64 || (pp < 64 && set >> pp) || !(set & (set - 1)) || n->stage < 0 ||
		    !(set >> n->stage & 1) || !(DP_AXES(n) & DP_AXIS_BIT(DP_AXIS_PP))))
		node_error(vf, n, "stages: a sub-group of two or more of the %d pipeline stages, over "
			   "pp, one of which runs the node (stage %d)", pp, n->stage);
	/* interleaved: a node's virtual stage is on its rank; the stages are a
	 * ring (the last of a round, on rank pp-1, sends to rank 0) */
	if (n->chunk != -1 && (nv == 1 || n->chunk < 0 || n->chunk >= pp * nv ||
			       n->stage != n->chunk % pp))
		node_error(vf, n, "chunk %d: an interleaved pipeline's virtual stages are 0 to %d, "
			   "each on rank chunk mod pp (stage %d)", n->chunk, pp * nv - 1, n->stage);
	int ring = nv > 1 && n->stage >= 0 &&
		   (DP_PEER(n) == (n->stage + 1) % pp || DP_PEER(n) == (n->stage + pp - 1) % pp);
	if ((n->op == DP_OP_SEND || n->op == DP_OP_RECV) &&
	    (n->stage < 0 || (DP_PEER(n) != n->stage - 1 && DP_PEER(n) != n->stage + 1 && !ring) ||
	     DP_PEER(n) < 0 || DP_PEER(n) >= pp || DP_AXES(n) != DP_AXIS_BIT(DP_AXIS_PP)))
		node_error(vf, n, "a %s runs on a stage (%d) and names a neighbouring stage as its peer "
			   "(%" PRId64 "), over axes=pp", dp_op_names[n->op], n->stage, DP_PEER(n));
	if (n->op == DP_OP_EVENT_RECORD || n->op == DP_OP_EVENT_WAIT) {
		if (DP_EVENT(n) < 0 || DP_EVENT(n) >= g->nevents)
			node_error(vf, n, "event %" PRId64 " out of range (%d events)", DP_EVENT(n),
				   g->nevents);
	}
	if (n->op == DP_OP_LOAD &&
	    (DP_ATTR(n, LOAD, source) < 0 || DP_ATTR(n, LOAD, source) >= g->nsources))
		node_error(vf, n, "source %" PRId64 " out of range", DP_ATTR(n, LOAD, source));
	if (n->bucket != -1) {
		if (n->bucket < 0 || n->bucket >= g->nbuckets)
			node_error(vf, n, "bucket %d out of range", n->bucket);
		else {
			const Bucket *b = &g->buckets[n->bucket];
			int uses = n->out == b->view;
			for (int k = 0; k < n->nin; k++)
				uses |= n->in[k] == b->view;
			if (b->op != n->op)
				node_error(vf, n, "bucket r%d is a %s", n->bucket,
					   (unsigned)b->op < DP_NOPS ? dp_op_names[b->op] : "?");
			if (!uses)
				node_error(vf, n, "does not use bucket r%d's view %%%s", n->bucket,
					   vname(g, b->view));
		}
	}
}

/* ---- the pipeline's transfers ---- */

/* One stage's next transfer or pp-wide collective in a program, in order. */
typedef struct {
	const Node **op;
	int n, next;
} StageOps;

/* "0,3": a set of pipeline stages, into buf. */
static const char *stages_text(uint64_t set, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = 0;
	for (int k = 0; k < 64 && at + 4 < len; k++)
		if (set >> k & 1)
			at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? "," : "", k);
	return buf;
}

/* The sub-group of pp stages an all_reduce spans (bit k: stage k; each of
 * them runs its own copy: passes/stage_params.c's tied range), else 0. */
static uint64_t stage_group(const Node *n)
{
	return n->op == DP_OP_ALL_REDUCE ? (uint64_t)DP_ATTR(n, ALL_REDUCE, stages) : 0;
}

/* Does this node take part in the pipeline's matching: a send, a recv, a
 * collective every stage runs over pp (it waits for all of them), or one
 * over a sub-group of the stages (it waits for each stage of it at its own
 * copy)? */
static int pipeline_sync(const Node *n, unsigned prog, int last)
{
	if (!(n->progs & prog) || ((n->flags & DP_IF_LAST) && !last))
		return 0;
	if (n->op == DP_OP_SEND || n->op == DP_OP_RECV)
		return 1;
	return dp_is_collective(n->op) && (DP_AXES(n) & DP_AXIS_BIT(DP_AXIS_PP)) &&
	       (n->stage < 0 || stage_group(n));
}

static int64_t moved_bytes(const Graph *g, const Node *n)
{
	int v = n->op == DP_OP_SEND ? n->in[0] : n->out;
	return vok(g, v) ? vbytes(g->values[v]) : -1;
}

/*
 * Every stage's program runs the stage's own transfers in order, each send
 * blocking until its recv is posted (NCCL's semantics, and MPI's for large
 * messages), and a collective over pp until every stage reaches it. Run them
 * all that way: every send must meet the recv of the same size on its peer,
 * and they must all finish; else an error names the two nodes that wait for
 * each other. Once with the DP_IF_LAST nodes (the last micro-batch), once
 * without.
 */
static void check_pipeline_order(Verifier *vf, unsigned prog, int last)
{
	const Graph *g = vf->g;
	int p = (int)g->cfg.mesh[DP_AXIS_PP];
	if (p <= 1 || p > 4096)
		return;
	StageOps *st = calloc((size_t)p, sizeof *st);
	const Node **all = malloc(((size_t)g->nnodes + 1) * (size_t)p * sizeof *all);
	if (!st || !all)
		die("out of memory verifying IR");
	for (int s = 0; s < p; s++)
		st[s].op = all + (size_t)s * ((size_t)g->nnodes + 1);
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!pipeline_sync(n, prog, last))
			continue;
		for (int s = 0; s < p; s++)
			if (n->stage == s || n->stage < 0)
				st[s].op[st[s].n++] = n;
	}
	const char *pname = prog == IR_IN_STEP ? "step" : "eval";
	for (int progress = 1; progress;) {
		progress = 0;
		for (int s = 0; s < p; s++) {
			if (st[s].next >= st[s].n)
				continue;
			const Node *n = st[s].op[st[s].next];
			if (n->op == DP_OP_SEND || n->op == DP_OP_RECV) {
				int peer = (int)DP_PEER(n);
				if (peer < 0 || peer >= p || st[peer].next >= st[peer].n)
					continue;
				const Node *m = st[peer].op[st[peer].next];
				IrOp want = n->op == DP_OP_SEND ? DP_OP_RECV : DP_OP_SEND;
				if (m->op != want || DP_PEER(m) != s)
					continue;
				if (DP_TAG(n) != DP_TAG(m))
					report(vf, "%s program: stage %d's %s (node %d, %%%s, tag %" PRId64 ") meets "
					       "stage %d's %s (node %d, %%%s, tag %" PRId64 "): the two stages' "
					       "transfers are in different orders", pname, s,
					       dp_op_names[n->op], n->id,
					       vname(g, n->op == DP_OP_SEND ? n->in[0] : n->out), DP_TAG(n), peer,
					       dp_op_names[m->op], m->id,
					       vname(g, m->op == DP_OP_SEND ? m->in[0] : m->out), DP_TAG(m));
				else if (moved_bytes(g, n) != moved_bytes(g, m))
					report(vf, "%s program: stage %d's %s (node %d, %%%s) meets stage %d's %s "
					       "(node %d, %%%s) of another size", pname, s, dp_op_names[n->op],
					       n->id, vname(g, n->op == DP_OP_SEND ? n->in[0] : n->out), peer,
					       dp_op_names[m->op], m->id,
					       vname(g, m->op == DP_OP_SEND ? m->in[0] : m->out));
				st[s].next++, st[peer].next++;
				progress = 1;
				continue;
			}
			/* a collective over pp: every stage at it; over a sub-group of the
			 * stages: each of them at its copy (the same op, group and bytes) */
			uint64_t set = stage_group(n);
			int all_at = 1;
			for (int t = 0; t < p && all_at; t++) {
				if (set && (t >= 64 || !(set >> t & 1)))
					continue;
				const Node *m = st[t].next < st[t].n ? st[t].op[st[t].next] : NULL;
				all_at = set ? m && m->op == n->op && stage_group(m) == set &&
						       moved_bytes(g, m) == moved_bytes(g, n)
					     : m == n;
			}
			if (all_at) {
				for (int t = 0; t < p; t++)
					if (!set || (t < 64 && set >> t & 1))
						st[t].next++;
				progress = 1;
			}
		}
	}
	for (int s = 0; s < p; s++) {
		if (st[s].next >= st[s].n)
			continue;
		const Node *n = st[s].op[st[s].next];
		int peer = n->op == DP_OP_SEND || n->op == DP_OP_RECV ? (int)DP_PEER(n) : -1;
		uint64_t set = stage_group(n);
		for (int t = 0; t < p && t < 64 && set && peer < 0; t++) /* the stage of the group
									   not at its copy */
			if (t != s && set >> t & 1 &&
			    !(st[t].next < st[t].n && stage_group(st[t].op[st[t].next]) == set))
				peer = t;
		if (set && peer >= 0) {
			char sets[256];
			report(vf, "%s program: stage %d's %s over stages %s (node %d, %%%s) meets no copy of "
			       "it on stage %d%s", pname, s, dp_op_names[n->op], stages_text(set, sets, sizeof sets), n->id,
			       vname(g, n->out), peer,
			       st[peer].next < st[peer].n ? ", which waits at another transfer" : "");
			break;
		}
		const Node *m = peer >= 0 && peer < p && st[peer].next < st[peer].n
					? st[peer].op[st[peer].next] : NULL;
		if (m)
			report(vf, "%s program: the pipeline deadlocks: stage %d waits at its %s (node %d, "
			       "%%%s) for stage %d, which waits at its %s (node %d, %%%s)%s", pname, s,
			       dp_op_names[n->op], n->id, vname(g, n->op == DP_OP_SEND ? n->in[0] : n->out),
			       peer, dp_op_names[m->op], m->id,
			       vname(g, m->op == DP_OP_SEND ? m->in[0] : m->out),
			       last ? "" : " (on a micro-batch before the last)");
		else
			report(vf, "%s program: stage %d's %s (node %d, %%%s) has no partner on stage %d",
			       pname, s, dp_op_names[n->op], n->id,
			       vname(g, n->op == DP_OP_SEND ? n->in[0] : n->out), peer);
		break; /* one stuck stage says it; the rest wait behind it */
	}
	free(st);
	free(all);
}

/* ---- setup kernels, collectives, buffers ---- */

/* numel of a sane value, or -1 when it does not fit int64. */
static int64_t safe_numel(const Value *v)
{
	int64_t n = 1;
	for (int k = 0; k < v->ndim; k++)
		if (__builtin_mul_overflow(n, v->dims[k], &n))
			return -1;
	return n;
}

/* Ranks in the group of n's axis mask (product of cfg.mesh over its axes),
 * or -1 after reporting a bad mask. */
static int64_t group_size(Verifier *vf, const Node *n)
{
	int64_t mask = DP_AXES(n), size = 1;
	if (mask < 0 || (mask >> DP_MAX_AXES) != 0) {
		node_error(vf, n, "bad axis mask %" PRId64, mask);
		return -1;
	}
	for (int a = 0; a < DP_MAX_AXES; a++)
		if ((mask & DP_AXIS_BIT(a)) &&
		    __builtin_mul_overflow(size, (int64_t)vf->g->cfg.mesh[a], &size)) {
			node_error(vf, n, "group of axis mask %" PRId64 " is too large", mask);
			return -1;
		}
	return size;
}

/* whole == part * group, for the operands of a SHARD, REDUCE_SCATTER or
 * ALL_GATHER (whole: the full buffer, part: one rank's block). */
static void check_split(Verifier *vf, const Node *n, int whole, int part, const char *sane)
{
	const Graph *g = vf->g;
	if (!vok(g, whole) || !vok(g, part) || !sane[whole] || !sane[part])
		return;
	int64_t group = group_size(vf, n);
	int64_t nw = safe_numel(g->values[whole]), np = safe_numel(g->values[part]), prod;
	if (group < 0 || nw < 0 || np < 0)
		return;
	if (__builtin_mul_overflow(np, group, &prod) || prod != nw)
		node_error(vf, n, "%%%s has %" PRId64 " elements, not %" PRId64 " (%%%s) x %" PRId64
				  " ranks",
			   vname(g, whole), nw, np, vname(g, part), group);
}

static int is_param_or_buffer(const Graph *g, int id)
{
	return vok(g, id) && (g->values[id]->kind == DP_T_PARAM || g->values[id]->kind == DP_T_BUFFER);
}

/* The buffer that value id is, views or overlaps (its view chain is sane),
 * or -1. buffers lists the DP_T_BUFFER ids with a sane chain. */
static int touched_buffer(const Graph *g, int id, const int *buffers, int nbuf)
{
	int64_t off;
	const Value *root = root_of(g, g->values[id], &off);
	int64_t end = off + ir_numel(g->values[id]);
	for (const Value *v = g->values[id];; v = g->values[v->view_of]) {
		if (v->kind == DP_T_BUFFER)
			return v->id;
		if (v->view_of < 0)
			break;
	}
	for (int b = 0; b < nbuf; b++) {
		int64_t boff;
		const Value *broot = root_of(g, g->values[buffers[b]], &boff);
		if (broot == root && boff < end && off < boff + ir_numel(g->values[buffers[b]]))
			return buffers[b];
	}
	return -1;
}

/* Called for nodes whose op and input count check_node found in range. */
static void check_setup(Verifier *vf, const Node *n, const char *sane, const int *buffers,
			int nbuf)
{
	const Graph *g = vf->g;
	int in0 = n->nin > 0 ? n->in[0] : -1;
	switch (n->op) {
	case DP_OP_INIT:
		if (n->progs != IR_IN_INIT)
			node_error(vf, n, "init outside the init program (programs %u)", n->progs);
		/* in0, when given, names the param a whole temporary is
		 * initialised as (a tensor-parallel param, cut afterwards) */
		if (in0 >= 0 && vok(g, in0) && !is_param_or_buffer(g, in0))
			node_error(vf, n, "init as %%%s, which is not a param or a buffer",
				   vname(g, in0));
		/* ... or state with an init spec of its own (PowerSGD's Q,
		 * passes/compress.c) */
		if (in0 < 0 && vok(g, n->out) && !is_param_or_buffer(g, n->out) &&
		    !(g->values[n->out]->kind == DP_T_OPTSTATE && g->values[n->out]->init != DP_INIT_NONE))
			node_error(vf, n, "init writes %%%s, which is not a param, a buffer or state "
				   "with an init spec", vname(g, n->out));
		break;
	case DP_OP_SAVE: {
		/* in1, when given, names the param in0 (its whole value) is saved as */
		int id = n->nin > 1 && n->in[1] >= 0 ? n->in[1] : in0;
		if (n->progs != IR_IN_EXPORT)
			node_error(vf, n, "save outside the export program (programs %u)", n->progs);
		if (vok(g, id) && !is_param_or_buffer(g, id))
			node_error(vf, n, "saves %%%s, which is not a param or a buffer", vname(g, id));
		break;
	}
	case DP_OP_SHARD:
		if (n->progs & ~(IR_IN_INIT | IR_IN_STEP))
			node_error(vf, n, "shard outside the init and step programs (programs %u)",
				   n->progs);
		check_split(vf, n, in0, n->out, sane);
		break;
	case DP_OP_REDUCE_SCATTER:
		check_split(vf, n, in0, n->out, sane);
		break;
	case DP_OP_ALL_GATHER:
		check_split(vf, n, n->out, in0, sane);
		break;
	default:
		break;
	}
	if (!dp_is_collective(n->op))
		return;
	if (n->progs & IR_IN_INIT)
		node_error(vf, n, "collective in the init program (collectives run in step, eval "
				  "and export)");
	for (int k = -1; k < n->nin; k++) {
		int id = k < 0 ? n->out : n->in[k];
		if (!vok(g, id) || !sane[id])
			continue;
		int b = touched_buffer(g, id, buffers, nbuf);
		if (b >= 0)
			node_error(vf, n, "collective on %%%s touches buffer %%%s (buffers are never "
					  "synchronised)",
				   vname(g, id), vname(g, b));
	}
}

/* ---- buckets ---- */

static void check_buckets(Verifier *vf, const char *sane)
{
	const Graph *g = vf->g;
	for (int i = 0; i < g->nbuckets; i++) {
		const Bucket *b = &g->buckets[i];
		if (!vok(g, b->view)) {
			report(vf, "bucket r%d: view %d out of range", i, b->view);
			continue;
		}
		const Value *view = g->values[b->view];
		if (!sane[b->view])
			continue;
		if (b->elems != ir_numel(view))
			report(vf, "bucket r%d: %" PRId64 " elements, its view %%%s has %" PRId64, i,
			       b->elems, view->name, ir_numel(view));
		if (b->nmembers < 1 || !b->members) {
			report(vf, "bucket r%d: no members", i);
			continue;
		}
		int64_t v0;
		const Value *root = root_of(g, view, &v0);
		for (int m = 0; m < b->nmembers; m++) {
			int id = b->members[m];
			if (!vok(g, id)) {
				report(vf, "bucket r%d: member %d out of range", i, id);
				continue;
			}
			if (!sane[id])
				continue;
			int64_t m0;
			const Value *mroot = root_of(g, g->values[id], &m0);
			if (mroot != root || m0 < v0 || m0 + ir_numel(g->values[id]) > v0 + ir_numel(view))
				report(vf, "bucket r%d: member %%%s is not inside %%%s", i, vname(g, id),
				       view->name);
		}
	}
}

/* ---- programs: SSA order, events, lifetimes ---- */

typedef struct {
	int64_t start, end; /* bytes [start, end) */
	int first, last;    /* program positions */
	int id;
} Interval;

static int by_start(const void *a, const void *b)
{
	const Interval *x = a, *y = b;
	return x->start < y->start ? -1 : x->start > y->start ? 1 : x->id - y->id;
}

/* The temporary whose lifetime a use of value id extends, or -1: id itself,
 * or for a view of a temporary (passes/views.c) its root, so reading the
 * view needs the root written and keeps the root's bytes alive. */
static int act_id(const Graph *g, int id, const char *sane)
{
	if (!vok(g, id) || g->values[id]->kind != DP_T_ACT)
		return -1;
	int64_t off;
	const Value *r = sane[id] ? root_of(g, g->values[id], &off) : g->values[id];
	return r->kind == DP_T_ACT ? r->id : id;
}

/* Walks program p (a DpProgram) in order. In the INIT program a read needs
 * no earlier write: INIT nodes write parameters through views and SHARD
 * reads their root. */
static void check_program(Verifier *vf, int p, int planned, const char *sane, int *first,
			  int *last, unsigned char *recorded)
{
	const Graph *g = vf->g;
	unsigned prog = IR_PROG_BIT(p);
	const char *pname = dp_prog_names[p];
	for (int i = 0; i < g->nvalues; i++)
		first[i] = last[i] = -1;
	if (recorded)
		memset(recorded, 0, (size_t)g->nevents);
	/* per temporary: the one pipeline stage whose nodes use it, -1: several or
	 * every rank's, -2: none yet (passes/memplan.c lets two stages' share bytes) */
	int *stage = malloc(((size_t)g->nvalues + 1) * sizeof *stage);
	if (!stage)
		die("out of memory verifying IR");
	for (int i = 0; i < g->nvalues; i++)
		stage[i] = -2;
	/* what the runtime writes before the program and reads after it */
	int io[2];
	ir_program_io(g, p, &io[0], &io[1]);
	for (int k = 0; k < 2; k++)
		io[k] = act_id(g, io[k], sane);
	if (io[0] >= 0)
		first[io[0]] = 0;
	int pos = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & prog) || (unsigned)n->op >= DP_NOPS || n->nin < 0 ||
		    n->nin > DP_MAX_IN)
			continue;
		for (int k = 0; k < n->nin; k++) {
			int id = act_id(g, n->in[k], sane);
			if (id < 0)
				continue;
			stage[id] = stage[id] == -2 || stage[id] == n->stage ? n->stage : -1;
			if (first[id] < 0) {
				if (p != DP_PROG_INIT)
					node_error(vf, n, "reads %%%s before it is written (%s program)",
						   vname(g, id), pname);
				first[id] = pos;
			}
			last[id] = pos;
		}
		if (act_id(g, n->out, sane) >= 0) {
			int id = act_id(g, n->out, sane);
			stage[id] = stage[id] == -2 || stage[id] == n->stage ? n->stage : -1;
			if (first[id] < 0) {
				if (ir_reads_out(n) && p != DP_PROG_INIT)
					node_error(vf, n, "updates %%%s before it is written (%s program)",
						   vname(g, id), pname);
				first[id] = pos;
			}
			last[id] = pos;
		}
		if (recorded && (n->op == DP_OP_EVENT_RECORD || n->op == DP_OP_EVENT_WAIT) &&
		    DP_EVENT(n) >= 0 && DP_EVENT(n) < g->nevents && n->stream >= 0 && n->stream < 8) {
			unsigned char bit = (unsigned char)(1u << n->stream);
			if (n->op == DP_OP_EVENT_RECORD)
				recorded[DP_EVENT(n)] |= bit;
			else if (!(recorded[DP_EVENT(n)] & (unsigned char)~bit))
				node_error(vf, n, "waits for event %" PRId64
						  " with no earlier record on another stream (%s program)",
					   DP_EVENT(n), pname);
		}
		pos++;
	}
	if (io[1] >= 0 && pos > 0) {
		if (first[io[1]] < 0)
			report(vf, "%%%s, which the runtime reads after the %s program, is not written by "
				   "it", vname(g, io[1]), pname);
		else
			last[io[1]] = pos - 1;
	}
	if (io[0] >= 0 && last[io[0]] < 0)
		first[io[0]] = -1; /* an empty program */
	if (!planned) {
		free(stage);
		return;
	}
	/* temporaries with overlapping lifetimes must not share bytes, unless two
	 * stages' own (never on one rank) */
	int nt = 0;
	for (int i = 0; i < g->nvalues; i++)
		if (first[i] >= 0 && g->values[i]->offset >= 0)
			nt++;
	if (nt < 2) {
		free(stage);
		return;
	}
	Interval *iv = malloc((size_t)nt * sizeof *iv);
	if (!iv)
		die("out of memory verifying IR");
	nt = 0;
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (first[i] < 0 || v->offset < 0)
			continue;
		int64_t nb = v->nbytes > 0 ? v->nbytes : 0;
		int64_t at = v->offset + (v->space == DP_SPACE_HOST ? (int64_t)g->cfg.arena_bytes : 0);
		iv[nt++] = (Interval){at, at + nb, first[i], last[i], i};
	}
	qsort(iv, (size_t)nt, sizeof *iv, by_start);
	for (int a = 0; a < nt; a++)
		for (int b = a + 1; b < nt && iv[b].start < iv[a].end; b++)
			if (iv[a].first <= iv[b].last && iv[b].first <= iv[a].last &&
			    !(stage[iv[a].id] >= 0 && stage[iv[b].id] >= 0 &&
			      stage[iv[a].id] != stage[iv[b].id]))
				report(vf, "%%%s and %%%s share bytes [%" PRId64 ", %" PRId64
					   ") while both live (%s program)",
				       vname(g, iv[a].id), vname(g, iv[b].id), iv[b].start,
				       iv[a].end < iv[b].end ? iv[a].end : iv[b].end, pname);
	free(iv);
	free(stage);
}

/* ---- memory plan ---- */

/* No temporary shares bytes with a persistent value (a parameter, a
 * gradient, optimizer state, data, a metric, a buffer): those hold what
 * lives across programs and steps, which a temporary of any program (the
 * sample program's included) would overwrite. Roots only: a view is inside
 * its root. */
typedef struct {
	int64_t start, end; /* bytes [start, end) */
	int space, id;
} Held;

static int held_by_start(const void *a, const void *b)
{
	const Held *x = a, *y = b;
	return x->start < y->start ? -1 : x->start > y->start ? 1 : x->id - y->id;
}

static void check_persistent(Verifier *vf, const char *used, const char *sane)
{
	const Graph *g = vf->g;
	Held *keep = malloc(((size_t)g->nvalues + 1) * sizeof *keep);
	if (!keep)
		die("out of memory verifying IR");
	int nk = 0;
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (sane[i] && v->view_of < 0 && v->kind != DP_T_ACT && v->offset >= 0 && v->nbytes > 0)
			keep[nk++] = (Held){v->offset, v->offset + v->nbytes, v->space, i};
	}
	qsort(keep, (size_t)nk, sizeof *keep, held_by_start);
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (!used[i] || !sane[i] || v->view_of >= 0 || v->kind != DP_T_ACT || v->offset < 0)
			continue;
		for (int k = 0; k < nk && keep[k].start < v->offset + v->nbytes; k++)
			if (keep[k].space == v->space && keep[k].end > v->offset)
				value_error(vf, i, "temporary shares bytes [%" PRId64 ", %" PRId64
						   ") with %%%s, which is persistent",
					    keep[k].start > v->offset ? keep[k].start : v->offset,
					    keep[k].end < v->offset + v->nbytes ? keep[k].end
										 : v->offset + v->nbytes,
					    vname(g, keep[k].id));
	}
	free(keep);
}

static void check_memory(Verifier *vf, const char *used, const char *sane)
{
	const Graph *g = vf->g;
	for (int i = 0; i < g->nvalues; i++) {
		const Value *v = g->values[i];
		if (!used[i])
			continue;
		if (v->offset < 0) {
			value_error(vf, i, "used but has no arena offset");
			continue;
		}
		uint64_t arena = v->space == DP_SPACE_HOST ? g->cfg.host_arena_bytes : g->cfg.arena_bytes;
		if (v->nbytes < 0 || (uint64_t)v->offset + (uint64_t)v->nbytes > arena)
			value_error(vf, i, "[%" PRId64 ", +%" PRId64 ") outside the %sarena (%" PRIu64
					   " bytes)",
				    v->offset, v->nbytes, v->space == DP_SPACE_HOST ? "host " : "", arena);
		if (sane[i] && v->view_of >= 0 && ir_root(g, v)->space != v->space)
			value_error(vf, i, "in %s memory, a view of %%%s in %s memory",
				    dp_space_names[v->space], vname(g, ir_root(g, v)->id),
				    dp_space_names[ir_root(g, v)->space]);
		if (sane[i] && v->nbytes < vbytes(v))
			value_error(vf, i, "nbytes %" PRId64 " < its size %" PRId64, v->nbytes, vbytes(v));
	}
}

int ir_verify(const Graph *g, const char *after, FILE *out)
{
	Verifier vf = {g, after, out, 0};
	if (g->nvalues < 0 || g->nnodes < 0 || (g->nvalues && !g->values) || (g->nnodes && !g->nodes)) {
		report(&vf, "graph: bad value or node arrays");
		return vf.count;
	}
	for (int i = 0; i < g->nvalues; i++)
		if (!g->values[i]) {
			report(&vf, "value %d is NULL", i);
			return vf.count;
		}
	for (int i = 0; i < g->nnodes; i++)
		if (!g->nodes[i]) {
			report(&vf, "node at position %d is NULL", i);
			return vf.count;
		}

	/* node ids: unique and below next_node_id */
	int nid = g->next_node_id > 0 ? g->next_node_id : 0;
	const Node **byid = calloc((size_t)nid + 1, sizeof *byid);
	size_t nv1 = (size_t)g->nvalues + 1;
	char *sane = malloc(nv1), *used = calloc(nv1, 1);
	int *first = malloc(nv1 * sizeof(int)), *last = malloc(nv1 * sizeof(int));
	unsigned char *recorded = NULL;
	if (g->nevents < 0)
		report(&vf, "graph: nevents %d is negative", g->nevents);
	else if (g->nevents > 0)
		recorded = malloc((size_t)g->nevents);
	if (!byid || !sane || !used || !first || !last || (g->nevents > 0 && !recorded))
		die("out of memory verifying IR");
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->id < 0 || n->id >= nid)
			node_error(&vf, n, "id not below next_node_id %d", g->next_node_id);
		else if (byid[n->id])
			node_error(&vf, n, "id used by two nodes");
		else
			byid[n->id] = n;
	}

	for (int i = 0; i < g->nvalues; i++)
		sane[i] = (char)check_value(&vf, i, byid, nid);
	check_views(&vf, sane);
	const int roles[] = {g->loss, g->logits, g->labels, g->metrics.loss, g->metrics.grad_norm,
			     g->metrics.eval_loss, g->metrics.eval_correct};
	for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++)
		if (roles[k] != -1 && !vok(g, roles[k]))
			report(&vf, "graph: loss/metric value %d out of range", roles[k]);

	int *writer = first; /* reused: the defining writer of each temporary */
	unsigned char *wprogs = calloc(nv1, 1); /* programs that wrote it so far */
	/* per value and program: the stages of its writers (all bits: one every
	 * rank runs) */
	uint64_t *wstages = calloc(nv1 * DP_NPROG, sizeof *wstages);
	if (!wprogs || !wstages)
		die("out of memory verifying IR");
	for (int i = 0; i < g->nvalues; i++)
		writer[i] = -1;
	int *buffers = last; /* reused: the buffers, for the collective check */
	int nbuf = 0;
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->kind == DP_T_BUFFER && sane[i])
			buffers[nbuf++] = i;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		check_node(&vf, n);
		if ((unsigned)n->op >= DP_NOPS || n->nin < 0 || n->nin > DP_MAX_IN)
			continue;
		check_setup(&vf, n, sane, buffers, nbuf);
		for (int k = 0; k < n->nin; k++)
			if (vok(g, n->in[k]))
				used[n->in[k]] = 1;
		if (!vok(g, n->out))
			continue;
		used[n->out] = 1;
		if (g->values[n->out]->kind != DP_T_ACT || ir_reads_out(n))
			continue;
		/* one defining writer per program: full_shard's gathered buffer is
		 * written by the forward all_gather (step, eval) and by the INIT
		 * fill and the EXPORT all_gather; a tied gathered unit's setup form
		 * is written once on each stage that keeps it (passes/stage_params.c) */
		uint64_t at = n->stage >= 0 && n->stage < 64 ? (uint64_t)1 << n->stage : ~(uint64_t)0;
		uint64_t *ws = &wstages[(size_t)n->out * DP_NPROG];
		int apart = 1; /* each program it shares with earlier writers: on other stages */
		for (int p = 0; p < DP_NPROG; p++)
			if ((n->progs >> p & 1) && (wprogs[n->out] >> p & 1) && (ws[p] & at))
				apart = 0;
		if ((wprogs[n->out] & n->progs) && apart) {
			for (int p = 0; p < DP_NPROG; p++)
				ws[p] |= n->progs >> p & 1 ? at : 0;
			wprogs[n->out] |= (unsigned char)n->progs;
		} else if (wprogs[n->out] & n->progs) {
			node_error(&vf, n, "second writer of SSA temporary %%%s (first: node %d)",
				   vname(g, n->out), writer[n->out]);
		} else {
			if (!wprogs[n->out])
				writer[n->out] = n->id;
			wprogs[n->out] |= (unsigned char)n->progs;
			for (int p = 0; p < DP_NPROG; p++)
				ws[p] |= n->progs >> p & 1 ? at : 0;
		}
	}
	free(wprogs), free(wstages);
	check_buckets(&vf, sane);

	int planned = g->cfg.arena_bytes > 0;
	for (int i = 0; i < g->nvalues && !planned; i++)
		planned = g->values[i]->offset >= 0;
	for (int p = 0; p < DP_NPROG; p++)
		check_program(&vf, p, planned, sane, first, last, recorded);
	/* the transfers' order: the first program or micro-batch that fails says it */
	int before = vf.count;
	check_pipeline_order(&vf, IR_IN_STEP, 1);
	if (vf.count == before)
		check_pipeline_order(&vf, IR_IN_STEP, 0);
	if (vf.count == before)
		check_pipeline_order(&vf, IR_IN_EVAL, 1);
	if (planned) {
		check_memory(&vf, used, sane);
		check_persistent(&vf, used, sane);
	}

	if (vf.count > MAX_REPORTED && out) {
		prefix(&vf);
		fprintf(out, "%d more violations not shown\n", vf.count - MAX_REPORTED);
	}
	free(byid);
	free(sane);
	free(used);
	free(first);
	free(last);
	free(recorded);
	return vf.count;
}
