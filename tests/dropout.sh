#!/usr/bin/env bash
# tests/dropout.sh - dropout (issue 29 item 4) does not depend on the world
# size: its mask is keyed by (seed, step, the sample's dataset index, the
# element's index within the sample) through Philox4x32-10 (runtime/dropout.h;
# tests/cpu_kernels_test.c checks the known answers, the keep rate and the
# keys), so every layout computes the same mathematics as one rank.
#
# Model: models/gpt2-tiny.dp with dropout(p=0.1) on the embeddings and on both
# residual branches of every layer (GPT-2's resid_pdrop and embd_pdrop), on a
# byte-level shard of the GPL-3 text, STEPS steps. Against its 1-rank run:
#   - 2 ranks ddp, 4 ranks full_shard, grad_accum 2 at 2 ranks (another
#     micro-batch split), tp=2, cp=2 (the mask at each token's global
#     position), cp=2 x tp=2: losses (rtol 1e-5) and final parameters (atol
#     1e-6 + rtol 1e-4), the equivalence suites' bounds;
#   - recompute (gradient_checkpointing): bitwise the same losses (the
#     recomputed forward makes the same masks);
#   - resume: 3 steps, a checkpoint, --resume to 6 at 2 ranks give the
#     straight 6 steps' losses bit for bit (the masks of steps 4-6 are keyed
#     by the steps the resumed run counts from);
#   - the dropouts do something: the losses differ from gpt2-tiny's, and a
#     run with another seed for the masks alone is not compared (the seed
#     also initialises the weights);
#   - eval is without dropout: at lr 1e-30 (the weights stay put) the eval
#     loss equals gpt2-tiny's, bit for bit.
set -u
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=${STEPS:-6}

text_shard
gpt=$T/gpt.dp
variant models/gpt2-tiny.dp "$gpt" "$data"
drop=$T/drop.dp
dropout_variant "$gpt" "$drop"
mesh() { # mesh DST MESH-LINE STRATEGY [SED...]: the dropout model on that mesh
	local dst=$1 m=$2 strat=$3
	shift 3
	{ echo "mesh $m"; grep -v '^mesh ' "$drop"; } | sed -e "s/^  strategy .*/  strategy $strat/" "$@" >"$dst"
}
ref() { once drop-1 eq_run drop-1 1 "$drop"; }
for c in "drop-2|dp_shard=2|ddp|2" "drop-fs4|dp_shard=4|full_shard|4" \
	"drop-ga2|dp_shard=2|ddp|2|s/^  global_batch 16/&\n  grad_accum 2/" \
	"drop-tp2|tp=2|ddp|2" "drop-cp2|cp=2|ddp|2" "drop-cp2tp2|cp=2, tp=2|ddp|4"; do
	IFS='|' read -r name m strat np sed <<<"$c"
	mesh "$T/$name.dp" "$m" "$strat" ${sed:+-e "$sed"}
	case_on "$name" || continue
	ref
	eq_run "$name" "$np" "$T/$name.dp" && eq_same "$name" drop-1
done
if case_on drop-ga2; then
	grep -q "^  grad_accum 2" "$T/drop-ga2.dp" || fail "drop-ga2 has grad_accum 2"
fi

# recompute: the same masks made again, bitwise
if case_on drop-recompute; then
	ref
	variant "$drop" "$T/drop-rc.dp" 's/^  strategy ddp/&\n  gradient_checkpointing true/'
	if eq_run drop-rc 1 "$T/drop-rc.dp" && cmp -s "$T/drop-rc.loss" "$T/drop-1.loss"; then
		ok "recompute with dropout: the losses bitwise the run without"
	else
		fail "recompute with dropout: the losses bitwise the run without"
	fi
fi

# resume: the masks after a checkpoint are the straight run's
if case_on drop-resume; then
	"$DPC" "$drop" --world-size 2 -o "$T/drop-r.bin" >"$T/drop-r.dpc" 2>&1 || fail "drop-resume: dpc"
	for r in straight a b; do
		case $r in
		straight) args=(--steps 6 --losses "$T/drop-straight.loss") ;;
		a) args=(--steps 3 --losses "$T/drop-resumed.loss" --save-dir "$T/drop-ck") ;;
		b) args=(--steps 6 --losses "$T/drop-resumed.loss" --resume "$T/drop-ck") ;;
		esac
		mpi 2 "$T/drop-r.bin" --quiet --eval-every 0 "${args[@]}" >"$T/drop-$r.log" 2>&1 ||
			{ tail -n 5 "$T/drop-$r.log"; fail "drop-resume: run $r"; }
	done
	if [ "$(grep -vc '^#' "$T/drop-resumed.loss")" = 6 ] &&
		cmp -s <(grep -v '^#' "$T/drop-straight.loss") <(grep -v '^#' "$T/drop-resumed.loss"); then
		ok "3 steps + --resume to 6 with dropout: the straight run's losses, bit for bit"
	else
		fail "3 steps + --resume to 6 with dropout: the straight run's losses, bit for bit"
	fi
fi

# the dropouts change the training
if case_on drop-differs; then
	ref
	eq_run gpt-1 1 "$gpt"
	if [ -s "$T/gpt-1.loss" ] && ! $PY tests/compare.py losses "$T/drop-1.loss" "$T/gpt-1.loss" \
		--rtol 1e-3 --atol 0 >/dev/null; then
		ok "dropout changes the losses"
	else
		fail "dropout changes the losses"
	fi
fi

# eval: no dropout (weights held still by lr 1e-30)
if case_on drop-eval; then
	for m in gpt drop; do
		variant "$T/$m.dp" "$T/$m-still.dp" 's/lr=[0-9.e-]*/lr=1e-30/'
		eq_run "$m-still" 1 "$T/$m-still.dp" --eval-every 2 --steps 2
	done
	e1=$(unstamp "$T/gpt-still.log" | grep "^eval step" | head -1) e2=$(unstamp "$T/drop-still.log" | grep "^eval step" | head -1)
	if [ -n "$e1" ] && [ "$e1" = "$e2" ]; then
		ok "eval without dropout ($e1)"
	else
		fail "eval without dropout ('$e1' vs '$e2')"
	fi
fi
finish dropout
