#!/usr/bin/env bash
# tests/tour.sh - README.md's tour, run top to bottom as written, in a
# scratch copy of the tracked tree (with this build's dpc, dpexec and dprun
# as build/dpc, build/dpexec and build/dprun): every line succeeds, with the Open MPI
# variables that tests set for themselves unset (as root the mpirun line's
# --allow-run-as-root must be enough), and afterwards the copy's `git
# status` is clean and no file outside build/ was made or changed.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_rmaps_base_oversubscribe
export $MPI_ASAN
# one case: the tour's lines depend on each other
if ! case_on readme-tour; then
	finish tour
	exit $?
fi

tree=$T/tree
mkdir -p "$tree/build"
(cd "$ROOT" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$tree"
cp "$DPC" "$DPEXEC" "$ROOT/$BUILD/dprun" "$tree/build/"
[ -f "$ROOT/$BUILD/libdpcuda.so" ] && cp "$ROOT/$BUILD/libdpcuda.so" "$tree/build/"
g() { git -C "$tree" -c user.name=tour -c user.email=tour@localhost "$@"; }
g init -q && g add -A && g commit -qm tree || fail "a git repository of the scratch copy"
# every file outside build/ and .git/, with its checksum
snapshot() { (cd "$tree" && find . \( -path ./build -o -path ./.git \) -prune -o -type f -print0 |
	sort -z | xargs -0 md5sum); }
snapshot >"$T/before"

# the tour: README.md's first code block after "## A tour"
awk '/^## A tour/ {tour=1; next} tour && /^```/ {n++; if (n == 2) exit; next} tour && n == 1' \
	"$ROOT/README.md" >"$T/tour"
lines=$(grep -cv '^[[:space:]]*#' "$T/tour")
[ "$lines" -ge 5 ] || fail "README.md's tour has $lines commands: not found"
i=0
while IFS= read -r line; do
	case $line in "" | [[:space:]]*"#"*) continue ;; esac
	i=$((i + 1))
	if (cd "$tree" && timeout 600 bash -c "$line" </dev/null) >"$T/line$i.out" 2>&1; then
		ok "tour line $i: ${line%%  #*}"
	else
		fail "tour line $i (exit $?): $line"; sed 's/^/      /' "$T/line$i.out" | tail -n 6
	fi
done <"$T/tour"

snapshot >"$T/after"
if [ -z "$(g status --porcelain)" ] && cmp -s "$T/before" "$T/after"; then
	ok "the tour leaves the tree as it was: git status clean, nothing outside build/ made or changed"
else
	fail "the tour changed the tree"; g status --porcelain | head -n 8
	diff "$T/before" "$T/after" | head -n 8
fi
finish tour
