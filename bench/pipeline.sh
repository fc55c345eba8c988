#!/usr/bin/env bash
# bench/pipeline.sh - the pipelined step's bubble and activation memory per
# schedule, measured against the compiler's prediction (issue 25).
#
# models/gpt2-tiny.dp at -D d=256 -D layers=2*PP (4 heads of 64; stages auto
# balances about two layers per stage, one per interleaved virtual
# stage) on the GPL-3 text, PP ranks at pp=PP (default 4; PP=2 fits a
# 2-core machine without oversubscribing), grad_accum M micro-batches
# (default 8, a multiple of PP), one thread per rank, under gpipe, 1f1b
# (pipedream_flush), zero_bubble and interleaved (stages_per_rank 2):
#   bubble measured   from `dpexec --trace` of steps 2..STEPS: per rank, the
#                     share of the step (its first instruction to its last)
#                     in which its compute stream runs no kernel, averaged
#                     over the ranks (the once-per-step optimizer counts as
#                     busy, so the figure sits a little under the forecast)
#   bubble predicted  --stats' `bubble:` line: the closed form (p-1)/(m+p-1)
#                     ((p-1)/(3m+p-1) for zero_bubble, F = B = W; (p-1)/(2m+p-1)
#                     for interleaved, v = 2) and the one simulated from the
#                     stages' FLOPs
#   activations       per stage, --stats' closed form (the forward results
#                     kept per micro-batch x the micro-batches in flight:
#                     min(p - s, m) under 1f1b and zero_bubble, m under
#                     gpipe; interleaved: each rank's virtual-stage
#                     micro-batches in flight at its peak in its order) against
#                     the compiled step's temporaries at that stage's peak (the
#                     memory plan dpexec allocates)
# 4 ranks oversubscribe a 2-core machine: waiting ranks poll, then sleep,
# so absolute times are noisy; read the ordering and the ratios.
# Not a test: timings move with the machine's load.
#   STEPS=4 M=8 PP=4 bash bench/pipeline.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-4}
M=${M:-8}
PP=${PP:-4}
PY=${PY:-/usr/bin/python3}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_orte_execute_quiet=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
	/usr/share/common-licenses/GPL-3 >/dev/null
sed 's|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|' \
	models/gpt2-tiny.dp >"$T/g.dp"

for sched in gpipe pipedream_flush zero_bubble interleaved; do
	args=("$T/g.dp" -D d=256 -D layers=$((2 * PP)) --world-size "$PP" --pp "$PP"
		--set "train.grad_accum=$M" --set "train.pipeline=$sched")
	"$BUILD/dpc" "${args[@]}" -o "$T/$sched.bin" 2>/dev/null
	"$BUILD/dpc" "${args[@]}" --emit=stats 2>/dev/null >"$T/$sched.stats"
	timeout 600 mpirun --oversubscribe -np "$PP" "$BUILD/dpexec" "$T/$sched.bin" --steps "$STEPS" \
		--eval-every 0 --trace "$T/$sched.json" --trace-steps "2:$STEPS" >/dev/null 2>&1
done

$PY - "$T" "$M" "$PP" <<'EOF'
import json, re, sys
T, m, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("gpt2-tiny d=256 layers=%d, pp=%d, %d micro-batches" % (2 * p, p, m))
print("%-16s %10s %10s %10s %10s" % ("schedule", "measured", "closed", "simulated",
                                     "ms/step"))
mem = {}
for sched in ("gpipe", "pipedream_flush", "zero_bubble", "interleaved"):
    stats = open("%s/%s.stats" % (T, sched)).read()
    b = re.search(r"^bubble: \S+ = ([0-9.]+); from the stages' FLOPs ([-0-9.]+)", stats, re.M)
    closed = re.findall(r"^stage (\d+):.*? = (\d+) B \(.*?\) at the peak", stats, re.M) or \
        re.findall(r"^rank (\d+): stages .*? = (\d+) B \(", stats, re.M)
    comp = re.search(r"temporaries at the peak:(.*?);", stats).group(1)
    mem[sched] = ([int(v) for _, v in closed], [int(v) for v in re.findall(r"stage \d+ (\d+) B", comp)])
    ev = json.load(open("%s/%s.json" % (T, sched)))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    busy, span = {}, {}
    for e in ev:
        if e.get("ph") != "X":
            continue
        key = (e["pid"], e["args"].get("step"))
        lo, hi = span.get(key, (e["ts"], e["ts"] + e["dur"]))
        span[key] = (min(lo, e["ts"]), max(hi, e["ts"] + e["dur"]))
        if e.get("tid") == 0 and e.get("cat") == "kernel":
            busy[key] = busy.get(key, 0) + e["dur"]
    idle = [1 - busy.get(k, 0) / (hi - lo) for k, (lo, hi) in span.items() if hi > lo]
    ms = sum(hi - lo for (lo, hi) in span.values()) / len(span) / 1000
    print("%-16s %10.3f %10.3f %10.3f %10.1f" % (sched, sum(idle) / len(idle), float(b.group(1)),
                                                float(b.group(2)), ms))
print()
print("activations at the peak per stage, bytes: closed form | compiled (ratio)")
for sched, (closed, comp) in mem.items():
    cells = ["%d | %d (%.2f)" % (c, k, k / c if c else 0) for c, k in zip(closed, comp)]
    print("%-16s %s" % (sched, ";  ".join(cells)))
g, f = mem["gpipe"][1], mem["pipedream_flush"][1]
print("1f1b / gpipe compiled: " + " ".join("%.2f" % (a / b) for a, b in zip(f, g)))
EOF
