#!/usr/bin/env bash
# bench/gpu_gpt.sh - GPT-2 training throughput on one GPU: dp's CUDA backend
# (graph replay, --no-graph, `precision tf32` and `precision bf16`) against
# PyTorch eager and torch.compile (bench/gpu_gpt.py) on the same model, batch,
# optimizer and dtype, in one run. Not a test. The GPU kit (tools/gpu-kit,
# docs/CUDA.md) runs the bf16 GPT-2 124M row of it at micro-batch 16 x 1024.
#
# NEVER RUN ON A GPU YET (docs/CUDA.md): written to run unchanged on one.
# Without a usable GPU (or without build/libdpcuda.so) it prints SKIPPED and
# exits 0.
#
#   bash bench/gpu_gpt.sh                     # gpt2-tiny and gpt2 (124M)
#   MODELS=gpt2 STEPS=50 bash bench/gpu_gpt.sh
#   PEAK_TFLOPS=67 PEAK_TF32_TFLOPS=495 PEAK_BF16_TFLOPS=989 (H100 SXM: fp32
#   non-tensor, dense TF32, dense bf16)
#   DEVICE_MEMORY=141GiB     the budget of the largest-micro-batch row (below)
#   DRY_RUN=1 bash bench/gpu_gpt.sh   no GPU needed: compile everything and
#                            print the runs it would make instead of making them
#
# Besides the rows at the models' own batch, a bf16 row at the largest
# micro-batch whose memory plan fits the GPU (`dpc --stats --device h100
# --device-memory M`, compiler/fit.c; the model's grad_accum kept), capped
# at MAX_MICRO_BATCH (default 512: gpt2-tiny would fit ~260,000). M is
# DEVICE_MEMORY, else nvidia-smi's memory.total less 6 % (the CUDA context,
# cuBLASLt's workspace and NCCL's buffers live outside dp's arena), else
# dpc's h100 figure, 80 GiB.
#
# Per configuration: tokens/s, host microseconds per step (dp: the time
# dpexec's loop spends launching and staging, `--verbose`; PyTorch: the
# process CPU time of the step loop), and MFU = FLOPs per optimizer step
# (`dpc --stats`: the model's forward + backward + optimizer FLOPs, the same
# count for both sides) / step time / peak. The models keep their .dp
# training settings (global batch, grad_accum, AdamW, clip 1.0); data are
# byte-level tokens of the fortunes text (build/text2shard), else of the
# test corpus (the GPL-3 text), which is all a throughput figure needs.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-30}
MODELS=${MODELS:-"gpt2-tiny gpt2"}
PEAK_TFLOPS=${PEAK_TFLOPS:-67}
PEAK_TF32_TFLOPS=${PEAK_TF32_TFLOPS:-495}
PEAK_BF16_TFLOPS=${PEAK_BF16_TFLOPS:-989}
PY=${PY:-python3}
DRY_RUN=${DRY_RUN:-0}
MAX_MICRO_BATCH=${MAX_MICRO_BATCH:-512}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

skip() {
	echo "************************************************************"
	echo "SKIPPED: GPU benchmark not run: $1"
	echo "************************************************************"
	exit 0
}
[ -x "$BUILD/dpc" ] && [ -x "$BUILD/dpexec" ] || skip "$BUILD/dpc and $BUILD/dpexec are not built"
if [ "$DRY_RUN" = 1 ]; then
	echo "DRY_RUN=1: compiling, and printing the runs instead of making them"
else
	[ -f "$BUILD/libdpcuda.so" ] || skip "$BUILD/libdpcuda.so is not built (make cuda)"
	"$BUILD/dpc" models/mlp.dp --world-size 1 -o "$T/probe.bin"
	if ! "$BUILD/dpexec" "$T/probe.bin" --no-timestamps --device cuda --steps 0 --eval-every 0 >"$T/probe" 2>&1; then
		skip "no usable GPU ($(tail -n 1 "$T/probe"))"
	fi
	grep "^device:" "$T/probe" || true
fi

# the budget of the largest-micro-batch row (dpc's --device-memory form)
mem=${DEVICE_MEMORY:-}
if [ -z "$mem" ] && [ "$DRY_RUN" != 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
	mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null |
		head -n 1 | tr -dc 0-9 || true)
	[ -z "$mib" ] || mem="$((mib * 94 / 100))MiB"
fi
echo "largest-micro-batch row: device memory ${mem:-80GiB, dpc for h100}, at most $MAX_MICRO_BATCH"

# token data: byte-level shards of the fortunes text at the paths the models read
mkdir -p build/data
if [ ! -f build/data/fortunes.bin ] || [ ! -f build/data/train.bin ]; then
	src=$(ls /usr/share/games/fortunes/* 2>/dev/null | grep -v '\.\(dat\|u8\)$' | head -n 20 || true)
	# no fortunes (a bare GPU machine): the test corpus, the GPL-3 text the
	# CUDA tests train on (tests/cuda_emu.sh); a throughput figure needs no more
	# (64 times over: ~2.2 M tokens, more than the largest micro-batch row's
	# global batch, 2 x 512 x 1024)
	[ -n "$src" ] || { [ -f /usr/share/common-licenses/GPL-3 ] &&
		src=$(yes /usr/share/common-licenses/GPL-3 | head -n 64 | tr '\n' ' '); } || true
	[ -n "$src" ] || skip "no text for the token shards (install the fortunes package: make deps)"
	# shellcheck disable=SC2086
	"$BUILD/text2shard" -o build/data/fortunes.bin --val build/data/fortunes_val.bin \
		--val-frac 0.1 $src >/dev/null
	cp build/data/fortunes.bin build/data/train.bin
	cp build/data/fortunes_val.bin build/data/val.bin
fi

conf() { # conf MODEL KEY: a config constant of models/MODEL.dp
	sed -nE "s/^[[:space:]]*$2[[:space:]]*=[[:space:]]*([0-9]+).*/\1/p" "models/$1.dp" | head -n 1
}
setting() { # setting MODEL KEY: a train setting's number
	sed -nE "s/^[[:space:]]*$2[[:space:]]+([0-9]+).*/\1/p" "models/$1.dp" | head -n 1
}

# dp RUNNAME BIN [args]: "tokens/s host_us ms" of the last log line (steps 2..STEPS)
dp() {
	local name=$1 bin=$2; shift 2
	if [ "$DRY_RUN" = 1 ]; then
		echo "  would run: $BUILD/dpexec ${bin#"$T"/} --device cuda --steps $STEPS $*" >&2
		echo "- - -"
		return
	fi
	if ! "$BUILD/dpexec" "$bin" --no-timestamps --device cuda --steps "$STEPS" --log-every "$STEPS" \
		--eval-every 0 --verbose "$@" >"$T/$name.log" 2>&1; then
		echo "  dp $name failed:" >&2
		tail -n 5 "$T/$name.log" >&2
		echo "- - -"
		return
	fi
	tail -n 3 "$T/$name.log" | grep "^step $STEPS/" |
		sed -nE 's/.*\| ([0-9.]+) ms\/step \| ([0-9.]+) tokens\/s.*host ([0-9.]+) us\/step.*/\2 \3 \1/p'
}

for model in $MODELS; do
	[ -f "models/$model.dp" ] || continue
	vocab=$(conf "$model" vocab); ctx=$(conf "$model" ctx); d=$(conf "$model" d)
	heads=$(conf "$model" heads); layers=$(conf "$model" layers)
	accum=$(setting "$model" grad_accum); accum=${accum:-1}
	gb=$(setting "$model" global_batch)
	[ -n "$gb" ] || gb=$(( $(setting "$model" micro_batch) * accum ))
	"$BUILD/dpc" "models/$model.dp" --world-size 1 -o "$T/$model.bin"
	sed 's/^train {/train {\n  precision tf32/' "models/$model.dp" >"$T/$model-tf32.dp"
	"$BUILD/dpc" "$T/$model-tf32.dp" --world-size 1 -o "$T/$model-tf32.bin"
	"$BUILD/dpc" "models/$model.dp" --world-size 1 --precision bf16 -o "$T/$model-bf16.bin"
	flops=$("$BUILD/dpc" "models/$model.dp" --world-size 1 --stats |
		sed -nE 's/^optimizer step \([^)]*\)[[:space:]]+([0-9]+).*/\1/p')
	echo "== $model: vocab $vocab, ctx $ctx, d $d, $heads heads, $layers layers; global batch $gb" \
		"($accum micro-batches), $STEPS steps; $flops FLOP per step"

	read -r dg hg mg <<<"$(dp graph "$T/$model.bin")"
	read -r de he me <<<"$(dp eager "$T/$model.bin" --no-graph)"
	read -r dt ht mt <<<"$(dp tf32 "$T/$model-tf32.bin")"

	# the anchors: the same GPT-2 in PyTorch (bench/gpu_gpt.py: fp32, TF32
	# matmuls, bf16 autocast over f32 masters), eager and compiled
	: >"$T/torch.out"
	: >"$T/torch.err"
	# (ty, not dt: dt holds the tf32 row's tokens/s read above)
	for ty in fp32 tf32 bf16; do
		if [ "$DRY_RUN" = 1 ]; then
			echo "  would run: $PY bench/gpu_gpt.py --dtype $ty --batch $((gb / accum)) --accum $accum" >&2
			continue
		fi
		"$PY" bench/gpu_gpt.py --steps "$STEPS" --vocab "$vocab" --ctx "$ctx" --d "$d" \
			--heads "$heads" --layers "$layers" --batch $((gb / accum)) --accum "$accum" \
			--dtype $ty 2>>"$T/torch.err" | sed "s/^/$ty-/" >>"$T/torch.out" ||
			echo "  PyTorch ($ty) failed: $(tail -n 1 "$T/torch.err")"
	done
	row() { # row LABEL TOKENS/S HOST_US MS PEAK [FLOPS per step: the model's own batch's]
		local mfu=-
		if [ "$4" != "-" ] && [ -n "$4" ]; then
			mfu=$(awk -v f="${6:-$flops}" -v ms="$4" -v p="$5" 'BEGIN{printf "%.2f%%", f/(ms*1e-3)/(p*1e12)*100}')
		fi
		printf "  %-22s %12s tokens/s %10s us host/step %10s ms/step  MFU %s\n" "$1" "${2:--}" \
			"${3:--}" "${4:--}" "$mfu"
	}
	anchor() { grep "^$1 " "$T/torch.out" | cut -d' ' -f2- || echo "- - -"; }
	row "dp, CUDA Graph" "$dg" "$hg" "$mg" "$PEAK_TFLOPS"
	row "dp, --no-graph" "$de" "$he" "$me" "$PEAK_TFLOPS"
	row "dp, precision tf32" "$dt" "$ht" "$mt" "$PEAK_TF32_TFLOPS"
	read -r db hb mb <<<"$(dp bf16 "$T/$model-bf16.bin" --peak-tflops "$PEAK_BF16_TFLOPS")"
	row "dp, precision bf16" "$db" "$hb" "$mb" "$PEAK_BF16_TFLOPS"
	# bf16 at the largest micro-batch that fits (the same grad_accum)
	fit=$("$BUILD/dpc" "models/$model.dp" --world-size 1 --precision bf16 --stats --device h100 \
		${mem:+--device-memory "$mem"} 2>/dev/null |
		sed -nE 's/^micro-batch that fits .*: ([0-9]+) per rank.*/\1/p')
	if [ -n "$fit" ]; then
		[ "$fit" -le "$MAX_MICRO_BATCH" ] || fit=$MAX_MICRO_BATCH
		if [ -n "$(setting "$model" global_batch)" ]; then
			set_batch=train.global_batch=$((fit * accum))
		else
			set_batch=train.micro_batch=$fit
		fi
		"$BUILD/dpc" "models/$model.dp" --world-size 1 --precision bf16 --set "$set_batch" \
			-o "$T/$model-bf16max.bin"
		fflops=$("$BUILD/dpc" "models/$model.dp" --world-size 1 --precision bf16 --set "$set_batch" \
			--stats | sed -nE 's/^optimizer step \([^)]*\)[[:space:]]+([0-9]+).*/\1/p')
		read -r dm hm mm <<<"$(dp bf16max "$T/$model-bf16max.bin" --peak-tflops "$PEAK_BF16_TFLOPS")"
		row "dp, bf16, micro $fit" "$dm" "$hm" "$mm" "$PEAK_BF16_TFLOPS" "$fflops"
	else
		echo "  (no largest-micro-batch row: dpc found no micro-batch that fits ${mem:-80GiB})"
	fi
	read -r a b c <<<"$(anchor fp32-eager)"; row "PyTorch eager" "$a" "$b" "$c" "$PEAK_TFLOPS"
	read -r a b c <<<"$(anchor fp32-compile)"; row "torch.compile" "$a" "$b" "$c" "$PEAK_TFLOPS"
	read -r a b c <<<"$(anchor tf32-eager)"; row "PyTorch eager, TF32" "$a" "$b" "$c" "$PEAK_TF32_TFLOPS"
	read -r a b c <<<"$(anchor tf32-compile)"; row "torch.compile, TF32" "$a" "$b" "$c" "$PEAK_TF32_TFLOPS"
	read -r a b c <<<"$(anchor bf16-eager)"; row "PyTorch eager, bf16" "$a" "$b" "$c" "$PEAK_BF16_TFLOPS"
	read -r a b c <<<"$(anchor bf16-compile)"; row "torch.compile, bf16" "$a" "$b" "$c" "$PEAK_BF16_TFLOPS"
	[ -s "$T/torch.err" ] && sed 's/^/  (torch) /' "$T/torch.err" | tail -n 4
done
echo "(MFU of fp32 rows against PEAK_TFLOPS=$PEAK_TFLOPS, TF32 rows against PEAK_TF32_TFLOPS=$PEAK_TF32_TFLOPS,"
echo " bf16 rows against PEAK_BF16_TFLOPS=$PEAK_BF16_TFLOPS;"
echo " dp's time per step includes staging the next batch and reading the previous step's metrics,"
echo " overlapped with the device; PyTorch's uses one fixed device batch)"
