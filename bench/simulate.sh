#!/usr/bin/env bash
# bench/simulate.sh - dpc --simulate against dpexec on this machine.
#
# Per world size N (1, 2, 4): calibrate (dpexec --calibrate, runtime/calibrate.c)
# with the ddp step file of each model (mlp, gpt2-tiny, llama), and its tp=2
# and cp=2 step files where the configurations below take them (their own
# kernels and shapes: tp's halved GEMMs, cp's ring attention, which the ddp
# file does not run), into one machine file, cpu-N.json; then, for every configuration (the models under
# ddp, zero1, zero2, full_shard; hybrid_shard on 2x2; tp=2 and cp=2 where the
# transformers take them, alone at 2 ranks and with dp_shard=2 at 4), predict
# the step time (dpc --simulate=cpu-N.json) and measure it (dpexec, the
# median ms/step of steps 3..STEPS from --log-json); with RECAL=1, between
# the two, calibrate a copy of cpu-N.json again with the configuration's
# own step file (its sizes' points take this moment's times) and predict
# again ("recalibrated"): on the shared cores the load drifts by 2x within
# minutes, and a calibration minutes before a measurement carries the load
# of its moment (docs/SIMULATE.md: at load 19 to 27 it did not help).
# Prints each error, the MAPE, the largest error and Kendall's tau between
# the predicted and the measured order, over all configurations and within
# each (model, N) group, for each prediction.
# The machine is shared: the ddp runs are measured a second time, and the
# median |difference| between the two measurements is printed as the noise
# to set the errors against, with the machine's load average (the 1-minute
# figure of /proc/loadavg when each measurement ends: other users' work on
# the same cores) over the measurements. MODELS and SIZES pick a subset.
#   STEPS=12 bash bench/simulate.sh
#   MODELS="mlp" SIZES="2" RECAL=1 bash bench/simulate.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-12}
MODELS=${MODELS:-mlp gpt2-tiny llama}
SIZES=${SIZES:-1 2 4}
RECAL=${RECAL:-0}
. tests/lib.sh # the MPI-as-root settings
# the launcher of the calibrations and measurements (MPIRUN="mpirun
# --oversubscribe --bind-to none": ranks unbound, which at load 16 to 27
# made mlp's 2-rank steps bimodal, 3.7 or 85 ms: docs/SIMULATE.md)
MPIRUN=${MPIRUN:-mpirun --oversubscribe}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
[ -f build/data/fortunes.bin ] || { echo "simulate.sh: build/data/fortunes.bin: run make demo-gpt first" >&2; exit 1; }

# compile NAME MODEL N ARGS...: $T/NAME.bin
compile() {
	local name=$1 model=$2 n=$3; shift 3
	"$DPC" "$model" --world-size "$n" -o "$T/$name.bin" "$@" 2>/dev/null
}
# measure NAME N: median ms/step of steps 3.. of $T/NAME.bin on N ranks
measure() {
	rm -f "$T/$1.log"
	$MPIRUN -np "$2" "$DPEXEC" "$T/$1.bin" --device cpu --steps "$STEPS" \
		--log-every 1 --eval-every 0 --quiet --log-json "$T/$1.log" >/dev/null 2>&1
	$PY -c '
import json, statistics, sys
v = [json.loads(l)["ms_per_step"] for l in open(sys.argv[1]) if "ms_per_step" in l][2:]
print(f"{statistics.median(v):.3f}")' "$T/$1.log"
	cut -d' ' -f1 /proc/loadavg >>"$T/load"
}
# conf_args CONF: the dpc flags of a configuration, in $args
conf_args() {
	case $1 in
	tp2) args=(--tp 2) ;;
	cp2) args=(--cp 2) ;;
	hybrid_shard) args=(--dp-replicate 2 --set train.strategy=hybrid_shard) ;;
	*) args=(--set "train.strategy=$1") ;;
	esac
}
predict() { # predict NAME MODEL N ARGS...
	local name=$1 model=$2 n=$3; shift 3
	"$DPC" "$model" --world-size "$n" --simulate="$T/cpu-$n.json" "$@" 2>/dev/null |
		sed -n 's/^step time *\([0-9.]*\) ms/\1/p'
}

: >"$T/rows"
for n in $SIZES; do
	for m in $MODELS; do
		cals="ddp"
		[ "$m" != mlp ] && [ "$n" -gt 1 ] && cals="ddp tp2 cp2"
		for c in $cals; do
			conf_args "$c"
			compile "cal-$m-$n-$c" "models/$m.dp" "$n" "${args[@]}"
			$MPIRUN -np "$n" "$DPEXEC" "$T/cal-$m-$n-$c.bin" --device cpu --quiet \
				--calibrate "$T/cpu-$n.json" | sed 's/^/  /'
		done
	done
	cp "$T/cpu-$n.json" "$BUILD/cpu-$n.json"
	for m in $MODELS; do
		confs="ddp zero1 zero2 full_shard"
		[ "$n" = 1 ] && confs="ddp"
		[ "$n" = 4 ] && confs="ddp zero2 full_shard hybrid_shard"
		[ "$m" != mlp ] && [ "$n" -gt 1 ] && confs="$confs tp2 cp2"
		for c in $confs; do
			conf_args "$c"
			name="$m-$n-$c"
			compile "$name" "models/$m.dp" "$n" "${args[@]}" || { echo "  $name: does not compile"; continue; }
			p=$(predict "$name" "models/$m.dp" "$n" "${args[@]}")
			# RECAL=1: the same file recalibrated with this step file just
			# before its measurement: the kernels' and links' figures of
			# this moment's load (its own sizes' points replaced)
			q=-
			if [ "$RECAL" = 1 ]; then
				cp "$T/cpu-$n.json" "$T/now-$n.json"
				$MPIRUN -np "$n" "$DPEXEC" "$T/$name.bin" --device cpu --quiet \
					--calibrate "$T/now-$n.json" >/dev/null
				q=$("$DPC" "models/$m.dp" --world-size "$n" --simulate="$T/now-$n.json" "${args[@]}" \
					2>/dev/null | sed -n 's/^step time *\([0-9.]*\) ms/\1/p')
			fi
			t=$(measure "$name" "$n")
			again=-
			[ "$c" = ddp ] && again=$(measure "$name" "$n")
			echo "$m $n $c $p $t $again $q" | tee -a "$T/rows"
		done
	done
done
$PY - "$T/rows" "$T/load" <<'EOF'
import itertools, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def tau(a, b):
    c = d = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        s = (a[i] - a[j]) * (b[i] - b[j])
        c += s > 0
        d += s < 0
    return (c - d) / (c + d) if c + d else 1.0
recal = all(r[6] != "-" for r in rows)
print(f"\n{'model':10} {'N':>2} {'config':13} {'predicted ms':>13} {'measured ms':>12} {'error':>8}"
      + (f" {'recalibrated':>13} {'error':>8}" if recal else ""))
P = [float(r[3]) for r in rows]
M = [float(r[4]) for r in rows]
Q = [float(r[6]) for r in rows] if recal else []
for i, (r, p, t) in enumerate(zip(rows, P, M)):
    print(f"{r[0]:10} {r[1]:>2} {r[2]:13} {p:13.2f} {t:12.2f} {100 * (p - t) / t:+7.1f}%"
          + (f" {Q[i]:13.2f} {100 * (Q[i] - t) / t:+7.1f}%" if recal else ""))
for what, X, col in (("the world size's file, calibrated first", P, 3),
                     ("recalibrated with the step file just before its measurement", Q, 6)):
    if not X:
        continue
    errs = [abs(x - t) / t for x, t in zip(X, M)]
    print(f"\n{what}:\nMAPE {100 * statistics.mean(errs):.1f} % over {len(errs)} configurations, "
          f"largest {100 * max(errs):.1f} %, {sum(e <= 0.2 for e in errs)} within 20 %")
    print(f"Kendall tau, all configurations: {tau(X, M):.3f}")
    for key, grp in itertools.groupby(rows, key=lambda r: (r[0], r[1])):
        g = list(grp)
        if len(g) > 1:
            t = tau([float(r[col]) for r in g], [float(r[4]) for r in g])
            print(f"  {key[0]} at {key[1]} ranks: tau {t:.3f} over {len(g)}")
noise = [abs(float(r[5]) - float(r[4])) / float(r[4]) for r in rows if r[5] != "-"]
if noise:
    print(f"noise: the ddp runs measured twice differ by {100 * statistics.median(noise):.1f} % "
          f"(median), {100 * max(noise):.1f} % at most")
load = [float(l) for l in open(sys.argv[2]) if l.strip()]
print(f"load average (1 min) over the measurements: {min(load):.1f} to {max(load):.1f}, "
      f"median {statistics.median(load):.1f}, on {__import__('os').cpu_count()} CPUs")
EOF
