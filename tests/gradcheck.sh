#!/usr/bin/env bash
# tests/gradcheck.sh - autodiff gradients of every op match central finite
# differences: each tests/gradcheck/*.dp model is compiled and run with
# `dpexec --check-grads` (tolerance and step size: runtime/gradcheck.c).
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
for f in tests/gradcheck/*.dp; do
	n=$(basename "$f" .dp)
	if "$DPC" "$f" -o "$T/$n.bin" >"$T/$n.out" 2>&1 &&
		env $MPI_ASAN "$DPEXEC" "$T/$n.bin" --check-grads >>"$T/$n.out" 2>&1; then
		ok "$n: $(grep -c ' ok' "$T/$n.out") tensors checked"
	else
		fail "$n"; sed 's/^/      /' "$T/$n.out" | tail -n 8
	fi
done
# the check can fail: gradients 20% off (DP_GRADCHECK_SKEW, a test hook in
# runtime/gradcheck.c) must be reported, with a non-zero exit
"$DPC" tests/gradcheck/linear.dp -o "$T/skew.bin" >/dev/null 2>&1
if env $MPI_ASAN DP_GRADCHECK_SKEW=0.2 "$DPEXEC" "$T/skew.bin" --check-grads >"$T/skew.out" 2>&1; then
	fail "gradients 20% off are caught"; tail -n 4 "$T/skew.out" | sed 's/^/      /'
else
	ok "gradients 20% off are caught: $(grep -c FAIL "$T/skew.out") tensors flagged"
fi
finish gradcheck
