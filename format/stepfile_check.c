/*
 * stepfile_check.c - the operand rules of the ops (DpOperandRule, the RULE
 * column of format/ops.def), checked by the step-file decoder on every
 * instruction of a compute op.
 *
 * These are the ops' contracts, not any backend's: operands present, dtypes,
 * element counts that match the shapes the kernel derives, and outputs
 * disjoint from inputs where a kernel cannot work in place. After the decoder
 * accepts a file, every backend may run any instruction without reading or
 * writing outside a tensor; a backend checks only its own limits (BLAS int
 * ranges, dtypes it cannot compute). Labels and token ids are the one thing
 * only known at run time, and kernels check them there.
 *
 * Shapes fold to [rows, cols]: the last dim is cols, the rest fold into rows.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>

#include "stepfile.h"

typedef struct {
	const DpStep *s;
	const DpInstr *in;
	const char *what; /* "step program, instruction 12 (matmul)" */
	char *err;
	size_t errlen;
} Chk;

static const char *tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

static int64_t cols_of(const DpTensor *t)
{
	return t->ndim ? t->dims[t->ndim - 1] : 1;
}

static int64_t rows_of(const DpTensor *t)
{
	return dp_numel(t) / cols_of(t);
}

__attribute__((format(printf, 2, 3))) static int bad(Chk *c, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	snprintf(c->err, c->errlen, "%s (out %s, in %s, %s): %s", c->what, tname(c->s, c->in->out),
		 tname(c->s, c->in->in[0]), tname(c->s, c->in->in[1]), msg);
	return -1;
}

/* Operand k (-1: out): present, and of dtype dt unless dt < 0 (the rule's
 * dtypes are checked first, by check_dtypes). NULL after reporting. */
static const DpTensor *opnd(Chk *c, int k, int dt)
{
	int id = k < 0 ? c->in->out : c->in->in[k];
	if (id < 0) {
		if (k < 0)
			bad(c, "missing output");
		else
			bad(c, "missing input %d", k);
		return NULL;
	}
	const DpTensor *t = &c->s->tensors[id];
	if (dt >= 0 && t->dtype != dt) {
		if (k < 0)
			bad(c, "the output '%s' is %s, not %s", tname(c->s, id),
			    dp_name(dp_dtype_names, DP_NDTYPE, t->dtype), dp_dtype_names[dt]);
		else
			bad(c, "input %d '%s' is %s, not %s", k, tname(c->s, id),
			    dp_name(dp_dtype_names, DP_NDTYPE, t->dtype), dp_dtype_names[dt]);
		return NULL;
	}
	return t;
}

/* ---- operand dtypes ---- */

#define CD DP_OD_CD
#define CDF DP_OD_CDF
#define FL DP_OD_FLOAT
#define F32 DP_OD_F32
#define HLF DP_OD_HALF
#define I32 DP_OD_I32
/* out, in0, in1, in2, in3 (DpOperandDtype; 0: none or the rule's own check) */
const unsigned char dp_rule_dtypes[DP_NOR][1 + DP_MAX_IN] = {
	[DP_OR_UNARY] = {CD, CD},
	[DP_OR_BINARY] = {CD, CD, CD},
	[DP_OR_MATMUL] = {CDF, CD, CD},
	[DP_OR_LINEAR] = {CD, CD, CD, CD},
	[DP_OR_BIAS_ADD] = {CD, CD, CD},
	[DP_OR_BIAS_GRAD] = {CDF, CD},
	[DP_OR_XENT] = {F32, FL, I32},
	[DP_OR_XENT_GRAD] = {CD, CD, I32},
	[DP_OR_CORRECT] = {F32, FL, I32},
	[DP_OR_SCALAR] = {F32, FL},
	[DP_OR_CLIP] = {FL, F32},
	[DP_OR_SGD] = {F32, FL, F32, HLF},
	[DP_OR_ADAMW] = {F32, FL, F32, F32, HLF},
	[DP_OR_EMBEDDING] = {CD, I32, CD},
	[DP_OR_EMBEDDING_GRAD] = {CDF, CD, I32, FL},
	[DP_OR_NORM_AFFINE] = {CD, CD, CD, CD},
	[DP_OR_NORM_SCALE] = {CD, CD, CD},
	[DP_OR_NORM_GRAD] = {CD, CD, CD, CD},
	[DP_OR_NORM_GRAD_G] = {CDF, CD, CD},
	[DP_OR_SOFTMAX] = {CD, CD},
	[DP_OR_SOFTMAX_GRAD] = {CD, CD, CD},
	[DP_OR_ATTENTION] = {CD, CD},
	[DP_OR_ATTENTION_GRAD] = {CD, CD, CD},
	[DP_OR_ROPE] = {CD, CD, CD, CD},
	[DP_OR_SPLIT] = {CD, CD},
	[DP_OR_SPLIT_GRAD] = {CD, CD},
	[DP_OR_KV_PACK] = {CD, CD},
	[DP_OR_KV_UNPACK] = {CD, CD},
	[DP_OR_ATTENTION_CP] = {CD, CD, CD, I32},
	[DP_OR_ATTENTION_CP_GRAD] = {CD, CD, CD, CD, I32},
	[DP_OR_ATTENTION_CP_GRAD_KV] = {CD, CD, CD, CD, I32},
	[DP_OR_ACCUM] = {FL, FL},
	[DP_OR_CAST] = {FL, FL},
	[DP_OR_DROPOUT] = {CD, CD, I32, I32},
	[DP_OR_LINEAR_GELU] = {CD, CD, CD, CD},
	[DP_OR_MATMUL_GELU_GRAD] = {CD, CD, CD, CD},
	[DP_OR_ORTHOGONALIZE] = {F32},
	[DP_OR_FLAG] = {0, F32},
	[DP_OR_ADD_NORM] = {CD, CD, CD, CD, CD},
	[DP_OR_NORM_GRAD_ADD] = {CD, CD, CD, CD, CD},
	[DP_OR_ADD_NORM_SCALE] = {CD, CD, CD, CD},
	[DP_OR_ATTENTION_CP_GRAD_BOTH] = {CD, CD, CD, CD, I32},
	[DP_OR_PAD_ROWS] = {CD, CD},
	[DP_OR_NORM_GRAD_GB] = {CDF, CD, CD},
};
#undef CD
#undef CDF
#undef FL
#undef F32
#undef HLF
#undef I32

static const char *operand_name(int k, char *buf, size_t len)
{
	if (k < 0)
		snprintf(buf, len, "the output");
	else
		snprintf(buf, len, "input %d", k);
	return buf;
}

/* Every present operand has a dtype its rule allows (dp_rule_dtypes). */
static int check_dtypes(Chk *c, int rule)
{
	const unsigned char *od = dp_rule_dtypes[rule];
	int cd = -1, cd_at = 0; /* the compute dtype and the operand it comes from */
	for (int j = 1; j <= DP_MAX_IN + 1 && cd < 0; j++) {
		int k = j <= DP_MAX_IN ? j - 1 : -1, id = k < 0 ? c->in->out : c->in->in[k];
		if (id >= 0 && od[k + 1] == DP_OD_CD)
			cd = c->s->tensors[id].dtype, cd_at = k;
	}
	for (int k = -1; k < DP_MAX_IN; k++) {
		int id = k < 0 ? c->in->out : c->in->in[k];
		if (id < 0 || od[k + 1] == DP_OD_NONE)
			continue;
		int dt = c->s->tensors[id].dtype, ok = 0;
		const char *want = "";
		switch ((DpOperandDtype)od[k + 1]) {
		case DP_OD_NONE:
			ok = 1;
			break;
		case DP_OD_CD:
			ok = (dt == DP_F32 || dp_is_half(dt)) && dt == cd;
			break;
		case DP_OD_CDF:
			ok = dt == DP_F32 || (dp_is_half(dt) && dt == cd);
			break;
		case DP_OD_FLOAT:
			ok = dt == DP_F32 || dp_is_half(dt);
			want = "f32, bf16 or f16";
			break;
		case DP_OD_F32:
			ok = dt == DP_F32;
			want = "f32";
			break;
		case DP_OD_HALF:
			ok = dp_is_half(dt);
			want = "bf16 or f16";
			break;
		case DP_OD_I32:
			ok = dt == DP_I32;
			want = "i32";
			break;
		}
		if (!ok) {
			char who[32];
			int fl = dt == DP_F32 || dp_is_half(dt);
			if (!fl && (od[k + 1] == DP_OD_CD || od[k + 1] == DP_OD_CDF))
				want = "f32, bf16 or f16";
			else if (od[k + 1] == DP_OD_CD || od[k + 1] == DP_OD_CDF)
				return bad(c, "%s '%s' is %s, not the compute dtype %s (%s's)",
					   operand_name(k, who, sizeof who), tname(c->s, id),
					   dp_name(dp_dtype_names, DP_NDTYPE, (unsigned)dt),
					   dp_name(dp_dtype_names, DP_NDTYPE, (unsigned)cd),
					   tname(c->s, cd_at < 0 ? c->in->out : c->in->in[cd_at]));
			return bad(c, "%s '%s' is %s, not %s", operand_name(k, who, sizeof who),
				   tname(c->s, id), dp_name(dp_dtype_names, DP_NDTYPE, (unsigned)dt), want);
		}
	}
	/* a backend stages an instruction's 16-bit operands in one conversion */
	unsigned halves = 0;
	for (int k = -1; k < DP_MAX_IN; k++) {
		int id = k < 0 ? c->in->out : c->in->in[k];
		if (id >= 0 && dp_is_half(c->s->tensors[id].dtype))
			halves |= 1u << c->s->tensors[id].dtype;
	}
	if (halves == (1u << DP_BF16 | 1u << DP_F16))
		return bad(c, "mixes bf16 and f16 operands");
	return 0;
}

static int disjoint(const DpTensor *a, const DpTensor *b)
{
	return a->offset + a->nbytes <= b->offset || b->offset + b->nbytes <= a->offset;
}

/* The output is disjoint from every present input. */
static int out_disjoint(Chk *c)
{
	const DpTensor *o = &c->s->tensors[c->in->out];
	for (int k = 0; k < DP_MAX_IN; k++)
		if (c->in->in[k] >= 0 && !disjoint(o, &c->s->tensors[c->in->in[k]]))
			return 0;
	return 1;
}

#define NEED(cond, ...)                               \
	do {                                          \
		if (!(cond))                          \
			return bad(c, __VA_ARGS__);   \
	} while (0)
#define OPND(var, k, dt)                            \
	const DpTensor *var = opnd(c, (k), (dt));   \
	if (!var)                                   \
	return -1
#define DISJOINT() NEED(out_disjoint(c), "the output overlaps an input")

/* Attention's qkv [B, T, 3C] with `heads` heads: fills B, T, C. */
static int qkv_dims(Chk *c, const DpTensor *qkv, int64_t *b, int64_t *t, int64_t *ch)
{
	int64_t h = DP_ATTR(c->in, ATTENTION, heads);
	NEED(qkv->ndim == 3, "qkv must be [batch, T, 3*C]");
	NEED(h >= 1 && h <= INT_MAX && qkv->dims[2] >= 3 * h && qkv->dims[2] % (3 * h) == 0,
	     "qkv's last dim %lld does not split into 3 * %lld heads", (long long)qkv->dims[2],
	     (long long)h);
	*b = qkv->dims[0];
	*t = qkv->dims[1];
	*ch = qkv->dims[2] / 3;
	return 0;
}

static int check_elementwise(Chk *c, int rule)
{
	const DpInstr *in = c->in;
	switch (rule) {
	case DP_OR_NONE:
		return 0;
	case DP_OR_FILL: {
		OPND(o, -1, -1);
		(void)o;
		return 0;
	}
	case DP_OR_COPY:
	case DP_OR_RESHAPE: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(o->dtype == a->dtype && dp_numel(o) == dp_numel(a),
		     "the operands differ in dtype or size");
		return 0;
	}
	case DP_OR_UNARY: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(dp_numel(o) == dp_numel(a), "the operands differ in size");
		return 0;
	}
	case DP_OR_DROPOUT: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		OPND(keys, 1, -1);
		NEED(dp_numel(o) == dp_numel(a), "the operands differ in size");
		NEED(a->ndim >= 1 && dp_numel(keys) == 2 * a->dims[0],
		     "the keys are not 2 per sample of dim 0");
		if (in->in[2] >= 0) {
			OPND(pos, 2, -1);
			NEED(a->ndim >= 2 && dp_numel(pos) == a->dims[1],
			     "the positions are not one per row of dim 1");
		}
		return 0;
	}
	case DP_OR_BINARY: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		OPND(b, 1, -1);
		NEED(dp_numel(o) == dp_numel(a) && dp_numel(a) == dp_numel(b), "the operands differ in size");
		return 0;
	}
	case DP_OR_BIAS_ADD: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		OPND(b, 1, -1);
		NEED(dp_numel(o) == dp_numel(a) && dp_numel(a) % dp_numel(b) == 0,
		     "the operand sizes do not match (x %lld, bias %lld, out %lld)",
		     (long long)dp_numel(a), (long long)dp_numel(b), (long long)dp_numel(o));
		return 0;
	}
	case DP_OR_BIAS_GRAD: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(dp_numel(a) % dp_numel(o) == 0, "the operand sizes do not match");
		DISJOINT();
		return 0;
	}
	case DP_OR_SCALAR: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		(void)o;
		(void)a;
		return 0;
	}
	case DP_OR_CLIP: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(disjoint(o, a), "the norm lies inside the clipped buffer");
		return 0;
	}
	case DP_OR_SGD:
	case DP_OR_ADAMW: {
		int adam = rule == DP_OR_ADAMW, copy = adam ? 3 : 2;
		OPND(p, -1, -1);
		OPND(g, 0, -1);
		NEED(dp_numel(p) == dp_numel(g), "params and grads differ in size");
		if (adam) {
			OPND(m, 1, -1);
			OPND(v, 2, -1);
			NEED(dp_numel(m) == dp_numel(p) && dp_numel(v) == dp_numel(p), "the state differs in size");
		} else if (in->in[1] >= 0) {
			OPND(m, 1, -1);
			NEED(dp_numel(m) == dp_numel(p), "the momentum buffer differs in size");
		} else {
			NEED(DP_FATTR(in, SGD, momentum) == 0, "momentum without a momentum buffer");
		}
		if (in->in[copy] >= 0) {
			OPND(cp, copy, -1);
			NEED(dp_numel(cp) == dp_numel(p), "the compute copy differs in size");
			NEED(disjoint(cp, p) && disjoint(cp, g), "the compute copy overlaps an operand");
		}
		return 0;
	}
	case DP_OR_ACCUM:
	case DP_OR_CAST: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(dp_numel(o) == dp_numel(a), "the operands differ in size");
		if (rule == DP_OR_CAST)
			NEED(disjoint(o, a), "the output overlaps the input");
		return 0;
	}
	default:
		return 1; /* not an elementwise rule */
	}
}

static int check_gemm(Chk *c, int rule)
{
	const DpInstr *in = c->in;
	switch (rule) {
	case DP_OR_MATMUL:
	case DP_OR_MATMUL_GELU_GRAD: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		OPND(b, 1, -1);
		int64_t ta = DP_ATTR(in, MATMUL, transA), tb = DP_ATTR(in, MATMUL, transB);
		int64_t m = ta ? cols_of(a) : rows_of(a), k = ta ? rows_of(a) : cols_of(a);
		int64_t k2 = tb ? cols_of(b) : rows_of(b), n = tb ? rows_of(b) : cols_of(b);
		/* the padded vocabulary (passes/padvocab.c): in1 may be a pad_rows
		 * weight with more rows than the product's real k or n, which the
		 * padded rows of in0 (k) or of the output (n) then cover; the CPU
		 * computes the real extent, CUDA the padded one (in0's padding
		 * columns are zero: the classifier's gradient writes them) */
		NEED(k == k2 || (!ta && !tb && k2 > k && dp_ld(a) >= k2),
		     "inner dimensions differ (%lld vs %lld)", (long long)k, (long long)k2);
		NEED(dp_numel(o) == m * cols_of(o) &&
			     (cols_of(o) == n || (tb && n > cols_of(o) && dp_ld(o) >= n)),
		     "the output is not [%lld, %lld]", (long long)m, (long long)n);
		if (rule == DP_OR_MATMUL_GELU_GRAD) {
			OPND(h, 2, -1);
			NEED(dp_numel(h) == dp_numel(o), "the pre-activation and the output differ in size");
		}
		DISJOINT();
		return 0;
	}
	case DP_OR_LINEAR:
	case DP_OR_LINEAR_GELU: {
		OPND(o, -1, -1);
		OPND(x, 0, -1);
		OPND(w, 1, -1);
		int64_t k = cols_of(x), n = cols_of(w), halves = rule == DP_OR_LINEAR_GELU ? 2 : 1;
		NEED(rows_of(w) == k, "x and w inner dimensions differ");
		NEED(dp_numel(o) == halves * rows_of(x) * n && cols_of(o) == n,
		     "the output shape does not match");
		if (in->in[2] >= 0) {
			OPND(b, 2, -1);
			NEED(dp_numel(b) == n, "the bias size does not match");
		}
		DISJOINT();
		return 0;
	}
	case DP_OR_XENT:
	case DP_OR_XENT_GRAD:
	case DP_OR_CORRECT: {
		OPND(o, -1, -1);
		OPND(x, 0, -1);
		OPND(y, 1, -1);
		NEED(dp_numel(y) == rows_of(x), "labels (%lld) and logits rows (%lld) differ",
		     (long long)dp_numel(y), (long long)rows_of(x));
		if (rule == DP_OR_XENT_GRAD)
			NEED(dp_numel(o) == dp_numel(x), "the output and the logits differ in size");
		else
			NEED(dp_numel(o) >= (rule == DP_OR_CORRECT ? 2 : 1), "the output is too small");
		return 0;
	}
	case DP_OR_EMBEDDING: {
		OPND(o, -1, -1);
		OPND(ids, 0, -1);
		OPND(tab, 1, -1);
		NEED(tab->ndim == 2, "the table must be [vocab, dim]");
		NEED(cols_of(o) == tab->dims[1] && dp_numel(o) == dp_numel(ids) * tab->dims[1],
		     "the output shape does not match ids and table");
		DISJOINT();
		return 0;
	}
	case DP_OR_EMBEDDING_GRAD: {
		OPND(o, -1, -1);
		OPND(dy, 0, -1);
		OPND(ids, 1, -1);
		if (in->in[2] >= 0) {
			OPND(tab, 2, -1);
			NEED(dp_numel(tab) == dp_numel(o), "the output and the table differ in size");
		}
		NEED(o->ndim == 2, "the output must be [vocab, dim]");
		NEED(cols_of(dy) == cols_of(o) && dp_numel(dy) == dp_numel(ids) * cols_of(o),
		     "dy's shape does not match ids and table");
		NEED(disjoint(o, dy) && disjoint(o, ids), "the output overlaps an input");
		return 0;
	}
	case DP_OR_FLAG: {
		OPND(a, 0, -1);
		NEED(dp_numel(a) == 1, "the input is not one element");
		return 0;
	}
	case DP_OR_ORTHOGONALIZE: {
		OPND(o, -1, -1);
		NEED(cols_of(o) <= rows_of(o), "more columns (%lld) than rows (%lld)",
		     (long long)cols_of(o), (long long)rows_of(o));
		return 0;
	}
	default:
		return 1;
	}
}

static int check_rows(Chk *c, int rule)
{
	const DpInstr *in = c->in;
	switch (rule) {
	case DP_OR_NORM_AFFINE:
	case DP_OR_NORM_SCALE: {
		OPND(o, -1, -1);
		OPND(x, 0, -1);
		OPND(g, 1, -1);
		NEED(dp_numel(o) == dp_numel(x) && cols_of(o) == cols_of(x), "the output and x differ in shape");
		NEED(dp_numel(g) == cols_of(x), "gamma's size does not match x's last dim");
		if (rule == DP_OR_NORM_AFFINE) {
			OPND(b, 2, -1);
			NEED(dp_numel(b) == cols_of(x), "beta's size does not match x's last dim");
		}
		NEED(DP_FATTR(in, LAYERNORM, eps) >= 0, "negative eps");
		DISJOINT();
		return 0;
	}
	case DP_OR_ADD_NORM:
	case DP_OR_ADD_NORM_SCALE: {
		OPND(o, -1, -1);
		OPND(x, 0, -1);
		OPND(r, 1, -1);
		OPND(g, 2, -1);
		NEED(dp_numel(r) == dp_numel(x) && cols_of(r) == cols_of(x),
		     "x and the residual differ in shape");
		NEED(dp_numel(o) == 2 * dp_numel(x) && cols_of(o) == cols_of(x),
		     "the output is not [2, x's rows, x's cols]");
		NEED(dp_numel(g) == cols_of(x), "gamma's size does not match x's last dim");
		if (rule == DP_OR_ADD_NORM) {
			OPND(b, 3, -1);
			NEED(dp_numel(b) == cols_of(x), "beta's size does not match x's last dim");
		}
		NEED(DP_FATTR(in, ADD_LAYERNORM, eps) >= 0, "negative eps");
		DISJOINT();
		return 0;
	}
	case DP_OR_NORM_GRAD:
	case DP_OR_NORM_GRAD_ADD: {
		OPND(o, -1, -1);
		OPND(dy, 0, -1);
		OPND(x, 1, -1);
		OPND(g, 2, -1);
		NEED(dp_numel(o) == dp_numel(x) && dp_numel(dy) == dp_numel(x) && cols_of(o) == cols_of(x) &&
		     cols_of(dy) == cols_of(x), "dy, x and the output differ in shape");
		NEED(dp_numel(g) == cols_of(x), "gamma's size does not match x's last dim");
		if (rule == DP_OR_NORM_GRAD_ADD) {
			OPND(r, 3, -1);
			NEED(dp_numel(r) == dp_numel(x) && cols_of(r) == cols_of(x),
			     "the residual's gradient and x differ in shape");
		}
		NEED(DP_FATTR(in, LAYERNORM_GRAD, eps) >= 0, "negative eps");
		DISJOINT();
		return 0;
	}
	case DP_OR_NORM_GRAD_G:
	case DP_OR_NORM_GRAD_GB: {
		OPND(o, -1, -1);
		OPND(dy, 0, -1);
		OPND(x, 1, -1);
		NEED(dp_numel(dy) == dp_numel(x) && cols_of(dy) == cols_of(x), "dy and x differ in shape");
		NEED(dp_numel(o) == (rule == DP_OR_NORM_GRAD_GB ? 2 : 1) * cols_of(x),
		     rule == DP_OR_NORM_GRAD_GB ? "the output is not [2, x's last dim]"
						: "the output's size does not match x's last dim");
		NEED(DP_FATTR(in, LAYERNORM_GRAD_G, eps) >= 0, "negative eps");
		DISJOINT();
		return 0;
	}
	case DP_OR_SOFTMAX:
	case DP_OR_SOFTMAX_GRAD: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(dp_numel(o) == dp_numel(a) && cols_of(o) == cols_of(a), "the operands differ in shape");
		if (rule == DP_OR_SOFTMAX_GRAD) {
			OPND(y, 1, -1);
			NEED(dp_numel(y) == dp_numel(a) && cols_of(y) == cols_of(a), "dy and y differ in shape");
		}
		DISJOINT();
		return 0;
	}
	case DP_OR_SPLIT:
	case DP_OR_SPLIT_GRAD: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		const DpTensor *whole = rule == DP_OR_SPLIT ? a : o, *part = rule == DP_OR_SPLIT ? o : a;
		int64_t parts = DP_ATTR(in, SPLIT, parts), index = DP_ATTR(in, SPLIT, index);
		NEED(parts >= 1 && index >= 0 && index < parts, "bad part index");
		NEED(cols_of(part) * parts == cols_of(whole) && rows_of(part) == rows_of(whole),
		     "the operand shapes do not match the split");
		DISJOINT();
		return 0;
	}
	default:
		return 1;
	}
}

static int check_transformer(Chk *c, int rule)
{
	const DpInstr *in = c->in;
	switch (rule) {
	case DP_OR_ATTENTION: {
		OPND(o, -1, -1);
		OPND(qkv, 0, -1);
		int64_t b, t, ch;
		if (qkv_dims(c, qkv, &b, &t, &ch))
			return -1;
		NEED(dp_numel(o) == b * t * ch && cols_of(o) == ch, "the output is not [batch, T, C]");
		DISJOINT();
		return 0;
	}
	case DP_OR_ATTENTION_GRAD: {
		OPND(o, -1, -1);
		OPND(dy, 0, -1);
		OPND(qkv, 1, -1);
		int64_t b, t, ch;
		if (qkv_dims(c, qkv, &b, &t, &ch))
			return -1;
		NEED(dp_numel(dy) == b * t * ch && cols_of(dy) == ch, "dy is not [batch, T, C]");
		NEED(dp_numel(o) == dp_numel(qkv) && cols_of(o) == 3 * ch, "the output is not shaped like qkv");
		DISJOINT();
		return 0;
	}
	case DP_OR_ROPE: {
		OPND(o, -1, -1);
		OPND(qkv, 0, -1);
		OPND(cs, 1, -1);
		OPND(sn, 2, -1);
		NEED(qkv->ndim == 3, "qkv must be [batch, T, 3*C]");
		NEED(cs->ndim == 2 && sn->ndim == 2 && cs->dims[0] == sn->dims[0] &&
		     cs->dims[1] == sn->dims[1] && cs->dims[1] >= 1, "cos and sin must be [T, head_dim/2]");
		NEED(qkv->dims[2] % (6 * cs->dims[1]) == 0,
		     "qkv's last dim is not a multiple of 3 * head_dim");
		NEED(qkv->dims[1] <= cs->dims[0], "the rope tables are shorter than T");
		NEED(dp_numel(o) == dp_numel(qkv) && cols_of(o) == cols_of(qkv),
		     "the output is not shaped like qkv");
		DISJOINT();
		return 0;
	}
	case DP_OR_TRANSPOSE: {
		OPND(o, -1, -1);
		OPND(x, 0, -1);
		NEED(o->dtype == x->dtype, "the operands differ in dtype");
		NEED(x->ndim >= 2 && o->ndim >= 2 && dp_numel(o) == dp_numel(x) &&
		     o->dims[o->ndim - 1] == x->dims[x->ndim - 2] &&
		     o->dims[o->ndim - 2] == x->dims[x->ndim - 1],
		     "the output is not x with its last two dims swapped");
		DISJOINT();
		return 0;
	}
	case DP_OR_PAD_ROWS: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(o->dtype == a->dtype && cols_of(o) == cols_of(a) &&
			     rows_of(o) == DP_ATTR(in, PAD_ROWS, rows) && rows_of(a) <= rows_of(o),
		     "the output is not in0 [%lld, %lld] padded to %lld rows", (long long)rows_of(a),
		     (long long)cols_of(a), (long long)DP_ATTR(in, PAD_ROWS, rows));
		DISJOINT();
		return 0;
	}
	case DP_OR_KV_PACK:
	case DP_OR_KV_UNPACK: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		const DpTensor *qkv = rule == DP_OR_KV_PACK ? a : o, *kv = rule == DP_OR_KV_PACK ? o : a;
		int64_t b, t, ch;
		if (qkv_dims(c, qkv, &b, &t, &ch))
			return -1;
		NEED(kv->ndim == 3 && kv->dims[0] == b && kv->dims[1] == t && kv->dims[2] == 2 * ch,
		     "kv is not [batch, T, 2*C] of qkv [batch, T, 3*C]");
		DISJOINT();
		return 0;
	}
	case DP_OR_ATTENTION_CP:
	case DP_OR_ATTENTION_CP_GRAD:
	case DP_OR_ATTENTION_CP_GRAD_KV:
	case DP_OR_ATTENTION_CP_GRAD_BOTH: {
		int k = rule == DP_OR_ATTENTION_CP ? 0 : 1; /* where qkv is */
		OPND(o, -1, -1);
		OPND(qkv, k, -1);
		OPND(kv, k + 1, -1);
		OPND(pos, k + 2, -1);
		int64_t b, t, ch;
		if (qkv_dims(c, qkv, &b, &t, &ch))
			return -1;
		int64_t cp = DP_ATTR(in, ATTENTION_CP, cp);
		NEED(cp >= 1 && cp <= (1 << 20), "bad cp size");
		/* by division: cp comes from the file, the product could overflow */
		NEED(dp_numel(kv) % cp == 0 && dp_numel(kv) / cp == b * t * 2 * ch &&
		     kv->dims[kv->ndim - 1] == 2 * ch, "kv is not [cp, batch, T, 2*C]");
		NEED(dp_numel(pos) == t, "pos does not have one position per row");
		if (rule == DP_OR_ATTENTION_CP) {
			NEED(dp_numel(o) == b * t * ch && cols_of(o) == ch, "the output is not [batch, T, C]");
		} else {
			OPND(dy, 0, -1);
			NEED(dp_numel(dy) == b * t * ch && cols_of(dy) == ch, "dy is not [batch, T, C]");
			if (rule == DP_OR_ATTENTION_CP_GRAD_BOTH) { /* d kv, then d qkv */
				NEED(dp_numel(o) == dp_numel(kv) + dp_numel(qkv),
				     "the output is not as many elements as kv and qkv together");
			} else {
				const DpTensor *like = rule == DP_OR_ATTENTION_CP_GRAD ? qkv : kv;
				NEED(dp_numel(o) == dp_numel(like) && cols_of(o) == cols_of(like),
				     "the output is not shaped like its operand");
			}
		}
		DISJOINT();
		return 0;
	}
	case DP_OR_INTERLEAVE: {
		OPND(o, -1, -1);
		OPND(a, 0, -1);
		NEED(o->dtype == a->dtype && dp_numel(o) == dp_numel(a), "the operands differ in dtype or size");
		int64_t parts = DP_ATTR(in, INTERLEAVE, parts), dim = DP_ATTR(in, INTERLEAVE, dim);
		NEED(parts >= 1 && dim >= 0 && dim < o->ndim && o->dims[dim] % parts == 0,
		     "the split dim does not divide into the parts");
		DISJOINT();
		return 0;
	}
	default:
		return 1;
	}
}

/* Memory spaces (offload): a copy between the arenas goes the way its op
 * says; any other kernel runs on one side, every operand in one space (the
 * host optimizer step reads and writes host memory only). */
static int check_spaces(const DpStep *s, const DpInstr *in, const char *what, char *err,
			size_t errlen)
{
	if (dp_op_class(in->op) != DP_OPC_KERNEL || in->out < 0)
		return 0;
	int want_in = s->tensors[in->out].space, want_out = want_in;
	if (in->op == DP_OP_D2H || in->op == DP_OP_H2D) {
		want_out = in->op == DP_OP_D2H ? DP_SPACE_HOST : DP_SPACE_DEVICE;
		want_in = in->op == DP_OP_D2H ? DP_SPACE_DEVICE : DP_SPACE_HOST;
	}
	if (s->tensors[in->out].space != want_out) {
		snprintf(err, errlen, "%s: the output is in %s memory, not %s", what,
			 dp_space_names[s->tensors[in->out].space], dp_space_names[want_out]);
		return -1;
	}
	for (int k = 0; k < DP_MAX_IN; k++)
		if (in->in[k] >= 0 && s->tensors[in->in[k]].space != want_in) {
			snprintf(err, errlen, "%s: operand %d is in %s memory, the kernel runs on the %s",
				 what, k, dp_space_names[s->tensors[in->in[k]].space],
				 dp_space_names[want_in]);
			return -1;
		}
	return 0;
}

/* A tensor with padded rows (ld > its last dim) only where dp_op_takes_ld. */
static int check_ld(const DpStep *s, const DpInstr *in, const char *what, char *err,
		    size_t errlen)
{
	if (dp_op_takes_ld(in->op))
		return 0;
	for (int k = -1; k < DP_MAX_IN; k++) {
		int id = k < 0 ? in->out : in->in[k];
		if (id >= 0 && dp_ld(&s->tensors[id]) != dp_cols(&s->tensors[id])) {
			snprintf(err, errlen, "%s: tensor '%s' has padded rows (stride %lld for %lld), "
				 "which this op does not take", what, tname(s, id),
				 (long long)s->tensors[id].ld, (long long)dp_cols(&s->tensors[id]));
			return -1;
		}
	}
	return 0;
}

int dpstep_check_operands(const DpStep *s, const DpInstr *in, const char *what, char *err,
			  size_t errlen)
{
	Chk c = {s, in, what, err, errlen};
	int rule = dp_op_rules[in->op];
	if (check_spaces(s, in, what, err, errlen) || check_ld(s, in, what, err, errlen))
		return -1;
	if (rule == DP_OR_EXEC)
		return 0;
	if (rule >= DP_NOR) {
		snprintf(err, errlen, "%s: no operand rule %d (internal error)", what, rule);
		return -1;
	}
	int r = check_dtypes(&c, rule) ? -1 : check_elementwise(&c, rule);
	if (r > 0)
		r = check_gemm(&c, rule);
	if (r > 0)
		r = check_rows(&c, rule);
	if (r > 0)
		r = check_transformer(&c, rule);
	if (r > 0) {
		snprintf(err, errlen, "%s: no operand rule %d (internal error)", what, rule);
		return -1;
	}
	return r;
}
