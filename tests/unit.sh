#!/usr/bin/env bash
# tests/unit.sh - the C test programs (built by `make tests`): IR round trip,
# data/init/safetensors, step-file fuzzing (the front-end fuzzer runs in errors.sh).
set -u
. "$(dirname "$0")/lib.sh"
for t in ir_roundtrip data_test stepfile_fuzz; do
	args=""; [ $t = ir_roundtrip ] && args=tests/ir
	bin=$ROOT/$BUILD/tests/$t
	if out=$("$bin" $args 2>&1); then
		ok "$t: $(echo "$out" | tail -n 1)"
	else
		fail "$t"; echo "$out" | tail -n 15 | sed 's/^/      /'
	fi
done
finish unit
