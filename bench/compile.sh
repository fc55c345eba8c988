#!/usr/bin/env bash
# bench/compile.sh - dpc compile time of GPT-2 124M-sized models against depth.
#
# Measures, on this machine and in this run, the whole `dpc` (front end, every
# pass, the step-file write; process start included; best of REPS) on
# models/gpt2.dp (d 768, 12 heads, ctx 1024, vocab 50257) with
# `-D layers=N` for N = 12, 24, 48, under ddp at 1 rank and full_shard at 8
# ranks (the pass that does the most work per block), and prints:
#   ms per compile, and the ratio to the 12-layer compile of the same
#   configuration (the anchor: linear growth in depth gives 2.0 and 4.0;
#   quadratic would give 4 and 16).
# The issue's bar: the 48-layer compile well under 100 ms.
#   REPS=10 bash bench/compile.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPS=${REPS:-10}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
sed -e 's/^  strategy .*/  strategy full_shard/' -e 's/^  global_batch .*/  global_batch 64/' models/gpt2.dp >"$T/gpt2-fs.dp"

best_ms() { # best_ms ARGS...: best wall time of `dpc ARGS` in ms
	local best=1e18
	for _ in $(seq "$REPS"); do
		local s e
		s=$(date +%s%N)
		"$BUILD/dpc" "$@" -o "$T/out.bin" >/dev/null
		e=$(date +%s%N)
		best=$(awk -v a="$best" -v b="$(((e - s) / 1000))" 'BEGIN{print (b < a ? b : a)}')
	done
	awk -v u="$best" 'BEGIN{printf "%.2f", u/1000}'
}

printf "%-28s %8s %10s %10s\n" "model" "layers" "ms" "vs 12"
for cfg in "ddp 1 models/gpt2.dp" "full_shard 8 $T/gpt2-fs.dp"; do
	set -- $cfg
	name=$1 ws=$2 src=$3
	base=
	for L in 12 24 48; do
		ms=$(best_ms "$src" --world-size "$ws" -D layers=$L)
		[ -n "$base" ] || base=$ms
		printf "%-28s %8d %10s %10s\n" "gpt2 $name (ws $ws)" "$L" "$ms" \
			"$(awk -v a="$ms" -v b="$base" 'BEGIN{printf "%.2f", a/b}')"
	done
done
