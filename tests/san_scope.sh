#!/usr/bin/env bash
# tests/san_scope.sh - SAN=1's scope (tests/san-scope.txt, `make san-scope`,
# tests/san_scope.py): the file is well-formed and every case it names
# exists (each suite's LIST=1), and tests/lib.sh applies it: under SAN=1 a
# case marked out does not run and is counted as left to the plain variant,
# never as passed; a case marked in runs, and so does a case the file does
# not name; CASE runs a marked-out case when asked by name; SAN_SCOPE=all
# and the plain variant run every case.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT

if case_on well-formed; then
	if (cd "$ROOT" && BUILD=$BUILD $PY tests/san_scope.py check) >"$T/check" 2>&1; then
		ok "tests/san-scope.txt: $(tail -n 1 "$T/check" | sed 's|^tests/san-scope.txt: ||')"
	else
		sed 's/^/      /' "$T/check" | head -n 20
		fail "tests/san-scope.txt is well-formed and names cases that exist"
	fi
fi

# a suite of three cases (a, b, c), its scope: a in, b out, c not named
if case_on applied; then
	mkdir -p "$T/tests"
	cat >"$T/tests/toy.sh" <<TOY
. "$ROOT/tests/lib.sh"
for c in a b c; do case_on \$c || continue; ok "ran \$c"; done
finish toy
TOY
	printf '# a scope\ntoy in a\ntoy out b\nother out c\n' >"$T/scope"
	toy() { (unset DP_CASE_TIMES DP_COV_DIR; env "$@" SAN_SCOPE="${SCOPE:-$T/scope}" bash "$T/tests/toy.sh" 2>&1); }
	out=$(toy SAN=1 CASE=)
	if [[ $out == *"ran a"* && $out != *"ran b"* && $out == *"ran c"* &&
		$out == *"1 cases left to the plain variant"* && $out == *"toy: 2 passed, 0 failed" ]]; then
		ok "SAN=1: out not run and counted apart, in and unnamed run"
	else
		fail "SAN=1: out not run and counted apart, in and unnamed run: $out"
	fi
	out=$(toy SAN=1 CASE=b)
	[[ $out == *"ran b"* && $out == *"toy: 1 passed"* ]] && ok "SAN=1 CASE=b runs the case marked out" ||
		fail "SAN=1 CASE=b runs the case marked out: $out"
	out=$(SCOPE=all toy SAN=1 CASE=)
	[[ $out == *"toy: 3 passed"* ]] && ok "SAN_SCOPE=all runs every case" || fail "SAN_SCOPE=all: $out"
	out=$(toy SAN=0 CASE=)
	[[ $out == *"toy: 3 passed"* ]] && ok "the plain variant runs every case" || fail "plain: $out"
fi
finish san_scope
