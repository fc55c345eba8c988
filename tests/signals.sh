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

if [ "${DP_LIST:-0}" != 1 ] && { case_match sigusr1 || case_match paste-resume || case_match ctrl-c; }; then
	"$DPC" models/mlp.dp -o "$T/s2.bin" --world-size 2 >"$T/dpc.out" 2>&1 ||
		{ fail "dpc models/mlp.dp --world-size 2"; cat "$T/dpc.out"; }
fi
# start NAME SIGNAL TARGET STEPS: a 2-rank run of STEPS steps; after 20 steps
# SIGNAL goes to mpirun (TARGET pid) or to its whole process group (TARGET
# pgrp: a terminal's Ctrl-C); $T/NAME.out ends with rc=STATUS
start() {
	signal_at "$1" 21 "$2" "$3" env $MPI_ASAN mpirun --oversubscribe -np 2 "$DPEXEC" "$T/s2.bin" \
		--steps "$4" --log-every 10 --save-dir "$T/$1.ck" --losses "$T/$1.loss"
}

# ---- SIGUSR1 to mpirun: exit 130, a checkpoint, a resume command that works ----
usr1_on=0
case_on sigusr1 && usr1_on=1
if [ $usr1_on = 1 ] || { [ "${DP_LIST:-0}" != 1 ] && case_match paste-resume; }; then
	start usr1 USR1 pid 300
	step=$(unstamp "$T/usr1.out" | sed -n 's/^interrupted at step \([0-9]*\) by SIGINT; resume with: .*/\1/p')
fi
if [ $usr1_on = 1 ]; then
	if [ -n "$step" ] && [ "$(unstamp "$T/usr1.out" | grep -c '^interrupted at step')" = 1 ] &&
		grep -q '^rc=130$' "$T/usr1.out" &&
		[ "$(cat "$T/usr1.ck/latest" 2>/dev/null)" = "$(printf 'step-%06d' "$step")" ]; then
		ok "SIGUSR1 to mpirun: stopped at step $step, one message, a checkpoint, exit 130"
	else
		fail "SIGUSR1 to mpirun: message, checkpoint, exit 130"; sed 's/^/      /' "$T/usr1.out" | tail -n 6
	fi
fi
if case_on paste-resume; then
	cmd=$(unstamp "$T/usr1.out" | sed -n 's/^interrupted at step [0-9]* by SIGINT; resume with: //p')
	case $cmd in
	"mpirun --oversubscribe -np 2 $DPEXEC $T/s2.bin "*) have=1 ;;
	*) have=0 ;;
	esac
	if [ "$have" = 1 ] && (export $MPI_ASAN; eval "$cmd") >"$T/paste.out" 2>&1 &&
		unstamp "$T/paste.out" | grep -q "^resumed from $T/usr1.ck/step-" &&
		[ "$(tail -n 1 "$T/usr1.loss" | cut -d' ' -f1)" = 300 ]; then
		ok "the printed resume command, pasted as it is (mpirun --oversubscribe included), finishes the run"
	else
		fail "the printed resume command works when pasted: '$cmd'"; sed 's/^/      /' "$T/paste.out" | tail -n 6
	fi
fi

# ---- Ctrl-C: Open MPI's mpirun SIGTERMs the ranks and exits 1 ----
# mpirun SIGTERMs the ranks about a second after the SIGINT (measured, Open
# MPI 4.1.4), by when 300 steps of mlp.dp (~2.3 ms each) are long done: the
# run is the model's whole schedule, 4000 steps, never reached
if case_on ctrl-c; then
	start ctrlc INT pgrp 4000
	if unstamp "$T/ctrlc.out" | grep -q '^interrupted at step [0-9]* by SIGTERM; resume with: ' &&
		grep -q '^rc=1$' "$T/ctrlc.out" && [ -f "$T/ctrlc.ck/latest" ]; then
		ok "Ctrl-C of mpirun: the ranks save and say SIGTERM, mpirun exits 1 (as docs/CHECKPOINTS.md says)"
	else
		fail "Ctrl-C of mpirun: as docs/CHECKPOINTS.md says"; sed 's/^/      /' "$T/ctrlc.out" | tail -n 6
	fi
fi
finish signals
