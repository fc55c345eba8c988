/*
 * compress.c - gradient compression: PowerSGD (pass "compress"; train's
 * `compress powersgd(...)`, docs/COMPRESS.md).
 *
 * Before: the collectives form of an all-ddp graph: each bucket's gradients
 * all_reduced in place by one call over a view "bucket.rN" of flat.grads,
 * DP_IF_LAST; or of an all-hybrid_shard graph: each block's chunk
 * "U.grad.shard" all_reduced over dp_replicate after its reduce_scatter
 * over dp_shard, a bucket of one member (compiler/lower.c refused every
 * other layout).
 *
 * After, when cfg.compress is powersgd (otherwise nothing changes): a bucket
 * whose members are all of blocks that say `compress none` keeps its
 * all_reduce as it is; any other bucket's
 * all_reduce is flagged `plain` (it runs before start_step only) and is
 * followed by the bucket's compressed path, flagged `compressed` (from
 * start_step on), as PyTorch's powerSGD_hook (torch 1.13,
 * torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py) does it
 * per bucket. A member gradient M viewed as [n, m] (n its first dim, m the
 * rest, the hook's tensor.view(shape[0], -1)) with r = min(n, m, rank) is
 * compressed when (n + m) r * min_compression_rate < n m (the hook's
 * _should_compress) and its block compresses; the others (every 1-D one,
 * every one of a `compress none` block) are all_reduced whole, one
 * call per run of them next to each other in the bucket. For the
 * compressed ones, in the bucket's order:
 *   accum          M += E                     (error feedback: E its last error)
 *   orthogonalize  Q                          (the warm-started Q, as the hook;
 *                                              warm_start=false: `fresh`, Q
 *                                              drawn anew for the step first)
 *   matmul         P = M Q
 *   all_reduce     "powersgd.p.rN"            (every P of the bucket: sum n r)
 *   orthogonalize  P
 *   matmul         Q = M^T P
 *   all_reduce     "powersgd.q.rN"            (every Q of the bucket: sum m r)
 *   copy           E = M
 *   matmul         M = P Q^T
 *   scale, accum   E += -1/W M                (W: the data-parallel group;
 *                                              at pp > 1 the stage's, set by
 *                                              passes/stage_params.c)
 * The hook divides the summed Q by W because each rank's gradient there is
 * its own mean; here the loss seed already divides by the global batch, so
 * the sum of the ranks' M is the mean and P Q^T is the hook's result as
 * it is; a rank's error is its M less its 1/W share of that (the hook's
 * M - P Q^T in its units, which are W times these). The hook keeps an error
 * for the uncompressed elements too (their local value less the mean); the
 * ranks' errors there sum to 0, so the next mean is the same without them,
 * and only the compressed matrices keep one here.
 *
 * hybrid_shard: the member is the chunk, viewed as "U.grad.shard.matrix"
 * [c/m, m], m the unit's row length (shard_row; passes/layout.c padded the
 * unit so that every chunk is whole rows), and its state is named after
 * the unit ("U.powersgd_q", ...). The state views and the matrix view are
 * placed replicated: each is this rank's whole value, not a shard of a
 * larger one. W is the dp_replicate group; the reduce_scatter is untouched.
 *
 * State: three flat buffers, "powersgd.q" (persistent Q, initialised from the
 * run's seed: normal(0, 1) by (seed, name, element) like a parameter, the
 * same on every rank; a view per matrix "NAME.powersgd_q" [m, r], which
 * --init-from sets when the file has it), "powersgd.err" (E, zeroed by the
 * INIT program; "NAME.powersgd_err" [n, m]) and "powersgd.p" (P,
 * "NAME.powersgd_p" [n, r]), each bucket's part of P and Q one view
 * "powersgd.p.rN" / "powersgd.q.rN" that its all_reduce runs on (with a
 * Bucket record of its members). The runtime chooses the path by the step
 * (runtime/exec.c: DP_IF_PLAIN before cfg.compress_start, DP_IF_COMPRESSED
 * from it); both are in the one step program, so the IR shows both and the
 * memory plan holds both.
 */
#include <string.h>

#include "shard.h"

/* One gradient of a bucket: its [n, m] matrix view, and its rank r (0: not
 * compressed). */
typedef struct {
	int grad, mat; /* the gradient, and its 2-D view (itself when 2-D) */
	int64_t n, m, r;
	int q, p, err; /* the state views (compressed only) */
	const char *base; /* what they are named after: the parameter, or a chunk's unit */
} Member;

typedef struct {
	Graph *g;
	const ShardPlan *pl; /* the layout's plan (hybrid_shard's shards), or NULL */
	Node **out; /* the new program order */
	int nout;
	int64_t qn, pn, en; /* elements of the three flat buffers so far */
	int qflat, pflat, eflat;
} Cx;

static Value *view_of(Graph *g, const char *name, int flat, int64_t off, int ndim,
		      const int64_t *dims, DpTensorKind kind, const Value *like)
{
	Value *v = ir_value(g, name, DP_F32, ndim, dims, kind, like->loc);
	v->view_of = flat;
	v->view_offset = off;
	v->block = like->block;
	for (int a = 0; a < DP_MAX_AXES; a++)
		v->place[a] = like->place[a];
	return v;
}

/* A state view of a chunk's (hybrid_shard) is this rank's own whole
 * [m, r] / [n, r] / [n, m]: not a shard of a larger value. */
static Value *whole(Value *v)
{
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (v->place[a].kind == DP_PL_SHARD)
			v->place[a] = (Place){DP_PL_REPLICATE, -1};
	return v;
}

static Node *compute(Cx *c, IrOp op, int out, int nin, const int *in, int block)
{
	Node *n = ir_node(c->g, op, out, nin, in, PH_OPT, (Loc){0});
	n->progs = IR_IN_STEP;
	n->flags = DP_IF_LAST | DP_IF_COMPRESSED;
	n->block = block;
	c->out[c->nout++] = n;
	return n;
}

static Node *reduce(Cx *c, int view, unsigned axes, const int *members, int nmembers,
		    int block)
{
	Graph *g = c->g;
	Node *n = shard_comm_node(g, DP_OP_ALL_REDUCE, view, 0, NULL, axes,
				  DP_IF_LAST | DP_IF_COMPRESSED, IR_IN_STEP, block);
	Bucket b = {.op = DP_OP_ALL_REDUCE, .axes = axes, .view = view,
		    .elems = ir_numel(g->values[view]), .nmembers = nmembers,
		    .members = (int *)members};
	n->bucket = ir_add_bucket(g, &b);
	c->out[c->nout++] = n;
	return n;
}

/* The group the gradients are summed over. */
static int group_size(const Graph *g, unsigned axes)
{
	int w = 1;
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (axes & DP_AXIS_BIT(a))
			w *= (int)g->cfg.mesh[a];
	return w;
}

/* Is gradient gv's parameter (or gv's unit, a shard) in a block that
 * compresses (its own `compress`, else train's)? */
static int compresses(const Graph *g, const Value *gv)
{
	int b = gv->param >= 0 ? g->values[gv->param]->block : gv->block;
	return b >= 0 && ir_block_compress(g, b) != DP_COMPRESS_NONE;
}

/* The unit whose chunk of the gradients gv is (hybrid_shard's "U.grad.shard"),
 * or NULL. */
static const Unit *shard_unit(const Cx *c, const Value *gv)
{
	for (int k = 0; c->pl && k < c->pl->nu; k++)
		if (c->pl->u[k].cut && c->pl->u[k].shard_g == gv->id)
			return &c->pl->u[k];
	return NULL;
}

/* Classify the bucket's members and make the compressed ones' state views. */
static Member *members_of(Cx *c, const Bucket *bk)
{
	Graph *g = c->g;
	Member *mb = ir_alloc(g, (size_t)bk->nmembers * sizeof(Member));
	for (int i = 0; i < bk->nmembers; i++) {
		const Value *gv = g->values[bk->members[i]];
		/* a hybrid_shard chunk is a matrix of whole rows (passes/layout.c) */
		const Unit *u = shard_unit(c, gv);
		int64_t n = gv->dims[0], m = gv->ndim ? ir_numel(gv) / gv->dims[0] : 1;
		if (u && u->row) {
			m = u->row;
			n = ir_numel(gv) / m;
		}
		int64_t r = g->compress_rank < n ? g->compress_rank : n;
		r = r < m ? r : m;
		mb[i] = (Member){.grad = gv->id, .mat = gv->id, .n = n, .m = m, .r = 0,
				 .q = -1, .p = -1, .err = -1};
		if ((gv->ndim < 2 && !(u && u->row)) ||
		    (double)((n + m) * r) * g->compress_min_rate >= (double)(n * m) || !compresses(g, gv))
			continue;
		mb[i].r = r;
		/* the state's names: the parameter's, or the unit's for a chunk */
		const char *base = mb[i].base = u ? u->name : g->values[gv->param]->name;
		if (gv->ndim != 2)
			mb[i].mat = whole(view_of(g, ir_fmt(g, "%s.matrix", gv->name), gv->view_of,
						  gv->view_offset, 2, (int64_t[]){n, m}, DP_T_GRAD, gv))->id;
		Value *q = whole(view_of(g, ir_fmt(g, "%s.powersgd_q", base), c->qflat, c->qn, 2,
					 (int64_t[]){m, r}, DP_T_OPTSTATE, gv));
		q->init = DP_INIT_NORMAL;
		q->init_a = 0;
		q->init_b = 1;
		mb[i].q = q->id;
		c->qn += m * r;
		mb[i].p = whole(view_of(g, ir_fmt(g, "%s.powersgd_p", base), c->pflat, c->pn, 2,
					(int64_t[]){n, r}, DP_T_OPTSTATE, gv))->id;
		c->pn += n * r;
		mb[i].err = whole(view_of(g, ir_fmt(g, "%s.powersgd_err", base), c->eflat, c->en, 2,
					  (int64_t[]){n, m}, DP_T_OPTSTATE, gv))->id;
		c->en += n * m;
	}
	return mb;
}

/* The bucket's compressed path (the file's top), after its plain all_reduce. */
static void compress_bucket(Cx *c, const Node *ar, Bucket b)
{
	Graph *g = c->g;
	const Bucket *bk = &b; /* a copy: reduce() grows g->buckets */
	unsigned axes = (unsigned)DP_AXES(ar);
	int block = ar->block, nm = bk->nmembers, nc = 0;
	int64_t q0 = c->qn, p0 = c->pn;
	Member *mb = members_of(c, bk);
	const Value *bucket = g->values[bk->view];
	/* the uncompressed runs, whole */
	for (int i = 0; i < nm;) {
		if (mb[i].r) {
			nc++;
			i++;
			continue;
		}
		int j = i;
		int64_t elems = 0;
		while (j < nm && !mb[j].r)
			elems += ir_numel(g->values[mb[j++].grad]);
		const Value *first = g->values[mb[i].grad];
		int *members = ir_alloc(g, (size_t)(j - i) * sizeof(int));
		for (int k = i; k < j; k++)
			members[k - i] = mb[k].grad;
		Value *v = view_of(g, ir_fmt(g, "%s.u%d", bucket->name, i), first->view_of,
				   first->view_offset, 1, &elems, DP_T_GRAD, bucket);
		reduce(c, v->id, axes, members, j - i, block);
		i = j;
	}
	if (!nc)
		return;
	int *pm = ir_alloc(g, (size_t)nc * sizeof(int)), *qm = ir_alloc(g, (size_t)nc * sizeof(int));
	for (int i = 0, k = 0; i < nm; i++)
		if (mb[i].r) {
			pm[k] = mb[i].p;
			qm[k++] = mb[i].q;
		}
	for (int i = 0; i < nm; i++) {
		if (!mb[i].r)
			continue;
		int bl = g->values[mb[i].grad]->block;
		compute(c, DP_OP_ACCUM, mb[i].mat, 1, &mb[i].err, bl);
		Node *o = compute(c, DP_OP_ORTHOGONALIZE, mb[i].q, 0, NULL, bl);
		DP_ATTR(o, ORTHOGONALIZE, fresh) = !g->compress_warm_start;
		compute(c, DP_OP_MATMUL, mb[i].p, 2, (int[]){mb[i].mat, mb[i].q}, bl);
	}
	int64_t pe = c->pn - p0, qe = c->qn - q0;
	Value *pv = whole(view_of(g, ir_fmt(g, "powersgd.p.r%d", bk->id), c->pflat, p0, 1, &pe,
				  DP_T_OPTSTATE, bucket));
	reduce(c, pv->id, axes, pm, nc, block);
	for (int i = 0; i < nm; i++) {
		if (!mb[i].r)
			continue;
		int bl = g->values[mb[i].grad]->block;
		compute(c, DP_OP_ORTHOGONALIZE, mb[i].p, 0, NULL, bl);
		Node *mm = compute(c, DP_OP_MATMUL, mb[i].q, 2, (int[]){mb[i].mat, mb[i].p}, bl);
		DP_ATTR(mm, MATMUL, transA) = 1;
	}
	Value *qv = whole(view_of(g, ir_fmt(g, "powersgd.q.r%d", bk->id), c->qflat, q0, 1, &qe,
				  DP_T_OPTSTATE, bucket));
	reduce(c, qv->id, axes, qm, nc, block);
	float share = -1.0f / (float)group_size(g, axes);
	for (int i = 0; i < nm; i++) {
		if (!mb[i].r)
			continue;
		const Value *m = g->values[mb[i].mat];
		int bl = m->block;
		compute(c, DP_OP_COPY, mb[i].err, 1, &mb[i].mat, bl);
		Node *mm = compute(c, DP_OP_MATMUL, mb[i].mat, 2, (int[]){mb[i].p, mb[i].q}, bl);
		DP_ATTR(mm, MATMUL, transB) = 1;
		Value *t = ir_value(g, ir_fmt(g, "%s.powersgd_share", mb[i].base),
				    DP_F32, 2, m->dims, DP_T_ACT, m->loc);
		t->block = bl;
		Node *sc = compute(c, DP_OP_SCALE, t->id, 1, &mb[i].mat, bl);
		DP_SCALAR(sc) = share;
		compute(c, DP_OP_ACCUM, mb[i].err, 1, &t->id, bl);
	}
}

static Value *flat(Graph *g, const char *name, Loc loc)
{
	Value *v = ir_value(g, name, DP_F32, 1, (int64_t[]){1}, DP_T_FLAT, loc);
	return v;
}

int compress_run(Graph *g, Diag *d)
{
	if (g->cfg.compress == DP_COMPRESS_NONE)
		return 0;
	int n0 = g->nnodes, nb0 = g->nbuckets;
	Cx c = {.g = g};
	Loc loc = {0};
	/* hybrid_shard's chunks: their units from the layout's plan */
	for (int b = 0; b < g->nblocks && !c.pl; b++)
		if (ir_block_strategy(g, b) == DP_STRAT_HYBRID_SHARD && !(c.pl = shard_plan(g, d)))
			return -1;
	c.qflat = flat(g, "powersgd.q", loc)->id;
	c.pflat = flat(g, "powersgd.p", loc)->id;
	c.eflat = flat(g, "powersgd.err", loc)->id;
	/* per member at most 9 compute nodes, an all_reduce and an INIT; per
	 * bucket two all_reduces; the FILL */
	int cap = n0 + 1;
	for (int b = 0; b < nb0; b++)
		cap += 11 * g->buckets[b].nmembers + 2;
	c.out = ir_alloc(g, (size_t)cap * sizeof(Node *));
	Node **old = ir_alloc(g, (size_t)(n0 ? n0 : 1) * sizeof(Node *));
	memcpy(old, g->nodes, (size_t)n0 * sizeof(Node *));
	for (int i = 0; i < n0; i++) {
		Node *n = old[i];
		c.out[c.nout++] = n;
		if (n->op != DP_OP_ALL_REDUCE || !(n->progs & IR_IN_STEP) || n->bucket < 0 ||
		    ir_root(g, g->values[n->out])->kind != DP_T_FLAT ||
		    g->values[n->out]->kind != DP_T_GRAD)
			continue;
		/* a bucket of `compress none` blocks only keeps its one all_reduce */
		const Bucket *bk = &g->buckets[n->bucket];
		int any = 0;
		for (int k = 0; k < bk->nmembers && !any; k++)
			any = compresses(g, g->values[bk->members[k]]);
		if (!any)
			continue;
		n->flags |= DP_IF_PLAIN;
		compress_bucket(&c, n, g->buckets[n->bucket]);
	}
	/* the flat buffers' sizes, and their INIT: Q from its init spec, E zeroed */
	g->values[c.qflat]->dims[0] = c.qn ? c.qn : 1;
	g->values[c.pflat]->dims[0] = c.pn ? c.pn : 1;
	g->values[c.eflat]->dims[0] = c.en ? c.en : 1;
	for (int v = 0; v < g->nvalues; v++)
		if (g->values[v]->view_of == c.qflat && g->values[v]->init == DP_INIT_NORMAL) {
			Node *in = ir_node(g, DP_OP_INIT, v, 0, NULL, PH_SETUP, loc);
			in->progs = IR_IN_INIT;
			c.out[c.nout++] = in;
		}
	Node *f = ir_node(g, DP_OP_FILL, c.eflat, 0, NULL, PH_SETUP, loc);
	f->progs = IR_IN_INIT;
	DP_FATTR(f, FILL, value) = 0;
	c.out[c.nout++] = f;
	if (c.nout != g->nnodes)
		die("compress: placed %d of %d nodes", c.nout, g->nnodes);
	memcpy(g->nodes, c.out, (size_t)c.nout * sizeof(Node *));
	return 0;
}
