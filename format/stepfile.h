/*
 * stepfile.h - the step-file format: the one contract between dpc and dpexec.
 *
 * dpc (ir/stepfile_write.c) writes a step file; dpexec reads it (the codec at
 * the bottom of this header is format/stepfile.c, linked into both). Nothing else
 * couples compiler and runtime: the runtime never parses the DSL and never
 * sees the IR. One file serves every rank; a rank derives its
 * mesh coordinates from its rank number (rank = (r*S + s)*T + t, tp fastest).
 *
 * Encoding. Everything is little-endian and packed field by field in the order
 * the structs below declare them (the writer and reader serialise each field
 * explicitly; struct padding never reaches the file):
 *
 *   offset  size  field
 *   0       8     magic "DPSTEP\r\n"
 *   8       4     u32 format version (DP_STEP_VERSION)
 *   12      4     u32 crc32 (zlib) of every byte from offset 24 to the end
 *   16      8     u64 total file size in bytes
 *   24      ...   DpConfig, DpOptim, DpSched (each its fields in the order of the
 *                 rows of format/settings.def), DpMetrics, u32 nevents, u32 source
 *                 strings:  u32 nbytes, then that many bytes (NUL-terminated names)
 *                 tensors:  u32 count, then DpTensor records
 *                 sources:  u32 count, then DpSource records
 *                 programs: DP_NPROG times { u32 count, then DpInstr records }
 *
 * A reader checks magic, then version (a newer version is refused by name,
 * before the checksum), then size and checksum, then every index and range
 * (tensor ids, string offsets, arena extents, opcodes); a bad file is an error
 * message, never a crash.
 */
#ifndef DP_STEPFILE_H
#define DP_STEPFILE_H

#include <stdint.h>

#define DP_STEP_MAGIC "DPSTEP\r\n"
/* 7: DpOptim gained nesterov (before clip; format/settings.def's SGD_NESTEROV)
 * 8: DpSched gained stable, decay, every, gamma (the wsd and step schedules)
 * 9: the pp mesh axis (outermost: every axis index, mask and placement moved up one)
 * 10: a third float attribute per instruction; ADAMW's weight_decay and the
 *    updates' lr_scale are attributes (optimizer groups)
 * 11: an instruction's pipeline stage (DpInstr.stage1); the SEND and RECV ops
 * 12: at pp > 1 the step program holds every micro-batch (LOAD's micro) and runs
 *    once per step
 * 13: offload: a tensor's memory space (DpTensor.space), DpConfig's
 *    host_arena_bytes, the D2H and H2D ops
 * 14: the sample program (DP_PROG_SAMPLE) and DpMetrics' sample_tokens and
 *    sample_logits; DpConfig's sample_every
 * 15: DpOptim's loss scaling (loss_scale, ls_scale, ls_growth, ls_backoff,
 *    ls_interval); XENT_GRAD's loss_scale flag, the UNSCALE and AMP_CHECK ops
 * 16: the sample program runs one sequence at batch 1 over temporaries of its
 *    own (passes/sample.c): its tokens are i32 [1, ctx], a temporary the
 *    runtime writes before every run, its logits [1, ctx, vocab]; it has no
 *    dropout
 * 17: gradient compression: DpConfig's compress and compress_start, the
 *    DP_IF_COMPRESSED and DP_IF_PLAIN flags, the ORTHOGONALIZE op
 * 18: a tensor's row stride (DpTensor.ld): the classifier's logits and their
 *    gradient padded to a multiple of pad_vocab (passes/padvocab.c)
 * 19: the copy stream (DP_STREAM_COPY): offload's H2Ds of the updated
 *    16-bit shards, at the top of the programs that gather them
 * 20: ALL_REDUCE's `stages`, a sub-group of the pp axis (a parameter kept on
 *    the stages that read it, passes/stage_params.c). A file that names no
 *    such group is written at 19, byte for byte what dpc wrote before (its
 *    contents mean the same to both); one that does at 20, which an older
 *    dpexec refuses in one line (a newer format) instead of running a
 *    collective its ranks would not all join
 * 21: the PAD_ROWS op, and a matmul whose in1 (its pad_rows copy) has more
 *    rows than its k or n, which in0's or the output's row stride covers
 *    (the padded LM head, passes/padvocab.c). A file without one is written
 *    at 19 or 20 as before, byte for byte; one with it at 21
 * 22: the p2p stream (DP_STREAM_P2P): the pipeline's SEND and RECV on a
 *    stream of their own beside the comm stream (passes/p2p.c), so a send
 *    waiting for its receiver holds no collective behind it. A file with
 *    no instruction on it (no pp) is written at 19, 20 or 21 as before,
 *    byte for byte; one with one at 22, which an older dpexec refuses in
 *    one line (a newer format). A pp file of 19 to 21 (its transfers on
 *    the comm stream) still reads and runs as it did
 * 23: a kernel of the host step (dp_runs_on_host) on the copy stream: an
 *    offloaded update without clipping, run beside the backward as soon as
 *    its unit's gradient is on the host (passes/offload.c,
 *    updates_beside_backward). A file without one is written at 19 to 22
 *    as before, byte for byte; one with one at 23, which an older dpexec
 *    refuses in one line (a newer format) */
#define DP_STEP_VERSION 23u
/* The oldest format this dpexec reads and dpc still writes (see 20 above). */
#define DP_STEP_VERSION_MIN 19u
/* The release of dpc and dpexec (their --version). */
#define DP_VERSION "0.1.0"
#define DP_STEP_HEADER_BYTES 24

#define DP_MAX_DIMS 4  /* tensor rank limit */
#define DP_MAX_AXES 5  /* mesh axes, in DpAxis order */
#define DP_MAX_IN 4    /* tensor operands of one instruction */
#define DP_NIATTR 6    /* integer attributes of one instruction */
#define DP_NFATTR 3    /* float attributes of one instruction */

/* Mesh axes, outermost first; rank = (((p*R + r)*S + s)*C + c)*T + t. */
typedef enum {
	DP_AXIS_PP,        /* pp: pipeline stages (passes/stages.c cuts the blocks) */
	DP_AXIS_REPLICATE, /* dp_replicate: replicas that all_reduce gradients */
	DP_AXIS_SHARD,     /* dp_shard: ranks that shard parameters/optimizer state */
	DP_AXIS_CP,        /* cp: context parallel */
	DP_AXIS_TP,        /* tp: tensor parallel */
} DpAxis;

/* Element types. */
typedef enum {
	DP_F32,  /* IEEE float32 */
	DP_I32,  /* int32 (labels, token ids) */
	DP_BF16, /* bfloat16: 8 significant bits, f32's range (precision bf16) */
	DP_F16,  /* IEEE binary16: 11 significant bits, max 65504 (precision fp16) */
	DP_NDTYPE
} DpDtype;

/* 1: dt is a 16-bit float, stored in 16 bits and computed in f32 */
static inline int dp_is_half(unsigned dt)
{
	return dt == DP_BF16 || dt == DP_F16;
}

/* What a tensor is for; decides how the runtime initialises and reports it. */
typedef enum {
	DP_T_ACT,      /* activation or temporary of the step; arena bytes reused */
	DP_T_DATA,     /* input batch filled by a LOAD instruction */
	DP_T_PARAM,    /* trained parameter: a view into the flat parameter buffer */
	DP_T_GRAD,     /* gradient of a parameter: a view into the flat gradient buffer */
	DP_T_OPTSTATE, /* optimizer state (momentum, adam m/v); zero at start */
	DP_T_FLAT,     /* a flat buffer (params, grads, state); buckets are views into it */
	DP_T_METRIC,   /* scalar the runtime reads after a step (loss, grad norm, ...) */
	DP_T_BUFFER,   /* non-trained, non-synchronised state (DSL `buffer ... nosync`):
	                  initialised like a parameter, never in a collective */
} DpTensorKind;

/* The memory a tensor lives in: each rank has one arena per space (offload). */
typedef enum {
	DP_SPACE_DEVICE, /* the compute backend's arena (cfg.arena_bytes) */
	DP_SPACE_HOST,   /* the pinned host arena (cfg.host_arena_bytes): offloaded
	                    optimizer state and master weights, gradients' host copies */
	DP_NSPACE
} DpSpace;

/* Placement of a tensor on one mesh axis. */
typedef enum {
	DP_PL_REPLICATE, /* every rank of the axis holds the whole tensor */
	DP_PL_SHARD,     /* split along one dim over the axis (place_dim) */
	DP_PL_PARTIAL,   /* each rank holds a partial sum; a reduction makes it whole */
} DpPlace;

/* Parameter initialisers; counter-based on (seed, tensor name, element index). */
typedef enum {
	DP_INIT_NONE,    /* not a parameter, or zero-filled */
	DP_INIT_ZEROS,   /* 0 */
	DP_INIT_ONES,    /* 1 */
	DP_INIT_NORMAL,  /* normal(mean=a, std=b) */
	DP_INIT_UNIFORM, /* uniform(low=a, high=b) */
	DP_INIT_ROPE_COS, /* rotary table [T, half]: element (t, j) = cos(t * a^(-j/half)),
	                     a = theta, b = half (the last dim); buffers only */
	DP_INIT_ROPE_SIN, /* the same with sin */
} DpInit;

/* Where a data tensor's samples come from. */
typedef enum {
	DP_SRC_IDX,       /* IDX file (MNIST format), gzip or plain; u8 images scaled to [0,1] */
	DP_SRC_NPY,       /* .npy array, float32/int32/int64, C order, first dim = samples */
	DP_SRC_SYNTHETIC, /* deterministic synthetic classification data (see runtime/data.c) */
	DP_SRC_TOKENS,    /* llm.c token shards (uint16, header of 256 int32: 20240520, 1, n):
	                     sample k = sample_elems tokens from k*sample_elems + shift; the
	                     path is a glob, shards in name order (runtime/data.c) */
	DP_SRC_POSITIONS, /* i32 [sample_elems]: the global positions of this rank's tokens
	                     in a sample, the same for every sample and step (0, 1, ... or,
	                     with seq_split, this cp rank's zigzag chunks); path "" */
	DP_SRC_SAMPLE_KEYS, /* i32 [2] per sample: its dataset index and the optimizer step
	                     (train), -1 and -1 (eval: no dropout); what dropout's mask
	                     is keyed by (format/ops.def); path "" */
} DpSourceKind;

typedef enum {
	DP_SPLIT_TRAIN, /* sampled with DistributedSampler semantics, reshuffled per epoch */
	DP_SPLIT_EVAL,  /* read in order, every sample once, padded with label -1 */
} DpSplit;

/*
 * The settings' records and kinds, declared from format/settings.def (one
 * row per setting: its field, default, range, IR form, flag, help).
 * Including the table: SET(ID, WHERE, name, TYPE, FIELD, ...) and KIND(SPEC,
 * ID, name, help); the FIELD column F(REC, CT, member) declares member in
 * record REC, in row order.
 */
#define DP_FIELD_U32(m) uint32_t m;
#define DP_FIELD_U64(m) uint64_t m;
#define DP_FIELD_F32(m) float m;
#define DP_FIELD_AXES(m) uint32_t m[DP_MAX_AXES];
#define DP_DECL_NOFIELD
#define DP_DECL_SAME(rec, ct, m)
#define DP_DECL_F(rec, ct, m) DP_IN_##rec(ct, m)

/* The kinds of the spec settings (KIND rows): DP_OPT_SGD, DP_OPT_ADAMW, ... */
#define SET(id, ...)
#define KIND(spec, id, name, help) DP_KINDENUM_##spec(id)
#define DP_KINDENUM_OPTIMIZER(id) DP_OPT_##id,
#define DP_KINDENUM_SCHEDULE(id)
#define DP_KINDENUM_LOSS_SCALE(id)
#define DP_KINDENUM_COMPRESS(id)
typedef enum {
#include "settings.def"
	DP_NOPT
} DpOptKind;
#undef DP_KINDENUM_OPTIMIZER
#undef DP_KINDENUM_SCHEDULE
#define DP_KINDENUM_OPTIMIZER(id)
#define DP_KINDENUM_SCHEDULE(id) DP_SCHED_##id,
typedef enum {
#include "settings.def"
	DP_NSCHED
} DpSchedKind;
#undef DP_KINDENUM_SCHEDULE
#undef DP_KINDENUM_LOSS_SCALE
#define DP_KINDENUM_SCHEDULE(id)
#define DP_KINDENUM_LOSS_SCALE(id) DP_LS_##id,
typedef enum {
#include "settings.def"
	DP_NLS
} DpLossScaleKind;
#undef DP_KINDENUM_LOSS_SCALE
#define DP_KINDENUM_LOSS_SCALE(id)
#undef DP_KINDENUM_COMPRESS
#define DP_KINDENUM_COMPRESS(id) DP_COMPRESS_##id,
typedef enum {
#include "settings.def"
	DP_NCOMPRESS
} DpCompressKind;
#undef DP_KINDENUM_OPTIMIZER
#undef DP_KINDENUM_SCHEDULE
#undef DP_KINDENUM_LOSS_SCALE
#undef DP_KINDENUM_COMPRESS
#undef SET
#undef KIND
/* The enum constant of kind ID of spec setting SPEC (ARG(SPEC, ID) rows). */
#define DP_KIND_OF_OPTIMIZER(id) DP_OPT_##id
#define DP_KIND_OF_SCHEDULE(id) DP_SCHED_##id
#define DP_KIND_OF_LOSS_SCALE(id) DP_LS_##id
#define DP_KIND_OF_COMPRESS(id) DP_COMPRESS_##id

/* Programs: instruction lists the executor walks. */
typedef enum {
	DP_PROG_STEP, /* one micro-batch of forward+backward; DP_IF_LAST parts only on the
	                 last micro-batch of an optimizer step (comm, clip, update) */
	DP_PROG_EVAL, /* one evaluation batch: forward, loss sum, correct count */
	DP_PROG_INIT, /* once at start-up: INIT every parameter and buffer (from its init
	                 spec or the --init-from checkpoint), then SHARD the persistent
	                 shards out of the full tensors (sharded strategies) */
	DP_PROG_EXPORT, /* before writing a full checkpoint: ALL_GATHER what is sharded,
	                   then SAVE every parameter */
	DP_PROG_SAMPLE, /* inference (language models only, else empty): the step
	                   program's forward up to the logits at batch 1, over
	                   temporaries of its own, without its loads, dropout,
	                   gradients or optimizer (the runtime writes the context
	                   into metrics.sample_tokens before every run) */
	DP_NPROG
} DpProgram;

/* Instruction flags. */
#define DP_IF_LAST 1u /* run only on the last micro-batch of the optimizer step */
/* Gradient compression (cfg.compress): both paths are in the step program and the
 * optimizer step k chooses one (passes/collectives.c) */
#define DP_IF_COMPRESSED 2u /* run only when k >= cfg.compress_start */
#define DP_IF_PLAIN 4u      /* run only when k < cfg.compress_start */
/* run only on the first micro-batch of the optimizer step (offload's H2D of an
 * updated shard into its persistent device copy: the later micro-batches read
 * what it wrote; a runtime before it refuses the flag as unknown) */
#define DP_IF_FIRST 8u
#define DP_IF_ALL (DP_IF_LAST | DP_IF_COMPRESSED | DP_IF_PLAIN | DP_IF_FIRST)

/*
 * Opcodes: one row per op in format/ops.def, the only place an op is named, with
 * the meaning of its operands and attributes. ORDER OP: tables indexed by
 * opcode follow it.
 */
typedef enum {
#define OP(id, name, cls, ...) DP_OP_##id,
#include "ops.def"
#undef OP
	DP_NOPS
} DpOp;

/*
 * Attributes: an instruction's DP_NIATTR integers (ia) and DP_NFATTR floats
 * (fa) mean what the ATTRS column of its op's row in format/ops.def says, and
 * code reads and writes them only by those names, never by slot:
 *   DP_ATTR(x, MATMUL, transA)    the integer attribute transA of a MATMUL
 *   DP_FATTR(x, SGD, momentum)    the float attribute momentum of an SGD
 * x is a DpInstr * or the IR's Node * (the same two arrays), in C or C++; the
 * result is an lvalue. An attribute its op's row does not declare, or a float
 * named as an integer, does not compile. The slots are the enums
 * DP_ATTR_<ID>_<name> and DP_FATTR_<ID>_<name>, expanded from the rows below.
 *
 * An attribute that several ops share by meaning sits at one slot in each row
 * that declares it (tests/ir_roundtrip.c checks); code that serves all those
 * ops at once reads it by its shared name:
 *   DP_AXES(x)   the mesh-axis mask of a collective, SHARD or TP_COPY (AAXES)
 *   DP_EVENT(x)  the event id of EVENT_RECORD and EVENT_WAIT
 *   DP_ACC(x)    the accumulate flag of the ops whose RO column is ACC
 *   DP_SCALAR(x) the scalar operand of SCALE and ADD_SCALAR (ASCALAR)
 * Other code that serves a family of ops (one kernel for layernorm and
 * rmsnorm, one shape rule for the attention ops) names the attribute by one of
 * them; the families are listed once, below the slot enums, each a
 * compile-time check (DP_ATTR_SAME) that its ops keep it in one slot.
 */
#define DP_ATTR(x, op, name) ((x)->ia[DP_ATTR_##op##_##name])
#define DP_FATTR(x, op, name) ((x)->fa[DP_FATTR_##op##_##name])
#define DP_AXES(x) DP_ATTR(x, ALL_REDUCE, axes)
#define DP_EVENT(x) DP_ATTR(x, EVENT_RECORD, ev)
#define DP_ACC(x) DP_ATTR(x, MATMUL, acc)
#define DP_SCALAR(x) DP_FATTR(x, SCALE, scale)
#define DP_PEER(x) DP_ATTR(x, SEND, peer) /* SEND and RECV: the other stage */
#define DP_TAG(x) DP_ATTR(x, SEND, tag)   /* SEND and RECV: the transfer's number */
#ifdef __cplusplus
#define DP_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define DP_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#define DP_ATTR_SAME(op, other, name)                                                       \
	DP_STATIC_ASSERT(DP_ATTR_##op##_##name == DP_ATTR_##other##_##name,                  \
			 #op " and " #other " keep " #name " in one slot")
#define DP_FATTR_SAME(op, other, name)                                                      \
	DP_STATIC_ASSERT(DP_FATTR_##op##_##name == DP_FATTR_##other##_##name,                \
			 #op " and " #other " keep " #name " in one slot")

/* The slot enums. Each row's ATTRS(...) becomes, after the pair of its op's
 * prefixes, a list of (kind, name, slot); DP_AT_EACH_ makes one enumerator of
 * each (an op has at most DP_NIATTR + DP_NFATTR = 9 attributes). The op's id is
 * pasted at once, so no macro of that name can intervene. */
#define DP_AT_ATTRS(...) , __VA_ARGS__
#define DP_AT_NOATTRS
#define AFLAG(name, slot, ...) (DP_AT_I_, name, slot)
#define AINT(name, slot, ...) (DP_AT_I_, name, slot)
#define AKEEP(name, slot, ...) (DP_AT_I_, name, slot)
#define AINDEX(name, slot, ...) (DP_AT_I_, name, slot)
#define AAXES(name, slot) (DP_AT_I_, name, slot)
#define ASTAGES(name, slot) (DP_AT_I_, name, slot)
#define AFLOAT(name, slot, ...) (DP_AT_F_, name, slot)
#define ASCALAR(name, slot, ...) (DP_AT_F_, name, slot)
#define DP_AT_I_(iprefix, fprefix) iprefix
#define DP_AT_F_(iprefix, fprefix) fprefix
#define DP_AT_CAT_(a, b) DP_AT_CAT2_(a, b)
#define DP_AT_CAT2_(a, b) a##b
#define DP_AT_ONE3_(prefixes, kind, name, slot) DP_AT_CAT_(kind prefixes, name) = (slot),
#define DP_AT_ONE2_(prefixes, ...) DP_AT_ONE3_(prefixes, __VA_ARGS__)
#define DP_AT_ONE_(prefixes, a) DP_AT_ONE2_(prefixes, DP_AT_OPEN_ a)
#define DP_AT_OPEN_(...) __VA_ARGS__
#define DP_AT_0_(p)
#define DP_AT_1_(p, a) DP_AT_ONE_(p, a)
#define DP_AT_2_(p, a, ...) DP_AT_ONE_(p, a) DP_AT_1_(p, __VA_ARGS__)
#define DP_AT_3_(p, a, ...) DP_AT_ONE_(p, a) DP_AT_2_(p, __VA_ARGS__)
#define DP_AT_4_(p, a, ...) DP_AT_ONE_(p, a) DP_AT_3_(p, __VA_ARGS__)
#define DP_AT_5_(p, a, ...) DP_AT_ONE_(p, a) DP_AT_4_(p, __VA_ARGS__)
#define DP_AT_6_(p, a, ...) DP_AT_ONE_(p, a) DP_AT_5_(p, __VA_ARGS__)
#define DP_AT_7_(p, a, ...) DP_AT_ONE_(p, a) DP_AT_6_(p, __VA_ARGS__)
#define DP_AT_8_(p, a, ...) DP_AT_ONE_(p, a) DP_AT_7_(p, __VA_ARGS__)
#define DP_AT_PICK_(_0, _1, _2, _3, _4, _5, _6, _7, _8, each, ...) each
#define DP_AT_EACH_(...)                                                                    \
	DP_AT_PICK_(__VA_ARGS__, DP_AT_8_, DP_AT_7_, DP_AT_6_, DP_AT_5_, DP_AT_4_, DP_AT_3_,  \
		    DP_AT_2_, DP_AT_1_, DP_AT_0_, _)(__VA_ARGS__)
enum {
#define OP(id, name, cls, dsl, in, ro, shape, grad, cost, tp, batch, rule, attrs)           \
	DP_AT_EACH_((DP_ATTR_##id##_, DP_FATTR_##id##_) DP_AT_##attrs)
#include "ops.def"
#undef OP
	DP_ATTR_END_ /* ends the list: no attribute */
};
#undef AFLAG
#undef AINT
#undef AKEEP
#undef AINDEX
#undef AAXES
#undef ASTAGES
#undef AFLOAT
#undef ASCALAR

/* The families (see above): heads of the attention ops and kv_pack/unpack,
 * cp of the cp attention ops, eps (and grad_g's acc) of the norms, the
 * cross-entropy scale, split's parts and index, the p2p ops' peer and tag. */
DP_ATTR_SAME(ATTENTION, ATTENTION_GRAD, heads);
DP_ATTR_SAME(ATTENTION, ATTENTION_CP, heads);
DP_ATTR_SAME(ATTENTION, ATTENTION_CP_GRAD, heads);
DP_ATTR_SAME(ATTENTION, ATTENTION_CP_GRAD_KV, heads);
DP_ATTR_SAME(ATTENTION, KV_PACK, heads);
DP_ATTR_SAME(ATTENTION, KV_UNPACK, heads);
DP_ATTR_SAME(ATTENTION_CP, ATTENTION_CP_GRAD, cp);
DP_ATTR_SAME(ATTENTION_CP, ATTENTION_CP_GRAD_KV, cp);
DP_ATTR_SAME(ATTENTION, ATTENTION_CP_GRAD_BOTH, heads);
DP_ATTR_SAME(ATTENTION_CP, ATTENTION_CP_GRAD_BOTH, cp);
DP_FATTR_SAME(LAYERNORM, LAYERNORM_GRAD, eps);
DP_FATTR_SAME(LAYERNORM, LAYERNORM_GRAD_G, eps);
DP_FATTR_SAME(LAYERNORM, RMSNORM, eps);
DP_FATTR_SAME(LAYERNORM, RMSNORM_GRAD, eps);
DP_FATTR_SAME(LAYERNORM, RMSNORM_GRAD_G, eps);
DP_FATTR_SAME(LAYERNORM, ADD_LAYERNORM, eps);
DP_FATTR_SAME(LAYERNORM, LAYERNORM_GRAD_ADD, eps);
DP_FATTR_SAME(LAYERNORM, ADD_RMSNORM, eps);
DP_FATTR_SAME(LAYERNORM, RMSNORM_GRAD_ADD, eps);
DP_ATTR_SAME(LAYERNORM_GRAD_G, RMSNORM_GRAD_G, acc);
DP_FATTR_SAME(LAYERNORM, LAYERNORM_GRAD_GB, eps);
DP_ATTR_SAME(LAYERNORM_GRAD_G, LAYERNORM_GRAD_GB, acc);
DP_FATTR_SAME(XENT, XENT_GRAD, scale);
DP_FATTR_SAME(XENT, XENT_FUSED, scale);
DP_ATTR_SAME(XENT_GRAD, XENT_FUSED, loss_scale);
DP_ATTR_SAME(MATMUL, MATMUL_GELU_GRAD, transA);
DP_ATTR_SAME(MATMUL, MATMUL_GELU_GRAD, transB);
DP_ATTR_SAME(SPLIT, SPLIT_GRAD, parts);
DP_ATTR_SAME(SPLIT, SPLIT_GRAD, index);
DP_STATIC_ASSERT(DP_FATTR_SCALE_scale == DP_FATTR_ADD_SCALAR_value,
		 "SCALE and ADD_SCALAR keep their scalar operand in one slot (DP_SCALAR)");
DP_ATTR_SAME(SEND, RECV, peer);
DP_ATTR_SAME(SEND, RECV, tag);

/*
 * Operand rules (the RULE column of format/ops.def): what every instruction of an
 * op must satisfy against the tensor table, whatever backend runs it. The
 * decoder (dpstep_decode) enforces them, so a kernel may trust its operands'
 * presence, dtypes, element counts and disjointness; a backend checks only
 * its own limits (BLAS int ranges, dtypes it cannot do). "f32" below means
 * the operand's dtype must be f32; "same size" equal element counts; "rows"
 * and "cols" the [rows, cols] fold of a tensor (the last dim is cols).
 */
typedef enum {
	DP_OR_NONE,        /* nothing to check (nop) */
	DP_OR_EXEC,        /* the executor's own op: checked by the decoder's own rules */
	DP_OR_FILL,        /* out present */
	DP_OR_COPY,        /* out, in0 present, same dtype and size */
	DP_OR_UNARY,       /* out, in0 f32, same size */
	DP_OR_BINARY,      /* out, in0, in1 f32, same size */
	DP_OR_MATMUL,      /* op(in0) [m,k] @ op(in1) [k,n] -> out [.., n], m*n elements;
	                      out disjoint from the inputs */
	DP_OR_LINEAR,      /* in0 [rows,k] @ in1 [k,n] (+ in2 [n]) -> out [rows.., n];
	                      out disjoint from the inputs */
	DP_OR_BIAS_ADD,    /* out, in0 same size; size(in0) a multiple of size(in1) */
	DP_OR_BIAS_GRAD,   /* size(in0) a multiple of size(out); disjoint */
	DP_OR_XENT,        /* in0 f32 logits, in1 i32 labels (one per row), out >= 1 */
	DP_OR_XENT_GRAD,   /* as XENT, out the size of in0 */
	DP_OR_CORRECT,     /* as XENT, out >= 2 */
	DP_OR_SCALAR,      /* out, in0 f32 */
	DP_OR_CLIP,        /* out, in0 (the norm) f32; the norm outside out */
	DP_OR_SGD,         /* params out, grads in0 same size; in1 momentum (same size) or
	                      absent with fa0 == 0 */
	DP_OR_ADAMW,       /* params out, grads in0, m in1, v in2: f32, same size */
	DP_OR_EMBEDDING,   /* in0 i32 ids, in1 table [V, d], out [ids.., d]; disjoint */
	DP_OR_EMBEDDING_GRAD, /* in0 dy [ids.., d], in1 i32 ids, in2 absent (step files before
	                      embedding_grad lost its table operand: the table, as large as
	                      out; checked, never read), out [V, d]; disjoint */
	DP_OR_NORM_AFFINE, /* in0 x, in1 gamma [cols], in2 beta [cols], out like x,
	                      fa0 (eps) >= 0; disjoint */
	DP_OR_NORM_SCALE,  /* as NORM_AFFINE without beta */
	DP_OR_NORM_GRAD,   /* in0 dy, in1 x, in2 gamma: dy, x, out alike; fa0 >= 0; disjoint */
	DP_OR_NORM_GRAD_G, /* in0 dy, in1 x alike, out [cols]; fa0 >= 0; disjoint */
	DP_OR_SOFTMAX,     /* out, in0 alike; disjoint */
	DP_OR_SOFTMAX_GRAD,/* out, in0 (dy), in1 (y) alike; disjoint */
	DP_OR_ATTENTION,   /* in0 qkv [B, T, 3C], 3C a multiple of 3 * heads (ia0), out
	                      [B, T, C]; disjoint */
	DP_OR_ATTENTION_GRAD, /* in0 dy [B, T, C], in1 qkv, out like qkv; disjoint */
	DP_OR_ROPE,        /* in0 qkv [B, T, 3C], in1 cos, in2 sin [Tc >= T, hd/2], 3C a
	                      multiple of 3 * hd, out like qkv; disjoint */
	DP_OR_TRANSPOSE,   /* out is in0 with its last two dims swapped; disjoint */
	DP_OR_RESHAPE,     /* out, in0 same dtype and size (may alias: a copy in place) */
	DP_OR_SPLIT,       /* out = part ia1 of ia0 equal column blocks of in0; disjoint */
	DP_OR_SPLIT_GRAD,  /* in0 = part ia1 of ia0 column blocks of out; disjoint */
	DP_OR_INTERLEAVE,  /* out, in0 same dtype and size; out's dim ia1 divisible by
	                      ia0; disjoint */
	DP_OR_KV_PACK,     /* in0 qkv [B, T, 3C] (3C a multiple of 3 * heads), out
	                      [B, T, 2C]; disjoint */
	DP_OR_KV_UNPACK,   /* in0 kv [B, T, 2C], out [B, T, 3C]; disjoint */
	DP_OR_ATTENTION_CP, /* in0 qkv [B, T, 3C], in1 kv [ia1, B, T, 2C], in2 i32 [T],
	                      out [B, T, C]; disjoint */
	DP_OR_ATTENTION_CP_GRAD, /* in0 dy [B, T, C], in1..3 as ATTENTION_CP's, out like
	                      qkv; disjoint */
	DP_OR_ATTENTION_CP_GRAD_KV, /* as ATTENTION_CP_GRAD, out like kv; disjoint */
	DP_OR_ACCUM,       /* out, in0 same size (each f32 or bf16: out += in0 converts) */
	DP_OR_CAST,        /* out, in0 same size, each f32 or bf16 */
	DP_OR_DROPOUT,     /* out, in0 alike [B, ...]; in1 i32 keys [B, 2]; in2 (optional)
	                      i32 positions [in0's dim 1] */
	DP_OR_LINEAR_GELU, /* as LINEAR, but out [2, rows.., n]: h, then gelu(h) */
	DP_OR_MATMUL_GELU_GRAD, /* as MATMUL, in2 (the pre-activation) the size of out;
	                      out disjoint from the inputs */
	DP_OR_ORTHOGONALIZE, /* out f32 [rows, r], r <= rows */
	DP_OR_FLAG,        /* no out; in0 f32 [1], read into the backend's step state */
	DP_OR_ADD_NORM,    /* in0, in1 alike (x and the residual), in2 gamma [cols], in3 beta
	                      [cols], out [2, rows.., cols]: the sum, then its norm; fa0 >= 0;
	                      disjoint */
	DP_OR_NORM_GRAD_ADD, /* as NORM_GRAD, and in3 (the residual's gradient) like x */
	DP_OR_ADD_NORM_SCALE, /* as ADD_NORM without beta (in0, in1, in2 gamma) */
	DP_OR_ATTENTION_CP_GRAD_BOTH, /* as ATTENTION_CP_GRAD, out flat: like kv, then like
	                      qkv; disjoint */
	DP_OR_PAD_ROWS,    /* out [ia0, c] of in0 [r <= ia0, c]'s dtype: in0's rows, then
	                      zero rows; disjoint */
	DP_OR_NORM_GRAD_GB, /* in0 dy, in1 x alike, out [2, cols]; fa0 >= 0; disjoint */
	DP_NOR
} DpOperandRule;

/*
 * Operand dtypes (mixed precision). Every rule states, per operand, which
 * dtype it may have; the decoder checks it and the compiler's precision pass
 * (passes/precision.c) reads the same table to decide where casts go. A
 * kernel computes in f32 whatever it stores: 16-bit operands (bf16, f16)
 * are converted on load and rounded (to nearest even) on store. "half"
 * below is either; one instruction never mixes the two.
 */
typedef enum {
	DP_OD_NONE,  /* not a tensor operand of the rule, or checked by the rule itself
	                (copies: the same dtype as in0, any) */
	DP_OD_CD,    /* f32 or half: the instruction's compute dtype, one for all its CD
	                operands (the dtype of the first present one, in0..in3 then out) */
	DP_OD_CDF,   /* the compute dtype, or f32: a parameter gradient an accumulating
	                kernel writes in the reduce dtype */
	DP_OD_FLOAT, /* f32 or half, whatever the others are */
	DP_OD_F32,   /* f32: statistics, metrics, master weights, optimizer state */
	DP_OD_HALF,  /* half: the compute copy an optimizer writes */
	DP_OD_I32,   /* ids, labels, positions */
} DpOperandDtype;

/* Per rule: the DpOperandDtype of out (index 0) and in0..in3 (1..4). */
extern const unsigned char dp_rule_dtypes[DP_NOR][1 + DP_MAX_IN];

/* Streams of the schedule. */
typedef enum {
	DP_STREAM_COMPUTE, /* kernels */
	DP_STREAM_COMM,    /* collectives */
	DP_STREAM_COPY,    /* host<->device copies beside both (offload's H2D of an updated
	                      shard ahead of its all_gather: passes/offload.c) */
	DP_STREAM_P2P,     /* the pipeline's SEND and RECV (version 22), serial among
	                      themselves, beside the comm stream: a send that waits
	                      for its receiver holds no collective (passes/p2p.c) */
	DP_NSTREAM
} DpStream;

/* f32 matrix products on a GPU (DSL `precision f32|tf32`; the CPU ignores it). */
typedef enum {
	DP_GEMM_F32,  /* full fp32 (the default) */
	DP_GEMM_TF32, /* TF32 tensor cores: inputs rounded to a 10-bit mantissa */
	DP_NGEMM
} DpGemmMath;

/* Data-parallel strategies (DSL `strategy`). */
typedef enum {
	DP_STRAT_DDP,          /* replicated params, all_reduce of gradients */
	DP_STRAT_ZERO1,        /* + optimizer state and master params sharded over dp_shard */
	DP_STRAT_ZERO2,        /* + gradients reduce_scattered (FSDP SHARD_GRAD_OP) */
	DP_STRAT_FULL_SHARD,   /* + params stored sharded, gathered per block (ZeRO-3, FSDP) */
	DP_STRAT_HYBRID_SHARD, /* full_shard in dp_shard, all_reduce over dp_replicate (HSDP) */
	DP_NSTRAT
} DpStrategy;

/* ---- records (in-memory form; serialised field by field) ---- */

/* The settings' records: each member is a row of format/settings.def (its
 * meaning is the row's help), declared in row order. */
#define SET(id, where, name, type, field, ...) DP_DECL_##field
#define KIND(...)
#define DP_IN_OPT(ct, m)
#define DP_IN_SCHED(ct, m)
#define DP_IN_GRAPH(ct, m)

/* mesh, batch, steps, seed, arena size, strategy, checkpoints, GEMM math */
#define DP_IN_CFG(ct, m) DP_FIELD_##ct(m)
typedef struct {
#include "settings.def"
} DpConfig;
#undef DP_IN_CFG
#define DP_IN_CFG(ct, m)

/* the optimizer (kind: a DpOptKind), its hyperparameters, clipping, loss
 * scaling (loss_scale: a DpLossScaleKind) */
#undef DP_IN_OPT
#define DP_IN_OPT(ct, m) DP_FIELD_##ct(m)
typedef struct {
#include "settings.def"
} DpOptim;
#undef DP_IN_OPT
#define DP_IN_OPT(ct, m)

/* the learning-rate schedule (kind: a DpSchedKind) */
#undef DP_IN_SCHED
#define DP_IN_SCHED(ct, m) DP_FIELD_##ct(m)
typedef struct {
#include "settings.def"
} DpSched;

#undef DP_IN_CFG
#undef DP_IN_OPT
#undef DP_IN_SCHED
#undef DP_IN_GRAPH
#undef SET
#undef KIND

/* Tensor ids the runtime reads; -1 when absent. The runtime zeroes metric
 * tensors before each optimizer step; it reads the eval metrics after every
 * eval batch and sums them over batches and ranks itself. */
typedef struct {
	int32_t loss;         /* train loss sum over this rank's micro-batches (already /global batch) */
	int32_t grad_norm;    /* global gradient norm of the step */
	int32_t eval_loss;    /* eval: loss sum of the batch */
	int32_t eval_correct; /* eval: [correct, counted] */
	int32_t sample_tokens; /* the sample program's i32 [1, ctx] token input */
	int32_t sample_logits; /* ... and the [1, ctx, vocab] logits it leaves (f32, or the
	                          compute dtype under precision bf16 or fp16) */
} DpMetrics;

typedef struct {
	uint32_t name;              /* string offset */
	uint8_t dtype;              /* DpDtype */
	uint8_t kind;               /* DpTensorKind */
	uint8_t ndim;
	uint8_t init;               /* DpInit */
	uint8_t space;              /* DpSpace: which arena offset is into */
	int64_t dims[DP_MAX_DIMS];  /* local (per-rank) shape */
	uint64_t offset;            /* byte offset into the arena of its space */
	uint64_t nbytes;            /* bytes in the arena (>= elements * size, for padding) */
	uint8_t place[DP_MAX_AXES]; /* DpPlace per axis */
	int8_t place_dim[DP_MAX_AXES]; /* sharded dim per axis, -1 when not sharded */
	float init_a, init_b;       /* initialiser parameters */
	int64_t init_base;          /* element index of this shard's first element in the
	                               full tensor (init is defined on the full tensor) */
	int64_t ld;                 /* elements from one row's start to the next's (a row: the
	                               last dim) when more than the last dim (padded rows:
	                               passes/padvocab.c; only the ops dp_op_takes_ld names
	                               read or write such a tensor); 0: dense. dp_ld reads it */
} DpTensor;

typedef struct {
	uint32_t path;        /* string offset: file path (empty for synthetic) */
	uint8_t kind;         /* DpSourceKind */
	uint8_t split;        /* DpSplit */
	uint8_t role;         /* 0 = features (f32), 1 = labels (i32) */
	uint8_t shift;        /* tokens: offset of the window (0: inputs, 1: targets) */
	uint8_t seq_split;    /* tokens, positions: 1 = each sample's sequence is split over
	                         the cp ranks: the window is sample_elems * cp tokens and this
	                         rank gets its two chunks, r and 2*cp-1-r of 2*cp (the zigzag
	                         layout of format/ops.def); 0 = whole */
	int32_t tensor;       /* destination tensor id (DP_T_DATA) */
	int64_t sample_elems; /* elements per sample */
	int64_t synth_n;      /* synthetic: number of samples */
	int32_t synth_classes;/* synthetic: number of classes */
	uint32_t src_line;    /* line in the .dp file, for error messages */
} DpSource;

typedef struct {
	uint16_t op;              /* DpOp */
	uint8_t stream;           /* DpStream */
	uint8_t flags;            /* DP_IF_* */
	uint16_t stage1;          /* 1 + the pipeline stage (pp coordinate) that runs it; 0
	                             (as zeroed): every rank (passes/p2p.c); dp_instr_stage */
	int32_t in[DP_MAX_IN];    /* tensor ids or -1 */
	int32_t out;              /* tensor id or -1 */
	int64_t ia[DP_NIATTR];    /* integer attributes: DP_ATTR (ops.def's ATTRS) */
	float fa[DP_NFATTR];      /* float attributes: DP_FATTR */
} DpInstr;

/* A whole step file in memory. Pointers own malloc'd arrays. */
typedef struct {
	DpConfig cfg;
	DpOptim opt;
	DpSched sched;
	DpMetrics metrics;
	char *strings;
	uint32_t nstrings; /* bytes */
	DpTensor *tensors;
	uint32_t ntensors;
	DpSource *sources;
	uint32_t nsources;
	DpInstr *prog[DP_NPROG];
	uint32_t nprog[DP_NPROG];
	uint32_t nevents; /* events used by EVENT_RECORD/WAIT (ids < nevents) */
	uint32_t source;  /* string offset of the .dp file's path as dpc was given it, for
	                     dpexec's messages ("models/mlp.dp:8"); 0 ("") when unknown
	                     (version 4) */
} DpStep;

/* The pipeline stage that runs an instruction, -1: every rank. */
static inline int dp_instr_stage(const DpInstr *in)
{
	return (int)in->stage1 - 1;
}

/* Does the step program hold every micro-batch (pp > 1: passes/unroll.c)? Then it
 * runs once per step, its LOADs naming their micro-batch; else once per
 * micro-batch (grad_accum times). */
static inline int dp_step_unrolled(const DpConfig *c)
{
	return c->mesh[DP_AXIS_PP] > 1;
}

/* Axis mask bit for one axis: collectives name the axes they reduce over. */
#define DP_AXIS_BIT(a) (1u << (a))

/* What executes an opcode (the CLASS column of format/ops.def). Compute kernels
 * belong to a compute backend (CPU, CUDA); everything else is the executor's
 * own: it moves data across the runtime's boundary (LOAD, INIT, SAVE),
 * between ranks (collectives), or orders the streams (events). */
typedef enum {
	DP_OPC_KERNEL,     /* a compute kernel of the backend's kernel table */
	DP_OPC_COLLECTIVE, /* the comm backend, on the instruction's stream */
	DP_OPC_EVENT,      /* EVENT_RECORD / EVENT_WAIT */
	DP_OPC_LOAD,       /* LOAD: the data loader fills a data tensor */
	DP_OPC_HOST,       /* INIT / SAVE: host hooks (initial values, checkpoint writer);
	                      AMP_CHECK: the executor reads the gradient norm */
	DP_OPC_SHARD,      /* SHARD: a local copy of this rank's block (depends on the mesh) */
} DpOpClass;

/* The RO column of format/ops.def: does an instruction read its output, and
 * does it write inputs (a backend that stages operands, e.g. bf16 on the
 * CPU, converts in what is read and back what is written). */
typedef enum {
	DP_RO_NO,  /* out is only written */
	DP_RO_YES, /* out is read too (in place) */
	DP_RO_ACC, /* out is read when the attribute acc != 0 (accumulating kernels) */
	DP_RO_UPD, /* YES, and in[1..] are written too (optimizer state, the bf16 copy) */
	DP_RO_IN0, /* out is only written, and in[0] is written too, in place (the fused
	              classifier's gradient over its logits) */
} DpReadsOut;

extern const unsigned char dp_op_classes[DP_NOPS]; /* DpOpClass; ORDER OP */
extern const unsigned char dp_op_ro[DP_NOPS];      /* DpReadsOut; ORDER OP */
extern const unsigned char dp_op_rules[DP_NOPS];   /* DpOperandRule; ORDER OP */

/* Elements of a tensor: the product of its dims (1 for a scalar). */
static inline int64_t dp_numel(const DpTensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->dims[d];
	return n;
}

/* A tensor's row length: its last dim (1 for a scalar). */
static inline int64_t dp_cols(const DpTensor *t)
{
	return t->ndim ? t->dims[t->ndim - 1] : 1;
}

/* A tensor's row stride: ld, or its last dim when ld is 0 (dense). */
static inline int64_t dp_ld(const DpTensor *t)
{
	return t->ld > dp_cols(t) ? t->ld : dp_cols(t);
}

/* Elements a tensor spans in memory: its rows times its row stride
 * (dp_numel when dense, more when its rows are padded). */
static inline int64_t dp_span(const DpTensor *t)
{
	return dp_numel(t) / dp_cols(t) * dp_ld(t);
}

/* May op read or write a tensor with padded rows (ld > its last dim)? The
 * kernels that walk rows by ld: the GEMMs (leading dimensions) and the
 * classifier's (passes/padvocab.c). Every other op, the collectives and the
 * executor's copies included, sees tensors dense: the decoder refuses
 * anything else. */
static inline int dp_op_takes_ld(unsigned op)
{
	return op == DP_OP_MATMUL || op == DP_OP_XENT || op == DP_OP_XENT_GRAD ||
	       op == DP_OP_CORRECT || op == DP_OP_XENT_FUSED;
}

/* A tensor's address in one space spanning both arenas: the device arena,
 * then the host arena (offload). Distinct tensors overlap in it only when
 * they share bytes. */
static inline uint64_t dp_tensor_addr(const DpStep *s, const DpTensor *t)
{
	return t->space == DP_SPACE_HOST ? s->cfg.arena_bytes + t->offset : t->offset;
}

/* 1: some tensor of the step has dtype dt (DP_BF16: precision bf16 or a
 * bf16 block; DP_F16: precision fp16 or an fp16 block) */
static inline int dp_step_has_dtype(const DpStep *s, unsigned dt)
{
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (s->tensors[i].dtype == dt)
			return 1;
	return 0;
}

static inline DpOpClass dp_op_class(unsigned op)
{
	return op < DP_NOPS ? (DpOpClass)dp_op_classes[op] : DP_OPC_KERNEL;
}

/* 1: op is a matrix product (a GEMM of the backends' BLAS: cuBLASLt,
 * OpenBLAS), its fused epilogues included; the cost model's, the
 * simulator's, calibration's and the trace's GEMM class */
static inline int dp_op_is_gemm(unsigned op)
{
	return op == DP_OP_MATMUL || op == DP_OP_LINEAR || op == DP_OP_LINEAR_GELU ||
	       op == DP_OP_MATMUL_GELU_GRAD;
}

/* 1: op is attention, ordinary or context-parallel, forward or gradient */
static inline int dp_op_is_attention(unsigned op)
{
	return op == DP_OP_ATTENTION || op == DP_OP_ATTENTION_GRAD || op == DP_OP_ATTENTION_CP ||
	       op == DP_OP_ATTENTION_CP_GRAD || op == DP_OP_ATTENTION_CP_GRAD_KV ||
	       op == DP_OP_ATTENTION_CP_GRAD_BOTH;
}

/* 1: instruction in is a kernel of the host step (offload): its output, so
 * every operand (the decoder's check_spaces), in the host arena. The copies
 * between the arenas (D2H, H2D) are the device's. */
static inline int dp_runs_on_host(const DpStep *s, const DpInstr *in)
{
	return dp_op_class(in->op) == DP_OPC_KERNEL && in->op != DP_OP_D2H &&
	       in->op != DP_OP_H2D && in->out >= 0 && s->tensors[in->out].space == DP_SPACE_HOST;
}

static inline int dp_reads_out(const DpInstr *in)
{
	unsigned ro = in->op < DP_NOPS ? dp_op_ro[in->op] : (unsigned)DP_RO_NO;
	return ro == DP_RO_YES || ro == DP_RO_UPD || (ro == DP_RO_ACC && DP_ACC(in) != 0);
}

/* Does the instruction write its input k (besides its out)? */
static inline int dp_writes_in(const DpInstr *in, int k)
{
	unsigned ro = in->op < DP_NOPS ? dp_op_ro[in->op] : (unsigned)DP_RO_NO;
	return ((ro == DP_RO_UPD && k >= 1) || (ro == DP_RO_IN0 && k == 0)) && k >= 0 &&
	       k < DP_MAX_IN && in->in[k] >= 0;
}

/* The collectives: ops that move data between the ranks of the ia0 axes, on
 * the comm stream (SEND and RECV: on the p2p stream from version 22, the
 * comm stream before). TP_REDUCE is an out-of-place all_reduce. */
static inline int dp_is_collective(unsigned op)
{
	return dp_op_class(op) == DP_OPC_COLLECTIVE;
}

/* ---- codec (format/stepfile.c, linked into both dpc and dpexec) ---- */

#include <stddef.h>

/* Names shared by compiler and runtime (one table each, in format/stepfile.c). */
extern const char *const dp_op_names[DP_NOPS];   /* ORDER OP */
extern const char *const dp_prog_names[DP_NPROG];      /* "step", "eval", "init", "export", "sample" */
extern const char *const dp_strategy_names[DP_NSTRAT]; /* as the DSL spells them: "ddp", ... */
extern const char *const dp_dtype_names[DP_NDTYPE];    /* "f32", "i32", "bf16", "f16" */
extern const char *const dp_stream_names[DP_NSTREAM];  /* "compute", "comm", "copy", "p2p" */
extern const char *const dp_space_names[DP_NSPACE];    /* "device", "host" */
/* Bytes of one element of dtype dt (0 for an unknown dtype). */
size_t dp_dtype_size(unsigned dt);
/* The name in a table of n names, "?" when out of range (for messages). */
const char *dp_name(const char *const *names, unsigned n, unsigned i);

/* Serialise s (header, checksum and all) into a malloc'd buffer. 0 or -1 (no memory). */
int dpstep_encode(const DpStep *s, unsigned char **buf, size_t *len);
/* The format version s is written at (DP_STEP_VERSION_MIN or DP_STEP_VERSION). */
uint32_t dp_step_version(const DpStep *s);
/* Parse and validate buf. 0, or -1 with a one-line reason in err; out is then empty. */
int dpstep_decode(const unsigned char *buf, size_t len, DpStep *out, char *err, size_t errlen);
/* Write through util/outfile.h: atomically (PATH.dptmp, fsync, rename) onto a
 * regular file, in place into a device or FIFO, through symbolic links. On
 * failure nothing is left. */
int dpstep_write_file(const DpStep *s, const char *path, char *err, size_t errlen);
/* Read and decode a file; errors name the file. */
int dpstep_read_file(const char *path, DpStep *out, char *err, size_t errlen);
void dpstep_free(DpStep *s);
/* The operand rule of in's op (format/stepfile_check.c); what names the
 * instruction in the message. 0, or -1 with the reason in err. */
int dpstep_check_operands(const DpStep *s, const DpInstr *in, const char *what, char *err,
			  size_t errlen);
/* Name of a string-table offset, "" when out of range. */
const char *dpstep_str(const DpStep *s, uint32_t off);

/* ---- kernel kinds (format/kernel_kind.c) ----
 * Which of an op's CUDA kernels an instruction runs, where the CUDA backend
 * chooses between kernels of very different costs by a rule on the step
 * file alone (so the compiler sees it too): the calibration keys each
 * measured point of an op line by it and the simulator prices an
 * instruction among the points of its own kind (util/machine.h, "points").
 * Kind 0 is an op's general kernel; an op with one kernel has only kind 0
 * and no name. */
enum { DP_KIND_MAX = 2 };
/* The kind of instruction i of program prog (0 for an op with one kernel). */
int dp_kernel_kind(const DpStep *s, int prog, uint32_t i);
/* The kinds of every instruction of program prog into kind[0..nprog) (what
 * dp_kernel_kind gives each, the pairs found once). */
void dp_kernel_kinds(const DpStep *s, int prog, int *kind);
/* The kind's name in machine files ("paired", "colsum", ...); NULL: op has
 * one kernel, its points carry no kind. */
const char *dp_kernel_kind_name(unsigned op, int kind);
/* The bias_grad whose column sums the weight-gradient matmul i of program
 * prog gives by cuBLASLt's BGRADA epilogue (runtime/cuda/gemm.cu's pairing
 * rule: the first bias_grad after it reading its in1, same stream and
 * DP_IF_LAST, f32 outputs, nothing writing in1 between), or -1. The CUDA
 * backend pairs exactly these (unless cuBLASLt has no algorithm with the
 * epilogue, which only the device knows). */
int64_t dp_bgrad_pair(const DpStep *s, int prog, uint32_t i);

#endif
