#!/usr/bin/env bash
# tests/compress.sh - `compress powersgd(...)` (passes/compress.c, docs/COMPRESS.md)
# on models/mlp.dp at 2 ranks.
#
# Cases:
#   torch: 50 steps (start_step 10, rank 4) against PyTorch 1.13's own
#     powerSGD_hook on a 2-rank gloo DDP run (tests/torch_powersgd.py), from
#     dp's initial weights and Q (the hook's warm-start memory filled with
#     the values dp's INIT gives NAME.powersgd_q: torch_ref.init_normal, the
#     port of runtime/init.c). Bound: relative 2e-4 on every loss, the bound
#     tests/torch_ref.sh derives for 50 f32 AdamW steps of this MLP (summation
#     orders differ; measured there ~4e-5). PowerSGD adds rounding of its own:
#     PyTorch orthogonalises rank 4 by Householder QR, dp by Gram-Schmidt
#     (twice); the two differ by column signs, which P Q^T does not see, and
#     by rounding (measured: 6.4e-6 at most over the 50 losses). The check can
#     fail: dp without compression (plain all_reduce) is > 2e-4 from the same
#     PyTorch run (compression moves the losses ~1e-2 by step 20).
#   warm_start false: warm_start=false (a fresh Q every compressed step,
#     drawn from (seed, step): runtime/powersgd.h) over the torch case's
#     first 30 steps (20 compressed) against PyTorch's hook with
#     warm_start=False given dp's draws for its torch.randn
#     (torch_powersgd.py --no-warm-start): the torch case's bound, 2e-4, for
#     the same reasons. 30, not 50: the losses agree to ~1e-7 up to step 34,
#     then jump to 2e-6 in one step and grow with training to 1.1e-4 at step
#     50 (presumably a fresh Q whose M Q is ill-conditioned at that step,
#     where PyTorch's QR and dp's Gram-Schmidt round differently; not
#     shown): a margin of 1.8 that another CPU's rounding could eat. The
#     warm-started PyTorch run's first 30 losses are told apart from it. The IR differs from warm_start's only by the
#     Qs' `orthogonalize fresh` (the bytes and --stats the same) and reads
#     back; resumed across start_step 3 and after it, the losses are the
#     uninterrupted run's bitwise.
#   full-rank: rank = min(n, m) (every matrix compressed: min_compression_rate
#     0.5) from step 0 reproduces plain DDP: P spans each gradient's column
#     space, so P Q^T is the summed gradient up to f32 rounding (rtol 1e-5 over
#     10 steps; measured 2e-7; with one Gram-Schmidt pass, as PyTorch's, the
#     rank-deficient gradients made it 5e-2 by step 20: runtime/cpu/gemm.c).
#   stats: --stats' all_reduce bytes are the closed form 4 [sum over
#     compressed matrices (n + m) r + the other elements], and its line for
#     the plain all_reduce before start_step 4 x every element.
#   path: the losses equal plain DDP's exactly before start_step (the plain
#     path runs) and differ from its first compressed step on.
#   round trip: every --dump-ir dump read back (dpc --from-ir) and compiled to
#     the end gives the direct compile's step file byte for byte.
#   resume: checkpoints hold each rank's error feedback and Q (rank files,
#     runtime/ckpt_rank.c): saved before start_step 3 (full form) and resumed
#     across it, saved after it (sharded) and resumed, the losses equal the
#     uninterrupted run's bitwise; the 2-rank checkpoint after start_step
#     resumed at 1 rank (Q rank 0's, E the sum of the two) is within rtol 1e-5
#     of it (measured 1.1e-7, what a fresh 1-rank run differs by; without the
#     rank state the loss is 2.8e-4 off by step 8, the grad norm 23 % at step 5).
#     A bit flipped in a rank file is refused by its checksum.
#   per block: `compress none` in block fc1 (fc1.w all_reduced whole), 20
#     steps from start_step 5, against PyTorch's hook with _should_compress
#     saying no to fc1.w's shape (torch_powersgd.py --uncompressed fc1):
#     within 2e-4 as the torch case (measured 1.2e-7); every block compressed
#     is 8.5e-3 from it by step 20 (the check can fail). The IR: fc1's
#     buckets keep their one all_reduce, unflagged; its dumps read back give
#     the direct step file (block compress= in the IR). compress powersgd in
#     a block when train's is none is an error, compress none a warning.
#   hybrid: hybrid_shard at 4 ranks (dp_replicate=2 x dp_shard=2), each
#     block's chunk of its dp_shard cut compressed as a matrix of whole rows
#     [c/m, m] on the dp_replicate axis (passes/compress.c, passes/layout.c).
#     The IR: the P and Q all_reduces on dp_replicate alone, the
#     reduce_scatters on dp_shard the plain run's line for line. --stats:
#     4 r sum over blocks (ceil((n+1)/2) + m) bytes (the chunk's rows: the
#     block's n weight rows and its bias row cut in two, padded to whole rows)
#     and the plain line 4 x the chunks' elements. rank = min(rows, m) on fc1
#     (393 x 256) and head (51 x 10), fc2 and fc3 `compress none`, from step 0,
#     reproduces plain hybrid_shard over 6 steps within rtol 1e-5, the
#     full-rank case's bound (measured 2.7e-8): P spans each chunk's column
#     space, so P Q^T is the summed chunk up to f32 rounding. Not fc2 and fc3
#     at full rank: their chunks (129 x 128, 65 x 100) hold fewer non-zero rows
#     than r (rows of dead relu inputs are exactly zero), so Gram-Schmidt
#     runs out of directions and normalises rounding noise into columns that
#     are not orthogonal (measured: the grad norm 5 % off at step 1; a
#     limitation of the orthogonalisation, not of the rewrite; DDP's [256,
#     128] fc2 has enough rows). rank 4 on every block differs from plain
#     (told apart at 2e-4) and trains (the loss falls over the 6 steps).
#   errors: compress with zero2, full_shard, reduce_dtype bf16; a bad
#     argument.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
FM=/usr/share/datasets/fashion-mnist
PSGD='train.compress=powersgd(rank=4,start_step=10)'

# the runs' mlp.dp reads the uncompressed Fashion-MNIST (tests/lib.sh's
# mlp_raw: the same data, without each rank decompressing it); the IR and
# step-file checks below compile models/mlp.dp itself
mlp_raw "$T/mlp.dp"
compile() { # compile NAME SET-ARGS...: models/mlp.dp (its mlp_raw copy) at 2 ranks into $T/NAME.bin
	local name=$1; shift
	"$DPC" "$T/mlp.dp" --world-size 2 "$@" -o "$T/$name.bin" || { fail "$name: dpc"; return 1; }
}
losses() { # losses NAME STEPS [ARGS...]: $T/NAME.dp from $T/NAME.bin
	local name=$1 steps=$2; shift 2
	mpi 2 "$T/$name.bin" --steps "$steps" --no-eval --quiet --losses "$T/$name.dp" "$@" \
		>"$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name: dpexec"; return 1; }
}
plain() { once plain-c compile plain && once plain-r losses plain 10; }
# told_apart DESC A B: the losses A are not within 2e-4 of B's (so the check
# of another run against B at that bound can fail)
told_apart() {
	if $PY tests/compare.py losses "$2" "$3" --rtol 2e-4 --atol 0 >/dev/null; then
		fail "$1 (it is as near: the check cannot fail)"
	else
		ok "$1"
	fi
}
# dp's initial weights ($T/init.st), and the step file $T/psgd.bin
initst() {
	once psgd-c compile psgd --set "$PSGD" &&
		once init-r mpi 2 "$T/psgd.bin" --steps 0 --no-eval --quiet --save-full "$T/init.st" \
			>"$T/init.log" 2>&1
}
# the 50 steps of rank 4 from start_step 10, warm-started: dp's and PyTorch's
# (warm_start false needs PyTorch's alone: under SAN=1, where the torch case
# is left to the plain variant, it does not run dp's)
TORCH_ARGS=(--steps 50 --rank 4 --start 10 --clip 1 --schedule cosine --warmup 100 --sched-steps 4000)
warm_torch() {
	once psgd-t $PY tests/torch_powersgd.py --init "$T/init.st" "${TORCH_ARGS[@]}" --out "$T/psgd.torch"
}
warm_runs() { once psgd-r losses psgd 50 --init-from "$T/init.st" && warm_torch; }
# compressed from step 3, 8 steps
start3() {
	once start3-c compile start3 --set 'train.compress=powersgd(rank=4,start_step=3)' &&
		once start3-r losses start3 8
}

if case_on torch; then
	if [ ! -e $FM/train-images-idx3-ubyte.gz ] || ! have_torch; then
		fail "torch: needs dataset-fashion-mnist and python3-torch (make deps)"
	elif initst && warm_runs; then
		if $PY tests/compare.py losses "$T/psgd.dp" "$T/psgd.torch" --rtol 2e-4 --atol 0; then
			ok "torch: 50 losses within 2e-4 of PyTorch's powerSGD_hook (2 ranks, gloo)"
		else
			fail "torch: losses differ from PyTorch's powerSGD_hook"
		fi
		compile nocomp && losses nocomp 50 --init-from "$T/init.st"
		told_apart "torch: plain DDP is told apart from PowerSGD's PyTorch run" "$T/nocomp.dp" \
			"$T/psgd.torch"
	else
		fail "torch: the runs"
	fi
fi

if case_on "warm_start false"; then
	COLD='train.compress=powersgd(rank=4,start_step=10,warm_start=false)'
	if ! $PY -c "import torch" 2>/dev/null || [ ! -e $FM/train-images-idx3-ubyte.gz ]; then
		fail "warm_start false: needs dataset-fashion-mnist and python3-torch (make deps)"
	elif initst && compile cold --set "$COLD" && losses cold 30 --init-from "$T/init.st" &&
		$PY tests/torch_powersgd.py --init "$T/init.st" "${TORCH_ARGS[@]}" --steps 30 --no-warm-start \
			--out "$T/cold.torch" && warm_torch && grep -v '^#' "$T/psgd.torch" | head -n 30 >"$T/psgd30.torch"; then
		check "warm_start false: 30 losses within 2e-4 of PyTorch's hook (warm_start=False, dp's draws)" \
			$PY tests/compare.py losses "$T/cold.dp" "$T/cold.torch" --rtol 2e-4 --atol 0
		told_apart "warm_start false: the warm-started PyTorch run is told apart from it" \
			"$T/cold.dp" "$T/psgd30.torch"
	else
		fail "warm_start false: the runs"
	fi
	# the IR: the warm-started one's but for each Q's `orthogonalize fresh`
	# (and the compress line), its collectives and --stats the same; the
	# dump after compress reads back to the direct step file
	"$DPC" models/mlp.dp --world-size 2 --set "$COLD" --dump-ir="$T/colddump" -o "$T/coldd.bin" \
		--stats >"$T/cold.stats" && "$DPC" models/mlp.dp --world-size 2 --set "$PSGD" \
		--dump-after=compress >"$T/warm.ir" && "$DPC" models/mlp.dp --world-size 2 --set "$PSGD" \
		--stats >"$T/warm.stats" || fail "warm_start false: dpc"
	ir=$T/colddump/$(ls "$T/colddump" | grep -- '-compress\.ir$')
	if [ "$(grep -c '^%[a-z0-9]*\.w\.powersgd_q = orthogonalize fresh ' "$ir")" -eq 4 ] &&
		[ "$(grep -c 'orthogonalize fresh' "$T/warm.ir")" -eq 0 ] &&
		diff -b <(sed 's/orthogonalize fresh /orthogonalize /; s/warm_start=0/warm_start=1/' "$ir") \
			"$T/warm.ir" >/dev/null && cmp -s "$T/cold.stats" "$T/warm.stats" &&
		"$DPC" --from-ir "$ir" --passes all -o "$T/coldrt.bin" && cmp -s "$T/coldrt.bin" "$T/coldd.bin"; then
		ok "warm_start false: the IR is warm_start's but for the 4 Qs' orthogonalize fresh; --stats the same; reads back"
	else
		fail "warm_start false: the IR after compress ($ir) or --stats"
	fi
	# resume across start_step 3 (full form, from step 2) and after it
	# (sharded, from step 5): the uninterrupted run's losses bitwise, with
	# no Q carried (each compressed step draws its own)
	c3='train.compress=powersgd(rank=4,start_step=3,warm_start=false)'
	if compile cold3 --set "$c3" && for n in cck cacross cafter; do ln -sf cold3.bin "$T/$n.bin"; done &&
		losses cold3 8 && losses cck 2 --save-dir "$T/cck" --save-every 2 &&
		losses cacross 8 --resume "$T/cck/step-000002" --save-dir "$T/cck2" --save-every 5 \
			--save-form sharded &&
		losses cafter 8 --resume "$T/cck2/step-000005" --save-dir "$T/cck3"; then
		if [ "$(tail -n +2 "$T/cacross.dp")" = "$(sed -n '4,$p' "$T/cold3.dp")" ] &&
			[ "$(tail -n +2 "$T/cafter.dp")" = "$(sed -n '7,$p' "$T/cold3.dp")" ]; then
			ok "warm_start false: resumed bitwise across start_step 3 (from step 2) and after it (from step 5)"
		else
			fail "warm_start false: the resumed losses are not the uninterrupted run's"
			paste "$T/cold3.dp" "$T/cacross.dp" "$T/cafter.dp"
		fi
	else
		fail "warm_start false: the resume runs"
	fi
fi

if case_on full-rank; then
	plain && compile full --set 'train.compress=powersgd(rank=256,start_step=0,min_compression_rate=0.5)' &&
		losses full 10
	if [ "$(grep -c '^%[a-z0-9]*\.w\.powersgd_p = orthogonalize' <("$DPC" models/mlp.dp \
		--world-size 2 --dump-after=compress \
		--set 'train.compress=powersgd(rank=256,start_step=0,min_compression_rate=0.5)'))" -eq 4 ]; then
		ok "full-rank: the 4 matrices compressed"
	else
		fail "full-rank: not every matrix is compressed"
	fi
	check "full-rank: rank min(n, m) reproduces plain DDP (10 losses, rtol 1e-5)" \
		$PY tests/compare.py losses "$T/full.dp" "$T/plain.dp" --rtol 1e-5 --atol 0
fi

if case_on path; then
	plain && start3
	# --losses lines: "step loss grad_norm lr", step from 1; the loss of step k is
	# before its update, so the first 4 agree and the 4th's grad norm differs
	if [ "$(sed -n 2,4p "$T/start3.dp")" = "$(sed -n 2,4p "$T/plain.dp")" ] &&
		[ "$(sed -n 5p "$T/start3.dp" | cut -d' ' -f2)" = "$(sed -n 5p "$T/plain.dp" | cut -d' ' -f2)" ] &&
		[ "$(sed -n 5p "$T/start3.dp" | cut -d' ' -f3)" != "$(sed -n 5p "$T/plain.dp" | cut -d' ' -f3)" ]; then
		ok "path: plain all_reduce bitwise before start_step 3, compressed from it"
	else
		fail "path: the steps before and from start_step"
		paste "$T/start3.dp" "$T/plain.dp" | head -6
	fi
	# (every run here is dpexec --no-eval: Fashion-MNIST's 10000 test images
	# neither loaded nor evaluated; --eval-every 0 would evaluate them once)
	if grep -q "test loss" "$T/plain.log" "$T/start3.log"; then
		fail "path: a run with --no-eval evaluated"; grep "test loss" "$T/plain.log"
	else
		ok "path: the runs with --no-eval print no evaluation"
	fi
fi

if case_on stats; then
	"$DPC" models/mlp.dp --world-size 2 --set 'train.compress=powersgd(rank=4,start_step=10)' \
		--stats >"$T/stats" || fail "stats: dpc"
	# mlp: [784,256] [256,128] [128,100] [100,10], biases 256+128+100+10; r = 4
	# every matrix passes (n + m) 4 < n m
	comp=$(( 4 * ((784 + 256) * 4 + (256 + 128) * 4 + (128 + 100) * 4 + (100 + 10) * 4 + 494) ))
	all=$(( 4 * (784 * 256 + 256 * 128 + 128 * 100 + 100 * 10 + 494) ))
	# 2 ranks: bus bytes = 2 (n - 1) / n x bytes = bytes
	if grep -qE "^all_reduce .* ${comp} \(.* ${comp} \(" "$T/stats" &&
		grep -qE "^\(powersgd from step 10; before it all_reduce\) +${all} \(.* ${all} \(" "$T/stats"; then
		ok "stats: compressed all_reduce bytes $comp = 4 [sum (n+m) r + 494], plain $all"
	else
		fail "stats: want $comp compressed and $all plain bytes"; cat "$T/stats" | head -8
	fi
fi

if case_on "round trip"; then
	# every dump read back and compiled to the end gives the direct step file
	# (tests/passes.sh does it for models/*.dp, which do not compress)
	n=0 bad=" (dpc)"
	if "$DPC" models/mlp.dp --world-size 2 --set "$PSGD" --dump-ir="$T/dump" -o "$T/direct.bin"; then
		bad=
		for f in "$T"/dump/*.ir; do
			n=$((n + 1))
			"$DPC" --from-ir "$f" --passes all -o "$T/rt.bin" 2>/dev/null &&
				cmp -s "$T/rt.bin" "$T/direct.bin" || bad="$bad $(basename "$f")"
		done
	fi
	if [ -n "$bad" ] || [ "$n" -lt 20 ]; then
		fail "round trip: these dumps do not give the direct step file:$bad"
	else
		ok "round trip: all $n dumps read back give the direct step file byte for byte"
	fi
fi

if case_on hybrid; then
	sed -e 's/^  strategy ddp/  strategy hybrid_shard/' -e 's/^mesh auto/mesh dp_replicate=2, dp_shard=2/' \
		models/mlp.dp >"$T/hs.dp"
	sed -e 's/^  block fc[23] {/&\n    compress none/' "$T/hs.dp" >"$T/hsf.dp"
	HLOW='train.compress=powersgd(rank=4,start_step=0)'
	hl() { # hl NAME DP [SET]: 6 steps at 4 ranks
		"$DPC" "$2" --world-size 4 ${3:+--set "$3"} -o "$T/$1.bin" 2>/dev/null &&
			mpi 4 "$T/$1.bin" --steps 6 --no-eval --quiet --losses "$T/$1.dp" >"$T/$1.log" 2>&1 ||
			{ fail "hybrid: $1"; cat "$T/$1.log"; }
	}
	hl hplain "$T/hs.dp" && hl hlow "$T/hs.dp" "$HLOW" &&
		hl hfull "$T/hsf.dp" 'train.compress=powersgd(rank=256,start_step=0,min_compression_rate=0.5)'
	"$DPC" "$T/hs.dp" --world-size 4 --dump-after=schedule >"$T/hplain.ir" 2>/dev/null
	"$DPC" "$T/hs.dp" --world-size 4 --set "$HLOW" --dump-after=schedule --stats \
		>"$T/hlow.ir" 2>/dev/null
	pq=$(grep -cE '^%powersgd\.[pq]\.r[0-9]+ = all_reduce axes=dp_replicate ' "$T/hlow.ir")
	other=$(grep -E '^%powersgd\.[pq]\.r[0-9]+ = all_reduce' "$T/hlow.ir" | grep -vc 'axes=dp_replicate ')
	rs() { grep -E '^%[a-z0-9]+\.rs = reduce_scatter' "$1" | sed 's/ *#.*//'; }
	if [ "$pq" -eq 8 ] && [ "$other" -eq 0 ] && [ -n "$(rs "$T/hplain.ir")" ] &&
		[ "$(rs "$T/hplain.ir")" = "$(rs "$T/hlow.ir")" ]; then
		ok "hybrid: 8 P/Q all_reduces, on dp_replicate only; the dp_shard reduce_scatters unchanged"
	else
		fail "hybrid: the IR's P/Q all_reduces ($pq on dp_replicate, $other elsewhere)"
	fi
	# [784,256] [256,128] [128,100] [100,10] with their biases: rows ceil((n+1)/2)
	comp=$(( 4 * 4 * ((393 + 256) + (129 + 128) + (65 + 100) + (51 + 10)) ))
	all=$(( 4 * (393 * 256 + 129 * 128 + 65 * 100 + 51 * 10) ))
	if grep -qE "^all_reduce +dp_replicate .* ${comp} \(.* ${comp} \(" "$T/hlow.ir" &&
		grep -qE "^\(powersgd from step 0; before it all_reduce\) +${all} \(" "$T/hlow.ir"; then
		ok "hybrid: --stats' dp_replicate all_reduce $comp bytes = 16 sum (rows + m), plain $all"
	else
		fail "hybrid: --stats: want $comp compressed and $all plain bytes"
		grep -E "^all_reduce|^\(powersgd" "$T/hlow.ir"
	fi
	if [ -s "$T/hfull.dp" ] && [ -s "$T/hplain.dp" ]; then
		check "hybrid: rank min(n, m) on fc1 and head reproduces plain hybrid_shard (6 losses, rtol 1e-5)" \
			$PY tests/compare.py losses "$T/hfull.dp" "$T/hplain.dp" --rtol 1e-5 --atol 0
	fi
	if [ -s "$T/hlow.dp" ] && [ -s "$T/hplain.dp" ]; then
		told_apart "hybrid: rank 4 is told apart from plain hybrid_shard" "$T/hlow.dp" "$T/hplain.dp"
		if awk '/^#/ {next} !n++ {a=$2} END{exit !($2 < a)}' "$T/hlow.dp"; then
			ok "hybrid: rank 4 trains ($(awk '/^#/ {next} !n++ {a=$2} END{print a " -> " $2}' "$T/hlow.dp"))"
		else
			fail "hybrid: rank 4's loss does not fall"; cat "$T/hlow.dp"
		fi
	fi
fi

if case_on errors; then
	sed 's/^  strategy ddp/  strategy zero2/' models/mlp.dp >"$T/z2.dp"
	expect "errors: zero2" "needs every block ddp" "$DPC" "$T/z2.dp" --world-size 2 \
		--set "$PSGD" -o "$T/x.bin"
	sed 's/^  strategy ddp/  strategy full_shard/' models/mlp.dp >"$T/fs.dp"
	expect "errors: full_shard" "needs every block ddp" "$DPC" "$T/fs.dp" --world-size 2 \
		--set "$PSGD" -o "$T/x.bin"
	sed -e 's/^  strategy ddp/  strategy hybrid_shard/' -e 's/^  block fc1 {/&\n    strategy ddp/' \
		models/mlp.dp >"$T/mix2.dp"
	expect "errors: ddp and hybrid_shard blocks" "the blocks mix the two" "$DPC" "$T/mix2.dp" \
		--world-size 4 --set "$PSGD" -o "$T/x.bin"
	expect "errors: reduce_dtype bf16" "needs f32 gradients" "$DPC" models/mlp.dp --world-size 2 \
		--precision bf16 --set train.reduce_dtype=bf16 --set "$PSGD" -o "$T/x.bin"
	expect "errors: a bad rank" "rank" "$DPC" models/mlp.dp --world-size 2 \
		--set 'train.compress=powersgd(rank=0)' -o "$T/x.bin"
fi

if case_on "per block"; then
	sed 's/^  block fc1 {/&\n    compress none/' models/mlp.dp >"$T/mixed.dp"
	S5='train.compress=powersgd(rank=4,start_step=5)'
	if ! have_torch || [ ! -e $FM/train-images-idx3-ubyte.gz ]; then
		fail "per block: needs dataset-fashion-mnist and python3-torch (make deps)"
	elif initst && "$DPC" "$T/mixed.dp" --world-size 2 --set "$S5" -o "$T/mix.bin" &&
		compile all5 --set "$S5" && losses mix 20 --init-from "$T/init.st" &&
		losses all5 20 --init-from "$T/init.st" &&
		$PY tests/torch_powersgd.py --init "$T/init.st" --steps 20 --rank 4 --start 5 \
			--uncompressed fc1 --clip 1 --schedule cosine --warmup 100 --sched-steps 4000 \
			--out "$T/mix.torch"; then
		check "per block: fc1 'compress none' within 2e-4 of PyTorch's hook leaving fc1.w whole" \
			$PY tests/compare.py losses "$T/mix.dp" "$T/mix.torch" --rtol 2e-4 --atol 0
		told_apart "per block: every block compressed is told apart from it" "$T/all5.dp" \
			"$T/mix.torch"
	else
		fail "per block: the runs"
	fi
	"$DPC" "$T/mixed.dp" --world-size 2 --set "$S5" --dump-ir="$T/mixdump" -o "$T/mixd.bin" ||
		fail "per block: dpc --dump-ir"
	ir=$T/mixdump/$(ls "$T/mixdump" | grep -- '-compress\.ir$')
	if grep -q '^block fc1 compress=none$' "$ir" &&
		grep -qE '^%bucket\.r[0-9]+ = all_reduce .* comm fc1 last stream' "$ir" &&
		! grep -q 'fc1\.w\.powersgd' "$ir" && grep -q '^%fc2\.w\.powersgd_q = orthogonalize' "$ir" &&
		"$DPC" --from-ir "$ir" --passes all -o "$T/mixrt.bin" && cmp -s "$T/mixrt.bin" "$T/mixd.bin"
	then
		ok "per block: the IR keeps fc1's all_reduce unflagged, compresses fc2's, and reads back"
	else
		fail "per block: the IR after compress ($ir)"
	fi
	if "$DPC" "$T/mixed.dp" --world-size 2 -o "$T/x.bin" 2>"$T/warn" &&
		grep -q "warning: compress none in block fc1 has no effect: train does not compress" "$T/warn"; then
		ok "per block: compress none without train's compress warns"
	else
		fail "per block: compress none without train's compress: no warning"; cat "$T/warn"
	fi
	sed 's/^  block fc2 {/&\n    compress powersgd/' models/mlp.dp >"$T/bad.dp"
	expect "per block: powersgd in a block, none in train" "block fc2 compresses with powersgd but train does not" \
		"$DPC" "$T/bad.dp" --world-size 2 -o "$T/x.bin"
fi

if case_on resume; then
	# same_tail NAME K: the losses NAME resumed are start3's of steps K..8
	same_tail() { [ "$(tail -n +2 "$T/$1.dp")" = "$(sed -n "$(($2 + 1)),\$p" "$T/start3.dp")" ]; }
	# the runs ck, across and after are start3's step file
	if start3 && for n in ck across after; do ln -sf start3.bin "$T/$n.bin"; done &&
		losses ck 4 --save-dir "$T/ck" --save-every 2 &&
		[ -e "$T/ck/step-000002/rank-00001-of-00002.safetensors" ] &&
		grep -q '"rank_state"' "$T/ck/step-000002/state.json" &&
		losses across 8 --resume "$T/ck/step-000002" --save-dir "$T/ck2" --save-every 5 \
			--save-form sharded &&
		losses after 8 --resume "$T/ck2/step-000005" --save-dir "$T/ck3"; then
		if same_tail across 3 && same_tail after 6; then
			ok "resume: bitwise across start_step 3 (full form, from step 2) and after it (sharded, from step 5)"
		else
			fail "resume: the resumed losses are not the uninterrupted run's"
			paste "$T/start3.dp" "$T/across.dp" "$T/after.dp"
		fi
	else
		fail "resume: the runs (or the rank files)"
	fi
	# a bit flipped in rank 1's file: refused by its checksum, naming it
	cp -r "$T/ck/step-000004" "$T/dmg" &&
		$PY -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(-8, 2); b = f.read(1)[0]
f.seek(-8, 2); f.write(bytes([b ^ 1]))" "$T/dmg/rank-00001-of-00002.safetensors"
	expect "resume: a damaged rank file is refused" \
		"rank-00001-of-00002.safetensors is damaged: bytes" \
		mpi 2 "$T/start3.bin" --steps 6 --quiet --resume "$T/dmg" --save-dir "$T/dmgs"
	# at another world size: the 2-rank checkpoint of step 4 at 1 rank
	if "$DPC" models/mlp.dp --world-size 1 --set "train.compress=powersgd(rank=4,start_step=3)" \
		-o "$T/one.bin" &&
		mpi 1 "$T/one.bin" --steps 8 --no-eval --losses "$T/one.dp" \
			--resume "$T/ck/step-000004" --save-dir "$T/ck4" >"$T/one.log" 2>&1 &&
		grep -q "written by 2 ranks, loaded by 1" "$T/one.log"; then
		{ head -1 "$T/start3.dp"; tail -4 "$T/start3.dp"; } >"$T/start3-tail.dp"
		check "resume: at 1 rank from 2 ranks' checkpoint within rtol 1e-5 (E summed, Q rank 0's)" \
			$PY tests/compare.py losses "$T/one.dp" "$T/start3-tail.dp" --rtol 1e-5 --atol 0
	else
		cat "$T/one.log"
		fail "resume: at 1 rank"
	fi
fi
finish compress
