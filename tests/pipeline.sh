#!/usr/bin/env bash
# tests/pipeline.sh - the pp mesh axis and the compiler's pipeline plan
# (issue 25, its first part: passes/stages.c, --stats' pipeline section).
#
#   mesh      `mesh pp=2, dp_shard=auto` and `dpc --pp 2` give the same mesh,
#             pp outermost; a model without pp prints no pp (its IR as before)
#   forms     tests/pipeline_forms.py: the stages auto cut of gpt2-tiny, the
#             parameters per stage with the tied wte on both ends, the bytes
#             sent over each cut, the activations kept at the peak under
#             pipedream_flush (1F1B) and gpipe, the bubble's closed form, the
#             stages' FLOPs summing to the micro-batch's; --emit=schedule's rows
#             in each schedule's slot order (by hand), its bubble --stats' one
#   stage1    a block's `stage` is ignored at pp=1: the step file is byte for
#             byte the one without it
#   refused   a pp > 1 step file is not written (no pipelined programs yet):
#             exit 1, no file
# The cut's errors are tests/errors/pp_*.dp; the pass is tests/passes/stages*.
set -u
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=tests/lib.sh
. tests/lib.sh
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
M=models/gpt2-tiny.dp

if case_on mesh; then
	REPRO="${DPC#"$ROOT"/} $M --world-size 4 --pp 2 --emit=ir | grep ^mesh"
	{ echo "mesh pp=2, dp_shard=auto"; cat "$M"; } >"$T/pp.dp"
	a=$("$DPC" "$M" --world-size 4 --pp 2 --emit=ir 2>/dev/null | grep '^mesh')
	b=$("$DPC" "$T/pp.dp" --world-size 4 --emit=ir 2>/dev/null | grep '^mesh')
	want="mesh pp=2 dp_replicate=1 dp_shard=2 cp=1 tp=1"
	if [ "$a" = "$want" ] && [ "$b" = "$want" ]; then
		ok "--pp 2 and mesh pp=2, dp_shard=auto at 4 ranks: $want"
	else
		fail "mesh lines '$a' and '$b', want '$want'"
	fi
	c=$("$DPC" "$M" --world-size 4 --emit=ir 2>/dev/null | grep '^mesh')
	check "without pp the mesh line has no pp: $c" [ "$c" = "mesh dp_replicate=1 dp_shard=4 cp=1 tp=1" ]
fi

if case_on forms; then
	REPRO="DPC=${DPC#"$ROOT"/} $PY tests/pipeline_forms.py"
	if DPC="$DPC" $PY tests/pipeline_forms.py >"$T/forms.log" 2>&1; then
		ok "$(tail -n 1 "$T/forms.log")"
	else
		grep -v '^  ok' "$T/forms.log" | head -n 20
		fail "pipeline_forms.py: $(tail -n 1 "$T/forms.log")"
	fi
fi

if case_on stage1; then
	REPRO="${DPC#"$ROOT"/} tests/warnings/pipeline_no_pp.dp -o x.bin"
	mkdir -p "$T/a" "$T/b" # the step file names its model: the same name in both
	sed '/^  *stage [0-9]/d; /^  pipeline /d' tests/warnings/pipeline_no_pp.dp >"$T/a/m.dp"
	cp tests/warnings/pipeline_no_pp.dp "$T/b/m.dp"
	if (cd "$T/a" && "$DPC" m.dp -o m.bin 2>/dev/null) && (cd "$T/b" && "$DPC" m.dp -o m.bin 2>/dev/null) &&
		! cmp -s "$T/a/m.dp" "$T/b/m.dp" && cmp -s "$T/a/m.bin" "$T/b/m.bin"; then
		ok "at pp=1 a block's stage and the pipeline schedule change nothing (step files equal)"
	else
		fail "at pp=1 the step file with stage/pipeline differs from the one without"
	fi
fi

if case_on refused; then
	REPRO="${DPC#"$ROOT"/} $M --world-size 2 --pp 2 -o x.bin"
	if ! "$DPC" "$M" --world-size 2 --pp 2 -o "$T/pp.bin" 2>"$T/err" && [ ! -e "$T/pp.bin" ] &&
		grep -q "error: pp=2: dpc cuts the model into pipeline stages" "$T/err"; then
		ok "a pp=2 step file is refused with the message, nothing written"
	else
		fail "pp=2 step file: $(grep error "$T/err" | head -n 2)"
	fi
fi
finish pipeline
