#!/usr/bin/env bash
# tests/equivalence.sh - every world size and accumulation split computes the
# same mathematics as one rank with the whole global batch.
#
# models/mlp.dp (global_batch 128, AdamW, cosine warmup, clipping at 1.0) is
# trained 20 steps on Fashion-MNIST at 1, 2 and 4 ranks, on an explicit 2x2
# (dp_replicate x dp_shard) mesh, and with grad_accum 1 and 4 at 2 ranks.
# Losses and final parameters must match the 1-rank run.
#
# Tolerance: float32 sums over the batch are split differently across ranks
# and micro-batches (reduction order changes), which perturbs the last bits
# (~1e-7 relative) of each gradient. Measured over 20 steps: losses agree to
# ~1e-7 relative, parameters (O(0.05)) to ~6e-8 absolute. We allow rtol 1e-5
# on losses and atol 1e-6 + rtol 1e-4 on parameters: ~20x the measured
# spread, far below what a real error causes (a loss not averaged over the
# global batch, or a missed micro-batch, moves losses by >1e-3 in one step).
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=20

run() { # run NAME NP DPFILE [dpc args...]
	local name=$1 np=$2 src=$3; shift 3
	"$DPC" "$src" -o "$T/$name.bin" "$@" || { fail "$name: dpc"; return 1; }
	mpi "$np" "$T/$name.bin" --steps $STEPS --quiet --losses "$T/$name.loss" \
		--save-full "$T/$name.st" --eval-every 0 >"$T/$name.log" 2>&1 ||
		{ cat "$T/$name.log"; fail "$name: dpexec on $np ranks"; return 1; }
}
same() { # same NAME REF
	if $PY tests/compare.py losses "$T/$1.loss" "$T/$2.loss" --rtol 1e-5 --atol 0 \
		--and params "$T/$1.st" "$T/$2.st" --rtol 1e-4 --atol 1e-6; then
		ok "$1 matches $2"
	else
		fail "$1 matches $2"
	fi
}

sed 's/^mesh auto/mesh dp_replicate=2, dp_shard=2/' models/mlp.dp >"$T/mesh2x2.dp"
sed 's/grad_accum 2/grad_accum 1/' models/mlp.dp >"$T/accum1.dp"
sed 's/grad_accum 2/grad_accum 4/' models/mlp.dp >"$T/accum4.dp"
need() { # need NAME: its run, once
	case $1 in
	ws*) once "$1" run "$1" "${1#ws}" models/mlp.dp --world-size "${1#ws}" ;;
	mesh2x2) once "$1" run "$1" 4 "$T/mesh2x2.dp" ;;
	accum*) once "$1" run "$1" 2 "$T/$1.dp" --world-size 2 ;;
	esac
}
case_same() { # case_same NAME REF: the case NAME-vs-REF, both runs, compared
	case_on "$1-vs-$2" || return 0
	need "$1"
	need "$2"
	same "$1" "$2"
}

# the runs must actually train: the loss falls over the 20 steps
if case_on ws1; then
	need ws1
	if awk '/^#/ {next} !n++ {a=$2} END{exit !($2 < a)}' "$T/ws1.loss"; then ok "loss falls at 1 rank"; else fail "loss falls at 1 rank"; fi
fi
# tests/lib.sh's mpi runs one rank as dpexec alone: the same step file
# started by `mpirun -np 1` trains to the same losses, bit for bit
if case_on ws1-mpirun; then
	need ws1
	if env $MPI_ASAN timeout 300 mpirun --oversubscribe -np 1 "$DPEXEC" "$T/ws1.bin" --steps $STEPS --quiet \
		--losses "$T/ws1m.loss" --eval-every 0 >"$T/ws1m.log" 2>&1 &&
		cmp -s <(grep -v '^#' "$T/ws1m.loss") <(grep -v '^#' "$T/ws1.loss"); then
		ok "ws1 under mpirun -np 1: the losses of dpexec alone, bit for bit"
	else
		tail -n 5 "$T/ws1m.log"; fail "ws1 under mpirun -np 1: the losses of dpexec alone"
	fi
fi
case_same ws2 ws1
case_same ws4 ws1
case_same mesh2x2 ws1
case_same accum1 ws1
case_same accum4 ws1
case_same accum4 accum1
finish equivalence
