/*
 * cpu/check.c - the message helper of the CPU backend's load-time limits
 * (each kernel file holds its ops' limits; this file names no op).
 *
 * An op's operand rules (which operands, dtypes, element counts, no
 * aliasing) are the step-file decoder's (format/stepfile_check.c), from the op
 * table, for every backend; what is left here is this backend's own:
 * BLAS's int sizes, bf16 where a kernel has no bf16 path.
 */
#include "cpu.h"

const char *cpu_tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

int cpu_bad(const CpuChk *c, const char *what)
{
	return RT_FAIL(c->e, "step file: %s instruction (out %s, in %s, %s): %s",
		       dp_op_names[c->in->op], cpu_tname(c->s, c->in->out),
		       cpu_tname(c->s, c->in->in[0]), cpu_tname(c->s, c->in->in[1]), what);
}
