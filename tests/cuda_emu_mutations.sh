#!/usr/bin/env bash
# tests/cuda_emu_mutations.sh - the CUDA emulator catches real bugs in the
# CUDA backend: each mutation below is applied (sed/awk/perl) to a copy of
# runtime/cuda, the emulated backend is rebuilt (`make cuda-emu` in the
# copy), a small case is run under the emulator against the CPU, and the
# case must FAIL: a non-zero exit (a diagnosis from the emulator, or the
# backend's own error) or losses/parameters outside tests/cuda_emu.sh's
# tolerances. A mutation that no longer applies (the code moved) is a
# failure too, so this script follows the code it attacks.
#
#   event_record  backend_cuda.c's EVENT_RECORD records nothing: the waits
#                 see an older record (or none) and run early
#   event_wait    backend_cuda.c's EVENT_WAIT waits for nothing: a stream
#                 reads what the other has not finished
#   gemm_trans    the GEMM's transpose flags swapped (op T for N) in its
#                 cuBLASLt matmul descriptor
#   gemm_ld       the leading dimension of the GEMM's B (cuBLASLt's A
#                 layout) one too large
#   lt_bias       linear's bias epilogue dropped (CUBLASLT_EPILOGUE_DEFAULT):
#                 the fp32 linears with an aligned bias lose their bias
#   lt_bias16     the same, on the bf16 model: the bf16 linears lose theirs
#   lt_bgrad      the weight gradient's BGRADA epilogue (the column sums of
#                 dY that its bias_grad adds) made BGRADB: the sums of the
#                 other operand, X, of another length
#   bgrad_add     a bias_grad paired with its matmul's BGRADA adds nothing
#   vocab_leak    the classifier's kernels (loss.cu) walk a padded logits
#                 row (passes/padvocab.c) to its stride, not its classes:
#                 the padding columns leak into the softmax and the loss
#   gelu_aux      matmul_gelu_grad's DGELU epilogue told its own output as
#                 the aux: gelu' of stale values, not of the pre-activation
#   gelu_half     linear_gelu's D written over its aux (the first half):
#                 the gelu half is left stale
#   gelu_deriv    the DGELU epilogue made GELU_AUX: the gelu of the
#                 product, not the product times gelu' (a wrong derivative)
#   gelu_map      the gelu_grad kernel a fused GEMM runs where cuBLASLt has
#                 no GELU epilogue (DPEMU_LT_EPILOGUE=0) forgets gelu's
#                 factor 0.5 on its tanh term
#   lt_align      the heuristic told that B (cuBLASLt's A) is 256-byte
#                 aligned whatever its address: the algorithm chosen cannot
#                 take the under-aligned weight views of flat buffers
#   no_sync       block_sum's __syncthreads between the stores into shared
#                 memory and the reads of them, dropped
#   reorder       rank 1 issues its first collective after its second
#   p2p_wait      the comm stream's wait for the compute stream right before
#                 a pipeline send dropped (mlp8 at pp=2): the send moves an
#                 activation or gradient the compute stream has not written
#   bf16_stride   a norm's 128-bit row walk (bf16) steps by the scalar stride
#   bf16_round    softmax's bf16 stores truncate instead of rounding
#   bf16_clipfold the clip folded into AdamW skips clip's bf16 rounding
#   attn_sync     the __syncthreads at the top of attention's forward loop
#                 over key tiles dropped: a thread loads the next tile over
#                 the one others still read (invisible at ctx 16, one tile)
#   tc_sync       the tensor-core forward's one __syncthreads per key
#                 tile (tile i copied in, the buffer of tile i + 1 free),
#                 dropped
#   tc_layout     the tile read by ldmatrix without .trans where P Y
#                 needs Y's registers (V in the forward; K, dO, Q in the
#                 backward): Y^T's, a wrong fragment layout
#   tc_stride     the tile rows of X Y^T (K in the forward) addressed for
#                 ldmatrix with the unpadded head dim as the row stride
#                 (a wrong stride)
#   tc_causal     a forward or dQ warp skips the key tile holding its
#                 diagonal as if it were above it (a wrong causal tile bound)
#   tc_frag       P's C registers packed into the wrong A registers
#                 (a[1] taken as A[g][2q+8..], not A[g+8][2q..]: a wrong
#                 fragment index)
#   tc_shfl       row_sum (a row's sum over its quad of lanes) without
#                 the xor-2 shuffle: the forward's l sums half the row's p
#   tcb_lse       the tensor-core forward's row log-sum-exp never written
#   tcb_stale     the forward paired with its gradient not given the
#                 plan's lse buffer: the gradient reads a never-written
#                 (stale) lse
#   tcb_dterm     the backward's D = dO . O written as 0 (dS = P dP: the
#                 softmax's row term dropped)
#   tcb_sync      the dK/dV kernel's one __syncthreads per query tile (Q,
#                 dO, lse, D copied in, the other buffer free), dropped
#   tcb_causal    a dK/dV warp skips the query tile holding its keys'
#                 diagonal as if every query were before them
#   copy_wait     stage_push's copy stream no longer waits for step k-2
#                 before it overwrites device batch copy k % 2 (dpexec
#                 pushes step k+1 while k-1 may still read it)
#   abort_serial  cu_nccl_abort_start aborts the communicators one after
#                 the other on the calling thread, as before issue 21: with
#                 two communicators in the step graph and a collective stuck
#                 on one, NCCL's abort waits forever (for the graph, which
#                 is destroyed only after the aborts start, and for the
#                 launch the other communicator holds): tests/cuda_emu.sh's
#                 two-communicator stall must then fail (a hang, not the
#                 watchdog's exit)
#   graph_first   abort_all destroys the step graph before it raises any
#                 abort flag, as before the H200 run: cudaGraphExecDestroy
#                 waits for the launch stuck on the collective, forever (the
#                 H200's rank sat in cuGraphExecDestroy): the same stall
#                 must fail
#
# Each case runs up to twice, with collectives as late and as early as the
# events allow (DPEMU_COMM=late / early; no_sync with ascending and random
# thread orders); a mutation is caught when a run fails, and the second run
# is made only when the first did not catch it (check_all's mutations: both
# runs, each must catch it). Cases: mlp8 zero2 at 2
# ranks (two streams, reduce-scatter and all-gather), mlp8 ddp at 1 rank
# (no_sync, gemm_*); the cuBLASLt mutations (lt_*) run the 2-rank case
# (lt_bias: with biases initialised normal(0, 0.5) instead of zeros, else
# a dropped bias is still ~lr after 3 steps) under both collective
# policies and must be caught by both runs (lt_bias16 the same model in
# bf16, bb16). The bf16 cases' CPU references
# run their GEMMs on f32 copies (DP_CPU_BF16_GEMM=blas), as the emulated
# cuBLASLt does (tests/cuda_emu.sh's header says why). attn_sync runs
# tests/cuda_emu.sh's gpt2-hd64 case (head dim 64, ctx 128: four key tiles)
# under ascending and random thread orders, and both must catch it;
# the tc_* mutations run the same model in precision bf16 with SGD (a16:
# tests/cuda_emu.sh's "gpt2-hd64 bf16 sgd" case, compared as that suite
# compares its bf16 cases: losses rtol 2^-13, training updates rtol 2^-9)
# under ascending and random thread orders, and both must catch each;
# copy_wait runs it for 8 steps with device work run as late as the host
# allows (DPEMU_RUN=lazy: the copy then overtakes the step still reading).
# Each case's first use also runs it on the unmutated emulated backend, which
# must pass: a mutant counts as caught only where the same run passes
# without it.
# Runtime: ~2-4 min (one rebuild of the .cu files for no_sync).
set -u
. "$(dirname "$0")/lib.sh"
cd "$ROOT" || exit 1
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=${STEPS:-3}
# the files a mutation makes make rebuild are compiled -O1 -g0 (mk/cuda-emu.mk's
# EMU_OPT): half the CPU of -O2 -g (attention.cu: 5 s, not 11), the same
# numbers (-ffp-contract=off, no fast-math: IEEE arithmetic is the same at
# any -O), and the unmutated runs below keep the ordinary -O2 objects
MUT_OPT=${MUT_OPT:--O1 -g0}
why="" # what the last run() or stall_ends() found
t_start=$(date +%s)
if ! emu_start "the CUDA emulator's mutation checks"; then
	finish cuda_emu_mutations
	exit $?
fi

# a copy of what the emulated build needs, timestamps kept, so `make
# cuda-emu` there rebuilds only what a mutation touches; after each check
# the source and build-emu/ are put back as they were (timestamps too), so
# the next build compiles nothing but its own mutation
W=$T/tree
tree() {
	mkdir -p "$W"
	cp -a Makefile mk format util ir compiler passes runtime tests tools build build-emu "$W"/ 2>/dev/null
}
# the cases: one (mlp8, 1 rank ddp), two (zero2 at 2 ranks), biased (two
# with biases that are not zero at the start, so a dropped bias shows); b16
# and r16 below
cp models/mlp8.dp "$T/mlp8.dp"
sed 's/^  strategy ddp/  strategy zero2/' "$T/mlp8.dp" >"$T/zero2.dp"
sed 's/^\(    param b: .*\) init zeros/\1 init normal(0, 0.5)/' "$T/zero2.dp" >"$T/biased.dp"
{ echo "mesh pp=2"; grep -v '^mesh ' "$T/mlp8.dp"; } >"$T/pp2.dp" # (mlp8's grad_accum 2)
# psgd: mlp8 under compress powersgd from step 1 (orthogonalize on the device)
sed 's/^  strategy ddp/&\n  compress powersgd(rank=4, start_step=1)/' "$T/mlp8.dp" >"$T/psgd.dp"
# hd64: GPT-2's head dim at ctx 128 (tests/cuda_emu.sh's gpt2-hd64), on
# text; hd8 is the same step file run for 8 steps
hd64_model() {
	text_shard
	awk '/^eval \{/ {skip=1} skip && /^\}/ {skip=0; next} !skip' models/gpt2-tiny.dp |
		sed -e "$data" -e 's/^  global_batch .*/  global_batch 4/' >"$T/hd64.dp"
}
# a16: hd64 in precision bf16 trained with SGD (AdamW's first steps turn
# bf16 roundings into steps of ~lr: tests/cuda_emu.sh's header)
a16_model() {
	once hd64 hd64_model
	sed 's/^  optimizer .*/  optimizer sgd(lr=1e-2, momentum=0.9)/' "$T/hd64.dp" >"$T/a16.dp"
}
# voc: gpt2-tiny small with a vocabulary of 300 (logits in padded rows of 384)
voc_model() {
	text_shard
	awk '/^eval \{/ {skip=1} skip && /^\}/ {skip=0; next} !skip' models/gpt2-tiny.dp |
		sed -e "$data" -e 's/^  global_batch .*/  global_batch 4/' >"$T/voc.dp"
}
declare -A NSTEPS=([hd8]=8) # steps per case (else STEPS)
# reference CASE: its step file ($T/CASE.bin) and the CPU's run, which the
# mutated backend's runs are compared with (bf16: the GEMMs on f32 copies,
# as the emulated cuBLASLt's)
reference() {
	local np=2 src=$T/$1.dp prec= defs=
	case $1 in
	one) np=1 src=$T/mlp8.dp ;;
	two) src=$T/zero2.dp ;;
	pp2) ;;
	b16) np=1 prec=bf16 ;;
	bb16) prec=bf16 src=$T/biased.dp ;;
	r16) prec=bf16 ;;
	hd64 | hd8) np=1 src=$T/hd64.dp defs="-D ctx=128 -D d=128 -D heads=2 -D layers=1"; once hd64 hd64_model ;;
	a16) np=1 src=$T/a16.dp prec=bf16 defs="-D ctx=128 -D d=128 -D heads=2 -D layers=1"; once a16src a16_model ;;
	voc) np=1 src=$T/voc.dp defs="-D ctx=16 -D d=32 -D heads=2 -D vocab=300"; once vocsrc voc_model ;;
	esac
	# shellcheck disable=SC2086 # defs are words
	if ! "$DPC" "$src" $defs --world-size $np ${prec:+--precision $prec} -o "$T/$1.bin" >"$T/$1.dpc" 2>&1 ||
		! DP_CPU_BF16_GEMM=${prec:+blas} mpi $np "$T/$1.bin" --device cpu --steps "${NSTEPS[$1]:-$STEPS}" --quiet \
			--eval-every 0 --losses "$T/$1.cpu.loss" --save-full "$T/$1.cpu.st" >/dev/null 2>&1; then
		fail "the CPU reference of case $1: dpc or dpexec"; head -n 5 "$T/$1.dpc"
		return 1
	fi
	# a16: its training updates are compared, from the initial weights
	if [ "$1" = a16 ] && ! mpi $np "$T/$1.bin" --device cpu --steps 0 --quiet --eval-every 0 \
		--save-full "$T/$1.init.st" >/dev/null 2>&1; then
		fail "the initial weights of case $1"
		return 1
	fi
	# the unmutated emulated backend ($W/build-emu: check rebuilds it only
	# after this) must pass the case, else a mutant is "caught" by whatever
	# breaks every run (a stale build-emu refused as built for another
	# dpexec did exactly that) and not by what it changed
	if run "$1-base" "$1" $np; then
		fail "case $1 fails on the unmutated emulated backend, so no mutant can be caught by it: $why"
		return 1
	fi
}

# run NAME BIN NP ENV...: the mutated emulated backend; 0 when the run
# failed or disagrees with the CPU (the mutation was caught)
run() {
	local name=$1 bin=$2 np=$3; shift 3
	env "$@" timeout 300 mpirun --oversubscribe -np "$np" "$W/build-emu/dpexec" "$T/$bin.bin" \
		--device cuda --steps "${NSTEPS[$bin]:-$STEPS}" --quiet --eval-every 0 --losses "$T/$name.loss" \
		--save-full "$T/$name.st" >"$T/$name.log" 2>&1
	local rc=$?
	if [ $rc != 0 ]; then
		why=$(grep -m1 -E "FATAL|error:" "$T/$name.log" | sed 's/^cuda-emu: //; s/^dpexec: //' | cut -c1-170)
		[ -n "$why" ] || why="exit $rc: $(grep -v '^ \|^$\|^---' "$T/$name.log" | tail -n 1 | cut -c1-150)"
		return 0
	fi
	local lrtol=1e-5 params=(params "$T/$name.st" "$T/$bin.cpu.st" --rtol 1e-3 --atol 1e-5)
	if [ -f "$T/$bin.init.st" ]; then # bf16: tests/cuda_emu.sh's bounds
		lrtol=1.220703125e-4
		params=(updates "$T/$bin.init.st" "$T/$name.st" "$T/$bin.cpu.st" --rtol 1.953125e-3)
	fi
	if ! $PY tests/compare.py losses "$T/$name.loss" "$T/$bin.cpu.loss" --rtol $lrtol --atol 0 >"$T/$name.cmp" ||
		! $PY tests/compare.py "${params[@]}" >>"$T/$name.cmp"; then
		why="wrong numbers: $(grep -m1 -E 'EXCEEDS|step count' "$T/$name.cmp" | sed 's/^ *//' | cut -c1-120)"
		return 0
	fi
	why="passed: losses and parameters within tolerance"
	return 1
}

# mutate NAME FILE-GLOB PROGRAM...: apply PROGRAM (a command reading the
# file on stdin, writing it on stdout) to the first file of the glob it
# changes; 1 when none changed
# (the case NAME: nothing is mutated when CASE leaves it out)
mutate() {
	local name=$1 glob=$2 f; shift 2
	case_on "$name" || return 1
	once tree tree
	for f in $W/$glob; do
		"$@" <"$f" >"$T/mutated"
		if ! cmp -s "$f" "$T/mutated"; then
			cp -p "$f" "$T/original"
			echo "$f" >"$T/mutated.file"
			rm -rf "$T/build-emu" && cp -a "$W/build-emu" "$T/build-emu"
			cp "$T/mutated" "$f"
			diff "$T/original" "$f" | grep '^[<>]' | head -n 4 | sed 's/^/      /'
			return 0
		fi
	done
	fail "mutation $name does not apply any more (no file of runtime/cuda/$glob changed): update tests/cuda_emu_mutations.sh"
	return 1
}
restore() {
	cp -p "$T/original" "$(cat "$T/mutated.file")"
	rm -rf "$W/build-emu" && mv "$T/build-emu" "$W/build-emu"
}

# check NAME BIN NP ENVS...: rebuild, run under each environment (a
# comma-separated list per run) until one catches it (the next runs could
# only add catches to a check that needs one); require a caught run.
# ALL=1 (check_all): every run, each must catch it
check() {
	local name=$1 bin=$2 np=$3; shift 3
	once "$bin" reference "$bin" || { restore; return; }
	if ! make -s -j"${DP_JOBS:-$(nproc)}" -C "$W" cuda-emu EMU_OPT="$MUT_OPT" >"$T/$name.build" 2>&1; then
		fail "$name: the mutated backend does not build"; tail -n 5 "$T/$name.build"
		restore; return
	fi
	local caught=0 e i=0 lines=()
	for e in "$@"; do
		i=$((i + 1))
		# shellcheck disable=SC2086
		if run "$name-$i" "$bin" "$np" ${e//,/ }; then
			caught=$((caught + 1))
			lines+=("caught with $e: $why")
			[ "${ALL:-0}" = 1 ] || break
		else
			lines+=("NOT caught with $e: $why")
		fi
	done
	if [ $caught -gt 0 ]; then
		ok "mutation $name caught ($caught of $i runs)"
	else
		fail "mutation $name NOT caught by the emulator"
	fi
	printf '      %s\n' "${lines[@]}"
	printf '%s\n' "${lines[@]}" >"$T/$name.lines"
	restore
}

# check_all NAME BIN NP ENVS...: check, but every run must catch it
check_all() {
	local before=$nfail
	ALL=1 check "$@"
	if [ "$nfail" = "$before" ] && grep -q "NOT caught with" "$T/$1.lines"; then
		fail "mutation $1 NOT caught by every run"
	fi
}

# 1, 2: the events of the schedule (backend_cuda.c)
if mutate event_record "runtime/cuda/backend_cuda.c" \
	sed 's/^\tCU(cudaEventRecord(x->ev\[event\], x->st\[stream\]));/\t(void)x; \/* MUTATION: no record *\//'; then
	check event_record two 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
if mutate event_wait "runtime/cuda/backend_cuda.c" \
	sed 's/^\tCU(cudaStreamWaitEvent(x->st\[stream\], x->ev\[event\], 0));/\t(void)x; \/* MUTATION: no wait *\//'; then
	check event_wait two 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
# 3, 4: the GEMM's cuBLASLt descriptors (gemm.cu's plan_one)
if mutate gemm_trans "runtime/cuda/gemm.cu" sed 's/tb ? CUBLAS_OP_T : CUBLAS_OP_N/tb ? CUBLAS_OP_N : CUBLAS_OP_T/'; then
	check gemm_trans one 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
if mutate gemm_ld "runtime/cuda/gemm.cu" sed 's/(uint64_t)cw, (uint64_t)rw, lw)/(uint64_t)cw, (uint64_t)rw, lw + 1)/'; then
	check gemm_ld one 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
# 4a, 4b: cuBLASLt's epilogue and heuristic (both runs must catch them)
if mutate lt_bias "runtime/cuda/gemm.cu" sed 's/uint32_t epi = CUBLASLT_EPILOGUE_BIAS;/uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;/'; then
	check_all lt_bias biased 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
if mutate lt_bias16 "runtime/cuda/gemm.cu" sed 's/uint32_t epi = CUBLASLT_EPILOGUE_BIAS;/uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;/'; then
	check_all lt_bias16 bb16 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
# 4c, 4d: the bias gradients from the weight gradients' BGRADA epilogue
if mutate lt_bgrad "runtime/cuda/gemm.cu" sed 's/uint32_t epi = CUBLASLT_EPILOGUE_BGRADA;/uint32_t epi = CUBLASLT_EPILOGUE_BGRADB;/'; then
	check_all lt_bgrad biased 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
# 4b': the padded vocabulary's row strides (loss.cu)
if mutate vocab_leak "runtime/cuda/loss.cu" sed 's/classes = cu_cols(cu_t(a, 0)), ldx = dp_ld/classes = dp_ld(cu_t(a, 0)), ldx = dp_ld/'; then
	check_all vocab_leak voc 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
if mutate bgrad_add "runtime/cuda/gemm.cu" sed 's/o\[j\] = accumulate ? o\[j\] + v\[j\] : v\[j\];/(void)v; \/* MUTATION: the sums dropped *\//'; then
	check_all bgrad_add biased 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
# PowerSGD's orthogonalize (gemm.cu): a dot product left unsummed over the block
if mutate ortho_dot "runtime/cuda/gemm.cu" sed 's/d = block_sum(d, sh);/(void)sh; \/* MUTATION: dot not summed *\//'; then
	check ortho_dot psgd 2 DPEMU_SEED=1 DPEMU_SEED=2
fi
if mutate lt_align "runtime/cuda/gemm.cu" sed 's/MIN_ALIGNMENT_A_BYTES, g->align\[0\])/MIN_ALIGNMENT_A_BYTES, 256)/'; then
	check_all lt_align two 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
# 4e-4h: the fused linear + gelu GEMMs (passes/fuse.c): gpt2 at GPT-2's head
# dim (hd64: its MLP's 512 columns take the GELU epilogues), f32 and bf16
# (a16); every run must catch each
if mutate gelu_aux "runtime/cuda/gemm.cu" sed 's/LT(set_aux(g->op, paux, n));/LT(set_aux(g->op, po, n)); \/* MUTATION *\//'; then
	check_all gelu_aux hd64 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
if mutate gelu_half "runtime/cuda/gemm.cu" sed 's/g->d_off = fwd_gelu \&\& gelu_epi ?/g->d_off = 0 \&\& gelu_epi ? \/* MUTATION *\//'; then
	check_all gelu_half a16 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
if mutate gelu_deriv "runtime/cuda/gemm.cu" sed 's/bwd_gelu ? CUBLASLT_EPILOGUE_DGELU/bwd_gelu ? CUBLASLT_EPILOGUE_GELU_AUX \/* MUTATION *\//'; then
	check_all gelu_deriv hd64 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
if mutate gelu_map "runtime/cuda/elementwise.cu" sed 's/return dy \* (0.5f \* (1.0f + th)/return dy * ((1.0f + th) \/* MUTATION *\//'; then
	check_all gelu_map hd64 1 DPEMU_LT_EPILOGUE=0,DPEMU_SEED=1 DPEMU_LT_EPILOGUE=0,DPEMU_SEED=2
fi
# 5: the barrier in block_sum after the stores into shared memory
# shellcheck disable=SC2016
if mutate no_sync "runtime/cuda/*.cu*" awk '
	/block_sum\(V v/ { f = 1 }
	f == 1 && /sh\[[^]]*\] = v;/ { f = 2; print; next }
	f == 2 && /^[ \t]*__syncthreads\(\);/ { f = 3; sub(/__syncthreads\(\);/, "/* MUTATION: no __syncthreads */") }
	{ print }'; then
	check no_sync one 1 DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
fi
# 6: a collective reordered on one rank: rank 1 holds its first collective
# back and issues it after the second
# shellcheck disable=SC2016
if mutate reorder "runtime/cuda/backend_cuda.c" perl -0pe '
	s{^static int cu_collective\(Backend \*b, const DpInstr \*in, RtErr \*e\)\n\{}{static int cu_collective_orig(Backend *b, const DpInstr *in, RtErr *e);
/* MUTATION: rank 1 issues its first collective after its second */
static int cu_collective(Backend *b, const DpInstr *in, RtErr *e)
{
	static const DpInstr *held;
	static int done;
	if (b->comm->rank == 1 && !done) {
		if (!held) {
			held = in;
			return 0;
		}
		done = 1;
		if (cu_collective_orig(b, in, e))
			return -1;
		return cu_collective_orig(b, held, e);
	}
	return cu_collective_orig(b, in, e);
}

static int cu_collective_orig(Backend *b, const DpInstr *in, RtErr *e)
\{}m'; then
	check reorder two 2 DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
fi
# 6b: the wait before a pipeline send (the event the schedule put on the
# comm stream right before it) skipped
# shellcheck disable=SC2016
if mutate p2p_wait "runtime/cuda/backend_cuda.c" perl -0pe '
	s{(static int cu_event_wait\(Backend \*b, unsigned stream, unsigned event, RtErr \*e\)\n\{\n\tCuBackend \*x = b->impl;\n)}{$1\t/* MUTATION: no wait before a send */\n\tif (b->at.instr + 1 < b->s->nprog[b->at.prog] \&\& b->s->prog[b->at.prog][b->at.instr + 1].op == DP_OP_SEND)\n\t\treturn 0;\n}'; then
	check p2p_wait pp2 2 DPEMU_COMM=early,DPEMU_SEED=1 DPEMU_COMM=late,DPEMU_SEED=2
fi

# 7: attention's forward loop without its first barrier (ctx 128: four
# key tiles; at ctx 16 there is one and the barrier guards nothing)
if mutate attn_sync "runtime/cuda/attention.cu" \
	sed 's|^\t\t__syncthreads(); /\* the previous tile is consumed \*/|\t\t/* MUTATION: no __syncthreads */|'; then
	check_all attn_sync hd64 1 DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
fi
# 7b: the tensor-core forward (bf16): its barrier, V's fragment layout,
# K's row stride, its causal skip of a warp's tiles, P's fragment index,
# a row's quad shuffle
# tc_mutation NAME PROGRAM...: attention.cu mutated; both thread orders must
# catch it on a16
tc_mutation() {
	local name=$1; shift
	mutate "$name" "runtime/cuda/attention.cu" "$@" &&
		check_all "$name" a16 1 DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
}
tc_mutation tc_sync sed 's|^\t\t__syncthreads(); /\* tile it is in; .*|\t\t/* MUTATION: no __syncthreads */|'
tc_mutation tc_layout sed 's|cu_ldsm_t<4>(yb, |cu_ldsm<4>(yb, /* MUTATION */ |'
tc_mutation tc_stride sed 's|cu_ldsm<4>(yb, tile + (8 \* j + 8 \* (mi >> 1) + mr) \* LD|cu_ldsm<4>(yb, tile + (8 * j + 8 * (mi >> 1) + mr) * HD /* MUTATION */|'
tc_mutation tc_causal sed 's|if (k0 > wlast \|\| wfirst >= g.t)|if (k0 + BC > wlast \|\| wfirst >= g.t) /* MUTATION */|'
tc_mutation tc_frag sed -e 's|pa\[j / 2\]\[2 \* (j % 2)\] = |pa[j / 2][j % 2] = /* MUTATION */ |' \
	-e 's|pa\[j / 2\]\[2 \* (j % 2) + 1\] = |pa[j / 2][j % 2 + 2] = /* MUTATION */ |'
tc_mutation tc_shfl sed 's|^\tv += __shfl_xor_sync(CU_FULL_MASK, v, 2);|\t/* MUTATION: no xor-2 shuffle */|'
# 7c: the tensor-core backward (bf16): its row statistics, its barrier, its
# causal start
tc_mutation tcb_lse sed 's|^\t\t\tlse\[(b \* g.h + h) \* g.t + row\[r\]\] = m\[r\] + logf(l\[r\]);|\t\t\t; /* MUTATION: lse not saved */|'
tc_mutation tcb_stale sed 's|(cu_bf16 \*)cu_p(a, -1), a->fuse->lse,|(cu_bf16 *)cu_p(a, -1), (float *)0, /* MUTATION */|'
tc_mutation tcb_dterm sed 's|^\t\t\tdd\[i\] = sum;|\t\t\tdd[i] = 0; /* MUTATION: D dropped */|'
tc_mutation tcb_sync sed 's|^\t\t__syncthreads(); /\* query tile it is in; .*|\t\t/* MUTATION: no __syncthreads */|'
tc_mutation tcb_causal sed 's|if (q0 + BC - 1 < wfirst \|\| wfirst >= g.t)|if (q0 < wfirst + 16 \|\| wfirst >= g.t) /* MUTATION */|'
# 8: the staged batches' device copies overwritten while a step reads them
if mutate copy_wait "runtime/cuda/backend_cuda.c" \
	sed 's|^\tCU(cudaStreamWaitEvent(x->copy_st, x->step_done\[par\], 0));|\t(void)par; /* MUTATION: no wait for step k-2 */|'; then
	check copy_wait hd8 1 DPEMU_RUN=lazy,DPEMU_SEED=1 DPEMU_RUN=lazy,DPEMU_SEED=7
fi
# 9, 10: the communicators aborted one after the other (before issue 21),
# and the graph destroyed before the flags (before the H200 run): the
# two-communicator stall of tests/cuda_emu.sh must no longer end by the
# watchdog within --timeout + 10 s
# stall_ends NAME: the stall run ends within 13 s by the watchdog, exit 75 (0), or not (1)
stall_ends() {
	local t0 rc took
	t0=$(date +%s)
	env DPEMU_STALL=1,3:65 timeout 120 mpirun --oversubscribe -np 4 "$W/build-emu/dpexec" "$T/hsdp.bin" \
		--device cuda --steps 50 --quiet --eval-every 0 --timeout 3 >"$T/$1.log" 2>&1
	rc=$?
	took=$(($(date +%s) - t0))
	why="exit $rc after ${took}s: $(grep -m1 -E "FATAL|error:" "$T/$1.log" | sed 's/^cuda-emu: //; s/^dpexec: //' | cut -c1-150)"
	[ $rc = 75 ] && [ $took -le 13 ] && ! grep -q FATAL "$T/$1.log" &&
		grep -q "did not finish within --timeout 3 s" "$T/$1.log"
}
# shellcheck disable=SC2016
# stall_mutant NAME: the mutated backend built, the stall must not end by
# the watchdog
stall_mutant() {
	if [ ! -f "$T/hsdp.bin" ]; then
		{ echo "mesh dp_replicate=2, dp_shard=2"; grep -v '^mesh ' "$T/mlp8.dp"; } |
			sed 's/^  strategy .*/  strategy hybrid_shard/' >"$T/hsdp.dp"
		"$DPC" "$T/hsdp.dp" --world-size 4 -o "$T/hsdp.bin" >/dev/null 2>&1
	fi
	if ! make -s -C "$W" cuda-emu EMU_OPT="$MUT_OPT" >"$T/$1.build" 2>&1; then
		fail "$1: the mutated backend does not build"; tail -n 5 "$T/$1.build"
	elif stall_ends "$1"; then
		fail "mutation $1 NOT caught: the job still ended by the watchdog ($why)"
	else
		ok "mutation $1 caught: $why"
	fi
	restore
}
stall_ran=0
# shellcheck disable=SC2016
if mutate abort_serial "runtime/cuda/comm_nccl.c" perl -0pe '
	s{^void cu_nccl_abort_start\(CuNccl \*nc\)\n\{}{void cu_nccl_abort_start(CuNccl *nc)
\{
	/* MUTATION: one after the other, on this thread */
	if (nc && !nc->aborted) {
		nc->aborted = 1;
		for (int st = 0; st < DP_NSTREAM; st++)
			for (unsigned m = 0; m < NMASK; m++)
				if (nc->comm[st][m]) {
					ncclCommAbort(nc->comm[st][m]);
					nc->comm[st][m] = NULL;
				}
		if (nc->world_comm)
			ncclCommAbort(nc->world_comm);
		nc->world_comm = NULL;
		return;
	}
}m'; then
	stall_mutant abort_serial
	stall_ran=1
fi
# shellcheck disable=SC2016
if mutate graph_first "runtime/cuda/backend_cuda.c" perl -0pe '
	s{^\tcu_nccl_abort_start\(x->nccl\);\n}{\t/* MUTATION: the graph first, then the flags */
\tif (x->gexec)
\t\tcudaGraphExecDestroy(x->gexec);
\tif (x->graph)
\t\tcudaGraphDestroy(x->graph);
\tx->gexec = NULL;
\tx->graph = NULL;
\tcu_nccl_abort_start(x->nccl);
}m'; then
	stall_mutant graph_first
	stall_ran=1
fi
if [ $stall_ran = 1 ]; then
	if make -s -C "$W" cuda-emu >"$T/clean.build" 2>&1 && stall_ends abort_clean; then
		ok "the unmutated backend ends the two-communicator stall ($why)"
	else
		fail "the unmutated backend does not end the two-communicator stall: $why"
	fi
fi

# unmutated WHAT BIN NP [ENVS]: the restored copy, rebuilt, passes the case
# (the checks are not always-fail)
unmutated() {
	local env=${4:-DPEMU_SEED=3}
	case_on "unmutated $2" || return 0
	once tree tree
	once "$2" reference "$2" || return
	# shellcheck disable=SC2086
	if make -s -C "$W" cuda-emu >"$T/clean.build" 2>&1 && ! run "clean-$2" "$2" "$3" ${env//,/ }; then
		ok "the unmutated backend passes $1 ($why)"
	else
		fail "the unmutated backend fails $1: $why"
	fi
}
unmutated "the same case" two 2
unmutated "the PowerSGD case" psgd 2
unmutated "the biased case" biased 2
unmutated "the biased bf16 case" bb16 2
unmutated "the gpt2-hd64 case" hd64 1 DPEMU_THREADS=random,DPEMU_SEED=2
unmutated "the gpt2-hd64 case over 8 steps" hd8 1 DPEMU_RUN=lazy,DPEMU_SEED=7
unmutated "the gpt2-hd64 bf16 case" a16 1 DPEMU_THREADS=random,DPEMU_SEED=2
# ---- bf16 kernels (issue 14): their own paths, not the staged f32 ones ----
# 7, 8: bf16_stride walks a norm's row in 128-bit chunks with the scalar
# stride (the chunks overlap: the mean counts elements several times);
# bf16_round stores softmax's outputs truncated to bf16 instead of rounded
# to nearest even. Case: a small model in precision bf16 whose layernorm
# and softmax rows are 48 wide (the 128-bit path) beside 20-wide ones (the
# scalar path), SGD (no AdamW amplifying bf16 noise), against the CPU's
# bf16 run with run()'s tolerances; the unmutated backend passes it.
cat >"$T/b16.dp" <<'MODEL'
mesh dp_replicate=1, dp_shard=1
data {
  x: f32[batch, 64] from synthetic(n=512, classes=10)
  y: i32[batch]     from synthetic(n=512, classes=10)
}
model {
  block l1 {
    param w: f32[64, 48] init normal(0, 0.3)
    param p: f32[48] init normal(0, 0.5)
    param g: f32[48] init normal(1, 0.1)
    param b: f32[48] init normal(0, 0.1)
    t = add(linear(x, w), p)
    s = softmax(layernorm(t, g, b))
  }
  block l2 {
    param w: f32[48, 20] init normal(0, 0.5)
    param g: f32[20] init normal(1, 0.1)
    u = softmax(rmsnorm(linear(s, w), g))
  }
  block head {
    param w: f32[20, 10] init normal(0, 0.5)
    logits = linear(u, w)
  }
  loss = cross_entropy(logits, y)
}
train {
  strategy ddp
  optimizer sgd(lr=0.1)
  micro_batch 8
  seed 3
}
MODEL
if mutate bf16_stride "runtime/cuda/norm.cu" sed '0,/j += W \* blockDim.x/s//j += blockDim.x/'; then
	check bf16_stride b16 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
if mutate bf16_round "runtime/cuda/seq.cu" \
	sed 's/ov\[k\] = expf(xv\[k\] - mx) \* inv;/ov[k] = __uint_as_float(__float_as_uint(expf(xv[k] - mx) * inv) \& 0xffff0000u); \/* MUTATION: truncated *\//'; then
	check bf16_round b16 1 DPEMU_SEED=1 DPEMU_SEED=2
fi
unmutated "the bf16 case" b16 1

# bf16_clipfold: the clip folded into AdamW stops rounding g * coef to bf16
# as clip would store it (clipped<G>, optim.cu). Case: mlp8 with
# reduce_dtype bf16 at 2 ranks (bf16 gradients, clip folded into AdamW),
# against the CPU's run (bitwise equal unmutated; 6.1e-3 apart in the
# updates with the bug, which this found).
sed 's/^  strategy ddp/  strategy ddp\n  reduce_dtype bf16/' "$T/mlp8.dp" >"$T/r16.dp"
if mutate bf16_clipfold "runtime/cuda/optim.cu" \
	sed 's/return sizeof(G) == 2 ? cu_from_bf16(cu_to_bf16(g)) : g;/return g; \/* MUTATION *\//'; then
	check bf16_clipfold r16 2 DPEMU_COMM=late DPEMU_COMM=early
fi
unmutated "the reduce_dtype bf16 case" r16 2

echo "  (cuda_emu_mutations took $(($(date +%s) - t_start))s)"
finish cuda_emu_mutations
