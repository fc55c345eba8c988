/*
 * fuse.c - a linear and the gelu after it become one GEMM, forward and
 * backward (pass "fuse"): what cuBLASLt's GELU_AUX_BIAS and DGELU epilogues
 * compute in the GEMM's own epilogue, without a pass of the activation
 * through memory (docs/CUDA.md); the loss and its gradient become one
 * pass over the logits (llm.c's fused_classifier); and a residual add
 * becomes part of the layernorm or rmsnorm after it, forward and backward.
 *
 * Before: the schedule form. A linear h = linear(x, w[, b]) whose
 * pre-activation h is read by one gelu a = gelu(h) (and by the gelu_grad of
 * the backward); the backward's da = matmul(dy, w2) (no acc) read only by
 * dh = gelu_grad(da, h).
 *
 * After:
 *  - forward: the linear is `%h.gelu = linear_gelu(x, w[, b])`, a temporary
 *    [2, rows, n] whose first half is h and second half gelu(h); h and a
 *    are views of the two halves (view=%h.gelu+0 and +rows*n, def -1) and
 *    the gelu node is gone. Every reader of h or a reads the same numbers
 *    from the same place as before (the memory plan keeps the pair alive
 *    until the last use of either).
 *  - backward: the matmul is `dh = matmul_gelu_grad(dy, w2, h)` with the
 *    matmul's transposes, the gelu_grad node is gone and da with it.
 *  - classifier: the step's `loss = cross_entropy(logits, y)` and the
 *    backward's `dlogits = cross_entropy_grad(logits, y)` (same scale, same
 *    place, the labels not written between them) where the logits are a
 *    plain temporary nothing else of the step reads and nothing views:
 *    `loss = cross_entropy_fused(logits, y)` at the loss's place writes the
 *    loss and, in place over the logits (RO IN0), the gradient; dlogits is a
 *    view of all of the logits (view=%logits+0, def -1) and the gradient
 *    node is gone. The logits are read once and written once where the two
 *    kernels read them twice (three times without the loss's row
 *    statistics, runtime/cuda/loss.cu) and wrote a second buffer of their
 *    size: GPT-2 124M's bf16 logits are 0.8 GB per micro-batch of 8192
 *    tokens. Eval's cross_entropy and correct (their own program) are left.
 *  - residual add -> layernorm (GPT-2's x = x + f(x); h = layernorm(x)): a
 *    sum s = add(a, b) that a layernorm y = layernorm(s, gamma, beta)
 *    reads becomes, at the layernorm's place (its gamma and beta may be
 *    gathered after the add: full_shard), `%y.add = add_layernorm(a, b,
 *    gamma, beta)`, a temporary [2, rows, C] whose first half is s and
 *    second y; s and y are views of the halves (view=%y.add+0 and
 *    +rows*C, def -1) and the add is gone. s stays a value, read by the
 *    next add and by the backward, which the sum written once serves.
 *    Backward: the layernorm's `dx = layernorm_grad(dy, s, gamma)`
 *    followed by the autodiff's `accum dx, dres` (the residual stream's
 *    gradient, which the add passed to s) becomes `dx =
 *    layernorm_grad_add(dy, s, gamma, dres)` at the layernorm_grad's
 *    place and the accum is gone: one read of the rows and one write
 *    where the pair read dx twice and wrote it twice.
 *  - context parallelism's attention backward (passes/cp.c, ir_grad_attention_cp):
 *    `dq = attention_cp_grad(dy, qkv, kv, pos)` and `dkv =
 *    attention_cp_grad_kv(dy, qkv, kv, pos)` of one attention_cp (the same
 *    four operands and heads) become, at the first one's place,
 *    `%dq.both = attention_cp_grad_both(dy, qkv, kv, pos)`, a flat
 *    temporary of d kv's elements and then d qkv's; dkv and dq are views
 *    of the two parts (view=%dq.both+0 and +numel(dkv), def -1) and the
 *    second node is gone. The two recomputed the same probabilities (S,
 *    dP) each: on tensor cores one backward kernel now gives dQ, dK and
 *    dV (runtime/cuda/attention.cu: 5 T^2 hd units where the pair ran 3 +
 *    4, or 7 where unpaired ran 5 + 6). d kv is written where the pair
 *    wrote d qkv, before its reduce_scatter as before; its bytes now live
 *    as long as d qkv's (the pack), until qkv's linear has its gradient.
 *  - LayerNorm's gamma and beta gradients: the autodiff's `%grad.g =
 *    layernorm_grad_g(dy, x)` and the `%grad.b = bias_grad(dy)` of the same
 *    dy and acc, whose gradients lie side by side in one buffer (gamma's
 *    first: the layout puts a block's gradients in the backward's completion
 *    order, so GPT-2's and the layout tests' do), become, at the first one's
 *    place, `%grad.g.gb = layernorm_grad_gb(dy, x)` writing a [2, C] view
 *    over both (view=gamma's buffer+gamma's offset; one per pair, shared by
 *    every micro-batch's node); the bias_grad is gone. dy is read once
 *    where the pair read it twice (and on CUDA x once where the gamma
 *    gradient's statistics pass and its sums read it twice): 25 instructions
 *    of GPT-2's step fewer, each a pass over 16,384 x 768 bf16 rows at the
 *    GPU kit's batch. beta's gradient moves up to gamma's: nothing between
 *    writes dy or touches either gradient.
 *  - residual add -> rmsnorm (Llama's x = x + f(x); h = rmsnorm(x)): the
 *    same, without beta: `%y.add = add_rmsnorm(a, b, g)` and `dx =
 *    rmsnorm_grad_add(dy, s, g, dres)`. Separate ops rather than a flag on
 *    the layernorm pair, as layernorm and rmsnorm themselves are: the op
 *    name says which norm, the arity differs (no beta), and the kernels
 *    are shared (their rms rows).
 * A pair is fused only when nothing else can tell: both nodes in the same
 * programs, on the same stream, under the same DP_IF_LAST condition; the
 * linear's and gelu's results temporaries with one writer each, not views
 * already, of one dtype; the matmul's result read by nothing but the
 * gelu_grad, and h complete before the matmul runs. The residual add: the
 * sum read by nothing before the layernorm and the add's operands written
 * by nothing between the two; backward, dx read by nothing before the
 * accum, written by those two alone, and dres complete before the
 * layernorm_grad and written by nothing until the accum. The cp
 * gradients: the same stream, programs and condition, d kv written by that
 * node alone and read by nothing before it, d qkv defined by the first and
 * then only added into (the autodiff's accums of qkv's other gradients),
 * the four operands written by nothing between the two. The CPU backend runs the
 * fused ops as the two kernels they replace (bitwise the same results); on
 * CUDA one cuBLASLt call does both (runtime/cuda/gemm.cu). The fused
 * classifier's kernels do the loss's row walk and then the gradient's on the
 * row they hold (runtime/cpu/loss.c, runtime/cuda/loss.cu): bitwise both
 * kernels' results on either backend. add_layernorm and layernorm_grad_add
 * (add_rmsnorm, rmsnorm_grad_add) do the pair's arithmetic in its order and round the sum and dx to the
 * storage dtype where the pair stored them (runtime/cpu/norm.c: bitwise the
 * pair in f32, bf16 and fp16; runtime/cuda/norm.cu: the norms' 1 ulp).
 * layernorm_grad_gb sums each column in the pair's order (runtime/cpu/norm.c:
 * bitwise; runtime/cuda/norm.cu: the column sums' 1 ulp).
 */
#include <limits.h>
#include <string.h>

#include "passes.h"

/* A temporary written by exactly one node and not a view: the only kind a
 * fused node may take over. */
static int plain_temp(const Graph *g, int v, const int *writers)
{
	const Value *x = g->values[v];
	return x->kind == DP_T_ACT && x->view_of < 0 && writers[v] == 1;
}

static int same_place(const Node *a, const Node *b)
{
	return a->progs == b->progs && a->stream == b->stream && a->flags == b->flags;
}

/*
 * The graph as fuse reads it, indexed once so that each candidate costs
 * its own readers rather than a scan of every node (a pipelined step holds
 * every micro-batch: ~10^5 candidates in ~10^6 nodes). Fused-away nodes
 * are marked dead and leave g->nodes in one compaction at the end, so
 * positions stay put and keep their order.
 */
typedef struct {
	int *start, *at;  /* the positions of value v's readers: at[start[v] .. start[v + 1]) */
	int *first_write; /* [v]: the first position whose out is v, -1 */
	char *dead;       /* [position]: fused away */
	int nvalues;      /* the values indexed */
} FuseIndex;

/* Is in[q] the first operand slot holding its value? (a reader once) */
static int first_slot(const int *in, int q)
{
	for (int p = 0; p < q; p++)
		if (in[p] == in[q])
			return 0;
	return 1;
}

static void fuse_index(Graph *g, FuseIndex *ix, char *dead)
{
	int nv = g->nvalues, n = g->nnodes;
	ix->nvalues = nv;
	ix->dead = dead;
	ix->start = ir_alloc(g, ((size_t)nv + 2) * sizeof(int));
	ix->first_write = ir_alloc(g, ((size_t)nv + 1) * sizeof(int));
	memset(ix->start, 0, ((size_t)nv + 2) * sizeof(int));
	for (int v = 0; v < nv; v++)
		ix->first_write[v] = -1;
	for (int j = 0; j < n; j++) {
		const Node *nd = g->nodes[j];
		if (dead[j])
			continue;
		for (int q = 0; q < nd->nin; q++) /* each reader once */
			if (nd->in[q] >= 0 && first_slot(nd->in, q))
				ix->start[nd->in[q] + 2]++;
		if (nd->out >= 0 && nd->out < nv && ix->first_write[nd->out] < 0)
			ix->first_write[nd->out] = j;
	}
	for (int v = 0; v < nv; v++)
		ix->start[v + 2] += ix->start[v + 1];
	ix->at = ir_alloc(g, ((size_t)ix->start[nv + 1] + 1) * sizeof(int));
	for (int j = 0; j < n; j++) {
		const Node *nd = g->nodes[j];
		if (dead[j])
			continue;
		for (int q = 0; q < nd->nin; q++)
			if (nd->in[q] >= 0 && first_slot(nd->in, q))
				ix->at[ix->start[nd->in[q] + 1]++] = j;
	}
}

/* The one node after position i reading value v as operand k with op, or
 * NULL (none, or another node reads v too: then *others is set). */
static Node *sole_reader(const Graph *g, const FuseIndex *ix, int i, int v, IrOp op, int k,
			 int *others)
{
	Node *found = NULL;
	*others = 0;
	for (int p = ix->start[v]; p < ix->start[v + 1]; p++) {
		int j = ix->at[p];
		Node *n = g->nodes[j];
		if (ix->dead[j])
			continue;
		for (int q = 0; q < n->nin; q++) {
			if (n->in[q] != v)
				continue;
			if (j > i && n->op == op && q == k && !found)
				found = n;
			else if (n != found)
				*others = 1;
		}
	}
	return found;
}

/* Node n now writes a new [2, rows, C] temporary %NAMED.SUFFIX (named's
 * block and place) whose halves the values first and second (alike) become
 * views of, neither with a writer of its own. */
static void new_pack(Graph *g, Node *n, Value *first, Value *second, const Value *named,
		     const char *suffix)
{
	int64_t cols = first->dims[first->ndim - 1], rows = ir_numel(first) / cols;
	const char *name = ir_fmt(g, "%s.%s", named->name, suffix);
	if (ir_find_value(g, name))
		name = ir_fresh_name(g, name);
	Value *pack = ir_value(g, name, first->dtype, 3, (int64_t[]){2, rows, cols}, DP_T_ACT,
			       named->loc);
	pack->block = named->block;
	pack->def = n->id;
	n->out = pack->id;
	first->view_of = second->view_of = pack->id;
	first->view_offset = 0;
	second->view_offset = rows * cols;
	first->def = second->def = -1;
}

/* linear -> gelu: the linear writes both halves, the two values view them. */
static void fuse_forward(Graph *g, const FuseIndex *ix, int i, const int *writers)
{
	Node *lin = g->nodes[i];
	int h = lin->out, gj = -1;
	if (h < 0 || !plain_temp(g, h, writers))
		return;
	Node *gelu = NULL;
	for (int p = ix->start[h]; p < ix->start[h + 1] && !gelu; p++) {
		int j = ix->at[p];
		if (j > i && !ix->dead[j] && g->nodes[j]->op == DP_OP_GELU && g->nodes[j]->in[0] == h)
			gelu = g->nodes[j], gj = j;
	}
	if (!gelu || !same_place(lin, gelu) || gelu->out < 0 || !plain_temp(g, gelu->out, writers))
		return;
	Value *hv = g->values[h], *av = g->values[gelu->out];
	if (av->dtype != hv->dtype || ir_numel(av) != ir_numel(hv))
		return;
	lin->op = DP_OP_LINEAR_GELU;
	new_pack(g, lin, hv, av, hv, "gelu");
	ix->dead[gj] = 1;
}

/* matmul -> gelu_grad: one matmul that multiplies by gelu'(h) as it stores.
 * Returns the matmul's old result, which nothing uses any more, or -1. */
static int fuse_backward(Graph *g, const FuseIndex *ix, int i, const int *writers)
{
	Node *mm = g->nodes[i];
	int da = mm->out, others;
	if (da < 0 || DP_ATTR(mm, MATMUL, acc) || !plain_temp(g, da, writers))
		return -1;
	Node *gg = sole_reader(g, ix, i, da, DP_OP_GELU_GRAD, 0, &others);
	if (!gg || others || gg->in[1] == da || !same_place(mm, gg) || gg->out < 0 ||
	    !plain_temp(g, gg->out, writers))
		return -1;
	const Value *dh = g->values[gg->out], *dav = g->values[da];
	if (dh->dtype != dav->dtype || ir_numel(dh) != ir_numel(dav))
		return -1;
	/* h is complete before the matmul: its root's writer comes first */
	const Value *root = ir_root(g, g->values[gg->in[1]]);
	int hw = root->id < ix->nvalues ? ix->first_write[root->id] : -1;
	if (hw < 0 || hw >= i)
		return -1;
	mm->op = DP_OP_MATMUL_GELU_GRAD;
	mm->in[2] = gg->in[1];
	mm->nin = 3;
	mm->out = gg->out;
	g->values[gg->out]->def = mm->id;
	for (int p = ix->start[da]; p < ix->start[da + 1]; p++) /* gg: da's only reader */
		if (g->nodes[ix->at[p]] == gg)
			ix->dead[ix->at[p]] = 1;
	return da;
}

/* Does any node at positions (i, j) write value v? */
static int written_between(const Graph *g, const FuseIndex *ix, int i, int j, int v)
{
	for (int p = i + 1; p < j; p++) {
		const Node *n = g->nodes[p];
		if (ix->dead[p])
			continue;
		if (n->out == v)
			return 1;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] == v && ir_writes_in(n, k))
				return 1;
	}
	return 0;
}

/* cross_entropy -> cross_entropy_grad over the same logits: one
 * cross_entropy_fused writing the loss and, over the logits, the gradient,
 * whose value becomes a view of them. Returns the position of the fused-away
 * gradient node, or -1. */
static int fuse_classifier(Graph *g, const FuseIndex *ix, int i, const int *writers)
{
	Node *x = g->nodes[i], *grad = NULL;
	int lg = x->in[0], gj = -1;
	if (!(x->progs & IR_IN_STEP) || lg < 0 || lg >= ix->nvalues || !plain_temp(g, lg, writers))
		return -1;
	for (int v = 0; v < g->nvalues; v++) /* nothing else may see the bytes change */
		if (g->values[v]->view_of == lg)
			return -1;
	for (int p = ix->start[lg]; p < ix->start[lg + 1]; p++) {
		int j = ix->at[p];
		Node *n = g->nodes[j];
		if (ix->dead[j] || n == x)
			continue;
		if (n->op == DP_OP_XENT_GRAD && !grad && j > i && n->in[0] == lg &&
		    n->in[1] == x->in[1] && n->in[1] != lg)
			grad = n, gj = j;
		else if (n->progs & IR_IN_STEP)
			return -1; /* another reader of the step's logits */
	}
	if (!grad || !same_place(x, grad) || grad->out < 0 || !plain_temp(g, grad->out, writers) ||
	    DP_FATTR(grad, XENT_GRAD, scale) != DP_FATTR(x, XENT, scale))
		return -1;
	Value *lv = g->values[lg], *dv = g->values[grad->out];
	if (dv->dtype != lv->dtype || dv->ndim != lv->ndim ||
	    memcmp(dv->dims, lv->dims, (size_t)lv->ndim * sizeof lv->dims[0]) ||
	    written_between(g, ix, i, gj, x->in[1]))
		return -1;
	x->op = DP_OP_XENT_FUSED;
	DP_ATTR(x, XENT_FUSED, loss_scale) = DP_ATTR(grad, XENT_GRAD, loss_scale);
	dv->view_of = lg;
	dv->view_offset = 0;
	dv->def = -1;
	return gj;
}

/* Does a node at positions (i, j) write any byte of v's root (its own
 * value, or a view of the root)? */
static int root_written_between(const Graph *g, const FuseIndex *ix, int i, int j, int v)
{
	const Value *root = ir_root(g, g->values[v]);
	for (int p = i + 1; p < j; p++) {
		const Node *n = g->nodes[p];
		if (ix->dead[p])
			continue;
		if (n->out >= 0 && ir_root(g, g->values[n->out]) == root)
			return 1;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && ir_writes_in(n, k) && ir_root(g, g->values[n->in[k]]) == root)
				return 1;
	}
	return 0;
}

/* Is any reader of value v at a position before j (other than dead ones)? */
static int read_before(const FuseIndex *ix, int v, int j)
{
	for (int p = ix->start[v]; p < ix->start[v + 1]; p++)
		if (!ix->dead[ix->at[p]] && ix->at[p] < j)
			return 1;
	return 0;
}

/* When values die, for fuse_add_norm: last_read[r], the last position that
 * reads root value r (through any view of it), -1 if none; next_bwd[j], the
 * first backward node at or after position j, INT_MAX if none. */
typedef struct {
	int *last_read, *next_bwd;
} Lives;

static void lives_index(Graph *g, const char *gone, Lives *lv)
{
	lv->last_read = ir_alloc(g, ((size_t)g->nvalues + 1) * sizeof(int));
	lv->next_bwd = ir_alloc(g, ((size_t)g->nnodes + 1) * sizeof(int));
	for (int v = 0; v < g->nvalues; v++)
		lv->last_read[v] = -1;
	int nb = INT_MAX;
	for (int j = g->nnodes - 1; j >= 0; j--) {
		const Node *n = g->nodes[j];
		if (!gone[j] && n->phase == PH_BWD)
			nb = j;
		lv->next_bwd[j] = nb;
	}
	for (int j = 0; j < g->nnodes; j++) {
		const Node *n = g->nodes[j];
		if (gone[j])
			continue;
		for (int q = 0; q < n->nin; q++)
			if (n->in[q] >= 0) {
				int r = ir_root(g, g->values[n->in[q]])->id;
				lv->last_read[r] = j;
			}
	}
}

/* add -> layernorm (rmsnorm) over the sum: the norm at position j becomes
 * one add_layernorm (add_rmsnorm) at its own place (its gamma and beta may be gathered after
 * the add: full_shard), writing the sum into the first half of a [2, rows,
 * C] temporary and the norm into the second; the sum's and the norm's values
 * view the halves. Returns the add's position, or -1. */
static int fuse_add_norm(Graph *g, const FuseIndex *ix, int j, const int *writers, const Lives *lv)
{
	Node *ln = g->nodes[j];
	int s = ln->in[0];
	if (s < 0 || s >= ix->nvalues || ln->out < 0 || !plain_temp(g, s, writers) ||
	    !plain_temp(g, ln->out, writers))
		return -1;
	/* one temporary holds both: it lives as long as the longer, so the sum
	 * and the norm must die on the same side of the backward that follows
	 * (both saved for it, or both dead before it). Under gradient
	 * checkpointing the forward's sum is kept for the recomputation and
	 * its norm is not: packed, every block's norm stayed to the backward
	 * (+0.5 GiB at Llama 7B's shape in bf16, 32 layers x 16 MiB) */
	int nb = lv->next_bwd[j];
	if ((lv->last_read[s] < nb) != (lv->last_read[ln->out] < nb))
		return -1;
	int i = ix->first_write[s];
	if (i < 0 || i >= j || ix->dead[i])
		return -1;
	Node *add = g->nodes[i];
	if (add->op != DP_OP_ADD || !same_place(add, ln) || add->in[0] == s || add->in[1] == s)
		return -1;
	/* the add moves to j: nothing reads the sum before, nothing writes its
	 * operands between */
	if (read_before(ix, s, j) || root_written_between(g, ix, i, j, add->in[0]) ||
	    root_written_between(g, ix, i, j, add->in[1]))
		return -1;
	Value *sv = g->values[s], *yv = g->values[ln->out];
	if (yv->dtype != sv->dtype || ir_numel(yv) != ir_numel(sv))
		return -1;
	int rms = ln->op == DP_OP_RMSNORM; /* {s, g}: no beta */
	ln->op = rms ? DP_OP_ADD_RMSNORM : DP_OP_ADD_LAYERNORM;
	ln->in[3] = rms ? -1 : ln->in[2];
	ln->in[2] = ln->in[1];
	ln->in[0] = add->in[0];
	ln->in[1] = add->in[1];
	ln->nin = rms ? 3 : 4;
	new_pack(g, ln, sv, yv, yv, "add");
	ix->dead[i] = 1;
	return i;
}

/* attention_cp_grad -> attention_cp_grad_kv of the same attention_cp (the
 * same dy, qkv, kv, pos and heads): one attention_cp_grad_both at the first
 * one's place, writing d kv into the first part of a flat temporary and
 * d qkv into the second; the two gradients' values view the parts. Returns
 * the position of attention_cp_grad_kv, or -1. */
static int fuse_cp_grad(Graph *g, const FuseIndex *ix, int i, const int *writers)
{
	Node *dq = g->nodes[i];
	int q = dq->out, dy = dq->in[0];
	if (q < 0 || q >= ix->nvalues || dy < 0 || dy >= ix->nvalues)
		return -1;
	int j = -1;
	for (int p = ix->start[dy]; p < ix->start[dy + 1] && j < 0; p++) {
		const Node *n = g->nodes[ix->at[p]];
		if (ix->at[p] > i && !ix->dead[ix->at[p]] && n->op == DP_OP_ATTENTION_CP_GRAD_KV &&
		    !memcmp(n->in, dq->in, 4 * sizeof n->in[0]) &&
		    DP_ATTR(n, ATTENTION_CP_GRAD_KV, heads) == DP_ATTR(dq, ATTENTION_CP_GRAD, heads) &&
		    DP_ATTR(n, ATTENTION_CP_GRAD_KV, cp) == DP_ATTR(dq, ATTENTION_CP_GRAD, cp))
			j = ix->at[p];
	}
	if (j < 0)
		return -1;
	Node *dkv = g->nodes[j];
	int k = dkv->out;
	/* d kv: written there alone; d qkv: defined there, then only added
	 * into (the autodiff's accums of qkv's other gradients) */
	if (k < 0 || k >= ix->nvalues || !same_place(dq, dkv) || !plain_temp(g, k, writers) ||
	    g->values[q]->kind != DP_T_ACT || g->values[q]->view_of >= 0 || ix->first_write[q] != i)
		return -1;
	for (int p = i + 1; p < g->nnodes; p++)
		if (!ix->dead[p] && g->nodes[p]->out == q && !ir_reads_out(g->nodes[p]))
			return -1;
	/* d kv moves from j to i: its operands are complete at i (nothing
	 * writes them between), nothing reads it before j */
	for (int o = 0; o < 4; o++)
		if (root_written_between(g, ix, i, j, dq->in[o]))
			return -1;
	if (read_before(ix, k, j + 1))
		return -1;
	Value *qv = g->values[q], *kv = g->values[k];
	if (qv->dtype != kv->dtype)
		return -1;
	const char *name = ir_fmt(g, "%s.both", qv->name);
	if (ir_find_value(g, name))
		name = ir_fresh_name(g, name);
	Value *pack = ir_value(g, name, qv->dtype, 1, (int64_t[]){ir_numel(kv) + ir_numel(qv)},
			       DP_T_ACT, qv->loc);
	pack->block = qv->block;
	pack->def = dq->id;
	dq->op = DP_OP_ATTENTION_CP_GRAD_BOTH;
	dq->out = pack->id;
	kv->view_of = qv->view_of = pack->id;
	kv->view_offset = 0;
	qv->view_offset = ir_numel(kv);
	kv->def = qv->def = -1;
	return j;
}

/* layernorm_grad (rmsnorm_grad) -> the accum that adds the residual
 * stream's gradient to its dx: one layernorm_grad_add (rmsnorm_grad_add) at
 * the norm gradient's place. accum_at[v]:
 * the position of the first accum into v. Returns the accum's position, or
 * -1. */
static int fuse_norm_grad_add(Graph *g, const FuseIndex *ix, int i, const int *writers,
			      const int *accum_at)
{
	Node *lg = g->nodes[i];
	int t = lg->out;
	if (t < 0 || t >= ix->nvalues || lg->nin != 3)
		return -1;
	const Value *tv = g->values[t];
	if (tv->kind != DP_T_ACT || tv->view_of >= 0 || writers[t] != 2 || ix->first_write[t] != i)
		return -1;
	int j = accum_at[t];
	if (j <= i || ix->dead[j])
		return -1;
	Node *acc = g->nodes[j];
	int r = acc->in[0];
	if (r < 0 || r == t || !same_place(lg, acc) || read_before(ix, t, j + 1))
		return -1;
	const Value *rv = g->values[r];
	if (rv->dtype != tv->dtype || ir_numel(rv) != ir_numel(tv) ||
	    rv->dims[rv->ndim - 1] != tv->dims[tv->ndim - 1])
		return -1;
	/* the add moves to i: the residual's gradient is complete there (its
	 * root first written before, nothing writing it until the accum) */
	const Value *root = ir_root(g, rv);
	int rw = root->id < ix->nvalues ? ix->first_write[root->id] : -1;
	if (rw < 0 || rw >= i || root_written_between(g, ix, i - 1, j, r))
		return -1;
	lg->op = lg->op == DP_OP_RMSNORM_GRAD ? DP_OP_RMSNORM_GRAD_ADD : DP_OP_LAYERNORM_GRAD_ADD;
	lg->in[3] = r;
	lg->nin = 4;
	return j;
}

/* Does a node at positions (i, j) read or write any byte of v? */
static int touched_between(const Graph *g, const FuseIndex *ix, int i, int j, const Value *v)
{
	for (int p = i + 1; p < j; p++)
		if (!ix->dead[p] && ir_node_touches(g, g->nodes[p], v))
			return 1;
	return 0;
}

/* layernorm_grad_g -> the bias_grad of the same dy (LayerNorm's gamma and
 * beta gradients): one layernorm_grad_gb at the first one's place, writing
 * a [2, C] view over both gradients, which lie side by side in one buffer
 * (gamma's first: the layout's order, the backward's completion order).
 * Returns the bias_grad's position, or -1. */
static int fuse_norm_grad_gb(Graph *g, const FuseIndex *ix, int i)
{
	Node *gn = g->nodes[i], *bn = NULL;
	int dy = gn->in[0], j = -1;
	if (gn->out < 0 || dy < 0 || dy >= ix->nvalues)
		return -1;
	for (int p = ix->start[dy]; p < ix->start[dy + 1] && !bn; p++) {
		Node *n = g->nodes[ix->at[p]];
		if (ix->at[p] > i && !ix->dead[ix->at[p]] && n->op == DP_OP_BIAS_GRAD && n->in[0] == dy)
			bn = n, j = ix->at[p];
	}
	if (!bn || bn->out < 0 || !same_place(gn, bn) ||
	    DP_ATTR(gn, LAYERNORM_GRAD_G, acc) != DP_ATTR(bn, BIAS_GRAD, acc))
		return -1;
	Value *gv = g->values[gn->out], *bv = g->values[bn->out];
	const Value *x = g->values[gn->in[1]];
	int64_t c = ir_numel(gv);
	if (gv->view_of < 0 || bv->view_of != gv->view_of || gv->dtype != bv->dtype ||
	    ir_numel(bv) != c || bv->view_offset != gv->view_offset + c || c != x->dims[x->ndim - 1])
		return -1;
	/* beta's gradient moves from j to i: dy is complete there (gamma's
	 * reads it), nothing writes dy or sees either gradient between */
	if (root_written_between(g, ix, i, j, dy) || touched_between(g, ix, i, j, gv) ||
	    touched_between(g, ix, i, j, bv))
		return -1;
	/* one view per pair of gradients, shared by every micro-batch's node */
	const char *name = ir_fmt(g, "%s.gb", gv->name);
	Value *both = ir_find_value(g, name);
	if (both && (both->view_of != gv->view_of || both->view_offset != gv->view_offset ||
		     ir_numel(both) != 2 * c || both->dtype != gv->dtype))
		return -1;
	if (!both) {
		both = ir_value(g, name, gv->dtype, 2, (int64_t[]){2, c}, gv->kind, gv->loc);
		both->view_of = gv->view_of;
		both->view_offset = gv->view_offset;
		both->block = gv->block;
		for (int a = 0; a < DP_MAX_AXES; a++)
			both->place[a] = gv->place[a];
	}
	if (gv->def == gn->id)
		gv->def = -1;
	if (bv->def == bn->id)
		bv->def = -1;
	gn->op = DP_OP_LAYERNORM_GRAD_GB;
	gn->out = both->id;
	return j;
}

int fuse_run(Graph *g, Diag *d)
{
	(void)d;
	int *writers = ir_alloc(g, (size_t)g->nvalues * sizeof(int) + 1);
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->out >= 0)
			writers[g->nodes[i]->out]++;
	/* forward first: the backward's h is then a view the matmul reads
	 * (indexed again after it: the packs' writers) */
	char *gone = ir_alloc(g, (size_t)g->nnodes + 1);
	memset(gone, 0, (size_t)g->nnodes + 1);
	FuseIndex ix;
	fuse_index(g, &ix, gone);
	for (int i = 0; i < g->nnodes; i++)
		if (!gone[i] && g->nodes[i]->op == DP_OP_LINEAR)
			fuse_forward(g, &ix, i, writers);
	Lives lv;
	lives_index(g, gone, &lv);
	for (int j = 0; j < g->nnodes; j++) /* the add's position is marked gone */
		if (!gone[j] && (g->nodes[j]->op == DP_OP_LAYERNORM || g->nodes[j]->op == DP_OP_RMSNORM))
			fuse_add_norm(g, &ix, j, writers, &lv);
	fuse_index(g, &ix, gone);
	int *accum_at = ir_alloc(g, (size_t)g->nvalues * sizeof(int) + 1);
	for (int v = 0; v < g->nvalues; v++)
		accum_at[v] = -1;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!gone[i] && n->op == DP_OP_ACCUM && n->out >= 0 && accum_at[n->out] < 0)
			accum_at[n->out] = i;
	}
	for (int i = 0; i < g->nnodes; i++) {
		int op = g->nodes[i]->op;
		int j = !gone[i] && (op == DP_OP_LAYERNORM_GRAD || op == DP_OP_RMSNORM_GRAD)
				? fuse_norm_grad_add(g, &ix, i, writers, accum_at) : -1;
		if (j >= 0)
			gone[j] = 1;
	}
	for (int i = 0; i < g->nnodes; i++) {
		int j = !gone[i] && g->nodes[i]->op == DP_OP_LAYERNORM_GRAD_G
				? fuse_norm_grad_gb(g, &ix, i) : -1;
		if (j >= 0)
			gone[j] = 1;
	}
	for (int i = 0; i < g->nnodes; i++) {
		int j = !gone[i] && g->nodes[i]->op == DP_OP_ATTENTION_CP_GRAD
				? fuse_cp_grad(g, &ix, i, writers) : -1;
		if (j >= 0)
			gone[j] = 1;
	}
	/* the matmuls' old results go last, all at once: ids stay valid */
	int *dead = ir_alloc(g, (size_t)g->nvalues * sizeof(int) + 1), ndead = 0;
	for (int i = 0; i < g->nnodes; i++) {
		int v = !gone[i] && g->nodes[i]->op == DP_OP_MATMUL ? fuse_backward(g, &ix, i, writers) : -1;
		if (v >= 0)
			dead[ndead++] = v;
	}
	for (int i = 0; i < g->nnodes; i++) {
		int j = !gone[i] && g->nodes[i]->op == DP_OP_XENT ? fuse_classifier(g, &ix, i, writers) : -1;
		if (j >= 0)
			gone[j] = 1;
	}
	int k = 0; /* the fused-away nodes leave, the rest keep their order */
	for (int i = 0; i < g->nnodes; i++)
		if (!gone[i])
			g->nodes[k++] = g->nodes[i];
	g->nnodes = k;
	ir_drop_values(g, dead, ndead);
	return 0;
}
