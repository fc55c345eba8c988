#!/usr/bin/env bash
# bench/overlap.sh - does the CPU executor really overlap all_reduce with the
# backward? Open MPI advances a non-blocking collective only inside MPI calls,
# so dpexec polls pending requests between instructions. This runs
# models/mlp.dp at 2 ranks with the polling (default) and without it
# (--no-progress: collectives advance only when waited for), and prints the
# time each rank spends blocked in waits, per step, and the ratio.
#   STEPS=300 bash bench/overlap.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-300}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/dpc" models/mlp.dp --world-size 2 -o "$T/m.bin"
run() { # run LABEL ARGS...: prints "ms/step blocked-ms/step"
	local label=$1; shift
	mpirun --oversubscribe -np 2 "$BUILD/dpexec" "$T/m.bin" --no-timestamps --steps "$STEPS" --eval-every 0 \
		--log-every "$STEPS" "$@" >"$T/$label.out" 2>&1 || { cat "$T/$label.out"; exit 1; }
	sed -nE 's/^comm: ([0-9.]+) ms issued, ([0-9.]+) ms blocked per step \(of ([0-9.]+) ms\/step.*/\3 \2/p' "$T/$label.out"
}
read -r p_step p_blk <<<"$(run progress)"
read -r n_step n_blk <<<"$(run noprogress --no-progress)"
echo "models/mlp.dp, 2 ranks, $STEPS steps, 3 all_reduce buckets (0.95 MiB) per step:"
echo "  polling between instructions : $p_step ms/step, $p_blk ms/step blocked in waits"
echo "  --no-progress                : $n_step ms/step, $n_blk ms/step blocked in waits"
awk -v a="$p_blk" -v b="$n_blk" -v c="$p_step" -v d="$n_step" \
	'BEGIN{printf "  blocked ratio (polling / none): %.2f   step-time ratio: %.2f\n", a/b, c/d}'
