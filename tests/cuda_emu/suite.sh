# shellcheck shell=bash
# tests/cuda_emu/suite.sh - what the emulator's two suites share (sourced by
# tests/cuda_emu.sh and tests/cuda_emu_mutations.sh after tests/lib.sh):
# how they start build-emu/dpexec, their one compare process, and the model
# of the norms' paired backward.

# emu_launch NP: the launcher words for NP ranks of build-emu/dpexec: none
# for one rank (MPI's singleton start, as lib.sh's mpi() starts the CPU's
# runs: the same program without mpirun's start-up, and without the 2 s
# mpirun waits (odls_base_sigkill_timeout) after a rank exits non-zero,
# which every mutant caught by a diagnosis does; `mpirun -np 1` itself is
# runtime_errors.sh's and durability.sh's to check), else
# `mpirun --oversubscribe -np NP`
emu_launch() {
	[ "$1" = 1 ] || echo "mpirun --oversubscribe -np $1"
}

# cmp_start: one tests/compare.py for the whole suite (compare_serve.py, a
# coprocess: its fds are not passed to the commands the suite runs), where
# ~300 comparisons each paid Python's and numpy's start-up (~0.2 CPU-s, more
# than a small case's emulated run); cmp_stop ends it and waits for it, so
# that its CPU is the suite's (tests/run.sh's `times`)
# With lanes (tests/lib.sh's lane: DP_LANES > 1) the comparisons come from
# background shells, which a coprocess's fds do not reach: its two pipes
# are copied to plain fds (CMP_W, CMP_R), which they inherit, and each
# request and its answer are one turn under a lock (flock on CMP_LOCK), so
# no lane reads another's answer. cmp_stop waits for the lanes first.
cmp_start() {
	coproc CMPSRV { exec "$PY" "$ROOT/tests/cuda_emu/compare_serve.py"; }
	if [ "${DP_LANES:-1}" -gt 1 ]; then
		exec {CMP_W}>&"${CMPSRV[1]}" {CMP_R}<&"${CMPSRV[0]}"
		CMP_LOCK=${T:-/tmp}/cmp.lock
	fi
}
cmp_stop() {
	lane_drain
	[ -n "${CMPSRV_PID:-}" ] || return 0
	local pid=$CMPSRV_PID fd=${CMPSRV[1]}
	if [ -n "${CMP_W:-}" ]; then
		exec {CMP_W}>&- {CMP_R}<&-
		CMP_W=""
	fi
	exec {fd}>&- # (its stdin: it ends)
	wait "$pid" 2>/dev/null
	return 0
}
# pycmp OUT WORDS...: `tests/compare.py WORDS... >OUT`, its exit status, in
# the suite's one compare process (started alone if that one is gone)
pycmp() {
	local out=$1 rc IFS=$'\x1f'
	shift
	if [ -n "${CMP_W:-}" ]; then
		if { flock 9 && printf '%s\n' "$out$IFS$*" >&"$CMP_W" && read -r rc <&"$CMP_R"; } 9>"$CMP_LOCK" 2>/dev/null &&
			[ -n "$rc" ]; then
			return "$rc"
		fi
	elif [ -n "${CMPSRV_PID:-}" ] && { printf '%s\n' "$out$IFS$*" >&"${CMPSRV[1]}"; } 2>/dev/null &&
		read -r rc <&"${CMPSRV[0]}" && [ -n "$rc" ]; then
		return "$rc"
	fi
	IFS=$' \t\n'
	$PY "$ROOT/tests/compare.py" "$@" >"$out"
}

# norm_res_model NORM C > FILE: a norm (layernorm or rmsnorm) of C columns
# between a learned bias and a residual add, trained by SGD on 128 rows of
# synthetic data: its dx is a layernorm_grad_add (rmsnorm_grad_add) beside
# the layernorm_grad_gb (rmsnorm_grad_g) that runtime/cuda/norm.cu pairs
# with it (docs/CUDA.md, "LayerNorm's backward in one pass")
norm_res_model() {
	local call="layernorm(s, g, b)" beta="    param b: f32[$2] init normal(0, 0.3)"
	[ "$1" = rmsnorm ] && call="rmsnorm(s, g)" beta=
	cat <<MODEL
mesh dp_replicate=1, dp_shard=1
data {
  x: f32[batch, $2] from synthetic(n=128, classes=4)
  y: i32[batch]      from synthetic(n=128, classes=4)
}
model {
  block pre {
    param p: f32[$2] init normal(0, 0.3)
    s = add(x, p)
  }
  block ln {
    param g: f32[$2] init normal(1, 0.3)
${beta:+$beta
}    h = add(s, $call)
  }
  block head {
    param w: f32[$2, 4] init normal(0, 0.05)
    logits = linear(h, w)
  }
  loss = cross_entropy(logits, y)
}
train {
  strategy ddp
  optimizer sgd(lr=0.1)
  micro_batch 128
  seed 3
}
MODEL
}
