#!/usr/bin/env bash
# bench/offload.sh - CPU step time with `offload optimizer` (and `offload
# params`) against without (issue 26's goal: at most 1.1x; docs/OFFLOAD.md).
#
# On the CPU backend both arenas are host memory: offload adds the copies
# (memcpy of the reduced gradients, and back of what the update wrote) and
# nothing else, so the ratio measures their cost. models/gpt2-tiny.dp at
# d=256 (-D d=256: 4 heads of 64, 2 layers) at NP ranks, each configuration
# of CONFIGS (STRATEGY:PRECISION:OFFLOAD, against the same strategy and
# precision without offload).
#
# Robust on a loaded machine (the figures move with the load, so the pairs
# share it): ROUNDS rounds, each one run of the step file without offload
# (A) and one with (B) back to back, A first in odd rounds and B first in
# even ones (ABBA: a load that drifts during a round favours neither); per
# run the MEDIAN of dpexec's own per-step times (--log-json's ms_per_step
# with --log-every 1, rank 0, the first WARMUP steps dropped), so one step
# stalled by another process does not move it; per round the ratio B/A; per
# configuration the median of the rounds' ratios and their spread (the
# smallest and the largest), the pooled medians of A's and B's steps, and
# the load average before and after. (Not the fastest step: at a load of
# 20 on 2 cores a logged step's ms_per_step can read a quarter of its
# neighbours', and the minima's ratios went from 0.28 to 1.16.)
# Not a test: timings move with the machine's load.
#   STEPS=12 ROUNDS=5 bash bench/offload.sh
#   CONFIGS="full_shard:bf16:optimizer" NP=4 bash bench/offload.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-5}
NP=${NP:-2}
CONFIGS=${CONFIGS:-full_shard:f32:optimizer full_shard:bf16:optimizer zero2:f32:optimizer ddp:f32:optimizer full_shard:bf16:params}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
	/usr/share/common-licenses/GPL-3 >/dev/null
sed 's|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|' \
	models/gpt2-tiny.dp >"$T/m.dp"

# run NAME: one run of $T/NAME.bin; its steps' ms (after WARMUP) appended
# to $T/NAME.steps, their median printed
run() {
	rm -f "$T/$1.json"
	mpirun --oversubscribe -np "$NP" "$BUILD/dpexec" "$T/$1.bin" --steps "$STEPS" --log-every 1 \
		--eval-every 0 --quiet --log-json "$T/$1.json" >"$T/$1.out" 2>&1 || { cat "$T/$1.out" >&2; exit 1; }
	sed -n 's/^{"step": \([0-9]*\),.*"ms_per_step": \([0-9.e+-]*\),.*/\1 \2/p' "$T/$1.json" |
		awk -v w="$WARMUP" '$1 > w {print $2}' >"$T/$1.run"
	[ -s "$T/$1.run" ] || { echo "bench/offload.sh: no step times in $T/$1.json" >&2; exit 1; }
	cat "$T/$1.run" >>"$T/$1.steps"
	median <"$T/$1.run"
}
median() { sort -g | awk '{v[NR] = $1} END {printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

echo "gpt2-tiny -D d=256, $NP ranks, $STEPS steps a run (median of steps $((WARMUP + 1))..$STEPS), $ROUNDS ABBA rounds; $(nproc) cores"
printf "%-28s %5s %10s %10s %7s\n" config round "none ms" "offload ms" ratio
for c in $CONFIGS; do
	IFS=: read -r s prec o <<<"$c"
	for x in none "$o"; do
		"$BUILD/dpc" "$T/m.dp" -D d=256 --world-size "$NP" --precision "$prec" \
			--set train.strategy="$s" --set train.offload="$x" -o "$T/$x.bin" 2>/dev/null
		: >"$T/$x.steps"
	done
	: >"$T/ratios"
	before=$(load)
	for r in $(seq "$ROUNDS"); do
		if [ $((r % 2)) = 1 ]; then a=$(run none); b=$(run "$o"); else b=$(run "$o"); a=$(run none); fi
		ratio=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')
		echo "$ratio" >>"$T/ratios"
		printf "%-28s %5s %10s %10s %7s\n" "$c" "$r" "$a" "$b" "$ratio"
	done
	printf "%-28s %5s %10s %10s %7s  (rounds' ratios %s..%s; load %s -> %s)\n" "$c" median \
		"$(median <"$T/none.steps")" "$(median <"$T/$o.steps")" "$(median <"$T/ratios")" \
		"$(sort -g "$T/ratios" | head -n 1)" "$(sort -g "$T/ratios" | tail -n 1)" "$before" "$(load)"
done
