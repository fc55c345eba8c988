#!/usr/bin/env bash
# tests/views.sh - the views pass (passes/views.c): reshape and tp_copy of a
# temporary become views of it, and only where sharing the bytes cannot change
# a result. Each check reads the IR before and after the pass; the numbers
# stay those of the copies: gradcheck on the model below, and tests/tp.sh's
# tp=2 runs against one rank (tp_copy is a view there) are the end-to-end side.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"

# node lines of an op in a dump (value lines have ':' before '=')
nodes() { grep -cE "^%[^ ]+( : [^=]+)? = $1 " "$2"; }
# the view= target of value NAME in a dump, or nothing
view_of() { sed -nE "s/^%${1//./\\.} +: [^ ]+ +act .*view=%([^ +]+)\+0 .*/\1/p" "$2"; }

if case_on reshapes; then
	M=tests/views/reshapes.dp
	"$DPC" "$M" --world-size 1 --dump-after=schedule -o /dev/null >"$T/before.ir" 2>"$T/err" &&
		"$DPC" "$M" --world-size 1 --dump-after=views -o "$T/r.bin" >"$T/after.ir" 2>>"$T/err" ||
		{ fail "dpc $M"; cat "$T/err"; }
	b=$(nodes reshape "$T/before.ir"); a=$(nodes reshape "$T/after.ir")
	if [ "$b" = 8 ] && [ "$a" = 3 ]; then
		ok "reshapes.dp: 8 reshape nodes before the pass (4 forward, 4 backward), 3 after"
	else
		fail "reshapes.dp: reshape nodes $b before, $a after (want 8, 3)"
	fi
	if [ "$(view_of b "$T/after.ir")" = a ] && [ "$(view_of t1 "$T/after.ir")" = b ] &&
		[ "$(view_of t3 "$T/after.ir")" = b ] && [ "$(view_of d.b.1 "$T/after.ir")" = d.t1 ] &&
		[ "$(view_of d.l1.w "$T/after.ir")" = d.t ]; then
		ok "views: %b of %a, %t1 and %t3 of %b; backward %d.b.1 of %d.t1, %d.l1.w of %d.t"
	else
		fail "the aliased reshapes' views"; grep -E "view=%[a-z]" "$T/after.ir" | grep -v "flat\." | sed 's/^/      /'
	fi
	if grep -qE "^%t : [^=]+ = reshape %l1\.w " "$T/after.ir" &&
		grep -qE "^%d\.b : [^=]+ = reshape %d\.h " "$T/after.ir" &&
		grep -qE "^%d\.a : [^=]+ = reshape %d\.b " "$T/after.ir"; then
		ok "copies stay: the reshape of a parameter, into and out of an accumulated gradient"
	else
		fail "the reshapes that must stay copies"; grep -E "= reshape" "$T/after.ir" | sed 's/^/      /'
	fi
	env $MPI_ASAN "$DPEXEC" "$T/r.bin" --check-grads --device cpu >"$T/gc" 2>&1
	if [ $? -eq 0 ] && [ "$(grep -c ' ok$' "$T/gc")" = 2 ]; then
		ok "reshapes.dp: gradcheck passes through the views"
	else
		fail "reshapes.dp gradcheck"; tail -n 4 "$T/gc" | sed 's/^/      /'
	fi
fi

# tp=2: Megatron's f (tp_copy) before every column-split linear is a view
if case_on tp2-tp_copy; then
	gpt_text "$T/gpt.dp"
	sed -i 's/^config {/mesh tp=2, dp_shard=auto\n&/' "$T/gpt.dp"
	"$DPC" "$T/gpt.dp" -D layers=2 --world-size 2 --dump-after=schedule -o /dev/null >"$T/tb.ir" 2>"$T/err" &&
		"$DPC" "$T/gpt.dp" -D layers=2 --world-size 2 --dump-after=memplan -o /dev/null >"$T/ta.ir" 2>>"$T/err" ||
		{ fail "dpc gpt2-tiny tp=2"; cat "$T/err"; }
	b=$(nodes tp_copy "$T/tb.ir"); a=$(nodes tp_copy "$T/ta.ir")
	nv=$(grep -cE "^%[^ ]+\.tp +: [^ ]+ +act .*view=%[^ +]+\+0 @[0-9]+" "$T/ta.ir")
	if [ "$b" -gt 0 ] && [ "$a" = 0 ] && [ "$nv" = "$b" ]; then
		ok "gpt2-tiny tp=2: $b tp_copy nodes before, none after; $nv planned views instead"
	else
		fail "gpt2-tiny tp=2: tp_copy $b before, $a after, $nv views"
	fi
fi
finish views
