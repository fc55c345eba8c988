/*
 * amp.h - fp16's loss-scaling state (PyTorch's GradScaler) and its update
 * rule, static inline so that C (the CPU backend, the executor's mirror of
 * it) and nvcc's device code (the CUDA backend's amp kernel, cuda/optim.cu)
 * compile the same arithmetic, as lr_sched.h does for the schedules.
 *
 * The backend owns the state during a run: the step's AMP_CHECK kernel sets
 * its found-inf flag from the global gradient norm (passes/lossscale.c),
 * the optimizer kernels (CLIP, ADAMW, SGD) do nothing on a step that has
 * it, t counts the steps not skipped, and amp_update runs at the step's
 * tail. A device backend keeps all of it in device memory, so a captured
 * step graph replays it with no host branch; the host learns the state from
 * each step's report (BackendReport), where it reads the metrics.
 */
#ifndef DP_AMP_H
#define DP_AMP_H

#include <math.h>
#include <stdint.h>

#include "stepfile.h"

#ifdef __CUDACC__
#define AMP_FN static inline __host__ __device__
#else
#define AMP_FN static inline
#endif

/* GradScaler's state: the scale the next step multiplies its loss gradient
 * by, the clean steps in a row since it last changed (growth_tracker), the
 * steps skipped so far. Training state: in checkpoints, restored by
 * --resume. */
typedef struct {
	float scale;      /* f32, as GradScaler's _scale tensor */
	uint32_t clean;
	uint64_t skipped;
} AmpState;

/* After a step, GradScaler.update's rule (torch._amp_update_scale_, in f32):
 * an overflow (found) multiplies the scale by backoff and restarts the
 * count of clean steps; interval clean steps in a row multiply it by growth
 * (when that stays finite). A static scale never changes. */
AMP_FN void amp_update(AmpState *a, int found, const DpOptim *o)
{
	int dynamic = o->loss_scale == DP_LS_DYNAMIC;
	if (found) {
		a->skipped++;
		a->clean = 0;
		if (dynamic)
			a->scale *= o->ls_backoff;
	} else if (dynamic && ++a->clean >= o->ls_interval) {
		float grown = a->scale * o->ls_growth;
		if (isfinite(grown))
			a->scale = grown;
		a->clean = 0;
	}
}

#undef AMP_FN
#endif
