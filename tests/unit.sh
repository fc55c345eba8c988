#!/usr/bin/env bash
# tests/unit.sh - the C test programs (built by `make tests`): IR round trip,
# data/init/safetensors, step-file fuzzing, the step-file writer's bounds
# (stepfile_encode_test), the backends' kernel tables, the
# CPU kernels (flash attention, thread-count invariance, instruction sets), the
# CPU's bf16 rounding, the "did you mean" of util/suggest.c (the front-end
# fuzzer runs in errors.sh). backend_test inspects the CUDA backend of this
# build, or of build/ for a SAN=1 run (the sanitized build has none).
set -u
. "$(dirname "$0")/lib.sh"
CUDA_SO=$ROOT/$BUILD/libdpcuda.so
[ -f "$CUDA_SO" ] || CUDA_SO=$ROOT/build/libdpcuda.so
for t in ir_roundtrip data_test stepfile_fuzz stepfile_encode_test backend_test cpu_kernels_test bf16_test f16_test suggest_test; do
	case_on "$t" || continue
	args=""; [ $t = ir_roundtrip ] && args=tests/ir
	# the CUDA libraries' own start-up allocations are not ours: no leak check there
	envs=""; [ $t = backend_test ] && envs="$MPI_ASAN DPEXEC_CUDA_LIB=$CUDA_SO"
	bin=$ROOT/$BUILD/tests/$t
	REPRO="${envs:+env $envs }$BUILD/tests/$t${args:+ $args}"
	if out=$(env $envs "$bin" $args 2>&1); then
		echo "$out" | grep "SKIPPED" | sed 's/^/  SKIP /'
		echo "$out" | grep -q "SKIPPED" && nskip=$((nskip + 1))
		ok "$t: $(echo "$out" | tail -n 1)"
	else
		fail "$t"; echo "$out" | tail -n 15 | sed 's/^/      /'
	fi
done
finish unit
