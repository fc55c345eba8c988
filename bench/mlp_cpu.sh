#!/usr/bin/env bash
# bench/mlp_cpu.sh - CPU step time of models/mlp.dp against PyTorch, in one run.
#
# Measures, on this machine and in this run:
#   dpc compile time of models/mlp.dp (best of 20)
#   dp at 1 rank and at 2 ranks (mpirun), ms per optimizer step (global batch 128)
#   PyTorch eager (Debian's python3-torch, CPU, 1 thread per rank) on the same
#   MLP, optimizer and batch: the anchor
# and prints dp/PyTorch ratios (< 1: dp is faster). Not a test: timings move
# with the machine's load; run it on a quiet machine.
#   STEPS=400 bash bench/mlp_cpu.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-400}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one thread per rank everywhere, like the anchor: dpexec's own threads
# (DP_NUM_THREADS; by default every core it may run on) and OpenBLAS's
export OPENBLAS_NUM_THREADS=1 DP_NUM_THREADS=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
FM=/usr/share/datasets/fashion-mnist

best=1e9
for i in $(seq 20); do
	s=$(date +%s%N)
	"$BUILD/dpc" models/mlp.dp --world-size 2 -o "$T/c.bin"
	e=$(date +%s%N)
	best=$(awk -v a="$best" -v b="$(( (e - s) / 1000 ))" 'BEGIN{print (b < a ? b : a)}')
done
echo "dpc models/mlp.dp: $(awk -v u="$best" 'BEGIN{printf "%.2f", u/1000}') ms (best of 20, process start included)"

dp_ms() { # dp_ms NP: dpexec's own ms/step, averaged over steps 2..STEPS
	"$BUILD/dpc" models/mlp.dp --world-size "$1" -o "$T/w$1.bin"
	mpirun --oversubscribe -np "$1" "$BUILD/dpexec" "$T/w$1.bin" --no-timestamps --steps $((STEPS + 1)) \
		--log-every "$STEPS" --eval-every 0 >"$T/out$1" 2>&1 || { cat "$T/out$1"; exit 1; }
	grep "^step $STEPS/" "$T/out$1" | sed -E 's/.*\| ([0-9.]+) ms\/step.*/\1/'
}
d1=$(dp_ms 1)
d2=$(dp_ms 2)

# the anchor: PyTorch eager, same model/optimizer/batch, data already in memory
t1=$(/usr/bin/python3 - "$STEPS" <<'PY'
import sys, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1])
dims = [784, 256, 128, 100, 10]
ws = [torch.nn.Parameter(torch.randn(a, b) * 0.05) for a, b in zip(dims, dims[1:])]
bs = [torch.nn.Parameter(torch.zeros(b)) for b in dims[1:]]
opt = torch.optim.AdamW(ws + bs, lr=1e-3, weight_decay=0.01)
x = torch.rand(128, 784); y = torch.randint(0, 10, (128,))
def step():
    opt.zero_grad(set_to_none=False)
    loss = 0.0
    for mb in range(2):  # grad_accum 2 of 64, as mlp.dp at 1 rank
        h = x[mb * 64:(mb + 1) * 64]
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w + b
            if i < 3: h = torch.relu(h)
        l = torch.nn.functional.cross_entropy(h, y[mb * 64:(mb + 1) * 64]) / 2
        l.backward(); loss += l.item()
    torch.nn.utils.clip_grad_norm_(ws + bs, 1.0)
    opt.step()
for _ in range(20): step()
s = time.perf_counter()
for _ in range(steps): step()
print(f"{(time.perf_counter() - s) * 1e3 / steps:.3f}")
PY
)
echo "step time, global batch 128 (mlp.dp: 784-256-128-100-10, AdamW, grad_accum 2, clip):"
echo "  PyTorch eager, 1 process, 1 thread : $t1 ms/step   (anchor)"
echo "  dp, 1 rank                         : $d1 ms/step   ratio $(awk -v a="$d1" -v b="$t1" 'BEGIN{printf "%.2f", a/b}')"
echo "  dp, 2 ranks (mpirun)               : $d2 ms/step   ratio $(awk -v a="$d2" -v b="$t1" 'BEGIN{printf "%.2f", a/b}')"
echo "  (dp times include data loading from the IDX arrays and the sampler; the anchor's data is one fixed in-memory batch)"
