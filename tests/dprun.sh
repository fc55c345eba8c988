#!/usr/bin/env bash
# tests/dprun.sh - the launcher (launch/dprun.c, docs/LAUNCH.md), signalled
# and failed as a user's job is:
#  - its options: --help, a bad option in one line (exit 2), the launch
#    line it builds (--dry-run): mpirun on one host (--oversubscribe, and
#    --allow-run-as-root as root), --host/--hostfile, srun under Slurm;
#  - Ctrl-C (SIGINT to dprun's process group, as a terminal sends it) of a
#    2-rank run: exit 130, one "interrupted" line, a checkpoint, and the
#    printed resume command (dprun's), pasted without the Open MPI root
#    variables, finishes the run; SIGTERM to dprun: exit 143;
#  - kill -9 of one rank of a 4-rank gpt2-tiny run at a random step under
#    --max-restarts 2 --ranks-after-failure 3 --save-every 5: dprun
#    restarts at 2 ranks (global_batch 16: 3 does not divide it; dpc says
#    so), logs the cause, the sizes, the step resumed from and the steps
#    lost, and the losses from that step on equal, bit for bit, a run
#    started fresh at 2 ranks from the same checkpoint (DPRUN_TRIALS
#    trials, default 2; 5 for the figures in docs/LAUNCH.md);
#  - data order: a run restarted at another world size sees the samples
#    an uninterrupted run would have (lr 1e-30: each step's loss names its
#    samples), across an epoch's end;
#  - a stalled rank (SIGSTOP) takes the same path through --timeout
#    (dpexec's exit 75);
#  - under Slurm with a stand-in srun (records its words, runs them through
#    mpirun): the srun lines of the start and of a restart, Ctrl-C;
#  - a user error (a token shard cut short after compiling) is not
#    restarted: exit 1, no restart line;
#  - restarts exhausted (a rank killed again after the one restart): the
#    giving-up line and the job's status (137); fewer ranks than
#    --min-ranks: the same at once.
# Rank processes are found by the scratch directory dprun compiles into
# (TMPDIR is this suite's own), so other jobs on the machine are never hit.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
DPRUN=$ROOT/$BUILD/dprun
TRIALS=${DPRUN_TRIALS:-2}
export OMPI_MCA_orte_execute_quiet=1
export TMPDIR=$T/tmp # dprun's scratch directories: this suite's ranks' paths
mkdir -p "$TMPDIR"
# the time every line of a dprun job starts with (dprun's, and dpexec's by default)
TS='[0-9]\{4\}-[0-1][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\.[0-9]\{3\}Z'

# ---- options ----
if case_on options; then
	out=$("$DPRUN" --help)
	for o in --np --hosts --hostfile --probe-timeout --launcher --save-dir --save-every --max-restarts \
		--ranks-after-failure --min-ranks --dry-run; do
		echo "$out" | grep -q -- "^ *$o\b\|, $o\b" || { fail "dprun --help lists $o"; }
	done
	"$DPRUN" --max-restrats 2 -n 2 models/mlp.dp >"$T/bad.out" 2>&1
	rc=$?
	if [ $rc = 2 ] && [ "$(wc -l <"$T/bad.out")" = 1 ] &&
		grep -q "unknown option '--max-restrats'; did you mean '--max-restarts'" "$T/bad.out"; then
		ok "dprun --help lists its options; a misspelt one: one line, did you mean, exit 2"
	else
		fail "a misspelt dprun option (exit $rc)"; cat "$T/bad.out"
	fi
	"$DPRUN" -n 2 --max-restarts 1 models/mlp.dp >"$T/bad.out" 2>&1
	if [ $? = 2 ] && grep -q "give --save-dir" "$T/bad.out"; then
		ok "--max-restarts without --save-dir: refused"
	else
		fail "--max-restarts without --save-dir"; cat "$T/bad.out"
	fi
fi
if case_on launch-line; then
	root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root "
	one=$(env -u SLURM_JOB_ID "$DPRUN" -n 4 --dry-run models/mlp.dp -- --steps 3)
	hosts=$(env -u SLURM_JOB_ID "$DPRUN" -n 4 --hosts a:2,b:2 --dry-run models/mlp.dp)
	slurm=$(SLURM_JOB_ID=7 "$DPRUN" -n 4 --dry-run --save-dir ck models/mlp.dp -- --steps 3)
	if [[ $one == "mpirun $root--oversubscribe -np 4 -x DPRUN_COMMAND -x DPRUN_ARGS_FROM $ROOT/$BUILD/dpexec $TMPDIR/dprun."*"/step-4.bin --losses "*" --steps 3" ]] &&
		[[ $hosts == "mpirun $root--host a:2,b:2 -np 4 "* ]] &&
		[[ $slurm == "srun -n 4 $ROOT/$BUILD/dpexec "*" --save-dir ck --losses "*" --steps 3" ]]; then
		ok "the launch line: mpirun on one host (--oversubscribe), --host, srun under Slurm"
	else
		fail "the launch line"; printf '      %s\n' "$one" "$hosts" "$slurm"
	fi
fi

# ---- Ctrl-C and SIGTERM ----
# stop NAME SIGNAL TARGET: dprun runs mlp.dp at 2 ranks for 300 steps, in
# $T (the resume command's paths are relative); after 20 steps SIGNAL goes to
# dprun (TARGET pid) or to its process group (pgrp: a terminal's Ctrl-C);
# $T/NAME.out ends with rc=STATUS
stop() {
	(cd "$T" && signal_at "$1" 21 "$2" "$3" env $MPI_ASAN "$DPRUN" -n 2 --save-dir "$1.ck" \
		"$ROOT/models/mlp.dp" -- --steps 300 --log-every 100 --eval-every 0 --losses "$1.loss")
}
if case_on ctrl-c; then
	t0=$(date -u +%Y-%m-%dT%H:%M:%S.000Z)
	stop ctrlc INT pgrp
	t1=$(date -u +%Y-%m-%dT%H:%M:%S.999Z)
	step=$(sed -n "s/^$TS interrupted at step \([0-9]*\) by SIGINT; resume with: .*/\1/p" "$T/ctrlc.out")
	cmd=$(sed -n "s/^$TS interrupted at step [0-9]* by SIGINT; resume with: //p" "$T/ctrlc.out")
	if [ -n "$step" ] && [ "$(grep -c "^$TS interrupted at step" "$T/ctrlc.out")" = 1 ] &&
		grep -q '^rc=130$' "$T/ctrlc.out" &&
		[ "$(cat "$T/ctrlc.ck/latest" 2>/dev/null)" = "$(printf 'step-%06d' "$step")" ]; then
		ok "Ctrl-C of dprun: stopped at step $step, one message, a checkpoint, exit 130"
	else
		fail "Ctrl-C of dprun: message, checkpoint, exit 130"; sed 's/^/      /' "$T/ctrlc.out" | tail -n 6
	fi
	# every line of the job, dprun's and the ranks' (rc= is the test's), starts with its time
	times=$(grep -o "^$TS" "$T/ctrlc.out" | sort)
	if [ "$(grep -v '^rc=' "$T/ctrlc.out" | grep -vc "^$TS ")" = 0 ] && ! grep -q "^$TS $TS" "$T/ctrlc.out" &&
		grep -q "^$TS dprun: compiled" "$T/ctrlc.out" && grep -q "^$TS mesh: " "$T/ctrlc.out" &&
		[[ ! "$(head -n 1 <<<"$times")" < "$t0" ]] && [[ ! "$(tail -n 1 <<<"$times")" > "$t1" ]]; then
		ok "every line of a dprun job (dprun's, the ranks') starts with the UTC time it was printed, once"
	else
		fail "a line of a dprun job without its time, or with two"; grep -v "^$TS \|^rc=" "$T/ctrlc.out" | head -n 5 | sed 's/^/      /'
		grep "^$TS $TS" "$T/ctrlc.out" | head -n 5 | sed 's/^/      /'
	fi
	# pasted in the same directory, without the variables that let Open MPI run as root
	if [[ $cmd == "$DPRUN -n 2 --save-dir ctrlc.ck $ROOT/models/mlp.dp -- "*" --resume ctrlc.ck" ]] &&
		(cd "$T" && env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
			-u OMPI_MCA_rmaps_base_oversubscribe $MPI_ASAN bash -c "$cmd") >"$T/paste.out" 2>&1 &&
		grep -q "^$TS resumed from ctrlc.ck/step-" "$T/paste.out" &&
		[ "$(tail -n 1 "$T/ctrlc.loss" | cut -d' ' -f1)" = 300 ]; then
		ok "the printed resume command (dprun's), pasted as it is without the Open MPI root variables, finishes the run"
	else
		fail "the printed resume command works when pasted: '$cmd'"; sed 's/^/      /' "$T/paste.out" | tail -n 6
	fi
fi
if case_on sigterm; then
	stop term TERM pid
	if grep -q "^$TS interrupted at step [0-9]* by SIGTERM; resume with: " "$T/term.out" &&
		grep -q '^rc=143$' "$T/term.out" && [ -f "$T/term.ck/latest" ]; then
		ok "SIGTERM to dprun: the ranks save and say SIGTERM, exit 143"
	else
		fail "SIGTERM to dprun: exit 143 after a checkpoint"; sed 's/^/      /' "$T/term.out" | tail -n 6
	fi
fi

# ---- restarts ----
# the tiny GPT-2 on the GPL's text; global_batch 16: 4 and 2 ranks divide it, 3 does not
restart_setup() {
	text_shard
	sed "$data" models/gpt2-tiny.dp >"$T/g.dp"
	"$DPC" "$T/g.dp" --world-size 2 -o "$T/g2.bin" >"$T/g2.log" 2>&1 || { cat "$T/g2.log"; fail "dpc g.dp"; }
}
# ranks NAME: the pids of the dpexec ranks of the dprun job NAME (its step file is
# in $TMPDIR/dprun.*)
ranks() { pgrep -f "^$ROOT/$BUILD/dpexec $TMPDIR/dprun\.[^ ]*/step-[0-9]*\.bin --save-dir $T/$1\.ck "; }
# elastic NAME STEPS RESTARTS [dprun options -- dpexec options]: dprun on 4 ranks in
# the background (pid in $job), losses in $T/NAME.loss, output in $T/NAME.out;
# dpexec's --timeout is ELASTIC_TIMEOUT (30 s unless set: a --timeout among
# the dpexec options would come before this one, which dpexec then takes)
elastic() {
	local name=$1 steps=$2 restarts=$3; shift 3
	rm -rf "$T/$name.ck" "$T/$name.loss"
	( env $MPI_ASAN "$DPRUN" -n 4 --max-restarts "$restarts" --save-every 5 --save-dir "$T/$name.ck" "$@" \
		--steps "$steps" --quiet --eval-every 0 --losses "$T/$name.loss" --timeout "${ELASTIC_TIMEOUT:-30}" \
		>"$T/$name.out" 2>&1
	  echo "rc=$?" >>"$T/$name.out" ) &
	job=$!
}
# kill_at NAME STEP SIGNAL: when NAME has logged STEP steps, SIGNAL to one of its ranks
kill_at() {
	wait_lines "$T/$1.loss" $(($2 + 1)) || return 1
	local pids; pids=($(ranks "$1"))
	[ ${#pids[@]} -ge 2 ] || return 1
	kill -"$3" "${pids[$((RANDOM % ${#pids[@]}))]}"
}
# same_as_fresh NAME STEPS: the restart NAME logged; its losses after the resumed
# step equal, bit for bit, a 2-rank run resumed from that checkpoint
same_as_fresh() {
	local name=$1 steps=$2 line from lost
	line=$(grep "^$TS dprun: restart 1 of [0-9]*: .*; world size 4 -> 2; resuming from step [0-9]* of $T/$name.ck ([0-9]* steps\? lost since the last save)" "$T/$name.out")
	from=$(echo "$line" | sed -n 's/.*resuming from step \([0-9]*\) .*/\1/p')
	lost=$(echo "$line" | sed -n 's/.*(\([0-9]*\) steps\? lost.*/\1/p')
	# the schedule's --steps warning: at the start, not again at the restart
	[ -n "$from" ] && grep -q "^rc=0$" "$T/$name.out" &&
		[ "$(grep -c "warning: --steps $steps ends the run before" "$T/$name.out")" = 1 ] &&
		grep -q "3 ranks: not possible: .*global_batch 16 is not divisible by .* = 3" "$T/$name.out" || return 1
	mpi 2 "$T/g2.bin" --resume "$(printf '%s/step-%06d' "$T/$name.ck" "$from")" --save-dir "$T/$name.ref.ck" \
		--steps "$steps" --quiet --eval-every 0 --losses "$T/$name.ref" >"$T/$name.ref.out" 2>&1 || return 1
	[ "$(awk -v f="$from" '!/^#/ && $1 > f' "$T/$name.loss" | wc -l)" = $((steps - from)) ] &&
		cmp -s <(awk -v f="$from" '!/^#/ && $1 > f' "$T/$name.loss") \
			<(awk -v f="$from" '!/^#/ && $1 > f' "$T/$name.ref") || return 1
	echo "resumed from step $from, $lost lost"
}
for i in $(seq "$TRIALS"); do
	case_on "kill9-$i" || continue
	once restart restart_setup
	at=$((6 + RANDOM % 20))
	elastic "k$i" 40 2 --ranks-after-failure 3 "$T/g.dp" --
	kill_at "k$i" "$at" KILL
	t0=$(date +%s%N)
	# time to resume: from the kill to the 2-rank job's "resumed from" line
	for j in $(seq 1200); do grep -q "^$TS resumed from" "$T/k$i.out" && break; sleep 0.05; done
	took=$((($(date +%s%N) - t0) / 1000000))
	wait $job
	if got=$(same_as_fresh "k$i" 40); then
		ok "kill -9 of a rank once step $at was logged: restarted at 2 ranks ($got, resumed ${took} ms after the kill); losses from there = a fresh 2-rank run from that checkpoint, bitwise"
		grep "^$TS dprun: restart 1" "$T/k$i.out" | sed 's/^/      /'
	else
		fail "kill -9 of a rank once step $at was logged: restart at 2 ranks, losses as a fresh run from the checkpoint"
		sed 's/^/      /' "$T/k$i.out" | tail -n 12
	fi
done
# Data order (docs/DATA.md's sampler): with lr 1e-30 the parameters stay as
# initialised, so a step's loss says which samples its global batch held;
# a run killed at 4 ranks and restarted at 2 logs the losses of an
# uninterrupted 4-rank run at every step, across an epoch's end (GPL-3's
# ~490 windows of 64 tokens: 30 steps an epoch), within the float
# reduction order's rtol 1e-5, and the same losses one step off do not.
if case_on data-order; then
	once restart restart_setup
	sed 's/^  optimizer .*/  optimizer sgd(lr=1e-30)/; s/^  schedule .*/  schedule constant/' "$T/g.dp" >"$T/g0.dp"
	"$DPC" "$T/g0.dp" --world-size 4 -o "$T/g04.bin" >"$T/g04.log" 2>&1 || cat "$T/g04.log"
	mpi 4 "$T/g04.bin" --steps 45 --quiet --eval-every 0 --losses "$T/order.ref" >"$T/order.ref.out" 2>&1 ||
		tail -n 5 "$T/order.ref.out"
	elastic order 45 1 --ranks-after-failure 3 "$T/g0.dp" --
	kill_at order 12 KILL
	wait $job
	from=$(sed -n 's/.*world size 4 -> 2; resuming from step \([0-9]*\) .*/\1/p' "$T/order.out")
	awk -v f="$from" '/^#/ || $1 > f' "$T/order.loss" >"$T/order.after"
	awk -v f="$from" '/^#/ || $1 > f' "$T/order.ref" >"$T/order.ref.after"
	awk -v f="$from" '/^#/ || ($1 >= f && $1 < 45)' "$T/order.ref" >"$T/order.shifted" # a step early
	if [ -n "$from" ] && grep -q "^rc=0$" "$T/order.out" && [ "$(grep -vc '^#' "$T/order.after")" = $((45 - from)) ] &&
		$PY tests/compare.py losses "$T/order.after" "$T/order.ref.after" --rtol 1e-5 --atol 0 >"$T/order.cmp" 2>&1 &&
		! $PY tests/compare.py losses "$T/order.after" "$T/order.shifted" --rtol 1e-5 --atol 0 >/dev/null 2>&1; then
		ok "data order: restarted at 2 ranks from step $from, steps $((from + 1))..45 (an epoch's end at 30) see the uninterrupted 4-rank run's samples (loss $(grep -o 'max rel [^ ]*' "$T/order.cmp" | head -n 1)); one step off does not match"
	else
		fail "data order across a restart at another world size"; sed 's/^/      /' "$T/order.cmp" "$T/order.out" 2>/dev/null | tail -n 12
	fi
fi
if case_on sigstop; then
	once restart restart_setup
	# (--timeout 3: the stall is found 3 s after the stop; it had been
	# `-- --timeout 3`, which elastic's own --timeout 30 after it overrode:
	# the case waited 30 s)
	ELASTIC_TIMEOUT=3 elastic stop 30 1 --ranks-after-failure 3 "$T/g.dp" --
	kill_at stop 8 STOP
	wait $job
	if grep -q "^$TS dprun: restart 1 of 1: a rank stalled or was lost (a wait passed dpexec's --timeout)" "$T/stop.out" &&
		got=$(same_as_fresh stop 30); then
		ok "a stopped rank (SIGSTOP): the --timeout error (exit 75), restarted at 2 ranks ($got), losses as a fresh run"
	else
		fail "a stopped rank: restart through --timeout"; sed 's/^/      /' "$T/stop.out" | tail -n 12
	fi
fi
# Under Slurm (SLURM_JOB_ID set) dprun starts the ranks with srun. No Slurm
# here: a stand-in srun on PATH records its words and runs them through
# mpirun (exec: dprun's SIGUSR1/2 reach mpirun, which forwards them). It
# checks dprun's side of the contract: the words (srun -n N dpexec STEP
# --save-dir ...), the environment the ranks get (the resume command is
# dprun's), a restart at 2 ranks as `srun -n 2 ... --resume DIR`, Ctrl-C.
# Not checked: Slurm's own srun (its signal forwarding, exit statuses,
# PMIx wiring, a node lost inside an allocation).
fake_srun() {
	mkdir -p "$T/slurm"
	cat >"$T/slurm/srun" <<-'EOF'
		#!/bin/sh
		# a stand-in for Slurm's srun (tests/dprun.sh): -n N COMMAND... through mpirun
		echo "srun $*" >>"$SRUN_LOG"
		[ "$1" = -n ] || { echo "fake srun: wants -n N first, not '$1'" >&2; exit 2; }
		n=$2; shift 2
		exec mpirun --oversubscribe -np "$n" "$@"
	EOF
	chmod +x "$T/slurm/srun"
}
if case_on srun; then
	once restart restart_setup
	fake_srun
	export SRUN_LOG=$T/srun.log
	SLURM_JOB_ID=7 PATH=$T/slurm:$PATH elastic srun 30 1 --ranks-after-failure 3 "$T/g.dp" --
	kill_at srun 8 KILL
	wait $job
	user="--steps 30 --quiet --eval-every 0 --losses $T/srun.loss --timeout 30"
	step4="$ROOT/$BUILD/dpexec $TMPDIR/dprun.[^ ]*/step-4.bin --save-dir $T/srun.ck --save-every 5 $user"
	step2="$ROOT/$BUILD/dpexec $TMPDIR/dprun.[^ ]*/step-2.bin --save-dir $T/srun.ck --save-every 5 --resume $T/srun.ck $user"
	if [ "$(wc -l <"$SRUN_LOG")" = 2 ] && sed -n 1p "$SRUN_LOG" | grep -q "^srun -n 4 $step4$" &&
		sed -n 2p "$SRUN_LOG" | grep -q "^srun -n 2 $step2$" && got=$(same_as_fresh srun 30); then
		ok "under Slurm (a stand-in srun): srun -n 4 dpexec STEP --save-dir ..., a rank killed: srun -n 2 ... --resume ($got), losses as a fresh 2-rank run"
	else
		fail "under Slurm (a stand-in srun): the srun lines and the restart"
		sed 's/^/      /' "$SRUN_LOG"; sed 's/^/      /' "$T/srun.out" | tail -n 8
	fi
	(cd "$T" && SLURM_JOB_ID=7 PATH=$T/slurm:$PATH signal_at sctrlc 21 INT pgrp env $MPI_ASAN "$DPRUN" -n 2 \
		--save-dir sctrlc.ck "$ROOT/models/mlp.dp" -- --steps 300 --log-every 100 --eval-every 0 --losses sctrlc.loss)
	cmd=$(sed -n "s/^$TS interrupted at step [0-9]* by SIGINT; resume with: //p" "$T/sctrlc.out")
	if grep -q '^rc=130$' "$T/sctrlc.out" && [ -f "$T/sctrlc.ck/latest" ] &&
		[[ $cmd == "$DPRUN -n 2 --save-dir sctrlc.ck $ROOT/models/mlp.dp -- "*" --resume sctrlc.ck" ]] &&
		tail -n 1 "$SRUN_LOG" | grep -q "^srun -n 2 $ROOT/$BUILD/dpexec "; then
		ok "under Slurm (a stand-in srun): Ctrl-C reaches the ranks through srun, exit 130, a checkpoint, dprun's resume command"
	else
		fail "Ctrl-C under Slurm (a stand-in srun)"; sed 's/^/      /' "$T/sctrlc.out" | tail -n 6
	fi
	unset SRUN_LOG
fi
if case_on user-error; then
	once restart restart_setup
	cp "$T/text.bin" "$T/cut.bin"
	sed "s|$T/text.bin|$T/cut.bin|" "$T/g.dp" >"$T/cut.dp"
	"$DPC" "$T/cut.dp" --world-size 4 -o "$T/cut4.bin" >/dev/null 2>&1
	truncate -s 100000 "$T/cut.bin" # after compiling: dpexec finds it
	env $MPI_ASAN "$DPRUN" -n 4 --max-restarts 2 --save-every 5 --save-dir "$T/cut.ck" "$T/cut4.bin" -- \
		--steps 10 --quiet --eval-every 0 >"$T/cut.out" 2>&1
	rc=$?
	if [ $rc = 1 ] && grep -q "dpexec: error: .*$T/cut.bin" "$T/cut.out" && ! grep -q "restart" "$T/cut.out"; then
		ok "a user error (a token shard cut short): not restarted, exit 1"
	else
		fail "a user error is not restarted (exit $rc)"; sed 's/^/      /' "$T/cut.out" | tail -n 8
	fi
fi
if case_on exhausted; then
	once restart restart_setup
	elastic ex 400 1 "$T/g.dp" --
	# (the kill lands at step 7 or later: the last save before it is step 5,
	# or 10 when the ranks ran past it first, as they did in a quiet CI run
	# once the waits stopped spinning; which one is not this case's point)
	kill_at ex 7 KILL
	# the restart runs at 4 again (no --ranks-after-failure); kill one of them
	for j in $(seq 300); do [ "$(ranks ex | wc -l)" = 4 ] && grep -q "restart 1 of 1" "$T/ex.out" && break; sleep 0.1; done
	sleep 1
	kill -KILL "$(ranks ex | head -n 1)"
	wait $job
	if grep -q "^$TS dprun: restart 1 of 1: a rank died (Killed, the launcher's status 137); world size 4 -> 4; resuming from step [1-9][0-9]* " "$T/ex.out" &&
		grep -q "^$TS dprun: giving up: a rank died (Killed, the launcher's status 137) at 4 ranks after 1 restart (--max-restarts 1)" "$T/ex.out" &&
		grep -q "^rc=137$" "$T/ex.out"; then
		ok "restarts exhausted: one restart at 4 ranks, then 'giving up ... (--max-restarts 1)', the job's status 137"
	else
		fail "restarts exhausted: the message and status"; sed 's/^/      /' "$T/ex.out" | tail -n 10
	fi
	elastic few 400 2 --ranks-after-failure 2 --min-ranks 3 "$T/g.dp" --
	kill_at few 3 KILL
	wait $job
	if grep -q "^$TS dprun: giving up: a rank died .*; 2 usable ranks are fewer than --min-ranks 3" "$T/few.out" &&
		grep -q "^rc=137$" "$T/few.out"; then
		ok "fewer usable ranks than --min-ranks: giving up at once, the job's status"
	else
		fail "fewer usable ranks than --min-ranks"; sed 's/^/      /' "$T/few.out" | tail -n 6
	fi
fi
if [ "${DP_LIST:-0}" != 1 ] && [ -n "$(ls -A "$TMPDIR")" ]; then
	fail "dprun removes its scratch directories: left $(ls "$TMPDIR")"
fi
finish dprun
