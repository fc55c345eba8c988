/*
 * cpu.c - the CPU compute backend: the readable reference for every kernel.
 *
 * Shapes come from the tensor table. Leading dims are folded into rows: a
 * tensor [a, b, c] is a [a*b, c] matrix. MATMUL, LINEAR and the two products
 * of attention (forward and backward) call cblas_sgemm; everything else is
 * plain C. The row-wise reductions of the transformer ops (layernorm and
 * rmsnorm statistics, softmax sums, their gradients' dot products and the
 * gamma gradients' column sums) accumulate in double too. Reductions that feed the loss or the gradient
 * norm (cross entropy, sqnorm, bias_grad) accumulate in double, so finite
 * differences (--check-grads) and cross-rank comparisons are not drowned in
 * float32 summation noise. The optimizers follow PyTorch 1.13's single-tensor
 * torch.optim.AdamW / SGD formulas, operation for operation.
 *
 * cpu_check validates every operand once at load time; cpu_run trusts it
 * (labels are the one thing only known at run time, and are checked there).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu.h"

static const char *tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

static int64_t numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}

/* [rows, cols] view: the last dim is cols, the rest fold into rows. */
static int64_t cols_of(const DpTensor *t) { return t->ndim ? t->dims[t->ndim - 1] : 1; }
static int64_t rows_of(const DpTensor *t) { return numel(t) / cols_of(t); }

int cpu_is_compute(unsigned op)
{
	switch (op) {
	case DPK_LOAD:
	case DPK_ALL_REDUCE:
	case DPK_REDUCE_SCATTER:
	case DPK_ALL_GATHER:
	case DPK_EVENT_RECORD:
	case DPK_EVENT_WAIT:
	case DPK_INIT:
	case DPK_SAVE:
	case DPK_SHARD:
	case DPK_TP_REDUCE:
		return 0;
	default:
		return op < DPK_COUNT;
	}
}

/* ---- load-time operand checks ---- */

typedef struct {
	const DpStep *s;
	const DpInstr *in;
	RtErr *e;
} Chk;

static int bad(Chk *c, const char *what)
{
	return RT_FAIL(c->e, "step file: %s instruction (out %s, in %s, %s): %s",
		       dp_kernel_names[c->in->op], tname(c->s, c->in->out), tname(c->s, c->in->in[0]),
		       tname(c->s, c->in->in[1]), what);
}

/* Operand k (-1: out) is present and f32 (or i32 when dt says so). */
static const DpTensor *opnd(Chk *c, int k, DpDtype dt)
{
	int id = k < 0 ? c->in->out : c->in->in[k];
	if (id < 0) {
		bad(c, k < 0 ? "missing output" : "missing input");
		return NULL;
	}
	const DpTensor *t = &c->s->tensors[id];
	if (t->dtype != dt) {
		bad(c, "operand has the wrong dtype");
		return NULL;
	}
	return t;
}

static int disjoint(const DpTensor *a, const DpTensor *b)
{
	return a->offset + a->nbytes <= b->offset || b->offset + b->nbytes <= a->offset;
}

#define NEED(cond, msg)                        \
	do {                                   \
		if (!(cond))                   \
			return bad(&c, (msg)); \
	} while (0)
#define OPND(var, k, dt)                     \
	const DpTensor *var = opnd(&c, k, dt); \
	if (!var)                            \
	return -1

/* Output disjoint from every present input. */
static int out_disjoint(Chk *c)
{
	const DpTensor *o = &c->s->tensors[c->in->out];
	for (int k = 0; k < DP_MAX_IN; k++)
		if (c->in->in[k] >= 0 && !disjoint(o, &c->s->tensors[c->in->in[k]]))
			return 0;
	return 1;
}

/* Attention's qkv [B, T, 3C] with heads ia0: fills B, T, C, hd. */
static int qkv_dims(Chk *c, const DpTensor *qkv, int64_t *bt, int64_t *t, int64_t *cc,
		    int64_t *hd)
{
	int64_t h = c->in->ia[0];
	if (qkv->ndim != 3)
		return bad(c, "qkv must be [batch, T, 3*C]");
	if (h < 1 || qkv->dims[2] < 3 * h || qkv->dims[2] % (3 * h) != 0)
		return bad(c, "qkv's last dim does not split into 3 * heads");
	*bt = qkv->dims[0];
	*t = qkv->dims[1];
	*cc = qkv->dims[2] / 3;
	*hd = *cc / h;
	if (*t > INT_MAX || qkv->dims[2] > INT_MAX)
		return bad(c, "sequence too long for BLAS");
	return 0;
}

/* The operand checks of the transformer kernels (cpu_check's cases). */
static int check_transformer(Chk c)
{
	const DpStep *s = c.s;
	const DpInstr *in = c.in;
	switch (in->op) {
	case DPK_EMBEDDING: {
		OPND(o, -1, DP_F32);
		OPND(ids, 0, DP_I32);
		OPND(tab, 1, DP_F32);
		NEED(tab->ndim == 2, "the table must be [vocab, dim]");
		NEED(cols_of(o) == tab->dims[1] && numel(o) == numel(ids) * tab->dims[1],
		     "output shape does not match ids and table");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_EMBEDDING_GRAD: {
		OPND(o, -1, DP_F32);
		OPND(dy, 0, DP_F32);
		OPND(ids, 1, DP_I32);
		if (in->in[2] >= 0) {
			OPND(tab, 2, DP_F32);
			NEED(numel(tab) == numel(o), "output and table differ in size");
		}
		NEED(o->ndim == 2, "the output must be [vocab, dim]");
		NEED(cols_of(dy) == cols_of(o) && numel(dy) == numel(ids) * cols_of(o),
		     "dy shape does not match ids and table");
		NEED(disjoint(o, dy) && disjoint(o, ids), "output overlaps an input");
		return 0;
	}
	case DPK_LAYERNORM:
	case DPK_RMSNORM: {
		OPND(o, -1, DP_F32);
		OPND(x, 0, DP_F32);
		OPND(g, 1, DP_F32);
		NEED(numel(o) == numel(x) && cols_of(o) == cols_of(x), "output and x differ in shape");
		NEED(numel(g) == cols_of(x), "gamma size does not match x's last dim");
		if (in->op == DPK_LAYERNORM) {
			OPND(b, 2, DP_F32);
			NEED(numel(b) == cols_of(x), "beta size does not match x's last dim");
		}
		NEED(in->fa[0] >= 0, "negative eps");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_LAYERNORM_GRAD:
	case DPK_RMSNORM_GRAD: {
		OPND(o, -1, DP_F32);
		OPND(dy, 0, DP_F32);
		OPND(x, 1, DP_F32);
		OPND(g, 2, DP_F32);
		NEED(numel(o) == numel(x) && numel(dy) == numel(x) && cols_of(o) == cols_of(x) &&
		     cols_of(dy) == cols_of(x), "dy, x and output differ in shape");
		NEED(numel(g) == cols_of(x), "gamma size does not match x's last dim");
		NEED(in->fa[0] >= 0, "negative eps");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_LAYERNORM_GRAD_G:
	case DPK_RMSNORM_GRAD_G: {
		OPND(o, -1, DP_F32);
		OPND(dy, 0, DP_F32);
		OPND(x, 1, DP_F32);
		NEED(numel(dy) == numel(x) && cols_of(dy) == cols_of(x), "dy and x differ in shape");
		NEED(numel(o) == cols_of(x), "output size does not match x's last dim");
		NEED(in->fa[0] >= 0, "negative eps");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_SOFTMAX:
	case DPK_SOFTMAX_GRAD: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		NEED(numel(o) == numel(a) && cols_of(o) == cols_of(a), "operands differ in shape");
		if (in->op == DPK_SOFTMAX_GRAD) {
			OPND(y, 1, DP_F32);
			NEED(numel(y) == numel(a) && cols_of(y) == cols_of(a), "dy and y differ in shape");
		}
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_ATTENTION: {
		OPND(o, -1, DP_F32);
		OPND(qkv, 0, DP_F32);
		int64_t b, t, ch, hd;
		RT_CHECK(qkv_dims(&c, qkv, &b, &t, &ch, &hd));
		NEED(numel(o) == b * t * ch && cols_of(o) == ch, "output is not [batch, T, C]");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_ATTENTION_GRAD: {
		OPND(o, -1, DP_F32);
		OPND(dy, 0, DP_F32);
		OPND(qkv, 1, DP_F32);
		int64_t b, t, ch, hd;
		RT_CHECK(qkv_dims(&c, qkv, &b, &t, &ch, &hd));
		NEED(numel(dy) == b * t * ch && cols_of(dy) == ch, "dy is not [batch, T, C]");
		NEED(numel(o) == numel(qkv) && cols_of(o) == 3 * ch, "output is not shaped like qkv");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_ROPE: {
		OPND(o, -1, DP_F32);
		OPND(qkv, 0, DP_F32);
		OPND(cs, 1, DP_F32);
		OPND(sn, 2, DP_F32);
		NEED(qkv->ndim == 3, "qkv must be [batch, T, 3*C]");
		NEED(cs->ndim == 2 && sn->ndim == 2 && cs->dims[0] == sn->dims[0] &&
		     cs->dims[1] == sn->dims[1] && cs->dims[1] >= 1, "cos and sin must be [T, head_dim/2]");
		NEED(qkv->dims[2] % (6 * cs->dims[1]) == 0, "qkv's last dim is not a multiple of 3 * head_dim");
		NEED(qkv->dims[1] <= cs->dims[0], "the rope tables are shorter than T");
		NEED(numel(o) == numel(qkv) && cols_of(o) == cols_of(qkv), "output is not shaped like qkv");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_TRANSPOSE: {
		NEED(in->out >= 0 && in->in[0] >= 0, "missing operand");
		const DpTensor *o = &s->tensors[in->out], *x = &s->tensors[in->in[0]];
		NEED(o->dtype == x->dtype && o->dtype != DP_BF16, "operands differ in dtype (or bf16)");
		NEED(x->ndim >= 2 && o->ndim >= 2 && numel(o) == numel(x) &&
		     o->dims[o->ndim - 1] == x->dims[x->ndim - 2] &&
		     o->dims[o->ndim - 2] == x->dims[x->ndim - 1], "output is not x with its last two dims swapped");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_RESHAPE:
	case DPK_TP_COPY: {
		NEED(in->out >= 0 && in->in[0] >= 0, "missing operand");
		const DpTensor *o = &s->tensors[in->out], *a = &s->tensors[in->in[0]];
		NEED(o->dtype == a->dtype && numel(o) == numel(a), "operands differ in dtype or size");
		return 0;
	}
	case DPK_SPLIT:
	case DPK_SPLIT_GRAD: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		const DpTensor *whole = in->op == DPK_SPLIT ? a : o, *part = in->op == DPK_SPLIT ? o : a;
		NEED(in->ia[0] >= 1 && in->ia[1] >= 0 && in->ia[1] < in->ia[0], "bad part index");
		NEED(cols_of(part) * in->ia[0] == cols_of(whole) && rows_of(part) == rows_of(whole),
		     "operand shapes do not match the split");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	case DPK_INTERLEAVE: {
		NEED(in->out >= 0 && in->in[0] >= 0, "missing operand");
		const DpTensor *o = &s->tensors[in->out], *a = &s->tensors[in->in[0]];
		NEED(o->dtype == a->dtype && o->dtype != DP_BF16 && numel(o) == numel(a),
		     "operands differ in dtype or size (or bf16)");
		NEED(in->ia[0] >= 1 && in->ia[1] >= 0 && in->ia[1] < o->ndim &&
		     o->dims[in->ia[1]] % in->ia[0] == 0, "the split dim does not divide into the parts");
		NEED(out_disjoint(&c), "output overlaps an input");
		return 0;
	}
	default:
		return bad(&c, "not a compute kernel");
	}
}

/* The transformer kernels (issue 4), appended after SHARD in DP_KERNELS,
 * checked and run by check_transformer / run_transformer; SILU and its
 * gradient are elementwise (the main switches), TP_REDUCE is the
 * executor's (a collective). */
static int transformer_op(unsigned op)
{
	return op >= DPK_EMBEDDING && op <= DPK_INTERLEAVE && op != DPK_SILU &&
	       op != DPK_SILU_GRAD && op != DPK_TP_REDUCE;
}

int cpu_check(const DpStep *s, const DpInstr *in, RtErr *e)
{
	Chk c = {s, in, e};
	if (transformer_op(in->op))
		return check_transformer(c);
	switch (in->op) {
	case DPK_NOP:
		return 0;
	case DPK_FILL: {
		NEED(in->out >= 0, "missing output");
		NEED(s->tensors[in->out].dtype != DP_BF16, "bf16 is not supported on the CPU");
		return 0;
	}
	case DPK_COPY: {
		NEED(in->out >= 0 && in->in[0] >= 0, "missing operand");
		const DpTensor *o = &s->tensors[in->out], *a = &s->tensors[in->in[0]];
		NEED(o->dtype == a->dtype && numel(o) == numel(a), "operands differ in dtype or size");
		return 0;
	}
	case DPK_ACCUM:
	case DPK_SCALE:
	case DPK_RELU:
	case DPK_GELU:
	case DPK_TANH:
	case DPK_SILU: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		NEED(numel(o) == numel(a), "operands differ in size");
		return 0;
	}
	case DPK_ADD:
	case DPK_MUL:
	case DPK_RELU_GRAD:
	case DPK_GELU_GRAD:
	case DPK_TANH_GRAD:
	case DPK_SILU_GRAD: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		OPND(b, 1, DP_F32);
		NEED(numel(o) == numel(a) && numel(a) == numel(b), "operands differ in size");
		return 0;
	}
	case DPK_MATMUL: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		OPND(b, 1, DP_F32);
		int64_t m = in->ia[0] ? cols_of(a) : rows_of(a), k = in->ia[0] ? rows_of(a) : cols_of(a);
		int64_t k2 = in->ia[1] ? cols_of(b) : rows_of(b), n = in->ia[1] ? rows_of(b) : cols_of(b);
		NEED(k == k2, "inner dimensions differ");
		NEED(numel(o) == m * n && cols_of(o) == n, "output shape does not match");
		NEED(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "matrix too large for BLAS");
		NEED(disjoint(o, a) && disjoint(o, b), "output overlaps an input");
		return 0;
	}
	case DPK_LINEAR: {
		OPND(o, -1, DP_F32);
		OPND(x, 0, DP_F32);
		OPND(w, 1, DP_F32);
		int64_t k = cols_of(x), n = cols_of(w);
		NEED(rows_of(w) == k, "x and w inner dimensions differ");
		NEED(numel(o) == rows_of(x) * n && cols_of(o) == n, "output shape does not match");
		if (in->in[2] >= 0) {
			OPND(b, 2, DP_F32);
			NEED(numel(b) == n, "bias size does not match");
			NEED(disjoint(o, b), "output overlaps the bias");
		}
		NEED(rows_of(x) <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "matrix too large for BLAS");
		NEED(disjoint(o, x) && disjoint(o, w), "output overlaps an input");
		return 0;
	}
	case DPK_BIAS_ADD: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		OPND(b, 1, DP_F32);
		NEED(numel(o) == numel(a) && numel(a) % numel(b) == 0, "operand sizes do not match");
		return 0;
	}
	case DPK_BIAS_GRAD: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		NEED(numel(a) % numel(o) == 0, "operand sizes do not match");
		NEED(disjoint(o, a), "output overlaps the input");
		return 0;
	}
	case DPK_XENT:
	case DPK_XENT_GRAD:
	case DPK_CORRECT: {
		OPND(o, -1, DP_F32);
		OPND(x, 0, DP_F32);
		OPND(y, 1, DP_I32);
		NEED(numel(y) == rows_of(x), "labels and logits rows differ");
		if (in->op == DPK_XENT_GRAD)
			NEED(numel(o) == numel(x), "output and logits differ in size");
		else
			NEED(numel(o) >= (in->op == DPK_CORRECT ? 2 : 1), "output too small");
		return 0;
	}
	case DPK_SQNORM:
	case DPK_SQRT: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		(void)o;
		(void)a;
		return 0;
	}
	case DPK_CLIP: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		NEED(disjoint(o, a), "the norm lies inside the clipped buffer");
		return 0;
	}
	case DPK_SGD: {
		OPND(p, -1, DP_F32);
		OPND(g, 0, DP_F32);
		NEED(numel(p) == numel(g), "params and grads differ in size");
		if (in->in[1] >= 0) {
			OPND(m, 1, DP_F32);
			NEED(numel(m) == numel(p), "momentum buffer differs in size");
		} else {
			NEED(in->fa[0] == 0, "momentum without a momentum buffer");
		}
		return 0;
	}
	case DPK_ADAMW: {
		OPND(p, -1, DP_F32);
		OPND(g, 0, DP_F32);
		OPND(m, 1, DP_F32);
		OPND(v, 2, DP_F32);
		NEED(numel(p) == numel(g) && numel(m) == numel(p) && numel(v) == numel(p),
		     "params, grads and state differ in size");
		return 0;
	}
	default:
		return bad(&c, "not a compute kernel");
	}
}

/* ---- kernels ---- */

static void sgemm(const float *a, int64_t ra, int64_t ca, int ta, const float *b, int64_t rb,
		  int64_t cb, int tb, float *c, float beta)
{
	int m = (int)(ta ? ca : ra), k = (int)(ta ? ra : ca), n = (int)(tb ? rb : cb);
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
		    n, k, 1.0f, a, (int)ca, b, (int)cb, beta, c, n);
}

static const float gelu_s = 0.7978845608028654f; /* sqrt(2/pi) */

static int xent(const DpStep *s, const DpInstr *in, const float *x, const int32_t *y,
		int64_t rows, int64_t classes, float *out, RtErr *e)
{
	double total = 0;
	double scale = in->fa[0];
	for (int64_t r = 0; r < rows; r++) {
		const float *row = x + r * classes;
		int32_t label = y[r];
		if (label >= classes)
			return RT_FAIL(e, "label %d of row %lld is out of range for %lld classes (%s)",
				       label, (long long)r, (long long)classes, tname(s, in->in[1]));
		if (in->op == DPK_CORRECT) {
			if (label < 0)
				continue;
			int64_t best = 0;
			for (int64_t j = 1; j < classes; j++)
				if (row[j] > row[best])
					best = j;
			out[0] += best == label;
			out[1] += 1;
			continue;
		}
		if (label < 0) {
			if (in->op == DPK_XENT_GRAD)
				memset(out + r * classes, 0, (size_t)classes * sizeof(float));
			continue;
		}
		float mx = row[0];
		for (int64_t j = 1; j < classes; j++)
			mx = row[j] > mx ? row[j] : mx;
		double sum = 0;
		for (int64_t j = 0; j < classes; j++)
			sum += exp((double)row[j] - mx);
		if (in->op == DPK_XENT) {
			total += log(sum) + mx - row[label]; /* -log softmax */
		} else {
			float *d = out + r * classes;
			for (int64_t j = 0; j < classes; j++)
				d[j] = (float)(scale * (exp((double)row[j] - mx) / sum - (j == label)));
		}
	}
	if (in->op == DPK_XENT)
		out[0] = (float)(scale * total);
	return 0;
}

/* ---- transformer kernels ---- */

/* EMBEDDING (grad = 0) or EMBEDDING_GRAD (grad = 1): rows of the table
 * [V, d] gathered by ids, or dy scattered into it. An id outside [0, V) is
 * a run-time error (the ids come from data). */
static int embedding(const DpStep *s, const DpInstr *in, int grad, void *const *ptr, RtErr *e)
{
	int ids_k = grad ? 1 : 0;
	const DpTensor *tt = &s->tensors[grad ? in->out : in->in[1]];
	const DpTensor *ti = &s->tensors[in->in[ids_k]];
	const int32_t *ids = ptr[in->in[ids_k]];
	int64_t v = tt->dims[0], d = tt->dims[1], rows = numel(ti);
	float *o = ptr[in->out];
	if (grad && !in->ia[2])
		memset(o, 0, (size_t)(v * d) * sizeof(float));
	const float *src = ptr[in->in[grad ? 0 : 1]];
	for (int64_t r = 0; r < rows; r++) {
		int32_t id = ids[r];
		if (id < 0 || id >= v)
			return RT_FAIL(e, "token id %d at position %lld of %s is outside the vocabulary "
				       "[0, %lld) of %s", id, (long long)r, tname(s, in->in[ids_k]),
				       (long long)v, tname(s, grad ? in->out : in->in[1]));
		if (!grad) {
			memcpy(o + r * d, src + (int64_t)id * d, (size_t)d * sizeof(float));
		} else {
			float *row = o + (int64_t)id * d;
			const float *g = src + r * d;
			for (int64_t j = 0; j < d; j++)
				row[j] += g[j];
		}
	}
	return 0;
}

/* Mean and 1/sqrt(var + eps) of one row, in double (two passes: no cancellation). */
static void row_stats(const float *x, int64_t c, double eps, double *mean, double *rstd)
{
	double m = 0, v = 0;
	for (int64_t j = 0; j < c; j++)
		m += x[j];
	m /= (double)c;
	for (int64_t j = 0; j < c; j++)
		v += ((double)x[j] - m) * ((double)x[j] - m);
	*mean = m;
	*rstd = 1.0 / sqrt(v / (double)c + eps);
}

/* 1/sqrt(mean(x^2) + eps) of one row. */
static double row_rrms(const float *x, int64_t c, double eps)
{
	double q = 0;
	for (int64_t j = 0; j < c; j++)
		q += (double)x[j] * x[j];
	return 1.0 / sqrt(q / (double)c + eps);
}

/* LAYERNORM and RMSNORM forward (rms: no mean, no beta). */
static void norm_fwd(int rms, const float *x, const float *g, const float *b, int64_t rows,
		     int64_t c, double eps, float *o)
{
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * c;
		float *orow = o + r * c;
		double mean = 0, rstd;
		if (rms)
			rstd = row_rrms(xr, c, eps);
		else
			row_stats(xr, c, eps, &mean, &rstd);
		for (int64_t j = 0; j < c; j++) {
			float xh = (float)(((double)xr[j] - mean) * rstd);
			orow[j] = rms ? xh * g[j] : xh * g[j] + b[j];
		}
	}
}

/*
 * dx of the norms, per row with xhat = (x - mean) * rstd and gd = dy * g:
 *   layernorm: dx = rstd * (gd - mean(gd) - xhat * mean(gd * xhat))
 *   rmsnorm:   dx = rrms * (gd - xhat * mean(gd * xhat)),  xhat = x * rrms
 */
static void norm_bwd(int rms, const float *dy, const float *x, const float *g, int64_t rows,
		     int64_t c, double eps, float *o)
{
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * c, *dr = dy + r * c;
		float *orow = o + r * c;
		double mean = 0, rstd, sg = 0, sgx = 0;
		if (rms)
			rstd = row_rrms(xr, c, eps);
		else
			row_stats(xr, c, eps, &mean, &rstd);
		for (int64_t j = 0; j < c; j++) {
			double gd = (double)dr[j] * g[j];
			sg += gd;
			sgx += gd * ((double)xr[j] - mean) * rstd;
		}
		sg = rms ? 0 : sg / (double)c;
		sgx /= (double)c;
		for (int64_t j = 0; j < c; j++) {
			double xh = ((double)xr[j] - mean) * rstd;
			orow[j] = (float)(rstd * ((double)dr[j] * g[j] - sg - xh * sgx));
		}
	}
}

/* d gamma of the norms: column sums of dy * xhat, in double; + out when acc. */
static int norm_grad_g(int rms, const float *dy, const float *x, int64_t rows, int64_t c,
		       double eps, int acc, float *o, RtErr *e)
{
	double *sum = calloc((size_t)c, sizeof(double));
	if (!sum)
		return RT_FAIL(e, "out of memory (norm gradient of %lld channels)", (long long)c);
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * c, *dr = dy + r * c;
		double mean = 0, rstd;
		if (rms)
			rstd = row_rrms(xr, c, eps);
		else
			row_stats(xr, c, eps, &mean, &rstd);
		for (int64_t j = 0; j < c; j++)
			sum[j] += (double)dr[j] * (((double)xr[j] - mean) * rstd);
	}
	for (int64_t j = 0; j < c; j++)
		o[j] = (float)(acc ? o[j] + sum[j] : sum[j]);
	free(sum);
	return 0;
}

/* softmax over rows of c, in place in o (o already holds the scores): masked
 * entries j >= valid become 0. The sum is in double. */
static void softmax_row(float *o, int64_t c, int64_t valid)
{
	float mx = o[0];
	for (int64_t j = 1; j < valid; j++)
		mx = o[j] > mx ? o[j] : mx;
	double sum = 0;
	for (int64_t j = 0; j < valid; j++) {
		o[j] = expf(o[j] - mx);
		sum += o[j];
	}
	float inv = (float)(1.0 / sum);
	for (int64_t j = 0; j < valid; j++)
		o[j] *= inv;
	for (int64_t j = valid; j < c; j++)
		o[j] = 0;
}

/*
 * Causal multi-head attention. qkv [B, T, 3C]: head h's q, k, v are the
 * columns [3hd*h, 3hd*h + hd), [+hd, +2hd), [+2hd, +3hd) of each row (row
 * stride 3C); out [B, T, C] has head h at columns [hd*h, hd*(h+1)).
 * Per (b, h), query rows go in blocks of ATT_BLOCK: S = scale * Q_blk K^T
 * against the keys up to the block's last row (causal: the rest are masked
 * anyway, so about half of the T x T work is skipped), softmax with the mask,
 * O_blk = P V. Both products are cblas_sgemm on strided views.
 *
 * The backward recomputes P per block (nothing is saved) and, with
 * dS = P * (dP - rowsum(P * dP)):  dV += P^T dO,  dP = dO V^T,
 * dQ = scale * dS K,  dK += scale * dS^T Q.
 */
#define ATT_BLOCK 64

static void att_scores(const float *q, const float *k, int ld, int mb, int n, int hd,
		       float scale, int64_t r0, float *p)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, n, hd, scale, q, ld, k, ld, 0.0f,
		    p, n);
	for (int i = 0; i < mb; i++)
		softmax_row(p + (int64_t)i * n, n, r0 + i + 1);
}

static int attention(const DpStep *s, const DpInstr *in, void *const *ptr, RtErr *e)
{
	int grad = in->op == DPK_ATTENTION_GRAD;
	const DpTensor *tq = &s->tensors[in->in[grad ? 1 : 0]];
	int64_t bsz = tq->dims[0], t = tq->dims[1], heads = in->ia[0];
	int ld = (int)tq->dims[2], c = ld / 3, hd = c / (int)heads;
	float scale = (float)(1.0 / sqrt((double)hd));
	const float *qkv = ptr[in->in[grad ? 1 : 0]];
	const float *dy = grad ? ptr[in->in[0]] : NULL;
	float *o = ptr[in->out];
	int64_t bl = t < ATT_BLOCK ? t : ATT_BLOCK;
	if (bsz == 0 || t == 0)
		return 0;
	float *p = malloc((size_t)(bl * t) * sizeof(float) * (grad ? 2 : 1));
	if (!p)
		return RT_FAIL(e, "out of memory (attention scores of %lld positions)", (long long)t);
	float *dp = grad ? p + bl * t : NULL;
	if (grad)
		memset(o, 0, (size_t)(bsz * t * ld) * sizeof(float));
	for (int64_t b = 0; b < bsz; b++)
		for (int64_t h = 0; h < heads; h++) {
			const float *q = qkv + b * t * ld + 3 * hd * h, *k = q + hd, *v = q + 2 * hd;
			for (int64_t r0 = 0; r0 < t; r0 += bl) {
				int mb = (int)(t - r0 < bl ? t - r0 : bl), n = (int)(r0 + mb);
				const float *qb = q + r0 * ld;
				att_scores(qb, k, ld, mb, n, hd, scale, r0, p);
				if (!grad) {
					float *ob = o + b * t * c + hd * h + r0 * c;
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, hd, n,
						    1.0f, p, n, v, ld, 0.0f, ob, c);
					continue;
				}
				const float *dob = dy + b * t * c + hd * h + r0 * c;
				float *dq = o + b * t * ld + 3 * hd * h, *dk = dq + hd, *dv = dq + 2 * hd;
				/* dV[0:n] += P^T dO_blk */
				cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, mb, 1.0f, p, n,
					    dob, c, 1.0f, dv, ld);
				/* dP = dO_blk V[0:n]^T */
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, n, hd, 1.0f, dob,
					    c, v, ld, 0.0f, dp, n);
				/* dS = P * (dP - rowsum(P * dP)); masked P are 0, so dS is too */
				for (int i = 0; i < mb; i++) {
					float *pr = p + (int64_t)i * n, *dr = dp + (int64_t)i * n;
					int64_t valid = r0 + i + 1;
					double dot = 0;
					for (int64_t j = 0; j < valid; j++)
						dot += (double)pr[j] * dr[j];
					for (int64_t j = 0; j < n; j++)
						dr[j] = pr[j] * (dr[j] - (float)dot);
				}
				/* dQ_blk = scale * dS K[0:n]; dK[0:n] += scale * dS^T Q_blk */
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, hd, n, scale, dp,
					    n, k, ld, 0.0f, dq + r0 * ld, ld);
				cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, mb, scale, dp,
					    n, qb, ld, 1.0f, dk, ld);
			}
		}
	free(p);
	return 0;
}

/*
 * Rotary embedding, rotate-half form: in each head's q and k (hd = 2*half
 * columns), element j < half pairs with j + half at position t:
 *   out[j]        = x[j] * cos[t, j] - x[j + half] * sin[t, j]
 *   out[j + half] = x[j + half] * cos[t, j] + x[j] * sin[t, j]
 * (HF Llama: x * cos + rotate_half(x) * sin). v is copied. inverse: sin
 * negated, the transpose of the rotation (its gradient).
 */
static void rope(const DpStep *s, const DpInstr *in, void *const *ptr)
{
	const DpTensor *tq = &s->tensors[in->in[0]], *tc = &s->tensors[in->in[1]];
	int64_t bsz = tq->dims[0], t = tq->dims[1], ld = tq->dims[2], half = tc->dims[1];
	int64_t hd = 2 * half, heads = ld / (3 * hd);
	const float *x = ptr[in->in[0]], *cs = ptr[in->in[1]], *sn = ptr[in->in[2]];
	float *o = ptr[in->out];
	float sign = in->ia[0] ? -1.0f : 1.0f;
	for (int64_t b = 0; b < bsz; b++)
		for (int64_t p = 0; p < t; p++) {
			const float *xr = x + (b * t + p) * ld, *cr = cs + p * half, *sr = sn + p * half;
			float *orow = o + (b * t + p) * ld;
			for (int64_t h = 0; h < heads; h++)
				for (int part = 0; part < 3; part++) {
					int64_t base = 3 * hd * h + part * hd;
					const float *xi = xr + base;
					float *oi = orow + base;
					if (part == 2) {
						memcpy(oi, xi, (size_t)hd * sizeof(float));
						continue;
					}
					for (int64_t j = 0; j < half; j++) {
						float c = cr[j], sv = sign * sr[j], x1 = xi[j], x2 = xi[j + half];
						oi[j] = x1 * c - x2 * sv;
						oi[j + half] = x2 * c + x1 * sv;
					}
				}
		}
}

/* [.., r, c] -> [.., c, r] for 4-byte elements, in tiles for the cache. */
static void transpose(const uint32_t *x, int64_t batch, int64_t r, int64_t c, uint32_t *o)
{
	enum { TILE = 32 };
	for (int64_t b = 0; b < batch; b++, x += r * c, o += r * c)
		for (int64_t i0 = 0; i0 < r; i0 += TILE)
			for (int64_t j0 = 0; j0 < c; j0 += TILE) {
				int64_t i1 = i0 + TILE < r ? i0 + TILE : r, j1 = j0 + TILE < c ? j0 + TILE : c;
				for (int64_t i = i0; i < i1; i++)
					for (int64_t j = j0; j < j1; j++)
						o[j * r + i] = x[i * c + j];
			}
}

/* in0 [parts][outer][s][inner] -> out [outer][parts*s][inner] (4-byte elements). */
static void interleave(const DpStep *s, const DpInstr *in, void *const *ptr)
{
	const DpTensor *to = &s->tensors[in->out];
	int64_t parts = in->ia[0], dim = in->ia[1], outer = 1, inner = 1;
	for (int64_t i = 0; i < dim; i++)
		outer *= to->dims[i];
	for (int64_t i = dim + 1; i < to->ndim; i++)
		inner *= to->dims[i];
	int64_t sp = to->dims[dim] / parts, blk = sp * inner;
	const uint32_t *x = ptr[in->in[0]];
	uint32_t *o = ptr[in->out];
	for (int64_t p = 0; p < parts; p++)
		for (int64_t u = 0; u < outer; u++)
			memcpy(o + (u * parts + p) * blk, x + (p * outer + u) * blk,
			       (size_t)blk * sizeof(uint32_t));
}

/* The transformer kernels (cpu_run's cases). */
static int run_transformer(const DpStep *s, const DpInstr *in, void *const *ptr, RtErr *e)
{
	const DpTensor *to = &s->tensors[in->out], *t0 = &s->tensors[in->in[0]];
	float *o = ptr[in->out];
	const float *a = ptr[in->in[0]];
	const float *b = in->in[1] >= 0 ? ptr[in->in[1]] : NULL;
	const float *c2 = in->in[2] >= 0 ? ptr[in->in[2]] : NULL;
	int64_t n = numel(to), cols = cols_of(t0), rows = numel(t0) / (cols ? cols : 1);
	double eps = in->fa[0];
	switch (in->op) {
	case DPK_EMBEDDING:
		return embedding(s, in, 0, ptr, e);
	case DPK_EMBEDDING_GRAD:
		return embedding(s, in, 1, ptr, e);
	case DPK_LAYERNORM:
	case DPK_RMSNORM:
		norm_fwd(in->op == DPK_RMSNORM, a, b, c2, rows, cols, eps, o);
		return 0;
	case DPK_LAYERNORM_GRAD:
	case DPK_RMSNORM_GRAD:
		norm_bwd(in->op == DPK_RMSNORM_GRAD, a, b, c2, rows, cols, eps, o);
		return 0;
	case DPK_LAYERNORM_GRAD_G:
	case DPK_RMSNORM_GRAD_G:
		return norm_grad_g(in->op == DPK_RMSNORM_GRAD_G, a, b, rows, cols, eps, in->ia[2] != 0,
				   o, e);
	case DPK_SOFTMAX:
		for (int64_t r = 0; r < rows; r++) {
			memcpy(o + r * cols, a + r * cols, (size_t)cols * sizeof(float));
			softmax_row(o + r * cols, cols, cols);
		}
		return 0;
	case DPK_SOFTMAX_GRAD:
		for (int64_t r = 0; r < rows; r++) {
			const float *dr = a + r * cols, *yr = b + r * cols;
			double dot = 0;
			for (int64_t j = 0; j < cols; j++)
				dot += (double)dr[j] * yr[j];
			for (int64_t j = 0; j < cols; j++)
				o[r * cols + j] = (float)(yr[j] * (dr[j] - dot));
		}
		return 0;
	case DPK_ATTENTION:
	case DPK_ATTENTION_GRAD:
		return attention(s, in, ptr, e);
	case DPK_ROPE:
		rope(s, in, ptr);
		return 0;
	case DPK_TRANSPOSE: {
		int64_t r = t0->dims[t0->ndim - 2], c = t0->dims[t0->ndim - 1], rc = r * c;
		transpose(ptr[in->in[0]], rc ? n / rc : 0, r, c, ptr[in->out]);
		return 0;
	}
	case DPK_RESHAPE:
	case DPK_TP_COPY:
		memmove(ptr[in->out], ptr[in->in[0]], (size_t)n * (to->dtype == DP_BF16 ? 2 : 4));
		return 0;
	case DPK_SPLIT: {
		int64_t cs = cols / in->ia[0];
		for (int64_t r = 0; r < rows; r++)
			memcpy(o + r * cs, a + r * cols + in->ia[1] * cs, (size_t)cs * sizeof(float));
		return 0;
	}
	case DPK_SPLIT_GRAD: {
		int64_t cw = cols * in->ia[0];
		memset(o, 0, (size_t)n * sizeof(float));
		for (int64_t r = 0; r < rows; r++)
			memcpy(o + r * cw + in->ia[1] * cols, a + r * cols, (size_t)cols * sizeof(float));
		return 0;
	}
	case DPK_INTERLEAVE:
		interleave(s, in, ptr);
		return 0;
	default:
		return RT_FAIL(e, "%s is not a CPU compute kernel", dp_kernel_names[in->op]);
	}
}

int cpu_run(const DpStep *s, const DpInstr *in, void *const *ptr, const CpuCtx *ctx, RtErr *e)
{
	const DpTensor *to = in->out >= 0 ? &s->tensors[in->out] : NULL;
	const DpTensor *t0 = in->in[0] >= 0 ? &s->tensors[in->in[0]] : NULL;
	const DpTensor *t1 = in->in[1] >= 0 ? &s->tensors[in->in[1]] : NULL;
	float *o = in->out >= 0 ? ptr[in->out] : NULL;
	const float *a = in->in[0] >= 0 ? ptr[in->in[0]] : NULL;
	const float *b = in->in[1] >= 0 ? ptr[in->in[1]] : NULL;
	int64_t n = to ? numel(to) : 0;

	if (transformer_op(in->op))
		return run_transformer(s, in, ptr, e);
	switch (in->op) {
	case DPK_NOP:
		return 0;
	case DPK_FILL:
		if (to->dtype == DP_I32) {
			int32_t *oi = ptr[in->out];
			for (int64_t i = 0; i < n; i++)
				oi[i] = (int32_t)in->fa[0];
		} else if (in->fa[0] == 0) {
			memset(o, 0, (size_t)n * sizeof(float));
		} else {
			for (int64_t i = 0; i < n; i++)
				o[i] = in->fa[0];
		}
		return 0;
	case DPK_COPY:
		memmove(o, a, (size_t)n * (to->dtype == DP_BF16 ? 2 : 4));
		return 0;
	case DPK_ACCUM:
		for (int64_t i = 0; i < n; i++)
			o[i] += a[i];
		return 0;
	case DPK_SCALE:
		for (int64_t i = 0; i < n; i++)
			o[i] = in->fa[0] * a[i];
		return 0;
	case DPK_ADD:
		for (int64_t i = 0; i < n; i++)
			o[i] = a[i] + b[i];
		return 0;
	case DPK_MUL:
		for (int64_t i = 0; i < n; i++)
			o[i] = a[i] * b[i];
		return 0;
	case DPK_RELU:
		for (int64_t i = 0; i < n; i++)
			o[i] = a[i] > 0 ? a[i] : 0;
		return 0;
	case DPK_RELU_GRAD:
		for (int64_t i = 0; i < n; i++)
			o[i] = b[i] > 0 ? a[i] : 0;
		return 0;
	case DPK_GELU:
		for (int64_t i = 0; i < n; i++) {
			float x = a[i];
			o[i] = 0.5f * x * (1.0f + tanhf(gelu_s * (x + 0.044715f * x * x * x)));
		}
		return 0;
	case DPK_GELU_GRAD:
		for (int64_t i = 0; i < n; i++) {
			float x = b[i];
			float th = tanhf(gelu_s * (x + 0.044715f * x * x * x));
			float du = gelu_s * (1.0f + 3.0f * 0.044715f * x * x);
			o[i] = a[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
		}
		return 0;
	case DPK_TANH:
		for (int64_t i = 0; i < n; i++)
			o[i] = tanhf(a[i]);
		return 0;
	case DPK_TANH_GRAD:
		for (int64_t i = 0; i < n; i++)
			o[i] = a[i] * (1.0f - b[i] * b[i]);
		return 0;
	case DPK_MATMUL:
		sgemm(a, rows_of(t0), cols_of(t0), in->ia[0] != 0, b, rows_of(t1), cols_of(t1),
		      in->ia[1] != 0, o, in->ia[2] ? 1.0f : 0.0f);
		return 0;
	case DPK_LINEAR: {
		int64_t rows = rows_of(t0), cols = cols_of(to);
		float beta = 0;
		if (in->in[2] >= 0) {
			const float *bias = ptr[in->in[2]];
			for (int64_t r = 0; r < rows; r++)
				memcpy(o + r * cols, bias, (size_t)cols * sizeof(float));
			beta = 1;
		}
		sgemm(a, rows, cols_of(t0), 0, b, rows_of(t1), cols_of(t1), 0, o, beta);
		return 0;
	}
	case DPK_BIAS_ADD: {
		int64_t c = numel(t1);
		for (int64_t i = 0; i < n; i++)
			o[i] = a[i] + b[i % c];
		return 0;
	}
	case DPK_BIAS_GRAD: {
		int64_t c = n, rows = numel(t0) / c;
		for (int64_t j = 0; j < c; j++) {
			double sum = in->ia[2] ? o[j] : 0;
			for (int64_t r = 0; r < rows; r++)
				sum += a[r * c + j];
			o[j] = (float)sum;
		}
		return 0;
	}
	case DPK_XENT:
	case DPK_XENT_GRAD:
	case DPK_CORRECT:
		if (in->op == DPK_CORRECT)
			o[0] = o[1] = 0;
		return xent(s, in, a, ptr[in->in[1]], rows_of(t0), cols_of(t0), o, e);
	case DPK_SQNORM: {
		int64_t m = numel(t0);
		double sum = 0, w = in->fa[0] != 0 ? in->fa[0] : 1.0; /* tp weight, 0 = 1 */
		for (int64_t i = 0; i < m; i++)
			sum += (double)a[i] * a[i];
		o[0] = (float)((in->ia[2] ? o[0] : 0) + w * sum);
		return 0;
	}
	case DPK_SQRT:
		o[0] = sqrtf(a[0]);
		return 0;
	case DPK_CLIP: {
		/* torch.nn.utils.clip_grad_norm_: scale only when the coefficient is < 1 */
		float coef = in->fa[0] / (a[0] + 1e-6f);
		if (coef < 1.0f)
			for (int64_t i = 0; i < n; i++)
				o[i] *= coef;
		return 0;
	}
	case DPK_SGD: {
		/* torch.optim.SGD (1.13), dampening 0, nesterov off:
		 * g += wd*p; buf = g (first step) or momentum*buf + g; p -= lr*buf */
		float lr = ctx->lr, mom = in->fa[0], wd = in->fa[1];
		float *buf = in->in[1] >= 0 ? ptr[in->in[1]] : NULL;
		for (int64_t i = 0; i < n; i++) {
			float g = a[i];
			if (wd != 0)
				g = g + wd * o[i];
			if (mom != 0) {
				buf[i] = ctx->t <= 1 ? g : mom * buf[i] + g;
				g = buf[i];
			}
			o[i] = o[i] - lr * g;
		}
		return 0;
	}
	case DPK_ADAMW: {
		/* torch.optim.AdamW (1.13, single tensor): scalars in double as Python
		 * computes them, tensor arithmetic in float in the same order */
		const DpOptim *op = ctx->opt;
		double lr = ctx->lr, b1 = op->beta1, b2 = op->beta2;
		float decay = (float)(1.0 - lr * op->weight_decay);
		float one_b1 = (float)(1.0 - b1), one_b2 = (float)(1.0 - b2);
		double bc1 = 1.0 - pow(b1, (double)ctx->t), bc2 = 1.0 - pow(b2, (double)ctx->t);
		float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
		float beta1 = op->beta1, beta2 = op->beta2, eps = op->eps;
		float *m = ptr[in->in[1]], *v = ptr[in->in[2]];
		for (int64_t i = 0; i < n; i++) {
			float g = a[i];
			o[i] *= decay;
			m[i] = m[i] * beta1 + one_b1 * g;
			v[i] = v[i] * beta2 + one_b2 * (g * g);
			float denom = sqrtf(v[i]) / bc2_sqrt + eps;
			o[i] += (-step_size * m[i]) / denom;
		}
		return 0;
	}
	case DPK_SILU:
		for (int64_t i = 0; i < n; i++)
			o[i] = a[i] / (1.0f + expf(-a[i]));
		return 0;
	case DPK_SILU_GRAD:
		/* silu'(x) = sig(x) * (1 + x * (1 - sig(x))) */
		for (int64_t i = 0; i < n; i++) {
			float x = b[i], sg = 1.0f / (1.0f + expf(-x));
			o[i] = a[i] * sg * (1.0f + x * (1.0f - sg));
		}
		return 0;
	default:
		return RT_FAIL(e, "%s is not a CPU compute kernel", dp_kernel_names[in->op]);
	}
}

void cpu_set_threads(int n)
{
	openblas_set_num_threads(n);
}
