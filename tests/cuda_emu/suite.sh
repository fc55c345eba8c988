# shellcheck shell=bash
# tests/cuda_emu/suite.sh - what the emulator's two suites share (sourced by
# tests/cuda_emu.sh and tests/cuda_emu_mutations.sh after tests/lib.sh):
# how they start build-emu/dpexec, and their one compare process.

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

# cmp_start: one tests/compare.py for the whole suite (compare_serve.py, a
# coprocess: its fds are not passed to the commands the suite runs), where
# ~300 comparisons each paid Python's and numpy's start-up (~0.2 CPU-s, more
# than a small case's emulated run); cmp_stop ends it and waits for it, so
# that its CPU is the suite's (tests/run.sh's `times`)
cmp_start() {
	coproc CMPSRV { exec "$PY" "$ROOT/tests/cuda_emu/compare_serve.py"; }
}
cmp_stop() {
	[ -n "${CMPSRV_PID:-}" ] || return 0
	local pid=$CMPSRV_PID fd=${CMPSRV[1]}
	exec {fd}>&- # (its stdin: it ends)
	wait "$pid" 2>/dev/null
	return 0
}
# pycmp OUT WORDS...: `tests/compare.py WORDS... >OUT`, its exit status, in
# the suite's one compare process (started alone if that one is gone)
pycmp() {
	local out=$1 rc IFS=$'\x1f'
	shift
	if [ -n "${CMPSRV_PID:-}" ] && { printf '%s\n' "$out$IFS$*" >&"${CMPSRV[1]}"; } 2>/dev/null &&
		read -r rc <&"${CMPSRV[0]}" && [ -n "$rc" ]; then
		return "$rc"
	fi
	IFS=$' \t\n'
	$PY "$ROOT/tests/compare.py" "$@" >"$out"
}
