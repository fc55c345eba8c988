#!/usr/bin/env bash
# bench/gpu_mlp.sh - GPU step time of models/mlp.dp: dp's CUDA backend (graph
# replay and --no-graph) against PyTorch eager and torch.compile on the same
# MLP, optimizer, batch and dtype (fp32), in one run. Not a test.
#
# A SKELETON: it has never run on a GPU (docs/CUDA.md). Without a visible GPU
# it says so and exits 0.
#
#   STEPS=2000 bash bench/gpu_mlp.sh
#   PEAK_TFLOPS=67 (fp32 non-tensor peak of an H100/H200 SXM) sets the MFU base.
#
# Reports per configuration: ms per optimizer step and MFU =
# (6 * MACs per sample * global batch) / step time / peak. The MLP is tiny:
# expect launch overhead, not FLOPs, to decide it; the figure that matters is
# the graph vs eager gap (host microseconds per step: issue 12).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-1000}
PEAK_TFLOPS=${PEAK_TFLOPS:-67}
DPEXEC=$BUILD/dpexec
if [ ! -f "$BUILD/libdpcuda.so" ]; then
	echo "SKIPPED: $BUILD/libdpcuda.so is not built (make cuda)"; exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
MODEL=models/mlp.dp
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
	awk '/^eval \{/ {skip=1} skip && /^\}/ {skip=0; next} !skip' "$MODEL" |
		sed -E 's/from idx\("[^"]*"\)/from synthetic(n=8192, classes=10)/' >"$T/mlp.dp"
	MODEL=$T/mlp.dp
fi
"$BUILD/dpc" "$MODEL" --world-size 1 -o "$T/w1.bin"
if ! "$DPEXEC" "$T/w1.bin" --no-timestamps --device cuda --steps 0 >"$T/probe" 2>&1; then
	echo "SKIPPED: no usable GPU: GPU benchmark not run ($(cat "$T/probe"))"; exit 0
fi
grep "^device:" "$T/probe"

dp() { # dp [args]: ms per step over steps 2..STEPS (the last log line)
	"$DPEXEC" "$T/w1.bin" --device cuda --steps "$STEPS" --log-every "$STEPS" \
		--eval-every 0 "$@" | sed -nE 's/.*\| ([0-9.]+) ms\/step.*/\1/p' | tail -n 1
}
g_ms=$(dp)
e_ms=$(dp --no-graph)

# the anchors: same MLP (784-256-128-100-10), AdamW, grad_accum 2 x 64, clip 1.0
read -r pe pc <<<"$(python3 - "$STEPS" <<'PY'
import sys, time, torch
steps = int(sys.argv[1]); dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False  # fp32, like dp
torch.manual_seed(0)
dims = [784, 256, 128, 100, 10]
def make():
    ws = [torch.nn.Parameter(torch.randn(a, b, device=dev) * 0.05) for a, b in zip(dims, dims[1:])]
    bs = [torch.nn.Parameter(torch.zeros(b, device=dev)) for b in dims[1:]]
    return ws, bs
x = torch.rand(128, 784, device=dev); y = torch.randint(0, 10, (128,), device=dev)
def fwd(ws, bs, h):
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = h @ w + b
        if i < 3: h = torch.relu(h)
    return h
def timed(f, ws, bs):
    opt = torch.optim.AdamW(ws + bs, lr=1e-3, weight_decay=0.01)
    def step():
        opt.zero_grad(set_to_none=False)
        for mb in range(2):
            l = torch.nn.functional.cross_entropy(f(ws, bs, x[mb*64:(mb+1)*64]), y[mb*64:(mb+1)*64]) / 2
            l.backward()
        torch.nn.utils.clip_grad_norm_(ws + bs, 1.0)
        opt.step()
    for _ in range(50): step()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(steps): step()
    torch.cuda.synchronize()
    return (time.perf_counter() - s) * 1e3 / steps
eager = timed(fwd, *make())
comp = timed(torch.compile(fwd), *make())
print(f"{eager:.4f} {comp:.4f}")
PY
)"

macs=$(( 784*256 + 256*128 + 128*100 + 100*10 ))
mfu() { awk -v ms="$1" -v m="$macs" -v p="$PEAK_TFLOPS" 'BEGIN{printf "%.3f%%", 6*m*128/(ms*1e-3)/(p*1e12)*100}'; }
echo "GPU step time, global batch 128 (mlp.dp, fp32, AdamW, grad_accum 2, clip), $STEPS steps:"
echo "  PyTorch eager      : $pe ms/step   MFU $(mfu "$pe")"
echo "  torch.compile      : $pc ms/step   MFU $(mfu "$pc")"
echo "  dp, CUDA Graph     : $g_ms ms/step   MFU $(mfu "$g_ms")"
echo "  dp, --no-graph     : $e_ms ms/step   MFU $(mfu "$e_ms")"
echo "  (dp times include the host's batch fill and H2D copy, overlapped with the previous step,"
echo "   and a synchronous loss read per step; the anchors use one fixed device batch)"
