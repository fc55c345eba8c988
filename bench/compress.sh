#!/usr/bin/env bash
# bench/compress.sh - PowerSGD (docs/COMPRESS.md) against plain DDP at 2 ranks.
#
#   1. models/gpt2.dp (124M) under ddp at 2 ranks: the all_reduce bytes per
#      rank per optimizer step (`dpc --stats`, the steady state from
#      start_step) without compression and with powersgd rank 4 and 32, and
#      the ratio; the step time `dpc --simulate` predicts on h100-nvlink and
#      on the same machine with an 8 Gb/s (1 GB/s) link, where the bytes are
#      what costs.
#   2. gpt2.dp's shape, small enough to run here (-D d=256 -D layers=2: 4
#      heads of 64, models/gpt2.dp's vocabulary and context cut to gpt2-tiny's
#      data: models/gpt2-tiny.dp at d=256), 2 ranks on this CPU: dpexec's
#      ms/step without and with rank 4 and 32 (the mean after the first step,
#      from step start_step on).
#   3. models/gpt2-tiny.dp at 2 ranks, STEPS (200) steps on GPL-3's bytes:
#      the loss at the end (the mean of the last 10) without compression and
#      with powersgd(rank=4 | 32, start_step=10).
# Not a test: timings move with the machine's load.
#   STEPS=200 TIME_STEPS=16 bash bench/compress.sh
# (--simulate's two machines are not comparable with each other: the preset
# prices GEMMs from its table, the 1 GB/s file at the peak rate.)
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-200}
TIME_STEPS=${TIME_STEPS:-16}
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
	/usr/share/common-licenses/GPL-3 >/dev/null
data='s|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|; s|"build/data/train.bin"|"'"$T"'/text.bin"|; s|"build/data/val.bin"|"'"$T"'/val.bin"|'
mpi() { mpirun --oversubscribe -np 2 "$BUILD/dpexec" "$@"; }
variants=("none" "powersgd(rank=4,start_step=10)" "powersgd(rank=32,start_step=10)")
label() { case $1 in none) echo "plain ddp" ;; *) echo "powersgd rank ${1#*rank=}" | sed 's/,.*//' ;; esac; }

echo "== 1. models/gpt2.dp (124M), ddp, 2 ranks: all_reduce bytes per rank per step"
sed "$data" models/gpt2.dp >"$T/gpt2.dp"
printf '%-20s %16s %10s %14s %14s\n' variant bytes ratio "h100 ms" "1 GB/s ms"
# a bandwidth-poor cluster: H100's datasheet compute (util/machine.c's preset)
# over links of 1 GB/s bus bandwidth (8 Gb/s), 20 us per collective
cat >"$T/slow.json" <<EOF
{"name": "h100-1GBps", "source": "bench/compress.sh: h100-nvlink's peaks, 1 GB/s links",
 "executor": "gpu", "peak_flops": {"f32": 66.9e12, "bf16": 989.4e12}, "memory_bw": 3.35e12,
 "kernel_overhead_s": 2e-6, "ranks_per_node": 8,
 "intra": {"alpha_s": 20e-6, "busbw": 1e9}, "inter": {"alpha_s": 20e-6, "busbw": 1e9},
 "p2p": {"alpha_s": 20e-6, "busbw": 1e9}}
EOF
base=
for v in "${variants[@]}"; do
	b=$("$BUILD/dpc" "$T/gpt2.dp" --world-size 2 --set "train.compress=$v" --stats |
		awk '$1 == "all_reduce" {print $(NF - 5); exit}')
	base=${base:-$b}
	sim=$("$BUILD/dpc" "$T/gpt2.dp" --world-size 2 --set "train.compress=$v" --simulate=h100-nvlink |
		awk '/^step time/ {print $3}')
	slow=$("$BUILD/dpc" "$T/gpt2.dp" --world-size 2 --set "train.compress=$v" \
		--simulate="$T/slow.json" | awk '/^step time/ {print $3}')
	printf '%-20s %16s %10.1f %14s %14s\n' "$(label "$v")" "$b" "$(echo "$base / $b" | bc -l)" \
		"$sim" "${slow:--}"
done

echo
echo "== 2. gpt2.dp's shape at d=256, 2 layers, 2 ranks on this CPU: ms per step ($TIME_STEPS steps, compressed from step 10)"
sed -e "$data" models/gpt2-tiny.dp >"$T/tiny.dp"
for v in "${variants[@]}"; do
	"$BUILD/dpc" "$T/tiny.dp" -D d=256 --world-size 2 --set "train.compress=$v" -o "$T/t.bin"
	mpi "$T/t.bin" --steps "$TIME_STEPS" --eval-every 0 --log-every 1 --log-json "$T/t.json" \
		>/dev/null 2>&1
	ms=$(python3 - "$T/t.json" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
ms = [s.get("ms_per_step", s.get("ms")) for s in steps if s["step"] > 10]
ms = [m for m in ms if m is not None]
print(f"{sum(ms) / len(ms):.1f}" if ms else "-")
EOF
)
	rm -f "$T/t.json"
	printf '%-20s %10s ms/step\n' "$(label "$v")" "$ms"
done

echo
echo "== 3. models/gpt2-tiny.dp, 2 ranks, $STEPS steps: the loss at the end (mean of the last 10)"
for v in "${variants[@]}"; do
	"$BUILD/dpc" "$T/tiny.dp" --world-size 2 --set "train.compress=$v" -o "$T/l.bin"
	mpi "$T/l.bin" --steps "$STEPS" --eval-every 0 --quiet --losses "$T/l.txt" >/dev/null 2>&1
	printf '%-20s %10s\n' "$(label "$v")" \
		"$(awk '!/^#/ {l[NR] = $2; n = NR} END {s = 0; for (i = n - 9; i <= n; i++) s += l[i]; printf "%.4f", s / 10}' "$T/l.txt")"
done
