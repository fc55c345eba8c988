#!/usr/bin/env bash
# bench/strategies.sh - every data-parallel strategy against ddp, in one run.
#
# For each model (models/mlp.dp, models/mlp8.dp) and strategy (ddp, zero1,
# zero2, full_shard at world size 4; hybrid_shard on a 2x2 mesh; "mixed":
# per-block strategies, tests/lib.sh's mixed: full_shard with fc1 ddp, fc2
# zero1, fc3 not resharded, head zero2), prints:
#   bus bytes per optimizer step and rank (dpc --stats, nccl-tests convention)
#   arena bytes per rank (the whole static memory plan) and the parameter +
#   gradient + optimizer-state part of it
#   ms per optimizer step measured by dpexec (mean over steps 2..STEPS)
# and the ratio of each to ddp's, measured in the same run. Not a test:
# timings move with the machine's load. On a 2-core machine 4 ranks are
# oversubscribed, so time ratios mostly show compute and copy overheads, not
# network savings.
#   STEPS=200 bash bench/strategies.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-200}
NP=${NP:-4}
. tests/lib.sh # mixed; the MPI-as-root settings
export OPENBLAS_NUM_THREADS=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

cell() { # cell FILE ROWNAME: the exact byte count of a --stats row
	grep -E "^$2 " "$1" | tail -n 1 | awk '{for (i = NF; i > 0; i--) if ($i ~ /^[0-9]+$/) {print $i; exit}}'
}

for model in models/mlp.dp models/mlp8.dp; do
	[ -f "$model" ] || continue
	echo "== $model, $NP ranks, $STEPS steps"
	printf "%-13s %14s %7s %12s %7s %12s %7s %9s %7s\n" strategy "bus B/step" ratio \
		"arena B" ratio "p+g+opt B" ratio "ms/step" ratio
	base_bus=; base_arena=; base_pgo=; base_ms=
	for st in ddp zero1 zero2 full_shard hybrid_shard mixed; do
		src="$T/$st.dp"
		if [ "$st" = mixed ]; then
			mixed "$model" "$src"
		else
			sed -E "s/^( *strategy ).*/\1$st/" "$model" >"$src"
		fi
		args=(--world-size "$NP")
		if [ "$st" = hybrid_shard ]; then
			sed -i -E "s/^mesh .*/mesh dp_replicate=2, dp_shard=$((NP / 2))/" "$src"
			args=()
		fi
		"$BUILD/dpc" "$src" "${args[@]}" -o "$T/$st.bin" --stats >"$T/$st.stats"
		# the "total" row of the collective table: its last exact count is the bus bytes
		bus=$(awk '/^total /{for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) v = $i; print v; exit}' \
			"$T/$st.stats")
		arena=$(cell "$T/$st.stats" "total \\(arena size\\)")
		pgo=$(( $(cell "$T/$st.stats" parameters) + $(cell "$T/$st.stats" gradients) +
			$(cell "$T/$st.stats" "optimizer state") ))
		mpirun --oversubscribe -np "$NP" "$BUILD/dpexec" "$T/$st.bin" --no-timestamps --steps $((STEPS + 1)) \
			--log-every "$STEPS" --eval-every 0 >"$T/$st.out" 2>&1 || { cat "$T/$st.out"; exit 1; }
		ms=$(grep "^step $STEPS/" "$T/$st.out" | sed -E 's/.*\| ([0-9.]+) ms\/step.*/\1/')
		: "${base_bus:=$bus}" "${base_arena:=$arena}" "${base_pgo:=$pgo}" "${base_ms:=$ms}"
		r() { awk -v a="$1" -v b="$2" 'BEGIN{if (b > 0) printf "%.2f", a / b; else print "-"}'; }
		printf "%-13s %14s %7s %12s %7s %12s %7s %9s %7s\n" "$st" "$bus" "$(r "$bus" "$base_bus")" \
			"$arena" "$(r "$arena" "$base_arena")" "$pgo" "$(r "$pgo" "$base_pgo")" "$ms" \
			"$(r "$ms" "$base_ms")"
	done
	echo
done
