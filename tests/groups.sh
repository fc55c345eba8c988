#!/usr/bin/env bash
# tests/groups.sh - optimizer groups (docs/DSL.md's "Optimizer groups"): train's
# `no_decay vectors`, a block's own `weight_decay` and `lr_scale`.
#
# The model is models/gpt2-tiny.dp on the GPL-3 text with the test's AdamW
# (weight_decay 0.1, tests/lib.sh's OPT), its own `no_decay vectors` (the
# biases and layernorm gains: no decay), block embed's `weight_decay 1.0` and block
# lnf's `lr_scale 0.5`: four groups, and under full_shard each h.N block is
# two units (h.N, h.N.g1).
# Cases:
#   torch       20 losses at 1 rank against tests/torch_gpt.py with the same
#               groups as PyTorch param groups (--no-decay vectors
#               --block-weight-decay embed=1.0 --lr-scale lnf=0.5), rtol
#               2e-4 as tests/transformer.sh (measured: 1.4e-7);
#   torch-no-groups, torch-no-vectors, torch-no-block-decay, torch-no-lr-scale
#               PyTorch with one group, or without one of the three rules,
#               must NOT match: the comparison sees each of them (measured:
#               1.1e-2, 4.2e-4, 4.9e-3, 7.2e-3 relative against rtol 2e-4);
#   ddp-np2, zero1-np2, zero2-np2, full_shard-np2, hybrid-np4, tp2,
#   tp2-full_shard-np4
#               each strategy (ddp with small buckets; tp=2, alone and with
#               full_shard, whose units are per tp split and group) against 1 rank
#               over 8 steps, as tests/tp.sh (eq_same: losses
#               rtol 1e-5, parameters atol 1e-6 + rtol 1e-4): a cut unit
#               updates every rank's chunk with its one group's values;
#   resume      full_shard at 2 ranks, 10 steps + --resume 10 steps equal 20
#               straight, bit for bit (the checkpoint holds every group's
#               optimizer state through the split update's views);
#   reshard     full_shard at 2 ranks, a sharded checkpoint after 4 steps,
#               resumed by 1 rank of ddp to 8: matches 1 rank (eq_same).
set -u
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=tests/lib.sh
. tests/lib.sh
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=8      # the strategies against 1 rank, as tests/tp.sh
TSTEPS=20    # against PyTorch, as tests/transformer.sh

if ! have_torch; then
	fail "python3-torch missing (make deps)"; finish groups; exit 1
fi
gpt_text "$T/base.dp"
# the groups, and the test's optimizer, schedule and batch (strategy: ddp)
variant "$T/base.dp" "$T/g1.dp" "s/^  optimizer .*/  $OPT/" \
	"s/^  schedule .*/  $SCHED/" "s/^  global_batch .*/  global_batch $GB/" \
	's/^  block embed {/&\n    weight_decay 1.0/' 's/^  block lnf {/&\n    lr_scale 0.5/'
# (TORCH_OPT has --no-decay vectors: the model's own no_decay)
GROUPS_TORCH=(--block-weight-decay embed=1.0 --lr-scale lnf=0.5)

once_ref() { eq_run ref 1 "$T/g1.dp"; }
once_ref20() { STEPS=$TSTEPS eq_run ref20 1 "$T/g1.dp"; }
torch_run() { # torch_run OUT [torch_gpt.py args...]: queued for tests/torch_jobs.py below
	local out=$1; shift
	# shellcheck disable=SC2086
	torch_job "$T/torch.jobs" "$out.log" tests/torch_gpt.py --model gpt2 --heads 4 --init "$T/init.st" \
		--data "$T/text.bin" --steps $TSTEPS --threads 1 $TORCH_OPT --out "$out" "$@"
}
torch_ran() { # torch_ran OUT: its queued run succeeded (else its log and a FAIL)
	[ "$(cat "$1.log.rc" 2>/dev/null)" = 0 ] || { cat "$1.log"; fail "torch_gpt.py"; return 1; }
}
torch_init() {
	"$DPC" "$T/g1.dp" --world-size 1 -o "$T/init.bin" 2>/dev/null &&
		mpi 1 "$T/init.bin" --steps 0 --eval-every 0 --quiet --save-full "$T/init.st" >/dev/null 2>&1 ||
		{ fail "the initial weights"; return 1; }
}

# the PyTorch runs of the torch cases (dp's first, from the same initial
# weights torch reads), in one process: one import of torch
# (torch-no-groups: none of the rules; torch-no-vectors: decay on the 1-D
# params; torch-no-block-decay: embed at the optimizer's 0.1;
# torch-no-lr-scale: lnf at lr)
torch_case() { # torch_case CASE [torch_gpt.py args...]
	local name=$1; shift
	case_on "$name" && once init torch_init && once ref20 once_ref20 && torch_run "$T/$name.torch" "$@"
}
torch_case torch "${GROUPS_TORCH[@]}"
torch_case torch-no-groups --no-decay none
torch_case torch-no-vectors "${GROUPS_TORCH[@]}" --no-decay none
torch_case torch-no-block-decay --lr-scale lnf=0.5
torch_case torch-no-lr-scale --block-weight-decay embed=1.0
[ ! -s "$T/torch.jobs" ] || $PY tests/torch_jobs.py "$T/torch.jobs" || fail "tests/torch_jobs.py"

if case_ran torch && once init false && once ref20 false && torch_ran "$T/torch.torch"; then
	if $PY tests/compare.py losses "$T/ref20.loss" "$T/torch.torch" --rtol 2e-4 --atol 0 >"$T/torch.cmp"; then
		ok "1 rank with 4 optimizer groups: $TSTEPS losses agree with PyTorch param groups ($(awk '/ loss:/ {print $8}' "$T/torch.cmp") relative)"
	else
		cat "$T/torch.cmp"; paste "$T/ref20.loss" "$T/torch.torch" | head -n 5
		fail "losses differ from PyTorch's param groups"
	fi
fi
# each rule must show: PyTorch without it must not match
torch_differs() { # torch_differs CASE WHAT
	local name=$1 what=$2
	case_ran "$name" && once init false && once ref20 false && torch_ran "$T/$name.torch" || return 0
	if $PY tests/compare.py losses "$T/ref20.loss" "$T/$name.torch" --rtol 2e-4 --atol 0 >"$T/$name.cmp"; then
		fail "PyTorch $what matches too: the comparison does not see it"
	else
		ok "PyTorch $what is told apart ($(awk '/ loss:/ {print $8}' "$T/$name.cmp") relative)"
	fi
}
torch_differs torch-no-groups "with one group"
torch_differs torch-no-vectors "with decay on the 1-D params"
torch_differs torch-no-block-decay "without embed's own weight_decay"
torch_differs torch-no-lr-scale "without lnf's lr_scale"

# eq_case NAME NP SED...: the model under the sed edits at NP ranks equals 1 rank
eq_case() {
	local name=$1 np=$2; shift 2
	case_on "$name" || return 0
	once ref once_ref || return
	variant "$T/g1.dp" "$T/$name.dp" "$@"
	eq_run "$name" "$np" "$T/$name.dp" && eq_same "$name" ref
}
# (the model's mesh is inferred: dp_shard = the world size)
eq_case ddp-np2 2 's/^  strategy ddp/  strategy ddp\n  bucket_mb 0.1/'
eq_case zero1-np2 2 's/^  strategy ddp/  strategy zero1/'
eq_case zero2-np2 2 's/^  strategy ddp/  strategy zero2/'
eq_case full_shard-np2 2 's/^  strategy ddp/  strategy full_shard/'
eq_case hybrid-np4 4 '1i mesh dp_replicate=2, dp_shard=2' 's/^  strategy ddp/  strategy hybrid_shard/'
eq_case tp2 2 '1i mesh tp=2'
eq_case tp2-full_shard-np4 4 '1i mesh tp=2, dp_shard=2' 's/^  strategy ddp/  strategy full_shard/'

if case_on resume; then
	variant "$T/g1.dp" "$T/rs.dp" 's/^  strategy ddp/  strategy full_shard/'
	if "$DPC" "$T/rs.dp" --world-size 2 -o "$T/rs.bin" 2>"$T/rs.log" &&
		mpi 2 "$T/rs.bin" --steps 20 --quiet --eval-every 0 --losses "$T/rs-straight.loss" \
			--save-full "$T/rs-straight.st" >>"$T/rs.log" 2>&1 &&
		mpi 2 "$T/rs.bin" --steps 10 --quiet --eval-every 0 --losses "$T/rs.loss" --save-dir "$T/rs" \
			>>"$T/rs.log" 2>&1 &&
		mpi 2 "$T/rs.bin" --steps 20 --quiet --eval-every 0 --losses "$T/rs.loss" --resume "$T/rs" \
			--save-full "$T/rs.st" >>"$T/rs.log" 2>&1; then
		if same_run "$T/rs" "$T/rs-straight"; then
			ok "full_shard with groups: 10 + --resume 10 steps are the straight 20, bit for bit"
		else
			paste "$T/rs.loss" "$T/rs-straight.loss" | tail -n 5
			fail "full_shard with groups: the resumed run differs from the straight one"
		fi
	else
		tail -n 20 "$T/rs.log"; fail "resume runs"
	fi
fi
if case_on reshard; then
	# the groups' state saved as full_shard shards (h.N and h.N.g1 units) and
	# loaded by 1 rank of ddp (one flat buffer): every element's moments
	# follow its parameter, whatever the update's split
	variant "$T/g1.dp" "$T/fs.dp" 's/^  strategy ddp/  strategy full_shard/'
	once ref once_ref
	if "$DPC" "$T/fs.dp" --world-size 2 -o "$T/fs2.bin" 2>"$T/fs.log" &&
		"$DPC" "$T/g1.dp" --world-size 1 -o "$T/one.bin" 2>>"$T/fs.log" &&
		mpi 2 "$T/fs2.bin" --steps 4 --quiet --eval-every 0 --losses "$T/fs1.loss" --save-dir "$T/fsck" \
			--save-form sharded >>"$T/fs.log" 2>&1 &&
		mpi 1 "$T/one.bin" --steps $STEPS --quiet --eval-every 0 --losses "$T/fs1.loss" \
			--resume "$T/fsck/latest" --save-full "$T/fs1.st" >>"$T/fs.log" 2>&1; then
		eq_same fs1 ref
	else
		tail -n 20 "$T/fs.log"; fail "reshard runs"
	fi
fi
finish groups
