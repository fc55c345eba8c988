/*
 * kernels.cu - the CUDA backend's kernel table, merged from the rows of the
 * kernel files (kernels.h lists them: each op's device code, launcher and
 * row live in exactly one) by kernel_table_merge, the one merge of every
 * backend (runtime/kernel_table.h), and the kernels of the backend itself:
 * the per-step schedule, the step counter, the report of the scalars and
 * metrics into mapped host memory, and the watchdog's progress mark.
 */
#include <stdlib.h>
#include <string.h>

#include "device.cuh"
#include "../lr_sched.h"

/* ---- the table ---- */

static KernelTable make_table()
{
	const KernelRow *const files[] = {
		cu_layout_rows, cu_elementwise_rows, cu_gemm_rows, cu_loss_rows,
		cu_optim_rows,  cu_norm_rows,        cu_seq_rows,  cu_attention_rows,
		cu_bf16_rows,
	};
	KernelTable t;
	kernel_table_merge(&t, files, sizeof files / sizeof files[0]); /* t.err: cu_init refuses */
	return t;
}

extern "C" const KernelTable cu_kernel_table = make_table();

/* ---- an image for this device? (kernels.h) ---- */

__global__ void k_sched(CuScalars *sc, DpOptim opt, DpSched sched, uint32_t cfg_steps);

extern "C" cudaError_t cu_kernel_image(void)
{
	cudaFuncAttributes a;
	return cudaFuncGetAttributes(&a, k_sched);
}

/* ---- per-step scalars ---- */

/* exec.c's exec_lr for step k (lr_sched.h's formula, the same code), then
 * the constants AdamW derives from lr and t exactly as the CPU's optim.c
 * computes them (double, then rounded to float). Device cos and pow may
 * differ from glibc's in the last bit of a double; rounded to float that
 * almost never shows, and the backend compares the device's lr with the
 * host's after each step. */
__global__ void k_sched(CuScalars *sc, DpOptim opt, DpSched sched, uint32_t cfg_steps)
{
	uint64_t k = sc->step;
	double lr = sched_lr(&sched, opt.lr, cfg_steps, k);
	float lrf = (float)lr;
	int64_t taken = (int64_t)k + 1 - (int64_t)sc->amp.skipped; /* loss scaling's skips */
	double t = (double)taken;
	sc->lr = lrf;
	sc->t = taken;
	sc->ls_found = 0;
	sc->ls_ran = sc->amp.scale;
	sc->bc1 = 1.0 - pow((double)opt.beta1, t);
	sc->opt_k[CU_OPT_BC2_SQRT] = (float)sqrt(1.0 - pow((double)opt.beta2, t));
}

__global__ void k_set_step(CuScalars *sc, uint64_t step)
{
	sc->step = step;
}

__global__ void k_step_advance(CuScalars *sc)
{
	sc->step++;
}

__global__ void k_set_amp(CuScalars *sc, AmpState amp)
{
	sc->amp = amp;
}

/* GradScaler's update after the step, from the flag AMP_CHECK left */
__global__ void k_amp_update(CuScalars *sc, DpOptim opt)
{
	amp_update(&sc->amp, sc->ls_found, &opt);
}

/* The report goes to mapped host memory: the fence makes the writes
 * visible to the host before the event after this kernel completes. */
__global__ void k_report(const CuScalars *sc, CuReport *rep, int in_step, const float *loss,
			 const float *grad_norm)
{
	CuReport *r = rep + (in_step ? (int)(sc->step & 1) : 2);
	r->step = in_step ? (int64_t)sc->step : -1;
	r->t = sc->t;
	r->lr = sc->lr;
	r->loss = loss ? *loss : 0.0f;
	r->grad_norm = grad_norm ? *grad_norm : 0.0f;
	r->err = sc->err;
	r->err_value = sc->err_value;
	r->err_index = sc->err_index;
	r->err_limit = sc->err_limit;
	r->amp = sc->amp;
	r->ls_ran = sc->ls_ran;
	r->ls_found = sc->ls_found;
	__threadfence_system();
}

extern "C" cudaError_t cu_k_sched(cudaStream_t st, CuScalars *sc, DpOptim opt, DpSched sched,
				  uint32_t cfg_steps)
{
	CU_LAUNCH(k_sched, 1, 1, st, sc, opt, sched, cfg_steps);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_set_step(cudaStream_t st, CuScalars *sc, uint64_t step)
{
	CU_LAUNCH(k_set_step, 1, 1, st, sc, step);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_step_advance(cudaStream_t st, CuScalars *sc)
{
	CU_LAUNCH(k_step_advance, 1, 1, st, sc);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_set_amp(cudaStream_t st, CuScalars *sc, AmpState amp)
{
	CU_LAUNCH(k_set_amp, 1, 1, st, sc, amp);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_amp_update(cudaStream_t st, CuScalars *sc, DpOptim opt)
{
	CU_LAUNCH(k_amp_update, 1, 1, st, sc, opt);
	return cudaGetLastError();
}

extern "C" cudaError_t cu_k_report(cudaStream_t st, const CuScalars *sc, CuReport *rep,
				   int in_step, const float *loss, const float *grad_norm)
{
	CU_LAUNCH(k_report, 1, 1, st, sc, rep, in_step, loss, grad_norm);
	return cudaGetLastError();
}

/* ---- watchdog ---- */

__global__ void k_mark(volatile int64_t *slot, int64_t seq, const CuScalars *sc)
{
	*slot = sc ? (int64_t)(sc->step << 24) | seq : seq;
	__threadfence_system();
}

extern "C" cudaError_t cu_k_mark(cudaStream_t st, volatile int64_t *slot, int64_t seq,
				 const CuScalars *sc)
{
	CU_LAUNCH(k_mark, 1, 1, st, slot, seq, sc);
	return cudaGetLastError();
}

/* one of the '|'-separated names in names */
static int env_named(const char *v, const char *names)
{
	size_t n = strlen(v);
	for (const char *p = names;;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		if (len == n && !strncmp(v, p, n))
			return 1;
		if (!bar)
			return 0;
		p = bar + 1;
	}
}

extern "C" int cu_env_choice(int *seen, const char *name, const char *dflt, const char *variant)
{
	if (*seen == -2) {
		const char *v = getenv(name);
		*seen = !v || !*v || env_named(v, dflt) ? 0 : env_named(v, variant) ? 1 : -1;
	}
	return *seen;
}
