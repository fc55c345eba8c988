#!/usr/bin/env bash
# tests/faults.sh - a run that survives: a stopped rank under the default
# collective timeout (shortened here by --timeout) ends every rank with the
# timeout message, and the ranks that wait meanwhile back off instead of
# spinning.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
export OMPI_MCA_orte_execute_quiet=1 # mpirun -q: no Open MPI help text

# rank_pids JOB: the dpexec processes started under the background job JOB
rank_pids() {
	local exe
	exe=$(basename "$DPEXEC" | cut -c1-15) # ps shows at most 15 characters of a name
	ps -eo pid=,ppid=,comm= | awk -v root="$1" -v exe="$exe" '{p[$1]=$2; c[$1]=$3}
		END {for (k in p) {x=k; while (x in p && x!=root && x>1) x=p[x]; if (x==root && c[k]==exe) print k}}' |
		sort -n
}
# cpu_ticks PID: user + system clock ticks so far
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
now() { date +%s.%N; }
# gone PID: no such process, or only its zombie (its parent has not reaped it yet)
gone() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null); [ -z "$st" ] || [ "${st#Z}" != "$st" ]; }

"$DPC" models/mlp.dp --world-size 2 -o "$T/mlp2.bin" >"$T/dpc.out" 2>&1 || fail "dpc mlp.dp"

# ---- SIGSTOP of one rank ----
( env $MPI_ASAN timeout 120 mpirun --oversubscribe -np 2 "$DPEXEC" "$T/mlp2.bin" --steps 100000 \
	--timeout 4 --log-every 100000 --eval-every 0 >"$T/hang.out" 2>&1; echo "rc=$?" >>"$T/hang.out" ) &
job=$!
for i in $(seq 100); do grep -q "^step 1/" "$T/hang.out" && break; sleep 0.2; done
sleep 0.5
pids=$(rank_pids $job)
victim=$(echo $pids | awk '{print $2}')
waiter=$(echo $pids | awk '{print $1}')
if [ -n "$victim" ] && [ -n "$waiter" ]; then
	t0=$(now)
	kill -STOP "$victim"
	sleep 1
	c0=$(cpu_ticks "$waiter"); w0=$(now)
	sleep 2
	c1=$(cpu_ticks "$waiter"); w1=$(now)
	wait $job
	took=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
	kill -CONT "$victim" 2>/dev/null
	# ticks are 1/100 s: the share of one core the waiting rank used
	cpu=$(awk -v c="$((c1 - c0))" -v a="$w0" -v b="$w1" 'BEGIN {printf "%.0f", c / (b - a)}')
	if grep -q "did not complete within 4 s (--timeout)" "$T/hang.out" && ! grep -q "rc=0" "$T/hang.out" &&
		awk -v t="$took" 'BEGIN {exit !(t < 9)}'; then
		ok "a stopped rank ends every rank with the timeout message (${took} s, timeout 4 s)"
	else
		fail "a stopped rank ends every rank within the timeout (${took}s)"; sed 's/^/      /' "$T/hang.out" | tail -n 5
	fi
	if gone "$victim" && gone "$waiter"; then
		ok "no rank process is left, the stopped one included"
	else
		fail "rank processes left"; ps -o pid,stat,cmd -p "$victim,$waiter"
	fi
	if [ "$cpu" -lt 25 ]; then
		ok "the waiting rank backs off: ${cpu}% of a core while its peer is stopped"
	else
		fail "the waiting rank spins: ${cpu}% of a core while its peer is stopped"
	fi
else
	wait $job
	fail "could not find the two rank processes ($(tail -n 1 "$T/hang.out"))"
fi

finish faults
