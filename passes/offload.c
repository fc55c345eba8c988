/*
 * offload.c - host offload of the optimizer (pass "offload"; train's
 * `offload optimizer`, ZeRO-Offload) and of the parameters (`offload
 * params`, FSDP CPUOffload). With `offload none` it changes nothing.
 *
 * Before: the p2p form: the optimizer tail (PH_OPT, DP_IF_LAST) and the INIT
 * and EXPORT programs, every value in device memory.
 *
 * After (offload optimizer):
 * - The optimizer state (an update's operands other than its gradient and
 *   its bf16 compute copy: opt.m, opt.v, opt.momentum) is in host memory
 *   (Value.space; memplan gives the host arena its own offsets).
 * - The f32 master parameters an update writes are in host memory too when
 *   nothing of the STEP or EVAL programs but the updates touches them (bf16:
 *   compute reads the bf16 copy, the gathers read the bf16 shard). Otherwise
 *   (f32: compute, or a gather, reads them) the update writes their host
 *   copy %NAME.host, made once by a D2H at the end of INIT, and an H2D
 *   after the update brings the result back.
 * - The gradient shards the updates read are in host memory when every
 *   write to them before the optimizer is a reduce_scatter's result
 *   (host_gradients): staged by a D2H and summed on the host (full_shard),
 *   or written by a D2H from the collective's device temporary (zero2).
 * - Otherwise the reduced gradients reach the host during the backward: each region
 *   of the gradient buffer an update reads gets its D2H right after the
 *   node that last writes it before the optimizer (a shard's accumulation
 *   after its reduce_scatter, a ddp bucket's all_reduce), in the last
 *   micro-batch (DP_IF_LAST), on the copy stream (the schedule pass fences
 *   it with events like a collective, and makes it wait there for its
 *   collective's event), so the copies overlap the rest of
 *   the backward; the optimizer tail from the clip on works on the host
 *   copy (the clip reads the norm's D2H). Where those regions do not tile
 *   the buffer, the update gets one D2H right before it (below).
 * - A kernel that reads or writes host memory runs on the host: every
 *   device operand it touches is replaced by its host copy (%NAME.host, a
 *   view of the root's copy at the same element offset, same dtype and
 *   kind), read ones filled by a D2H right before it (the gradients after
 *   their reduction and the clip), written ones copied back by an H2D right
 *   after it (the bf16 compute copy the update writes, the INIT program's
 *   cast of a host master to it). So every kernel's operands are in one
 *   space (the step-file decoder checks it), and the updates run the same
 *   kernels on the same f32 values in the same order: the parameters and
 *   losses are bitwise those without offload.
 * - A collective reads device memory only: a host operand (the EXPORT
 *   program's all_gather of a master shard kept on the host) comes through
 *   a device temporary %NAME.dev filled by an H2D right before it.
 * - An offloaded update is one per unit (passes/layout.c), and each
 *   update's copy back to the device (its 16-bit copy, or a mirrored
 *   master) is on the copy stream right after it (to_copy_stream): it waits
 *   for its own unit's update only, and runs beside the next unit's.
 * - Without clipping (no CLIP node: an update reads only its own unit's
 *   gradient) each update that runs on the host is on the copy stream too
 *   (updates_beside_backward), before its copy back in stream order, so
 *   the schedule places it right after its gradient reaches the host,
 *   beside the rest of the backward (step format 23).
 * - The other copies are DP_OP_D2H / DP_OP_H2D on the compute stream with
 *   their node's phase, flags and programs; the schedule pass orders them
 *   like any compute node.
 *
 * After (offload params): all of the above, but the parameters the updates
 * write (the f32 masters, the 16-bit copy) are in host memory whatever
 * reads them (no device mirror, no H2D after the update), and every node
 * of the STEP, EVAL and SAMPLE programs that reads one reads a device
 * temporary filled by an H2D on the copy stream right before it
 * (params_in): the device holds no parameter between two uses.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int is_update(const Node *n)
{
	return n->op == DP_OP_ADAMW || n->op == DP_OP_SGD;
}

/* The update's bf16 compute copy operand, which it writes and never reads,
 * or -1 (ops.def: ADAMW in3, SGD in2). */
static int compute_copy_slot(const Node *n)
{
	if (n->op == DP_OP_ADAMW && n->nin == 4)
		return 3;
	if (n->op == DP_OP_SGD && n->nin == 3)
		return 2;
	return -1;
}

/* Does any node of the STEP or EVAL programs but the updates touch v? */
static int touched_outside_updates(const Graph *g, const Value *v)
{
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!is_update(n) && (n->progs & (IR_IN_STEP | IR_IN_EVAL)) && ir_node_touches(g, n, v))
			return 1;
	}
	return 0;
}

/* Value v's twin %NAME<suffix> of kind `kind`: its dtype, shape, placement
 * and block; made once. */
static int twin(Graph *g, int v, const char *suffix, int kind)
{
	const char *name = ir_fmt(g, "%s%s", g->values[v]->name, suffix);
	Value *t = ir_find_value(g, name);
	if (t)
		return t->id;
	const Value *s = g->values[v];
	t = ir_value(g, name, s->dtype, s->ndim, s->dims, kind, s->loc);
	s = g->values[v];
	memcpy(t->place, s->place, sizeof t->place);
	t->block = s->block;
	return t->id;
}

/* The host copy of device value v: %NAME.host, the root's copy or a view of
 * it at v's element offset; made once. */
static int host_copy(Graph *g, int v)
{
	Value *h = ir_find_value(g, ir_fmt(g, "%s.host", g->values[v]->name));
	if (h)
		return h->id;
	int root = g->values[v]->view_of >= 0 ? host_copy(g, g->values[v]->view_of) : -1;
	if (root >= 0 && g->values[root]->view_of < 0 &&
	    ir_numel(g->values[root]) != ir_numel(g->values[g->values[v]->view_of]))
		die("offload: %%%s lies outside the host window of %%%s", g->values[v]->name,
		    g->values[g->values[v]->view_of]->name);
	int id = twin(g, v, ".host", g->values[v]->kind); /* (may grow g->values) */
	Value *d = g->values[v];
	h = g->values[id];
	h->space = DP_SPACE_HOST;
	if (root < 0 && h->kind == DP_T_ACT) /* the host arena holds persistent values only */
		h->kind = DP_T_FLAT;
	h->view_of = root;
	h->view_offset = root >= 0 ? d->view_offset : 0;
	return h->id;
}

/* A copy node like n (phase, programs, flags, block), placed at pos. */
static Node *copy_node(Graph *g, IrOp op, int out, int in, const Node *like, int pos)
{
	Node *c = ir_node(g, op, out, 1, &in, like->phase, like->loc);
	c->progs = like->progs;
	c->flags = like->flags;
	c->block = like->block;
	c->stage = like->stage;
	ir_move_node(g, c, pos);
	return c;
}

/* An update's copy back to the device (its 16-bit copy, a mirrored
 * master) goes on the copy stream: the schedule pass makes it wait there
 * for the event the compute stream records after its update, and a later
 * reader of the device side (zero1/zero2's all_gather, on the comm stream)
 * for its own copy only. With one update per unit (passes/layout.c's
 * group_ranges) the copy of unit i runs beside the host update of unit
 * i+1. */
static void to_copy_stream(Node *c)
{
	c->stream = DP_STREAM_COPY;
	c->bucket = -1;
}

static int on_host(const Graph *g, int v)
{
	return v >= 0 && ir_root(g, g->values[v])->space == DP_SPACE_HOST;
}

/* Node n (a kernel touching host memory) runs on the host: its device
 * operands become host copies, filled before it and copied back after it.
 * Returns the number of nodes inserted before it. */
static int run_on_host(Graph *g, Node *n)
{
	int at = ir_node_index(g, n), before = 0;
	int cc = is_update(n) ? compute_copy_slot(n) : -1;
	for (int k = 0; k < n->nin; k++) {
		int v = n->in[k];
		if (v < 0 || on_host(g, v))
			continue;
		int h = host_copy(g, v);
		n->in[k] = h;
		if (k != cc) {
			copy_node(g, DP_OP_D2H, h, v, n, at++);
			before++;
		}
		if (ir_writes_in(n, k)) {
			Node *back = copy_node(g, DP_OP_H2D, v, h, n, at + 1);
			if (is_update(n))
				to_copy_stream(back);
		}
	}
	if (n->out >= 0 && !on_host(g, n->out)) {
		int v = n->out, h = host_copy(g, v);
		n->out = h;
		if (ir_reads_out(n)) {
			copy_node(g, DP_OP_D2H, h, v, n, at++);
			before++;
		}
		Node *back = copy_node(g, DP_OP_H2D, v, h, n, at + 1);
		if (g->values[v]->def == n->id) /* its writer is the copy now */
			g->values[v]->def = back->id;
	}
	return before;
}

/* Without clipping an update reads nothing of the step but its own unit's
 * gradient (no global norm: the sqnorm only logs it), so it may run as
 * soon as that gradient is on the host, beside the rest of the backward:
 * each update that runs on the host goes on the copy stream, after the
 * D2H of its gradient there (stream order) or the compute stream's event
 * after the host accumulation that sums it (full_shard), and its copy back
 * (to_copy_stream, right after it) follows it in stream order. The
 * schedule pass places it, like every copy-stream kernel, right after the
 * last node it conflicts with (its gradient's last writer), and the
 * compute stream waits for its done event at its first conflicting node
 * (the sqnorm on the host copy, or the gradients' fill) or at the step's
 * end. On a GPU the host function then runs on CUDA's callback thread
 * while the device goes on with the earlier blocks' backward. With a clip
 * the update reads the clipped gradient, which needs the norm of the
 * whole step's last gradient: it stays on the compute stream after the
 * clip (docs/OFFLOAD.md, "The host step beside the backward"). */
static void updates_beside_backward(Graph *g)
{
	for (int i = 0; i < g->nnodes; i++)
		if (g->nodes[i]->op == DP_OP_CLIP && (g->nodes[i]->progs & IR_IN_STEP))
			return;
	for (int i = 0; i < g->nnodes; i++)
		if (is_update(g->nodes[i]) && on_host(g, g->nodes[i]->out))
			to_copy_stream(g->nodes[i]);
}

/* The element range of v inside its root. */
static void root_range(const Graph *g, const Value *v, int64_t *lo, int64_t *hi)
{
	int64_t off = 0, n = 1;
	for (int k = 0; k < v->ndim; k++)
		n *= v->dims[k];
	for (const Value *u = v; u->view_of >= 0; u = g->values[u->view_of])
		off += u->view_offset;
	*lo = off;
	*hi = off + n;
}

static int by_lo(const void *a, const void *b)
{
	const int64_t *x = a, *y = b;
	return (x[0] > y[0]) - (x[0] < y[0]);
}

/* n writes the gradients after the writers last[0..nlast-1]: those whose
 * region it overwrites are no longer last; n is. Returns the new count. */
static int push_last_writer(const Graph *g, Node **last, int nlast, Node *n)
{
	int keep = 0;
	for (int j = 0; j < nlast; j++)
		if (!ir_overlaps(g, g->values[last[j]->out], g->values[n->out]))
			last[keep++] = last[j];
	last[keep++] = n;
	return keep;
}

/* The D2Hs of the gradients' last writers (nodes writing before the
 * optimizer, last[0..nlast-1]): when their regions tile elements [lo, hi)
 * of the root exactly (every byte the update reads copied once), each
 * gets a D2H of what it wrote into its host copy right after it, on the
 * copy stream, in the last micro-batch only, and 1 is returned; else
 * nothing is inserted and 0 is returned. */
static int d2h_after_writers(Graph *g, Node **last, int nlast, int64_t lo, int64_t hi)
{
	int64_t *r = ir_alloc(g, (size_t)(nlast ? nlast : 1) * 2 * sizeof *r), end = lo;
	for (int j = 0; j < nlast; j++)
		root_range(g, g->values[last[j]->out], &r[2 * j], &r[2 * j + 1]);
	qsort(r, (size_t)nlast, 2 * sizeof *r, by_lo);
	for (int j = 0; j < nlast; j++) {
		if (r[2 * j] != end)
			return 0;
		end = r[2 * j + 1];
	}
	if (nlast == 0 || end != hi)
		return 0;
	for (int j = 0; j < nlast; j++) {
		Node *w = last[j];
		int v = w->out;
		Node *c = copy_node(g, DP_OP_D2H, host_copy(g, v), v, w, ir_node_index(g, w) + 1);
		c->progs = IR_IN_STEP;
		c->flags = w->flags | DP_IF_LAST;
		c->stream = DP_STREAM_COPY;
		c->bucket = -1;
	}
	return 1;
}

/* The gradient root G (device) that updates read: each region of it gets
 * its D2H right after the node that last writes it before the optimizer
 * (a shard's accumulation after its reduce_scatter, ddp's all_reduce), on
 * the copy stream (after its collective's event: the schedule pass) and in
 * the last micro-batch only, so the copies overlap
 * the rest of the backward; the optimizer tail's nodes from the first one
 * that writes G (the clip) on read and write the host copy instead (the
 * sqnorm before it still reads G on the device: the same values). When
 * the last writers' regions do not tile G, or a node writes G through an
 * input, G keeps the one D2H right before its update (run_on_host). */
static void early_gradients(Graph *g, int groot)
{
	const Value *G = g->values[groot];
	int nn = g->nnodes;
	Node **last = ir_alloc(g, (size_t)(nn ? nn : 1) * sizeof *last);
	int nlast = 0;
	for (int i = 0; i < nn; i++) {
		Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || n->phase == PH_OPT)
			continue;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && ir_writes_in(n, k) && ir_overlaps(g, g->values[n->in[k]], G))
				return;
		if (n->out < 0 || !ir_overlaps(g, g->values[n->out], G))
			continue;
		nlast = push_last_writer(g, last, nlast, n);
	}
	int64_t glo, ghi;
	root_range(g, G, &glo, &ghi);
	if (!d2h_after_writers(g, last, nlast, glo, ghi))
		return;
	/* the optimizer tail from G's first writer on works on the host copy */
	int on = 0;
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || n->phase != PH_OPT || n->op == DP_OP_FILL)
			continue;
		int writes = n->out >= 0 && ir_overlaps(g, g->values[n->out], G);
		on |= writes || is_update(n);
		if (!on)
			continue;
		if (writes)
			n->out = host_copy(g, n->out);
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && ir_overlaps(g, g->values[n->in[k]], G))
				n->in[k] = host_copy(g, n->in[k]);
	}
}

/* The last node before index i (in a program node i runs in) that
 * writes memory overlapping value v, or NULL. */
static Node *writer_before(const Graph *g, int i, int v)
{
	for (int j = i - 1; j >= 0; j--) {
		Node *w = g->nodes[j];
		if ((w->progs & g->nodes[i]->progs) && w->out >= 0 &&
		    ir_overlaps(g, g->values[w->out], g->values[v]))
			return w;
	}
	return NULL;
}

/* Does n write a region of the gradient root G as a reduce_scatter's
 * result, from a buffer other than G (zero2's shard, reduced in the last
 * micro-batch straight into its place)? */
static int direct_shard_writer(const Graph *g, const Node *n, const Value *G)
{
	if (n->op != DP_OP_REDUCE_SCATTER || n->out < 0 || !ir_overlaps(g, g->values[n->out], G))
		return 0;
	for (int k = 0; k < n->nin; k++)
		if (n->in[k] >= 0 && ir_overlaps(g, g->values[n->in[k]], G))
			return 0;
	return 1;
}

/* The gradient root G the updates read lives in host memory when every
 * node that writes it before the optimizer is either an accumulation of a
 * collective's device temporary (a shard summing its reduce_scatters over
 * the micro-batches: full_shard) or a reduce_scatter writing its region
 * straight (zero2, reduced once in the last micro-batch). An accumulated
 * temporary gets a D2H into a host staging buffer right after its
 * collective, on the copy stream (fenced by the schedule pass like a
 * collective, waiting there for the collective's event), and the
 * accumulation reads the staging buffer on the host where it stood, so the
 * compute stream waits where it waited for the reduce_scatter before; a
 * straight reduce_scatter writes a device temporary %NAME.rs instead of
 * its region, and a D2H on the copy stream right after it fills the
 * region on the host (the temporary lives until that copy is waited for,
 * memplan). So the device keeps no gradient shard between two steps. The
 * rest of the step that touches G (the sqnorm, the clip, the update, the
 * fill) then runs on the host. Returns 1 when G moved. */
static int host_gradients(Graph *g, int groot)
{
	Value *G = g->values[groot];
	int nwriters = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || n->phase == PH_OPT)
			continue;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && ir_writes_in(n, k) && ir_overlaps(g, g->values[n->in[k]], G))
				return 0;
		if (n->out < 0 || !ir_overlaps(g, g->values[n->out], G))
			continue;
		if (direct_shard_writer(g, n, G)) {
			nwriters++;
			continue;
		}
		if (n->op != DP_OP_ACCUM || n->in[0] < 0 ||
		    ir_root(g, g->values[n->in[0]])->kind != DP_T_ACT)
			return 0;
		const Node *w = writer_before(g, i, n->in[0]);
		if (!w || !dp_is_collective(w->op))
			return 0;
		nwriters++;
	}
	if (nwriters == 0)
		return 0;
	/* a node reading G that writes a device temporary runs on the host, its
	 * result copied back by an H2D: the temporary's only writer must be it
	 * kernel (at tp > 1 the norm's square sums two sqnorms into one) */
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		int reads = 0;
		for (int k = 0; k < n->nin; k++)
			reads |= n->in[k] >= 0 && ir_overlaps(g, g->values[n->in[k]], G);
		if (!reads || !(n->progs & IR_IN_STEP) || n->out < 0 ||
		    ir_root(g, g->values[n->out])->kind != DP_T_ACT)
			continue;
		for (int j = 0; j < g->nnodes; j++)
			if (j != i && g->nodes[j]->out >= 0 && (g->nodes[j]->progs & IR_IN_STEP) &&
			    !dp_is_collective(g->nodes[j]->op) &&
			    ir_overlaps(g, g->values[g->nodes[j]->out], g->values[n->out]))
				return 0;
	}
	G->space = DP_SPACE_HOST;
	for (int j = 0; j < g->nvalues; j++)
		if (g->values[j]->view_of >= 0 && ir_root(g, g->values[j])->id == groot)
			g->values[j]->space = DP_SPACE_HOST;
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || n->phase == PH_OPT || n->out < 0 ||
		    !ir_overlaps(g, g->values[n->out], G))
			continue;
		if (direct_shard_writer(g, n, G)) {
			/* the collective writes a device temporary, the shard's
			 * region comes from it (NCCL writes device memory only) */
			int v = n->out, t = twin(g, v, ".rs", DP_T_ACT);
			g->values[t]->space = DP_SPACE_DEVICE;
			n->out = t;
			g->values[t]->def = n->id;
			Node *c = copy_node(g, DP_OP_D2H, v, t, n, i + 1);
			c->stream = DP_STREAM_COPY;
			c->bucket = -1;
			g->values[v]->def = c->id;
			i = ir_node_index(g, c);
			continue;
		}
		Node *coll = writer_before(g, i, n->in[0]);
		int x = n->in[0], h = host_copy(g, x);
		Node *c = copy_node(g, DP_OP_D2H, h, x, coll, ir_node_index(g, coll) + 1);
		c->stream = DP_STREAM_COPY;
		c->bucket = -1;
		n->in[0] = h;
		i = ir_node_index(g, n);
	}
	return 1;
}

/*
 * offload params: the parameter roots the updates write (the f32 masters
 * and their 16-bit compute copy, isparam[root]) live in host memory only.
 * Every node outside INIT and the host step that reads one (a gather of a
 * shard: full_shard's forward and backward all_gathers, zero1/zero2's
 * gather after the update; compute reading a parameter: ddp) reads a
 * device temporary %NAME.in (.in2, ...) instead, of the read region's
 * dtype and shape, filled by an H2D right before it, on the copy stream,
 * with its flags and programs. The schedule pass issues the copy like a
 * gathering all_gather (`prefetch` block segments before its consumer, its
 * start event recorded there) and makes its reader wait for its done
 * event, so the device holds a parameter only between its copy and its
 * last reader, and the copy overlaps the compute before. A node reading
 * the same value twice reads one temporary. Kernels of the host step (the
 * optimizer tail, INIT) read the host parameters where they are; the
 * EXPORT program's gathers get their device temporary from the last loop
 * of offload_run, as with offload optimizer.
 */
static void params_in(Graph *g, const char *isparam, int nv)
{
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		int coll = dp_is_collective(n->op);
		if (is_update(n) || n->op == DP_OP_D2H || n->op == DP_OP_H2D ||
		    !(n->progs & (IR_IN_STEP | IR_IN_EVAL | IR_IN_SAMPLE)) || (n->progs & IR_IN_INIT) ||
		    (!coll && (dp_op_class(n->op) != DP_OPC_KERNEL || n->phase == PH_OPT)))
			continue;
		int tmp[DP_MAX_IN];
		for (int k = 0; k < n->nin; k++) {
			tmp[k] = -1;
			int v = n->in[k];
			if (v < 0)
				continue;
			int r = ir_root(g, g->values[v])->id;
			if (r >= nv || !isparam[r])
				continue;
			if (ir_writes_in(n, k))
				die("offload: %s writes the host parameter %%%s", dp_op_names[n->op],
				    g->values[v]->name);
			for (int q = 0; q < k; q++)
				if (n->in[q] == v && tmp[q] >= 0)
					tmp[k] = tmp[q];
			if (tmp[k] < 0) {
				const char *sfx = ".in";
				for (int c = 2; ir_find_value(g, ir_fmt(g, "%s%s", g->values[v]->name, sfx));
				     c++)
					sfx = ir_fmt(g, ".in%d", c);
				tmp[k] = twin(g, v, sfx, DP_T_ACT);
				Node *c = copy_node(g, DP_OP_H2D, tmp[k], v, n, ir_node_index(g, n));
				c->stream = DP_STREAM_COPY;
				c->bucket = -1;
				i++;
			}
		}
		for (int k = 0; k < n->nin; k++)
			if (tmp[k] >= 0)
				n->in[k] = tmp[k];
	}
}

/* The offload of update n: the blocks' it updates (Node.offload, set by the
 * layout pass), else train's. */
static int update_offload(const Graph *g, const Node *n)
{
	return n->offload >= 0 ? n->offload : g->offload;
}

/* The views of R (direct) that lie in the ranges rg (sorted, disjoint);
 * 1 when every view lies inside one range or outside all of them, else 0
 * (a view straddles a range's edge). */
static int views_fit(const Graph *g, int R, const int64_t *rg, int nr)
{
	for (int v = 0; v < g->nvalues; v++) {
		const Value *x = g->values[v];
		if (x->view_of != R)
			continue;
		int64_t lo = x->view_offset, hi = lo + ir_numel(x);
		for (int j = 0; j < nr; j++)
			if (lo < rg[2 * j + 1] && hi > rg[2 * j] && (lo < rg[2 * j] || hi > rg[2 * j + 1]))
				return 0;
	}
	return 1;
}

/* Where element lo of R lands when the ranges rg are packed in order, or
 * -1 when it lies in none of them. */
static int64_t packed_offset(const int64_t *rg, int nr, int64_t lo)
{
	int64_t below = 0;
	for (int j = 0; j < nr; j++) {
		if (lo >= rg[2 * j] && lo < rg[2 * j + 1])
			return below + lo - rg[2 * j];
		below += rg[2 * j + 1] - rg[2 * j];
	}
	return -1;
}

/*
 * Per-block offload: root R (an update's operand) holds the runs of
 * updates that offload it and of updates that do not. The offloaded runs,
 * element ranges rg[2i], rg[2i+1] of R (sorted, disjoint), move to a root
 * of their own, %R<suffix> (R's kind, dtype and placement), packed in their
 * order; R keeps the rest, packed. Every view of R must lie inside one
 * range or outside all of them, and no node may read or write R itself;
 * otherwise R stays whole (on the device: the updates that offload it
 * then read and write its runs through host copies, run_on_host, which is
 * correct and saves no device memory). Returns the new root, or -1.
 */
static int split_root(Graph *g, int R, const int64_t *rg, int nr, const char *suffix)
{
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (n->out == R)
			return -1;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] == R)
				return -1;
	}
	if (!views_fit(g, R, rg, nr))
		return -1;
	int64_t moved = 0;
	for (int j = 0; j < nr; j++)
		moved += rg[2 * j + 1] - rg[2 * j];
	const Value *r = g->values[R];
	int64_t len = ir_numel(r);
	Value *o = ir_value(g, ir_fmt(g, "%s%s", r->name, suffix), r->dtype, 1, (int64_t[]){moved},
			    r->kind, r->loc);
	r = g->values[R];
	memcpy(o->place, r->place, sizeof o->place);
	o->block = r->block;
	o->space = r->space;
	for (int v = 0; v < g->nvalues; v++) {
		Value *x = g->values[v];
		if (x->view_of != R)
			continue;
		int64_t at = packed_offset(rg, nr, x->view_offset), below = 0;
		if (at >= 0) {
			x->view_of = o->id;
			x->view_offset = at;
			continue;
		}
		for (int j = 0; j < nr; j++)
			if (rg[2 * j + 1] <= x->view_offset)
				below += rg[2 * j + 1] - rg[2 * j];
		x->view_offset -= below;
	}
	Value *w = g->values[R];
	w->ndim = 1;
	w->dims[0] = len - moved;
	return o->id;
}

/* Per-block offload: device root R (the gradients, offload optimizer's
 * 16-bit copy) whose runs rg the offloaded updates read or write on the
 * host gets a host copy %R.host of those runs only, packed (a window), and
 * each view of R inside them its host copy there, so host_copy finds them
 * and the host arena holds what the host step touches, not all of R.
 * Where a view straddles a run's edge R keeps its whole host copy. */
static void host_window(Graph *g, int R, const int64_t *rg, int nr)
{
	if (!views_fit(g, R, rg, nr) || ir_find_value(g, ir_fmt(g, "%s.host", g->values[R]->name)))
		return;
	int64_t moved = 0;
	for (int j = 0; j < nr; j++)
		moved += rg[2 * j + 1] - rg[2 * j];
	Value *h = g->values[host_copy(g, R)];
	h->ndim = 1;
	h->dims[0] = moved;
	int nv = g->nvalues;
	for (int v = 0; v < nv; v++) {
		const Value *x = g->values[v];
		int64_t at = x->view_of == R ? packed_offset(rg, nr, x->view_offset) : -1;
		if (at < 0)
			continue;
		int c = twin(g, v, ".host", x->kind);
		Value *t = g->values[c];
		t->space = DP_SPACE_HOST;
		t->view_of = h->id;
		t->view_offset = at;
	}
}

/* Per-block offload (updates of more than one offload): each root an
 * update's state, masters or (offload params) 16-bit copy lies in is split
 * where the updates that offload it and those that do not meet
 * (split_root): first the runs of `offload params` updates (%R.offp: the
 * masters and the 16-bit copy in host memory only), then, of what is left,
 * those of `offload optimizer` updates (%R.off: the state, and the masters
 * in host memory or mirrored there), so each root the rest of the pass
 * places holds the runs of one offload, and what no block offloads stays on
 * the device. The gradients are not split (a ddp bucket's all_reduce may
 * span both kinds): an offloaded update reads its run through a D2H right
 * before it (run_on_host). */
static void split_mixed(Graph *g)
{
	int nn = g->nnodes;
	int64_t *rg = ir_alloc(g, (size_t)(nn ? nn : 1) * 2 * sizeof *rg);
	for (int level = 2; level >= 1; level--)
		for (int slot = -1; slot < DP_MAX_IN; slot++) {
			/* slot -1: the updated masters (out); else input slot k */
			int R = -1, nr = 0, mixed = 0;
			for (int i = 0; i < g->nnodes; i++) {
				const Node *n = g->nodes[i];
				int cc = is_update(n) ? compute_copy_slot(n) : -1;
				int mode = is_update(n) ? update_offload(g, n) : 0;
				if (!is_update(n) || slot == 0 || slot >= n->nin ||
				    (slot >= 0 && n->in[slot] < 0) || mode > level)
					continue;
				if (slot >= 0 && slot == cc && level == 1)
					continue; /* offload optimizer keeps the 16-bit copy */
				int v = slot < 0 ? n->out : n->in[slot];
				int root = ir_root(g, g->values[v])->id;
				if (R >= 0 && root != R)
					die("offload: the updates' operand %d views %%%s and %%%s", slot,
					    g->values[R]->name, g->values[root]->name);
				R = root;
				mixed |= mode < level;
				if (mode == level) {
					root_range(g, g->values[v], &rg[2 * nr], &rg[2 * nr + 1]);
					nr++;
				}
			}
			if (R < 0 || nr == 0 || !mixed)
				continue;
			qsort(rg, (size_t)nr, 2 * sizeof *rg, by_lo);
			split_root(g, R, rg, nr, level == 2 ? ".offp" : ".off");
		}
}

/* Per-block offload, once the pass has placed the roots: the device roots
 * that updates running on the host (an operand in host memory) read or
 * write through host copies (the gradients; offload optimizer's 16-bit
 * copy) get host windows of those updates' runs (host_window). An update
 * of a block without offload runs there too where split_mixed could not
 * split a root it shares with an offloaded one (ddp's masters, which INIT
 * casts whole). */
static void window_mixed(Graph *g)
{
	int nn = g->nnodes;
	int64_t *rg = ir_alloc(g, (size_t)(nn ? nn : 1) * 2 * sizeof *rg);
	for (int slot = 0; slot < DP_MAX_IN; slot++) {
		int R = -1, nr = 0;
		for (int i = 0; i < g->nnodes; i++) {
			const Node *n = g->nodes[i];
			if (!is_update(n) || slot >= n->nin || n->in[slot] < 0)
				continue;
			int host = on_host(g, n->out), cc = compute_copy_slot(n);
			for (int k = 0; k < n->nin; k++)
				host |= k != cc && on_host(g, n->in[k]);
			if (!host || (slot != 0 && slot != cc) || on_host(g, n->in[slot]))
				continue;
			int v = n->in[slot], root = ir_root(g, g->values[v])->id;
			if (R >= 0 && root != R)
				return; /* (split_mixed's die covers it) */
			R = root;
			root_range(g, g->values[v], &rg[2 * nr], &rg[2 * nr + 1]);
			nr++;
		}
		if (R < 0 || nr == 0)
			continue;
		qsort(rg, (size_t)nr, 2 * sizeof *rg, by_lo);
		host_window(g, R, rg, nr);
	}
}

/*
 * Per-block offload: the gradient run an offloaded update reads (a device
 * view of the gradients, which split_mixed leaves whole) reaches the host
 * while the backward runs, as early_gradients does for train-wide offload:
 * each node that last writes part of it before the optimizer (a shard's
 * accumulation after its reduce_scatter, a bucket's all_reduce) gets a D2H
 * of what it wrote right after it, on the copy stream, in the last
 * micro-batch, into the run's host window (host_window); the update reads
 * the window. The device clip scales the device's gradients after those
 * copies read them (the schedule pass orders the clip after the copies it
 * conflicts with), so the run gets its own clip on the host, the same
 * kernel on the same values: a copy of the step's clip on the window,
 * before the update (run_on_host brings the norm). Where the last writers
 * do not lie inside the run and tile it, or have no host copy in the
 * window, the update keeps its D2H right before it (run_on_host).
 */
static void mixed_early_gradients(Graph *g, Node *upd)
{
	int gv = upd->in[0];
	Value *host = ir_find_value(g, ir_fmt(g, "%s.host", g->values[gv]->name));
	if (!host || host->space != DP_SPACE_HOST)
		return;
	int64_t glo, ghi;
	root_range(g, g->values[gv], &glo, &ghi);
	int nn = g->nnodes, nlast = 0;
	Node **last = ir_alloc(g, (size_t)(nn ? nn : 1) * sizeof *last);
	Node *clip = NULL;
	for (int i = 0; i < nn; i++) {
		Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP))
			continue;
		for (int k = 0; k < n->nin; k++)
			if (n->in[k] >= 0 && ir_writes_in(n, k) &&
			    ir_overlaps(g, g->values[n->in[k]], g->values[gv]))
				return;
		if (n->out < 0 || !ir_overlaps(g, g->values[n->out], g->values[gv]))
			continue;
		if (n->phase == PH_OPT) {
			if (n->op == DP_OP_CLIP && !clip && ir_node_index(g, n) < ir_node_index(g, upd))
				clip = n;
			else if (n->op != DP_OP_FILL)
				return; /* another writer in the tail: keep the late D2H */
			continue;
		}
		nlast = push_last_writer(g, last, nlast, n);
	}
	/* each writer's host copy must be in the run's window (host_window) */
	for (int j = 0; j < nlast; j++) {
		Value *h = ir_find_value(g, ir_fmt(g, "%s.host", g->values[last[j]->out]->name));
		if (!h || ir_root(g, h) != ir_root(g, host))
			return;
	}
	if (!d2h_after_writers(g, last, nlast, glo, ghi))
		return;
	upd->in[0] = host->id;
	if (!clip)
		return;
	/* the clip's copy over the host run: on the compute stream, in no bucket,
	 * in the update's block */
	Node *hc = ir_node_like(g, clip, host->id, clip->in, clip->stage);
	hc->stream = DP_STREAM_COMPUTE;
	hc->bucket = -1;
	hc->block = upd->block;
	ir_move_node(g, hc, ir_node_index(g, upd));
}

int offload_run(Graph *g, Diag *d)
{
	(void)d;
	if (!ir_any_offload(g))
		return 0;
	/* per-block offload: the updates disagree */
	int mixed = 0, any = 0, first = -1;
	for (int i = 0; i < g->nnodes; i++)
		if (is_update(g->nodes[i])) {
			int m = update_offload(g, g->nodes[i]);
			mixed |= first >= 0 && m != first;
			first = first < 0 ? m : first;
			any |= m != 0;
		}
	if (!any)
		return 0;
	if (mixed)
		split_mixed(g);
	int nnodes = g->nnodes, nv = g->nvalues;
	/* what lives in host memory: the updates' state, and masters nothing
	 * else of the step touches; the other masters get a host copy */
	int *mirror = ir_alloc(g, (size_t)(nv ? nv : 1) * sizeof(int));
	char *isparam = ir_alloc(g, (size_t)(nv ? nv : 1));
	memset(isparam, 0, (size_t)(nv ? nv : 1));
	for (int i = 0; i < nnodes; i++) {
		Node *n = g->nodes[i];
		if (!is_update(n) || update_offload(g, n) == 0)
			continue;
		int cc = compute_copy_slot(n), params = update_offload(g, n) == 2;
		for (int k = 1; k < n->nin; k++)
			if (n->in[k] >= 0 && k != cc)
				((Value *)ir_root(g, g->values[n->in[k]]))->space = DP_SPACE_HOST;
		Value *p = (Value *)ir_root(g, g->values[n->out]);
		if (params) { /* the masters and their 16-bit copy: host only */
			p->space = DP_SPACE_HOST;
			isparam[p->id] = 1;
			if (cc >= 0 && n->in[cc] >= 0) {
				Value *c = (Value *)ir_root(g, g->values[n->in[cc]]);
				c->space = DP_SPACE_HOST;
				isparam[c->id] = 1;
			}
		} else if (touched_outside_updates(g, p)) {
			/* 2 + the one pipeline stage whose update writes it (a stage's
			 * part, passes/stage_params.c), else 1 */
			int m = n->stage >= 0 ? 2 + n->stage : 1;
			mirror[p->id] = !mirror[p->id] || mirror[p->id] == m ? m : 1;
		} else {
			p->space = DP_SPACE_HOST;
		}
	}
	for (int i = 0; i < g->nvalues; i++)
		if (g->values[i]->view_of < 0 && g->values[i]->space == DP_SPACE_HOST)
			for (int j = 0; j < g->nvalues; j++)
				if (g->values[j]->view_of >= 0 && ir_root(g, g->values[j])->id == i)
					g->values[j]->space = DP_SPACE_HOST;
	/* a mirrored master: INIT fills its host copy once (a D2H after the
	 * last INIT node), every update writes it and an H2D brings the result
	 * back, so it needs no D2H per step */
	for (int v = 0; v < nv; v++) {
		if (!mirror[v])
			continue;
		int init_end = -1;
		for (int i = 0; i < g->nnodes; i++)
			if (g->nodes[i]->progs & IR_IN_INIT)
				init_end = i;
		if (init_end < 0)
			die("offload: no INIT program to fill %%%s.host", g->values[v]->name);
		Node *c = copy_node(g, DP_OP_D2H, host_copy(g, v), v, g->nodes[init_end], init_end + 1);
		c->progs = IR_IN_INIT;
		c->flags = 0;
		c->block = -1;
		c->stage = mirror[v] >= 2 ? mirror[v] - 2 : -1; /* a stage's part on its ranks */
	}
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (!is_update(n) || update_offload(g, n) == 0 ||
		    ir_root(g, g->values[n->out])->id >= nv || !mirror[ir_root(g, g->values[n->out])->id])
			continue;
		int v = n->out, h = host_copy(g, v);
		n->out = h;
		to_copy_stream(copy_node(g, DP_OP_H2D, v, h, n, i + 1));
	}
	if (mixed) {
		window_mixed(g);
		for (int i = 0; i < g->nnodes; i++)
			if (is_update(g->nodes[i]) && !on_host(g, g->nodes[i]->in[0]) &&
			    update_offload(g, g->nodes[i]))
				mixed_early_gradients(g, g->nodes[i]);
	}
	/* the gradients the updates read live on the host, or reach it while
	 * the backward runs */
	for (int i = 0; i < g->nnodes && !mixed; i++) {
		Node *n = g->nodes[i];
		if (is_update(n) && !on_host(g, n->in[0]) &&
		    !host_gradients(g, ir_root(g, g->values[n->in[0]])->id))
			early_gradients(g, ir_root(g, g->values[n->in[0]])->id);
	}
	/* offload params: compute and the gathers read the parameters through
	 * device temporaries */
	for (int v = 0; v < nv; v++)
		if (isparam[v]) {
			params_in(g, isparam, nv);
			break;
		}
	/* every kernel touching host memory runs there */
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (dp_op_class(n->op) != DP_OPC_KERNEL || n->op == DP_OP_D2H || n->op == DP_OP_H2D)
			continue;
		int host = on_host(g, n->out);
		for (int k = 0; k < n->nin; k++)
			host |= on_host(g, n->in[k]);
		if (host)
			i += run_on_host(g, n);
	}
	updates_beside_backward(g);
	/* a collective moves device memory (NCCL reads no unmapped host
	 * memory): a host operand (the EXPORT program's gather of a master
	 * shard the host keeps) comes through a device temporary, filled by an
	 * H2D right before it */
	for (int i = 0; i < g->nnodes; i++) {
		Node *n = g->nodes[i];
		if (!dp_is_collective(n->op))
			continue;
		if (on_host(g, n->out))
			die("offload: %s writes %%%s in host memory", dp_op_names[n->op],
			    g->values[n->out]->name);
		for (int k = 0; k < n->nin; k++)
			if (on_host(g, n->in[k])) {
				int t = twin(g, n->in[k], ".dev", DP_T_ACT);
				copy_node(g, DP_OP_H2D, t, n->in[k], n, i++);
				n->in[k] = t;
			}
	}
	return 0;
}
