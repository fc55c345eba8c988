#!/usr/bin/env bash
# tests/stepfile_fuzz.sh - broken step files get an error message, never a crash.
#
# 1. tests/stepfile_fuzz.c (linked with format/stepfile.c, built here with the
#    same sanitizers as the build under test) decodes truncations, byte flips
#    and checksum-fixed mutations in-process: of its built-in step file, and
#    of models/mlp.dp compiled by dpc when dpc works.
# 2. dpexec runs a sample of checksum-fixed mutations that the decoder
#    accepts: each must train or fail with `dpexec: error:` (exit 1), never
#    crash, hang or exit otherwise.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"

CFLAGS="-std=c11 -D_GNU_SOURCE -Wall -Wextra -O1 -g"
[ "${SAN:-0}" = 1 ] && CFLAGS="$CFLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
build() { # the fuzzer, which every case runs
	if gcc $CFLAGS -Iformat -Iutil tests/stepfile_fuzz.c format/stepfile.c format/stepfile_check.c format/settings.c util/outfile.c -lz -lm \
		-o "$T/fuzz" 2>"$T/cc.err"; then
		ok "build stepfile_fuzz"
	else
		fail "build stepfile_fuzz"; sed 's/^/      /' "$T/cc.err"
		finish stepfile
		exit 1
	fi
}

run_fuzz() { # run_fuzz NAME [FILE]
	local name=$1; shift
	if "$T/fuzz" "$@" >"$T/fuzz.out" 2>&1; then
		ok "$name: $(tail -n 1 "$T/fuzz.out" | sed 's/stepfile_fuzz: //')"
	else
		fail "$name"; sed 's/^/      /' "$T/fuzz.out" | tail -n 20
	fi
}
if case_on decoder-builtin; then
	once build build
	run_fuzz "decoder fuzz, built-in step file"
fi
if ! case_on decoder-mlp; then
	:
elif once build build; [ -x "$DPC" ] && "$DPC" models/mlp.dp -o "$T/mlp.bin" --world-size 2 >"$T/dpc.out" 2>&1; then
	run_fuzz "decoder fuzz, models/mlp.dp" "$T/mlp.bin"
else
	echo "  skip decoder fuzz of models/mlp.dp (dpc missing or failing)"
fi

# dpexec on accepted mutations (they start four at a time: a run is mostly
# MPI_Init's wait, not work), each in a directory of its own under $T
N=${FUZZ_EXEC:-40}
mkdir -p "$T/em"
# run FILE: dpexec on it; its status in FILE.rc. Each in a directory of its
# own: a mutation that sets save_every writes checkpoints/ where it runs (the
# tree's root, before), and four at once must not share one
run() {
	mkdir -p "$1.d"
	(cd "$1.d" && env $MPI_ASAN timeout 60 "$DPEXEC" "$1" --steps 2 --quiet) >"$1.out" 2>&1
	echo $? >"$1.rc"
}
if ! case_on dpexec-mutations; then
	:
elif once build build; "$T/fuzz" --emit "$T/em" "$N"; then
	ok "emit $N accepted mutations"
	bad=0
	for f in "$T"/em/m*.bin; do
		par 4 run "$f"
	done
	wait
	for f in "$T"/em/m*.bin; do
		rc=$(cat "$f.rc")
		if [ $rc -eq 0 ] || { [ $rc -eq 1 ] && unstamp "$f.out" | grep -q "^dpexec: error: "; }; then
			:
		else
			bad=$((bad + 1))
			echo "      $(basename "$f"): exit $rc"; sed 's/^/        /' "$f.out" | tail -n 5
		fi
	done
	check "dpexec on $N mutated step files: trains or fails cleanly ($bad bad)" [ $bad -eq 0 ]
	(cd "$T/em" && env $MPI_ASAN timeout 60 "$DPEXEC" "$T/em/valid.bin" --steps 2 --quiet) >"$T/valid.out" 2>&1
	check "dpexec runs the unmutated built-in step file" [ $? -eq 0 ]
else
	fail "emit mutations"
fi
finish stepfile
