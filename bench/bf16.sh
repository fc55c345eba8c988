#!/usr/bin/env bash
# bench/bf16.sh - CPU step time and peak memory, bf16 against f32, dp beside
# PyTorch, in one run (issue 14).
#
# Models: models/gpt2-tiny.dp at d=256 (-D d=256: 4 heads of 64, 2 layers,
# 16 sequences of 64 tokens per step) and models/gpt2.dp (124M, one optimizer
# step of 8 sequences of 1024 tokens in 2 micro-batches; minutes per step).
# For each, at 1 rank:
#   dp f32 and dp bf16 (dpc --precision bf16): ms per optimizer step (dpexec's
#   own figure, the mean after the first step), the arena, the peak RSS;
#   PyTorch (Debian's torch, CPU, the same threads) on the same model from the
#   same initial weights: f32, and bf16 the way PyTorch users train on CPUs
#   (torch.autocast(cpu, bfloat16) around the forward, f32 master weights and
#   AdamW): ms per step and peak RSS.
# Then bf16/f32 ratios on each side and dp/PyTorch per precision (< 1: dp is
# faster / smaller). And the GEMM choice (bench/bf16_gemm.c): OpenBLAS with
# conversion against oneDNN at the GEMM shapes of these models.
# Not a test: timings move with the machine's load.
#   STEPS=20 GPT2_STEPS=1 bash bench/bf16.sh
#   GEMM=0 TINY_PRECISIONS= bash bench/bf16.sh    # models/gpt2.dp only
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-20}
GPT2_STEPS=${GPT2_STEPS:-1}
THREADS=${THREADS:-2}
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/text2shard" -o "$T/text.bin" --val "$T/val.bin" --val-frac 0.1 \
	/usr/share/common-licenses/GPL-3 >/dev/null
data='s|"build/data/fortunes.bin"|"'"$T"'/text.bin"|; s|"build/data/fortunes_val.bin"|"'"$T"'/val.bin"|; s|"build/data/train.bin"|"'"$T"'/text.bin"|; s|"build/data/val.bin"|"'"$T"'/val.bin"|'

if [ "${GEMM:-1}" = 1 ]; then
echo "== GEMM: bf16 operands, f32 accumulation, bf16 result (1 thread)"
gcc -O2 bench/bf16_gemm.c -o "$T/gemm" -lopenblas -ldnnl
for s in "1024 256 768" "1024 256 1024" "1024 1024 256" "1024 768 2304" "1024 768 3072" \
	"1024 768 50257"; do
	# shellcheck disable=SC2086
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$T/gemm" $s 3
done
fi

# dp_run NAME MODEL STEPS PRECISION DPC-ARGS...: "ms_per_step arena_MiB peak_rss_KiB"
dp_run() {
	local name=$1 model=$2 steps=$3 prec=$4; shift 4
	sed -e "$data" "$model" >"$T/$name.dp"
	"$BUILD/dpc" "$T/$name.dp" --precision "$prec" "$@" -o "$T/$name.bin"
	/usr/bin/time -f "%M" -o "$T/$name.rss" "$BUILD/dpexec" "$T/$name.bin" --no-timestamps --steps "$steps" \
		--log-every 1 --eval-every 0 >"$T/$name.out" 2>&1 ||
		{ cat "$T/$name.out" >&2; exit 1; }
	local ms arena
	ms=$(sed -n 's/^step \([0-9]*\)\/.*| \([0-9.]*\) ms\/step.*/\1 \2/p' "$T/$name.out" |
		awk '$1 > 1 {s += $2; n++} END {if (n) printf "%.1f", s / n; else print "?"}')
	[ "$ms" = "?" ] && ms=$(sed -n 's/.*| \([0-9.]*\) ms\/step.*/\1/p' "$T/$name.out" | tail -n 1)
	arena=$(sed -n 's/^arena: \([0-9.]*\) MiB.*/\1/p' "$T/$name.out")
	echo "$ms $arena $(cat "$T/$name.rss")"
}

# torch_run KIND INIT SEQ GB MICRO STEPS PRECISION HEADS: "ms_per_step peak_rss_KiB"
torch_run() {
	/usr/bin/time -f "%M" -o "$T/torch.rss" /usr/bin/python3 - "$@" "$T/text.bin" "$THREADS" \
		>"$T/torch.out" 2>"$T/torch.err" <<'PY'
import sys, time, types, torch
sys.path.insert(0, "tests")
import torch_gpt, torch_ref
kind, init, seq, gb, micro, steps, prec, heads, data, threads = sys.argv[1:]
seq, gb, micro, steps, heads = int(seq), int(gb), int(micro), int(steps), int(heads)
torch.set_num_threads(int(threads))
args = types.SimpleNamespace(model=kind, heads=heads, norm_eps=1e-5, init=init, seq=seq,
                             theta=10000.0, precision="f32")
model = torch_gpt.Model(args, torch_ref.read_safetensors(init), torch.float32)
params = model.params()
opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
x_all, y_all = torch_gpt.load_windows(data, seq)
x_all, y_all = torch.from_numpy(x_all), torch.from_numpy(y_all)
vocab = model.p["embed.wte"].shape[0]
times = []
for step in range(steps + 1):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    for m in range(gb // micro):
        idx = torch.arange(m * micro, (m + 1) * micro) % x_all.shape[0]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec == "bf16"):
            logits = model.forward(x_all[idx])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                 y_all[idx].reshape(-1)) * micro / gb
        loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
t = times[1:] if len(times) > 1 else times
print(f"{1e3 * sum(t) / len(t):.1f}")
PY
	[ -s "$T/torch.out" ] || { cat "$T/torch.err" >&2; exit 1; }
	echo "$(cat "$T/torch.out") $(cat "$T/torch.rss")"
}

row() { # MODEL PREC "dp_ms arena rss" "torch_ms torch_rss"
	read -r dms arena drss <<<"$3"
	read -r tms trss <<<"$4"
	printf "%-16s %-5s %10s %9s %10s   %10s %10s   %6s %6s\n" "$1" "$2" "$dms" "$arena" \
		"$((drss / 1024))" "$tms" "$((trss / 1024))" \
		"$(awk -v a="$dms" -v b="$tms" 'BEGIN{printf "%.2f", a / b}')" \
		"$(awk -v a="$drss" -v b="$trss" 'BEGIN{printf "%.2f", a / b}')"
}

echo
echo "== step time and memory, 1 rank, $THREADS threads"
printf "%-16s %-5s %10s %9s %10s   %10s %10s   %6s %6s\n" model prec "dp ms" "arena MiB" \
	"dp RSS MiB" "torch ms" "torch MiB" "ms x" "RSS x"
for prec in ${TINY_PRECISIONS-f32 bf16}; do
	r=$(dp_run "tiny-$prec" models/gpt2-tiny.dp "$STEPS" $prec -D d=256)
	"$BUILD/dpexec" "$T/tiny-$prec.bin" --steps 0 --quiet --save-full "$T/tiny.st" >/dev/null 2>&1
	row "gpt2-tiny d=256" $prec "$r" "$(torch_run gpt2 "$T/tiny.st" 64 16 16 "$STEPS" $prec 4)"
done
for prec in f32 bf16; do
	r=$(dp_run "gpt2-$prec" models/gpt2.dp "$GPT2_STEPS" $prec)
	"$BUILD/dpexec" "$T/gpt2-$prec.bin" --steps 0 --quiet --save-full "$T/gpt2.st" >/dev/null 2>&1
	row "gpt2 (124M)" $prec "$r" "$(torch_run gpt2 "$T/gpt2.st" 1024 8 4 "$GPT2_STEPS" $prec 12)"
done
