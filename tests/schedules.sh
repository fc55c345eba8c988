#!/usr/bin/env bash
# tests/schedules.sh - the learning-rate schedules (format/settings.def's KIND
# rows of `schedule`; runtime/lr_sched.h computes them):
#  1. closed forms: each kind (constant, cosine, linear, wsd, step,
#     inverse_sqrt) runs a synthetic MLP for 24 steps at 1 rank with
#     --log-every 1; the lr --log-json reports at chosen steps (the ends of
#     warmup, stable and decay phases, the step boundaries) equals the value
#     worked out by hand below, as float32 (the value dp applies; within one
#     ulp), and every step's equals tests/torch_ref.py's lr_at; --losses
#     reports the same lr;
#  2. the lr logged is the lr applied: PyTorch (tests/torch_ref.py) trains the
#     same MLP with plain SGD under wsd and under step, and the 24 losses
#     agree (rtol 2e-4: tests/torch_ref.sh says why); a reference whose wsd
#     decays one step later must not agree;
#  3. --steps shorter than a decaying schedule (wsd here) warns with its
#     last lr and its floor.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
STEPS=24
if ! have_torch; then
	echo "schedules: needs python3-torch (make deps)"
	fail "prerequisites missing"; finish schedules; exit 1
fi

# the MLP on synthetic data, plain SGD at lr 0.05 (SGD moves by lr * g: a
# wrong lr shows in the next loss), no clipping, no eval
awk '/^eval \{/ {skip=1} skip && /^\}/ {skip=0; next} !skip' models/mlp.dp |
	sed -E -e 's/from idx\("[^"]*"\)/from synthetic(n=4096, classes=10)/' \
		-e 's/^  optimizer .*/  optimizer sgd(lr=0.05)/' -e 's/^  clip_grad_norm .*/  clip_grad_norm 0/' \
		-e "s/^  steps .*/  steps $STEPS/" -e 's/^mesh auto/mesh dp_replicate=1/' >"$T/base.dp"

# sched NAME DSL-SCHEDULE: compile and run it; $T/NAME.json, $T/NAME.loss
sched() {
	sed "s/^  schedule .*/  schedule $2/" "$T/base.dp" >"$T/$1.dp"
	grep -qF "schedule $2" "$T/$1.dp" || { fail "$1: sed"; return 1; }
	"$DPC" "$T/$1.dp" -o "$T/$1.bin" 2>"$T/$1.log" || { cat "$T/$1.log"; fail "$1: dpc"; return 1; }
	mpi 1 "$T/$1.bin" --log-every 1 --quiet --log-json "$T/$1.json" --losses "$T/$1.loss" \
		>>"$T/$1.log" 2>&1 || { cat "$T/$1.log"; fail "$1: dpexec"; return 1; }
}
# closed NAME DSL-SCHEDULE TORCH-ARGS -- K=LR ...: run it and check the logs
# (K: the optimizer step from 0, the log's step K + 1; LR: by hand)
closed() {
	local name=$1 dsl=$2; shift 2
	local targs=()
	while [ "$1" != -- ]; do targs+=("$1"); shift; done
	shift
	local on=0
	case_on "$name" && on=1
	[ $on = 1 ] || needed_by_later "$name" || return 0
	sched "$name" "$dsl" || return
	[ $on = 1 ] || return 0
	if $PY - "$T/$name.json" "$T/$name.loss" "$*" "${targs[@]}" >"$T/$name.chk" 2>&1 <<'EOF'; then
import argparse, json, sys
import numpy as np
sys.path.insert(0, "tests")
import torch_ref
js, loss, chosen, targs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ap = argparse.ArgumentParser()
torch_ref.add_train_args(ap, weight_decay=0.0)
ap.add_argument("--steps", type=int, default=24)
a = ap.parse_args(["--lr", "0.05"] + targs)
if a.schedule in ("cosine", "linear") and a.sched_steps <= 0:
    a.sched_steps = a.steps
rows = [r for r in map(json.loads, open(js)) if "step" in r and "run" not in r and "resume" not in r]
assert [r["step"] for r in rows] == list(range(1, a.steps + 1)), [r["step"] for r in rows]
lr = [r["lr"] for r in rows]
f32 = lambda x: float(np.float32(x))
# one float32 ulp: dp computes in double from the float32 it stores lr and
# min_lr in, then rounds; an lr one step off moves by far more
close = lambda got, want: abs(got - want) <= abs(want) * 2.0 ** -23 + 1e-12
for kv in chosen.split():
    k, want = kv.split("=")
    k, want = int(k), eval(want, {"sqrt": np.sqrt, "cos": np.cos, "pi": np.pi})
    assert close(lr[k], f32(want)), ("chosen step", k, lr[k], f32(want))
for k in range(a.steps):
    assert close(lr[k], f32(torch_ref.lr_at(a, k))), ("lr_at", k, lr[k], torch_ref.lr_at(a, k))
losses = [l.split() for l in open(loss) if not l.startswith("#")]
assert [float(l[3]) for l in losses] == lr, "--losses's lr column is not --log-json's"
print(" ".join("%.4g" % x for x in lr[:: max(1, a.steps // 8)]))
EOF
		ok "$name: the logged lr is the closed form at $* and lr_at's at every step ($(tail -n 1 "$T/$name.chk"))"
	else
		fail "$name: the logged lr"; sed 's/^/      /' "$T/$name.chk" | tail -n 4
	fi
}

# needed_by_later NAME: a case CASE selects uses run NAME's files (the
# PyTorch cases start from constant's initial weights and compare with wsd's
# and step's losses; the --steps warning runs wsd's step file)
needed_by_later() {
	[ "${DP_LIST:-0}" = 1 ] && return 1
	case $1 in
	constant) case_match torch-wsd || case_match torch-step || case_match torch-wsd-late ;;
	wsd) case_match torch-wsd || case_match torch-wsd-late || case_match short-steps-warning ;;
	step) case_match torch-step ;;
	*) return 1 ;;
	esac
}

# lr = 0.05 throughout; K counts optimizer steps from 0
closed constant "constant" --schedule constant -- 0=0.05 23=0.05
# cosine(warmup=4, steps=20, min_lr=0.005): k < 4: 0.05 (k+1)/4; then
# q = (k-4)/16: 0.005 + 0.0225 (1 + cos(pi q)); the floor from k = 20
closed cosine "cosine(warmup=4, steps=20, min_lr=0.005)" \
	--schedule cosine --warmup 4 --sched-steps 20 --min-lr 0.005 -- \
	0=0.0125 3=0.05 4=0.05 12=0.0275 "8=0.005+0.0225*(1+cos(pi/4))" 20=0.005 23=0.005
# linear(warmup=4, steps=20, min_lr=0.005): after the warmup
# 0.05 - 0.045 (k-4)/16
closed linear "linear(warmup=4, steps=20, min_lr=0.005)" \
	--schedule linear --warmup 4 --sched-steps 20 --min-lr 0.005 -- \
	0=0.0125 1=0.025 3=0.05 4=0.05 8=0.03875 12=0.0275 19=0.0078125 20=0.005 23=0.005
# wsd(warmup=2, stable=6, decay=10, min_lr=0.001): 0.025, 0.05 at k = 1..7,
# then 0.05 - 0.049 (k-8)/10 down to 0.001 at k = 18
closed wsd "wsd(warmup=2, stable=6, decay=10, min_lr=0.001)" \
	--schedule wsd --warmup 2 --stable 6 --decay 10 --min-lr 0.001 -- \
	0=0.025 1=0.05 7=0.05 8=0.05 9=0.0451 13=0.0255 17=0.0059 18=0.001 23=0.001
# wsd without decay steps: min_lr right after the stable ones
closed wsd-nodecay "wsd(stable=5, min_lr=0.002)" \
	--schedule wsd --stable 5 --min-lr 0.002 -- 0=0.05 4=0.05 5=0.002 23=0.002
# step(every=5, gamma=0.5): 0.05 * 0.5^(k // 5)
closed step "step(every=5, gamma=0.5)" --schedule step --every 5 --gamma 0.5 -- \
	0=0.05 4=0.05 5=0.025 9=0.025 10=0.0125 15=0.00625 20=0.003125 23=0.003125
# inverse_sqrt(warmup=4): 0.05 (k+1)/4 then 0.05 sqrt(4/(k+1)): 0.05 at k = 3
closed inverse_sqrt "inverse_sqrt(warmup=4)" --schedule inverse_sqrt --warmup 4 -- \
	0=0.0125 3=0.05 "4=0.05*sqrt(0.8)" 15=0.025 "23=0.05*sqrt(4/24)"
closed inverse_sqrt-nowarmup "inverse_sqrt" --schedule inverse_sqrt -- \
	0=0.05 3=0.025 15=0.0125 "23=0.05/sqrt(24)"

# ---- 2. the lr applied: PyTorch with the same schedule ----
# the initial weights (every run above started from the same seed's)
if [ "${DP_LIST:-0}" != 1 ] && { case_match torch-wsd || case_match torch-step || case_match torch-wsd-late; }; then
	mpi 1 "$T/constant.bin" --steps 0 --quiet --save-full "$T/init.st" >"$T/init.log" 2>&1 ||
		{ cat "$T/init.log"; fail "--save-full"; }
fi
# torch_case NAME TORCH-ARGS...: $T/NAME.torch, the same steps in PyTorch
# (queued: the three run in one process, tests/torch_jobs.py)
torch_case() {
	local name=$1; shift
	torch_job "$T/torch.jobs" "$T/$name.tlog" tests/torch_ref.py --init "$T/init.st" \
		--layers fc1,fc2,fc3,head --data synthetic --synth-n 4096 --seed 1234 --global-batch 128 \
		--steps $STEPS --threads 1 --optimizer sgd --lr 0.05 --out "$T/$name.torch" "$@"
}
torch_ran() { # torch_ran NAME: its queued run succeeded (else its log and a FAIL)
	[ "$(cat "$T/$1.tlog.rc" 2>/dev/null)" = 0 ] || { cat "$T/$1.tlog"; fail "$1: torch_ref.py"; return 1; }
}
case_on torch-wsd && torch_case wsd --schedule wsd --warmup 2 --stable 6 --decay 10 --min-lr 0.001
case_on torch-step && torch_case step --schedule step --every 5 --gamma 0.5
case_on torch-wsd-late && torch_case wsd-late --schedule wsd --warmup 2 --stable 7 --decay 10 --min-lr 0.001
[ ! -s "$T/torch.jobs" ] || $PY tests/torch_jobs.py "$T/torch.jobs" || fail "tests/torch_jobs.py"
if case_ran torch-wsd; then
	if torch_ran wsd &&
		$PY tests/compare.py losses "$T/wsd.loss" "$T/wsd.torch" --rtol 2e-4 --atol 0 >"$T/wsd.cmp"; then
		ok "wsd: $STEPS losses agree with PyTorch's under the same schedule"
	else
		fail "wsd: losses differ from PyTorch's"; tail -n 3 "$T/wsd.cmp"
	fi
fi
if case_ran torch-step; then
	if torch_ran step &&
		$PY tests/compare.py losses "$T/step.loss" "$T/step.torch" --rtol 2e-4 --atol 0 >"$T/step.cmp"; then
		ok "step: $STEPS losses agree with PyTorch's under the same schedule"
	else
		fail "step: losses differ from PyTorch's"; tail -n 3 "$T/step.cmp"
	fi
fi
# the comparison can fail: the decay one step later
if case_ran torch-wsd-late; then
	if torch_ran wsd-late &&
		$PY tests/compare.py losses "$T/wsd.loss" "$T/wsd-late.torch" --rtol 2e-4 --atol 0 >/dev/null; then
		fail "a wsd decay one step later is detected"
	else
		ok "a wsd decay one step later is detected"
	fi
fi

# ---- 3. --steps shorter than the schedule ----
if case_on short-steps-warning; then
	mpi 1 "$T/wsd.bin" --steps 10 --quiet --eval-every 0 >"$T/short.out" 2>"$T/short.err"
	if grep -q "warning: --steps 10 ends the run before its wsd schedule does (18 steps): the last lr is 0.0451, not min_lr 0.001" "$T/short.err"; then
		ok "--steps shorter than a wsd schedule warns with its last lr and floor"
	else
		fail "no --steps warning for wsd"; cat "$T/short.err"
	fi
fi

finish schedules
