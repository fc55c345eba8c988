/*
 * roofline.c - `dpc --stats --device h100`: the step's time on one GPU
 * predicted from the device's published peak rates, per kernel class, and
 * the MFU it implies, before any GPU has measured it.
 *
 * Each compute node of the STEP program (DP_IF_LAST ones once per optimizer
 * step, the others once per micro-batch) takes max(flops / rate, bytes /
 * bandwidth): the op registry's cost rule (flops, and bytes read + written,
 * each value once), the rate of the units its CUDA kernel runs on, the
 * device's memory bandwidth. That is a roofline: every kernel at the peak of
 * the resource that limits it, so the times are lower bounds and the MFU an
 * upper one. Not counted: collectives (on one GPU there are none; on more
 * they overlap compute, and the --stats table above sizes them), the gaps
 * between a graph's kernel nodes, and cache reuse between kernels.
 *
 * Classes. gemm: matmul and linear (and the fused linear_gelu and
 * matmul_gelu_grad, whose gelu is in the GEMM's epilogue: passes/fuse.c), on tensor cores with bf16 operands (or
 * f32 ones under `gemm_math tf32`), else on the CUDA cores' fp32 FMA (as
 * cuBLASLt runs CUBLAS_COMPUTE_32F). attention: runtime/cuda/attention.cu
 * tiles like flash attention but multiplies with scalar fp32 FMA on the CUDA
 * cores; the MFU is printed both so and with the attention on tensor cores
 * (the kernel GPU speed part 1 brings), so that each part's share shows.
 * optimizer: clip, norms, SGD, AdamW. memory-bound: everything else (norms,
 * activations, the loss, embeddings, casts, copies, bias gradients).
 *
 * MFU = model FLOPs / (time x the dense bf16 peak): the GEMMs' FLOPs (two
 * per multiply-add, forward and backward: PaLM's 6 N per token for the
 * parameters the GEMMs hold) and PaLM's attention term, 12 T d per token and
 * layer (runtime/metrics.c's MFU, which dpexec logs, counts the same); a
 * recomputed forward counts in the time, not in the model FLOPs.
 */
#include <string.h>

#include "passes.h"

/* One device's published figures (dense, no sparsity). */
typedef struct {
	const char *name, *what;
	double bf16, tf32, fp32; /* FLOP/s: tensor cores bf16 and tf32, CUDA cores fp32 FMA */
	double bw;               /* memory bandwidth, bytes/s */
} Device;

static const Device devices[] = {
	/* NVIDIA H100 SXM5 datasheet: 989.4 TFLOP/s bf16 and 494.7 tf32 dense,
	 * 66.9 fp32, HBM3 3.35 TB/s */
	{"h100", "H100 SXM", 989.4e12, 494.7e12, 66.9e12, 3.35e12},
};

enum { C_GEMM, C_ATTN, C_MEM, C_OPTIM, C_NCLASS };

static const char *const class_names[C_NCLASS] = {"gemm", "attention", "memory-bound", "optimizer"};

static int class_of(IrOp op)
{
	switch (op) {
	case DP_OP_MATMUL:
	case DP_OP_LINEAR:
	case DP_OP_LINEAR_GELU:
	case DP_OP_MATMUL_GELU_GRAD:
		return C_GEMM;
	case DP_OP_ATTENTION:
	case DP_OP_ATTENTION_GRAD:
	case DP_OP_ATTENTION_CP:
	case DP_OP_ATTENTION_CP_GRAD:
	case DP_OP_ATTENTION_CP_GRAD_KV:
		return C_ATTN;
	case DP_OP_SQNORM:
	case DP_OP_SQRT:
	case DP_OP_CLIP:
	case DP_OP_SGD:
	case DP_OP_ADAMW:
		return C_OPTIM;
	default:
		return C_MEM;
	}
}

/* The elementwise flops a fused GEMM's epilogue adds to its product's
 * (passes/fuse.c): gelu over linear_gelu's second half, gelu' over
 * matmul_gelu_grad's output. */
static double epilogue_flops(const Graph *g, const Node *n)
{
	double out = (double)ir_numel(g->values[n->out]);
	if (n->op == DP_OP_LINEAR_GELU)
		return ir_ops[n->op].cost_k * out / 2;
	if (n->op == DP_OP_MATMUL_GELU_GRAD)
		return ir_ops[n->op].cost_k * out;
	return 0;
}

const char *roofline_devices(void)
{
	return "h100";
}

int roofline_known(const char *name)
{
	for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++)
		if (!strcmp(devices[i].name, name))
			return 1;
	return 0;
}

typedef struct {
	double n, flops, bytes, ms;
	int tensor;  /* its FLOPs run on tensor cores (some, for gemm) */
	int cuda;    /* ... on the CUDA cores (some) */
} Row;

/* The time of one node's cost at `rate`, in ms. */
static double node_ms(const Device *d, double flops, double bytes, double rate)
{
	double t = flops / rate, m = bytes / d->bw;
	return 1e3 * (t > m ? t : m);
}

void roofline_print(FILE *out, const Graph *g, const char *device)
{
	const Device *d = NULL;
	for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++)
		if (!strcmp(devices[i].name, device))
			d = &devices[i];
	if (!d)
		die("roofline_print: unknown device %s", device);
	double accum = g->cfg.grad_accum ? g->cfg.grad_accum : 1;
	Row row[C_NCLASS] = {{0}};
	double attn_tc_ms = 0, model = 0, tokens = 0, epilogue = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || !ir_ops[n->op].cost || dp_op_class(n->op) != DP_OPC_KERNEL)
			continue;
		double f = 0, b = 0, times = n->flags & DP_IF_LAST ? 1 : accum;
		ir_ops[n->op].cost(g, n, &f, &b);
		int c = class_of(n->op);
		double rate = d->fp32;
		if (c == C_GEMM) { /* the operands' dtype: bf16, or f32 (tf32 when asked) */
			DpDtype in0 = g->values[n->in[0]]->dtype;
			if (in0 == DP_BF16 || g->cfg.gemm_math == DP_GEMM_TF32)
				rate = in0 == DP_BF16 ? d->bf16 : d->tf32;
		}
		Row *r = &row[c];
		r->n += times;
		r->flops += times * f;
		r->bytes += times * b;
		r->ms += times * node_ms(d, f, b, rate);
		r->tensor |= rate != d->fp32 && f > 0;
		r->cuda |= rate == d->fp32 && f > 0;
		if (c == C_ATTN)
			attn_tc_ms += times * node_ms(d, f, b, d->bf16);
		if (n->recompute)
			continue;
		if (c == C_GEMM) { /* the product's: not a fused epilogue's gelu */
			model += times * (f - epilogue_flops(g, n));
			epilogue += times * epilogue_flops(g, n);
		}
		if (n->op == DP_OP_ATTENTION) { /* qkv [.., T, 3 d]: 12 T d per token */
			const Value *q = g->values[n->in[0]];
			double T = (double)q->dims[q->ndim - 2], dm = (double)q->dims[q->ndim - 1] / 3;
			double tok = 1;
			for (int k = 0; k < q->ndim - 1; k++)
				tok *= (double)q->dims[k];
			model += times * 12 * T * dm * tok;
			tokens = times * tok; /* every layer's attention sees the same tokens */
		}
	}
	char c1[64], c2[64];
	fprintf(out, "roofline on %s (%s: %.1f TFLOP/s dense bf16 and %.1f tf32 on tensor cores, "
		"%.1f fp32 on CUDA cores, %.2f TB/s), per rank, per optimizer step: each kernel at the "
		"peak of what limits it (a lower bound; no collectives, no gaps between kernels)\n",
		d->name, d->what, d->bf16 / 1e12, d->tf32 / 1e12, d->fp32 / 1e12, d->bw / 1e12);
	fprintf(out, "%-14s %9s %18s %18s %-13s %11s\n", "kernel class", "kernels", "flops", "bytes",
		"units", "ms");
	double total = 0;
	for (int c = 0; c < C_NCLASS; c++) {
		const Row *r = &row[c];
		total += r->ms;
		char u[32];
		snprintf(u, sizeof u, "%s", r->tensor && r->cuda ? "tensor+cuda" : r->tensor ? "tensor"
					   : r->cuda ? "cuda" : "-");
		fprintf(out, "%-14s %9.0f %18s %18s %-13s %11.4f\n", class_names[c], r->n,
			stats_human_flops(c1, sizeof c1, r->flops), stats_human_bytes(c2, sizeof c2, r->bytes), u,
			r->ms);
	}
	fprintf(out, "%-14s %9.0f %18s %18s %-13s %11.4f\n", "total",
		row[C_GEMM].n + row[C_ATTN].n + row[C_MEM].n + row[C_OPTIM].n,
		stats_human_flops(c1, sizeof c1,
			       row[C_GEMM].flops + row[C_ATTN].flops + row[C_MEM].flops + row[C_OPTIM].flops),
		stats_human_bytes(c2, sizeof c2,
			       row[C_GEMM].bytes + row[C_ATTN].bytes + row[C_MEM].bytes + row[C_OPTIM].bytes),
		"", total);
	double with_tc = total - row[C_ATTN].ms + attn_tc_ms;
	fprintf(out, "model flops %s (the GEMMs' and 12 T d per token and layer of attention)\n",
		stats_human_flops(c1, sizeof c1, model));
	if (epilogue > 0)
		fprintf(out, "gemm epilogue flops %s (the gelu of linear_gelu and matmul_gelu_grad: in "
			"the gemm row, not in the model flops)\n", stats_human_flops(c1, sizeof c1, epilogue));
	if (total > 0 && row[C_ATTN].n > 0) /* a token model: its tokens/s too */
		fprintf(out, "predicted MFU %.1f %% (%.0f tokens/s), attention on the CUDA cores as "
			"runtime/cuda/attention.cu runs it\n", 100 * model / (total * 1e-3 * d->bf16),
			tokens / (total * 1e-3));
	else if (total > 0)
		fprintf(out, "predicted MFU %.1f %%\n", 100 * model / (total * 1e-3 * d->bf16));
	if (with_tc > 0 && row[C_ATTN].n > 0)
		fprintf(out, "predicted MFU %.1f %% (%.0f tokens/s), attention on tensor cores "
			"(%.3f ms)\n", 100 * model / (with_tc * 1e-3 * d->bf16), tokens / (with_tc * 1e-3),
			attn_tc_ms);
}
