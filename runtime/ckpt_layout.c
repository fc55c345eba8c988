/*
 * ckpt_layout.c - where this rank holds each element of each whole
 * parameter and of its optimizer state, and which rank owns which element
 * when a checkpoint is written (ckpt.h says what a checkpoint is).
 *
 * The init program is read, not run (its instructions of this rank's
 * pipeline stage and of every rank): an interval map over the arena (in
 * f32 elements) records which elements of which whole parameter each arena
 * range holds after it (INIT: a whole parameter; SHARD: this rank's block,
 * row by row along its dim; COPY, and offload's D2H and H2D; anything else:
 * unknown; the host arena's elements follow the device arena's). The ranges that
 * lie in persistent tensors ("roots": flat buffers, optimizer state,
 * parameters outside any flat buffer; never an activation's range) become
 * segments: (whole tensor, element range) -> (root, element offset). A
 * segment inside the parameter an ADAMW/SGD instruction updates is a master
 * copy; its optimizer state sits at the same offset of the instruction's m,
 * v or momentum tensor. Masters are what is saved; every copy is what is
 * loaded (zero1's whole parameters beside their master shard, tp's
 * replicated norms on every tp rank). A CAST of the init program (bf16:
 * a master's compute copy) is neither: after a load it runs again, so the
 * copies are those of the loaded masters. Its input lies in a root (loaded
 * already) or is a whole parameter the init program made (zero1/2's
 * gathered masters): then the load writes the input first, from the
 * elements the map says it held when the CAST read it, and zeros where a
 * FILL of 0 left padding no parameter covers.
 *
 * Ownership: on the first save the ranks exchange their master segments
 * (world_allgatherv) and every rank computes the same answer: an element
 * belongs to the lowest rank holding it (a replicated element is saved
 * once).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "ckpt_int.h"

/* Elements [lo, hi) of the arena hold elements full.. of whole tensor ent. */
typedef struct {
	int64_t lo, hi;
	int32_t ent;
	int64_t full;
} Ival;

typedef struct {
	Ival *v;
	int n, cap;
} IvalMap;

/* One optimizer instruction: the parameter range it updates and its state. */
typedef struct {
	int64_t lo, hi;           /* the updated tensor, arena elements */
	int32_t state[CKPT_MAX_COMP]; /* component c >= 1: tensor id, -1 none */
} OptUse;

const char *ckpt_opt_name(const DpStep *s)
{
	return dp_kind_name(DP_SET_OPTIMIZER, (int)s->opt.kind);
}

const char *ckpt_ent_name(const Ckpt *c, int e)
{
	return dpstep_str(c->s, c->s->tensors[c->ent[e].name].name);
}

void ckpt_dims_str(char *buf, size_t len, int ndim, const int64_t *dims)
{
	size_t k = 0;
	buf[0] = '\0';
	for (int d = 0; d < ndim && k < len; d++)
		k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? "," : "", (long long)dims[d]);
}

uint32_t ckpt_hash_tensor(uint32_t h, const char *name, int ndim, const int64_t *dims)
{
	char buf[512], d[128];
	ckpt_dims_str(d, sizeof d, ndim, dims);
	int n = snprintf(buf, sizeof buf, "%s[%s];", name, d);
	return (uint32_t)crc32(h, (const Bytef *)buf, (uInt)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
}

uint32_t ckpt_hash_end(uint32_t h, unsigned opt_kind)
{
	char buf[64];
	int n = snprintf(buf, sizeof buf, "optimizer:%u", opt_kind);
	return (uint32_t)crc32(h, (const Bytef *)buf, (uInt)n);
}

void ckpt_comp_name(const Ckpt *c, int cc, int k, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s", ckpt_ent_name(c, k), cc ? "." : "", c->comp[cc]);
}

int64_t ckpt_global_batch(const DpStep *s)
{
	return (int64_t)s->cfg.micro_batch * s->cfg.grad_accum * s->cfg.mesh[DP_AXIS_REPLICATE] *
	       s->cfg.mesh[DP_AXIS_SHARD];
}

/* ---- the interval map ---- */

/* First interval with hi > lo. */
static int ival_first(const IvalMap *m, int64_t lo)
{
	int a = 0, b = m->n;
	while (a < b) {
		int mid = (a + b) / 2;
		if (m->v[mid].hi <= lo)
			a = mid + 1;
		else
			b = mid;
	}
	return a;
}

/* Replace what [lo, hi) holds by add[0..nadd) (sorted, inside [lo, hi)). */
static int ival_splice(IvalMap *m, int64_t lo, int64_t hi, const Ival *add, int nadd)
{
	int i = ival_first(m, lo), j = i;
	Ival left = {0}, right = {0};
	int nl = 0, nr = 0;
	while (j < m->n && m->v[j].lo < hi)
		j++;
	if (i < j && m->v[i].lo < lo) {
		left = m->v[i];
		left.hi = lo;
		nl = 1;
	}
	if (i < j && m->v[j - 1].hi > hi) {
		right = m->v[j - 1];
		right.full += hi - right.lo;
		right.lo = hi;
		nr = 1;
	}
	int nn = m->n - (j - i) + nl + nadd + nr;
	if (nn > m->cap) {
		int cap = m->cap ? m->cap : 64;
		while (cap < nn)
			cap *= 2;
		Ival *v = realloc(m->v, (size_t)cap * sizeof *v);
		if (!v)
			return -1;
		m->v = v;
		m->cap = cap;
	}
	if (m->n > j) /* (m->v may still be NULL when there is nothing to move) */
		memmove(m->v + i + nl + nadd + nr, m->v + j, (size_t)(m->n - j) * sizeof *m->v);
	if (nl)
		m->v[i] = left;
	if (nadd)
		memcpy(m->v + i + nl, add, (size_t)nadd * sizeof *add);
	if (nr)
		m->v[i + nl + nadd] = right;
	m->n = nn;
	return 0;
}

/* Append to *out what [lo, hi) holds, shifted by `shift` arena elements. */
static int ival_query(const IvalMap *m, int64_t lo, int64_t hi, int64_t shift, Ival **out,
		      int *n, int *cap)
{
	for (int i = ival_first(m, lo); i < m->n && m->v[i].lo < hi; i++) {
		Ival v = m->v[i];
		if (v.lo < lo) {
			v.full += lo - v.lo;
			v.lo = lo;
		}
		if (v.hi > hi)
			v.hi = hi;
		v.lo += shift;
		v.hi += shift;
		if (*n && (*out)[*n - 1].ent == v.ent && (*out)[*n - 1].hi == v.lo &&
		    (*out)[*n - 1].full + ((*out)[*n - 1].hi - (*out)[*n - 1].lo) == v.full) {
			(*out)[*n - 1].hi = v.hi; /* contiguous in both: merge */
			continue;
		}
		if (*n == *cap) {
			int c2 = *cap ? 2 * *cap : 64;
			Ival *o = realloc(*out, (size_t)c2 * sizeof *o);
			if (!o)
				return -1;
			*out = o;
			*cap = c2;
		}
		(*out)[(*n)++] = v;
	}
	return 0;
}

/* ---- the layout ---- */

/* Arena elements: the device arena, then the host arena (offload). */
static int64_t elem_of(const DpStep *s, const DpTensor *t)
{
	return (int64_t)(dp_tensor_addr(s, t) / 4);
}

/* The entry of parameter tensor `name`, added on first sight. */
static int entry_of(Ckpt *c, int32_t name, RtErr *e)
{
	for (int i = 0; i < c->nent; i++)
		if (c->ent[i].name == name)
			return i;
	Entry *ne = realloc(c->ent, (size_t)(c->nent + 1) * sizeof *ne);
	if (!ne)
		return RT_FAIL(e, "out of memory");
	c->ent = ne;
	const DpTensor *t = &c->s->tensors[name];
	Entry *en = &c->ent[c->nent];
	memset(en, 0, sizeof *en);
	en->name = name;
	en->ndim = t->ndim;
	en->numel = 1;
	for (int d = 0; d < t->ndim; d++) {
		en->dims[d] = init_whole_dim(c->s, t, d);
		en->numel *= en->dims[d];
	}
	return c->nent++;
}

static int is_root(const DpStep *s, uint32_t id);
static int push_seg(Seg **v, int *n, int *cap, Seg sg, RtErr *e);

/* Does tensor id lie inside a root (what a load writes)? */
static int in_root(const DpStep *s, uint32_t id)
{
	const DpTensor *t = &s->tensors[id];
	for (uint32_t j = 0; j < s->ntensors; j++) {
		const DpTensor *r = &s->tensors[j];
		uint64_t ra = dp_tensor_addr(s, r), ta = dp_tensor_addr(s, t);
		if (ra <= ta && ta + t->nbytes <= ra + r->nbytes &&
		    is_root(s, j))
			return 1;
	}
	return 0;
}

/* Init instruction i runs again after a load, after those added before it. */
static int add_rerun(Ckpt *c, uint32_t i, RtErr *e)
{
	uint32_t *r = realloc(c->recast, (size_t)(c->nrecast + 1) * sizeof *r);
	if (!r)
		return RT_FAIL(e, "out of memory");
	c->recast = r;
	c->recast[c->nrecast++] = i;
	return 0;
}

/* Init instruction i, a CAST: derive its output again after a load. */
static int add_recast(Ckpt *c, const IvalMap *m, uint32_t i, Ival **tmp, int *cap, int *capin,
		      RtErr *e)
{
	const DpStep *s = c->s;
	int32_t src = s->prog[DP_PROG_INIT][i].in[0];
	const DpTensor *t = &s->tensors[src];
	RT_CHECK(add_rerun(c, i, e));
	if (in_root(s, (uint32_t)src))
		return 0;
	int ntmp = 0;
	int64_t lo = elem_of(s, t), n = exec_numel(t);
	if (t->dtype != DP_F32 || ival_query(m, lo, lo + n, 0, tmp, &ntmp, cap))
		return RT_FAIL(e, "checkpoints: the init program casts '%s', which this runtime "
			       "cannot trace", dpstep_str(s, t->name));
	/* elements no parameter covers (the padding of a unit cut over
	 * dp_shard) are the zeros of a FILL before the cast: written as zeros
	 * again (ent -1), so the copy is the one a fresh start makes */
	int zeroed = 0;
	for (uint32_t j = 0; j < i; j++) {
		const DpInstr *f = &s->prog[DP_PROG_INIT][j];
		if (f->op == DP_OP_FILL && f->out == src)
			zeroed = DP_FATTR(f, FILL, value) == 0.0f;
	}
	int64_t at = 0; /* elements of the input placed so far */
	for (int k = 0; k <= ntmp; k++) {
		int64_t next = k < ntmp ? (*tmp)[k].lo - lo : n;
		if (next > at) {
			if (!zeroed)
				return RT_FAIL(e, "checkpoints: the init program casts '%s', which is "
					       "not made of parameters only", dpstep_str(s, t->name));
			Seg gap = {-1, src, at, 0, next - at};
			RT_CHECK(push_seg(&c->cast_in, &c->ncast_in, capin, gap, e));
		}
		if (k == ntmp)
			break;
		Seg sg = {(*tmp)[k].ent, src, (*tmp)[k].lo - lo, (*tmp)[k].full,
			  (*tmp)[k].hi - (*tmp)[k].lo};
		RT_CHECK(push_seg(&c->cast_in, &c->ncast_in, capin, sg, e));
		at = sg.at + sg.n;
	}
	return 0;
}

/* Does this rank run instruction in: every rank's, or one of its pipeline
 * stage's (another stage's parameters share its arena bytes: pp > 1,
 * passes/stage_params.c)? */
static int ckpt_runs_here(const Ckpt *c, const DpInstr *in)
{
	return !in->stage1 || dp_instr_stage(in) == c->x->pp_stage;
}

/* Read the init program over the arena (see the top of the file). */
static int trace_init(Ckpt *c, IvalMap *m, RtErr *e)
{
	const DpStep *s = c->s;
	Ival *tmp = NULL;
	int ntmp = 0, cap = 0, capin = 0, rc = 0;
	for (uint32_t i = 0; rc == 0 && i < s->nprog[DP_PROG_INIT]; i++) {
		const DpInstr *in = &s->prog[DP_PROG_INIT][i];
		if (in->out < 0)
			continue;
		if (!ckpt_runs_here(c, in)) {
			/* another stage's parameter: an entry all the same, so that
			 * every rank numbers the entries alike */
			int32_t name = in->in[0] >= 0 ? in->in[0] : in->out;
			if (in->op == DP_OP_INIT && s->tensors[name].kind == DP_T_PARAM &&
			    entry_of(c, name, e) < 0)
				rc = -1;
			continue;
		}
		const DpTensor *o = &s->tensors[in->out];
		int64_t olo = elem_of(s, o), on = exec_numel(o);
		ntmp = 0;
		if (in->op == DP_OP_CAST && (rc = add_recast(c, m, i, &tmp, &cap, &capin, e)))
			break;
		/* offload: a bf16 copy between the arenas of a cast's output is
		 * made again after it (an f32 one is a COPY: loaded itself) */
		if ((in->op == DP_OP_D2H || in->op == DP_OP_H2D) && o->dtype != DP_F32 &&
		    (rc = add_rerun(c, i, e)))
			break;
		if (o->dtype != DP_F32) {
			/* not f32 elements (a bf16 copy): the bytes it covers are unknown */
			int64_t ohi = (int64_t)((dp_tensor_addr(s, o) + (uint64_t)exec_tensor_bytes(s, (int)in->out) + 3) / 4);
			if (ival_splice(m, olo, ohi, NULL, 0))
				rc = RT_FAIL(e, "out of memory");
			continue;
		}
		if (in->op == DP_OP_INIT) {
			int32_t name = in->in[0] >= 0 ? in->in[0] : in->out;
			if (s->tensors[name].kind == DP_T_PARAM) {
				int k = entry_of(c, name, e);
				if (k < 0) {
					rc = -1;
					break;
				}
				if (o->dtype != DP_F32 || o->init_base < 0 ||
				    o->init_base + on > c->ent[k].numel) {
					rc = RT_FAIL(e, "checkpoints: the init program writes '%s' in a way "
						     "this runtime cannot trace", ckpt_ent_name(c, k));
					break;
				}
				Ival v = {olo, olo + on, k, o->init_base};
				rc = ival_splice(m, olo, olo + on, &v, 1);
				continue;
			}
		} else if (in->op == DP_OP_SHARD || in->op == DP_OP_COPY || in->op == DP_OP_D2H ||
			   in->op == DP_OP_H2D) {
			const DpTensor *src = &s->tensors[in->in[0]];
			int64_t slo = elem_of(s, src), outer = 1, inner = 1, k = 0;
			if (in->op == DP_OP_SHARD) {
				k = comm_group_rank(c->x->comm, (unsigned)DP_ATTR(in, SHARD, axes));
				for (int d = 0; d < DP_ATTR(in, SHARD, dim); d++)
					outer *= src->dims[d];
				for (int d = (int)DP_ATTR(in, SHARD, dim); d < src->ndim; d++)
					inner *= src->dims[d];
			} else {
				inner = on;
			}
			int64_t n = on / outer; /* row o of out: n elements from block k of row o */
			for (int64_t r = 0; rc == 0 && r < outer; r++) {
				int64_t from = slo + r * inner + k * n, to = olo + r * n;
				if (ival_query(m, from, from + n, to - from, &tmp, &ntmp, &cap))
					rc = RT_FAIL(e, "out of memory");
			}
			if (rc == 0 && ival_splice(m, olo, olo + on, tmp, ntmp))
				rc = RT_FAIL(e, "out of memory");
			continue;
		}
		/* anything else makes its output unknown */
		if (ival_splice(m, olo, olo + on, NULL, 0))
			rc = RT_FAIL(e, "out of memory");
	}
	free(tmp);
	return rc;
}

/* Is tensor id a root: persistent, outside every activation's range, and
 * not inside a flat buffer (the buffer is the root then)? */
static int is_root(const DpStep *s, uint32_t id)
{
	const DpTensor *t = &s->tensors[id];
	if (!t->nbytes || t->dtype != DP_F32)
		return 0;
	if (t->kind != DP_T_FLAT && t->kind != DP_T_OPTSTATE && t->kind != DP_T_PARAM)
		return 0;
	uint64_t lo = dp_tensor_addr(s, t), hi = lo + t->nbytes;
	for (uint32_t j = 0; j < s->ntensors; j++) {
		const DpTensor *u = &s->tensors[j];
		if (j == id || !u->nbytes)
			continue;
		uint64_t ulo = dp_tensor_addr(s, u), uhi = ulo + u->nbytes;
		if ((u->kind == DP_T_ACT || u->kind == DP_T_DATA) && ulo < hi && lo < uhi)
			return 0;
		if (t->kind == DP_T_PARAM && u->kind == DP_T_FLAT && ulo <= lo && hi <= uhi)
			return 0;
	}
	return 1;
}

static int push_seg(Seg **v, int *n, int *cap, Seg sg, RtErr *e)
{
	if (*n == *cap) {
		int c2 = *cap ? 2 * *cap : 64;
		Seg *o = realloc(*v, (size_t)c2 * sizeof *o);
		if (!o)
			return RT_FAIL(e, "out of memory");
		*v = o;
		*cap = c2;
	}
	(*v)[(*n)++] = sg;
	return 0;
}

/* The optimizer instructions of the step program and the components they
 * give a parameter. */
static int find_optimizer(Ckpt *c, OptUse **out, int *nout, RtErr *e)
{
	const DpStep *s = c->s;
	int n = 0;
	*out = NULL;
	c->ncomp = 1;
	c->comp[0] = "";
	for (uint32_t i = 0; i < s->nprog[DP_PROG_STEP]; i++) {
		const DpInstr *in = &s->prog[DP_PROG_STEP][i];
		if ((in->op != DP_OP_ADAMW && in->op != DP_OP_SGD) || !ckpt_runs_here(c, in))
			continue;
		OptUse *o = realloc(*out, (size_t)(n + 1) * sizeof *o);
		if (!o) {
			free(*out);
			*out = NULL;
			return RT_FAIL(e, "out of memory");
		}
		*out = o;
		const DpTensor *p = &s->tensors[in->out];
		o[n] = (OptUse){elem_of(s, p), elem_of(s, p) + exec_numel(p), {-1, -1, -1}};
		if (in->op == DP_OP_ADAMW) {
			c->ncomp = 3;
			c->comp[1] = "exp_avg";
			c->comp[2] = "exp_avg_sq";
			o[n].state[1] = in->in[1];
			o[n].state[2] = in->in[2];
		} else if (in->in[1] >= 0) {
			c->ncomp = 2;
			c->comp[1] = "momentum_buffer";
			o[n].state[1] = in->in[1];
		}
		n++;
	}
	*nout = n;
	return 0;
}

/* Segments from the interval map: fill[0] (every copy), the masters and
 * their optimizer state. */
static int build_segments(Ckpt *c, const IvalMap *m, RtErr *e)
{
	const DpStep *s = c->s;
	OptUse *opt;
	Ival *tmp = NULL;
	int nopt, ntmp = 0, tcap = 0, cap[CKPT_MAX_COMP] = {0}, scap[CKPT_MAX_COMP] = {0}, rc = 0;
	RT_CHECK(find_optimizer(c, &opt, &nopt, e));
	for (uint32_t id = 0; rc == 0 && id < s->ntensors; id++) {
		if (!is_root(s, id))
			continue;
		const DpTensor *t = &s->tensors[id];
		int64_t rlo = elem_of(s, t), rhi = rlo + exec_numel(t);
		ntmp = 0;
		if (ival_query(m, rlo, rhi, 0, &tmp, &ntmp, &tcap))
			rc = RT_FAIL(e, "out of memory");
		for (int i = 0; rc == 0 && i < ntmp; i++) {
			Ival v = tmp[i];
			Seg sg = {v.ent, (int32_t)id, v.lo - rlo, v.full, v.hi - v.lo};
			rc = push_seg(&c->fill[0], &c->nfill[0], &cap[0], sg, e);
			/* the parts the optimizer updates are masters */
			for (int k = 0; rc == 0 && k < nopt; k++) {
				int64_t lo = v.lo > opt[k].lo ? v.lo : opt[k].lo;
				int64_t hi = v.hi < opt[k].hi ? v.hi : opt[k].hi;
				if (lo >= hi)
					continue;
				Seg ms = {v.ent, (int32_t)id, lo - rlo, v.full + (lo - v.lo), hi - lo};
				int nsave = c->nsave;
				rc = push_seg(&c->save[0], &nsave, &scap[0], ms, e);
				for (int cc = 1; rc == 0 && cc < c->ncomp; cc++) {
					int32_t st = opt[k].state[cc];
					if (st < 0) {
						rc = RT_FAIL(e, "checkpoints: an optimizer instruction has no %s "
							     "tensor", c->comp[cc]);
						break;
					}
					const DpTensor *sT = &s->tensors[st];
					if (sT->dtype != DP_F32 || exec_numel(sT) != opt[k].hi - opt[k].lo) {
						rc = RT_FAIL(e, "checkpoints: the optimizer's %s tensor '%s' is not "
							     "the size of what it updates", c->comp[cc],
							     dpstep_str(s, sT->name));
						break;
					}
					/* the state of element j of the updated tensor is its element j */
					Seg ss = {v.ent, st, lo - opt[k].lo, ms.full, ms.n};
					int nn = c->nsave, nf = c->nfill[cc];
					rc = push_seg(&c->save[cc], &nn, &scap[cc], ss, e);
					if (rc == 0)
						rc = push_seg(&c->fill[cc], &nf, &cap[cc], ss, e);
					c->nfill[cc] = nf;
				}
				c->nsave = nsave;
			}
		}
	}
	free(opt);
	free(tmp);
	if (rc == 0 && nopt == 0) { /* no optimizer: every copy is saved */
		c->save[0] = malloc((size_t)(c->nfill[0] ? c->nfill[0] : 1) * sizeof(Seg));
		if (!c->save[0])
			return RT_FAIL(e, "out of memory");
		if (c->nfill[0])
			memcpy(c->save[0], c->fill[0], (size_t)c->nfill[0] * sizeof(Seg));
		c->nsave = c->nfill[0];
	}
	return rc;
}

int ckpt_new(Ckpt **out, Exec *x, World *w, const char *step_path, RtErr *e)
{
	Ckpt *c = calloc(1, sizeof *c);
	*out = NULL;
	if (!c)
		return RT_FAIL(e, "out of memory");
	c->x = x;
	c->s = x->s;
	c->w = w;
	c->step_path = strdup(step_path ? step_path : "");
	unsigned char *buf;
	size_t len;
	if (!c->step_path || dpstep_encode(c->s, &buf, &len)) {
		ckpt_free(c);
		return RT_FAIL(e, "out of memory");
	}
	c->step_crc = (uint32_t)crc32(0L, buf, (uInt)len);
	free(buf);
	IvalMap m = {0};
	int rc = trace_init(c, &m, e);
	if (rc == 0)
		rc = build_segments(c, &m, e);
	if (rc == 0)
		rc = ckpt_rank_find(c, e);
	free(m.v);
	if (rc) {
		ckpt_free(c);
		return -1;
	}
	*out = c;
	return 0;
}

void ckpt_free(Ckpt *c)
{
	if (!c)
		return;
	for (int k = 0; k < CKPT_MAX_COMP; k++) {
		free(c->fill[k]);
		free(c->save[k]);
	}
	free(c->ent);
	free(c->recast);
	free(c->cast_in);
	free(c->rank_t);
	free(c->rank_here);
	free(c->rank_holders);
	free(c->step_path);
	free(c->owned);
	free(c->owned_src);
	free(c->owned_off);
	free(c->ent_count);
	free(c);
}

int64_t ckpt_params(const Ckpt *c)
{
	int64_t n = 0;
	for (int i = 0; i < c->nent; i++)
		n += c->ent[i].numel;
	return n;
}

int64_t ckpt_bytes(const Ckpt *c)
{
	/* + every rank's rank-local state, headers, state.json */
	return ckpt_params(c) * 4 * c->ncomp + c->rank_elems * 4 * c->w->size + 64 * 1024;
}

/* ---- ownership ---- */

/* A growable array of Range. */
typedef struct {
	Range *v;
	int64_t n, cap;
} Ranges;

static int ranges_push(Ranges *a, Range r, RtErr *e)
{
	if (a->n == a->cap) {
		int64_t c2 = a->cap ? 2 * a->cap : 16;
		Range *v = realloc(a->v, (size_t)c2 * sizeof *v);
		if (!v)
			return RT_FAIL(e, "out of memory");
		a->v = v;
		a->cap = c2;
	}
	a->v[a->n++] = r;
	return 0;
}

/* Add q to the sorted, merged coverage a. */
static int cover(Ranges *a, Range q, RtErr *e)
{
	int64_t i = 0;
	while (i < a->n && a->v[i].full + a->v[i].n < q.full)
		i++;
	/* merge every range that touches [q.full, q.full + q.n) into q */
	int64_t j = i;
	while (j < a->n && a->v[j].full <= q.full + q.n) {
		int64_t lo = a->v[j].full < q.full ? a->v[j].full : q.full;
		int64_t hi = a->v[j].full + a->v[j].n > q.full + q.n ? a->v[j].full + a->v[j].n
								     : q.full + q.n;
		q.full = lo;
		q.n = hi - lo;
		j++;
	}
	if (j == i) { /* insert */
		RT_CHECK(ranges_push(a, q, e));
		memmove(a->v + i + 1, a->v + i, (size_t)(a->n - 1 - i) * sizeof *a->v);
	} else { /* replace [i, j) by q */
		memmove(a->v + i + 1, a->v + j, (size_t)(a->n - j) * sizeof *a->v);
		a->n -= j - i - 1;
	}
	a->v[i] = q;
	return 0;
}

/* Exchange the masters; every rank computes every rank's owned pieces: an
 * element is owned by the lowest rank holding it. Fails (an internal
 * error) when some element is held by no rank. */
int ckpt_plan(Ckpt *c, RtErr *e)
{
	World *w = c->w;
	int W = w->size, rc = -1;
	Range *mine = malloc((size_t)(c->nsave ? c->nsave : 1) * sizeof *mine);
	char *all = NULL;
	int64_t *offs = NULL;
	if (!mine)
		return RT_FAIL(e, "out of memory");
	for (int i = 0; i < c->nsave; i++)
		mine[i] = (Range){c->save[0][i].ent, 0, c->save[0][i].full, c->save[0][i].n};
	rc = world_allgatherv(w, mine, (int64_t)c->nsave * (int64_t)sizeof *mine, &all, &offs, e);
	free(mine);
	if (rc)
		return -1;
	rc = -1;
	Ranges *cov = calloc((size_t)c->nent + 1, sizeof *cov), owned = {0}, src = {0};
	c->owned_off = calloc((size_t)W + 1, sizeof *c->owned_off);
	c->ent_count = calloc((size_t)c->nent * (size_t)W + 1, sizeof *c->ent_count);
	if (!cov || !c->owned_off || !c->ent_count) {
		RT_FAIL(e, "out of memory");
		goto out;
	}
	for (int r = 0; r < W; r++) {
		const Range *rr = (const Range *)(all + offs[r]);
		int64_t nr = (offs[r + 1] - offs[r]) / (int64_t)sizeof(Range);
		c->owned_off[r] = owned.n;
		for (int64_t i = 0; i < nr; i++) {
			Range q = rr[i];
			if (q.ent < 0 || q.ent >= c->nent || q.full < 0 || q.n < 0 ||
			    q.full + q.n > c->ent[q.ent].numel) {
				RT_FAIL(e, "checkpoints: rank %d describes elements its layout cannot hold",
					r);
				goto out;
			}
			/* the parts of q no lower rank (nor an earlier range) covers */
			const Ranges *cv = &cov[q.ent];
			int64_t at = q.full, end = q.full + q.n;
			for (int64_t k = 0; at < end && k <= cv->n; k++) {
				int64_t clo = k < cv->n ? cv->v[k].full : end;
				int64_t chi = k < cv->n ? cv->v[k].full + cv->v[k].n : end;
				if (chi <= at)
					continue;
				int64_t hi = clo < end ? clo : end;
				if (hi > at) {
					if (ranges_push(&owned, (Range){q.ent, 0, at, hi - at}, e) ||
					    (r == w->rank && ranges_push(&src, (Range){(int32_t)i, 0, 0, 0}, e)))
						goto out;
					c->ent_count[(size_t)q.ent * W + r] += hi - at;
				}
				at = chi > at ? chi : at;
			}
			if (cover(&cov[q.ent], q, e))
				goto out;
		}
	}
	c->owned_off[W] = owned.n;
	for (int k = 0; k < c->nent; k++) {
		int64_t have = 0;
		for (int r = 0; r < W; r++)
			have += c->ent_count[(size_t)k * W + r];
		if (have != c->ent[k].numel) {
			RT_FAIL(e, "checkpoints: %lld of the %lld elements of '%s' are held by no rank",
				(long long)(c->ent[k].numel - have), (long long)c->ent[k].numel,
				ckpt_ent_name(c, k));
			goto out;
		}
	}
	c->owned = owned.v;
	owned.v = NULL;
	c->owned_src = malloc((size_t)(src.n ? src.n : 1) * sizeof *c->owned_src);
	if (!c->owned_src) {
		RT_FAIL(e, "out of memory");
		goto out;
	}
	for (int64_t i = 0; i < src.n; i++)
		c->owned_src[i] = src.v[i].ent;
	c->planned = 1;
	rc = 0;
out:
	for (int k = 0; cov && k < c->nent; k++)
		free(cov[k].v);
	free(cov);
	free(owned.v);
	free(src.v);
	free(all);
	free(offs);
	return rc;
}

/* ---- host copies of the tensors a component lives in ---- */

float *ckpt_host_of(const Hosts *h, int32_t id)
{
	for (int i = 0; i < h->n; i++)
		if (h->id[i] == id)
			return h->data[i];
	return NULL;
}

void ckpt_hosts_free(Hosts *h)
{
	for (int i = 0; i < h->n; i++)
		free(h->data[i]);
	free(h->id);
	free(h->data);
	memset(h, 0, sizeof *h);
}

/* Read every root the segments name (exec_tensor_read: any backend). */
int ckpt_hosts_read(Ckpt *c, const Seg *seg, int nseg, Hosts *h, RtErr *e)
{
	memset(h, 0, sizeof *h);
	h->id = malloc((size_t)(nseg ? nseg : 1) * sizeof *h->id);
	h->data = malloc((size_t)(nseg ? nseg : 1) * sizeof *h->data);
	if (!h->id || !h->data) {
		ckpt_hosts_free(h);
		return RT_FAIL(e, "out of memory");
	}
	for (int i = 0; i < nseg; i++) {
		if (ckpt_host_of(h, seg[i].root))
			continue;
		int64_t bytes = exec_tensor_bytes(c->s, seg[i].root);
		float *d = malloc((size_t)(bytes ? bytes : 1));
		if (!d) {
			ckpt_hosts_free(h);
			return RT_FAIL(e, "out of memory reading '%s' (%.1f MiB) for a checkpoint",
				       dpstep_str(c->s, c->s->tensors[seg[i].root].name),
				       (double)bytes / (1 << 20));
		}
		h->id[h->n] = seg[i].root;
		h->data[h->n++] = d;
		if (exec_tensor_read(c->x, seg[i].root, d, e)) {
			ckpt_hosts_free(h);
			return -1;
		}
	}
	return 0;
}

