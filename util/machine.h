/*
 * machine.h - a machine model for `dpc --simulate`: what one rank's
 * kernels and collectives cost on a machine, read from a JSON machine file
 * or a named preset built from published figures (util/machine.c lists
 * them, each citing its sources in its "source" field).
 *
 * The file (every figure in SI units: seconds, bytes, FLOP/s, bytes/s):
 *   name, source        what it is and where its figures come from
 *   executor            "gpu": the compute and comm streams run
 *                       independently on the device, each in order (CUDA
 *                       streams: the comm stream runs one collective at a
 *                       time); "cpu": the streams run inline on the host
 *                       (runtime/cpu/streams.c): a compute kernel holds the
 *                       host, collectives start when the walk reaches them
 *                       and run concurrently, sharing their link
 *   peak_flops          {"f32": R, "bf16": R}: the dense peak, MFU's
 *                       denominator is the bf16 one
 *   gemm                [{"dtype": "f32"|"bf16", "m", "n", "k", "flops_per_s"}]:
 *                       measured GEMM rates; a product's rate is
 *                       interpolated between the points of its dtype:
 *                       between the two nearest that differ from its
 *                       shape on one axis only (the other two within
 *                       1 %), log rate linear in that axis's log, else
 *                       inverse squared distance in log m, n, k
 *   memory_bw           bytes/s of a memory-bound kernel
 *   kernel_overhead_s   added to every kernel (launch, or the pool's fork;
 *                       a GPU's calibration: what a graph replay adds per
 *                       instruction)
 *   node_overhead_s     optional (0): added to every kernel, load and
 *                       shard on top of its own time: what a CUDA Graph
 *                       replay adds per instruction (a GPU's calibration,
 *                       runtime/calibrate.c); node_overhead_n, the
 *                       instructions it was measured over: a later
 *                       calibration into the file pools its figure with it
 *   ops                 {"OP": LINE}: an op's own cost (attention, the
 *                       norms, softmax), replacing the defaults above.
 *                       LINE: {"flops_per_s", "bytes_per_s", "overhead_s",
 *                       "f32": DLINE, "bf16": DLINE}, each field optional;
 *                       the three figures are the op's line for every
 *                       dtype (the presets' form, and every file written
 *                       before 2026-11-28, which so reads as it did),
 *                       "f32" and "bf16" its lines for the instructions of
 *                       that dtype (an instruction is "bf16" when any of
 *                       its operands is a 16-bit float, bf16 or f16, else
 *                       "f32"). DLINE: {"flops_per_s", "bytes_per_s",
 *                       "overhead_s", "fit", "points"}: the line, and the
 *                       calibration's measured points [[x, seconds], ...]
 *                       (x: bytes, or FLOPs where "fit" is "flops"; one
 *                       point per size, the median of its instructions)
 *                       that a later calibration refits with its own; a
 *                       point of an op with several CUDA kernels carries
 *                       its kernel's kind, [x, seconds, "KIND"]
 *                       (format/kernel_kind.c: bias_grad's "paired" and
 *                       "colsum", ...; one point per kind and size): an
 *                       instruction is priced among the points of its own
 *                       kind (by the same rule on the compiled program),
 *                       else among the points without a kind (files
 *                       written before kinds: as they were read), else by
 *                       the line alone; a line with no kind in its points
 *                       prices every instruction as before kinds.
 *                       An instruction takes each figure from its dtype's
 *                       line, else from the op's line for every dtype,
 *                       else the machine's default (overhead_s replaces
 *                       kernel_overhead_s); an op with neither of those
 *                       lines but one of the other dtype takes that one
 *                       (dpc --simulate names such ops). A kernel takes
 *                       overhead + the larger of FLOPs / flops_per_s and
 *                       bytes / bytes_per_s; where its dtype's line has
 *                       points (not a GEMM's: their points are "gemm"),
 *                       the fitted term is the points' piecewise-linear
 *                       interpolation at the kernel's x instead (the
 *                       measured time at a measured size), outside their
 *                       range the line scaled to meet the nearest point
 *   ranks_per_node      ranks that share the intra-node link
 *   intra, inter        {"alpha_s", "busbw"}: a collective over a group
 *                       inside one node, or spanning nodes, takes
 *                       alpha_s + f * bytes / busbw (nccl-tests' bus
 *                       bandwidth: f = 2(n-1)/n for all_reduce, (n-1)/n
 *                       for all_gather and reduce_scatter)
 *   p2p                 {"alpha_s", "busbw"}: a pipeline send or recv
 */
#ifndef DP_MACHINE_H
#define DP_MACHINE_H

#include <stddef.h>

enum { MACH_GPU, MACH_CPU };           /* Machine.executor */
enum { MACH_F32, MACH_BF16, MACH_NDTYPE };
#define MACH_ANY MACH_NDTYPE           /* MachOp.line[MACH_ANY]: every dtype */
enum { MACH_INTRA, MACH_INTER, MACH_P2P, MACH_NLINK };
#define MACH_NKIND 8                   /* kinds of kernel a line's points may name */

typedef struct {
	int dtype;                     /* MACH_F32 / MACH_BF16 */
	double m, n, k, flops_per_s;
} MachGemm;

typedef struct {
	double flops_per_s, bytes_per_s, overhead_s; /* 0: not given (the next line's, the default) */
	int given;                     /* the file has this line */
	int by_flops;                  /* "fit": "flops": the points' x is FLOPs, else bytes */
	double *pts;                   /* npts pairs (x, seconds), by kind then x ascending */
	int *kind;                     /* npts: the point's index in kinds, -1: none (before kinds) */
	int npts;
	char *kinds[MACH_NKIND];       /* the kinds' names ("paired", ...) */
	int nkinds;
} MachLine;

typedef struct {
	char *op;                      /* the op's IR name */
	MachLine line[MACH_NDTYPE + 1]; /* per dtype, and [MACH_ANY] */
} MachOp;

typedef struct {
	double alpha_s, busbw;
} MachLink;

typedef struct {
	char *name, *source;
	int executor;
	double peak_flops[MACH_NDTYPE];
	MachGemm *gemm;
	int ngemm;
	double memory_bw, kernel_overhead_s;
	double node_overhead_s, node_overhead_n; /* 0: none (the CPU's files, the presets) */
	MachOp *ops;
	int nops;
	int ranks_per_node;
	MachLink link[MACH_NLINK];
} Machine;

/* The presets' names, comma-separated ("h100-nvlink, a100-nvlink"). */
const char *machine_presets(void);
/* Loads a preset by name, else the JSON file at spec. 0, or -1 with a
 * one-line message in err (the file and what is wrong in it). */
int machine_load(Machine *m, const char *spec, char *err, size_t errlen);
/* Parses JSON text (what machine_load reads); what names it in messages. */
int machine_parse(Machine *m, const char *text, const char *what, char *err, size_t errlen);
void machine_free(Machine *m);
/* The machine as a JSON machine file (malloc'd text, NULL when out of
 * memory): what machine_parse reads back. */
char *machine_json(const Machine *m);
/* The GEMM rate for an m x k by k x n product of dtype: a point of its
 * shape's rate; else between the two nearest points that differ from it on
 * one axis only, log rate linear in that axis's log; else the table's
 * inverse squared distance in log m, n, k; else the dtype's peak. */
double machine_gemm_rate(const Machine *m, int dtype, double mm, double nn, double kk);
/* The op's own entry, or NULL. */
const MachOp *machine_op(const Machine *m, const char *op);
/* The line an instruction of op and dtype takes its figures from first:
 * its dtype's, else the line for every dtype, else the other dtype's
 * (*borrowed = 1 then, else 0); NULL: none. */
const MachLine *machine_op_line(const Machine *m, const char *op, int dtype, int *borrowed);
/* An instruction's cost figures: each from op's line for dtype, else its
 * line for every dtype, else the other dtype's where the op has neither,
 * else left as given (the machine's defaults). */
void machine_op_figures(const Machine *m, const char *op, int dtype, double *flops_per_s,
			double *bytes_per_s, double *overhead_s);
/* A kernel of op and dtype doing flops and moving bytes: overhead + the
 * larger of flops / rate and bytes / bw, the figures given (the machine's
 * defaults, a GEMM's table rate) replaced by the op's lines' as above, the
 * fitted term by its dtype line's points where it has some and gemm is 0:
 * those of kind (the kernel's kind name, NULL: none) where the line has
 * some, else those without a kind, else none (the line). */
double machine_op_seconds(const Machine *m, const char *op, int dtype, int gemm, double flops,
			  double bytes, double rate, double bw, double overhead, const char *kind);
/* The time at x of a line with points (l->npts > 0), among those of kind
 * (as machine_op_seconds chooses them; none: the line overhead + x / rate):
 * their piecewise-linear interpolation, and outside their range the line
 * scaled to meet the nearest point. */
double machine_points_seconds(const MachLine *l, double x, double overhead, double rate,
			      const char *kind);
/* 1: some op line of m has a point with a kind (the simulator then works
 * out its instructions' kinds). */
int machine_has_kinds(const Machine *m);
/* The index of kind name in l->kinds, added when absent; -1: no room
 * (MACH_NKIND) or no memory. */
int machine_line_kind(MachLine *l, const char *name);
/* Sets l's points to the npts pairs (x, seconds) at xt with their kinds
 * (indices in l->kinds, -1: none; kind NULL: none of them has one), copied,
 * sorted by kind then x, a repeated (kind, x) keeping its last. 0, or -1
 * out of memory. */
int machine_line_points(MachLine *l, const double *xt, const int *kind, int npts);

#endif
