#!/usr/bin/env bash
# tests/padvocab.sh - the padded vocabulary (passes/padvocab.c, train's
# pad_vocab): the logits and their gradient get rows of a multiple of
# pad_vocab (a row stride, DpTensor.ld), the head's GEMMs read a zero-padded
# copy of its weight (pad_rows), and nothing else changes.
#  - ir: GPT-2 124M's logits and d.logits have ld=50304 (50257 padded to a
#    multiple of 128); pad_vocab 0 pads nothing; the fused classifier
#    (cross_entropy_fused, passes/fuse.c) writes d.logits over the padded
#    logits, a view of them with their stride; a padded value read by an op
#    that takes no stride is a verifier error (dpc --from-ir). The head's
#    forward and input-gradient GEMMs read a pad_rows copy of wte [50304,
#    768] (none at pad_vocab 0); a pad_rows weight whose extra rows no
#    padded output covers is refused by the decoder at load.
#  - layouts: zero2 with the optimizer offloaded and pp=2 (1F1B), padded
#    bitwise their pad_vocab 0 twins at 2 ranks.
#  - ckpt: a padded run's checkpoint resumed by the unpadded step file and
#    the other way: the 4-step parameters and last loss bit for bit, wte in
#    the user's shape in the checkpoint.
#  - bitwise: gpt2-tiny with a vocabulary of 300 (rows of 384: tokens are
#    bytes, so any vocabulary >= 256 trains the same data), against the
#    same model with pad_vocab 0: losses, eval lines (cross_entropy and
#    correct on padded logits) and final parameters byte for byte, at 1
#    rank (ddp, f32), 2 ranks (ddp, f32) and 2 ranks (full_shard, bf16);
#    the tied wte is read and written by the three padded GEMMs. And
#    GPT-2 124M's shape of the head (vocab 50257, one narrow layer) at 1
#    rank, 2 steps.
#  - unfused: the fused classifier (cross_entropy_fused over the padded
#    logits) bitwise the cross_entropy and cross_entropy_grad it replaces,
#    and the residual adds folded into the layernorms (add_layernorm,
#    layernorm_grad_add) bitwise the add, layernorm, layernorm_grad and
#    accum they replace, and the gamma and beta gradients in one pass
#    (layernorm_grad_gb) bitwise the layernorm_grad_g and bias_grad it
#    replaces (the fuse pass left out: dpc --from-ir after
#    schedule), losses, eval lines and parameters, f32 at 1 rank;
#    unfused-bf16 the same in precision bf16 (relu for gelu: linear_gelu is
#    not bitwise on the CPU in bf16); unfused-llama the residual adds folded
#    into Llama's rmsnorms (add_rmsnorm, rmsnorm_grad_add) in bf16 the same
#    way.
#  - fused-memory: the fuse pass never enlarges the temporaries' region
#    (compiles only): gpt2-tiny and llama in bf16, with and without
#    gradient checkpointing, against the same IR with the pass left out.
#    add_norm packs the sum and the norm into one temporary, which lives as
#    long as the longer; under checkpointing the forward's sum is kept for
#    the recomputation and its norm is not, so packing it grew the region
#    (gpt2-tiny 2.88 -> 3.01 MB, llama 6.82 -> 7.60 MB; Llama 7B +0.5 GiB).
# Against main's binaries the same runs were bitwise too when the pass
# landed (the report of the commit says so); here pad_vocab 0 is the
# unpadded reference, which the ir case shows pads nothing.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
STEPS=${STEPS:-4}

# ld of value NAME in an IR dump, or nothing
ld_of() { sed -nE "s/^%${1//./\\.} +: .* ld=([0-9]+) .*/\1/p" "$2"; }

if case_on ir; then
	"$DPC" models/gpt2.dp --emit=ir >"$T/gpt2.ir" 2>"$T/err" || { cat "$T/err"; fail "dpc gpt2.dp"; }
	"$DPC" models/gpt2.dp --set train.pad_vocab=0 --emit=ir >"$T/gpt2-0.ir" 2>>"$T/err" ||
		{ cat "$T/err"; fail "dpc gpt2.dp pad_vocab 0"; }
	a=$(ld_of logits "$T/gpt2.ir"); b=$(ld_of d.logits "$T/gpt2.ir")
	if [ "$a" = 50304 ] && [ "$b" = 50304 ] && [ "$(grep -c ' ld=' "$T/gpt2.ir")" = 2 ] &&
		! grep -q ' ld=' "$T/gpt2-0.ir"; then
		ok "gpt2.dp: logits and d.logits rows of 50304 (2 padded values); pad_vocab 0: none"
	else
		fail "gpt2.dp: ld of logits '$a', d.logits '$b'; $(grep -c ' ld=' "$T/gpt2.ir") padded"
	fi
	# the fused classifier (passes/fuse.c): the loss and its gradient one
	# cross_entropy_fused, the gradient a view of all of the padded logits
	if grep -q '^%loss : .* = cross_entropy_fused %logits, %targets ' "$T/gpt2.ir" &&
		! grep -q 'cross_entropy_grad' "$T/gpt2.ir" &&
		grep -Eq '^%d\.logits +: .* ld=50304 view=%logits\+0 ' "$T/gpt2.ir"; then
		ok "gpt2.dp: one cross_entropy_fused, d.logits a view of the padded logits (ld=50304)"
	else
		grep -E 'cross_entropy|^%d\.logits ' "$T/gpt2.ir"
		fail "gpt2.dp: the classifier is not one cross_entropy_fused over the padded logits"
	fi
	# the LM head's GEMMs with the vocabulary as n (the logits) or k (their
	# input gradient) read a pad_rows copy of wte [50304, 768]; the weight
	# gradient (m) reads none; pad_vocab 0: no copy
	if grep -Eq '^%embed\.wte\.pad +: f32\[50304,768\] .*= pad_rows %embed\.wte rows=50304 +fwd ' "$T/gpt2.ir" &&
		grep -Eq '^%logits = matmul %lnf\.x, %embed\.wte\.pad transB ' "$T/gpt2.ir" &&
		grep -Eq '^%embed\.wte\.pad1 +: f32\[50304,768\] .*= pad_rows %embed\.wte rows=50304 +bwd ' "$T/gpt2.ir" &&
		grep -Eq '^%d\.lnf\.x +: .*= matmul %d\.logits, %embed\.wte\.pad1 ' "$T/gpt2.ir" &&
		grep -Eq '^%grad\.embed\.wte = matmul %d\.logits, %lnf\.x transA acc ' "$T/gpt2.ir" &&
		[ "$(grep -c '= pad_rows ' "$T/gpt2.ir")" = 2 ] && ! grep -q pad_rows "$T/gpt2-0.ir"; then
		ok "gpt2.dp: the head's forward and input-gradient GEMMs read wte padded to 50304 rows (2 pad_rows); pad_vocab 0: none"
	else
		grep -E 'pad_rows|= matmul .*wte' "$T/gpt2.ir"
		fail "gpt2.dp: the head's GEMMs do not read a pad_rows copy of wte"
	fi
	# a stride on a value an op without strides reads: %t (embedding's
	# output, read by bias_add) declared with ld=8
	sed -E -e 's/^(%d\.logits +: .*)$/\1\n%t : f32[2,8,4] act ld=8/' \
		-e 's/^%t : f32\[2,8,4\] = embedding/%t = embedding/' \
		tests/passes/padvocab.out.ir >"$T/bad.ir"
	if ! grep -q '^%t .* ld=8' "$T/bad.ir"; then
		fail "the edited IR has no ld on %t"
	elif "$DPC" --from-ir "$T/bad.ir" --passes memplan -o "$T/bad.bin" >"$T/bad.out" 2>&1; then
		fail "a padded value read by bias_add verified"
	elif grep -q "cannot take %t: its rows are padded" "$T/bad.out" && [ ! -e "$T/bad.bin" ]; then
		ok "a padded value read by bias_add: a verifier error, no step file"
	else
		cat "$T/bad.out"
		fail "a padded value read by bias_add: not the verifier's message"
	fi
	# a pad_rows weight whose extra rows no stride covers (the logits'
	# ld taken out): the decoder refuses the head's matmul, naming it
	sed -E 's/^(%logits .*) ld=256 /\1 /; s/^(%d\.logits .*) ld=256 /\1 /' \
		tests/passes/padvocab.out.ir >"$T/bad2.ir"
	if grep -q ' ld=' "$T/bad2.ir" || ! grep -q '= pad_rows ' "$T/bad2.ir"; then
		fail "the edited IR still has an ld, or no pad_rows"
	elif "$DPC" --from-ir "$T/bad2.ir" --passes memplan -o "$T/bad2.bin" >"$T/bad2.out" 2>&1 &&
		! "$DPEXEC" "$T/bad2.bin" --steps 1 >"$T/bad2.run" 2>&1 &&
		grep -q "instruction [0-9]* (matmul) (out logits, in x, embed.wte.pad): the output is not \[16, 256\]" "$T/bad2.run"; then
		ok "a pad_rows weight with no padded output to take its rows: the step file refused at load, naming the matmul"
	else
		cat "$T/bad2.out" "$T/bad2.run" 2>/dev/null | tail -n 5
		fail "a pad_rows weight with no padded output: not refused by the decoder"
	fi
fi

text_shard
# tiny NAME SETTINGS...: gpt2-tiny with a vocabulary of 300 and the train
# settings given (one per argument)
tiny() {
	local name=$1 extra=""; shift
	for s in "$@"; do extra="$extra\n  $s"; done
	sed -e "$data" -e 's/^  vocab = 256 .*/  vocab = 300/' \
		-e "s/^  strategy .*/&$extra/" models/gpt2-tiny.dp >"$T/$name.dp"
}
# run NAME NP ARGS...: compile and run, losses, eval lines and parameters kept
run() {
	local name=$1 np=$2; shift 2
	"$DPC" "$T/$name.dp" --world-size "$np" -o "$T/$name.bin" 2>"$T/$name.log" ||
		{ cat "$T/$name.log"; fail "$name: dpc"; return 1; }
	mpi "$np" "$T/$name.bin" --steps "$STEPS" --losses "$T/$name.loss" \
		--save-full "$T/$name.st" "$@" >"$T/$name.log" 2>&1 ||
		{ tail -n 20 "$T/$name.log"; fail "$name: dpexec on $np ranks"; return 1; }
	unstamp "$T/$name.log" | grep '^eval ' >"$T/$name.eval" || true
}
# same NAME NP ARGS...: NAME (padded) and NAME-0 (pad_vocab 0) bitwise
same() {
	local name=$1 np=$2; shift 2
	run "$name" "$np" "$@" && run "$name-0" "$np" "$@" || return
	if ! "$DPC" "$T/$name.dp" --world-size "$np" --emit=ir | grep -q '^%logits .* ld=384 '; then
		fail "$name: the logits are not padded"
	elif same_run "$T/$name" "$T/$name-0" &&
		cmp -s "$T/$name.eval" "$T/$name-0.eval"; then
		ok "$name ($np ranks): padded logits bitwise the unpadded ($(($(wc -l <"$T/$name.loss") - 1)) losses, $(wc -l <"$T/$name.eval") eval lines, parameters)"
	else
		paste "$T/$name.loss" "$T/$name-0.loss" | head -4
		fail "$name ($np ranks): padded logits differ from the unpadded"
	fi
}

if case_on f32-1; then
	tiny f32-1 && tiny f32-1-0 "pad_vocab 0"
	same f32-1 1 --eval-every 2
fi
if case_on ddp2; then
	tiny ddp2 && tiny ddp2-0 "pad_vocab 0"
	same ddp2 2 --eval-every 0
fi
if case_on fs2-bf16; then
	tiny fs2-bf16 "precision bf16" && tiny fs2-bf16-0 "precision bf16" "pad_vocab 0"
	sed -i 's/^  strategy .*/  strategy full_shard/' "$T/fs2-bf16.dp" "$T/fs2-bf16-0.dp"
	same fs2-bf16 2 --eval-every 2
fi
# the padded head under the other layouts, each bitwise its pad_vocab 0
# twin (2 ranks, 4 steps): zero2 with the optimizer offloaded (flat
# buffers in the host arena), pp=2 under 1F1B (2 micro-batches; the tied
# wte on stages 0 and 1, its gradient summed over the pp sub-group).
# (tp=2 leaves gpt2-tiny's head whole, replicated: ddp2's case)
if case_on layouts; then
	tiny z2off "offload optimizer" && tiny z2off-0 "offload optimizer" "pad_vocab 0"
	sed -i 's/^  strategy .*/  strategy zero2/' "$T/z2off.dp" "$T/z2off-0.dp"
	same z2off 2 --eval-every 0
	tiny pp2 "grad_accum 2" "pipeline pipedream_flush" &&
		tiny pp2-0 "grad_accum 2" "pipeline pipedream_flush" "pad_vocab 0"
	sed -i '1i mesh pp=2' "$T/pp2.dp" "$T/pp2-0.dp"
	same pp2 2 --eval-every 0
fi
# checkpoints hold the user's shape: 2 steps padded, a checkpoint, --resume
# unpadded to 4 (and the other way) give the 4-step runs' parameters and
# last losses bit for bit; wte is [300, 64] in the checkpoint
if case_on ckpt; then
	tiny ck && tiny ck-0 "pad_vocab 0"
	run ck 1 --eval-every 0 && run ck-0 1 --eval-every 0 &&
		for d in ck:ck-0 ck-0:ck; do
			a=${d%%:*} b=${d#*:}
			mpi 1 "$T/$a.bin" --steps 2 --quiet --eval-every 0 --save-dir "$T/$a.ckd" \
				>"$T/$a.ck.log" 2>&1 &&
				mpi 1 "$T/$b.bin" --steps "$STEPS" --quiet --eval-every 0 --losses "$T/$a.r.loss" \
					--resume "$T/$a.ckd" --save-full "$T/$a.r.st" >>"$T/$a.ck.log" 2>&1 ||
				{ tail -n 5 "$T/$a.ck.log"; fail "$a -> $b: 2 steps, a checkpoint, --resume"; continue; }
			shape=$(python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; h=json.loads(f.read(n)); print(*[v["shape"] for k,v in h.items() if k.endswith("wte")])' "$T/$a.ckd/$(cat "$T/$a.ckd/latest")/model.safetensors" 2>/dev/null)
			if [ "$shape" = "[300, 64]" ] && cmp -s "$T/$a.r.st" "$T/ck.st" &&
				[ "$(tail -n 1 "$T/$a.r.loss")" = "$(tail -n 1 "$T/ck.loss")" ]; then
				ok "$a -> $b: a checkpoint (wte $shape) resumed by the other gives the 4-step parameters and last loss bit for bit"
			else
				paste "$T/$a.r.loss" "$T/ck.loss" | tail -3
				fail "$a -> $b: resumed run differs (wte in the checkpoint: '$shape')"
			fi
		done
fi
# the fuse pass's fusions that are bitwise on the CPU against the nodes they
# replace: the same IR compiled with the fuse pass left out (dpc --from-ir
# after schedule), padded logits, eval (cross_entropy and correct) on them:
# the fused classifier (cross_entropy_fused) and the residual adds folded
# into the layernorms (add_layernorm, layernorm_grad_add: GPT-2's residual
# stream, 4 + 4 per micro-batch), f32 at 1 rank (`unfused`), and in bf16
# at 1 rank with relu for gelu (`unfused-bf16`: there the fuse pass's
# linear_gelu is not bitwise the linear and gelu it replaces on the CPU, so
# leaving the pass out would change more than these two; relu has no
# fusion), where the fused kernels round the sum and dx where the pair
# stored them.
# The layernorms' gamma and beta gradients in one pass
# (layernorm_grad_gb: 5 per micro-batch, 2 per layer and lnf) too.
# unfused NAME [NORM WANT]: $T/NAME.dp compiled both ways, run and
# compared; WANT the fused nodes in the step: cross_entropy_fused,
# add_NORM, NORM_grad_add and layernorm_grad_gb (default layernorm
# "1 4 4 5")
unfused() {
	local b=$1 norm=${2:-layernorm} want=${3:-1 4 4 5}
	"$DPC" "$T/$b.dp" --dump-after=schedule >"$T/$b.ir" 2>"$T/$b.log" &&
		"$DPC" --from-ir "$T/$b.ir" --passes views,sample,padvocab,memplan -o "$T/$b-0.bin" \
			2>>"$T/$b.log" && "$DPC" "$T/$b.dp" -o "$T/$b.bin" 2>>"$T/$b.log" &&
		"$DPC" "$T/$b.dp" --emit=ir >"$T/$b.fused.ir" 2>>"$T/$b.log" ||
		{ cat "$T/$b.log"; fail "$b: dpc"; return; }
	for r in "$b" "$b-0"; do
		mpi 1 "$T/$r.bin" --steps "$STEPS" --eval-every 2 --losses "$T/$r.loss" \
			--save-full "$T/$r.st" >"$T/$r.log" 2>&1 || { tail -n 20 "$T/$r.log"; fail "$r: dpexec"; return; }
		unstamp "$T/$r.log" | grep '^eval ' >"$T/$r.eval" || true
	done
	# the step's fused nodes: the classifier, and 4 add_layernorm and 4
	# layernorm_grad_add (gpt2-tiny's 2 layers: ln2 and the next ln1 or lnf
	# read a sum; the backward of ln1 and ln2 meets the residual's gradient)
	local xf an ag gb
	xf=$(grep -c '= cross_entropy_fused .* fwd step' "$T/$b.fused.ir")
	an=$(grep "= add_$norm .* fwd " "$T/$b.fused.ir" | grep -vc ' sample ')
	ag=$(grep -c "= ${norm}_grad_add .* bwd " "$T/$b.fused.ir")
	gb=$(grep -c "= layernorm_grad_gb .* bwd " "$T/$b.fused.ir")
	if [ "$xf $an $ag $gb" != "$want" ] ||
		grep -q "cross_entropy_fused\|add_$norm\|${norm}_grad_add\|layernorm_grad_gb" "$T/$b.ir"; then
		fail "$b: the direct compile has $xf cross_entropy_fused, $an add_$norm, $ag ${norm}_grad_add, $gb layernorm_grad_gb in the step (want $want), or the dump has one"
	elif same_run "$T/$b" "$T/$b-0" &&
		cmp -s "$T/$b.eval" "$T/$b-0.eval" && [ -s "$T/$b.eval" ]; then
		ok "$b: cross_entropy_fused, $an add_$norm, $ag ${norm}_grad_add and $gb layernorm_grad_gb bitwise the unfused nodes ($(($(wc -l <"$T/$b.loss") - 1)) losses, $(wc -l <"$T/$b.eval") eval lines, parameters)"
	else
		paste "$T/$b.loss" "$T/$b-0.loss" | head -4
		fail "$b: the fused nodes differ from the unfused ones"
	fi
}
if case_on unfused; then
	tiny uf
	unfused uf
fi
if case_on unfused-bf16; then
	tiny ufb "precision bf16"
	sed -i 's/linear(gelu(linear(/linear(relu(linear(/' "$T/ufb.dp"
	grep -q 'relu(linear(' "$T/ufb.dp" || fail "unfused-bf16: the gelu sed no longer applies to gpt2-tiny.dp"
	unfused ufb
fi
# unfused-llama: models/llama.dp (2 layers, d 64, ctx 32) in precision bf16
# (the fused kernels round the sum and dx where the pair stored them; in f32
# that rounding is none and the arithmetic the same): the residual adds
# folded into the rmsnorms, 4 add_rmsnorm (norm2 of each layer, the next
# layer's norm1, the final norm) and 4 rmsnorm_grad_add (norm1 and norm2 of
# each layer meet the residual's gradient), bitwise the unfused nodes
if case_on unfused-llama; then
	sed -e "$data" -e 's/^  ctx = .*/  ctx = 32/; s/^  d = .*/  d = 64/; s/^  layers = .*/  layers = 2/' \
		-e 's/^  ffn = .*/  ffn = 96/' \
		-e 's/^  strategy .*/&\n  precision bf16/' models/llama.dp >"$T/ufl.dp"
	grep -q '^  precision bf16' "$T/ufl.dp" || fail "unfused-llama: the precision sed no longer applies to llama.dp"
	unfused ufl rmsnorm "1 4 4 0"
fi
if case_on fused-memory; then
	for m in gpt2-tiny llama; do
		for ck in true false; do
			set -- "models/$m.dp" --world-size 1 --set train.gradient_checkpointing=$ck --set train.precision=bf16
			REPRO="${DPC#"$ROOT"/} $* --stats | grep temporaries"
			f=$("$DPC" "$@" --stats 2>/dev/null | awk '/^ *temporaries \(arena region\)/ {print $4}')
			"$DPC" "$@" --dump-after=schedule >"$T/fm.ir" 2>/dev/null
			u=$("$DPC" --from-ir "$T/fm.ir" --passes views,sample,padvocab,memplan --stats 2>/dev/null |
				awk '/^ *temporaries \(arena region\)/ {print $4}')
			if [ -n "$f" ] && [ -n "$u" ] && [ "$f" -le "$u" ]; then
				ok "$m, checkpointing $ck: fused temporaries $f B, at most the unfused $u B"
			else
				fail "$m, checkpointing $ck: fused temporaries ${f:-?} B over the unfused ${u:-?} B"
			fi
		done
	done
fi
if case_on gpt2-head; then
	# GPT-2 124M's head: vocab 50257 (rows of 50304), one layer of width 64
	gdata='s|"build/data/train.bin"|"'"$T"'/text.bin"|; s|"build/data/val.bin"|"'"$T"'/val.bin"|'
	for n in gpt2-head gpt2-head-0; do
		sed -e "$gdata" -e 's/^  ctx = .*/  ctx = 32/; s/^  d = .*/  d = 64/; s/^  heads = .*/  heads = 2/' \
			-e 's/^  layers = .*/  layers = 1/; s/^  global_batch .*/  global_batch 2/' \
			-e 's/^  grad_accum .*/  grad_accum 1/' models/gpt2.dp >"$T/$n.dp"
	done
	sed -i 's/^  strategy .*/&\n  pad_vocab 0/' "$T/gpt2-head-0.dp"
	STEPS=2 run gpt2-head 1 --eval-every 0 && STEPS=2 run gpt2-head-0 1 --eval-every 0 &&
		if [ "$(ld_of logits <("$DPC" "$T/gpt2-head.dp" --emit=ir))" != 50304 ]; then
			fail "gpt2-head: the logits are not padded"
		elif cmp -s "$T/gpt2-head.loss" "$T/gpt2-head-0.loss" &&
			cmp -s "$T/gpt2-head.st" "$T/gpt2-head-0.st"; then
			ok "GPT-2's head (vocab 50257, rows of 50304): 2 losses and parameters bitwise the unpadded"
		else
			paste "$T/gpt2-head.loss" "$T/gpt2-head-0.loss"
			fail "GPT-2's head: padded logits differ from the unpadded"
		fi
fi
finish padvocab
