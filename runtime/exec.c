/*
 * exec.c - the CPU executor: arena set-up (llm.c's malloc_and_point: one
 * allocation, every tensor a pointer at its planned offset) and the walk over
 * a program with the two-stream semantics described in exec.h.
 *
 * Between instructions the executor lets the comm backend progress its
 * pending collectives (Open MPI advances non-blocking collectives only inside
 * MPI calls), so communication started on the comm stream really overlaps
 * the compute that follows it; the comm backend counts the time the compute
 * stream spends blocked in waits, which is the communication left exposed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "exec.h"

struct InFlight {
	int64_t ticket;          /* comm ticket of the collective */
	uint64_t rlo, rhi;       /* bytes it reads */
	uint64_t wlo, whi;       /* bytes it writes */
	uint32_t instr;          /* its index in the program, for messages */
};

int64_t exec_numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}

static const char *tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

double exec_lr(const DpStep *s, uint64_t k)
{
	double lr = s->opt.lr;
	if (s->sched.kind != DP_SCHED_COSINE)
		return lr;
	double warm = s->sched.warmup, total = s->sched.steps ? s->sched.steps : s->cfg.steps;
	double min_lr = s->sched.min_lr;
	if ((double)k < warm)
		return lr * ((double)k + 1) / warm;
	double q = total > warm ? ((double)k - warm) / (total - warm) : 1.0;
	if (q > 1)
		q = 1;
	return min_lr + 0.5 * (lr - min_lr) * (1 + cos(M_PI * q));
}

uint32_t exec_comm_masks(const DpStep *s)
{
	uint32_t m = 0;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++)
			if (dp_is_collective(s->prog[p][i].op))
				m |= 1u << (s->prog[p][i].ia[0] & 15);
	return m;
}

int exec_check_instr(const DpStep *s, const Comm *comm, int p, uint32_t i, RtErr *e)
{
	const DpInstr *in = &s->prog[p][i];
	const char *op = dp_kernel_names[in->op];
	if (in->op == DPK_LOAD) {
		const DpSource *src = &s->sources[in->ia[0]];
		int want = p == DP_PROG_STEP ? DP_SPLIT_TRAIN : DP_SPLIT_EVAL;
		int64_t batch = p == DP_PROG_STEP ? s->cfg.micro_batch : s->cfg.eval_batch;
		if (in->out < 0 || in->out != src->tensor)
			return RT_FAIL(e, "step file: %s program instruction %u (load): output is not "
				       "the source's tensor", dp_prog_names[p], i);
		if (src->split != want)
			return RT_FAIL(e, "step file: %s program instruction %u (load) reads a source of "
				       "the other split", dp_prog_names[p], i);
		const DpTensor *t = &s->tensors[in->out];
		int64_t nt = exec_numel(t); /* divide: sample_elems is unbounded in the file */
		if (batch < 1 || nt % batch || nt / batch != src->sample_elems || t->dtype == DP_BF16)
			return RT_FAIL(e, "step file: data tensor '%s' does not hold %lld samples of %lld "
				       "elements", tname(s, in->out), (long long)batch,
				       (long long)src->sample_elems);
		return 0;
	}
	if (dp_is_collective(in->op)) {
		int g = comm_group_size(comm, (unsigned)in->ia[0]);
		if (in->out < 0 || s->tensors[in->out].dtype != DP_F32)
			return RT_FAIL(e, "step file: %s program instruction %u (%s) needs an f32 output",
				       dp_prog_names[p], i, op);
		int64_t no = exec_numel(&s->tensors[in->out]);
		if (in->op != DPK_ALL_REDUCE) {
			if (in->in[0] < 0 || s->tensors[in->in[0]].dtype != DP_F32)
				return RT_FAIL(e, "step file: %s program instruction %u (%s) needs an f32 "
					       "input", dp_prog_names[p], i, op);
			int64_t ni = exec_numel(&s->tensors[in->in[0]]);
			/* whole = shard * g, by division: no product can overflow */
			if ((in->op == DPK_TP_REDUCE && ni != no) ||
			    (in->op == DPK_REDUCE_SCATTER && (ni % g || ni / g != no)) ||
			    (in->op == DPK_ALL_GATHER && (no % g || no / g != ni)))
				return RT_FAIL(e, "step file: %s program instruction %u (%s %s -> %s): sizes "
					       "%lld -> %lld do not match a group of %d", dp_prog_names[p], i,
					       op, tname(s, in->in[0]), tname(s, in->out), (long long)ni,
					       (long long)no, g);
		}
		return 0;
	}
	if (in->op == DPK_SHARD) {
		/* the decoder checked presence, f32 and the mask */
		int g = comm_group_size(comm, (unsigned)in->ia[0]);
		int64_t ni = exec_numel(&s->tensors[in->in[0]]), no = exec_numel(&s->tensors[in->out]);
		const DpTensor *ti = &s->tensors[in->in[0]];
		if (ni % g || ni / g != no || in->ia[1] < 0 || in->ia[1] >= (ti->ndim ? ti->ndim : 1) ||
		    (ti->ndim && ti->dims[in->ia[1]] % g))
			return RT_FAIL(e, "step file: %s program instruction %u (shard %s -> %s): sizes "
				       "%lld -> %lld along dim %lld do not match a group of %d",
				       dp_prog_names[p], i, tname(s, in->in[0]), tname(s, in->out),
				       (long long)ni, (long long)no, (long long)in->ia[1], g);
		return 0;
	}
	return 0; /* events: ids checked by the decoder; INIT and SAVE: by the decoder */
}

int exec_init(Exec *x, const DpStep *s, Comm *comm, RtErr *e)
{
	memset(x, 0, sizeof *x);
	x->s = s;
	x->comm = comm;
	x->dp_size = (int)(s->cfg.mesh[DP_AXIS_REPLICATE] * s->cfg.mesh[DP_AXIS_SHARD]);
	x->dp_rank = comm->coord[DP_AXIS_REPLICATE] * (int)s->cfg.mesh[DP_AXIS_SHARD] +
		     comm->coord[DP_AXIS_SHARD];
	x->cpu.opt = &s->opt;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (cpu_is_compute(in->op))
				RT_CHECK(cpu_check(s, in, e));
			else
				RT_CHECK(exec_check_instr(s, comm, p, i, e));
		}

	/* mmap: page-aligned (so 64-byte aligned), zero-filled, and committed only
	 * as tensors touch it, so a bogus arena size fails here or costs nothing */
	size_t bytes = (size_t)((s->cfg.arena_bytes + 63) / 64 * 64);
	if (bytes == 0)
		bytes = 64;
	x->arena_len = bytes;
	x->arena = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (x->arena == MAP_FAILED)
		x->arena = NULL;
	x->ptr = calloc(s->ntensors ? s->ntensors : 1, sizeof *x->ptr);
	x->event_ticket = calloc(s->nevents ? s->nevents : 1, sizeof *x->event_ticket);
	x->event_set = calloc(s->nevents ? s->nevents : 1, 1);
	if (!x->arena || !x->ptr || !x->event_ticket || !x->event_set) {
		exec_free(x);
		return RT_FAIL(e, "out of memory: cannot allocate the %.2f MiB arena",
			       (double)bytes / (1 << 20));
	}
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (s->tensors[i].nbytes)
			x->ptr[i] = x->arena + s->tensors[i].offset;
	return 0;
}

void exec_free(Exec *x)
{
	if (x->arena)
		munmap(x->arena, x->arena_len);
	free(x->ptr);
	free(x->event_ticket);
	free(x->event_set);
	free(x->fl);
	memset(x, 0, sizeof *x);
}

float *exec_f32(const Exec *x, int tensor)
{
	if (tensor < 0 || (uint32_t)tensor >= x->s->ntensors)
		return NULL;
	return x->ptr[tensor];
}

int64_t exec_tensor_bytes(const DpStep *s, int tensor)
{
	const DpTensor *t = &s->tensors[tensor];
	return exec_numel(t) * (int64_t)dp_dtype_size(t->dtype);
}

int exec_tensor_read(Exec *x, int tensor, void *host, RtErr *e)
{
	if (tensor < 0 || (uint32_t)tensor >= x->s->ntensors || !x->ptr[tensor])
		return RT_FAIL(e, "tensor %d has no storage to read", tensor);
	memcpy(host, x->ptr[tensor], (size_t)exec_tensor_bytes(x->s, tensor));
	return 0;
}

int exec_tensor_write(Exec *x, int tensor, const void *host, RtErr *e)
{
	if (tensor < 0 || (uint32_t)tensor >= x->s->ntensors || !x->ptr[tensor])
		return RT_FAIL(e, "tensor %d has no storage to write", tensor);
	memcpy(x->ptr[tensor], host, (size_t)exec_tensor_bytes(x->s, tensor));
	return 0;
}

void exec_zero_metrics(Exec *x)
{
	for (uint32_t i = 0; i < x->s->ntensors; i++)
		if (x->s->tensors[i].kind == DP_T_METRIC && x->ptr[i])
			memset(x->ptr[i], 0, x->s->tensors[i].nbytes);
}

/* ---- memory hazards between the streams ---- */

static void range_of(const DpStep *s, int id, uint64_t *lo, uint64_t *hi)
{
	if (id < 0) {
		*lo = *hi = 0;
		return;
	}
	*lo = s->tensors[id].offset;
	*hi = *lo + s->tensors[id].nbytes;
}

static int overlap(uint64_t alo, uint64_t ahi, uint64_t blo, uint64_t bhi)
{
	return alo < bhi && blo < ahi;
}

/* Does instruction `in` (run on the compute stream) touch memory of a
 * collective that no event has made visible? Reads conflict with writes;
 * writes conflict with reads and writes. */
static int check_hazard(Exec *x, int p, uint32_t idx, RtErr *e)
{
	const DpInstr *in = &x->s->prog[p][idx];
	for (int f = 0; f < x->nfl; f++) {
		InFlight *fl = &x->fl[f];
		for (int k = -1; k < DP_MAX_IN; k++) {
			int id = k < 0 ? in->out : in->in[k];
			if (id < 0)
				continue;
			uint64_t lo, hi;
			range_of(x->s, id, &lo, &hi);
			int hit = overlap(lo, hi, fl->wlo, fl->whi) ||
				  (k < 0 && overlap(lo, hi, fl->rlo, fl->rhi));
			if (hit) {
				const DpInstr *c = &x->s->prog[p][fl->instr];
				return RT_FAIL(e,
					       "schedule error in the %s program: instruction %u (%s) "
					       "touches '%s' while instruction %u (%s of '%s') is in "
					       "flight with no event_wait before it",
					       dp_prog_names[p], idx, dp_kernel_names[in->op],
					       tname(x->s, id), fl->instr, dp_kernel_names[c->op],
					       tname(x->s, c->out));
			}
		}
	}
	return 0;
}

/* The compute stream has waited for every ticket < upto: forget those. */
static void retire(Exec *x, int64_t upto)
{
	int k = 0;
	for (int f = 0; f < x->nfl; f++)
		if (x->fl[f].ticket >= upto)
			x->fl[k++] = x->fl[f];
	x->nfl = k;
}

static int start_collective(Exec *x, int p, uint32_t idx, RtErr *e)
{
	const DpInstr *in = &x->s->prog[p][idx];
	Comm *c = x->comm;
	unsigned axes = (unsigned)in->ia[0];
	InFlight fl = {.instr = idx};
	range_of(x->s, in->in[0] >= 0 ? in->in[0] : in->out, &fl.rlo, &fl.rhi);
	range_of(x->s, in->out, &fl.wlo, &fl.whi);
	/* Stream order: a collective may not start while an earlier one on
	 * overlapping memory is still running (two outstanding MPI requests on
	 * the same buffer would race). */
	for (int f = 0; f < x->nfl; f++)
		if (overlap(fl.rlo, fl.rhi, x->fl[f].wlo, x->fl[f].whi) ||
		    overlap(fl.wlo, fl.whi, x->fl[f].rlo, x->fl[f].rhi) ||
		    overlap(fl.wlo, fl.whi, x->fl[f].wlo, x->fl[f].whi))
			RT_CHECK(c->ops->wait(c, x->fl[f].ticket + 1, e));
	float *out = x->ptr[in->out];
	int64_t n = exec_numel(&x->s->tensors[in->out]);
	switch (in->op) {
	case DPK_TP_REDUCE:
		/* out-of-place: the input is complete when the collective is issued
		 * (the schedule's events say so), so copy it and reduce in place */
		if (x->ptr[in->in[0]] != (void *)out)
			memmove(out, x->ptr[in->in[0]], (size_t)n * sizeof(float));
		RT_CHECK(c->ops->all_reduce_start(c, axes, out, n, &fl.ticket, e));
		break;
	case DPK_ALL_REDUCE:
		RT_CHECK(c->ops->all_reduce_start(c, axes, out, n, &fl.ticket, e));
		break;
	case DPK_REDUCE_SCATTER:
		RT_CHECK(c->ops->reduce_scatter_start(c, axes, x->ptr[in->in[0]], out, n, &fl.ticket,
						      e));
		break;
	default:
		RT_CHECK(c->ops->all_gather_start(c, axes, x->ptr[in->in[0]], out,
						  exec_numel(&x->s->tensors[in->in[0]]), &fl.ticket,
						  e));
		break;
	}
	if (in->stream == DP_STREAM_COMPUTE)
		return c->ops->wait(c, fl.ticket + 1, e); /* synchronous on the compute stream */
	if (x->nfl == x->capfl) {
		int cap = x->capfl ? 2 * x->capfl : 32;
		InFlight *p2 = realloc(x->fl, (size_t)cap * sizeof *p2);
		if (!p2)
			return RT_FAIL(e, "out of memory (in-flight collectives)");
		x->fl = p2;
		x->capfl = cap;
	}
	x->fl[x->nfl++] = fl;
	return 0;
}

static int load(Exec *x, int p, const DpInstr *in, RtErr *e)
{
	const DpStep *s = x->s;
	int src = (int)in->ia[0];
	void *dst = x->ptr[in->out];
	if (p == DP_PROG_STEP) {
		if (!x->train)
			return RT_FAIL(e, "no training data is loaded for source %d", src);
		data_fill_train(x->train, s, src, x->step, x->micro, x->dp_rank, x->dp_size, dst);
	} else {
		if (!x->eval)
			return RT_FAIL(e, "no eval data is loaded for source %d", src);
		data_fill_eval(x->eval, s, src, x->eval_batch, x->dp_rank, x->dp_size, dst);
	}
	return 0;
}

/* INIT, SAVE and SHARD: the kernels that move data across the executor's
 * boundary (hooks) or depend on this rank's place in the mesh. */
static int run_own(Exec *x, const DpInstr *in, RtErr *e)
{
	const DpStep *s = x->s;
	switch (in->op) {
	case DPK_INIT: {
		const DpTensor *t = &s->tensors[in->out];
		int name = in->in[0] >= 0 ? in->in[0] : in->out;
		float *dst = x->ptr[in->out];
		if (x->init_tensor)
			return x->init_tensor(x->hook_ctx, name, in->out, dst, e);
		init_fill(t->init, t->init_a, t->init_b, s->cfg.seed,
			  dpstep_str(s, s->tensors[name].name), t->init_base, exec_numel(t), dst);
		return 0;
	}
	case DPK_SAVE: {
		int name = in->in[1] >= 0 ? in->in[1] : in->in[0];
		if (!x->save_tensor)
			return RT_FAIL(e, "save of '%s': no checkpoint writer is set", tname(s, name));
		return x->save_tensor(x->hook_ctx, name, in->in[0], x->ptr[in->in[0]], e);
	}
	default: { /* SHARD: block k of the group along dim ia1 (0: contiguous) */
		const DpTensor *ti = &s->tensors[in->in[0]];
		int k = comm_group_rank(x->comm, (unsigned)in->ia[0]);
		int dim = (int)in->ia[1];
		int64_t outer = 1, inner = 1;
		for (int d = 0; d < dim; d++)
			outer *= ti->dims[d];
		for (int d = dim; d < ti->ndim; d++)
			inner *= ti->dims[d];
		/* in0 is [outer][g * n]: row o's block k is n elements */
		int64_t n = exec_numel(&s->tensors[in->out]) / outer;
		const float *src = x->ptr[in->in[0]];
		float *dst = x->ptr[in->out];
		for (int64_t o = 0; o < outer; o++)
			memmove(dst + o * n, src + o * inner + (int64_t)k * n, (size_t)n * sizeof(float));
		return 0;
	}
	}
}

static int is_own(unsigned op)
{
	return op == DPK_INIT || op == DPK_SAVE || op == DPK_SHARD;
}

int exec_run(Exec *x, DpProgram p, int last, RtErr *e)
{
	const DpStep *s = x->s;
	Comm *c = x->comm;
	memset(x->event_set, 0, s->nevents ? s->nevents : 1);
	x->nfl = 0;
	for (uint32_t i = 0; i < s->nprog[p]; i++) {
		const DpInstr *in = &s->prog[p][i];
		if ((in->flags & DP_IF_LAST) && !last)
			continue;
		if (x->nfl && !x->no_progress)
			RT_CHECK(c->ops->progress(c, e));
		switch (in->op) {
		case DPK_EVENT_RECORD: {
			int ev = (int)in->ia[0];
			x->event_set[ev] = 1;
			/* comm: covers every collective issued so far; compute: done now */
			x->event_ticket[ev] = in->stream == DP_STREAM_COMM ? c->issued : -1;
			break;
		}
		case DPK_EVENT_WAIT: {
			int ev = (int)in->ia[0];
			if (!x->event_set[ev])
				return RT_FAIL(e, "schedule error in the %s program: instruction %u waits "
					       "for event %d, which was not recorded before it",
					       dp_prog_names[p], i, ev);
			if (in->stream == DP_STREAM_COMPUTE && x->event_ticket[ev] >= 0) {
				RT_CHECK(c->ops->wait(c, x->event_ticket[ev], e));
				retire(x, x->event_ticket[ev]);
			}
			/* a wait on the comm stream orders collectives after compute that
			 * has already run (compute is synchronous): nothing to do */
			break;
		}
		case DPK_ALL_REDUCE:
		case DPK_REDUCE_SCATTER:
		case DPK_ALL_GATHER:
		case DPK_TP_REDUCE:
			if (in->stream == DP_STREAM_COMPUTE)
				RT_CHECK(check_hazard(x, p, i, e));
			RT_CHECK(start_collective(x, p, i, e));
			break;
		default:
			if (in->stream == DP_STREAM_COMM) {
				/* a kernel on the comm stream runs after the collectives before it */
				RT_CHECK(c->ops->wait(c, c->issued, e));
			} else if (x->nfl) {
				RT_CHECK(check_hazard(x, p, i, e));
			}
			if (in->op == DPK_LOAD)
				RT_CHECK(load(x, p, in, e));
			else if (is_own(in->op))
				RT_CHECK(run_own(x, in, e));
			else
				RT_CHECK(cpu_run(s, in, x->ptr, &x->cpu, e));
			break;
		}
	}
	RT_CHECK(c->ops->wait(c, c->issued, e));
	x->nfl = 0;
	return 0;
}
