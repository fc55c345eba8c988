/*
 * optim.cu - the CUDA kernels of the optimizer step (the CPU's
 * runtime/cpu/optim.c): the squared norm, its square root, clipping
 * (torch.nn.utils.clip_grad_norm_), SGD and AdamW (PyTorch 1.13's
 * single-tensor formulas, operation for operation; lr and the per-step
 * constants from the device's CuScalars); and the planner that folds a clip
 * into the optimizers reading its gradients.
 *
 * sqnorm: w * sum in0^2 in double: one block per CU_THREADS loads (float4
 * or eight bf16 / f16 when aligned), at most CU_REDUCE_BLOCKS (grid-stride
 * beyond), block trees, then one block over the partials in order; the CPU
 * sums in order in double: ~1e-16 relative apart, <= 1 ulp after rounding
 * to float. (A fixed 256 blocks left most of them idle on the small
 * tensors tp and the per-parameter norms give: 65,536 threads for a bias
 * of 64, which the emulator runs one by one.) sqrt, clip, sgd, adamw: float arithmetic in the
 * CPU's order under -fmad=false: bitwise equal to the CPU. clip scales only
 * when max_norm / (norm + 1e-6) < 1, so a NaN or infinite norm leaves the
 * gradients alone, as on the CPU (and in torch 1.13; the NaN loss is then
 * reported by dpexec).
 *
 * precision bf16 and fp16: SGD (in2) and AdamW (in3) also round each
 * updated master to nearest even into its 16-bit compute copy in the same
 * loop (the CPU's bits: cu_to_bf16, cu_to_f16). Gradients in bf16 or f16
 * (reduce_dtype bf16 / f16) are read as such by sqnorm (eight per 128-bit
 * load), unscale and clip (rounding each result once), SGD and AdamW (four
 * per 64-bit load beside the float4 of the f32 state): widened exactly, so
 * the same arithmetic as the CPU's staged f32 copies. With f16 gradients
 * nothing of the optimizer tail is staged (docs/CUDA.md, *fp16*).
 *
 * fp16's overflow check is the norm (passes/lossscale.c): sqnorm squares
 * every widened gradient into its double sum, so one inf or NaN anywhere
 * makes this rank's partial sum, then the all_reduced squared norm, then
 * the norm that amp_check reads on every rank, not finite. Nothing may drop
 * a non-finite term on the way (tests/cuda_emu_mutations.sh's amp_norm).
 *
 * The fold (cu_plan_clip): clip reads and writes every gradient once more
 * between the norm and the optimizer. When the only readers of the clipped
 * gradients are SGD/AdamW instructions (until they are overwritten whole),
 * the clip instruction is skipped and each optimizer multiplies its
 * gradient by the same float coefficient first (rounded to bf16 or f16 as
 * clip would store it when the gradients are 16-bit: clipped<G>): the same values
 * as clip then update, bitwise, with the gradients read once by the norm and once by
 * the update (8 bytes per parameter less: ~1 GB, ~0.3 ms per step on an
 * H100 for GPT-2 124M). The gradients stay unclipped in memory, which is
 * why nothing else may read them before they are zeroed. Only this rank's
 * instructions count (cu_plan_runs): at pp > 1 each stage's gradients are
 * its own part, and the stages' parts share bytes, so another stage's
 * clip, update or fill at the same addresses is none of this one's (read
 * as this stage's, an update was paired with another stage's clip and its
 * gradients clipped twice: gpt2-tiny at pp=4).
 */
#include "device.cuh"
#include "../lr_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- sqnorm: out[0] = w * sum in0^2 (+ out[0] if ia2) ---- */

/* One gradient's square for the norm. An inf or NaN gradient must reach
 * the sum: it is fp16's overflow flag (the mutant drops it, as a norm made
 * "robust" to overflow would, on the 16-bit paths). */
template <typename T> static __device__ __forceinline__ double sq(float v)
{
	if (sizeof(T) == 2 && MUTANT(amp_norm) && !isfinite(v))
		return 0;
	return (double)v * v;
}

/* T: in0's dtype (float, cu_bf16, __half); vec: f32 four per float4,
 * 16-bit eight per 128-bit load */
template <typename T> __global__ void k_sqnorm_part(const T *a, int64_t n, int vec, double *part)
{
	__shared__ double sh[32];
	double s = 0;
	if (vec && sizeof(T) == 2) {
		CU_FOR_EACH(i, n / 8) {
			float v[8];
			ld8(a + 8 * i, v);
			for (int k = 0; k < 8; k++)
				s += sq<T>(v[k]);
		}
	} else if (vec) {
		CU_FOR_EACH(i, n / 4) {
			float4 v = ld4((const float *)a + 4 * i);
			s += (double)v.x * v.x;
			s += (double)v.y * v.y;
			s += (double)v.z * v.z;
			s += (double)v.w * v.w;
		}
	} else {
		CU_FOR_EACH(i, n)
			s += sq<T>(ld(a + i));
	}
	s = block_sum<double>(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void k_sqnorm_sum(float *o, const double *part, int nparts, int accumulate, float w)
{
	__shared__ double sh[32];
	double s = 0;
	for (int i = threadIdx.x; i < nparts; i += blockDim.x)
		s += part[i];
	s = block_sum<double>(s, sh);
	if (threadIdx.x == 0)
		o[0] = (float)((accumulate ? (double)o[0] : 0.0) + (double)w * s);
}

/* the partial sums of in0 (of type T) into scratch; the blocks launched */
template <typename T> static unsigned sqnorm_parts(const CuArgs *a, int64_t n)
{
	int w = sizeof(T) == 2 ? 8 : 4; /* elements per 128-bit load */
	int vec = n % w == 0 && cu_aligned16(cu_p(a, 0));
	unsigned nb = cu_grid(vec ? n / w : n);
	nb = nb < CU_REDUCE_BLOCKS ? nb : CU_REDUCE_BLOCKS;
	CU_LAUNCH(k_sqnorm_part<T>, nb, CU_THREADS, a->st, (const T *)cu_p(a, 0), n, vec,
		  (double *)a->scratch);
	return nb;
}

static int run_sqnorm(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, 0));
	unsigned dt = cu_t(a, 0)->dtype;
	unsigned nb = dt == DP_BF16 ? sqnorm_parts<cu_bf16>(a, n)
		      : dt == DP_F16 ? sqnorm_parts<__half>(a, n)
				     : sqnorm_parts<float>(a, n);
	CU_LAUNCHED(a, e);
	float w = DP_FATTR(a->in, SQNORM, weight); /* tp weight, 0 = 1 */
	CU_LAUNCH(k_sqnorm_sum, 1, CU_THREADS, a->st, cu_f(a, -1), (const double *)a->scratch,
		  (int)nb, DP_ATTR(a->in, SQNORM, acc) != 0, w != 0 ? w : 1.0f);
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

/* ---- loss scaling (amp.h): unscale, the overflow check ---- */

/* GradScaler.unscale_: grads *= the f32 reciprocal of the step's scale
 * (computed in double, as the CPU's run_unscale), in f32; 16-bit gradients
 * (reduce_dtype f16) widened on load and rounded once on store, what the
 * CPU's staged f32 copy computes. T: float, __half (or cu_bf16). */
template <typename T> __global__ void k_unscale(T *o, int64_t n, const CuScalars *sc)
{
	float inv = (float)(1.0 / (double)sc->amp.scale);
	CU_FOR_EACH(i, n)
		st(o + i, ld(o + i) * inv);
}

static int run_unscale(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	if (n <= 0)
		return 0;
	unsigned dt = cu_t(a, -1)->dtype;
	if (dt == DP_F16)
		CU_LAUNCH(k_unscale<__half>, cu_grid(n), CU_THREADS, a->st, (__half *)cu_p(a, -1), n,
			  a->sc);
	else if (dt == DP_BF16)
		CU_LAUNCH(k_unscale<cu_bf16>, cu_grid(n), CU_THREADS, a->st, (cu_bf16 *)cu_p(a, -1),
			  n, a->sc);
	else
		CU_LAUNCH(k_unscale<float>, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), n, a->sc);
	CU_LAUNCHED(a, e);
	return 0;
}

/* found_inf: the global norm is not finite; read on the device by the
 * optimizer kernels and the step's amp update, never by the host mid-step */
__global__ void k_amp_check(CuScalars *sc, const float *norm)
{
	sc->ls_found = !isfinite(norm[0]);
}

static int run_amp_check(const CuArgs *a, RtErr *e)
{
	CU_LAUNCH(k_amp_check, 1, 1, a->st, a->sc, cu_f(a, 0));
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

template <typename T>
__global__ void k_clip(T *o, int64_t n, const float *norm, float max_norm, const CuScalars *sc)
{
	if (sc->ls_found) /* loss scaling: an overflowing step clips nothing */
		return;
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
	if (cu_t(a, -1)->dtype == DP_BF16)
		CU_LAUNCH(k_clip<cu_bf16>, cu_grid(n), CU_THREADS, a->st, (cu_bf16 *)cu_p(a, -1), n,
			  cu_f(a, 0), DP_FATTR(a->in, CLIP, max_norm), a->sc);
	else if (cu_t(a, -1)->dtype == DP_F16)
		CU_LAUNCH(k_clip<__half>, cu_grid(n), CU_THREADS, a->st, (__half *)cu_p(a, -1), n,
			  cu_f(a, 0), DP_FATTR(a->in, CLIP, max_norm), a->sc);
	else
		CU_LAUNCH(k_clip<float>, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), n, cu_f(a, 0),
			  DP_FATTR(a->in, CLIP, max_norm), a->sc);
	CU_LAUNCHED(a, e);
	return 0;
}

/* f rounded to G and widened back: what a store into G keeps */
template <typename G> static __device__ __forceinline__ float as_stored(float f) { return f; }
template <> __device__ __forceinline__ float as_stored<cu_bf16>(float f)
{
	return cu_from_bf16(cu_to_bf16(f));
}
template <> __device__ __forceinline__ float as_stored<__half>(float f)
{
	return cu_from_f16(cu_to_f16(f));
}

/* The folded clip of one gradient: what clip would have stored (g * coef,
 * rounded to bf16 or f16 when the gradients are) and the optimizer then
 * read. Without the rounding a bf16 run would differ from clip-then-update
 * by up to one bf16 ulp per element (measured: 3.6e-3 relative in mlp8's
 * first SGD update with reduce_dtype bf16). */
template <typename G> static __device__ __forceinline__ float clipped(float g, float coef)
{
	if (!(coef < 1.0f))
		return g;
	g = g * coef;
	return sizeof(G) == 2 && !MUTANT(bf16_clipfold) ? as_stored<G>(g) : g;
}

/* ---- SGD with momentum: g += wd*p; buf = g (t = 1) or mom*buf + g; p -= lr*buf,
 * or with nesterov p -= lr*(g + mom*buf) ---- */

/* G: the gradient's dtype (f32, or bf16 / f16 widened as it is read) */
template <typename G>
__global__ void k_sgd(float *p, const G *g, float *buf, cu_bf16 *copy, int cf16, int64_t n,
		      float mom, float wd, float lr_scale, int nesterov, const CuScalars *sc,
		      const float *norm, float max_norm)
{
	if (sc->ls_found && !MUTANT(amp_flag)) /* loss scaling: an overflowing step updates nothing */
		return;
	float lr = dp_group_lr(sc->lr, lr_scale), coef = clip_coef(norm, max_norm);
	int64_t t = sc->t;
	CU_FOR_EACH(i, n) {
		float gi = clipped<G>(ld(g + i), coef), pi = ld(p + i); /* the folded clip */
		if (wd != 0)
			gi = gi + wd * pi;
		if (mom != 0) {
			float b = t <= 1 ? gi : mom * ld(buf + i) + gi;
			st(buf + i, b);
			gi = nesterov ? gi + mom * b : b;
		}
		pi = pi - lr * gi;
		st(p + i, pi);
		if (copy)
			copy[i] = cu_to_half(cf16, pi);
	}
}

static int run_sgd(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	if (n <= 0)
		return 0;
	int nesterov = a->s->opt.nesterov != 0;
	float mom = DP_FATTR(a->in, SGD, momentum), wd = DP_FATTR(a->in, SGD, weight_decay);
	float ls = DP_FATTR(a->in, SGD, lr_scale);
	int cf16 = a->in->in[2] >= 0 && cu_t(a, 2)->dtype == DP_F16;
	if (cu_t(a, 0)->dtype == DP_BF16)
		CU_LAUNCH(k_sgd<cu_bf16>, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1),
			  (const cu_bf16 *)cu_p(a, 0), cu_f(a, 1), (cu_bf16 *)cu_p(a, 2), cf16, n, mom,
			  wd, ls, nesterov, a->sc, a->fuse->clip_norm, a->fuse->clip_max);
	else if (cu_t(a, 0)->dtype == DP_F16)
		CU_LAUNCH(k_sgd<__half>, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1),
			  (const __half *)cu_p(a, 0), cu_f(a, 1), (cu_bf16 *)cu_p(a, 2), cf16, n, mom,
			  wd, ls, nesterov, a->sc, a->fuse->clip_norm, a->fuse->clip_max);
	else
		CU_LAUNCH(k_sgd<float>, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), cu_f(a, 0),
			  cu_f(a, 1), (cu_bf16 *)cu_p(a, 2), cf16, n, mom, wd, ls, nesterov, a->sc,
			  a->fuse->clip_norm, a->fuse->clip_max);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- AdamW: the CPU's order; constants from the schedule kernel ---- */

struct AdamK {
	float decay, step_size, bc2_sqrt, beta1, beta2, one_b1, one_b2, eps, coef;
};

/* an update's optimizer group (its attributes) */
struct AdamGroup {
	float weight_decay, lr_scale;
};

/* g: the gradient after the folded clip (clipped<G>) */
static __device__ __forceinline__ float adam_one(const AdamK &k, float g, float *p, float *m,
						 float *v)
{
	float pi = *p * k.decay;
	float mi = *m * k.beta1 + k.one_b1 * g;
	float vi = *v * k.beta2 + k.one_b2 * (g * g);
	float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
	*m = mi;
	*v = vi;
	return pi + (-k.step_size * mi) / denom;
}

/* The group's lr (dp_group_lr) in double, then decay and step size as the
 * CPU's run_adamw computes them */
static __device__ __forceinline__ AdamK adam_k(const CuScalars *sc, AdamGroup gr, float beta1,
					       float beta2, float eps, const float *norm,
					       float max_norm)
{
	AdamK k;
	double lr = dp_group_lr(sc->lr, gr.lr_scale);
	k.decay = (float)(1.0 - lr * gr.weight_decay);
	k.step_size = (float)(lr / sc->bc1);
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

/* Element i of one update: the CPU's arithmetic (k_adamw, and the
 * multi-tensor kernel's unaligned updates) */
template <typename G>
static __device__ __forceinline__ void adamw_at(const AdamK &k, float *p, const G *g, float *m,
						float *v, cu_bf16 *copy, int cf16, int64_t i)
{
	float pi = ld(p + i), mi = ld(m + i), vi = ld(v + i);
	pi = adam_one(k, clipped<G>(ld(g + i), k.coef), &pi, &mi, &vi);
	st(p + i, pi);
	st(m + i, mi);
	st(v + i, vi);
	if (copy)
		copy[i] = cu_to_half(cf16, pi);
}

template <typename G>
__global__ void k_adamw(float *p, const G *g, float *m, float *v, cu_bf16 *copy, int cf16,
			int64_t n, AdamGroup gr, float beta1, float beta2, float eps,
			const CuScalars *sc, const float *norm, float max_norm)
{
	if (sc->ls_found && !MUTANT(amp_flag)) /* loss scaling: an overflowing step updates nothing */
		return;
	AdamK k = adam_k(sc, gr, beta1, beta2, eps, norm, max_norm);
	CU_FOR_EACH(i, n)
		adamw_at<G>(k, p, g, m, v, copy, cf16, i);
}

/* four gradients: a float4, or four bf16 or f16 in one 8-byte load */
static __device__ __forceinline__ float4 ld4g(const float *g) { return ld4(g); }
template <typename H> static __device__ __forceinline__ float4 ld4g(const H *g)
{
	uint2 w = *(const uint2 *)g;
	return make_float4(CuHalf<H>::from((uint16_t)w.x), CuHalf<H>::from((uint16_t)(w.x >> 16)),
			   CuHalf<H>::from((uint16_t)w.y), CuHalf<H>::from((uint16_t)(w.y >> 16)));
}

/* Elements 4 i .. 4 i + 3 of one update, the same arithmetic per element
 * as adamw_at: p, m, v 16-byte aligned, g 16 (f32) or 8 (16-bit), the copy
 * 8-byte (k_adamw4, and the multi-tensor kernel's aligned updates) */
template <typename G>
static __device__ __forceinline__ void adamw_at4(const AdamK &k, float *p, const G *g, float *m,
						 float *v, cu_bf16 *copy, int cf16, int64_t i)
{
	float4 pp = ld4(p + 4 * i), gg = ld4g(g + 4 * i), mm = ld4(m + 4 * i), vv = ld4(v + 4 * i);
	pp.x = adam_one(k, clipped<G>(gg.x, k.coef), &pp.x, &mm.x, &vv.x);
	pp.y = adam_one(k, clipped<G>(gg.y, k.coef), &pp.y, &mm.y, &vv.y);
	pp.z = adam_one(k, clipped<G>(gg.z, k.coef), &pp.z, &mm.z, &vv.z);
	pp.w = adam_one(k, clipped<G>(gg.w, k.coef), &pp.w, &mm.w, &vv.w);
	st4(p + 4 * i, pp);
	st4(m + 4 * i, mm);
	st4(v + 4 * i, vv);
	if (copy)
		*(uint2 *)(copy + 4 * i) =
			make_uint2(cu_to_half(cf16, pp.x) | (uint32_t)cu_to_half(cf16, pp.y) << 16,
				   cu_to_half(cf16, pp.z) | (uint32_t)cu_to_half(cf16, pp.w) << 16);
}

/* n4 groups of four (adamw_at4's alignment) */
template <typename G>
__global__ void k_adamw4(float *p, const G *g, float *m, float *v, cu_bf16 *copy, int cf16,
			 int64_t n4, AdamGroup gr, float beta1, float beta2, float eps,
			 const CuScalars *sc, const float *norm, float max_norm)
{
	if (sc->ls_found && !MUTANT(amp_flag)) /* loss scaling: an overflowing step updates nothing */
		return;
	AdamK k = adam_k(sc, gr, beta1, beta2, eps, norm, max_norm);
	CU_FOR_EACH(i, n4)
		adamw_at4<G>(k, p, g, m, v, copy, cf16, i);
}

/*
 * ---- multi-tensor AdamW: a run of updates in one launch ----
 *
 * GPT-2 124M's optimizer is 99 adamw instructions (the flat buffer's runs
 * of one optimizer group: each layer's weights with weight decay, its
 * biases and norms without, passes/layout.c), which ran as 99 launches:
 * 1.45 ms a step on an H200 (the fifth GPU session's trace) against ~0.73
 * ms of bytes, the small runs' launches and every launch's tail wave the
 * difference. cu_plan_adamw finds, at load, each run of adamw instructions
 * that this rank walks one after another (no other instruction of its
 * between them), on one stream, with the same flags (so the executor runs
 * all or none of them), the same gradient dtype and the same folded clip,
 * none of them writing memory another reads or writes (so no order among
 * them matters), none a host step (offload). A run of two or more becomes
 * one launch at its first instruction: a table of its updates (CuMtTensor:
 * addresses, sizes, the group's weight_decay and lr_scale, the copy and its
 * dtype, whether the 16-byte path's alignment holds) and of its chunks
 * (MT_CHUNK elements of one update a block, (update, chunk) per block),
 * built once into device memory: the captured graph replays the same
 * launch with no host-to-device copy per step, since the addresses are
 * the arena's and the per-step values (lr, bias corrections, the clip's
 * norm, the overflow flag) are read from the device as k_adamw reads them.
 * The other instructions of the run have skip and launch nothing.
 *
 * Per element the arithmetic is k_adamw's (adamw_at, adamw_at4: the same
 * functions), each update's AdamK from its own group: bitwise today's
 * per-update kernels (tests/cuda_emu.sh's multi-tensor cases compare the
 * two, DP_MULTI_TENSOR=off giving the per-update launches). A runtime
 * grouping rather than a compiler op: the step file, the CPU backend, the
 * checkpoints' layout (find_optimizer reads each update instruction) and
 * the IR stay as they are, and a multi-tensor op would need operands past
 * DP_MAX_IN.
 */
#define MT_CHUNK 8192 /* elements of one update per block: 32 a thread at 256 */

struct CuMtTensor {
	float *p, *m, *v;
	const void *g;       /* the gradient, of the run's dtype G */
	cu_bf16 *copy;       /* the 16-bit compute copy, or NULL */
	int64_t n;
	AdamGroup gr;
	int cf16;            /* the copy is f16 */
	int vec;             /* adamw_at4's alignment holds, n % 4 == 0 */
};

template <typename G>
__global__ void k_adamw_mt(const CuMtTensor *ts, const uint32_t *chunk, float beta1, float beta2,
			   float eps, const CuScalars *sc, const float *norm, float max_norm)
{
	if (sc->ls_found && !MUTANT(amp_flag)) /* loss scaling: an overflowing step updates nothing */
		return;
	const CuMtTensor *t = ts + chunk[2 * blockIdx.x];
	int64_t lo = (int64_t)chunk[2 * blockIdx.x + 1] * MT_CHUNK;
	int64_t hi = lo + MT_CHUNK < t->n ? lo + MT_CHUNK : t->n;
	hi -= MUTANT(mt_chunk) ? 1 : 0; /* (the mutant: every chunk's end one short) */
	float *p = t->p, *m = t->m, *v = t->v;
	const G *g = (const G *)t->g;
	cu_bf16 *copy = t->copy;
	int cf16 = t->cf16;
	AdamK k = adam_k(sc, MUTANT(mt_group) ? ts[0].gr : t->gr, beta1, beta2, eps, norm, max_norm);
	if (t->vec)
		for (int64_t i = lo / 4 + threadIdx.x; i < hi / 4; i += blockDim.x)
			adamw_at4<G>(k, p, g, m, v, copy, cf16, i);
	else
		for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
			adamw_at<G>(k, p, g, m, v, copy, cf16, i);
}

/* k_adamw4's (and adamw_at4's) alignment */
template <typename G>
static int adamw_vec(const float *p, const G *g, const float *m, const float *v, const cu_bf16 *copy,
		     int64_t n)
{
	return n % 4 == 0 && cu_aligned16(p) && ((uintptr_t)g & (4 * sizeof(G) - 1)) == 0 &&
	       cu_aligned16(m) && cu_aligned16(v) && ((uintptr_t)copy & 7u) == 0;
}

template <typename G> static int run_adamw_t(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	const DpOptim *o = &a->s->opt;
	float *p = cu_f(a, -1), *m = cu_f(a, 1), *v = cu_f(a, 2);
	const G *g = (const G *)cu_p(a, 0);
	cu_bf16 *copy = (cu_bf16 *)cu_p(a, 3); /* the 16-bit compute copy, or NULL */
	int cf16 = copy && cu_t(a, 3)->dtype == DP_F16;
	AdamGroup gr = {DP_FATTR(a->in, ADAMW, weight_decay), DP_FATTR(a->in, ADAMW, lr_scale)};
	if (a->fuse->skip) /* a multi-tensor launch before it did it */
		return 0;
	if (a->fuse->mt) {
		CU_LAUNCH(k_adamw_mt<G>, a->fuse->mt_nchunk, CU_THREADS, a->st, a->fuse->mt,
			  a->fuse->mt_chunk, o->beta1, o->beta2, o->eps, a->sc, a->fuse->clip_norm,
			  a->fuse->clip_max);
		CU_LAUNCHED(a, e);
		return 0;
	}
	if (n <= 0)
		return 0;
	if (adamw_vec<G>(p, g, m, v, copy, n))
		CU_LAUNCH(k_adamw4<G>, cu_grid(n / 4), CU_THREADS, a->st, p, g, m, v, copy, cf16,
			  n / 4, gr, o->beta1, o->beta2, o->eps, a->sc, a->fuse->clip_norm,
			  a->fuse->clip_max);
	else
		CU_LAUNCH(k_adamw<G>, cu_grid(n), CU_THREADS, a->st, p, g, m, v, copy, cf16, n, gr,
			  o->beta1, o->beta2, o->eps, a->sc, a->fuse->clip_norm, a->fuse->clip_max);
	CU_LAUNCHED(a, e);
	return 0;
}

static int run_adamw(const CuArgs *a, RtErr *e)
{
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_BF16  ? run_adamw_t<cu_bf16>(a, e)
	       : dt == DP_F16 ? run_adamw_t<__half>(a, e)
			      : run_adamw_t<float>(a, e);
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
			if (c->op != DP_OP_CLIP || !cu_plan_runs(p, c))
				continue;
			const DpTensor *grads = &s->tensors[c->out], *norm = &s->tensors[c->in[0]];
			int ok = 0, norm_written = 0, nconsumers = 0;
			for (uint32_t j = i + 1; j < s->nprog[pg]; j++) {
				const DpInstr *k = &s->prog[pg][j];
				/* another stage's: its parts share these bytes. (A
				 * mutant dropping these guards was caught on gpt2-tiny
				 * at pp=4 while its tied wte's clip ran on every stage;
				 * since the tied range lives on its own stages alone
				 * (passes/stage_params.c) no model of the suites lays
				 * out a program where the guards change the fold: they
				 * stay as the rule, without a mutant.) */
				if (!cu_plan_runs(p, k))
					continue;
				int is_opt = k->op == DP_OP_ADAMW || k->op == DP_OP_SGD;
				int out_hits = k->out >= 0 && overlaps(&s->tensors[k->out], grads);
				if (is_opt && k->in[0] >= 0 && overlaps(&s->tensors[k->in[0]], grads)) {
					if (!inside(&s->tensors[k->in[0]], grads) || out_hits ||
					    touches_in(s, k, grads, 1) || k->stream != c->stream ||
					    (k->flags & DP_IF_LAST) != (c->flags & DP_IF_LAST) ||
					    norm_written || p->fuse[pg][j].clip_norm)
						break;
					nconsumers++;
				} else if (out_hits && k->op == DP_OP_FILL && inside(grads, &s->tensors[k->out]) &&
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
				if (!cu_plan_runs(p, k))
					continue;
				if ((k->op == DP_OP_ADAMW || k->op == DP_OP_SGD) && k->in[0] >= 0 &&
				    overlaps(&s->tensors[k->in[0]], grads)) {
					p->fuse[pg][j].clip_norm = (const float *)p->ptr[c->in[0]];
					p->fuse[pg][j].clip_max = DP_FATTR(c, CLIP, max_norm);
				}
				if (k->op == DP_OP_FILL && k->out >= 0 && inside(grads, &s->tensors[k->out]))
					break;
			}
		}
	return 0;
}

/* ---- planning: runs of AdamW updates as one multi-tensor launch ---- */

/* DP_MULTI_TENSOR: unset, empty, "on" or "1": 1 (the default); "off" or
 * "0": 0 (one launch per update, the A/B switch of docs/CUDA.md); else -1 */
static int mt_mode = -2;
static int mt_switch(const char **v)
{
	*v = getenv("DP_MULTI_TENSOR");
	int c = cu_env_choice(&mt_mode, "DP_MULTI_TENSOR", "on|1", "off|0");
	return c < 0 ? -1 : !c;
}

/* Does a (an update) write bytes that any operand of b lies on? Device
 * addresses: the planner's view is the arena's, whatever the tensors' names. */
static int mt_writes_into(const CuPlan *p, const DpInstr *a, const DpInstr *b)
{
	const int wa[4] = {a->out, a->in[1], a->in[2], a->in[3]}; /* p, m, v, the copy */
	const int ob[5] = {b->out, b->in[0], b->in[1], b->in[2], b->in[3]};
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 5; j++) {
			if (wa[i] < 0 || ob[j] < 0)
				continue;
			const char *x = (const char *)p->ptr[wa[i]], *y = (const char *)p->ptr[ob[j]];
			if (x < y + p->s->tensors[ob[j]].nbytes && y < x + p->s->tensors[wa[i]].nbytes)
				return 1;
		}
	return 0;
}

/* May update k join the run that starts with update h (members so far:
 * mem[0..nm))? The executor must run all of them or none, on one stream,
 * and no member may see another's writes. */
static int mt_joins(const CuPlan *p, int pg, const uint32_t *mem, int nm, uint32_t j)
{
	const DpStep *s = p->s;
	const DpInstr *h = &s->prog[pg][mem[0]], *k = &s->prog[pg][j];
	const CuFuse *fh = &p->fuse[pg][mem[0]], *fk = &p->fuse[pg][j];
	if (k->op != DP_OP_ADAMW || dp_runs_on_host(s, k) || fk->skip || k->stream != h->stream ||
	    k->flags != h->flags || s->tensors[k->in[0]].dtype != s->tensors[h->in[0]].dtype ||
	    fk->clip_norm != fh->clip_norm || fk->clip_max != fh->clip_max)
		return 0;
	for (int q = 0; q < nm; q++) {
		const DpInstr *o = &s->prog[pg][mem[q]];
		if (mt_writes_into(p, k, o) || mt_writes_into(p, o, k))
			return 0;
	}
	return 1;
}

/* The run mem[0..nm) as one launch at mem[0]: its tables into device memory. */
static int mt_build(CuPlan *p, int pg, const uint32_t *mem, int nm, RtErr *e)
{
	const DpStep *s = p->s;
	uint64_t nchunk = 0;
	for (int q = 0; q < nm; q++) {
		int64_t n = cu_numel(&s->tensors[s->prog[pg][mem[q]].out]);
		nchunk += n > 0 ? (uint64_t)((n + MT_CHUNK - 1) / MT_CHUNK) : 0;
	}
	CuMtTensor *ts = (CuMtTensor *)calloc((size_t)nm, sizeof *ts);
	uint32_t *ch = (uint32_t *)calloc((size_t)nchunk * 2 + 2, sizeof *ch);
	if (!ts || !ch) {
		free(ts);
		free(ch);
		return RT_FAIL(e, "out of memory (the multi-tensor AdamW's tables)");
	}
	uint64_t c = 0;
	for (int q = 0; q < nm; q++) {
		const DpInstr *in = &s->prog[pg][mem[q]];
		CuMtTensor *t = &ts[q];
		t->p = (float *)p->ptr[in->out];
		t->g = p->ptr[in->in[0]];
		t->m = (float *)p->ptr[in->in[1]];
		t->v = (float *)p->ptr[in->in[2]];
		t->copy = in->in[3] >= 0 ? (cu_bf16 *)p->ptr[in->in[3]] : NULL;
		t->cf16 = t->copy && s->tensors[in->in[3]].dtype == DP_F16;
		t->n = cu_numel(&s->tensors[in->out]);
		t->gr = {DP_FATTR(in, ADAMW, weight_decay), DP_FATTR(in, ADAMW, lr_scale)};
		unsigned dt = s->tensors[in->in[0]].dtype;
		t->vec = dt == DP_BF16   ? adamw_vec(t->p, (const cu_bf16 *)t->g, t->m, t->v, t->copy, t->n)
			 : dt == DP_F16 ? adamw_vec(t->p, (const __half *)t->g, t->m, t->v, t->copy, t->n)
					: adamw_vec(t->p, (const float *)t->g, t->m, t->v, t->copy, t->n);
		for (int64_t k = 0; k * MT_CHUNK < t->n; k++, c++) {
			ch[2 * c] = (uint32_t)q;
			ch[2 * c + 1] = (uint32_t)k;
		}
	}
	CuFuse *f = &p->fuse[pg][mem[0]];
	void *dts = p->alloc(p, (size_t)nm * sizeof *ts), *dch = p->alloc(p, (size_t)nchunk * 8);
	cudaError_t err = !dts || !dch ? cudaErrorMemoryAllocation
			  : p->upload(p, dts, ts, (size_t)nm * sizeof *ts);
	if (err == cudaSuccess)
		err = p->upload(p, dch, ch, (size_t)nchunk * 8);
	free(ts);
	free(ch);
	if (err != cudaSuccess)
		return RT_FAIL(e, "the multi-tensor AdamW's tables (%s program, instructions %u..%u): %s (%s)",
			       dp_prog_names[pg], mem[0], mem[nm - 1], cudaGetErrorString(err),
			       cudaGetErrorName(err));
	f->mt = (const CuMtTensor *)dts;
	f->mt_chunk = (const uint32_t *)dch;
	f->mt_nchunk = (uint32_t)nchunk;
	f->mt_n = (uint32_t)nm;
	for (int q = 1; q < nm; q++)
		p->fuse[pg][mem[q]].skip = 1;
	return 0;
}

/*
 * The runs of the multi-tensor AdamW (the kernel's comment above): in each
 * program, from an update this rank runs, the updates after it that this
 * rank runs with none of its other instructions between them and that
 * mt_joins accepts. A run of one stays k_adamw4 / k_adamw, and so does
 * everything under DP_MULTI_TENSOR=off. Zero-sized updates (launching
 * nothing either way) count as members without chunks.
 */
extern "C" int cu_plan_adamw(CuPlan *p, RtErr *e)
{
	const DpStep *s = p->s;
	const char *v;
	int on = mt_switch(&v);
	if (on < 0)
		return RT_FAIL(e, "DP_MULTI_TENSOR=%.60s: expected on or off (the multi-tensor AdamW)", v);
	if (!on)
		return 0;
	for (int pg = 0; pg < DP_NPROG; pg++) {
		uint32_t *mem = (uint32_t *)calloc(s->nprog[pg] ? s->nprog[pg] : 1, sizeof *mem);
		if (!mem)
			return RT_FAIL(e, "out of memory (the multi-tensor AdamW's plan)");
		uint32_t i = 0;
		while (i < s->nprog[pg]) {
			const DpInstr *h = &s->prog[pg][i];
			int nm = 0;
			uint64_t chunks = 0;
			if (h->op != DP_OP_ADAMW || !cu_plan_runs(p, h) || dp_runs_on_host(s, h)) {
				i++;
				continue;
			}
			mem[nm++] = i;
			chunks += (uint64_t)((cu_numel(&s->tensors[h->out]) + MT_CHUNK - 1) / MT_CHUNK);
			uint32_t j = i + 1;
			for (; j < s->nprog[pg]; j++) {
				const DpInstr *k = &s->prog[pg][j];
				if (!cu_plan_runs(p, k))
					continue;
				int64_t n = cu_numel(&s->tensors[k->out]);
				chunks += n > 0 ? (uint64_t)((n + MT_CHUNK - 1) / MT_CHUNK) : 0;
				if (chunks > INT32_MAX || !mt_joins(p, pg, mem, nm, j))
					break;
				mem[nm++] = j;
			}
			int sized = 0;
			for (int q = 0; q < nm; q++)
				sized += cu_numel(&s->tensors[s->prog[pg][mem[q]].out]) > 0;
			if (sized >= 2 && mt_build(p, pg, mem, nm, e)) {
				free(mem);
				return -1;
			}
			i = j;
		}
		free(mem);
	}
	return 0;
}

extern "C" void cu_plan_adamw_line(const CuPlan *p, char *buf, size_t len)
{
	const DpStep *s = p->s;
	unsigned updates = 0, launches = 0, runs = 0;
	for (int pg = 0; pg < DP_NPROG; pg++)
		for (uint32_t i = 0; i < s->nprog[pg]; i++) {
			const DpInstr *in = &s->prog[pg][i];
			if (in->op != DP_OP_ADAMW || !cu_plan_runs(p, in) || dp_runs_on_host(s, in))
				continue;
			updates++;
			launches += !p->fuse[pg][i].skip;
			runs += p->fuse[pg][i].mt != NULL;
		}
	const char *v;
	if (!updates)
		buf[0] = 0;
	else if (mt_switch(&v) == 0)
		snprintf(buf, len, "AdamW: %u update%s in %u launch%s (DP_MULTI_TENSOR=off)", updates,
			 updates == 1 ? "" : "s", launches, launches == 1 ? "" : "es");
	else
		snprintf(buf, len, "AdamW: %u update%s in %u launch%s (%u multi-tensor)", updates,
			 updates == 1 ? "" : "s", launches, launches == 1 ? "" : "es", runs);
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_optim_rows[] = {
	{DP_OP_SQNORM, run_sqnorm, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SQRT, run_sqrt, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_CLIP, run_clip, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SGD, run_sgd, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_ADAMW, run_adamw, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_UNSCALE, run_unscale, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_AMP_CHECK, run_amp_check, NULL, 0, NULL, NULL, 0, 0},
	{},
};
