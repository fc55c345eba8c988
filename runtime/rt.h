/*
 * rt.h - dpexec's internal interfaces, one section per source file.
 *
 * Errors: nothing below main() exits or prints-and-dies. A failing call fills
 * an RtErr (the message, and the C file:line where it was raised) and
 * returns -1; callers pass it upward with RT_CHECK. main() prints it once
 * (the first rank that failed; the C location only with --verbose), and on
 * a multi-rank run makes sure no other rank is left waiting in a
 * collective (agreement between steps, else MPI_Abort).
 */
#ifndef DP_RT_H
#define DP_RT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../util/outfile.h"
#include "../format/stepfile.h"

/* ---- errors (runtime/err.c) ---- */

typedef struct {
	char msg[1024];   /* what went wrong, in the user's terms (files, .dp lines, steps) */
	const char *file; /* C source file and line that raised it (--verbose) */
	int line;
	int rank;         /* set once by the bootstrap; -1 before */
	int echo;         /* 1: only says that another rank failed (world_sync); not printed */
	int lost;         /* 1: another rank did not answer in time: no sync can follow */
} RtErr;

int rt_fail(RtErr *e, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
#define RT_FAIL(e, ...) rt_fail((e), __FILE__, __LINE__, __VA_ARGS__)
#define RT_CHECK(x)               \
	do {                      \
		if ((x) != 0)     \
			return -1; \
	} while (0)
/* "PROG: error: MSG" on stderr; verbose adds rank, host and the C file:line. */
void rt_err_print(const char *prog, const RtErr *e, int verbose);

/* ---- OpenBLAS's threads (runtime/blas_env.c) ---- */

/* First thing in main: when OpenBLAS started worker threads (it never uses
 * them in dpexec), execute this program again with OPENBLAS_NUM_THREADS=1;
 * returns when there is nothing to do (or the exec failed). */
void rt_blas_one_thread(char **argv);

/* ---- signals (runtime/signals.c) ---- */

/* Record SIGINT and SIGTERM instead of dying (SIGUSR1 and SIGUSR2, which
 * launchers forward, as SIGINT and SIGTERM); a second one kills at once. */
void sig_install(void);
/* The signal recorded (SIGINT or SIGTERM), 0 if none. */
int sig_pending(void);
const char *sig_name(int sig); /* "SIGTERM" */

/* ---- the run's command line (runtime/command.c) ---- */

/* The command that resumes this run from save_dir, shell-quoted into out:
 * the launcher's words when the parent process is mpirun (else `srun -n N`
 * under Slurm, `mpirun -np N` for several ranks), then argv (dpexec's, as
 * given) without --resume, --init-from and --overwrite, with --resume
 * save_dir (none with --auto-resume, which finds the checkpoint itself).
 * 0, or -1 when it does not fit in len. */
int cmd_resume(int argc, char **argv, int world, const char *save_dir, char *out, size_t len);

/* ---- parameter initialisation (runtime/init.c) ---- */

/*
 * Counter-based init: element i of the full tensor named `name` gets a value
 * that depends only on (seed, name, i), so a tensor is identical whatever the
 * sharding. Fills `count` elements starting at full-tensor element `base`.
 */
void init_fill(DpInit kind, float a, float b, uint64_t seed, const char *name, int64_t base,
	       int64_t count, float *dst);
/* 64-bit hash of a name (FNV-1a), used by init and the sampler. */
uint64_t init_hash_name(const char *name);
/* splitmix64 of x: the counter-based generator's mixing function. */
uint64_t init_mix64(uint64_t x);
/* Dim k of tensor t whole, the size init works on: its per-rank size times
 * every mesh axis that shards it along k. */
int64_t init_whole_dim(const DpStep *s, const DpTensor *t, int k);

/* ---- data sources and the sampler (runtime/data*.c) ---- */

typedef struct DataSet DataSet; /* the loaded sources of one split */

/* Load every source of `split` (IDX, .npy, synthetic) into memory, or open it
 * (llm.c token shards: a glob, each shard's size checked against its header;
 * windows of sample_elems tokens read and widened to int32 when filled),
 * checking dtype, per-sample shape, that all sources have the same sample
 * count and every label against the model's classes. Errors name the data
 * file and the .dp file (dp_file, else the step file's source) and line. */
int data_open(const DpStep *s, DpSplit split, const char *dp_file, int cp_rank, DataSet **out,
	      RtErr *e);
/* The first error of a batch fill since data_open (a shard that shrank, a
 * token outside the vocabulary; the batch got zeros): 0, or -1 with e. */
int data_error(const DataSet *d, RtErr *e);
void data_free(DataSet *d);
int64_t data_count(const DataSet *d); /* samples */
/* The train split must hold at least one global batch (drop_last leaves no
 * step otherwise); call before the first data_fill_train. */
int data_check_batch(const DataSet *d, int64_t global_batch, RtErr *e);

/* The sampler (DistributedSampler semantics). Position j in [0, global_batch) of
 * the global batch of optimizer step `step` maps to a dataset index that
 * depends only on (seed, epoch, position): epoch = step / (n / global_batch),
 * a per-epoch permutation (Fisher-Yates driven by init_mix64), drop_last. */
int64_t data_sample_index(uint64_t seed, int64_t n, int64_t global_batch, uint64_t step,
			  int64_t j);
/* Fill the DP_T_DATA tensor of source `src` (index in s->sources) for micro-batch
 * `micro` of data-parallel rank `dp_rank` (of dp_size) at optimizer step `step`.
 * The rank takes global-batch positions dp_rank + dp_size * t for
 * t in [micro*micro_batch, (micro+1)*micro_batch). */
void data_fill_train(const DataSet *d, const DpStep *s, int src, uint64_t step, int micro,
		     int dp_rank, int dp_size, void *dst);
/* Eval batches read the split in order; batch b of rank r covers samples
 * (b*dp_size + r)*eval_batch ...; past the end, features are 0 and labels -1
 * (token sources: inputs (shift 0) are 0, targets (shift 1) -1). */
int64_t data_eval_batches(const DataSet *d, const DpStep *s, int dp_size);
void data_fill_eval(const DataSet *d, const DpStep *s, int src, int64_t batch, int dp_rank,
		    int dp_size, void *dst);

/* ---- token shards scanned at load (runtime/data_scan.c) ---- */

/* The ntok uint16 token ids of the shard open as fd, from byte at on, must
 * be below limit (0: no limit): 0, or -1 naming the first that is not, its
 * index, the shard and where (the .dp file and line). One streaming read. */
int data_scan_tokens(int fd, const char *path, int64_t at, int64_t ntok, int64_t limit,
		     const char *where, RtErr *e);

/* ---- safetensors (runtime/safetensors.c) ---- */

typedef struct {
	char *name;
	int ndim;
	int64_t dims[DP_MAX_DIMS];
	float *data; /* F32 only */
} StTensor;

/* Write a safetensors file of F32 tensors safely (util/outfile.h: atomic,
 * through links, in place into a device). */
int st_write(const char *path, const StTensor *t, int n, RtErr *e);
/* Read every tensor (F32 only); malloc'd, free with st_free. Errors name the file. */
int st_read(const char *path, StTensor **out, int *n, RtErr *e);
void st_free(StTensor *t, int n);

/* Element types a dp safetensors file holds. ORDER ST_ */
enum { ST_F32, ST_I64, ST_NDTYPE };

/* One tensor of a file being written: declared up front (the header), its
 * bytes appended later in declaration order. */
typedef struct {
	const char *name;
	int dtype; /* ST_* */
	int ndim;
	int64_t dims[DP_MAX_DIMS];
} StDecl;

/* Checksums of a file's bytes: the CRC-32C (util/crc32c.h) of each block
 * of ST_SUM_BLOCK bytes, the last one shorter (none for an empty file). A
 * checkpoint's state.json lists them per file (docs/CHECKPOINTS.md); a
 * reader given them verifies every block it reads. */
#define ST_SUM_BLOCK (1 << 20)
typedef struct {
	uint32_t *crc; /* one per block completed */
	int64_t n, cap;
	uint32_t cur;  /* of the block being filled */
	int64_t fill;  /* its bytes so far */
	int oom;
} StSums;

/* Account for the next n bytes of the file. */
void st_sums_add(StSums *s, const void *p, int64_t n);
/* Close the last block: crc[0..n) is then the file's list. 0, or -1 when
 * out of memory. */
int st_sums_end(StSums *s);
void st_sums_free(StSums *s);

typedef struct {
	OutFile f;
	int open;
	int64_t want, done; /* data bytes declared / appended */
	int64_t bytes;      /* file bytes so far (header included) */
	StSums sums;        /* of every byte written; complete after st_end */
} StWriter;

/* Streaming writer: st_begin writes the header, st_put appends data bytes
 * (any chunking), st_end checks that exactly the declared bytes came and
 * commits; st_cancel (after a failure) removes the temp file. The
 * checksums are computed as the bytes go (w->sums; the caller frees them
 * after st_end with st_sums_free; st_cancel does). */
int st_begin(StWriter *w, const char *path, const StDecl *t, int n, RtErr *e);
int st_put(StWriter *w, const void *data, int64_t nbytes, RtErr *e);
int st_end(StWriter *w, RtErr *e);
void st_cancel(StWriter *w);

/* One tensor of a file being read: begin/end are byte offsets in the data. */
typedef struct {
	char *name;
	int dtype; /* ST_* */
	int ndim;
	int64_t dims[DP_MAX_DIMS];
	int64_t begin, end;
} StEntry;

typedef struct StCheck StCheck; /* expected checksums and the last block read */

typedef struct {
	char *path;
	int fd;
	int64_t size, data_start;
	StEntry *t;
	int n;
	StCheck *check; /* NULL: reads are not verified */
} StFile;

/* Open and validate a file's header (no data is read). */
int st_open(StFile *f, const char *path, RtErr *e);
/* From now on every st_pread of f verifies each block it reads against
 * crc[0..n) (StSums blocks covering the whole file: n must fit its size;
 * copied), and the blocks of the header are verified now: 0, or -1 naming
 * the file and the damaged bytes. */
int st_verify_with(StFile *f, const uint32_t *crc, int64_t n, RtErr *e);
/* Index of the tensor named name, -1 if none. */
int st_find(const StFile *f, const char *name);
/* nbytes of tensor i from byte off of its data. */
int st_pread(const StFile *f, int i, int64_t off, void *dst, int64_t nbytes, RtErr *e);
void st_close(StFile *f);

/* What an EXPORT program's SAVE instructions hand over, by tensor id: the
 * save hook of every executor (CPU and CUDA) for --save-full. keep = 0 (ranks
 * other than 0) discards; st_saved_write writes the kept tensors in
 * tensor-table order, atomically, and tells how many in *n. */
typedef struct {
	const DpStep *s;
	int keep;
	float **data; /* [ntensors], malloc'd copies; NULL: not saved */
	int *name;    /* [ntensors]: the tensor whose name data[i] is saved under */
} StSaved;

int st_saved_init(StSaved *sv, const DpStep *s, int keep, RtErr *e);
int st_saved_hook(void *ctx, int name, int id, const float *src, RtErr *e);
int st_saved_write(const StSaved *sv, const char *path, int *n, RtErr *e);
void st_saved_free(StSaved *sv);

/* f32 -> bf16 rounding to nearest even, as PyTorch stores (a NaN stays a
 * quiet NaN), and back: the one definition the host code uses (the CPU
 * kernels, INIT of bf16 buffers, MPI's bf16 sum). */
static inline uint16_t rt_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float rt_from_bf16(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* f32 -> IEEE binary16 rounding to nearest even, as PyTorch's .half() and
 * F16C's vcvtps2ph (imm 0) store: |f| >= 65520 (65504 and half an ulp, a
 * tie that rounds to the even infinity) overflows to inf, below 2^-14 the
 * result is subnormal (steps of 2^-24), a NaN stays a quiet NaN with the
 * top of its payload. Integer arithmetic only: the bits do not depend on
 * the compiler's or the CPU's rounding mode; tests/f16_test.c checks them. */
#ifdef __CUDACC__
#define RT_BITS_FN static inline __host__ __device__
#else
#define RT_BITS_FN static inline
#endif
/* The bits of an f32 (u) to binary16's, and back: integer arithmetic alone,
 * so the CUDA backend's device code (cuda/device.cuh's cu_to_f16) computes
 * the same bits as the CPU's */
RT_BITS_FN uint16_t rt_f16_bits(uint32_t u)
{
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u) /* NaN */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u) /* >= 65520: inf */
		return (uint16_t)(sign | 0x7c00u);
	if (a >= 0x38800000u) /* a normal half: rebias 127 -> 15, round at bit 13 */
		return (uint16_t)(sign | ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13));
	if (a < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 is a tie, to even 0) */
		return sign;
	/* subnormal: the significand with its hidden bit, shifted right by
	 * 126 - exponent (14..24 bits: 1..0x3ff, or 0x400 the smallest normal) */
	uint32_t m = (a & 0x7fffffu) | 0x800000u, sh = 126u - (a >> 23);
	uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
	q += rem > half || (rem == half && (q & 1u));
	return (uint16_t)(sign | q);
}

RT_BITS_FN uint32_t rt_f16_f32_bits(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
	if (e == 0x1f) /* inf; a NaN keeps its payload and comes out quiet, as F16C's */
		return sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
	if (e)
		return sign | ((e + 112u) << 23) | (m << 13);
	if (m == 0)
		return sign;
	int s = 0; /* subnormal m * 2^-24: normalise */
	while (!(m & 0x400u))
		m <<= 1, s++;
	return sign | ((uint32_t)(113 - s) << 23) | ((m & 0x3ffu) << 13);
}
#undef RT_BITS_FN

static inline uint16_t rt_to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return rt_f16_bits(u);
}

static inline float rt_from_f16(uint16_t h)
{
	uint32_t u = rt_f16_f32_bits(h);
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* The 16-bit dtype dt (DP_BF16 or DP_F16) from f32 and back. */
static inline uint16_t rt_to_half(unsigned dt, float f)
{
	return dt == DP_F16 ? rt_to_f16(f) : rt_to_bf16(f);
}

static inline float rt_from_half(unsigned dt, uint16_t h)
{
	return dt == DP_F16 ? rt_from_f16(h) : rt_from_bf16(h);
}

/*
 * bf16 or f16 on a backend kernel without a path of its own for it
 * (docs/PRECISION.md): the instruction runs on f32 copies. Is operand slot
 * j (-1: out) of `in` one of them: 16-bit, not a compute copy the kernel writes itself (an
 * optimizer's, dp_writes_in of an update; the fused classifier's logits, which it
 * overwrites with their gradient, are staged in and back), not embedding_grad's table (its shape only),
 * and not a tensor an earlier slot already staged? Both compute backends
 * stage by this rule (runtime/cpu/bf16.c, runtime/cuda/bf16.cu).
 */
static inline int rt_half_staged(const DpStep *s, const DpInstr *in, int j);

/* Does a kernel's own 16-bit path (KernelRow.bf16, run_bf16: bf16's) apply
 * to `in`? Not when an operand is f16 and the kernel's row has no f16 path
 * of its own (f16, KernelRow.f16): such an instruction runs on f32 copies.
 * CAST converts f16 itself on both backends, and so do the optimizers' f16
 * compute copies (rt_half_staged leaves them out); on CUDA also the GEMMs
 * (cuBLASLt's CUDA_R_16F, runtime/cuda/gemm.cu). */
static inline int rt_own_half_path(const DpStep *s, const DpInstr *in, int f16)
{
	if (in->op == DP_OP_CAST || f16)
		return 1;
	for (int j = -1; j < DP_MAX_IN; j++) {
		int id = j < 0 ? in->out : in->in[j];
		if (id >= 0 && s->tensors[id].dtype == DP_F16)
			return 0;
	}
	return 1;
}

static inline int rt_half_staged(const DpStep *s, const DpInstr *in, int j)
{
	int id = j < 0 ? in->out : in->in[j];
	if (id < 0 || !dp_is_half(s->tensors[id].dtype))
		return 0;
	if (j >= 0 && dp_writes_in(in, j) && dp_op_ro[in->op] == DP_RO_UPD)
		return 0;
	if (in->op == DP_OP_EMBEDDING_GRAD && j == 2)
		return 0;
	for (int k = -1; k < j; k++)
		if ((k < 0 ? in->out : in->in[k]) == id)
			return 0;
	return 1;
}

#endif
