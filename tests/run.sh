#!/usr/bin/env bash
# tests/run.sh - every test suite, in order; `make test` runs it (SAN=1: the
# ASan/UBSan build). Prints each suite's "N passed, M failed[, K skipped]" and
# a total; skipped checks (no GPU here) are counted apart, never as passed.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD
suites=(
	"unit"          "bash tests/unit.sh"
	"layers"        "bash tests/layers.sh"
	"errors"        "bash tests/errors.sh"
	"golden"        "bash tests/golden.sh"
	"passes"        "bash tests/passes.sh"
	"gradcheck"     "bash tests/gradcheck.sh"
	"stepfile"      "bash tests/stepfile_fuzz.sh"
	"runtime_errors" "bash tests/runtime_errors.sh"
	"outputs"       "bash tests/outputs.sh"
	"faults"        "bash tests/faults.sh"
	"signals"       "bash tests/signals.sh"
	"tour"          "bash tests/tour.sh"
	"resume"        "bash tests/resume.sh"
	"durability"    "bash tests/durability.sh"
	"logs"          "bash tests/logs.sh"
	"data_errors"   "bash tests/data_errors.sh"
	"equivalence"   "bash tests/equivalence.sh"
	"sharding"      "bash tests/sharding.sh"
	"torch_ref"     "bash tests/torch_ref.sh"
	"transformer"   "bash tests/transformer.sh"
	"bf16"          "bash tests/bf16.sh"
	"tp"            "bash tests/tp.sh"
	"recompute"     "bash tests/recompute.sh"
	"cp"            "bash tests/cp.sh"
	"views"         "bash tests/views.sh"
	"trace"         "bash tests/trace.sh"
	"cuda"          "bash tests/cuda.sh"
	"cuda_emu"      "bash tests/cuda_emu.sh"
	"cuda_emu_mutations" "bash tests/cuda_emu_mutations.sh"
	"gpu_kit"       "bash tests/gpu_kit.sh"
)
tp=0; tf=0; ts=0; failed=()
for ((i = 0; i < ${#suites[@]}; i += 2)); do
	name=${suites[i]}; cmd=${suites[i + 1]}
	echo "== $name"
	start=$(date +%s)
	out=$($cmd 2>&1); rc=$?
	echo "$out"
	line=$(echo "$out" | grep -E "^[A-Za-z_]+: [0-9]+ passed, [0-9]+ failed" | tail -n 1)
	p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/'); p=${p:-0}
	f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/'); f=${f:-0}
	sk=$(echo "$line" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p'); sk=${sk:-0}
	if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
	tp=$((tp + p)); tf=$((tf + f)); ts=$((ts + sk))
	[ $rc -eq 0 ] || failed+=("$name")
	echo "   ($name took $(( $(date +%s) - start ))s)"
done
echo
[ ${#failed[@]} -eq 0 ] || echo "failed suites: ${failed[*]}"
if [ $ts -gt 0 ]; then
	echo "total: $tp passed, $tf failed, $ts skipped (not run here: see the SKIP lines)"
else
	echo "total: $tp passed, $tf failed"
fi
[ $tf -eq 0 ] && [ ${#failed[@]} -eq 0 ]
