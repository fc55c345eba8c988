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
finish gradcheck
