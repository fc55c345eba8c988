#!/usr/bin/env bash
# tests/runtime_errors.sh - dpexec's user errors: each run must exit non-zero
# (no hang: multi-rank runs are wrapped in `timeout 60`) with a clear message.
# Also the checkpoint round trip that --init-from errors are measured against.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"

X() { env $MPI_ASAN timeout 60 "$DPEXEC" "$@"; }
M() { local n=$1; shift; env $MPI_ASAN timeout 60 mpirun --oversubscribe -np "$n" "$DPEXEC" "$@"; }

if ! "$DPC" models/mlp.dp -o "$T/mlp1.bin" --world-size 1 >"$T/dpc.out" 2>&1; then
	fail "dpc models/mlp.dp --world-size 1"; sed 's/^/      /' "$T/dpc.out" | head
	finish runtime_errors
	exit 1
fi

if ! "$DPC" models/mlp.dp -o "$T/mlp2.bin" --world-size 2 >"$T/dpc.out" 2>&1; then
	fail "dpc models/mlp.dp --world-size 2"; sed 's/^/      /' "$T/dpc.out" | head
fi

case_on missing-step-file && expect "missing step file" "cannot open $T/none.bin" X "$T/none.bin"
head -c 300 "$T/mlp1.bin" >"$T/trunc.bin"
case_on truncated && expect "truncated step file" "truncated: expected" X "$T/trunc.bin"
case_on dp-file && expect "a .dp file is not a step file" "not a dp step file" X models/mlp.dp
case_on unknown-option && expect "unknown option" "unknown option '--bogus'" X --bogus "$T/mlp1.bin"
case_on no-step-file && expect "no step file" "no step file given" X
case_on bad-number && expect "bad number" "bad value 'many' for --steps" X --steps many "$T/mlp1.bin"
case_on device-cuda && expect "--device cuda without a GPU" "dpexec: error: --device cuda: " X --device cuda "$T/mlp1.bin"
case_on world-size && expect "world size mismatch (2 ranks, 1-rank file)" \
	"was compiled for a mesh of 1 rank (dp_replicate=1 dp_shard=1) but this run has 2; recompile with dpc --world-size 2 or run mpirun -np 1" \
	M 2 "$T/mlp1.bin" --steps 1
case_on init-from-missing && expect "--init-from a missing file" "$T/nothere.safetensors" X "$T/mlp1.bin" --init-from "$T/nothere.safetensors"
case_on init-from-missing-2ranks && expect "--init-from a missing file on 2 ranks (abort, no hang)" "nothere.safetensors" \
	M 2 "$T/mlp2.bin" --init-from "$T/nothere.safetensors" --steps 1
case_on no-value && expect "option without its value" "option '--steps' needs a value" X "$T/mlp1.bin" --steps
case_on bad-timeout && expect "bad --timeout" "bad value 'soon' for --timeout" X --timeout soon "$T/mlp1.bin"
case_on no-eval-eval-every && expect "--no-eval with --eval-every" "--no-eval and --eval-every exclude each other" \
	X "$T/mlp1.bin" --no-eval --eval-every 5
# save1: 3 steps saved, loaded and saved again ($T/a.safetensors: the broken
# checkpoints below are made from it)
save1() {
	if X "$T/mlp1.bin" --steps 3 --quiet --save-full "$T/a.safetensors" >"$T/out" 2>&1 &&
		X "$T/mlp1.bin" --steps 0 --quiet --init-from "$T/a.safetensors" --save-full "$T/b.safetensors" >>"$T/out" 2>&1 &&
		cmp -s "$T/a.safetensors" "$T/b.safetensors"; then
		ok "--save-full / --init-from round trip"
	else
		fail "--save-full / --init-from round trip"; sed 's/^/      /' "$T/out" | head
	fi
}
case_on round-trip && once save1 save1
# a 2-rank run saves the same parameters format (rank 0 writes) ($T/c.safetensors:
# the sharded round trips below load it)
save2() { M 2 "$T/mlp2.bin" --steps 2 --quiet --save-full "$T/c.safetensors" >"$T/out" 2>&1; }
case_on save-full-2ranks && once save2 check "--save-full on 2 ranks" save2

# broken checkpoints: a renamed tensor, a reshaped tensor
if case_on broken-checkpoints && once save1 save1 && [ -f "$T/a.safetensors" ]; then
	$PY - "$T/a.safetensors" "$T" <<'PYEOF'
import json, struct, sys
src, d = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); body = raw[8 + n:]
def write(path, h):
    j = json.dumps(h).encode()
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + body)
h = dict(hdr); h["head.W"] = h.pop("head.w"); write(d + "/renamed.safetensors", h)
h = dict(hdr); h["fc1.b"] = dict(h["fc1.b"], shape=[2, 128]); write(d + "/reshaped.safetensors", h)
# a tensor the model does not have, in 4 more bytes at the end of the data
h = dict(hdr); h["extra.w"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(body), len(body) + 4]}
j = json.dumps(h).encode()
open(d + "/extra.safetensors", "wb").write(struct.pack("<Q", len(j)) + j + body + b"\0\0\0\0")
PYEOF
	expect "--init-from without a parameter" "no tensor named 'head.w'" \
		X "$T/mlp1.bin" --steps 0 --init-from "$T/renamed.safetensors"
	expect "--init-from with a wrong shape" "tensor 'fc1.b' has shape [2,128], the model wants [256]" \
		X "$T/mlp1.bin" --steps 0 --init-from "$T/reshaped.safetensors"
	extra() { X "$T/mlp1.bin" --steps 0 --quiet --init-from "$T/extra.safetensors" \
		--save-full "$T/e.safetensors" >"$T/out" 2>&1 && cmp -s "$T/a.safetensors" "$T/e.safetensors"; }
	check "--init-from ignores a tensor the model does not have" extra
fi

# sharded step files: the init program cuts the shards, the export program
# gathers them; --check-grads refuses them. Under full_shard, and under
# per-block strategies (tests/lib.sh's mixed: a ddp block whole among
# sharded ones), the ddp 2-rank checkpoint loaded and saved again is the
# same file.
sed 's/strategy ddp/strategy full_shard/' models/mlp.dp >"$T/fs.dp"
mixed models/mlp.dp "$T/mixed.dp"
for v in fs mixed; do
	case_on "$v-round-trip" || continue
	once save2 check "--save-full on 2 ranks" save2
	if ! "$DPC" "$T/$v.dp" -o "$T/${v}2.bin" --world-size 2 >"$T/dpc.out" 2>&1; then
		fail "dpc $v.dp --world-size 2"; sed 's/^/      /' "$T/dpc.out" | head -n 3
		continue
	fi
	round() { M 2 "$T/${v}2.bin" --steps 0 --quiet --init-from "$T/c.safetensors" \
		--save-full "$T/$v.safetensors" >"$T/out" 2>&1 && cmp -s "$T/c.safetensors" "$T/$v.safetensors"; }
	check "$v on 2 ranks: --init-from / --save-full round trip" round
done
[ -s "$T/fs2.bin" ] || "$DPC" "$T/fs.dp" -o "$T/fs2.bin" --world-size 2 >/dev/null 2>&1 # (the loop's case did not run)
case_on check-grads-sharded && expect "--check-grads refuses a sharded step file" \
	"--check-grads needs a ddp step file: this one shards parameters (strategy full_shard" \
	M 2 "$T/fs2.bin" --check-grads
# train's strategy ddp, one block full_shard: sharded all the same
sed 's/^  block fc2 {/&\n    strategy full_shard/' models/mlp.dp >"$T/onefs.dp"
"$DPC" "$T/onefs.dp" -o "$T/onefs1.bin" --world-size 1 >"$T/dpc.out" 2>&1 || fail "dpc onefs.dp"
case_on check-grads-block && expect "--check-grads refuses a step file with a sharded block" \
	"this one shards parameters (strategy ddp, or a block's own" X "$T/onefs1.bin" --check-grads
# a 16-bit step: the forward reads rounded copies of the perturbed masters
for p in bf16 fp16; do
	case_on "check-grads-$p" || continue
	"$DPC" models/mlp.dp -o "$T/m$p.bin" --world-size 1 --precision $p >"$T/dpc.out" 2>&1 ||
		fail "dpc mlp.dp --precision $p"
	expect "--check-grads refuses a $p step file" \
		"--check-grads needs an f32 step file: this one computes in ${p/fp16/f16}" \
		X "$T/m$p.bin" --check-grads
done

# a diverging run names the step where the loss stopped being finite
sed 's/lr=1e-3/lr=1e6/; s/clip_grad_norm 1.0/clip_grad_norm 0/' models/mlp.dp >"$T/nan.dp"
if case_on non-finite && "$DPC" "$T/nan.dp" -o "$T/nan.bin" --world-size 1 >/dev/null 2>&1; then
	# (the gradient norm goes infinite first: the step that went bad is named)
	expect "a non-finite loss or gradient norm is an error with the step" \
		"is infinite at step 3; nothing was saved from it" X "$T/nan.bin" --steps 300 --quiet
fi
case_on losses-missing-dir && expect "--losses into a missing directory" "--losses: cannot write $T/no/dir/losses.txt: directory" \
	X "$T/mlp1.bin" --steps 1 --losses "$T/no/dir/losses.txt"

# a hung rank: stop one of two ranks mid-run; the other must fail within --timeout
if case_on stopped-rank; then
	( M 2 "$T/mlp2.bin" --steps 100000 --timeout 3 --log-every 100000 --eval-every 0 >"$T/hang.out" 2>&1
	  echo "rc=$?" >>"$T/hang.out" ) &
	job=$!
	for i in $(seq 60); do unstamp "$T/hang.out" | grep -q "^step 1/" && break; sleep 0.5; done # in the loop
	sleep 1
	exe=$(basename "$DPEXEC" | cut -c1-15) # ps shows at most 15 characters of a command name
	ranks=$(ps -eo pid=,ppid=,comm= | awk -v root=$job -v exe="$exe" '{p[$1]=$2; c[$1]=$3}
		END {for (k in p) {x=k; while (x in p && x!=root && x>1) x=p[x]; if (x==root && c[k]==exe) print k}}')
	victim=$(echo $ranks | awk '{print $1}')
	if [ -n "$victim" ]; then
		kill -STOP "$victim"
		t0=$(date +%s); wait $job; took=$(( $(date +%s) - t0 ))
		kill -CONT "$victim" 2>/dev/null
		if grep -q "did not complete within 3 s (--timeout)" "$T/hang.out" && ! grep -q "rc=0" "$T/hang.out" &&
			[ $took -lt 30 ]; then
			ok "a stopped rank ends the run within --timeout (${took}s)"
		else
			fail "a stopped rank ends the run within --timeout (${took}s)"; sed 's/^/      /' "$T/hang.out" | tail -n 5
		fi
	else
		wait $job
		echo "  skip hung-rank test (could not find the rank processes; run finished: $(tail -n 1 "$T/hang.out"))"
	fi
fi
finish runtime_errors
