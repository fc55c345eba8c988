#!/usr/bin/env bash
# tests/resume.sh - training-state checkpoints and resume (issue 13;
# docs/CHECKPOINTS.md).
#
#  - models/mlp.dp and models/gpt2-tiny.dp at 2 ranks, both forms (full,
#    sharded): 40 steps straight against 20 steps, a checkpoint, and
#    --resume to 40. The --losses files (the resumed run continues the
#    interrupted one's file) and the final parameters are identical bytes.
#  - Loading reshards: full_shard at 3 ranks -> zero2 at 2 ranks (mlp,
#    global batch 96) and tp=2 -> 1 rank (gpt2-tiny, sharded form) against
#    an uninterrupted 1-rank run, within the equivalence tests' tolerances
#    (losses rtol 1e-5, parameters atol 1e-6 + rtol 1e-4).
#  - A full checkpoint's model.safetensors is --save-full's file.
#  - save_every and keep_last from the DSL: the newest K are kept, latest
#    names the newest, nothing .dptmp is left.
#  - Refused: another model (naming the parameter that differs), another
#    seed, a directory without a checkpoint, an incomplete checkpoint.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
export OMPI_MCA_orte_execute_quiet=1

gpt_text "$T/gpt.dp"

# run NAME NP STEPFILE ARGS...: dpexec on NP ranks, output in $T/NAME.out
run() {
	local name=$1 np=$2 bin=$3; shift 3
	mpi "$np" "$bin" --quiet --eval-every 0 "$@" >"$T/$name.out" 2>&1 ||
		{ fail "$name: dpexec exited $?"; sed 's/^/      /' "$T/$name.out" | tail -n 5; return 1; }
}
same_bytes() { # same_bytes WHAT A B
	if cmp -s "$2" "$3"; then ok "$1"; else fail "$1"; cmp "$2" "$3" | head -n 2; fi
}

# ---- bitwise resume at the same layout ----
"$DPC" models/mlp.dp --world-size 2 -o "$T/mlp.bin" >/dev/null || fail "dpc mlp"
"$DPC" "$T/gpt.dp" --world-size 2 -o "$T/gpt.bin" >/dev/null || fail "dpc gpt"
# resumed MODEL FORM: MODEL 20 steps, a FORM checkpoint in $T/MODEL-FORM,
# --resume to 40; and (once) the straight run of 40 it must equal
resumed() {
	local m=$1 form=$2 n=$1-$2
	once "$m-straight" run "$m-straight" 2 "$T/$m.bin" --steps 40 --losses "$T/$m-straight.loss" \
		--save-full "$T/$m-straight.st"
	run "$n-a" 2 "$T/$m.bin" --steps 20 --losses "$T/$n.loss" --save-dir "$T/$n" --save-form $form &&
	run "$n-b" 2 "$T/$m.bin" --steps 40 --losses "$T/$n.loss" --resume "$T/$n" --save-full "$T/$n.st" \
		--save-form $form
}
for m in mlp gpt; do
	for form in full sharded; do
		n=$m-$form
		case_on "$n" || continue
		once "$n" resumed $m $form || continue
		grep -q "resumed from $T/$n/step-000020" "$T/$n-b.out" || fail "$n: no 'resumed from' line"
		same_bytes "$m, $form checkpoint: 20 + --resume 20 steps give the straight run's 40 losses, bit for bit" \
			"$T/$n.loss" "$T/$m-straight.loss"
		same_bytes "$m, $form checkpoint: and its final parameters" "$T/$n.st" "$T/$m-straight.st"
	done
done
# the full form's model.safetensors is --save-full's file (the resumed run
# saved step 40 in the directory it resumed from)
if case_on full-model-safetensors; then
	once mlp-full resumed mlp full
	same_bytes "a full checkpoint's model.safetensors is --save-full's file (DSL names, loads in PyTorch)" \
		"$T/mlp-full/step-000040/model.safetensors" "$T/mlp-straight.st"
fi
if ! case_on sharded-files; then
	:
elif once mlp-sharded resumed mlp sharded; [ "$(ls "$T/mlp-sharded/step-000020")" = "$(printf 'shard-00000-of-00002.safetensors\nshard-00001-of-00002.safetensors\nstate.json')" ]; then
	ok "a sharded checkpoint is one file per rank and state.json"
else
	fail "sharded checkpoint files: $(ls "$T/mlp-sharded/step-000020" | tr '\n' ' ')"
fi

# ---- loading reshards ----
# close WHAT A B: losses and final parameters of runs A and B agree
# (the equivalence tests' tolerances)
close() {
	if $PY tests/compare.py losses "$T/$2.loss" "$T/$3.loss" --rtol 1e-5 --atol 0 \
		--and params "$T/$2.st" "$T/$3.st" --rtol 1e-4 --atol 1e-6 >"$T/$2.cmp"; then
		ok "$1 ($(grep ' loss:' "$T/$2.cmp" | sed 's/^ *//'))"
	else
		fail "$1"; cat "$T/$2.cmp"
	fi
}
for f in fs:full_shard z2:zero2 ref:ddp; do
	variant models/mlp.dp "$T/mlp96-${f%%:*}.dp" 's/global_batch 128/global_batch 96/' "s/strategy ddp/strategy ${f#*:}/"
done
# (ddp into ddp: sed changes nothing but global_batch; variant insists on a change, which it has)
if case_on reshard-full_shard3-zero2-2; then
	"$DPC" "$T/mlp96-fs.dp" --world-size 3 -o "$T/fs3.bin" >/dev/null &&
	"$DPC" "$T/mlp96-z2.dp" --world-size 2 -o "$T/z22.bin" >/dev/null &&
	"$DPC" "$T/mlp96-ref.dp" --world-size 1 -o "$T/ref1.bin" >/dev/null || fail "dpc mlp96"
	run fs3 3 "$T/fs3.bin" --steps 20 --losses "$T/fs-z2.loss" --save-dir "$T/fs3" &&
	run z22 2 "$T/z22.bin" --steps 40 --losses "$T/fs-z2.loss" --resume "$T/fs3" --save-full "$T/fs-z2.st"
	run ref1 1 "$T/ref1.bin" --steps 40 --losses "$T/ref1.loss" --save-full "$T/ref1.st"
	close "full_shard at 3 ranks -> zero2 at 2 ranks matches 1 rank" fs-z2 ref1
fi
{ echo "mesh tp=2"; grep -v '^mesh ' "$T/gpt.dp"; } >"$T/gpt-tp2.dp"
if case_on reshard-tp2-1; then
	"$DPC" "$T/gpt-tp2.dp" --world-size 2 -o "$T/gtp2.bin" >/dev/null &&
	"$DPC" "$T/gpt.dp" --world-size 1 -o "$T/g1.bin" >/dev/null || fail "dpc gpt tp"
	# (10 + 10 steps: tp's bqkv gradients are tiny and their float noise grows,
	# ~5e-6 apart from 1 rank after 40 uninterrupted steps; 3e-7 after 20)
	run gtp2 2 "$T/gtp2.bin" --steps 10 --losses "$T/tp-1.loss" --save-dir "$T/gtp" --save-form sharded &&
	run g1b 1 "$T/g1.bin" --steps 20 --losses "$T/tp-1.loss" --resume "$T/gtp/latest" --save-full "$T/tp-1.st"
	run g1 1 "$T/g1.bin" --steps 20 --losses "$T/g1.loss" --save-full "$T/g1.st"
	close "gpt2-tiny tp=2 (sharded checkpoint) -> 1 rank matches 1 rank" tp-1 g1
fi

# ---- save_every and keep_last in the DSL ----
if case_on save-every; then
	variant models/mlp.dp "$T/every.dp" 's/^  seed 1234/  seed 1234\n  save_every 5\n  keep_last 2/'
	"$DPC" "$T/every.dp" --world-size 2 -o "$T/every.bin" >/dev/null || fail "dpc every"
	(cd "$T" && env $MPI_ASAN timeout 300 mpirun --oversubscribe -np 2 "$DPEXEC" every.bin --steps 17 \
		--quiet --eval-every 0 >every.out 2>&1) || fail "save_every run"
	if [ "$(ls "$T/checkpoints" | tr '\n' ' ')" = "latest step-000015 step-000017 " ] &&
		[ "$(cat "$T/checkpoints/latest")" = step-000017 ]; then
		ok "save_every 5, keep_last 2: checkpoints/ holds steps 15 and 17 (the end), latest names 17"
	else
		fail "save_every/keep_last: $(ls "$T/checkpoints" | tr '\n' ' ') latest=$(cat "$T/checkpoints/latest" 2>/dev/null)"
	fi
fi

# ---- refusals ----
variant models/mlp.dp "$T/wider.dp" 's/param w: f32\[784, 256\]/param w: f32[784, 300]/' \
	's/param b: f32\[256\]      init zeros/param b: f32[300]      init zeros/' \
	's/param w: f32\[256, 128\]/param w: f32[300, 128]/'
"$DPC" "$T/wider.dp" --world-size 2 -o "$T/wider.bin" >/dev/null || fail "dpc wider"
if case_on refuse-model; then
	once mlp-full resumed mlp full
	expect "a resume with another model is refused, naming what differs" \
		"parameter 'fc1.w' is [784,256] in the checkpoint, [784,300] in this model" \
		mpi 2 "$T/wider.bin" --steps 30 --resume "$T/mlp-full"
fi
variant models/mlp.dp "$T/seed.dp" 's/^  seed 1234/  seed 99/'
"$DPC" "$T/seed.dp" --world-size 2 -o "$T/seed.bin" >/dev/null || fail "dpc seed"
if case_on refuse-seed; then
	once mlp-full resumed mlp full
	expect "a resume with another seed is refused" "its seed is 1234, this step file's 99" \
		mpi 2 "$T/seed.bin" --steps 30 --resume "$T/mlp-full"
fi
mkdir -p "$T/empty"
case_on refuse-empty && expect "--resume of a directory without a checkpoint" "no checkpoint there" \
	mpi 2 "$T/mlp.bin" --steps 30 --resume "$T/empty"
if case_on refuse-incomplete; then
	once mlp-sharded resumed mlp sharded
	cp -r "$T/mlp-sharded/step-000020" "$T/cut"
	truncate -s 1000 "$T/cut/shard-00000-of-00002.safetensors"
	expect "an incomplete checkpoint is not loaded" "shard-00000-of-00002.safetensors has 1000 bytes" \
		mpi 2 "$T/mlp.bin" --steps 30 --resume "$T/cut"
	if grep -q "error" "$T/out" && [ "$(grep -c "error" "$T/out")" = 1 ]; then
		ok "the error is printed once, by one rank"
	else
		fail "the error is printed $(grep -c error "$T/out") times"; cat "$T/out"
	fi
fi
case_on no-temp-left && find "$T" -name "*.dptmp" | grep -q . && fail "temp files left: $(find "$T" -name '*.dptmp')"

finish resume
