/*
 * mutant.h - the mutation points of tests/cuda_emu_mutations.sh: each is a
 * known bug (a dropped wait, a wrong stride...) written beside the code it
 * breaks, as `MUTANT(name)`, true in one run when that run asks for it.
 *
 * Only the CUDA emulator's build (mk/cuda-emu.mk defines DPEMU_MUTANTS)
 * compiles them: there MUTANT(name) asks the emulator whether the
 * environment's DPEMU_MUTANT names it (tests/cuda_emu/core.cc). Everywhere
 * else MUTANT(name) is the constant 0, so the real backend's object code
 * has neither the names nor the branches they guard (tests/cuda_emu_mutations.sh
 * checks the names against its table, and that no "mutant:NAME" string is
 * in the real build's libdpcuda.so, as there is in the emulator's). A point guards one expression or statement; a mutant that needs
 * more (a function's body) is inside #ifdef DPEMU_MUTANTS.
 */
#ifndef DP_CU_MUTANT_H
#define DP_CU_MUTANT_H

#ifdef DPEMU_MUTANTS
#ifdef __cplusplus
extern "C" {
#endif
int dpemu_mutant(const char *name);
/* getenv("DPEMU_MUTANT"), read when the library loads: NULL (most runs)
 * answers every point without a call, some of which sit in kernels' inner
 * loops (1.9 % of an emulated gpt2-tiny run went to those calls) */
extern const char *const dpemu_mutant_env;
#ifdef __cplusplus
}
#endif
#define MUTANT(name) (dpemu_mutant_env && dpemu_mutant("mutant:" #name)) /* (the prefix: what `strings` finds) */
#else
#define MUTANT(name) 0
#endif

#endif
