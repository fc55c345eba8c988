/*
 * attention.cu - causal multi-head attention on CUDA in the flash style
 * (tiled, online softmax, no T x T matrix in memory; the backward
 * recomputes), for the ordinary op and the context-parallel ones (the CPU's
 * runtime/cpu/seq.c attention and runtime/cpu/attention_cp.c):
 *   attention            out [B,T,C] from qkv [B,T,3C] (per head [q|k|v] of hd)
 *   attention_grad       d qkv from {dy, qkv}
 *   attention_cp         this cp rank's queries (zigzag positions pos [T])
 *                        against the gathered keys kv [cp,B,T,2C] (per head [k|v])
 *   attention_cp_grad    d qkv, only the q columns set (k and v columns 0)
 *   attention_cp_grad_kv d kv [cp,B,T,2C] of every gathered key
 *   attention_cp_grad_both both of the last two, from one backward
 *                        (passes/fuse.c: d kv, then d qkv, in one output)
 *
 * Keys are walked in position order: for the ordinary op key position p is
 * row p of the batch; for cp it is the zigzag chunk p / L (L = T/2) of the
 * gathered block of rank r = chunk (chunk < cp) or 2cp-1-chunk, row
 * (chunk < cp ? 0 : L) + p % L. A query at position q sees the keys at
 * positions <= q.
 *
 * Kernels (64 query or key rows per block, 4 threads per row, each owning
 * every 4th of the HD head dims, HD the head dim rounded up to 16, 32, 64,
 * 128 or 256; key/query tiles in shared memory):
 *   k_attn_fwd<HD>   per query tile: over key tiles up to the tile's last
 *                    position, scores s = scale * q.k (the row's 4 threads'
 *                    partial dot products combined by xor shuffles), masked,
 *                    the tile's max, then o = o * exp(m - m') + sum p v and
 *                    l likewise (l in double); out = o / l.
 *   k_attn_bwd_q<HD> per query tile: the forward again (m, l, O), then
 *                    D = dO . O and, with m and inv = 1/l kept per row,
 *                    p = exp(s - m) * inv, dp = dO . v, ds = p (dp - D),
 *                    dQ = scale * sum ds k. Leaves (m, inv, D) per query row
 *                    in scratch for:
 *   k_attn_bwd_kv<HD> per key tile: over the query tiles that can see it,
 *                    dV = sum p dO, dK = scale * sum ds q.
 *   k_attn_fwd_mma<HD> the forward of bf16 attention (ordinary or cp) with head dim
 *                    HD = 32, 64 or 128 on tensor cores (mma.sync and ldmatrix,
 *                    mma_ptx.cuh; FlashAttention-2's structure with S, P and O
 *                    in registers; the comment above it), and of f32 attention
 *                    so in tf32 under gemm_math tf32 (mma.sync m16n8k8 .tf32);
 *                    k_attn_fwd does the rest.
 *                    Paired with its gradient (cu_plan_attn, at the end) it
 *                    leaves each row's lse for it; else the backward runs it
 *                    again for each row's lse and D.
 *   k_attn_bwd_mma<HD> the backward of the same attention on tensor cores
 *                    from those, FlashAttention-2's: one kernel walking key
 *                    blocks gives dK, dV and (into per-run f32 sums, then
 *                    k_attn_dq_store4, four columns per thread, or
 *                    k_attn_dq_store) dQ (its comment below);
 *                    k_attn_bwd_q/kv do the rest.
 *   k_attn_dq_mma<HD> under DP_ATTN_DQ=split (an experiment, docs/CUDA.md):
 *                    dQ by query tile in a pass of its own, beside
 *                    k_attn_bwd_mma<.., DQ false>'s dK and dV (the ordinary op).
 *                    Under DP_ATTN_BWD=pipe (another experiment) the
 *                    backward runs k_attn_bwd_mma<.., PIPE true>: one
 *                    barrier per query tile, the default's bits.
 * Every output element is written by one thread with a fixed loop order,
 * and the tensor-core backward's dQ is summed over key blocks in an order
 * fixed by the shapes (no atomics): deterministic, graph == eager.
 *
 * Numerics against the CPU (which does S = scale * Q K^T and P V with
 * sgemm, the softmax with the final max, expf, a double sum and a float
 * 1/sum): the dot products are summed in another order (4 strided partial
 * sums, then a butterfly), the softmax is the online one (rescaled by
 * expf(m - m') as the max grows), and D is dO . O instead of rowsum(P * dP)
 * (equal in exact arithmetic). Each is a few float ulp per value; through
 * T keys the outputs agree to ~1e-6 relative (larger where values cancel).
 * This file is compiled with FMA contraction (mk/cuda.mk): it cannot match
 * the CPU bit for bit anyway, and FMAs are most of its work.
 *
 * bf16 (precision bf16): every kernel is templated on the storage of qkv,
 * kv, dy and the output (Geom<T>); the tiles and rows are widened into
 * float on load (eight at a time, 128 bits, when the head dim is a multiple
 * of 8 and the operands are 16-byte aligned), the arithmetic is the f32
 * kernel's, each output element is rounded once: what the f32 kernel on
 * staged copies gave (the loads change, not the order of any sum).
 */
#include "device.cuh"
#include "mma_ptx.cuh"

#include <stdlib.h>
#include <string.h>

#define ATT_ROWS 64                       /* query (or key) rows per block */
#define ATT_LANES 4                       /* threads per row */
#define ATT_THREADS (ATT_ROWS * ATT_LANES) /* 256 */

/* Keys per shared tile: the tiles of K and V (or Q and dO) stay <= 32 KB. */
template <int HD> struct Tile {
	static const int N = HD <= 128 ? 32 : 16;
	static const int PER = HD / ATT_LANES; /* head dims per thread */
};

/* Where the operands are; the same for every kernel of one instruction.
 * T: the storage of qkv, kv, dy and the output (float or cu_bf16). */
template <typename T> struct Geom {
	const T *qkv;        /* [B, T, 3C] */
	const T *kv;         /* cp: [cp, B, T, 2C]; NULL: the keys are qkv's */
	const int32_t *pos;  /* cp: the query rows' positions [T] */
	int64_t b, t, h, c, hd; /* batch, local rows, heads, C, head dim */
	int64_t cp;          /* 0: ordinary attention */
	int64_t nkeys;       /* keys per (batch, head): T, or cp * T */
	float scale;
	int vec8;            /* the tiles load eight bf16 (128 bits) at a time: bf16, hd a
	                        multiple of 8, qkv, kv and dy 16-byte aligned */
	int tcvec;           /* the tensor-core tiles copy 16 bytes at a time: vec8, or for
	                        f32 hd a multiple of 4 and the same alignment */
};

/* The position of query row t (clamped: a bad position is reported by
 * k_cp_check and must not take a kernel out of bounds). */
template <typename T> static __device__ __forceinline__ int64_t qpos(const Geom<T> &g, int64_t t)
{
	if (!g.cp)
		return t;
	int64_t p = g.pos[t];
	return p < 0 ? 0 : p >= g.nkeys ? g.nkeys - 1 : p;
}

/* K of the key at position p of batch b, head h; V is K + hd. */
template <typename T>
static __device__ __forceinline__ const T *key_at(const Geom<T> &g, int64_t b, int64_t h, int64_t p)
{
	if (!g.cp)
		return g.qkv + (b * g.t + p) * 3 * g.c + 3 * g.hd * h + g.hd;
	int64_t l = g.t / 2, ch = p / l, off = p - ch * l;
	int64_t r = ch < g.cp ? ch : 2 * g.cp - 1 - ch, j = (ch < g.cp ? 0 : l) + off;
	return g.kv + ((r * g.b + b) * g.t + j) * 2 * g.c + 2 * g.hd * h;
}

/* Stored key row s of batch b (0 <= s < nkeys: row s of the batch, or
 * gathered block s / T, row s % T): its position. */
template <typename T>
static __device__ __forceinline__ int64_t key_pos_of_row(const Geom<T> &g, int64_t s)
{
	if (!g.cp)
		return s;
	int64_t r = s / g.t, j = s - r * g.t, l = g.t / 2;
	return j < l ? r * l + j : (2 * g.cp - 1 - r) * l + (j - l);
}

/* ... and its K (V is K + hd). */
template <typename T>
static __device__ __forceinline__ const T *key_of_row(const Geom<T> &g, int64_t b, int64_t h,
						      int64_t s)
{
	if (!g.cp)
		return g.qkv + (b * g.t + s) * 3 * g.c + 3 * g.hd * h + g.hd;
	int64_t r = s / g.t, j = s - r * g.t;
	return g.kv + ((r * g.b + b) * g.t + j) * 2 * g.c + 2 * g.hd * h;
}

/* The sum over a row's 4 threads (lanes 4i..4i+3 of a warp; the tensor-core
 * kernels' quad of lanes holding one row of a C tile). */
static __device__ __forceinline__ float row_sum(float v)
{
	v += __shfl_xor_sync(CU_FULL_MASK, v, 1);
	if (!MUTANT(tc_shfl))
		v += __shfl_xor_sync(CU_FULL_MASK, v, 2);
	return v;
}

/* The block's largest (or smallest) of one int per row; every thread gets it. */
static __device__ int64_t rows_extreme(int64_t v, int want_max, int64_t *sh)
{
	int row = threadIdx.x / ATT_LANES;
	__syncthreads();
	if (threadIdx.x % ATT_LANES == 0)
		sh[row] = v;
	__syncthreads();
	int64_t x = sh[0];
	for (int i = 1; i < ATT_ROWS; i++)
		x = want_max ? (sh[i] > x ? sh[i] : x) : (sh[i] < x ? sh[i] : x);
	return x;
}

/* Two tiles of N rows into shared memory: row j of ta and tb from the
 * pointers rows(j, &pa, &pb) gives (returning 0: a zero row), dims past hd
 * zero; vec8: eight dims per load, 128 bits of bf16 (a group of eight lies
 * wholly inside or outside hd). */
template <int HD, typename T, class Rows>
static __device__ void load_tiles(int vec8, int64_t hd, Rows rows, float (*ta)[HD],
				  float (*tb)[HD])
{
	const int n = Tile<HD>::N;
	const T *pa, *pb;
	if (vec8) {
		for (int i = threadIdx.x; i < n * HD / 8; i += ATT_THREADS) {
			int j = i / (HD / 8), d = 8 * (i % (HD / 8));
			float xa[8] = {}, xb[8] = {};
			if (d < hd && rows(j, &pa, &pb)) {
				ld8(pa + d, xa);
				ld8(pb + d, xb);
			}
CU_UNROLL
			for (int q = 0; q < 8; q++) {
				ta[j][d + q] = xa[q];
				tb[j][d + q] = xb[q];
			}
		}
		return;
	}
	for (int i = threadIdx.x; i < n * HD; i += ATT_THREADS) {
		int j = i / HD, d = i % HD;
		float xa = 0, xb = 0;
		if (d < hd && rows(j, &pa, &pb)) {
			xa = ld(pa + d);
			xb = ld(pb + d);
		}
		ta[j][d] = xa;
		tb[j][d] = xb;
	}
}

/* A tile of N keys from position p0: K and V, zero past the keys. */
template <int HD, typename T>
static __device__ void load_keys(const Geom<T> &g, int64_t b, int64_t h, int64_t p0,
				 float (*ks)[HD], float (*vs)[HD])
{
	auto rows = [&](int j, const T **k, const T **v) {
		if (p0 + j >= g.nkeys)
			return 0;
		*k = key_at(g, b, h, p0 + j);
		*v = *k + g.hd;
		return 1;
	};
	load_tiles<HD, T>(g.vec8, g.hd, rows, ks, vs);
}

/*
 * The forward over the keys of query row (b, t, h) held in q: m (max),
 * l (sum of exp, double) and o (unnormalised output dims) of the online
 * softmax. All threads of the block run it (shared tiles, shuffles); rows
 * past T (p < 0) compute nothing useful.
 */
template <int HD, typename T>
static __device__ void forward_pass(const Geom<T> &g, int64_t b, int64_t h, int64_t p,
				    int64_t last, const float *q, float &m, double &l, float *o,
				    float (*ks)[HD], float (*vs)[HD])
{
	const int n = Tile<HD>::N, per = Tile<HD>::PER, lane = threadIdx.x % ATT_LANES;
	m = -INFINITY;
	l = 0;
	for (int k = 0; k < per; k++)
		o[k] = 0;
	for (int64_t p0 = 0; p0 <= last; p0 += n) {
		if (!MUTANT(attn_sync))
			__syncthreads(); /* the previous tile is consumed */
		load_keys<HD>(g, b, h, p0, ks, vs);
		__syncthreads();
		float s[n], mt = -INFINITY;
CU_UNROLL
		for (int j = 0; j < n; j++) {
			float dot = 0;
CU_UNROLL
			for (int k = 0; k < per; k++)
				dot += q[k] * ks[j][lane + ATT_LANES * k];
			dot = row_sum(dot) * g.scale;
			s[j] = p0 + j <= p ? dot : -INFINITY;
			mt = s[j] > mt ? s[j] : mt;
		}
		float mn = mt > m ? mt : m;
		if (mn == -INFINITY)
			continue; /* nothing visible yet */
		float corr = expf(m - mn); /* 0 on the first visible tile */
		double lt = 0;
CU_UNROLL
		for (int k = 0; k < per; k++)
			o[k] *= corr;
CU_UNROLL
		for (int j = 0; j < n; j++) {
			float pj = expf(s[j] - mn);
			lt += pj;
CU_UNROLL
			for (int k = 0; k < per; k++)
				o[k] += pj * vs[j][lane + ATT_LANES * k];
		}
		l = l * corr + lt;
		m = mn;
	}
}

/* The query row of this thread: its q dims (scaled: no) and dO dims. */
template <int HD, typename T>
static __device__ void load_row(const T *src, int64_t hd, int active, float *dst)
{
	const int per = Tile<HD>::PER, lane = threadIdx.x % ATT_LANES;
	for (int k = 0; k < per; k++) {
		int d = lane + ATT_LANES * k;
		dst[k] = active && d < hd ? ld(src + d) : 0.0f;
	}
}

/* ---- forward ---- */

template <int HD, typename T>
__global__ void __launch_bounds__(ATT_THREADS, HD <= 64 ? 2 : 1) k_attn_fwd(Geom<T> g, T *out)
{
	__shared__ float ks[Tile<HD>::N][HD], vs[Tile<HD>::N][HD];
	__shared__ int64_t shp[ATT_ROWS];
	const int per = Tile<HD>::PER, lane = threadIdx.x % ATT_LANES;
	int64_t nqt = (g.t + ATT_ROWS - 1) / ATT_ROWS, bi = blockIdx.x;
	int64_t qt = bi % nqt, h = (bi / nqt) % g.h, b = bi / (nqt * g.h);
	int64_t t = qt * ATT_ROWS + threadIdx.x / ATT_LANES;
	int active = t < g.t;
	int64_t p = active ? qpos(g, t) : -1;
	float q[per], o[per], m;
	double l;
	load_row<HD>(g.qkv + (b * g.t + (active ? t : 0)) * 3 * g.c + 3 * g.hd * h, g.hd, active, q);
	int64_t last = rows_extreme(p, 1, shp);
	forward_pass<HD>(g, b, h, p, last, q, m, l, o, ks, vs);
	if (!active)
		return;
	T *orow = out + (b * g.t + t) * g.c + g.hd * h;
	float inv = (float)(1.0 / l);
	for (int k = 0; k < per; k++) {
		int d = lane + ATT_LANES * k;
		if (d < g.hd)
			st(orow + d, o[k] * inv);
	}
}

/* ---- backward, the query side: dQ and the rows' (m, inv, D) ---- */

template <int HD, typename T>
__global__ void __launch_bounds__(ATT_THREADS, HD <= 64 ? 2 : 1)
k_attn_bwd_q(Geom<T> g, const T *dy, T *dqkv, float *stats, int want_dq, int zero_kv)
{
	__shared__ float ks[Tile<HD>::N][HD], vs[Tile<HD>::N][HD];
	__shared__ int64_t shp[ATT_ROWS];
	const int n = Tile<HD>::N, per = Tile<HD>::PER, lane = threadIdx.x % ATT_LANES;
	int64_t nqt = (g.t + ATT_ROWS - 1) / ATT_ROWS, bi = blockIdx.x;
	int64_t qt = bi % nqt, h = (bi / nqt) % g.h, b = bi / (nqt * g.h);
	int64_t t = qt * ATT_ROWS + threadIdx.x / ATT_LANES;
	int active = t < g.t;
	int64_t tt = active ? t : 0, p = active ? qpos(g, t) : -1;
	float q[per], o[per], dout[per], m;
	double l;
	load_row<HD>(g.qkv + (b * g.t + tt) * 3 * g.c + 3 * g.hd * h, g.hd, active, q);
	load_row<HD>(dy + (b * g.t + tt) * g.c + g.hd * h, g.hd, active, dout);
	int64_t last = rows_extreme(p, 1, shp);
	forward_pass<HD>(g, b, h, p, last, q, m, l, o, ks, vs);
	float inv = (float)(1.0 / l);
	double dsum = 0; /* D = dO . O */
	for (int k = 0; k < per; k++)
		dsum += (double)dout[k] * (o[k] * inv);
	dsum += __shfl_xor_sync(CU_FULL_MASK, dsum, 1);
	dsum += __shfl_xor_sync(CU_FULL_MASK, dsum, 2);
	float dd = (float)dsum;
	int64_t row = (b * g.h + h) * g.t + tt; /* stats row of (b, h, t) */
	if (active && lane == 0) {
		stats[3 * row] = m;
		stats[3 * row + 1] = inv;
		stats[3 * row + 2] = dd;
	}
	if (!want_dq)
		return; /* uniform over the block */
	float dq[per];
	for (int k = 0; k < per; k++)
		dq[k] = 0;
	for (int64_t p0 = 0; p0 <= last; p0 += n) {
		__syncthreads();
		load_keys<HD>(g, b, h, p0, ks, vs);
		__syncthreads();
		for (int j = 0; j < n; j++) {
			float sdot = 0, pdot = 0;
CU_UNROLL
			for (int k = 0; k < per; k++) {
				sdot += q[k] * ks[j][lane + ATT_LANES * k];
				pdot += dout[k] * vs[j][lane + ATT_LANES * k];
			}
			sdot = row_sum(sdot) * g.scale;
			pdot = row_sum(pdot);
			float pj = p0 + j <= p ? expf(sdot - m) * inv : 0.0f;
			float ds = pj * (pdot - dd);
CU_UNROLL
			for (int k = 0; k < per; k++)
				dq[k] += ds * ks[j][lane + ATT_LANES * k];
		}
	}
	if (!active)
		return;
	T *drow = dqkv + (b * g.t + t) * 3 * g.c + 3 * g.hd * h;
	for (int k = 0; k < per; k++) {
		int d = lane + ATT_LANES * k;
		if (d < g.hd) {
			st(drow + d, g.scale * dq[k]);
			if (zero_kv) {
				st(drow + g.hd + d, 0.0f);
				st(drow + 2 * g.hd + d, 0.0f);
			}
		}
	}
}

/* ---- backward, the key side: dK and dV of every stored key row ---- */

/* out_kv: the output is [cp, B, T, 2C] (per head [dk|dv]); else d qkv. */
template <int HD, typename T>
__global__ void __launch_bounds__(ATT_THREADS, HD <= 64 ? 2 : 1)
k_attn_bwd_kv(Geom<T> g, const T *dy, const float *stats, T *out, int out_kv)
{
	const int n = Tile<HD>::N, per = Tile<HD>::PER, lane = threadIdx.x % ATT_LANES;
	__shared__ float qs[Tile<HD>::N][HD], ds_[Tile<HD>::N][HD];
	__shared__ float qm[Tile<HD>::N], qinv[Tile<HD>::N], qd[Tile<HD>::N];
	__shared__ int64_t qp[Tile<HD>::N], shp[ATT_ROWS];
	int64_t nkt = (g.nkeys + ATT_ROWS - 1) / ATT_ROWS, bi = blockIdx.x;
	int64_t kt = bi % nkt, h = (bi / nkt) % g.h, b = bi / (nkt * g.h);
	int64_t s = kt * ATT_ROWS + threadIdx.x / ATT_LANES;
	int active = s < g.nkeys;
	int64_t ss = active ? s : 0;
	int64_t kp = active ? key_pos_of_row(g, s) : INT64_MAX;
	const T *krow = key_of_row(g, b, h, ss);
	float k_[per], v_[per], dk[per], dv[per];
	load_row<HD>(krow, g.hd, active, k_);
	load_row<HD>(krow + g.hd, g.hd, active, v_);
	for (int k = 0; k < per; k++)
		dk[k] = dv[k] = 0;
	int64_t kmin = rows_extreme(kp, 0, shp);
	/* ordinary attention: queries before kmin see none of these keys */
	int64_t first = g.cp ? 0 : (kmin < g.t ? kmin : g.t) / n * n;
	for (int64_t t0 = first; t0 < g.t; t0 += n) {
		__syncthreads();
		auto rows = [&](int j, const T **q, const T **d) {
			int64_t t = t0 + j;
			if (t >= g.t)
				return 0;
			*q = g.qkv + (b * g.t + t) * 3 * g.c + 3 * g.hd * h;
			*d = dy + (b * g.t + t) * g.c + g.hd * h;
			return 1;
		};
		load_tiles<HD, T>(g.vec8, g.hd, rows, qs, ds_);
		for (int j = threadIdx.x; j < n; j += ATT_THREADS) {
			int64_t t = t0 + j, row = (b * g.h + h) * g.t + t;
			int ok = t < g.t;
			qp[j] = ok ? qpos(g, t) : -1;
			qm[j] = ok ? stats[3 * row] : 0.0f;
			qinv[j] = ok ? stats[3 * row + 1] : 0.0f;
			qd[j] = ok ? stats[3 * row + 2] : 0.0f;
		}
		__syncthreads();
		int64_t tmax = -1;
		for (int j = 0; j < n; j++)
			tmax = qp[j] > tmax ? qp[j] : tmax;
		if (tmax < kmin)
			continue; /* no query of the tile sees these keys (uniform) */
		for (int j = 0; j < n; j++) {
			float sdot = 0, pdot = 0;
CU_UNROLL
			for (int k = 0; k < per; k++) {
				sdot += qs[j][lane + ATT_LANES * k] * k_[k];
				pdot += ds_[j][lane + ATT_LANES * k] * v_[k];
			}
			sdot = row_sum(sdot) * g.scale;
			pdot = row_sum(pdot);
			float pj = kp <= qp[j] ? expf(sdot - qm[j]) * qinv[j] : 0.0f;
			float dsj = pj * (pdot - qd[j]);
CU_UNROLL
			for (int k = 0; k < per; k++) {
				dv[k] += pj * ds_[j][lane + ATT_LANES * k];
				dk[k] += dsj * qs[j][lane + ATT_LANES * k];
			}
		}
	}
	if (!active)
		return;
	T *orow;
	if (out_kv) {
		int64_t r = s / g.t, j = s - r * g.t;
		orow = out + ((r * g.b + b) * g.t + j) * 2 * g.c + 2 * g.hd * h;
	} else {
		orow = out + (b * g.t + s) * 3 * g.c + 3 * g.hd * h + g.hd;
	}
	for (int k = 0; k < per; k++) {
		int d = lane + ATT_LANES * k;
		if (d < g.hd) {
			st(orow + d, g.scale * dk[k]);
			st(orow + g.hd + d, dv[k]);
		}
	}
}

/* ---- tensor-core attention (bf16, and f32 in tf32; head dims 32, 64, 128) ----
 *
 * FlashAttention-2 on mma.sync (m16n8k16, bf16 operands, f32 accumulators)
 * and ldmatrix, whose register layouts the PTX ISA specifies (mma_ptx.cuh),
 * so that S, P, dP, dS and the accumulators never leave registers. f32
 * (gemm_math tf32): the same kernels on m16n8k8 .tf32 (T = float), every
 * operand converted by cvt.rna.tf32.f32 once (tc_operand: tiles as they
 * are copied in, A registers as they are loaded, P and dS as they are
 * packed), B registers by plain 32-bit shared loads (ldmatrix moves 16-bit
 * elements; the primitives' comments give the layouts). Common to the
 * three kernels below:
 *  - a block owns 64 rows of one (batch, head) (queries, or keys for
 *    dK/dV), warp w the 16 from r0 + 16 w; lane (g = lane / 4, q = lane % 4)
 *    holds rows g and g + 8 of them (the C layout), and the block's own
 *    operands (Q, dO, or K, V) as A registers, read once from global memory
 *    in the A layout and kept across the loop over the other side's tiles;
 *  - the other side goes by in tiles of BC rows, two operands copied into
 *    shared memory and double-buffered: tile i + 1 is copied (bf16 by
 *    cp.async, f32 by loads into registers and stores after the mma work:
 *    TcFetch) while the warps compute on tile i, one barrier per tile;
 *  - X Y^T with Y's rows in a tile (fa_times_rows): ldmatrix .x4 (no
 *    .trans) of Y's rows is B = Y^T's registers for two 8-row column
 *    tiles at once; the product stays in C registers;
 *  - the C registers of two adjacent 8-column tiles, packed to bf16 pairs,
 *    are the A registers of a 16-deep k-step (fa_pack: FlashAttention-2's
 *    trick, the m16n8 C layout is the A layout's left or right half), and
 *    acc += P Y with Y's rows in a tile (fa_times_tile): ldmatrix .x4.trans
 *    of Y's rows is B = Y's registers for two 8-dim tiles;
 *  - a row's values are spread over the 4 lanes of a quad (2 per 8-column
 *    tile): a row reduction takes two xor shuffles (1, 2: row_sum, quad_max).
 *  - cp (attention_cp and its gradients): the same code on positions, not
 *    rows. Keys go by in position order, each tile row copied from where
 *    its position lives in the gathered kv (fa_fetch_kv: key_at), so a
 *    tile may cross chunks; a lane masks by its query row's position; the
 *    causal bounds are the positions of a warp's or block's end rows
 *    (fa_query_span). dK/dV's blocks are stored rows of the gathered kv
 *    (key_pos_of_row gives each one's position) and it writes d kv there.
 *    The ordinary op's positions are its rows: its path is unchanged.
 * Shared memory (dynamic, < 48 KB): the two operands' tiles, two buffers
 * each (the next tile's copies issued before the current tile's mma work
 * and landed in the other buffer after it: TcFetch), rows padded to HD + 8
 * bf16 (HD + 4 f32): every row starts 16-byte
 * aligned (ldmatrix's rule) and the 8 rows of one ldmatrix matrix fall in
 * 8 different 16-byte bank groups (no bank conflicts; f32: fa_times_rows'
 * and fa_times_tile's comments).
 *
 * k_attn_fwd_mma (BC = 64 keys, 32 for head dim 128): S = Q K^T in f32;
 * the online softmax on the C registers in unscaled s (m' its running
 * max, by FMNMX), p = exp(scale (s - m')) as 2^x of one FMA (scale
 * log2(e) folded in: FlashAttention-2's form; fa_exp2, one MUFU.EX2)
 * rounded to bf16, l summing the rounded p (O / l weighs V by exactly the
 * P the mma used; bf16: l += P 1 on the tensor cores, fa_sum_mma); O += P V
 * with O (16 x HD per warp) in f32 C registers, rescaled in place by
 * exp(m - m') per row. Causal: the block stops at the tile of its last
 * row; a warp skips the tiles wholly above its rows (and a warp wholly
 * past T all of them) and masks only the tiles that cross its diagonal.
 * The blocks run the longest row tiles first (fa_block); the ordinary
 * op's bf16 whole tiles are copied by FaKvTile. out = O / l, rounded once;
 * lse = m + log l per row into the plan's buffer (cu_plan_attn) when
 * paired with its gradient; run again by an unpaired backward (out NULL),
 * lse and D = dO . O (O in f32, before rounding) into the gradient's
 * scratch. */
template <int HD, typename T> struct FaShape {
	static const int E = (int)sizeof(T);       /* bytes per element: bf16 2, f32 (tf32) 4 */
	static const int W = 4;                    /* warps */
	static const int BR = 16 * W;              /* the block's rows */
	/* the forward's keys per tile (f32 at head dims 64, 128: half, for 48 KB) */
	static const int BC = (HD == 128 ? 32 : 64) / (E == 4 && HD >= 64 ? 2 : 1);
	static const int BCB = HD == 128 ? 16 : 32; /* the backward's rows per tile */
	static const int LD = HD + 16 / E;         /* tile rows: 16 bytes of padding */
	static const int SMEM = 2 * 2 * BC * LD * E; /* two operands, double-buffered */
	static_assert(LD * E % 16 == 0, "tile rows are 16-byte aligned (ldmatrix, uint4 copies)");
	static_assert(SMEM <= 48 * 1024, "the forward: no opt-in to more than 48 KB of shared memory");
};

/* An element as the mma takes it: bf16 as it is, f32 rounded to tf32
 * (cvt.rna.tf32.f32); in bits, for a .b32 register (tf32_bits). */
static __device__ __forceinline__ cu_bf16 tc_operand(cu_bf16 x) { return x; }
static __device__ __forceinline__ float tc_operand(float x)
{
	return MUTANT(tf32_cvt) ? x : cu_tf32(x);
}
static __device__ __forceinline__ uint32_t tf32_bits(float x) { return __float_as_uint(tc_operand(x)); }

/* 16 bytes of elements as the mma takes them (f32: four, each to tf32) */
template <typename T> static __device__ __forceinline__ uint4 tc_operand16(uint4 v)
{
	if constexpr (sizeof(T) == 4) {
		v.x = tf32_bits(__uint_as_float(v.x));
		v.y = tf32_bits(__uint_as_float(v.y));
		v.z = tf32_bits(__uint_as_float(v.z));
		v.w = tf32_bits(__uint_as_float(v.w));
	}
	return v;
}

/* x rounded to bf16 (to nearest even: cu_to_bf16's rounding), as bits:
 * one cvt.rn.bf16.f32 on the device (cu_to_bf16 is ~6 integer operations,
 * and it rounded every P and dS: a fifth of the forward's instructions,
 * ncu); a NaN comes out as the canonical NaN rather than cu_to_bf16's
 * quieted payload (P and dS are NaN only when the inputs are). The
 * emulator (no __CUDA_ARCH__) rounds with cu_to_bf16: the same bits. */
static __device__ __forceinline__ cu_bf16 tc_bf16(float x)
{
#ifdef __CUDA_ARCH__
	unsigned short u;
	asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(u) : "f"(x));
	return u;
#else
	return cu_to_bf16(x);
#endif
}

/* x rounded as the mma will take it, as a float (P: l sums exactly the
 * weights the mma uses) */
template <typename T> static __device__ __forceinline__ float tc_value(float x)
{
	if constexpr (sizeof(T) == 2)
		return cu_from_bf16(tc_bf16(x));
	else
		return tc_operand(x);
}

/* n rows into a padded shared tile of HD columns (row stride dld), each
 * element as the mma takes it (bf16 bits copied, f32 rounded to tf32): row
 * j from rowp(j) + off (rowp(j) NULL: a zero row), columns past hd zero.
 * vec: 16 bytes at a time (8 bf16 or 4 f32: Geom.tcvec). The copy where
 * the rows are not 16-byte aligned; TcFetch below where they are. */
template <int HD, typename T, class RowP>
static __device__ void tc_copy_gather(T *dst, int dld, RowP rowp, int64_t off, int n, int64_t hd,
				      int vec)
{
	int step = vec ? 16 / (int)sizeof(T) : 1;
	for (int i = threadIdx.x; i < n * HD / step; i += blockDim.x) {
		int j = i / (HD / step), d = step * (i % (HD / step));
		const T *row = rowp(j);
		int ok = row && d < hd;
		const T *p = row + off + d;
		T *q = dst + j * dld + d;
		if (vec) {
			uint4 v = ok ? tc_operand16<T>(*(const uint4 *)p) : make_uint4(0, 0, 0, 0);
			*(uint4 *)q = v;
		} else {
			*q = ok ? tc_operand(*p) : (T)0;
		}
	}
}

/* A tile of N rows of HD columns (HD the head dim exactly, rows 16-byte
 * aligned: Geom.tcvec) copied into a padded shared tile [N][dld] 16 bytes
 * at a time, issued by fetch() before the current tile's mma work and
 * landed after it: the double-buffering of the kernels' next tile. PER
 * copies per thread, a constant: unrolled and independent, so their
 * latencies overlap; the global latency is paid once per tile and hidden
 * behind the mma work, where tc_copy_gather paid it once per 16 bytes in
 * turn (its store waits for its load: 29 % of the forward's stall samples
 * in ncu). NT: the block's threads.
 *  - ASYNC (bf16: the elements are copied as they are): fetch() issues
 *    cp.async.cg straight into dst (a zero row by a plain store); the
 *    copies land at the thread's next tc_wait (cp.async.wait_group 0),
 *    before the barrier that hands the tile to the other warps. No
 *    registers hold the tile in flight (GPT-2's: 32 per thread in the
 *    forward, 16 in the backward, at the register peak).
 *  - else (f32: each element rounded to tf32 on the way, which cp.async
 *    cannot do; and the backward's K rows, copied once per key block):
 *    fetch() loads into registers v, store() writes them into dst after
 *    the mma work. */
template <int HD, int N, int NT, typename T, bool ASYNC = sizeof(T) == 2> struct TcFetch {
	static const int STEP = 16 / (int)sizeof(T);      /* elements per load */
	static const int CHUNKS = N * HD / STEP;          /* loads per tile */
	static const int PER = (CHUNKS + NT - 1) / NT;    /* per thread */
	static const int N_ROWS = N;
	static_assert(HD % STEP == 0, "rows of whole 16-byte loads");
	static_assert(!ASYNC || sizeof(T) == 2, "cp.async copies bytes: f32 needs its tf32 rounding");
	uint4 v[ASYNC ? 1 : PER];

	/* row j from rowp(j) + off (NULL: a zero row), for dst [N][dld] */
	template <class RowP> __device__ __forceinline__ void fetch(RowP rowp, int off, T *dst, int dld)
	{
CU_UNROLL
		for (int k = 0; k < PER; k++) {
			const int i = (int)threadIdx.x + k * NT, j = i / (HD / STEP), d = STEP * (i % (HD / STEP));
			const T *row = CHUNKS % NT == 0 || i < CHUNKS ? rowp(j) : (const T *)0;
			if constexpr (ASYNC) {
				if (row)
					cu_cp_async16(dst + j * dld + d, row + off + d, 16);
				else if (CHUNKS % NT == 0 || i < CHUNKS)
					*(uint4 *)(dst + j * dld + d) = make_uint4(0, 0, 0, 0);
			} else {
				v[k] = row ? tc_operand16<T>(*(const uint4 *)(row + off + d)) : make_uint4(0, 0, 0, 0);
			}
		}
	}
	__device__ __forceinline__ void store(T *dst, int dld) const
	{
		if constexpr (!ASYNC) {
CU_UNROLL
			for (int k = 0; k < PER; k++) {
				const int i = (int)threadIdx.x + k * NT, j = i / (HD / STEP),
					  d = STEP * (i % (HD / STEP));
				if (CHUNKS % NT == 0 || i < CHUNKS)
					*(uint4 *)(dst + j * dld + d) = v[k];
			}
		}
	}
};

/* The cp.async copies this thread issued since the last commit (bf16's
 * TcFetch) become one group; tc_wait: every group has landed (wait_group
 * 0: at the loop's top only the current tile's is in flight). f32 issues
 * none. */
template <typename T> static __device__ __forceinline__ void tc_commit()
{
	if constexpr (sizeof(T) == 2)
		cu_cp_async_commit();
}
template <typename T> static __device__ __forceinline__ void tc_wait()
{
	if constexpr (sizeof(T) == 2)
		cu_cp_async_wait<0>();
}

/* Rows [r0, r0 + n) of a [*, ld] source (row stride, elements) the same
 * way; rows past `rows` zero. */
template <int HD, typename T>
static __device__ void tc_copy_rows(T *dst, int dld, const T *src, int64_t ld, int64_t r0, int n,
				    int64_t rows, int64_t hd, int vec)
{
	auto rowp = [&](int j) { return r0 + j < rows ? src + (r0 + j) * ld : (const T *)0; };
	tc_copy_gather<HD, T>(dst, dld, rowp, 0, n, hd, vec);
}

/* Two floats as a register of two bf16, lo in the low half. */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
#ifdef __CUDA_ARCH__ /* one cvt.rn.bf16x2.f32 (its first operand to the high half) */
	uint32_t u;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(u) : "f"(hi), "f"(lo));
	return u;
#else
	return (uint32_t)tc_bf16(lo) | (uint32_t)tc_bf16(hi) << 16;
#endif
}

/* Two adjacent bf16 at p as such a register; aligned (p 4-byte aligned):
 * one 32-bit load. */
static __device__ __forceinline__ uint32_t ld_pair(const cu_bf16 *p, int aligned)
{
	return aligned ? *(const uint32_t *)p : (uint32_t)p[0] | (uint32_t)p[1] << 16;
}

/* The element type's mma: bf16 on m16n8k16, f32 as tf32 on m16n8k8
 * (gemm_math tf32). K: the columns of A one mma consumes (a k-step). */
template <typename T> struct Mma {
	static const int K = sizeof(T) == 2 ? 16 : 8;
};

/* The A registers of this lane's rows (row 0 = g, row 1 = g + 8 of the
 * warp's 16), each at rp[r] + off (rp[r] NULL: a zero row), k-step k:
 * bf16 a[k][i] = X[row (i & 1)][16 k + 2 q + 8 (i >> 1) ..+1] (aligned: one
 * 32-bit load), tf32 a[k][i] = X[row (i & 1)][8 k + q + 4 (i >> 1)]. */
template <int HD, typename T>
static __device__ __forceinline__ void fa_load_a(uint32_t (*a)[4], const T *const *rp, int64_t off,
						 int aligned)
{
	const int qd = threadIdx.x % 4;
CU_UNROLL
	for (int k = 0; k < HD / Mma<T>::K; k++)
CU_UNROLL
		for (int i = 0; i < 4; i++) {
			const T *r = rp[i & 1];
			if constexpr (sizeof(T) == 2)
				a[k][i] = r ? ld_pair(r + off + 16 * k + 2 * qd + 8 * (i >> 1), aligned) : 0u;
			else
				a[k][i] = r ? tf32_bits(r[off + 8 * k + qd + 4 * (i >> 1)]) : 0u;
		}
}

/* This lane's rows of a [*, ld] source (row[r] < rows, else NULL), for fa_load_a. */
template <typename T>
static __device__ __forceinline__ void fa_rows(const T **rp, const T *src, int64_t ld,
					       const int64_t *row, int64_t rows)
{
	for (int r = 0; r < 2; r++)
		rp[r] = row[r] < rows ? src + row[r] * ld : (const T *)0;
}

/* s[j] = X Y^T for the warp's 16 rows of X (A registers a) and the 8 rows
 * 8 j .. 8 j + 7 of a shared tile of Y (row stride LD), j < N / 8. tf32:
 * B = Y^T's b[0] = Y[8 j + g][8 k + q], b[1] = its column + 4, plain
 * 32-bit loads (ldmatrix moves 16-bit elements); LD = HD + 4 puts the 32
 * lanes' words (rows g, columns q) in 32 different banks. */
template <int HD, int N, int LD, typename T>
static __device__ __forceinline__ void fa_times_rows(float (*s)[4], const uint32_t (*a)[4],
						     const T *tile)
{
	const int lane = threadIdx.x % 32;
CU_UNROLL
	for (int j = 0; j < N / 8; j++)
		s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0;
	if constexpr (sizeof(T) == 4) {
		const T *y = tile + (lane / 4) * LD + lane % 4;
CU_UNROLL
		for (int j = 0; j < N / 8; j++)
CU_UNROLL
			for (int k = 0; k < HD / 8; k++) {
				const T *yk = y + 8 * j * LD + 8 * k;
				uint32_t yb[2] = {__float_as_uint(yk[0]), __float_as_uint(yk[4])};
				cu_mma_tf32(s[j], a[k], yb);
			}
	} else {
		const int mi = lane / 8, mr = lane % 8;
CU_UNROLL
		for (int j = 0; j < N / 8; j += 2)
CU_UNROLL
			for (int k = 0; k < HD / 16; k++) {
				uint32_t yb[4]; /* matrices: rows 8 j (+8 for mi >= 2), dims 16 k (+8 for odd mi) */
				const int ld = MUTANT(tc_stride) ? HD : LD;
				cu_ldsm<4>(yb, tile + (8 * j + 8 * (mi >> 1) + mr) * ld + 16 * k + 8 * (mi & 1));
				cu_mma_bf16(s[j], a[k], yb);
				cu_mma_bf16(s[j + 1], a[k], yb + 2);
			}
	}
}

/* fa_times_rows with X's 16 rows in shared memory as well (xs: the
 * warp's first row, row stride LD), its A registers loaded per k-step and
 * used for every j (bf16: ldmatrix .x4, matrix i = rows 8 (i & 1), dims
 * 16 k + 8 (i >> 1): the A layout; tf32: 32-bit loads, a[i] = X[g + 8 (i
 * & 1)][8 k + q + 4 (i >> 1)]): 4 registers live, not HD / 4 (the
 * backward's K and V: FlashAttention-2 keeps them in shared memory too).
 * Each s[j] sums its k-steps in the same order as fa_times_rows. */
template <int HD, int N, int LD, typename T>
static __device__ __forceinline__ void fa_times_rows_sm(float (*s)[4], const T *xs, const T *tile)
{
	const int lane = threadIdx.x % 32;
CU_UNROLL
	for (int j = 0; j < N / 8; j++)
		s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0;
	if constexpr (sizeof(T) == 4) {
		const T *x = xs + (lane / 4) * LD + lane % 4, *y = tile + (lane / 4) * LD + lane % 4;
CU_UNROLL
		for (int k = 0; k < HD / 8; k++) {
			const uint32_t a[4] = {__float_as_uint(x[8 * k]), __float_as_uint(x[8 * LD + 8 * k]),
					       __float_as_uint(x[8 * k + 4]), __float_as_uint(x[8 * LD + 8 * k + 4])};
CU_UNROLL
			for (int j = 0; j < N / 8; j++) {
				const T *yk = y + 8 * j * LD + 8 * k;
				uint32_t yb[2] = {__float_as_uint(yk[0]), __float_as_uint(yk[4])};
				cu_mma_tf32(s[j], a, yb);
			}
		}
	} else {
		const int mi = lane / 8, mr = lane % 8;
		/* (tcb_alayout: the matrices in B's order, rows 8 (i >> 1), dims
		 * 8 (i & 1): a[1] and a[2] swapped, a wrong A layout) */
		const int am = MUTANT(tcb_alayout) ? mi >> 1 : mi & 1, ak = MUTANT(tcb_alayout) ? mi & 1 : mi >> 1;
CU_UNROLL
		for (int k = 0; k < HD / 16; k++) {
			uint32_t a[4];
			cu_ldsm<4>(a, xs + (8 * am + mr) * LD + 16 * k + 8 * ak);
CU_UNROLL
			for (int j = 0; j < N / 8; j += 2) {
				uint32_t yb[4]; /* as fa_times_rows' */
				const int ld = MUTANT(tc_stride) ? HD : LD;
				cu_ldsm<4>(yb, tile + (8 * j + 8 * (mi >> 1) + mr) * ld + 16 * k + 8 * (mi & 1));
				cu_mma_bf16(s[j], a, yb);
				cu_mma_bf16(s[j + 1], a, yb + 2);
			}
		}
	}
}

/* p (C registers of N columns) as A registers: bf16 pa[k] covers columns
 * 16 k .. 16 k + 15 (C tiles 2 k and 2 k + 1); tf32 pa[j] the C tile j,
 * its columns 2 q and 2 q + 1 taken as the k-step's columns q and q + 4
 * (a[0], a[1] from C[g][2q], C[g+8][2q]; a[2], a[3] from 2 q + 1): a
 * permutation of the sum's terms that fa_times_tile's B rows follow, so no
 * register crosses lanes. */
template <int N, typename T>
static __device__ __forceinline__ void fa_pack(uint32_t (*pa)[4], const float (*p)[4])
{
	if constexpr (sizeof(T) == 4) {
CU_UNROLL
		for (int j = 0; j < N / 8; j++) {
			pa[j][0] = tf32_bits(p[j][0]);
			pa[j][1] = tf32_bits(p[j][MUTANT(tf32_frag) ? 1 : 2]);
			pa[j][2] = tf32_bits(p[j][MUTANT(tf32_frag) ? 2 : 1]);
			pa[j][3] = tf32_bits(p[j][3]);
		}
	} else {
CU_UNROLL
		for (int j = 0; j < N / 8; j++) {
			pa[j / 2][MUTANT(tc_frag) ? j % 2 : 2 * (j % 2)] = pack_bf16(p[j][0], p[j][1]);
			pa[j / 2][MUTANT(tc_frag) ? j % 2 + 2 : 2 * (j % 2) + 1] = pack_bf16(p[j][2], p[j][3]);
		}
	}
}

/* acc[n] += P Y for the warp's 16 rows of P (A registers pa, N columns)
 * and the N rows of a shared tile of Y (row stride LD), n < HD / 8. tf32:
 * k-step k's columns q and q + 4 are fa_pack's C columns 2 q and 2 q + 1,
 * so b[0] = Y[8 k + 2 q][8 n + g], b[1] = Y[8 k + 2 q + 1][8 n + g] (banks
 * 8 q + g at LD = HD + 4: 32 different). */
template <int HD, int N, int LD, typename T>
static __device__ __forceinline__ void fa_times_tile(float (*acc)[4], const uint32_t (*pa)[4],
						     const T *tile)
{
	const int lane = threadIdx.x % 32;
	if constexpr (sizeof(T) == 4) {
		const T *y = tile + 2 * (lane % 4) * LD + lane / 4;
CU_UNROLL
		for (int k = 0; k < N / 8; k++)
CU_UNROLL
			for (int n = 0; n < HD / 8; n++) {
				const T *yk = y + 8 * k * LD + 8 * n;
				uint32_t yb[2] = {__float_as_uint(yk[0]), __float_as_uint(yk[LD])};
				cu_mma_tf32(acc[n], pa[k], yb);
			}
	} else {
		const int mi = lane / 8, mr = lane % 8;
CU_UNROLL
		for (int k = 0; k < N / 16; k++)
CU_UNROLL
			for (int n = 0; n < HD / 8; n += 2) {
				uint32_t yb[4]; /* Y^T's matrices: rows 16 k (+8 for odd mi), dims 8 n (+8 for mi >= 2) */
				const T *y = tile + (16 * k + 8 * (mi & 1) + mr) * LD + 8 * n + 8 * (mi >> 1);
				if (MUTANT(tc_layout))
					cu_ldsm<4>(yb, y);
				else
					cu_ldsm_t<4>(yb, y);
				cu_mma_bf16(acc[n], pa[k], yb);
				cu_mma_bf16(acc[n + 1], pa[k], yb + 2);
			}
	}
}

/* The max of a row's values over the lanes of its quad (the sum: row_sum). */
static __device__ __forceinline__ float quad_max(float v)
{
	float x = __shfl_xor_sync(CU_FULL_MASK, v, 1);
	v = x > v ? x : v;
	x = __shfl_xor_sync(CU_FULL_MASK, v, 2);
	return x > v ? x : v;
}

/* Row r's (0: g, 1: g + 8) dims of C registers acc (16 x HD), times scale,
 * rounded (bf16; f32 as they are), to dst (the row's first dim; 4-byte
 * aligned or not). */
template <int HD, typename T>
static __device__ __forceinline__ void fa_store_row(T *dst, const float (*acc)[4], int r,
						    float scale)
{
	dst += 2 * (threadIdx.x % 4);
	if constexpr (sizeof(T) == 4) {
CU_UNROLL
		for (int n = 0; n < HD / 8; n++) {
			dst[8 * n] = acc[n][2 * r] * scale;
			dst[8 * n + 1] = acc[n][2 * r + 1] * scale;
		}
	} else {
		int aligned = (uintptr_t)dst % 4 == 0;
CU_UNROLL
		for (int n = 0; n < HD / 8; n++) {
			uint32_t v = pack_bf16(acc[n][2 * r] * scale, acc[n][2 * r + 1] * scale);
			if (aligned) {
				*(uint32_t *)(dst + 8 * n) = v;
			} else {
				dst[8 * n] = (cu_bf16)v;
				dst[8 * n + 1] = (cu_bf16)(v >> 16);
			}
		}
	}
}

/* The block's (batch, head) and first row of 64 in blockIdx.x, over `rows`
 * rows per (batch, head): the forward's T query rows (the backward walks
 * its key blocks by FaWalk). The last row tile first: blockIdx.x = (tiles
 * - 1 - tile) * B H + b H + h. A causal block's work grows with its rows
 * (tile i walks i + 1 key tiles), and the GPU starts blocks roughly in
 * index order, so the longest start first and the last wave holds the
 * short ones (longest-first scheduling: ncu found the SMs' active cycles
 * 18 % below to 19 % above their mean with the tiles of one (batch,
 * head) in order, 2.9 waves). Each block's work and bits are the same in
 * any order. (tc_order: the reversed tile index one too large, tile 0
 * never run and one past the end run instead) */
template <typename T>
static __device__ __forceinline__ void fa_block(const Geom<T> &g, int64_t rows, int64_t *b,
						int64_t *h, int64_t *r0)
{
	const int64_t tiles = (rows + 63) / 64, bh = g.b * g.h, bi = blockIdx.x;
	*r0 = (tiles - (MUTANT(tc_order) ? 0 : 1) - bi / bh) * 64;
	*h = bi % bh % g.h;
	*b = bi % bh / g.h;
}

/* The keys at positions [p0, p0 + BC) of (batch b, head h) for the shared
 * tiles kv (K) and kv + BC LD (V): the ordinary op's rows p0.. of qkv
 * (CP false), cp's gathered rows in position order (key_at); positions
 * past nkeys zero. tcvec: by fk and fv (bf16: cp.async into kv, landing
 * at tc_wait; f32: into their registers, which fa_store_kv writes to kv
 * later); else copied into kv now. */
template <int HD, int LD, bool CP, class F, typename T>
static __device__ __forceinline__ void fa_fetch_kv(F &fk, F &fv, T *kv, const Geom<T> &g,
						   int64_t b, int64_t h, int p0)
{
	const T *kb = g.qkv + b * g.t * 3 * g.c + 3 * g.hd * h + g.hd; /* K of the ordinary op's row 0 */
	const int64_t ld = 3 * g.c;
	auto key = [&](int j) {
		const int p = p0 + j;
		if (p >= g.nkeys)
			return (const T *)0;
		return CP ? key_at(g, b, h, p) : kb + p * ld;
	};
	if (g.tcvec) {
		fk.fetch(key, 0, kv, LD);
		fv.fetch(key, HD, kv + F::N_ROWS * LD, LD);
	} else {
		tc_copy_gather<HD, T>(kv, LD, key, 0, F::N_ROWS, g.hd, 0);
		tc_copy_gather<HD, T>(kv + F::N_ROWS * LD, LD, key, g.hd, F::N_ROWS, g.hd, 0);
	}
}

template <int LD, class F, typename T>
static __device__ __forceinline__ void fa_store_kv(const F &fk, const F &fv, T *kv, const Geom<T> &g)
{
	if (g.tcvec) {
		fk.store(kv, LD);
		fv.store(kv + F::N_ROWS * LD, LD);
	}
}

/* The forward's K and V tile of BC keys at rows p0.. of the ordinary op
 * (bf16, rows 16-byte aligned: Geom.tcvec, and p0 + BC <= T: every tile but
 * a short last one, which fa_fetch_kv copies) by cp.async into kv (K) and
 * kv + BC LD (V). Thread t copies the 16-byte pieces t, t + NT, ... of each:
 * row t / (HD / 8) + i ROWS, dims 8 (t % (HD / 8)).., the same piece of K
 * and of V; its source and shared offsets are computed once per kernel,
 * so a piece costs its two cp.async and one add. fa_fetch_kv's general
 * copy (a row pointer per piece through key_at's lambda, a bound and a
 * zero row test) was a quarter of the forward's instructions (ncu's source
 * counters, GPT-2 at batch 8: ~86 per thread and tile for 8 pieces).
 * (tc_kvrows: the source stepped per pass by the shared tile's row
 * stride LD, not the global one) */
template <int HD, int BC, int LD, int NT> struct FaKvTile {
	static const int PIECES = HD / 8;     /* 16-byte pieces per row */
	static const int ROWS = NT / PIECES;  /* rows per pass of the block's threads */
	static const int PASSES = BC / ROWS;  /* pieces of K (and of V) per thread */
	static_assert(NT % PIECES == 0 && BC % ROWS == 0, "whole rows per pass, whole passes per tile");
	const cu_bf16 *src; /* this thread's first piece of K in row 0 */
	int dst;            /* ... and its offset in the tile (elements) */

	__device__ __forceinline__ FaKvTile(const cu_bf16 *k0, int64_t ld)
	{
		const int t = (int)threadIdx.x;
		src = k0 + (int64_t)(t / PIECES) * ld + 8 * (t % PIECES);
		dst = t / PIECES * LD + 8 * (t % PIECES);
	}
	__device__ __forceinline__ void fetch(cu_bf16 *kv, int p0, int64_t ld) const
	{
		const cu_bf16 *s = src + (int64_t)p0 * ld;
		const int64_t step = (int64_t)ROWS * (MUTANT(tc_kvrows) ? LD : ld);
CU_UNROLL
		for (int i = 0; i < PASSES; i++, s += step) {
			cu_cp_async16(kv + dst + i * ROWS * LD, s, 16);
			cu_cp_async16(kv + BC * LD + dst + i * ROWS * LD, s + HD, 16);
		}
	}
};

/* 2^x on the MUFU alone: ex2.approx.ftz.f32 (the forward's p and its
 * rescale; x <= 0, -inf gives 0). CUDA's exp2f is the same MUFU.EX2
 * wrapped for subnormal results (a compare and two multiplies per call: a
 * tenth of the forward's instructions, ncu); .ftz flushes a p below 2^-126
 * to 0 instead, a weight that rounds to nothing beside the row's largest,
 * which is 1. The emulator calls exp2f (its bits are the previous
 * build's); the two differ only there. */
static __device__ __forceinline__ float fa_exp2(float x)
{
#ifdef __CUDA_ARCH__
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
#else
	return exp2f(x);
#endif
}

/* l += P 1 on the tensor cores (bf16): the row sums of the bf16 P the
 * mma multiplies V by, as m16n8k16 products of P's A registers pa and a B
 * of ones (1.0 is 0x3f80 in bf16), one per k-step of 16 keys. Every C
 * column is the row's sum, so lc[0] (lc[1]) is row g's and lc[2] (lc[3])
 * row g + 8's, in every lane of the quad: no shuffle, no unpacking of P,
 * no add per p. The sums are f32 sums of exact products, in the tensor
 * core's order (the order of O's own sums), not the order of the lanes'
 * adds. (tc_lsum: the ones in the B row of k 0..7 only, keys 8..15 of
 * each k-step not counted) */
template <int BC>
static __device__ __forceinline__ void fa_sum_mma(float *lc, const uint32_t (*pa)[4])
{
	const uint32_t ones[2] = {0x3f803f80u, MUTANT(tc_lsum) ? 0u : 0x3f803f80u};
CU_UNROLL
	for (int k = 0; k < BC / 16; k++)
		cu_mma_bf16(lc, pa[k], ones);
}

/* The positions of the queries of a warp's (or block's) local rows [r0, r1]
 * clamped to T: the least *lo and the greatest *hi. A cp rank's rows ascend
 * in position (two runs of consecutive positions, the second after the
 * first: k_cp_check), so they are the positions of the ends. */
template <typename T>
static __device__ __forceinline__ void fa_query_span(const Geom<T> &g, int64_t r0, int64_t r1,
						     int64_t *lo, int64_t *hi)
{
	r1 = r1 < g.t - 1 ? r1 : g.t - 1;
	*lo = qpos(g, r0);
	*hi = MUTANT(tc_cpbound) ? r1 : qpos(g, r1);
}

/* The least and greatest positions of stored key rows [s0, s0 + 16) (those
 * below nkeys; s0 < nkeys): the ordinary op's rows are their positions;
 * cp's gathered rows are runs of L = T/2 consecutive positions, in no order. */
template <typename T>
static __device__ __forceinline__ void fa_key_span(const Geom<T> &g, int64_t s0, int64_t *lo,
						   int64_t *hi)
{
	int64_t s1 = s0 + 15 < g.nkeys - 1 ? s0 + 15 : g.nkeys - 1;
	if (!g.cp) {
		*lo = s0;
		*hi = s1;
		return;
	}
	*lo = *hi = key_pos_of_row(g, s0);
	for (int64_t s = s0 + 1; s <= s1; s++) {
		int64_t p = key_pos_of_row(g, s);
		*lo = p < *lo ? p : *lo;
		*hi = p > *hi ? p : *hi;
	}
}

/* The first local query row whose position is >= p (T: none): the first
 * such of each run of a cp rank's rows (fa_query_span's order). */
template <typename T>
static __device__ __forceinline__ int64_t fa_first_query(const Geom<T> &g, int64_t p)
{
	if (!g.cp)
		return p;
	const int64_t l = g.t / 2;
	for (int64_t r0 = 0; r0 < g.t; r0 += l) {
		int64_t a = qpos(g, r0);
		if (p < a + l)
			return p <= a ? r0 : r0 + (p - a);
	}
	return g.t;
}

template <int HD, bool CP, typename T>
__global__ void __launch_bounds__(32 * FaShape<HD, T>::W)
k_attn_fwd_mma(Geom<T> g, T *out, float *lse, const T *dy, float *dd)
{
	typedef FaShape<HD, T> S;
	const int KS = Mma<T>::K;
	if (!CP)
		g.cp = 0; /* a constant: the ordinary op compiled without cp's branches */
	const int BC = S::BC, TILE = BC * S::LD;
	extern __shared__ __align__(16) unsigned char fa_raw[];
	T *fa_smem = (T *)fa_raw; /* [2][K, V][BC][LD] */
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, qd = lane % 4;
	int64_t b, h, q0;
	fa_block(g, g.t, &b, &h, &q0);
	const T *base = g.qkv + b * g.t * 3 * g.c + 3 * g.hd * h;
	const int64_t ld = 3 * g.c;
	const int64_t wrow = q0 + 16 * warp; /* the warp's first row */
	const int64_t row[2] = {wrow + gr, wrow + gr + 8}; /* this lane's query rows */
	int64_t qp[2], wfirst = 0, wlast = 0, first, last; /* positions */
	for (int r = 0; r < 2; r++)
		qp[r] = row[r] < g.t ? qpos(g, row[r]) : row[r];
	if (wrow < g.t)
		fa_query_span(g, wrow, wrow + 15, &wfirst, &wlast);
	fa_query_span(g, q0, q0 + S::BR - 1, &first, &last); /* causal: the block's last key */
	uint32_t qa[HD / KS][4];
	const T *rp[2];
	fa_rows(rp, base, ld, row, g.t);
	fa_load_a<HD>(qa, rp, 0, g.vec8);
	float o[HD / 8][4]; /* O: o[n][e] = O[row (e >> 1)][8 n + 2 qd + (e & 1)] */
CU_UNROLL
	for (int n = 0; n < HD / 8; n++)
		o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0;
	float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
	float lc[4] = {0, 0, 0, 0}; /* bf16: l as C registers (fa_sum_mma): lc[0] row g's, lc[2] g + 8's */

	/* 32-bit from here: positions < 2^31 (limit_attention) */
	const int tiles = (int)(last / BC + 1), wl = (int)wlast, wf = (int)wfirst;
	const int qpi[2] = {(int)qp[0], (int)qp[1]};
	const float sl2 = g.scale * 1.4426950408889634f; /* scale log2(e): exp2 of FMAs */
	/* the next tile's K and V (fa_fetch_kv: registers where the rows are
	 * 16-byte aligned; else copied at once by tc_copy_gather) */
	typedef TcFetch<HD, BC, 32 * S::W, T> Fetch;
	Fetch fk, fv;
	/* the ordinary op's bf16 whole tiles: FaKvTile (fast: every tile but a
	 * short last one) */
	constexpr bool FAST = !CP && sizeof(T) == 2;
	const FaKvTile<HD, BC, S::LD, 32 * S::W> fast((const cu_bf16 *)base + g.hd, ld);
	auto fetch = [&](T *kv, int p0) {
		if (FAST && g.tcvec && p0 + BC <= g.nkeys)
			fast.fetch((cu_bf16 *)kv, p0, ld);
		else
			fa_fetch_kv<HD, S::LD, CP>(fk, fv, kv, g, b, h, p0);
	};
	fetch(fa_smem, 0);
	tc_commit<T>();
	fa_store_kv<S::LD>(fk, fv, fa_smem, g);
	for (int it = 0; it < tiles; it++) {
		if (!MUTANT(tc_cpwait))
			tc_wait<T>(); /* this thread's copies of tile it landed (bf16: cp.async) */
		if (!MUTANT(tc_sync))
			__syncthreads(); /* tile it is in; the other buffer's tile is consumed */
		T *next = fa_smem + 2 * TILE * ((it + 1) % 2);
		if (it + 1 < tiles) {
			fetch(next, (it + 1) * BC);
			tc_commit<T>();
		}
		const int k0 = it * BC;
		/* above the warp's diagonal, or rows past T (warp-uniform): no work */
		if (!((MUTANT(tc_causal) ? k0 + BC : k0) > wl || wrow >= g.t)) {
			const T *ks = fa_smem + 2 * TILE * (it % 2), *vs = ks + TILE;
			float s[BC / 8][4]; /* s[j]: the keys at positions k0 + 8 j .. + 7 */
			fa_times_rows<HD, BC, S::LD>(s, qa, ks); /* S = Q K^T */

			/* the online softmax of rows row[0] (s[j][0..1]) and row[1]
			 * (s[j][2..3]), in the unscaled s (scale > 0: the same max);
			 * the mask only in a tile that crosses the warp's diagonal
			 * (a key after one of its rows; tc_diag: after its last) */
			if (k0 + BC - 1 > (MUTANT(tc_diag) ? wl : wf)) {
				const int lim[2] = {qpi[0] - k0 - 2 * qd, qpi[1] - k0 - 2 * qd};
CU_UNROLL
				for (int j = 0; j < BC / 8; j++)
CU_UNROLL
					for (int e = 0; e < 4; e++)
						if (8 * j + (e & 1) > lim[e >> 1])
							s[j][e] = -INFINITY;
			}
			float mt[2] = {-INFINITY, -INFINITY};
CU_UNROLL
			for (int j = 0; j < BC / 8; j++)
CU_UNROLL
				for (int e = 0; e < 4; e++)
					mt[e >> 1] = fmaxf(mt[e >> 1], s[j][e]); /* FMNMX */
			float corr[2], mb[2];
CU_UNROLL
			for (int r = 0; r < 2; r++) {
				mt[r] = quad_max(mt[r]);
				const float mn = mt[r] > m[r] ? mt[r] : m[r];
				/* mn = -inf: nothing visible to the row yet (p = exp2(-inf) = 0) */
				corr[r] = mn == -INFINITY ? 1.0f : fa_exp2((m[r] - mn) * sl2);
				mb[r] = mn == -INFINITY ? 0.0f : mn * sl2;
				m[r] = mn;
			}
			uint32_t pa[BC / KS][4];
			if constexpr (sizeof(T) == 2) {
				/* p = exp(scale (s - m')), packed to bf16 for the mma;
				 * l = l corr + P 1 on the tensor cores (fa_sum_mma) */
CU_UNROLL
				for (int j = 0; j < BC / 8; j++)
CU_UNROLL
					for (int e = 0; e < 4; e++)
						s[j][e] = fa_exp2(fmaf(s[j][e], sl2, -mb[e >> 1]));
				fa_pack<BC, T>(pa, s);
CU_UNROLL
				for (int e = 0; e < 4; e++)
					lc[e] *= corr[e >> 1];
				fa_sum_mma<BC>(lc, pa);
			} else {
				float lt[2] = {0, 0};
CU_UNROLL
				for (int j = 0; j < BC / 8; j++)
CU_UNROLL
					for (int e = 0; e < 4; e++) {
						s[j][e] = tc_value<T>(fa_exp2(fmaf(s[j][e], sl2, -mb[e >> 1])));
						lt[e >> 1] += s[j][e]; /* P as the mma will use it */
					}
				fa_pack<BC, T>(pa, s);
CU_UNROLL
				for (int r = 0; r < 2; r++)
					l[r] = l[r] * corr[r] + row_sum(lt[r]);
			}
CU_UNROLL
			for (int n = 0; n < HD / 8; n++) {
				o[n][0] *= corr[0];
				o[n][1] *= corr[0];
				o[n][2] *= corr[1];
				o[n][3] *= corr[1];
			}
			fa_times_tile<HD, BC, S::LD>(o, pa, vs); /* O += P V */
		}
		if (it + 1 < tiles)
			fa_store_kv<S::LD>(fk, fv, next, g); /* after the mma work: the loads had it to land */
	}

	if constexpr (sizeof(T) == 2) {
		l[0] = lc[0];
		l[1] = lc[2];
	}
	float inv[2] = {1.0f / l[0], 1.0f / l[1]};
	if (dd) { /* D = dO . O, O in f32 (the quad's lanes: a quarter of the dims each) */
CU_UNROLL
		for (int r = 0; r < 2; r++) {
			float dsum = 0;
			if (row[r] < g.t) {
				const T *dr = dy + (b * g.t + row[r]) * g.c + g.hd * h + 2 * qd;
CU_UNROLL
				for (int n = 0; n < HD / 8; n++)
					dsum += ::ld(dr + 8 * n) * (o[n][2 * r] * inv[r]) +
						::ld(dr + 8 * n + 1) * (o[n][2 * r + 1] * inv[r]);
			}
			dsum = row_sum(dsum);
			if (row[r] < g.t && qd == 0)
				dd[(b * g.h + h) * g.t + row[r]] = MUTANT(tcb_unpaired) ? 0 : dsum;
		}
	}
CU_UNROLL
	for (int r = 0; r < 2; r++) {
		if (row[r] >= g.t)
			continue;
		if (lse && qd == 0 && !MUTANT(tcb_lse))
			lse[(b * g.h + h) * g.t + row[r]] = m[r] * g.scale + logf(l[r]);
		if (out)
			fa_store_row<HD>(out + (b * g.t + row[r]) * g.c + g.hd * h, o, r, inv[r]);
	}
}

/* ---- the backward on tensor cores ----
 *
 * FlashAttention-2's backward from the row statistics lse = m + log l and
 * D = dO . O (per query row, f32: lse from the forward that cu_plan_attn
 * paired with the gradient and D by k_attn_rowdot from its output O, else
 * both from k_attn_fwd_mma run again), so P = exp(scale s - lse) (exp2f
 * of one FMA) needs no softmax pass. One kernel, k_attn_bwd_mma, a block per (batch, head) and
 * run of key blocks of 64 stored key rows (FaWalk), walked one after the
 * other (BCB = 32 query rows per tile, 16 for head dim 128: the
 * registers); per key block:
 *  - K's and V's rows are copied once into shared memory; a warp loads
 *    its 16 rows' A registers per k-step where S^T = K Q^T and dP^T =
 *    V dO^T use them (fa_times_rows_sm: 4 registers live, not 2 HD / 4
 *    kept across the loop), K's rows are also B of dQ's product;
 *  - the query tiles from the block's first key's go by double-buffered
 *    (Q, dO and their rows' lse and D), one barrier per tile as in the
 *    forward; per warp (16 keys): S^T = K Q^T and dP^T = V dO^T in C
 *    registers, P^T packed to A registers, dV += P^T dO, dS^T =
 *    P^T (dP^T - D) packed, dK += dS^T Q, all in registers;
 *  - dQ: each warp stores its dS^T rows (rounded as the mma takes them)
 *    into a shared [64 keys][BCB queries] tile, a barrier, and warp w
 *    computes one 16-row, HD W' / 4-column part of the tile's dQ = dS K
 *    (A: dS^T's tile through ldmatrix .trans, B: K's rows through
 *    ldmatrix .trans, as fa_times_tile takes them) and adds it into its
 *    run's f32 sums dqacc [splits][B, T, C] (f32: by a plain load and
 *    store; bf16: copied in by cp.async at the tile's top, added in
 *    shared memory, stored back, fa_dq_part): an element of a run's sums
 *    is only ever one thread's, of this block;
 *  - after it, k_attn_dq_store sums the runs in order and writes scale *
 *    dQ into d qkv's q columns (rounded once) and, for attention_cp_grad,
 *    zeros in k and v.
 * So S and dP are computed once for all three gradients: 5 T^2 hd units
 * (S, dP, dV, dK, dQ), not the 7 of a dQ kernel and a dK/dV kernel that
 * each recompute S and dP. Why runs rather than a second dQ pass: that
 * pass is the 2 units saved; and rather than f32 atomics over every key
 * block (FlashAttention-2's default, and what this kernel did): their
 * order is the order the blocks get there, so dQ's last bits (and the
 * run's) varied from run to run. The price of the runs: fewer blocks
 * (batch x heads x splits, not x nkeys / 64), splits x B T C x 4 bytes of
 * sums written and read once more by k_attn_dq_store (zeroed first for
 * cp only: fa_dq_fresh; docs/CUDA.md).
 * The cp gradients run it too: attention_cp_grad with out NULL (dQ only:
 * S, dP, dQ), attention_cp_grad_kv with dqacc NULL (dK, dV only).
 * P is rounded to bf16 for dV, dS for dK and dQ, as FlashAttention does.
 * Causal: the block starts at its first key's query tile and a warp skips
 * query tiles wholly before its keys (its dS^T rows then zero); only the
 * tiles crossing a warp's diagonal (and the query tile crossing T) are
 * masked. */
template <int HD, typename T> struct FaBwd {
	typedef FaShape<HD, T> S;
	static const int BC = S::BCB;               /* query rows per tile */
	static const int KR = S::BR;                /* the block's key rows */
	static const int LDS = BC + 16 / S::E;      /* dS^T's rows: 16 bytes of padding */
	static const int RT = BC / 16;              /* 16-row parts of a query tile */
	static const int HDW = HD * RT / S::W;      /* dQ columns per warp */
	static const int QTILE = BC * S::LD;        /* elements of a Q (or dO) tile */
	/* bf16: dQ's run sums of the tile prefetched by cp.async (fa_dq_part) */
	static const bool DQPF = S::E == 2;
	static const int LDQ = HDW + 8;             /* their rows, f32: 32 bytes of padding */
	/* [2][Q, dO][BC][LD], [2][lse, D][BC] f32, K, V [KR][LD], dS^T [KR][LDS],
	 * bf16: dQ's sums [W][16][LDQ] f32 */
	static const int SMEM = (4 * QTILE + 2 * KR * S::LD + KR * LDS) * S::E + 4 * BC * 4 +
				(DQPF ? S::W * 16 * LDQ * 4 : 0);
	/* without dQ (k_attn_bwd_mma's DQ false): the layout's prefix, no dS^T tile or sums */
	static const int SMEM_KV = (4 * QTILE + 2 * KR * S::LD) * S::E + 4 * BC * 4;
	/* DP_ATTN_BWD=pipe (k_attn_bwd_mma's PIPE): dS^T's tile and the warps'
	 * dQ sums double-buffered, a query tile's dQ taken after the next
	 * tile's barrier (bf16 at head dim 64: 66.5 KB, 3 blocks per SM) */
	static const int SMEM_PIPE = SMEM + KR * LDS * S::E + (DQPF ? S::W * 16 * LDQ * 4 : 0);
	static_assert(HDW % 16 == 0 && HD % HDW == 0, "dQ's columns split into the warps in pairs of 8");
	static_assert((LDS * S::E) % 16 == 0, "dS^T's rows 16-byte aligned (ldmatrix)");
};

/* A registers of a 16-query part of dS = (dS^T)^T for fa_times_tile's
 * k-steps over the 64 keys, from dS^T's shared tile [keys][LDS] (rt: the
 * part's first query, a multiple of 16): bf16 through ldmatrix .x4 .trans
 * (matrix i: keys 16 k + 8 (i >> 1), queries rt + 8 (i & 1): a[i] =
 * A[g + 8 (i & 1)][8 (i >> 1) + 2 q ..+1], the A layout); tf32 by 32-bit
 * loads in fa_pack's column order (a[i] = A[g + 8 (i & 1)][8 k + 2 q +
 * (i >> 1)]: fa_times_tile's B rows are 8 k + 2 q and + 1; banks 8 q + g
 * at LDS = BC + 4). */
template <int N, int LDS, typename T>
static __device__ __forceinline__ void fa_load_dst(uint32_t (*pa)[4], const T *dst, int rt)
{
	const int lane = threadIdx.x % 32;
	if constexpr (sizeof(T) == 4) {
		const T *p = dst + 2 * (lane % 4) * LDS + rt + lane / 4;
CU_UNROLL
		for (int k = 0; k < N / 8; k++)
CU_UNROLL
			for (int i = 0; i < 4; i++)
				pa[k][i] = __float_as_uint(p[(8 * k + (i >> 1)) * LDS + 8 * (i & 1)]);
	} else {
		const int mi = lane / 8, mr = lane % 8;
CU_UNROLL
		for (int k = 0; k < N / 16; k++) {
			const T *p = dst + (16 * k + 8 * (mi >> 1) + mr) * LDS + rt + 8 * (mi & 1);
			if (MUTANT(tcb_dqlayout))
				cu_ldsm<4>(pa[k], p);
			else
				cu_ldsm_t<4>(pa[k], p);
		}
	}
}

/* A warp's 16-row, HDW-column part of dQ's run sums [rows][ld] f32 (rows:
 * those before T) and its shared copy sm [16][LDQ] (bf16's backward,
 * FaBwd::DQPF): chunk i (16 bytes, 4 columns) is lane i % 32's, at row i /
 * (HDW / 4). GET copies the chunks in by cp.async (issued at the query
 * tile's top, landed behind the tile's mma work, where the plain load of
 * the sums in the C layout stalled the warp: ncu's L1TEX scoreboard stalls,
 * 33 % of the H200's), else they go back out as 16-byte stores. So each
 * element of the sums is read and written by one fixed thread of the grid
 * in every key block of the run (its chunk's owner; the C layout's lane
 * adds in shared memory between): the order of the sums is unchanged. */
template <int HDW, int LDQ, bool GET>
static __device__ __forceinline__ void fa_dq_part(float *sm, float *run, int64_t ld, int64_t rows)
{
	const int lane = threadIdx.x % 32;
CU_UNROLL
	for (int k = 0; k < HDW / 8; k++) {
		const int i = lane + 32 * k, r = i / (HDW / 4), c = 4 * (i % (HDW / 4));
		if (r >= rows)
			continue;
		if constexpr (GET)
			cu_cp_async16(sm + r * LDQ + c, run + r * ld + c, 16);
		else
			*(float4 *)(run + r * ld + c) = *(const float4 *)(sm + r * LDQ + c);
	}
}

/* The backward's walk over key blocks: nkb = ceil(nkeys / 64) blocks of 64
 * stored key rows per (batch, head), taken in the zigzag order 0, nkb - 1,
 * 1, nkb - 2, ... (causal: key block j has nkb - j query tiles of work, so
 * each pair of neighbours in that order has nkb + 1) and cut into `splits`
 * runs of `per` consecutive ones; a CUDA block walks one run in order, and
 * adds its dQ parts into the run's own f32 sums (FlashAttention-2's
 * deterministic backward, flash-attn's `deterministic=True`: dq_accum split
 * along the keys, each split walked by one block, summed in a fixed order
 * after). Decided from the shapes alone (never the device), so that the
 * bits are the same on any GPU and any schedule. */
struct FaWalk {
	int nkb;    /* key blocks per (batch, head) */
	int per;    /* key blocks one CUDA block walks */
	int splits; /* runs, and dQ's f32 sums [splits][B, T, C] */
};

/* Blocks enough for three waves of two per SM on 132 SMs (an H100 SXM at
 * head dim 64: docs/CUDA.md): a constant, not the device's count, so the
 * sums' order is the shapes' alone. One wave (264, what it was) left
 * GPT-2's backward at 1.45 waves (384 blocks: the second wave half idle)
 * and each block a long serial walk of 8 key blocks; 792 gives it 4 runs
 * of 4 (768 blocks, 2.9 waves), for twice the f32 sums (4 x B T C). */
#define FA_WALK_BLOCKS 792

/* dq: the walk of a backward that gives dQ (at least two key blocks per
 * run where there are two: the zigzag pairs; more where batch x heads fill
 * FA_WALK_BLOCKS without them); without dQ each block takes one key block,
 * as every block's dK and dV are its own. */
static FaWalk fa_walk(int64_t bh, int64_t nkeys, int dq)
{
	FaWalk w;
	w.nkb = (int)((nkeys + 63) / 64);
	int64_t want = dq ? (FA_WALK_BLOCKS + bh - 1) / bh : w.nkb;
	int64_t most = dq ? (w.nkb + 1) / 2 : w.nkb; /* the zigzag pairs */
	int64_t splits = want < 1 ? 1 : want > most ? most : want;
	w.per = (int)((w.nkb + splits - 1) / splits);
	if (dq && w.per % 2 && w.per < w.nkb)
		w.per++; /* whole zigzag pairs: runs of equal work */
	w.splits = (w.nkb + w.per - 1) / w.per;
	return w;
}

/* Key block i of the zigzag order of nkb. */
static __device__ __forceinline__ int64_t fa_zigzag(int64_t i, int64_t nkb)
{
	return i % 2 ? nkb - 1 - i / 2 : i / 2;
}

/* dQ's run sums are not zeroed before the backward (the ordinary op; not
 * tcb_dqorder's atomics into one run): a run's first key block, zigzag
 * position s per (even: fa_walk's whole pairs, or the only run), is key
 * block s per / 2, the run's least (the odd positions' nkb - 1 - i are
 * past the even ones'), so its query tiles, from its first key row on,
 * cover every row any key block of the run adds to; it writes 0 + its
 * part there (the bits a memset's zeros gave), and k_attn_dq_store reads
 * run s from row fa_run_row0 on (adding 0 before it). cp's key blocks are
 * positions of gathered chunks, not rows in order: zeroed as before.
 * Saves the memset of splits x B T C f32 per backward (GPT-2 at batch 16:
 * 200 MB per layer). */
template <typename T> static __host__ __device__ __forceinline__ bool fa_dq_fresh(const Geom<T> &g)
{
	return !g.cp && !MUTANT(tcb_dqorder);
}
static __device__ __forceinline__ int64_t fa_run_row0(int64_t s, const FaWalk &w)
{
	return 64 * fa_zigzag(s * w.per, w.nkb);
}

/* 3 blocks per SM (<= 168 registers) for bf16 at head dim 64 (GPT-2's:
 * ptxas gave it 174, 2 blocks, once dQ's sums went unzeroed) and head dim
 * 32 (an explicit 1 let ptxas take 180 there, from 136); the rest 1, as
 * before (docs/CUDA.md's session 15). With the loop's indices in 32 bits
 * head dim 64 fits in 165 without the 40-byte spill the bound forced
 * (session 16).
 * PIPE (DP_ATTN_BWD=pipe, an experiment: docs/CUDA.md's "One barrier per
 * query tile"): the barrier between the dS^T stores and dQ = dS K goes; a
 * tile's dQ is taken after the next tile's top barrier (which then also
 * says that every warp's dS^T rows are in), from the other of two dS^T
 * tiles and dQ sums regions, and the last tile's after the loop. The same
 * products, adds and order: the default's bits. */
template <int HD, bool CP, typename T, bool DQ = true, bool PIPE = false>
__global__ void __launch_bounds__(32 * FaShape<HD, T>::W,
				  HD == 32 || (HD == 64 && sizeof(T) == 2) ? 3 : 1)
k_attn_bwd_mma(Geom<T> g, const T *dy, const float *lse, const float *dd, T *out, float *dqacc,
	       FaWalk walk)
{
	typedef FaShape<HD, T> S;
	typedef FaBwd<HD, T> F;
	if (!DQ) /* DP_ATTN_DQ=split: dK and dV only, dQ by k_attn_dq_mma (its code compiled out) */
		dqacc = (float *)0;
	const int KS = Mma<T>::K, BC = F::BC, TILE = F::QTILE;
	if (!CP)
		g.cp = 0; /* a constant: the ordinary op compiled without cp's branches */
	const float sl2 = g.scale * 1.4426950408889634f; /* scale log2(e) */
	extern __shared__ __align__(16) unsigned char fa_raw[];
	T *fa_smem = (T *)fa_raw;
	float *stats = (float *)(fa_smem + 4 * TILE);
	T *ksm = (T *)(stats + 4 * BC), *vsm = ksm + F::KR * S::LD, *dst = vsm + F::KR * S::LD;
	/* PIPE: two of each, query tile it's the (it % 2)-th */
	const int NDS = PIPE ? 2 : 1;
	float *dqw = (float *)(dst + NDS * F::KR * F::LDS) + threadIdx.x / 32 * 16 * F::LDQ; /* DQPF: the warp's */
	auto dst_of = [&](int it) { return PIPE ? dst + it % 2 * F::KR * F::LDS : dst; };
	auto dqw_of = [&](int it) { return PIPE ? dqw + it % 2 * S::W * 16 * F::LDQ : dqw; };
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, qd = lane % 4;
	/* 32-bit indices where they fit (limit_attention: keys and blocks in
	 * int32): fewer registers live across the loop (the spill ptxas made at
	 * 168, docs/CUDA.md's session 16) */
	const int split = (int)(blockIdx.x % walk.splits), h = (int)(blockIdx.x / walk.splits % g.h),
		  b = (int)(blockIdx.x / ((unsigned)walk.splits * (unsigned)g.h));
	const T *base = g.qkv + b * g.t * 3 * g.c + 3 * g.hd * h;
	const T *dbase = dy + b * g.t * g.c + g.hd * h;
	const int64_t ld = 3 * g.c;
	/* this run's dQ sums: its own, so one block adds into them, in order
	 * (tcb_dqorder: every run's into the first, by atomics: the order the
	 * blocks get there) */
	float *dqrun = dqacc && !MUTANT(tcb_dqorder) ? dqacc + split * g.b * g.t * g.c : dqacc;
	const int rt = 16 * (warp % F::RT), c0 = F::HDW * (warp / F::RT); /* this warp's part of dQ */
	/* bf16: dQ's sums through shared memory (fa_dq_part; tcb_dqorder's atomics: in place) */
	const bool pf = F::DQPF && !MUTANT(tcb_dqorder);
	/* not zeroed first (fa_dq_fresh: the ordinary op) */
	const bool fresh = fa_dq_fresh(g);
	const int i1 = (split + 1) * walk.per < walk.nkb ? (split + 1) * walk.per : walk.nkb;
	for (int kbi = split * walk.per; kbi < i1; kbi++) {
		/* the run's first key block: its parts are the sums' first terms */
		const bool first1 = fresh && kbi == split * walk.per;
		if (kbi > split * walk.per && !MUTANT(tcb_kbsync))
			__syncthreads(); /* the last key block's K rows and query tiles read */
		const int k0 = 64 * (int)fa_zigzag(kbi, walk.nkb);
		const int wrow = k0 + 16 * warp; /* the warp's first stored key row */
		const int key[2] = {wrow + gr, wrow + gr + 8}; /* this lane's key rows */
		int kp[2], wfirst = 0, wlast = 0; /* positions */
		for (int r = 0; r < 2; r++)
			kp[r] = key[r] < g.nkeys ? (int)key_pos_of_row(g, key[r]) : key[r];
		if (wrow < g.nkeys) {
			int64_t lo, hi;
			fa_key_span(g, wrow, &lo, &hi);
			wfirst = (int)lo;
			wlast = (int)hi;
		}
		float dk[HD / 8][4], dv[HD / 8][4];
CU_UNROLL
		for (int n = 0; n < HD / 8; n++)
			dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0;
		{ /* K's and V's rows: A of S^T = K Q^T and dP^T = V dO^T (each warp its
		   * 16, fa_times_rows_sm), K's B of dQ = dS K; landed by the loop's
		   * first tc_wait and barrier (bf16: cp.async, with the first query tile's group) */
			auto krow = [&](int j) {
				return k0 + j < g.nkeys ? key_of_row(g, b, h, k0 + j) : (const T *)0;
			};
			if (g.tcvec) {
				TcFetch<HD, F::KR, 32 * S::W, T> fk, fv;
				fk.fetch(krow, 0, ksm, S::LD);
				fv.fetch(krow, HD, vsm, S::LD);
				fk.store(ksm, S::LD);
				fv.store(vsm, S::LD);
			} else {
				tc_copy_gather<HD, T>(ksm, S::LD, krow, 0, F::KR, g.hd, 0);
				tc_copy_gather<HD, T>(vsm, S::LD, krow, g.hd, F::KR, g.hd, 0);
			}
		}
		const T *kw = ksm + 16 * warp * S::LD, *vw = vsm + 16 * warp * S::LD; /* the warp's rows */

		/* the query tile from q0 (Q, dO and the rows' lse log2(e) and D)
		 * for buffer buf: where the rows are 16-byte aligned, by fq and fd
		 * (bf16: cp.async, landing at tc_wait; f32: into their registers)
		 * and the statistics into st2, stored by store() after the current
		 * tile's mma work (the forward's double-buffering); else copied now */
		typedef TcFetch<HD, BC, 32 * S::W, T> Fetch;
		Fetch fq, fd;
		float st2[2] = {0, 0};
		auto fetch = [&](int q0, int buf) {
			auto qrow = [&](int j) { return q0 + j < g.t ? base + (q0 + j) * ld : (const T *)0; };
			auto drow = [&](int j) { return q0 + j < g.t ? dbase + (q0 + j) * g.c : (const T *)0; };
			const int i = threadIdx.x;
			if (i < BC) { /* lse in log2 units: P = exp2(s scale log2(e) - lse log2(e)) */
				const int64_t r = (b * g.h + h) * g.t + q0 + i;
				st2[0] = q0 + i < g.t ? lse[r] * 1.4426950408889634f : 0;
				st2[1] = q0 + i < g.t ? dd[r] : 0;
			}
			T *t = fa_smem + 2 * TILE * buf;
			if (g.tcvec) {
				fq.fetch(qrow, 0, t, S::LD);
				fd.fetch(drow, 0, t + TILE, S::LD);
			} else {
				tc_copy_gather<HD, T>(t, S::LD, qrow, 0, BC, g.hd, 0);
				tc_copy_gather<HD, T>(t + TILE, S::LD, drow, 0, BC, g.hd, 0);
			}
		};
		auto store = [&](int buf) {
			T *t = fa_smem + 2 * TILE * buf;
			float *st = stats + 2 * BC * buf;
			const int i = threadIdx.x;
			if (i < BC) {
				st[i] = st2[0];
				st[BC + i] = st2[1];
			}
			if (g.tcvec) {
				fq.store(t, S::LD);
				fd.store(t + TILE, S::LD);
			}
		};
		/* this warp's part of query tile q0's dQ = dS K (dS^T's tile dsb, all
		 * warps' rows in) added into its run's sums (bf16: through dqb, the
		 * warp's region its chunks were prefetched into; wait: for them
		 * here, else they landed at the loop's wait and barrier) */
		auto dq_tile = [&](int q0, const T *dsb, float *dqb, bool wait) {
			typedef FaBwd<HD, T> FB; /* (not F: g++ 12's internal error on the enclosing typedef) */
			uint32_t sa[FB::KR / Mma<T>::K][4];
			fa_load_dst<FB::KR, FB::LDS>(sa, dsb, rt);
			float acc[FB::HDW / 8][4];
CU_UNROLL
			for (int n = 0; n < FB::HDW / 8; n++)
				acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
			fa_times_tile<FB::HDW, FB::KR, FB::S::LD>(acc, sa, ksm + c0); /* this part of dS K */
			if (pf) { /* bf16: added to the prefetched sums */
				float *dqpart = dqrun + (b * g.t + q0 + rt) * g.c + g.hd * h + c0;
				if (wait && !MUTANT(tcb_dqpre)) {
					tc_wait<T>(); /* this thread's chunks (and the next tile) landed */
					__syncwarp(); /* every lane's */
				}
CU_UNROLL
				for (int r = 0; r < 2; r++) {
					if (q0 + rt + gr + 8 * r >= g.t)
						continue;
CU_UNROLL
					for (int n = 0; n < FB::HDW / 8; n++) {
						float2 *a2 = (float2 *)(dqb + (gr + 8 * r) * FB::LDQ + 8 * n + 2 * qd);
						float2 v = first1 ? make_float2(0.0f, 0.0f) : *a2; /* 0 + part, as zeroed */
						if (MUTANT(tcb_dqadd))
							v.x = v.y = 0;
						v.x += acc[n][2 * r];
						v.y += acc[n][2 * r + 1];
						*a2 = v;
					}
				}
				__syncwarp(); /* the sums added, by the C layout's lanes */
				fa_dq_part<FB::HDW, FB::LDQ, false>(dqb, dqpart, g.c, g.t - (q0 + rt));
			} else {
				/* f32: into the run's sums in place, each element by this one
				 * thread of the grid, once per key block of the run, in the
				 * run's order */
CU_UNROLL
				for (int r = 0; r < 2; r++) {
					const int64_t t = q0 + rt + gr + 8 * r;
					if (t >= g.t)
						continue;
					float *a = dqrun + (b * g.t + t) * g.c + g.hd * h + c0 + 2 * qd;
CU_UNROLL
					for (int n = 0; n < FB::HDW / 8; n++) {
						/* the lane's two adjacent columns by one 8-byte load and
						 * store (a quad: one 32-byte sector; HD = hd, even) */
						float2 *a2 = (float2 *)(a + 8 * n);
						float2 v = first1 ? make_float2(0.0f, 0.0f) : *a2;
						if (MUTANT(tcb_dqorder)) {
							atomicAdd(a + 8 * n, acc[n][2 * r]);
							atomicAdd(a + 8 * n + 1, acc[n][2 * r + 1]);
							continue;
						}
						if (MUTANT(tcb_dqadd))
							v.x = v.y = 0;
						v.x += acc[n][2 * r];
						v.y += acc[n][2 * r + 1];
						*a2 = v;
					}
				}
			}
		};
		/* causal: no query before the block's first key position sees its keys */
		int64_t kmin = g.nkeys;
		for (int w = 0; w < S::W; w++) /* (the ordinary op: k0) */
			if (k0 + 16 * w < g.nkeys) {
				int64_t lo, hi;
				fa_key_span(g, k0 + 16 * w, &lo, &hi);
				kmin = lo < kmin ? lo : kmin;
			}
		const int q1 = (int)fa_first_query(g, kmin), first = q1 - q1 % BC;
		const int tiles = (int)((g.t - first + BC - 1) / BC);
		fetch((int)first, 0);
		tc_commit<T>();
		store(0);
		for (int it = 0; it < tiles; it++) {
			if (!MUTANT(tcb_cpwait))
				tc_wait<T>(); /* this thread's copies of query tile it landed (bf16: cp.async) */
			if (!MUTANT(tcb_sync))
				__syncthreads(); /* query tile it is in; the other buffer's is consumed; dS^T read
						  * (PIPE: tile it - 1's dS^T rows in, tile it - 2's read) */
			const int q0 = (int)first + it * BC;
			/* this warp's part of dQ's run sums for the tile (DQPF), then the
			 * next tile: one group, landed at the wait before the dQ add
			 * (PIPE: at the next tile's top, its dQ after that barrier) */
			float *dqpart = dqacc ? dqrun + (b * g.t + q0 + rt) * g.c + g.hd * h + c0 : (float *)0;
			if (pf && dqacc && !first1)
				fa_dq_part<F::HDW, F::LDQ, true>(dqw_of(it), dqpart, g.c, g.t - (q0 + rt));
			if (it + 1 < tiles)
				fetch((int)first + (it + 1) * BC, (it + 1) % 2);
			if (pf || it + 1 < tiles)
				tc_commit<T>();
			if constexpr (PIPE) {
				/* the previous tile's dQ: every warp's dS^T rows and this
				 * thread's sums landed before the barrier above (tcb_pipebuf:
				 * the dS^T copy this tile writes, which holds tile it - 2's) */
				if (dqacc && it > 0)
					dq_tile(q0 - BC, dst_of(MUTANT(tcb_pipebuf) ? it : it - 1), dqw_of(it - 1), false);
			}
			int64_t qfirst, qlast; /* the tile's query positions */
			fa_query_span(g, q0, q0 + BC - 1, &qfirst, &qlast);
			const T *qs = fa_smem + 2 * TILE * (it % 2), *ds = qs + TILE;
			const float *ls = stats + 2 * BC * (it % 2), *dt = ls + BC;
			float s[BC / 8][4], dp[BC / 8][4];
			/* every query before the warp's keys, or keys past the end (warp-uniform) */
			const int skip = (MUTANT(tcb_causal) ? qfirst <= wlast : qlast < wfirst) || wrow >= g.nkeys;
			if (!skip) {
				fa_times_rows_sm<HD, BC, S::LD>(s, kw, qs);  /* S^T = K Q^T */
				fa_times_rows_sm<HD, BC, S::LD>(dp, vw, ds); /* dP^T = V dO^T */
				/* a query before one of the warp's keys, or past T */
				const int mask = qfirst < wlast || q0 + BC > g.t;
				const int kpi[2] = {kp[0], kp[1]};
CU_UNROLL
				for (int j = 0; j < BC / 8; j++)
CU_UNROLL
					for (int e = 0; e < 4; e++) {
						int c = 8 * j + 2 * qd + (e & 1); /* the query row q0 + c */
						float p = mask && (q0 + c >= g.t || (CP ? (int)qpos(g, q0 + c) : q0 + c) < kpi[e >> 1])
								  ? 0.0f
								  : exp2f(fmaf(s[j][e], sl2, -ls[c]));
						s[j][e] = p;                       /* P^T */
						dp[j][e] = p * (dp[j][e] - dt[c]); /* dS^T */
					}
				uint32_t pa[BC / KS][4];
				if (out) { /* uniform over the grid */
					fa_pack<BC, T>(pa, s);
					fa_times_tile<HD, BC, S::LD>(dv, pa, ds); /* dV += P^T dO */
					fa_pack<BC, T>(pa, dp);
					fa_times_tile<HD, BC, S::LD>(dk, pa, qs); /* dK += dS^T Q */
				}
			}
			if (it + 1 < tiles)
				store((it + 1) % 2); /* after the mma work: the loads had it to land */
			if (!dqacc)
				continue; /* uniform over the grid */
			/* this warp's rows of dS^T, as the mma takes them (zeros: skipped) */
CU_UNROLL
			for (int r = 0; r < 2; r++) {
				T *d = dst_of(it) + (16 * warp + gr + 8 * r) * F::LDS + 2 * qd;
CU_UNROLL
				for (int j = 0; j < BC / 8; j++) {
					float x0 = skip ? 0.0f : dp[j][2 * r], x1 = skip ? 0.0f : dp[j][2 * r + 1];
					if constexpr (sizeof(T) == 2) {
						*(uint32_t *)(d + 8 * j) = pack_bf16(x0, x1);
					} else {
						d[8 * j] = tc_value<T>(x0);
						d[8 * j + 1] = tc_value<T>(x1);
					}
				}
			}
			if constexpr (!PIPE) {
				if (!MUTANT(tcb_dqsync))
					__syncthreads(); /* dS^T's rows of every warp are in */
				dq_tile(q0, dst, dqw, true);
			}
		}
		if constexpr (PIPE) {
			if (dqacc && tiles > 0) { /* the last tile's dQ (uniform over the block) */
				tc_wait<T>();
				__syncthreads(); /* its dS^T rows of every warp; its sums */
				if (!MUTANT(tcb_pipetail))
					dq_tile((int)first + (tiles - 1) * BC, dst_of(tiles - 1), dqw_of(tiles - 1), false);
			}
		}
		if (tiles == 0)
			tc_wait<T>(); /* K's and V's copies (no query tile sees these keys) */
		if (!out)
			continue; /* uniform over the grid */
CU_UNROLL
		for (int r = 0; r < 2; r++)
			if (key[r] < g.nkeys) { /* d qkv's k and v columns, or cp's d kv [cp, B, T, 2C] */
				int64_t s = key[r], blk = s / g.t, j = s - blk * g.t;
				T *o = g.cp ? out + ((blk * g.b + b) * g.t + j) * 2 * g.c + 2 * g.hd * h
					    : out + (b * g.t + s) * ld + 3 * g.hd * h + g.hd;
				fa_store_row<HD>(o, dk, r, g.scale);
				fa_store_row<HD>(o + g.hd, dv, r, 1.0f);
			}
	}
}

/* d qkv's q columns = scale * dQ, the sum of the walk's runs' f32 sums
 * (k_attn_bwd_mma's dqacc [splits][B, T, C]) in run order, rounded once;
 * zero_kv (attention_cp_grad): its k and v columns 0 (they return through
 * the gathered kv). */
template <typename T>
__global__ void k_attn_dq_store(Geom<T> g, const float *dqacc, FaWalk walk, T *dqkv, int zero_kv)
{
	const int64_t n = g.b * g.t * g.c;
	const bool fresh = fa_dq_fresh(g);
	CU_FOR_EACH(i, n) {
		int64_t bt = i / g.c, c = i - bt * g.c, h = c / g.hd, d = c - h * g.hd, t = bt % g.t;
		T *row = dqkv + bt * 3 * g.c + 3 * g.hd * h;
		float sum = dqacc[i];
		for (int s = 1; s < walk.splits; s++) /* fresh: rows before run s's first, never written */
			sum += !fresh || t >= (MUTANT(tcb_dqfresh) ? 0 : fa_run_row0(s, walk)) ? dqacc[s * n + i] : 0.0f;
		st(row + d, g.scale * sum);
		if (zero_kv) {
			st(row + g.hd + d, 0.0f);
			st(row + 2 * g.hd + d, 0.0f);
		}
	}
}

/* The same sums, four columns per thread (hd a multiple of 4, d qkv
 * aligned to 4 elements: every tensor-core shape; launch_bwd_tc checks),
 * a block per row (batch, t) of [B, T, C]: 16-byte loads of each run's
 * sums, 8-byte (bf16) or 16-byte stores of the four q columns, the
 * division by hd once per thread and the run's first row tested once per
 * row (uniform over the block), where k_attn_dq_store above pays three
 * int64 divisions and a run test per element. The H200 took 1.56 ms per
 * GPT-2 step (130 us per layer, ~1.7 TB/s of its ~225 MB) for that
 * kernel (docs/CUDA.md, "Speed (session 16)"). Each element's sum is the
 * same f32 adds in the same order (run 0, then 1, 2, ..., + 0 where a run
 * never wrote the row) and the same rounding (st): the same bits. */
template <typename T>
__global__ void k_attn_dq_store4(Geom<T> g, const float *dqacc, FaWalk walk, T *dqkv, int zero_kv)
{
	const int64_t n = g.b * g.t * g.c;
	const bool fresh = fa_dq_fresh(g);
	const int hd = (int)g.hd, c4 = (int)g.c / 4;
	for (int64_t bt = blockIdx.x; bt < g.b * g.t; bt += gridDim.x) {
		const int64_t t = bt % g.t;
		const float *src = dqacc + bt * g.c;
		T *row = dqkv + bt * 3 * g.c;
		for (int j = threadIdx.x; j < c4; j += blockDim.x) {
			const int c = 4 * j, h = c / hd, d = c - h * hd;
			float4 sum = ld4(src + c);
			for (int s = 1; s < walk.splits; s++) { /* fresh: a run's rows before its first: + 0 */
				const bool in = !fresh || t >= (MUTANT(tcb_dqfresh) ? 0 : fa_run_row0(s, walk));
				const float4 x = in ? ld4(src + s * n + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				sum.x += x.x;
				sum.y += x.y;
				sum.z += x.z;
				sum.w += x.w;
			}
			/* tcb_dqvec: the four columns stored out of order (the middle two swapped) */
			const float v[4] = {sum.x, MUTANT(tcb_dqvec) ? sum.z : sum.y,
					    MUTANT(tcb_dqvec) ? sum.y : sum.z, sum.w};
			T *q = row + 3 * hd * h + d;
			union {
				T e[4];
				uint2 h; /* bf16's four */
				uint4 f; /* f32's */
			} o, z;
CU_UNROLL
			for (int k = 0; k < 4; k++) {
				st(&o.e[k], g.scale * v[k]);
				st(&z.e[k], 0.0f);
			}
			if constexpr (sizeof(T) == 2) {
				*(uint2 *)q = o.h;
				if (zero_kv)
					*(uint2 *)(q + hd) = *(uint2 *)(q + 2 * hd) = z.h;
			} else {
				*(uint4 *)q = o.f;
				if (zero_kv)
					*(uint4 *)(q + hd) = *(uint4 *)(q + 2 * hd) = z.f;
			}
		}
	}
}

/* ---- the split dQ pass (DP_ATTN_DQ=split: an experiment, docs/CUDA.md) ----
 *
 * dQ by query tile, as the forward walks: a block per (batch, head) and 64
 * query rows (a warp's 16), the heaviest tiles (the last, causal) first;
 * each warp keeps its rows' Q and dO as A registers and their lse (log2
 * units) and D = dO . O (k_attn_rowdot8's, or the forward's again), and
 * walks the key tiles up to its last row (the forward's BC keys, K and V
 * double-buffered by fa_fetch_kv): S = Q K^T and dP = dO V^T in C
 * registers, P = exp2(s scale log2(e) - lse log2(e)) (0 past the
 * diagonal), dS = P (dP - D) rounded as the mma takes it (bf16: as
 * k_attn_bwd_mma's dS^T), dQ += dS K in f32 C registers; written once as
 * scale dQ, rounded once, into d qkv's q columns. One block owns a row's
 * dQ and sums its key tiles in order: deterministic with no f32 sums in
 * memory and no store pass, for 2 T^2 hd units more (S and dP again: 7 in
 * all with k_attn_bwd_mma<.., DQ false>'s dK and dV, against the runs'
 * 5). The ordinary op only (attention_grad, not cp: the cp ops keep the
 * runs). */
template <int HD, typename T>
__global__ void __launch_bounds__(32 * FaShape<HD, T>::W)
k_attn_dq_mma(Geom<T> g, const T *dy, const float *lse, const float *dd, T *dqkv)
{
	typedef FaShape<HD, T> S;
	const int KS = Mma<T>::K, BC = S::BC, TILE = BC * S::LD;
	g.cp = 0; /* the ordinary op: no cp branches */
	extern __shared__ __align__(16) unsigned char fa_raw[];
	T *fa_smem = (T *)fa_raw; /* [2][K, V][BC][LD] */
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, qd = lane % 4;
	/* block i: query tile ntq - 1 - i / (B H) of (batch, head) i % (B H) */
	const int bhn = (int)(g.b * g.h), ntq = (int)((g.t + S::BR - 1) / S::BR);
	const int bh = (int)(blockIdx.x % (unsigned)bhn), b = bh / (int)g.h, h = bh % (int)g.h;
	const int q0 = (ntq - 1 - (int)(blockIdx.x / (unsigned)bhn)) * S::BR;
	const int64_t ld = 3 * g.c;
	const T *base = g.qkv + (int64_t)b * g.t * ld + 3 * g.hd * h;
	const T *dbase = dy + (int64_t)b * g.t * g.c + g.hd * h;
	const int wrow = q0 + 16 * warp; /* the warp's first row */
	const int64_t row[2] = {wrow + gr, wrow + gr + 8}; /* this lane's query rows */
	uint32_t qa[HD / KS][4], da[HD / KS][4];
	const T *rp[2];
	fa_rows(rp, base, ld, row, g.t);
	fa_load_a<HD>(qa, rp, 0, g.vec8);
	fa_rows(rp, dbase, g.c, row, g.t);
	fa_load_a<HD>(da, rp, 0, g.vec8);
	float l2[2], dr[2]; /* the rows' lse log2(e) (past T: +inf, so P = 0) and D */
CU_UNROLL
	for (int r = 0; r < 2; r++) {
		/* (tcq_lse: the next row's lse) */
		const int64_t i = ((int64_t)b * g.h + h) * g.t + row[r] +
				  (MUTANT(tcq_lse) && row[r] + 1 < g.t ? 1 : 0);
		l2[r] = row[r] < g.t ? lse[i] * 1.4426950408889634f : INFINITY;
		dr[r] = row[r] < g.t ? dd[i] : 0.0f;
	}
	float acc[HD / 8][4]; /* dQ: acc[n][e] = dQ[row (e >> 1)][8 n + 2 qd + (e & 1)] */
CU_UNROLL
	for (int n = 0; n < HD / 8; n++)
		acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
	const int tlast = (int)(q0 + S::BR - 1 < g.t - 1 ? q0 + S::BR - 1 : g.t - 1); /* the block's */
	const int wl = (int)(wrow + 15 < g.t - 1 ? wrow + 15 : g.t - 1);           /* the warp's */
	const int tiles = tlast / BC + 1, lim0 = (int)row[0] - 2 * qd, lim1 = (int)row[1] - 2 * qd;
	const float sl2 = g.scale * 1.4426950408889634f; /* scale log2(e) */
	typedef TcFetch<HD, BC, 32 * S::W, T> Fetch;
	Fetch fk, fv;
	fa_fetch_kv<HD, S::LD, false>(fk, fv, fa_smem, g, b, h, 0);
	tc_commit<T>();
	fa_store_kv<S::LD>(fk, fv, fa_smem, g);
	for (int it = 0; it < tiles; it++) {
		tc_wait<T>();    /* this thread's copies of tile it landed (bf16: cp.async) */
		__syncthreads(); /* tile it is in; the other buffer's tile is consumed */
		T *next = fa_smem + 2 * TILE * ((it + 1) % 2);
		if (it + 1 < tiles) {
			fa_fetch_kv<HD, S::LD, false>(fk, fv, next, g, b, h, (it + 1) * BC);
			tc_commit<T>();
		}
		const int k0 = it * BC;
		/* above the warp's diagonal, or rows past T (warp-uniform): no work */
		if (!(k0 > wl || wrow >= g.t)) {
			const T *ks = fa_smem + 2 * TILE * (it % 2), *vs = ks + TILE;
			float s[BC / 8][4], dp[BC / 8][4]; /* [j]: the keys k0 + 8 j .. + 7 */
			fa_times_rows<HD, BC, S::LD>(s, qa, ks);  /* S = Q K^T */
			fa_times_rows<HD, BC, S::LD>(dp, da, vs); /* dP = dO V^T */
			const int diag = k0 + BC - 1 > wrow; /* a key after one of the warp's rows */
			const int lim[2] = {lim0 - k0, lim1 - k0};
CU_UNROLL
			for (int j = 0; j < BC / 8; j++)
CU_UNROLL
				for (int e = 0; e < 4; e++) {
					const float p = diag && 8 * j + (e & 1) > lim[e >> 1]
								? 0.0f
								: exp2f(fmaf(s[j][e], sl2, -l2[e >> 1]));
					dp[j][e] = p * (dp[j][e] - dr[e >> 1]); /* dS */
				}
			uint32_t pa[BC / KS][4];
			fa_pack<BC, T>(pa, dp);
			fa_times_tile<HD, BC, S::LD>(acc, pa, ks); /* dQ += dS K */
		}
		if (it + 1 < tiles)
			fa_store_kv<S::LD>(fk, fv, next, g); /* after the mma work */
	}
CU_UNROLL
	for (int r = 0; r < 2; r++)
		if (row[r] < g.t)
			fa_store_row<HD>(dqkv + ((int64_t)b * g.t + row[r]) * ld + 3 * g.hd * h, acc, r, g.scale);
}

/* DP_ATTN_DQ: "runs" 0, "split" 1 */
static int fa_dq_split = -2;
extern "C" int cu_attn_dq_split(void)
{
	return cu_env_choice(&fa_dq_split, "DP_ATTN_DQ", "runs", "split");
}

/* DP_ATTN_BWD: "sync2" 0 (the default: two barriers per query tile),
 * "pipe" 1 (k_attn_bwd_mma's PIPE: one) */
static int fa_bwd_pipe = -2;
extern "C" int cu_attn_bwd_pipe(void)
{
	return cu_env_choice(&fa_bwd_pipe, "DP_ATTN_BWD", "sync2", "pipe");
}

/* ---- the cp positions: the zigzag layout the kernels assume ---- */

__global__ void k_cp_check(const int32_t *pos, int64_t t, int64_t tg, CuScalars *sc)
{
	int64_t l = t / 2;
	CU_FOR_EACH(j, t) {
		int64_t first = j < l ? 0 : l;
		int64_t p = pos[j];
		/* the second run after the first: the tensor-core kernels' order */
		if (p < 0 || p >= tg || p != (int64_t)pos[first] + j - first ||
		    (j == l && j > 0 && p <= (int64_t)pos[l - 1]))
			cu_report_error(sc, CU_ERR_POSITION, p, j, tg);
	}
}

/* ---- launchers ---- */

static int head_dim_class(int64_t hd)
{
	return hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : hd <= 256 ? 256 : 0;
}

/* The operands of any of the six ops. */
template <typename T> static Geom<T> geom_of(const CuArgs *a)
{
	const DpInstr *in = a->in;
	int cp = in->op == DP_OP_ATTENTION_CP || in->op == DP_OP_ATTENTION_CP_GRAD ||
		 in->op == DP_OP_ATTENTION_CP_GRAD_KV || in->op == DP_OP_ATTENTION_CP_GRAD_BOTH;
	int q = in->op == DP_OP_ATTENTION || in->op == DP_OP_ATTENTION_CP ? 0 : 1; /* qkv's operand */
	const DpTensor *tq = cu_t(a, q);
	Geom<T> g;
	g.qkv = (const T *)cu_p(a, q);
	g.kv = cp ? (const T *)cu_p(a, q + 1) : (const T *)0;
	g.pos = cp ? (const int32_t *)cu_p(a, q + 2) : (const int32_t *)0;
	g.b = tq->dims[0];
	g.t = tq->dims[1];
	g.h = DP_ATTR(in, ATTENTION, heads);
	g.c = tq->dims[2] / 3;
	g.hd = g.c / g.h;
	g.cp = cp ? DP_ATTR(in, ATTENTION_CP, cp) : 0;
	g.nkeys = cp ? g.cp * g.t : g.t;
	g.scale = (float)(1.0 / sqrt((double)g.hd));
	/* every row offset the tiles read is a multiple of hd (or of C = h hd) */
	const void *dy = q ? cu_p(a, 0) : (const void *)0;
	g.vec8 = cu_vec8<T>(g.hd, g.qkv, g.kv, dy);
	g.tcvec = g.vec8 || (sizeof(T) == 4 && g.hd % 4 == 0 && cu_aligned16(g.qkv) &&
			     (!g.kv || cu_aligned16(g.kv)) && (!dy || cu_aligned16(dy)));
	return g;
}

/* The kernels' own limits: head dims up to 256 (registers and shared tiles),
 * positions in int32, grids within 2^31 blocks. */
static int limit_attention(const DpStep *s, const DpInstr *in, RtErr *e)
{
	int q = in->op == DP_OP_ATTENTION || in->op == DP_OP_ATTENTION_CP ? 0 : 1;
	const DpTensor *tq = &s->tensors[in->in[q]];
	int cp = in->op != DP_OP_ATTENTION && in->op != DP_OP_ATTENTION_GRAD;
	int64_t heads = DP_ATTR(in, ATTENTION, heads);
	int64_t hd = tq->dims[2] / 3 / heads;
	int64_t keys = tq->dims[1] * (cp ? DP_ATTR(in, ATTENTION_CP, cp) : 1);
	int64_t blocks = tq->dims[0] * heads * ((keys + ATT_ROWS - 1) / ATT_ROWS);
	if (!head_dim_class(hd))
		return RT_FAIL(e, "step file: %s: head dim %lld; the CUDA attention kernels take head "
			       "dims up to 256", dp_op_names[in->op], (long long)hd);
	if (keys > INT_MAX || blocks > INT_MAX)
		return RT_FAIL(e, "step file: %s: %lld keys of %lld sequences are too many for the "
			       "CUDA attention kernels", dp_op_names[in->op], (long long)keys,
			       (long long)(tq->dims[0] * heads));
	return 0;
}

static int tc_instr(const DpStep *s, const DpInstr *in);

/* (m, inv, D) per (batch, head, query row); the tensor-core backward: (lse,
 * D, unused), then, where it gives dQ, dQ's f32 sums [splits][B, T, C]
 * (fa_walk's runs) */
static size_t scratch_attention(const DpStep *s, const DpInstr *in)
{
	if (in->op == DP_OP_ATTENTION || in->op == DP_OP_ATTENTION_CP)
		return 0;
	const DpTensor *tq = &s->tensors[in->in[1]];
	int64_t heads = DP_ATTR(in, ATTENTION, heads);
	int64_t rows = tq->dims[0] * heads * tq->dims[1], dq = 0;
	/* dQ's run sums: the tensor-core backward's, but not under
	 * DP_ATTN_DQ=split, whose dQ pass writes dQ itself (run_attention) */
	if (in->op != DP_OP_ATTENTION_CP_GRAD_KV && tc_instr(s, in) &&
	    !(in->op == DP_OP_ATTENTION_GRAD && cu_attn_dq_split() == 1)) {
		int64_t keys = tq->dims[1] * (in->op == DP_OP_ATTENTION_GRAD ? 1 : DP_ATTR(in, ATTENTION_CP, cp));
		dq = fa_walk(tq->dims[0] * heads, keys, 1).splits * tq->dims[0] * tq->dims[1] * (tq->dims[2] / 3);
	}
	return (size_t)((3 * rows + 3) / 4 * 4 + dq) * sizeof(float); /* dQ's sums 16-byte aligned */
}

/* The forward and the backward run on tensor cores for bf16 attention,
 * and for f32 under gemm_math tf32 (precision tf32: in tf32), ordinary or
 * cp, with a head dim of 32, 64 or 128 exactly (the rest, exact f32 among
 * them, on the kernels above: docs/CUDA.md says why). */
template <int HD, typename T> static int tensor_cores(const Geom<T> &g, int tf32)
{
	return (sizeof(T) == 2 || tf32) && g.hd == HD && (HD == 32 || HD == 64 || HD == 128);
}

/* CP: the cp ops' instantiation (the ordinary op's has no cp branches:
 * fewer registers, ptxas's counts in docs/CUDA.md) */
template <int HD, bool CP, typename T>
static int launch_fwd_tc(const CuArgs *a, const Geom<T> &g, RtErr *e)
{
	if constexpr (HD >= 32 && HD <= 128) {
		typedef FaShape<HD, T> S;
		unsigned blocks = (unsigned)(g.b * g.h * ((g.t + S::BR - 1) / S::BR));
		CU_LAUNCH_SMEM((k_attn_fwd_mma<HD, CP, T>), blocks, 32 * S::W, (size_t)S::SMEM, a->st,
			       g, (T *)cu_p(a, -1), MUTANT(tcb_stale) ? (float *)0 : a->fuse->lse,
			       (const T *)0, (float *)0);
		CU_LAUNCHED(a, e);
	}
	return 0;
}

/* D = dO . O per (batch, head, query row) from the forward's output: a
 * warp per row (its head dims in one coalesced read), summed by xor
 * shuffles. */
template <typename T>
__global__ void k_attn_rowdot(Geom<T> g, const T *dy, const T *o, float *dd)
{
	const int lane = threadIdx.x % 32;
	const int64_t rows = g.b * g.h * g.t, warps = (int64_t)gridDim.x * blockDim.x / 32;
	for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < rows; i += warps) {
		int64_t t = i % g.t, h = (i / g.t) % g.h, b = i / (g.t * g.h);
		const T *dr = dy + (b * g.t + t) * g.c + g.hd * h, *orow = o + (dr - dy);
		float sum = 0;
		for (int64_t d = lane; d < g.hd; d += 32)
			sum += ld(dr + d) * ld(orow + d);
		for (int k = 16; k > 0; k /= 2)
			sum += __shfl_xor_sync(CU_FULL_MASK, sum, k);
		if (lane == 0)
			dd[i] = MUTANT(tcb_dterm) ? 0 : sum;
	}
}

/* The same for bf16 rows of whole 16-byte pieces (Geom.vec8, O 16-byte
 * aligned too): 8 lanes per row, 4 rows per warp, each lane one 16-byte
 * load of dO and of O per 64 head dims, its 8 products summed in order,
 * then the 8 lanes by xor shuffles (4, 2, 1). The warp-per-row kernel
 * above read 2 bytes per lane (64-byte loads): the H200 took 58 us per
 * GPT-2 layer for its 50 MB, ~0.9 TB/s. */
template <typename T>
__global__ void k_attn_rowdot8(Geom<T> g, const T *dy, const T *o, float *dd)
{
	const int sub = threadIdx.x % 8;
	const int64_t rows = g.b * g.h * g.t, step = (int64_t)gridDim.x * blockDim.x / 8;
	/* the loop's bound is the warp's first row: every lane reaches the shuffles */
	for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32 * 4; w < rows; w += step) {
		const int64_t i = w + threadIdx.x % 32 / 8;
		float sum = 0;
		if (i < rows) {
			int64_t t = i % g.t, h = (i / g.t) % g.h, b = i / (g.t * g.h);
			const T *dr = dy + (b * g.t + t) * g.c + g.hd * h, *orow = o + (dr - dy);
			for (int64_t d = 8 * sub; d < g.hd; d += 64) {
				const uint4 x = *(const uint4 *)(dr + d), y = *(const uint4 *)(orow + d);
				const T *xs = (const T *)&x, *ys = (const T *)&y;
CU_UNROLL
				for (int k = 0; k < 8; k++)
					sum += ld(xs + k) * ld(ys + k);
			}
		}
		/* tcb_rowdot: the shuffles across the warp's rows (16, 8, 4), not its lanes */
		for (int k = MUTANT(tcb_rowdot) ? 16 : 4; k >= (MUTANT(tcb_rowdot) ? 4 : 1); k /= 2)
			sum += __shfl_xor_sync(CU_FULL_MASK, sum, k);
		if (i < rows && sub == 0)
			dd[i] = MUTANT(tcb_dterm) ? 0 : sum;
	}
}

/* The backward: each query row's lse and D, then k_attn_bwd_mma (dK and
 * dV: attention_grad, attention_cp_grad_kv; dQ into its runs' f32 sums:
 * attention_grad, attention_cp_grad, zeroed first for cp), then dQ summed over the
 * runs and stored. lse is the forward's and D = dO . O from its output when
 * the planner paired them (cu_plan_attn); else the forward runs again for
 * both (into scratch, O not written). Scratch: lse, D, then dQ's sums
 * (scratch_attention). */
template <int HD, bool CP, typename T>
static int launch_bwd_tc(const CuArgs *a, const Geom<T> &g, RtErr *e)
{
	if constexpr (HD >= 32 && HD <= 128) {
		typedef FaShape<HD, T> S;
		float *lse = (float *)a->scratch, *dd = lse + g.b * g.h * g.t;
		const T *dy = (const T *)cu_p(a, 0);
		int op = a->in->op;
		/* d kv (or d qkv's k and v columns), d qkv; attention_cp_grad_both:
		 * d kv [cp, B, T, 2C], then d qkv */
		T *dkv = (T *)cu_p(a, -1), *dqkv = dkv;
		if (op == DP_OP_ATTENTION_CP_GRAD_BOTH)
			dqkv = dkv + g.cp * g.b * g.t * 2 * g.c;
		else if (op == DP_OP_ATTENTION_CP_GRAD)
			dkv = (T *)0;
		unsigned blocks = (unsigned)(g.b * g.h * ((g.t + S::BR - 1) / S::BR));
		if (a->fuse->lse_o) {
			lse = a->fuse->lse;
			const T *o = (const T *)a->fuse->lse_o;
			if (g.vec8 && cu_aligned16(o)) {
				CU_LAUNCH(k_attn_rowdot8<T>, cu_grid(8 * g.b * g.h * g.t), CU_THREADS, a->st,
					  g, dy, o, dd);
			} else {
				CU_LAUNCH(k_attn_rowdot<T>, cu_grid(32 * g.b * g.h * g.t), CU_THREADS, a->st,
					  g, dy, o, dd);
			}
		} else {
			CU_LAUNCH_SMEM((k_attn_fwd_mma<HD, CP, T>), blocks, 32 * S::W, (size_t)S::SMEM,
				       a->st, g, (T *)0, lse, dy, dd);
		}
		CU_LAUNCHED(a, e);
		if constexpr (!CP) {
			if (op == DP_OP_ATTENTION_GRAD && cu_attn_dq_split() == 1) {
				/* DP_ATTN_DQ=split: dK and dV by key block (one each, no dQ),
				 * then dQ by query tile (k_attn_dq_mma) */
				FaWalk kw = fa_walk(g.b * g.h, g.nkeys, 0);
				const int ksmem = FaBwd<HD, T>::SMEM_KV;
				if (ksmem > 48 * 1024)
					CU_OK(a, cudaFuncSetAttribute((const void *)k_attn_bwd_mma<HD, false, T, false>,
								      cudaFuncAttributeMaxDynamicSharedMemorySize,
								      ksmem), e);
				CU_LAUNCH_SMEM((k_attn_bwd_mma<HD, false, T, false>), (unsigned)(g.b * g.h * kw.splits),
					       32 * S::W, (size_t)ksmem, a->st, g, dy, (const float *)lse,
					       (const float *)dd, dkv, (float *)0, kw);
				CU_LAUNCHED(a, e);
				CU_LAUNCH_SMEM((k_attn_dq_mma<HD, T>), blocks, 32 * S::W, (size_t)S::SMEM, a->st, g,
					       dy, (const float *)lse, (const float *)dd, dqkv);
				CU_LAUNCHED(a, e);
				return 0;
			}
		}
		FaWalk walk = fa_walk(g.b * g.h, g.nkeys, op != DP_OP_ATTENTION_CP_GRAD_KV);
		unsigned kblocks = (unsigned)(g.b * g.h * walk.splits);
		float *dqacc = (float *)a->scratch + (3 * g.b * g.h * g.t + 3) / 4 * 4; /* 16-byte aligned */
		size_t dqbytes = (size_t)(walk.splits * g.b * g.t * g.c) * sizeof(float);
		if (op == DP_OP_ATTENTION_CP_GRAD_KV)
			dqacc = NULL;
		else if (!fa_dq_fresh(g)) /* (the ordinary op's runs start themselves) */
			CU_OK(a, cudaMemsetAsync(dqacc, 0, dqbytes, a->st), e);
		if (cu_attn_bwd_pipe() == 1) { /* DP_ATTN_BWD=pipe: one barrier per query tile */
			const int smem = FaBwd<HD, T>::SMEM_PIPE;
			if (smem > 48 * 1024)
				CU_OK(a, cudaFuncSetAttribute((const void *)k_attn_bwd_mma<HD, CP, T, true, true>,
							      cudaFuncAttributeMaxDynamicSharedMemorySize, smem), e);
			CU_LAUNCH_SMEM((k_attn_bwd_mma<HD, CP, T, true, true>), kblocks, 32 * S::W, (size_t)smem,
				       a->st, g, dy, (const float *)lse, (const float *)dd, dkv, dqacc, walk);
		} else {
			const int smem = FaBwd<HD, T>::SMEM;
			if (smem > 48 * 1024) /* f32 (tf32) at head dim 128: the opt-in, every launch (cheap) */
				CU_OK(a, cudaFuncSetAttribute((const void *)k_attn_bwd_mma<HD, CP, T>,
							      cudaFuncAttributeMaxDynamicSharedMemorySize, smem), e);
			CU_LAUNCH_SMEM((k_attn_bwd_mma<HD, CP, T>), kblocks, 32 * S::W, (size_t)smem, a->st, g,
				       dy, (const float *)lse, (const float *)dd, dkv, dqacc, walk);
		}
		CU_LAUNCHED(a, e);
		if (dqacc && g.hd % 4 == 0 && ((uintptr_t)dqkv & (4 * sizeof(T) - 1)) == 0) {
			/* a block per row, a thread per 4 columns (C = 768: 192) */
			const int64_t rows = g.b * g.t, c4 = g.c / 4;
			const unsigned threads = (unsigned)(c4 < 256 ? (c4 + 31) / 32 * 32 : 256);
			CU_LAUNCH(k_attn_dq_store4<T>, (unsigned)(rows < (1 << 20) ? rows : 1 << 20), threads,
				  a->st, g, (const float *)dqacc, walk, dqkv, (int)(g.cp != 0));
			CU_LAUNCHED(a, e);
		} else if (dqacc) {
			CU_LAUNCH(k_attn_dq_store<T>, cu_grid(g.b * g.t * g.c), CU_THREADS, a->st, g,
				  (const float *)dqacc, walk, dqkv, (int)(g.cp != 0));
			CU_LAUNCHED(a, e);
		}
	}
	return 0;
}

template <int HD, typename T> static int launch(const CuArgs *a, const Geom<T> &g, RtErr *e)
{
	T *out = (T *)cu_p(a, -1);
	const T *dy = (const T *)cu_p(a, 0);
	const DpInstr *in = a->in;
	unsigned qblocks = (unsigned)(g.b * g.h * ((g.t + ATT_ROWS - 1) / ATT_ROWS));
	unsigned kblocks = (unsigned)(g.b * g.h * ((g.nkeys + ATT_ROWS - 1) / ATT_ROWS));
	float *stats = (float *)a->scratch;
	switch (in->op) {
	case DP_OP_ATTENTION:
	case DP_OP_ATTENTION_CP:
		if (tensor_cores<HD, T>(g, a->tf32))
			return g.cp ? launch_fwd_tc<HD, true>(a, g, e)
				    : launch_fwd_tc<HD, false>(a, g, e);
		CU_LAUNCH((k_attn_fwd<HD, T>), qblocks, ATT_THREADS, a->st, g, out);
		CU_LAUNCHED(a, e);
		return 0;
	case DP_OP_ATTENTION_GRAD:
		if (tensor_cores<HD, T>(g, a->tf32))
			return g.cp ? launch_bwd_tc<HD, true>(a, g, e)
				    : launch_bwd_tc<HD, false>(a, g, e);
		CU_LAUNCH((k_attn_bwd_q<HD, T>), qblocks, ATT_THREADS, a->st, g, dy, out, stats,
			  1, 0);
		CU_LAUNCHED(a, e);
		CU_LAUNCH((k_attn_bwd_kv<HD, T>), kblocks, ATT_THREADS, a->st, g, dy, stats,
			  out, 0);
		CU_LAUNCHED(a, e);
		return 0;
	case DP_OP_ATTENTION_CP_GRAD:
		if (tensor_cores<HD, T>(g, a->tf32))
			return g.cp ? launch_bwd_tc<HD, true>(a, g, e)
				    : launch_bwd_tc<HD, false>(a, g, e);
		CU_LAUNCH((k_attn_bwd_q<HD, T>), qblocks, ATT_THREADS, a->st, g, dy, out, stats,
			  1, 1);
		CU_LAUNCHED(a, e);
		return 0;
	case DP_OP_ATTENTION_CP_GRAD_BOTH: /* d kv, then d qkv */
		if (tensor_cores<HD, T>(g, a->tf32))
			return launch_bwd_tc<HD, true>(a, g, e);
		CU_LAUNCH((k_attn_bwd_q<HD, T>), qblocks, ATT_THREADS, a->st, g, dy,
			  out + g.cp * g.b * g.t * 2 * g.c, stats, 1, 1);
		CU_LAUNCHED(a, e);
		CU_LAUNCH((k_attn_bwd_kv<HD, T>), kblocks, ATT_THREADS, a->st, g, dy, stats,
			  out, 1);
		CU_LAUNCHED(a, e);
		return 0;
	default: /* DP_OP_ATTENTION_CP_GRAD_KV */
		if (tensor_cores<HD, T>(g, a->tf32))
			return g.cp ? launch_bwd_tc<HD, true>(a, g, e)
				    : launch_bwd_tc<HD, false>(a, g, e);
		CU_LAUNCH((k_attn_bwd_q<HD, T>), qblocks, ATT_THREADS, a->st, g, dy, (T *)0, stats,
			  0, 0);
		CU_LAUNCHED(a, e);
		CU_LAUNCH((k_attn_bwd_kv<HD, T>), kblocks, ATT_THREADS, a->st, g, dy, stats,
			  out, 1);
		CU_LAUNCHED(a, e);
		return 0;
	}
}

template <typename T> static int run_attention_t(const CuArgs *a, RtErr *e)
{
	Geom<T> g = geom_of<T>(a);
	if (g.b <= 0 || g.t <= 0 || g.h <= 0)
		return 0;
	if (g.cp) {
		CU_LAUNCH(k_cp_check, cu_grid(g.t), CU_THREADS, a->st, g.pos, g.t, g.nkeys, a->sc);
		CU_LAUNCHED(a, e);
	}
	switch (head_dim_class(g.hd)) {
	case 16:
		return launch<16>(a, g, e);
	case 32:
		return launch<32>(a, g, e);
	case 64:
		return launch<64>(a, g, e);
	case 128:
		return launch<128>(a, g, e);
	default:
		return launch<256>(a, g, e);
	}
}

/* Every operand but the cp positions has one dtype (the operand rules). */
static int run_attention(const CuArgs *a, RtErr *e)
{
	return cu_t(a, -1)->dtype == DP_BF16 ? run_attention_t<cu_bf16>(a, e)
					     : run_attention_t<float>(a, e);
}

/* ---- planning: the gradient reuses its forward's lse and output ---- */

/* The forward op of gradient op `op` (-1: not a gradient of attention). */
static int attn_forward_of(int op)
{
	return op == DP_OP_ATTENTION_GRAD ? DP_OP_ATTENTION
	       : op == DP_OP_ATTENTION_CP_GRAD || op == DP_OP_ATTENTION_CP_GRAD_KV ||
			 op == DP_OP_ATTENTION_CP_GRAD_BOTH
		       ? DP_OP_ATTENTION_CP
		       : -1;
}

/* Does a gradient of attention run on tensor cores? (tensor_cores' rule on
 * the step file's shapes) */
static int tc_instr(const DpStep *s, const DpInstr *in)
{
	const DpTensor *tq = &s->tensors[in->in[1]];
	int64_t heads = DP_ATTR(in, ATTENTION, heads), hd = tq->dims[2] / 3 / heads;
	int tf32 = tq->dtype == DP_F32 && s->cfg.gemm_math == DP_GEMM_TF32;
	return (tq->dtype == DP_BF16 || tf32) && (hd == 32 || hd == 64 || hd == 128);
}

/* Is forward instruction k the one gradient g differentiates: the same
 * qkv (and for cp the same gathered kv and positions)? */
static int attn_same_operands(const DpInstr *k, const DpInstr *g)
{
	int n = k->op == DP_OP_ATTENTION_CP ? 3 : 1;
	for (int i = 0; i < n; i++)
		if (k->in[i] != g->in[i + 1])
			return 0;
	return 1;
}

/*
 * For each attention gradient on tensor cores (attention_grad,
 * attention_cp_grad, attention_cp_grad_kv), the latest forward before it in
 * the same program on the same operands (qkv; cp: and kv and pos), on the
 * same stream (stream order makes lse visible), run under the same
 * condition (both or neither DP_IF_LAST), with no instruction between them
 * writing those operands or the forward's output O: the forward writes each
 * row's lse into a buffer of the plan, and the gradient reads it and
 * computes D from O, instead of running the forward again (2 of its 7 T^2
 * hd units; cp's two gradients share one forward's lse). A recomputed
 * forward is the latest, so it is the one paired.
 */
extern "C" int cu_plan_attn(CuPlan *p, RtErr *e)
{
	const DpStep *s = p->s;
	if (cu_attn_dq_split() < 0)
		return RT_FAIL(e, "DP_ATTN_DQ=%s: the attention backward's dQ is 'runs' (the default) or "
			       "'split' (docs/CUDA.md)", getenv("DP_ATTN_DQ"));
	if (cu_attn_bwd_pipe() < 0)
		return RT_FAIL(e, "DP_ATTN_BWD=%s: the attention backward is 'sync2' (the default) or "
			       "'pipe' (docs/CUDA.md)", getenv("DP_ATTN_BWD"));
	for (int pg = 0; pg < DP_NPROG; pg++)
		for (uint32_t j = 0; j < s->nprog[pg]; j++) {
			const DpInstr *g = &s->prog[pg][j];
			int fop = attn_forward_of(g->op);
			if (fop < 0 || !tc_instr(s, g))
				continue;
			int nops = fop == DP_OP_ATTENTION_CP ? 3 : 1; /* operands after dy */
			const DpTensor *tq = &s->tensors[g->in[1]];
			uint32_t i = j;
			while (i-- > 0) {
				const DpInstr *k = &s->prog[pg][i];
				int w = 0;
				for (int o = 1; o <= nops; o++)
					w |= cu_writes(s, k, &s->tensors[g->in[o]]);
				if ((k->op == fop && attn_same_operands(k, g)) || w)
					break;
			}
			if (i == UINT32_MAX || s->prog[pg][i].op != fop ||
			    !attn_same_operands(&s->prog[pg][i], g))
				continue; /* none, or an operand written since */
			const DpInstr *k = &s->prog[pg][i];
			const DpTensor *to = &s->tensors[k->out];
			if (k->stream != g->stream || (k->flags & DP_IF_LAST) != (g->flags & DP_IF_LAST))
				continue;
			uint32_t m = i + 1;
			while (m < j && !cu_writes(s, &s->prog[pg][m], to))
				m++;
			if (m < j)
				continue; /* O overwritten before the gradient */
			CuFuse *f = &p->fuse[pg][i];
			if (!f->lse) {
				f->lse = (float *)p->alloc(p, (size_t)(tq->dims[0] * DP_ATTR(k, ATTENTION, heads) *
							    tq->dims[1]) * sizeof(float));
				if (!f->lse)
					return RT_FAIL(e, "out of device memory (attention row statistics of "
						       "'%s')", dpstep_str(s, tq->name));
			}
			p->fuse[pg][j].lse = f->lse;
			p->fuse[pg][j].lse_o = p->ptr[k->out];
		}
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h;
 * f16 0: an fp16 attention runs on f32 copies (bf16.cu's staging: the
 * tensor-core kernels' mma.sync has no f16 variant here) */
extern "C" const KernelRow cu_attention_rows[] = {
	{DP_OP_ATTENTION, run_attention, limit_attention, 1, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION_GRAD, run_attention, limit_attention, 1, NULL, scratch_attention, 0, 0},
	{DP_OP_ATTENTION_CP, run_attention, limit_attention, 1, NULL, NULL, 0, 0},
	{DP_OP_ATTENTION_CP_GRAD, run_attention, limit_attention, 1, NULL, scratch_attention, 0, 0},
	{DP_OP_ATTENTION_CP_GRAD_KV, run_attention, limit_attention, 1, NULL, scratch_attention, 0, 0},
	{DP_OP_ATTENTION_CP_GRAD_BOTH, run_attention, limit_attention, 1, NULL, scratch_attention, 0, 0},
	{},
};
