#!/usr/bin/env bash
# tests/cuda_emu_mutations.sh - the CUDA emulator catches real bugs in the
# CUDA backend: each mutant below is a known bug written beside the code it
# breaks, as a MUTANT(name) point in runtime/cuda (runtime/cuda/mutant.h),
# a small case is run under the emulator with that mutant on, against the
# CPU, and the case must FAIL: a non-zero exit (a diagnosis from the
# emulator, or the backend's own error) or losses/parameters outside
# tests/cuda_emu.sh's tolerances.
#
# The emulator's build (make cuda-emu, -DDPEMU_MUTANTS) compiles every
# point once; DPEMU_MUTANT=NAME turns one on for a run, so no mutant
# rebuilds anything. Outside that build MUTANT(name) is the constant 0: the
# real backend's object code has neither the names nor the code they guard
# (case real-build checks $BUILD/libdpcuda.so, when there is one). Case
# points checks that the table's points and the source's are the same set,
# so a point that moved or went is a failure, as a sed that no longer
# applied was.
#
# Adding a mutant: its guarded lines in runtime/cuda (an expression
# `MUTANT(name) ? bug : right`, or `if (!MUTANT(name))` before a statement
# it drops), and one row in MUTANTS below. A mutant in the old form
# (mutate NAME FILE sed 's/RIGHT/BUG/'; check[_all] NAME CASE NP ENVS...)
# becomes the guard in the source and the row NAME NAME CASE NP RULE
# ENVS..., RULE `one` for check and `all` for check_all (tc_mutation: CASE
# a16, NP 1, `all`, the two thread orders).
#
#   subgroup      the all_reduce over a sub-group of the pipeline stages
#                 (gpp4: the tied wte's gradient over stages 0 and 3) not
#                 issued: each end stage updates wte with its own part only
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
#   ortho_dot     PowerSGD's orthogonalize (gemm.cu) leaves a dot product
#                 unsummed over the block (mlp8 under compress powersgd)
#   psgd_step     warm_start=false's fresh Q (gemm.cu's k_psgd_draw) drawn
#                 for step 0 at every step, not for the device's step
#                 (psgdf: mlp8 under powersgd(warm_start=false) from step 1)
#   vocab_leak    the classifier's kernels (loss.cu) walk a padded logits
#                 row (passes/padvocab.c) to its stride, not its classes:
#                 the padding columns leak into the softmax and the loss
#   vocab_leak16  the same on v16 (voc in bf16): the two-pass kernel of
#                 16-bit logits (k_xent_grad_rows16) walks them
#   xent_online   that kernel's online softmax sums the threads' s without
#                 rescaling each to the row's max (v16): a wrong S, wrong
#                 losses and gradients
#   vocab_split   the second call of the LM head's split weight gradient
#                 (gemm.cu's vocab_split: voc's 300 rows as 256 + 44) reads
#                 dlogits from column 0, not 256: the last 44 rows of the
#                 tied wte's gradient wrong
#   vocab_k       the head's input gradient (gemm.cu), whose k is the
#                 padded length (passes/padvocab.c's pad_rows weight),
#                 describes its padded in0 with the real columns as rows:
#                 cuBLASLt's B layout no longer matches k
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
#   add_norm      add_layernorm (passes/fuse.c: the residual add fused
#                 into the layernorm after it) stores and normalises x, not
#                 x + the residual: a residual not added before the fused
#                 layernorm (hd64: its layer's two sums feed layernorms)
#   add_norm_grad layernorm_grad_add leaves out the residual stream's
#                 gradient: dx of the layernorm alone
#   add_norm16    add_norm on v16 (bf16 rows of 32): the warp-per-row
#                 kernel (norm.cu's k_norm_fwd_w) the 16-bit rows now take
#   add_norm_grad16 add_norm_grad on v16: k_norm_bwd_w
#   add_rms       add_rmsnorm (the same fusion into Llama's rmsnorm)
#                 stores and normalises x, not x + the residual (ll:
#                 llama small, 1 rank, f32: each layer's norm2, the next
#                 norm1 and the final norm read sums)
#   add_rms_grad  rmsnorm_grad_add leaves out the residual stream's
#                 gradient: dx of the rmsnorm alone (ll)
#   norm_gb_beta  layernorm_grad_gb (passes/fuse.c: LayerNorm's gamma and
#                 beta gradients in one pass) loses beta's sum over its
#                 second chunk of rows (hd64: 512 rows, 16 chunks)
#   norm_bwd_gb   the norms' backward in one pass (norm.cu's k_norm_bwd_gb,
#                 paired by cu_plan_norm: dx and the gamma and beta sums of
#                 layernorm_grad_add + layernorm_grad_gb) loses its last
#                 warp's partial sums, its rows' dx kept (hd64: f32, the
#                 row walk, 4 warps of 8 rows a chunk)
#   norm_bwd_gb16 the same on v16 (bf16 rows of 32: the register rows)
#   rms_bwd_gb    the same in rmsnorm_grad_add + rmsnorm_grad_g (lrms: an
#                 rmsnorm of 768 trained by SGD, f32; on ll, llama's
#                 AdamW steps of lr * sign(g) hid it)
#   (norm_gb_beta's case runs under DP_NORM_GB=apart: layernorm_grad_gb's
#   own kernel, which the pairing skips on hd64)
#   bias_seg      bias_add's tiles (elementwise.cu's BiasTiles) all start
#                 at column 0: a row longer than a block's groups is added
#                 in its first segment only (hd64: the position embedding
#                 [128, 128] over each sample, 16 segments of 256 float4)
#   emb_tile_sync embedding_grad's tile sort (layout.cu's k_emb_tile) without
#                 its barrier between zeroing the tile's counts and storing
#                 its ids and their use: counts and ranks read half written
#   no_sync       block_sum's __syncthreads between the stores into shared
#                 memory and the reads of them, dropped
#   reorder       rank 1 issues its first collective after its second
#   p2p_wait      the p2p stream's wait for the compute stream right before
#                 a pipeline send dropped (mlp8 at pp=2): the send moves an
#                 activation or gradient the compute stream has not written
#   recv_wait     the compute stream's wait for a pipeline recv's done
#                 event (recorded on the p2p stream) dropped (mlp8 at
#                 pp=2): the recv's consumer reads its buffer before the
#                 transfer fills it (the emulator's NaN, under late comm)
#   bf16_stride   a norm's 128-bit row walk (bf16) steps by the scalar stride
#                 (row_stats, layernorm_grad_gb's statistics walk, and the
#                 warp-per-row kernels' x loads, wcol: b16's rows of 48,
#                 under DP_NORM_GB=apart: paired, its layernorm's gradients
#                 take the fused kernel's scalar walk, its gamma being a
#                 view not 16-byte aligned)
#   bf16_stride_gb the same in the paired norm backward's walk (l2k16: an
#                 rmsnorm of 2048 in bf16, longer than a warp's registers
#                 hold, between a learned bias and a residual add, SGD)
#   bf16_round    softmax's bf16 stores truncate instead of rounding
#   bf16_clipfold the clip folded into AdamW skips clip's bf16 rounding
#   attn_sync     the __syncthreads at the top of attention's forward loop
#                 over key tiles dropped: a thread loads the next tile over
#                 the one others still read (invisible at ctx 16, one tile)
#   tc_sync       the tensor-core forward's one __syncthreads per key
#                 tile (tile i copied in, the buffer of tile i + 1 free),
#                 dropped
#   tc_cpwait     the tensor-core forward's cp.async.wait_group before
#                 that barrier dropped (bf16): the K and V tiles' copies
#                 never land where the warps read them (stale shared
#                 memory, and the emulator's in-flight rule at return)
#   tc_layout     the tile read by ldmatrix without .trans where P Y
#                 needs Y's registers (V in the forward; K, dO, Q in the
#                 backward): Y^T's, a wrong fragment layout
#   tc_stride     the tile rows of X Y^T (K in the forward) addressed for
#                 ldmatrix with the unpadded head dim as the row stride
#                 (a wrong stride)
#   tc_causal     a forward warp skips the key tile holding its diagonal
#                 as if it were above it (a wrong causal tile bound)
#   tc_frag       P's C registers packed into the wrong A registers
#                 (a[1] taken as A[g][2q+8..], not A[g+8][2q..]: a wrong
#                 fragment index)
#   tc_shfl       row_sum (a row's sum over its quad of lanes) without
#                 the xor-2 shuffle: the tf32 forward's l sums half the
#                 row's p (t32; bf16's l is summed by an mma, fa_sum_mma)
#   tcb_lse       the tensor-core forward's row log-sum-exp never written
#   tcb_stale     the forward paired with its gradient not given the
#                 plan's lse buffer: the gradient reads a never-written
#                 (stale) lse
#   tcb_dterm     the backward's D = dO . O written as 0 (dS = P dP: the
#                 softmax's row term dropped)
#   tcb_sync      the backward's (k_attn_bwd_mma's) first __syncthreads
#                 per query tile (Q, dO, lse, D copied in, the other buffer
#                 free, dS^T's tile read), dropped
#   tcb_cpwait    the backward's cp.async.wait_group before that barrier
#                 dropped (bf16): the Q and dO tiles' copies never land
#   tcb_alayout   the backward's K and V A registers (fa_times_rows_sm,
#                 by ldmatrix from their shared rows) loaded with the
#                 matrices in B's order: a[1] and a[2] swapped
#   tcb_causal    a backward warp skips the query tile holding its keys'
#                 diagonal as if every query were before them (dK, dV and
#                 its dS^T rows for dQ)
#   tcb_dqadd     the backward's dQ part stored into its run's f32 sums,
#                 not added: a key block's part overwrites the run's
#                 earlier ones (a dropped dQ accumulation; det: with runs
#                 of two key blocks the lost part stays within the
#                 bounds against the CPU at ctx 512, as at ctx 128 before)
#   tcb_dqsync    the backward's second __syncthreads per query tile
#                 (every warp's dS^T rows stored before dQ = dS K reads
#                 them), dropped
#   tcb_dqpre     the backward's cp.async.wait_group and __syncwarp
#                 before the dQ add (bf16: every lane's copies of the
#                 tile's run sums into shared memory, fa_dq_part, landed)
#                 dropped: lanes add into chunks not yet copied
#   tcb_dqfresh   k_attn_dq_store(4) reads every run's dQ sums from row 0,
#                 where the runs are not zeroed first (the ordinary op):
#                 rows before a run's first key block were never written
#                 (det: 4 runs of 2 key blocks; a16 has one run)
#   tcb_dqvec     k_attn_dq_store4 (dQ's runs summed four columns per
#                 thread, a block per row) stores its four sums with the
#                 middle two swapped (a vector's lanes out of order)
#   tcb_rowdot    k_attn_rowdot8 (D = dO . O, 8 lanes per row) sums its
#                 lanes by xor shuffles across the warp's rows (16, 8, 4),
#                 not within a row (4, 2, 1)
#   tcb_dqlayout  dS^T's shared tile read for dQ = dS K by ldmatrix
#                 without .trans: dS^T's registers where the mma takes
#                 dS's (a wrong fragment layout)
#   tcb_dqorder   every run of key blocks adds its dQ parts into the first
#                 run's sums by atomicAdd, as the backward did before
#                 issue 23's deterministic dQ: the sums' order is the
#                 blocks' (det: k16 whose reference is the emulator's own
#                 run in ascending block and thread order, compared bit
#                 for bit; a run in another block order must differ)
#   tcb_kbsync    the backward's __syncthreads between two key blocks of a
#                 run (the last one's K rows and query tile read before
#                 the next one's are copied over them), dropped (a16: one
#                 run of both key blocks per sequence and head)
#   tune_key      dpexec --gemm-tune's choice (gemm.cu's tuner) given to the
#                 plan entries of the next distinct GEMM problem, not their
#                 own: an algorithm chosen for another problem (tune2: biased
#                 at 2 ranks, tuned, the first candidate made slow)
#   tcq_lse       the split dQ pass (k_attn_dq_mma, DP_ATTN_DQ=split in
#                 its runs' environment) reads each row's lse from the next
#                 row (a16 under the variant: tests/cuda_emu.sh's case
#                 "gpt2-hd64 bf16 sgd ddp np=1 DP_ATTN_DQ=split" is its
#                 unmutated run, within the same bounds)
#   tcb_pipebuf   the one-barrier backward (k_attn_bwd_mma's PIPE,
#                 DP_ATTN_BWD=pipe in its runs' environment) takes a query
#                 tile's dQ from the dS^T tile the next one writes, which
#                 holds the tile before it (a16 under the variant:
#                 tests/cuda_emu.sh's "gpt2-hd64 bf16 sgd ddp np=1
#                 DP_ATTN_BWD=pipe" is its unmutated run)
#   tcb_pipetail  the same variant without the last query tile's dQ after
#                 its loop (a16 under the variant: every key block's dQ
#                 parts of rows 96-127 lost)
#   gemm_f16      the GEMMs' fp16 operands described to cuBLASLt as
#                 CUDA_R_16BF (h16: mlp8 in fp16, its f16 bits read as bf16)
#   mt_chunk      the multi-tensor AdamW's chunk ends one element short
#                 (mt: the last element, or group of four, of every update
#                 left as it was)
#   mt_group      the multi-tensor AdamW takes the run's first update's
#                 group (weight_decay, lr_scale) for every update (mt: fc2's
#                 half lr lost)
#   amp_flag      the optimizers' read of fp16 loss scaling's overflow flag
#                 (CuScalars.ls_found) dropped: a step whose gradients
#                 overflowed is applied, not skipped (amp_flag_mt: the
#                 same point in the multi-tensor AdamW's launch, case mtls)
#   amp_norm      sqnorm's 16-bit paths drop the non-finite gradients from
#                 the norm (a norm made "robust" to overflow): the norm,
#                 which is the overflow check, stays finite on every rank,
#                 no rank skips, and the inf/NaN f16 gradients reach the
#                 weights (ls16: f16 gradients, zero2 at 2 ranks)
#   tcb_unpaired  the forward run again by an unpaired tensor-core
#                 backward writes each row's D as 0 (u16: a16 with
#                 attention's output added to the residual directly, so the
#                 memory plan reuses its bytes and no gradient is paired)
#   tc_cpbound    the tensor-core kernels' query span (fa_query_span) ends
#                 at the last row's index, not its position: a cp rank's
#                 second chunk loses its offset in the causal bound (c16:
#                 a16 at cp=2)
#   tc_order      the tensor-core forward's blocks, longest row tile first
#                 (fa_block), with the reversed tile index one too large:
#                 row tile 0 of every (batch, head) never run
#   tc_kvrows     the forward's whole-tile K and V copy (FaKvTile: bf16,
#                 the ordinary op) steps its source per pass of the
#                 block's threads by the shared tile's row stride, not
#                 qkv's: wrong keys and values in the tile
#   tc_diag       the forward masks a key tile only where it crosses the
#                 warp's last row, not its first: keys after a row's own
#                 visible in the tiles that cross the warp's other rows
#   tc_lsum       the bf16 forward's l (fa_sum_mma: P 1 on the tensor
#                 cores) with ones in half of B's rows: keys 8..15 of each
#                 k-step left out of the row's sum
#   tf32_frag     the tf32 kernels' P (and dS) packed with a[1] and a[2]
#                 swapped (C[g][2q+1] taken as A[g+8][q]: the bf16 layout's
#                 order, not m16n8k8 .tf32's; t32: a16 in precision tf32,
#                 tests/cuda_emu.sh's "gpt2-hd64 tf32 sgd" case and bounds)
#   tf32_cvt      the tf32 kernels' tiles and A registers not converted by
#                 cvt.rna.tf32.f32: the emulator refuses the mma's operand
#   copy_wait     stage_push's copy stream no longer waits for step k-2
#                 before it overwrites device batch copy k % 2 (dpexec
#                 pushes step k+1 while k-1 may still read it)
#   d2h_wait      offload: the copy stream's wait for a comm-stream event
#                 dropped (a gradient's D2H waits there for its
#                 reduce_scatter; off: mlp8 full_shard at 2 ranks with
#                 offload optimizer): the copy reads the shard before the
#                 collective wrote it
#   h2d_wait      offload: the comm stream's wait for an updated bf16
#                 shard's H2D (on the copy stream, right after its unit's
#                 host update) dropped before the shard's all_gather (o16:
#                 mlp8 zero2 in bf16, a bucket per layer): the gather reads
#                 the shard before the copy lands, the parameters of the
#                 step before (DPEMU_COPY_LATE=1: the emulator runs a copy
#                 only when nothing else is ready, so the gather runs first
#                 unless it waits; both runs must catch it)
#   h2d_unit      offload: an updated unit's H2D waits on the copy stream
#                 for the unit before's host update, not its own (o16): the
#                 copy reads the host bf16 shard before its own update wrote
#                 it (DPEMU_COPY_EARLY=1: a ready copy runs before anything
#                 else, so it lands before its update unless it waits for
#                 it; one run: the copies' order is the knob's, not the
#                 seed's)
#   d2h_wait_zero2  the same point as d2h_wait on o16 (zero2: each shard's
#                 reduce_scatter writes a device temporary that a D2H on the
#                 copy stream brings to the host shard, passes/offload.c's
#                 host_gradients): the copy reads the temporary before the
#                 collective wrote it (DPEMU_COPY_EARLY=1: a ready copy runs
#                 first, so it does unless it waits)
#   h2d_wait_params  the same point on op16 (off in bf16 with offload params):
#                 the gather reads its device temporary before the
#                 shard's H2D has filled it
#   host_stream   offload without clipping: an update's host function,
#                 on the copy stream after its gradient's D2H and before
#                 its bf16 shard's H2D (on16: o16 with clip_grad_norm 0),
#                 launched on the compute stream at its place in the
#                 backward instead: it no longer waits for the D2H, nor the
#                 H2D for it (DPEMU_COPY_EARLY=1: the H2D lands first and
#                 the gather reads the step before's shard; DPEMU_COPY_LATE=1:
#                 the update reads the gradient before its D2H lands)
#   host_on_device offload: a host-step instruction (the host arena's
#                 AdamW, clip, accumulation) launched as a device kernel on
#                 the pinned host arena: the emulator refuses the kernel's
#                 host pointer
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
# is made only when the first did not catch it (rule `all`: both runs, each
# must catch it). Rule `all` is for the mutants whose effect depends on the
# schedule (a dropped barrier, event or wait: attn_sync, tc_sync, tcb_*sync,
# h2d_wait); a mutant that breaks the arithmetic (a layout, a bound, a lost
# term or epilogue) is rule `one`: its two runs gave the same figures to
# the printed digits in the CI run of 2026-11-28 (tc_layout 7.062e-03 and 7.062e-03,
# tcb_dterm 3.872e-03 twice, tc_cpbound 3.880e-04 twice, ...), so the
# second run measured nothing new for ~1.7-3.5 CPU-s; every other such row
# lists its environments the other way round, so both thread orders (and
# both collective policies) still catch some of them. Cases: mlp8 zero2 at 2
# ranks (two streams, reduce-scatter and all-gather), mlp8 ddp at 1 rank
# (no_sync, gemm_*); the cuBLASLt mutations (lt_*) run the 2-rank case
# (lt_bias: with biases initialised normal(0, 0.5) instead of zeros, else
# a dropped bias is still ~lr after 3 steps) under one collective policy,
# the other when that one does not catch it (lt_bias16 the same model in
# bf16, bb16). The bf16 cases' CPU references
# run their GEMMs on f32 copies (DP_CPU_BF16_GEMM=blas), as the emulated
# cuBLASLt does (tests/cuda_emu.sh's header says why). attn_sync runs
# tests/cuda_emu.sh's gpt2-hd64 case (head dim 64, ctx 128: four key tiles)
# under ascending and random thread orders, and both must catch it;
# the tc_* mutations run the same model in precision bf16 with SGD (a16:
# tests/cuda_emu.sh's "gpt2-hd64 bf16 sgd" case, compared as that suite
# compares its bf16 cases: losses rtol 2^-13, training updates rtol 2^-9)
# under ascending or random thread orders (the barriers' mutants: both
# must catch each);
# copy_wait runs g8 (gpt2-tiny small, f32) for 5 steps with device work run
# as late as the host allows (DPEMU_RUN=lazy: the copy then overtakes the
# step still reading).
# Each case's first use also runs it with no mutant on (under the
# environment in BASE_ENV, the case's "unmutated CASE" check), which must
# pass: a mutant counts as caught only where the same case passes without
# it. abort_serial and graph_first run tests/cuda_emu.sh's two-communicator
# stall (case stall), which must end by the watchdog with no mutant on.
# Runtime: ~1-2 min.
set -u
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cuda_emu/suite.sh"
cd "$ROOT" || exit 1
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=${STEPS:-3}
why="" # what the last run() or stall_ends() found
# two mutants' runs at a time (tests/lib.sh's lane; the references run
# here, once each; DP_LANES=1: one at a time)
DP_LANES=${DP_LANES:-2}
t_start=$(date +%s)
if ! emu_start "the CUDA emulator's mutation checks"; then
	finish cuda_emu_mutations
	exit $?
fi
EMU=$ROOT/build-emu/dpexec
[ "${DP_LIST:-0}" = 1 ] || cmp_start

# the cases: one (mlp8, 1 rank ddp), two (zero2 at 2 ranks), biased (two
# with biases that are not zero at the start, so a dropped bias shows); b16
# and r16 below
cp models/mlp8.dp "$T/mlp8.dp"
sed 's/^  strategy ddp/  strategy zero2/' "$T/mlp8.dp" >"$T/zero2.dp"
sed 's/^\(    param b: .*\) init zeros/\1 init normal(0, 0.5)/' "$T/zero2.dp" >"$T/biased.dp"
{ echo "mesh pp=2"; grep -v '^mesh ' "$T/mlp8.dp"; } >"$T/pp2.dp" # (mlp8's grad_accum 2)
# gpp4: gpt2-tiny (small, as tests/cuda_emu.sh's gpt2-pp) at pp=4 under
# 1F1B, each stage keeping its own parameters (passes/stage_params.c)
gpp4_model() {
	once hd64 hd64_model
	{ echo "mesh pp=4"; grep -v '^mesh ' "$T/hd64.dp" | sed 's/^  strategy .*/&\n  grad_accum 2/'; } >"$T/gpp4.dp"
}
# psgd: mlp8 under compress powersgd from step 1 (orthogonalize on the device)
sed 's/^  strategy ddp/&\n  compress powersgd(rank=4, start_step=1)/' "$T/mlp8.dp" >"$T/psgd.dp"
# psgdf: the same with warm_start=false (a fresh Q drawn on the device every
# compressed step: runtime/powersgd.h)
sed 's/^  strategy ddp/&\n  compress powersgd(rank=4, start_step=1, warm_start=false)/' "$T/mlp8.dp" >"$T/psgdf.dp"
# hd64: GPT-2's head dim at ctx 128 (tests/cuda_emu.sh's gpt2-hd64), on
# text
hd64_model() {
	text_shard
	awk '/^eval \{/ {skip=1} skip && /^\}/ {skip=0; next} !skip' models/gpt2-tiny.dp |
		sed -e "$data" -e 's/^  global_batch .*/  global_batch 4/' >"$T/hd64.dp"
}
# g8: the same model small (ctx 16, d 32, 2 heads: tests/cuda_emu.sh's
# gpt2-tiny), global batch 8, run for 5 steps: copy_wait's case (a batch
# copy overtaking the step that reads it is a wrong batch whatever the
# model's size: caught at 1.0e-2 and 4.4e-3 relative against 1e-5, as
# hd64's 8 steps were at 5e-4..2e-3, for ~1/6 of their CPU; at 5 steps
# instead of 8 the first run's figure is the same, 1.006e-2: the step the
# copy overtakes is an early one)
g8_model() {
	once hd64src hd64_model
	sed 's/^  global_batch .*/  global_batch 8/' "$T/hd64.dp" >"$T/g8.dp"
}
# a16: hd64 in precision bf16 trained with SGD (AdamW's first steps turn
# bf16 roundings into steps of ~lr: tests/cuda_emu.sh's header)
a16_model() {
	once hd64src hd64_model
	sed 's/^  optimizer .*/  optimizer sgd(lr=1e-2, momentum=0.9)/' "$T/hd64.dp" >"$T/a16.dp"
}
# u16: a16 with no projection after attention: its gradient unpaired
# (tests/cuda_emu.sh's gpt2-unpaired)
u16_model() {
	once a16src a16_model
	sed 's/x = add(x, linear(attention(\(.*\), heads=heads), wo, bo))/x = add(x, attention(\1, heads=heads))/' \
		"$T/a16.dp" >"$T/u16.dp"
}
# c16: a16 at cp=2 (tests/cuda_emu.sh's "gpt2-hd64 bf16 sgd ddp np=2 mesh=cp=2")
c16_model() {
	once a16src a16_model
	{ echo "mesh cp=2"; grep -v '^mesh ' "$T/a16.dp"; } >"$T/c16.dp"
}
# det: k16 (below) compared bit for bit with the emulator's own run in
# ascending block and thread order (DET_REF), not with the CPU: its base
# run (descending blocks, random threads) must equal it, so dQ's sums over
# the key blocks (fa_walk's runs, summed in a fixed order) do not depend on
# the schedule, and tcb_dqorder's atomics, whose order is the blocks', do.
# Two steps (NSTEPS): tcb_dqadd, tcb_kbsync (both runs) and tcb_dqorder (its
# descending-blocks run) leave parameters that differ from the reference's
# at 2 steps as at 3; at 1 step tcb_dqorder's descending-blocks run came
# out bitwise the reference's (its random-blocks run caught it).
# tcb_kbsync's second run (ascending blocks, random threads) catches it for
# some seeds only: the random thread order draws from one stream over the
# whole run, so a kernel before the backward with fewer warp primitives
# (session 16's forward) hands the backward another schedule; with it seed
# 3 (the row's until then) and 4 missed the race, 5 catches it
DET_REF="DPEMU_BLOCKS=asc DPEMU_THREADS=asc DPEMU_SEED=1"
# k16: a16 at ctx 512, one sequence (det's model): a query row's dQ sums the
# parts of up to 8 key blocks, in 4 runs of 2 (attention.cu's fa_walk);
# against the CPU the runs' sums are tests/cuda_emu.sh's "gpt2-ctx1k bf16
# sgd" (GPT-2's ctx: 16 key blocks, 8 runs)
k16_model() {
	once a16src a16_model
	sed 's/^  global_batch .*/  global_batch 1/' "$T/a16.dp" >"$T/k16.dp"
}
# ll: models/llama.dp small (tests/cuda_emu.sh's "llama ddp np=1": ctx 16,
# d 32, 2 layers), on text: its residual adds folded into the rmsnorms
# (add_rmsnorm, rmsnorm_grad_add: passes/fuse.c)
ll_model() {
	text_shard
	awk '/^eval \{/ {skip=1} skip && /^\}/ {skip=0; next} !skip' models/llama.dp |
		sed -e "$data" -e 's/^  global_batch .*/  global_batch 8/' >"$T/ll.dp"
}
declare -A NSTEPS=([g8]=5 [det]=2) # steps per case (else STEPS)
# dpexec's own flags per case (tune2: the GEMMs tuned at load)
declare -A XARGS=([tune2]="--gemm-tune on")
# lrms: an rmsnorm of 768 between a learned bias and a residual add, SGD
# (tests/cuda_emu.sh's lnrms768; llama's AdamW moves its first steps by
# lr * sign(g), which a lost quarter of a gradient's rows leaves as it was):
# rmsnorm_grad_add and rmsnorm_grad_g, which norm.cu pairs
norm_res_model rmsnorm 768 >"$T/lrms.dp"
norm_res_model rmsnorm 2048 >"$T/l2k16.dp"
# b16: a small model in precision bf16 whose layernorm and softmax rows are
# 48 wide (the 128-bit path) beside 20-wide ones (the scalar path), SGD (no
# AdamW amplifying bf16 noise), against the CPU's bf16 run with run()'s
# tolerances (bf16_stride, bf16_round)
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
# r16: mlp8 with reduce_dtype bf16 at 2 ranks (bf16 gradients, clip folded
# into AdamW), against the CPU's run (bitwise equal unmutated; 6.1e-3 apart
# in the updates with bf16_clipfold, which this found)
sed 's/^  strategy ddp/  strategy ddp\n  reduce_dtype bf16/' "$T/mlp8.dp" >"$T/r16.dp"
# mt: mlp8 with its vectors out of weight decay (no_decay vectors) and fc2
# at half the lr: 16 updates of three groups, one multi-tensor AdamW launch
# (runtime/cuda/optim.cu's cu_plan_adamw)
sed -e 's/^  optimizer .*/&\n  no_decay vectors/' -e 's/^  block fc2 {/&\n    lr_scale 0.5/' \
	"$T/mlp8.dp" >"$T/mt.dp"
# mtls: mt in fp16 with f16 gradients and a static loss scale of 2^26, as
# ls16 (every step's gradients overflow f16, every step skipped), its 16
# updates one multi-tensor launch: amp_flag there too
sed 's/^  strategy ddp/&\n  reduce_dtype f16\n  loss_scale static(scale=67108864)/' "$T/mt.dp" >"$T/mtls.dp"
# ls16: mlp8 in fp16 under zero2 at 2 ranks with f16 gradients
# (reduce_dtype f16: the f16 reduce_scatter, unscale and sqnorm of each
# rank's shard, the all_reduced norm) and a static loss scale of 2^26, so
# every step's gradients overflow f16: unmutated every step is skipped on
# both ranks (the CPU's run, parameters unchanged); with amp_flag or
# amp_norm the first step's inf/NaN gradients reach the weights
sed 's/^  strategy ddp/  strategy zero2\n  reduce_dtype f16\n  loss_scale static(scale=67108864)/' \
	"$T/mlp8.dp" >"$T/ls16.dp"
# h16: mlp8 in fp16 (default dynamic loss scaling) at 1 rank, its GEMMs on
# f16 operands (cuBLASLt's CUDA_R_16F), compared as the bf16 cases are
cp "$T/mlp8.dp" "$T/h16.dp"
# off: mlp8 full_shard with offload optimizer (the gradient shards' D2H
# right after their reduce_scatters on the comm stream, the host step)
sed 's/^  strategy ddp/  strategy full_shard\n  offload optimizer/' "$T/mlp8.dp" >"$T/off.dp"
# o16: mlp8 zero2 in bf16 with offload optimizer and a bucket per layer:
# one host update per unit, each unit's updated bf16 shard back by an H2D on
# the copy stream that waits for its own update, and each all_gather after
# the update waiting on the comm stream for its copy
sed -e 's/^  strategy ddp/  strategy zero2\n  offload optimizer/' -e 's/^  bucket_mb .*/  bucket_mb 0.01/' \
	"$T/mlp8.dp" >"$T/o16.dp"
# on16: o16 without clipping: each unit's host update on the copy stream
# right after its gradient's D2H there, beside the rest of the backward,
# and its H2D after it in stream order (passes/offload.c's
# updates_beside_backward)
sed 's/^  clip_grad_norm .*/  clip_grad_norm 0/' "$T/o16.dp" >"$T/on16.dp"
# op16: off in bf16 with offload params (every all_gather reads a device temporary
# its shard's H2D on the copy stream filled, waited for on the comm stream)
sed 's/^  offload optimizer/  offload params/' "$T/off.dp" >"$T/op16.dp"
# BASE_ENV: the environment of each case's run with no mutant on (else
# DPEMU_SEED=3): the thread order, or the lazy device work, its mutants
# need to be caught under, passing unmutated
declare -A BASE_ENV=([hd64]="DPEMU_THREADS=random,DPEMU_SEED=2" [g8]="DPEMU_RUN=lazy,DPEMU_SEED=7"
	[a16]="DPEMU_THREADS=random,DPEMU_SEED=2" [o16]="DPEMU_COPY_LATE=1,DPEMU_SEED=3"
	[op16]="DPEMU_COPY_LATE=1,DPEMU_SEED=3" [on16]="DPEMU_COPY_LATE=1,DPEMU_SEED=3" [det]="DPEMU_BLOCKS=desc,DPEMU_THREADS=random,DPEMU_SEED=2"
	[tune2]="DPEMU_LT_SLOW=0,DPEMU_SEED=3")
# reference CASE: its step file ($T/CASE.bin) and the CPU's run, which the
# mutated backend's runs are compared with (bf16: the GEMMs on f32 copies,
# as the emulated cuBLASLt's)
reference() {
	local np=2 src=$T/$1.dp prec= defs=
	case $1 in
	one) np=1 src=$T/mlp8.dp ;;
	two) src=$T/zero2.dp ;;
	tune2) src=$T/biased.dp ;;
	pp2) ;;
	gpp4) np=4 defs="-D ctx=16 -D d=32 -D heads=2"; once gpp4src gpp4_model ;;
	b16) np=1 prec=bf16 ;;
	bb16) prec=bf16 src=$T/biased.dp ;;
	r16) prec=bf16 ;;
	ls16 | mtls) prec=fp16 ;;
	h16) np=1 prec=fp16 ;;
	o16 | op16 | on16) prec=bf16 ;;
	lrms) np=1 ;;
	l2k16) np=1 prec=bf16 ;;
	ll) np=1 defs="-D ctx=16 -D d=32 -D heads=2 -D ffn=96 -D layers=2"; once llsrc ll_model ;;
	hd64) np=1 src=$T/hd64.dp defs="-D ctx=128 -D d=128 -D heads=2 -D layers=1"; once hd64src hd64_model ;;
	a16) np=1 src=$T/a16.dp prec=bf16 defs="-D ctx=128 -D d=128 -D heads=2 -D layers=1"; once a16src a16_model ;;
	g8) np=1 src=$T/g8.dp defs="-D ctx=16 -D d=32 -D heads=2"; once g8src g8_model ;;
	# voc: hd64's model small with a vocabulary of 300 (logits in padded rows of 384)
	voc) np=1 src=$T/hd64.dp defs="-D ctx=16 -D d=32 -D heads=2 -D vocab=300"; once hd64src hd64_model ;;
	v16) np=1 src=$T/hd64.dp prec=bf16 defs="-D ctx=16 -D d=32 -D heads=2 -D vocab=300"; once hd64src hd64_model ;;
	u16) np=1 src=$T/u16.dp prec=bf16 defs="-D ctx=128 -D d=128 -D heads=2 -D layers=1"; once u16src u16_model ;;
	c16) src=$T/c16.dp prec=bf16 defs="-D ctx=128 -D d=128 -D heads=2 -D layers=1"; once c16src c16_model ;;
	det) np=1 src=$T/k16.dp prec=bf16 defs="-D ctx=512 -D d=128 -D heads=2 -D layers=1"; once k16src k16_model ;;
	t32) np=1 src=$T/a16.dp prec=tf32 defs="-D ctx=128 -D d=128 -D heads=2 -D layers=1"; once a16src a16_model ;;
	esac
	# shellcheck disable=SC2086 # defs are words
	if [ "$1" = det ]; then # (the emulator's own run: DET_REF)
		if ! "$DPC" "$src" $defs --world-size 1 --precision $prec -o "$T/det.bin" >"$T/det.dpc" 2>&1 ||
			! env $DET_REF timeout 300 "$EMU" "$T/det.bin" --device cuda --steps "${NSTEPS[det]:-$STEPS}" --quiet \
				--eval-every 0 --losses "$T/det.ref.loss" --save-full "$T/det.ref.st" >"$T/det.ref.log" 2>&1; then
			fail "the reference run of case det ($DET_REF): dpc or the emulator"; tail -n 3 "$T/det.ref.log"
			return 1
		fi
	elif ! "$DPC" "$src" $defs --world-size $np ${prec:+--precision $prec} -o "$T/$1.bin" >"$T/$1.dpc" 2>&1 ||
		! DP_CPU_BF16_GEMM=${prec:+blas} mpi $np "$T/$1.bin" --device cpu --steps "${NSTEPS[$1]:-$STEPS}" --quiet \
			--eval-every 0 --losses "$T/$1.cpu.loss" --save-full "$T/$1.cpu.st" >/dev/null 2>&1; then
		fail "the CPU reference of case $1: dpc or dpexec"; head -n 5 "$T/$1.dpc"
		return 1
	fi
	# a16, c16, u16, h16, o16, op16, on16, t32: their training updates are compared, from the initial weights
	if [[ $1 == [acuhko]16 || $1 == op16 || $1 == on16 || $1 == t32 ]] && ! mpi $np "$T/$1.bin" --device cpu --steps 0 --quiet --eval-every 0 \
		--save-full "$T/$1.init.st" >/dev/null 2>&1; then
		fail "the initial weights of case $1"
		return 1
	fi
	# the emulated backend with no mutant on must pass the case, else a
	# mutant is "caught" by whatever breaks every run (a stale build-emu
	# refused as built for another dpexec did exactly that) and not by
	# what it changed
	local base=${BASE_ENV[$1]:-DPEMU_SEED=3}
	# shellcheck disable=SC2086 # (words)
	if run "$1-base" "$1" $np ${base//,/ }; then
		fail "case $1 fails with no mutant on ($base), so no mutant can be caught by it: $why"
		return 1
	fi
}

# run NAME BIN NP ENV...: the emulated backend (DPEMU_MUTANT in ENV: a mutant); 0 when the run
# failed or disagrees with the CPU (the mutation was caught)
run() {
	local name=$1 bin=$2 np=$3; shift 3
	# shellcheck disable=SC2046 # (the launcher's words)
	# shellcheck disable=SC2086 # (XARGS: words)
	env "$@" timeout 300 $(emu_launch "$np") "$EMU" "$T/$bin.bin" ${XARGS[$bin]:-} \
		--device cuda --steps "${NSTEPS[$bin]:-$STEPS}" --quiet --eval-every 0 --losses "$T/$name.loss" \
		--save-full "$T/$name.st" >"$T/$name.log" 2>&1
	local rc=$?
	if [ $rc != 0 ]; then
		why=$(grep -m1 -E "FATAL|error:" "$T/$name.log" | sed 's/^cuda-emu: //; s/^dpexec: //' | cut -c1-170)
		[ -n "$why" ] || why="exit $rc: $(grep -v '^ \|^$\|^---' "$T/$name.log" | tail -n 1 | cut -c1-150)"
		return 0
	fi
	if [ "$bin" = det ]; then # bit for bit the reference's run
		if same_run "$T/$name" "$T/det.ref"; then
			why="passed: losses and parameters bitwise the reference's ($DET_REF)"
			return 1
		fi
		why="not bitwise the reference's run ($DET_REF): $(cmp "$T/$name.st" "$T/det.ref.st" 2>&1 | head -n 1)"
		return 0
	fi
	local lrtol=1e-5 params=(params "$T/$name.st" "$T/$bin.cpu.st" --rtol 1e-3 --atol 1e-5)
	if [ -f "$T/$bin.init.st" ]; then # bf16 (tf32): tests/cuda_emu.sh's bounds
		lrtol=1.220703125e-4
		[ "$bin" = t32 ] && lrtol=6.103515625e-5
		params=(updates "$T/$bin.init.st" "$T/$name.st" "$T/$bin.cpu.st" --rtol 1.953125e-3)
	fi
	if ! pycmp "$T/$name.cmp" losses "$T/$name.loss" "$T/$bin.cpu.loss" --rtol $lrtol --atol 0 --and "${params[@]}"; then
		why="wrong numbers: $(grep -m1 -E 'EXCEEDS|step count' "$T/$name.cmp" | sed 's/^ *//' | cut -c1-120)"
		return 0
	fi
	why="passed: losses and parameters within tolerance"
	return 1
}

# stall_ends NAME ENV...: tests/cuda_emu.sh's two-communicator stall (hsdp
# at 4 ranks, ranks 1 and 3 stopped at their 65th collective) ends within
# 13 s by the watchdog, exit 75 (0), or not (1)
stall_ends() {
	local name=$1 t0 rc took
	shift
	if [ ! -f "$T/hsdp.bin" ]; then
		{ echo "mesh dp_replicate=2, dp_shard=2"; grep -v '^mesh ' "$T/mlp8.dp"; } |
			sed 's/^  strategy .*/  strategy hybrid_shard/' >"$T/hsdp.dp"
		"$DPC" "$T/hsdp.dp" --world-size 4 -o "$T/hsdp.bin" >/dev/null 2>&1
	fi
	t0=$(date +%s)
	env "$@" DPEMU_STALL=1,3:65 timeout 120 mpirun --oversubscribe -np 4 "$EMU" "$T/hsdp.bin" \
		--device cuda --steps 50 --quiet --eval-every 0 --timeout 3 >"$T/$name.log" 2>&1
	rc=$?
	took=$(($(date +%s) - t0))
	why="exit $rc after ${took}s: $(grep -m1 -E "FATAL|error:" "$T/$name.log" | sed 's/^cuda-emu: //; s/^dpexec: //' | cut -c1-150)"
	[ $rc = 75 ] && [ $took -le 13 ] && ! grep -q FATAL "$T/$name.log" &&
		grep -q "did not finish within --timeout 3 s" "$T/$name.log"
}
# the stall's run with no mutant on: it ends by the watchdog
stall_base() {
	if stall_ends stall-base; then
		ok "the unmutated backend ends the two-communicator stall ($why)"
	else
		fail "the unmutated backend does not end the two-communicator stall, so no stall mutant can be caught: $why"
		return 1
	fi
}

# MUTANTS: one row each. NAME (the case), POINT (the MUTANT(POINT) it turns
# on; two rows may share one on different cases), CASE (reference's), NP
# (ranks), RULE (one: a run must catch it, the next runs made only while
# none has; all: every run must; stall: the stall must not end by the
# watchdog), and the environments of its runs (comma-separated variables)
MUTANTS="
event_record  event_record  two     2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
event_wait    event_wait    two     2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
gemm_trans    gemm_trans    one     1 one DPEMU_SEED=1 DPEMU_SEED=2
gemm_ld       gemm_ld       one     1 one DPEMU_SEED=1 DPEMU_SEED=2
lt_bias       lt_bias       biased  2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
lt_bias16     lt_bias       bb16    2 one DPEMU_COMM=early,DPEMU_SEED=2 DPEMU_COMM=late,DPEMU_SEED=1
lt_bgrad      lt_bgrad      biased  2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
vocab_leak    vocab_leak    voc     1 one DPEMU_SEED=2 DPEMU_SEED=1
vocab_leak16  vocab_leak    v16     1 one DPEMU_SEED=1 DPEMU_SEED=2
xent_online   xent_online   v16     1 one DPEMU_SEED=2 DPEMU_SEED=1
vocab_k       vocab_k       voc     1 one DPEMU_SEED=2 DPEMU_SEED=1
vocab_split   vocab_split   voc     1 one DPEMU_SEED=1 DPEMU_SEED=2
bgrad_add     bgrad_add     biased  2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
ortho_dot     ortho_dot     psgd    2 one DPEMU_SEED=1 DPEMU_SEED=2
psgd_step     psgd_step     psgdf   2 one DPEMU_SEED=1 DPEMU_SEED=2
lt_align      lt_align      two     2 one DPEMU_COMM=early,DPEMU_SEED=2 DPEMU_COMM=late,DPEMU_SEED=1
gelu_aux      gelu_aux      hd64    1 one DPEMU_SEED=1 DPEMU_SEED=2
gelu_half     gelu_half     a16     1 one DPEMU_SEED=2 DPEMU_SEED=1
gelu_deriv    gelu_deriv    hd64    1 one DPEMU_SEED=1 DPEMU_SEED=2
gelu_map      gelu_map      hd64    1 one DPEMU_LT_EPILOGUE=0,DPEMU_SEED=2 DPEMU_LT_EPILOGUE=0,DPEMU_SEED=1
add_norm      add_norm_no_residual hd64 1 one DPEMU_SEED=1 DPEMU_SEED=2
add_norm_grad norm_grad_no_residual hd64 1 one DPEMU_SEED=1 DPEMU_SEED=2
add_norm16    add_norm_no_residual v16 1 one DPEMU_SEED=1 DPEMU_SEED=2
add_norm_grad16 norm_grad_no_residual v16 1 one DPEMU_SEED=2 DPEMU_SEED=1
add_rms       add_rms_no_residual ll 1 one DPEMU_SEED=1 DPEMU_SEED=2
add_rms_grad  rms_grad_no_residual ll 1 one DPEMU_SEED=1 DPEMU_SEED=2
norm_gb_beta  norm_gb_beta  hd64    1 one DP_NORM_GB=apart,DPEMU_SEED=1 DP_NORM_GB=apart,DPEMU_SEED=2
norm_bwd_gb   norm_bwd_gb_warp hd64 1 one DPEMU_SEED=1 DPEMU_SEED=2
norm_bwd_gb16 norm_bwd_gb_warp v16  1 one DPEMU_SEED=2 DPEMU_SEED=1
rms_bwd_gb    norm_bwd_gb_warp lrms 1 one DPEMU_SEED=1 DPEMU_SEED=2
bias_seg      bias_seg      hd64    1 one DPEMU_SEED=1 DPEMU_SEED=2
emb_tile_sync emb_tile_sync hd64    1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
no_sync       no_sync       one     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
reorder       reorder       two     2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
p2p_wait      p2p_wait      pp2     2 one DPEMU_COMM=early,DPEMU_SEED=1 DPEMU_COMM=late,DPEMU_SEED=2
recv_wait     recv_wait     pp2     2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
subgroup      subgroup_skipped gpp4 4 one DPEMU_SEED=3
attn_sync     attn_sync     hd64    1 all DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tc_sync       tc_sync       a16     1 all DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tc_cpwait     tc_cpwait     a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tc_layout     tc_layout     a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tc_stride     tc_stride     a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tc_causal     tc_causal     a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tc_frag       tc_frag       a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tc_shfl       tc_shfl       t32     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_lse       tcb_lse       a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tcb_stale     tcb_stale     a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_dterm     tcb_dterm     a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tcb_sync      tcb_sync      a16     1 all DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_cpwait    tcb_cpwait    a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tcb_alayout   tcb_alayout   a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_causal    tcb_causal    a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_dqadd     tcb_dqadd     det     1 one DPEMU_SEED=1
tcb_dqsync    tcb_dqsync    a16     1 all DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_dqpre     tcb_dqpre     a16     1 all DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_dqfresh   tcb_dqfresh   det     1 one DPEMU_SEED=1
tcb_dqvec     tcb_dqvec     a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_rowdot    tcb_rowdot    a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcb_dqlayout  tcb_dqlayout  a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tcb_dqorder   tcb_dqorder   det     1 one DPEMU_BLOCKS=desc,DPEMU_SEED=1 DPEMU_BLOCKS=random,DPEMU_SEED=2
tcb_kbsync    tcb_kbsync    det     1 all DPEMU_THREADS=random,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_BLOCKS=asc,DPEMU_SEED=5
tcb_unpaired  tcb_unpaired  u16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tcq_lse       tcq_lse       a16     1 one DP_ATTN_DQ=split,DPEMU_THREADS=asc,DPEMU_SEED=1 DP_ATTN_DQ=split,DPEMU_THREADS=random,DPEMU_SEED=2
tcb_pipebuf   tcb_pipebuf   a16     1 one DP_ATTN_BWD=pipe,DPEMU_THREADS=asc,DPEMU_SEED=1 DP_ATTN_BWD=pipe,DPEMU_THREADS=random,DPEMU_SEED=2
tcb_pipetail  tcb_pipetail  a16     1 one DP_ATTN_BWD=pipe,DPEMU_THREADS=asc,DPEMU_SEED=1 DP_ATTN_BWD=pipe,DPEMU_THREADS=random,DPEMU_SEED=2
tc_cpbound    tc_cpbound    c16     2 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tc_order      tc_order      a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tc_kvrows     tc_kvrows     a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tc_diag       tc_diag       a16     1 one DPEMU_THREADS=asc,DPEMU_SEED=1 DPEMU_THREADS=random,DPEMU_SEED=2
tc_lsum       tc_lsum       a16     1 one DPEMU_THREADS=random,DPEMU_SEED=2 DPEMU_THREADS=asc,DPEMU_SEED=1
tf32_frag     tf32_frag     t32     1 one DPEMU_SEED=1 DPEMU_SEED=2
tf32_cvt      tf32_cvt      t32     1 one DPEMU_SEED=1 DPEMU_SEED=2
copy_wait     copy_wait     g8      1 one DPEMU_RUN=lazy,DPEMU_SEED=1 DPEMU_RUN=lazy,DPEMU_SEED=7
abort_serial  abort_serial  stall   4 stall
graph_first   graph_first   stall   4 stall
bf16_stride   bf16_stride   b16     1 one DP_NORM_GB=apart,DPEMU_SEED=1 DP_NORM_GB=apart,DPEMU_SEED=2
bf16_stride_gb bf16_stride  l2k16   1 one DPEMU_SEED=1 DPEMU_SEED=2
bf16_round    bf16_round    b16     1 one DPEMU_SEED=1 DPEMU_SEED=2
bf16_clipfold bf16_clipfold r16     2 one DPEMU_COMM=late DPEMU_COMM=early
mt_chunk      mt_chunk      mt      2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
mt_group      mt_group      mt      2 one DPEMU_COMM=early,DPEMU_SEED=2 DPEMU_COMM=late,DPEMU_SEED=1
amp_flag      amp_flag      ls16    2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
amp_flag_mt   amp_flag      mtls    2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
amp_norm      amp_norm      ls16    2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
gemm_f16      gemm_f16_type h16     1 one DPEMU_SEED=1 DPEMU_SEED=2
tune_key      tune_key      tune2   2 one DPEMU_LT_SLOW=0,DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_LT_SLOW=0,DPEMU_COMM=early,DPEMU_SEED=2
d2h_wait      d2h_wait      off     2 one DPEMU_COMM=late,DPEMU_SEED=1 DPEMU_COMM=early,DPEMU_SEED=2
host_on_device host_on_device off   2 one DPEMU_SEED=1
h2d_wait      h2d_wait      o16     2 all DPEMU_COPY_LATE=1,DPEMU_SEED=1 DPEMU_COPY_LATE=1,DPEMU_COMM=early,DPEMU_SEED=2
h2d_unit      h2d_unit      o16     2 all DPEMU_COPY_EARLY=1,DPEMU_SEED=1
d2h_wait_zero2 d2h_wait     o16     2 all DPEMU_COPY_EARLY=1,DPEMU_SEED=1
host_stream   host_stream   on16    2 all DPEMU_COPY_EARLY=1,DPEMU_SEED=1 DPEMU_COPY_LATE=1,DPEMU_SEED=2
h2d_wait_params h2d_wait    op16    2 all DPEMU_COPY_LATE=1,DPEMU_SEED=1 DPEMU_COPY_LATE=1,DPEMU_COMM=early,DPEMU_SEED=2
"

# mutant NAME POINT CASE NP RULE ENVS...: the case's reference (once),
# then its runs with DPEMU_MUTANT=POINT; caught as RULE says
mutant() {
	local name=$1 bin=$3 rule=$5
	case_on "$name" || return 0
	# (the reference here, once; the mutant's runs beside another's:
	# tests/lib.sh's lane. Not a stall's: its 13 s bound is time against
	# time, and beside a lane at a load of 25 the unmutated stall took 14 s,
	# so the lanes end first and the stall's runs are the suite's alone)
	if [ "$rule" = stall ]; then
		lane_drain
		once stall stall_base || return
		mutant_runs "$@"
		return
	fi
	once "$bin" reference "$bin" || return
	lane mutant_runs "$@"
}
mutant_runs() { # mutant_runs NAME POINT CASE NP RULE ENVS...: mutant's runs
	local name=$1 point=$2 bin=$3 np=$4 rule=$5; shift 5
	if [ "$rule" = stall ]; then
		if stall_ends "$name" DPEMU_MUTANT="$point"; then
			fail "mutation $name NOT caught: the job still ended by the watchdog ($why)"
		else
			ok "mutation $name caught: $why"
		fi
		return
	fi
	local caught=0 e i=0 lines=()
	for e in "$@"; do
		i=$((i + 1))
		# shellcheck disable=SC2086 # (words)
		if run "$name-$i" "$bin" "$np" DPEMU_MUTANT="$point" ${e//,/ }; then
			caught=$((caught + 1))
			lines+=("caught with $e: $why")
			[ "$rule" = all ] || break
		else
			lines+=("NOT caught with $e: $why")
		fi
	done
	if [ $caught = 0 ]; then
		fail "mutation $name NOT caught by the emulator"
	elif [ "$rule" = all ] && [ $caught != $i ]; then
		fail "mutation $name NOT caught by every run"
	else
		ok "mutation $name caught ($caught of $i runs)"
	fi
	printf '      %s\n' "${lines[@]}"
}
while read -r row <&3; do
	[ -n "$row" ] || continue
	# shellcheck disable=SC2086 # (a row's words)
	mutant $row </dev/null # (mpirun reads its stdin)
done 3<<<"$MUTANTS"

# unmutated CASE WHAT: the case's run with no mutant on passed (reference's
# base run, under BASE_ENV's environment)
unmutated() {
	case_on "unmutated $1" || return 0
	once "$1" reference "$1" && ok "the unmutated backend passes $2 (${BASE_ENV[$1]:-DPEMU_SEED=3})"
}
unmutated two "the same case"
unmutated psgd "the PowerSGD case"
unmutated psgdf "the PowerSGD warm_start=false case"
unmutated gpp4 "gpt2-tiny at pp=4 (stage parts sharing bytes)"
unmutated pp2 "mlp8 at pp=2 (transfers on the p2p stream)"
unmutated biased "the biased case"
unmutated bb16 "the biased bf16 case"
unmutated hd64 "the gpt2-hd64 case"
unmutated g8 "the small gpt2-tiny case over 5 steps"
unmutated a16 "the gpt2-hd64 bf16 case"
unmutated u16 "the unpaired attention case"
unmutated c16 "the cp=2 attention case"
unmutated t32 "the gpt2-hd64 tf32 case"
unmutated det "the ctx-512 bf16 case bit for bit in another block and thread order than its reference's (dQ deterministic)"
unmutated voc "the padded-vocabulary case"
unmutated v16 "the padded-vocabulary bf16 case"
unmutated ll "the llama case (add_rmsnorm, rmsnorm_grad_add)"
unmutated b16 "the bf16 case"
unmutated r16 "the reduce_dtype bf16 case"
unmutated ls16 "the fp16 overflow case (f16 gradients, zero2 at 2 ranks)"
unmutated h16 "the fp16 GEMM case"
unmutated tune2 "the tuned GEMMs case (--gemm-tune on at 2 ranks, the heuristic's first slowed)"
unmutated off "the offload optimizer case"
unmutated o16 "the offload optimizer bf16 case (zero2, an H2D per unit)"
unmutated op16 "the offload params bf16 case"
unmutated on16 "the offload optimizer bf16 case without clipping (the updates on the copy stream)"
# on16 at 1 rank under DPEMU_TRACE=1 (2 steps): the host step beside the
# backward. In the trace of the last step a host function on the copy
# stream (stream 3: an update) runs before the backward's last GEMM on the
# compute stream (stream 1: fc1's weight gradient). The emulator runs any
# ready work in a seeded order (DPEMU_COPY_EARLY=1: a ready copy first, so
# each gradient's D2H lands as soon as it can), and at 1 rank no other
# rank's timing moves it: the updates come between the GEMMs of the
# earlier layers; serialised after the backward again (on the compute
# stream after it, or waiting for its end) none does.
if case_on "on16 overlap"; then
	if "$DPC" "$T/on16.dp" --world-size 1 --precision bf16 -o "$T/on16n1.bin" >"$T/on16n1.dpc" 2>&1 &&
		env DPEMU_TRACE=1 DPEMU_COPY_EARLY=1 DPEMU_SEED=3 timeout 300 "$EMU" "$T/on16n1.bin" --device cuda \
			--steps 2 --quiet --eval-every 0 >"$T/on16n1.log" 2>&1; then
		n=$(grep -oE 'run #[0-9]+ \(stream [0-9]\): (host function|cublasLtMatmul|kernel k_step_advance)' "$T/on16n1.log" |
			awk '{ n++; l[n] = $0 }
			END {
				for (i = n; i > 0 && l[i] !~ /k_step_advance/; i--) ;
				for (j = i - 1; j > 0 && l[j] !~ /k_step_advance/; j--) ;
				for (k = i; k > j; k--) if (l[k] ~ /stream 1\).*cublasLtMatmul/) { last = k; break }
				for (k = j + 1; k < i; k++) if (l[k] ~ /stream 3\): host function/) { t++; if (k < last) c++ }
				print c + 0, t + 0
			}')
		if [ "${n% *}" -gt 0 ]; then
			ok "on16 overlap: ${n% *} of the step's ${n#* } updates run on the copy stream before the backward's last GEMM (the emulator's trace of step 2, 1 rank)"
		else
			fail "on16 overlap: no update on the copy stream before the backward's last GEMM in step 2's trace: the host step is serialised after the backward"
		fi
	else
		fail "on16 overlap: dpc or the emulator at 1 rank"; tail -n 3 "$T/on16n1.log"
	fi
fi

# points: the table's points are the source's MUTANT(...) points, no more,
# no fewer (a point that moved out of the code is a failure)
if case_on points; then
	src=$(grep -ohE '\bMUTANT\([a-z0-9_]+\)' runtime/cuda/*.c runtime/cuda/*.cu runtime/cuda/*.cuh |
		sed 's/MUTANT(\(.*\))/\1/' | sort -u)
	tab=$(awk 'NF { print $2 }' <<<"$MUTANTS" | sort -u)
	if [ "$src" = "$tab" ]; then
		ok "the $(echo "$tab" | wc -l) mutation points of runtime/cuda are the table's"
	else
		fail "the mutation points differ: < runtime/cuda's MUTANT(...), > the table's"
		diff <(echo "$src") <(echo "$tab") | grep '^[<>]' | sed 's/^/      /'
	fi
fi
# real-build: the real (nvcc) backend has no mutation point: no symbol
# dpemu_mutant and no "mutant:NAME" string (MUTANT's argument), which the
# emulator's libdpcuda.so has, one per point
real_points() { # real_points LIB: its mutation points' names and symbols
	{ nm "$1" 2>/dev/null | grep -o 'dpemu_mutant'; strings -a "$1" | grep '^mutant:'; } | sort -u
}
if ! case_on real-build; then
	:
elif [ ! -f "$BUILD/libdpcuda.so" ]; then
	skip "the real backend has no mutation point ($BUILD/libdpcuda.so is not built: no nvcc)"
elif [ "$(real_points build-emu/libdpcuda.so | wc -l)" -lt 2 ]; then
	fail "the emulator's libdpcuda.so shows no mutation point to nm and strings: the check below sees nothing"
elif [ -n "$(real_points "$BUILD/libdpcuda.so")" ]; then
	fail "$BUILD/libdpcuda.so has mutation points: $(real_points "$BUILD/libdpcuda.so" | head -n 3 | tr '\n' ' ')"
else
	ok "the real backend has no mutation point (nm and strings of $BUILD/libdpcuda.so; the emulator's has $(real_points build-emu/libdpcuda.so | grep -c '^mutant:'))"
fi

echo "  (cuda_emu_mutations took $(($(date +%s) - t_start))s)"
cmp_stop
finish cuda_emu_mutations
