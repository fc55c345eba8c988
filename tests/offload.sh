#!/usr/bin/env bash
# tests/offload.sh - `offload optimizer` (issue 26, docs/OFFLOAD.md): the
# optimizer state, the f32 masters and the update in the host arena, on the
# CPU backend where both arenas are host memory and the copies are memcpy;
# and `offload params` (the updated parameters in the host arena only, an
# H2D into a device temporary before each reader), in the cases that name
# it below.
#
# 1. Equivalence: the same step file without offload and with it give the
#    same losses and final parameters BYTE FOR BYTE (the host update is the
#    same kernel on the same f32 values in the same order): mlp under ddp,
#    zero2 and full_shard at 1, 2 and 4 ranks; gpt2-tiny under the three at
#    2 ranks; in bf16 gpt2-tiny zero2 and full_shard (d 192) at 2 ranks and mlp ddp
#    at 4 (the bf16 copy the host update writes, copied back); optimizer
#    groups (`no_decay vectors`: an update per run, each with its own
#    copies) under full_shard in bf16; SGD with
#    momentum (its momentum buffer on the host) under zero2. 3 steps of
#    grad_accum 2 each: a wrong copy (a gradient not brought to the host, a
#    parameter not brought back) changes the second step's loss.
# 2. Resume across offload settings: 2 steps and a checkpoint with offload,
#    --resume to 4 without (and the reverse) give the straight run's losses
#    and parameters bit for bit: gpt2-tiny full_shard in bf16 (sharded form:
#    the masters only in the host arena) and mlp ddp in f32 (full form: the
#    masters on the device, their host copy loaded beside them).
# 3. The step-file decoder refuses a kernel whose operands are in two
#    memory spaces (an update reading the device's gradients), naming it.
# 4. The copies overlap the backward: each gradient shard's D2H is on the
#    copy stream right after its last write (a shard's accumulation after
#    its reduce_scatter, a ddp bucket's all_reduce), right after the copy
#    stream's wait for the event the comm stream recorded after its
#    collective, so in the IR the first one comes before the last gradient
#    reduction (compile only).
# 5. `dpc --device-memory 80GiB` on the issue's Llama-style 7B shape at 1
#    rank (bf16, recompute; compile only): without offload the plan is over
#    budget, a compile error naming the arena's largest rows and values,
#    and no step file; with `offload optimizer` it fits and --stats says so.
# 6. The host update is one update per unit, and each unit's updated bf16
#    run comes back on the copy stream right after its own update, waiting
#    for that update's event only (full_shard and zero2; under zero2 the
#    all_gathers after the update wait for their copies on the comm
#    stream) (compile only; sections 1 and 2 run the schedule). With
#    offload params each all_gather reads a device temporary its own H2D
#    filled, the device arena holds no parameter, and --stats says the
#    trade of copying each parameter once a step instead (the bytes it
#    would keep on the device: the 16-bit shard).
# 7. With grad_accum > 1 those H2Ds run in the last micro-batch only, with
#    the updates: the bytes to the device per step are the shard's once
#    (--stats; compile only).
# 8. Per-block offload (a block's `offload`): gpt2-tiny with embed `offload
#    params`, the h.i blocks `offload optimizer`, lnf none (train's), against
#    gpt2-tiny without offload, byte for byte (losses and parameters) under
#    full_shard at 1 and 2 ranks, zero2 at 1 and 2 (a bucket per gradient:
#    an offload change closes a zero1/zero2 bucket as an optimizer group
#    does, so the runs compared must have the same buckets), full_shard
#    bf16 at 2; in its IR lnf's optimizer state is on the device, the
#    h.i's in the host arena (%opt.m.off), embed's masters in it
#    (%flat.params.shard.offp), and the offloaded blocks' gradients reach
#    the host during the backward (a D2H on the copy stream after each
#    one's last write, the run clipped on the host; none in the optimizer
#    tail). A sharded checkpoint of the mixed run
#    resumes with train-wide `offload optimizer`, and the reverse, bit for
#    bit (full_shard bf16).
# 9. What offload leaves on the device (compile only): gpt2.dp full_shard
#    at 4 ranks in bf16, the issue's memory goal's configuration, with and
#    without recompute: offload optimizer's arena is the 16-bit shards and
#    the temporaries of the run without offload, offload params' the
#    temporaries alone: the floor of the goal's ratio (docs/OFFLOAD.md);
#    with recompute the step's peak is the head's weight gradient's node,
#    to the byte of its closed form (what 0.35x would need to cut).
# 10. The issue's matrix, whole: mlp, gpt2-tiny and llama under ddp, zero2
#    and full_shard at 1, 2 and 4 ranks, each with offload optimizer and
#    with offload params, byte for byte without offload (section 1's runs
#    not made again); and offload (optimizer, params) composed with tp=2,
#    cp=2, pp=2 and gradient_checkpointing, byte for byte the same
#    composition without it. A sharded checkpoint saved with offload
#    optimizer or params is the one saved without, byte for byte, and
#    reshards to 4 ranks as it does.
# 11. The host step's thread count: one offloaded step file at 1 and 3
#    threads a rank (DP_NUM_THREADS), byte for byte.
# 12. The host step beside the backward: without clipping each update runs
#    on the copy stream right after its unit's gradient reaches the host,
#    while the backward goes on: byte for byte no offload (full_shard bf16,
#    zero2, ddp, pp=2), and in the IR every update on the copy stream, the
#    first before the backward's last GEMM (with clipping none).
set -u
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh

T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=3
gpt_text "$T/gpt.dp"
variant models/llama.dp "$T/llama.dp" \
	's|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|'
mlp=$T/mlp.dp # (uncompressed Fashion-MNIST: tests/lib.sh's mlp_raw)
mlp_raw "$mlp"

# pair NAME MODEL NP [dpc args...]: the model without offload and with it
# (each mode of $MODES: none and optimizer unless the caller says, e.g.
# MODES="none optimizer params"), STEPS steps each; ok when every mode gives
# the bytes of none. A mode whose run an earlier case made under the same
# NAME (the same model and arguments) is not run again, nor said again.
pair() {
	local n=$1 src=$2 np=$3 o modes=${MODES:-none optimizer} new=
	shift 3
	for o in $modes; do
		[ -s "$T/$n.$o.loss" ] && [ -s "$T/$n.$o.st" ] && continue
		new="$new $o"
		"$DPC" "$src" --world-size "$np" --set train.offload=$o "$@" -o "$T/$n.$o.bin" \
			2>"$T/$n.$o.log" || { cat "$T/$n.$o.log"; fail "$n: dpc (offload $o)"; return 1; }
		mpi "$np" "$T/$n.$o.bin" --steps $STEPS --quiet --eval-every 0 --losses "$T/$n.$o.loss" \
			--save-full "$T/$n.$o.st" >>"$T/$n.$o.log" 2>&1 ||
			{ tail -n 5 "$T/$n.$o.log"; fail "$n: dpexec (offload $o)"; return 1; }
	done
	for o in ${modes#none}; do
		case "$new " in *" $o "*) ;; *) continue ;; esac
		grep -q " host " <("$DPC" "$src" --world-size "$np" --set train.offload=$o "$@" \
			--emit=ir 2>/dev/null) || { fail "$n: nothing in host memory (offload $o)"; return 1; }
		if same_run "$T/$n.none" "$T/$n.$o"; then
			ok "$n: offload $o gives the losses and parameters of no offload, bit for bit"
		else
			paste "$T/$n.none.loss" "$T/$n.$o.loss" | head -n 5
			fail "$n: offload $o differs from no offload"
		fi
	done
}
ALL="none optimizer params"

# ---- 1. equivalence ----
# (offload params too, where the runs of none are made anyway: mlp ddp at 1
# rank, zero2 at 2, full_shard at 4; gpt2-tiny under the three at 2; llama
# under the three, ddp at 1 rank; bf16 under ddp, zero2 and full_shard)
for s in ddp zero2 full_shard; do
	for np in 1 2 4; do
		m="none optimizer"
		case "$s-$np" in ddp-1 | zero2-2 | full_shard-4) m=$ALL ;; esac
		case_on "mlp-$s-np$np" && MODES=$m pair "mlp-$s-np$np" $mlp $np --set train.strategy=$s
	done
	case_on "gpt2-tiny-$s-np2" && MODES=$ALL pair "gpt2-tiny-$s-np2" "$T/gpt.dp" 2 --set train.strategy=$s
	np=2
	[ $s = ddp ] && np=1
	case_on "llama-$s-np$np" && MODES="none params" pair "llama-$s-np$np" "$T/llama.dp" $np \
		--set train.strategy=$s -D ctx=64 -D d=64 -D layers=2 -D ffn=176
done
case_on gpt2-tiny-bf16-zero2-np2 &&
	MODES=$ALL pair gpt2-tiny-bf16-zero2-np2 "$T/gpt.dp" 2 --set train.strategy=zero2 --precision bf16
# (d 192: the host arena's offsets of the gradient shards the host
# accumulates meet those of device buffers of reduce_scatters still in
# flight, which the CPU's hazard check must tell apart by their arena)
case_on gpt2-tiny-bf16-full_shard-np2 &&
	MODES=$ALL pair gpt2-tiny-bf16-full_shard-np2 "$T/gpt.dp" 2 --set train.strategy=full_shard --precision bf16 -D d=192
case_on mlp-bf16-ddp-np4 && MODES=$ALL pair mlp-bf16-ddp-np4 $mlp 4 --precision bf16
case_on mlp-groups-bf16-full_shard-np2 && pair mlp-groups-bf16-full_shard-np2 $mlp 2 \
	--set train.strategy=full_shard --set train.no_decay=vectors --precision bf16
case_on mlp-sgd-zero2-np2 && pair mlp-sgd-zero2-np2 $mlp 2 --set train.strategy=zero2 \
	--set 'train.optimizer=sgd(lr=0.05, momentum=0.9)'

# ---- 2. resume across offload settings ----
# across NAME MODEL FORM FROM TO [dpc args...]: 2 steps offload FROM and a
# FORM checkpoint, then --resume to 4 steps with offload TO; against 4
# straight steps without offload
across() {
	local n=$1 src=$2 form=$3 from=$4 to=$5 o
	shift 5
	for o in $from $to none; do
		[ -s "$T/$n.$o.rbin" ] || "$DPC" "$src" --world-size 2 --set train.offload=$o "$@" \
			-o "$T/$n.$o.rbin" 2>/dev/null || { fail "$n: dpc (offload $o)"; return 1; }
	done
	[ -s "$T/$n.straight.loss" ] ||
		mpi 2 "$T/$n.none.rbin" --steps 4 --quiet --eval-every 0 --losses "$T/$n.straight.loss" \
			--save-full "$T/$n.straight.st" >"$T/$n.log" 2>&1 || { fail "$n: straight run"; return 1; }
	rm -rf "$T/$n.ck"
	mpi 2 "$T/$n.$from.rbin" --steps 2 --quiet --eval-every 0 --losses "$T/$n.r.loss" \
		--save-dir "$T/$n.ck" --save-form "$form" >"$T/$n.r.log" 2>&1 &&
		mpi 2 "$T/$n.$to.rbin" --steps 4 --quiet --eval-every 0 --losses "$T/$n.r.loss" \
			--resume "$T/$n.ck" --save-full "$T/$n.r.st" >>"$T/$n.r.log" 2>&1 ||
		{ tail -n 5 "$T/$n.r.log"; fail "$n: offload $from, a $form checkpoint, --resume with offload $to"; return 1; }
	if same_run "$T/$n.r" "$T/$n.straight"; then
		ok "$n: 2 steps with offload $from, a $form checkpoint, --resume to 4 with offload $to: the straight run, bit for bit"
	else
		paste "$T/$n.r.loss" "$T/$n.straight.loss"
		fail "$n: offload $from -> $to across a $form checkpoint differs from the straight run"
	fi
}
for d in optimizer:none none:optimizer params:none none:params; do
	case_on "resume-gpt2-tiny-bf16-${d/:/-to-}" &&
		across gpt-bf16 "$T/gpt.dp" sharded "${d%%:*}" "${d#*:}" --set train.strategy=full_shard --precision bf16
	case "$d" in *params*) continue ;; esac
	case_on "resume-mlp-ddp-${d/:/-to-}" && across mlp-ddp $mlp full "${d%%:*}" "${d#*:}"
done

# ---- 3. a kernel over two memory spaces ----
if case_on decoder-spaces; then
	# the update's gradient operand pointed at the reduce_scatter's device result
	# (zero2's shard is on the host, filled from that result by a D2H)
	sed 's/= adamw %flat.grads.shard,/= adamw %bucket0.grad.shard.rs,/' tests/passes/offload.out.ir >"$T/bad.ir"
	if cmp -s tests/passes/offload.out.ir "$T/bad.ir"; then
		fail "decoder-spaces: the sed did not change tests/passes/offload.out.ir"
	elif "$DPC" --from-ir "$T/bad.ir" -o "$T/bad.bin" >"$T/bad.log" 2>&1; then
		expect "an update reading device memory in the host step is refused at load" \
			"operand 0 is in device memory, the kernel runs on the host" mpi 1 "$T/bad.bin" --steps 1
	else
		cat "$T/bad.log"
		fail "decoder-spaces: dpc --from-ir of the edited IR"
	fi
fi

# ---- 4. gradient copies during the backward ----
for s in ddp full_shard; do
	case_on "d2h-overlap-$s" || continue
	"$DPC" $mlp --world-size 2 --set train.strategy=$s --set train.offload=optimizer --emit=ir \
		>"$T/ov.ir" 2>/dev/null || { fail "d2h-overlap-$s: dpc"; continue; }
	# line of the first D2H on the copy stream, of the last gradient
	# reduction; whether the line before that D2H is the copy stream's wait
	# for an event the comm stream recorded (its collective's)
	read -r first lastred waits < <(awk '/^event_record ev=[0-9]+ .*stream=comm/ {
			split($2, a, "="); comm[a[2]] = 1 }
		/= d2h .*stream=copy/ && !f { f = NR; w = prev ~ /^event_wait ev=[0-9]+ .*stream=copy/ &&
			comm[substr(prev, index(prev, "=") + 1) + 0] }
		/= (reduce_scatter|all_reduce) / && !/grad_norm/ {l = NR} { prev = $0 }
		END {print f + 0, l + 0, w + 0}' "$T/ov.ir")
	if [ "$first" -gt 0 ] && [ "$first" -lt "$lastred" ] && [ "$waits" = 1 ]; then
		ok "d2h-overlap-$s: the first gradient D2H (IR line $first) is on the copy stream, after its wait for the comm stream's event, before the last reduction (line $lastred)"
	else
		grep -n "d2h\|reduce_scatter\|all_reduce" "$T/ov.ir" | head
		fail "d2h-overlap-$s: no gradient D2H on the copy stream waiting for its collective during the backward ($first $lastred $waits)"
	fi
done

# ---- 6. the updated shards' H2Ds on the copy stream, one per unit ----
# (compile only) gpt2-tiny in bf16 at 2 ranks, full_shard and zero2: the
# host update is one adamw per unit, each followed by the H2D of its own
# bf16 run on the copy stream, and that copy waits on the copy stream for
# the event the compute stream records right after its own update (not a
# later one, not the whole host step's end); under zero2 each all_gather of
# the updated shards waits on the comm stream for a copy's event. The CPU
# runs of sections 1 and 2 show the bytes are the same.
# With offload params the shards' H2Ds fill device temporaries (%NAME.in),
# one per all_gather (the backward's re-gathers too), and the device arena
# keeps no parameter (--stats: its parameters row 0, no 16-bit row).
for s in full_shard zero2; do
	c=h2d-per-unit-$s
	case_on $c || continue
	# (zero2: buckets of about a block, so there are several units)
	"$DPC" "$T/gpt.dp" --world-size 2 --set train.strategy=$s --set train.offload=optimizer \
		--set train.bucket_mb=0.05 --precision bf16 --emit=ir >"$T/h2d.ir" 2>/dev/null || fail "$c: dpc"
	read -r nupd ncopy good bad gath gwait < <(awk '
		function evnum(s) { match(s, /ev=[0-9]+/); return substr(s, RSTART + 3, RLENGTH - 3) }
		/= adamw / { nupd++; cur = nupd; bf = $NF; for (i = 1; i <= NF; i++) if ($i ~ /bf16.*\.host,?$/) bf = $i
			sub(/,$/, "", bf); sub(/\.host$/, "", bf); after = 1; next }
		after && /^event_record ev=/ && !/stream=/ { rec[evnum($0)] = cur; after = 0; next }
		/^event_wait ev=/ && /stream=copy/ { e = evnum($0); if (e in rec) w = rec[e]; next }
		/= h2d / && / opt / && /stream=copy/ { ncopy++; if (w == cur && $1 == bf) good++; else bad++
			w = 0; copyev = 1; next }
		copyev && /^event_record ev=/ && /stream=copy/ { cp[evnum($0)] = 1; copyev = 0; next }
		/^event_wait ev=/ && /stream=comm/ { if (evnum($0) in cp) waited = 1; next }
		/ setup/ { setup = 1 }
		/= all_gather / && nupd > 0 && !setup { gath++; if (waited) gwait++ }
		/stream=comm/ && !/event_/ { waited = 0 }
		END { print nupd + 0, ncopy + 0, good + 0, bad + 0, gath + 0, gwait + 0 }' "$T/h2d.ir")
	if [ "$nupd" -ge 2 ] && [ "$ncopy" = "$nupd" ] && [ "$good" = "$nupd" ] && [ "$bad" = 0 ] &&
		{ [ $s = full_shard ] || { [ "$gath" -ge 2 ] && [ "$gwait" = "$gath" ]; }; }; then
		w=
		[ $s = zero2 ] && w="; each of the $gath all_gathers after the update waits for a copy"
		ok "$c: $nupd host updates, each followed by its own run's H2D on the copy stream waiting for that update's event only$w"
	else
		grep -n "adamw\|h2d\|all_gather\|stream=copy" "$T/h2d.ir" | tail -30
		fail "$c: $nupd updates, $ncopy copy-stream H2Ds, $good waiting for their own update, $bad not; $gwait of $gath gathers after the update wait for a copy"
	fi
done
if case_on h2d-copy-stream-params; then
	c=h2d-copy-stream-params
	"$DPC" "$T/gpt.dp" --world-size 2 --set train.strategy=full_shard --set train.offload=params \
		--precision bf16 --emit=ir >"$T/h2d.ir" 2>/dev/null || fail "$c: dpc"
	read -r ncopy good bad late < <(awk '
		function evnum(s) { match(s, /ev=[0-9]+/); return substr(s, RSTART + 3, RLENGTH - 3) }
		/= h2d .*stream=copy/ { pend = $1; ncopy++; next }
		pend != "" && /event_record ev=/ && /stream=copy/ { ev[pend] = evnum($0); pend = ""; next }
		/event_wait ev=/ && /stream=comm/ { waits[evnum($0)] = 1; next }
		/= all_gather / {
			for (i = 1; i <= NF; i++) if ($i == "all_gather") src = $(i + 1)
			if (src in ev) { if (ev[src] in waits) good++; else bad++; delete ev[src] }
		}
		/stream=comm/ && !/event_/ { delete waits }
		/= h2d / && / opt / && $1 ~ /bf16/ { late++ }
		END { print ncopy + 0, good + 0, bad + 0, late + 0 }' "$T/h2d.ir")
	if [ "$ncopy" -ge 2 ] && [ "$good" = "$ncopy" ] && [ "$bad" = 0 ] && [ "$late" = 0 ]; then
		ok "$c: $ncopy parameter H2Ds on the copy stream, each waited for by its all_gather on the comm stream; none after the update"
	else
		grep -n "h2d\|all_gather" "$T/h2d.ir" | head
		fail "$c: $ncopy copies on the copy stream, $good waited for by their all_gather, $bad not, $late H2Ds after the update"
	fi
	ngather=$(grep -c "= all_gather %[^ ]*\.in[0-9]* .* stream=comm" "$T/h2d.ir")
	"$DPC" "$T/gpt.dp" --world-size 2 --set train.strategy=full_shard --set train.offload=params \
		--precision bf16 --stats -o "$T/h2d.bin" >"$T/h2d.stats" 2>/dev/null || fail "$c: dpc --stats"
	if [ "$ngather" = "$ncopy" ] && grep -q "^parameters  *0 " "$T/h2d.stats" &&
		! grep -q "^parameters, 16-bit" "$T/h2d.stats" && grep -q "^host parameters, 16-bit" "$T/h2d.stats"; then
		ok "$c: every all_gather ($ngather) reads a device temporary its H2D filled; no parameter in the device arena"
	else
		grep "parameters" "$T/h2d.stats"
		fail "$c: $ngather all_gathers of a temporary for $ncopy H2Ds, or a parameter left in the device arena"
	fi
	# --stats says the trade of copying each parameter once a step and
	# keeping it: the once-a-step bytes are the host 16-bit shard's (its
	# row, aligned up to 256 bytes a buffer), less than the per-reader ones
	read -r per once keep h16 < <(awk '/^  of which parameters, per reader/ { p = $6 }
		/^  the same, once a step/ { o = $6 } /^  which keeps on the device/ { k = $6 }
		/^host parameters, 16-bit copies/ { h = $5 } END { print p + 0, o + 0, k + 0, h + 0 }' "$T/h2d.stats")
	if [ "$once" -gt 0 ] && [ "$per" -gt "$once" ] && [ "$keep" = "$once" ] && [ "$once" -le "$h16" ] &&
		[ $((h16 - once)) -lt 1024 ]; then
		ok "$c: --stats: $per B of parameter copies per step, per reader; $once B once a step, keeping $keep B on the device (the host 16-bit row: $h16)"
	else
		grep "parameters\|once a step\|keeps" "$T/h2d.stats"
		fail "$c: --stats' trade: per reader $per, once $once, kept $keep, host 16-bit row $h16"
	fi
fi

# ---- 7. the shards' H2Ds once per step ----
# (compile only) mlp full_shard in bf16 at 2 ranks, grad_accum 2: the
# updates run in the last micro-batch, and so does each update's H2D
# (`last`); --stats' host-to-device bytes per step are the bf16 shard once
# (2N, N its elements) and the norm's 4 bytes, not 2 x 2N + 4 (the runs of
# section 1's mlp-groups-bf16-full_shard-np2, grad_accum 2, show the bytes
# unchanged)
if case_on h2d-once-per-step; then
	a=(--world-size 2 --set train.strategy=full_shard --set train.offload=optimizer --precision bf16)
	"$DPC" $mlp "${a[@]}" --emit=ir >"$T/once.ir" 2>/dev/null &&
		"$DPC" $mlp "${a[@]}" --stats -o "$T/once.bin" >"$T/once.stats" 2>/dev/null || fail "h2d-once-per-step: dpc"
	n=$(sed -n 's/^%flat.params.shard.bf16 *: bf16\[\([0-9]*\)\].*/\1/p' "$T/once.ir")
	got=$(awk '/^copies per step, host to device/ {print $7}' "$T/once.stats")
	ncopy=$(grep -c "= h2d .*stream=copy" "$T/once.ir")
	nlast=$(grep -c "= h2d .* last stream=copy" "$T/once.ir")
	if [ -n "$n" ] && [ "$ncopy" -ge 2 ] && [ "$nlast" = "$ncopy" ] && [ "$got" = $((2 * n + 4)) ]; then
		ok "h2d-once-per-step: $ncopy shard H2Ds, each last-micro-batch only; $got B to the device per step (2 x $n + 4; per micro-batch it would be $((4 * n + 4)))"
	else
		grep "copies per step" "$T/once.stats"
		fail "h2d-once-per-step: $nlast of $ncopy copies last-only, $got B per step (want $((2 * ${n:-0} + 4)))"
	fi
fi

# ---- 5. a device memory budget ----
if case_on device-memory-7b; then
	b7="models/llama.dp -D d=4096 -D layers=32 -D heads=32 -D ffn=11008 -D vocab=32000 -D ctx=2048
		--precision bf16 --set train.gradient_checkpointing=true --set train.global_batch=1
		--world-size 1 --device-memory 80GiB"
	# shellcheck disable=SC2086
	expect "7B without offload: over --device-memory 80GiB, the largest rows named" \
		"note: the device arena's largest rows: optimizer state 50.21 GiB; parameters 25.10 GiB" \
		"$DPC" $b7 -o "$T/7b.bin"
	[ -e "$T/7b.bin" ] && fail "device-memory-7b: an over-budget plan wrote a step file"
	# shellcheck disable=SC2086
	if "$DPC" $b7 --set train.offload=optimizer --stats -o "$T/7b.bin" >"$T/7b.stats" 2>"$T/7b.log" &&
		grep -q "^device memory (--device-memory) .*80.00 GiB: fits, 48%" "$T/7b.stats" && [ -s "$T/7b.bin" ]; then
		ok "7B with offload optimizer: 38.49 GiB, fits --device-memory 80GiB"
	else
		cat "$T/7b.log"; grep -A1 "total (arena" "$T/7b.stats"
		fail "device-memory-7b: with offload optimizer the 7B shape should fit 80 GiB"
	fi
fi

# ---- 8. per-block offload ----
sed -e 's/^  block embed {/&\n    offload params/' -e 's/^    block h\[i\] {/&\n      offload optimizer/' \
	"$T/gpt.dp" >"$T/mix.dp"
[ "$(grep -c '^ *offload ' "$T/mix.dp")" = 2 ] || fail "per-block offload: the two block settings are not in mix.dp"
# mix NAME NP BASE [dpc args...]: gpt2-tiny without offload (section 1's
# run BASE where it made it) and the mix, STEPS steps each, the same bytes
mix() {
	local n=$1 np=$2 b=$3 f
	shift 3
	for f in gpt mix; do
		[ $f = gpt ] && [ -s "$T/$b.none.loss" ] && [ -s "$T/$b.none.st" ] && continue
		"$DPC" "$T/$f.dp" --world-size "$np" "$@" -o "$T/$n.$f.bin" 2>"$T/$n.$f.log" ||
			{ cat "$T/$n.$f.log"; fail "$n: dpc ($f)"; return 1; }
		mpi "$np" "$T/$n.$f.bin" --steps $STEPS --quiet --eval-every 0 --losses "$T/$n.$f.loss" \
			--save-full "$T/$n.$f.st" >>"$T/$n.$f.log" 2>&1 ||
			{ tail -n 5 "$T/$n.$f.log"; fail "$n: dpexec ($f)"; return 1; }
		[ $f = gpt ] && mv "$T/$n.gpt.loss" "$T/$b.none.loss" && mv "$T/$n.gpt.st" "$T/$b.none.st"
	done
	if same_run "$T/$b.none" "$T/$n.mix"; then
		ok "$n: per-block offload (embed params, h.i optimizer, lnf none) gives the losses and parameters of no offload, bit for bit"
	else
		paste "$T/$b.none.loss" "$T/$n.mix.loss" | head -n 5
		fail "$n: per-block offload differs from no offload"
	fi
}
for np in 1 2; do
	case_on "mix-full_shard-np$np" && mix "mix-full_shard-np$np" $np "gpt2-tiny-full_shard-np$np" \
		--set train.strategy=full_shard
	case_on "mix-zero2-np$np" && mix "mix-zero2-np$np" $np "mix-zero2-np$np" \
		--set train.strategy=zero2 --set train.bucket_mb=0.000001
done
if case_on mix-bf16-full_shard-np2; then
	mix mix-bf16-full_shard-np2 2 mix-bf16-full_shard-np2 --set train.strategy=full_shard --precision bf16
	"$DPC" "$T/mix.dp" --world-size 2 --set train.strategy=full_shard --precision bf16 --emit=ir \
		-o /dev/null >"$T/mix.ir" 2>&1
	if grep -q "^%opt.m  *: f32\[64\] .*place(dp_shard: shard0) @" "$T/mix.ir" &&
		grep -q "^%opt.m.off  *: .* host @" "$T/mix.ir" &&
		grep -q "^%flat.params.shard.offp  *: .* host @" "$T/mix.ir" &&
		grep -q "^%flat.params.shard  *: f32\[64\] .*place(dp_shard: shard0) @" "$T/mix.ir"; then
		ok "mix-bf16-full_shard-np2: lnf's state and masters on the device, h.i's state and embed's masters in the host arena"
	else
		grep "^%opt.m\|^%flat.params.shard" "$T/mix.ir" | head
		fail "mix-bf16-full_shard-np2: the IR does not place the blocks' state by their offload"
	fi
	# the offloaded blocks' gradient shards reach the host during the
	# backward: a D2H on the copy stream before the last reduce_scatter for
	# each offloaded update, which reads its run's host copy (clipped on
	# the host), and no gradient D2H is left in the optimizer tail
	read -r early lastrs nupd hostg late < <(awk '
		/= d2h %[^ ]*(grad\.|grads)[^ ]* .*stream=copy/ && !/ opt / { if (!first) first = NR; early++ }
		/= reduce_scatter / { lastrs = NR }
		/= adamw .* offload=/ { nupd++; if ($4 ~ /\.host,$/) hostg++ }
		/= d2h %[^ ]*(grad\.|grads)[^ ]* .* opt / { late++ }
		END { print early + 0, (first && first < lastrs) ? 1 : 0, nupd + 0, hostg + 0, late + 0 }' "$T/mix.ir")
	if [ "$early" -ge 2 ] && [ "$lastrs" = 1 ] && [ "$nupd" -ge 2 ] && [ "$hostg" = "$nupd" ] && [ "$late" = 0 ]; then
		ok "mix-bf16-full_shard-np2: the offloaded blocks' $early gradient D2Hs are on the copy stream during the backward (the first before the last reduce_scatter); the $nupd offloaded updates read their host copies, no gradient D2H in the optimizer tail"
	else
		grep -n "d2h\|adamw\|reduce_scatter %" "$T/mix.ir"
		fail "mix-bf16-full_shard-np2: $early gradient D2Hs in the backward (before the last reduce_scatter: $lastrs), $hostg of $nupd offloaded updates read host gradients, $late D2Hs in the tail"
	fi
fi

# mixed -> optimizer: the mix saves, train-wide offload
# optimizer resumes; and the reverse. Against across's straight run.
if case_on resume-mix-optimizer; then
	for d in mix:optimizer optimizer:mix; do
		"$DPC" "$T/mix.dp" --world-size 2 --set train.strategy=full_shard --precision bf16 \
			-o "$T/gpt-bf16.mix.rbin" 2>/dev/null || fail "resume-mix-optimizer: dpc (mix)"
		across gpt-bf16 "$T/gpt.dp" sharded "${d%%:*}" "${d#*:}" --set train.strategy=full_shard --precision bf16
	done
fi

# ---- 9. what offload leaves on the device: the floor ----
# (compile only) models/gpt2.dp full_shard at 4 ranks in bf16, the issue's
# memory goal's configuration, with and without gradient_checkpointing:
# with `offload optimizer` the device arena is the bf16 shards (2N/R bytes,
# N the parameters, R the ranks), the data, the metrics and the
# temporaries, and the temporaries are those without offload to the byte
# (no master, gradient or optimizer-state row left; no device temporary
# added at the peak); with `offload params` the arena is the temporaries
# alone, at most the shards' transient copies (2N/R) over those without
# offload. So the temporaries (activations, gathered blocks, unsharded
# gradients), which placement does not move, are the floor of the ratio
# the issue asks to be <= 0.35 (docs/OFFLOAD.md's "The floor").
if case_on memory-floor-gpt2; then
	row() { awk -v p="$1" 'index($0, p) == 1 { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/) { print $i; exit } }' "$2"; }
	for rc in false true; do
		for o in none optimizer params; do
			"$DPC" models/gpt2.dp --world-size 4 --set train.strategy=full_shard --precision bf16 \
				--set train.gradient_checkpointing=$rc --set train.offload=$o --stats \
				>"$T/floor.$o.stats" 2>"$T/floor.$o.log" ||
				{ cat "$T/floor.$o.log"; fail "memory-floor-gpt2: dpc (offload $o, recompute $rc)"; }
		done
		N=124439808 R=4
		t0=$(row "temporaries (arena region)" "$T/floor.none.stats")
		a0=$(row "total (arena size)" "$T/floor.none.stats")
		dm=$(($(row "data " "$T/floor.none.stats") + $(row "metrics " "$T/floor.none.stats")))
		ao=$(row "total (arena size)" "$T/floor.optimizer.stats")
		to=$(row "temporaries (arena region)" "$T/floor.optimizer.stats")
		ap=$(row "total (arena size)" "$T/floor.params.stats")
		bf=$(row "parameters, 16-bit copies" "$T/floor.optimizer.stats") # 2N/R, each root 256-aligned
		ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
		# with recompute the peak is the head's weight gradient's node, each
		# term what the rest of the step needs (docs/OFFLOAD.md, "The head's
		# node"): the tied f32 gradient 4 (V + ctx) d, the bf16 logits'
		# gradient 2 ctx Vpad, L - 1 checkpoints 2 ctx d, lnf's pair and
		# d.lnf.x 8 ctx d, lnf's gathered gain and bias 4 d
		V=50257 Vp=50304 C=1024 D=768 L=12
		head=$((4 * (V + C) * D + 2 * C * Vp + (L - 1) * 2 * C * D + 8 * C * D + 4 * D))
		peak=$(row "  live at the step's peak" "$T/floor.optimizer.stats")
		if [ -n "$t0" ] && [ "$to" = "$t0" ] && [ "$bf" -ge $((2 * N / R)) ] &&
			[ "$bf" -lt $((2 * N / R + 4096)) ] && [ "$ao" -eq $((bf + dm + t0)) ] &&
			[ "$ap" -ge $((dm + t0)) ] && [ "$ap" -le $((dm + t0 + 2 * N / R)) ] &&
			{ [ $rc = false ] || [ "$peak" = $head ]; }; then
			ok "gpt2.dp full_shard np4 bf16 (recompute $rc): offload optimizer $ao B = 2N/R + temporaries ($(ratio "$ao" "$a0")x of $a0), params $ap B ($(ratio "$ap" "$a0")x); temporaries $t0 B alone $(ratio "$t0" "$a0")x${peak:+; the peak $peak B}"
		else
			[ $rc = true ] && echo "    the step's peak $peak B, the head's node's closed form $head B"

			fail "memory-floor-gpt2 (recompute $rc): none $a0 (temporaries $t0), optimizer $ao (temporaries $to), params $ap; want optimizer = the 16-bit row $bf (2N/R $((2 * N / R))) + $dm + $t0"
		fi
	done
fi

# ---- 10. the issue's matrix and the compositions (each against no offload) ----
# The matrix of issue 26's tests: mlp, gpt2-tiny and llama (tiny: -D ctx=64
# d=64 layers=2 ffn=176) under ddp, zero2 and full_shard at 1, 2 and 4
# ranks, each with `offload optimizer` and with `offload params`, losses
# and final parameters byte for byte the run without offload's (pair: the
# same STEPS steps). One case a model; the configurations section 1 runs
# already (its mlp, gpt2-tiny at 2 ranks, three of llama's) are not run
# again when it ran (pair finds their files), so the case adds only what
# the matrix lacked there: mlp's offload params at six configurations,
# gpt2-tiny at 1 and 4 ranks, llama's offload optimizer and its other rank
# counts.
# The compositions, gpt2-tiny in each with offload optimizer and params,
# byte for byte the same composition without offload: tp=2 x dp_shard=2
# full_shard (4 ranks; each tp rank's shards its own), cp=2 x dp_shard=2
# zero2 (4), pp=2 ddp (2; tests/pipeline.sh's offload case runs optimizer
# over 10 steps), gradient_checkpointing under full_shard in bf16 (2: the
# backward's re-gathers read their own H2D temporaries under params).
# That these comparisons can fail: a host update with another constant
# (runtime/cpu/optim.c's bias correction computed in f32, not double, on
# the offloaded instructions only) fails every one of them (the commit
# says how it was run).
L="-D ctx=64 -D d=64 -D layers=2 -D ffn=176"
for m in mlp gpt2-tiny llama; do
	case_on "matrix-$m" || continue
	for s in ddp zero2 full_shard; do
		for np in 1 2 4; do
			case $m in
			mlp) MODES=$ALL pair "mlp-$s-np$np" $mlp $np --set train.strategy=$s ;;
			gpt2-tiny) MODES=$ALL pair "gpt2-tiny-$s-np$np" "$T/gpt.dp" $np --set train.strategy=$s ;;
			# shellcheck disable=SC2086 # (L's words)
			llama) MODES=$ALL pair "llama-$s-np$np" "$T/llama.dp" $np --set train.strategy=$s $L ;;
			esac
		done
	done
done
{ echo "mesh tp=2, dp_shard=auto"; grep -v '^mesh ' "$T/gpt.dp"; } >"$T/gpt-tp2.dp"
{ echo "mesh cp=2, dp_shard=auto"; grep -v '^mesh ' "$T/gpt.dp"; } >"$T/gpt-cp2.dp"
{ echo "mesh pp=2, dp_shard=auto"; grep -v '^mesh ' "$T/gpt.dp"; } >"$T/gpt-pp2.dp"
case_on compose-tp && MODES=$ALL pair compose-tp2xfs "$T/gpt-tp2.dp" 4 --set train.strategy=full_shard
case_on compose-cp && MODES=$ALL pair compose-cp2xzero2 "$T/gpt-cp2.dp" 4 --set train.strategy=zero2
case_on compose-pp && MODES=$ALL pair compose-pp2-ddp "$T/gpt-pp2.dp" 2
case_on compose-recompute && MODES=$ALL pair compose-recompute-bf16-fs "$T/gpt.dp" 2 \
	--set train.strategy=full_shard --precision bf16 --set train.gradient_checkpointing=true
# Checkpoints are placement-free: 2 steps of gpt2-tiny full_shard in bf16 at
# 2 ranks without offload, with offload optimizer and with offload params,
# each saving a sharded checkpoint: the shards' bytes are the same (so
# resume and reshard mean what they mean without offload), and the
# params run's checkpoint reshards to 4 ranks without offload, its losses
# those of the checkpoint without offload resumed there, byte for byte.
if case_on checkpoint-bytes; then
	c=checkpoint-bytes
	a=(--set train.strategy=full_shard --precision bf16)
	for o in none optimizer params; do
		rm -rf "$T/cb.$o"
		"$DPC" "$T/gpt.dp" --world-size 2 "${a[@]}" --set train.offload=$o -o "$T/cb.$o.bin" 2>/dev/null &&
			mpi 2 "$T/cb.$o.bin" --steps 2 --quiet --eval-every 0 --save-dir "$T/cb.$o" \
				--save-form sharded >"$T/cb.$o.log" 2>&1 || { tail -n 5 "$T/cb.$o.log"; fail "$c: offload $o"; }
	done
	same=0
	for o in optimizer params; do
		for f in "$T"/cb.none/step-000002/shard-*.safetensors; do
			cmp -s "$f" "$T/cb.$o/step-000002/${f##*/}" && same=$((same + 1))
		done
	done
	"$DPC" "$T/gpt.dp" --world-size 4 "${a[@]}" -o "$T/cb4.bin" 2>/dev/null || fail "$c: dpc at 4 ranks"
	for o in none params; do
		mpi 4 "$T/cb4.bin" --steps 4 --quiet --eval-every 0 --resume "$T/cb.$o" --losses "$T/cb4.$o.loss" \
			>"$T/cb4.$o.log" 2>&1 || { tail -n 5 "$T/cb4.$o.log"; fail "$c: --resume at 4 ranks ($o)"; }
	done
	if [ $same = 4 ] && [ "$(grep -c '^[34] ' "$T/cb4.params.loss")" = 2 ] &&
		cmp -s "$T/cb4.none.loss" "$T/cb4.params.loss"; then
		ok "$c: the sharded checkpoints with offload optimizer and params are no offload's, byte for byte; resharded to 4 ranks, the params one resumes as no offload's"
	else
		paste "$T/cb4.none.loss" "$T/cb4.params.loss"
		fail "$c: $same of 4 shard files equal no offload's, or the resharded resume differs"
	fi
fi


# ---- 11. the host step's thread count ----
# The host step (docs/OFFLOAD.md, "Why the host step is bit-identical") is
# split over the rank's threads in static pieces, elementwise, and its
# norm summed in double over fixed blocks of 65536 elements added in block
# order, so its bytes do not depend on how many threads a rank has: the
# same offloaded step file (gpt2-tiny at d 192, full_shard in bf16 at 2
# ranks, offload optimizer: each unit's gradient shard accumulated on the
# host over grad_accum 2, its squared norm, the clip, AdamW and the bf16
# copy there; an h.i unit's shard is 221k elements, 4 norm blocks) run at
# 1 and at 3 threads a rank (DP_NUM_THREADS, runtime/cpu/pool.c) gives the
# same losses and final parameters byte for byte. (The device's kernels
# run at those counts too, and are the same bytes at any count.) That it
# can fail: the norm summed in f32 over each thread's piece instead of in
# double over fixed blocks (runtime/cpu/optim.c's run_sqnorm, by hand)
# fails it, step 1's grad norm 7.24087429 at 1 thread, 7.24160242 at 3.
# (A sum in double over each thread's piece is not caught: its six norms
# here round to the same f32 at both counts.)
if case_on host-step-threads; then
	c=host-step-threads
	"$DPC" "$T/gpt.dp" --world-size 2 --set train.strategy=full_shard --precision bf16 -D d=192 \
		--set train.offload=optimizer -o "$T/$c.bin" 2>"$T/$c.log" || { cat "$T/$c.log"; fail "$c: dpc"; }
	for n in 1 3; do
		DP_NUM_THREADS=$n mpi 2 "$T/$c.bin" --steps $STEPS --quiet --eval-every 0 --losses "$T/$c.$n.loss" \
			--save-full "$T/$c.$n.st" >>"$T/$c.log" 2>&1 || { tail -n 5 "$T/$c.log"; fail "$c: dpexec at $n threads"; }
	done
	if [ -s "$T/$c.1.loss" ] && same_run "$T/$c.1" "$T/$c.3"; then
		ok "$c: the offloaded step at 1 and 3 threads a rank: the same losses and parameters, bit for bit"
	else
		paste "$T/$c.1.loss" "$T/$c.3.loss" | head -n 5
		fail "$c: the offloaded step at 3 threads a rank differs from 1"
	fi
fi
# ---- 12. the host step beside the backward (no clipping) ----
# Without clip_grad_norm an update reads no global norm, only its own
# unit's gradient, so each offloaded update runs on the copy stream as soon
# as that gradient is on the host (after its D2H there, or the host
# accumulation's event), beside the rest of the backward, its H2D after it
# in stream order (passes/offload.c's updates_beside_backward). Byte for
# byte no offload without clipping: gpt2-tiny full_shard in bf16 at 2
# ranks (d 192: each shard accumulated on the host over grad_accum 2, then
# updated there while the earlier blocks' backward runs), mlp zero2 and
# ddp in f32 at 2 ranks (the f32 masters mirrored on the device: compute
# or the all_gathers read them, so each H2D of an updated master waits for
# the backward's last reader of its unit), gpt2-tiny at pp=2 (each stage's
# updates), with offload optimizer and, for gpt2-tiny full_shard, offload
# params. In each offload step file's IR every update is on the copy stream
# and the first comes before the backward's last GEMM; with clipping
# (section 1's gpt2-tiny full_shard bf16) none is (the update reads the
# clipped gradient). That the runs can fail: the CPU's queue runs an update
# late, at the first wait for its event; a wrong wait (an update before its
# gradient's D2H, a shard's H2D before its update) gives another step's
# bytes (the emulator's host_stream mutant, tests/cuda_emu_mutations.sh).
if case_on host-step-beside-backward; then
	c=host-step-beside-backward
	nc=(--set train.clip_grad_norm=0)
	MODES=$ALL pair noclip-gpt2-tiny-bf16-full_shard-np2 "$T/gpt.dp" 2 --set train.strategy=full_shard \
		--precision bf16 -D d=192 "${nc[@]}"
	pair noclip-mlp-zero2-np2 $mlp 2 --set train.strategy=zero2 "${nc[@]}"
	pair noclip-mlp-ddp-np2 $mlp 2 --set train.strategy=ddp "${nc[@]}"
	pair noclip-pp2-ddp "$T/gpt-pp2.dp" 2 "${nc[@]}"
	# overlap SRC NP ARGS...: the updates on the copy stream, the first before the backward's last GEMM
	overlap() {
		local src=$1 np=$2
		shift 2
		"$DPC" "$src" --world-size "$np" "$@" --emit=ir 2>/dev/null | awk '
			/ = (adamw|sgd) / { n++; if ($0 !~ /stream=copy/) bad++; if (!first) first = NR }
			/ = matmul .* bwd / { last = NR }
			END { exit !(n > 0 && !bad && first < last) }'
	}
	bad=
	for a in "$T/gpt.dp 2 --set train.strategy=full_shard --precision bf16 -D d=192 --set train.offload=optimizer" \
		"$T/gpt.dp 2 --set train.strategy=full_shard --precision bf16 -D d=192 --set train.offload=params" \
		"$mlp 2 --set train.strategy=zero2 --set train.offload=optimizer" \
		"$mlp 2 --set train.strategy=ddp --set train.offload=optimizer" \
		"$T/gpt-pp2.dp 2 --set train.offload=optimizer"; do
		# shellcheck disable=SC2086 # (a's words)
		overlap $a "${nc[@]}" || bad="$bad; $a"
	done
	"$DPC" "$T/gpt.dp" --world-size 2 --set train.strategy=full_shard --precision bf16 -D d=192 \
		--set train.offload=optimizer --emit=ir 2>/dev/null | grep -q ' = adamw .*stream=copy' &&
		bad="$bad; with clipping an update is on the copy stream"
	if [ -z "$bad" ]; then
		ok "$c: without clipping every update is on the copy stream, the first before the backward's last GEMM; with clipping none"
	else
		fail "$c: ${bad#; }"
	fi
fi

finish offload
