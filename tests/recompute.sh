#!/usr/bin/env bash
# tests/recompute.sh - activation recompute (issue 16): a recomputed block
# runs the same kernels on the same operands, so losses and final parameters
# must be BITWISE equal to the run without recompute (cmp of the --losses
# files, written with %.9g, and of the --save-full safetensors), at 1, 2 and 4
# ranks, ddp and full_shard, at tp=2 and tp=2 x full_shard; models/gpt2-tiny.dp
# with `gradient_checkpointing true` (every layer made by repeat) and
# models/llama.dp with `recompute true` in one block. And the compile-time
# effects: under full_shard the recomputed forward reuses the backward
# all_gather (the all_gather count does not change) and the arena shrinks
# (the activations live only until the end of their block's forward).
set -u
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=${STEPS:-6}

text_shard

# make NAME SRC MESH STRATEGY RECOMPUTE: SRC on MESH ("" keeps mesh auto) with
# STRATEGY, and with train's gradient_checkpointing when RECOMPUTE is 1
make_dp() {
	local name=$1 src=$2 mesh=$3 strat=$4 rc=$5 ck=""
	[ "$rc" = 1 ] && ck='\n  gradient_checkpointing true'
	{ [ -n "$mesh" ] && echo "mesh $mesh"; grep -v '^mesh ' "$src"; } |
		sed -e "$data" -e "s/^  strategy .*/  strategy $strat$ck/" >"$T/$name.dp"
	if [ -z "$mesh" ]; then
		{ echo "mesh auto"; cat "$T/$name.dp"; } >"$T/$name.tmp" && mv "$T/$name.tmp" "$T/$name.dp"
	fi
}

# same NAME NP SRC MESH STRATEGY: run without and with recompute; bitwise equal
same() {
	local name=$1 np=$2 src=$3 mesh=$4 strat=$5
	case_on "$name" || return 0
	make_dp "$name" "$src" "$mesh" "$strat" 0
	make_dp "$name-rc" "$src" "$mesh" "$strat" 1
	grep -q "gradient_checkpointing true" "$T/$name-rc.dp" || { fail "$name: no setting"; return; }
	eq_run "$name" "$np" "$T/$name.dp" || return
	eq_run "$name-rc" "$np" "$T/$name-rc.dp" || return
	if ! "$DPC" "$T/$name-rc.dp" --world-size "$np" --emit=ir | grep -q ' recompute '; then
		fail "$name: the recompute run has no recomputed node"
	elif same_run "$T/$name" "$T/$name-rc"; then
		ok "$name ($np ranks, $strat): recompute is bitwise equal ($(wc -l <"$T/$name.loss") losses, parameters)"
	else
		paste "$T/$name.loss" "$T/$name-rc.loss" | head -3
		fail "$name ($np ranks, $strat): recompute differs"
	fi
}

gpt=models/gpt2-tiny.dp
same gpt-1 1 "$gpt" "" ddp
same gpt-ddp2 2 "$gpt" "" ddp
same gpt-ddp4 4 "$gpt" "" ddp
same gpt-fs2 2 "$gpt" "" full_shard
same gpt-fs4 4 "$gpt" "" full_shard
same gpt-tp2 2 "$gpt" "tp=2" ddp
same gpt-tp2fs2 4 "$gpt" "tp=2, dp_shard=2" full_shard

# llama: one block recomputed by its own setting (rmsnorm, rope, silu)
variant models/llama.dp "$T/llama.dp" "$data"
variant "$T/llama.dp" "$T/llama-rc.dp" '0,/^    block h\[i\] {/s//    block h[i] {\n      recompute true/'
if case_on llama; then
	eq_run llama 2 "$T/llama.dp" && eq_run llama-rc 2 "$T/llama-rc.dp" &&
		if same_run "$T/llama" "$T/llama-rc"; then
			ok "llama (2 ranks): a block's own recompute is bitwise equal"
		else
			fail "llama (2 ranks): recompute differs"
		fi
fi

# full_shard: no extra gather, a smaller arena
if case_on full_shard-ir; then
	make_dp ir "$gpt" "" full_shard 0
	make_dp ir-rc "$gpt" "" full_shard 1
	ag() { "$DPC" "$1" --world-size 2 --emit=ir | grep -c '= all_gather '; }
	arena() { "$DPC" "$1" --world-size 2 --emit=stats | awk '/^total \(arena size\)/ {print $4}'; }
	a0=$(ag "$T/ir.dp"); a1=$(ag "$T/ir-rc.dp")
	if [ -n "$a0" ] && [ "$a0" = "$a1" ]; then
		ok "full_shard: recompute adds no all_gather ($a0 in both)"
	else
		fail "full_shard: all_gathers $a0 without recompute, $a1 with"
	fi
	m0=$(arena "$T/ir.dp"); m1=$(arena "$T/ir-rc.dp")
	if [ -n "$m0" ] && [ -n "$m1" ] && [ "$m1" -lt "$m0" ]; then
		ok "full_shard: the arena shrinks with recompute ($m0 -> $m1 bytes)"
	else
		fail "full_shard: arena $m0 without recompute, $m1 with"
	fi
fi
finish recompute
