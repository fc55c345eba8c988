#!/usr/bin/env bash
# bench/pipeline.sh - the pipelined step's bubble, measured against the
# compiler's prediction (issue 25).
#
# models/gpt2-tiny.dp at -D d=256 (4 heads of 64, 2 layers, so the stages'
# compute outweighs the transfers) on the GPL-3 text, one thread per rank:
# the 1-rank step time T1 (all the work, no bubble) and the step time Tp at
# pp = 2 and 4 (dpexec's own ms/step, the mean after the first step). Every
# stage does 1/p of the work, so the measured bubble is the idle share of
# the p ranks' time, 1 - T1 / (p * Tp), and the prediction is --stats'
# `compiled:` line: the micro-batches run one at a time through every stage,
# (p - 1) / p. pp=4 oversubscribes a 2-core machine (4 ranks, 2 cores):
# waiting ranks poll, then sleep, so its figure is an upper bound there.
# Not a test: timings move with the machine's load.
#   STEPS=10 bash bench/pipeline.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-10}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_orte_execute_quiet=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
	/usr/share/common-licenses/GPL-3 >/dev/null
sed 's|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|' \
	models/gpt2-tiny.dp >"$T/g.dp"

# ms_per_step NP PP: dpexec's ms/step of the model at NP ranks, pp=PP
ms_per_step() {
	"$BUILD/dpc" "$T/g.dp" -D d=256 --world-size "$1" --pp "$2" -o "$T/s.bin" 2>/dev/null
	timeout 600 mpirun --oversubscribe -np "$1" "$BUILD/dpexec" "$T/s.bin" --steps "$STEPS" \
		--eval-every 0 2>/dev/null | sed -n 's/.*(of \([0-9.]*\) ms\/step;.*/\1/p' | tail -n 1
}

t1=$(ms_per_step 1 1)
printf "%-6s %12s %18s %18s\n" "pp" "ms/step" "bubble measured" "bubble predicted"
printf "%-6s %12s %18s %18s\n" 1 "$t1" "-" "-"
for p in 2 4; do
	tp=$(ms_per_step "$p" "$p")
	pred=$("$BUILD/dpc" "$T/g.dp" -D d=256 --world-size "$p" --pp "$p" --emit=stats 2>/dev/null |
		sed -n 's/^compiled: .*bubble (p-1)\/p = \([0-9.]*\)).*/\1/p')
	awk -v p="$p" -v t1="$t1" -v tp="$tp" -v pred="$pred" \
		'BEGIN { printf "%-6d %12.1f %18.3f %18s\n", p, tp, 1 - t1 / (p * tp), pred }'
done
