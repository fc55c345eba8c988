#!/usr/bin/env bash
# tests/golden.sh - golden IR dumps: dpc's IR after chosen passes must match
# the reviewed files in tests/golden/ exactly (diff -u on any difference).
#
# Each case compiles a model with `--dump-after=PASS` and compares the output
# with tests/golden/NAME.PASS.ir. After an intended change of the IR, run
#   UPDATE=1 bash tests/golden.sh
# to rewrite the files, then READ the diff (git diff tests/golden) by eye
# before committing it: the point of a golden file is that a person checked it.
set -u
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=tests/lib.sh
. tests/lib.sh

# name | model | dpc flags | passes
cases=(
	"mlp-ws2|models/mlp.dp|--world-size 2|collectives bucket"
)

if [ ! -x "$DPC" ]; then
	fail "dpc not built ($DPC)"
	finish golden
	exit 1
fi
tmp=$(tmpdir)
trap 'rm -rf "$tmp"' EXIT
for c in "${cases[@]}"; do
	IFS='|' read -r name model flags passes <<<"$c"
	for pass in $passes; do
		want=tests/golden/$name.$pass.ir
		got=$tmp/$name.$pass.ir
		# shellcheck disable=SC2086 # flags are words
		if ! "$DPC" "$model" $flags --dump-after="$pass" >"$got" 2>"$tmp/err"; then
			fail "$name after $pass: dpc failed: $(head -n 3 "$tmp/err")"
			continue
		fi
		if [ "${UPDATE:-0}" = 1 ]; then
			cp "$got" "$want"
			ok "$name after $pass (updated $want)"
		elif [ ! -f "$want" ]; then
			fail "$name after $pass: no $want (run UPDATE=1 bash tests/golden.sh)"
		elif diff -u "$want" "$got" >"$tmp/diff"; then
			ok "$name after $pass"
		else
			fail "$name after $pass differs from $want:"
			cat "$tmp/diff"
		fi
	done
done
finish golden
