/*
 * optim.cu - the CUDA kernels of the optimizer step (the CPU's
 * runtime/cpu/optim.c): the squared norm, its square root, clipping
 * (torch.nn.utils.clip_grad_norm_), SGD and AdamW (PyTorch 1.13's
 * single-tensor formulas, operation for operation; lr and the per-step
 * constants from the device's CuScalars); and the planner that folds a clip
 * into the optimizers reading its gradients.
 *
 * sqnorm: w * sum in0^2 in double: always CU_REDUCE_BLOCKS blocks (idle
 * ones contribute 0), block trees, then one block over the partials in
 * order; the CPU sums in order in double: ~1e-16 relative apart, <= 1 ulp
 * after rounding to float. sqrt, clip, sgd, adamw: float arithmetic in the
 * CPU's order under -fmad=false: bitwise equal to the CPU. clip scales only
 * when max_norm / (norm + 1e-6) < 1, so a NaN or infinite norm leaves the
 * gradients alone, as on the CPU (and in torch 1.13; the NaN loss is then
 * reported by dpexec).
 *
 * precision bf16: SGD (in2) and AdamW (in3) also round each updated master
 * to nearest even into its bf16 compute copy in the same loop (the CPU's
 * bits: cu_to_bf16); bf16 gradients reach them as f32 copies (bf16.cu).
 *
 * The fold (cu_plan_clip): clip reads and writes every gradient once more
 * between the norm and the optimizer. When the only readers of the clipped
 * gradients are SGD/AdamW instructions (until they are overwritten whole),
 * the clip instruction is skipped and each optimizer multiplies its
 * gradient by the same float coefficient first: the same values as clip
 * then update, bitwise, with the gradients read once by the norm and once by
 * the update (8 bytes per parameter less: ~1 GB, ~0.3 ms per step on an
 * H100 for GPT-2 124M). The gradients stay unclipped in memory, which is
 * why nothing else may read them before they are zeroed.
 */
#include "device.cuh"

/* ---- sqnorm: out[0] = w * sum in0^2 (+ out[0] if ia2) ---- */

__global__ void k_sqnorm_part(const float *a, int64_t n, int vec4, double *part)
{
	__shared__ double sh[32];
	double s = 0;
	if (vec4) {
		CU_FOR_EACH(i, n / 4) {
			float4 v = ld4(a + 4 * i);
			s += (double)v.x * v.x;
			s += (double)v.y * v.y;
			s += (double)v.z * v.z;
			s += (double)v.w * v.w;
		}
	} else {
		CU_FOR_EACH(i, n) {
			float v = ld(a + i);
			s += (double)v * v;
		}
	}
	s = block_sum<double>(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void k_sqnorm_sum(float *o, const double *part, int accumulate, float w)
{
	__shared__ double sh[32];
	double s = 0;
	for (int i = threadIdx.x; i < CU_REDUCE_BLOCKS; i += blockDim.x)
		s += part[i];
	s = block_sum<double>(s, sh);
	if (threadIdx.x == 0)
		o[0] = (float)((accumulate ? (double)o[0] : 0.0) + (double)w * s);
}

static int run_sqnorm(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, 0));
	int vec4 = n % 4 == 0 && cu_aligned16(cu_p(a, 0));
	CU_LAUNCH(k_sqnorm_part, CU_REDUCE_BLOCKS, CU_THREADS, a->st, cu_f(a, 0), n, vec4,
		  (double *)a->scratch);
	CU_LAUNCHED(a, e);
	CU_LAUNCH(k_sqnorm_sum, 1, CU_THREADS, a->st, cu_f(a, -1), (const double *)a->scratch,
		  a->in->ia[2] != 0, a->in->fa[0] != 0 ? a->in->fa[0] : 1.0f);
	CU_LAUNCHED(a, e);
	return 0;
}

__global__ void k_sqrt(float *o, const float *a)
{
	o[0] = sqrtf(a[0]);
}

static int run_sqrt(const CuArgs *a, RtErr *e)
{
	CU_LAUNCH(k_sqrt, 1, 1, a->st, cu_f(a, -1), cu_f(a, 0));
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- clip ---- */

/* torch's coefficient; 1 (no scaling) unless it is < 1: NaN and inf norms
 * leave the gradients alone, as on the CPU. */
static __device__ __forceinline__ float clip_coef(const float *norm, float max_norm)
{
	if (!norm)
		return 1.0f;
	float coef = max_norm / (norm[0] + 1e-6f);
	return coef < 1.0f ? coef : 1.0f;
}

__global__ void k_clip(float *o, int64_t n, const float *norm, float max_norm)
{
	float coef = clip_coef(norm, max_norm);
	if (!(coef < 1.0f))
		return;
	CU_FOR_EACH(i, n)
		st(o + i, ld(o + i) * coef);
}

static int run_clip(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	if (n <= 0 || a->fuse->skip) /* folded into the optimizers */
		return 0;
	CU_LAUNCH(k_clip, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), n, cu_f(a, 0), a->in->fa[0]);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- SGD with momentum: g += wd*p; buf = g (t = 1) or mom*buf + g; p -= lr*buf ---- */

__global__ void k_sgd(float *p, const float *g, float *buf, cu_bf16 *copy, int64_t n, float mom,
		      float wd, const CuScalars *sc, const float *norm, float max_norm)
{
	float lr = sc->lr, coef = clip_coef(norm, max_norm);
	int64_t t = sc->t;
	CU_FOR_EACH(i, n) {
		float gi = ld(g + i), pi = ld(p + i);
		if (coef < 1.0f)
			gi = gi * coef; /* the folded clip */
		if (wd != 0)
			gi = gi + wd * pi;
		if (mom != 0) {
			float b = t <= 1 ? gi : mom * ld(buf + i) + gi;
			st(buf + i, b);
			gi = b;
		}
		pi = pi - lr * gi;
		st(p + i, pi);
		if (copy)
			copy[i] = cu_to_bf16(pi);
	}
}

static int run_sgd(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	if (n <= 0)
		return 0;
	CU_LAUNCH(k_sgd, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), cu_f(a, 0), cu_f(a, 1),
		  (cu_bf16 *)cu_p(a, 2), n, a->in->fa[0], a->in->fa[1], a->sc, a->fuse->clip_norm,
		  a->fuse->clip_max);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- AdamW: the CPU's order; constants from the schedule kernel ---- */

struct AdamK {
	float decay, step_size, bc2_sqrt, beta1, beta2, one_b1, one_b2, eps, coef;
};

static __device__ __forceinline__ float adam_one(const AdamK &k, float g, float *p, float *m,
						 float *v)
{
	if (k.coef < 1.0f)
		g = g * k.coef; /* the folded clip */
	float pi = *p * k.decay;
	float mi = *m * k.beta1 + k.one_b1 * g;
	float vi = *v * k.beta2 + k.one_b2 * (g * g);
	float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
	*m = mi;
	*v = vi;
	return pi + (-k.step_size * mi) / denom;
}

static __device__ __forceinline__ AdamK adam_k(const CuScalars *sc, float beta1, float beta2,
					       float eps, const float *norm, float max_norm)
{
	AdamK k;
	k.decay = sc->opt_k[CU_OPT_DECAY];
	k.step_size = sc->opt_k[CU_OPT_STEP_SIZE];
	k.bc2_sqrt = sc->opt_k[CU_OPT_BC2_SQRT];
	k.beta1 = beta1;
	k.beta2 = beta2;
	/* the CPU: (float)(1.0 - b1) with b1 the double of the float beta1 */
	k.one_b1 = (float)(1.0 - (double)beta1);
	k.one_b2 = (float)(1.0 - (double)beta2);
	k.eps = eps;
	k.coef = clip_coef(norm, max_norm);
	return k;
}

__global__ void k_adamw(float *p, const float *g, float *m, float *v, cu_bf16 *copy, int64_t n,
			float beta1, float beta2, float eps, const CuScalars *sc, const float *norm,
			float max_norm)
{
	AdamK k = adam_k(sc, beta1, beta2, eps, norm, max_norm);
	CU_FOR_EACH(i, n) {
		float pi = ld(p + i), mi = ld(m + i), vi = ld(v + i);
		pi = adam_one(k, ld(g + i), &pi, &mi, &vi);
		st(p + i, pi);
		st(m + i, mi);
		st(v + i, vi);
		if (copy)
			copy[i] = cu_to_bf16(pi);
	}
}

/* n4 groups of four: every operand 16-byte aligned (the copy 8-byte) */
__global__ void k_adamw4(float *p, const float *g, float *m, float *v, cu_bf16 *copy, int64_t n4,
			 float beta1, float beta2, float eps, const CuScalars *sc,
			 const float *norm, float max_norm)
{
	AdamK k = adam_k(sc, beta1, beta2, eps, norm, max_norm);
	CU_FOR_EACH(i, n4) {
		float4 pp = ld4(p + 4 * i), gg = ld4(g + 4 * i), mm = ld4(m + 4 * i), vv = ld4(v + 4 * i);
		pp.x = adam_one(k, gg.x, &pp.x, &mm.x, &vv.x);
		pp.y = adam_one(k, gg.y, &pp.y, &mm.y, &vv.y);
		pp.z = adam_one(k, gg.z, &pp.z, &mm.z, &vv.z);
		pp.w = adam_one(k, gg.w, &pp.w, &mm.w, &vv.w);
		st4(p + 4 * i, pp);
		st4(m + 4 * i, mm);
		st4(v + 4 * i, vv);
		if (copy)
			*(uint2 *)(copy + 4 * i) =
				make_uint2(cu_to_bf16(pp.x) | (uint32_t)cu_to_bf16(pp.y) << 16,
					   cu_to_bf16(pp.z) | (uint32_t)cu_to_bf16(pp.w) << 16);
	}
}

static int run_adamw(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	const DpOptim *o = &a->s->opt;
	float *p = cu_f(a, -1), *g = cu_f(a, 0), *m = cu_f(a, 1), *v = cu_f(a, 2);
	cu_bf16 *copy = (cu_bf16 *)cu_p(a, 3); /* the bf16 compute copy, or NULL */
	if (n <= 0)
		return 0;
	if (n % 4 == 0 && cu_aligned16(p) && cu_aligned16(g) && cu_aligned16(m) && cu_aligned16(v) &&
	    ((uintptr_t)copy & 7u) == 0)
		CU_LAUNCH(k_adamw4, cu_grid(n / 4), CU_THREADS, a->st, p, g, m, v, copy, n / 4,
			  o->beta1, o->beta2, o->eps, a->sc, a->fuse->clip_norm, a->fuse->clip_max);
	else
		CU_LAUNCH(k_adamw, cu_grid(n), CU_THREADS, a->st, p, g, m, v, copy, n, o->beta1,
			  o->beta2, o->eps, a->sc, a->fuse->clip_norm, a->fuse->clip_max);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- planning: clip folded into the optimizers ---- */

static int overlaps(const DpTensor *a, const DpTensor *b)
{
	return a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes;
}

static int inside(const DpTensor *a, const DpTensor *b) /* a within b */
{
	return a->offset >= b->offset && a->offset + a->nbytes <= b->offset + b->nbytes;
}

static int touches_in(const DpStep *s, const DpInstr *k, const DpTensor *t, int from)
{
	for (int q = from; q < DP_MAX_IN; q++)
		if (k->in[q] >= 0 && overlaps(&s->tensors[k->in[q]], t))
			return 1;
	return 0;
}

/*
 * A clip of G (out) by the norm N (in0) folds when, after it in its
 * program, every instruction that touches G is, until one fills G whole:
 * an SGD/AdamW on the clip's stream and condition reading its gradient (in0)
 * inside G and nothing else of G (a consumer), with N not written before
 * the last consumer. Otherwise the clip runs as written.
 */
extern "C" int cu_plan_clip(CuPlan *p, RtErr *e)
{
	const DpStep *s = p->s;
	for (int pg = 0; pg < DP_NPROG; pg++)
		for (uint32_t i = 0; i < s->nprog[pg]; i++) {
			const DpInstr *c = &s->prog[pg][i];
			if (c->op != DPK_CLIP)
				continue;
			const DpTensor *grads = &s->tensors[c->out], *norm = &s->tensors[c->in[0]];
			int ok = 0, norm_written = 0, nconsumers = 0;
			for (uint32_t j = i + 1; j < s->nprog[pg]; j++) {
				const DpInstr *k = &s->prog[pg][j];
				int is_opt = k->op == DPK_ADAMW || k->op == DPK_SGD;
				int out_hits = k->out >= 0 && overlaps(&s->tensors[k->out], grads);
				if (is_opt && k->in[0] >= 0 && overlaps(&s->tensors[k->in[0]], grads)) {
					if (!inside(&s->tensors[k->in[0]], grads) || out_hits ||
					    touches_in(s, k, grads, 1) || k->stream != c->stream ||
					    (k->flags & DP_IF_LAST) != (c->flags & DP_IF_LAST) ||
					    norm_written || p->fuse[pg][j].clip_norm)
						break;
					nconsumers++;
				} else if (out_hits && k->op == DPK_FILL && inside(grads, &s->tensors[k->out]) &&
					   !touches_in(s, k, grads, 0)) {
					ok = nconsumers > 0; /* overwritten whole: nobody else saw it */
					break;
				} else if (out_hits || touches_in(s, k, grads, 0)) {
					break;
				}
				if (k->out >= 0 && overlaps(&s->tensors[k->out], norm))
					norm_written = 1;
			}
			if (!ok)
				continue;
			p->fuse[pg][i].skip = 1;
			for (uint32_t j = i + 1; j < s->nprog[pg]; j++) {
				const DpInstr *k = &s->prog[pg][j];
				if ((k->op == DPK_ADAMW || k->op == DPK_SGD) && k->in[0] >= 0 &&
				    overlaps(&s->tensors[k->in[0]], grads)) {
					p->fuse[pg][j].clip_norm = (const float *)p->ptr[c->in[0]];
					p->fuse[pg][j].clip_max = c->fa[0];
				}
				if (k->op == DPK_FILL && k->out >= 0 && inside(grads, &s->tensors[k->out]))
					break;
			}
		}
	return 0;
}

extern "C" void cu_optim_rows(CuKernel *k)
{
	/* run, limits, scratch, blas, bf16 */
	k[DPK_SQNORM] = {run_sqnorm, NULL, NULL, 0, 0};
	k[DPK_SQRT] = {run_sqrt, NULL, NULL, 0, 0};
	k[DPK_CLIP] = {run_clip, NULL, NULL, 0, 0};
	k[DPK_SGD] = {run_sgd, NULL, NULL, 0, 0};
	k[DPK_ADAMW] = {run_adamw, NULL, NULL, 0, 0};
}
