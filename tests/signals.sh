#!/usr/bin/env bash
# tests/signals.sh - stopping a run through its launcher, as a user does
# (docs/CHECKPOINTS.md, "Signals"; Open MPI 4's mpirun, measured):
#  - SIGUSR1 to mpirun (which forwards it to every rank; dpexec takes it as
#    SIGINT): the step finishes, one "interrupted at step N by SIGINT"
#    line, a checkpoint, exit 130;
#  - the printed resume command, pasted into a shell as it is (mpirun and
#    its options included), continues the run to its end;
#  - Ctrl-C (SIGINT to mpirun's process group, as a terminal sends it):
#    mpirun does not forward it but SIGTERMs the ranks, which save and say
#    SIGTERM; mpirun exits 1 whatever the ranks' status.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
export OMPI_MCA_orte_execute_quiet=1

"$DPC" models/mlp.dp -o "$T/s2.bin" --world-size 2 >"$T/dpc.out" 2>&1 ||
	{ fail "dpc models/mlp.dp --world-size 2"; cat "$T/dpc.out"; }
# start NAME SIGNAL TARGET: a 2-rank run of 300 steps in a session of its
# own; after 20 steps SIGNAL goes to mpirun (TARGET pid) or to its whole
# process group (TARGET pgrp: a terminal's Ctrl-C); $T/NAME.out ends with
# rc=STATUS
start() {
	setsid bash -c 'echo $$ >"$1/$2.pid"; exec env '"$MPI_ASAN"' mpirun --oversubscribe -np 2 \
		"$3" "$1/s2.bin" --steps 300 --log-every 10 --save-dir "$1/$2.ck" --losses "$1/$2.loss"' \
		sh "$T" "$1" "$DPEXEC" >"$T/$1.out" 2>&1 &
	local job=$!
	wait_lines "$T/$1.loss" 21
	local pid; pid=$(cat "$T/$1.pid")
	if [ "$3" = pgrp ]; then kill -"$2" -- -"$pid"; else kill -"$2" "$pid"; fi
	wait $job
	echo "rc=$?" >>"$T/$1.out"
}

# ---- SIGUSR1 to mpirun: exit 130, a checkpoint, a resume command that works ----
start usr1 USR1 pid
step=$(sed -n 's/^interrupted at step \([0-9]*\) by SIGINT; resume with: .*/\1/p' "$T/usr1.out")
if [ -n "$step" ] && [ "$(grep -c '^interrupted at step' "$T/usr1.out")" = 1 ] &&
	grep -q '^rc=130$' "$T/usr1.out" &&
	[ "$(cat "$T/usr1.ck/latest" 2>/dev/null)" = "$(printf 'step-%06d' "$step")" ]; then
	ok "SIGUSR1 to mpirun: stopped at step $step, one message, a checkpoint, exit 130"
else
	fail "SIGUSR1 to mpirun: message, checkpoint, exit 130"; sed 's/^/      /' "$T/usr1.out" | tail -n 6
fi
cmd=$(sed -n 's/^interrupted at step [0-9]* by SIGINT; resume with: //p' "$T/usr1.out")
case $cmd in
"mpirun --oversubscribe -np 2 $DPEXEC $T/s2.bin "*) have=1 ;;
*) have=0 ;;
esac
if [ "$have" = 1 ] && (export $MPI_ASAN; eval "$cmd") >"$T/paste.out" 2>&1 &&
	grep -q "^resumed from $T/usr1.ck/step-" "$T/paste.out" &&
	[ "$(tail -n 1 "$T/usr1.loss" | cut -d' ' -f1)" = 300 ]; then
	ok "the printed resume command, pasted as it is (mpirun --oversubscribe included), finishes the run"
else
	fail "the printed resume command works when pasted: '$cmd'"; sed 's/^/      /' "$T/paste.out" | tail -n 6
fi

# ---- Ctrl-C: Open MPI's mpirun SIGTERMs the ranks and exits 1 ----
start ctrlc INT pgrp
if grep -q '^interrupted at step [0-9]* by SIGTERM; resume with: ' "$T/ctrlc.out" &&
	grep -q '^rc=1$' "$T/ctrlc.out" && [ -f "$T/ctrlc.ck/latest" ]; then
	ok "Ctrl-C of mpirun: the ranks save and say SIGTERM, mpirun exits 1 (as docs/CHECKPOINTS.md says)"
else
	fail "Ctrl-C of mpirun: as docs/CHECKPOINTS.md says"; sed 's/^/      /' "$T/ctrlc.out" | tail -n 6
fi
finish signals
