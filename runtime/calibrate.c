/*
 * calibrate.c - `dpexec STEP.bin --calibrate MACHINE.json`: measure this
 * machine, at this world size, into a machine file for `dpc --simulate`
 * (util/machine.h says what its fields mean).
 *
 * The kernels are the step file's own, at the shapes that occur: after two
 * optimizer steps (warm caches, real data), the STEP program's compute
 * instructions are run one at a time (exec_run_kernel), all of them in
 * program order, 5 times on every rank at once (so the cores are shared as
 * a step shares them), and each one's time is its median over the walks
 * on the slowest rank (the step waits for it at every collective; the
 * median: time_kernels says why).
 * From them:
 *  - kernel_overhead_s: the fastest instruction's time (a scalar's sqrt:
 *    the walk and the pool's fork and join, no work);
 *  - gemm: one point per distinct (m, n, k, dtype) of the GEMMs (matmul,
 *    linear and the fused gelu GEMMs), 2 m n k over its time less the
 *    overhead;
 *  - ops: per other op and dtype (line_dtype: "bf16" when an operand is a
 *    16-bit float), a line of its own: its points, one per size (bytes as
 *    the cost rules count them: every input, the output, the output again
 *    when it is read), the median time of its instructions of that size,
 *    added to the points the file's line already has (a size measured
 *    again: the new time), then bytes_per_s and overhead_s by least
 *    squares of time = overhead + bytes / rate over all of them, the
 *    overhead kept >= 0; a single size gives the rate at the kernel
 *    overhead; an op whose points all move under RATE_MIN_BYTES gets their
 *    median time as overhead_s and no rate. So a bf16 calibration into an
 *    f32 file adds bf16 lines beside the f32 ones (before 2026-11-28 an
 *    op had one line, the last calibration's), and step files of one
 *    model at several sizes give each op's line every size; an op with
 *    several CUDA kernels (format/kernel_kind.c: bias_grad paired with its
 *    GEMM or a column sum, the norms' warp or block rows, the classifier's
 *    rows16) keys each point by its instructions' kind, one point per kind
 *    and size, and fits its line over its general kernel's points;
 *  - memory_bw: the median of the file's op lines' bytes rates (every op
 *    and dtype, this run's and those it kept); peak_flops: the fastest
 *    GEMM point per dtype (the other dtype's when there is none).
 * The collectives: MPI_Iallreduce (in place), MPI_Iallgather and
 * MPI_Ireduce_scatter_block over every rank at 4 KiB to 8 MiB, each
 * completed by world_waitall as comm_mpi.c completes a step's (the blocking
 * calls take other algorithms and spin instead of yielding: on 2 loaded
 * cores their alpha was a tenth of what a step's collectives take), 5
 * times each (median of the slowest rank's time), and alpha and busbw by
 * least squares of time = alpha + bus bytes / busbw (nccl-tests' bus
 * bytes), for every link: one host's ranks share one memory.
 * A machine file already at the path from a calibration at the same world
 * size keeps what this run did not measure (other models' shapes and ops):
 * calibrating with several step files builds one file.
 * At pp > 1 each rank times its stage's kernels and those of every stage
 * (a kernel's mean on the slowest of the ranks that ran it), and the p2p link is
 * measured between neighbouring stages (time_p2p); at pp = 1 it is the
 * collectives' figure.
 *
 * On a device (a backend that is not BACKEND_INLINE: `--device cuda`;
 * time_device, docs/SIMULATE.md "Calibrating a GPU") the same machine file,
 * named "cuda-N-ranks", executor "gpu":
 *  - each kernel's device time: CUDA events before and after it on its
 *    stream (the backend's time_mark / time_read, dpexec --trace's
 *    mechanism), the STEP program's kernels issued eagerly back to back in
 *    one run (exec_time_instrs), the median of 5 walks after a warm one,
 *    the slowest rank's; where the device waited for the host in a walk
 *    (kernels shorter than their launch: more than 5 % of its span in
 *    gaps), the walks again behind replays of the captured step, which
 *    give the device a head start, so each span is the kernel's own;
 *    each span less what its two marks cost (on an H200 the spans held
 *    ~3 us each that a replay does not pay, more than gpt2-tiny's kernels
 *    take): an empty span (two marks, nothing between them, on the same
 *    stream) after each instruction in the same walks, their median
 *    (device_walks; at least 5 % of a span kept); and where the replayed
 *    step is still shorter than the kernels so corrected (the H200: by
 *    1.7 to 2.1 us an instruction after the marks' 1.31 us: what an eager
 *    launch costs the device, which a graph's node does not pay), that
 *    difference taken from every kernel alike, so they add up to the
 *    replayed step (time_device's end);
 *  - node_overhead_s: what a graph replay adds per instruction, the
 *    replayed step's wall time (up to two steps in flight, as dpexec runs
 *    them, ~0.5 s of steps) less its kernels' device time so corrected
 *    (without the correction it came out negative and was floored at 0,
 *    and every kernel kept the marks' ~3 us: docs/SIMULATE.md), over the
 *    instructions it runs (at world > 1 less its collectives' too, taken
 *    as not overlapped), pooled with the file's figure over all the
 *    instructions measured (node_overhead_n); kernel_overhead_s 0 and each
 *    op's overhead_s its intercept (a span holds no launch);
 *  - GEMM points and ops' bytes rates as on the CPU, from the device
 *    spans less the marks' cost (a span holds no launch); the attention
 *    ops by their FLOPs (flops_per_s): compute-bound on a GPU;
 *  - at world > 1, the links: the step's own all_reduce, tp_reduce,
 *    all_gather and reduce_scatter instructions at their sizes, one after
 *    another on the comm stream (NCCL), fitted to alpha and busbw as above.
 *    Ranks sharing one GPU (the kit's) time-slice its SMs and reach each
 *    other through NCCL's transport between processes: the file then
 *    describes that shared GPU, not N of them.
 * pp > 1 is refused there (no p2p on a device yet).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "exec.h"
#include "machine.h"
#include "outfile.h"
#include "world.h"

#define REPS 5
/* An op whose instructions all move less than this has no bytes rate here,
 * only an overhead: its time is the call's (1 to 2 us here; 64 KiB takes
 * 3 to 20 us at these cores' 3 to 25 GB/s), and a rate fitted to it is
 * noise that the simulator would charge at every size (mlp's ddp step has
 * one accum, the loss's 12 bytes: it gave 62 MB/s, and full_shard's ten
 * gradient accums, up to 1.2 MB each, were predicted at 48 ms a step
 * against 0.09 ms in its measured trace). The simulator takes the memory
 * bandwidth for it. */
#define RATE_MIN_BYTES (64 << 10)
/* A device span less its marks' cost (device_walks) keeps at least this
 * share of itself: a kernel is never free (5 %, the GEMM points' floor in
 * fit) */
#define SPAN_FLOOR 0.05
/* A device's ops fitted to their bytes: flops_per_s so high that the
 * simulator's FLOPs term (FLOPs over the rate, the dtype's peak without
 * one) never exceeds the fitted line, which is the measured time
 * (gpt2-tiny's cross_entropy_fused on the emulator: its FLOPs over the
 * fastest GEMM's rate were twice its measured time). */
#define NO_FLOPS_BOUND 1e18

static int by_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, by_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Least squares of y = a + b x; a single x: a = a0, b from the mean. */
static void fit_line(const double *x, const double *y, int n, double a0, double *a, double *b)
{
	double sx = 0, sy = 0, sxx = 0, sxy = 0;
	for (int i = 0; i < n; i++) {
		sx += x[i];
		sy += y[i];
		sxx += x[i] * x[i];
		sxy += x[i] * y[i];
	}
	double d = n * sxx - sx * sx;
	if (n >= 2 && d > 1e-12 * sxx * n) {
		*b = (n * sxy - sx * sy) / d;
		*a = (sy - *b * sx) / n;
		if (*a >= 0 && *b > 0)
			return;
	}
	*a = a0; /* through the overhead */
	*b = 0;
	for (int i = 0; i < n; i++)
		*b += fmax(y[i] - a0, 1e-9 * y[i]) / x[i];
	*b /= n;
}

static int64_t numel(const DpStep *s, int t)
{
	return t < 0 ? 0 : exec_numel(&s->tensors[t]);
}

static double io_bytes(const DpStep *s, const DpInstr *in)
{
	double b = 0;
	for (int k = 0; k < DP_MAX_IN; k++)
		if (in->in[k] >= 0)
			b += (double)exec_tensor_bytes(s, in->in[k]);
	if (in->out >= 0)
		b += (double)exec_tensor_bytes(s, in->out) * (1 + dp_reads_out(in));
	return b;
}

/* m, n, k of a GEMM instruction (out = op(in0) op(in1), rows by columns). */
static void gemm_mnk(const DpStep *s, const DpInstr *in, double *m, double *n, double *k)
{
	const DpTensor *o = &s->tensors[in->out], *a = &s->tensors[in->in[0]];
	double cols = (double)o->dims[o->ndim - 1], rows = (double)numel(s, in->out) / cols;
	double acols = (double)a->dims[a->ndim - 1], arows = (double)numel(s, in->in[0]) / acols;
	if (in->op == DP_OP_LINEAR_GELU)
		rows /= 2;
	*m = rows;
	*n = cols;
	*k = (in->op == DP_OP_MATMUL || in->op == DP_OP_MATMUL_GELU_GRAD) && DP_ATTR(in, MATMUL, transA)
		     ? arows : acols;
}

/* The time of each STEP kernel (t[i]; -1: not a kernel), from REPS walks
 * of them all in program order (kernels back to back as a step runs them):
 * on each rank its median over the walks, then the largest of the ranks'
 * medians: the ranks meet at every collective, so a step goes at its
 * slowest rank's pace, and on shared cores one rank can be slower
 * throughout (mpirun binds rank 0 of every job to core 0: llama at tp=2
 * here, one step, rank 0's kernels 733 ms, rank 1's 283 ms, rank 1 waiting
 * 742 ms for it).
 * The median, not the mean (as before 2026-11-28): on a loaded machine a
 * walk loses the core for a time slice (4 to 20 ms here) now and then, and
 * the mean gave that whole slice to the one kernel it fell on, which the
 * fit turned into the op's rate and the simulator charged at every size
 * and call (mlp at 2 ranks, calibrated with its ddp step file: linear's
 * 8 instructions predicted at 7.0 ms a step against 0.55 ms in the
 * measured step's trace). A kernel shorter than a time slice keeps its
 * walk median in a step, the slices falling in the waits where a rank
 * yields its core (world_waitall): mlp at 2 ranks, load average 17,
 * linear 0.55 ms predicted against 0.58 to 0.70 measured, matmul 0.47
 * against 0.40 to 0.59. Longer ones do lose slices in a step too
 * (gpt2-tiny's matmuls at load 18: 4.3 ms predicted, 12.7 and 16.6 ms
 * measured on its two ranks), which the median leaves out, so at loads of
 * many processes per core every prediction is low (docs/SIMULATE.md).
 * Spreading each walk's lost time over its kernels by their medians (the
 * mean walk over their sum) did not carry that either: the factor came
 * out 1.07 on one rank and 4.9 on the other, and the 2-rank validation
 * was worse with it (MAPE 87.9 and 36.6 % against the median's 42.8 and
 * 33.4 %, calibrated back to back). */
static int time_kernels(Exec *x, double *t, RtErr *e)
{
	const DpStep *s = x->s;
	uint32_t n = s->nprog[DP_PROG_STEP];
	double *v = calloc((size_t)REPS * ((size_t)n + 1), sizeof *v); /* v[r * n + i] */
	double *mine = calloc(2 * ((size_t)n + 1), sizeof *mine), *cnt = mine + n + 1;
	double *all = calloc((size_t)n + 1, sizeof *all), w[REPS];
	if (!v || !mine || !all) {
		free(v);
		free(mine);
		free(all);
		return RT_FAIL(e, "out of memory");
	}
	for (int r = -1; r < REPS; r++) { /* the first walk warms */
		MPI_Barrier(MPI_COMM_WORLD);
		for (uint32_t i = 0; i < n; i++) {
			const DpInstr *in = &s->prog[DP_PROG_STEP][i];
			/* pp > 1: a stage's kernels on its own ranks, where its data are */
			if (dp_op_class(in->op) != DP_OPC_KERNEL ||
			    (in->stage1 && dp_instr_stage(in) != x->pp_stage))
				continue;
			double t0 = MPI_Wtime();
			if (exec_run_kernel(x, DP_PROG_STEP, i, e) < 0) {
				free(v);
				free(mine);
				free(all);
				return -1;
			}
			if (r >= 0) {
				v[(size_t)r * n + i] = MPI_Wtime() - t0;
				cnt[i] = 1;
			}
		}
	}
	for (uint32_t i = 0; i < n; i++) { /* this rank's median, 0 where it ran none */
		if (!cnt[i])
			continue;
		for (int r = 0; r < REPS; r++)
			w[r] = v[(size_t)r * n + i];
		mine[i] = median(w, REPS);
	}
	MPI_Allreduce(mine, t, (int)n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	MPI_Allreduce(cnt, all, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	for (uint32_t i = 0; i < n; i++)
		t[i] = all[i] > 0 ? t[i] : -1;
	free(v);
	free(mine);
	free(all);
	return 0;
}

/* Start one collective as comm_mpi.c does (non-blocking, all_reduce in
 * place) and complete it as every wait of the runtime is completed
 * (world_waitall: MPI_Testall with sched_yield, then back-off sleeps). */
static int one_collective(int kind, float *a, float *b, int cnt, int part, RtErr *e)
{
	MPI_Request req;
	int rc = kind == 0 ? MPI_Iallreduce(MPI_IN_PLACE, b, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req)
		 : kind == 1 ? MPI_Iallgather(a, part, MPI_FLOAT, b, part, MPI_FLOAT, MPI_COMM_WORLD, &req)
			     : MPI_Ireduce_scatter_block(a, b, part, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
	if (rc != MPI_SUCCESS)
		return RT_FAIL(e, "--calibrate: a non-blocking collective failed to start");
	return world_waitall(1, &req, 0, "--calibrate's collectives", NULL, e);
}

/* alpha and busbw of the world's collectives, issued and waited for as a
 * step issues and waits for them: MPI_Iallreduce, MPI_Iallgather and
 * MPI_Ireduce_scatter_block (Open MPI's libnbc, not the blocking calls'
 * coll/tuned algorithms), each completed by world_waitall's polling, which
 * yields the core to the other ranks (on oversubscribed cores a collective's
 * every round waits for its peers to be scheduled: that is its alpha here).
 * 4 KiB to 8 MiB: a step's collectives run from a few bytes (a norm's
 * partial sums) to a bucket, and the small ones set the alpha. */
static int time_collectives(int world, MachLink *l, RtErr *e)
{
	enum { NSIZE = 5 };
	static const int64_t sizes[NSIZE] = {4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20};
	double x[3 * NSIZE], y[3 * NSIZE], v[REPS];
	int n = 0;
	float *a = malloc((size_t)(8 << 20)), *b = malloc((size_t)(8 << 20));
	if (world < 2 || !a || !b) { /* nothing moves between ranks of one */
		*l = (MachLink){0, 1e15};
		free(a);
		free(b);
		return 0;
	}
	memset(a, 0, (size_t)(8 << 20));
	memset(b, 0, (size_t)(8 << 20));
	for (int kind = 0; kind < 3; kind++)
		for (int s = 0; s < NSIZE; s++) {
			int cnt = (int)(sizes[s] / 4), part = cnt / world;
			for (int r = -1; r < REPS; r++) {
				MPI_Barrier(MPI_COMM_WORLD);
				double t0 = MPI_Wtime();
				if (one_collective(kind, a, b, cnt, part, e) < 0) {
					free(a);
					free(b);
					return -1;
				}
				double mine = MPI_Wtime() - t0, slow;
				MPI_Allreduce(&mine, &slow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
				if (r >= 0)
					v[r] = slow;
			}
			double f = (kind == 0 ? 2.0 : 1.0) * (world - 1) / world;
			x[n] = f * (double)part * world * 4;
			y[n++] = median(v, REPS);
		}
	double alpha, inv;
	fit_line(x, y, n, 0, &alpha, &inv);
	*l = (MachLink){alpha, 1 / inv};
	free(a);
	free(b);
	return 0;
}

/* pp > 1: alpha and bandwidth of a pipeline transfer, one way between
 * neighbouring stages: each rank of an even stage and the same rank of the
 * next stage (pp outermost: per_stage ranks on) ping-pong 64 KiB to 8 MiB,
 * all pairs at once as a pipeline's transfers run, 5 times each (median
 * of the slowest pair's half round trip), fitted as the collectives are. */
static void time_p2p(int rank, int world, int pp, MachLink *l)
{
	enum { NSIZE = 4 };
	static const int64_t sizes[NSIZE] = {64 << 10, 512 << 10, 2 << 20, 8 << 20};
	double x[NSIZE], y[NSIZE], v[REPS];
	int per_stage = world / pp, stage = rank / per_stage;
	int peer = stage % 2 == 0 && stage + 1 < pp ? rank + per_stage : stage % 2 ? rank - per_stage : -1;
	char *buf = calloc(1, (size_t)(8 << 20));
	if (!buf) {
		*l = (MachLink){0, 1e15};
		return;
	}
	for (int s = 0; s < NSIZE; s++) {
		int cnt = (int)sizes[s];
		for (int r = -1; r < REPS; r++) {
			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = MPI_Wtime();
			if (peer >= 0 && stage % 2 == 0) {
				MPI_Send(buf, cnt, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
				MPI_Recv(buf, cnt, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else if (peer >= 0) {
				MPI_Recv(buf, cnt, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(buf, cnt, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
			}
			double mine = (MPI_Wtime() - t0) / 2, slow;
			MPI_Allreduce(&mine, &slow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
			if (r >= 0)
				v[r] = slow;
		}
		x[s] = (double)cnt;
		y[s] = median(v, REPS);
	}
	double alpha, inv;
	fit_line(x, y, NSIZE, 0, &alpha, &inv);
	*l = (MachLink){alpha, 1 / inv};
	free(buf);
}

static int add_op(Machine *m, const char *name)
{
	for (int i = 0; i < m->nops; i++)
		if (!strcmp(m->ops[i].op, name))
			return i;
	MachOp *o = realloc(m->ops, sizeof *o * (size_t)(m->nops + 1));
	if (!o)
		return -1;
	m->ops = o;
	m->ops[m->nops] = (MachOp){.op = strdup(name)};
	return m->ops[m->nops].op ? m->nops++ : -1;
}

static int add_gemm(Machine *m, MachGemm p)
{
	for (int i = 0; i < m->ngemm; i++)
		if (m->gemm[i].dtype == p.dtype && m->gemm[i].m == p.m && m->gemm[i].n == p.n &&
		    m->gemm[i].k == p.k) {
			m->gemm[i] = p;
			return 0;
		}
	MachGemm *g = realloc(m->gemm, sizeof *g * (size_t)(m->ngemm + 1));
	if (!g)
		return -1;
	m->gemm = g;
	m->gemm[m->ngemm++] = p;
	return 0;
}

/* FLOPs of an attention instruction as the cost rules count them
 * (ir/ops.c: ir_cost_attention, ir_cost_attention_grad; the simulator
 * divides the same figure by the rate fitted here), 0 for another op. */
static double attention_flops(const DpStep *s, const DpInstr *in)
{
	if (!dp_op_is_attention(in->op))
		return 0;
	int fwd = in->op == DP_OP_ATTENTION || in->op == DP_OP_ATTENTION_CP, nin = 0;
	for (int k = 0; k < DP_MAX_IN; k++)
		nin += in->in[k] >= 0;
	const DpTensor *qkv = &s->tensors[in->in[fwd ? 0 : 1]];
	int64_t h = DP_ATTR(in, ATTENTION, heads);
	double heads = h > 0 ? (double)h : 1, bh = (double)qkv->dims[0] * heads;
	double t = (double)qkv->dims[1], hd = (double)qkv->dims[2] / 3 / heads;
	int64_t cp = nin > 2 ? DP_ATTR(in, ATTENTION_CP, cp) : 1;
	double tk = t * (cp > 1 ? (double)cp : 1);
	return fwd ? 2 * bh * t * tk * hd + 5 * bh * t * tk / 2
		   : 5 * bh * t * tk * hd + 10 * bh * t * tk / 2;
}

/* The dtype of an instruction's op line (util/machine.h): "bf16" when any
 * operand is a 16-bit float, else "f32"; passes/simulate.c's line_dtype is
 * the same rule on the graph. */
static int line_dtype(const DpStep *s, const DpInstr *in)
{
	int half = in->out >= 0 && dp_is_half(s->tensors[in->out].dtype);
	for (int k = 0; k < DP_MAX_IN; k++)
		half |= in->in[k] >= 0 && dp_is_half(s->tensors[in->in[k]].dtype);
	return half ? MACH_BF16 : MACH_F32;
}

/* An op's line of one dtype from its k instructions measured now (x: bytes,
 * or FLOPs where flops; y: seconds; kd: each one's kernel kind, an index in
 * l->kinds, or -1 for an op of one kernel) and the points an earlier
 * calibration left in it: one point per kind and x, the median of this
 * run's instructions at it, replacing an earlier point of the same kind and
 * x (points of the other basis are dropped), then the line refitted as
 * fit() says over the points of the op's general kernel (kind 0, and those
 * without a kind) where it has some, else over all: a paired bias_grad's
 * ~1.5 us at any size is no bytes rate (format/kernel_kind.c). xs, ys and
 * kd are reordered. */
static int fit_line_points(MachLine *l, double *xs, double *ys, int *kd, int k, int flops,
			   double over, int device, int general)
{
	int old = l->by_flops == flops ? l->npts : 0, np = 0;
	double *xt = malloc(sizeof *xt * 2 * ((size_t)(old + k) + 1));
	int *kt = malloc(sizeof *kt * ((size_t)(old + k) + 1));
	double *px = malloc(sizeof *px * ((size_t)(old + k) + 1));
	double *py = malloc(sizeof *py * ((size_t)(old + k) + 1));
	if (!xt || !kt || !px || !py) {
		free(xt);
		free(kt);
		free(px);
		free(py);
		return -1;
	}
	if (old) { /* (a line without points has pts NULL) */
		memcpy(xt, l->pts, sizeof *xt * 2 * (size_t)old);
		memcpy(kt, l->kind, sizeof *kt * (size_t)old);
	}
	for (int i = 0; i < k; i++) { /* sort this run's by kind and x: equal ones together */
		for (int j = i; j > 0 && (kd[j] < kd[j - 1] || (kd[j] == kd[j - 1] && xs[j] < xs[j - 1]));
		     j--) {
			double a = xs[j], b = ys[j];
			int c = kd[j];
			xs[j] = xs[j - 1];
			ys[j] = ys[j - 1];
			kd[j] = kd[j - 1];
			xs[j - 1] = a;
			ys[j - 1] = b;
			kd[j - 1] = c;
		}
	}
	for (int i = 0, j; i < k; i = j) {
		for (j = i; j < k && xs[j] == xs[i] && kd[j] == kd[i]; j++)
			;
		xt[2 * (old + np)] = xs[i];
		xt[2 * (old + np) + 1] = median(ys + i, j - i);
		kt[old + np] = kd[i];
		np++;
	}
	int rc = machine_line_points(l, xt, kt, old + np);
	free(xt);
	free(kt);
	if (rc < 0) {
		free(px);
		free(py);
		return -1;
	}
	l->given = 1;
	l->by_flops = flops;
	double largest = 0;
	int nfit = 0;
	for (int pass = 0; pass < 2 && !nfit; pass++)
		for (int j = 0; j < l->npts; j++)
			if (pass || l->kind[j] < 0 || l->kind[j] == general) {
				px[nfit] = l->pts[2 * j];
				py[nfit] = l->pts[2 * j + 1];
				largest = fmax(largest, px[nfit++]);
			}
	l->flops_per_s = l->bytes_per_s = 0;
	if (!flops && largest < RATE_MIN_BYTES) { /* all overhead: its time, no rate */
		l->overhead_s = median(py, nfit);
	} else {
		double a, b;
		fit_line(px, py, nfit, over, &a, &b);
		l->overhead_s = a;
		if (flops) {
			l->flops_per_s = 1 / b;
		} else {
			l->bytes_per_s = 1 / b;
			if (device) /* its line is its time: no FLOPs term above it */
				l->flops_per_s = NO_FLOPS_BOUND;
		}
	}
	free(px);
	free(py);
	return 0;
}

/* Fill m from the timings t of s's STEP kernels. over is the fixed time
 * inside each measured t and what the simulator adds to every kernel
 * (kernel_overhead_s: the CPU's walk and fork, the fastest kernel's time;
 * a device's 0: a CUDA-event span holds no launch, and the graph's cost
 * is node_overhead_s); an op's fitted overhead_s, which replaces it in the
 * simulator, is its intercept. device: the attention ops are fitted to
 * their FLOPs (time = overhead + FLOPs / rate, flops_per_s), not their
 * bytes: on a GPU (flash-style kernels: the scores never leave the SM)
 * their time grows with the context squared, their bytes with the context
 * (docs/SIMULATE.md), where on the CPU the bytes line is the validated
 * one; and the memory bandwidth and the bytes lines' NO_FLOPS_BOUND are
 * the device's (below). */
static int fit(Machine *m, const DpStep *s, const double *t, double over, int device)
{
	const DpInstr *prog = s->prog[DP_PROG_STEP];
	uint32_t n = s->nprog[DP_PROG_STEP];
	m->kernel_overhead_s = over;
	double *xs = malloc(sizeof(double) * (n + 1)), *ys = malloc(sizeof(double) * (n + 1));
	double *rates = malloc(sizeof(double) * ((size_t)(MACH_NDTYPE + 1) * (size_t)m->nops + DP_NOPS * MACH_NDTYPE + 1));
	int *kinds = malloc(sizeof(int) * (n + 1)), *kd = malloc(sizeof(int) * (n + 1));
	if (!xs || !ys || !rates || !kinds || !kd) {
		free(xs);
		free(ys);
		free(rates);
		free(kinds);
		free(kd);
		return -1;
	}
	int nrates = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (t[i] < 0 || !dp_op_is_gemm(prog[i].op))
			continue;
		MachGemm p;
		gemm_mnk(s, &prog[i], &p.m, &p.n, &p.k);
		p.dtype = s->tensors[prog[i].in[0]].dtype == DP_BF16 ? MACH_BF16 : MACH_F32;
		p.flops_per_s = 2 * p.m * p.n * p.k / fmax(t[i] - over, 0.05 * t[i]);
		if (add_gemm(m, p) < 0)
			goto oom;
	}
	dp_kernel_kinds(s, DP_PROG_STEP, kinds);
	for (unsigned op = 0; op < DP_NOPS; op++)
		for (int d = 0; d < MACH_NDTYPE && !dp_op_is_gemm(op); d++) {
			int k = 0, flops = device && dp_op_is_attention(op), at = -1, general = -1;
			for (uint32_t i = 0; i < n; i++)
				if (t[i] >= 0 && prog[i].op == op && line_dtype(s, &prog[i]) == d &&
				    io_bytes(s, &prog[i]) > 0) {
					xs[k] = flops ? attention_flops(s, &prog[i]) : io_bytes(s, &prog[i]);
					kd[k] = -1;
					ys[k++] = t[i];
				}
			if (!k)
				continue;
			if ((at = add_op(m, dp_op_names[op])) < 0)
				goto oom;
			/* an op of several kernels: each point keyed by its kernel's kind
			 * (format/kernel_kind.c), which the simulator works out alike */
			MachLine *l = &m->ops[at].line[d];
			if (dp_kernel_kind_name(op, 0)) {
				general = machine_line_kind(l, dp_kernel_kind_name(op, 0));
				for (uint32_t i = 0, j = 0; i < n && general >= 0; i++)
					if (t[i] >= 0 && prog[i].op == op && line_dtype(s, &prog[i]) == d &&
					    io_bytes(s, &prog[i]) > 0 &&
					    (kd[j++] = machine_line_kind(l, dp_kernel_kind_name(op, kinds[i]))) < 0)
						general = -1;
				if (general < 0)
					goto oom;
			}
			if (fit_line_points(l, xs, ys, kd, k, flops, over, device, general) < 0)
				goto oom;
		}
	/* the memory bandwidth: what a kernel without a line of its own moves
	 * at, and the bytes term of the GEMMs' roofline. The CPU: the ops'
	 * median. A device: their largest, the roofline's ceiling: a GPU's
	 * small kernels (gpt2-tiny's) reach a fraction of its bandwidth, and
	 * their median as the GEMMs' bytes term put gpt2-tiny's measured GEMM
	 * points (2.6 ms of matmuls on the emulator) at 622 ms. Over every
	 * bytes line of the file (each op and dtype, this run's and those it
	 * kept: a bf16 calibration into an f32 file, bf16 kernels
	 * being 3 to 40x slower per byte on these CPUs, gave the file its
	 * median of a bf16 step's lines alone, 0.95 against 16.5 GB/s, and the
	 * f32 step's GEMMs that for their bytes term: 3.6 ms predicted became
	 * 5.5) */
	for (int i = 0; i < m->nops; i++)
		for (int d = 0; d <= MACH_NDTYPE; d++)
			if (m->ops[i].line[d].bytes_per_s > 0)
				rates[nrates++] = m->ops[i].line[d].bytes_per_s;
	if (nrates && device) {
		m->memory_bw = 0;
		for (int i = 0; i < nrates; i++)
			m->memory_bw = fmax(m->memory_bw, rates[i]);
	} else if (nrates) {
		m->memory_bw = median(rates, nrates);
	}
	for (int d = 0; d < MACH_NDTYPE; d++)
		for (int i = 0; i < m->ngemm; i++)
			if (m->gemm[i].dtype == d)
				m->peak_flops[d] = fmax(m->peak_flops[d], m->gemm[i].flops_per_s);
	if (m->peak_flops[MACH_BF16] <= 0)
		m->peak_flops[MACH_BF16] = m->peak_flops[MACH_F32];
	if (m->peak_flops[MACH_F32] <= 0) /* a bf16 step file: its GEMMs are all bf16 */
		m->peak_flops[MACH_F32] = m->peak_flops[MACH_BF16];
	free(xs);
	free(ys);
	free(rates);
	free(kinds);
	free(kd);
	return 0;
oom:
	free(xs);
	free(ys);
	free(rates);
	free(kinds);
	free(kd);
	return -1;
}

/* ---- on a device (a backend that is not BACKEND_INLINE: CUDA) ---- */

/* What the device calibration measured besides the kernels, for its line. */
typedef struct {
	uint32_t replays;   /* step replays before each walk */
	double gap_share;   /* the last walk's device gaps over its span */
	double replay_s;    /* a replayed step's wall time */
	double mark_s;      /* the cost of a span's two marks, taken from each kernel's */
	double kernels_s;   /* the kernels' device time in a step, less those */
	double over_raw;    /* node_overhead_s before its floor at 0 */
	double launch_s;    /* where that is < 0: taken from each kernel's span besides the marks */
	double nodes;       /* instructions a step runs (kernels, loads, shards) */
	int ncoll;          /* collectives timed */
} DevFigures;

/* What a device walk measured besides the instructions. */
typedef struct {
	double mark_s;    /* a span's two marks, the slowest rank's median empty span */
	double gap_share; /* the last walk's device gaps over its span (this rank's) */
	double span_s;    /* the last walk's span, gaps and empty spans included */
} WalkFigures;

/* Times of STEP instructions idx[0..n) on the device (exec_time_instrs),
 * REPS walks after a warm one, every rank at once: t[idx[j]] = the slowest
 * rank's median, in seconds, less what a span's two marks cost (the rest
 * of t as it was). That cost is measured in the same walks: an empty span
 * (EXEC_TIME_EMPTY: two marks with nothing between them, on the same
 * stream) after each instruction, its median over every walk (w->mark_s);
 * an instruction keeps at least SPAN_FLOOR of its span. replays: replays
 * of the step before each walk. */
static int device_walks(Exec *x, const uint32_t *idx, uint32_t n, uint32_t replays, double *t,
			WalkFigures *w, RtErr *e)
{
	uint32_t np = x->s->nprog[DP_PROG_STEP], n2 = 2 * n;
	uint32_t *both = malloc(sizeof *both * ((size_t)n2 + 1));
	float *ms = malloc(sizeof *ms * ((size_t)n2 + 1)), *gap = malloc(sizeof *gap * ((size_t)n2 + 1));
	double *v = malloc(sizeof *v * ((size_t)REPS * n2 + 1)), *mine = calloc(2 * ((size_t)np + 2), sizeof *mine);
	double *slow = mine + np + 2;
	double reps[REPS];
	int rc = 0;
	if (!both || !ms || !gap || !v || !mine)
		rc = RT_FAIL(e, "out of memory");
	for (uint32_t j = 0; rc == 0 && j < n; j++) { /* each instruction, then an empty span */
		both[2 * j] = idx[j];
		both[2 * j + 1] = EXEC_TIME_EMPTY;
	}
	for (int r = -1; rc == 0 && r < REPS; r++) { /* the first walk warms */
		MPI_Barrier(MPI_COMM_WORLD);
		rc = exec_time_instrs(x, DP_PROG_STEP, both, n2, replays, ms, gap, e);
		for (uint32_t j = 0; rc == 0 && r >= 0 && j < n2; j++)
			v[(size_t)r * n2 + j] = 1e-3 * ms[j];
	}
	if (rc == 0) {
		double busy = 0, idle = 0;
		for (uint32_t j = 0; j < n2; j++) {
			busy += ms[j];
			idle += gap[j];
		}
		w->gap_share = busy + idle > 0 ? idle / (busy + idle) : 0;
		w->span_s = 1e-3 * (busy + idle);
		for (uint32_t j = 0; j < n; j++) {
			for (int r = 0; r < REPS; r++)
				reps[r] = v[(size_t)r * n2 + 2 * j];
			mine[idx[j]] = median(reps, REPS);
		}
		/* the marks' cost: the median of every walk's empty spans, gathered
		 * into v's front (the instructions' medians are taken), then
		 * taken from each instruction's */
		for (size_t j = 0; j < (size_t)REPS * n; j++)
			v[j] = v[2 * j + 1];
		double marks = n ? median(v, REPS * (int)n) : 0;
		mine[np + 1] = marks;
		for (uint32_t j = 0; j < n; j++)
			mine[idx[j]] = fmax(mine[idx[j]] - marks, SPAN_FLOOR * mine[idx[j]]);
		MPI_Allreduce(mine, slow, (int)np + 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		w->mark_s = slow[np + 1];
		for (uint32_t j = 0; j < n; j++)
			t[idx[j]] = slow[idx[j]];
	}
	free(both);
	free(ms);
	free(gap);
	free(v);
	free(mine);
	return rc;
}

/* 1: instruction i of the step program runs in the step now (its flags
 * against the step's path: compression's two, pp's stage) and how many
 * times a step runs it (*count: grad_accum walks, once for the DP_IF_LAST
 * and DP_IF_FIRST parts or an unrolled program). */
static int runs_in_step(const Exec *x, const DpInstr *in, double *count)
{
	const DpStep *s = x->s;
	if ((in->flags & DP_IF_COMPRESSED && x->step < s->cfg.compress_start) ||
	    (in->flags & DP_IF_PLAIN && x->step >= s->cfg.compress_start) ||
	    (in->stage1 && dp_instr_stage(in) != x->pp_stage))
		return 0;
	double walks = dp_step_unrolled(&s->cfg) ? 1 : s->cfg.grad_accum ? s->cfg.grad_accum : 1;
	*count = in->flags & (DP_IF_LAST | DP_IF_FIRST) ? 1 : walks;
	return 1;
}

/* The device's kernels (t[i], seconds; -1: not timed) and, at world > 1,
 * the step's collectives (link: alpha and busbw fitted to them), then the
 * kernel overhead a graph replay adds per instruction (*over). The
 * method and why: docs/SIMULATE.md, "Calibrating a GPU". */
static int time_device(Exec *x, int world, double *t, MachLink *link, double *over,
		       DevFigures *fig, RtErr *e)
{
	const DpStep *s = x->s;
	const DpInstr *prog = s->prog[DP_PROG_STEP];
	uint32_t np = s->nprog[DP_PROG_STEP], nk = 0, nc = 0;
	uint32_t *idx = malloc(sizeof *idx * ((size_t)np + 1)), *cidx = malloc(sizeof *cidx * ((size_t)np + 1));
	double *ct = calloc((size_t)np + 1, sizeof *ct), cnt;
	double *xs = malloc(sizeof *xs * ((size_t)np + 1)), *ys = malloc(sizeof *ys * ((size_t)np + 1));
	int rc = 0;
	if (!idx || !cidx || !ct || !xs || !ys) {
		rc = RT_FAIL(e, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < np; i++) {
		const DpInstr *in = &prog[i];
		t[i] = -1;
		if (!runs_in_step(x, in, &cnt))
			continue;
		if (dp_op_class(in->op) == DP_OPC_KERNEL && !dp_runs_on_host(s, in))
			idx[nk++] = i;
		if ((in->op == DP_OP_ALL_REDUCE || in->op == DP_OP_TP_REDUCE ||
		     in->op == DP_OP_ALL_GATHER || in->op == DP_OP_REDUCE_SCATTER) &&
		    !(in->op == DP_OP_ALL_REDUCE && DP_ATTR(in, ALL_REDUCE, stages)) &&
		    comm_group_size(x->comm, (unsigned)DP_AXES(in)) > 1)
			cidx[nc++] = i;
	}
	/* a replayed step's wall time (as dpexec runs steps: up to two in
	 * flight), on the slowest rank */
	uint64_t k = x->step + 1;
	double t0 = MPI_Wtime();
	if ((rc = exec_step(x, k++, e)) != 0)
		goto out;
	double one = MPI_Wtime() - t0;
	int steps = one > 0 ? (int)fmin(50, fmax(5, 0.5 / one)) : 50; /* about 0.5 s */
	MPI_Bcast(&steps, 1, MPI_INT, 0, MPI_COMM_WORLD);
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int j = 0; j < steps; j++)
		if ((rc = exec_step_launch(x, k++, e)) != 0)
			goto out;
	if ((rc = exec_step_wait(x, e)) != 0)
		goto out;
	double mine = (MPI_Wtime() - t0) / steps, slow;
	MPI_Allreduce(&mine, &slow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	fig->replay_s = slow;
	/* a walk of the kernels with nothing before it: its span (kernels, the
	 * empty spans and the gaps where the device waited for the host) */
	WalkFigures w = {0}, cw;
	if ((rc = device_walks(x, idx, nk, 0, t, &w, e)) != 0)
		goto out;
	/* where the device waited for the host (kernels shorter than their
	 * launch), the walks again behind replays of the step graph: a replay
	 * is one launch for the host and a whole step for the device, so R
	 * replays of 1.5 x the walk's span let the host enqueue the walk while
	 * the device still runs them, and each kernel is timed from its own
	 * start (at most 0.5 s of replays a walk, 100 replays; the same R on
	 * every rank: the graph holds the step's collectives) */
	int r = 0;
	if (w.gap_share > 0.05 && x->captured && x->be.ops->replay && slow > 0)
		r = (int)fmin(fmin(100, ceil(0.5 / slow)), ceil(1.5 * w.span_s / slow));
	MPI_Allreduce(MPI_IN_PLACE, &r, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	fig->replays = (uint32_t)r;
	if (r > 0 && (rc = device_walks(x, idx, nk, (uint32_t)r, t, &w, e)) != 0)
		goto out;
	fig->gap_share = w.gap_share;
	fig->mark_s = w.mark_s;
	/* the step's own collectives, at their sizes, one after another on the
	 * comm stream: alpha + bus bytes / busbw by least squares */
	*link = (MachLink){0, 1e15};
	fig->ncoll = (int)nc;
	if (world > 1 && nc) {
		if ((rc = device_walks(x, cidx, nc, fig->replays, ct, &cw, e)) != 0)
			goto out;
		for (uint32_t j = 0; j < nc; j++) {
			const DpInstr *in = &prog[cidx[j]];
			int ranks = comm_group_size(x->comm, (unsigned)DP_AXES(in));
			double f = in->op == DP_OP_ALL_REDUCE || in->op == DP_OP_TP_REDUCE
					   ? 2.0 * (ranks - 1) / ranks : (double)(ranks - 1) / ranks;
			xs[j] = f * (double)exec_tensor_bytes(s, in->op == DP_OP_REDUCE_SCATTER ? in->in[0]
												: in->out);
			ys[j] = ct[cidx[j]];
		}
		double alpha, inv;
		fit_line(xs, ys, (int)nc, 0, &alpha, &inv);
		*link = (MachLink){alpha, 1 / inv};
	}
	/* the graph's overhead: the replayed step's wall time less the device
	 * time of its kernels (and at world > 1 of its collectives, taken as
	 * not overlapped), over the instructions it runs (kernels, loads,
	 * shards: what the simulator charges the overhead to) */
	double kern = 0, coll = 0, nodes = 0, timed = 0;
	for (uint32_t i = 0; i < np; i++) {
		const DpInstr *in = &prog[i];
		int cls = dp_op_class(in->op);
		if (!runs_in_step(x, in, &cnt))
			continue;
		if (cls == DP_OPC_KERNEL || cls == DP_OPC_LOAD || cls == DP_OPC_SHARD)
			nodes += cnt;
		if (t[i] > 0) {
			kern += cnt * t[i];
			timed += cnt;
		}
		if (world > 1 && nc && ct[i] > 0 && dp_op_class(in->op) == DP_OPC_COLLECTIVE)
			coll += cnt * ct[i];
	}
	fig->kernels_s = kern + coll;
	fig->nodes = nodes;
	fig->over_raw = nodes > 0 ? (slow - kern - coll) / nodes : 0;
	*over = fmax(0, fig->over_raw);
	/* the replayed step shorter than its kernels' spans: each span still
	 * holds what an eager launch costs the device beside its kernel (the
	 * dispatch from the stream's queue, which a graph's node does not pay).
	 * On the H200 (2026-11-28, 6 step files) after the marks' 1.31 us that
	 * was a further 1.7 to 2.1 us a span, nearly constant, and the small
	 * models were predicted 29 to 49 % high. Taken from every timed kernel
	 * alike (each keeping SPAN_FLOOR of its span), so that they add up to
	 * the replayed step less its collectives: the GEMM points and op lines
	 * are then fitted to a kernel's time in a replay */
	fig->launch_s = 0;
	if (fig->over_raw < 0 && timed > 0) {
		double d = (kern + coll - slow) / timed, after = 0;
		for (uint32_t i = 0; i < np; i++)
			if (t[i] > 0 && runs_in_step(x, &prog[i], &cnt)) {
				t[i] = fmax(t[i] - d, SPAN_FLOOR * t[i]);
				after += cnt * t[i];
			}
		fig->launch_s = d;
		fig->kernels_s = after + coll;
	}
out:
	free(idx);
	free(cidx);
	free(ct);
	free(xs);
	free(ys);
	return rc;
}

int calibrate_run(Exec *x, const char *path, const char *step_path, int rank, int world, RtErr *e)
{
	const DpStep *s = x->s;
	int pp = s->cfg.mesh[DP_AXIS_PP] > 1 ? (int)s->cfg.mesh[DP_AXIS_PP] : 1;
	int device = !(x->be.ops->flags & BACKEND_INLINE);
	if (device && (!x->be.ops->time_mark || !x->be.ops->time_read))
		return RT_FAIL(e, "--calibrate: the %s backend has no device timing", x->be.ops->name);
	if (device && pp > 1)
		return RT_FAIL(e, "--calibrate on the %s backend measures pp = 1 step files (a stage runs "
			       "the same kernels; the p2p link is not measured on a device yet): "
			       "%s has pp = %d", x->be.ops->name, step_path, pp);
	for (uint64_t k = 0; k < 2; k++)
		RT_CHECK(exec_step(x, k, e));
	double *t = malloc(sizeof(double) * ((size_t)s->nprog[DP_PROG_STEP] + 1));
	if (!t)
		return RT_FAIL(e, "out of memory");
	MachLink link, p2p;
	DevFigures fig = {0};
	double over = 0;
	if (device ? time_device(x, world, t, &link, &over, &fig, e) < 0
		   : time_kernels(x, t, e) < 0 || time_collectives(world, &link, e) < 0) {
		free(t);
		return -1;
	}
	if (!device) { /* the fastest kernel's time: the walk and the pool's fork */
		over = INFINITY;
		for (uint32_t i = 0; i < s->nprog[DP_PROG_STEP]; i++)
			if (t[i] >= 0)
				over = fmin(over, t[i]);
		over = isfinite(over) ? over : 0;
	}
	p2p = link;
	if (pp > 1)
		time_p2p(rank, world, pp, &p2p);
	int rc = 0;
	if (rank == 0) {
		Machine m = {0};
		char name[64], err[512], src[1024], host[256] = "";
		snprintf(name, sizeof name, "%s-%d-ranks", device ? x->be.ops->name : "cpu", world);
		gethostname(host, sizeof host - 1);
		/* a file from a calibration at this world size: keep what it has */
		if (access(path, F_OK) == 0 && (machine_load(&m, path, err, sizeof err) < 0 ||
						 strcmp(m.name, name))) {
			machine_free(&m);
			free(t);
			return RT_FAIL(e, "--calibrate: %s is there and is not a machine file of %d rank%s "
				       "to add to (%s)", path, world, world == 1 ? "" : "s",
				       m.name ? m.name : err);
		}
		snprintf(src, sizeof src, "%s%sdpexec --calibrate on %s (the %s backend) at %d rank%s with %s",
			 m.source ? m.source : "", m.source && *m.source ? "; " : "", host,
			 x->be.ops->name, world, world == 1 ? "" : "s", step_path);
		free(m.name);
		free(m.source);
		m.name = strdup(name);
		m.source = strdup(src);
		m.executor = device ? MACH_GPU : MACH_CPU;
		m.ranks_per_node = world;
		m.link[MACH_INTRA] = m.link[MACH_INTER] = link;
		m.link[MACH_P2P] = p2p;
		char *text = NULL, neg[64] = "", launch[96] = "";
		if (device && fig.over_raw < 0) /* the spans still hold more than a replay */
			snprintf(neg, sizeof neg, " (%.2f us, floored at 0)", fig.over_raw * 1e6);
		if (device && fig.launch_s > 0)
			snprintf(launch, sizeof launch, " and a further %.2f us from each kernel's (the "
				 "eager launch)", fig.launch_s * 1e6);
		/* a device: the kernels' own times (no overhead inside a span, none
		 * added), and the graph's per-instruction cost as node_overhead_s,
		 * pooled with the file's over all the instructions measured */
		double n_old = m.node_overhead_n, n_new = device ? fig.nodes : 0;
		if (n_old + n_new > 0) {
			m.node_overhead_s = (m.node_overhead_s * n_old + over * n_new) / (n_old + n_new);
			m.node_overhead_n = n_old + n_new;
		}
		if (!m.name || !m.source || fit(&m, s, t, device ? 0 : over, device) < 0 ||
		    !(text = machine_json(&m))) {
			rc = RT_FAIL(e, "out of memory");
		} else {
			OutFile f;
			if (out_open(&f, path, err, sizeof err) < 0 ||
			    (out_write(&f, text, strlen(text)), out_write(&f, "\n", 1),
			     out_commit(&f, err, sizeof err)) < 0)
				rc = RT_FAIL(e, "--calibrate: %s", err);
			else if (device)
				printf("calibrated %s: %d GEMM shapes, %d ops, graph overhead %.2f us an "
				       "instruction%s (a replayed step %.3f ms, its kernels%s %.3f ms on the "
				       "device after an empty span's %.2f us taken from each span%s, %.0f "
				       "instructions; the file's %.2f us over %.0f), device gaps "
				       "%.1f %% of a walk behind %u step replays, collectives %.1f us + bytes "
				       "at %.2f GB/s (%d timed) -> %s\n",
				       name, m.ngemm, m.nops, over * 1e6, neg, fig.replay_s * 1e3,
				       world > 1 ? " and collectives" : "", fig.kernels_s * 1e3,
				       fig.mark_s * 1e6, launch, fig.nodes,
				       m.node_overhead_s * 1e6, m.node_overhead_n, 100 * fig.gap_share,
				       fig.replays, link.alpha_s * 1e6, link.busbw / 1e9,
				       world > 1 ? fig.ncoll : 0, path);
			else
				printf("calibrated %s: %d GEMM shapes, %d ops, kernel overhead %.1f us, "
				       "collectives %.1f us + bytes at %.2f GB/s, p2p %.1f us + bytes at "
				       "%.2f GB/s%s -> %s\n", name, m.ngemm, m.nops,
				       m.kernel_overhead_s * 1e6, link.alpha_s * 1e6, link.busbw / 1e9,
				       p2p.alpha_s * 1e6, p2p.busbw / 1e9,
				       pp > 1 ? " (measured between stages)" : " (the collectives')",
				       path);
		}
		free(text);
		machine_free(&m);
	}
	free(t);
	return rc;
}
