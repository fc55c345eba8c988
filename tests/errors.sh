#!/usr/bin/env bash
# tests/errors.sh - the front end's error tests and fuzz run.
#
# Every tests/errors/*.dp is a malformed model. Its leading comments say what
# dpc must report:
#   # expect: 7:12: error: unknown identifier 'h9'   (LINE:COL: error: SUBSTRING)
#   # args: --world-size 3                            (extra dpc arguments)
#   # world-sizes: 1 2 3       (compile once per --world-size; `mesh auto`)
# For each file dpc must exit with status 1, print every expected message as
# FILE:LINE:COL: error: ...SUBSTRING... on stderr, quote a source line with a
# caret, write no output file, and print nothing that looks like a crash
# (internal error, sanitizer report).
#
# Every tests/batch_ok/*.dp must compile at world sizes 1, 2 and 3.
#
# Then $BUILD/tests/fe_fuzz (tests/fe_fuzz.c, built by `make tests`, with the
# sanitizers when SAN=1) runs over 2000 mutants of models/mlp.dp and of each
# valid model in tests/errors/seeds/ (the transformer syntax).
#
# Environment: BUILD (build or build-san), DPC (default $BUILD/dpc), SAN=1,
# FUZZ_N (mutants, default 2000).
set -u
cd "$(dirname "$0")/.."
SAN=${SAN:-0}
BUILD=${BUILD:-build}
[ "$SAN" = 1 ] && [ "$BUILD" = build ] && BUILD=build-san
DPC=${DPC:-$BUILD/dpc}
FUZZ_N=${FUZZ_N:-2000}
. tests/lib.sh # case_on, repro_lines (this suite keeps its own counters)

pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bad() {
	echo "FAIL $1: $2"
	repro_lines
	fail=$((fail + 1))
}

crashed() {
	grep -qE 'internal error|Sanitizer|runtime error:|Segmentation|core dumped' "$1"
}

if [ ! -x "$DPC" ]; then
	echo "errors: $DPC not built (run make first)"
	exit 1
fi

# check_file FILE [WORLD]: compile FILE (with --world-size WORLD when given)
# and check its expectations.
check_file() {
	local f=$1 ws=${2:-} what=$1 args
	[ -n "$ws" ] && what="$f (world size $ws)"
	case_on "errors/$(basename "$f" .dp)${ws:+ ws=$ws}" || return 0
	args=$(sed -n 's/^# args: //p' "$f" | tr '\n' ' ')
	[ -n "$ws" ] && args="$args --world-size $ws"
	REPRO=$(echo "$DPC $f $args -o /tmp/out.bin" | tr -s ' ')
	rm -f "$tmp/out.bin"
	# shellcheck disable=SC2086
	"$DPC" "$f" $args -o "$tmp/out.bin" >"$tmp/stdout" 2>"$tmp/stderr"
	rc=$?
	ok=1
	if [ $rc -ne 1 ]; then
		bad "$what" "exit status $rc, want 1"
		ok=0
	fi
	nexp=0
	while IFS= read -r exp; do
		nexp=$((nexp + 1))
		pos=${exp%%: error: *}    # LINE:COL
		msg=${exp#*: error: }     # message substring
		if ! grep -F -- "$f:$pos: error: " "$tmp/stderr" | grep -qF -- "$msg"; then
			bad "$what" "missing '$f:$pos: error: ...$msg...'"
			ok=0
		fi
	done < <(sed -n 's/^# expect: //p' "$f")
	if [ $nexp -eq 0 ]; then
		bad "$what" "no '# expect:' line"
		ok=0
	fi
	if ! grep -qE '^[[:space:]]*\^[[:space:]]*$' "$tmp/stderr"; then
		bad "$what" "no caret line on stderr"
		ok=0
	fi
	if [ -e "$tmp/out.bin" ]; then
		bad "$what" "an output file was written"
		ok=0
	fi
	if crashed "$tmp/stderr"; then
		bad "$what" "crash or sanitizer report"
		ok=0
	fi
	if [ $ok = 1 ]; then
		pass=$((pass + 1))
	else
		sed 's/^/    | /' "$tmp/stderr" | head -30
	fi
}

# A file with `# world-sizes: 1 2 3` is compiled once per world size (its
# mesh is `mesh auto`) and must fail the same way at each.
for f in tests/errors/*.dp; do
	sizes=$(sed -n 's/^# world-sizes: //p' "$f")
	if [ -z "$sizes" ]; then
		check_file "$f"
	else
		for ws in $sizes; do
			check_file "$f" "$ws"
		done
	fi
done

# Programs that are per-sample correct compile at every world size (the batch
# rules must not refuse a bias add or a position embedding).
for f in tests/batch_ok/*.dp; do
	for ws in 1 2 3; do
		case_on "batch_ok/$(basename "$f" .dp) ws=$ws" || continue
		if "$DPC" "$f" --world-size "$ws" -o "$tmp/ok.bin" >/dev/null 2>"$tmp/stderr" &&
			[ -s "$tmp/ok.bin" ]; then
			pass=$((pass + 1))
		else
			bad "$f (world size $ws)" "does not compile: $(head -c 400 "$tmp/stderr")"
		fi
		rm -f "$tmp/ok.bin"
	done
done

# A file that cannot be read: a message without a position, status 1.
if case_on missing-file; then
	"$DPC" "$tmp/no-such-file.dp" -o "$tmp/out.bin" >/dev/null 2>"$tmp/stderr"
	rc=$?
	if [ $rc -eq 1 ] && grep -qF "error: cannot open '$tmp/no-such-file.dp': No such file" "$tmp/stderr" &&
		! crashed "$tmp/stderr" && [ ! -e "$tmp/out.bin" ]; then
		pass=$((pass + 1))
	else
		bad "missing file" "status $rc: $(head -c 300 "$tmp/stderr")"
	fi
fi

# The fuzzer (built by `make tests` from the compiler's objects): mutated
# copies of models/mlp.dp and of the seeds must never crash the front end.
if [ -x "$BUILD/tests/fe_fuzz" ]; then
	for seed in models/mlp.dp tests/errors/seeds/*.dp; do
		case_on "fe_fuzz $(basename "$seed" .dp)" || continue
		REPRO="TMPDIR=/tmp $BUILD/tests/fe_fuzz $seed $FUZZ_N 1"
		if TMPDIR="$tmp" "$BUILD/tests/fe_fuzz" "$seed" "$FUZZ_N" 1 >"$tmp/fuzz" 2>&1 &&
			! crashed "$tmp/fuzz"; then
			cat "$tmp/fuzz"
			pass=$((pass + 1))
		else
			bad "fe_fuzz $seed" "$(tail -20 "$tmp/fuzz")"
		fi
	done
else
	bad "fe_fuzz" "$BUILD/tests/fe_fuzz is not built (make tests)"
fi

echo "errors: $pass passed, $fail failed"
[ $fail -eq 0 ]
