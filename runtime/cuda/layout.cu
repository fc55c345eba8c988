/*
 * layout.cu - CUDA kernels that set or move memory without arithmetic (the
 * CPU's runtime/cpu/layout.c and attention_cp.c's packing): nop, fill, copy,
 * reshape, tp_copy, transpose, split and its gradient, interleave, the
 * embedding gather and its gradient, kv_pack / kv_unpack; and two kernels of
 * the backend: the strided copy behind SHARD (cu_k_copy2d, no pitch limit)
 * and the graph's load of a staged batch (cu_k_load).
 *
 * Numerics: every op here except embedding_grad moves bits, so it equals the
 * CPU bitwise. embedding_grad sums, for each (token id, column), the
 * gradient rows of that id in ascending row order in float, starting from 0
 * (or from the output when accumulating): the CPU's exact sequence of
 * additions, so it is bitwise equal to the CPU too, and deterministic (no
 * atomics): the rows are first grouped by id with a stable counting sort.
 *
 * Token ids outside [0, V) are reported (CU_ERR_TOKEN, the CPU's error) and
 * read as nothing: the gather writes a zero row, the gradient skips them.
 *
 * bf16 (precision bf16): the ops that move elements move 2-byte elements
 * (rows_copy_bytes picks the widest word, up to one 128-bit access, that
 * the addresses, pitches and widths allow; transpose tiles uint16_t): no
 * conversion, bitwise. fill rounds its value once; embedding_grad sums in
 * float from the widened gradients (and the widened output when
 * accumulating), one rounding per stored element (its output may be f32):
 * what the f32 kernels on staged copies gave. f16 (precision fp16) the
 * same: 2-byte moves, fill and embedding_grad on __half.
 */
#include "device.cuh"

/* ---- strided rows: dst[r*dpitch + j] = src[r*spitch + j] (src NULL: 0) ---- */

/* A block per row (grid-stride over rows) when rows are wide, else a flat
 * walk over the elements. Elements of T. */
template <typename T>
__global__ void k_rows_wide(T *dst, int64_t dpitch, const T *src, int64_t spitch, int64_t width,
			    int64_t rows)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
		for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
			dst[r * dpitch + j] = src ? src[r * spitch + j] : T();
}

template <typename T>
__global__ void k_rows_flat(T *dst, int64_t dpitch, const T *src, int64_t spitch, int64_t width,
			    int64_t rows)
{
	CU_FOR_EACH(i, rows * width) {
		int64_t r = i / width, j = i - r * width;
		dst[r * dpitch + j] = src ? src[r * spitch + j] : T();
	}
}

template <typename T>
static cudaError_t rows_copy(cudaStream_t st, T *dst, int64_t dpitch, const T *src, int64_t spitch,
			     int64_t width, int64_t rows)
{
	if (width <= 0 || rows <= 0)
		return cudaSuccess;
	if (width >= 64)
		CU_LAUNCH(k_rows_wide<T>, (unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID),
			  width >= CU_THREADS ? CU_THREADS : 64, st, dst, dpitch, src, spitch, width,
			  rows);
	else
		CU_LAUNCH(k_rows_flat<T>, cu_grid(rows * width), CU_THREADS, st, dst, dpitch, src,
			  spitch, width, rows);
	return cudaGetLastError();
}

/* Rows of width bytes (src NULL: zeros) in the widest word, 16 (one 128-bit
 * access), 8, 4, 2 or 1 bytes, that divides both addresses, both pitches
 * and the width: a move of bits, the same in every dtype. */
static cudaError_t rows_copy_bytes(cudaStream_t st, void *dst, size_t dpitch, const void *src,
				   size_t spitch, size_t width, size_t rows)
{
	size_t m = (uintptr_t)dst | dpitch | width | (src ? (uintptr_t)src | spitch : 0);
	size_t w = m % 16 == 0 ? 16 : m % 8 == 0 ? 8 : m % 4 == 0 ? 4 : m % 2 == 0 ? 2 : 1;
	int64_t dp = (int64_t)(dpitch / w), sp = (int64_t)(spitch / w), n = (int64_t)(width / w);
	switch (w) {
	case 16:
		return rows_copy<uint4>(st, (uint4 *)dst, dp, (const uint4 *)src, sp, n, (int64_t)rows);
	case 8:
		return rows_copy<uint2>(st, (uint2 *)dst, dp, (const uint2 *)src, sp, n, (int64_t)rows);
	case 4:
		return rows_copy<uint32_t>(st, (uint32_t *)dst, dp, (const uint32_t *)src, sp, n,
					   (int64_t)rows);
	case 2:
		return rows_copy<uint16_t>(st, (uint16_t *)dst, dp, (const uint16_t *)src, sp, n,
					   (int64_t)rows);
	default:
		return rows_copy<unsigned char>(st, (unsigned char *)dst, dp,
						(const unsigned char *)src, sp, n, (int64_t)rows);
	}
}

extern "C" cudaError_t cu_k_copy2d(cudaStream_t st, void *dst, size_t dpitch, const void *src,
				   size_t spitch, size_t width, size_t rows)
{
	return rows_copy_bytes(st, dst, dpitch, src, spitch, width, rows);
}

/* The same in elements of es bytes. */
static cudaError_t rows_copy_elems(cudaStream_t st, void *dst, int64_t dpitch, const void *src,
				   int64_t spitch, int64_t width, int64_t rows, size_t es)
{
	if (width <= 0 || rows <= 0)
		return cudaSuccess;
	return rows_copy_bytes(st, dst, (size_t)dpitch * es, src, (size_t)spitch * es,
			       (size_t)width * es, (size_t)rows);
}

/* Element i of a tensor of es-byte elements at p. */
static inline void *elem_at(void *p, int64_t i, size_t es) { return (char *)p + i * (int64_t)es; }

/* ---- the graph's load: the staged copy of the step being run ---- */

template <typename T>
__global__ void k_load(T *dst, const T *src0, const T *src1, int64_t n, const CuScalars *sc)
{
	const T *src = (sc->step & 1) ? src1 : src0;
	CU_FOR_EACH(i, n)
		dst[i] = src[i];
}

extern "C" cudaError_t cu_k_load(cudaStream_t st, void *dst, const void *src0, const void *src1,
				 size_t bytes, const CuScalars *sc)
{
	if (!bytes)
		return cudaSuccess;
	if (((uintptr_t)dst | (uintptr_t)src0 | (uintptr_t)src1 | bytes) % 4 == 0)
		CU_LAUNCH(k_load<uint32_t>, cu_grid((int64_t)bytes / 4), CU_THREADS, st,
			  (uint32_t *)dst, (const uint32_t *)src0, (const uint32_t *)src1,
			  (int64_t)bytes / 4, sc);
	else
		CU_LAUNCH(k_load<unsigned char>, cu_grid((int64_t)bytes), CU_THREADS, st,
			  (unsigned char *)dst, (const unsigned char *)src0,
			  (const unsigned char *)src1, (int64_t)bytes, sc);
	return cudaGetLastError();
}

/* ---- nop, fill ---- */

static int run_nop(const CuArgs *a, RtErr *e)
{
	return 0;
}

template <typename T> __global__ void k_fill(T *o, int64_t n, T v)
{
	CU_FOR_EACH(i, n)
		o[i] = v;
}

/* bf16, f16 (T): v rounded once, as the f32 fill of a staged copy rounded back */
template <typename T> __global__ void k_fill_half(T *o, int64_t n, float v)
{
	CU_FOR_EACH(i, n)
		st(o + i, v);
}

static int run_fill(const CuArgs *a, RtErr *e)
{
	int64_t n = cu_numel(cu_t(a, -1));
	float v = DP_FATTR(a->in, FILL, value);
	if (n <= 0)
		return 0;
	if (cu_t(a, -1)->dtype == DP_I32)
		CU_LAUNCH(k_fill<int32_t>, cu_grid(n), CU_THREADS, a->st, (int32_t *)cu_p(a, -1), n,
			  (int32_t)v);
	else if (v == 0)
		CU_OK(a, cudaMemsetAsync(cu_p(a, -1), 0, (size_t)n * dp_dtype_size(cu_t(a, -1)->dtype),
					 a->st), e);
	else if (cu_t(a, -1)->dtype == DP_BF16)
		CU_LAUNCH(k_fill_half<cu_bf16>, cu_grid(n), CU_THREADS, a->st, (cu_bf16 *)cu_p(a, -1), n, v);
	else if (cu_t(a, -1)->dtype == DP_F16)
		CU_LAUNCH(k_fill_half<__half>, cu_grid(n), CU_THREADS, a->st, (__half *)cu_p(a, -1), n, v);
	else
		CU_LAUNCH(k_fill<float>, cu_grid(n), CU_THREADS, a->st, cu_f(a, -1), n, v);
	CU_LAUNCHED(a, e);
	return 0;
}

/* ---- copy, reshape, tp_copy: out = in0 (same dtype and size) ---- */

static int overlap_partly(const DpTensor *o, const DpTensor *i)
{
	int disjoint = o->offset + o->nbytes <= i->offset || i->offset + i->nbytes <= o->offset;
	return !disjoint && o->offset != i->offset;
}

/* A copy whose operands partly overlap (reshape may alias) goes through
 * scratch, like the CPU's memmove. */
static size_t scratch_copy(const DpStep *s, const DpInstr *in)
{
	const DpTensor *o = &s->tensors[in->out], *i = &s->tensors[in->in[0]];
	return overlap_partly(o, i) ? (size_t)cu_numel(o) * dp_dtype_size(o->dtype) : 0;
}

/* D2H / H2D (offload): between the device arena and the pinned host arena,
 * on the instruction's stream; the two never overlap */
static int run_xfer(const CuArgs *a, RtErr *e)
{
	const DpTensor *o = cu_t(a, -1);
	size_t bytes = (size_t)cu_numel(o) * dp_dtype_size(o->dtype);
	if (bytes)
		CU_OK(a, cudaMemcpyAsync(cu_p(a, -1), cu_p(a, 0), bytes,
					 a->in->op == DP_OP_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
					 a->st), e);
	return 0;
}

static int run_copy(const CuArgs *a, RtErr *e)
{
	const DpTensor *o = cu_t(a, -1), *i = cu_t(a, 0);
	size_t bytes = (size_t)cu_numel(o) * dp_dtype_size(o->dtype);
	if (!bytes || cu_p(a, -1) == cu_p(a, 0))
		return 0;
	if (overlap_partly(o, i)) {
		CU_OK(a, cudaMemcpyAsync(a->scratch, cu_p(a, 0), bytes, cudaMemcpyDeviceToDevice, a->st),
		      e);
		CU_OK(a, cudaMemcpyAsync(cu_p(a, -1), a->scratch, bytes, cudaMemcpyDeviceToDevice, a->st),
		      e);
		return 0;
	}
	CU_OK(a, cudaMemcpyAsync(cu_p(a, -1), cu_p(a, 0), bytes, cudaMemcpyDeviceToDevice, a->st), e);
	return 0;
}

/* pad_rows (passes/padvocab.c): in0's rows, then zero rows up to out's: the
 * LM head's weight as its GEMMs on tensor cores see it (N or K a multiple of
 * pad_vocab). Two copies of the stream, captured as memcpy and memset
 * nodes; bandwidth-bound (GPT-2's bf16 wte: 77 MB read and written) */
static int run_pad_rows(const CuArgs *a, RtErr *e)
{
	const DpTensor *o = cu_t(a, -1), *i = cu_t(a, 0);
	size_t el = dp_dtype_size(o->dtype), real = (size_t)cu_numel(i) * el,
	       all = (size_t)cu_numel(o) * el;
	if (real)
		CU_OK(a, cudaMemcpyAsync(cu_p(a, -1), cu_p(a, 0), real, cudaMemcpyDeviceToDevice, a->st),
		      e);
	if (all > real)
		CU_OK(a, cudaMemsetAsync((char *)cu_p(a, -1) + real, 0, all - real, a->st), e);
	return 0;
}

/* ---- transpose: [.., r, c] -> [.., c, r], 32 x 32 tiles through shared memory ---- */

#define TILE 32

template <typename T>
__global__ void k_transpose(T *o, const T *x, int64_t r, int64_t c, int64_t tiles_r,
			    int64_t tiles_c)
{
	__shared__ T tile[TILE][TILE + 1]; /* +1: no bank conflicts on the transposed read */
	int64_t bi = blockIdx.x, tc = bi % tiles_c, tr = (bi / tiles_c) % tiles_r;
	int64_t b = bi / (tiles_c * tiles_r);
	const T *xb = x + b * r * c;
	T *ob = o + b * r * c;
	int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE; /* 32 x 8 threads */
	for (int k = ty; k < TILE; k += CU_THREADS / TILE) {
		int64_t i = tr * TILE + k, j = tc * TILE + tx;
		if (i < r && j < c)
			tile[k][tx] = xb[i * c + j];
	}
	__syncthreads();
	for (int k = ty; k < TILE; k += CU_THREADS / TILE) {
		int64_t j = tc * TILE + k, i = tr * TILE + tx; /* out row j, column i */
		if (i < r && j < c)
			ob[j * r + i] = tile[tx][k];
	}
}

static int run_transpose(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t n = cu_numel(cu_t(a, -1));
	int64_t r = t0->dims[t0->ndim - 2], c = t0->dims[t0->ndim - 1];
	if (n <= 0 || r * c <= 0)
		return 0;
	int64_t tr = (r + TILE - 1) / TILE, tcn = (c + TILE - 1) / TILE, batch = n / (r * c);
	if (dp_is_half(t0->dtype))
		CU_LAUNCH(k_transpose<uint16_t>, (unsigned)(batch * tr * tcn), CU_THREADS, a->st,
			  (uint16_t *)cu_p(a, -1), (const uint16_t *)cu_p(a, 0), r, c, tr, tcn);
	else
		CU_LAUNCH(k_transpose<uint32_t>, (unsigned)(batch * tr * tcn), CU_THREADS, a->st,
			  (uint32_t *)cu_p(a, -1), (const uint32_t *)cu_p(a, 0), r, c, tr, tcn);
	CU_LAUNCHED(a, e);
	return 0;
}

/* The grid is one block per tile: at most 2^31 - 1. */
static int limit_transpose(const DpStep *s, const DpInstr *in, RtErr *e)
{
	const DpTensor *t0 = &s->tensors[in->in[0]];
	int64_t r = t0->dims[t0->ndim - 2], c = t0->dims[t0->ndim - 1], n = cu_numel(t0);
	int64_t tiles = r * c != 0 ? n / (r * c) * ((r + TILE - 1) / TILE) * ((c + TILE - 1) / TILE) : 0;
	if (tiles > INT_MAX)
		return RT_FAIL(e, "step file: transpose of '%s': %lld tiles are too many for one "
			       "CUDA grid", dpstep_str(s, t0->name), (long long)tiles);
	return 0;
}

/* ---- split: out = column chunk index of `parts`; split_grad: its zero-padded inverse ---- */

static size_t elem_size(const DpTensor *t) { return dp_dtype_size(t->dtype); }

static int run_split(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t cols = cu_cols(t0), rows = cu_rows(t0), cs = cols / DP_ATTR(a->in, SPLIT, parts);
	size_t es = elem_size(t0);
	CU_OK(a, rows_copy_elems(a->st, cu_p(a, -1), cs,
				 elem_at(cu_p(a, 0), DP_ATTR(a->in, SPLIT, index) * cs, es),
				 cols, cs, rows, es), e);
	return 0;
}

/* out[r, j] = dy[r, j - lo] for j in [lo, lo + cols), else 0: every output
 * element written once, by three strided copies (zeros, dy, zeros). */
static int run_split_grad(const CuArgs *a, RtErr *e)
{
	const DpTensor *t0 = cu_t(a, 0);
	int64_t cols = cu_cols(t0), rows = cu_rows(t0), cw = cols * DP_ATTR(a->in, SPLIT_GRAD, parts);
	int64_t lo = DP_ATTR(a->in, SPLIT_GRAD, index) * cols, hi = lo + cols;
	size_t es = elem_size(t0);
	void *o = cu_p(a, -1);
	if (rows <= 0 || cw <= 0)
		return 0;
	CU_OK(a, rows_copy_elems(a->st, o, cw, (const void *)0, 0, lo, rows, es), e);
	CU_OK(a, rows_copy_elems(a->st, elem_at(o, lo, es), cw, cu_p(a, 0), cols, cols, rows, es), e);
	CU_OK(a, rows_copy_elems(a->st, elem_at(o, hi, es), cw, (const void *)0, 0, cw - hi, rows, es),
	      e);
	return 0;
}

/* ---- interleave: in0 [parts][outer][s][inner] -> out [outer][parts*s][inner] ---- */

static int run_interleave(const CuArgs *a, RtErr *e)
{
	const DpTensor *to = cu_t(a, -1);
	int64_t parts = DP_ATTR(a->in, INTERLEAVE, parts), dim = DP_ATTR(a->in, INTERLEAVE, dim);
	int64_t outer = 1, inner = 1;
	size_t es = elem_size(to);
	for (int64_t i = 0; i < dim; i++)
		outer *= to->dims[i];
	for (int64_t i = dim + 1; i < to->ndim; i++)
		inner *= to->dims[i];
	int64_t blk = to->dims[dim] / parts * inner;
	for (int64_t p = 0; p < parts; p++) /* out block (u*parts + p) = in block (p*outer + u) */
		CU_OK(a, rows_copy_elems(a->st, elem_at(cu_p(a, -1), p * blk, es), parts * blk,
					 elem_at(cu_p(a, 0), p * outer * blk, es), blk, blk, outer, es),
		      e);
	return 0;
}

/* ---- kv_pack / kv_unpack: per head [q|k|v] of hd <-> [k|v] ---- */

static int run_kv_pack(const CuArgs *a, RtErr *e)
{
	int unpack = a->in->op == DP_OP_KV_UNPACK;
	const DpTensor *tq = unpack ? cu_t(a, -1) : cu_t(a, 0);
	int64_t heads = DP_ATTR(a->in, KV_PACK, heads), hd = tq->dims[2] / 3 / heads;
	int64_t rows = tq->dims[0] * tq->dims[1] * heads; /* one row per (token, head) */
	size_t es = elem_size(tq);
	void *o = cu_p(a, -1);
	if (!unpack) {
		CU_OK(a, rows_copy_elems(a->st, o, 2 * hd, elem_at(cu_p(a, 0), hd, es), 3 * hd, 2 * hd,
					 rows, es), e);
		return 0;
	}
	CU_OK(a, rows_copy_elems(a->st, o, 3 * hd, (const void *)0, 0, hd, rows, es), e);
	CU_OK(a, rows_copy_elems(a->st, elem_at(o, hd, es), 3 * hd, cu_p(a, 0), 2 * hd, 2 * hd, rows,
				 es), e);
	return 0;
}

/* ---- embedding: out[r, :] = table[ids[r], :] ---- */

/* Rows of dw words of W (16 bytes when the row and both bases allow, else
 * one element): moved, never converted, so bitwise in f32 and bf16. */
template <typename W>
__global__ void k_embedding(W *o, const int32_t *ids, const W *tab, int64_t rows, int64_t v,
			    int64_t dw, CuScalars *sc)
{
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		int64_t id = ids[r];
		int bad = id < 0 || id >= v;
		if (bad && threadIdx.x == 0)
			cu_report_error(sc, CU_ERR_TOKEN, id, r, v);
		W *orow = o + r * dw;
		const W *trow = tab + (bad ? 0 : id) * dw;
		for (int64_t j = threadIdx.x; j < dw; j += blockDim.x)
			orow[j] = bad ? W() : trow[j];
	}
}

template <typename W>
static int launch_embedding(const CuArgs *a, int64_t rows, int64_t v, int64_t dw, RtErr *e)
{
	CU_LAUNCH(k_embedding<W>, (unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID),
		  cu_row_threads(4 * dw), a->st, (W *)cu_p(a, -1), (const int32_t *)cu_p(a, 0),
		  (const W *)cu_p(a, 1), rows, v, dw, a->sc);
	CU_LAUNCHED(a, e);
	return 0;
}

static int run_embedding(const CuArgs *a, RtErr *e)
{
	const DpTensor *tab = cu_t(a, 1);
	int64_t rows = cu_numel(cu_t(a, 0)), v = tab->dims[0], d = tab->dims[1];
	size_t es = elem_size(tab), bytes = (size_t)d * es;
	if (rows <= 0 || d <= 0)
		return 0;
	if (bytes % 16 == 0 && cu_aligned16(cu_p(a, -1)) && cu_aligned16(cu_p(a, 1)))
		return launch_embedding<uint4>(a, rows, v, (int64_t)(bytes / 16), e);
	if (es == 2)
		return launch_embedding<uint16_t>(a, rows, v, d, e);
	return launch_embedding<uint32_t>(a, rows, v, d, e);
}

/*
 * embedding_grad: out[ids[r], :] += dy[r, :], deterministic. A stable
 * counting sort groups the rows by id (ascending rows within an id), then
 * the blocks of each id's first row sum its rows in that order:
 *   1. k_emb_tile   (a block per tile of EMB_TILE rows): rank[r] = rows
 *                   of r's tile before r with the same id; tcnt[tile][id]
 *                   = rows of the tile with that id (ids outside [0, V) in
 *                   bucket V);
 *   2. k_emb_tiles  for each id: tcnt[tile][id] = rows with that id in the
 *                   tiles before (exclusive, in tile order); cnt[id] = all;
 *   3. k_emb_scan   (one block): start[id] = exclusive prefix sum of cnt;
 *   4. k_emb_place  order[start[id] + tcnt[tile][id] + rank[r]] = r;
 *   5. k_emb_sum    a block per (id's first row, EMB_COLS columns), a
 *                   thread per column: out[id, j] (+)= its rows' dy[., j]
 *                   in ascending order, EMB_AHEAD rows' loads issued
 *                   before their adds.
 * Scratch (int32): cnt[V+1], start[V+1], rank[rows], order[rows],
 * tcnt[tiles][V+1].
 *
 * Why this shape (GPT-2 124M, 16,384 tokens, H200: 2.57 ms before it):
 * the sort was one block comparing each row with its 1024-row tile
 * (16 M shared-memory compares on one SM), and the sums a block per id
 * whose ~200 threads walked 4 columns each, one after the other, each
 * walk a chain of dependent loads as long as the id's rows (byte-level
 * text: ' ' is ~2,550 of 16,384). Now the sort runs on every tile at
 * once, and an id's columns are all walked at once, each walk with
 * EMB_AHEAD loads in flight. The additions are the same, in the same
 * order: the CPU's bits.
 */
#define EMB_RANK_THREADS 1024
#define EMB_TILE 512  /* rows per k_emb_tile block (one thread each) */
#define EMB_COLS 128  /* columns per k_emb_sum block */
#define EMB_AHEAD 8   /* rows loaded ahead of their adds in k_emb_sum */

__global__ void k_emb_tile(const int32_t *ids, int64_t rows, int64_t v, int32_t *tcnt,
			   int32_t *rank, CuScalars *sc)
{
	__shared__ int32_t tile[EMB_TILE];
	int32_t *cnt = tcnt + blockIdx.x * (v + 1);
	int64_t base = (int64_t)blockIdx.x * EMB_TILE, r = base + threadIdx.x;
	int n = (int)(rows - base < EMB_TILE ? rows - base : EMB_TILE);
	for (int64_t i = threadIdx.x; i <= v; i += blockDim.x)
		cnt[i] = 0;
	int32_t id = (int32_t)v;
	if (r < rows) {
		int32_t raw = ids[r];
		if (raw < 0 || raw >= v)
			cu_report_error(sc, CU_ERR_TOKEN, raw, r, v);
		else
			id = raw;
	}
	tile[threadIdx.x] = id;
	if (!MUTANT(emb_tile_sync)) /* the zeroed counts and the tile, before their use */
		__syncthreads();
	int before = 0, last = 1;
	for (int k = 0; k < n; k++) {
		before += k < (int)threadIdx.x && tile[k] == id;
		last &= !(k > (int)threadIdx.x && tile[k] == id);
	}
	if (r < rows) {
		rank[r] = before;
		if (last)
			cnt[id] = before + 1;
	}
}

__global__ void k_emb_tiles(int32_t *tcnt, int32_t *cnt, int64_t v, int64_t tiles)
{
	CU_FOR_EACH(i, v + 1) {
		int32_t run = 0;
		for (int64_t t = 0; t < tiles; t++) {
			int32_t c = tcnt[t * (v + 1) + i];
			tcnt[t * (v + 1) + i] = run;
			run += c;
		}
		cnt[i] = run;
	}
}

__global__ void k_emb_scan(const int32_t *cnt, int32_t *start, int64_t n)
{
	__shared__ int32_t part[EMB_RANK_THREADS];
	int64_t per = (n + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per;
	int32_t sum = 0;
	for (int64_t i = lo; i < lo + per && i < n; i++)
		sum += cnt[i];
	part[threadIdx.x] = sum;
	__syncthreads();
	for (unsigned o = 1; o < blockDim.x; o <<= 1) { /* inclusive scan (integers: exact) */
		int32_t add = threadIdx.x >= o ? part[threadIdx.x - o] : 0;
		__syncthreads();
		part[threadIdx.x] += add;
		__syncthreads();
	}
	int32_t run = threadIdx.x ? part[threadIdx.x - 1] : 0;
	for (int64_t i = lo; i < lo + per && i < n; i++) {
		start[i] = run;
		run += cnt[i];
	}
}

__global__ void k_emb_place(const int32_t *ids, int64_t rows, int64_t v, const int32_t *start,
			    const int32_t *tcnt, const int32_t *rank, int32_t *order)
{
	CU_FOR_EACH(r, rows) {
		int32_t id = ids[r];
		if (id < 0 || id >= v)
			id = (int32_t)v;
		order[start[id] + tcnt[(r / EMB_TILE) * (v + 1) + id] + rank[r]] = (int32_t)r;
	}
}

template <typename TO, typename TD>
__global__ void k_emb_sum(TO *o, const TD *dy, const int32_t *ids, int64_t rows, int64_t v,
			  int64_t d, const int32_t *cnt, const int32_t *start, const int32_t *order)
{
	int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
	for (int64_t k = blockIdx.x; k < rows; k += gridDim.x) {
		int32_t id = ids[order[k]];
		if (id < 0 || id >= v || start[id] != k || j >= d)
			continue; /* not the first row of its id */
		int64_t end = k + cnt[id], q = k;
		float acc = ld(o + id * d + j);
		for (; q + EMB_AHEAD <= end; q += EMB_AHEAD) {
			float t[EMB_AHEAD];
			CU_UNROLL
			for (int u = 0; u < EMB_AHEAD; u++)
				t[u] = ld(dy + (int64_t)order[q + u] * d + j);
			CU_UNROLL
			for (int u = 0; u < EMB_AHEAD; u++)
				acc += t[u];
		}
		for (; q < end; q++)
			acc += ld(dy + (int64_t)order[q] * d + j);
		st(o + id * d + j, acc);
	}
}

static size_t scratch_embedding_grad(const DpStep *s, const DpInstr *in)
{
	int64_t v = s->tensors[in->out].dims[0], rows = cu_numel(&s->tensors[in->in[1]]);
	int64_t tiles = (rows + EMB_TILE - 1) / EMB_TILE;
	return (size_t)(2 * (v + 1) + 2 * rows + tiles * (v + 1)) * sizeof(int32_t);
}

/* int32 positions and counts (the tiles' counts too), and one block's scan
 * over V + 1 buckets. */
static int limit_embedding_grad(const DpStep *s, const DpInstr *in, RtErr *e)
{
	int64_t v = s->tensors[in->out].dims[0], rows = cu_numel(&s->tensors[in->in[1]]);
	if (v >= INT_MAX || rows >= INT_MAX || (rows / EMB_TILE + 1) * (v + 1) >= INT_MAX)
		return RT_FAIL(e, "step file: embedding_grad '%s': %lld rows of a %lld-row table do not "
			       "fit int32 indices", dpstep_str(s, s->tensors[in->out].name),
			       (long long)rows, (long long)v);
	return 0;
}

static int run_embedding_grad(const CuArgs *a, RtErr *e)
{
	const DpTensor *to = cu_t(a, -1);
	int64_t v = to->dims[0], d = to->dims[1], rows = cu_numel(cu_t(a, 1));
	int64_t tiles = (rows + EMB_TILE - 1) / EMB_TILE;
	int acc = DP_ATTR(a->in, EMBEDDING_GRAD, acc) != 0;
	const int32_t *ids = (const int32_t *)cu_p(a, 1);
	int32_t *cnt = (int32_t *)a->scratch, *start = cnt + v + 1, *rank = start + v + 1;
	int32_t *order = rank + rows, *tcnt = order + rows;
	if (!acc)
		CU_OK(a, cudaMemsetAsync(cu_p(a, -1), 0, (size_t)(v * d) * elem_size(to), a->st), e);
	if (rows <= 0 || d <= 0)
		return 0;
	CU_LAUNCH(k_emb_tile, (unsigned)tiles, EMB_TILE, a->st, ids, rows, v, tcnt, rank, a->sc);
	CU_LAUNCHED(a, e);
	CU_LAUNCH(k_emb_tiles, cu_grid(v + 1), CU_THREADS, a->st, tcnt, cnt, v, tiles);
	CU_LAUNCHED(a, e);
	CU_LAUNCH(k_emb_scan, 1, EMB_RANK_THREADS, a->st, cnt, start, v + 1);
	CU_LAUNCHED(a, e);
	CU_LAUNCH(k_emb_place, cu_grid(rows), CU_THREADS, a->st, ids, rows, v, start, tcnt, rank,
		  order);
	CU_LAUNCHED(a, e);
	/* acc = 0 was zeroed above: the sums start from the output either way;
	 * the output is f32 or, with bf16 gradients, bf16 (operand rule
	 * EMBEDDING_GRAD) */
	dim3 grid((unsigned)(rows < CU_MAX_GRID ? rows : CU_MAX_GRID),
		  (unsigned)((d + EMB_COLS - 1) / EMB_COLS));
	int o16 = dp_is_half(to->dtype), d16 = dp_is_half(cu_t(a, 0)->dtype);
	if (cu_t(a, 0)->dtype == DP_F16 && o16)
		CU_LAUNCH((k_emb_sum<__half, __half>), grid, EMB_COLS, a->st, (__half *)cu_p(a, -1),
			  (const __half *)cu_p(a, 0), ids, rows, v, d, cnt, start, order);
	else if (cu_t(a, 0)->dtype == DP_F16)
		CU_LAUNCH((k_emb_sum<float, __half>), grid, EMB_COLS, a->st, cu_f(a, -1),
			  (const __half *)cu_p(a, 0), ids, rows, v, d, cnt, start, order);
	else if (o16 && d16)
		CU_LAUNCH((k_emb_sum<cu_bf16, cu_bf16>), grid, EMB_COLS, a->st, (cu_bf16 *)cu_p(a, -1),
			  (const cu_bf16 *)cu_p(a, 0), ids, rows, v, d, cnt, start, order);
	else if (d16)
		CU_LAUNCH((k_emb_sum<float, cu_bf16>), grid, EMB_COLS, a->st, cu_f(a, -1),
			  (const cu_bf16 *)cu_p(a, 0), ids, rows, v, d, cnt, start, order);
	else if (!o16)
		CU_LAUNCH((k_emb_sum<float, float>), grid, EMB_COLS, a->st, cu_f(a, -1), cu_f(a, 0),
			  ids, rows, v, d, cnt, start, order);
	else
		return RT_FAIL(e, "embedding_grad: a 16-bit output of f32 gradients (the decoder "
			       "allows none)");
	CU_LAUNCHED(a, e);
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_layout_rows[] = {
	{DP_OP_NOP, run_nop, NULL, 0, NULL, NULL, 0, 0},
	{DP_OP_FILL, run_fill, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_COPY, run_copy, NULL, 1, NULL, scratch_copy, 0, 1}, /* bytes: 16-bit too */
	{DP_OP_D2H, run_xfer, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_H2D, run_xfer, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_RESHAPE, run_copy, NULL, 1, NULL, scratch_copy, 0, 1}, /* bytes: 16-bit too */
	{DP_OP_TP_COPY, run_copy, NULL, 1, NULL, scratch_copy, 0, 1}, /* bytes: 16-bit too */
	{DP_OP_TRANSPOSE, run_transpose, limit_transpose, 1, NULL, NULL, 0, 1},
	{DP_OP_PAD_ROWS, run_pad_rows, NULL, 1, NULL, NULL, 0, 1}, /* bytes: 16-bit too */
	{DP_OP_SPLIT, run_split, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_SPLIT_GRAD, run_split_grad, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_INTERLEAVE, run_interleave, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_EMBEDDING, run_embedding, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_EMBEDDING_GRAD, run_embedding_grad, limit_embedding_grad, 1, NULL, scratch_embedding_grad, 0, 1},
	{DP_OP_KV_PACK, run_kv_pack, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_KV_UNPACK, run_kv_pack, NULL, 1, NULL, NULL, 0, 1},
	{},
};
