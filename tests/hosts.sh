#!/usr/bin/env bash
# tests/hosts.sh - runs across two "hosts" (docs/LAUNCH.md): two network
# namespaces joined by a veth pair on addresses made here, each with a
# hostname of its own (unshare --uts), so Open MPI sees two nodes. mpirun
# starts the remote daemon through an rsh agent written here that enters
# the other namespace (`ip netns exec`; no ssh), and the ranks talk over TCP
# only (btl tcp,self: no shared memory between them). dprun -n 4 --hosts
# A:2,B:2 trains mlp.dp: two of the ranks run in the second namespace,
# with TCP connections between the two addresses, and the losses equal
# the 4-rank single-host run's, bit for bit. A host lost mid-run: dprun
# probes the hosts, restarts on the one that answers (host-lost); an error
# of the run itself, both hosts answering, is not restarted (user-error).
# The namespaces are removed on every exit (trap), a failed one included;
# without root or where namespaces cannot be made the case is skipped,
# saying why.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
A=dpA$$ B=dpB$$ # names of this run's own: other runs of the suite may be going on
cleanup() {
	ip netns del "$A" 2>/dev/null
	ip netns del "$B" 2>/dev/null # the veth pair goes with its namespaces
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
cd "$ROOT"
export OMPI_MCA_orte_execute_quiet=1
IPA=10.231.0.1 IPB=10.231.0.2 # inside the namespaces only: no clash with the host's

# make_hosts: the two namespaces and their link; non-zero (the reason in
# $T/ns.err) where that is not possible
make_hosts() {
	{ [ "$(id -u)" = 0 ] || { echo "not root" >&2; return 1; }; } &&
		ip netns add "$A" && ip netns add "$B" &&
		ip link add "v$A" type veth peer name "v$B" &&
		ip link set "v$A" netns "$A" && ip link set "v$B" netns "$B" &&
		ip -n "$A" addr add "$IPA/24" dev "v$A" && ip -n "$B" addr add "$IPB/24" dev "v$B" &&
		ip -n "$A" link set "v$A" up && ip -n "$B" link set "v$B" up &&
		ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
		ip netns exec "$A" unshare --uts true
} 2>"$T/ns.err"

# hosts_up: the two hosts and the rsh agent, made once for the cases that
# need them; non-zero (skipped, saying why) where that is not possible
hosts_up() {
	if [ -z "${HOSTS_UP:-}" ]; then
		HOSTS_UP=no
		make_hosts || return 1
		HOSTS_UP=yes
		# Open MPI's rsh agent: HOST COMMAND... runs COMMAND (a shell's text) in HOST's namespace
		cat >"$T/nsrsh" <<-EOF
			#!/bin/sh
			host=\$1; shift
			case \$host in
			$IPA) ns=$A; name=hostA ;;
			$IPB) ns=$B; name=hostB ;;
			*) echo "nsrsh: unknown host \$host" >&2; exit 255 ;;
			esac
			exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name; \$*"
		EOF
		chmod +x "$T/nsrsh"
	fi
	[ "$HOSTS_UP" = yes ]
}
# on_a COMMAND...: COMMAND on host A (its namespace and hostname), mpirun's
# remote ranks through the rsh agent, TCP only between the two addresses
on_a() {
	ip netns exec "$A" unshare --uts env OMPI_MCA_plm_rsh_agent="$T/nsrsh" OMPI_MCA_btl=tcp,self \
		OMPI_MCA_btl_tcp_if_include=10.231.0.0/24 OMPI_MCA_oob_tcp_if_include=10.231.0.0/24 \
		TMPDIR="$T" $MPI_ASAN sh -c 'hostname hostA; exec "$@"' sh "$@"
}

if case_on two-hosts; then
	if ! hosts_up; then
		skip "two hosts as network namespaces: cannot make them here ($(head -n 1 "$T/ns.err"))"
	else
		(on_a timeout 120 "$ROOT/$BUILD/dprun" -n 4 --hosts "$IPA:2,$IPB:2" models/mlp.dp -- \
			--steps 60 --eval-every 0 --log-every 20 --losses "$T/two.loss" >"$T/two.out" 2>&1
		 echo "rc=$?" >>"$T/two.out") &
		job=$!
		# while it trains: where the ranks are, and what joins them
		wait_lines "$T/two.loss" 6
		inb=0
		for p in $(ip netns pids "$B"); do
			grep -q "dpexec" "/proc/$p/cmdline" 2>/dev/null && inb=$((inb + 1))
		done
		tcp=$(ip netns exec "$A" ss -tnp 2>/dev/null | grep -c "$IPA:[0-9]* *$IPB:[0-9]*.*dpexec\|$IPB:[0-9]* *$IPA:[0-9]*.*dpexec")
		wait $job
		"$DPC" models/mlp.dp --world-size 4 -o "$T/one.bin" >"$T/one.out" 2>&1 &&
			mpi 4 "$T/one.bin" --steps 60 --eval-every 0 --quiet --losses "$T/one.loss" >>"$T/one.out" 2>&1
		if grep -q "^rc=0$" "$T/two.out" && [ "$inb" = 2 ] && [ "$tcp" -ge 1 ] &&
			[ "$(grep -vc '^#' "$T/two.loss")" = 60 ] && cmp -s "$T/two.loss" "$T/one.loss"; then
			ok "mlp.dp on 2 ranks x 2 hosts (network namespaces, TCP only): $inb ranks in the second, $tcp dpexec TCP connections between them; losses = the 4-rank single-host run's, bitwise"
			grep "dprun: \|Z mesh: \|Z step " "$T/two.out" | sed 's/^/      /'
		else
			fail "2 ranks x 2 hosts over TCP: ranks in the second namespace $inb, TCP connections $tcp, losses as one host's"
			sed 's/^/      /' "$T/two.out" | tail -n 12
			cmp "$T/two.loss" "$T/one.loss" | sed 's/^/      /'
		fi
	fi
fi

# A host lost in the middle of a run (--hostfile): once 25 steps are logged,
# host B's link goes down and its processes are killed (a host that
# crashed: its address no longer answers). mpirun ends the job with a
# status of its own; dprun probes both hosts (mpirun --host H:1 true), finds
# B gone, restarts at the slots that answer (2 ranks on A) from the last
# checkpoint, and the run finishes: its losses from the resumed step on
# equal, bit for bit, a 2-rank single-host run resumed from that checkpoint.
if case_on host-lost; then
	if ! hosts_up; then
		skip "a host lost: two hosts as network namespaces cannot be made here ($(head -n 1 "$T/ns.err"))"
	else
		printf '# two hosts\n%s slots=2\n%s slots=2 # the one lost\n' "$IPA" "$IPB" >"$T/hostfile"
		# the first probe of the host that stays fails (exit 1), as one did
		# under load racing the failed job's teardown: dprun probes it again
		# within --probe-timeout and keeps it
		mkdir -p "$T/bin"
		cat >"$T/bin/mpirun" <<EOF
#!/bin/sh
case " \$* " in *" --host $IPA:1 -np 1 true "*)
	[ -e "$T/probe-failed" ] || { : >"$T/probe-failed"; exit 1; } ;;
esac
exec $(command -v mpirun) "\$@"
EOF
		chmod +x "$T/bin/mpirun"
		(PATH=$T/bin:$PATH on_a timeout 200 "$ROOT/$BUILD/dprun" -n 4 --hostfile "$T/hostfile" --max-restarts 1 \
			--probe-timeout 5 --save-dir "$T/lost.ck" --save-every 10 models/mlp.dp -- \
			--steps 120 --quiet --eval-every 0 --timeout 10 --losses "$T/lost.loss" >"$T/lost.out" 2>&1
		 echo "rc=$?" >>"$T/lost.out") &
		job=$!
		wait_lines "$T/lost.loss" 26
		ip -n "$B" link set "v$B" down
		kill -KILL $(ip netns pids "$B") 2>/dev/null
		wait $job
		from=$(sed -n "s/.* dprun: restart 1 of 1: a host stopped answering (the launcher's status [0-9]*); world size 4 -> 2 on $IPA:2; resuming from step \([0-9]*\) .*/\1/p" "$T/lost.out")
		ok_lost=0
		if [ -n "$from" ] && grep -q "^rc=0$" "$T/lost.out" &&
			grep -q " dprun: host $IPB does not answer: the probe (mpirun --host $IPB:1 true) " "$T/lost.out" &&
			! grep -q "host $IPA does not answer" "$T/lost.out" && [ -e "$T/probe-failed" ] &&
			"$DPC" models/mlp.dp --world-size 2 -o "$T/two2.bin" >/dev/null 2>&1 &&
			mpi 2 "$T/two2.bin" --resume "$(printf '%s/step-%06d' "$T/lost.ck" "$from")" --save-dir "$T/lost.ref.ck" \
				--steps 120 --quiet --eval-every 0 --losses "$T/lost.ref" >"$T/lost.ref.out" 2>&1 &&
			[ "$(awk -v f="$from" '!/^#/ && $1 > f' "$T/lost.loss" | wc -l)" = $((120 - from)) ] &&
			cmp -s <(awk -v f="$from" '!/^#/ && $1 > f' "$T/lost.loss") <(awk -v f="$from" '!/^#/ && $1 > f' "$T/lost.ref"); then
			ok "a host lost mid-run (--hostfile): probed, left out, restarted at 2 ranks on the other (its first probe failed, the next answered) from step $from; losses = a 2-rank single-host run from that checkpoint, bitwise"
			grep " dprun: " "$T/lost.out" | sed 's/^/      /'
		else
			fail "a host lost mid-run: probe, restart on the host that answers, losses as a fresh run"
			grep -v " step \| checkpoint " "$T/lost.out" | sed 's/^/      /' | tail -n 12
		fi
	fi
fi

# An error of the run itself on two hosts (an --init-from file that is not
# there): dprun probes, both hosts answer, so it is not restarted: exit 1.
if case_on user-error; then
	if ! hosts_up; then
		skip "a user error on two hosts: two hosts as network namespaces cannot be made here ($(head -n 1 "$T/ns.err"))"
	else
		ip -n "$B" link set "v$B" up # host-lost took it down
		on_a timeout 120 "$ROOT/$BUILD/dprun" -n 4 --hosts "$IPA:2,$IPB:2" --max-restarts 2 --probe-timeout 5 \
			--save-dir "$T/ue.ck" models/mlp.dp -- --steps 5 --init-from "$T/no-such.safetensors" >"$T/ue.out" 2>&1
		rc=$?
		if [ $rc = 1 ] && grep -q "dpexec: error: .*no-such.safetensors" "$T/ue.out" &&
			grep -q " dprun: every host answers: the job's status 1 is its own error; not restarted" "$T/ue.out" &&
			! grep -q "restart [0-9]\|does not answer" "$T/ue.out"; then
			ok "an error of the run on two hosts: both answer the probe, not restarted, exit 1"
		else
			fail "an error of the run on two hosts is not restarted (exit $rc)"; sed 's/^/      /' "$T/ue.out" | tail -n 6
		fi
	fi
fi
finish hosts
