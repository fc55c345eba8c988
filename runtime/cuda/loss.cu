/*
 * loss.cu - the CUDA kernels of the classification loss (the CPU's
 * runtime/cpu/loss.c): cross entropy, its gradient, and the count of correct
 * argmax predictions; and the planner that lets the gradient reuse the
 * loss's row statistics.
 *
 * One block per row. Rows with a negative label are padding (nothing); a
 * label >= classes is reported (CU_ERR_LABEL, the CPU's error) and read as
 * padding.
 *
 * cross_entropy: one pass over the row. Each thread keeps a running max m
 * and sum s = sum exp(x - m) in double (rescaled when m grows); the block
 * combines them into the row's max M (exactly the CPU's float max) and
 * S = sum exp(x - M) in double. The row's loss is log(S) + M - x[label] in
 * double, as on the CPU; the rows' losses are summed in double by one block
 * in a fixed tree, scaled, rounded once. S differs from the CPU's
 * sequential double sum only by double rounding (~1e-16 relative): the
 * float result is the CPU's to within 1 ulp.
 *
 * cross_entropy_grad: d = (float)(scale * (exp(x - M) / S - onehot)) in
 * double, the CPU's formula (with loss_scale, scale times fp16's loss
 * scale, read from device memory: CuScalars). When the loss of the same logits ran earlier in
 * the run (cu_plan_xent), it left M and S per row in persistent memory and
 * the gradient is one read and one write of the logits; otherwise it first
 * computes them (the same one-pass walk). Before: max pass, sum pass (x2:
 * loss and gradient) and the gradient pass, i.e. five reads and a write of
 * the logits; now two reads and a write (1.6 GB of logits per micro-batch
 * for GPT-2 124M at B*T = 8192: ~2 GB less traffic, ~0.7 ms on an H100).
 *
 * cross_entropy_fused (passes/fuse.c): the gradient's kernel computing M
 * and S itself, which also writes each row's loss as cross_entropy does, and
 * its gradient over the logits, in place; then the loss's fixed-tree sum.
 * One read and one write of the logits where the pair above took two reads,
 * a write and a second buffer; bitwise the pair's loss and gradient.
 *
 * correct: argmax with the first maximum winning (the CPU's `>` scan), one
 * flag per row, counted in a fixed tree: exact.
 *
 * bf16 logits (precision bf16): the kernels are templated on the logits'
 * storage, the loss and the statistics stay f32/double, the gradient is
 * rounded once per element. Rows of a multiple of 8 classes with 16-byte
 * aligned operands are read (and the gradient written) in chunks of eight,
 * 128 bits at a time: the threads' running (max, sum) then cover other
 * elements, so S may differ from the scalar walk's by double rounding
 * (~1e-16 relative; the loss is f32, the gradient bf16: equal unless a
 * value lies that close to a rounding boundary). correct stays exact.
 * f16 logits (precision fp16) the same, on __half. The gradient of 16-bit
 * logits (cross_entropy_fused, cross_entropy_grad) runs instead on
 * k_xent_grad_rows16, the row held in registers, wherever its strides are
 * multiples of 8 (padded rows included) and the row fits (below).
 */
#include "device.cuh"

/* The row's label, or -1 for padding (a label out of range is reported). */
static __device__ __forceinline__ int64_t row_label(const int32_t *y, int64_t r, int64_t classes,
						    CuScalars *sc)
{
	int64_t label = y[r];
	if (label >= classes) {
		if (threadIdx.x == 0)
			cu_report_error(sc, CU_ERR_LABEL, label, r, classes);
		return -1;
	}
	return label;
}

/* M and S of one row: every thread of the block gets them. Chunks of W. */
template <int W, typename T>
static __device__ void row_stats(const T *row, int64_t classes, float *shf, double *shd,
				 float *mx, double *sum)
{
	float m = -INFINITY;
	double s = 0;
	for (int64_t j0 = W * threadIdx.x; j0 < classes; j0 += W * blockDim.x) {
		float xv[W];
		ldw<W>(row + j0, xv);
		for (int k = 0; k < W; k++) {
			float x = xv[k];
			if (x > m) {
				s = s * exp((double)m - x) + 1.0; /* exp(-inf) = 0 on the first */
				m = x;
			} else if (!(x == -INFINITY)) { /* exp(-inf - m) adds 0; a NaN adds NaN */
				s += exp((double)x - m);
			}
		}
	}
	float big = block_max(m, shf);
	double mine = m == -INFINITY ? 0.0 : s * exp((double)m - big);
	*sum = block_sum<double>(mine, shd);
	*mx = big;
}

/* XENT (part[r] = -log p(label), or 0) and CORRECT (part[r], part[rows + r]);
 * stats (NULL: none): the loss's M and S per row for its gradient. */
template <int W, typename T>
__global__ void k_xent_rows(int op, const T *x, int64_t ldx, const int32_t *y, int64_t rows,
			    int64_t classes, double *part, double *stats, CuScalars *sc)
{
	__shared__ float shf[32];
	__shared__ double shd[32];
	__shared__ int64_t shi[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *row = x + r * ldx;
		int64_t label = row_label(y, r, classes, sc);
		if (op == DP_OP_CORRECT) {
			/* argmax, first maximum wins: per thread its first best, then the
			 * block keeps the larger value or, on a tie, the smaller index */
			float bv = -INFINITY;
			int64_t bi = classes;
			for (int64_t j0 = W * threadIdx.x; j0 < classes; j0 += W * blockDim.x) {
				float xv[W];
				ldw<W>(row + j0, xv);
				for (int k = 0; k < W; k++)
					if (bi == classes || xv[k] > bv) {
						bv = xv[k];
						bi = j0 + k;
					}
			}
			for (int o = 16; o > 0; o >>= 1) {
				float v2 = shfl_xor(bv, o);
				int64_t i2 = (int64_t)__shfl_xor_sync(CU_FULL_MASK, (long long)bi, o);
				if (i2 < classes && (bi == classes || v2 > bv || (v2 == bv && i2 < bi))) {
					bv = v2;
					bi = i2;
				}
			}
			int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
			__syncthreads();
			if (lane == 0) {
				shf[w] = bv;
				shi[w] = bi;
			}
			__syncthreads();
			if (threadIdx.x == 0) {
				for (int k = 1; k < (int)(blockDim.x >> 5); k++)
					if (shi[k] < classes && (shi[0] == classes || shf[k] > shf[0] ||
								 (shf[k] == shf[0] && shi[k] < shi[0]))) {
						shf[0] = shf[k];
						shi[0] = shi[k];
					}
				part[r] = label >= 0 && shi[0] == label;
				part[rows + r] = label >= 0;
			}
			continue;
		}
		if (label < 0) {
			if (threadIdx.x == 0)
				part[r] = 0;
			continue;
		}
		float mx;
		double sum;
		row_stats<W>(row, classes, shf, shd, &mx, &sum);
		if (threadIdx.x == 0) {
			part[r] = log(sum) + mx - ld(row + label); /* -log p(label) */
			if (stats) {
				stats[2 * r] = mx;
				stats[2 * r + 1] = sum;
			}
		}
	}
}

/* One block: the per-row values in a fixed tree. */
__global__ void k_xent_sum(int op, float *o, int64_t rows, float scale, const double *part)
{
	__shared__ double sh[32];
	double a = 0, b = 0;
	for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
		a += part[r];
		if (op == DP_OP_CORRECT)
			b += part[rows + r];
	}
	a = block_sum<double>(a, sh);
	b = block_sum<double>(b, sh);
	if (threadIdx.x == 0) {
		if (op == DP_OP_CORRECT) {
			o[0] = (float)a;
			o[1] = (float)b;
		} else {
			o[0] = (float)((double)scale * a);
		}
	}
}

/* d = scale * (softmax(x) - onehot(label)); stats_in: M and S from the loss.
 * part (cross_entropy_fused, NULL otherwise): the row's loss as k_xent_rows
 * writes it, from the same M and S, and d written over x (o == x): thread 0
 * reads x[label] before the block's first barrier in row_stats, every
 * thread writes after it. */
template <int W, typename T>
__global__ void k_xent_grad(T *o, int64_t ldo, const T *x, int64_t ldx, const int32_t *y,
			    int64_t rows, int64_t classes, float scale, int loss_scale,
			    const double *stats, double *part, CuScalars *sc)
{
	__shared__ float shf[32];
	__shared__ double shd[32];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *row = x + r * ldx;
		T *d = o + r * ldo;
		int64_t label = row_label(y, r, classes, sc);
		for (int64_t j = classes + threadIdx.x; j < ldo; j += blockDim.x) {
			const float zero[1] = {}; /* padding columns: a padded k reads them */
			stw<1>(d + j, zero);
		}
		if (label < 0) {
			const float zero[W] = {};
			if (part && threadIdx.x == 0)
				part[r] = 0;
			for (int64_t j = W * threadIdx.x; j < classes; j += W * blockDim.x)
				stw<W>(d + j, zero);
			continue;
		}
		float xl = part && threadIdx.x == 0 ? ld(row + label) : 0.0f;
		float mx;
		double sum;
		if (stats) {
			mx = (float)stats[2 * r];
			sum = stats[2 * r + 1];
		} else {
			row_stats<W>(row, classes, shf, shd, &mx, &sum);
		}
		if (part && threadIdx.x == 0)
			part[r] = log(sum) + mx - xl; /* -log p(label), as k_xent_rows */
		double sc2 = loss_scale ? (double)scale * sc->amp.scale : scale; /* fp16: exact */
		for (int64_t j = W * threadIdx.x; j < classes; j += W * blockDim.x) {
			float xv[W], dv[W];
			ldw<W>(row + j, xv);
			for (int k = 0; k < W; k++)
				dv[k] = (float)(sc2 * (exp((double)xv[k] - mx) / sum - (j + k == label)));
			stw<W>(d + j, dv);
		}
	}
}

/*
 * The gradient of 16-bit logits in two passes over the row (cross_entropy_fused
 * and cross_entropy_grad on bf16 or f16, rows by a stride of a multiple of
 * 8): one block of up to XR_THREADS per row, two blocks per SM; each thread
 * walks chunks of eight (16 bytes), column q * 8 for chunk q = thread + i *
 * blockDim.
 *   pass 1 (online softmax): the thread's running max m and s = sum
 *   exp(x - m), each chunk's eight in f32 with the chunk's max folded in
 *   first (s rescaled by exp(m_old - m) when it grows: a few times a row),
 *   the chunks in double; the block combines the threads' (m, s) into the
 *   row's M (the CPU's float max) and S = sum exp(x - M) in double;
 *   the loss log(S) + M - x[label] in double as k_xent_rows;
 *   pass 2: the row read again (from L2: the blocks of an SM hold 2 rows,
 *   the GPU ~264 rows, 26 MB of GPT-2's logits, in a 50 MB L2) and the
 *   gradient d = exp(x - M) * (scale / S) - scale * onehot in f32, rounded
 *   once to the logits' dtype and stored 16 bytes at a time over the row
 *   (in place for the fused op), the padding columns zero.
 * exp(x - m) is exp2f(x * log2(e) - m * log2(e)), one fmaf and the SFU's
 * ex2 (about 14 instructions an element in both passes).
 *
 * Why not the row in registers (the kernel before, 2.59 ms on the H200 for
 * GPT-2's 16 x 1024 rows against 0.69 ms of bytes): a 100 KB row in
 * registers is one block of 1024 threads per SM, and its phases (the loads,
 * the max, the sum, the stores) run one after the other with the memory
 * idle during each reduction; ~40 instructions an element (a NaN-aware max,
 * the column guards on every element, expf twice) at 32 warps made it
 * issue-bound at ~21 us a row. Two rows per SM overlap one's reductions with
 * the other's loads, and the second read of a row costs L2 bandwidth, not
 * DRAM's: 3.3 GB of DRAM traffic (one read, one write) remains.
 *
 * Numerics: e and S in f32 (ex2 of an fmaf: the argument's rounding ~|t| *
 * 6e-8 relative, the SFU's 2 ulp), so d is within a few f32 ulp of the
 * double formula before its 16-bit rounding (equal unless it lies that near
 * a rounding boundary), and the loss within ~1e-6 absolute
 * (tests/cuda_emu.sh's bf16 cases). A NaN logit: the chunk max (fmaxf)
 * drops it but its exp makes S NaN, so the loss and every gradient element
 * of the row are NaN, as with the CPU's formula.
 */
#define XR_THREADS 1024
#define XR_LOG2E 1.4426950408889634f

/* Chunk q's eight values of the row, the columns from cls on as -inf */
template <typename H>
static __device__ __forceinline__ void chunk8(const H *row, int q, int cls, float *xv)
{
	unpack8<H>(*(const uint4 *)(row + q * 8), xv);
	if (q * 8 + 8 > cls) /* the last real chunk only */
		for (int k = 0; k < 8; k++)
			if (q * 8 + k >= cls)
				xv[k] = -INFINITY;
}

template <typename H>
__global__ void __launch_bounds__(XR_THREADS, 2)
k_xent_grad_rows16(H *o, int64_t ldo, const H *x, int64_t ldx, const int32_t *y, int64_t rows,
		   int64_t classes, float scale, int loss_scale, double *part, CuScalars *sc)
{
	__shared__ float shf[32];
	__shared__ double shd[32];
	/* chunks: in all, with real columns (int: the row is < 2^31 elements) */
	const int nch = (int)(ldo / 8), nreal = (int)((classes + 7) / 8), cls = (int)classes;
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const H *row = x + r * ldx;
		H *d = o + r * ldo;
		/* x[label] before any barrier: pass 2 may overwrite it (in place) while
		 * thread 0 is still in the reductions */
		int64_t label = row_label(y, r, classes, sc);
		float xl = part && threadIdx.x == 0 && label >= 0 ? ld(row + label) : 0.0f;
		/* pass 1, the loads not waiting for the label (a padding row's are wasted) */
		float m = -INFINITY;
		double s = 0;
		for (int q = (int)threadIdx.x; q < nreal; q += (int)blockDim.x) {
			float xv[8], cm = -INFINITY, cs = 0;
			chunk8<H>(row, q, cls, xv);
			for (int k = 0; k < 8; k++)
				cm = fmaxf(cm, xv[k]);
			if (cm > m) { /* (m = -inf: s is 0) */
				s *= (double)exp2f((m - cm) * XR_LOG2E);
				m = cm;
			}
			if (m == -INFINITY) /* every value so far -inf: exp(-inf - -inf) would be NaN */
				continue;
			float ml = m * XR_LOG2E;
			for (int k = 0; k < 8; k++)
				cs += exp2f(fmaf(xv[k], XR_LOG2E, -ml));
			s += cs;
		}
		float mx = block_max(m, shf);
		double mine = m == -INFINITY ? 0.0 : s * (double)exp2f((m - mx) * XR_LOG2E);
		double sum = block_sum<double>(MUTANT(xent_online) ? s : mine, shd);
		if (label < 0) { /* padding: a zero gradient, no loss */
			if (part && threadIdx.x == 0)
				part[r] = 0;
			for (int q = (int)threadIdx.x; q < nch; q += (int)blockDim.x)
				*(uint4 *)(d + q * 8) = make_uint4(0, 0, 0, 0);
			continue;
		}
		if (part && threadIdx.x == 0)
			part[r] = log(sum) + mx - xl; /* -log p(label), as k_xent_rows */
		double sc2 = loss_scale ? (double)scale * sc->amp.scale : scale; /* fp16: exact */
		float inv = (float)(sc2 / sum), hot = (float)sc2, ml = mx * XR_LOG2E;
		/* pass 2: the gradient (a thread rereads its own chunks: in place is safe) */
		for (int q = (int)threadIdx.x; q < nch; q += (int)blockDim.x) {
			if (q >= nreal) { /* padding columns only */
				*(uint4 *)(d + q * 8) = make_uint4(0, 0, 0, 0);
				continue;
			}
			float xv[8], dv[8];
			unpack8<H>(*(const uint4 *)(row + q * 8), xv);
			for (int k = 0; k < 8; k++)
				dv[k] = exp2f(fmaf(xv[k], XR_LOG2E, -ml)) * inv;
			if ((uint64_t)(label - q * 8) < 8) /* the label's chunk */
				for (int k = 0; k < 8; k++)
					dv[k] -= q * 8 + k == label ? hot : 0.0f;
			if (q * 8 + 8 > cls) /* the last real chunk: its padding columns zero */
				for (int k = 0; k < 8; k++)
					if (q * 8 + k >= cls)
						dv[k] = 0.0f;
			st8(d + q * 8, dv);
		}
	}
}

/* May the gradient of a 16-bit op run on k_xent_grad_rows16: both strides
 * a multiple of 8, 16-byte aligned bases? */
template <typename H> static int xent_rows16_fits(const CuArgs *a, const void *o, int64_t ldo)
{
	int64_t ldx = dp_ld(cu_t(a, 0));
	return ldx % 8 == 0 && ldo % 8 == 0 && ldo >= cu_cols(cu_t(a, 0)) && ldo < INT_MAX &&
	       cu_aligned16(cu_p(a, 0)) && cu_aligned16(o);
}

/* part: 2 * rows doubles */
static size_t scratch_xent(const DpStep *s, const DpInstr *in)
{
	return 2 * (size_t)cu_rows(&s->tensors[in->in[0]]) * sizeof(double);
}

/* The row kernels of one op on logits of T, chunks of W elements. */
template <int W, typename T> static int launch_xent(const CuArgs *a, RtErr *e)
{
	int op = a->in->op;
	float scale = op == DP_OP_CORRECT ? 0.0f : DP_FATTR(a->in, XENT, scale);
	/* rows by their strides: padded rows (passes/padvocab.c) are never touched */
	int64_t rows = cu_rows(cu_t(a, 0)), classes = MUTANT(vocab_leak) ? dp_ld(cu_t(a, 0)) : cu_cols(cu_t(a, 0)),
		ldx = dp_ld(cu_t(a, 0));
	unsigned grid = (unsigned)(rows < CU_MAX_GRID ? (rows > 0 ? rows : 1) : CU_MAX_GRID);
	unsigned threads = cu_row_threads_w(classes, W);
	const T *x = (const T *)cu_p(a, 0);
	const int32_t *y = (const int32_t *)cu_p(a, 1);
	double *part = (double *)a->scratch;
	if constexpr (sizeof(T) == 2) if (op == DP_OP_XENT_GRAD || op == DP_OP_XENT_FUSED) {
		/* 16-bit: the row in registers when it fits (k_xent_grad_rows16) */
		T *o = op == DP_OP_XENT_FUSED ? (T *)cu_p(a, 0) : (T *)cu_p(a, -1);
		int64_t ldo = op == DP_OP_XENT_FUSED ? ldx : dp_ld(cu_t(a, -1));
		if (rows > 0 && xent_rows16_fits<T>(a, o, ldo)) {
			int64_t nch = ldo / 8;
			unsigned t = (unsigned)(nch < XR_THREADS ? (nch + 31) / 32 * 32 : XR_THREADS);
			CU_LAUNCH((k_xent_grad_rows16<T>), grid, t ? t : 32, a->st, o, ldo, x, ldx, y, rows,
				  classes, scale, (int)DP_ATTR(a->in, XENT_GRAD, loss_scale),
				  op == DP_OP_XENT_FUSED ? part : (double *)0, a->sc);
			CU_LAUNCHED(a, e);
			if (op == DP_OP_XENT_FUSED) {
				CU_LAUNCH(k_xent_sum, 1, CU_THREADS, a->st, DP_OP_XENT, cu_f(a, -1), rows,
					  scale, part);
				CU_LAUNCHED(a, e);
			}
			return 0;
		}
	}
	if (op == DP_OP_XENT_GRAD) {
		if (rows <= 0)
			return 0;
		const double *stats = a->fuse->rowstats_in ? a->fuse->rowstats : (const double *)0;
		CU_LAUNCH((k_xent_grad<W, T>), grid, threads, a->st, (T *)cu_p(a, -1),
			  dp_ld(cu_t(a, -1)), x, ldx, y, rows, classes, scale,
			  (int)DP_ATTR(a->in, XENT_GRAD, loss_scale), stats, (double *)0, a->sc);
		CU_LAUNCHED(a, e);
		return 0;
	}
	if (op == DP_OP_XENT_FUSED) { /* the gradient over the logits, the rows' losses */
		if (rows > 0) {
			CU_LAUNCH((k_xent_grad<W, T>), grid, threads, a->st, (T *)cu_p(a, 0), ldx, x,
				  ldx, y, rows, classes, scale,
				  (int)DP_ATTR(a->in, XENT_FUSED, loss_scale), (const double *)0, part,
				  a->sc);
			CU_LAUNCHED(a, e);
		}
		CU_LAUNCH(k_xent_sum, 1, CU_THREADS, a->st, DP_OP_XENT, cu_f(a, -1), rows, scale, part);
		CU_LAUNCHED(a, e);
		return 0;
	}
	if (rows > 0) {
		CU_LAUNCH((k_xent_rows<W, T>), grid, threads, a->st, op, x, ldx, y, rows, classes, part,
			  op == DP_OP_XENT ? a->fuse->rowstats : (double *)0, a->sc);
		CU_LAUNCHED(a, e);
	}
	CU_LAUNCH(k_xent_sum, 1, CU_THREADS, a->st, op, cu_f(a, -1), rows, scale, part);
	CU_LAUNCHED(a, e);
	return 0;
}

/* 16-bit logits (H: cu_bf16 or __half): eight at a time where the rows allow */
template <typename H> static int run_xent_half(const CuArgs *a, RtErr *e)
{
	int64_t classes = cu_cols(cu_t(a, 0));
	const void *o = a->in->op == DP_OP_XENT_GRAD ? cu_p(a, -1) : (const void *)0;
	int strided = dp_ld(cu_t(a, 0)) != classes || (o && dp_ld(cu_t(a, -1)) != classes);
	if (!strided && cu_vec8<H>(classes, cu_p(a, 0), o))
		return launch_xent<8, H>(a, e);
	return launch_xent<1, H>(a, e);
}

/* The loss and correct write f32 from f32, bf16 or f16 logits; the
 * gradient writes the logits' dtype (operand rules XENT, XENT_GRAD,
 * CORRECT). */
static int run_xent(const CuArgs *a, RtErr *e)
{
	unsigned dt = cu_t(a, 0)->dtype;
	return dt == DP_F16 ? run_xent_half<__half>(a, e)
	       : dt == DP_BF16 ? run_xent_half<cu_bf16>(a, e) : launch_xent<1, float>(a, e);
}

/* ---- planning: the gradient reuses its loss's row statistics ---- */

/*
 * For each cross_entropy_grad, the latest cross_entropy before it in the
 * same program on the same logits and labels, on the same stream (stream
 * order makes the statistics visible), run under the same condition (both
 * or neither DP_IF_LAST), with no instruction between them writing the
 * logits or the labels: the pair shares a rows x (max, sum) buffer.
 */
extern "C" int cu_plan_xent(CuPlan *p, RtErr *e)
{
	const DpStep *s = p->s;
	for (int pg = 0; pg < DP_NPROG; pg++)
		for (uint32_t j = 0; j < s->nprog[pg]; j++) {
			const DpInstr *g = &s->prog[pg][j];
			if (g->op != DP_OP_XENT_GRAD)
				continue;
			const DpTensor *tx = &s->tensors[g->in[0]], *ty = &s->tensors[g->in[1]];
			for (uint32_t i = j; i-- > 0;) {
				const DpInstr *k = &s->prog[pg][i];
				if (k->op == DP_OP_XENT && k->in[0] == g->in[0] && k->in[1] == g->in[1]) {
					if (k->stream != g->stream ||
					    (k->flags & DP_IF_LAST) != (g->flags & DP_IF_LAST))
						break;
					CuFuse *f = &p->fuse[pg][i];
					if (!f->rowstats) {
						f->rowstats = (double *)p->alloc(
							p, 2 * (size_t)cu_rows(tx) * sizeof(double));
						if (!f->rowstats)
							return RT_FAIL(e, "out of device memory (cross entropy "
								       "row statistics of '%s')",
								       dpstep_str(s, tx->name));
					}
					p->fuse[pg][j].rowstats = f->rowstats;
					p->fuse[pg][j].rowstats_in = 1;
					break;
				}
				if (cu_writes(s, k, tx) || cu_writes(s, k, ty))
					break;
			}
		}
	return 0;
}

/* {op, run, limits, bf16, run_bf16, scratch, blas, f16}: kernel_table.h */
extern "C" const KernelRow cu_loss_rows[] = {
	{DP_OP_XENT, run_xent, NULL, 1, NULL, scratch_xent, 0, 1},
	{DP_OP_XENT_GRAD, run_xent, NULL, 1, NULL, NULL, 0, 1},
	{DP_OP_CORRECT, run_xent, NULL, 1, NULL, scratch_xent, 0, 1},
	{DP_OP_XENT_FUSED, run_xent, NULL, 1, NULL, scratch_xent, 0, 1},
	{},
};
