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

# case_match NAME (lib.sh's, for these two suites): a CASE with an extended
# glob's group (@(a|b), !(x), +(..), *(..), ?(..)) is a glob too, matched
# against the whole name (lib.sh's test for glob characters sees only
# * ? [, so `CASE='@(selftest warp|selftest gemm)'` looked for that text
# inside the names and selected nothing); else as lib.sh's
case_match() {
	local pat=${CASE:-}
	[ -z "$pat" ] && return 0
	# shellcheck disable=SC2053 # (the pattern is a glob)
	case $pat in
	*[*?[]* | *[@!+]\(*) [[ $1 == $pat ]] ;;
	*) [[ $1 == *"$pat"* ]] ;;
	esac
}
