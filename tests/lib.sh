# tests/lib.sh - shared helpers for the shell test suites (sourced, not run).
#
# Each suite counts its checks with ok/fail and ends with `finish NAME`, which
# prints "NAME: N passed, M failed" and returns non-zero on any failure.

BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DPC=${DPC:-$ROOT/$BUILD/dpc}
DPEXEC=${DPEXEC:-$ROOT/$BUILD/dpexec}
PY=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI's own allocations are not ours to fix: no leak checking inside
# MPI processes; dpc keeps full leak checking.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
MPI_ASAN="ASAN_OPTIONS=detect_leaks=0"

npass=0
nfail=0
ok() { npass=$((npass + 1)); echo "  ok   $*"; }
fail() { nfail=$((nfail + 1)); echo "  FAIL $*"; }
check() { # check DESCRIPTION COMMAND...: ok when the command succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else fail "$d"; fi
}
finish() {
	echo "$1: $npass passed, $nfail failed"
	[ "$nfail" -eq 0 ]
}
# mpi N ARGS...: dpexec on N ranks (oversubscribed: this machine has 2 cores)
mpi() {
	local n=$1; shift
	env $MPI_ASAN timeout 300 mpirun --oversubscribe -np "$n" "$DPEXEC" "$@"
}
tmpdir() { mktemp -d "${TMPDIR:-/tmp}/dptest.XXXXXX"; }
