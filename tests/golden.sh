#!/usr/bin/env bash
# tests/golden.sh - golden IR dumps: dpc's IR after chosen passes must match
# the reviewed files in tests/golden/ exactly (diff -u on any difference).
#
# Each case compiles a model with `--dump-after=PASS` and compares the output
# with tests/golden/NAME.PASS.ir. After an intended change of the IR, run
#   UPDATE=1 bash tests/golden.sh
# to rewrite the files, then READ the diff (git diff tests/golden) by eye
# before committing it: the point of a golden file is that a person checked it.
set -u
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=tests/lib.sh
. tests/lib.sh

# name | model | dpc flags | passes
cases=(
	# ddp at 2 ranks: the flat layout in backward order (layout), one
	# all_reduce per unit over a view of its gradients (collectives)
	"mlp-ws2|models/mlp.dp|--world-size 2|layout collectives"
	# issue 5: one file per strategy after the schedule pass (collectives,
	# their events, prefetch order) for mlp.dp and the 8-block mlp8.dp at
	# 4 ranks; "@STRATEGY" compiles a copy with that strategy, "@hsdp2x2"
	# hybrid_shard on an explicit dp_replicate=2 x dp_shard=2 mesh
	"mlp-ddp-ws4|models/mlp.dp|--world-size 4|schedule"
	"mlp-zero1-ws4|models/mlp.dp@zero1|--world-size 4|schedule"
	"mlp-zero2-ws4|models/mlp.dp@zero2|--world-size 4|schedule"
	"mlp-full_shard-ws4|models/mlp.dp@full_shard|--world-size 4|schedule"
	"mlp-hybrid_shard-2x2|models/mlp.dp@hsdp2x2|--world-size 4|schedule"
	"mlp8-ddp-ws4|models/mlp8.dp|--world-size 4|schedule"
	"mlp8-zero1-ws4|models/mlp8.dp@zero1|--world-size 4|schedule"
	"mlp8-zero2-ws4|models/mlp8.dp@zero2|--world-size 4|schedule"
	"mlp8-full_shard-ws4|models/mlp8.dp@full_shard|--world-size 4|schedule"
	"mlp8-hybrid_shard-2x2|models/mlp8.dp@hsdp2x2|--world-size 4|schedule"
	# per-block strategies: train's full_shard with fc1 ddp, fc2 zero1,
	# fc3 not resharded and head zero2 (tests/lib.sh's mixed)
	# (layout: the units of every strategy in one graph, their buffers)
	"mlp8-mixed-ws4|models/mlp8.dp@mixed|--world-size 4|layout schedule"
	# issue 4: one GPT-2 layer at tp=2: the tp_copy / tp_reduce the tp pass
	# placed, and where the schedule issues and waits for them
	"gpt2-tiny-tp2|models/gpt2-tiny.dp@tp2|--world-size 2 -D layers=1|tp schedule"
	# issue 16: one recomputed GPT-2 layer under full_shard at 2 ranks: the
	# second forward (recompute) after the backward all_gather, before the
	# block's backward and its reduce_scatter
	"gpt2-tiny-rcfs2|models/gpt2-tiny.dp@rcfs|--world-size 2 -D layers=1|recompute schedule"
	# issue 16: one GPT-2 layer at cp=2: the position embedding read at each
	# token's position, K and V packed and all_gathered over cp for
	# attention_cp, their gradients reduce_scattered back; every gradient
	# all_reduced over cp too
	"gpt2-tiny-cp2|models/gpt2-tiny.dp@cp2|--world-size 2 -D layers=1|cp schedule"
	# issue 14: mixed precision. mlp.dp in bf16 at 2 ranks: the data cast to
	# bf16 before fc1, bf16 params beside their f32 masters, f32 gradients,
	# AdamW writing flat.params.bf16, INIT casting the masters into it
	"mlp-bf16-ws2|models/mlp.dp@bf16|--world-size 2|precision layout schedule"
	# one GPT-2 layer in bf16 under full_shard at 2 ranks: bf16 gathers of the
	# shards' compute copies, f32 reduce_scatters, the masters in INIT/EXPORT
	"gpt2-tiny-bf16fs2|models/gpt2-tiny.dp@bf16fs|--world-size 2 -D layers=1|schedule"
	# zero2 with one block (fc3) computed in f32 in a bf16 model: casts where
	# its activations and gradients cross into and out of it, units split by
	# dtype, an f32 flat.params beside flat.params.bf16
	"mlp8-bf16z2-ws4|models/mlp8.dp@bf16z2|--world-size 4|precision layout schedule"
	# issue 25: one GPT-2 layer at pp=2 (stage 0: embed, h.0, lnf; stage 1:
	# the tied LM head and the loss), 2 micro-batches, after unroll: each
	# stage's F, B (and under zero_bubble W) slots in the schedule's order,
	# every send beside its recv on the neighbouring stage. 1f1b: stage 0
	# F0 F1 B0 B1 (each F's send at its end, each B after its recv), stage
	# 1 F0 B0 F1 B1 (both recvs posted first; the LM head's wte gradient
	# before the send of d.lnf.x); zero_bubble: each B the input gradients
	# alone, its send right after them, its W (the weight gradients) later:
	# stage 0 F0 F1 B0 W0 B1 W1 (W0 where it waits for B1's gradient),
	# stage 1 F0 B0 W0 F1 B1 W1
	"gpt2-tiny-pp2-1f1b|models/gpt2-tiny.dp@pp2|--world-size 2 -D layers=1 -D d=16 -D ctx=8|unroll"
	"gpt2-tiny-pp2-zb|models/gpt2-tiny.dp@pp2zb|--world-size 2 -D layers=1 -D d=16 -D ctx=8|unroll"
)

if [ ! -x "$DPC" ]; then
	fail "dpc not built ($DPC)"
	finish golden
	exit 1
fi
tmp=$(tmpdir)
trap 'rm -rf "$tmp"' EXIT
for c in "${cases[@]}"; do
	IFS='|' read -r name model flags passes <<<"$c"
	case_on "$name" || continue
	# a strategy variant is a copy in $tmp, compiled from there under a
	# stable name (the dump's first line shows the path)
	dir=.
	case $model in
	*@*)
		v=${model#*@}; model=${model%@*}
		copy=$(basename "$model" .dp)-$v.dp
		if [ "$v" = tp2 ] || [ "$v" = cp2 ]; then
			{ echo "mesh ${v%2}=2"; grep -v '^mesh ' "$model"; } >"$tmp/$copy"
		elif [ "$v" = mixed ]; then
			mixed "$model" "$tmp/$copy"
		elif [ "$v" = rcfs ]; then
			sed -e 's/^  strategy ddp/  strategy full_shard\n  gradient_checkpointing true/' \
				"$model" >"$tmp/$copy"
		elif [ "$v" = bf16 ] || [ "$v" = bf16fs ] || [ "$v" = bf16z2 ]; then
			st=ddp; f32=; [ "$v" = bf16fs ] && st=full_shard
			[ "$v" = bf16z2 ] && st=zero2 && f32=fc3
			sed -e "s/^  strategy ddp/  strategy $st\n  precision bf16/" \
				-e "/^  block $f32 {/a\\    param_dtype f32" "$model" >"$tmp/$copy"
		elif [ "$v" = pp2 ] || [ "$v" = pp2zb ]; then
			sc=1f1b && [ "$v" = pp2zb ] && sc=zero_bubble
			{ echo "mesh pp=2"; grep -v '^mesh ' "$model" |
				sed "s/^  strategy ddp/&\n  grad_accum 2\n  pipeline $sc/"; } >"$tmp/$copy"
		elif [ "$v" = hsdp2x2 ]; then
			sed -e 's/^  strategy ddp/  strategy hybrid_shard/' \
				-e 's/^mesh auto/mesh dp_replicate=2, dp_shard=2/' "$model" >"$tmp/$copy"
		else
			sed -e "s/^  strategy ddp/  strategy $v/" "$model" >"$tmp/$copy"
		fi
		dir=$tmp; model=$copy ;;
	esac
	for pass in $passes; do
		want=tests/golden/$name.$pass.ir
		got=$tmp/$name.$pass.ir
		[ "$dir" = . ] && REPRO="$BUILD/dpc $model $flags --dump-after=$pass | diff -u $want -"
		# shellcheck disable=SC2086 # flags are words
		if ! (cd "$dir" && "$DPC" "$model" $flags --dump-after="$pass") >"$got" 2>"$tmp/err"; then
			fail "$name after $pass: dpc failed: $(head -n 3 "$tmp/err")"
			continue
		fi
		if [ "${UPDATE:-0}" = 1 ]; then
			cp "$got" "$want"
			ok "$name after $pass (updated $want)"
		elif [ ! -f "$want" ]; then
			fail "$name after $pass: no $want (run UPDATE=1 bash tests/golden.sh)"
		elif diff -u "$want" "$got" >"$tmp/diff"; then
			ok "$name after $pass"
		else
			fail "$name after $pass differs from $want:"
			cat "$tmp/diff"
		fi
	done
done
finish golden
