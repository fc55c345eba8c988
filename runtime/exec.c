/*
 * exec.c - the executor: load-time checks, the compute backend's set-up
 * (backend.h), staged batches, and the walk over a program with the
 * two-stream semantics described in exec.h, once for every backend.
 *
 * The walk hands every instruction to the backend, in program order, and
 * knows nothing of how the backend runs its streams: a collective is the
 * backend's collective() (the CPU's starts it on the MPI comm backend and
 * progresses it between instructions; CUDA's enqueues NCCL on a stream),
 * an event its event_record/event_wait, and the checks of what may overlap
 * are the backend's (the CPU's hazard check, cpu/streams.c). What the walk
 * checks itself is backend-independent: a wait for an event that was not
 * recorded earlier in the run is a schedule error. An optimizer step is
 * captured once and replayed where the backend has graphs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "lr_sched.h"

int64_t exec_numel(const DpTensor *t)
{
	return dp_numel(t);
}

static const char *tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

/* The learning rate of optimizer step k (from 0): lr_sched.h's formula, the
 * one the CUDA backend's schedule kernel computes too. */
double exec_lr(const DpStep *s, uint64_t k)
{
	return sched_lr(&s->sched, s->opt.lr, s->cfg.steps, k);
}

uint32_t exec_comm_masks(const DpStep *s)
{
	uint32_t m = 0;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++)
			if (dp_is_collective(s->prog[p][i].op))
				m |= 1u << (DP_AXES(&s->prog[p][i]) & ((1u << DP_MAX_AXES) - 1));
	return m;
}

int exec_check_instr(const DpStep *s, const Comm *comm, int p, uint32_t i, RtErr *e)
{
	const DpInstr *in = &s->prog[p][i];
	const char *op = dp_op_names[in->op];
	if (in->op == DP_OP_LOAD) {
		const DpSource *src = &s->sources[DP_ATTR(in, LOAD, source)];
		int want = p == DP_PROG_STEP ? DP_SPLIT_TRAIN : DP_SPLIT_EVAL;
		int64_t batch = p == DP_PROG_STEP ? s->cfg.micro_batch : s->cfg.eval_batch;
		/* the source's tensor, or (a step holding every micro-batch) a copy of it */
		const DpTensor *st = &s->tensors[src->tensor];
		if (in->out < 0 || (in->out != src->tensor &&
				    (p != DP_PROG_STEP || !dp_step_unrolled(&s->cfg) ||
				     s->tensors[in->out].kind != DP_T_DATA ||
				     s->tensors[in->out].dtype != st->dtype ||
				     exec_numel(&s->tensors[in->out]) != exec_numel(st))))
			return RT_FAIL(e, "step file: %s program instruction %u (load): output is not "
				       "the source's tensor", dp_prog_names[p], i);
		if (src->split != want)
			return RT_FAIL(e, "step file: %s program instruction %u (load) reads a source of "
				       "the other split", dp_prog_names[p], i);
		const DpTensor *t = &s->tensors[in->out];
		int64_t nt = exec_numel(t); /* divide: sample_elems is unbounded in the file */
		if (src->kind == DP_SRC_POSITIONS)
			batch = 1; /* one set of positions, the same for every sample */
		if (batch < 1 || nt % batch || nt / batch != src->sample_elems || dp_is_half(t->dtype))
			return RT_FAIL(e, "step file: data tensor '%s' does not hold %lld samples of %lld "
				       "elements", tname(s, in->out), (long long)batch,
				       (long long)src->sample_elems);
		return 0;
	}
	if (in->op == DP_OP_SEND || in->op == DP_OP_RECV)
		return 0; /* the decoder checked the stages, the axis and the operand */
	if (dp_is_collective(in->op)) {
		int g = comm_group_size(comm, (unsigned)DP_AXES(in));
		/* the decoder checked the dtypes: f32, bf16 or f16, in and out alike */
		int64_t no = exec_numel(&s->tensors[in->out]);
		if (in->op != DP_OP_ALL_REDUCE) {
			int64_t ni = exec_numel(&s->tensors[in->in[0]]);
			/* whole = shard * g, by division: no product can overflow */
			if ((in->op == DP_OP_TP_REDUCE && ni != no) ||
			    (in->op == DP_OP_REDUCE_SCATTER && (ni % g || ni / g != no)) ||
			    (in->op == DP_OP_ALL_GATHER && (no % g || no / g != ni)))
				return RT_FAIL(e, "step file: %s program instruction %u (%s %s -> %s): sizes "
					       "%lld -> %lld do not match a group of %d", dp_prog_names[p], i,
					       op, tname(s, in->in[0]), tname(s, in->out), (long long)ni,
					       (long long)no, g);
		}
		return 0;
	}
	if (in->op == DP_OP_SHARD) {
		/* the decoder checked presence, f32 and the mask */
		int g = comm_group_size(comm, (unsigned)DP_ATTR(in, SHARD, axes));
		int64_t ni = exec_numel(&s->tensors[in->in[0]]), no = exec_numel(&s->tensors[in->out]);
		const DpTensor *ti = &s->tensors[in->in[0]];
		int64_t dim = DP_ATTR(in, SHARD, dim);
		if (ni % g || ni / g != no || dim < 0 || dim >= (ti->ndim ? ti->ndim : 1) ||
		    (ti->ndim && ti->dims[dim] % g))
			return RT_FAIL(e, "step file: %s program instruction %u (shard %s -> %s): sizes "
				       "%lld -> %lld along dim %lld do not match a group of %d",
				       dp_prog_names[p], i, tname(s, in->in[0]), tname(s, in->out),
				       (long long)ni, (long long)no, (long long)dim, g);
		return 0;
	}
	return 0; /* events: ids checked by the decoder; INIT and SAVE: by the decoder */
}

int exec_check_kernel(const DpStep *s, const BackendOps *ops, const DpInstr *in, RtErr *e)
{
	if (!ops->has_kernel(in->op))
		return RT_FAIL(e, "step file: the %s backend has no kernel for %s (the instruction "
			       "writing '%s')%s%s", ops->name, dp_op_names[in->op],
			       tname(s, in->out), ops->fallback ? "; use --device " : "",
			       ops->fallback ? ops->fallback : "");
	return ops->check(s, in, e);
}

/* ---- staged batches ---- */

/* The batches LOAD reads for one source: `slots` of `bytes` each. */
struct Stage {
	size_t bytes;       /* one batch */
	int slots;          /* grad_accum (train), 1 (eval) */
	void *host;         /* slots * bytes, from the backend's host_alloc */
};

/* A stage for every source that a LOAD reads. */
static int stage_init(Exec *x, RtErr *e)
{
	const DpStep *s = x->s;
	x->staged_step = -1;
	x->stage = calloc(s->nsources ? s->nsources : 1, sizeof *x->stage);
	if (!x->stage)
		return RT_FAIL(e, "out of memory (staging)");
	for (int p = DP_PROG_STEP; p <= DP_PROG_EVAL; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->op != DP_OP_LOAD || x->stage[DP_ATTR(in, LOAD, source)])
				continue;
			Stage *g = calloc(1, sizeof *g);
			if (!g)
				return RT_FAIL(e, "out of memory (staging)");
			x->stage[DP_ATTR(in, LOAD, source)] = g;
			g->bytes = (size_t)exec_tensor_bytes(s, in->out);
			g->slots = p == DP_PROG_STEP ? (int)s->cfg.grad_accum : 1;
			size_t all = g->bytes * (size_t)g->slots;
			g->host = x->be.ops->host_alloc(&x->be, all ? all : 1);
			if (!g->host)
				return RT_FAIL(e, "out of memory: %zu bytes of batch staging", all);
		}
	return 0;
}

static void stage_free(Exec *x)
{
	for (uint32_t i = 0; x->stage && i < x->s->nsources; i++)
		if (x->stage[i]) {
			if (x->stage[i]->host)
				x->be.ops->host_free(&x->be, x->stage[i]->host);
			free(x->stage[i]);
		}
	free(x->stage);
	x->stage = NULL;
}

/* The train batches of step k, every micro-batch, into dst (slots * bytes). */
static int fill_train(Exec *x, uint32_t src, uint64_t k, void *dst, RtErr *e)
{
	if (!x->train)
		return RT_FAIL(e, "no training data is loaded for source %u", src);
	const Stage *g = x->stage[src];
	for (int m = 0; m < g->slots; m++)
		data_fill_train(x->train, x->s, (int)src, k, m, x->dp_rank, x->dp_size,
				(char *)dst + (size_t)m * g->bytes);
	return 0;
}

/* Stage step k's batches in the host buffers and push them to the backend
 * (after the previous push has left the buffer), so that on a backend with
 * streams the copy overlaps the steps still running. */
static int stage_step(Exec *x, uint64_t k, RtErr *e)
{
	const DpStep *s = x->s;
	const BackendOps *o = x->be.ops;
	if (x->staged_step == (int64_t)k)
		return 0;
	x->staged_step = -1;
	for (uint32_t src = 0; src < s->nsources; src++) {
		Stage *g = x->stage[src];
		if (!g || s->sources[src].split != DP_SPLIT_TRAIN)
			continue;
		size_t all = g->bytes * (size_t)g->slots;
		RT_CHECK(o->stage_wait(&x->be, g->host, e));
		RT_CHECK(fill_train(x, src, k, g->host, e));
		RT_CHECK(o->stage_push(&x->be, g->host, all, k, e));
	}
	x->staged_step = (int64_t)k;
	return 0;
}

int exec_prefetch(Exec *x, uint64_t k, RtErr *e)
{
	if (x->be.ops->flags & BACKEND_INLINE)
		return 0; /* the steps launched have finished: nothing to overlap */
	return stage_step(x, k, e);
}

/* The eval batch x->eval_batch of every eval source. */
static int stage_eval(Exec *x, RtErr *e)
{
	const DpStep *s = x->s;
	for (uint32_t src = 0; src < s->nsources; src++) {
		Stage *g = x->stage[src];
		if (!g || s->sources[src].split != DP_SPLIT_EVAL)
			continue;
		if (!x->eval)
			return RT_FAIL(e, "no eval data is loaded for source %u", src);
		data_fill_eval(x->eval, s, (int)src, x->eval_batch, x->dp_rank, x->dp_size, g->host);
	}
	return 0;
}

/* ---- set-up ---- */

int exec_init(Exec *x, const DpStep *s, Comm *comm, const BackendOps *ops,
	      const BackendOpts *o, RtErr *e)
{
	memset(x, 0, sizeof *x);
	x->s = s;
	x->comm = comm;
	x->dp_size = (int)(s->cfg.mesh[DP_AXIS_REPLICATE] * s->cfg.mesh[DP_AXIS_SHARD]);
	x->dp_rank = comm->coord[DP_AXIS_REPLICATE] * (int)s->cfg.mesh[DP_AXIS_SHARD] +
		     comm->coord[DP_AXIS_SHARD];
	x->pp_stage = comm->coord[DP_AXIS_PP];
	x->staged_step = -1;
	x->mstep[0] = x->mstep[1] = -1;
	x->no_graph = o->no_graph;
	/* loss scaling: the backend keeps the state (amp.h), from this one */
	x->amp.scale = s->opt.loss_scale != DP_LS_NONE ? s->opt.ls_scale : 1.0f;
	x->amp_push = 1;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (dp_op_class(in->op) == DP_OPC_KERNEL)
				RT_CHECK(exec_check_kernel(s, ops, in, e));
			else
				RT_CHECK(exec_check_instr(s, comm, p, i, e));
		}

	x->be = (Backend){.ops = ops, .s = s, .comm = comm};
	x->event_set = calloc(s->nevents ? s->nevents : 1, 1);
	if (!x->event_set) {
		exec_free(x);
		return RT_FAIL(e, "out of memory (events)");
	}
	if (ops->init(&x->be, o, e)) {
		exec_free(x);
		return -1;
	}
	x->have_be = 1;
	if (stage_init(x, e)) {
		exec_free(x);
		return -1;
	}
	return 0;
}

void exec_free(Exec *x)
{
	stage_free(x);
	if (x->have_be)
		x->be.ops->free(&x->be);
	free(x->bounce);
	free(x->event_set);
	memset(x, 0, sizeof *x);
}

void exec_abort(Exec *x)
{
	if (x->have_be)
		x->be.ops->abort(&x->be);
}

int exec_describe(Exec *x, char *buf, size_t len)
{
	return x->be.ops->describe(&x->be, buf, len);
}

/* ---- host access ---- */

int64_t exec_tensor_bytes(const DpStep *s, int tensor)
{
	const DpTensor *t = &s->tensors[tensor];
	return dp_span(t) * (int64_t)dp_dtype_size(t->dtype); /* padded rows included */
}

static int has_storage(Exec *x, int tensor)
{
	return tensor >= 0 && (uint32_t)tensor < x->s->ntensors && x->be.ptr[tensor];
}

int exec_tensor_read(Exec *x, int tensor, void *host, RtErr *e)
{
	if (!has_storage(x, tensor))
		return RT_FAIL(e, "tensor %d has no storage to read", tensor);
	return x->be.ops->read(&x->be, x->be.ptr[tensor], host,
			       (size_t)exec_tensor_bytes(x->s, tensor), e);
}

int exec_tensor_write(Exec *x, int tensor, const void *host, RtErr *e)
{
	if (!has_storage(x, tensor))
		return RT_FAIL(e, "tensor %d has no storage to write", tensor);
	return x->be.ops->write(&x->be, x->be.ptr[tensor], host,
				(size_t)exec_tensor_bytes(x->s, tensor), e);
}

/* Zero the metrics on the compute stream (in a step: captured with it). */
static int zero_metrics(Exec *x, RtErr *e)
{
	for (uint32_t i = 0; i < x->s->ntensors; i++)
		if (x->s->tensors[i].kind == DP_T_METRIC && x->be.ptr[i])
			RT_CHECK(x->be.ops->zero(&x->be, DP_STREAM_COMPUTE, x->be.ptr[i],
						 x->s->tensors[i].nbytes, e));
	return 0;
}

int exec_zero_metrics(Exec *x, RtErr *e)
{
	RT_CHECK(zero_metrics(x, e));
	return x->be.ops->sync(&x->be, "zeroing the metrics", e);
}

/* The host copy INIT fills and SAVE hands over: one tensor's elements. */
static int bounce(Exec *x, int tensor, RtErr *e)
{
	/* f32 values: a bf16 tensor's are rounded in place before the copy */
	size_t bytes = (size_t)exec_numel(&x->s->tensors[tensor]) * sizeof(float);
	if (bytes <= x->bounce_bytes)
		return 0;
	float *b = realloc(x->bounce, bytes);
	if (!b)
		return RT_FAIL(e, "out of memory: %zu bytes for '%s'", bytes, tname(x->s, tensor));
	x->bounce = b;
	x->bounce_bytes = bytes;
	return 0;
}

/* INIT and SAVE: the hooks see host memory; the executor copies it. */
static int init_save(Exec *x, const DpInstr *in, RtErr *e)
{
	const DpStep *s = x->s;
	if (in->op == DP_OP_INIT) {
		const DpTensor *t = &s->tensors[in->out];
		int name = in->in[0] >= 0 ? in->in[0] : in->out;
		RT_CHECK(bounce(x, in->out, e));
		if (x->init_tensor)
			RT_CHECK(x->init_tensor(x->hook_ctx, name, in->out, x->bounce, e));
		else
			init_fill(t->init, t->init_a, t->init_b, s->cfg.seed,
				  dpstep_str(s, s->tensors[name].name), t->init_base, exec_numel(t),
				  x->bounce);
		if (dp_is_half(t->dtype)) { /* a 16-bit buffer: its f32 initial values rounded */
			uint16_t *h = (uint16_t *)x->bounce;
			for (int64_t k = 0; k < exec_numel(t); k++)
				h[k] = rt_to_half(t->dtype, x->bounce[k]);
		}
		return exec_tensor_write(x, in->out, x->bounce, e);
	}
	int name = in->in[1] >= 0 ? in->in[1] : in->in[0];
	if (!x->save_tensor)
		return RT_FAIL(e, "save of '%s': no checkpoint writer is set", tname(s, name));
	RT_CHECK(bounce(x, in->in[0], e));
	RT_CHECK(exec_tensor_read(x, in->in[0], x->bounce, e));
	return x->save_tensor(x->hook_ctx, name, in->in[0], x->bounce, e);
}

/* SHARD: block k of the group along its dim (0: contiguous). in0 is
 * [outer][g * n]: row o's block k is n elements. */
static int shard(Exec *x, const DpInstr *in, RtErr *e)
{
	const DpStep *s = x->s;
	const DpTensor *ti = &s->tensors[in->in[0]];
	int k = comm_group_rank(x->comm, (unsigned)DP_ATTR(in, SHARD, axes));
	int dim = (int)DP_ATTR(in, SHARD, dim);
	int64_t outer = 1, inner = 1;
	for (int d = 0; d < dim; d++)
		outer *= ti->dims[d];
	for (int d = dim; d < ti->ndim; d++)
		inner *= ti->dims[d];
	int64_t n = exec_numel(&s->tensors[in->out]) / outer;
	const char *src = x->be.ptr[in->in[0]];
	size_t el = dp_dtype_size(ti->dtype);
	return x->be.ops->copy2d(&x->be, in->stream, x->be.ptr[in->out], (size_t)n * el,
				 src + (size_t)k * (size_t)n * el, (size_t)inner * el, (size_t)n * el,
				 (size_t)outer, e);
}

static int load(Exec *x, int p, const DpInstr *in, RtErr *e)
{
	const Stage *g = x->stage[DP_ATTR(in, LOAD, source)];
	int slot = p == DP_PROG_STEP ? x->micro + (int)DP_ATTR(in, LOAD, micro) : 0;
	return x->be.ops->upload(&x->be, in->stream, x->be.ptr[in->out],
				 (const char *)g->host + (size_t)slot * g->bytes, g->bytes, e);
}

/* EVENT_RECORD / EVENT_WAIT: the backend's, after the schedule's own check. */
static int event(Exec *x, int p, uint32_t i, RtErr *e)
{
	const DpInstr *in = &x->s->prog[p][i];
	Backend *b = &x->be;
	int ev = (int)DP_EVENT(in);
	if (in->op == DP_OP_EVENT_RECORD) {
		x->event_set[ev] = 1;
		return b->ops->event_record(b, in->stream, (unsigned)ev, e);
	}
	if (!x->event_set[ev])
		return RT_FAIL(e, "schedule error in the %s program: instruction %u waits for event "
			       "%d, which was not recorded before it", dp_prog_names[p], i, ev);
	return b->ops->event_wait(b, in->stream, (unsigned)ev, e);
}

/* Enqueue program p on the backend's streams, without the final wait. */
static int walk(Exec *x, DpProgram p, int last, int first, RtErr *e)
{
	const DpStep *s = x->s;
	Backend *b = &x->be;
	const BackendOps *o = b->ops;
	memset(x->event_set, 0, s->nevents ? s->nevents : 1);
	RT_CHECK(o->run_begin(b, p, e));
	for (uint32_t i = 0; i < s->nprog[p]; i++) {
		const DpInstr *in = &s->prog[p][i];
		if (((in->flags & DP_IF_LAST) && !last) || ((in->flags & DP_IF_FIRST) && !first) ||
		    (in->stage1 && dp_instr_stage(in) != x->pp_stage))
			continue;
		/* compression: one of the two paths, by the optimizer step */
		if ((in->flags & DP_IF_COMPRESSED && x->step < s->cfg.compress_start) ||
		    (in->flags & DP_IF_PLAIN && x->step >= s->cfg.compress_start))
			continue;
		b->at = (BackendAt){p, i, x->micro};
		if (x->trace)
			RT_CHECK(trace_mark(x->trace, x, p, i, e));
		switch (dp_op_class(in->op)) {
		case DP_OPC_EVENT:
			RT_CHECK(event(x, p, i, e));
			break;
		case DP_OPC_COLLECTIVE:
			RT_CHECK(o->collective(b, in, e));
			break;
		case DP_OPC_LOAD:
			RT_CHECK(load(x, p, in, e));
			break;
		case DP_OPC_HOST:
			RT_CHECK(init_save(x, in, e));
			break;
		case DP_OPC_SHARD:
			RT_CHECK(shard(x, in, e));
			break;
		default:
			RT_CHECK(o->kernel(b, in, e));
			break;
		}
		if (x->trace)
			RT_CHECK(trace_after(x->trace, x, p, i, e));
	}
	RT_CHECK(o->run_end(b, e));
	if (x->trace)
		RT_CHECK(trace_mark(x->trace, x, p, TRACE_END, e));
	return 0;
}

/* Wait for everything issued. */
static int sync_all(Exec *x, const char *what, RtErr *e)
{
	return x->be.ops->sync(&x->be, what, e);
}

int exec_run(Exec *x, DpProgram p, int last, RtErr *e)
{
	char what[64];
	RT_CHECK(exec_step_wait(x, e));
	if (p == DP_PROG_STEP) {
		x->staged_step = -1; /* the loads read the host buffers: fill them now */
		RT_CHECK(stage_step(x, x->step, e));
	}
	if (p == DP_PROG_EVAL)
		RT_CHECK(stage_eval(x, e));
	RT_CHECK(walk(x, p, last, 1, e));
	if (p == DP_PROG_EVAL)
		snprintf(what, sizeof what, "eval batch %lld", (long long)x->eval_batch);
	else
		snprintf(what, sizeof what, "the %s program", dp_prog_names[p]);
	return sync_all(x, what, e);
}

int exec_run_kernel(Exec *x, DpProgram p, uint32_t i, RtErr *e)
{
	Backend *b = &x->be;
	const BackendOps *o = b->ops;
	if ((unsigned)p >= DP_NPROG || i >= x->s->nprog[p] ||
	    dp_op_class(x->s->prog[p][i].op) != DP_OPC_KERNEL)
		return RT_FAIL(e, "instruction %u of the %s program is not a kernel", i,
			       (unsigned)p < DP_NPROG ? dp_prog_names[p] : "?");
	RT_CHECK(exec_step_wait(x, e));
	RT_CHECK(o->run_begin(b, p, e));
	b->at = (BackendAt){p, i, 0};
	RT_CHECK(o->kernel(b, &x->s->prog[p][i], e));
	RT_CHECK(o->run_end(b, e));
	return sync_all(x, "a kernel run alone", e);
}

int exec_time_instrs(Exec *x, DpProgram p, const uint32_t *idx, uint32_t n, uint32_t replays,
		     float *ms, float *gap_ms, RtErr *e)
{
	Backend *b = &x->be;
	const BackendOps *o = b->ops;
	const DpInstr *prog = x->s->prog[p];
	if (!o->time_mark || !o->time_read)
		return RT_FAIL(e, "the %s backend has no device timing", o->name);
	if (replays && (!x->captured || !o->replay))
		return RT_FAIL(e, "internal error: step replays asked for with no captured step");
	for (uint32_t j = 0; j < n; j++)
		if (idx[j] != EXEC_TIME_EMPTY &&
		    (idx[j] >= x->s->nprog[p] || (dp_op_class(prog[idx[j]].op) != DP_OPC_KERNEL &&
						  dp_op_class(prog[idx[j]].op) != DP_OPC_COLLECTIVE)))
			return RT_FAIL(e, "internal error: instruction %u timed is neither a kernel "
				       "nor a collective", idx[j]);
	float *at = malloc(sizeof *at * (2 * (size_t)n + 1));
	if (!at)
		return RT_FAIL(e, "out of memory (device timing)");
	int rc = exec_step_wait(x, e);
	for (uint32_t r = 0; rc == 0 && r < replays; r++) /* the device's head start */
		rc = o->replay(b, e);
	if (rc == 0)
		rc = o->run_begin(b, p, e);
	if (rc == 0)
		rc = o->time_mark(b, DP_STREAM_COMPUTE, 0, e);
	unsigned stream = DP_STREAM_COMPUTE;
	for (uint32_t j = 0; rc == 0 && j < n; j++) {
		const DpInstr *in = idx[j] == EXEC_TIME_EMPTY ? NULL : &prog[idx[j]];
		stream = in ? in->stream : stream; /* an empty span: the previous one's */
		if (in)
			b->at = (BackendAt){p, idx[j], 0};
		rc = o->time_mark(b, stream, 1 + 2 * j, e);
		if (rc == 0 && in)
			rc = dp_op_class(in->op) == DP_OPC_KERNEL ? o->kernel(b, in, e)
								  : o->collective(b, in, e);
		if (rc == 0)
			rc = o->time_mark(b, stream, 2 + 2 * j, e);
	}
	if (rc == 0)
		rc = o->run_end(b, e);
	if (rc == 0)
		rc = o->time_read(b, 2 * n + 1, at, e);
	if (rc == 0)
		rc = sync_all(x, "the instructions timed on the device", e);
	for (uint32_t j = 0; rc == 0 && j < n; j++) {
		ms[j] = at[2 + 2 * j] - at[1 + 2 * j];
		if (gap_ms)
			gap_ms[j] = j ? at[1 + 2 * j] - at[2 * j] : 0;
	}
	free(at);
	return rc;
}

/* ---- optimizer steps ---- */

/* One optimizer step in stream order: what a graph holds. */
static int enqueue_step(Exec *x, RtErr *e)
{
	const DpStep *s = x->s;
	Backend *b = &x->be;
	RT_CHECK(b->ops->step_head(b, e));
	RT_CHECK(zero_metrics(x, e));
	uint32_t walks = dp_step_unrolled(&s->cfg) ? 1 : s->cfg.grad_accum;
	for (uint32_t m = 0; m < walks; m++) {
		x->micro = (int)m;
		RT_CHECK(walk(x, DP_PROG_STEP, m + 1 == walks, m == 0, e));
	}
	return b->ops->step_tail(b, e);
}

static int capture_step(Exec *x, RtErr *e)
{
	Backend *b = &x->be;
	RT_CHECK(b->ops->capture_begin(b, e));
	int rc = enqueue_step(x, e);
	RtErr end_err = {.rank = e->rank};
	int end = b->ops->capture_end(b, rc ? &end_err : e); /* always end the capture */
	RT_CHECK(rc);
	RT_CHECK(end);
	x->captured = 1;
	return 0;
}

/* Wait for the oldest step in flight; its metrics into mval[k & 1]. */
static int wait_oldest(Exec *x, RtErr *e)
{
	uint64_t k = x->inflight[0];
	BackendReport r = {0};
	x->inflight[0] = x->inflight[1];
	x->ninflight--;
	RT_CHECK(x->be.ops->step_wait(&x->be, k, &r, e));
	x->mstep[k & 1] = (int64_t)k;
	x->mval[k & 1][0] = r.loss;
	x->mval[k & 1][1] = r.grad_norm;
	if (x->s->opt.loss_scale != DP_LS_NONE) {
		x->mamp[k & 1] = (ExecAmpStep){r.amp_scale, r.amp_skip, r.amp.skipped};
		x->amp = r.amp; /* steps are waited for in order */
	}
	return 0;
}

int exec_step_launch(Exec *x, uint64_t k, RtErr *e)
{
	Backend *b = &x->be;
	const BackendOps *o = b->ops;
	while (x->ninflight >= 2) /* at most two steps in flight: k-2 is done */
		RT_CHECK(wait_oldest(x, e));
	RT_CHECK(stage_step(x, k, e));
	x->step = k;
	if (x->amp_push) { /* the backend counts from here on */
		b->amp = x->amp;
		b->amp_set = 1;
		x->amp_push = 0;
	}
	RT_CHECK(o->set_step(b, k, exec_lr(x->s, k), e));
	/* compression's two paths (DP_IF_PLAIN, DP_IF_COMPRESSED): a graph
	 * holds one; at start_step the step is captured again */
	int path = x->s->cfg.compress != DP_COMPRESS_NONE && k >= x->s->cfg.compress_start;
	if (o->replay && !x->no_graph && x->warm) {
		if (x->captured && path != x->captured_path) {
			RT_CHECK(exec_step_wait(x, e)); /* no step of the old graph in flight */
			x->captured = 0;
		}
		if (!x->captured) {
			RT_CHECK(capture_step(x, e));
			x->captured_path = path;
		}
		RT_CHECK(o->replay(b, e));
	} else {
		RT_CHECK(enqueue_step(x, e)); /* no graphs, --no-graph, or the eager first step */
		x->warm = 1;
	}
	x->inflight[x->ninflight++] = k;
	return 0;
}

int exec_step_metrics(Exec *x, uint64_t k, double *loss, double *grad_norm, RtErr *e)
{
	for (int i = 0; i < x->ninflight; i++)
		if (x->inflight[i] == k) {
			while (x->ninflight > 0 && x->inflight[0] <= k)
				RT_CHECK(wait_oldest(x, e));
			break;
		}
	if (x->mstep[k & 1] != (int64_t)k)
		return RT_FAIL(e, "internal error: the metrics of step %llu are not kept",
			       (unsigned long long)k + 1);
	*loss = x->mval[k & 1][0];
	*grad_norm = x->s->metrics.grad_norm >= 0 ? x->mval[k & 1][1] : NAN;
	return 0;
}

ExecAmpStep exec_step_amp(const Exec *x, uint64_t k)
{
	if (x->s->opt.loss_scale == DP_LS_NONE)
		return (ExecAmpStep){1.0f, 0, 0};
	return x->mamp[k & 1];
}

void exec_set_amp(Exec *x, ExecAmp a)
{
	x->amp = a;
	x->amp_push = 1;
}

int exec_synchronous(const Exec *x)
{
	return (x->be.ops->flags & BACKEND_INLINE) != 0;
}

int exec_step_wait(Exec *x, RtErr *e)
{
	if (!x->ninflight)
		return 0;
	char what[64];
	snprintf(what, sizeof what, "step %llu",
		 (unsigned long long)x->inflight[x->ninflight - 1] + 1);
	while (x->ninflight > 0)
		RT_CHECK(wait_oldest(x, e));
	return sync_all(x, what, e);
}

int exec_step(Exec *x, uint64_t k, RtErr *e)
{
	RT_CHECK(exec_step_launch(x, k, e));
	return exec_step_wait(x, e);
}
