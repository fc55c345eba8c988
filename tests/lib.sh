# tests/lib.sh - shared helpers for the shell test suites (sourced, not run).
#
# Each suite counts its checks with ok/fail/skip and ends with `finish NAME`,
# which prints "NAME: N passed, M failed" (", K skipped" when some were) and
# returns non-zero on any failure. A skipped check is never a passed one.
#
# Cases. A suite's checks belong to named cases, and a case is named before
# its work starts: `case_on NAME || return` at the top of a case's function,
# `case_on NAME || continue` in a loop, `if case_on NAME; then ... fi` around
# straight-line code, and `if ! case_on NAME; then :; elif CHECK; then ok ...;
# else fail ...; fi` where a case is one check's if-chain (a check that runs
# in the background is checked later under `case_ran NAME`, which names the
# case again without counting it). The environment's CASE selects cases (tests/run.sh,
# `make test SUITE=x CASE=y`): a shell glob matched against the whole name
# (extended globs too: CASE='@(a|b)'), or, without glob characters (* ? [
# or a group's @( !( +( ), any name that contains it; empty or
# unset, every case. DP_LIST=1 prints each case's name instead of running it.
# What several cases need (a reference run they compare with) is run through
# `once KEY COMMAND...` from each of them, so it runs when, and only when, a
# case that needs it runs. Every FAIL line is followed by the command that
# reproduces it: `make test SUITE=... CASE='...'` for the case it is in, and
# the exact command where the case sets REPRO (one that does not depend on
# the suite's scratch directory, which is gone when the suite ends).

BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DPC=${DPC:-$ROOT/$BUILD/dpc}
DPEXEC=${DPEXEC:-$ROOT/$BUILD/dpexec}
PY=/usr/bin/python3
# have_torch: is python3-torch installed? Asked of the module finder, not by
# importing it: `import torch` alone costs ~1.6 CPU-s, and a suite's torch
# runs still fail loudly if the installed one cannot be imported.
have_torch() { $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; }
# torch_job JOBFILE LOG SCRIPT ARGS...: queue `$PY SCRIPT ARGS... >LOG 2>&1` in
# JOBFILE; `$PY tests/torch_jobs.py JOBFILE` then runs the queue in one
# process (one import of torch), each job's exit status in LOG.rc
torch_job() { local f=$1; shift; printf '%q ' "$@" >>"$f"; echo >>"$f"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# A rank waiting in MPI yields its CPU instead of polling flat out: the
# suites run 2 to 8 ranks per run on 2 cores beside other suites, and a
# spinning rank takes the CPU the rank it waits for needs (a 4-rank mlp8
# run of 20 steps: 1.27 CPU-s polling, 0.50 yielding, the same losses bit
# for bit; Open MPI decides this by the slots it knows of, and with
# --oversubscribe it knows of none). What a rank computes is unchanged.
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
# And dpexec's own waits (runtime/world.c: every collective's) sleep at once
# instead of polling with sched_yield for 20 ms first: on cores that the
# rank it waits for shares with it and with other suites, the yielding
# rank is scheduled again and again, and its polls were a fifth of the CPU
# of the suites (system time, in sched_yield). tests/faults/tiny.dp on 2
# ranks, 100 steps at a load of ~17: 1.48-1.55 CPU-s polling first (0.62
# user + 0.82-0.93 system), 0.51-0.60 without, the same losses bit for bit.
# faults.sh's stopped-rank case runs with the default, which the others
# leave untested.
export DP_WAIT_SPIN_MS=${DP_WAIT_SPIN_MS:-0}
# Open MPI's own allocations are not ours to fix: no leak checking inside
# MPI processes; dpc keeps full leak checking. A huge allocation (a mutated
# step file asking for terabytes) returns NULL, so dpexec reports it as it
# would without ASan.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
MPI_ASAN="ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1"
# fuzz_budget N: a fuzzer's budget (mutants, seconds). N, except in the plain
# variant of a queue that runs the SAN=1 variant too (make test-all, .ci/run:
# tests/run.sh sets DP_SAN_TOO): there the same fuzzer runs with the same
# seeds under ASan/UBSan, which see every crash the plain build would and
# the memory errors it would not, so the plain run is a fifth of N, a smoke
# run of its build. `make test` alone, either variant, fuzzes N.
fuzz_budget() {
	if [ "${SAN:-0}" != 1 ] && [ "${DP_SAN_TOO:-0}" = 1 ]; then
		echo $((($1 + 4) / 5))
	else
		echo "$1"
	fi
}

npass=0
nfail=0
nskip=0
ok() { npass=$((npass + 1)); echo "  ok   $*"; }
fail() {
	nfail=$((nfail + 1)) && echo "  FAIL $*" && repro_lines
	# (the coverage run: a case that failed is measured wrong, and stays in SAN=1's set)
	[ -z "${DP_COV_DIR:-}" ] || printf '%s\n' "$CASE_NAME" >>"$DP_COV_DIR/$SUITE.failed"
}
skip() { nskip=$((nskip + 1)); echo "  SKIP $*"; }
check() { # check DESCRIPTION COMMAND...: ok when the command succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else fail "$d"; fi
}
finish() {
	lane_drain
	case_clock ""
	if [ -n "${CASE:-}" ] && [ "${DP_LIST:-0}" != 1 ]; then
		echo "  (CASE='$CASE': $ncase_on of $((ncase_on + ncase_off)) cases run)"
	fi
	[ "$ncase_plain" = 0 ] ||
		echo "  (SAN=1: $ncase_plain cases left to the plain variant: tests/san-scope.txt, chosen by coverage)"
	if [ "$nskip" -gt 0 ]; then
		echo "$1: $npass passed, $nfail failed, $nskip skipped"
	else
		echo "$1: $npass passed, $nfail failed"
	fi
	[ "$nfail" -eq 0 ]
}

# ---- cases (the header says how suites use them) ----
SUITE=$(basename "$0" .sh) # the suite's name in tests/run.sh and SUITE=
CASE_NAME=""               # the case running now ("": the suite's set-up)
REPRO=""                   # the exact command of this case's check, if any
ncase_on=0
ncase_off=0
# case_match NAME: NAME is selected by $CASE: a glob (* ? [, or an extended
# glob's group: @(a|b), !(x), +(..), *(..), ?(..)) matched against the whole
# name, else a substring of it
case_match() {
	local pat=${CASE:-}
	[ -z "$pat" ] && return 0
	# shellcheck disable=SC2053 # (the pattern is a glob)
	case $pat in
	*[*?[]* | *[@!+]\(*) [[ $1 == $pat ]] ;;
	*) [[ $1 == *"$pat"* ]] ;;
	esac
}
# case_clock: with DP_CASE_TIMES set (tests/run.sh sets it to
# $LOGS/SUITE.cases), the case that ran since the last case_on, as "WALL
# CPU NAME" (seconds; CPU: what this shell and the processes it waited for
# used, bash's `times`; a case whose runs were started in the background is
# charged to the case during which they were waited for; "-": the work
# outside the selected cases, the suite's set-up included)
case_t0=$EPOCHREALTIME case_c0=0 case_timed=-
case_clock() {
	[ -n "${DP_CASE_TIMES:-}" ] || return 0
	local t=$EPOCHREALTIME c
	times >"$DP_CASE_TIMES.t" # (in this shell: a subshell's children are not its)
	c=$(awk -f "$ROOT/tests/times.awk" "$DP_CASE_TIMES.t")
	awk -v a="$case_t0" -v b="$t" -v c="$case_c0" -v d="$c" -v n="$case_timed" \
		'BEGIN { printf "%6.1f %6.1f %s\n", b - a, d - c, n }' >>"$DP_CASE_TIMES"
	case_t0=$t case_c0=$c case_timed=${1:--}
}
# plain_only NAME: under SAN=1 with no CASE given, tests/san-scope.txt
# (`make san-scope`, tests/san_scope.py: chosen by coverage) marks case NAME
# of this suite "out": the cases it marks "in" execute every line it leaves
# out, under the sanitizers. A case it does not name (newer than the file)
# runs; SAN_SCOPE=all runs every case, SAN_SCOPE=FILE reads another file; a
# CASE that names it runs it anyway.
ncase_plain=0
declare -A SAN_OUT
if [ "${SAN:-0}" = 1 ] && [ -z "${CASE:-}" ] && [ "${SAN_SCOPE:-}" != all ] &&
	[ -f "${SAN_SCOPE:-$ROOT/tests/san-scope.txt}" ]; then
	while read -r s v name; do
		[ "$s" = "$SUITE" ] && [ "$v" = out ] && SAN_OUT["$name"]=1
	done <"${SAN_SCOPE:-$ROOT/tests/san-scope.txt}"
fi
plain_only() { [ -n "${SAN_OUT["$1"]+set}" ]; }
# cov_dir NAME: with DP_COV_DIR set (`make san-scope`'s coverage run, in
# build-cov/), the gcc counters (.gcda) of the processes started from now on
# go under a directory of case NAME's own ("": the suite's set-up), named by
# its number; DP_COV_DIR/SUITE/cases lists "NUMBER<TAB>NAME" (gcc's
# GCOV_PREFIX, read by each process as it exits: a process inherits it)
declare -A COV_NUM
cov_dir() {
	[ -n "${DP_COV_DIR:-}" ] || return 0
	local d=$DP_COV_DIR/$SUITE n=setup
	if [ -n "$1" ]; then
		if [ -z "${COV_NUM[$1]+set}" ]; then
			mkdir -p "$d"
			COV_NUM[$1]=$(($(cat "$d/cases" 2>/dev/null | wc -l) + 1))
			printf '%s\t%s\n' "${COV_NUM[$1]}" "$1" >>"$d/cases"
		fi
		n=c${COV_NUM[$1]}
	fi
	export GCOV_PREFIX=$d/$n GCOV_PREFIX_STRIP=$(($(tr -cd / <<<"$ROOT" | wc -c)))
}
cov_dir ""
# case_on NAME: start case NAME; non-zero when CASE leaves it out (or DP_LIST=1)
case_on() {
	CASE_NAME=$1 REPRO=""
	if [ "${DP_LIST:-0}" = 1 ]; then
		echo "  case $1"
		return 1
	fi
	if case_match "$1" && ! plain_only "$1"; then cov_dir "$1"; else cov_dir ""; fi
	if plain_only "$1"; then
		ncase_plain=$((ncase_plain + 1))
		case_clock ""
		return 1
	fi
	if case_match "$1"; then
		ncase_on=$((ncase_on + 1))
		case_clock "$1"
		return 0
	fi
	ncase_off=$((ncase_off + 1))
	case_clock ""
	return 1
}
# case_ran NAME: NAME (started earlier by case_on) is selected and running:
# for a check after a case's own function returned (its CASE_NAME again)
case_ran() {
	CASE_NAME=$1 REPRO=""
	[ "${DP_LIST:-0}" != 1 ] && ! plain_only "$1" && case_match "$1" && cov_dir "$1"
}
# repro_lines: how to run the current case again (after a FAIL line)
repro_lines() {
	local c="make test SUITE=$SUITE" name=$CASE_NAME
	[ "${SAN:-0}" = 1 ] && c="$c SAN=1"
	if [ -n "$name" ]; then
		# a name with glob characters: escape them (an exact match); quote for the shell
		case $name in *[*?[]*) name=$(printf '%s' "$name" | sed 's/[][*?]/\\&/g') ;; esac
		c="$c CASE='${name//\'/\'\\\'\'}'"
	fi
	echo "    repro: $c"
	[ -z "$REPRO" ] || echo "    or:    $REPRO"
}
# once KEY COMMAND...: COMMAND the first time KEY is asked for; later calls
# return its first status (a prerequisite shared by cases)
declare -A ONCE_RC
once() {
	local k=$1
	shift
	if [ -z "${ONCE_RC[$k]+set}" ]; then
		"$@"
		ONCE_RC[$k]=$?
	fi
	return "${ONCE_RC[$k]}"
}
# par N COMMAND...: COMMAND in the background once fewer than N are running;
# `wait` then waits for all. For independent runs that a case starts
# together and checks afterwards, in order (COMMAND must not count checks:
# a background shell's ok/fail are lost).
par() {
	local n=$1
	shift
	while [ "$(jobs -pr | wc -l)" -ge "$n" ]; do wait -n; done
	"$@" &
}
# ---- lanes: a suite's independent cases side by side ----
# lane FUNC ARGS...: FUNC ARGS (one case's runs and checks, after its
# case_on) in a background shell, once fewer than DP_LANES lanes run. Its
# output goes to a file, printed in the order the lanes started once it and
# every lane before it have ended (lane_flush, at each lane call;
# lane_drain waits for them all), so the log reads as a serial run's; its
# ok/FAIL/SKIP are counted then, from the counts the background shell
# leaves. FUNC must write only files of its own and count only through
# ok/fail/skip (what else it sets is lost: the suite reads a lane's results
# from its files, after lane_drain); its stdin is /dev/null. In
# DP_CASE_TIMES a laned case has two rows: its set-up here, then its lane's
# own wall and CPU seconds (CASE_NAME's at the call).
# DP_LANES unset or 1 (`make test SUITE=x` on one CPU, JOBS=0): FUNC runs
# here, as a plain call. tests/run.sh sets DP_JOBS, the CPUs a suite may
# keep busy; a suite sets DP_LANES from it (tests/cuda_emu.sh). Why lanes:
# the emulator's cases each run the CPU's reference and the emulated
# backend one after the other, waiting on MPI start-up and stalled ranks
# between, at ~half a CPU (cuda_emu: 410 s for 205 CPU-s in the CI of
# 2026-11-28, its longest suite).
LANE_DIR="" lane_seq=0
lane_q=()  # the lanes not yet printed, in start order: "ID:PID"
lane() {
	if [ "${DP_LANES:-1}" -le 1 ] || [ "${DP_LIST:-0}" = 1 ]; then
		"$@"
		return
	fi
	if [ -z "$LANE_DIR" ]; then
		LANE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dplane.XXXXXX") || { "$@"; return; }
	fi
	# (the case's set-up here is its row; the wait for a lane and the time
	# until the next case_on are the main shell's, "-")
	case_clock ""
	lane_wait "$DP_LANES"
	local id=$lane_seq
	lane_seq=$((lane_seq + 1))
	(
		npass=0 nfail=0 nskip=0
		t0=$EPOCHREALTIME
		# (Open MPI's session directories apart from the other lanes':
		# tests/run.sh's run_suite says why)
		mkdir -p "$LANE_DIR/$id.ompi" && export OMPI_MCA_orte_tmpdir_base=$LANE_DIR/$id.ompi
		"$@"
		times >"$LANE_DIR/$id.t"
		c=$(awk -f "$ROOT/tests/times.awk" "$LANE_DIR/$id.t")
		[ -z "${DP_CASE_TIMES:-}" ] ||
			awk -v a="$t0" -v b="$EPOCHREALTIME" -v c="$c" -v n="${CASE_NAME:--}" \
				'BEGIN { printf "%6.1f %6.1f %s\n", b - a, c, n }' >>"$DP_CASE_TIMES"
		echo "$npass $nfail $nskip $c" >"$LANE_DIR/$id.n.t" && mv "$LANE_DIR/$id.n.t" "$LANE_DIR/$id.n"
	) </dev/null >"$LANE_DIR/$id.out" 2>&1 &
	lane_q+=("$id:$!")
}
# lane_wait N: until fewer than N lanes run (printing those that ended)
lane_wait() {
	local e pids
	while :; do
		lane_flush
		pids=()
		for e in "${lane_q[@]}"; do [ -e "$LANE_DIR/${e%%:*}.n" ] || pids+=("${e#*:}"); done
		[ ${#pids[@]} -ge "$1" ] || return 0
		wait -n "${pids[@]}" 2>/dev/null
		# a lane that died before leaving its counts: a failure of its own
		for e in "${lane_q[@]}"; do
			[ -e "$LANE_DIR/${e%%:*}.n" ] || kill -0 "${e#*:}" 2>/dev/null ||
				{ echo "  FAIL a lane ended without its counts (its output: above)" >>"$LANE_DIR/${e%%:*}.out"
				  echo "0 1 0 0" >"$LANE_DIR/${e%%:*}.n"; }
		done
	done
}
# lane_flush: print and count the lanes that ended, in start order, up to
# the first still running
lane_flush() {
	local e id p f s c
	while [ ${#lane_q[@]} -gt 0 ]; do
		e=${lane_q[0]} id=${lane_q[0]%%:*}
		[ -e "$LANE_DIR/$id.n" ] || return 0
		wait "${e#*:}" 2>/dev/null
		cat "$LANE_DIR/$id.out"
		read -r p f s c <"$LANE_DIR/$id.n"
		npass=$((npass + p)) nfail=$((nfail + f)) nskip=$((nskip + s))
		# (its CPU is in this shell's `times` now: not the next case's too)
		case_c0=$(awk -v a="$case_c0" -v b="${c:-0}" 'BEGIN { printf "%.3f", a + b }')
		rm -rf "$LANE_DIR/$id".*
		lane_q=("${lane_q[@]:1}")
	done
}
# lane_drain: wait for every lane and print them
lane_drain() {
	[ ${#lane_q[@]} = 0 ] || { lane_wait 1; lane_flush; }
	[ -z "$LANE_DIR" ] || rm -rf "$LANE_DIR"
	LANE_DIR=""
}
# mpi N ARGS...: dpexec on N ranks (oversubscribed: this machine has 2 cores).
# One rank is dpexec alone (MPI's singleton start, as README's `dpexec
# step.bin`), not under mpirun: the same program, without mpirun's start-up
# (~0.7 s a run) and its 2 s wait (odls_base_sigkill_timeout) after a rank
# that exits non-zero, which most of durability.sh's damaged-checkpoint runs
# do. `mpirun -np 1` itself stays checked: runtime_errors.sh's world-size
# checks and durability.sh's save-fails-one-rank start one rank under it.
mpi() {
	local n=$1; shift
	if [ "$n" = 1 ]; then
		env $MPI_ASAN timeout 300 "$DPEXEC" "$@"
		return
	fi
	env $MPI_ASAN timeout 300 mpirun --oversubscribe -np "$n" "$DPEXEC" "$@"
}
# wait_lines FILE N: wait (up to 30 s) until FILE has N lines; 0 when it has
wait_lines() {
	local j
	for j in $(seq 600); do [ "$(cat "$1" 2>/dev/null | wc -l)" -ge "$2" ] && return 0; sleep 0.05; done
	return 1
}
tmpdir() { mktemp -d "${TMPDIR:-/tmp}/dptest.XXXXXX"; }
# same_run A B: the runs whose --losses and --save-full files are A.loss,
# A.st and B.loss, B.st gave the same losses and parameters, bit for bit
same_run() { cmp -s "$1.loss" "$2.loss" && cmp -s "$1.st" "$2.st"; }
# now: the clock in seconds, with nanoseconds (for took-so-long checks)
now() { date +%s.%N; }
# gone PID: no such process, or only its zombie (its parent has not reaped it yet)
gone() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null | tr -d " "); [ -z "$st" ] || [ "${st#Z}" != "$st" ]; }
# all_gone PIDS...: wait (up to 10 s) until every one is gone; 0 when they are
all_gone() {
	local p j left
	for j in $(seq 100); do
		left=0
		for p in "$@"; do gone "$p" || left=1; done
		[ $left = 0 ] && return 0
		sleep 0.1
	done
	return 1
}
# signal_at NAME LINES SIGNAL TARGET COMMAND...: COMMAND (a launcher: mpirun,
# dprun) in a session of its own, output in $T/NAME.out; once $T/NAME.loss
# has LINES lines, SIGNAL goes to it (TARGET pid) or to its whole process
# group (pgrp: what a terminal's Ctrl-C does); $T/NAME.out then ends with
# rc=STATUS. Not through mpi(): timeout(1) between would take the signal.
signal_at() {
	local name=$1 lines=$2 sig=$3 target=$4 job pid
	shift 4
	setsid bash -c 'echo $$ >"$0"; exec "$@"' "$T/$name.pid" "$@" >"$T/$name.out" 2>&1 &
	job=$!
	wait_lines "$T/$name.loss" "$lines"
	pid=$(cat "$T/$name.pid")
	if [ "$target" = pgrp ]; then kill -"$sig" -- -"$pid"; else kill -"$sig" "$pid"; fi
	wait $job
	echo "rc=$?" >>"$T/$name.out"
}
# expect NAME WANT_SUBSTRING COMMAND...: the command exits non-zero (not by
# `timeout`: 124 and up) with WANT_SUBSTRING in its output ($T/out)
expect() {
	local name=$1 want=$2; shift 2
	"$@" >"$T/out" 2>&1
	local rc=$?
	if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -qF -- "$want" "$T/out"; then
		ok "$name"
	else
		fail "$name (exit $rc, wanted '$want')"; sed 's/^/      /' "$T/out" | head -n 8
	fi
}

# The train settings tests/transformer.sh and tests/bf16.sh write into a
# transformer's copy (global batch, optimizer, schedule), and the same as
# tests/torch_gpt.py's options: lr 2e-3 with a 5-step warmup takes the tiny
# models from 5.54 to ~3.3 nats per token in 20 steps, away from instability.
# The models' own `no_decay vectors` stays in their copies: --no-decay vectors.
GB=8
OPT="optimizer adamw(lr=2e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)"
SCHED="schedule cosine(warmup=5, steps=40, min_lr=2e-4)"
TORCH_OPT="--lr 2e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1 --no-decay vectors --clip 1
	--schedule cosine --warmup 5 --sched-steps 40 --min-lr 2e-4 --global-batch $GB --seed 1234"

# text_shard: byte-level token shards of the GPL-3 text Debian ships in
# $T/text.bin and $T/val.bin, and $data, a sed script pointing a transformer
# model's data paths (build/data/fortunes*.bin) at them
text_shard() {
	"$ROOT/$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
		/usr/share/common-licenses/GPL-3 >"$T/shard.log" 2>&1 ||
		{ cat "$T/shard.log"; fail "text2shard"; }
	data='s|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|'
}

# ---- equivalence runs (tests/sharding.sh, tests/tp.sh): the caller sets $T
# (a scratch directory) and $STEPS ----

# eq_run NAME NP DPFILE [dpexec args...]: compile for NP ranks and run STEPS
# steps, writing $T/NAME.loss (--losses) and $T/NAME.st (--save-full)
eq_run() {
	local name=$1 np=$2 src=$3; shift 3
	"$DPC" "$src" --world-size "$np" -o "$T/$name.bin" 2>"$T/$name.log" ||
		{ cat "$T/$name.log"; fail "$name: dpc"; return 1; }
	mpi "$np" "$T/$name.bin" --steps "$STEPS" --quiet --losses "$T/$name.loss" \
		--save-full "$T/$name.st" --eval-every 0 "$@" >"$T/$name.log" 2>&1 ||
		{ tail -n 20 "$T/$name.log"; fail "$name: dpexec on $np ranks"; return 1; }
}
# eq_same NAME REF: losses (rtol 1e-5) and final parameters (atol 1e-6 +
# rtol 1e-4) of two eq_runs agree; the suites' headers say why these bounds
eq_same() {
	if [ ! -s "$T/$1.loss" ] || [ ! -s "$T/$2.loss" ]; then
		fail "$1 matches $2 (a run is missing)"; return
	fi
	if $PY tests/compare.py losses "$T/$1.loss" "$T/$2.loss" --rtol 1e-5 --atol 0 \
		--and params "$T/$1.st" "$T/$2.st" --rtol 1e-4 --atol 1e-6 >"$T/$1.cmp"; then
		ok "$1 matches $2 ($(awk '/ loss:/ {l = $8} / max abs diff/ && !/ loss:/ {if ($5 + 0 > p) p = $5 + 0}
			END {printf "losses rel %s, params abs %.1e", l, p}' "$T/$1.cmp"))"
	else
		cat "$T/$1.cmp"
		fail "$1 matches $2"
	fi
}
# half_same PREC NAME REF INIT [LOSS-RTOL UPDATE-RTOL]: two eq_runs in PREC
# (bf16, fp16) agree by tests/bf16.sh's derived bounds (its header says
# why; fp16.sh's gives its own loss bound): losses rtol 2^-11 unless given,
# and the whole training update from INIT (a --save-full of the initial
# weights), |(A - init) - (B - init)| / |B - init|, rtol 2^-6. Not element
# by element: in 16 bits an f32 reordering (a sum over ranks, stages or
# micro-batches) flips roundings, and AdamW moves an element whose gradient
# is ~0 by ~lr whatever its sign.
half_same() {
	local p=$1 ltol=${5:-4.8828125e-4} urtol=${6:-0.015625}
	shift
	if [ ! -s "$T/$1.loss" ] || [ ! -s "$T/$2.loss" ] || [ ! -s "$3" ]; then
		fail "$1 matches $2 in $p (a run is missing)"; return
	fi
	if $PY tests/compare.py losses "$T/$1.loss" "$T/$2.loss" --rtol "$ltol" --atol 0 >"$T/$1.cmp" &&
		$PY tests/compare.py updates "$3" "$T/$1.st" "$T/$2.st" --rtol "$urtol" \
			>>"$T/$1.cmp"; then
		ok "$1 matches $2 in $p ($(awk '/ loss:/ {l = $8} / updates:/ {u = $4}
			END {printf "losses rel %s, updates rel %s", l, u}' "$T/$1.cmp"))"
	else
		cat "$T/$1.cmp"
		fail "$1 matches $2 in $p"
	fi
}
# variant SRC DST SED-SCRIPT...: a copy of SRC edited by sed, which must change it
variant() {
	local src=$1 dst=$2 s a=()
	shift 2
	for s in "$@"; do a+=(-e "$s"); done
	sed "${a[@]}" "$src" >"$dst"
	if cmp -s "$src" "$dst"; then fail "sed $* did not change $src"; fi
}
# scalar_variant SRC DST: gpt2-tiny SRC with scalar operands (scale and
# add_scalar in the MLP, a mul of the attention output); a FAIL where the
# model's lines moved (tests/tp.sh, cp.sh, cuda_emu.sh)
scalar_variant() {
	variant "$1" "$2" \
		's/gelu(linear(layernorm(x, ln2g, ln2b), wfc, bfc))/gelu(add(scale(linear(layernorm(x, ln2g, ln2b), wfc, bfc), 2), -0.1))/' \
		's/linear(attention(\(.*\)), wo, bo)/mul(0.5, linear(attention(\1), wo, bo))/'
	grep -q 'add(scale(linear' "$2" && grep -q 'mul(0.5, linear(attention' "$2" ||
		fail "the scalar variant of gpt2-tiny"
}
# dropout_variant SRC DST: gpt2-tiny SRC with dropout(p=0.1) on the
# embeddings and both residual branches; a FAIL unless all three are in
# (tests/dropout.sh, cuda_emu.sh)
dropout_variant() {
	variant "$1" "$2" \
		's/^    x = add(embedding(ids, wte), wpe)/    x = dropout(add(embedding(ids, wte), wpe), p=0.1)/' \
		's/^      x = add(x, linear(attention(\(.*\)), wo, bo))$/      x = add(x, dropout(linear(attention(\1), wo, bo), p=0.1))/' \
		's/^      x = add(x, linear(gelu(\(.*\)), wproj, bproj))$/      x = add(x, dropout(linear(gelu(\1), wproj, bproj), p=0.1))/'
	[ "$(grep -c 'dropout(' "$2")" = 3 ] || fail "three dropouts in the variant of gpt2-tiny"
}
# mixed SRC DST [STRATEGY]: SRC (an MLP with blocks fc1, fc2, fc3 ... head and
# train's `strategy ddp`) with per-block strategies: train's STRATEGY
# (full_shard), fc1 ddp, fc2 zero1, head zero2, and fc3 (train's strategy)
# with its own reshard_after_forward false
mixed() {
	variant "$1" "$2" "s/^  strategy ddp/  strategy ${3:-full_shard}/" \
		's/^  block fc1 {/&\n    strategy ddp/' 's/^  block fc2 {/&\n    strategy zero1/' \
		's/^  block fc3 {/&\n    reshard_after_forward false/' \
		's/^  block head {/&\n    strategy zero2/'
	[ "$(grep -c '^    strategy \|^    reshard_after_forward' "$2")" = 4 ] ||
		fail "mixed: the four block settings are not all in $2"
}

# mlp_raw DST: models/mlp.dp reading uncompressed copies of its four
# Fashion-MNIST files (made once per suite in $T/fashion-mnist): the same
# bytes through the same reader (zlib reads a file that is not gzip as it
# is), so the same losses bit for bit, for the suites whose mlp.dp runs
# check strategies, offload or compression, not gzip. Every rank of a run
# decompresses the 26 MB of training images itself: 0.74 CPU-s of a 1-rank
# 15-step run against 0.35 from the copies (measured at a load of ~30);
# tests/data_test.c, the tour and the suites that run models/mlp.dp as it
# is keep the gzip path covered.
FMNIST=/usr/share/datasets/fashion-mnist
mlp_raw() {
	local d=$T/fashion-mnist f
	if [ "${DP_LIST:-0}" != 1 ]; then
		mkdir -p "$d" || return 1
		for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
			[ -s "$d/$f" ] || gzip -dc "$FMNIST/$f.gz" >"$d/$f" ||
				{ fail "mlp_raw: gzip -dc $FMNIST/$f.gz (dataset-fashion-mnist: make deps)"; return 1; }
		done
	fi
	variant "$ROOT/models/mlp.dp" "$1" 's|"'"$FMNIST"'/\([a-z0-9-]*\)\.gz"|"'"$d"'/\1"|'
	[ "$(grep -c "from idx(\"$d/" "$1")" = 4 ] || fail "mlp_raw: the four data paths of models/mlp.dp in $1"
}

# gpt_text DST: models/gpt2-tiny.dp reading byte-level shards of the GPL-3
# text Debian ships ($T/text.bin, $T/val.bin, made here)
gpt_text() {
	"$ROOT/$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
		/usr/share/common-licenses/GPL-3 >"$T/shard.log" 2>&1 || { cat "$T/shard.log"; fail "text2shard"; }
	variant "$ROOT/models/gpt2-tiny.dp" "$1" \
		's|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|'
}

# ---- the CUDA emulator suites (tests/cuda_emu.sh, cuda_emu_mutations.sh) ----

# emu_start SUITE: builds what they need (make all cuda-emu); with SAN=1 the
# suite is one SKIP (the emulator's fibers switch stacks under ASan's feet,
# and the emulated build is never sanitized). Non-zero: finish now.
emu_start() {
	export OPENBLAS_NUM_THREADS=1 # the same summation order in both backends, and no spinning
	[ "${DP_LIST:-0}" = 1 ] && return 0
	if [ "${SAN:-0}" = 1 ]; then
		skip "$1 (SAN=1: the CUDA emulator is not ASan-clean; run it without SAN)"
		return 1
	fi
	if ! make -s -C "$ROOT" all cuda-emu >"$T/build.log" 2>&1; then
		tail -n 30 "$T/build.log"
		fail "make cuda-emu"
		return 1
	fi
}

# precision_copy PREC SRC DST [STRATEGY [MESH]]: SRC in PREC (bf16, fp16) on
# the test's shards ($data, text_shard's) and transformer.sh's train settings
# (GB, OPT, SCHED above), strategy STRATEGY (ddp), MESH its mesh line
precision_copy() {
	local prec=$1 st=${4:-ddp} mesh=${5:-}
	{ [ -z "$mesh" ] || echo "$mesh"; grep -v '^mesh ' "$2"; } | sed -e "$data" \
		-e "s/^  optimizer .*/  $OPT/" -e "s/^  schedule .*/  $SCHED/" \
		-e "s/^  global_batch .*/  global_batch $GB/" -e "s/^  grad_accum .*//" \
		-e "s/^  clip_grad_norm .*/  clip_grad_norm 1.0/" -e "s/^  seed .*/  seed 1234/" \
		-e "s/^  strategy .*/  strategy $st\n  precision $prec/" >"$3"
	grep -q "^  precision $prec" "$3" || fail "copy of $2"
}

# rel_sum A B: the sum over steps of |A - B| / |B| of two loss files
# (dpexec's start with a '#' header)
rel_sum() {
	paste <(grep -v '^#' "$1") <(grep -v '^#' "$2") |
		awk '{d = $2 - $NF; if (d < 0) d = -d; s += d / ($NF < 0 ? -$NF : $NF)} END {printf "%.3e", s}'
}

# precision_runs PREC NAME KIND SRC "TORCH-PRECS" DPC-ARGS... -- TORCH-ARGS...:
# SRC in PREC (precision_copy) compiled as $T/NAME.bin, its initial weights
# saved ($T/NAME.init.st) and its STEPS losses from them ($T/NAME.dp.txt);
# then tests/torch_gpt.py (KIND, 4 heads) from the same weights at each of
# TORCH-PRECS ($T/NAME.torch.PREC), all in one process (tests/torch_jobs.py:
# one import of torch, ~1.6 CPU-s, not one per precision; its log
# $T/NAME.torch.PREC.log). 1 (after a fail) when a run fails.
precision_runs() {
	local prec=$1 name=$2 kind=$3 src=$4 prs=$5; shift 5
	local dpc_args=()
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do dpc_args+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	precision_copy "$prec" "$src" "$T/$name.dp"
	"$DPC" "$T/$name.dp" "${dpc_args[@]}" -o "$T/$name.bin" 2>"$T/$name.log" ||
		{ cat "$T/$name.log"; fail "$name: dpc"; return 1; }
	mpi 1 "$T/$name.bin" --steps 0 --eval-every 0 --quiet --save-full "$T/$name.init.st" \
		>"$T/$name.log" 2>&1 &&
	mpi 1 "$T/$name.bin" --steps $STEPS --eval-every 0 --quiet --init-from "$T/$name.init.st" \
		--losses "$T/$name.dp.txt" >>"$T/$name.log" 2>&1 ||
		{ tail -n 20 "$T/$name.log"; fail "$name: dpexec"; return 1; }
	local pr jobs=$T/$name.torch.jobs
	rm -f "$jobs"
	for pr in $prs; do
		# shellcheck disable=SC2086
		torch_job "$jobs" "$T/$name.torch.$pr.log" tests/torch_gpt.py --model "$kind" --heads 4 \
			--init "$T/$name.init.st" --data "$T/text.bin" --steps $STEPS --threads 1 $TORCH_OPT \
			--precision $pr --out "$T/$name.torch.$pr" "$@"
	done
	$PY tests/torch_jobs.py "$jobs" || { fail "$name: tests/torch_jobs.py"; return 1; }
	for pr in $prs; do
		[ "$(cat "$T/$name.torch.$pr.log.rc" 2>/dev/null)" = 0 ] ||
			{ cat "$T/$name.torch.$pr.log"; fail "$name: torch_gpt.py --precision $pr"; return 1; }
	done
}

# unstamp [FILE...]: FILE (or stdin) without the UTC time dpexec starts each
# console line with by default ("2026-11-27T04:21:52.123Z "): how suites read
# console lines (`step N/M | loss ...`, errors); logs.sh and dprun.sh check
# the stamped form itself
unstamp() {
	sed -E 's/^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z //' "$@"
}
