/*
 * cpu/check.c - the helpers of the CPU kernels' load-time operand checks
 * (each kernel file holds its ops' checks; this file names no op).
 *
 * These checks are generic facts of an op (which operands, dtypes, element
 * counts, no aliasing), run once per instruction when a step file is
 * loaded so that a kernel never reads or writes outside a tensor. The
 * step-file decoder takes them over from the op table; then the rows'
 * `operands` members and this file go. The backend's own limits (BLAS int
 * sizes, no bf16) are the rows' `limits` and stay.
 */
#include "cpu.h"

const char *cpu_tname(const DpStep *s, int id)
{
	return id >= 0 ? dpstep_str(s, s->tensors[id].name) : "-";
}

int cpu_bad(const CpuChk *c, const char *what)
{
	return RT_FAIL(c->e, "step file: %s instruction (out %s, in %s, %s): %s",
		       dp_kernel_names[c->in->op], cpu_tname(c->s, c->in->out),
		       cpu_tname(c->s, c->in->in[0]), cpu_tname(c->s, c->in->in[1]), what);
}

const DpTensor *cpu_opnd(const CpuChk *c, int k, DpDtype dt)
{
	int id = k < 0 ? c->in->out : c->in->in[k];
	if (id < 0) {
		cpu_bad(c, k < 0 ? "missing output" : "missing input");
		return NULL;
	}
	const DpTensor *t = &c->s->tensors[id];
	if (t->dtype != dt) {
		cpu_bad(c, "operand has the wrong dtype");
		return NULL;
	}
	return t;
}

int cpu_disjoint(const DpTensor *a, const DpTensor *b)
{
	return a->offset + a->nbytes <= b->offset || b->offset + b->nbytes <= a->offset;
}

int cpu_out_disjoint(const CpuChk *c)
{
	const DpTensor *o = &c->s->tensors[c->in->out];
	for (int k = 0; k < DP_MAX_IN; k++)
		if (c->in->in[k] >= 0 && !cpu_disjoint(o, &c->s->tensors[c->in->in[k]]))
			return 0;
	return 1;
}

int cpu_check_same_size(const DpStep *s, const DpInstr *in, int nin, RtErr *e)
{
	CpuChk c = {s, in, e};
	CPU_OPND(o, -1, DP_F32);
	for (int k = 0; k < nin; k++)
		if (!cpu_opnd(&c, k, DP_F32))
			return -1;
	for (int k = 0; k < nin; k++)
		CPU_NEED(cpu_numel(&s->tensors[in->in[k]]) == cpu_numel(o), "operands differ in size");
	return 0;
}
