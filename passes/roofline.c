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
 * cuBLASLt runs CUBLAS_COMPUTE_32F). attention: priced at the FLOPs
 * runtime/cuda/attention.cu executes (attn_executed: its backward recomputes
 * more than the op's cost rule counts) on the units it runs them on (tensor
 * cores for bf16 attention, ordinary or cp, with head dim 32, 64 or 128,
 * and for f32 attention so under `gemm_math tf32`, at the tf32 rate; else
 * the CUDA cores' scalar FMA); the MFU is printed both so and with all of it on
 * tensor cores (f32 attention at the tf32 rate, 16-bit at bf16's), so that
 * each part's share shows.
 * optimizer: clip, norms, SGD, AdamW. memory-bound: everything else (norms,
 * activations, the loss, embeddings, casts, copies, bias gradients); the
 * residual adds passes/fuse.c folded into layernorms (add_layernorm,
 * layernorm_grad_add) and rmsnorms (add_rmsnorm, rmsnorm_grad_add) are
 * counted on a line of their own per norm: each is one kernel and one pass
 * over the activation fewer than the pair it replaced; so are the
 * layernorms' gamma and beta gradients in one pass (layernorm_grad_gb): one
 * kernel and one read of dy fewer than layernorm_grad_g and bias_grad.
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
	int64_t mem;             /* device memory, bytes */
} Device;

static const Device devices[] = {
	/* NVIDIA H100 SXM5 datasheet: 989.4 TFLOP/s bf16 and 494.7 tf32 dense,
	 * 66.9 fp32, HBM3 3.35 TB/s, 80 GB (five 16 GiB stacks: 80 GiB) */
	{"h100", "H100 SXM", 989.4e12, 494.7e12, 66.9e12, 3.35e12, (int64_t)80 << 30},
};

int64_t roofline_memory(const char *name)
{
	for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++)
		if (!strcmp(devices[i].name, name))
			return devices[i].mem;
	return 0;
}

enum { C_GEMM, C_ATTN, C_MEM, C_OPTIM, C_NCLASS };

static const char *const class_names[C_NCLASS] = {"gemm", "attention", "memory-bound", "optimizer"};

static int class_of(IrOp op)
{
	if (dp_op_is_gemm(op))
		return C_GEMM;
	if (dp_op_is_attention(op))
		return C_ATTN;
	switch (op) {
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

/* The bytes of value v (a view: its root's, all of them). */
static void value_bytes(const Graph *g, int v, int64_t *lo, int64_t *hi)
{
	const Value *x = g->values[v];
	while (x->view_of >= 0)
		x = g->values[x->view_of];
	*lo = x->offset;
	*hi = x->offset + x->nbytes;
}

/* Does node k write any byte of value v? */
static int writes_bytes(const Graph *g, const Node *k, int v)
{
	int64_t a, b, c, d;
	if (k->out < 0 || g->values[k->out]->offset < 0 || g->values[v]->offset < 0)
		return k->out >= 0; /* unplanned: assume it may */
	value_bytes(g, k->out, &a, &b);
	value_bytes(g, v, &c, &d);
	return a < d && c < b;
}

/* Does the CUDA backend pair attention gradient nodes[j] (attention_grad,
 * attention_cp_grad or _kv) with its forward (cu_plan_attn,
 * runtime/cuda/attention.cu): the latest forward before it in the step on
 * the same qkv (cp: and gathered kv and positions), same stream and
 * condition, with nothing between writing those or the forward's output?
 * Then the backward takes the forward's lse and O instead of running the
 * forward again. */
static int attn_paired(const Graph *g, int j)
{
	const Node *n = g->nodes[j];
	IrOp fop = n->op == DP_OP_ATTENTION_GRAD ? DP_OP_ATTENTION : DP_OP_ATTENTION_CP;
	int nops = fop == DP_OP_ATTENTION_CP ? 3 : 1, i = j; /* operands after dy */
	while (--i >= 0) {
		const Node *k = g->nodes[i];
		if (!(k->progs & IR_IN_STEP))
			continue;
		int same = k->op == fop, w = 0;
		for (int o = 0; o < nops; o++) {
			same = same && k->in[o] == n->in[o + 1];
			w |= writes_bytes(g, k, n->in[o + 1]);
		}
		if (same)
			break;
		if (w)
			return 0;
	}
	if (i < 0)
		return 0;
	const Node *f = g->nodes[i];
	if (f->stream != n->stream || (f->flags & DP_IF_LAST) != (n->flags & DP_IF_LAST))
		return 0;
	for (int m = i + 1; m < j; m++)
		if ((g->nodes[m]->progs & IR_IN_STEP) && writes_bytes(g, g->nodes[m], f->out))
			return 0;
	return 1;
}

/*
 * Attention's executed work, as runtime/cuda/attention.cu does it: in causal
 * products of one sequence and head (a unit: T x Tk x hd multiply-adds over
 * the lower triangle, T Tk hd FLOPs), which the op's cost rule counts at
 * FlashAttention-2's 2 (forward) and 5 (backward). Executed: the forward 2
 * (S, P V); the ordinary backward 9 on the CUDA cores (the forward again
 * for each row's lse and D, then S, dP, dQ by query tile, then S, dV, dP,
 * dK by key tile); on tensor cores one kernel by key tile, S, dP, dV, dK
 * and dQ (k_attn_bwd_mma: FlashAttention-2's 5), 7 with the forward again
 * when not paired with its forward (attn_paired: lse and O kept); the cp
 * gradients 5 (d qkv: the forward again, S, dP, dQ) and 6 (d kv: the
 * forward again, S, dP, dV, dK), 3 and 4 on tensor cores when paired (two
 * ops, each running the one kernel for its part), and the two as one
 * attention_cp_grad_both (passes/fuse.c) as attention_grad; on tensor cores for bf16 (and f32 under
 * gemm_math tf32, in tf32) with a head dim of 32, 64 or 128 (the kernels'
 * own rule), else on the CUDA cores. *tensor: on tensor cores. j: the
 * node's index.
 */
static double attn_executed(const Graph *g, int j, int *tensor)
{
	const Node *n = g->nodes[j];
	const Value *qkv = g->values[n->in[n->op == DP_OP_ATTENTION || n->op == DP_OP_ATTENTION_CP ? 0 : 1]];
	double heads = (double)DP_ATTR(n, ATTENTION, heads), t = (double)qkv->dims[1];
	double tk = n->op == DP_OP_ATTENTION || n->op == DP_OP_ATTENTION_GRAD
			    ? t : t * (double)DP_ATTR(n, ATTENTION_CP, cp);
	double hd = (double)qkv->dims[2] / 3 / heads, unit = (double)qkv->dims[0] * heads * t * tk * hd;
	int tf32 = qkv->dtype == DP_F32 && g->cfg.gemm_math == DP_GEMM_TF32;
	*tensor = (qkv->dtype == DP_BF16 || tf32) && (hd == 32 || hd == 64 || hd == 128);
	int paired = n->op != DP_OP_ATTENTION && n->op != DP_OP_ATTENTION_CP && *tensor &&
		     attn_paired(g, j);
	switch (n->op) {
	case DP_OP_ATTENTION:
	case DP_OP_ATTENTION_CP:
		return 2 * unit;
	case DP_OP_ATTENTION_GRAD:
	case DP_OP_ATTENTION_CP_GRAD_BOTH:
		return (*tensor ? (paired ? 5 : 7) : 9) * unit;
	case DP_OP_ATTENTION_CP_GRAD:
		return (paired ? 3 : 5) * unit;
	default: /* DP_OP_ATTENTION_CP_GRAD_KV */
		return (paired ? 4 : 6) * unit;
	}
}

double roofline_model_flops(const Graph *g, double *tokens, double *epilogue)
{
	double accum = g->cfg.grad_accum ? g->cfg.grad_accum : 1, model = 0;
	*tokens = *epilogue = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || !ir_ops[n->op].cost || dp_op_class(n->op) != DP_OPC_KERNEL ||
		    n->recompute)
			continue;
		double f = 0, b = 0, times = n->flags & (DP_IF_LAST | DP_IF_FIRST) ? 1 : accum;
		ir_ops[n->op].cost(g, n, &f, &b);
		if (class_of(n->op) == C_GEMM) { /* the product's: not a fused epilogue's gelu */
			model += times * (f - epilogue_flops(g, n));
			*epilogue += times * epilogue_flops(g, n);
		}
		if (n->op == DP_OP_ATTENTION) { /* qkv [.., T, 3 d]: 12 T d per token */
			const Value *q = g->values[n->in[0]];
			double T = (double)q->dims[q->ndim - 2], dm = (double)q->dims[q->ndim - 1] / 3;
			double tok = 1;
			for (int k = 0; k < q->ndim - 1; k++)
				tok *= (double)q->dims[k];
			model += times * 12 * T * dm * tok;
			*tokens = times * tok; /* every layer's attention sees the same tokens */
		}
	}
	return model;
}

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
	double attn_tc_ms = 0, model = 0, tokens = 0, attn_run = 0, epilogue = 0;
	/* passes/fuse.c's residual adds, [0] layernorm's, [1] rmsnorm's */
	double fused_add[2] = {0}, fused_add_grad[2] = {0}, fused_gb = 0;
	for (int i = 0; i < g->nnodes; i++) {
		const Node *n = g->nodes[i];
		if (!(n->progs & IR_IN_STEP) || !ir_ops[n->op].cost || dp_op_class(n->op) != DP_OPC_KERNEL)
			continue;
		double f = 0, b = 0, times = n->flags & (DP_IF_LAST | DP_IF_FIRST) ? 1 : accum;
		ir_ops[n->op].cost(g, n, &f, &b);
		int c = class_of(n->op);
		double rate = d->fp32;
		double run = f; /* the FLOPs executed: attention's are its kernels', not the rule's */
		double tc_rate = d->bf16; /* attention's on tensor cores: tf32 for f32 operands */
		if (c == C_ATTN) {
			int tensor;
			run = attn_executed(g, i, &tensor);
			attn_run += times * run;
			DpDtype dt = g->values[n->in[n->op == DP_OP_ATTENTION || n->op == DP_OP_ATTENTION_CP ? 0 : 1]]->dtype;
			tc_rate = dt == DP_F32 ? d->tf32 : d->bf16;
			rate = tensor ? tc_rate : d->fp32;
		}
		if (c == C_GEMM) { /* the operands' dtype: bf16 or f16 (one tensor-core
				     rate on these GPUs), or f32 (tf32 when asked) */
			DpDtype in0 = g->values[n->in[0]]->dtype;
			if (dp_is_half(in0) || g->cfg.gemm_math == DP_GEMM_TF32)
				rate = dp_is_half(in0) ? d->bf16 : d->tf32;
		}
		fused_add[0] += n->op == DP_OP_ADD_LAYERNORM ? times : 0;
		fused_add_grad[0] += n->op == DP_OP_LAYERNORM_GRAD_ADD ? times : 0;
		fused_add[1] += n->op == DP_OP_ADD_RMSNORM ? times : 0;
		fused_add_grad[1] += n->op == DP_OP_RMSNORM_GRAD_ADD ? times : 0;
		fused_gb += n->op == DP_OP_LAYERNORM_GRAD_GB ? times : 0;
		Row *r = &row[c];
		r->n += times;
		r->flops += times * f;
		r->bytes += times * b;
		r->ms += times * node_ms(d, run, b, rate);
		r->tensor |= rate != d->fp32 && f > 0;
		r->cuda |= rate == d->fp32 && f > 0;
		if (c == C_ATTN)
			attn_tc_ms += times * node_ms(d, run, b, tc_rate);
	}
	model = roofline_model_flops(g, &tokens, &epilogue);
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
	if (row[C_ATTN].n > 0)
		fprintf(out, "attention executes %s on %s, its ms above (the row's FLOPs are the cost "
			"rule's, FlashAttention-2's products and the softmax: %s)\n",
			stats_human_flops(c1, sizeof c1, attn_run),
			row[C_ATTN].tensor && row[C_ATTN].cuda ? "tensor and CUDA cores"
			: row[C_ATTN].tensor ? "tensor cores" : "CUDA cores",
			stats_human_flops(c2, sizeof c2, row[C_ATTN].flops));
	fprintf(out, "model flops %s (the GEMMs' and 12 T d per token and layer of attention)\n",
		stats_human_flops(c1, sizeof c1, model));
	if (epilogue > 0)
		fprintf(out, "gemm epilogue flops %s (the gelu of linear_gelu and matmul_gelu_grad: in "
			"the gemm row, not in the model flops)\n", stats_human_flops(c1, sizeof c1, epilogue));
	for (int k = 0; k < 2; k++) {
		const char *norm = k ? "rmsnorm" : "layernorm";
		if (fused_add[k] + fused_add_grad[k] > 0)
			fprintf(out, "residual adds in the %s's pass %.0f (add_%s) + %.0f "
				"(%s_grad_add): as many memory-bound kernels and passes over a row "
				"fewer\n", norm, fused_add[k], norm, fused_add_grad[k], norm);
	}
	if (fused_gb > 0)
		fprintf(out, "layernorm gamma and beta gradients in one pass %.0f "
			"(layernorm_grad_gb): as many memory-bound kernels and reads of dy fewer\n",
			fused_gb);
	if (total > 0 && row[C_ATTN].n > 0) /* a token model: its tokens/s too */
		fprintf(out, "predicted MFU %.1f %% (%.0f tokens/s), attention as "
			"runtime/cuda/attention.cu runs it\n", 100 * model / (total * 1e-3 * d->bf16),
			tokens / (total * 1e-3));
	else if (total > 0)
		fprintf(out, "predicted MFU %.1f %%\n", 100 * model / (total * 1e-3 * d->bf16));
	if (with_tc > 0 && row[C_ATTN].n > 0)
		fprintf(out, "predicted MFU %.1f %% (%.0f tokens/s), attention on tensor cores "
			"(%.3f ms)\n", 100 * model / (with_tc * 1e-3 * d->bf16), tokens / (with_tc * 1e-3),
			attn_tc_ms);
}
