#!/usr/bin/env bash
# tests/trace.sh - dpexec --trace FILE (runtime/trace.c) writes a Chrome /
# Perfetto trace that parses and means what it says: models/mlp.dp (three
# all_reduce buckets per step at 2 ranks) for 3 steps, at 1 and at 2 ranks.
# Checked (tests/trace_check.py):
#   - the file is JSON with a traceEvents list, every span is "X" with
#     ts >= 0 and dur >= 0, on a named process (rank) and lane;
#   - on every lane, spans nest or are disjoint (what the viewers need);
#   - every step has its run spans ("step k micro m"), each holding its
#     instruction spans, in program order and in time;
#   - at 2 ranks: both ranks, each with its collectives on a comm lane
#     (bytes > 0, the data-parallel axes) and its waits as "wait" spans.
# --trace-steps 3:5 of an 8-step run with evaluation: exactly steps 3..5
# traced, no eval, and the window passes the same checks.
# The cost of tracing: step time with and without --trace is printed (the
# trace is two clock reads and an append per instruction; not asserted,
# timings move with the machine's load).
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=3
if [ ! -e /usr/share/datasets/fashion-mnist ]; then
	fail "needs dataset-fashion-mnist (make deps)"; finish trace; exit 1
fi
bin() { # bin NP: models/mlp.dp compiled for NP ranks ($T/mNP.bin)
	"$DPC" models/mlp.dp --world-size "$1" -o "$T/m$1.bin" >"$T/dpc$1.log" 2>&1 ||
		{ cat "$T/dpc$1.log"; fail "dpc at $1 ranks"; return 1; }
}
for np in 1 2; do
	case_on "ranks$np" || continue
	once "bin$np" bin "$np" || continue
	if mpi "$np" "$T/m$np.bin" --steps $STEPS --eval-every 0 --log-every $STEPS \
		--trace "$T/t$np.json" >"$T/run$np.log" 2>&1; then
		ok "$np rank(s): dpexec --trace ran"
	else
		tail -n 20 "$T/run$np.log"; fail "$np rank(s): dpexec --trace"; continue
	fi
	if out=$($PY tests/trace_check.py "$T/t$np.json" "$np" "$STEPS" 2>&1); then
		ok "$np rank(s): $out"
	else
		echo "$out" | sed 's/^/      /'; fail "$np rank(s): the trace"
	fi
done
# --trace-steps A:B: a window of a long run, steps A..B only (as logged, from
# 1), no eval or export; the window's trace passes the same checks
if case_on window; then
	once bin2 bin 2
	if mpi 2 "$T/m2.bin" --steps 8 --eval-every 4 --log-every 8 --trace "$T/w.json" --trace-steps 3:5 \
		>"$T/w.log" 2>&1 && out=$($PY tests/trace_check.py "$T/w.json" 2 3 2>&1) &&
		runs=$($PY -c 'import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
print(" ".join(sorted({e["name"].split(" micro")[0] for e in ev if e.get("cat") == "run"})))' "$T/w.json") &&
		[ "$runs" = "step 3 step 4 step 5" ]; then
		ok "--trace-steps 3:5 of 8 steps (eval every 4): runs traced: $runs; $out"
	else
		fail "--trace-steps 3:5: only steps 3 to 5 (${runs:-?})"; echo "$out" | sed 's/^/      /'; tail -n 5 "$T/w.log"
	fi
	expect "--trace-steps 5:3 is refused" "--trace-steps wants A:B" "$DPEXEC" "$T/m2.bin" --trace "$T/x.json" --trace-steps 5:3
fi
# the overhead, for the record (--trace vs none, 1 rank, 20 steps)
if case_on overhead; then
	once bin1 bin 1
	for v in plain traced; do
		extra=(); [ $v = traced ] && extra=(--trace "$T/o.json")
		env $MPI_ASAN "$DPEXEC" "$T/m1.bin" --steps 21 --eval-every 0 --log-every 20 "${extra[@]}" \
			>"$T/$v.log" 2>&1
	done
	echo "  (step time without / with --trace: $(unstamp "$T/plain.log" | sed -nE 's/^step 20\/.*\| ([0-9.]+) ms\/step.*/\1/p') /" \
		"$(unstamp "$T/traced.log" | sed -nE 's/^step 20\/.*\| ([0-9.]+) ms\/step.*/\1/p') ms)"
fi
# a file that cannot be written is an error, not a crash
if ! case_on unwritable; then
	:
elif once bin1 bin 1; env $MPI_ASAN "$DPEXEC" "$T/m1.bin" --steps 1 --eval-every 0 --quiet \
	--trace "$T/no/such/dir/t.json" >"$T/bad.log" 2>&1; then
	fail "an unwritable --trace path is refused"
elif grep -q -- "--trace: cannot write" "$T/bad.log"; then
	ok "an unwritable --trace path is refused: $(grep -o -- '--trace: cannot write.*does not exist' "$T/bad.log" | sed "s|$T|T|g")"
else
	cat "$T/bad.log"; fail "an unwritable --trace path is refused with a message"
fi
finish trace
