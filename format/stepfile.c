/*
 * stepfile.c - the step-file codec (encode, decode + validate, atomic write,
 * read), linked into both dpc and dpexec. The layout is the one documented
 * at the top of stepfile.h; every field is written and read explicitly,
 * little-endian, so struct padding and host byte order never reach the file.
 *
 * Decoding is the runtime's first line of defence against a bad file: it
 * checks, in order, the header size, the magic, the version (a newer file is
 * refused by name before the checksum, since its layout may differ), the
 * declared size, the crc32, then parses every record through a
 * bounds-checked cursor, and finally validates every enum, index and arena
 * range. Whatever the input, the result is a DpStep the executor can trust
 * or a one-line reason; never a crash, never a huge allocation (every count
 * is checked against the bytes that remain before anything is allocated).
 *
 * Conventions the validator enforces (and the writer must follow):
 *  - dims[i] for i >= ndim are 0 or 1 (ignored); dims[i] for i < ndim are >= 1;
 *    ndim 0 is a scalar (one element).
 *  - A tensor with nbytes == 0 has no storage (a value the memory planner did
 *    not place); its offset is ignored, and no instruction, source or metric
 *    may refer to it. A tensor with storage lies inside the arena, is aligned
 *    to its element size, and nbytes >= elements * element size.
 *  - Synthetic sources have at most 65536 classes (labels are computed by an
 *    argmax over classes; a corrupted count must not mean hours of work).
 *  - Kernels live in the programs that can run them: LOAD in step/eval;
 *    collectives in step/eval/export (never init, which is local); INIT
 *    (out: an f32 parameter or buffer) in init only; SHARD (f32 in0/out, axes:
 *    an axis mask) in init and step (zero1 cuts the gradient shard); SAVE
 *    (in0: an f32 parameter) in export only.
 *  - A setting that names one of a few things (cfg.strategy, the optimizer's
 *    and the schedule's kinds, cfg.gemm_math, a boolean) is below their
 *    count (format/settings.def).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "outfile.h"
#include "settings.h"
#include "stepfile.h"

/* The shared columns of format/ops.def: name, executor class, operand rule,
 * what it reads and writes in place. */
const char *const dp_op_names[DP_NOPS] = {
#define OP(id, name, ...) name,
#include "ops.def"
#undef OP
};
const unsigned char dp_op_classes[DP_NOPS] = {
#define OP(id, name, cls, ...) DP_OPC_##cls,
#include "ops.def"
#undef OP
};
const unsigned char dp_op_rules[DP_NOPS] = {
#define OP(id, name, cls, dsl, in, ro, shape, grad, cost, tp, batch, rule, attrs) DP_OR_##rule,
#include "ops.def"
#undef OP
};
const unsigned char dp_op_ro[DP_NOPS] = {
#define OP(id, name, cls, dsl, in, ro, shape, grad, cost, tp, batch, rule, attrs) DP_RO_##ro,
#include "ops.def"
#undef OP
};
const char *const dp_prog_names[DP_NPROG] = {"step", "eval", "init", "export", "sample"};
const char *const dp_strategy_names[DP_NSTRAT] = {"ddp", "zero1", "zero2", "full_shard",
						  "hybrid_shard"};
const char *const dp_dtype_names[DP_NDTYPE] = {"f32", "i32", "bf16", "f16"};
const char *const dp_stream_names[DP_NSTREAM] = {"compute", "comm", "copy", "p2p"};
const char *const dp_space_names[DP_NSPACE] = {"device", "host"};

size_t dp_dtype_size(unsigned dt)
{
	return dt == DP_F32 || dt == DP_I32 ? 4 : dp_is_half(dt) ? 2 : 0;
}

const char *dp_name(const char *const *names, unsigned n, unsigned i)
{
	return i < n ? names[i] : "?";
}

/* Serialised record sizes (sum of the field sizes, no padding); DpConfig,
 * DpOptim and DpSched are their settings' fields (dp_record_bytes). */
enum {
	METRICS_BYTES = 6 * 4,
	TENSOR_BYTES = 4 + 5 + 8 * DP_MAX_DIMS + 8 + 8 + DP_MAX_AXES + DP_MAX_AXES + 4 + 4 + 8 + 8,
	SOURCE_BYTES = 4 + 5 + 4 + 8 + 8 + 4 + 4,
	INSTR_BYTES = 2 + 1 + 1 + 2 + 4 * DP_MAX_IN + 4 + 8 * DP_NIATTR + 4 * DP_NFATTR,
};

static void fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* ---- writer ---- */

/* A cursor that never writes past end: a write that would is dropped and
 * marks the cursor bad (the size computed for the buffer was wrong, an
 * internal bug the caller reports instead of overflowing the heap). */
typedef struct {
	unsigned char *p, *end;
	int bad;
} Put;

static void put_u8(Put *w, uint8_t v)
{
	if (w->p < w->end)
		*w->p++ = v;
	else
		w->bad = 1;
}
static void put_u16(Put *w, uint16_t v)
{
	put_u8(w, (uint8_t)v);
	put_u8(w, (uint8_t)(v >> 8));
}
static void put_u32(Put *w, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		put_u8(w, (uint8_t)(v >> (8 * i)));
}
static void put_u64(Put *w, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		put_u8(w, (uint8_t)(v >> (8 * i)));
}
static void put_i32(Put *w, int32_t v) { put_u32(w, (uint32_t)v); }
static void put_i64(Put *w, int64_t v) { put_u64(w, (uint64_t)v); }
static void put_f32(Put *w, float f)
{
	uint32_t v;
	memcpy(&v, &f, 4);
	put_u32(w, v);
}
static void put_bytes(Put *w, const void *b, size_t n)
{
	if (n > (size_t)(w->end - w->p)) {
		w->bad = 1;
		return;
	}
	if (n)
		memcpy(w->p, b, n);
	w->p += n;
}

/* A settings record (DpConfig, DpOptim, DpSched): its fields in the rows'
 * order of format/settings.def. */
static void put_record(Put *w, DpStep *s, int rec)
{
	const char *r = dp_step_record(s, rec);
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->rec != rec || st->alias)
			continue;
		const char *f = r + st->offset;
		switch (st->ctype) {
		case DP_CT_U32:
			put_u32(w, *(const uint32_t *)f);
			break;
		case DP_CT_U64:
			put_u64(w, *(const uint64_t *)f);
			break;
		case DP_CT_F32:
			put_f32(w, *(const float *)f);
			break;
		case DP_CT_AXES:
			for (int a = 0; a < DP_MAX_AXES; a++)
				put_u32(w, ((const uint32_t *)f)[a]);
			break;
		}
	}
}

static void put_tensor(Put *w, const DpTensor *t)
{
	put_u32(w, t->name);
	put_u8(w, t->dtype);
	put_u8(w, t->kind);
	put_u8(w, t->ndim);
	put_u8(w, t->init);
	put_u8(w, t->space);
	for (int i = 0; i < DP_MAX_DIMS; i++)
		put_i64(w, t->dims[i]);
	put_u64(w, t->offset);
	put_u64(w, t->nbytes);
	for (int i = 0; i < DP_MAX_AXES; i++)
		put_u8(w, t->place[i]);
	for (int i = 0; i < DP_MAX_AXES; i++)
		put_u8(w, (uint8_t)t->place_dim[i]);
	put_f32(w, t->init_a);
	put_f32(w, t->init_b);
	put_i64(w, t->init_base);
	put_i64(w, t->ld);
}

static void put_source(Put *w, const DpSource *s)
{
	put_u32(w, s->path);
	put_u8(w, s->kind);
	put_u8(w, s->split);
	put_u8(w, s->role);
	put_u8(w, s->shift);
	put_u8(w, s->seq_split);
	put_i32(w, s->tensor);
	put_i64(w, s->sample_elems);
	put_i64(w, s->synth_n);
	put_i32(w, s->synth_classes);
	put_u32(w, s->src_line);
}

static void put_instr(Put *w, const DpInstr *in)
{
	put_u16(w, in->op);
	put_u8(w, in->stream);
	put_u8(w, in->flags);
	put_u16(w, in->stage1);
	for (int i = 0; i < DP_MAX_IN; i++)
		put_i32(w, in->in[i]);
	put_i32(w, in->out);
	for (int i = 0; i < DP_NIATTR; i++)
		put_i64(w, in->ia[i]);
	for (int i = 0; i < DP_NFATTR; i++)
		put_f32(w, in->fa[i]);
}

/* dp_runs_on_host, for an instruction whose out is not validated yet. */
static int host_kernel(const DpStep *s, const DpInstr *in)
{
	return in->op < DP_NOPS && in->out >= 0 && (uint32_t)in->out < s->ntensors &&
	       dp_runs_on_host(s, in);
}

/* The step file's bytes into b, n bytes long: 0 when they fill it exactly;
 * -1 when they do not (nothing is written past b + n). */
/* The format a step is written at: 23 with a host kernel on the copy
 * stream, else 22 with an instruction on the p2p stream, else 21 with a
 * PAD_ROWS, else 20 when an ALL_REDUCE names a sub-group of pp stages,
 * else 19 (DP_STEP_VERSION's note). */
uint32_t dp_step_version(const DpStep *s)
{
	uint32_t v = DP_STEP_VERSION_MIN;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++) {
			const DpInstr *in = &s->prog[p][i];
			if (in->stream == DP_STREAM_COPY && host_kernel(s, in))
				return 23;
			if (in->stream == DP_STREAM_P2P && v < 22)
				v = 22;
			if (in->op == DP_OP_PAD_ROWS && v < 21)
				v = 21;
			if (in->op == DP_OP_ALL_REDUCE && DP_ATTR(in, ALL_REDUCE, stages) && v < 20)
				v = 20;
		}
	return v;
}

static int encode_into(const DpStep *s, unsigned char *b, size_t n)
{
	Put w = {b, b + n, 0};
	put_bytes(&w, DP_STEP_MAGIC, 8);
	put_u32(&w, dp_step_version(s));
	put_u32(&w, 0); /* crc, patched below */
	put_u64(&w, n);

	for (int rec = DP_REC_CFG; rec <= DP_REC_SCHED; rec++)
		put_record(&w, (DpStep *)s, rec);

	put_i32(&w, s->metrics.loss);
	put_i32(&w, s->metrics.grad_norm);
	put_i32(&w, s->metrics.eval_loss);
	put_i32(&w, s->metrics.eval_correct);
	put_i32(&w, s->metrics.sample_tokens);
	put_i32(&w, s->metrics.sample_logits);
	put_u32(&w, s->nevents);
	put_u32(&w, s->source);

	put_u32(&w, s->nstrings);
	put_bytes(&w, s->strings, s->nstrings);
	put_u32(&w, s->ntensors);
	for (uint32_t i = 0; i < s->ntensors; i++)
		put_tensor(&w, &s->tensors[i]);
	put_u32(&w, s->nsources);
	for (uint32_t i = 0; i < s->nsources; i++)
		put_source(&w, &s->sources[i]);
	for (int p = 0; p < DP_NPROG; p++) {
		put_u32(&w, s->nprog[p]);
		for (uint32_t i = 0; i < s->nprog[p]; i++)
			put_instr(&w, &s->prog[p][i]);
	}
	if (w.bad || w.p != w.end)
		return -1;
	uLong crc = crc32(0L, Z_NULL, 0);
	crc = crc32(crc, b + DP_STEP_HEADER_BYTES, (uInt)(n - DP_STEP_HEADER_BYTES));
	Put h = {b + 12, b + 16, 0};
	put_u32(&h, (uint32_t)crc);
	return 0;
}

int dpstep_encode(const DpStep *s, unsigned char **buf, size_t *len)
{
	size_t n = DP_STEP_HEADER_BYTES + dp_record_bytes(DP_REC_CFG) + dp_record_bytes(DP_REC_OPT) +
		   dp_record_bytes(DP_REC_SCHED) + METRICS_BYTES + 4 + 4;
	n += 4 + (size_t)s->nstrings;
	n += 4 + (size_t)s->ntensors * TENSOR_BYTES;
	n += 4 + (size_t)s->nsources * SOURCE_BYTES;
	for (int p = 0; p < DP_NPROG; p++)
		n += 4 + (size_t)s->nprog[p] * INSTR_BYTES;
	unsigned char *b = malloc(n);
	if (!b)
		return -1;
	if (encode_into(s, b, n)) {
		/* an internal bug: the size computation and the writers disagree */
		free(b);
		return -1;
	}
	*buf = b;
	*len = n;
	return 0;
}

/* ---- reader: a cursor that never reads past the end ---- */

typedef struct {
	const unsigned char *p, *end;
	int bad; /* set on the first read past the end; later reads return 0 */
	const char *what; /* the record being read, for the truncation message */
} Get;

static int need(Get *r, size_t n)
{
	if (r->bad || (size_t)(r->end - r->p) < n) {
		r->bad = 1;
		return 0;
	}
	return 1;
}
static uint8_t get_u8(Get *r) { return need(r, 1) ? *r->p++ : 0; }
static uint16_t get_u16(Get *r)
{
	uint16_t lo = get_u8(r);
	return (uint16_t)(lo | (uint16_t)get_u8(r) << 8);
}
static uint32_t get_u32(Get *r)
{
	if (!need(r, 4))
		return 0;
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)r->p[i] << (8 * i);
	r->p += 4;
	return v;
}
static uint64_t get_u64(Get *r)
{
	if (!need(r, 8))
		return 0;
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)r->p[i] << (8 * i);
	r->p += 8;
	return v;
}
static int32_t get_i32(Get *r) { return (int32_t)get_u32(r); }
static int64_t get_i64(Get *r) { return (int64_t)get_u64(r); }
static float get_f32(Get *r)
{
	uint32_t v = get_u32(r);
	float f;
	memcpy(&f, &v, 4);
	return f;
}

/* Read a record count and check that count records of recbytes fit in what
 * remains, so a lying count cannot cause a huge allocation. */
static int get_count(Get *r, size_t recbytes, uint32_t *count)
{
	*count = get_u32(r);
	if (r->bad)
		return -1;
	if (recbytes && (uint64_t)*count > (uint64_t)(r->end - r->p) / recbytes) {
		r->bad = 1;
		return -1;
	}
	return 0;
}

/* A settings record, as put_record wrote it. */
static void get_record(Get *r, DpStep *s, int rec)
{
	char *base = dp_step_record(s, rec);
	for (int i = 0; i < DP_NSETTINGS; i++) {
		const DpSetting *st = &dp_settings[i];
		if (st->rec != rec || st->alias)
			continue;
		char *f = base + st->offset;
		switch (st->ctype) {
		case DP_CT_U32:
			*(uint32_t *)f = get_u32(r);
			break;
		case DP_CT_U64:
			*(uint64_t *)f = get_u64(r);
			break;
		case DP_CT_F32:
			*(float *)f = get_f32(r);
			break;
		case DP_CT_AXES:
			for (int a = 0; a < DP_MAX_AXES; a++)
				((uint32_t *)f)[a] = get_u32(r);
			break;
		}
	}
}

static void get_tensor(Get *r, DpTensor *t)
{
	t->name = get_u32(r);
	t->dtype = get_u8(r);
	t->kind = get_u8(r);
	t->ndim = get_u8(r);
	t->init = get_u8(r);
	t->space = get_u8(r);
	for (int i = 0; i < DP_MAX_DIMS; i++)
		t->dims[i] = get_i64(r);
	t->offset = get_u64(r);
	t->nbytes = get_u64(r);
	for (int i = 0; i < DP_MAX_AXES; i++)
		t->place[i] = get_u8(r);
	for (int i = 0; i < DP_MAX_AXES; i++)
		t->place_dim[i] = (int8_t)get_u8(r);
	t->init_a = get_f32(r);
	t->init_b = get_f32(r);
	t->init_base = get_i64(r);
	t->ld = get_i64(r);
}

static void get_source(Get *r, DpSource *s)
{
	s->path = get_u32(r);
	s->kind = get_u8(r);
	s->split = get_u8(r);
	s->role = get_u8(r);
	s->shift = get_u8(r);
	s->seq_split = get_u8(r);
	s->tensor = get_i32(r);
	s->sample_elems = get_i64(r);
	s->synth_n = get_i64(r);
	s->synth_classes = get_i32(r);
	s->src_line = get_u32(r);
}

static void get_instr(Get *r, DpInstr *in)
{
	in->op = get_u16(r);
	in->stream = get_u8(r);
	in->flags = get_u8(r);
	in->stage1 = get_u16(r);
	for (int i = 0; i < DP_MAX_IN; i++)
		in->in[i] = get_i32(r);
	in->out = get_i32(r);
	for (int i = 0; i < DP_NIATTR; i++)
		in->ia[i] = get_i64(r);
	for (int i = 0; i < DP_NFATTR; i++)
		in->fa[i] = get_f32(r);
}

/* ---- semantic validation ---- */


static int check_str(const DpStep *s, uint32_t off, const char *what, char *err, size_t errlen)
{
	if (off >= s->nstrings) {
		fail(err, errlen, "%s: string offset %u out of range (string table has %u bytes)", what,
		     off, s->nstrings);
		return -1;
	}
	return 0;
}

/* Tensor id usable as an operand: in range and backed by arena memory. */
static int check_tid(const DpStep *s, int64_t id, int allow_none, const char *what, char *err,
		     size_t errlen)
{
	if (id == -1 && allow_none)
		return 0;
	if (id < 0 || id >= (int64_t)s->ntensors) {
		fail(err, errlen, "%s: tensor id %lld out of range [%s, %u)", what, (long long)id,
		     allow_none ? "-1" : "0", s->ntensors);
		return -1;
	}
	if (s->tensors[id].nbytes == 0) {
		fail(err, errlen, "%s: tensor %lld '%s' has no memory", what, (long long)id,
		     dpstep_str(s, s->tensors[id].name));
		return -1;
	}
	return 0;
}

static int validate_tensor(const DpStep *s, uint32_t i, char *err, size_t errlen)
{
	const DpTensor *t = &s->tensors[i];
	char what[64];
	snprintf(what, sizeof what, "tensor %u", i);
	if (check_str(s, t->name, what, err, errlen))
		return -1;
	const char *name = s->strings + t->name;
	if (t->dtype >= DP_NDTYPE || t->kind > DP_T_BUFFER || t->init > DP_INIT_ROPE_SIN ||
	    t->ndim > DP_MAX_DIMS) {
		fail(err, errlen, "tensor '%s': bad dtype/kind/init/ndim (%u/%u/%u/%u)", name, t->dtype,
		     t->kind, t->init, t->ndim);
		return -1;
	}
	uint64_t numel = 1;
	for (int d = 0; d < DP_MAX_DIMS; d++) {
		int64_t v = t->dims[d];
		if (d < t->ndim) {
			/* 2^40 elements per dim, and the product below, cannot overflow u64
			 * before the arena check rejects them */
			if (v < 1 || v > ((int64_t)1 << 40)) {
				fail(err, errlen, "tensor '%s': dim %d is %lld", name, d, (long long)v);
				return -1;
			}
			if (numel > UINT64_MAX / (uint64_t)v / 8) {
				fail(err, errlen, "tensor '%s': too many elements", name);
				return -1;
			}
			numel *= (uint64_t)v;
		} else if (v != 0 && v != 1) {
			fail(err, errlen, "tensor '%s': dim %d beyond ndim %u is %lld (must be 0 or 1)",
			     name, d, t->ndim, (long long)v);
			return -1;
		}
	}
	for (int a = 0; a < DP_MAX_AXES; a++) {
		if (t->place[a] > DP_PL_PARTIAL || t->place_dim[a] < -1 ||
		    t->place_dim[a] >= (t->ndim ? t->ndim : 1)) {
			fail(err, errlen, "tensor '%s': bad placement on axis %d (%u, dim %d)", name, a,
			     t->place[a], t->place_dim[a]);
			return -1;
		}
	}
	if (t->init_base < 0) {
		fail(err, errlen, "tensor '%s': negative init_base", name);
		return -1;
	}
	int64_t cols = t->ndim ? t->dims[t->ndim - 1] : 1;
	if (t->ld && (t->ld <= cols || t->ld > ((int64_t)1 << 40) ||
		      numel / (uint64_t)cols > UINT64_MAX / 8 / (uint64_t)t->ld)) {
		fail(err, errlen, "tensor '%s': row stride %lld for rows of %lld", name,
		     (long long)t->ld, (long long)cols);
		return -1;
	}
	if (t->ld)
		numel = numel / (uint64_t)cols * (uint64_t)t->ld; /* the elements it spans */
	if (t->nbytes == 0)
		return 0; /* no storage */
	size_t es = dp_dtype_size(t->dtype);
	if (t->space >= DP_NSPACE) {
		fail(err, errlen, "tensor '%s': bad memory space %u", name, t->space);
		return -1;
	}
	uint64_t arena = t->space == DP_SPACE_HOST ? s->cfg.host_arena_bytes : s->cfg.arena_bytes;
	if (t->offset > arena || t->nbytes > arena - t->offset) {
		fail(err, errlen,
		     "tensor '%s': bytes [%llu, +%llu) lie outside the %sarena of %llu bytes", name,
		     (unsigned long long)t->offset, (unsigned long long)t->nbytes,
		     t->space == DP_SPACE_HOST ? "host " : "", (unsigned long long)arena);
		return -1;
	}
	if (t->offset % es) {
		fail(err, errlen, "tensor '%s': offset %llu is not aligned to %zu bytes", name,
		     (unsigned long long)t->offset, es);
		return -1;
	}
	if (t->nbytes < numel * es) {
		fail(err, errlen, "tensor '%s': %llu bytes cannot hold %llu elements", name,
		     (unsigned long long)t->nbytes, (unsigned long long)numel);
		return -1;
	}
	return 0;
}

static int misplaced(const char *what, const char *where, char *err, size_t errlen)
{
	fail(err, errlen, "%s: allowed only in %s", what, where);
	return -1;
}

/* An operand that must be present and f32 (storage was checked by check_tid). */
static int check_f32(const DpStep *s, int32_t id, const char *role, const char *what, char *err,
		     size_t errlen)
{
	if (id < 0) {
		fail(err, errlen, "%s: missing %s", what, role);
		return -1;
	}
	if (s->tensors[id].dtype != DP_F32) {
		fail(err, errlen, "%s: %s '%s' is not f32", what, role,
		     dpstep_str(s, s->tensors[id].name));
		return -1;
	}
	return 0;
}

/* An operand that must be present and float (f32 or bf16). */
static int check_float(const DpStep *s, int32_t id, const char *role, const char *what, char *err,
		       size_t errlen)
{
	if (id < 0) {
		fail(err, errlen, "%s: missing %s", what, role);
		return -1;
	}
	if (s->tensors[id].dtype != DP_F32 && !dp_is_half(s->tensors[id].dtype)) {
		fail(err, errlen, "%s: %s '%s' is not f32, bf16 or f16", what, role,
		     dpstep_str(s, s->tensors[id].name));
		return -1;
	}
	return 0;
}

/* A collective moves one dtype: its float operands alike (the comm backend
 * reduces bf16 in f32). */
static int check_same_float(const DpStep *s, const DpInstr *in, const char *what, char *err,
			    size_t errlen)
{
	int a = in->in[0] >= 0 ? in->in[0] : in->out;
	if (check_float(s, a, "operand", what, err, errlen) ||
	    check_float(s, in->out, "output", what, err, errlen))
		return -1;
	if (s->tensors[a].dtype != s->tensors[in->out].dtype) {
		fail(err, errlen, "%s: '%s' and '%s' differ in dtype", what,
		     dpstep_str(s, s->tensors[a].name), dpstep_str(s, s->tensors[in->out].name));
		return -1;
	}
	return 0;
}

/* The axes of a collective or SHARD: a set of mesh axes. */
static int check_mask(const DpInstr *in, const char *what, char *err, size_t errlen)
{
	if (DP_AXES(in) < 0 || DP_AXES(in) >= (1 << DP_MAX_AXES)) {
		fail(err, errlen, "%s: bad axis mask %lld", what, (long long)DP_AXES(in));
		return -1;
	}
	return 0;
}

static int validate_instr(const DpStep *s, int p, uint32_t i, char *err, size_t errlen)
{
	const DpInstr *in = &s->prog[p][i];
	char what[96];
	int id;
	snprintf(what, sizeof what, "%s program, instruction %u", dp_prog_names[p], i);
	if (in->op >= DP_NOPS) {
		fail(err, errlen, "%s: unknown opcode %u", what, in->op);
		return -1;
	}
	snprintf(what, sizeof what, "%s program, instruction %u (%s)", dp_prog_names[p], i,
		 dp_op_names[in->op]);
	if (in->stream >= DP_NSTREAM) {
		fail(err, errlen, "%s: bad stream %u", what, in->stream);
		return -1;
	}
	if (in->stream == DP_STREAM_COPY && in->op != DP_OP_D2H && in->op != DP_OP_H2D &&
	    in->op != DP_OP_EVENT_RECORD && in->op != DP_OP_EVENT_WAIT && !host_kernel(s, in)) {
		fail(err, errlen, "%s: only host-device copies, host kernels and events run on the "
		     "copy stream", what);
		return -1;
	}
	if (in->stream == DP_STREAM_P2P && in->op != DP_OP_SEND && in->op != DP_OP_RECV &&
	    in->op != DP_OP_EVENT_RECORD && in->op != DP_OP_EVENT_WAIT) {
		fail(err, errlen, "%s: only pipeline sends, receives and events run on the p2p "
		     "stream", what);
		return -1;
	}
	if (in->flags & ~DP_IF_ALL) {
		fail(err, errlen, "%s: unknown flags 0x%x", what, in->flags);
		return -1;
	}
	if ((in->flags & (DP_IF_COMPRESSED | DP_IF_PLAIN)) &&
	    (p != DP_PROG_STEP || !(in->flags & DP_IF_LAST) || s->cfg.compress == DP_COMPRESS_NONE ||
	     (in->flags & DP_IF_COMPRESSED && in->flags & DP_IF_PLAIN))) {
		fail(err, errlen, "%s: flags 0x%x: a compressed or plain instruction is a last "
		     "one of the step program of a compressing step file, never both", what,
		     in->flags);
		return -1;
	}
	int stage = dp_instr_stage(in);
	if (stage >= (int)s->cfg.mesh[DP_AXIS_PP] ||
	    (stage >= 0 && p == DP_PROG_SAMPLE)) {
		fail(err, errlen, "%s: stage %d of a mesh with pp=%u%s", what, stage,
		     s->cfg.mesh[DP_AXIS_PP], stage < (int)s->cfg.mesh[DP_AXIS_PP] ?
		     " in the sample program" : "");
		return -1;
	}
	for (int k = 0; k < DP_MAX_IN; k++)
		if (check_tid(s, in->in[k], 1, what, err, errlen))
			return -1;
	if (check_tid(s, in->out, 1, what, err, errlen))
		return -1;
	switch (in->op) {
	case DP_OP_SEND:
	case DP_OP_RECV:
		/* a stage's transfer to a neighbouring stage over pp, of one float
		 * tensor; the stages are a ring (an interleaved pipeline's last
		 * stage of a round, on rank pp-1, sends to rank 0) */
		if (p != DP_PROG_STEP && p != DP_PROG_EVAL)
			return misplaced(what, "the step and eval programs", err, errlen);
		int64_t npp = (int64_t)s->cfg.mesh[DP_AXIS_PP];
		if (DP_AXES(in) != DP_AXIS_BIT(DP_AXIS_PP) || stage < 0 || npp < 2 ||
		    (DP_PEER(in) != (stage + 1) % npp && DP_PEER(in) != (stage + npp - 1) % npp) ||
		    DP_PEER(in) < 0 || DP_PEER(in) >= npp) {
			fail(err, errlen, "%s: not a transfer over pp between neighbouring stages (axes %lld, "
			     "stage %d, peer %lld)", what, (long long)DP_AXES(in), stage,
			     (long long)DP_PEER(in));
			return -1;
		}
		if (DP_TAG(in) < 0 || DP_TAG(in) > 32767) { /* MPI promises tags up to 32767 */
			fail(err, errlen, "%s: tag %lld out of range [0, 32767]", what, (long long)DP_TAG(in));
			return -1;
		}
		if (check_float(s, in->op == DP_OP_SEND ? in->in[0] : in->out,
				in->op == DP_OP_SEND ? "input" : "output", what, err, errlen))
			return -1;
		break;
	case DP_OP_EVENT_RECORD:
	case DP_OP_EVENT_WAIT:
		if (DP_EVENT(in) < 0 || DP_EVENT(in) >= (int64_t)s->nevents) {
			fail(err, errlen, "%s: event %lld out of range [0, %u)", what,
			     (long long)DP_EVENT(in), s->nevents);
			return -1;
		}
		break;
	case DP_OP_LOAD:
		if (p != DP_PROG_STEP && p != DP_PROG_EVAL)
			return misplaced(what, "the step and eval programs", err, errlen);
		if (DP_ATTR(in, LOAD, source) < 0 || DP_ATTR(in, LOAD, source) >= (int64_t)s->nsources) {
			fail(err, errlen, "%s: source %lld out of range [0, %u)", what,
			     (long long)DP_ATTR(in, LOAD, source), s->nsources);
			return -1;
		}
		/* a micro-batch of its own: only in a step program that holds them all */
		if (DP_ATTR(in, LOAD, micro) != 0 &&
		    (p != DP_PROG_STEP || !dp_step_unrolled(&s->cfg) ||
		     DP_ATTR(in, LOAD, micro) < 0 || DP_ATTR(in, LOAD, micro) >= (int64_t)s->cfg.grad_accum)) {
			fail(err, errlen, "%s: micro-batch %lld out of range [0, %u)", what,
			     (long long)DP_ATTR(in, LOAD, micro),
			     p == DP_PROG_STEP && dp_step_unrolled(&s->cfg) ? s->cfg.grad_accum : 1);
			return -1;
		}
		break;
	case DP_OP_ALL_REDUCE:
	case DP_OP_REDUCE_SCATTER:
	case DP_OP_ALL_GATHER:
	case DP_OP_TP_REDUCE:
		/* INIT runs before anything is synchronised and must stay local: every
		 * rank computes the same full values and cuts its own shard */
		if (p == DP_PROG_INIT)
			return misplaced(what, "the step, eval and export programs", err, errlen);
		if (check_mask(in, what, err, errlen) || check_same_float(s, in, what, err, errlen))
			return -1;
		/* a sub-group of pp stages: two or more of the mesh's, over pp, run by
		 * one of them (each runs its own copy) */
		if (in->op == DP_OP_ALL_REDUCE && DP_ATTR(in, ALL_REDUCE, stages)) {
			uint64_t set = (uint64_t)DP_ATTR(in, ALL_REDUCE, stages);
			uint32_t npp = s->cfg.mesh[DP_AXIS_PP];
			if (npp > 64 || (npp < 64 && set >> npp) || !(set & (set - 1)) ||
			    !(DP_AXES(in) & DP_AXIS_BIT(DP_AXIS_PP)) || stage < 0 || !(set >> stage & 1)) {
				fail(err, errlen, "%s: stages 0x%llx is not a group of two or more of the "
				     "%u pipeline stages over pp that holds the instruction's stage %d",
				     what, (unsigned long long)set, npp, stage);
				return -1;
			}
		}
		break;
	case DP_OP_INIT:
		if (p != DP_PROG_INIT)
			return misplaced(what, "the init program", err, errlen);
		/* initial values are f32, rounded to bf16 for a bf16 buffer */
		if (check_float(s, in->out, "output", what, err, errlen))
			return -1;
		/* in0, when given, is the parameter the output is the whole of;
		 * state with an init spec (PowerSGD's Q) is initialised too */
		id = in->in[0] >= 0 ? in->in[0] : in->out;
		if (s->tensors[id].kind != DP_T_PARAM && s->tensors[id].kind != DP_T_BUFFER &&
		    !(s->tensors[id].kind == DP_T_OPTSTATE && s->tensors[id].init != DP_INIT_NONE)) {
			fail(err, errlen, "%s: '%s' is not a parameter, a buffer or state with an "
			     "init spec", what,
			     dpstep_str(s, s->tensors[id].name));
			return -1;
		}
		break;
	case DP_OP_SAVE:
		if (p != DP_PROG_EXPORT)
			return misplaced(what, "the export program", err, errlen);
		if (check_f32(s, in->in[0], "input", what, err, errlen))
			return -1;
		/* in1, when given, is the parameter in0 is the whole of */
		id = in->in[1] >= 0 ? in->in[1] : in->in[0];
		if (s->tensors[id].kind != DP_T_PARAM) {
			fail(err, errlen, "%s: '%s' is not a parameter", what,
			     dpstep_str(s, s->tensors[id].name));
			return -1;
		}
		break;
	case DP_OP_AMP_CHECK: /* the step's overflow check: one f32 norm */
		if (p != DP_PROG_STEP)
			return misplaced(what, "the step program", err, errlen);
		if (s->opt.loss_scale == DP_LS_NONE) {
			fail(err, errlen, "%s: a loss-scaling check in a step file without loss scaling",
			     what);
			return -1;
		}
		if (check_f32(s, in->in[0], "input", what, err, errlen))
			return -1;
		if (dp_numel(&s->tensors[in->in[0]]) != 1) {
			fail(err, errlen, "%s: the norm is not one element", what);
			return -1;
		}
		break;
	case DP_OP_SHARD:
		if (p != DP_PROG_INIT && p != DP_PROG_STEP)
			return misplaced(what, "the init and step programs", err, errlen);
		if (in->in[0] < 0 || in->out < 0) { /* the executor copies in0's slice to out */
			fail(err, errlen, "%s: missing %s", what, in->out < 0 ? "output" : "input 0");
			return -1;
		}
		if (check_same_float(s, in, what, err, errlen) || check_mask(in, what, err, errlen))
			return -1;
		break;
	default:
		return dpstep_check_operands(s, in, what, err, errlen);
	}
	return 0;
}

/* The sample program and its two tensors come together: i32 tokens
 * [1, ctx] (one sequence: version 15) and f32, bf16 or f16 logits of
 * ctx * vocab elements (what the runtime writes and reads whole). */
static int validate_sample(const DpStep *s, char *err, size_t errlen)
{
	int32_t tok = s->metrics.sample_tokens, lg = s->metrics.sample_logits;
	if (check_tid(s, tok, 1, "the sample program's tokens", err, errlen) ||
	    check_tid(s, lg, 1, "the sample program's logits", err, errlen))
		return -1;
	if ((tok >= 0) != (lg >= 0) || (lg >= 0) != (s->nprog[DP_PROG_SAMPLE] > 0)) {
		fail(err, errlen, "the sample program (%u instructions) without its tokens and logits",
		     s->nprog[DP_PROG_SAMPLE]);
		return -1;
	}
	if (tok < 0)
		return 0;
	const DpTensor *t = &s->tensors[tok], *l = &s->tensors[lg];
	int64_t nt = dp_numel(t), nl = dp_numel(l);
	if (t->dtype != DP_I32 || t->ndim != 2 || t->dims[0] != 1 ||
	    (l->dtype != DP_F32 && !dp_is_half(l->dtype)) || l->ndim < 2 || nt < 1 ||
	    l->dims[l->ndim - 1] < 1 || nl != nt * l->dims[l->ndim - 1]) {
		fail(err, errlen, "the sample program's tokens must be i32 [1, ctx] and its logits "
		     "f32, bf16 or f16 [1, ctx, vocab]");
		return -1;
	}
	return 0;
}

static int validate(const DpStep *s, char *err, size_t errlen)
{
	const DpConfig *c = &s->cfg;
	uint64_t world = 1;
	for (int a = 0; a < DP_MAX_AXES; a++) {
		if (c->mesh[a] < 1 || c->mesh[a] > (1u << 20)) {
			fail(err, errlen, "mesh axis %d has size %u", a, c->mesh[a]);
			return -1;
		}
		world *= c->mesh[a];
	}
	if (world > (1u << 24)) {
		fail(err, errlen, "mesh of %llu ranks is too large", (unsigned long long)world);
		return -1;
	}
	if (c->micro_batch < 1 || c->grad_accum < 1) {
		fail(err, errlen, "micro_batch (%u) and grad_accum (%u) must be >= 1", c->micro_batch,
		     c->grad_accum);
		return -1;
	}
	/* the settings that name one of a few things (a strategy, a kind, a word) */
	for (int i = 0; i < DP_NSETTINGS; i++) {
		int n = dp_setting_nvalues(i);
		const void *f = dp_setting_cfield(s, i);
		if (n && f && !dp_settings[i].alias && dp_field_geti(f, dp_settings[i].ctype) >= n) {
			fail(err, errlen, "unknown %s %lld", dp_settings[i].name,
			     (long long)dp_field_geti(f, dp_settings[i].ctype));
			return -1;
		}
	}
	if (s->nstrings && s->strings[s->nstrings - 1] != '\0') {
		fail(err, errlen, "string table is not NUL-terminated");
		return -1;
	}
	if (s->source && s->source >= s->nstrings) {
		fail(err, errlen, "the .dp path's string offset %u is out of range", s->source);
		return -1;
	}
	for (uint32_t i = 0; i < s->ntensors; i++)
		if (validate_tensor(s, i, err, errlen))
			return -1;
	for (uint32_t i = 0; i < s->nsources; i++) {
		const DpSource *src = &s->sources[i];
		char what[64];
		snprintf(what, sizeof what, "source %u", i);
		if (check_str(s, src->path, what, err, errlen) ||
		    check_tid(s, src->tensor, 0, what, err, errlen))
			return -1;
		if (src->kind > DP_SRC_SAMPLE_KEYS || src->split > DP_SPLIT_EVAL || src->role > 1 ||
		    src->shift > 1 || src->seq_split > 1 ||
		    src->sample_elems < 0 || src->synth_n < 0 || src->synth_classes < 0 ||
		    src->synth_classes > 65536) {
			fail(err, errlen, "%s: bad kind/split/role/sizes", what);
			return -1;
		}
	}
	int32_t mids[4] = {s->metrics.loss, s->metrics.grad_norm, s->metrics.eval_loss,
			   s->metrics.eval_correct};
	static const char *const mnames[4] = {"loss", "grad_norm", "eval_loss", "eval_correct"};
	for (int m = 0; m < 4; m++) {
		char what[64];
		snprintf(what, sizeof what, "metric %s", mnames[m]);
		if (check_tid(s, mids[m], 1, what, err, errlen))
			return -1;
		if (mids[m] >= 0) {
			const DpTensor *t = &s->tensors[mids[m]];
			uint64_t need_el = m == 3 ? 2 : 1;
			/* the runtime reads exactly this many into a fixed host array
			 * (the dims were checked with the tensors) */
			if (t->dtype != DP_F32 || (uint64_t)dp_numel(t) != need_el) {
				fail(err, errlen, "%s: must be f32 with exactly %llu element(s)", what,
				     (unsigned long long)need_el);
				return -1;
			}
		}
	}
	if (validate_sample(s, err, errlen))
		return -1;
	for (int p = 0; p < DP_NPROG; p++)
		for (uint32_t i = 0; i < s->nprog[p]; i++)
			if (validate_instr(s, p, i, err, errlen))
				return -1;
	return 0;
}

int dpstep_decode(const unsigned char *buf, size_t len, DpStep *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	if (len < DP_STEP_HEADER_BYTES) {
		size_t k = len < 8 ? len : 8;
		if (len == 0 || memcmp(buf, DP_STEP_MAGIC, k) != 0)
			fail(err, errlen, "not a dp step file");
		else
			fail(err, errlen, "truncated: expected at least %d bytes, got %zu",
			     DP_STEP_HEADER_BYTES, len);
		return -1;
	}
	if (memcmp(buf, DP_STEP_MAGIC, 8) != 0) {
		fail(err, errlen, "not a dp step file");
		return -1;
	}
	Get r = {buf + 8, buf + len, 0, "header"};
	uint32_t version = get_u32(&r);
	if (version > DP_STEP_VERSION) {
		fail(err, errlen,
		     "step file format version %u is newer than this dpexec supports (%u); rebuild dpexec",
		     version, DP_STEP_VERSION);
		return -1;
	}
	if (version < DP_STEP_VERSION_MIN) {
		fail(err, errlen, "step file format version %u is not supported (this dpexec reads %u to %u); recompile with dpc",
		     version, DP_STEP_VERSION_MIN, DP_STEP_VERSION);
		return -1;
	}
	uint32_t crc_file = get_u32(&r);
	uint64_t size = get_u64(&r);
	if (size > len) {
		fail(err, errlen, "truncated: expected %llu bytes, got %zu", (unsigned long long)size,
		     len);
		return -1;
	}
	if (size < len) {
		fail(err, errlen, "bad size: expected %llu bytes, got %zu (trailing bytes)",
		     (unsigned long long)size, len);
		return -1;
	}
	uLong crc = crc32(0L, Z_NULL, 0);
	/* crc32 takes a uInt length: feed large files in pieces */
	for (size_t off = DP_STEP_HEADER_BYTES; off < len;) {
		size_t n = len - off > (1u << 30) ? (1u << 30) : len - off;
		crc = crc32(crc, buf + off, (uInt)n);
		off += n;
	}
	if ((uint32_t)crc != crc_file) {
		fail(err, errlen, "checksum mismatch: file is corrupted");
		return -1;
	}

	DpStep *s = out;
	for (int rec = DP_REC_CFG; rec <= DP_REC_SCHED; rec++)
		get_record(&r, s, rec);
	s->metrics.loss = get_i32(&r);
	s->metrics.grad_norm = get_i32(&r);
	s->metrics.eval_loss = get_i32(&r);
	s->metrics.eval_correct = get_i32(&r);
	s->metrics.sample_tokens = get_i32(&r);
	s->metrics.sample_logits = get_i32(&r);
	s->nevents = get_u32(&r);
	s->source = get_u32(&r);
	const char *what = "header records";
	if (r.bad)
		goto truncated;
	what = "string table";
	if (get_count(&r, 1, &s->nstrings))
		goto truncated;
	s->strings = malloc(s->nstrings ? s->nstrings : 1);
	if (!s->strings)
		goto nomem;
	memcpy(s->strings, r.p, s->nstrings);
	r.p += s->nstrings;

	what = "tensor table";
	if (get_count(&r, TENSOR_BYTES, &s->ntensors))
		goto truncated;
	s->tensors = calloc(s->ntensors ? s->ntensors : 1, sizeof(DpTensor));
	if (!s->tensors)
		goto nomem;
	for (uint32_t i = 0; i < s->ntensors; i++)
		get_tensor(&r, &s->tensors[i]);

	what = "source table";
	if (get_count(&r, SOURCE_BYTES, &s->nsources))
		goto truncated;
	s->sources = calloc(s->nsources ? s->nsources : 1, sizeof(DpSource));
	if (!s->sources)
		goto nomem;
	for (uint32_t i = 0; i < s->nsources; i++)
		get_source(&r, &s->sources[i]);

	for (int p = 0; p < DP_NPROG; p++) {
		what = dp_prog_names[p];
		if (get_count(&r, INSTR_BYTES, &s->nprog[p]))
			goto truncated;
		s->prog[p] = calloc(s->nprog[p] ? s->nprog[p] : 1, sizeof(DpInstr));
		if (!s->prog[p])
			goto nomem;
		for (uint32_t i = 0; i < s->nprog[p]; i++)
			get_instr(&r, &s->prog[p][i]);
	}
	if (r.bad)
		goto truncated;
	if (r.p != r.end) {
		fail(err, errlen, "malformed: %zu unused bytes after the last program",
		     (size_t)(r.end - r.p));
		goto bad;
	}
	if (validate(s, err, errlen))
		goto bad;
	if (dp_step_version(s) > version) {
		/* what the newer format added and this file holds (DP_STEP_VERSION's notes) */
		static const char *const added[] = {
			"pipeline stage groups, and an all_reduce names one",
			"pad_rows, and the file holds one",
			"p2p stream, and an instruction is on it",
			"host kernel on the copy stream, and the file holds one",
		};
		uint32_t need = dp_step_version(s);
		fail(err, errlen, "malformed: format %u has no %s", version,
		     need >= 20 && need - 20 < sizeof added / sizeof *added ? added[need - 20] : "?");
		goto bad;
	}
	return 0;

truncated:
	fail(err, errlen, "malformed: the %s runs past the end of the file", what);
	goto bad;
nomem:
	fail(err, errlen, "out of memory reading the %s", what);
bad:
	dpstep_free(s);
	return -1;
}

void dpstep_free(DpStep *s)
{
	if (!s)
		return;
	free(s->strings);
	free(s->tensors);
	free(s->sources);
	for (int p = 0; p < DP_NPROG; p++)
		free(s->prog[p]);
	memset(s, 0, sizeof *s);
}

const char *dpstep_str(const DpStep *s, uint32_t off)
{
	if (!s->strings || off >= s->nstrings)
		return "";
	return s->strings + off;
}

int dpstep_write_file(const DpStep *s, const char *path, char *err, size_t errlen)
{
	unsigned char *buf;
	size_t len;
	if (dpstep_encode(s, &buf, &len)) {
		fail(err, errlen, "%s: out of memory encoding the step file", path);
		return -1;
	}
	OutFile f;
	int rc = out_open(&f, path, err, errlen);
	if (rc == 0) {
		out_write(&f, buf, len);
		rc = out_commit(&f, err, errlen);
	}
	free(buf);
	return rc;
}

int dpstep_read_file(const char *path, DpStep *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	FILE *f = fopen(path, "rb");
	if (!f) {
		fail(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
		fail(err, errlen, "%s: not a regular file", path);
		fclose(f);
		return -1;
	}
	size_t len = (size_t)st.st_size;
	unsigned char *buf = malloc(len ? len : 1);
	if (!buf) {
		fail(err, errlen, "%s: out of memory (%zu bytes)", path, len);
		fclose(f);
		return -1;
	}
	size_t got = fread(buf, 1, len, f);
	int rerr = ferror(f);
	fclose(f);
	if (rerr) {
		fail(err, errlen, "cannot read %s", path);
		free(buf);
		return -1;
	}
	char why[512];
	int rc = dpstep_decode(buf, got, out, why, sizeof why);
	if (rc)
		fail(err, errlen, "%s: %s", path, why);
	free(buf);
	return rc;
}
