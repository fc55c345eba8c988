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
 *   k_attn_fwd_tc<HD> the forward of bf16 ordinary attention with head dim
 *                    HD = 32, 64 or 128 on tensor cores (WMMA, FlashAttention-2's
 *                    structure; its own comment below); k_attn_fwd does the rest.
 *                    Paired with its gradient (cu_plan_attn, at the end) it
 *                    leaves each row's lse for it; else the backward runs it
 *                    again for each row's lse and D.
 *   k_attn_bwd_dq_tc<HD>, k_attn_bwd_dkv_tc<HD> the backward of the same
 *                    attention on tensor cores from those (FlashAttention-2's
 *                    dQ pass and dK/dV pass; their comment below);
 *                    k_attn_bwd_q/kv do the rest.
 * Every output element is written by one thread with a fixed loop order: no
 * atomics, deterministic, graph == eager.
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
#include <mma.h>

#include "device.cuh"

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

/* The sum over a row's 4 threads (lanes 4i..4i+3 of a warp). */
static __device__ __forceinline__ float row_sum(float v)
{
	v += __shfl_xor_sync(CU_FULL_MASK, v, 1);
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

/* ---- forward on tensor cores (bf16, head dims 32, 64, 128) ----
 *
 * FlashAttention-2's forward on WMMA (m16n16k16, bf16 operands, f32
 * accumulators): a block owns BR = 16 W query rows, warp w the 16 from
 * q0 + 16 w; the keys go by in tiles of BC = 32 through shared memory. Per
 * tile and warp: S = Q K^T (BC/16 accumulators over HD/16 k-steps, Q's
 * fragments kept from the start), stored to the warp's rows of S; the
 * lanes (two per row, 16 columns each) take the online softmax: the tile's
 * max, p = exp(scale s - m') rounded to bf16 into P (l sums the rounded p,
 * so O / l weighs V by exactly the P the mma used), O's row rescaled by
 * exp(m - m'); then O += P V (HD/16 accumulators loaded from the warp's
 * rows of O, BC/16 k-steps, stored back). O stays in shared memory in f32:
 * WMMA's fragment layout is unspecified, so a row's rescale cannot be done
 * on a fragment. Causal: the block stops at the tile of its last row, and
 * a warp skips the tiles wholly above its own rows. out = O / l, rounded
 * once.
 *
 * Shared memory (dynamic, < 48 KB): Q (bf16, then the O rows in f32 in the
 * same place once every warp holds its Q fragments), K, V, P, S; rows are
 * padded (8 bf16, 4 floats) against bank conflicts, and every tile a
 * fragment reads starts 32-byte aligned as WMMA requires (16 padded rows
 * are a multiple of 32 bytes). Dynamic rather than static __shared__: the
 * emulator fills the dynamic region with NaNs before every block, and
 * cannot reach a template kernel's static __shared__ arrays (g++ puts those
 * in COMDAT sections: docs/CUDA-EMU.md), so a missing barrier here reads
 * NaNs on the emulator. */
#define TC_BC 32 /* keys per tile */

template <int HD> struct TcShape {
	static const int W = HD == 128 ? 2 : 4; /* warps: 128's f32 O rows need the room */
	static const int BR = 16 * W;            /* query rows per block */
	static const int QLD = HD + 8;           /* Q, K, V rows (bf16) */
	static const int OLD = HD + 4;           /* O rows (f32) */
	static const int SLD = TC_BC + 4;        /* S rows (f32) */
	static const int PLD = TC_BC + 8;        /* P rows (bf16) */
	static const int QO_BYTES = BR * OLD * 4 > BR * QLD * 2 ? BR * OLD * 4 : BR * QLD * 2;
	static const int KV_BYTES = TC_BC * QLD * 2, P_BYTES = BR * PLD * 2, S_BYTES = BR * SLD * 4;
	/* the regions of the block's shared memory, in this order */
	static const int SMEM = QO_BYTES + 2 * KV_BYTES + P_BYTES + S_BYTES;
	static_assert(QO_BYTES % 32 == 0 && KV_BYTES % 32 == 0 && P_BYTES % 32 == 0,
		      "every region starts 32-byte aligned (WMMA's mptr)");
	static_assert(SMEM <= 48 * 1024, "no opt-in to more than 48 KB of shared memory");
};

/* Rows [r0, r0 + n) of a [*, ld] source (row stride, elements) into a
 * padded shared tile of HD columns, bf16 bits copied; rows past `rows` and
 * columns past hd zero. vec8: eight at a time (128 bits). */
template <int HD>
static __device__ void tc_copy_rows(cu_bf16 *dst, int dld, const cu_bf16 *src, int64_t ld,
				    int64_t r0, int n, int64_t rows, int64_t hd, int vec8)
{
	int step = vec8 ? 8 : 1;
	for (int i = threadIdx.x; i < n * HD / step; i += blockDim.x) {
		int j = i / (HD / step), d = step * (i % (HD / step));
		int ok = r0 + j < rows && d < hd;
		const cu_bf16 *p = src + (r0 + j) * ld + d;
		cu_bf16 *q = dst + j * dld + d;
		if (vec8) {
			uint4 v = ok ? *(const uint4 *)p : make_uint4(0, 0, 0, 0);
			*(uint4 *)q = v;
		} else {
			*q = ok ? *p : (cu_bf16)0;
		}
	}
}

template <int HD>
__global__ void __launch_bounds__(32 * TcShape<HD>::W)
k_attn_fwd_tc(Geom<cu_bf16> g, cu_bf16 *out, float *lse, const cu_bf16 *dy, float *dd)
{
	using namespace nvcuda;
	typedef TcShape<HD> S;
	typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragA;
	typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragKt;
	typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragV;
	typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;
	extern __shared__ __align__(32) unsigned char tc_smem[];
	cu_bf16 *qs = (cu_bf16 *)tc_smem;
	float *os = (float *)tc_smem;
	cu_bf16 *ks = (cu_bf16 *)(tc_smem + S::QO_BYTES);
	cu_bf16 *vs = (cu_bf16 *)(tc_smem + S::QO_BYTES + S::KV_BYTES);
	cu_bf16 *ps = (cu_bf16 *)(tc_smem + S::QO_BYTES + 2 * S::KV_BYTES);
	float *ss = (float *)(tc_smem + S::QO_BYTES + 2 * S::KV_BYTES + S::P_BYTES);
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	int64_t nqt = (g.t + S::BR - 1) / S::BR, bi = blockIdx.x;
	int64_t qt = bi % nqt, h = (bi / nqt) % g.h, b = bi / (nqt * g.h), q0 = qt * S::BR;
	const cu_bf16 *base = g.qkv + b * g.t * 3 * g.c + 3 * g.hd * h;
	const int64_t ld = 3 * g.c;

	tc_copy_rows<HD>(qs, S::QLD, base, ld, q0, S::BR, g.t, g.hd, g.vec8);
	__syncthreads();
	FragA qa[HD / 16];
CU_UNROLL
	for (int k = 0; k < HD / 16; k++)
		wmma::load_matrix_sync(qa[k], (const __nv_bfloat16 *)qs + 16 * warp * S::QLD + 16 * k,
				       S::QLD);
	__syncthreads(); /* every warp holds its Q: the room is O's now */

	/* lane: row r of the warp's 16, columns [16 half, 16 half + 16) of a
	 * tile, dims [HD/2 half, HD/2 half + HD/2) of O */
	const int r = lane / 2, half = lane % 2;
	const int64_t t = q0 + 16 * warp + r;       /* this lane's query row */
	const int64_t wlast = q0 + 16 * warp + 15;  /* the warp's last row */
	float *orow = os + (16 * warp + r) * S::OLD;
	for (int d = HD / 2 * half; d < HD / 2 * (half + 1); d++)
		orow[d] = 0;
	float m = -INFINITY, l = 0;
	int64_t last = q0 + S::BR - 1 < g.t - 1 ? q0 + S::BR - 1 : g.t - 1; /* causal */
	for (int64_t k0 = 0; k0 <= last; k0 += TC_BC) {
		__syncthreads(); /* the previous K and V are consumed */
		tc_copy_rows<HD>(ks, S::QLD, base + g.hd, ld, k0, TC_BC, g.t, g.hd, g.vec8);
		tc_copy_rows<HD>(vs, S::QLD, base + 2 * g.hd, ld, k0, TC_BC, g.t, g.hd, g.vec8);
		__syncthreads(); /* K and V are in */
		if (k0 > wlast)
			continue; /* the tile is above the warp's diagonal (warp-uniform) */
		float *srow = ss + 16 * warp * S::SLD;
CU_UNROLL
		for (int n = 0; n < TC_BC / 16; n++) {
			FragC acc;
			wmma::fill_fragment(acc, 0.0f);
CU_UNROLL
			for (int k = 0; k < HD / 16; k++) {
				FragKt kb; /* K^T: column n of it is key row n */
				wmma::load_matrix_sync(kb, (const __nv_bfloat16 *)ks + 16 * n * S::QLD + 16 * k,
						       S::QLD);
				wmma::mma_sync(acc, qa[k], kb, acc);
			}
			wmma::store_matrix_sync(srow + 16 * n, acc, S::SLD, wmma::mem_row_major);
		}
		__syncwarp();
		/* the online softmax of row r over this tile's columns */
		const float *sr = srow + r * S::SLD + 16 * half;
		float sv[16], mt = -INFINITY;
CU_UNROLL
		for (int j = 0; j < 16; j++) {
			int64_t key = k0 + 16 * half + j;
			sv[j] = key <= t && key < g.t ? sr[j] * g.scale : -INFINITY;
			mt = sv[j] > mt ? sv[j] : mt;
		}
		float o_mt = __shfl_xor_sync(CU_FULL_MASK, mt, 1);
		mt = o_mt > mt ? o_mt : mt;
		float mn = mt > m ? mt : m;
		/* mn = -inf: nothing visible to the row yet (or a row past T) */
		float corr = mn == -INFINITY ? 1.0f : expf(m - mn), lt = 0;
		cu_bf16 *pr = ps + (16 * warp + r) * S::PLD + 16 * half;
CU_UNROLL
		for (int j = 0; j < 16; j++) {
			cu_bf16 pb = cu_to_bf16(mn == -INFINITY ? 0.0f : expf(sv[j] - mn));
			pr[j] = pb;
			lt += cu_from_bf16(pb);
		}
		lt += __shfl_xor_sync(CU_FULL_MASK, lt, 1);
		l = l * corr + lt;
		m = mn;
		for (int d = HD / 2 * half; d < HD / 2 * (half + 1); d++)
			orow[d] *= corr;
		__syncwarp(); /* P and the rescaled O rows are the warp's fragments' */
CU_UNROLL
		for (int n = 0; n < HD / 16; n++) {
			FragC acc;
			float *on = os + 16 * warp * S::OLD + 16 * n;
			wmma::load_matrix_sync(acc, on, S::OLD, wmma::mem_row_major);
CU_UNROLL
			for (int k = 0; k < TC_BC / 16; k++) {
				FragA pa;
				FragV vb;
				wmma::load_matrix_sync(pa, (const __nv_bfloat16 *)ps + 16 * warp * S::PLD + 16 * k,
						       S::PLD);
				wmma::load_matrix_sync(vb, (const __nv_bfloat16 *)vs + 16 * k * S::QLD + 16 * n,
						       S::QLD);
				wmma::mma_sync(acc, pa, vb, acc);
			}
			wmma::store_matrix_sync(on, acc, S::OLD, wmma::mem_row_major);
		}
		__syncwarp(); /* O's rows back before the lanes rescale them */
	}
	float inv = 1.0f / l;
	int64_t row = (b * g.h + h) * g.t + t; /* the row's (lse, D) */
	if (dd) { /* D = dO . O, O in f32 (the lanes of the row: one half each) */
		float dsum = 0;
		if (t < g.t) {
			const cu_bf16 *dr = dy + (b * g.t + t) * g.c + g.hd * h;
			for (int d = HD / 2 * half; d < HD / 2 * (half + 1); d++)
				if (d < g.hd)
					dsum += cu_from_bf16(dr[d]) * (orow[d] * inv);
		}
		dsum += __shfl_xor_sync(CU_FULL_MASK, dsum, 1);
		if (t < g.t && half == 0)
			dd[row] = dsum;
	}
	if (t >= g.t)
		return;
	if (lse && half == 0)
		lse[row] = m + logf(l);
	if (!out)
		return;
	cu_bf16 *dst = out + (b * g.t + t) * g.c + g.hd * h;
	for (int d = HD / 2 * half; d < HD / 2 * (half + 1); d++)
		if (d < g.hd)
			st(dst + d, orow[d] * inv);
}

/* ---- backward on tensor cores (bf16, head dims 32, 64, 128) ----
 *
 * FlashAttention-2's backward on WMMA, from the row statistics lse = m +
 * log l and D = dO . O (per query row, f32: lse from the forward that
 * cu_plan_attn paired with the gradient and D by k_attn_rowdot from its
 * output O, else both from k_attn_fwd_tc run again), so P = exp(scale s -
 * lse) needs no softmax pass. Two kernels, each writing
 * its outputs once (no atomics: deterministic, graph == eager):
 *   k_attn_bwd_dq_tc   a block per 16 W query rows, over the key tiles up
 *                      to its last row: S = Q K^T, dP = dO V^T (Q's and
 *                      dO's fragments kept), dS = P (dP - D) rounded to
 *                      bf16, dQ += dS K in f32 accumulator fragments;
 *                      dQ = scale dQ into d qkv's q columns.
 *   k_attn_bwd_dkv_tc  a block per 16 W key rows, over the query tiles
 *                      from its first key's: S^T = K Q^T, P^T rounded to
 *                      bf16, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T
 *                      - D), dK += dS^T Q (K's and V's fragments kept, dK
 *                      and dV in accumulator fragments); dK = scale dK and
 *                      dV into the k and v columns.
 * dQ in a kernel of its own rather than by f32 atomics from the key-major
 * kernel: atomics would save S and dP's recomputation (2 of the 7 T^2 hd
 * units) but make the sum's order, and so the bits, change from run to
 * run. The accumulators need no row rescale (unlike the forward's O), so
 * they stay fragments; the element-wise products of P and dS are done by
 * the lanes on S and dP stored to the warp's rows of shared memory (two
 * lanes per row, 16 columns each), as in the forward. Causal: the dQ block
 * stops at its last row's key tile and a warp skips tiles above its rows;
 * the dK/dV block starts at its first key's query tile and a warp skips
 * query tiles wholly before its keys.
 *
 * Shared memory (dynamic, < 48 KB, NaN-filled on the emulator): the block's
 * own rows (Q and dO, or K and V: bf16, loaded into fragments, then the
 * room of the f32 result rows), the other side's tiles of TC_BC rows, the
 * tile's (lse, D), S (f32, then dP), P (bf16, then dS). */
template <int HD> struct TcBwdShape {
	static const int W = HD == 128 ? 2 : 4;
	static const int BR = 16 * W;  /* the block's rows (queries or keys) */
	static const int QLD = HD + 8; /* bf16 rows */
	static const int OLD = HD + 4; /* f32 result rows */
	static const int SLD = TC_BC + 4, PLD = TC_BC + 8;
	static const int OWN_BYTES = 2 * BR * QLD * 2 > BR * OLD * 4 ? 2 * BR * QLD * 2 : BR * OLD * 4;
	static const int TILE_BYTES = TC_BC * QLD * 2, STAT_BYTES = 2 * TC_BC * 4;
	static const int S_BYTES = BR * SLD * 4, P_BYTES = BR * PLD * 2;
	static const int SMEM = OWN_BYTES + 2 * TILE_BYTES + STAT_BYTES + S_BYTES + P_BYTES;
	static_assert(OWN_BYTES % 32 == 0 && TILE_BYTES % 32 == 0 && STAT_BYTES % 32 == 0 &&
		      S_BYTES % 32 == 0 && (BR * QLD * 2) % 32 == 0,
		      "every region starts 32-byte aligned (WMMA's mptr)");
	static_assert(SMEM <= 48 * 1024, "no opt-in to more than 48 KB of shared memory");
};

/* The backward's operand (row_major) and accumulator fragments. */
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
			       nvcuda::wmma::row_major>
	TcFragA;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> TcFragC;

/* The regions of TcBwdShape, in order. */
template <int HD> struct TcBwdSmem {
	cu_bf16 *own0, *own1, *tile0, *tile1, *p;
	float *res, *stat, *s;
	__device__ explicit TcBwdSmem(unsigned char *m)
	{
		typedef TcBwdShape<HD> S;
		own0 = (cu_bf16 *)m;
		own1 = own0 + S::BR * S::QLD;
		res = (float *)m;
		tile0 = (cu_bf16 *)(m + S::OWN_BYTES);
		tile1 = (cu_bf16 *)(m + S::OWN_BYTES + S::TILE_BYTES);
		stat = (float *)(m + S::OWN_BYTES + 2 * S::TILE_BYTES);
		s = (float *)(m + S::OWN_BYTES + 2 * S::TILE_BYTES + S::STAT_BYTES);
		p = (cu_bf16 *)(m + S::OWN_BYTES + 2 * S::TILE_BYTES + S::STAT_BYTES + S::S_BYTES);
	}
};

/* acc[n] (n < N) = the warp's 16 rows of A (fragments a) times the
 * transpose of the 16 N rows of a shared tile (row stride ld): column n of
 * the product is row n of the tile; stored to dst (row stride SLD). */
template <int HD, int N, class FragA>
static __device__ void tc_times_rows_t(float *dst, const FragA *a, const cu_bf16 *tile, int ld)
{
	using namespace nvcuda;
	typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragT;
CU_UNROLL
	for (int n = 0; n < N / 16; n++) {
		wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
		wmma::fill_fragment(acc, 0.0f);
CU_UNROLL
		for (int k = 0; k < HD / 16; k++) {
			FragT tb;
			wmma::load_matrix_sync(tb, (const __nv_bfloat16 *)tile + 16 * n * ld + 16 * k, ld);
			wmma::mma_sync(acc, a[k], tb, acc);
		}
		wmma::store_matrix_sync(dst + 16 * n, acc, TcBwdShape<HD>::SLD, wmma::mem_row_major);
	}
}

/* acc[n] += the warp's 16 rows of P (bf16, row stride PLD, TC_BC columns)
 * times a shared tile of TC_BC rows (row stride ld), n < HD/16. */
template <int HD, class FragC>
static __device__ void tc_accumulate(FragC *acc, const cu_bf16 *p, const cu_bf16 *tile, int ld)
{
	using namespace nvcuda;
	typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragA;
	typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragB;
CU_UNROLL
	for (int n = 0; n < HD / 16; n++)
CU_UNROLL
		for (int k = 0; k < TC_BC / 16; k++) {
			FragA pa;
			FragB tb;
			wmma::load_matrix_sync(pa, (const __nv_bfloat16 *)p + 16 * k, TcBwdShape<HD>::PLD);
			wmma::load_matrix_sync(tb, (const __nv_bfloat16 *)tile + 16 * k * ld + 16 * n, ld);
			wmma::mma_sync(acc[n], pa, tb, acc[n]);
		}
}

/* The warp's 16 result rows: acc * scale through the f32 rows at res (the
 * warp's own), then row r's dims of this lane's half, rounded, to dst (NULL:
 * a row past T). */
template <int HD, class FragC>
static __device__ void tc_write_rows(FragC *acc, float scale, float *res, int r, int half,
				     cu_bf16 *dst, int64_t hd)
{
	using namespace nvcuda;
	typedef TcBwdShape<HD> S;
CU_UNROLL
	for (int n = 0; n < HD / 16; n++) {
CU_UNROLL
		for (int e = 0; e < acc[n].num_elements; e++)
			acc[n].x[e] *= scale;
		wmma::store_matrix_sync(res + 16 * n, acc[n], S::OLD, wmma::mem_row_major);
	}
	__syncwarp();
	if (dst)
		for (int d = HD / 2 * half; d < HD / 2 * (half + 1); d++)
			if (d < hd)
				st(dst + d, res[r * S::OLD + d]);
	__syncwarp(); /* the rows are read before the next result's store */
}

/* The block's sequence and head, and its first row (of 16 W) in
 * blockIdx.x = ((b * H) + h) * tiles + tile. */
template <int HD>
static __device__ void tc_block(const Geom<cu_bf16> &g, int64_t *b, int64_t *h, int64_t *r0)
{
	const int64_t tiles = (g.t + TcBwdShape<HD>::BR - 1) / TcBwdShape<HD>::BR, bi = blockIdx.x;
	*r0 = bi % tiles * TcBwdShape<HD>::BR;
	*h = bi / tiles % g.h;
	*b = bi / (tiles * g.h);
}

/* The block's own rows [r0, r0 + BR) of two [*, ld] sources (Q and dO, or
 * K and V) through shared memory into the warp's fragments a0 and a1 (its
 * 16 rows each); after it the room is the result rows'. */
template <int HD, class FragA>
static __device__ void tc_load_own(const TcBwdSmem<HD> &m, const Geom<cu_bf16> &g, int64_t r0,
				   const cu_bf16 *s0, int64_t ld0, FragA *a0, const cu_bf16 *s1,
				   int64_t ld1, FragA *a1)
{
	using namespace nvcuda;
	typedef TcBwdShape<HD> S;
	const int warp = threadIdx.x / 32;
	tc_copy_rows<HD>(m.own0, S::QLD, s0, ld0, r0, S::BR, g.t, g.hd, g.vec8);
	tc_copy_rows<HD>(m.own1, S::QLD, s1, ld1, r0, S::BR, g.t, g.hd, g.vec8);
	__syncthreads();
CU_UNROLL
	for (int k = 0; k < HD / 16; k++) {
		wmma::load_matrix_sync(a0[k], (const __nv_bfloat16 *)m.own0 + 16 * warp * S::QLD + 16 * k,
				       S::QLD);
		wmma::load_matrix_sync(a1[k], (const __nv_bfloat16 *)m.own1 + 16 * warp * S::QLD + 16 * k,
				       S::QLD);
	}
	__syncthreads(); /* every warp holds its fragments: the room is the result rows' now */
}

template <int HD>
__global__ void __launch_bounds__(32 * TcBwdShape<HD>::W)
k_attn_bwd_dq_tc(Geom<cu_bf16> g, const cu_bf16 *dy, const float *lse, const float *dd,
		 cu_bf16 *dqkv)
{
	using namespace nvcuda;
	typedef TcBwdShape<HD> S;
	extern __shared__ __align__(32) unsigned char tc_smem[];
	TcBwdSmem<HD> m(tc_smem); /* own: Q, dO; tiles: K, V */
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	int64_t b, h, q0;
	tc_block<HD>(g, &b, &h, &q0);
	const cu_bf16 *base = g.qkv + b * g.t * 3 * g.c + 3 * g.hd * h;
	const int64_t ld = 3 * g.c;
	TcFragA qa[HD / 16], da[HD / 16];
	tc_load_own<HD>(m, g, q0, base, ld, qa, dy + b * g.t * g.c + g.hd * h, g.c, da);
	TcFragC dq[HD / 16];
CU_UNROLL
	for (int n = 0; n < HD / 16; n++)
		wmma::fill_fragment(dq[n], 0.0f);
	const int r = lane / 2, half = lane % 2;
	const int64_t t = q0 + 16 * warp + r, wlast = q0 + 16 * warp + 15;
	const int64_t row = (b * g.h + h) * g.t + t;
	const float lr = t < g.t ? lse[row] : 0, dr = t < g.t ? dd[row] : 0;
	float *srow = m.s + 16 * warp * S::SLD;
	cu_bf16 *prow = m.p + 16 * warp * S::PLD;
	int64_t last = q0 + S::BR - 1 < g.t - 1 ? q0 + S::BR - 1 : g.t - 1; /* causal */
	for (int64_t k0 = 0; k0 <= last; k0 += TC_BC) {
		__syncthreads(); /* the previous K and V are consumed */
		tc_copy_rows<HD>(m.tile0, S::QLD, base + g.hd, ld, k0, TC_BC, g.t, g.hd, g.vec8);
		tc_copy_rows<HD>(m.tile1, S::QLD, base + 2 * g.hd, ld, k0, TC_BC, g.t, g.hd, g.vec8);
		__syncthreads(); /* the key tile is in */
		if (k0 > wlast)
			continue; /* the tile is above the warp's diagonal (warp-uniform) */
		tc_times_rows_t<HD, TC_BC>(srow, qa, m.tile0, S::QLD); /* S = Q K^T */
		__syncwarp();
		float p[16];
		const float *sr = srow + r * S::SLD + 16 * half;
CU_UNROLL
		for (int j = 0; j < 16; j++) {
			int64_t key = k0 + 16 * half + j;
			p[j] = key <= t && t < g.t ? expf(sr[j] * g.scale - lr) : 0.0f;
		}
		__syncwarp(); /* S is read: its rows are dP's */
		tc_times_rows_t<HD, TC_BC>(srow, da, m.tile1, S::QLD); /* dP = dO V^T */
		__syncwarp();
CU_UNROLL
		for (int j = 0; j < 16; j++)
			prow[r * S::PLD + 16 * half + j] = cu_to_bf16(p[j] * (sr[j] - dr));
		__syncwarp(); /* dS is the warp's fragments' */
		tc_accumulate<HD>(dq, prow, m.tile0, S::QLD); /* dQ += dS K */
	}
	tc_write_rows<HD>(dq, g.scale, m.res + 16 * warp * S::OLD, r, half,
			  t < g.t ? dqkv + (b * g.t + t) * ld + 3 * g.hd * h : (cu_bf16 *)0, g.hd);
}

template <int HD>
__global__ void __launch_bounds__(32 * TcBwdShape<HD>::W)
k_attn_bwd_dkv_tc(Geom<cu_bf16> g, const cu_bf16 *dy, const float *lse, const float *dd,
		  cu_bf16 *dqkv)
{
	using namespace nvcuda;
	typedef TcBwdShape<HD> S;
	extern __shared__ __align__(32) unsigned char tc_smem[];
	TcBwdSmem<HD> m(tc_smem); /* own: K, V; tiles: Q, dO */
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	int64_t b, h, k0;
	tc_block<HD>(g, &b, &h, &k0);
	const cu_bf16 *base = g.qkv + b * g.t * 3 * g.c + 3 * g.hd * h;
	const cu_bf16 *dbase = dy + b * g.t * g.c + g.hd * h;
	const int64_t ld = 3 * g.c;
	TcFragA ka[HD / 16], va[HD / 16];
	tc_load_own<HD>(m, g, k0, base + g.hd, ld, ka, base + 2 * g.hd, ld, va);
	TcFragC dk[HD / 16], dv[HD / 16];
CU_UNROLL
	for (int n = 0; n < HD / 16; n++) {
		wmma::fill_fragment(dk[n], 0.0f);
		wmma::fill_fragment(dv[n], 0.0f);
	}
	const int r = lane / 2, half = lane % 2;
	const int64_t key = k0 + 16 * warp + r, wfirst = k0 + 16 * warp;
	const float *ls = (const float *)m.stat, *ds = (const float *)m.stat + TC_BC;
	float *srow = m.s + 16 * warp * S::SLD;
	cu_bf16 *prow = m.p + 16 * warp * S::PLD;
	for (int64_t q0 = k0 - k0 % TC_BC; q0 < g.t; q0 += TC_BC) { /* causal */
		__syncthreads(); /* the previous Q, dO and statistics are consumed */
		tc_copy_rows<HD>(m.tile0, S::QLD, base, ld, q0, TC_BC, g.t, g.hd, g.vec8);
		tc_copy_rows<HD>(m.tile1, S::QLD, dbase, g.c, q0, TC_BC, g.t, g.hd, g.vec8);
		for (int i = threadIdx.x; i < TC_BC; i += blockDim.x) {
			int64_t row = (b * g.h + h) * g.t + q0 + i;
			m.stat[i] = q0 + i < g.t ? lse[row] : 0;
			m.stat[TC_BC + i] = q0 + i < g.t ? dd[row] : 0;
		}
		__syncthreads(); /* Q, dO and the statistics are in */
		if (q0 + TC_BC - 1 < wfirst)
			continue; /* every query is before the warp's keys (warp-uniform) */
		tc_times_rows_t<HD, TC_BC>(srow, ka, m.tile0, S::QLD); /* S^T = K Q^T */
		__syncwarp();
		float p[16];
		const float *sr = srow + r * S::SLD + 16 * half;
CU_UNROLL
		for (int j = 0; j < 16; j++) {
			int c = 16 * half + j;
			int64_t q = q0 + c;
			p[j] = q >= key && q < g.t && key < g.t ? expf(sr[j] * g.scale - ls[c]) : 0.0f;
			prow[r * S::PLD + c] = cu_to_bf16(p[j]);
		}
		__syncwarp(); /* S is read, P^T is the warp's fragments' */
		tc_accumulate<HD>(dv, prow, m.tile1, S::QLD); /* dV += P^T dO */
		tc_times_rows_t<HD, TC_BC>(srow, va, m.tile1, S::QLD); /* dP^T = V dO^T */
		__syncwarp(); /* dP^T is in, P^T is read */
CU_UNROLL
		for (int j = 0; j < 16; j++) {
			int c = 16 * half + j;
			prow[r * S::PLD + c] = cu_to_bf16(p[j] * (sr[j] - ds[c]));
		}
		__syncwarp(); /* dS^T is the warp's fragments' */
		tc_accumulate<HD>(dk, prow, m.tile0, S::QLD); /* dK += dS^T Q */
	}
	float *res = m.res + 16 * warp * S::OLD;
	cu_bf16 *dst = key < g.t ? dqkv + (b * g.t + key) * ld + 3 * g.hd * h : (cu_bf16 *)0;
	tc_write_rows<HD>(dk, g.scale, res, r, half, dst ? dst + g.hd : dst, g.hd);
	tc_write_rows<HD>(dv, 1.0f, res, r, half, dst ? dst + 2 * g.hd : dst, g.hd);
}

/* ---- the cp positions: the zigzag layout the kernels assume ---- */

__global__ void k_cp_check(const int32_t *pos, int64_t t, int64_t tg, CuScalars *sc)
{
	int64_t l = t / 2;
	CU_FOR_EACH(j, t) {
		int64_t first = j < l ? 0 : l;
		int64_t p = pos[j];
		if (p < 0 || p >= tg || p != (int64_t)pos[first] + j - first)
			cu_report_error(sc, CU_ERR_POSITION, p, j, tg);
	}
}

/* ---- launchers ---- */

static int head_dim_class(int64_t hd)
{
	return hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : hd <= 256 ? 256 : 0;
}

/* The operands of any of the five ops. */
template <typename T> static Geom<T> geom_of(const CuArgs *a)
{
	const DpInstr *in = a->in;
	int cp = in->op == DP_OP_ATTENTION_CP || in->op == DP_OP_ATTENTION_CP_GRAD ||
		 in->op == DP_OP_ATTENTION_CP_GRAD_KV;
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
	g.vec8 = cu_vec8<T>(g.hd, g.qkv, g.kv, q ? cu_p(a, 0) : (const void *)0);
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

/* (m, inv, D) per (batch, head, query row); the tensor-core backward: (lse, D) */
static size_t scratch_attention(const DpStep *s, const DpInstr *in)
{
	if (in->op == DP_OP_ATTENTION || in->op == DP_OP_ATTENTION_CP)
		return 0;
	const DpTensor *tq = &s->tensors[in->in[1]];
	return (size_t)(3 * tq->dims[0] * DP_ATTR(in, ATTENTION, heads) * tq->dims[1]) * sizeof(float);
}

/* The forward and the backward run on tensor cores for bf16 ordinary
 * attention with a head dim of 32, 64 or 128 exactly (the rest, f32 and cp
 * among them, on the kernels above: docs/CUDA.md says why). */
template <int HD, typename T> static int tensor_cores(const DpInstr *in, const Geom<T> &g)
{
	return sizeof(T) == 2 && (in->op == DP_OP_ATTENTION || in->op == DP_OP_ATTENTION_GRAD) &&
	       g.hd == HD && (HD == 32 || HD == 64 || HD == 128);
}

template <int HD, typename T> static int launch_fwd_tc(const CuArgs *a, const Geom<T> &g, RtErr *e)
{
	if constexpr (sizeof(T) == 2 && HD >= 32 && HD <= 128) {
		typedef TcShape<HD> S;
		unsigned blocks = (unsigned)(g.b * g.h * ((g.t + S::BR - 1) / S::BR));
		CU_LAUNCH_SMEM((k_attn_fwd_tc<HD>), blocks, 32 * S::W, (size_t)S::SMEM, a->st, g,
			       (cu_bf16 *)cu_p(a, -1), a->fuse->lse, (const cu_bf16 *)0, (float *)0);
		CU_LAUNCHED(a, e);
	}
	return 0;
}

/* D = dO . O per (batch, head, query row) from the forward's output: a
 * warp per row (its head dims in one coalesced read), summed by xor
 * shuffles. */
__global__ void k_attn_rowdot(Geom<cu_bf16> g, const cu_bf16 *dy, const cu_bf16 *o, float *dd)
{
	const int lane = threadIdx.x % 32;
	const int64_t rows = g.b * g.h * g.t, warps = (int64_t)gridDim.x * blockDim.x / 32;
	for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < rows; i += warps) {
		int64_t t = i % g.t, h = (i / g.t) % g.h, b = i / (g.t * g.h);
		const cu_bf16 *dr = dy + (b * g.t + t) * g.c + g.hd * h, *orow = o + (dr - dy);
		float sum = 0;
		for (int64_t d = lane; d < g.hd; d += 32)
			sum += cu_from_bf16(dr[d]) * cu_from_bf16(orow[d]);
		for (int k = 16; k > 0; k /= 2)
			sum += __shfl_xor_sync(CU_FULL_MASK, sum, k);
		if (lane == 0)
			dd[i] = sum;
	}
}

/* The backward: each query row's lse and D, then dQ, then dK and dV. lse
 * is the forward's and D = dO . O from its output when the planner paired
 * them (cu_plan_attn); else the forward runs again for both (into scratch,
 * O not written). */
template <int HD, typename T> static int launch_bwd_tc(const CuArgs *a, const Geom<T> &g, RtErr *e)
{
	if constexpr (sizeof(T) == 2 && HD >= 32 && HD <= 128) {
		typedef TcShape<HD> F;
		typedef TcBwdShape<HD> S;
		float *lse = (float *)a->scratch, *dd = lse + g.b * g.h * g.t;
		const cu_bf16 *dy = (const cu_bf16 *)cu_p(a, 0);
		cu_bf16 *dqkv = (cu_bf16 *)cu_p(a, -1);
		unsigned fblocks = (unsigned)(g.b * g.h * ((g.t + F::BR - 1) / F::BR));
		unsigned blocks = (unsigned)(g.b * g.h * ((g.t + S::BR - 1) / S::BR));
		if (a->fuse->lse_o) {
			lse = a->fuse->lse;
			CU_LAUNCH(k_attn_rowdot, cu_grid(32 * g.b * g.h * g.t), CU_THREADS, a->st, g, dy,
				  (const cu_bf16 *)a->fuse->lse_o, dd);
		} else {
			CU_LAUNCH_SMEM((k_attn_fwd_tc<HD>), fblocks, 32 * F::W, (size_t)F::SMEM, a->st,
				       g, (cu_bf16 *)0, lse, dy, dd);
		}
		CU_LAUNCHED(a, e);
		CU_LAUNCH_SMEM((k_attn_bwd_dq_tc<HD>), blocks, 32 * S::W, (size_t)S::SMEM, a->st, g, dy,
			       (const float *)lse, (const float *)dd, dqkv);
		CU_LAUNCHED(a, e);
		CU_LAUNCH_SMEM((k_attn_bwd_dkv_tc<HD>), blocks, 32 * S::W, (size_t)S::SMEM, a->st, g,
			       dy, (const float *)lse, (const float *)dd, dqkv);
		CU_LAUNCHED(a, e);
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
		if (tensor_cores<HD, T>(in, g))
			return launch_fwd_tc<HD>(a, g, e);
		CU_LAUNCH((k_attn_fwd<HD, T>), qblocks, ATT_THREADS, a->st, g, out);
		CU_LAUNCHED(a, e);
		return 0;
	case DP_OP_ATTENTION_GRAD:
		if (tensor_cores<HD, T>(in, g))
			return launch_bwd_tc<HD>(a, g, e);
		CU_LAUNCH((k_attn_bwd_q<HD, T>), qblocks, ATT_THREADS, a->st, g, dy, out, stats,
			  1, 0);
		CU_LAUNCHED(a, e);
		CU_LAUNCH((k_attn_bwd_kv<HD, T>), kblocks, ATT_THREADS, a->st, g, dy, stats,
			  out, 0);
		CU_LAUNCHED(a, e);
		return 0;
	case DP_OP_ATTENTION_CP_GRAD:
		CU_LAUNCH((k_attn_bwd_q<HD, T>), qblocks, ATT_THREADS, a->st, g, dy, out, stats,
			  1, 1);
		CU_LAUNCHED(a, e);
		return 0;
	default: /* DP_OP_ATTENTION_CP_GRAD_KV */
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

/* Does attention (or attention_grad) instruction in run on tensor cores?
 * (tensor_cores' rule on the step file's shapes) */
static int tc_instr(const DpStep *s, const DpInstr *in)
{
	const DpTensor *tq = &s->tensors[in->in[in->op == DP_OP_ATTENTION ? 0 : 1]];
	int64_t heads = DP_ATTR(in, ATTENTION, heads), hd = tq->dims[2] / 3 / heads;
	return tq->dtype == DP_BF16 && (hd == 32 || hd == 64 || hd == 128);
}

/*
 * For each attention_grad on tensor cores, the latest attention before it
 * in the same program on the same qkv, on the same stream (stream order
 * makes lse visible), run under the same condition (both or neither
 * DP_IF_LAST), with no instruction between them writing qkv or the
 * forward's output O: the forward writes each row's lse into a buffer of
 * the plan, and the gradient reads it and computes D from O, instead of
 * running the forward again (2 of its 9 T^2 hd units). A recomputed
 * forward is the latest, so it is the one paired.
 */
extern "C" int cu_plan_attn(CuPlan *p, RtErr *e)
{
	const DpStep *s = p->s;
	for (int pg = 0; pg < DP_NPROG; pg++)
		for (uint32_t j = 0; j < s->nprog[pg]; j++) {
			const DpInstr *g = &s->prog[pg][j];
			if (g->op != DP_OP_ATTENTION_GRAD || !tc_instr(s, g))
				continue;
			const DpTensor *tq = &s->tensors[g->in[1]];
			uint32_t i = j;
			while (i-- > 0) {
				const DpInstr *k = &s->prog[pg][i];
				if ((k->op == DP_OP_ATTENTION && k->in[0] == g->in[1]) || cu_writes(s, k, tq))
					break;
			}
			if (i == UINT32_MAX || s->prog[pg][i].op != DP_OP_ATTENTION)
				continue; /* none, or qkv written since */
			const DpInstr *k = &s->prog[pg][i];
			const DpTensor *to = &s->tensors[k->out];
			if (k->in[0] != g->in[1] || k->stream != g->stream ||
			    (k->flags & DP_IF_LAST) != (g->flags & DP_IF_LAST))
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

/* {op, run, limits, bf16, run_bf16, scratch, blas}: kernel_table.h */
extern "C" const KernelRow cu_attention_rows[] = {
	{DP_OP_ATTENTION, run_attention, limit_attention, 1, NULL, NULL, 0},
	{DP_OP_ATTENTION_GRAD, run_attention, limit_attention, 1, NULL, scratch_attention, 0},
	{DP_OP_ATTENTION_CP, run_attention, limit_attention, 1, NULL, NULL, 0},
	{DP_OP_ATTENTION_CP_GRAD, run_attention, limit_attention, 1, NULL, scratch_attention, 0},
	{DP_OP_ATTENTION_CP_GRAD_KV, run_attention, limit_attention, 1, NULL, scratch_attention, 0},
	{},
};
