# shellcheck shell=bash
# tests/cuda_emu/suite.sh - what the emulator's two suites share (sourced by
# tests/cuda_emu.sh and tests/cuda_emu_mutations.sh after tests/lib.sh):
# how they start build-emu/dpexec.

# emu_launch NP: the launcher words for NP ranks of build-emu/dpexec: none
# for one rank (MPI's singleton start, as lib.sh's mpi() starts the CPU's
# runs: the same program without mpirun's start-up, and without the 2 s
# mpirun waits (odls_base_sigkill_timeout) after a rank exits non-zero,
# which every mutant caught by a diagnosis does; `mpirun -np 1` itself is
# runtime_errors.sh's and durability.sh's to check), else
# `mpirun --oversubscribe -np NP`
emu_launch() {
	[ "$1" = 1 ] || echo "mpirun --oversubscribe -np $1"
}
