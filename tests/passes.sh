#!/usr/bin/env bash
# tests/passes.sh - one pass at a time on IR text (QBE's and LLVM's tests),
# the IR round trip, and dpc --from-ir's errors.
#
# 1. Each tests/passes/NAME.in.ir goes through
#      dpc --from-ir NAME.in.ir --passes PASS
#    where PASS is the pass NAME.out.ir's first line names ("; dp IR after
#    PASS"), and must print NAME.out.ir exactly (diff -u on any difference).
#    The inputs are dumps of the small models beside them (each says how it
#    was made), edited by hand where a case needs it. After an intended
#    change of a pass, UPDATE=1 bash tests/passes.sh rewrites the .out.ir
#    files; READ the diff by eye before committing it.
# 2. Round trip: every model in models/ at 1 and 4 ranks, at tp=2, at cp=2
#    (2 ranks, where the model compiles), at pp=2 (2 ranks) and in bf16 (dpc
#    --precision=bf16, 2 ranks) is compiled with --dump-ir; every dump, read
#    back and run through the rest of the pipeline (--from-ir DUMP --passes
#    all), must give the final IR and the step file of the direct compile
#    byte for byte. (A model that asks for bf16 itself would not: the step
#    file names the .dp line and column of that request, which the IR's
#    settings lines do not carry yet.)
# 3. --from-ir's errors: malformed IR at file:line:col with a caret, an
#    unknown pass in the header, passes out of order or already run, a
#    step file before the end, IR that does not verify (a view out of its
#    buffer, a temporary on a parameter) or that the layout
#    cannot have made, pipeline stages out of block order, a pipeline whose
#    stages' transfers deadlock or pair up out of order (the verifier's
#    simulation, ir/verify.c): a message, exit 1, no output file.
# 4. The reader fuzzed: $BUILD/tests/fe_fuzz --ir (tests/fe_fuzz.c) reads
#    FUZZ_N (default 1000; tests/lib.sh's fuzz_budget) mutants of each input above and of tests/ir/*.ir:
#    no crash, no sanitizer report (SAN=1), every graph read prints back as
#    it printed.
set -u
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=tests/lib.sh
. tests/lib.sh

if [ ! -x "$DPC" ]; then
	fail "dpc not built ($DPC)"
	finish passes
	exit 1
fi
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT

# ---- 1. one pass, IR in, IR out ----
for in in tests/passes/*.in.ir; do
	name=$(basename "$in" .in.ir)
	case_on "$name" || continue
	want=tests/passes/$name.out.ir
	if [ ! -f "$want" ]; then
		fail "$name: no $want"
		continue
	fi
	pass=$(sed -n '1s/^; dp IR after \([a-z0-9_]*\) .*/\1/p' "$want")
	if [ -z "$pass" ]; then
		fail "$name: $want does not start with '; dp IR after PASS'"
		continue
	fi
	got=$T/$name.out.ir
	REPRO="${DPC#"$ROOT"/} --from-ir $in --passes $pass | diff -u $want -"
	if ! "$DPC" --from-ir "$in" --passes "$pass" >"$got" 2>"$T/err"; then
		fail "$name ($pass): dpc failed: $(head -n 5 "$T/err")"
		continue
	fi
	if [ "${UPDATE:-0}" = 1 ]; then
		cp "$got" "$want"
		ok "$name ($pass; updated $want)"
	elif diff -u "$want" "$got" >"$T/diff"; then
		ok "$name ($pass)"
	else
		fail "$name ($pass) differs from $want:"
		cat "$T/diff"
	fi
done

# ---- 2. the round trip, from every dump ----
# variant MODEL KIND: a copy of the model with the mesh KIND (auto, tp2, cp2, pp2)
variant_mesh() {
	case $2 in
	auto) cp "$1" "$T/m.dp" ;;
	*) { echo "mesh ${2%2}=2, dp_shard=auto"; grep -v '^mesh ' "$1"; } >"$T/m.dp" ;;
	esac
}
for model in models/*.dp; do
	for c in "auto 1" "auto 4" "tp2 2" "cp2 2" "pp2 2" "auto 2 --precision=bf16"; do
		read -r mesh ws flags <<<"$c"
		what="$(basename "$model" .dp) ($mesh, $ws ranks${flags:+ $flags})"
		case_on "roundtrip $what" || continue
		variant_mesh "$model" "$mesh"
		rm -rf "$T/d"
		# the copy keeps the model's name in the dumps
		cp "$T/m.dp" "$T/$(basename "$model")"
		# shellcheck disable=SC2086 # flags are words
		if ! (cd "$T" && "$DPC" "$(basename "$model")" --world-size "$ws" $flags --dump-ir=d \
			-o direct.bin) 2>"$T/err"; then
			# cp needs token data and attention: the MLPs refuse it, as they should
			if [ "$mesh" = cp2 ] && grep -q "cp=2" "$T/err"; then
				continue
			fi
			fail "$what: dpc: $(head -n 3 "$T/err")"
			continue
		fi
		bad=""
		n=0
		final=$(ls "$T"/d/*.ir | tail -n 1) # the last pass's dump
		for dump in "$T"/d/*.ir; do
			n=$((n + 1))
			k=$(basename "$dump" .ir)
			rm -f "$T/rt.bin"
			if ! "$DPC" --from-ir "$dump" --passes all -o "$T/rt.bin" --emit=ir >"$T/rt.ir" \
				2>"$T/err"; then
				bad="$bad $k (dpc: $(head -n 2 "$T/err" | tr '\n' ' '))"
			elif ! cmp -s "$final" "$T/rt.ir"; then
				bad="$bad $k (IR: $(diff "$final" "$T/rt.ir" | sed -n 2p))"
			elif ! cmp -s "$T/direct.bin" "$T/rt.bin"; then
				bad="$bad $k (step file)"
			fi
		done
		if [ -z "$bad" ]; then
			ok "$what: the $n dumps read back give its IR and step file"
		else
			fail "$what: read back, these differ:$bad"
		fi
	done
done

# ---- 3. errors ----
# fails NAME WANT ARGS...: dpc exits 1 with WANT in its messages and leaves
# no $T/out.bin
fails() {
	local name=$1 want=$2; shift 2
	case_on "$name" || return 0
	rm -f "$T/out.bin"
	"$DPC" "$@" >"$T/out" 2>&1
	local rc=$?
	if [ $rc -eq 1 ] && grep -qF -- "$want" "$T/out" && [ ! -e "$T/out.bin" ]; then
		ok "$name"
	else
		fail "$name (exit $rc, wanted '$want', no out.bin)"
		sed 's/^/      /' "$T/out" | head -n 8
	fi
}
in=tests/passes/setup.in.ir
sed 's/= linear %x/= linaer %x/' "$in" >"$T/bad.ir"
line=$(grep -n '= linaer %x' "$T/bad.ir" | cut -d: -f1)
fails "malformed IR: file:line:col" "$T/bad.ir:$line:17: error: expected an op or a directive" \
	--from-ir "$T/bad.ir" --passes setup
case_ran "malformed IR: file:line:col" && check "malformed IR: the line and a caret" grep -q '^ *\^$' "$T/out"
sed '1s/after layout/after bucket/' "$in" >"$T/bad.ir"
fails "an unknown pass in the header" "$T/bad.ir:1:15: error: unknown pass 'bucket'" \
	--from-ir "$T/bad.ir"
fails "a pass before the IR's" "shape comes before it" --from-ir "$in" --passes shape
fails "the IR's own pass" "is the IR after layout already" --from-ir "$in" --passes layout
fails "passes out of order" "setup comes before collectives" \
	--from-ir "$in" --passes collectives,setup
fails "an unknown pass" "unknown pass 'bucket'" --from-ir "$in" --passes bucket
fails "a step file before the end" "the passes stop after setup" \
	--from-ir "$in" --passes setup -o "$T/out.bin"
tail -n +2 "$in" >"$T/bad.ir"
fails "--passes all without a header" "does not say which pass" --from-ir "$T/bad.ir"
fails "options of a model" "IR (--from-ir) has them settled" --from-ir "$in" --world-size 2
sed 's/view=%fc1.gather+12/view=%fc1.gather+14/' "$in" >"$T/bad.ir"
fails "IR that does not verify" "the IR is not valid" --from-ir "$T/bad.ir" -o "$T/out.bin"
# the sample program's first temporary planned onto the parameters
sed 's/^\(%t.sample : f32\[1,8,4\]\) @2560 /\1 @0 /' tests/passes/memplan-sample.out.ir >"$T/bad.ir"
fails "a temporary on a parameter does not verify" \
	"verify: value 28 (%t.sample): temporary shares bytes [0, 256) with %flat.params, which is persistent" \
	--from-ir "$T/bad.ir" -o "$T/out.bin"
sed 's/view=%fc1.gather+12/view=%fc1.gather+11/' "$in" >"$T/bad.ir"
fails "a layout the layout pass cannot have made" \
	"error: %fc1.b should be a view of %fc1.gather at +12" --from-ir "$T/bad.ir" --passes setup
sed 's/^%grad.head.w \( *\): f32\[3,2\]/%grad.head.w \1: f32[1,2]/' "$in" >"$T/bad.ir"
fails "a gradient with fewer elements than its parameter" \
	"%grad.head.w has 2 elements and its parameter %head.w 6" --from-ir "$T/bad.ir" --passes setup
grep -v '^%fc1.rs ' "$in" >"$T/bad.ir"
fails "a unit's buffer missing" "%fc1.rs, which the layout makes, is missing" \
	--from-ir "$T/bad.ir" --passes setup
sed 's/^block fc4$/block fc4 stage=1/; s/^block fc5$/block fc5 stage=0/' tests/passes/stages.in.ir \
	>"$T/bad.ir"
line=$(grep -n '^block fc5 stage=0' "$T/bad.ir" | cut -d: -f1)
fails "pipeline stages out of block order" \
	"$T/bad.ir:$line:11: error: block 'fc5' is on stage 0 after block 'fc4' on stage 1" \
	--from-ir "$T/bad.ir" --passes stages
# a pipeline hand-edited out of order (the p2p pass's output): stage 0 sends
# %h after it waits for %d.h.pp0, which stage 1 sends only after %h came
awk '/^send %h axes=pp peer=1 /{held=$0; next} {print} /^%d.h.pp0 = recv/{print held}' \
	tests/passes/p2p.out.ir >"$T/bad.ir"
fails "a deadlocking pipeline schedule" "the pipeline deadlocks: stage 0 waits at its recv (node 29, %d.h.pp0) for stage 1, which waits at its recv (node 6, %h.pp1)" \
	--from-ir "$T/bad.ir" --passes schedule
# stage 1 sends %h.pp1 before %g, stage 2 receives %g first
sed '/^send %g axes=pp peer=2/{h;d}; /^%h.pp2 = recv/{G}' tests/passes/p2p.out.ir >"$T/bad.ir"
fails "pipeline transfers in different orders" "stage 1's send (node 11, %h.pp1, tag 2) meets stage 2's recv (node 10, %g.pp2, tag 1): the two stages' transfers are in different orders" \
	--from-ir "$T/bad.ir" --passes schedule

# ---- 4. the reader fuzzed ----
FUZZ_N=${FUZZ_N:-$(fuzz_budget 1000)}
if [ -x "$BUILD/tests/fe_fuzz" ]; then
	for in in tests/passes/*.in.ir tests/ir/*.ir; do
		case_on "fe_fuzz $in" || continue
		REPRO="$BUILD/tests/fe_fuzz --ir $in $FUZZ_N 1"
		if "$BUILD/tests/fe_fuzz" --ir "$in" "$FUZZ_N" 1 >"$T/fuzz" 2>&1 &&
			! grep -qE 'internal error|Sanitizer|runtime error:' "$T/fuzz"; then
			ok "$(tail -n 1 "$T/fuzz" | sed 's/^fe_fuzz: //')"
		else
			fail "fe_fuzz --ir $in"
			tail -n 20 "$T/fuzz" | sed 's/^/      /'
		fi
	done
else
	fail "$BUILD/tests/fe_fuzz is not built (make tests)"
fi
finish passes
