#!/usr/bin/env bash
# tests/gradcheck.sh - autodiff gradients match finite differences, and the
# check cannot be fooled (criterion, step and noise floor: runtime/gradcheck.c).
#
# 1. Every tests/gradcheck/*.dp model (one op or a small combination each)
#    and models/mlp8.dp (a deep relu MLP: kinks everywhere): `dpexec
#    --check-grads` passes, and every parameter is "ok" (none left "not
#    checked").
# 2. models/gpt2-tiny.dp and models/llama.dp (the small size tests/transformer.sh
#    uses: ctx 64, d 64, 2 layers, ffn 176), on byte tokens of the GPL-3 text:
#    unskewed every parameter is ok (the largest share of the tolerance used
#    is printed: 0.08 measured); with the analytic gradients zeroed
#    (DP_GRADCHECK_SKEW=-1), 20 % off either way (0.2: x1.2, -0.2: x0.8) or
#    1 % off either way (0.01, -0.01) every parameter FAILS (the lines are
#    counted; the least multiple of the tolerance is printed: 2.06 measured
#    at 1 %), exit 1. gpt2-tiny's
#    global_batch is 4 here instead of 16 (the same parameters; a quarter of
#    the time per loss evaluation). The unskewed check and the four skews
#    are one run, DP_GRADCHECK_SKEW=0,0.2,-0.2,0.01,-0.01 (one set of finite
#    differences, five verdicts: runtime/gradcheck.c), split by its "skew S: "
#    prefixes;
#    the zeroed gradient (-1) is a run of its own (zeros change the picks).
#    The perturbed losses come from the forward alone (runtime/gradcheck.c's
#    slice): the shared run must not have fallen back to the whole step.
# 3. A parameter whose gradient is zero on both sides (a relu layer kept dead
#    by a bias of -100) is reported "not checked", never "ok", and the
#    parameters after it are still checked (a zeroed head.b fails).
# The runs are independent: they start PAR at a time (the slots tests/run.sh
# gave this suite, else the CPUs), each on one thread when several run
# (results are bitwise the same at any thread count), and are checked
# afterwards in the order above.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
PAR=${DP_JOBS:-$(nproc)}
[ "$PAR" -gt 1 ] && export DP_NUM_THREADS=${DP_NUM_THREADS:-1}
nparams() { unstamp "$1" | grep -c "^gradcheck [^:]*:"; }
share() { # share min|max FILE: the extreme share of the tolerance over the parameters
	# (unstamped: the zeroed gradient's run is a file of its own, with times)
	unstamp "$2" | sed -nE 's/^gradcheck [^:]*:.*\(([0-9.]+) of the tolerance\).*/\1/p' | sort -g |
		if [ "$1" = min ]; then head -n 1; else tail -n 1; fi
}
# gc OUT STEPFILE [VAR=VALUE...]: GC in the background (PAR at a time), in
# that environment; its output in OUT, its exit status in OUT.rc
gc() { par "$PAR" gc_bg "$@"; }
gc_bg() {
	local out=$1 bin=$2
	shift 2
	env "$@" $MPI_ASAN timeout 600 "$DPEXEC" "$bin" --check-grads --device cpu >"$out" 2>&1
	echo $? >"$out.rc"
}

# ---- start the runs of the selected cases ----
# 1. every op, and a deep relu MLP (compiled here: a dpc failure is a FAIL of its case)
ops=()
for f in tests/gradcheck/*.dp models/mlp8.dp; do
	n=$(basename "$f" .dp)
	case_on "$n" || continue
	ops+=("$f")
	if "$DPC" "$f" --world-size 1 -o "$T/$n.bin" >"$T/$n.dpc" 2>&1; then
		gc "$T/$n.out" "$T/$n.bin"
	else
		echo 1 >"$T/$n.out.rc"; cp "$T/$n.dpc" "$T/$n.out"
	fi
done
# 2. the transformers, unskewed and skewed (a skewed run is counted against
# the unskewed one's parameters: that one runs whenever one of them does)
TEXT=/usr/share/common-licenses/GPL-3
transformers() { # the shard and both step files (what every case of 2. needs)
	local m
	if ! "$ROOT/$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 $TEXT \
		>"$T/shard.log" 2>&1; then
		fail "text2shard $TEXT"; cat "$T/shard.log"
	fi
	for m in gpt2-tiny llama; do
		sed -e "s#\"build/data/fortunes.bin\"#\"$T/text.bin\"#" \
			-e "s#\"build/data/fortunes_val.bin\"#\"$T/val.bin\"#" \
			-e 's/^  global_batch 16 .*/  global_batch 4/' models/$m.dp >"$T/$m.dp"
	done
	"$DPC" "$T/gpt2-tiny.dp" -o "$T/gpt.bin" 2>"$T/dpc.out" || { fail "dpc gpt2-tiny"; cat "$T/dpc.out"; }
	"$DPC" "$T/llama.dp" -D ctx=64 -D d=64 -D layers=2 -D ffn=176 -o "$T/llama.bin" 2>"$T/dpc.out" ||
		{ fail "dpc llama"; cat "$T/dpc.out"; }
}
skews=(-1 0.2 -0.2 0.01 -0.01)
for m in gpt llama; do
	on=0
	case_on "$m" && on=1
	for skew in "${skews[@]}"; do case_on "$m skew=$skew" && on=1; done
	[ $on = 1 ] || continue
	once transformers transformers
	gc "$T/$m.all" "$T/$m.bin" DP_GRADCHECK_SKEW=0,0.2,-0.2,0.01,-0.01
	case_ran "$m skew=-1" && gc "$T/$m.skew-1" "$T/$m.bin" DP_GRADCHECK_SKEW=-1
done
# 3. nothing to compare is "not checked"
if case_on dead; then
	sed 's/param b: f32\[8\]    init normal(0, 0.5)/param b: f32[8]    init normal(-100, 0.01)/' \
		tests/gradcheck/relu.dp >"$T/dead.dp"
	"$DPC" "$T/dead.dp" -o "$T/dead.bin" 2>"$T/dpc.out" || { fail "dpc dead.dp"; cat "$T/dpc.out"; }
	gc "$T/dead.out" "$T/dead.bin"
	gc "$T/dead.skew" "$T/dead.bin" DP_GRADCHECK_SKEW=-1
fi
wait

# ---- check them, in order ----
# 1.
for f in "${ops[@]}"; do
	n=$(basename "$f" .dp)
	case_ran "$n"
	REPRO="$BUILD/dpc $f --world-size 1 -o /tmp/$n.bin && $BUILD/dpexec /tmp/$n.bin --check-grads --device cpu"
	if [ "$(cat "$T/$n.out.rc")" = 0 ] &&
		[ "$(grep -c ' ok$' "$T/$n.out")" -eq "$(nparams "$T/$n.out")" ]; then
		ok "$n: $(grep -c ' ok$' "$T/$n.out") parameters ok"
	else
		fail "$n"; sed 's/^/      /' "$T/$n.out" | tail -n 8
	fi
done
# 2. (the shared run's verdicts by skew, each with the exit status its own
# run would have had: 1 when its summary counts a FAILED parameter)
for m in gpt llama; do
	if [ -f "$T/$m.all" ]; then
		for skew in 0 0.2 -0.2 0.01 -0.01; do
			f=$T/$m.skew$skew
			[ $skew = 0 ] && f=$T/$m.out
			unstamp "$T/$m.all" | sed -n "s/^skew $skew: //p" >"$f"
			if unstamp "$f" | grep -q '^gradcheck: .* FAILED'; then echo 1; else echo 0; fi >"$f.rc"
		done
		[ "$(cat "$T/$m.all.rc")" = "$(cat "$T/$m.out.rc")" ] ||
			fail "$m: the shared run's exit $(cat "$T/$m.all.rc") is not its first skew's"
		unstamp "$T/$m.all" | grep '^gradcheck' | grep -qv 'instructions give' &&
			{ fail "$m: the shared run printed verdicts of no skew"; unstamp "$T/$m.all" | grep '^gradcheck' | head -n 5; }
		# (the perturbed losses come from the loss's own instructions; a slice
		# that disagrees with the whole step falls back to it, ~3x slower)
		unstamp "$T/$m.all" | grep -q '^gradcheck: the loss.s .* instructions give' &&
			fail "$m: $(unstamp "$T/$m.all" | grep '^gradcheck: the loss.s .* instructions give')"
	fi
	if case_ran "$m"; then
		rc=$(cat "$T/$m.out.rc")
		np=$(nparams "$T/$m.out")
		if [ $rc -eq 0 ] && [ "$np" -gt 0 ] && [ "$(grep -c ' ok$' "$T/$m.out")" -eq "$np" ]; then
			ok "$m: all $np parameters ok, using at most $(share max "$T/$m.out") of the tolerance"
		else
			fail "$m: unskewed (exit $rc)"; grep -v ' ok$' "$T/$m.out" | tail -n 8 | sed 's/^/      /'
		fi
	fi
	for skew in "${skews[@]}"; do
		case_ran "$m skew=$skew" || continue
		np=$(nparams "$T/$m.out")
		rc=$(cat "$T/$m.skew$skew.rc")
		nf=$(unstamp "$T/$m.skew$skew" | grep -c '^gradcheck [^:]*: .* FAILED$')
		if [ $rc -eq 1 ] && [ "$np" -gt 0 ] && [ "$nf" -eq "$np" ]; then
			ok "$m: DP_GRADCHECK_SKEW=$skew fails all $nf parameters, by at least $(share min \
				"$T/$m.skew$skew") times the tolerance"
		else
			fail "$m: DP_GRADCHECK_SKEW=$skew fails $nf of $np parameters (exit $rc)"
			grep -v ' FAILED$' "$T/$m.skew$skew" | tail -n 6 | sed 's/^/      /'
		fi
	done
done
# 3.
if case_ran dead; then
	rc=$(cat "$T/dead.out.rc") rc2=$(cat "$T/dead.skew.rc")
	if [ $rc -eq 0 ] && unstamp "$T/dead.out" | grep -q '^gradcheck fc1.w: .* not checked$' &&
		unstamp "$T/dead.out" | grep -q '^gradcheck fc1.b: .* not checked$' &&
		! unstamp "$T/dead.out" | grep -q '^gradcheck fc1\..* ok$' &&
		unstamp "$T/dead.out" | grep -q '^gradcheck head.b: .* ok$' &&
		[ $rc2 -eq 1 ] && unstamp "$T/dead.skew" | grep -q '^gradcheck head.b: .* FAILED$'; then
		ok "a dead layer's parameters are 'not checked': $(tail -n 1 "$T/dead.out")"
	else
		fail "a dead layer's parameters are 'not checked' (exit $rc, $rc2)"; cat "$T/dead.out" "$T/dead.skew"
	fi
fi
finish gradcheck
