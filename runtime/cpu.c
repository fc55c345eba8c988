/*
 * cpu.c - the CPU compute backend: the readable reference for every kernel.
 *
 * Shapes come from the tensor table. Leading dims are folded into rows: a
 * tensor [a, b, c] is a [a*b, c] matrix. MATMUL and LINEAR call cblas_sgemm;
 * everything else is plain C. Reductions that feed the loss or the gradient
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

int cpu_check(const DpStep *s, const DpInstr *in, RtErr *e)
{
	Chk c = {s, in, e};
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
	case DPK_TANH: {
		OPND(o, -1, DP_F32);
		OPND(a, 0, DP_F32);
		NEED(numel(o) == numel(a), "operands differ in size");
		return 0;
	}
	case DPK_ADD:
	case DPK_MUL:
	case DPK_RELU_GRAD:
	case DPK_GELU_GRAD:
	case DPK_TANH_GRAD: {
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

int cpu_run(const DpStep *s, const DpInstr *in, void *const *ptr, const CpuCtx *ctx, RtErr *e)
{
	const DpTensor *to = in->out >= 0 ? &s->tensors[in->out] : NULL;
	const DpTensor *t0 = in->in[0] >= 0 ? &s->tensors[in->in[0]] : NULL;
	const DpTensor *t1 = in->in[1] >= 0 ? &s->tensors[in->in[1]] : NULL;
	float *o = in->out >= 0 ? ptr[in->out] : NULL;
	const float *a = in->in[0] >= 0 ? ptr[in->in[0]] : NULL;
	const float *b = in->in[1] >= 0 ? ptr[in->in[1]] : NULL;
	int64_t n = to ? numel(to) : 0;

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
		double sum = in->ia[2] ? o[0] : 0;
		for (int64_t i = 0; i < m; i++)
			sum += (double)a[i] * a[i];
		o[0] = (float)sum;
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
	default:
		return RT_FAIL(e, "%s is not a CPU compute kernel", dp_kernel_names[in->op]);
	}
}

void cpu_set_threads(int n)
{
	openblas_set_num_threads(n);
}
