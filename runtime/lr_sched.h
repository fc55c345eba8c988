/*
 * lr_sched.h - the learning-rate schedules (format/settings.def's KIND rows of
 * `schedule`), one formula for the host (exec.c's exec_lr: the CPU backend,
 * the log) and the CUDA backend's schedule kernel (cuda/kernels.cu), so the
 * two cannot drift. Header-only and static inline for that reason, as
 * kernel_table.h is: C and nvcc's C++ (host and device) compile this code.
 *
 * For optimizer step k counted from 0, with lr the optimizer's, T the
 * schedule's steps (cfg.steps when 0) and W its warmup:
 *   warmup (cosine, linear, wsd, inverse_sqrt), k < W:  lr * (k + 1) / W
 *   constant:      lr
 *   cosine:        min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * q))
 *   linear:        min_lr + (lr - min_lr) * (1 - q)
 *                  q = min(1, (k - W) / (T - W)), q = 1 when T <= W
 *   wsd:           k < W + stable: lr; then
 *                  lr - (lr - min_lr) * min(1, (k - W - stable) / decay)
 *                  (min_lr at once when decay = 0)
 *   step:          lr * gamma^floor(k / every)
 *   inverse_sqrt:  lr * sqrt(max(W, 1) / (k + 1))
 * The result is rounded to f32: the value every kernel applies, and the one
 * dpexec logs. An optimizer group's lr is that times its lr_scale
 * (dp_group_lr), rounded to f32 again. tests/schedules.sh checks each kind at chosen steps against
 * these closed forms.
 */
#ifndef DP_LR_SCHED_H
#define DP_LR_SCHED_H

#include <math.h>
#include <stdint.h>

#include "stepfile.h"

#ifdef __CUDACC__
#define SCHED_FN static inline __host__ __device__
#else
#define SCHED_FN static inline
#endif

SCHED_FN double sched_lr(const DpSched *c, double lr, uint32_t cfg_steps, uint64_t k)
{
	double x = (double)k, warm = c->warmup, min_lr = c->min_lr;
	double total = c->steps ? (double)c->steps : (double)cfg_steps, q;
	if (c->kind == DP_SCHED_CONSTANT)
		return (float)lr;
	if (c->kind == DP_SCHED_STEP)
		return (float)(lr * pow((double)c->gamma, floor(x / (c->every ? c->every : 1))));
	if (x < warm)
		return (float)(lr * (x + 1) / warm);
	switch (c->kind) {
	case DP_SCHED_COSINE:
	case DP_SCHED_LINEAR:
		q = total > warm ? (x - warm) / (total - warm) : 1.0;
		q = q > 1 ? 1 : q;
		if (c->kind == DP_SCHED_LINEAR)
			return (float)(min_lr + (lr - min_lr) * (1 - q));
		return (float)(min_lr + 0.5 * (lr - min_lr) * (1 + cos(3.14159265358979323846 * q)));
	case DP_SCHED_WSD:
		if (x < warm + c->stable)
			return (float)lr;
		q = c->decay ? (x - warm - c->stable) / c->decay : 1.0;
		q = q > 1 ? 1 : q;
		return (float)(lr - (lr - min_lr) * q);
	case DP_SCHED_INVERSE_SQRT:
		return (float)(lr * sqrt((warm > 1 ? warm : 1) / (x + 1)));
	default:
		return (float)lr;
	}
}

/* The lr of an optimizer group: the schedule's lr (a float) times the
 * group's lr_scale (an update's attribute, 0 meaning 1), rounded to f32. */
SCHED_FN float dp_group_lr(float lr, float lr_scale)
{
	return lr_scale == 0 || lr_scale == 1 ? lr : (float)((double)lr * lr_scale);
}

#endif
