#!/usr/bin/env bash
# tests/sample.sh - sampling from a language model (issue 29 item 5): the
# step file's sample program (passes/sample.c) and dpexec --sample
# (runtime/sampler.c).
#
# Model: models/gpt2-tiny.dp at 1 layer, d = 32, trained 80 steps at lr 1e-2
# (constant) on "hello, world! " repeated: it learns the text (train loss
# ~0.02; at 60 steps, or a global batch of 8, greedy still slips). Trained
# once, with --sample-every 40, and saved; every other case samples from that
# safetensors file.
#   - the samples during training: one at step 40 and one at step 80, the
#     last equal to the trained weights' sample after the run, from the
#     saved safetensors (--init-from) and from the checkpoint (--resume,
#     which leaves the save directory as it was);
#   - greedy (--temperature 0) from "hello" continues the text exactly, also
#     compiled with --precision bf16 and fp16 (16-bit logits);
#   - the prompt's logits (--sample-logits) equal PyTorch's forward of the
#     same window from the same weights (tests/torch_gpt.py's Model, the
#     training forward transformer.sh checks; atol 1e-4): every position,
#     not only the last;
#   - dropout is off: a dropout(p=0.5) added to the model changes no logit;
#   - a draw at temperature 2, top-k 10, seed 3 (random enough that a wrong
#     key shows) is the same text in two runs, at 2 ranks (full_shard: the
#     sample program gathers the parameters; every rank continues rank 0's
#     draw), at tp=2 and
#     on the emulated CUDA backend (--device cuda, build-emu), and another
#     seed gives another text;
#   - errors: a model that is not a language model, a prompt longer than
#     the context, a byte outside a 128-token vocabulary, an empty prompt,
#     --tokens 0, a sampling option without --sample, --sample without
#     weights to sample.
set -u
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT

printf 'hello, world! %.0s' $(seq 400) >"$T/hello.txt"
"$ROOT/$BUILD/text2shard" -o "$T/hello.bin" "$T/hello.txt" >"$T/shard.log" 2>&1 ||
	{ cat "$T/shard.log"; fail "text2shard"; }
variant models/gpt2-tiny.dp "$T/lm.dp" \
	's|"build/data/fortunes[_val]*.bin"|"'"$T"'/hello.bin"|' \
	's/^  schedule .*/  schedule constant/' 's/lr=2e-3/lr=1e-2/' 's/^  steps 600/  steps 80/'
# compile NAME NP [MESH-LINE [STRATEGY]]: $T/NAME.bin, the model at NP ranks
compile() {
	local src=$T/lm.dp
	if [ -n "${3:-}" ]; then
		src=$T/$1.dp
		{ echo "mesh $3"; sed "s/^  strategy ddp/  strategy ${4:-ddp}/" "$T/lm.dp"; } >"$src"
	fi
	"$DPC" "$src" -D layers=1 -D d=32 --world-size "$2" -o "$T/$1.bin" >"$T/$1.dpc" 2>&1 ||
		{ cat "$T/$1.dpc"; fail "$1: dpc"; return 1; }
}
train() {
	compile lm 1 &&
		mpi 1 "$T/lm.bin" --quiet --eval-every 0 --save-full "$T/lm.st" --save-dir "$T/ck" --sample "hel" \
			--tokens 20 --temperature 0 --sample-every 40 >"$T/train.out" 2>&1 ||
		{ tail -n 20 "$T/train.out"; fail "training the model"; return 1; }
}
# sample NAME NP BIN [ARGS...]: $T/NAME.out, the sample of the trained weights
sample() {
	local name=$1 np=$2 bin=$3
	shift 3
	mpi "$np" "$bin" --quiet --init-from "$T/lm.st" "$@" >"$T/$name.out" 2>"$T/$name.err" ||
		{ cat "$T/$name.err"; fail "$name: dpexec --sample"; return 1; }
}
text() { printf 'hello, world! %.0s' $(seq 10) | head -c "$1"; }

if case_on "during training"; then
	once train train
	got=$(unstamp "$T/train.out" | grep -c '^sample at step \(40\|80\): hel')
	sample after 1 "$T/lm.bin" --sample "hel" --tokens 20 --temperature 0
	if [ "$got" = 2 ] && [ "$(unstamp "$T/train.out" | grep '^sample at step 80: ' | cut -d' ' -f5-)" = \
		"$(cat "$T/after.out")" ]; then
		ok "during training: samples at steps 40 and 80, the last the saved weights' ($(cat "$T/after.out"))"
	else
		fail "during training: samples at steps 40 and 80, the last the saved weights'"
		unstamp "$T/train.out" | grep '^sample'; cat "$T/after.out"
	fi
	ls -R "$T/ck" >"$T/ck.before"
	if mpi 1 "$T/lm.bin" --quiet --resume "$T/ck" --sample "hel" --tokens 20 --temperature 0 \
		>"$T/resumed.out" 2>&1 && [ "$(tail -n 1 "$T/resumed.out")" = "$(cat "$T/after.out")" ] &&
		ls -R "$T/ck" | cmp -s - "$T/ck.before"; then
		ok "--resume: the checkpoint's weights give the same sample, the save directory untouched"
	else
		fail "--resume: the checkpoint's weights give the same sample, the save directory untouched"
		cat "$T/resumed.out"
	fi
fi

if case_on greedy; then
	once train train
	want=$(text 45)
	if sample greedy 1 "$T/lm.bin" --sample hello --tokens 40 --temperature 0 &&
		[ "$(cat "$T/greedy.out")" = "$want" ]; then
		ok "greedy from 'hello' continues the text: $want"
	else
		fail "greedy from 'hello' continues the text: want '$want', got '$(cat "$T/greedy.out")'"
	fi
	# precision bf16 and fp16: the logits are 16-bit (the runtime widens them)
	for p in bf16 fp16; do
		if "$DPC" "$T/lm.dp" -D layers=1 -D d=32 --precision $p -o "$T/$p.bin" >"$T/$p.dpc" 2>&1 &&
			sample $p 1 "$T/$p.bin" --sample hello --tokens 40 --temperature 0 &&
			[ "$(cat "$T/$p.out")" = "$want" ]; then
			ok "greedy in $p continues the text too"
		else
			fail "greedy in $p continues the text: got '$(cat "$T/$p.out" 2>/dev/null)'"
		fi
	done
fi

if case_on logits; then
	once train train
	if sample logits 1 "$T/lm.bin" --sample "hello, wor" --tokens 1 --temperature 0 \
		--sample-logits "$T/logits.txt" &&
		$PY - "$T/lm.st" "$T/logits.txt" >"$T/logits.cmp" 2>&1 <<'EOF'; then
import sys
import numpy as np
import torch
sys.path.insert(0, "tests")
import torch_gpt, torch_ref
w = torch_ref.read_safetensors(sys.argv[1])
class A: model, heads, norm_eps = "gpt2", 4, 1e-5
m = torch_gpt.Model(A, w, torch.float32)
ctx = w["embed.wpe"].shape[0]
p = list(b"hello, wor")
ids = torch.tensor([p + [p[-1]] * (ctx - len(p))])
with torch.no_grad():
    want = m.forward(ids)[0, :len(p)].numpy()
got = np.loadtxt(sys.argv[2], ndmin=2)
assert got.shape == want.shape, (got.shape, want.shape)
d = np.abs(got - want).max()
print(f"{len(p)} positions x {got.shape[1]}: max abs diff {d:.2e}")
sys.exit(0 if d < 1e-4 else 1)
EOF
		ok "the prompt's logits are PyTorch's forward: $(cat "$T/logits.cmp")"
	else
		fail "the prompt's logits are PyTorch's forward"; cat "$T/logits.cmp"
	fi
fi

# dropout is off: the same weights with a dropout(p=0.5) on the embeddings
# give the prompt's logits bit for bit (with the keys left as the training
# loads wrote them, the mask would drop half of them)
if case_on "dropout off"; then
	once train train
	variant "$T/lm.dp" "$T/drop.dp" \
		's/^    x = add(embedding(ids, wte), wpe)/    x = dropout(add(embedding(ids, wte), wpe), p=0.5)/'
	if "$DPC" "$T/drop.dp" -D layers=1 -D d=32 -o "$T/drop.bin" >"$T/drop.dpc" 2>&1 &&
		sample nodrop 1 "$T/lm.bin" --sample "hello" --tokens 1 --sample-logits "$T/nodrop.txt" &&
		sample drop 1 "$T/drop.bin" --sample "hello" --tokens 1 --sample-logits "$T/drop.txt" &&
		cmp -s "$T/drop.txt" "$T/nodrop.txt"; then
		ok "dropout is off: the logits of a model with dropout(p=0.5) bitwise the model's without"
	else
		fail "dropout is off: the logits of a model with dropout(p=0.5) bitwise the model's without"
	fi
fi

# a draw at a fixed seed: the same text in every run, layout and backend
DRAW=(--sample hello --tokens 20 --temperature 2 --top-k 10 --seed 3)
draw_ref() { sample draw 1 "$T/lm.bin" "${DRAW[@]}"; }
same_draw() { # same_draw NAME WHAT: $T/NAME.out is $T/draw.out
	if [ -s "$T/draw.out" ] && cmp -s "$T/$1.out" "$T/draw.out"; then
		ok "seed 3: $2 draws the same text ($(cat "$T/draw.out"))"
	else
		fail "seed 3: $2 draws the same text: '$(cat "$T/$1.out" 2>/dev/null)' vs '$(cat "$T/draw.out")'"
	fi
}
if case_on "draw again"; then
	once train train && once draw draw_ref
	sample draw2 1 "$T/lm.bin" "${DRAW[@]}" && same_draw draw2 "a second run"
	sample seed4 1 "$T/lm.bin" "${DRAW[@]}" --seed 4
	if [ -s "$T/seed4.out" ] && ! cmp -s "$T/seed4.out" "$T/draw.out"; then
		ok "seed 4 draws another text ($(cat "$T/seed4.out"))"
	else
		fail "seed 4 draws another text than seed 3"
	fi
fi
for c in "fs2|2|dp_shard=2|2 ranks (full_shard)|full_shard" "tp2|2|tp=2|tp=2|ddp"; do
	IFS='|' read -r name np m what strat <<<"$c"
	case_on "draw $name" || continue
	once train train && once draw draw_ref
	compile "$name" "$np" "$m" "$strat" && sample "$name" "$np" "$T/$name.bin" "${DRAW[@]}" &&
		same_draw "$name" "$what"
done
if case_on "draw cuda"; then
	once train train && once draw draw_ref
	if emu_start sample; then
		if OPENBLAS_NUM_THREADS=1 timeout 300 "$ROOT/build-emu/dpexec" "$T/lm.bin" --quiet --device cuda \
			--init-from "$T/lm.st" "${DRAW[@]}" >"$T/cuda.out" 2>"$T/cuda.err"; then
			same_draw cuda "the emulated CUDA backend"
		else
			cat "$T/cuda.err"; fail "the emulated CUDA backend: dpexec --device cuda --sample"
		fi
	fi
fi

if case_on errors; then
	once train train
	"$DPC" models/mlp.dp --world-size 1 -o "$T/mlp.bin" >"$T/mlp.dpc" 2>&1 || fail "mlp.dp: dpc"
	expect "a classifier has no sample program" "cannot sample: models/mlp.dp has no sample program" \
		"$DPEXEC" "$T/mlp.bin" --init-from "$T/lm.st" --sample hello
	expect "a prompt longer than the context" "the prompt has 70 tokens, more than the model's context of 64" \
		"$DPEXEC" "$T/lm.bin" --init-from "$T/lm.st" --sample "$(text 70)"
	"$DPC" "$T/lm.dp" -D layers=1 -D d=32 -D vocab=128 -o "$T/v128.bin" >"$T/v128.dpc" 2>&1 ||
		fail "vocab 128: dpc"
	expect "a byte outside the vocabulary" "byte 0xc3 at offset 1 of the prompt is not in the model's vocabulary of 128 bytes" \
		"$DPEXEC" "$T/v128.bin" --init-from "$T/lm.st" --sample "hé"
	expect "an empty prompt" "the prompt is empty" \
		"$DPEXEC" "$T/lm.bin" --init-from "$T/lm.st" --sample ""
	expect "--tokens 0" "--tokens wants how many tokens to generate, 1 or more, not '0'" \
		"$DPEXEC" "$T/lm.bin" --init-from "$T/lm.st" --sample hello --tokens 0
	expect "--temperature without --sample" "give --sample PROMPT" \
		"$DPEXEC" "$T/lm.bin" --temperature 0
	expect "--sample without weights" "--sample samples the weights of --init-from or --resume" \
		"$DPEXEC" "$T/lm.bin" --sample hello
fi

finish sample
