#!/usr/bin/env bash
# tests/layers.sh - the compiler's layering, read off the built objects: a
# lower layer never calls a higher one.
#   format/, util/     (the step-file contract; file utilities): use nothing above
#   runtime/           uses format/ and util/ only, never the compiler
#   ir/                (IR, op registry and rules, diagnostics, gradient builder)
#   passes/            may use ir/
#   compiler/scope.c   may use ir/
#   compiler/consts.c  may use scope.c
#   compiler/model.c   may use consts.c, scope.c
#   compiler/lower.c, dpc.c, the parser: anything
# A violation names the object and the symbol it takes from above.
set -u
. "$(dirname "$0")/lib.sh"
B=$ROOT/$BUILD

defs() { nm -g --defined-only "$@" 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u; }
uses() { nm -u "$@" 2>/dev/null | awk '{print $2}' | sort -u; }

# layer NAME "objects below" "objects above"
layer() {
	local name=$1 below=$2 above=$3 bad
	case_on "$name" || return 0
	# shellcheck disable=SC2086
	bad=$(comm -12 <(uses $below) <(defs $above) | tr '\n' ' ')
	if [ -z "$bad" ]; then
		ok "$name"
	else
		fail "$name: uses $bad"
	fi
}

up_compiler="$B/compiler/*.o $B/gen/*.o"
rt_objs=$(find "$B/runtime" -name '*.o' ! -path '*/cuda/*' | tr '\n' ' ')
layer "format/ and util/ use nothing from ir/, passes/, compiler/ or runtime/" \
	"$B/format/*.o $B/util/*.o" "$B/ir/*.o $B/passes/*.o $up_compiler $rt_objs"
layer "runtime/ uses nothing from ir/, passes/ or compiler/" "$rt_objs" \
	"$B/ir/*.o $B/passes/*.o $up_compiler"
layer "ir/ uses nothing from passes/ or compiler/" "$B/ir/*.o" "$B/passes/*.o $up_compiler"
layer "passes/ uses nothing from compiler/" "$B/passes/*.o" "$up_compiler"
layer "compiler/scope.c uses no other front-end file" "$B/compiler/scope.o" \
	"$B/compiler/consts.o $B/compiler/model.o $B/compiler/lower.o"
layer "compiler/consts.c uses only scope.c" "$B/compiler/consts.o" \
	"$B/compiler/model.o $B/compiler/lower.o"
layer "compiler/model.c does not use lower.c" "$B/compiler/model.o" "$B/compiler/lower.o"
finish layers
