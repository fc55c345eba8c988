#!/usr/bin/env bash
# bench/offload.sh - CPU step time with `offload optimizer` against without
# (issue 26's goal: at most 1.1x; docs/OFFLOAD.md).
#
# On the CPU backend both arenas are host memory: offload adds the copies
# (memcpy of the reduced gradients, and back of what the update wrote) and
# nothing else, so the ratio measures their cost. models/gpt2-tiny.dp at
# d=256 (-D d=256: 4 heads of 64, 2 layers), full_shard at 2 ranks, f32 and
# bf16; ROUNDS rounds of the two step files one after the other (the
# machine's load drifts: the pairs share it), each STEPS steps; ms per
# optimizer step is dpexec's own figure averaged after the first step, the
# ratio the median over the rounds.
# Not a test: timings move with the machine's load.
#   STEPS=10 ROUNDS=3 bash bench/offload.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-10}
ROUNDS=${ROUNDS:-3}
NP=${NP:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
	/usr/share/common-licenses/GPL-3 >/dev/null
sed 's|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|' \
	models/gpt2-tiny.dp >"$T/m.dp"

# ms NAME: the mean ms per optimizer step after the first of one run
ms() {
	mpirun --oversubscribe -np "$NP" "$BUILD/dpexec" "$T/$1.bin" --no-timestamps --steps "$STEPS" --log-every 1 \
		--eval-every 0 >"$T/$1.out" 2>&1 || { cat "$T/$1.out" >&2; exit 1; }
	sed -n 's/^step \([0-9]*\)\/.*| \([0-9.]*\) ms\/step.*/\1 \2/p' "$T/$1.out" |
		awk '$1 > 1 {s += $2; n++} END {printf "%.1f", s / n}'
}

printf "%-6s %-10s %14s %14s %8s\n" prec round "none ms/step" "offload ms/step" ratio
for prec in f32 bf16; do
	for o in none optimizer; do
		"$BUILD/dpc" "$T/m.dp" -D d=256 --world-size "$NP" --precision $prec \
			--set train.strategy=full_shard --set train.offload=$o -o "$T/$prec.$o.bin" 2>/dev/null
	done
	: >"$T/$prec.ratios"
	for r in $(seq "$ROUNDS"); do
		a=$(ms "$prec.none")
		b=$(ms "$prec.optimizer")
		ratio=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')
		echo "$ratio" >>"$T/$prec.ratios"
		printf "%-6s %-10s %14s %14s %8s\n" $prec "$r" "$a" "$b" "$ratio"
	done
	printf "%-6s %-10s %14s %14s %8s\n" $prec median "" "" "$(sort -n "$T/$prec.ratios" |
		awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')"
done
