#!/usr/bin/env bash
# bench/gpu_gpt.sh - GPT-2 training throughput on one GPU: dp's CUDA backend
# (graph replay, --no-graph, and `precision tf32`) against PyTorch eager and
# torch.compile on the same model, batch, optimizer and dtype, in one run.
# Not a test.
#
# NEVER RUN ON A GPU YET (docs/CUDA.md): written to run unchanged on one.
# Without a usable GPU (or without build/libdpcuda.so) it prints SKIPPED and
# exits 0.
#
#   bash bench/gpu_gpt.sh                     # gpt2-tiny and gpt2 (124M)
#   MODELS=gpt2 STEPS=50 bash bench/gpu_gpt.sh
#   PEAK_TFLOPS=67 PEAK_TF32_TFLOPS=495 (H100 SXM: fp32 non-tensor, dense TF32)
#
# Per configuration: tokens/s, host microseconds per step (dp: the time
# dpexec's loop spends launching and staging, `--verbose`; PyTorch: the
# process CPU time of the step loop), and MFU = FLOPs per optimizer step
# (`dpc --stats`: the model's forward + backward + optimizer FLOPs, the same
# count for both sides) / step time / peak. The models keep their .dp
# training settings (global batch, grad_accum, AdamW, clip 1.0); data are
# byte-level tokens of the fortunes text (build/text2shard), which is all a
# throughput figure needs.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-30}
MODELS=${MODELS:-"gpt2-tiny gpt2"}
PEAK_TFLOPS=${PEAK_TFLOPS:-67}
PEAK_TF32_TFLOPS=${PEAK_TF32_TFLOPS:-495}
PY=${PY:-python3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

skip() {
	echo "************************************************************"
	echo "SKIPPED: GPU benchmark not run: $1"
	echo "************************************************************"
	exit 0
}
[ -f "$BUILD/libdpcuda.so" ] || skip "$BUILD/libdpcuda.so is not built (make cuda)"
[ -x "$BUILD/dpc" ] && [ -x "$BUILD/dpexec" ] || skip "$BUILD/dpc and $BUILD/dpexec are not built"
"$BUILD/dpc" models/mlp.dp --world-size 1 -o "$T/probe.bin"
if ! "$BUILD/dpexec" "$T/probe.bin" --device cuda --steps 0 --eval-every 0 >"$T/probe" 2>&1; then
	skip "no usable GPU ($(tail -n 1 "$T/probe"))"
fi
grep "^device:" "$T/probe" || true

# token data: byte-level shards of the fortunes text at the paths the models read
mkdir -p build/data
if [ ! -f build/data/fortunes.bin ] || [ ! -f build/data/train.bin ]; then
	src=$(ls /usr/share/games/fortunes/* 2>/dev/null | grep -v '\.\(dat\|u8\)$' | head -n 20 || true)
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
	if ! "$BUILD/dpexec" "$bin" --device cuda --steps "$STEPS" --log-every "$STEPS" \
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
	flops=$("$BUILD/dpc" "models/$model.dp" --world-size 1 --stats |
		sed -nE 's/^optimizer step \([^)]*\)[[:space:]]+([0-9]+).*/\1/p')
	echo "== $model: vocab $vocab, ctx $ctx, d $d, $heads heads, $layers layers; global batch $gb" \
		"($accum micro-batches), $STEPS steps; $flops FLOP per step"

	read -r dg hg mg <<<"$(dp graph "$T/$model.bin")"
	read -r de he me <<<"$(dp eager "$T/$model.bin" --no-graph)"
	read -r dt ht mt <<<"$(dp tf32 "$T/$model-tf32.bin")"

	# the anchors: the same GPT-2 in PyTorch (fp32, then TF32 matmuls), eager and compiled
	"$PY" - "$STEPS" "$vocab" "$ctx" "$d" "$heads" "$layers" "$gb" "$accum" >"$T/torch.out" \
		2>"$T/torch.err" <<'PY' || { echo "  PyTorch failed:"; tail -n 5 "$T/torch.err"; }
import math, sys, time
import torch
import torch.nn.functional as F

steps, V, T, D, H, L, GB, ACC = (int(a) for a in sys.argv[1:])
dev = "cuda"
MB = GB // ACC

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.o = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.proj = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)
    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, H, 3, D // H).permute(3, 0, 2, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
            s = s.masked_fill(torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1), float("-inf"))
            y = s.softmax(-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(b, t, D))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(T, D)
        self.h = torch.nn.ModuleList(Block() for _ in range(L))
        self.lnf = torch.nn.LayerNorm(D)
    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for blk in self.h:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V), targets.view(-1)) / ACC

def bench(compiled, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    m = GPT().to(dev)
    f = torch.compile(m) if compiled else m
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ids = torch.randint(0, min(V, 256), (ACC, MB, T), device=dev)
    tg = torch.randint(0, min(V, 256), (ACC, MB, T), device=dev)
    def step():
        opt.zero_grad(set_to_none=True)
        for a in range(ACC):
            f(ids[a], tg[a]).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps - 1):
        step()
    c1 = time.process_time()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - w0) / (steps - 1)
    return GB * T / wall, (c1 - c0) / (steps - 1) * 1e6, wall * 1e3

for name, compiled, tf32 in (("eager", False, False), ("compile", True, False),
                             ("eager_tf32", False, True), ("compile_tf32", True, True)):
    try:
        if compiled and not hasattr(torch, "compile"):
            raise RuntimeError("torch %s has no torch.compile" % torch.__version__)
        print(name, "%.0f %.1f %.3f" % bench(compiled, tf32))
    except Exception as ex:  # report and go on: one anchor failing is not the whole run
        print(name, "- - -")
        print("%s: %s" % (name, ex), file=sys.stderr)
PY
	row() { # row LABEL TOKENS/S HOST_US MS PEAK
		local mfu=-
		if [ "$4" != "-" ] && [ -n "$4" ]; then
			mfu=$(awk -v f="$flops" -v ms="$4" -v p="$5" 'BEGIN{printf "%.2f%%", f/(ms*1e-3)/(p*1e12)*100}')
		fi
		printf "  %-22s %12s tokens/s %10s us host/step %10s ms/step  MFU %s\n" "$1" "${2:--}" \
			"${3:--}" "${4:--}" "$mfu"
	}
	anchor() { grep "^$1 " "$T/torch.out" | cut -d' ' -f2- || echo "- - -"; }
	row "dp, CUDA Graph" "$dg" "$hg" "$mg" "$PEAK_TFLOPS"
	row "dp, --no-graph" "$de" "$he" "$me" "$PEAK_TFLOPS"
	row "dp, precision tf32" "$dt" "$ht" "$mt" "$PEAK_TF32_TFLOPS"
	read -r a b c <<<"$(anchor eager)"; row "PyTorch eager" "$a" "$b" "$c" "$PEAK_TFLOPS"
	read -r a b c <<<"$(anchor compile)"; row "torch.compile" "$a" "$b" "$c" "$PEAK_TFLOPS"
	read -r a b c <<<"$(anchor eager_tf32)"; row "PyTorch eager, TF32" "$a" "$b" "$c" "$PEAK_TF32_TFLOPS"
	read -r a b c <<<"$(anchor compile_tf32)"; row "torch.compile, TF32" "$a" "$b" "$c" "$PEAK_TF32_TFLOPS"
	[ -s "$T/torch.err" ] && sed 's/^/  (torch) /' "$T/torch.err" | tail -n 4
done
echo "(MFU of fp32 rows against PEAK_TFLOPS=$PEAK_TFLOPS, TF32 rows against PEAK_TF32_TFLOPS=$PEAK_TF32_TFLOPS;"
echo " dp's time per step includes staging the next batch and reading the previous step's metrics,"
echo " overlapped with the device; PyTorch's uses one fixed device batch)"
