/*
 * ckpt.c - training-state checkpoints: this rank's layout of the state,
 * saving it (full or sharded, atomically) and loading it at any layout.
 * What a checkpoint holds and why it is laid out so: ckpt.h and
 * docs/CHECKPOINTS.md.
 *
 * Layout. The init program is read, not run: an interval map over the arena
 * (in f32 elements) records which elements of which whole parameter each
 * arena range holds after it (INIT: a whole parameter; SHARD: this rank's
 * block, row by row along its dim; COPY; anything else: unknown). The ranges
 * that lie in persistent tensors ("roots": flat buffers, optimizer state,
 * parameters outside any flat buffer; never an activation's range) become
 * segments: (whole tensor, element range) -> (root, element offset). A
 * segment inside the parameter an ADAMW/SGD instruction updates is a master
 * copy; its optimizer state sits at the same offset of the instruction's m,
 * v or momentum tensor. Masters are what is saved; every copy is what is
 * loaded (zero1's whole parameters beside their master shard, tp's
 * replicated norms on every tp rank).
 *
 * Saving. On the first save the ranks exchange their master segments
 * (world_allgatherv) and every rank computes the same ownership: an element
 * belongs to the lowest rank holding it. Full: per component, per tensor,
 * rank 0 gathers the owners' pieces (world_gatherv_f32) into the whole
 * tensor and appends it to its file; one tensor is in memory at a time.
 * Sharded: every rank writes its owned pieces and their table. Every rank
 * reads only through exec_tensor_read/write, so any backend works.
 */
#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zlib.h>

#include "ckpt.h"

#define CKPT_FORMAT "dp-checkpoint"
#define CKPT_VERSION 1
#define CKPT_MAX_COMP 3       /* the parameter + up to two optimizer states */
#define CKPT_STATE "state.json"
#define CKPT_LATEST "latest"

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

/* A run of n elements of whole tensor ent, from element full, held in
 * this rank's tensor root from element at. */
typedef struct {
	int32_t ent, root;
	int64_t at, full, n;
} Seg;

/* What the ranks exchange: a master segment without this rank's places. */
typedef struct {
	int32_t ent, pad;
	int64_t full, n;
} Range;

typedef struct {
	int32_t name;              /* tensor id whose name it has */
	int ndim;
	int64_t dims[DP_MAX_DIMS]; /* whole shape */
	int64_t numel;
} Entry;

/* One optimizer instruction: the parameter range it updates and its state. */
typedef struct {
	int64_t lo, hi;           /* the updated tensor, arena elements */
	int32_t state[CKPT_MAX_COMP]; /* component c >= 1: tensor id, -1 none */
} OptUse;

struct Ckpt {
	Exec *x;
	const DpStep *s;
	World *w;
	char *step_path;
	uint32_t step_crc;
	Entry *ent;
	int nent;
	int ncomp;                     /* 1 + optimizer states */
	const char *comp[CKPT_MAX_COMP]; /* "", "exp_avg", "exp_avg_sq" / "momentum_buffer" */
	Seg *fill[CKPT_MAX_COMP];      /* every place of this rank, per component */
	int nfill[CKPT_MAX_COMP];
	Seg *save[CKPT_MAX_COMP];      /* masters; save[c][i] is save[0][i]'s state c */
	int nsave;
	/* ownership, after the first save: */
	int planned;
	Range *owned;                  /* every rank's owned pieces, rank by rank */
	int *owned_src;                /* for this rank's: the save segment it lies in */
	int64_t *owned_off;            /* owned[] of rank r start at owned_off[r] */
	int64_t *ent_count;            /* [nent * size]: elements rank r owns of entry e */
};

static const char *ent_name(const Ckpt *c, int e)
{
	return dpstep_str(c->s, c->s->tensors[c->ent[e].name].name);
}

static void dims_str(char *buf, size_t len, int ndim, const int64_t *dims)
{
	size_t k = 0;
	buf[0] = '\0';
	for (int d = 0; d < ndim && k < len; d++)
		k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? "," : "", (long long)dims[d]);
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
	memmove(m->v + i + nl + nadd + nr, m->v + j, (size_t)(m->n - j) * sizeof *m->v);
	if (nl)
		m->v[i] = left;
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

static int64_t elem_of(const DpTensor *t)
{
	return (int64_t)(t->offset / 4);
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

/* Read the init program over the arena (see the top of the file). */
static int trace_init(Ckpt *c, IvalMap *m, RtErr *e)
{
	const DpStep *s = c->s;
	Ival *tmp = NULL;
	int ntmp = 0, cap = 0, rc = 0;
	for (uint32_t i = 0; rc == 0 && i < s->nprog[DP_PROG_INIT]; i++) {
		const DpInstr *in = &s->prog[DP_PROG_INIT][i];
		if (in->out < 0)
			continue;
		const DpTensor *o = &s->tensors[in->out];
		int64_t olo = elem_of(o), on = exec_numel(o);
		ntmp = 0;
		if (in->op == DPK_INIT) {
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
						     "this runtime cannot trace", ent_name(c, k));
					break;
				}
				Ival v = {olo, olo + on, k, o->init_base};
				rc = ival_splice(m, olo, olo + on, &v, 1);
				continue;
			}
		} else if (in->op == DPK_SHARD || in->op == DPK_COPY) {
			const DpTensor *src = &s->tensors[in->in[0]];
			int64_t slo = elem_of(src), outer = 1, inner = 1, k = 0;
			if (in->op == DPK_SHARD) {
				k = comm_group_rank(c->x->comm, (unsigned)in->ia[0]);
				for (int d = 0; d < in->ia[1]; d++)
					outer *= src->dims[d];
				for (int d = (int)in->ia[1]; d < src->ndim; d++)
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
	uint64_t lo = t->offset, hi = t->offset + t->nbytes;
	for (uint32_t j = 0; j < s->ntensors; j++) {
		const DpTensor *u = &s->tensors[j];
		if (j == id || !u->nbytes)
			continue;
		uint64_t ulo = u->offset, uhi = u->offset + u->nbytes;
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
		if (in->op != DPK_ADAMW && in->op != DPK_SGD)
			continue;
		OptUse *o = realloc(*out, (size_t)(n + 1) * sizeof *o);
		if (!o) {
			free(*out);
			*out = NULL;
			return RT_FAIL(e, "out of memory");
		}
		*out = o;
		const DpTensor *p = &s->tensors[in->out];
		o[n] = (OptUse){elem_of(p), elem_of(p) + exec_numel(p), {-1, -1, -1}};
		if (in->op == DPK_ADAMW) {
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
		int64_t rlo = elem_of(t), rhi = rlo + exec_numel(t);
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
	return ckpt_params(c) * 4 * c->ncomp + 64 * 1024; /* + headers, state.json */
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
static int plan(Ckpt *c, RtErr *e)
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
				ent_name(c, k));
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

typedef struct {
	int32_t *id;
	float **data;
	int n;
} Hosts;

static float *host_of(const Hosts *h, int32_t id)
{
	for (int i = 0; i < h->n; i++)
		if (h->id[i] == id)
			return h->data[i];
	return NULL;
}

static void hosts_free(Hosts *h)
{
	for (int i = 0; i < h->n; i++)
		free(h->data[i]);
	free(h->id);
	free(h->data);
	memset(h, 0, sizeof *h);
}

/* Read every root the segments name (exec_tensor_read: any backend). */
static int hosts_read(Ckpt *c, const Seg *seg, int nseg, Hosts *h, RtErr *e)
{
	memset(h, 0, sizeof *h);
	h->id = malloc((size_t)(nseg ? nseg : 1) * sizeof *h->id);
	h->data = malloc((size_t)(nseg ? nseg : 1) * sizeof *h->data);
	if (!h->id || !h->data) {
		hosts_free(h);
		return RT_FAIL(e, "out of memory");
	}
	for (int i = 0; i < nseg; i++) {
		if (host_of(h, seg[i].root))
			continue;
		int64_t bytes = exec_tensor_bytes(c->s, seg[i].root);
		float *d = malloc((size_t)(bytes ? bytes : 1));
		if (!d) {
			hosts_free(h);
			return RT_FAIL(e, "out of memory reading '%s' (%.1f MiB) for a checkpoint",
				       dpstep_str(c->s, c->s->tensors[seg[i].root].name),
				       (double)bytes / (1 << 20));
		}
		h->id[h->n] = seg[i].root;
		h->data[h->n++] = d;
		if (exec_tensor_read(c->x, seg[i].root, d, e)) {
			hosts_free(h);
			return -1;
		}
	}
	return 0;
}

/* ---- saving ---- */

/* Full form: component cc, whole tensor by whole tensor, gathered on rank
 * 0 and appended to wr there (wr NULL: rank 0 only takes part). */
static int gather_component(Ckpt *c, int cc, StWriter *wr, RtErr *e)
{
	World *w = c->w;
	int W = w->size, me = w->rank, rc = 0;
	const Range *mine = c->owned + c->owned_off[me];
	int64_t nmine = c->owned_off[me + 1] - c->owned_off[me];
	int *counts = calloc((size_t)W, sizeof *counts), *displs = calloc((size_t)W, sizeof *displs);
	Hosts h;
	if (!counts || !displs) {
		free(counts);
		free(displs);
		return RT_FAIL(e, "out of memory");
	}
	if (hosts_read(c, c->save[cc], c->nsave, &h, e)) {
		free(counts);
		free(displs);
		return -1;
	}
	for (int k = 0; rc == 0 && k < c->nent; k++) {
		int64_t numel = c->ent[k].numel, have = c->ent_count[(size_t)k * W + me];
		if (numel > INT_MAX) {
			rc = RT_FAIL(e, "checkpoints: '%s' has more than 2^31 elements", ent_name(c, k));
			break;
		}
		float *send = malloc((size_t)(have ? have : 1) * 4), *recv = NULL, *whole = NULL;
		if (me == 0) {
			recv = malloc((size_t)(numel ? numel : 1) * 4);
			whole = malloc((size_t)(numel ? numel : 1) * 4);
		}
		if (!send || (me == 0 && (!recv || !whole))) {
			rc = RT_FAIL(e, "out of memory gathering '%s'", ent_name(c, k));
		} else {
			int64_t at = 0;
			for (int64_t i = 0; i < nmine; i++) {
				if (mine[i].ent != k)
					continue;
				const Seg *sg = &c->save[cc][c->owned_src[i]];
				memcpy(send + at, host_of(&h, sg->root) + sg->at + (mine[i].full - sg->full),
				       (size_t)mine[i].n * 4);
				at += mine[i].n;
			}
			int64_t d = 0;
			for (int r = 0; r < W; r++) {
				counts[r] = (int)c->ent_count[(size_t)k * W + r];
				displs[r] = (int)d;
				d += counts[r];
			}
			rc = world_gatherv_f32(w, send, (int)have, recv, counts, displs, e);
			if (rc == 0 && me == 0) {
				for (int r = 0; r < W; r++) {
					int64_t pos = displs[r];
					for (int64_t i = c->owned_off[r]; i < c->owned_off[r + 1]; i++) {
						if (c->owned[i].ent != k)
							continue;
						memcpy(whole + c->owned[i].full, recv + pos, (size_t)c->owned[i].n * 4);
						pos += c->owned[i].n;
					}
				}
				if (wr)
					rc = st_put(wr, whole, numel * 4, e);
			}
		}
		free(send);
		free(recv);
		free(whole);
	}
	hosts_free(&h);
	free(counts);
	free(displs);
	return rc;
}

static void comp_tensor_name(const Ckpt *c, int cc, int k, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s", ent_name(c, k), cc ? "." : "", c->comp[cc]);
}

/* Rank 0's files of the full form: model.safetensors, optimizer.safetensors. */
static int save_full(Ckpt *c, const char *tmpdir, int64_t *bytes, RtErr *e)
{
	int me = c->w->rank, rc = 0;
	size_t plen = strlen(tmpdir) + 32;
	for (int file = 0; file < (c->ncomp > 1 ? 2 : 1); file++) {
		int c0 = file == 0 ? 0 : 1, c1 = file == 0 ? 1 : c->ncomp;
		StWriter wr;
		int open = 0;
		if (me == 0 && rc == 0) {
			int nd = (c1 - c0) * c->nent;
			StDecl *d = calloc((size_t)(nd ? nd : 1), sizeof *d);
			char *names = malloc((size_t)(nd ? nd : 1) * 512), *path = malloc(plen);
			if (!d || !names || !path) {
				rc = RT_FAIL(e, "out of memory");
			} else {
				for (int cc = c0; cc < c1; cc++)
					for (int k = 0; k < c->nent; k++) {
						int i = (cc - c0) * c->nent + k;
						comp_tensor_name(c, cc, k, names + (size_t)i * 512, 512);
						d[i] = (StDecl){.name = names + (size_t)i * 512, .dtype = ST_F32,
								.ndim = c->ent[k].ndim};
						memcpy(d[i].dims, c->ent[k].dims, sizeof d[i].dims);
					}
				snprintf(path, plen, "%s/%s", tmpdir,
					 file == 0 ? "model.safetensors" : "optimizer.safetensors");
				rc = st_begin(&wr, path, d, nd, e);
				open = rc == 0;
			}
			free(d);
			free(names);
			free(path);
		}
		/* every rank takes part in the gathers, whatever rank 0's file does */
		for (int cc = c0; cc < c1; cc++) {
			RtErr ge = {.rank = e->rank};
			if (gather_component(c, cc, open ? &wr : NULL, &ge)) {
				if (rc == 0)
					*e = ge;
				rc = -1;
				break;
			}
		}
		if (open) {
			if (rc == 0)
				rc = st_end(&wr, e);
			else
				st_cancel(&wr);
			if (rc == 0)
				*bytes += wr.bytes;
		}
	}
	return rc;
}

/* This rank's file of the sharded form: the pieces it owns, a table of
 * them ("segments": whole tensor index in state.json's list, first
 * element, count) and their values per component. */
static int save_shard(Ckpt *c, const char *tmpdir, int64_t *bytes, RtErr *e)
{
	World *w = c->w;
	const Range *mine = c->owned + c->owned_off[w->rank];
	int64_t n = c->owned_off[w->rank + 1] - c->owned_off[w->rank], total = 0;
	for (int64_t i = 0; i < n; i++)
		total += mine[i].n;
	StDecl d[1 + CKPT_MAX_COMP] = {{.name = "segments", .dtype = ST_I64, .ndim = 2,
					 .dims = {n, 3}}};
	for (int cc = 0; cc < c->ncomp; cc++)
		d[1 + cc] = (StDecl){.name = cc ? c->comp[cc] : "param", .dtype = ST_F32, .ndim = 1,
				     .dims = {total}};
	char path[4200];
	snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", tmpdir, w->rank, w->size);
	StWriter wr;
	RT_CHECK(st_begin(&wr, path, d, 1 + c->ncomp, e));
	int rc = 0;
	for (int64_t i = 0; rc == 0 && i < n; i++) {
		int64_t row[3] = {mine[i].ent, mine[i].full, mine[i].n};
		rc = st_put(&wr, row, sizeof row, e);
	}
	for (int cc = 0; rc == 0 && cc < c->ncomp; cc++) {
		Hosts h;
		if ((rc = hosts_read(c, c->save[cc], c->nsave, &h, e)))
			break;
		for (int64_t i = 0; rc == 0 && i < n; i++) {
			const Seg *sg = &c->save[cc][c->owned_src[i]];
			rc = st_put(&wr, host_of(&h, sg->root) + sg->at + (mine[i].full - sg->full),
				    mine[i].n * 4, e);
		}
		hosts_free(&h);
	}
	if (rc) {
		st_cancel(&wr);
		return -1;
	}
	RT_CHECK(st_end(&wr, e));
	*bytes += wr.bytes;
	return 0;
}

/* ---- state.json ---- */

/* crc32 of what makes the model: every whole tensor's name and shape and
 * the optimizer's kind (its state's meaning). */
static uint32_t model_hash(const Ckpt *c)
{
	uLong h = crc32(0L, Z_NULL, 0);
	char buf[512];
	for (int k = 0; k < c->nent; k++) {
		char dims[128];
		dims_str(dims, sizeof dims, c->ent[k].ndim, c->ent[k].dims);
		int n = snprintf(buf, sizeof buf, "%s[%s];", ent_name(c, k), dims);
		h = crc32(h, (const Bytef *)buf, (uInt)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
	}
	int n = snprintf(buf, sizeof buf, "optimizer:%u", c->s->opt.kind);
	return (uint32_t)crc32(h, (const Bytef *)buf, (uInt)n);
}

static const char *const opt_kinds[] = {"sgd", "adamw"};    /* DpOptKind */
static const char *const sched_kinds[] = {"constant", "cosine"}; /* DpSchedKind */

static int64_t global_batch(const DpStep *s)
{
	return (int64_t)s->cfg.micro_batch * s->cfg.grad_accum * s->cfg.mesh[DP_AXIS_REPLICATE] *
	       s->cfg.mesh[DP_AXIS_SHARD];
}

static cJSON *hex32(uint32_t v)
{
	char b[16];
	snprintf(b, sizeof b, "%08x", v);
	return cJSON_CreateString(b);
}

/* The JSON text of state.json (malloc'd), or NULL when out of memory. */
static char *state_json(const Ckpt *c, CkptForm form, const CkptRun *run, char **files,
			const int64_t *sizes, int nfiles)
{
	const DpStep *s = c->s;
	int64_t gb = global_batch(s), per_epoch = gb > 0 && run->train_samples >= gb ?
							  run->train_samples / gb : 0;
	cJSON *o = cJSON_CreateObject(), *t;
	cJSON_AddStringToObject(o, "format", CKPT_FORMAT);
	cJSON_AddNumberToObject(o, "version", CKPT_VERSION);
	cJSON_AddStringToObject(o, "form", form == CKPT_FULL ? "full" : "sharded");
	cJSON_AddNumberToObject(o, "step", (double)run->step);
	cJSON_AddNumberToObject(o, "loss", run->loss);
	cJSON_AddNumberToObject(o, "lr_next", exec_lr(s, run->step));
	/* the sampler's position: a function of (seed, step), written for people */
	cJSON_AddNumberToObject(o, "seed", (double)s->cfg.seed);
	cJSON_AddNumberToObject(o, "global_batch", (double)gb);
	cJSON_AddNumberToObject(o, "train_samples", (double)run->train_samples);
	cJSON_AddNumberToObject(o, "epoch", per_epoch ? (double)(run->step / (uint64_t)per_epoch) : 0);
	cJSON_AddNumberToObject(o, "epoch_sample",
				per_epoch ? (double)((run->step % (uint64_t)per_epoch) * (uint64_t)gb) : 0);
	cJSON_AddNumberToObject(o, "samples_seen", (double)run->step * (double)gb);
	t = cJSON_AddObjectToObject(o, "optimizer");
	cJSON_AddStringToObject(t, "kind", s->opt.kind <= DP_OPT_ADAMW ? opt_kinds[s->opt.kind] : "?");
	cJSON_AddNumberToObject(t, "lr", s->opt.lr);
	cJSON_AddNumberToObject(t, "beta1", s->opt.beta1);
	cJSON_AddNumberToObject(t, "beta2", s->opt.beta2);
	cJSON_AddNumberToObject(t, "eps", s->opt.eps);
	cJSON_AddNumberToObject(t, "weight_decay", s->opt.weight_decay);
	cJSON_AddNumberToObject(t, "momentum", s->opt.momentum);
	cJSON_AddNumberToObject(t, "clip", s->opt.clip);
	cJSON *st = cJSON_AddArrayToObject(t, "state");
	for (int cc = 1; cc < c->ncomp; cc++)
		cJSON_AddItemToArray(st, cJSON_CreateString(c->comp[cc]));
	t = cJSON_AddObjectToObject(o, "schedule");
	cJSON_AddStringToObject(t, "kind", s->sched.kind <= DP_SCHED_COSINE ? sched_kinds[s->sched.kind] : "?");
	cJSON_AddNumberToObject(t, "warmup", s->sched.warmup);
	cJSON_AddNumberToObject(t, "steps", s->sched.steps ? s->sched.steps : s->cfg.steps);
	cJSON_AddNumberToObject(t, "min_lr", s->sched.min_lr);
	t = cJSON_AddObjectToObject(o, "model");
	cJSON_AddItemToObject(t, "hash", hex32(model_hash(c)));
	cJSON *ts = cJSON_AddArrayToObject(t, "tensors");
	for (int k = 0; k < c->nent; k++) {
		cJSON *x = cJSON_CreateObject();
		cJSON_AddStringToObject(x, "name", ent_name(c, k));
		cJSON *shape = cJSON_AddArrayToObject(x, "shape");
		for (int d = 0; d < c->ent[k].ndim; d++)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)c->ent[k].dims[d]));
		cJSON_AddItemToArray(ts, x);
	}
	t = cJSON_AddObjectToObject(o, "written_by");
	cJSON_AddStringToObject(t, "step_file", c->step_path);
	cJSON_AddItemToObject(t, "step_file_crc32", hex32(c->step_crc));
	cJSON_AddStringToObject(t, "source", dpstep_str(s, s->source));
	cJSON_AddNumberToObject(t, "world_size", c->w->size);
	cJSON *mesh = cJSON_AddArrayToObject(t, "mesh");
	for (int a = 0; a < DP_MAX_AXES; a++)
		cJSON_AddItemToArray(mesh, cJSON_CreateNumber(s->cfg.mesh[a]));
	cJSON_AddStringToObject(t, "strategy", dp_name(dp_strategy_names, DP_NSTRAT, s->cfg.strategy));
	cJSON *fl = cJSON_AddArrayToObject(o, "files");
	for (int i = 0; i < nfiles; i++) {
		cJSON *x = cJSON_CreateObject();
		cJSON_AddStringToObject(x, "name", files[i]);
		cJSON_AddNumberToObject(x, "bytes", (double)sizes[i]);
		cJSON_AddItemToArray(fl, x);
	}
	char *text = cJSON_Print(o);
	cJSON_Delete(o);
	return text;
}

/* ---- directories ---- */

/* Remove a checkpoint directory (flat: files only) or a file. */
static int remove_tree(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
	struct dirent *de;
	char p[4096];
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", path, de->d_name);
		if (unlink(p) != 0 && errno == EISDIR)
			remove_tree(p);
	}
	closedir(d);
	return rmdir(path);
}

/* step-NNNNNN: the number, or -1 for any other name. */
static long long step_of(const char *name)
{
	if (strncmp(name, "step-", 5) || !name[5])
		return -1;
	char *end;
	long long v = strtoll(name + 5, &end, 10);
	return *end || v < 0 ? -1 : v;
}

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return x < y ? -1 : x > y;
}

/* Remove complete checkpoints beyond the newest keep (never `keep_step`). */
static void prune(const char *dir, int keep, long long keep_step)
{
	DIR *d = opendir(dir);
	if (!d || keep <= 0) {
		if (d)
			closedir(d);
		return;
	}
	long long *v = NULL;
	int n = 0, cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		long long k = step_of(de->d_name);
		if (k < 0)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			long long *nv = realloc(v, (size_t)cap * sizeof *v);
			if (!nv)
				break;
			v = nv;
		}
		v[n++] = k;
	}
	closedir(d);
	qsort(v, (size_t)n, sizeof *v, cmp_ll);
	char p[4096];
	for (int i = 0; i < n - keep; i++) {
		if (v[i] == keep_step)
			continue;
		snprintf(p, sizeof p, "%s/step-%06lld", dir, v[i]);
		remove_tree(p);
	}
	free(v);
	out_sync_dir(dir);
}

int ckpt_prepare_dir(const Ckpt *c, const char *dir, RtErr *e)
{
	if (out_mkdirs(dir) != 0)
		return RT_FAIL(e, errno == ENOTDIR ? "the save directory %s is not a directory"
						   : "cannot create the save directory %s: %s",
			       dir, strerror(errno));
	if (access(dir, W_OK) != 0)
		return RT_FAIL(e, "cannot write in the save directory %s: %s", dir, strerror(errno));
	/* what killed saves left: step-N.dptmp directories, latest.dptmp */
	DIR *d = opendir(dir);
	if (!d)
		return RT_FAIL(e, "cannot read the save directory %s: %s", dir, strerror(errno));
	struct dirent *de;
	char p[4096];
	size_t sl = strlen(OUT_TMP_SUFFIX);
	while ((de = readdir(d))) {
		size_t n = strlen(de->d_name);
		if (n > sl && !strcmp(de->d_name + n - sl, OUT_TMP_SUFFIX)) {
			snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
			remove_tree(p);
		}
	}
	closedir(d);
	struct statvfs vfs;
	int64_t need = ckpt_bytes(c);
	if (statvfs(dir, &vfs) == 0 && (int64_t)(vfs.f_bavail * vfs.f_frsize) < need)
		return RT_FAIL(e, "the save directory %s has %.1f MiB free; a checkpoint of this model "
			       "needs about %.1f MiB", dir,
			       (double)vfs.f_bavail * vfs.f_frsize / (1 << 20), (double)need / (1 << 20));
	return 0;
}

/* Rank 0: state.json into tmpdir, then tmpdir -> final, latest -> name. */
static int publish(Ckpt *c, const char *dir, const char *name, const char *tmpdir,
		   const char *final, CkptForm form, const CkptRun *run, char **files,
		   const int64_t *sizes, int nfiles, int64_t *bytes, int keep_last, RtErr *e)
{
	char err[1024], p[4096];
	char *text = state_json(c, form, run, files, sizes, nfiles);
	if (!text)
		return RT_FAIL(e, "out of memory");
	snprintf(p, sizeof p, "%s/%s", tmpdir, CKPT_STATE);
	OutFile f;
	int rc = out_open(&f, p, err, sizeof err);
	if (rc == 0) {
		out_write(&f, text, strlen(text));
		out_write(&f, "\n", 1);
		rc = out_commit(&f, err, sizeof err);
	}
	if (rc == 0)
		*bytes += (int64_t)strlen(text) + 1;
	free(text);
	if (rc)
		return RT_FAIL(e, "%s", err);
	out_sync_dir(tmpdir);
	/* the same step saved again (a resumed run interrupted at once): replace it */
	struct stat st;
	char old[4096];
	int replaced = 0;
	if (stat(final, &st) == 0) {
		snprintf(old, sizeof old, "%s/%s.old%s", dir, name, OUT_TMP_SUFFIX);
		remove_tree(old);
		if (rename(final, old) != 0)
			return RT_FAIL(e, "cannot replace the checkpoint %s: %s", final, strerror(errno));
		replaced = 1;
	}
	if (rename(tmpdir, final) != 0)
		return RT_FAIL(e, "cannot complete the checkpoint %s: %s", final, strerror(errno));
	if (replaced)
		remove_tree(old);
	out_sync_dir(dir);
	snprintf(p, sizeof p, "%s/%s", dir, CKPT_LATEST);
	rc = out_open(&f, p, err, sizeof err);
	if (rc == 0) {
		out_write(&f, name, strlen(name));
		out_write(&f, "\n", 1);
		rc = out_commit(&f, err, sizeof err);
	}
	if (rc)
		return RT_FAIL(e, "%s (the checkpoint %s is complete)", err, final);
	prune(dir, keep_last, (long long)run->step);
	return 0;
}

int ckpt_save(Ckpt *c, const char *dir, CkptForm form, const CkptRun *run, int keep_last,
	      char **path, int64_t *bytes, RtErr *e)
{
	World *w = c->w;
	int rc = 0;
	char name[64], tmpdir[4096], final[4096];
	*bytes = 0;
	if (path)
		*path = NULL;
	if (!c->planned)
		rc = plan(c, e);
	RT_CHECK(world_sync(w, rc, 0, e));
	snprintf(name, sizeof name, "step-%06llu", (unsigned long long)run->step);
	snprintf(tmpdir, sizeof tmpdir, "%s/%s%s", dir, name, OUT_TMP_SUFFIX);
	snprintf(final, sizeof final, "%s/%s", dir, name);
	if (w->rank == 0) {
		remove_tree(tmpdir);
		if (mkdir(tmpdir, 0777) != 0)
			rc = RT_FAIL(e, "cannot create %s: %s", tmpdir, strerror(errno));
	}
	RT_CHECK(world_sync(w, rc, 0, e));

	int64_t mine = 0;
	rc = form == CKPT_FULL ? save_full(c, tmpdir, &mine, e) : save_shard(c, tmpdir, &mine, e);
	/* every rank's file size, for state.json */
	char *all = NULL;
	int64_t *offs = NULL;
	if (rc == 0)
		rc = world_allgatherv(w, &mine, sizeof mine, &all, &offs, e);
	if (world_sync(w, rc, 0, e)) {
		free(all);
		free(offs);
		if (w->rank == 0)
			remove_tree(tmpdir);
		return -1;
	}
	const int64_t *size = (const int64_t *)all;
	if (w->rank == 0) {
		int nfiles = form == CKPT_FULL ? (c->ncomp > 1 ? 2 : 1) : w->size;
		char **files = calloc((size_t)nfiles, sizeof *files);
		int64_t *sizes = calloc((size_t)nfiles, sizeof *sizes);
		int64_t total = 0;
		for (int i = 0; files && sizes && i < nfiles; i++) {
			files[i] = malloc(64);
			if (!files[i])
				break;
			if (form == CKPT_FULL) {
				snprintf(files[i], 64, "%s", i ? "optimizer.safetensors" : "model.safetensors");
				sizes[i] = -1; /* filled below from the files themselves */
				char p[4096];
				struct stat st;
				snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
				sizes[i] = stat(p, &st) == 0 ? (int64_t)st.st_size : -1;
			} else {
				snprintf(files[i], 64, "shard-%05d-of-%05d.safetensors", i, w->size);
				sizes[i] = size[i];
			}
			total += sizes[i];
		}
		int ok = files && sizes;
		for (int i = 0; ok && i < nfiles; i++)
			ok = files[i] != NULL;
		rc = ok ? publish(c, dir, name, tmpdir, final, form, run, files, sizes, nfiles, &total,
				  keep_last, e)
			: RT_FAIL(e, "out of memory");
		if (rc)
			remove_tree(tmpdir);
		for (int i = 0; files && i < nfiles; i++)
			free(files[i]);
		free(files);
		free(sizes);
		*bytes = total;
		if (rc == 0 && path)
			*path = strdup(final);
	}
	free(all);
	free(offs);
	return world_sync(w, rc, 0, e);
}

/* ---- loading ---- */

/* The first line of a small file (malloc'd), NULL when it cannot be read. */
static char *read_line(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char buf[1024];
	char *line = fgets(buf, sizeof buf, f) ? strdup(buf) : NULL;
	fclose(f);
	if (line)
		line[strcspn(line, "\r\n")] = '\0';
	return line;
}

static int is_file(const char *path, int dir)
{
	struct stat st;
	return stat(path, &st) == 0 && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

int ckpt_resolve(const char *arg, char **dir, char **parent, RtErr *e)
{
	char p[4096];
	char *name = NULL, *base = NULL;
	*dir = *parent = NULL;
	snprintf(p, sizeof p, "%s/%s", arg, CKPT_LATEST);
	if (is_file(arg, 1) && is_file(p, 0)) { /* DIR: its latest */
		base = strdup(arg);
		name = read_line(p);
	} else if (!is_file(arg, 1) && is_file(arg, 0)) { /* DIR/latest */
		const char *slash = strrchr(arg, '/');
		if (strcmp(slash ? slash + 1 : arg, CKPT_LATEST) != 0)
			return RT_FAIL(e, "--resume %s: not a checkpoint directory or a '%s' file", arg,
				       CKPT_LATEST);
		base = out_dirname(arg);
		name = read_line(arg);
	} else if (is_file(arg, 1)) { /* a checkpoint itself, or an empty save directory */
		snprintf(p, sizeof p, "%s/%s", arg, CKPT_STATE);
		if (!is_file(p, 0))
			return RT_FAIL(e, "--resume %s: no checkpoint there (no '%s' file naming one, no %s)",
				       arg, CKPT_LATEST, CKPT_STATE);
		*dir = strdup(arg);
		*parent = out_dirname(arg);
		return *dir && *parent ? 0 : RT_FAIL(e, "out of memory");
	} else {
		return RT_FAIL(e, "--resume %s: %s", arg, strerror(errno ? errno : ENOENT));
	}
	if (!base || !name || !*name || strchr(name, '/') || !strcmp(name, "..")) {
		free(base);
		free(name);
		return RT_FAIL(e, "--resume %s: the '%s' file does not name a checkpoint", arg,
			       CKPT_LATEST);
	}
	snprintf(p, sizeof p, "%s/%s", base, name);
	free(name);
	*dir = strdup(p);
	*parent = base;
	snprintf(p, sizeof p, "%s/%s", *dir, CKPT_STATE);
	if (!is_file(p, 0)) {
		RT_FAIL(e, "--resume %s: the checkpoint %s that '%s' names is missing or incomplete",
			arg, *dir, CKPT_LATEST);
		free(*dir);
		free(*parent);
		*dir = *parent = NULL;
		return -1;
	}
	return 0;
}

/* Where the values of a piece of a whole tensor are in the checkpoint. */
typedef struct {
	int32_t file[CKPT_MAX_COMP];   /* per component: the file */
	int32_t tensor[CKPT_MAX_COMP]; /* and the tensor in it */
	int64_t full, n;               /* elements of the whole tensor */
	int64_t flat;                  /* element of the file's tensor where they start */
} Piece;

typedef struct {
	StFile *file;
	int nfile;
	Piece *p;   /* sorted by (entry, full) */
	int32_t *ent;
	int64_t n;
	int64_t *first; /* [nent + 1]: pieces of entry k are p[first[k] .. first[k+1]) */
} Source;

static void source_free(Source *src)
{
	for (int i = 0; i < src->nfile; i++)
		st_close(&src->file[i]);
	free(src->file);
	free(src->p);
	free(src->ent);
	free(src->first);
	memset(src, 0, sizeof *src);
}

static int push_piece(Source *src, int64_t *cap, int32_t ent, Piece p, RtErr *e)
{
	if (src->n == *cap) {
		int64_t c2 = *cap ? 2 * *cap : 64;
		Piece *np = realloc(src->p, (size_t)c2 * sizeof *np);
		int32_t *ne = np ? realloc(src->ent, (size_t)c2 * sizeof *ne) : NULL;
		if (np)
			src->p = np;
		if (ne)
			src->ent = ne;
		if (!np || !ne)
			return RT_FAIL(e, "out of memory");
		*cap = c2;
	}
	src->p[src->n] = p;
	src->ent[src->n++] = ent;
	return 0;
}

/* Sort the pieces by (entry, full) and index them by entry. */
static int source_index(Source *src, int nent, RtErr *e)
{
	/* counting sort by entry, then insertion order by full within (files list them sorted) */
	src->first = calloc((size_t)nent + 2, sizeof *src->first);
	Piece *p = malloc((size_t)(src->n ? src->n : 1) * sizeof *p);
	if (!src->first || !p) {
		free(p);
		return RT_FAIL(e, "out of memory");
	}
	for (int64_t i = 0; i < src->n; i++)
		src->first[src->ent[i] + 1]++;
	for (int k = 0; k < nent; k++)
		src->first[k + 1] += src->first[k];
	int64_t *at = calloc((size_t)nent + 1, sizeof *at);
	if (!at) {
		free(p);
		return RT_FAIL(e, "out of memory");
	}
	for (int64_t i = 0; i < src->n; i++)
		p[src->first[src->ent[i]] + at[src->ent[i]]++] = src->p[i];
	free(at);
	free(src->p);
	src->p = p;
	for (int k = 0; k < nent; k++) { /* insertion sort by full: pieces come nearly sorted */
		for (int64_t i = src->first[k] + 1; i < src->first[k + 1]; i++) {
			Piece x = p[i];
			int64_t j = i - 1;
			while (j >= src->first[k] && p[j].full > x.full) {
				p[j + 1] = p[j];
				j--;
			}
			p[j + 1] = x;
		}
	}
	return 0;
}

static const cJSON *jget(const cJSON *o, const char *k)
{
	return cJSON_GetObjectItemCaseSensitive(o, k);
}

static double jnum(const cJSON *o, const char *k, double dflt)
{
	const cJSON *v = jget(o, k);
	return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static const char *jstr(const cJSON *o, const char *k)
{
	const cJSON *v = jget(o, k);
	return cJSON_IsString(v) ? v->valuestring : "";
}

/* Append a line to a growing text (notes, differences). */
static void addf(char **text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(char **text, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	size_t old = *text ? strlen(*text) : 0;
	char *t = realloc(*text, old + strlen(line) + 1);
	if (!t)
		return;
	memcpy(t + old, line, strlen(line) + 1);
	*text = t;
}

/* The checkpoint's model against this step file's: 0, or -1 with every
 * difference named. ck_ent[i]: this file's entry of checkpoint tensor i. */
static int check_model(Ckpt *c, const char *dir, const cJSON *js, int32_t **ck_ent, int *nck,
		       char **notes, RtErr *e)
{
	const DpStep *s = c->s;
	char *diff = NULL;
	int ndiff = 0;
	const cJSON *ts = jget(jget(js, "model"), "tensors");
	int n = cJSON_GetArraySize(ts);
	*ck_ent = calloc((size_t)(n ? n : 1), sizeof **ck_ent);
	int *seen = calloc((size_t)(c->nent ? c->nent : 1), sizeof *seen);
	if (!*ck_ent || !seen) {
		free(seen);
		return RT_FAIL(e, "out of memory");
	}
	*nck = n;
	int i = 0;
	for (const cJSON *t = ts ? ts->child : NULL; t; t = t->next, i++) {
		const char *name = jstr(t, "name");
		int64_t dims[DP_MAX_DIMS] = {0};
		int nd = cJSON_GetArraySize(jget(t, "shape"));
		int d = 0;
		for (const cJSON *x = jget(t, "shape") ? jget(t, "shape")->child : NULL;
		     x && d < DP_MAX_DIMS; x = x->next)
			dims[d++] = (int64_t)x->valuedouble;
		int k = 0;
		while (k < c->nent && strcmp(ent_name(c, k), name))
			k++;
		(*ck_ent)[i] = k < c->nent ? k : -1;
		char a[128], b[128];
		dims_str(a, sizeof a, nd, dims);
		if (k == c->nent) {
			if (ndiff++ < 4)
				addf(&diff, "\n  the checkpoint has a parameter '%s' [%s] that this model does not",
				     name, a);
			continue;
		}
		seen[k] = 1;
		int same = nd == c->ent[k].ndim;
		for (int q = 0; same && q < nd; q++)
			same = dims[q] == c->ent[k].dims[q];
		if (!same && ndiff++ < 4) {
			dims_str(b, sizeof b, c->ent[k].ndim, c->ent[k].dims);
			addf(&diff, "\n  parameter '%s' is [%s] in the checkpoint, [%s] in this model",
			     name, a, b);
		}
		if (!same)
			(*ck_ent)[i] = -1;
	}
	for (int k = 0; k < c->nent; k++)
		if (!seen[k] && ndiff++ < 4) {
			char b[128];
			dims_str(b, sizeof b, c->ent[k].ndim, c->ent[k].dims);
			addf(&diff, "\n  this model's parameter '%s' [%s] is not in the checkpoint",
			     ent_name(c, k), b);
		}
	free(seen);
	const cJSON *opt = jget(js, "optimizer");
	const char *kind = jstr(opt, "kind");
	const char *mine = s->opt.kind <= DP_OPT_ADAMW ? opt_kinds[s->opt.kind] : "?";
	if (strcmp(kind, mine) && ndiff++ < 5)
		addf(&diff, "\n  its optimizer is %s, this model's %s", kind, mine);
	/* the run: the data order depends on the seed and the global batch */
	if ((uint64_t)jnum(js, "seed", -1) != s->cfg.seed && ndiff++ < 6)
		addf(&diff, "\n  its seed is %.0f, this step file's %llu", jnum(js, "seed", -1),
		     (unsigned long long)s->cfg.seed);
	if ((int64_t)jnum(js, "global_batch", -1) != global_batch(s) && ndiff++ < 7)
		addf(&diff, "\n  its global batch is %.0f, this step file's %lld",
		     jnum(js, "global_batch", -1), (long long)global_batch(s));
	if (ndiff) {
		RT_FAIL(e, "cannot resume from %s: it was written for another model or run%s%s%s", dir,
			diff ? diff : "", ndiff > 7 ? "\n  ..." : "",
			"\n  (to start a new run from its parameters: --init-from DIR/model.safetensors "
			"of a full checkpoint)");
		free(diff);
		return -1;
	}
	/* hyperparameters may change on resume: say so */
	const char *keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "clip"};
	const float vals[] = {s->opt.lr, s->opt.beta1, s->opt.beta2, s->opt.eps,
			      s->opt.weight_decay, s->opt.momentum, s->opt.clip};
	for (int q = 0; q < 7; q++) {
		double v = jnum(opt, keys[q], vals[q]);
		if ((float)v != vals[q])
			addf(notes, "note: %s is %g in this step file, %g in the checkpoint\n", keys[q],
			     (double)vals[q], v);
	}
	const cJSON *sc = jget(js, "schedule");
	uint32_t steps = s->sched.steps ? s->sched.steps : s->cfg.steps;
	if (strcmp(jstr(sc, "kind"), s->sched.kind <= DP_SCHED_COSINE ? sched_kinds[s->sched.kind] : "?") ||
	    (uint32_t)jnum(sc, "warmup", 0) != s->sched.warmup || (uint32_t)jnum(sc, "steps", 0) != steps ||
	    (float)jnum(sc, "min_lr", 0) != s->sched.min_lr)
		addf(notes, "note: the lr schedule differs from the checkpoint's\n");
	return 0;
}

/* Check the files state.json lists; open them; list their pieces. */
static int open_source(Ckpt *c, const char *dir, const cJSON *js, const int32_t *ck_ent, int nck,
		       Source *src, RtErr *e)
{
	const cJSON *files = jget(js, "files");
	int nf = cJSON_GetArraySize(files), full = !strcmp(jstr(js, "form"), "full");
	char p[4096];
	int64_t cap = 0;
	memset(src, 0, sizeof *src);
	if (!full && strcmp(jstr(js, "form"), "sharded"))
		return RT_FAIL(e, "%s/%s: unknown form '%s'", dir, CKPT_STATE, jstr(js, "form"));
	src->file = calloc((size_t)(nf ? nf : 1), sizeof *src->file);
	if (!src->file)
		return RT_FAIL(e, "out of memory");
	int i = 0;
	for (const cJSON *f = files ? files->child : NULL; f; f = f->next, i++) {
		const char *name = jstr(f, "name");
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, name);
		if (!*name || strchr(name, '/') || stat(p, &st) != 0)
			return RT_FAIL(e, "checkpoint %s is damaged: %s is missing", dir, p);
		if ((double)st.st_size != jnum(f, "bytes", -1))
			return RT_FAIL(e, "checkpoint %s is damaged: %s has %lld bytes, %s says %.0f",
				       dir, name, (long long)st.st_size, CKPT_STATE, jnum(f, "bytes", -1));
		RT_CHECK(st_open(&src->file[i], p, e));
		src->nfile = i + 1;
	}
	if (full) {
		/* model.safetensors and optimizer.safetensors: a piece per whole tensor */
		for (int k = 0; k < c->nent; k++) {
			Piece pc = {.full = 0, .n = c->ent[k].numel, .flat = 0};
			for (int cc = 0; cc < c->ncomp; cc++) {
				char tn[600];
				comp_tensor_name(c, cc, k, tn, sizeof tn);
				int fi = cc ? 1 : 0, t = fi < src->nfile ? st_find(&src->file[fi], tn) : -1;
				if (t < 0 || src->file[fi].t[t].dtype != ST_F32 ||
				    (src->file[fi].t[t].end - src->file[fi].t[t].begin) / 4 != c->ent[k].numel)
					return RT_FAIL(e, "checkpoint %s lacks the tensor '%s' (or it has the "
						       "wrong size)", dir, tn);
				pc.file[cc] = fi;
				pc.tensor[cc] = t;
			}
			RT_CHECK(push_piece(src, &cap, k, pc, e));
		}
		return source_index(src, c->nent, e);
	}
	for (int f = 0; f < src->nfile; f++) {
		StFile *sf = &src->file[f];
		int ts = st_find(sf, "segments");
		Piece pc = {.file = {f, f, f}};
		if (ts < 0 || sf->t[ts].dtype != ST_I64 || sf->t[ts].ndim != 2 || sf->t[ts].dims[1] != 3)
			return RT_FAIL(e, "checkpoint %s: %s has no segments table", dir, sf->path);
		int64_t total = 0;
		for (int cc = 0; cc < c->ncomp; cc++) {
			pc.tensor[cc] = st_find(sf, cc ? c->comp[cc] : "param");
			if (pc.tensor[cc] < 0)
				return RT_FAIL(e, "checkpoint %s: %s has no '%s' values", dir, sf->path,
					       cc ? c->comp[cc] : "param");
		}
		int64_t nrow = sf->t[ts].dims[0];
		int64_t *rows = malloc((size_t)(nrow ? nrow : 1) * 24);
		if (!rows)
			return RT_FAIL(e, "out of memory");
		if (st_pread(sf, ts, 0, rows, nrow * 24, e)) {
			free(rows);
			return -1;
		}
		for (int64_t r = 0; r < nrow; r++) {
			int64_t ce = rows[3 * r], full = rows[3 * r + 1], n = rows[3 * r + 2];
			int k = ce >= 0 && ce < nck ? ck_ent[ce] : -1;
			if (k < 0 || full < 0 || n < 0 || full + n > c->ent[k].numel) {
				free(rows);
				return RT_FAIL(e, "checkpoint %s: %s has a bad segment %lld", dir, sf->path,
					       (long long)r);
			}
			pc.full = full;
			pc.n = n;
			pc.flat = total;
			total += n;
			if (push_piece(src, &cap, k, pc, e)) {
				free(rows);
				return -1;
			}
		}
		free(rows);
		for (int cc = 0; cc < c->ncomp; cc++)
			if ((sf->t[pc.tensor[cc]].end - sf->t[pc.tensor[cc]].begin) / 4 != total)
				return RT_FAIL(e, "checkpoint %s: the values in %s do not match its segments",
					       dir, sf->path);
	}
	return source_index(src, c->nent, e);
}

/* Fill elements [full, full + n) of entry k, component cc, into dst. */
static int read_range(const Ckpt *c, const Source *src, int k, int cc, int64_t full, int64_t n,
		      float *dst, const char *dir, RtErr *e)
{
	int64_t at = full, end = full + n, lo = src->first[k], hi = src->first[k + 1];
	while (lo < hi) { /* the first piece that ends after `at` */
		int64_t mid = (lo + hi) / 2;
		if (src->p[mid].full + src->p[mid].n <= at)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (int64_t i = lo; at < end && i < src->first[k + 1]; i++) {
		const Piece *p = &src->p[i];
		if (p->full + p->n <= at || p->full > at)
			continue; /* sorted by full: a gap shows as no piece starting at or before at */
		int64_t hi = p->full + p->n < end ? p->full + p->n : end;
		RT_CHECK(st_pread(&src->file[p->file[cc]], p->tensor[cc], (p->flat + (at - p->full)) * 4,
				  dst + (at - full), (hi - at) * 4, e));
		at = hi;
	}
	if (at < end)
		return RT_FAIL(e, "checkpoint %s lacks elements [%lld, %lld) of '%s'", dir,
			       (long long)at, (long long)end, ent_name(c, k));
	return 0;
}

int ckpt_load(Ckpt *c, const char *dir, CkptRun *run, char **notes, RtErr *e)
{
	char p[4096];
	*notes = NULL;
	snprintf(p, sizeof p, "%s/%s", dir, CKPT_STATE);
	FILE *f = fopen(p, "rb");
	if (!f)
		return RT_FAIL(e, "cannot read %s: %s", p, strerror(errno));
	char *text = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len + 4096 > cap) {
			cap = cap ? 2 * cap : 65536;
			char *t = cap <= (64u << 20) ? realloc(text, cap) : NULL;
			if (!t) {
				free(text);
				fclose(f);
				return RT_FAIL(e, "%s is too large", p);
			}
			text = t;
		}
		size_t got = fread(text + len, 1, cap - len - 1, f);
		len += got;
		if (got == 0)
			break;
	}
	fclose(f);
	text[len] = '\0';
	cJSON *js = cJSON_Parse(text);
	free(text);
	if (!js || strcmp(jstr(js, "format"), CKPT_FORMAT)) {
		cJSON_Delete(js);
		return RT_FAIL(e, "%s is not a dp checkpoint's state", p);
	}
	if (jnum(js, "version", 0) != CKPT_VERSION) {
		RT_FAIL(e, "%s has checkpoint version %.0f; this dpexec reads version %d", p,
			jnum(js, "version", 0), CKPT_VERSION);
		cJSON_Delete(js);
		return -1;
	}
	int32_t *ck_ent = NULL;
	int nck = 0, rc = check_model(c, dir, js, &ck_ent, &nck, notes, e);
	Source src = {0};
	if (rc == 0)
		rc = open_source(c, dir, js, ck_ent, nck, &src, e);
	for (int cc = 0; rc == 0 && cc < c->ncomp; cc++) {
		/* root by root: read it (what no piece covers keeps its value), fill, write */
		const Seg *sg = c->fill[cc];
		int n = c->nfill[cc];
		Hosts h;
		if ((rc = hosts_read(c, sg, n, &h, e)))
			break;
		for (int j = 0; rc == 0 && j < n; j++)
			rc = read_range(c, &src, sg[j].ent, cc, sg[j].full, sg[j].n,
					host_of(&h, sg[j].root) + sg[j].at, dir, e);
		for (int r = 0; rc == 0 && r < h.n; r++)
			rc = exec_tensor_write(c->x, h.id[r], h.data[r], e);
		hosts_free(&h);
	}
	if (rc == 0) {
		run->step = (uint64_t)jnum(js, "step", 0);
		run->loss = jnum(js, "loss", 0);
		run->train_samples = (int64_t)jnum(js, "train_samples", 0);
	}
	source_free(&src);
	free(ck_ent);
	cJSON_Delete(js);
	if (rc) {
		free(*notes);
		*notes = NULL;
	}
	return rc;
}
